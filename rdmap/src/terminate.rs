//! The Terminate message body (RFC 5040 section 4.8), how to fill it for an error (section 7),
//! and the RDMAP-level peer violations with their Terminate codes.
//!
//! # Layout
//!
//! After the untagged DDP header (QN 2, MSN, MO 0, L = 1):
//!
//! ```text
//! | layer:4 | type:4 | code:8 | M | D | R | reserved:13 |   control word, RFC layout
//! | DDP Segment Length:16 |                                if M or D (see below)
//! | terminated DDP header: 14 (T = 1) or 18 (T = 0) bytes |  if D
//! | terminated RDMAP header: 28 bytes (Read Request) |       if R
//! ```
//!
//! What was established, and from where (the RFC 5040 text itself could not be read from this
//! workspace; the search tool's RFC copies only return their first page):
//!
//! - **No padding** between the fields. Verified in Linux siw (`siw_send_terminate`,
//!   drivers/infiniband/sw/siw/siw_qp.c, torvalds/linux): the copied header is sent right after
//!   the 24-byte `struct iwarp_terminate` (MPA length, 18-byte DDP header, control word), and
//!   starts with the offending FPDU's own 2-byte MPA length field rewritten as the segment
//!   length; no pad follows it. Wireshark (`dissect_iwarp_rdmap`) reads the same way.
//! - **When the 16-bit length is present.** Wireshark reads it whenever D is set (M or not);
//!   siw writes it as part of every copied DDP header and sets M only together with D. RFC
//!   5040's figure labels it "DDP Segment Length (if any)". So: present iff D is set; if a
//!   peer sets M without D we also read it (an M-valid length must be on the wire). Unverified
//!   against the RFC text: whether M without D is legal at all. M says whether the value is
//!   valid: [`TerminateMessage::ddp_segment_len`] is `Some` iff M.
//! - **Which DDP header length**: taken from the copied header's own T bit (byte 0, 0x80).
//!   Wireshark guesses it from the error type instead; siw copies whatever it received, so the
//!   T bit is the reliable source.
//! - **siw's segment length value** (from the code, not seen on the wire): siw subtracts its
//!   per-opcode header length from the MPA length, so its "DDP Segment Length" is the
//!   offending segment's payload length, not the whole segment. We send the whole DDP
//!   segment's length (header plus payload, RFC 5041's "DDP Segment").
//! - **siw's R bit**: siw sets M, D and R on every RDMAP remote protection Terminate, even
//!   when the offending message was a Send and only its DDP header is attached;
//!   [`TerminateMessage::parse_siw`] therefore accepts R without the 28 bytes.

use core::fmt;

use iwarp_ddp::header::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN, control};
use iwarp_ddp::terminate::{ddp_type, rdmap_type};
use iwarp_ddp::{AccessError, HeaderError, HeaderRepr, STag, TerminateCode, TerminateLayer, UntaggedError};

use crate::wire::{Opcode, READ_REQUEST_LEN, TERMINATE_CONTROL_LEN, TerminateHeader, Truncated};

/// Length of the DDP Segment Length field.
pub const SEGMENT_LEN_FIELD_LEN: usize = 2;

/// A copy of the DDP header of the segment that caused a Terminate (the D field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminatedDdpHeader {
    /// A tagged header (T = 1): control, STag, TO.
    Tagged([u8; TAGGED_HEADER_LEN]),
    /// An untagged header (T = 0): control, RDMAP word, QN, MSN, MO.
    Untagged([u8; UNTAGGED_HEADER_LEN]),
}

impl TerminatedDdpHeader {
    /// Copies the header at the start of `segment`, its length chosen by the T bit of byte 0;
    /// `None` if `segment` is empty or shorter than that header. Nothing else is checked
    /// (the header being reported may well be malformed).
    pub fn from_segment(segment: &[u8]) -> Option<TerminatedDdpHeader> {
        let first = segment.first()?;
        if first & control::TAGGED != 0 {
            segment.first_chunk::<TAGGED_HEADER_LEN>().map(|h| TerminatedDdpHeader::Tagged(*h))
        } else {
            segment.first_chunk::<UNTAGGED_HEADER_LEN>().map(|h| TerminatedDdpHeader::Untagged(*h))
        }
    }

    /// The copied bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            TerminatedDdpHeader::Tagged(h) => h,
            TerminatedDdpHeader::Untagged(h) => h,
        }
    }

    /// 14 or 18.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Always false (a header copy is 14 or 18 bytes); here for the `len` convention.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The copied header, parsed (it may fail: e.g. a bad DDP version).
    pub fn header(&self) -> Result<HeaderRepr, HeaderError> {
        HeaderRepr::parse(self.as_bytes()).map(|(h, _)| h)
    }
}

/// A Terminate message body: the control word and the optional copies.
///
/// `header`'s M/D/R are as read; [`TerminateMessage::emit`] writes them from the fields below
/// (M iff `ddp_segment_len`, D iff `ddp_header`, R iff `rdmap_header`), so a message built by
/// hand cannot send a flag without its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateMessage {
    /// The control word: the error and the M/D/R flags.
    pub header: TerminateHeader,
    /// M: the length of the terminated DDP segment.
    pub ddp_segment_len: Option<u16>,
    /// D: the terminated DDP header.
    pub ddp_header: Option<TerminatedDdpHeader>,
    /// R: the terminated RDMAP header (a Read Request body).
    pub rdmap_header: Option<[u8; READ_REQUEST_LEN]>,
}

fn take(b: &[u8], at: usize, n: usize) -> Result<&[u8], Truncated> {
    b.get(at..at + n).ok_or(Truncated { needed: at + n, got: b.len() })
}

impl TerminateMessage {
    /// A message without header copies.
    pub fn new(cause: TerminateCode) -> TerminateMessage {
        TerminateMessage {
            header: TerminateHeader { cause, m: false, d: false, r: false },
            ddp_segment_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// Parses a Terminate body whose control word has the RFC 5040 layout (bytes after the
    /// message are ignored).
    pub fn parse(b: &[u8]) -> Result<TerminateMessage, Truncated> {
        Self::parse_with(b, TerminateHeader::parse(b)?, false)
    }

    /// Parses a Terminate body whose control word has Linux siw's bit-field layout
    /// ([`TerminateHeader::parse_siw`]); the rest is laid out as the RFC says. An R flag
    /// without the 28 bytes is accepted (siw sets R on every remote protection error).
    pub fn parse_siw(b: &[u8]) -> Result<TerminateMessage, Truncated> {
        Self::parse_with(b, TerminateHeader::parse_siw(b)?, true)
    }

    fn parse_with(b: &[u8], header: TerminateHeader, lenient_r: bool) -> Result<TerminateMessage, Truncated> {
        let mut at = TERMINATE_CONTROL_LEN;
        let mut ddp_segment_len = None;
        if header.m || header.d {
            let f = take(b, at, SEGMENT_LEN_FIELD_LEN)?;
            if header.m {
                ddp_segment_len = Some(u16::from_be_bytes([f[0], f[1]]));
            }
            at += SEGMENT_LEN_FIELD_LEN;
        }
        let mut ddp_header = None;
        if header.d {
            let rest = b.get(at..).unwrap_or(&[]);
            let copy = TerminatedDdpHeader::from_segment(rest)
                .ok_or(Truncated { needed: at + Self::ddp_len_hint(rest), got: b.len() })?;
            at += copy.len();
            ddp_header = Some(copy);
        }
        let mut rdmap_header = None;
        if header.r {
            match b.get(at..).and_then(|r| r.first_chunk::<READ_REQUEST_LEN>()) {
                Some(r) => rdmap_header = Some(*r),
                None if lenient_r => {}
                None => return Err(Truncated { needed: at + READ_REQUEST_LEN, got: b.len() }),
            }
        }
        Ok(TerminateMessage { header, ddp_segment_len, ddp_header, rdmap_header })
    }

    fn ddp_len_hint(rest: &[u8]) -> usize {
        match rest.first() {
            Some(c) if c & control::TAGGED != 0 => TAGGED_HEADER_LEN,
            _ => UNTAGGED_HEADER_LEN,
        }
    }

    /// The control word this message is sent with (RFC layout; M/D/R from the fields).
    pub fn control(&self) -> TerminateHeader {
        TerminateHeader {
            cause: self.header.cause,
            m: self.ddp_segment_len.is_some(),
            d: self.ddp_header.is_some(),
            r: self.rdmap_header.is_some(),
        }
    }

    /// The body's length on the wire.
    pub fn buffer_len(&self) -> usize {
        let c = self.control();
        let mut n = TERMINATE_CONTROL_LEN;
        if c.m || c.d {
            n += SEGMENT_LEN_FIELD_LEN;
        }
        n += self.ddp_header.map_or(0, |h| h.len());
        n += self.rdmap_header.map_or(0, |r| r.len());
        n
    }

    /// Writes the body (RFC layout) at the start of `buf`; returns the bytes written. With D
    /// but no M the length field is sent as zero.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Truncated> {
        let n = self.buffer_len();
        let got = buf.len();
        let out = buf.get_mut(..n).ok_or(Truncated { needed: n, got })?;
        let c = self.control();
        out[..TERMINATE_CONTROL_LEN].copy_from_slice(&c.to_bytes());
        let mut at = TERMINATE_CONTROL_LEN;
        if c.m || c.d {
            let len = self.ddp_segment_len.unwrap_or(0);
            out[at..at + SEGMENT_LEN_FIELD_LEN].copy_from_slice(&len.to_be_bytes());
            at += SEGMENT_LEN_FIELD_LEN;
        }
        if let Some(h) = &self.ddp_header {
            out[at..at + h.len()].copy_from_slice(h.as_bytes());
            at += h.len();
        }
        if let Some(r) = &self.rdmap_header {
            out[at..at + r.len()].copy_from_slice(r);
        }
        Ok(n)
    }

    /// The body as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        // The vector is exactly `buffer_len()` long, so `emit` cannot fail.
        let _ = self.emit(&mut v);
        v
    }

    /// The Terminate for `code`, with the header copies RFC 5040 section 7 calls for, taken
    /// from `offending_segment` (the whole DDP segment that caused the error, header first)
    /// when the caller has it. The rules implemented:
    ///
    /// - RDMAP local catastrophic (type 0): no copies; the error is not tied to a message.
    /// - RDMAP invalid version (2/0x05) and unexpected opcode (2/0x06): no copies, as siw
    ///   does ("packet layout is unknown").
    /// - Other RDMAP errors (remote protection, remote operation): M and D; R as well when the
    ///   offending segment is an untagged Read Request carrying its 28-byte body.
    /// - DDP errors: M and D, except invalid DDP version (1/0x04, 2/0x06) where the header
    ///   cannot be trusted: no copies (siw does the same).
    /// - LLP errors: copies only if the FPDU was delineated and its segment is given (M, D).
    ///
    /// M carries the whole segment's length; if it does not fit 16 bits M stays clear (D is
    /// still sent). Nothing is copied from a segment shorter than the header its T bit
    /// announces. The RFC 5040 section 7 text could not be read here: these rules follow the
    /// header-control-bit descriptions of section 4.8 as quoted by Wireshark and siw's
    /// `siw_send_terminate`, and are otherwise unverified.
    pub fn for_error(code: TerminateCode, offending_segment: Option<&[u8]>) -> TerminateMessage {
        let mut msg = TerminateMessage::new(code);
        let copy_ddp = match (code.layer, code.error_type, code.code) {
            (TerminateLayer::Rdmap, rdmap_type::LOCAL_CATASTROPHIC, _) => false,
            (TerminateLayer::Rdmap, rdmap_type::REMOTE_OPERATION, 0x05 | 0x06) => false,
            (TerminateLayer::Rdmap, _, _) => true,
            (TerminateLayer::Ddp, ddp_type::TAGGED_BUFFER, 0x04) => false,
            (TerminateLayer::Ddp, ddp_type::UNTAGGED_BUFFER, 0x06) => false,
            (TerminateLayer::Ddp, _, _) | (TerminateLayer::Llp, _, _) => true,
            (TerminateLayer::Unknown(_), _, _) => false,
        };
        let Some(seg) = offending_segment.filter(|_| copy_ddp) else { return msg.with_flags() };
        let Some(ddp) = TerminatedDdpHeader::from_segment(seg) else { return msg.with_flags() };
        msg.ddp_header = Some(ddp);
        msg.ddp_segment_len = u16::try_from(seg.len()).ok();
        if code.layer == TerminateLayer::Rdmap
            && let TerminatedDdpHeader::Untagged(h) = ddp
        {
            let is_read_request = Opcode::from_bits(h[1]) == Opcode::ReadRequest;
            if is_read_request {
                msg.rdmap_header =
                    seg.get(UNTAGGED_HEADER_LEN..).and_then(|p| p.first_chunk::<READ_REQUEST_LEN>()).copied();
            }
        }
        msg.with_flags()
    }

    /// Sets `header`'s M/D/R from the fields.
    fn with_flags(mut self) -> TerminateMessage {
        self.header = self.control();
        self
    }
}

/// RDMAP-level peer violations (those the ddp crate does not already map) and local failures
/// that end the stream. Each has exactly one Terminate code, from
/// [`RdmapError::terminate_code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmapError {
    /// The control byte's RV is not 1.
    InvalidVersion {
        /// The RV received.
        version: u8,
    },
    /// An opcode that is reserved, not negotiated (RFC 7306 extensions to a peer that did not
    /// agree to them), or not expected on this queue or in this state.
    UnexpectedOpcode {
        /// The opcode received.
        opcode: Opcode,
    },
    /// A Read Response arrived with no Read outstanding. Reported as an unexpected opcode
    /// (the message is not one the stream can take now); unverified against the RFC text.
    UnexpectedReadResponse,
    /// A Read or Atomic Request arrived with all IRD slots in use. siw reports this as a
    /// catastrophic error localized to the stream (`siw_init_rresp`: "IRQ exceeded").
    IrdExceeded {
        /// The IRD in force.
        ird: u32,
    },
    /// A Read Request whose source range is not inside the source region: a base or bounds
    /// violation, reported by RDMAP.
    ReadRequestTooLarge {
        /// The requested size.
        size: u32,
    },
    /// A Read Request whose sink range ends past 2^64 - 1: no Read Response could carry it
    /// (its tagged offsets would wrap). RDMAP's "TO wrap" remote protection error.
    ReadSinkWraps {
        /// The requested sink tagged offset.
        sink_to: u64,
        /// The requested size.
        size: u32,
    },
    /// A tagged access check failed on a message RDMAP checks (Read Request source, Atomic
    /// Request target): the ddp crate's mapping for RDMAP ([`AccessError::rdmap_terminate_code`]).
    Access(AccessError),
    /// Send with Invalidate named an STag the sender has no right to (another protection
    /// domain, or a region registered without remote access): remote protection error, as
    /// siw reports -EACCES.
    InvalidateNotPermitted {
        /// The Invalidate STag.
        stag: STag,
    },
    /// Send with Invalidate named an STag that cannot be invalidated for another reason (no
    /// such STag, already invalid, a region with memory windows bound): remote operation
    /// error, as siw does.
    CannotInvalidate {
        /// The Invalidate STag.
        stag: STag,
    },
    /// An Atomic Request with an operation code this stack does not implement. Unverified:
    /// RFC 7306 may name a specific code; this reports "unspecified" remote operation error.
    UnsupportedAtomicOp {
        /// The 4-bit operation code.
        op: u32,
    },
    /// A message with a fixed-size body (Read Request, Atomic Request or Response, Immediate
    /// Data) that is not exactly that size, or not in one segment. Reported as DDP's "message
    /// too long" (the DDP untagged buffer error for a message that does not fit the buffer
    /// RDMAP posted for it), as siw reports an oversized one; unverified against the RFC text
    /// for a short one.
    BodyLength {
        /// The message's opcode.
        opcode: Opcode,
        /// The bytes its segment carried.
        len: usize,
        /// The body's fixed length.
        expected: usize,
    },
    /// Something broke this stream only (resources, internal invariant).
    CatastrophicStream,
    /// Something broke the whole device.
    CatastrophicGlobal,
    /// A local catastrophic error not tied to any message.
    LocalCatastrophic,
}

impl RdmapError {
    /// The Terminate code (RFC 5040 section 7; docs/protocol-notes.md#terminate-codes).
    pub fn terminate_code(&self) -> TerminateCode {
        let prot = rdmap_type::REMOTE_PROTECTION;
        let op = rdmap_type::REMOTE_OPERATION;
        match self {
            RdmapError::InvalidVersion { .. } => TerminateCode::rdmap(op, 0x05),
            RdmapError::UnexpectedOpcode { .. } | RdmapError::UnexpectedReadResponse => {
                TerminateCode::rdmap(op, 0x06)
            }
            RdmapError::IrdExceeded { .. } | RdmapError::CatastrophicStream => TerminateCode::rdmap(op, 0x07),
            RdmapError::CatastrophicGlobal => TerminateCode::rdmap(op, 0x08),
            RdmapError::ReadRequestTooLarge { .. } => TerminateCode::rdmap(prot, 0x01),
            RdmapError::ReadSinkWraps { .. } => TerminateCode::rdmap(prot, 0x04),
            RdmapError::Access(e) => e.rdmap_terminate_code(),
            RdmapError::InvalidateNotPermitted { .. } => TerminateCode::rdmap(prot, 0x09),
            RdmapError::CannotInvalidate { .. } => TerminateCode::rdmap(op, 0x09),
            RdmapError::UnsupportedAtomicOp { .. } => TerminateCode::rdmap(op, 0xff),
            RdmapError::LocalCatastrophic => TerminateCode::rdmap(rdmap_type::LOCAL_CATASTROPHIC, 0x00),
            RdmapError::BodyLength { len, expected, .. } => {
                let end = u64::try_from(*len).unwrap_or(u64::MAX);
                let buffer_len = u64::try_from(*expected).unwrap_or(u64::MAX);
                UntaggedError::MessageTooLong { end, buffer_len }.terminate_code()
            }
        }
    }
}

impl fmt::Display for RdmapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmapError::InvalidVersion { version } => write!(f, "invalid RDMAP version {version}"),
            RdmapError::UnexpectedOpcode { opcode } => write!(f, "unexpected opcode {opcode}"),
            RdmapError::UnexpectedReadResponse => f.write_str("Read Response with no Read outstanding"),
            RdmapError::IrdExceeded { ird } => write!(f, "peer exceeded IRD {ird}"),
            RdmapError::ReadRequestTooLarge { size } => {
                write!(f, "Read Request of {size} bytes out of bounds")
            }
            RdmapError::ReadSinkWraps { sink_to, size } => {
                write!(f, "Read Request sink of {size} bytes at TO {sink_to:#x} wraps")
            }
            RdmapError::Access(e) => write!(f, "tagged access refused: {e:?}"),
            RdmapError::InvalidateNotPermitted { stag } => write!(f, "may not invalidate STag {stag}"),
            RdmapError::CannotInvalidate { stag } => write!(f, "cannot invalidate STag {stag}"),
            RdmapError::UnsupportedAtomicOp { op } => write!(f, "unsupported atomic operation {op}"),
            RdmapError::CatastrophicStream => f.write_str("catastrophic error, localized to the stream"),
            RdmapError::CatastrophicGlobal => f.write_str("catastrophic error, global"),
            RdmapError::LocalCatastrophic => f.write_str("local catastrophic error"),
            RdmapError::BodyLength { opcode, len, expected } => {
                write!(f, "{opcode} body of {len} bytes, expected {expected} in one segment")
            }
        }
    }
}

impl std::error::Error for RdmapError {}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_ddp::{Msn, QueueNumber, SegmentKind, TaggedOffset};
    use proptest::prelude::*;

    use crate::wire::ReadRequest;

    /// An untagged segment header: `ctrl` is the RDMAP control byte.
    fn untagged(ctrl: u8, qn: u32, msn: u32, mo: u32) -> Vec<u8> {
        let h = HeaderRepr {
            last: true,
            rdmap_control: ctrl,
            kind: SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::from(qn), msn: Msn(msn), mo },
        };
        let mut b = vec![0u8; UNTAGGED_HEADER_LEN];
        h.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn siw_invalid_qn_terminate_decodes_fully() {
        // siw 6.1 answering a Send to QN 5 (MSN 1, MO 0, 4 payload bytes): control word
        // `21 01 03 00` (siw bit-fields: DDP, untagged buffer, invalid QN, M+D), then the
        // segment length siw computes (payload only: 4) and the offending 18-byte header.
        let offending = untagged(0x43, 5, 1, 0);
        let mut body = vec![0x21, 0x01, 0x03, 0x00, 0x00, 0x04];
        body.extend_from_slice(&offending);
        let m = TerminateMessage::parse_siw(&body).unwrap();
        assert_eq!(m.header.cause, TerminateCode::ddp(ddp_type::UNTAGGED_BUFFER, 0x01));
        assert!(m.header.m && m.header.d && !m.header.r);
        assert_eq!(m.ddp_segment_len, Some(4));
        assert_eq!(m.rdmap_header, None);
        let copy = m.ddp_header.unwrap();
        assert_eq!(copy.len(), 18);
        let h = copy.header().unwrap();
        assert_eq!(h.rdmap_control, 0x43);
        assert!(matches!(
            h.kind,
            SegmentKind::Untagged { qn: QueueNumber::Unknown(5), msn: Msn(1), mo: 0, .. }
        ));
        // The same bytes read the RFC way: an undefined code and no flags, so no copies.
        let rfc = TerminateMessage::parse(&body).unwrap();
        assert!(!rfc.header.cause.is_defined());
        assert_eq!(rfc.ddp_header, None);
        // What we would send for the same error: the RFC control word, whole-segment length.
        let mut seg = offending.clone();
        seg.extend_from_slice(b"ping");
        let ours = TerminateMessage::for_error(m.header.cause, Some(&seg));
        let mut want = vec![0x12, 0x01, 0xc0, 0x00, 0x00, 22];
        want.extend_from_slice(&offending);
        assert_eq!(ours.to_vec(), want);
        assert_eq!(TerminateMessage::parse(&want).unwrap(), ours);
    }

    #[test]
    fn read_request_protection_error_copies_rdmap_header() {
        let rr =
            ReadRequest { sink_stag: 0x1234, sink_to: 0x10, size: 64, source_stag: 0x99, source_to: 0x20 };
        let mut seg = untagged(0x41, 1, 3, 0);
        seg.extend_from_slice(&rr.to_bytes());
        let code = RdmapError::Access(AccessError::InvalidStag).terminate_code();
        let m = TerminateMessage::for_error(code, Some(&seg));
        assert!(m.header.m && m.header.d && m.header.r);
        assert_eq!(m.ddp_segment_len, Some(46));
        assert_eq!(m.rdmap_header, Some(rr.to_bytes()));
        let bytes = m.to_vec();
        assert_eq!(bytes.len(), 4 + 2 + 18 + 28);
        assert_eq!(&bytes[..6], &[0x01, 0x00, 0xe0, 0x00, 0x00, 46]);
        assert_eq!(ReadRequest::parse(&bytes[24..]).unwrap(), rr);
        assert_eq!(TerminateMessage::parse(&bytes).unwrap(), m);
        // Truncated anywhere: an error, never a panic.
        for n in 0..bytes.len() {
            assert!(TerminateMessage::parse(&bytes[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn for_error_rules() {
        let mut tagged = vec![0u8; TAGGED_HEADER_LEN];
        HeaderRepr {
            last: true,
            rdmap_control: 0x40,
            kind: SegmentKind::Tagged { stag: STag(0x101), to: TaggedOffset(8) },
        }
        .emit(&mut tagged)
        .unwrap();
        tagged.extend_from_slice(&[0; 10]);
        let send = untagged(0x43, 0, 1, 0);

        // DDP tagged error: M + D, 14-byte copy.
        let m = TerminateMessage::for_error(AccessError::BaseOrBounds.terminate_code(), Some(&tagged));
        assert_eq!(m.ddp_header, Some(TerminatedDdpHeader::Tagged(tagged[..14].try_into().unwrap())));
        assert_eq!(m.ddp_segment_len, Some(24));
        assert_eq!(m.to_vec().len(), 4 + 2 + 14);
        // Invalid DDP version: nothing.
        let m = TerminateMessage::for_error(TerminateCode::ddp(ddp_type::TAGGED_BUFFER, 0x04), Some(&tagged));
        assert_eq!(m, TerminateMessage::new(TerminateCode::ddp(1, 0x04)));
        let m = TerminateMessage::for_error(TerminateCode::ddp(ddp_type::UNTAGGED_BUFFER, 0x06), Some(&send));
        assert_eq!(m.buffer_len(), 4);
        // RDMAP version / opcode / local catastrophic: nothing.
        for e in [
            RdmapError::InvalidVersion { version: 2 },
            RdmapError::UnexpectedOpcode { opcode: Opcode::AtomicRequest },
            RdmapError::LocalCatastrophic,
        ] {
            let m = TerminateMessage::for_error(e.terminate_code(), Some(&send));
            assert_eq!(
                m.to_vec(),
                e.terminate_code().to_bytes().iter().copied().chain([0, 0]).collect::<Vec<_>>()
            );
        }
        // Cannot invalidate on a Send with Invalidate: M + D, no R (not a Read Request).
        let m = TerminateMessage::for_error(
            RdmapError::CannotInvalidate { stag: STag(7) }.terminate_code(),
            Some(&send),
        );
        assert!(m.header.m && m.header.d && !m.header.r);
        // LLP: copies only with a segment.
        let crc = TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code: 0x02 };
        assert_eq!(TerminateMessage::for_error(crc, None).buffer_len(), 4);
        assert!(TerminateMessage::for_error(crc, Some(&send)).header.d);
        // A segment too short for its header: nothing copied.
        let m = TerminateMessage::for_error(TerminateCode::ddp(2, 0x01), Some(&send[..10]));
        assert_eq!(m.buffer_len(), 4);
        // Read Request too short for its body: M + D, no R.
        let mut rr = untagged(0x41, 1, 1, 0);
        rr.extend_from_slice(&[0; 27]);
        let m = TerminateMessage::for_error(
            RdmapError::ReadRequestTooLarge { size: 1 }.terminate_code(),
            Some(&rr),
        );
        assert!(m.header.d && !m.header.r);
    }

    #[test]
    fn siw_r_without_rdmap_header() {
        // siw: remote protection on a Send sets M, D and R but attaches only the DDP header.
        let mut body = vec![0x10, 0x00, 0x07, 0x00, 0x00, 0x00];
        body.extend_from_slice(&untagged(0x43, 0, 1, 0));
        let m = TerminateMessage::parse_siw(&body).unwrap();
        assert_eq!(m.header.cause, TerminateCode::rdmap(1, 0x00));
        assert!(m.header.r && m.rdmap_header.is_none() && m.ddp_header.is_some());
        // The RFC parser is strict about R.
        let mut rfc = body.clone();
        rfc[0] = 0x01;
        rfc[2] = 0xe0;
        assert_eq!(TerminateMessage::parse(&rfc), Err(Truncated { needed: 52, got: 24 }));
    }

    #[test]
    fn d_without_m_and_m_without_d() {
        // D only: the length field is there (zero) but not valid.
        let mut body = vec![0x12, 0x02, 0x40, 0x00, 0xab, 0xcd];
        body.extend_from_slice(&untagged(0x43, 0, 9, 0));
        let m = TerminateMessage::parse(&body).unwrap();
        assert_eq!(m.ddp_segment_len, None);
        assert!(m.ddp_header.is_some());
        assert_eq!(m.buffer_len(), body.len());
        // M only: the length and nothing else.
        let m = TerminateMessage::parse(&[0x12, 0x02, 0x80, 0x00, 0x00, 0x20]).unwrap();
        assert_eq!((m.ddp_segment_len, m.ddp_header), (Some(0x20), None));
        assert_eq!(m.to_vec(), [0x12, 0x02, 0x80, 0x00, 0x00, 0x20]);
        assert!(TerminateMessage::parse(&[0x12, 0x02, 0x80, 0x00, 0x00]).is_err());
        // Emit refuses a short buffer.
        assert_eq!(m.emit(&mut [0u8; 5]), Err(Truncated { needed: 6, got: 5 }));
    }

    /// docs/protocol-notes.md#terminate-codes, the layer 0 (RDMAP) rows.
    #[test]
    fn rdmap_error_codes_match_table() {
        let table: &[(RdmapError, u8, u8)] = &[
            (RdmapError::LocalCatastrophic, 0, 0x00),
            (RdmapError::Access(AccessError::InvalidStag), 1, 0x00),
            (RdmapError::ReadRequestTooLarge { size: 9 }, 1, 0x01),
            (RdmapError::Access(AccessError::BaseOrBounds), 1, 0x01),
            (RdmapError::Access(AccessError::AccessRights), 1, 0x02),
            (RdmapError::Access(AccessError::StagNotAssociated), 1, 0x03),
            (RdmapError::Access(AccessError::ToWrap), 1, 0x04),
            (RdmapError::ReadSinkWraps { sink_to: u64::MAX, size: 1 }, 1, 0x04),
            (RdmapError::InvalidateNotPermitted { stag: STag(1) }, 1, 0x09),
            (RdmapError::InvalidVersion { version: 0 }, 2, 0x05),
            (RdmapError::UnexpectedOpcode { opcode: Opcode::Unknown(0xc) }, 2, 0x06),
            (RdmapError::UnexpectedReadResponse, 2, 0x06),
            (RdmapError::CatastrophicStream, 2, 0x07),
            (RdmapError::IrdExceeded { ird: 4 }, 2, 0x07),
            (RdmapError::CatastrophicGlobal, 2, 0x08),
            (RdmapError::CannotInvalidate { stag: STag(1) }, 2, 0x09),
            (RdmapError::UnsupportedAtomicOp { op: 5 }, 2, 0xff),
        ];
        for (e, t, c) in table {
            let code = e.terminate_code();
            assert_eq!(code, TerminateCode::rdmap(*t, *c), "{e}");
            assert!(code.is_defined(), "{e}");
        }
    }

    fn arb_ddp_header() -> impl Strategy<Value = TerminatedDdpHeader> {
        prop_oneof![
            any::<[u8; 14]>().prop_map(|mut h| {
                h[0] |= 0x80;
                TerminatedDdpHeader::Tagged(h)
            }),
            any::<[u8; 18]>().prop_map(|mut h| {
                h[0] &= 0x7f;
                TerminatedDdpHeader::Untagged(h)
            }),
        ]
    }

    fn arb_message() -> impl Strategy<Value = TerminateMessage> {
        (
            0u8..16,
            0u8..16,
            any::<u8>(),
            proptest::option::of(any::<u16>()),
            proptest::option::of(arb_ddp_header()),
            proptest::option::of(any::<[u8; 28]>()),
        )
            .prop_map(|(l, t, c, m, d, r)| {
                let cause = TerminateCode { layer: TerminateLayer::from_u8(l), error_type: t, code: c };
                TerminateMessage {
                    header: TerminateHeader { cause, m: m.is_some(), d: d.is_some(), r: r.is_some() },
                    ddp_segment_len: m,
                    ddp_header: d,
                    rdmap_header: r,
                }
            })
    }

    proptest! {
        #[test]
        fn emit_parse_round_trip(m in arb_message()) {
            let bytes = m.to_vec();
            prop_assert_eq!(bytes.len(), m.buffer_len());
            prop_assert_eq!(TerminateMessage::parse(&bytes).unwrap(), m);
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(m) = TerminateMessage::parse(&b) {
                prop_assert!(m.buffer_len() <= b.len());
            }
            let _ = TerminateMessage::parse_siw(&b);
        }

        #[test]
        fn for_error_output_parses(l in 0u8..3, t in 0u8..3, c: u8, seg in proptest::collection::vec(any::<u8>(), 0..80)) {
            let code = TerminateCode { layer: TerminateLayer::from_u8(l), error_type: t, code: c };
            let m = TerminateMessage::for_error(code, Some(&seg));
            prop_assert_eq!(TerminateMessage::parse(&m.to_vec()).unwrap(), m);
        }
    }
}
