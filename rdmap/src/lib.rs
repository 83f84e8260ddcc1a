//! RDMAP, the RDMA Protocol (RFC 5040, with the RFC 7306 extensions).
//!
//! - [`wire`]: opcodes, the control byte, the Read Request body and the Terminate control word
//!   (RFC layout, and siw's bit-field layout decoded too); [`atomic`]: the RFC 7306 Atomic
//!   Request/Response and Immediate Data bodies and the atomic semantics; [`terminate`]: the
//!   whole Terminate message and which headers it copies for each error.
//! - [`qp`]: the queue pair: send and receive queues, RDMA Write, Read and the Send variants,
//!   the memory work requests (local invalidate, fast-register, window bind), ORD/IRD,
//!   completions in RFC 5040 order, Terminate on every peer violation and flushing of every
//!   outstanding work request exactly once. DDP places every segment and reads every local
//!   buffer; the queue pair never touches memory itself.
//! - [`conn`]: a queue pair over MPA (bytes in, bytes out); [`memory`]: how work requests name
//!   local buffers.
//!
//! It is sans-IO: no sockets, no threads, no clock; time is passed in.
#![forbid(unsafe_code)]

pub mod atomic;
pub mod conn;
#[doc(hidden)]
pub mod fuzz;
pub mod memory;
pub mod qp;
pub mod terminate;
pub mod wire;

pub use atomic::{AtomicOp, AtomicRequest, AtomicResponse, ImmediateData};
pub use terminate::{RdmapError, TerminateMessage, TerminatedDdpHeader};
pub use wire::{Control, Opcode, ReadRequest, TerminateHeader};
