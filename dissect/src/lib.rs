//! Packet-capture analysis: find the iWARP connections in a pcap/pcapng file and decode them.
//!
//! The pipeline: [`capture`] reads the file into packets, [`tcp`] decodes Ethernet/IP/TCP and
//! reassembles both directions of each TCP connection, and [`mpa`] finds the MPA
//! Request/Reply at the start of each connection's streams, then deframes every FPDU with the
//! negotiated CRC and marker settings, and [`ddp`] decodes each ULPDU as a DDP segment with
//! its RDMAP message (Read Request, Terminate, RFC 7306 bodies) and follows the message
//! sequence of each direction.
//!
//! The records come out as they are decoded, to a [`Sink`] ([`dissect_to`]): the capture, then
//! each connection followed by its FPDUs (both directions, in the order of the frames that
//! completed them) with the violations and notes about them, and at the end a [`Summary`] of
//! the counts. Memory stays proportional to the capture (its bytes and the reassembled TCP
//! streams), not to the number of FPDUs: `iwarp dissect` prints each record as it comes.
//! [`dissect`] collects everything into a [`Report`] instead: plain data (serializable with
//! serde), for tests and small captures.
//!
//! Findings come in two strengths: a [`Violation`] is a protocol error on the wire (a bad CRC,
//! a bad marker, a malformed frame, FPDU or DDP segment, an MSN gap, an MO jump, a Read
//! Response that does not match its request, a missing RTR, a responder that sends first);
//! a [`Note`] is something worth knowing that is not the peers' fault (a capture that starts
//! mid-connection or is truncated, a gap).
//!
//! ```no_run
//! let report = iwarp_dissect::dissect_file("trace.pcap".as_ref(), &Default::default()).unwrap();
//! println!("{} MPA connections, {} violations", report.mpa_connections(), report.violations.len());
//!
//! // Streaming: count the FPDUs without keeping them.
//! struct Count(usize);
//! impl iwarp_dissect::Sink for Count {
//!     fn fpdu(&mut self, _conn: usize, _fpdu: &iwarp_dissect::FpduInfo) {
//!         self.0 += 1;
//!     }
//! }
//! let bytes = std::fs::read("trace.pcap").unwrap();
//! let mut count = Count(0);
//! let summary = iwarp_dissect::dissect_to(&bytes, &Default::default(), &mut count).unwrap();
//! assert_eq!(count.0, summary.fpdus);
//! ```

pub mod capture;
pub mod ddp;
pub mod mpa;
pub mod tcp;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::Serialize;

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
/// [`Report`]: a [`Sink`] gets them one at a time, after the connection).
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

/// Receives a dissection's records as they are decoded ([`dissect_to`]): [`Sink::capture`]
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

/// The counts of a dissection, returned by [`dissect_to`] at the end.
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

fn violation_summary(counts: &[(ViolationKind, usize)]) -> Option<String> {
    let n: usize = counts.iter().map(|(_, n)| n).sum();
    if n == 0 {
        return None;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    Some(format!("{n} violation{} ({})", if n == 1 { "" } else { "s" }, parts.join(", ")))
}

/// Forwards records to a sink and counts them.
struct Counting<'a, S: ?Sized> {
    sink: &'a mut S,
    summary: Summary,
}

impl<S: Sink + ?Sized> Sink for Counting<'_, S> {
    fn capture(&mut self, capture: &CaptureInfo) {
        self.sink.capture(capture);
    }

    fn connection(&mut self, conn: &Connection) {
        self.summary.connections += 1;
        self.summary.mpa_connections += usize::from(conn.mpa);
        self.sink.connection(conn);
    }

    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        self.summary.fpdus += 1;
        self.sink.fpdu(conn, fpdu);
    }

    fn violation(&mut self, violation: &Violation) {
        self.summary.violations += 1;
        *self.summary.violation_counts.entry(violation.kind).or_insert(0) += 1;
        self.sink.violation(violation);
    }

    fn note(&mut self, note: &Note) {
        self.summary.notes += 1;
        self.sink.note(note);
    }
}

/// The result of dissecting a capture, every record kept (see [`dissect`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// pcap or pcapng.
    pub format: capture::Format,
    /// Packets read.
    pub packets: usize,
    /// Set when the file ended early or was damaged.
    pub truncated: Option<capture::Truncation>,
    /// Every TCP connection, in order of first appearance.
    pub connections: Vec<Connection>,
    /// Protocol errors.
    pub violations: Vec<Violation>,
    /// Everything else worth knowing.
    pub notes: Vec<Note>,
}

impl Report {
    /// Number of connections that carry MPA.
    pub fn mpa_connections(&self) -> usize {
        self.connections.iter().filter(|c| c.mpa).count()
    }

    /// Number of FPDUs over all connections.
    pub fn fpdus(&self) -> usize {
        self.connections.iter().map(|c| c.fpdus.len()).sum()
    }

    /// Violations counted by kind, in [`ViolationKind`] order.
    pub fn violation_counts(&self) -> Vec<(ViolationKind, usize)> {
        let mut counts = std::collections::BTreeMap::new();
        for v in &self.violations {
            *counts.entry(v.kind).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    /// "3 violations (2 bad CRC, 1 malformed frame)", or `None` without violations.
    pub fn violation_summary(&self) -> Option<String> {
        violation_summary(&self.violation_counts())
    }
}

/// Collects the records.
impl Sink for Report {
    fn capture(&mut self, capture: &CaptureInfo) {
        self.format = capture.format;
        self.packets = capture.packets;
        self.truncated.clone_from(&capture.truncated);
    }

    fn connection(&mut self, conn: &Connection) {
        self.connections.push(conn.clone());
    }

    fn fpdu(&mut self, conn: usize, fpdu: &FpduInfo) {
        if let Some(c) = self.connections.iter_mut().rev().find(|c| c.id == conn) {
            c.fpdus.push(fpdu.clone());
        }
    }

    fn violation(&mut self, violation: &Violation) {
        self.violations.push(violation.clone());
    }

    fn note(&mut self, note: &Note) {
        self.notes.push(note.clone());
    }
}

/// Dissects a capture held in memory, handing each record to `sink` as it is decoded; returns
/// the counts. Memory: the capture's packets and the reassembled TCP streams, plus one FPDU
/// being decoded and the sequence state of each connection (see [`ddp::Checker`]).
pub fn dissect_to<S: Sink + ?Sized>(
    bytes: &[u8],
    options: &Options,
    sink: &mut S,
) -> Result<Summary, DissectError> {
    let cap = capture::parse(bytes).map_err(|_| DissectError::NotACapture)?;
    let mut out = Counting { sink, summary: Summary::default() };
    let mut tracker = tcp::Tracker::new();
    let mut malformed = 0usize;
    let mut unsupported = std::collections::BTreeSet::new();
    for p in &cap.packets {
        match tcp::decode(p) {
            tcp::Decoded::Tcp(seg) => tracker.handle_segment(&seg),
            tcp::Decoded::Other => {}
            tcp::Decoded::UnsupportedLink(l) => {
                unsupported.insert(l);
            }
            tcp::Decoded::Malformed(_) => malformed += 1,
        }
    }
    out.capture(&CaptureInfo {
        format: cap.format,
        packets: cap.packets.len(),
        truncated: cap.truncated.clone(),
    });
    let note = |out: &mut Counting<'_, S>, message: String| out.note(&Note { conn: None, message });
    for l in unsupported {
        note(&mut out, format!("packets with unsupported link type {l} skipped"));
    }
    if malformed > 0 {
        note(&mut out, format!("{malformed} packets with undecodable headers skipped"));
    }
    if let Some(t) = &cap.truncated {
        note(&mut out, t.to_string());
    }
    for (i, conn) in tracker.into_connections().iter().enumerate() {
        mpa::analyse(i + 1, conn, options, &mut out);
    }
    if out.summary.mpa_connections == 0 {
        note(&mut out, "no MPA connection found".to_string());
    }
    Ok(out.summary)
}

/// Dissects a capture held in memory and keeps every record in a [`Report`].
pub fn dissect(bytes: &[u8], options: &Options) -> Result<Report, DissectError> {
    let mut report = Report {
        format: capture::Format::Pcap,
        packets: 0,
        truncated: None,
        connections: Vec::new(),
        violations: Vec::new(),
        notes: Vec::new(),
    };
    dissect_to(bytes, options, &mut report)?;
    Ok(report)
}

/// Reads and dissects a capture file into a [`Report`].
pub fn dissect_file(path: &Path, options: &Options) -> Result<Report, DissectError> {
    let bytes = std::fs::read(path).map_err(DissectError::Io)?;
    dissect(&bytes, options)
}

/// Reads a capture file and dissects it into `sink` (see [`dissect_to`]).
pub fn dissect_file_to<S: Sink + ?Sized>(
    path: &Path,
    options: &Options,
    sink: &mut S,
) -> Result<Summary, DissectError> {
    let bytes = std::fs::read(path).map_err(DissectError::Io)?;
    dissect_to(&bytes, options, sink)
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

/// Checks the records of a dissection as they come (see [`fuzz_dissect`]).
#[derive(Default)]
struct FuzzCheck {
    summary: Summary,
    /// The connection being reported and whether it carries MPA.
    current: Option<(usize, bool)>,
    /// Per direction of the current connection: the last FPDU index and the end of the last
    /// FPDU in the stream.
    last: [(usize, u64); 2],
}

impl Sink for FuzzCheck {
    fn connection(&mut self, conn: &Connection) {
        let expected = self.current.map_or(1, |(id, _)| id + 1);
        assert_eq!(conn.id, expected, "connections are numbered in order");
        assert!(conn.fpdus.is_empty(), "a connection record comes before its FPDUs");
        self.current = Some((conn.id, conn.mpa));
        self.last = [(0, 0); 2];
        self.summary.connections += 1;
    }

    fn fpdu(&mut self, conn: usize, f: &FpduInfo) {
        assert_eq!(self.current, Some((conn, true)), "an FPDU of the MPA connection just reported");
        let last = &mut self.last[usize::from(f.dir == Dir::ResponderToInitiator)];
        assert!(f.index > last.0, "FPDU #{} after #{}", f.index, last.0);
        assert!(f.offset >= last.1, "FPDU at {} overlaps the previous one (ends at {})", f.offset, last.1);
        *last = (f.index, f.offset + f.wire_len as u64);
        let content = iwarp_mpa::fpdu::fpdu_len(f.ulpdu_len);
        assert_eq!(f.pad, iwarp_mpa::fpdu::pad_len(f.ulpdu_len));
        assert_eq!(f.wire_len, content + 4 * f.markers.len(), "markers are inside the FPDU");
        assert_eq!(f.ulpdu.as_ref().map(Vec::len), Some(f.ulpdu_len), "the kept ULPDU is the ULPDU");
        assert_eq!(f.ddp.is_some(), f.ulpdu_len >= 2);
        if f.segment.is_some() {
            assert!(f.ddp.is_some() && !matches!(f.crc, CrcVerdict::Bad { .. }));
        }
        self.summary.fpdus += 1;
    }

    fn violation(&mut self, v: &Violation) {
        assert_eq!(
            Some(v.conn),
            self.current.map(|(id, _)| id),
            "a violation of the connection just reported"
        );
        self.summary.violations += 1;
    }

    fn note(&mut self, _: &Note) {
        self.summary.notes += 1;
    }
}

/// Fuzz entry point (fuzz/fuzz_targets/dissect.rs): dissects `bytes` as a capture file (capture
/// parsing, TCP reassembly, MPA, DDP and RDMAP decoding, ULPDUs kept) and checks the records
/// as they stream out: connections numbered in order, each FPDU after its connection's record,
/// FPDU indices increasing and FPDUs not overlapping within a direction, lengths, pad and
/// markers consistent, and counts that match the [`Summary`]. Panics only on a bug; returns
/// the summary (`None` when the bytes are not a capture).
#[doc(hidden)]
pub fn fuzz_dissect(bytes: &[u8]) -> Option<Summary> {
    let mut check = FuzzCheck::default();
    let summary = dissect_to(bytes, &Options { keep_ulpdu: true }, &mut check).ok()?;
    let seen =
        (check.summary.connections, check.summary.fpdus, check.summary.violations, check.summary.notes);
    assert_eq!(seen, (summary.connections, summary.fpdus, summary.violations, summary.notes));
    assert_eq!(summary.violation_counts.values().sum::<usize>(), summary.violations);
    Some(summary)
}
