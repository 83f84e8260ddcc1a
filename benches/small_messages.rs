//! What a small Send costs through the whole stack, with no waiting in the figure: two inline
//! devices (no engine threads) on one thread, over 127.0.0.1. Each round the client posts a
//! list of `WINDOW` 64-byte Sends (its pass frames them and writes them in one system call),
//! reaps their completions, and the server's pass reads them, places them and completes its
//! receives, which it reaps and posts again. Nothing spins and nothing sleeps, so the figure
//! is the CPU cost per message of both ends together, system calls included. MPA CRC is on,
//! as in `iwarp bench`.
//!
//! `cargo bench --bench small_messages` prints nanoseconds per message (one thread that never
//! waits: wall clock is CPU time). Under callgrind the instruction count is exact and repeatable:
//!
//! ```text
//! cargo build --release --bench small_messages
//! valgrind --tool=callgrind --toggle-collect='*small_messages::rounds*' \
//!     target/release/deps/small_messages-<hash> 2000
//! ```
//!
//! (instructions per message = the total / ((rounds + rounds / 10 + 1) × 64): the warm-up
//! rounds run in the same function; the argument is the number of rounds, 20,000 by default).
#![expect(clippy::expect_used, reason = "a benchmark aborts on setup errors")]
#![allow(clippy::cast_precision_loss, reason = "figures for printing")]

use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, QueuePair, RecvWr,
    SendOp, SendWr, WcStatus, WorkCompletion,
};

const WINDOW: usize = 64;
const SIZE: u32 = 64;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Completions taken per poll (perftest's batch).
const POLL_BATCH: usize = 16;

/// Takes `n` successful completions from `cq`, up to `POLL_BATCH` per call as perftest
/// polls, driving its device's passes as it polls.
fn reap(cq: &CompletionQueue, n: usize, started: Instant) {
    let mut batch = [WorkCompletion::default(); POLL_BATCH];
    let mut got = 0;
    while got < n {
        let k = cq.poll_many(&mut batch[..(n - got).min(POLL_BATCH)]);
        for wc in &batch[..k] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        got += k;
        if k == 0 {
            assert!(started.elapsed() < TIMEOUT, "{got} of {n} completions");
        }
    }
}

/// MPA CRC on, as `iwarp bench` has it by default.
fn with_crc() -> ConnectOptions {
    ConnectOptions {
        policy: Policy { crc: CrcPolicy::Required, ..Policy::default() },
        ..ConnectOptions::default()
    }
}

/// Receive `i` of a round: the `i`th message-sized piece of `sink`.
fn recv(sink: &MemoryRegion, i: usize) -> RecvWr {
    RecvWr { wr_id: i as u64, sgl: sink.sge(i * SIZE as usize, SIZE).into() }
}

struct Ends {
    client: QueuePair,
    client_cq: CompletionQueue,
    source: MemoryRegion,
    server: QueuePair,
    server_cq: CompletionQueue,
    sink: MemoryRegion,
}

#[inline(never)]
fn rounds(e: &Ends, rounds: usize) {
    let send = |i: usize| SendWr {
        wr_id: i as u64,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: e.source.sge(0, SIZE).into(),
        signaled: true,
    };
    for _ in 0..rounds {
        let started = Instant::now();
        e.client.post_send_list((0..WINDOW).map(send)).expect("post the Sends");
        reap(&e.client_cq, WINDOW, started);
        reap(&e.server_cq, WINDOW, started);
        e.server.post_recv_list((0..WINDOW).map(|i| recv(&e.sink, i))).expect("post the receives");
    }
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let inline = DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() };
    let (client_dev, server_dev) = (Device::open(inline), Device::open(inline));
    let (client_pd, server_pd) = (client_dev.alloc_pd(), server_dev.alloc_pd());
    let (client_cq, server_cq) = (client_dev.create_cq(4 * WINDOW), server_dev.create_cq(4 * WINDOW));
    let source = client_pd.register(SIZE as usize, Access::NONE).expect("register");
    let sink = server_pd.register(WINDOW * SIZE as usize, Access::LOCAL_WRITE).expect("register");
    let listener = server_dev.listen("127.0.0.1:0".parse().expect("address")).expect("listen");
    let addr = listener.local_addr().expect("address");
    let accepting = {
        let (pd, cq) = (server_pd.clone(), server_cq.clone());
        std::thread::spawn(move || {
            listener.accept(TIMEOUT).expect("accept").accept(&pd, &cq, &cq, &with_crc())
        })
    };
    let opts = with_crc();
    let client = client_dev.connect(addr, &client_pd, &client_cq, &client_cq, &opts).expect("connect").qp;
    let server = accepting.join().expect("the accepting thread").expect("accept");
    server.post_recv_list((0..WINDOW).map(|i| recv(&sink, i))).expect("post the receives");
    let ends = Ends { client, client_cq, source, server, server_cq, sink };
    rounds(&ends, n / 10 + 1);
    let start = Instant::now();
    rounds(&ends, n);
    let per_message = start.elapsed().as_nanos() as f64 / (n * WINDOW) as f64;
    println!("{SIZE} B Sends, {WINDOW} per round, {n} rounds: {per_message:.0} ns per message");
}
