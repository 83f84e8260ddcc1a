//! Tagged and untagged placement on operations decoded from arbitrary bytes, checked against a
//! model: nothing outside a permitted range of any region's memory ever changes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| iwarp_ddp::placement::fuzz_placement(data));
