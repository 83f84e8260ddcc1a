//! A victim queue pair (after a real MPA handshake) fed arbitrary bytes: no panic, no byte
//! changed outside the permitted ranges, every work request completes at most once, and
//! exactly once after the LLP is lost. Byte 0 selects CRC, markers, the RFC 7306 extensions
//! with an outstanding Atomic, an outstanding RDMA Read, and the chunk length: see
//! iwarp_rdmap::fuzz (rdmap/src/fuzz.rs). Seeds: rdmap/tests/hostile.rs `fuzz_seeds`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_rdmap::fuzz::receive(data);
});
