//! `iwarp fuzz-peer`: flags, a dead peer, this stack's rping surviving, the Terminate checks,
//! findings saved, minimised and reproduced.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::mpa::{Deframed, Deframer, FrameRepr, Framer};

use common::{BIN, Server, free_port};
use common::{data, iwarp, stderr, stdout};

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(o), stderr(o)))
}

/// A scratch directory removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("iwarp-fuzz-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `iwarp fuzz-peer ARGS`, which must fail with status 2 and print nothing on stdout;
/// its stderr.
fn usage_error(args: &[&str]) -> String {
    let mut all = vec!["fuzz-peer"];
    all.extend_from_slice(args);
    let o = iwarp(&all);
    assert_eq!(o.status.code(), Some(2), "{args:?}");
    assert!(o.stdout.is_empty(), "{args:?}");
    stderr(&o)
}

#[test]
fn help_and_bad_flags() {
    let o = iwarp(&["fuzz-peer", "--help"]);
    assert!(o.status.success());
    let s = stdout(&o);
    for word in
        ["--target", "--listen", "--seed-pcap", "--save-failures", "--duration", "--json", "Exit status"]
    {
        assert!(s.contains(word), "{word}: {s}");
    }
    // clap's errors: one "error:" line, then its usage hint; exit 2, nothing on stdout.
    for (args, needle) in [
        (&[][..], "--target"),
        (&["--target", "127.0.0.1:1", "--listen", "1"], "cannot be used with"),
        (&["--target", "127.0.0.1:1", "--duration", "0"], "--duration"),
        (&["--target", "127.0.0.1:1", "--case", "3"], "--seed"),
        (&["--target", "127.0.0.1:1", "--seed", "1", "--ops", "1"], "--case"),
        (&["--target", "127.0.0.1:1", "--points", "middle"], "--points"),
        (&["--target", "127.0.0.1:1", "--layers", "tcp"], "--layers"),
        (&["--target", "127.0.0.1:1", "--recipe", "x"], "--recipe"),
        (&["--target", "127.0.0.1:1", "--recipe", "close-after-reply", "--layers", "mpa"], "cannot be used"),
        (&["--target", "127.0.0.1:1", "--seed", "1", "--case", "1", "--ops", "x"], "not an operation index"),
    ] {
        let e = usage_error(args);
        assert!(e.starts_with("error:") && e.contains(needle), "{args:?}: {e}");
    }
    // Errors found after parsing: exactly one line.
    for (args, line) in [
        (
            &["--target", "no-such-host.invalid:7174"][..],
            "fuzz-peer: cannot resolve 'no-such-host.invalid:7174'",
        ),
        (
            &["--target", "127.0.0.1:1", "--points", "handshake", "--layers", "ddp"],
            "fuzz-peer: --points handshake needs",
        ),
        (
            &["--target", "127.0.0.1:1", "--seed-pcap", "/nonexistent.pcap"],
            "fuzz-peer: cannot open /nonexistent.pcap: No such file or directory",
        ),
        (
            &["--target", "127.0.0.1:1", "--console", "/nonexistent.log"],
            "fuzz-peer: cannot read /nonexistent.log",
        ),
        (
            &["--target", "127.0.0.1:1", "--seed", "1", "--case", "1", "--cases", "2"],
            "fuzz-peer: --case runs one case",
        ),
    ] {
        let e = usage_error(args);
        assert!(e.starts_with(line) && e.lines().count() == 1, "{args:?}: {e}");
    }
    let readme = data("README.md");
    let o = iwarp(&["fuzz-peer", "--target", "127.0.0.1:1", "--seed-pcap", readme.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).ends_with("is not a pcap or pcapng capture\n"), "{}", stderr(&o));
}

#[test]
fn a_dead_peer_fails_the_first_probe() {
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let o = iwarp(&["fuzz-peer", "--target", &target, "--probe-timeout", "1", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["cases"], 0);
    let m = v["unhealthy"].as_str().unwrap();
    assert!(m.starts_with("the peer failed the health probe before the first case: cannot connect"), "{m}");
    assert!(m.contains("Connection refused"), "{m}");
}

/// This stack's own rping server survives every case: generated ones at every point and
/// layer, seeded from a siw capture, and the recipes.
#[test]
fn our_rping_server_survives() {
    let server = Server::start(&["-P", "--timeout", "5"]);
    let target = format!("127.0.0.1:{}", server.port);
    let seeds = data("siw-rping.pcap");
    let o = iwarp(&[
        "fuzz-peer",
        "--target",
        &target,
        "--seed",
        "7",
        "--cases",
        "60",
        "--answer-wait",
        "50",
        "--seed-pcap",
        seeds.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!(
        (v["mode"].as_str(), v["seed"].as_u64(), v["cases"].as_u64()),
        (Some("target"), Some(7), Some(60))
    );
    assert_eq!(v["failures"].as_array().unwrap().len(), 0);
    assert!(v["probes"].as_u64().unwrap() >= 61, "{v}");
    assert!(v["terminates"].as_u64().unwrap() > 5, "{v}");
    assert!(v["peer_closed"].as_u64().unwrap() > 30, "{v}");
    for p in ["handshake", "first", "mid", "read"] {
        assert!(v["points"][p].as_u64().unwrap() > 0, "{p}: {v}");
    }
    assert!(v["cases_per_s"].as_f64().unwrap() > 0.0);
    assert!(stderr(&o).starts_with(&format!("fuzz-peer: target {target}, seed 7, 60 s\n")), "{}", stderr(&o));
    for recipe in
        ["reserved-opcode-first", "oversized-private-data", "close-after-reply", "reset-after-reply"]
    {
        let o = iwarp(&["fuzz-peer", "--target", &target, "--recipe", recipe, "--cases", "2", "--p2p"]);
        assert_eq!(o.status.code(), Some(0), "{recipe}: {}{}", stdout(&o), stderr(&o));
        assert!(stdout(&o).starts_with("fuzz-peer: 2 cases in "), "{}", stdout(&o));
    }
    drop(server);
}

/// As initiators, this stack's rping clients (a loop of them) survive every case.
#[test]
fn our_rping_clients_survive() {
    let port = free_port();
    let stop = Arc::new(AtomicBool::new(false));
    let looper = client_loop(port, &[], stop.clone());
    let listen = format!("127.0.0.1:{port}");
    let o = iwarp(&[
        "fuzz-peer",
        "--listen",
        &listen,
        "--seed",
        "5",
        "--cases",
        "12",
        "--answer-wait",
        "50",
        "--json",
    ]);
    stop.store(true, Ordering::Relaxed);
    looper.join().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!((v["mode"].as_str(), v["cases"].as_u64()), (Some("listen"), Some(12)));
    assert!(v["failures"].as_array().unwrap().is_empty());
}

/// A loop of `iwarp rping -c -C 1 EXTRA` towards `port` until `stop` (two minutes at most).
fn client_loop(
    port: u16,
    extra: &'static [&'static str],
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let p = port.to_string();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let _ = Command::new(BIN)
                .args(["rping", "-c", "-a", "127.0.0.1", "-p", &p, "-C", "1", "--timeout", "3"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// The Terminate checks with this stack's expectations (docs/interop.md#terminate-checks) on
/// loopback: `iwarp rping -s -P` answers each provoked error with the Terminate expected and
/// reports each of this tool's Terminates, decoded both ways; a loop of `iwarp rping -c` answers
/// the bent MPA Replies as expected; and a check fails when the answer is not the one expected
/// (this stack's answers judged with siw's expectations).
#[test]
fn terminate_checks_against_our_rping() {
    let server = Server::start(&["-P", "--timeout", "5"]);
    let target = format!("127.0.0.1:{}", server.port);
    let o = iwarp(&["fuzz-peer", "--target", &target, "--terminates", "iwarp", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!((v["mode"].as_str(), v["expectations"].as_str()), (Some("target"), Some("iwarp")));
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 59, "{v}");
    assert!(checks.iter().all(|c| c["pass"] == true) && v["failures"].as_array().unwrap().is_empty(), "{v}");
    let got = |name: &str| {
        let c = checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"));
        c["got"].as_str().unwrap().to_string()
    };
    assert_eq!(
        got("send-invalid-qn"),
        "Terminate 1201c000: DDP type 2 code 0x01 (RFC layout), M D, copied header: Send (QN 5 MSN 2 MO 0), \
         segment length 34, the peer closed the connection"
    );
    assert_eq!(
        got("read-request-ird-exceeded"),
        "Terminate 0207e000: RDMAP type 2 code 0x07 (RFC layout), M D R, copied header: ReadReq (QN 1 MSN 2 \
         MO 0), segment length 46, the peer closed the connection"
    );
    assert_eq!(
        got("crc-error"),
        "Terminate 20020000: LLP type 0 code 0x02 (RFC layout), the peer closed the connection"
    );
    assert_eq!(
        got("interleaved-sends"),
        "Terminate 02060000: RDMAP type 2 code 0x06 (RFC layout), the peer closed the connection"
    );
    assert_eq!(got("ours-llp-crc"), "no Terminate, the peer closed the connection");
    // The server decoded this tool's Terminates (the ours-* checks), each on the thread that
    // served its connection: the lines may come in any order.
    let wants = [
        "DDP type 2 code 0x01 (read as siw lays it out: LLP type 1 code 0x01)",
        "DDP type 1 code 0x00 (read as siw lays it out: DDP type 1 code 0x00)",
        "RDMAP type 1 code 0x00 (read as siw lays it out: DDP type 0 code 0x00)",
        "RDMAP type 2 code 0x06 (read as siw lays it out: LLP type 0 code 0x06)",
        "LLP type 0 code 0x02 (read as siw lays it out: RDMAP type 2 code 0x02)",
    ];
    for (want, line) in wants.iter().zip(server.wait_all(&wants)) {
        assert!(line.contains("the peer sent a Terminate") && line.ends_with(want), "{line}");
    }
    // With siw's expectations this stack's answer (RFC layout, segment length 34) fails.
    let o = iwarp(&["fuzz-peer", "--target", &target, "--terminates", "siw", "--only", "send-invalid-qn"]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("\nFAIL send-invalid-qn (a Send to queue 5): expected a Terminate: DDP type 2 code 0x01 (siw's layout)"), "{}", stdout(&o));
    drop(server);

    // The peer initiates: its MPA Reply checks, and with --p2p the one for a peer-to-peer client.
    let replies =
        ["reply-bad-key", "reply-ird-insufficient", "reply-revision-3", "reply-markers", "reply-reject"];
    for (p2p, want) in [(&[][..], &replies[..]), (&["--p2p"][..], &["reply-no-matching-rtr"][..])] {
        let port = free_port();
        let stop = Arc::new(AtomicBool::new(false));
        let looper = client_loop(port, p2p, stop.clone());
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["fuzz-peer", "--listen", &listen, "--terminates", "iwarp", "--json"];
        args.extend_from_slice(p2p);
        let o = iwarp(&args);
        stop.store(true, Ordering::Relaxed);
        looper.join().unwrap();
        assert_eq!(o.status.code(), Some(0), "{p2p:?}: {}{}", stdout(&o), stderr(&o));
        let v = json(&o);
        let checks = v["checks"].as_array().unwrap();
        let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, want);
        assert!(checks.iter().all(|c| c["pass"] == true), "{v}");
        if !p2p.is_empty() {
            let want =
                "Terminate 20070000: LLP type 0 code 0x07 (RFC layout), the peer closed the connection";
            assert_eq!(checks[0]["got"], want);
        }
    }
}

/// The captures of the findings (tests/data/fuzz-peer/) decode and show what
/// docs/fuzz-peer.md says they show.
#[test]
fn finding_captures_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("tests/data/fuzz-peer");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("pcap") {
            continue;
        }
        seen += 1;
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(readme.contains(&format!("`{name}`")), "{name} has no README line");
        let o = iwarp(&["dissect", path.to_str().unwrap()]);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{name}: {}", stderr(&o));
        let s = stdout(&o);
        assert!(s.contains("(initiator -> responder)"), "{name}: {s}");
        let expect: &[&str] = match name.as_str() {
            "iwcm-p2p-reset-before-rtr.pcap" | "iwcm-stock-siw-p2p-reset.pcap" => {
                &["P2P RTR write+read pd 4 bytes 8001c001", "P2P RTR write pd 4 bytes 80018001", "0 FPDUs"]
            }
            "iwcm-stock-siw-p2p-bit-then-fin.pcap" => {
                &["pd 4 bytes f4b3c080", "P2P RTR write pd 4 bytes 80808080"]
            }
            "iwcm-p2p-rtr-then-bad-fpdu.pcap" => &[
                "i->r FPDU #1 @0 frame 6 len 14 pad 0 CRC off | tagged L Write STag 0x00000001 TO 0x0 payload 0",
                "untagged L Terminate QN 2",
            ],
            "iwcm-p2p-terminate-instead-of-rtr.pcap" => {
                &["untagged L Terminate QN 2", "first FPDU is not the zero-length write RTR"]
            }
            "reply-pd-len-513.pcap" => &["MPA private data length 513 exceeds 512"],
            "reply-private-data-1004.pcap" => &["MPA private data length 1004 exceeds 512"],
            "reply-cut-then-fpdu.pcap" => &["MPA private data length 3777 exceeds 512"],
            "reply-pd-len-511-short.pcap" => &["MPA Reply incomplete"],
            "reply-h-bit-revision-1.pcap" => &["enhanced bit set with MPA revision 1"],
            "reserved-opcode-first-fpdu.pcap" => &["unknown RDMAP opcode 0xc"],
            other => panic!("{other}: a capture this test does not know"),
        };
        for e in expect {
            assert!(s.contains(e), "{name}: {e}: {s}");
        }
    }
    assert_eq!(seen, 11);
}

/// A proxy in front of a real rping server that answers any FPDU with a reserved RDMAP
/// opcode with a Terminate whose code is undefined in either layout, then drops the
/// connection: a peer with a well-formedness bug that stays alive.
fn bad_terminate_proxy(upstream: u16) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(300);
        while !s2.load(Ordering::Relaxed) && Instant::now() < deadline {
            let Ok((client, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            client.set_nonblocking(false).unwrap();
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
            let to_client = Arc::new(Mutex::new(client.try_clone().unwrap()));
            let (mut from_server, tc) = (server.try_clone().unwrap(), to_client.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_server.read(&mut buf) {
                    if tc.lock().unwrap().write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = tc.lock().unwrap().shutdown(Shutdown::Write);
            });
            std::thread::spawn(move || upstream_pump(client, server, &to_client));
        }
    });
    (port, stop)
}

/// Client to server, FPDU by FPDU (CRC off), with the reserved-opcode trap.
fn upstream_pump(mut client: TcpStream, mut server: TcpStream, to_client: &Mutex<TcpStream>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let mut frame_done = false;
    let mut deframer = Deframer::new(false, false);
    loop {
        let n = match client.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if !frame_done {
            match FrameRepr::parse_prefix(&buf) {
                Ok(Some((_, len))) => {
                    let _ = server.write_all(&buf[..len]);
                    buf.drain(..len);
                    frame_done = true;
                }
                Ok(None) => continue,
                Err(_) => break,
            }
        }
        while let Ok(Deframed::Fpdu(f)) = deframer.deframe(&buf) {
            let (len, reserved) = (f.wire_len, f.ulpdu.get(1).is_some_and(|b| b & 0x0f >= 0x0c));
            if reserved {
                let mut term = vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0];
                term.extend_from_slice(&[0xff, 0xff, 0, 0]);
                let fpdu = Framer::new(false, false).frame_to_vec(&term).unwrap();
                let mut c = to_client.lock().unwrap();
                let _ = c.write_all(&fpdu);
                let _ = c.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                return;
            }
            let _ = server.write_all(&buf[..len]);
            buf.drain(..len);
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

/// A malformed answer is found, saved as a pcap that `iwarp dissect` decodes, shrunk to the
/// one mutation that matters, and reproduced from the flags printed.
#[test]
fn a_malformed_answer_is_saved_minimised_and_reproduced() {
    let server = Server::start(&["-P", "--timeout", "5"]);
    let (port, stop) = bad_terminate_proxy(server.port);
    let target = format!("127.0.0.1:{port}");
    let dir = Dir::new("failures");
    let dir_s = dir.0.to_str().unwrap().to_string();
    let base = [
        "fuzz-peer",
        "--target",
        &target,
        "--crc",
        "off",
        "--points",
        "first",
        "--layers",
        "rdmap",
        "--answer-wait",
        "50",
    ];
    let mut args = base.to_vec();
    args.extend_from_slice(&["--seed", "11", "--cases", "25", "--save-failures", &dir_s, "--json"]);
    let o = iwarp(&args);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!(v["cases"], 25, "{v}");
    let failures = v["failures"].as_array().unwrap();
    assert!(!failures.is_empty(), "{v}");
    for f in failures {
        assert_eq!(f["kind"], "answer", "{f}");
        assert!(f["message"].as_str().unwrap().contains("Terminate with an undefined code"), "{f}");
        let ops: Vec<&str> = f["ops"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
        // Shrunk to the reserved opcode alone, or to nothing when the message it started
        // from (random bytes, a seed) already had one.
        let kept = f["minimized_ops"].as_array().unwrap();
        match kept.as_slice() {
            [] => assert!(f["template"].as_str().unwrap().contains("random"), "{f}"),
            [k] => {
                assert!(ops[usize::try_from(k.as_u64().unwrap()).unwrap()].contains("(reserved)"), "{f}")
            }
            _ => panic!("not minimised: {f}"),
        }
        // The pcap is a capture `iwarp dissect` decodes (it reports our mutation as a
        // violation: exit 1, never 2) and shows the bad Terminate.
        let pcap = f["pcap"].as_str().unwrap();
        let d = iwarp(&["dissect", pcap]);
        assert_eq!(d.status.code(), Some(1), "{}", stderr(&d));
        assert!(stdout(&d).contains("Terminate"), "{}", stdout(&d));
        // A pcap of the shrunk case when something was removed.
        if ops.len() > 1 {
            assert!(std::path::Path::new(f["minimized_pcap"].as_str().unwrap()).exists(), "{f}");
        }
        let txt = std::path::Path::new(pcap).with_extension("txt");
        assert!(std::fs::read_to_string(txt).unwrap().contains("reproduce: iwarp fuzz-peer "));
    }
    // The minimised case again, from the flags the report gives.
    let f = &failures[0];
    let repro = f["reproduce"].as_str().unwrap();
    assert!(repro.contains(" --seed 11 --case ") && repro.contains(" --ops "), "{repro}");
    let words: Vec<&str> = repro.split_whitespace().skip(1).collect();
    let mut again = words.clone();
    again.extend_from_slice(&["--answer-wait", "50", "--no-minimize", "--json"]);
    let o = iwarp(&again);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!(v["cases"], 1);
    assert_eq!(v["failures"][0]["case"], f["case"]);
    assert_eq!(v["failures"][0]["ops"].as_array().unwrap().len(), 1);
    // Without the trap, the same case passes.
    let mut direct = again.clone();
    let at = direct.iter().position(|w| *w == target.as_str()).unwrap();
    let real = format!("127.0.0.1:{}", server.port);
    direct[at] = &real;
    let o = iwarp(&direct);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    stop.store(true, Ordering::Relaxed);
    drop(server);
}
