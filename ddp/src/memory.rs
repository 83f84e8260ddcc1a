//! The bytes of a registered memory region ([`RegionMemory`]), shared between the application
//! and the placement engine.
//!
//! # The model
//!
//! An RNIC writes into registered memory while the application holds it: a peer's RDMA Write
//! may land at any moment, from the engine's thread, while an application thread reads or
//! writes the same region. Handing out `&[u8]` or `&mut [u8]` to such memory would be a data
//! race (undefined behaviour), so this module never does. Instead:
//!
//! - The memory is **owned by the region**: a `Box<[AtomicU64]>` holding `len` bytes (rounded
//!   up to whole words), allocated by the stack ([`RegionMemory::zeroed`]) or filled with a
//!   copy of the application's bytes ([`RegionMemory::from_bytes`]). It is shared through an
//!   [`Arc`]: the tagged buffer table entry, the application's handle and every in-flight
//!   placement each hold a clone, so deregistering a region while the engine places into it
//!   cannot free the memory under the engine; the last clone frees it.
//! - **Every access is a copy** in ([`RegionMemory::write`]) or out ([`RegionMemory::read`]),
//!   made of relaxed atomic loads and stores of whole 64-bit words. Concurrent accesses from
//!   the peer (placement) and the application are therefore never a data race under the Rust
//!   memory model. They may *tear* at word granularity: a read that overlaps a concurrent
//!   write may see some words old and some new, exactly as real RDMA memory does (the verbs
//!   contract: the application must not look at memory a peer may be writing until the
//!   completion says the write is done).
//! - A copy that starts or ends inside a word merges its bytes into that word with a relaxed
//!   `fetch_update` (compare-exchange) loop, so bytes of the same word written concurrently by
//!   someone else (a neighbouring placement, the application) are never lost.
//! - **Ordering** between a placement and the application seeing it does not come from here:
//!   relaxed operations order nothing. It comes from the completion queue, which publishes a
//!   completion with a `Release` store after the placement's copies, and the application
//!   consumes it with an `Acquire` load before reading the memory; that happens-before edge
//!   makes every placed byte visible. The same holds the other way for Sends and RDMA Read
//!   sources: posting the work request (a `Release` on the queue) publishes the
//!   application's writes to the engine.
//!
//! Bytes are kept in native byte order inside each word (`to_ne_bytes` / `from_ne_bytes`), so
//! [`RegionMemory::read`] returns exactly the bytes [`RegionMemory::write`] stored. The aligned
//! middle of a copy is one relaxed store (or load) per 8 bytes; on x86-64 and AArch64 those
//! are plain moves, so a copy costs a word-at-a-time loop instead of a vectorised `memcpy`.
//! The compiler does not vectorise atomic stores, so on a core that retires one store per
//! cycle the copy is bound at 8 bytes per cycle (`benches/placement.rs` measured about 35 GB/s
//! here, 0.35 to 0.65 of `memcpy` into a `Vec`; unrolling the loop changed nothing, it is
//! store-bound).
//!
//! No `unsafe` code is needed for any of this.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The word size the memory is stored in.
const WORD: usize = 8;

/// An access outside a [`RegionMemory`] (or one whose end overflows `usize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutOfBounds {
    /// The offset of the access's first byte.
    pub offset: usize,
    /// The access's length.
    pub len: usize,
    /// The memory's length.
    pub memory_len: usize,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "access of {} bytes at offset {} outside memory of {} bytes",
            self.len, self.offset, self.memory_len
        )
    }
}

impl std::error::Error for OutOfBounds {}

/// The bytes of a registered region, shared (through an [`Arc`]) by the application, the
/// tagged buffer table and in-flight placements. See the module documentation for the model.
pub struct RegionMemory {
    /// Byte `i` is byte `i % 8` of `words[i / 8].to_ne_bytes()`; bytes past `len` stay zero.
    words: Box<[AtomicU64]>,
    len: usize,
}

impl fmt::Debug for RegionMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionMemory").field("len", &self.len).finish_non_exhaustive()
    }
}

/// Stores `bytes` at byte position `start` of `word`, keeping the word's other bytes as they
/// are at the moment of the store (a relaxed compare-exchange loop).
fn merge_into(word: &AtomicU64, start: usize, bytes: &[u8]) {
    // The closure always returns Some, so fetch_update cannot fail.
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let mut b = old.to_ne_bytes();
        if let Some(dst) = b.get_mut(start..start + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        Some(u64::from_ne_bytes(b))
    });
}

/// Reads 8 bytes as a native-endian word.
#[inline(always)]
fn word_of(chunk: &[u8]) -> u64 {
    let mut b = [0u8; WORD];
    b.copy_from_slice(chunk);
    u64::from_ne_bytes(b)
}

impl RegionMemory {
    /// New memory of `len` zero bytes.
    pub fn zeroed(len: usize) -> Arc<RegionMemory> {
        let words = (0..len.div_ceil(WORD)).map(|_| AtomicU64::new(0)).collect();
        Arc::new(RegionMemory { words, len })
    }

    /// New memory holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Arc<RegionMemory> {
        let words = bytes
            .chunks(WORD)
            .map(|c| {
                let mut b = [0u8; WORD];
                b[..c.len()].copy_from_slice(c);
                AtomicU64::new(u64::from_ne_bytes(b))
            })
            .collect();
        Arc::new(RegionMemory { words, len: bytes.len() })
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks `[offset, offset + len)` against the memory.
    fn bounds(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds { offset, len, memory_len: self.len }),
        }
    }

    /// Whether `[offset, offset + len)` lies inside the memory (the end not overflowing).
    pub fn contains_range(&self, offset: usize, len: usize) -> bool {
        self.bounds(offset, len).is_ok()
    }

    /// Copies `src` into the memory at `offset`. Nothing is written if the range is not
    /// inside the memory.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        self.bounds(offset, src.len())?;
        self.write_in_bounds(offset, src);
        Ok(())
    }

    /// Copies the concatenation of `parts` into the memory at `offset`. Nothing is written if
    /// the whole range is not inside the memory.
    pub fn write_from_parts(&self, offset: usize, parts: &[&[u8]]) -> Result<(), OutOfBounds> {
        let total = parts.iter().try_fold(0usize, |acc, p| acc.checked_add(p.len()));
        let Some(total) = total else {
            return Err(OutOfBounds { offset, len: usize::MAX, memory_len: self.len });
        };
        self.bounds(offset, total)?;
        let mut at = offset;
        for part in parts {
            self.write_in_bounds(at, part);
            at += part.len();
        }
        Ok(())
    }

    /// Sets `len` bytes from `offset` to `byte`. Nothing is written if the range is not
    /// inside the memory.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        self.bounds(offset, len)?;
        let block = [byte; 512];
        let mut at = offset;
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            self.write_in_bounds(at, &block[..n]);
            at += n;
            left -= n;
        }
        Ok(())
    }

    /// The write, once bounds are checked (`offset + src.len() <= self.len`).
    fn write_in_bounds(&self, offset: usize, mut src: &[u8]) {
        if src.is_empty() {
            return;
        }
        let mut w = offset / WORD;
        let start = offset % WORD;
        if start != 0 {
            let n = (WORD - start).min(src.len());
            let (head, rest) = src.split_at(n);
            if let Some(word) = self.words.get(w) {
                merge_into(word, start, head);
            }
            src = rest;
            w += 1;
        }
        let Some(words) = self.words.get(w..) else { return };
        let chunks = src.chunks_exact(WORD);
        let tail = chunks.remainder();
        let full = chunks.len();
        for (word, chunk) in words.iter().zip(chunks) {
            word.store(word_of(chunk), Ordering::Relaxed);
        }
        if !tail.is_empty()
            && let Some(word) = words.get(full)
        {
            merge_into(word, 0, tail);
        }
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`. `dst` is untouched if the range is
    /// not inside the memory.
    pub fn read(&self, offset: usize, mut dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.bounds(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let mut w = offset / WORD;
        let start = offset % WORD;
        if start != 0 {
            let n = (WORD - start).min(dst.len());
            let (head, rest) = dst.split_at_mut(n);
            if let Some(word) = self.words.get(w) {
                let b = word.load(Ordering::Relaxed).to_ne_bytes();
                head.copy_from_slice(&b[start..start + n]);
            }
            dst = rest;
            w += 1;
        }
        let Some(words) = self.words.get(w..) else { return Ok(()) };
        let mut chunks = dst.chunks_exact_mut(WORD);
        let full = chunks.len();
        for (word, chunk) in words.iter().zip(&mut chunks) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty()
            && let Some(word) = words.get(full)
        {
            let b = word.load(Ordering::Relaxed).to_ne_bytes();
            let n = tail.len();
            tail.copy_from_slice(&b[..n]);
        }
        Ok(())
    }

    /// A copy of all the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // The range is the whole memory, so the read cannot fail.
        let _ = self.read(0, &mut v);
        v
    }

    /// Atomically replaces the native-endian 64-bit value at `offset` (8-byte aligned, whole
    /// word inside the memory) with `f(value)` and returns the value it had: RDMA atomics
    /// (RFC 7306) as one read-modify-write of the word, atomic against every other access.
    /// `None` when `offset` is unaligned or out of bounds.
    pub fn fetch_update_u64(&self, offset: usize, mut f: impl FnMut(u64) -> u64) -> Option<u64> {
        if !offset.is_multiple_of(WORD) || !self.contains_range(offset, WORD) {
            return None;
        }
        let word = self.words.get(offset / WORD)?;
        // The closure always returns Some, so fetch_update returns Ok with the old value.
        let old = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(f(v)));
        Some(old.unwrap_or_else(|v| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fetch_update_u64_is_a_read_modify_write_of_one_word() {
        let m = RegionMemory::zeroed(20);
        m.write(8, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(m.fetch_update_u64(8, |v| v + 3), Some(5));
        let mut b = [0u8; 8];
        m.read(8, &mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 8);
        assert_eq!(m.fetch_update_u64(4, |v| v), None, "unaligned");
        assert_eq!(m.fetch_update_u64(16, |v| v), None, "the word passes the end");
        // Two threads adding concurrently never lose an update.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        m.fetch_update_u64(0, |v| v + 1);
                    }
                });
            }
        });
        assert_eq!(m.fetch_update_u64(0, |v| v), Some(20_000));
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| i.to_le_bytes()[0].wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Every alignment of offset and every length 0..=24, writes and reads, against a Vec.
    #[test]
    fn every_alignment_against_vec_model() {
        for mem_len in [0usize, 1, 7, 8, 9, 31, 40, 41] {
            let initial = pattern(mem_len, 0x55);
            for offset in 0..=mem_len.min(24) {
                for len in 0..=24usize {
                    let m = RegionMemory::from_bytes(&initial);
                    let mut model = initial.clone();
                    let data = pattern(len, 0xa0);
                    let r = m.write(offset, &data);
                    if offset + len <= mem_len {
                        assert_eq!(r, Ok(()));
                        model[offset..offset + len].copy_from_slice(&data);
                    } else {
                        assert_eq!(r, Err(OutOfBounds { offset, len, memory_len: mem_len }));
                    }
                    assert_eq!(m.to_vec(), model, "write {offset}+{len} into {mem_len}");
                    let mut out = vec![0xeeu8; len];
                    let r = m.read(offset, &mut out);
                    if offset + len <= mem_len {
                        assert_eq!(r, Ok(()));
                        assert_eq!(out, model[offset..offset + len]);
                    } else {
                        assert!(r.is_err());
                        assert!(out.iter().all(|&b| b == 0xee), "dst untouched on error");
                    }
                }
            }
        }
    }

    #[test]
    fn fill_parts_and_accessors() {
        let m = RegionMemory::zeroed(1500);
        assert_eq!(m.len(), 1500);
        assert!(!m.is_empty());
        assert!(RegionMemory::zeroed(0).is_empty());
        m.fill(3, 1200, 0xab).unwrap();
        let mut model = vec![0u8; 1500];
        model[3..1203].fill(0xab);
        assert_eq!(m.to_vec(), model);
        m.write_from_parts(5, &[b"hello", b"", b" world"]).unwrap();
        model[5..16].copy_from_slice(b"hello world");
        assert_eq!(m.to_vec(), model);
        assert!(m.write_from_parts(1495, &[b"abc", b"def"]).is_err());
        assert!(m.fill(1499, 2, 0).is_err());
        assert_eq!(m.to_vec(), model, "refused writes change nothing");
        assert!(format!("{m:?}").contains("1500"));
    }

    #[test]
    fn bounds_and_overflow() {
        let m = RegionMemory::zeroed(16);
        assert!(m.write(16, &[]).is_ok());
        assert!(m.write(17, &[]).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        assert!(m.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(m.fill(usize::MAX, 2, 1).is_err());
        assert!(m.fill(1, usize::MAX, 1).is_err());
        assert!(!m.contains_range(usize::MAX, 1));
        assert!(m.contains_range(0, 16));
        let e = m.write(15, &[1, 2]).unwrap_err();
        assert_eq!(e, OutOfBounds { offset: 15, len: 2, memory_len: 16 });
        assert!(e.to_string().contains("16 bytes"));
        assert_eq!(m.to_vec(), vec![0u8; 16]);
    }

    /// Two threads write disjoint bytes that share words; neither ever loses the other's
    /// bytes (each reads its own bytes back after every write).
    #[test]
    fn concurrent_writers_to_adjacent_bytes_lose_nothing() {
        let m = RegionMemory::zeroed(24);
        // A owns [1, 6) and [13, 14); B owns [6, 13) and [14, 24): they share words 0 and 1.
        let ranges_a = [(1usize, 5usize), (13, 1)];
        let ranges_b = [(6usize, 7usize), (14, 10)];
        let run = |ranges: [(usize, usize); 2], seed: u8| {
            for i in 0..20_000u32 {
                let v = i.to_le_bytes()[0].wrapping_add(seed);
                for &(off, len) in &ranges {
                    m.write(off, &vec![v; len]).unwrap();
                }
                for &(off, len) in &ranges {
                    let mut back = vec![0u8; len];
                    m.read(off, &mut back).unwrap();
                    assert!(back.iter().all(|&b| b == v), "lost bytes at {off}: {back:?} != {v}");
                }
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| run(ranges_a, 0));
            s.spawn(|| run(ranges_b, 0x80));
        });
        let all = m.to_vec();
        assert_eq!(all[0], 0, "byte nobody owns is untouched");
        let last = 19_999u32.to_le_bytes()[0].wrapping_add(0x80);
        assert!(all[6..13].iter().chain(&all[14..24]).all(|&b| b == last));
    }

    proptest! {
        /// Random sequences of writes, reads and fills agree with a Vec model.
        #[test]
        fn ops_agree_with_vec(len in 0usize..100, ops in proptest::collection::vec((0usize..110, 0usize..40, any::<u8>(), 0u8..3), 0..20)) {
            let m = RegionMemory::zeroed(len);
            let mut model = vec![0u8; len];
            for (off, n, b, op) in ops {
                let fits = off + n <= len;
                match op {
                    0 => {
                        let data = pattern(n, b);
                        prop_assert_eq!(m.write(off, &data).is_ok(), fits);
                        if fits { model[off..off + n].copy_from_slice(&data); }
                    }
                    1 => {
                        prop_assert_eq!(m.fill(off, n, b).is_ok(), fits);
                        if fits { model[off..off + n].fill(b); }
                    }
                    _ => {
                        let mut out = vec![0u8; n];
                        prop_assert_eq!(m.read(off, &mut out).is_ok(), fits);
                        if fits { prop_assert_eq!(&out[..], &model[off..off + n]); }
                    }
                }
                prop_assert_eq!(m.to_vec(), model.clone());
            }
        }
    }
}
