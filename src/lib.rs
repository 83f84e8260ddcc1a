//! iwarp: a userspace iWARP (RDMA over TCP) stack.
//!
//! The protocol layers live in their own sans-IO crates, re-exported here:
//!
//! - [`mpa`]: MPA (RFC 5044 + RFC 6581), connection setup frames, negotiation, FPDU framing.
//! - [`ddp`]: DDP (RFC 5041), direct data placement.
//! - [`rdmap`]: RDMAP (RFC 5040 + RFC 7306), the RDMA operations.
//! - [`netdev`]: the byte-stream links the stack runs over.
//!
//! This package adds what needs threads and sockets: the offload engine ([`Device`]), the
//! verbs-style API ([`ProtectionDomain`], [`MemoryRegion`], [`CompletionQueue`],
//! [`QueuePair`]), the rdma_cm-style connection manager ([`Device::connect`],
//! [`Device::listen`]). Packet-capture analysis is the `iwarp-dissect` crate (dissect/), and
//! the `iwarp` command the `iwarp-cli` package (cli/).
//!
//! ```
//! use std::time::Duration;
//! use iwarp::{Access, ConnectOptions, Device, DeviceConfig, SendOp, SendWr, WcStatus};
//!
//! let device = Device::open(DeviceConfig::default());
//! let pd = device.alloc_pd();
//! let cq = device.create_cq(64);
//! let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
//! let addr = listener.local_addr().unwrap();
//!
//! // The passive side accepts on its own thread.
//! let server = {
//!     let (pd, cq) = (pd.clone(), cq.clone());
//!     std::thread::spawn(move || {
//!         let req = listener.accept(Duration::from_secs(5)).unwrap();
//!         req.accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap()
//!     })
//! };
//! let client = device.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap();
//! let server_qp = server.join().unwrap();
//!
//! // RDMA Write 5 bytes into the server's region.
//! let target = pd.register(4096, Access::REMOTE_WRITE).unwrap();
//! let source = pd.register_bytes(b"hello", Access::NONE).unwrap();
//! client.qp.post_send(SendWr {
//!     wr_id: 1,
//!     op: SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() },
//!     sgl: source.sge(0, 5).into(),
//!     signaled: true,
//! }).unwrap();
//! let wc = cq.wait(Duration::from_secs(5)).unwrap();
//! assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
//! # drop(server_qp);
//! ```

pub use iwarp_ddp as ddp;
pub use iwarp_mpa as mpa;
pub use iwarp_netdev as netdev;
pub use iwarp_rdmap as rdmap;

// Layers, each importing only those above it: the readiness poll, the shared rings and
// doorbell, the engine, the application's handles, the connection manager.
pub mod backend;
mod cm;
mod cq;
mod deadline;
mod device;
mod engine;
mod mr;
mod qp;
mod readiness;
mod seam;
mod shared;
mod threads;
#[cfg(feature = "verbs")]
mod verbs;

pub use cm::{
    CmError, CmFuture, ConnectOptions, ConnectRequest, Connected, ListenOptions, Listener, Transport,
};
pub use cq::{CompletionQueue, CompletionStream, NextCompletion};
pub use device::Device;
pub use engine::{DeviceConfig, EngineStats, PollMode};
pub use iwarp_ddp::STag;
pub use iwarp_ddp::dma::{Buffer, ForeignMemory, PageBuffer, RegionMemory, RegionView};
pub use iwarp_ddp::stag_table::Access;
pub use iwarp_rdmap::memory::{Sge, Sgl};
pub use iwarp_rdmap::qp::{
    PostError, QpEvent, QpState, RecvWr, SendOp, SendWr, SharedReceiveQueue, WcOpcode, WcStatus,
};
pub use mr::{MemoryRegion, MemoryWindow, ProtectionDomain, RegisterError};
pub use qp::{PostListError, QueuePair};
pub use shared::WorkCompletion;

/// The README's code blocks, run as doctests so that they keep compiling.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
