//! Shared harness for the hostile-peer tests: a victim connection with its tagged buffer table
//! and regions (each region's memory larger than its registered length, so guard bytes follow
//! the registered window), an attacker connection used only to frame crafted ULPDUs, builders
//! for raw DDP segments and a decoder for the Terminate the victim sends back.
#![allow(dead_code, reason = "each test file uses part of the harness")]

use iwarp_ddp::dma::{Buffer, GuardedBuffer};
use iwarp_ddp::header::{HeaderRepr, SegmentKind};
use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{Msn, QueueNumber, RegionMemory, STag, TableMemory, TaggedOffset};
use iwarp_mpa::{ConnParams, Deframed, Deframer, FrameRepr, Policy};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::{Completion, QpConfig, QpEvent, QpState, RecvWr, SendWr};
use iwarp_rdmap::{Control, Opcode, TerminateMessage};

/// MULPDU of both sides.
pub(crate) const MULPDU: usize = 1442;
/// The victim's protection domain.
pub(crate) const VICTIM_PD: u32 = 2;
/// Another protection domain on the victim's device.
pub(crate) const OTHER_PD: u32 = 9;

/// Queue-pair settings from the negotiated parameters.
#[allow(clippy::field_reassign_with_default, reason = "stays valid as QpConfig grows fields")]
pub(crate) fn config(p: &ConnParams, rfc7306: bool) -> QpConfig {
    let mut c = QpConfig::default();
    c.rfc7306 = rfc7306;
    c.mulpdu = MULPDU;
    c.ird = p.ird;
    c.ord = p.ord;
    c.max_send_wr = 64;
    c.max_recv_wr = 64;
    c
}

/// Runs a real MPA handshake; returns (attacker, victim). The victim is the initiator: a
/// responder sends nothing before the initiator's first FPDU (RFC 5044 section 7.1.2), and
/// some tests need the victim to speak first.
pub(crate) fn connect(crc: bool, markers: bool, ird_ord: u16) -> (Connection, Connection) {
    connect_ext(crc, markers, ird_ord, false)
}

/// [`connect`], with the RFC 7306 extensions on or off on both sides.
pub(crate) fn connect_ext(crc: bool, markers: bool, ird_ord: u16, rfc7306: bool) -> (Connection, Connection) {
    let policy = Policy {
        crc: if crc { iwarp_mpa::CrcPolicy::Wanted } else { iwarp_mpa::CrcPolicy::Off },
        markers_wanted: markers,
        ird: ird_ord,
        ord: ird_ord,
        ..Policy::default()
    };
    let req = policy.request(b"").unwrap().to_vec().unwrap();
    let req = FrameRepr::parse(&req).unwrap();
    let (reply, server) = policy.respond(&req, b"").unwrap();
    let client = policy.accept_reply(&reply).unwrap();
    assert_eq!((client.crc, client.markers_rx, server.markers_rx), (crc, markers, markers));
    (Connection::new(&server, config(&server, rfc7306)), Connection::new(&client, config(&client, rfc7306)))
}

/// A registered region of the victim.
#[derive(Clone)]
pub(crate) struct Region {
    pub(crate) stag: STag,
    /// The first valid tagged offset (base VA, or 0 when zero-based).
    pub(crate) first_to: u64,
    /// Registered length (the memory is longer: the rest are guard bytes).
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) pd: u32,
    /// The memory's content at registration.
    pub(crate) initial: Vec<u8>,
}

impl Region {
    /// An SGE over `len` bytes at byte `off` of the registered window.
    pub(crate) fn sge(&self, off: u64, len: u32) -> Sge {
        Sge { lkey: self.stag, addr: self.first_to + off, len }
    }

    /// The region's memory now (the victim's table owns it).
    pub(crate) fn bytes(&self, table: &TaggedBufferTable) -> Vec<u8> {
        table.memory(self.stag).map(RegionMemory::to_vec).unwrap_or_default()
    }

    pub(crate) fn unchanged(&self, table: &TaggedBufferTable) -> bool {
        self.bytes(table) == self.initial
    }
}

/// Guard bytes before and after every region's memory.
const GUARD_LEN: usize = 32;
/// What the guard bytes hold.
const GUARD: u8 = 0xe7;

/// The victim: its connection, table, regions and everything it reported or sent.
pub(crate) struct Victim {
    pub(crate) conn: Connection,
    pub(crate) table: TaggedBufferTable,
    pub(crate) pd: ProtectionDomainId,
    pub(crate) regions: Vec<Region>,
    pub(crate) completions: Vec<Completion>,
    pub(crate) events: Vec<QpEvent>,
    pub(crate) sent: Vec<u8>,
    next_va: u64,
}

impl Drop for Victim {
    /// Deregisters every region and checks that no byte around its memory changed: whatever
    /// the test did, the stack wrote nothing outside the memory it was given.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for r in &self.regions {
            let Ok((_, Some(memory))) = self.table.deregister_unbinding(r.stag) else {
                panic!("region {} is not registered any more", r.stag);
            };
            let Buffer::Guarded(g) = memory.into_buffer() else { panic!("not the guarded buffer") };
            assert!(g.guards_hold(GUARD), "bytes around region {} changed", r.stag);
        }
    }
}

impl Victim {
    pub(crate) fn new(conn: Connection) -> Victim {
        Victim {
            conn,
            table: TaggedBufferTable::new(64),
            pd: ProtectionDomainId(VICTIM_PD),
            regions: Vec::new(),
            completions: Vec::new(),
            events: Vec::new(),
            sent: Vec::new(),
            next_va: 0x7f00_1234_0000,
        }
    }

    /// Registers `len` bytes (memory `mem_len` >= `len` bytes, filled with a pattern from
    /// `seed`) in protection domain `pd`; returns the region's index in `regions`.
    pub(crate) fn register_in(
        &mut self,
        pd: u32,
        len: u64,
        mem_len: usize,
        access: Access,
        addressing: Addressing,
        seed: u8,
    ) -> usize {
        let initial: Vec<u8> =
            (0..mem_len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) | 0x01).collect();
        // The memory is a window of a larger allocation: guard bytes before and after it,
        // checked when the victim goes (see Drop), on top of the unregistered bytes after
        // `len` inside the memory.
        let mem = RegionMemory::new(GuardedBuffer::new(GUARD_LEN, &initial, GUARD_LEN, GUARD));
        let base_va = self.next_va;
        self.next_va += 0x10_0000;
        let spec = RegionSpec { base_va, len, access, addressing };
        let stag = self.table.register(ProtectionDomainId(pd), spec, mem).unwrap();
        let first_to = match addressing {
            Addressing::VirtualAddress => base_va,
            Addressing::ZeroBased => 0,
        };
        self.regions.push(Region { stag, first_to, len, access, pd, initial });
        self.regions.len() - 1
    }

    pub(crate) fn register(&mut self, len: u64, access: Access, addressing: Addressing) -> usize {
        let seed = self.regions.len() as u8;
        self.register_in(VICTIM_PD, len, len as usize + 64, access, addressing, seed)
    }

    pub(crate) fn post_recv(&mut self, wr_id: u64, sgl: Vec<Sge>) {
        self.conn.qp().post_recv(RecvWr { wr_id, sgl: sgl.into() }).unwrap();
    }

    pub(crate) fn post_send(&mut self, wr: SendWr) {
        self.conn.qp().post_send(wr).unwrap();
    }

    /// Hands `bytes` to the victim as TCP delivered them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        let mut mem = TableMemory { table: &mut self.table, pd: self.pd };
        self.conn.handle_bytes(&mut mem, bytes);
        self.collect();
    }

    /// Lets the victim send what it has; returns the bytes (also appended to `sent`).
    pub(crate) fn transmit(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut mem = TableMemory { table: &mut self.table, pd: self.pd };
        self.conn.poll_transmit(&mut mem, &mut out, 1 << 20);
        self.sent.extend_from_slice(&out);
        self.collect();
        out
    }

    pub(crate) fn collect(&mut self) {
        while let Some(c) = self.conn.qp().poll_completion() {
            self.completions.push(c);
        }
        while let Some(e) = self.conn.qp().poll_event() {
            self.events.push(e);
        }
    }

    pub(crate) fn state(&self) -> QpState {
        self.conn.qp_ref().state()
    }

    pub(crate) fn local_terminates(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, QpEvent::LocalTerminate(_))).count()
    }
}

/// A DDP segment: `header` then `payload`.
pub(crate) fn segment(last: bool, rdmap_control: u8, kind: SegmentKind, payload: &[u8]) -> Vec<u8> {
    HeaderRepr { last, rdmap_control, kind }.with_payload(payload).to_vec()
}

/// The RDMAP control byte of `op` (RV 1).
pub(crate) fn ctrl(op: Opcode) -> u8 {
    Control::new(op).to_byte()
}

/// A tagged segment with L set.
pub(crate) fn tagged(op: Opcode, stag: STag, to: u64, payload: &[u8]) -> Vec<u8> {
    segment(true, ctrl(op), SegmentKind::Tagged { stag, to: TaggedOffset(to) }, payload)
}

/// An untagged segment.
pub(crate) fn untagged(
    op: Opcode,
    qn: u32,
    msn: u32,
    mo: u32,
    last: bool,
    rdmap_word: u32,
    payload: &[u8],
) -> Vec<u8> {
    let kind = SegmentKind::Untagged { rdmap_word, qn: QueueNumber::from(qn), msn: Msn(msn), mo };
    segment(last, ctrl(op), kind, payload)
}

/// Deframes a whole direction of a stream into its ULPDUs (panics on a framing error).
pub(crate) fn deframe_all(bytes: &[u8], crc: bool, markers: bool) -> Vec<Vec<u8>> {
    let mut d = Deframer::new(crc, markers);
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        match d.deframe(&bytes[at..]).unwrap() {
            Deframed::Fpdu(f) => {
                out.push(f.ulpdu.to_vec());
                at += f.wire_len;
            }
            Deframed::NeedMore(n) => panic!("partial FPDU at {at}: {n} bytes needed"),
        }
    }
    out
}

/// A Terminate as sent: its DDP header and its parsed body.
#[derive(Debug)]
pub(crate) struct SentTerminate {
    pub(crate) ddp: HeaderRepr,
    pub(crate) msg: TerminateMessage,
}

/// Checks that `ulpdu` is a Terminate's single segment (untagged, QN 2, L, MO 0, RDMAP control
/// 0x47) and parses its body.
pub(crate) fn parse_terminate(ulpdu: &[u8]) -> SentTerminate {
    let (ddp, hlen) = HeaderRepr::parse(ulpdu).unwrap();
    assert_eq!(ulpdu[0], 0x41, "DDP control: untagged, L, DV 1");
    assert_eq!(ddp.rdmap_control, 0x47, "RDMAP control: RV 1, opcode 7");
    let SegmentKind::Untagged { qn, mo, rdmap_word, .. } = ddp.kind else { panic!("tagged Terminate") };
    assert_eq!((qn, mo, rdmap_word), (QueueNumber::Terminate, 0, 0));
    assert!(ddp.last);
    let msg = TerminateMessage::parse(&ulpdu[hlen..]).unwrap();
    assert_eq!(msg.buffer_len(), ulpdu.len() - hlen, "no trailing bytes after the Terminate body");
    SentTerminate { ddp, msg }
}
