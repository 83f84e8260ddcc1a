//! What the application's handles and the engine share, and nothing else: the completion
//! rings, a queue pair's work-request rings and flags, and the doorbell. The bottom layer of
//! the package: it imports none of the other modules (the engine and the handles import it).
//!
//! Work requests and completions cross between threads through deques behind locks of their
//! own, held for a push or a take (a flag beside each spares the lock when it is empty); the
//! engine is the only producer of completions and the only consumer of work requests (a queue
//! pair the engine has let go of is flushed by whoever finds work in it, see
//! [`QpShared::retire`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Waker;
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use iwarp_ddp::STag;
use iwarp_mpa::ConnParams;
use iwarp_rdmap::qp::{CheckedSendWr, Completion, QpConfig, QpEvent, QpState, RecvWr, WcOpcode, WcStatus};

use crate::readiness::{Alarm, Poll, Ready};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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

/// A placeholder, as a zeroed `ibv_wc` reads: a successful Send of no bytes on queue pair 0,
/// with `wr_id` 0. For the array that [`crate::CompletionQueue::poll_many`] fills.
impl Default for WorkCompletion {
    fn default() -> WorkCompletion {
        WorkCompletion {
            qp_num: 0,
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            solicited: false,
            invalidated: None,
            imm_data: None,
        }
    }
}

impl WorkCompletion {
    /// The application's view of a queue pair's completion.
    pub(crate) fn new(qp_num: u32, c: Completion) -> WorkCompletion {
        WorkCompletion {
            qp_num,
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            byte_len: c.byte_len,
            solicited: c.solicited,
            invalidated: c.invalidated,
            imm_data: c.imm_data,
        }
    }

    /// A work request's completion with a flush error.
    pub(crate) fn flushed(qp_num: u32, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion::new(qp_num, Completion::flushed(wr_id, opcode))
    }
}

const ARMED_NONE: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;
const NOTIFIED: u8 = 3;

/// Someone waiting for a completion queue, or for a queue pair's next input ([`Arrivals`]).
#[derive(Debug)]
pub(crate) enum Waiter {
    Thread(Thread),
    /// An async task, under the registration number its future keeps (one entry per wait:
    /// polling again replaces the waker instead of adding one).
    Task(u64, Waker),
    /// A thread sleeping in the queue's own readiness poll, woken through its doorbell.
    Poll(Arc<Poll>),
}

/// Wakes and drops every waiter of `waiters` if `has` says there may be any.
#[inline]
fn wake_all(waiters: &Mutex<Vec<Waiter>>, has: &AtomicBool) {
    if has.load(Ordering::SeqCst) {
        wake_listed(waiters, has);
    }
}

/// Wakes and drops every registered waiter (called only when there may be some).
#[cold]
fn wake_listed(waiters: &Mutex<Vec<Waiter>>, has: &AtomicBool) {
    let mut waiters = lock(waiters);
    has.store(false, Ordering::SeqCst);
    for w in waiters.drain(..) {
        match w {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Task(_, w) => w.wake(),
            Waiter::Poll(p) => p.wake(),
        }
    }
}

/// Drops the registration of the thread sleeping in `poll` from `waiters`, if a wake-up has
/// not taken it.
fn remove_poll(waiters: &Mutex<Vec<Waiter>>, has: &AtomicBool, poll: &Arc<Poll>) {
    if !has.load(Ordering::SeqCst) {
        return;
    }
    let mut waiters = lock(waiters);
    waiters.retain(|w| !matches!(w, Waiter::Poll(p) if Arc::ptr_eq(p, poll)));
    if waiters.is_empty() {
        has.store(false, Ordering::SeqCst);
    }
}

/// A callback run when something happens to a queue (see [`CqShared::set_hook`]).
pub(crate) struct Hook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// A completion queue's state, shared by the engine (producer) and the application
/// (consumer).
#[derive(Debug)]
pub(crate) struct CqShared {
    /// The completions, oldest first. Pushed a visit's worth under one lock (a lock-free
    /// bounded queue cost some 75 instructions per push and 50 per pop for a 64 B Send's
    /// completion, against about 15 and 30 here), and grown with use: a queue never refuses
    /// a completion, as the bounded one's overflow list did not either.
    ring: Mutex<VecDeque<WorkCompletion>>,
    /// Whether `ring` may hold a completion: set under its lock by every push, cleared
    /// under it by the pop that empties it, so that a poll of an empty queue takes no lock.
    /// A push's completions are seen by a look that follows it (Release store, Acquire load).
    any: AtomicBool,
    notify: AtomicU8,
    waiters: Mutex<Vec<Waiter>>,
    /// Whether `waiters` may hold anyone (so a push without waiters takes no lock).
    has_waiters: AtomicBool,
    /// Counts `CompletionQueue::interrupt` calls: a wait that sees it change returns.
    interrupts: std::sync::atomic::AtomicU64,
    /// The next task registration number.
    next_task: std::sync::atomic::AtomicU64,
    /// A readiness poll of this queue's own, made on the first blocking wait that uses it:
    /// the descriptors of the queue pairs that complete here, and a doorbell for the
    /// engine's signal. A waiting thread sleeps in it while the engine sleeps, so the input
    /// it waits for wakes it directly (see `Engine::wait_polling`).
    watch: OnceLock<Arc<Poll>>,
    /// Held by the one thread sleeping in `watch`, with the alarm that ends its timed sleeps.
    pub(crate) watching: Mutex<Alarm>,
    /// Whether that thread is registered to be woken by the next signal. A flag rather
    /// than an entry in `waiters`: there is at most one such thread, and registering it
    /// through the list (a lock, a shared pointer's count, and the same again to take it
    /// out) on every sleep cost about 100 instructions and eight locked operations per
    /// message in a ping-pong.
    poll_sleeper: AtomicBool,
    /// Run instead of setting the notification when an armed notification fires.
    hook: OnceLock<Hook>,
    /// How long blocking waits took to see their completion, in microseconds, as a moving
    /// average (waits that found one at once are not counted). While it is within twice the
    /// device's spin time (dense traffic) a wait runs the engine's passes itself before it
    /// sleeps; longer (sparse traffic), a wait sleeps at once, leaving the core to the
    /// threads that have the input.
    wait_us: AtomicU32,
    /// Of the waits that found the engine asleep while `wait_us` said completions come soon:
    /// how long those that ran the engine's passes before sleeping took, and those that slept
    /// at once, in microseconds, as moving averages (0: no sample yet); and how many such
    /// choices were made. See [`CqShared::choose_drive`].
    driven_us: AtomicU32,
    slept_us: AtomicU32,
    pub(crate) choices: AtomicU32,
    /// When the last blocking wait that recorded its time saw its completion, in nanoseconds
    /// after `origin` (0: none yet). A wait that starts long after it (the application was
    /// away: a ping 10 ms after the last answer) is not in dense traffic however short the
    /// waits themselves are, and does not drive (see [`CqShared::choose_drive`]).
    wait_ended: AtomicU64,
    origin: Instant,
}

/// Room a completion queue starts with (at most its depth); it grows with use.
const INITIAL_CQ_ROOM: usize = 16;

/// A blocking wait that starts longer than this after the last one ended is not in dense
/// traffic, whatever the waits' own times say (see [`CqShared::choose_drive`]): the
/// application was away (a ping every 10 ms). Streams block again sooner. Set to the adaptive
/// mode's spin (50 us) instead, it took waits of a stream for sparse ones too (waits that find
/// their completion at once record no end, so the last recorded end can be a while back): the
/// 64 B Read stream with 64 outstanding ran at 0.42 Mmsg/s against 0.52 driving; at 1 ms, 0.51.
const DENSE_GAP: Duration = Duration::from_millis(1);

/// One wait in this many takes the way [`CqShared::choose_drive`] does not prefer, so that
/// both averages follow the traffic.
const DRIVE_EXPLORE: u32 = 8;

/// Moves the moving average in `avg` (microseconds, weight 1/8) towards `took`; with
/// `first_sets`, an average still at 0 takes the first sample as it is.
fn average_into(avg_us: &AtomicU32, took: Duration, first_sets: bool) {
    let took = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
    let avg = avg_us.load(Ordering::Relaxed);
    let next = if first_sets && avg == 0 { took } else { avg - avg / 8 + took / 8 };
    if next != avg {
        avg_us.store(next, Ordering::Relaxed);
    }
}

impl CqShared {
    pub(crate) fn new(depth: usize) -> CqShared {
        CqShared {
            ring: Mutex::new(VecDeque::with_capacity(depth.min(INITIAL_CQ_ROOM))),
            any: AtomicBool::new(false),
            notify: AtomicU8::new(ARMED_NONE),
            waiters: Mutex::new(Vec::new()),
            has_waiters: AtomicBool::new(false),
            interrupts: std::sync::atomic::AtomicU64::new(0),
            next_task: std::sync::atomic::AtomicU64::new(0),
            watch: OnceLock::new(),
            watching: Mutex::new(Alarm::default()),
            poll_sleeper: AtomicBool::new(false),
            hook: OnceLock::new(),
            wait_us: AtomicU32::new(0),
            driven_us: AtomicU32::new(0),
            slept_us: AtomicU32::new(0),
            choices: AtomicU32::new(0),
            wait_ended: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    /// Whether a blocking wait should run the engine's passes before it sleeps, given the
    /// device's spin time (see `wait_us`).
    pub(crate) fn drive_pays(&self, spin: Duration) -> bool {
        u128::from(self.wait_us.load(Ordering::Relaxed)) <= 2 * spin.as_micros()
    }

    /// Records how long a blocking wait that started at `start` took to see its completion
    /// (weight 1/8; a race between two waiting threads loses one sample, which does not
    /// matter here), and when it ended.
    pub(crate) fn record_wait(&self, start: Instant, took: Duration) {
        average_into(&self.wait_us, took, false);
        let ended = (start + took).saturating_duration_since(self.origin);
        self.wait_ended.store(u64::try_from(ended.as_nanos()).unwrap_or(u64::MAX).max(1), Ordering::Relaxed);
    }

    /// Whether a wait starting at `start` comes within [`DENSE_GAP`] of the end of the last
    /// one recorded: the application is waiting back to back.
    fn back_to_back(&self, start: Instant) -> bool {
        let ended = self.wait_ended.load(Ordering::Relaxed);
        let since = start.saturating_duration_since(self.origin);
        ended != 0 && since.saturating_sub(Duration::from_nanos(ended)) <= DENSE_GAP
    }

    /// Whether a blocking wait that started at `start` and finds the engine asleep should
    /// run the engine's passes before it sleeps (`Some(true)`) or sleep at once
    /// (`Some(false)`); `None` when completions come late (see `wait_us`), or when the wait
    /// starts more than [`DENSE_GAP`] after the last one ended (see `wait_ended`), and sleeping
    /// is the only way.
    ///
    /// Which way is quicker depends on the machine and the traffic, so it is measured: the way
    /// whose recent waits were shorter is taken, and every eighth wait takes the other one. A
    /// thread running passes is not asleep in its queue's poll, so the input it waits for
    /// also wakes the engine thread, and the two race for it: on a machine whose threads wake
    /// within microseconds, a ping-pong with 10 ms between round trips took 52-93 us per round
    /// trip driving and 33-43 us sleeping at once, while 16 Reads of 64 B outstanding ran at
    /// 0.53 Mmsg/s driving and 0.21-0.29 sleeping.
    ///
    /// A ping-pong with gaps has short waits, so `wait_us` took it for dense traffic and the
    /// measured choice still drove now and then. Each driven wait left its input to wake the
    /// engine thread, which then spun (adaptive mode) beside the application: with both
    /// threads of the 2-core development machine on one core, the engine thread was woken in a
    /// third to a half of the round trips 10 ms apart. A wait that comes long after the last
    /// one therefore sleeps at once.
    pub(crate) fn choose_drive(&self, spin: Duration, start: Instant) -> Option<bool> {
        if !self.drive_pays(spin) || !self.back_to_back(start) {
            return None;
        }
        let n = self.choices.fetch_add(1, Ordering::Relaxed);
        let prefer = self.driven_us.load(Ordering::Relaxed) <= self.slept_us.load(Ordering::Relaxed);
        Some(if n % DRIVE_EXPLORE == DRIVE_EXPLORE - 1 { !prefer } else { prefer })
    }

    /// Records how long a wait that made the choice of [`CqShared::choose_drive`] took.
    pub(crate) fn record_choice(&self, drove: bool, took: Duration) {
        average_into(if drove { &self.driven_us } else { &self.slept_us }, took, true);
    }

    /// Sets the notification hook (once; false if one was set already): from then on an
    /// armed notification that fires calls it and disarms, instead of staying set for
    /// [`CqShared::take_notification`].
    pub(crate) fn set_hook(&self, f: Box<dyn Fn() + Send + Sync>) -> bool {
        self.hook.set(Hook(f)).is_ok()
    }

    /// The queue's own readiness poll, if made.
    pub(crate) fn watch(&self) -> Option<&Arc<Poll>> {
        self.watch.get()
    }

    /// Makes the queue's own readiness poll (once); false if the system refused one.
    pub(crate) fn make_watch(&self) -> bool {
        if self.watch.get().is_none()
            && let Ok(p) = Poll::new()
        {
            let _ = self.watch.set(Arc::new(p));
        }
        self.watch.get().is_some()
    }

    /// Engine side: publishes a completion without waking anyone; [`CqShared::signal`] after
    /// a batch of pushes wakes the waiters once. The push happens under the queue's lock, so
    /// every placement the engine made before it is visible to whoever pops it.
    pub(crate) fn push_quiet(&self, wc: WorkCompletion) {
        self.push_all_quiet([wc], || {});
    }

    /// Engine side: publishes completions, in order, under one lock, without waking anyone
    /// (see [`CqShared::push_quiet`]); whether there were any. `before_visible` runs after
    /// the pushes, before any poll can take one of them.
    pub(crate) fn push_all_quiet(
        &self,
        wcs: impl IntoIterator<Item = WorkCompletion>,
        before_visible: impl FnOnce(),
    ) -> bool {
        let mut ring = lock(&self.ring);
        let before = ring.len();
        // One reservation for a batch of known length, rather than a check per push.
        ring.extend(wcs);
        let pushed = ring.len() > before;
        let solicited = pushed && ring.range(before..).any(|wc| wc.solicited);
        before_visible();
        self.any.store(!ring.is_empty(), Ordering::Release);
        drop(ring);
        if pushed {
            self.fire_notification(solicited);
        }
        pushed
    }

    /// Fires an armed notification for completions just pushed (`solicited`: one of them
    /// asked for a solicited event).
    #[inline]
    fn fire_notification(&self, solicited: bool) {
        let armed = self.notify.load(Ordering::Acquire);
        if (armed == ARMED_ANY || (armed == ARMED_SOLICITED && solicited))
            && self.notify.compare_exchange(armed, NOTIFIED, Ordering::AcqRel, Ordering::Acquire).is_ok()
            && let Some(hook) = self.hook.get()
        {
            // One event per arming: disarm before the call, so a completion the hook's
            // caller pushes next does not fire again until the queue is re-armed.
            let _ = self.notify.compare_exchange(NOTIFIED, ARMED_NONE, Ordering::AcqRel, Ordering::Acquire);
            (hook.0)();
        }
    }

    /// Application side: the oldest completion, if any. An empty queue is told by one load,
    /// without the lock.
    #[inline]
    pub(crate) fn pop(&self) -> Option<WorkCompletion> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut ring = lock(&self.ring);
        let wc = ring.pop_front();
        self.any.store(!ring.is_empty(), Ordering::Release);
        wc
    }

    /// Application side: the oldest completions, as many as fit in `out`, under one lock;
    /// how many. An empty queue is told by one load, as for [`CqShared::pop`].
    pub(crate) fn pop_into(&self, out: &mut [WorkCompletion]) -> usize {
        if out.is_empty() || !self.any.load(Ordering::Acquire) {
            return 0;
        }
        let mut ring = lock(&self.ring);
        let n = out.len().min(ring.len());
        // Copied where they lie (the ring's two runs), then let go of at once.
        let (first, second) = ring.as_slices();
        let k = n.min(first.len());
        out[..k].copy_from_slice(&first[..k]);
        out[k..n].copy_from_slice(&second[..n - k]);
        ring.drain(..n);
        self.any.store(!ring.is_empty(), Ordering::Release);
        n
    }

    /// Engine side: wakes whoever waits for this queue (after one or more pushes).
    pub(crate) fn signal(&self) {
        // Pairs with the fence in `add_waiter`: either the waiter's re-check sees the
        // completions pushed before this call, or this load sees the waiter.
        fence(Ordering::SeqCst);
        if self.poll_sleeper.load(Ordering::SeqCst)
            && self.poll_sleeper.swap(false, Ordering::AcqRel)
            && let Some(poll) = self.watch.get()
        {
            poll.wake();
        }
        wake_all(&self.waiters, &self.has_waiters);
    }

    /// Interrupts the waits in progress (see `CompletionQueue::interrupt`).
    pub(crate) fn interrupt(&self) {
        self.interrupts.fetch_add(1, Ordering::SeqCst);
        self.signal();
    }

    /// The interrupt count, read when a wait starts.
    pub(crate) fn interrupts(&self) -> u64 {
        self.interrupts.load(Ordering::SeqCst)
    }

    /// Whether a wait that started at interrupt count `epoch` should stop sleeping: a
    /// completion is there, or the queue was interrupted since. Read after registering as a
    /// waiter, so that a push or an interrupt in between is not missed.
    pub(crate) fn wake_due(&self, epoch: u64) -> bool {
        self.any.load(Ordering::Acquire) || self.interrupts() != epoch
    }

    /// Publishes one completion and wakes the waiters.
    pub(crate) fn push(&self, wc: WorkCompletion) {
        self.push_quiet(wc);
        self.signal();
    }

    /// Registers a waiter; it is woken by the next signal.
    pub(crate) fn add_waiter(&self, w: Waiter) {
        lock(&self.waiters).push(w);
        self.has_waiters.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Registers (or refreshes) the task waiter `id`, handing out an id on the first call;
    /// it is woken by the next signal. Returns the id.
    pub(crate) fn register_task(&self, id: Option<u64>, waker: &Waker) -> u64 {
        let mut waiters = lock(&self.waiters);
        let id = id.unwrap_or_else(|| self.next_task.fetch_add(1, Ordering::Relaxed));
        match waiters.iter_mut().find_map(|w| match w {
            Waiter::Task(i, w) if *i == id => Some(w),
            _ => None,
        }) {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => waiters.push(Waiter::Task(id, waker.clone())),
        }
        drop(waiters);
        self.has_waiters.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        id
    }

    /// Registers the thread about to sleep in the queue's own poll (holding `watching`): the
    /// next signal wakes the poll. Pairs with the fence in [`CqShared::signal`], as
    /// [`CqShared::add_waiter`] does.
    pub(crate) fn add_poll_sleeper(&self) {
        self.poll_sleeper.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Drops the registration of the thread sleeping in the queue's own poll, if a signal
    /// has not taken it.
    pub(crate) fn remove_poll_sleeper(&self) {
        self.poll_sleeper.store(false, Ordering::Release);
    }

    /// Drops the task waiter `id` (its future is gone).
    pub(crate) fn unregister_task(&self, id: u64) {
        lock(&self.waiters).retain(|w| !matches!(w, Waiter::Task(i, _) if *i == id));
    }

    /// Arms the notification (verbs' `ibv_req_notify_cq`).
    pub(crate) fn arm(&self, solicited_only: bool) {
        let v = if solicited_only { ARMED_SOLICITED } else { ARMED_ANY };
        self.notify.store(v, Ordering::Release);
    }

    /// Takes a fired notification (disarming it); whether there was one.
    pub(crate) fn take_notification(&self) -> bool {
        self.notify.compare_exchange(NOTIFIED, ARMED_NONE, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Whether the armed notification has fired.
    pub(crate) fn notified(&self) -> bool {
        self.notify.load(Ordering::Acquire) == NOTIFIED
    }
}

/// The engine's doorbell: which queue pairs have new work, and how to wake a parked engine.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// The engine is (about to be) asleep: posters must wake it.
    parked: AtomicBool,
    /// Wakes whoever sleeps in the engine's readiness poll.
    poll: OnceLock<Arc<Poll>>,
    /// Wakes an engine parked without a readiness poll.
    thread: OnceLock<Thread>,
    /// Keys of queue pairs with posted work the engine has not looked at yet; each key is
    /// queued at most once until the engine takes it (see [`QpShared::schedule`]).
    pending: SegQueue<usize>,
    /// Readiness events the engine thread collected while another thread held the core: it
    /// leaves them here instead of sleeping on the lock, and the holder takes them before it
    /// lets go (`Engine::engine_pass`, `Engine::let_go`).
    handoff: SegQueue<Ready>,
}

impl Doorbell {
    pub(crate) fn set_poll(&self, poll: Arc<Poll>) {
        let _ = self.poll.set(poll);
    }

    pub(crate) fn set_thread(&self, thread: Thread) {
        let _ = self.thread.set(thread);
    }

    /// Wakes a parked engine. Costs one atomic load when the engine is awake.
    pub(crate) fn ring(&self) {
        if self.parked.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Wakes the engine whether or not it is parked.
    pub(crate) fn wake(&self) {
        if let Some(p) = self.poll.get() {
            p.wake();
        } else if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Whether the engine sleeps (or is about to).
    pub(crate) fn parked(&self) -> bool {
        self.parked.load(Ordering::SeqCst)
    }

    /// Engine side: announces (true) or ends (false) a park. After announcing, the engine
    /// looks for work once more before it sleeps: work queued before the flag was visible is
    /// found then, work queued after it rings.
    pub(crate) fn set_parked(&self, parked: bool) {
        self.parked.store(parked, Ordering::SeqCst);
    }

    /// Engine side: the next queue pair with new work. An empty queue is told by two loads:
    /// the segment queue's own pop fences before it reports empty, which every pass paid for
    /// nothing (the engine's park and the posters' look at it are ordered by their own
    /// sequentially consistent accesses, see [`Doorbell::set_parked`]).
    pub(crate) fn take(&self) -> Option<usize> {
        if self.pending.is_empty() { None } else { self.pending.pop() }
    }

    /// Whether some queue pair has new work queued.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Engine thread: leaves a readiness event for the holder of the core.
    pub(crate) fn hand_off(&self, ready: Ready) {
        self.handoff.push(ready);
    }

    /// The next readiness event left by the engine thread (an empty queue told as in
    /// [`Doorbell::take`]; the hand-off is ordered by the fences of `Engine::engine_pass` and
    /// `Engine::let_go`).
    pub(crate) fn take_handed_off(&self) -> Option<Ready> {
        if self.handoff.is_empty() { None } else { self.handoff.pop() }
    }

    /// Whether the engine thread left readiness events.
    pub(crate) fn handed_off(&self) -> bool {
        !self.handoff.is_empty()
    }
}

/// A ring of posted work requests: any number of posting threads, one taker (the engine).
///
/// A lock around a `VecDeque`: it holds no memory until the first post, grows to the most
/// requests ever outstanding at once and keeps that capacity, so steady posting allocates
/// nothing (a segment queue allocates and zeroes a block every few dozen entries). The
/// engine takes everything posted at once by swapping the contents with an empty deque of
/// its own ([`WrRing::take_all`]): one lock per batch, and the lock is never held while a
/// request is worked on.
#[derive(Debug)]
pub(crate) struct WrRing<T> {
    queue: Mutex<VecDeque<T>>,
    /// Whether `queue` may hold a request: set under the lock by every push, cleared under it
    /// when the ring is emptied, so a taker that finds it clear takes no lock. A visit looks
    /// at both rings of its queue pair, and most of the time one or both are empty (in a
    /// ping-pong, three of every four looks): a lock and an unlock each, for nothing.
    /// A push that completed before the taker's look (a receive posted before the peer was
    /// told to send, whose message the look follows) is seen: the flag is written before the
    /// lock is let go, and read with Acquire after the system call that brought the input.
    any: AtomicBool,
}

impl<T> Default for WrRing<T> {
    fn default() -> WrRing<T> {
        WrRing { queue: Mutex::new(VecDeque::new()), any: AtomicBool::new(false) }
    }
}

impl<T> WrRing<T> {
    /// Appends one request.
    pub(crate) fn push(&self, wr: T) {
        let mut queue = lock(&self.queue);
        queue.push_back(wr);
        self.any.store(true, Ordering::Release);
    }

    /// Appends the requests of `wrs`, in order, under one lock, leaving `wrs` empty: where
    /// the ring is empty, by swapping the two deques (the caller gets the ring's spare one),
    /// else in one piece.
    pub(crate) fn push_list(&self, wrs: &mut VecDeque<T>) {
        let mut queue = lock(&self.queue);
        if queue.is_empty() {
            std::mem::swap(&mut *queue, wrs);
        } else {
            queue.append(wrs);
        }
        self.any.store(!queue.is_empty(), Ordering::Release);
    }

    /// The oldest request, if any.
    pub(crate) fn pop(&self) -> Option<T> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut queue = lock(&self.queue);
        let wr = queue.pop_front();
        self.any.store(!queue.is_empty(), Ordering::Release);
        wr
    }

    /// Moves every queued request, in order, to the end of `into`. With `into` empty this
    /// swaps the two deques, so the ring keeps `into`'s capacity for later posts and the
    /// caller gets the ring's; no request is copied under the lock.
    pub(crate) fn take_all(&self, into: &mut VecDeque<T>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut queue = lock(&self.queue);
        if into.is_empty() {
            std::mem::swap(&mut *queue, into);
        } else {
            into.extend(queue.drain(..));
        }
        self.any.store(false, Ordering::Release);
    }

    /// Whether the ring may hold a request (false: it holds none that was pushed before
    /// this look; see `any`).
    #[inline]
    pub(crate) fn may_hold(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether no request is queued.
    pub(crate) fn is_empty(&self) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return true;
        }
        lock(&self.queue).is_empty()
    }

    /// How many requests the ring holds room for without allocating.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        lock(&self.queue).capacity()
    }
}

/// Takes up to `n` of the `max` entries `in_use` counts, as many as are free, in one update;
/// how many.
fn reserve(in_use: &AtomicUsize, n: usize, max: usize) -> usize {
    match in_use.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        let k = n.min(max.saturating_sub(v));
        (k > 0).then_some(v + k)
    }) {
        Ok(before) => n.min(max.saturating_sub(before)),
        Err(_) => 0,
    }
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

/// A count of live connections (a listener's), shared with each connection it counts: a
/// connection holds one unit from its start until what the engine and the application keep
/// of it is gone.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnCount(Arc<AtomicUsize>);

impl ConnCount {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// How many times the engine has taken input off a connection, and the threads waiting for
/// the next time. Input may be RDMA Write data, which completes nothing at its target: a
/// thread that looks at memory for it can sleep here between looks instead of spinning
/// (which, on a machine whose cores are all busy, keeps the core from the engine thread that
/// would place the data).
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    epoch: AtomicU64,
    /// Counts `QueuePair::interrupt_input` calls: a wait that sees it change returns.
    interrupts: AtomicU64,
    /// Threads parked until the next bump, and readiness polls a thread sleeps in (see
    /// `Engine::wait_input_polling`), woken through their doorbells.
    waiters: Mutex<Vec<Waiter>>,
    /// Whether `waiters` may hold anyone (so a bump without waiters takes no lock).
    has_waiters: AtomicBool,
}

impl Arrivals {
    /// The count so far. An Acquire: what the engine placed before its bump is visible.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// How many interrupts there have been; a wait reads it at its start.
    pub(crate) fn interrupts(&self) -> u64 {
        self.interrupts.load(Ordering::SeqCst)
    }

    /// Whether a wait that started with the counts `seen` and `interrupts` is over. SeqCst:
    /// pairs with `bump` and `interrupt` (either they see the waiter, or this sees them).
    pub(crate) fn due(&self, seen: u64, interrupts: u64) -> bool {
        self.epoch.load(Ordering::SeqCst) != seen || self.interrupts.load(Ordering::SeqCst) != interrupts
    }

    /// Engine side: input was taken (and placed), or the link went down.
    pub(crate) fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
    }

    /// Ends the waits in progress (see `QueuePair::interrupt_input`).
    pub(crate) fn interrupt(&self) {
        self.interrupts.fetch_add(1, Ordering::SeqCst);
        self.wake_all();
    }

    fn wake_all(&self) {
        wake_all(&self.waiters, &self.has_waiters);
    }

    /// Waits until the count differs from `seen`, an interrupt comes (the interrupt count
    /// differs from `interrupts`), or `deadline` (`None`: no deadline, no timer); the count
    /// then.
    pub(crate) fn wait(&self, seen: u64, interrupts: u64, deadline: Option<Instant>) -> u64 {
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if self.due(seen, interrupts) || left.is_some_and(|l| l.is_zero()) {
                return self.epoch();
            }
            {
                let mut waiters = lock(&self.waiters);
                let me = std::thread::current();
                if !waiters.iter().any(|w| matches!(w, Waiter::Thread(t) if t.id() == me.id())) {
                    waiters.push(Waiter::Thread(me));
                }
                self.has_waiters.store(true, Ordering::SeqCst);
            }
            if self.due(seen, interrupts) {
                // Left in the list: a later bump unparks this thread once for nothing.
                return self.epoch();
            }
            match left {
                Some(left) => std::thread::park_timeout(left),
                None => std::thread::park(),
            }
        }
    }

    /// Has the next bump or interrupt wake `poll` (a thread about to sleep in it); whether
    /// the wait is over already (see [`Arrivals::due`]; then the caller does not sleep).
    pub(crate) fn add_poll_waiter(&self, poll: &Arc<Poll>, seen: u64, interrupts: u64) -> bool {
        lock(&self.waiters).push(Waiter::Poll(poll.clone()));
        self.has_waiters.store(true, Ordering::SeqCst);
        self.due(seen, interrupts)
    }

    /// Takes `poll` off the waiters (its thread is awake).
    pub(crate) fn remove_poll_waiter(&self, poll: &Arc<Poll>) {
        remove_poll(&self.waiters, &self.has_waiters, poll);
    }
}

/// What the application's handle and the engine share for one queue pair.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub(crate) qp_num: u32,
    /// The engine's key for the connection (its readiness token and doorbell entry).
    pub(crate) key: usize,
    /// Posted work requests. Unbounded rings (memory grows with use, not with the configured
    /// depth); the depth is enforced by the occupancy counters below.
    pub(crate) sq: WrRing<CheckedSendWr>,
    pub(crate) rq: WrRing<RecvWr>,
    pub(crate) send_cq: Arc<CqShared>,
    pub(crate) recv_cq: Arc<CqShared>,
    events: Mutex<VecDeque<QpEvent>>,
    state: AtomicU8,
    disconnect: AtomicBool,
    /// The key is in the doorbell's queue (or the engine is about to look at the rings).
    scheduled: AtomicBool,
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
    /// The count this connection is one of (a listener's), if any.
    count: Option<ConnCount>,
    /// Called with the new state whenever the state changes.
    state_hook: OnceLock<StateHook>,
    /// The engine's reads of the connection's input.
    pub(crate) arrivals: Arrivals,
}

/// A callback run when a queue pair's state changes (see [`QpShared::set_state_hook`]).
pub(crate) struct StateHook(Box<dyn Fn(QpState) + Send + Sync>);

impl std::fmt::Debug for StateHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateHook")
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        if let Some(c) = &self.count {
            c.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl QpShared {
    pub(crate) fn new(
        qp_num: u32,
        key: usize,
        config: QpConfig,
        params: ConnParams,
        cqs: (Arc<CqShared>, Arc<CqShared>),
        uses_srq: bool,
        count: Option<ConnCount>,
    ) -> QpShared {
        if let Some(c) = &count {
            c.0.fetch_add(1, Ordering::AcqRel);
        }
        QpShared {
            qp_num,
            key,
            sq: WrRing::default(),
            rq: WrRing::default(),
            send_cq: cqs.0,
            recv_cq: cqs.1,
            events: Mutex::new(VecDeque::new()),
            state: AtomicU8::new(state_code(QpState::Rts)),
            disconnect: AtomicBool::new(false),
            scheduled: AtomicBool::new(false),
            config,
            params,
            uses_srq,
            sq_in_use: AtomicUsize::new(0),
            rq_in_use: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
            count,
            state_hook: OnceLock::new(),
            arrivals: Arrivals::default(),
        }
    }

    /// Sets the state hook (once; false if one was set already).
    pub(crate) fn set_state_hook(&self, f: Box<dyn Fn(QpState) + Send + Sync>) -> bool {
        self.state_hook.set(StateHook(f)).is_ok()
    }

    /// Poster side: takes up to `n` send-queue entries, as many as are free; how many.
    pub(crate) fn reserve_sq(&self, n: usize) -> usize {
        reserve(&self.sq_in_use, n, self.config.max_send_wr)
    }

    /// The queue pair starts with `n` receives posted (those handed over with the connection,
    /// posted before it went live): they hold their receive-queue entries as posted ones do,
    /// until they complete. Without this, a program that posted receives before connecting
    /// (libfabric's verbs provider posts its whole receive queue) could post that many more
    /// than the queue holds; the queue pair refused the extra ones, which completed with
    /// `LocalLengthError`.
    pub(crate) fn with_preposted_recvs(self, n: usize) -> QpShared {
        self.rq_in_use.store(n, Ordering::Release);
        self
    }

    /// Poster side: takes up to `n` receive-queue entries, as many as are free; how many.
    pub(crate) fn reserve_rq(&self, n: usize) -> usize {
        reserve(&self.rq_in_use, n, self.config.max_recv_wr)
    }

    /// Engine side (or a poster giving back a reservation): `n` send work requests left the
    /// send queue.
    pub(crate) fn sq_retired(&self, n: usize) {
        if n == 0 {
            return;
        }
        let _ =
            self.sq_in_use.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)));
    }

    /// Engine side: `n` receive work requests completed.
    pub(crate) fn rq_retired(&self, n: usize) {
        if n == 0 {
            return;
        }
        let _ =
            self.rq_in_use.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| Some(v.saturating_sub(n)));
    }

    /// Poster side: after pushing work, tells the engine this queue pair has some (once until
    /// the engine looks). Flushes instead, and returns false, if the engine has already let
    /// go of the queue pair. The caller then makes sure a sleeping engine learns of it.
    pub(crate) fn schedule(&self, doorbell: &Doorbell) -> bool {
        self.schedule_once(doorbell).is_some()
    }

    /// As [`QpShared::schedule`], saying whether this call queued the queue pair (`Some(true)`)
    /// or found it queued since the engine last looked (`Some(false)`); `None` when it flushed.
    pub(crate) fn schedule_once(&self, doorbell: &Doorbell) -> Option<bool> {
        fence(Ordering::SeqCst);
        if self.retired.load(Ordering::SeqCst) {
            self.flush_rings();
            return None;
        }
        let queued = !self.scheduled.swap(true, Ordering::AcqRel);
        if queued {
            doorbell.pending.push(self.key);
        }
        Some(queued)
    }

    /// Engine side: about to drain the rings; posts from now on schedule the queue pair again.
    pub(crate) fn unschedule(&self) {
        self.scheduled.store(false, Ordering::Release);
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
        let mut any = false;
        // Each slot is given back before its completion is visible (see `publish`).
        while let Some(wr) = self.sq.pop() {
            self.sq_retired(1);
            self.send_cq.push_quiet(WorkCompletion::flushed(
                self.qp_num,
                wr.wr().wr_id,
                wr.wr().op.wc_opcode(),
            ));
            any = true;
        }
        while let Some(wr) = self.rq.pop() {
            self.rq_retired(1);
            self.recv_cq.push_quiet(WorkCompletion::flushed(self.qp_num, wr.wr_id, WcOpcode::Recv));
            any = true;
        }
        if any {
            self.send_cq.signal();
            self.recv_cq.signal();
        }
    }

    pub(crate) fn push_event(&self, e: QpEvent) {
        lock(&self.events).push_back(e);
    }

    pub(crate) fn pop_event(&self) -> Option<QpEvent> {
        lock(&self.events).pop_front()
    }

    /// Records the state the engine saw; whether it changed and a state hook waits to hear of
    /// it ([`QpShared::run_state_hook`], which the engine calls once it has let go of its
    /// core: see `Engine::let_go`).
    #[must_use]
    pub(crate) fn set_state(&self, s: QpState) -> bool {
        // Set after every visit, and almost always unchanged: a read first, so that takes no
        // locked update.
        if self.state.load(Ordering::Acquire) == state_code(s) {
            return false;
        }
        let old = self.state.swap(state_code(s), Ordering::AcqRel);
        old != state_code(s) && self.state_hook.get().is_some()
    }

    /// Tells the state hook of a change [`QpShared::set_state`] recorded.
    pub(crate) fn run_state_hook(&self, s: QpState) {
        if let Some(hook) = self.state_hook.get() {
            (hook.0)(s);
        }
    }

    pub(crate) fn state(&self) -> QpState {
        state_of(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn request_disconnect(&self) {
        self.disconnect.store(true, Ordering::Release);
    }

    pub(crate) fn take_disconnect(&self) -> bool {
        // Looked at on every visit: a read first, so the usual answer takes no locked update.
        self.disconnect.load(Ordering::Acquire) && self.disconnect.swap(false, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{Arrivals, CqShared, DENSE_GAP, DRIVE_EXPLORE, WrRing};

    #[test]
    fn arrivals_wake_a_waiter_and_time_out_without_one() {
        let a = Arc::new(Arrivals::default());
        let seen = a.epoch();
        // Nothing arrives: the wait ends at its deadline with the same count.
        let deadline = std::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(a.wait(seen, 0, Some(deadline)), seen);
        // A bump from another thread ends a long wait.
        let bumper = {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                a.bump();
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        assert_eq!(a.wait(seen, 0, Some(deadline)), seen + 1);
        bumper.join().unwrap();
        // A count that already moved returns at once.
        assert_eq!(a.wait(seen, 0, Some(std::time::Instant::now())), seen + 1);
        // An interrupt ends a long wait without a bump; a wait that starts after it waits.
        let seen = a.epoch();
        let interrupter = {
            let a = Arc::clone(&a);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                a.interrupt();
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        assert_eq!(a.wait(seen, 0, Some(deadline)), seen);
        interrupter.join().unwrap();
        assert_eq!(a.interrupts(), 1);
        let deadline = std::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(a.wait(seen, a.interrupts(), Some(deadline)), seen);
    }

    #[test]
    fn waits_drive_the_engine_only_while_completions_come_soon() {
        let spin = Duration::from_micros(50);
        let cq = CqShared::new(4);
        assert!(cq.drive_pays(spin), "a new queue drives");
        // One slow wait (a sparse message) is enough to stop.
        cq.record_wait(Instant::now(), Duration::from_millis(5));
        assert!(!cq.drive_pays(spin));
        // Dense traffic brings it back within a few waits, and a single late one among them
        // does not stop it.
        for _ in 0..24 {
            cq.record_wait(Instant::now(), Duration::from_micros(20));
        }
        assert!(cq.drive_pays(spin));
        cq.record_wait(Instant::now(), Duration::from_micros(400));
        assert!(cq.drive_pays(spin));
        // A wait too long for the counter saturates instead of wrapping.
        cq.record_wait(Instant::now(), Duration::from_secs(u64::MAX / 4));
        assert!(!cq.drive_pays(spin));
    }

    #[test]
    fn waits_take_the_way_that_was_quicker_and_try_the_other_now_and_then() {
        let spin = Duration::from_micros(50);
        let cq = CqShared::new(4);
        // Waits back to back: each starts right after the last one ended.
        let ways = |cq: &CqShared| {
            (0..DRIVE_EXPLORE)
                .map(|_| {
                    cq.record_wait(Instant::now(), Duration::from_micros(20));
                    cq.choose_drive(spin, Instant::now()).unwrap()
                })
                .collect::<Vec<_>>()
        };
        // A new queue drives, and tries sleeping once in eight waits.
        let tried = ways(&cq);
        assert_eq!(tried.iter().filter(|&&d| d).count(), 7, "{tried:?}");
        // Sleeping at once turned out quicker (a sparse ping-pong): it becomes the way, and
        // driving is tried once in eight.
        cq.record_choice(true, Duration::from_micros(55));
        cq.record_choice(false, Duration::from_micros(30));
        let tried = ways(&cq);
        assert_eq!(tried.iter().filter(|&&d| d).count(), 1, "{tried:?}");
        // Driving gets quicker (dense traffic): the average moves and the choice follows.
        for _ in 0..16 {
            cq.record_choice(true, Duration::from_micros(5));
        }
        let tried = ways(&cq);
        assert_eq!(tried.iter().filter(|&&d| d).count(), 7, "{tried:?}");
        // Completions that come late leave no choice: the wait sleeps.
        cq.record_wait(Instant::now(), Duration::from_millis(5));
        assert_eq!(cq.choose_drive(spin, Instant::now()), None);
    }

    #[test]
    fn a_wait_long_after_the_last_one_sleeps_at_once() {
        let spin = Duration::from_micros(50);
        let cq = CqShared::new(4);
        let start = Instant::now();
        // No wait has ended yet: nothing says the traffic is dense.
        assert_eq!(cq.choose_drive(spin, start), None);
        // Short waits back to back: the measured choice.
        cq.record_wait(start, Duration::from_micros(20));
        assert!(cq.choose_drive(spin, start + Duration::from_micros(30)).is_some());
        assert!(cq.choose_drive(spin, start + DENSE_GAP).is_some());
        // The same short waits with the application away 10 ms between them (a sparse
        // ping-pong): sleep at once.
        assert_eq!(cq.choose_drive(spin, start + Duration::from_millis(10)), None);
        // A wait that starts before the last recorded end (another thread's) is back to back.
        assert!(cq.choose_drive(spin, start).is_some());
    }

    /// Posts `wrs` as a poster does, through a deque of its own.
    fn push_all<T>(ring: &WrRing<T>, wrs: impl IntoIterator<Item = T>) {
        let mut list: VecDeque<T> = wrs.into_iter().collect();
        ring.push_list(&mut list);
        assert!(list.is_empty());
    }

    #[test]
    fn wr_ring_keeps_posting_order_across_takes() {
        let ring = WrRing::default();
        let mut taken = VecDeque::new();
        push_all(&ring, 0..3u32);
        // Appended after what the ring holds.
        push_all(&ring, 3..5);
        assert_eq!(ring.pop(), Some(0));
        ring.take_all(&mut taken);
        assert!(ring.is_empty());
        // Taking into a deque that still holds requests appends after them.
        push_all(&ring, [5, 6]);
        ring.take_all(&mut taken);
        assert_eq!(taken.iter().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(ring.pop(), None);
    }

    #[test]
    fn wr_ring_holds_no_memory_idle_and_stops_growing_in_steady_use() {
        let ring = WrRing::default();
        assert_eq!(ring.capacity(), 0, "an idle queue pair's ring holds nothing");
        let mut taken: VecDeque<u64> = VecDeque::new();
        // The poster's deque, as `post_list` keeps one per thread.
        let mut list: VecDeque<u64> = VecDeque::new();
        let mut caps = Vec::new();
        let mut next = 0;
        for round in 0..8 {
            list.extend(next..next + 20);
            ring.push_list(&mut list);
            next += 20;
            ring.take_all(&mut taken);
            assert_eq!(taken.len(), 20);
            assert_eq!(taken.front().copied(), Some(round * 20));
            taken.clear();
            caps.push((ring.capacity(), taken.capacity(), list.capacity()));
        }
        // Memory follows the most requests outstanding at once, and once the three deques
        // have grown to it the poster, the ring and the taker swap them without allocating
        // again.
        assert!(caps.iter().all(|&(a, b, c)| a <= 64 && b <= 64 && c <= 64), "{caps:?}");
        assert!(caps[2].0 >= 20 && caps[2].1 >= 20 && caps[2].2 >= 20, "{caps:?}");
        assert!(caps[2..].iter().all(|&c| c == caps[2]), "{caps:?}");
    }

    #[test]
    fn wr_ring_takes_every_request_of_concurrent_posters_once_in_each_posters_order() {
        const POSTERS: usize = 4;
        const EACH: u64 = 5000;
        let ring = Arc::new(WrRing::default());
        let posters: Vec<_> = (0..POSTERS)
            .map(|p| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        push_all(&ring, [(p, i)]);
                    }
                })
            })
            .collect();
        let mut next = [0u64; POSTERS];
        let mut taken = VecDeque::new();
        let mut take = |next: &mut [u64; POSTERS]| {
            ring.take_all(&mut taken);
            for (p, i) in taken.drain(..) {
                assert_eq!(i, next[p], "poster {p} out of order");
                next[p] += 1;
            }
        };
        // Take while the posters post; once all have finished, one last take empties the ring.
        while !posters.iter().all(|t| t.is_finished()) {
            take(&mut next);
            std::thread::yield_now();
        }
        take(&mut next);
        for t in posters {
            t.join().expect("poster");
        }
        assert_eq!(next, [EACH; POSTERS], "every request taken once");
        assert!(ring.is_empty());
    }
}
