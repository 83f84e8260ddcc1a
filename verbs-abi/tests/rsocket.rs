//! The drop-in's rsockets called in-process (the crate's own entry points, as librdmacm.so.1
//! forwards to them): a connected pair over 127.0.0.1 moving checked data both ways through
//! the rings and the credit updates, end of stream after a shutdown, non-blocking calls,
//! rpoll over an rsocket and a pipe together, options, and the refused cases.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(unsafe_code, reason = "calls the C ABI entry points")]

use std::ffi::c_int;
use std::thread;

use iwarp_verbs_abi::rsocket::*;
use iwarp_verbs_abi::sys::{sockaddr, socklen_t};

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn sockaddr_in(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap(),
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
        sin_zero: [0; 8],
    }
}

const ALEN: socklen_t = 16;

/// A listening rsocket on 127.0.0.1 and its port.
fn listener() -> (c_int, u16) {
    // SAFETY: plain arguments; then local addresses of the right length.
    unsafe {
        let l = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(l >= 0, "rsocket: errno {}", errno());
        let on: c_int = 1;
        let rc = rsetsockopt(l, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&raw const on).cast(), 4);
        assert_eq!(rc, 0, "SO_REUSEADDR: errno {}", errno());
        let a = sockaddr_in(0);
        assert_eq!(rbind(l, (&raw const a).cast::<sockaddr>(), ALEN), 0, "rbind: errno {}", errno());
        assert_eq!(rlisten(l, 4), 0, "rlisten: errno {}", errno());
        assert_eq!(std::mem::size_of::<libc::sockaddr_in>(), ALEN as usize);
        let mut b = sockaddr_in(0);
        let mut len = ALEN;
        assert_eq!(rgetsockname(l, (&raw mut b).cast(), &raw mut len), 0);
        let port = u16::from_be(b.sin_port);
        assert_ne!(port, 0, "the listener's port");
        (l, port)
    }
}

/// A connected pair: (client, accepted server socket, listener).
fn pair() -> (c_int, c_int, c_int) {
    let (l, port) = listener();
    let accept = thread::spawn(move || {
        // SAFETY: a listening rsocket; no address wanted.
        unsafe { raccept(l, std::ptr::null_mut(), std::ptr::null_mut()) }
    });
    // SAFETY: plain arguments; a local address.
    let c = unsafe {
        let c = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(c >= 0);
        let a = sockaddr_in(port);
        assert_eq!(rconnect(c, (&raw const a).cast::<sockaddr>(), ALEN), 0, "rconnect: errno {}", errno());
        c
    };
    let s = accept.join().unwrap();
    assert!(s >= 0, "raccept: errno {}", errno());
    (c, s, l)
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

fn send_all(fd: c_int, data: &[u8]) {
    let mut at = 0;
    while at < data.len() {
        // SAFETY: the rest of a live slice.
        let n = unsafe { rsend(fd, data[at..].as_ptr().cast(), data.len() - at, 0) };
        assert!(n > 0, "rsend: {n}, errno {}", errno());
        at += n as usize;
    }
}

/// Reads until `n` bytes or the end of the stream.
fn recv_up_to(fd: c_int, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut at = 0;
    while at < n {
        // SAFETY: the rest of a live buffer.
        let r = unsafe { rrecv(fd, out[at..].as_mut_ptr().cast(), n - at, 0) };
        assert!(r >= 0, "rrecv: errno {}", errno());
        if r == 0 {
            break;
        }
        at += r as usize;
    }
    out.truncate(at);
    out
}

#[test]
fn a_pair_moves_checked_data_both_ways_and_ends_cleanly() {
    let (c, s, l) = pair();
    // 3 MiB each way: many times the 128 KiB rings, so every grant and credit update is used.
    let up = pattern(3 << 20, 7);
    let down = pattern(3 << 20, 11);
    let (up2, down2) = (up.clone(), down.clone());
    let server = thread::spawn(move || {
        let got = recv_up_to(s, up2.len());
        assert!(got == up2, "server: the bytes differ ({} of {})", got.len(), up2.len());
        send_all(s, &down2);
        // The client shut its sending side: the stream ends here.
        assert!(recv_up_to(s, 16).is_empty(), "end of stream after the peer's SHUT_WR");
        s
    });
    send_all(c, &up);
    // SAFETY: a connected rsocket.
    assert_eq!(unsafe { rshutdown(c, libc::SHUT_WR) }, 0, "rshutdown: errno {}", errno());
    let got = recv_up_to(c, down.len());
    assert!(got == down, "client: the bytes differ ({} of {})", got.len(), down.len());
    let s = server.join().unwrap();
    // The server closes first: its rclose waits (a while at most) until the client, which
    // still reads, closes too.
    // SAFETY: the pair's sockets, closed once.
    let closer = thread::spawn(move || unsafe { rclose(s) });
    // The server's close reaches the client as the end of the stream.
    assert!(recv_up_to(c, 16).is_empty());
    // SAFETY: as above.
    unsafe {
        assert_eq!(rclose(c), 0);
        assert_eq!(closer.join().unwrap(), 0);
        assert_eq!(rclose(l), 0);
        assert_eq!(rclose(c), -1, "a closed rsocket is gone");
        assert_eq!(errno(), libc::EBADF);
    }
}

#[test]
fn nonblocking_calls_and_rpoll_with_a_pipe() {
    let (c, s, l) = pair();
    // SAFETY: connected rsockets, a local pipe and local buffers throughout.
    unsafe {
        assert_eq!(rfcntl(s, libc::F_SETFL, libc::O_NONBLOCK as libc::c_long), 0);
        assert_eq!(rfcntl(s, libc::F_GETFL, 0) & libc::O_NONBLOCK, libc::O_NONBLOCK);
        let mut buf = [0u8; 64];
        assert_eq!(rrecv(s, buf.as_mut_ptr().cast(), buf.len(), 0), -1);
        assert_eq!(errno(), libc::EWOULDBLOCK, "nothing to read");
        // MSG_DONTWAIT on a blocking socket does the same.
        assert_eq!(rrecv(c, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT), -1);
        assert_eq!(errno(), libc::EWOULDBLOCK);

        let mut p = [0 as c_int; 2];
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        let mut fds = [
            libc::pollfd { fd: s, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: p[0], events: libc::POLLIN, revents: 0 },
        ];
        assert_eq!(rpoll(fds.as_mut_ptr(), 2, 0), 0, "nothing ready yet");
        assert_eq!(libc::write(p[1], b"x".as_ptr().cast(), 1), 1);
        assert_eq!(rpoll(fds.as_mut_ptr(), 2, 5000), 1);
        assert_eq!((fds[0].revents, fds[1].revents), (0, libc::POLLIN), "the pipe, not the rsocket");

        // Data from the peer wakes a sleeping rpoll on the rsocket.
        let writer = thread::spawn(move || {
            thread::sleep(std::time::Duration::from_millis(50));
            send_all(c, b"hello");
            c
        });
        fds[1].events = 0;
        assert_eq!(rpoll(fds.as_mut_ptr(), 2, 10_000), 1);
        assert_eq!(fds[0].revents & libc::POLLIN, libc::POLLIN);
        let c = writer.join().unwrap();
        assert_eq!(rrecv(s, buf.as_mut_ptr().cast(), buf.len(), 0), 5);
        assert_eq!(&buf[..5], b"hello");

        // The client can send: POLLOUT.
        let mut w = [libc::pollfd { fd: c, events: libc::POLLOUT, revents: 0 }];
        assert_eq!(rpoll(w.as_mut_ptr(), 1, 5000), 1);
        assert_eq!(w[0].revents, libc::POLLOUT);

        libc::close(p[0]);
        libc::close(p[1]);
        // Both ends close at once (the first closer waits for the other's close).
        let other = thread::spawn(move || rclose(s));
        assert_eq!(rclose(c), 0);
        assert_eq!(other.join().unwrap(), 0);
        assert_eq!(rclose(l), 0);
    }
}

#[test]
fn options_are_kept_and_reported() {
    // SAFETY: a fresh rsocket and local option values throughout.
    unsafe {
        let fd = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let v: c_int = 65536;
        assert_eq!(rsetsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw const v).cast(), 4), 0);
        let one: c_int = 1;
        assert_eq!(rsetsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&raw const one).cast(), 4), 0);
        let mut out: c_int = 0;
        let mut len: socklen_t = 4;
        assert_eq!(
            rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw mut out).cast(), &raw mut len),
            0
        );
        assert_eq!(out, 131072, "the ring is twice the value, as the kernel's buffer");
        let huge: c_int = c_int::MAX;
        assert_eq!(rsetsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&raw const huge).cast(), 4), 0);
        assert_eq!(
            rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&raw mut out).cast(), &raw mut len),
            0
        );
        assert_eq!(out, 64 << 20, "a ring is 64 MiB at most");
        assert_eq!(
            rgetsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&raw mut out).cast(), &raw mut len),
            0
        );
        assert_eq!(out, 1);
        assert_eq!(rgetsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut out).cast(), &raw mut len), 0);
        assert_eq!(out, 0);
        assert_eq!(rsetsockopt(fd, libc::SOL_SOCKET, libc::SO_BROADCAST, (&raw const one).cast(), 4), -1);
        assert_eq!(errno(), libc::ENOTSUP);
        // Unconnected: no data calls.
        let mut buf = [0u8; 4];
        assert_eq!(rrecv(fd, buf.as_mut_ptr().cast(), 4, 0), -1);
        assert_eq!(errno(), libc::ENOTCONN);
        assert_eq!(rclose(fd), 0);
    }
}

#[test]
fn refused_cases() {
    // SAFETY: plain arguments; a descriptor that is no rsocket.
    unsafe {
        assert_eq!(rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0), -1, "datagram rsockets");
        assert_eq!(errno(), libc::ENOTSUP);
        assert_eq!(rsocket(libc::AF_UNIX, libc::SOCK_STREAM, 0), -1);
        assert_eq!(errno(), libc::EAFNOSUPPORT);
        let mut b = [0u8; 4];
        assert_eq!(rrecv(0, b.as_mut_ptr().cast(), 4, 0), -1, "stdin is no rsocket");
        assert_eq!(errno(), libc::EBADF);
        // Nobody listens on the port: refused.
        let (l, port) = listener();
        assert_eq!(rclose(l), 0);
        let c = rsocket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let a = sockaddr_in(port);
        assert_eq!(rconnect(c, (&raw const a).cast::<sockaddr>(), ALEN), -1);
        assert_eq!(errno(), libc::ECONNREFUSED);
        let mut out: c_int = 0;
        let mut len: socklen_t = 4;
        assert_eq!(rgetsockopt(c, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut out).cast(), &raw mut len), 0);
        assert_eq!(out, libc::ECONNREFUSED, "SO_ERROR says why, once");
        assert_eq!(rclose(c), 0);
    }
}
