//! The process's one emulated RNIC: its engine ([`iwarp::Device`]), the transport and MPA
//! settings from the environment, and the capture, made at the first call that needs them
//! and kept until the process exits.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use iwarp::mpa::Policy;
use iwarp::netdev::{PcapWriter, SmolStack};
use iwarp::{ConnectOptions, Device, DeviceConfig, ListenOptions, RecvWr, Transport};

use crate::config::{Config, SmolDevice, TransportConfig};
use crate::ffi::Result;

/// Regions the device's tagged buffer table holds (`ibv_query_device`'s `max_mr`).
pub(crate) const MAX_MR: u32 = 1 << 16;

/// The running device and its settings.
pub(crate) struct Runtime {
    pub(crate) config: Config,
    pub(crate) device: Device,
    stack: Option<SmolStack>,
    capture: Option<Arc<Mutex<PcapWriter>>>,
}

static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// The settings, read once (the device list needs the name before a device runs).
pub(crate) fn config() -> Result<&'static Config> {
    static CONFIG: OnceLock<std::result::Result<Config, String>> = OnceLock::new();
    match CONFIG.get_or_init(|| {
        let c = Config::from_env();
        if let Err(e) = &c {
            eprintln!("libibverbs (iwarp): {e}");
        }
        c
    }) {
        Ok(c) => Ok(c),
        Err(_) => Err(libc::EINVAL),
    }
}

/// The device, started on first use. A setting that cannot be used (a bad variable, a TAP
/// device that cannot be opened) is printed once to stderr and every call needing the
/// device fails with `EINVAL` (or `ENODEV` for the stack).
pub(crate) fn runtime() -> Result<&'static Runtime> {
    match RUNTIME.get_or_init(start) {
        Ok(r) => Ok(r),
        Err(_) => Err(libc::ENODEV),
    }
}

fn start() -> std::result::Result<Runtime, String> {
    let config = config().map_err(|_| "bad settings".to_string())?.clone();
    if let Some(filter) = &config.log {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
    let fail = |e: String| {
        eprintln!("libibverbs (iwarp): {e}");
        e
    };
    let stack = match &config.transport {
        TransportConfig::Kernel => None,
        TransportConfig::Smol(dev, smol) => {
            let opened = match dev {
                SmolDevice::Tap(name) => SmolStack::tap(name, smol.clone()),
                SmolDevice::Raw(name) => SmolStack::raw(name, smol.clone()),
            };
            Some(opened.map_err(|e| fail(format!("cannot open the smoltcp device {dev:?}: {e}")))?)
        }
    };
    let device = Device::open(DeviceConfig {
        poll_mode: config.poll_mode,
        max_regions: MAX_MR,
        ..DeviceConfig::default()
    });
    let capture = match (&config.pcap, &stack) {
        (None, _) => None,
        // The stack records its real frames.
        (Some(path), Some(stack)) => {
            stack.capture(path).map_err(|e| fail(format!("cannot create {}: {e}", path.display())))?;
            None
        }
        (Some(path), None) => Some(
            PcapWriter::create(path)
                .map_err(|e| fail(format!("cannot create {}: {e}", path.display())))?
                .shared(),
        ),
    };
    if config.pcap.is_some() {
        // SAFETY: flush_at_exit is an extern "C" function with no arguments that stays
        // valid (this library is never unloaded while the process runs exit handlers it
        // registered: glibc runs them before unloading).
        unsafe { libc::atexit(flush_at_exit) };
    }
    Ok(Runtime { config, device, stack, capture })
}

extern "C" fn flush_at_exit() {
    if let Some(Ok(rt)) = RUNTIME.get() {
        rt.flush_capture();
    }
}

impl Runtime {
    /// Writes out what the capture has buffered.
    pub(crate) fn flush_capture(&self) {
        if let Some(c) = &self.capture {
            let _ = c.lock().unwrap_or_else(PoisonError::into_inner).flush();
        }
        if let Some(s) = &self.stack {
            let _ = s.flush_capture();
        }
    }

    fn transport(&self) -> Transport {
        self.stack.as_ref().map_or(Transport::Kernel, |s| Transport::Smol(s.clone()))
    }

    /// The MPA policy of a connection with `ird`/`ord`.
    fn policy(&self, ird: u16, ord: u16) -> Policy {
        Policy {
            revision: self.config.mpa_rev,
            crc: self.config.crc,
            markers_wanted: self.config.markers,
            peer_to_peer: self.config.p2p,
            ird,
            ord,
            ..Policy::default()
        }
    }

    /// Options for one connection.
    pub(crate) fn connect_options(&self, c: ConnSettings) -> ConnectOptions {
        ConnectOptions {
            transport: self.transport(),
            policy: self.policy(c.ird, c.ord),
            private_data: c.private_data,
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: c.max_recv_wr.max(1),
            recv: c.recv,
            srq: c.srq,
            capture: self.capture.clone(),
            ..ConnectOptions::default()
        }
    }

    /// Options of a listener.
    pub(crate) fn listen_options(&self) -> ListenOptions {
        ListenOptions { transport: self.transport(), ..ListenOptions::default() }
    }

    /// The smoltcp stack's address, if the transport is smoltcp.
    pub(crate) fn smol_ip(&self) -> Option<std::net::Ipv4Addr> {
        match &self.config.transport {
            TransportConfig::Smol(_, c) => Some(c.ip),
            TransportConfig::Kernel => None,
        }
    }
}

/// What a connection is made with (from `rdma_conn_param` and the queue pair's caps).
pub(crate) struct ConnSettings {
    pub(crate) ird: u16,
    pub(crate) ord: u16,
    pub(crate) private_data: Vec<u8>,
    pub(crate) max_send_wr: usize,
    pub(crate) max_recv_wr: usize,
    pub(crate) recv: Vec<RecvWr>,
    /// The queue pair's shared receive queue, if it has one.
    pub(crate) srq: Option<iwarp::SharedReceiveQueue>,
}
