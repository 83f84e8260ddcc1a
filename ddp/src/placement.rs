//! Placement: the one implementation of writing a validated segment's payload into registered
//! memory (RFC 5041 sections 3.2 and 3.3), and of reading local buffers back out. RDMAP calls
//! it for every message; the `ddp_placement` fuzz target and `ddp/benches/placement.rs` run it.
//!
//! - Tagged ([`place_tagged`], [`TableMemory::place_tagged`]): the segment names an STag and a
//!   tagged offset. The table checks it ([`TaggedBufferTable::check`], in the documented
//!   order) and the payload is copied once, straight from the receive buffer into the
//!   region's memory at the checked offset ([`crate::dma`]); nothing is staged. A refused
//!   segment writes nothing.
//! - Local buffers ([`TableMemory::place_sgl`], [`TableMemory::gather_sgl`]): a scatter/gather
//!   list of verbs-style elements ([`Sge`]: lkey, address, length), each checked against the
//!   table like a tagged access from the queue pair's protection domain. Every element a copy
//!   touches is checked before the first byte moves, so a refused copy writes nothing.
//! - Untagged ([`UntaggedReceiver`]): the posted receive buffers of queues 0..=3. A segment's
//!   queue, MSN and MO are checked ([`UntaggedQueues::accept`]), the payload goes into the
//!   front buffer's scatter list at message offset MO, and the last segment hands the
//!   consumed buffer back with the message's length.
//!
//! [`TableMemory`] is the tagged buffer table seen from one stream's protection domain: what
//! the engine lends a queue pair for one pass. It borrows the table mutably, so no
//! deregistration can happen while it places (see [`crate::dma`]).

use std::collections::VecDeque;

use crate::dma::RegionMemory;
use crate::header::{Msn, QueueNumber, STag, SegmentKind, TaggedOffset};
use crate::stag_table::{
    Access, AccessError, InvalidateError, ProtectionDomainId, RegionSpec, TableError, TaggedBufferTable,
};
use crate::untagged::{Capacity, PostError, UntaggedError, UntaggedPlacement, UntaggedQueues};

/// A scatter/gather element of a local buffer: `len` bytes at tagged offset `addr` of the
/// region `lkey` (verbs' `ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// The local STag.
    pub lkey: STag,
    /// The tagged offset (a virtual address for VA-based regions).
    pub addr: u64,
    /// Bytes.
    pub len: u32,
}

impl Sge {
    /// An element of no bytes.
    pub const EMPTY: Sge = Sge { lkey: STag(0), addr: 0, len: 0 };
}

/// The total length of a scatter/gather list.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    match sgl {
        // Nearly every list, and the sum's vector loop costs more to set up than this.
        [one] => u64::from(one.len),
        _ => sgl.iter().map(|s| u64::from(s.len)).sum(),
    }
}

/// A segment's payload as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// The bytes, copied into place by the placement.
    Bytes(&'a [u8]),
    /// `len` bytes the receive path already read straight into the place the segment names
    /// (through [`TableMemory::tagged_sink`] or [`TableMemory::sgl_sink`], which make the
    /// same checks): the placement checks again and copies nothing. `refused` is the error a
    /// sink gave part-way (the place became unusable, the rest of the bytes were dropped):
    /// the placement fails with it.
    InPlace {
        /// Payload bytes.
        len: usize,
        /// Why some of the bytes could not be placed, if they could not.
        refused: Option<AccessError>,
    },
}

impl Payload<'_> {
    /// Payload bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::InPlace { len, .. } => *len,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Places a tagged segment's payload: checks `(stag, pd, needed, to, payload.len())` against
/// the table, then copies `payload` into the region at the checked offset (one copy, no
/// staging).
///
/// `needed` is the right the operation requires (RDMA Write: [`Access::REMOTE_WRITE`]; the
/// sink of our own Read: [`Access::LOCAL_WRITE`]); since a placement writes, it must include a
/// write right (remote or local), else the placement is refused with
/// [`AccessError::AccessRights`]. On any error nothing is written.
#[inline]
pub fn place_tagged(
    table: &mut TaggedBufferTable,
    pd: ProtectionDomainId,
    stag: STag,
    to: TaggedOffset,
    payload: &[u8],
    needed: Access,
) -> Result<(), AccessError> {
    let len = u64::try_from(payload.len()).map_err(|_| AccessError::ToWrap)?;
    let (memory, offset) = table.checked_memory_mut(stag, pd, needed, to, len)?;
    if !(needed.remote_write || needed.local_write) {
        return Err(AccessError::AccessRights);
    }
    // check() keeps the access inside the region and register / fast_register keep every
    // region inside its memory, so this cannot fail.
    memory.write(offset, payload).map_err(|_| AccessError::BaseOrBounds)
}

/// Copies the tagged range `[to, to + out.len())` of `stag` into `out` after checking it
/// needing `needed` (a Read Response's source: [`Access::REMOTE_READ`]). On error `out` is
/// untouched.
#[inline]
pub fn fetch_tagged(
    table: &TaggedBufferTable,
    pd: ProtectionDomainId,
    stag: STag,
    to: TaggedOffset,
    out: &mut [u8],
    needed: Access,
) -> Result<(), AccessError> {
    let len = u64::try_from(out.len()).map_err(|_| AccessError::ToWrap)?;
    let (memory, offset) = table.checked_memory(stag, pd, needed, to, len)?;
    memory.read(offset, out).map_err(|_| AccessError::BaseOrBounds)
}

/// Calls `f(element, tagged offset, range of the message bytes)` for each piece of message
/// bytes `[offset, offset + len)` as they fall on the elements of `sgl`. The bytes must lie
/// inside the list ([`AccessError::BaseOrBounds`] otherwise, before any call).
fn walk(
    sgl: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let len64 = u64::try_from(len).map_err(|_| AccessError::BaseOrBounds)?;
    match offset.checked_add(len64) {
        Some(end) if end <= sgl_len(sgl) => {}
        _ => return Err(AccessError::BaseOrBounds),
    }
    if let [s] = sgl {
        // Nearly every list: the bytes lie in the one element (checked above), as one piece.
        if len == 0 {
            return Ok(());
        }
        let to = s.addr.checked_add(offset).ok_or(AccessError::ToWrap)?;
        return f(s, to, 0..len);
    }
    let mut skip = offset;
    let mut done = 0;
    for s in sgl {
        if done == len {
            break;
        }
        let elen = u64::from(s.len);
        if skip >= elen {
            skip -= elen;
            continue;
        }
        let room = usize::try_from(elen - skip).unwrap_or(usize::MAX);
        let n = room.min(len - done);
        let to = s.addr.checked_add(skip).ok_or(AccessError::ToWrap)?;
        f(s, to, done..done + n)?;
        done += n;
        skip = 0;
    }
    Ok(())
}

/// The tagged buffer table seen from one stream's protection domain: where a queue pair's
/// placements go and its local buffers are read from. Every access checks the STag (valid,
/// key, PD), the rights and the bounds, in that order, and touches nothing when a check
/// fails.
#[derive(Debug)]
pub struct TableMemory<'a> {
    /// The tagged buffer table.
    pub table: &'a mut TaggedBufferTable,
    /// The stream's protection domain.
    pub pd: ProtectionDomainId,
}

impl TableMemory<'_> {
    /// Checks that `len` bytes at `to` of `stag` may be accessed with `needed`.
    pub fn check(&self, stag: STag, to: u64, len: u64, needed: Access) -> Result<(), AccessError> {
        self.table.check(stag, self.pd, needed, TaggedOffset(to), len).map(|_| ())
    }

    /// [`place_tagged`] from this stream.
    pub fn place_tagged(
        &mut self,
        stag: STag,
        to: u64,
        payload: &[u8],
        needed: Access,
    ) -> Result<(), AccessError> {
        place_tagged(self.table, self.pd, stag, TaggedOffset(to), payload, needed)
    }

    /// Places a tagged segment's payload, given or already in place ([`Payload`]): the same
    /// checks either way, and a copy only of given bytes.
    pub fn place(
        &mut self,
        stag: STag,
        to: u64,
        payload: Payload<'_>,
        needed: Access,
    ) -> Result<(), AccessError> {
        match payload {
            Payload::Bytes(bytes) => self.place_tagged(stag, to, bytes, needed),
            Payload::InPlace { len, refused } => {
                let len = u64::try_from(len).map_err(|_| AccessError::ToWrap)?;
                self.check(stag, to, len, needed)?;
                if !(needed.remote_write || needed.local_write) {
                    return Err(AccessError::AccessRights);
                }
                refused.map_or(Ok(()), Err)
            }
        }
    }

    /// Where `len` bytes at `to` of `stag` go, for a receive path that reads a payload straight
    /// into place (then placed as [`Payload::InPlace`]): the checks of [`place_tagged`], and
    /// the region's bytes, borrowed for as long as the table is.
    pub fn tagged_sink(
        &mut self,
        stag: STag,
        to: u64,
        len: usize,
        needed: Access,
    ) -> Result<&mut [u8], AccessError> {
        let len64 = u64::try_from(len).map_err(|_| AccessError::ToWrap)?;
        let (memory, offset) =
            self.table.checked_memory_mut(stag, self.pd, needed, TaggedOffset(to), len64)?;
        if !(needed.remote_write || needed.local_write) {
            return Err(AccessError::AccessRights);
        }
        memory.slice_mut(offset, len).ok_or(AccessError::BaseOrBounds)
    }

    /// Where the first of the message bytes `[offset, offset + len)` of the local buffer `sgl`
    /// go, for a receive path that reads a payload straight into place: the bytes of the one
    /// element they start in (fewer than `len` where the element ends first), checked as
    /// [`TableMemory::place_sgl`] checks them.
    pub fn sgl_sink(&mut self, sgl: &[Sge], offset: u64, len: usize) -> Result<&mut [u8], AccessError> {
        let mut first = None;
        walk(sgl, offset, len, |s, to, r| {
            if first.is_none() {
                first = Some((s.lkey, to, r.len()));
            }
            Ok(())
        })?;
        match first {
            Some((lkey, to, n)) => self.tagged_sink(lkey, to, n, Access::LOCAL_WRITE),
            None => Ok(&mut []),
        }
    }

    /// [`fetch_tagged`] from this stream.
    pub fn fetch_tagged(
        &self,
        stag: STag,
        to: u64,
        out: &mut [u8],
        needed: Access,
    ) -> Result<(), AccessError> {
        fetch_tagged(self.table, self.pd, stag, TaggedOffset(to), out, needed)
    }

    /// Writes `data` at message offset `offset` of the local buffer `sgl` (each element needs
    /// local write rights). Every element the bytes fall on is checked first: on error
    /// nothing is written.
    pub fn place_sgl(&mut self, sgl: &[Sge], offset: u64, data: &[u8]) -> Result<(), AccessError> {
        self.place_in_sgl(sgl, offset, Payload::Bytes(data))
    }

    /// [`TableMemory::place_sgl`] of a payload given or already in place ([`Payload`]).
    pub fn place_in_sgl(
        &mut self,
        sgl: &[Sge],
        offset: u64,
        payload: Payload<'_>,
    ) -> Result<(), AccessError> {
        let need = Access::LOCAL_WRITE;
        // Every piece is checked before any is written, so that a list is placed whole or not
        // at all. Bytes for a single element are one piece, checked where they are written.
        if sgl.len() > 1 || matches!(payload, Payload::InPlace { .. }) {
            walk(sgl, offset, payload.len(), |s, to, r| self.check(s.lkey, to, r.len() as u64, need))?;
        }
        match payload {
            Payload::Bytes(data) => walk(sgl, offset, data.len(), |s, to, r| {
                place_tagged(self.table, self.pd, s.lkey, TaggedOffset(to), &data[r], need)
            }),
            Payload::InPlace { refused, .. } => refused.map_or(Ok(()), Err),
        }
    }

    /// Reads message bytes `[offset, offset + out.len())` gathered from the local buffer `sgl`
    /// (local access: no right needed). On error `out` may hold part of the bytes.
    pub fn gather_sgl(&self, sgl: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
        walk(sgl, offset, out.len(), |s, to, r| {
            fetch_tagged(self.table, self.pd, s.lkey, TaggedOffset(to), &mut out[r], Access::NONE)
        })
    }

    /// The region bytes `[to, to + len)` of `stag`, borrowed, after the checks of
    /// [`fetch_tagged`] (for a transmit path that sends them from where they are).
    pub fn source(&self, stag: STag, to: u64, len: usize, needed: Access) -> Result<&[u8], AccessError> {
        let len64 = u64::try_from(len).map_err(|_| AccessError::ToWrap)?;
        let (memory, offset) = self.table.checked_memory(stag, self.pd, needed, TaggedOffset(to), len64)?;
        memory.slice(offset, len).ok_or(AccessError::BaseOrBounds)
    }

    /// Checks the message bytes `[offset, offset + len)` of the local buffer `sgl` as
    /// [`TableMemory::gather_sgl`] does, and calls `f(lkey, tagged offset, length)` for each
    /// piece of them on an element, in order, once all are checked.
    pub fn sgl_pieces(
        &self,
        sgl: &[Sge],
        offset: u64,
        len: usize,
        mut f: impl FnMut(STag, u64, usize),
    ) -> Result<(), AccessError> {
        walk(sgl, offset, len, |s, to, r| self.check(s.lkey, to, r.len() as u64, Access::NONE))?;
        walk(sgl, offset, len, |s, to, r| {
            f(s.lkey, to, r.len());
            Ok(())
        })
    }

    /// Applies an RFC 7306 atomic to the 64-bit value at `to` of `stag` (remote atomic rights,
    /// 8-byte aligned in its region): stores `f(original)` and returns `original`, as one
    /// read-modify-write no other access through the stack can interleave with.
    pub fn atomic(&mut self, stag: STag, to: u64, f: impl FnOnce(u64) -> u64) -> Result<u64, AccessError> {
        let (memory, offset) =
            self.table.checked_memory_mut(stag, self.pd, Access::REMOTE_ATOMIC, TaggedOffset(to), 8)?;
        // Unaligned targets are refused (RFC 7306 requires 8-byte alignment).
        memory.fetch_update_u64(offset, f).ok_or(AccessError::BaseOrBounds)
    }

    /// Invalidates `stag` for a peer's Send with Invalidate, if verbs let the peer
    /// ([`TaggedBufferTable::invalidate_remote`]: a valid window, or a valid region with remote
    /// rights and no window bound, of this protection domain); afterwards every access through
    /// it fails.
    pub fn invalidate_remote(&mut self, stag: STag) -> Result<(), InvalidateError> {
        self.table.invalidate_remote(stag, self.pd)
    }

    /// A local invalidate work request: `stag` (a region or window of this protection domain,
    /// valid) becomes invalid.
    pub fn invalidate_local(&mut self, stag: STag) -> Result<(), TableError> {
        match self.table.get(stag) {
            Some(e) if e.pd != self.pd => Err(TableError::PdMismatch(stag)),
            Some(e) if !e.valid => Err(TableError::NotValid(stag)),
            Some(_) => self.table.invalidate(stag),
            None => Err(TableError::NoSuchStag(stag)),
        }
    }

    /// A fast-register work request: the invalid region at `stag`'s index, in this protection
    /// domain, takes `stag`'s key, `spec`'s range and rights, and becomes valid.
    pub fn fast_register(&mut self, stag: STag, spec: RegionSpec) -> Result<(), TableError> {
        match self.table.get_index(stag.index()) {
            Some(e) if e.pd != self.pd => Err(TableError::PdMismatch(stag)),
            _ => self.table.fast_register(stag, spec),
        }
    }

    /// A bind work request: the invalid window at `window`'s index, in this protection domain,
    /// takes `window`'s key and is bound to `region` over `spec`.
    pub fn bind_window(&mut self, window: STag, region: STag, spec: RegionSpec) -> Result<(), TableError> {
        self.table.bind_window_at(window, region, self.pd, spec)
    }
}

/// A receive buffer posted on an untagged queue; its [`Capacity`] is its length as DDP sees
/// it.
pub trait PostedBuffer: Capacity {
    /// Where DDP places the payload: the local scatter list, or `None` when the upper layer
    /// reads the payload from the segment itself (RDMAP's own buffers for Read Requests,
    /// Terminates and Atomic Responses, whose messages are one segment each).
    fn scatter_list(&self) -> Option<&[Sge]>;
}

/// What [`UntaggedReceiver::handle_segment`] did with a segment.
#[derive(Debug)]
pub struct Received<B> {
    /// Where the payload went (queue, MSN, MO, and on the last segment the message length).
    pub placement: UntaggedPlacement,
    /// On the message's last segment: the buffer it filled, consumed.
    pub completed: Option<B>,
}

/// The untagged receive side of one stream: [`UntaggedQueues`] holding the buffers posted on
/// each queue. [`UntaggedReceiver::handle_segment`] checks a segment, places its payload and
/// reports the message's completion.
#[derive(Debug)]
pub struct UntaggedReceiver<B> {
    queues: UntaggedQueues<B>,
}

impl<B: PostedBuffer> UntaggedReceiver<B> {
    /// Empty queues, each holding at most `max_posted` buffers.
    pub fn new(max_posted: usize) -> UntaggedReceiver<B> {
        UntaggedReceiver { queues: UntaggedQueues::new(max_posted) }
    }

    /// The queues' state (expected MSNs, posted buffers, next MOs).
    pub fn queues(&self) -> &UntaggedQueues<B> {
        &self.queues
    }

    /// Posts `buffer` on queue `qn`; returns the MSN of the message it receives, or the
    /// buffer back with the reason.
    pub fn post(&mut self, qn: QueueNumber, buffer: B) -> Result<Msn, (PostError, B)> {
        self.queues.post_buffer(qn, buffer)
    }

    /// Buffers posted on `qn` and not yet consumed (0 for an invalid QN).
    pub fn posted(&self, qn: QueueNumber) -> usize {
        self.queues.posted(qn).unwrap_or(0)
    }

    /// The buffer the next message on `qn` goes into.
    pub fn front(&self, qn: QueueNumber) -> Option<&B> {
        self.queues.front(qn)
    }

    /// Takes the front buffer of `qn` off the queue without a message (the message for it
    /// failed and the stream ends).
    pub fn discard_front(&mut self, qn: QueueNumber) -> Option<B> {
        self.queues.discard_front(qn)
    }

    /// Takes every buffer posted on `qn` off the queue (the stream is flushed).
    pub fn drain(&mut self, qn: QueueNumber) -> Vec<B> {
        let mut out = Vec::new();
        while let Some(b) = self.discard_front(qn) {
            out.push(b);
        }
        out
    }

    /// Checks one untagged segment and places its payload into the front buffer of its queue
    /// at the segment's MO (nothing, for a buffer without a scatter list). On the last segment
    /// of a message the buffer is consumed and returned. On error nothing is written and the
    /// queues do not change; the stream must be terminated with the error's code.
    pub fn handle_segment(
        &mut self,
        mem: &mut TableMemory<'_>,
        kind: SegmentKind,
        last: bool,
        payload: &[u8],
    ) -> Result<Received<B>, UntaggedError> {
        self.handle(mem, kind, last, Payload::Bytes(payload))
    }

    /// The buffer a segment's payload would go into, if the segment passes the checks of
    /// [`UntaggedReceiver::handle`] now and its buffer has a scatter list (for a receive path
    /// that reads the payload straight into place). Changes nothing.
    pub fn sink(&self, kind: SegmentKind, last: bool, payload_len: usize) -> Option<&[Sge]> {
        let SegmentKind::Untagged { qn, .. } = kind else { return None };
        self.queues.check(kind, last, payload_len).ok()?;
        self.front(qn)?.scatter_list()
    }

    /// [`UntaggedReceiver::handle_segment`] of a payload given or already in place
    /// ([`Payload`]).
    pub fn handle(
        &mut self,
        mem: &mut TableMemory<'_>,
        kind: SegmentKind,
        last: bool,
        payload: Payload<'_>,
    ) -> Result<Received<B>, UntaggedError> {
        let (qn, mo) = match kind {
            SegmentKind::Untagged { qn, mo, .. } => (qn, u64::from(mo)),
            SegmentKind::Tagged { .. } => return Err(UntaggedError::NotUntagged),
        };
        // Place before recording, so that a refused segment changes nothing. The check covers
        // the queue, the MSN, and MO + length against the front buffer's capacity; placing into
        // the scatter list checks its elements.
        let placement = self.queues.check(kind, last, payload.len())?;
        let buffer = self.queues.front(qn).ok_or(UntaggedError::NoBuffer { qn, msn: placement.msn })?;
        match buffer.scatter_list() {
            Some(sgl) => mem.place_in_sgl(sgl, mo, payload).map_err(UntaggedError::LocalBuffer)?,
            // Nothing placed; a payload read into place had nowhere to go.
            None if matches!(payload, Payload::InPlace { len: 1.., .. }) => {
                return Err(UntaggedError::LocalBuffer(AccessError::BaseOrBounds));
            }
            None => {}
        }
        let completed = self.queues.record(placement, payload.len());
        Ok(Received { placement, completed })
    }
}

/// A model-checked placement run on arbitrary bytes, for the `ddp_placement` fuzz target and
/// the placement-safety property test. It builds a small table (regions with VA and
/// zero-based addressing, another PD, read-only rights, a window, guard bytes before and
/// after each region's memory and unregistered bytes at its end, memory of every owned kind)
/// and a posted receive buffer, decodes 8-byte operations (placements with arbitrary STag,
/// PD, rights, TO and length; invalidate; rekey; untagged segments), and after each one
/// asserts that the outcome is the one an independent model predicts and that no byte of any
/// memory changed outside the permitted range. At the end every region is deregistered and its
/// guard bytes are checked. Panics on a violation.
#[doc(hidden)]
pub fn fuzz_placement(data: &[u8]) {
    model::run(data);
}

mod model {
    use super::*;
    use crate::dma::{Buffer, GuardedBuffer};
    use crate::stag_table::Addressing;

    const PD1: ProtectionDomainId = ProtectionDomainId(1);
    const PD2: ProtectionDomainId = ProtectionDomainId(2);
    const GUARD: u8 = 0xc3;

    struct ModelEntry {
        stag: STag,
        pd: ProtectionDomainId,
        access: Access,
        first_to: u64,
        len: u64,
        /// Index into the memories.
        memory: usize,
        /// The entry's first byte in its memory.
        offset_in_memory: u64,
        /// The model index of a window's region.
        parent: Option<usize>,
        /// A window invalidated (and so unbound from its region).
        unbound: bool,
        valid: bool,
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i.to_le_bytes()[0].wrapping_mul(37))).collect()
    }

    fn access_of(bits: u8) -> Access {
        Access {
            local_write: bits & 1 != 0,
            remote_read: bits & 2 != 0,
            remote_write: bits & 4 != 0,
            remote_atomic: bits & 8 != 0,
        }
    }

    #[derive(Debug)]
    struct Recv(Vec<Sge>, u64);

    impl Capacity for Recv {
        fn capacity(&self) -> u64 {
            self.1
        }
    }

    impl PostedBuffer for Recv {
        fn scatter_list(&self) -> Option<&[Sge]> {
            Some(&self.0)
        }
    }

    /// The memory of region `i` (each kind the stack registers, guarded ones twice).
    fn memory(i: usize, bytes: &[u8]) -> RegionMemory {
        match i {
            0 => RegionMemory::new(GuardedBuffer::new(16, bytes, 16, GUARD)),
            1 => RegionMemory::new(bytes.to_vec()),
            2 => RegionMemory::new(bytes.to_vec().into_boxed_slice()),
            3 => RegionMemory::new(bytes::BytesMut::from(bytes)),
            _ => RegionMemory::new(GuardedBuffer::new(3, bytes, 5, GUARD)),
        }
    }

    pub(super) fn run(data: &[u8]) {
        // A fixed seed: a fuzzer's input must replay the same way.
        let mut table = TaggedBufferTable::with_seed(16, 0);
        // Memory lengths: each region leaves some unregistered bytes at the end of its memory.
        let lens = [72usize, 40, 56, 32, 40];
        let mut model: Vec<Vec<u8>> = lens.iter().map(|&n| pattern(n, 0x11)).collect();
        let mut seen_buf = [0u8; 72];
        let rw = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);
        // (pd, base, len, access, addressing)
        let regions = [
            (PD1, 0x1000u64, 64u64, rw, Addressing::VirtualAddress),
            (PD1, 0x2000, 37, Access::REMOTE_WRITE, Addressing::ZeroBased),
            (PD2, u64::MAX - 48, 48, Access::ALL, Addressing::VirtualAddress),
            (PD1, 0x3000, 30, Access::REMOTE_READ.union(Access::LOCAL_WRITE), Addressing::VirtualAddress),
            // The receive buffer's region (memory 4).
            (PD1, 0x4000, 36, Access::LOCAL_WRITE, Addressing::VirtualAddress),
        ];
        let mut entries = Vec::new();
        for (i, (pd, base_va, len, access, addressing)) in regions.into_iter().enumerate() {
            let spec = RegionSpec { base_va, len, access, addressing };
            let Some(initial) = model.get(i) else { return };
            let Ok(stag) = table.register(pd, spec, memory(i, initial)) else {
                panic!("register failed");
            };
            let first_to = if addressing == Addressing::ZeroBased { 0 } else { base_va };
            entries.push(ModelEntry {
                stag,
                pd,
                access,
                first_to,
                len,
                memory: i,
                offset_in_memory: 0,
                parent: None,
                unbound: false,
                valid: true,
            });
        }
        // A window on region 0: [0x1010, 0x1020), remote write.
        let Some(region0) = entries.first().map(|e| e.stag) else { return };
        let spec = RegionSpec {
            base_va: 0x1010,
            len: 16,
            access: Access::REMOTE_WRITE,
            addressing: Addressing::VirtualAddress,
        };
        let Ok(window) = table.bind_window(region0, PD1, spec) else { panic!("bind failed") };
        entries.push(ModelEntry {
            stag: window,
            pd: PD1,
            access: Access::REMOTE_WRITE,
            first_to: 0x1010,
            len: 16,
            memory: 0,
            offset_in_memory: 0x10,
            parent: Some(0),
            unbound: false,
            valid: true,
        });
        // Receive buffers over region 4: [2, 10), [10, 11), [20, 36): 25 bytes, posted on
        // queue 0 with the region's STag at the time of posting.
        let sgl_map: Vec<usize> = (2..10).chain(10..11).chain(20..36).collect();
        let sgl_of = |stag: STag| -> Vec<Sge> {
            [(2u64, 8u32), (10, 1), (20, 16)]
                .iter()
                .map(|&(off, len)| Sge { lkey: stag, addr: 0x4000 + off, len })
                .collect()
        };
        let mut receiver: UntaggedReceiver<Recv> = UntaggedReceiver::new(4);
        // The receive buffer's posted STag; the message offset in progress.
        let mut posted: VecDeque<STag> = VecDeque::new();
        let mut next_mo = 0u64;
        let mut msn = 1u32;

        for op in data.chunks(8) {
            let mut b = [0u8; 8];
            b[..op.len()].copy_from_slice(op);
            let n = entries.len();
            let pick = usize::from(b[1]) % (n + 1);
            match b[0] % 8 {
                0 => {
                    // A region keeps its registration while a window is bound to it.
                    let windows_bound = entries.iter().any(|w| w.parent == Some(pick) && !w.unbound);
                    if let Some(e) = entries.get_mut(pick) {
                        let r = table.invalidate(e.stag);
                        if windows_bound {
                            assert_eq!(r, Err(TableError::WindowsBound(e.stag)), "invalidate");
                        } else {
                            assert!(r.is_ok(), "invalidate {r:?}");
                            e.valid = false;
                            // Invalidation unbinds a window for good (until bound anew).
                            e.unbound |= e.parent.is_some();
                        }
                    }
                }
                1 => {
                    if let Some(e) = entries.get_mut(pick) {
                        let r = table.rekey(e.stag, b[2]);
                        if e.unbound {
                            assert_eq!(r, Err(TableError::Unbound(e.stag)), "rekey of an unbound window");
                        } else {
                            let Ok(stag) = r else { panic!("rekey {r:?}") };
                            e.stag = stag;
                            e.valid = true;
                        }
                    }
                }
                2 => {
                    // Post a receive buffer (up to 4), or deliver an untagged segment.
                    if b[2] & 1 == 0 && posted.len() < 4 {
                        let stag = entries.get(4).map_or(STag(0), |e| e.stag);
                        assert!(receiver.post(QueueNumber::Send, Recv(sgl_of(stag), 25)).is_ok());
                        posted.push_back(stag);
                        continue;
                    }
                    let mo = if b[3] & 1 == 0 { next_mo } else { u64::from(b[4] % 32) };
                    let payload = pattern(usize::from(b[6] % 32), b[7]);
                    let last = b[5] & 1 != 0;
                    let seg_msn = if b[3] & 2 == 0 { msn } else { msn.wrapping_add(u32::from(b[4] & 1)) };
                    let kind = SegmentKind::Untagged {
                        rdmap_word: 0,
                        qn: QueueNumber::Send,
                        msn: Msn(seg_msn),
                        mo: u32::try_from(mo).unwrap_or(u32::MAX),
                    };
                    let end = mo + payload.len() as u64;
                    let region4 = entries.get(4);
                    let expect_ok = seg_msn == msn
                        && mo == next_mo
                        && end <= 25
                        && posted.front().is_some_and(|&s| {
                            // An empty payload touches no element, so a stale lkey is no error.
                            payload.is_empty() || region4.is_some_and(|e| e.valid && e.stag == s)
                        });
                    let mut mem = TableMemory { table: &mut table, pd: PD1 };
                    let r = receiver.handle_segment(&mut mem, kind, last, &payload);
                    assert_eq!(
                        r.is_ok(),
                        expect_ok,
                        "untagged msn {seg_msn} mo {mo} len {}: {r:?}",
                        payload.len()
                    );
                    if let Ok(got) = r {
                        for (i, &byte) in payload.iter().enumerate() {
                            let at = usize::try_from(mo).unwrap_or(usize::MAX) + i;
                            if let (Some(&pos), Some(m)) = (sgl_map.get(at), model.get_mut(4))
                                && let Some(slot) = m.get_mut(pos)
                            {
                                *slot = byte;
                            }
                        }
                        assert_eq!(got.completed.is_some(), last);
                        if last {
                            posted.pop_front();
                            next_mo = 0;
                            msn = msn.wrapping_add(1);
                        } else {
                            next_mo = end;
                        }
                    }
                }
                _ => {
                    let flip_key = b[2] & 0x80 != 0;
                    let pd = if b[2] & 0x40 != 0 { PD2 } else { PD1 };
                    let needed = access_of(b[3]);
                    let delta = i64::from(i16::from_le_bytes([b[4], b[5]]) / 256);
                    let payload = pattern(usize::from(b[6] % 80), b[7]);
                    let len = payload.len() as u64;
                    let stag = match entries.get(pick) {
                        Some(e) if flip_key => STag(e.stag.0 ^ 1),
                        Some(e) => e.stag,
                        // Garbage STag, any key: the index of an entry (indices are spread
                        // over 24 bits, so few small ones exist), or 0..=7, from b5.
                        None => {
                            let index = match entries.get(usize::from(b[5] >> 4)) {
                                Some(e) if b[5] & 0x08 != 0 => e.stag.index(),
                                _ => u32::from(b[5] & 0x07),
                            };
                            STag((index << 8) | u32::from(b[2]))
                        }
                    };
                    // The model entry the STag names exactly, if any (a garbage STag may
                    // happen to be a live one; a flipped key names none).
                    let entry = entries.iter().find(|e| e.stag == stag);
                    let base = entries.get(pick).map_or(0, |e| e.first_to);
                    let to = if b[2] & 0x20 != 0 {
                        u64::MAX.wrapping_sub(delta.unsigned_abs())
                    } else {
                        base.wrapping_add_signed(delta)
                    };
                    let permitted = entry.and_then(|e| {
                        let parent_valid = e.parent.and_then(|p| entries.get(p)).is_none_or(|p| p.valid);
                        let in_bounds = to >= e.first_to
                            && to.checked_add(len).is_some_and(|end| end <= e.first_to + e.len);
                        let ok = e.valid
                            && !e.unbound
                            && parent_valid
                            && e.pd == pd
                            && e.access.contains(needed)
                            && (needed.remote_write || needed.local_write)
                            && in_bounds;
                        ok.then(|| (e.memory, e.offset_in_memory + (to - e.first_to)))
                    });
                    let r = place_tagged(&mut table, pd, stag, TaggedOffset(to), &payload, needed);
                    assert_eq!(
                        r.is_ok(),
                        permitted.is_some(),
                        "stag {stag} to {to:#x} len {len} {needed} {pd}: {r:?}"
                    );
                    if let (Ok(()), Some((memory, offset))) = (r, permitted) {
                        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
                        if let Some(range) =
                            model.get_mut(memory).and_then(|m| m.get_mut(offset..offset + payload.len()))
                        {
                            range.copy_from_slice(&payload);
                        }
                    }
                    // Reading back through the same checks gives the model's bytes, or
                    // nothing when the model refuses.
                    let mut out = vec![0u8; payload.len()];
                    let read = fetch_tagged(&table, pd, stag, TaggedOffset(to), &mut out, Access::NONE);
                    if let (Ok(()), Some(e)) = (read, entry) {
                        let at = e.offset_in_memory + to.wrapping_sub(e.first_to);
                        let at = usize::try_from(at).unwrap_or(usize::MAX);
                        let expect = model.get(e.memory).and_then(|m| m.get(at..at + out.len()));
                        assert_eq!(Some(&out[..]), expect, "read back through {stag}");
                    }
                }
            }
            // Read back into one buffer for the whole run: no allocation per operation (the
            // per-operation allocations made the ddp_placement fuzz target slow).
            for (i, expect) in model.iter().enumerate() {
                let seen = &mut seen_buf[..expect.len()];
                let got = entries.get(i).and_then(|e| table.memory(e.stag)).map(|m| m.read(0, seen));
                assert_eq!(got, Some(Ok(())), "memory {i} cannot be read back");
                assert_eq!(&seen[..], &expect[..], "memory {i} differs from the model");
            }
        }
        // Deregister everything: each buffer comes back as it went in, with the model's bytes,
        // and no guard byte around a guarded buffer changed.
        if let Some(w) = entries.get(5) {
            assert!(table.deregister(w.stag).is_ok());
        }
        for (i, expect) in model.iter().enumerate() {
            let Some(e) = entries.get(i) else { continue };
            let Ok((_, Some(memory))) = table.deregister(e.stag) else { panic!("deregister {i}") };
            match memory.into_buffer() {
                Buffer::Guarded(g) => {
                    assert!(g.guards_hold(GUARD), "guard bytes of memory {i} changed");
                    assert_eq!(g.window(), &expect[..]);
                }
                other => assert_eq!(other.as_slice(), Some(&expect[..])),
            }
        }
        assert!(table.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stag_table::Addressing;
    use proptest::prelude::*;

    const PD: ProtectionDomainId = ProtectionDomainId(3);
    const BASE: u64 = 0x7f00_0000_1000;

    fn spec(base_va: u64, len: u64, access: Access, addressing: Addressing) -> RegionSpec {
        RegionSpec { base_va, len, access, addressing }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| i.to_le_bytes()[0].wrapping_mul(13).wrapping_add(seed)).collect()
    }

    fn bytes(t: &TaggedBufferTable, s: STag) -> Vec<u8> {
        t.memory(s).unwrap().to_vec()
    }

    #[test]
    fn tagged_across_the_region_va() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::zeroed(8192);
        let s = t.register(PD, spec(BASE, 8192, Access::REMOTE_WRITE, Addressing::VirtualAddress), m);
        let s = s.unwrap();
        let message = pattern(8192, 1);
        // siw's segmentation of an 8 KiB Write: 5 x 1428 + 1052.
        for (i, chunk) in message.chunks(1428).enumerate() {
            let to = TaggedOffset(BASE + 1428 * i as u64);
            place_tagged(&mut t, PD, s, to, chunk, Access::REMOTE_WRITE).unwrap();
        }
        assert_eq!(bytes(&t, s), message);
        // Out of bounds by one byte at either end writes nothing.
        let before = bytes(&t, s);
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            place_tagged(&mut t, PD, s, TaggedOffset(BASE - 1), &[0], w),
            Err(AccessError::BaseOrBounds)
        );
        assert_eq!(
            place_tagged(&mut t, PD, s, TaggedOffset(BASE + 8191), &[0, 0], w),
            Err(AccessError::BaseOrBounds)
        );
        assert_eq!(place_tagged(&mut t, PD, s, TaggedOffset(u64::MAX), &[0, 0], w), Err(AccessError::ToWrap));
        assert_eq!(place_tagged(&mut t, PD, s, TaggedOffset(BASE + 8192), &[], w), Ok(()));
        assert_eq!(bytes(&t, s), before);
        let mut out = [0u8; 3];
        assert_eq!(
            fetch_tagged(&t, PD, s, TaggedOffset(BASE + 1), &mut out, Access::REMOTE_READ),
            Err(AccessError::AccessRights)
        );
        fetch_tagged(&t, PD, s, TaggedOffset(BASE + 1), &mut out, Access::REMOTE_WRITE).unwrap();
        assert_eq!(out, message[1..4]);
    }

    #[test]
    fn tagged_zero_based_and_window() {
        let mut t = TaggedBufferTable::new(8);
        let rw = Access::REMOTE_WRITE.union(Access::LOCAL_WRITE);
        let s =
            t.register(PD, spec(BASE, 100, rw, Addressing::ZeroBased), RegionMemory::zeroed(100)).unwrap();
        place_tagged(&mut t, PD, s, TaggedOffset(90), b"0123456789", Access::REMOTE_WRITE).unwrap();
        assert_eq!(&bytes(&t, s)[90..], b"0123456789");
        assert_eq!(
            place_tagged(&mut t, PD, s, TaggedOffset(BASE), b"x", Access::REMOTE_WRITE),
            Err(AccessError::BaseOrBounds)
        );
        let w = t
            .bind_window(s, PD, spec(BASE + 10, 5, Access::REMOTE_WRITE, Addressing::VirtualAddress))
            .unwrap();
        place_tagged(&mut t, PD, w, TaggedOffset(BASE + 11), b"abcd", Access::REMOTE_WRITE).unwrap();
        assert_eq!(&bytes(&t, s)[10..16], b"\0abcd\0");
        // A read-only need is not a write right: refused, nothing written.
        assert_eq!(
            place_tagged(&mut t, PD, s, TaggedOffset(0), b"zz", Access::NONE),
            Err(AccessError::AccessRights)
        );
        assert_eq!(&bytes(&t, s)[..2], b"\0\0");
    }

    #[test]
    fn invalidated_or_other_pd_never_writes() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::new(vec![0x5a; 64]);
        let s = t.register(PD, spec(BASE, 64, Access::ALL, Addressing::VirtualAddress), m).unwrap();
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            place_tagged(&mut t, ProtectionDomainId(4), s, TaggedOffset(BASE), &[1; 8], w),
            Err(AccessError::StagNotAssociated)
        );
        t.invalidate(s).unwrap();
        for to in [BASE, BASE + 8, BASE + 63] {
            assert_eq!(place_tagged(&mut t, PD, s, TaggedOffset(to), &[1], w), Err(AccessError::InvalidStag));
        }
        assert_eq!(bytes(&t, s), vec![0x5a; 64]);
        // Deregistered: the STag is gone; the application's memory comes back intact.
        let (_, memory) = t.deregister(s).unwrap();
        assert_eq!(place_tagged(&mut t, PD, s, TaggedOffset(BASE), &[1], w), Err(AccessError::InvalidStag));
        assert_eq!(memory.unwrap().into_buffer().into_vec(), Some(vec![0x5a; 64]));
    }

    /// Two regions and the scatter list the tests use: [3, 8) of A, [0, 0) and [8, 16) of B,
    /// [12, 16) of A: 17 bytes.
    fn sgl(t: &mut TaggedBufferTable) -> (STag, STag, Vec<Sge>) {
        let lw = Access::LOCAL_WRITE;
        let a = t.register(PD, spec(0x1000, 16, lw, Addressing::VirtualAddress), RegionMemory::zeroed(16));
        let b = t.register(PD, spec(0, 16, lw, Addressing::ZeroBased), RegionMemory::zeroed(16));
        let (a, b) = (a.unwrap(), b.unwrap());
        let sges = vec![
            Sge { lkey: a, addr: 0x1003, len: 5 },
            Sge { lkey: b, addr: 0, len: 0 },
            Sge { lkey: b, addr: 8, len: 8 },
            Sge { lkey: a, addr: 0x100c, len: 4 },
        ];
        (a, b, sges)
    }

    #[test]
    fn scatter_and_gather_across_sges() {
        let mut t = TaggedBufferTable::new(8);
        let (a, b, sges) = sgl(&mut t);
        assert_eq!(sgl_len(&sges), 17);
        let mut mem = TableMemory { table: &mut t, pd: PD };
        mem.place_sgl(&sges, 0, b"ABCDEFGHIJKLMNOPQ").unwrap();
        // Mid-SGE start crossing two boundaries.
        mem.place_sgl(&sges, 4, b"xyz").unwrap();
        mem.place_sgl(&sges, 17, b"").unwrap();
        let mut out = [0u8; 17];
        mem.gather_sgl(&sges, 0, &mut out).unwrap();
        assert_eq!(&out, b"ABCDxyzHIJKLMNOPQ");
        let mut mid = [0u8; 4];
        mem.gather_sgl(&sges, 6, &mut mid).unwrap();
        assert_eq!(&mid, b"zHIJ");
        assert_eq!(&bytes(&t, a)[3..8], b"ABCDx");
        assert_eq!(&bytes(&t, b)[8..16], b"yzHIJKLM");
        assert_eq!(&bytes(&t, a)[12..16], b"NOPQ");
    }

    #[test]
    fn refused_scatter_writes_nothing() {
        let mut t = TaggedBufferTable::new(8);
        let (a, b, mut sges) = sgl(&mut t);
        let before = (bytes(&t, a), bytes(&t, b));
        let mut mem = TableMemory { table: &mut t, pd: PD };
        assert_eq!(mem.place_sgl(&sges, 10, &[1; 8]), Err(AccessError::BaseOrBounds), "past the list");
        assert_eq!(mem.place_sgl(&sges, u64::MAX, &[1]), Err(AccessError::BaseOrBounds));
        assert_eq!(mem.place_sgl(&[], 0, &[1]), Err(AccessError::BaseOrBounds));
        assert_eq!(mem.gather_sgl(&sges, 17, &mut [0]), Err(AccessError::BaseOrBounds));
        // The last element's lkey is stale: the first elements are not written either.
        sges[3].lkey = STag(a.0 ^ 1);
        assert_eq!(mem.place_sgl(&sges, 0, &[1; 17]), Err(AccessError::InvalidStag));
        // Another protection domain's stream may not use them.
        let mut other = TableMemory { table: &mut t, pd: ProtectionDomainId(4) };
        assert_eq!(other.place_sgl(&sges[..1], 0, &[1]), Err(AccessError::StagNotAssociated));
        assert_eq!((bytes(&t, a), bytes(&t, b)), before);
        // Local write is needed to place, nothing to gather.
        let ro = t
            .register(
                PD,
                spec(0, 4, Access::REMOTE_READ, Addressing::ZeroBased),
                RegionMemory::new(b"read".to_vec()),
            )
            .unwrap();
        let mut mem = TableMemory { table: &mut t, pd: PD };
        let sge = [Sge { lkey: ro, addr: 0, len: 4 }];
        assert_eq!(mem.place_sgl(&sge, 0, b"xxxx"), Err(AccessError::AccessRights));
        let mut out = [0u8; 4];
        mem.gather_sgl(&sge, 0, &mut out).unwrap();
        assert_eq!(&out, b"read");
    }

    #[test]
    fn atomics_and_invalidation_through_table_memory() {
        // Seeded: STag 0x7700 below must name nothing, every run.
        let mut t = TaggedBufferTable::with_seed(8, 1);
        assert!(t.get_index(0x77).is_none());
        let all = t
            .register(PD, spec(0, 24, Access::ALL, Addressing::ZeroBased), RegionMemory::zeroed(24))
            .unwrap();
        let other = t
            .register(
                ProtectionDomainId(5),
                spec(0, 8, Access::ALL, Addressing::ZeroBased),
                RegionMemory::zeroed(8),
            )
            .unwrap();
        let mut mem = TableMemory { table: &mut t, pd: PD };
        assert_eq!(mem.atomic(all, 8, |v| v + 5), Ok(0));
        assert_eq!(mem.atomic(all, 8, |v| v * 2), Ok(5));
        assert_eq!(mem.atomic(all, 4, |v| v), Err(AccessError::BaseOrBounds), "unaligned");
        assert_eq!(mem.atomic(all, 20, |v| v), Err(AccessError::BaseOrBounds), "past the end");
        assert_eq!(mem.atomic(other, 0, |v| v), Err(AccessError::StagNotAssociated));
        assert!(mem.check(all, 0, 24, Access::REMOTE_READ).is_ok());
        assert_eq!(mem.invalidate_remote(other), Err(InvalidateError::OtherDomain));
        assert_eq!(mem.invalidate_remote(STag(0x7700)), Err(InvalidateError::NoSuchStag));
        mem.invalidate_remote(all).unwrap();
        assert_eq!(mem.invalidate_remote(all), Err(InvalidateError::NoSuchStag), "already invalid");
        assert_eq!(mem.invalidate_local(all), Err(TableError::NotValid(all)));
        assert_eq!(mem.invalidate_local(other), Err(TableError::PdMismatch(other)));
        // Fast-register makes it valid again under a new key.
        let again = STag::from_parts(all.index(), all.key().wrapping_add(1)).unwrap();
        let s = spec(0x9000, 16, Access::REMOTE_WRITE, Addressing::VirtualAddress);
        mem.fast_register(again, s).unwrap();
        assert_eq!(mem.place_tagged(all, 0x9000, b"x", Access::REMOTE_WRITE), Err(AccessError::InvalidStag));
        mem.place_tagged(again, 0x9000, b"x", Access::REMOTE_WRITE).unwrap();
        let mut other_pd = TableMemory { table: &mut t, pd: ProtectionDomainId(5) };
        other_pd.invalidate_local(other).unwrap();
        let other2 = STag::from_parts(other.index(), 9).unwrap();
        let mut mem = TableMemory { table: &mut t, pd: PD };
        assert_eq!(mem.fast_register(other2, s), Err(TableError::PdMismatch(other2)));
        assert_eq!(mem.fast_register(STag(0x7700), s), Err(TableError::NoSuchStag(STag(0x7700))));
        assert_eq!(mem.invalidate_local(STag(0x7700)), Err(TableError::NoSuchStag(STag(0x7700))));
        let w = mem.table.allocate_window(PD).unwrap();
        let w1 = STag::from_parts(w.index(), 3).unwrap();
        let ws = spec(0x9004, 4, Access::REMOTE_WRITE, Addressing::VirtualAddress);
        mem.bind_window(w1, again, ws).unwrap();
        mem.place_tagged(w1, 0x9004, b"wxyz", Access::REMOTE_WRITE).unwrap();
        // A region with a window bound is not the peer's to invalidate; the window is.
        assert_eq!(mem.invalidate_remote(again), Err(InvalidateError::WindowsBound));
        assert_eq!(mem.invalidate_local(again), Err(TableError::WindowsBound(again)));
        mem.invalidate_local(w1).unwrap();
        assert_eq!(mem.place_tagged(w1, 0x9004, b"w", Access::REMOTE_WRITE), Err(AccessError::InvalidStag));
        assert_eq!(&bytes(&t, again)[..8], b"x\0\0\0wxyz");
        // Bound anew, the window may be invalidated by the peer; then the region may be. A
        // region without remote rights never may.
        let w2 = STag::from_parts(w.index(), 4).unwrap();
        let local = t
            .register(PD, spec(0, 8, Access::LOCAL_WRITE, Addressing::ZeroBased), RegionMemory::zeroed(8))
            .unwrap();
        let mut mem = TableMemory { table: &mut t, pd: PD };
        mem.bind_window(w2, again, ws).unwrap();
        mem.invalidate_remote(w2).unwrap();
        assert_eq!(mem.place_tagged(w2, 0x9004, b"w", Access::REMOTE_WRITE), Err(AccessError::InvalidStag));
        mem.invalidate_remote(again).unwrap();
        assert_eq!(mem.invalidate_remote(local), Err(InvalidateError::LocalOnly));
        assert!(t.get(local).unwrap().valid);
        assert!(
            InvalidateError::LocalOnly.is_protection_error()
                && InvalidateError::OtherDomain.is_protection_error()
        );
        assert!(!InvalidateError::WindowsBound.is_protection_error());
        assert!(!InvalidateError::NoSuchStag.is_protection_error());
        assert_eq!(InvalidateError::WindowsBound.to_string(), "region with memory windows bound");
    }

    #[derive(Debug)]
    struct Buf(Vec<Sge>);

    impl Capacity for Buf {
        fn capacity(&self) -> u64 {
            sgl_len(&self.0)
        }
    }

    impl PostedBuffer for Buf {
        fn scatter_list(&self) -> Option<&[Sge]> {
            Some(&self.0)
        }
    }

    #[derive(Debug)]
    struct Inline(u64);

    impl Capacity for Inline {
        fn capacity(&self) -> u64 {
            self.0
        }
    }

    impl PostedBuffer for Inline {
        fn scatter_list(&self) -> Option<&[Sge]> {
            None
        }
    }

    fn seg(qn: u32, msn: u32, mo: u32) -> SegmentKind {
        SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::from(qn), msn: Msn(msn), mo }
    }

    #[test]
    fn receiver_places_and_consumes() {
        let mut t = TaggedBufferTable::new(8);
        let (a, b, sges) = sgl(&mut t);
        let other = t
            .register(PD, spec(0, 4, Access::LOCAL_WRITE, Addressing::ZeroBased), RegionMemory::zeroed(4))
            .unwrap();
        let mut r: UntaggedReceiver<Buf> = UntaggedReceiver::new(2);
        assert_eq!(r.post(QueueNumber::Send, Buf(sges)).map_err(|(e, _)| e), Ok(Msn(1)));
        let sge = Sge { lkey: other, addr: 0, len: 4 };
        assert_eq!(r.post(QueueNumber::Send, Buf(vec![sge])).map_err(|(e, _)| e), Ok(Msn(2)));
        let (e, _) = r.post(QueueNumber::Unknown(7), Buf(Vec::new())).unwrap_err();
        assert_eq!(e, PostError::InvalidQn(QueueNumber::Unknown(7)));
        assert_eq!(r.posted(QueueNumber::Send), 2);
        assert_eq!(r.posted(QueueNumber::Unknown(7)), 0);
        let mut mem = TableMemory { table: &mut t, pd: PD };
        let got = r.handle_segment(&mut mem, seg(0, 1, 0), false, b"ABCDEFG").unwrap();
        assert_eq!(
            (got.placement.offset, got.placement.completed_len, got.completed.is_none()),
            (0, None, true)
        );
        // Too long: 7 + 11 > 17, nothing written, nothing changes.
        let e = r.handle_segment(&mut mem, seg(0, 1, 7), true, &[b'z'; 11]).unwrap_err();
        assert_eq!(e, UntaggedError::MessageTooLong { end: 18, buffer_len: 17 });
        assert_eq!(r.queues().next_mo(QueueNumber::Send), Some(7));
        let got = r.handle_segment(&mut mem, seg(0, 1, 7), true, b"HIJKLMNOPQ").unwrap();
        assert_eq!(got.placement.completed_len, Some(17));
        assert_eq!(got.completed.unwrap().0.len(), 4);
        // The second buffer's lkey goes stale: a local error, nothing written, no change.
        mem.table.invalidate(other).unwrap();
        let e = r.handle_segment(&mut mem, seg(0, 2, 0), true, b"wxyz").unwrap_err();
        assert_eq!(e, UntaggedError::LocalBuffer(AccessError::InvalidStag));
        assert_eq!(r.queues().expected_msn(QueueNumber::Send), Some(Msn(2)));
        let other = mem.table.rekey(other, 1).unwrap();
        let _ = other;
        // A rekeyed lkey no longer matches the posted one either: discard the buffer.
        assert!(r.discard_front(QueueNumber::Send).is_some());
        assert!(matches!(
            r.handle_segment(&mut mem, seg(0, 2, 0), true, b""),
            Err(UntaggedError::NoBuffer { .. })
        ));
        let tagged = SegmentKind::Tagged { stag: STag(1), to: TaggedOffset(0) };
        assert_eq!(r.handle_segment(&mut mem, tagged, true, b"").unwrap_err(), UntaggedError::NotUntagged);
        assert!(matches!(
            r.handle_segment(&mut mem, seg(5, 1, 0), true, b""),
            Err(UntaggedError::InvalidQn(_))
        ));
        assert_eq!(&bytes(&t, a)[3..8], b"ABCDE");
        assert_eq!(&bytes(&t, b)[8..16], b"FGHIJKLM");
        assert_eq!(&bytes(&t, a)[12..16], b"NOPQ");
    }

    #[test]
    fn receiver_without_scatter_list_places_nothing() {
        let mut t = TaggedBufferTable::new(8);
        let mut r: UntaggedReceiver<Inline> = UntaggedReceiver::new(2);
        assert!(r.post(QueueNumber::ReadRequest, Inline(28)).is_ok());
        assert!(r.post(QueueNumber::ReadRequest, Inline(28)).is_ok());
        assert!(r.post(QueueNumber::ReadRequest, Inline(28)).is_err(), "full");
        assert_eq!(r.front(QueueNumber::ReadRequest).map(|b| b.0), Some(28));
        let mut mem = TableMemory { table: &mut t, pd: PD };
        let got = r.handle_segment(&mut mem, seg(1, 1, 0), true, &[7; 28]).unwrap();
        assert_eq!(got.placement.completed_len, Some(28));
        assert_eq!(r.drain(QueueNumber::ReadRequest).len(), 1);
        assert_eq!(r.posted(QueueNumber::ReadRequest), 0);
    }

    #[test]
    fn fuzz_seeds_run() {
        fuzz_placement(&[]);
        fuzz_placement(&[3, 0, 0, 4, 0, 0, 10, 1]);
        // Invalidate region 0, then try to write through it and its window.
        fuzz_placement(&[0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 4, 0, 0, 10, 1, 3, 5, 0, 4, 0, 0, 5, 1]);
        // Post two receives, deliver a message in two segments, then a bad MO.
        fuzz_placement(&[2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        fuzz_placement(&[
            2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0, 9, 9, 2, 0, 1, 0, 0, 1, 16, 3, 2, 0, 1, 1, 7, 1, 2, 2,
        ]);
        // Invalidate and rekey the window (refused: invalidation unbound it).
        fuzz_placement(&[0, 5, 0, 0, 0, 0, 0, 0, 1, 5, 9, 0, 0, 0, 0, 0, 3, 5, 0, 4, 0, 0, 5, 1]);
    }

    proptest! {
        /// Placement safety: arbitrary (STag, PD, TO, length, rights) placements, invalidations,
        /// rekeys and untagged segments of arbitrary bytes; after each, every byte of every
        /// memory outside a permitted range is unchanged, and nothing panics.
        #[test]
        fn placement_safety(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            fuzz_placement(&data);
        }

        /// The same with operations biased toward tagged placements near the regions.
        #[test]
        fn placement_safety_tagged(ops in proptest::collection::vec((2u8..8, 0u8..7, any::<u8>(), 0u8..16, any::<i16>(), 0u8..80, any::<u8>()), 0..60)) {
            let data: Vec<u8> = ops.iter().flat_map(|&(op, e, flags, acc, delta, len, fill)| {
                let d = delta.to_le_bytes();
                [op, e, flags, acc, d[0], d[1], len, fill]
            }).collect();
            fuzz_placement(&data);
        }
    }
}
