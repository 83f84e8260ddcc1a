//! Protection domains and memory regions (`ibv_alloc_pd`, `ibv_reg_mr`, ...), and the verbs
//! this device does not offer (address handles, multicast, imports), which fail the
//! documented way.
//!
//! A region is registered over the application's own memory, in place, with the buffer's
//! address (or the `iova` of `ibv_reg_mr_iova2`) as the tagged offset peers use, through
//! [`iwarp::ProtectionDomain::register_memory_at`]. Its lkey is also recorded here, so that a
//! work request naming an unknown lkey, another protection domain's region, or bytes outside
//! the region is refused when posted (`EINVAL`) rather than failing later.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use iwarp::{Access, MemoryRegion, ProtectionDomain, RegionMemory};

use crate::context::{CONTEXTS, Context};
use crate::ffi::{AddrMap, CStruct, Registry, Result, ZeroedC, errno_call, ptr_call, set_errno, zeroed};
use crate::runtime;
use crate::sys::*;

// SAFETY: repr(C) structures of integers and raw pointers.
unsafe impl ZeroedC for ibv_pd {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_mr {}

/// A protection domain.
pub struct Pd {
    c: CStruct<ibv_pd>,
    pub(crate) pd: ProtectionDomain,
    /// Memory regions and queue pairs using it (`ibv_dealloc_pd` refuses while any do).
    pub(crate) users: AtomicUsize,
    _ctx: Arc<Context>,
}

impl Pd {
    pub(crate) fn ibv(&self) -> *mut ibv_pd {
        self.c.ptr()
    }
}

pub(crate) static PDS: Registry<Pd> = Registry::new();

/// A registered memory region.
pub struct Mr {
    c: CStruct<ibv_mr>,
    mr: Mutex<Option<MemoryRegion>>,
    pd: Arc<Pd>,
}

static MRS: Registry<Mr> = Registry::new();

/// What a work request's scatter/gather element is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalKey {
    /// The protection domain (its `ibv_pd` address).
    pub(crate) pd: usize,
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) local_write: bool,
}

/// The live regions by lkey.
static LKEYS: RwLock<AddrMap<u32, LocalKey>> =
    RwLock::new(AddrMap::with_hasher(std::hash::BuildHasherDefault::new()));

/// The region `lkey` names, if one is registered.
pub(crate) fn lookup_lkey(lkey: u32) -> Option<LocalKey> {
    LKEYS.read().unwrap_or_else(PoisonError::into_inner).get(&lkey).copied()
}

/// Allocates a protection domain.
///
/// # Safety
///
/// None beyond the C API's: the context pointer is checked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    ptr_call("ibv_alloc_pd", || {
        let ctx = CONTEXTS.get(context)?;
        let rt = runtime::runtime()?;
        let mut c: ibv_pd = zeroed();
        c.context = context;
        let pd = Arc::new(Pd {
            c: CStruct::new(c),
            pd: rt.device.alloc_pd(),
            users: AtomicUsize::new(0),
            _ctx: ctx,
        });
        pd.c.update(|c| c.handle = NEXT_PD.fetch_add(1, Ordering::Relaxed));
        PDS.insert(pd.ibv(), pd.clone());
        Ok(pd.ibv())
    })
}

static NEXT_PD: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// Frees a protection domain; `EBUSY` while regions or queue pairs use it.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    errno_call("ibv_dealloc_pd", || {
        let obj = PDS.get(pd)?;
        if obj.users.load(Ordering::Acquire) > 0 {
            return Err(libc::EBUSY);
        }
        PDS.remove(pd);
        Ok(())
    })
}

/// The access flags this device takes (the rest of the optional range is ignored).
const ACCESS_KNOWN: c_uint = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_MW_BIND
    | IBV_ACCESS_HUGETLB
    | IBV_ACCESS_RELAXED_ORDERING;
/// rdma-core's optional access flags (a device may ignore them): bits 20 and up.
const ACCESS_OPTIONAL: c_uint = !((1 << 20) - 1);

fn access(flags: c_uint) -> Result<Access> {
    if flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if flags & !(ACCESS_KNOWN | ACCESS_OPTIONAL) != 0 {
        return Err(libc::EINVAL);
    }
    let has = |f: c_uint| flags & f != 0;
    // Verbs: remote write and atomic access need local write.
    if (has(IBV_ACCESS_REMOTE_WRITE) || has(IBV_ACCESS_REMOTE_ATOMIC)) && !has(IBV_ACCESS_LOCAL_WRITE) {
        return Err(libc::EINVAL);
    }
    let mut a = Access::NONE;
    for (bit, right) in [
        (IBV_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if has(bit) {
            a = a.union(right);
        }
    }
    Ok(a)
}

fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    flags: c_uint,
) -> Result<*mut ibv_mr> {
    let pd_obj = PDS.get(pd)?;
    let rights = access(flags)?;
    if addr.is_null() || length == 0 || u32::try_from(length).is_err() {
        return Err(libc::EINVAL);
    }
    if iova.checked_add(length as u64).is_none() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the ibv_reg_mr contract: `length` bytes at `addr` are the caller's memory and
    // stay allocated until the region is deregistered; the caller accesses them only as the
    // RDMA contract allows (see RegionMemory::from_raw_parts and docs/verbs-abi.md).
    let memory = unsafe { RegionMemory::from_raw_parts(addr.cast(), length) };
    let mr = pd_obj.pd.register_memory_at(memory, rights, iova).map_err(|e| {
        tracing::debug!(error = %e, "ibv_reg_mr refused");
        libc::ENOMEM
    })?;
    let key = mr.lkey().0;
    let mut c: ibv_mr = zeroed();
    // SAFETY: reading a field of the live PD structure.
    c.context = unsafe { (*pd).context };
    c.pd = pd;
    c.addr = addr;
    c.length = length as size_t;
    c.handle = key;
    c.lkey = key;
    c.rkey = key;
    let local = LocalKey { pd: pd as usize, base: iova, len: length as u64, local_write: rights.local_write };
    pd_obj.users.fetch_add(1, Ordering::AcqRel);
    let obj = Arc::new(Mr { c: CStruct::new(c), mr: Mutex::new(Some(mr)), pd: pd_obj });
    LKEYS.write().unwrap_or_else(PoisonError::into_inner).insert(key, local);
    MRS.insert(obj.c.ptr(), obj.clone());
    Ok(obj.c.ptr())
}

/// Registers `length` bytes at `addr` (the tagged offset of byte 0 is `addr`).
///
/// # Safety
///
/// `[addr, addr + length)` is memory of the caller's that stays allocated until the region
/// is deregistered, which the caller reads and writes only as the RDMA contract allows
/// (not while a posted work request or a peer may access it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr", || reg_mr(pd, addr, length, addr as u64, access as c_uint))
}

/// Registers memory with the tagged offset of byte 0 at `iova`.
///
/// # Safety
///
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr_iova", || reg_mr(pd, addr, length, iova, access as c_uint))
}

/// Registers memory with the tagged offset of byte 0 at `iova` (what the headers' `ibv_reg_mr`
/// macro calls when the access flags are not constants).
///
/// # Safety
///
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    ptr_call("ibv_reg_mr_iova2", || reg_mr(pd, addr, length, iova, access))
}

/// Registers a dma-buf: not supported (NULL, `EOPNOTSUPP`).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Deregisters a region. Waits for an engine pass that may be placing into it; a message
/// still arriving for it is terminated.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_call("ibv_dereg_mr", || {
        let obj = MRS.remove(mr).ok_or(libc::EINVAL)?;
        let region = obj.mr.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(region) = region {
            LKEYS.write().unwrap_or_else(PoisonError::into_inner).remove(&region.lkey().0);
            if let Err((region, e)) = region.deregister() {
                tracing::debug!(error = %e, "deregistration refused; dropping the handle");
                drop(region);
            }
        }
        obj.pd.users.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    })
}

/// Re-registration: not supported (-1, `EOPNOTSUPP`).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// Address handles are for unreliable datagrams, which iWARP does not have: NULL,
/// `EOPNOTSUPP`.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(_pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_create_ah`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    _pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _port_num: u8,
) -> *mut ibv_ah {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_create_ah`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    _context: *mut ibv_context,
    _port_num: u8,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _ah_attr: *mut ibv_ah_attr,
) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// No address handle exists: `EINVAL`.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    set_errno(libc::EINVAL);
    libc::EINVAL
}

/// Multicast is for unreliable datagrams: `EOPNOTSUPP`.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// See [`ibv_attach_mcast`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// Importing another process's objects needs a kernel device: NULL, `EOPNOTSUPP`.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_import_pd(_context: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_import_dm(_context: *mut ibv_context, _handle: u32) -> *mut ibv_dm {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// See [`ibv_import_device`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

/// Enhanced connection establishment (an InfiniBand CM feature): `EOPNOTSUPP`.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// See [`ibv_query_ece`].
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

symver!("IBVERBS_1.1":
    ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr, ibv_dereg_mr, ibv_rereg_mr, ibv_create_ah, ibv_create_ah_from_wc,
    ibv_init_ah_from_wc, ibv_destroy_ah, ibv_attach_mcast, ibv_detach_mcast,
);
symver!("IBVERBS_1.7": ibv_reg_mr_iova);
symver!("IBVERBS_1.8": ibv_reg_mr_iova2);
symver!("IBVERBS_1.10":
    ibv_import_device, ibv_import_pd, ibv_unimport_pd, ibv_import_mr, ibv_unimport_mr, ibv_query_ece,
    ibv_set_ece,
);
symver!("IBVERBS_1.12": ibv_reg_dmabuf_mr);
symver!("IBVERBS_1.13": ibv_import_dm, ibv_unimport_dm);
