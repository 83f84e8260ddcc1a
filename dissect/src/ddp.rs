//! DDP and RDMAP: decode each FPDU's ULPDU as a DDP segment (RFC 5041) carrying an RDMAP
//! message (RFC 5040, RFC 7306), and check the message sequence of a connection.
//!
//! [`decode`] turns one ULPDU into a [`Segment`] (or a description of why it is malformed);
//! a [`Checker`](crate::check::Checker) follows a connection's decoded segments one at a time and reports MSN gaps and
//! repeats per untagged queue, MO jumps within a message, Read Responses whose length or sink
//! STag do not match their Read Request, and a missing or wrong RTR on a peer-to-peer
//! connection.

use iwarp_ddp::{HeaderError, HeaderRepr, SegmentKind, TerminateCode};
use iwarp_rdmap::atomic::{AtomicOp, AtomicRequest, AtomicResponse, ImmediateData};
use iwarp_rdmap::terminate::TerminateMessage;
use iwarp_rdmap::wire::{RDMAP_VERSION, Truncated};
use iwarp_rdmap::{Control, Opcode, ReadRequest, TerminateHeader};
use serde::Serialize;

/// The model-specific DDP header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "model", rename_all = "snake_case")]
pub enum Model {
    /// Tagged buffer model.
    Tagged {
        /// The data sink's STag.
        stag: u32,
        /// The tagged offset of the first payload byte.
        to: u64,
    },
    /// Untagged buffer model.
    Untagged {
        /// RDMAP's word: the Invalidate STag of a Send with Invalidate, else 0.
        rdmap_word: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A decoded DDP header (of an FPDU or copied into a Terminate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DdpHeader {
    /// L: last segment of its message.
    pub last: bool,
    /// The RDMAP control octet, raw.
    pub rdmap_control: u8,
    /// The RDMAP opcode's name.
    pub opcode: &'static str,
    /// The model and its fields.
    #[serde(flatten)]
    pub model: Model,
}

/// The RDMAP Read Request body (RFC 5040 section 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReadRequestInfo {
    /// Data sink STag.
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size.
    pub size: u32,
    /// Data source STag.
    pub source_stag: u32,
    /// Data source tagged offset.
    pub source_to: u64,
}

impl From<ReadRequest> for ReadRequestInfo {
    fn from(r: ReadRequest) -> Self {
        ReadRequestInfo {
            sink_stag: r.sink_stag,
            sink_to: r.sink_to,
            size: r.size,
            source_stag: r.source_stag,
            source_to: r.source_to,
        }
    }
}

/// One reading of a Terminate control word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TerminateReading {
    /// Layer (0 RDMAP, 1 DDP, 2 LLP).
    pub layer: u8,
    /// Error type.
    pub error_type: u8,
    /// Error code.
    pub code: u8,
    /// Whether RFC 5040 defines this layer/type/code.
    pub defined: bool,
    /// "DDP type 2 code 0x01".
    pub text: String,
    /// M: the DDP segment length is valid.
    pub m: bool,
    /// D: the terminated DDP header follows.
    pub d: bool,
    /// R: the terminated Read Request follows.
    pub r: bool,
}

impl From<TerminateHeader> for TerminateReading {
    fn from(h: TerminateHeader) -> Self {
        let c: TerminateCode = h.cause;
        TerminateReading {
            layer: c.layer.to_u8(),
            error_type: c.error_type,
            code: c.code,
            defined: c.is_defined(),
            text: c.to_string(),
            m: h.m,
            d: h.d,
            r: h.r,
        }
    }
}

/// A Terminate message (RFC 5040 section 4.8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TerminateInfo {
    /// The control word read as RFC 5040 lays it out.
    pub rfc: TerminateReading,
    /// The control word read with siw's bit-field layout (docs/protocol-notes.md#siws-bit-field-layout),
    /// when the RFC reading names an undefined code or the flag bits sit where siw puts them.
    pub siw: Option<TerminateReading>,
    /// Which reading the rest was decoded with: "rfc" or "siw".
    pub used: &'static str,
    /// The terminated DDP segment's length (M).
    pub segment_len: Option<u16>,
    /// The terminated DDP header (D).
    pub ddp_header: Option<DdpHeader>,
    /// The terminated Read Request body (R).
    pub read_request: Option<ReadRequestInfo>,
}

/// RFC 7306 Atomic Request body, as [`iwarp_rdmap::atomic::AtomicRequest`] decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AtomicRequestInfo {
    /// Atomic operation code, the low 4 bits of the first word ([`AtomicOp`]): 0 FetchAdd,
    /// 1 Swap, 2 CompareSwap.
    pub op: u32,
    /// The operation's name.
    pub op_name: &'static str,
    /// Request identifier.
    pub request_id: u32,
    /// Remote STag.
    pub remote_stag: u32,
    /// Remote tagged offset.
    pub remote_to: u64,
    /// Add or swap data.
    pub add_swap_data: u64,
    /// Add or swap mask.
    pub add_swap_mask: u64,
    /// Compare data.
    pub compare_data: u64,
    /// Compare mask.
    pub compare_mask: u64,
}

/// The RDMAP message body, as far as the dissector decodes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Body {
    /// Read Request.
    ReadRequest(ReadRequestInfo),
    /// Terminate.
    Terminate(TerminateInfo),
    /// RFC 7306 Immediate Data: 8 bytes.
    ImmediateData {
        /// The data, big-endian.
        data: u64,
    },
    /// RFC 7306 Atomic Request.
    AtomicRequest(AtomicRequestInfo),
    /// RFC 7306 Atomic Response.
    AtomicResponse {
        /// Request identifier.
        request_id: u32,
        /// The original remote data.
        original: u64,
    },
}

/// A decoded DDP segment with its RDMAP message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// The DDP header.
    #[serde(flatten)]
    pub header: DdpHeader,
    /// The RDMAP opcode (0x0..=0xB).
    pub opcode_value: u8,
    /// Payload octets after the DDP header.
    pub payload_len: usize,
    /// The decoded RDMAP body, for Read Request, Terminate, Immediate Data and atomics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Body>,
}

impl From<AtomicRequest> for AtomicRequestInfo {
    fn from(r: AtomicRequest) -> Self {
        AtomicRequestInfo {
            op: r.op.to_u32(),
            op_name: match r.op {
                AtomicOp::FetchAdd => "FetchAdd",
                AtomicOp::Swap => "Swap",
                AtomicOp::CompareSwap => "CompareSwap",
                AtomicOp::Unknown(_) => "unknown",
            },
            request_id: r.request_id,
            remote_stag: r.remote_stag.0,
            remote_to: r.remote_to.0,
            add_swap_data: r.add_or_swap_data,
            add_swap_mask: r.add_or_swap_mask,
            compare_data: r.compare_data,
            compare_mask: r.compare_mask,
        }
    }
}

fn header_info(h: &HeaderRepr) -> DdpHeader {
    let model = match h.kind {
        SegmentKind::Tagged { stag, to } => Model::Tagged { stag: stag.0, to: to.0 },
        SegmentKind::Untagged { rdmap_word, qn, msn, mo } => {
            Model::Untagged { rdmap_word, qn: u32::from(qn), msn: msn.0, mo }
        }
    };
    DdpHeader {
        last: h.last,
        rdmap_control: h.rdmap_control,
        opcode: Control::from_byte(h.rdmap_control).opcode.name(),
        model,
    }
}

/// Decodes a ULPDU as a DDP segment and its RDMAP message; `Err` describes a malformed one.
///
/// `siw_hint`: the sender looks like Linux siw, so a Terminate's control word is also read
/// with siw's layout.
pub fn decode(ulpdu: &[u8], siw_hint: bool) -> Result<Segment, String> {
    let (h, hlen) = HeaderRepr::parse(ulpdu).map_err(|e| match e {
        HeaderError::BadDdpVersion { .. } => e.to_string(),
        _ => format!("malformed DDP segment: {e}"),
    })?;
    let control = Control::from_byte(h.rdmap_control);
    if control.version != RDMAP_VERSION {
        return Err(format!("invalid RDMAP version {} (expected {RDMAP_VERSION})", control.version));
    }
    let op = control.opcode;
    if let Opcode::Unknown(v) = op {
        return Err(format!("unknown RDMAP opcode 0x{v:x}"));
    }
    if op.is_tagged() != h.is_tagged() {
        let (model, want) = if h.is_tagged() { ("tagged", "untagged") } else { ("untagged", "tagged") };
        return Err(format!("RDMAP {} (a {want} message) in a {model} DDP segment", op.name()));
    }
    let payload = ulpdu.get(hlen..).unwrap_or(&[]);
    let body = decode_body(op, payload, siw_hint)?;
    Ok(Segment { header: header_info(&h), opcode_value: op.bits(), payload_len: payload.len(), body })
}

fn short(what: &str, t: Truncated) -> String {
    format!("{what} truncated: {} bytes needed, {} present", t.needed, t.got)
}

fn decode_body(op: Opcode, p: &[u8], siw_hint: bool) -> Result<Option<Body>, String> {
    Ok(Some(match op {
        Opcode::ReadRequest => {
            let r = ReadRequest::parse(p).map_err(|e| format!("Read Request body: {e}"))?;
            Body::ReadRequest(r.into())
        }
        Opcode::Terminate => Body::Terminate(decode_terminate(p, siw_hint)?),
        Opcode::ImmediateData | Opcode::ImmediateDataSe => {
            let d = ImmediateData::parse(p).map_err(|e| short("Immediate Data", e))?;
            Body::ImmediateData { data: u64::from_be_bytes(d.to_bytes()) }
        }
        Opcode::AtomicRequest => {
            let r = AtomicRequest::parse(p).map_err(|e| short("Atomic Request body", e))?;
            Body::AtomicRequest(r.into())
        }
        Opcode::AtomicResponse => {
            let r = AtomicResponse::parse(p).map_err(|e| short("Atomic Response body", e))?;
            Body::AtomicResponse { request_id: r.request_id, original: r.original_data }
        }
        _ => return Ok(None),
    }))
}

fn decode_terminate(p: &[u8], siw_hint: bool) -> Result<TerminateInfo, String> {
    let rfc = TerminateHeader::parse(p).map_err(|e| format!("Terminate control word: {e}"))?;
    let siw = TerminateHeader::parse_siw(p).map_err(|e| format!("Terminate control word: {e}"))?;
    let flags = p.get(2).copied().unwrap_or(0);
    // siw puts M/D/R in bits 0..2 of the third byte, where the RFC has reserved bits.
    let siw_flags = flags & 0xe0 == 0 && flags & 0x07 != 0;
    let show_siw = siw_hint || !rfc.cause.is_defined() || siw_flags;
    let use_siw = show_siw && (!rfc.cause.is_defined() || siw_flags) && siw.cause.is_defined();
    // The rest of the body (segment length, copied DDP header, copied Read Request) is laid out
    // as iwarp_rdmap::terminate documents; only the control word's reading differs.
    let parse = if use_siw { TerminateMessage::parse_siw } else { TerminateMessage::parse };
    let msg = parse(p).map_err(|e| short("Terminate message", e))?;
    let ddp_header = match &msg.ddp_header {
        Some(copy) => {
            let h = copy.header().map_err(|e| format!("Terminate's copied DDP header: {e}"))?;
            Some(header_info(&h))
        }
        None => None,
    };
    Ok(TerminateInfo {
        rfc: rfc.into(),
        siw: show_siw.then(|| siw.into()),
        used: if use_siw { "siw" } else { "rfc" },
        segment_len: msg.ddp_segment_len,
        ddp_header,
        read_request: msg.rdmap_header.as_ref().and_then(|r| ReadRequest::parse(r).ok()).map(Into::into),
    })
}
