//! Deregistration (and invalidation) racing a peer's traffic into and out of the region: RDMA
//! Writes placed into it, Read Responses sourced from it, Sends received into it, from the
//! engine's thread while the application's thread takes the region away at a moment that
//! varies from round to round. Every round checks that every work request on both sides
//! completes exactly once, and that the buffer deregistration gives back is never written
//! again (the engine never touches memory it no longer holds; under AddressSanitizer,
//! scripts/asan.sh, a write after the buffer is freed would be reported too).
//!
//! A deterministic variant runs both devices inline on the test's thread over the same
//! sockets, with traffic both ways or only towards the side that fails (Writes, Reads, Sends
//! and an RFC 7306 atomic, to regions or through memory windows over them), and after a number
//! of engine passes that varies from round to round has one side take its region away,
//! invalidate it (locally, or by a peer's Send with Invalidate), deallocate its window,
//! disconnect, or send more than a receive holds: it checks, without depending on timing, that
//! a failure mid-transfer always prompts the visits that report it to the peer (a Terminate
//! queued in a visit that then sent nothing once waited for good, and left the peer's Reads
//! uncompleted). The same rounds also run with engine threads (event and adaptive mode), the
//! failure coming from the test's thread at a varying moment.
//!
//! `IWARP_RACE_ROUNDS` sets the number of rounds of each (default 200).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

mod common;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use iwarp::mpa::{CrcPolicy, Policy};
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

/// The region each side of a failure round exposes: large enough that a Read of it is
/// answered over several engine passes (a socket takes a few hundred KiB at a time, a pass
/// writes at most 512 KiB).
const INLINE_REGION: usize = 2 * MIB;

/// What a failure round does to the transfer, on one side (the other is its peer): at a pass
/// it picks (inline), or after a delay it picks (with engine threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upset {
    /// The side deregisters the region its peer writes into and reads from.
    Deregister,
    /// The side posts a local invalidate of that region, then deregisters it.
    InvalidateThenDeregister,
    /// The side posts a local invalidate of that region, and keeps it registered.
    Invalidate,
    /// The side disconnects.
    Disconnects,
    /// The side sends a message longer than its peer's receives (a Terminate from the peer).
    SendTooLong,
    /// The side sends a Send with Invalidate naming the key its peer exposes (a region, which
    /// a peer may not invalidate: a Terminate from the peer; or a window, which it may: the
    /// peer's later accesses through it fail).
    RemoteInvalidate,
    /// The side deallocates the window its peer reaches the region through (nothing without
    /// one).
    DeallocWindow,
}

const UPSETS: [Upset; 7] = [
    Upset::Deregister,
    Upset::InvalidateThenDeregister,
    Upset::Invalidate,
    Upset::Disconnects,
    Upset::SendTooLong,
    Upset::RemoteInvalidate,
    Upset::DeallocWindow,
];

/// One end of a failure round: the region its peer writes into, reads from and sends into
/// (its receives in the last bytes), reached through a memory window over all of it in some
/// rounds, its source, its Read sink and its message.
struct Side {
    end: End,
    exposed: Option<iwarp::MemoryRegion>,
    window: Option<iwarp::MemoryWindow>,
    /// The key the peer uses: the window's, or the region's.
    rkey: iwarp::STag,
    base: u64,
    src: iwarp::MemoryRegion,
    sink: iwarp::MemoryRegion,
    msg: iwarp::MemoryRegion,
    /// Whether its receives are posted (only where the peer sends).
    receives: bool,
}

impl Side {
    /// A side with a window over its region or not, and its receives posted or not (only
    /// where the peer sends).
    fn new(end: End, seed: u8, window: bool, receives: bool) -> Side {
        let remote = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);
        let exposed =
            end.pd.register_buffer(vec![0x5au8; INLINE_REGION], remote.union(Access::LOCAL_WRITE)).unwrap();
        for i in 0..if receives { RECVS } else { 0 } {
            let off = INLINE_REGION - (i as usize + 1) * RECV_LEN;
            end.recv(1000 + i, vec![exposed.sge(off, RECV_LEN as u32)]);
        }
        let window = window.then(|| {
            let mw = end.pd.alloc_mw().unwrap();
            let op = mw.bind_op(seed, &exposed, 0, INLINE_REGION as u64, remote);
            end.send(3000, op, Vec::new());
            end.expect_ok(3000, WcOpcode::BindWindow, "binding the window");
            mw
        });
        Side {
            rkey: window.as_ref().map_or(exposed.rkey(), iwarp::MemoryWindow::rkey),
            window,
            base: exposed.addr(),
            exposed: Some(exposed),
            src: end.pd.register_bytes(&pattern(CHUNK, seed), Access::NONE).unwrap(),
            sink: end.pd.register(INLINE_REGION, Access::LOCAL_WRITE).unwrap(),
            msg: end.pd.register_bytes(&[0x77; RECV_LEN], Access::NONE).unwrap(),
            receives,
            end,
        }
    }

    /// Writes into `peer`'s region, Reads from it (a few KiB up to its whole length), Sends
    /// into its receives and one RFC 7306 atomic on it, interleaved: 12 work requests, 4 of
    /// them Sends.
    fn traffic(&self, peer: &Side, rng: &mut u64) -> Vec<SendWr> {
        (0..12u64)
            .map(|i| {
                let (op, sge) = match i % 3 {
                    0 if i == 9 => {
                        let op = SendOp::Atomic {
                            remote_stag: peer.rkey,
                            remote_to: peer.base,
                            op: iwarp::rdmap::atomic::AtomicOp::FetchAdd,
                            data: 1,
                            data_mask: 0,
                            compare: 0,
                            compare_mask: 0,
                        };
                        (op, self.sink.sge(0, 8))
                    }
                    0 => {
                        let to = peer.base + (i as usize * CHUNK) as u64;
                        (SendOp::Write { remote_stag: peer.rkey, remote_to: to }, self.src.sge_all())
                    }
                    1 => {
                        let len = 4096 + next(rng) as usize % (INLINE_REGION - 4096);
                        let op = SendOp::Read { remote_stag: peer.rkey, remote_to: peer.base };
                        (op, self.sink.sge(0, len as u32))
                    }
                    _ => (send_op(false), self.msg.sge_all()),
                };
                SendWr { wr_id: i, op, sgl: sge.into(), signaled: true }
            })
            .collect()
    }

    /// Does `upset` to this side's end of the connection.
    fn upset(&mut self, upset: Upset, peer: &Side) {
        match upset {
            Upset::Deregister | Upset::InvalidateThenDeregister | Upset::Invalidate => {
                if upset != Upset::Deregister {
                    let op = SendOp::LocalInvalidate { stag: self.rkey };
                    let wr = SendWr { wr_id: 2000, op, sgl: Default::default(), signaled: true };
                    self.end.qp.post_send(wr).unwrap();
                }
                if upset != Upset::Invalidate {
                    let region = self.exposed.take().unwrap();
                    if self.window.is_some() {
                        // A region under a bound window is not deregistered; dropped, it
                        // unbinds the window and goes.
                        drop(region);
                    } else {
                        drop(region.deregister().unwrap());
                    }
                }
            }
            Upset::DeallocWindow => drop(self.window.take()),
            Upset::Disconnects => self.end.qp.disconnect(),
            Upset::SendTooLong => {
                self.end.send(12, send_op(false), vec![self.src.sge(0, 2 * RECV_LEN as u32)])
            }
            Upset::RemoteInvalidate => {
                let op = SendOp::Send { solicited: false, invalidate: Some(peer.rkey) };
                self.end.send(12, op, vec![self.msg.sge_all()]);
            }
        }
    }

    /// The work requests this side must see complete: its 12 if it sends, its receives if it
    /// has them, and the one more an upset posts here.
    fn owed(&self, sends: bool, upset: Option<Upset>) -> usize {
        let extra = match upset {
            Some(Upset::Disconnects | Upset::Deregister | Upset::DeallocWindow) | None => 0,
            Some(_) => 1,
        };
        12 * usize::from(sends) + RECVS as usize * usize::from(self.receives) + extra
    }
}

/// A round of upsets under way: both sides connected with their traffic posted, and what
/// happens when (`at`: a pass inline, tens of microseconds with engine threads), by which side.
struct Upsetting {
    sides: [Side; 2],
    at: u64,
    upset: Upset,
    who: usize,
    /// The work requests each side must see complete.
    owed: [usize; 2],
    what: String,
}

impl Upsetting {
    fn start(devs: &[iwarp::Device], r: u64) -> Upsetting {
        let mut rng = r.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        // Socket buffers from 64 KiB to the stack's 4 MiB: the smaller, the more passes a
        // transfer spans, each prompted by the socket's readiness. (Smaller ones leave loopback
        // TCP waiting for delayed acknowledgements: much slower, and no other path.)
        let buffer = Some((64 << 10) << (next(&mut rng) % 7));
        let link =
            iwarp::netdev::LinkOptions { send_buffer: buffer, recv_buffer: buffer, ..Default::default() };
        // CRC on or off, markers or not: with markers every segment is staged and framed
        // around them, another way out.
        let (crc, markers) = (next(&mut rng).is_multiple_of(2), next(&mut rng).is_multiple_of(3));
        let windows = next(&mut rng).is_multiple_of(2);
        let who = (next(&mut rng) % 2) as usize;
        // Traffic both ways, or only towards the side that fails the transfer: then that side
        // only answers, and its peer, with nothing more to send, relies on it to report the
        // failure (where a Terminate left unsent once waited for good; traffic coming the other
        // way prompts the failing side anyway).
        let both_ways = next(&mut rng).is_multiple_of(2);
        let sends = [0, 1].map(|i| both_ways || i != who);
        let policy = Policy {
            crc: if crc { CrcPolicy::Required } else { CrcPolicy::Off },
            markers_wanted: markers,
            // A server sends nothing before the client's first FPDU (RFC 5044 section 7.1.1):
            // where only the server sends, the client's RTR message comes first.
            peer_to_peer: !sends[0],
            ..Policy::default()
        };
        let opts = ConnectOptions { link, policy, rfc7306: true, ..ConnectOptions::default() };
        let (client, server, _, _) = connect_on(&devs[0], &devs[1], &opts, &opts);
        let sides =
            [Side::new(client, r as u8, windows, sends[1]), Side::new(server, !(r as u8), windows, sends[0])];
        for (from, to) in [(0, 1), (1, 0)].into_iter().filter(|&(from, _)| sends[from]) {
            let wrs = sides[from].traffic(&sides[to], &mut rng);
            sides[from].end.qp.post_send_list(wrs).unwrap();
        }
        // Half of them in the first passes, while most of the traffic is still on its way.
        let within = if next(&mut rng).is_multiple_of(2) { 6 } else { 24 };
        let at = next(&mut rng) % within;
        let upset = UPSETS[(next(&mut rng) % UPSETS.len() as u64) as usize];
        let owed = [0, 1].map(|i| sides[i].owed(sends[i], (i == who).then_some(upset)));
        let what = format!(
            "round {r} ({upset:?} by the {} at {at}, socket buffers {buffer:?}, crc {crc}, markers {markers}, \
             windows {windows}, both ways {both_ways})",
            ["client", "server"][who]
        );
        Upsetting { sides, at, upset, who, owed, what }
    }

    /// Does the round's upset.
    fn upset(&mut self) {
        let [client, server] = &mut self.sides;
        let (this, peer) = if self.who == 0 { (client, &*server) } else { (server, &*client) };
        this.upset(self.upset, peer);
    }

    /// Disconnects both sides and lets `devs` finish with the connections.
    fn finish(self, devs: &[iwarp::Device]) {
        for s in &self.sides {
            s.end.qp.disconnect();
        }
        let deadline = Instant::now() + T;
        while devs.iter().map(iwarp::Device::connections).sum::<usize>() > 0 && Instant::now() < deadline {
            if devs.iter().all(|d| !d.progress()) {
                thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

/// One round of the deterministic variant: both devices inline (this thread runs every pass)
/// over loopback TCP, so that a connection is visited only when its socket is ready or work
/// was posted to it, as with an engine thread. After a number of passes that varies from
/// round to round, something fails the transfer on one side (an [`Upset`]). Every work
/// request on both sides must then complete without a teardown, exactly once: a step that
/// failed the stream and left nothing to prompt another visit (a Terminate queued but not
/// sent) shows as a Read that never completes.
fn inline_round(devs: &[iwarp::Device], r: u64) {
    let mut round = Upsetting::start(devs, r);
    let (at, owed, what) = (round.at, round.owed, round.what.clone());
    let mut seen: [HashSet<u64>; 2] = Default::default();
    let started = Instant::now();
    for pass in 0u64.. {
        if pass == at {
            round.upset();
        }
        for dev in devs {
            dev.progress();
        }
        for (side, s) in round.sides.iter().enumerate() {
            while let Some(wc) = s.end.cq.poll() {
                assert!(seen[side].insert(wc.wr_id), "{what}: work request {} completed twice", wc.wr_id);
            }
        }
        if pass >= at && seen[0].len() == owed[0] && seen[1].len() == owed[1] {
            break;
        }
        assert!(
            started.elapsed() < T,
            "{what}: after {pass} passes, client {:?} completed {:?}, server {:?} completed {:?}",
            round.sides[0].end.qp.state(),
            seen[0],
            round.sides[1].end.qp.state(),
            seen[1]
        );
        if pass > 1000 {
            // Nothing more to do now: what is left waits on the sockets (or a timer).
            thread::sleep(Duration::from_micros(200));
        }
    }
    round.finish(devs);
}

/// The same round with engine threads: the upset comes from the test's thread after `at` times
/// 15 us, whatever the engines are doing then, and every work request must complete within
/// the usual wait, exactly once.
fn threaded_round(devs: &[iwarp::Device], r: u64) {
    let mut round = Upsetting::start(devs, r);
    let delay = Duration::from_micros(15 * round.at);
    let start = Instant::now();
    while start.elapsed() < delay {
        std::hint::spin_loop();
    }
    round.upset();
    let what = round.what.clone();
    let state =
        || format!("client {:?}, server {:?}", round.sides[0].end.qp.state(), round.sides[1].end.qp.state());
    for (side, s) in round.sides.iter().enumerate() {
        exactly_once(&s.end.cq, round.owed[side], &format!("{what}: {}", ["client", "server"][side]), &state);
    }
    for s in &round.sides {
        if let Some(extra) = s.end.cq.wait(Duration::from_millis(2)) {
            panic!("{what}: an extra completion {extra:?}");
        }
    }
    round.finish(devs);
}

/// The rounds a test runs: `IWARP_RACE_ROUNDS`, 200 by default.
fn rounds() -> u64 {
    std::env::var("IWARP_RACE_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200)
}

#[test]
fn a_failure_at_any_pass_leaves_no_work_request_waiting() {
    let rounds = rounds();
    let devs = vec![open(PollMode::Inline), open(PollMode::Inline)];
    for r in 0..rounds {
        inline_round(&devs, r);
    }
}

#[test]
fn a_failure_racing_the_engines_leaves_no_work_request_waiting() {
    let rounds = rounds();
    for mode in [PollMode::Event, PollMode::Adaptive] {
        let devs = vec![open(mode), open(mode)];
        for r in 0..rounds / 2 {
            threaded_round(&devs, r);
        }
    }
}

#[test]
fn deregistration_races_writes_reads_and_sends() {
    let rounds = rounds();
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
