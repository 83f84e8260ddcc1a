//! Random fault schedules through real devices: two inline devices (the test thread drives
//! both engines) connected over an in-memory link, mixed traffic (RDMA Writes, Reads, Sends
//! both ways), and faults at random points: the link cut, stalled (and maybe resumed), one
//! direction closed, bytes corrupted, pieces of the stream reordered, with CRC on or off.
//! Whatever happens, every posted work request completes exactly once (successfully or with
//! an error) and nothing panics. A second kind of schedule has no teardown: regions are
//! deregistered under the traffic and the link is cut or half closed, and every work request
//! must complete on its own. `IWARP_FAULT_SCHEDULES` sets the number of schedules of each
//! kind (default 10000 in an optimized build, as scripts/test.sh runs it, and 1000 in a debug
//! build); a failure names its seed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "sizes are small")]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::netdev::{MemFaults, MemLink};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WorkCompletion,
};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const REGION: usize = 64 << 10;
/// Engine passes per schedule before the connections are torn down.
const PASSES: usize = 400;

/// One side: its device, completion queue, queue pair and regions.
struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    src: MemoryRegion,
    dst: MemoryRegion,
    inbox: MemoryRegion,
}

/// The rights every region of a side has.
const RIGHTS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);

fn inline() -> Device {
    Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() })
}

/// Two inline devices connected over an in-memory link of `capacity` bytes per direction,
/// in peer-to-peer mode (the client sends its RTR at once, so either side may send first) or
/// not (the server sends nothing before the client's first FPDU, RFC 5044 section 7.1.1).
fn connect(capacity: usize, crc: bool, peer_to_peer: bool) -> (Side, Side, MemFaults) {
    let (a, b) = MemLink::pair(capacity);
    let faults = a.faults();
    let policy = Policy {
        crc: if crc { CrcPolicy::Wanted } else { CrcPolicy::Off },
        ird: 8,
        ord: 8,
        peer_to_peer,
        ..Policy::default()
    };
    let opts = ConnectOptions { policy, timeout: Duration::from_secs(10), ..ConnectOptions::default() };
    let (cdev, sdev) = (inline(), inline());
    let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
    let (ccq, scq) = (cdev.create_cq(256), sdev.create_cq(256));
    let (server_qp, client) = std::thread::scope(|s| {
        let server = s.spawn(|| sdev.accept_link(Box::new(b), &spd, &scq, &scq, &opts).unwrap());
        let client = cdev.connect_link(Box::new(a), &cpd, &ccq, &ccq, &opts).unwrap();
        (server.join().unwrap(), client)
    });
    let side = |dev: Device, pd: ProtectionDomain, cq: CompletionQueue, qp: QueuePair| Side {
        src: pd.register(REGION, RIGHTS).unwrap(),
        dst: pd.register(REGION, RIGHTS).unwrap(),
        inbox: pd.register(REGION, RIGHTS).unwrap(),
        dev,
        pd,
        cq,
        qp,
    };
    let c = side(cdev, cpd, ccq, client.qp);
    let s = side(sdev, spd, scq, server_qp);
    (c, s, faults)
}

/// What a schedule expects: each posted work request's id, and whether it is a receive.
#[derive(Default)]
struct Ledger {
    posted: HashMap<(u8, u64), WcOpcode>,
    completed: HashMap<(u8, u64), WorkCompletion>,
}

impl Ledger {
    fn post(&mut self, side: u8, wr_id: u64, opcode: WcOpcode) {
        assert!(self.posted.insert((side, wr_id), opcode).is_none());
    }

    /// The work requests posted and not completed.
    fn missing(&self) -> Vec<&(u8, u64)> {
        self.posted.keys().filter(|k| !self.completed.contains_key(k)).collect()
    }

    fn complete(&mut self, side: u8, wc: WorkCompletion, seed: u64) {
        let key = (side, wc.wr_id);
        assert!(self.posted.contains_key(&key), "seed {seed}: completion of a request never posted: {wc:?}");
        if let Some(first) = self.completed.insert(key, wc) {
            panic!("seed {seed}: work request completed twice: {first:?} then {wc:?}");
        }
    }
}

/// Posts a random mix of work on both sides; returns how many went in.
fn post_traffic(rng: &mut Rng, c: &Side, s: &Side, ledger: &mut Ledger, next: &mut u64) {
    let n = 1 + rng.below(12);
    for _ in 0..n {
        *next += 1;
        let id = *next;
        let (from, to, side) = if rng.below(4) == 0 { (s, c, 1u8) } else { (c, s, 0u8) };
        let big = rng.below(3) == 0;
        let len = 1 + rng.below(if big { REGION as u64 } else { 2048 }) as u32;
        let op = match rng.below(3) {
            0 => SendOp::Write { remote_stag: to.dst.rkey(), remote_to: to.dst.addr() },
            1 => SendOp::Read { remote_stag: to.src.rkey(), remote_to: to.src.addr() },
            _ => {
                // The peer's receive first (it may be refused when its queue is full).
                let wr = RecvWr { wr_id: id, sgl: to.inbox.sge(0, len).into() };
                if to.qp.post_recv(wr).is_ok() {
                    ledger.post(1 - side, id, WcOpcode::Recv);
                }
                SendOp::Send { solicited: false, invalidate: None }
            }
        };
        let sge = if matches!(op, SendOp::Read { .. }) { from.dst.sge(0, len) } else { from.src.sge(0, len) };
        let wr = SendWr { wr_id: id, op, sgl: sge.into(), signaled: true };
        if from.qp.post_send(wr).is_ok() {
            ledger.post(side, id, op.wc_opcode());
        }
    }
}

/// One fault at a random point of the queued stream.
fn fault(rng: &mut Rng, faults: &MemFaults) {
    let from = rng.below(2) as usize;
    let queued = faults.queued(from);
    match rng.below(6) {
        0 => faults.cut(),
        1 => faults.stall(true),
        2 => faults.stall(false),
        3 => faults.close_write(from),
        4 => {
            if queued > 0 {
                faults.corrupt(from, rng.below(queued as u64) as usize, 1 << rng.below(8));
            }
        }
        _ => {
            if queued > 2 {
                let len = 1 + rng.below(queued as u64 / 2) as usize;
                let offset = rng.below((queued - 2 * len + 1) as u64) as usize;
                faults.reorder(from, offset, len);
            }
        }
    }
}

fn reap(side: &Side, id: u8, ledger: &mut Ledger, seed: u64) {
    while let Some(wc) = side.cq.poll() {
        ledger.complete(id, wc, seed);
    }
}

/// One pass of both engines, then what completed on each side.
fn step(c: &Side, s: &Side, ledger: &mut Ledger, seed: u64) {
    c.dev.progress();
    s.dev.progress();
    reap(c, 0, ledger, seed);
    reap(s, 1, ledger, seed);
}

fn schedule(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let capacity = 1024 + rng.below(256 << 10) as usize;
    let crc = rng.below(2) == 0;
    let (c, s, faults) = connect(capacity, crc, false);
    let mut ledger = Ledger::default();
    let mut next = 0u64;
    // Faults at random passes; traffic at the start and once more at a random pass.
    let fault_at: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(PASSES as u64 / 4) as usize).collect();
    let more_at = rng.below(PASSES as u64 / 4) as usize;
    let last_event = fault_at.iter().copied().chain([more_at]).max().unwrap_or(0);
    for pass in 0..PASSES {
        if pass == 0 || pass == more_at {
            post_traffic(&mut rng, &c, &s, &mut ledger, &mut next);
        }
        for _ in fault_at.iter().filter(|&&p| p == pass) {
            fault(&mut rng, &faults);
        }
        step(&c, &s, &mut ledger, seed);
        // Everything is in and nothing more is planned.
        if pass > last_event && ledger.completed.len() == ledger.posted.len() {
            break;
        }
    }
    // Tear down: whatever is still outstanding is flushed, once.
    faults.stall(false);
    tear_down(c, s, &mut ledger, seed);
}

/// Disconnects both sides and drops their devices: whatever is still outstanding completes
/// (flushed), once, and every posted work request has completed.
fn tear_down(c: Side, s: Side, ledger: &mut Ledger, seed: u64) {
    c.qp.disconnect();
    s.qp.disconnect();
    for _ in 0..200 {
        step(&c, &s, ledger, seed);
        if ledger.completed.len() == ledger.posted.len() {
            break;
        }
    }
    let Side { dev: cdev, cq: ccq, .. } = c;
    let Side { dev: sdev, cq: scq, .. } = s;
    drop((cdev, sdev));
    while let Some(wc) = ccq.poll() {
        ledger.complete(0, wc, seed);
    }
    while let Some(wc) = scq.poll() {
        ledger.complete(1, wc, seed);
    }
    let missing = ledger.missing();
    assert!(missing.is_empty(), "seed {seed}: work requests that never completed: {missing:?}");
}

/// Takes one of `side`'s regions away (deregisters it) and registers another in its place for
/// later traffic: work in flight through the old one, on either side, must fail, not wait.
fn take_away(rng: &mut Rng, side: &mut Side) {
    let fresh = side.pd.register(REGION, RIGHTS).unwrap();
    let old = match rng.below(3) {
        0 => std::mem::replace(&mut side.src, fresh),
        1 => std::mem::replace(&mut side.dst, fresh),
        _ => std::mem::replace(&mut side.inbox, fresh),
    };
    drop(old);
}

/// How long a live schedule may take once its passes are spent: timers run on the clock.
const LIVE_WAIT: Duration = Duration::from_secs(5);

/// A schedule without a teardown to finish it: traffic, regions taken away in its midst, and
/// the link cut or one direction closed, but nothing a TCP connection does not do (no bytes
/// lost, garbled or stalled unnoticed). Every posted work request must then complete on its
/// own: each failure must reach both ends (a Terminate, the link's loss) and flush their
/// queues. An in-memory link has no readiness events, so every pass visits both connections:
/// whether a failure also prompts the visit that sends its Terminate is checked over sockets
/// (tests/tests/dereg_race.rs, `a_failure_at_any_pass_leaves_no_work_request_waiting`).
fn live_schedule(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let capacity = 1024 + rng.below(256 << 10) as usize;
    let crc = rng.below(2) == 0;
    let peer_to_peer = rng.below(2) == 0;
    let (mut c, mut s, faults) = connect(capacity, crc, peer_to_peer);
    let mut ledger = Ledger::default();
    let mut next = 0u64;
    if !peer_to_peer {
        // The client speaks first (a zero-length Write): until it does, the server sends
        // nothing, and work it posted waits for good, as the protocol wants.
        next += 1;
        let op = SendOp::Write { remote_stag: s.dst.rkey(), remote_to: s.dst.addr() };
        c.qp.post_send(SendWr { wr_id: next, op, sgl: iwarp::Sgl::new(), signaled: true }).unwrap();
        ledger.post(0, next, WcOpcode::Write);
    }
    // (pass, what): a region of the client or the server taken away, the link cut, one
    // direction closed, or more traffic; half of them in the first passes, while the first
    // traffic is still on its way.
    let events: Vec<(usize, u64)> = (0..1 + rng.below(3))
        .map(|_| {
            let within = if rng.below(2) == 0 { 6 } else { PASSES as u64 / 4 };
            (rng.below(within) as usize, rng.below(8))
        })
        .collect();
    let last_event = events.iter().map(|e| e.0).max().unwrap_or(0);
    let started = Instant::now();
    for pass in 0.. {
        if pass == 0 {
            post_traffic(&mut rng, &c, &s, &mut ledger, &mut next);
        }
        for &(_, what) in events.iter().filter(|e| e.0 == pass) {
            match what {
                0..=1 => take_away(&mut rng, &mut c),
                2..=3 => take_away(&mut rng, &mut s),
                4 => faults.cut(),
                5 => faults.close_write(rng.below(2) as usize),
                _ => post_traffic(&mut rng, &c, &s, &mut ledger, &mut next),
            }
        }
        step(&c, &s, &mut ledger, seed);
        if pass > last_event && ledger.completed.len() == ledger.posted.len() {
            break;
        }
        if pass > PASSES {
            assert!(
                started.elapsed() < LIVE_WAIT,
                "seed {seed}: work requests that never completed without a teardown: {:?}; \
                 client {:?}, server {:?}; events {events:?}; link capacity {capacity}, crc {crc}, \
                 peer-to-peer {peer_to_peer}",
                ledger.missing(),
                c.qp.state(),
                s.qp.state()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    tear_down(c, s, &mut ledger, seed);
}

/// The number of schedules a test runs: `IWARP_FAULT_SCHEDULES`, or 10,000 in an optimized
/// build and 1,000 in a debug one.
fn schedules() -> u64 {
    let default = if cfg!(debug_assertions) { 1_000 } else { 10_000 };
    std::env::var("IWARP_FAULT_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_schedules_without_a_teardown_complete_every_work_request() {
    for seed in 0..schedules() {
        live_schedule(seed);
    }
}

#[test]
fn random_fault_schedules_lose_no_work_request_and_complete_none_twice() {
    for seed in 0..schedules() {
        schedule(seed);
    }
}
