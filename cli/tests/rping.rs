//! `iwarp rping`: client and server, against siw's wire format, failures, bounds, smoltcp.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{
    Server, SmolNetns, Temp, free_port, is_nudge_json, iwarp, json_lines, records, stderr, stdout,
    wait_bounded,
};

fn client(port: u16, extra: &[&str]) -> std::process::Output {
    let p = port.to_string();
    let mut args = vec!["rping", "-c", "-a", "127.0.0.1", "-p", &p];
    args.extend_from_slice(extra);
    iwarp(&args)
}

#[test]
fn help_lists_rping() {
    let o = iwarp(&["--help"]);
    assert!(stdout(&o).contains("rping"));
    let o = iwarp(&["rping", "--help"]);
    assert!(o.status.success());
    let s = stdout(&o);
    for word in
        ["--first-fpdu-delay", "--crc", "--count", "--size", "--persistent", "--device", "siw", "Exit status"]
    {
        assert!(s.contains(word), "{word}: {s}");
    }
}

#[test]
fn client_and_server_ping_10_times() {
    let server = Server::start(&["-v"]);
    let o = client(server.port, &["-C", "10", "-V", "-S", "64", "-v"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let s = stdout(&o);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 10, "{s}");
    assert_eq!(lines[0], "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr");
    assert_eq!(lines[1], "ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs");
    assert!(lines[9].starts_with("ping data: rdma-ping-9: JKLM"), "{s}");
    assert!(lines.iter().all(|l| l.len() == "ping data: ".len() + 63), "{s}");

    // Without -P the server ends with the client's connection, successfully.
    let (status, out, err) = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{err:?}");
    let server_lines: Vec<&str> = out.lines().collect();
    assert_eq!(server_lines.len(), 10, "{out}");
    assert_eq!(server_lines[0], format!("server {}", lines[0]));
    assert!(err.iter().any(|l| l.contains("disconnected after 10 pings")), "{err:?}");
}

/// A persistent server at its client limit rejects one more client on the wire and keeps
/// serving; once a client leaves, the next one is served.
#[test]
fn persistent_server_rejects_clients_beyond_its_limit() {
    let server = Server::start(&["-P", "--max-clients", "1", "--timeout", "30"]);
    // A client that connects and stays (the library's, holding its queue pair).
    let dev = iwarp::Device::open(iwarp::DeviceConfig::default());
    let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
    let addr = format!("127.0.0.1:{}", server.port).parse().unwrap();
    let held = dev.connect(addr, &pd, &cq, &cq, &iwarp::ConnectOptions::default()).unwrap();
    let o = client(server.port, &["-C", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("rejected"), "{}", stderr(&o));
    drop(held);
    drop(dev);
    // The slot frees when the held connection ends on the server.
    let deadline = Instant::now() + Duration::from_secs(10);
    let o = loop {
        let o = client(server.port, &["-C", "2", "-V"]);
        if o.status.code() == Some(0) || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    drop(server);
}

/// A client that advertises more than the server's buffer memory budget fails alone; the
/// server keeps serving the others.
#[test]
fn persistent_server_bounds_client_memory() {
    let server = Server::start(&["-P", "--max-memory", "1"]);
    let o = client(server.port, &["-C", "1", "-S", "2097152"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    server.wait_line("memory budget");
    let o = client(server.port, &["-C", "3", "-V", "-S", "4096"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    drop(server);
}

/// `--pcap` records the client's connection, handshake included: it dissects like siw's
/// own rping capture (tests/data/siw/siw-rping-crc.pcap): 7 FPDUs per ping, all CRCs good.
#[test]
fn pcap_of_a_crc_run_dissects_like_siws() {
    let server = Server::start(&[]);
    let file = std::env::temp_dir().join(format!("iwarp-rping-{}.pcap", std::process::id()));
    let f = file.to_str().unwrap();
    let o = client(server.port, &["-C", "3", "-V", "-S", "100", "--crc", "--pcap", f]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let (status, _, err) = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{err:?}");
    let d = iwarp(&["dissect", f, "--json"]);
    std::fs::remove_file(&file).ok();
    assert_eq!(d.status.code(), Some(0), "{}", stderr(&d));
    let j = json_lines(&d);
    let mpa: Vec<_> = records(&j, "connection").into_iter().filter(|c| c["mpa"] == true).collect();
    assert_eq!(mpa.len(), 1);
    // A slow server can draw the client's nudges (zero-length Writes to STag 1, see
    // docs/siw-quirks.md): they are not part of the pings.
    let fpdus: Vec<_> = records(&j, "fpdu")
        .into_iter()
        .filter(|f| f["conn"] == mpa[0]["id"] && !is_nudge_json(&f["segment"]))
        .collect();
    assert_eq!(fpdus.len(), 21, "3 pings x 7 FPDUs");
    assert!(stdout(&iwarp(&["--version"])).contains("iwarp"));
}

/// A client offering peer-to-peer (its first FPDU is the RTR) and a revision-1 client both
/// work against this stack's server; --p2p with revision 1 is refused up front.
#[test]
fn p2p_and_revision_1_clients() {
    for extra in [&["--p2p"][..], &["--mpa-rev", "1"][..]] {
        let server = Server::start(&[]);
        let mut args = vec!["-C", "3", "-V", "-S", "64"];
        args.extend_from_slice(extra);
        let o = client(server.port, &args);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stderr(&o));
        let (status, _, err) = server.wait_exit();
        assert_eq!(status.code(), Some(0), "{extra:?}: {err:?}");
    }
    let o = iwarp(&["rping", "-c", "-a", "127.0.0.1", "-p", "1", "--p2p", "--mpa-rev", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--p2p needs MPA revision 2"), "{}", stderr(&o));
}

#[test]
fn persistent_server_serves_small_large_and_concurrent_clients() {
    let server = Server::start(&["-P"]);
    let o = client(server.port, &["-C", "10", "-V", "-S", "64"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = client(server.port, &["-C", "10", "-V", "-S", "65536"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Two at once (with the siw delay flag and CRC asked for by the clients).
    let port = server.port;
    let both: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20 * i));
                client(port, &["-C", "50", "-V", "-S", "1000", "--first-fpdu-delay", "5", "--crc"])
            })
        })
        .collect();
    for h in both {
        let o = h.join().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let (_, err) = server.kill();
    assert!(!err.iter().any(|l| l.contains("connection from") && !l.contains("disconnected")), "{err:?}");
}

#[test]
fn client_without_listener_fails_clearly() {
    let port = free_port();
    let o = client(port, &["-C", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), format!("rping: cannot connect to 127.0.0.1:{port}: Connection refused\n"));
    assert!(stdout(&o).is_empty());
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        &["rping", "-a", "127.0.0.1"][..],
        &["rping", "-c", "-s", "-a", "127.0.0.1"],
        &["rping", "-c", "-a", "127.0.0.1", "-S", "22"],
        &["rping", "-c", "-a", "127.0.0.1", "-S", "16777217"],
        &["rping", "-c", "-a", "127.0.0.1", "-C", "-1"],
        &["rping", "-c", "-a", "127.0.0.1", "-p", "70000"],
        &["rping", "-c", "-a", "127.0.0.1", "--bogus"],
        // Beyond what can be added to the clock (a panic once) and 0.
        &["rping", "-s", "-a", "127.0.0.1", "--accept-timeout", "18446744073709551615"],
        &["rping", "-s", "-a", "127.0.0.1", "--accept-timeout", "0"],
    ] {
        let o = iwarp(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&o).is_empty(), "{args:?}");
    }
    let o = iwarp(&["rping", "-c"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "rping: the client needs the server's address (-a ADDR)\n");
    let o = iwarp(&["rping", "-c", "-a", "127.0.0.1", "-P"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A listener of this stack on a thread: `handle` gets each connection request.
fn lib_server(
    handle: impl FnOnce(iwarp::ConnectRequest, &iwarp::ProtectionDomain, &iwarp::CompletionQueue) + Send + 'static,
) -> (u16, JoinHandle<()>) {
    let device = iwarp::Device::open(iwarp::DeviceConfig::default());
    let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let pd = device.alloc_pd();
        let cq = device.create_cq(16);
        let req = listener.accept(Duration::from_secs(10)).unwrap();
        handle(req, &pd, &cq);
    });
    (port, h)
}

#[test]
fn rejected_connection_fails_clearly() {
    let (port, h) = lib_server(|req, _, _| req.reject(b"no thanks").unwrap());
    let o = client(port, &["-C", "1"]);
    h.join().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.starts_with(&format!("rping: cannot connect to 127.0.0.1:{port}: ")), "{e}");
    assert!(e.contains("rejected"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn terminate_from_the_peer_fails_clearly() {
    // The server posts no receive: the client's first Send draws a Terminate (DDP,
    // untagged buffer, no buffer).
    let (port, h) = lib_server(|req, pd, cq| {
        let qp = req.accept(pd, cq, cq, &iwarp::ConnectOptions::default()).unwrap();
        let _ = qp.wait_event(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(200));
    });
    let o = client(port, &["-C", "1"]);
    h.join().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.starts_with("rping: ping 0: the peer sent a Terminate while waiting for "), "{e}");
    assert!(e.contains("DDP type 2 code 0x02"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn silent_peer_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(s);
    });
    let t = Instant::now();
    let o = client(port, &["-C", "1", "--timeout", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let e = stderr(&o);
    assert!(e.contains("timed out"), "{e}");
    h.join().unwrap();
}

/// What the proxy saw: (direction 0 = client to server, offset, bytes), in order.
type Log = Arc<Mutex<Vec<(u8, usize, Vec<u8>)>>>;

/// One direction of the proxy: copies bytes and logs (direction, offset, length) in the
/// order the bytes were seen, before forwarding them.
fn pump(mut from: TcpStream, mut to: TcpStream, dir: u8, log: Log) {
    let mut buf = vec![0u8; 65536];
    let mut off = 0;
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                log.lock().unwrap().push((dir, off, buf[..n].to_vec()));
                off += n;
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[test]
fn first_fpdu_comes_from_the_client_and_mpa_is_rev2_ird_ord_1() {
    let server = Server::start(&[]);
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    let upstream = server.port;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let plog = log.clone();
    let p = std::thread::spawn(move || {
        let (c, _) = proxy.accept().unwrap();
        let s = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
        let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
        let l2 = plog.clone();
        let up = std::thread::spawn(move || pump(c, s, 0, plog));
        pump(s2, c2, 1, l2);
        up.join().unwrap();
    });
    let o = client(proxy_port, &["-C", "3", "-V"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    p.join().unwrap();
    let (status, _, err) = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{err:?}");

    let log = log.lock().unwrap();
    let stream =
        |dir: u8| -> Vec<u8> { log.iter().filter(|e| e.0 == dir).flat_map(|e| e.2.clone()).collect() };
    let (c2s, s2c) = (stream(0), stream(1));
    // MPA Request and Reply: rev 2, Enhanced, no CRC/markers, private data = IRD/ORD 1/1.
    assert_eq!(&c2s[..16], b"MPA ID Req Frame");
    assert_eq!(&c2s[16..24], &[0x10, 2, 0, 4, 0, 1, 0, 1]);
    assert_eq!(&s2c[..16], b"MPA ID Rep Frame");
    assert_eq!(&s2c[16..24], &[0x10, 2, 0, 4, 0, 1, 0, 1]);
    // The first FPDU: the client's 16-byte Send (ULPDU 34 = 18-byte header + 16).
    assert_eq!(&c2s[24..28], &[0x00, 0x22, 0x41, 0x43]);
    // Who sent first: the first logged chunk reaching past the 24-byte frames.
    let first = log.iter().find(|(_, off, b)| off + b.len() > 24).unwrap();
    assert_eq!(first.0, 0, "the server sent an FPDU before the client's first FPDU");
    // Per ping 3 client Sends + 1 Read Response, 4 server messages; 3 pings.
    assert!(c2s.len() > 24 + 3 * 3 * 40 && s2c.len() > 24 + 3 * 3 * 40, "{} {}", c2s.len(), s2c.len());
}

#[test]
fn rping_over_smoltcp_on_a_veth_pair() {
    use std::process::Stdio;
    use std::time::Duration;
    if !iwarp_tests::netns::privileged("rping_over_smoltcp_on_a_veth_pair") {
        return;
    }
    let ns = SmolNetns::new("rping");
    let pcap = Temp::new("smol-rping.pcap", b"");
    let server = ns
        .iwarp(&[
            "rping",
            "-s",
            "--transport",
            "smoltcp",
            "--iface",
            "va",
            "--ip",
            "10.81.0.1/24",
            "-p",
            "7190",
            "--accept-timeout",
            "20",
            "--pcap",
            pcap.path(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = ns
        .iwarp(&[
            "rping",
            "-c",
            "-a",
            "10.81.0.1",
            "-p",
            "7190",
            "--transport",
            "smoltcp",
            "--iface",
            "vb",
            "--ip",
            "10.81.0.2/24",
            "--crc",
            "-C",
            "10",
            "-V",
            "-v",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = wait_bounded(client, Duration::from_secs(30), "rping client");
    let s = wait_bounded(server, Duration::from_secs(30), "rping server");
    assert!(c.status.success(), "client: {}{}", stdout(&c), stderr(&c));
    assert!(s.status.success(), "server: {}{}", stdout(&s), stderr(&s));
    assert_eq!(
        stdout(&c).lines().filter(|l| l.starts_with("ping data: rdma-ping-")).count(),
        10,
        "{}",
        stdout(&c)
    );
    // The server recorded the real frames: Ethernet/IPv4/TCP to port 7190, with the MPA key.
    let bytes = std::fs::read(pcap.path()).unwrap();
    assert!(bytes.len() > 1000, "capture of {} bytes", bytes.len());
    assert!(bytes.windows(16).any(|w| w == b"MPA ID Req Frame"), "no MPA Request in the capture");
    let o = iwarp(&["dissect", pcap.path()]);
    assert!(o.status.success(), "dissect: {}{}", stdout(&o), stderr(&o));
}

#[test]
fn smoltcp_flags_errors_are_one_clear_line() {
    let o = iwarp(&["rping", "-c", "-a", "10.81.0.1", "--transport", "smoltcp", "--ip", "10.81.0.2/24"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o).trim(), "rping: --transport smoltcp needs --tap NAME or --iface NAME");
    let o = iwarp(&["rping", "-s", "--transport", "smoltcp", "--iface", "va"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs --ip ADDR/PREFIX"), "{}", stderr(&o));
    let o = iwarp(&["rping", "-c", "-a", "10.81.0.1", "--tap", "tp0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--tap needs --transport smoltcp"), "{}", stderr(&o));
    let o = iwarp(&[
        "rping",
        "-c",
        "-a",
        "10.81.0.1",
        "--transport",
        "smoltcp",
        "--iface",
        "iwnosuch9",
        "--ip",
        "10.81.0.2/24",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("iwnosuch9") && err.contains("not found"), "{err}");
    let o = iwarp(&[
        "rping",
        "-c",
        "-a",
        "10.81.0.1",
        "--transport",
        "smoltcp",
        "--iface",
        "lo",
        "--ip",
        "10.81.0.2/99",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// `--device` names a device that is not there: a usage error (status 2) that names it and
/// lists the devices there are (the engine `iwarp` at least), on either side.
#[test]
fn device_that_does_not_exist_fails_with_the_device_list() {
    for side in [&["-c", "-a", "127.0.0.1"][..], &["-s", "-a", "127.0.0.1"]] {
        let mut args = vec!["rping", "--device", "nosuch"];
        args.extend_from_slice(side);
        let o = iwarp(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        // Why it is not there depends on the build (the `verbs` feature) and the host (rdma-core).
        assert!(e.starts_with("rping: --device nosuch: no such device: "), "{e}");
        assert!(e.contains("the devices here: iwarp"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(stdout(&o).is_empty());
    }
}

/// What the seam does not carry is refused with --device, before anything is opened.
#[test]
fn device_refuses_the_flags_the_seam_does_not_carry() {
    for (flag, extra) in [
        ("--crc", &["--crc"][..]),
        ("--markers", &["--markers"]),
        ("--mpa-rev", &["--mpa-rev", "1"]),
        ("--p2p", &["--p2p"]),
        ("--first-fpdu-delay", &["--first-fpdu-delay", "5"]),
        ("--pcap", &["--pcap", "/nonexistent/x.pcap"]),
    ] {
        let mut args = vec!["rping", "-c", "-a", "127.0.0.1", "--device", "iwarp"];
        args.extend_from_slice(extra);
        let o = iwarp(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), format!("rping: {flag} is not available with --device\n"));
    }
    let o = iwarp(&["rping", "-s", "-P", "--device", "iwarp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), "rping: -P is not available with --device\n");
}

/// `--device iwarp` drives the engine through the backend seam: a seam client against the
/// engine server without the flag, and an engine client against a seam server, data
/// checked (-V) and the same lines as without the flag.
#[test]
fn device_iwarp_pings_through_the_seam_both_ways() {
    let server = Server::start(&["-v"]);
    let o = client(server.port, &["--device", "iwarp", "-C", "10", "-V", "-v", "-S", "100"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let s = stdout(&o);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 10, "{s}");
    assert!(lines[0].starts_with("ping data: rdma-ping-0: ABCDEFGHIJ"), "{s}");
    assert!(lines[9].starts_with("ping data: rdma-ping-9: JKLM"), "{s}");
    assert!(lines.iter().all(|l| l.len() == "ping data: ".len() + 99), "{s}");
    let (status, out, err) = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{err:?}");
    assert_eq!(out.lines().count(), 10, "{out}");
    assert!(err.iter().any(|l| l.contains("disconnected after 10 pings")), "{err:?}");

    // The seam server grows its buffer to what the client advertises.
    let server = Server::start(&["-v", "--device", "iwarp"]);
    let o = client(server.port, &["-C", "3", "-V", "-v", "-S", "5000"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o));
    let (status, out, err) = server.wait_exit();
    assert_eq!(status.code(), Some(0), "{err:?}");
    let server_lines: Vec<&str> = out.lines().collect();
    assert_eq!(server_lines.len(), 3, "{out}");
    assert_eq!(format!("server {}", stdout(&o).lines().next().unwrap()), server_lines[0]);
    assert!(err.iter().any(|l| l.contains("disconnected after 3 pings")), "{err:?}");
}

/// A seam client with no server to connect to fails with status 1 and one line.
#[test]
fn device_client_without_listener_fails_clearly() {
    let port = free_port();
    let o = client(port, &["--device", "iwarp", "-C", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.starts_with(&format!("rping: cannot connect to 127.0.0.1:{port} through iwarp: ")), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}
