//! The librdmacm functions this device does not offer: multicast (unreliable datagrams),
//! shared receive queues, InfiniBand's enhanced connection establishment, and rsockets'
//! direct placement (`riomap`, `riounmap`, `riowrite`; the stream rsockets are in
//! `verbs-abi/src/rsocket/`). Each fails the documented way with `ENOSYS` or `EOPNOTSUPP`.

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

symver!("IWARP_PRIVATE_1":
    iwarp_rdma_join_multicast, iwarp_rdma_join_multicast_ex, iwarp_rdma_leave_multicast,
    iwarp_riomap, iwarp_riounmap, iwarp_riowrite, iwarp_rdma_create_srq, iwarp_rdma_create_srq_ex,
    iwarp_rdma_destroy_srq, iwarp_rdma_get_remote_ece, iwarp_rdma_set_local_ece,
);
