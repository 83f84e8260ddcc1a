//! `iwarp dissect`'s pipeline on arbitrary bytes as a capture file: pcap/pcapng parsing, TCP
//! reassembly, MPA handshake and deframing, DDP/RDMAP decoding and the sequence checks, with
//! the invariants of the streamed records checked (iwarp_dissect::fuzz_dissect). Under
//! `cfg(fuzzing)` the deframer accepts any CRC (see mpa/src/codec.rs). Seeds: the captures in
//! tests/data/siw, cut to their first packets (scripts/make-fuzz-seeds.py).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_dissect::fuzz_dissect(data);
});
