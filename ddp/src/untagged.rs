//! Untagged receive queues (RFC 5041 section 5.3): per queue number 0..=3, the buffers the
//! ULP posted, the expected MSN, and the next MO of the message being received.
//!
//! The caller posts buffers ([`UntaggedQueues::post`]): lengths alone, or buffers that know
//! their length ([`Capacity`]); buffer `k` posted on a queue receives message `expected MSN +
//! k`. [`UntaggedQueues::accept`] checks one incoming
//! untagged segment and says where its payload goes, or which Terminate the peer earned.
//!
//! The LLP (TCP + MPA) delivers in order and two untagged messages of the same queue do not
//! interleave, so every segment belongs to the queue's expected MSN and its MO is exactly the
//! number of bytes already received for that message. Checks, in order:
//!
//! 1. the QN is 0..=3, else invalid QN (DDP untagged 0x01);
//! 2. the MSN is the expected one; an MSN ahead of it in the posted window or behind it (an
//!    old message, modulo 2^32) is out of range (0x03); the expected MSN, or one further
//!    ahead, with no buffer posted for it is "no buffer" (0x02);
//! 3. the MO is the message's next byte (0x04);
//! 4. MO + payload fits the posted buffer (0x05).
//!
//! The segment with L set completes the message: its buffer is consumed and the expected MSN
//! advances (wrapping at 2^32).

use core::fmt;
use std::collections::VecDeque;

use crate::header::{Msn, QueueNumber, SegmentKind};
use crate::stag_table::AccessError;
use crate::terminate::{TerminateCode, ddp_type};

/// The number of untagged queues (QN 0..=3).
pub const QUEUE_COUNT: usize = 4;

/// An error found on an untagged segment: by [`UntaggedQueues::accept`] (the peer's), or while
/// placing it into the posted buffer (local).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UntaggedError {
    /// The segment is tagged (the caller routed it here by mistake): local misuse.
    NotUntagged,
    /// QN is not 0..=3.
    InvalidQn(QueueNumber),
    /// No buffer is posted for the MSN.
    NoBuffer {
        /// The queue.
        qn: QueueNumber,
        /// The segment's MSN.
        msn: Msn,
    },
    /// The MSN is not the queue's expected MSN (and not one that merely lacks a buffer).
    MsnOutOfRange {
        /// The queue.
        qn: QueueNumber,
        /// The segment's MSN.
        msn: Msn,
        /// The MSN the queue expects.
        expected: Msn,
    },
    /// The MO is not the next byte of the message.
    InvalidMo {
        /// The segment's MO.
        mo: u32,
        /// The MO expected.
        expected: u64,
    },
    /// MO + payload length exceeds the posted buffer.
    MessageTooLong {
        /// The end offset the segment reaches.
        end: u64,
        /// The posted buffer's length.
        buffer_len: u64,
    },
    /// The posted buffer's own scatter list could not be written (an lkey that is not, or no
    /// longer, valid for local write, or out of its region's bounds): a local error, not the
    /// peer's, that still ends the stream since the message cannot be placed.
    LocalBuffer(AccessError),
}

impl UntaggedError {
    /// The Terminate code (RFC 5040 section 7 table, layer 1 DDP): type 2 untagged buffer for
    /// the peer's errors; type 0 local catastrophic (code 0x00) for the local ones
    /// ([`UntaggedError::LocalBuffer`], and [`UntaggedError::NotUntagged`], which a correct
    /// caller never meets).
    pub fn terminate_code(self) -> TerminateCode {
        let code = match self {
            UntaggedError::NotUntagged | UntaggedError::LocalBuffer(_) => {
                return TerminateCode::ddp(ddp_type::LOCAL_CATASTROPHIC, 0x00);
            }
            UntaggedError::InvalidQn(_) => 0x01,
            UntaggedError::NoBuffer { .. } => 0x02,
            UntaggedError::MsnOutOfRange { .. } => 0x03,
            UntaggedError::InvalidMo { .. } => 0x04,
            UntaggedError::MessageTooLong { .. } => 0x05,
        };
        TerminateCode::ddp(ddp_type::UNTAGGED_BUFFER, code)
    }
}

impl fmt::Display for UntaggedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UntaggedError::NotUntagged => f.write_str("tagged segment given to the untagged queues"),
            UntaggedError::InvalidQn(qn) => write!(f, "invalid untagged queue number: {qn}"),
            UntaggedError::NoBuffer { qn, msn } => write!(f, "no buffer posted on {qn} for MSN {msn}"),
            UntaggedError::MsnOutOfRange { qn, msn, expected } => {
                write!(f, "MSN {msn} out of range on {qn} (expected {expected})")
            }
            UntaggedError::InvalidMo { mo, expected } => write!(f, "invalid MO {mo} (expected {expected})"),
            UntaggedError::MessageTooLong { end, buffer_len } => {
                write!(f, "untagged message reaches byte {end}, posted buffer holds {buffer_len}")
            }
            UntaggedError::LocalBuffer(e) => write!(f, "posted buffer not writable: {e}"),
        }
    }
}

impl std::error::Error for UntaggedError {}

/// A refused [`UntaggedQueues::post`] (local misuse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostError {
    /// The queue number is not 0..=3.
    InvalidQn(QueueNumber),
    /// The queue already holds its maximum number of posted buffers.
    QueueFull {
        /// The queue.
        qn: QueueNumber,
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::InvalidQn(qn) => write!(f, "cannot post a buffer on {qn}"),
            PostError::QueueFull { qn, limit } => write!(f, "{qn} already holds {limit} posted buffers"),
        }
    }
}

impl std::error::Error for PostError {}

/// A buffer posted on an untagged queue, as the queues see it: how many bytes a message on
/// it may bring. A length alone (`u64`) is one.
pub trait Capacity {
    /// The most bytes a message on the buffer may bring.
    fn capacity(&self) -> u64;
}

impl Capacity for u64 {
    fn capacity(&self) -> u64 {
        *self
    }
}

/// Where an accepted untagged segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UntaggedPlacement {
    /// The queue.
    pub qn: QueueNumber,
    /// The message, which is also the posted buffer it lands in (see [`UntaggedQueues::post`]).
    pub msn: Msn,
    /// The byte offset in that buffer of the payload's first byte (the MO).
    pub offset: u32,
    /// Set on the last segment: the message is complete, this many bytes long, its buffer is
    /// consumed and the queue expects the next MSN.
    pub completed_len: Option<u64>,
}

#[derive(Debug, Clone)]
struct Queue<B> {
    /// The posted buffers; the front one takes MSN `expected`.
    posted: VecDeque<B>,
    expected: Msn,
    /// Bytes of message `expected` received so far (its next MO).
    next_mo: u64,
}

impl<B> Default for Queue<B> {
    fn default() -> Queue<B> {
        Queue { posted: VecDeque::new(), expected: Msn::INITIAL, next_mo: 0 }
    }
}

/// The untagged receive state of one stream: queues 0..=3 and the buffers posted on them
/// (lengths, by default). Sans-IO; the caller posts buffers and asks where each segment goes.
#[derive(Debug, Clone)]
pub struct UntaggedQueues<B = u64> {
    queues: [Queue<B>; QUEUE_COUNT],
    max_posted: usize,
}

impl<B: Capacity> UntaggedQueues<B> {
    /// New queues, each expecting MSN 1, each holding at most `max_posted` posted buffers.
    pub fn new(max_posted: usize) -> UntaggedQueues<B> {
        UntaggedQueues { queues: Default::default(), max_posted }
    }

    fn queue(&self, qn: QueueNumber) -> Option<&Queue<B>> {
        self.queues.get(qn.index()?)
    }

    fn queue_mut(&mut self, qn: QueueNumber) -> Option<&mut Queue<B>> {
        self.queues.get_mut(qn.index()?)
    }

    /// Posts `buffer` on queue `qn`; returns the MSN of the message it will receive, or the
    /// buffer back with the reason.
    pub fn post_buffer(&mut self, qn: QueueNumber, buffer: B) -> Result<Msn, (PostError, B)> {
        let limit = self.max_posted;
        let Some(q) = self.queue_mut(qn) else { return Err((PostError::InvalidQn(qn), buffer)) };
        let k = match u32::try_from(q.posted.len()) {
            Ok(k) if q.posted.len() < limit => k,
            _ => return Err((PostError::QueueFull { qn, limit }, buffer)),
        };
        q.posted.push_back(buffer);
        Ok(q.expected.wrapping_add(k))
    }

    /// Posts a buffer on queue `qn` ([`UntaggedQueues::post_buffer`], dropping a refused one);
    /// returns the MSN of the message it will receive.
    pub fn post(&mut self, qn: QueueNumber, buffer: B) -> Result<Msn, PostError> {
        self.post_buffer(qn, buffer).map_err(|(e, _)| e)
    }

    /// The buffer the next message on `qn` goes into.
    pub fn front(&self, qn: QueueNumber) -> Option<&B> {
        self.queue(qn)?.posted.front()
    }

    /// The MSN queue `qn` expects next (`None` for an invalid QN).
    pub fn expected_msn(&self, qn: QueueNumber) -> Option<Msn> {
        self.queue(qn).map(|q| q.expected)
    }

    /// How many buffers are posted on queue `qn` (`None` for an invalid QN).
    pub fn posted(&self, qn: QueueNumber) -> Option<usize> {
        self.queue(qn).map(|q| q.posted.len())
    }

    /// Bytes received so far of the message in progress on `qn` (`None` for an invalid QN).
    pub fn next_mo(&self, qn: QueueNumber) -> Option<u64> {
        self.queue(qn).map(|q| q.next_mo)
    }

    /// Takes the front buffer posted on `qn` off the queue (its message failed, the stream
    /// ends): the message in progress is forgotten, the expected MSN stays.
    pub fn discard_front(&mut self, qn: QueueNumber) -> Option<B> {
        let q = self.queue_mut(qn)?;
        q.next_mo = 0;
        q.posted.pop_front()
    }

    /// Checks one untagged segment (its header fields, L, and payload length) and records it;
    /// on the message's last segment its buffer is consumed (dropped: see
    /// [`UntaggedQueues::record`] for a caller that keeps it). On error nothing changes; the
    /// stream must be terminated with the error's code.
    pub fn accept(
        &mut self,
        kind: SegmentKind,
        last: bool,
        payload_len: usize,
    ) -> Result<UntaggedPlacement, UntaggedError> {
        let p = self.check(kind, last, payload_len)?;
        self.record(p, payload_len);
        Ok(p)
    }

    /// The checks of [`UntaggedQueues::accept`], recording nothing: where the segment would
    /// go. [`UntaggedQueues::record`] then records it (once the payload is placed).
    #[inline]
    pub fn check(
        &self,
        kind: SegmentKind,
        last: bool,
        payload_len: usize,
    ) -> Result<UntaggedPlacement, UntaggedError> {
        let SegmentKind::Untagged { qn, msn, mo, .. } = kind else {
            return Err(UntaggedError::NotUntagged);
        };
        let q = self.queue(qn).ok_or(UntaggedError::InvalidQn(qn))?;
        if msn != q.expected {
            let ahead = msn.distance_from(q.expected);
            let posted = u32::try_from(q.posted.len()).unwrap_or(u32::MAX);
            // Ahead (within half the MSN space) and beyond the posted buffers: nothing to
            // place it in. Otherwise (a posted but not yet due MSN, or an old one): range.
            if ahead >= posted && ahead < 1 << 31 {
                return Err(UntaggedError::NoBuffer { qn, msn });
            }
            return Err(UntaggedError::MsnOutOfRange { qn, msn, expected: q.expected });
        }
        let Some(buffer_len) = q.posted.front().map(Capacity::capacity) else {
            return Err(UntaggedError::NoBuffer { qn, msn });
        };
        if u64::from(mo) != q.next_mo {
            return Err(UntaggedError::InvalidMo { mo, expected: q.next_mo });
        }
        let end = u64::from(mo).saturating_add(u64::try_from(payload_len).unwrap_or(u64::MAX));
        if end > buffer_len {
            return Err(UntaggedError::MessageTooLong { end, buffer_len });
        }
        Ok(UntaggedPlacement { qn, msn, offset: mo, completed_len: last.then_some(end) })
    }

    /// Records a segment [`UntaggedQueues::check`] accepted (`p`, for `payload_len` bytes): the
    /// message's next MO advances, or on the last segment its buffer is consumed (and
    /// returned) and the queue expects the next MSN.
    pub fn record(&mut self, p: UntaggedPlacement, payload_len: usize) -> Option<B> {
        let q = self.queue_mut(p.qn)?;
        if p.completed_len.is_some() {
            q.expected = q.expected.next();
            q.next_mo = 0;
            q.posted.pop_front()
        } else {
            q.next_mo = u64::from(p.offset).saturating_add(u64::try_from(payload_len).unwrap_or(u64::MAX));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::{STag, SegmentRepr, TaggedOffset};
    use crate::segment::{MessageTarget, Segmenter};
    use proptest::prelude::*;

    fn seg(qn: u32, msn: u32, mo: u32) -> SegmentKind {
        SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::from(qn), msn: Msn(msn), mo }
    }

    /// siw-send-bw.pcap: 8 KiB Sends on QN 0, MSN 1, 2, 3, ..., six segments each, 1424
    /// payload bytes each but the last (1072), MO 0, 0x590, ..., 0x1bd0.
    #[test]
    fn siw_send_bw_sequence() {
        let mut q = UntaggedQueues::new(8);
        for k in 0..3 {
            assert_eq!(q.post(QueueNumber::Send, 8192), Ok(Msn(1 + k)));
        }
        for msn in 1..=3u32 {
            for i in 0..6u32 {
                let last = i == 5;
                let len = if last { 1072 } else { 1424 };
                let p = q.accept(seg(0, msn, i * 1424), last, len).unwrap();
                assert_eq!(p.qn, QueueNumber::Send);
                assert_eq!(p.msn, Msn(msn));
                assert_eq!(p.offset, i * 1424);
                assert_eq!(p.completed_len, last.then_some(8192));
            }
            assert_eq!(q.expected_msn(QueueNumber::Send), Some(Msn(msn + 1)));
        }
        assert_eq!(q.posted(QueueNumber::Send), Some(0));
        assert_eq!(
            q.accept(seg(0, 4, 0), true, 1),
            Err(UntaggedError::NoBuffer { qn: QueueNumber::Send, msn: Msn(4) })
        );
    }

    #[test]
    fn segmenter_output_is_accepted() {
        let mut q = UntaggedQueues::new(1);
        q.post(QueueNumber::ReadRequest, 28).unwrap();
        let target = MessageTarget::Untagged { rdmap_word: 0, qn: QueueNumber::ReadRequest, msn: Msn(1) };
        let body = [0u8; 28];
        for (h, r) in Segmenter::new(target, 0x41, 28, 30).unwrap() {
            let wire = h.with_payload(&body[r]).to_vec();
            let parsed = SegmentRepr::parse(&wire).unwrap();
            q.accept(parsed.header.kind, parsed.header.last, parsed.payload.len()).unwrap();
        }
        assert_eq!(q.expected_msn(QueueNumber::ReadRequest), Some(Msn(2)));
    }

    #[test]
    fn each_error_and_its_terminate_code() {
        let mut q = UntaggedQueues::new(4);
        q.post(QueueNumber::Send, 100).unwrap();
        q.post(QueueNumber::Send, 100).unwrap();
        let cases = [
            (seg(4, 1, 0), 1, UntaggedError::InvalidQn(QueueNumber::Unknown(4)), 0x01),
            (seg(2, 1, 0), 1, UntaggedError::NoBuffer { qn: QueueNumber::Terminate, msn: Msn(1) }, 0x02),
            (seg(0, 3, 0), 1, UntaggedError::NoBuffer { qn: QueueNumber::Send, msn: Msn(3) }, 0x02),
            (
                seg(0, 2, 0),
                1,
                UntaggedError::MsnOutOfRange { qn: QueueNumber::Send, msn: Msn(2), expected: Msn(1) },
                0x03,
            ),
            (
                seg(0, 0, 0),
                1,
                UntaggedError::MsnOutOfRange { qn: QueueNumber::Send, msn: Msn(0), expected: Msn(1) },
                0x03,
            ),
            (seg(0, 1, 5), 1, UntaggedError::InvalidMo { mo: 5, expected: 0 }, 0x04),
            (seg(0, 1, 0), 101, UntaggedError::MessageTooLong { end: 101, buffer_len: 100 }, 0x05),
        ];
        for (kind, len, err, code) in cases {
            assert_eq!(q.accept(kind, true, len), Err(err));
            // docs/protocol-notes.md#terminate-codes: layer 1 DDP, type 2 untagged buffer.
            let c = err.terminate_code();
            assert_eq!((c.layer.to_u8(), c.error_type, c.code), (1, 2, code), "{err}");
        }
        // Nothing changed: the expected message still goes through.
        assert_eq!(q.expected_msn(QueueNumber::Send), Some(Msn(1)));
        assert_eq!(q.accept(seg(0, 1, 0), true, 100).unwrap().completed_len, Some(100));
        let tagged = SegmentKind::Tagged { stag: STag(1), to: TaggedOffset(0) };
        assert_eq!(q.accept(tagged, true, 0), Err(UntaggedError::NotUntagged));
        // The local errors: DDP local catastrophic.
        for e in [UntaggedError::NotUntagged, UntaggedError::LocalBuffer(AccessError::InvalidStag)] {
            let c = e.terminate_code();
            assert_eq!((c.layer.to_u8(), c.error_type, c.code), (1, 0, 0), "{e}");
        }
        assert!(UntaggedError::LocalBuffer(AccessError::BaseOrBounds).to_string().contains("not writable"));
        // Discarding the front buffer leaves the expected MSN.
        assert_eq!(q.discard_front(QueueNumber::Send), Some(100));
        assert_eq!(q.discard_front(QueueNumber::Send), None);
        assert_eq!(q.discard_front(QueueNumber::Unknown(7)), None);
        assert_eq!(q.expected_msn(QueueNumber::Send), Some(Msn(2)));
    }

    #[test]
    fn mo_must_follow_and_too_long_across_segments() {
        let mut q = UntaggedQueues::new(2);
        q.post(QueueNumber::Send, 10).unwrap();
        q.accept(seg(0, 1, 0), false, 6).unwrap();
        assert_eq!(q.next_mo(QueueNumber::Send), Some(6));
        assert_eq!(q.accept(seg(0, 1, 0), false, 1), Err(UntaggedError::InvalidMo { mo: 0, expected: 6 }));
        assert_eq!(q.accept(seg(0, 1, 7), false, 1), Err(UntaggedError::InvalidMo { mo: 7, expected: 6 }));
        assert_eq!(
            q.accept(seg(0, 1, 6), true, 5),
            Err(UntaggedError::MessageTooLong { end: 11, buffer_len: 10 })
        );
        assert_eq!(q.accept(seg(0, 1, 6), true, 4).unwrap().completed_len, Some(10));
        assert_eq!(q.next_mo(QueueNumber::Send), Some(0));
    }

    #[test]
    fn zero_length_message() {
        let mut q = UntaggedQueues::new(2);
        q.post(QueueNumber::Send, 0).unwrap();
        let p = q.accept(seg(0, 1, 0), true, 0).unwrap();
        assert_eq!(p.completed_len, Some(0));
    }

    #[test]
    fn msn_wraps_and_queues_are_independent() {
        let mut q = UntaggedQueues::new(3);
        q.queues[1].expected = Msn(u32::MAX);
        assert_eq!(q.post(QueueNumber::ReadRequest, 28), Ok(Msn(u32::MAX)));
        assert_eq!(q.post(QueueNumber::ReadRequest, 28), Ok(Msn(0)));
        q.accept(seg(1, u32::MAX, 0), true, 28).unwrap();
        q.accept(seg(1, 0, 0), true, 28).unwrap();
        assert_eq!(q.expected_msn(QueueNumber::ReadRequest), Some(Msn(1)));
        // Queue 0 is untouched.
        assert_eq!(q.expected_msn(QueueNumber::Send), Some(Msn(1)));
        assert_eq!(q.expected_msn(QueueNumber::Unknown(9)), None);
    }

    #[test]
    fn post_errors() {
        let mut q = UntaggedQueues::new(1);
        assert_eq!(q.post(QueueNumber::Unknown(4), 1), Err(PostError::InvalidQn(QueueNumber::Unknown(4))));
        q.post(QueueNumber::AtomicResponse, 16).unwrap();
        assert_eq!(
            q.post(QueueNumber::AtomicResponse, 16),
            Err(PostError::QueueFull { qn: QueueNumber::AtomicResponse, limit: 1 })
        );
        assert!(PostError::QueueFull { qn: QueueNumber::Send, limit: 1 }.to_string().contains("QN 0"));
    }

    proptest! {
        /// Whatever headers a peer sends, accept never panics, and a refused segment changes
        /// nothing.
        #[test]
        fn accept_is_total(segs in proptest::collection::vec((0u32..6, 0u32..5, 0u32..64, any::<bool>(), 0usize..64), 0..40)) {
            let mut q = UntaggedQueues::new(4);
            for qn in 0..4 {
                for _ in 0..2 {
                    q.post(QueueNumber::from(qn), 64).unwrap();
                }
            }
            for (qn, msn, mo, last, len) in segs {
                let before = q.clone();
                let kind = seg(qn, msn, mo);
                if q.accept(kind, last, len).is_err() {
                    for n in 0..4 {
                        let n = QueueNumber::from(n);
                        prop_assert_eq!(q.expected_msn(n), before.expected_msn(n));
                        prop_assert_eq!(q.next_mo(n), before.next_mo(n));
                        prop_assert_eq!(q.posted(n), before.posted(n));
                    }
                }
            }
        }
    }
}
