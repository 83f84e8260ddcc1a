//! Lists of work requests posted in one call (`QueuePair::post_send_list`,
//! `post_recv_list`, verbs' `ibv_post_send` / `ibv_post_recv` with a chain): every request of
//! a list completes exactly once, in posting order; a list with a bad request in the middle
//! posts the ones before it, names the bad one (verbs' `bad_wr`) and posts nothing after it;
//! and completions pushed in batches are neither lost nor reordered when the connection goes
//! down under them.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]
#![allow(clippy::cast_possible_truncation, reason = "test sizes are small")]

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, PostError,
    PostListError, QpState, QueuePair, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};

/// The longest any single wait may take.
const T: Duration = Duration::from_secs(10);

/// One end: its device, completion queue, queue pair and a region for messages.
struct End {
    _dev: Device,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

/// Two devices (two engines, as two hosts), connected, with `depth` work requests per queue.
fn pair(mode: PollMode, depth: usize) -> (End, End) {
    let open = || Device::open(DeviceConfig { poll_mode: mode, ..DeviceConfig::default() });
    let (cdev, sdev) = (open(), open());
    let listener = sdev.listen("127.0.0.1:0".parse::<SocketAddr>().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (cpd, spd) = (cdev.alloc_pd(), sdev.alloc_pd());
    let (ccq, scq) = (cdev.create_cq(4 * depth), sdev.create_cq(4 * depth));
    let opts = ConnectOptions { max_send_wr: depth, max_recv_wr: depth, ..ConnectOptions::default() };
    let accepting = {
        let (spd, scq, opts) = (spd.clone(), scq.clone(), opts.clone());
        thread::spawn(move || listener.accept(T).unwrap().accept(&spd, &scq, &scq, &opts).unwrap())
    };
    let cqp = cdev.connect(addr, &cpd, &ccq, &ccq, &opts).unwrap().qp;
    let sqp = accepting.join().unwrap();
    let rights = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    let (cmr, smr) = (cpd.register(64 * depth, rights).unwrap(), spd.register(64 * depth, rights).unwrap());
    (End { _dev: cdev, cq: ccq, qp: cqp, mr: cmr }, End { _dev: sdev, cq: scq, qp: sqp, mr: smr })
}

fn send(end: &End, wr_id: u64, at: usize, len: u32) -> SendWr {
    let op = SendOp::Send { solicited: false, invalidate: None };
    SendWr { wr_id, op, sgl: end.mr.sge(at, len).into(), signaled: true }
}

fn recv(end: &End, wr_id: u64, at: usize) -> RecvWr {
    RecvWr { wr_id, sgl: end.mr.sge(at, 64).into() }
}

/// `n` completions of `cq`, in the order they come.
fn collect(cq: &CompletionQueue, n: usize, what: &str) -> Vec<WorkCompletion> {
    (0..n).map(|i| cq.wait(T).unwrap_or_else(|| panic!("{what}: completion {i} of {n} missing"))).collect()
}

fn wait_state(qp: &QueuePair, state: QpState, what: &str) {
    let deadline = std::time::Instant::now() + T;
    while qp.state() != state {
        assert!(std::time::Instant::now() < deadline, "{what}: still {:?}", qp.state());
        thread::sleep(Duration::from_millis(1));
    }
}

/// A chain of receives and a chain of Sends, 64 bytes apart in the regions: every request
/// completes once, in posting order, and every message lands in its own receive.
#[test]
fn every_request_of_a_list_completes_once_in_order() {
    for mode in [PollMode::Adaptive, PollMode::Event, PollMode::Busy] {
        const N: usize = 100;
        let (client, server) = pair(mode, N);
        server.qp.post_recv_list((0..N).map(|i| recv(&server, 1000 + i as u64, 64 * i))).unwrap();
        for i in 0..N {
            client.mr.write(64 * i, &[i as u8; 64]).unwrap();
        }
        client
            .qp
            .post_send_list((0..N).map(|i| send(&client, i as u64, 64 * i, 1 + (i % 64) as u32)))
            .unwrap();
        let sent = collect(&client.cq, N, "client");
        let got: Vec<_> = sent.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
        let expect: Vec<_> = (0..N).map(|i| (i as u64, WcStatus::Success, WcOpcode::Send)).collect();
        assert_eq!(got, expect, "{mode:?}");
        let received = collect(&server.cq, N, "server");
        let got: Vec<_> = received.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect();
        let expect: Vec<_> =
            (0..N).map(|i| (1000 + i as u64, WcStatus::Success, 1 + (i % 64) as u64)).collect();
        assert_eq!(got, expect, "{mode:?}");
        let mut bytes = vec![0u8; 64 * N];
        server.mr.read(0, &mut bytes).unwrap();
        for (i, b) in bytes.chunks(64).enumerate() {
            assert!(b[..1 + i % 64].iter().all(|&x| x == i as u8), "{mode:?}: message {i}");
        }
        // Nothing completes twice.
        thread::sleep(Duration::from_millis(20));
        assert!(client.cq.poll().is_none() && server.cq.poll().is_none(), "{mode:?}");
    }
}

/// A bad request in the middle of a list: the ones before it are posted and complete, the
/// error names it, and nothing after it is posted (its queue slots stay free).
#[test]
fn a_bad_request_in_a_list_stops_the_list_there() {
    const N: usize = 8;
    let (client, server) = pair(PollMode::Adaptive, N);
    server.qp.post_recv_list((0..N).map(|i| recv(&server, 100 + i as u64, 64 * i))).unwrap();
    // The fourth Send is an RDMA Read with two local elements, which the queue pair refuses.
    let bad = bad_read(&client, &server);
    let list = (0..3)
        .map(|i| send(&client, i, 0, 8))
        .chain([bad])
        .chain((4..N as u64).map(|i| send(&client, i, 0, 8)));
    let err = client.qp.post_send_list(list).unwrap_err();
    assert_eq!(err, PostListError { posted: 3, error: PostError::ReadNeedsOneSge });
    let wcs = collect(&client.cq, 3, "client");
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(collect(&server.cq, 3, "server").iter().map(|w| w.wr_id).collect::<Vec<_>>(), [100, 101, 102]);
    thread::sleep(Duration::from_millis(20));
    assert!(client.cq.poll().is_none(), "a request after the bad one was posted");
    assert!(server.cq.poll().is_none(), "a request after the bad one was sent");
    // The requests after the bad one took no slots: the rest of the queue is free.
    client.qp.post_send_list((10..10 + N as u64 - 3).map(|i| send(&client, i, 0, 8))).unwrap();
    let wcs = collect(&client.cq, N - 3, "client");
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (10..10 + N as u64 - 3).collect::<Vec<_>>());

    // A list longer than the room left in a queue: posted up to the room, the next named.
    let (client, _server) = pair(PollMode::Adaptive, N);
    let err = client.qp.post_recv_list((0..N as u64 + 5).map(|i| recv(&client, i, 0))).unwrap_err();
    assert_eq!(err, PostListError { posted: N, error: PostError::QueueFull });
    client.qp.disconnect();
    let wcs = collect(&client.cq, N, "client");
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..N as u64).collect::<Vec<_>>());
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushError), "{wcs:?}");
    thread::sleep(Duration::from_millis(20));
    assert!(client.cq.poll().is_none(), "a receive past the queue's depth was posted");

    // Lists go in by chunks of a few requests: a full queue is found inside a later chunk,
    // and it stops the list before a bad request that comes after it.
    const DEEP: usize = 20;
    let (client, _server) = pair(PollMode::Adaptive, DEEP);
    let err = client.qp.post_recv_list((0..2 * DEEP as u64).map(|i| recv(&client, i, 0))).unwrap_err();
    assert_eq!(err, PostListError { posted: DEEP, error: PostError::QueueFull });
    // Two elements of 4 GiB - 1: a total no message length holds.
    let too_long = |end: &End| {
        let huge = Sge { lkey: end.mr.lkey(), addr: end.mr.addr(), len: u32::MAX };
        RecvWr { wr_id: 99, sgl: vec![huge; 2].into() }
    };
    let (client, _server) = pair(PollMode::Adaptive, N);
    let list = (0..N as u64 + 2).map(|i| recv(&client, i, 0)).chain([too_long(&client)]);
    assert_eq!(
        client.qp.post_recv_list(list).unwrap_err(),
        PostListError { posted: N, error: PostError::QueueFull }
    );
    let (client, _server) = pair(PollMode::Adaptive, N);
    let list = (0..2).map(|i| recv(&client, i, 0)).chain([too_long(&client)]);
    assert_eq!(
        client.qp.post_recv_list(list).unwrap_err(),
        PostListError { posted: 2, error: PostError::TooLong }
    );

    // Lists of one (which skip the chunk) and empty lists: the same answers.
    let (client, server) = pair(PollMode::Adaptive, 1);
    client.qp.post_recv_list(std::iter::empty()).unwrap();
    assert_eq!(
        client.qp.post_recv_list([too_long(&client)]).unwrap_err(),
        PostListError { posted: 0, error: PostError::TooLong }
    );
    client.qp.post_recv_list([recv(&client, 1, 0)]).unwrap();
    assert_eq!(
        client.qp.post_recv_list([recv(&client, 2, 0)]).unwrap_err(),
        PostListError { posted: 0, error: PostError::QueueFull }
    );
    client.qp.post_send_list(std::iter::empty()).unwrap();
    assert_eq!(
        client.qp.post_send_list([bad_read(&client, &server)]).unwrap_err(),
        PostListError { posted: 0, error: PostError::ReadNeedsOneSge }
    );
    client.qp.disconnect();
    let wcs = collect(&client.cq, 1, "client");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::WrFlushError), "{wcs:?}");
    thread::sleep(Duration::from_millis(20));
    assert!(client.cq.poll().is_none(), "a refused request of a list of one was posted");
}

/// An RDMA Read with two local elements, which the queue pair refuses.
fn bad_read(client: &End, server: &End) -> SendWr {
    SendWr {
        wr_id: 3,
        op: SendOp::Read { remote_stag: server.mr.rkey(), remote_to: server.mr.addr() },
        sgl: vec![client.mr.sge(0, 8), client.mr.sge(8, 8)].into(),
        signaled: true,
    }
}

/// Completions pushed in batches when the connection goes down under a stream: a list of
/// receives, part of it consumed by a list of Sends, then a disconnect; every receive
/// completes once, in posting order, the consumed ones successfully and the rest flushed.
#[test]
fn batched_completions_survive_a_disconnect_in_order() {
    for mode in [PollMode::Adaptive, PollMode::Event] {
        const N: usize = 64;
        const SENT: usize = 40;
        let (client, server) = pair(mode, N);
        server.qp.post_recv_list((0..N).map(|i| recv(&server, i as u64, 64 * i))).unwrap();
        client.qp.post_send_list((0..SENT).map(|i| send(&client, i as u64, 0, 64))).unwrap();
        let sent = collect(&client.cq, SENT, "client");
        assert_eq!(sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(), (0..SENT as u64).collect::<Vec<_>>());
        // The Sends were handed to TCP before the stream closes behind them: the server reads
        // them all before the end of the stream, whenever it gets to them.
        client.qp.disconnect();
        // The end of the stream comes in with (or right behind) the last Sends: the server
        // must read on past them to see it, or the rest of its receives never flush.
        let wcs = collect(&server.cq, N, &format!("{mode:?} server"));
        assert_eq!(
            wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (0..N as u64).collect::<Vec<_>>(),
            "{mode:?}"
        );
        for w in &wcs {
            let expect = if (w.wr_id as usize) < SENT { WcStatus::Success } else { WcStatus::WrFlushError };
            assert_eq!(w.status, expect, "{mode:?}: {w:?}");
        }
        wait_state(&server.qp, QpState::Error, "server");
        thread::sleep(Duration::from_millis(20));
        assert!(server.cq.poll().is_none(), "{mode:?}: a receive completed twice");
    }
}
