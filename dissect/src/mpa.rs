//! MPA: find the Request/Reply of a reassembled TCP connection and deframe its FPDUs.
//!
//! The direction whose stream starts with "MPA ID Req Frame" is the initiator's. CRC is on when
//! either frame has C; markers flow toward the responder when the Reply has M and toward the
//! initiator when the Request has M (RFC 5044 section 7.1). Each direction is deframed from the
//! first octet after its frame (stream position 0, where markers are anchored) with a lenient
//! [`Deframer`], so a bad CRC is reported and decoding goes on.
//!
//! The two directions are deframed side by side and their FPDUs handed to the [`Sink`] one at a
//! time, in the order of the frames that completed them: nothing of a connection is kept but
//! its reassembled streams and the sequence state of [`crate::check::Checker`].

use iwarp_mpa::frame::{REPLY_KEY, REQUEST_KEY};
use iwarp_mpa::{CrcCheck, DeframeError, Deframed, Deframer, FrameKind, FrameRepr};

use super::check::Checker;
use super::tcp::{self, Reassembler};
use super::{
    Connection, CrcVerdict, DdpControl, Dir, FpduInfo, FrameInfo, IrdOrdInfo, Negotiated, Note, Options,
    Sink, Violation, ViolationKind,
};

/// How many differing retransmissions are listed per direction before the rest are counted.
const MAX_CONFLICT_NOTES: usize = 3;

/// A violation or a note, before it is handed to the sink.
#[derive(Debug)]
enum Found {
    Violation(Violation),
    Note(Note),
}

/// Findings about one connection.
struct Findings {
    conn: usize,
    list: Vec<Found>,
}

impl Findings {
    fn new(conn: usize) -> Findings {
        Findings { conn, list: Vec::new() }
    }

    fn note(&mut self, message: String) {
        self.list.push(Found::Note(Note { conn: Some(self.conn), message }));
    }

    fn violation(
        &mut self,
        kind: ViolationKind,
        dir: Option<Dir>,
        frame: Option<usize>,
        offset: Option<u64>,
        message: String,
    ) {
        self.list.push(Found::Violation(Violation { kind, conn: self.conn, dir, frame, offset, message }));
    }

    /// Hands the findings to `sink`, oldest first, and forgets them.
    fn flush(&mut self, sink: &mut dyn Sink) {
        for f in self.list.drain(..) {
            match f {
                Found::Violation(v) => sink.violation(&v),
                Found::Note(n) => sink.note(&n),
            }
        }
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
    found: &mut Findings,
) -> Option<(FrameRepr<'s>, usize)> {
    let bytes = stream.contiguous();
    if bytes.is_empty() {
        found.note(format!("no MPA {expected} seen"));
        return None;
    }
    match FrameRepr::parse_prefix(bytes) {
        Ok(Some((repr, len))) if repr.kind == expected => Some((repr, len)),
        Ok(Some((repr, _))) => {
            found.violation(
                ViolationKind::MalformedFrame,
                Some(dir),
                stream.frame_of(0),
                Some(0),
                format!("expected an MPA {expected}, found an MPA {}", repr.kind),
            );
            None
        }
        Ok(None) => {
            found.note(format!("MPA {expected} incomplete in the capture ({} bytes)", bytes.len()));
            None
        }
        Err(e) => {
            found.violation(
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

/// What the handshake settled, for the FPDUs that follow it.
struct Handshake {
    init_len: usize,
    resp_len: usize,
    neg: Negotiated,
}

/// Finds the MPA handshake of `conn` and fills in `out`'s Request, Reply and negotiated
/// settings; `None` when no FPDUs follow (no MPA, a frame missing or malformed, a rejection).
fn handshake<'c>(
    conn: &'c tcp::Connection,
    out: &mut Connection,
    found: &mut Findings,
) -> Option<(&'c Reassembler, &'c Reassembler, Handshake)> {
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
        found.note(format!("{} -> {}: {what} ({a}+{b} bytes{mid})", conn.client, conn.server));
        return None;
    };
    out.mpa = true;
    let (req, req_len) = parse_frame(init, FrameKind::Request, Dir::InitiatorToResponder, found)?;
    out.request = Some(frame_info(&req, init.contiguous(), init.frame_of(req_len.saturating_sub(1) as u64)));
    let (rep, rep_len) = parse_frame(resp, FrameKind::Reply, Dir::ResponderToInitiator, found)?;
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
            found.note(format!("connection rejected; {extra} bytes after the handshake not decoded"));
        }
        return None;
    }
    Some((init, resp, Handshake { init_len: req_len, resp_len: rep_len, neg }))
}

/// Analyses one TCP connection (`id` numbers it): its record, then its FPDUs with the
/// violations and notes about them, go to `sink` as they are decoded.
pub fn analyse(id: usize, conn: &tcp::Connection, options: &Options, sink: &mut dyn Sink) {
    let mut found = Findings::new(id);
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
    let shaken = handshake(conn, &mut out, &mut found);
    sink.connection(&out);
    found.flush(sink);
    let Some((init, resp, hs)) = shaken else { return };
    // siw sets a private GSO bit (0x08) in the MPA flags: a hint that its Terminates use siw's
    // bit-field layout.
    let siw = |f: &Option<FrameInfo>| f.as_ref().is_some_and(|f| f.flags & 0x08 != 0);
    let neg = hs.neg;
    let mut dirs = [
        Direction::new(
            id,
            Dir::InitiatorToResponder,
            init,
            hs.init_len,
            Framing { crc: neg.crc, markers: neg.markers_to_responder, siw_hint: siw(&out.request) },
        ),
        Direction::new(
            id,
            Dir::ResponderToInitiator,
            resp,
            hs.resp_len,
            Framing { crc: neg.crc, markers: neg.markers_to_initiator, siw_hint: siw(&out.reply) },
        ),
    ];
    let mut checker = Checker::new(&out);
    let mut next = [dirs[0].next(options), dirs[1].next(options)];
    // FPDUs the responder sent before the initiator's first: (count, frame of the first).
    let mut responder_first: (usize, Option<usize>) = (0, None);
    let mut initiator_started = false;
    let mut checks = Vec::new();
    loop {
        // The direction whose next item was completed by the earlier frame goes first (the
        // initiator's on a tie); an item without a frame (the end of a stream) goes last.
        let key = |i: &Option<Item>| i.as_ref().map(|i| i.frame.unwrap_or(usize::MAX));
        let pick = match (key(&next[0]), key(&next[1])) {
            (None, None) => break,
            (Some(_), None) => 0,
            (None, Some(_)) => 1,
            (Some(a), Some(b)) => usize::from(b < a),
        };
        let Some(mut item) = next[pick].take() else { break };
        if let Some(f) = &item.fpdu {
            match f.dir {
                Dir::ResponderToInitiator if !initiator_started => {
                    responder_first.0 += 1;
                    responder_first.1 = responder_first.1.or(f.frame);
                }
                Dir::InitiatorToResponder if !initiator_started => {
                    initiator_started = true;
                    responder_first_check(responder_first, f.frame, &mut found);
                    found.flush(sink);
                }
                _ => {}
            }
            sink.fpdu(id, f);
            checker.fpdu(f, &mut checks);
        }
        item.found.flush(sink);
        for c in checks.drain(..) {
            found.violation(c.kind, c.dir, c.frame, c.offset, c.message);
        }
        found.flush(sink);
        next[pick] = dirs[pick].next(options);
    }
    if !initiator_started {
        responder_first_check(responder_first, None, &mut found);
    }
    found.flush(sink);
}

/// The responder sent FPDUs before the initiator's first (RFC 5044 section 7.1), which came in
/// `initiator_frame` (or never).
fn responder_first_check(
    early: (usize, Option<usize>),
    initiator_frame: Option<usize>,
    found: &mut Findings,
) {
    let (n, frame) = early;
    if n == 0 {
        return;
    }
    let after = match initiator_frame {
        Some(i) => format!("frame {i}"),
        None => "the initiator sent none".to_string(),
    };
    found.violation(
        ViolationKind::ResponderFirst,
        Some(Dir::ResponderToInitiator),
        frame,
        None,
        format!(
            "responder sent {n} FPDU{} before the initiator's first FPDU ({after}; RFC 5044 \
             section 7.1: the initiator sends first)",
            if n == 1 { "" } else { "s" }
        ),
    );
}

/// How one direction is framed.
#[derive(Clone, Copy)]
struct Framing {
    crc: bool,
    markers: bool,
    /// The sender looks like siw (Terminates also read with siw's layout).
    siw_hint: bool,
}

/// What a direction yields at a time: an FPDU with the findings about it, or findings alone (a
/// framing error, the notes at the end of the stream).
struct Item {
    fpdu: Option<FpduInfo>,
    /// The frame that completed the FPDU, or where the error lies.
    frame: Option<usize>,
    found: Findings,
}

/// One direction of an MPA connection, deframed one FPDU at a time.
struct Direction<'s> {
    conn: usize,
    dir: Dir,
    stream: &'s Reassembler,
    /// Stream offset of the first octet after the Request or Reply.
    start: usize,
    framing: Framing,
    deframer: Deframer,
    /// Offset after `start` of the next FPDU.
    off: usize,
    /// FPDUs (and undecodable ones) so far.
    index: usize,
    done: bool,
}

impl<'s> Direction<'s> {
    fn new(conn: usize, dir: Dir, stream: &'s Reassembler, start: usize, framing: Framing) -> Direction<'s> {
        let deframer = Deframer::new(framing.crc, framing.markers).lenient();
        Direction { conn, dir, stream, start, framing, deframer, off: 0, index: 0, done: false }
    }

    /// The next item, or `None` after the end of the captured stream.
    fn next(&mut self, options: &Options) -> Option<Item> {
        let mut found = Findings::new(self.conn);
        let found = &mut found;
        let item = |fpdu, frame, found: &mut Findings| {
            Some(Item { fpdu, frame, found: std::mem::replace(found, Findings::new(0)) })
        };
        if self.done {
            return None;
        }
        let bytes = self.stream.contiguous().get(self.start..).unwrap_or(&[]);
        let rest = bytes.get(self.off..).unwrap_or(&[]);
        if rest.is_empty() {
            self.finish(found);
            return if found.list.is_empty() { None } else { item(None, None, found) };
        }
        let dir = self.dir;
        let tcp_off = |o: usize| (self.start + o) as u64;
        match self.deframer.deframe(rest) {
            Ok(Deframed::Fpdu(f)) => {
                self.index += 1;
                let index = self.index;
                let frame = self.stream.frame_of(tcp_off(self.off + f.wire_len - 1));
                let verdict = match f.crc {
                    CrcCheck::Good(value) => CrcVerdict::Good { value },
                    CrcCheck::NotChecked(value) => CrcVerdict::NotChecked { value },
                    CrcCheck::Bad { computed, received } => CrcVerdict::Bad { computed, received },
                };
                let ddp = match f.ulpdu {
                    [a, b, ..] => Some(DdpControl::from_bytes(*a, *b)),
                    _ => None,
                };
                // A bad-CRC FPDU's contents are not trusted (a receiver drops it): not
                // decoded.
                let decoded = if matches!(verdict, CrcVerdict::Bad { .. }) {
                    Ok(None)
                } else {
                    super::ddp::decode(f.ulpdu, self.framing.siw_hint).map(Some)
                };
                let segment = match decoded {
                    Ok(s) => s,
                    Err(e) => {
                        let m = format!("FPDU #{index}: {e}");
                        found.violation(ViolationKind::MalformedDdp, Some(dir), frame, Some(f.position), m);
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
                    markers: if self.framing.markers {
                        iwarp_mpa::fpdu::marker_positions(f.position, f.wire_len).collect()
                    } else {
                        Vec::new()
                    },
                    ddp,
                    segment,
                    ulpdu: options.keep_ulpdu.then(|| f.ulpdu.to_vec()),
                };
                self.off += f.wire_len;
                match verdict {
                    CrcVerdict::Bad { .. } => found.violation(
                        ViolationKind::BadCrc,
                        Some(dir),
                        frame,
                        Some(info.offset),
                        format!("FPDU #{index}: {verdict}"),
                    ),
                    CrcVerdict::NotChecked { value } if value != 0 => found.note(format!(
                        "{dir} FPDU #{index} @{}: CRC not negotiated but the CRC field is 0x{value:08x}",
                        info.offset
                    )),
                    _ => {}
                }
                item(Some(info), frame, found)
            }
            Ok(Deframed::NeedMore(n)) => {
                found.note(format!(
                    "{dir} @{}: incomplete FPDU at the end of the captured stream ({} of {n} bytes)",
                    self.deframer.position(),
                    rest.len()
                ));
                self.finish(found);
                item(None, None, found)
            }
            Err(e) => {
                self.index += 1;
                let pos = self.deframer.position();
                let kind = match e {
                    DeframeError::Crc { .. } => ViolationKind::BadCrc,
                    DeframeError::Marker { .. } => ViolationKind::BadMarker,
                    DeframeError::UlpduTooLong { .. } => ViolationKind::MalformedFrame,
                };
                let frame = self.stream.frame_of(tcp_off(self.off));
                found.violation(kind, Some(dir), frame, Some(pos), format!("FPDU #{}: {e}", self.index));
                match e.wire_len() {
                    Some(n) if n <= rest.len() => {
                        self.deframer.skip(n);
                        self.off += n;
                    }
                    _ => {
                        found.note(format!(
                            "{dir}: stopped deframing at @{pos}; {} bytes not decoded",
                            rest.len()
                        ));
                        self.finish(found);
                    }
                }
                item(None, frame, found)
            }
        }
    }

    /// The notes about the captured stream itself: the first gap, differing retransmissions.
    fn finish(&mut self, found: &mut Findings) {
        self.done = true;
        let (dir, stream) = (self.dir, self.stream);
        for gap in stream.gaps().iter().take(1) {
            found.note(format!(
                "{dir}: gap in the capture at TCP stream offset {} ({} bytes missing); {} bytes after it not decoded",
                gap.offset,
                gap.len,
                stream.beyond_gap()
            ));
        }
        let conflicts = stream.conflicts();
        for c in conflicts.iter().take(MAX_CONFLICT_NOTES) {
            found.note(format!(
                "{dir}: retransmission in frame {} differs from the first copy at TCP stream offset {}",
                c.frame, c.offset
            ));
        }
        if conflicts.len() > MAX_CONFLICT_NOTES {
            found.note(format!(
                "{dir}: {} more differing retransmissions",
                conflicts.len() - MAX_CONFLICT_NOTES
            ));
        }
    }
}
