//! DDP, the Direct Data Placement protocol (RFC 5041).
//!
//! This crate will hold the tagged (14-byte) and untagged (18-byte) header views and
//! representations, segmentation of messages into MULPDU-sized segments, the tagged buffer
//! table (STag -> registered region) with its placement checks, and the untagged queues.
//! It is sans-IO: no sockets, no threads, no clock.
#![forbid(unsafe_code)]
