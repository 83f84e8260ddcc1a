//! The `verbs` backend: an rdma-core device (siw, rxe, an iWARP or RoCE NIC, or the verbs
//! drop-in of verbs-abi/) behind the seam of src/backend.rs (its types in src/seam.rs), through the `sideway` binding.
//! sideway's rdma-mummy-sys opens libibverbs.so.1 and librdmacm.so.1 with `dlopen` when the
//! program starts and leaves every entry point failing with `EOPNOTSUPP` when they are
//! missing, so a binary built with the feature runs on a host without rdma-core and lists no
//! devices, saying why.
//!
//! What sideway 0.4.3 does not expose, this backend cannot do, and says so in the device's
//! capabilities: private data in rdma_cm's connect and accept (its `ConnectionParameter`
//! has no setter for it and an event's private data has no getter), a reject with private
//! data (a request is rejected by destroying its identifier, which the initiator sees as a
//! refusal), and completion notification (no `ibv_req_notify_cq`/`ibv_get_cq_event`).
//!
//! This is one of the workspace's fenced places for `unsafe`: registering application memory
//! (the device writes it behind the compiler's back) and the scatter/gather entries of work
//! requests take raw addresses. Every block says why it holds.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use iwarp_ddp::stag_table::Access;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::{BasicCompletionQueue, PollCompletionQueueError};
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList, TransportType};
use sideway::ibverbs::device_context::{AtomicCapability, DeviceContext, LinkLayer};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard as _, QueuePair as _, QueuePairAttribute, QueuePairState, QueuePairType,
    SetScatterGatherEntry as _, WorkRequestFlags,
};
use sideway::rdmacm::communication_manager::{
    ConnectionParameter, Event, EventChannel, EventType, Identifier, PortSpace,
};

use crate::seam::{
    Backend, BackendError, BackendListener, Capabilities, Completion, CompletionOp, DeviceInfo,
    DeviceTransport, Endpoint, EndpointOptions, Local, Op, PendingRequest, Region, Status,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn verbs_error(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Verbs(format!("{what}: {e}"))
}

/// Lists the rdma-core devices, or says why there are none to list.
pub(crate) fn devices() -> Result<Vec<DeviceInfo>, String> {
    let list = DeviceList::new().map_err(|e| {
        format!("rdma-core is not usable here ({e}; libibverbs.so.1 missing, or no RDMA devices)")
    })?;
    let mut out = Vec::new();
    for dev in list.iter() {
        let name = dev.name();
        let transport = dev.transport_type();
        let ctx = dev.open().map_err(|e| format!("{name}: cannot open: {e}"))?;
        out.push(describe(name, transport, &ctx));
    }
    Ok(out)
}

fn describe(name: String, transport: TransportType, ctx: &Arc<DeviceContext>) -> DeviceInfo {
    let transport = match transport {
        TransportType::IWarp => DeviceTransport::Iwarp,
        TransportType::InfiniBand => match ctx.query_port(1).map(|p| p.link_layer()) {
            Ok(LinkLayer::Ethernet) => DeviceTransport::Roce,
            _ => DeviceTransport::Infiniband,
        },
        _ => DeviceTransport::Other,
    };
    let atomics =
        ctx.query_device().map(|a| !matches!(a.atomic_capability(), AtomicCapability::None)).unwrap_or(false);
    DeviceInfo {
        name,
        transport,
        caps: Capabilities {
            rdma: true,
            // iWARP devices under rdma-core (siw, the drop-in) take no immediate data: the
            // RFC 7306 extensions cannot be negotiated through rdma_cm.
            immediate: transport != DeviceTransport::Iwarp,
            atomics: atomics && transport != DeviceTransport::Iwarp,
            private_data: false,
            reject: true,
            cq_notify: false,
        },
    }
}

/// Opens the rdma-core device `name`.
pub(crate) fn open(name: &str) -> Result<VerbsBackend, BackendError> {
    let list = devices().map_err(BackendError::NoDevice)?;
    match list.into_iter().find(|d| d.name == name) {
        Some(info) => Ok(VerbsBackend { info }),
        None => Err(BackendError::NoDevice(format!(
            "{name} is not among the rdma-core devices (`iwarp devices` lists them)"
        ))),
    }
}

/// An rdma-core device behind the seam. rdma_cm picks the device from the address, so the
/// name chooses capabilities and the transport, and connections are made through whichever
/// device owns the address given.
#[derive(Debug, Clone)]
pub(crate) struct VerbsBackend {
    info: DeviceInfo,
}

/// Waits up to `deadline` for the next event on `channel` (non-blocking underneath).
fn next_event(channel: &Arc<EventChannel>, deadline: Instant) -> Result<Event, BackendError> {
    loop {
        match channel.get_cm_event() {
            Ok(e) => return Ok(e),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(BackendError::Connect(format!("timed out waiting for rdma_cm ({e})"))),
        }
    }
}

/// Waits for an event of type `want` on `channel`, acknowledging it.
fn expect_event(channel: &Arc<EventChannel>, want: EventType, deadline: Instant) -> Result<(), BackendError> {
    let event = next_event(channel, deadline)?;
    let (ty, status) = (event.event_type(), event.status());
    let _ = event.ack();
    if ty == want {
        Ok(())
    } else {
        Err(BackendError::Connect(format!("rdma_cm: {ty:?} (status {status}) where {want:?} was expected")))
    }
}

fn new_channel() -> Result<Arc<EventChannel>, BackendError> {
    let channel = EventChannel::new().map_err(|e| verbs_error("rdma_create_event_channel", e))?;
    channel.set_nonblocking(true).map_err(|e| verbs_error("event channel", e))?;
    Ok(channel)
}

/// A queue pair with its completion queue and protection domain, made on the identifier's
/// device and moved to INIT (and to RTS, off iWARP, where rdma_cm's caller does that).
struct Parts {
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
    pd: Arc<ProtectionDomain>,
    iwarp: bool,
    early: Option<Arc<dyn Region>>,
}

fn make_parts(id: &Arc<Identifier>, opts: &EndpointOptions, iwarp: bool) -> Result<Parts, BackendError> {
    let ctx = id.get_device_context().ok_or_else(|| BackendError::Verbs("rdma_cm bound no device".into()))?;
    let pd = ctx.alloc_pd().map_err(|e| verbs_error("ibv_alloc_pd", e))?;
    let cq = ctx
        .create_cq_builder()
        .setup_cqe(2 * opts.queue_depth)
        .build()
        .map_err(|e| verbs_error("ibv_create_cq", e))?;
    let mut qp = pd
        .create_qp_builder()
        .setup_qp_type(QueuePairType::ReliableConnection)
        .setup_max_send_wr(opts.queue_depth)
        .setup_max_recv_wr(opts.queue_depth)
        .setup_max_send_sge(1)
        .setup_max_recv_sge(1)
        .setup_send_cq(cq.clone())
        .setup_recv_cq(cq.clone())
        .build()
        .map_err(|e| verbs_error("ibv_create_qp", e))?;
    let attr = id.get_qp_attr(QueuePairState::Init).map_err(|e| verbs_error("rdma_init_qp_attr(INIT)", e))?;
    qp.modify(&attr).map_err(|e| verbs_error("ibv_modify_qp(INIT)", e))?;
    let (count, len) = opts.early_recvs;
    let early = if count > 0 {
        let region = register_region(&pd, count as usize * len as usize, Access::NONE)?;
        for i in 0..count {
            post_recv(&mut qp, u64::from(i), region.local(i as usize * len as usize, len))?;
        }
        Some(Arc::new(region) as Arc<dyn Region>)
    } else {
        None
    };
    Ok(Parts { qp, cq, pd, iwarp, early })
}

/// Off iWARP, the application moves its own queue pair to RTR and RTS (on iWARP the kernel's
/// connection manager does, when the connection is up).
fn to_rts(id: &Arc<Identifier>, parts: &mut Parts) -> Result<(), BackendError> {
    if parts.iwarp {
        return Ok(());
    }
    for state in [QueuePairState::ReadyToReceive, QueuePairState::ReadyToSend] {
        let attr = id.get_qp_attr(state).map_err(|e| verbs_error("rdma_init_qp_attr", e))?;
        parts.qp.modify(&attr).map_err(|e| verbs_error("ibv_modify_qp", e))?;
    }
    Ok(())
}

fn conn_param(parts: &Parts) -> ConnectionParameter {
    let mut param = ConnectionParameter::default();
    param.setup_qp_number(parts.qp.qp_number());
    param
}

impl Backend for VerbsBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn BackendListener>, BackendError> {
        // rdma_cm's local address is not readable through sideway: a port 0 becomes a port
        // that was free a moment ago.
        let addr = if addr.port() == 0 {
            let probe = TcpListener::bind(addr).map_err(|e| verbs_error("probe for a free port", e))?;
            probe.local_addr().map_err(|e| verbs_error("probe for a free port", e))?
        } else {
            addr
        };
        let channel = new_channel()?;
        let id = channel.create_id(PortSpace::Tcp).map_err(|e| verbs_error("rdma_create_id", e))?;
        id.bind_addr(addr).map_err(|e| BackendError::Connect(format!("rdma_bind_addr {addr}: {e}")))?;
        id.listen(16).map_err(|e| BackendError::Connect(format!("rdma_listen: {e}")))?;
        Ok(Box::new(VerbsListener {
            addr,
            shared: Arc::new(ListenShared {
                channel,
                _id: id,
                down: Mutex::default(),
                iwarp: self.info.transport == DeviceTransport::Iwarp,
                queued: Mutex::default(),
            }),
        }))
    }

    fn connect(&self, addr: SocketAddr, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        if !opts.private_data.is_empty() {
            return Err(BackendError::Unsupported(
                "private data (sideway 0.4.3 cannot pass it to rdma_connect)",
            ));
        }
        let deadline = Instant::now() + opts.timeout;
        let channel = new_channel()?;
        let id = channel.create_id(PortSpace::Tcp).map_err(|e| verbs_error("rdma_create_id", e))?;
        id.resolve_addr(None, addr, opts.timeout)
            .map_err(|e| BackendError::Connect(format!("rdma_resolve_addr: {e}")))?;
        expect_event(&channel, EventType::AddressResolved, deadline)?;
        id.resolve_route(opts.timeout)
            .map_err(|e| BackendError::Connect(format!("rdma_resolve_route: {e}")))?;
        expect_event(&channel, EventType::RouteResolved, deadline)?;
        let mut parts = make_parts(&id, opts, self.info.transport == DeviceTransport::Iwarp)?;
        id.connect(conn_param(&parts)).map_err(|e| BackendError::Connect(format!("rdma_connect: {e}")))?;
        let event = next_event(&channel, deadline)?;
        let (ty, status) = (event.event_type(), event.status());
        let _ = event.ack();
        match ty {
            EventType::Established => {}
            EventType::ConnectResponse => {
                to_rts(&id, &mut parts)?;
                id.establish().map_err(|e| BackendError::Connect(format!("rdma_establish: {e}")))?;
            }
            other => return Err(BackendError::Connect(format!("rdma_cm: {other:?} (status {status})"))),
        }
        Ok(Box::new(VerbsEndpoint::new(parts, id, Events::Own(channel))))
    }
}

struct ListenShared {
    channel: Arc<EventChannel>,
    _id: Arc<Identifier>,
    iwarp: bool,
    // Requests that arrived while an accept waited for its connection to come up.
    queued: Mutex<VecDeque<Arc<Identifier>>>,
    // Accepted connections whose peer disconnected (their endpoints move their queue pairs
    // to the error state when they next look).
    down: Mutex<Vec<Arc<Identifier>>>,
}

impl ListenShared {
    /// Keeps what an event on the listener's channel says for whoever it concerns: a request
    /// for the next `next_request`, a disconnect for its endpoint.
    fn keep(&self, ty: &EventType, id: Option<Arc<Identifier>>) {
        match (ty, id) {
            (EventType::ConnectRequest, Some(id)) => lock(&self.queued).push_back(id),
            (EventType::Disconnected, Some(id)) => lock(&self.down).push(id),
            _ => {}
        }
    }

    /// Reads what the listener's channel has without waiting.
    fn drain(&self) {
        while let Ok(event) = self.channel.get_cm_event() {
            let (ty, id) = (event.event_type(), event.cm_id());
            let _ = event.ack();
            self.keep(&ty, id);
        }
    }
}

struct VerbsListener {
    addr: SocketAddr,
    shared: Arc<ListenShared>,
}

impl BackendListener for VerbsListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn next_request(&self, timeout: Duration) -> Result<Box<dyn PendingRequest>, BackendError> {
        if let Some(id) = lock(&self.shared.queued).pop_front() {
            return Ok(Box::new(VerbsRequest { id, shared: self.shared.clone() }));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let event = next_event(&self.shared.channel, deadline)?;
            let (ty, id) = (event.event_type(), event.cm_id());
            let _ = event.ack();
            self.shared.keep(&ty, id);
            if let Some(id) = lock(&self.shared.queued).pop_front() {
                return Ok(Box::new(VerbsRequest { id, shared: self.shared.clone() }));
            }
        }
    }
}

struct VerbsRequest {
    id: Arc<Identifier>,
    shared: Arc<ListenShared>,
}

impl PendingRequest for VerbsRequest {
    fn private_data(&self) -> Vec<u8> {
        Vec::new()
    }

    fn accept(self: Box<Self>, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        if !opts.private_data.is_empty() {
            return Err(BackendError::Unsupported(
                "private data (sideway 0.4.3 cannot pass it to rdma_accept)",
            ));
        }
        let deadline = Instant::now() + opts.timeout;
        let mut parts = make_parts(&self.id, opts, self.shared.iwarp)?;
        to_rts(&self.id, &mut parts)?;
        self.id.accept(conn_param(&parts)).map_err(|e| BackendError::Connect(format!("rdma_accept: {e}")))?;
        loop {
            let event = next_event(&self.shared.channel, deadline)?;
            let (ty, status, id) = (event.event_type(), event.status(), event.cm_id());
            let _ = event.ack();
            match (&ty, id) {
                (EventType::Established, Some(id)) if Arc::ptr_eq(&id, &self.id) => break,
                (EventType::ConnectError | EventType::Rejected | EventType::Unreachable, Some(id))
                    if Arc::ptr_eq(&id, &self.id) =>
                {
                    return Err(BackendError::Connect(format!("rdma_cm: {ty:?} (status {status})")));
                }
                (_, id) => self.shared.keep(&ty, id),
            }
        }
        Ok(Box::new(VerbsEndpoint::new(parts, self.id, Events::Listener(self.shared))))
    }

    fn reject(self: Box<Self>, _private_data: &[u8]) -> Result<(), BackendError> {
        // Destroying a request's identifier rejects it (without private data: see the
        // module's header).
        drop(self.id);
        Ok(())
    }
}

/// Where an endpoint's rdma_cm events arrive.
enum Events {
    /// Its own channel (the initiator's).
    Own(Arc<EventChannel>),
    /// The listener's channel, shared with the listener and its other connections.
    Listener(Arc<ListenShared>),
}

struct VerbsEndpoint {
    // Dropped in this order: the queue pair before its completion queue and domain, the
    // identifier before its channel.
    qp: Mutex<BasicQueuePair>,
    cq: Arc<BasicCompletionQueue>,
    pd: Arc<ProtectionDomain>,
    id: Arc<Identifier>,
    events: Events,
    // The peer disconnected and the queue pair was moved to the error state.
    down: AtomicBool,
    pending: Mutex<VecDeque<Completion>>,
    early: Option<Arc<dyn Region>>,
}

impl VerbsEndpoint {
    /// Handles the connection's rdma_cm events as librdmacm does for a queue pair it made:
    /// when the peer disconnects, the queue pair moves to the error state and what is
    /// outstanding completes flushed (an iWARP device does that itself when TCP closes; an
    /// InfiniBand or RoCE one leaves it to the application).
    fn check_events(&self) {
        if self.down.load(Ordering::Relaxed) {
            return;
        }
        let disconnected = match &self.events {
            Events::Own(channel) => {
                let mut seen = false;
                while let Ok(event) = channel.get_cm_event() {
                    seen |= event.event_type() == EventType::Disconnected;
                    let _ = event.ack();
                }
                seen
            }
            Events::Listener(shared) => {
                shared.drain();
                let mut down = lock(&shared.down);
                let before = down.len();
                down.retain(|id| !Arc::ptr_eq(id, &self.id));
                down.len() != before
            }
        };
        if disconnected {
            self.to_error();
        }
    }

    fn to_error(&self) {
        self.down.store(true, Ordering::Relaxed);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = lock(&self.qp).modify(&attr);
    }

    fn new(parts: Parts, id: Arc<Identifier>, events: Events) -> VerbsEndpoint {
        VerbsEndpoint {
            qp: Mutex::new(parts.qp),
            cq: parts.cq,
            pd: parts.pd,
            id,
            events,
            down: AtomicBool::new(false),
            pending: Mutex::default(),
            early: parts.early,
        }
    }
}

fn access_flags(access: Access) -> AccessFlags {
    let mut flags = AccessFlags::LocalWrite;
    if access.remote_read {
        flags |= AccessFlags::RemoteRead;
    }
    if access.remote_write {
        flags |= AccessFlags::RemoteWrite;
    }
    if access.remote_atomic {
        flags |= AccessFlags::RemoteAtomic;
    }
    flags
}

// Verbs' `enum ibv_wc_status` and `enum ibv_wc_opcode`, as the completion carries them.
fn completion_status(status: u32) -> Status {
    match status {
        0 => Status::Success,
        1 => Status::LocalLength,
        2 => Status::LocalQpOperation,
        4 => Status::LocalProtection,
        5 => Status::Flushed,
        10 => Status::RemoteAccess,
        11 => Status::RemoteOperation,
        other => Status::Other(other),
    }
}

fn completion_op(opcode: u32) -> CompletionOp {
    match opcode {
        0 => CompletionOp::Send,
        1 => CompletionOp::Write,
        2 => CompletionOp::Read,
        3 | 4 => CompletionOp::Atomic,
        128 => CompletionOp::Recv,
        129 => CompletionOp::RecvImm,
        _ => CompletionOp::Other,
    }
}

const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;

impl Endpoint for VerbsEndpoint {
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        Ok(Arc::new(register_region(&self.pd, len, access)?))
    }

    fn peer_private_data(&self) -> Vec<u8> {
        Vec::new()
    }

    fn early_recv_region(&self) -> Option<Arc<dyn Region>> {
        self.early.clone()
    }

    fn post_send(&self, wr_id: u64, op: Op, local: Option<Local>) -> Result<(), BackendError> {
        let mut qp = lock(&self.qp);
        let mut guard = qp.start_post_send();
        let wr = guard.construct_wr(wr_id, WorkRequestFlags::Signaled);
        let handle = match op {
            Op::Send => wr.setup_send(),
            Op::SendImm(imm) => wr.setup_send_imm(imm.to_be()),
            Op::Write { rkey, addr } => wr.setup_write(rkey, addr),
            Op::WriteImm { rkey, addr, imm } => wr.setup_write_imm(rkey, addr, imm.to_be()),
            Op::Read { rkey, addr } => wr.setup_read(rkey, addr),
            Op::FetchAdd { rkey, addr, add } => wr.setup_atomic_fetch_add(rkey, addr, add),
            Op::CompareSwap { rkey, addr, compare, swap } => {
                wr.setup_atomic_compare_swap(rkey, addr, compare, swap)
            }
        };
        match local {
            // SAFETY: the address and length are the application's description of a buffer
            // inside one of its registered regions; the device checks them against the
            // lkey's region, and a wrong one fails the work request, not memory safety.
            Some(l) => unsafe { handle.setup_sge(l.lkey, l.addr, l.len) },
            // SAFETY: an empty scatter/gather list names no memory.
            None => unsafe { handle.setup_sge_list(&[]) },
        }
        guard.post().map_err(|e| verbs_error("ibv_post_send", e))
    }

    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        post_recv(&mut lock(&self.qp), wr_id, local)
    }

    fn poll(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let mut pending = lock(&self.pending);
        loop {
            if let Some(done) = pending.pop_front() {
                return Some(done);
            }
            // A poller reads a batch of completions at once: keep all of them.
            match self.cq.start_poll() {
                Ok(poller) => pending.extend(poller.map(|wc| Completion {
                    wr_id: wc.wr_id(),
                    status: completion_status(wc.status()),
                    op: completion_op(wc.opcode()),
                    byte_len: wc.byte_len(),
                    // sideway's completion has no `wc_flags`: the immediate data of a Write
                    // with immediate (its own opcode) is known, a Send's is not.
                    imm: (wc.opcode() == IBV_WC_RECV_RDMA_WITH_IMM).then(|| u32::from_be(wc.imm_data())),
                })),
                Err(PollCompletionQueueError::CompletionQueueEmpty) => {}
                Err(_) => return None,
            }
            if pending.is_empty() {
                self.check_events();
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::yield_now();
            }
        }
    }

    fn wait_notification(&self, _timeout: Duration) -> Result<bool, BackendError> {
        Err(BackendError::Unsupported("completion notification (sideway 0.4.3 has no ibv_req_notify_cq)"))
    }

    fn disconnect(&self) {
        let _ = self.id.disconnect();
        // Without rdma_create_qp, rdma_disconnect leaves the queue pair alone: move it to
        // the error state so that what is outstanding completes flushed.
        self.to_error();
    }
}

fn post_recv(qp: &mut BasicQueuePair, wr_id: u64, local: Local) -> Result<(), BackendError> {
    let mut guard = qp.start_post_recv();
    let wr = guard.construct_wr(wr_id);
    // SAFETY: as in `post_send`: the device checks the buffer against the lkey's region.
    unsafe { wr.setup_sge(local.lkey, local.addr, local.len) };
    guard.post().map_err(|e| verbs_error("ibv_post_recv", e))
}

/// Registers `len` zeroed bytes of memory the region owns.
fn register_region(
    pd: &Arc<ProtectionDomain>,
    len: usize,
    access: Access,
) -> Result<VerbsRegion, BackendError> {
    let buffer = vec![0u8; len.max(1)].into_boxed_slice();
    let ptr = Box::into_raw(buffer);
    let mut region = VerbsRegion { mr: None, ptr: ptr.cast::<u8>(), len };
    // SAFETY: `ptr` is a live allocation of at least `len` bytes that the region owns and
    // frees only after it has deregistered it (`VerbsRegion::drop`), and every access of
    // ours to it goes through raw copies, never through references the device's writes
    // could invalidate.
    let mr = unsafe { pd.reg_mr(region.ptr as usize, len.max(1), access_flags(access)) }
        .map_err(|e| verbs_error("ibv_reg_mr", e))?;
    region.mr = Some(mr);
    Ok(region)
}

struct VerbsRegion {
    mr: Option<Arc<MemoryRegion>>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region owns its allocation; all access to it is by raw copies, and the device
// may write it concurrently with the application as with any registered memory.
unsafe impl Send for VerbsRegion {}
// SAFETY: as above.
unsafe impl Sync for VerbsRegion {}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        self.mr = None;
        // SAFETY: `ptr` came from `Box::into_raw` of a slice of `len.max(1)` bytes, is freed
        // once, and after the deregistration above the device no longer writes it.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len.max(1))) });
    }
}

impl Region for VerbsRegion {
    fn addr(&self) -> u64 {
        self.ptr as u64
    }

    fn len(&self) -> usize {
        self.len
    }

    fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.lkey())
    }

    fn rkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, |m| m.rkey())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        if offset.checked_add(data.len()).is_none_or(|end| end > self.len) {
            return Err(BackendError::OutOfBounds);
        }
        // SAFETY: the range is inside the allocation (checked above), `data` is a separate
        // borrow, and a raw copy makes no claim about concurrent device writes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        if offset.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return Err(BackendError::OutOfBounds);
        }
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}
