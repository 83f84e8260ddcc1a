//! RDMAP wire formats (RFC 5040 section 4, RFC 7306 section 6): the control byte, the Read
//! Request body and the Terminate message.

use core::fmt;

use iwarp_ddp::{TerminateCode, TerminateLayer};

/// RDMAP version carried in the top two bits of the control byte (RFC 5040 section 4.2: RV
/// is 01b).
pub const RDMAP_VERSION: u8 = 1;
/// Length of a Read Request body: sink STag, sink TO, size, source STag, source TO.
pub const READ_REQUEST_LEN: usize = 28;

/// RDMAP opcodes (RFC 5040 section 4.2 table, RFC 7306 section 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// 0x0 RDMA Write (tagged).
    Write,
    /// 0x1 RDMA Read Request (untagged, QN 1).
    ReadRequest,
    /// 0x2 RDMA Read Response (tagged).
    ReadResponse,
    /// 0x3 Send (QN 0).
    Send,
    /// 0x4 Send with Invalidate.
    SendInvalidate,
    /// 0x5 Send with Solicited Event.
    SendSe,
    /// 0x6 Send with Solicited Event and Invalidate.
    SendSeInvalidate,
    /// 0x7 Terminate (QN 2).
    Terminate,
    /// 0x8 Immediate Data (RFC 7306).
    ImmediateData,
    /// 0x9 Immediate Data with Solicited Event (RFC 7306).
    ImmediateDataSe,
    /// 0xA Atomic Request (RFC 7306, QN 1).
    AtomicRequest,
    /// 0xB Atomic Response (RFC 7306, QN 3).
    AtomicResponse,
    /// 0xC..=0xF: reserved.
    Unknown(u8),
}

impl Opcode {
    /// The opcode for the low four bits of a control byte.
    pub fn from_bits(bits: u8) -> Opcode {
        match bits & 0x0f {
            0x0 => Opcode::Write,
            0x1 => Opcode::ReadRequest,
            0x2 => Opcode::ReadResponse,
            0x3 => Opcode::Send,
            0x4 => Opcode::SendInvalidate,
            0x5 => Opcode::SendSe,
            0x6 => Opcode::SendSeInvalidate,
            0x7 => Opcode::Terminate,
            0x8 => Opcode::ImmediateData,
            0x9 => Opcode::ImmediateDataSe,
            0xa => Opcode::AtomicRequest,
            0xb => Opcode::AtomicResponse,
            other => Opcode::Unknown(other),
        }
    }

    /// The opcode's four bits.
    pub fn bits(self) -> u8 {
        match self {
            Opcode::Write => 0x0,
            Opcode::ReadRequest => 0x1,
            Opcode::ReadResponse => 0x2,
            Opcode::Send => 0x3,
            Opcode::SendInvalidate => 0x4,
            Opcode::SendSe => 0x5,
            Opcode::SendSeInvalidate => 0x6,
            Opcode::Terminate => 0x7,
            Opcode::ImmediateData => 0x8,
            Opcode::ImmediateDataSe => 0x9,
            Opcode::AtomicRequest => 0xa,
            Opcode::AtomicResponse => 0xb,
            Opcode::Unknown(b) => b & 0x0f,
        }
    }

    /// Whether the message uses the tagged buffer model (Write and Read Response).
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The untagged queue the message goes to (RFC 5040 section 5.1, RFC 7306 section 6.3):
    /// `None` for tagged and unknown opcodes.
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataSe => Some(0),
            Opcode::ReadRequest | Opcode::AtomicRequest => Some(1),
            Opcode::Terminate => Some(2),
            Opcode::AtomicResponse => Some(3),
            Opcode::Write | Opcode::ReadResponse | Opcode::Unknown(_) => None,
        }
    }

    /// Whether the opcode is an RFC 7306 extension (peers such as siw do not take them).
    pub fn is_extension(self) -> bool {
        matches!(
            self,
            Opcode::ImmediateData | Opcode::ImmediateDataSe | Opcode::AtomicRequest | Opcode::AtomicResponse
        )
    }

    /// A short name, as the dissector prints it.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::Write => "Write",
            Opcode::ReadRequest => "ReadReq",
            Opcode::ReadResponse => "ReadResp",
            Opcode::Send => "Send",
            Opcode::SendInvalidate => "SendInv",
            Opcode::SendSe => "SendSE",
            Opcode::SendSeInvalidate => "SendSEInv",
            Opcode::Terminate => "Terminate",
            Opcode::ImmediateData => "ImmData",
            Opcode::ImmediateDataSe => "ImmDataSE",
            Opcode::AtomicRequest => "AtomicReq",
            Opcode::AtomicResponse => "AtomicResp",
            Opcode::Unknown(_) => "Unknown",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(b) => write!(f, "Unknown(0x{b:x})"),
            other => f.write_str(other.name()),
        }
    }
}

/// The RDMAP control byte (byte 1 of the DDP header): RV in the top two bits, opcode in the
/// low four.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Control {
    /// RV, which must be [`RDMAP_VERSION`].
    pub version: u8,
    /// The opcode.
    pub opcode: Opcode,
}

impl Control {
    /// Decodes a control byte.
    pub fn from_byte(b: u8) -> Control {
        Control { version: b >> 6, opcode: Opcode::from_bits(b) }
    }

    /// A version-1 control byte for `opcode`.
    pub fn new(opcode: Opcode) -> Control {
        Control { version: RDMAP_VERSION, opcode }
    }

    /// Encodes the control byte (reserved bits zero).
    pub fn to_byte(self) -> u8 {
        (self.version & 0x3) << 6 | self.opcode.bits()
    }
}

/// The body of an RDMA Read Request (RFC 5040 section 4.4), all fields big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Data sink STag: where the Read Response is placed (on the requester).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// Data source STag (on the responder).
    pub source_stag: u32,
    /// Data source tagged offset.
    pub source_to: u64,
}

/// A body shorter than its fixed layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// Bytes needed.
    pub needed: usize,
    /// Bytes present.
    pub got: usize,
}

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMAP message truncated: {} bytes needed, {} present", self.needed, self.got)
    }
}

impl std::error::Error for Truncated {}

/// The big-endian `u32` at `at` (zero where `b` is too short; callers check lengths first).
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

/// The big-endian `u64` at `at` (zero where `b` is too short; callers check lengths first).
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_be_bytes(w)
}

impl ReadRequest {
    /// Parses the 28-byte body (bytes after it are ignored).
    pub fn parse(b: &[u8]) -> Result<ReadRequest, Truncated> {
        if b.len() < READ_REQUEST_LEN {
            return Err(Truncated { needed: READ_REQUEST_LEN, got: b.len() });
        }
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            source_stag: be32(b, 16),
            source_to: be64(b, 20),
        })
    }

    /// The 28-byte body.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.source_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.source_to.to_be_bytes());
        b
    }
}

/// The Terminate control word and the header-copy flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateHeader {
    /// What went wrong.
    pub cause: TerminateCode,
    /// M: the DDP segment length field is valid.
    pub m: bool,
    /// D: the terminated DDP header follows.
    pub d: bool,
    /// R: the terminated RDMAP header (a Read Request body) follows.
    pub r: bool,
}

/// Length of the Terminate control word.
pub const TERMINATE_CONTROL_LEN: usize = 4;

impl TerminateHeader {
    /// Decodes the control word laid out as RFC 5040 section 4.8 says: layer in the high
    /// nibble of byte 0, error type in its low nibble, code in byte 1, M/D/R in bits 7/6/5 of
    /// byte 2.
    pub fn parse(b: &[u8]) -> Result<TerminateHeader, Truncated> {
        let w = Self::word(b)?;
        Ok(TerminateHeader {
            cause: TerminateCode {
                layer: TerminateLayer::from_u8(w[0] >> 4),
                error_type: w[0] & 0xf,
                code: w[1],
            },
            m: w[2] & 0x80 != 0,
            d: w[2] & 0x40 != 0,
            r: w[2] & 0x20 != 0,
        })
    }

    /// Decodes the control word as Linux siw lays it out with C bit-fields on little-endian
    /// machines: layer in the LOW nibble of byte 0, error type in the high nibble, code in
    /// byte 1, M/D/R in bits 0/1/2 of byte 2 (seen from siw 6.1: `21 01 03 00` is DDP,
    /// untagged buffer, invalid QN, M+D).
    pub fn parse_siw(b: &[u8]) -> Result<TerminateHeader, Truncated> {
        let w = Self::word(b)?;
        Ok(TerminateHeader {
            cause: TerminateCode {
                layer: TerminateLayer::from_u8(w[0] & 0xf),
                error_type: w[0] >> 4,
                code: w[1],
            },
            m: w[2] & 0x01 != 0,
            d: w[2] & 0x02 != 0,
            r: w[2] & 0x04 != 0,
        })
    }

    fn word(b: &[u8]) -> Result<[u8; 4], Truncated> {
        b.first_chunk::<TERMINATE_CONTROL_LEN>()
            .copied()
            .ok_or(Truncated { needed: TERMINATE_CONTROL_LEN, got: b.len() })
    }

    /// The RFC 5040 control word (what this stack sends).
    pub fn to_bytes(&self) -> [u8; TERMINATE_CONTROL_LEN] {
        let mut flags = 0u8;
        for (on, bit) in [(self.m, 0x80), (self.d, 0x40), (self.r, 0x20)] {
            if on {
                flags |= bit;
            }
        }
        let [lt, code] = self.cause.to_bytes();
        [lt, code, flags, 0]
    }
}

/// What [`fuzz_parse`] decoded: the layers a ULPDU got through, for tests of the seeds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not a DDP segment.
    NotASegment,
    /// A DDP segment whose RDMAP message has no body decoded here.
    Segment(Opcode),
    /// A Read Request and its body.
    ReadRequest(ReadRequest),
    /// A Read Request whose body is cut short.
    ReadRequestTruncated,
    /// A Terminate and its control word in the RFC and siw layouts.
    Terminate {
        /// RFC 5040's layout.
        rfc: TerminateHeader,
        /// siw's layout.
        siw: TerminateHeader,
    },
    /// A Terminate whose control word is cut short.
    TerminateTruncated,
}

/// Fuzz entry point (fuzz/fuzz_targets/ddp_rdmap_parse.rs): parses `ulpdu` as a DDP segment
/// and its RDMAP message (control byte, Read Request body, Terminate control word in both
/// layouts); whatever parses must re-emit to the same header bytes (reserved DDP bits aside).
/// Panics only on a bug; returns what it decoded.
#[doc(hidden)]
pub fn fuzz_parse(ulpdu: &[u8]) -> Parsed {
    let Ok(seg) = iwarp_ddp::SegmentRepr::parse(ulpdu) else { return Parsed::NotASegment };
    let hlen = seg.header_len();
    let again = seg.to_vec();
    assert_eq!(again.len(), ulpdu.len());
    // Byte 0 carries reserved bits that are sent as zero; the rest must match.
    assert_eq!(again.get(1..hlen), ulpdu.get(1..hlen));
    assert_eq!(again.get(hlen..), ulpdu.get(hlen..));
    let control = Control::from_byte(seg.header.rdmap_control);
    assert_eq!(Control::from_byte(control.to_byte()).opcode, control.opcode);
    match control.opcode {
        Opcode::ReadRequest => match ReadRequest::parse(seg.payload) {
            Ok(r) => {
                assert_eq!(seg.payload.get(..READ_REQUEST_LEN), Some(&r.to_bytes()[..]));
                Parsed::ReadRequest(r)
            }
            Err(_) => Parsed::ReadRequestTruncated,
        },
        Opcode::Terminate => {
            match (TerminateHeader::parse(seg.payload), TerminateHeader::parse_siw(seg.payload)) {
                (Ok(rfc), Ok(siw)) => {
                    let back = TerminateHeader::parse(&rfc.to_bytes()).ok();
                    assert_eq!(back, Some(rfc));
                    let _ = siw.cause.is_defined();
                    Parsed::Terminate { rfc, siw }
                }
                _ => Parsed::TerminateTruncated,
            }
        }
        op => Parsed::Segment(op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_round_trip() {
        for b in 0u8..16 {
            let op = Opcode::from_bits(b);
            assert_eq!(op.bits(), b);
            assert_eq!(matches!(op, Opcode::Unknown(_)), b > 0xb);
        }
        assert_eq!(Opcode::ReadRequest.queue(), Some(1));
        assert_eq!(Opcode::AtomicResponse.queue(), Some(3));
        assert_eq!(Opcode::Terminate.queue(), Some(2));
        assert_eq!(Opcode::ImmediateData.queue(), Some(0));
        assert_eq!(Opcode::Write.queue(), None);
        assert!(Opcode::ReadResponse.is_tagged() && !Opcode::Send.is_tagged());
        assert!(Opcode::AtomicRequest.is_extension() && !Opcode::SendSeInvalidate.is_extension());
    }

    #[test]
    fn control_bytes_from_captures() {
        // siw-rping.pcap: 0x43 Send, 0x41 Read Request, 0x42 Read Response, 0x40 Write.
        assert_eq!(Control::from_byte(0x43), Control::new(Opcode::Send));
        assert_eq!(Control::from_byte(0x41).opcode, Opcode::ReadRequest);
        assert_eq!(Control::new(Opcode::ReadResponse).to_byte(), 0x42);
        assert_eq!(Control::new(Opcode::Write).to_byte(), 0x40);
        assert_eq!(Control::from_byte(0x03).version, 0);
        assert_eq!(Control::from_byte(0xc7).version, 3);
    }

    #[test]
    fn read_request_fixture() {
        let b = [
            0x00, 0x00, 0x12, 0x34, // sink STag
            0x00, 0x00, 0x7f, 0xff, 0x00, 0x00, 0x10, 0x00, // sink TO
            0x00, 0x00, 0x00, 0x40, // size 64
            0xab, 0xcd, 0xef, 0x01, // source STag
            0x00, 0x00, 0x55, 0x55, 0x66, 0x66, 0x00, 0x08, // source TO
        ];
        let r = ReadRequest::parse(&b).unwrap();
        assert_eq!(r.sink_stag, 0x1234);
        assert_eq!(r.sink_to, 0x7fff_0000_1000);
        assert_eq!(r.size, 64);
        assert_eq!(r.source_stag, 0xabcd_ef01);
        assert_eq!(r.source_to, 0x5555_6666_0008);
        assert_eq!(r.to_bytes(), b);
        assert_eq!(ReadRequest::parse(&b[..27]), Err(Truncated { needed: 28, got: 27 }));
    }

    #[test]
    fn terminate_rfc_layout() {
        let t = TerminateHeader { cause: TerminateCode::ddp(2, 0x01), m: true, d: true, r: false };
        assert_eq!(t.to_bytes(), [0x12, 0x01, 0xc0, 0x00]);
        assert_eq!(TerminateHeader::parse(&t.to_bytes()).unwrap(), t);
        assert!(t.cause.is_defined());
    }

    #[test]
    fn terminate_siw_layout() {
        // From siw 6.1: invalid QN, sent with C bit-fields.
        let wire = [0x21, 0x01, 0x03, 0x00];
        let siw = TerminateHeader::parse_siw(&wire).unwrap();
        assert_eq!(siw.cause, TerminateCode::ddp(2, 0x01));
        assert!(siw.m && siw.d && !siw.r);
        assert!(siw.cause.is_defined());
        // Read the RFC way, the same bytes name an impossible layer: the hint to try siw's.
        let rfc = TerminateHeader::parse(&wire).unwrap();
        assert_eq!(rfc.cause.layer, TerminateLayer::Llp);
        assert!(!rfc.cause.is_defined());
        assert!(!rfc.m && !rfc.d);
        assert!(TerminateHeader::parse(&wire[..3]).is_err());
    }

    #[test]
    fn fuzz_entry_accepts_real_segments() {
        // An untagged Read Request (QN 1, MSN 1, MO 0) as siw's rping sends it, and a
        // Terminate in siw's layout: both parse, survive the round-trip checks, and decode to
        // the fields they carry.
        let mut rr = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        let req =
            ReadRequest { sink_stag: 0x1234, sink_to: 0x10, size: 64, source_stag: 0x99, source_to: 0x20 };
        rr.extend_from_slice(&req.to_bytes());
        assert_eq!(fuzz_parse(&rr), Parsed::ReadRequest(req));
        assert_eq!(fuzz_parse(&rr[..rr.len() - 1]), Parsed::ReadRequestTruncated);
        let term = [0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0x21, 0x01, 0x03, 0x00];
        let Parsed::Terminate { rfc, siw } = fuzz_parse(&term) else { panic!("{:?}", fuzz_parse(&term)) };
        assert_eq!(siw.cause, TerminateCode::ddp(2, 0x01));
        assert!(siw.m && siw.d && !siw.r);
        assert!(!rfc.cause.is_defined());
        assert_eq!(fuzz_parse(&term[..20]), Parsed::TerminateTruncated);
        // A tagged Write (STag 0x100, TO 0x10) with a 3-byte payload.
        let write = [0xc1, 0x40, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 1, 2, 3];
        assert_eq!(fuzz_parse(&write), Parsed::Segment(Opcode::Write));
        assert_eq!(fuzz_parse(&[0x41]), Parsed::NotASegment);
    }
}
