//! The victim of the `qp_receive` fuzz target (fuzz/fuzz_targets/qp_receive.rs), kept in the
//! library so that tests run the same code on the target's seeds (rdmap/tests/hostile.rs).
//!
//! A connection after a real MPA handshake (initiator side, [`Policy`] defaults with CRC and
//! markers as the variant byte says) with four registered regions, two receives, a Send and,
//! depending on the variant, an outstanding RDMA Read and an outstanding RFC 7306 Atomic (with
//! the extensions enabled) is fed arbitrary bytes in chunks. [`receive`] panics when an
//! invariant breaks:
//! - no work request completes twice, and after the LLP is lost every one has completed
//!   exactly once;
//! - no byte changes outside the permitted ranges: the guard bytes after every region inside
//!   its memory and around the memory itself, the part of the receive region that holds no
//!   receive buffer, the part of the local-only region that is neither the Read sink nor the
//!   Atomic result.
//!
//! Under `cfg(fuzzing)` the deframer does not check CRCs (see mpa/src/codec.rs), so CRC
//! variants reach the layers above.

use iwarp_ddp::dma::{Buffer, GuardedBuffer};
use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{RegionMemory, STag, TableMemory};
use iwarp_mpa::{CrcPolicy, FrameRepr, Policy};

use crate::atomic::AtomicOp;
use crate::conn::Connection;
use crate::memory::Sge;
use crate::qp::{Completion, QpConfig, QpState, QpStats, RecvWr, SendOp, SendWr};

/// Registered length of every region.
pub const REGION_LEN: usize = 128;
/// Length of each region's memory: the registered bytes, then guard bytes.
const MEMORY_LEN: usize = 192;
/// What every memory byte holds before the run.
pub const GUARD: u8 = 0xa5;
/// The guard bytes around each region's memory (outside what the table can address at all).
const OUTER: u8 = 0x5a;
/// How many of them on each side.
const OUTER_LEN: usize = 32;
const PD: ProtectionDomainId = ProtectionDomainId(1);

/// Region 0: remote write, local write, remote atomic; virtual addressing.
pub const RW_VA: usize = 0;
/// Region 1: remote write only; zero-based addressing.
pub const RW_ZB: usize = 1;
/// Region 2: remote read and local write: receive buffers at 0..64, the Send's source at
/// 64..80.
pub const RECV: usize = 2;
/// Region 3: local write only: the Read sink at 0..32, the Atomic result at 32..40.
pub const LOCAL: usize = 3;

/// Bytes of region [`RECV`] that receive buffers cover.
pub const RECV_BUFFERS: usize = 64;
/// Length of the outstanding Read (the sink is the start of region [`LOCAL`]).
pub const READ_LEN: u32 = 32;
/// Offset of the Atomic result in region [`LOCAL`].
pub const ATOMIC_RESULT: usize = 32;
/// The peer STag the outstanding Read and Atomic name (any value: the victim only sends it).
pub const PEER_STAG: STag = STag(0x0000_7700);

/// Work request ids: the two receives, the Send, the Read, the Atomic.
pub const WR_RECV: [u64; 2] = [0, 1];
/// The Send's work request id.
pub const WR_SEND: u64 = 2;
/// The Read's work request id.
pub const WR_READ: u64 = 3;
/// The Atomic's work request id.
pub const WR_ATOMIC: u64 = 4;

/// What the first input byte selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Bit 0: CRC negotiated.
    pub crc: bool,
    /// Bit 1: markers in both directions.
    pub markers: bool,
    /// Bit 2: RFC 7306 enabled, with an outstanding Atomic (FetchAdd).
    pub rfc7306: bool,
    /// Bit 3: an outstanding RDMA Read.
    pub read: bool,
    /// Bits 4..8: the chunk length is `64 * n + 1`.
    pub chunk: u8,
}

impl Variant {
    /// Decodes the selector byte.
    pub fn from_byte(sel: u8) -> Variant {
        Variant {
            crc: sel & 1 != 0,
            markers: sel & 2 != 0,
            rfc7306: sel & 4 != 0,
            read: sel & 8 != 0,
            chunk: sel >> 4,
        }
    }

    /// The selector byte (`chunk` is taken modulo 16).
    pub fn to_byte(self) -> u8 {
        u8::from(self.crc)
            | u8::from(self.markers) << 1
            | u8::from(self.rfc7306) << 2
            | u8::from(self.read) << 3
            | (self.chunk & 0x0f) << 4
    }

    fn chunk_len(self) -> usize {
        usize::from(self.chunk) * 64 + 1
    }

    /// The work requests posted in this variant.
    pub fn posted(self) -> Vec<u64> {
        let mut ids = vec![WR_RECV[0], WR_RECV[1], WR_SEND];
        if self.rfc7306 {
            ids.push(WR_ATOMIC);
        }
        if self.read {
            ids.push(WR_READ);
        }
        ids
    }

    /// The request identifier of the outstanding Atomic (its send-queue sequence number: the
    /// Send is posted first, the Atomic second).
    pub fn atomic_request_id(self) -> Option<u32> {
        self.rfc7306.then_some(1)
    }
}

/// The victim's regions: the table that owns their memories, and their STags.
struct Regions {
    table: TaggedBufferTable,
    stags: [STag; 4],
}

/// The base address (or first tagged offset, for zero-based region 1) of region `i`.
pub fn first_to(i: usize) -> u64 {
    if i == RW_ZB { 0 } else { 0x10_0000 * (i as u64 + 1) }
}

fn regions() -> Regions {
    let specs = [
        (
            Access::REMOTE_WRITE.union(Access::LOCAL_WRITE).union(Access::REMOTE_ATOMIC),
            Addressing::VirtualAddress,
        ),
        (Access::REMOTE_WRITE, Addressing::ZeroBased),
        (Access::REMOTE_READ.union(Access::LOCAL_WRITE), Addressing::VirtualAddress),
        (Access::LOCAL_WRITE, Addressing::VirtualAddress),
    ];
    // A fixed seed: the STags are random-looking but the same in every run, so that seeds
    // (and the corpus) name the victim's regions.
    let mut table = TaggedBufferTable::with_seed(16, 0);
    let mut stags = [STag(0); 4];
    for (i, ((access, addressing), stag)) in specs.into_iter().zip(&mut stags).enumerate() {
        let spec =
            RegionSpec { base_va: 0x10_0000 * (i as u64 + 1), len: REGION_LEN as u64, access, addressing };
        let memory = RegionMemory::new(GuardedBuffer::new(OUTER_LEN, &[GUARD; MEMORY_LEN], OUTER_LEN, OUTER));
        let Ok(s) = table.register(PD, spec, memory) else { panic!("register region {i}") };
        *stag = s;
    }
    Regions { table, stags }
}

/// The STags the victim's regions get (the same registrations in a fresh table), for seeds.
pub fn stags() -> [STag; 4] {
    regions().stags
}

/// What a run did, for tests of the seeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Completions polled while the bytes were fed.
    pub completions: Vec<Completion>,
    /// The queue pair's state after the last chunk.
    pub state: QpState,
    /// Its counters.
    pub stats: QpStats,
    /// Bytes it transmitted (its requests, responses and Terminate).
    pub transmitted: usize,
    /// Each region's memory at the end.
    pub memories: Vec<Vec<u8>>,
}

/// Runs the victim on `data` (selector byte, then the peer's stream) and checks the
/// invariants in the module documentation; panics when one breaks.
pub fn receive(data: &[u8]) -> Outcome {
    let (sel, stream) = data.split_first().map_or((0, &[][..]), |(s, r)| (*s, r));
    let v = Variant::from_byte(sel);
    let crc = if v.crc { CrcPolicy::Wanted } else { CrcPolicy::Off };
    let policy = Policy { crc, markers_wanted: v.markers, ..Policy::default() };
    // The default policy agrees with itself: a failure here is a bug, not an input.
    let Ok(req) = policy.request(b"").and_then(|r| r.to_vec().map_err(Into::into)) else { panic!("request") };
    let Ok(req) = FrameRepr::parse(&req) else { panic!("parse request") };
    let Ok((reply, _)) = policy.respond(&req, b"") else { panic!("respond") };
    let Ok(params) = policy.accept_reply(&reply) else { panic!("accept reply") };
    let config = QpConfig { ord: 2, rfc7306: v.rfc7306, ..QpConfig::default() };
    let mut conn = Connection::new(&params, config);
    // Every FPDU a chunk cuts after its header, and whose payload has a place, is placed piece
    // by piece as its bytes arrive (the path that reads payloads straight into place).
    conn.set_direct_min(Some(1));
    let Regions { mut table, stags } = regions();
    let recv_va = first_to(RECV);
    for (i, &wr_id) in WR_RECV.iter().enumerate() {
        let sgl = Sge { lkey: stags[RECV], addr: recv_va + 32 * i as u64, len: 32 }.into();
        let posted = conn.qp().post_recv(RecvWr { wr_id, sgl });
        assert!(posted.is_ok(), "post_recv: {posted:?}");
    }
    let mut post = |wr_id, op, region: usize, addr, len| {
        let sgl = Sge { lkey: stags[region], addr, len }.into();
        let posted = conn.qp().post_send(SendWr { wr_id, op, sgl, signaled: true });
        assert!(posted.is_ok(), "post_send {wr_id}: {posted:?}");
    };
    post(WR_SEND, SendOp::Send { solicited: false, invalidate: None }, RECV, recv_va + 64, 16);
    let local_va = first_to(LOCAL);
    if v.rfc7306 {
        let op = SendOp::Atomic {
            remote_stag: PEER_STAG,
            remote_to: 0x2000,
            op: AtomicOp::FetchAdd,
            data: 1,
            data_mask: 0,
            compare: 0,
            compare_mask: 0,
        };
        post(WR_ATOMIC, op, LOCAL, local_va + ATOMIC_RESULT as u64, 8);
    }
    if v.read {
        post(WR_READ, SendOp::Read { remote_stag: PEER_STAG, remote_to: 0x1000 }, LOCAL, local_va, READ_LEN);
    }
    let mut mem = TableMemory { table: &mut table, pd: PD };
    // One transmit buffer of one FPDU for the whole run (no allocation or zero-fill per
    // chunk).
    let mut tx = vec![0u8; conn.max_fpdu_len()];
    let mut transmitted = 0;
    let mut transmit = |conn: &mut Connection, mem: &mut TableMemory<'_>| {
        // Bounded: some FPDUs per call, as a transport with a full socket would.
        for _ in 0..64 {
            let n = conn.poll_transmit_into(mem, &mut tx);
            transmitted += n;
            if n == 0 {
                break;
            }
        }
    };
    // The requests go out before anything arrives, so that responses can match them.
    transmit(&mut conn, &mut mem);
    let posted = v.posted();
    let mut done = vec![0u32; posted.len()];
    let mut completions = Vec::new();
    let count = |c: Completion, done: &mut Vec<u32>| {
        let Some(i) = posted.iter().position(|&id| id == c.wr_id) else {
            panic!("completion of an unknown work request: {c:?}")
        };
        done[i] += 1;
        assert!(done[i] <= 1, "work request {} completed twice", c.wr_id);
    };
    for chunk in stream.chunks(v.chunk_len()) {
        conn.handle_bytes(&mut mem, chunk);
        transmit(&mut conn, &mut mem);
        while let Some(c) = conn.qp().poll_completion() {
            count(c, &mut done);
            completions.push(c);
        }
        while conn.qp().poll_event().is_some() {}
    }
    let state = conn.qp_ref().state();
    let stats = conn.qp_ref().stats();
    conn.handle_llp_lost();
    while let Some(c) = conn.qp().poll_completion() {
        count(c, &mut done);
    }
    assert!(done.iter().all(|&n| n == 1), "every work request completes exactly once: {posted:?} {done:?}");
    let memories: Vec<Vec<u8>> =
        stags.iter().map(|&s| table.memory(s).map(RegionMemory::to_vec).unwrap_or_default()).collect();
    for (i, bytes) in memories.iter().enumerate() {
        let unchanged_from = match i {
            RECV => RECV_BUFFERS,
            LOCAL => ATOMIC_RESULT + 8,
            _ => REGION_LEN,
        };
        let bad = bytes.iter().skip(unchanged_from).position(|&b| b != GUARD);
        assert!(
            bad.is_none(),
            "region {i}: byte {:?} changed outside the permitted range",
            bad.map(|b| b + unchanged_from)
        );
    }
    // Deregistered, each memory comes back with no byte around it changed.
    for (i, &stag) in stags.iter().enumerate() {
        let Ok((_, Some(memory))) = table.deregister(stag) else { panic!("region {i} gone") };
        let Buffer::Guarded(g) = memory.into_buffer() else { panic!("not the guarded buffer") };
        assert!(g.guards_hold(OUTER), "bytes around the memory of region {i} changed");
    }
    Outcome { completions, state, stats, transmitted, memories }
}
