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
                recv: vec![RecvWr { wr_id: 77, sgl: vec![inbox.sge(0, 64)] }],
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
                sgl: vec![msg.sge(0, 5)],
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
