//! A hostile peer against one victim queue pair: arbitrary ULPDUs (well-formed segments with
//! random fields, and random bytes) and arbitrary byte streams. Placement is checked against a
//! model (a shadow copy of every region, to which only Writes the model accepts are applied),
//! guard bytes surround every registered window (and every region's memory: the harness
//! registers windows of larger allocations, checked when the victim goes), every Read Response
//! the victim sends carries exactly the model's bytes of the source range (nothing is read
//! outside a registration), every work request completes at most once (exactly once after the
//! LLP is lost), and the victim sends at most one Terminate.
//!
//! Also writes the seed corpus of the `qp_receive` fuzz target (IWARP_WRITE_SEEDS=1).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and patterns are small")]

mod common;

use std::collections::HashMap;

use common::{End, OTHER_PD, connect, ctrl, deframe_all, segment, tagged, untagged};
use iwarp_ddp::header::{SegmentKind, SegmentRepr};
use iwarp_ddp::stag_table::{Access, Addressing};
use iwarp_ddp::{Msn, QueueNumber, STag, TaggedOffset};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::fuzz::{self, Variant};
use iwarp_rdmap::qp::{Completion, QpEvent, QpState, SendOp, SendWr, WcOpcode, WcStatus};
use iwarp_rdmap::{AtomicOp, AtomicRequest, AtomicResponse, Control, Opcode, ReadRequest};
use proptest::prelude::*;

// Region indices.
const RW_VA: usize = 0;
const RW_ZB: usize = 1;
const RO_VA: usize = 2;
const RECV: usize = 3;
const FOREIGN: usize = 4;
const RRW_ZB: usize = 5;

/// Receive buffers: (wr_id, offset in RECV, length).
const RECVS: [(u64, u64, u32); 3] = [(1, 0, 64), (2, 100, 64), (3, 200, 128)];
const SENDS: [u64; 2] = [100, 101];

struct World {
    attacker: Connection,
    v: End,
    crc: bool,
    markers: bool,
    /// Expected memory of every region (all but RECV are modelled exactly).
    shadow: Vec<Vec<u8>>,
    /// Writes the model accepted (and the victim placed).
    accepted_writes: usize,
    /// Read Requests the victim accepted, oldest first: sink STag, sink TO, the model's bytes
    /// of the source range when it was accepted, and how many the responses carried so far.
    reads: std::collections::VecDeque<(u32, u64, Vec<u8>, usize)>,
    /// ULPDUs of `v.sent` already checked.
    checked_sent: usize,
    /// The victim reads through [`Connection::receive`] (payloads straight into place, reads
    /// that stop at headers) rather than taking chunks.
    reads_through_receive: bool,
}

impl World {
    fn new(crc: bool, markers: bool) -> World {
        let (attacker, victim) = connect(crc, markers, 2);
        let mut v = End::new(victim);
        let rw = Access::REMOTE_WRITE.union(Access::LOCAL_WRITE);
        assert_eq!(v.register(256, rw, Addressing::VirtualAddress), RW_VA);
        assert_eq!(v.register(200, Access::REMOTE_WRITE, Addressing::ZeroBased), RW_ZB);
        assert_eq!(v.register(128, Access::REMOTE_READ, Addressing::VirtualAddress), RO_VA);
        assert_eq!(v.register(512, Access::LOCAL_WRITE, Addressing::VirtualAddress), RECV);
        let all = Access::ALL;
        assert_eq!(v.register_in(OTHER_PD, 128, 192, all, Addressing::VirtualAddress, 9), FOREIGN);
        let rrw = Access::REMOTE_READ.union(Access::REMOTE_WRITE);
        assert_eq!(v.register(64, rrw, Addressing::ZeroBased), RRW_ZB);
        for (id, off, len) in RECVS {
            let sge = v.regions[RECV].sge(off, len);
            v.post_recv(id, vec![sge]);
        }
        let src = v.regions[RO_VA].sge(0, 16);
        v.post_send(SendWr {
            wr_id: SENDS[0],
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.into(),
            signaled: true,
        });
        v.post_send(SendWr {
            wr_id: SENDS[1],
            op: SendOp::Write { remote_stag: STag(0x1234), remote_to: 0 },
            sgl: src.into(),
            signaled: false,
        });
        let shadow = v.regions.iter().map(|r| r.initial.clone()).collect();
        World {
            attacker,
            v,
            crc,
            markers,
            shadow,
            accepted_writes: 0,
            reads: Default::default(),
            checked_sent: 0,
            reads_through_receive: false,
        }
    }

    /// The same world, with a victim that reads through [`Connection::receive`] and reads
    /// every payload that has a place straight into it.
    fn reading(mut self) -> World {
        self.reads_through_receive = true;
        self.v.conn.set_direct_min(Some(1));
        self
    }

    /// Hands the victim `bytes`: in chunks of `chunk`, or read through
    /// [`Connection::receive`], at most `chunk` a read.
    fn hand(&mut self, bytes: &[u8], chunk: usize) {
        if self.reads_through_receive {
            self.v.read(bytes, chunk);
        } else {
            for c in bytes.chunks(chunk.max(1)) {
                self.v.feed(c);
            }
        }
    }

    /// The region a Write to (stag, to, len) may change, and the offset, per the model.
    fn model_write(&self, stag: STag, to: u64, len: usize) -> Option<(usize, usize)> {
        let (i, r) = self.v.regions.iter().enumerate().find(|(_, r)| r.stag == stag)?;
        if r.pd != common::VICTIM_PD || !r.access.contains(Access::REMOTE_WRITE) {
            return None;
        }
        let end = to.checked_add(len as u64)?;
        if to < r.first_to || end > r.first_to + r.len {
            return None;
        }
        Some((i, (to - r.first_to) as usize))
    }

    /// The region a Read Request for (stag, to, len) may read, and the offset, per the model.
    fn model_read(&self, stag: STag, to: u64, len: usize) -> Option<(usize, usize)> {
        let (i, r) = self.v.regions.iter().enumerate().find(|(_, r)| r.stag == stag)?;
        if r.pd != common::VICTIM_PD || !r.access.contains(Access::REMOTE_READ) {
            return None;
        }
        let end = to.checked_add(len as u64)?;
        if to < r.first_to || end > r.first_to + r.len {
            return None;
        }
        Some((i, (to - r.first_to) as usize))
    }

    /// Checks the Read Responses the victim sent since the last check against the requests it
    /// accepted: in order, to the request's sink, with the model's bytes.
    fn check_read_responses(&mut self) {
        let sent = deframe_all(&self.v.sent, self.crc, self.markers);
        for u in &sent[self.checked_sent..] {
            let Ok(seg) = SegmentRepr::parse(u) else { continue };
            if Control::from_byte(seg.header.rdmap_control).opcode != Opcode::ReadResponse {
                continue;
            }
            let SegmentKind::Tagged { stag, to } = seg.header.kind else { panic!("untagged Read Response") };
            let Some((sink, sink_to, bytes, got)) = self.reads.front_mut() else {
                panic!("a Read Response for no accepted Read Request")
            };
            assert_eq!((stag.0, to.0), (*sink, *sink_to + *got as u64), "Read Response to the wrong sink");
            let expect = &bytes[*got..*got + seg.payload.len()];
            assert_eq!(seg.payload, expect, "Read Response bytes differ from the source's model");
            *got += seg.payload.len();
            if seg.header.last {
                assert_eq!(*got, bytes.len(), "Read Response shorter than the request");
                self.reads.pop_front();
            }
        }
        self.checked_sent = sent.len();
    }

    /// Delivers one crafted ULPDU (framed by the attacker) in `chunks`-sized pieces and checks
    /// the model.
    fn deliver(&mut self, ulpdu: &[u8], chunk: usize, stats: &mut Tally) {
        let mut bytes = Vec::new();
        if self.attacker.inject_ulpdu(ulpdu, &mut bytes) == 0 {
            return; // too long to frame
        }
        let was_rts = self.v.state() == QpState::Rts;
        let before = self.v.local_terminates();
        self.hand(&bytes, chunk);
        if was_rts {
            stats.rx += 1;
        }
        let seg = SegmentRepr::parse(ulpdu).ok();
        let ctrl = seg.as_ref().map(|s| Control::from_byte(s.header.rdmap_control));
        if let (Some(seg), Some(ctrl)) = (&seg, ctrl)
            && was_rts
            && ctrl.version == 1
            && ctrl.opcode == Opcode::Write
            && let SegmentKind::Tagged { stag, to } = seg.header.kind
            && !seg.payload.is_empty()
        {
            match self.model_write(stag, to.0, seg.payload.len()) {
                Some((i, off)) => {
                    self.shadow[i][off..off + seg.payload.len()].copy_from_slice(seg.payload);
                    self.accepted_writes += 1;
                    assert_eq!(self.v.state(), QpState::Rts, "a permitted Write terminated the stream");
                }
                None => assert_ne!(self.v.state(), QpState::Rts, "a forbidden Write was accepted"),
            }
        }
        // Segments that are wrong whatever the queue pair's state: the stream must end.
        let definitely_bad = match (&seg, ctrl) {
            (None, _) => true,
            (Some(s), Some(c)) => {
                c.version != 1
                    || matches!(c.opcode, Opcode::Unknown(_))
                    || c.opcode.is_extension()
                    || c.opcode.is_tagged() != s.header.is_tagged()
                    || c.opcode == Opcode::ReadResponse
            }
            _ => false,
        };
        if was_rts && definitely_bad {
            assert_ne!(self.v.state(), QpState::Rts, "{ulpdu:02x?} accepted");
        }
        if was_rts && self.v.local_terminates() == before && self.v.state() != QpState::Rts {
            stats.peer_terminated = true;
        }
        // A Read Request the victim accepted (it stayed in RTS) must be one the model allows;
        // its response must carry the model's bytes.
        if let (Some(seg), Some(ctrl)) = (&seg, ctrl)
            && was_rts
            && self.v.state() == QpState::Rts
            && ctrl.opcode == Opcode::ReadRequest
            && let Ok(req) = ReadRequest::parse(seg.payload)
        {
            let size = req.size as usize;
            match self.model_read(STag(req.source_stag), req.source_to, size) {
                Some((i, off)) => {
                    let bytes = self.shadow[i][off..off + size].to_vec();
                    self.reads.push_back((req.sink_stag, req.sink_to, bytes, 0));
                }
                // Zero bytes are read from nowhere (the RFC 6581 Read RTR).
                None if size == 0 => self.reads.push_back((req.sink_stag, req.sink_to, Vec::new(), 0)),
                None => panic!("the victim accepted a Read Request the model refuses: {req:?}"),
            }
        }
        self.check_memory();
        self.v.transmit();
        self.check_read_responses();
        self.check_completions_at_most_once();
    }

    fn check_memory(&self) {
        for (i, r) in self.v.regions.iter().enumerate() {
            let now = r.bytes(&self.v.table);
            if i == RECV {
                // Only inside posted receive buffers.
                let inside = |k: usize| {
                    RECVS.iter().any(|&(_, o, l)| (o as usize..o as usize + l as usize).contains(&k))
                };
                for (k, (a, b)) in now.iter().zip(&r.initial).enumerate() {
                    assert!(a == b || inside(k), "RECV byte {k} changed outside the receive buffers");
                }
            } else {
                assert!(now == self.shadow[i], "region {i} differs from the model");
            }
        }
    }

    fn check_completions_at_most_once(&self) {
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for c in &self.v.completions {
            *seen.entry(c.wr_id).or_default() += 1;
        }
        assert!(seen.values().all(|&n| n == 1), "{:?}", self.v.completions);
        let known: Vec<u64> = RECVS.iter().map(|r| r.0).chain(SENDS).collect();
        assert!(seen.keys().all(|id| known.contains(id)));
    }

    /// Every signaled request (all but the unsignaled Write, 101) has completed; the
    /// unsignaled one completes only if it failed or was flushed.
    fn check_all_completed(&self) {
        let mut ids: Vec<u64> = self.v.completions.iter().map(|c| c.wr_id).filter(|&id| id != 101).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 3, 100], "{:?}", self.v.completions);
    }

    /// End-of-run checks: Terminates, statistics, and exactly-once completion after LLP loss.
    fn finish(&mut self, stats: &Tally) {
        let state = self.v.state();
        assert_ne!(state, QpState::Terminate, "the Terminate was not sent");
        let local = self.v.local_terminates();
        let remote = self.v.events.iter().filter(|e| matches!(e, QpEvent::RemoteTerminate { .. })).count();
        assert!(local + remote <= 1, "{:?}", self.v.events);
        if state == QpState::Rts {
            assert_eq!(local + remote, 0);
        } else {
            assert!(local == 1 || stats.peer_terminated, "{:?}", self.v.events);
        }
        // What the victim sent: whole FPDUs, one per transmitted segment, Terminates = local.
        let sent = deframe_all(&self.v.sent, self.crc, self.markers);
        let qp_stats = self.v.conn.qp_ref().stats();
        assert_eq!(sent.len() as u64, qp_stats.tx_segments);
        assert_eq!(qp_stats.rx_segments, stats.rx);
        let terminates = sent.iter().filter(|u| u.len() > 1 && u[1] & 0x0f == 7).count();
        assert_eq!(terminates, local);
        // The LLP goes away: every request completes exactly once.
        self.v.conn.handle_llp_lost();
        self.v.collect();
        self.check_completions_at_most_once();
        self.check_all_completed();
        assert_eq!(self.v.state(), QpState::Error);
        self.check_memory();
    }
}

#[derive(Default)]
struct Tally {
    rx: u64,
    peer_terminated: bool,
}

/// A crafted ULPDU, with STags and TOs chosen relative to the victim's regions.
#[derive(Debug, Clone)]
enum Input {
    Tagged {
        ctrl: u8,
        last: bool,
        stag: (u8, u32),
        to: (u8, i64, u64),
        payload: Vec<u8>,
    },
    Untagged {
        ctrl: u8,
        last: bool,
        word: (u8, u32),
        qn: u32,
        msn: u32,
        mo: u32,
        payload: Vec<u8>,
    },
    ReadRequest {
        msn: u32,
        sink: u32,
        stag: (u8, u32),
        to: (u8, i64, u64),
        size: u32,
    },
    /// A Write at a region's own STag, near its window (mostly permitted).
    Write {
        region: usize,
        off: i64,
        payload: Vec<u8>,
    },
    Raw(Vec<u8>),
}

fn ctrl_strategy() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => (0u8..12).prop_map(|op| 0x40 | op),
        1 => any::<u8>(),
    ]
}

fn stag_strategy() -> impl Strategy<Value = (u8, u32)> {
    (any::<u8>(), any::<u32>())
}

fn to_strategy() -> impl Strategy<Value = (u8, i64, u64)> {
    (any::<u8>(), -24i64..300, any::<u64>())
}

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..64),
        1 => proptest::collection::vec(any::<u8>(), 0..320),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        4 => (ctrl_strategy(), any::<bool>(), stag_strategy(), to_strategy(), payload())
            .prop_map(|(ctrl, last, stag, to, payload)| Input::Tagged { ctrl, last, stag, to, payload }),
        4 => (ctrl_strategy(), any::<bool>(), stag_strategy(), 0u32..5, 0u32..5, 0u32..140, payload()).prop_map(
            |(ctrl, last, word, qn, msn, mo, payload)| Input::Untagged { ctrl, last, word, qn, msn, mo, payload }
        ),
        2 => (0u32..5, any::<u32>(), stag_strategy(), to_strategy(), 0u32..300)
            .prop_map(|(msn, sink, stag, to, size)| Input::ReadRequest { msn, sink, stag, to, size }),
        4 => (0usize..6, -8i64..260, payload())
            .prop_map(|(region, off, payload)| Input::Write { region, off, payload }),
        1 => proptest::collection::vec(any::<u8>(), 0..80).prop_map(Input::Raw),
    ]
}

impl World {
    fn pick_stag(&self, (sel, raw): (u8, u32)) -> STag {
        let n = self.v.regions.len();
        match sel % 8 {
            s if usize::from(s) < n => self.v.regions[usize::from(s)].stag,
            6 => STag(self.v.regions[usize::from(sel / 8) % n].stag.0 ^ (raw & 0xff)),
            _ => STag(raw),
        }
    }

    fn pick_to(&self, (sel, off, raw): (u8, i64, u64)) -> u64 {
        let n = self.v.regions.len();
        match sel % 8 {
            s if usize::from(s) < n => self.v.regions[usize::from(s)].first_to.wrapping_add_signed(off),
            6 => u64::MAX.wrapping_add_signed(-off.abs()),
            _ => raw,
        }
    }

    fn build(&self, i: &Input) -> Vec<u8> {
        match i {
            Input::Tagged { ctrl, last, stag, to, payload } => {
                let kind =
                    SegmentKind::Tagged { stag: self.pick_stag(*stag), to: TaggedOffset(self.pick_to(*to)) };
                segment(*last, *ctrl, kind, payload)
            }
            Input::Untagged { ctrl, last, word, qn, msn, mo, payload } => {
                let kind = SegmentKind::Untagged {
                    rdmap_word: self.pick_stag(*word).0,
                    qn: QueueNumber::from(*qn),
                    msn: Msn(*msn),
                    mo: *mo,
                };
                segment(*last, *ctrl, kind, payload)
            }
            Input::ReadRequest { msn, sink, stag, to, size } => {
                let req = ReadRequest {
                    sink_stag: *sink,
                    sink_to: 0,
                    size: *size,
                    source_stag: self.pick_stag(*stag).0,
                    source_to: self.pick_to(*to),
                };
                untagged(Opcode::ReadRequest, 1, *msn, 0, true, 0, &req.to_bytes())
            }
            Input::Write { region, off, payload } => {
                let r = &self.v.regions[*region];
                tagged(Opcode::Write, r.stag, r.first_to.wrapping_add_signed(*off), payload)
            }
            Input::Raw(b) => b.clone(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Crafted ULPDUs, each framed correctly: placement follows the model exactly.
    #[test]
    fn placement_safety(
        crc in any::<bool>(),
        markers in any::<bool>(),
        through_receive in any::<bool>(),
        inputs in proptest::collection::vec((input(), 1usize..700), 1..24),
    ) {
        let mut w = World::new(crc, markers);
        if through_receive {
            w = w.reading();
        }
        let mut tally = Tally::default();
        for (i, chunk) in &inputs {
            let ulpdu = w.build(i);
            w.deliver(&ulpdu, *chunk, &mut tally);
        }
        w.finish(&tally);
        prop_assert!(w.accepted_writes <= inputs.len());
    }

    /// Valid Writes only: the stream stays up and every byte lands where the model says.
    #[test]
    fn valid_writes_are_all_placed(
        writes in proptest::collection::vec((0usize..3, 0u64..256, proptest::collection::vec(any::<u8>(), 1..64)), 1..16),
    ) {
        let mut w = World::new(false, false);
        let mut tally = Tally::default();
        for (r, off, data) in &writes {
            let region = [RW_VA, RW_ZB, RRW_ZB][*r];
            let reg = &w.v.regions[region];
            let off = off % reg.len;
            let len = data.len().min((reg.len - off) as usize);
            let ulpdu = tagged(Opcode::Write, reg.stag, reg.first_to + off, &data[..len]);
            w.deliver(&ulpdu, 7, &mut tally);
        }
        prop_assert_eq!(w.v.state(), QpState::Rts);
        w.finish(&tally);
    }

    /// Arbitrary bytes, after an optional valid FPDU: no panic, no placement outside the
    /// remotely writable windows and the receive buffers, at most one Terminate.
    #[test]
    fn arbitrary_streams(
        crc in any::<bool>(),
        markers in any::<bool>(),
        prefix in any::<bool>(),
        through_receive in any::<bool>(),
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..400), 0..12),
    ) {
        let mut w = World::new(crc, markers);
        if through_receive {
            w = w.reading();
        }
        if prefix {
            let reg = &w.v.regions[RW_VA];
            let ulpdu = tagged(Opcode::Write, reg.stag, reg.first_to + 3, &[0x5a; 40]);
            let mut tally = Tally::default();
            w.deliver(&ulpdu, 5, &mut tally);
        }
        for c in &chunks {
            w.hand(c, c.len());
            w.v.transmit();
            w.check_completions_at_most_once();
        }
        for (i, r) in w.v.regions.iter().enumerate() {
            let now = r.bytes(&w.v.table);
            let window = match i {
                RW_VA | RW_ZB | RRW_ZB => 0..r.len as usize,
                RECV => 0..328,
                _ => 0..0,
            };
            for (k, (a, b)) in now.iter().zip(&w.shadow[i]).enumerate() {
                prop_assert!(a == b || window.contains(&k), "region {} byte {} changed", i, k);
            }
        }
        prop_assert!(w.v.local_terminates() <= 1);
        prop_assert_ne!(w.v.state(), QpState::Terminate);
        w.v.conn.handle_llp_lost();
        w.v.collect();
        w.check_completions_at_most_once();
        w.check_all_completed();
    }
}

/// The largest FPDU without markers: length field, 65535 octets, 1 pad octet, CRC.
const MAX_FPDU: usize = 2 + 65535 + 1 + 4;

#[test]
fn deframer_memory_stays_bounded_while_healthy() {
    // A long stream of valid FPDUs, delivered in uneven chunks: the connection holds at most
    // the one FPDU a chunk boundary cut (never a chunk), with and without markers.
    for markers in [false, true] {
        let mut w = World::new(false, markers);
        let reg = w.v.regions[RW_VA].clone();
        let mut bytes = Vec::new();
        let mut largest = 0;
        for i in 0..2000u64 {
            let ulpdu = tagged(Opcode::Write, reg.stag, reg.first_to + i % 200, &[i as u8; 50]);
            largest = largest.max(w.attacker.inject_ulpdu(&ulpdu, &mut bytes));
        }
        assert_eq!(w.v.conn.rx_buffered_capacity(), 0);
        let mut max = 0;
        for c in bytes.chunks(997) {
            w.v.feed(c);
            max = max.max(w.v.conn.rx_buffered_capacity());
        }
        assert_eq!(w.v.state(), QpState::Rts);
        // The last Write (i = 1999) landed: the stream was deframed to its end.
        assert_eq!(reg.bytes(&w.v.table)[199..249], [1999u64 as u8; 50]);
        // 997 is no multiple of the FPDU length: chunk boundaries cut FPDUs, which are staged.
        assert!(max > 0, "markers {markers}: nothing was ever staged");
        // Vec growth may double what one FPDU needs, and with markers the deframer keeps one
        // ULPDU (64 octets here) of scratch; a chunk (997) is more than that.
        let bound = 2 * largest + if markers { 64 } else { 0 };
        assert!(max <= bound, "markers {markers}: {max} bytes held, one FPDU is {largest}");
    }
}

#[test]
fn deframer_memory_after_a_large_length_field() {
    // A length field announcing 65535 bytes, then the bytes trickle in: the connection holds
    // that one FPDU and no more, however many bytes follow.
    let mut w = World::new(false, false);
    w.v.feed(&[0xff, 0xff]);
    let mut max = 0;
    for _ in 0..80 {
        w.v.feed(&[0x11; 1000]);
        max = max.max(w.v.conn.rx_buffered_capacity());
    }
    assert!(max >= MAX_FPDU - 1000, "the FPDU being received is held: {max}");
    assert!(max <= 2 * MAX_FPDU, "{max} bytes held for 80002 received");
}

#[test]
fn deframer_memory_after_a_framing_error() {
    // After the CRC error the stream is dead; bytes that keep arriving until the caller closes
    // are dropped unread: nothing is held.
    let mut w = World::new(true, false);
    let reg = w.v.regions[RW_VA].clone();
    let mut bytes = Vec::new();
    w.attacker.inject_ulpdu(&tagged(Opcode::Write, reg.stag, reg.first_to, &[1; 8]), &mut bytes);
    bytes[4] ^= 1;
    // Half of the next FPDU's header too, so that the connection had something staged.
    bytes.extend_from_slice(&[0x00]);
    w.v.feed(&bytes);
    assert_eq!(w.v.local_terminates(), 1);
    for _ in 0..256 {
        w.v.feed(&[0x22; 4096]);
        assert_eq!(w.v.conn.rx_buffered_capacity(), 0, "bytes held after a CRC error");
    }
}

#[test]
fn bytes_after_a_terminate_are_dropped() {
    // After the victim's Terminate, valid Writes change nothing and the deframer keeps
    // consuming: it holds at most the one FPDU a chunk boundary cut.
    let mut w = World::new(false, false);
    let reg = w.v.regions[RW_VA].clone();
    let mut tally = Tally::default();
    w.deliver(&tagged(Opcode::Write, STag(0xdead_beef), 0, &[1; 8]), 3, &mut tally);
    assert_eq!(w.v.state(), QpState::Error);
    let fpdu = 2 + 14 + 100 + 4;
    let mut max = 0;
    for i in 0..500u64 {
        w.deliver(&tagged(Opcode::Write, reg.stag, reg.first_to + i % 100, &[0xee; 100]), 7, &mut tally);
        max = max.max(w.v.conn.rx_buffered_capacity());
    }
    assert!(max > 0, "FPDUs cut by chunk boundaries are staged");
    assert!(max <= 2 * fpdu, "{max} bytes held after the Terminate");
    assert!(reg.unchanged(&w.v.table));
    w.finish(&tally);
}

// --- Seeds for fuzz/fuzz_targets/qp_receive.rs --------------------------------------------

/// One seed: the variant byte, the responder's FPDUs framed as the victim expects them.
fn fuzz_seed(v: Variant, ulpdus: &[Vec<u8>]) -> Vec<u8> {
    let (mut framer, _) = connect(v.crc, v.markers, 2);
    let mut out = vec![v.to_byte()];
    for u in ulpdus {
        framer.inject_ulpdu(u, &mut out);
    }
    out
}

fn completion(o: &fuzz::Outcome, wr_id: u64) -> Completion {
    let found = o.completions.iter().find(|c| c.wr_id == wr_id);
    *found.unwrap_or_else(|| panic!("work request {wr_id} did not complete: {o:?}"))
}

/// Each seed of the `qp_receive` target reaches the path it is named after: the victim
/// (iwarp_rdmap::fuzz, the code the target runs) places, completes and answers as the seed
/// asks; the committed corpus holds them all. Writes the seeds with IWARP_WRITE_SEEDS=1.
#[test]
fn fuzz_seeds() {
    let stags = fuzz::stags();
    let plain = Variant { crc: false, markers: false, rfc7306: false, read: false, chunk: 0x0f };
    let ext = Variant { rfc7306: true, read: true, ..plain };
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut run = |name, v: Variant, ulpdus: &[Vec<u8>]| {
        let seed = fuzz_seed(v, ulpdus);
        let o = fuzz::receive(&seed);
        seeds.push((name, seed));
        o
    };
    let region = |o: &fuzz::Outcome, i: usize| o.memories[i].clone();

    let o =
        run("write", plain, &[tagged(Opcode::Write, stags[fuzz::RW_VA], fuzz::first_to(0) + 8, &[0x77; 32])]);
    assert_eq!(o.state, QpState::Rts);
    assert_eq!(region(&o, fuzz::RW_VA)[8..40], [0x77; 32]);

    let o = run("write-zero-based", plain, &[tagged(Opcode::Write, stags[fuzz::RW_ZB], 16, &[0x66; 16])]);
    assert_eq!(region(&o, fuzz::RW_ZB)[16..32], [0x66; 16]);

    let send = untagged(Opcode::Send, 0, 1, 0, true, 0, &[0x55; 24]);
    let o = run("send", plain, std::slice::from_ref(&send));
    let c = completion(&o, fuzz::WR_RECV[0]);
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::Recv, 24));
    assert_eq!(region(&o, fuzz::RECV)[..24], [0x55; 24]);

    let rr = ReadRequest {
        sink_stag: 9,
        sink_to: 0,
        size: 64,
        source_stag: stags[fuzz::RECV].0,
        source_to: fuzz::first_to(fuzz::RECV),
    };
    let read = untagged(Opcode::ReadRequest, 1, 1, 0, true, 0, &rr.to_bytes());
    let o = run("read-request", plain, std::slice::from_ref(&read));
    // The Send, then the Read Response.
    assert_eq!((o.state, o.stats.tx_segments), (QpState::Rts, 2));

    let term = untagged(Opcode::Terminate, 2, 1, 0, true, 0, &[0x12, 0x01, 0xc0, 0x00]);
    let o = run("terminate", plain, std::slice::from_ref(&term));
    assert_eq!(o.state, QpState::Error);

    let send2 = untagged(Opcode::SendSe, 0, 2, 0, true, 0, &[0x44; 8]);
    let write = tagged(Opcode::Write, stags[fuzz::RW_VA], fuzz::first_to(0) + 8, &[0x77; 32]);
    let write_zb = tagged(Opcode::Write, stags[fuzz::RW_ZB], 16, &[0x66; 16]);
    let o = run("mixed", plain, &[write_zb, send.clone(), read.clone(), send2, write]);
    assert_eq!(completion(&o, fuzz::WR_RECV[1]).byte_len, 8);
    assert_eq!(o.state, QpState::Rts);

    // The Read Response path: the outstanding Read's sink is the start of region LOCAL; the
    // response comes in two segments.
    let sink = (stags[fuzz::LOCAL], fuzz::first_to(fuzz::LOCAL));
    let half = fuzz::READ_LEN as usize / 2;
    let resp = |to: u64, last: bool, fill: u8| {
        segment(
            last,
            ctrl(Opcode::ReadResponse),
            SegmentKind::Tagged { stag: sink.0, to: TaggedOffset(to) },
            &vec![fill; half],
        )
    };
    let read_only = Variant { read: true, ..plain };
    let o =
        run("read-response", read_only, &[resp(sink.1, false, 0x31), resp(sink.1 + half as u64, true, 0x32)]);
    let c = completion(&o, fuzz::WR_READ);
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Read));
    assert_eq!(region(&o, fuzz::LOCAL)[..half], vec![0x31; half][..]);
    assert_eq!(region(&o, fuzz::LOCAL)[half..2 * half], vec![0x32; half][..]);

    // RFC 7306: the Atomic Response (QN 3) to the outstanding Atomic, then Immediate Data.
    let id = ext.atomic_request_id().unwrap();
    let original = 0x1122_3344_5566_7788u64;
    let aresp = AtomicResponse { request_id: id, original_data: original };
    let atomic_resp = untagged(Opcode::AtomicResponse, 3, 1, 0, true, 0, &aresp.to_bytes());
    let imm = untagged(Opcode::ImmediateData, 0, 1, 0, true, 0, &[0xd0, 1, 2, 3, 4, 5, 6, 7]);
    let o = run("atomic-response", Variant { read: false, ..ext }, &[atomic_resp.clone(), imm.clone()]);
    let c = completion(&o, fuzz::WR_ATOMIC);
    assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Atomic));
    let at = fuzz::ATOMIC_RESULT;
    assert_eq!(region(&o, fuzz::LOCAL)[at..at + 8], original.to_ne_bytes());
    let c = completion(&o, fuzz::WR_RECV[0]);
    assert_eq!((c.opcode, c.imm_data), (WcOpcode::RecvImmediate, Some([0xd0, 1, 2, 3, 4, 5, 6, 7])));

    // Both outstanding: they complete in posting order (Atomic, then Read); with CRC, markers
    // and one-octet chunks. The peer's own Atomic Request on region 0 is executed.
    let areq = AtomicRequest {
        op: AtomicOp::FetchAdd,
        request_id: 7,
        remote_stag: stags[fuzz::RW_VA],
        remote_to: TaggedOffset(fuzz::first_to(0)),
        add_or_swap_data: 5,
        add_or_swap_mask: 0,
        compare_data: 0,
        compare_mask: 0,
    };
    let atomic_req = untagged(Opcode::AtomicRequest, 1, 1, 0, true, 0, &areq.to_bytes());
    let all = Variant { crc: true, markers: true, chunk: 0, ..ext };
    let o = run(
        "extensions",
        all,
        &[atomic_resp, resp(sink.1, false, 0x41), atomic_req, resp(sink.1 + half as u64, true, 0x42), imm],
    );
    assert_eq!(o.state, QpState::Rts, "{o:?}");
    for wr in [fuzz::WR_ATOMIC, fuzz::WR_READ] {
        assert_eq!(completion(&o, wr).status, WcStatus::Success);
    }
    assert_eq!(completion(&o, fuzz::WR_RECV[0]).opcode, WcOpcode::RecvImmediate);
    // The guard pattern plus 5, as the native-endian u64 the memory holds.
    let before = u64::from_ne_bytes([fuzz::GUARD; 8]);
    assert_eq!(region(&o, fuzz::RW_VA)[..8], before.wrapping_add(5).to_ne_bytes());
    // The Send, then the Atomic Request, the Read Request and the Atomic Response.
    assert_eq!(o.stats.tx_segments, 4);

    // Without the extension enabled the same Atomic Response is refused.
    let o = run(
        "atomic-response-refused",
        plain,
        &[untagged(Opcode::AtomicResponse, 3, 1, 0, true, 0, &aresp.to_bytes())],
    );
    assert_eq!(o.state, QpState::Error);

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/qp_receive");
    if std::env::var("IWARP_WRITE_SEEDS").as_deref() == Ok("1") {
        std::fs::create_dir_all(dir).unwrap();
        for (name, bytes) in &seeds {
            std::fs::write(format!("{dir}/seed-{name}"), bytes).unwrap();
        }
    }
    // The committed corpus holds every seed (under any name: `cargo fuzz cmin` renames them),
    // so the target starts from inputs that reach each of these paths.
    let corpus: Vec<Vec<u8>> =
        std::fs::read_dir(dir).unwrap().map(|e| std::fs::read(e.unwrap().path()).unwrap()).collect();
    for (name, bytes) in &seeds {
        assert!(
            corpus.contains(bytes),
            "seed {name} is missing from fuzz/corpus/qp_receive (IWARP_WRITE_SEEDS=1 writes it)"
        );
    }
}

#[test]
fn placement_safety_reaches_placement() {
    // The property above is only worth something if accepted Writes happen: run a fixed
    // sequence of the kind it generates and count.
    let mut w = World::new(false, true);
    let mut tally = Tally::default();
    for i in 0..40i64 {
        let r = &w.v.regions[[RW_VA, RW_ZB, RRW_ZB][(i % 3) as usize]];
        let ulpdu = tagged(Opcode::Write, r.stag, r.first_to.wrapping_add_signed(i), &[i as u8; 20]);
        w.deliver(&ulpdu, 11, &mut tally);
    }
    assert_eq!(w.accepted_writes, 40);
    w.deliver(
        &tagged(Opcode::Write, w.v.regions[RO_VA].stag, w.v.regions[RO_VA].first_to, &[1]),
        1,
        &mut tally,
    );
    assert_eq!(w.v.local_terminates(), 1);
    w.finish(&tally);
}

#[test]
fn read_responses_carry_the_models_bytes() {
    // Reads the checks above rely on: a Write changes the model, Read Requests return the
    // model's bytes (the region's own, never a guard byte around it), across segments.
    let mut w = World::new(false, false);
    let mut tally = Tally::default();
    let rrw = w.v.regions[RRW_ZB].clone();
    w.deliver(&tagged(Opcode::Write, rrw.stag, rrw.first_to + 8, &[0x3c; 20]), 7, &mut tally);
    for (msn, (region, off, size)) in [(RRW_ZB, 0u64, 64u32), (RO_VA, 100, 28)].into_iter().enumerate() {
        let r = &w.v.regions[region];
        let rr = ReadRequest {
            sink_stag: 0x77,
            sink_to: 0x1000,
            size,
            source_stag: r.stag.0,
            source_to: r.first_to + off,
        };
        w.deliver(
            &untagged(Opcode::ReadRequest, 1, msn as u32 + 1, 0, true, 0, &rr.to_bytes()),
            5,
            &mut tally,
        );
    }
    assert_eq!(w.v.state(), QpState::Rts);
    assert!(w.reads.is_empty(), "every accepted Read was answered in full");
    let responses = deframe_all(&w.v.sent, false, false)
        .iter()
        .filter(|u| {
            SegmentRepr::parse(u)
                .is_ok_and(|s| Control::from_byte(s.header.rdmap_control).opcode == Opcode::ReadResponse)
        })
        .count();
    assert_eq!(responses, 2);
    // Past the source region's end by one byte: refused, nothing sent from it.
    let r = &w.v.regions[RO_VA];
    let rr = ReadRequest {
        sink_stag: 0x77,
        sink_to: 0,
        size: 29,
        source_stag: r.stag.0,
        source_to: r.first_to + 100,
    };
    w.deliver(&untagged(Opcode::ReadRequest, 1, 3, 0, true, 0, &rr.to_bytes()), 5, &mut tally);
    assert_ne!(w.v.state(), QpState::Rts);
    w.finish(&tally);
}
