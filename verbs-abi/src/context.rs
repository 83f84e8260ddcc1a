//! Device contexts (`ibv_open_device`; librdmacm's ids share one) and the device's limits,
//! which the queries report and the constructors of queues and queue pairs enforce.

use std::ffi::c_int;
use std::sync::Arc;

use crate::events::EventQueue;
use crate::ffi::{CStruct, Registry};
use crate::sys::*;

/// The vendor id in `ibv_query_device` (an unassigned OUI: programs that special-case
/// vendors, as perftest does for Mellanox, Chelsio and Intel, take the generic path).
pub(crate) const VENDOR_ID: u32 = 0x0069_7770;
/// The vendor part id.
pub(crate) const VENDOR_PART_ID: u32 = 1;
/// Scatter/gather elements per work request, at most.
pub(crate) const MAX_SGE: u32 = 16;
/// Work requests per queue, at most.
pub(crate) const MAX_QP_WR: u32 = 16384;
/// Completions per completion queue, at most.
pub(crate) const MAX_CQE: u32 = 1 << 20;
/// Outstanding RDMA Reads per queue pair, either way (IRD and ORD), at most.
pub(crate) const MAX_RD_ATOM: u32 = 128;
/// An open device context.
pub(crate) struct Context {
    c: CStruct<verbs_context>,
    async_events: EventQueue,
}

pub(crate) static CONTEXTS: Registry<Context> = Registry::new();

impl Context {
    /// Makes a context of a filled-in `verbs_context` and the descriptor behind its async fd,
    /// and registers it.
    pub(crate) fn register(v: verbs_context, async_events: EventQueue) -> Arc<Context> {
        let ctx = Arc::new(Context { c: CStruct::new(v), async_events });
        CONTEXTS.insert(ctx.ibv(), ctx.clone());
        ctx
    }

    /// The `ibv_context` the application holds.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        // SAFETY: a field address inside the live structure; nothing is read.
        unsafe { &raw mut (*self.c.ptr()).context }
    }

    /// The async event fd (`ibv_context::async_fd`).
    pub(crate) fn async_fd(&self) -> c_int {
        self.async_events.fd()
    }
}
