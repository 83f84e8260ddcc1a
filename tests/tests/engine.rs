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
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, QpState,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
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
    let rights = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);
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

/// Two devices in `mode` and one connection between them (client end, server end).
fn one_pair(mode: PollMode) -> (Device, Device, (End, End)) {
    let (client_dev, server_dev) = (open(mode), open(mode));
    let pair = connect_many(&client_dev, &server_dev, 1, 4).pop().unwrap();
    (client_dev, server_dev, pair)
}

/// One round trip (wr_ids 99/199 and 999/1999), then a pause in which both engines fall asleep.
/// An initiator that has sent but not yet heard from its peer keeps a nudge timer
/// (docs/siw-quirks.md), which fires, rightly, when the answer takes longer than 10 ms (a
/// loaded machine), and nudges once more when it first hears: once the client has heard the
/// server, none is left to wake an engine.
fn first_round_trip(client: &End, server: &End) {
    server.post_recv(99);
    client.post_recv(199);
    client.send(999, 8);
    server.wait_recv(99, "first ping");
    server.send(1999, 8);
    client.wait_recv(199, "first pong");
    thread::sleep(Duration::from_millis(20));
}

/// [`one_pair`] after its [`first_round_trip`]: both engines asleep, no nudge left.
fn sleeping_pair(mode: PollMode) -> (Device, Device, (End, End)) {
    let (client_dev, server_dev, pair) = one_pair(mode);
    first_round_trip(&pair.0, &pair.1);
    (client_dev, server_dev, pair)
}

/// Sparse Send/Send round trips between two sleeping engines: every message must wake the
/// thread waiting for it (or the receiving engine) through the link's readiness, and every
/// post must go out without waiting for the sending engine. A timer wake-up would mean some
/// step waited for a sleep timeout instead.
fn sparse_round_trips(mode: PollMode) {
    const PINGS: u64 = 20;
    let (client_dev, server_dev, pair) = sleeping_pair(mode);
    let (client, server) = (&pair.0, &pair.1);
    let before = (client_dev.stats(), server_dev.stats());
    for i in 0..PINGS {
        server.post_recv(100 + i);
        client.post_recv(200 + i);
        client.send(i, 8);
        server.wait_recv(100 + i, "ping");
        // The server answers once its engine sleeps again: for a while after its thread was
        // woken for the ping the engine sleeps on its doorbell alone and then looks at the
        // links (see `EngineStats::quiet_sleeps`), and a post made while it looks finds it
        // awake and leaves the work to it.
        thread::sleep(Duration::from_millis(2));
        server.send(1000 + i, 8);
        client.wait_recv(200 + i, "pong");
        // Sparse: both engines go back to sleep between round trips.
        thread::sleep(Duration::from_millis(3));
    }
    let after = (client_dev.stats(), server_dev.stats());
    for (name, b, a) in [("client", before.0, after.0), ("server", before.1, after.1)] {
        assert_eq!(a.timer_wakeups, b.timer_wakeups, "{mode:?} {name}: woken by a timer: {b:?} -> {a:?}");
        // The engine slept through the exchange: each message's input woke a sleeping
        // thread (the application thread waiting for it, or the engine) or was picked up by
        // the waiting thread's own pass (adaptive mode), and the posts went out from the
        // posting thread at once. Not every one: after a post that made the engine's sleep
        // deaf, its sleeps end every millisecond for a while when the next post may come
        // (`EngineStats::deafened`), and a post made while it looks finds it awake and leaves
        // the work to it.
        let found = |s: &iwarp::EngineStats| s.app_polls + s.event_wakeups + s.waiting_passes;
        assert!(
            found(&a) - found(&b) >= PINGS,
            "{mode:?} {name}: input did not wake a sleeper: {b:?} -> {a:?}"
        );
        assert!(
            a.direct_passes - b.direct_passes >= PINGS * 3 / 4,
            "{mode:?} {name}: posts waited for the engine: {b:?} -> {a:?}"
        );
    }
}

/// A thread that posts while its engine sleeps, and whose answer comes before it waits again
/// (on one machine the peer it woke often preempts it and answers at once; here it spins for
/// 100 us first), does not have its engine woken for the answer: the post made the engine's
/// sleep deaf to the links (`EngineStats::deafened`), the queue's poll recorded the input, and
/// the thread takes it when it waits. Wake-ups are counted, not time: before, the engine was
/// woken for the answers that came during the spin.
#[test]
fn an_answer_that_comes_before_its_poster_waits_does_not_wake_the_engine() {
    const PINGS: u64 = 20;
    // Sparse: the client's engine goes back to sleep between them.
    let (before, after) = late_pings(PINGS, Duration::from_millis(3), 0);
    // Fewer than half: a loaded machine may hold the thread up past the engine's deaf sleep.
    let woken = after.event_wakeups - before.event_wakeups;
    assert!(woken < PINGS / 2, "the engine was woken {woken} times: {before:?} -> {after:?}");
    assert!(
        after.deafened - before.deafened >= PINGS / 2,
        "posts did not make the sleep deaf: {before:?} -> {after:?}"
    );
}

/// Posts a steady 10 ms apart: between them the client's engine sleeps hearing the links until
/// shortly before the next post is due, then in sleeps that post can make deaf (within 1 ms),
/// rather than waking every millisecond of the gap; and the answers still do not wake it (its
/// sleep was made deaf, or the poster was back in its queue's poll first).
#[test]
fn posts_at_a_steady_pace_let_the_engine_sleep_until_shortly_before_the_next() {
    const PINGS: u64 = 14;
    // The engine has seen the pace once the first posts are in.
    const FIRST: u64 = 4;
    let (before, after) = late_pings(PINGS, Duration::from_millis(10), FIRST);
    let rounds = PINGS - FIRST;
    // Waking every millisecond, the engine slept ten times a round trip (100-101 here); now
    // four or five.
    let sleeps = after.sleeps - before.sleeps;
    assert!(sleeps < 7 * rounds, "{sleeps} sleeps in {rounds} round trips: {before:?} -> {after:?}");
    let woken = after.event_wakeups - before.event_wakeups;
    assert!(woken < rounds / 2, "the engine was woken {woken} times: {before:?} -> {after:?}");
}

#[test]
fn event_mode_engines_wake_on_the_network_and_the_doorbell() {
    sparse_round_trips(PollMode::Event);
}

#[test]
fn adaptive_engines_wake_on_the_network_and_the_doorbell() {
    sparse_round_trips(PollMode::Adaptive);
}

/// `pings` 8 B Sends between a sleeping pair in event mode, each `gap` after the last answer,
/// the poster spinning 100 µs before it waits for the answer, as if preempted by the peer it
/// woke: the answer comes before it waits in its queue's poll, and would wake a hearing
/// engine. The client device's stats before ping `first` and at the end.
fn late_pings(pings: u64, gap: Duration, first: u64) -> (iwarp::EngineStats, iwarp::EngineStats) {
    let (client_dev, _server_dev, pair) = sleeping_pair(PollMode::Event);
    let (client, server) = (&pair.0, &pair.1);
    server.post_recv(100);
    let mut before = client_dev.stats();
    thread::scope(|s| {
        s.spawn(|| answer_pings(server, pings));
        for i in 0..pings {
            if i == first {
                before = client_dev.stats();
            }
            client.post_recv(200 + i);
            thread::sleep(gap);
            client.send(i, 8);
            let spin = std::time::Instant::now();
            while spin.elapsed() < Duration::from_micros(100) {
                std::hint::spin_loop();
            }
            client.wait_recv(200 + i, "pong");
        }
    });
    (before, client_dev.stats())
}

/// The server's side of the round trips: answers each of `rounds` pings (receives from wr_id
/// 100, the first posted by the caller) with an 8 B pong, its next receive posted first.
fn answer_pings(server: &End, rounds: u64) {
    for i in 0..rounds {
        server.wait_recv(100 + i, "ping");
        server.post_recv(101 + i);
        server.send(1000 + i, 8);
    }
}

/// `rounds` 8 B Send/Send round trips after [`first_round_trip`], the client pausing `pace`
/// before each ping; each end waits for its receive with a deadline.
fn round_trips(client: &End, server: &End, rounds: u64, pace: Duration) {
    thread::scope(|s| {
        s.spawn(|| answer_pings(server, rounds));
        server.post_recv(100);
        for i in 0..rounds {
            if !pace.is_zero() {
                thread::sleep(pace);
            }
            client.post_recv(200 + i);
            client.send(i, 8);
            client.wait_recv(200 + i, "pong");
        }
    });
}

/// Back-to-back Send/Send round trips between two event-mode engines, each end waiting with
/// a deadline: the waiting threads sleep in their queues' polls, and those sleeps share one
/// timer per queue, armed again only once it has gone off (it is set up to a second ahead,
/// the longest a timed sleep there lasts, `LONGEST_NAP`), not one timer per sleep (a kernel
/// timer armed and cancelled for each sleep cost an 8 B round trip 0.25-0.3 us of its 6.7).
/// Two queues may thus arm theirs once each, and once more per second that passes, however
/// loaded the machine; one arm per sleep would be about 600 in a few hundred milliseconds.
/// Counted from before the first round trip, whose waits arm them.
#[test]
fn timed_waits_share_an_alarm() {
    const ROUNDS: u64 = 300;
    let (client_dev, server_dev, pair) = one_pair(PollMode::Event);
    let (client, server) = (&pair.0, &pair.1);
    let before = (client_dev.stats(), server_dev.stats());
    let start = std::time::Instant::now();
    first_round_trip(client, server);
    round_trips(client, server, ROUNDS, Duration::ZERO);
    // Measured after the counts, so the bound is never short.
    let after = (client_dev.stats(), server_dev.stats());
    let seconds = start.elapsed().as_secs() + 1;
    let delta = |f: fn(&iwarp::EngineStats) -> u64| f(&after.0) + f(&after.1) - f(&before.0) - f(&before.1);
    let (sleeps, alarms) = (delta(|s| s.app_polls), delta(|s| s.alarms));
    let counts = format!("{sleeps} sleeps, {alarms} alarms, {seconds} s: {before:?} -> {after:?}");
    assert!(sleeps >= ROUNDS / 2, "the waiting threads did not sleep in their queues' polls: {counts}");
    assert!(alarms >= 1, "timed sleeps armed no alarm: {counts}");
    assert!(alarms <= 2 * (seconds + 1), "the alarms were armed more often than they went off: {counts}");
}

/// Round trips paced a little over 10 ms apart, each end waiting with a deadline: a timed
/// sleep in a queue's poll lasts up to a second (`LONGEST_NAP`), so the queue's alarm, set
/// once, covers every sleep of the exchange. With sleeps of at most 10 ms it was armed again
/// at nearly every round trip, on the client's way from its send to its sleep, and the
/// server's went off between the round trips, waking its thread for nothing.
#[test]
fn paced_waits_arm_no_alarm_per_round_trip() {
    const ROUNDS: u64 = 15;
    let (client_dev, server_dev, pair) = sleeping_pair(PollMode::Event);
    let (client, server) = (&pair.0, &pair.1);
    let before = (client_dev.stats(), server_dev.stats());
    round_trips(client, server, ROUNDS, Duration::from_millis(12));
    let after = (client_dev.stats(), server_dev.stats());
    let alarms = after.0.alarms + after.1.alarms - before.0.alarms - before.1.alarms;
    let server_sleeps = after.1.app_polls - before.1.app_polls;
    let counts = format!(
        "{alarms} alarms, {server_sleeps} server sleeps in its queue's poll: {before:?} -> {after:?}"
    );
    // Each queue's alarm once, and once more should a second pass (a slow machine).
    assert!(alarms <= 4, "the alarms were armed per round trip: {counts}");
    // A sleep per ping, and a few more for waits that found the engine awake or a spurious
    // wake-up; one more per round trip would be the alarm going off in between.
    assert!(server_sleeps <= ROUNDS + 4, "the server's thread woke between the round trips: {counts}");
}

/// A state hook may drop the last handle of a region when its connection goes down (the
/// verbs drop-in's hooks may hold the last reference to a connection and its regions). The
/// region's drop takes the engine's core, so the hook must run with the core let go: run
/// under it, the engine waited for itself for good (`fi_pingpong` over the drop-in hung so
/// in 1 of 25 runs).
#[test]
fn a_state_hook_may_drop_the_last_handle_of_a_region() {
    for mode in [PollMode::Event, PollMode::Adaptive, PollMode::Inline] {
        let (client_dev, server_dev, pair) = one_pair(mode);
        let region = client_dev.alloc_pd().register(64, Access::LOCAL_WRITE).unwrap();
        let held = std::sync::Mutex::new(Some(region));
        let (tx, rx) = std::sync::mpsc::channel();
        let hooked = pair.0.qp.on_state_change(move |state| {
            if state != QpState::Rts {
                drop(held.lock().unwrap().take());
                let _ = tx.send(state);
            }
        });
        assert!(hooked);
        pair.1.qp.disconnect();
        // Inline, nothing runs an engine unless a thread calls into it.
        let deadline = std::time::Instant::now() + T;
        let got = loop {
            if mode == PollMode::Inline {
                let _ = (pair.1.cq.poll(), pair.0.cq.poll());
            }
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(state) => break Some(state),
                Err(_) if std::time::Instant::now() >= deadline => break None,
                Err(_) => {}
            }
        };
        if got.is_none() {
            // An engine that waits for itself: its handles would wait too when dropped.
            std::mem::forget((client_dev, server_dev, pair));
            panic!("{mode:?}: the hook did not get through dropping the region");
        }
        assert_eq!(got, Some(QpState::Error), "{mode:?}");
    }
}

/// A peer that sends its last message and closes at once: its close often arrives before the
/// receiving end collected the message's readable edge, under that same edge, and the read
/// that takes the message consumes the close too. The engine takes a short read as having
/// drained the socket, so the close must reach it as an event of its own: every server queue
/// pair leaves RTS, with no timer to find it (an engine in event mode has none).
fn closes_right_after_the_last_message(mode: PollMode) {
    const PAIRS: usize = 16;
    let (client_dev, server_dev) = (open(mode), open(mode));
    let pairs = connect_many(&client_dev, &server_dev, PAIRS, 4);
    let before = server_dev.stats();
    for (i, (client, server)) in pairs.iter().enumerate() {
        server.post_recv(1);
        client.send(2, 8);
        // Sent (a Send completes once TCP has it); a disconnect before that would flush it.
        assert_eq!(client.wait("the last message sent").wr_id, 2);
        client.qp.disconnect();
        server.wait_recv(1, "the last message");
        let deadline = std::time::Instant::now() + T;
        while server.qp.state() == QpState::Rts {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?} pair {i}: the peer's close was never seen"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
    if mode == PollMode::Event {
        let after = server_dev.stats();
        assert_eq!(after.timer_wakeups, before.timer_wakeups, "{before:?} -> {after:?}");
    }
}

#[test]
fn event_mode_engines_see_a_close_that_came_with_the_last_message() {
    closes_right_after_the_last_message(PollMode::Event);
}

#[test]
fn adaptive_engines_see_a_close_that_came_with_the_last_message() {
    closes_right_after_the_last_message(PollMode::Adaptive);
}

/// A thread waiting for a peer's RDMA Write (which completes nothing at its target) sleeps in
/// `QueuePair::wait_input` and is woken by the data's arrival: every Write shows in memory
/// without a wait that ran out its time. With the engine asleep (event mode), the waiting
/// thread sleeps where the connection's input wakes it and places the data itself, rather
/// than waiting for the engine thread to be woken, place it and wake it in turn.
fn writes_wake_a_sleeping_target(mode: PollMode) {
    const ROUNDS: u8 = 20;
    let (_client_dev, server_dev, pair) = one_pair(mode);
    let (client, server) = (&pair.0, &pair.1);
    let before = server_dev.stats();
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let (mut woken, mut timeouts) = (0u32, 0u32);
            for round in 1..=ROUNDS {
                loop {
                    let epoch = server.qp.input_epoch();
                    let mut b = [0u8; 1];
                    server.mr.read(0, &mut b).unwrap();
                    if b[0] >= round {
                        break;
                    }
                    if server.qp.wait_input(epoch, Duration::from_secs(2)) == epoch {
                        timeouts += 1;
                    } else {
                        woken += 1;
                    }
                    assert!(timeouts < 3, "{mode:?}: round {round}: the Write did not wake the waiter");
                }
            }
            (woken, timeouts)
        });
        for round in 1..=ROUNDS {
            // Give the waiter time to fall asleep.
            thread::sleep(Duration::from_millis(2));
            client.mr.write(0, &[round]).unwrap();
            let op = SendOp::Write { remote_stag: server.mr.rkey(), remote_to: server.mr.addr() };
            client
                .qp
                .post_send(SendWr {
                    wr_id: u64::from(round),
                    op,
                    sgl: client.mr.sge(0, 1).into(),
                    signaled: true,
                })
                .unwrap();
            client.wait("write");
        }
        let (woken, timeouts) = waiter.join().unwrap();
        assert_eq!(timeouts, 0, "{mode:?}: waits that ran out their time");
        // Most Writes find the waiter asleep (one that comes before it looks is not waited for).
        assert!(woken > 0, "{mode:?}: no Write woke the waiter");
    });
    if mode == PollMode::Event {
        let after = server_dev.stats();
        assert!(
            after.app_polls - before.app_polls >= u64::from(ROUNDS) / 2,
            "the waiter did not sleep in the connection's readiness: {before:?} -> {after:?}"
        );
        assert!(
            after.event_wakeups - before.event_wakeups < u64::from(ROUNDS) / 2,
            "the engine thread was woken to place the Writes: {before:?} -> {after:?}"
        );
    }
}

#[test]
fn adaptive_writes_wake_a_sleeping_target() {
    writes_wake_a_sleeping_target(PollMode::Adaptive);
}

#[test]
fn event_mode_writes_wake_a_sleeping_target() {
    writes_wake_a_sleeping_target(PollMode::Event);
}

#[test]
fn inline_writes_wake_a_waiting_target() {
    writes_wake_a_sleeping_target(PollMode::Inline);
}

/// A thread waiting for a completion in adaptive mode runs the sleeping engine's passes
/// itself only while completions come soon. Against a peer that answers after 5 ms, after the
/// first such wait the client's waits go to sleep at once instead of polling the engine for
/// the spin time (each round trip then costs only the passes of its two posts).
#[test]
fn adaptive_waits_stop_driving_the_engine_when_answers_come_late() {
    const ROUNDS: u64 = 6;
    let (client_dev, server_dev) = (open(PollMode::Adaptive), open(PollMode::Adaptive));
    let mut pairs = connect_many(&client_dev, &server_dev, 1, 4);
    let (client, server) = pairs.pop().unwrap();
    server.post_recv(0);
    let answering = thread::spawn(move || {
        for i in 0..2 * ROUNDS {
            server.wait_recv(i, "ping");
            server.post_recv(i + 1);
            thread::sleep(Duration::from_millis(5));
            server.send(1000 + i, 8);
            server.wait("pong sent");
        }
    });
    let round = |i: u64| {
        client.post_recv(i);
        client.send(100 + i, 8);
        client.wait_recv(i, "pong");
    };
    for i in 0..ROUNDS {
        round(i);
    }
    let before = client_dev.stats();
    for i in ROUNDS..2 * ROUNDS {
        round(i);
    }
    let after = client_dev.stats();
    answering.join().unwrap();
    // Two posts per round, each a pass on the posting thread when the engine sleeps (fewer
    // when it is awake); a wait that drove the engine would add one pass per yield.
    let passes = after.direct_passes - before.direct_passes;
    assert!(passes <= 3 * ROUNDS, "waits kept driving the engine: {passes} passes in {ROUNDS} rounds");
}

/// Inline, posting is one of the application's calls that drive the engine: a Send goes on
/// the wire as it is posted, while the client's thread does nothing else with its device
/// until the peer has it.
#[test]
fn inline_posts_go_out_as_posted() {
    let (client_dev, server_dev) = (open(PollMode::Inline), open(PollMode::Event));
    let (client, server) = connect_many(&client_dev, &server_dev, 1, 4).pop().unwrap();
    for i in 0..3 {
        server.post_recv(i);
        let before = client_dev.stats().direct_passes;
        client.send(100 + i, 8);
        assert_eq!(client_dev.stats().direct_passes - before, 1, "the post's own pass");
        server.wait_recv(i, "ping");
        client.wait("send completion");
    }
}

/// Busy, a poster that finds the engine thread between passes sends its work itself rather
/// than handing it over: the busy engine thread leaves its lock free while it asks the
/// readiness poll for events, so some of 200 posts find it free.
#[test]
fn busy_posters_send_themselves_when_the_engine_is_between_passes() {
    let (client_dev, server_dev) = (open(PollMode::Busy), open(PollMode::Event));
    let (client, server) = connect_many(&client_dev, &server_dev, 1, 4).pop().unwrap();
    let before = client_dev.stats().direct_passes;
    for i in 0..200 {
        server.post_recv(i);
        client.send(100 + i, 8);
        server.wait_recv(i, "ping");
        client.wait("send completion");
    }
    let direct = client_dev.stats().direct_passes - before;
    assert!(direct > 0, "no post of 200 went out on the posting thread");
}

/// A thread that posts Sends one at a time without looking at its completion queue in
/// between (perftest's loop without `-l`) runs a pass of its own for the first eight
/// (`DIRECT_POSTS_IN_A_ROW` in src/engine.rs) and hands the rest to the engine thread, which
/// writes what has piled up by the time it runs: every Send arrives, in order, and completes
/// once. With a pass per post, each of the 48 would be a direct pass.
fn bursts_of_single_posts_go_to_the_engine(mode: PollMode) {
    const N: u64 = 48;
    let (client_dev, server_dev) = (open(mode), open(mode));
    let (client, server) = connect_many(&client_dev, &server_dev, 1, N as usize).pop().unwrap();
    first_round_trip(&client, &server);
    for i in 0..N {
        server.post_recv(i);
    }
    let before = client_dev.stats().direct_passes;
    for i in 0..N {
        client.send(1000 + i, 8);
    }
    let direct = client_dev.stats().direct_passes - before;
    for i in 0..N {
        server.wait_recv(i, "a Send of the burst");
    }
    for i in 0..N {
        assert_eq!(client.wait("the burst's completions").wr_id, 1000 + i);
    }
    assert!(client.cq.poll().is_none(), "each Send completes once");
    assert!(direct <= 8, "{direct} of {N} posts in a row ran passes of their own");
}

#[test]
fn event_mode_bursts_of_single_posts_go_to_the_engine() {
    bursts_of_single_posts_go_to_the_engine(PollMode::Event);
}

#[test]
fn adaptive_bursts_of_single_posts_go_to_the_engine() {
    bursts_of_single_posts_go_to_the_engine(PollMode::Adaptive);
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

/// The process's resident memory in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A thousand connected queue pairs on one engine per side: an idle connection costs little
/// memory, and data moves on every one of them (a Write and a Send each, checked).
#[test]
fn a_thousand_queue_pairs() {
    const N: usize = 1000;
    // Both ends of every connection live in this process, plus the listener.
    rlimit::increase_nofile_limit(4 * N as u64 + 256).unwrap();
    let (client_dev, server_dev) = (open(PollMode::Adaptive), open(PollMode::Adaptive));
    let (cpd, spd) = (client_dev.alloc_pd(), server_dev.alloc_pd());
    let (ccq, scq) = (client_dev.create_cq(4 * N), server_dev.create_cq(4 * N));
    let listener = server_dev.listen("127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = ConnectOptions { max_recv_wr: 2, max_send_wr: 4, ..ConnectOptions::default() };
    let before = resident_bytes();
    let accepting = {
        let (spd, scq, opts) = (spd.clone(), scq.clone(), opts.clone());
        thread::spawn(move || {
            (0..N)
                .map(|_| listener.accept(T).unwrap().accept(&spd, &scq, &scq, &opts).unwrap())
                .collect::<Vec<_>>()
        })
    };
    let clients: Vec<QueuePair> =
        (0..N).map(|_| client_dev.connect(addr, &cpd, &ccq, &ccq, &opts).unwrap().qp).collect();
    let servers = accepting.join().unwrap();
    let per_end = resident_bytes().saturating_sub(before) / (2 * N as u64);
    assert!(per_end <= 64 * 1024, "{per_end} bytes per idle connection end");
    assert_eq!((client_dev.connections(), server_dev.connections()), (N, N));

    // Every connection: a 4 KiB Write into its own slice of the server's region, then a Send
    // carrying its index.
    const W: usize = 4096;
    let rights = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);
    let target = spd.register(N * W, rights).unwrap();
    let inbox = spd.register(N * 8, Access::LOCAL_WRITE).unwrap();
    let source = cpd.register(N * W, Access::LOCAL_WRITE).unwrap();
    for (i, qp) in servers.iter().enumerate() {
        source.write(i * W, &vec![(i % 251) as u8; W]).unwrap();
        source.write(i * W, &(i as u64).to_le_bytes()).unwrap();
        qp.post_recv(RecvWr { wr_id: i as u64, sgl: inbox.sge(i * 8, 8).into() }).unwrap();
    }
    for (i, qp) in clients.iter().enumerate() {
        let write = SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() + (i * W) as u64 };
        let send = SendOp::Send { solicited: false, invalidate: None };
        let wrs = [
            SendWr {
                wr_id: 2 * i as u64,
                op: write,
                sgl: source.sge(i * W, W as u32).into(),
                signaled: true,
            },
            SendWr { wr_id: 2 * i as u64 + 1, op: send, sgl: source.sge(i * W, 8).into(), signaled: true },
        ];
        qp.post_send_list(wrs).unwrap();
    }
    let mut received = vec![false; N];
    for _ in 0..N {
        let wc = scq.wait(T).expect("a receive on the server");
        assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::Recv, 8), "{wc:?}");
        let i = usize::try_from(wc.wr_id).unwrap();
        assert!(!received[i], "receive {i} completed twice");
        received[i] = true;
    }
    for _ in 0..2 * N {
        let wc = ccq.wait(T).expect("a send completion on the client");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    // The Send follows the Write on each connection, so its Write has been placed.
    let (mut placed, mut got) = (vec![0u8; N * W], vec![0u8; N * 8]);
    target.read(0, &mut placed).unwrap();
    inbox.read(0, &mut got).unwrap();
    for i in 0..N {
        assert_eq!(u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().unwrap()), i as u64, "Send on {i}");
        let slice = &placed[i * W..(i + 1) * W];
        assert_eq!(u64::from_le_bytes(slice[..8].try_into().unwrap()), i as u64, "Write on {i}");
        assert!(slice[8..].iter().all(|&b| b == (i % 251) as u8), "Write on {i}");
    }
}

/// A thread that runs a pass itself (`Device::try_progress`, as a program polling its queue in
/// a loop does through `ibv_poll_cq`) and then sleeps in its queue may be the one that takes a
/// large Read Request off the link: its pass spends the write budget on the first part of the
/// Read Response and leaves the connection ready, and the sleeping engine thread never saw
/// the request's readiness event (the poller's pass took it). The pass must wake the engine
/// for the rest, or the Read never completes (libfabric's rxm rendezvous stalled so, at
/// 512 KiB of a 1 MiB response).
#[test]
fn a_read_response_begun_by_a_polling_thread_is_finished_by_the_engine() {
    const LEN: usize = 4 << 20;
    const ROUNDS: u64 = 20;
    let (client_dev, server_dev) = (open(PollMode::Event), open(PollMode::Event));
    let listener = server_dev.listen("127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (spd, cpd) = (server_dev.alloc_pd(), client_dev.alloc_pd());
    let (scq, ccq) = (server_dev.create_cq(64), client_dev.create_cq(64));
    let opts = ConnectOptions { max_recv_wr: 4, max_send_wr: 4, ..ConnectOptions::default() };
    let accepting = {
        let (spd, scq, opts) = (spd.clone(), scq.clone(), opts.clone());
        thread::spawn(move || listener.accept(T).unwrap().accept(&spd, &scq, &scq, &opts).unwrap())
    };
    let cqp = client_dev.connect(addr, &cpd, &ccq, &ccq, &opts).unwrap().qp;
    let sqp = accepting.join().unwrap();
    let source: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    let remote = spd.register_bytes(&source, Access::REMOTE_READ).unwrap();
    let (rkey, raddr) = (remote.rkey(), remote.addr());
    let note = spd.register(64, Access::LOCAL_WRITE).unwrap();
    // Each round, the server says when it is ready for the Read (its note's receive posted).
    let (ready, is_ready) = std::sync::mpsc::channel();
    let server = thread::spawn(move || {
        for i in 0..ROUNDS {
            sqp.post_recv(RecvWr { wr_id: i, sgl: note.sge(0, 64).into() }).unwrap();
            // Poll as a program's loop does until a pass has sent something (the Read
            // Response's first part, unless the engine thread took the request)...
            let sent = server_dev.stats().tx_bytes;
            ready.send(i).unwrap();
            let deadline = std::time::Instant::now() + T;
            while server_dev.stats().tx_bytes == sent {
                assert!(std::time::Instant::now() < deadline, "round {i}: no Read Request came");
                server_dev.try_progress();
            }
            // ...then sleep in the queue until the client says its Read completed.
            let wc = scq.wait(T).unwrap_or_else(|| panic!("round {i}: no note from the client"));
            assert_eq!((wc.wr_id, wc.status, wc.opcode), (i, WcStatus::Success, WcOpcode::Recv), "round {i}");
        }
        drop(remote);
    });
    let sink = cpd.register(LEN, Access::LOCAL_WRITE).unwrap();
    let hello = cpd.register(64, Access::NONE).unwrap();
    for i in 0..ROUNDS {
        sink.write(0, &vec![0; LEN]).unwrap();
        assert_eq!(is_ready.recv_timeout(T), Ok(i), "the server's round {i}");
        let op = SendOp::Read { remote_stag: rkey, remote_to: raddr };
        cqp.post_send(SendWr { wr_id: i, op, sgl: sink.sge(0, LEN as u32).into(), signaled: true }).unwrap();
        let wc = ccq.wait(T).unwrap_or_else(|| panic!("round {i}: the 4 MiB Read did not complete"));
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (i, WcStatus::Success, WcOpcode::Read), "round {i}");
        assert!(sink.to_vec() == source, "round {i}: the Read brought other bytes");
        let op = SendOp::Send { solicited: false, invalidate: None };
        cqp.post_send(SendWr { wr_id: 100 + i, op, sgl: hello.sge(0, 8).into(), signaled: true }).unwrap();
        let wc = ccq.wait(T).unwrap_or_else(|| panic!("round {i}: the note was not sent"));
        assert_eq!((wc.wr_id, wc.status), (100 + i, WcStatus::Success), "round {i}");
    }
    server.join().unwrap();
}

/// Reads answered by a server whose engine thread keeps finding its lock held: a thread on the
/// server copies out of a region in a tight loop (each copy takes the engine's lock), so the
/// engine thread, woken by a Read Request, often finds the lock taken. It then leaves the
/// request's readiness to the copying thread, which must run the pass when it lets go: a
/// request left behind would never be answered (no later event comes for it). Every Read
/// completes with the right bytes, and the hand-off path was taken.
#[test]
fn input_the_engine_leaves_to_the_lock_holder_is_handled() {
    const MAX_READS: u64 = 20_000;
    let (_client_dev, server_dev, pair) = one_pair(PollMode::Event);
    let (client, server) = (&pair.0, &pair.1);
    server.mr.write(0, &[0x5a; 64]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the copying thread when the Reads end, failed or not.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    thread::scope(|s| {
        s.spawn(|| {
            let mut b = [0u8; 8];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                server.mr.read(0, &mut b).unwrap();
            }
        });
        let _stop = Stop(&stop);
        let mut reads = 0;
        while reads < MAX_READS && (reads < 200 || server_dev.stats().handoffs == 0) {
            reads += 1;
            client.mr.write(0, &[0; 64]).unwrap();
            let op = SendOp::Read { remote_stag: server.mr.rkey(), remote_to: server.mr.addr() };
            client
                .qp
                .post_send(SendWr { wr_id: reads, op, sgl: client.mr.sge(0, 64).into(), signaled: true })
                .unwrap();
            let wc = client.wait("read");
            assert_eq!((wc.wr_id, wc.opcode), (reads, WcOpcode::Read));
            assert_eq!(client.mr.to_vec(), vec![0x5a; 64], "read {reads}");
        }
        let stats = server_dev.stats();
        assert!(stats.handoffs > 0, "the engine never found its lock held in {reads} Reads: {stats:?}");
    });
}

/// A receive posted while the queue pair is in RTS waits for the connection's next visit:
/// posting it runs no pass, wakes no sleeping engine and queues nothing for a pass, and the
/// visit that the next input brings takes it before it reads, so every message finds its
/// buffer. A send posted after such receives, to a sleeping engine, runs one pass (the
/// poster's visit of its queue pair) and no second one for the receives. Posted once the
/// queue pair has left RTS, a receive is flushed at once, as verbs' are.
#[test]
fn receives_posted_in_rts_wait_for_the_next_pass_and_are_flushed_after() {
    const N: u64 = 16;
    let (client_dev, server_dev) = (open(PollMode::Event), open(PollMode::Event));
    let pairs = connect_many(&client_dev, &server_dev, 1, N as usize);
    let (client, server) = &pairs[0];
    first_round_trip(client, server);
    let before = server_dev.stats();
    for i in 0..N {
        server.post_recv(i);
    }
    // Reading the statistics takes the engine's lock, and letting go of it runs a pass for
    // any queue pair queued for one: none is.
    let after = server_dev.stats();
    assert_eq!(
        (after.passes, after.direct_passes),
        (before.passes, before.direct_passes),
        "posting receives ran passes: {before:?} -> {after:?}"
    );
    assert_eq!(
        (after.sleeps, after.event_wakeups, after.timer_wakeups),
        (before.sleeps, before.event_wakeups, before.timer_wakeups),
        "posting receives woke the engine: {before:?} -> {after:?}"
    );
    // The client's receives, then its first send to its sleeping engine: one pass.
    client.post_recv(100);
    let before = client_dev.stats();
    client.send(1000, 8);
    let after = client_dev.stats();
    assert_eq!(
        (after.passes - before.passes, after.direct_passes - before.direct_passes),
        (1, 1),
        "a send posted after receives: {before:?} -> {after:?}"
    );
    for i in 1..N {
        client.send(1000 + i, 8);
    }
    for i in 0..N {
        server.wait_recv(i, "message into a receive posted while the engine slept");
    }
    assert_eq!(server.qp.state(), QpState::Rts);

    client.qp.disconnect();
    for _ in 0..1000 {
        if server.qp.state() != QpState::Rts {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    assert_ne!(server.qp.state(), QpState::Rts, "the server never saw the disconnect");
    // Whatever the disconnect flushed is reaped first.
    while server.cq.poll().is_some() {}
    server.post_recv(7);
    let wc = server.cq.wait(T).expect("a receive posted after RTS was not flushed");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushError), "{wc:?}");
}
