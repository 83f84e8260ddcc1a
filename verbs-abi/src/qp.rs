//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, and the
//! data path the headers' inline `ibv_post_send` and `ibv_post_recv` reach through
//! `ibv_context::ops`.
//!
//! A queue pair exists before its connection (verbs creates it, then rdma_cm connects it):
//! receives posted before then are kept and handed to the connection manager, which posts
//! them before the connection goes live ([`iwarp::ConnectOptions::recv`]); once connected,
//! work goes straight to the [`iwarp::QueuePair`]. Each work request is checked when posted:
//! its opcode, its number of scatter/gather elements, and every element's lkey, protection
//! domain and bounds; a failure returns the error number with `*bad_wr` at the request that
//! failed, the requests before it posted.
//!
//! A queue pair created with a shared receive queue (`srq.rs`) hands it to the connection
//! manager, and the engine takes the next buffer from it for each Send that arrives
//! (`ops.post_srq_recv` posts to it here, checked as `ibv_post_recv` checks). The engine
//! checks a receive's buffer against the queue pair's protection domain, so a queue pair's
//! shared receive queue must be in its domain (`EINVAL` otherwise).

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use iwarp::{Access, MemoryRegion, PostError, QpState, QueuePair, RecvWr, STag, SendOp, SendWr, Sge, Sgl};

use crate::context::{MAX_QP_WR, MAX_SGE};
use crate::cq::{CQS, Cq};
use crate::ffi::{CStruct, Registry, Result, ZeroedC, errno_call, ptr_call, set_errno, zeroed};
use crate::srq::{SRQS, Srq};
use crate::sys::*;
use crate::verbs::{PDS, Pd, lookup_lkey};

// SAFETY: repr(C) structures of integers, raw pointers and pthread objects (zero is their
// static initializer).
unsafe impl ZeroedC for ibv_qp {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_context_ops {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_qp_attr {}

/// Bytes of inline data a send work request may carry.
pub const MAX_INLINE: u32 = 256;

/// A queue pair.
pub struct Qp {
    c: CStruct<ibv_qp>,
    /// The number the application sees (`qp->qp_num`).
    pub(crate) qp_num: u32,
    pub(crate) pd: Arc<Pd>,
    pub(crate) send_cq: Arc<Cq>,
    pub(crate) recv_cq: Arc<Cq>,
    /// The capabilities granted.
    pub(crate) caps: ibv_qp_cap,
    sq_sig_all: bool,
    /// The connection, once made.
    live: OnceLock<QueuePair>,
    /// Receives posted before the connection.
    pending: Mutex<Vec<RecvWr>>,
    /// Where inline data is copied: one slot of `caps.max_inline_data` bytes per send queue
    /// entry, reused round robin (a slot is free again once `max_send_wr` later requests
    /// have been posted, since the send queue holds no more).
    inline: Option<(MemoryRegion, AtomicUsize)>,
    /// The shared receive queue its receives come from, if any.
    pub(crate) srq: Option<Arc<Srq>>,
}

pub(crate) static QPS: Registry<Qp> = Registry::new();
/// Queue pairs by the application's number (rdma_cm's `conn_param.qp_num`).
static QP_NUMS: Registry<Qp> = Registry::new();
static NEXT_QP_NUM: AtomicU32 = AtomicU32::new(0x100);

/// What else runs when a queue pair is destroyed: the connection manager, once it has made
/// an id, clears the id that held the queue pair (see [`on_destroy`]).
static ON_DESTROY: OnceLock<fn(*mut ibv_qp)> = OnceLock::new();

/// Sets what runs with every `ibv_destroy_qp` (once; later calls keep the first).
pub(crate) fn on_destroy(hook: fn(*mut ibv_qp)) {
    let _ = ON_DESTROY.set(hook);
}

/// The queue pair the application numbers `qp_num`.
pub(crate) fn by_num(qp_num: u32) -> Result<Arc<Qp>> {
    QP_NUMS.get_key(qp_num as usize)
}

/// The queue pair behind `qp`.
pub(crate) fn get(qp: *mut ibv_qp) -> Result<Arc<Qp>> {
    QPS.get(qp)
}

impl Qp {
    pub(crate) fn ibv(&self) -> *mut ibv_qp {
        self.c.ptr()
    }

    /// The connection, if made.
    pub(crate) fn connection(&self) -> Option<&QueuePair> {
        self.live.get()
    }

    /// Takes the receives posted so far, for the connection manager to post first.
    pub(crate) fn take_pending(&self) -> Vec<RecvWr> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts receives back (the connection failed).
    pub(crate) fn restore_pending(&self, mut recvs: Vec<RecvWr>) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        recvs.append(&mut p);
        *p = recvs;
    }

    /// The connection is up: later work goes to `qp`; receives posted meanwhile follow the
    /// ones the connection manager posted. `on_down` runs (maybe more than once) when the
    /// connection leaves RTS.
    pub(crate) fn go_live(self: &Arc<Qp>, qp: QueuePair, on_down: Box<dyn Fn() + Send + Sync>) -> Result<()> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        crate::cq::record_qp_num(qp.qp_num(), self.qp_num);
        let weak: Weak<Qp> = Arc::downgrade(self);
        qp.on_state_change(move |state| {
            if state != QpState::Rts {
                if let Some(q) = weak.upgrade() {
                    q.c.update(|c| c.state = IBV_QPS_ERR);
                }
                on_down();
            }
        });
        let later = std::mem::take(&mut *pending);
        if !later.is_empty()
            && let Err(e) = qp.post_recv_list(later)
        {
            tracing::debug!(error = %e, "receives posted during the connection's setup refused");
        }
        self.live.set(qp).map_err(|_| libc::EINVAL)?;
        self.c.update(|c| {
            if c.state != IBV_QPS_ERR {
                c.state = IBV_QPS_RTS;
            }
        });
        Ok(())
    }

    /// Sets the state the application sees.
    pub(crate) fn set_state(&self, state: ibv_qp_state) {
        self.c.update(|c| c.state = state);
    }
}

/// Creates a reliable-connected queue pair (the only type iWARP has).
///
/// # Safety
///
/// `qp_init_attr` points to a `struct ibv_qp_init_attr`; its `cap` is updated with what was
/// granted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ptr_call("ibv_create_qp", || create(pd, qp_init_attr))
}

pub(crate) fn create(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> Result<*mut ibv_qp> {
    let pd_obj = PDS.get(pd)?;
    if qp_init_attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a readable structure (checked non-null).
    let attr = unsafe { *qp_init_attr };
    if attr.qp_type != IBV_QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    let srq = if attr.srq.is_null() {
        None
    } else {
        let srq = SRQS.get(attr.srq)?;
        if !Arc::ptr_eq(&srq.pd, &pd_obj) {
            return Err(libc::EINVAL);
        }
        Some(srq)
    };
    let send_cq = CQS.get(attr.send_cq)?;
    let recv_cq = CQS.get(attr.recv_cq)?;
    let cap = attr.cap;
    if cap.max_send_wr > MAX_QP_WR
        || cap.max_recv_wr > MAX_QP_WR
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    // With a shared receive queue, the queue pair has no receive queue of its own.
    let own_recv = u32::from(srq.is_none());
    let caps = ibv_qp_cap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1) * own_recv,
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1) * own_recv,
        max_inline_data: cap.max_inline_data,
    };
    let inline = if caps.max_inline_data > 0 {
        let bytes = caps.max_inline_data as usize * caps.max_send_wr as usize;
        let mr = pd_obj.pd.register(bytes, Access::NONE).map_err(|_| libc::ENOMEM)?;
        Some((mr, AtomicUsize::new(0)))
    } else {
        None
    };
    // SAFETY: the caller's structure is writable: verbs returns the granted caps in it.
    unsafe { (*qp_init_attr).cap = caps };
    let qp_num = NEXT_QP_NUM.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
    let mut c: ibv_qp = zeroed();
    // SAFETY: reading a field of the live PD structure.
    c.context = unsafe { (*pd).context };
    c.qp_context = attr.qp_context;
    c.pd = pd;
    c.send_cq = attr.send_cq;
    c.recv_cq = attr.recv_cq;
    c.srq = attr.srq;
    c.handle = qp_num;
    c.qp_num = qp_num;
    c.state = IBV_QPS_RESET;
    c.qp_type = IBV_QPT_RC;
    pd_obj.users.fetch_add(1, Ordering::AcqRel);
    send_cq.users.fetch_add(1, Ordering::AcqRel);
    recv_cq.users.fetch_add(1, Ordering::AcqRel);
    if let Some(srq) = &srq {
        srq.users.fetch_add(1, Ordering::AcqRel);
    }
    let qp = Arc::new(Qp {
        c: CStruct::new(c),
        qp_num,
        pd: pd_obj,
        send_cq,
        recv_cq,
        caps,
        sq_sig_all: attr.sq_sig_all != 0,
        live: OnceLock::new(),
        pending: Mutex::new(Vec::new()),
        inline,
        srq,
    });
    QPS.insert(qp.ibv(), qp.clone());
    QP_NUMS.insert_key(qp_num as usize, qp.clone());
    Ok(qp.ibv())
}

/// Changes the queue pair's state. iWARP queue pairs are connected by rdma_cm, so the
/// states before RTS are recorded only; moving a connected queue pair to ERR closes its
/// connection, flushing the outstanding work (`IBV_WC_WR_FLUSH_ERR`).
///
/// # Safety
///
/// `attr` points to a `struct ibv_qp_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    errno_call("ibv_modify_qp", || {
        let obj = QPS.get(qp)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a readable structure.
        let a = unsafe { *attr };
        if attr_mask & IBV_QP_STATE as c_int != 0 {
            match a.qp_state {
                IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS => {
                    if obj.connection().is_none() || a.qp_state == IBV_QPS_RTS {
                        obj.set_state(a.qp_state);
                    }
                }
                IBV_QPS_ERR => {
                    if let Some(q) = obj.connection() {
                        q.disconnect();
                    }
                    obj.set_state(IBV_QPS_ERR);
                }
                IBV_QPS_SQD | IBV_QPS_SQE => return Err(libc::EOPNOTSUPP),
                _ => return Err(libc::EINVAL),
            }
        }
        Ok(())
    })
}

/// Describes the queue pair.
///
/// # Safety
///
/// `attr` and `init_attr` point to writable structures.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    errno_call("ibv_query_qp", || {
        let obj = QPS.get(qp)?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let c = obj.c.read();
        let params = obj.connection().map(|q| q.conn_params());
        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = c.state;
        a.cur_qp_state = c.state;
        a.path_mtu = IBV_MTU_1024;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        a.cap = obj.caps;
        a.port_num = 1;
        a.max_rd_atomic = params.map_or(0, |p| p.ord.min(255) as u8);
        a.max_dest_rd_atomic = params.map_or(0, |p| p.ird.min(255) as u8);
        // SAFETY: the caller passes writable structures (checked non-null).
        unsafe {
            attr.write(a);
            init_attr.write(ibv_qp_init_attr {
                qp_context: c.qp_context,
                send_cq: c.send_cq,
                recv_cq: c.recv_cq,
                srq: c.srq,
                cap: obj.caps,
                qp_type: IBV_QPT_RC,
                sq_sig_all: c_int::from(obj.sq_sig_all),
            });
        }
        Ok(())
    })
}

/// Destroys the queue pair, closing its connection (outstanding work is flushed).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    errno_call("ibv_destroy_qp", || destroy(qp))
}

pub(crate) fn destroy(qp: *mut ibv_qp) -> Result<()> {
    let obj = QPS.remove(qp).ok_or(libc::EINVAL)?;
    QP_NUMS.remove_key(obj.qp_num as usize);
    if let Some(q) = obj.connection() {
        q.disconnect();
        crate::cq::forget_qp_num(q.qp_num());
    }
    if let Some(hook) = ON_DESTROY.get() {
        hook(qp);
    }
    obj.pd.users.fetch_sub(1, Ordering::AcqRel);
    obj.send_cq.users.fetch_sub(1, Ordering::AcqRel);
    obj.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
    if let Some(srq) = &obj.srq {
        srq.users.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// Extended queue pairs (the `ibv_wr_*` API) are not offered: NULL.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    std::ptr::null_mut()
}

/// Whether data of `op` is placed in order: no guarantee is given (0).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    0
}

/// Checks a list of `n` elements against the queue pair's protection domain; the list.
fn sgl(pd: &Pd, list: *const ibv_sge, n: c_int, max: u32, local_write: bool) -> Result<Sgl> {
    let n = u32::try_from(n).map_err(|_| libc::EINVAL)?;
    if n > max || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut out = Sgl::new();
    for i in 0..n as usize {
        // SAFETY: the work request's list has `num_sge` readable elements (checked non-null).
        let e = unsafe { *list.add(i) };
        if e.length == 0 {
            continue;
        }
        let key = lookup_lkey(e.lkey).ok_or(libc::EINVAL)?;
        let end = e.addr.checked_add(u64::from(e.length)).ok_or(libc::EINVAL)?;
        if key.pd != pd.ibv() as usize || e.addr < key.base || end > key.base + key.len {
            return Err(libc::EINVAL);
        }
        if local_write && !key.local_write {
            return Err(libc::EINVAL);
        }
        out.push(Sge { lkey: STag(e.lkey), addr: e.addr, len: e.length });
    }
    Ok(out)
}

/// Copies a request's inline data into the queue pair's inline region; the element naming
/// it.
fn inline_data(qp: &Qp, wr: &ibv_send_wr) -> Result<Sgl> {
    let n = u32::try_from(wr.num_sge).map_err(|_| libc::EINVAL)?;
    if n > qp.caps.max_send_sge || (n > 0 && wr.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut total = 0usize;
    for i in 0..n as usize {
        // SAFETY: the list has `num_sge` readable elements (checked non-null).
        total += unsafe { (*wr.sg_list.add(i)).length } as usize;
    }
    if total == 0 {
        return Ok(Sgl::new());
    }
    let Some((mr, next)) = &qp.inline else { return Err(libc::EINVAL) };
    let size = qp.caps.max_inline_data as usize;
    if total > size {
        return Err(libc::EINVAL);
    }
    let slot = next.fetch_add(1, Ordering::Relaxed) % qp.caps.max_send_wr as usize;
    let mut data = Vec::with_capacity(total);
    for i in 0..n as usize {
        // SAFETY: the list has `num_sge` readable elements.
        let e = unsafe { *wr.sg_list.add(i) };
        if e.length > 0 {
            let addr = usize::try_from(e.addr).map_err(|_| libc::EINVAL)?;
            // SAFETY: inline data is read from the application's memory at post time: each
            // element names `length` readable bytes at `addr` (no lkey needed).
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, e.length as usize) };
            data.extend_from_slice(bytes);
        }
    }
    mr.write(slot * size, &data).map_err(|_| libc::EINVAL)?;
    let len = u32::try_from(total).map_err(|_| libc::EINVAL)?;
    Ok(mr.sge(slot * size, len).into())
}

/// A send work request as the engine takes it.
fn send_wr(qp: &Qp, wr: &ibv_send_wr) -> Result<SendWr> {
    let flags = wr.send_flags;
    let solicited = flags & IBV_SEND_SOLICITED != 0;
    // SAFETY: reading the union member the opcode selects (plain integers either way).
    let (remote_addr, rkey) = unsafe { (wr.wr.rdma.remote_addr, wr.wr.rdma.rkey) };
    // SAFETY: as above (a u32 either way).
    let invalidate_rkey = unsafe { wr.__bindgen_anon_1.invalidate_rkey };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send { solicited, invalidate: None },
        IBV_WR_SEND_WITH_INV => SendOp::Send { solicited, invalidate: Some(STag(invalidate_rkey)) },
        IBV_WR_RDMA_WRITE => SendOp::Write { remote_stag: STag(rkey), remote_to: remote_addr },
        IBV_WR_RDMA_READ => SendOp::Read { remote_stag: STag(rkey), remote_to: remote_addr },
        IBV_WR_LOCAL_INV => SendOp::LocalInvalidate { stag: STag(invalidate_rkey) },
        // Immediate data and atomics need RFC 7306, which rdma_cm cannot negotiate (siw
        // does not take it); memory windows, TSO and driver opcodes do not exist here.
        _ => return Err(libc::EINVAL),
    };
    let is_read = matches!(op, SendOp::Read { .. });
    let sgl = if flags & IBV_SEND_INLINE != 0 && !is_read {
        inline_data(qp, wr)?
    } else if matches!(op, SendOp::LocalInvalidate { .. }) {
        Sgl::new()
    } else {
        sgl(&qp.pd, wr.sg_list, wr.num_sge, qp.caps.max_send_sge, is_read)?
    };
    if is_read && sgl.len() != 1 {
        return Err(libc::EINVAL);
    }
    Ok(SendWr { wr_id: wr.wr_id, op, sgl, signaled: qp.sq_sig_all || flags & IBV_SEND_SIGNALED != 0 })
}

fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// `ops.post_send`: posts a list of send work requests.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let mut bad = wr;
    let rc = errno_call("ibv_post_send", || {
        let obj = QPS.get(qp)?;
        let mut wrs = Vec::new();
        let mut ptrs = Vec::new();
        let mut failed = None;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid NULL-terminated list of work requests.
            let w = unsafe { &*cur };
            match send_wr(&obj, w) {
                Ok(s) => {
                    wrs.push(s);
                    ptrs.push(cur);
                }
                Err(e) => {
                    failed = Some((cur, e));
                    break;
                }
            }
            cur = w.next;
        }
        if !wrs.is_empty() {
            let Some(q) = obj.connection() else {
                bad = wr;
                return Err(libc::EINVAL);
            };
            if let Err(e) = q.post_send_list(wrs) {
                bad = ptrs.get(e.posted).copied().unwrap_or(wr);
                return Err(post_errno(e.error));
            }
        }
        if let Some((at, e)) = failed {
            bad = at;
            return Err(e);
        }
        Ok(())
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *bad_wr = bad };
    }
    rc
}

/// `ops.post_recv`: posts a list of receive work requests.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut bad = wr;
    let rc = errno_call("ibv_post_recv", || {
        let obj = QPS.get(qp)?;
        if obj.srq.is_some() {
            // Its receives come from its shared receive queue.
            return Err(libc::EINVAL);
        }
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid NULL-terminated list of work requests.
            let w = unsafe { &*cur };
            bad = cur;
            let sgl = sgl(&obj.pd, w.sg_list, w.num_sge, obj.caps.max_recv_sge, true)?;
            let r = RecvWr { wr_id: w.wr_id, sgl };
            match obj.connection() {
                Some(q) => q.post_recv(r).map_err(post_errno)?,
                None => {
                    let mut pending = obj.pending.lock().unwrap_or_else(PoisonError::into_inner);
                    // The connection may have come up while this thread waited for the lock.
                    if let Some(q) = obj.connection() {
                        drop(pending);
                        q.post_recv(r).map_err(post_errno)?;
                    } else {
                        if pending.len() >= obj.caps.max_recv_wr as usize {
                            return Err(libc::ENOMEM);
                        }
                        pending.push(r);
                    }
                }
            }
            cur = w.next;
        }
        Ok(())
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *bad_wr = bad };
    }
    rc
}

/// `ops.post_srq_recv`: posts a list of receive work requests to a shared receive queue.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut bad = wr;
    let rc = errno_call("ibv_post_srq_recv", || {
        let obj = SRQS.get(srq)?;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller passes a valid NULL-terminated list of work requests.
            let w = unsafe { &*cur };
            bad = cur;
            let sgl = sgl(&obj.pd, w.sg_list, w.num_sge, obj.attr.max_sge, true)?;
            obj.queue.post_recv(RecvWr { wr_id: w.wr_id, sgl }).map_err(post_errno)?;
            cur = w.next;
        }
        Ok(())
    });
    if rc != 0 && !bad_wr.is_null() {
        // SAFETY: the caller passes a writable pointer (checked non-null).
        unsafe { *bad_wr = bad };
    }
    rc
}

/// `ops.alloc_mw`: memory windows are not offered.
unsafe extern "C" fn alloc_mw(_pd: *mut ibv_pd, _type: ibv_mw_type) -> *mut ibv_mw {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ops.bind_mw`: see [`alloc_mw`].
unsafe extern "C" fn bind_mw(_qp: *mut ibv_qp, _mw: *mut ibv_mw, _bind: *mut ibv_mw_bind) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// `ops.dealloc_mw`: see [`alloc_mw`].
unsafe extern "C" fn dealloc_mw(_mw: *mut ibv_mw) -> c_int {
    set_errno(libc::EINVAL);
    libc::EINVAL
}

/// The operations table of every context: what the headers' inline functions call.
pub(crate) fn context_ops() -> ibv_context_ops {
    let mut ops: ibv_context_ops = zeroed();
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    ops
}

symver!("IBVERBS_1.1": ibv_create_qp, ibv_modify_qp, ibv_query_qp, ibv_destroy_qp);
symver!("IBVERBS_1.6": ibv_qp_to_qp_ex);
symver!("IBVERBS_1.14": ibv_query_qp_data_in_order);
