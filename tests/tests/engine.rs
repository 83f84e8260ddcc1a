//! The engine as two hosts would run it: separate devices (separate engines) talking over
//! loopback TCP. These tests count what the engine did (wake-ups, passes, connection visits),
//! never time: a sleeping engine must be woken by the network and by doorbells, not by a
//! timer, and a pass must cost what is ready, not what is connected.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, QueuePair, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

/// The longest any single wait may take.
const T: Duration = Duration::from_secs(10);

fn open(mode: PollMode) -> Device {
    Device::open(DeviceConfig { poll_mode: mode, ..DeviceConfig::default() })
}

/// One end: its completion queue, queue pair and a region for messages.
struct End {
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

impl End {
    fn wait(&self, what: &str) -> WorkCompletion {
        let wc = self.cq.wait(T).unwrap_or_else(|| panic!("{what}: no completion within {T:?}"));
        assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
        wc
    }

    fn post_recv(&self, wr_id: u64) {
        self.qp.post_recv(RecvWr { wr_id, sgl: self.mr.sge(0, 64).into() }).unwrap();
    }

    fn send(&self, wr_id: u64, len: u32) {
        let op = SendOp::Send { solicited: false, invalidate: None };
        self.qp.post_send(SendWr { wr_id, op, sgl: self.mr.sge(0, len).into(), signaled: true }).unwrap();
    }

    /// Waits for the receive `wr_id`, reaping send completions on the way.
    fn wait_recv(&self, wr_id: u64, what: &str) {
        loop {
            let wc = self.wait(what);
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.wr_id, wr_id, "{what}");
                return;
            }
        }
    }
}

/// `n` connections from a client device to a server device (each end with its own CQ and a
/// region), in order.
fn connect_many(client: &Device, server: &Device, n: usize, recv: usize) -> Vec<(End, End)> {
    let listener = server.listen("127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, cpd) = (server.alloc_pd(), client.alloc_pd());
    let opts =
        ConnectOptions { max_recv_wr: recv.max(1), max_send_wr: recv.max(1), ..ConnectOptions::default() };
    let accepting = {
        let (spd, opts) = (spd.clone(), opts.clone());
        let cqs: Vec<CompletionQueue> = (0..n).map(|_| server.create_cq(64)).collect();
        thread::spawn(move || {
            cqs.into_iter()
                .map(|cq| {
                    let qp = listener.accept(T).unwrap().accept(&spd, &cq, &cq, &opts).unwrap();
                    (cq, qp)
                })
                .collect::<Vec<_>>()
        })
    };
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let cq = client.create_cq(64);
        let qp = client.connect(addr, &cpd, &cq, &cq, &opts).unwrap().qp;
        clients.push((cq, qp));
    }
    let servers = accepting.join().unwrap();
    let rights = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    clients
        .into_iter()
        .zip(servers)
        .map(|((ccq, cqp), (scq, sqp))| {
            let c = End { cq: ccq, qp: cqp, mr: cpd.register(64, rights).unwrap() };
            let s = End { cq: scq, qp: sqp, mr: spd.register(64, rights).unwrap() };
            (c, s)
        })
        .collect()
}

/// Sparse Send/Send round trips between two sleeping engines: every message must wake the
/// thread waiting for it (or the receiving engine) through the link's readiness, and every
/// post must go out without waiting for the sending engine. A timer wake-up would mean some
/// step waited for a sleep timeout instead.
fn sparse_round_trips(mode: PollMode) {
    const PINGS: u64 = 20;
    let (client_dev, server_dev) = (open(mode), open(mode));
    let pairs = connect_many(&client_dev, &server_dev, 1, 4);
    let (client, server) = &pairs[0];
    // Let both engines fall asleep before the first ping.
    thread::sleep(Duration::from_millis(20));
    let before = (client_dev.stats(), server_dev.stats());
    for i in 0..PINGS {
        server.post_recv(100 + i);
        client.post_recv(200 + i);
        client.send(i, 8);
        server.wait_recv(100 + i, "ping");
        server.send(1000 + i, 8);
        client.wait_recv(200 + i, "pong");
        // Sparse: both engines go back to sleep between round trips.
        thread::sleep(Duration::from_millis(3));
    }
    let after = (client_dev.stats(), server_dev.stats());
    for (name, b, a) in [("client", before.0, after.0), ("server", before.1, after.1)] {
        assert_eq!(a.timer_wakeups, b.timer_wakeups, "{mode:?} {name}: woken by a timer: {b:?} -> {a:?}");
        // The engine slept through the exchange: each message's input woke a sleeping
        // thread (the application thread waiting for it, or the engine), and each post went
        // out from the posting thread at once.
        assert!(
            a.app_polls + a.event_wakeups - b.app_polls - b.event_wakeups >= PINGS,
            "{mode:?} {name}: input did not wake a sleeper: {b:?} -> {a:?}"
        );
        assert!(
            a.direct_passes - b.direct_passes >= PINGS,
            "{mode:?} {name}: posts waited for the engine: {b:?} -> {a:?}"
        );
    }
}

#[test]
fn event_mode_engines_wake_on_the_network_and_the_doorbell() {
    sparse_round_trips(PollMode::Event);
}

#[test]
fn adaptive_engines_wake_on_the_network_and_the_doorbell() {
    sparse_round_trips(PollMode::Adaptive);
}

/// With many idle connections, traffic on one costs visits of that one only.
#[test]
fn idle_connections_are_not_visited() {
    const IDLE: usize = 64;
    const PINGS: u64 = 50;
    let (client_dev, server_dev) = (open(PollMode::Event), open(PollMode::Event));
    let pairs = connect_many(&client_dev, &server_dev, IDLE + 1, 4);
    let (client, server) = &pairs[IDLE];
    thread::sleep(Duration::from_millis(20));
    let before = server_dev.stats();
    for i in 0..PINGS {
        server.post_recv(i);
        client.send(i, 8);
        server.wait_recv(i, "ping");
        client.wait("send completion");
    }
    let after = server_dev.stats();
    let (passes, visits) = (after.passes - before.passes, after.visits - before.visits);
    // Each pass visits the one busy connection at most (a visit of all 65 would be 65 each).
    assert!(visits <= passes, "{visits} visits in {passes} passes with {IDLE} idle connections");
    assert!(visits >= PINGS, "{visits} visits for {PINGS} messages");
}

/// Data moves on every one of many connections whose engines sleep between messages.
#[test]
fn messages_on_every_connection_of_many() {
    const N: usize = 200;
    let (client_dev, server_dev) = (open(PollMode::Adaptive), open(PollMode::Adaptive));
    let pairs = connect_many(&client_dev, &server_dev, N, 2);
    assert_eq!((client_dev.connections(), server_dev.connections()), (N, N));
    for (i, (client, server)) in pairs.iter().enumerate() {
        server.post_recv(i as u64);
        client.mr.write(0, &(i as u64).to_le_bytes()).unwrap();
        client.send(i as u64, 8);
    }
    for (i, (client, server)) in pairs.iter().enumerate() {
        server.wait_recv(i as u64, "message");
        client.wait("send completion");
        let mut got = [0u8; 8];
        server.mr.read(0, &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i as u64, "connection {i}");
    }
}
