//! RDMAP, the RDMA Protocol (RFC 5040, with the RFC 7306 extensions).
//!
//! This crate will hold the RDMAP messages (Write, Read Request/Response, the Send variants,
//! Terminate, Immediate Data, Atomics), the queue-pair state machine, work requests and
//! completions, ORD/IRD accounting and Terminate generation. It is sans-IO: no sockets, no
//! threads, no clock; time is passed in.
#![forbid(unsafe_code)]
