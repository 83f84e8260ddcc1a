//! Framing benchmark placeholder.
fn main() {}
