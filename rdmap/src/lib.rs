//! RDMAP, the RDMA Protocol (RFC 5040, with the RFC 7306 extensions).
//!
//! Today this crate holds the RDMAP wire formats ([`wire`]): opcodes, the control byte, the
//! Read Request body and the Terminate control word (in the RFC layout, and decoded from siw's
//! bit-field layout too). The queue-pair state machine, work requests and completions, ORD/IRD
//! accounting and Terminate generation come next. It is sans-IO: no sockets, no threads, no
//! clock; time is passed in.
#![forbid(unsafe_code)]

pub mod atomic;
pub mod terminate;
pub mod wire;

pub use atomic::{AtomicOp, AtomicRequest, AtomicResponse, ImmediateData};
pub use terminate::{RdmapError, TerminateMessage, TerminatedDdpHeader};
pub use wire::{Control, Opcode, ReadRequest, TerminateHeader};
