//! Receive buffers given in `ConnectOptions::recv` are posted before the connection goes
//! live: a Send that the initiator posts the moment `connect` returns always finds one.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::time::Duration;

use iwarp::{
    Access, ConnectOptions, Device, DeviceConfig, PollMode, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

#[test]
fn receives_posted_before_accept_catch_the_first_send() {
    for _ in 0..5 {
        let device = Device::open(DeviceConfig { poll_mode: PollMode::Busy, ..DeviceConfig::default() });
        let pd = device.alloc_pd();
        let cq = device.create_cq(64);
        let inbox = pd.register(64, Access::LOCAL_WRITE).unwrap();
        let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = {
            let (pd, cq) = (pd.clone(), cq.clone());
            let opts = ConnectOptions {
                recv: vec![RecvWr { wr_id: 77, sgl: inbox.sge(0, 64).into() }],
                ..ConnectOptions::default()
            };
            std::thread::spawn(move || {
                listener.accept(Duration::from_secs(5)).unwrap().accept(&pd, &cq, &cq, &opts).unwrap()
            })
        };
        let client = device.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap();
        let msg = pd.register_bytes(b"first", Access::NONE).unwrap();
        client
            .qp
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: msg.sge(0, 5).into(),
                signaled: true,
            })
            .unwrap();
        let _server_qp = server.join().unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            let wc = cq.wait(Duration::from_secs(10)).expect("completion");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            got.push((wc.wr_id, wc.opcode));
        }
        got.sort_by_key(|g| g.0);
        assert_eq!(got, vec![(1, WcOpcode::Send), (77, WcOpcode::Recv)]);
        assert_eq!(&inbox.to_vec()[..5], b"first");
    }
}

#[test]
fn two_connections_share_a_receive_queue() {
    let device = Device::open(DeviceConfig::default());
    let pd = device.alloc_pd();
    let cq = device.create_cq(64);
    let srq = device.create_srq(16);
    let inbox = pd.register(4 * 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..4usize {
        srq.post_recv(RecvWr { wr_id: 100 + i as u64, sgl: inbox.sge(i * 64, 64).into() }).unwrap();
    }
    let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = {
        let (pd, cq) = (pd.clone(), cq.clone());
        let opts = ConnectOptions { srq: Some(srq.clone()), ..ConnectOptions::default() };
        std::thread::spawn(move || {
            (0..2)
                .map(|_| {
                    listener.accept(Duration::from_secs(5)).unwrap().accept(&pd, &cq, &cq, &opts).unwrap()
                })
                .collect::<Vec<_>>()
        })
    };
    let clients: Vec<_> =
        (0..2).map(|_| device.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap().qp).collect();
    let servers = server.join().unwrap();
    assert_eq!(servers[0].post_recv(RecvWr { wr_id: 1, sgl: vec![].into() }), Err(iwarp::PostError::UsesSrq));
    let msg = pd.register_bytes(b"hello", Access::NONE).unwrap();
    for (i, c) in clients.iter().enumerate() {
        c.post_send(SendWr {
            wr_id: i as u64,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: msg.sge(0, 5).into(),
            signaled: false,
        })
        .unwrap();
    }
    let mut recvs = Vec::new();
    while recvs.len() < 2 {
        let wc = cq.wait(Duration::from_secs(10)).expect("completion");
        if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::Success {
            recvs.push(wc.wr_id);
        }
    }
    recvs.sort_unstable();
    assert_eq!(recvs, vec![100, 101], "the first two buffers, one per connection");
    assert_eq!(srq.len(), 2);
}

/// The receives given with the connection hold their places in the receive queue: a queue
/// filled that way takes no more until one completes (posting past it used to be accepted,
/// then refused by the queue pair, completing with `LocalLengthError`), and each completion
/// makes room for exactly one more.
#[test]
fn receives_given_with_the_connection_fill_the_receive_queue() {
    const DEPTH: usize = 4;
    let device = Device::open(DeviceConfig::default());
    let pd = device.alloc_pd();
    let cq = device.create_cq(64);
    let inbox = pd.register(DEPTH * 64, Access::LOCAL_WRITE).unwrap();
    let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let sge = inbox.sge(0, 64);
    let recv = move |i: usize| RecvWr { wr_id: i as u64, sgl: vec![sge].into() };
    let opts = ConnectOptions {
        max_recv_wr: DEPTH,
        recv: (0..DEPTH).map(recv).collect(),
        ..ConnectOptions::default()
    };
    let server = {
        let (pd, cq) = (pd.clone(), cq.clone());
        std::thread::spawn(move || {
            listener.accept(Duration::from_secs(5)).unwrap().accept(&pd, &cq, &cq, &opts).unwrap()
        })
    };
    // The initiator sends (an MPA responder waits for the initiator's first FPDU).
    let client = device.connect(addr, &pd, &cq, &cq, &ConnectOptions::default()).unwrap().qp;
    let server = server.join().unwrap();
    assert_eq!(server.post_recv(recv(DEPTH)), Err(iwarp::PostError::QueueFull), "the queue is full already");
    let msg = pd.register_bytes(b"ping", Access::NONE).unwrap();
    let send = |wr_id| SendWr {
        wr_id,
        op: SendOp::Send { solicited: false, invalidate: None },
        sgl: msg.sge(0, 4).into(),
        signaled: true,
    };
    for i in 0..2 * DEPTH {
        client.post_send(send(1000 + i as u64)).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            let wc = cq.wait(Duration::from_secs(10)).unwrap_or_else(|| panic!("round {i}: {got:?}"));
            assert_eq!(wc.status, WcStatus::Success, "round {i}: {wc:?}");
            got.push((wc.wr_id, wc.opcode));
        }
        got.sort_by_key(|g| g.0);
        assert_eq!(got, vec![(i as u64, WcOpcode::Recv), (1000 + i as u64, WcOpcode::Send)]);
        // One completed: room for one, and no more.
        server.post_recv(recv(DEPTH + i)).unwrap();
        assert_eq!(server.post_recv(recv(DEPTH + i + 1)), Err(iwarp::PostError::QueueFull), "round {i}");
    }
}
