//! librdmacm: event channels, ids, address and route resolution, connect, listen, accept,
//! reject, disconnect, and the helpers around them (`rdma_getaddrinfo`, `rdma_create_ep`,
//! ...). The functions are exported as `iwarp_<name>@IWARP_PRIVATE_1`; librdmacm.so.1
//! forwards each rdma_cm symbol to its counterpart here, so that the connection manager
//! lives in the same library as the engine it drives.
//!
//! How the rdma_cm model maps onto [`iwarp::Device`]'s connection manager:
//!
//! - Address and route resolution need no network exchange over TCP/IP: they record the
//!   addresses and queue `ADDR_RESOLVED` / `ROUTE_RESOLVED` at once.
//! - `rdma_listen` starts a thread that accepts MPA Requests ([`iwarp::Listener::accept`]);
//!   each becomes a new id and a `CONNECT_REQUEST` event (private data and the initiator's
//!   IRD/ORD in `param.conn`).
//! - `rdma_connect` runs [`iwarp::Device::connect`] (TCP, MPA Request and Reply) on a thread
//!   of its own and queues `ESTABLISHED`, or `REJECTED` / `UNREACHABLE` / `CONNECT_ERROR`.
//!   `rdma_accept` sends the Reply and starts the queue pair at once, then queues
//!   `ESTABLISHED`. The receives posted before either are posted before the connection goes
//!   live.
//! - A connection that leaves RTS (either side's `rdma_disconnect`, the peer's close, a
//!   Terminate) queues `DISCONNECTED` once, always after the connection's `ESTABLISHED`
//!   (even when the peer closed it first); `rdma_disconnect` flushes the posted work
//!   (`IBV_WC_WR_FLUSH_ERR`, with a completion event if the queue was armed).
//! - An id made with a NULL channel is synchronous (`rdma_create_ep`, rsockets): it has a
//!   private channel, and each call that would queue an event waits for it and returns its
//!   outcome instead.

pub mod addr;
pub mod stubs;

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp::{CmError, ConnectRequest};

use crate::context::MAX_RD_ATOM;
use crate::cq::{ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq};
use crate::device::cm_context;
use crate::events::{EventQueue, read_record};
use crate::ffi::{
    AddrMap, CStruct, Registry, Result, ZeroedC, cstr, minus1_call, ptr_call, set_errno, zeroed,
};
use crate::qp::{self, Qp};
use crate::runtime::{self, ConnSettings};
use crate::sys::*;
use crate::verbs::{PDS, ibv_alloc_pd};

pub use addr::{iwarp_rdma_freeaddrinfo, iwarp_rdma_getaddrinfo};

// SAFETY: repr(C) structures of integers, raw pointers and unions of socket addresses.
unsafe impl ZeroedC for rdma_cm_id {}
// SAFETY: as above.
unsafe impl ZeroedC for rdma_cm_event {}
// SAFETY: as above.
unsafe impl ZeroedC for rdma_event_channel {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_qp_init_attr {}

/// An event channel.
pub struct EventChannel {
    c: CStruct<rdma_event_channel>,
    queue: EventQueue,
    /// Events queued and not yet read, by the number of their record.
    queued: Mutex<AddrMap<u64, Arc<Event>>>,
}

static CHANNELS: Registry<EventChannel> = Registry::new();
static NEXT_EVENT: AtomicU64 = AtomicU64::new(1);

impl EventChannel {
    fn new() -> Result<Arc<EventChannel>> {
        let queue = EventQueue::new()?;
        let mut c: rdma_event_channel = zeroed();
        c.fd = queue.fd();
        let ch = Arc::new(EventChannel {
            c: CStruct::new(c),
            queue,
            queued: Mutex::new(AddrMap::with_hasher(Default::default())),
        });
        DESTROYED_CHANNELS.lock().unwrap_or_else(PoisonError::into_inner).remove(&(ch.c.ptr() as usize));
        Ok(ch)
    }

    fn queue(&self, event: Arc<Event>) {
        let n = NEXT_EVENT.fetch_add(1, Ordering::Relaxed);
        self.queued.lock().unwrap_or_else(PoisonError::into_inner).insert(n, event);
        if !self.queue.post(n) {
            self.queued.lock().unwrap_or_else(PoisonError::into_inner).remove(&n);
        }
    }

    fn take(&self, n: u64) -> Option<Arc<Event>> {
        self.queued.lock().unwrap_or_else(PoisonError::into_inner).remove(&n)
    }

    /// Takes the queued events `pick` chooses, in the order they were queued.
    fn take_queued(&self, pick: impl Fn(&Event) -> bool) -> Vec<Arc<Event>> {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        let mut mine: Vec<u64> = queued.iter().filter(|(_, ev)| pick(ev)).map(|(n, _)| *n).collect();
        mine.sort_unstable();
        mine.into_iter().filter_map(|n| queued.remove(&n)).collect()
    }
}

/// An event handed to the application (until `rdma_ack_cm_event`).
pub struct Event {
    c: CStruct<rdma_cm_event>,
    /// What `param.conn.private_data` points to.
    _private_data: Vec<u8>,
    _id: Arc<CmId>,
    _listen_id: Option<Arc<CmId>>,
}

static DELIVERED: Registry<Event> = Registry::new();

/// What an id is doing.
#[derive(Default)]
struct IdState {
    /// The address given to `rdma_bind_addr` (or the listener's, once listening).
    bound: Option<SocketAddr>,
    /// The peer, once `rdma_resolve_addr` ran.
    dst: Option<SocketAddr>,
    route: bool,
    /// A connection request waiting for `rdma_accept` or `rdma_reject`.
    request: Option<ConnectRequest>,
    /// The initiator's (IRD, ORD) of that request.
    peer_ird_ord: (u16, u16),
    /// The queue pair connected through this id.
    qp: Option<Arc<Qp>>,
    /// A connection was started (`rdma_connect`, `rdma_accept`).
    connecting: bool,
    /// The listener thread and its stop flag.
    listener: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// Completion queues and channels `rdma_create_qp` made (destroyed with the QP).
    own_cqs: Vec<(usize, usize)>,
    /// `rdma_create_ep`'s queue pair attributes for the ids a passive endpoint hands out.
    ep_qp: Option<(usize, CStruct<ibv_qp_init_attr>)>,
    /// A synchronous id's `rdma_connect`: the private data of the peer's MPA Reply (the
    /// event that carried it is not handed to anyone; rsockets read it here).
    reply: Vec<u8>,
}

/// An rdma_cm id.
pub struct CmId {
    c: CStruct<rdma_cm_id>,
    channel: Mutex<Arc<EventChannel>>,
    /// Made with a NULL channel (or migrated to one): calls wait for their events.
    sync: AtomicBool,
    state: Mutex<IdState>,
    /// DISCONNECTED was queued.
    down: AtomicBool,
    /// Keeps a connection's DISCONNECTED after its ESTABLISHED (see [`CmId::report_up`]).
    up: Mutex<UpState>,
    /// `rdma_destroy_id` was called: an event queued from now on is dropped at once, as
    /// those queued before are (see [`CmId::post_with`]).
    destroyed: AtomicBool,
}

/// Whether a connection's ESTABLISHED (or CONNECT_RESPONSE) is queued yet, and whether the
/// connection went down before that.
#[derive(Default)]
struct UpState {
    queued: bool,
    down_early: bool,
}

static IDS: Registry<CmId> = Registry::new();

impl CmId {
    fn ibv(&self) -> *mut rdma_cm_id {
        self.c.ptr()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn channel(&self) -> Arc<EventChannel> {
        self.channel.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether calls wait for their events (the id has a private channel).
    fn is_sync(&self) -> bool {
        self.sync.load(Ordering::Acquire)
    }

    fn new(channel: Arc<EventChannel>, sync: bool, context: *mut c_void, ps: rdma_port_space) -> Arc<CmId> {
        let mut c: rdma_cm_id = zeroed();
        c.channel = channel.c.ptr();
        c.context = context;
        c.ps = ps;
        c.qp_type = IBV_QPT_RC;
        let id = Arc::new(CmId {
            c: CStruct::new(c),
            channel: Mutex::new(channel),
            sync: AtomicBool::new(sync),
            state: Mutex::new(IdState::default()),
            down: AtomicBool::new(false),
            up: Mutex::new(UpState::default()),
            destroyed: AtomicBool::new(false),
        });
        qp::on_destroy(qp_destroyed);
        IDS.insert(id.ibv(), id.clone());
        id
    }

    /// Gives the id the shared device context (`id->verbs`), as binding to an address of
    /// the device does.
    fn attach_device(&self) -> Result<()> {
        let ctx = cm_context()?;
        self.c.update(|c| {
            c.verbs = ctx.ibv();
            c.port_num = 1;
        });
        Ok(())
    }

    fn set_src(&self, a: SocketAddr) {
        self.c.update(|c| addr::write(&raw mut c.route.addr.__bindgen_anon_1 as *mut u8, a));
    }

    fn set_dst(&self, a: SocketAddr) {
        self.c.update(|c| addr::write(&raw mut c.route.addr.__bindgen_anon_2 as *mut u8, a));
    }

    /// Moves the id to `ch`, with its events queued on the old channel and not yet read, in
    /// order; `sync`: whether calls wait for their events from now on.
    fn move_to(&self, ch: Arc<EventChannel>, sync: bool) {
        let mut current = self.channel.lock().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&current, &ch) {
            for ev in current.take_queued(|ev| std::ptr::eq(Arc::as_ptr(&ev._id), self)) {
                ch.queue(ev);
            }
            self.c.update(|c| c.channel = ch.c.ptr());
            *current = ch;
        }
        self.sync.store(sync, Ordering::Release);
    }

    /// Queues an event for this id on its channel.
    fn post(self: &Arc<CmId>, kind: rdma_cm_event_type, status: c_int, conn: Option<ConnInfo>) {
        self.post_with(kind, status, conn, None);
    }

    fn post_with(
        self: &Arc<CmId>,
        kind: rdma_cm_event_type,
        status: c_int,
        conn: Option<ConnInfo>,
        listen_id: Option<Arc<CmId>>,
    ) {
        let conn = conn.unwrap_or_default();
        let mut c: rdma_cm_event = zeroed();
        c.id = self.ibv();
        c.listen_id = listen_id.as_ref().map_or(std::ptr::null_mut(), |l| l.ibv());
        c.event = kind;
        c.status = status;
        let mut p: rdma_conn_param = zeroed_conn();
        p.private_data_len = u8::try_from(conn.private_data.len()).unwrap_or(u8::MAX);
        p.responder_resources = u8::try_from(conn.responder_resources).unwrap_or(u8::MAX);
        p.initiator_depth = u8::try_from(conn.initiator_depth).unwrap_or(u8::MAX);
        p.qp_num = conn.qp_num;
        let private_data = conn.private_data;
        if !private_data.is_empty() {
            p.private_data = private_data.as_ptr().cast();
        }
        c.param.conn = p;
        tracing::debug!(event = %event_name(kind), status, "rdma_cm event");
        let event = Arc::new(Event {
            c: CStruct::new(c),
            _private_data: private_data,
            _id: self.clone(),
            _listen_id: listen_id,
        });
        self.channel().queue(event);
        // An event queued while or after the id was destroyed (a connection's DISCONNECTED,
        // reported from the engine's thread as the application destroys the id) goes with
        // the others: left on the channel, it would hold the id, whose channel holds it, and
        // neither would ever be freed (AddressSanitizer reported the cycle as a leak in 6 of
        // 120 runs of verbs-abi/tests/cm_events.rs). Pairs with the store in
        // `rdma_destroy_id`: either this load sees it, or that call's drop, which comes after
        // it, finds this event queued (the channel's lock orders the two).
        if self.destroyed.load(Ordering::SeqCst) {
            drop_queued_events(self);
        }
    }

    /// Synchronous ids: waits for the next event of the id's private channel; its outcome.
    fn wait_sync(&self, expect: rdma_cm_event_type) -> Result<Option<Arc<Event>>> {
        let ch = self.channel();
        loop {
            read_record(ch.queue.fd())?;
            let Some(ev) = ch.queue.take().and_then(|n| ch.take(n)) else { continue };
            let c = ev.c.read();
            if c.event == expect {
                return Ok(Some(ev));
            }
            return Err(match c.event {
                RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
                RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
                RDMA_CM_EVENT_DISCONNECTED => libc::ECONNRESET,
                _ => {
                    if c.status < 0 {
                        -c.status
                    } else {
                        libc::EIO
                    }
                }
            });
        }
    }

    /// Queues the event that says the connection is up (ESTABLISHED, CONNECT_RESPONSE),
    /// then the DISCONNECTED held back if the connection went down before it.
    ///
    /// The queue pair is live before this event is queued (the application may use it as
    /// soon as it reads the event), so the peer may close it first: a client that disconnects
    /// as soon as its `rdma_connect` returns often does so before the server's `rdma_accept`
    /// queued ESTABLISHED. The kernel's rdma_cm never reports such a connection DISCONNECTED
    /// first: the iWARP CM hands an id's events over one at a time, in the order the device
    /// raised them, and a close comes after the establishment it ends.
    fn report_up(self: &Arc<CmId>, kind: rdma_cm_event_type, conn: ConnInfo) {
        self.post(kind, 0, Some(conn));
        let down_early = {
            let mut up = self.up.lock().unwrap_or_else(PoisonError::into_inner);
            up.queued = true;
            up.down_early
        };
        if down_early {
            self.report_down();
        }
    }

    /// Reports the connection down, once, and never before it was reported up.
    fn report_down(self: &Arc<CmId>) {
        {
            let mut up = self.up.lock().unwrap_or_else(PoisonError::into_inner);
            if !up.queued {
                up.down_early = true;
                return;
            }
        }
        if !self.down.swap(true, Ordering::AcqRel) {
            self.post(RDMA_CM_EVENT_DISCONNECTED, 0, None);
            if let Ok(rt) = runtime::runtime() {
                rt.flush_capture();
            }
        }
    }
}

fn zeroed_conn() -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    }
}

/// `param.conn` of an event.
#[derive(Default)]
struct ConnInfo {
    private_data: Vec<u8>,
    responder_resources: u16,
    initiator_depth: u16,
    qp_num: u32,
}

/// The id behind `id`.
/// The private data of the peer's reply to a synchronous id's `rdma_connect`.
pub(crate) fn sync_reply(id: *mut rdma_cm_id) -> Result<Vec<u8>> {
    Ok(get_id(id)?.state().reply.clone())
}

fn get_id(id: *mut rdma_cm_id) -> Result<Arc<CmId>> {
    IDS.get(id)
}

/// Clears `id->qp` of the id whose queue pair `qp` was destroyed with `ibv_destroy_qp`.
pub(crate) fn qp_destroyed(qp: *mut ibv_qp) {
    IDS.for_each(|id| {
        if id.c.read().qp == qp {
            id.c.update(|c| c.qp = std::ptr::null_mut());
        }
    });
}

/// Creates an event channel: its `fd` counts its events (`verbs-abi/src/events.rs`).
///
/// # Safety
///
/// None.
#[unsafe(export_name = "iwarp_rdma_create_event_channel")]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ptr_call("rdma_create_event_channel", || {
        runtime::config()?;
        let ch = EventChannel::new()?;
        CHANNELS.insert(ch.c.ptr(), ch.clone());
        Ok(ch.c.ptr())
    })
}

/// Destroys an event channel (events not yet read are dropped).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_destroy_event_channel")]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    if let Some(ch) = CHANNELS.remove(channel) {
        ch.queued.lock().unwrap_or_else(PoisonError::into_inner).clear();
        DESTROYED_CHANNELS.lock().unwrap_or_else(PoisonError::into_inner).insert(channel as usize);
    }
}

/// Channels destroyed since (by address; an address is forgotten when a new channel gets it).
/// A thread that comes to read one of them, such as rping's event thread racing the main
/// thread's teardown, waits as a read of rdma-core's event file would: no event comes.
static DESTROYED_CHANNELS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// Creates an id; with a NULL `channel` the id is synchronous.
///
/// # Safety
///
/// `id` points to a writable pointer.
#[unsafe(export_name = "iwarp_rdma_create_id")]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    minus1_call("rdma_create_id", || {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        if ps != RDMA_PS_TCP && ps != RDMA_PS_IB {
            return Err(libc::EPROTONOSUPPORT);
        }
        runtime::runtime()?;
        let (ch, sync) =
            if channel.is_null() { (EventChannel::new()?, true) } else { (CHANNELS.get(channel)?, false) };
        let new = CmId::new(ch, sync, context, ps);
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *id = new.ibv() };
        Ok(0)
    })
}

/// Destroys an id: stops its listener, drops a connection request it still holds (closing
/// that connection) and its events not read yet. A connection is closed by destroying its
/// queue pair.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_destroy_id")]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    minus1_call("rdma_destroy_id", || {
        let obj = IDS.remove(id).ok_or(libc::EINVAL)?;
        obj.destroyed.store(true, Ordering::SeqCst);
        // As rdma-core: wait until the events delivered for this id are acknowledged (a
        // program's event thread is then past its last event of the id; rping relies on it).
        // Bounded, for a program that destroys an id before acknowledging its events.
        let deadline = Instant::now() + Duration::from_secs(2);
        while unacked(&obj) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let listener = {
            let mut st = obj.state();
            st.request = None;
            st.listener.take()
        };
        if let Some((stop, thread)) = listener {
            stop.store(true, Ordering::Release);
            let _ = thread.join();
        }
        drop_queued_events(&obj);
        Ok(0)
    })
}

/// Drops the events of `obj` queued on its channel and not read yet, and, for a listener,
/// the connection requests queued for it, whose new ids go with them (closing their
/// connections). The kernel's rdma_cm does the same when an id is destroyed: a program never
/// reads an event for an id it destroyed. (libfabric's rxm destroys the id of a connection it
/// gave up for the peer's, simultaneous one, before that id's ROUTE_RESOLVED is read: the
/// event's `id->context` is freed memory by then.)
fn drop_queued_events(obj: &Arc<CmId>) {
    let dropped = obj.channel().take_queued(|ev| {
        Arc::ptr_eq(&ev._id, obj) || ev._listen_id.as_ref().is_some_and(|l| Arc::ptr_eq(l, obj))
    });
    for ev in dropped {
        if !Arc::ptr_eq(&ev._id, obj) {
            forget_request(&ev._id);
        }
    }
}

/// Forgets the new id of a connection request nobody will take: the connection closes.
fn forget_request(id: &Arc<CmId>) {
    let _ = IDS.remove(id.ibv());
    id.state().request = None;
}

/// Whether an event delivered for `obj` is not acknowledged yet.
fn unacked(obj: &Arc<CmId>) -> bool {
    let found = std::sync::atomic::AtomicBool::new(false);
    DELIVERED.for_each(|ev| {
        if Arc::ptr_eq(&ev._id, obj) {
            found.store(true, Ordering::Relaxed);
        }
    });
    found.into_inner()
}

/// Binds the id to a local address (port 0: chosen when listening).
///
/// # Safety
///
/// `addr` points to a `sockaddr_in` or `sockaddr_in6`.
#[unsafe(export_name = "iwarp_rdma_bind_addr")]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    minus1_call("rdma_bind_addr", || {
        let obj = get_id(id)?;
        let a = addr::read(addr)?;
        obj.state().bound = Some(a);
        obj.set_src(a);
        obj.attach_device()?;
        Ok(0)
    })
}

/// Resolves the peer's address: recorded, with the local address the route to it uses;
/// `ADDR_RESOLVED` follows.
///
/// # Safety
///
/// `dst_addr` (and `src_addr`, if not NULL) point to socket addresses.
#[unsafe(export_name = "iwarp_rdma_resolve_addr")]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    minus1_call("rdma_resolve_addr", || {
        let obj = get_id(id)?;
        let dst = addr::read(dst_addr)?;
        let src = if src_addr.is_null() { None } else { Some(addr::read(src_addr)?) };
        let src = match src {
            Some(s) if !s.ip().is_unspecified() => s,
            _ => addr::source_for(dst, runtime::runtime()?.smol_ip()),
        };
        {
            let mut st = obj.state();
            st.dst = Some(dst);
            st.bound = Some(src);
        }
        obj.set_src(src);
        obj.set_dst(dst);
        obj.attach_device()?;
        obj.post(RDMA_CM_EVENT_ADDR_RESOLVED, 0, None);
        if obj.is_sync() {
            obj.wait_sync(RDMA_CM_EVENT_ADDR_RESOLVED)?;
        }
        Ok(0)
    })
}

/// Resolves the route: nothing to find over TCP/IP; `ROUTE_RESOLVED` follows.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_resolve_route")]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    minus1_call("rdma_resolve_route", || {
        let obj = get_id(id)?;
        {
            let mut st = obj.state();
            if st.dst.is_none() {
                return Err(libc::EINVAL);
            }
            st.route = true;
        }
        obj.post(RDMA_CM_EVENT_ROUTE_RESOLVED, 0, None);
        if obj.is_sync() {
            obj.wait_sync(RDMA_CM_EVENT_ROUTE_RESOLVED)?;
        }
        Ok(0)
    })
}

/// Creates the id's queue pair; NULL `pd` uses the id's own; missing completion queues are
/// created (each with a completion channel), as librdmacm does.
///
/// # Safety
///
/// `qp_init_attr` points to a `struct ibv_qp_init_attr` (its CQs and caps are updated).
#[unsafe(export_name = "iwarp_rdma_create_qp")]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    minus1_call("rdma_create_qp", || create_qp(id, pd, qp_init_attr))
}

fn create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> Result<c_int> {
    let obj = get_id(id)?;
    if qp_init_attr.is_null() {
        return Err(libc::EINVAL);
    }
    let c = obj.c.read();
    if c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if !c.qp.is_null() {
        return Err(libc::EBUSY);
    }
    let pd = if pd.is_null() {
        if c.pd.is_null() {
            // SAFETY: the id's context is a live context of this library.
            let new = unsafe { ibv_alloc_pd(c.verbs) };
            if new.is_null() {
                return Err(libc::ENOMEM);
            }
            obj.c.update(|c| c.pd = new);
            new
        } else {
            c.pd
        }
    } else {
        PDS.get(pd)?;
        pd
    };
    // SAFETY: the caller passes a readable and writable structure (checked non-null).
    let attr = unsafe { &mut *qp_init_attr };
    let mut made = Vec::new();
    for (want_send, depth) in [(true, attr.cap.max_send_wr), (false, attr.cap.max_recv_wr)] {
        let slot = if want_send { attr.send_cq } else { attr.recv_cq };
        if !slot.is_null() {
            continue;
        }
        // SAFETY: the id's context is live; the calls check their arguments.
        let channel = unsafe { ibv_create_comp_channel(c.verbs) };
        // SAFETY: as above.
        let cq = unsafe { ibv_create_cq(c.verbs, depth.max(1) as c_int, id.cast(), channel, 0) };
        if cq.is_null() || channel.is_null() {
            return Err(libc::ENOMEM);
        }
        made.push((cq as usize, channel as usize));
        if want_send {
            attr.send_cq = cq;
            obj.c.update(|c| {
                c.send_cq = cq;
                c.send_cq_channel = channel;
            });
        } else {
            attr.recv_cq = cq;
            obj.c.update(|c| {
                c.recv_cq = cq;
                c.recv_cq_channel = channel;
            });
        }
    }
    let qp = match qp::create(pd, qp_init_attr) {
        Ok(qp) => qp,
        Err(e) => {
            destroy_own(&made);
            return Err(e);
        }
    };
    if let Ok(q) = qp::get(qp) {
        q.set_state(IBV_QPS_INIT);
    }
    obj.state().own_cqs.extend(made);
    obj.c.update(|c| c.qp = qp);
    Ok(0)
}

fn destroy_own(made: &[(usize, usize)]) {
    for &(cq, channel) in made {
        // SAFETY: CQs and channels this library made; the calls check them again.
        unsafe {
            ibv_destroy_cq(cq as *mut ibv_cq);
            ibv_destroy_comp_channel(channel as *mut ibv_comp_channel);
        }
    }
}

/// Creates the id's queue pair from extended attributes (only the fields of
/// `ibv_qp_init_attr` and the protection domain are used).
///
/// # Safety
///
/// `qp_init_attr` points to a `struct ibv_qp_init_attr_ex`.
#[unsafe(export_name = "iwarp_rdma_create_qp_ex")]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    minus1_call("rdma_create_qp_ex", || {
        if qp_init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable and writable structure (checked non-null).
        let ex = unsafe { &mut *qp_init_attr };
        let mut attr = ibv_qp_init_attr {
            qp_context: ex.qp_context,
            send_cq: ex.send_cq,
            recv_cq: ex.recv_cq,
            srq: ex.srq,
            cap: ex.cap,
            qp_type: ex.qp_type,
            sq_sig_all: ex.sq_sig_all,
        };
        let pd = if ex.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { ex.pd } else { std::ptr::null_mut() };
        let rc = create_qp(id, pd, &raw mut attr)?;
        ex.cap = attr.cap;
        ex.send_cq = attr.send_cq;
        ex.recv_cq = attr.recv_cq;
        Ok(rc)
    })
}

/// Destroys the id's queue pair (and the completion queues `rdma_create_qp` made for it).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_destroy_qp")]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    let _ = minus1_call("rdma_destroy_qp", || {
        let obj = get_id(id)?;
        let qp = obj.c.read().qp;
        if !qp.is_null() {
            let _ = qp::destroy(qp);
        }
        let own = std::mem::take(&mut obj.state().own_cqs);
        destroy_own(&own);
        obj.c.update(|c| {
            c.qp = std::ptr::null_mut();
            if !own.is_empty() {
                c.send_cq = std::ptr::null_mut();
                c.recv_cq = std::ptr::null_mut();
                c.send_cq_channel = std::ptr::null_mut();
                c.recv_cq_channel = std::ptr::null_mut();
            }
        });
        Ok(0)
    });
}

/// The queue pair a connect or accept uses: the id's, or the one `conn_param.qp_num` names
/// (a queue pair the application made with `ibv_create_qp`); whether it was the latter.
fn conn_qp(obj: &CmId, param: Option<&rdma_conn_param>) -> Result<(Arc<Qp>, bool)> {
    let c = obj.c.read();
    if !c.qp.is_null() {
        return Ok((qp::get(c.qp)?, false));
    }
    match param {
        Some(p) => Ok((qp::by_num(p.qp_num)?, true)),
        None => Err(libc::EINVAL),
    }
}

fn read_param(p: *mut rdma_conn_param) -> Result<Option<(rdma_conn_param, Vec<u8>)>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a readable structure (checked non-null).
    let param = unsafe { *p };
    let data = if param.private_data.is_null() || param.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the structure names `private_data_len` readable bytes.
        unsafe {
            std::slice::from_raw_parts(param.private_data.cast::<u8>(), usize::from(param.private_data_len))
        }
        .to_vec()
    };
    Ok(Some((param, data)))
}

/// [`MAX_RD_ATOM`] as an IRD/ORD value.
#[expect(clippy::cast_possible_truncation, reason = "checked against u16::MAX first")]
const MAX_RD_ATOM_U16: u16 = if MAX_RD_ATOM <= u16::MAX as u32 { MAX_RD_ATOM as u16 } else { u16::MAX };

fn settings(qp: &Qp, ird: u16, ord: u16, private_data: Vec<u8>) -> ConnSettings {
    ConnSettings {
        ird: ird.min(MAX_RD_ATOM_U16),
        ord: ord.min(MAX_RD_ATOM_U16),
        private_data,
        max_send_wr: qp.caps.max_send_wr as usize,
        max_recv_wr: qp.caps.max_recv_wr as usize,
        recv: qp.take_pending(),
        srq: qp.srq.as_ref().map(|s| s.queue.clone()),
    }
}

/// What a connection going live does: the queue pair takes it, and its end is reported as
/// DISCONNECTED on the id.
fn go_live(obj: &Arc<CmId>, qp: &Arc<Qp>, conn: iwarp::QueuePair) -> Result<()> {
    let weak: Weak<CmId> = Arc::downgrade(obj);
    obj.state().qp = Some(qp.clone());
    qp.go_live(
        conn,
        Box::new(move || {
            if let Some(id) = weak.upgrade() {
                id.report_down();
            }
        }),
    )
}

/// Connects to the resolved peer: TCP and the MPA exchange run on a thread of their own;
/// `ESTABLISHED` (or `REJECTED`, `UNREACHABLE`, `CONNECT_ERROR`) follows.
///
/// # Safety
///
/// `conn_param` is NULL or points to a `struct rdma_conn_param`.
#[unsafe(export_name = "iwarp_rdma_connect")]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    minus1_call("rdma_connect", || {
        let obj = get_id(id)?;
        let param = read_param(conn_param)?;
        let (qp, by_num) = conn_qp(&obj, param.as_ref().map(|p| &p.0))?;
        let dst = {
            let mut st = obj.state();
            if !st.route || st.connecting {
                return Err(libc::EINVAL);
            }
            st.connecting = true;
            st.dst.ok_or(libc::EINVAL)?
        };
        let (ird, ord, data) = match param {
            Some((p, data)) => (u16::from(p.responder_resources), u16::from(p.initiator_depth), data),
            None => (1, 1, Vec::new()),
        };
        let rt = runtime::runtime()?;
        let opts = rt.connect_options(settings(&qp, ird, ord, data));
        let thread_obj = obj.clone();
        std::thread::Builder::new()
            .name("iwarp-rdma-connect".into())
            .spawn(move || {
                let (obj, qp) = (thread_obj, qp);
                // A refused connection is tried again for a while: a server may be between two
                // listeners on the port (perftest's is, right after its control connection).
                let deadline = Instant::now() + rt.config.connect_retry;
                let result = loop {
                    let result = rt.device.connect(dst, &qp.pd.pd, &qp.send_cq.cq, &qp.recv_cq.cq, &opts);
                    match result {
                        Err(CmError::Io(ref e))
                            if e.kind() == std::io::ErrorKind::ConnectionRefused
                                && Instant::now() < deadline =>
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        result => break result,
                    }
                };
                match result {
                    Ok(connected) => {
                        let params = connected.qp.conn_params();
                        let info = ConnInfo {
                            private_data: connected.private_data,
                            responder_resources: params.ird,
                            initiator_depth: params.ord,
                            qp_num: 0,
                        };
                        match go_live(&obj, &qp, connected.qp) {
                            Ok(()) => {
                                let kind = if by_num {
                                    RDMA_CM_EVENT_CONNECT_RESPONSE
                                } else {
                                    RDMA_CM_EVENT_ESTABLISHED
                                };
                                obj.report_up(kind, info);
                            }
                            Err(e) => obj.post(RDMA_CM_EVENT_CONNECT_ERROR, -e, None),
                        }
                    }
                    Err(e) => {
                        qp.restore_pending(opts.recv.clone());
                        obj.state().connecting = false;
                        let (kind, status, private_data) = connect_failure(&e);
                        tracing::debug!(error = %e, "rdma_connect failed");
                        obj.post(kind, status, Some(ConnInfo { private_data, ..ConnInfo::default() }));
                    }
                }
            })
            .map_err(|_| libc::EAGAIN)?;
        if obj.is_sync()
            && let Some(ev) = obj.wait_sync(if by_num {
                RDMA_CM_EVENT_CONNECT_RESPONSE
            } else {
                RDMA_CM_EVENT_ESTABLISHED
            })?
        {
            obj.state().reply = ev._private_data.clone();
        }
        Ok(0)
    })
}

/// The event, status and private data of a failed connect (as the kernel's iWARP CM reports
/// them: a refused or reset connection is REJECTED, a timeout UNREACHABLE).
fn connect_failure(e: &CmError) -> (rdma_cm_event_type, c_int, Vec<u8>) {
    match e {
        CmError::Rejected { private_data } => {
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED, private_data.clone())
        }
        CmError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNREFUSED, Vec::new())
        }
        CmError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionReset => {
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNRESET, Vec::new())
        }
        CmError::Timeout => (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT, Vec::new()),
        CmError::Io(io) => (RDMA_CM_EVENT_CONNECT_ERROR, -io.raw_os_error().unwrap_or(libc::EIO), Vec::new()),
        _ => (RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNABORTED, Vec::new()),
    }
}

/// Listens on the bound address: a thread accepts MPA Requests, each a new id and a
/// `CONNECT_REQUEST` event on this id's channel.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_listen")]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    minus1_call("rdma_listen", || {
        let obj = get_id(id)?;
        let bound = obj.state().bound.ok_or(libc::EINVAL)?;
        if obj.state().listener.is_some() {
            return Err(libc::EINVAL);
        }
        let rt = runtime::runtime()?;
        let listener = rt.device.listen_with(bound, &rt.listen_options()).map_err(|e| match e {
            CmError::Io(io) => io.raw_os_error().unwrap_or(libc::EADDRINUSE),
            _ => libc::EADDRINUSE,
        })?;
        let local = listener.local_addr().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        obj.set_src(local);
        obj.state().bound = Some(local);
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(&obj);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("iwarp-rdma-listen".into())
            .spawn(move || accept_loop(&listener, &weak, &flag))
            .map_err(|_| libc::EAGAIN)?;
        obj.state().listener = Some((stop, thread));
        Ok(0)
    })
}

fn accept_loop(listener: &iwarp::Listener, parent: &Weak<CmId>, stop: &AtomicBool) {
    let local = listener.local_addr().ok();
    while !stop.load(Ordering::Acquire) {
        match listener.accept(Duration::from_millis(50)) {
            Ok(req) => {
                let Some(parent) = parent.upgrade() else { return };
                let pc = parent.c.read();
                let child = CmId::new(parent.channel(), parent.is_sync(), pc.context, pc.ps);
                if child.attach_device().is_err() {
                    continue;
                }
                if let Some(l) = local {
                    child.set_src(l);
                }
                child.set_dst(req.peer_addr());
                let peer = req.peer_ird_ord().map_or((0, 0), |w| (w.ird, w.ord));
                let info = ConnInfo {
                    private_data: req.private_data().to_vec(),
                    // From this side's point of view: the initiator's ORD is what we must
                    // answer (our responder resources), its IRD what we may issue.
                    responder_resources: peer.1,
                    initiator_depth: peer.0,
                    qp_num: 0,
                };
                {
                    let mut st = child.state();
                    st.request = Some(req);
                    st.peer_ird_ord = peer;
                    st.dst = Some(
                        st.request.as_ref().map_or_else(|| ([0u8; 4], 0).into(), ConnectRequest::peer_addr),
                    );
                    st.bound = local;
                }
                child.post_with(RDMA_CM_EVENT_CONNECT_REQUEST, 0, Some(info), Some(parent.clone()));
            }
            Err(CmError::Timeout) => {}
            Err(e) => {
                tracing::debug!(error = %e, "rdma_cm listener");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Accepts the connection request of `id` (an id from a `CONNECT_REQUEST` event): the MPA
/// Reply goes out and the queue pair starts; `ESTABLISHED` follows.
///
/// # Safety
///
/// `conn_param` is NULL or points to a `struct rdma_conn_param`.
#[unsafe(export_name = "iwarp_rdma_accept")]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    minus1_call("rdma_accept", || {
        let obj = get_id(id)?;
        let param = read_param(conn_param)?;
        let (qp, _) = conn_qp(&obj, param.as_ref().map(|p| &p.0))?;
        let (req, peer) = {
            let mut st = obj.state();
            let req = st.request.take().ok_or(libc::EINVAL)?;
            st.connecting = true;
            (req, st.peer_ird_ord)
        };
        let (ird, ord, data) = match param {
            Some((p, data)) => (u16::from(p.responder_resources), u16::from(p.initiator_depth), data),
            // Answer what the initiator asked for, within the device's limits.
            None => (peer.1, peer.0, Vec::new()),
        };
        let rt = runtime::runtime()?;
        let opts = rt.connect_options(settings(&qp, ird, ord, data));
        match req.accept(&qp.pd.pd, &qp.send_cq.cq, &qp.recv_cq.cq, &opts) {
            Ok(conn) => {
                let params = conn.conn_params();
                go_live(&obj, &qp, conn)?;
                let info = ConnInfo {
                    private_data: Vec::new(),
                    responder_resources: params.ird,
                    initiator_depth: params.ord,
                    qp_num: 0,
                };
                obj.report_up(RDMA_CM_EVENT_ESTABLISHED, info);
                if obj.is_sync() {
                    obj.wait_sync(RDMA_CM_EVENT_ESTABLISHED)?;
                }
                Ok(0)
            }
            Err(e) => {
                qp.restore_pending(opts.recv.clone());
                tracing::debug!(error = %e, "rdma_accept failed");
                Err(match e {
                    CmError::Io(io) => io.raw_os_error().unwrap_or(libc::ECONNABORTED),
                    CmError::Timeout => libc::ETIMEDOUT,
                    _ => libc::ECONNABORTED,
                })
            }
        }
    })
}

/// Rejects the connection request of `id`, with private data.
///
/// # Safety
///
/// `private_data` points to `private_data_len` readable bytes (or is NULL).
#[unsafe(export_name = "iwarp_rdma_reject")]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    minus1_call("rdma_reject", || reject(id, private_data, private_data_len))
}

fn reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> Result<c_int> {
    let obj = get_id(id)?;
    let req = obj.state().request.take().ok_or(libc::EINVAL)?;
    let data = if private_data.is_null() || private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `private_data_len` readable bytes.
        unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(private_data_len)) }
            .to_vec()
    };
    req.reject(&data).map_err(|_| libc::ECONNRESET)?;
    Ok(0)
}

/// Closes the connection: the queue pair moves to error and its posted work is flushed
/// (`IBV_WC_WR_FLUSH_ERR`); `DISCONNECTED` follows on both sides. 0 if it is already
/// closed.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_disconnect")]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    minus1_call("rdma_disconnect", || {
        let obj = get_id(id)?;
        let qp = obj.state().qp.clone();
        match qp {
            Some(qp) => {
                if let Some(conn) = qp.connection() {
                    conn.disconnect();
                }
                qp.set_state(IBV_QPS_ERR);
                Ok(0)
            }
            None => Err(libc::EINVAL),
        }
    })
}

/// Completes a connection whose queue pair the application made itself (after
/// `CONNECT_RESPONSE`): the connection is already live, so nothing is left to do.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_establish")]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    minus1_call("rdma_establish", || {
        let obj = get_id(id)?;
        if obj.state().qp.is_some() { Ok(0) } else { Err(libc::EINVAL) }
    })
}

/// The attributes that move a queue pair the application made to `qp_attr->qp_state`.
///
/// # Safety
///
/// `qp_attr` and `qp_attr_mask` point to writable values.
#[unsafe(export_name = "iwarp_rdma_init_qp_attr")]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    minus1_call("rdma_init_qp_attr", || {
        get_id(id)?;
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes writable values (checked non-null).
        let a = unsafe { &mut *qp_attr };
        let mask = match a.qp_state {
            IBV_QPS_INIT => {
                a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                a.port_num = 1;
                a.pkey_index = 0;
                IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT
            }
            IBV_QPS_RTR | IBV_QPS_RTS => IBV_QP_STATE,
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: as above.
        unsafe { *qp_attr_mask = mask as c_int };
        Ok(0)
    })
}

fn channel_fd(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> Result<(Arc<EventChannel>, c_int)> {
    let ch = CHANNELS.get(channel)?;
    if event.is_null() {
        return Err(libc::EINVAL);
    }
    let fd = ch.queue.fd();
    Ok((ch, fd))
}

fn deliver(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> Result<bool> {
    let ch = CHANNELS.get(channel)?;
    let Some(ev) = ch.queue.take().and_then(|n| ch.take(n)) else { return Ok(false) };
    let ptr = ev.c.ptr();
    DELIVERED.insert(ptr, ev);
    // SAFETY: the caller passes a writable pointer (checked non-null).
    unsafe { *event = ptr };
    Ok(true)
}

/// Waits for the next event on `channel`: blocks in `read` on the channel's descriptor (a
/// cancellation point) unless the application made it non-blocking (then -1, `EAGAIN`).
///
/// # Safety
///
/// `event` points to a writable pointer.
#[unsafe(export_name = "iwarp_rdma_get_cm_event")]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    let fd = match minus1_call("rdma_get_cm_event", || channel_fd(channel, event).map(|(_, fd)| fd)) {
        -1 => {
            wait_if_destroyed(channel);
            return -1;
        }
        fd => fd,
    };
    loop {
        // No value with a destructor is live here: a cancelled read unwinds through.
        if let Err(e) = read_record(fd) {
            set_errno(e);
            return -1;
        }
        match minus1_call("rdma_get_cm_event", || deliver(channel, event).map(c_int::from)) {
            1 => return 0,
            0 => continue,
            _ => {
                wait_if_destroyed(channel);
                return -1;
            }
        }
    }
}

/// Blocks for good when `channel` was destroyed: see [`DESTROYED_CHANNELS`].
fn wait_if_destroyed(channel: *mut rdma_event_channel) {
    if DESTROYED_CHANNELS.lock().unwrap_or_else(PoisonError::into_inner).contains(&(channel as usize)) {
        // No value with a destructor is live here: a cancelled sleep unwinds through.
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// Releases an event.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_ack_cm_event")]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    minus1_call("rdma_ack_cm_event", || DELIVERED.remove(event).map(|_| 0).ok_or(libc::EINVAL))
}

/// The name of an event type.
///
/// # Safety
///
/// None.
#[unsafe(export_name = "iwarp_rdma_event_str")]
pub unsafe extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    cstr(event_cname(event))
}

fn event_cname(event: rdma_cm_event_type) -> &'static std::ffi::CStr {
    match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

fn event_name(event: rdma_cm_event_type) -> String {
    event_cname(event).to_string_lossy().into_owned()
}

/// Sets an option: the id-level ones (type of service, address reuse, IPv6-only, ACK
/// timeout) are accepted and have no effect over TCP; InfiniBand paths are not supported.
///
/// # Safety
///
/// `optval` points to `optlen` readable bytes.
#[unsafe(export_name = "iwarp_rdma_set_option")]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    minus1_call("rdma_set_option", || {
        get_id(id)?;
        if optval.is_null() || optlen == 0 {
            return Err(libc::EINVAL);
        }
        match (level as u32, optname as u32) {
            (
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS
                | RDMA_OPTION_ID_REUSEADDR
                | RDMA_OPTION_ID_AFONLY
                | RDMA_OPTION_ID_ACK_TIMEOUT,
            ) => Ok(0),
            (RDMA_OPTION_IB, _) => Err(libc::ENOSYS),
            _ => Err(libc::EINVAL),
        }
    })
}

/// Acknowledges an asynchronous event for the id's queue pair: nothing to do.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_notify")]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> c_int {
    minus1_call("rdma_notify", || get_id(id).map(|_| 0))
}

/// Moves the id to another event channel, with the events of the id queued on the old one
/// and not yet read, in order (the kernel's rdma_cm does the same). NULL: a private channel,
/// and the id is synchronous from then on (`EINVAL` for an id that already is); an id moved
/// to an application's channel is asynchronous from then on (libfabric's verbs provider
/// creates its ids synchronous and moves them to its event queue's channel).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_migrate_id")]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    minus1_call("rdma_migrate_id", || {
        let obj = get_id(id)?;
        if channel.is_null() && obj.is_sync() {
            return Err(libc::EINVAL);
        }
        let ch = if channel.is_null() { EventChannel::new()? } else { CHANNELS.get(channel)? };
        obj.move_to(ch, channel.is_null());
        Ok(0)
    })
}

/// The local port (network byte order).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_get_src_port")]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    get_id(id).ok().and_then(|o| o.state().bound).map_or(0, |a| a.port().to_be())
}

/// The peer's port (network byte order).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_get_dst_port")]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    get_id(id).ok().and_then(|o| o.state().dst).map_or(0, |a| a.port().to_be())
}

/// The local address (inside the id).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_get_local_addr")]
pub unsafe extern "C" fn rdma_get_local_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    ptr_call("rdma_get_local_addr", || {
        let obj = get_id(id)?;
        // SAFETY: a field address inside the live id; nothing is read.
        Ok(unsafe { (&raw mut (*obj.ibv()).route.addr.__bindgen_anon_1).cast::<sockaddr>() })
    })
}

/// The peer's address (inside the id).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_get_peer_addr")]
pub unsafe extern "C" fn rdma_get_peer_addr(id: *mut rdma_cm_id) -> *mut sockaddr {
    ptr_call("rdma_get_peer_addr", || {
        let obj = get_id(id)?;
        // SAFETY: a field address inside the live id; nothing is read.
        Ok(unsafe { (&raw mut (*obj.ibv()).route.addr.__bindgen_anon_2).cast::<sockaddr>() })
    })
}

/// The device contexts rdma_cm uses (one), NULL-terminated, for [`rdma_free_devices`].
///
/// # Safety
///
/// `num_devices` is NULL or points to a writable `int`.
#[unsafe(export_name = "iwarp_rdma_get_devices")]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    ptr_call("rdma_get_devices", || {
        let ctx = cm_context()?;
        // SAFETY: calloc of two pointers; checked for NULL below.
        let list =
            unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: `list` holds two pointers; the second stays NULL.
        unsafe { *list = ctx.ibv() };
        if !num_devices.is_null() {
            // SAFETY: the caller passes a writable int.
            unsafe { *num_devices = 1 };
        }
        Ok(list)
    })
}

/// Frees a list from [`rdma_get_devices`].
///
/// # Safety
///
/// `list` came from [`rdma_get_devices`] (or is NULL).
#[unsafe(export_name = "iwarp_rdma_free_devices")]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the list came from calloc (or is NULL).
    unsafe { libc::free(list.cast()) }
}

/// Waits for the next connection request on a synchronous listening id; the new id in
/// `*id` (with a queue pair if the listening endpoint was made with attributes for one).
///
/// # Safety
///
/// `id` points to a writable pointer.
#[unsafe(export_name = "iwarp_rdma_get_request")]
pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    minus1_call("rdma_get_request", || {
        let obj = get_id(listen)?;
        if !obj.is_sync() || id.is_null() {
            return Err(libc::EINVAL);
        }
        let ev = next_request(&obj)?;
        let child = ev.c.read().id;
        let ep_qp = obj.state().ep_qp.as_ref().map(|(pd, a)| (*pd, a.read()));
        if let Some((pd, mut attr)) = ep_qp {
            create_qp(child, pd as *mut ibv_pd, &raw mut attr)?;
        }
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *id = child };
        Ok(0)
    })
}

/// The `CONNECT_REQUEST` event of a synchronous listening id's next connection request
/// (`rdma_get_request`, `raccept`). Its new id gets a private channel of its own, as librdmacm
/// gives it: until then it shares the listener's, where a call waiting for one of the new
/// id's events (`rdma_accept` waits for `ESTABLISHED`) could take the next connection request
/// instead, or another new id's event.
fn next_request(listen: &Arc<CmId>) -> Result<Arc<Event>> {
    let ev = listen.wait_sync(RDMA_CM_EVENT_CONNECT_REQUEST)?.ok_or(libc::EIO)?;
    match EventChannel::new() {
        Ok(ch) => {
            ev._id.move_to(ch, true);
            Ok(ev)
        }
        Err(e) => {
            // Refused as the kernel refuses a request it cannot take.
            forget_request(&ev._id);
            Err(e)
        }
    }
}

/// rsockets' `raccept`: the next connection request of the synchronous listening id
/// `listen`: its new id (synchronous, on a channel of its own), the initiator's private
/// data, and the request's connection parameters (their `private_data` pointer cleared).
pub(crate) fn take_request(listen: *mut rdma_cm_id) -> Result<(*mut rdma_cm_id, Vec<u8>, rdma_conn_param)> {
    let obj = get_id(listen)?;
    if !obj.is_sync() {
        return Err(libc::EINVAL);
    }
    let ev = next_request(&obj)?;
    let c = ev.c.read();
    // SAFETY: a CONNECT_REQUEST event's parameters are its `conn` member (`post_with`
    // writes it for every event).
    let mut param = unsafe { c.param.conn };
    param.private_data = std::ptr::null();
    param.private_data_len = 0;
    Ok((c.id, ev._private_data.clone(), param))
}

/// Creates a synchronous endpoint from `rdma_getaddrinfo`'s result: a passive one is bound
/// (listen with `rdma_listen`, take connections with `rdma_get_request`); an active one is
/// resolved, with a queue pair if `qp_init_attr` is given.
///
/// # Safety
///
/// `res` is an `rdma_addrinfo` from `rdma_getaddrinfo`; `id` a writable pointer;
/// `qp_init_attr` NULL or a `struct ibv_qp_init_attr`.
#[unsafe(export_name = "iwarp_rdma_create_ep")]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    minus1_call("rdma_create_ep", || {
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable rdma_addrinfo (checked non-null).
        let ai = unsafe { *res };
        let mut new = std::ptr::null_mut();
        // SAFETY: a writable local pointer; NULL channel: synchronous.
        if unsafe { rdma_create_id(std::ptr::null_mut(), &raw mut new, std::ptr::null_mut(), RDMA_PS_TCP) }
            != 0
        {
            return Err(errno());
        }
        let undo = |e: c_int| {
            // SAFETY: the id was made above.
            unsafe { rdma_destroy_id(new) };
            e
        };
        if ai.ai_flags & RAI_PASSIVE as c_int != 0 {
            // SAFETY: the address from rdma_getaddrinfo (checked by rdma_bind_addr).
            if unsafe { rdma_bind_addr(new, ai.ai_src_addr) } != 0 {
                return Err(undo(errno()));
            }
            if !qp_init_attr.is_null() {
                let obj = get_id(new)?;
                // SAFETY: the caller passes a readable structure (checked non-null).
                obj.state().ep_qp = Some((pd as usize, CStruct::new(unsafe { *qp_init_attr })));
            }
        } else {
            // SAFETY: addresses from rdma_getaddrinfo (checked by rdma_resolve_addr).
            if unsafe { rdma_resolve_addr(new, ai.ai_src_addr, ai.ai_dst_addr, 2000) } != 0 {
                return Err(undo(errno()));
            }
            // SAFETY: the id was made above.
            if unsafe { rdma_resolve_route(new, 2000) } != 0 {
                return Err(undo(errno()));
            }
            if !qp_init_attr.is_null() {
                create_qp(new, pd, qp_init_attr).map_err(undo)?;
            }
        }
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *id = new };
        Ok(0)
    })
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Destroys an endpoint from [`rdma_create_ep`] (its queue pair, then the id).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(export_name = "iwarp_rdma_destroy_ep")]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: both check the id.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}

/// Rejects with private data; the ECE reason is not carried over iWARP.
///
/// # Safety
///
/// As [`rdma_reject`].
#[unsafe(export_name = "iwarp_rdma_reject_ece")]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
    _reason: u8,
) -> c_int {
    minus1_call("rdma_reject_ece", || reject(id, private_data, private_data_len))
}

symver!("IWARP_PRIVATE_1":
    iwarp_rdma_create_event_channel, iwarp_rdma_destroy_event_channel, iwarp_rdma_create_id,
    iwarp_rdma_destroy_id, iwarp_rdma_bind_addr, iwarp_rdma_resolve_addr, iwarp_rdma_resolve_route,
    iwarp_rdma_create_qp, iwarp_rdma_create_qp_ex, iwarp_rdma_destroy_qp, iwarp_rdma_connect,
    iwarp_rdma_listen, iwarp_rdma_accept, iwarp_rdma_reject, iwarp_rdma_disconnect,
    iwarp_rdma_establish, iwarp_rdma_init_qp_attr, iwarp_rdma_get_cm_event, iwarp_rdma_ack_cm_event,
    iwarp_rdma_event_str, iwarp_rdma_set_option, iwarp_rdma_notify, iwarp_rdma_migrate_id,
    iwarp_rdma_get_src_port, iwarp_rdma_get_dst_port, iwarp_rdma_get_local_addr,
    iwarp_rdma_get_peer_addr, iwarp_rdma_get_devices, iwarp_rdma_free_devices,
    iwarp_rdma_get_request, iwarp_rdma_create_ep, iwarp_rdma_destroy_ep, iwarp_rdma_reject_ece,
);
