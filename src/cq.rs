//! Completion queues: the engine pushes work completions, the application polls them with no
//! lock and no system call, waits for them (blocking or async), or asks to be woken by the
//! next (solicited) one.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::device::DeviceShared;
use crate::{STag, WcOpcode, WcStatus};

/// A work completion, as verbs' `ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The queue pair it belongs to.
    pub qp_num: u32,
    /// The work request's identifier.
    pub wr_id: u64,
    /// The outcome.
    pub status: WcStatus,
    /// The operation.
    pub opcode: WcOpcode,
    /// Bytes transferred (received, for receives).
    pub byte_len: u64,
    /// A received message asked for a solicited event.
    pub solicited: bool,
    /// A received Send with Invalidate invalidated this STag.
    pub invalidated: Option<STag>,
    /// RFC 7306 immediate data received.
    pub imm_data: Option<[u8; 8]>,
}

const ARMED_NONE: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;
const NOTIFIED: u8 = 3;

#[derive(Debug)]
enum Waiter {
    Thread(Thread),
    Task(Waker),
}

/// The state shared by the engine (producer) and the application (consumer).
#[derive(Debug)]
pub(crate) struct CqShared {
    ring: ArrayQueue<WorkCompletion>,
    /// Completions the ring had no room for, in order; only the engine touches it.
    backlog: Mutex<VecDeque<WorkCompletion>>,
    /// Whether the backlog holds anything (kept by the engine, the only pusher).
    backlogged: AtomicBool,
    notify: AtomicU8,
    waiters: Mutex<Vec<Waiter>>,
    /// Whether `waiters` may hold anyone (so a push without waiters takes no lock).
    has_waiters: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CqShared {
    fn new(depth: usize) -> CqShared {
        CqShared {
            ring: ArrayQueue::new(depth.max(1)),
            backlog: Mutex::new(VecDeque::new()),
            backlogged: AtomicBool::new(false),
            notify: AtomicU8::new(ARMED_NONE),
            waiters: Mutex::new(Vec::new()),
            has_waiters: AtomicBool::new(false),
        }
    }

    /// Engine side: publishes a completion (the ring's push is a Release, so every placement
    /// the engine made before it is visible to whoever pops it). Only the engine pushes, so
    /// the backlog's emptiness cannot change under it; with no backlog and no waiter this
    /// takes no lock.
    pub(crate) fn push(&self, wc: WorkCompletion) {
        let direct = !self.backlogged.load(Ordering::Acquire) && self.ring.push(wc).is_ok();
        if !direct {
            let mut backlog = lock(&self.backlog);
            backlog.push_back(wc);
            Self::move_backlog(&self.ring, &mut backlog);
            self.backlogged.store(!backlog.is_empty(), Ordering::Release);
        }
        let armed = self.notify.load(Ordering::Acquire);
        if armed == ARMED_ANY || (armed == ARMED_SOLICITED && wc.solicited) {
            let _ = self.notify.compare_exchange(armed, NOTIFIED, Ordering::AcqRel, Ordering::Acquire);
        }
        // Pairs with the fence in `add_waiter`: either the waiter's re-check sees this
        // completion, or this load sees the waiter.
        fence(Ordering::SeqCst);
        if self.has_waiters.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    fn move_backlog(ring: &ArrayQueue<WorkCompletion>, backlog: &mut VecDeque<WorkCompletion>) {
        while let Some(front) = backlog.pop_front() {
            if let Err(front) = ring.push(front) {
                backlog.push_front(front);
                break;
            }
        }
    }

    /// Registers a waiter; it is woken by the next push.
    fn add_waiter(&self, w: Waiter) {
        lock(&self.waiters).push(w);
        self.has_waiters.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Engine side: moves backlogged completions into the ring as room appears.
    pub(crate) fn drain_backlog(&self) {
        if !self.backlogged.load(Ordering::Acquire) {
            return;
        }
        let mut backlog = lock(&self.backlog);
        Self::move_backlog(&self.ring, &mut backlog);
        self.backlogged.store(!backlog.is_empty(), Ordering::Release);
    }

    fn wake(&self) {
        let mut waiters = lock(&self.waiters);
        self.has_waiters.store(false, Ordering::SeqCst);
        for w in waiters.drain(..) {
            match w {
                Waiter::Thread(t) => t.unpark(),
                Waiter::Task(w) => w.wake(),
            }
        }
    }
}

/// A completion queue.
///
/// ```
/// use iwarp::{Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let cq = device.create_cq(64);
/// assert!(cq.poll().is_none());
/// ```
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
    pub(crate) dev: Arc<DeviceShared>,
}

impl CompletionQueue {
    pub(crate) fn new(dev: Arc<DeviceShared>, depth: usize) -> CompletionQueue {
        CompletionQueue { shared: Arc::new(CqShared::new(depth)), dev }
    }

    /// The next completion, if one is ready. Lock-free; in inline mode it first lets the
    /// engine make progress on this thread.
    pub fn poll(&self) -> Option<WorkCompletion> {
        if let Some(wc) = self.shared.ring.pop() {
            return Some(wc);
        }
        if self.dev.inline() {
            self.dev.progress();
            return self.shared.ring.pop();
        }
        None
    }

    /// Fills `out` with ready completions; returns how many.
    pub fn poll_many(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.poll() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Waits up to `timeout` for a completion: spins briefly, then parks the thread until the
    /// engine pushes one.
    pub fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let spin_until = Instant::now() + Duration::from_micros(20);
        loop {
            if let Some(wc) = self.poll() {
                return Some(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if now < spin_until || self.dev.inline() {
                std::hint::spin_loop();
                continue;
            }
            self.shared.add_waiter(Waiter::Thread(std::thread::current()));
            // Re-check after registering, so a push between the poll and the registration is
            // not missed.
            if let Some(wc) = self.shared.ring.pop() {
                return Some(wc);
            }
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(10)));
        }
    }

    /// Waits asynchronously for the next completion.
    pub fn next(&self) -> NextCompletion<'_> {
        NextCompletion { cq: self }
    }

    /// Arms the queue: the next completion (only a solicited one, with `solicited_only`)
    /// sets the notification that [`CompletionQueue::wait_notification`] waits for, as verbs'
    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) {
        let v = if solicited_only { ARMED_SOLICITED } else { ARMED_ANY };
        self.shared.notify.store(v, Ordering::Release);
    }

    /// Waits up to `timeout` for the notification armed by [`CompletionQueue::req_notify`];
    /// returns whether it fired (and disarms it).
    pub fn wait_notification(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .shared
                .notify
                .compare_exchange(NOTIFIED, ARMED_NONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if self.dev.inline() {
                self.dev.progress();
                continue;
            }
            self.shared.add_waiter(Waiter::Thread(std::thread::current()));
            if self.shared.notify.load(Ordering::Acquire) == NOTIFIED {
                continue;
            }
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(10)));
        }
    }
}

/// The future of [`CompletionQueue::next`].
#[derive(Debug)]
pub struct NextCompletion<'a> {
    cq: &'a CompletionQueue,
}

impl Future for NextCompletion<'_> {
    type Output = WorkCompletion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        if let Some(wc) = self.cq.poll() {
            return Poll::Ready(wc);
        }
        self.cq.shared.add_waiter(Waiter::Task(cx.waker().clone()));
        match self.cq.shared.ring.pop() {
            Some(wc) => Poll::Ready(wc),
            None => {
                if self.cq.dev.inline() {
                    // Nobody else drives an inline device: ask to be polled again.
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}
