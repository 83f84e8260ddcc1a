//! Two queue pairs over MPA, driven step by step in memory, with hooks that drop, corrupt,
//! truncate, duplicate or reorder the bytes in flight. Every operation at the interesting
//! sizes, with CRC and markers on and off; Terminates provoked by peer violations; and the
//! rule that every work request completes exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes and patterns are small")]

mod common;

use std::collections::HashMap;

use common::{Buf, Dir, End, MULPDU, Pair, Setup, deliver};

use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
use iwarp_ddp::{RegionMemory, STag, TableMemory, TerminateCode, TerminateLayer};
use iwarp_rdmap::Opcode;
use iwarp_rdmap::atomic::AtomicOp;
use iwarp_rdmap::conn::{Connection, DIRECT_MIN, LOOKAHEAD, TxBatch};
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::{
    Completion, PostError, QpEvent, QpState, RecvWr, SendOp, SendWr, SharedReceiveQueue, WcOpcode, WcStatus,
};

const TAGGED_ROOM: usize = MULPDU - 14;
const UNTAGGED_ROOM: usize = MULPDU - 18;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn sizes() -> Vec<usize> {
    vec![
        0,
        1,
        TAGGED_ROOM - 1,
        TAGGED_ROOM,
        TAGGED_ROOM + 1,
        UNTAGGED_ROOM + 1,
        MULPDU - 1,
        MULPDU,
        MULPDU + 1,
        3 * MULPDU + 7,
        1 << 20,
    ]
}

fn modes() -> Vec<(bool, bool)> {
    vec![(false, false), (true, false), (false, true), (true, true)]
}

fn ok(c: &Completion, wr_id: u64, opcode: WcOpcode) {
    assert_eq!((c.wr_id, c.status, c.opcode), (wr_id, WcStatus::Success, opcode), "{c:?}");
}

#[test]
fn write_every_size_and_mode() {
    for (crc, markers) in modes() {
        for len in sizes() {
            let mut p = Pair::new(crc, markers);
            let src = p.a.buf(len.max(1), Access::NONE, 0);
            p.a.write(&src, 0, &pattern(len, 3)).unwrap();
            let dst = p.b.buf(len + 16, Access::REMOTE_WRITE, 0xee);
            p.a.post_send(SendWr {
                wr_id: 7,
                op: SendOp::Write { remote_stag: dst.stag, remote_to: dst.va + 8 },
                sgl: src.sge_at(0, len as u32).into(),
                signaled: true,
            });
            p.run();
            let got = p.b.bytes(&dst);
            assert_eq!(&got[8..8 + len], &pattern(len, 3)[..], "crc {crc} markers {markers} len {len}");
            assert!(got[..8].iter().chain(&got[8 + len..]).all(|&b| b == 0xee), "guard bytes");
            assert_eq!(p.a.completions.len(), 1);
            ok(&p.a.completions[0], 7, WcOpcode::Write);
            assert_eq!(p.a.completions[0].byte_len, len as u64);
            assert!(p.b.completions.is_empty(), "a Write consumes nothing on the target");
            assert_eq!(p.a.conn.qp_ref().state(), QpState::Rts);
        }
    }
}

#[test]
fn read_every_size_and_mode() {
    for (crc, markers) in modes() {
        for len in sizes() {
            let mut p = Pair::new(crc, markers);
            let src = p.b.buf(len.max(1), Access::REMOTE_READ, 0);
            p.b.write(&src, 0, &pattern(len, 9)).unwrap();
            let sink = p.a.buf(len.max(1), Access::LOCAL_WRITE, 0x55);
            p.a.post_send(SendWr {
                wr_id: 11,
                op: SendOp::Read { remote_stag: src.stag, remote_to: src.va },
                sgl: sink.sge_at(0, len as u32).into(),
                signaled: true,
            });
            p.run();
            assert_eq!(
                &p.a.bytes(&sink)[..len],
                &pattern(len, 9)[..],
                "crc {crc} markers {markers} len {len}"
            );
            assert_eq!(p.a.completions.len(), 1, "{:?}", p.a.completions);
            ok(&p.a.completions[0], 11, WcOpcode::Read);
            assert!(p.b.completions.is_empty());
        }
    }
}

#[test]
fn send_every_size_and_mode() {
    for (crc, markers) in modes() {
        for len in sizes() {
            let mut p = Pair::new(crc, markers);
            let src = p.a.buf(len.max(1), Access::NONE, 0);
            p.a.write(&src, 0, &pattern(len, 1)).unwrap();
            let dst = p.b.buf(len + 5, Access::LOCAL_WRITE, 0xaa);
            p.b.post_recv(21, vec![dst.sge()]);
            p.a.post_send(SendWr {
                wr_id: 20,
                op: SendOp::Send { solicited: len % 2 == 1, invalidate: None },
                sgl: src.sge_at(0, len as u32).into(),
                signaled: true,
            });
            p.run();
            assert_eq!(
                &p.b.bytes(&dst)[..len],
                &pattern(len, 1)[..],
                "crc {crc} markers {markers} len {len}"
            );
            assert!(p.b.bytes(&dst)[len..].iter().all(|&b| b == 0xaa));
            ok(&p.a.completions[0], 20, WcOpcode::Send);
            assert_eq!(p.b.completions.len(), 1);
            let c = p.b.completions[0];
            ok(&c, 21, WcOpcode::Recv);
            assert_eq!(c.byte_len, len as u64);
            assert_eq!(c.solicited, len % 2 == 1);
        }
    }
}

#[test]
fn scatter_gather_lists() {
    let mut p = Pair::new(true, false);
    let src = p.a.buf(10_000, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(10_000, 4)).unwrap();
    let dst = p.b.buf(10_000, Access::LOCAL_WRITE, 0);
    // Gather 3 pieces (7000 bytes) and scatter them over 2 pieces.
    let sgl = vec![src.sge_at(0, 100), src.sge_at(5000, 4900), src.sge_at(200, 2000)].into();
    p.b.post_recv(1, vec![dst.sge_at(9000, 1000), dst.sge_at(0, 6000)]);
    p.a.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl,
        signaled: true,
    });
    p.run();
    let msg: Vec<u8> =
        [&pattern(10_000, 4)[..100], &pattern(10_000, 4)[5000..9900], &pattern(10_000, 4)[200..2200]]
            .concat();
    let got = p.b.bytes(&dst);
    assert_eq!(&got[9000..10_000], &msg[..1000]);
    assert_eq!(&got[..6000], &msg[1000..]);
    assert_eq!(p.b.completions[0].byte_len, 7000);
}

#[test]
fn interleaved_operations_complete_in_posting_order() {
    let mut p = Pair::new(false, false);
    let a_src = p.a.buf(1 << 20, Access::NONE, 0);
    p.a.write(&a_src, 0, &pattern(1 << 20, 2)).unwrap();
    let a_sink = p.a.buf(1 << 20, Access::LOCAL_WRITE, 0);
    let b_win = p.b.buf(1 << 20, Access::REMOTE_WRITE.union(Access::REMOTE_READ), 0);
    p.b.write(&b_win, 0, &pattern(1 << 20, 8)).unwrap();
    let b_recv = p.b.buf(1 << 20, Access::LOCAL_WRITE, 0);
    let b_src = p.b.buf(4096, Access::NONE, 0);
    let a_recv = p.a.buf(4096, Access::LOCAL_WRITE, 0);
    for i in 0..8 {
        p.b.post_recv(100 + i, vec![b_recv.sge_at(i * 100_000, 100_000)]);
    }
    for i in 0..4 {
        p.a.post_recv(200 + i, vec![a_recv.sge_at(i * 1024, 1024)]);
    }
    // A: Read (large), Send, Write, Read, Send...; B: Sends of its own meanwhile.
    for i in 0..8u64 {
        let op = match i % 3 {
            0 => SendOp::Read { remote_stag: b_win.stag, remote_to: b_win.va + i * 1000 },
            1 => SendOp::Send { solicited: false, invalidate: None },
            _ => SendOp::Write { remote_stag: b_win.stag, remote_to: b_win.va + 900_000 + i },
        };
        let sgl = match i % 3 {
            0 => vec![a_sink.sge_at(i * 100_000, 90_000)],
            _ => vec![a_src.sge_at(i * 1000, 50_000)],
        };
        p.a.post_send(SendWr { wr_id: i, op, sgl: sgl.into(), signaled: true });
    }
    for i in 0..4u64 {
        p.b.post_send(SendWr {
            wr_id: 50 + i,
            op: SendOp::Send { solicited: true, invalidate: None },
            sgl: b_src.sge_at(i * 1000, 1000).into(),
            signaled: i % 2 == 0,
        });
    }
    p.run();
    let ids: Vec<u64> =
        p.a.completions.iter().filter(|c| c.opcode != WcOpcode::Recv).map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>(), "send-queue completions in posting order");
    assert!(p.a.completions.iter().all(|c| c.status == WcStatus::Success));
    // B's unsignaled Sends produce no completion; the signaled ones do.
    let b_sends: Vec<u64> =
        p.b.completions.iter().filter(|c| c.opcode == WcOpcode::Send).map(|c| c.wr_id).collect();
    assert_eq!(b_sends, vec![50, 52]);
    assert_eq!(p.a.completions.iter().filter(|c| c.opcode == WcOpcode::Recv).count(), 4);
    // A's three Sends (i = 1, 4, 7) each consumed one of B's receive buffers.
    assert_eq!(p.b.completions.iter().filter(|c| c.opcode == WcOpcode::Recv).count(), 3);
    // The Reads brought B's bytes.
    let sink = p.a.bytes(&a_sink);
    for i in [0u64, 3, 6] {
        let at = (i * 100_000) as usize;
        let from = (i * 1000) as usize;
        assert_eq!(&sink[at..at + 90_000], &pattern(1 << 20, 8)[from..from + 90_000]);
    }
}

#[test]
fn ord_limits_outstanding_reads() {
    let mut p = Pair::with_ird_ord(false, false, 1);
    let src = p.b.buf(64 * 1024, Access::REMOTE_READ, 0);
    p.b.write(&src, 0, &pattern(64 * 1024, 5)).unwrap();
    let sink = p.a.buf(64 * 1024, Access::LOCAL_WRITE, 0);
    for i in 0..4u64 {
        p.a.post_send(SendWr {
            wr_id: i,
            op: SendOp::Read { remote_stag: src.stag, remote_to: src.va + i * 16384 },
            sgl: sink.sge_at(i * 16384, 16384).into(),
            signaled: true,
        });
    }
    // With ORD 1 only one Read Request is in flight at a time: B never sees more than its IRD.
    p.run();
    assert_eq!(p.a.completions.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(p.a.bytes(&sink), pattern(64 * 1024, 5));
    assert_eq!(p.b.conn.qp_ref().state(), QpState::Rts);
}

// --- Terminates -------------------------------------------------------------------------

/// Runs one violating request from A and checks B's Terminate, A's view of it, and that both
/// sides flushed every outstanding work request exactly once.
fn provoke(
    setup: impl FnOnce(&mut Pair) -> SendWr,
    expect: TerminateCode,
    expect_flags: (bool, bool, bool),
) -> Pair {
    let mut p = Pair::new(true, false);
    // Outstanding work on both sides that must be flushed.
    let a_recv = p.a.buf(4096, Access::LOCAL_WRITE, 0);
    let b_recv = p.b.buf(4096, Access::LOCAL_WRITE, 0);
    p.a.post_recv(900, vec![a_recv.sge()]);
    p.b.post_recv(901, vec![b_recv.sge()]);
    let wr = setup(&mut p);
    p.a.post_send(wr);
    p.run();
    // B terminated with the expected code...
    assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(expect)), "{:?}", p.b.events);
    // ...and A received it, read the RFC way.
    let Some(QpEvent::RemoteTerminate { header, .. }) = p.a.events.first().copied() else {
        panic!("A saw no Terminate: {:?}", p.a.events)
    };
    assert_eq!(header.cause, expect);
    assert_eq!((header.m, header.d, header.r), expect_flags);
    assert_eq!(p.a.conn.qp_ref().state(), QpState::Error);
    assert_eq!(p.b.conn.qp_ref().state(), QpState::Error);
    // Every work request completed exactly once.
    for side in [&p.a, &p.b] {
        let mut seen = HashMap::new();
        for c in &side.completions {
            *seen.entry(c.wr_id).or_insert(0) += 1;
        }
        assert!(seen.values().all(|&n| n == 1), "{:?}", side.completions);
    }
    assert!(p.a.completions.iter().any(|c| c.wr_id == 900 && c.status == WcStatus::WrFlushError));
    // B's receive is flushed, or, when the violating message was meant for it, fails as too
    // short for it.
    assert!(
        p.b.completions.iter().any(
            |c| c.wr_id == 901 && matches!(c.status, WcStatus::WrFlushError | WcStatus::LocalLengthError)
        )
    );
    // Work posted afterwards is flushed at once.
    p.a.post_recv(902, vec![a_recv.sge()]);
    p.a.collect();
    assert_eq!(p.a.completions.last().map(|c| (c.wr_id, c.status)), Some((902, WcStatus::WrFlushError)));
    p
}

fn write_to(stag: STag, to: u64, src: &Buf, len: u32) -> SendWr {
    SendWr {
        wr_id: 1,
        op: SendOp::Write { remote_stag: stag, remote_to: to },
        sgl: src.sge_at(0, len).into(),
        signaled: true,
    }
}

#[test]
fn terminate_invalid_stag() {
    provoke(
        |p| {
            let src = p.a.buf(64, Access::NONE, 1);
            write_to(STag(0x0000_4242), 0, &src, 64)
        },
        TerminateCode::ddp(1, 0x00),
        (true, true, false),
    );
}

#[test]
fn terminate_base_or_bounds() {
    provoke(
        |p| {
            let src = p.a.buf(64, Access::NONE, 1);
            let dst = p.b.buf(32, Access::REMOTE_WRITE, 0);
            write_to(dst.stag, dst.va + 1, &src, 32)
        },
        TerminateCode::ddp(1, 0x01),
        (true, true, false),
    );
}

#[test]
fn terminate_access_rights() {
    let p = provoke(
        |p| {
            let src = p.a.buf(64, Access::NONE, 1);
            let dst = p.b.buf(64, Access::REMOTE_READ, 0x33);
            write_to(dst.stag, dst.va, &src, 64)
        },
        TerminateCode::rdmap(1, 0x02),
        (true, true, false),
    );
    // Nothing was written.
    assert!(p.b.table.len() >= 2);
}

#[test]
fn terminate_stag_of_another_protection_domain() {
    provoke(
        |p| {
            let src = p.a.buf(64, Access::NONE, 1);
            // Registered in B's table but in another PD than B's queue pair.
            let mem = RegionMemory::zeroed(64);
            let spec = RegionSpec {
                base_va: 0x1000,
                len: 64,
                access: Access::REMOTE_WRITE,
                addressing: Addressing::VirtualAddress,
            };
            let stag = p.b.table.register(ProtectionDomainId(99), spec, mem).unwrap();
            write_to(stag, 0x1000, &src, 64)
        },
        TerminateCode::ddp(1, 0x02),
        (true, true, false),
    );
}

#[test]
fn terminate_read_request_on_bad_source_copies_the_request() {
    provoke(
        |p| {
            let sink = p.a.buf(64, Access::LOCAL_WRITE, 0);
            let src = p.b.buf(64, Access::REMOTE_WRITE, 0); // no remote read
            SendWr {
                wr_id: 1,
                op: SendOp::Read { remote_stag: src.stag, remote_to: src.va },
                sgl: sink.sge().into(),
                signaled: true,
            }
        },
        TerminateCode::rdmap(1, 0x02),
        (true, true, true),
    );
}

#[test]
fn terminate_send_without_posted_receive() {
    let mut p = Pair::new(false, false);
    let src = p.a.buf(64, Access::NONE, 1);
    p.a.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: src.sge().into(),
        signaled: true,
    });
    p.run();
    let Some(QpEvent::LocalTerminate(code)) = p.b.events.first().copied() else { panic!("{:?}", p.b.events) };
    assert_eq!((code.layer, code.error_type), (TerminateLayer::Ddp, 2));
    assert!(matches!(code.code, 0x02 | 0x03), "{code}");
}

#[test]
fn terminate_send_too_long() {
    let p = provoke(
        |p| {
            // B's posted buffer (4096 bytes) is smaller than the message.
            let src = p.a.buf(5000, Access::NONE, 1);
            SendWr {
                wr_id: 1,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: src.sge().into(),
                signaled: true,
            }
        },
        TerminateCode::ddp(2, 0x05),
        (true, true, false),
    );
    assert_eq!(
        p.b.completions.iter().find(|c| c.wr_id == 901).map(|c| c.status),
        Some(WcStatus::LocalLengthError),
        "the receive the message was meant for is too short"
    );
}

#[test]
fn send_with_invalidate_revokes_the_stag() {
    let mut p = Pair::new(false, false);
    let target = p.b.buf(64, Access::REMOTE_WRITE, 0);
    let recv = p.b.buf(64, Access::LOCAL_WRITE, 0);
    let src = p.a.buf(64, Access::NONE, 7);
    p.b.post_recv(5, vec![recv.sge()]);
    p.a.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send { solicited: true, invalidate: Some(target.stag) },
        sgl: src.sge_at(0, 8).into(),
        signaled: true,
    });
    p.run();
    assert_eq!(p.b.completions[0].invalidated, Some(target.stag));
    assert!(p.b.completions[0].solicited);
    // A later Write through the invalidated STag is a protection error and writes nothing.
    p.a.post_send(write_to(target.stag, target.va, &src, 64));
    p.run();
    assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(TerminateCode::ddp(1, 0x00))));
    assert!(p.b.bytes(&target).iter().all(|&b| b == 0));
}

/// B's window of `len` bytes at `off` of `region`, remote write, bound at once.
fn bind(side: &mut End, region: &Buf, off: u64, len: u64) -> STag {
    let spec = RegionSpec {
        base_va: region.va + off,
        len,
        access: Access::REMOTE_WRITE,
        addressing: Addressing::VirtualAddress,
    };
    side.table.bind_window(region.stag, side.pd, spec).unwrap()
}

fn send_invalidate(wr_id: u64, stag: STag, src: &Buf) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send { solicited: false, invalidate: Some(stag) },
        sgl: src.sge_at(0, 8).into(),
        signaled: true,
    }
}

#[test]
fn send_with_invalidate_of_a_window_then_of_its_region() {
    // What a peer may invalidate: a memory window (type 2) of the queue pair's protection
    // domain, which unbinds it; then the region, once no window is bound to it.
    let mut p = Pair::new(false, false);
    let region = p.b.buf(256, Access::REMOTE_WRITE.union(Access::REMOTE_READ), 0);
    let recv = p.b.buf(64, Access::LOCAL_WRITE, 0);
    let window = bind(&mut p.b, &region, 64, 64);
    let src = p.a.buf(64, Access::NONE, 7);
    p.b.post_recv(5, vec![recv.sge()]);
    p.b.post_recv(6, vec![recv.sge()]);
    p.a.post_send(send_invalidate(1, window, &src));
    p.run();
    assert_eq!(p.b.completions[0].invalidated, Some(window));
    assert!(!p.b.table.get(window).unwrap().valid);
    assert!(p.b.table.get(region.stag).unwrap().valid, "only the window");
    p.a.post_send(send_invalidate(2, region.stag, &src));
    p.run();
    assert!(p.b.events.is_empty(), "{:?}", p.b.events);
    assert_eq!(p.b.completions[1].invalidated, Some(region.stag));
    assert!(!p.b.table.get(region.stag).unwrap().valid);
    // The region can be made valid again with a new key (the application's re-validation).
    let again = p.b.table.rekey(region.stag, region.stag.key().wrapping_add(1)).unwrap();
    assert!(p.b.table.get(again).unwrap().valid);
}

#[test]
fn send_with_invalidate_of_a_region_with_a_window_bound_is_refused() {
    let mut stags = None;
    let p = provoke(
        |p| {
            let region = p.b.buf(256, Access::REMOTE_WRITE, 0);
            stags = Some((region.stag, bind(&mut p.b, &region, 0, 64)));
            let src = p.a.buf(64, Access::NONE, 7);
            send_invalidate(1, region.stag, &src)
        },
        TerminateCode::rdmap(2, 0x09),
        (true, true, false),
    );
    // Nothing was invalidated.
    let (region, window) = stags.unwrap();
    assert!(p.b.table.get(region).unwrap().valid, "the region was invalidated");
    assert!(p.b.table.get(window).unwrap().valid, "the window was invalidated");
}

#[test]
fn send_with_invalidate_of_a_local_only_region_is_refused() {
    // B's receive buffer's region (local write only) is not the peer's to invalidate.
    for access in [Access::LOCAL_WRITE, Access::NONE] {
        let mut target = None;
        let p = provoke(
            |p| {
                let local = p.b.buf(64, access, 0);
                target = Some(local.stag);
                let src = p.a.buf(64, Access::NONE, 7);
                send_invalidate(1, local.stag, &src)
            },
            TerminateCode::rdmap(1, 0x09),
            (true, true, false),
        );
        let target = target.unwrap();
        assert!(p.b.table.get(target).unwrap().valid, "{access}: invalidated");
    }
}

/// A pair where A's Read (work request 3) of `len` bytes from a region of B's holding
/// `pattern(len, 9)` has reached B, which owes the response. Returns B's source and A's sink.
fn read_owed(len: usize) -> (Pair, Buf, Buf) {
    let mut p = Pair::new(false, false);
    let src = p.b.buf(len, Access::REMOTE_READ, 0);
    p.b.write(&src, 0, &pattern(len, 9)).unwrap();
    let sink = p.a.buf(len, Access::LOCAL_WRITE, 0);
    p.a.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Read { remote_stag: src.stag, remote_to: src.va },
        sgl: sink.sge().into(),
        signaled: true,
    });
    let request = p.a.transmit();
    p.b.feed(&request);
    (p, src, sink)
}

#[test]
fn read_response_whose_source_is_invalidated_mid_flight_is_terminated() {
    // A Read Response of several segments: after its first segment went out, B's application
    // invalidates (then, in a second run, deregisters) the source region. The next segment
    // cannot be read: B terminates with the RDMAP code its source now fails with (invalid
    // STag, 0/1/0x00), sends nothing more from the region, and A's Read fails.
    for deregister in [false, true] {
        let len = 3 * MULPDU + 7;
        let (mut p, src, sink) = read_owed(len);
        // B sends the first segment of the response only.
        let mut first = Vec::new();
        let n = p.b.conn.poll_transmit(&mut TableMemory { table: &mut p.b.table, pd: p.b.pd }, &mut first, 1);
        assert!(n > MULPDU / 2 && n <= p.b.conn.max_fpdu_len(), "one FPDU: {n}");
        p.a.conn.handle_bytes(&mut TableMemory { table: &mut p.a.table, pd: p.a.pd }, &first);
        if deregister {
            p.b.table.deregister(src.stag).unwrap();
        } else {
            p.b.table.invalidate(src.stag).unwrap();
        }
        p.run();
        let code = TerminateCode::rdmap(1, 0x00);
        assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(code)), "{:?}", p.b.events);
        let Some(QpEvent::RemoteTerminate { header, .. }) = p.a.events.first().copied() else {
            panic!("A saw no Terminate: {:?}", p.a.events)
        };
        assert_eq!(header.cause, code);
        assert_eq!(p.a.completions.len(), 1, "{:?}", p.a.completions);
        assert_eq!(p.a.completions[0].wr_id, 3);
        assert_ne!(p.a.completions[0].status, WcStatus::Success);
        // Only the first segment's bytes reached the sink.
        let got = p.a.bytes(&sink);
        let first_len = TAGGED_ROOM;
        assert_eq!(&got[..first_len], &pattern(len, 9)[..first_len]);
        assert!(got[first_len..].iter().all(|&b| b == 0), "bytes after the first segment arrived");
    }
}

#[test]
fn the_terminate_for_a_read_source_gone_goes_out_in_the_same_call() {
    // As above, looking at one call. The engine frames what a queue pair has once per visit and
    // visits again only when something prompts it, so the call that finds the response's
    // source gone must carry the Terminate. Left for a later call, it waited until A's next
    // bytes or a timer, while A, with nothing more to send, waited for its Read. B's source
    // goes by a local invalidate work request (run on B's send queue's turn, between two
    // turns of the response), by an invalidation or by deregistration, and B frames into a
    // byte buffer or into a batch (the engine's way).
    let code = TerminateCode::rdmap(1, 0x00);
    for how in ["work request", "invalidate", "deregister"] {
        for batched in [false, true] {
            let what = format!("{how}, batched {batched}");
            let (mut p, src, _) = read_owed(3 * MULPDU + 7);
            // The response's first segment only.
            let mut first = Vec::new();
            p.b.conn.poll_transmit(&mut TableMemory { table: &mut p.b.table, pd: p.b.pd }, &mut first, 1);
            assert!(!first.is_empty(), "{what}: no first segment");
            match how {
                "work request" => p.b.post_send(SendWr {
                    wr_id: 9,
                    op: SendOp::LocalInvalidate { stag: src.stag },
                    sgl: Default::default(),
                    signaled: true,
                }),
                "invalidate" => p.b.table.invalidate(src.stag).unwrap(),
                _ => drop(p.b.table.deregister(src.stag).unwrap()),
            }
            let mut out = Vec::new();
            let mut mem = TableMemory { table: &mut p.b.table, pd: p.b.pd };
            if batched {
                let mut batch = TxBatch::default();
                let n = p.b.conn.poll_transmit_batch(&mut mem, &mut batch, 64 * 1024);
                let mut iov = Vec::new();
                batch.io_slices(&mem, &mut iov).unwrap();
                iov.iter().for_each(|b| out.extend_from_slice(b));
                assert_eq!(out.len(), n, "{what}");
            } else {
                p.b.conn.poll_transmit(&mut mem, &mut out, 1 << 20);
            }
            p.b.collect();
            let ulpdus = common::deframe_all(&out, false, false);
            assert_eq!(ulpdus.len(), 1, "{what}: {} segments, not the Terminate alone", ulpdus.len());
            let sent = common::parse_terminate(&ulpdus[0]);
            assert_eq!(sent.msg.header.cause, code, "{what}");
            assert_eq!(p.b.state(), QpState::Error, "{what}");
            assert!(!p.b.conn.qp_ref().may_transmit(), "{what}: more to send");
            if how == "work request" {
                let done: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.status)).collect();
                assert_eq!(done, [(9, WcStatus::Success)], "{what}");
            }
            // A's Read fails on the Terminate.
            p.a.feed(&first);
            p.a.feed(&out);
            assert_eq!(p.a.completions.len(), 1, "{what}: {:?}", p.a.completions);
            assert_eq!((p.a.completions[0].wr_id, p.a.completions[0].status), (3, WcStatus::WrFlushError));
        }
    }
}

// --- faults in the byte stream ------------------------------------------------------------

#[test]
fn corrupted_byte_with_crc_terminates_with_llp_crc_error() {
    let mut p = Pair::new(true, false);
    let src = p.a.buf(4000, Access::NONE, 1);
    let dst = p.b.buf(4000, Access::REMOTE_WRITE, 0);
    let mut done = false;
    p.hook = Some(Box::new(move |dir, bytes: &mut Vec<u8>| {
        if dir == Dir::AtoB && !done && bytes.len() > 100 {
            bytes[100] ^= 0x20;
            done = true;
        }
    }));
    p.a.post_send(write_to(dst.stag, dst.va, &src, 4000));
    p.run();
    assert_eq!(
        p.b.events.first(),
        Some(&QpEvent::LocalTerminate(TerminateCode {
            layer: TerminateLayer::Llp,
            error_type: 0,
            code: 0x02
        }))
    );
    let Some(QpEvent::RemoteTerminate { header, .. }) = p.a.events.first().copied() else { panic!() };
    assert_eq!((header.m, header.d), (false, false), "an LLP error copies no header");
}

#[test]
fn duplicated_bytes_are_detected() {
    let mut p = Pair::new(true, true);
    let src = p.a.buf(10_000, Access::NONE, 1);
    let dst = p.b.buf(10_000, Access::REMOTE_WRITE, 0);
    let mut done = false;
    p.hook = Some(Box::new(move |dir, bytes: &mut Vec<u8>| {
        if dir == Dir::AtoB && !done && bytes.len() > 3000 {
            let dup = bytes[1000..1500].to_vec();
            bytes.splice(1500..1500, dup);
            done = true;
        }
    }));
    p.a.post_send(write_to(dst.stag, dst.va, &src, 10_000));
    p.run();
    assert!(matches!(p.b.events.first(), Some(QpEvent::LocalTerminate(_))), "{:?}", p.b.events);
    assert_eq!(p.a.completions.len(), 1, "the Write completed or flushed exactly once");
}

#[test]
fn reordered_and_truncated_streams_never_panic_and_complete_once() {
    for seed in 0..80u64 {
        // Half the runs with loopback-sized FPDUs read through `Connection::receive`, whose
        // payloads go straight into place.
        let mut p = if seed < 40 {
            Pair::new(seed % 2 == 0, seed % 3 == 0)
        } else {
            large_pair(seed % 2 == 0, seed % 3 == 0, 1 + (seed as usize * 7919) % 40_000, seed)
        };
        let src = p.a.buf(50_000, Access::NONE, 1);
        let dst = p.b.buf(50_000, Access::REMOTE_WRITE.union(Access::REMOTE_READ), 0);
        let sink = p.a.buf(50_000, Access::LOCAL_WRITE, 0);
        let recv = p.b.buf(50_000, Access::LOCAL_WRITE, 0);
        p.b.post_recv(10, vec![recv.sge()]);
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let fault = seed % 4;
        p.hook = Some(Box::new(move |_, bytes: &mut Vec<u8>| {
            if bytes.len() < 64 || next() % 3 != 0 {
                return;
            }
            let i = (next() as usize) % (bytes.len() - 32);
            match fault {
                0 => bytes.truncate(i),
                1 => bytes[i..i + 32].reverse(),
                2 => {
                    bytes.drain(i..i + 16);
                }
                _ => bytes[i] ^= 0xff,
            }
        }));
        p.a.post_send(write_to(dst.stag, dst.va, &src, 50_000));
        p.a.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Read { remote_stag: dst.stag, remote_to: dst.va },
            sgl: sink.sge().into(),
            signaled: true,
        });
        p.a.post_send(SendWr {
            wr_id: 3,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.sge_at(0, 30_000).into(),
            signaled: true,
        });
        p.run();
        // A stream that stalls (bytes lost) is cut by the lower layer, as TCP's timeout would.
        p.a.conn.handle_llp_lost();
        p.b.conn.handle_llp_lost();
        p.a.collect();
        p.b.collect();
        let mut ids: Vec<u64> = p.a.completions.iter().map(|c| c.wr_id).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 3], "seed {seed}: {:?}", p.a.completions);
        assert_eq!(p.b.completions.iter().filter(|c| c.wr_id == 10).count(), 1, "seed {seed}");
    }
}

// --- RFC 7306 --------------------------------------------------------------------------

#[test]
fn extensions_are_an_api_error_unless_negotiated() {
    let mut p = Pair::new(false, false);
    let sink = p.a.buf(8, Access::LOCAL_WRITE, 0);
    let ops = [
        (SendOp::ImmediateData { data: [1; 8], solicited: false }, vec![]),
        (
            SendOp::WriteImmediate { remote_stag: STag(0x100), remote_to: 0, data: [1; 8], solicited: false },
            vec![],
        ),
        (
            SendOp::Atomic {
                remote_stag: STag(0x100),
                remote_to: 0,
                op: AtomicOp::FetchAdd,
                data: 1,
                data_mask: 0,
                compare: 0,
                compare_mask: 0,
            },
            vec![sink.sge()],
        ),
    ];
    for (op, sgl) in ops {
        let e =
            p.a.conn.qp().post_send(SendWr { wr_id: 1, op, sgl: sgl.into(), signaled: true }).unwrap_err();
        assert_eq!(e, PostError::ExtensionNotNegotiated);
    }
    p.run();
    assert_eq!(p.moved, 0, "nothing went on the wire");
    assert!(p.a.completions.is_empty());
}

#[test]
fn send_with_immediate() {
    let mut p = Pair::rfc7306();
    let src = p.a.buf(100, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(100, 2)).unwrap();
    let recv = p.b.buf(200, Access::LOCAL_WRITE, 0);
    p.b.post_recv(1, vec![recv.sge_at(0, 100)]);
    p.b.post_recv(2, vec![recv.sge_at(100, 100)]);
    p.a.post_send(SendWr {
        wr_id: 5,
        op: SendOp::SendImmediate { data: *b"12345678", solicited: true },
        sgl: src.sge().into(),
        signaled: true,
    });
    p.run();
    assert_eq!(
        p.a.completions.iter().map(|c| (c.wr_id, c.opcode)).collect::<Vec<_>>(),
        vec![(5, WcOpcode::Send)]
    );
    let b: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm_data)).collect();
    assert_eq!(b, vec![(1, WcOpcode::Recv, 100, None), (2, WcOpcode::RecvImmediate, 0, Some(*b"12345678"))]);
    assert_eq!(&p.b.bytes(&recv)[..100], &pattern(100, 2)[..]);
}

#[test]
fn immediate_data_and_write_with_immediate() {
    let mut p = Pair::rfc7306();
    let src = p.a.buf(5000, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(5000, 6)).unwrap();
    let dst = p.b.buf(5000, Access::REMOTE_WRITE, 0);
    let recv = p.b.buf(64, Access::LOCAL_WRITE, 0x77);
    p.b.post_recv(1, vec![recv.sge()]);
    p.b.post_recv(2, vec![recv.sge()]);
    p.a.post_send(SendWr {
        wr_id: 10,
        op: SendOp::ImmediateData { data: *b"imm-data", solicited: true },
        sgl: vec![].into(),
        signaled: true,
    });
    p.a.post_send(SendWr {
        wr_id: 11,
        op: SendOp::WriteImmediate {
            remote_stag: dst.stag,
            remote_to: dst.va,
            data: 7u64.to_be_bytes(),
            solicited: false,
        },
        sgl: src.sge().into(),
        signaled: true,
    });
    p.run();
    assert_eq!(
        p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    assert_eq!(p.a.completions[1].opcode, WcOpcode::Write);
    let b: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.opcode, c.imm_data, c.solicited)).collect();
    assert_eq!(
        b,
        vec![
            (1, WcOpcode::RecvImmediate, Some(*b"imm-data"), true),
            (2, WcOpcode::RecvImmediate, Some(7u64.to_be_bytes()), false),
        ]
    );
    // The Write landed before its Immediate Data completed; the receive buffer is untouched.
    assert_eq!(p.b.bytes(&dst), pattern(5000, 6));
    assert!(p.b.bytes(&recv).iter().all(|&x| x == 0x77));
}

#[expect(clippy::too_many_arguments, reason = "mirrors the Atomic Request's fields")]
fn atomic(
    remote: &Buf,
    off: u64,
    op: AtomicOp,
    data: u64,
    mask: u64,
    cmp: u64,
    cmp_mask: u64,
    sink: Sge,
) -> SendWr {
    SendWr {
        wr_id: off,
        op: SendOp::Atomic {
            remote_stag: remote.stag,
            remote_to: remote.va + off,
            op,
            data,
            data_mask: mask,
            compare: cmp,
            compare_mask: cmp_mask,
        },
        sgl: sink.into(),
        signaled: true,
    }
}

fn word(side: &End, buf: &Buf, off: usize) -> u64 {
    let b = side.bytes(buf);
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}

#[test]
fn atomics_fetch_add_swap_compare_swap() {
    let mut p = Pair::rfc7306();
    let target = p.b.buf(64, Access::REMOTE_ATOMIC, 0);
    for (i, v) in [100u64, 0xffff_0000_0000_ffff, 42, 42].iter().enumerate() {
        p.b.write(&target, i * 8, &v.to_ne_bytes()).unwrap();
    }
    let sink = p.a.buf(64, Access::LOCAL_WRITE, 0);
    p.a.post_send(atomic(&target, 0, AtomicOp::FetchAdd, 5, 0, 0, 0, sink.sge_at(0, 8)));
    p.a.post_send(atomic(&target, 8, AtomicOp::Swap, 0x1234, 0xffff, 0, 0, sink.sge_at(8, 8)));
    // Equal under the mask: swapped. Not equal: left alone. Both return the original.
    p.a.post_send(atomic(&target, 16, AtomicOp::CompareSwap, 7, u64::MAX, 42, u64::MAX, sink.sge_at(16, 8)));
    p.a.post_send(atomic(&target, 24, AtomicOp::CompareSwap, 7, u64::MAX, 41, u64::MAX, sink.sge_at(24, 8)));
    p.run();
    let ids: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
    assert_eq!(ids, [0, 8, 16, 24].map(|i| (i, WcOpcode::Atomic, WcStatus::Success)).to_vec());
    assert_eq!([0, 8, 16, 24].map(|off| word(&p.b, &target, off)), [105, 0xffff_0000_0000_1234, 7, 42]);
    assert_eq!([0, 8, 16, 24].map(|off| word(&p.a, &sink, off)), [100, 0xffff_0000_0000_ffff, 42, 42]);
    assert_eq!(p.b.conn.qp_ref().state(), QpState::Rts);
}

#[test]
fn atomic_without_rights_or_unaligned_is_terminated() {
    for (access, off) in [(Access::REMOTE_WRITE, 0u64), (Access::REMOTE_ATOMIC, 4)] {
        let mut p = Pair::rfc7306();
        let target = p.b.buf(64, access, 0x11);
        let sink = p.a.buf(8, Access::LOCAL_WRITE, 0);
        p.a.post_send(atomic(&target, off, AtomicOp::FetchAdd, 1, 0, 0, 0, sink.sge()));
        p.run();
        let Some(QpEvent::LocalTerminate(code)) = p.b.events.first().copied() else {
            panic!("{:?}", p.b.events)
        };
        assert_eq!((code.layer, code.error_type), (TerminateLayer::Rdmap, 1), "{code}");
        assert!(p.b.bytes(&target).iter().all(|&x| x == 0x11), "nothing changed");
        assert_eq!(p.a.completions.len(), 1);
        assert_eq!(p.a.completions[0].status, WcStatus::WrFlushError);
    }
}

// --- shared receive queue -----------------------------------------------------------------

#[test]
fn shared_receive_queue_feeds_the_queue_pair() {
    let srq = SharedReceiveQueue::new(16);
    let mut p = Pair::from_conns(Setup { srq: Some(srq.clone()), ..Setup::new(false, false) }.connect());
    let src = p.a.buf(3000, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(3000, 5)).unwrap();
    let recv = p.b.buf(3 * 3000, Access::LOCAL_WRITE, 0);
    for i in 0..3u64 {
        srq.post_recv(RecvWr { wr_id: 40 + i, sgl: recv.sge_at(i * 3000, 3000).into() }).unwrap();
    }
    assert_eq!(p.b.conn.qp().post_recv(RecvWr { wr_id: 1, sgl: vec![].into() }), Err(PostError::UsesSrq));
    for i in 0..2u64 {
        p.a.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.sge_at(0, 3000 - i as u32).into(),
            signaled: true,
        });
    }
    p.run();
    let got: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(got, vec![(40, 3000), (41, 2999)]);
    assert_eq!(srq.len(), 1, "one buffer left for whoever needs it");
    assert_eq!(&p.b.bytes(&recv)[3000..5999], &pattern(3000, 5)[..2999]);
}

// --- who speaks first ---------------------------------------------------------------------

#[test]
fn responder_waits_for_the_initiators_first_fpdu() {
    let mut p = Pair::new(false, false);
    let b_src = p.b.buf(64, Access::NONE, 1);
    let a_recv = p.a.buf(64, Access::LOCAL_WRITE, 0);
    p.a.post_recv(1, vec![a_recv.sge()]);
    p.b.post_send(SendWr {
        wr_id: 2,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: b_src.sge().into(),
        signaled: true,
    });
    p.run();
    assert_eq!(p.moved, 0, "the responder's Send waits");
    assert!(p.b.conn.awaiting_peer());
    // The initiator's first FPDU opens the responder's direction.
    let a_src = p.a.buf(8, Access::NONE, 2);
    let b_recv = p.b.buf(8, Access::LOCAL_WRITE, 0);
    p.b.post_recv(3, vec![b_recv.sge()]);
    p.a.post_send(SendWr {
        wr_id: 4,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: a_src.sge().into(),
        signaled: true,
    });
    p.run();
    assert!(!p.b.conn.awaiting_peer());
    assert!(p.a.completions.iter().any(|c| c.wr_id == 1 && c.status == WcStatus::Success));
    assert!(p.b.completions.iter().any(|c| c.wr_id == 2 && c.status == WcStatus::Success));
}

#[test]
fn peer_to_peer_rtr_opens_the_connection() {
    for (offer, expect_write) in [
        (iwarp_mpa::RtrTypes { write: true, read: true, send: false }, true),
        (iwarp_mpa::RtrTypes { write: false, read: true, send: false }, false),
    ] {
        let mut p = Pair::from_conns(Setup { rtr: Some(offer), ..Setup::new(true, false) }.connect());
        let b_src = p.b.buf(64, Access::NONE, 9);
        let a_recv = p.a.buf(64, Access::LOCAL_WRITE, 0);
        p.a.post_recv(1, vec![a_recv.sge()]);
        // The responder has something to say first: it goes out right after the RTR.
        p.b.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: b_src.sge().into(),
            signaled: true,
        });
        // Capture the initiator's first FPDU: the RTR.
        let first = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = first.clone();
        p.hook = Some(Box::new(move |dir, bytes: &mut Vec<u8>| {
            if dir == Dir::AtoB && seen.borrow().is_empty() {
                seen.borrow_mut().extend_from_slice(bytes);
            }
        }));
        p.run();
        let first = first.borrow();
        // ULPDU length, then the DDP/RDMAP control bytes.
        if expect_write {
            assert_eq!(&first[..4], &[0x00, 0x0e, 0xc1, 0x40], "zero-length tagged Write");
            assert_eq!(&first[4..8], &[0, 0, 0, 1], "STag 1");
        } else {
            assert_eq!(&first[2..4], &[0x41, 0x41], "Read Request");
        }
        assert_eq!(p.b.completions.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(p.a.completions.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(p.a.conn.qp_ref().state(), QpState::Rts);
        assert_eq!(p.b.conn.qp_ref().state(), QpState::Rts);
    }
}

// --- payloads read straight into place --------------------------------------------------

/// MULPDU of a loopback connection: FPDUs of up to about 64 KiB.
const LARGE_MULPDU: usize = 65_000;

/// A pair with loopback-sized FPDUs whose receivers read through [`Connection::receive`]
/// from a link that delivers at most `most` bytes per read.
fn large_pair(crc: bool, markers: bool, most: usize, seed: u64) -> Pair {
    let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(crc, markers) }.connect());
    for side in [&mut p.a, &mut p.b] {
        side.conn.set_direct_min(Some(4096));
    }
    p.link = Some((most, seed | 1));
    p
}

/// Writes, Reads and Sends of FPDU-sized and larger messages arrive intact with CRC and
/// markers on and off, however the link cuts the stream; without markers most payload bytes
/// are read straight into place (no receive-buffer copy) when reads cut FPDUs, with markers
/// none is.
#[test]
fn large_payloads_are_read_straight_into_place() {
    for (crc, markers) in modes() {
        for (i, len) in [20_000, LARGE_MULPDU - 18, LARGE_MULPDU + 1, 1 << 20].into_iter().enumerate() {
            for most in [70_000, 9_000] {
                let mut p = large_pair(crc, markers, most, 0x9e37_79b9 + i as u64);
                let src = p.a.buf(len, Access::NONE, 0);
                p.a.write(&src, 0, &pattern(len, 5)).unwrap();
                let wdst = p.b.buf(len + 16, Access::REMOTE_WRITE, 0xee);
                let rsrc = p.b.buf(len, Access::REMOTE_READ, 0);
                p.b.write(&rsrc, 0, &pattern(len, 6)).unwrap();
                let rsink = p.a.buf(len + 16, Access::LOCAL_WRITE, 0xdd);
                let rcv = p.b.buf(len + 16, Access::LOCAL_WRITE, 0xcc);
                p.b.post_recv(30, vec![rcv.sge_at(0, 8), rcv.sge_at(8, len as u32)]);
                p.a.post_send(write_to(wdst.stag, wdst.va + 8, &src, len as u32));
                p.a.post_send(SendWr {
                    wr_id: 2,
                    op: SendOp::Read { remote_stag: rsrc.stag, remote_to: rsrc.va },
                    sgl: rsink.sge_at(8, len as u32).into(),
                    signaled: true,
                });
                p.a.post_send(SendWr {
                    wr_id: 3,
                    op: SendOp::Send { solicited: false, invalidate: None },
                    sgl: src.sge_at(0, len as u32).into(),
                    signaled: true,
                });
                p.run();
                let what = format!("crc {crc} markers {markers} len {len} reads <= {most}");
                for (side, buf, fill, seed) in [(&p.b, &wdst, 0xee, 5), (&p.a, &rsink, 0xdd, 6)] {
                    let got = side.bytes(buf);
                    assert!(got[8..8 + len] == pattern(len, seed)[..], "{what}");
                    assert!(
                        got[..8].iter().chain(&got[8 + len..]).all(|&b| b == fill),
                        "{what}: guard bytes"
                    );
                }
                let got = p.b.bytes(&rcv);
                assert!(got[..len] == pattern(len, 5)[..], "{what}");
                assert!(got[len..].iter().all(|&b| b == 0xcc), "{what}: guard bytes");
                let ids: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
                assert_eq!(
                    ids,
                    [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)],
                    "{what}"
                );
                assert_eq!(p.b.completions.len(), 1, "{what}");
                ok(&p.b.completions[0], 30, WcOpcode::Recv);
                assert_eq!(p.b.completions[0].byte_len, len as u64);
                // B received the Write and the Send, A the Read Response.
                let (a, b) = (p.a.conn.rx_stats(), p.b.conn.rx_stats());
                let in_place = a.in_place + b.in_place;
                if markers {
                    assert_eq!(in_place, 0, "{what}");
                } else if most < 20_000 || len > 2 * most {
                    // A read that takes whole FPDUs copies them; short reads leave most of
                    // each payload to go into place.
                    assert!(in_place as f64 >= 0.5 * (3 * len) as f64, "{what}: {a:?} {b:?}");
                }
            }
        }
    }
}

fn llp(code: u8) -> TerminateCode {
    TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code }
}

/// The FPDUs of a stream without markers: (offset, ULPDU length) of each.
fn fpdus(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 2 <= stream.len() {
        let ulpdu = usize::from(u16::from_be_bytes([stream[at], stream[at + 1]]));
        out.push((at, ulpdu));
        at += iwarp_mpa::fpdu::fpdu_len(ulpdu);
    }
    out
}

/// Everything `end` has to send, framed as the engine frames it (batches, payloads by
/// reference).
fn frame_all(end: &mut End) -> Vec<u8> {
    let mut out = Vec::new();
    let mut batch = TxBatch::default();
    let mut mem = TableMemory { table: &mut end.table, pd: end.pd };
    loop {
        batch.clear();
        if end.conn.poll_transmit_batch(&mut mem, &mut batch, 256 * 1024) == 0 {
            return out;
        }
        let mut iov = Vec::new();
        batch.io_slices(&mem, &mut iov).unwrap();
        for b in &iov {
            out.extend_from_slice(b);
        }
    }
}

/// The receive buffer of [`read_through`]: smaller than the engine's, so that a read that
/// takes whole FPDUs into it is a small part of the streams these tests send.
const RX_LEN: usize = 64 * 1024;

/// Lets `end` read `stream` through [`Connection::receive`], as the engine does, from a link
/// that holds all of it, except that the FPDUs `cut_at` picks (by index) arrive cut `cut`
/// bytes after their start: no read takes bytes on both sides of that point. Returns what
/// each read asked for and got.
fn read_through(
    end: &mut End,
    stream: &[u8],
    cut: usize,
    cut_at: impl Fn(usize) -> bool,
) -> Vec<iwarp_rdmap::conn::ReceiveStep> {
    let stops: Vec<usize> =
        fpdus(stream).iter().enumerate().filter(|&(i, _)| cut_at(i)).map(|(_, &(at, _))| at + cut).collect();
    let mut rx = vec![0; RX_LEN];
    let mut at = 0;
    let mut steps = Vec::new();
    while at < stream.len() {
        let limit = stops.iter().find(|&&s| s > at).map_or(usize::MAX, |&s| s - at);
        let mut mem = TableMemory { table: &mut end.table, pd: end.pd };
        let step = end
            .conn
            .receive(&mut mem, &mut rx, |bufs| Ok::<_, ()>(deliver(bufs, &stream[at..], limit)))
            .unwrap();
        assert!(step.read > 0, "no progress at {at} of {}", stream.len());
        at += step.read;
        steps.push(step);
    }
    end.collect();
    steps
}

/// Payload bytes of the FPDUs in `stream` that are large enough to be read into place
/// (payload at least [`DIRECT_MIN`]), and how many FPDUs there are.
fn large_payload(stream: &[u8]) -> (u64, usize) {
    let all = fpdus(stream);
    let large = all
        .iter()
        .map(|&(at, ulpdu)| ulpdu - if stream[at + 2] & 0x80 != 0 { 14 } else { 18 })
        .filter(|&payload| payload >= DIRECT_MIN)
        .sum::<usize>();
    (large as u64, all.len())
}

/// Messages of a MiB and small ones in between, over a link that has the whole stream ready
/// (reads are limited only by what they ask for) and where an FPDU's header now and then
/// arrives cut at any point: with the default switch point, every large payload is read
/// straight into place but for the few bytes a header read brings along (the lookahead at
/// most), message after message (a large message's short last segment, or a small message,
/// does not let the next read take more of the next message's first FPDUs into the receive
/// buffer); contents, CRC, completions and the bytes around every buffer are right.
#[test]
fn large_messages_go_into_place_whatever_the_header_cut() {
    let len = 1 << 20;
    for crc in [true, false] {
        for cut in (0..=28).chain([100, 5000]) {
            let what = format!("crc {crc} cut {cut}");
            let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(crc, false) }.connect());
            let src = p.a.buf(len, Access::NONE, 0);
            p.a.write(&src, 0, &pattern(len, 5)).unwrap();
            let wdst = p.b.buf(len + 16, Access::REMOTE_WRITE, 0xee);
            let small = p.b.buf(200, Access::LOCAL_WRITE, 0xcc);
            let rcv = p.b.buf(len + 16, Access::LOCAL_WRITE, 0xcc);
            let rsrc = p.b.buf(len, Access::REMOTE_READ, 0);
            p.b.write(&rsrc, 0, &pattern(len, 6)).unwrap();
            let rsink = p.a.buf(len + 16, Access::LOCAL_WRITE, 0xdd);
            p.b.post_recv(30, vec![small.sge()]);
            p.b.post_recv(31, vec![rcv.sge_at(0, 8), rcv.sge_at(8, len as u32)]);
            p.a.post_send(write_to(wdst.stag, wdst.va + 8, &src, len as u32));
            let send = |wr_id, sgl: Sge| SendWr {
                wr_id,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: sgl.into(),
                signaled: true,
            };
            p.a.post_send(send(2, src.sge_at(0, 100)));
            p.a.post_send(send(3, src.sge_at(0, len as u32)));
            // A second Write over the first, from further into the source.
            p.a.post_send(SendWr { wr_id: 4, ..write_to(wdst.stag, wdst.va + 8, &src, 300_000) });
            p.a.post_send(SendWr {
                wr_id: 5,
                op: SendOp::Read { remote_stag: rsrc.stag, remote_to: rsrc.va },
                sgl: rsink.sge_at(8, len as u32).into(),
                signaled: true,
            });
            let stream = frame_all(&mut p.a);
            read_through(&mut p.b, &stream, cut, |i| i % 3 == 1);
            let back = frame_all(&mut p.b);
            read_through(&mut p.a, &back, cut, |i| i % 3 == 1);
            assert!(
                p.a.events.is_empty() && p.b.events.is_empty(),
                "{what}: {:?} {:?}",
                p.a.events,
                p.b.events
            );
            let ids: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
            let all_ok: Vec<_> = (1..=5).map(|i| (i, WcStatus::Success)).collect();
            assert_eq!(ids, all_ok, "{what}");
            let recvs: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.byte_len)).collect();
            assert_eq!(recvs, [(30, 100), (31, len as u64)], "{what}");
            let got = p.b.bytes(&wdst);
            assert!(got[8..8 + len] == pattern(len, 5)[..], "{what}: Write");
            assert!(got[..8].iter().chain(&got[8 + len..]).all(|&b| b == 0xee), "{what}: around the Write");
            let got = p.b.bytes(&small);
            assert!(got[..100] == pattern(100, 5)[..] && got[100..].iter().all(|&b| b == 0xcc), "{what}");
            let got = p.b.bytes(&rcv);
            assert!(got[..len] == pattern(len, 5)[..], "{what}: Send");
            assert!(got[len..].iter().all(|&b| b == 0xcc), "{what}: after the Send");
            let got = p.a.bytes(&rsink);
            assert!(got[8..8 + len] == pattern(len, 6)[..], "{what}: Read");
            assert!(got[..8].iter().chain(&got[8 + len..]).all(|&b| b == 0xdd), "{what}: around the Read");
            // Into place: all of every large payload but the first read's worth (before the
            // first large FPDU was seen, reads take a whole buffer) and what header reads
            // bring along (the lookahead past the header, the 4 bytes a tagged header is
            // shorter than an untagged one, the pad, and the part of a payload before the
            // cut).
            for (end, bytes) in [(&p.b, &stream), (&p.a, &back)] {
                let (large, count) = large_payload(bytes);
                let stats = end.conn.rx_stats();
                let slack = (RX_LEN + count * (8 + LOOKAHEAD + cut.saturating_sub(16))) as u64;
                assert!(
                    stats.in_place + slack >= large,
                    "{what}: {stats:?}, {large} bytes in large payloads"
                );
                assert_eq!(stats.bytes, bytes.len() as u64, "{what}");
            }
        }
    }
}

/// A large message alone on its connection (all of it arrived, nothing after it), once the
/// receiver reads payloads into place: two reads, the header's and one that takes the payload
/// into place and brings the message's short last FPDU along (the lookahead), and that one
/// comes back short, so the engine knows the link drained. Stopping at the next header, the
/// short FPDU took a read of its own.
#[test]
fn a_large_message_alone_takes_a_header_read_and_one_read_into_place() {
    // Two FPDUs: 64,986 payload bytes, then 214.
    let len = 65_200;
    let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect());
    let src = p.a.buf(len, Access::NONE, 0);
    let dst = p.b.buf(len, Access::REMOTE_WRITE, 0);
    for round in 0..3u8 {
        p.a.write(&src, 0, &pattern(len, round)).unwrap();
        p.a.post_send(write_to(dst.stag, dst.va, &src, len as u32));
        let stream = frame_all(&mut p.a);
        assert_eq!(fpdus(&stream).len(), 2);
        let before = p.b.conn.rx_stats().in_place;
        let steps = read_through(&mut p.b, &stream, 0, |_| false);
        assert!(p.b.events.is_empty(), "{:?}", p.b.events);
        assert!(p.b.bytes(&dst) == pattern(len, round), "round {round}");
        if round == 0 {
            // Nothing large seen yet: the first read takes a whole buffer.
            continue;
        }
        assert_eq!(steps.len(), 2, "round {round}: {steps:?}");
        assert!(steps[1].read < steps[1].asked, "round {round}: {steps:?}");
        // All of the large payload but what the header's read brought along: the lookahead
        // and the 4 bytes a tagged header is shorter than an untagged one.
        let in_place = p.b.conn.rx_stats().in_place - before;
        assert!(in_place as usize + LOOKAHEAD + 4 >= 64_986, "round {round}: {in_place} bytes into place");
    }
}

/// `from` Sends `src` to `to`, into `sink` (posted as receive `id` first), and `to` reads it.
fn send_over(from: &mut End, to: &mut End, id: u64, src: &Buf, sink: &Buf) {
    to.post_recv(id, vec![sink.sge()]);
    from.post_send(SendWr {
        wr_id: id,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: src.sge().into(),
        signaled: true,
    });
    let bytes = frame_all(from);
    to.feed(&bytes);
}

/// The kernel copies a write into a page fragment that starts at the write's first byte when
/// the connection is idle, so a payload whose source is page-aligned and whose place in the
/// write is 16 bytes in (a Write's first FPDU, after the length field and the tagged header) or
/// 20 (a Send's) would be copied at a slow distance: such a payload goes out copied into the
/// batch, half a page from its source, while the FPDUs after it stay in registered memory,
/// where the last batch sent all there was and the peer has answered since (the fragment is
/// then likely free again); not in a stream.
/// From a source 16 bytes into its page the first payload's distance is 0 and the second's 20
/// (it is the one copied); from 100 bytes in, no payload is. Either way no payload of the write
/// is at a slow distance from its place, and the peer gets the message.
#[test]
fn a_payload_the_kernel_would_copy_at_a_slow_distance_goes_out_from_a_copy() {
    use iwarp_ddp::dma::PAGE_SIZE as PAGE;
    use iwarp_rdmap::conn::{TX_BY_REF_MIN, TxPart, slow_copy};
    let len = 150_000;
    for (offset, send) in [(0usize, false), (0, true), (16, false), (100, true)] {
        let what = format!("source {offset} bytes into its page, {}", if send { "Send" } else { "Write" });
        let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect());
        let data = pattern(offset + len, 3);
        let va = 0x7f00_5555_0000;
        let spec = RegionSpec {
            base_va: va,
            len: data.len() as u64,
            access: Access::NONE,
            addressing: Addressing::VirtualAddress,
        };
        let src = p.a.table.register(p.a.pd, spec, RegionMemory::from_bytes(&data)).unwrap();
        let src_addr = p.a.table.memory(src).unwrap().slice(0, 1).unwrap().as_ptr() as usize;
        assert_eq!(src_addr % 4096, 0, "{what}: the region's memory is page-aligned");
        let sge = Sge { lkey: src, addr: va + offset as u64, len: len as u32 };
        // The initiator speaks first (a responder sends nothing before its first FPDU).
        let hello = p.a.buf(64, Access::NONE, 6);
        let hello_to = p.b.buf(64, Access::LOCAL_WRITE, 0);
        send_over(&mut p.a, &mut p.b, 10, &hello, &hello_to);
        let dst = p.b.buf(len, Access::REMOTE_WRITE.union(Access::LOCAL_WRITE), 0);
        let op = if send {
            p.b.post_recv(7, vec![dst.sge()]);
            SendOp::Send { solicited: false, invalidate: None }
        } else {
            SendOp::Write { remote_stag: dst.stag, remote_to: dst.va }
        };
        // Three rounds with the same batch (the engine keeps its own from write to write). In
        // the first two the peer has answered (a short Send) before the write: the first
        // grows the batch's buffer, which may move what it holds; from then on the buffer
        // stays where it is and the copy half a page from its source. In the third nothing
        // came back since the last write (a one-way stream): nothing is moved.
        let answer_to = p.a.buf(64, Access::LOCAL_WRITE, 0);
        let answer = p.b.buf(64, Access::NONE, 5);
        let mut batch = TxBatch::default();
        for round in 0..3 {
            let what = format!("{what}, round {round}");
            if round < 2 {
                send_over(&mut p.b, &mut p.a, 20 + round, &answer, &answer_to);
            }
            p.a.post_send(SendWr { wr_id: 1, op, sgl: sge.into(), signaled: true });
            batch.clear();
            let before = p.a.conn.tx_stats().moved as usize;
            let mut mem = TableMemory { table: &mut p.a.table, pd: p.a.pd };
            let n = p.a.conn.poll_transmit_batch(&mut mem, &mut batch, 1 << 20);
            let mut iov = Vec::new();
            batch.io_slices(&mem, &mut iov).unwrap();
            let (mut stream, mut payloads) = (Vec::new(), Vec::new());
            for b in &iov {
                if b.len() >= TX_BY_REF_MIN {
                    let addr = b.as_ptr() as usize;
                    assert!(
                        round == 2 || !slow_copy(stream.len(), addr),
                        "{what}: a payload at {} from {addr:#x}",
                        stream.len()
                    );
                    payloads.push(addr);
                }
                stream.extend_from_slice(b);
            }
            assert_eq!(stream.len(), n, "{what}");
            assert_eq!(fpdus(&stream).len(), 3, "{what}");
            // The payloads the rule moves: those whose place in the write is at a slow distance
            // from their source (each FPDU puts 20 more bytes of length, header and CRC
            // between them).
            let header = if send { 18 } else { 14 };
            let mut expected = Vec::new();
            let mut taken = 0;
            for &(at, ulpdu) in &fpdus(&stream) {
                let payload = ulpdu - header;
                if slow_copy(at + 2 + header, src_addr + offset + taken) {
                    expected.push(payload);
                }
                taken += payload;
            }
            if round == 2 {
                expected.clear();
            }
            assert_eq!(expected.len(), usize::from(offset < 32 && round < 2), "{what}: {expected:?}");
            let moved = p.a.conn.tx_stats().moved as usize - before;
            let memory = batch.parts().iter().filter(|p| matches!(p, TxPart::Memory(_))).count();
            assert_eq!((moved, memory), (expected.iter().sum(), 3 - expected.len()), "{what}");
            if round == 1 && offset == 0 {
                assert_eq!(payloads[0].wrapping_sub(src_addr) % 4096, 2048, "{what}");
            }
            if send && round > 0 {
                p.b.post_recv(8, vec![dst.sge()]);
            }
            p.b.feed(&stream);
            assert!(p.b.events.is_empty(), "{what}: {:?}", p.b.events);
            assert!(p.b.bytes(&dst) == data[offset..], "{what}");
        }
        // A batch that stops short (its limit) leaves the rest of the message queued: an
        // answer that comes in meanwhile does not make the next batch, which carries on the
        // stream, start a fragment, and nothing in it is moved. (From this source the second
        // FPDU's payload starts a page: at the start of a fragment it would be moved.)
        let header = if send { 18 } else { 14 };
        let from = (PAGE - (LARGE_MULPDU - header) % PAGE) % PAGE;
        let sent = len - PAGE;
        let sge = Sge { lkey: src, addr: va + from as u64, len: sent as u32 };
        assert!(slow_copy(2 + header, src_addr + from + LARGE_MULPDU - header), "{what}");
        p.a.post_send(SendWr { wr_id: 1, op, sgl: sge.into(), signaled: true });
        let mut stream = Vec::new();
        for (i, limit) in [1usize, 1 << 20].into_iter().enumerate() {
            if i == 1 {
                send_over(&mut p.b, &mut p.a, 30, &answer, &answer_to);
            }
            batch.clear();
            let before = p.a.conn.tx_stats().moved;
            let mut mem = TableMemory { table: &mut p.a.table, pd: p.a.pd };
            p.a.conn.poll_transmit_batch(&mut mem, &mut batch, limit);
            let mut iov = Vec::new();
            batch.io_slices(&mem, &mut iov).unwrap();
            iov.iter().for_each(|b| stream.extend_from_slice(b));
            if i == 1 {
                assert_eq!(p.a.conn.tx_stats().moved, before, "{what}: the batch after a short one");
            }
        }
        if send {
            p.b.post_recv(8, vec![dst.sge()]);
        }
        p.b.feed(&stream);
        assert!(p.b.events.is_empty(), "{what}: {:?}", p.b.events);
        assert!(p.b.bytes(&dst)[..sent] == data[from..from + sent], "{what}");
    }
}

/// After large FPDUs, a run of small ones: the reads that stop at headers wear off after a
/// few of them, and then a read takes all that is there again (many small FPDUs at once).
#[test]
fn small_fpdus_after_large_ones_are_read_many_at_a_time_again() {
    let len = 200_000;
    let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect());
    let src = p.a.buf(len, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(len, 3)).unwrap();
    let dst = p.b.buf(len, Access::REMOTE_WRITE, 0);
    let rcv = p.b.buf(64 * 100, Access::LOCAL_WRITE, 0);
    p.a.post_send(write_to(dst.stag, dst.va, &src, len as u32));
    for i in 0..64 {
        p.b.post_recv(100 + i, vec![rcv.sge_at(i * 100, 100)]);
        p.a.post_send(SendWr {
            wr_id: 100 + i,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.sge_at(i * 100, 100).into(),
            signaled: true,
        });
    }
    let stream = frame_all(&mut p.a);
    let steps = read_through(&mut p.b, &stream, 0, |_| false);
    assert!(p.b.events.is_empty(), "{:?}", p.b.events);
    assert_eq!(p.b.completions.len(), 64);
    assert!(p.b.bytes(&rcv) == pattern(len, 3)[..64 * 100]);
    assert!(p.b.bytes(&dst) == pattern(len, 3));
    // A few reads into place for the Write, a few small FPDUs per read (as far as the
    // lookahead goes) for a while, then one read for all the rest.
    assert!(steps.len() <= 4 + 10, "{} reads: {steps:?}", steps.len());
    let last = steps.last().unwrap();
    assert_eq!(last.asked, RX_LEN, "{steps:?}");
    // The Write's first FPDU came with the first read (a whole buffer) and its last is small;
    // the two in between went into place.
    assert!(p.b.conn.rx_stats().in_place >= 2 * 64_000, "{:?}", p.b.conn.rx_stats());
}

/// Hostile FPDUs with large payloads, after large ones have put the receiver into reading
/// payloads straight into place, and with their headers cut at any point: a bad STag, a
/// payload past the region's end, a Send longer than its receive, a length field that claims
/// more than was framed (the CRC at the claimed end is wrong), a segment too short for its
/// header. Each gets its Terminate; no byte outside what the region allows changes (the
/// region's unregistered tail and the guard bytes around its memory, checked when the end
/// goes); nothing after it is placed.
#[test]
fn hostile_large_fpdus_read_into_place_get_their_terminate() {
    let big = 40_000;
    for case in 0..5 {
        for cut in [0, 1, 2, 3, 9, 15, 16, 17, 19, 20, 21, 24, 27, 1000] {
            let what = format!("case {case} cut {cut}");
            let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect());
            let src = p.a.buf(200_000, Access::NONE, 0);
            p.a.write(&src, 0, &pattern(200_000, 1)).unwrap();
            let warm = p.b.buf(200_000, Access::REMOTE_WRITE, 0);
            let after = p.b.buf(big, Access::REMOTE_WRITE, 0x5a);
            let region =
                p.b.register_in(2, 100_000, 100_064, Access::REMOTE_WRITE, Addressing::VirtualAddress, 9);
            let recv =
                p.b.register_in(2, 30_000, 30_064, Access::LOCAL_WRITE, Addressing::VirtualAddress, 11);
            let (rstag, rto) = (p.b.regions[region].stag, p.b.regions[region].first_to);
            let (vstag, vto) = (p.b.regions[recv].stag, p.b.regions[recv].first_to);
            p.b.post_recv(7, vec![Sge { lkey: vstag, addr: vto, len: 30_000 }]);
            // Large FPDUs first: payloads go into place from here on.
            p.a.post_send(write_to(warm.stag, warm.va, &src, 200_000));
            let mut stream = frame_all(&mut p.a);
            let payload = pattern(big, 0x77);
            let write = |stag, to| common::tagged(Opcode::Write, stag, to, &payload);
            let (ulpdu, expect) = match case {
                0 => (write(STag(rstag.0 ^ 0x01), rto), TerminateCode::ddp(1, 0x00)),
                1 => (write(rstag, rto + 100_000 - big as u64 + 1), TerminateCode::ddp(1, 0x01)),
                2 => {
                    (common::untagged(Opcode::Send, 0, 1, 0, true, 0, &payload), TerminateCode::ddp(2, 0x05))
                }
                3 => (write(rstag, rto + 50_000), llp(0x02)),
                _ => (vec![0xc1, 0x40, 0, 0, 0, 0, 0, 0, 0, 0], llp(0x03)),
            };
            let at = stream.len();
            p.a.conn.inject_ulpdu(&ulpdu, &mut stream);
            if case == 3 {
                // 1000 payload bytes go missing: the length field claims 1000 bytes of what
                // follows, and the CRC at the claimed end is wrong.
                stream.drain(at + 5000..at + 6000);
            }
            // A good Write after it, never placed.
            p.a.post_send(write_to(after.stag, after.va, &src, big as u32));
            stream.extend(frame_all(&mut p.a));
            read_through(&mut p.b, &stream, cut, |_| true);
            assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(expect)), "{what}");
            assert!(p.b.bytes(&warm) == pattern(200_000, 1), "{what}");
            assert!(p.b.bytes(&after).iter().all(|&b| b == 0x5a), "{what}: placed after the Terminate");
            let r = &p.b.regions[recv];
            assert!(r.unchanged(&p.b.table), "{what}: the receive buffer changed");
            let r = &p.b.regions[region];
            let now = r.bytes(&p.b.table);
            if case == 3 {
                // The claimed range may hold what arrived (the message never completes);
                // nothing around it changed.
                assert!(now[..50_000] == r.initial[..50_000], "{what}");
                assert!(now[50_000 + big..] == r.initial[50_000 + big..], "{what}");
            } else {
                assert!(now == r.initial, "{what}: the region changed");
            }
            let recvs: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.status)).collect();
            // The receive the Send was too long for fails with a length error; else it is
            // flushed.
            let status = if case == 2 { WcStatus::LocalLengthError } else { WcStatus::WrFlushError };
            assert_eq!(recvs, [(7, status)], "{what}");
        }
    }
}

/// A corrupted payload byte read into place: the CRC check at the FPDU's end terminates the
/// stream with the LLP CRC error and the receive never completes successfully.
#[test]
fn bad_crc_of_a_payload_read_into_place_terminates() {
    let len = 50_000;
    let mut p = large_pair(true, false, 4096, 7);
    let src = p.a.buf(len, Access::NONE, 1);
    let rcv = p.b.buf(len, Access::LOCAL_WRITE, 0);
    p.b.post_recv(40, vec![rcv.sge()]);
    let mut done = false;
    p.hook = Some(Box::new(move |dir, bytes: &mut Vec<u8>| {
        if dir == Dir::AtoB && !done && bytes.len() > 30_000 {
            bytes[30_000] ^= 0x01;
            done = true;
        }
    }));
    p.a.post_send(SendWr {
        wr_id: 4,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: src.sge().into(),
        signaled: true,
    });
    p.run();
    assert!(p.b.conn.rx_stats().in_place > 20_000, "{:?}", p.b.conn.rx_stats());
    let crc = TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code: 0x02 };
    assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(crc)));
    let recv: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(recv, [(40, WcStatus::WrFlushError)]);
}

/// The region a payload is being read into is deregistered between two reads (the engine's
/// lock is released between passes): the rest of the payload is dropped, never written into
/// the memory handed back, and the segment is terminated as one naming an invalid STag.
#[test]
fn deregistration_while_a_payload_is_read_into_place() {
    let len = 60_000;
    let (a, b) = Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect();
    let mut p = Pair::from_conns((a, b));
    let src = p.a.buf(len, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(len, 2)).unwrap();
    let dst = p.b.buf(len, Access::REMOTE_WRITE, 0x11);
    p.a.post_send(write_to(dst.stag, dst.va, &src, len as u32));
    let mut bytes = Vec::new();
    let mut mem = TableMemory { table: &mut p.a.table, pd: p.a.pd };
    p.a.conn.poll_transmit(&mut mem, &mut bytes, 256 * 1024);
    let mut rx = vec![0; 64 * 1024];
    let at = std::cell::Cell::new(0);
    let mut read = |conn: &mut Connection, table: &mut TaggedBufferTable, pd, most: usize| {
        let mut mem = TableMemory { table, pd };
        let step = conn
            .receive(&mut mem, &mut rx, |bufs| Ok::<_, ()>(deliver(bufs, &bytes[at.get()..], most)))
            .unwrap();
        at.set(at.get() + step.read);
    };
    // The header and 10,000 payload bytes, then 20,000 more straight into place.
    read(&mut p.b.conn, &mut p.b.table, p.b.pd, 10_016);
    read(&mut p.b.conn, &mut p.b.table, p.b.pd, 20_000);
    assert_eq!(p.b.conn.rx_stats().in_place, 20_000);
    let (_, memory) = p.b.table.deregister(dst.stag).unwrap();
    let back = memory.unwrap().into_buffer();
    let back = back.as_slice().unwrap();
    assert!(back[..30_000] == pattern(len, 2)[..30_000]);
    assert!(back[30_000..].iter().all(|&b| b == 0x11));
    while at.get() < bytes.len() {
        read(&mut p.b.conn, &mut p.b.table, p.b.pd, 8192);
    }
    assert_eq!(p.b.conn.rx_stats().in_place, 20_000, "nothing more went into place");
    p.b.collect();
    assert_eq!(p.b.events.first(), Some(&QpEvent::LocalTerminate(TerminateCode::ddp(1, 0x00))));
}

/// Batches framed for vectored writes, their payloads left in registered memory and the rest
/// of a batch a link did not take copied out, deliver every operation intact (CRC and markers
/// on and off); without markers the large payloads are not copied while framing, but for the
/// few whose kernel copy would be slow.
#[test]
fn batched_transmit_sends_payloads_from_registered_memory() {
    for (crc, markers) in modes() {
        for len in [100, 3000, 1 << 20] {
            let mut p = large_pair(crc, markers, 30_000, len as u64);
            p.batched = Some(0x2545_f491_4f6c_dd1d ^ len as u64);
            let src = p.a.buf(len, Access::NONE, 0);
            p.a.write(&src, 0, &pattern(len, 8)).unwrap();
            let wdst = p.b.buf(len, Access::REMOTE_WRITE, 0);
            let rsrc = p.b.buf(len, Access::REMOTE_READ, 0);
            p.b.write(&rsrc, 0, &pattern(len, 9)).unwrap();
            let rsink = p.a.buf(len, Access::LOCAL_WRITE, 0);
            let rcv = p.b.buf(len, Access::LOCAL_WRITE, 0);
            p.b.post_recv(50, vec![rcv.sge()]);
            p.a.post_send(write_to(wdst.stag, wdst.va, &src, len as u32));
            p.a.post_send(SendWr {
                wr_id: 2,
                op: SendOp::Read { remote_stag: rsrc.stag, remote_to: rsrc.va },
                sgl: rsink.sge().into(),
                signaled: true,
            });
            p.a.post_send(SendWr {
                wr_id: 3,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: vec![
                    src.sge_at(0, len as u32 / 2),
                    src.sge_at(len as u64 / 2, len as u32 - len as u32 / 2),
                ]
                .into(),
                signaled: true,
            });
            p.run();
            let what = format!("crc {crc} markers {markers} len {len}");
            assert!(p.b.bytes(&wdst) == pattern(len, 8), "{what}");
            assert!(p.a.bytes(&rsink) == pattern(len, 9), "{what}");
            assert!(p.b.bytes(&rcv) == pattern(len, 8), "{what}");
            let ids: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
            assert_eq!(
                ids,
                [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)],
                "{what}"
            );
            assert_eq!(p.b.completions.len(), 1, "{what}");
            let (a, b) = (p.a.conn.tx_stats(), p.b.conn.tx_stats());
            let (by_ref, moved) = (a.by_ref + b.by_ref, a.moved + b.moved);
            if markers || len < iwarp_rdmap::conn::TX_BY_REF_MIN {
                assert_eq!((by_ref, moved), (0, 0), "{what}");
            } else {
                // Every large payload from registered memory, but those copied because the
                // kernel's copy of them would have been slow (a few FPDUs at most).
                assert_eq!(by_ref + moved, 3 * len as u64, "{what}");
                assert!(moved <= 4 * 30_000, "{what}: {moved} bytes moved");
            }
        }
    }
}

/// A transmit batch is framed over the bytes of the batches before it (nothing zero-fills
/// it): small Sends of every length up to 70 bytes after a large Write, in one batch reused
/// from step to step, arrive intact with CRCs and pads right, and complete once each, in
/// order.
#[test]
fn small_fpdus_framed_over_a_reused_batch_arrive_intact() {
    for (crc, markers) in modes() {
        let mut p = large_pair(crc, markers, 30_000, 7);
        p.batched = Some(0x9e37_79b9_7f4a_7c15);
        let big = 100_000;
        let src = p.a.buf(big, Access::NONE, 0);
        p.a.write(&src, 0, &pattern(big, 3)).unwrap();
        let wdst = p.b.buf(big, Access::REMOTE_WRITE, 0);
        p.a.post_send(write_to(wdst.stag, wdst.va, &src, big as u32));
        p.run();
        let what = format!("crc {crc} markers {markers}");
        assert!(p.b.bytes(&wdst) == pattern(big, 3), "{what}");
        let msgs = 70;
        let rcv = p.b.buf(80 * msgs, Access::LOCAL_WRITE, 0xaa);
        for i in 0..msgs {
            p.b.post_recv(100 + i as u64, vec![rcv.sge_at(80 * i as u64, 80)]);
        }
        for len in 1..=msgs {
            p.a.post_send(SendWr {
                wr_id: 1000 + len as u64,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: src.sge_at(len as u64 * 7, len as u32).into(),
                signaled: true,
            });
        }
        p.run();
        let sent: Vec<_> = p.a.completions.iter().skip(1).map(|c| (c.wr_id, c.status)).collect();
        let expect: Vec<_> = (1..=msgs).map(|l| (1000 + l as u64, WcStatus::Success)).collect();
        assert_eq!(sent, expect, "{what}");
        let got: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        let expect: Vec<_> = (0..msgs).map(|i| (100 + i as u64, WcStatus::Success, i as u64 + 1)).collect();
        assert_eq!(got, expect, "{what}");
        let (whole, all) = (pattern(big, 3), p.b.bytes(&rcv));
        for (i, bytes) in all.chunks(80).enumerate() {
            let len = i + 1;
            assert_eq!(&bytes[..len], &whole[len * 7..len * 8], "{what} len {len}");
            assert!(bytes[len..].iter().all(|&b| b == 0xaa), "{what} len {len}");
        }
    }
}

// --- Requests checked by the poster ---------------------------------------------------------

#[test]
fn checked_send_goes_out_as_a_posted_one_and_keeps_its_length() {
    let mut p = Pair::rfc7306();
    let src = p.a.buf(300, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(300, 9)).unwrap();
    let recv = p.b.buf(300, Access::LOCAL_WRITE, 0);
    p.b.post_recv(1, vec![recv.sge()]);
    let config = *p.a.conn.qp_ref().config();
    let wr = SendWr {
        wr_id: 21,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: vec![src.sge_at(0, 100), src.sge_at(100, 200)].into(),
        signaled: true,
    };
    let checked = wr.clone().check(&config).unwrap();
    assert_eq!((checked.len(), checked.wr()), (300, &wr));
    p.a.conn.qp().post_checked_send(checked).unwrap();
    p.run();
    let a: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
    assert_eq!(a, vec![(21, WcStatus::Success, 300)]);
    let b: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.opcode, c.byte_len)).collect();
    assert_eq!(b, vec![(1, WcOpcode::Recv, 300)]);
    assert_eq!(p.b.bytes(&recv), pattern(300, 9));
}

#[test]
fn check_refuses_what_validate_refuses_and_the_queue_pair_repeats_the_extension_check() {
    let mut p = Pair::new(false, false);
    let config = *p.a.conn.qp_ref().config();
    let bad = SendWr {
        wr_id: 1,
        op: SendOp::ImmediateData { data: [1; 8], solicited: false },
        sgl: vec![Sge { lkey: STag(0x100), addr: 0, len: 8 }].into(),
        signaled: true,
    };
    let with_extensions = iwarp_rdmap::qp::QpConfig { rfc7306: true, ..config };
    assert_eq!(bad.clone().check(&with_extensions).unwrap_err(), PostError::BadSgl);
    assert_eq!(bad.validate(&with_extensions).unwrap_err(), PostError::BadSgl);
    // Checked against settings with RFC 7306, posted on a queue pair without: refused.
    let imm = SendWr { sgl: vec![].into(), ..bad };
    assert_eq!(imm.clone().check(&config).unwrap_err(), PostError::ExtensionNotNegotiated);
    let checked = imm.check(&with_extensions).unwrap();
    assert_eq!(p.a.conn.qp().post_checked_send(checked).unwrap_err(), PostError::ExtensionNotNegotiated);
    p.run();
    assert_eq!(p.moved, 0, "nothing went on the wire");
    assert!(p.a.completions.is_empty());
}

/// A receive posted between a read and the handling of the bytes it brought (where the engine
/// posts the receives the application queued meanwhile: the peer may have sent into them as
/// soon as it was told of them) takes the Send in those bytes; none was posted before.
#[test]
fn a_receive_posted_after_the_read_takes_the_send_it_brought() {
    for len in [64, 100_000] {
        let mut p = Pair::from_conns(Setup { mulpdu: LARGE_MULPDU, ..Setup::new(true, false) }.connect());
        let src = p.a.buf(len, Access::NONE, 0);
        p.a.write(&src, 0, &pattern(len, 9)).unwrap();
        let dst = p.b.buf(len, Access::LOCAL_WRITE, 0xcc);
        p.a.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.sge().into(),
            signaled: true,
        });
        let stream = frame_all(&mut p.a);
        let mut rx = vec![0; RX_LEN];
        let mut at = 0;
        let mut recv = Some(RecvWr { wr_id: 7, sgl: vec![dst.sge()].into() });
        while at < stream.len() {
            let mut mem = TableMemory { table: &mut p.b.table, pd: p.b.pd };
            let step =
                p.b.conn
                    .receive_then(
                        &mut mem,
                        &mut rx,
                        |bufs| Ok::<_, ()>(deliver(bufs, &stream[at..], usize::MAX)),
                        |qp| {
                            if let Some(wr) = recv.take() {
                                qp.post_recv(wr).unwrap();
                            }
                        },
                    )
                    .unwrap();
            assert!(step.read > 0);
            at += step.read;
        }
        p.b.collect();
        assert!(p.b.events.is_empty(), "{len}: {:?}", p.b.events);
        let recvs: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        assert_eq!(recvs, [(7, WcStatus::Success, len as u64)], "{len}");
        assert!(p.b.bytes(&dst) == pattern(len, 9), "{len}");
    }
}

/// `may_transmit` says false only when there is nothing to send: before any work, after the
/// last segment of a Read's request and response has gone, and for a queue pair that has
/// left RTS; true while a request waits in the send queue or a response is due.
#[test]
fn may_transmit_is_false_only_with_nothing_to_send() {
    let mut p = Pair::new(false, false);
    assert!(!p.a.conn.qp_ref().may_transmit() && !p.b.conn.qp_ref().may_transmit());
    let len = 3 * MULPDU;
    let src = p.b.buf(len, Access::REMOTE_READ, 0);
    let sink = p.a.buf(len, Access::LOCAL_WRITE, 0);
    p.a.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read { remote_stag: src.stag, remote_to: src.va },
        sgl: sink.sge_at(0, len as u32).into(),
        signaled: true,
    });
    assert!(p.a.conn.qp_ref().may_transmit(), "a Read waits in the send queue");
    let request = p.a.transmit();
    assert!(!p.a.conn.qp_ref().may_transmit(), "the Read Request is out");
    p.b.feed(&request);
    assert!(p.b.conn.qp_ref().may_transmit(), "a Read Response is due");
    let response = p.b.transmit();
    p.a.feed(&response);
    p.a.collect();
    ok(&p.a.completions[0], 1, WcOpcode::Read);
    assert!(!p.a.conn.qp_ref().may_transmit() && !p.b.conn.qp_ref().may_transmit());
}

/// Lists posted whole (`post_checked_sends`, `post_recvs`, as the engine hands over what the
/// application posted): each request is posted as one posted alone would be, refusals are
/// reported one by one without stopping the rest, and the queue pair runs them in order.
#[test]
fn lists_posted_whole_run_in_order_and_report_each_refusal() {
    use std::collections::VecDeque;
    let mut p = Pair::from_conns(Setup { max_wr: 3, ..Setup::new(true, false) }.connect());
    let config = *p.a.conn.qp_ref().config();
    let src = p.a.buf(300, Access::NONE, 0);
    p.a.write(&src, 0, &pattern(300, 3)).unwrap();
    let dst = p.b.buf(300, Access::LOCAL_WRITE, 0xcc);
    // Receives: three fit the queue; a fourth is refused as full, one with a list too long
    // for 32 bits as such, and neither stops the others.
    let huge = Sge { lkey: dst.stag, addr: 0, len: u32::MAX };
    let mut recvs: VecDeque<RecvWr> = [
        RecvWr { wr_id: 1, sgl: vec![dst.sge_at(0, 100)].into() },
        RecvWr { wr_id: 2, sgl: vec![huge, huge].into() },
        RecvWr { wr_id: 3, sgl: vec![dst.sge_at(100, 100)].into() },
        RecvWr { wr_id: 4, sgl: vec![dst.sge_at(200, 100)].into() },
        RecvWr { wr_id: 5, sgl: vec![dst.sge_at(200, 100)].into() },
    ]
    .into();
    let mut refused = Vec::new();
    p.b.conn.qp().post_recvs(&mut recvs, |wr_id, e| refused.push((wr_id, e)));
    assert!(recvs.is_empty());
    assert_eq!(refused, [(2, PostError::TooLong), (5, PostError::QueueFull)]);
    // Sends: a list the queue pair takes whole, then one with an operation it did not
    // negotiate (checked elsewhere against settings with RFC 7306), which is refused alone.
    let send = |wr_id: u64, at: u64| {
        SendWr {
            wr_id,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: vec![src.sge_at(at, 100)].into(),
            signaled: true,
        }
        .check(&config)
        .unwrap()
    };
    let mut sends: VecDeque<_> = [send(11, 0), send(12, 100)].into();
    p.a.conn.qp().post_checked_sends(&mut sends, |_, _, e| panic!("refused: {e}"));
    assert!(sends.is_empty());
    let with_extensions = iwarp_rdmap::qp::QpConfig { rfc7306: true, ..config };
    let imm = SendWr {
        wr_id: 13,
        op: SendOp::ImmediateData { data: [1; 8], solicited: false },
        sgl: vec![].into(),
        signaled: true,
    };
    let mut sends: VecDeque<_> = [imm.check(&with_extensions).unwrap(), send(14, 200)].into();
    let mut refused = Vec::new();
    p.a.conn.qp().post_checked_sends(&mut sends, |wr_id, opcode, e| refused.push((wr_id, opcode, e)));
    assert_eq!(refused, [(13, WcOpcode::ImmediateData, PostError::ExtensionNotNegotiated)]);
    // The queue holds three: a fourth is refused as full.
    let mut sends: VecDeque<_> = [send(15, 0)].into();
    let mut refused = Vec::new();
    p.a.conn.qp().post_checked_sends(&mut sends, |wr_id, _, e| refused.push((wr_id, e)));
    assert_eq!(refused, [(15, PostError::QueueFull)]);
    p.run();
    let a: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(a, [(11, WcStatus::Success), (12, WcStatus::Success), (14, WcStatus::Success)]);
    let b: Vec<_> = p.b.completions.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(b, [(1, 100), (3, 100), (4, 100)]);
    assert_eq!(p.b.bytes(&dst), pattern(300, 3));
}

/// A batch's limit gives way at a message's end: with FPDUs of 32 KiB on the wire, a 256 KiB
/// Write is eight of them and a ninth carrying the last 160 bytes, and a batch limited to
/// 256 KiB carries all nine (one write: left to the next batch, the ninth went out in a write
/// of its own, and the message was complete at the peer only when that one came). A message
/// whose rest past the limit is more than one FPDU is cut at the limit as before.
#[test]
fn a_batch_finishes_a_message_whose_rest_fits_in_one_more_fpdu() {
    // ULPDU of 32,762 bytes: with the length field and the CRC, FPDUs of 32,768.
    let mulpdu = 32_762;
    let payload = mulpdu - 14;
    let limit = 256 * 1024;
    for (len, first) in [(limit, limit + 180), (limit + 2 * payload, limit)] {
        let what = format!("{len} B Write");
        let mut p = Pair::from_conns(Setup { mulpdu, ..Setup::new(true, false) }.connect());
        let src = p.a.buf(len, Access::NONE, 0);
        p.a.write(&src, 0, &pattern(len, 9)).unwrap();
        let dst = p.b.buf(len, Access::REMOTE_WRITE, 0);
        p.a.post_send(write_to(dst.stag, dst.va, &src, len as u32));
        let mut stream = Vec::new();
        let mut sizes = Vec::new();
        let mut batch = TxBatch::default();
        loop {
            batch.clear();
            let mut mem = TableMemory { table: &mut p.a.table, pd: p.a.pd };
            let n = p.a.conn.poll_transmit_batch(&mut mem, &mut batch, limit);
            if n == 0 {
                break;
            }
            let mut iov = Vec::new();
            batch.io_slices(&mem, &mut iov).unwrap();
            iov.iter().for_each(|b| stream.extend_from_slice(b));
            sizes.push(n);
        }
        assert_eq!(sizes[0], first, "{what}: {sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), stream.len(), "{what}");
        assert_eq!(fpdus(&stream).len(), len.div_ceil(payload), "{what}");
        p.b.feed(&stream);
        assert!(p.b.events.is_empty(), "{what}: {:?}", p.b.events);
        assert!(p.b.bytes(&dst) == pattern(len, 9), "{what}");
    }
}

/// Messages that fit one segment go out without the segmenter (`QueuePair::transmit_whole`),
/// longer ones through it: posted in turns on one queue pair, every segment on the wire is the
/// one RFC 5041 describes (independently built here), the untagged ones numbered by one MSN
/// sequence, whether the connection frames into one buffer or into batches with payloads by
/// reference, with CRC on and off.
#[test]
fn messages_of_one_segment_and_of_several_share_one_msn_sequence() {
    for crc in [false, true] {
        for batched in [false, true] {
            let what = format!("crc {crc} batched {batched}");
            let mut p = Pair::new(crc, false);
            let src = p.a.buf(3 * MULPDU, Access::NONE, 0);
            p.a.write(&src, 0, &pattern(3 * MULPDU, 7)).unwrap();
            let sink = p.b.buf(4096, Access::REMOTE_WRITE, 0);
            let invalidated = STag(0x1234_5600);
            // (op, length): a Send of one segment, of three, of none, an RDMA Write of one
            // segment, a solicited Send with Invalidate filling a segment exactly, a Send of one
            // byte.
            let posts = [
                (SendOp::Send { solicited: false, invalidate: None }, 64),
                (SendOp::Send { solicited: false, invalidate: None }, 2 * UNTAGGED_ROOM + 100),
                (SendOp::Send { solicited: false, invalidate: None }, 0),
                (SendOp::Write { remote_stag: sink.stag, remote_to: sink.va + 8 }, 100),
                (SendOp::Send { solicited: true, invalidate: Some(invalidated) }, UNTAGGED_ROOM),
                (SendOp::Send { solicited: false, invalidate: None }, 1),
            ];
            for (i, &(op, len)) in posts.iter().enumerate() {
                p.a.post_send(SendWr {
                    wr_id: i as u64,
                    op,
                    sgl: src.sge_at(0, len as u32).into(),
                    signaled: true,
                });
            }
            let wire = if batched { frame_all(&mut p.a) } else { p.a.transmit() };
            p.a.collect();
            let data = pattern(3 * MULPDU, 7);
            let send = |opcode, msn, mo, last, word, range: std::ops::Range<usize>| {
                common::untagged(opcode, 0, msn, mo as u32, last, word, &data[range])
            };
            let expected = vec![
                send(Opcode::Send, 1, 0, true, 0, 0..64),
                send(Opcode::Send, 2, 0, false, 0, 0..UNTAGGED_ROOM),
                send(Opcode::Send, 2, UNTAGGED_ROOM, false, 0, UNTAGGED_ROOM..2 * UNTAGGED_ROOM),
                send(Opcode::Send, 2, 2 * UNTAGGED_ROOM, true, 0, 2 * UNTAGGED_ROOM..2 * UNTAGGED_ROOM + 100),
                send(Opcode::Send, 3, 0, true, 0, 0..0),
                common::tagged(Opcode::Write, sink.stag, sink.va + 8, &data[..100]),
                send(Opcode::SendSeInvalidate, 4, 0, true, invalidated.0, 0..UNTAGGED_ROOM),
                send(Opcode::Send, 5, 0, true, 0, 0..1),
            ];
            assert_eq!(common::deframe_all(&wire, crc, false), expected, "{what}");
            let done: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
            let want: Vec<_> = (0..posts.len() as u64).map(|i| (i, WcStatus::Success)).collect();
            assert_eq!(done, want, "{what}");
        }
    }
}

/// A message of one segment whose local buffer cannot be read fails as a segmented one does:
/// its work request completes with a local protection error, the queue pair terminates
/// (nothing of the message on the wire), and the requests behind it are flushed.
#[test]
fn a_message_of_one_segment_from_an_unreadable_buffer_fails_its_request() {
    for batched in [false, true] {
        let mut p = Pair::new(false, false);
        let src = p.a.buf(64, Access::NONE, 0);
        let bad = Sge { lkey: STag(src.stag.0 ^ 0x100), addr: src.va, len: 64 };
        p.a.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: bad.into(),
            signaled: true,
        });
        p.a.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: src.sge_at(0, 64).into(),
            signaled: true,
        });
        let wire = if batched { frame_all(&mut p.a) } else { p.a.transmit() };
        p.a.collect();
        let ulpdus = common::deframe_all(&wire, false, false);
        assert_eq!(ulpdus.len(), 1, "batched {batched}: {} segments, not the Terminate alone", ulpdus.len());
        common::parse_terminate(&ulpdus[0]);
        assert_eq!(p.a.state(), QpState::Error, "batched {batched}");
        let done: Vec<_> = p.a.completions.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            done,
            [(1, WcStatus::LocalProtectionError), (2, WcStatus::WrFlushError)],
            "batched {batched}"
        );
    }
}
