//! DDP segment headers (RFC 5041 section 4): the tagged (14-byte) and untagged (18-byte) forms.
//!
//! ```text
//! Tagged buffer model (T = 1):
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |T|L| Resrv | DV|   RsvdULP     |            STag               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    STag (cont.)               |          TO (64 bits)         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! |                                                               |
//! +                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! Untagged buffer model (T = 0):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |T|L| Resrv | DV|   RsvdULP     |   RsvdULP (32 bits, RDMAP's)  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    (cont.)                    |          QN                   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    QN (cont.)                 |          MSN                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    MSN (cont.)                |          MO                   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |    MO (cont.)                 |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! All fields are big-endian. The second octet (the first `RsvdULP`) belongs to RDMAP: its
//! control byte (RV and opcode); this crate carries it as a raw `u8`. The 32-bit `RsvdULP` of
//! the untagged header carries RDMAP's Invalidate STag for Send with Invalidate.
//!
//! [`Segment`] is a view over the bytes; [`SegmentRepr`] (a [`HeaderRepr`] plus the payload)
//! is the checked form with `parse` and `emit`.

use core::fmt;

use crate::terminate::{TerminateCode, ddp_type};

/// Length of a tagged header (control, STag, TO).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged header (control, RDMAP word, QN, MSN, MO).
pub const UNTAGGED_HEADER_LEN: usize = 18;
/// The only DDP version (the DV field): RFC 5041 section 4.1, "DV ... MUST be set to one".
pub const DDP_VERSION: u8 = 1;

/// Bits of the first control octet.
pub mod control {
    /// T: tagged buffer model.
    pub const TAGGED: u8 = 0x80;
    /// L: last segment of the message.
    pub const LAST: u8 = 0x40;
    /// The four reserved bits: "set to zero on transmit, not checked on receive" (RFC 5041
    /// section 4.1).
    pub const RESERVED: u8 = 0x3c;
    /// DV, the DDP version (low 2 bits).
    pub const VERSION: u8 = 0x03;
}

mod field {
    use core::ops::Range;
    pub(crate) const CONTROL: usize = 0;
    pub(crate) const RDMAP_CONTROL: usize = 1;
    // Tagged.
    pub(crate) const STAG: Range<usize> = 2..6;
    pub(crate) const TO: Range<usize> = 6..14;
    // Untagged.
    pub(crate) const RDMAP_WORD: Range<usize> = 2..6;
    pub(crate) const QN: Range<usize> = 6..10;
    pub(crate) const MSN: Range<usize> = 10..14;
    pub(crate) const MO: Range<usize> = 14..18;
}

/// A steering tag: a 24-bit table index and an 8-bit key (`index << 8 | key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct STag(pub u32);

impl STag {
    /// The largest index an STag can carry (24 bits).
    pub const MAX_INDEX: u32 = 0x00ff_ffff;

    /// The index: the upper 24 bits.
    pub fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The key: the low 8 bits, chosen by the owner of the memory.
    pub fn key(self) -> u8 {
        self.0.to_be_bytes()[3]
    }

    /// Builds an STag; `None` if `index` does not fit in 24 bits.
    pub fn from_parts(index: u32, key: u8) -> Option<STag> {
        if index > Self::MAX_INDEX { None } else { Some(STag((index << 8) | u32::from(key))) }
    }
}

impl fmt::Display for STag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A message sequence number (untagged model). Starts at 1 on each queue and wraps at 2^32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Msn(pub u32);

impl Msn {
    /// The first MSN of every queue (RFC 5041 section 5.1: "initialized to one").
    pub const INITIAL: Msn = Msn(1);

    /// `self + n`, wrapping at 2^32.
    pub fn wrapping_add(self, n: u32) -> Msn {
        Msn(self.0.wrapping_add(n))
    }

    /// The next MSN.
    pub fn next(self) -> Msn {
        self.wrapping_add(1)
    }

    /// How far `self` is ahead of `base`, modulo 2^32.
    pub fn distance_from(self, base: Msn) -> u32 {
        self.0.wrapping_sub(base.0)
    }

    /// Whether `self` lies in the `len` MSNs starting at `base` (`base`, `base + 1`, ...,
    /// `base + len - 1`, modulo 2^32). Always false for `len == 0`.
    pub fn is_in_window(self, base: Msn, len: u32) -> bool {
        self.distance_from(base) < len
    }
}

impl fmt::Display for Msn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A tagged offset: the 64-bit TO of the tagged model. Arithmetic is checked; a wrap is a
/// protocol error (TO wrap), never silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaggedOffset(pub u64);

impl TaggedOffset {
    /// `self + n`, or `None` on overflow.
    pub fn checked_add(self, n: u64) -> Option<TaggedOffset> {
        self.0.checked_add(n).map(TaggedOffset)
    }
}

impl fmt::Display for TaggedOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// An untagged queue number (RFC 5040 section 5.1, RFC 7306 for queue 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueNumber {
    /// 0: Send (and Immediate Data).
    Send,
    /// 1: RDMA Read Request (and Atomic Request).
    ReadRequest,
    /// 2: Terminate.
    Terminate,
    /// 3: Atomic Response (RFC 7306).
    AtomicResponse,
    /// Any other value (an invalid QN for RDMAP).
    Unknown(u32),
}

impl QueueNumber {
    /// The queue's index 0..=3, `None` for [`QueueNumber::Unknown`] (even if it holds a small
    /// value).
    pub fn index(self) -> Option<usize> {
        match self {
            QueueNumber::Send => Some(0),
            QueueNumber::ReadRequest => Some(1),
            QueueNumber::Terminate => Some(2),
            QueueNumber::AtomicResponse => Some(3),
            QueueNumber::Unknown(_) => None,
        }
    }
}

impl From<u32> for QueueNumber {
    fn from(v: u32) -> QueueNumber {
        match v {
            0 => QueueNumber::Send,
            1 => QueueNumber::ReadRequest,
            2 => QueueNumber::Terminate,
            3 => QueueNumber::AtomicResponse,
            other => QueueNumber::Unknown(other),
        }
    }
}

impl From<QueueNumber> for u32 {
    fn from(q: QueueNumber) -> u32 {
        match q {
            QueueNumber::Send => 0,
            QueueNumber::ReadRequest => 1,
            QueueNumber::Terminate => 2,
            QueueNumber::AtomicResponse => 3,
            QueueNumber::Unknown(v) => v,
        }
    }
}

impl fmt::Display for QueueNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueNumber::Send => f.write_str("QN 0 (Send)"),
            QueueNumber::ReadRequest => f.write_str("QN 1 (Read Request)"),
            QueueNumber::Terminate => f.write_str("QN 2 (Terminate)"),
            QueueNumber::AtomicResponse => f.write_str("QN 3 (Atomic Response)"),
            QueueNumber::Unknown(v) => write!(f, "QN {v}"),
        }
    }
}

/// Everything that can be wrong with the bytes of a DDP segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer bytes than the header needs.
    Truncated {
        /// Bytes needed: 2 until the T bit is known, then the header length.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The DV field is not [`DDP_VERSION`].
    BadDdpVersion {
        /// The version found.
        version: u8,
        /// Whether the T bit was set (selects the Terminate code).
        tagged: bool,
    },
    /// The output buffer is not the length the segment needs.
    BufferSize {
        /// Bytes the segment needs.
        needed: usize,
        /// Bytes offered.
        got: usize,
    },
}

impl HeaderError {
    /// The Terminate code this error calls for (RFC 5040 section 7), if it is a peer error
    /// with a code of its own.
    ///
    /// - Bad DDP version: layer 1 DDP, type 1 tagged buffer code 0x04, or type 2 untagged
    ///   buffer code 0x06.
    /// - Truncated: `None`. A ULPDU shorter than its DDP header has no code in the table; the
    ///   caller, which cut the ULPDU out of an FPDU, chooses (e.g. DDP local catastrophic).
    /// - Buffer size: `None` (local misuse of `emit`).
    pub fn terminate_code(&self) -> Option<TerminateCode> {
        match *self {
            HeaderError::BadDdpVersion { tagged: true, .. } => {
                Some(TerminateCode::ddp(ddp_type::TAGGED_BUFFER, 0x04))
            }
            HeaderError::BadDdpVersion { tagged: false, .. } => {
                Some(TerminateCode::ddp(ddp_type::UNTAGGED_BUFFER, 0x06))
            }
            HeaderError::Truncated { .. } | HeaderError::BufferSize { .. } => None,
        }
    }
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Truncated { needed, got } => {
                write!(f, "DDP segment truncated: {needed} bytes needed, {got} present")
            }
            HeaderError::BadDdpVersion { version, tagged } => {
                let model = if *tagged { "tagged" } else { "untagged" };
                write!(f, "invalid DDP version {version} in a {model} segment (expected {DDP_VERSION})")
            }
            HeaderError::BufferSize { needed, got } => {
                write!(f, "DDP segment needs a {needed}-byte buffer, got {got}")
            }
        }
    }
}

impl std::error::Error for HeaderError {}

/// A read-only or read-write view over the bytes of one DDP segment (a whole ULPDU).
///
/// After [`Segment::new_checked`] succeeded no getter panics. Setters panic if the buffer is
/// shorter than the field they write (use [`SegmentRepr::emit`] for checked construction).
#[derive(Debug, Clone)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
}

fn be_u32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    u32::from_be_bytes(w)
}

fn be_u64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_be_bytes(w)
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Segment<T> {
        Segment { buffer }
    }

    /// Wraps a buffer after [`Segment::check_len`].
    pub fn new_checked(buffer: T) -> Result<Segment<T>, HeaderError> {
        let s = Segment::new_unchecked(buffer);
        s.check_len()?;
        Ok(s)
    }

    /// Checks the buffer holds the whole header its T bit calls for.
    pub fn check_len(&self) -> Result<(), HeaderError> {
        let got = self.buffer.as_ref().len();
        let needed = match self.buffer.as_ref().first() {
            None => 2,
            Some(&c) if c & control::TAGGED != 0 => TAGGED_HEADER_LEN,
            Some(_) => UNTAGGED_HEADER_LEN,
        };
        if got < needed { Err(HeaderError::Truncated { needed, got }) } else { Ok(()) }
    }

    /// The raw first control octet (T, L, reserved, DV).
    pub fn ddp_control(&self) -> u8 {
        self.buffer.as_ref()[field::CONTROL]
    }

    /// T: the tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.ddp_control() & control::TAGGED != 0
    }

    /// L: the last segment of its message.
    pub fn last(&self) -> bool {
        self.ddp_control() & control::LAST != 0
    }

    /// The reserved control bits (as received; not checked).
    pub fn reserved(&self) -> u8 {
        self.ddp_control() & control::RESERVED
    }

    /// DV, the DDP version.
    pub fn ddp_version(&self) -> u8 {
        self.ddp_control() & control::VERSION
    }

    /// The second octet, RDMAP's control byte (RV and opcode), raw.
    pub fn rdmap_control(&self) -> u8 {
        self.buffer.as_ref()[field::RDMAP_CONTROL]
    }

    /// The header length the T bit calls for.
    pub fn header_len(&self) -> usize {
        if self.tagged() { TAGGED_HEADER_LEN } else { UNTAGGED_HEADER_LEN }
    }

    /// The STag (tagged segments only).
    pub fn stag(&self) -> Option<STag> {
        self.tagged().then(|| STag(be_u32(&self.buffer.as_ref()[field::STAG])))
    }

    /// The tagged offset (tagged segments only).
    pub fn to(&self) -> Option<TaggedOffset> {
        self.tagged().then(|| TaggedOffset(be_u64(&self.buffer.as_ref()[field::TO])))
    }

    /// RDMAP's 32-bit word (untagged segments only): the Invalidate STag of a Send with
    /// Invalidate, zero otherwise.
    pub fn rdmap_word(&self) -> Option<u32> {
        (!self.tagged()).then(|| be_u32(&self.buffer.as_ref()[field::RDMAP_WORD]))
    }

    /// The queue number (untagged segments only).
    pub fn qn(&self) -> Option<QueueNumber> {
        (!self.tagged()).then(|| QueueNumber::from(be_u32(&self.buffer.as_ref()[field::QN])))
    }

    /// The message sequence number (untagged segments only).
    pub fn msn(&self) -> Option<Msn> {
        (!self.tagged()).then(|| Msn(be_u32(&self.buffer.as_ref()[field::MSN])))
    }

    /// The message offset (untagged segments only).
    pub fn mo(&self) -> Option<u32> {
        (!self.tagged()).then(|| be_u32(&self.buffer.as_ref()[field::MO]))
    }

    /// The payload: everything after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Consumes the view, giving back the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Segment<T> {
    /// Writes the first control octet: T, L and DV = [`DDP_VERSION`], reserved bits zero.
    pub fn set_ddp_control(&mut self, tagged: bool, last: bool) {
        let mut c = DDP_VERSION;
        if tagged {
            c |= control::TAGGED;
        }
        if last {
            c |= control::LAST;
        }
        self.buffer.as_mut()[field::CONTROL] = c;
    }

    /// Writes RDMAP's control octet.
    pub fn set_rdmap_control(&mut self, v: u8) {
        self.buffer.as_mut()[field::RDMAP_CONTROL] = v;
    }

    /// Writes the STag (tagged layout).
    pub fn set_stag(&mut self, v: STag) {
        self.buffer.as_mut()[field::STAG].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Writes the tagged offset (tagged layout).
    pub fn set_to(&mut self, v: TaggedOffset) {
        self.buffer.as_mut()[field::TO].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Writes RDMAP's 32-bit word (untagged layout).
    pub fn set_rdmap_word(&mut self, v: u32) {
        self.buffer.as_mut()[field::RDMAP_WORD].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes the queue number (untagged layout).
    pub fn set_qn(&mut self, v: QueueNumber) {
        self.buffer.as_mut()[field::QN].copy_from_slice(&u32::from(v).to_be_bytes());
    }

    /// Writes the message sequence number (untagged layout).
    pub fn set_msn(&mut self, v: Msn) {
        self.buffer.as_mut()[field::MSN].copy_from_slice(&v.0.to_be_bytes());
    }

    /// Writes the message offset (untagged layout).
    pub fn set_mo(&mut self, v: u32) {
        self.buffer.as_mut()[field::MO].copy_from_slice(&v.to_be_bytes());
    }

    /// The payload, writable (everything after the header the T bit calls for).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

/// The model-specific header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// Tagged buffer model: placement at `to` in the buffer named by `stag`.
    Tagged {
        /// The data sink's STag.
        stag: STag,
        /// The tagged offset of the first payload byte.
        to: TaggedOffset,
    },
    /// Untagged buffer model: placement at offset `mo` of the message `msn` on queue `qn`.
    Untagged {
        /// RDMAP's 32-bit word (the Invalidate STag of a Send with Invalidate, else 0).
        rdmap_word: u32,
        /// The queue number.
        qn: QueueNumber,
        /// The message sequence number.
        msn: Msn,
        /// The message offset of the first payload byte.
        mo: u32,
    },
}

/// A checked DDP header, without the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderRepr {
    /// L: the last segment of its message.
    pub last: bool,
    /// RDMAP's control octet (RV and opcode), raw.
    pub rdmap_control: u8,
    /// The model and its fields.
    pub kind: SegmentKind,
}

impl HeaderRepr {
    /// The header's length on the wire.
    pub fn header_len(&self) -> usize {
        match self.kind {
            SegmentKind::Tagged { .. } => TAGGED_HEADER_LEN,
            SegmentKind::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Whether this is a tagged header.
    pub fn is_tagged(&self) -> bool {
        matches!(self.kind, SegmentKind::Tagged { .. })
    }

    /// Parses the header at the start of `buf`; returns it and the header length.
    ///
    /// Checks, in order: the two control octets are there, DV is [`DDP_VERSION`], the whole
    /// header is there. Reserved bits are ignored (RFC 5041 section 4.1).
    pub fn parse(buf: &[u8]) -> Result<(HeaderRepr, usize), HeaderError> {
        if buf.len() < 2 {
            return Err(HeaderError::Truncated { needed: 2, got: buf.len() });
        }
        let view = Segment::new_unchecked(buf);
        let version = view.ddp_version();
        if version != DDP_VERSION {
            return Err(HeaderError::BadDdpVersion { version, tagged: view.tagged() });
        }
        view.check_len()?;
        let kind = if view.tagged() {
            SegmentKind::Tagged {
                stag: STag(be_u32(&buf[field::STAG])),
                to: TaggedOffset(be_u64(&buf[field::TO])),
            }
        } else {
            SegmentKind::Untagged {
                rdmap_word: be_u32(&buf[field::RDMAP_WORD]),
                qn: QueueNumber::from(be_u32(&buf[field::QN])),
                msn: Msn(be_u32(&buf[field::MSN])),
                mo: be_u32(&buf[field::MO]),
            }
        };
        let repr = HeaderRepr { last: view.last(), rdmap_control: view.rdmap_control(), kind };
        Ok((repr, view.header_len()))
    }

    /// Writes the header into `buf`, which must be exactly [`HeaderRepr::header_len`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), HeaderError> {
        let needed = self.header_len();
        if buf.len() != needed {
            return Err(HeaderError::BufferSize { needed, got: buf.len() });
        }
        self.emit_unchecked(buf);
        Ok(())
    }

    /// Writes the header at the start of `buf`, which holds at least `header_len()` bytes.
    fn emit_unchecked(&self, buf: &mut [u8]) {
        let mut view = Segment::new_unchecked(buf);
        view.set_ddp_control(self.is_tagged(), self.last);
        view.set_rdmap_control(self.rdmap_control);
        match self.kind {
            SegmentKind::Tagged { stag, to } => {
                view.set_stag(stag);
                view.set_to(to);
            }
            SegmentKind::Untagged { rdmap_word, qn, msn, mo } => {
                view.set_rdmap_word(rdmap_word);
                view.set_qn(qn);
                view.set_msn(msn);
                view.set_mo(mo);
            }
        }
    }

    /// Joins the header with its payload.
    pub fn with_payload(self, payload: &[u8]) -> SegmentRepr<'_> {
        SegmentRepr { header: self, payload }
    }
}

impl fmt::Display for HeaderRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            SegmentKind::Tagged { stag, to } => write!(f, "DDP tagged STag {stag} TO {to}")?,
            SegmentKind::Untagged { rdmap_word, qn, msn, mo } => {
                write!(f, "DDP untagged {qn} MSN {msn} MO {mo}")?;
                if rdmap_word != 0 {
                    write!(f, " word {rdmap_word:#010x}")?;
                }
            }
        }
        if self.last {
            f.write_str(" L")?;
        }
        write!(f, " rdmap {:#04x}", self.rdmap_control)
    }
}

/// A checked DDP segment: header and payload (borrowed, not copied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentRepr<'a> {
    /// The header.
    pub header: HeaderRepr,
    /// The payload (the ULP's bytes to place).
    pub payload: &'a [u8],
}

impl<'a> SegmentRepr<'a> {
    /// Parses a whole ULPDU: the header, and everything after it as the payload.
    pub fn parse(buf: &'a [u8]) -> Result<SegmentRepr<'a>, HeaderError> {
        let (header, len) = HeaderRepr::parse(buf)?;
        let payload = buf.get(len..).unwrap_or_default();
        Ok(SegmentRepr { header, payload })
    }

    /// The header's length on the wire.
    pub fn header_len(&self) -> usize {
        self.header.header_len()
    }

    /// The segment's length on the wire (the MPA ULPDU_Length).
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// Writes the segment into `buf`, which must be exactly [`SegmentRepr::buffer_len`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), HeaderError> {
        let needed = self.buffer_len();
        if buf.len() != needed {
            return Err(HeaderError::BufferSize { needed, got: buf.len() });
        }
        let (head, rest) = buf.split_at_mut(self.header_len());
        self.header.emit_unchecked(head);
        rest.copy_from_slice(self.payload);
        Ok(())
    }

    /// Emits the segment into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        let (head, rest) = v.split_at_mut(self.header_len());
        self.header.emit_unchecked(head);
        rest.copy_from_slice(self.payload);
        v
    }
}

impl fmt::Display for SegmentRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} payload {} bytes", self.header, self.payload.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The first ULPDU of an 8 KiB RDMA Write (tests/data/siw/siw-write-bw.pcap, perftest
    /// ib_write_bw): header `81 40`, STag 0xb7021900, TO 0x560981e24000, then the first 16
    /// bytes of its 1428-byte payload (the ULPDU is 1442 bytes on the wire).
    static WRITE_FIRST: [u8; 30] = [
        0x81, 0x40, 0xb7, 0x02, 0x19, 0x00, 0x00, 0x00, 0x56, 0x09, 0x81, 0xe2, 0x40, 0x00, 0x38, 0xf9, 0xfe,
        0xf9, 0xf1, 0x73, 0xfa, 0x52, 0xfa, 0x9c, 0x8c, 0x08, 0xb3, 0x92, 0x70, 0x48,
    ];

    /// The last (sixth, 1066-byte) ULPDU of the same Write: L set, TO = 0x560981e24000 +
    /// 5 * 1428. Header only.
    static WRITE_LAST_HEADER: [u8; 14] =
        [0xc1, 0x40, 0xb7, 0x02, 0x19, 0x00, 0x00, 0x00, 0x56, 0x09, 0x81, 0xe2, 0x5b, 0xe4];

    /// A complete 18-byte ULPDU from tests/data/siw/siw-send-bw.pcap (a 4-byte credit Write).
    static WRITE_SMALL: [u8; 18] = [
        0xc1, 0x40, 0x66, 0x04, 0x2c, 0x00, 0x00, 0x00, 0x55, 0xcb, 0x8f, 0xc5, 0x7d, 0x74, 0x02, 0x00, 0x00,
        0x00,
    ];

    /// The first ULPDU of an 8 KiB Send (tests/data/siw/siw-send-bw.pcap): `01 43` (untagged,
    /// RDMAP Send), word 0, QN 0, MSN 1, MO 0, then the first 12 payload bytes.
    static SEND_FIRST: [u8; 30] = [
        0x01, 0x43, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x00, 0xe3, 0x8f, 0x2a, 0x5f, 0x3f, 0xeb, 0x82, 0xff, 0xf9, 0xe2, 0x99, 0x60,
    ];

    /// The last (1090-byte) ULPDU of that Send: L, MSN 1, MO 0x1bd0 = 5 * 1424. Header only.
    static SEND_LAST_HEADER: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0x1b, 0xd0];

    #[test]
    fn deconstruct_tagged() {
        let s = Segment::new_checked(&WRITE_FIRST[..]).unwrap();
        assert!(s.tagged());
        assert!(!s.last());
        assert_eq!(s.ddp_version(), 1);
        assert_eq!(s.reserved(), 0);
        assert_eq!(s.rdmap_control(), 0x40);
        assert_eq!(s.header_len(), 14);
        assert_eq!(s.stag(), Some(STag(0xb702_1900)));
        assert_eq!(s.to(), Some(TaggedOffset(0x5609_81e2_4000)));
        assert_eq!((s.qn(), s.msn(), s.mo(), s.rdmap_word()), (None, None, None, None));
        assert_eq!(s.payload(), &WRITE_FIRST[14..]);
    }

    #[test]
    fn deconstruct_untagged() {
        let s = Segment::new_checked(&SEND_FIRST[..]).unwrap();
        assert!(!s.tagged());
        assert!(!s.last());
        assert_eq!(s.rdmap_control(), 0x43);
        assert_eq!(s.header_len(), 18);
        assert_eq!(s.rdmap_word(), Some(0));
        assert_eq!(s.qn(), Some(QueueNumber::Send));
        assert_eq!(s.msn(), Some(Msn(1)));
        assert_eq!(s.mo(), Some(0));
        assert_eq!((s.stag(), s.to()), (None, None));
        assert_eq!(s.payload().len(), 12);
        let last = Segment::new_checked(&SEND_LAST_HEADER[..]).unwrap();
        assert!(last.last());
        assert_eq!(last.mo(), Some(5 * 1424));
        assert!(last.payload().is_empty());
    }

    #[test]
    fn parse_fixtures() {
        let r = SegmentRepr::parse(&WRITE_FIRST).unwrap();
        assert_eq!(
            r.header,
            HeaderRepr {
                last: false,
                rdmap_control: 0x40,
                kind: SegmentKind::Tagged { stag: STag(0xb702_1900), to: TaggedOffset(0x5609_81e2_4000) },
            }
        );
        assert_eq!(r.payload, &WRITE_FIRST[14..]);
        assert_eq!(r.buffer_len(), 30);

        let (last, n) = HeaderRepr::parse(&WRITE_LAST_HEADER).unwrap();
        assert_eq!(n, 14);
        assert!(last.last);
        assert_eq!(
            last.kind,
            SegmentKind::Tagged { stag: STag(0xb702_1900), to: TaggedOffset(0x5609_81e2_4000 + 5 * 1428) }
        );

        let small = SegmentRepr::parse(&WRITE_SMALL).unwrap();
        assert_eq!(small.payload, &[2, 0, 0, 0]);
        assert!(small.header.last);

        let send = SegmentRepr::parse(&SEND_FIRST).unwrap();
        assert_eq!(
            send.header.kind,
            SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::Send, msn: Msn(1), mo: 0 }
        );
        let (send_last, n) = HeaderRepr::parse(&SEND_LAST_HEADER).unwrap();
        assert_eq!(n, 18);
        assert!(send_last.last);
        assert_eq!(send_last.to_string(), "DDP untagged QN 0 (Send) MSN 1 MO 7120 L rdmap 0x43");
    }

    #[test]
    fn emit_fixtures() {
        for fixture in [&WRITE_FIRST[..], &WRITE_LAST_HEADER, &WRITE_SMALL, &SEND_FIRST, &SEND_LAST_HEADER] {
            let r = SegmentRepr::parse(fixture).unwrap();
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out).unwrap();
            assert_eq!(out, fixture);
            assert_eq!(r.to_vec(), fixture);
            let mut head = vec![0u8; r.header_len()];
            r.header.emit(&mut head).unwrap();
            assert_eq!(head, &fixture[..r.header_len()]);
        }
    }

    #[test]
    fn construct_with_setters() {
        let mut buf = [0xffu8; 18];
        let mut s = Segment::new_unchecked(&mut buf[..]);
        s.set_ddp_control(false, true);
        s.set_rdmap_control(0x43);
        s.set_rdmap_word(0);
        s.set_qn(QueueNumber::Send);
        s.set_msn(Msn(1));
        s.set_mo(0x1bd0);
        assert!(s.payload_mut().is_empty());
        assert_eq!(buf, SEND_LAST_HEADER);

        let mut buf = [0u8; 14];
        let mut s = Segment::new_unchecked(&mut buf[..]);
        s.set_ddp_control(true, true);
        s.set_rdmap_control(0x40);
        s.set_stag(STag(0xb702_1900));
        s.set_to(TaggedOffset(0x5609_81e2_5be4));
        assert_eq!(s.into_inner(), &WRITE_LAST_HEADER);
    }

    #[test]
    fn reserved_bits_ignored_on_receive_zero_on_transmit() {
        let mut b = WRITE_SMALL;
        b[0] |= control::RESERVED;
        let r = SegmentRepr::parse(&b).unwrap();
        assert_eq!(Segment::new_unchecked(&b[..]).reserved(), 0x3c);
        assert_eq!(r.to_vec(), WRITE_SMALL);
    }

    #[test]
    fn truncated() {
        assert_eq!(SegmentRepr::parse(&[]), Err(HeaderError::Truncated { needed: 2, got: 0 }));
        assert_eq!(SegmentRepr::parse(&[0x81]), Err(HeaderError::Truncated { needed: 2, got: 1 }));
        for n in 2..14 {
            assert_eq!(
                SegmentRepr::parse(&WRITE_FIRST[..n]),
                Err(HeaderError::Truncated { needed: 14, got: n })
            );
            assert!(Segment::new_checked(&WRITE_FIRST[..n]).is_err());
        }
        for n in 2..18 {
            assert_eq!(
                SegmentRepr::parse(&SEND_FIRST[..n]),
                Err(HeaderError::Truncated { needed: 18, got: n })
            );
        }
        assert_eq!(Segment::new_checked(&[][..]).unwrap_err(), HeaderError::Truncated { needed: 2, got: 0 });
        // Exactly a header: empty payload.
        assert!(SegmentRepr::parse(&WRITE_FIRST[..14]).unwrap().payload.is_empty());
        assert_eq!(HeaderError::Truncated { needed: 2, got: 0 }.terminate_code(), None);
    }

    #[test]
    fn bad_version_and_terminate_codes() {
        for version in [0u8, 2, 3] {
            let mut t = WRITE_SMALL;
            t[0] = (t[0] & !control::VERSION) | version;
            let e = SegmentRepr::parse(&t).unwrap_err();
            assert_eq!(e, HeaderError::BadDdpVersion { version, tagged: true });
            // docs/protocol-notes.md#terminate-codes: layer 1 DDP, type 1 tagged buffer, 0x04
            // invalid DDP version.
            assert_eq!(e.terminate_code(), Some(TerminateCode::ddp(1, 0x04)));

            let mut u = SEND_FIRST;
            u[0] = (u[0] & !control::VERSION) | version;
            let e = SegmentRepr::parse(&u).unwrap_err();
            assert_eq!(e, HeaderError::BadDdpVersion { version, tagged: false });
            // docs/protocol-notes.md#terminate-codes: layer 1 DDP, type 2 untagged buffer, 0x06
            // invalid DDP version.
            assert_eq!(e.terminate_code(), Some(TerminateCode::ddp(2, 0x06)));
        }
        // The version is checked before the length: a 2-byte bad-version segment says so.
        assert!(matches!(SegmentRepr::parse(&[0x82, 0x40]), Err(HeaderError::BadDdpVersion { .. })));
        assert!(HeaderError::BadDdpVersion { version: 2, tagged: true }.to_string().contains("version 2"));
    }

    #[test]
    fn emit_wrong_buffer() {
        let r = SegmentRepr::parse(&WRITE_SMALL).unwrap();
        let mut small = [0u8; 17];
        assert_eq!(r.emit(&mut small), Err(HeaderError::BufferSize { needed: 18, got: 17 }));
        let mut big = [0u8; 15];
        assert_eq!(r.header.emit(&mut big), Err(HeaderError::BufferSize { needed: 14, got: 15 }));
        assert_eq!(HeaderError::BufferSize { needed: 1, got: 0 }.terminate_code(), None);
    }

    #[test]
    fn stag_parts() {
        let s = STag(0xb702_1900);
        assert_eq!(s.index(), 0xb70219);
        assert_eq!(s.key(), 0x00);
        assert_eq!(STag::from_parts(0xb70219, 0), Some(s));
        assert_eq!(STag::from_parts(0x0100_0000, 0), None);
        assert_eq!(STag::from_parts(STag::MAX_INDEX, 0xab), Some(STag(0xffff_ffab)));
        assert_eq!(s.to_string(), "0xb7021900");
    }

    #[test]
    fn msn_wraps() {
        assert_eq!(Msn(u32::MAX).next(), Msn(0));
        assert_eq!(Msn(u32::MAX).wrapping_add(3), Msn(2));
        assert_eq!(Msn(2).distance_from(Msn(u32::MAX)), 3);
        assert!(Msn(1).is_in_window(Msn(u32::MAX - 1), 4));
        assert!(!Msn(2).is_in_window(Msn(u32::MAX - 1), 4));
        assert!(!Msn(5).is_in_window(Msn(5), 0));
        assert!(!Msn(4).is_in_window(Msn(5), 10));
    }

    #[test]
    fn queue_numbers_and_offsets() {
        for v in 0..6u32 {
            let q = QueueNumber::from(v);
            assert_eq!(u32::from(q), v);
            assert_eq!(q.index(), if v < 4 { Some(v as usize) } else { None });
        }
        assert_eq!(QueueNumber::from(2), QueueNumber::Terminate);
        assert_eq!(QueueNumber::Unknown(0).index(), None);
        assert_eq!(TaggedOffset(u64::MAX - 1).checked_add(1), Some(TaggedOffset(u64::MAX)));
        assert_eq!(TaggedOffset(u64::MAX).checked_add(1), None);
    }

    fn arb_header() -> impl Strategy<Value = HeaderRepr> {
        let tagged = (any::<u32>(), any::<u64>())
            .prop_map(|(s, t)| SegmentKind::Tagged { stag: STag(s), to: TaggedOffset(t) });
        let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(w, q, m, o)| {
            SegmentKind::Untagged { rdmap_word: w, qn: QueueNumber::from(q), msn: Msn(m), mo: o }
        });
        (any::<bool>(), any::<u8>(), prop_oneof![tagged, untagged])
            .prop_map(|(last, rdmap_control, kind)| HeaderRepr { last, rdmap_control, kind })
    }

    proptest! {
        #[test]
        fn emit_parse_round_trip(h in arb_header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let repr = h.with_payload(&payload);
            let bytes = repr.to_vec();
            prop_assert_eq!(bytes.len(), repr.buffer_len());
            let back = SegmentRepr::parse(&bytes).unwrap();
            prop_assert_eq!(back, repr);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(r) = SegmentRepr::parse(&bytes) {
                // Re-emitting gives the input back except for the reserved bits.
                let mut expect = bytes.clone();
                expect[0] &= !control::RESERVED;
                prop_assert_eq!(r.to_vec(), expect);
            }
            if let Ok(s) = Segment::new_checked(&bytes[..]) {
                let _ = (s.stag(), s.to(), s.qn(), s.msn(), s.mo(), s.rdmap_word(), s.payload());
            }
        }
    }
}
