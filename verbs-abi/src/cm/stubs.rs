//! The librdmacm functions this device does not offer: multicast (unreliable datagrams),
//! shared receive queues, InfiniBand's enhanced connection establishment, and rsockets (the
//! socket-like API over rdma_cm). Each fails the documented way with `ENOSYS` or
//! `EOPNOTSUPP`, except `rpoll`, which is `poll(2)` (no descriptor can be an rsocket).

use std::ffi::{c_int, c_void};

use crate::ffi::set_errno;
use crate::sys::*;

/// Fails with `errno` = `e`: -1.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

macro_rules! unsupported {
    ($errno:expr; $( $export:literal fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $val:expr; )+) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: not supported (`", stringify!($errno), "`).")]
            ///
            /// # Safety
            ///
            /// None (the arguments are not used).
            #[unsafe(export_name = $export)]
            pub unsafe extern "C" fn $name($(_: $ty),*) -> $ret {
                let _ = fail($errno);
                $val
            }
        )+
    };
}

unsupported! { libc::ENOSYS;
    "iwarp_rdma_join_multicast" fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void) -> c_int = -1;
    "iwarp_rdma_join_multicast_ex" fn rdma_join_multicast_ex(id: *mut rdma_cm_id, attr: *mut rdma_cm_join_mc_attr_ex, context: *mut c_void) -> c_int = -1;
    "iwarp_rdma_leave_multicast" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int = -1;
    "iwarp_rsocket" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int = -1;
    "iwarp_rbind" fn rbind(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int = -1;
    "iwarp_rlisten" fn rlisten(socket: c_int, backlog: c_int) -> c_int = -1;
    "iwarp_raccept" fn raccept(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int = -1;
    "iwarp_rconnect" fn rconnect(socket: c_int, addr: *const sockaddr, len: socklen_t) -> c_int = -1;
    "iwarp_rshutdown" fn rshutdown(socket: c_int, how: c_int) -> c_int = -1;
    "iwarp_rclose" fn rclose(socket: c_int) -> c_int = -1;
    "iwarp_rrecv" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize = -1;
    "iwarp_rrecvfrom" fn rrecvfrom(socket: c_int, buf: *mut c_void, len: usize, flags: c_int, src: *mut sockaddr, srclen: *mut socklen_t) -> isize = -1;
    "iwarp_rrecvmsg" fn rrecvmsg(socket: c_int, msg: *mut c_void, flags: c_int) -> isize = -1;
    "iwarp_rsend" fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize = -1;
    "iwarp_rsendto" fn rsendto(socket: c_int, buf: *const c_void, len: usize, flags: c_int, dst: *const sockaddr, dstlen: socklen_t) -> isize = -1;
    "iwarp_rsendmsg" fn rsendmsg(socket: c_int, msg: *const c_void, flags: c_int) -> isize = -1;
    "iwarp_rread" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize = -1;
    "iwarp_rreadv" fn rreadv(socket: c_int, iov: *const c_void, iovcnt: c_int) -> isize = -1;
    "iwarp_rwrite" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize = -1;
    "iwarp_rwritev" fn rwritev(socket: c_int, iov: *const c_void, iovcnt: c_int) -> isize = -1;
    "iwarp_rselect" fn rselect(nfds: c_int, r: *mut c_void, w: *mut c_void, e: *mut c_void, timeout: *mut c_void) -> c_int = -1;
    "iwarp_rgetpeername" fn rgetpeername(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int = -1;
    "iwarp_rgetsockname" fn rgetsockname(socket: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int = -1;
    "iwarp_rsetsockopt" fn rsetsockopt(socket: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int = -1;
    "iwarp_rgetsockopt" fn rgetsockopt(socket: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int = -1;
    "iwarp_rfcntl" fn rfcntl(socket: c_int, cmd: c_int) -> c_int = -1;
    "iwarp_riomap" fn riomap(socket: c_int, buf: *mut c_void, len: usize, prot: c_int, flags: c_int, offset: libc::off_t) -> libc::off_t = -1;
    "iwarp_riounmap" fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int = -1;
    "iwarp_riowrite" fn riowrite(socket: c_int, buf: *const c_void, count: usize, offset: libc::off_t, flags: c_int) -> usize = usize::MAX;
}

unsupported! { libc::EOPNOTSUPP;
    "iwarp_rdma_create_srq" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int = -1;
    "iwarp_rdma_create_srq_ex" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int = -1;
    "iwarp_rdma_destroy_srq" fn rdma_destroy_srq(id: *mut rdma_cm_id) -> () = ();
    "iwarp_rdma_get_remote_ece" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int = -1;
    "iwarp_rdma_set_local_ece" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int = -1;
}

/// `rpoll`: `poll(2)` (no descriptor is an rsocket).
///
/// # Safety
///
/// As `poll(2)`: `fds` points to `nfds` readable and writable entries.
#[unsafe(export_name = "iwarp_rpoll")]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's contract is poll's.
    unsafe { libc::poll(fds, nfds, timeout) }
}

symver!("IWARP_PRIVATE_1":
    iwarp_rdma_join_multicast, iwarp_rdma_join_multicast_ex, iwarp_rdma_leave_multicast,
    iwarp_rsocket, iwarp_rbind, iwarp_rlisten, iwarp_raccept, iwarp_rconnect, iwarp_rshutdown,
    iwarp_rclose, iwarp_rrecv, iwarp_rrecvfrom, iwarp_rrecvmsg, iwarp_rsend, iwarp_rsendto,
    iwarp_rsendmsg, iwarp_rread, iwarp_rreadv, iwarp_rwrite, iwarp_rwritev, iwarp_rselect,
    iwarp_rgetpeername, iwarp_rgetsockname, iwarp_rsetsockopt, iwarp_rgetsockopt, iwarp_rfcntl,
    iwarp_riomap, iwarp_riounmap, iwarp_riowrite, iwarp_rdma_create_srq, iwarp_rdma_create_srq_ex,
    iwarp_rdma_destroy_srq, iwarp_rdma_get_remote_ece, iwarp_rdma_set_local_ece, iwarp_rpoll,
);
