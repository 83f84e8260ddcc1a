//! Tests of the `iwarp` command line: exit codes, text, `--json` and `-v` output, errors.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/siw").join(name)
}

fn iwarp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iwarp")).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// A temp file removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn new(tag: &str, bytes: &[u8]) -> Temp {
        let p = std::env::temp_dir().join(format!("iwarp-cli-{}-{tag}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        Temp(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn help_is_useful() {
    let o = iwarp(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("dissect"));
    let o = iwarp(&["dissect", "--help"]);
    assert!(o.status.success());
    let s = stdout(&o);
    for word in ["--json", "--verbose", "pcapng", "Exit status"] {
        assert!(s.contains(word), "{word}: {s}");
    }
    let o = iwarp(&["dissect"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn text_output_of_a_clean_capture() {
    let o = iwarp(&["dissect", data("siw-rping-crc.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("conn 1 10.77.0.2:"), "{s}");
    assert!(s.contains("(initiator -> responder)"), "{s}");
    assert!(s.contains("  Request rev 2 flags 0x50 [C H] IRD 1 ORD 1 pd 4 bytes 00010001"), "{s}");
    assert!(s.contains("  Reply rev 2 flags 0x50 [C H] IRD 1 ORD 1 pd 4 bytes 00010001"), "{s}");
    assert!(s.contains("  negotiated: CRC on, markers off/off (i->r/r->i), RTR none"), "{s}");
    assert_eq!(s.lines().filter(|l| l.contains(" FPDU #") && l.contains("CRC good")).count(), 21, "{s}");
    assert!(s.contains("  i->r FPDU #1 @0 "), "{s}");
    assert!(s.contains("CRC good | untagged L Send QN 0 MSN 1 MO 0 payload 16"), "{s}");
    assert!(s.contains("| tagged L ReadResp STag 0x"), "{s}");
    assert!(s.contains("untagged L ReadReq QN 1 MSN 1 MO 0 payload 28 | ReadReq sink 0x"), "{s}");
    assert!(s.contains(" size 64 source 0x"), "{s}");
    assert!(s.contains("1 MPA connections, 21 FPDUs, 0 violations"), "{s}");
    assert!(stderr(&o).is_empty());
}

#[test]
fn p2p_text() {
    let o = iwarp(&["dissect", data("siw-rping-p2p.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let s = stdout(&o);
    assert!(s.contains("IRD 1 ORD 1 P2P RTR write+read pd 4 bytes 8001c001"), "{s}");
    assert!(s.contains("IRD 1 ORD 1 P2P RTR write pd 4 bytes 80018001"), "{s}");
    assert!(s.contains("RTR write\n"), "{s}");
    assert!(
        s.contains(
            "i->r FPDU #1 @0 frame 22 len 14 pad 0 CRC off | tagged L Write STag 0x00000001 TO 0x0 payload 0\n"
        ),
        "{s}"
    );
}

#[test]
fn responder_first_is_a_violation() {
    let o = iwarp(&["dissect", data("siw-ucmatose.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), "dissect: 1 violation (1 responder sent first)\n");
    let s = stdout(&o);
    assert!(s.contains("responder sent 2 FPDUs before the initiator's first FPDU"), "{s}");
    let o = iwarp(&["dissect", "--json", data("siw-ucmatose.pcap").to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["violations"][0]["kind"], "responder_first");
    let f = &v["connections"][0]["fpdus"][0]["segment"];
    assert_eq!(f["model"], "untagged");
    assert_eq!(f["opcode"], "Send");
    assert_eq!((f["qn"].as_u64(), f["msn"].as_u64(), f["mo"].as_u64()), (Some(0), Some(1), Some(0)));
    assert_eq!(f["payload_len"], 64);
}

#[test]
fn json_output_parses() {
    let o = iwarp(&["dissect", "--json", data("siw-write-bw-crc.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["format"], "pcap");
    assert_eq!(v["mpa_connections"], 2);
    assert_eq!(v["fpdu_count"], 80);
    assert_eq!(v["violation_count"], 0);
    let conns = v["connections"].as_array().unwrap();
    let fpdus: Vec<&serde_json::Value> = conns.iter().flat_map(|c| c["fpdus"].as_array().unwrap()).collect();
    assert_eq!(fpdus.len(), 80);
    assert!(fpdus.iter().all(|f| f["crc"]["verdict"] == "good"));
    assert!(fpdus.iter().all(|f| f.get("ulpdu").is_none()));
    assert_eq!(conns[0]["request"]["revision"], 2);
    assert_eq!(conns[0]["request"]["private_data"], "00000000");
    assert_eq!(conns[0]["negotiated"]["crc"], true);
    assert!(fpdus.iter().any(|f| f["dir"] == "i->r"));
}

#[test]
fn verbose_hex() {
    let o = iwarp(&["dissect", "-v", data("siw-rping.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let s = stdout(&o);
    // The first FPDU: an untagged Send; its ULPDU starts with the control octets.
    let after = s.split("i->r FPDU #1 ").nth(1).unwrap();
    let dump = after.lines().nth(1).unwrap();
    assert!(dump.starts_with("      0000  41 43 "), "{dump}");
    assert_eq!(dump.split_whitespace().count(), 17, "{dump}");
    let o = iwarp(&["dissect", "-v", "--json", data("siw-rping.pcap").to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let u = v["connections"][0]["fpdus"][0]["ulpdu"].as_str().unwrap();
    assert!(u.starts_with("4143"));
    assert_eq!(u.len() as u64, 2 * v["connections"][0]["fpdus"][0]["ulpdu_len"].as_u64().unwrap());
}

/// Finds where the first i->r ULPDU of a CRC capture lies in the file, by its bytes.
fn first_ulpdu_offset(file: &[u8]) -> usize {
    let r = iwarp::dissect::dissect(file, &iwarp::dissect::Options { keep_ulpdu: true }).unwrap();
    let u = r.connections[0].fpdus[0].ulpdu.clone().unwrap();
    let hits: Vec<usize> =
        file.windows(u.len()).enumerate().filter(|(_, w)| *w == u.as_slice()).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1);
    hits[0]
}

#[test]
fn bad_crc_exits_1_with_summary() {
    let mut file = std::fs::read(data("siw-rping-crc.pcap")).unwrap();
    let at = first_ulpdu_offset(&file);
    file[at + 20] ^= 0x01;
    let t = Temp::new("badcrc.pcap", &file);
    let o = iwarp(&["dissect", t.path()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_eq!(stderr(&o), "dissect: 1 violation (1 bad CRC)\n");
    let s = stdout(&o);
    assert!(s.contains("i->r FPDU #1 @0 ") && s.contains("CRC BAD (computed 0x"), "{s}");
    assert!(s.contains("1 MPA connections, 21 FPDUs, 1 violations"), "{s}");
    assert!(s.contains("violation: conn 1 i->r @0 (frame "), "{s}");
    let o = iwarp(&["dissect", "--json", t.path()]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["violations"][0]["kind"], "bad_crc");
}

#[test]
fn truncated_capture_is_a_note() {
    let file = std::fs::read(data("siw-rping.pcap")).unwrap();
    let t = Temp::new("cut.pcap", &file[..file.len() * 2 / 3]);
    let o = iwarp(&["dissect", t.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("capture truncated after "), "{s}");
    assert!(s.contains("1 MPA connections"), "{s}");
}

#[test]
fn not_a_capture_and_missing_file_exit_2() {
    let t = Temp::new("text.pcap", b"this is not a capture\n");
    let o = iwarp(&["dissect", t.path()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("error: {} is not a pcap or pcapng capture\n", t.path()));
    assert!(stdout(&o).is_empty());

    let missing = std::env::temp_dir().join(format!("iwarp-cli-{}-missing.pcap", std::process::id()));
    let o = iwarp(&["dissect", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("error: cannot open {}: No such file or directory\n", missing.display()));
}

#[test]
fn capture_without_mpa_exits_0() {
    let o = iwarp(&["dissect", data("rxe-rping.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let s = stdout(&o);
    assert!(s.contains("no MPA connection found"), "{s}");
    assert!(s.contains("0 MPA connections, 0 FPDUs, 0 violations"), "{s}");
}

/// A short `iwarp bench --json` run: every op's rows with positive numbers and the ratios.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["bench", "--sizes", "64,4k", "--duration", "0.05", "--json", "--quiet"];
    args.extend_from_slice(extra);
    let o = iwarp(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for op in ["write", "read", "send"] {
        for size in [64, 4096] {
            let r = rows
                .iter()
                .find(|r| r["op"] == op && r["size"] == size)
                .unwrap_or_else(|| panic!("{op} {size}"));
            for side in ["iwarp", "raw"] {
                for key in ["gbyte_s", "gbit_s", "mmsg_s", "p50_us", "p99_us"] {
                    assert!(r[side][key].as_f64().unwrap() > 0.0, "{op} {size} {side} {key}: {r}");
                }
            }
            for key in ["bandwidth", "msg_rate", "p50"] {
                assert!(r["ratio"][key].as_f64().unwrap() > 0.0, "{op} {size} ratio {key}: {r}");
            }
        }
    }
    assert!(v["msg_rate_64"]["ratio"].as_f64().unwrap() > 0.0);
    v
}

#[test]
fn bench_json_has_every_row() {
    let v = bench_json(&[]);
    assert_eq!(v["config"]["crc"], true);
    assert_eq!(v["config"]["poll"], "busy");
    assert_eq!(v["config"]["negotiated"]["crc"], true);
}

#[test]
fn bench_inline_two_qps_no_crc() {
    let v =
        bench_json(&["--poll", "inline", "--qps", "2", "--crc", "off", "--mpa-rev", "1", "--window", "8"]);
    assert_eq!(v["config"]["poll"], "inline");
    assert_eq!(v["config"]["negotiated"]["crc"], false);
    assert_eq!(v["config"]["negotiated"]["mpa_revision"], 1);
}

#[test]
fn bench_text_and_iters() {
    let o = iwarp(&["bench", "--ops", "send", "--sizes", "1K", "--iters", "50", "--poll", "event"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for word in ["send", "1K", "iwarp GB/s", "raw p50/p99 us", "64 B message rate"] {
        assert!(s.contains(word), "{word}: {s}");
    }
    assert!(stderr(&o).contains("bench: send"), "{}", stderr(&o));
}

#[test]
fn bench_bad_flags_exit_nonzero_with_a_clear_message() {
    for (args, needle) in [
        (&["--sizes", "0"][..], "at least 1 byte"),
        (&["--sizes", "2g"], "1 GiB"),
        (&["--sizes", "12q"], "not a size"),
        (&["--qps", "0"], "--qps"),
        (&["--window", "0"], "--window"),
        (&["--crc", "maybe"], "--crc"),
        (&["--mpa-rev", "3"], "--mpa-rev"),
        (&["--poll", "sometimes"], "--poll"),
        (&["--duration", "0"], "duration"),
        (&["--duration", "1", "--iters", "5"], "cannot be used with"),
        (&["--ops", "atomic"], "--ops"),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        let o = iwarp(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = stderr(&o);
        assert!(e.starts_with("error:") && e.contains(needle), "{args:?}: {e}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

// --- iwarp rping -----------------------------------------------------------------------------

mod rping {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use super::{iwarp, stderr, stdout};

    const BIN: &str = env!("CARGO_BIN_EXE_iwarp");

    /// A port nobody listens on (bound to 127.0.0.1:0, then released).
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// An `iwarp rping -s` child process; on drop it is killed (by its own PID) and reaped.
    struct Server {
        child: Option<Child>,
        port: u16,
        stderr: mpsc::Receiver<String>,
        stdout: Option<JoinHandle<String>>,
    }

    impl Server {
        fn start(extra: &[&str]) -> Server {
            let port = free_port();
            let p = port.to_string();
            let mut child = Command::new(BIN)
                .args(["rping", "-s", "-a", "127.0.0.1", "-p", &p, "-d", "--accept-timeout", "60"])
                .args(extra)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let err = child.stderr.take().unwrap();
            let out = child.stdout.take().unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let stdout = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = BufReader::new(out).read_to_string(&mut s);
                s
            });
            let server = Server { child: Some(child), port, stderr: rx, stdout: Some(stdout) };
            server.wait_line("listening on 127.0.0.1:");
            server
        }

        /// Waits (10 s at most) for a stderr line containing `needle`; returns the lines so far.
        fn wait_line(&self, needle: &str) -> Vec<String> {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = Vec::new();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.stderr.recv_timeout(left) {
                    Ok(l) => {
                        let hit = l.contains(needle);
                        seen.push(l);
                        if hit {
                            return seen;
                        }
                    }
                    Err(_) => panic!("no stderr line with {needle:?}; got {seen:?}"),
                }
            }
        }

        /// Waits (10 s at most) for the server to exit; its status, stdout and stderr lines.
        fn wait_exit(mut self) -> (ExitStatus, String, Vec<String>) {
            let deadline = Instant::now() + Duration::from_secs(10);
            let child = self.child.as_mut().unwrap();
            let status = loop {
                if let Some(s) = child.try_wait().unwrap() {
                    break s;
                }
                assert!(Instant::now() < deadline, "the server did not exit");
                std::thread::sleep(Duration::from_millis(10));
            };
            self.child = None;
            let out = self.stdout.take().unwrap().join().unwrap();
            let err: Vec<String> = self.stderr.try_iter().collect();
            (status, out, err)
        }

        /// Kills the server and returns its stdout and the stderr lines not read yet.
        fn kill(mut self) -> (String, Vec<String>) {
            let mut child = self.child.take().unwrap();
            let _ = child.kill();
            let _ = child.wait();
            let out = self.stdout.take().unwrap().join().unwrap();
            let err: Vec<String> = self.stderr.try_iter().collect();
            (out, err)
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
        for word in ["--first-fpdu-delay", "--crc", "--count", "--size", "--persistent", "siw", "Exit status"]
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

    /// `--pcap` records the client's connection, handshake included: it dissects like siw's
    /// own rping capture (testdata/siw/siw-rping-crc.pcap): 7 FPDUs per ping, all CRCs good.
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
        let j: serde_json::Value = serde_json::from_str(&stdout(&d)).unwrap();
        let conns = j["connections"].as_array().unwrap();
        let mpa: Vec<_> = conns.iter().filter(|c| c["mpa"] == true).collect();
        assert_eq!(mpa.len(), 1);
        let fpdus = mpa[0]["fpdus"].as_array().unwrap();
        assert_eq!(fpdus.len(), 21, "3 pings x 7 FPDUs");
        assert!(stdout(&iwarp(&["--version"])).contains("iwarp"));
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
        handle: impl FnOnce(iwarp::ConnectRequest, &iwarp::ProtectionDomain, &iwarp::CompletionQueue)
        + Send
        + 'static,
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
}
