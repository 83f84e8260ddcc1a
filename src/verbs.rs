//! The `verbs` backend: an rdma-core device (siw, rxe, an iWARP or RoCE NIC, or the verbs
//! drop-in of verbs-abi/) behind the seam of src/backend.rs (its types in src/seam.rs), through the `sideway` binding.
//! sideway's rdma-mummy-sys opens libibverbs.so.1 and librdmacm.so.1 with `dlopen` when the
//! program starts and leaves every entry point failing with `EOPNOTSUPP` when they are
//! missing, so a binary built with the feature runs on a host without rdma-core and lists no
//! devices, saying why.
//!
//! sideway 0.4.3 covers the verbs objects (devices, protection domains, registered memory,
//! completion queues and channels, queue pairs, posting). What it does not expose, this
//! backend calls through rdma-mummy-sys's raw entry points (the same dlopened libraries):
//! all of rdma_cm (sideway keeps an identifier's and an event's handles private, has no
//! setter for a connection's private data, no getter for an event's, and no `rdma_reject`),
//! so that private data travels with the request, the reply and a reject; completion
//! notification (`ibv_req_notify_cq`, `ibv_get_cq_event` with poll(2) on the channel for a
//! bounded wait, `ibv_ack_cq_events`); and `ibv_poll_cq` itself, whose completions carry the
//! `wc_flags` that say a receive has immediate data (a Send with immediate's value); and
//! shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_destroy_srq`), with
//! the queue pairs that take their receives from one made by `ibv_create_qp` itself
//! (sideway's builder always passes no SRQ) and posted to with `ibv_post_send`; and type 2
//! memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`, binds and local invalidations posted with
//! `ibv_post_send`).
//!
//! This is one of the workspace's fenced places for `unsafe`: registering application memory
//! (the device writes it behind the compiler's back), the scatter/gather entries of work
//! requests, and the raw rdma-core calls above take raw addresses. Every block says why it
//! holds.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use iwarp_ddp::stag_table::Access;
use rustix::event::{PollFd, PollFlags, Timespec};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue as _};
use sideway::ibverbs::device::{DeviceInfo as _, DeviceList, TransportType};
use sideway::ibverbs::device_context::{AtomicCapability, DeviceContext, LinkLayer};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, QueuePair as _, QueuePairState, QueuePairType, SetScatterGatherEntry as _,
};

use crate::seam::own;
use crate::seam::{
    Backend, BackendError, BackendListener, Capabilities, Completion, CompletionOp, DeviceInfo,
    DeviceTransport, Endpoint, EndpointOptions, Local, Op, PendingRequest, Region, SRQ_POST_RECV,
    SharedRecvQueue, Status, Window,
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
    let attr = ctx.query_device().ok();
    let atomics = attr.as_ref().is_some_and(|a| !matches!(a.atomic_capability(), AtomicCapability::None));
    let srq = attr.as_ref().is_some_and(|a| a.max_srq() > 0);
    // siw and the verbs drop-in have none (max_mw 0); rxe has them.
    let memory_windows = attr.as_ref().is_some_and(|a| a.max_mw() > 0);
    DeviceInfo {
        name,
        transport,
        caps: Capabilities {
            rdma: true,
            // iWARP devices under rdma-core (siw, the drop-in) take no immediate data: the
            // RFC 7306 extensions cannot be negotiated through rdma_cm.
            immediate: transport != DeviceTransport::Iwarp,
            atomics: atomics && transport != DeviceTransport::Iwarp,
            private_data: true,
            reject: true,
            cq_notify: true,
            srq,
            memory_windows,
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

// rdma_cm through its raw entry points. sideway 0.4.3 keeps an identifier's and an event's
// handles private, has no setter for a connection's private data and no getter for an
// event's, and no `rdma_reject`; these few wrappers call librdmacm (dlopened by
// rdma-mummy-sys) themselves. Verbs objects (domains, queues, regions) stay sideway's.

/// The rdma_cm events this backend tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    AddressResolved,
    RouteResolved,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    Other(u32),
}

impl EventType {
    fn of(raw: u32) -> EventType {
        use rdma_mummy_sys::rdma_cm_event_type as t;
        match raw {
            t::RDMA_CM_EVENT_ADDR_RESOLVED => EventType::AddressResolved,
            t::RDMA_CM_EVENT_ROUTE_RESOLVED => EventType::RouteResolved,
            t::RDMA_CM_EVENT_CONNECT_REQUEST => EventType::ConnectRequest,
            t::RDMA_CM_EVENT_CONNECT_RESPONSE => EventType::ConnectResponse,
            t::RDMA_CM_EVENT_CONNECT_ERROR => EventType::ConnectError,
            t::RDMA_CM_EVENT_UNREACHABLE => EventType::Unreachable,
            t::RDMA_CM_EVENT_REJECTED => EventType::Rejected,
            t::RDMA_CM_EVENT_ESTABLISHED => EventType::Established,
            t::RDMA_CM_EVENT_DISCONNECTED => EventType::Disconnected,
            other => EventType::Other(other),
        }
    }
}

/// An rdma_cm event, copied out of librdmacm's structure and acknowledged.
struct Event {
    ty: EventType,
    status: i32,
    /// The identifier it is for, as an address to compare (never dereferenced).
    id: usize,
    /// A connection request's new identifier, ours to accept or reject.
    new_id: Option<Arc<CmId>>,
    /// The private data it carries (a request's, a reply's, a reject's).
    private_data: Vec<u8>,
}

/// An rdma_cm event channel, non-blocking.
struct CmChannel(NonNull<rdma_mummy_sys::rdma_event_channel>);

// SAFETY: librdmacm's calls on a channel are safe from any thread; the channel is destroyed
// once, when the last owner drops it.
unsafe impl Send for CmChannel {}
// SAFETY: as above.
unsafe impl Sync for CmChannel {}

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: every identifier made on the channel holds it (`CmId::_channel`), so none is
        // left, and every event read from it was acknowledged when it was read.
        unsafe { rdma_mummy_sys::rdma_destroy_event_channel(self.0.as_ptr()) };
    }
}

impl CmChannel {
    fn new() -> Result<Arc<CmChannel>, BackendError> {
        // SAFETY: no arguments; a null result is handled.
        let raw = unsafe { rdma_mummy_sys::rdma_create_event_channel() };
        let channel = NonNull::new(raw)
            .map(CmChannel)
            .ok_or_else(|| verbs_error("rdma_create_event_channel", std::io::Error::last_os_error()))?;
        // SAFETY: the descriptor is the channel's, open while `channel` lives.
        let fd = unsafe { BorrowedFd::borrow_raw(channel.fd()) };
        rustix::io::ioctl_fionbio(fd, true).map_err(|e| verbs_error("event channel", e))?;
        Ok(Arc::new(channel))
    }

    fn fd(&self) -> i32 {
        // SAFETY: the channel is alive while `self` is; `fd` is a plain field.
        unsafe { (*self.0.as_ptr()).fd }
    }

    fn create_id(self: &Arc<Self>) -> Result<Arc<CmId>, BackendError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the channel is alive; the call writes the new identifier on success only.
        let ret = unsafe {
            rdma_mummy_sys::rdma_create_id(
                self.0.as_ptr(),
                &mut raw,
                std::ptr::null_mut(),
                rdma_mummy_sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        match NonNull::new(raw) {
            Some(raw) if ret == 0 => Ok(Arc::new(CmId { raw, _channel: self.clone() })),
            _ => Err(verbs_error("rdma_create_id", std::io::Error::last_os_error())),
        }
    }

    /// The next event, without waiting.
    fn try_event(self: &Arc<Self>) -> Option<Event> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the channel is alive and non-blocking; the call writes `raw` on success.
        if unsafe { rdma_mummy_sys::rdma_get_cm_event(self.0.as_ptr(), &mut raw) } != 0 || raw.is_null() {
            return None;
        }
        // SAFETY: `raw` is the event librdmacm just handed out, valid until acknowledged
        // below; everything needed is copied out first. `param.conn` is the member rdma_cm
        // fills on a TCP port space's identifiers, and its private data pointer names
        // `private_data_len` readable bytes when it is not null.
        unsafe {
            let e = &*raw;
            let ty = EventType::of(e.event);
            let conn = e.param.conn;
            let private_data = if conn.private_data.is_null() || conn.private_data_len == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len))
                    .to_vec()
            };
            let new_id = match (ty, NonNull::new(e.id)) {
                (EventType::ConnectRequest, Some(id)) => {
                    Some(Arc::new(CmId { raw: id, _channel: self.clone() }))
                }
                _ => None,
            };
            let event = Event { ty, status: e.status, id: e.id as usize, new_id, private_data };
            rdma_mummy_sys::rdma_ack_cm_event(raw);
            Some(event)
        }
    }

    /// Waits until `deadline` for the next event.
    fn next_event(self: &Arc<Self>, deadline: Instant) -> Result<Event, BackendError> {
        loop {
            if let Some(event) = self.try_event() {
                return Ok(event);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BackendError::Connect("timed out waiting for rdma_cm".into()));
            }
            wait_readable(self.fd(), left);
        }
    }
}

/// Waits up to `timeout` (at most 100 ms at a time: another thread may take what arrives)
/// for `fd` to be readable.
fn wait_readable(fd: i32, timeout: Duration) {
    // SAFETY: callers pass the descriptor of a channel they hold, open for this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let wait = timeout.min(Duration::from_millis(100));
    let wait = Timespec { tv_sec: wait.as_secs() as _, tv_nsec: wait.subsec_nanos().into() };
    let _ = rustix::event::poll(&mut fds, Some(&wait));
}

/// An rdma_cm identifier.
struct CmId {
    raw: NonNull<rdma_mummy_sys::rdma_cm_id>,
    // Its events arrive there: the channel outlives it.
    _channel: Arc<CmChannel>,
}

// SAFETY: librdmacm's calls on an identifier are safe from any thread; it is destroyed once.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the identifier is ours and destroyed once; its events were acknowledged
        // when read. A request's identifier not accepted is rejected by this.
        unsafe { rdma_mummy_sys::rdma_destroy_id(self.raw.as_ptr()) };
    }
}

/// A result of librdmacm's: 0 or -1 with errno.
fn cm_result(what: &str, ret: i32) -> Result<(), BackendError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(BackendError::Connect(format!("{what}: {}", std::io::Error::last_os_error())))
    }
}

/// Connection parameters: the queue pair (and whether it takes its receives from a shared
/// receive queue) and private data (empty: none), `rd_atomic` Reads outstanding each way,
/// retries as rdma_cm's examples set them.
fn conn_param(
    qp_num: u32,
    srq: bool,
    private_data: &[u8],
    rd_atomic: u8,
) -> Result<rdma_mummy_sys::rdma_conn_param, BackendError> {
    let len = u8::try_from(private_data.len())
        .map_err(|_| BackendError::Unsupported("private data over 255 bytes (rdma_cm's limit)"))?;
    Ok(rdma_mummy_sys::rdma_conn_param {
        private_data: if len == 0 { std::ptr::null() } else { private_data.as_ptr().cast() },
        private_data_len: len,
        responder_resources: rd_atomic,
        initiator_depth: rd_atomic,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: u8::from(srq),
        qp_num,
    })
}

impl CmId {
    fn ptr(&self) -> *mut rdma_mummy_sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    fn bind_addr(&self, addr: SocketAddr) -> Result<(), BackendError> {
        let sa = socket2::SockAddr::from(addr);
        // SAFETY: the identifier is alive; `sa` is a valid socket address for the call,
        // which reads it only.
        cm_result(&format!("rdma_bind_addr {addr}"), unsafe {
            rdma_mummy_sys::rdma_bind_addr(self.ptr(), sa.as_ptr().cast_mut().cast())
        })
    }

    fn listen(&self, backlog: i32) -> Result<(), BackendError> {
        // SAFETY: the identifier is alive and bound.
        cm_result("rdma_listen", unsafe { rdma_mummy_sys::rdma_listen(self.ptr(), backlog) })
    }

    fn resolve_addr(&self, addr: SocketAddr, timeout: Duration) -> Result<(), BackendError> {
        let sa = socket2::SockAddr::from(addr);
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: as in `bind_addr`; no source address (null) lets rdma_cm pick it.
        cm_result("rdma_resolve_addr", unsafe {
            rdma_mummy_sys::rdma_resolve_addr(
                self.ptr(),
                std::ptr::null_mut(),
                sa.as_ptr().cast_mut().cast(),
                ms,
            )
        })
    }

    fn resolve_route(&self, timeout: Duration) -> Result<(), BackendError> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the identifier is alive and its address resolved.
        cm_result("rdma_resolve_route", unsafe { rdma_mummy_sys::rdma_resolve_route(self.ptr(), ms) })
    }

    /// The Reads outstanding each way to ask for: `opts.rd_atomic` (1 when unset), at most
    /// what the device allows a queue pair as responder and as initiator.
    fn rd_atomic(&self, opts: &EndpointOptions) -> Result<u8, BackendError> {
        let want = opts.rd_atomic.unwrap_or(1);
        if want <= 1 {
            return Ok(want);
        }
        let attr = self.device_context()?.query_device().map_err(|e| verbs_error("ibv_query_device", e))?;
        let limit = attr.max_qp_rd_atom().min(attr.max_qp_init_rd_atom()).max(1);
        Ok(u8::try_from(limit).map_or(want, |limit| want.min(limit)))
    }

    fn connect(&self, qp: &Qp, opts: &EndpointOptions) -> Result<(), BackendError> {
        let mut param = conn_param(qp.qp_number(), qp.uses_srq(), &opts.private_data, self.rd_atomic(opts)?)?;
        // SAFETY: the identifier is alive; `param` and the private data it points to live
        // through the call, which copies them.
        cm_result("rdma_connect", unsafe { rdma_mummy_sys::rdma_connect(self.ptr(), &mut param) })
    }

    fn accept(&self, qp: &Qp, opts: &EndpointOptions) -> Result<(), BackendError> {
        let mut param = conn_param(qp.qp_number(), qp.uses_srq(), &opts.private_data, self.rd_atomic(opts)?)?;
        // SAFETY: as in `connect`.
        cm_result("rdma_accept", unsafe { rdma_mummy_sys::rdma_accept(self.ptr(), &mut param) })
    }

    fn reject(&self, private_data: &[u8]) -> Result<(), BackendError> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| BackendError::Unsupported("private data over 255 bytes (rdma_cm's limit)"))?;
        let data = if len == 0 { std::ptr::null() } else { private_data.as_ptr().cast() };
        // SAFETY: the identifier is a request's, alive; the data lives through the call.
        cm_result("rdma_reject", unsafe { rdma_mummy_sys::rdma_reject(self.ptr(), data, len) })
    }

    fn establish(&self) -> Result<(), BackendError> {
        // SAFETY: the identifier is alive and has had its connect response.
        cm_result("rdma_establish", unsafe { rdma_mummy_sys::rdma_establish(self.ptr()) })
    }

    fn disconnect(&self) {
        // SAFETY: the identifier is alive; disconnecting one that is down fails harmlessly.
        let _ = unsafe { rdma_mummy_sys::rdma_disconnect(self.ptr()) };
    }

    /// The queue pair attributes rdma_cm gives for moving to `state`, and their mask.
    fn qp_attr(&self, state: QueuePairState) -> Result<(rdma_mummy_sys::ibv_qp_attr, i32), BackendError> {
        // SAFETY: all zero bytes are a valid `ibv_qp_attr` (integers, and structures and
        // unions of integers).
        let mut attr: rdma_mummy_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state as _;
        let mut mask = 0;
        // SAFETY: the identifier is alive; the call fills `attr` and `mask`.
        cm_result("rdma_init_qp_attr", unsafe {
            rdma_mummy_sys::rdma_init_qp_attr(self.ptr(), &mut attr, &mut mask)
        })?;
        Ok((attr, mask))
    }

    /// The device rdma_cm bound the identifier to, opened through sideway (one context per
    /// device for the process; queue pairs are found by number on the device, so a context
    /// other than librdmacm's own serves).
    fn device_context(&self) -> Result<Arc<DeviceContext>, BackendError> {
        // SAFETY: the identifier is alive; `verbs` is librdmacm's context for its device
        // once bound (null before), and the device's name is a C string it owns.
        let name = unsafe {
            let verbs = (*self.ptr()).verbs;
            if verbs.is_null() {
                return Err(BackendError::Verbs("rdma_cm bound no device".into()));
            }
            let name = rdma_mummy_sys::ibv_get_device_name((*verbs).device);
            if name.is_null() {
                return Err(BackendError::Verbs("rdma_cm's device has no name".into()));
            }
            std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned()
        };
        context_named(&name)
    }
}

/// The device `name`, opened through sideway once for the process.
fn context_named(name: &str) -> Result<Arc<DeviceContext>, BackendError> {
    static CONTEXTS: Mutex<Vec<(String, Arc<DeviceContext>)>> = Mutex::new(Vec::new());
    let mut contexts = lock(&CONTEXTS);
    if let Some((_, ctx)) = contexts.iter().find(|(n, _)| *n == name) {
        return Ok(ctx.clone());
    }
    let list = DeviceList::new().map_err(|e| verbs_error("ibv_get_device_list", e))?;
    let dev = list
        .iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| BackendError::Verbs(format!("device {name} is not listed")))?;
    let ctx = dev.open().map_err(|e| verbs_error("ibv_open_device", e))?;
    contexts.push((name.to_owned(), ctx.clone()));
    Ok(ctx)
}

/// Waits for an event of type `want` on `channel`.
fn expect_event(channel: &Arc<CmChannel>, want: EventType, deadline: Instant) -> Result<(), BackendError> {
    let event = channel.next_event(deadline)?;
    if event.ty == want {
        Ok(())
    } else {
        Err(BackendError::Connect(format!(
            "rdma_cm: {:?} (status {}) where {want:?} was expected",
            event.ty, event.status
        )))
    }
}

/// A queue pair with its completion queue and protection domain, made on the identifier's
/// device and moved to INIT (and to RTS, off iWARP, where rdma_cm's caller does that).
struct Parts {
    qp: Qp,
    cq: Arc<BasicCompletionQueue>,
    cq_channel: Arc<CompletionChannel>,
    pd: Arc<ProtectionDomain>,
    iwarp: bool,
    // The device has memory windows: regions are registered with the right to bind them.
    mw: bool,
    early: Option<Arc<dyn Region>>,
}

fn make_parts(id: &CmId, opts: &EndpointOptions, iwarp: bool, mw: bool) -> Result<Parts, BackendError> {
    let ctx = id.device_context()?;
    let srq = match &opts.srq {
        Some(srq) => {
            let srq = own::<VerbsSrq>(
                srq.as_any(),
                "a shared receive queue of another backend (create it on this one)",
            )?;
            if !Arc::ptr_eq(&srq.inner.ctx, &ctx) {
                return Err(BackendError::Verbs(format!(
                    "the shared receive queue is on {}, the connection on another device",
                    srq.inner.device
                )));
            }
            if opts.early_recvs.0 > 0 {
                return Err(BackendError::Unsupported(
                    "early receives on an endpoint with a shared receive queue (post them to the queue)",
                ));
            }
            Some(srq.inner.clone())
        }
        None => None,
    };
    let pd = match &srq {
        Some(srq) => srq.pd.clone(),
        None => ctx.alloc_pd().map_err(|e| verbs_error("ibv_alloc_pd", e))?,
    };
    // Each completion queue has a completion channel of its own, for `wait_notification`;
    // non-blocking, so that a wait is bounded by poll(2) on its descriptor.
    let cq_channel = CompletionChannel::new(&ctx).map_err(|e| verbs_error("ibv_create_comp_channel", e))?;
    cq_channel.set_nonblocking(true).map_err(|e| verbs_error("completion channel", e))?;
    let cq = ctx
        .create_cq_builder()
        .setup_cqe(2 * opts.queue_depth)
        .setup_comp_channel(&cq_channel, 0)
        .build()
        .map_err(|e| verbs_error("ibv_create_cq", e))?;
    let mut qp = match srq {
        Some(srq) => Qp::Shared(SrqQp::new(&cq, srq, opts.queue_depth)?),
        None => Qp::Own(
            pd.create_qp_builder()
                .setup_qp_type(QueuePairType::ReliableConnection)
                .setup_max_send_wr(opts.queue_depth)
                .setup_max_recv_wr(opts.queue_depth)
                .setup_max_send_sge(1)
                .setup_max_recv_sge(1)
                .setup_send_cq(cq.clone())
                .setup_recv_cq(cq.clone())
                .build()
                .map_err(|e| verbs_error("ibv_create_qp", e))?,
        ),
    };
    qp.modify(id.qp_attr(QueuePairState::Init)?, "ibv_modify_qp(INIT)")?;
    let (count, len) = opts.early_recvs;
    let early = if count > 0 {
        let region = register_region(&pd, count as usize * len as usize, Access::NONE, false)?;
        for i in 0..count {
            qp.post_recv(u64::from(i), region.local(i as usize * len as usize, len))?;
        }
        Some(Arc::new(region) as Arc<dyn Region>)
    } else {
        None
    };
    Ok(Parts { qp, cq, cq_channel, pd, iwarp, mw, early })
}

/// Off iWARP, the application moves its own queue pair to RTR and RTS (on iWARP the kernel's
/// connection manager does, when the connection is up).
fn to_rts(id: &CmId, parts: &mut Parts) -> Result<(), BackendError> {
    if parts.iwarp {
        return Ok(());
    }
    for state in [QueuePairState::ReadyToReceive, QueuePairState::ReadyToSend] {
        parts.qp.modify(id.qp_attr(state)?, "ibv_modify_qp")?;
    }
    Ok(())
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
        let channel = CmChannel::new()?;
        let id = channel.create_id()?;
        id.bind_addr(addr)?;
        id.listen(16)?;
        Ok(Box::new(VerbsListener {
            addr,
            shared: Arc::new(ListenShared {
                channel,
                _id: id,
                down: Mutex::default(),
                iwarp: self.info.transport == DeviceTransport::Iwarp,
                mw: self.info.caps.memory_windows,
                queued: Mutex::default(),
            }),
        }))
    }

    fn connect(&self, addr: SocketAddr, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        let deadline = crate::deadline::saturating(opts.timeout);
        let channel = CmChannel::new()?;
        let id = channel.create_id()?;
        id.resolve_addr(addr, opts.timeout)?;
        expect_event(&channel, EventType::AddressResolved, deadline)?;
        id.resolve_route(opts.timeout)?;
        expect_event(&channel, EventType::RouteResolved, deadline)?;
        let mut parts = make_parts(
            &id,
            opts,
            self.info.transport == DeviceTransport::Iwarp,
            self.info.caps.memory_windows,
        )?;
        id.connect(&parts.qp, opts)?;
        // The reply's private data comes with the connect response (InfiniBand and RoCE,
        // where the caller moves its own queue pair on) or with the establishment (iWARP).
        let event = channel.next_event(deadline)?;
        match event.ty {
            EventType::Established => {}
            EventType::ConnectResponse => {
                to_rts(&id, &mut parts)?;
                id.establish()?;
            }
            EventType::Rejected => return Err(BackendError::Rejected { private_data: event.private_data }),
            other => {
                return Err(BackendError::Connect(format!("rdma_cm: {other:?} (status {})", event.status)));
            }
        }
        Ok(Box::new(VerbsEndpoint::new(parts, id, Events::Own(channel), event.private_data)))
    }

    fn create_srq(&self, depth: u32) -> Result<Arc<dyn SharedRecvQueue>, BackendError> {
        if !self.info.caps.srq {
            return Err(BackendError::Unsupported("shared receive queues (the device reports max_srq 0)"));
        }
        let ctx = context_named(&self.info.name)?;
        let pd = ctx.alloc_pd().map_err(|e| verbs_error("ibv_alloc_pd", e))?;
        let mut init = rdma_mummy_sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: rdma_mummy_sys::ibv_srq_attr { max_wr: depth, max_sge: 1, srq_limit: 0 },
        };
        // SAFETY: the domain is alive (the queue holds it, `SrqInner::pd`); the call reads
        // `init` and writes its `attr`; a null result is handled.
        let raw = unsafe { rdma_mummy_sys::ibv_create_srq(pd.pd().as_ptr(), &mut init) };
        let raw = NonNull::new(raw)
            .ok_or_else(|| verbs_error("ibv_create_srq", std::io::Error::last_os_error()))?;
        Ok(Arc::new(VerbsSrq {
            inner: Arc::new(SrqInner { raw, pd, ctx, device: self.info.name.clone(), post: Mutex::new(()) }),
        }))
    }
}

struct ListenShared {
    // Dropped after the identifiers made on it: they hold it too.
    channel: Arc<CmChannel>,
    _id: Arc<CmId>,
    iwarp: bool,
    mw: bool,
    // Requests (with their private data) that arrived while an accept waited for its
    // connection to come up.
    queued: Mutex<VecDeque<(Arc<CmId>, Vec<u8>)>>,
    // The identifiers (as addresses) of accepted connections whose peer disconnected
    // (their endpoints move their queue pairs to the error state when they next look).
    down: Mutex<Vec<usize>>,
}

impl ListenShared {
    /// Keeps what an event on the listener's channel says for whoever it concerns: a request
    /// for the next `next_request`, a disconnect for its endpoint.
    fn keep(&self, event: Event) {
        match (event.ty, event.new_id) {
            (EventType::ConnectRequest, Some(id)) => lock(&self.queued).push_back((id, event.private_data)),
            (EventType::Disconnected, _) => lock(&self.down).push(event.id),
            _ => {}
        }
    }

    /// Reads what the listener's channel has without waiting.
    fn drain(&self) {
        while let Some(event) = self.channel.try_event() {
            self.keep(event);
        }
    }

    fn request(self: &Arc<Self>) -> Option<Box<dyn PendingRequest>> {
        let (id, private_data) = lock(&self.queued).pop_front()?;
        Some(Box::new(VerbsRequest { id, private_data, shared: self.clone() }))
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
        let deadline = crate::deadline::saturating(timeout);
        loop {
            if let Some(request) = self.shared.request() {
                return Ok(request);
            }
            let event = self.shared.channel.next_event(deadline)?;
            self.shared.keep(event);
        }
    }
}

struct VerbsRequest {
    id: Arc<CmId>,
    private_data: Vec<u8>,
    shared: Arc<ListenShared>,
}

impl PendingRequest for VerbsRequest {
    fn private_data(&self) -> Vec<u8> {
        self.private_data.clone()
    }

    fn accept(self: Box<Self>, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError> {
        let deadline = crate::deadline::saturating(opts.timeout);
        let mut parts = make_parts(&self.id, opts, self.shared.iwarp, self.shared.mw)?;
        to_rts(&self.id, &mut parts)?;
        self.id.accept(&parts.qp, opts)?;
        let own = self.id.ptr() as usize;
        loop {
            let event = self.shared.channel.next_event(deadline)?;
            match event.ty {
                EventType::Established if event.id == own => break,
                EventType::ConnectError | EventType::Rejected | EventType::Unreachable if event.id == own => {
                    return Err(BackendError::Connect(format!(
                        "rdma_cm: {:?} (status {})",
                        event.ty, event.status
                    )));
                }
                _ => self.shared.keep(event),
            }
        }
        Ok(Box::new(VerbsEndpoint::new(parts, self.id, Events::Listener(self.shared), self.private_data)))
    }

    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), BackendError> {
        // The identifier is destroyed after the reject (when `self` drops).
        self.id.reject(private_data)
    }
}

/// Where an endpoint's rdma_cm events arrive.
enum Events {
    /// Its own channel (the initiator's).
    Own(Arc<CmChannel>),
    /// The listener's channel, shared with the listener and its other connections.
    Listener(Arc<ListenShared>),
}

struct VerbsEndpoint {
    // Dropped in this order: the queue pair before its completion queue and domain, the
    // identifier before its channel.
    qp: Mutex<Qp>,
    cq: Arc<BasicCompletionQueue>,
    // After the queue: a completion channel outlives the queues attached to it.
    cq_channel: Arc<CompletionChannel>,
    pd: Arc<ProtectionDomain>,
    id: Arc<CmId>,
    events: Events,
    // What the peer's request or reply carried.
    peer_data: Vec<u8>,
    // The peer disconnected and the queue pair was moved to the error state.
    down: AtomicBool,
    pending: Mutex<VecDeque<Completion>>,
    early: Option<Arc<dyn Region>>,
    // The device has memory windows (regions get the right to bind them).
    mw: bool,
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
                while let Some(event) = channel.try_event() {
                    seen |= event.ty == EventType::Disconnected;
                }
                seen
            }
            Events::Listener(shared) => {
                shared.drain();
                let mut down = lock(&shared.down);
                let before = down.len();
                let own = self.id.ptr() as usize;
                down.retain(|&id| id != own);
                down.len() != before
            }
        };
        if disconnected {
            self.to_error();
        }
    }

    fn to_error(&self) {
        self.down.store(true, Ordering::Relaxed);
        // SAFETY: all zero bytes are a valid `ibv_qp_attr` (as in `CmId::qp_attr`).
        let mut attr: rdma_mummy_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = rdma_mummy_sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = rdma_mummy_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        let _ = lock(&self.qp).modify((attr, mask), "ibv_modify_qp(ERR)");
    }

    fn new(parts: Parts, id: Arc<CmId>, events: Events, peer_data: Vec<u8>) -> VerbsEndpoint {
        VerbsEndpoint {
            qp: Mutex::new(parts.qp),
            cq: parts.cq,
            cq_channel: parts.cq_channel,
            pd: parts.pd,
            id,
            events,
            peer_data,
            down: AtomicBool::new(false),
            pending: Mutex::default(),
            early: parts.early,
            mw: parts.mw,
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
        5 => CompletionOp::Bind,
        6 => CompletionOp::LocalInvalidate,
        _ => CompletionOp::Other,
    }
}

// Verbs' `IBV_WC_WITH_IMM` in a completion's `wc_flags`: `imm_data` holds the immediate data.
const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// The completions a batch from `ibv_poll_cq` holds at most (as many as sideway's poller took).
const POLL_BATCH: usize = 32;

impl VerbsEndpoint {
    /// Reads what the completion queue has (one batch) into `out`, through `ibv_poll_cq`
    /// itself rather than sideway's poller, whose completions carry no `wc_flags` (without
    /// them the immediate data of a Send with immediate is not known). False when the
    /// device failed the poll.
    fn poll_batch(&self, out: &mut VecDeque<Completion>) -> bool {
        // SAFETY: `ibv_wc` is plain integers and a union of two 32-bit integers, for which
        // all zero bytes are a valid value.
        let mut wcs: [rdma_mummy_sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        let room = i32::try_from(wcs.len()).unwrap_or(1);
        // SAFETY: the queue is alive (`self.cq` holds it) and `wcs` has room for the
        // `room` completions the call may write; polling from several threads is
        // serialized by the `pending` lock our caller holds.
        let n = unsafe { rdma_mummy_sys::ibv_poll_cq(self.cq.cq().as_ptr(), room, wcs.as_mut_ptr()) };
        let Ok(n) = usize::try_from(n) else {
            return false;
        };
        out.extend(wcs[..n.min(POLL_BATCH)].iter().map(|wc| Completion {
            wr_id: wc.wr_id,
            status: completion_status(wc.status),
            op: completion_op(wc.opcode),
            byte_len: wc.byte_len,
            imm: (wc.wc_flags & IBV_WC_WITH_IMM != 0).then(|| {
                // SAFETY: both members of the union are 32-bit integers; with
                // `IBV_WC_WITH_IMM` set it holds the immediate data, in network order.
                u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
            }),
        }));
        true
    }
}

impl Endpoint for VerbsEndpoint {
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        Ok(Arc::new(register_region(&self.pd, len, access, self.mw)?))
    }

    fn register_buffer(&self, buffer: Vec<u8>, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        if buffer.is_empty() {
            return Err(BackendError::Unsupported("registering an empty buffer"));
        }
        Ok(Arc::new(register_boxed(&self.pd, buffer.into_boxed_slice(), access, self.mw)?))
    }

    fn peer_private_data(&self) -> Vec<u8> {
        self.peer_data.clone()
    }

    fn early_recv_region(&self) -> Option<Arc<dyn Region>> {
        self.early.clone()
    }

    fn post_send(&self, wr_id: u64, op: Op, local: Option<Local>) -> Result<(), BackendError> {
        // Through `ibv_post_send` itself for every queue pair and operation: sideway's posting
        // has no local invalidate and serves no queue pair made with a shared receive queue.
        raw_post_send(&lock(&self.qp), wr_id, op, local)
    }

    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        lock(&self.qp).post_recv(wr_id, local)
    }

    fn poll(&self, timeout: Duration) -> Option<Completion> {
        let deadline = crate::deadline::saturating(timeout);
        let mut pending = lock(&self.pending);
        loop {
            if let Some(done) = pending.pop_front() {
                return Some(done);
            }
            // A poll reads a batch of completions at once: keep all of them.
            if !self.poll_batch(&mut pending) {
                return None;
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

    fn wait_notification(&self, timeout: Duration) -> Result<bool, BackendError> {
        let deadline = crate::deadline::saturating(timeout);
        // SAFETY: the queue is alive (`self.cq` holds it); arming it asks its provider for
        // one event on its channel at the next completion.
        let armed = unsafe { rdma_mummy_sys::ibv_req_notify_cq(self.cq.cq().as_ptr(), 0) };
        if armed != 0 {
            return Err(verbs_error("ibv_req_notify_cq", std::io::Error::from_raw_os_error(armed)));
        }
        loop {
            let mut cq = std::ptr::null_mut();
            let mut context = std::ptr::null_mut();
            // SAFETY: the channel is alive (`self.cq_channel` holds it) and non-blocking, so
            // the call returns at once; it writes the two out-pointers only on success.
            let got = unsafe {
                rdma_mummy_sys::ibv_get_cq_event(
                    self.cq_channel.comp_channel().as_ptr(),
                    &mut cq,
                    &mut context,
                )
            };
            if got == 0 {
                // SAFETY: `cq` is the queue the event is for (this channel serves only
                // `self.cq`, which is alive); every event is acknowledged once, here, so
                // destroying the queue later does not wait for an unacknowledged one.
                unsafe { rdma_mummy_sys::ibv_ack_cq_events(cq, 1) };
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            wait_readable(self.cq_channel.as_raw_fd(), left);
        }
    }

    fn disconnect(&self) {
        self.id.disconnect();
        // Without rdma_create_qp, rdma_disconnect leaves the queue pair alone: move it to
        // the error state so that what is outstanding completes flushed.
        self.to_error();
    }

    fn alloc_mw(&self) -> Result<Arc<dyn Window>, BackendError> {
        if !self.mw {
            return Err(BackendError::Unsupported("memory windows (the device reports max_mw 0)"));
        }
        // SAFETY: the domain is alive (the window holds it); `ibv_alloc_mw` calls the
        // provider through the domain's context, and a null result is handled.
        let raw = unsafe {
            rdma_mummy_sys::ibv_alloc_mw(self.pd.pd().as_ptr(), rdma_mummy_sys::ibv_mw_type::IBV_MW_TYPE_2)
        };
        let raw =
            NonNull::new(raw).ok_or_else(|| verbs_error("ibv_alloc_mw", std::io::Error::last_os_error()))?;
        // SAFETY: the window was just made; `rkey` is a plain field the provider set.
        let rkey = unsafe { (*raw.as_ptr()).rkey };
        Ok(Arc::new(VerbsWindow { raw, rkey: AtomicU32::new(rkey), _pd: self.pd.clone() }))
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
        let window = own::<VerbsWindow>(window.as_any(), "a memory window of another backend")?;
        let region = own::<VerbsRegion>(region.as_any(), "a region of another backend")?;
        let mr = region.mr.as_ref().ok_or(BackendError::Verbs("the region is not registered".into()))?;
        if offset.checked_add(len).is_none_or(|end| end > region.len as u64) {
            return Err(BackendError::OutOfBounds);
        }
        // The next key, as `ibv_inc_rkey` picks it (its low 8 bits, wrapping).
        let old = window.rkey();
        let rkey = (old & !0xff) | (old.wrapping_add(1) & 0xff);
        // SAFETY: all zero bytes are a valid `ibv_send_wr` (as in `raw_post_send`).
        let mut wr: rdma_mummy_sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = rdma_mummy_sys::ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.send_flags = rdma_mummy_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.bind_mw_tso_union = rdma_mummy_sys::bind_mw_tso_union_t {
            bind_mw: rdma_mummy_sys::bind_mw_t {
                mw: window.raw.as_ptr(),
                rkey,
                bind_info: rdma_mummy_sys::ibv_mw_bind_info {
                    // SAFETY: the pointer is used for this call only, while `region` (which
                    // holds the registration) is borrowed.
                    mr: unsafe { mr.mr() }.as_ptr(),
                    addr: region.addr() + offset,
                    length: len,
                    mw_access_flags: access_flags(access).bits() as u32,
                },
            },
        };
        // The window and region are alive (held by `window` and `region`) through the post;
        // the device checks the range and rights against the region.
        post_wr(&lock(&self.qp), &mut wr, "ibv_post_send(BIND_MW)")?;
        window.rkey.store(rkey, Ordering::Relaxed);
        Ok(rkey)
    }
}

/// A type 2 memory window made by `ibv_alloc_mw` (sideway has none).
struct VerbsWindow {
    raw: NonNull<rdma_mummy_sys::ibv_mw>,
    // Its key as of the last bind posted (the application tracks a type 2 window's key).
    rkey: AtomicU32,
    // Deallocated before its domain.
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs' calls on a window are safe from any thread; it is deallocated once.
unsafe impl Send for VerbsWindow {}
// SAFETY: as above.
unsafe impl Sync for VerbsWindow {}

impl Drop for VerbsWindow {
    fn drop(&mut self) {
        // SAFETY: the window is ours and deallocated once, before its domain (`_pd`).
        unsafe { rdma_mummy_sys::ibv_dealloc_mw(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for VerbsWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsWindow").field("rkey", &self.rkey()).finish()
    }
}

impl Window for VerbsWindow {
    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Relaxed)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A queue pair: sideway's, with a receive queue of its own, or one that takes its receives
/// from a shared receive queue.
enum Qp {
    Own(BasicQueuePair),
    Shared(SrqQp),
}

impl Qp {
    fn raw(&self) -> *mut rdma_mummy_sys::ibv_qp {
        match self {
            // SAFETY: the pointer is only used while `self` (which owns the queue pair) lives.
            Qp::Own(qp) => unsafe { qp.qp() }.as_ptr(),
            Qp::Shared(qp) => qp.raw.as_ptr(),
        }
    }

    fn qp_number(&self) -> u32 {
        // SAFETY: the queue pair is alive (`self` owns it); `qp_num` is a plain field.
        unsafe { (*self.raw()).qp_num }
    }

    fn uses_srq(&self) -> bool {
        matches!(self, Qp::Shared(_))
    }

    /// `ibv_modify_qp` with attributes and their mask (from rdma_cm, or a state alone).
    fn modify(
        &mut self,
        (mut attr, mask): (rdma_mummy_sys::ibv_qp_attr, i32),
        what: &str,
    ) -> Result<(), BackendError> {
        // SAFETY: the queue pair is alive and ours (`&mut self`); the call reads `attr`, the
        // fields `mask` names.
        let ret = unsafe { rdma_mummy_sys::ibv_modify_qp(self.raw(), &mut attr, mask) };
        if ret == 0 { Ok(()) } else { Err(verbs_error(what, std::io::Error::from_raw_os_error(ret))) }
    }

    fn post_recv(&mut self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        let Qp::Own(qp) = self else {
            return Err(BackendError::Unsupported(SRQ_POST_RECV));
        };
        let mut guard = qp.start_post_recv();
        let wr = guard.construct_wr(wr_id);
        // SAFETY: as in `post_send`: the device checks the buffer against the lkey's region.
        unsafe { wr.setup_sge(local.lkey, local.addr, local.len) };
        guard.post().map_err(|e| verbs_error("ibv_post_recv", e))
    }
}

/// A queue pair made by `ibv_create_qp` itself, with a shared receive queue (sideway's
/// builder passes none). Destroyed before the queues and domain it holds.
struct SrqQp {
    raw: NonNull<rdma_mummy_sys::ibv_qp>,
    _cq: Arc<BasicCompletionQueue>,
    _srq: Arc<SrqInner>,
}

// SAFETY: libibverbs' calls on a queue pair are safe from any thread; the endpoint serializes
// its posts (its `qp` lock) and the queue pair is destroyed once.
unsafe impl Send for SrqQp {}

impl Drop for SrqQp {
    fn drop(&mut self) {
        // SAFETY: the queue pair is ours, destroyed once, before the completion queue and
        // shared receive queue it names (held by this structure's fields, dropped after).
        unsafe { rdma_mummy_sys::ibv_destroy_qp(self.raw.as_ptr()) };
    }
}

impl SrqQp {
    /// A reliable-connection queue pair in the shared receive queue's domain, sending and
    /// receiving on `cq`, with `depth` send work requests and its receives from `srq`.
    fn new(cq: &Arc<BasicCompletionQueue>, srq: Arc<SrqInner>, depth: u32) -> Result<SrqQp, BackendError> {
        // SAFETY: the pointer is used while `cq` lives (the queue pair holds it).
        let cq_raw = unsafe { cq.cq() }.as_ptr();
        let mut init = rdma_mummy_sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq_raw,
            recv_cq: cq_raw,
            srq: srq.raw.as_ptr(),
            cap: rdma_mummy_sys::ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 0,
                max_inline_data: 0,
            },
            qp_type: rdma_mummy_sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the domain, completion queue and shared receive queue named are alive (the
        // new queue pair holds the last two, and the shared receive queue its domain); the
        // call reads `init` and writes its `cap` member; a null result is handled.
        let raw = unsafe { rdma_mummy_sys::ibv_create_qp(srq.pd.pd().as_ptr(), &mut init) };
        let raw =
            NonNull::new(raw).ok_or_else(|| verbs_error("ibv_create_qp", std::io::Error::last_os_error()))?;
        Ok(SrqQp { raw, _cq: cq.clone(), _srq: srq })
    }
}

/// Posts a signaled work request through `ibv_post_send` itself.
fn raw_post_send(qp: &Qp, wr_id: u64, op: Op, local: Option<Local>) -> Result<(), BackendError> {
    use rdma_mummy_sys::ibv_wr_opcode as o;
    let mut sge = local.map(|l| rdma_mummy_sys::ibv_sge { addr: l.addr, length: l.len, lkey: l.lkey });
    // SAFETY: all zero bytes are a valid `ibv_send_wr` (integers, null pointers, and
    // unions of those).
    let mut wr: rdma_mummy_sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.send_flags = rdma_mummy_sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    if let Some(sge) = &mut sge {
        wr.sg_list = sge;
        wr.num_sge = 1;
    }
    let rdma = |rkey, addr| rdma_mummy_sys::wr_t { rdma: rdma_mummy_sys::rdma_t { remote_addr: addr, rkey } };
    let imm = |imm: u32| rdma_mummy_sys::imm_data_invalidated_rkey_union_t { imm_data: imm.to_be() };
    match op {
        Op::Send => wr.opcode = o::IBV_WR_SEND,
        Op::SendImm(value) => {
            wr.opcode = o::IBV_WR_SEND_WITH_IMM;
            wr.imm_data_invalidated_rkey_union = imm(value);
        }
        Op::Write { rkey, addr } => {
            wr.opcode = o::IBV_WR_RDMA_WRITE;
            wr.wr = rdma(rkey, addr);
        }
        Op::WriteImm { rkey, addr, imm: value } => {
            wr.opcode = o::IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.wr = rdma(rkey, addr);
            wr.imm_data_invalidated_rkey_union = imm(value);
        }
        Op::Read { rkey, addr } => {
            wr.opcode = o::IBV_WR_RDMA_READ;
            wr.wr = rdma(rkey, addr);
        }
        Op::FetchAdd { rkey, addr, add } => {
            wr.opcode = o::IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr = rdma_mummy_sys::wr_t {
                atomic: rdma_mummy_sys::atomic_t { remote_addr: addr, compare_add: add, swap: 0, rkey },
            };
        }
        Op::CompareSwap { rkey, addr, compare, swap } => {
            wr.opcode = o::IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr = rdma_mummy_sys::wr_t {
                atomic: rdma_mummy_sys::atomic_t { remote_addr: addr, compare_add: compare, swap, rkey },
            };
        }
        Op::LocalInvalidate { rkey } => {
            wr.opcode = o::IBV_WR_LOCAL_INV;
            wr.imm_data_invalidated_rkey_union =
                rdma_mummy_sys::imm_data_invalidated_rkey_union_t { invalidated_rkey: rkey };
        }
    }
    // The entry names the application's buffer in one of its registered regions; the device
    // checks it against the lkey's region, and a wrong one fails the work request, not
    // memory safety.
    post_wr(qp, &mut wr, "ibv_post_send")
}

/// Posts `wr` (and what it points to, alive through the call) on `qp`, held locked by the
/// caller (the endpoint's queue-pair lock).
fn post_wr(qp: &Qp, wr: &mut rdma_mummy_sys::ibv_send_wr, what: &str) -> Result<(), BackendError> {
    let mut bad = std::ptr::null_mut();
    // SAFETY: the queue pair is alive and posted to by one caller at a time (its lock is
    // held); `wr` and what it points to live through the call, which copies them.
    let ret = unsafe { rdma_mummy_sys::ibv_post_send(qp.raw(), wr, &mut bad) };
    if ret == 0 { Ok(()) } else { Err(verbs_error(what, std::io::Error::from_raw_os_error(ret))) }
}

/// A shared receive queue made by `ibv_create_srq`, in a protection domain of its own.
struct SrqInner {
    raw: NonNull<rdma_mummy_sys::ibv_srq>,
    pd: Arc<ProtectionDomain>,
    ctx: Arc<DeviceContext>,
    device: String,
    // Posts are serialized (a provider's post_srq_recv may expect one caller at a time).
    post: Mutex<()>,
}

// SAFETY: libibverbs' calls on a shared receive queue are safe from any thread (posts are
// serialized by `post`); it is destroyed once, when the last holder drops it.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: the queue is ours and destroyed once; every queue pair made with it holds
        // it (`SrqQp::_srq`), so none is left. Its domain (`pd`) is dropped after it.
        unsafe { rdma_mummy_sys::ibv_destroy_srq(self.raw.as_ptr()) };
    }
}

/// The verbs backend's shared receive queue.
#[derive(Clone)]
struct VerbsSrq {
    inner: Arc<SrqInner>,
}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSrq").field("device", &self.inner.device).finish_non_exhaustive()
    }
}

impl SharedRecvQueue for VerbsSrq {
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError> {
        Ok(Arc::new(register_region(&self.inner.pd, len, access, false)?))
    }

    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError> {
        let _serial = lock(&self.inner.post);
        let mut sge = rdma_mummy_sys::ibv_sge { addr: local.addr, length: local.len, lkey: local.lkey };
        let mut wr =
            rdma_mummy_sys::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the queue is alive (`self` holds it); `wr` and its entry live through the
        // call, which copies them. As in `post_send`, the device checks the buffer against
        // the lkey's region.
        let ret = unsafe { rdma_mummy_sys::ibv_post_srq_recv(self.inner.raw.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(verbs_error("ibv_post_srq_recv", std::io::Error::from_raw_os_error(ret)))
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Registers `len` zeroed bytes of memory the region owns, with the right to bind memory
/// windows to it when `mw_bind`.
fn register_region(
    pd: &Arc<ProtectionDomain>,
    len: usize,
    access: Access,
    mw_bind: bool,
) -> Result<VerbsRegion, BackendError> {
    let mut region = register_boxed(pd, vec![0u8; len.max(1)].into_boxed_slice(), access, mw_bind)?;
    region.len = len;
    Ok(region)
}

/// Registers `buffer` in place (the region owns it from now on), with the right to bind memory
/// windows to it when `mw_bind`.
fn register_boxed(
    pd: &Arc<ProtectionDomain>,
    buffer: Box<[u8]>,
    access: Access,
    mw_bind: bool,
) -> Result<VerbsRegion, BackendError> {
    let len = buffer.len();
    let ptr = Box::into_raw(buffer);
    // The allocation is `len.max(1)` bytes long from here on (`VerbsRegion::take_allocation`):
    // `len` is at least 1 here, and `register_region` shortens `len` only for its 0.
    let mut region = VerbsRegion { mr: None, ptr: ptr.cast::<u8>(), len };
    // SAFETY: `ptr` is a live allocation of at least `len` bytes that the region owns and
    // frees only after it has deregistered it (`VerbsRegion::drop`), and every access of
    // ours to it goes through raw copies, never through references the device's writes
    // could invalidate.
    let mut flags = access_flags(access);
    if mw_bind {
        flags |= AccessFlags::MemoryWindowBind;
    }
    // SAFETY: as above.
    let mr = unsafe { pd.reg_mr(region.ptr as usize, len.max(1), flags) }
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

impl VerbsRegion {
    /// Deregisters the region and takes its allocation back (`None` once taken).
    fn take_allocation(&mut self) -> Option<Box<[u8]>> {
        self.mr = None;
        if self.ptr.is_null() {
            return None;
        }
        let ptr = std::mem::replace(&mut self.ptr, std::ptr::null_mut());
        // SAFETY: `ptr` came from `Box::into_raw` of a slice of `len.max(1)` bytes
        // (`register_boxed`), is taken once (nulled above), and after the deregistration above
        // the device no longer reads or writes it.
        Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, self.len.max(1))) })
    }
}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        drop(self.take_allocation());
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

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_buffer(self: Arc<Self>) -> Option<Vec<u8>> {
        let mut region = Arc::try_unwrap(self).ok()?;
        let mut buffer = region.take_allocation()?.into_vec();
        buffer.truncate(region.len);
        Some(buffer)
    }
}
