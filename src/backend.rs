//! The backend seam: one small, object-safe verbs-style API that both the userspace engine
//! ([`crate::Device`]) and, with the `verbs` cargo feature, an rdma-core device (the kernel's
//! siw or rxe, an iWARP or RoCE NIC, or the verbs drop-in of verbs-abi/) implement. Programs
//! that should run on either pick a backend at run time by name ([`open_backend`]) and drive
//! it through [`Backend`], [`BackendListener`], [`Endpoint`] and [`Region`].
//!
//! The engine's own API ([`crate::Device`] and its handles) is unchanged and stays the richer
//! one (fast registration, smoltcp transports, MPA policy); the seam covers what every backend
//! has: connections made by address with private data, registered memory, the one-sided and
//! two-sided operations and a completion queue per endpoint, and, where the device has them,
//! shared receive queues and type 2 memory windows. What a
//! device lacks is in its [`Capabilities`], and a backend refuses such a work request with
//! [`BackendError::Unsupported`] instead of sending something the peer cannot take.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iwarp_ddp::STag;
use iwarp_ddp::dma::Buffer;
use iwarp_ddp::stag_table::Access;
use iwarp_rdmap::atomic::AtomicOp;
use iwarp_rdmap::qp::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

use crate::cm::{ConnectOptions, ConnectRequest, Listener};
use crate::cq::CompletionQueue;
use crate::device::Device;
use crate::engine::DeviceConfig;
use crate::mr::{MemoryRegion, MemoryWindow, ProtectionDomain, RegisterError};
use crate::qp::QueuePair;
use crate::shared::WorkCompletion;

use crate::seam::own;
pub use crate::seam::{
    Backend, BackendError, BackendListener, Capabilities, Completion, CompletionOp, DeviceInfo,
    DeviceTransport, ENGINE_DEVICE, Endpoint, EndpointOptions, Local, Op, PendingRequest, Region,
    SharedRecvQueue, Status, Window,
};

/// Every device this build can drive: the userspace engine first, then each rdma-core device
/// when the `verbs` feature is on and libibverbs loads. The second value says why there are no
/// rdma-core devices, when there are none (the feature is off, libibverbs.so.1 did not load,
/// or it lists none).
pub fn devices() -> (Vec<DeviceInfo>, Option<String>) {
    #[cfg_attr(not(feature = "verbs"), allow(unused_mut))]
    let mut list = vec![engine_info()];
    #[cfg(feature = "verbs")]
    let why = match crate::verbs::devices() {
        Ok(found) if found.is_empty() => Some("libibverbs lists no RDMA devices".to_owned()),
        Ok(found) => {
            list.extend(found);
            None
        }
        Err(e) => Some(e),
    };
    #[cfg(not(feature = "verbs"))]
    let why = Some("built without the `verbs` feature: rdma-core devices are not available".to_owned());
    (list, why)
}

/// Opens the device `name`: [`ENGINE_DEVICE`] for the userspace engine (kernel TCP), an
/// rdma-core device's name with the `verbs` feature.
pub fn open_backend(name: &str) -> Result<Arc<dyn Backend>, BackendError> {
    if name == ENGINE_DEVICE {
        return Ok(Arc::new(EngineBackend::new(Device::open(DeviceConfig::default()))));
    }
    #[cfg(feature = "verbs")]
    {
        crate::verbs::open(name).map(|b| Arc::new(b) as Arc<dyn Backend>)
    }
    #[cfg(not(feature = "verbs"))]
    {
        Err(BackendError::NoDevice(format!(
            "{name} (this build has only the userspace engine `{ENGINE_DEVICE}`; rdma-core devices need the `verbs` feature)"
        )))
    }
}

fn engine_info() -> DeviceInfo {
    DeviceInfo {
        name: ENGINE_DEVICE.to_owned(),
        transport: DeviceTransport::UserspaceIwarp,
        caps: Capabilities {
            rdma: true,
            immediate: true,
            atomics: true,
            private_data: true,
            reject: true,
            cq_notify: true,
            srq: true,
            memory_windows: true,
        },
    }
}

/// The userspace engine behind the seam. Connections go over kernel TCP and take the RFC 7306
/// extensions (immediate data, atomics), which the peer must take too.
#[derive(Debug, Clone)]
pub struct EngineBackend {
    device: Arc<Device>,
    rfc7306: bool,
}

impl EngineBackend {
    /// The seam over an open device.
    pub fn new(device: Device) -> EngineBackend {
        EngineBackend { device: Arc::new(device), rfc7306: true }
    }

    /// The seam over an open device, for peers without the RFC 7306 extensions (siw, the
    /// verbs drop-in): no immediate data, no atomics.
    pub fn without_rfc7306(device: Device) -> EngineBackend {
        EngineBackend { device: Arc::new(device), rfc7306: false }
    }

    /// The device underneath.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn options(&self, opts: &EndpointOptions, parts: &mut Parts) -> ConnectOptions {
        let depth = opts.queue_depth as usize;
        let mut options = ConnectOptions {
            recv: std::mem::take(&mut parts.recvs),
            srq: parts.srq.clone(),
            private_data: opts.private_data.clone(),
            timeout: opts.timeout,
            max_send_wr: depth,
            max_recv_wr: depth,
            rfc7306: self.rfc7306,
            ..ConnectOptions::default()
        };
        if let Some(n) = opts.rd_atomic {
            (options.policy.ird, options.policy.ord) = (n.into(), n.into());
        }
        options
    }

    /// The endpoint's domain and queue, and its early receives' region with the receives.
    fn parts(&self, opts: &EndpointOptions) -> Result<Parts, BackendError> {
        let (pd, srq) = match &opts.srq {
            Some(srq) => {
                let srq = own::<EngineSrq>(
                    srq.as_any(),
                    "a shared receive queue of another backend (create it on this one)",
                )?;
                if opts.early_recvs.0 > 0 {
                    return Err(BackendError::Unsupported(
                        "early receives on an endpoint with a shared receive queue (post them to the queue)",
                    ));
                }
                (srq.pd.clone(), Some(srq.srq.clone()))
            }
            None => (self.device.alloc_pd(), None),
        };
        let cq = self.device.create_cq(2 * opts.queue_depth as usize);
        let (count, len) = opts.early_recvs;
        let mut recvs = Vec::new();
        let early = if count > 0 {
            let mr = pd
                .register(count as usize * len as usize, Access::LOCAL_WRITE)
                .map_err(|e| BackendError::Verbs(e.to_string()))?;
            for i in 0..count {
                recvs
                    .push(RecvWr { wr_id: u64::from(i), sgl: mr.sge(i as usize * len as usize, len).into() });
            }
            Some(Arc::new(EngineRegion { mr }) as Arc<dyn Region>)
        } else {
            None
        };
        Ok(Parts { pd, cq, early, recvs, srq })
    }
}

impl Backend for EngineBackend {
    fn info(&self) -> DeviceInfo {
        let mut info = engine_info();
        info.caps.immediate &= self.rfc7306;
        info.caps.atomics &= self.rfc7306;
        info
    }

    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn BackendListener>, BackendError> {
        let listener = self.device.listen(addr)?;
        Ok(Box::new(EngineListener { backend: self.clone(), listener }))
    }

    fn connect(&self, addr: SocketAddr, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        let mut parts = self.parts(opts)?;
        let options = self.options(opts, &mut parts);
        let connected = self.device.connect(addr, &parts.pd, &parts.cq, &parts.cq, &options)?;
        let peer = connected.private_data.clone();
        let Parts { pd, cq, early, .. } = parts;
        Ok(Box::new(EngineEndpoint { _backend: self.clone(), pd, cq, qp: connected.qp, peer, early }))
    }

    fn create_srq(&self, depth: u32) -> Result<Arc<dyn SharedRecvQueue>, BackendError> {
        Ok(Arc::new(EngineSrq {
            _backend: self.clone(),
            pd: self.device.alloc_pd(),
            srq: self.device.create_srq(depth as usize),
        }))
    }
}

struct Parts {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    early: Option<Arc<dyn Region>>,
    recvs: Vec<RecvWr>,
    srq: Option<iwarp_rdmap::qp::SharedReceiveQueue>,
}

/// The engine's shared receive queue and the protection domain its endpoints share.
#[derive(Debug)]
struct EngineSrq {
    // Keeps the device alive as long as the queue.
    _backend: EngineBackend,
    pd: ProtectionDomain,
    srq: iwarp_rdmap::qp::SharedReceiveQueue,
}

impl SharedRecvQueue for EngineSrq {
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        region(self.pd.register(len, access.union(Access::LOCAL_WRITE)))
    }

    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        let sge = iwarp_rdmap::memory::Sge { lkey: STag(local.lkey), addr: local.addr, len: local.len };
        self.srq
            .post_recv(RecvWr { wr_id, sgl: sge.into() })
            .map_err(|e| BackendError::Verbs(format!("post to the shared receive queue: {e:?}")))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct EngineListener {
    backend: EngineBackend,
    listener: Listener,
}

impl BackendListener for EngineListener {
    fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    fn next_request(&self, timeout: Duration) -> Result<Box<dyn PendingRequest>, BackendError> {
        let request = self.listener.accept(timeout)?;
        Ok(Box::new(EngineRequest { backend: self.backend.clone(), request }))
    }
}

struct EngineRequest {
    backend: EngineBackend,
    request: ConnectRequest,
}

impl PendingRequest for EngineRequest {
    fn private_data(&self) -> Vec<u8> {
        self.request.private_data().to_vec()
    }

    fn accept(self: Box<Self>, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        let mut parts = self.backend.parts(opts)?;
        let options = self.backend.options(opts, &mut parts);
        let peer = self.request.private_data().to_vec();
        let qp = self.request.accept(&parts.pd, &parts.cq, &parts.cq, &options)?;
        let Parts { pd, cq, early, .. } = parts;
        Ok(Box::new(EngineEndpoint { _backend: self.backend, pd, cq, qp, peer, early }))
    }

    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), BackendError> {
        Ok(self.request.reject(private_data)?)
    }
}

struct EngineEndpoint {
    // Keeps the device (and its engine thread) alive as long as the endpoint.
    _backend: EngineBackend,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    peer: Vec<u8>,
    early: Option<Arc<dyn Region>>,
}

/// RFC 7306 immediate data is 8 bytes; verbs' 32 bits travel in the last four, big-endian
/// (as the verbs drop-in maps them).
fn imm_to_engine(imm: u32) -> [u8; 8] {
    let mut data = [0; 8];
    data[4..].copy_from_slice(&imm.to_be_bytes());
    data
}

fn imm_from_engine(data: [u8; 8]) -> u32 {
    u32::from_be_bytes([data[4], data[5], data[6], data[7]])
}

fn engine_completion(wc: WorkCompletion) -> Completion {
    let status = match wc.status {
        WcStatus::Success => Status::Success,
        WcStatus::LocalLengthError => Status::LocalLength,
        WcStatus::LocalProtectionError => Status::LocalProtection,
        WcStatus::RemoteAccessError => Status::RemoteAccess,
        WcStatus::RemoteOperationError => Status::RemoteOperation,
        WcStatus::WrFlushError => Status::Flushed,
        #[allow(unreachable_patterns)]
        _ => Status::Other(u32::MAX),
    };
    let op = match wc.opcode {
        WcOpcode::Send | WcOpcode::ImmediateData => CompletionOp::Send,
        WcOpcode::Write => CompletionOp::Write,
        WcOpcode::Read => CompletionOp::Read,
        WcOpcode::Atomic => CompletionOp::Atomic,
        WcOpcode::Recv => CompletionOp::Recv,
        WcOpcode::RecvImmediate => CompletionOp::RecvImm,
        WcOpcode::BindWindow => CompletionOp::Bind,
        WcOpcode::LocalInvalidate => CompletionOp::LocalInvalidate,
        _ => CompletionOp::Other,
    };
    Completion {
        wr_id: wc.wr_id,
        status,
        op,
        byte_len: u32::try_from(wc.byte_len).unwrap_or(u32::MAX),
        imm: wc.imm_data.map(imm_from_engine),
    }
}

impl Endpoint for EngineEndpoint {
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        region(self.pd.register(len, access.union(Access::LOCAL_WRITE)))
    }

    fn register_buffer(&self, buffer: Vec<u8>, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        if buffer.is_empty() {
            return Err(BackendError::Unsupported("registering an empty buffer"));
        }
        region(self.pd.register_buffer(buffer, access.union(Access::LOCAL_WRITE)))
    }

    fn peer_private_data(&self) -> Vec<u8> {
        self.peer.clone()
    }

    fn early_recv_region(&self) -> Option<Arc<dyn Region>> {
        self.early.clone()
    }

    fn post_send(&self, wr_id: u64, op: Op, local: Option<Local>) -> Result<(), BackendError> {
        let op = match op {
            Op::Send => SendOp::Send { solicited: false, invalidate: None },
            Op::SendImm(imm) => SendOp::SendImmediate { data: imm_to_engine(imm), solicited: false },
            Op::Write { rkey, addr } => SendOp::Write { remote_stag: STag(rkey), remote_to: addr },
            Op::WriteImm { rkey, addr, imm } => SendOp::WriteImmediate {
                remote_stag: STag(rkey),
                remote_to: addr,
                data: imm_to_engine(imm),
                solicited: false,
            },
            Op::Read { rkey, addr } => SendOp::Read { remote_stag: STag(rkey), remote_to: addr },
            Op::FetchAdd { rkey, addr, add } => SendOp::Atomic {
                remote_stag: STag(rkey),
                remote_to: addr,
                op: AtomicOp::FetchAdd,
                data: add,
                data_mask: 0,
                compare: 0,
                compare_mask: 0,
            },
            Op::CompareSwap { rkey, addr, compare, swap } => SendOp::Atomic {
                remote_stag: STag(rkey),
                remote_to: addr,
                op: AtomicOp::CompareSwap,
                data: swap,
                data_mask: !0,
                compare,
                compare_mask: !0,
            },
            Op::LocalInvalidate { rkey } => SendOp::LocalInvalidate { stag: STag(rkey) },
        };
        let sgl = match local {
            Some(l) => iwarp_rdmap::memory::Sge { lkey: STag(l.lkey), addr: l.addr, len: l.len }.into(),
            None => iwarp_rdmap::memory::Sgl::default(),
        };
        self.qp
            .post_send(SendWr { wr_id, op, sgl, signaled: true })
            .map_err(|e| BackendError::Verbs(format!("{e:?}")))
    }

    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        let sge = iwarp_rdmap::memory::Sge { lkey: STag(local.lkey), addr: local.addr, len: local.len };
        self.qp.post_recv(RecvWr { wr_id, sgl: sge.into() }).map_err(|e| match e {
            crate::PostError::UsesSrq => BackendError::Unsupported(crate::seam::SRQ_POST_RECV),
            e => BackendError::Verbs(format!("{e:?}")),
        })
    }

    fn poll(&self, timeout: Duration) -> Option<Completion> {
        self.cq.wait(timeout).map(engine_completion)
    }

    fn wait_notification(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.cq.req_notify(false);
        Ok(self.cq.wait_notification(timeout))
    }

    fn disconnect(&self) {
        self.qp.disconnect();
    }

    fn alloc_mw(&self) -> Result<Arc<dyn Window>, BackendError> {
        let mw = self.pd.alloc_mw().map_err(|e| BackendError::Verbs(format!("alloc_mw: {e}")))?;
        Ok(Arc::new(EngineWindow { mw }))
    }

    fn post_bind(
        &self,
        wr_id: u64,
        window: &dyn Window,
        region: &dyn Region,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, BackendError> {
        let window = own::<EngineWindow>(window.as_any(), "a memory window of another backend")?;
        let region = own::<EngineRegion>(region.as_any(), "a region of another backend")?;
        let offset = usize::try_from(offset).map_err(|_| BackendError::OutOfBounds)?;
        // The next key, as verbs' ibv_inc_rkey picks it.
        let key = window.mw.rkey().key().wrapping_add(1);
        let op = window.mw.bind_op(key, &region.mr, offset, len, access);
        let rkey = window.mw.rkey().0;
        self.qp
            .post_send(SendWr { wr_id, op, sgl: iwarp_rdmap::memory::Sgl::default(), signaled: true })
            .map_err(|e| BackendError::Verbs(format!("{e:?}")))?;
        Ok(rkey)
    }
}

#[derive(Debug)]
struct EngineWindow {
    mw: MemoryWindow,
}

impl Window for EngineWindow {
    fn rkey(&self) -> u32 {
        self.mw.rkey().0
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct EngineRegion {
    mr: MemoryRegion,
}

/// A registration's result as the seam's region (its callers add local write to the rights
/// asked for: receives and Read responses write a region locally).
fn region(registered: Result<MemoryRegion, RegisterError>) -> Result<Arc<dyn Region>, BackendError> {
    let mr = registered.map_err(|e| BackendError::Verbs(e.to_string()))?;
    Ok(Arc::new(EngineRegion { mr }))
}

impl Region for EngineRegion {
    fn addr(&self) -> u64 {
        self.mr.addr()
    }

    fn len(&self) -> usize {
        self.mr.len()
    }

    fn lkey(&self) -> u32 {
        self.mr.lkey().0
    }

    fn rkey(&self) -> u32 {
        self.mr.rkey().0
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.mr.write(offset, data).map_err(|_| BackendError::OutOfBounds)
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.mr.read(offset, out).map_err(|_| BackendError::OutOfBounds)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_buffer(self: Arc<Self>) -> Option<Vec<u8>> {
        let region = Arc::try_unwrap(self).ok()?;
        match region.mr.deregister().ok()? {
            Buffer::Vec(v) => Some(v),
            Buffer::Boxed(b) => Some(b.into_vec()),
            other => other.as_slice().map(<[u8]>::to_vec),
        }
    }
}
