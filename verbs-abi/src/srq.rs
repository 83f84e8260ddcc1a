//! Shared receive queues: `ibv_create_srq`, `ibv_query_srq`, `ibv_modify_srq`,
//! `ibv_destroy_srq`. Each is the engine's [`iwarp::SharedReceiveQueue`] in a protection
//! domain; queue pairs created with one take their receives from it, and `qp.rs` posts to it
//! (`ops.post_srq_recv`). Resizing and the limit event are not offered.

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use iwarp::SharedReceiveQueue;

use crate::context::{MAX_QP_WR, MAX_SGE};
use crate::ffi::{CStruct, Registry, Result, ZeroedC, errno_call, ptr_call, set_errno, zeroed};
use crate::sys::*;
use crate::verbs::{PDS, Pd};

// SAFETY: a repr(C) structure of integers, raw pointers and pthread objects (zero is their
// static initializer).
unsafe impl ZeroedC for ibv_srq {}

/// A shared receive queue.
pub struct Srq {
    c: CStruct<ibv_srq>,
    pub(crate) pd: Arc<Pd>,
    /// The engine's queue, handed to the connections of the queue pairs made with it.
    pub(crate) queue: SharedReceiveQueue,
    pub(crate) attr: ibv_srq_attr,
    /// Queue pairs using it (`ibv_destroy_srq` refuses while any do).
    pub(crate) users: AtomicUsize,
}

pub(crate) static SRQS: Registry<Srq> = Registry::new();
static NEXT_SRQ: AtomicU32 = AtomicU32::new(1);

/// Creates a shared receive queue in `pd`, its granted size written back to `attr`.
fn create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> Result<*mut ibv_srq> {
    let pd_obj = PDS.get(pd)?;
    if init.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a readable structure (checked non-null).
    let wanted = unsafe { *init };
    if wanted.attr.max_wr > MAX_QP_WR || wanted.attr.max_sge > MAX_SGE {
        return Err(libc::EINVAL);
    }
    let attr =
        ibv_srq_attr { max_wr: wanted.attr.max_wr.max(1), max_sge: wanted.attr.max_sge.max(1), srq_limit: 0 };
    // SAFETY: the caller's structure is writable: verbs returns the granted sizes in it.
    unsafe { (*init).attr = attr };
    let mut c: ibv_srq = zeroed();
    // SAFETY: reading a field of the live PD structure.
    c.context = unsafe { (*pd).context };
    c.srq_context = wanted.srq_context;
    c.pd = pd;
    c.handle = NEXT_SRQ.fetch_add(1, Ordering::Relaxed);
    pd_obj.users.fetch_add(1, Ordering::AcqRel);
    let srq = Arc::new(Srq {
        c: CStruct::new(c),
        pd: pd_obj,
        queue: SharedReceiveQueue::new(attr.max_wr as usize),
        attr,
        users: AtomicUsize::new(0),
    });
    SRQS.insert(srq.c.ptr(), srq.clone());
    Ok(srq.c.ptr())
}

/// The shared receive queue's sizes.
fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> Result<()> {
    let obj = SRQS.get(srq)?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller passes a writable structure (checked non-null).
    unsafe { attr.write(obj.attr) };
    Ok(())
}

/// Destroys a shared receive queue no queue pair uses (`EBUSY` otherwise).
fn destroy_srq(srq: *mut ibv_srq) -> Result<()> {
    let obj = SRQS.get(srq)?;
    if obj.users.load(Ordering::Acquire) > 0 {
        return Err(libc::EBUSY);
    }
    SRQS.remove(srq);
    obj.pd.users.fetch_sub(1, Ordering::AcqRel);
    Ok(())
}

/// Creates a shared receive queue (the engine's). `attr.attr` gets the sizes
/// granted; its `srq_limit` is not supported (0: no limit event).
///
/// # Safety
///
/// `attr` points to a `struct ibv_srq_init_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ptr_call("ibv_create_srq", || create_srq(pd, attr))
}

/// Resizing a shared receive queue and its limit event are not offered: `EOPNOTSUPP`
/// (`IBV_DEVICE_SRQ_RESIZE` is not among the device's flags).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(_srq: *mut ibv_srq, _attr: *mut ibv_srq_attr, _mask: c_int) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// Describes a shared receive queue: its sizes, limit 0.
///
/// # Safety
///
/// `attr` points to a writable `struct ibv_srq_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    errno_call("ibv_query_srq", || query_srq(srq, attr))
}

/// Destroys a shared receive queue; `EBUSY` while a queue pair uses it.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    errno_call("ibv_destroy_srq", || destroy_srq(srq))
}

symver!("IBVERBS_1.1": ibv_create_srq, ibv_modify_srq, ibv_query_srq, ibv_destroy_srq);
