//! The application's handle on a queue pair: post work requests into the queues the engine
//! drains, ring the doorbell, and read the queue pair's events.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use iwarp_mpa::ConnParams;
use iwarp_rdmap::qp::{CheckedSendWr, PostError, QpConfig, QpEvent, QpState, RecvWr, SendWr};

use crate::cq::{LONGEST_NAP, WAIT_SPIN, spin_turn};
use crate::engine::{Engine, WaitingApp, Watch};
use crate::shared::QpShared;

/// Why a list of work requests was not posted whole (verbs' `bad_wr`): the requests before
/// `posted` were posted, the one at `posted` failed with `error`, and none after it was
/// looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostListError {
    /// How many requests of the list were posted.
    pub posted: usize,
    /// Why the next one was not.
    pub error: PostError,
}

impl std::fmt::Display for PostListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "work request {} of the list: {}", self.posted, self.error)
    }
}

impl std::error::Error for PostListError {}

/// Requests of a list that go into their queue together: one reservation of queue entries
/// and one lock of the queue for each this many (taken per request, the atomic updates cost a
/// 64 B Send more than the rest of its posting). As many as `iwarp bench` keeps outstanding
/// by default: 16 cost 36 instructions more per 64 B Send in the small-message harness.
const POST_CHUNK: usize = 64;

thread_local! {
    /// Each thread's deques for the checked requests of a list on their way into a queue:
    /// handed to the queue whole (swapped with it where it is empty, so the thread gets the
    /// queue's spare deque back), the requests are moved once on the way, not into a chunk
    /// and out again.
    static SEND_CHUNK: RefCell<VecDeque<CheckedSendWr>> = const { RefCell::new(VecDeque::new()) };
    static RECV_CHUNK: RefCell<VecDeque<RecvWr>> = const { RefCell::new(VecDeque::new()) };
}

/// Posts a list: checks each request in order (`check`), and for each chunk of checked ones
/// reserves queue entries (`reserve(n)` takes up to `n`, says how many) and hands that many
/// to the queue (`push`, which empties the deque it is given), up to the first request that
/// fails; a list of one goes in through `push_one`. The chunk is collected in this thread's
/// deque `chunks` (a fresh one should a request's iterator post a list itself). Returns how
/// many were posted and the error. The caller's iterator never runs while the queue is
/// locked.
fn post_list<W, C: 'static>(
    wrs: impl IntoIterator<Item = W>,
    check: impl Fn(W) -> Result<C, PostError>,
    reserve: impl Fn(usize) -> usize,
    push: impl Fn(&mut VecDeque<C>),
    push_one: impl Fn(C),
    chunks: &'static LocalKey<RefCell<VecDeque<C>>>,
) -> (usize, Result<(), PostListError>) {
    let mut wrs = wrs.into_iter();
    let Some(first) = wrs.next() else { return (0, Ok(())) };
    let Some(second) = wrs.next() else {
        // A list of one (verbs' usual chain): no chunk to fill and clear, which cost more
        // than the rest of posting a small request.
        let posted = match check(first) {
            Ok(c) if reserve(1) == 1 => {
                push_one(c);
                1
            }
            Ok(_) => return (0, Err(PostListError { posted: 0, error: PostError::QueueFull })),
            Err(error) => return (0, Err(PostListError { posted: 0, error })),
        };
        return (posted, Ok(()));
    };
    let mut wrs = [first, second].into_iter().chain(wrs);
    let mut post = |chunk: &mut VecDeque<C>| {
        let mut posted = 0;
        // Pushes the chunk's requests, as many as there are entries for (the rest are
        // dropped); whether all went.
        let flush = |chunk: &mut VecDeque<C>, posted: &mut usize| {
            let n = chunk.len();
            let k = reserve(n);
            chunk.truncate(k);
            push(chunk);
            *posted += k;
            k == n
        };
        let mut failed = None;
        // Iterated from inside (`try_for_each`): the chain of the first two and the rest
        // then costs no test per request of which part it is in.
        let full = wrs.try_for_each(|wr| {
            match check(wr) {
                Ok(c) => chunk.push_back(c),
                Err(e) => {
                    failed = Some(e);
                    return ControlFlow::Break(false);
                }
            }
            if chunk.len() == POST_CHUNK && !flush(chunk, &mut posted) {
                return ControlFlow::Break(true);
            }
            ControlFlow::Continue(())
        });
        if full == ControlFlow::Break(true) {
            return (posted, Err(PostListError { posted, error: PostError::QueueFull }));
        }
        // A request that fails its check comes after those before it: a full queue stops
        // them first.
        if !chunk.is_empty() && !flush(chunk, &mut posted) {
            return (posted, Err(PostListError { posted, error: PostError::QueueFull }));
        }
        (posted, failed.map_or(Ok(()), |error| Err(PostListError { posted, error })))
    };
    chunks.with(|cell| match cell.try_borrow_mut() {
        Ok(mut chunk) => {
            // Every way out of `post` leaves it empty; a check or an iterator that panicked
            // midway may not have (the borrow ends as it unwinds), and its requests were
            // never posted.
            chunk.clear();
            post(&mut chunk)
        }
        Err(_) => post(&mut VecDeque::new()),
    })
}

/// A connected queue pair.
///
/// Posting holds only its work queue's own lock, for one push of up to 16 requests of a list
/// (the engine takes the whole queue in one swap), enforces the depth at post time, and makes
/// no system call unless the engine sleeps, when the doorbell wakes it. Completions arrive on the completion queues
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
/// server.post_recv(RecvWr { wr_id: 7, sgl: inbox.sge(0, 16).into() }).unwrap();
/// let msg = pd.register_bytes(b"ping", Access::NONE).unwrap();
/// client.post_send(SendWr {
///     wr_id: 1,
///     op: SendOp::Send { solicited: false, invalidate: None },
///     sgl: msg.sge(0, 4).into(),
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
///
/// Handles are cheap clones of one queue pair; when the last one is dropped the connection is
/// disconnected (its outstanding work flushed, the stream closed), as destroying a verbs
/// queue pair does.
#[derive(Debug, Clone)]
pub struct QueuePair {
    handle: Arc<Handle>,
}

/// What the clones of a [`QueuePair`] share; dropping it disconnects.
#[derive(Debug)]
struct Handle {
    shared: Arc<QpShared>,
    dev: Arc<Engine>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.request_disconnect();
        self.dev.posted(&self.shared);
    }
}

impl QueuePair {
    pub(crate) fn new(shared: Arc<QpShared>, dev: Arc<Engine>) -> QueuePair {
        QueuePair { handle: Arc::new(Handle { shared, dev }) }
    }

    /// What the queue pair's handles share with the engine.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<QpShared> {
        &self.handle.shared
    }

    /// The queue pair's number (in every [`crate::WorkCompletion`] of it).
    pub fn qp_num(&self) -> u32 {
        self.handle.shared.qp_num
    }

    /// What MPA negotiated for the connection (CRC, markers, IRD/ORD, RTR).
    pub fn conn_params(&self) -> ConnParams {
        self.handle.shared.params
    }

    /// The queue pair's settings.
    pub fn config(&self) -> QpConfig {
        self.handle.shared.config
    }

    /// Posts a send-queue work request (Send, RDMA Write, RDMA Read, RFC 7306 operations
    /// where the connection negotiated them).
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.post_send_list([wr]).map_err(|e| e.error)
    }

    /// Posts a list of send-queue work requests with one doorbell, as verbs'
    /// `ibv_post_send` with a chain: the requests are checked in order and posted up to the
    /// first that fails, which the error names.
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<(), PostListError> {
        let shared = &self.handle.shared;
        // Checked once, here: the engine hands the checked request to the queue pair.
        let (posted, result) = post_list(
            wrs,
            |wr| wr.check(&shared.config),
            |n| shared.reserve_sq(n),
            |wrs| shared.sq.push_list(wrs),
            |wr| shared.sq.push(wr),
            &SEND_CHUNK,
        );
        if posted > 0 {
            if crate::engine::post_in_a_row() {
                self.handle.dev.posted_in_burst(shared);
            } else {
                self.handle.dev.posted(shared);
            }
        }
        result
    }

    /// Posts a receive buffer.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.post_recv_list([wr]).map_err(|e| e.error)
    }

    /// Posts a list of receive buffers with one doorbell (verbs' `ibv_post_recv` with a
    /// chain), up to the first that fails.
    pub fn post_recv_list(&self, wrs: impl IntoIterator<Item = RecvWr>) -> Result<(), PostListError> {
        let shared = &self.handle.shared;
        // A queue pair whose receives come from a shared queue takes none of its own.
        let check =
            |wr: RecvWr| if shared.uses_srq { Err(PostError::UsesSrq) } else { wr.validate().map(|()| wr) };
        let (posted, result) = post_list(
            wrs,
            check,
            |n| shared.reserve_rq(n),
            |wrs| shared.rq.push_list(wrs),
            |wr| shared.rq.push(wr),
            &RECV_CHUNK,
        );
        if posted > 0 {
            self.handle.dev.posted_receives(shared);
        }
        result
    }

    /// The queue pair's state as the engine last saw it.
    pub fn state(&self) -> QpState {
        self.handle.shared.state()
    }

    /// Has `hook` called with the new state each time the queue pair's state changes (the
    /// connection closed, lost or terminated: see [`QueuePair::state`]), from the thread
    /// that saw the change, usually the engine's, after the completions and events that came
    /// with the change were published, and with the engine's lock let go: the hook may drop
    /// the last handle of a region or a queue pair. If the queue pair has already left RTS,
    /// `hook` is also called at once with the current state, so a change is never missed (it
    /// may then be reported twice). The hook must be short and must not wait for the stack.
    /// A queue pair takes one hook; returns false if it has one already.
    pub fn on_state_change(&self, hook: impl Fn(QpState) + Send + Sync + 'static) -> bool {
        let hook = std::sync::Arc::new(hook);
        let engine_hook = hook.clone();
        if !self.handle.shared.set_state_hook(Box::new(move |s| engine_hook(s))) {
            return false;
        }
        let now = self.state();
        if now != QpState::Rts {
            hook(now);
        }
        true
    }

    /// The next event (a Terminate sent or received, the connection lost).
    pub fn poll_event(&self) -> Option<QpEvent> {
        if self.handle.dev.inline() {
            self.handle.dev.progress();
        }
        self.handle.shared.pop_event()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<QpEvent> {
        let deadline = crate::deadline::saturating(timeout);
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

    /// How many times the engine has taken input off this queue pair's connection (or seen
    /// it go down). Read it before looking at memory the peer writes with RDMA Writes, which
    /// complete nothing at their target; then [`QueuePair::wait_input`] sleeps until there is
    /// more to look at.
    pub fn input_epoch(&self) -> u64 {
        self.handle.shared.arrivals.epoch()
    }

    /// Waits up to `timeout` until [`QueuePair::input_epoch`] differs from `seen`, or until
    /// [`QueuePair::interrupt_input`] is called; returns the epoch then.
    /// A thread that waits for a peer's RDMA Write to show in memory can sleep here between
    /// looks: spinning or yielding instead keeps the thread runnable, and on a machine whose
    /// cores are all busy the engine thread that would place the data then waits for the
    /// scheduler. With an inline device (no engine thread) this thread runs the engine's
    /// passes meanwhile. While the engine thread sleeps (adaptive and event modes), this
    /// thread sleeps where the connection's input wakes it and places the data itself, as
    /// [`crate::CompletionQueue::wait`] does: one wake-up per message rather than the engine
    /// thread's and then this one's.
    ///
    /// As with [`crate::CompletionQueue::wait`], a `timeout` too long to be added to the
    /// current time ([`Duration::MAX`]) waits with no deadline and sleeps without a timer.
    pub fn wait_input(&self, seen: u64, timeout: Duration) -> u64 {
        crate::engine::looked();
        if !timeout.is_zero() {
            crate::engine::waits_in_polls();
        }
        // One clock read serves the deadline, the spin's end and the first look.
        let start = Instant::now();
        let deadline = crate::deadline::after(start, timeout);
        let (dev, shared) = (&self.handle.dev, &self.handle.shared);
        let arrivals = &shared.arrivals;
        let interrupts = arrivals.interrupts();
        let _waiting = WaitingApp::new(dev);
        if !dev.inline() {
            let mut spin_until = start + WAIT_SPIN;
            let mut spins = 0u32;
            let mut first = true;
            loop {
                let now = if first { start } else { Instant::now() };
                first = false;
                let left = deadline.map(|d| d.saturating_duration_since(now));
                if arrivals.due(seen, interrupts) || left.is_some_and(|l| l.is_zero()) {
                    return arrivals.epoch();
                }
                // As the completion wait: spin a little while the engine is awake (about to
                // place the input), offering the core between looks after the first turns;
                // with the engine asleep nothing places it but this thread, so no spin. A
                // caller's own spin before this wait (the bench's, 64 turns of looking at
                // memory) left the input in the socket meanwhile: 8 B Write ping-pongs took
                // 15.3 us back to back in event mode, Sends 8.8.
                if now < spin_until && !dev.doorbell.parked() {
                    spin_turn(&mut spins);
                    continue;
                }
                // At most LONGEST_NAP at a time in either sleep when there is a deadline;
                // without one, no timer: the input or an interrupt wakes either sleep.
                let nap = left.map(|l| l.min(LONGEST_NAP));
                match dev.wait_input_polling(shared, seen, interrupts, now, nap) {
                    Watch::Refused => {
                        arrivals.wait(seen, interrupts, nap.map(|n| Instant::now() + n));
                    }
                    Watch::Slept => {}
                    // Another thread holding the core (mostly the engine's) places the input that
                    // woke this one.
                    Watch::LeftToHolder => spin_until = Instant::now() + WAIT_SPIN,
                }
            }
        }
        loop {
            self.handle.dev.progress();
            if arrivals.due(seen, interrupts) || deadline.is_some_and(|d| Instant::now() >= d) {
                return arrivals.epoch();
            }
            std::hint::spin_loop();
        }
    }

    /// Makes every thread blocked in [`QueuePair::wait_input`] on this queue pair (through
    /// any handle of it) return now, as if its timeout had passed; a wait that starts after
    /// the call is not affected. For a thread that waits for a peer's Writes with a long
    /// timeout and must also answer something else: as with
    /// [`crate::CompletionQueue::interrupt`], waking it this way spares it a short timeout,
    /// whose timer costs microseconds on the wake-up path of a virtual machine.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use iwarp::{ConnectOptions, Device, DeviceConfig};
    /// let server = Device::open(DeviceConfig::default());
    /// let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    /// let addr = listener.local_addr().unwrap();
    /// let client = Device::open(DeviceConfig::default());
    /// let (pd, cq) = (client.alloc_pd(), client.create_cq(16));
    /// let accepting = std::thread::spawn(move || {
    ///     let (pd, cq) = (server.alloc_pd(), server.create_cq(16));
    ///     let qp = listener.accept(Duration::from_secs(10)).unwrap();
    ///     (server, qp.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap())
    /// });
    /// let qp = client.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap().qp;
    /// let waiter = {
    ///     let qp = qp.clone();
    ///     let seen = qp.input_epoch();
    ///     std::thread::spawn(move || qp.wait_input(seen, Duration::from_secs(600)) == seen)
    /// };
    /// // The waiter may not be waiting yet: a wait that starts later is not interrupted.
    /// while !waiter.is_finished() {
    ///     qp.interrupt_input();
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(waiter.join().unwrap(), "no input came, the wait was interrupted");
    /// # drop(accepting.join().unwrap());
    /// ```
    pub fn interrupt_input(&self) {
        self.handle.shared.arrivals.interrupt();
    }

    /// Closes the connection: outstanding work requests are flushed and the stream is shut.
    pub fn disconnect(&self) {
        self.handle.shared.request_disconnect();
        self.handle.dev.posted(&self.handle.shared);
    }
}
