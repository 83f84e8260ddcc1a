//! Segmentation of one DDP message into segments that fit the MULPDU (RFC 5041 section 5.2).
//!
//! The MULPDU is the largest ULPDU (DDP header + payload) the lower layer carries in one FPDU;
//! MPA derives it from the path EMSS. Every segment but the last carries
//! `MULPDU - header length` payload bytes; the last one has L set. A zero-length message is one
//! segment, with L set and an empty payload (siw's peer-to-peer RTR, a zero-length tagged
//! Write, is one; see tests/data/siw/siw-rping-p2p.pcap).
//!
//! - Tagged: every segment carries the message's STag; the TO advances by the payload bytes
//!   already sent.
//! - Untagged: every segment carries the same QN and MSN (and RDMAP word); the MO advances by
//!   the payload bytes already sent.
//!
//! [`Segmenter`] is an iterator of `(HeaderRepr, payload range within the message)`: the caller
//! frames the header followed by `message[range]`, copying nothing itself.

use core::fmt;
use core::ops::Range;

use crate::header::{
    HeaderRepr, Msn, QueueNumber, STag, SegmentKind, TAGGED_HEADER_LEN, TaggedOffset, UNTAGGED_HEADER_LEN,
};

/// Where a message goes: the model and the fields every segment of it shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageTarget {
    /// Tagged buffer model.
    Tagged {
        /// The data sink's STag.
        stag: STag,
        /// The tagged offset of the message's first byte.
        to: TaggedOffset,
    },
    /// Untagged buffer model.
    Untagged {
        /// RDMAP's 32-bit word (the Invalidate STag of a Send with Invalidate, else 0).
        rdmap_word: u32,
        /// The queue number.
        qn: QueueNumber,
        /// The message's sequence number (the same in all its segments).
        msn: Msn,
    },
}

impl MessageTarget {
    /// The length of the DDP header of each segment.
    pub fn header_len(&self) -> usize {
        match self {
            MessageTarget::Tagged { .. } => TAGGED_HEADER_LEN,
            MessageTarget::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }
}

/// Why a message cannot be segmented (local API misuse: nothing was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentError {
    /// The MULPDU leaves no room for a payload byte after the header.
    MulpduTooSmall {
        /// The MULPDU given.
        mulpdu: usize,
        /// The smallest usable MULPDU: header length + 1.
        min: usize,
    },
    /// Tagged: TO + message length exceeds 2^64 - 1 (the sink would see a TO wrap).
    ToWrap {
        /// The message's first TO.
        to: TaggedOffset,
        /// The message length.
        len: usize,
    },
    /// Untagged: the message is longer than the 32-bit MO can address.
    MessageTooLong {
        /// The message length.
        len: usize,
        /// The largest untagged message: `u32::MAX` bytes.
        max: u64,
    },
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::MulpduTooSmall { mulpdu, min } => {
                write!(f, "MULPDU {mulpdu} too small for a DDP segment (needs at least {min})")
            }
            SegmentError::ToWrap { to, len } => {
                write!(f, "tagged message of {len} bytes at TO {to} would wrap the 64-bit TO")
            }
            SegmentError::MessageTooLong { len, max } => {
                write!(f, "untagged message of {len} bytes exceeds the {max}-byte MO range")
            }
        }
    }
}

impl std::error::Error for SegmentError {}

/// An iterator over the segments of one message: `(header, payload range in the message)`.
///
/// Built by [`Segmenter::new`], which checks everything up front, so iteration cannot fail.
#[derive(Debug, Clone)]
pub struct Segmenter {
    target: MessageTarget,
    rdmap_control: u8,
    len: usize,
    max_payload: usize,
    /// Offset of the next segment's first payload byte; `None` once the last was yielded.
    next: Option<usize>,
}

impl Segmenter {
    /// Plans the segments of a `len`-byte message for `mulpdu`-byte ULPDUs.
    ///
    /// Errors: `mulpdu` below header + 1 ([`SegmentError::MulpduTooSmall`]), a tagged message
    /// whose end would pass TO 2^64 - 1 ([`SegmentError::ToWrap`]), an untagged message longer
    /// than `u32::MAX` ([`SegmentError::MessageTooLong`]).
    pub fn new(
        target: MessageTarget,
        rdmap_control: u8,
        len: usize,
        mulpdu: usize,
    ) -> Result<Segmenter, SegmentError> {
        let header_len = target.header_len();
        let min = header_len + 1;
        if mulpdu < min {
            return Err(SegmentError::MulpduTooSmall { mulpdu, min });
        }
        let len64 = u64::try_from(len).unwrap_or(u64::MAX);
        match target {
            MessageTarget::Tagged { to, .. } => {
                if to.checked_add(len64).is_none() {
                    return Err(SegmentError::ToWrap { to, len });
                }
            }
            MessageTarget::Untagged { .. } => {
                let max = u64::from(u32::MAX);
                if len64 > max {
                    return Err(SegmentError::MessageTooLong { len, max });
                }
            }
        }
        Ok(Segmenter { target, rdmap_control, len, max_payload: mulpdu - header_len, next: Some(0) })
    }

    /// The payload bytes every segment but the last carries: MULPDU - header length.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// The payload bytes not yet in a segment, of a message whose first segment was taken
    /// (0 before that, and once the last was taken).
    pub fn begun_rest(&self) -> usize {
        match self.next {
            Some(offset) if offset > 0 => self.len - offset,
            _ => 0,
        }
    }

    /// How many segments are left.
    fn remaining(&self) -> usize {
        match self.next {
            None => 0,
            Some(offset) => {
                let rest = self.len - offset;
                rest.div_ceil(self.max_payload).max(1)
            }
        }
    }
}

impl Iterator for Segmenter {
    type Item = (HeaderRepr, Range<usize>);

    fn next(&mut self) -> Option<(HeaderRepr, Range<usize>)> {
        let offset = self.next?;
        let rest = self.len - offset;
        let take = rest.min(self.max_payload);
        let end = offset + take;
        let last = end == self.len;
        self.next = if last { None } else { Some(end) };
        // `new` checked TO + len and len <= u32::MAX, so neither conversion below can fail
        // for offset <= len; the fallbacks are never taken.
        let offset64 = u64::try_from(offset).unwrap_or(u64::MAX);
        let kind = match self.target {
            MessageTarget::Tagged { stag, to } => {
                SegmentKind::Tagged { stag, to: to.checked_add(offset64).unwrap_or(TaggedOffset(u64::MAX)) }
            }
            MessageTarget::Untagged { rdmap_word, qn, msn } => {
                SegmentKind::Untagged { rdmap_word, qn, msn, mo: u32::try_from(offset).unwrap_or(u32::MAX) }
            }
        };
        Some((HeaderRepr { last, rdmap_control: self.rdmap_control, kind }, offset..end))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Segmenter {}

impl core::iter::FusedIterator for Segmenter {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::SegmentRepr;
    use proptest::prelude::*;

    const WRITE: MessageTarget =
        MessageTarget::Tagged { stag: STag(0xb702_1900), to: TaggedOffset(0x5609_81e2_4000) };
    const SEND: MessageTarget = MessageTarget::Untagged { rdmap_word: 0, qn: QueueNumber::Send, msn: Msn(1) };

    /// siw-write-bw.pcap: an 8 KiB RDMA Write with MULPDU 1442 is 5 x 1442 + 1066-byte ULPDUs,
    /// 1428 payload bytes each but the last, TO advancing by 1428.
    #[test]
    fn siw_write_8k() {
        let segs: Vec<_> = Segmenter::new(WRITE, 0x40, 8192, 1442).unwrap().collect();
        assert_eq!(segs.len(), 6);
        let ulpdus: Vec<usize> = segs.iter().map(|(h, r)| h.header_len() + r.len()).collect();
        assert_eq!(ulpdus, [1442, 1442, 1442, 1442, 1442, 1066]);
        for (i, (h, r)) in segs.iter().enumerate() {
            assert_eq!(r.start, i * 1428);
            assert_eq!(h.last, i == 5);
            assert_eq!(
                h.kind,
                SegmentKind::Tagged {
                    stag: STag(0xb702_1900),
                    to: TaggedOffset(0x5609_81e2_4000 + 1428 * i as u64)
                }
            );
        }
        // The header bytes of the first and last segment as captured.
        let payload = [0u8; 1428];
        let first = segs[0].0.with_payload(&payload).to_vec();
        assert_eq!(
            &first[..14],
            &[0x81, 0x40, 0xb7, 0x02, 0x19, 0, 0, 0, 0x56, 0x09, 0x81, 0xe2, 0x40, 0x00]
        );
        let last = segs[5].0.with_payload(&payload[..1052]).to_vec();
        assert_eq!(&last[..14], &[0xc1, 0x40, 0xb7, 0x02, 0x19, 0, 0, 0, 0x56, 0x09, 0x81, 0xe2, 0x5b, 0xe4]);
    }

    /// siw-send-bw.pcap: an 8 KiB Send is 5 x 1442 + 1090-byte ULPDUs (1424 payload bytes each
    /// but the last), MSN 1 in all six, MO 0, 0x590, ..., 0x1bd0.
    #[test]
    fn siw_send_8k() {
        let mut it = Segmenter::new(SEND, 0x43, 8192, 1442).unwrap();
        assert_eq!(it.len(), 6);
        assert_eq!(it.max_payload(), 1424);
        let segs: Vec<_> = it.by_ref().collect();
        assert_eq!(it.len(), 0);
        assert_eq!(it.next(), None);
        let ulpdus: Vec<usize> = segs.iter().map(|(h, r)| h.header_len() + r.len()).collect();
        assert_eq!(ulpdus, [1442, 1442, 1442, 1442, 1442, 1090]);
        let mos: Vec<u32> = segs
            .iter()
            .map(|(h, _)| match h.kind {
                SegmentKind::Untagged { mo, msn, qn, .. } => {
                    assert_eq!((msn, qn), (Msn(1), QueueNumber::Send));
                    mo
                }
                SegmentKind::Tagged { .. } => panic!("tagged"),
            })
            .collect();
        assert_eq!(mos, [0, 0x590, 0xb20, 0x10b0, 0x1640, 0x1bd0]);
        let last = segs[5].0.with_payload(&[]).to_vec();
        assert_eq!(last, [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0x1b, 0xd0]);
    }

    #[test]
    fn zero_length_is_one_last_segment() {
        // siw's peer-to-peer RTR: a zero-length tagged Write with STag 1, TO 0.
        let rtr = MessageTarget::Tagged { stag: STag(1), to: TaggedOffset(0) };
        let segs: Vec<_> = Segmenter::new(rtr, 0x40, 0, 1442).unwrap().collect();
        assert_eq!(segs.len(), 1);
        assert!(segs[0].0.last);
        assert_eq!(segs[0].1, 0..0);
        assert_eq!(segs[0].0.with_payload(&[]).to_vec(), [0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let segs: Vec<_> = Segmenter::new(SEND, 0x43, 0, 19).unwrap().collect();
        assert_eq!(segs.len(), 1);
        assert!(segs[0].0.last);
    }

    #[test]
    fn exact_multiple_has_no_empty_tail() {
        let segs: Vec<_> = Segmenter::new(SEND, 0x43, 20, 28).unwrap().collect();
        assert_eq!(segs.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(), [0..10, 10..20]);
        assert_eq!(segs.iter().map(|(h, _)| h.last).collect::<Vec<_>>(), [false, true]);
    }

    #[test]
    fn errors() {
        assert_eq!(
            Segmenter::new(WRITE, 0x40, 10, 14).unwrap_err(),
            SegmentError::MulpduTooSmall { mulpdu: 14, min: 15 }
        );
        assert!(Segmenter::new(WRITE, 0x40, 10, 15).is_ok());
        assert_eq!(
            Segmenter::new(SEND, 0x43, 10, 18).unwrap_err(),
            SegmentError::MulpduTooSmall { mulpdu: 18, min: 19 }
        );
        let one_byte: Vec<_> = Segmenter::new(SEND, 0x43, 3, 19).unwrap().map(|(_, r)| r).collect();
        assert_eq!(one_byte, [0..1, 1..2, 2..3]);

        let high = MessageTarget::Tagged { stag: STag(1), to: TaggedOffset(u64::MAX - 9) };
        assert!(Segmenter::new(high, 0x40, 9, 100).is_ok());
        assert!(Segmenter::new(high, 0x40, 10, 100).is_err());
        assert_eq!(
            Segmenter::new(high, 0x40, 11, 100).unwrap_err(),
            SegmentError::ToWrap { to: TaggedOffset(u64::MAX - 9), len: 11 }
        );
        let too_long = usize::try_from(u64::from(u32::MAX) + 1).unwrap();
        assert_eq!(
            Segmenter::new(SEND, 0x43, too_long, 1442).unwrap_err(),
            SegmentError::MessageTooLong { len: too_long, max: u64::from(u32::MAX) }
        );
        assert!(SegmentError::MulpduTooSmall { mulpdu: 14, min: 15 }.to_string().contains("14"));
    }

    fn arb_target() -> impl Strategy<Value = MessageTarget> {
        prop_oneof![
            (any::<u32>(), 0..u64::MAX / 2)
                .prop_map(|(s, t)| MessageTarget::Tagged { stag: STag(s), to: TaggedOffset(t) }),
            (any::<u32>(), 0..4u32, any::<u32>()).prop_map(|(w, q, m)| MessageTarget::Untagged {
                rdmap_word: w,
                qn: QueueNumber::from(q),
                msn: Msn(m)
            }),
        ]
    }

    proptest! {
        #[test]
        fn segments_cover_message(
            target in arb_target(),
            message in proptest::collection::vec(any::<u8>(), 0..3000),
            mulpdu in 19usize..1600,
        ) {
            let it = Segmenter::new(target, 0x43, message.len(), mulpdu).unwrap();
            let count = it.len();
            let segs: Vec<_> = it.collect();
            prop_assert_eq!(segs.len(), count);
            prop_assert!(!segs.is_empty());
            let mut joined = Vec::new();
            for (i, (h, r)) in segs.iter().enumerate() {
                prop_assert_eq!(h.last, i + 1 == segs.len());
                prop_assert!(h.header_len() + r.len() <= mulpdu);
                prop_assert!(h.last || h.header_len() + r.len() == mulpdu);
                prop_assert!(!r.is_empty() || message.is_empty());
                prop_assert_eq!(r.start, joined.len());
                let offset = r.start as u64;
                match (h.kind, target) {
                    (SegmentKind::Tagged { stag, to }, MessageTarget::Tagged { stag: s0, to: t0 }) => {
                        prop_assert_eq!(stag, s0);
                        prop_assert_eq!(to.0, t0.0 + offset);
                    }
                    (
                        SegmentKind::Untagged { rdmap_word, qn, msn, mo },
                        MessageTarget::Untagged { rdmap_word: w0, qn: q0, msn: m0 },
                    ) => {
                        prop_assert_eq!((rdmap_word, qn, msn), (w0, q0, m0));
                        prop_assert_eq!(u64::from(mo), offset);
                    }
                    _ => prop_assert!(false, "model changed"),
                }
                // Each segment survives emit + parse.
                let payload = &message[r.clone()];
                let wire = h.with_payload(payload).to_vec();
                let back = SegmentRepr::parse(&wire).unwrap();
                prop_assert_eq!(back.header, *h);
                joined.extend_from_slice(back.payload);
            }
            prop_assert_eq!(joined, message);
        }
    }
}
