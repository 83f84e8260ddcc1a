//! DDP, the Direct Data Placement protocol (RFC 5041).
//!
//! - [`header`]: the tagged (14-byte) and untagged (18-byte) headers: the [`Segment`] view and
//!   the [`SegmentRepr`] / [`HeaderRepr`] forms with `parse` and `emit`; the protocol
//!   quantities [`STag`], [`Msn`], [`TaggedOffset`], [`QueueNumber`].
//! - [`segment`]: one message -> MULPDU-sized segments ([`Segmenter`]).
//! - [`stag_table`]: the tagged buffer table ([`TaggedBufferTable`]): regions, windows,
//!   invalidation, and the placement checks with their Terminate codes.
//! - [`terminate`]: the Terminate `layer / type / code` triple ([`TerminateCode`]) every peer
//!   error maps to.
//! - [`untagged`]: the untagged receive queues 0..=3 ([`UntaggedQueues`]): posted buffers,
//!   expected MSN and MO checks.
//!
//! It is sans-IO: no sockets, no threads, no clock.
#![forbid(unsafe_code)]

pub mod header;
pub mod segment;
pub mod stag_table;
pub mod terminate;
pub mod untagged;

pub use header::{
    HeaderError, HeaderRepr, Msn, QueueNumber, STag, Segment, SegmentKind, SegmentRepr, TaggedOffset,
};
pub use segment::{MessageTarget, SegmentError, Segmenter};
pub use stag_table::{
    Access, AccessError, Addressing, Entry, EntryKind, Placement, ProtectionDomainId, RegionSpec, TableError,
    TaggedBufferTable,
};
pub use terminate::{TerminateCode, TerminateLayer};
pub use untagged::{PostError, UntaggedError, UntaggedPlacement, UntaggedQueues};
