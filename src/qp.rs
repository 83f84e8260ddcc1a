//! The application's handle on a queue pair: post work requests into lock-free rings the
//! engine drains, ring the doorbell, and read the queue pair's events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use iwarp_mpa::ConnParams;
use iwarp_rdmap::qp::{PostError, QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr, WcOpcode};

use crate::cq::{CompletionQueue, CqShared, WorkCompletion};

/// A work request's completion with a flush error.
pub(crate) fn flushed(qp_num: u32, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    crate::engine::work_completion(qp_num, iwarp_rdmap::qp::Completion::flushed(wr_id, opcode))
}
use crate::device::DeviceShared;

/// What the application's handle and the engine share for one queue pair.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(crate) qp_num: u32,
    pub(crate) sq: ArrayQueue<SendWr>,
    pub(crate) rq: ArrayQueue<RecvWr>,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    events: Mutex<VecDeque<QpEvent>>,
    state: AtomicU8,
    disconnect: AtomicBool,
    pub(crate) config: QpConfig,
    pub(crate) params: ConnParams,
    /// Receive buffers come from a shared receive queue.
    pub(crate) uses_srq: bool,
    /// Send work requests posted and not yet retired: the send queue's occupancy, so that
    /// posting beyond `max_send_wr` fails as verbs' does.
    sq_in_use: AtomicUsize,
    /// Receive work requests posted and not yet completed.
    rq_in_use: AtomicUsize,
    /// The engine has dropped the connection: nothing drains the rings any more, so whoever
    /// finds work in them flushes it.
    retired: AtomicBool,
}

fn state_code(s: QpState) -> u8 {
    match s {
        QpState::Rts => 0,
        QpState::Terminate => 1,
        QpState::Closing => 2,
        QpState::Error => 3,
    }
}

fn state_of(c: u8) -> QpState {
    match c {
        0 => QpState::Rts,
        1 => QpState::Terminate,
        2 => QpState::Closing,
        _ => QpState::Error,
    }
}

impl QpShared {
    pub(crate) fn new(
        qp_num: u32,
        config: QpConfig,
        params: ConnParams,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        uses_srq: bool,
    ) -> QpShared {
        QpShared {
            qp_num,
            sq: ArrayQueue::new(config.max_send_wr.max(1)),
            rq: ArrayQueue::new(config.max_recv_wr.max(1)),
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            events: Mutex::new(VecDeque::new()),
            state: AtomicU8::new(state_code(QpState::Rts)),
            disconnect: AtomicBool::new(false),
            config,
            params,
            uses_srq,
            sq_in_use: AtomicUsize::new(0),
            rq_in_use: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
        }
    }

    /// Engine side: `n` send work requests left the send queue.
    pub(crate) fn sq_retired(&self, n: usize) {
        self.sq_in_use.fetch_sub(n.min(self.sq_in_use.load(Ordering::Acquire)), Ordering::AcqRel);
    }

    /// Engine side: a receive work request completed.
    pub(crate) fn rq_retired(&self) {
        let _ = self.rq_in_use.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
    }

    /// Marks the queue pair as no longer run by the engine and flushes what is in its rings.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.flush_rings();
    }

    /// Completes every work request still in the rings with a flush error. Both the engine
    /// (on retiring) and a poster that finds the queue pair retired call it; each request is
    /// popped, and so completed, once.
    fn flush_rings(&self) {
        while let Some(wr) = self.sq.pop() {
            self.send_cq.push(flushed(self.qp_num, wr.wr_id, wr.op.wc_opcode()));
            self.sq_retired(1);
        }
        while let Some(wr) = self.rq.pop() {
            self.recv_cq.push(flushed(self.qp_num, wr.wr_id, WcOpcode::Recv));
            self.rq_retired();
        }
    }

    /// Poster side: after pushing, flush if the engine has already let go of the queue pair.
    fn after_post(&self) {
        fence(Ordering::SeqCst);
        if self.retired.load(Ordering::SeqCst) {
            self.flush_rings();
        }
    }

    pub(crate) fn push_event(&self, e: QpEvent) {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).push_back(e);
    }

    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    pub(crate) fn take_disconnect(&self) -> bool {
        self.disconnect.swap(false, Ordering::AcqRel)
    }
}

/// A connected queue pair.
///
/// Posting is lock-free (a bounded ring per queue) and makes no system call unless the
/// engine is parked, when the doorbell wakes it. Completions arrive on the completion queues
/// given at connection time.
///
/// ```
/// use std::time::Duration;
/// use iwarp::{Access, ConnectOptions, Device, DeviceConfig, RecvWr, SendOp, SendWr};
///
/// let device = Device::open(DeviceConfig::default());
/// let (pd, cq) = (device.alloc_pd(), device.create_cq(16));
/// let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
/// let addr = listener.local_addr().unwrap();
/// let (spd, scq) = (pd.clone(), cq.clone());
/// let server = std::thread::spawn(move || {
///     let req = listener.accept(Duration::from_secs(5)).unwrap();
///     req.accept(&spd, &scq, &scq, &ConnectOptions::default()).unwrap()
/// });
/// let client = device.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap().qp;
/// let server = server.join().unwrap();
///
/// // A Send from the client lands in the server's posted receive buffer.
/// let inbox = pd.register(16, Access::LOCAL_WRITE).unwrap();
/// server.post_recv(RecvWr { wr_id: 7, sgl: vec![inbox.sge(0, 16)] }).unwrap();
/// let msg = pd.register_bytes(b"ping", Access::NONE).unwrap();
/// client.post_send(SendWr {
///     wr_id: 1,
///     op: SendOp::Send { solicited: false, invalidate: None },
///     sgl: vec![msg.sge(0, 4)],
///     signaled: true,
/// }).unwrap();
/// let mut got = Vec::new();
/// while got.len() < 2 {
///     got.push(cq.wait(Duration::from_secs(5)).unwrap().wr_id);
/// }
/// got.sort();
/// assert_eq!(got, [1, 7]);
/// assert_eq!(&inbox.to_vec()[..4], b"ping");
/// ```
#[derive(Debug, Clone)]
pub struct QueuePair {
    pub(crate) shared: Arc<QpShared>,
    pub(crate) dev: Arc<DeviceShared>,
}

impl QueuePair {
    /// The queue pair's number (in every [`crate::WorkCompletion`] of it).
    pub fn qp_num(&self) -> u32 {
        self.shared.qp_num
    }

    /// What MPA negotiated for the connection (CRC, markers, IRD/ORD, RTR).
    pub fn conn_params(&self) -> ConnParams {
        self.shared.params
    }

    /// The queue pair's settings.
    pub fn config(&self) -> QpConfig {
        self.shared.config
    }

    /// Posts a send-queue work request (Send, RDMA Write, RDMA Read, RFC 7306 operations
    /// where the connection negotiated them).
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let is_ext = wr.op.is_rfc7306();
        if is_ext && !self.shared.config.rfc7306 {
            return Err(PostError::ExtensionNotNegotiated);
        }
        if matches!(wr.op, SendOp::Read { .. }) && wr.sgl.len() != 1 {
            return Err(PostError::ReadNeedsOneSge);
        }
        let depth = self.shared.config.max_send_wr;
        if self.shared.sq_in_use.fetch_add(1, Ordering::AcqRel) >= depth {
            self.shared.sq_retired(1);
            return Err(PostError::QueueFull);
        }
        if self.shared.sq.push(wr).is_err() {
            self.shared.sq_retired(1);
            return Err(PostError::QueueFull);
        }
        self.shared.after_post();
        self.dev.ring();
        Ok(())
    }

    /// Posts a receive buffer.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        if self.shared.uses_srq {
            return Err(PostError::UsesSrq);
        }
        let depth = self.shared.config.max_recv_wr;
        if self.shared.rq_in_use.fetch_add(1, Ordering::AcqRel) >= depth {
            self.shared.rq_retired();
            return Err(PostError::QueueFull);
        }
        if self.shared.rq.push(wr).is_err() {
            self.shared.rq_retired();
            return Err(PostError::QueueFull);
        }
        self.shared.after_post();
        self.dev.ring();
        Ok(())
    }

    /// The queue pair's state as the engine last saw it.
    pub fn state(&self) -> QpState {
        state_of(self.shared.state.load(Ordering::Acquire))
    }

    /// The next event (a Terminate sent or received, the connection lost).
    pub fn poll_event(&self) -> Option<QpEvent> {
        if self.dev.inline() {
            self.dev.progress();
        }
        self.shared.events.lock().unwrap_or_else(PoisonError::into_inner).pop_front()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<QpEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.poll_event() {
                return Some(e);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Closes the connection: outstanding work requests are flushed and the stream is shut.
    pub fn disconnect(&self) {
        self.shared.disconnect.store(true, Ordering::Release);
        self.dev.ring();
    }
}
