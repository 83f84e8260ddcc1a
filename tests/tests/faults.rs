//! Random fault schedules through real devices: two inline devices (the test thread drives
//! both engines) connected over an in-memory link, mixed traffic (RDMA Writes, Reads, Sends
//! both ways), and faults at random points: the link cut, stalled (and maybe resumed), one
//! direction closed, bytes corrupted, pieces of the stream reordered, with CRC on or off.
//! Whatever happens, every posted work request completes exactly once (successfully or with
//! an error) and nothing panics. `IWARP_FAULT_SCHEDULES` sets the number of schedules
//! (default 10000 in an optimized build, as scripts/test.sh runs it, and 1000 in a debug
//! build); a failure names its seed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "sizes are small")]

use std::collections::HashMap;
use std::time::Duration;

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::netdev::{MemFaults, MemLink};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, QueuePair, RecvWr,
    SendOp, SendWr, WcOpcode, WorkCompletion,
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
    cq: CompletionQueue,
    qp: QueuePair,
    src: MemoryRegion,
    dst: MemoryRegion,
    inbox: MemoryRegion,
}

fn inline() -> Device {
    Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() })
}

/// Two inline devices connected over an in-memory link of `capacity` bytes per direction.
fn connect(capacity: usize, crc: bool) -> (Side, Side, MemFaults) {
    let (a, b) = MemLink::pair(capacity);
    let faults = a.faults();
    let policy = Policy {
        crc: if crc { CrcPolicy::Wanted } else { CrcPolicy::Off },
        ird: 8,
        ord: 8,
        ..Policy::default()
    };
    let opts = ConnectOptions { policy, timeout: Duration::from_secs(10), ..ConnectOptions::default() };
    let (cdev, sdev) = (inline(), inline());
    let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
    let (ccq, scq) = (cdev.create_cq(256), sdev.create_cq(256));
    let rights = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);
    let (server_qp, client) = std::thread::scope(|s| {
        let server = s.spawn(|| sdev.accept_link(Box::new(b), &spd, &scq, &scq, &opts).unwrap());
        let client = cdev.connect_link(Box::new(a), &cpd, &ccq, &ccq, &opts).unwrap();
        (server.join().unwrap(), client)
    });
    let side = |dev: Device, pd: &iwarp::ProtectionDomain, cq: CompletionQueue, qp: QueuePair| Side {
        src: pd.register(REGION, rights).unwrap(),
        dst: pd.register(REGION, rights).unwrap(),
        inbox: pd.register(REGION, rights).unwrap(),
        dev,
        cq,
        qp,
    };
    let c = side(cdev, &cpd, ccq, client.qp);
    let s = side(sdev, &spd, scq, server_qp);
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

fn schedule(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let capacity = 1024 + rng.below(256 << 10) as usize;
    let crc = rng.below(2) == 0;
    let (c, s, faults) = connect(capacity, crc);
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
        c.dev.progress();
        s.dev.progress();
        reap(&c, 0, &mut ledger, seed);
        reap(&s, 1, &mut ledger, seed);
        // Everything is in and nothing more is planned.
        if pass > last_event && ledger.completed.len() == ledger.posted.len() {
            break;
        }
    }
    // Tear down: whatever is still outstanding is flushed, once.
    faults.stall(false);
    c.qp.disconnect();
    s.qp.disconnect();
    for _ in 0..200 {
        c.dev.progress();
        s.dev.progress();
        reap(&c, 0, &mut ledger, seed);
        reap(&s, 1, &mut ledger, seed);
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
    let missing: Vec<_> = ledger.posted.keys().filter(|k| !ledger.completed.contains_key(k)).collect();
    assert!(missing.is_empty(), "seed {seed}: work requests that never completed: {missing:?}");
}

#[test]
fn random_fault_schedules_lose_no_work_request_and_complete_none_twice() {
    let default = if cfg!(debug_assertions) { 1_000 } else { 10_000 };
    let n: u64 = std::env::var("IWARP_FAULT_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    for seed in 0..n {
        schedule(seed);
    }
}
