//! Shrinking a failing case: drop its operations one at a time while the failure still
//! reproduces, until no single operation can go (a 1-minimal case).

use super::mutate::Case;

/// The answer of one reproduction attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The same failure again.
    Fails,
    /// No failure (or another one).
    Passes,
    /// Stop minimising (out of time, or the peer is gone).
    Stop,
}

/// The smallest case found, and the indices (into `case.ops`) it kept; `try_case` runs one
/// candidate.
pub(crate) fn minimize(case: &Case, mut try_case: impl FnMut(&Case) -> Attempt) -> (Case, Vec<usize>) {
    let mut keep: Vec<usize> = (0..case.ops.len()).collect();
    let mut changed = true;
    'outer: while changed {
        changed = false;
        let mut i = 0;
        while i < keep.len() {
            let mut fewer = keep.clone();
            fewer.remove(i);
            match try_case(&case.keeping(&fewer)) {
                Attempt::Fails => {
                    keep = fewer;
                    changed = true;
                }
                Attempt::Passes => i += 1,
                Attempt::Stop => break 'outer,
            }
        }
    }
    (case.keeping(&keep), keep)
}

#[cfg(test)]
mod tests {
    use super::super::mutate::{Op, Point, Template};
    use super::*;

    fn case(ops: Vec<Op>) -> Case {
        Case { index: 0, point: Point::First, crc: false, p2p: false, template: Template::Send, ops }
    }

    #[test]
    fn shrinks_to_what_matters() {
        let c = case(vec![Op::Pad(1), Op::Opcode(0xd), Op::Split(2), Op::Crc(1)]);
        let mut tries = 0;
        let (min, kept) = minimize(&c, |c| {
            tries += 1;
            if c.has(&Op::Opcode(0xd)) { Attempt::Fails } else { Attempt::Passes }
        });
        assert_eq!(min.ops, vec![Op::Opcode(0xd)]);
        assert_eq!(kept, vec![1]);
        assert!(tries <= 8, "{tries}");
        // Two operations that only fail together both stay.
        let (min, kept) = minimize(&c, |c| {
            if c.has(&Op::Pad(1)) && c.has(&Op::Crc(1)) { Attempt::Fails } else { Attempt::Passes }
        });
        assert_eq!((min.ops.len(), kept), (2, vec![0, 3]));
        // Stopping keeps what was shrunk so far.
        let mut n = 0;
        let (min, _) = minimize(&c, |_| {
            n += 1;
            if n == 1 { Attempt::Fails } else { Attempt::Stop }
        });
        assert_eq!(min.ops.len(), 3);
        // A failure that needs no operation at all shrinks to none.
        let (min, kept) = minimize(&c, |_| Attempt::Fails);
        assert!(min.ops.is_empty() && kept.is_empty());
    }
}
