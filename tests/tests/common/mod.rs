//! Helpers the whole-stack tests share: devices, connected pairs over loopback TCP, waits
//! bounded by [`T`], and test data.
#![allow(dead_code, reason = "each test file uses part of the helpers")]

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use iwarp::{
    CmError, CompletionQueue, ConnectOptions, Device, DeviceConfig, PollMode, ProtectionDomain, QpState,
    QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

/// The longest any single wait in these tests may take.
pub(crate) const T: Duration = Duration::from_secs(10);
pub(crate) const MIB: usize = 1 << 20;

pub(crate) fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub(crate) fn open(mode: PollMode) -> Device {
    Device::open(DeviceConfig { poll_mode: mode, ..DeviceConfig::default() })
}

/// Bytes that differ per size and seed, so that misplaced data shows.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
}

/// One end of a connection: its protection domain, its (single) completion queue, its QP.
pub(crate) struct End {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
}

impl End {
    /// The next completion, within [`T`].
    pub(crate) fn wait(&self, what: &str) -> WorkCompletion {
        self.cq.wait(T).unwrap_or_else(|| panic!("{what}: no completion within {T:?}"))
    }

    /// The next completion, which must succeed with `wr_id`.
    pub(crate) fn expect_ok(&self, wr_id: u64, opcode: WcOpcode, what: &str) -> WorkCompletion {
        let wc = self.wait(what);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (wr_id, WcStatus::Success, opcode), "{what}: {wc:?}");
        assert_eq!(wc.qp_num, self.qp.qp_num(), "{what}");
        wc
    }

    pub(crate) fn recv(&self, wr_id: u64, sgl: Vec<Sge>) {
        self.qp.post_recv(RecvWr { wr_id, sgl: sgl.into() }).unwrap();
    }

    pub(crate) fn send(&self, wr_id: u64, op: SendOp, sgl: Vec<Sge>) {
        self.qp.post_send(SendWr { wr_id, op, sgl: sgl.into(), signaled: true }).unwrap();
    }
}

pub(crate) fn send_op(solicited: bool) -> SendOp {
    SendOp::Send { solicited, invalidate: None }
}

/// A connected pair, and the devices it runs on (dropped last).
pub(crate) struct Pair {
    pub(crate) client: End,
    pub(crate) server: End,
    /// The private data the server saw in the Request.
    pub(crate) request_pd: Vec<u8>,
    /// The private data the client saw in the Reply.
    pub(crate) reply_pd: Vec<u8>,
    pub(crate) _devs: Vec<Device>,
}

/// Connects a client on `cdev` to a server on `sdev` (one thread accepts).
pub(crate) fn connect_on(
    cdev: &Device,
    sdev: &Device,
    copts: &ConnectOptions,
    sopts: &ConnectOptions,
) -> (End, End, Vec<u8>, Vec<u8>) {
    let listener = sdev.listen(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(1024));
    let server = {
        let (spd, scq, sopts) = (spd.clone(), scq.clone(), sopts.clone());
        thread::spawn(move || {
            let req = listener.accept(T)?;
            assert_eq!(req.peer_addr().ip(), addr.ip());
            let seen = req.private_data().to_vec();
            let qp = req.accept(&spd, &scq, &scq, &sopts)?;
            Ok::<_, CmError>((qp, seen))
        })
    };
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(1024));
    let connected = cdev.connect(addr, &cpd, &ccq, &ccq, copts);
    let (sqp, request_pd) = server.join().unwrap().expect("server accept");
    let connected = connected.expect("client connect");
    let client = End { pd: cpd, cq: ccq, qp: connected.qp };
    let server = End { pd: spd, cq: scq, qp: sqp };
    (client, server, request_pd, connected.private_data)
}

/// A pair on fresh devices in `mode`: two devices, except in inline mode, where one device
/// (driven by whichever thread waits on a completion queue) runs both ends, and in busy mode,
/// where one spinning engine thread serves both ends (two would leave the test nothing of a
/// 2-core machine).
pub(crate) fn pair(mode: PollMode, copts: &ConnectOptions, sopts: &ConnectOptions) -> Pair {
    let one = matches!(mode, PollMode::Inline | PollMode::Busy);
    let devs = if one { vec![open(mode)] } else { vec![open(mode), open(mode)] };
    let (client, server, request_pd, reply_pd) = connect_on(&devs[0], devs.last().unwrap(), copts, sopts);
    Pair { client, server, request_pd, reply_pd, _devs: devs }
}

pub(crate) fn default_pair(mode: PollMode) -> Pair {
    pair(mode, &ConnectOptions::default(), &ConnectOptions::default())
}

/// Collects completions from `cq` until `n` have come (each within [`T`]), then checks that no
/// more come for a while (each work request completes exactly once).
pub(crate) fn collect(cq: &CompletionQueue, n: usize, what: &str) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        match cq.wait(T) {
            Some(wc) => out.push(wc),
            None => panic!("{what}: {} of {n} completions, then nothing: {out:?}", out.len()),
        }
    }
    if let Some(extra) = cq.wait(Duration::from_millis(200)) {
        panic!("{what}: an extra completion {extra:?} after {out:?}");
    }
    out
}

pub(crate) fn wait_state(qp: &QueuePair, state: QpState, what: &str) {
    let deadline = Instant::now() + T;
    while qp.state() != state {
        assert!(Instant::now() < deadline, "{what}: still {:?}", qp.state());
        let _ = qp.poll_event(); // drives an inline device; the event is read later
        thread::sleep(Duration::from_millis(1));
    }
}
