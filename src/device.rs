//! The application's handle on the emulated RNIC: opening it starts its engine, and it hands
//! out protection domains, completion queues and shared receive queues.

use std::sync::Arc;
use std::thread::JoinHandle;

use iwarp_ddp::stag_table::ProtectionDomainId;

use crate::cq::CompletionQueue;
use crate::engine::{DeviceConfig, Engine, EngineStats};
use crate::mr::ProtectionDomain;

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
    pub(crate) engine: Arc<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    /// Opens a device and, unless the poll mode is inline, starts its engine thread.
    pub fn open(config: DeviceConfig) -> Device {
        let (engine, thread) = Engine::start(config);
        Device { engine, thread }
    }

    /// The device's configuration.
    pub fn config(&self) -> DeviceConfig {
        self.engine.config
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.engine.core().alloc_pd();
        ProtectionDomain { id: ProtectionDomainId(id), dev: self.engine.clone() }
    }

    /// A completion queue for about `depth` completions (room for up to 16 at first; it grows
    /// with use and never refuses a completion).
    pub fn create_cq(&self, depth: usize) -> CompletionQueue {
        CompletionQueue::new(self.engine.clone(), depth)
    }

    /// A shared receive queue holding up to `depth` buffers; connections made with it in
    /// [`crate::ConnectOptions::srq`] take their receive buffers from it.
    pub fn create_srq(&self, depth: usize) -> iwarp_rdmap::qp::SharedReceiveQueue {
        iwarp_rdmap::qp::SharedReceiveQueue::new(depth)
    }

    /// Runs one engine pass on the calling thread (inline mode; harmless otherwise). Returns
    /// whether there was work.
    pub fn progress(&self) -> bool {
        self.engine.progress()
    }

    /// Runs one engine pass on the calling thread unless another thread is running one (then
    /// returns at once): what an application that busy-polls its completion queues can do
    /// with the core it spins on, instead of leaving the engine thread to compete for a core
    /// with it (the verbs drop-in does this when `ibv_poll_cq` finds nothing). Returns
    /// whether a pass ran and found work. Counted in [`EngineStats::direct_passes`].
    pub fn try_progress(&self) -> bool {
        self.engine.try_progress()
    }

    /// Has the engine drive a userspace TCP/IP stack (smoltcp on a TAP device or a raw
    /// Ethernet interface): every engine pass polls it before and after running the
    /// connections, and an idle engine (adaptive, event mode) sleeps no longer than the
    /// stack's next timer and wakes when a frame arrives. Inline mode polls it in
    /// [`Device::progress`]. Attaching a stack twice is harmless; [`Device::connect`] and
    /// [`Device::listen_with`] attach the stack of a [`crate::Transport::Smol`].
    pub fn attach_stack(&self, stack: &iwarp_netdev::SmolStack) {
        self.engine.attach_stack(stack);
    }

    /// Connections the engine is running.
    pub fn connections(&self) -> usize {
        self.engine.core().connections()
    }

    /// The engine's counters: passes, connection visits, sleeps and what ended them.
    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.engine.stop(self.thread.take());
    }
}
