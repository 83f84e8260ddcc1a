//! The offload engine: what an RNIC's processor does between doorbells.
//!
//! The engine owns the connections (links and their queue pairs), the tagged buffer table and
//! the userspace TCP/IP stacks, and runs them from one thread ([`PollMode::Inline`]: from the
//! application's calls). It is readiness driven: every link with a file descriptor is
//! registered with the engine's epoll (src/readiness.rs: edge-triggered, readable and
//! writable), posting work queues
//! the queue pair's key on the doorbell, and a pass visits only the connections that are
//! ready (readable, writable with bytes to send, with posted work, or left with work by the
//! previous pass), so its cost grows with traffic, not with the number of connections. Links
//! without a file descriptor (in-memory links, smoltcp sockets) are visited every pass.
//!
//! For each connection it visits, a pass moves the work requests applications posted into
//! the queue pair, reads what the link has (until it would block, or a fair share), feeds it
//! through MPA/DDP/RDMAP (placing payload straight into registered memory), frames what the
//! queue pair has to send and writes it (many FPDUs per system call), and publishes the
//! completions and events, waking each completion queue's waiters once. A failing connection
//! only affects itself: its queue pair flushes and it is dropped once everything is reported.
//!
//! An idle engine (adaptive and event modes) sleeps in the poll until a doorbell, a link or
//! a smoltcp stack's frame or timer wakes it.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_ddp::stag_table::{ProtectionDomainId, TaggedBufferTable};
use iwarp_netdev::{Link, LinkError, SmolStack};
use iwarp_rdmap::conn::{Connection, RxStats, TxBatch, TxStats};
use iwarp_rdmap::memory::TableMemory;
use iwarp_rdmap::qp::{CheckedSendWr, Completion, QpState, QueuePair, RecvWr, WcOpcode, WcStatus};

use crate::readiness::{DOORBELL, DoorbellPoll, Events, Poll, Ready, STACK_BASE, Token};
use crate::shared::{CqShared, Doorbell, QpShared, WorkCompletion};
use crate::threads::spawn_settled;

/// How the engine waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PollMode {
    /// The engine thread never sleeps: lowest latency, burns a core.
    Busy,
    /// Spin for a while after the last work, then sleep until a doorbell, a link or a
    /// stack's timer wakes the engine.
    #[default]
    Adaptive,
    /// Sleep whenever idle; woken by doorbells and by the links' readiness.
    Event,
    /// No engine thread: the application's calls ([`crate::Device::progress`], polling a
    /// completion queue, posting, which sends at once) drive the engine on the application's
    /// thread.
    Inline,
}

/// Device settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// How the engine waits for work.
    pub poll_mode: PollMode,
    /// Size of the tagged buffer table (memory regions and windows).
    pub max_regions: u32,
    /// How long the adaptive mode spins after the last work before it sleeps.
    pub spin: Duration,
    /// Connections the device runs at once, at most: connecting or accepting beyond it fails
    /// with [`crate::CmError::TooManyConnections`].
    pub max_connections: usize,
    /// How long a finished connection (terminated or disconnected) may wait for its last
    /// bytes to leave (a peer that stopped reading) before the engine drops it.
    pub linger: Duration,
    /// Large payloads go straight between the links and registered memory: received ones
    /// are read into place, sent ones written from where they are. Off: every payload is
    /// copied through the engine's buffers (for comparison, and for debugging).
    pub zero_copy: bool,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig {
            poll_mode: PollMode::Adaptive,
            max_regions: 4096,
            spin: Duration::from_micros(50),
            max_connections: 65536,
            linger: Duration::from_secs(10),
            zero_copy: true,
        }
    }
}

/// Counters of the engine's work and sleep, for monitoring and for tests that check the
/// engine is woken by events rather than by timers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Passes over the ready connections.
    pub passes: u64,
    /// Passes an application thread ran right after posting, instead of waking the engine.
    pub direct_passes: u64,
    /// Connection visits made by those passes.
    pub visits: u64,
    /// Times the engine went to sleep (adaptive and event modes).
    pub sleeps: u64,
    /// Sleeps ended by an event: a doorbell, a link's readiness, a stack's frame.
    pub event_wakeups: u64,
    /// Sleeps ended by their timeout (a stack's timer, or the fallback polling of links
    /// without readiness events).
    pub timer_wakeups: u64,
    /// Times an application thread waiting for a completion slept in the engine's
    /// readiness poll itself while the engine had nothing to do.
    pub app_polls: u64,
    /// Passes an application thread waiting for a completion ran itself while the engine
    /// slept (adaptive mode, see `CompletionQueue::wait`) and that found work: input picked
    /// up without waking any thread.
    pub waiting_passes: u64,
    /// Times the engine thread found the core held by another thread and left its readiness
    /// events to that thread instead of waiting for the lock.
    pub handoffs: u64,
    /// Of the sleeps, those taken on the doorbell alone because an application thread had
    /// just been woken for input and was about to wait for more: the links' input then wakes
    /// that thread, not the engine, which looks at the links when the sleep ends (neither an
    /// event nor a timer wake-up unless the doorbell or a timer ended it).
    pub quiet_sleeps: u64,
    /// Times a thread that posted while the engine slept hearing the links made that sleep
    /// deaf to them, without waking the engine, before its own pass sent the work: the answer
    /// then wakes that thread in its queue's poll, or waits there for it, rather than waking
    /// the engine (see `Engine::deafen`).
    pub deafened: u64,
    /// Times the adaptive engine's spin ended in a sleep because a yield came back late:
    /// another thread had run on the core meanwhile, so the spin competed with it.
    pub contended_yields: u64,
    /// Times the adaptive engine offered the core after a pass that did work while an
    /// application thread waited for a completion (see `Engine::offer_core_to_waiters`).
    pub waiter_yields: u64,
    /// Times the alarm that ends application threads' timed sleeps in a queue's poll was
    /// armed: about once per second of waiting in a steady exchange, not once per sleep (a
    /// timer armed and cancelled for each sleep costs a round trip a few tenths of a
    /// microsecond).
    pub alarms: u64,
    /// Bytes the connections received.
    pub rx_bytes: u64,
    /// Of those, payload bytes the links read straight into registered memory (the rest
    /// went through the engine's receive buffer and were copied into place).
    pub rx_in_place: u64,
    /// Bytes the connections framed for their links.
    pub tx_bytes: u64,
    /// Of those, payload bytes written to the links straight from registered memory, unless
    /// the link was full (the rest were copied into a transmit buffer as they were framed).
    pub tx_by_ref: u64,
    /// Bytes a full link left unsent, copied into a transmit buffer to go out later.
    pub tx_staged: u64,
    /// Payload bytes large enough to go straight from registered memory that were copied
    /// into the transmit buffer instead, because the kernel's copy of them would have run
    /// at a slow distance (`iwarp_rdmap::conn::TxBatch`).
    pub tx_moved: u64,
}

/// What a wait in a queue's own poll did (`Engine::wait_polling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    /// Nothing: the engine is awake (it sees the input), the device is inline or has no poll,
    /// or another thread sleeps in the queue's poll. The caller sleeps where the engine's
    /// signal wakes it.
    Refused,
    /// Slept, and ran the pass with the input that woke it, if any.
    Slept,
    /// Woken for input that another thread holding the engine's core (its engine thread,
    /// woken for the same input) is handling: the events were left to that thread, which is
    /// about to push what the caller waits for. The caller spins a little for it.
    LeftToHolder,
}

#[derive(Debug, Default)]
struct Counters {
    direct_passes: AtomicU64,
    sleeps: AtomicU64,
    event_wakeups: AtomicU64,
    timer_wakeups: AtomicU64,
    app_polls: AtomicU64,
    waiting_passes: AtomicU64,
    handoffs: AtomicU64,
    quiet_sleeps: AtomicU64,
    deafened: AtomicU64,
    contended_yields: AtomicU64,
    waiter_yields: AtomicU64,
    alarms: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Posts a thread makes in a row, with no look at a completion queue in between, that each
/// go out in a pass of the posting thread's own while the engine sleeps; later ones go to the
/// engine thread (see [`Engine::posted_in_burst`]). A ping-pong, or a Write then a Send per
/// message, stays below it.
const DIRECT_POSTS_IN_A_ROW: u32 = 8;

std::thread_local! {
    /// This thread's posts since it last looked at a completion queue (or waited for input).
    static POSTS_IN_A_ROW: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Counts a post of this thread; whether it is beyond [`DIRECT_POSTS_IN_A_ROW`].
#[inline]
pub(crate) fn post_in_a_row() -> bool {
    POSTS_IN_A_ROW.with(|n| {
        let posts = n.get().saturating_add(1);
        n.set(posts);
        posts > DIRECT_POSTS_IN_A_ROW
    })
}

/// This thread looks at a completion queue or waits for input: its posts start a new row.
#[inline]
pub(crate) fn looked() {
    POSTS_IN_A_ROW.with(|n| n.set(0));
}

/// Looks at a completion queue that find nothing, in a row, after which a thread that waited
/// for a completion or input is taken to poll for its completions instead (see
/// [`Engine::deafen`]).
const EMPTY_LOOKS_TO_FORGET: u8 = 64;

std::thread_local! {
    /// Looks that may still find nothing before this thread is no longer taken to sleep in its
    /// queues' polls: [`EMPTY_LOOKS_TO_FORGET`] after each blocking wait ([`waits_in_polls`]),
    /// one less per look at a queue that finds nothing.
    static SLEEPS_IN_POLLS: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// This thread looked at a completion queue and found nothing (a thread that polls for its
/// completions does so thousands of times a second).
#[inline]
pub(crate) fn found_nothing() {
    SLEEPS_IN_POLLS.with(|n| n.set(n.get().saturating_sub(1)));
}

/// This thread waits for a completion or for input without a completion at hand, blocking:
/// while the engine sleeps, such a wait sleeps in its queue's poll.
#[inline]
pub(crate) fn waits_in_polls() {
    SLEEPS_IN_POLLS.with(|n| n.set(EMPTY_LOOKS_TO_FORGET));
}

/// Whether this thread waits for its completions asleep in its queues' polls (it did lately).
fn sleeps_in_polls() -> bool {
    SLEEPS_IN_POLLS.with(|n| n.get() > 0)
}

/// Bytes read from a link per call.
const RX_CHUNK: usize = 256 * 1024;
/// Bytes framed before writing them out.
const TX_BATCH: usize = 256 * 1024;
/// Reads per connection per pass, so one busy connection cannot starve the others.
const RX_READS_PER_PASS: usize = 8;
/// Rounds of visits a waiting thread's pass makes while its connections have more input
/// ([`EngineCore::read_on`]): up to this many times [`RX_READS_PER_PASS`] reads each.
const WAITER_ROUNDS: usize = 32;
/// Transmit batches per connection per pass.
const TX_BATCHES_PER_PASS: usize = 2;
/// The most buffers one vectored write takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;
/// Transmit buffers kept for reuse once no connection needs them.
const TX_POOL: usize = 8;
/// When an initiator that has sent FPDUs but heard nothing back nudges its peer (after its
/// first FPDU): a zero-length RDMA Write makes a peer that left the first FPDUs unread in its
/// socket (siw 6.1, docs/siw-quirks.md) read them. An initiator that sent FPDUs before it
/// heard from the peer also nudges once when it first hears, unless it sends again then:
/// bytes from the peer do not prove that it read ours, but they show that it now handles its
/// socket, so bytes that arrive after them are read, and the unread ones with them.
const NUDGES: [Duration; 3] =
    [Duration::from_millis(10), Duration::from_millis(50), Duration::from_millis(250)];
/// How long a busy engine thread spins idle before every idle pass also yields the core.
const BUSY_YIELD_AFTER: Duration = Duration::from_micros(20);
/// A yield of the adaptive engine's spin that takes this long ran another thread on the core
/// meanwhile (with nothing else runnable a yield returns within a microsecond or two): the
/// core is contended, and the spin ends in a sleep.
const CONTENDED_YIELD: Duration = Duration::from_micros(10);
/// How long a sleep may last while some link has no readiness events (it is polled).
const POLLED_NAP: Duration = Duration::from_millis(1);

/// How long after an application thread was woken for input the engine thread leaves the
/// links' input to it (see `Engine::sleep`): longer than such a thread takes to handle what
/// woke it and come back to wait, even when the peer it answered preempted it; and the
/// longest that input no application thread waits for can wait for the engine meanwhile.
const APP_BUSY: Duration = Duration::from_micros(200);
/// The longest a sleep of the engine thread that a poster may make deaf to the links lasts
/// ([`Engine::deafen`]): the bound on how long input that no thread waits for waits then.
const DEAF_BOUND: Duration = Duration::from_millis(1);
/// For how long after a post that would have made the engine's sleep deaf its sleeps hearing
/// the links end within [`DEAF_BOUND`] when the next post may come (`SleepCtl::hearing_bound`),
/// so that it can make them deaf (longer sparse gaps than this and idle devices sleep without
/// limit).
const DEAF_WINDOW: Duration = Duration::from_millis(50);

/// The engine as the handles see it: its state behind a lock for the slow path, the
/// doorbell, and the thread (or the application's calls, inline) that runs it.
#[derive(Debug)]
pub(crate) struct Engine {
    core: Mutex<EngineCore>,
    pub(crate) config: DeviceConfig,
    pub(crate) doorbell: Doorbell,
    stop: AtomicBool,
    /// Threads waiting for the core's lock on the slow path.
    waiting: AtomicUsize,
    /// A pass waits for the core's lock: the application's copies into and out of regions
    /// (`MemoryRegion::read`, ...) let it go first, so that polling a region cannot starve the
    /// engine.
    pass_waiting: AtomicBool,
    /// The readiness poll (absent only if the system refused one: links are then polled).
    poll: Option<Arc<Poll>>,
    /// Inline mode's event buffer.
    inline_events: Mutex<Events>,
    /// Inline mode: async tasks waiting for a completion, and the thread that drives the
    /// engine for them meanwhile (an inline device has no engine thread of its own, and an
    /// executor does not poll a pending future again by itself).
    async_waiters: AtomicUsize,
    async_driver: Mutex<Option<JoinHandle<()>>>,
    /// Application threads blocked in a completion or input wait ([`WaitingApp`]): with the
    /// engine asleep, such a thread drives the passes or sleeps in its queue's poll, so the
    /// input it waits for does not need the engine thread.
    app_waiters: AtomicUsize,
    /// When the engine thread's last computed sleep ends, in nanoseconds since `epoch`
    /// (`u64::MAX`: no limit); see `Engine::nap`.
    nap_until: AtomicU64,
    /// Sleeps on the doorbell alone, for the engine thread while an application thread is
    /// busy with input (see `Engine::sleep`). Made on first use, as only a device whose
    /// threads wait in a queue's poll needs it: a descriptor less for the others (see
    /// `Poll::add_link` on programs that refuse high descriptor numbers).
    quiet: OnceLock<Option<DoorbellPoll>>,
    /// Until when, in nanoseconds since `epoch`, an application thread woken for input is
    /// taken to be busy with it and about to wait again (0: none has been).
    app_busy_until: AtomicU64,
    /// The engine thread sleeps (or is about to) on the doorbell alone.
    quiet_sleeping: AtomicBool,
    /// How the engine thread sleeps in `quiet`, under a lock a poster takes to make it deaf to
    /// the links without waking it ([`Engine::deafen`]).
    sleep_ctl: Mutex<SleepCtl>,
    epoch: Instant,
    counters: Counters,
}

/// The engine thread's sleep in its doorbell poll (`Engine::quiet`).
#[derive(Debug, Default)]
struct SleepCtl {
    /// It sleeps there, or is about to.
    asleep: bool,
    /// The poll hears the links (they are off in a new one).
    hearing: bool,
    /// When that sleep ends at the latest (`None`: no limit).
    until: Option<Instant>,
    /// The last post that would have made one deaf (`Engine::deafen`), and the time since the
    /// one before it. For [`DEAF_WINDOW`] after it, its sleeps hearing the links are bounded
    /// for posters (`SleepCtl::hearing_bound`).
    last_post: Option<Instant>,
    post_gap: Option<Duration>,
}

impl SleepCtl {
    /// Whether a post made a sleep deaf, or would have, within [`DEAF_WINDOW`] before `now`.
    fn posters_deafen(&self, now: Instant) -> bool {
        self.last_post.is_some_and(|last| now.saturating_duration_since(last) < DEAF_WINDOW)
    }

    /// How long a sleep hearing the links that starts at `now` lasts while posters would make
    /// it deaf: [`DEAF_BOUND`], except where such posts came at a steady pace and the next is
    /// not due yet: then until shortly before it (by an eighth of the gap, at least two
    /// bounds), so that it is made deaf in time. Waking every [`DEAF_BOUND`] instead cost the
    /// engine about 24 us of its CPU per wake-up on a virtual machine (timer, switch, the
    /// hypervisor), and in a ping-pong 10 ms apart ten such wake-ups between round trips.
    /// A post that comes earlier than that finds the sleep too long to make deaf, as one after
    /// an idle does.
    fn hearing_bound(&self, now: Instant) -> Duration {
        let (Some(last), Some(gap)) = (self.last_post, self.post_gap) else { return DEAF_BOUND };
        let lead = (gap / 8).max(2 * DEAF_BOUND);
        match last.checked_add(gap).and_then(|due| due.checked_sub(lead)) {
            Some(wake) if wake > now + DEAF_BOUND => wake - now,
            _ => DEAF_BOUND,
        }
    }
}

/// The core, locked on the slow path ([`Engine::core`]). Letting go of it hands events the
/// engine thread left meanwhile back to that thread.
pub(crate) struct CoreGuard<'a> {
    guard: Option<MutexGuard<'a, EngineCore>>,
    engine: &'a Engine,
}

impl std::ops::Deref for CoreGuard<'_> {
    type Target = EngineCore;

    fn deref(&self) -> &EngineCore {
        match &self.guard {
            Some(guard) => guard,
            None => unreachable!("a core guard holds the lock until it is dropped"),
        }
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut EngineCore {
        match &mut self.guard {
            Some(guard) => guard,
            None => unreachable!("a core guard holds the lock until it is dropped"),
        }
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            self.engine.let_go(guard);
        }
    }
}

thread_local! {
    /// The event buffer of an application thread waiting in the readiness poll.
    static WAITER_EVENTS: std::cell::RefCell<Events> = std::cell::RefCell::new(Events::with_capacity(64));
}

impl Engine {
    /// Creates the engine and, unless the mode is inline, starts its thread.
    pub(crate) fn start(config: DeviceConfig) -> (Arc<Engine>, Option<JoinHandle<()>>) {
        let poll = Poll::watching_closes().ok().map(Arc::new);
        let engine = Arc::new(Engine {
            core: Mutex::new(EngineCore::new(
                config.max_regions,
                config.linger,
                config.zero_copy,
                poll.clone(),
            )),
            config,
            doorbell: Doorbell::default(),
            stop: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            pass_waiting: AtomicBool::new(false),
            poll: poll.clone(),
            inline_events: Mutex::new(Events::with_capacity(1024)),
            async_waiters: AtomicUsize::new(0),
            app_waiters: AtomicUsize::new(0),
            async_driver: Mutex::new(None),
            nap_until: AtomicU64::new(u64::MAX),
            quiet: OnceLock::new(),
            app_busy_until: AtomicU64::new(0),
            quiet_sleeping: AtomicBool::new(false),
            sleep_ctl: Mutex::new(SleepCtl::default()),
            epoch: Instant::now(),
            counters: Counters::default(),
        });
        if let Some(p) = poll {
            engine.doorbell.set_poll(p);
        }
        if config.poll_mode == PollMode::Inline {
            return (engine, None);
        }
        let e = engine.clone();
        // Settled before the caller goes on: see `threads`.
        let thread = spawn_settled("iwarp-engine", move |settled| {
            let events = Events::with_capacity(1024);
            settled.settled();
            engine_loop(&e, events);
        })
        .ok();
        if let Some(t) = &thread {
            engine.doorbell.set_thread(t.thread().clone());
        }
        (engine, thread)
    }

    /// Stops the engine thread (if any) and flushes every connection's work.
    pub(crate) fn stop(&self, thread: Option<JoinHandle<()>>) {
        self.stop.store(true, Ordering::Release);
        let driver = lock(&self.async_driver).take();
        for t in thread.into_iter().chain(driver) {
            self.doorbell.wake();
            t.thread().unpark();
            let _ = t.join();
        }
        // Nobody runs the connections any more: flush their work so that none is lost.
        self.core().shutdown();
    }

    /// The engine's state, for the slow path (registration, connection setup). A busy engine
    /// re-takes the lock right after each pass; announcing the wait makes it step aside.
    pub(crate) fn core(&self) -> CoreGuard<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let guard = lock(&self.core);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        CoreGuard { guard: Some(guard), engine: self }
    }

    /// The engine's state, for the application's copies into and out of its regions: like
    /// [`Engine::core`], but a pass that is waiting for the lock goes first (a thread polling a
    /// region in a loop would otherwise keep the engine from the lock).
    pub(crate) fn core_for_copy(&self) -> CoreGuard<'_> {
        while self.pass_waiting.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        self.core()
    }

    pub(crate) fn inline(&self) -> bool {
        self.config.poll_mode == PollMode::Inline
    }

    /// Attaches a smoltcp stack (once); see [`crate::Device::attach_stack`].
    pub(crate) fn attach_stack(&self, stack: &SmolStack) {
        if self.core().attach_stack(stack) {
            self.ring();
        }
    }

    /// Rings the doorbell: wakes a parked engine.
    pub(crate) fn ring(&self) {
        self.doorbell.ring();
    }

    /// One pass on the calling thread, with the readiness events collected now (in inline
    /// mode this is what drives the engine; beside an engine thread it is harmless). Whether
    /// it did any work.
    pub(crate) fn progress(&self) -> bool {
        match (&self.poll, self.inline_events.try_lock()) {
            (Some(poll), Ok(mut events)) => {
                poll.wait(&mut events, Some(Duration::ZERO));
                self.pass(Some(&events))
            }
            _ => self.pass(None),
        }
    }

    /// One pass on the calling thread if no other thread is in one or waiting for the
    /// engine's lock: never blocks. Whether a pass ran and found work.
    pub(crate) fn try_progress(&self) -> bool {
        self.try_progress_until(|| true)
    }

    /// [`Engine::try_progress`], whose pass goes on reading the connections that have more
    /// input until `due` ([`EngineCore::read_on`]).
    fn try_progress_until(&self, due: impl Fn() -> bool) -> bool {
        if self.waiting.load(Ordering::Acquire) > 0 || self.pass_waiting.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut events) = self.inline_events.try_lock() else { return false };
        let Ok(mut core) = self.core.try_lock() else { return false };
        if let Some(poll) = &self.poll {
            poll.wait(&mut events, Some(Duration::ZERO));
        }
        let mut work = core.progress(self.poll.as_ref().map(|_| &*events), &self.doorbell);
        drop(events);
        work |= core.read_on(due);
        self.let_go(core);
        bump(&self.counters.direct_passes, 1);
        work
    }

    /// A pass run by a thread waiting for a completion while the engine sleeps (see
    /// `CompletionQueue::wait`), until what it waits for is `due`: as [`Engine::try_progress`],
    /// but like the pass of a thread woken in its queue's poll it goes on reading a connection
    /// with more input ([`EngineCore::read_on`]): left ready, the connection woke the engine
    /// thread, and the waiting thread stopped its passes for a sleeping engine. Counted in
    /// [`EngineStats::waiting_passes`] when it finds work.
    pub(crate) fn waiting_pass(&self, due: impl Fn() -> bool) -> bool {
        let work = self.try_progress_until(due);
        if work {
            bump(&self.counters.waiting_passes, 1);
        }
        work
    }

    /// Whether a poster visits its queue pair itself when it finds the engine's lock free:
    /// always inline and busy, otherwise while the engine sleeps (see [`Engine::posted`]).
    fn posts_visit(&self) -> bool {
        match self.config.poll_mode {
            PollMode::Inline | PollMode::Busy => true,
            PollMode::Adaptive | PollMode::Event => self.doorbell.parked(),
        }
    }

    /// Called after posting to `qp`: queues it for the engine. A sleeping engine is not woken
    /// when the poster can run the pass itself (as siw transmits in the poster's context
    /// when the send queue was idle): the work goes out now, without a wake-up on the way.
    /// Inline, where nothing else runs the engine, the poster visits its queue pair whenever
    /// it finds the lock free: the work goes out before the poster's next poll, whose pass
    /// would first ask the readiness poll for input (a system call on a ping-pong's path
    /// between the ping read and the pong sent). Busy, it does so when the engine thread is
    /// not in a pass, as that thread need not have a core (four spinning threads on two
    /// cores: the work waited for the scheduler to run it): the 8 B Write ping-pong between
    /// two busy devices went from 82-103 to 53-70 us and 64 B Sends from 1.9 to 3.0 Mmsg/s.
    pub(crate) fn posted(&self, qp: &QpShared) {
        // A poster that finds the engine asleep (or runs it, inline and busy) and its lock
        // free: its queue pair alone is visited, without going through the doorbell's queue
        // (see `visit_direct`).
        if self.posts_visit()
            && let Ok(mut core) = self.core.try_lock()
        {
            if core.quiet_ok() && sleeps_in_polls() {
                self.deafen();
            }
            let visited = core.visit_direct(qp);
            // Like every holder, through `let_go`: events left meanwhile get their pass.
            self.let_go(core);
            if visited {
                bump(&self.counters.direct_passes, 1);
                return;
            }
        }
        if !qp.schedule(&self.doorbell) {
            return;
        }
        if !self.doorbell.parked() {
            return;
        }
        match self.core.try_lock() {
            Ok(mut core) => {
                core.progress(None, &self.doorbell);
                // Links without readiness events wait for the engine's next poll of them.
                let polled = !core.polled.is_empty();
                self.let_go(core);
                if polled {
                    self.doorbell.wake();
                }
                bump(&self.counters.direct_passes, 1);
            }
            // The engine (or another poster) is in a pass: it finds the work, or was woken.
            Err(_) => self.doorbell.wake(),
        }
    }

    /// Called by a thread that posts while the engine thread sleeps, before its direct pass
    /// sends the work (under the core, with no stack, link without readiness events or full
    /// link for the engine to watch), when the thread waits for its completions asleep in its
    /// queues' polls: the engine's sleep is made deaf to the links, without waking it, as
    /// after an application thread's wake-up (see `Engine::sleep`), if it ends within
    /// [`DEAF_BOUND`]; and for [`DEAF_WINDOW`] the engine's sleeps hearing the links end so
    /// whenever the next post may come (at once, or from shortly before it is due where the
    /// posts keep a steady pace: `SleepCtl::hearing_bound`).
    ///
    /// The answer to what this thread sends may come before the thread is back asleep in its
    /// queue's poll: on one machine the peer it wakes often preempts it, answers at once,
    /// and the answer finds no thread in the queue's poll. A hearing engine was then woken for
    /// it, on a virtual machine an interrupt to another core raised from inside the peer's
    /// `sendmsg` (tens of microseconds there), and raced the poster for the input; deaf, it
    /// sleeps on, the queue's poll records the input and the poster takes it when it waits.
    /// Input nobody waits for is the engine's when the sleep ends, [`DEAF_BOUND`] at most.
    /// Nothing is done when the engine sleeps deaf already, or not in its doorbell poll (made
    /// here or with the first quiet sleep): its next sleeps are there.
    fn deafen(&self) {
        let Some(poll) = &self.poll else { return };
        // Made here if no quiet sleep made it yet: the engine sleeps there from its next sleep.
        let Some(quiet) = self.quiet.get_or_init(|| poll.doorbell_only().ok()).as_ref() else { return };
        let Ok(mut ctl) = self.sleep_ctl.try_lock() else { return };
        let now = Instant::now();
        ctl.post_gap = ctl.last_post.map(|last| now.saturating_duration_since(last));
        ctl.last_post = Some(now);
        // Only a sleep that ends in time: arming a timer here instead cost this thread 8 us on a
        // virtual machine (programming the timer exits to the hypervisor), more than the
        // wake-up it saves. A sleep without limit has the engine's next sleeps bounded.
        let in_time = ctl.until.is_some_and(|until| until <= now + DEAF_BOUND);
        if !(ctl.asleep && ctl.hearing && in_time && self.doorbell.parked()) {
            return;
        }
        // Before the links go off: a pass that fills a link from here on rings the doorbell
        // (`let_go`), as the engine would not hear the link's writable event.
        self.quiet_sleeping.store(true, Ordering::SeqCst);
        if quiet.hear_links(poll, false) {
            ctl.hearing = false;
            self.app_busy(now);
            bump(&self.counters.deafened, 1);
        }
    }

    /// Called after posting to `qp` when the posting thread has posted more than
    /// [`DIRECT_POSTS_IN_A_ROW`] times without looking at a completion queue in between (a
    /// loop of single posts, as perftest's without `-l`): rather than a pass and a `sendmsg` of
    /// its own per post, the rest of the burst goes to the engine thread, which writes what has
    /// piled up by the time it runs in one. The engine is woken once per queuing of the queue
    /// pair (later posts find it queued: whoever queued it woke the engine if it slept, and the
    /// engine looks for queued work after it announces its park). Inline and busy, this is
    /// [`Engine::posted`].
    pub(crate) fn posted_in_burst(&self, qp: &QpShared) {
        if matches!(self.config.poll_mode, PollMode::Inline | PollMode::Busy) {
            return self.posted(qp);
        }
        if qp.schedule_once(&self.doorbell) == Some(true) && self.doorbell.parked() {
            self.doorbell.wake();
        }
    }

    /// Called after posting receives to `qp`. In RTS a receive matters only to input, and
    /// every visit takes the posted receives before it handles what it read (`visit`), so
    /// nothing is done: the next visit of the connection, which its next input brings,
    /// takes them. No pass runs now, no one is woken, and the queue pair is not even queued
    /// for a pass (a queued key had the next post's pass go the general way, through the
    /// doorbell's queue, rather than visit the queue pair alone: see `visit_direct`). In a
    /// ping-pong that is one pass less on each side per round trip than when the receive
    /// reposted after each completion went through a pass of its own. Outside RTS the
    /// receives are flushed, which [`Engine::posted`] does at once.
    pub(crate) fn posted_receives(&self, qp: &QpShared) {
        // Pairs with the fence after a visit publishes a state other than RTS (`visit`):
        // either the state read here shows the change, or that visit finds these receives in
        // the ring and visits the connection again, which flushes them.
        fence(Ordering::SeqCst);
        if qp.state() != QpState::Rts {
            self.posted(qp);
        }
    }

    /// An async task started waiting for a completion. Inline, a thread drives the engine
    /// while any task waits (started the first time one does).
    pub(crate) fn async_wait_started(self: &Arc<Engine>) {
        if !self.inline() {
            return;
        }
        self.async_waiters.fetch_add(1, Ordering::AcqRel);
        let mut driver = lock(&self.async_driver);
        match &*driver {
            Some(t) => t.thread().unpark(),
            None => {
                let e = Arc::clone(self);
                *driver = spawn_settled("iwarp-async", move |settled| {
                    let events = Events::with_capacity(256);
                    settled.settled();
                    async_driver(&e, events);
                })
                .ok();
            }
        }
    }

    /// An async task stopped waiting (its completion came, or its future was dropped).
    pub(crate) fn async_wait_ended(&self) {
        if self.inline() {
            let _ =
                self.async_waiters.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        }
    }

    /// Waits up to `timeout` for a thread that waits for a completion of `cq` while the
    /// engine sleeps: the thread sleeps in the queue's own readiness poll, which watches the
    /// descriptors of the queue pairs completing there and the engine's signal, so input for
    /// those connections wakes it directly and it runs the pass itself: one wake-up on the
    /// way, not the engine thread's and then its own. (The engine's poll sees the input too;
    /// whichever thread passes first does the work.) Returns false, having done nothing, when
    /// the engine is awake (it will push the completion) or another thread watches.
    pub(crate) fn wait_polling(
        &self,
        cq: &CqShared,
        now: Instant,
        timeout: Option<Duration>,
        epoch: u64,
    ) -> Watch {
        self.sleep_in_watch(
            cq,
            now,
            timeout,
            |_| {
                cq.add_poll_sleeper();
                cq.wake_due(epoch)
            },
            |_| cq.remove_poll_sleeper(),
            || cq.wake_due(epoch),
        )
    }

    /// As [`Engine::wait_polling`], for a thread that waits for more input on `qp` (RDMA
    /// Writes, which complete nothing at their target; see `QueuePair::wait_input`), until
    /// its arrival count differs from `seen` (or its interrupt count from `interrupts`): it
    /// sleeps in the readiness poll of the queue pair's receive queue, which watches the
    /// queue pair's connection. Sleeping until the engine thread has placed the data instead
    /// took two wake-ups (the engine's, then its own) and a round of the engine's pass on the
    /// way.
    pub(crate) fn wait_input_polling(
        &self,
        qp: &QpShared,
        seen: u64,
        interrupts: u64,
        now: Instant,
        timeout: Option<Duration>,
    ) -> Watch {
        self.sleep_in_watch(
            &qp.recv_cq,
            now,
            timeout,
            |poll| qp.arrivals.add_poll_waiter(poll, seen, interrupts),
            |poll| qp.arrivals.remove_poll_waiter(poll),
            // Any input ends the wait, but whether it is the input the thread waits for (a
            // Write's last byte) only the thread can tell: the pass reads what keeps coming.
            || qp.arrivals.interrupts() != interrupts,
        )
    }

    /// Sleeps up to `timeout` after `now` (`None`: no limit) in `cq`'s own readiness poll
    /// (made, and the queue's connections added to it, on first use) and runs the pass with
    /// what woke it. The sleep has no timeout of its own: the queue's
    /// [`Alarm`](crate::readiness::Alarm) ends it in time, armed once per many sleeps.
    /// `register` makes the awaited event wake the poll and says whether it is due already,
    /// `unregister` undoes that once the thread is awake (before the pass: a registration
    /// left behind would have the pass wake the poll for nothing, a system call per wait).
    /// [`Watch::Refused`], having done nothing, when the engine is awake, inline or without a
    /// poll, or another thread sleeps in this queue's poll.
    fn sleep_in_watch(
        &self,
        cq: &CqShared,
        now: Instant,
        timeout: Option<Duration>,
        register: impl FnOnce(&Arc<Poll>) -> bool,
        unregister: impl FnOnce(&Arc<Poll>),
        due: impl Fn() -> bool,
    ) -> Watch {
        if self.inline() || self.poll.is_none() {
            return Watch::Refused;
        }
        if !self.doorbell.parked() {
            // The engine is awake and sees the input, unless it goes to sleep on the doorbell
            // alone meanwhile, leaving the input to this thread as one just woken for input
            // that will be back in its poll (`Engine::sleep`), while this thread sleeps where
            // it does not watch the links: the input then waited for the end of the engine's
            // sleep (a millisecond: `epoll_wait` counts in them), on about one 256 KiB
            // ping-pong round trip in a thousand. So this thread takes that leave back, and
            // looks again: either the engine, announcing its park before it reads the leave,
            // sleeps on the links, or this thread sees the park and sleeps in its own poll.
            self.app_busy_until.store(0, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !self.doorbell.parked() {
                return Watch::Refused;
            }
        }
        let Ok(mut alarm) = cq.watching.try_lock() else { return Watch::Refused };
        let poll = match cq.watch() {
            Some(p) => p.clone(),
            None => {
                let mut core = self.core();
                if !cq.make_watch() {
                    return Watch::Refused;
                }
                core.watch_all(cq);
                match cq.watch() {
                    Some(p) => p.clone(),
                    None => return Watch::Refused,
                }
            }
        };
        if register(&poll) {
            unregister(&poll);
            return Watch::Slept;
        }
        WAITER_EVENTS.with_borrow_mut(|events| {
            // Input the poll recorded while no thread slept in it (this thread was on its way
            // here, preempted by the peer it had just answered) ends the wait at once, and the
            // pass below takes it. It went to the engine's poll as well and woke the engine
            // thread, but a pass here is ahead of that wake-up on a busy core; dropping the
            // input and sleeping would wait for the engine to place it and then wake this
            // thread: two more context switches on every round trip, 44 -> 30 us p50 for 8 B
            // Send/Send back to back in event mode, two devices on 2 cores. When the engine
            // has placed it already, the pass finds the socket drained.
            let (timeout, armed) = alarm.cover(&poll, now, timeout);
            if armed {
                bump(&self.counters.alarms, 1);
            }
            poll.wait(events, timeout);
            unregister(&poll);
            self.app_busy(Instant::now());
            bump(&self.counters.app_polls, 1);
            if events.iter().any(|e| e.token != DOORBELL) && self.pass_events(events, due).is_none() {
                return Watch::LeftToHolder;
            }
            Watch::Slept
        })
    }

    /// One pass over the ready connections, given the readiness events collected for it.
    fn pass(&self, events: Option<&Events>) -> bool {
        self.pass_with(|core, doorbell| core.progress(events, doorbell))
    }

    /// Takes the core (after a slow-path caller waiting for it), runs `pass` and lets go.
    fn pass_with(&self, pass: impl FnOnce(&mut EngineCore, &Doorbell) -> bool) -> bool {
        // Let a slow-path caller that is waiting for the lock have it first.
        self.pass_waiting.store(true, Ordering::Release);
        while self.waiting.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
        let mut core = lock(&self.core);
        self.pass_waiting.store(false, Ordering::Release);
        let work = pass(&mut core, &self.doorbell);
        self.let_go(core);
        work
    }

    /// The pass of a thread woken in a queue's own poll: the connections `events` name are
    /// visited until `due` ([`EngineCore::progress_events`]). Like the engine thread's pass
    /// ([`Engine::engine_pass`]) it does not sleep on the core's lock: `None` when another
    /// thread holds the core and the events were left to it. That thread is mostly the engine
    /// thread, woken for the same input: the kernel wakes one sleeper per readiness edge, and
    /// a message of several segments makes several edges, the first for this thread and a
    /// later one for the engine's, which often takes the core first. Sleeping on the lock
    /// while the engine read the message, this thread then ran a pass that found nothing
    /// (a read, and a futex wake-up when it let go of a lock it had waited for): on two
    /// cores, about 40% of the wake-ups of a 64 KiB Send ping-pong.
    fn pass_events(&self, events: &Events, due: impl Fn() -> bool) -> Option<bool> {
        self.pass_or_hand_off(Some(events), |core, events, doorbell| match events {
            Some(events) => core.progress_events(events, doorbell, &due),
            // The events are in the hand-off queue (the core came free after they were left),
            // which the general pass takes them from.
            None => {
                let work = core.progress(None, doorbell);
                core.read_on(&due) || work
            }
        })
    }

    /// The engine thread's pass (and inline mode's async driver's): like [`Engine::pass`],
    /// but it never sleeps on the core's lock. When another thread holds the core (an
    /// application thread in its own pass, typically one that took the same input this
    /// thread was woken for), the events are left in `handoff` for that thread and `None`
    /// is returned. Sleeping on the lock instead cost two more thread switches and a futex
    /// wake-up whenever an application thread and the engine thread were woken for the same
    /// input.
    fn engine_pass(&self, events: Option<&Events>) -> Option<bool> {
        self.pass_or_hand_off(events, EngineCore::progress)
    }

    /// Runs `pass` with the core and `events`, unless another thread holds the core: then the
    /// events are left to that thread and `None` is returned (see [`Engine::engine_pass`]).
    /// Where the core comes free after the events were left, `pass` runs with `None`: they are
    /// in the hand-off queue then.
    fn pass_or_hand_off(
        &self,
        mut events: Option<&Events>,
        pass: impl FnOnce(&mut EngineCore, Option<&Events>, &Doorbell) -> bool,
    ) -> Option<bool> {
        // A slow-path caller waiting for the core goes first.
        let first = if self.waiting.load(Ordering::Acquire) > 0 { None } else { self.try_core() };
        let mut core = match first {
            Some(core) => core,
            None => {
                // Leave the events to the holder (it takes them when it lets go); from here on
                // they are in the hand-off queue, which a pass below takes them from.
                self.hand_off(events);
                events = None;
                // Pairs with the fence after letting go (`let_go`): either the holder sees the
                // events (and the engine's announced park), or this sees the core free and
                // tries it once more. A slow-path caller stops counting itself as waiting on
                // taking the lock, long before it lets go and looks, so the count is read again
                // too: one read before the events were left may belong to a caller that has
                // looked already.
                fence(Ordering::SeqCst);
                if self.waiting.load(Ordering::Acquire) > 0 {
                    return None;
                }
                self.try_core()?
            }
        };
        let work = pass(&mut core, events, &self.doorbell);
        self.let_go(core);
        Some(work)
    }

    /// The core if no other thread holds it (a poisoned lock is taken as it is).
    fn try_core(&self) -> Option<MutexGuard<'_, EngineCore>> {
        match self.core.try_lock() {
            Ok(core) => Some(core),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Leaves `events` for the thread that holds the core.
    fn hand_off(&self, events: Option<&Events>) {
        let mut left = false;
        for ev in events.into_iter().flat_map(Events::iter).filter(|e| e.token != DOORBELL) {
            self.doorbell.hand_off(*ev);
            left = true;
        }
        if left {
            bump(&self.counters.handoffs, 1);
        }
    }

    /// Ends a pass: releases the core, wakes a sleeping engine thread when the pass (on
    /// another thread) set a timer earlier than the one it sleeps for, or left a connection
    /// ready with its read or write budget spent (no readiness event will come for the rest:
    /// a large Read Response half sent by an application thread's pass would wait forever).
    /// Every holder of the core lets go through here.
    ///
    /// Before it lets go for good it takes what the engine thread handed off meanwhile (see
    /// [`Engine::engine_pass`]), and work posted while the engine thread was going to sleep
    /// (the poster saw it awake and did not ring): the engine thread, finding the core held,
    /// relied on this thread for both.
    fn let_go<'a>(&'a self, mut core: MutexGuard<'a, EngineCore>) {
        loop {
            // A full link reports its writable event only to the engine's poll, which an engine
            // sleeping on the doorbell alone does not watch (it does not start such a sleep while
            // a link is full, but a link may fill after it looked).
            let full = core.waiting_writable > 0 && self.quiet_sleeping.load(Ordering::SeqCst);
            let left = core.new_earliest() || !core.ready.is_empty() || full;
            let changes = std::mem::take(&mut core.state_changes);
            drop(core);
            // The park is looked at with the core let go: the engine may announce it while this
            // thread still holds the core, and then find the core taken both in its last pass
            // and in `nap`, and sleep with no timer; looked at under the core, it was missed and
            // what this pass left queued was never visited (seen: fi_pingpong's 1 MiB ping-pong
            // stalled for good, both engines asleep, one connection queued, about one run in
            // 100 under load). Now either this sees the park, or the engine's next try of the
            // core succeeds and its `nap` finds the queue.
            if left {
                fence(Ordering::SeqCst);
                if self.doorbell.parked() {
                    self.doorbell.wake();
                }
            }
            // State hooks run with the core let go: one may drop the last handle of a region
            // or a queue pair (the verbs drop-in's, for one, may hold the last reference to
            // its connection's identifier there), whose drop takes the core. Run under it, the
            // engine thread waited for itself for good: a hang seen in 1 of 25 runs of
            // `fi_pingpong` over the drop-in.
            for (shared, state) in changes {
                shared.run_state_hook(state);
            }
            // Pairs with the fence in `engine_pass` (and the engine's announced park).
            fence(Ordering::SeqCst);
            if !(self.doorbell.handed_off() || self.doorbell.has_pending() && self.doorbell.parked()) {
                break;
            }
            // Another holder now: it looks again when it lets go.
            let Ok(mut again) = self.core.try_lock() else { break };
            again.progress(None, &self.doorbell);
            core = again;
        }
    }

    /// How long an idle engine may sleep: without limit when every link has readiness
    /// events and no stack has a timer pending.
    fn nap(&self) -> (Option<Duration>, bool) {
        let now = Instant::now();
        let Ok(mut core) = self.core.try_lock() else {
            // Another thread holds the core (and takes what was handed off): sleep until the
            // wake-up computed last time. A timer set since is earlier than that one only if
            // its pass flagged a new earliest timer, which wakes a parked engine.
            let at = self.nap_until.load(Ordering::Acquire);
            return (
                (at != u64::MAX).then(|| Duration::from_nanos(at).saturating_sub(now - self.epoch)),
                false,
            );
        };
        // A thread that let go of the core while this one held it here found it taken and
        // left what it was to look at to this thread: the events this thread handed off to
        // it, and work posted while the engine was going to sleep (`let_go`). This guard is
        // not a pass and hands nothing on, so sleeping now would strand them (seen: a peer's
        // close never reported, the connection's readable event left in the hand-off queue).
        fence(Ordering::SeqCst);
        // Connections a pass left queued for another turn (its budget spent) are work too.
        if self.doorbell.handed_off() || self.doorbell.has_pending() || !core.ready.is_empty() {
            return (Some(Duration::ZERO), false);
        }
        core.new_earliest = false;
        let polled = (!core.polled.is_empty() || core.poll.is_none()).then_some(POLLED_NAP);
        let timer = core.next_timer().map(|t| t.saturating_duration_since(now));
        let nap = [polled, core.stack_delay(), timer].into_iter().flatten().min();
        let at =
            nap.map_or(u64::MAX, |n| u64::try_from((now - self.epoch + n).as_nanos()).unwrap_or(u64::MAX));
        self.nap_until.store(at, Ordering::Release);
        let quiet_ok = core.quiet_ok();
        // Events left after the look above, while this guard still held the core, are work too.
        if self.let_go_quietly(core) {
            return (Some(Duration::ZERO), false);
        }
        (nap, quiet_ok)
    }

    /// Lets go of the core held outside a pass by the engine thread (its look in
    /// [`Engine::nap`]) and says whether another thread left readiness events meanwhile:
    /// this runs no pass, so the engine thread must. (`let_go` would run it, but would also
    /// ring the doorbell for the engine's own announced sleep and wake it at once.)
    ///
    /// A thread woken in its queue's poll that finds the core held leaves its events and
    /// tries the core once more (`Engine::pass_or_hand_off`). When the holder was `nap`, past
    /// its look at the hand-off queue, both tries failed, the engine thread went to sleep,
    /// and the waiter (whose poll had taken the readiness edge, so the engine's never saw
    /// it) slept too, with the input unread: a 64 B Send ping-pong between two devices
    /// stalled for good, about one run in 70 of `iwarp bench --ops send --qps 3 --window 1`
    /// in a debug build with three such runs at once on two cores.
    fn let_go_quietly(&self, core: MutexGuard<'_, EngineCore>) -> bool {
        drop(core);
        // Pairs with the fence in `pass_or_hand_off`: either that thread's second try finds
        // the core free (and runs the pass with what it left), or this sees what it left.
        fence(Ordering::SeqCst);
        self.doorbell.handed_off()
    }

    /// An application thread was woken for input at `now` (see [`APP_BUSY`]).
    fn app_busy(&self, now: Instant) {
        let until = (now + APP_BUSY).saturating_duration_since(self.epoch);
        self.app_busy_until.store(u64::try_from(until.as_nanos()).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// How much longer an application thread is taken to be busy with input it was woken for.
    fn app_busy_for(&self, now: Instant) -> Option<Duration> {
        let until = Duration::from_nanos(self.app_busy_until.load(Ordering::Acquire));
        let left = until.saturating_sub(now.saturating_duration_since(self.epoch));
        (!left.is_zero()).then_some(left)
    }

    pub(crate) fn stats(&self) -> EngineStats {
        let (rx, tx, tx_staged, passes, visits) = {
            let core = self.core();
            (core.rx_stats, core.tx_stats, core.tx_staged, core.passes, core.visits)
        };
        let c = &self.counters;
        EngineStats {
            passes,
            direct_passes: c.direct_passes.load(Ordering::Relaxed),
            visits,
            sleeps: c.sleeps.load(Ordering::Relaxed),
            event_wakeups: c.event_wakeups.load(Ordering::Relaxed),
            timer_wakeups: c.timer_wakeups.load(Ordering::Relaxed),
            app_polls: c.app_polls.load(Ordering::Relaxed),
            waiting_passes: c.waiting_passes.load(Ordering::Relaxed),
            handoffs: c.handoffs.load(Ordering::Relaxed),
            quiet_sleeps: c.quiet_sleeps.load(Ordering::Relaxed),
            deafened: c.deafened.load(Ordering::Relaxed),
            contended_yields: c.contended_yields.load(Ordering::Relaxed),
            waiter_yields: c.waiter_yields.load(Ordering::Relaxed),
            alarms: c.alarms.load(Ordering::Relaxed),
            rx_bytes: rx.bytes,
            rx_in_place: rx.in_place,
            tx_bytes: tx.bytes,
            tx_by_ref: tx.by_ref,
            tx_staged,
            tx_moved: tx.moved,
        }
    }
}

/// Counts an application thread as blocked in a wait on one of the engine's completion
/// queues or queue pairs, for as long as it lives (see `Engine::app_waiters`).
pub(crate) struct WaitingApp<'a>(&'a Engine);

impl<'a> WaitingApp<'a> {
    pub(crate) fn new(e: &'a Engine) -> WaitingApp<'a> {
        e.app_waiters.fetch_add(1, Ordering::Relaxed);
        WaitingApp(e)
    }
}

impl Drop for WaitingApp<'_> {
    fn drop(&mut self) {
        self.0.app_waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Inline mode's driver for async waiters: while any task waits, sleeps in the readiness poll
/// (no longer than the engine's next timer) and runs the pass that wakes the tasks.
fn async_driver(e: &Engine, mut events: Events) {
    while !e.stop.load(Ordering::Acquire) {
        if e.async_waiters.load(Ordering::Acquire) == 0 {
            std::thread::park_timeout(Duration::from_millis(100));
            continue;
        }
        let nap = e.nap().0.map_or(Duration::from_millis(50), |n| n.min(Duration::from_millis(50)));
        e.collect_and_pass(&mut events, Some(nap));
    }
}

fn engine_loop(e: &Engine, mut events: Events) {
    let mode = e.config.poll_mode;
    let mut last_work = Instant::now();
    while !e.stop.load(Ordering::Acquire) {
        if e.collect_and_pass(&mut events, Some(Duration::ZERO)) {
            last_work = Instant::now();
            e.offer_core_to_waiters();
            continue;
        }
        let nap = match mode {
            // Idle for a while: offer the core to whatever else is runnable on it (the
            // application's threads, the peer's engine) and take it back at once if nothing is.
            // Spinning without it, four such threads on two cores waited for the scheduler's
            // tick at every hand-over.
            PollMode::Busy | PollMode::Inline if last_work.elapsed() >= BUSY_YIELD_AFTER => {
                std::thread::yield_now();
                false
            }
            PollMode::Busy | PollMode::Inline => {
                std::hint::spin_loop();
                false
            }
            // The adaptive spin polls the links for their next input, offering the core between
            // polls: a spinning engine kept the application's threads (the ones producing that
            // input) off the core, and 64 B Sends ran at 1.3-1.8 Mmsg/s, 2.1-2.4 with the
            // yields, on two cores.
            //
            // A yield that came back late gave the core to another thread that had work for it
            // (an application thread, the peer's engine): this spin competes for the core with
            // the threads it waits for, so the engine sleeps at once, as in event mode, when an
            // application thread waits for input: that thread takes the input from here. On
            // one core a ping-pong between two adaptive devices took twice event mode's round
            // trip (14.4-15.0 against 6.9-7.3 us): the spinning engine threads took turns with
            // the threads that had the messages. Where no application thread waits (a Read's
            // responder, say), only the engine picks up the input, and spins on: sleeping
            // there made a 4 KiB Read's round trip 8.6 -> 23-25 us.
            PollMode::Adaptive if last_work.elapsed() < e.config.spin => {
                let before = Instant::now();
                std::thread::yield_now();
                let contended =
                    before.elapsed() >= CONTENDED_YIELD && e.app_waiters.load(Ordering::Relaxed) > 0;
                if contended {
                    bump(&e.counters.contended_yields, 1);
                }
                contended
            }
            PollMode::Adaptive | PollMode::Event => true,
        };
        if nap {
            e.sleep(&mut events);
            // Back from a nap: keep napping while idle instead of spinning again.
            last_work = Instant::now().checked_sub(e.config.spin).unwrap_or_else(Instant::now);
        }
    }
}

impl Engine {
    /// After a pass of the engine thread that did work: in adaptive mode, while an application
    /// thread waits for what the pass may have published, offers it the core before the next
    /// pass; whether it did. Where the two share a CPU, the engine otherwise went on reading
    /// until the link was empty, and only then left the core to the thread that reposts the
    /// receives and answers: a sender out of credits by then waited for that thread, and the
    /// receiver then waited for the sender (64 B Sends with perftest's 512 receives, both ends
    /// pinned: 6.9-7.9 -> 8.6-9.6 Mmsg/s; docs/architecture.md, "What a message costs on the
    /// way"). Where the waiting thread has a CPU of its own the yield is a system call that
    /// returns at once. A busy engine spins for latency on a core of its own and keeps it;
    /// in event mode the engine sleeps as soon as it is idle, which gives the core up anyway.
    fn offer_core_to_waiters(&self) -> bool {
        if self.config.poll_mode != PollMode::Adaptive || self.app_waiters.load(Ordering::Relaxed) == 0 {
            return false;
        }
        bump(&self.counters.waiter_yields, 1);
        std::thread::yield_now();
        true
    }

    /// Collects readiness events (waiting up to `timeout`) and runs a pass with them (or
    /// leaves them to the thread that holds the core: then no work is reported).
    fn collect_and_pass(&self, events: &mut Events, timeout: Option<Duration>) -> bool {
        match &self.poll {
            Some(poll) => {
                poll.wait(events, timeout);
                self.engine_pass(Some(events)).unwrap_or(false)
            }
            None => self.engine_pass(None).unwrap_or(false),
        }
    }

    /// The engine thread's sleep in its doorbell poll `quiet`, deaf to the links for `busy`
    /// (or hearing them without it, within [`DEAF_BOUND`] while posters would make it deaf),
    /// up to `nap`, and the pass after it; false, having done nothing, when the links could
    /// not be heard (the engine then sleeps in `poll`).
    fn sleep_in(
        &self,
        quiet: &DoorbellPoll,
        poll: &Poll,
        busy: Option<Duration>,
        nap: Option<Duration>,
        events: &mut Events,
    ) -> bool {
        let hear = busy.is_none();
        let now = Instant::now();
        let timeout = {
            let mut ctl = lock(&self.sleep_ctl);
            let timeout = match busy {
                Some(busy) => Some(nap.map_or(busy, |n| n.min(busy))),
                // While posters would make it deaf, a sleep hearing the links ends in time for
                // them to (see `Engine::deafen`).
                None if ctl.posters_deafen(now) => {
                    let bound = ctl.hearing_bound(now);
                    Some(nap.map_or(bound, |n| n.min(bound)))
                }
                None => nap,
            };
            if ctl.hearing != hear {
                if quiet.hear_links(poll, hear) {
                    ctl.hearing = hear;
                } else if hear {
                    return false;
                }
            }
            // Under the lock: a poster that makes this sleep deaf sets it after this.
            self.quiet_sleeping.store(!hear, Ordering::SeqCst);
            ctl.asleep = true;
            ctl.until = timeout.and_then(|t| now.checked_add(t));
            timeout
        };
        if !hear {
            bump(&self.counters.quiet_sleeps, 1);
        }
        let woke = quiet.wait(timeout);
        lock(&self.sleep_ctl).asleep = false;
        self.quiet_sleeping.store(false, Ordering::SeqCst);
        // What the links did: what woke this sleep, or what they did while it was deaf.
        poll.wait(events, Some(Duration::ZERO));
        self.doorbell.set_parked(false);
        self.engine_pass(Some(events));
        if woke.rang || woke.links {
            bump(&self.counters.event_wakeups, 1);
        } else if nap.is_some_and(|n| timeout.is_some_and(|t| n <= t)) {
            bump(&self.counters.timer_wakeups, 1);
        }
        true
    }

    /// The engine thread has nothing to do: sleeps until a doorbell, a link or a stack's
    /// frame or timer wakes it.
    fn sleep(&self, events: &mut Events) {
        self.doorbell.set_parked(true);
        // One more pass after announcing the park: work posted before the flag was visible
        // is found here; work posted after it rings the doorbell.
        if self.collect_and_pass(events, Some(Duration::ZERO)) || self.stop.load(Ordering::Acquire) {
            self.doorbell.set_parked(false);
            return;
        }
        // Announced before `nap` looks at the links under the core's lock: a pass that fills
        // a link after that look wakes this thread (`let_go`), whose sleep on the doorbell
        // alone would miss the link's writable event.
        self.quiet_sleeping.store(true, Ordering::SeqCst);
        let (nap, quiet_ok) = self.nap();
        let busy = self.app_busy_for(Instant::now()).filter(|_| quiet_ok);
        if nap == Some(Duration::ZERO) {
            // Work now (left by a thread that let go while `nap` held the core, or a timer
            // that is due): a pass instead of a sleep.
            self.quiet_sleeping.store(false, Ordering::SeqCst);
            self.doorbell.set_parked(false);
            self.engine_pass(None);
            return;
        }
        bump(&self.counters.sleeps, 1);
        // An application thread was just woken for input and is about to wait for more (a
        // ping-pong's answer): sleep on the doorbell alone, so that the next input wakes that
        // thread, not this one. Input that comes while it is still busy (preempted by the
        // peer it answered, say) finds no thread sleeping in its queue's poll, and woke this
        // one instead, on every other round trip: a wake-up, on a virtual machine an
        // interrupt to another core, and a pass racing the application's for the same input.
        // What the links did meanwhile is collected when this sleep ends, at the latest when
        // the application thread is no longer taken to be busy.
        //
        // Once that poll is made, the engine sleeps there whenever it may sleep deaf, hearing
        // the links through it when no application thread is busy: a thread that posts can
        // then make the sleep deaf without waking the engine (`Engine::deafen`).
        let quiet = match busy {
            Some(_) => {
                self.quiet.get_or_init(|| self.poll.as_ref().and_then(|p| p.doorbell_only().ok())).as_ref()
            }
            // Hearing the links, this sleep is the engine's poll's, stacks and links without
            // events included (their timers are in `nap`): only a deaf one needs `quiet_ok`,
            // which a poster checks for itself under the core (`nap` cannot always look).
            None => self.quiet.get().and_then(Option::as_ref),
        };
        if let (Some(quiet), Some(poll)) = (quiet, &self.poll)
            && self.sleep_in(quiet, poll, busy, nap, events)
        {
            return;
        }
        self.quiet_sleeping.store(false, Ordering::SeqCst);
        let woke_by_event = match &self.poll {
            Some(poll) => {
                poll.wait(events, nap);
                !events.is_empty()
            }
            None => {
                std::thread::park_timeout(nap.unwrap_or(POLLED_NAP));
                self.doorbell.has_pending()
            }
        };
        self.doorbell.set_parked(false);
        // What woke the engine is handled now, in the events just collected (or by the
        // thread that holds the core: often an application thread woken by the same input).
        self.engine_pass(self.poll.as_ref().map(|_| &*events));
        let woken = if woke_by_event { &self.counters.event_wakeups } else { &self.counters.timer_wakeups };
        bump(woken, 1);
    }
}

/// One connection the engine runs.
struct ConnSlot {
    /// `iwarp_conn` span: every event of this connection is recorded inside it.
    span: tracing::Span,
    conn: Connection,
    link: Box<dyn Link>,
    pd: ProtectionDomainId,
    shared: Arc<QpShared>,
    /// Framed bytes for the link: `tx[tx_off..tx_len]` are still to be written. Taken from
    /// the engine's pool when there is something to frame and given back once written, so
    /// an idle connection holds none. Never zero-filled after allocation: the queue pair and
    /// framer write into it directly.
    tx: Vec<u8>,
    tx_off: usize,
    tx_len: usize,
    link_down: bool,
    write_shut: bool,
    /// The queue pair's retired send count when last looked at.
    sq_retired: u64,
    /// The link reports readiness events; without them it is visited every pass.
    has_source: bool,
    /// The poll reports the peer's close of this link on its own, so a short read means
    /// the socket is drained (see `Poll::add_link`).
    short_read_drains: bool,
    /// The poll reported the peer's close (or an error): read until a read says so, short
    /// reads included (the close may have come with data the same edge reported).
    closed: bool,
    /// The link may have bytes to read (cleared when a read finds it drained).
    readable: bool,
    /// The link may take bytes (cleared when a write is cut short).
    writable: bool,
    /// The key is in the ready list.
    queued: bool,
    /// This end sent the MPA Request.
    initiator: bool,
    /// Bytes have arrived from the peer since the connection started.
    heard: bool,
    /// When the next nudge is due (initiators that have sent but heard nothing), and how many
    /// have gone out.
    nudge_at: Option<Instant>,
    nudges: usize,
    /// An initiator sent FPDUs before it heard from the peer: it nudges once when it first
    /// hears, unless it sends something then anyway.
    owes_nudge: bool,
    /// When the queue pair was first seen finished (Error): the linger starts.
    finished_at: Option<Instant>,
    /// The connection's timer in the engine's heap, if any.
    timer_at: Option<Instant>,
    /// Send and receive work requests taken from the application's rings and not yet handed
    /// to the queue pair; empty between visits, kept for their capacity (swapped with the
    /// rings', see `WrRing::take_all`).
    sq_taken: VecDeque<CheckedSendWr>,
    rq_taken: VecDeque<RecvWr>,
}

impl std::fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSlot").field("qp_num", &self.shared.qp_num).finish_non_exhaustive()
    }
}

/// What one visit of a connection found.
#[derive(Debug, Default)]
struct Visit {
    /// Something happened.
    work: bool,
    /// The connection has more to do right away (a read or write budget ran out).
    again: bool,
    /// Its read budget ran out: more input may wait in the link.
    input_left: bool,
    /// The connection is finished and fully reported: drop it.
    done: bool,
    /// Visit the connection again at this time (a nudge, the end of a linger).
    timer: Option<Instant>,
    /// Bytes framed but left unsent by a full link, copied to go out later.
    staged: usize,
    /// The queue pair's new state, which its state hook waits to hear of.
    state_change: Option<QpState>,
}

/// Everything the engine owns.
#[derive(Debug)]
pub(crate) struct EngineCore {
    pub(crate) table: TaggedBufferTable,
    /// Where links are registered for readiness.
    poll: Option<Arc<Poll>>,
    /// Connections by key (the key is the link's readiness token).
    slots: Vec<Option<ConnSlot>>,
    free_keys: Vec<usize>,
    /// Keys to visit in the next pass.
    ready: Vec<usize>,
    /// A visit of the current round of [`EngineCore::visit_ready`] spent its read budget.
    input_left: bool,
    /// Queue pairs whose state changed in a pass, for their state hooks, which run once the
    /// core is let go (`Engine::let_go`).
    state_changes: Vec<(Arc<QpShared>, QpState)>,
    /// Connections whose link was full and that wait for its writable event (which only
    /// the engine's poll reports).
    waiting_writable: usize,
    /// The vectored write's buffer list, kept empty between writes so that a write
    /// allocates none (see [`reuse_iov`]).
    iov: Vec<IoSlice<'static>>,
    /// Received bytes, all connections together.
    rx_stats: RxStats,
    /// Transmitted bytes, all connections together, and those staged for a full link.
    tx_stats: TxStats,
    tx_staged: u64,
    /// Passes run, and connection visits they made ([`EngineStats::passes`],
    /// [`EngineStats::visits`]): counted under the lock every pass holds, so with no atomic
    /// update of their own.
    passes: u64,
    visits: u64,
    /// The FPDUs a visit frames for one vectored write (reused).
    tx_batch: TxBatch,
    /// Connection timers (nudges, lingers): when, and whose key. A timer whose connection is
    /// gone or was rescheduled just causes a visit.
    timers: std::collections::BinaryHeap<std::cmp::Reverse<(Instant, usize)>>,
    /// How long a finished connection may wait for its last bytes to leave.
    linger: Duration,
    /// [`DeviceConfig::zero_copy`].
    zero_copy: bool,
    /// A pass set a timer earlier than any before, and the engine thread has not computed
    /// its sleep since: a parked engine must be woken to recompute it. Cleared only by that
    /// computation ([`Engine::nap`]), not by the wake-up: another thread's zero-timeout
    /// wait in the engine's poll ([`Engine::try_progress`]) can take the doorbell's event
    /// before the sleeping engine sees it, and the pass that thread runs next then wakes the
    /// engine again instead of leaving it asleep past the timer (an initiator's nudges to a
    /// silent peer never went out that way).
    new_earliest: bool,
    /// Links without readiness events: visited every pass.
    polled: Vec<usize>,
    /// Userspace TCP/IP stacks whose links the connections use, polled every pass.
    stacks: Vec<SmolStack>,
    rx: Vec<u8>,
    tx_pool: Vec<Vec<u8>>,
    next_pd: u32,
    next_qp: u32,
    next_va: u64,
}

impl EngineCore {
    fn new(max_regions: u32, linger: Duration, zero_copy: bool, poll: Option<Arc<Poll>>) -> EngineCore {
        EngineCore {
            table: TaggedBufferTable::new(max_regions),
            poll,
            slots: Vec::new(),
            free_keys: Vec::new(),
            ready: Vec::new(),
            input_left: false,
            state_changes: Vec::new(),
            waiting_writable: 0,
            iov: Vec::new(),
            timers: std::collections::BinaryHeap::new(),
            rx_stats: RxStats::default(),
            tx_batch: TxBatch::default(),
            tx_stats: TxStats::default(),
            tx_staged: 0,
            passes: 0,
            visits: 0,
            linger,
            zero_copy,
            new_earliest: false,
            polled: Vec::new(),
            stacks: Vec::new(),
            rx: vec![0; RX_CHUNK],
            tx_pool: Vec::new(),
            next_pd: 1,
            next_qp: 1,
            next_va: 0x7f10_0000_0000,
        }
    }

    pub(crate) fn alloc_pd(&mut self) -> u32 {
        let id = self.next_pd;
        self.next_pd += 1;
        id
    }

    /// A virtual address range for a new region (page aligned, never reused).
    pub(crate) fn alloc_va(&mut self, len: u64) -> u64 {
        let va = self.next_va;
        self.next_va = self.next_va.saturating_add(len.div_ceil(4096).max(1) * 4096 + 4096);
        va
    }

    pub(crate) fn connections(&self) -> usize {
        self.slots.len() - self.free_keys.len()
    }

    /// Adds a smoltcp stack to the ones polled every pass (once: a stack already attached is
    /// left as is). Its frame descriptor wakes a sleeping engine.
    pub(crate) fn attach_stack(&mut self, stack: &SmolStack) -> bool {
        let fd = stack.raw_fd();
        if self.stacks.iter().any(|s| s.raw_fd() == fd) {
            return false;
        }
        if let Some(p) = &self.poll {
            let _ = p.add(stack.fd(), STACK_BASE - self.stacks.len() as Token, false);
        }
        // Frames come in only when a pass polls the stack, before the visits: a visit takes
        // the receives the application posted and then reads, so a Send its peer made in
        // answer to those receives is never read before them (a read that polled the stack
        // itself could bring it in between).
        stack.set_poll_on_read(false);
        self.stacks.push(stack.clone());
        true
    }

    /// How long the engine may sleep before a stack's timer (retransmission, delayed ACK) is
    /// due; `None` when no stack has one pending.
    fn stack_delay(&self) -> Option<Duration> {
        if self.stacks.is_empty() {
            return None;
        }
        let now = iwarp_netdev::smoltcp::time::Instant::now();
        self.stacks.iter().filter_map(|s| s.poll_delay(now)).min()
    }

    fn poll_stacks(&self) -> bool {
        let mut work = false;
        for stack in &self.stacks {
            work |= stack.poll_now();
        }
        work
    }

    /// Hands a connected link and its queue pair to the engine; `shared` makes what the
    /// application's handle shares with the engine, given the queue pair number and the
    /// connection's key.
    pub(crate) fn add(
        &mut self,
        conn: Connection,
        link: Box<dyn Link>,
        pd: ProtectionDomainId,
        shared: impl FnOnce(u32, usize) -> QpShared,
    ) -> Arc<QpShared> {
        let mut conn = conn;
        if !self.zero_copy {
            conn.set_direct_min(None);
            conn.set_tx_by_ref_min(None);
        }
        let qp_num = self.next_qp;
        self.next_qp += 1;
        let key = self.free_keys.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let shared = Arc::new(shared(qp_num, key));
        // Completion queues' own polls first: a thread sleeping in one of them is woken
        // ahead of the engine (see `Poll::add`).
        if let (Some(_), Some(fd)) = (&self.poll, link.fd()) {
            for cq in [&shared.send_cq, &shared.recv_cq] {
                if let Some(w) = cq.watch() {
                    let _ = w.add(fd, key as Token, false);
                }
            }
        }
        let (has_source, short_read_drains) = match (&self.poll, link.fd()) {
            (Some(p), Some(fd)) => match p.add_link(fd, key as Token) {
                Ok(watched) => (true, watched),
                Err(_) => (false, false),
            },
            _ => (false, false),
        };
        if !has_source {
            self.polled.push(key);
        }
        let span = tracing::debug_span!(
            "iwarp_conn",
            qp = qp_num,
            peer = ?link.peer_addr(),
            crc = shared.params.crc,
            mulpdu = shared.config.mulpdu
        );
        span.in_scope(|| tracing::debug!(ird = shared.config.ird, ord = shared.config.ord, "connection up"));
        self.slots[key] = Some(ConnSlot {
            span,
            conn,
            link,
            pd,
            shared: shared.clone(),
            tx: Vec::new(),
            tx_off: 0,
            tx_len: 0,
            link_down: false,
            write_shut: false,
            sq_retired: 0,
            has_source,
            short_read_drains,
            closed: false,
            // Bytes may already wait in the socket (they followed the MPA exchange).
            readable: true,
            writable: true,
            queued: false,
            initiator: shared.params.role == iwarp_mpa::Role::Initiator,
            heard: false,
            nudge_at: None,
            nudges: 0,
            owes_nudge: false,
            finished_at: None,
            timer_at: None,
            sq_taken: VecDeque::new(),
            rq_taken: VecDeque::new(),
        });
        self.schedule(key);
        shared
    }

    /// Adds the descriptors of every connection completing on `cq` to the queue's own poll.
    pub(crate) fn watch_all(&mut self, cq: &CqShared) {
        let Some(w) = cq.watch() else { return };
        for (key, slot) in self.slots.iter_mut().enumerate() {
            let Some(slot) = slot else { continue };
            let uses = std::ptr::eq(&*slot.shared.send_cq, cq) || std::ptr::eq(&*slot.shared.recv_cq, cq);
            if uses
                && slot.has_source
                && let (Some(p), Some(fd)) = (&self.poll, slot.link.fd())
                && w.add(fd, key as Token, false).is_ok()
            {
                // The engine's registration moves behind the queue's, so a thread sleeping
                // in the queue's poll is woken first. Re-adding reports a socket that is
                // already ready, so nothing is missed in between.
                let _ = p.delete(fd);
                slot.short_read_drains = matches!(p.add_link(fd, key as Token), Ok(true));
            }
        }
    }

    /// The earliest live timer; drops the ones no connection waits for any more.
    fn next_timer(&mut self) -> Option<Instant> {
        while let Some(&std::cmp::Reverse((at, key))) = self.timers.peek() {
            let live = matches!(self.slots.get(key), Some(Some(slot)) if slot.timer_at == Some(at));
            if live {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// Whether a pass set a new earliest timer since the engine thread last computed its
    /// sleep.
    fn new_earliest(&self) -> bool {
        self.new_earliest
    }

    /// Puts `key` on the ready list (once).
    fn schedule(&mut self, key: usize) {
        if let Some(Some(slot)) = self.slots.get_mut(key)
            && !slot.queued
        {
            slot.queued = true;
            self.ready.push(key);
        }
    }

    /// Closes every connection (the device is going away): each queue pair flushes its work,
    /// the completions are published, and work posted later is flushed by the poster.
    fn shutdown(&mut self) {
        for slot in self.slots.iter_mut().filter_map(Option::as_mut) {
            slot.conn.qp().close();
            slot.link.shutdown_write();
            publish(slot);
            if slot.shared.set_state(QpState::Error) {
                self.state_changes.push((slot.shared.clone(), QpState::Error));
            }
            slot.shared.retire();
        }
        self.slots.clear();
        self.free_keys.clear();
        self.ready.clear();
        self.polled.clear();
        self.waiting_writable = 0;
    }

    /// Whether the engine thread may sleep deaf to the links: stacks and links without
    /// readiness events need its own polling, and a full link its writable event.
    fn quiet_ok(&self) -> bool {
        self.stacks.is_empty() && self.polled.is_empty() && self.waiting_writable == 0
    }

    /// One pass: collects what is ready (readiness events, doorbells, links without events)
    /// and visits those connections. Returns whether anything happened.
    fn progress(&mut self, events: Option<&Events>, doorbell: &Doorbell) -> bool {
        // Frames received reach the sockets before the connections read them...
        let mut work = self.poll_stacks();
        self.note(
            events
                .into_iter()
                .flat_map(Events::iter)
                .copied()
                .chain(std::iter::from_fn(|| doorbell.take_handed_off())),
        );
        while let Some(key) = doorbell.take() {
            if let Some(Some(slot)) = self.slots.get(key) {
                slot.shared.unschedule();
                self.schedule(key);
            }
        }
        for i in 0..self.polled.len() {
            let key = self.polled[i];
            self.schedule(key);
        }
        if !self.timers.is_empty() {
            let now = Instant::now();
            while let Some(&std::cmp::Reverse((at, key))) = self.timers.peek() {
                if at > now {
                    break;
                }
                self.timers.pop();
                if let Some(Some(slot)) = self.slots.get_mut(key)
                    && slot.timer_at == Some(at)
                {
                    slot.timer_at = None;
                }
                self.schedule(key);
            }
        }
        work |= self.visit_ready();
        // ... and what they wrote leaves now rather than at the next pass.
        if !self.stacks.is_empty() {
            work |= self.poll_stacks();
        }
        self.passes += 1;
        work
    }

    /// The pass of a thread woken in a queue's own poll, given what woke it: the connections
    /// the events name are visited, and nothing else (see [`EngineCore::visit_direct`] for
    /// what the general pass's other rounds are left to), then read on until `due`
    /// ([`EngineCore::read_on`]). The general pass where [`EngineCore::every_pass_serves`].
    fn progress_events(&mut self, events: &Events, doorbell: &Doorbell, due: impl Fn() -> bool) -> bool {
        if self.every_pass_serves() {
            return self.progress(Some(events), doorbell);
        }
        self.note(events.iter().copied());
        let mut work = self.visit_ready();
        work |= self.read_on(due);
        self.passes += 1;
        work
    }

    /// After a waiting thread's first round of visits: while a connection's read budget
    /// ([`RX_READS_PER_PASS`]) ran out in the last round (input kept coming, a large message
    /// arriving as it is read), visits the connections left ready again, up to
    /// [`WAITER_ROUNDS`] rounds in all, until `due` or a round finds nothing to do. Whether one
    /// did something. Left to the engine thread, the rest of the message cost a wake-up of that
    /// thread, and of the waiting one again once the engine had placed it (the last of a
    /// 256 KiB message's nine FPDUs reached its waiter about 40 us after the rest, on two
    /// cores). A connection left ready only with more to send does not keep the thread: the
    /// engine thread, woken as the core is let go, sends the rest, while the application
    /// thread goes back to its own work (posting the next window of a stream), as before there
    /// was any reading on.
    fn read_on(&mut self, due: impl Fn() -> bool) -> bool {
        let mut work = false;
        for _ in 1..WAITER_ROUNDS {
            if !self.input_left || self.ready.is_empty() || due() || !self.visit_ready() {
                break;
            }
            work = true;
        }
        work
    }

    /// Records readiness events on their connections and queues those for a visit.
    fn note(&mut self, events: impl Iterator<Item = Ready>) {
        for ev in events {
            if ev.token == DOORBELL {
                continue;
            }
            let Ok(key) = usize::try_from(ev.token) else { continue };
            if let Some(Some(slot)) = self.slots.get_mut(key) {
                slot.readable |= ev.readable;
                if ev.writable && !slot.writable {
                    self.waiting_writable -= 1;
                }
                slot.writable |= ev.writable;
                slot.closed |= ev.closed;
                self.schedule(key);
            }
        }
    }

    /// Visits the connections queued for a visit; whether anything happened.
    fn visit_ready(&mut self) -> bool {
        self.input_left = false;
        let batch = std::mem::take(&mut self.ready);
        let mut work = false;
        for &key in &batch {
            if let Some(Some(slot)) = self.slots.get_mut(key) {
                slot.queued = false;
                self.visits += 1;
                work |= self.visit_key(key);
            }
        }
        // Keep the list's allocation for the next pass.
        let mut batch = batch;
        batch.clear();
        if self.ready.is_empty() {
            self.ready = batch;
        }
        work
    }

    /// Visits the connection at `key` (which must hold one) and keeps the books: traffic
    /// counts, its timer, its removal once finished, another turn when it has more to do.
    /// Whether anything happened.
    fn visit_key(&mut self, key: usize) -> bool {
        let Some(Some(slot)) = self.slots.get_mut(key) else { return false };
        let (before, tx_before) = (slot.conn.rx_stats(), slot.conn.tx_stats());
        let was_writable = slot.writable;
        let v = visit(
            slot,
            &mut self.table,
            &mut self.rx,
            &mut self.tx_batch,
            &mut self.tx_pool,
            &mut self.iov,
            self.linger,
        );
        if was_writable && !slot.writable {
            self.waiting_writable += 1;
        }
        let (after, tx_after) = (slot.conn.rx_stats(), slot.conn.tx_stats());
        self.rx_stats.bytes += after.bytes - before.bytes;
        self.rx_stats.in_place += after.in_place - before.in_place;
        self.tx_stats.bytes += tx_after.bytes - tx_before.bytes;
        self.tx_stats.by_ref += tx_after.by_ref - tx_before.by_ref;
        self.tx_stats.moved += tx_after.moved - tx_before.moved;
        self.tx_staged += v.staged as u64;
        if let Some(state) = v.state_change {
            self.state_changes.push((slot.shared.clone(), state));
        }
        if v.done {
            self.remove(key);
            return v.work;
        }
        // One timer per connection in the heap: a later one waits for the earlier; one
        // the connection no longer needs is left to go stale.
        if v.timer.is_none() {
            slot.timer_at = None;
        }
        if let Some(at) = v.timer
            && slot.timer_at.is_none_or(|t| at < t)
        {
            slot.timer_at = Some(at);
            self.new_earliest |= self.timers.peek().is_none_or(|t| at < t.0.0);
            self.timers.push(std::cmp::Reverse((at, key)));
        }
        if v.again {
            self.schedule(key);
        }
        self.input_left |= v.input_left;
        v.work
    }

    /// Whether every pass must serve something besides the connections it visits: a smoltcp
    /// stack, or a link without readiness events. Then the general pass runs, not one that
    /// visits only some connections.
    fn every_pass_serves(&self) -> bool {
        !self.stacks.is_empty() || !self.polled.is_empty()
    }

    /// A pass that visits `qp`'s connection alone, for a poster that found the engine
    /// asleep: the work it posted goes out without the doorbell's queue and the general
    /// pass's rounds (readiness handed off, due timers), which the engine thread or the
    /// holder's `let_go` see to. Whether it ran: not where those rounds cannot wait
    /// ([`EngineCore::every_pass_serves`]) or the queue pair has no connection here
    /// (retired: the poster's schedule flushes its rings).
    fn visit_direct(&mut self, qp: &QpShared) -> bool {
        if self.every_pass_serves() {
            return false;
        }
        match self.slots.get(qp.key) {
            Some(Some(slot)) if std::ptr::eq(Arc::as_ptr(&slot.shared), qp) => {
                self.passes += 1;
                self.visits += 1;
                self.visit_key(qp.key);
                true
            }
            _ => false,
        }
    }

    /// Drops a finished connection; work posted to it from now on is flushed by the poster.
    fn remove(&mut self, key: usize) {
        let Some(mut slot) = self.slots.get_mut(key).and_then(Option::take) else { return };
        if !slot.writable {
            self.waiting_writable -= 1;
        }
        if slot.has_source {
            if let (Some(p), Some(fd)) = (&self.poll, slot.link.fd()) {
                let _ = p.delete(fd);
            }
        } else {
            self.polled.retain(|&k| k != key);
        }
        give_back(&mut self.tx_pool, &mut slot.tx);
        slot.shared.retire();
        self.free_keys.push(key);
    }
}

/// Empties a list of buffers that borrowed from one pass's memory and gives its allocation
/// back for the next write. The list outlives no borrow: collected from its own emptied
/// iterator into a type of the same layout, it keeps its allocation (std collects such a
/// `Vec` in place).
fn reuse_iov(mut iov: Vec<IoSlice<'_>>) -> Vec<IoSlice<'static>> {
    iov.clear();
    iov.into_iter().map(|_| IoSlice::new(&[])).collect()
}

/// Returns a connection's transmit buffer to the pool (or frees it when the pool is full).
fn give_back(pool: &mut Vec<Vec<u8>>, tx: &mut Vec<u8>) {
    let buf = std::mem::take(tx);
    if buf.capacity() > 0 && pool.len() < TX_POOL {
        pool.push(buf);
    }
}

/// Hands the receives the application posted to the queue pair; whether there were any.
fn take_posted_receives(slot: &mut ConnSlot) -> bool {
    post_taken_receives(&slot.shared, &mut slot.rq_taken, slot.conn.qp())
}

/// Moves the receives posted to `shared`'s ring into `qp` (through `taken`, kept for its
/// capacity); whether there were any.
#[inline]
fn post_taken_receives(shared: &QpShared, taken: &mut VecDeque<RecvWr>, qp: &mut QueuePair) -> bool {
    // Looked at up to three times a visit, and usually empty: the call costs more than that.
    shared.rq.may_hold() && post_receives(shared, taken, qp)
}

/// [`post_taken_receives`] once the ring may hold receives.
fn post_receives(shared: &QpShared, taken: &mut VecDeque<RecvWr>, qp: &mut QueuePair) -> bool {
    shared.rq.take_all(taken);
    let any = !taken.is_empty();
    qp.post_recvs(taken, |wr_id, e| {
        tracing::debug!(wr_id, error = %e, "post_recv refused");
        shared.rq_retired(1);
        shared.recv_cq.push(WorkCompletion {
            status: WcStatus::LocalLengthError,
            ..WorkCompletion::flushed(shared.qp_num, wr_id, WcOpcode::Recv)
        });
    });
    any
}

/// Sends a nudge (a zero-length RDMA Write, see [`NUDGES`]) on an idle link, whole or not at
/// all: one the link took only in part would cut the stream, which then goes down. Whether
/// it went out.
fn nudge(slot: &mut ConnSlot, why: &str) -> bool {
    let mut nudge = Vec::new();
    slot.conn.nudge(&mut nudge);
    tracing::debug!(n = slot.nudges, why, "nudging the peer with a zero-length Write");
    match slot.link.send(&nudge) {
        // The link is idle, so it takes a few bytes.
        Ok(n) if n == nudge.len() => true,
        Ok(0) => false,
        Ok(_) | Err(_) => {
            slot.link_down = true;
            slot.conn.handle_llp_lost();
            false
        }
    }
}

/// Moves the queue pair's events and completions to the application: events first, so the
/// reason for a flush is there before the flushed requests; each queue's waiters are woken
/// once for the batch.
fn publish(slot: &mut ConnSlot) -> bool {
    let shared = &slot.shared;
    let mut work = false;
    while let Some(e) = slot.conn.qp().poll_event() {
        tracing::debug!(event = ?e, "queue pair event");
        work = true;
        shared.push_event(e);
    }
    // Queue slots are given back before the completions that free them are visible: an
    // application that polls a completion may post into its slot at once (verbs).
    let qp = slot.conn.qp_ref();
    let retired = qp.sq_retired();
    shared.sq_retired(usize::try_from(retired - slot.sq_retired).unwrap_or(usize::MAX));
    slot.sq_retired = retired;
    let qp = slot.conn.qp();
    if qp.pending_completions().len() == 0 {
        return work;
    }
    // Read where they lie, each queue's under one lock; in their order where both queues
    // are one. The receive queue's slots are given back all at once (one atomic update a
    // visit rather than one a message), under the lock, before the pop that could see them.
    let receives = std::cell::Cell::new(0usize);
    let wc = |c: &Completion| {
        tracing::trace!(wr_id = c.wr_id, status = ?c.status, opcode = ?c.opcode, len = c.byte_len, "completion");
        receives.set(receives.get() + usize::from(is_receive(c.opcode)));
        WorkCompletion::new(shared.qp_num, *c)
    };
    let give_back = || shared.rq_retired(receives.get());
    if Arc::ptr_eq(&shared.send_cq, &shared.recv_cq) {
        if shared.send_cq.push_all_quiet(qp.pending_completions().map(wc), give_back) {
            shared.send_cq.signal();
        }
    } else {
        let received = qp.pending_completions().filter(|c| is_receive(c.opcode));
        if shared.recv_cq.push_all_quiet(received.map(wc), give_back) {
            shared.recv_cq.signal();
        }
        let sent = qp.pending_completions().filter(|c| !is_receive(c.opcode));
        if shared.send_cq.push_all_quiet(sent.map(wc), || {}) {
            shared.send_cq.signal();
        }
    }
    qp.clear_completions();
    true
}

/// Whether a completion of this kind belongs to the receive queue.
fn is_receive(opcode: WcOpcode) -> bool {
    matches!(opcode, WcOpcode::Recv | WcOpcode::RecvImmediate)
}

/// One visit of a ready connection.
fn visit(
    slot: &mut ConnSlot,
    table: &mut TaggedBufferTable,
    rx: &mut [u8],
    batch: &mut TxBatch,
    pool: &mut Vec<Vec<u8>>,
    iov_store: &mut Vec<IoSlice<'static>>,
    linger: Duration,
) -> Visit {
    let span = slot.span.clone();
    let _entered = span.enter();
    let mut v = Visit::default();
    let mut mem = TableMemory { table, pd: slot.pd };

    // Work requests from the application.
    let shared = &slot.shared;
    shared.sq.take_all(&mut slot.sq_taken);
    if !slot.sq_taken.is_empty() {
        v.work = true;
        if tracing::enabled!(tracing::Level::TRACE) {
            for wr in &slot.sq_taken {
                tracing::trace!(wr_id = wr.wr().wr_id, op = ?wr.wr().op, "post_send");
            }
        }
        // The whole list at once (swapped in, where the queue pair's send queue is empty).
        slot.conn.qp().post_checked_sends(&mut slot.sq_taken, |wr_id, opcode, e| {
            // Checked on the application side already; should the queue pair refuse it, it
            // completes with an error rather than vanishing.
            tracing::debug!(wr_id, error = %e, "post_send refused");
            shared.sq_retired(1);
            shared.send_cq.push(WorkCompletion {
                status: WcStatus::LocalLengthError,
                ..WorkCompletion::flushed(shared.qp_num, wr_id, opcode)
            });
        });
    }
    v.work |= take_posted_receives(slot);
    let shared = &slot.shared;
    if shared.take_disconnect() {
        v.work = true;
        slot.conn.qp().close();
    }

    // Input: read until the link is drained (edge-triggered readiness) or the budget is
    // spent (then the connection stays ready).
    if !slot.link_down && slot.readable {
        let mut reads = 0;
        let mut arrived = false;
        loop {
            if reads == RX_READS_PER_PASS {
                v.again = true;
                v.input_left = true;
                break;
            }
            reads += 1;
            // Receives posted before the read returned: the application may have answered the
            // completions of an earlier visit and let its peer send into them, and what the
            // peer sent may be what this read brings. Taken after the read (before its bytes
            // are handled), since a peer told of new receives sends into them at once: taken
            // before it, a batch of receives posted in between was missed and the peer's
            // Sends found no buffer (a Terminate, DDP "no buffer available", about one run in
            // 40 of `iwarp bench --ops send`).
            let (link, shared, taken) = (&mut slot.link, &slot.shared, &mut slot.rq_taken);
            let mut posted = false;
            let step = slot.conn.receive_then(
                &mut mem,
                rx,
                |bufs| link.recv_vectored(bufs),
                |qp| posted = post_taken_receives(shared, taken, qp),
            );
            v.work |= posted;
            match step {
                Ok(step) if step.read == 0 => {
                    slot.readable = !slot.has_source;
                    // Drained: a close the poll reported has been read by now (an error it
                    // reported shows in the next read or write).
                    slot.closed = false;
                    break;
                }
                Ok(step) => {
                    v.work = true;
                    slot.heard = true;
                    arrived = true;
                    // A read that came back short drained the socket: what arrives later is
                    // a new edge. The peer's close may have come in under the same edge as
                    // this data and been consumed by this read (only the next read would
                    // say so), but where the poll watches closes on their own
                    // (`Poll::add_link`) that is an event of its own too. Elsewhere the
                    // next read finds the close, or finds the socket drained.
                    if step.read < step.asked && slot.short_read_drains && !slot.closed {
                        slot.readable = false;
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "link down");
                    v.work = true;
                    slot.link_down = true;
                    slot.conn.handle_llp_lost();
                    arrived = true;
                    break;
                }
            }
        }
        if arrived {
            slot.shared.arrivals.bump();
        }
    }

    // Output: frame what the queue pair has (many FPDUs per buffer) and write it in one
    // system call, until the link takes no more (then wait to be writable) or the budget is
    // spent.
    // Whether the queue pair had nothing more to frame (no message half sent).
    let mut idle = false;
    if !slot.link_down && slot.writable {
        let mut batches = 0;
        loop {
            if slot.tx_off == slot.tx_len {
                if batches == TX_BATCHES_PER_PASS {
                    v.again = true;
                    break;
                }
                batches += 1;
                // Frame a batch and write it, payloads straight from registered memory; what
                // the link does not take is copied out (the batch names memory the
                // application may reuse once this pass ends).
                batch.clear();
                let len = slot.conn.poll_transmit_batch(&mut mem, batch, TX_BATCH);
                if len == 0 {
                    idle = true;
                    break;
                }
                if slot.initiator && !slot.heard {
                    slot.owes_nudge = true;
                    if slot.nudge_at.is_none() && slot.nudges == 0 {
                        slot.nudge_at = Some(Instant::now() + NUDGES[0]);
                    }
                } else {
                    // Sent after the peer spoke: these bytes wake it as a nudge would.
                    slot.owes_nudge = false;
                }
                let mut iov: Vec<IoSlice<'_>> = std::mem::take(iov_store);
                let sent = match batch.io_slices(&mem, &mut iov) {
                    Ok(()) => {
                        let iov = &iov[..iov.len().min(IOV_MAX)];
                        let offered: usize = iov.iter().map(|b| b.len()).sum();
                        slot.link.send_vectored(iov).map(|n| (n, n < offered))
                    }
                    Err(_) => Err(LinkError::Reset),
                };
                *iov_store = reuse_iov(iov);
                let staged = match sent {
                    Ok((n, _)) if n == len => {
                        v.work = true;
                        continue;
                    }
                    Ok((n, full)) => {
                        v.work |= n > 0;
                        let mut buf = pool.pop().unwrap_or_default();
                        buf.clear();
                        batch.unsent(&mem, n, &mut buf).ok().map(|_| (buf, full))
                    }
                    Err(_) => None,
                };
                let Some((buf, full)) = staged else {
                    v.work = true;
                    slot.link_down = true;
                    slot.conn.handle_llp_lost();
                    break;
                };
                slot.tx = buf;
                slot.tx_off = 0;
                slot.tx_len = slot.tx.len();
                v.staged += slot.tx_len;
                if full {
                    // The link is full: wait for it to become writable again.
                    slot.writable = !slot.has_source;
                    break;
                }
                continue;
            }
            match slot.link.send_vectored(&[IoSlice::new(&slot.tx[slot.tx_off..slot.tx_len])]) {
                Ok(n) => {
                    v.work |= n > 0;
                    slot.tx_off += n;
                    if slot.tx_off < slot.tx_len {
                        // The link is full: wait for it to become writable again.
                        slot.writable = !slot.has_source;
                        break;
                    }
                }
                Err(_) => {
                    v.work = true;
                    slot.link_down = true;
                    slot.conn.handle_llp_lost();
                    break;
                }
            }
        }
    }
    let drained = slot.tx_off == slot.tx_len;
    if drained && !slot.tx.is_empty() {
        give_back(pool, &mut slot.tx);
        slot.tx_off = 0;
        slot.tx_len = 0;
    }
    let can_nudge = idle && drained && slot.conn.qp_ref().state() == QpState::Rts;
    if slot.heard {
        slot.nudge_at = None;
        if slot.owes_nudge && can_nudge {
            slot.owes_nudge = !nudge(slot, "the peer spoke; what was sent before may lie unread");
        }
    } else if let Some(at) = slot.nudge_at {
        let now = Instant::now();
        if at > now {
            v.timer = Some(at);
        } else if can_nudge {
            let _ = nudge(slot, "nothing heard from the peer");
            slot.nudges += 1;
            slot.nudge_at = NUDGES.get(slot.nudges).map(|d| now + *d);
            v.timer = slot.nudge_at;
        } else {
            // Busy sending: look again a little later.
            v.timer = Some(now + NUDGES[0]);
        }
    }
    // A queue pair that is done closes its side of the stream once its last bytes (a
    // Terminate, say) are out.
    let state = slot.conn.qp_ref().state();
    if !slot.link_down && state == QpState::Error && drained && !slot.write_shut {
        slot.link.shutdown_write();
        slot.write_shut = true;
        v.work = true;
    }

    v.work |= publish(slot);
    if slot.shared.set_state(state) {
        v.state_change = Some(state);
    }
    if state != QpState::Rts {
        // Receives posted while this visit ran, by a poster that read RTS: another visit
        // takes them (see `Engine::posted_receives`).
        fence(Ordering::SeqCst);
        v.again |= !slot.shared.rq.is_empty();
    }
    // Finished: nothing more can be sent (the link is gone, or shut after the last byte), or
    // the last bytes have waited for a peer that stopped reading for the whole linger.
    if state == QpState::Error {
        let now = Instant::now();
        let since = *slot.finished_at.get_or_insert(now);
        let lingered = now.saturating_duration_since(since) >= linger;
        v.done = slot.link_down || (slot.write_shut && drained) || lingered;
        if lingered && !slot.link_down && !drained {
            tracing::debug!(
                unsent = slot.tx_len - slot.tx_off,
                "the peer stopped reading: dropping the connection"
            );
        }
        if !v.done {
            v.timer = Some(v.timer.map_or(since + linger, |t| t.min(since + linger)));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that comes back to wait for input while the engine is awake is refused its
    /// queue's poll and parks where it does not watch the links; so it takes back the leave
    /// that lets the engine sleep on the doorbell alone (the engine's thread would otherwise
    /// take it for one back in its poll, and nobody would watch the links). A thread let into
    /// its poll keeps the leave. The engine's thread is stopped, so that the test sets the park.
    #[test]
    fn a_waiter_refused_its_poll_takes_back_the_engines_quiet_sleep() {
        let (engine, thread) =
            Engine::start(DeviceConfig { poll_mode: PollMode::Event, ..DeviceConfig::default() });
        engine.stop(thread);
        let cq = CqShared::new(4);
        let now = Instant::now();
        engine.app_busy(now);
        assert!(engine.app_busy_for(now).is_some());
        // Awake: refused, and the leave is gone.
        engine.doorbell.set_parked(false);
        assert_eq!(engine.wait_polling(&cq, now, Some(Duration::ZERO), cq.interrupts()), Watch::Refused);
        assert_eq!(engine.app_busy_for(now), None);
        // Parked: the thread sleeps in its poll (for no time here), and a leave it was given
        // on waking stands.
        engine.doorbell.set_parked(true);
        assert_eq!(
            engine.wait_polling(&cq, Instant::now(), Some(Duration::ZERO), cq.interrupts()),
            Watch::Slept
        );
        assert!(engine.app_busy_for(Instant::now()).is_some());
    }

    /// After a pass that did work, the adaptive engine offers the core only while an
    /// application thread waits for a completion, and counts each offer; busy and event
    /// engines never do. The engines' threads are stopped, so that the test runs the step.
    #[test]
    fn the_adaptive_engine_offers_the_core_after_work_only_to_a_waiting_thread() {
        for (mode, offers) in [(PollMode::Adaptive, true), (PollMode::Event, false), (PollMode::Busy, false)]
        {
            let (engine, thread) = Engine::start(DeviceConfig { poll_mode: mode, ..DeviceConfig::default() });
            engine.stop(thread);
            assert!(!engine.offer_core_to_waiters(), "{mode:?}: nobody waits");
            let waiting = WaitingApp::new(&engine);
            assert_eq!(engine.offer_core_to_waiters(), offers, "{mode:?}: a thread waits");
            drop(waiting);
            assert!(!engine.offer_core_to_waiters(), "{mode:?}: the wait ended");
            assert_eq!(engine.stats().waiter_yields, u64::from(offers), "{mode:?}");
        }
    }

    /// A link over memory whose readiness follows a socket of its own, as a kernel socket's
    /// does: the engine registers it with its poll, and the test says when it is readable.
    struct Watched {
        mem: iwarp_netdev::MemLink,
        /// Idle: its peer, kept open, never writes.
        socket: [std::os::unix::net::UnixStream; 2],
    }

    impl Link for Watched {
        fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
            self.mem.recv(buf)
        }

        fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError> {
            self.mem.send_vectored(bufs)
        }

        fn shutdown_write(&mut self) {
            self.mem.shutdown_write();
        }

        fn local_addr(&self) -> Option<std::net::SocketAddr> {
            None
        }

        fn peer_addr(&self) -> Option<std::net::SocketAddr> {
            None
        }

        fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
            Some(std::os::fd::AsFd::as_fd(&self.socket[0]))
        }
    }

    /// Two inline devices (no thread but the test's runs a pass) connected over a [`Watched`]
    /// link, the server with `LEN`-byte receives posted, the client with a `LEN`-byte region
    /// of a known pattern to send from.
    struct Linked {
        cdev: crate::Device,
        sdev: crate::Device,
        ccq: crate::CompletionQueue,
        scq: crate::CompletionQueue,
        client: crate::QueuePair,
        server: crate::QueuePair,
        /// The peer of the server link's socket: a byte written makes the link readable.
        signal: std::os::unix::net::UnixStream,
        src: crate::MemoryRegion,
        dst: crate::MemoryRegion,
        pattern: Vec<u8>,
    }

    const LEN_U32: u32 = 4 << 20;
    const LEN: usize = LEN_U32 as usize;

    impl Linked {
        /// Connected, with `receives` receives posted on the server and taken by its first pass
        /// (which finds nothing to read).
        fn new(receives: u32) -> Linked {
            use crate::{Access, ConnectOptions, Device};
            let inline =
                || Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
            let (cdev, sdev) = (inline(), inline());
            let (a, b) = iwarp_netdev::MemLink::pair(4 * LEN);
            let watched = |mem| {
                let (socket, peer) = std::os::unix::net::UnixStream::pair().unwrap();
                let signal = peer.try_clone().unwrap();
                (Box::new(Watched { mem, socket: [socket, peer] }), signal)
            };
            let ((client_link, _), (server_link, signal)) = (watched(a), watched(b));
            let opts = ConnectOptions { timeout: Duration::from_secs(10), ..ConnectOptions::default() };
            let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
            let (ccq, scq) = (cdev.create_cq(16), sdev.create_cq(16));
            let (server, client) = std::thread::scope(|s| {
                let server = s.spawn(|| sdev.accept_link(server_link, &spd, &scq, &scq, &opts).unwrap());
                let client = cdev.connect_link(client_link, &cpd, &ccq, &ccq, &opts).unwrap();
                (server.join().unwrap(), client.qp)
            });
            let src = cpd.register(LEN, Access::LOCAL_WRITE).unwrap();
            let pattern: Vec<u8> = (0..LEN).map(|i| u8::try_from(i % 251).unwrap()).collect();
            src.write(0, &pattern).unwrap();
            let dst = spd.register(receives as usize * LEN, Access::LOCAL_WRITE).unwrap();
            for i in 0..receives {
                let sge = dst.sge(i as usize * LEN, LEN_U32);
                server.post_recv(RecvWr { wr_id: u64::from(i), sgl: sge.into() }).unwrap();
            }
            sdev.progress();
            Linked { cdev, sdev, ccq, scq, client, server, signal, src, dst, pattern }
        }

        /// Posts `n` Sends of `LEN` bytes (inline, posting visits the queue pair: the first
        /// two batches go out).
        fn post_sends(&self, n: u64) {
            use crate::{SendOp, SendWr};
            for wr_id in 0..n {
                let op = SendOp::Send { solicited: false, invalidate: None };
                let sgl = self.src.sge(0, LEN_U32).into();
                self.client.post_send(SendWr { wr_id, op, sgl, signaled: true }).unwrap();
            }
        }

        /// Posts `n` Sends of `LEN` bytes and runs the client's passes until all of them are
        /// in the link.
        fn send(&self, n: u64) {
            self.post_sends(n);
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut sent = 0;
            while sent < n {
                assert!(Instant::now() < deadline, "the client did not send");
                self.cdev.progress();
                while let Some(wc) = self.ccq.poll() {
                    assert_eq!(wc.status, WcStatus::Success);
                    sent += 1;
                }
            }
        }

        /// The readiness event of the server's link.
        fn readable(&self) -> Events {
            let token = self.server.shared().key as Token;
            Events::of([Ready { token, readable: true, writable: true, closed: false }])
        }

        /// Whether the server's completion queue has a completion.
        fn due(&self) -> bool {
            self.scq.shared.wake_due(self.scq.shared.interrupts())
        }

        /// Runs the server's passes until its next completion.
        fn next_completion(&self) -> WorkCompletion {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                assert!(Instant::now() < deadline, "no message arrived");
                self.sdev.progress();
                if let Some(wc) = self.scq.poll() {
                    return wc;
                }
            }
        }

        /// Checks that receive `wr_id` completed whole, with the pattern in place.
        fn received(&self, wc: &WorkCompletion, wr_id: u64) {
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (wr_id, WcStatus::Success, LEN as u64));
            let at = usize::try_from(wr_id).unwrap() * LEN;
            assert!(self.dst.to_vec()[at..at + LEN] == self.pattern[..], "message {wr_id} is in place");
        }
    }

    /// A waiting thread runs the engine's pass itself: woken for input in its queue's poll
    /// (`Engine::sleep_in_watch`), or running passes while the engine sleeps (adaptive mode,
    /// `Engine::waiting_pass`). When the message it waits for has more input than one visit
    /// reads (a large message still arriving as it is read; here all of it is in the link,
    /// and its reads are as many), the pass goes on reading until the message's completion is
    /// there, instead of leaving the rest to the engine thread; and it stops there, leaving a
    /// second message's input to the engine.
    #[test]
    fn a_waiters_pass_reads_until_its_completion_is_due() {
        use std::io::Write;
        for woken in [true, false] {
            let mut t = Linked::new(2);
            t.send(2);
            assert!(!t.due());
            if woken {
                assert_eq!(t.sdev.engine.pass_events(&t.readable(), || t.due()), Some(true));
            } else {
                // The pass asks the engine's poll, which now reports the link readable.
                t.signal.write_all(&[1]).unwrap();
                assert!(t.sdev.engine.waiting_pass(|| t.due()));
            }
            let first = t.scq.poll().expect("the first message completes in the waiter's pass");
            t.received(&first, 0);
            assert!(t.scq.poll().is_none(), "the pass stops once the completion is there");
            // The rest is left queued for another pass (the engine thread's, woken by `let_go`).
            assert!(!t.sdev.engine.core().ready.is_empty());
            t.received(&t.next_completion(), 1);
        }
    }

    /// A waiting thread's pass reads on, but does not write on: a connection left ready only
    /// with more to send (its transmit budget spent) is left to the engine thread, which sends
    /// the rest while the application thread goes on.
    #[test]
    fn a_waiters_pass_does_not_write_on() {
        let t = Linked::new(1);
        t.post_sends(1);
        let cq = &t.ccq.shared;
        assert!(t.cdev.engine.waiting_pass(|| cq.wake_due(cq.interrupts())));
        assert!(t.ccq.poll().is_none(), "the pass stopped with the message half sent");
        assert!(!t.cdev.engine.core().ready.is_empty(), "the rest is queued for the engine");
    }

    /// A thread woken in its queue's poll while another thread holds the core (the engine's,
    /// woken for the same input) does not sleep on the lock: it leaves its events to the
    /// holder and returns, and the holder handles them as it lets go.
    #[test]
    fn a_woken_waiter_leaves_its_input_to_the_holder_of_the_core() {
        let t = Linked::new(1);
        t.send(1);
        let events = t.readable();
        let before = t.sdev.stats().rx_bytes;
        let core = t.sdev.engine.core();
        let waiter = std::thread::scope(|s| {
            let waiter = s.spawn(|| t.sdev.engine.pass_events(&events, || t.due()));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !waiter.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let finished = waiter.is_finished();
            // Letting go runs the pass with the events left (and ends a waiter that slept on
            // the lock, so that the test fails rather than hangs).
            drop(core);
            assert!(finished, "the waiter slept on the core's lock");
            waiter.join().unwrap()
        });
        assert_eq!(waiter, None, "the events were left to the holder");
        assert!(t.sdev.stats().rx_bytes > before, "the holder read the input as it let go");
        // The rest of the message: the connection is queued (the link has no new readiness).
        t.received(&t.next_completion(), 0);
    }

    /// The same while the engine thread holds the core outside a pass, looking at how long
    /// to sleep (`Engine::nap`): that holder hands nothing on as it lets go, so letting go
    /// tells the engine thread that events were left, and its next pass (not a sleep) reads
    /// the input. Without that the waiter, whose poll took the readiness edge, and the engine
    /// thread both slept with the message unread.
    #[test]
    fn events_left_while_the_engine_looks_at_its_nap_reach_a_pass() {
        let t = Linked::new(1);
        t.send(1);
        let events = t.readable();
        let engine = &t.sdev.engine;
        // Read before the core is held (the stats' guard lets go through `let_go`, which would
        // take the events itself).
        let before = t.sdev.stats().rx_bytes;
        // Held as `nap` holds it: the plain lock, no guard that lets go through `let_go`.
        let core = engine.try_core().expect("nothing else runs the inline engine");
        let waiter = std::thread::scope(|s| s.spawn(|| engine.pass_events(&events, || t.due())).join());
        assert_eq!(waiter.unwrap(), None, "the events were left to the holder");
        assert!(engine.let_go_quietly(core), "letting go reports the events left");
        assert!(engine.doorbell.handed_off(), "nothing took them yet");
        // What the engine thread does then: a pass, which takes them and reads the input.
        assert_eq!(engine.engine_pass(None), Some(true));
        assert!(t.sdev.stats().rx_bytes > before, "the pass read the input");
        assert!(!engine.doorbell.handed_off());
        t.received(&t.next_completion(), 0);
        // With nothing left, letting go reports nothing.
        assert!(!engine.let_go_quietly(engine.try_core().unwrap()));
    }

    /// The write's buffer list keeps its allocation from one write to the next.
    #[test]
    fn the_iov_list_is_reused_without_allocating() {
        let mut store: Vec<IoSlice<'static>> = Vec::with_capacity(32);
        let first = store.as_ptr();
        for round in 0..3u8 {
            let data = vec![round; 8];
            let mut iov: Vec<IoSlice<'_>> = std::mem::take(&mut store);
            iov.extend(std::iter::repeat_n(IoSlice::new(&data), 20));
            store = reuse_iov(iov);
            assert!(store.is_empty());
            assert_eq!((store.as_ptr(), store.capacity()), (first, 32), "round {round}");
        }
    }
}
