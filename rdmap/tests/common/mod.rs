//! The one harness of rdmap's tests: connections set up by a real MPA handshake ([`Setup`]),
//! an [`End`] (a connection with its tagged buffer table, regions and buffers, and what it
//! reported or sent; regions' memory sits between guard bytes checked when it goes), a
//! [`Pair`] of ends exchanging traffic step by step with hooks on the bytes in flight, and,
//! for the hostile-peer tests, an attacker connection used only to frame crafted ULPDUs,
//! builders for raw DDP segments and a decoder for the Terminate the victim sends back.
#![allow(dead_code, reason = "each test file uses part of the harness")]

use iwarp_ddp::dma::{Buffer, GuardedBuffer};
use iwarp_ddp::header::{HeaderRepr, SegmentKind};
use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{Msn, QueueNumber, RegionMemory, STag, TableMemory, TaggedOffset};
use iwarp_mpa::{ConnParams, Deframed, Deframer, FrameRepr, Policy};
use iwarp_rdmap::conn::{Connection, TxBatch};
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::{
    Completion, QpConfig, QpEvent, QpState, QueuePair, RecvWr, SendWr, SharedReceiveQueue,
};
use iwarp_rdmap::{Control, Opcode, TerminateMessage};

/// MULPDU of both sides.
pub(crate) const MULPDU: usize = 1442;
/// The victim's protection domain.
pub(crate) const VICTIM_PD: u32 = 2;
/// Another protection domain on the victim's device.
pub(crate) const OTHER_PD: u32 = 9;

/// How [`Setup::connect`] sets up a connection: MPA's CRC and markers, IRD/ORD, the RFC 7306
/// extensions, a shared receive queue for the responder, peer-to-peer RTR types, MULPDU and
/// the queues' depth.
pub(crate) struct Setup {
    pub(crate) crc: bool,
    pub(crate) markers: bool,
    pub(crate) ird_ord: u16,
    pub(crate) rfc7306: bool,
    pub(crate) srq: Option<SharedReceiveQueue>,
    pub(crate) rtr: Option<iwarp_mpa::RtrTypes>,
    pub(crate) mulpdu: usize,
    pub(crate) max_wr: usize,
}

impl Setup {
    /// CRC and markers as given, IRD/ORD 4, no extensions, MULPDU [`MULPDU`].
    pub(crate) fn new(crc: bool, markers: bool) -> Setup {
        Setup { crc, markers, ird_ord: 4, rfc7306: false, srq: None, rtr: None, mulpdu: MULPDU, max_wr: 4096 }
    }

    /// Runs a real MPA handshake; returns (initiator, responder).
    pub(crate) fn connect(self) -> (Connection, Connection) {
        let policy = Policy {
            peer_to_peer: self.rtr.is_some(),
            rtr: self.rtr.unwrap_or(Policy::default().rtr),
            crc: if self.crc { iwarp_mpa::CrcPolicy::Wanted } else { iwarp_mpa::CrcPolicy::Off },
            markers_wanted: self.markers,
            ird: self.ird_ord,
            ord: self.ird_ord,
            ..Policy::default()
        };
        let req = policy.request(b"").unwrap().to_vec().unwrap();
        let req = FrameRepr::parse(&req).unwrap();
        let (reply, server) = policy.respond(&req, b"").unwrap();
        let client = policy.accept_reply(&reply).unwrap();
        assert_eq!(
            (client.crc, client.markers_rx, server.markers_rx),
            (self.crc, self.markers, self.markers)
        );
        let cfg = |p: &ConnParams| QpConfig {
            mulpdu: self.mulpdu,
            ird: p.ird,
            ord: p.ord,
            max_send_wr: self.max_wr,
            max_recv_wr: self.max_wr,
            rfc7306: self.rfc7306,
        };
        let responder = match self.srq {
            Some(srq) => Connection::with_qp(&server, QueuePair::with_srq(cfg(&server), srq)),
            None => Connection::new(&server, cfg(&server)),
        };
        (Connection::new(&client, cfg(&client)), responder)
    }
}

/// A hostile-peer test's connection; returns (attacker, victim). The victim is the initiator:
/// a responder sends nothing before the initiator's first FPDU (RFC 5044 section 7.1.2), and
/// some tests need the victim to speak first.
pub(crate) fn connect(crc: bool, markers: bool, ird_ord: u16) -> (Connection, Connection) {
    connect_ext(crc, markers, ird_ord, false)
}

/// [`connect`], with the RFC 7306 extensions on or off on both sides.
pub(crate) fn connect_ext(crc: bool, markers: bool, ird_ord: u16, rfc7306: bool) -> (Connection, Connection) {
    let (victim, attacker) = Setup { ird_ord, rfc7306, max_wr: 64, ..Setup::new(crc, markers) }.connect();
    (attacker, victim)
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

/// One end of a connection: its connection, tagged buffer table and protection domain, the
/// regions registered through it, and everything it reported or sent. Hostile-peer tests call
/// it the victim; [`Pair`] has two.
pub(crate) struct End {
    pub(crate) conn: Connection,
    pub(crate) table: TaggedBufferTable,
    pub(crate) pd: ProtectionDomainId,
    pub(crate) regions: Vec<Region>,
    pub(crate) completions: Vec<Completion>,
    pub(crate) events: Vec<QpEvent>,
    pub(crate) sent: Vec<u8>,
    next_va: u64,
    /// Buffers registered with [`End::buf`] so far (picks the next one's kind of memory).
    bufs: usize,
}

impl Drop for End {
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

impl End {
    /// The end in protection domain [`VICTIM_PD`].
    pub(crate) fn new(conn: Connection) -> End {
        End::with_pd(conn, VICTIM_PD)
    }

    /// The end in protection domain `pd`.
    pub(crate) fn with_pd(conn: Connection, pd: u32) -> End {
        End {
            conn,
            table: TaggedBufferTable::new(64),
            pd: ProtectionDomainId(pd),
            regions: Vec::new(),
            completions: Vec::new(),
            events: Vec::new(),
            sent: Vec::new(),
            next_va: 0x7f00_1234_0000 + u64::from(pd) * 0x1000_0000,
            bufs: 0,
        }
    }

    /// Registers `len` bytes filled with `fill` in this end's protection domain, over each
    /// kind of memory in turn (a vector, a boxed slice, a `BytesMut`, a page-aligned buffer):
    /// the application's buffer of a [`Pair`] test.
    pub(crate) fn buf(&mut self, len: usize, access: Access, fill: u8) -> Buf {
        self.bufs += 1;
        let mem = match self.bufs % 4 {
            0 => RegionMemory::new(vec![fill; len]),
            1 => RegionMemory::new(vec![fill; len].into_boxed_slice()),
            2 => RegionMemory::new(bytes::BytesMut::from(&vec![fill; len][..])),
            _ => RegionMemory::from_bytes(&vec![fill; len]),
        };
        let va = self.next_va;
        self.next_va += (len as u64 + 4096) & !4095;
        let spec =
            RegionSpec { base_va: va, len: len as u64, access, addressing: Addressing::VirtualAddress };
        let stag = self.table.register(self.pd, spec, mem).unwrap();
        Buf { stag, va, len: u32::try_from(len).unwrap() }
    }

    /// Copies `data` into `buf` at `off` (the application's copy into its own region).
    pub(crate) fn write(&mut self, buf: &Buf, off: usize, data: &[u8]) -> Result<(), iwarp_ddp::OutOfBounds> {
        self.table.memory_mut(buf.stag).unwrap().write(off, data)
    }

    /// What `buf` holds now.
    pub(crate) fn bytes(&self, buf: &Buf) -> Vec<u8> {
        self.table.memory(buf.stag).unwrap().to_vec()
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

    /// Lets the victim read `bytes` through [`Connection::receive`], as the engine reads a
    /// socket that holds them: each read takes what the connection asks for, at most `most`.
    pub(crate) fn read(&mut self, bytes: &[u8], most: usize) {
        let mut rx = vec![0; 64 * 1024];
        let mut mem = TableMemory { table: &mut self.table, pd: self.pd };
        let mut at = 0;
        while at < bytes.len() {
            let step = self
                .conn
                .receive(&mut mem, &mut rx, |bufs| Ok::<_, ()>(deliver(bufs, &bytes[at..], most.max(1))))
                .unwrap();
            assert!(step.read > 0, "a read with {} bytes waiting asked for none", bytes.len() - at);
            at += step.read;
        }
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

// --- two ends exchanging traffic ------------------------------------------------------

/// A registered buffer.
#[derive(Clone)]
pub(crate) struct Buf {
    pub(crate) stag: STag,
    pub(crate) va: u64,
    pub(crate) len: u32,
}

impl Buf {
    pub(crate) fn sge(&self) -> Sge {
        Sge { lkey: self.stag, addr: self.va, len: self.len }
    }

    pub(crate) fn sge_at(&self, off: u64, len: u32) -> Sge {
        Sge { lkey: self.stag, addr: self.va + off, len }
    }
}

/// Which way bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    AtoB,
    BtoA,
}

pub(crate) type Hook = Box<dyn FnMut(Dir, &mut Vec<u8>)>;

pub(crate) struct Pair {
    pub(crate) a: End,
    pub(crate) b: End,
    pub(crate) hook: Option<Hook>,
    /// Bytes moved, both ways.
    pub(crate) moved: usize,
    /// How the receiver takes bytes in: `None`, handed over in chunks of 1000; `Some`, read
    /// through [`Connection::receive`] by a link that delivers at most a pseudo-random number
    /// of bytes (below the value) per read, from this generator state.
    pub(crate) link: Option<(usize, u64)>,
    /// The sender frames through [`Connection::poll_transmit_batch`] (payloads left in
    /// registered memory), and a link that takes a pseudo-random part of each batch, the rest
    /// copied out with [`TxBatch::unsent`]; from this generator state.
    pub(crate) batched: Option<u64>,
    /// The batch the batched sender frames into, kept from step to step (and direction to
    /// direction) as the engine keeps its own: each batch is framed over the bytes of the
    /// ones before.
    pub(crate) tx_batch: TxBatch,
}

impl Pair {
    pub(crate) fn new(crc: bool, markers: bool) -> Pair {
        Pair::with_ird_ord(crc, markers, 4)
    }

    pub(crate) fn with_ird_ord(crc: bool, markers: bool, ird_ord: u16) -> Pair {
        Pair::from_conns(Setup { ird_ord, ..Setup::new(crc, markers) }.connect())
    }

    pub(crate) fn from_conns((a, b): (Connection, Connection)) -> Pair {
        Pair {
            a: End::with_pd(a, 1),
            b: End::with_pd(b, 2),
            hook: None,
            moved: 0,
            link: None,
            batched: None,
            tx_batch: TxBatch::default(),
        }
    }

    /// Both ends take the RFC 7306 extensions.
    pub(crate) fn rfc7306() -> Pair {
        Pair::from_conns(Setup { rfc7306: true, ..Setup::new(true, false) }.connect())
    }

    /// Moves what each side has to send to the other, once each way; returns bytes moved.
    pub(crate) fn step(&mut self) -> usize {
        let mut moved = 0;
        for dir in [Dir::AtoB, Dir::BtoA] {
            let (from, to) = match dir {
                Dir::AtoB => (&mut self.a, &mut self.b),
                Dir::BtoA => (&mut self.b, &mut self.a),
            };
            let mut bytes = Vec::new();
            let mut mem = TableMemory { table: &mut from.table, pd: from.pd };
            match &mut self.batched {
                None => {
                    from.conn.poll_transmit(&mut mem, &mut bytes, 256 * 1024);
                }
                Some(state) => {
                    let batch = &mut self.tx_batch;
                    while bytes.len() < 256 * 1024 {
                        batch.clear();
                        let n = from.conn.poll_transmit_batch(&mut mem, batch, 64 * 1024);
                        if n == 0 {
                            break;
                        }
                        *state ^= *state << 13;
                        *state ^= *state >> 7;
                        *state ^= *state << 17;
                        let took = (*state as usize) % (n + 1);
                        let mut iov = Vec::new();
                        batch.io_slices(&mem, &mut iov).unwrap();
                        assert_eq!(iov.iter().map(|b| b.len()).sum::<usize>(), n);
                        let mut left = took;
                        for b in &iov {
                            let k = left.min(b.len());
                            bytes.extend_from_slice(&b[..k]);
                            left -= k;
                        }
                        drop(iov);
                        assert_eq!(batch.unsent(&mem, took, &mut bytes).unwrap(), n - took);
                    }
                }
            }
            if let Some(h) = self.hook.as_mut() {
                h(dir, &mut bytes);
            }
            moved += bytes.len();
            let mut mem = TableMemory { table: &mut to.table, pd: to.pd };
            match &mut self.link {
                // Deliver in uneven chunks, as TCP would.
                None => {
                    for chunk in bytes.chunks(1000) {
                        to.conn.handle_bytes(&mut mem, chunk);
                    }
                }
                // Or let the connection read, as the engine does.
                Some((most, state)) => {
                    let mut rx = vec![0; 256 * 1024];
                    let mut at = 0;
                    while at < bytes.len() {
                        *state ^= *state << 13;
                        *state ^= *state >> 7;
                        *state ^= *state << 17;
                        let limit = 1 + (*state as usize) % *most;
                        let step = to
                            .conn
                            .receive(&mut mem, &mut rx, |bufs| {
                                Ok::<_, ()>(deliver(bufs, &bytes[at..], limit))
                            })
                            .unwrap();
                        at += step.read;
                    }
                }
            }
        }
        self.a.collect();
        self.b.collect();
        self.moved += moved;
        moved
    }

    /// Steps until nothing moves (bounded).
    pub(crate) fn run(&mut self) {
        for _ in 0..100_000 {
            if self.step() == 0 && self.step() == 0 {
                return;
            }
        }
        panic!("the pair did not settle");
    }
}

/// A link's vectored read: at most `limit` bytes of `from` into `bufs`, each filled before the
/// next; returns the bytes read.
pub(crate) fn deliver(bufs: &mut [std::io::IoSliceMut<'_>], from: &[u8], limit: usize) -> usize {
    let mut n = 0;
    for b in bufs {
        let k = b.len().min(limit - n).min(from.len() - n);
        b[..k].copy_from_slice(&from[n..n + k]);
        n += k;
    }
    n
}
