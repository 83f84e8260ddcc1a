//! Connection management under pressure: silent clients, many pending handshakes, connection
//! caps on the listener and the device, handles dropped, Replies the initiator cannot take,
//! a peer that stops reading, a peer that leaves our first FPDU unread. Over loopback TCP;
//! every wait bounded. Assertions count what happened (pending handshakes, connections,
//! bytes on the wire), never time.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use iwarp::ddp::{STag, TerminateLayer};
use iwarp::mpa::{Deframed, Deframer, FrameRepr, Framer, Policy, RtrTypes};
use iwarp::rdmap::wire::{Control, Opcode, TerminateHeader};
use iwarp::{
    Access, CmError, CompletionQueue, ConnectOptions, Device, DeviceConfig, ListenOptions, QpEvent, QpState,
    RecvWr, SendOp, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(10);

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A client that connects with `private_data` and stays connected until dropped.
fn client(dev: &Device, addr: SocketAddr, private_data: &[u8]) -> Result<iwarp::QueuePair, CmError> {
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let opts =
        ConnectOptions { private_data: private_data.to_vec(), timeout: T, ..ConnectOptions::default() };
    dev.connect(addr, &pd, &cq, &cq, &opts).map(|c| c.qp)
}

/// Three clients that connect over TCP and never send their MPA Request do not delay a real
/// one: the listener hands it out while the three are still pending.
#[test]
fn silent_clients_do_not_delay_a_real_one() {
    let dev = Device::open(DeviceConfig::default());
    let listener = dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let client_dev = Device::open(DeviceConfig::default());
    let real = thread::spawn(move || {
        let qp = client(&client_dev, addr, b"real");
        (qp, client_dev)
    });
    let req = listener.accept(T).expect("the real client's request");
    assert_eq!(req.private_data(), b"real");
    // The silent ones are still waiting for their Request: the real one did not wait for them.
    assert_eq!(listener.pending(), 3);
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let _server = req.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap();
    let (qp, _client_dev) = real.join().unwrap();
    assert_eq!(qp.unwrap().state(), QpState::Rts);
    drop(silent);
}

/// At most `max_pending` handshakes are in progress; the others wait in the TCP backlog, and
/// a real client behind a crowd of silent ones is served once their time is up.
#[test]
fn pending_handshakes_are_bounded_and_expire() {
    let dev = Device::open(DeviceConfig::default());
    let opts = ListenOptions {
        max_pending: 2,
        request_timeout: Duration::from_millis(200),
        ..ListenOptions::default()
    };
    let listener = dev.listen_with(localhost(), &opts).unwrap();
    let addr = listener.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
    assert!(matches!(listener.accept(Duration::from_millis(50)), Err(CmError::Timeout)));
    assert_eq!(listener.pending(), 2);
    let client_dev = Device::open(DeviceConfig::default());
    let real = thread::spawn(move || {
        let qp = client(&client_dev, addr, b"patient");
        (qp, client_dev)
    });
    let req = listener.accept(T).expect("the real client, once the silent ones expired");
    assert_eq!(req.private_data(), b"patient");
    assert!(listener.pending() <= 2);
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let _server = req.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap();
    let (qp, _client_dev) = real.join().unwrap();
    qp.unwrap();
    // The silent ones ahead of it were closed when their time ran out (the fifth shared the
    // last round with the real client and may still be pending).
    for (i, mut s) in silent.into_iter().take(4).enumerate() {
        s.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("silent client {i}: {other:?} (its connection should be closed)"),
        }
    }
}

/// A listener at its connection limit rejects the extra client on the wire and keeps serving;
/// once a connection ends, the next client gets in.
#[test]
fn listener_connection_cap_rejects_the_extra_client() {
    let dev = Device::open(DeviceConfig::default());
    let opts = ListenOptions { max_connections: 1, ..ListenOptions::default() };
    let listener = dev.listen_with(localhost(), &opts).unwrap();
    let addr = listener.local_addr().unwrap();
    let client_dev = Device::open(DeviceConfig::default());
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let serve = |listener: &iwarp::Listener| {
        listener.accept(T).unwrap().accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap()
    };
    let first = thread::scope(|s| {
        let c = s.spawn(|| client(&client_dev, addr, b"1").unwrap());
        let server = serve(&listener);
        (c.join().unwrap(), server)
    });
    assert_eq!(listener.connections(), 1);
    thread::scope(|s| {
        let c = s.spawn(|| client(&client_dev, addr, b"2"));
        // The listener refuses the second client by itself; accept sees nothing.
        assert!(matches!(listener.accept(Duration::from_millis(300)), Err(CmError::Timeout)));
        match c.join().unwrap() {
            Err(CmError::Rejected { .. }) => {}
            other => panic!("expected a reject, got {other:?}"),
        }
    });
    // The first connection ends on both sides; its slot frees.
    drop(first);
    let deadline = Instant::now() + T;
    while listener.connections() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(listener.connections(), 0);
    thread::scope(|s| {
        let c = s.spawn(|| client(&client_dev, addr, b"3").unwrap());
        let _server = serve(&listener);
        c.join().unwrap();
    });
}

/// A device at its connection limit refuses to connect, naming the limit.
#[test]
fn device_connection_cap() {
    let server_dev = Device::open(DeviceConfig::default());
    let listener = server_dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let client_dev = Device::open(DeviceConfig { max_connections: 1, ..DeviceConfig::default() });
    let (pd, cq) = (server_dev.alloc_pd(), server_dev.create_cq(16));
    thread::scope(|s| {
        let server = s
            .spawn(|| listener.accept(T).unwrap().accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap());
        let first = client(&client_dev, addr, b"").unwrap();
        let _server_qp = server.join().unwrap();
        match client(&client_dev, addr, b"") {
            Err(e @ CmError::TooManyConnections { limit: 1 }) => {
                assert!(e.to_string().contains("limit of 1 connection"), "{e}")
            }
            other => panic!("expected TooManyConnections, got {other:?}"),
        }
        drop(first);
    });
}

/// Dropping the last handle of a queue pair disconnects it: the peer sees the connection go.
#[test]
fn dropping_the_last_handle_disconnects() {
    let server_dev = Device::open(DeviceConfig::default());
    let listener = server_dev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let client_dev = Device::open(DeviceConfig::default());
    let (pd, cq) = (server_dev.alloc_pd(), server_dev.create_cq(16));
    let (qp, server_qp) = thread::scope(|s| {
        let server = s
            .spawn(|| listener.accept(T).unwrap().accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap());
        let qp = client(&client_dev, addr, b"").unwrap();
        (qp, server.join().unwrap())
    });
    let clone = qp.clone();
    drop(qp);
    // A clone keeps it connected.
    thread::sleep(Duration::from_millis(50));
    assert_eq!(server_qp.state(), QpState::Rts);
    assert_eq!(client_dev.connections(), 1);
    drop(clone);
    let event = server_qp.wait_event(T).expect("the server hears the disconnect");
    assert_eq!(event, QpEvent::LlpLost);
    let deadline = Instant::now() + T;
    while client_dev.connections() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(client_dev.connections(), 0);
}

/// A responder (played here) whose Reply the initiator cannot take after the fact (it asked
/// for peer-to-peer with a Write RTR and the Reply chose a Read RTR) gets an LLP Terminate
/// before the close, as RFC 6581 asks and siw does.
#[test]
fn initiator_terminates_a_reply_it_cannot_take() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let mut s = raw_responder(&listener, Policy::default(), |reply| {
            // The IRD/ORD word's ORD half: the Write RTR bit off, the Read RTR bit on.
            reply[22] = (reply[22] & !0x80) | 0x40;
        });
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let dev = Device::open(DeviceConfig::default());
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let write_only = RtrTypes { write: true, ..RtrTypes::NONE };
    let opts = ConnectOptions {
        policy: Policy { peer_to_peer: true, rtr: write_only, ..Policy::default() },
        timeout: T,
        ..ConnectOptions::default()
    };
    let err = dev.connect(addr, &pd, &cq, &cq, &opts).unwrap_err();
    assert!(matches!(err, CmError::Negotiation(_)), "{err:?}");
    let rest = peer.join().unwrap();
    let mut deframer = Deframer::new(false, false);
    let Ok(Deframed::Fpdu(f)) = deframer.deframe(&rest) else {
        panic!("no FPDU after the Reply: {rest:02x?}")
    };
    // An untagged segment on the Terminate queue carrying RDMAP's Terminate, layer LLP,
    // "no matching RTR" (0x07).
    let ulpdu = f.ulpdu;
    assert_eq!(ulpdu[0] & 0x80, 0, "tagged: {ulpdu:02x?}");
    assert_eq!(Control::from_byte(ulpdu[1]).opcode, Opcode::Terminate);
    let header = TerminateHeader::parse(&ulpdu[18..]).unwrap();
    assert_eq!(header.cause.layer, TerminateLayer::Llp, "{header:?}");
    assert_eq!(header.cause.code, 0x07, "{header:?}");
}

/// The same for IRD/ORD: a Reply whose ORD exceeds the IRD the initiator offered (the
/// responder would have more Reads outstanding than the initiator can answer) gets an LLP
/// Terminate, "insufficient IRD" (0x06), before the close.
#[test]
fn initiator_terminates_a_reply_with_too_high_an_ord() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let mut s = raw_responder(&listener, Policy::default(), |reply| {
            // The ORD half of the IRD/ORD word: the RTR bits kept, ORD 0x3fff.
            reply[22] = (reply[22] & 0xc0) | 0x3f;
            reply[23] = 0xff;
        });
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let dev = Device::open(DeviceConfig::default());
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16));
    let opts = ConnectOptions { timeout: T, ..ConnectOptions::default() };
    let err = dev.connect(addr, &pd, &cq, &cq, &opts).unwrap_err();
    assert!(matches!(err, CmError::Negotiation(_)), "{err:?}");
    let rest = peer.join().unwrap();
    let mut deframer = Deframer::new(false, false);
    let Ok(Deframed::Fpdu(f)) = deframer.deframe(&rest) else {
        panic!("no FPDU after the Reply: {rest:02x?}")
    };
    let ulpdu = f.ulpdu;
    assert_eq!(Control::from_byte(ulpdu[1]).opcode, Opcode::Terminate);
    let header = TerminateHeader::parse(&ulpdu[18..]).unwrap();
    assert_eq!((header.cause.layer, header.cause.code), (TerminateLayer::Llp, 0x06), "{header:?}");
}

/// Plays an MPA responder on a raw socket: reads the Request, answers with the Reply
/// `policy` makes, and hands back the socket.
fn raw_responder(listener: &TcpListener, policy: Policy, mangle: impl FnOnce(&mut Vec<u8>)) -> TcpStream {
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut req = vec![0u8; 20];
    s.read_exact(&mut req).unwrap();
    let pd_len = usize::from(u16::from_be_bytes([req[18], req[19]]));
    req.resize(20 + pd_len, 0);
    s.read_exact(&mut req[20..]).unwrap();
    let request = FrameRepr::parse(&req).unwrap();
    let mut reply = match policy.respond(&request, b"") {
        Ok((reply, _)) => reply.to_vec().unwrap(),
        Err(refusal) => refusal.reply.unwrap().to_vec().unwrap(),
    };
    mangle(&mut reply);
    s.write_all(&reply).unwrap();
    s
}

/// A queue pair that is finished but whose peer stopped reading (its last bytes can never
/// leave) is dropped after the device's linger time.
#[test]
fn a_finished_connection_whose_peer_stops_reading_is_dropped() {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // The peer answers the handshake, then never reads and never closes until the end.
    let peer = thread::spawn(move || {
        let s = raw_responder(&listener, Policy::default(), |_| {});
        let _ = done_rx.recv_timeout(T);
        drop(s);
    });
    let dev = Device::open(DeviceConfig { linger: Duration::from_millis(200), ..DeviceConfig::default() });
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(64));
    let qp = dev
        .connect(addr, &pd, &cq, &cq, &ConnectOptions { timeout: T, ..ConnectOptions::default() })
        .unwrap()
        .qp;
    // More than the two socket buffers hold: the stream backs up.
    const BIG: u32 = 32 << 20;
    let src = pd.register(BIG as usize, Access::NONE).unwrap();
    let op = SendOp::Write { remote_stag: STag(0x100), remote_to: 0 };
    qp.post_send(SendWr { wr_id: 1, op, sgl: src.sge(0, BIG).into(), signaled: true }).unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(dev.connections(), 1);
    qp.disconnect();
    // The Write is flushed at once; the bytes already framed can never leave.
    let wc = cq.wait(T).expect("the flushed Write");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushError));
    let deadline = Instant::now() + T;
    while dev.connections() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(dev.connections(), 0, "the connection outlived its linger");
    done_tx.send(()).unwrap();
    peer.join().unwrap();
}

/// What the raw peer of [`initiator_nudges`] says, and when.
#[derive(Clone, Copy, PartialEq)]
enum PeerSays {
    /// Nothing.
    Nothing,
    /// A Send right after its Reply; the client takes it before it posts its own Send.
    First,
    /// A Send as soon as the client's Send has arrived (the client has not read it yet).
    AtOnce,
}

/// The FPDUs in `bytes` (CRC and markers off), whole.
fn fpdus_in(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut deframer = Deframer::new(false, false);
    let mut rest = bytes;
    let mut fpdus = Vec::new();
    while let Ok(Deframed::Fpdu(f)) = deframer.deframe(rest) {
        fpdus.push(f.ulpdu.to_vec());
        rest = &rest[f.wire_len..];
    }
    assert!(rest.is_empty(), "a partial FPDU: {rest:02x?}");
    fpdus
}

/// Whether `ulpdu` is a nudge: tagged, last, RDMA Write, STag 1, no payload.
fn is_nudge(ulpdu: &[u8]) -> bool {
    ulpdu.len() == 14
        && ulpdu[0] & 0xc0 == 0xc0
        && Control::from_byte(ulpdu[1]).opcode == Opcode::Write
        && u32::from_be_bytes(ulpdu[2..6].try_into().unwrap()) == 1
}

/// An initiator's nudges (zero-length RDMA Writes; a peer like siw 6.1 may leave its first
/// FPDUs unread in its socket) against a raw peer that reads everything and says `says`.
/// `complete` waits for the client's Send to complete. Returns the client's FPDUs after its
/// Send, split at the moment the peer spoke (all in the second part when it said nothing).
fn initiator_nudges(
    says: PeerSays,
    complete: impl FnOnce(&Device, &CompletionQueue),
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let mut s = raw_responder(&listener, Policy::default(), |_| {});
        // Untagged, last, Send; QN 0, MSN 1, MO 0; two bytes of payload.
        let mut ulpdu = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        ulpdu.extend_from_slice(b"hi");
        let send = Framer::new(false, false).frame_to_vec(&ulpdu).unwrap();
        let mut before = Vec::new();
        match says {
            PeerSays::Nothing => {}
            PeerSays::First => s.write_all(&send).unwrap(),
            PeerSays::AtOnce => {
                // The client's Send: 20 bytes of MPA header, DDP/RDMAP header and padding, 5
                // of payload, 4 of CRC (deframed below).
                let mut fpdu = vec![0u8; 2 + 18 + 5 + 3 + 4];
                s.read_exact(&mut fpdu).unwrap();
                before = fpdu;
                s.write_all(&send).unwrap();
            }
        }
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut after = Vec::new();
        let mut buf = [0u8; 4096];
        // Everything the client sends within the read timeout of silence.
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            after.extend_from_slice(&buf[..n]);
        }
        (before, after)
    });
    let dev = Device::open(DeviceConfig::default());
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(64));
    let inbox = pd.register(64, Access::LOCAL_WRITE).unwrap();
    // Posted with the connection: the peer's Send may arrive before `connect` returns.
    let recv = vec![RecvWr { wr_id: 9, sgl: inbox.sge(0, 64).into() }];
    let qp = dev
        .connect(addr, &pd, &cq, &cq, &ConnectOptions { timeout: T, recv, ..ConnectOptions::default() })
        .unwrap()
        .qp;
    if says == PeerSays::First {
        let wc = cq.wait(T).unwrap();
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (9, WcStatus::Success, 2));
    }
    let src = pd.register_bytes(b"first", Access::NONE).unwrap();
    let op = SendOp::Send { solicited: false, invalidate: None };
    qp.post_send(SendWr { wr_id: 1, op, sgl: src.sge(0, 5).into(), signaled: true }).unwrap();
    complete(&dev, &cq);
    let (before, after) = peer.join().unwrap();
    let (mut before, mut after) = (fpdus_in(&before), fpdus_in(&after));
    let send = if before.is_empty() { after.remove(0) } else { before.remove(0) };
    assert_eq!(Control::from_byte(send[1]).opcode, Opcode::Send);
    for f in before.iter().chain(&after) {
        assert!(is_nudge(f), "not a nudge: {f:02x?}");
    }
    (before, after)
}

/// An initiator that has sent its first FPDU and heard nothing back nudges the peer, at
/// most three times.
fn initiator_nudges_a_silent_peer(complete: impl FnOnce(&Device, &CompletionQueue)) {
    let (_, nudges) = initiator_nudges(PeerSays::Nothing, complete);
    assert!((1..=3).contains(&nudges.len()), "{} nudges", nudges.len());
}

fn send_completes(_: &Device, cq: &CompletionQueue) {
    assert_eq!(cq.wait(T).unwrap().status, WcStatus::Success);
}

/// A peer that speaks after the client's first FPDUs arrived, without reading them (siw's
/// rsockets server sends its credit update right after it accepts, and siw may have left the
/// client's first FPDUs unread: a hang of rstream against siw) gets a nudge once it has
/// spoken: its bytes show that it handles its socket now, not that it read ours.
#[test]
fn an_initiator_nudges_a_peer_that_spoke_before_reading() {
    let (early, late) = initiator_nudges(PeerSays::AtOnce, send_completes);
    assert!(!late.is_empty(), "no nudge after the peer spoke ({} before)", early.len());
    assert!(early.len() + late.len() <= 4, "{} + {} nudges", early.len(), late.len());
}

/// A client that heard its peer before it sent anything does not nudge it.
#[test]
fn an_initiator_that_heard_its_peer_first_does_not_nudge() {
    let (early, late) = initiator_nudges(PeerSays::First, send_completes);
    assert_eq!((early.len(), late.len()), (0, 0), "nudges");
}

#[test]
fn an_initiator_nudges_a_silent_peer() {
    initiator_nudges_a_silent_peer(send_completes);
}

/// The same with no application thread in the engine: nobody polls or waits on the queue
/// while the peer is silent (as with a verbs program blocked in `ibv_get_cq_event`), so the
/// engine thread's own timers send the nudges.
#[test]
fn an_initiator_nudges_a_silent_peer_with_nobody_polling() {
    initiator_nudges_a_silent_peer(|_, cq| {
        thread::sleep(Duration::from_millis(1500));
        assert_eq!(cq.poll().unwrap().status, WcStatus::Success);
    });
}

/// The same when, right after the post, an application thread runs engine passes itself for
/// a moment (as the verbs drop-in's `ibv_poll_cq` does on an empty queue) and then stops: its
/// zero-timeout waits in the engine's poll may take the doorbell that was to make the parked
/// engine thread see the nudge timer; the engine must still wake for it.
#[test]
fn an_initiator_nudges_a_silent_peer_after_a_polling_thread_ran_passes() {
    initiator_nudges_a_silent_peer(|dev, cq| {
        let until = Instant::now() + Duration::from_millis(5);
        while Instant::now() < until {
            dev.try_progress();
        }
        thread::sleep(Duration::from_millis(1500));
        assert_eq!(cq.poll().unwrap().status, WcStatus::Success);
    });
}
