//! Byte-stream links that the iwarp engine runs over.
//!
//! A [`Link`] is a reliable, ordered, full-duplex byte stream (what MPA runs over) with a
//! non-blocking, poll-friendly interface: the offload engine owns many links on its own thread
//! and drives them from one loop, so no call here ever blocks.
//!
//! - [`TcpLink`] / [`TcpListenerLink`]: kernel TCP over non-blocking `mio` sockets. A link's
//!   descriptor ([`Link::fd`]) is what an engine registers for readiness (edge-triggered),
//!   then calls [`Link::recv`] and [`Link::send_vectored`] until they return 0.
//! - [`MemLink`]: an in-memory pair for deterministic tests, with fault injection through
//!   [`MemFaults`] (cut, stall, half-close, slow reader, capacity changes).
//! - [`SmolStack`] / [`SmolLink`] / [`SmolListener`]: userspace TCP/IP (smoltcp) on a TAP
//!   device or a raw Ethernet interface ("plain Ethernet"), polled by the engine.
//! - [`CapturingLink`] and [`PcapWriter`]: a pcap capture of what crosses any link, with
//!   Ethernet/IPv4/TCP framing synthesized so Wireshark/tshark can decode the iWARP traffic.
//!
//! This crate depends on none of the protocol crates (docs/architecture.md#dependency-rules).

mod frame_io;
mod link;
mod mem;
mod offload;
mod pcap;
mod rand;
mod smol;
mod smol_device;
mod tcp;

pub use link::{Link, LinkError};
pub use mem::{MemFaults, MemLink};
pub use offload::{Offload, Offloads};
pub use pcap::{CapturingLink, Direction, PcapFlow, PcapWriter, TCP_MSS};
pub use smol::{DeviceStats, SmolConfig, SmolLink, SmolListener, SmolStack, interface_ipv4, random_mac};
/// The smoltcp types in [`SmolStack`]'s API (time, TCP state).
pub use smoltcp;
pub use tcp::{LinkOptions, TcpLink, TcpListenerLink};
