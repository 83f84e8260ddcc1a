//! The device: the offload engine's thread (or none, in inline mode), its poll mode, and the
//! doorbell applications ring after posting work.

use std::sync::atomic::{AtomicBool, Ordering};
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
}

impl DeviceShared {
    pub(crate) fn core(&self) -> MutexGuard<'_, EngineCore> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn inline(&self) -> bool {
        self.config.poll_mode == PollMode::Inline
    }

    /// Rings the doorbell: wakes a parked engine. Costs one atomic load when the engine is
    /// awake.
    pub(crate) fn ring(&self) {
        if self.parked.load(Ordering::SeqCst)
            && let Some(t) = self.engine.get()
        {
            t.unpark();
        }
    }

    /// One pass of the engine over every connection; whether it did any work.
    pub(crate) fn progress(&self) -> bool {
        self.core().progress()
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
        let shared = Arc::new(DeviceShared {
            core: Mutex::new(EngineCore::new(config.max_regions)),
            config,
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            engine: OnceLock::new(),
        });
        let thread = (config.poll_mode != PollMode::Inline).then(|| {
            let s = shared.clone();
            std::thread::Builder::new().name("iwarp-engine".into()).spawn(move || engine_loop(&s)).ok()
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

    /// Runs one engine pass on the calling thread (inline mode; harmless otherwise). Returns
    /// whether there was work.
    pub fn progress(&self) -> bool {
        self.shared.progress()
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
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn engine_loop(s: &DeviceShared) {
    let mode = s.config.poll_mode;
    let mut last_work = Instant::now();
    while !s.stop.load(Ordering::Acquire) {
        if s.progress() {
            last_work = Instant::now();
            continue;
        }
        let idle_for = last_work.elapsed();
        match mode {
            PollMode::Busy | PollMode::Inline => std::hint::spin_loop(),
            PollMode::Adaptive if idle_for < s.config.spin => std::hint::spin_loop(),
            PollMode::Adaptive | PollMode::Event => {
                s.parked.store(true, Ordering::SeqCst);
                // One more pass after announcing the park: work posted before the flag was
                // visible is found here; work posted after it rings the doorbell, whose
                // unpark makes the park below return at once. Network input is picked up
                // within the timeout.
                if !s.progress() {
                    let nap = if mode == PollMode::Event { 1000 } else { 200 };
                    std::thread::park_timeout(Duration::from_micros(nap));
                }
                s.parked.store(false, Ordering::SeqCst);
                last_work = Instant::now() - s.config.spin;
            }
        }
    }
}
