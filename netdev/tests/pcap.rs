//! pcap capture: read the file back with pcap-file, check every IPv4 and TCP checksum with
//! etherparse, and reassemble each direction of each flow.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use iwarp_netdev::{
    CapturingLink, Link, LinkError, LinkOptions, MemLink, PcapWriter, TCP_MSS, TcpLink, TcpListenerLink,
};

/// An in-memory pcap file.
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What one direction (src -> dst) of a flow carried, checked segment by segment.
#[derive(Debug, Default)]
struct Half {
    syn: bool,
    fin: bool,
    rst: bool,
    isn: u32,
    next_seq: u32,
    payload: Vec<u8>,
    max_segment: usize,
    last_ack: Option<u32>,
}

type Flows = BTreeMap<(SocketAddrV4, SocketAddrV4), Half>;

/// Parses the whole capture: every frame must be Ethernet/IPv4/TCP with valid checksums and
/// in-sequence data.
fn parse_capture(bytes: &[u8]) -> (Flows, usize) {
    let mut reader = pcap_file::pcap::PcapReader::new(bytes).unwrap();
    assert_eq!(reader.header().datalink, pcap_file::DataLink::ETHERNET);
    let mut flows = Flows::new();
    let mut frames = 0;
    let mut last_ts = Duration::ZERO;
    while let Some(packet) = reader.next_packet() {
        let packet = packet.unwrap();
        frames += 1;
        assert_eq!(usize::try_from(packet.orig_len).unwrap(), packet.data.len());
        assert!(packet.timestamp >= last_ts, "timestamps go backwards");
        last_ts = packet.timestamp;
        let sliced = SlicedPacket::from_ethernet(&packet.data).unwrap();
        let Some(NetSlice::Ipv4(ip)) = &sliced.net else { panic!("not IPv4") };
        let header = ip.header();
        assert_eq!(header.header_checksum(), header.to_header().calc_header_checksum(), "IPv4 checksum");
        let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else { panic!("not TCP") };
        let expected = tcp.calc_checksum_ipv4(header.source(), header.destination()).unwrap();
        assert_eq!(tcp.checksum(), expected, "TCP checksum");

        let src = SocketAddrV4::new(header.source_addr(), tcp.source_port());
        let dst = SocketAddrV4::new(header.destination_addr(), tcp.destination_port());
        let (reverse_next, reverse_syn) =
            flows.get(&(dst, src)).map_or((None, false), |h| (Some(h.next_seq), h.syn));
        let half = flows.entry((src, dst)).or_default();
        assert!(!half.fin && !half.rst, "segment after FIN/RST");
        if tcp.syn() {
            assert!(!half.syn, "second SYN");
            half.syn = true;
            half.isn = tcp.sequence_number();
            half.next_seq = tcp.sequence_number().wrapping_add(1);
            continue;
        }
        assert!(half.syn, "segment before SYN");
        assert!(tcp.ack(), "every segment after the SYN acknowledges");
        assert_eq!(tcp.sequence_number(), half.next_seq, "sequence gap or overlap");
        if reverse_syn {
            // We synthesize a peer that acknowledged everything the other side sent so far.
            assert_eq!(Some(tcp.acknowledgment_number()), reverse_next, "acknowledgment number");
        }
        half.last_ack = Some(tcp.acknowledgment_number());
        let payload = tcp.payload();
        half.max_segment = half.max_segment.max(payload.len());
        half.payload.extend_from_slice(payload);
        half.next_seq = half.next_seq.wrapping_add(u32::try_from(payload.len()).unwrap());
        if tcp.fin() {
            half.fin = true;
            half.next_seq = half.next_seq.wrapping_add(1);
        }
        if tcp.rst() {
            half.rst = true;
        }
    }
    (flows, frames)
}

fn half(flows: &Flows, src: SocketAddrV4, dst: SocketAddrV4) -> &Half {
    flows.get(&(src, dst)).unwrap_or_else(|| panic!("no flow {src} -> {dst}"))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from(i % 241).unwrap().wrapping_add(seed)).collect()
}

#[test]
fn capture_of_a_mem_pair_reads_back_with_valid_checksums_and_payloads() {
    let buf = SharedBuf::default();
    let writer = PcapWriter::new(buf.clone()).unwrap().shared();
    let (a, b) = MemLink::pair(1 << 20);
    let mut a = CapturingLink::new(a, Arc::clone(&writer)).unwrap();
    let mut b = CapturingLink::new(b, Arc::clone(&writer)).unwrap();
    // No real addresses: synthesized ones, distinct per link.
    assert_ne!(a.flow().local(), b.flow().local());
    assert_eq!(a.flow().local().ip().octets(), [10, 0, 0, 1]);

    // Chunks around the MSS, larger than it, and one vectored send of several pieces.
    let sizes = [1, 100, TCP_MSS - 1, TCP_MSS, TCP_MSS + 1, 3 * TCP_MSS + 7, 100_000];
    let mut sent_a = Vec::new();
    let mut seed = 0u8;
    for size in sizes {
        let data = pattern(seed, size);
        seed = seed.wrapping_add(1);
        assert_eq!(a.send(&data).unwrap(), size);
        sent_a.extend_from_slice(&data);
    }
    let (p1, p2, p3) = (pattern(50, 700), pattern(51, 2000), pattern(52, 5));
    let n = a.send_vectored(&[io::IoSlice::new(&p1), io::IoSlice::new(&p2), io::IoSlice::new(&p3)]).unwrap();
    assert_eq!(n, 2705);
    sent_a.extend_from_slice(&p1);
    sent_a.extend_from_slice(&p2);
    sent_a.extend_from_slice(&p3);
    let sent_b = pattern(99, 10_000);
    assert_eq!(b.send(&sent_b).unwrap(), sent_b.len());

    // Back-pressure: only the accepted part of a send is captured.
    a.inner().faults().set_capacity(sent_a.len() + 10);
    let partial = pattern(77, 100);
    assert_eq!(a.send(&partial).unwrap(), 10);
    sent_a.extend_from_slice(&partial[..10]);

    // Receive in odd-sized pieces.
    b.inner().faults().slow_reader(Some(3000));
    let mut got_b = Vec::new();
    let mut got_a = Vec::new();
    let mut piece = vec![0u8; 4096];
    for _ in 0..10_000 {
        match b.recv(&mut piece).unwrap() {
            0 => break,
            n => got_b.extend_from_slice(&piece[..n]),
        }
    }
    for _ in 0..10_000 {
        match a.recv(&mut piece).unwrap() {
            0 => break,
            n => got_a.extend_from_slice(&piece[..n]),
        }
    }
    assert!(got_b == sent_a && got_a == sent_b);

    // Orderly close of both directions.
    a.shutdown_write();
    assert!(matches!(b.recv(&mut piece), Err(LinkError::Closed)));
    b.shutdown_write();
    assert!(matches!(a.recv(&mut piece), Err(LinkError::Closed)));
    let (fa, fb) = (a.flow().clone(), b.flow().clone());
    assert!(a.capture_error().is_none() && b.capture_error().is_none());
    drop(a);
    drop(b);
    writer.lock().unwrap().flush().unwrap();

    let bytes = buf.0.lock().unwrap().clone();
    let (flows, frames) = parse_capture(&bytes);
    assert_eq!(flows.len(), 4, "two flows, two directions each");
    assert!(frames > 100);

    // Link a's flow: outbound is what a sent, inbound what a received.
    let out = half(&flows, fa.local(), fa.remote());
    let inb = half(&flows, fa.remote(), fa.local());
    assert!(out.syn && inb.syn && out.fin && inb.fin && !out.rst && !inb.rst);
    assert!(out.payload == sent_a, "a's outbound payload differs");
    assert!(inb.payload == sent_b, "a's inbound payload differs");
    assert_eq!(out.max_segment, TCP_MSS, "segments split at the MSS");
    assert_ne!(out.isn, inb.isn);
    // Link b's flow, the mirror image.
    let out = half(&flows, fb.local(), fb.remote());
    let inb = half(&flows, fb.remote(), fb.local());
    assert!(out.payload == sent_b && inb.payload == sent_a);
    assert!(out.fin && inb.fin);
}

#[test]
fn reset_is_captured_as_rst() {
    let buf = SharedBuf::default();
    let writer = PcapWriter::new(buf.clone()).unwrap().shared();
    let (a, _b) = MemLink::pair(1024);
    let faults = a.faults();
    let mut a = CapturingLink::new(a, Arc::clone(&writer)).unwrap();
    a.send(b"before the cut").unwrap();
    faults.cut();
    assert!(matches!(a.recv(&mut [0u8; 16]), Err(LinkError::Reset)));
    let flow = a.flow().clone();
    drop(a);
    let bytes = buf.0.lock().unwrap().clone();
    let (flows, _) = parse_capture(&bytes);
    assert_eq!(half(&flows, flow.local(), flow.remote()).payload, b"before the cut");
    assert!(half(&flows, flow.remote(), flow.local()).rst);
    assert!(!half(&flows, flow.local(), flow.remote()).fin, "nothing after the RST");
}

#[test]
fn capture_of_a_tcp_link_uses_the_real_addresses_and_writes_a_file() {
    let mut listener = TcpListenerLink::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let client = TcpLink::connect(listener.local_addr().unwrap(), &LinkOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut server = None;
    for _ in 0..10_000 {
        server = listener.accept().unwrap();
        if server.is_some() {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let server = server.expect("accepted");
    let path = std::env::temp_dir().join(format!("iwarp-netdev-test-{}.pcap", std::process::id()));
    let writer = PcapWriter::create(&path).unwrap().shared();
    let mut client = CapturingLink::new(client, Arc::clone(&writer)).unwrap();
    let (Some(SocketAddr::V4(local)), Some(SocketAddr::V4(peer))) = (client.local_addr(), client.peer_addr())
    else {
        panic!("IPv4 addresses expected")
    };
    assert_eq!((client.flow().local(), client.flow().remote()), (local, peer));
    // The other end of the same connection, captured into the same file, gets its own flow.
    let mut server = CapturingLink::new(server, Arc::clone(&writer)).unwrap();
    assert_eq!(server.flow().local().ip().octets(), [10, 0, 0, 1]);
    let data = pattern(3, 50_000);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..100_000 {
        if sent < data.len() {
            sent += client.send(&data[sent..]).unwrap();
        }
        let n = server.recv(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
        if got.len() == data.len() {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_micros(100));
    }
    assert!(got == data);
    client.shutdown_write();
    drop(client);
    drop(server);
    drop(writer);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let (flows, _) = parse_capture(&bytes);
    let out = half(&flows, local, peer);
    assert!(out.payload == data && out.fin);
    assert_eq!(flows.len(), 4);
    assert!(flows.values().any(|h| h.payload == data && h.syn && h.max_segment == TCP_MSS));
}
