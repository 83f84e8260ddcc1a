//! A victim queue pair (after a real MPA handshake, Policy defaults) fed arbitrary bytes: no
//! panic, no byte changed outside the permitted ranges (guard bytes after every registered
//! window inside its memory, and around the memory itself; the read-only region's
//! non-receive part), every work request completes at most once, and exactly once after the
//! LLP is lost. Byte 0 selects CRC (bit 0; under
//! cfg(fuzzing) the deframer does not check it), markers (bit 1) and the chunk size (the rest).
//! Seeds: rdmap/tests/hostile.rs `fuzz_seeds`.
#![no_main]
use iwarp_ddp::dma::{Buffer, GuardedBuffer};
use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{RegionMemory, TableMemory};
use iwarp_mpa::{CrcPolicy, FrameRepr, Policy};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::{QpConfig, RecvWr, SendOp, SendWr};
use libfuzzer_sys::fuzz_target;

const LEN: u64 = 128;
const GUARD: u8 = 0xa5;
const OUTER: u8 = 0x5a;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, stream)) = data.split_first() else { return };
    let crc = if sel & 1 != 0 { CrcPolicy::Wanted } else { CrcPolicy::Off };
    let policy = Policy { crc, markers_wanted: sel & 2 != 0, ..Policy::default() };
    let req = policy.request(b"").unwrap().to_vec().unwrap();
    let (reply, _) = policy.respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    let params = policy.accept_reply(&reply).unwrap();
    let mut conn = Connection::new(&params, QpConfig::default());
    // Seed 0, as rdmap/tests/hostile.rs `fuzz_stags`: the seeds' STags name these regions.
    let (mut table, pd) = (TaggedBufferTable::with_seed(16, 0), ProtectionDomainId(1));
    let specs = [
        (Access::REMOTE_WRITE.union(Access::LOCAL_WRITE), Addressing::VirtualAddress),
        (Access::REMOTE_WRITE, Addressing::ZeroBased),
        (Access::REMOTE_READ.union(Access::LOCAL_WRITE), Addressing::VirtualAddress),
    ];
    let mut regions = Vec::new();
    for (i, &(access, addressing)) in specs.iter().enumerate() {
        let mem = RegionMemory::new(GuardedBuffer::new(32, &[GUARD; 192], 32, OUTER));
        let spec = RegionSpec { base_va: 0x10_0000 * (i as u64 + 1), len: LEN, access, addressing };
        regions.push(table.register(pd, spec, mem).unwrap());
    }
    let (recv_stag, recv_va) = (regions[2], 0x30_0000);
    for id in 0..2u64 {
        let sgl = Sge { lkey: recv_stag, addr: recv_va + 32 * id, len: 32 }.into();
        conn.qp().post_recv(RecvWr { wr_id: id, sgl }).unwrap();
    }
    let sgl = Sge { lkey: recv_stag, addr: recv_va + 64, len: 16 }.into();
    let op = SendOp::Send { solicited: false, invalidate: None };
    conn.qp().post_send(SendWr { wr_id: 2, op, sgl, signaled: true }).unwrap();
    let mut done = [0u32; 3];
    let mut mem = TableMemory { table: &mut table, pd };
    for chunk in stream.chunks(usize::from(sel >> 2) * 16 + 1) {
        conn.handle_bytes(&mut mem, chunk);
        conn.poll_transmit(&mut mem, &mut Vec::new(), 1 << 20);
        while let Some(c) = conn.qp().poll_completion() {
            done[usize::try_from(c.wr_id).unwrap()] += 1;
        }
        while conn.qp().poll_event().is_some() {}
    }
    assert!(done.iter().all(|&n| n <= 1), "a work request completed twice: {done:?}");
    conn.handle_llp_lost();
    while let Some(c) = conn.qp().poll_completion() {
        done[usize::try_from(c.wr_id).unwrap()] += 1;
    }
    assert_eq!(done, [1, 1, 1], "every work request completes exactly once");
    for (i, &stag) in regions.iter().enumerate() {
        let bytes = table.memory(stag).unwrap().to_vec();
        assert!(bytes[LEN as usize..].iter().all(|&b| b == GUARD), "guard bytes of region {i} changed");
    }
    let ro = table.memory(regions[2]).unwrap().to_vec();
    assert!(ro[64..].iter().all(|&b| b == GUARD), "region without remote write changed outside receives");
    for (i, &stag) in regions.iter().enumerate() {
        let Ok((_, Some(memory))) = table.deregister(stag) else { panic!("region {i} gone") };
        let Buffer::Guarded(g) = memory.into_buffer() else { panic!("not the guarded buffer") };
        assert!(g.guards_hold(OUTER), "bytes around the memory of region {i} changed");
    }
});
