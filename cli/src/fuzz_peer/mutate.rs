//! The cases of `iwarp fuzz-peer`: where in a conversation a case strikes ([`Point`]), the
//! well-formed message it starts from ([`Template`], built with the DDP and RDMAP encoders),
//! and the structure-aware mutations ([`Op`]) of the MPA Request or Reply, the FPDU framing,
//! the DDP header and the RDMAP message. A case follows from the run's seed and its index;
//! applying its operations never panics, whatever the bytes.

use std::fmt;

use iwarp::ddp::{HeaderRepr, Msn, QueueNumber, STag, SegmentKind, TaggedOffset, TerminateCode};
use iwarp::mpa::fpdu;
use iwarp::mpa::{IrdOrd, Policy, RtrTypes};
use iwarp::rdmap::{AtomicOp, AtomicRequest, Control, Opcode, ReadRequest, TerminateMessage};
use serde::Serialize;

use super::rng::Rng;

/// Which end of the connection this tool plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Side {
    /// `--target`: this tool initiates, the peer responds.
    Initiator,
    /// `--listen`: the peer initiates, this tool responds.
    Responder,
}

/// Where in the conversation a case strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Point {
    /// The MPA Request (or Reply) itself, or the connection right after the exchange.
    Handshake,
    /// The first FPDU after the handshake (with --listen: after the peer's first message).
    First,
    /// The second segment of a two-segment message.
    Mid,
    /// After a Read Request: the peer's (the mutated message is then a Read Response), or,
    /// with --listen, ours.
    Read,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Point::Handshake => "handshake",
            Point::First => "first",
            Point::Mid => "mid",
            Point::Read => "read",
        })
    }
}

/// A family of mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Layer {
    /// The MPA Request or Reply: revision, flags, PD_Length, the IRD/ORD word, the key.
    Mpa,
    /// FPDU framing: ULPDU_Length, pad, CRC, markers, TCP segmentation, repeats.
    Fpdu,
    /// The DDP header: T and L bits, version, reserved bits, STag, TO, QN, MSN, MO.
    Ddp,
    /// RDMAP: opcodes (reserved ones too), version, Read Request fields, Terminate and RFC 7306
    /// bodies, payload length.
    Rdmap,
    /// The connection: close or reset after the handshake or right after the case.
    Conn,
}

/// The well-formed message a case starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Template {
    /// A 16-byte Send: rping's buffer advertisement (initiator) or go-ahead (responder).
    Send,
    /// A 16-byte RDMA Write (to the peer's advertised buffer when there is one).
    Write,
    /// An RDMA Read Request.
    ReadRequest,
    /// The Read Response to the peer's Read Request.
    ReadResponse,
    /// A Terminate.
    Terminate,
    /// An RFC 7306 Atomic Request (FetchAdd).
    AtomicRequest,
    /// RFC 7306 Immediate Data.
    ImmediateData,
    /// ULPDU number N of the seed captures (its MSN fitted to the conversation).
    Seed(usize),
    /// Random bytes.
    Random(Vec<u8>),
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Template::Send => f.write_str("Send"),
            Template::Write => f.write_str("Write"),
            Template::ReadRequest => f.write_str("Read Request"),
            Template::ReadResponse => f.write_str("Read Response"),
            Template::Terminate => f.write_str("Terminate"),
            Template::AtomicRequest => f.write_str("Atomic Request"),
            Template::ImmediateData => f.write_str("Immediate Data"),
            Template::Seed(i) => write!(f, "seed ULPDU #{i}"),
            Template::Random(b) => write!(f, "{} random bytes", b.len()),
        }
    }
}

/// A registered buffer as the conversation knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buffer {
    /// STag.
    pub(crate) stag: u32,
    /// Tagged offset of its first byte.
    pub(crate) to: u64,
    /// Length.
    pub(crate) len: u32,
}

/// The buffer this tool advertises (it registers nothing: the values only look real).
pub(crate) const OUR_BUFFER: Buffer = Buffer { stag: 0x0000_4d01, to: 0x7f3a_1000_0000, len: 64 };
/// The STag used when the peer's buffer is unknown.
const SOME_STAG: u32 = 0x0000_2a01;
/// Longest Read Response payload a template carries.
const MAX_READ_RESPONSE: u32 = 4096;

/// What the conversation has learnt so far, for building templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conv {
    /// Which end this tool plays.
    pub(crate) side: Side,
    /// The next MSN this tool sends on each untagged queue.
    pub(crate) msn: [u32; 4],
    /// The buffer the peer advertised (rping's client start buffer).
    pub(crate) peer_buf: Option<Buffer>,
    /// The peer's Read Request.
    pub(crate) peer_read: Option<ReadRequest>,
}

impl Conv {
    /// A conversation at its start.
    pub(crate) fn new(side: Side) -> Conv {
        Conv { side, msn: [1; 4], peer_buf: None, peer_read: None }
    }

    /// The payload of the 16-byte Send: rping's `struct rping_rdma_info` advertising our
    /// buffer (address, STag, size, big-endian) as the initiator, a go-ahead of zeros as the
    /// responder.
    pub(crate) fn send_payload(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        if self.side == Side::Initiator {
            b[..8].copy_from_slice(&OUR_BUFFER.to.to_be_bytes());
            b[8..12].copy_from_slice(&OUR_BUFFER.stag.to_be_bytes());
            b[12..].copy_from_slice(&OUR_BUFFER.len.to_be_bytes());
        }
        b
    }

    /// Notes that a message went out on untagged queue `qn`.
    pub(crate) fn sent_on(&mut self, qn: usize) {
        if let Some(m) = self.msn.get_mut(qn) {
            *m = m.wrapping_add(1);
        }
    }

    /// A well-formed Send (the next on queue 0), whole.
    pub(crate) fn send(&self) -> Vec<u8> {
        untagged(Opcode::Send, 0, self.msn[0], 0, true, &self.send_payload())
    }

    /// A Read Request for the peer's buffer (or a made-up one) into ours.
    pub(crate) fn read_request(&self) -> Vec<u8> {
        let src = self.peer_buf.unwrap_or(Buffer { stag: SOME_STAG, to: 0x1000, len: 64 });
        let body = ReadRequest {
            sink_stag: OUR_BUFFER.stag,
            sink_to: OUR_BUFFER.to,
            size: src.len,
            source_stag: src.stag,
            source_to: src.to,
        };
        untagged(Opcode::ReadRequest, 1, self.msn[1], 0, true, &body.to_bytes())
    }

    /// The Read Response to the peer's Read Request (or to a made-up one).
    pub(crate) fn read_response(&self) -> Vec<u8> {
        let (stag, to, size) = match self.peer_read {
            Some(r) => (r.sink_stag, r.sink_to, r.size.min(MAX_READ_RESPONSE)),
            None => (SOME_STAG, 0, 64),
        };
        tagged(Opcode::ReadResponse, stag, to, true, &pattern(usize::try_from(size).unwrap_or(0)))
    }

    fn write(&self) -> Vec<u8> {
        let (stag, to) = self.peer_buf.map_or((1, 0), |b| (b.stag, b.to));
        tagged(Opcode::Write, stag, to, true, &pattern(16))
    }

    /// A message in two segments, the first well-formed (L clear) and the second the one a
    /// case at [`Point::Mid`] mutates: the 16-byte Send or Write.
    pub(crate) fn two_segments(&self, template: &Template) -> (Vec<u8>, Vec<u8>) {
        if *template == Template::Write {
            let (stag, to) = self.peer_buf.map_or((1, 0), |b| (b.stag, b.to));
            let data = pattern(16);
            (
                tagged(Opcode::Write, stag, to, false, &data[..8]),
                tagged(Opcode::Write, stag, to.wrapping_add(8), true, &data[8..]),
            )
        } else {
            let p = self.send_payload();
            (
                untagged(Opcode::Send, 0, self.msn[0], 0, false, &p[..8]),
                untagged(Opcode::Send, 0, self.msn[0], 8, true, &p[8..]),
            )
        }
    }

    /// The ULPDU of `template` in this conversation; `seeds` are the seed ULPDUs.
    pub(crate) fn build(&self, template: &Template, seeds: &[Vec<u8>]) -> Vec<u8> {
        match template {
            Template::Send => self.send(),
            Template::Write => self.write(),
            Template::ReadRequest => self.read_request(),
            Template::ReadResponse => self.read_response(),
            Template::Terminate => {
                let body = TerminateMessage::new(TerminateCode::rdmap(2, 0x06)).to_vec();
                untagged(Opcode::Terminate, 2, self.msn[2], 0, true, &body)
            }
            Template::AtomicRequest => {
                let target = self.peer_buf.unwrap_or(OUR_BUFFER);
                let body = AtomicRequest {
                    op: AtomicOp::FetchAdd,
                    request_id: 1,
                    remote_stag: STag(target.stag),
                    remote_to: TaggedOffset(target.to),
                    add_or_swap_data: 1,
                    add_or_swap_mask: 0,
                    compare_data: 0,
                    compare_mask: 0,
                };
                untagged(Opcode::AtomicRequest, 1, self.msn[1], 0, true, &body.to_bytes())
            }
            Template::ImmediateData => untagged(Opcode::ImmediateData, 0, self.msn[0], 0, true, &[0x11; 8]),
            Template::Seed(i) => {
                let mut u = seeds.get(*i).cloned().unwrap_or_default();
                // An untagged seed takes the MSN its queue expects next.
                if u.len() >= 18 && u[0] & 0x80 == 0 {
                    let qn = get_be(&u, 6, 4);
                    if let Some(&msn) = usize::try_from(qn).ok().and_then(|q| self.msn.get(q)) {
                        put_be(&mut u, 10, 4, u64::from(msn));
                    }
                }
                u
            }
            Template::Random(b) => b.clone(),
        }
    }
}

/// An untagged ULPDU.
pub(crate) fn untagged(op: Opcode, qn: u32, msn: u32, mo: u32, last: bool, payload: &[u8]) -> Vec<u8> {
    HeaderRepr {
        last,
        rdmap_control: Control::new(op).to_byte(),
        kind: SegmentKind::Untagged { rdmap_word: 0, qn: QueueNumber::from(qn), msn: Msn(msn), mo },
    }
    .with_payload(payload)
    .to_vec()
}

/// A tagged ULPDU.
pub(crate) fn tagged(op: Opcode, stag: u32, to: u64, last: bool, payload: &[u8]) -> Vec<u8> {
    HeaderRepr {
        last,
        rdmap_control: Control::new(op).to_byte(),
        kind: SegmentKind::Tagged { stag: STag(stag), to: TaggedOffset(to) },
    }
    .with_payload(payload)
    .to_vec()
}

/// The zero-length RDMA Write to STag 1 that siw sends as a Write RTR, and that this stack's
/// engine sends to nudge a silent peer (docs/siw-quirks.md).
pub(crate) fn zero_length_write() -> Vec<u8> {
    tagged(Opcode::Write, 1, 0, true, &[])
}

/// `n` bytes of a recognisable pattern.
pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| b"iwarp-fuzz-peer "[i % 16]).collect()
}

/// How a value is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Val {
    /// Set to this value (truncated to the field's width).
    Set(u64),
    /// Add this (wrapping) to the value the template had.
    Add(i64),
}

impl Val {
    fn apply(self, old: u64, width: usize) -> u64 {
        let mask = if width >= 8 { u64::MAX } else { (1u64 << (8 * width)) - 1 };
        let v = match self {
            Val::Set(v) => v,
            Val::Add(d) => old.wrapping_add_signed(d),
        };
        v & mask
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Set(v) => write!(f, "= 0x{v:x}"),
            Val::Add(d) => write!(f, "{d:+}"),
        }
    }
}

/// A DDP header field. Each has one place: the tagged fields are STag and TO, the untagged
/// ones the RDMAP word, QN, MSN and MO; a field of the other model overwrites the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// Bytes 2..6: the STag (tagged).
    Stag,
    /// Bytes 6..14: the tagged offset (tagged).
    To,
    /// Bytes 2..6: RDMAP's word, the Invalidate STag (untagged).
    Word,
    /// Bytes 6..10: the queue number (untagged).
    Qn,
    /// Bytes 10..14: the MSN (untagged).
    Msn,
    /// Bytes 14..18: the message offset (untagged).
    Mo,
}

impl Field {
    fn place(self) -> (usize, usize) {
        match self {
            Field::Stag | Field::Word => (2, 4),
            Field::To => (6, 8),
            Field::Qn => (6, 4),
            Field::Msn => (10, 4),
            Field::Mo => (14, 4),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Field::Stag => "STag",
            Field::To => "TO",
            Field::Word => "RDMAP word",
            Field::Qn => "QN",
            Field::Msn => "MSN",
            Field::Mo => "MO",
        }
    }
}

/// A field of the Read Request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RrField {
    /// Data sink STag.
    SinkStag,
    /// Data sink TO.
    SinkTo,
    /// RDMA Read message size.
    Size,
    /// Data source STag.
    SourceStag,
    /// Data source TO.
    SourceTo,
}

impl RrField {
    fn place(self) -> (usize, usize) {
        match self {
            RrField::SinkStag => (0, 4),
            RrField::SinkTo => (4, 8),
            RrField::Size => (12, 4),
            RrField::SourceStag => (16, 4),
            RrField::SourceTo => (20, 8),
        }
    }

    fn name(self) -> &'static str {
        match self {
            RrField::SinkStag => "sink STag",
            RrField::SinkTo => "sink TO",
            RrField::Size => "size",
            RrField::SourceStag => "source STag",
            RrField::SourceTo => "source TO",
        }
    }
}

/// How this tool ends a case's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// A FIN.
    Close,
    /// An RST (SO_LINGER 0).
    Reset,
}

/// One mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// MPA: the revision octet.
    FrameRevision(u8),
    /// MPA: flag bits flipped (M 0x80, C 0x40, R 0x20, H 0x10, reserved 0x0f).
    FrameFlags(u8),
    /// MPA: the PD_Length field, the bytes sent unchanged.
    FramePdLen(u16),
    /// MPA: the RFC 6581 IRD/ORD word (added, with H, when absent).
    FrameIrdOrd([u8; 4]),
    /// MPA: this many more bytes of private data (PD_Length follows).
    FramePrivateData(u16),
    /// MPA: a byte of the key flipped.
    FrameKey {
        /// Which of the 16 bytes.
        at: u8,
        /// The bits flipped.
        xor: u8,
    },
    /// MPA: only the first N bytes of the frame are sent.
    FrameCut(u16),
    /// Close right after the MPA exchange: no RTR, no FPDU.
    CloseAfterHandshake,
    /// Reset right after the MPA exchange.
    ResetAfterHandshake,
    /// Send the case's message without waiting for the peer's (a responder sending first).
    Early,
    /// No RTR after a peer-to-peer Reply: the case's message comes first.
    SkipRtr,
    /// End the connection right after the case's bytes, without waiting for an answer.
    End(End),
    /// FPDU: the ULPDU_Length field.
    Length(u16),
    /// FPDU: the ULPDU_Length field changed by this much.
    LengthDelta(i16),
    /// FPDU: the pad bytes set to this value (4 pad bytes added where there are none).
    Pad(u8),
    /// FPDU: CRC field bits flipped.
    Crc(u32),
    /// FPDU: a 4-byte marker-like word inserted at this offset.
    Marker {
        /// Offset in the FPDU.
        at: u16,
        /// The word.
        word: u32,
    },
    /// FPDU: this many bytes cut from its end.
    FpduCut(u16),
    /// The bytes written in this many pieces, a little apart (TCP segmentation).
    Split(u8),
    /// The FPDU sent this many more times.
    Repeat(u8),
    /// Bytes appended after the FPDU.
    Trailing(Vec<u8>),
    /// DDP: control octet bits flipped (T 0x80, L 0x40, reserved 0x3c, DV 0x03).
    DdpBits(u8),
    /// DDP: a header field.
    Field {
        /// Which.
        field: Field,
        /// How.
        value: Val,
    },
    /// The ULPDU cut to this many bytes.
    Truncate(u16),
    /// RDMAP: the opcode (reserved ones included).
    Opcode(u8),
    /// RDMAP: the version (RV).
    RdmapVersion(u8),
    /// RDMAP: a Read Request field.
    ReadRequestField {
        /// Which.
        field: RrField,
        /// How.
        value: Val,
    },
    /// RDMAP: the payload replaced with a Terminate body.
    TerminateBody {
        /// Control word (layer/type, code, flags, reserved).
        control: [u8; 4],
        /// What follows it (segment length, header copies), possibly cut short.
        tail: Vec<u8>,
    },
    /// RDMAP: the payload replaced with an RFC 7306 Atomic Request body (any length).
    AtomicBody(Vec<u8>),
    /// RDMAP: the payload replaced with Immediate Data of this length.
    ImmediateBody(u8),
    /// The payload resized to this length.
    PayloadLen(u16),
    /// A payload byte flipped.
    PayloadByte {
        /// Offset in the payload (modulo its length).
        at: u16,
        /// The bits flipped.
        xor: u8,
    },
}

impl Op {
    /// The family the operation belongs to.
    pub(crate) fn layer(&self) -> Layer {
        match self {
            Op::FrameRevision(_)
            | Op::FrameFlags(_)
            | Op::FramePdLen(_)
            | Op::FrameIrdOrd(_)
            | Op::FramePrivateData(_)
            | Op::FrameKey { .. }
            | Op::FrameCut(_) => Layer::Mpa,
            Op::CloseAfterHandshake | Op::ResetAfterHandshake | Op::Early | Op::SkipRtr | Op::End(_) => {
                Layer::Conn
            }
            Op::Length(_)
            | Op::LengthDelta(_)
            | Op::Pad(_)
            | Op::Crc(_)
            | Op::Marker { .. }
            | Op::FpduCut(_)
            | Op::Split(_)
            | Op::Repeat(_)
            | Op::Trailing(_) => Layer::Fpdu,
            Op::DdpBits(_) | Op::Field { .. } | Op::Truncate(_) => Layer::Ddp,
            Op::Opcode(_)
            | Op::RdmapVersion(_)
            | Op::ReadRequestField { .. }
            | Op::TerminateBody { .. }
            | Op::AtomicBody(_)
            | Op::ImmediateBody(_)
            | Op::PayloadLen(_)
            | Op::PayloadByte { .. } => Layer::Rdmap,
        }
    }
}

fn ddp_bits_name(x: u8) -> String {
    let mut parts = Vec::new();
    for (bit, name) in [(0x80, "T"), (0x40, "L")] {
        if x & bit != 0 {
            parts.push(name.to_string());
        }
    }
    if x & 0x3c != 0 {
        parts.push("reserved".to_string());
    }
    if x & 0x03 != 0 {
        parts.push("DV".to_string());
    }
    parts.join("+")
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::FrameRevision(v) => write!(f, "MPA revision {v}"),
            Op::FrameFlags(x) => write!(f, "MPA flags ^ 0x{x:02x}"),
            Op::FramePdLen(v) => write!(f, "MPA PD_Length = {v}"),
            Op::FrameIrdOrd(w) => write!(f, "MPA IRD/ORD word {}", iwarp_dissect::hex(w)),
            Op::FramePrivateData(n) => write!(f, "MPA private data +{n} bytes"),
            Op::FrameKey { at, xor } => write!(f, "MPA key byte {at} ^ 0x{xor:02x}"),
            Op::FrameCut(n) => write!(f, "MPA frame cut to {n} bytes"),
            Op::CloseAfterHandshake => f.write_str("close right after the MPA exchange (no RTR, no FPDU)"),
            Op::ResetAfterHandshake => f.write_str("reset right after the MPA exchange"),
            Op::Early => f.write_str("sent without waiting for the peer's message"),
            Op::SkipRtr => f.write_str("no RTR after the peer-to-peer Reply"),
            Op::End(End::Close) => f.write_str("close right after"),
            Op::End(End::Reset) => f.write_str("reset right after"),
            Op::Length(v) => write!(f, "FPDU ULPDU_Length = {v}"),
            Op::LengthDelta(d) => write!(f, "FPDU ULPDU_Length {d:+}"),
            Op::Pad(x) => write!(f, "FPDU pad bytes = 0x{x:02x}"),
            Op::Crc(x) => write!(f, "FPDU CRC ^ 0x{x:08x}"),
            Op::Marker { at, word } => write!(f, "FPDU marker-like word 0x{word:08x} inserted at {at}"),
            Op::FpduCut(n) => write!(f, "FPDU cut by {n} bytes"),
            Op::Split(n) => write!(f, "written in {n} pieces"),
            Op::Repeat(k) => write!(f, "sent {} times", u16::from(*k) + 1),
            Op::Trailing(b) => write!(f, "{} trailing bytes", b.len()),
            Op::DdpBits(x) => write!(f, "DDP control ^ 0x{x:02x} ({})", ddp_bits_name(*x)),
            Op::Field { field, value } => write!(f, "DDP {} {value}", field.name()),
            Op::Truncate(n) => write!(f, "ULPDU cut to {n} bytes"),
            Op::Opcode(v) => {
                write!(f, "RDMAP opcode 0x{v:x} ({})", iwarp_dissect::opcode_name(*v))
            }
            Op::RdmapVersion(v) => write!(f, "RDMAP version {v}"),
            Op::ReadRequestField { field, value } => write!(f, "Read Request {} {value}", field.name()),
            Op::TerminateBody { control, tail } => {
                write!(f, "Terminate body {} + {} bytes", iwarp_dissect::hex(control), tail.len())
            }
            Op::AtomicBody(b) => {
                write!(f, "Atomic Request body of {} bytes, op word 0x{:08x}", b.len(), get_be(b, 0, 4))
            }
            Op::ImmediateBody(n) => write!(f, "Immediate Data body of {n} bytes"),
            Op::PayloadLen(n) => write!(f, "payload {n} bytes"),
            Op::PayloadByte { at, xor } => write!(f, "payload byte {at} ^ 0x{xor:02x}"),
        }
    }
}

/// One case: where, from what, and the mutations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Case {
    /// Its index in the run (with the run's seed, it reproduces the case).
    pub(crate) index: u64,
    /// Where it strikes.
    pub(crate) point: Point,
    /// Whether the Request asks for CRC (initiator).
    pub(crate) crc: bool,
    /// Whether the Request offers peer-to-peer mode (initiator).
    pub(crate) p2p: bool,
    /// The message mutated (at the handshake: the message that follows, unmutated).
    pub(crate) template: Template,
    /// The mutations, in order.
    pub(crate) ops: Vec<Op>,
}

impl Case {
    /// The case with only the operations at `keep` (indices into `ops`).
    pub(crate) fn keeping(&self, keep: &[usize]) -> Case {
        let ops =
            self.ops.iter().enumerate().filter(|(i, _)| keep.contains(i)).map(|(_, o)| o.clone()).collect();
        Case { ops, ..self.clone() }
    }

    /// Whether the case has this operation.
    pub(crate) fn has(&self, op: &Op) -> bool {
        self.ops.contains(op)
    }

    /// How the case ends the connection right after its bytes, if it does.
    pub(crate) fn end(&self) -> Option<End> {
        self.ops.iter().find_map(|o| match o {
            Op::End(e) => Some(*e),
            _ => None,
        })
    }

    /// The operations as text.
    pub(crate) fn op_texts(&self) -> Vec<String> {
        self.ops.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "case {} at {}: {}", self.index, self.point, self.template)?;
        if self.crc {
            f.write_str(", CRC")?;
        }
        if self.p2p {
            f.write_str(", peer-to-peer")?;
        }
        let ops: Vec<String> = self.ops.iter().enumerate().map(|(i, o)| format!("[{i}] {o}")).collect();
        if ops.is_empty() { f.write_str("; no mutation") } else { write!(f, "; {}", ops.join("; ")) }
    }
}

/// Whether the Request asks for CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CrcChoice {
    /// Never.
    Off,
    /// Always.
    On,
    /// In about a third of the cases.
    Random,
}

/// What the generator may use.
#[derive(Debug, Clone)]
pub(crate) struct GenConfig {
    /// Which end this tool plays.
    pub(crate) side: Side,
    /// The points cases may strike at.
    pub(crate) points: Vec<Point>,
    /// The families of mutations allowed.
    pub(crate) layers: Vec<Layer>,
    /// CRC in the Request.
    pub(crate) crc: CrcChoice,
    /// Peer-to-peer mode offered in every Request.
    pub(crate) p2p: bool,
    /// How many seed ULPDUs there are.
    pub(crate) seeds: usize,
}

impl GenConfig {
    fn allows(&self, l: Layer) -> bool {
        self.layers.contains(&l)
    }

    /// The points a case can strike at with the layers allowed.
    pub(crate) fn eligible_points(&self) -> Vec<Point> {
        let frame = self.allows(Layer::Mpa) || self.allows(Layer::Conn);
        let fpdu = [Layer::Fpdu, Layer::Ddp, Layer::Rdmap, Layer::Conn].iter().any(|l| self.allows(*l));
        self.points.iter().copied().filter(|p| if *p == Point::Handshake { frame } else { fpdu }).collect()
    }
}

/// The case `index` of the run seeded with `seed`.
pub(crate) fn generate(cfg: &GenConfig, seed: u64, index: u64) -> Case {
    let mut rng = Rng::for_case(seed, index);
    let points = cfg.eligible_points();
    let point = if points.is_empty() { Point::First } else { rng.pick(&points) };
    let crc = match cfg.crc {
        CrcChoice::Off => false,
        CrcChoice::On => true,
        CrcChoice::Random => rng.chance(1, 3),
    };
    let template = choose_template(&mut rng, cfg, point);
    let n = 1 + usize::from(rng.chance(1, 2)) + usize::from(rng.chance(1, 4));
    let layers: Vec<Layer> = if point == Point::Handshake {
        [Layer::Mpa, Layer::Conn].into_iter().filter(|l| cfg.allows(*l)).collect()
    } else {
        [Layer::Fpdu, Layer::Ddp, Layer::Rdmap, Layer::Conn].into_iter().filter(|l| cfg.allows(*l)).collect()
    };
    let mut ops = Vec::new();
    for _ in 0..n {
        if layers.is_empty() {
            break;
        }
        let weights: Vec<(u32, Layer)> = layers
            .iter()
            .map(|l| {
                let w = match l {
                    Layer::Mpa => 6,
                    Layer::Fpdu => 3,
                    Layer::Ddp => 4,
                    Layer::Rdmap => 5,
                    Layer::Conn => 1,
                };
                (w, *l)
            })
            .collect();
        let Some(layer) = rng.weighted(&weights) else { break };
        let op = match layer {
            Layer::Mpa => frame_op(&mut rng, cfg.allows(Layer::Fpdu)),
            Layer::Conn => conn_op(&mut rng, point, cfg.side, cfg.p2p),
            Layer::Fpdu => fpdu_op(&mut rng),
            Layer::Ddp => ddp_op(&mut rng),
            Layer::Rdmap => rdmap_op(&mut rng, &template),
        };
        // One way of ending the connection per case.
        let ending = |o: &Op| matches!(o, Op::End(_) | Op::CloseAfterHandshake | Op::ResetAfterHandshake);
        if ending(&op) && ops.iter().any(ending) {
            continue;
        }
        ops.push(op);
    }
    Case { index, point, crc, p2p: cfg.p2p, template, ops }
}

fn choose_template(rng: &mut Rng, cfg: &GenConfig, point: Point) -> Template {
    use Template as T;
    let seed_w = if cfg.seeds > 0 { 3 } else { 0 };
    let choices: Vec<(u32, u8)> = match (cfg.side, point) {
        (Side::Initiator, Point::Handshake) => return T::Send,
        (Side::Responder, Point::Handshake) => return T::ReadRequest,
        (_, Point::Mid) => return if rng.chance(2, 5) { T::Write } else { T::Send },
        (Side::Initiator, Point::First) => {
            vec![(5, 0), (2, 1), (2, 2), (1, 4), (1, 5), (1, 6), (seed_w, 7), (1, 8)]
        }
        (Side::Initiator, Point::Read) => {
            vec![(6, 3), (1, 0), (1, 1), (1, 2), (1, 4), (seed_w.min(2), 7), (1, 8)]
        }
        (Side::Responder, Point::First) => {
            vec![(5, 2), (2, 0), (2, 1), (1, 4), (1, 5), (1, 6), (seed_w, 7), (1, 8)]
        }
        (Side::Responder, Point::Read) => vec![(3, 0), (2, 2), (2, 1), (1, 4), (seed_w.min(2), 7), (1, 8)],
    };
    match rng.weighted(&choices).unwrap_or(0) {
        1 => T::Write,
        2 => T::ReadRequest,
        3 => T::ReadResponse,
        4 => T::Terminate,
        5 => T::AtomicRequest,
        6 => T::ImmediateData,
        7 => T::Seed(rng.index(cfg.seeds)),
        8 => {
            let n = one_of(&[0usize, 1, 2, 13, 14, 18, 30, 64, 200], rng);
            T::Random(rng.bytes(n))
        }
        _ => T::Send,
    }
}

/// An MPA operation; `split`: segmenting the frame (an FPDU-layer operation) is allowed too.
fn frame_op(rng: &mut Rng, split: bool) -> Op {
    match rng.below(if split { 8 } else { 7 }) {
        0 => Op::FrameRevision(one_of(&[0, 1, 3, 4, 0x7f, 0x80, 0xff], rng)),
        1 => Op::FrameFlags(one_of(
            &[0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01, 0x0f, 0xff, rng.u8() | 1],
            rng,
        )),
        2 => Op::FramePdLen(one_of(
            &[0, 1, 2, 3, 5, 8, 251, 256, 257, 511, 512, 513, 1024, 0xffff, rng.u16()],
            rng,
        )),
        3 => {
            if rng.chance(1, 4) {
                let w = rng.u32().to_be_bytes();
                Op::FrameIrdOrd(w)
            } else {
                let word = IrdOrd {
                    ird: one_of(&[0, 1, 2, 16, 128, 0x3fff, rng.u16() & 0x3fff], rng),
                    ord: one_of(&[0, 1, 2, 16, 128, 0x3fff, rng.u16() & 0x3fff], rng),
                    peer_to_peer: rng.chance(1, 2),
                    rtr: RtrTypes { send: rng.chance(1, 2), write: rng.chance(1, 2), read: rng.chance(1, 2) },
                };
                Op::FrameIrdOrd(word.to_bytes())
            }
        }
        4 => Op::FramePrivateData(one_of(&[1, 3, 4, 248, 252, 253, 256, 257, 508, 512, 513, 1000], rng)),
        5 => Op::FrameKey { at: one_of(&[0, 4, 7, 12, 15, rng.u8() & 15], rng), xor: rng.u8() | 1 },
        6 => Op::FrameCut(one_of(&[0, 1, 8, 15, 16, 17, 19, 20, 21, 23], rng)),
        _ => Op::Split(one_of(&[2, 3, 5, 8, 20], rng)),
    }
}

fn conn_op(rng: &mut Rng, point: Point, side: Side, p2p: bool) -> Op {
    if point == Point::Handshake {
        return if rng.chance(2, 3) { Op::CloseAfterHandshake } else { Op::ResetAfterHandshake };
    }
    if p2p && side == Side::Initiator && point == Point::First && rng.chance(1, 3) {
        return Op::SkipRtr;
    }
    match rng.below(5) {
        0 | 1 => Op::End(End::Close),
        2 | 3 => Op::End(End::Reset),
        _ if side == Side::Responder || point == Point::Read => Op::Early,
        _ => Op::End(End::Close),
    }
}

fn fpdu_op(rng: &mut Rng) -> Op {
    match rng.below(10) {
        0 | 1 => Op::Length(one_of(
            &[0, 1, 2, 3, 13, 14, 17, 18, 19, 27, 45, 1442, 1500, 0x7fff, 0xfffe, 0xffff, rng.u16()],
            rng,
        )),
        2 => Op::LengthDelta(one_of(&[-18, -14, -8, -4, -2, -1, 1, 2, 3, 4, 8, 100], rng)),
        3 => Op::Pad(rng.u8() | 1),
        4 => Op::Crc(one_of(&[1, 0x8000_0000, 0xffff_ffff, rng.u32() | 1], rng)),
        5 => Op::Marker {
            at: one_of(&[0, 2, 4, 16, 20, rng.u16() & 63], rng),
            word: one_of(&[0, 1, rng.u32()], rng),
        },
        6 => Op::FpduCut(one_of(&[1, 2, 3, 4, 5, 8], rng)),
        7 => Op::Split(one_of(&[2, 3, 4, 8, 16], rng)),
        8 => Op::Repeat(one_of(&[1, 2, 3], rng)),
        _ => {
            let n = one_of(&[1usize, 2, 6, 18, 64], rng);
            Op::Trailing(rng.bytes(n))
        }
    }
}

fn ddp_op(rng: &mut Rng) -> Op {
    match rng.below(8) {
        0 | 1 => Op::DdpBits(one_of(&[0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x01, 0x02, 0x03, 0xc0], rng)),
        2 => Op::Truncate(one_of(&[0, 1, 2, 3, 6, 13, 14, 17, 18, 20], rng)),
        _ => {
            let field = one_of(&[Field::Stag, Field::To, Field::Word, Field::Qn, Field::Msn, Field::Mo], rng);
            let value = match field {
                Field::Stag => one_of(
                    &[
                        Val::Set(0),
                        Val::Set(1),
                        Val::Set(0xffff_ffff),
                        Val::Add(1),
                        Val::Add(-1),
                        Val::Add(0x100),
                        Val::Set(u64::from(rng.u32())),
                    ],
                    rng,
                ),
                Field::To => one_of(
                    &[
                        Val::Set(0),
                        Val::Set(u64::MAX),
                        Val::Set(u64::MAX - 15),
                        Val::Add(1),
                        Val::Add(-1),
                        Val::Add(4096),
                        Val::Add(1 << 32),
                        Val::Set(rng.next_u64()),
                    ],
                    rng,
                ),
                Field::Word => {
                    one_of(&[Val::Set(0xffff_ffff), Val::Set(1), Val::Set(u64::from(rng.u32()))], rng)
                }
                Field::Qn => one_of(
                    &[Val::Set(0), Val::Set(1), Val::Set(2), Val::Set(3), Val::Set(4), Val::Set(5)],
                    rng,
                )
                .max_with(rng, &[Val::Set(0xffff_ffff), Val::Set(0x8000_0000)]),
                Field::Msn => one_of(
                    &[
                        Val::Add(1),
                        Val::Add(-1),
                        Val::Add(2),
                        Val::Set(0),
                        Val::Set(0xffff_ffff),
                        Val::Add(1 << 31),
                        Val::Set(u64::from(rng.u32())),
                    ],
                    rng,
                ),
                Field::Mo => one_of(
                    &[
                        Val::Set(1),
                        Val::Set(8),
                        Val::Set(16),
                        Val::Set(4096),
                        Val::Set(0xffff_fff0),
                        Val::Set(0xffff_ffff),
                        Val::Set(u64::from(rng.u32())),
                    ],
                    rng,
                ),
            };
            Op::Field { field, value }
        }
    }
}

/// One of `items` (not empty); the items come first so that they may draw from `rng` too.
fn one_of<T: Copy>(items: &[T], rng: &mut Rng) -> T {
    rng.pick(items)
}

impl Val {
    /// This value, or (one time in four) one of `big`.
    fn max_with(self, rng: &mut Rng, big: &[Val]) -> Val {
        if rng.chance(1, 4) { rng.pick(big) } else { self }
    }
}

/// Terminate codes that RFC 5040 and RFC 5044 define: (layer, type, code).
const DEFINED_CODES: [(u8, u8, u8); 12] = [
    (0, 0, 0x00),
    (0, 1, 0x00),
    (0, 1, 0x02),
    (0, 2, 0x05),
    (0, 2, 0x06),
    (0, 2, 0x07),
    (1, 1, 0x00),
    (1, 2, 0x01),
    (1, 2, 0x03),
    (1, 2, 0x06),
    (2, 0, 0x02),
    (2, 0, 0x07),
];

fn terminate_body(rng: &mut Rng) -> Op {
    let flags = one_of(&[0u8, 0x80, 0x40, 0xc0, 0xe0, 0x20, 0x01, 0x02, 0x03, 0x07, 0xff], rng);
    let control = if rng.chance(2, 3) {
        let (layer, ty, code) = rng.pick(&DEFINED_CODES);
        // The RFC layout, or siw's bit-field layout (docs/protocol-notes.md#siws-bit-field-layout).
        let lt = if rng.chance(1, 2) { layer << 4 | ty } else { ty << 4 | layer };
        [lt, code, flags, one_of(&[0, 0, 0xff], rng)]
    } else {
        [rng.u8(), rng.u8(), flags, rng.u8()]
    };
    let mut tail = Vec::new();
    tail.extend_from_slice(&one_of(&[0u16, 14, 18, 34, 46, 0xffff, rng.u16()], rng).to_be_bytes());
    match rng.below(3) {
        0 => tail.extend_from_slice(&tagged(Opcode::Write, 1, 0, true, &[])),
        1 => tail.extend_from_slice(&untagged(Opcode::ReadRequest, 1, 1, 0, true, &[])),
        _ => tail.extend(rng.bytes(18)),
    }
    tail.extend(rng.bytes(28));
    let keep = one_of(&[0usize, 2, 16, 20, 22, 48, tail.len()], rng);
    tail.truncate(keep);
    Op::TerminateBody { control, tail }
}

fn rdmap_op(rng: &mut Rng, template: &Template) -> Op {
    let body_w = |t: &Template| match t {
        Template::ReadRequest => (6, 0, 0, 0),
        Template::Terminate => (0, 6, 0, 0),
        Template::AtomicRequest => (0, 1, 5, 0),
        Template::ImmediateData => (0, 1, 0, 4),
        _ => (1, 1, 1, 1),
    };
    let (rr, term, atomic, imm) = body_w(template);
    let choice = rng.weighted(&[(4, 0u8), (1, 1), (rr, 2), (term, 3), (atomic, 4), (imm, 5), (2, 6), (1, 7)]);
    match choice.unwrap_or(0) {
        1 => Op::RdmapVersion(one_of(&[0, 2, 3], rng)),
        2 => {
            let field = one_of(
                &[RrField::SinkStag, RrField::SinkTo, RrField::Size, RrField::SourceStag, RrField::SourceTo],
                rng,
            );
            let value = match field {
                RrField::Size => one_of(
                    &[
                        Val::Set(0),
                        Val::Set(1),
                        Val::Set(65536),
                        Val::Set(1 << 20),
                        Val::Set(0x7fff_ffff),
                        Val::Set(0xffff_ffff),
                        Val::Add(1),
                    ],
                    rng,
                ),
                RrField::SinkTo | RrField::SourceTo => one_of(
                    &[
                        Val::Set(0),
                        Val::Set(u64::MAX),
                        Val::Set(u64::MAX - 7),
                        Val::Add(1),
                        Val::Add(-1),
                        Val::Add(1 << 32),
                    ],
                    rng,
                ),
                RrField::SinkStag | RrField::SourceStag => one_of(
                    &[
                        Val::Set(0),
                        Val::Set(1),
                        Val::Add(1),
                        Val::Add(0x100),
                        Val::Set(0xffff_ffff),
                        Val::Set(u64::from(rng.u32())),
                    ],
                    rng,
                ),
            };
            Op::ReadRequestField { field, value }
        }
        3 => terminate_body(rng),
        4 => {
            let req = AtomicRequest {
                op: AtomicOp::from_u32(one_of(&[0, 1, 2, 3, 0xf, 0xffff_fff0, rng.u32()], rng)),
                request_id: rng.u32(),
                remote_stag: STag(one_of(&[0, 1, OUR_BUFFER.stag, rng.u32()], rng)),
                remote_to: TaggedOffset(one_of(
                    &[0, OUR_BUFFER.to, OUR_BUFFER.to + 3, u64::MAX - 7, rng.next_u64()],
                    rng,
                )),
                add_or_swap_data: rng.next_u64(),
                add_or_swap_mask: one_of(&[0, u64::MAX, rng.next_u64()], rng),
                compare_data: rng.next_u64(),
                compare_mask: one_of(&[0, u64::MAX, rng.next_u64()], rng),
            };
            let mut b = req.to_bytes().to_vec();
            b.resize(one_of(&[52usize, 52, 51, 0, 4, 53, 64], rng), 0);
            Op::AtomicBody(b)
        }
        5 => Op::ImmediateBody(one_of(&[0, 1, 7, 9, 16, 64], rng)),
        6 => Op::PayloadLen(one_of(&[0, 1, 8, 15, 17, 27, 29, 51, 53, 1400, 1442, 1500, 4096, 9000], rng)),
        7 => Op::PayloadByte { at: rng.u16() & 63, xor: rng.u8() | 1 },
        _ => {
            // Reserved opcodes and the RFC 7306 ones weigh more than the others.
            let w: Vec<(u32, u8)> = (0u8..16)
                .map(|o| {
                    (
                        if o >= 0xc {
                            3
                        } else if o >= 8 {
                            2
                        } else {
                            1
                        },
                        o,
                    )
                })
                .collect();
            Op::Opcode(rng.weighted(&w).unwrap_or(0xc))
        }
    }
}

/// Hand-written cases that reproduce known findings deliberately (`--recipe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Recipe {
    /// A peer-to-peer Request (Write and Read RTRs offered), the Reply, then a close (FIN)
    /// before the RTR. siw may read the FIN as the end of a good first frame and report the
    /// connection established first, and then survives (docs/fuzz-peer.md).
    CloseAfterReply,
    /// As close-after-reply, with a reset instead of a FIN: crashes Linux 6.1's iw_cm
    /// (`BUG()` in cm_close_handler) behind any siw responder (docs/fuzz-peer.md).
    ResetAfterReply,
    /// A peer-to-peer Request, the Reply, then a Terminate instead of the RTR, and a close
    /// (docs/fuzz-peer.md: what crashes Linux 6.1's iw_cm; the interop suite's p2p-send case
    /// does the same).
    TerminateInsteadOfRtr,
    /// A reserved RDMAP opcode in the very first FPDU: the header fails to parse before the
    /// receive path has an FPDU context (the path of the NULL dereference fixed in siw's
    /// header processing; see docs/fuzz-peer.md).
    ReservedOpcodeFirst,
    /// The MPA frame (Request, or with --listen the Reply) claims 513 bytes of private data,
    /// one more than RFC 5044 allows (with --listen: crashes Linux 6.1's siw initiator; see
    /// docs/fuzz-peer.md).
    OversizedPrivateData,
}

impl Recipe {
    /// The recipe as case `index`.
    pub(crate) fn case(self, index: u64, crc: bool) -> Case {
        match self {
            Recipe::CloseAfterReply => Case {
                index,
                point: Point::Handshake,
                crc,
                p2p: true,
                template: Template::Send,
                ops: vec![Op::CloseAfterHandshake],
            },
            Recipe::ResetAfterReply => Case {
                index,
                point: Point::Handshake,
                crc,
                p2p: true,
                template: Template::Send,
                ops: vec![Op::ResetAfterHandshake],
            },
            Recipe::TerminateInsteadOfRtr => Case {
                index,
                point: Point::First,
                crc,
                p2p: true,
                template: Template::Terminate,
                ops: vec![Op::SkipRtr, Op::End(End::Close)],
            },
            Recipe::ReservedOpcodeFirst => Case {
                index,
                point: Point::First,
                crc,
                p2p: false,
                template: Template::Send,
                ops: vec![Op::Opcode(0xc)],
            },
            Recipe::OversizedPrivateData => Case {
                index,
                point: Point::Handshake,
                crc,
                p2p: false,
                template: Template::Send,
                ops: vec![Op::FramePdLen(513)],
            },
        }
    }
}

/// The known finding (docs/fuzz-peer.md#findings) a case would trigger again in Linux 6.1's siw,
/// if any (`--skip-known` leaves such cases out).
pub(crate) fn known_finding(side: Side, case: &Case) -> Option<&'static str> {
    match side {
        // siw's initiator reads a Reply's PD_Length and, above 512, hands iw_cm a NULL private
        // data pointer with a non-zero length.
        // A Reply cut short has its header completed by the FPDU that follows (the Read Request,
        // `00 2e 41 41`: PD_Length 0x2e41).
        Side::Responder if case.point == Point::Handshake => {
            let mut reply =
                Policy { ird: 1, ord: 1, ..Policy::default() }.request(&[]).ok()?.to_vec().ok()?;
            apply_frame(&mut reply, &case.ops);
            if reply.len() < 20 && !case.has(&Op::CloseAfterHandshake) && !case.has(&Op::ResetAfterHandshake)
            {
                let next = Conv::new(Side::Responder).read_request();
                reply.extend(iwarp::mpa::Framer::new(false, false).frame_to_vec(&next).ok()?);
            }
            // PD_Length above 512, or above the private data that follows.
            let claimed = get_be(&reply, 18, 2);
            let carried = u64::try_from(reply.len().saturating_sub(20)).unwrap_or(u64::MAX);
            (reply.len() >= 20 && (claimed > 512 || claimed > carried))
                .then_some("siw-reply-private-data-length")
        }
        Side::Responder => None,
        // siw's Reply keeps the Request's flag bits: H with a revision below 2 comes back as a
        // Reply with H set and no IRD/ORD word.
        Side::Initiator
            if case.point == Point::Handshake && {
                let mut request =
                    Policy { ird: 1, ord: 1, ..Policy::default() }.request(&[]).ok()?.to_vec().ok()?;
                apply_frame(&mut request, &case.ops);
                request.len() >= 20 && request[16] & 0x10 != 0 && request[17] < 2
            } =>
        {
            Some("siw-reply-echoes-h")
        }
        // iw_cm reaches BUG() when a peer-to-peer connection ends before siw has seen its RTR.
        // Any siw responder agrees to peer-to-peer when the Request's IRD/ORD word asks for it.
        Side::Initiator => {
            let offered = case.p2p || {
                let mut request =
                    Policy { ird: 1, ord: 1, ..Policy::default() }.request(&[]).ok()?.to_vec().ok()?;
                if case.point == Point::Handshake {
                    apply_frame(&mut request, &case.ops);
                }
                request.len() >= 24 && request[16] & 0x10 != 0 && request[17] == 2 && request[20] & 0x80 != 0
            };
            (offered
                && [Op::CloseAfterHandshake, Op::ResetAfterHandshake, Op::SkipRtr]
                    .iter()
                    .any(|o| case.has(o)))
            .then_some("iwcm-close-before-rtr")
        }
    }
}

// --- applying the operations ----------------------------------------------------------------

/// The big-endian value of `width` bytes at `at` (missing bytes read as zero).
pub(crate) fn get_be(buf: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    for i in 0..width.min(8) {
        b[8 - width.min(8) + i] = buf.get(at + i).copied().unwrap_or(0);
    }
    u64::from_be_bytes(b)
}

/// Writes the low `width` bytes of `v` big-endian at `at`, growing `buf` as needed.
pub(crate) fn put_be(buf: &mut Vec<u8>, at: usize, width: usize, v: u64) {
    let width = width.min(8);
    if buf.len() < at + width {
        buf.resize(at + width, 0);
    }
    buf[at..at + width].copy_from_slice(&v.to_be_bytes()[8 - width..]);
}

fn header_len(u: &[u8]) -> usize {
    if u.first().is_some_and(|b| b & 0x80 != 0) { 14 } else { 18 }
}

fn fill(n: usize) -> impl Iterator<Item = u8> {
    pattern(n).into_iter()
}

/// Applies the MPA operations to a Request or Reply frame.
pub(crate) fn apply_frame(frame: &mut Vec<u8>, ops: &[Op]) {
    const FLAGS: usize = 16;
    const REV: usize = 17;
    const PD_LEN: usize = 18;
    if frame.len() < 20 {
        frame.resize(20, 0);
    }
    let add_pd = |frame: &mut Vec<u8>, n: u16| {
        let pd = get_be(frame, PD_LEN, 2);
        put_be(frame, PD_LEN, 2, pd.wrapping_add(u64::from(n)));
    };
    for op in ops {
        match op {
            Op::FrameIrdOrd(w) => {
                if frame[FLAGS] & 0x10 != 0 && frame.len() >= 24 {
                    frame[20..24].copy_from_slice(w);
                } else {
                    frame.splice(20..20, w.iter().copied());
                    frame[FLAGS] |= 0x10;
                    add_pd(frame, 4);
                }
            }
            Op::FramePrivateData(n) => {
                frame.extend(fill(usize::from(*n)));
                add_pd(frame, *n);
            }
            _ => {}
        }
    }
    for op in ops {
        match op {
            Op::FrameRevision(v) => frame[REV] = *v,
            Op::FrameFlags(x) => frame[FLAGS] ^= x,
            Op::FrameKey { at, xor } => frame[usize::from(at % 16)] ^= xor,
            _ => {}
        }
    }
    for op in ops {
        match op {
            Op::FramePdLen(v) => put_be(frame, PD_LEN, 2, u64::from(*v)),
            Op::FrameCut(n) => frame.truncate(usize::from(*n)),
            _ => {}
        }
    }
}

/// Applies the DDP and RDMAP operations to a ULPDU: bodies first, then header fields, then
/// truncation.
pub(crate) fn apply_ulpdu(u: &mut Vec<u8>, ops: &[Op]) {
    for op in ops {
        let hlen = header_len(u);
        if u.len() < hlen
            && matches!(op.layer(), Layer::Rdmap)
            && !matches!(op, Op::Opcode(_) | Op::RdmapVersion(_))
        {
            u.resize(hlen, 0);
        }
        match op {
            Op::ReadRequestField { field, value } => {
                let (off, w) = field.place();
                let old = get_be(u, hlen + off, w);
                put_be(u, hlen + off, w, value.apply(old, w));
            }
            Op::TerminateBody { control, tail } => {
                u.truncate(hlen);
                u.extend_from_slice(control);
                u.extend_from_slice(tail);
            }
            Op::AtomicBody(b) => {
                u.truncate(hlen);
                u.extend_from_slice(b);
            }
            Op::ImmediateBody(n) => {
                u.truncate(hlen);
                u.extend(fill(usize::from(*n)));
            }
            Op::PayloadLen(n) => {
                let n = usize::from(*n);
                if u.len() > hlen + n {
                    u.truncate(hlen + n);
                } else {
                    let have = u.len() - hlen;
                    u.extend(fill(n).skip(have));
                }
            }
            Op::PayloadByte { at, xor } => {
                let plen = u.len().saturating_sub(hlen);
                if plen > 0 {
                    u[hlen + usize::from(*at) % plen] ^= xor;
                }
            }
            _ => {}
        }
    }
    for op in ops {
        if u.len() < 2
            && matches!(op, Op::DdpBits(_) | Op::Opcode(_) | Op::RdmapVersion(_) | Op::Field { .. })
        {
            u.resize(2, 0);
        }
        match op {
            Op::DdpBits(x) => u[0] ^= x,
            Op::Opcode(v) => u[1] = (u[1] & 0xf0) | (v & 0x0f),
            Op::RdmapVersion(v) => u[1] = (u[1] & 0x3f) | ((v & 0x03) << 6),
            Op::Field { field, value } => {
                let (off, w) = field.place();
                let old = get_be(u, off, w);
                put_be(u, off, w, value.apply(old, w));
            }
            _ => {}
        }
    }
    for op in ops {
        if let Op::Truncate(n) = op {
            u.truncate(usize::from(*n));
        }
    }
}

/// Applies the framing operations to an FPDU that carries `ulpdu_len` bytes (length field,
/// ULPDU, pad, CRC).
pub(crate) fn apply_fpdu(f: &mut Vec<u8>, ulpdu_len: usize, ops: &[Op]) {
    for op in ops {
        if f.len() < 2 && matches!(op, Op::Length(_) | Op::LengthDelta(_)) {
            f.resize(2, 0);
        }
        match op {
            Op::Length(v) => f[..2].copy_from_slice(&v.to_be_bytes()),
            Op::LengthDelta(d) => {
                let old = u16::from_be_bytes([f[0], f[1]]);
                f[..2].copy_from_slice(&old.wrapping_add_signed(*d).to_be_bytes());
            }
            Op::Pad(x) => {
                let crc_at = f.len().saturating_sub(fpdu::CRC_LEN);
                let pad = fpdu::pad_len(ulpdu_len);
                if pad > 0 {
                    for b in &mut f[crc_at.saturating_sub(pad)..crc_at] {
                        *b = *x;
                    }
                } else {
                    f.splice(crc_at..crc_at, [*x; 4]);
                }
            }
            Op::Crc(x) => {
                let at = f.len().saturating_sub(fpdu::CRC_LEN);
                for (b, m) in f[at..].iter_mut().zip(x.to_be_bytes()) {
                    *b ^= m;
                }
            }
            Op::Marker { at, word } => {
                let at = usize::from(*at) % (f.len() + 1);
                f.splice(at..at, word.to_be_bytes());
            }
            Op::FpduCut(n) => f.truncate(f.len().saturating_sub(usize::from(*n))),
            _ => {}
        }
    }
}

/// The writes that deliver `bytes` under the delivery operations (repeats, trailing bytes,
/// splitting into pieces).
pub(crate) fn deliver(mut bytes: Vec<u8>, ops: &[Op]) -> Vec<Vec<u8>> {
    for op in ops {
        match op {
            Op::Repeat(k) => bytes = bytes.repeat(usize::from(*k) + 1),
            Op::Trailing(t) => bytes.extend_from_slice(t),
            _ => {}
        }
    }
    let pieces = ops
        .iter()
        .find_map(|o| match o {
            Op::Split(n) => Some(usize::from(*n).max(1)),
            _ => None,
        })
        .unwrap_or(1);
    if bytes.is_empty() {
        return vec![bytes];
    }
    let size = bytes.len().div_ceil(pieces).max(1);
    bytes.chunks(size).map(<[u8]>::to_vec).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::mpa::{Framer, Policy};

    fn cfg(side: Side) -> GenConfig {
        GenConfig {
            side,
            points: vec![Point::Handshake, Point::First, Point::Mid, Point::Read],
            layers: vec![Layer::Mpa, Layer::Fpdu, Layer::Ddp, Layer::Rdmap, Layer::Conn],
            crc: CrcChoice::Random,
            p2p: false,
            seeds: 2,
        }
    }

    fn conv() -> Conv {
        let mut c = Conv::new(Side::Initiator);
        c.peer_read = Some(ReadRequest {
            sink_stag: 0x1100,
            sink_to: 0x5000,
            size: 64,
            source_stag: OUR_BUFFER.stag,
            source_to: OUR_BUFFER.to,
        });
        c
    }

    #[test]
    fn generation_is_reproducible() {
        let c = cfg(Side::Initiator);
        for i in 0..200 {
            assert_eq!(generate(&c, 42, i), generate(&c, 42, i));
        }
        let distinct: std::collections::HashSet<String> =
            (0..200).map(|i| generate(&c, 42, i).to_string()).collect();
        assert!(distinct.len() > 150, "{}", distinct.len());
    }

    #[test]
    fn generation_respects_points_and_layers() {
        let mut c = cfg(Side::Responder);
        c.layers = vec![Layer::Rdmap];
        c.points = vec![Point::Handshake, Point::Read];
        assert_eq!(c.eligible_points(), vec![Point::Read]);
        for i in 0..500 {
            let case = generate(&c, 9, i);
            assert_eq!(case.point, Point::Read);
            assert!(!case.ops.is_empty());
            assert!(case.ops.iter().all(|o| o.layer() == Layer::Rdmap), "{case}");
        }
        c.layers = vec![Layer::Mpa];
        c.points = vec![Point::Handshake, Point::First];
        assert_eq!(c.eligible_points(), vec![Point::Handshake]);
        for i in 0..200 {
            let case = generate(&c, 9, i);
            assert!(case.ops.iter().all(|o| o.layer() == Layer::Mpa), "{case}");
        }
        // Every family turns up, and reserved opcodes are among the RDMAP mutations.
        let c = cfg(Side::Initiator);
        let ops: Vec<Op> = (0..2000).flat_map(|i| generate(&c, 1, i).ops).collect();
        for l in [Layer::Mpa, Layer::Fpdu, Layer::Ddp, Layer::Rdmap, Layer::Conn] {
            assert!(ops.iter().any(|o| o.layer() == l), "{l:?}");
        }
        assert!(ops.iter().any(|o| matches!(o, Op::Opcode(0xc..=0xf))));
        assert!(ops.iter().any(|o| matches!(o, Op::TerminateBody { .. })));
        assert!(ops.iter().any(|o| matches!(o, Op::AtomicBody(_))));
        assert!(ops.iter().any(|o| matches!(o, Op::ReadRequestField { field: RrField::Size, .. })));
    }

    #[test]
    fn applying_never_panics() {
        let seeds = vec![vec![0x41, 0x43], vec![0xc1; 40]];
        for side in [Side::Initiator, Side::Responder] {
            let c = cfg(side);
            let mut conv = conv();
            conv.side = side;
            conv.peer_buf = Some(Buffer { stag: 0x99, to: 0x1000, len: 16 });
            for i in 0..5000 {
                let case = generate(&c, 3, i);
                let mut frame = Policy::default().request(b"pd").unwrap().to_vec().unwrap();
                apply_frame(&mut frame, &case.ops);
                let mut u = conv.build(&case.template, &seeds);
                apply_ulpdu(&mut u, &case.ops);
                let mut f = Framer::new(case.crc, false).frame_to_vec(&u[..u.len().min(65535)]).unwrap();
                apply_fpdu(&mut f, u.len(), &case.ops);
                let writes = deliver(f.clone(), &case.ops);
                let sent: usize = writes.iter().map(Vec::len).sum();
                assert!(sent >= f.len(), "{case}");
                // The case's text names every operation.
                assert_eq!(case.op_texts().len(), case.ops.len());
            }
        }
        // Degenerate inputs.
        for op in generate(&cfg(Side::Initiator), 5, 0).ops {
            let mut empty = Vec::new();
            apply_ulpdu(&mut empty, std::slice::from_ref(&op));
            let mut e = Vec::new();
            apply_fpdu(&mut e, 0, std::slice::from_ref(&op));
            let mut fr = Vec::new();
            apply_frame(&mut fr, std::slice::from_ref(&op));
        }
    }

    #[test]
    fn ddp_and_rdmap_operations_change_the_right_bytes() {
        let conv = conv();
        let send = conv.send();
        assert_eq!(&send[..2], &[0x41, 0x43]);
        let mut u = send.clone();
        apply_ulpdu(&mut u, &[Op::Opcode(0xd)]);
        assert_eq!(&u[..2], &[0x41, 0x4d]);
        let mut u = send.clone();
        apply_ulpdu(&mut u, &[Op::Field { field: Field::Msn, value: Val::Add(1) }]);
        assert_eq!(get_be(&u, 10, 4), 2);
        let mut u = send.clone();
        apply_ulpdu(&mut u, &[Op::Field { field: Field::Qn, value: Val::Set(4) }, Op::RdmapVersion(2)]);
        assert_eq!((get_be(&u, 6, 4), u[1]), (4, 0x83));
        let mut u = send.clone();
        apply_ulpdu(&mut u, &[Op::DdpBits(0x80)]);
        assert_eq!(u[0], 0xc1);
        assert_eq!(u.len(), send.len());
        let mut u = send.clone();
        apply_ulpdu(&mut u, &[Op::Truncate(13), Op::PayloadLen(2)]);
        assert_eq!(u.len(), 13);

        let rr = conv.read_request();
        let mut u = rr.clone();
        apply_ulpdu(&mut u, &[Op::ReadRequestField { field: RrField::Size, value: Val::Set(0xffff_ffff) }]);
        let body = ReadRequest::parse(&u[18..]).unwrap();
        assert_eq!(body.size, 0xffff_ffff);
        assert_eq!(body.sink_stag, OUR_BUFFER.stag);

        let resp = conv.read_response();
        assert_eq!(&resp[..6], &[0xc1, 0x42, 0, 0, 0x11, 0]);
        assert_eq!(resp.len(), 14 + 64);

        let mut u = send.clone();
        apply_ulpdu(
            &mut u,
            &[Op::Opcode(7), Op::TerminateBody { control: [0x12, 0x01, 0xc0, 0], tail: vec![0, 18] }],
        );
        assert_eq!(&u[18..], &[0x12, 0x01, 0xc0, 0, 0, 18]);
        let mut u = send;
        apply_ulpdu(&mut u, &[Op::PayloadLen(20), Op::ImmediateBody(9)]);
        assert_eq!(u.len(), 18 + 9);
    }

    #[test]
    fn framing_operations_change_the_right_bytes() {
        let u = conv().send();
        let f = Framer::new(true, false).frame_to_vec(&u).unwrap();
        assert_eq!(f.len(), 2 + 34 + 4);
        let mut g = f.clone();
        apply_fpdu(&mut g, u.len(), &[Op::Length(3)]);
        assert_eq!(&g[..2], &[0, 3]);
        let mut g = f.clone();
        apply_fpdu(&mut g, u.len(), &[Op::LengthDelta(-1)]);
        assert_eq!(&g[..2], &[0, 33]);
        let mut g = f.clone();
        apply_fpdu(&mut g, u.len(), &[Op::Crc(0xff)]);
        assert_eq!(g[..g.len() - 1], f[..f.len() - 1]);
        assert_eq!(g[g.len() - 1], f[f.len() - 1] ^ 0xff);
        // No pad: four pad bytes appear before the CRC; three: they change.
        let mut g = f.clone();
        apply_fpdu(&mut g, u.len(), &[Op::Pad(0xaa)]);
        assert_eq!((g.len(), &g[36..40], &g[40..]), (44, &[0xaa; 4][..], &f[36..]));
        let short = untagged(Opcode::Send, 0, 1, 0, true, b"x");
        let f3 = Framer::new(false, false).frame_to_vec(&short).unwrap();
        let mut g = f3.clone();
        apply_fpdu(&mut g, short.len(), &[Op::Pad(0xaa)]);
        assert_eq!((g.len(), &g[21..24]), (f3.len(), &[0xaa; 3][..]));
        let mut g = f.clone();
        apply_fpdu(&mut g, u.len(), &[Op::Marker { at: 4, word: 0x0102_0304 }, Op::FpduCut(3)]);
        assert_eq!(g.len(), f.len() + 1);
        assert_eq!(&g[4..8], &[1, 2, 3, 4]);
        let writes = deliver(f.clone(), &[Op::Repeat(1), Op::Split(4), Op::Trailing(vec![9])]);
        assert_eq!(writes.len(), 4);
        assert_eq!(writes.concat(), [f.clone(), f, vec![9]].concat());
    }

    #[test]
    fn frame_operations_change_the_right_bytes() {
        let frame = Policy { ird: 1, ord: 1, ..Policy::default() }.request(&[]).unwrap().to_vec().unwrap();
        assert_eq!(frame.len(), 24);
        let mut f = frame.clone();
        apply_frame(&mut f, &[Op::FrameRevision(1), Op::FrameFlags(0x40), Op::FramePdLen(0xffff)]);
        assert_eq!(&f[16..20], &[frame[16] ^ 0x40, 1, 0xff, 0xff]);
        let mut f = frame.clone();
        apply_frame(&mut f, &[Op::FrameIrdOrd([0x80, 1, 0xc0, 1]), Op::FramePrivateData(3)]);
        assert_eq!(f.len(), 27);
        assert_eq!(&f[18..24], &[0, 7, 0x80, 1, 0xc0, 1]);
        // A revision 1 frame without the word gets one, H and PD_Length with it.
        let v1 = Policy { revision: 1, ..Policy::default() }.request(&[]).unwrap().to_vec().unwrap();
        let mut f = v1.clone();
        apply_frame(&mut f, &[Op::FrameIrdOrd([0, 1, 0, 1])]);
        assert_eq!(f.len(), v1.len() + 4);
        assert_eq!((f[16] & 0x10, get_be(&f, 18, 2)), (0x10, 4));
        let mut f = frame;
        apply_frame(&mut f, &[Op::FrameKey { at: 17, xor: 1 }, Op::FrameCut(10)]);
        assert_eq!(f, b"MQA ID Req".to_vec());
    }

    #[test]
    fn templates_are_well_formed() {
        let mut conv = conv();
        conv.peer_buf = Some(Buffer { stag: 0x99, to: 0x1000, len: 32 });
        let seeds = vec![untagged(Opcode::Send, 0, 7, 0, true, b"seed")];
        for t in [
            Template::Send,
            Template::Write,
            Template::ReadRequest,
            Template::ReadResponse,
            Template::Terminate,
            Template::AtomicRequest,
            Template::ImmediateData,
            Template::Seed(0),
        ] {
            let u = conv.build(&t, &seeds);
            let seg = iwarp_dissect::ddp::decode(&u, false).unwrap_or_else(|e| panic!("{t}: {e}"));
            assert!(seg.header.last, "{t}");
        }
        // The seed's MSN fits the conversation.
        conv.msn[0] = 5;
        assert_eq!(get_be(&conv.build(&Template::Seed(0), &seeds), 10, 4), 5);
        let (a, b) = conv.two_segments(&Template::Send);
        assert_eq!((a[0], b[0], get_be(&b, 14, 4)), (0x01, 0x41, 8));
        let (a, b) = conv.two_segments(&Template::Write);
        assert_eq!((a[0], b[0], get_be(&b, 6, 8)), (0x81, 0xc1, 0x1008));
    }

    #[test]
    fn known_findings() {
        let r = Recipe::OversizedPrivateData.case(0, false);
        assert_eq!(known_finding(Side::Responder, &r), Some("siw-reply-private-data-length"));
        assert_eq!(known_finding(Side::Initiator, &r), None);
        let mut big = r.clone();
        big.ops = vec![Op::FramePrivateData(1000)];
        assert!(known_finding(Side::Responder, &big).is_some());
        big.ops = vec![Op::FramePrivateData(1000), Op::FrameCut(19), Op::CloseAfterHandshake];
        assert!(known_finding(Side::Responder, &big).is_none());
        // Cut short, the header is completed by the Read Request that follows.
        big.ops = vec![Op::FrameCut(17)];
        assert!(known_finding(Side::Responder, &big).is_some());
        big.ops = vec![Op::FrameCut(20)];
        assert!(known_finding(Side::Responder, &big).is_some());
        big.ops = vec![Op::FramePdLen(511)];
        assert!(known_finding(Side::Responder, &big).is_some());
        big.ops = vec![Op::FramePdLen(3)];
        assert!(known_finding(Side::Responder, &big).is_none());
        big.ops = vec![Op::FramePrivateData(1000), Op::FramePdLen(4)];
        assert!(known_finding(Side::Responder, &big).is_none());
        let c = Recipe::CloseAfterReply.case(0, false);
        assert_eq!(known_finding(Side::Initiator, &c), Some("iwcm-close-before-rtr"));
        assert_eq!(known_finding(Side::Initiator, &Case { p2p: false, ..c.clone() }), None);
        // A Request whose mutated IRD/ORD word asks for peer-to-peer.
        let mut m = Case { p2p: false, ..c };
        m.ops = vec![Op::FrameIrdOrd([0xf4, 0xb3, 0xc0, 0x80]), Op::CloseAfterHandshake];
        assert_eq!(known_finding(Side::Initiator, &m), Some("iwcm-close-before-rtr"));
        m.ops = vec![Op::FrameIrdOrd([0x74, 0xb3, 0xc0, 0x80]), Op::CloseAfterHandshake];
        assert_eq!(known_finding(Side::Initiator, &m), None);
        assert_eq!(known_finding(Side::Initiator, &Recipe::ReservedOpcodeFirst.case(0, false)), None);
        let t = Recipe::TerminateInsteadOfRtr.case(0, false);
        assert_eq!(known_finding(Side::Initiator, &t), Some("iwcm-close-before-rtr"));
        assert_eq!(
            known_finding(Side::Initiator, &Recipe::ResetAfterReply.case(0, false)),
            Some("iwcm-close-before-rtr")
        );
    }

    #[test]
    fn recipes() {
        let c = Recipe::CloseAfterReply.case(0, false);
        assert!(c.p2p && c.point == Point::Handshake && c.has(&Op::CloseAfterHandshake));
        let c = Recipe::ReservedOpcodeFirst.case(3, true);
        assert_eq!((c.point, c.index, c.crc), (Point::First, 3, true));
        assert_eq!(c.keeping(&[]).ops, vec![]);
        assert_eq!(c.keeping(&[0]).ops, vec![Op::Opcode(0xc)]);
    }
}
