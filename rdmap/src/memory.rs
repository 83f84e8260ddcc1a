//! Local buffers as work requests name them: verbs-style scatter/gather elements ([`Sge`]:
//! an lkey, an address in that region's tagged-offset space, a length) in an inline list
//! ([`Sgl`]). Placing into them and gathering from them is DDP's job ([`TableMemory`], the
//! tagged buffer table seen from the queue pair's protection domain, which the engine lends
//! the queue pair for each pass).

pub use iwarp_ddp::placement::{Sge, TableMemory, sgl_len};

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

// An 8-byte tag and a word-sized length, so that every field is whole, aligned words. A work
// request is moved several times between the application's post and the wire (into a chunk,
// into its queue, out to the engine, into the queue pair), and with a 1-byte tag and a 1-byte
// length the compiler moved the rest as an unaligned blob whose overlapping loads straddled
// the stores that had built it: each move waited for those stores to retire (store
// forwarding failed) instead of taking their bytes straight from them.
#[derive(Clone)]
#[repr(u64)]
enum SglRepr {
    Inline { len: usize, items: [Sge; SGL_INLINE] },
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
                let n = *len;
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
            SglRepr::Inline { len, items } => &items[..*len],
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
        // The common case of every work request, built in place.
        Sgl(SglRepr::Inline { len: 1, items: [sge, Sge::EMPTY] })
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

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_ddp::STag;

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
