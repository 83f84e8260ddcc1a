//! Random numbers for what must not be predictable on the wire (initial sequence numbers,
//! MAC addresses), without a dependency.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A random 64-bit number (std's per-process hash keys mixed with the clock).
pub(crate) fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
