//! iwarp: a userspace iWARP (RDMA over TCP) stack.
//!
//! The protocol layers live in their own sans-IO crates, re-exported here:
//!
//! - [`mpa`]: MPA (RFC 5044 + RFC 6581), connection setup frames, negotiation, FPDU framing.
//! - [`ddp`]: DDP (RFC 5041), direct data placement.
//! - [`rdmap`]: RDMAP (RFC 5040 + RFC 7306), the RDMA operations.
//! - [`netdev`]: the byte-stream links the stack runs over.
//!
//! This package adds what needs I/O: packet-capture analysis ([`dissect`]) today, and the
//! offload engine, the verbs-style API and the connection manager as they land.

pub use iwarp_ddp as ddp;
pub use iwarp_mpa as mpa;
pub use iwarp_netdev as netdev;
pub use iwarp_rdmap as rdmap;

pub mod dissect;
