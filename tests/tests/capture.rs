//! A connection made through the API with `ConnectOptions::capture` records a pcap that the
//! dissector decodes whole: the MPA exchange, every FPDU with a good CRC, no violation.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use std::time::Duration;

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::netdev::PcapWriter;
use iwarp::{Access, ConnectOptions, Device, DeviceConfig, RecvWr, SendOp, SendWr, WcStatus};

#[test]
fn captured_connection_dissects_cleanly() {
    let path = std::env::temp_dir().join(format!("iwarp-capture-{}.pcap", std::process::id()));
    let writer = PcapWriter::create(&path).unwrap().shared();
    {
        let device = Device::open(DeviceConfig::default());
        let pd = device.alloc_pd();
        let cq = device.create_cq(64);
        let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = ConnectOptions {
            policy: Policy { crc: CrcPolicy::Wanted, ..ConnectOptions::default().policy },
            capture: Some(writer.clone()),
            ..ConnectOptions::default()
        };
        let server = {
            let (pd, cq) = (pd.clone(), cq.clone());
            let opts = ConnectOptions { capture: None, ..opts.clone() };
            std::thread::spawn(move || {
                listener.accept(Duration::from_secs(5)).unwrap().accept(&pd, &cq, &cq, &opts).unwrap()
            })
        };
        let client = device.connect(addr, &pd, &cq, &cq, &opts).unwrap();
        let server_qp = server.join().unwrap();
        let target = pd.register(100_000, Access::REMOTE_WRITE).unwrap();
        let source = pd.register_bytes(&vec![7u8; 100_000], Access::NONE).unwrap();
        let recv = pd.register(64, Access::LOCAL_WRITE).unwrap();
        server_qp.post_recv(RecvWr { wr_id: 9, sgl: recv.sge(0, 64).into() }).unwrap();
        client
            .qp
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Write { remote_stag: target.rkey(), remote_to: target.addr() },
                sgl: source.sge_all().into(),
                signaled: true,
            })
            .unwrap();
        client
            .qp
            .post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: source.sge(0, 64).into(),
                signaled: true,
            })
            .unwrap();
        let mut ids = Vec::new();
        while ids.len() < 3 {
            let wc = cq.wait(Duration::from_secs(10)).expect("completion");
            assert_eq!(wc.status, WcStatus::Success);
            ids.push(wc.wr_id);
        }
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 9]);
        client.qp.disconnect();
        // Let the engine see the close and drop the links (which flushes the capture).
        let t = std::time::Instant::now();
        while device.connections() > 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    writer.lock().unwrap().flush().unwrap();
    let report = iwarp_dissect::dissect_file(&path, &Default::default()).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(report.mpa_connections(), 1, "{report:?}");
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    let conn = report.connections.iter().find(|c| c.mpa).unwrap();
    assert!(conn.negotiated.is_some());
    // 100000 bytes in ~64 KiB FPDUs on loopback, plus the Send.
    assert!(report.fpdus() >= 3, "{} FPDUs", report.fpdus());
}
