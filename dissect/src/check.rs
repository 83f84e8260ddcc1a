//! The message sequence of each direction of a connection: MSN and MO per untagged queue, Read
//! Responses against their requests, the RTR of peer-to-peer mode, who sends first.

use std::collections::{BTreeMap, VecDeque};

use iwarp_rdmap::Opcode;

use crate::ddp::{Body, Model, ReadRequestInfo};
use crate::record::{Connection, Dir, FpduInfo, ViolationKind};

/// A finding of a [`Checker`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Which check.
    pub kind: ViolationKind,
    /// Direction.
    pub dir: Option<Dir>,
    /// Frame of the FPDU concerned.
    pub frame: Option<usize>,
    /// Stream offset of the FPDU concerned.
    pub offset: Option<u64>,
    /// What is wrong.
    pub message: String,
}

struct Queue {
    /// The next MSN, unknown after an FPDU that could not be decoded.
    expected: Option<u32>,
    /// (MSN, next MO) of a message whose L segment has not come yet.
    open: Option<(u32, u64)>,
}

struct ReadResp {
    stag: u32,
    to: u64,
    total: u64,
    frame: Option<usize>,
    offset: u64,
}

/// The sequence state of one direction.
#[derive(Default)]
struct DirState {
    queues: BTreeMap<u32, Queue>,
    /// The Read Response being received.
    resp: Option<ReadResp>,
    /// After an FPDU that did not decode (bad CRC, malformed), the sequence state is unknown.
    lost: bool,
    /// Read Requests sent this way and not answered yet: (FPDU index, request).
    requests: VecDeque<(usize, ReadRequestInfo)>,
    /// Whether an FPDU of this direction was seen.
    started: bool,
}

/// Follows the DDP/RDMAP sequence of one connection, one FPDU at a time in capture order:
/// MSN gaps and repeats per untagged queue, MO jumps within a message, Read Responses whose
/// length or sink STag do not match their Read Request (answered in order from the other
/// direction, RFC 5040 section 5.5), and a missing or wrong RTR on a peer-to-peer connection.
/// It keeps per-queue state and the unanswered Read Requests, never the FPDUs.
pub struct Checker {
    /// The RTR agreed on a peer-to-peer connection.
    rtr: Option<&'static str>,
    dirs: [DirState; 2],
}

fn dir_index(d: Dir) -> usize {
    match d {
        Dir::InitiatorToResponder => 0,
        Dir::ResponderToInitiator => 1,
    }
}

impl Checker {
    /// A checker for `conn`, whose handshake (Reply, negotiated settings) is known.
    pub fn new(conn: &Connection) -> Checker {
        let p2p = conn.reply.as_ref().and_then(|r| r.ird_ord).is_some_and(|w| w.p2p);
        let rtr = if p2p { conn.negotiated.and_then(|n| n.rtr) } else { None };
        Checker { rtr, dirs: Default::default() }
    }

    /// Checks the next FPDU of the connection; findings are appended to `out`.
    pub fn fpdu(&mut self, f: &FpduInfo, out: &mut Vec<Finding>) {
        use ViolationKind as K;
        let find = |kind, message: String| Finding {
            kind,
            dir: Some(f.dir),
            frame: f.frame,
            offset: Some(f.offset),
            message,
        };
        let d = dir_index(f.dir);
        let first = !self.dirs[d].started;
        self.dirs[d].started = true;
        if first && f.dir == Dir::InitiatorToResponder {
            self.rtr_check(f, out);
        }
        let state = &mut self.dirs[d];
        let Some(s) = &f.segment else {
            state.lost = true;
            for q in state.queues.values_mut() {
                q.expected = None;
                q.open = None;
            }
            state.resp = None;
            return;
        };
        match s.header.model {
            Model::Untagged { qn, msn, mo, .. } => {
                let lost = state.lost;
                let q =
                    state.queues.entry(qn).or_insert(Queue { expected: (!lost).then_some(1), open: None });
                let mo = u64::from(mo);
                match q.open {
                    Some((m, next)) if m == msn => {
                        if mo != next {
                            out.push(find(
                                K::MoMismatch,
                                format!(
                                    "FPDU #{}: QN {qn} MSN {msn}: MO {mo}, expected {next} (the previous segments' payload)",
                                    f.index
                                ),
                            ));
                        }
                    }
                    open => {
                        if let Some((m, _)) = open {
                            out.push(find(
                                K::MsnSequence,
                                format!(
                                    "FPDU #{}: QN {qn}: MSN {msn} starts before message MSN {m} ended (no L segment)",
                                    f.index
                                ),
                            ));
                        } else if let Some(expected) = q.expected.filter(|&e| e != msn) {
                            let what =
                                if msn.wrapping_sub(expected) > u32::MAX / 2 { "repeat" } else { "gap" };
                            out.push(find(
                                K::MsnSequence,
                                format!(
                                    "FPDU #{}: QN {qn}: MSN {what}: MSN {msn}, expected {expected}",
                                    f.index
                                ),
                            ));
                        }
                        if mo != 0 && q.expected.is_some() {
                            out.push(find(
                                K::MoMismatch,
                                format!(
                                    "FPDU #{}: QN {qn} MSN {msn}: first segment of the message has MO {mo}, expected 0",
                                    f.index
                                ),
                            ));
                        }
                    }
                }
                let next = mo + s.payload_len as u64;
                if s.header.last {
                    q.open = None;
                    q.expected = Some(msn.wrapping_add(1));
                } else {
                    q.open = Some((msn, next));
                }
                if let Some(Body::ReadRequest(r)) = &s.body {
                    state.requests.push_back((f.index, *r));
                }
            }
            Model::Tagged { stag, to } => {
                if s.opcode_value != Opcode::ReadResponse.bits() {
                    return;
                }
                let r = state.resp.get_or_insert(ReadResp {
                    stag,
                    to,
                    total: 0,
                    frame: f.frame,
                    offset: f.offset,
                });
                r.total += s.payload_len as u64;
                if s.header.last
                    && let Some(r) = state.resp.take()
                {
                    self.match_response(f.dir, &r, out);
                }
            }
        }
    }

    /// Matches a whole Read Response with the oldest unanswered Read Request of the other
    /// direction.
    fn match_response(&mut self, dir: Dir, r: &ReadResp, out: &mut Vec<Finding>) {
        let other = match dir {
            Dir::InitiatorToResponder => Dir::ResponderToInitiator,
            Dir::ResponderToInitiator => Dir::InitiatorToResponder,
        };
        let mk = |message: String| Finding {
            kind: ViolationKind::ReadResponse,
            dir: Some(dir),
            frame: r.frame,
            offset: Some(r.offset),
            message,
        };
        let Some((idx, q)) = self.dirs[dir_index(other)].requests.pop_front() else {
            out.push(mk(format!("Read Response (STag 0x{:08x}) without a Read Request", r.stag)));
            return;
        };
        if r.stag != q.sink_stag || r.to != q.sink_to {
            out.push(mk(format!(
                "Read Response to STag 0x{:08x} TO 0x{:x}, but its Read Request ({other} FPDU #{idx}) names sink 0x{:08x}/0x{:x}",
                r.stag, r.to, q.sink_stag, q.sink_to
            )));
        }
        if r.total != u64::from(q.size) {
            out.push(mk(format!(
                "Read Response of {} bytes, but its Read Request ({other} FPDU #{idx}) asked for {}",
                r.total, q.size
            )));
        }
    }

    /// The initiator's first FPDU on a peer-to-peer connection must be the agreed RTR message.
    fn rtr_check(&self, first: &FpduInfo, out: &mut Vec<Finding>) {
        let Some(rtr) = self.rtr else { return };
        let ok = first.segment.as_ref().is_some_and(|s| match rtr {
            "write" => s.opcode_value == Opcode::Write.bits() && s.payload_len == 0 && s.header.last,
            "read" => matches!(s.body, Some(Body::ReadRequest(r)) if r.size == 0),
            _ => s.opcode_value == Opcode::Send.bits() && s.payload_len == 0,
        });
        if !ok {
            out.push(Finding {
                kind: ViolationKind::Rtr,
                dir: Some(first.dir),
                frame: first.frame,
                offset: Some(first.offset),
                message: format!(
                    "peer-to-peer: the initiator's first FPDU is not the zero-length {rtr} RTR message"
                ),
            });
        }
    }
}
