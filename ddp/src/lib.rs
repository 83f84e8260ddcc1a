//! DDP, the Direct Data Placement protocol (RFC 5041).
//!
//! - [`header`]: the tagged (14-byte) and untagged (18-byte) headers: the [`Segment`] view and
//!   the [`SegmentRepr`] / [`HeaderRepr`] forms with `parse` and `emit`; the protocol
//!   quantities [`STag`], [`Msn`], [`TaggedOffset`], [`QueueNumber`].
//! - [`dma`]: the bytes of a registered region ([`RegionMemory`]): the application's own
//!   buffer (owned, or foreign memory under the `ibv_reg_mr` contract), read and written only
//!   by the raw copies of this one module, the only place the crate allows `unsafe`.
//! - [`placement`]: the one placement: tagged ([`place_tagged`]), local scatter/gather lists
//!   ([`TableMemory`]), and the untagged receive path ([`UntaggedReceiver`]: checks, places,
//!   reports message completion).
//! - [`segment`]: one message -> MULPDU-sized segments ([`Segmenter`]).
//! - [`stag_table`]: the tagged buffer table ([`TaggedBufferTable`]): regions, windows,
//!   invalidation, and the placement checks with their Terminate codes.
//! - [`terminate`]: the Terminate `layer / type / code` triple ([`TerminateCode`]) every peer
//!   error maps to.
//! - [`untagged`]: the untagged receive queues 0..=3 ([`UntaggedQueues`]): posted buffer
//!   lengths, expected MSN and MO checks.
//!
//! It is sans-IO: no sockets, no threads, no clock. The one thing it takes from outside is the
//! seed of a new tagged buffer table's STags (the standard library's random hashing keys;
//! [`TaggedBufferTable::with_seed`] takes it as an argument instead).
//!
//! ```
//! use iwarp_ddp::{
//!     Access, Addressing, MessageTarget, ProtectionDomainId, RegionMemory, RegionSpec, SegmentKind,
//!     SegmentRepr, Segmenter, TaggedBufferTable, TaggedOffset, place_tagged,
//! };
//!
//! // The sink registers 8 KiB of its own memory and hands the STag to the peer.
//! let pd = ProtectionDomainId(1);
//! let mut table = TaggedBufferTable::new(1024);
//! let spec = RegionSpec {
//!     base_va: 0x4000,
//!     len: 8192,
//!     access: Access::REMOTE_WRITE,
//!     addressing: Addressing::VirtualAddress,
//! };
//! let stag = table.register(pd, spec, RegionMemory::new(vec![0u8; 8192])).unwrap();
//!
//! // The source segments an RDMA Write (RDMAP control 0x40) for MULPDU 1442, as siw does.
//! let message = vec![7u8; 8192];
//! let target = MessageTarget::Tagged { stag, to: TaggedOffset(0x4000) };
//! for (header, range) in Segmenter::new(target, 0x40, message.len(), 1442).unwrap() {
//!     let ulpdu = header.with_payload(&message[range]).to_vec();
//!     // The sink parses each ULPDU and checks it against the table before placing it.
//!     let seg = SegmentRepr::parse(&ulpdu).unwrap();
//!     let SegmentKind::Tagged { stag, to } = seg.header.kind else { unreachable!() };
//!     let len = seg.payload.len() as u64;
//!     let placement = table.check(stag, pd, Access::REMOTE_WRITE, to, len).unwrap();
//!     assert_eq!(placement.offset_in_region, to.0 - 0x4000);
//!     // ... and places it: one copy from the receive buffer into the region.
//!     place_tagged(&mut table, pd, stag, to, seg.payload, Access::REMOTE_WRITE).unwrap();
//! }
//! // Deregistration gives the application its vector back, written in place.
//! let (_, memory) = table.deregister(stag).unwrap();
//! assert_eq!(memory.unwrap().into_buffer().into_vec().unwrap(), message);
//! ```
#![deny(unsafe_code)]

#[expect(unsafe_code, reason = "the DMA engine: raw copies into and out of registered memory")]
pub mod dma;
pub mod header;
pub mod placement;
pub mod segment;
pub mod stag_table;
pub mod terminate;
pub mod untagged;

pub use dma::{Buffer, OutOfBounds, PageBuffer, RegionMemory, RegionView};
pub use header::{
    HeaderError, HeaderRepr, Msn, QueueNumber, STag, Segment, SegmentKind, SegmentRepr, TaggedOffset,
};
pub use placement::{
    Payload, PostedBuffer, Received, Sge, TableMemory, UntaggedReceiver, fetch_tagged, place_tagged, sgl_len,
};
pub use segment::{MessageTarget, SegmentError, Segmenter};
pub use stag_table::{
    Access, AccessError, Addressing, Entry, EntryKind, InvalidateError, Placement, ProtectionDomainId,
    RegionSpec, TableError, TaggedBufferTable,
};
pub use terminate::{TerminateCode, TerminateLayer};
pub use untagged::{Capacity, PostError, UntaggedError, UntaggedPlacement, UntaggedQueues};
