//! A small deterministic generator (SplitMix64): every case of `iwarp fuzz-peer` follows from
//! the run's `--seed` and the case's index, on any machine.

/// SplitMix64.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// The generator of case `index` of the run seeded with `seed`.
    pub(crate) fn for_case(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ index.wrapping_mul(0xa076_1d64_78bd_642f));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// An index into a collection of `n` items (0 when `n` is 0).
    pub(crate) fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// True with probability `num / den`.
    pub(crate) fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// One of `items` (which must not be empty).
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    /// One of `items` by weight; `None` when every weight is zero.
    pub(crate) fn weighted<T: Copy>(&mut self, items: &[(u32, T)]) -> Option<T> {
        let total: u64 = items.iter().map(|(w, _)| u64::from(*w)).sum();
        let mut at = self.below(total);
        for (w, item) in items {
            let w = u64::from(*w);
            if at < w {
                return Some(*item);
            }
            at -= w;
        }
        None
    }

    /// `n` random bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64().to_le_bytes()[0]).collect()
    }

    /// A random `u8`.
    pub(crate) fn u8(&mut self) -> u8 {
        self.next_u64().to_le_bytes()[0]
    }

    /// A random `u16`.
    pub(crate) fn u16(&mut self) -> u16 {
        let b = self.next_u64().to_le_bytes();
        u16::from_le_bytes([b[0], b[1]])
    }

    /// A random `u32`.
    pub(crate) fn u32(&mut self) -> u32 {
        let b = self.next_u64().to_le_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| Rng::for_case(7, 3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(Rng::for_case(7, 3).next_u64(), Rng::for_case(7, 4).next_u64());
        assert_ne!(Rng::for_case(7, 3).next_u64(), Rng::for_case(8, 3).next_u64());
        let mut r = Rng::for_case(1, 0);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            assert_eq!(r.below(0), 0);
        }
        assert_eq!(r.weighted(&[(0, 'a'), (0, 'b')]), None);
        assert_eq!(r.weighted(&[(0, 'a'), (5, 'b')]), Some('b'));
    }
}
