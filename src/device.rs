//! The device: the offload engine's thread (or none, in inline mode), its poll mode, and the
//! doorbell applications ring after posting work.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use iwarp_ddp::stag_table::ProtectionDomainId;

use crate::cq::CompletionQueue;
use crate::engine::EngineCore;
use crate::mr::ProtectionDomain;

/// How the engine waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PollMode {
    /// The engine thread never sleeps: lowest latency, burns a core.
    Busy,
    /// Spin for a while after the last work, then park until a doorbell or a short timeout.
    #[default]
    Adaptive,
    /// Park whenever idle; woken by doorbells, and by a short timeout for network input.
    Event,
    /// No engine thread: the application's calls ([`Device::progress`], polling a completion
    /// queue) drive the engine on the application's thread.
    Inline,
}

/// Device settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// How the engine waits for work.
    pub poll_mode: PollMode,
    /// Size of the tagged buffer table (memory regions and windows).
    pub max_regions: u32,
    /// How long the adaptive mode spins after the last work before it parks.
    pub spin: Duration,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig { poll_mode: PollMode::Adaptive, max_regions: 4096, spin: Duration::from_micros(100) }
    }
}

/// What the device's handles share: the engine's state and the doorbell.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    core: Mutex<EngineCore>,
    config: DeviceConfig,
    parked: AtomicBool,
    stop: AtomicBool,
    engine: OnceLock<Thread>,
    /// Wakes an engine waiting in `mio::Poll` (adaptive and event modes).
    waker: OnceLock<mio::Waker>,
    /// Threads waiting for the engine's lock on the slow path.
    waiting: AtomicUsize,
}

/// The token of the doorbell in the engine's `mio::Poll`; connections use their QP number.
const DOORBELL: mio::Token = mio::Token(usize::MAX);

impl DeviceShared {
    /// The engine's state, for the slow path (registration, connection setup). A busy engine
    /// re-takes the lock right after each pass; announcing the wait makes it step aside.
    pub(crate) fn core(&self) -> MutexGuard<'_, EngineCore> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let guard = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        guard
    }

    /// The nearest timer of the attached smoltcp stacks, if any stack is attached.
    fn stack_delay(&self) -> Option<Duration> {
        let core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        if core.stacks().is_empty() { None } else { core.stack_delay() }
    }

    pub(crate) fn inline(&self) -> bool {
        self.config.poll_mode == PollMode::Inline
    }

    /// Rings the doorbell: wakes a parked engine. Costs one atomic load when the engine is
    /// awake.
    pub(crate) fn ring(&self) {
        if self.parked.load(Ordering::SeqCst) {
            if let Some(w) = self.waker.get() {
                let _ = w.wake();
            } else if let Some(t) = self.engine.get() {
                t.unpark();
            }
        }
    }

    /// One pass of the engine over every connection; whether it did any work.
    pub(crate) fn progress(&self) -> bool {
        // Let a slow-path caller that is waiting for the lock have it first.
        while self.waiting.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
        self.core.lock().unwrap_or_else(PoisonError::into_inner).progress()
    }
}

/// An emulated RNIC: the tagged buffer table, the connections, and the engine that runs
/// them.
///
/// ```
/// use iwarp::{Access, Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let pd = device.alloc_pd();
/// let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
/// mr.write(0, b"hello").unwrap();
/// assert_eq!(&mr.to_vec()[..5], b"hello");
/// ```
#[derive(Debug)]
pub struct Device {
    pub(crate) shared: Arc<DeviceShared>,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    /// Opens a device and, unless the poll mode is inline, starts its engine thread.
    pub fn open(config: DeviceConfig) -> Device {
        // Adaptive and event modes sleep in a mio Poll that the connections' sockets and the
        // doorbell wake; without one (it cannot be created) they fall back to timed parking.
        let poll = match config.poll_mode {
            PollMode::Adaptive | PollMode::Event => mio::Poll::new().ok(),
            PollMode::Busy | PollMode::Inline => None,
        };
        let registry = poll.as_ref().and_then(|p| p.registry().try_clone().ok());
        let waker = poll.as_ref().and_then(|p| mio::Waker::new(p.registry(), DOORBELL).ok());
        let shared = Arc::new(DeviceShared {
            core: Mutex::new(EngineCore::new(config.max_regions, registry)),
            config,
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            engine: OnceLock::new(),
            waker: OnceLock::new(),
            waiting: AtomicUsize::new(0),
        });
        if let Some(w) = waker {
            let _ = shared.waker.set(w);
        }
        let thread = (config.poll_mode != PollMode::Inline).then(|| {
            let s = shared.clone();
            std::thread::Builder::new().name("iwarp-engine".into()).spawn(move || engine_loop(&s, poll)).ok()
        });
        let thread = thread.flatten();
        if let Some(t) = &thread {
            let _ = shared.engine.set(t.thread().clone());
        }
        Device { shared, thread }
    }

    /// The device's configuration.
    pub fn config(&self) -> DeviceConfig {
        self.shared.config
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.shared.core().alloc_pd();
        ProtectionDomain { id: ProtectionDomainId(id), dev: self.shared.clone() }
    }

    /// A completion queue holding up to `depth` completions before the engine backlogs them.
    pub fn create_cq(&self, depth: usize) -> CompletionQueue {
        CompletionQueue::new(self.shared.clone(), depth)
    }

    /// A shared receive queue holding up to `depth` buffers; connections made with it in
    /// [`crate::ConnectOptions::srq`] take their receive buffers from it.
    pub fn create_srq(&self, depth: usize) -> iwarp_rdmap::qp::SharedReceiveQueue {
        iwarp_rdmap::qp::SharedReceiveQueue::new(depth)
    }

    /// Runs one engine pass on the calling thread (inline mode; harmless otherwise). Returns
    /// whether there was work.
    pub fn progress(&self) -> bool {
        self.shared.progress()
    }

    /// Has the engine drive a userspace TCP/IP stack (smoltcp on a TAP device or a raw
    /// Ethernet interface): every engine pass polls it before and after running the
    /// connections, and an idle engine (adaptive, event mode) sleeps no longer than the
    /// stack's next timer and wakes when a frame arrives. Inline mode polls it in
    /// [`Device::progress`]. Attaching a stack twice is harmless; [`Device::connect_smol`] and
    /// [`Device::listen_smol`] attach theirs.
    pub fn attach_stack(&self, stack: &iwarp_netdev::SmolStack) {
        if self.shared.core().attach_stack(stack) {
            self.shared.ring();
        }
    }

    /// Connections the engine is running.
    pub fn connections(&self) -> usize {
        self.shared.core().connections()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            if let Some(w) = self.shared.waker.get() {
                let _ = w.wake();
            }
            t.thread().unpark();
            let _ = t.join();
        }
        // Nobody runs the connections any more: flush their work so that none is lost.
        self.shared.core().shutdown();
    }
}

fn engine_loop(s: &DeviceShared, mut poll: Option<mio::Poll>) {
    let mode = s.config.poll_mode;
    let mut events = mio::Events::with_capacity(256);
    let mut last_work = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        if s.progress() {
            last_work = Instant::now();
            continue;
        }
        match mode {
            PollMode::Busy | PollMode::Inline => std::hint::spin_loop(),
            PollMode::Adaptive if last_work.elapsed() < s.config.spin => std::hint::spin_loop(),
            PollMode::Adaptive | PollMode::Event => {
                s.parked.store(true, Ordering::SeqCst);
                // One more pass after announcing the park: work posted before the flag was
                // visible is found here; work posted after it rings the doorbell.
                if !s.progress() {
                    // Sockets and the doorbell wake the poll; the timeout bounds the wait for
                    // links without readiness events (in-memory links) and for timers.
                    let mut nap = Duration::from_millis(if mode == PollMode::Event { 10 } else { 1 });
                    // A userspace TCP/IP stack's timers (retransmission) must not wait longer.
                    if let Some(delay) = s.stack_delay() {
                        nap = nap.min(delay);
                    }
                    match poll.as_mut() {
                        Some(p) => {
                            let _ = p.poll(&mut events, Some(nap));
                        }
                        None => std::thread::park_timeout(nap),
                    }
                }
                s.parked.store(false, Ordering::SeqCst);
                // Back from a nap: keep napping while idle instead of spinning again.
                last_work = Instant::now().checked_sub(s.config.spin).unwrap_or_else(Instant::now);
            }
        }
    }
}
