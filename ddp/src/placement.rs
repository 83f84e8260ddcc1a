//! Placement: writing a segment's payload into registered memory (RFC 5041 sections 3.2 and
//! 3.3).
//!
//! - Tagged ([`place_tagged`]): the segment names an STag and a tagged offset. The table checks
//!   it ([`TaggedBufferTable::check`], in the documented order) and the payload is copied once,
//!   straight from the receive buffer into the region's [`RegionMemory`] at the checked
//!   offset; nothing is staged. A refused segment writes nothing.
//! - Untagged ([`place_untagged`]): the segment's queue, MSN and MO were accepted by
//!   [`UntaggedQueues::accept`](crate::UntaggedQueues::accept), which gives the MO; the payload
//!   goes into the posted receive buffer, a scatter list of [`Sge`]s, at message offset MO,
//!   crossing SGE boundaries as needed. A payload that would run past the buffer's end is the
//!   peer's "message too long" (DDP untagged buffer error 0x05) and writes nothing.
//!
//! The engine may run placements without holding the table borrowed: [`resolve_tagged`] checks
//! and returns its own clone of the region's memory ([`TaggedTarget`]), so the application
//! deregistering the region meanwhile frees nothing under the copy.

use std::sync::Arc;

use std::collections::VecDeque;

use crate::header::{Msn, QueueNumber, STag, SegmentKind, TaggedOffset};
use crate::memory::{OutOfBounds, RegionMemory};
use crate::stag_table::{Access, AccessError, ProtectionDomainId, TaggedBufferTable};
use crate::untagged::{PostError, QUEUE_COUNT, UntaggedError, UntaggedPlacement, UntaggedQueues};

/// A checked tagged access: the region's memory (a clone of the table's [`Arc`]) and the byte
/// offset in it.
#[derive(Debug, Clone)]
pub struct TaggedTarget {
    /// The region's memory.
    pub memory: Arc<RegionMemory>,
    /// The offset of the access's first byte in `memory`.
    pub offset: usize,
}

/// Checks a tagged access of `len` bytes and returns where it goes, holding its own clone of
/// the region's memory. The checks are [`TaggedBufferTable::check`]'s.
pub fn resolve_tagged(
    table: &TaggedBufferTable,
    pd: ProtectionDomainId,
    stag: STag,
    to: TaggedOffset,
    len: u64,
    needed: Access,
) -> Result<TaggedTarget, AccessError> {
    let placement = table.check(stag, pd, needed, to, len)?;
    let memory = table.region_memory(placement.region_index).ok_or(AccessError::BaseOrBounds)?;
    let offset = usize::try_from(placement.offset_in_region).map_err(|_| AccessError::BaseOrBounds)?;
    Ok(TaggedTarget { memory: Arc::clone(memory), offset })
}

/// Places a tagged segment's payload: checks `(stag, pd, needed, to, payload.len())` against
/// the table, then copies `payload` into the region at the checked offset (one copy, no
/// staging).
///
/// `needed` is the right the operation requires (RDMA Write and Read Response:
/// [`Access::REMOTE_WRITE`]); since a placement writes, it must include a write right
/// (remote or local), else the placement is refused with [`AccessError::AccessRights`].
/// On any error nothing is written.
pub fn place_tagged(
    table: &TaggedBufferTable,
    pd: ProtectionDomainId,
    stag: STag,
    to: TaggedOffset,
    payload: &[u8],
    needed: Access,
) -> Result<(), AccessError> {
    let len = u64::try_from(payload.len()).map_err(|_| AccessError::ToWrap)?;
    let placement = table.check(stag, pd, needed, to, len)?;
    if !(needed.remote_write || needed.local_write) {
        return Err(AccessError::AccessRights);
    }
    let Some(memory) = table.region_memory(placement.region_index) else {
        // A region with no memory (allocated invalid, made valid by rekey) has length 0.
        return if payload.is_empty() { Ok(()) } else { Err(AccessError::BaseOrBounds) };
    };
    let offset = usize::try_from(placement.offset_in_region).map_err(|_| AccessError::BaseOrBounds)?;
    // register / fast_register keep every region inside its memory, so this cannot fail.
    memory.write(offset, payload).map_err(|_| AccessError::BaseOrBounds)
}

/// One scatter/gather element of a posted receive buffer: `len` bytes of `memory` from
/// `offset`. Always inside its memory (checked when made).
#[derive(Debug, Clone)]
pub struct Sge {
    memory: Arc<RegionMemory>,
    offset: usize,
    len: usize,
}

impl Sge {
    /// An SGE over `[offset, offset + len)` of `memory`.
    pub fn new(memory: Arc<RegionMemory>, offset: usize, len: usize) -> Result<Sge, OutOfBounds> {
        if !memory.contains_range(offset, len) {
            return Err(OutOfBounds { offset, len, memory_len: memory.len() });
        }
        Ok(Sge { memory, offset, len })
    }

    /// An SGE named by a local key (verbs `lkey`, `addr`, `length`): checked against the table
    /// like a tagged access needing [`Access::LOCAL_WRITE`], from a queue pair in `pd`.
    pub fn from_lkey(
        table: &TaggedBufferTable,
        pd: ProtectionDomainId,
        lkey: STag,
        addr: TaggedOffset,
        len: u64,
    ) -> Result<Sge, AccessError> {
        let target = resolve_tagged(table, pd, lkey, addr, len, Access::LOCAL_WRITE)?;
        let len = usize::try_from(len).map_err(|_| AccessError::BaseOrBounds)?;
        Sge::new(target.memory, target.offset, len).map_err(|_| AccessError::BaseOrBounds)
    }

    /// The memory the SGE lies in.
    pub fn memory(&self) -> &Arc<RegionMemory> {
        &self.memory
    }

    /// The SGE's first byte in its memory.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The SGE's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the SGE has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The total length of a scatter list (what to post with
/// [`UntaggedQueues::post`](crate::UntaggedQueues::post)).
pub fn scatter_len(sgl: &[Sge]) -> u64 {
    sgl.iter().fold(0u64, |acc, s| acc.saturating_add(u64::try_from(s.len).unwrap_or(u64::MAX)))
}

/// Places an untagged segment's payload at message offset `mo` of the posted buffer `sgl`,
/// across SGE boundaries. If `mo + payload.len()` exceeds the buffer's length nothing is
/// written and the error is [`UntaggedError::MessageTooLong`] (DDP untagged 0x05).
///
/// `mo` is the offset [`UntaggedQueues::accept`](crate::UntaggedQueues::accept) returned;
/// after a successful `accept` against a buffer posted with [`scatter_len`] this cannot fail.
pub fn place_untagged(sgl: &[Sge], mo: u64, payload: &[u8]) -> Result<(), UntaggedError> {
    let buffer_len = scatter_len(sgl);
    let payload_len = u64::try_from(payload.len()).unwrap_or(u64::MAX);
    let end = mo.saturating_add(payload_len);
    if end > buffer_len {
        return Err(UntaggedError::MessageTooLong { end, buffer_len });
    }
    let mut skip = mo;
    let mut rest = payload;
    for sge in sgl {
        if rest.is_empty() {
            break;
        }
        let sge_len = u64::try_from(sge.len).unwrap_or(u64::MAX);
        if skip >= sge_len {
            skip -= sge_len;
            continue;
        }
        // skip < sge.len, so it fits in usize.
        let skip_here = usize::try_from(skip).unwrap_or(sge.len);
        let n = (sge.len - skip_here).min(rest.len());
        let (now, later) = rest.split_at(n);
        // Sge::new checked [offset, offset + len) inside the memory, so this cannot fail.
        sge.memory
            .write(sge.offset + skip_here, now)
            .map_err(|_| UntaggedError::MessageTooLong { end, buffer_len })?;
        rest = later;
        skip = 0;
    }
    Ok(())
}

/// The untagged receive side of one stream with memory: [`UntaggedQueues`] plus the scatter
/// list posted for each buffer. [`UntaggedReceiver::handle_segment`] checks a segment with
/// [`UntaggedQueues::accept`] and places its payload at the MO it returns.
#[derive(Debug, Clone)]
pub struct UntaggedReceiver {
    queues: UntaggedQueues,
    /// `posted[qn]` holds the scatter lists, front first, in step with the queue's lengths.
    posted: [VecDeque<Vec<Sge>>; QUEUE_COUNT],
}

impl UntaggedReceiver {
    /// Empty queues, each holding at most `max_posted` buffers.
    pub fn new(max_posted: usize) -> UntaggedReceiver {
        UntaggedReceiver { queues: UntaggedQueues::new(max_posted), posted: Default::default() }
    }

    /// The queues' state (expected MSNs, posted counts, next MOs).
    pub fn queues(&self) -> &UntaggedQueues {
        &self.queues
    }

    /// Posts the scatter list `sgl` on queue `qn`; returns the MSN of the message it receives.
    pub fn post(&mut self, qn: QueueNumber, sgl: Vec<Sge>) -> Result<Msn, PostError> {
        let msn = self.queues.post(qn, scatter_len(&sgl))?;
        // post succeeded, so qn is 0..=3.
        if let Some(q) = qn.index().and_then(|i| self.posted.get_mut(i)) {
            q.push_back(sgl);
        }
        Ok(msn)
    }

    /// Checks one untagged segment and places its payload. On the last segment of a message
    /// the buffer is consumed and returned with the placement. On error nothing is written
    /// and nothing changes; the stream must be terminated with the error's code.
    pub fn handle_segment(
        &mut self,
        kind: SegmentKind,
        last: bool,
        payload: &[u8],
    ) -> Result<(UntaggedPlacement, Option<Vec<Sge>>), UntaggedError> {
        let qn = match kind {
            SegmentKind::Untagged { qn, .. } => qn,
            SegmentKind::Tagged { .. } => return Err(UntaggedError::NotUntagged),
        };
        let queue = qn.index().and_then(|i| self.posted.get_mut(i)).ok_or(UntaggedError::InvalidQn(qn))?;
        // accept checks MO + length against the length posted for the front buffer, which is
        // that scatter list's length, so once it passes the placement below cannot fail and
        // the queue state and the memory stay in step.
        let placement = self.queues.accept(kind, last, payload.len())?;
        let Some(sgl) = queue.front() else {
            return Err(UntaggedError::NoBuffer { qn, msn: placement.msn });
        };
        place_untagged(sgl, u64::from(placement.offset), payload)?;
        let done = if placement.completed_len.is_some() { queue.pop_front() } else { None };
        Ok((placement, done))
    }
}

/// A model-checked placement run on arbitrary bytes, for the `ddp_placement` fuzz target and
/// the placement-safety property test. It builds a small table (regions with VA and
/// zero-based addressing, another PD, read-only rights, a window, trailing guard bytes in
/// each memory) and a scatter list, decodes 8-byte operations (placements with arbitrary STag,
/// PD, rights, TO and length; invalidate; rekey; untagged placements), and after each one
/// asserts that the outcome is the one an independent model predicts and that the memory the
/// operation names holds what the model holds; at the end, that every memory does (so no byte
/// of any memory changed outside a permitted range). Panics on a violation.
#[doc(hidden)]
pub fn fuzz_placement(data: &[u8]) {
    model::run(data);
}

mod model {
    use super::*;
    use crate::stag_table::{Addressing, RegionSpec};

    const PD1: ProtectionDomainId = ProtectionDomainId(1);
    const PD2: ProtectionDomainId = ProtectionDomainId(2);

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
        valid: bool,
    }

    /// Fills `buf` with the payload pattern for `seed`.
    fn pattern_into(buf: &mut [u8], seed: u8) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = seed.wrapping_add(i.to_le_bytes()[0].wrapping_mul(37));
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        let mut v = vec![0; len];
        pattern_into(&mut v, seed);
        v
    }

    fn access_of(bits: u8) -> Access {
        Access {
            local_write: bits & 1 != 0,
            remote_read: bits & 2 != 0,
            remote_write: bits & 4 != 0,
            remote_atomic: bits & 8 != 0,
        }
    }

    pub(super) fn run(data: &[u8]) {
        let mut table = TaggedBufferTable::new(16);
        // Memory lengths: each region leaves some guard bytes at the end of its memory.
        let memories: Vec<Arc<RegionMemory>> =
            [72usize, 40, 56, 32, 40].iter().map(|&n| RegionMemory::from_bytes(&pattern(n, 0x11))).collect();
        let mut model: Vec<Vec<u8>> = memories.iter().map(|m| m.to_vec()).collect();
        let rw = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);
        // (pd, base, len, access, addressing, memory)
        let regions = [
            (PD1, 0x1000u64, 64u64, rw, Addressing::VirtualAddress, 0usize),
            (PD1, 0x2000, 37, Access::REMOTE_WRITE, Addressing::ZeroBased, 1),
            (PD2, u64::MAX - 48, 48, Access::ALL, Addressing::VirtualAddress, 2),
            (PD1, 0x3000, 30, Access::REMOTE_READ.union(Access::LOCAL_WRITE), Addressing::VirtualAddress, 3),
        ];
        let mut entries = Vec::new();
        for (pd, base_va, len, access, addressing, memory) in regions {
            let spec = RegionSpec { base_va, len, access, addressing };
            let Some(mem) = memories.get(memory) else { return };
            let Ok(stag) = table.register(pd, spec, Arc::clone(mem)) else {
                panic!("register failed");
            };
            let first_to = if addressing == Addressing::ZeroBased { 0 } else { base_va };
            entries.push(ModelEntry {
                stag,
                pd,
                access,
                first_to,
                len,
                memory,
                offset_in_memory: 0,
                parent: None,
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
            valid: true,
        });
        // A scatter list over memory 4: [2, 10), [10, 11), [20, 36): 25 bytes.
        let Some(m4) = memories.get(4) else { return };
        let mut sgl = Vec::new();
        for (offset, len) in [(2usize, 8usize), (10, 1), (20, 16)] {
            let Ok(sge) = Sge::new(Arc::clone(m4), offset, len) else { panic!("sge") };
            sgl.push(sge);
        }
        let sgl_map: Vec<usize> = (2..10).chain(10..11).chain(20..36).collect();

        // Payloads and read-backs use these buffers: an operation allocates nothing.
        let mut payload_buf = [0u8; 80];
        let mut seen_buf = [0u8; 72];
        let mut check = |i: usize, model: &[Vec<u8>]| {
            let (Some(m), Some(expect)) = (memories.get(i), model.get(i)) else { return };
            let seen = &mut seen_buf[..expect.len()];
            assert_eq!(m.read(0, seen), Ok(()));
            assert_eq!(&*seen, expect.as_slice(), "memory {i} differs from the model");
        };
        for op in data.chunks(8) {
            let mut b = [0u8; 8];
            b[..op.len()].copy_from_slice(op);
            let n = entries.len();
            let pick = usize::from(b[1]) % (n + 1);
            // The memory the operation may write, compared with the model after it (all of
            // them are compared at the end: a write elsewhere shows there).
            let mut written = None;
            match b[0] % 8 {
                0 => {
                    if let Some(e) = entries.get_mut(pick) {
                        let r = table.invalidate(e.stag);
                        assert!(r.is_ok(), "invalidate {:?}", r);
                        e.valid = false;
                    }
                }
                1 => {
                    if let Some(e) = entries.get_mut(pick) {
                        let r = table.rekey(e.stag, b[2]);
                        let Ok(stag) = r else { panic!("rekey {r:?}") };
                        e.stag = stag;
                        e.valid = true;
                    }
                }
                2 => {
                    let mo = u64::from(b[4] % 32);
                    let payload = &mut payload_buf[..usize::from(b[6] % 32)];
                    pattern_into(payload, b[7]);
                    let payload = &*payload;
                    let end = mo + payload.len() as u64;
                    let r = place_untagged(&sgl, mo, payload);
                    written = Some(4);
                    if end <= 25 {
                        assert_eq!(r, Ok(()));
                        for (i, &byte) in payload.iter().enumerate() {
                            let at = usize::try_from(mo).unwrap_or(usize::MAX) + i;
                            if let (Some(&pos), Some(m)) = (sgl_map.get(at), model.get_mut(4)) {
                                if let Some(slot) = m.get_mut(pos) {
                                    *slot = byte;
                                }
                            }
                        }
                    } else {
                        assert_eq!(r, Err(UntaggedError::MessageTooLong { end, buffer_len: 25 }));
                    }
                }
                _ => {
                    let flip_key = b[2] & 0x80 != 0;
                    let pd = if b[2] & 0x40 != 0 { PD2 } else { PD1 };
                    let needed = access_of(b[3]);
                    let delta = i64::from(i16::from_le_bytes([b[4], b[5]]) / 256);
                    let payload = &mut payload_buf[..usize::from(b[6] % 80)];
                    pattern_into(payload, b[7]);
                    let payload = &*payload;
                    let len = payload.len() as u64;
                    let stag = match entries.get(pick) {
                        Some(e) if flip_key => STag(e.stag.0 ^ 1),
                        Some(e) => e.stag,
                        // Garbage STag: index 0..=15 from b5, any key.
                        None => STag((u32::from(b[5] & 0x0f) << 8) | u32::from(b[2])),
                    };
                    // The model entry the STag names exactly, if any (a garbage STag may
                    // happen to be a live one; a flipped key names none).
                    let entry = entries.iter().find(|e| e.stag == stag);
                    written = entry.map(|e| e.memory);
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
                            && parent_valid
                            && e.pd == pd
                            && e.access.contains(needed)
                            && (needed.remote_write || needed.local_write)
                            && in_bounds;
                        ok.then(|| (e.memory, e.offset_in_memory + (to - e.first_to)))
                    });
                    let r = place_tagged(&table, pd, stag, TaggedOffset(to), payload, needed);
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
                            range.copy_from_slice(payload);
                        }
                    }
                }
            }
            if let Some(i) = written {
                check(i, &model);
            }
        }
        for i in 0..memories.len() {
            check(i, &model);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stag_table::{Addressing, RegionSpec};
    use proptest::prelude::*;

    const PD: ProtectionDomainId = ProtectionDomainId(3);
    const BASE: u64 = 0x7f00_0000_1000;

    fn spec(base_va: u64, len: u64, access: Access, addressing: Addressing) -> RegionSpec {
        RegionSpec { base_va, len, access, addressing }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| i.to_le_bytes()[0].wrapping_mul(13).wrapping_add(seed)).collect()
    }

    #[test]
    fn tagged_across_the_region_va() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::zeroed(8192);
        let s = t.register(PD, spec(BASE, 8192, Access::REMOTE_WRITE, Addressing::VirtualAddress), m.clone());
        let s = s.unwrap();
        let message = pattern(8192, 1);
        // siw's segmentation of an 8 KiB Write: 5 x 1428 + 1052.
        for (i, chunk) in message.chunks(1428).enumerate() {
            let to = TaggedOffset(BASE + 1428 * i as u64);
            place_tagged(&t, PD, s, to, chunk, Access::REMOTE_WRITE).unwrap();
        }
        assert_eq!(m.to_vec(), message);
        // Out of bounds by one byte at either end writes nothing.
        let before = m.to_vec();
        let w = Access::REMOTE_WRITE;
        assert_eq!(place_tagged(&t, PD, s, TaggedOffset(BASE - 1), &[0], w), Err(AccessError::BaseOrBounds));
        assert_eq!(
            place_tagged(&t, PD, s, TaggedOffset(BASE + 8191), &[0, 0], w),
            Err(AccessError::BaseOrBounds)
        );
        assert_eq!(place_tagged(&t, PD, s, TaggedOffset(u64::MAX), &[0, 0], w), Err(AccessError::ToWrap));
        assert_eq!(place_tagged(&t, PD, s, TaggedOffset(BASE + 8192), &[], w), Ok(()));
        assert_eq!(m.to_vec(), before);
    }

    #[test]
    fn tagged_zero_based_and_window() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::zeroed(100);
        let rw = Access::REMOTE_WRITE.union(Access::LOCAL_WRITE);
        let s = t.register(PD, spec(BASE, 100, rw, Addressing::ZeroBased), m.clone()).unwrap();
        place_tagged(&t, PD, s, TaggedOffset(90), b"0123456789", Access::REMOTE_WRITE).unwrap();
        assert_eq!(&m.to_vec()[90..], b"0123456789");
        assert_eq!(
            place_tagged(&t, PD, s, TaggedOffset(BASE), b"x", Access::REMOTE_WRITE),
            Err(AccessError::BaseOrBounds)
        );
        let w = t
            .bind_window(s, PD, spec(BASE + 10, 5, Access::REMOTE_WRITE, Addressing::VirtualAddress))
            .unwrap();
        place_tagged(&t, PD, w, TaggedOffset(BASE + 11), b"abcd", Access::REMOTE_WRITE).unwrap();
        assert_eq!(&m.to_vec()[10..16], b"\0abcd\0");
        // A read-only need is not a write right: refused, nothing written.
        assert_eq!(
            place_tagged(&t, PD, s, TaggedOffset(0), b"zz", Access::NONE),
            Err(AccessError::AccessRights)
        );
        assert_eq!(&m.to_vec()[..2], b"\0\0");
        let target = resolve_tagged(&t, PD, w, TaggedOffset(BASE + 12), 3, Access::REMOTE_WRITE).unwrap();
        assert_eq!(target.offset, 12);
        assert!(Arc::ptr_eq(&target.memory, &m));
    }

    #[test]
    fn invalidated_or_other_pd_never_writes() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::from_bytes(&[0x5a; 64]);
        let s = t.register(PD, spec(BASE, 64, Access::ALL, Addressing::VirtualAddress), m.clone()).unwrap();
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            place_tagged(&t, ProtectionDomainId(4), s, TaggedOffset(BASE), &[1; 8], w),
            Err(AccessError::StagNotAssociated)
        );
        t.invalidate(s).unwrap();
        for to in [BASE, BASE + 8, BASE + 63] {
            assert_eq!(place_tagged(&t, PD, s, TaggedOffset(to), &[1], w), Err(AccessError::InvalidStag));
        }
        assert_eq!(m.to_vec(), vec![0x5a; 64]);
        // Deregistered: the STag is gone; the application's memory is intact and still usable.
        t.deregister(s).unwrap();
        assert_eq!(place_tagged(&t, PD, s, TaggedOffset(BASE), &[1], w), Err(AccessError::InvalidStag));
        assert_eq!(Arc::strong_count(&m), 1);
        assert_eq!(m.to_vec(), vec![0x5a; 64]);
    }

    #[test]
    fn in_flight_placement_survives_deregistration() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::zeroed(16);
        let s =
            t.register(PD, spec(0, 16, Access::REMOTE_WRITE, Addressing::ZeroBased), Arc::clone(&m)).unwrap();
        let target = resolve_tagged(&t, PD, s, TaggedOffset(4), 4, Access::REMOTE_WRITE).unwrap();
        t.deregister(s).unwrap();
        drop(m);
        // The engine's clone keeps the memory alive for the copy.
        target.memory.write(target.offset, b"late").unwrap();
        assert_eq!(&target.memory.to_vec()[4..8], b"late");
    }

    fn sgl() -> (Vec<Arc<RegionMemory>>, Vec<Sge>) {
        let a = RegionMemory::zeroed(16);
        let b = RegionMemory::zeroed(16);
        let sges = vec![
            Sge::new(a.clone(), 3, 5).unwrap(),
            Sge::new(b.clone(), 0, 0).unwrap(),
            Sge::new(b.clone(), 8, 8).unwrap(),
            Sge::new(a.clone(), 12, 4).unwrap(),
        ];
        (vec![a, b], sges)
    }

    #[test]
    fn untagged_across_sges() {
        let (mems, sges) = sgl();
        assert_eq!(scatter_len(&sges), 17);
        place_untagged(&sges, 0, b"ABCDEFGHIJKLMNOPQ").unwrap();
        assert_eq!(&mems[0].to_vec()[3..8], b"ABCDE");
        assert_eq!(&mems[1].to_vec()[8..16], b"FGHIJKLM");
        assert_eq!(&mems[0].to_vec()[12..16], b"NOPQ");
        // Mid-SGE start crossing two boundaries.
        place_untagged(&sges, 4, b"xyz").unwrap();
        assert_eq!(&mems[0].to_vec()[3..8], b"ABCDx");
        assert_eq!(&mems[1].to_vec()[8..10], b"yz");
        place_untagged(&sges, 17, b"").unwrap();
        assert!(sges[1].is_empty());
        assert_eq!((sges[2].offset(), sges[2].len()), (8, 8));
        assert!(Arc::ptr_eq(sges[0].memory(), &mems[0]));
    }

    #[test]
    fn untagged_too_long_writes_nothing() {
        let (mems, sges) = sgl();
        let before: Vec<_> = mems.iter().map(|m| m.to_vec()).collect();
        let e = place_untagged(&sges, 10, &[1; 8]).unwrap_err();
        assert_eq!(e, UntaggedError::MessageTooLong { end: 18, buffer_len: 17 });
        assert_eq!(e.terminate_code().unwrap().code, 0x05);
        assert_eq!(
            place_untagged(&sges, u64::MAX, &[1]),
            Err(UntaggedError::MessageTooLong { end: u64::MAX, buffer_len: 17 })
        );
        assert!(place_untagged(&[], 0, &[1]).is_err());
        let after: Vec<_> = mems.iter().map(|m| m.to_vec()).collect();
        assert_eq!(before, after);
        assert!(Sge::new(RegionMemory::zeroed(4), 2, 3).is_err());
        assert!(Sge::new(RegionMemory::zeroed(4), usize::MAX, 2).is_err());
    }

    #[test]
    fn sge_from_lkey_needs_local_write() {
        let mut t = TaggedBufferTable::new(8);
        let m = RegionMemory::zeroed(64);
        let lw = t
            .register(PD, spec(BASE, 64, Access::LOCAL_WRITE, Addressing::VirtualAddress), m.clone())
            .unwrap();
        let ro = t
            .register(PD, spec(BASE, 64, Access::REMOTE_READ, Addressing::VirtualAddress), m.clone())
            .unwrap();
        let sge = Sge::from_lkey(&t, PD, lw, TaggedOffset(BASE + 8), 16).unwrap();
        assert_eq!((sge.offset(), sge.len()), (8, 16));
        assert_eq!(Sge::from_lkey(&t, PD, ro, TaggedOffset(BASE), 1).unwrap_err(), AccessError::AccessRights);
        assert_eq!(
            Sge::from_lkey(&t, PD, lw, TaggedOffset(BASE + 60), 5).unwrap_err(),
            AccessError::BaseOrBounds
        );
        assert_eq!(
            Sge::from_lkey(&t, ProtectionDomainId(9), lw, TaggedOffset(BASE), 1).unwrap_err(),
            AccessError::StagNotAssociated
        );
    }

    /// The receive path: post the SGL's length, accept each segment, place at the MO.
    #[test]
    fn untagged_with_queues() {
        let (mems, sges) = sgl();
        let mut q = UntaggedQueues::new(2);
        q.post(QueueNumber::Send, scatter_len(&sges)).unwrap();
        let message = pattern(17, 7);
        for (i, chunk) in message.chunks(6).enumerate() {
            let mo = u32::try_from(i * 6).unwrap();
            let kind = SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::Send, msn: Msn(1), mo };
            let last = (i + 1) * 6 >= message.len();
            let p = q.accept(kind, last, chunk.len()).unwrap();
            place_untagged(&sges, u64::from(p.offset), chunk).unwrap();
        }
        let mut got = mems[0].to_vec()[3..8].to_vec();
        got.extend_from_slice(&mems[1].to_vec()[8..16]);
        got.extend_from_slice(&mems[0].to_vec()[12..16]);
        assert_eq!(got, message);
    }

    #[test]
    fn receiver_places_and_consumes() {
        let (mems, sges) = sgl();
        let mut r = UntaggedReceiver::new(2);
        let other = RegionMemory::zeroed(4);
        assert_eq!(r.post(QueueNumber::Send, sges), Ok(Msn(1)));
        assert_eq!(r.post(QueueNumber::Send, vec![Sge::new(other.clone(), 0, 4).unwrap()]), Ok(Msn(2)));
        assert!(r.post(QueueNumber::Unknown(7), Vec::new()).is_err());
        let seg = |msn, mo| SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::Send, msn: Msn(msn), mo };
        let (p, done) = r.handle_segment(seg(1, 0), false, b"ABCDEFG").unwrap();
        assert_eq!((p.offset, p.completed_len, done.is_none()), (0, None, true));
        // Too long: 7 + 11 > 17, nothing written, nothing changes.
        let e = r.handle_segment(seg(1, 7), true, &[b'z'; 11]).unwrap_err();
        assert_eq!(e, UntaggedError::MessageTooLong { end: 18, buffer_len: 17 });
        assert_eq!(r.queues().next_mo(QueueNumber::Send), Some(7));
        let (p, done) = r.handle_segment(seg(1, 7), true, b"HIJKLMNOPQ").unwrap();
        assert_eq!(p.completed_len, Some(17));
        assert_eq!(done.unwrap().len(), 4);
        assert_eq!(&mems[0].to_vec()[3..8], b"ABCDE");
        assert_eq!(&mems[1].to_vec()[8..16], b"FGHIJKLM");
        assert_eq!(&mems[0].to_vec()[12..16], b"NOPQ");
        let (_, done) = r.handle_segment(seg(2, 0), true, b"wxyz").unwrap();
        assert!(done.is_some());
        assert_eq!(other.to_vec(), b"wxyz");
        assert!(matches!(r.handle_segment(seg(3, 0), true, b""), Err(UntaggedError::NoBuffer { .. })));
        let tagged = SegmentKind::Tagged { stag: STag(1), to: TaggedOffset(0) };
        assert_eq!(r.handle_segment(tagged, true, b"").unwrap_err(), UntaggedError::NotUntagged);
        let bad_qn = SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::Unknown(5), msn: Msn(1), mo: 0 };
        assert!(matches!(r.handle_segment(bad_qn, true, b""), Err(UntaggedError::InvalidQn(_))));
    }

    #[test]
    fn fuzz_seeds_run() {
        fuzz_placement(&[]);
        fuzz_placement(&[3, 0, 0, 4, 0, 0, 10, 1]);
        // Invalidate region 0, then try to write through it and its window.
        fuzz_placement(&[0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 4, 0, 0, 10, 1, 3, 4, 0, 4, 0, 0, 5, 1]);
        fuzz_placement(&[2, 0, 0, 0, 5, 0, 20, 9, 2, 0, 0, 0, 20, 0, 6, 9]);
    }

    proptest! {
        /// Placement safety: arbitrary (STag, PD, TO, length, rights) placements, invalidations,
        /// rekeys and untagged placements of arbitrary bytes; after each, every byte of every
        /// memory outside a permitted range is unchanged, and nothing panics.
        #[test]
        fn placement_safety(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            fuzz_placement(&data);
        }

        /// The same with operations biased toward tagged placements near the regions.
        #[test]
        fn placement_safety_tagged(ops in proptest::collection::vec((3u8..8, 0u8..6, any::<u8>(), 0u8..16, any::<i16>(), 0u8..80, any::<u8>()), 0..60)) {
            let data: Vec<u8> = ops.iter().flat_map(|&(op, e, flags, acc, delta, len, fill)| {
                let d = delta.to_le_bytes();
                [op, e, flags, acc, d[0], d[1], len, fill]
            }).collect();
            fuzz_placement(&data);
        }
    }
}
