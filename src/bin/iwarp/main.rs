//! The `iwarp` command.
fn main() {}
