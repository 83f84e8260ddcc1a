//! The records a dissection produces (the capture, connections, FPDUs, violations, notes, the
//! summary) and the [`Sink`] they go to.

use std::fmt;
use std::net::SocketAddr;

use serde::Serialize;

use crate::{capture, ddp};

/// What to keep while dissecting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Keep each FPDU's ULPDU bytes in [`FpduInfo::ulpdu`] (for hex dumps).
    pub keep_ulpdu: bool,
}

/// Why a file could not be dissected at all.
#[derive(Debug)]
pub enum DissectError {
    /// The file could not be read.
    Io(std::io::Error),
    /// The bytes are not a pcap or pcapng capture.
    NotACapture,
}

impl fmt::Display for DissectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DissectError::Io(e) => write!(f, "{e}"),
            DissectError::NotACapture => f.write_str("not a pcap or pcapng capture"),
        }
    }
}

impl std::error::Error for DissectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DissectError::Io(e) => Some(e),
            DissectError::NotACapture => None,
        }
    }
}

/// A direction of an MPA connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Dir {
    /// Initiator to responder.
    #[serde(rename = "i->r")]
    InitiatorToResponder,
    /// Responder to initiator.
    #[serde(rename = "r->i")]
    ResponderToInitiator,
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::InitiatorToResponder => "i->r",
            Dir::ResponderToInitiator => "r->i",
        })
    }
}

/// An MPA Request or Reply as seen on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FrameInfo {
    /// Frame number of the packet that completed it.
    pub frame: Option<usize>,
    /// Revision.
    pub revision: u8,
    /// The flags octet (M, C, R, H and the reserved bits).
    pub flags: u8,
    /// M.
    pub markers: bool,
    /// C.
    pub crc: bool,
    /// R (Reply only).
    pub reject: bool,
    /// H: enhanced (RFC 6581).
    pub enhanced: bool,
    /// PD_Length (IRD/ORD word included).
    pub pd_len: usize,
    /// The whole private data, IRD/ORD word included.
    #[serde(serialize_with = "hex_bytes")]
    pub private_data: Vec<u8>,
    /// The RFC 6581 IRD/ORD word, when H is set.
    pub ird_ord: Option<IrdOrdInfo>,
}

/// The RFC 6581 IRD/ORD word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IrdOrdInfo {
    /// IRD.
    pub ird: u16,
    /// ORD.
    pub ord: u16,
    /// The peer-to-peer bit.
    pub p2p: bool,
    /// RTR types offered (Request) or chosen (Reply): zero-length Send.
    pub rtr_send: bool,
    /// Zero-length RDMA Write.
    pub rtr_write: bool,
    /// Zero-length RDMA Read.
    pub rtr_read: bool,
}

/// What the two frames settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Negotiated {
    /// CRC32c in both directions (either side set C).
    pub crc: bool,
    /// Markers in the initiator -> responder direction (the Reply's M).
    pub markers_to_responder: bool,
    /// Markers in the responder -> initiator direction (the Request's M).
    pub markers_to_initiator: bool,
    /// The ready-to-receive message agreed (RFC 6581): "send", "write", "read" or none.
    pub rtr: Option<&'static str>,
    /// Whether the Reply rejected the connection.
    pub rejected: bool,
}

/// The CRC field of an FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum CrcVerdict {
    /// CRC negotiated and correct.
    Good {
        /// The field's value.
        value: u32,
    },
    /// CRC negotiated and wrong.
    Bad {
        /// CRC32c computed over the FPDU.
        computed: u32,
        /// The field's value.
        received: u32,
    },
    /// CRC not negotiated: the field (normally zero) is not checked.
    NotChecked {
        /// The field's value.
        value: u32,
    },
}

impl fmt::Display for CrcVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrcVerdict::Good { .. } => f.write_str("good"),
            CrcVerdict::Bad { computed, received } => {
                write!(f, "BAD (computed 0x{computed:08x}, received 0x{received:08x})")
            }
            CrcVerdict::NotChecked { value: 0 } => f.write_str("off"),
            CrcVerdict::NotChecked { value } => write!(f, "off (field 0x{value:08x})"),
        }
    }
}

/// The DDP and RDMAP control octets at the start of a ULPDU (RFC 5041 section 4, RFC 5040
/// section 4): decoded only as far as these two octets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DdpControl {
    /// The DDP control octet.
    pub ddp: u8,
    /// The RDMAP control octet.
    pub rdmap: u8,
    /// T: tagged buffer model.
    pub tagged: bool,
    /// L: last segment of a message.
    pub last: bool,
    /// DDP version (low two bits of the DDP octet).
    pub ddp_version: u8,
    /// RDMAP version (top two bits of the RDMAP octet).
    pub rdmap_version: u8,
    /// RDMAP opcode (low four bits).
    pub opcode: u8,
    /// The opcode's name.
    pub opcode_name: &'static str,
}

impl DdpControl {
    /// Decodes the first two octets of a ULPDU.
    pub fn from_bytes(ddp: u8, rdmap: u8) -> DdpControl {
        let opcode = rdmap & 0x0f;
        DdpControl {
            ddp,
            rdmap,
            tagged: ddp & 0x80 != 0,
            last: ddp & 0x40 != 0,
            ddp_version: ddp & 0x03,
            rdmap_version: rdmap >> 6,
            opcode,
            opcode_name: opcode_name(opcode),
        }
    }
}

/// RDMAP opcode names (RFC 5040 section 4.2, RFC 7306 section 8).
pub fn opcode_name(opcode: u8) -> &'static str {
    match opcode {
        0x0 => "Write",
        0x1 => "ReadReq",
        0x2 => "ReadResp",
        0x3 => "Send",
        0x4 => "SendInv",
        0x5 => "SendSE",
        0x6 => "SendSEInv",
        0x7 => "Terminate",
        0x8 => "ImmData",
        0x9 => "ImmDataSE",
        0xa => "AtomicReq",
        0xb => "AtomicResp",
        _ => "reserved",
    }
}

/// One FPDU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FpduInfo {
    /// Direction.
    pub dir: Dir,
    /// Number within its direction, from 1.
    pub index: usize,
    /// Frame number of the packet that carried its last octet.
    pub frame: Option<usize>,
    /// Stream position (0 = first octet after the Request/Reply).
    pub offset: u64,
    /// Octets on the wire, markers included.
    pub wire_len: usize,
    /// ULPDU_Length.
    pub ulpdu_len: usize,
    /// Pad octets.
    pub pad: usize,
    /// The CRC verdict.
    pub crc: CrcVerdict,
    /// Stream positions of the markers inside the FPDU.
    pub markers: Vec<u64>,
    /// The DDP/RDMAP control octets, when the ULPDU has two.
    pub ddp: Option<DdpControl>,
    /// The decoded DDP segment and RDMAP message (`None` when malformed: see the violations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment: Option<ddp::Segment>,
    /// The ULPDU (with [`Options::keep_ulpdu`]).
    #[serde(serialize_with = "hex_opt", skip_serializing_if = "Option::is_none")]
    pub ulpdu: Option<Vec<u8>>,
}

/// One TCP connection and, when it carries MPA, its handshake and FPDUs (the FPDUs only in a
/// [`Report`](crate::Report): a [`Sink`] gets them one at a time, after the connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// Number in the capture (all TCP connections counted, from 1).
    pub id: usize,
    /// The MPA initiator (or, without MPA, the TCP client).
    pub initiator: SocketAddr,
    /// The MPA responder (or, without MPA, the TCP server).
    pub responder: SocketAddr,
    /// Frame number of the connection's first packet.
    pub first_frame: usize,
    /// Whether an MPA Request was found at the start of a stream.
    pub mpa: bool,
    /// The Request.
    pub request: Option<FrameInfo>,
    /// The Reply.
    pub reply: Option<FrameInfo>,
    /// The negotiated settings (when both frames were seen).
    pub negotiated: Option<Negotiated>,
    /// The FPDUs of both directions, in the order of the frames that completed them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fpdus: Vec<FpduInfo>,
}

/// Kinds of violations, for the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// An FPDU's CRC32c does not match.
    BadCrc,
    /// A marker is wrong.
    BadMarker,
    /// A malformed MPA Request/Reply or FPDU.
    MalformedFrame,
    /// A malformed DDP segment or RDMAP message.
    MalformedDdp,
    /// The responder sent FPDUs before the initiator's first FPDU.
    ResponderFirst,
    /// An MSN gap or repeat on an untagged queue.
    MsnSequence,
    /// An MO that does not continue the message.
    MoMismatch,
    /// A Read Response that does not match its Read Request.
    ReadResponse,
    /// A missing or wrong peer-to-peer RTR message.
    Rtr,
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViolationKind::BadCrc => "bad CRC",
            ViolationKind::BadMarker => "bad marker",
            ViolationKind::MalformedFrame => "malformed frame",
            ViolationKind::MalformedDdp => "malformed DDP/RDMAP",
            ViolationKind::ResponderFirst => "responder sent first",
            ViolationKind::MsnSequence => "MSN sequence",
            ViolationKind::MoMismatch => "MO mismatch",
            ViolationKind::ReadResponse => "Read Response mismatch",
            ViolationKind::Rtr => "RTR",
        })
    }
}

/// A protocol error on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which violation.
    pub kind: ViolationKind,
    /// Connection id.
    pub conn: usize,
    /// Direction, when it concerns one.
    pub dir: Option<Dir>,
    /// Frame number, when known.
    pub frame: Option<usize>,
    /// Stream offset, when known.
    pub offset: Option<u64>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn {}", self.conn)?;
        if let Some(d) = self.dir {
            write!(f, " {d}")?;
        }
        if let Some(o) = self.offset {
            write!(f, " @{o}")?;
        }
        if let Some(fr) = self.frame {
            write!(f, " (frame {fr})")?;
        }
        write!(f, ": {}: {}", self.kind, self.message)
    }
}

/// Something worth knowing that is not a protocol error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    /// Connection id, when it concerns one.
    pub conn: Option<usize>,
    /// The note.
    pub message: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.conn {
            Some(c) => write!(f, "conn {c}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// The capture as a whole, known before any connection is reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaptureInfo {
    /// pcap or pcapng.
    pub format: capture::Format,
    /// Packets read.
    pub packets: usize,
    /// Set when the file ended early or was damaged.
    pub truncated: Option<capture::Truncation>,
}

/// Receives a dissection's records as they are decoded ([`dissect_to`](crate::dissect_to)): [`Sink::capture`]
/// once, then for each TCP connection [`Sink::connection`] followed by that connection's
/// [`Sink::fpdu`]s, with [`Sink::violation`]s and [`Sink::note`]s where they are found (a
/// finding about an FPDU right after it). Every method does nothing unless implemented.
pub trait Sink {
    /// The capture's format and packet count.
    fn capture(&mut self, capture: &CaptureInfo) {
        let _ = capture;
    }
    /// A TCP connection with its MPA handshake, if any ([`Connection::fpdus`] is empty: the
    /// FPDUs follow).
    fn connection(&mut self, conn: &Connection) {
        let _ = conn;
    }
    /// An FPDU of connection `conn` (the last one reported).
    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        let _ = (conn, fpdu);
    }
    /// A protocol error.
    fn violation(&mut self, violation: &Violation) {
        let _ = violation;
    }
    /// A note.
    fn note(&mut self, note: &Note) {
        let _ = note;
    }
}

/// The counts of a dissection, returned by [`dissect_to`](crate::dissect_to) at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// TCP connections.
    pub connections: usize,
    /// Connections that carry MPA.
    pub mpa_connections: usize,
    /// FPDUs over all connections.
    pub fpdus: usize,
    /// Violations.
    pub violations: usize,
    /// Notes.
    pub notes: usize,
    /// Violations by kind.
    pub violation_counts: std::collections::BTreeMap<ViolationKind, usize>,
}

impl Summary {
    /// "3 violations (2 bad CRC, 1 malformed frame)", or `None` without violations.
    pub fn violation_summary(&self) -> Option<String> {
        let counts: Vec<(ViolationKind, usize)> =
            self.violation_counts.iter().map(|(&k, &n)| (k, n)).collect();
        violation_summary(&counts)
    }
}

pub(crate) fn violation_summary(counts: &[(ViolationKind, usize)]) -> Option<String> {
    let n: usize = counts.iter().map(|(_, n)| n).sum();
    if n == 0 {
        return None;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    Some(format!("{n} violation{} ({})", if n == 1 { "" } else { "s" }, parts.join(", ")))
}

/// Lower-case hex of `bytes`, no separators.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn hex_bytes<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex(bytes))
}

fn hex_opt<S: serde::Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(b) => s.serialize_str(&hex(b)),
        None => s.serialize_none(),
    }
}
