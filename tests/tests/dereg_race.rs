//! Deregistration (and invalidation) racing a peer's traffic into and out of the region: RDMA
//! Writes placed into it, Read Responses sourced from it, Sends received into it, from the
//! engine's thread while the application's thread takes the region away at a moment that
//! varies from round to round. Every round checks that every work request on both sides
//! completes exactly once, and that the buffer deregistration gives back is never written
//! again (the engine never touches memory it no longer holds; under AddressSanitizer,
//! scripts/asan.sh, a write after the buffer is freed would be reported too).
//!
//! `IWARP_RACE_ROUNDS` sets the number of rounds (default 200).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

mod common;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use iwarp::{Access, CompletionQueue, ConnectOptions, PollMode, SendOp, SendWr, WcOpcode, WcStatus};

const REGION: usize = 256 * 1024;
const CHUNK: usize = 32 * 1024;
const RECVS: u64 = 4;
const RECV_LEN: usize = 64;

/// The next pseudo-random number of a round (xorshift), for the moment of deregistration.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Waits for `n` completions with distinct work request ids from `cq` (each within [`T`]); a
/// repeated id fails the test, and so does a wait that times out, with what `state` says of
/// the two queue pairs then.
fn exactly_once(
    cq: &CompletionQueue,
    n: usize,
    what: &str,
    state: &dyn Fn() -> String,
) -> Vec<(u64, WcOpcode, WcStatus)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let wc = cq
            .wait(T)
            .unwrap_or_else(|| panic!("{what}: {} of {n} completions: {out:?}; {}", out.len(), state()));
        assert!(seen.insert(wc.wr_id), "{what}: work request {} completed twice: {out:?} {wc:?}", wc.wr_id);
        out.push((wc.wr_id, wc.opcode, wc.status));
    }
    out
}

fn round(devs: &[iwarp::Device], r: u64) {
    let (client, server, _, _) =
        connect_on(&devs[0], &devs[1], &ConnectOptions::default(), &ConnectOptions::default());
    let rw = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);
    let mr = server.pd.register_buffer(vec![0x5au8; REGION], rw).unwrap();
    let (rkey, base) = (mr.rkey(), mr.addr());
    // The server's receives land in the last bytes of the region too.
    for i in 0..RECVS {
        let off = REGION - (i as usize + 1) * RECV_LEN;
        server.recv(1000 + i, vec![mr.sge(off, RECV_LEN as u32)]);
    }
    let src = client.pd.register_bytes(&pattern(CHUNK, r as u8), Access::NONE).unwrap();
    let sink = client.pd.register(CHUNK * 4, Access::LOCAL_WRITE).unwrap();
    let msg = client.pd.register_bytes(&[0x77; RECV_LEN], Access::NONE).unwrap();
    // Writes, Reads and Sends, interleaved; the ORD lets a few Reads be outstanding.
    let mut wrs = Vec::new();
    for i in 0..12u64 {
        let off = (i as usize % 6) * CHUNK;
        let (op, sge) = match i % 3 {
            0 => (SendOp::Write { remote_stag: rkey, remote_to: base + off as u64 }, src.sge_all()),
            1 => (
                SendOp::Read { remote_stag: rkey, remote_to: base + off as u64 },
                sink.sge((i as usize % 4) * CHUNK, CHUNK as u32),
            ),
            _ => (send_op(false), msg.sge_all()),
        };
        wrs.push(SendWr { wr_id: i, op, sgl: sge.into(), signaled: true });
    }
    let sends = wrs.iter().filter(|w| matches!(w.op, SendOp::Send { .. })).count();
    let mut rng = r.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    // From at once to about the time the traffic takes on loopback.
    let delay = Duration::from_micros(next(&mut rng) % 300);
    let invalidate_first = r % 4 == 3;
    let server_qp = server.qp.clone();
    client.qp.post_send_list(wrs).unwrap();
    let taker = thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < delay {
            std::hint::spin_loop();
        }
        if invalidate_first {
            // A local invalidate first: the traffic after it is refused, then the region goes.
            let wr = SendWr {
                wr_id: 2000,
                op: SendOp::LocalInvalidate { stag: mr.rkey() },
                sgl: Default::default(),
                signaled: true,
            };
            server_qp.post_send(wr).unwrap();
        }
        let buffer = mr.deregister().unwrap().into_vec().unwrap();
        let snapshot = buffer.clone();
        (buffer, snapshot)
    });
    let (buffer, snapshot) = taker.join().unwrap();
    let what = format!("round {r} (delay {delay:?}, invalidate {invalidate_first})");
    // A work request that never completes says where it stopped: the queue pairs' states
    // (a side left in Terminate never sent its Terminate) and the events they reported.
    let state = || {
        let events = |qp: &iwarp::QueuePair| std::iter::from_fn(|| qp.poll_event()).collect::<Vec<_>>();
        format!(
            "client {:?} {:?}, server {:?} {:?}",
            client.qp.state(),
            events(&client.qp),
            server.qp.state(),
            events(&server.qp)
        )
    };
    let done = exactly_once(&client.cq, 12, &format!("{what}: client"), &state);
    // The server: its receives, and the local invalidate if it posted one.
    let server_wrs = RECVS as usize + usize::from(invalidate_first);
    let got = exactly_once(&server.cq, server_wrs, &format!("{what}: server"), &state);
    // Sends that completed successfully on the server filled receives: each exactly once.
    let filled = got
        .iter()
        .filter(|(id, op, s)| *op == WcOpcode::Recv && *id >= 1000 && *s == WcStatus::Success)
        .count();
    assert!(filled <= sends, "{what}: {filled} receives for {sends} Sends");
    assert!(done.iter().all(|&(id, _, _)| id < 12), "{what}: {done:?}");
    // Nothing more comes, on either side.
    for (cq, side) in [(&client.cq, "client"), (&server.cq, "server")] {
        if let Some(extra) = cq.wait(Duration::from_millis(5)) {
            panic!("{what}: extra {side} completion {extra:?}");
        }
    }
    // The buffer given back is the application's again: the engine never wrote it after.
    assert_eq!(buffer, snapshot, "{what}: the deregistered buffer changed");
    drop(buffer);
    client.qp.disconnect();
    server.qp.disconnect();
}

#[test]
fn deregistration_races_writes_reads_and_sends() {
    let rounds: u64 = std::env::var("IWARP_RACE_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let devs = vec![open(PollMode::Adaptive), open(PollMode::Adaptive)];
    let start = Instant::now();
    for r in 0..rounds {
        round(&devs, r);
    }
    // Every connection of every round is finished and gone from the engines.
    let deadline = Instant::now() + T;
    while devs.iter().map(iwarp::Device::connections).sum::<usize>() > 0 {
        assert!(Instant::now() < deadline, "connections left after {rounds} rounds");
        thread::sleep(Duration::from_millis(2));
    }
    eprintln!("{rounds} rounds in {:?}", start.elapsed());
}
