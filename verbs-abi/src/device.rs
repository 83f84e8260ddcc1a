//! The device list, device contexts and the queries (`ibv_get_device_list`,
//! `ibv_open_device`, `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, ...): one
//! device, answering like an iWARP RNIC (transport IWARP, node type RNIC, an Ethernet link
//! layer, a vendor id that no program treats as Mellanox, Chelsio or Intel).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::sync::{Arc, LazyLock};

use crate::context::{
    CONTEXTS, Context, MAX_CQE, MAX_QP_WR, MAX_RD_ATOM, MAX_SGE, VENDOR_ID, VENDOR_PART_ID,
};
use crate::events::{EventQueue, read_record};
use crate::ffi::{CStruct, Result, ZeroedC, cstr, errno_call, fill_chars, minus1_call, ptr_call, zeroed};
use crate::runtime::{self, MAX_MR};
use crate::sys::*;

// SAFETY: these are repr(C) structures of integers, raw pointers, optional function
// pointers, arrays and unions of those, and pthread objects whose all-zero value is their
// static initializer on Linux.
unsafe impl ZeroedC for ibv_device {}
// SAFETY: as above.
unsafe impl ZeroedC for verbs_context {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_device_attr {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_port_attr {}
// SAFETY: as above.
unsafe impl ZeroedC for ibv_gid_entry {}

/// The port's MAC address, from which the GID and the GUIDs are made.
const MAC: [u8; 6] = [0x02, 0x69, 0x77, 0x61, 0x72, 0x70];

/// The one device.
pub(crate) struct DeviceObj {
    c: CStruct<ibv_device>,
}

static DEVICE: LazyLock<DeviceObj> = LazyLock::new(|| {
    let mut d: ibv_device = zeroed();
    d.node_type = IBV_NODE_RNIC;
    d.transport_type = IBV_TRANSPORT_IWARP;
    let name = runtime::config().map(|c| c.device_name.clone()).unwrap_or_else(|_| "iwarp0".into());
    fill_chars(&mut d.name, &name);
    fill_chars(&mut d.dev_name, "uverbs0");
    fill_chars(&mut d.dev_path, "/sys/class/infiniband_verbs/uverbs0");
    fill_chars(&mut d.ibdev_path, &format!("/sys/class/infiniband/{name}"));
    DeviceObj { c: CStruct::new(d) }
});

fn device_ptr() -> *mut ibv_device {
    DEVICE.c.ptr()
}

fn check_device(dev: *const ibv_device) -> Result<()> {
    if dev.is_null() || dev != device_ptr().cast_const() {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn node_guid() -> u64 {
    // EUI-64 from the MAC, in network byte order as the field is.
    let m = MAC;
    u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]).to_be()
}

/// The port's GID: a link-local IPv6 address with the interface id made from the MAC
/// (fe80::69:77ff:fe61:7270).
fn gid() -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[..2].copy_from_slice(&[0xfe, 0x80]);
    raw[8..].copy_from_slice(&u64::from_be(node_guid()).to_be_bytes());
    ibv_gid { raw }
}

/// Opens a context (starting the device on first use).
pub(crate) fn open_context() -> Result<Arc<Context>> {
    runtime::runtime()?;
    let async_events = EventQueue::new()?;
    let mut v: verbs_context = zeroed();
    v.sz = size_of::<verbs_context>() as size_t;
    v.query_port = Some(query_port_ex);
    v.context.device = device_ptr();
    v.context.ops = crate::qp::context_ops();
    v.context.cmd_fd = -1;
    v.context.async_fd = async_events.fd();
    v.context.num_comp_vectors = 1;
    // The extended-context marker (`__VERBS_ABI_IS_EXTENDED`): the headers' inline
    // functions then find `query_port` and the `sz` bound in the verbs_context around it.
    v.context.abi_compat = usize::MAX as *mut c_void;
    Ok(Context::register(v, async_events))
}

/// The context librdmacm's ids use (`rdma_cm_id::verbs`), opened once.
pub(crate) fn cm_context() -> Result<Arc<Context>> {
    static CM: std::sync::OnceLock<Arc<Context>> = std::sync::OnceLock::new();
    if let Some(c) = CM.get() {
        return Ok(c.clone());
    }
    let ctx = open_context()?;
    Ok(CM.get_or_init(|| ctx).clone())
}

/// Returns the list of devices: one. NULL-terminated, to be freed with
/// [`ibv_free_device_list`].
///
/// # Safety
///
/// `num_devices` is NULL or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ptr_call("ibv_get_device_list", || {
        runtime::config()?;
        // SAFETY: calloc of two pointers; checked for NULL below.
        let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
        if list.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: `list` holds two pointers (the second stays NULL, calloc zeroed it).
        unsafe { *list = device_ptr() };
        if !num_devices.is_null() {
            // SAFETY: the caller passes a writable int or NULL.
            unsafe { *num_devices = 1 };
        }
        Ok(list)
    })
}

/// Frees a list from [`ibv_get_device_list`].
///
/// # Safety
///
/// `list` is NULL or a list [`ibv_get_device_list`] returned, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list came from calloc (or is NULL, which free ignores).
    unsafe { libc::free(list.cast()) }
}

/// The device's name, or NULL (errno EINVAL) for a pointer that is not the device.
///
/// # Safety
///
/// None beyond the C API's: any pointer value is checked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    ptr_call("ibv_get_device_name", || {
        check_device(device)?;
        // SAFETY: the device structure is static; the name field lives as long.
        Ok(unsafe { (*device_ptr()).name.as_mut_ptr() })
    })
    .cast_const()
}

/// The device's node GUID (network byte order), 0 for another pointer.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    if check_device(device).is_err() {
        crate::ffi::set_errno(libc::EINVAL);
        return 0;
    }
    node_guid()
}

/// The device's index (0), -1 for another pointer.
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    minus1_call("ibv_get_device_index", || check_device(device).map(|()| 0))
}

/// Opens a context on the device (starting the engine on first use).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    ptr_call("ibv_open_device", || {
        check_device(device)?;
        Ok(open_context()?.ibv())
    })
}

/// Closes a context.
///
/// # Safety
///
/// None beyond the C API's: a pointer that is not an open context is refused.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    minus1_call("ibv_close_device", || {
        let is_cm = cm_context().is_ok_and(|c| c.ibv() == context);
        if is_cm {
            // librdmacm's shared context stays open.
            return Ok(0);
        }
        CONTEXTS.remove(context).map(|_| 0).ok_or(libc::EINVAL)
    })
}

fn device_attr() -> ibv_device_attr {
    let mut a: ibv_device_attr = zeroed();
    fill_chars(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = node_guid();
    a.sys_image_guid = node_guid();
    a.max_mr_size = u64::from(u32::MAX);
    a.page_size_cap = 4096;
    a.vendor_id = VENDOR_ID;
    a.vendor_part_id = VENDOR_PART_ID;
    a.hw_ver = 0;
    a.max_qp = 65536;
    a.max_qp_wr = MAX_QP_WR as c_int;
    a.device_cap_flags = 0;
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = 1;
    a.max_cq = 65536;
    a.max_cqe = MAX_CQE as c_int;
    a.max_srq = 65536;
    a.max_srq_wr = MAX_QP_WR as c_int;
    a.max_srq_sge = MAX_SGE as c_int;
    a.max_mr = MAX_MR as c_int;
    a.max_pd = 65536;
    a.max_qp_rd_atom = MAX_RD_ATOM as c_int;
    a.max_res_rd_atom = (MAX_RD_ATOM * 65536) as c_int;
    a.max_qp_init_rd_atom = MAX_RD_ATOM as c_int;
    a.atomic_cap = IBV_ATOMIC_NONE;
    a.max_pkeys = 1;
    a.phys_port_cnt = 1;
    a
}

/// Describes the device.
///
/// # Safety
///
/// `device_attr` points to a writable `struct ibv_device_attr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    errno_call("ibv_query_device", || {
        CONTEXTS.get(context)?;
        if device_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable structure.
        unsafe { device_attr.write(self::device_attr()) };
        Ok(())
    })
}

fn port_attr() -> ibv_port_attr {
    let mut p: ibv_port_attr = zeroed();
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = IBV_MTU_4096;
    p.active_mtu = IBV_MTU_1024;
    p.gid_tbl_len = 1;
    p.max_msg_sz = u32::MAX;
    p.pkey_tbl_len = 1;
    p.active_width = 1; // 1X
    p.active_speed = 32; // 10 Gb/s (FDR10's code)
    p.phys_state = 5; // LinkUp
    p.link_layer = u8::try_from(IBV_LINK_LAYER_ETHERNET).unwrap_or(0);
    p
}

/// Writes the port's attributes into `attr`, at most `len` bytes of them.
fn write_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr, len: usize) -> Result<()> {
    CONTEXTS.get(context)?;
    if port != 1 || attr.is_null() {
        return Err(libc::EINVAL);
    }
    let full = port_attr();
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's structure has `len` writable bytes; `full` has at least `n`.
    unsafe { std::ptr::copy_nonoverlapping((&raw const full).cast::<u8>(), attr.cast::<u8>(), n) };
    Ok(())
}

/// The extended context's `query_port` (what the headers' `ibv_query_port` calls).
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: size_t,
) -> c_int {
    let len = usize::try_from(port_attr_len).unwrap_or(usize::MAX);
    errno_call("ibv_query_port", || write_port(context, port_num, port_attr, len))
}

/// The size of rdma-core's older port attribute structure (up to `flags`), which the
/// exported `ibv_query_port` writes.
const COMPAT_PORT_ATTR_LEN: usize = (offset_of!(ibv_port_attr, flags) + 1).next_multiple_of(4);

/// Describes the port (the exported function, for programs that do not go through the
/// headers' inline wrapper: it writes the older, shorter structure).
///
/// # Safety
///
/// `port_attr` points to at least the older `struct ibv_port_attr` (without
/// `port_cap_flags2`), writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut _compat_ibv_port_attr,
) -> c_int {
    errno_call("ibv_query_port", || write_port(context, port_num, port_attr.cast(), COMPAT_PORT_ATTR_LEN))
}

/// The port's GID at `index` (0 only).
///
/// # Safety
///
/// `gid` points to a writable `union ibv_gid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    minus1_call("ibv_query_gid", || {
        CONTEXTS.get(context)?;
        if port_num != 1 || index != 0 || gid.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable GID.
        unsafe { gid.write(self::gid()) };
        Ok(0)
    })
}

/// A GID table entry (the headers' `ibv_query_gid_ex`).
///
/// # Safety
///
/// `entry` points to `entry_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    errno_call("ibv_query_gid_ex", || {
        CONTEXTS.get(context)?;
        if port_num != 1 || flags != 0 || entry.is_null() {
            return Err(libc::EINVAL);
        }
        if gid_index != 0 {
            return Err(libc::ENODATA);
        }
        let e = gid_entry();
        let n = entry_size.min(size_of::<ibv_gid_entry>());
        // SAFETY: the caller's entry has `entry_size` writable bytes.
        unsafe { std::ptr::copy_nonoverlapping((&raw const e).cast::<u8>(), entry.cast::<u8>(), n) };
        Ok(())
    })
}

fn gid_entry() -> ibv_gid_entry {
    let mut e: ibv_gid_entry = zeroed();
    e.gid = gid();
    e.port_num = 1;
    e.gid_type = IBV_GID_TYPE_IB;
    e
}

/// The whole GID table (one entry); the number of entries or a negative error number.
///
/// # Safety
///
/// `entries` points to `max_entries` entries of `entry_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if CONTEXTS.get(context).is_err() || entries.is_null() || flags != 0 || entry_size == 0 {
        return -(libc::EINVAL as isize);
    }
    if max_entries == 0 {
        return -(libc::EINVAL as isize);
    }
    let e = gid_entry();
    let n = entry_size.min(size_of::<ibv_gid_entry>());
    // SAFETY: the caller's first entry has `entry_size` writable bytes.
    unsafe { std::ptr::copy_nonoverlapping((&raw const e).cast::<u8>(), entries.cast::<u8>(), n) };
    1
}

/// The GID's type as sysfs names it (rdma-core's private entry point, which ibv_devinfo
/// and perftest import): 0, "IB/RoCE v1".
///
/// # Safety
///
/// `gid_type` points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_uint,
) -> c_int {
    minus1_call("ibv_query_gid_type", || {
        CONTEXTS.get(context)?;
        if port_num != 1 || index != 0 || gid_type.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable int.
        unsafe { gid_type.write(0) };
        Ok(0)
    })
}

/// The P_Key at `index` (0 only: 0xffff).
///
/// # Safety
///
/// `pkey` points to a writable `__be16`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    minus1_call("ibv_query_pkey", || {
        CONTEXTS.get(context)?;
        if port_num != 1 || index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a writable u16.
        unsafe { pkey.write(0xffff) };
        Ok(0)
    })
}

/// The index of `pkey` (0 for 0xffff).
///
/// # Safety
///
/// None beyond the C API's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: __be16) -> c_int {
    minus1_call("ibv_get_pkey_index", || {
        CONTEXTS.get(context)?;
        if port_num == 1 && pkey == 0xffff { Ok(0) } else { Err(libc::EINVAL) }
    })
}

/// Waits for the next asynchronous event. This device raises none (errors reach the
/// application as completions and rdma_cm events), so the call blocks until the context's
/// descriptor is made non-blocking (then `EAGAIN`) or the thread is cancelled.
///
/// # Safety
///
/// `event` points to a writable `struct ibv_async_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    let fd = match async_fd(context, event) {
        Ok(fd) => fd,
        Err(e) => {
            crate::ffi::set_errno(e);
            return -1;
        }
    };
    match read_record(fd) {
        // Nothing writes async records; one would be a port event.
        Ok(_) => minus1_call("ibv_get_async_event", || {
            let mut e: ibv_async_event = zeroed_async();
            e.event_type = IBV_EVENT_PORT_ACTIVE;
            e.element.port_num = 1;
            // SAFETY: checked non-null above; the caller passes a writable structure.
            unsafe { event.write(e) };
            Ok(0)
        }),
        Err(e) => {
            crate::ffi::set_errno(e);
            -1
        }
    }
}

fn zeroed_async() -> ibv_async_event {
    ibv_async_event { element: ibv_async_event__bindgen_ty_1 { port_num: 0 }, event_type: 0 }
}

fn async_fd(context: *mut ibv_context, event: *mut ibv_async_event) -> Result<c_int> {
    let ctx = CONTEXTS.get(context)?;
    if event.is_null() {
        return Err(libc::EINVAL);
    }
    Ok(ctx.async_fd())
}

/// Acknowledges an asynchronous event (nothing to do).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// Prepares for fork(): nothing to do (registered memory is not pinned).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// Fork protection is not needed (`IBV_FORK_UNNEEDED`).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// Nothing to do (no pinned memory).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// Nothing to do (no pinned memory).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// Provider registration: there are no providers (nothing to do).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_register_driver(_name: *const c_char, _init: *mut c_void) {}

/// The sysfs directory: this device has none there.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    cstr(c"/sys")
}

/// Reads a sysfs attribute of a device: there is none for this device (-1, ENOENT).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    crate::ffi::set_errno(libc::ENOENT);
    -1
}

/// rdma-core's historical kernel-structure copies: no kernel structures exist here.
///
/// # Safety
///
/// None (nothing is touched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// See [`ibv_copy_qp_attr_from_kern`].
///
/// # Safety
///
/// None (nothing is touched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// See [`ibv_copy_qp_attr_from_kern`].
///
/// # Safety
///
/// None (nothing is touched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// See [`ibv_copy_qp_attr_from_kern`].
///
/// # Safety
///
/// None (nothing is touched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *mut c_void) {}

/// Resolves Ethernet L2 addresses from a GID (RoCE only): not supported.
///
/// # Safety
///
/// None (nothing is touched).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _context: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// The name of an asynchronous event type.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    cstr(match event {
        IBV_EVENT_CQ_ERR => c"CQ error",
        IBV_EVENT_QP_FATAL => c"local work queue catastrophic error",
        IBV_EVENT_QP_REQ_ERR => c"invalid request local work queue error",
        IBV_EVENT_QP_ACCESS_ERR => c"local access violation work queue error",
        IBV_EVENT_COMM_EST => c"communication established",
        IBV_EVENT_SQ_DRAINED => c"send queue drained",
        IBV_EVENT_PATH_MIG => c"path migrated",
        IBV_EVENT_PATH_MIG_ERR => c"path migration request error",
        IBV_EVENT_DEVICE_FATAL => c"local catastrophic error",
        IBV_EVENT_PORT_ACTIVE => c"port active",
        IBV_EVENT_PORT_ERR => c"port error",
        IBV_EVENT_LID_CHANGE => c"LID change",
        IBV_EVENT_PKEY_CHANGE => c"P_Key change",
        IBV_EVENT_SM_CHANGE => c"SM change",
        IBV_EVENT_SRQ_ERR => c"SRQ catastrophic error",
        IBV_EVENT_SRQ_LIMIT_REACHED => c"SRQ limit reached",
        IBV_EVENT_QP_LAST_WQE_REACHED => c"last WQE reached",
        IBV_EVENT_CLIENT_REREGISTER => c"client reregistration",
        IBV_EVENT_GID_CHANGE => c"GID table change",
        IBV_EVENT_WQ_FATAL => c"WQ fatal",
        _ => c"unknown",
    })
}

/// The name of a node type.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char {
    cstr(match node_type {
        IBV_NODE_CA => c"InfiniBand channel adapter",
        IBV_NODE_SWITCH => c"InfiniBand switch",
        IBV_NODE_ROUTER => c"InfiniBand router",
        IBV_NODE_RNIC => c"iWARP NIC",
        IBV_NODE_USNIC => c"usNIC",
        IBV_NODE_USNIC_UDP => c"usNIC UDP",
        IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    })
}

/// The name of a port state.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_port_state_str(port_state: ibv_port_state) -> *const c_char {
    cstr(match port_state {
        IBV_PORT_NOP => c"PORT_NOP",
        IBV_PORT_DOWN => c"PORT_DOWN",
        IBV_PORT_INIT => c"PORT_INIT",
        IBV_PORT_ARMED => c"PORT_ARMED",
        IBV_PORT_ACTIVE => c"PORT_ACTIVE",
        IBV_PORT_ACTIVE_DEFER => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    })
}

/// (rate, multiple of 2.5 Gb/s, Mb/s)
const RATES: &[(ibv_rate, c_int, c_int)] = &[
    (IBV_RATE_2_5_GBPS, 1, 2500),
    (IBV_RATE_5_GBPS, 2, 5000),
    (IBV_RATE_10_GBPS, 4, 10000),
    (IBV_RATE_20_GBPS, 8, 20000),
    (IBV_RATE_30_GBPS, 12, 30000),
    (IBV_RATE_40_GBPS, 16, 40000),
    (IBV_RATE_60_GBPS, 24, 60000),
    (IBV_RATE_80_GBPS, 32, 80000),
    (IBV_RATE_120_GBPS, 48, 120000),
    (IBV_RATE_14_GBPS, -1, 14062),
    (IBV_RATE_56_GBPS, -1, 56250),
    (IBV_RATE_112_GBPS, -1, 112500),
    (IBV_RATE_168_GBPS, -1, 168750),
    (IBV_RATE_25_GBPS, -1, 25781),
    (IBV_RATE_100_GBPS, -1, 103125),
    (IBV_RATE_200_GBPS, -1, 206250),
    (IBV_RATE_300_GBPS, -1, 309375),
    (IBV_RATE_28_GBPS, -1, 28125),
    (IBV_RATE_50_GBPS, -1, 53125),
    (IBV_RATE_400_GBPS, -1, 425000),
    (IBV_RATE_600_GBPS, -1, 637500),
    (IBV_RATE_800_GBPS, -1, 850000),
    (IBV_RATE_1200_GBPS, -1, 1275000),
];

/// A rate as a multiple of 2.5 Gb/s (-1 if it is none).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// The rate of a multiple of 2.5 Gb/s.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(IBV_RATE_MAX, |r| r.0)
}

/// A rate in Mb/s (-1 if unknown).
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// The rate of a speed in Mb/s.
///
/// # Safety
///
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    RATES.iter().find(|r| r.2 == mbps).map_or(IBV_RATE_MAX, |r| r.0)
}

symver!("IBVERBS_1.0":
    ibv_rate_to_mult, mult_to_ibv_rate, ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern, ibv_get_sysfs_path, ibv_read_sysfs_file,
);
symver!("IBVERBS_1.1":
    ibv_get_device_list, ibv_free_device_list, ibv_get_device_name, ibv_get_device_guid,
    ibv_open_device, ibv_close_device, ibv_query_device, ibv_query_port, ibv_query_gid,
    ibv_query_pkey, ibv_get_async_event, ibv_ack_async_event, ibv_fork_init, ibv_dontfork_range,
    ibv_dofork_range, ibv_register_driver, ibv_event_type_str, ibv_node_type_str,
    ibv_port_state_str, ibv_rate_to_mbps, mbps_to_ibv_rate, ibv_resolve_eth_l2_from_gid,
    ibv_copy_ah_attr_from_kern,
);
symver!("IBVERBS_1.5": ibv_get_pkey_index);
symver!("IBVERBS_1.9": ibv_get_device_index);
symver!("IBVERBS_1.11": _ibv_query_gid_ex, _ibv_query_gid_table);
symver!("IBVERBS_1.13": ibv_is_fork_initialized);
symver!("IBVERBS_PRIVATE_34": ibv_query_gid_type);
