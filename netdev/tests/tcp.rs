//! Kernel TCP links over 127.0.0.1: transfer, orderly close, peer drop, event-driven readiness.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use iwarp_netdev::{Link, LinkError, LinkOptions, TcpLink, TcpListenerLink};

const LOOPBACK: &str = "127.0.0.1:0";

/// A connected (client, server) pair over loopback.
fn connected_pair(opts: &LinkOptions) -> (TcpLink, TcpLink) {
    let mut listener = TcpListenerLink::bind_with(LOOPBACK.parse().unwrap(), opts).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = TcpLink::connect(addr, opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    for _ in 0..100_000 {
        if let Some(server) = listener.accept().unwrap() {
            assert_eq!(server.peer_addr(), client.local_addr());
            assert_eq!(client.peer_addr(), Some(addr));
            return (client, server);
        }
        assert!(Instant::now() < deadline, "accept timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no connection accepted");
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from(i % 253).unwrap().wrapping_add(seed)).collect()
}

/// Moves `out` through `link` in vectored writes of several slices while reading into `inb`;
/// returns true when this side has nothing more to send.
fn pump(link: &mut TcpLink, out: &[u8], sent: &mut usize, inb: &mut Vec<u8>, buf: &mut [u8]) -> bool {
    if *sent < out.len() {
        // Several "FPDUs" per call, as the engine will do.
        let slices: Vec<IoSlice<'_>> = out[*sent..].chunks(9000).take(64).map(IoSlice::new).collect();
        *sent += link.send_vectored(&slices).unwrap();
    }
    let n = link.recv(buf).unwrap();
    inb.extend_from_slice(&buf[..n]);
    *sent == out.len()
}

fn recv_until_end(link: &mut TcpLink, deadline: Instant) -> (Vec<u8>, LinkError) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..1_000_000 {
        match link.recv(&mut buf) {
            Ok(0) => std::thread::sleep(Duration::from_micros(200)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(err) => return (got, err),
        }
        assert!(Instant::now() < deadline, "no end of stream before the deadline");
    }
    panic!("no end of stream");
}

#[test]
fn eight_mebibytes_each_way_then_orderly_close() {
    const TOTAL: usize = 8 << 20;
    let (mut a, mut b) = connected_pair(&LinkOptions::default());
    let (out_a, out_b) = (pattern(1, TOTAL), pattern(7, TOTAL));
    let (mut sent_a, mut sent_b) = (0, 0);
    let (mut in_a, mut in_b) = (Vec::with_capacity(TOTAL), Vec::with_capacity(TOTAL));
    let mut buf = vec![0u8; 256 * 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..10_000_000 {
        let progress = sent_a + sent_b + in_a.len() + in_b.len();
        let done_a = pump(&mut a, &out_a, &mut sent_a, &mut in_a, &mut buf);
        let done_b = pump(&mut b, &out_b, &mut sent_b, &mut in_b, &mut buf);
        if done_a && done_b && in_a.len() == TOTAL && in_b.len() == TOTAL {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "transfer timed out: {sent_a} {sent_b} {} {}",
            in_a.len(),
            in_b.len()
        );
        if progress == sent_a + sent_b + in_a.len() + in_b.len() {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    assert!(in_b == out_a, "a -> b corrupted");
    assert!(in_a == out_b, "b -> a corrupted");

    // Orderly close, one direction at a time: the other keeps working (half-close).
    a.shutdown_write();
    a.shutdown_write();
    assert!(matches!(a.send(b"x"), Err(LinkError::WriteShutdown)));
    let deadline = Instant::now() + Duration::from_secs(5);
    let (rest, end) = recv_until_end(&mut b, deadline);
    assert!(rest.is_empty());
    assert!(matches!(end, LinkError::Closed), "{end}");
    assert!(matches!(b.recv(&mut buf), Err(LinkError::Closed)));
    assert_eq!(b.send(b"after half-close").unwrap(), 16);
    b.shutdown_write();
    let (rest, end) = recv_until_end(&mut a, deadline);
    assert_eq!(rest, b"after half-close");
    assert!(matches!(end, LinkError::Closed), "{end}");
}

#[test]
fn peer_drop_is_closed_or_reset_never_a_hang() {
    // Dropped after reading everything: the survivor reads the rest, then Closed.
    let (mut a, b) = connected_pair(&LinkOptions::default());
    a.send(b"goodbye").unwrap();
    drop(b);
    let (_, end) = recv_until_end(&mut a, Instant::now() + Duration::from_secs(5));
    assert!(matches!(end, LinkError::Closed | LinkError::Reset), "{end}");

    // Dropped with unread bytes: the kernel resets the connection, and the survivor's sends
    // fail (Reset) within a bounded number of tries.
    let (mut a, b) = connected_pair(&LinkOptions::default());
    assert_eq!(a.send(&[0u8; 1000]).unwrap(), 1000);
    let deadline = Instant::now() + Duration::from_secs(5);
    for _ in 0..10_000 {
        if b.stream().peek(&mut [0u8; 1]).unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(b);
    let mut end = None;
    for _ in 0..100_000 {
        match a.send(&[0u8; 4096]) {
            Ok(_) => {}
            Err(err) => {
                end = Some(err);
                break;
            }
        }
        match a.recv(&mut [0u8; 4096]) {
            Ok(_) => {}
            Err(err) => {
                end = Some(err);
                break;
            }
        }
        assert!(Instant::now() < deadline, "no error after the peer dropped");
        std::thread::sleep(Duration::from_micros(500));
    }
    let end = end.expect("an error");
    assert!(matches!(end, LinkError::Reset | LinkError::Closed), "{end}");
}

#[test]
fn accept_without_a_client_returns_none() {
    let mut listener = TcpListenerLink::bind(LOOPBACK.parse().unwrap()).unwrap();
    assert!(listener.accept().unwrap().is_none());
}

#[test]
fn from_std_adopts_a_connected_stream() {
    let listener = std::net::TcpListener::bind(LOOPBACK).unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    let opts = LinkOptions { send_buffer: None, recv_buffer: None, ..LinkOptions::default() };
    let mut a = TcpLink::from_std(client, &opts).unwrap();
    let mut b = TcpLink::from_std(server, &opts).unwrap();
    assert!(a.stream().nodelay().unwrap());
    assert_eq!(b.recv(&mut [0u8; 8]).unwrap(), 0, "non-blocking: nothing there yet");
    assert_eq!(a.send(b"ping").unwrap(), 4);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 8];
    for _ in 0..100_000 {
        let n = b.recv(&mut buf).unwrap();
        if n > 0 {
            assert_eq!(&buf[..n], b"ping");
            return;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_micros(200));
    }
    panic!("nothing received");
}

#[test]
fn event_driven_mode_with_mio_poll() {
    let mut poll = mio::Poll::new().unwrap();
    let mut events = mio::Events::with_capacity(16);
    let mut listener = TcpListenerLink::bind(LOOPBACK.parse().unwrap()).unwrap();
    poll.registry().register(&mut listener, mio::Token(0), mio::Interest::READABLE).unwrap();
    let mut client = TcpLink::connect(listener.local_addr().unwrap(), &LinkOptions::default()).unwrap();

    // The listener becomes readable when a connection is pending.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut server = None;
    for _ in 0..1000 {
        poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
        if let Some(link) = listener.accept().unwrap() {
            server = Some(link);
            break;
        }
        assert!(Instant::now() < deadline);
    }
    let mut server: Box<dyn Link> = Box::new(server.expect("accepted"));

    // Register through the object-safe trait method, as the engine will.
    let fd = server.fd().expect("TCP links have a descriptor").as_raw_fd();
    poll.registry().register(&mut mio::unix::SourceFd(&fd), mio::Token(1), mio::Interest::READABLE).unwrap();
    client.send(b"doorbell").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    for _ in 0..1000 {
        poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
        if events.iter().any(|e| e.token() == mio::Token(1) && e.is_readable()) {
            // Edge-triggered: drain until Ok(0).
            for _ in 0..100 {
                match server.recv(&mut buf).unwrap() {
                    0 => break,
                    n => got.extend_from_slice(&buf[..n]),
                }
            }
        }
        if got.len() == 8 {
            break;
        }
        assert!(Instant::now() < deadline);
    }
    assert_eq!(got, b"doorbell");
    poll.registry().deregister(&mut mio::unix::SourceFd(&fd)).unwrap();
}
