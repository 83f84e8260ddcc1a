//! Integration tests of the iwarp stack live in `tests/tests/`; this library holds helpers they
//! share: test data locations, and network namespaces for tests on real devices ([`netns`]).

pub mod netns;

use std::path::PathBuf;

/// The directory holding the project's test data (packet captures of real siw traffic).
pub fn testdata_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}
