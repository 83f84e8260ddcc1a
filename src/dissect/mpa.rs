//! MPA: find the Request/Reply of a reassembled TCP connection and deframe its FPDUs.
//!
//! The direction whose stream starts with "MPA ID Req Frame" is the initiator's. CRC is on when
//! either frame has C; markers flow toward the responder when the Reply has M and toward the
//! initiator when the Request has M (RFC 5044 section 7.1). Each direction is deframed from the
//! first octet after its frame (stream position 0, where markers are anchored) with a lenient
//! [`Deframer`], so a bad CRC is reported and decoding goes on.

use iwarp_mpa::frame::{REPLY_KEY, REQUEST_KEY};
use iwarp_mpa::{CrcCheck, DeframeError, Deframed, Deframer, FrameKind, FrameRepr};

use super::tcp::{self, Reassembler};
use super::{
    Connection, CrcVerdict, DdpControl, Dir, FpduInfo, FrameInfo, IrdOrdInfo, Negotiated, Note, Options,
    Violation, ViolationKind,
};

/// How many differing retransmissions are listed per direction before the rest are counted.
const MAX_CONFLICT_NOTES: usize = 3;

struct Sink<'a> {
    conn: usize,
    violations: &'a mut Vec<Violation>,
    notes: &'a mut Vec<Note>,
}

impl Sink<'_> {
    fn note(&mut self, message: String) {
        self.notes.push(Note { conn: Some(self.conn), message });
    }

    fn violation(
        &mut self,
        kind: ViolationKind,
        dir: Option<Dir>,
        frame: Option<usize>,
        offset: Option<u64>,
        message: String,
    ) {
        self.violations.push(Violation { kind, conn: self.conn, dir, frame, offset, message });
    }
}

fn frame_info(repr: &FrameRepr<'_>, raw: &[u8], frame: Option<usize>) -> FrameInfo {
    let flags = raw.get(16).copied().unwrap_or(0);
    let pd = raw.get(iwarp_mpa::frame::HEADER_LEN..repr.buffer_len()).unwrap_or(&[]);
    FrameInfo {
        frame,
        revision: repr.revision,
        flags,
        markers: repr.markers,
        crc: repr.crc,
        reject: repr.reject,
        enhanced: repr.ird_ord.is_some(),
        pd_len: repr.pd_len(),
        private_data: pd.to_vec(),
        ird_ord: repr.ird_ord.map(|w| IrdOrdInfo {
            ird: w.ird,
            ord: w.ord,
            p2p: w.peer_to_peer,
            rtr_send: w.rtr.send,
            rtr_write: w.rtr.write,
            rtr_read: w.rtr.read,
        }),
    }
}

/// Parses the frame at the start of `dir`'s stream: the frame and its length, or `None` after
/// recording why not.
fn parse_frame<'s>(
    stream: &'s Reassembler,
    expected: FrameKind,
    dir: Dir,
    sink: &mut Sink<'_>,
) -> Option<(FrameRepr<'s>, usize)> {
    let bytes = stream.contiguous();
    if bytes.is_empty() {
        sink.note(format!("no MPA {expected} seen"));
        return None;
    }
    match FrameRepr::parse_prefix(bytes) {
        Ok(Some((repr, len))) if repr.kind == expected => Some((repr, len)),
        Ok(Some((repr, _))) => {
            sink.violation(
                ViolationKind::MalformedFrame,
                Some(dir),
                stream.frame_of(0),
                Some(0),
                format!("expected an MPA {expected}, found an MPA {}", repr.kind),
            );
            None
        }
        Ok(None) => {
            sink.note(format!("MPA {expected} incomplete in the capture ({} bytes)", bytes.len()));
            None
        }
        Err(e) => {
            sink.violation(
                ViolationKind::MalformedFrame,
                Some(dir),
                stream.frame_of(0),
                Some(0),
                format!("MPA {expected}: {e}"),
            );
            None
        }
    }
}

/// Analyses one TCP connection; `id` numbers it in the report.
pub fn analyse(
    id: usize,
    conn: &tcp::Connection,
    options: &Options,
    violations: &mut Vec<Violation>,
    notes: &mut Vec<Note>,
) -> Connection {
    let mut sink = Sink { conn: id, violations, notes };
    let mut out = Connection {
        id,
        initiator: conn.client,
        responder: conn.server,
        first_frame: conn.first_frame,
        mpa: false,
        request: None,
        reply: None,
        negotiated: None,
        fpdus: Vec::new(),
    };
    let starts_req = |r: &Reassembler| r.contiguous().starts_with(REQUEST_KEY);
    let (init, resp) = if starts_req(&conn.to_server) {
        (&conn.to_server, &conn.to_client)
    } else if starts_req(&conn.to_client) {
        out.initiator = conn.server;
        out.responder = conn.client;
        (&conn.to_client, &conn.to_server)
    } else {
        let (a, b) = (conn.to_server.contiguous().len(), conn.to_client.contiguous().len());
        let mid = if conn.to_server.syn_seen() || conn.to_client.syn_seen() {
            ""
        } else {
            ", capture starts mid-connection"
        };
        let reply_first = conn.to_server.contiguous().starts_with(REPLY_KEY)
            || conn.to_client.contiguous().starts_with(REPLY_KEY);
        let what = if reply_first { "MPA Reply without a Request" } else { "no MPA handshake seen" };
        sink.note(format!("{} -> {}: {what} ({a}+{b} bytes{mid})", conn.client, conn.server));
        return out;
    };
    out.mpa = true;
    let Some((req, req_len)) = parse_frame(init, FrameKind::Request, Dir::InitiatorToResponder, &mut sink)
    else {
        return out;
    };
    out.request = Some(frame_info(&req, init.contiguous(), init.frame_of(req_len.saturating_sub(1) as u64)));
    let Some((rep, rep_len)) = parse_frame(resp, FrameKind::Reply, Dir::ResponderToInitiator, &mut sink)
    else {
        return out;
    };
    out.reply = Some(frame_info(&rep, resp.contiguous(), resp.frame_of(rep_len.saturating_sub(1) as u64)));
    let rtr = match (req.ird_ord, rep.ird_ord) {
        (Some(q), Some(p)) if q.peer_to_peer && p.peer_to_peer => {
            let t = p.rtr;
            if t.write {
                Some("write")
            } else if t.read {
                Some("read")
            } else if t.send {
                Some("send")
            } else {
                None
            }
        }
        _ => None,
    };
    let neg = Negotiated {
        crc: req.crc || rep.crc,
        markers_to_responder: rep.markers,
        markers_to_initiator: req.markers,
        rtr,
        rejected: rep.reject,
    };
    out.negotiated = Some(neg);
    if rep.reject {
        let extra =
            init.contiguous().len().saturating_sub(req_len) + resp.contiguous().len().saturating_sub(rep_len);
        if extra > 0 {
            sink.note(format!("connection rejected; {extra} bytes after the handshake not decoded"));
        }
        return out;
    }
    // siw sets a private GSO bit (0x08) in the MPA flags: a hint that its Terminates use siw's
    // bit-field layout.
    let siw = |f: &Option<FrameInfo>| f.as_ref().is_some_and(|f| f.flags & 0x08 != 0);
    let dirs = [
        (Dir::InitiatorToResponder, init, req_len, neg.markers_to_responder, siw(&out.request)),
        (Dir::ResponderToInitiator, resp, rep_len, neg.markers_to_initiator, siw(&out.reply)),
    ];
    for (dir, stream, start, markers, siw_hint) in dirs {
        let framing = Framing { crc: neg.crc, markers, siw_hint };
        deframe_direction(dir, stream, start, framing, options, &mut out.fpdus, &mut sink);
    }
    out.fpdus.sort_by_key(|f| f.frame.unwrap_or(usize::MAX));
    let first = |d: Dir| out.fpdus.iter().find(|f| f.dir == d).and_then(|f| f.frame);
    let early = |limit: usize| {
        out.fpdus
            .iter()
            .filter(|f| f.dir == Dir::ResponderToInitiator && f.frame.is_some_and(|fr| fr < limit))
            .count()
    };
    if let Some(r) = first(Dir::ResponderToInitiator) {
        let i = first(Dir::InitiatorToResponder);
        if i.is_none_or(|i| r < i) {
            let n = early(i.unwrap_or(usize::MAX));
            let after = match i {
                Some(i) => format!("frame {i}"),
                None => "the initiator sent none".to_string(),
            };
            sink.violation(
                ViolationKind::ResponderFirst,
                Some(Dir::ResponderToInitiator),
                Some(r),
                None,
                format!(
                    "responder sent {n} FPDU{} before the initiator's first FPDU ({after}; RFC 5044 \
                     section 7.1: the initiator sends first)",
                    if n == 1 { "" } else { "s" }
                ),
            );
        }
    }
    for v in super::ddp::check_connection(&out) {
        sink.violation(v.kind, v.dir, v.frame, v.offset, v.message);
    }
    out
}

/// How one direction is framed.
#[derive(Clone, Copy)]
struct Framing {
    crc: bool,
    markers: bool,
    /// The sender looks like siw (Terminates also read with siw's layout).
    siw_hint: bool,
}

fn deframe_direction(
    dir: Dir,
    stream: &Reassembler,
    start: usize,
    framing: Framing,
    options: &Options,
    fpdus: &mut Vec<FpduInfo>,
    sink: &mut Sink<'_>,
) {
    let Framing { crc, markers, siw_hint } = framing;
    let bytes = stream.contiguous().get(start..).unwrap_or(&[]);
    let mut deframer = Deframer::new(crc, markers).lenient();
    let mut off = 0usize;
    let mut index = 0usize;
    let tcp_off = |o: usize| (start + o) as u64;
    loop {
        let rest = bytes.get(off..).unwrap_or(&[]);
        if rest.is_empty() {
            break;
        }
        match deframer.deframe(rest) {
            Ok(Deframed::Fpdu(f)) => {
                index += 1;
                let frame = stream.frame_of(tcp_off(off + f.wire_len - 1));
                let verdict = match f.crc {
                    CrcCheck::Good(value) => CrcVerdict::Good { value },
                    CrcCheck::NotChecked(value) => CrcVerdict::NotChecked { value },
                    CrcCheck::Bad { computed, received } => CrcVerdict::Bad { computed, received },
                };
                let ddp = match f.ulpdu {
                    [a, b, ..] => Some(DdpControl::from_bytes(*a, *b)),
                    _ => None,
                };
                // A bad-CRC FPDU's contents are not trusted (a receiver drops it): not decoded.
                let decoded = if matches!(verdict, CrcVerdict::Bad { .. }) {
                    Ok(None)
                } else {
                    super::ddp::decode(f.ulpdu, siw_hint).map(Some)
                };
                let segment = match decoded {
                    Ok(s) => s,
                    Err(e) => {
                        sink.violation(
                            ViolationKind::MalformedDdp,
                            Some(dir),
                            frame,
                            Some(f.position),
                            format!("FPDU #{}: {e}", index),
                        );
                        None
                    }
                };
                let info = FpduInfo {
                    dir,
                    index,
                    frame,
                    offset: f.position,
                    wire_len: f.wire_len,
                    ulpdu_len: f.ulpdu.len(),
                    pad: f.pad,
                    crc: verdict,
                    markers: if markers {
                        iwarp_mpa::fpdu::marker_positions(f.position, f.wire_len).collect()
                    } else {
                        Vec::new()
                    },
                    ddp,
                    segment,
                    ulpdu: options.keep_ulpdu.then(|| f.ulpdu.to_vec()),
                };
                off += f.wire_len;
                match verdict {
                    CrcVerdict::Bad { .. } => sink.violation(
                        ViolationKind::BadCrc,
                        Some(dir),
                        frame,
                        Some(info.offset),
                        format!("FPDU #{index}: {verdict}"),
                    ),
                    CrcVerdict::NotChecked { value } if value != 0 => sink.note(format!(
                        "{dir} FPDU #{index} @{}: CRC not negotiated but the CRC field is 0x{value:08x}",
                        info.offset
                    )),
                    _ => {}
                }
                fpdus.push(info);
            }
            Ok(Deframed::NeedMore(n)) => {
                sink.note(format!(
                    "{dir} @{}: incomplete FPDU at the end of the captured stream ({} of {n} bytes)",
                    deframer.position(),
                    rest.len()
                ));
                break;
            }
            Err(e) => {
                index += 1;
                let pos = deframer.position();
                let kind = match e {
                    DeframeError::Crc { .. } => ViolationKind::BadCrc,
                    DeframeError::Marker { .. } => ViolationKind::BadMarker,
                    DeframeError::UlpduTooLong { .. } => ViolationKind::MalformedFrame,
                };
                let frame = stream.frame_of(tcp_off(off));
                sink.violation(kind, Some(dir), frame, Some(pos), format!("FPDU #{index}: {e}"));
                match e.wire_len() {
                    Some(n) if n <= rest.len() => {
                        deframer.skip(n);
                        off += n;
                    }
                    _ => {
                        sink.note(format!(
                            "{dir}: stopped deframing at @{pos}; {} bytes not decoded",
                            rest.len()
                        ));
                        break;
                    }
                }
            }
        }
    }
    for gap in stream.gaps().iter().take(1) {
        sink.note(format!(
            "{dir}: gap in the capture at TCP stream offset {} ({} bytes missing); {} bytes after it not decoded",
            gap.offset,
            gap.len,
            stream.beyond_gap()
        ));
    }
    let conflicts = stream.conflicts();
    for c in conflicts.iter().take(MAX_CONFLICT_NOTES) {
        sink.note(format!(
            "{dir}: retransmission in frame {} differs from the first copy at TCP stream offset {}",
            c.frame, c.offset
        ));
    }
    if conflicts.len() > MAX_CONFLICT_NOTES {
        sink.note(format!("{dir}: {} more differing retransmissions", conflicts.len() - MAX_CONFLICT_NOTES));
    }
}
