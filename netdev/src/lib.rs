//! Byte-stream links that the iwarp engine runs over.
//!
//! This crate will hold the kernel TCP link, the userspace TCP/IP link (smoltcp over a TAP
//! device or a raw Ethernet interface), an in-memory link pair with fault injection for tests,
//! and pcap capture of any link. It depends on none of the protocol crates.
