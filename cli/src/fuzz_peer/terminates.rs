//! `iwarp fuzz-peer --terminates PEER`: the Terminate checks. Each check is a deterministic
//! case (a point of the rping conversation, a well-formed message and the mutations that make
//! it wrong) with what the peer is expected to do: answer with one Terminate (layer, type,
//! code, layout, flags, header copy), or close without one. The checks that send this stack's
//! own Terminates expect the peer to close without answering and, on a guest console, siw to
//! log how it read them. Expectations are kept for two peers: Linux siw 6.1 (as observed in
//! the interop guest, its deviations from RFC 5040 included; docs/siw-quirks.md) and this
//! stack's own `iwarp rping`.

use std::fmt::Write as _;

use iwarp::ddp::terminate::{ddp_type, rdmap_type};
use iwarp::ddp::{TerminateCode, TerminateLayer};
use iwarp::mpa::Framer;
use iwarp::rdmap::{Control, Opcode, ReadRequest, TerminateMessage};
use serde::Serialize;

use super::mutate::{Case, Field, Op, Point, RrField, Side, Template, Val, get_be, tagged, untagged};
use super::session::{Event, Outcome};

/// Whose behaviour the checks expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Peer {
    /// Linux siw 6.1 (rping in the interop guest).
    Siw,
    /// This stack (`iwarp rping`).
    Iwarp,
}

/// How a Terminate's control word is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// RFC 5040: layer in the high nibble, M/D/R in bits 7/6/5 of the third byte.
    Rfc,
    /// Linux siw's C bit-fields on x86 (docs/protocol-notes.md#siws-bit-field-layout).
    Siw,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Rfc => "RFC layout",
            Layout::Siw => "siw's layout",
        }
    }

    fn parse(self, body: &[u8]) -> Result<TerminateMessage, String> {
        match self {
            Layout::Rfc => TerminateMessage::parse(body),
            Layout::Siw => TerminateMessage::parse_siw(body),
        }
        .map_err(|e| format!("Terminate cut short: {e}"))
    }
}

/// A Terminate as a check expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    /// The layout it is written in.
    layout: Layout,
    /// Layer, error type, code, read in that layout.
    cause: TerminateCode,
    /// M, D and R, read in that layout.
    flags: [bool; 3],
    /// With D: the RDMAP opcode of the copied DDP header.
    copy: Option<Opcode>,
    /// With M: the DDP segment length field.
    segment_len: Option<u16>,
}

impl Want {
    fn describe(&self) -> String {
        describe(self, "")
    }
}

/// What a check expects the peer to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Answer with this Terminate, then close.
    Terminate(Want),
    /// Close without a Terminate. `logged`: for this stack's Terminates, the layer, type and
    /// code siw's console reports it read (checked when a guest console is watched).
    Close {
        /// siw's `got TERMINATE. layer L, type T, code C`.
        logged: Option<(u8, u8, u8)>,
    },
    /// Take the message without a Terminate and keep the connection (until this tool closes
    /// it), answering with a message with this opcode if one is given.
    Carry(Option<Opcode>),
}

impl Expect {
    fn describe(&self) -> String {
        match self {
            Expect::Terminate(w) => format!("a Terminate: {}", w.describe()),
            Expect::Close { logged: Some((l, t, c)) } => {
                format!("a close without a Terminate; siw logs layer {l}, type {t}, code {c}")
            }
            Expect::Close { logged: None } => "a close without a Terminate".to_string(),
            Expect::Carry(None) => "no Terminate, the connection kept".to_string(),
            Expect::Carry(Some(op)) => format!("a {}, no Terminate, the connection kept", op.name()),
        }
    }
}

/// One check.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    /// Its name (`--only`).
    pub(crate) name: &'static str,
    /// What it does, in a few words.
    pub(crate) about: &'static str,
    /// Which end this tool plays (`--target`: initiator; `--listen`: responder).
    pub(crate) side: Side,
    /// The case.
    pub(crate) case: Case,
    /// What siw does.
    siw: Expect,
    /// What this stack does.
    iwarp: Expect,
}

impl Check {
    /// What `peer` is expected to do.
    pub(crate) fn expect(&self, peer: Peer) -> Expect {
        match peer {
            Peer::Siw => self.siw,
            Peer::Iwarp => self.iwarp,
        }
    }
}

fn flags(s: &str) -> [bool; 3] {
    [s.contains('M'), s.contains('D'), s.contains('R')]
}

/// A Terminate in siw's layout.
fn siw(cause: TerminateCode, f: &str, copy: Option<Opcode>, segment_len: Option<u16>) -> Expect {
    Expect::Terminate(Want { layout: Layout::Siw, cause, flags: flags(f), copy, segment_len })
}

/// A Terminate in the RFC layout.
fn rfc(cause: TerminateCode, f: &str, copy: Option<Opcode>, segment_len: Option<u16>) -> Expect {
    Expect::Terminate(Want { layout: Layout::Rfc, cause, flags: flags(f), copy, segment_len })
}

fn close() -> Expect {
    Expect::Close { logged: None }
}

/// siw read this stack's Terminate as layer `l`, type `t`, code `c`.
fn logged(l: u8, t: u8, c: u8) -> Expect {
    Expect::Close { logged: Some((l, t, c)) }
}

const fn llp(code: u8) -> TerminateCode {
    TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code }
}

const UNTAGGED: u8 = ddp_type::UNTAGGED_BUFFER;
const TAGGED: u8 = ddp_type::TAGGED_BUFFER;
const PROT: u8 = rdmap_type::REMOTE_PROTECTION;
const OPER: u8 = rdmap_type::REMOTE_OPERATION;

/// A case of the checks (CRC off, no peer-to-peer).
fn case(point: Point, template: Template, ops: Vec<Op>) -> Case {
    Case { index: 0, point, crc: false, p2p: false, template, ops }
}

/// After the peer's Read Request (the connection established and used both ways).
fn at_read(template: Template, ops: Vec<Op>) -> Case {
    case(Point::Read, template, ops)
}

fn set(field: Field, v: u64) -> Op {
    Op::Field { field, value: Val::Set(v) }
}

fn add(field: Field, d: i64) -> Op {
    Op::Field { field, value: Val::Add(d) }
}

/// The ULPDU of this stack's Terminate for `code`, with the copies `TerminateMessage::for_error`
/// takes from `offending` (the message this stack would send).
fn ours(code: TerminateCode, offending: Option<&[u8]>) -> Vec<Op> {
    let body = TerminateMessage::for_error(code, offending).to_vec();
    let (control, tail) = body.split_at(4);
    let control = [control[0], control[1], control[2], control[3]];
    vec![Op::TerminateBody { control, tail: tail.to_vec() }]
}

/// The message the offending-segment copies of this stack's Terminates are taken from.
fn a_send_to_queue_5() -> Vec<u8> {
    untagged(Opcode::Send, 5, 2, 0, true, &[0x5a; 16])
}

/// The FPDU (CRC off) of a Send with Solicited Event that ends, as its second segment (MSN 2,
/// MO 8), the 8-byte first segment of a Send: two opcodes in one message.
fn send_se_second_half() -> Vec<u8> {
    let u = untagged(Opcode::SendSe, 0, 2, 8, true, &[0x5a; 8]);
    Framer::new(false, false).frame_to_vec(&u).unwrap_or_default()
}

fn a_read_request() -> Vec<u8> {
    let body =
        ReadRequest { sink_stag: 0x4d01, sink_to: 0x1000, size: 64, source_stag: 0x2a01, source_to: 0 };
    untagged(Opcode::ReadRequest, 1, 1, 0, true, &body.to_bytes())
}

/// Every check, in the order they run.
pub(crate) fn checks() -> Vec<Check> {
    use Opcode as O;
    use Template as T;
    let t = Side::Initiator;
    let ddp = TerminateCode::ddp;
    let rdmap = TerminateCode::rdmap;
    let mut v = vec![
        // --- DDP untagged buffer errors --------------------------------------------------
        Check {
            name: "send-invalid-qn",
            about: "a Send to queue 5",
            side: t,
            case: at_read(T::Send, vec![set(Field::Qn, 5)]),
            siw: siw(ddp(UNTAGGED, 0x01), "MD", Some(O::Send), Some(16)),
            iwarp: rfc(ddp(UNTAGGED, 0x01), "MD", Some(O::Send), Some(34)),
        },
        Check {
            name: "send-msn-range",
            about: "a Send one MSN ahead",
            side: t,
            case: at_read(T::Send, vec![add(Field::Msn, 1)]),
            siw: siw(ddp(UNTAGGED, 0x03), "MD", Some(O::Send), Some(16)),
            iwarp: rfc(ddp(UNTAGGED, 0x02), "MD", Some(O::Send), Some(34)),
        },
        Check {
            name: "send-invalid-mo",
            about: "a Send whose only segment has MO 8",
            side: t,
            case: at_read(T::Send, vec![set(Field::Mo, 8)]),
            siw: siw(ddp(UNTAGGED, 0x04), "MD", Some(O::Send), Some(16)),
            iwarp: rfc(ddp(UNTAGGED, 0x04), "MD", Some(O::Send), Some(34)),
        },
        Check {
            name: "send-too-long",
            about: "a 64-byte Send into rping's 16-byte receive buffer",
            side: t,
            case: at_read(T::Send, vec![Op::PayloadLen(64)]),
            siw: siw(ddp(UNTAGGED, 0x02), "MD", Some(O::Send), Some(64)),
            iwarp: rfc(ddp(UNTAGGED, 0x05), "MD", Some(O::Send), Some(82)),
        },
        Check {
            name: "send-no-buffer",
            about: "two Sends in one segment, one receive posted",
            side: t,
            case: at_read(T::Send, vec![Op::Burst(1)]),
            siw: siw(ddp(UNTAGGED, 0x02), "MD", Some(O::Send), Some(16)),
            iwarp: rfc(ddp(UNTAGGED, 0x02), "MD", Some(O::Send), Some(34)),
        },
        // --- versions and opcodes ----------------------------------------------------------
        Check {
            name: "ddp-version-untagged",
            about: "a Send with DDP version 2",
            side: t,
            case: at_read(T::Send, vec![Op::DdpBits(0x03)]),
            siw: siw(ddp(UNTAGGED, 0x06), "", None, None),
            iwarp: rfc(ddp(UNTAGGED, 0x06), "", None, None),
        },
        Check {
            name: "ddp-version-tagged",
            about: "a Write with DDP version 2",
            side: t,
            case: at_read(T::Write, vec![Op::DdpBits(0x03)]),
            siw: siw(ddp(TAGGED, 0x04), "", None, None),
            iwarp: rfc(ddp(TAGGED, 0x04), "", None, None),
        },
        Check {
            name: "rdmap-version",
            about: "a Send with RDMAP version 0",
            side: t,
            case: at_read(T::Send, vec![Op::RdmapVersion(0)]),
            siw: siw(rdmap(OPER, 0x05), "", None, None),
            iwarp: rfc(rdmap(OPER, 0x05), "", None, None),
        },
        Check {
            name: "reserved-opcode",
            about: "a Send with the reserved opcode 0xc",
            side: t,
            case: at_read(T::Send, vec![Op::Opcode(0xc)]),
            siw: siw(rdmap(OPER, 0x06), "", None, None),
            iwarp: rfc(rdmap(OPER, 0x06), "", None, None),
        },
        Check {
            name: "atomic-request",
            about: "an RFC 7306 Atomic Request (not negotiated)",
            side: t,
            case: at_read(T::AtomicRequest, vec![]),
            siw: siw(rdmap(OPER, 0x06), "", None, None),
            iwarp: rfc(rdmap(OPER, 0x06), "", None, None),
        },
        // --- DDP tagged buffer errors ------------------------------------------------------
        Check {
            name: "write-invalid-stag",
            about: "a 16-byte Write to STag 1",
            side: t,
            case: at_read(T::Write, vec![]),
            siw: siw(ddp(TAGGED, 0x00), "MD", Some(O::Write), Some(16)),
            iwarp: rfc(ddp(TAGGED, 0x00), "MD", Some(O::Write), Some(30)),
        },
        Check {
            name: "write-base-bounds",
            about: "a Write 64 KiB past the buffer the peer's Read Request named",
            side: t,
            case: at_read(T::ReadResponse, vec![Op::Opcode(0), add(Field::To, 0x10000)]),
            siw: siw(ddp(TAGGED, 0x01), "MD", Some(O::Write), Some(64)),
            iwarp: rfc(ddp(TAGGED, 0x01), "MD", Some(O::Write), Some(78)),
        },
        Check {
            name: "write-to-wrap",
            about: "a 16-byte Write to that buffer's STag at TO 2^64 - 8",
            side: t,
            case: at_read(
                T::ReadResponse,
                vec![Op::Opcode(0), set(Field::To, u64::MAX - 7), Op::PayloadLen(16)],
            ),
            siw: siw(ddp(ddp_type::LOCAL_CATASTROPHIC, 0x00), "MD", Some(O::Write), Some(16)),
            iwarp: rfc(ddp(TAGGED, 0x03), "MD", Some(O::Write), Some(30)),
        },
        Check {
            name: "write-stag-not-associated",
            about: "a Write to the buffer of another connection's Read Request",
            side: t,
            case: at_read(T::ReadResponse, vec![Op::ForeignStag, Op::Opcode(0)]),
            siw: siw(ddp(TAGGED, 0x02), "MD", Some(O::Write), Some(64)),
            iwarp: rfc(ddp(TAGGED, 0x02), "MD", Some(O::Write), Some(78)),
        },
        Check {
            name: "read-response-wrong-stag",
            about: "the Read Response to another STag (key + 1)",
            side: t,
            case: at_read(T::ReadResponse, vec![add(Field::Stag, 1)]),
            siw: siw(ddp(TAGGED, 0x00), "MD", Some(O::ReadResponse), Some(64)),
            iwarp: rfc(ddp(TAGGED, 0x02), "MD", Some(O::ReadResponse), Some(78)),
        },
        Check {
            name: "read-response-wrong-to",
            about: "the Read Response 8 bytes off its sink TO",
            side: t,
            case: at_read(T::ReadResponse, vec![add(Field::To, 8)]),
            siw: siw(ddp(TAGGED, 0x01), "MD", Some(O::ReadResponse), Some(64)),
            iwarp: rfc(ddp(TAGGED, 0x02), "MD", Some(O::ReadResponse), Some(78)),
        },
        Check {
            name: "read-response-too-long",
            about: "a Read Response one byte longer than requested",
            side: t,
            case: at_read(T::ReadResponse, vec![Op::PayloadLen(65)]),
            siw: siw(ddp(TAGGED, 0x01), "MD", Some(O::ReadResponse), Some(65)),
            iwarp: rfc(ddp(TAGGED, 0x01), "MD", Some(O::ReadResponse), Some(79)),
        },
        Check {
            name: "read-response-twice",
            about: "the Read Response twice (the second with no Read outstanding)",
            side: t,
            case: at_read(T::ReadResponse, vec![Op::Burst(1)]),
            siw: siw(ddp(ddp_type::LOCAL_CATASTROPHIC, 0x00), "MD", Some(O::ReadResponse), Some(64)),
            iwarp: rfc(rdmap(OPER, 0x06), "", None, None),
        },
        // --- RDMAP errors on Read Requests -------------------------------------------------
        Check {
            name: "read-request-invalid-stag",
            about: "a Read Request whose source STag does not exist",
            side: t,
            case: at_read(T::ReadRequest, vec![]),
            siw: siw(rdmap(PROT, 0x00), "MDR", Some(O::ReadRequest), Some(0)),
            iwarp: rfc(rdmap(PROT, 0x00), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-base-bounds",
            about: "a Read Request 64 KiB past the peer's sink buffer",
            side: t,
            case: at_read(
                T::ReadBack,
                vec![Op::ReadRequestField { field: RrField::SourceTo, value: Val::Add(0x10000) }],
            ),
            siw: siw(rdmap(PROT, 0x01), "MDR", Some(O::ReadRequest), Some(0)),
            iwarp: rfc(rdmap(PROT, 0x01), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-stag-not-associated",
            about: "a Read Request of another connection's buffer",
            side: t,
            case: at_read(T::ReadBack, vec![Op::ForeignStag]),
            siw: siw(rdmap(PROT, 0x03), "MDR", Some(O::ReadRequest), Some(0)),
            iwarp: rfc(rdmap(PROT, 0x03), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-source-wrap",
            about: "a Read Request of the peer's sink STag at TO 2^64 - 8",
            side: t,
            case: at_read(
                T::ReadBack,
                vec![Op::ReadRequestField { field: RrField::SourceTo, value: Val::Set(u64::MAX - 7) }],
            ),
            siw: close(),
            iwarp: rfc(rdmap(PROT, 0x04), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-sink-wrap",
            about: "a Read Request whose 64-byte sink starts at TO 2^64 - 8",
            side: t,
            case: at_read(
                T::ReadBack,
                vec![Op::ReadRequestField { field: RrField::SinkTo, value: Val::Set(u64::MAX - 7) }],
            ),
            siw: Expect::Carry(Some(O::ReadResponse)),
            iwarp: rfc(rdmap(PROT, 0x04), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-msn-range",
            about: "a Read Request one MSN ahead",
            side: t,
            case: at_read(T::ReadBack, vec![add(Field::Msn, 1)]),
            siw: siw(ddp(UNTAGGED, 0x03), "MD", Some(O::ReadRequest), Some(0)),
            iwarp: rfc(ddp(UNTAGGED, 0x02), "MD", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-ird-exceeded",
            about: "four Read Requests at once with IRD 1",
            side: t,
            case: at_read(T::ReadBack, vec![Op::Burst(3)]),
            siw: siw(rdmap(OPER, 0x07), "MD", Some(O::ReadRequest), Some(0)),
            iwarp: rfc(rdmap(OPER, 0x07), "MDR", Some(O::ReadRequest), Some(46)),
        },
        Check {
            name: "read-request-with-payload",
            about: "a Read Request carrying 32 bytes after its body",
            side: t,
            case: at_read(T::ReadBack, vec![Op::PayloadLen(60)]),
            siw: close(),
            iwarp: rfc(ddp(UNTAGGED, 0x05), "MD", Some(O::ReadRequest), Some(78)),
        },
        // --- RDMAP remote operation ----------------------------------------------------------
        Check {
            name: "send-invalidate-unknown-stag",
            about: "a Send with Invalidate of an STag that does not exist",
            side: t,
            case: at_read(T::Send, vec![Op::Opcode(0x4), set(Field::Word, 0x00ab_cd00)]),
            siw: siw(rdmap(OPER, 0x09), "MD", Some(O::SendInvalidate), Some(16)),
            iwarp: rfc(rdmap(OPER, 0x09), "MD", Some(O::SendInvalidate), Some(34)),
        },
        Check {
            name: "send-invalidate-foreign-stag",
            about: "a Send with Invalidate of another connection's buffer",
            side: t,
            case: at_read(T::InvalidateSink, vec![Op::ForeignStag]),
            siw: siw(rdmap(PROT, 0x09), "MDR", Some(O::SendInvalidate), Some(16)),
            iwarp: rfc(rdmap(PROT, 0x09), "MD", Some(O::SendInvalidate), Some(34)),
        },
        Check {
            name: "interleaved-sends",
            about: "a Send with SE as the second segment of a Send",
            side: t,
            case: at_read(
                T::Send,
                vec![Op::DdpBits(0x40), Op::PayloadLen(8), Op::Trailing(send_se_second_half())],
            ),
            siw: close(),
            iwarp: rfc(rdmap(OPER, 0x06), "", None, None),
        },
        // --- LLP -----------------------------------------------------------------------------
        Check {
            name: "crc-error",
            about: "a Send with a bad CRC (CRC negotiated)",
            side: t,
            case: Case { crc: true, ..at_read(T::Send, vec![Op::Crc(1)]) },
            siw: siw(llp(0x02), "", None, None),
            iwarp: rfc(llp(0x02), "", None, None),
        },
        Check {
            name: "fpdu-too-short",
            about: "a Send whose ULPDU_Length (12) cannot hold its DDP header",
            side: t,
            case: at_read(T::Send, vec![Op::Length(12)]),
            siw: siw(llp(0x03), "", None, None),
            iwarp: rfc(llp(0x03), "", None, None),
        },
    ];
    // --- this stack's Terminates, sent after the peer's Read Request ------------------------
    let send = a_send_to_queue_5();
    let write = tagged(Opcode::Write, 1, 0, true, &[0x5a; 16]);
    let rr = a_read_request();
    for (name, about, code, offending, read_as) in [
        (
            "ours-ddp-invalid-qn",
            "this stack's Terminate for a Send to queue 5 (DDP 2/0x01, M D)",
            ddp(UNTAGGED, 0x01),
            Some(&send[..]),
            (2, 1, 0x01),
        ),
        (
            "ours-ddp-invalid-stag",
            "this stack's Terminate for a Write to an unknown STag (DDP 1/0x00, M D)",
            ddp(TAGGED, 0x00),
            Some(&write[..]),
            (1, 1, 0x00),
        ),
        (
            "ours-rdmap-read-invalid-stag",
            "this stack's Terminate for a Read Request of an unknown STag (RDMAP 1/0x00, M D R)",
            rdmap(PROT, 0x00),
            Some(&rr[..]),
            (1, 0, 0x00),
        ),
        (
            "ours-rdmap-unexpected-opcode",
            "this stack's Terminate for a reserved opcode (RDMAP 2/0x06)",
            rdmap(OPER, 0x06),
            None,
            (2, 0, 0x06),
        ),
        ("ours-llp-crc", "this stack's Terminate for a bad CRC (LLP 0/0x02)", llp(0x02), None, (0, 2, 0x02)),
    ] {
        let (l, ty, c) = read_as;
        v.push(Check {
            name,
            about,
            side: t,
            case: at_read(T::Terminate, ours(code, offending)),
            siw: logged(l, ty, c),
            iwarp: close(),
        });
    }
    // Every other code this stack sends (docs/protocol-notes.md#terminate-codes), with the
    // copies it would take. siw's bit-fields read the RFC layout's type as the layer and the
    // layer as the type.
    let send_inv = untagged(Opcode::SendInvalidate, 0, 2, 0, true, &[0x5a; 16]);
    for (name, about, code, offending) in [
        ("ours-rdmap-local-catastrophic", "this stack\'s Terminate RDMAP 0/0x00", rdmap(0, 0x00), None),
        (
            "ours-rdmap-read-base-bounds",
            "RDMAP 1/0x01, a Read Request copied",
            rdmap(PROT, 0x01),
            Some(&rr[..]),
        ),
        (
            "ours-rdmap-access-rights",
            "this stack\'s Terminate RDMAP 1/0x02, a Write copied",
            rdmap(PROT, 0x02),
            Some(&write[..]),
        ),
        (
            "ours-rdmap-read-not-associated",
            "RDMAP 1/0x03, a Read Request copied",
            rdmap(PROT, 0x03),
            Some(&rr[..]),
        ),
        (
            "ours-rdmap-read-to-wrap",
            "this stack\'s Terminate RDMAP 1/0x04, a Read Request copied",
            rdmap(PROT, 0x04),
            Some(&rr[..]),
        ),
        (
            "ours-rdmap-invalidate-protection",
            "RDMAP 1/0x09, a Send with Invalidate copied",
            rdmap(PROT, 0x09),
            Some(&send_inv[..]),
        ),
        ("ours-rdmap-version", "this stack\'s Terminate RDMAP 2/0x05", rdmap(OPER, 0x05), None),
        (
            "ours-rdmap-catastrophic-stream",
            "RDMAP 2/0x07, a Read Request copied",
            rdmap(OPER, 0x07),
            Some(&rr[..]),
        ),
        (
            "ours-rdmap-cannot-invalidate",
            "RDMAP 2/0x09, a Send with Invalidate copied",
            rdmap(OPER, 0x09),
            Some(&send_inv[..]),
        ),
        ("ours-rdmap-unspecified", "this stack\'s Terminate RDMAP 2/0xff", rdmap(OPER, 0xff), None),
        (
            "ours-ddp-base-bounds",
            "this stack\'s Terminate DDP 1/0x01, a Write copied",
            ddp(TAGGED, 0x01),
            Some(&write[..]),
        ),
        (
            "ours-ddp-not-associated",
            "this stack\'s Terminate DDP 1/0x02, a Write copied",
            ddp(TAGGED, 0x02),
            Some(&write[..]),
        ),
        (
            "ours-ddp-to-wrap",
            "this stack\'s Terminate DDP 1/0x03, a Write copied",
            ddp(TAGGED, 0x03),
            Some(&write[..]),
        ),
        ("ours-ddp-tagged-version", "this stack\'s Terminate DDP 1/0x04", ddp(TAGGED, 0x04), None),
        (
            "ours-ddp-no-buffer",
            "this stack\'s Terminate DDP 2/0x02, a Send copied",
            ddp(UNTAGGED, 0x02),
            Some(&send[..]),
        ),
        (
            "ours-ddp-msn-range",
            "this stack\'s Terminate DDP 2/0x03, a Send copied",
            ddp(UNTAGGED, 0x03),
            Some(&send[..]),
        ),
        (
            "ours-ddp-invalid-mo",
            "this stack\'s Terminate DDP 2/0x04, a Send copied",
            ddp(UNTAGGED, 0x04),
            Some(&send[..]),
        ),
        (
            "ours-ddp-too-long",
            "this stack\'s Terminate DDP 2/0x05, a Send copied",
            ddp(UNTAGGED, 0x05),
            Some(&send[..]),
        ),
        ("ours-ddp-untagged-version", "this stack\'s Terminate DDP 2/0x06", ddp(UNTAGGED, 0x06), None),
        ("ours-llp-fpdu-start", "this stack\'s Terminate LLP 0/0x03", llp(0x03), None),
        ("ours-llp-bad-reply", "this stack\'s Terminate LLP 0/0x04", llp(0x04), None),
        ("ours-llp-insufficient-ird", "this stack\'s Terminate LLP 0/0x06", llp(0x06), None),
        ("ours-llp-no-matching-rtr", "this stack\'s Terminate LLP 0/0x07", llp(0x07), None),
    ] {
        v.push(Check {
            name,
            about,
            side: t,
            case: at_read(T::Terminate, ours(code, offending)),
            siw: logged(code.error_type, code.layer.to_u8(), code.code),
            iwarp: close(),
        });
    }
    // --- the peer initiates: its MPA Reply checks ---------------------------------------------
    let r = Side::Responder;
    v.push(Check {
        name: "reply-bad-key",
        about: "an MPA Reply whose key starts with 'L'",
        side: r,
        case: case(Point::Handshake, T::ReadRequest, vec![Op::FrameKey { at: 0, xor: 0x01 }]),
        siw: siw(llp(0x04), "", None, None),
        iwarp: close(),
    });
    v.push(Check {
        name: "reply-ird-insufficient",
        about: "an MPA Reply with ORD 16383, above what the initiator can take",
        side: r,
        case: case(Point::Handshake, T::ReadRequest, vec![Op::FrameIrdOrd([0x00, 0x01, 0x3f, 0xff])]),
        siw: siw(llp(0x06), "", None, None),
        iwarp: rfc(llp(0x06), "", None, None),
    });
    // Replies siw refuses without a Terminate (siw_proc_mpareply: an unknown revision, markers,
    // a rejection). This stack takes markers (it sends them from then on).
    for (name, about, op, iwarp) in [
        ("reply-revision-3", "an MPA Reply of revision 3", Op::FrameRevision(3), close()),
        ("reply-markers", "an MPA Reply that asks for markers", Op::FrameFlags(0x80), Expect::Carry(None)),
        ("reply-reject", "an MPA Reply with the Reject flag", Op::FrameFlags(0x20), close()),
    ] {
        v.push(Check {
            name,
            about,
            side: r,
            case: case(Point::Handshake, T::ReadRequest, vec![op]),
            siw: close(),
            iwarp,
        });
    }
    // With --p2p (the peer initiates in peer-to-peer mode, as siw built with peer_to_peer=1
    // does, offering Write and Read RTRs): a Reply that agrees to peer-to-peer with no RTR type.
    v.push(Check {
        name: "reply-no-matching-rtr",
        about: "a peer-to-peer MPA Reply that picks no offered RTR type",
        side: r,
        case: Case {
            p2p: true,
            ..case(Point::Handshake, T::ReadRequest, vec![Op::FrameIrdOrd([0x80, 0x01, 0x00, 0x01])])
        },
        siw: siw(llp(0x07), "", None, None),
        iwarp: rfc(llp(0x07), "", None, None),
    });
    v
}

/// The checks named in `only` (all when empty) for `side` and for a peer that initiates in
/// peer-to-peer mode or not (`p2p`: only the checks that need it), or the unknown name.
pub(crate) fn select(only: &[String], side: Side, p2p: bool) -> Result<Vec<Check>, String> {
    let all = checks();
    if let Some(bad) = only.iter().find(|n| !all.iter().any(|c| c.name == n.as_str())) {
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        return Err(format!("no Terminate check named '{bad}' (there are: {})", names.join(", ")));
    }
    Ok(all
        .into_iter()
        .filter(|c| c.side == side && c.case.p2p == p2p)
        .filter(|c| only.is_empty() || only.iter().any(|n| n == c.name))
        .collect())
}

/// `w` in words; `copied`: the copied header's fields, when known.
fn describe(w: &Want, copied: &str) -> String {
    let mut s = format!("{} ({})", w.cause, w.layout.name());
    let f: Vec<&str> = ["M", "D", "R"].iter().zip(w.flags).filter(|(_, on)| *on).map(|(n, _)| *n).collect();
    if !f.is_empty() {
        let _ = write!(s, ", {}", f.join(" "));
    }
    if let Some(op) = w.copy {
        let _ = write!(s, ", copied header: {}{copied}", op.name());
    }
    if let Some(n) = w.segment_len {
        let _ = write!(s, ", segment length {n}");
    }
    s
}

/// The fields of a copied DDP header: ` (QN q MSN m MO o)` or ` (STag s TO t)`.
fn copied_fields(h: &[u8]) -> String {
    if h.first().is_some_and(|b| b & 0x80 != 0) {
        format!(" (STag {:#010x} TO {:#x})", get_be(h, 2, 4), get_be(h, 6, 8))
    } else {
        format!(" (QN {} MSN {} MO {})", get_be(h, 6, 4), get_be(h, 10, 4), get_be(h, 14, 4))
    }
}

/// The Terminate bodies among `ulpdus`.
fn terminate_bodies(ulpdus: &[Vec<u8>]) -> Vec<&[u8]> {
    ulpdus
        .iter()
        .filter(|u| u.len() >= 18 && u[0] & 0x80 == 0 && Control::from_byte(u[1]).opcode == Opcode::Terminate)
        .map(|u| &u[18..])
        .collect()
}

/// A received Terminate read in `layout`: what the check compares, and the copied header's
/// fields.
fn read(body: &[u8], layout: Layout) -> Result<(Want, String), String> {
    let m = layout.parse(body)?;
    let h = m.header;
    let copy = m.ddp_header.and_then(|c| c.as_bytes().get(1).copied()).map(|b| Control::from_byte(b).opcode);
    let fields = m.ddp_header.map(|c| copied_fields(c.as_bytes())).unwrap_or_default();
    Ok((
        Want { layout, cause: h.cause, flags: [h.m, h.d, h.r], copy, segment_len: m.ddp_segment_len },
        fields,
    ))
}

/// The verdict on one check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Verdict {
    /// Whether the peer did what was expected.
    pub(crate) pass: bool,
    /// What was expected.
    pub(crate) expected: String,
    /// What the peer did.
    pub(crate) got: String,
}

/// Judges `o` (and, with a console, siw's messages during the case) against `expect`.
pub(crate) fn judge(expect: &Expect, o: &Outcome, siw_lines: Option<&[String]>) -> Verdict {
    let bodies = terminate_bodies(&o.ulpdus);
    let mut got = Vec::new();
    let mut pass = o.reached;
    if !o.reached {
        got.push("the case's point was not reached".to_string());
    }
    match expect {
        Expect::Terminate(want) => match bodies.as_slice() {
            [] => {
                pass = false;
                got.push("no Terminate".to_string());
            }
            [body] => match read(body, want.layout) {
                Ok((seen, fields)) => {
                    let word = iwarp_dissect::hex(body.get(..4).unwrap_or_default());
                    let same = seen.cause == want.cause
                        && seen.flags == want.flags
                        && (!want.flags[1] || seen.copy == want.copy)
                        && (!want.flags[0] || seen.segment_len == want.segment_len);
                    pass &= same;
                    got.push(format!("Terminate {word}: {}", describe(&seen, &fields)));
                }
                Err(e) => {
                    pass = false;
                    got.push(e);
                }
            },
            more => {
                pass = false;
                got.push(format!("{} Terminates", more.len()));
            }
        },
        Expect::Carry(answer) => {
            if let Some(op) = answer {
                let found =
                    o.ulpdus.iter().find(|u| u.get(1).is_some_and(|b| Control::from_byte(*b).opcode == *op));
                match found {
                    Some(u) if u[0] & 0x80 != 0 && u.len() >= 14 => {
                        got.push(format!(
                            "a {} to TO {:#x}",
                            op.name(),
                            u64::from_be_bytes(u[6..14].try_into().unwrap_or_default())
                        ));
                    }
                    Some(_) => got.push(format!("a {}", op.name())),
                    None => {
                        pass = false;
                        got.push(format!("no {}", op.name()));
                    }
                }
            }
            if bodies.is_empty() {
                got.push("no Terminate".to_string());
            } else {
                pass = false;
                got.push(format!("{} Terminate(s): {}", bodies.len(), o.terminates.join("; ")));
            }
        }
        Expect::Close { logged } => {
            if !bodies.is_empty() {
                pass = false;
                got.push(format!("{} Terminate(s): {}", bodies.len(), o.terminates.join("; ")));
            } else {
                got.push("no Terminate".to_string());
            }
            if let (Some((l, t, c)), Some(lines)) = (logged, siw_lines) {
                let line = format!("got TERMINATE. layer {l}, type {t}, code {c}");
                match lines.iter().find(|s| s.contains("got TERMINATE")) {
                    Some(s) => {
                        pass &= s.contains(&line);
                        got.push(format!("siw logged '{s}'"));
                    }
                    None => {
                        pass = false;
                        got.push("siw logged no 'got TERMINATE'".to_string());
                    }
                }
            }
        }
    }
    // Who closed first: the peer (it tore the connection down) or this tool (after the answer).
    let first_close = o.events.iter().find_map(|e| match e {
        Event::Fin { ours, .. } | Event::Rst { ours, .. } => Some(*ours),
        Event::Data { .. } => None,
    });
    let peer_closed = first_close == Some(false);
    if peer_closed {
        got.push("the peer closed the connection".to_string());
    } else {
        got.push("the peer kept the connection open".to_string());
    }
    pass &= peer_closed == !matches!(expect, Expect::Carry(_));
    Verdict { pass, expected: expect.describe(), got: got.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz_peer::mutate::{Buffer, Conv, apply_ulpdu, burst};
    use iwarp::rdmap::TerminateHeader;

    /// A conversation at the point of the checks: the advertisement sent (MSN 1 on queue 0
    /// used), the peer's Read Request known.
    fn conv() -> Conv {
        let mut c = Conv::new(Side::Initiator);
        c.msn[0] = 2;
        c.peer_read = Some(ReadRequest {
            sink_stag: 0x0012_3400,
            sink_to: 0x5555_0000_1000,
            size: 64,
            source_stag: 0x4d01,
            source_to: 0x7f3a_1000_0000,
        });
        c
    }

    fn bytes(name: &str) -> Vec<u8> {
        let c = checks().into_iter().find(|c| c.name == name).unwrap();
        let mut u = conv().build(&c.case.template, &[]);
        apply_ulpdu(&mut u, &c.case.ops);
        u
    }

    #[test]
    fn names_are_unique_and_selectable() {
        let all = checks();
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(all.len() >= 30);
        let t = select(&[], Side::Initiator, false).unwrap();
        let r = select(&[], Side::Responder, false).unwrap();
        let p = select(&[], Side::Responder, true).unwrap();
        assert!(select(&[], Side::Initiator, true).unwrap().is_empty());
        assert_eq!(t.len() + r.len() + p.len(), all.len());
        assert_eq!(
            r.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["reply-bad-key", "reply-ird-insufficient", "reply-revision-3", "reply-markers", "reply-reject"]
        );
        assert_eq!(p.iter().map(|c| c.name).collect::<Vec<_>>(), ["reply-no-matching-rtr"]);
        let one = select(&["crc-error".to_string()], Side::Initiator, false).unwrap();
        assert_eq!((one.len(), one[0].case.crc), (1, true));
        assert!(select(&["crc-error".to_string()], Side::Responder, false).unwrap().is_empty());
        let e = select(&["nope".to_string()], Side::Initiator, false).unwrap_err();
        assert!(e.starts_with("no Terminate check named 'nope' (there are: send-invalid-qn, "), "{e}");
        // No check ends its connection before the peer's answer, and none needs a capture.
        assert!(all.iter().all(|c| c.case.end().is_none() && !matches!(c.case.template, Template::Seed(_))));
    }

    #[test]
    fn the_cases_make_the_bytes_intended() {
        // Untagged: control, QN, MSN, MO, payload length.
        let u = bytes("send-invalid-qn");
        assert_eq!((&u[..2], get_be(&u, 6, 4), get_be(&u, 10, 4), u.len()), (&[0x41, 0x43][..], 5, 2, 34));
        let u = bytes("send-msn-range");
        assert_eq!((get_be(&u, 6, 4), get_be(&u, 10, 4)), (0, 3));
        assert_eq!(get_be(&bytes("send-invalid-mo"), 14, 4), 8);
        assert_eq!(bytes("send-too-long").len(), 18 + 64);
        assert_eq!(&bytes("ddp-version-untagged")[..2], &[0x42, 0x43]);
        assert_eq!(&bytes("ddp-version-tagged")[..2], &[0xc2, 0x40]);
        assert_eq!(&bytes("rdmap-version")[..2], &[0x41, 0x03]);
        assert_eq!(&bytes("reserved-opcode")[..2], &[0x41, 0x4c]);
        assert_eq!((bytes("atomic-request")[1], get_be(&bytes("atomic-request"), 6, 4)), (0x4a, 1));
        // Tagged: to the peer's sink buffer (from its Read Request), or to STag 1.
        let u = bytes("write-invalid-stag");
        assert_eq!((&u[..2], get_be(&u, 2, 4), get_be(&u, 6, 8), u.len()), (&[0xc1, 0x40][..], 1, 0, 30));
        let u = bytes("write-base-bounds");
        assert_eq!(
            (u[1], get_be(&u, 2, 4), get_be(&u, 6, 8), u.len()),
            (0x40, 0x12_3400, 0x5555_0001_1000, 78)
        );
        let u = bytes("write-to-wrap");
        assert_eq!((u[1], get_be(&u, 6, 8), u.len()), (0x40, u64::MAX - 7, 30));
        let u = bytes("read-response-wrong-stag");
        assert_eq!((u[1], get_be(&u, 2, 4), get_be(&u, 6, 8)), (0x42, 0x12_3401, 0x5555_0000_1000));
        assert_eq!(get_be(&bytes("read-response-wrong-to"), 6, 8), 0x5555_0000_1008);
        assert_eq!(bytes("read-response-too-long").len(), 14 + 65);
        // Read Requests: of the peer's sink buffer, or of an STag that does not exist.
        let u = bytes("read-request-base-bounds");
        let r = ReadRequest::parse(&u[18..]).unwrap();
        assert_eq!(
            (r.source_stag, r.source_to, r.size, r.sink_stag),
            (0x12_3400, 0x5555_0001_1000, 64, 0x4d01)
        );
        let u = bytes("read-request-msn-range");
        assert_eq!((get_be(&u, 6, 4), get_be(&u, 10, 4)), (1, 2));
        assert_eq!(
            ReadRequest::parse(&bytes("read-request-invalid-stag")[18..]).unwrap().source_stag,
            0x2a01
        );
        assert_eq!(bytes("read-request-with-payload").len(), 18 + 60);
        // Two segments of one message, the second a Send with SE: the first's L is clear.
        let c = checks().into_iter().find(|c| c.name == "interleaved-sends").unwrap();
        let u = bytes("interleaved-sends");
        assert_eq!((&u[..2], get_be(&u, 10, 4), get_be(&u, 14, 4), u.len()), (&[0x01, 0x43][..], 2, 0, 26));
        let Some(Op::Trailing(f)) = c.case.ops.last() else { panic!() };
        // The second segment: its own length and controls, the first's reserved field, QN and MSN.
        assert_eq!((&f[..4], &f[4..16]), (&[0, 26, 0x41, 0x45][..], &u[2..14]));
        assert_eq!((get_be(f, 12, 4), get_be(f, 16, 4), f.len()), (2, 8, 2 + 26 + 4));
        let u = bytes("send-invalidate-unknown-stag");
        assert_eq!((u[1], get_be(&u, 2, 4), get_be(&u, 6, 4)), (0x44, 0x00ab_cd00, 0));
        // Bursts: the copies take the next MSNs; a tagged copy is the same message.
        let c = checks().into_iter().find(|c| c.name == "read-request-ird-exceeded").unwrap();
        let u = bytes("read-request-ird-exceeded");
        let copies = burst(&u, &c.case.ops);
        assert_eq!(copies.iter().map(|c| get_be(c, 10, 4)).collect::<Vec<_>>(), [2, 3, 4]);
        assert!(copies.iter().all(|c| c[18..] == u[18..]));
        let c = checks().into_iter().find(|c| c.name == "read-response-twice").unwrap();
        let u = bytes("read-response-twice");
        assert_eq!(burst(&u, &c.case.ops), vec![u.clone()]);
        // The ReadBack template without a Read Request falls back to a made-up source.
        let mut plain = Conv::new(Side::Initiator);
        plain.peer_buf = Some(Buffer { stag: 9, to: 0, len: 8 });
        assert_eq!(plain.build(&Template::ReadBack, &[]), plain.read_request());
    }

    #[test]
    fn our_terminates_are_this_stacks() {
        // The control words as this stack sends them (RFC layout), and how siw's bit-fields
        // read them: layer from the low nibble, error type from the high one.
        /// A check's name, the control word, the body's length, how siw's bit-fields read it.
        type Row = (&'static str, [u8; 4], usize, (u8, u8, u8));
        let want: [Row; 5] = [
            ("ours-ddp-invalid-qn", [0x12, 0x01, 0xc0, 0], 4 + 2 + 18, (2, 1, 0x01)),
            ("ours-ddp-invalid-stag", [0x11, 0x00, 0xc0, 0], 4 + 2 + 14, (1, 1, 0x00)),
            ("ours-rdmap-read-invalid-stag", [0x01, 0x00, 0xe0, 0], 4 + 2 + 18 + 28, (1, 0, 0x00)),
            ("ours-rdmap-unexpected-opcode", [0x02, 0x06, 0, 0], 4, (2, 0, 0x06)),
            ("ours-llp-crc", [0x20, 0x02, 0, 0], 4, (0, 2, 0x02)),
        ];
        for (name, word, len, (l, t, c)) in want {
            let u = bytes(name);
            // A Terminate: untagged, last, QN 2, MSN 1, MO 0.
            assert_eq!(
                (&u[..2], get_be(&u, 6, 4), get_be(&u, 10, 4), get_be(&u, 14, 4)),
                (&[0x41, 0x47][..], 2, 1, 0)
            );
            let body = &u[18..];
            assert_eq!((&body[..4], body.len()), (&word[..], len), "{name}");
            let m = TerminateMessage::parse(body).unwrap();
            assert_eq!(m.to_vec(), body, "{name}");
            let siw = TerminateHeader::parse_siw(body).unwrap().cause;
            assert_eq!((siw.layer.to_u8(), siw.error_type, siw.code), (l, t, c), "{name}");
            let check = checks().into_iter().find(|k| k.name == name).unwrap();
            assert_eq!(check.expect(Peer::Siw), logged(l, t, c));
        }
        // Every one of this stack's Terminates: a defined code, the body round-trips, and siw's
        // bit-fields read it with layer and type swapped, as the check expects siw to log.
        let ours: Vec<Check> = checks().into_iter().filter(|c| c.name.starts_with("ours-")).collect();
        assert_eq!(ours.len(), 28);
        for check in ours {
            let u = bytes(check.name);
            let m = TerminateMessage::parse(&u[18..]).unwrap();
            assert!(m.header.cause.is_defined(), "{}", check.name);
            assert_eq!(m.to_vec(), &u[18..], "{}", check.name);
            let siw = TerminateHeader::parse_siw(&u[18..]).unwrap().cause;
            assert_eq!(
                check.expect(Peer::Siw),
                logged(siw.layer.to_u8(), siw.error_type, siw.code),
                "{}",
                check.name
            );
            assert_eq!(check.expect(Peer::Iwarp), close());
        }
        // The copies are the offending messages' headers.
        let m = TerminateMessage::parse(&bytes("ours-rdmap-read-invalid-stag")[18..]).unwrap();
        assert_eq!(m.ddp_header.unwrap().as_bytes(), &a_read_request()[..18]);
        assert_eq!(&m.rdmap_header.unwrap()[..], &a_read_request()[18..]);
        assert_eq!(m.ddp_segment_len, Some(46));
    }

    fn outcome(ulpdus: Vec<Vec<u8>>, peer_closed_first: bool) -> Outcome {
        let at = std::time::Duration::ZERO;
        let events =
            vec![Event::Fin { ours: !peer_closed_first, at }, Event::Fin { ours: peer_closed_first, at }];
        Outcome { ulpdus, events, peer_closed: true, reached: true, ..Outcome::default() }
    }

    fn term(body: &[u8]) -> Vec<u8> {
        untagged(Opcode::Terminate, 2, 1, 0, true, body)
    }

    #[test]
    fn judging() {
        let all = checks();
        let qn = all.iter().find(|c| c.name == "send-invalid-qn").unwrap();
        // siw's answer, seen on the wire: `21 01 03 00`, then the segment length (the payload's,
        // 16) and the Send's header.
        let mut body = vec![0x21, 0x01, 0x03, 0x00, 0x00, 0x10];
        body.extend_from_slice(&untagged(Opcode::Send, 5, 2, 0, true, &[])[..18]);
        let o = outcome(vec![untagged(Opcode::Send, 0, 1, 0, true, &[0; 16]), term(&body)], true);
        let v = judge(&qn.expect(Peer::Siw), &o, None);
        assert!(v.pass, "{v:?}");
        assert_eq!(
            v.got,
            "Terminate 21010300: DDP type 2 code 0x01 (siw's layout), M D, copied header: Send (QN 5 MSN \
             2 MO 0), segment length 16, the peer closed the connection"
        );
        // The same Terminate is not what this stack sends, and the peer must close.
        assert!(!judge(&qn.expect(Peer::Iwarp), &o, None).pass);
        assert!(!judge(&qn.expect(Peer::Siw), &outcome(vec![term(&body)], false), None).pass);
        // Another code, another copy, no Terminate, two Terminates.
        let mut other = body.clone();
        other[1] = 0x03;
        assert!(!judge(&qn.expect(Peer::Siw), &outcome(vec![term(&other)], true), None).pass);
        let v = judge(&qn.expect(Peer::Siw), &outcome(vec![], true), None);
        assert_eq!((v.pass, v.got.as_str()), (false, "no Terminate, the peer closed the connection"));
        assert!(!judge(&qn.expect(Peer::Siw), &outcome(vec![term(&body), term(&body)], true), None).pass);
        // A close, with siw's reading of our Terminate on its console.
        let ours = all.iter().find(|c| c.name == "ours-ddp-invalid-qn").unwrap();
        let e = ours.expect(Peer::Siw);
        let lines = vec!["siw: got TERMINATE. layer 2, type 1, code 1".to_string()];
        assert!(judge(&e, &outcome(vec![], true), Some(&lines)).pass);
        assert!(judge(&e, &outcome(vec![], true), None).pass);
        let wrong = vec!["siw: got TERMINATE. layer 1, type 2, code 1".to_string()];
        assert!(!judge(&e, &outcome(vec![], true), Some(&wrong)).pass);
        assert!(!judge(&e, &outcome(vec![], true), Some(&[])).pass);
        assert!(!judge(&e, &outcome(vec![term(&body)], true), None).pass);
        let mut unreached = outcome(vec![], true);
        unreached.reached = false;
        assert!(!judge(&e, &unreached, None).pass);
        // A peer that carries on: no Terminate, and this tool closes first.
        let v = judge(&Expect::Carry(None), &outcome(vec![], false), None);
        assert_eq!((v.pass, v.got.as_str()), (true, "no Terminate, the peer kept the connection open"));
        assert!(!judge(&Expect::Carry(None), &outcome(vec![], true), None).pass);
        assert!(!judge(&Expect::Carry(None), &outcome(vec![term(&body)], false), None).pass);
        // ... with the answer it gives.
        let resp = tagged(Opcode::ReadResponse, 0x1234, u64::MAX - 7, true, &[0; 64]);
        let v = judge(&Expect::Carry(Some(Opcode::ReadResponse)), &outcome(vec![resp], false), None);
        assert_eq!(
            (v.pass, v.got.as_str()),
            (true, "a ReadResp to TO 0xfffffffffffffff8, no Terminate, the peer kept the connection open")
        );
        assert!(!judge(&Expect::Carry(Some(Opcode::ReadResponse)), &outcome(vec![], false), None).pass);
    }
}
