//! The public API of the root `iwarp` package over real loopback TCP (127.0.0.1 only): every
//! poll mode moving data with Write, Read and Send under each MPA setting, connection
//! management (private data, reject, refused, silent peers, IRD/ORD), faults (disconnect,
//! Terminate, a TCP connection killed from outside), completion queues (timeouts, async,
//! solicited-only notification, ordering, many queue pairs on one CQ), memory registration and
//! RFC 7306.
//!
//! Every wait is bounded (at most [`T`]); nothing loops forever.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use iwarp::ddp::TerminateCode;
use iwarp::mpa::CrcPolicy;
use iwarp::rdmap::atomic::AtomicOp;
use iwarp::{
    Access, CmError, ConnectOptions, Device, MemoryRegion, PollMode, PostError, ProtectionDomain, QpEvent,
    QpState, QueuePair, RecvWr, RegisterError, STag, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

mod common;
use common::*;

// --- data transfers ------------------------------------------------------------------------

/// Bytes of guard around every target, which must stay untouched.
const GUARD: usize = 8;
const GUARD_BYTE: u8 = 0xee;

fn guarded(pd: &ProtectionDomain, len: usize, access: Access) -> MemoryRegion {
    pd.register_bytes(&vec![GUARD_BYTE; len + 2 * GUARD], access).unwrap()
}

fn check_guarded(mr: &MemoryRegion, expected: &[u8], what: &str) {
    let got = mr.to_vec();
    assert!(got[..GUARD].iter().all(|&b| b == GUARD_BYTE), "{what}: front guard overwritten");
    assert!(got[GUARD + expected.len()..].iter().all(|&b| b == GUARD_BYTE), "{what}: back guard overwritten");
    assert!(got[GUARD..GUARD + expected.len()] == *expected, "{what}: data differs");
}

/// A source region holding `data` (one byte when empty) and an SGL over it in up to three
/// elements, so that gathering is exercised.
fn source(pd: &ProtectionDomain, data: &[u8]) -> (MemoryRegion, Vec<Sge>) {
    let mr = if data.is_empty() {
        pd.register(1, Access::NONE).unwrap()
    } else {
        pd.register_bytes(data, Access::NONE).unwrap()
    };
    let n = data.len();
    let sgl = if n >= 3 {
        let (a, b) = (n / 3, n / 3 + n / 5);
        vec![mr.sge(0, a as u32), mr.sge(a, (b - a) as u32), mr.sge(b, (n - b) as u32)]
    } else {
        vec![mr.sge(0, n as u32)]
    };
    (mr, sgl)
}

/// RDMA Write of `n` bytes from `a` into `b`, fenced by a zero-byte Send whose arrival proves
/// the Write was placed.
fn write(a: &End, b: &End, n: usize, what: &str) {
    let what = format!("{what}: Write {n}");
    let data = pattern(n, 1);
    let target = guarded(&b.pd, n, Access::REMOTE_WRITE);
    let fence = b.pd.register(16, Access::LOCAL_WRITE).unwrap();
    b.recv(900, vec![fence.sge_all()]);
    let (_src, sgl) = source(&a.pd, &data);
    a.send(1, SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() + GUARD as u64 }, sgl);
    a.send(2, send_op(false), vec![]);
    let wc = a.expect_ok(1, WcOpcode::Write, &what);
    assert_eq!(wc.byte_len, n as u64, "{what}");
    a.expect_ok(2, WcOpcode::Send, &what);
    let wc = b.expect_ok(900, WcOpcode::Recv, &what);
    assert_eq!(wc.byte_len, 0, "{what}");
    check_guarded(&target, &data, &what);
}

/// RDMA Read of `n` bytes of `b` into `a`.
fn read(a: &End, b: &End, n: usize, what: &str) {
    let what = format!("{what}: Read {n}");
    let data = pattern(n, 2);
    let remote = if n == 0 {
        b.pd.register(1, Access::REMOTE_READ).unwrap()
    } else {
        b.pd.register_bytes(&data, Access::REMOTE_READ).unwrap()
    };
    let sink = guarded(&a.pd, n, Access::LOCAL_WRITE);
    a.send(
        3,
        SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() },
        vec![sink.sge(GUARD, n as u32)],
    );
    let wc = a.expect_ok(3, WcOpcode::Read, &what);
    assert_eq!(wc.byte_len, n as u64, "{what}");
    check_guarded(&sink, &data, &what);
}

/// A Send of `n` bytes from `a`, gathered from up to three elements, into a receive buffer of
/// `b` scattered over two regions.
fn send(a: &End, b: &End, n: usize, what: &str) {
    let what = format!("{what}: Send {n}");
    let data = pattern(n, 3);
    let half = n / 2;
    let first = guarded(&b.pd, half, Access::LOCAL_WRITE);
    let second = guarded(&b.pd, n - half + 5, Access::LOCAL_WRITE);
    b.recv(901, vec![first.sge(GUARD, half as u32), second.sge(GUARD, (n - half + 5) as u32)]);
    let (_src, sgl) = source(&a.pd, &data);
    a.send(4, send_op(false), sgl);
    let wc = a.expect_ok(4, WcOpcode::Send, &what);
    assert_eq!(wc.byte_len, n as u64, "{what}");
    let wc = b.expect_ok(901, WcOpcode::Recv, &what);
    assert_eq!(wc.byte_len, n as u64, "{what}");
    assert!(!wc.solicited && wc.imm_data.is_none() && wc.invalidated.is_none(), "{what}: {wc:?}");
    check_guarded(&first, &data[..half], &what);
    let mut rest = data[half..].to_vec();
    rest.extend_from_slice(&[GUARD_BYTE; 5]);
    check_guarded(&second, &rest, &what);
}

/// Write, Read and Send at every size, both directions.
fn exercise(p: &Pair, sizes: &[usize], what: &str) {
    for &n in sizes {
        write(&p.client, &p.server, n, &format!("{what} c->s"));
        write(&p.server, &p.client, n, &format!("{what} s->c"));
        read(&p.client, &p.server, n, &format!("{what} c<-s"));
        read(&p.server, &p.client, n, &format!("{what} s<-c"));
        send(&p.client, &p.server, n, &format!("{what} c->s"));
        send(&p.server, &p.client, n, &format!("{what} s->c"));
    }
    assert_eq!(p.client.qp.state(), QpState::Rts, "{what}");
    assert_eq!(p.server.qp.state(), QpState::Rts, "{what}");
    assert!(p.client.qp.poll_event().is_none() && p.server.qp.poll_event().is_none(), "{what}");
}

/// The MPA settings every poll mode is run with (the same on both ends).
#[derive(Debug, Clone, Copy)]
enum Setting {
    Default,
    Crc,
    Revision1,
    Revision1Crc,
    Markers,
    PeerToPeer,
    All,
}

fn options(s: Setting) -> ConnectOptions {
    let mut o = ConnectOptions::default();
    let p = &mut o.policy;
    match s {
        Setting::Default => {}
        Setting::Crc => p.crc = CrcPolicy::Wanted,
        Setting::Revision1 => p.revision = 1,
        Setting::Revision1Crc => {
            p.revision = 1;
            p.crc = CrcPolicy::Required;
        }
        Setting::Markers => p.markers_wanted = true,
        Setting::PeerToPeer => p.peer_to_peer = true,
        Setting::All => {
            p.crc = CrcPolicy::Wanted;
            p.markers_wanted = true;
            p.peer_to_peer = true;
        }
    }
    o
}

fn run_mode(mode: PollMode, s: Setting) {
    let start = Instant::now();
    let opts = options(s);
    let p = pair(mode, &opts, &opts);
    let what = format!("{mode:?}/{s:?}");
    for end in [&p.client, &p.server] {
        let cp = end.qp.conn_params();
        let expect_crc = matches!(s, Setting::Crc | Setting::Revision1Crc | Setting::All);
        let expect_markers = matches!(s, Setting::Markers | Setting::All);
        assert_eq!(cp.crc, expect_crc, "{what}: {cp:?}");
        assert_eq!((cp.markers_tx, cp.markers_rx), (expect_markers, expect_markers), "{what}: {cp:?}");
        assert_eq!(cp.revision, if matches!(s, Setting::Revision1 | Setting::Revision1Crc) { 1 } else { 2 });
        assert_eq!(cp.rtr.is_some(), matches!(s, Setting::PeerToPeer | Setting::All), "{what}: {cp:?}");
    }
    // One 1 MiB case per operation and mode, in the default setting; small sizes elsewhere.
    let sizes: &[usize] = if matches!(s, Setting::Default) { &[0, 1, 4096, MIB] } else { &[0, 1, 4096] };
    exercise(&p, sizes, &what);
    assert!(start.elapsed() < Duration::from_secs(20), "{what} took {:?}", start.elapsed());
}

macro_rules! mode_tests {
    ($($name:ident: $mode:ident, $setting:ident;)*) => {
        $(
            #[test]
            fn $name() {
                run_mode(PollMode::$mode, Setting::$setting);
            }
        )*
    };
}

mode_tests! {
    busy_default: Busy, Default;
    busy_crc: Busy, Crc;
    busy_revision1: Busy, Revision1;
    busy_revision1_crc: Busy, Revision1Crc;
    busy_markers: Busy, Markers;
    busy_peer_to_peer: Busy, PeerToPeer;
    busy_all: Busy, All;
    adaptive_default: Adaptive, Default;
    adaptive_crc: Adaptive, Crc;
    adaptive_revision1: Adaptive, Revision1;
    adaptive_revision1_crc: Adaptive, Revision1Crc;
    adaptive_markers: Adaptive, Markers;
    adaptive_peer_to_peer: Adaptive, PeerToPeer;
    adaptive_all: Adaptive, All;
    event_default: Event, Default;
    event_crc: Event, Crc;
    event_revision1: Event, Revision1;
    event_revision1_crc: Event, Revision1Crc;
    event_markers: Event, Markers;
    event_peer_to_peer: Event, PeerToPeer;
    event_all: Event, All;
    inline_default: Inline, Default;
    inline_crc: Inline, Crc;
    inline_revision1: Inline, Revision1;
    inline_revision1_crc: Inline, Revision1Crc;
    inline_markers: Inline, Markers;
    inline_peer_to_peer: Inline, PeerToPeer;
    inline_all: Inline, All;
}

/// Inline mode with the engine driven only by `Device::progress` (no completion-queue wait).
#[test]
fn inline_driven_by_progress() {
    let p = default_pair(PollMode::Inline);
    let dev = &p._devs[0];
    let target = p.server.pd.register(64, Access::REMOTE_WRITE).unwrap();
    let fence = p.server.pd.register(8, Access::LOCAL_WRITE).unwrap();
    p.server.recv(7, vec![fence.sge_all()]);
    let src = p.client.pd.register_bytes(b"driven by progress", Access::NONE).unwrap();
    p.client.send(
        1,
        SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() },
        vec![src.sge_all()],
    );
    p.client.send(2, send_op(false), vec![]);
    let deadline = Instant::now() + T;
    while target.to_vec()[..18] != *b"driven by progress" {
        assert!(Instant::now() < deadline, "the Write never landed");
        dev.progress();
    }
    // Everything was done by progress(): the completions are already in the rings.
    let mut got = Vec::new();
    while got.len() < 2 && Instant::now() < deadline {
        dev.progress();
        got.extend(std::iter::from_fn(|| p.client.cq.poll()).map(|wc| (wc.wr_id, wc.status)));
    }
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.server.wait("fence").wr_id, 7);
}

// --- connection management -----------------------------------------------------------------

#[test]
fn private_data_both_ways() {
    for revision in [1, 2] {
        let mut copts =
            ConnectOptions { private_data: b"hello from the initiator".to_vec(), ..Default::default() };
        let mut sopts =
            ConnectOptions { private_data: b"and the responder's reply".to_vec(), ..Default::default() };
        copts.policy.revision = revision;
        sopts.policy.revision = revision;
        let p = pair(PollMode::Adaptive, &copts, &sopts);
        assert_eq!(p.request_pd, copts.private_data, "revision {revision}");
        assert_eq!(p.reply_pd, sopts.private_data, "revision {revision}");
        // The connection works after the exchange.
        send(&p.client, &p.server, 100, &format!("revision {revision}"));
    }
}

#[test]
fn empty_and_largest_private_data() {
    let copts = ConnectOptions { private_data: vec![0xab; 252], ..Default::default() };
    let p = pair(PollMode::Adaptive, &copts, &ConnectOptions::default());
    assert_eq!(p.request_pd, vec![0xab; 252]);
    assert!(p.reply_pd.is_empty());
}

#[test]
fn reject_carries_private_data() {
    let dev = open(PollMode::Adaptive);
    let listener = dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let req = listener.accept(T).unwrap();
        assert_eq!(req.private_data(), b"may I?");
        req.reject(b"no, go away").unwrap();
    });
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
    let opts = ConnectOptions { private_data: b"may I?".to_vec(), ..Default::default() };
    let err = dev.connect(addr, &pd, &cq, &cq, &opts).unwrap_err();
    server.join().unwrap();
    match err {
        CmError::Rejected { private_data } => assert_eq!(private_data, b"no, go away"),
        e => panic!("expected Rejected, got {e:?}"),
    }
    assert_eq!(dev.connections(), 0);
}

#[test]
fn connect_without_listener_is_io_error() {
    let port = TcpListener::bind(localhost()).unwrap().local_addr().unwrap().port();
    // The listener is gone: nothing listens on that port now.
    let dev = open(PollMode::Adaptive);
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let start = Instant::now();
    let err = dev.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap_err();
    assert!(start.elapsed() < T);
    match err {
        CmError::Io(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        e => panic!("expected Io, got {e:?}"),
    }
}

#[test]
fn silent_listener_times_out() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts and says nothing, holding the stream open until the test is done.
    let silent = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_secs(2));
        drop(stream);
    });
    let dev = open(PollMode::Adaptive);
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
    let opts = ConnectOptions { timeout: Duration::from_millis(300), ..Default::default() };
    let start = Instant::now();
    let err = dev.connect(addr, &pd, &cq, &cq, &opts).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, CmError::Timeout), "expected Timeout, got {err:?}");
    assert!(took >= Duration::from_millis(250) && took < Duration::from_millis(1500), "took {took:?}");
    silent.join().unwrap();
}

#[test]
fn listener_accept_times_out() {
    let dev = open(PollMode::Adaptive);
    let listener = dev.listen(localhost()).unwrap();
    let start = Instant::now();
    let err = listener.accept(Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, CmError::Timeout), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn ird_ord_negotiated() {
    let mut copts = ConnectOptions::default();
    (copts.policy.ird, copts.policy.ord) = (8, 4);
    let mut sopts = ConnectOptions::default();
    (sopts.policy.ird, sopts.policy.ord) = (2, 16);
    let p = pair(PollMode::Adaptive, &copts, &sopts);
    let c = p.client.qp.conn_params();
    let s = p.server.qp.conn_params();
    // The responder lowers its ORD to the initiator's IRD and offers its IRD (2) for the
    // initiator's ORD (4); the initiator lowers its ORD to 2.
    assert_eq!((c.ird, c.ord), (8, 2), "{c:?}");
    assert_eq!((s.ird, s.ord), (2, 8), "{s:?}");
    assert_eq!(p.client.qp.config().ord, 2);
    assert_eq!(p.server.qp.config().ird, 2);
    let peer = s.peer_ird_ord.unwrap();
    assert_eq!((peer.ird, peer.ord), (8, 4));
    // More Reads than the ORD allows are queued, not lost: all six complete, in order.
    let remote = p.server.pd.register_bytes(&pattern(6 * 1000, 9), Access::REMOTE_READ).unwrap();
    let sink = p.client.pd.register(6 * 1000, Access::LOCAL_WRITE).unwrap();
    for i in 0..6u64 {
        let off = i as usize * 1000;
        p.client.send(
            i,
            SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() + off as u64 },
            vec![sink.sge(off, 1000)],
        );
    }
    for i in 0..6 {
        p.client.expect_ok(i, WcOpcode::Read, "read beyond ORD");
    }
    assert_eq!(sink.to_vec(), remote.to_vec());
}

#[test]
fn connect_request_shows_peer_ird_ord() {
    let dev = open(PollMode::Adaptive);
    let listener = dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let req = listener.accept(T).unwrap();
        let word = req.peer_ird_ord().unwrap();
        let r = req.request().unwrap();
        assert_eq!(r.revision, 2);
        req.reject(&[]).unwrap();
        (word.ird, word.ord)
    });
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
    let mut opts = ConnectOptions::default();
    (opts.policy.ird, opts.policy.ord) = (5, 3);
    assert!(matches!(dev.connect(addr, &pd, &cq, &cq, &opts), Err(CmError::Rejected { .. })));
    assert_eq!(server.join().unwrap(), (5, 3));
}

// --- faults ----------------------------------------------------------------------------------

#[test]
fn peer_disconnect_flushes_everything_once() {
    // The server's engine is inline and nobody drives it until the disconnect: the client's
    // Reads stay unanswered.
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Inline);
    let (client, server, _, _) =
        connect_on(&cdev, &sdev, &ConnectOptions::default(), &ConnectOptions::default());
    let remote = server.pd.register(4096, Access::REMOTE_READ).unwrap();
    let rbuf = client.pd.register(4 * 4096, Access::LOCAL_WRITE).unwrap();
    for i in 0..4u64 {
        client.recv(100 + i, vec![rbuf.sge(i as usize * 4096, 4096)]);
    }
    let sink = client.pd.register(3 * 4096, Access::LOCAL_WRITE).unwrap();
    for i in 0..3u64 {
        client.send(
            200 + i,
            SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() },
            vec![sink.sge(i as usize * 4096, 4096)],
        );
    }
    let srv_buf = server.pd.register(4096, Access::LOCAL_WRITE).unwrap();
    server.recv(300, vec![srv_buf.sge_all()]);
    server.recv(301, vec![srv_buf.sge_all()]);
    // Let the client's Read Requests reach the wire before the server goes away.
    thread::sleep(Duration::from_millis(50));
    assert!(client.cq.poll().is_none());

    server.qp.disconnect();
    // The disconnecting side: its own receives flush, it ends in Error.
    let wcs = collect(&server.cq, 2, "server");
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [300, 301]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushError), "{wcs:?}");
    wait_state(&server.qp, QpState::Error, "server");

    // The peer: LLP lost, Error, every outstanding request flushed exactly once.
    let ev = client.qp.wait_event(T);
    assert_eq!(ev, Some(QpEvent::LlpLost));
    wait_state(&client.qp, QpState::Error, "client");
    let wcs = collect(&client.cq, 7, "client");
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushError), "{wcs:?}");
    let mut recvs: Vec<u64> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).map(|w| w.wr_id).collect();
    let mut reads: Vec<u64> = wcs.iter().filter(|w| w.opcode == WcOpcode::Read).map(|w| w.wr_id).collect();
    recvs.sort_unstable();
    reads.sort_unstable();
    assert_eq!(recvs, [100, 101, 102, 103]);
    assert_eq!(reads, [200, 201, 202]);
    // Nothing was placed into the Read sinks.
    assert!(sink.to_vec().iter().all(|&b| b == 0));
    // The engine lets go of the dead connection.
    let deadline = Instant::now() + T;
    while cdev.connections() != 0 {
        assert!(Instant::now() < deadline, "the client engine keeps the dead connection");
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn local_disconnect_flushes_sends_and_recvs() {
    let p = default_pair(PollMode::Event);
    let buf = p.client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    p.client.recv(1, vec![buf.sge_all()]);
    p.client.recv(2, vec![buf.sge_all()]);
    p.client.qp.disconnect();
    let wcs = collect(&p.client.cq, 2, "client");
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushError), (2, WcStatus::WrFlushError)]
    );
    wait_state(&p.client.qp, QpState::Error, "client");
    assert_eq!(p.server.qp.wait_event(T), Some(QpEvent::LlpLost));
    wait_state(&p.server.qp, QpState::Error, "server");
}

/// Work posted to a queue pair in Error completes at once with a flush error, as verbs do
/// (and as `iwarp_rdmap::qp` documents), also once the engine has let go of the dead
/// connection.
#[test]
fn post_after_error_flushes() {
    let p = default_pair(PollMode::Adaptive);
    p.server.qp.disconnect();
    assert_eq!(p.client.qp.wait_event(T), Some(QpEvent::LlpLost));
    wait_state(&p.client.qp, QpState::Error, "client");
    wait_state(&p.server.qp, QpState::Error, "server");
    let buf = p.client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    // On both the side that saw the peer go and the side that disconnected.
    for (end, what) in [(&p.client, "peer of the disconnect"), (&p.server, "disconnecting side")] {
        end.recv(1, vec![buf.sge(0, 8)]);
        end.send(2, send_op(false), vec![]);
        let wcs = collect(&end.cq, 2, what);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [(1, WcStatus::WrFlushError), (2, WcStatus::WrFlushError)],
            "{what}"
        );
    }
}

/// The invalid-STag Terminate cause: DDP layer, tagged buffer error, invalid STag.
fn invalid_stag() -> TerminateCode {
    TerminateCode::ddp(1, 0x00)
}

/// A second connection on the same devices keeps moving data, verified, all the while `f`
/// runs, and afterwards.
fn with_bystander(cdev: &Device, sdev: &Device, f: impl FnOnce()) {
    let (c2, s2, _, _) = connect_on(cdev, sdev, &ConnectOptions::default(), &ConnectOptions::default());
    let done = Arc::new(AtomicBool::new(false));
    let busy = {
        let done = done.clone();
        thread::spawn(move || {
            let pair2 = Pair { client: c2, server: s2, request_pd: vec![], reply_pd: vec![], _devs: vec![] };
            let deadline = Instant::now() + T;
            let mut rounds = 0;
            while !done.load(Ordering::Acquire) && Instant::now() < deadline {
                exercise(&pair2, &[1, 4096], &format!("bystander round {rounds}"));
                rounds += 1;
            }
            (pair2, rounds)
        })
    };
    f();
    done.store(true, Ordering::Release);
    let (pair2, rounds) = busy.join().expect("the bystander connection was disturbed");
    assert!(rounds > 0);
    exercise(&pair2, &[65536], "bystander afterwards");
}

#[test]
fn terminate_on_invalid_rkey() {
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Adaptive);
    with_bystander(&cdev, &sdev, || {
        let (client, server, _, _) =
            connect_on(&cdev, &sdev, &ConnectOptions::default(), &ConnectOptions::default());
        let good = server.pd.register(4096, Access::REMOTE_WRITE.union(Access::REMOTE_READ)).unwrap();
        let buf = client.pd.register(4096, Access::LOCAL_WRITE).unwrap();
        let srv_buf = server.pd.register(64, Access::LOCAL_WRITE).unwrap();
        server.recv(50, vec![srv_buf.sge_all()]);
        client.recv(10, vec![buf.sge(0, 100)]);
        client.recv(11, vec![buf.sge(100, 100)]);
        // A bogus rkey (a valid-looking STag nobody registered).
        let bad = STag(good.rkey().0 ^ 0x0000_5500);
        client.send(1, SendOp::Write { remote_stag: bad, remote_to: good.addr() }, vec![buf.sge(0, 512)]);
        client.send(
            2,
            SendOp::Read { remote_stag: good.rkey(), remote_to: good.addr() },
            vec![buf.sge(0, 64)],
        );

        // The writer hears the Terminate with the cause the server found.
        let ev = client.qp.wait_event(T).expect("no event on the writer");
        match ev {
            QpEvent::RemoteTerminate { header, .. } => assert_eq!(header.cause, invalid_stag(), "{ev:?}"),
            e => panic!("expected RemoteTerminate, got {e:?}"),
        }
        match server.qp.wait_event(T) {
            Some(QpEvent::LocalTerminate(code)) => assert_eq!(code, invalid_stag()),
            e => panic!("expected LocalTerminate on the target, got {e:?}"),
        }
        wait_state(&client.qp, QpState::Error, "writer");
        wait_state(&server.qp, QpState::Error, "target");
        // Every request of the writer completes exactly once: the Write was handed to TCP
        // (success or flush, both allowed), the Read and the receives flush.
        let wcs = collect(&client.cq, 4, "writer");
        let by_id = |id| wcs.iter().find(|w| w.wr_id == id).unwrap_or_else(|| panic!("no {id}: {wcs:?}"));
        assert!(matches!(by_id(1).status, WcStatus::Success | WcStatus::WrFlushError), "{wcs:?}");
        for id in [2, 10, 11] {
            assert_eq!(by_id(id).status, WcStatus::WrFlushError, "{wcs:?}");
        }
        let wcs = collect(&server.cq, 1, "target");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (50, WcStatus::WrFlushError));
        // Nothing was written anywhere on the target.
        assert!(good.to_vec().iter().all(|&b| b == 0));
    });
}

/// A raw TCP client that sends a hand-made MPA Request, is accepted through the API, and then
/// vanishes (closing its socket with the Reply unread: a reset).
#[test]
fn raw_peer_drop_flushes_and_reports() {
    let dev = open(PollMode::Adaptive);
    let listener = dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut request = b"MPA ID Req Frame".to_vec();
    request.extend_from_slice(&[0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01]);
    raw.write_all(&request).unwrap();
    let req = listener.accept(T).unwrap();
    assert_eq!(req.peer_addr(), raw.local_addr().unwrap());
    assert!(req.private_data().is_empty());
    let word = req.peer_ird_ord().unwrap();
    assert_eq!((word.ird, word.ord), (1, 1));
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let qp = req.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap();
    let buf = pd.register(256, Access::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        qp.post_recv(RecvWr { wr_id: i, sgl: buf.sge(0, 256).into() }).unwrap();
    }
    thread::sleep(Duration::from_millis(20));
    assert!(cq.poll().is_none());
    assert_eq!(qp.state(), QpState::Rts);
    drop(raw);
    assert_eq!(qp.wait_event(T), Some(QpEvent::LlpLost));
    wait_state(&qp, QpState::Error, "accepted side");
    let wcs = collect(&cq, 3, "accepted side");
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(0, WcStatus::WrFlushError), (1, WcStatus::WrFlushError), (2, WcStatus::WrFlushError)]
    );
}

// --- completion queues -----------------------------------------------------------------------

#[test]
fn wait_times_out_when_idle() {
    for mode in [PollMode::Adaptive, PollMode::Inline] {
        let p = default_pair(mode);
        for cq in [&p.client.cq, &p.server.cq] {
            let start = Instant::now();
            assert!(cq.wait(Duration::from_millis(100)).is_none(), "{mode:?}");
            let took = start.elapsed();
            assert!(
                took >= Duration::from_millis(100) && took < Duration::from_secs(2),
                "{mode:?}: {took:?}"
            );
            assert!(!cq.wait_notification(Duration::from_millis(20)), "{mode:?}");
        }
        // A fresh CQ on an idle device too.
        let cq = p._devs[0].create_cq(4);
        assert!(cq.wait(Duration::from_millis(20)).is_none());
        assert!(cq.poll().is_none());
    }
}

/// Wakes a parked thread.
struct ThreadWaker(thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: polls `fut` on this thread, parking between wake-ups, for at most
/// `limit`; `None` on time-out.
fn block_on<F: std::future::Future>(fut: F, limit: Duration) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + limit;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::park_timeout(deadline - now);
    }
}

#[test]
fn async_next_completion() {
    for mode in [PollMode::Event, PollMode::Inline] {
        let p = default_pair(mode);
        let buf = p.server.pd.register(64, Access::LOCAL_WRITE).unwrap();
        p.server.recv(5, vec![buf.sge_all()]);
        // Nothing yet: the future stays pending (bounded).
        assert!(block_on(p.server.cq.next(), Duration::from_millis(50)).is_none(), "{mode:?}");
        let src = p.client.pd.register_bytes(b"async", Access::NONE).unwrap();
        p.client.send(6, send_op(false), vec![src.sge_all()]);
        let wc = block_on(p.server.cq.next(), T).expect("no completion");
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::Success, 5), "{mode:?}");
        assert_eq!(&buf.to_vec()[..5], b"async");
        let wc = block_on(p.client.cq.next(), T).expect("no send completion");
        assert_eq!((wc.wr_id, wc.opcode), (6, WcOpcode::Send));
        // The future is woken by a completion arriving later, from another thread.
        p.server.recv(7, vec![buf.sge_all()]);
        let client_qp = p.client.qp.clone();
        let sender = thread::spawn(move || {
            thread::sleep(Duration::from_millis(30));
            client_qp
                .post_send(SendWr { wr_id: 8, op: send_op(false), sgl: vec![].into(), signaled: true })
                .unwrap();
        });
        let wc = block_on(p.server.cq.next(), T).expect("no late completion");
        assert_eq!(wc.wr_id, 7, "{mode:?}");
        sender.join().unwrap();
    }
}

#[test]
fn solicited_only_notification() {
    for mode in [PollMode::Adaptive, PollMode::Inline] {
        let p = default_pair(mode);
        let buf = p.server.pd.register(64, Access::LOCAL_WRITE).unwrap();
        p.server.recv(1, vec![buf.sge_all()]);
        p.server.recv(2, vec![buf.sge_all()]);
        p.server.cq.req_notify(true);
        // An unsolicited Send completes but does not notify.
        p.client.send(10, send_op(false), vec![]);
        let wc = p.server.expect_ok(1, WcOpcode::Recv, "unsolicited");
        assert!(!wc.solicited);
        assert!(!p.server.cq.wait_notification(Duration::from_millis(100)), "{mode:?}: woken by unsolicited");
        // A solicited one notifies.
        p.client.send(11, send_op(true), vec![]);
        assert!(p.server.cq.wait_notification(T), "{mode:?}: solicited Send did not notify");
        let wc = p.server.expect_ok(2, WcOpcode::Recv, "solicited");
        assert!(wc.solicited);
        // The notification was consumed; it is not armed any more.
        assert!(!p.server.cq.wait_notification(Duration::from_millis(20)));
        // Armed for any completion, an unsolicited Send notifies.
        p.server.recv(3, vec![buf.sge_all()]);
        p.server.cq.req_notify(false);
        p.client.send(12, send_op(false), vec![]);
        assert!(
            p.server.cq.wait_notification(T),
            "{mode:?}: unsolicited Send did not notify when armed for any"
        );
        p.server.expect_ok(3, WcOpcode::Recv, "any");
        for id in [10, 11, 12] {
            p.client.expect_ok(id, WcOpcode::Send, "sender");
        }
    }
}

#[test]
fn completions_in_order_per_qp() {
    let p = default_pair(PollMode::Adaptive);
    let n = 200u64;
    let buf = p.server.pd.register(n as usize * 8, Access::LOCAL_WRITE).unwrap();
    for i in 0..n {
        p.server.recv(i, vec![buf.sge(i as usize * 8, 8)]);
    }
    let src = p.client.pd.register_bytes(&pattern(n as usize * 8, 4), Access::NONE).unwrap();
    let target = p.server.pd.register(64, Access::REMOTE_WRITE).unwrap();
    for i in 0..n {
        // Mix in unsignaled Writes: they complete silently without breaking the order.
        p.client
            .qp
            .post_send(SendWr {
                wr_id: 10_000 + i,
                op: SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() },
                sgl: src.sge(0, 8).into(),
                signaled: false,
            })
            .unwrap();
        p.client.send(i, send_op(false), vec![src.sge(i as usize * 8, 8)]);
    }
    for i in 0..n {
        let wc = p.client.expect_ok(i, WcOpcode::Send, "sender order");
        assert_eq!(wc.byte_len, 8);
    }
    for i in 0..n {
        p.server.expect_ok(i, WcOpcode::Recv, "receiver order");
    }
    assert_eq!(buf.to_vec(), src.to_vec());
    assert!(p.client.cq.poll().is_none() && p.server.cq.poll().is_none());
}

#[test]
fn many_qps_share_one_cq() {
    const N: usize = 16;
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Adaptive);
    let listener = sdev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(4 * N));
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(4 * N));
    let server = {
        let (spd, scq) = (spd.clone(), scq.clone());
        thread::spawn(move || {
            (0..N)
                .map(|_| {
                    listener.accept(T).unwrap().accept(&spd, &scq, &scq, &ConnectOptions::default()).unwrap()
                })
                .collect::<Vec<_>>()
        })
    };
    let clients: Vec<QueuePair> = (0..N)
        .map(|_| cdev.connect(addr, &cpd, &ccq, &ccq, &ConnectOptions::default()).unwrap().qp)
        .collect();
    let servers = server.join().unwrap();
    assert_eq!(cdev.connections(), N);
    assert_eq!(sdev.connections(), N);
    // Every client Writes its index into its own slot and Sends its index; every server QP
    // receives one Send.
    let slots = spd.register(N * 8, Access::REMOTE_WRITE).unwrap();
    let rbuf = spd.register(N * 8, Access::LOCAL_WRITE).unwrap();
    for (i, s) in servers.iter().enumerate() {
        s.post_recv(RecvWr { wr_id: i as u64, sgl: rbuf.sge(i * 8, 8).into() }).unwrap();
    }
    let src: Vec<MemoryRegion> =
        (0..N).map(|i| cpd.register_bytes(&(i as u64 + 1).to_le_bytes(), Access::NONE).unwrap()).collect();
    for (i, c) in clients.iter().enumerate() {
        let sge = src[i].sge_all();
        let op = SendOp::Write { remote_stag: slots.rkey(), remote_to: slots.addr() + (i * 8) as u64 };
        c.post_send(SendWr { wr_id: (i * 2) as u64, op, sgl: sge.into(), signaled: true }).unwrap();
        c.post_send(SendWr {
            wr_id: (i * 2 + 1) as u64,
            op: send_op(false),
            sgl: sge.into(),
            signaled: true,
        })
        .unwrap();
    }
    let cwcs = collect(&ccq, 2 * N, "client CQ");
    let swcs = collect(&scq, N, "server CQ");
    assert!(cwcs.iter().chain(&swcs).all(|w| w.status == WcStatus::Success), "{cwcs:?} {swcs:?}");
    // Per QP: the Write, then the Send.
    for (i, c) in clients.iter().enumerate() {
        let mine: Vec<u64> = cwcs.iter().filter(|w| w.qp_num == c.qp_num()).map(|w| w.wr_id).collect();
        assert_eq!(mine, [(i * 2) as u64, (i * 2 + 1) as u64]);
    }
    for (i, s) in servers.iter().enumerate() {
        let mine: Vec<u64> = swcs.iter().filter(|w| w.qp_num == s.qp_num()).map(|w| w.wr_id).collect();
        assert_eq!(mine, [i as u64]);
    }
    let expect: Vec<u8> = (0..N).flat_map(|i| (i as u64 + 1).to_le_bytes()).collect();
    assert_eq!(slots.to_vec(), expect);
    assert_eq!(rbuf.to_vec(), expect);
}

#[test]
fn small_cq_backlogs_instead_of_dropping() {
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Adaptive);
    let listener = sdev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(64));
    let server = {
        let (spd, scq) = (spd.clone(), scq.clone());
        thread::spawn(move || {
            listener.accept(T).unwrap().accept(&spd, &scq, &scq, &ConnectOptions::default())
        })
    };
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(4));
    let client = cdev.connect(addr, &cpd, &ccq, &ccq, &ConnectOptions::default()).unwrap().qp;
    let _server_qp = server.join().unwrap().unwrap();
    let target = spd.register(64, Access::REMOTE_WRITE).unwrap();
    let src = cpd.register(64, Access::NONE).unwrap();
    for i in 0..40 {
        let op = SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() };
        client.post_send(SendWr { wr_id: i, op, sgl: src.sge(0, 64).into(), signaled: true }).unwrap();
    }
    thread::sleep(Duration::from_millis(50));
    let wcs = collect(&ccq, 40, "tiny CQ");
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..40).collect::<Vec<_>>());
}

// --- memory regions ------------------------------------------------------------------------

#[test]
fn register_zero_bytes_is_bad_length() {
    let dev = open(PollMode::Inline);
    let pd = dev.alloc_pd();
    assert_eq!(pd.register(0, Access::ALL).unwrap_err(), RegisterError::BadLength(0));
    assert_eq!(pd.register_bytes(&[], Access::LOCAL_WRITE).unwrap_err(), RegisterError::BadLength(0));
    let mr = pd.register(3, Access::LOCAL_WRITE).unwrap();
    assert_eq!((mr.len(), mr.is_empty()), (3, false));
    assert!(mr.write(2, b"xy").is_err());
    assert!(mr.read(4, &mut [0; 1]).is_err());
    let other = pd.register(3, Access::LOCAL_WRITE).unwrap();
    assert_ne!(mr.rkey(), other.rkey());
    assert!(other.addr() >= mr.addr() + 3, "regions' address ranges overlap");
}

#[test]
fn deregistered_rkey_is_invalid() {
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Adaptive);
    let (client, server, _, _) =
        connect_on(&cdev, &sdev, &ConnectOptions::default(), &ConnectOptions::default());
    let mr = server.pd.register_buffer(vec![0u8; 4096], Access::REMOTE_WRITE).unwrap();
    let (rkey, addr) = (mr.rkey(), mr.addr());
    // Works while registered.
    let src = client.pd.register_bytes(&[7; 16], Access::NONE).unwrap();
    client.send(1, SendOp::Write { remote_stag: rkey, remote_to: addr }, vec![src.sge_all()]);
    client.expect_ok(1, WcOpcode::Write, "registered");
    let deadline = Instant::now() + T;
    while mr.to_vec()[..16] != [7; 16] {
        assert!(Instant::now() < deadline, "the first Write never landed");
        thread::sleep(Duration::from_millis(1));
    }
    mr.write(0, &[0; 16]).unwrap();
    // The application's vector comes back; the stack must never touch it again.
    let memory = mr.deregister().unwrap().into_vec().unwrap();
    // A new region must not take over the old rkey.
    let newer = server.pd.register(4096, Access::REMOTE_WRITE).unwrap();
    assert_ne!(newer.rkey(), rkey);
    let big = client.pd.register_bytes(&[9; 4096], Access::NONE).unwrap();
    client.send(2, SendOp::Write { remote_stag: rkey, remote_to: addr }, vec![big.sge_all()]);
    match client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => assert_eq!(header.cause, invalid_stag()),
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    match server.qp.wait_event(T) {
        Some(QpEvent::LocalTerminate(code)) => assert_eq!(code, invalid_stag()),
        e => panic!("expected LocalTerminate, got {e:?}"),
    }
    wait_state(&client.qp, QpState::Error, "writer");
    assert!(memory.iter().all(|&b| b == 0), "a Write landed in deregistered memory");
    assert!(newer.to_vec().iter().all(|&b| b == 0), "a Write landed in the new region");
}

#[test]
fn access_rights_enforced() {
    // A Write to a region registered for remote read only terminates the connection.
    let p = default_pair(PollMode::Adaptive);
    let ro = p.server.pd.register(64, Access::REMOTE_READ).unwrap();
    let src = p.client.pd.register_bytes(&[1; 64], Access::NONE).unwrap();
    p.client.send(1, SendOp::Write { remote_stag: ro.rkey(), remote_to: ro.addr() }, vec![src.sge_all()]);
    match p.client.qp.wait_event(T) {
        // Access rights are an RDMAP check: RDMAP, remote protection, access rights violation.
        Some(QpEvent::RemoteTerminate { header, .. }) => {
            assert_eq!(header.cause, TerminateCode::rdmap(1, 0x02))
        }
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    assert!(ro.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn bounds_enforced() {
    // A Write running past the end of the region: DDP, tagged buffer, base or bounds.
    let p = default_pair(PollMode::Adaptive);
    let region = p.server.pd.register(64, Access::REMOTE_WRITE).unwrap();
    let src = p.client.pd.register_bytes(&[1; 64], Access::NONE).unwrap();
    let op = SendOp::Write { remote_stag: region.rkey(), remote_to: region.addr() + 1 };
    p.client.send(1, op, vec![src.sge_all()]);
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => {
            assert_eq!(header.cause, TerminateCode::ddp(1, 0x01))
        }
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    assert!(region.to_vec().iter().all(|&b| b == 0));
    // A Read below the region's base is refused by RDMAP on the responder.
    let p = default_pair(PollMode::Adaptive);
    let region = p.server.pd.register(64, Access::REMOTE_READ).unwrap();
    let sink = p.client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let op = SendOp::Read { remote_stag: region.rkey(), remote_to: region.addr() - 1 };
    p.client.send(2, op, vec![sink.sge_all()]);
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => {
            assert_eq!(header.cause, TerminateCode::rdmap(1, 0x01))
        }
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    // The Read itself fails (siw flushes it; verbs hardware reports a remote access error).
    let wc = p.client.wait("read out of bounds");
    assert_eq!(wc.wr_id, 2);
    assert!(matches!(wc.status, WcStatus::WrFlushError | WcStatus::RemoteAccessError), "{wc:?}");
    assert!(sink.to_vec().iter().all(|&b| b == 0));
}

// --- RFC 7306 ------------------------------------------------------------------------------

fn rfc7306_pair() -> Pair {
    let opts = ConnectOptions { rfc7306: true, ..Default::default() };
    pair(PollMode::Adaptive, &opts, &opts)
}

#[test]
fn rfc7306_immediate_data() {
    let p = rfc7306_pair();
    let buf = p.server.pd.register_bytes(&[GUARD_BYTE; 16], Access::LOCAL_WRITE).unwrap();
    p.server.recv(1, vec![buf.sge_all()]);
    p.client.send(2, SendOp::ImmediateData { data: *b"imm-data", solicited: false }, vec![]);
    let wc = p.server.expect_ok(1, WcOpcode::RecvImmediate, "immediate");
    assert_eq!(wc.imm_data, Some(*b"imm-data"));
    assert!(!wc.solicited);
    assert!(buf.to_vec().iter().all(|&b| b == GUARD_BYTE), "the receive buffer was touched");
    p.client.expect_ok(2, WcOpcode::ImmediateData, "immediate sender");
}

#[test]
fn rfc7306_write_with_immediate() {
    let p = rfc7306_pair();
    let target = guarded(&p.server.pd, 4096, Access::REMOTE_WRITE);
    let buf = p.server.pd.register(16, Access::LOCAL_WRITE).unwrap();
    p.server.recv(1, vec![buf.sge_all()]);
    p.server.cq.req_notify(true);
    let data = pattern(4096, 5);
    let (_src, sgl) = source(&p.client.pd, &data);
    let op = SendOp::WriteImmediate {
        remote_stag: target.rkey(),
        remote_to: target.addr() + GUARD as u64,
        data: 0x0102_0304_0506_0708u64.to_be_bytes(),
        solicited: true,
    };
    p.client.send(2, op, sgl);
    assert!(p.server.cq.wait_notification(T), "solicited Write with Immediate did not notify");
    let wc = p.server.expect_ok(1, WcOpcode::RecvImmediate, "write-imm receiver");
    assert_eq!(wc.imm_data, Some(0x0102_0304_0506_0708u64.to_be_bytes()));
    assert!(wc.solicited);
    // The data was placed before the immediate completion was reported.
    check_guarded(&target, &data, "write-imm");
    let wc = p.client.wait("write-imm sender");
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success), "{wc:?}");
    assert!(p.client.cq.wait(Duration::from_millis(100)).is_none(), "Write with Immediate completed twice");
}

fn atomic(remote: &MemoryRegion, op: AtomicOp, data: u64, compare: u64) -> SendOp {
    SendOp::Atomic {
        remote_stag: remote.rkey(),
        remote_to: remote.addr() + 8,
        op,
        data,
        data_mask: if op == AtomicOp::FetchAdd { 0 } else { !0 },
        compare,
        compare_mask: !0,
    }
}

#[test]
fn rfc7306_atomics() {
    let p = rfc7306_pair();
    let remote = p.server.pd.register(24, Access::REMOTE_ATOMIC).unwrap();
    remote.write(8, &100u64.to_ne_bytes()).unwrap();
    let result = p.client.pd.register(8, Access::LOCAL_WRITE).unwrap();
    let value = |mr: &MemoryRegion, off: usize| {
        let mut b = [0; 8];
        mr.read(off, &mut b).unwrap();
        u64::from_ne_bytes(b)
    };

    // Fetch-add: the original comes back, the sum stays.
    p.client.send(1, atomic(&remote, AtomicOp::FetchAdd, 23, 0), vec![result.sge_all()]);
    p.client.expect_ok(1, WcOpcode::Atomic, "fetch-add");
    assert_eq!(value(&result, 0), 100);
    assert_eq!(value(&remote, 8), 123);

    // Compare-swap that matches: swapped.
    p.client.send(2, atomic(&remote, AtomicOp::CompareSwap, 7, 123), vec![result.sge_all()]);
    p.client.expect_ok(2, WcOpcode::Atomic, "cmp-swap hit");
    assert_eq!(value(&result, 0), 123);
    assert_eq!(value(&remote, 8), 7);

    // Compare-swap that does not match: unchanged, the original still comes back.
    p.client.send(3, atomic(&remote, AtomicOp::CompareSwap, 99, 123), vec![result.sge_all()]);
    p.client.expect_ok(3, WcOpcode::Atomic, "cmp-swap miss");
    assert_eq!(value(&result, 0), 7);
    assert_eq!(value(&remote, 8), 7);
    // The neighbours were not touched.
    assert_eq!((value(&remote, 0), value(&remote, 16)), (0, 0));
}

#[test]
fn rfc7306_atomic_needs_rights() {
    let p = rfc7306_pair();
    let remote = p.server.pd.register(16, Access::REMOTE_WRITE).unwrap();
    let result = p.client.pd.register(8, Access::LOCAL_WRITE).unwrap();
    p.client.send(1, atomic(&remote, AtomicOp::FetchAdd, 1, 0), vec![result.sge_all()]);
    assert!(matches!(p.client.qp.wait_event(T), Some(QpEvent::RemoteTerminate { .. })));
    let wc = p.client.wait("atomic without rights");
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
    assert!(remote.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn rfc7306_not_negotiated() {
    let p = default_pair(PollMode::Inline);
    let remote = p.server.pd.register(16, Access::ALL).unwrap();
    let result = p.client.pd.register(8, Access::LOCAL_WRITE).unwrap();
    let ops = [
        (SendOp::ImmediateData { data: [1; 8], solicited: false }, vec![]),
        (
            SendOp::WriteImmediate {
                remote_stag: remote.rkey(),
                remote_to: remote.addr(),
                data: [2; 8],
                solicited: true,
            },
            vec![result.sge_all()],
        ),
        (atomic(&remote, AtomicOp::FetchAdd, 1, 0), vec![result.sge_all()]),
        (atomic(&remote, AtomicOp::CompareSwap, 1, 0), vec![result.sge_all()]),
    ];
    for (op, sgl) in ops {
        let err =
            p.client.qp.post_send(SendWr { wr_id: 1, op, sgl: sgl.into(), signaled: true }).unwrap_err();
        assert_eq!(err, PostError::ExtensionNotNegotiated, "{op:?}");
    }
    // Nothing was queued; the connection still works.
    assert!(p.client.cq.wait(Duration::from_millis(20)).is_none());
    send(&p.client, &p.server, 10, "after refused posts");
}

#[test]
fn read_needs_one_sge() {
    let p = default_pair(PollMode::Inline);
    let remote = p.server.pd.register(16, Access::REMOTE_READ).unwrap();
    let sink = p.client.pd.register(16, Access::LOCAL_WRITE).unwrap();
    let op = SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() };
    let two = vec![sink.sge(0, 8), sink.sge(8, 8)];
    assert_eq!(
        p.client.qp.post_send(SendWr { wr_id: 1, op, sgl: two.into(), signaled: true }),
        Err(PostError::ReadNeedsOneSge)
    );
}

// --- more protocol behaviour through the API -----------------------------------------------

#[test]
fn send_with_invalidate() {
    let p = default_pair(PollMode::Adaptive);
    // The server lets the client write into a region, and the client's Send with Invalidate
    // revokes that right in the same message.
    let region = p.server.pd.register(64, Access::REMOTE_WRITE).unwrap();
    let buf = p.server.pd.register(16, Access::LOCAL_WRITE).unwrap();
    p.server.recv(1, vec![buf.sge_all()]);
    let src = p.client.pd.register_bytes(&[5; 64], Access::NONE).unwrap();
    p.client.send(2, SendOp::Send { solicited: false, invalidate: Some(region.rkey()) }, vec![src.sge(0, 4)]);
    let wc = p.server.expect_ok(1, WcOpcode::Recv, "send with invalidate");
    assert_eq!(wc.invalidated, Some(region.rkey()));
    assert_eq!(wc.byte_len, 4);
    p.client.expect_ok(2, WcOpcode::Send, "sender");
    // A later Write to the invalidated STag is a protection error, never a write.
    p.client.send(
        3,
        SendOp::Write { remote_stag: region.rkey(), remote_to: region.addr() },
        vec![src.sge_all()],
    );
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => assert_eq!(header.cause, invalid_stag()),
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    assert!(region.to_vec().iter().all(|&b| b == 0));
}

/// A Send of 51 bytes into a 50-byte receive buffer (a second buffer posted behind it).
fn too_long_send() -> (Pair, WorkCompletion, WorkCompletion) {
    let p = default_pair(PollMode::Adaptive);
    let buf = p.server.pd.register(100, Access::LOCAL_WRITE).unwrap();
    p.server.recv(1, vec![buf.sge(0, 50)]);
    p.server.recv(2, vec![buf.sge(50, 50)]);
    let src = p.client.pd.register(51, Access::NONE).unwrap();
    p.client.send(3, send_op(false), vec![src.sge_all()]);
    let wcs = collect(&p.server.cq, 2, "receiver");
    (p, wcs[0], wcs[1])
}

#[test]
fn send_longer_than_receive_buffer() {
    let (p, first, second) = too_long_send();
    assert_eq!(first.wr_id, 1);
    assert_ne!(first.status, WcStatus::Success, "{first:?}");
    assert_eq!((second.wr_id, second.status), (2, WcStatus::WrFlushError), "{second:?}");
    // DDP untagged buffer error, "message too long for the available buffer", both ends.
    assert_eq!(p.server.qp.wait_event(T), Some(QpEvent::LocalTerminate(TerminateCode::ddp(2, 0x05))));
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => {
            assert_eq!(header.cause, TerminateCode::ddp(2, 0x05))
        }
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
}

/// The receive buffer the too-long message was for completes with the status the API
/// documents for it (`WcStatus::LocalLengthError`: "the incoming message did not fit the
/// receive buffer"; siw reports `IB_WC_LOC_LEN_ERR` there).
#[test]
fn too_long_send_is_a_length_error() {
    let (_p, first, _) = too_long_send();
    assert_eq!((first.wr_id, first.status), (1, WcStatus::LocalLengthError), "{first:?}");
}

#[test]
fn send_without_receive_buffer() {
    let p = default_pair(PollMode::Adaptive);
    p.client.send(1, send_op(false), vec![]);
    // DDP untagged buffer error: no buffer for the MSN.
    assert_eq!(p.server.qp.wait_event(T), Some(QpEvent::LocalTerminate(TerminateCode::ddp(2, 0x02))));
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => {
            assert_eq!(header.cause, TerminateCode::ddp(2, 0x02))
        }
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    wait_state(&p.client.qp, QpState::Error, "client");
}

#[test]
fn local_protection_errors() {
    let p = default_pair(PollMode::Adaptive);
    // A Read into a region without local write rights.
    let remote = p.server.pd.register_bytes(&[3; 32], Access::REMOTE_READ).unwrap();
    let ro = p.client.pd.register(32, Access::NONE).unwrap();
    p.client.send(
        1,
        SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() },
        vec![ro.sge_all()],
    );
    let wc = p.client.wait("read into read-only");
    assert_eq!(wc.wr_id, 1);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
    assert!(ro.to_vec().iter().all(|&b| b == 0), "a Read wrote into a region without local write");

    // A Send gathering from an lkey of another protection domain.
    let p = default_pair(PollMode::Adaptive);
    let other_pd = p._devs[0].alloc_pd();
    let foreign = other_pd.register(8, Access::NONE).unwrap();
    let buf = p.server.pd.register(8, Access::LOCAL_WRITE).unwrap();
    p.server.recv(1, vec![buf.sge_all()]);
    p.client.send(2, send_op(false), vec![foreign.sge_all()]);
    let wc = p.client.wait("send from a foreign lkey");
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocalProtectionError), "{wc:?}");
}

#[test]
fn send_queue_depth_is_outstanding_work() {
    // The server's engine is never driven: the client's Reads stay outstanding. The send queue
    // holds max_send_wr work requests; one more is refused at posting time (QueueFull) rather
    // than accepted and failed later.
    let cdev = open(PollMode::Adaptive);
    let sdev = open(PollMode::Inline);
    let copts = ConnectOptions { max_send_wr: 4, ..Default::default() };
    let (client, server, _, _) = connect_on(&cdev, &sdev, &copts, &ConnectOptions::default());
    let remote = server.pd.register(64, Access::REMOTE_READ).unwrap();
    let sink = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let read = |i: u64| SendWr {
        wr_id: i,
        op: SendOp::Read { remote_stag: remote.rkey(), remote_to: remote.addr() },
        sgl: sink.sge(0, 8).into(),
        signaled: true,
    };
    let mut refused = 0;
    for i in 0..8 {
        match client.qp.post_send(read(i)) {
            Ok(()) => {}
            Err(PostError::QueueFull) => refused += 1,
            Err(e) => panic!("{e:?}"),
        }
        thread::sleep(Duration::from_millis(5)); // the engine takes the WR off the ring
    }
    let failed: Vec<WorkCompletion> =
        std::iter::from_fn(|| client.cq.wait(Duration::from_millis(100))).collect();
    assert!(failed.is_empty(), "posted work failed instead of being refused: {failed:?}");
    assert_eq!(refused, 4);
}

#[test]
fn private_data_too_long_is_refused_locally() {
    let dev = open(PollMode::Adaptive);
    let listener = TcpListener::bind(localhost()).unwrap();
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(4));
    let opts = ConnectOptions { private_data: vec![0; 253], ..Default::default() };
    let err = dev.connect(listener.local_addr().unwrap(), &pd, &cq, &cq, &opts).unwrap_err();
    assert!(matches!(err, CmError::Negotiation(_) | CmError::Frame(_)), "{err:?}");
}

#[test]
fn crc_required_by_initiator_only() {
    // The initiator requires CRC, the responder (siw's default policy) does not ask for it:
    // either C bit turns CRC on, so the connection comes up with CRC both ways.
    let copts = ConnectOptions {
        policy: iwarp::mpa::Policy { crc: CrcPolicy::Required, ..ConnectOptions::default().policy },
        ..Default::default()
    };
    let p = pair(PollMode::Adaptive, &copts, &ConnectOptions::default());
    assert!(p.client.qp.conn_params().crc && p.server.qp.conn_params().crc);
    exercise(&p, &[100], "crc required by the initiator only");
}

/// `CompletionQueue::interrupt` ends the waits in progress (in the queue's own readiness
/// poll, parked, or driving an inline engine) without a completion, and a completion that
/// comes after is still there for the next wait.
#[test]
fn an_interrupt_ends_the_waits_in_progress_and_loses_no_completion() {
    for mode in [PollMode::Adaptive, PollMode::Event, PollMode::Inline] {
        let p = default_pair(mode);
        let waiter = {
            let cq = p.server.cq.clone();
            thread::spawn(move || cq.wait(Duration::from_secs(600)))
        };
        // A wait that starts after an interrupt is not affected: interrupt until it ends.
        while !waiter.is_finished() {
            p.server.cq.interrupt();
            thread::sleep(Duration::from_millis(1));
        }
        assert!(waiter.join().unwrap().is_none(), "{mode:?}: a completion out of nowhere");

        let inbox = p.server.pd.register(8, Access::LOCAL_WRITE).unwrap();
        p.server.recv(1, vec![inbox.sge(0, 8)]);
        let (mr, sgl) = source(&p.client.pd, b"12345678");
        p.client.send(2, send_op(false), sgl);
        p.client.expect_ok(2, WcOpcode::Send, "the send");
        p.server.cq.interrupt();
        // The interrupt came before this wait: it waits for (and gets) the receive.
        let wc = p.server.wait("the receive after an interrupt");
        assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::Recv), "{mode:?}");
        drop(mr);
    }
}

/// `QueuePair::interrupt_input` ends the waits for a peer's Writes in progress (in the
/// connection's readiness poll, parked, or driving an inline engine) with the input count
/// unchanged, and does not end a wait that starts after it: a Write that comes later still
/// ends that one.
#[test]
fn an_input_interrupt_ends_the_waits_in_progress_and_misses_no_write() {
    for mode in [PollMode::Adaptive, PollMode::Event, PollMode::Inline] {
        let p = default_pair(mode);
        let seen = p.server.qp.input_epoch();
        let waiter = {
            let qp = p.server.qp.clone();
            thread::spawn(move || qp.wait_input(seen, Duration::from_secs(600)))
        };
        while !waiter.is_finished() {
            p.server.qp.interrupt_input();
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(waiter.join().unwrap(), seen, "{mode:?}: input out of nowhere");

        let target = p.server.pd.register(8, Access::REMOTE_WRITE).unwrap();
        p.server.qp.interrupt_input();
        let (mr, sgl) = source(&p.client.pd, b"12345678");
        p.client.send(1, SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() }, sgl);
        p.client.expect_ok(1, WcOpcode::Write, "the Write");
        // The interrupt came before this wait: it waits for (and sees) the Write's input.
        let mut got = [0u8; 8];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut epoch = seen;
        while got != *b"12345678" {
            assert!(std::time::Instant::now() < deadline, "{mode:?}: the Write never showed");
            let next = p.server.qp.wait_input(epoch, Duration::from_secs(10));
            assert_ne!(next, epoch, "{mode:?}: the wait ended without input");
            epoch = next;
            target.read(0, &mut got).unwrap();
        }
        drop(mr);
    }
}

/// A timeout too long to be added to the clock (`Duration::MAX`, the usual "wait forever") is
/// taken as no deadline wherever the API takes one: connect, accept, and the waits for a
/// notification, a completion, an event and a listener's request (adding it to the current
/// time panicked). The waits here all end with something to see; the test itself is bounded.
#[test]
fn endless_timeouts_are_taken_as_no_deadline() {
    let (done, finished) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let forever = ConnectOptions { timeout: Duration::MAX, ..ConnectOptions::default() };
        for mode in [PollMode::Adaptive, PollMode::Event, PollMode::Inline] {
            let p = pair(mode, &forever, &forever);
            let inbox = p.server.pd.register(8, Access::LOCAL_WRITE).unwrap();
            p.server.recv(1, vec![inbox.sge(0, 8)]);
            p.server.cq.req_notify(false);
            let (mr, sgl) = source(&p.client.pd, b"12345678");
            p.client.send(2, send_op(false), sgl);
            assert!(p.server.cq.wait_notification(Duration::MAX), "{mode:?}");
            let wc = p.server.cq.wait(Duration::MAX).unwrap();
            assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::Recv), "{mode:?}");
            assert_eq!(p.client.cq.wait(Duration::MAX).unwrap().wr_id, 2, "{mode:?}");
            p.client.qp.disconnect();
            assert!(p.server.qp.wait_event(Duration::MAX).is_some(), "{mode:?}");
            drop(mr);
        }
        let (server, client) = (open(PollMode::Event), open(PollMode::Event));
        let listener = server.listen(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let connecting = thread::spawn(move || {
            let (pd, cq) = (client.alloc_pd(), client.create_cq(4));
            client.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).map(|c| c.qp.qp_num())
        });
        let (pd, cq) = (server.alloc_pd(), server.create_cq(4));
        let request = listener.accept(Duration::MAX).unwrap();
        request.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap();
        connecting.join().unwrap().unwrap();
        done.send(()).unwrap();
    });
    finished.recv_timeout(6 * T).expect("the waits did not end (or the test thread failed)");
}
