//! Every Terminate code of the RFC 5040 section 7 table
//! (docs/protocol-notes.md#terminate-codes) that a peer can provoke, provoked by a crafted
//! ULPDU (or crafted MPA bytes) from a misbehaving peer. Each test checks the bytes of the
//! Terminate the victim sends back (DDP header, control word, M/D/R, the copied DDP header and
//! Read Request), the victim's event and state, that every outstanding work request completes
//! exactly once with a flush error, and that no region changed.
//!
//! Codes no peer can provoke on this queue pair (see the comments at the end of the file):
//! RDMAP 0/0/0x00 local catastrophic, 0/1/0xFF, 0/2/0x08, DDP 1/0/0x00, LLP 2/0/0x01
//! and 0x04..=0x07.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and patterns are small")]

mod common;

use common::{End, OTHER_PD, connect, connect_ext, deframe_all, parse_terminate, segment, tagged, untagged};
use iwarp_ddp::header::{SegmentKind, UNTAGGED_HEADER_LEN};
use iwarp_ddp::stag_table::{Access, Addressing, RegionSpec};
use iwarp_ddp::{Msn, STag, TaggedOffset, TerminateCode, TerminateLayer};
use iwarp_mpa::fpdu::marker_positions;
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::qp::{QpEvent, QpState, SendOp, SendWr, WcOpcode, WcStatus};
use iwarp_rdmap::{Opcode, ReadRequest};

// Region indices in `Scenario::v.regions`.
const DST: usize = 0; // VA-based, remote write
const RO: usize = 1; // VA-based, remote read only
const FOREIGN: usize = 2; // another protection domain, all remote rights
const ZB: usize = 3; // zero-based, remote write
const RECV: usize = 4; // local write: receive buffers
const SRC: usize = 5; // no rights: source of the victim's own Send
const SINK: usize = 6; // local write: sink of the victim's own Read

const SEND_WR: u64 = 100;
const RECV_LEN: u32 = 64;

/// Which headers the Terminate must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copies {
    /// No M, D, R.
    None,
    /// M and D: the segment length and the offending DDP header.
    Ddp,
    /// M, D and R: also the offending Read Request.
    DdpAndReadRequest,
}

struct Scenario {
    attacker: Connection,
    v: End,
    crc: bool,
    markers: bool,
    /// Every work request posted on the victim.
    posted: Vec<u64>,
}

impl Scenario {
    /// A victim with its regions, one Send queued (not yet transmitted) and `recvs` receive
    /// buffers of [`RECV_LEN`] bytes.
    fn new(crc: bool, markers: bool, recvs: u64) -> Scenario {
        let (attacker, victim) = connect(crc, markers, 2);
        let mut v = End::new(victim);
        let rw = Access::REMOTE_WRITE.union(Access::LOCAL_WRITE);
        assert_eq!(v.register(256, rw, Addressing::VirtualAddress), DST);
        assert_eq!(v.register(256, Access::REMOTE_READ, Addressing::VirtualAddress), RO);
        let all = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);
        assert_eq!(v.register_in(OTHER_PD, 256, 320, all, Addressing::VirtualAddress, 77), FOREIGN);
        assert_eq!(v.register(128, Access::REMOTE_WRITE, Addressing::ZeroBased), ZB);
        assert_eq!(v.register(1024, Access::LOCAL_WRITE, Addressing::VirtualAddress), RECV);
        assert_eq!(v.register(64, Access::NONE, Addressing::VirtualAddress), SRC);
        assert_eq!(v.register(256, Access::LOCAL_WRITE, Addressing::VirtualAddress), SINK);
        let sge = v.regions[SRC].sge(0, 8);
        v.post_send(SendWr {
            wr_id: SEND_WR,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: sge.into(),
            signaled: true,
        });
        let mut posted = vec![SEND_WR];
        for i in 0..recvs {
            let sge = v.regions[RECV].sge(i * u64::from(RECV_LEN), RECV_LEN);
            v.post_recv(i + 1, vec![sge]);
            posted.push(i + 1);
        }
        Scenario { attacker, v, crc, markers, posted }
    }

    fn plain(recvs: u64) -> Scenario {
        Scenario::new(false, false, recvs)
    }

    fn stag(&self, r: usize) -> STag {
        self.v.regions[r].stag
    }

    fn to(&self, r: usize) -> u64 {
        self.v.regions[r].first_to
    }

    /// Frames `ulpdu` on the attacker's stream and delivers it to the victim byte by byte.
    fn inject(&mut self, ulpdu: &[u8]) {
        let mut bytes = Vec::new();
        assert!(self.attacker.inject_ulpdu(ulpdu, &mut bytes) > 0);
        for b in bytes.chunks(1) {
            self.v.feed(b);
        }
    }

    /// Injects `ulpdu` and checks the whole outcome (see [`Scenario::check`]).
    fn provoke(mut self, ulpdu: &[u8], code: TerminateCode, copies: Copies) {
        self.inject(ulpdu);
        self.check(code, Some(ulpdu), copies, &[]);
    }

    /// Checks the Terminate the victim sends for `code`, the header copies, the event, the
    /// state, the flushes, and that no region changed (but those in `written`).
    fn check(&mut self, code: TerminateCode, offending: Option<&[u8]>, copies: Copies, written: &[usize]) {
        assert_eq!(self.v.events, vec![QpEvent::LocalTerminate(code)], "victim events");
        let out = self.v.transmit();
        let ulpdus = deframe_all(&out, self.crc, self.markers);
        assert_eq!(ulpdus.len(), 1, "exactly one FPDU, the Terminate: {ulpdus:02x?}");
        let t = parse_terminate(&ulpdus[0]);
        let SegmentKind::Untagged { msn, .. } = t.ddp.kind else { unreachable!() };
        assert_eq!(msn, Msn(1), "first message on the Terminate queue");
        // The control word's bytes, RFC layout: layer high nibble, type low, code, M/D/R at
        // bits 7/6/5 of the third byte.
        let body = &ulpdus[0][UNTAGGED_HEADER_LEN..];
        let flags = match copies {
            Copies::None => 0x00,
            Copies::Ddp => 0xc0,
            Copies::DdpAndReadRequest => 0xe0,
        };
        assert_eq!(body[..4], [(code.layer.to_u8() << 4) | code.error_type, code.code, flags, 0]);
        assert_eq!(t.msg.header.cause, code);
        let h = t.msg.header;
        assert_eq!(
            (h.m, h.d, h.r),
            (copies != Copies::None, copies != Copies::None, copies == Copies::DdpAndReadRequest)
        );
        if copies == Copies::None {
            assert_eq!((t.msg.ddp_segment_len, t.msg.ddp_header, t.msg.rdmap_header), (None, None, None));
        } else {
            let seg = offending.unwrap();
            let copied = t.msg.ddp_header.unwrap();
            assert_eq!(copied.as_bytes(), &seg[..copied.len()], "copied DDP header");
            assert_eq!(copied.len(), if seg[0] & 0x80 != 0 { 14 } else { 18 });
            assert_eq!(t.msg.ddp_segment_len, Some(seg.len() as u16), "M: the whole DDP segment's length");
        }
        if copies == Copies::DdpAndReadRequest {
            let seg = offending.unwrap();
            assert_eq!(&t.msg.rdmap_header.unwrap()[..], &seg[UNTAGGED_HEADER_LEN..UNTAGGED_HEADER_LEN + 28]);
        }
        assert_eq!(self.v.state(), QpState::Error);
        assert!(self.v.transmit().is_empty(), "nothing after the Terminate");
        // Every outstanding work request completed exactly once, with a flush error; only the
        // receive a too-long Send was meant for fails as too short for it.
        let mut ids: Vec<u64> = self.v.completions.iter().map(|c| c.wr_id).collect();
        ids.sort_unstable();
        let mut posted = self.posted.clone();
        posted.sort_unstable();
        assert_eq!(ids, posted, "{:?}", self.v.completions);
        let too_long = code == ddp(2, 0x05);
        assert!(
            self.v.completions.iter().all(|c| c.status == WcStatus::WrFlushError
                || (too_long && c.status == WcStatus::LocalLengthError && c.opcode == WcOpcode::Recv)),
            "{:?}",
            self.v.completions
        );
        // More input and the LLP going away change nothing.
        let mut more = Vec::new();
        let dst = self.stag(DST);
        let to = self.to(DST);
        self.attacker.inject_ulpdu(&tagged(Opcode::Write, dst, to, &[0xaa; 16]), &mut more);
        self.v.feed(&more);
        self.v.conn.handle_llp_lost();
        self.v.collect();
        assert_eq!(self.v.completions.len(), self.posted.len());
        assert_eq!(self.v.events.len(), 1);
        for (i, r) in self.v.regions.iter().enumerate() {
            if !written.contains(&i) {
                assert!(r.unchanged(&self.v.table), "region {i} changed");
            }
        }
    }
}

fn ddp(t: u8, c: u8) -> TerminateCode {
    TerminateCode::ddp(t, c)
}

fn rdmap(t: u8, c: u8) -> TerminateCode {
    TerminateCode::rdmap(t, c)
}

fn llp(c: u8) -> TerminateCode {
    TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code: c }
}

fn read_request(sink: u32, source: STag, source_to: u64, size: u32) -> Vec<u8> {
    let req = ReadRequest { sink_stag: sink, sink_to: 0x1000, size, source_stag: source.0, source_to };
    untagged(Opcode::ReadRequest, 1, 1, 0, true, 0, &req.to_bytes())
}

/// A Read Request into sink STag 0x77 at `sink_to`.
fn read_request_to(sink_to: u64, source: STag, source_to: u64, size: u32) -> Vec<u8> {
    let req = ReadRequest { sink_stag: 0x77, sink_to, size, source_stag: source.0, source_to };
    untagged(Opcode::ReadRequest, 1, 1, 0, true, 0, &req.to_bytes())
}

fn send(msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    untagged(Opcode::Send, 0, msn, mo, true, 0, payload)
}

// --- DDP layer, tagged buffer (1/1) -----------------------------------------------------

#[test]
fn ddp_invalid_version_tagged() {
    for dv in [0u8, 2, 3] {
        let s = Scenario::plain(2);
        let mut w = tagged(Opcode::Write, s.stag(DST), s.to(DST), &[1; 8]);
        w[0] = (w[0] & !0x03) | dv;
        // The header cannot be trusted: nothing copied (as siw).
        s.provoke(&w, ddp(1, 0x04), Copies::None);
    }
}

#[test]
fn ddp_tagged_invalid_stag() {
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, STag(0x00ab_cd00), 0, &[1; 8]);
    s.provoke(&w, ddp(1, 0x00), Copies::Ddp);
    // Right index, wrong key.
    let s = Scenario::plain(2);
    let bad_key = STag(s.stag(DST).0 ^ 0x01);
    let w = tagged(Opcode::Write, bad_key, s.to(DST), &[1; 8]);
    s.provoke(&w, ddp(1, 0x00), Copies::Ddp);
}

#[test]
fn ddp_tagged_base_or_bounds() {
    // One byte past the end of a VA-based region.
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(DST), s.to(DST) + 256 - 7, &[1; 8]);
    s.provoke(&w, ddp(1, 0x01), Copies::Ddp);
    // Below the base.
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(DST), s.to(DST) - 1, &[1; 8]);
    s.provoke(&w, ddp(1, 0x01), Copies::Ddp);
    // A zero-based region addressed by a VA.
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(ZB), 0x7f00_0000_0000, &[1; 8]);
    s.provoke(&w, ddp(1, 0x01), Copies::Ddp);
}

#[test]
fn ddp_tagged_stag_not_associated() {
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(FOREIGN), s.to(FOREIGN), &[1; 8]);
    s.provoke(&w, ddp(1, 0x02), Copies::Ddp);
}

#[test]
fn ddp_tagged_to_wrap() {
    // TO + length overflows 2^64.
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(DST), u64::MAX - 3, &[1; 8]);
    s.provoke(&w, ddp(1, 0x03), Copies::Ddp);
}

#[test]
fn rdmap_access_rights_on_write() {
    // DDP has no access-rights code: RDMAP's remote protection 0x02 (no R: not a Read Request).
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(RO), s.to(RO), &[1; 8]);
    s.provoke(&w, rdmap(1, 0x02), Copies::Ddp);
    let s = Scenario::plain(2);
    let w = tagged(Opcode::Write, s.stag(RECV), s.to(RECV), &[1; 8]);
    s.provoke(&w, rdmap(1, 0x02), Copies::Ddp);
}

// --- DDP layer, untagged buffer (1/2) ---------------------------------------------------

#[test]
fn ddp_invalid_version_untagged() {
    for dv in [0u8, 2, 3] {
        let s = Scenario::plain(2);
        let mut m = send(1, 0, &[1; 8]);
        m[0] = (m[0] & !0x03) | dv;
        s.provoke(&m, ddp(2, 0x06), Copies::None);
    }
}

#[test]
fn ddp_untagged_invalid_qn() {
    for qn in [3u32, 4, 0x8000_0000, u32::MAX] {
        let s = Scenario::plain(2);
        let m = untagged(Opcode::Send, qn, 1, 0, true, 0, &[1; 8]);
        s.provoke(&m, ddp(2, 0x01), Copies::Ddp);
    }
    // A Read Request on the Send queue.
    let s = Scenario::plain(2);
    let req =
        ReadRequest { sink_stag: 1, sink_to: 0, size: 4, source_stag: s.stag(RO).0, source_to: s.to(RO) };
    let m = untagged(Opcode::ReadRequest, 0, 1, 0, true, 0, &req.to_bytes());
    s.provoke(&m, ddp(2, 0x01), Copies::Ddp);
}

#[test]
fn ddp_untagged_no_buffer() {
    // A Send with no receive posted.
    let s = Scenario::plain(0);
    s.provoke(&send(1, 0, &[1; 8]), ddp(2, 0x02), Copies::Ddp);
    // A Send for the MSN after the last posted buffer.
    let s = Scenario::plain(2);
    s.provoke(&send(3, 0, &[1; 8]), ddp(2, 0x02), Copies::Ddp);
}

#[test]
fn ddp_untagged_msn_out_of_range() {
    // Posted but not yet due.
    let s = Scenario::plain(2);
    s.provoke(&send(2, 0, &[1; 8]), ddp(2, 0x03), Copies::Ddp);
    // An old MSN (0, before the initial 1).
    let s = Scenario::plain(2);
    s.provoke(&send(0, 0, &[1; 8]), ddp(2, 0x03), Copies::Ddp);
}

#[test]
fn ddp_untagged_invalid_mo() {
    let s = Scenario::plain(2);
    s.provoke(&send(1, 8, &[1; 8]), ddp(2, 0x04), Copies::Ddp);
}

#[test]
fn ddp_untagged_invalid_mo_after_a_first_segment() {
    // The first segment is placed; the second skips a byte. The receive buffer keeps the first
    // segment's bytes (its work request is flushed).
    let mut s = Scenario::plain(2);
    let first = untagged(Opcode::Send, 0, 1, 0, false, 0, &[0xcc; 8]);
    s.inject(&first);
    assert!(s.v.events.is_empty());
    let second = untagged(Opcode::Send, 0, 1, 9, true, 0, &[0xcc; 8]);
    s.inject(&second);
    s.check(ddp(2, 0x04), Some(&second), Copies::Ddp, &[RECV]);
    let r = &s.v.regions[RECV];
    assert_eq!(&r.bytes(&s.v.table)[..8], &[0xcc; 8]);
    assert_eq!(&r.bytes(&s.v.table)[8..], &r.initial[8..]);
}

#[test]
fn ddp_untagged_message_too_long() {
    let s = Scenario::plain(2);
    s.provoke(&send(1, 0, &[1; RECV_LEN as usize + 1]), ddp(2, 0x05), Copies::Ddp);
    // A Read Request longer than 28 bytes.
    let s = Scenario::plain(2);
    let req =
        ReadRequest { sink_stag: 1, sink_to: 0, size: 4, source_stag: s.stag(RO).0, source_to: s.to(RO) };
    let mut body = req.to_bytes().to_vec();
    body.push(0);
    let m = untagged(Opcode::ReadRequest, 1, 1, 0, true, 0, &body);
    s.provoke(&m, ddp(2, 0x05), Copies::Ddp);
}

// --- RDMAP layer -------------------------------------------------------------------------

#[test]
fn rdmap_invalid_version() {
    for rv in [0u8, 2, 3] {
        let s = Scenario::plain(2);
        let mut w = tagged(Opcode::Write, s.stag(DST), s.to(DST), &[1; 8]);
        w[1] = (rv << 6) | Opcode::Write.bits();
        // Not copied: the packet layout is unknown (siw).
        s.provoke(&w, rdmap(2, 0x05), Copies::None);
    }
    let s = Scenario::plain(2);
    let mut m = send(1, 0, &[1; 8]);
    m[1] = Opcode::Send.bits();
    s.provoke(&m, rdmap(2, 0x05), Copies::None);
}

#[test]
fn rdmap_unexpected_opcode_reserved() {
    for op in 0xcu8..=0xf {
        let s = Scenario::plain(2);
        let kind = SegmentKind::Untagged { rdmap_word: 0, qn: 0.into(), msn: Msn(1), mo: 0 };
        let m = segment(true, 0x40 | op, kind, &[1; 8]);
        s.provoke(&m, rdmap(2, 0x06), Copies::None);
        let s = Scenario::plain(2);
        let kind = SegmentKind::Tagged { stag: s.stag(DST), to: TaggedOffset(s.to(DST)) };
        let m = segment(true, 0x40 | op, kind, &[1; 8]);
        s.provoke(&m, rdmap(2, 0x06), Copies::None);
    }
}

#[test]
fn rdmap_unexpected_opcode_rfc7306_without_extensions() {
    // The default QpConfig has not enabled RFC 7306: Immediate Data and Atomics are unexpected
    // (as siw answers them).
    for (op, qn, len) in [
        (Opcode::ImmediateData, 0, 8),
        (Opcode::ImmediateDataSe, 0, 8),
        (Opcode::AtomicRequest, 1, 52),
        (Opcode::AtomicResponse, 3, 12),
    ] {
        let s = Scenario::plain(2);
        let m = untagged(op, qn, 1, 0, true, 0, &vec![0; len]);
        s.provoke(&m, rdmap(2, 0x06), Copies::None);
    }
}

#[test]
fn rdmap_unexpected_opcode_model_mismatch() {
    // A Write in an untagged segment, a Send in a tagged one.
    let s = Scenario::plain(2);
    let m = untagged(Opcode::Write, 0, 1, 0, true, 0, &[1; 8]);
    s.provoke(&m, rdmap(2, 0x06), Copies::None);
    let s = Scenario::plain(2);
    let m = tagged(Opcode::Send, s.stag(DST), s.to(DST), &[1; 8]);
    s.provoke(&m, rdmap(2, 0x06), Copies::None);
}

#[test]
fn rdmap_unexpected_opcode_changing_within_a_message() {
    // The second segment of a Send says Send SE (or the other way round, or Send with
    // Invalidate): it belongs to no message and places nothing. The first segment's bytes were
    // placed; the receive is flushed.
    for (first, second) in [
        (Opcode::Send, Opcode::SendSe),
        (Opcode::SendSe, Opcode::Send),
        (Opcode::Send, Opcode::SendInvalidate),
    ] {
        let mut s = Scenario::plain(2);
        s.inject(&untagged(first, 0, 1, 0, false, 0, &[0xcc; 8]));
        assert!(s.v.events.is_empty());
        let m = untagged(second, 0, 1, 8, true, 0, &[0xdd; 8]);
        s.inject(&m);
        s.check(rdmap(2, 0x06), Some(&m), Copies::None, &[RECV]);
        let r = &s.v.regions[RECV];
        assert_eq!(&r.bytes(&s.v.table)[..8], &[0xcc; 8]);
        assert_eq!(&r.bytes(&s.v.table)[8..], &r.initial[8..]);
    }
}

#[test]
fn rdmap_unexpected_read_response() {
    // No Read outstanding.
    let s = Scenario::plain(2);
    let m = tagged(Opcode::ReadResponse, s.stag(SINK), s.to(SINK), &[1; 8]);
    s.provoke(&m, rdmap(2, 0x06), Copies::None);
}

/// A scenario whose victim has sent a 16-byte Read into SINK; returns it with the Read's
/// work request id.
fn with_outstanding_read() -> Scenario {
    let mut s = Scenario::plain(1);
    let sge = s.v.regions[SINK].sge(0, 16);
    s.v.post_send(SendWr {
        wr_id: 200,
        op: SendOp::Read { remote_stag: STag(0x55), remote_to: 0x9000 },
        sgl: sge.into(),
        signaled: true,
    });
    s.posted.push(200);
    let out = s.v.transmit();
    // The queued Send and the Read Request went out; the Send completed.
    assert_eq!(deframe_all(&out, false, false).len(), 2);
    assert_eq!(s.v.completions.len(), 1);
    assert_eq!(s.v.completions[0].wr_id, SEND_WR);
    s.posted.retain(|&w| w != SEND_WR);
    s.v.completions.clear();
    s
}

#[test]
fn rdmap_read_response_shorter_than_requested() {
    // The last segment of a Read Response ends before the requested size: the queue pair
    // reports a catastrophic error localized to the stream (0/2/0x07) with the header copied.
    // The response's bytes were placed in the sink before the length check failed: allowed,
    // they are inside the Read's own sink buffer and the Read completes with a flush error.
    let mut s = with_outstanding_read();
    let m = tagged(Opcode::ReadResponse, s.stag(SINK), s.to(SINK), &[0xdd; 8]);
    s.inject(&m);
    s.check(rdmap(2, 0x07), Some(&m), Copies::Ddp, &[SINK]);
    let r = &s.v.regions[SINK];
    assert_eq!(&r.bytes(&s.v.table)[..8], &[0xdd; 8]);
    assert_eq!(&r.bytes(&s.v.table)[8..], &r.initial[8..]);
}

#[test]
fn read_response_to_the_wrong_sink() {
    // Sink STag or TO other than the Read's: reported as DDP "STag not associated".
    let s = with_outstanding_read();
    let m = tagged(Opcode::ReadResponse, s.stag(DST), s.to(DST), &[1; 16]);
    s.provoke(&m, ddp(1, 0x02), Copies::Ddp);
    let s = with_outstanding_read();
    let m = tagged(Opcode::ReadResponse, s.stag(SINK), s.to(SINK) + 1, &[1; 16]);
    s.provoke(&m, ddp(1, 0x02), Copies::Ddp);
}

#[test]
fn read_response_longer_than_requested() {
    let s = with_outstanding_read();
    let m = tagged(Opcode::ReadResponse, s.stag(SINK), s.to(SINK), &[1; 17]);
    s.provoke(&m, ddp(1, 0x01), Copies::Ddp);
}

#[test]
fn rdmap_read_request_source_without_remote_read() {
    // RDMAP remote protection, access rights, with M, D and R: the Read Request is copied.
    let s = Scenario::plain(2);
    let m = read_request(0x77, s.stag(DST), s.to(DST), 16);
    s.provoke(&m, rdmap(1, 0x02), Copies::DdpAndReadRequest);
}

#[test]
fn rdmap_read_request_other_protection_errors() {
    // The source STag checks reported by RDMAP (layer 0, type 1), each with the Request.
    let s = Scenario::plain(2);
    let m = read_request(0x77, STag(0x00ab_cd00), 0, 16);
    s.provoke(&m, rdmap(1, 0x00), Copies::DdpAndReadRequest);
    let s = Scenario::plain(2);
    let m = read_request(0x77, s.stag(RO), s.to(RO) + 250, 16);
    s.provoke(&m, rdmap(1, 0x01), Copies::DdpAndReadRequest);
    let s = Scenario::plain(2);
    let m = read_request(0x77, s.stag(FOREIGN), s.to(FOREIGN), 16);
    s.provoke(&m, rdmap(1, 0x03), Copies::DdpAndReadRequest);
    let s = Scenario::plain(2);
    let m = read_request(0x77, s.stag(RO), u64::MAX - 3, 16);
    s.provoke(&m, rdmap(1, 0x04), Copies::DdpAndReadRequest);
}

#[test]
fn rdmap_to_wrap_on_a_read_request_sink() {
    // The sink range of a Read Request ends past 2^64 - 1: no Read Response can carry it (its
    // tagged offsets would wrap), so the request is refused when it arrives, with RDMAP's TO
    // wrap (0/1/0x04, RdmapError::ReadSinkWraps) and the Request copied, rather than kept and
    // never answered (its IRD slot taken for good, the requester's Read never completing).
    for (sink_to, size) in [(u64::MAX - 3, 8u32), (u64::MAX - 7, 8), (u64::MAX, 1)] {
        let s = Scenario::plain(2);
        let m = read_request_to(sink_to, s.stag(RO), s.to(RO), size);
        s.provoke(&m, rdmap(1, 0x04), Copies::DdpAndReadRequest);
    }
    // A sink that ends at the last TO is fine: the Read Response goes out.
    let mut s = Scenario::plain(2);
    let m = read_request_to(u64::MAX - 8, s.stag(RO), s.to(RO), 8);
    s.inject(&m);
    assert!(s.v.events.is_empty(), "{:?}", s.v.events);
    let sent = deframe_all(&s.v.transmit(), false, false);
    let response = sent.iter().find_map(|u| {
        let seg = iwarp_ddp::SegmentRepr::parse(u).ok()?;
        let SegmentKind::Tagged { stag, to } = seg.header.kind else { return None };
        Some((stag, to, seg.payload.len()))
    });
    assert_eq!(response, Some((STag(0x77), TaggedOffset(u64::MAX - 8), 8)));
    assert_eq!(s.v.state(), QpState::Rts);
}

#[test]
fn read_request_with_a_truncated_body() {
    // A Read Request body shorter than 28 bytes: DDP "message too long" is what the queue pair
    // sends for a request whose length is not its fixed body's (1/2/0x05), M and D, no R
    // (DDP layer; and there is no whole Request to copy).
    let s = Scenario::plain(2);
    let m = untagged(Opcode::ReadRequest, 1, 1, 0, true, 0, &[0; 20]);
    s.provoke(&m, ddp(2, 0x05), Copies::Ddp);
    // Not the last segment of its message.
    let s = Scenario::plain(2);
    let req =
        ReadRequest { sink_stag: 1, sink_to: 0, size: 4, source_stag: s.stag(RO).0, source_to: s.to(RO) };
    let m = untagged(Opcode::ReadRequest, 1, 1, 0, false, 0, &req.to_bytes());
    s.provoke(&m, ddp(2, 0x05), Copies::Ddp);
}

#[test]
fn rdmap_catastrophic_stream_on_ird_overflow() {
    // IRD 2 (negotiated in `connect`): a third Read Request before any response was sent.
    // RdmapError::IrdExceeded: catastrophic error localized to the stream (0/2/0x07), as siw
    // (`siw_init_rresp`: "IRQ exceeded"); M, D and R (the Request is copied).
    let mut s = Scenario::plain(2);
    let req =
        ReadRequest { sink_stag: 1, sink_to: 0, size: 4, source_stag: s.stag(RO).0, source_to: s.to(RO) };
    for msn in 1..=2 {
        s.inject(&untagged(Opcode::ReadRequest, 1, msn, 0, true, 0, &req.to_bytes()));
    }
    assert!(s.v.events.is_empty());
    let m = untagged(Opcode::ReadRequest, 1, 3, 0, true, 0, &req.to_bytes());
    s.provoke(&m, rdmap(2, 0x07), Copies::DdpAndReadRequest);
}

/// A scenario whose queue pairs enabled RFC 7306.
fn with_extensions() -> Scenario {
    let mut s = Scenario::plain(0);
    let (attacker, victim) = connect_ext(false, false, 2, true);
    s.v.conn = victim;
    s.attacker = attacker;
    // Post again on the new connection what the old one had.
    let sge = s.v.regions[SRC].sge(0, 8);
    s.v.post_send(SendWr {
        wr_id: SEND_WR,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: sge.into(),
        signaled: true,
    });
    s
}

fn atomic_request(op: u32, stag: STag, to: u64) -> Vec<u8> {
    let mut body = [0u8; 52];
    body[0..4].copy_from_slice(&op.to_be_bytes());
    body[4..8].copy_from_slice(&7u32.to_be_bytes());
    body[8..12].copy_from_slice(&stag.0.to_be_bytes());
    body[12..20].copy_from_slice(&to.to_be_bytes());
    untagged(Opcode::AtomicRequest, 1, 1, 0, true, 0, &body)
}

#[test]
fn rdmap_unspecified_on_unknown_atomic_op() {
    // RFC 7306 on: an Atomic Request with operation code 15 is an unspecified remote
    // operation error (0/2/0xFF, RdmapError::UnsupportedAtomicOp), M and D.
    let s = with_extensions();
    let m = atomic_request(0xf, s.stag(DST), s.to(DST));
    s.provoke(&m, rdmap(2, 0xff), Copies::Ddp);
}

#[test]
fn rdmap_atomics_with_extensions_on() {
    // RFC 7306 on: a FetchAdd on a region without remote atomic rights (0/1/0x02).
    let s = with_extensions();
    let m = atomic_request(0, s.stag(DST), s.to(DST));
    s.provoke(&m, rdmap(1, 0x02), Copies::Ddp);
    // An Atomic Response nobody asked for: DDP finds no buffer on QN 3 (1/2/0x02) before
    // RDMAP sees it.
    let s = with_extensions();
    let m = untagged(Opcode::AtomicResponse, 3, 1, 0, true, 0, &[0; 12]);
    s.provoke(&m, ddp(2, 0x02), Copies::Ddp);
}

#[test]
fn rdmap_send_with_invalidate_of_a_foreign_stag() {
    // The STag exists but belongs to another protection domain: remote protection error,
    // cannot invalidate (0/1/0x09), as siw's siw_invalidate_stag (-EACCES on PD mismatch ->
    // RDMAP_ETYPE_REMOTE_PROTECTION) and RdmapError::InvalidateNotPermitted. A zero-length
    // Send, so that nothing is placed before the check.
    for op in [Opcode::SendInvalidate, Opcode::SendSeInvalidate] {
        let s = Scenario::plain(2);
        let m = untagged(op, 0, 1, 0, true, s.stag(FOREIGN).0, &[]);
        s.provoke(&m, rdmap(1, 0x09), Copies::Ddp);
    }
}

#[test]
fn rdmap_send_with_invalidate_of_a_nonexistent_stag() {
    // No such STag: remote *operation* error, cannot invalidate (0/2/0x09), as siw
    // (siw_invalidate_stag: unknown STag -> -EINVAL -> RDMAP_ETYPE_REMOTE_OPERATION) and
    // RdmapError::CannotInvalidate. A wrong key counts as no such STag.
    let s = Scenario::plain(2);
    let m = untagged(Opcode::SendInvalidate, 0, 1, 0, true, 0x00ab_cd00, &[]);
    s.provoke(&m, rdmap(2, 0x09), Copies::Ddp);
    let s = Scenario::plain(2);
    let wrong_key = s.stag(DST).0 ^ 0x01;
    let m = untagged(Opcode::SendSeInvalidate, 0, 1, 0, true, wrong_key, &[]);
    s.provoke(&m, rdmap(2, 0x09), Copies::Ddp);
}

#[test]
fn rdmap_send_with_invalidate_of_a_local_only_stag() {
    // A region registered without any remote right (receive buffers, the source of a Send,
    // the sink of a Read) is not the peer's: it was never advertised, so a peer naming it
    // guessed or stole it. Verbs let a peer invalidate only what it may access: remote
    // protection error, cannot invalidate (0/1/0x09, RdmapError::InvalidateNotPermitted), and
    // the region stays valid.
    for r in [RECV, SRC, SINK] {
        let mut s = Scenario::plain(2);
        let stag = s.stag(r);
        let m = untagged(Opcode::SendInvalidate, 0, 1, 0, true, stag.0, &[]);
        s.inject(&m);
        s.check(rdmap(1, 0x09), Some(&m), Copies::Ddp, &[]);
        assert!(s.v.table.get(stag).is_some_and(|e| e.valid), "region {r} was invalidated");
    }
}

#[test]
fn rdmap_send_with_invalidate_of_a_region_with_a_window_bound() {
    // A region with a memory window bound cannot be invalidated (verbs; rxe refuses it too):
    // remote operation error, cannot invalidate (0/2/0x09, RdmapError::CannotInvalidate). The
    // region and the window stay valid.
    let mut s = Scenario::plain(2);
    let spec = RegionSpec {
        base_va: s.to(DST) + 16,
        len: 32,
        access: Access::REMOTE_WRITE,
        addressing: Addressing::VirtualAddress,
    };
    let pd = s.v.pd;
    let window = s.v.table.bind_window(s.stag(DST), pd, spec).unwrap();
    let m = untagged(Opcode::SendSeInvalidate, 0, 1, 0, true, s.stag(DST).0, &[]);
    s.inject(&m);
    s.check(rdmap(2, 0x09), Some(&m), Copies::Ddp, &[]);
    assert!(s.v.table.get(s.stag(DST)).is_some_and(|e| e.valid), "the region was invalidated");
    assert!(s.v.table.get(window).is_some_and(|e| e.valid), "the window was invalidated");
}

// --- LLP (MPA) layer ----------------------------------------------------------------------

#[test]
fn llp_crc_error() {
    // A bad CRC: 2/0/0x02, nothing copied (the FPDU cannot be trusted), nothing placed.
    let mut s = Scenario::new(true, false, 2);
    let w = tagged(Opcode::Write, s.stag(DST), s.to(DST), &[1; 32]);
    let mut bytes = Vec::new();
    s.attacker.inject_ulpdu(&w, &mut bytes);
    bytes[20] ^= 0x10;
    s.v.feed(&bytes);
    s.check(llp(0x02), None, Copies::None, &[]);
}

#[test]
fn llp_crc_error_in_the_crc_field() {
    let mut s = Scenario::new(true, true, 2);
    let m = send(1, 0, &[1; 8]);
    let mut bytes = Vec::new();
    s.attacker.inject_ulpdu(&m, &mut bytes);
    let n = bytes.len();
    bytes[n - 1] ^= 0x80;
    s.v.feed(&bytes);
    s.check(llp(0x02), None, Copies::None, &[]);
}

#[test]
fn llp_marker_error() {
    // Markers negotiated: a Write long enough to carry a marker, whose FPDU pointer is
    // corrupted (and, separately, whose reserved half is not zero): 2/0/0x03.
    for (byte, flip) in [(3usize, 0x01u8), (2, 0x80), (0, 0x01)] {
        let mut s = Scenario::new(false, true, 2);
        let w = tagged(Opcode::Write, s.stag(DST), s.to(DST), &[1; 240]);
        // A first FPDU moves the stream so that the second one spans a marker position.
        let mut bytes = Vec::new();
        let ok = tagged(Opcode::Write, s.stag(DST), s.to(DST), &[]);
        let mut ok_bytes = Vec::new();
        s.attacker.inject_ulpdu(&ok, &mut ok_bytes);
        let start = ok_bytes.len() as u64;
        s.v.feed(&ok_bytes);
        for _ in 0..2 {
            s.attacker.inject_ulpdu(&w, &mut bytes);
        }
        let marker = marker_positions(start, bytes.len()).next().expect("a marker inside");
        let at = usize::try_from(marker - start).unwrap();
        bytes[at + byte] ^= flip;
        s.v.feed(&bytes);
        // Writes delimited before the bad marker are placed; none is here (the marker is in the
        // first Write when the stream is at `start`, or in the second: then the first is placed).
        let placed_first = at >= bytes.len() / 2;
        let written = if placed_first { vec![DST] } else { vec![] };
        s.check(llp(0x03), None, Copies::None, &written);
    }
}

#[test]
fn llp_segment_shorter_than_a_ddp_header() {
    // A ULPDU too short to be a DDP segment: the queue pair reports an LLP FPDU-start error
    // (2/0/0x03) with nothing copied (there is no whole header to copy).
    for len in [0usize, 1, 5, 13, 17] {
        let s = Scenario::plain(2);
        let mut m = vec![0u8; len];
        if len > 0 {
            m[0] = if len > 1 && len < 14 { 0xc1 } else { 0x41 };
        }
        if len > 1 {
            m[1] = 0x40;
        }
        s.provoke(&m, llp(0x03), Copies::None);
    }
}

#[test]
fn terminate_from_the_peer_is_not_answered() {
    // The peer's own Terminate: no Terminate back, a RemoteTerminate event, everything flushed.
    let mut s = Scenario::plain(2);
    let body = [0x12, 0x01, 0x00, 0x00];
    let m = untagged(Opcode::Terminate, 2, 1, 0, true, 0, &body);
    s.inject(&m);
    assert!(matches!(s.v.events.as_slice(), [QpEvent::RemoteTerminate { .. }]), "{:?}", s.v.events);
    assert!(s.v.transmit().is_empty());
    assert_eq!(s.v.state(), QpState::Error);
    assert_eq!(s.v.completions.len(), s.posted.len());
    assert!(s.v.regions.iter().all(|r| r.unchanged(&s.v.table)));
}

// Not provokable by a peer on this queue pair:
// - RDMAP 0/0/0x00 local catastrophic: only a local source buffer that cannot be read.
// - RDMAP 0/1/0xFF and 0/2/0x08: never sent.
// - DDP 1/0/0x00 local catastrophic: never sent.
// - LLP 2/0/0x01 TCP connection lost: no Terminate can be sent (handle_llp_lost flushes).
// - LLP 2/0/0x04..=0x07 (invalid Request/Reply, insufficient IRD, no matching RTR): the MPA
//   handshake, before a Connection exists.

/// A responder victim (it waits for the initiator's first FPDU before sending anything).
fn responder_victim(crc: bool) -> (Connection, End) {
    let (victim, attacker) = connect(crc, false, 2);
    let mut v = End::new(victim);
    v.register(256, Access::REMOTE_WRITE, Addressing::VirtualAddress);
    (attacker, v)
}

#[test]
fn responder_answers_a_violating_first_fpdu() {
    let (mut attacker, mut v) = responder_victim(false);
    let w = tagged(Opcode::Write, STag(0x00ab_cd00), 0, &[1; 8]);
    let mut bytes = Vec::new();
    attacker.inject_ulpdu(&w, &mut bytes);
    v.feed(&bytes);
    assert_eq!(v.events, vec![QpEvent::LocalTerminate(ddp(1, 0x00))]);
    let out = v.transmit();
    let ulpdus = deframe_all(&out, false, false);
    assert_eq!(ulpdus.len(), 1);
    assert_eq!(parse_terminate(&ulpdus[0]).msg.header.cause, ddp(1, 0x00));
    assert!(v.regions[0].unchanged(&v.table));
}

#[test]
fn responder_answers_a_bad_crc_in_the_first_fpdu() {
    let (mut attacker, mut v) = responder_victim(true);
    let w = tagged(Opcode::Write, v.regions[0].stag, v.regions[0].first_to, &[1; 8]);
    let mut bytes = Vec::new();
    attacker.inject_ulpdu(&w, &mut bytes);
    bytes[10] ^= 1;
    v.feed(&bytes);
    assert_eq!(v.events, vec![QpEvent::LocalTerminate(llp(0x02))]);
    let out = v.transmit();
    let ulpdus = deframe_all(&out, true, false);
    assert_eq!(ulpdus.len(), 1, "the Terminate for the CRC error");
    assert_eq!(parse_terminate(&ulpdus[0]).msg.header.cause, llp(0x02));
}
