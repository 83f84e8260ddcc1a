//! DDP header and RDMAP message parsing on arbitrary ULPDU bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    iwarp_rdmap::wire::fuzz_parse(data);
});
