//! `iwarp perftest`: against siw's wire format and captures, client and server, smoltcp.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

/// perftest's control-message encoders, shared with the binary.
#[path = "../src/perftest/wire.rs"]
#[allow(dead_code, reason = "the tests use part of the module")]
mod perftest_wire;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_dissect::ddp::Model;
use iwarp_dissect::{Dir, Options, dissect_file};

use common::{SmolNetns, Temp, data, iwarp, stderr, stdout, wait_bounded};
use perftest_wire::{self as wire, KeyRecord, Report};

const BIN: &str = env!("CARGO_BIN_EXE_iwarp");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An `iwarp perftest` server child; killed (by its own PID) and reaped on drop.
struct Server {
    child: Option<Child>,
    port: u16,
    stdout: Option<JoinHandle<String>>,
}

impl Server {
    fn start(test: &str, extra: &[&str]) -> Server {
        let port = free_port();
        let p = port.to_string();
        let mut child = Command::new(BIN)
            .args(["perftest", test, "--bind", "127.0.0.1", "-p", &p, "--accept-timeout", "60"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.contains("Waiting for client to connect") {
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("the server did not start listening");
        Server { child: Some(child), port, stdout: Some(stdout) }
    }

    /// Waits (20 s at most) for the server to exit: its exit code and stdout.
    fn wait_exit(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let child = self.child.as_mut().unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the server did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        self.child = None;
        (status.code(), self.stdout.take().unwrap().join().unwrap())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The numbers of perftest's result line (the line after the `#bytes` header).
fn result_line(out: &str) -> (u64, u64, f64, f64, f64) {
    let mut lines = out.lines();
    lines.find(|l| l.starts_with(" #bytes     #iterations    BW peak[MB/sec]")).expect(out);
    let line = lines.next().expect(out);
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 5, "{line}");
    (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
        f[4].parse().unwrap(),
    )
}

/// Runs server and client of `test`; returns (server stdout, client stdout).
fn run_pair(test: &str, args: &[&str], client_extra: &[&str]) -> (String, String) {
    run_pair_with(test, args, &[], client_extra)
}

/// [`run_pair`] with flags for the server only too.
fn run_pair_with(
    test: &str,
    args: &[&str],
    server_extra: &[&str],
    client_extra: &[&str],
) -> (String, String) {
    let server = Server::start(test, &[args, server_extra].concat());
    let p = server.port.to_string();
    let mut all = vec!["perftest", test, "127.0.0.1", "-p", &p];
    all.extend_from_slice(args);
    all.extend_from_slice(client_extra);
    let o = iwarp(&all);
    assert_eq!(o.status.code(), Some(0), "client: {}", stderr(&o));
    let (code, out) = server.wait_exit();
    assert_eq!(code, Some(0), "server stdout: {out}");
    (out, stdout(&o))
}

fn check_pair(test: &str, title: &str) {
    check_pair_with(test, title, &[], &[]);
}

/// [`check_pair`] with flags for each side (`--device`).
fn check_pair_with(test: &str, title: &str, server_extra: &[&str], client_extra: &[&str]) {
    let (srv, cli) = run_pair_with(test, &["-n", "100", "-s", "4096"], server_extra, client_extra);
    for (out, extra) in [(&srv, server_extra), (&cli, client_extra)] {
        assert!(out.contains(title), "{out}");
        assert!(out.contains(" Number of qps   : 1\t\tTransport type : IW\n"), "{out}");
        // The seam shows no queue pair numbers: 0, which perftest's format prints as 000000.
        let qpn = if extra.is_empty() { "QPN 0x" } else { "QPN 000000 " };
        assert!(out.contains(&format!(" local address: LID 0000 {qpn}")), "{out}");
    }
    assert!(srv.contains("* Waiting for client to connect... *"), "{srv}");
    let (size, iters, peak, avg, rate) = result_line(&cli);
    assert_eq!((size, iters), (4096, 100), "{cli}");
    assert!(avg > 0.0 && peak >= avg * 0.99 && rate > 0.0, "{cli}");
    let s = result_line(&srv);
    assert_eq!((s.0, s.1), (4096, 100), "{srv}");
    assert!(s.3 > 0.0, "{srv}");
    if test == "send" {
        assert_eq!(s.2, 0.0, "send_bw's server peak is 0.00: {srv}");
        assert!(srv.contains(" RX depth        : 100"), "{srv}");
    } else {
        // The server prints the client's reported numbers.
        assert_eq!(s, (size, iters, peak, avg, rate), "{srv}\n{cli}");
    }
}

#[test]
fn write_server_and_client() {
    check_pair("write", "RDMA_Write BW Test");
}

#[test]
fn read_server_and_client() {
    check_pair("read", "RDMA_Read BW Test");
}

#[test]
fn send_server_and_client() {
    check_pair("send", "Send BW Test");
}

#[test]
fn send_duration_mode_and_gbits() {
    let (srv, cli) = run_pair("send", &["-D", "1", "-s", "4096", "--report_gbits"], &[]);
    for out in [&srv, &cli] {
        let line = out.lines().find(|l| l.starts_with(" #bytes")).expect(out);
        assert!(line.contains("BW average[Gb/sec]"), "{out}");
    }
    let mut lines = cli.lines().skip_while(|l| !l.starts_with(" #bytes"));
    let f: Vec<f64> = lines.nth(1).unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert!(f[1] > 0.0 && f[2] == 0.0 && f[3] > 0.0, "{cli}");
}

#[test]
fn bad_flags_fail_clearly() {
    for (args, needle) in [
        (&["perftest"][..], "required"),
        (&["perftest", "atomic"], "invalid value"),
        (&["perftest", "write", "-s", "0"], "-s"),
        (&["perftest", "write", "-s", "8388609"], "-s"),
        (&["perftest", "write", "-n", "4"], "--iters"),
        (&["perftest", "write", "-n", "10", "-D", "2"], "cannot be used with"),
        (&["perftest", "write", "-p", "70000"], "--port"),
        (&["perftest", "read", "-o", "129"], "--outs"),
        (&["perftest", "send", "--bogus"], "--bogus"),
        (&["perftest", "write", "--accept-timeout", "18446744073709551615"], "--accept-timeout"),
    ] {
        let o = iwarp(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains("error:") && e.contains(needle), "{args:?}: {e}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let o = iwarp(&["perftest", "write", "127.0.0.1", "--bind", "127.0.0.1"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "perftest: --bind and --accept-timeout are server options (no ADDRESS)\n");
    let o = iwarp(&["perftest", "write", "--first-fpdu-delay", "5", "--accept-timeout", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("client option"), "{}", stderr(&o));
    // -R and -F are accepted.
    let o = iwarp(&["perftest", "--help"]);
    assert!(o.status.success());
    let s = stdout(&o);
    for word in
        ["--rdma_cm", "--CPU-freq", "--size", "--iters", "--duration", "--report_gbits", "Exit status"]
    {
        assert!(s.contains(word), "{word}: {s}");
    }
}

/// `--device iwarp` drives the engine through the backend seam: both ends through it, and
/// each end through it against the other without, for each test; the same table as without
/// the flag, the device's name in it.
#[test]
fn device_iwarp_runs_each_test_through_the_seam() {
    let seam = ["--device", "iwarp"];
    for (test, title) in
        [("write", "RDMA_Write BW Test"), ("read", "RDMA_Read BW Test"), ("send", "Send BW Test")]
    {
        check_pair_with(test, title, &seam, &seam);
        check_pair_with(test, title, &seam, &[]);
        check_pair_with(test, title, &[], &seam);
    }
    let (srv, cli) = run_pair_with("read", &["-n", "20", "-s", "100000", "-o", "16"], &seam, &seam);
    for out in [&srv, &cli] {
        assert!(out.contains("Device         : iwarp\n"), "{out}");
        assert!(out.contains(" Outstand reads  : 16\n"), "{out}");
    }
    assert_eq!(result_line(&cli).1, 20, "{cli}");
}

/// Duration mode through the seam: the send test's credits end the run on both sides.
#[test]
fn device_iwarp_send_duration_mode() {
    let seam = ["--device", "iwarp"];
    let (srv, cli) = run_pair_with("send", &["-D", "1", "-s", "4096", "-d", "label0"], &seam, &seam);
    for out in [&srv, &cli] {
        assert!(out.contains("Device         : label0\n"), "{out}");
        assert!(result_line(out).3 > 0.0, "{out}");
    }
}

/// `--device` names a device that is not there: a usage error (status 2) that names it and
/// lists the devices there are, on either side; what the seam cannot carry is refused.
#[test]
fn device_errors_are_usage_errors() {
    for args in [
        &["perftest", "write", "127.0.0.1", "--device", "nosuch"][..],
        &["perftest", "write", "--device", "nosuch", "--accept-timeout", "1"],
    ] {
        let o = iwarp(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.starts_with("perftest: --device nosuch: no such device: "), "{e}");
        assert!(e.contains("the devices here: iwarp"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(stdout(&o).is_empty());
    }
    for (flag, extra) in [
        ("--crc", &["--crc"][..]),
        ("--first-fpdu-delay", &["--first-fpdu-delay", "5"]),
        ("--pcap", &["--pcap", "/nonexistent/x.pcap"]),
        ("--transport", &["--transport", "smoltcp", "--tap", "nosuch0", "--ip", "10.81.0.2/24"]),
    ] {
        let mut args = vec!["perftest", "read", "127.0.0.1", "--device", "iwarp"];
        args.extend_from_slice(extra);
        let o = iwarp(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), format!("perftest: {flag} is not available with --device\n"));
    }
    let o = iwarp(&["perftest", "send", "--device", "iwarp", "--crc"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), "perftest: --crc is not available with --device\n");
}

/// A seam client with no server fails with status 1 and one line naming the device.
#[test]
fn device_client_to_a_closed_port_fails_clearly() {
    let port = free_port();
    let p = port.to_string();
    let o = iwarp(&["perftest", "write", "127.0.0.1", "-p", &p, "--device", "iwarp", "--timeout", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.starts_with(&format!("perftest: cannot connect to 127.0.0.1:{port} through iwarp: ")), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(stdout(&o).is_empty());
}

#[test]
fn client_to_a_closed_port_fails_clearly() {
    let port = free_port();
    let p = port.to_string();
    let o = iwarp(&["perftest", "read", "127.0.0.1", "-p", &p, "-R", "-F", "-n", "5"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), format!("perftest: cannot connect to 127.0.0.1:{port}: Connection refused\n"));
    assert!(stdout(&o).is_empty());
}

// --- wire format against the siw captures -----------------------------------------------

/// One whole message (a segment with L set) of a connection.
#[derive(Debug, Clone)]
struct Msg {
    dir: Dir,
    opcode: &'static str,
    /// Tagged: (STag, TO).
    tagged: Option<(u32, u64)>,
    /// Payload bytes of this (last) segment.
    payload: Vec<u8>,
}

/// A segment is one of the engine's nudges (see [`common::is_nudge_json`]).
fn is_nudge(seg: &iwarp_dissect::ddp::Segment) -> bool {
    seg.header.opcode == "Write"
        && seg.payload_len == 0
        && matches!(seg.header.model, Model::Tagged { stag: 1, .. })
}

/// Per MPA connection: (request private data, reply private data, messages).
fn messages(path: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>, Vec<Msg>)> {
    let report = dissect_file(path, &Options { keep_ulpdu: true }).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    report
        .connections
        .iter()
        .filter(|c| c.mpa)
        .map(|c| {
            let msgs = c
                .fpdus
                .iter()
                .filter_map(|f| {
                    let seg = f.segment.as_ref()?;
                    if !seg.header.last || is_nudge(seg) {
                        return None;
                    }
                    let ulpdu = f.ulpdu.as_ref().unwrap();
                    let (hdr, tagged) = match seg.header.model {
                        Model::Tagged { stag, to } => (14, Some((stag, to))),
                        _ => (18, None),
                    };
                    let payload = ulpdu[hdr..hdr + seg.payload_len].to_vec();
                    Some(Msg { dir: f.dir, opcode: seg.header.opcode, tagged, payload })
                })
                .collect();
            (
                c.request.as_ref().unwrap().private_data.clone(),
                c.reply.as_ref().unwrap().private_data.clone(),
                msgs,
            )
        })
        .collect()
}

const I2R: Dir = Dir::InitiatorToResponder;
const R2I: Dir = Dir::ResponderToInitiator;

fn control(msgs: &[Msg], dir: Dir) -> Vec<Vec<u8>> {
    msgs.iter().filter(|m| m.dir == dir && m.opcode == "Send").map(|m| m.payload.clone()).collect()
}

/// Payload sizes of the control Sends, client then server
/// (docs/perftest.md#the-control-connection).
fn control_sizes(test: &str) -> Vec<usize> {
    let mut v = vec![16, 4, 4, 2, 56, 56, 56, 56, 56, 56];
    if test != "send" {
        v.extend([8, 8, 8, 8, 8]);
    }
    v.push(56);
    v
}

#[test]
fn encoders_match_siw_write_bw() {
    let conns = messages(&data("siw-write-bw.pcap"));
    assert_eq!(conns.len(), 2);
    let (req, rep, ctl) = &conns[0];
    assert_eq!((req.as_slice(), rep.as_slice()), (&[0u8; 4][..], &[0u8; 4][..]));
    let (c, s) = (control(ctl, I2R), control(ctl, R2I));
    let sizes: Vec<usize> = c.iter().map(Vec::len).collect();
    assert_eq!(sizes, control_sizes("write"));
    assert_eq!(s.iter().map(Vec::len).collect::<Vec<_>>(), sizes);
    // Strict alternation: client MSN n, server MSN n, client n+1, ...
    let dirs: Vec<Dir> = ctl.iter().map(|m| m.dir).collect();
    assert!(dirs.chunks(2).all(|p| p == [I2R, R2I]), "{dirs:?}");
    for side in [&c, &s] {
        assert_eq!(side[0], wire::version_msg(wire::VERSION));
        assert_eq!(wire::parse_version(&side[0]), Some(6.06));
        assert_eq!(side[1], wire::u32_msg(4096));
        assert_eq!(side[2], wire::u32_msg(64));
        assert_eq!(side[3], wire::mtu_msg(3));
        assert_eq!(wire::mtu_bytes(wire::parse_mtu(&side[3]).unwrap()), 1024);
        assert_eq!(side[4], [0u8; 56]);
        assert_eq!(side[5], [0u8; 56]);
    }
    // The server's K1: a record our encoder reproduces byte for byte.
    let k1 = KeyRecord::parse(&s[6]).unwrap();
    assert_eq!(k1.to_bytes().to_vec(), s[6]);
    assert_eq!((k1.lid, k1.out_reads, k1.qpn, k1.rkey, k1.vaddr), (0, 1, 2, 0xb702_1900, 0x5609_81e2_4000));
    assert_eq!(k1.psn, 0x0019_ce42);
    assert_eq!(k1.gid, [0x52, 0x54, 0, 0x77, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!((k1.srqn, k1.gid_index), (0, 0));
    // The keys used: the client's Writes on the data connection target the server's record.
    let (_, _, dat) = &conns[1];
    let writes: Vec<&Msg> = dat.iter().filter(|m| m.opcode == "Write").collect();
    assert_eq!(writes.len(), 8);
    assert!(writes.iter().all(|w| w.dir == I2R && w.tagged.unwrap().0 == k1.rkey));
    // All K records of a side carry the same keys (the padding word varies).
    for k in &s[6..=9] {
        let r = KeyRecord::parse(k).unwrap();
        assert_eq!((r.rkey, r.vaddr, r.qpn), (k1.rkey, k1.vaddr, k1.qpn));
    }
    // A record of ours: each field at its offset, big-endian.
    let mine = KeyRecord {
        lid: 0,
        out_reads: 0x80,
        qpn: 7,
        psn: 0x00ab_cdef,
        rkey: 0x1122_3344,
        pad: 0,
        vaddr: 0x0102_0304_0506_0708,
        gid: [9; 16],
        srqn: 0,
        gid_index: 0,
    }
    .to_bytes();
    assert_eq!(&mine[4..8], &[0, 0, 0, 0x80]);
    assert_eq!(&mine[12..16], &[0, 0xab, 0xcd, 0xef]);
    assert_eq!(&mine[16..20], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&mine[24..32], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&mine[32..48], &[9; 16]);
    // The client's report: size, iterations, then three big-endian doubles.
    let fields: [Vec<u8>; 5] = std::array::from_fn(|i| c[10 + i].clone());
    let r = Report::from_msgs(&fields);
    assert_eq!((r.size, r.iters), (8192, 8));
    assert!((r.bw_peak - 2.274).abs() < 0.001 && (r.bw_avg - 2.180).abs() < 0.001, "{r:?}");
    assert!((r.msg_rate - 0.000279).abs() < 0.000001, "{r:?}");
    assert_eq!(r.to_msgs().iter().map(|m| m.to_vec()).collect::<Vec<_>>(), fields.to_vec());
}

#[test]
fn read_and_send_captures_match_the_model() {
    // ib_read_bw: the data connection asks and answers IRD=ORD=128.
    let conns = messages(&data("siw-read-bw.pcap"));
    assert_eq!(conns[0].0, [0u8; 4]);
    assert_eq!(
        (conns[1].0.as_slice(), conns[1].1.as_slice()),
        (&[0, 0x80, 0, 0x80][..], &[0, 0x80, 0, 0x80][..])
    );
    let s = control(&conns[0].2, R2I);
    assert_eq!(s.iter().map(Vec::len).collect::<Vec<_>>(), control_sizes("read"));
    let k1 = KeyRecord::parse(&s[6]).unwrap();
    assert_eq!(k1.out_reads, 128);
    let reqs: Vec<&Msg> = conns[1].2.iter().filter(|m| m.opcode == "ReadReq").collect();
    assert_eq!(reqs.len(), 8);
    // Read Request body: sink STag, sink TO, size, source STag, source TO.
    let p = &reqs[0].payload;
    assert_eq!(u32::from_be_bytes(p[16..20].try_into().unwrap()), k1.rkey);
    assert_eq!(u64::from_be_bytes(p[20..28].try_into().unwrap()), k1.vaddr);

    // ib_send_bw: the client's record advertises its credit word, which the server's
    // 4-byte little-endian Writes of its receive count target.
    let conns = messages(&data("siw-send-bw.pcap"));
    let c = control(&conns[0].2, I2R);
    assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), control_sizes("send"));
    let k1 = KeyRecord::parse(&c[6]).unwrap();
    assert_eq!((k1.rkey, k1.vaddr), (0x6604_2c00, 0x55cb_8fc5_7d74));
    let credits: Vec<&Msg> = conns[1].2.iter().filter(|m| m.opcode == "Write").collect();
    assert!(credits.iter().all(|m| m.dir == R2I && m.tagged == Some((k1.rkey, k1.vaddr))));
    let values: Vec<Vec<u8>> = credits.iter().map(|m| m.payload.clone()).collect();
    let expect: Vec<Vec<u8>> = [2, 4, 6, 8].iter().map(|&n| wire::credit_bytes(n).to_vec()).collect();
    assert_eq!(values, expect);
}

/// Runs `test` with the capture's flags (-s 8192 -n 8), recording on the client, and
/// compares our traffic with the siw capture message by message.
fn same_as_capture(test: &str, capture: &str) {
    let pcap = Temp::new(&format!("perftest-{test}.pcap"), b"");
    run_pair(test, &["-R", "-F", "-s", "8192", "-n", "8"], &["--pcap", pcap.path()]);
    let ours = messages(std::path::Path::new(pcap.path()));
    let theirs = messages(&data(capture));
    assert_eq!(ours.len(), 2);
    for (o, t) in ours.iter().zip(&theirs) {
        assert_eq!((&o.0, &o.1), (&t.0, &t.1), "MPA private data");
        let shape = |m: &[Msg]| -> Vec<(Dir, &'static str, usize)> {
            m.iter().map(|x| (x.dir, x.opcode, x.payload.len())).collect()
        };
        if std::ptr::eq(o, &ours[0]) {
            // The control connection: the same Sends, in the same order, the same sizes.
            assert_eq!(shape(&o.2), shape(&t.2), "control connection");
            for dir in [I2R, R2I] {
                let (oc, tc) = (control(&o.2, dir), control(&t.2, dir));
                assert_eq!(oc[..6], tc[..6], "version..post");
            }
        } else {
            // The data connection: the same messages per direction and kind.
            let count =
                |m: &[Msg], d: Dir, op: &str| m.iter().filter(|x| x.dir == d && x.opcode == op).count();
            for op in ["Write", "ReadReq", "ReadResp", "Send"] {
                for d in [I2R, R2I] {
                    assert_eq!(count(&o.2, d, op), count(&t.2, d, op), "{op} {d:?}");
                }
            }
        }
    }
    // Our keys are the ones used on the data connection.
    let (c, s) = (control(&ours[0].2, I2R), control(&ours[0].2, R2I));
    let (ck, sk) = (KeyRecord::parse(&c[6]).unwrap(), KeyRecord::parse(&s[6]).unwrap());
    for m in &ours[1].2 {
        match (test, m.opcode) {
            ("write", "Write") => assert_eq!(m.tagged.unwrap().0, sk.rkey),
            ("send", "Write") => {
                assert_eq!(m.tagged.unwrap(), (ck.rkey, ck.vaddr));
                assert_eq!(m.payload.len(), 4);
            }
            ("read", "ReadReq") => {
                assert_eq!(u32::from_be_bytes(m.payload[16..20].try_into().unwrap()), sk.rkey);
                assert_eq!(u64::from_be_bytes(m.payload[20..28].try_into().unwrap()), sk.vaddr);
            }
            _ => {}
        }
    }
    if test == "send" {
        let credits: Vec<Vec<u8>> =
            ours[1].2.iter().filter(|m| m.opcode == "Write").map(|m| m.payload.clone()).collect();
        let expect: Vec<Vec<u8>> = [2, 4, 6, 8].iter().map(|&n| wire::credit_bytes(n).to_vec()).collect();
        assert_eq!(credits, expect);
    } else {
        // The report: the client's size and iterations.
        assert_eq!(c[10], 8192u64.to_be_bytes());
        assert_eq!(c[11], 8u64.to_be_bytes());
    }
}

#[test]
fn write_traffic_matches_siw_capture() {
    same_as_capture("write", "siw-write-bw.pcap");
}

#[test]
fn read_traffic_matches_siw_capture() {
    same_as_capture("read", "siw-read-bw.pcap");
}

#[test]
fn send_traffic_matches_siw_capture() {
    same_as_capture("send", "siw-send-bw.pcap");
}

#[test]
fn perftest_over_smoltcp_on_a_veth_pair() {
    use std::process::Stdio;
    use std::time::Duration;
    if !iwarp_tests::netns::privileged("perftest_over_smoltcp_on_a_veth_pair") {
        return;
    }
    let ns = SmolNetns::new("perf");
    for (i, test) in ["write", "read", "send"].into_iter().enumerate() {
        let port = (7410 + i).to_string();
        let server = ns
            .iwarp(&[
                "perftest",
                test,
                "-p",
                &port,
                "--transport",
                "smoltcp",
                "--iface",
                "va",
                "--ip",
                "10.84.0.1/24",
                "--accept-timeout",
                "20",
                "-n",
                "100",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let client = ns
            .iwarp(&[
                "perftest",
                test,
                "10.84.0.1",
                "-p",
                &port,
                "--transport",
                "smoltcp",
                "--iface",
                "vb",
                "--ip",
                "10.84.0.2/24",
                "-n",
                "100",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let c = wait_bounded(client, Duration::from_secs(60), "perftest client");
        let s = wait_bounded(server, Duration::from_secs(30), "perftest server");
        assert!(c.status.success(), "{test} client: {}{}", stdout(&c), stderr(&c));
        assert!(s.status.success(), "{test} server: {}{}", stdout(&s), stderr(&s));
        assert!(stdout(&c).contains(" 65536      100"), "{test}: {}", stdout(&c));
    }
}
