//! What a queue pair needs from registered memory.
//!
//! Local buffers are named the way verbs name them: a scatter/gather element is an lkey (the
//! STag of a local region), an address in that region's tagged-offset space, and a length.
//! The engine implements [`Memory`] over the tagged buffer table and the regions' memory
//! (`iwarp_ddp`), bound to the queue pair's protection domain; tests may use a model.

use iwarp_ddp::STag;
use iwarp_ddp::stag_table::{Access, AccessError};

/// A scatter/gather element: `len` bytes at tagged offset `addr` of the region `lkey`.
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
    /// An element of no bytes (what unused inline slots of an [`Sgl`] hold).
    pub const EMPTY: Sge = Sge { lkey: STag(0), addr: 0, len: 0 };
}

/// Elements an [`Sgl`] holds without a heap allocation.
const SGL_INLINE: usize = 2;

/// A scatter/gather list. Up to two elements (what nearly every work request has) are held
/// inline, so posting a work request allocates nothing; longer lists go to the heap.
///
/// ```
/// use iwarp_ddp::STag;
/// use iwarp_rdmap::memory::{Sge, Sgl};
/// let a = Sge { lkey: STag(0x100), addr: 0x1000, len: 64 };
/// let sgl = Sgl::from(a);
/// assert_eq!(&sgl[..], &[a]);
/// let long: Sgl = vec![a; 5].into();
/// assert_eq!(long.len(), 5);
/// ```
#[derive(Clone)]
pub struct Sgl(SglRepr);

#[derive(Clone)]
enum SglRepr {
    Inline { len: u8, items: [Sge; SGL_INLINE] },
    Heap(Vec<Sge>),
}

impl Sgl {
    /// An empty list.
    pub const fn new() -> Sgl {
        Sgl(SglRepr::Inline { len: 0, items: [Sge::EMPTY; SGL_INLINE] })
    }

    /// Appends an element.
    pub fn push(&mut self, sge: Sge) {
        match &mut self.0 {
            SglRepr::Inline { len, items } => {
                let n = usize::from(*len);
                if n < SGL_INLINE {
                    items[n] = sge;
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(n + 1);
                    v.extend_from_slice(&items[..]);
                    v.push(sge);
                    self.0 = SglRepr::Heap(v);
                }
            }
            SglRepr::Heap(v) => v.push(sge),
        }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[Sge] {
        match &self.0 {
            SglRepr::Inline { len, items } => &items[..usize::from(*len)],
            SglRepr::Heap(v) => v,
        }
    }
}

impl Default for Sgl {
    fn default() -> Sgl {
        Sgl::new()
    }
}

impl core::ops::Deref for Sgl {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        self.as_slice()
    }
}

impl core::fmt::Debug for Sgl {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Sgl {
    fn eq(&self, other: &Sgl) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Sgl {}

impl From<Sge> for Sgl {
    fn from(sge: Sge) -> Sgl {
        let mut sgl = Sgl::new();
        sgl.push(sge);
        sgl
    }
}

impl From<&[Sge]> for Sgl {
    fn from(sges: &[Sge]) -> Sgl {
        sges.iter().copied().collect()
    }
}

impl<const N: usize> From<[Sge; N]> for Sgl {
    fn from(sges: [Sge; N]) -> Sgl {
        sges.into_iter().collect()
    }
}

impl From<Vec<Sge>> for Sgl {
    fn from(v: Vec<Sge>) -> Sgl {
        if v.len() <= SGL_INLINE { v.into_iter().collect() } else { Sgl(SglRepr::Heap(v)) }
    }
}

impl FromIterator<Sge> for Sgl {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Sgl {
        let mut sgl = Sgl::new();
        for s in iter {
            sgl.push(s);
        }
        sgl
    }
}

impl<'a> IntoIterator for &'a Sgl {
    type Item = &'a Sge;
    type IntoIter = core::slice::Iter<'a, Sge>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

/// Total length of a scatter/gather list.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.len)).sum()
}

/// Registered memory as a queue pair sees it, within its protection domain.
///
/// Every call checks the STag (valid, key, PD), the `access` rights asked for and the bounds,
/// in that order, and touches nothing when a check fails.
pub trait Memory {
    /// Checks that `len` bytes at `to` of `stag` may be accessed with `access`.
    fn check(&self, stag: STag, to: u64, len: u64, access: Access) -> Result<(), AccessError>;

    /// Writes `data` at `to` of `stag`.
    fn place(&mut self, stag: STag, to: u64, data: &[u8], access: Access) -> Result<(), AccessError>;

    /// Reads `out.len()` bytes at `to` of `stag` into `out`.
    fn fetch(&self, stag: STag, to: u64, out: &mut [u8], access: Access) -> Result<(), AccessError>;

    /// Applies an RFC 7306 atomic to the 64-bit value at `to` of `stag` (remote atomic rights,
    /// 8-byte aligned): stores `f(original)` and returns `original`, as one atomic
    /// read-modify-write.
    fn atomic(&mut self, stag: STag, to: u64, f: &mut dyn FnMut(u64) -> u64) -> Result<u64, AccessError>;

    /// Invalidates `stag` for a peer's Send with Invalidate: it must exist in this protection
    /// domain; afterwards every access through it fails.
    fn invalidate(&mut self, stag: STag) -> Result<(), AccessError>;
}

/// Calls `f(element, tagged offset, range of the message bytes)` for each piece of message
/// bytes `[offset, offset + len)` as they fall on the elements of `sgl`.
fn walk(
    sgl: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
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
    if done < len { Err(AccessError::BaseOrBounds) } else { Ok(()) }
}

/// Reads message bytes `[offset, offset + out.len())` gathered from `sgl` (local access).
pub fn gather(mem: &impl Memory, sgl: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
    let len = out.len();
    walk(sgl, offset, len, |s, to, r| mem.fetch(s.lkey, to, &mut out[r], Access::NONE))
}

/// Writes `data` at message offset `offset` scattered over `sgl` (local write access).
pub fn scatter(mem: &mut impl Memory, sgl: &[Sge], offset: u64, data: &[u8]) -> Result<(), AccessError> {
    walk(sgl, offset, data.len(), |s, to, r| mem.place(s.lkey, to, &data[r], Access::LOCAL_WRITE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u32) -> Sge {
        Sge { lkey: STag(i << 8), addr: u64::from(i) * 0x1000, len: i }
    }

    #[test]
    fn sgl_spills_to_the_heap_past_two_elements_and_keeps_order() {
        let mut sgl = Sgl::new();
        assert!(sgl.is_empty());
        for i in 1..=5 {
            sgl.push(sge(i));
            assert_eq!(sgl.len(), i as usize);
            assert_eq!(sgl.last(), Some(&sge(i)));
        }
        let expected: Vec<Sge> = (1..=5).map(sge).collect();
        assert_eq!(&sgl[..], &expected[..]);
        assert_eq!(Sgl::from(expected.clone()), sgl);
        assert_eq!(Sgl::from(&expected[..2]), Sgl::from([sge(1), sge(2)]));
        assert_ne!(Sgl::from(sge(1)), Sgl::from(sge(2)));
        assert_eq!(format!("{:?}", Sgl::from(sge(1))), format!("{:?}", [sge(1)]));
        assert_eq!(sgl_len(&sgl), 15);
    }

    #[test]
    fn sgl_holds_two_elements_inline() {
        // Two elements fit beside the length in the value itself: no heap allocation.
        let sgl = Sgl::from([sge(1), sge(2)]);
        assert!(matches!(sgl.0, SglRepr::Inline { len: 2, .. }));
        assert!(matches!(Sgl::from(vec![sge(1); 3]).0, SglRepr::Heap(_)));
        assert!(core::mem::size_of::<Sgl>() <= 48);
    }
}
