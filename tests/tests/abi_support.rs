//! The parts of the public API that a C verbs ABI needs beyond the rest: a completion queue's
//! notification hook (a completion channel's file descriptor), a queue pair's state hook
//! (rdma_cm's DISCONNECTED event), and registration at a caller-chosen address (`ibv_reg_mr`
//! uses the buffer's own address as the tagged offset). Loopback TCP only; every wait is
//! bounded by [`T`].

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use iwarp::{Access, PollMode, QpState, RegionMemory, SendOp, WcOpcode, WcStatus};

mod common;
use common::*;

/// Waits until `cond` holds, at most [`T`].
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {T:?}");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn notify_hook_fires_once_per_arming_after_the_completion() {
    let p = default_pair(PollMode::Adaptive);
    let hits = Arc::new(AtomicUsize::new(0));
    let seen_in_queue = Arc::new(AtomicUsize::new(0));
    let (h, cq) = (hits.clone(), p.server.cq.clone());
    assert!(p.server.cq.set_notify_hook(move || {
        h.fetch_add(1, Ordering::SeqCst);
        let _ = &cq;
    }));
    // A second hook is refused.
    assert!(!p.server.cq.set_notify_hook(|| {}));

    let inbox = p.server.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let msg = p.client.pd.register_bytes(b"ping", Access::NONE).unwrap();
    for i in 0..3u64 {
        p.server.recv(10 + i, vec![inbox.sge(0, 64)]);
    }
    // Not armed: no call.
    p.client.send(1, send_op(false), vec![msg.sge(0, 4)]);
    p.client.expect_ok(1, WcOpcode::Send, "send 1");
    p.server.expect_ok(10, WcOpcode::Recv, "recv 1");
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // Armed: one call, and the completion is in the queue by then.
    p.server.cq.req_notify(false);
    p.client.send(2, send_op(false), vec![msg.sge(0, 4)]);
    p.client.expect_ok(2, WcOpcode::Send, "send 2");
    wait_until("hook after arming", || hits.load(Ordering::SeqCst) == 1);
    if p.server.cq.poll().is_some() {
        seen_in_queue.fetch_add(1, Ordering::SeqCst);
    }
    assert_eq!(seen_in_queue.load(Ordering::SeqCst), 1, "the completion precedes the call");

    // Disarmed by the call: the next completion makes none.
    p.client.send(3, send_op(false), vec![msg.sge(0, 4)]);
    p.client.expect_ok(3, WcOpcode::Send, "send 3");
    p.server.expect_ok(12, WcOpcode::Recv, "recv 3");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // The notification the hook replaces is not left set.
    assert!(!p.server.cq.wait_notification(Duration::from_millis(10)));
}

#[test]
fn notify_hook_fires_for_flushed_work() {
    let p = default_pair(PollMode::Adaptive);
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    p.server.cq.set_notify_hook(move || {
        h.fetch_add(1, Ordering::SeqCst);
    });
    let inbox = p.server.pd.register(64, Access::LOCAL_WRITE).unwrap();
    p.server.recv(7, vec![inbox.sge(0, 64)]);
    p.server.cq.req_notify(false);
    p.server.qp.disconnect();
    let wc = p.server.wait("flushed receive");
    assert_eq!((wc.wr_id, wc.status), (7, WcStatus::WrFlushError));
    wait_until("hook for the flush", || hits.load(Ordering::SeqCst) == 1);
}

#[test]
fn state_hook_reports_the_close_on_both_sides() {
    let p = default_pair(PollMode::Adaptive);
    let client_states = Arc::new(Mutex::new(Vec::new()));
    let server_states = Arc::new(Mutex::new(Vec::new()));
    let (c, s) = (client_states.clone(), server_states.clone());
    assert!(p.client.qp.on_state_change(move |st| c.lock().unwrap().push(st)));
    assert!(p.server.qp.on_state_change(move |st| s.lock().unwrap().push(st)));
    assert!(!p.server.qp.on_state_change(|_| {}), "one hook per queue pair");
    assert!(client_states.lock().unwrap().is_empty(), "no call while in RTS");

    p.client.qp.disconnect();
    wait_until("client hook", || client_states.lock().unwrap().contains(&QpState::Error));
    wait_until("server hook", || server_states.lock().unwrap().contains(&QpState::Error));

    // Set after the change: called at once with the current state.
    let late = Arc::new(Mutex::new(Vec::new()));
    let l = late.clone();
    let q = p.client.qp.clone();
    let p2 = default_pair(PollMode::Adaptive);
    p2.server.qp.disconnect();
    wait_state(&p2.server.qp, QpState::Error, "server closed");
    assert!(p2.server.qp.on_state_change(move |st| l.lock().unwrap().push(st)));
    assert_eq!(late.lock().unwrap().first(), Some(&QpState::Error));
    drop(q);
}

#[test]
#[expect(unsafe_code, reason = "registering foreign memory is the unsafe ibv_reg_mr contract")]
fn register_memory_at_uses_the_chosen_address_for_peers_and_sges() {
    let p = default_pair(PollMode::Adaptive);
    let mut target = vec![0u8; 256];
    let base = target.as_mut_ptr() as u64;
    // SAFETY: `target` outlives the region (deregistered before it is read below) and is not
    // touched meanwhile.
    let memory = unsafe { RegionMemory::from_raw_parts(target.as_mut_ptr(), target.len()) };
    let mr = p
        .server
        .pd
        .register_memory_at(memory, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE), base)
        .unwrap();
    assert_eq!(mr.addr(), base);
    let data = pattern(100, 3);
    let src = p.client.pd.register_bytes(&data, Access::NONE).unwrap();
    let write = SendOp::Write { remote_stag: mr.rkey(), remote_to: base + 50 };
    p.client.send(1, write, vec![src.sge(0, 100)]);
    p.client.expect_ok(1, WcOpcode::Write, "write at the chosen address");
    // A Write just short of the region's end is refused by the peer (bounds from `base`).
    let past = SendOp::Write { remote_stag: mr.rkey(), remote_to: base + 200 };
    p.client.send(2, past, vec![src.sge(0, 100)]);
    // (A Write completes locally once sent; the peer's refusal is a Terminate.)
    wait_state(&p.server.qp, QpState::Error, "server refused the Write past the end");
    drop(mr.deregister().unwrap());
    assert_eq!(&target[50..150], &data[..]);
    assert!(target[..50].iter().all(|&b| b == 0));

    // An address range that wraps is refused.
    let mut buf = vec![0u8; 16];
    // SAFETY: the registration is refused, so nothing ever touches `buf` through it.
    let memory = unsafe { RegionMemory::from_raw_parts(buf.as_mut_ptr(), buf.len()) };
    assert!(p.server.pd.register_memory_at(memory, Access::LOCAL_WRITE, u64::MAX - 4).is_err());
}

#[test]
fn a_polled_completion_frees_its_queue_slot() {
    // Verbs: once a completion is polled, its send-queue slot (and the slots of the unsignaled
    // requests before it) can be posted into at once; so can a polled receive's slot.
    let opts = iwarp::ConnectOptions { max_send_wr: 4, max_recv_wr: 4, ..iwarp::ConnectOptions::default() };
    // Busy engines: completions are pushed while the application spins on the queue.
    let p = pair(PollMode::Busy, &opts, &opts);
    let src = p.client.pd.register_bytes(&pattern(64, 1), Access::NONE).unwrap();
    let target = p.server.pd.register(64, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)).unwrap();
    let write = SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() };
    let post = |i: u64| {
        let wr =
            iwarp::SendWr { wr_id: i, op: write, sgl: vec![src.sge(0, 64)].into(), signaled: i % 2 == 1 };
        p.client.qp.post_send(wr)
    };
    for i in 0..4u64 {
        post(i).unwrap();
    }
    let mut next = 4u64;
    // Busy polling, as perftest does: the completion is seen the moment it is pushed.
    let spin = |what: &str| {
        let deadline = Instant::now() + T;
        loop {
            if let Some(wc) = p.client.cq.poll() {
                return wc;
            }
            assert!(Instant::now() < deadline, "{what}: nothing within {T:?}");
            std::hint::spin_loop();
        }
    };
    while next < 5000 {
        let wc = spin("write completion");
        assert_eq!(wc.status, WcStatus::Success);
        // Two slots are free: the unsignaled request before this one, and this one.
        for _ in 0..2 {
            post(next).unwrap_or_else(|e| panic!("post {next} after a polled completion: {e}"));
            next += 1;
        }
    }
    // The last four requests may still be in flight (the loop keeps the queue full): wait for
    // the last one's completion before the queue is used for Sends.
    while spin("the last write's completion").wr_id != next - 1 {}
    // Receives: the server keeps 4 posted and reposts each as soon as it is polled; the client
    // sends only when a receive is known to be posted (one at a time, in lock step).
    let inbox = p.server.pd.register(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        p.server.recv(i, vec![inbox.sge(0, 64)]);
    }
    for i in 0..500u64 {
        p.client.send(10_000 + i, send_op(false), vec![src.sge(0, 64)]);
        loop {
            let wc = p.server.wait("receive");
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.status, WcStatus::Success);
                p.server
                    .qp
                    .post_recv(iwarp::RecvWr { wr_id: wc.wr_id, sgl: vec![inbox.sge(0, 64)].into() })
                    .unwrap_or_else(|e| panic!("repost after a polled receive: {e}"));
                break;
            }
        }
    }
}
