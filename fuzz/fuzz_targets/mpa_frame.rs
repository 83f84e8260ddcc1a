//! Request/Reply parsing and negotiation on arbitrary bytes. The first byte picks the local
//! policy; the rest is the peer's frame.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&sel, frame)) = data.split_first() {
        iwarp_mpa::negotiate::fuzz_negotiation(sel, frame);
    }
});
