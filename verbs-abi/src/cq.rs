//! Completion channels and completion queues: `ibv_create_comp_channel`, `ibv_create_cq`,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`, and the data-path entries of `ibv_context::ops`
//! that the headers' inline `ibv_poll_cq` and `ibv_req_notify_cq` call.
//!
//! A completion queue is an [`iwarp::CompletionQueue`]. One made with a channel has a
//! notification hook ([`iwarp::CompletionQueue::set_notify_hook`]): when a completion arrives
//! on an armed queue, the hook posts the queue's number to the channel's event queue, once per
//! arming, and `ibv_get_cq_event` reads it. Destroying a queue waits until every event read
//! from its channel has been acknowledged, as rdma-core does.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use iwarp::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};

use crate::context::{CONTEXTS, Context, MAX_CQE};
use crate::events::{EventQueue, read_record};
use crate::ffi::{
    AddrMap, CStruct, Registry, Result, ZeroedC, errno_call, minus1_call, ptr_call, set_errno, zeroed,
};
use crate::runtime;
use crate::sys::*;

// SAFETY: repr(C) structures of integers, raw pointers and pthread objects (zero is their
// static initializer).
unsafe impl ZeroedC for ibv_comp_channel {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_cq {}

/// A completion channel.
pub struct CompChannel {
    c: CStruct<ibv_comp_channel>,
    queue: Arc<EventQueue>,
    /// Completion queues using it.
    cqs: AtomicUsize,
    _ctx: Arc<Context>,
}

pub(crate) static CHANNELS: Registry<CompChannel> = Registry::new();

/// A completion queue.
pub struct Cq {
    c: CStruct<ibv_cq>,
    pub(crate) cq: CompletionQueue,
    /// The number its channel events carry.
    id: u32,
    channel: Option<Arc<CompChannel>>,
    /// Events read from the channel, and acknowledged.
    events: Mutex<(u32, u32)>,
    acked: Condvar,
    /// Queue pairs using it (`ibv_destroy_cq` refuses while any do).
    pub(crate) users: AtomicUsize,
    /// The last queue pair number translated (engine's << 32 | the application's).
    last_qpn: AtomicU64,
    _ctx: Arc<Context>,
}

impl Cq {
    pub(crate) fn ibv(&self) -> *mut ibv_cq {
        self.c.ptr()
    }

    /// The application's queue pair number for a completion of the engine's `qpn`.
    fn app_qpn(&self, qpn: u32) -> u32 {
        let last = self.last_qpn.load(Ordering::Relaxed);
        let (engine, app) = ((last >> 32) as u32, (last & 0xffff_ffff) as u32);
        if engine == qpn && last != 0 {
            return app;
        }
        let app = app_qp_num(qpn).unwrap_or(qpn);
        self.last_qpn.store(u64::from(qpn) << 32 | u64::from(app), Ordering::Relaxed);
        app
    }
}

/// The application's queue pair number for each connection's engine number (a completion
/// carries the engine's; `ibv_wc::qp_num` is the application's).
static ENGINE_QPNS: RwLock<AddrMap<u32, u32>> =
    RwLock::new(AddrMap::with_hasher(std::hash::BuildHasherDefault::new()));

/// Records that the engine's queue pair `engine_qpn` is the application's `app_qpn`.
pub(crate) fn record_qp_num(engine_qpn: u32, app_qpn: u32) {
    ENGINE_QPNS.write().unwrap_or_else(PoisonError::into_inner).insert(engine_qpn, app_qpn);
}

/// Forgets the engine's queue pair `engine_qpn` (destroyed).
pub(crate) fn forget_qp_num(engine_qpn: u32) {
    ENGINE_QPNS.write().unwrap_or_else(PoisonError::into_inner).remove(&engine_qpn);
}

/// The application's number of the queue pair the engine numbers `engine_qpn`.
fn app_qp_num(engine_qpn: u32) -> Option<u32> {
    ENGINE_QPNS.read().unwrap_or_else(PoisonError::into_inner).get(&engine_qpn).copied()
}

pub(crate) static CQS: Registry<Cq> = Registry::new();
/// Completion queues by the number their events carry.
static CQ_IDS: Registry<Cq> = Registry::new();
static NEXT_CQ_ID: AtomicU32 = AtomicU32::new(1);

/// Creates a completion channel: its `fd` counts its events (`verbs-abi/src/events.rs`).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    ptr_call("ibv_create_comp_channel", || {
        let ctx = CONTEXTS.get(context)?;
        let queue = Arc::new(EventQueue::new()?);
        let mut c: ibv_comp_channel = zeroed();
        c.context = context;
        c.fd = queue.fd();
        let ch = Arc::new(CompChannel { c: CStruct::new(c), queue, cqs: AtomicUsize::new(0), _ctx: ctx });
        CHANNELS.insert(ch.c.ptr(), ch.clone());
        Ok(ch.c.ptr())
    })
}

/// Destroys a completion channel; `EBUSY` while completion queues use it.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    errno_call("ibv_destroy_comp_channel", || {
        let ch = CHANNELS.get(channel)?;
        if ch.cqs.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        CHANNELS.remove(channel);
        Ok(())
    })
}

/// Creates a completion queue of `cqe` entries (completions beyond it wait in the engine,
/// in order, until the application makes room).
///
/// # Safety
///
/// None beyond the C API's (`cq_context` is only stored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ptr_call("ibv_create_cq", || {
        let ctx = CONTEXTS.get(context)?;
        let channel = if channel.is_null() { None } else { Some(CHANNELS.get(channel)?) };
        let depth = u32::try_from(cqe).ok().filter(|&n| (1..=MAX_CQE).contains(&n)).ok_or(libc::EINVAL)?;
        if comp_vector != 0 {
            return Err(libc::EINVAL);
        }
        let rt = runtime::runtime()?;
        let cq = rt.device.create_cq(depth as usize);
        let id = NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed);
        if let Some(ch) = &channel {
            let queue = ch.queue.clone();
            cq.set_notify_hook(move || {
                queue.post(u64::from(id));
            });
            ch.cqs.fetch_add(1, Ordering::AcqRel);
        }
        let mut c: ibv_cq = zeroed();
        c.context = context;
        c.channel = channel.as_ref().map_or(std::ptr::null_mut(), |ch| ch.c.ptr());
        c.cq_context = cq_context;
        c.handle = id;
        c.cqe = cqe;
        let obj = Arc::new(Cq {
            c: CStruct::new(c),
            cq,
            id,
            channel,
            events: Mutex::new((0, 0)),
            acked: Condvar::new(),
            users: AtomicUsize::new(0),
            last_qpn: AtomicU64::new(0),
            _ctx: ctx,
        });
        CQS.insert(obj.ibv(), obj.clone());
        CQ_IDS.insert_key(id as usize, obj.clone());
        Ok(obj.ibv())
    })
}

/// Resizing: the queue keeps its size (completions beyond it wait in order anyway); the
/// new size is recorded. `EINVAL` for a size out of range.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    errno_call("ibv_resize_cq", || {
        let obj = CQS.get(cq)?;
        u32::try_from(cqe).ok().filter(|&n| (1..=MAX_CQE).contains(&n)).ok_or(libc::EINVAL)?;
        obj.c.update(|c| c.cqe = cqe);
        Ok(())
    })
}

/// Destroys a completion queue: `EBUSY` while queue pairs use it; waits until every event
/// read from its channel has been acknowledged.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    errno_call("ibv_destroy_cq", || {
        let obj = CQS.get(cq)?;
        if obj.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        let mut ev = obj.events.lock().unwrap_or_else(PoisonError::into_inner);
        while ev.1 < ev.0 {
            ev = obj.acked.wait(ev).unwrap_or_else(PoisonError::into_inner);
        }
        drop(ev);
        CQS.remove(cq);
        CQ_IDS.remove_key(obj.id as usize);
        if let Some(ch) = &obj.channel {
            ch.cqs.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    })
}

fn channel_fd(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> Result<c_int> {
    let ch = CHANNELS.get(channel)?;
    if cq.is_null() || cq_context.is_null() {
        return Err(libc::EINVAL);
    }
    Ok(ch.queue.fd())
}

/// Hands out the oldest event of `channel`, whose count was just read: false if its queue is
/// gone (the event is skipped).
fn deliver(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> Result<bool> {
    let Some(id) = CHANNELS.get(channel)?.queue.take() else { return Ok(false) };
    let Ok(obj) = usize::try_from(id).map_err(|_| libc::EINVAL).and_then(|k| CQ_IDS.get_key(k)) else {
        return Ok(false);
    };
    obj.events.lock().unwrap_or_else(PoisonError::into_inner).0 += 1;
    let c = obj.c.read();
    // SAFETY: both pointers were checked non-null; the caller passes writable pointers.
    unsafe {
        *cq = obj.ibv();
        *cq_context = c.cq_context;
    }
    Ok(true)
}

/// Waits for the next completion event on `channel`: blocks in `read` on the channel's
/// descriptor (a cancellation point) unless the application made it non-blocking (then -1,
/// `EAGAIN`). Each event must be acknowledged with [`ibv_ack_cq_events`].
///
/// # Safety
///
/// `cq` and `cq_context` point to writable pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let fd = match channel_fd(channel, cq, cq_context) {
        Ok(fd) => fd,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    loop {
        // No value with a destructor is live here: a cancelled read unwinds through.
        if let Err(e) = read_record(fd) {
            set_errno(e);
            return -1;
        }
        match minus1_call("ibv_get_cq_event", || deliver(channel, cq, cq_context).map(c_int::from)) {
            1 => return 0,
            0 => continue,
            _ => return -1,
        }
    }
}

/// Acknowledges `nevents` events of `cq` read with [`ibv_get_cq_event`].
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    let _ = errno_call("ibv_ack_cq_events", || {
        let obj = CQS.get(cq)?;
        let mut ev = obj.events.lock().unwrap_or_else(PoisonError::into_inner);
        ev.1 = ev.1.wrapping_add(nevents);
        let acked = ev.1;
        drop(ev);
        obj.c.update(|c| c.comp_events_completed = acked);
        obj.acked.notify_all();
        Ok(())
    });
}

fn wc_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        WcStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        WcStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        WcStatus::WrFlushError => IBV_WC_WR_FLUSH_ERR,
    }
}

fn wc_opcode(o: WcOpcode) -> ibv_wc_opcode {
    match o {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::Write | WcOpcode::ImmediateData => IBV_WC_RDMA_WRITE,
        WcOpcode::Read => IBV_WC_RDMA_READ,
        WcOpcode::Atomic => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvImmediate => IBV_WC_RECV_RDMA_WITH_IMM,
        WcOpcode::LocalInvalidate => IBV_WC_LOCAL_INV,
        WcOpcode::FastRegister => IBV_WC_DRIVER1,
        WcOpcode::BindWindow => IBV_WC_BIND_MW,
    }
}

/// A completion as `struct ibv_wc`.
fn to_ibv(cq: &Cq, wc: &WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    let mut extra = 0u32;
    if let Some(stag) = wc.invalidated {
        flags |= IBV_WC_WITH_INV;
        extra = stag.0;
    }
    if let Some(imm) = wc.imm_data {
        flags |= IBV_WC_WITH_IMM;
        extra = u32::from_ne_bytes([imm[4], imm[5], imm[6], imm[7]]);
    }
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc_status(wc.status),
        opcode: wc_opcode(wc.opcode),
        vendor_err: 0,
        byte_len: u32::try_from(wc.byte_len).unwrap_or(u32::MAX),
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 { invalidated_rkey: extra },
        qp_num: cq.app_qpn(wc.qp_num),
        src_qp: 0,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

std::thread_local! {
    /// When this thread's `ibv_poll_cq` calls started finding nothing (`None`: the last one
    /// found a completion). Kept per thread, not per queue: a thread that polls a send and a
    /// receive queue in turn, one of them busy, never counts as idle.
    static IDLE_SINCE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// The longest an idle poller sleeps in one queue: a program polling several queues in turn
/// sees another queue's completion at most this late after a quiet spell.
const IDLE_NAP: Duration = Duration::from_micros(200);

/// Completions `poll_cq` takes from the queue per lock (perftest polls 16 at a time).
const POLL_BATCH: usize = 16;

/// `ops.poll_cq`: up to `num_entries` completions into `wc`; their number, or -1.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    minus1_call("ibv_poll_cq", || {
        let obj = CQS.get(cq)?;
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return Err(libc::EINVAL);
        }
        let mut n = 0;
        let mut drove = false;
        // Taken in batches, one lock of the queue each (`CompletionQueue::poll_many`).
        let mut batch = [WorkCompletion::default(); POLL_BATCH];
        while n < num_entries {
            let want = usize::try_from(num_entries - n).unwrap_or(0).min(POLL_BATCH);
            let mut got = obj.cq.poll_many(&mut batch[..want]);
            // Whether this turn's completion came from a wait (after which the queue is looked
            // at once more rather than taken for empty).
            let mut waited = false;
            if got == 0 {
                // Nothing yet: a program that polls in a loop spins on a core the engine needs
                // (perftest's client and server both do). Run the engine's pass here, unless
                // its thread (or another poller) is in one, and look once more. A pass that
                // found nothing to do gives the core up for a moment: on a machine with fewer
                // cores than spinning threads, the engine threads (this process's and the
                // peer's) then run instead of waiting for the poller's time slice to end. A
                // thread that has found nothing for `IWARP_POLL_IDLE_US` sleeps in the queue
                // until a completion comes (or briefly, see IDLE_NAP) instead: a program
                // waiting out a long transfer in a poll loop (perftest's server) then leaves
                // its core to the engines.
                if n > 0 || drove {
                    break;
                }
                drove = true;
                let Ok(rt) = runtime::runtime() else { continue };
                if let Some(idle) = rt.config.poll_idle
                    && IDLE_SINCE.get().is_some_and(|since| since.elapsed() >= idle)
                {
                    let Some(done) = obj.cq.wait(IDLE_NAP) else { continue };
                    batch[0] = done;
                    (got, waited) = (1, true);
                } else {
                    if !rt.device.try_progress() {
                        std::thread::yield_now();
                    }
                    continue;
                }
            }
            for done in &batch[..got] {
                // SAFETY: the caller's array has `num_entries` writable entries; n is below
                // (got is at most num_entries - n).
                unsafe { wc.add(n as usize).write(to_ibv(&obj, done)) };
                n += 1;
            }
            if got < want && !waited {
                break;
            }
        }
        if n > 0 {
            IDLE_SINCE.set(None);
        } else if num_entries > 0 && IDLE_SINCE.get().is_none() {
            IDLE_SINCE.set(Some(Instant::now()));
        }
        Ok(n)
    })
}

/// `ops.req_notify_cq`: arms the queue for one event on its channel.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    errno_call("ibv_req_notify_cq", || {
        let obj = CQS.get(cq)?;
        obj.cq.req_notify(solicited_only != 0);
        Ok(())
    })
}

/// Completion events read and acknowledged (for tests).
#[doc(hidden)]
pub fn events_of(cq: *mut ibv_cq) -> Option<(u32, u32)> {
    CQS.get(cq).ok().map(|o| *o.events.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The name of a completion status.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const std::ffi::c_char {
    crate::ffi::cstr(match status {
        IBV_WC_SUCCESS => c"success",
        IBV_WC_LOC_LEN_ERR => c"local length error",
        IBV_WC_LOC_QP_OP_ERR => c"local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => c"local EE context operation error",
        IBV_WC_LOC_PROT_ERR => c"local protection error",
        IBV_WC_WR_FLUSH_ERR => c"Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => c"memory management operation error",
        IBV_WC_BAD_RESP_ERR => c"bad response error",
        IBV_WC_LOC_ACCESS_ERR => c"local access error",
        IBV_WC_REM_INV_REQ_ERR => c"remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => c"remote access error",
        IBV_WC_REM_OP_ERR => c"remote operation error",
        IBV_WC_RETRY_EXC_ERR => c"transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => c"RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => c"local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => c"remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => c"aborted error",
        IBV_WC_INV_EECN_ERR => c"invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => c"invalid EE context state",
        IBV_WC_FATAL_ERR => c"fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => c"response timeout error",
        IBV_WC_GENERAL_ERR => c"general error",
        _ => c"unknown",
    })
}

symver!("IBVERBS_1.0": ibv_create_comp_channel, ibv_destroy_comp_channel);
symver!("IBVERBS_1.1":
    ibv_create_cq, ibv_resize_cq, ibv_destroy_cq, ibv_get_cq_event, ibv_ack_cq_events, ibv_wc_status_str,
);
