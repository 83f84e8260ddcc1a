//! Registered memory over real connections: regions over the application's own buffers (every
//! owned kind, and foreign memory), written in place by peers and given back on
//! deregistration with nothing outside the registration touched; memory windows bound by a
//! work request; fast-register and local-invalidate work requests; re-validating a region
//! after an invalidation.
//!
//! A peer's Write is known to have landed when the receive completion of the Send the peer
//! posted after it has been polled (RDMA's ordering: the rule the zero-copy view relies on).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

mod common;

use common::*;
use iwarp::ddp::TerminateCode;
use iwarp::{
    Access, Buffer, MemoryRegion, PageBuffer, PollMode, PostError, QpEvent, QpState, RegionMemory, STag,
    SendOp, SendWr, WcOpcode, WcStatus,
};

const RW: Access = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::LOCAL_WRITE);

/// `client` Writes `data` to `rkey`/`to` on the server, then Sends a zero-length message; the
/// server's receive completion says the Write is in place.
fn write_then_sync(p: &Pair, wr_id: u64, rkey: STag, to: u64, data: &[u8]) {
    let src = p.client.pd.register_bytes(data, Access::NONE).unwrap();
    p.server.recv(wr_id + 1000, vec![]);
    p.client.send(wr_id, SendOp::Write { remote_stag: rkey, remote_to: to }, vec![src.sge_all()]);
    p.client.send(wr_id + 1, send_op(false), vec![]);
    p.client.expect_ok(wr_id, WcOpcode::Write, "write");
    p.client.expect_ok(wr_id + 1, WcOpcode::Send, "sync send");
    p.server.expect_ok(wr_id + 1000, WcOpcode::Recv, "sync receive");
}

/// The server's Terminate for the client's next Write to `rkey`/`to`, and the client's view.
fn write_is_terminated(p: &Pair, rkey: STag, to: u64, len: usize) -> TerminateCode {
    let src = p.client.pd.register_bytes(&vec![0xab; len], Access::NONE).unwrap();
    p.client.send(77, SendOp::Write { remote_stag: rkey, remote_to: to }, vec![src.sge_all()]);
    let Some(QpEvent::LocalTerminate(code)) = p.server.qp.wait_event(T) else { panic!("no Terminate") };
    match p.client.qp.wait_event(T) {
        Some(QpEvent::RemoteTerminate { header, .. }) => assert_eq!(header.cause, code),
        e => panic!("expected RemoteTerminate, got {e:?}"),
    }
    wait_state(&p.client.qp, QpState::Error, "writer");
    code
}

/// Waits until the server's queue pair has left RTS after a failed work request; the client
/// then speaks first (the server, a responder, sends nothing before), so the Terminate goes
/// out and both ends reach the error state.
fn left_rts(p: &Pair, what: &str) {
    let deadline = std::time::Instant::now() + T;
    while p.server.qp.state() == QpState::Rts {
        assert!(std::time::Instant::now() < deadline, "{what}: still in RTS");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    p.client.send(900, send_op(false), vec![]);
    wait_state(&p.server.qp, QpState::Error, what);
    wait_state(&p.client.qp, QpState::Error, what);
}

fn invalid_stag() -> TerminateCode {
    TerminateCode::ddp(1, 0x00)
}

fn base_or_bounds() -> TerminateCode {
    TerminateCode::ddp(1, 0x01)
}

/// Registers `buffer` (64 bytes of 0x11 from byte 16 are written by the peer) and returns what
/// deregistration gives back.
#[expect(unsafe_code, reason = "reads the peer's bytes through the zero-copy view (RDMA contract)")]
fn written_in_place(buffer: Buffer) -> Buffer {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.register_buffer(buffer, RW).unwrap();
    write_then_sync(&p, 1, mr.rkey(), mr.addr() + 16, &[0x11; 64]);
    // In place: the safe borrow and the zero-copy view see the bytes the peer wrote.
    assert!(mr.with_bytes(|b| b[16..80].iter().all(|&x| x == 0x11)));
    // SAFETY: the peer's Write completed (the Send after it was received) and the peer writes
    // nothing more; nothing else writes the region while the slice lives.
    let seen = unsafe { mr.view().as_slice() }[16..80].to_vec();
    assert_eq!(seen, vec![0x11; 64]);
    mr.deregister().unwrap()
}

#[test]
fn every_owned_buffer_is_written_in_place_and_given_back() {
    let initial = pattern(4096, 3);
    let expect = {
        let mut e = initial.clone();
        e[16..80].fill(0x11);
        e
    };
    let mut v = Vec::with_capacity(8192);
    v.extend_from_slice(&initial);
    let ptr = v.as_ptr();
    let Buffer::Vec(back) = written_in_place(v.into()) else { panic!("not the Vec") };
    assert_eq!((back.as_ptr(), back.capacity(), &back[..]), (ptr, 8192, &expect[..]), "the same vector");
    let Buffer::Boxed(back) = written_in_place(initial.clone().into_boxed_slice().into()) else { panic!() };
    assert_eq!(&back[..], &expect[..]);
    let Buffer::BytesMut(back) = written_in_place(Buffer::BytesMut(initial.as_slice().into())) else {
        panic!()
    };
    assert_eq!(&back[..], &expect[..]);
    let mut page = PageBuffer::zeroed(4096);
    page.copy_from_slice(&initial);
    let Buffer::Page(back) = written_in_place(page.into()) else { panic!() };
    assert_eq!(&back[..], &expect[..]);
}

/// Foreign memory (the `ibv_reg_mr` contract) inside a larger allocation: a peer's Writes land
/// in it, and Writes past its end are refused; no byte around it changes.
#[test]
#[expect(unsafe_code, reason = "registering foreign memory is the unsafe ibv_reg_mr contract")]
fn foreign_memory_is_written_in_place_and_nothing_around_it() {
    let mut backing = vec![0x5au8; 256 + 1024 + 256];
    let window = &mut backing[256..256 + 1024];
    let (ptr, len) = (window.as_mut_ptr(), window.len());
    let p = default_pair(PollMode::Adaptive);
    // SAFETY: `backing` outlives the registration (deregistered below before `backing` is read)
    // and nothing else touches it meanwhile.
    let memory = unsafe { RegionMemory::from_raw_parts(ptr, len) };
    let mr = p.server.pd.register_memory(memory, RW).unwrap();
    write_then_sync(&p, 1, mr.rkey(), mr.addr(), &[0x22; 100]);
    write_then_sync(&p, 3, mr.rkey(), mr.addr() + 1024 - 50, &[0x33; 50]);
    assert_eq!(write_is_terminated(&p, mr.rkey(), mr.addr() + 1000, 25), base_or_bounds());
    let Buffer::Foreign(f) = mr.deregister().unwrap() else { panic!("not foreign") };
    assert_eq!((f.as_ptr(), f.len()), (ptr, len));
    assert!(backing[..256].iter().chain(&backing[1280..]).all(|&b| b == 0x5a), "bytes around it changed");
    assert!(backing[256..356].iter().all(|&b| b == 0x22));
    assert!(backing[356..1230].iter().all(|&b| b == 0x5a));
    assert!(backing[1230..1280].iter().all(|&b| b == 0x33));
}

#[test]
fn local_invalidate_and_revalidate_by_fast_register() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.alloc_mr(vec![0u8; 4096]).unwrap();
    assert!(!mr.is_valid(), "allocated invalid");
    // Fast-register the first 2 KiB with a key of the application's choosing.
    let op = mr.fast_register_op(0x42, 2048, RW);
    assert_eq!(mr.rkey().key(), 0x42);
    p.server.send(1, op, vec![]);
    p.server.expect_ok(1, WcOpcode::FastRegister, "fast-register");
    assert!(mr.is_valid());
    write_then_sync(&p, 10, mr.rkey(), mr.addr() + 100, &[0x44; 64]);
    assert!(mr.with_bytes(|b| b[100..164].iter().all(|&x| x == 0x44)));
    // Invalidate it locally: the old STag is refused from now on.
    let old = mr.rkey();
    p.server.send(2, SendOp::LocalInvalidate { stag: old }, vec![]);
    p.server.expect_ok(2, WcOpcode::LocalInvalidate, "local invalidate");
    assert!(!mr.is_valid());
    // Valid again under a new key, over the whole buffer: the new key works, the old fails.
    p.server.send(3, mr.fast_register_op(0x43, 4096, Access::REMOTE_WRITE), vec![]);
    p.server.expect_ok(3, WcOpcode::FastRegister, "re-validate");
    write_then_sync(&p, 20, mr.rkey(), mr.addr() + 4000, &[0x45; 96]);
    assert_eq!(write_is_terminated(&p, old, mr.addr(), 8), invalid_stag());
    let back = mr.deregister().unwrap().into_vec().unwrap();
    assert!(back[100..164].iter().all(|&x| x == 0x44));
    assert!(back[4000..].iter().all(|&x| x == 0x45));
    assert!(back[164..4000].iter().all(|&x| x == 0));
}

#[test]
fn region_used_before_fast_register_is_an_invalid_stag() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.alloc_mr(vec![0u8; 64]).unwrap();
    assert_eq!(write_is_terminated(&p, mr.rkey(), mr.addr(), 8), invalid_stag());
    assert!(mr.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn revalidate_after_send_with_invalidate() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.register(256, RW).unwrap();
    let old = mr.rkey();
    // The client's Send with Invalidate revokes the region's STag on the server.
    p.server.recv(5, vec![]);
    p.client.send(6, SendOp::Send { solicited: false, invalidate: Some(old) }, vec![]);
    let wc = p.server.expect_ok(5, WcOpcode::Recv, "send with invalidate");
    assert_eq!(wc.invalidated, Some(old));
    p.client.expect_ok(6, WcOpcode::Send, "sender");
    assert!(!mr.is_valid());
    // Valid again at once with a new key; the old STag stays dead.
    let new = mr.revalidate(old.key().wrapping_add(7)).unwrap();
    assert_eq!((new.index(), mr.rkey()), (old.index(), new));
    assert!(mr.is_valid());
    write_then_sync(&p, 10, new, mr.addr(), &[0x66; 256]);
    assert_eq!(mr.to_vec(), vec![0x66; 256]);
    assert_eq!(write_is_terminated(&p, old, mr.addr(), 8), invalid_stag());
}

#[test]
fn memory_window_bound_by_a_work_request() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.register(8192, RW).unwrap();
    let mw = p.server.pd.alloc_mw().unwrap();
    assert!(!mw.is_valid(), "allocated unbound");
    // Bind [4096, 5120) of the region for remote write only.
    p.server.send(1, mw.bind_op(0x10, &mr, 4096, 1024, Access::REMOTE_WRITE), vec![]);
    p.server.expect_ok(1, WcOpcode::BindWindow, "bind");
    assert!(mw.is_valid());
    write_then_sync(&p, 10, mw.rkey(), mr.addr() + 4096, &[0x77; 1024]);
    let bytes = mr.to_vec();
    assert!(bytes[4096..5120].iter().all(|&b| b == 0x77));
    assert!(bytes[..4096].iter().chain(&bytes[5120..]).all(|&b| b == 0));
    // The region cannot go while the window is bound to it.
    let (mr, e) = mr.deregister().unwrap_err();
    assert!(e.to_string().contains("windows bound"), "{e}");
    // Invalidate the window (it unbinds), bind it again elsewhere with a new key.
    let old = mw.rkey();
    p.server.send(2, SendOp::LocalInvalidate { stag: old }, vec![]);
    p.server.expect_ok(2, WcOpcode::LocalInvalidate, "invalidate window");
    assert!(!mw.is_valid());
    p.server.send(3, mw.bind_op(0x11, &mr, 0, 512, Access::REMOTE_WRITE), vec![]);
    p.server.expect_ok(3, WcOpcode::BindWindow, "bind again");
    write_then_sync(&p, 20, mw.rkey(), mr.addr(), &[0x78; 512]);
    assert!(mr.to_vec()[..512].iter().all(|&b| b == 0x78));
    // Past the window's end, though inside the region: a base-or-bounds violation.
    assert_eq!(write_is_terminated(&p, mw.rkey(), mr.addr() + 500, 20), base_or_bounds());
    assert!(mr.to_vec()[512..4096].iter().all(|&b| b == 0), "nothing past the window");
    drop(mw);
    assert_eq!(mr.deregister().unwrap().into_vec().unwrap().len(), 8192);
}

#[test]
fn invalidated_window_is_an_invalid_stag() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.register(1024, RW).unwrap();
    let mw = p.server.pd.alloc_mw().unwrap();
    p.server.send(1, mw.bind_op(1, &mr, 0, 1024, Access::REMOTE_WRITE), vec![]);
    p.server.expect_ok(1, WcOpcode::BindWindow, "bind");
    p.server.send(2, SendOp::LocalInvalidate { stag: mw.rkey() }, vec![]);
    p.server.expect_ok(2, WcOpcode::LocalInvalidate, "invalidate");
    assert_eq!(write_is_terminated(&p, mw.rkey(), mr.addr(), 8), invalid_stag());
    assert!(mr.to_vec().iter().all(|&b| b == 0));
}

/// A region with a memory window bound keeps its registration while the window is bound: a
/// local invalidate of it fails (as a deregistration does), so no fast-register can give it
/// fewer rights or a shorter range under the window, which would keep the rights it was bound
/// with. Once the window is invalidated (unbound), the region may be invalidated and
/// registered anew, and the old window's STag reaches nothing.
#[test]
fn region_with_a_window_bound_is_not_invalidated_or_registered_anew() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.alloc_mr(vec![0u8; 4096]).unwrap();
    p.server.send(1, mr.fast_register_op(0x42, 4096, RW), vec![]);
    p.server.expect_ok(1, WcOpcode::FastRegister, "fast-register");
    let mw = p.server.pd.alloc_mw().unwrap();
    p.server.send(2, mw.bind_op(0x10, &mr, 0, 4096, Access::REMOTE_WRITE), vec![]);
    p.server.expect_ok(2, WcOpcode::BindWindow, "bind");
    // Invalidate the region, then fast-register it read-only: the first step fails, the second
    // is flushed with the queue pair.
    p.server.send(3, SendOp::LocalInvalidate { stag: mr.rkey() }, vec![]);
    p.server.send(4, mr.fast_register_op(0x43, 16, Access::REMOTE_READ), vec![]);
    let wc = p.server.wait("invalidate");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (3, WcOpcode::LocalInvalidate, WcStatus::LocalProtectionError)
    );
    assert_eq!(p.server.wait("fast-register").status, WcStatus::WrFlushError);
    assert!(mw.is_valid(), "the window is untouched");
    left_rts(&p, "invalidator");
    assert!(mr.to_vec().iter().all(|&b| b == 0));

    // Unbound first, the region may go through the same steps; the window's STag is dead.
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.alloc_mr(vec![0u8; 4096]).unwrap();
    p.server.send(1, mr.fast_register_op(0x42, 4096, RW), vec![]);
    let mw = p.server.pd.alloc_mw().unwrap();
    p.server.send(2, mw.bind_op(0x10, &mr, 0, 4096, Access::REMOTE_WRITE), vec![]);
    p.server.send(3, SendOp::LocalInvalidate { stag: mw.rkey() }, vec![]);
    p.server.send(4, SendOp::LocalInvalidate { stag: mr.rkey() }, vec![]);
    p.server.send(5, mr.fast_register_op(0x43, 16, Access::REMOTE_READ), vec![]);
    for (id, op) in [
        (1, WcOpcode::FastRegister),
        (2, WcOpcode::BindWindow),
        (3, WcOpcode::LocalInvalidate),
        (4, WcOpcode::LocalInvalidate),
        (5, WcOpcode::FastRegister),
    ] {
        p.server.expect_ok(id, op, "memory work request");
    }
    assert!(!mw.is_valid());
    assert_eq!(write_is_terminated(&p, mw.rkey(), mr.addr(), 8), invalid_stag());
    assert!(mr.to_vec().iter().all(|&b| b == 0));
}

/// Binding outside the region, or with rights the region lacks, fails the work request (and,
/// as any failed work request in verbs, the queue pair).
#[test]
fn refused_bind_completes_in_error() {
    for (offset, len, access) in [(1000, 100, Access::REMOTE_WRITE), (0, 8, Access::REMOTE_ATOMIC)] {
        let p = default_pair(PollMode::Adaptive);
        let mr = p.server.pd.register(1024, RW).unwrap();
        let mw = p.server.pd.alloc_mw().unwrap();
        p.server.send(1, mw.bind_op(1, &mr, offset, len, access), vec![]);
        let wc = p.server.wait("bind");
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (1, WcOpcode::BindWindow, WcStatus::LocalProtectionError)
        );
        assert!(!mw.is_valid());
        left_rts(&p, "binder");
    }
}

/// A local invalidate of an STag of another protection domain, or of none, fails.
#[test]
fn refused_local_invalidate_completes_in_error() {
    let p = default_pair(PollMode::Adaptive);
    // A region of another protection domain on the server's device.
    let other = p._devs.last().unwrap().alloc_pd().register(64, RW).unwrap();
    p.server.send(1, SendOp::LocalInvalidate { stag: other.rkey() }, vec![]);
    let wc = p.server.wait("invalidate");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (1, WcOpcode::LocalInvalidate, WcStatus::LocalProtectionError)
    );
    assert!(other.is_valid(), "another domain's region is untouched");
    left_rts(&p, "invalidator");
    // And an STag nobody registered, on a fresh connection.
    let p = default_pair(PollMode::Adaptive);
    p.server.send(1, SendOp::LocalInvalidate { stag: STag(0x00ab_cd00) }, vec![]);
    assert_eq!(p.server.wait("invalidate").status, WcStatus::LocalProtectionError);
}

#[test]
fn memory_work_requests_take_no_sgl() {
    let p = default_pair(PollMode::Adaptive);
    let mr = p.server.pd.register(64, RW).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::LocalInvalidate { stag: mr.rkey() },
        sgl: mr.sge_all().into(),
        signaled: true,
    };
    assert_eq!(p.server.qp.post_send(wr), Err(PostError::BadSgl));
    assert!(mr.is_valid());
}

/// Regions of every size the API allows are refused or accepted with a clear error, and a
/// refused owned buffer is dropped, never registered.
#[test]
fn registration_errors() {
    let p = default_pair(PollMode::Adaptive);
    let e = p.server.pd.register_buffer(Vec::new(), RW).unwrap_err();
    assert_eq!(e.to_string(), "cannot register 0 bytes (1 to 4 GiB - 1)");
    assert!(p.server.pd.alloc_mr(Vec::new()).is_err());
    let mr: MemoryRegion = p.server.pd.register_buffer(vec![1u8], RW).unwrap();
    assert_eq!(mr.len(), 1);
}

/// A Write, a Read and a Send of 4 MiB each between two devices over kernel TCP: the data
/// arrives intact with large payloads moved straight between the sockets and registered
/// memory (received into place, sent from where they are), and, with
/// `DeviceConfig::zero_copy` off, through the engines' buffers, none of it in place.
#[test]
fn large_payloads_move_in_place_unless_zero_copy_is_off() {
    for zero_copy in [true, false] {
        let config = iwarp::DeviceConfig { zero_copy, ..iwarp::DeviceConfig::default() };
        let devs = [iwarp::Device::open(config), iwarp::Device::open(config)];
        let opts = iwarp::ConnectOptions::default();
        let (client, server, _, _) = connect_on(&devs[0], &devs[1], &opts, &opts);
        let len = 4 * MIB;
        let src = client.pd.register_bytes(&pattern(len, 1), Access::NONE).unwrap();
        let sink = client.pd.register(len, Access::LOCAL_WRITE).unwrap();
        let wdst = server.pd.register(len, RW).unwrap();
        let rsrc = server.pd.register_bytes(&pattern(len, 2), RW).unwrap();
        let rcv = server.pd.register(len, Access::LOCAL_WRITE).unwrap();
        server.recv(9, vec![rcv.sge_all()]);
        let write = SendOp::Write { remote_stag: wdst.rkey(), remote_to: wdst.addr() };
        client.send(1, write, vec![src.sge_all()]);
        let read = SendOp::Read { remote_stag: rsrc.rkey(), remote_to: rsrc.addr() };
        client.send(2, read, vec![sink.sge_all()]);
        client.send(3, send_op(false), vec![src.sge_all()]);
        client.expect_ok(1, WcOpcode::Write, "write");
        client.expect_ok(2, WcOpcode::Read, "read");
        client.expect_ok(3, WcOpcode::Send, "send");
        server.expect_ok(9, WcOpcode::Recv, "receive");
        assert!(wdst.to_vec() == pattern(len, 1), "zero_copy {zero_copy}: written");
        assert!(sink.to_vec() == pattern(len, 2), "zero_copy {zero_copy}: read");
        assert!(rcv.to_vec() == pattern(len, 1), "zero_copy {zero_copy}: sent");
        let (c, s) = (devs[0].stats(), devs[1].stats());
        let (in_place, by_ref) = (c.rx_in_place + s.rx_in_place, c.tx_by_ref + s.tx_by_ref);
        if zero_copy {
            // 12 MiB of payload each way in all; most of it moves in place (the first FPDUs of
            // a burst may come whole through the receive buffer).
            assert!(in_place > (len as u64), "{c:?} {s:?}");
            assert!(by_ref > (2 * len as u64), "{c:?} {s:?}");
        } else {
            assert_eq!((in_place, by_ref), (0, 0), "{c:?} {s:?}");
        }
        drop((client, server));
    }
}
