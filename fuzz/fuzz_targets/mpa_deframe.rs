//! The deframer on arbitrary bytes, with and without CRC and markers. The first byte picks
//! CRC, markers, the stream position and the chunking; the rest is the stream. Under
//! `cfg(fuzzing)` the deframer skips CRC verification (see iwarp_mpa::codec) so that inputs
//! reach the marker and length logic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&sel, stream)) = data.split_first() {
        iwarp_mpa::codec::fuzz_deframe(sel, stream);
    }
});
