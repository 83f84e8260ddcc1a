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

/// The records of `iwarp dissect --json` (JSON Lines), each line parsed.
fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// The records of one kind.
fn records<'a>(lines: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    lines.iter().filter(|r| r["record"] == kind).collect()
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

/// A dissected segment (JSON) is one of the engine's nudges: a zero-length RDMA Write to
/// STag 1 that an initiator sends when its peer is slow to answer (docs/siw-quirks.md).
fn is_nudge_json(seg: &serde_json::Value) -> bool {
    seg["opcode"] == "Write" && seg["payload_len"] == 0 && seg["stag"] == 1
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
    let v = json_lines(&o);
    assert_eq!(records(&v, "violation")[0]["kind"], "responder_first");
    let f = &records(&v, "fpdu")[0]["segment"];
    assert_eq!(f["model"], "untagged");
    assert_eq!(f["opcode"], "Send");
    assert_eq!((f["qn"].as_u64(), f["msn"].as_u64(), f["mo"].as_u64()), (Some(0), Some(1), Some(0)));
    assert_eq!(f["payload_len"], 64);
}

#[test]
fn json_output_parses() {
    let o = iwarp(&["dissect", "--json", data("siw-write-bw-crc.pcap").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let v = json_lines(&o);
    // The capture record first, the summary last, every record in between.
    assert_eq!(v[0]["record"], "capture");
    assert_eq!(v[0]["format"], "pcap");
    let summary = v.last().unwrap();
    assert_eq!(summary["record"], "summary");
    assert_eq!(summary["mpa_connections"], 2);
    assert_eq!(summary["fpdus"], 80);
    assert_eq!(summary["violations"], 0);
    let conns = records(&v, "connection");
    let fpdus = records(&v, "fpdu");
    assert_eq!(fpdus.len(), 80);
    assert_eq!(v.len(), 1 + conns.len() + 80 + records(&v, "note").len() + 1);
    assert!(fpdus.iter().all(|f| f["crc"]["verdict"] == "good"));
    assert!(fpdus.iter().all(|f| f.get("ulpdu").is_none()));
    assert_eq!(conns[0]["request"]["revision"], 2);
    assert_eq!(conns[0]["request"]["private_data"], "00000000");
    assert_eq!(conns[0]["negotiated"]["crc"], true);
    assert!(fpdus.iter().any(|f| f["dir"] == "i->r"));
    // Each FPDU follows its connection's record and names it.
    let mut current = None;
    for r in &v {
        match r["record"].as_str().unwrap() {
            "connection" => current = r["id"].as_u64(),
            "fpdu" => assert_eq!(r["conn"].as_u64(), current),
            _ => {}
        }
    }
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
    let v = json_lines(&o);
    let first = records(&v, "fpdu")[0];
    let u = first["ulpdu"].as_str().unwrap();
    assert!(u.starts_with("4143"));
    assert_eq!(u.len() as u64, 2 * first["ulpdu_len"].as_u64().unwrap());
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
    let v = json_lines(&o);
    assert_eq!(records(&v, "violation")[0]["kind"], "bad_crc");
    assert_eq!(v.last().unwrap()["violation_counts"]["bad_crc"], 1);
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

/// Writes a pcap of one MPA connection (Request, Reply) whose initiator then sends `packets`
/// TCP segments of 180 zero-length FPDUs each (8 octets apiece: length 0, 2 pad octets, a zero
/// CRC field): 1510 octets of file per packet. Returns the file's length.
fn zero_length_fpdu_capture(path: &Path, packets: usize) -> u64 {
    use etherparse::PacketBuilder;
    use std::io::Write as _;
    let client = ([10, 9, 0, 2], 40000u16);
    let server = ([10, 9, 0, 1], 7174u16);
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut header = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    header.extend_from_slice(&65535u32.to_le_bytes());
    header.extend_from_slice(&1u32.to_le_bytes());
    f.write_all(&header).unwrap();
    let mut packet = Vec::new();
    let mut write = |to_server: bool, seq: u32, payload: &[u8], n: u32| {
        let ((src, sp), (dst, dp)) = if to_server { (client, server) } else { (server, client) };
        packet.clear();
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(src, dst, 64);
        b.tcp(sp, dp, seq, 65535).ack(1).write(&mut packet, payload).unwrap();
        let len = u32::try_from(packet.len()).unwrap();
        for word in [1_700_000_000, n, len, len] {
            f.write_all(&u32::to_le_bytes(word)).unwrap();
        }
        f.write_all(&packet).unwrap();
    };
    let frame = |key: &[u8]| [key, &[0x10, 2, 0, 4, 0, 1, 0, 1][..]].concat();
    let request = frame(b"MPA ID Req Frame");
    write(true, 1000, &request, 0);
    write(false, 5000, &frame(b"MPA ID Rep Frame"), 1);
    let fpdus = [0u8; 180 * 8];
    let mut seq = 1000 + u32::try_from(request.len()).unwrap();
    for n in 0..packets {
        write(true, seq, &fpdus, u32::try_from(n + 2).unwrap());
        seq = seq.wrapping_add(180 * 8);
    }
    drop(f);
    std::fs::metadata(path).unwrap().len()
}

/// The peak resident set (VmHWM) of a running process, in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?.trim();
    kib.parse::<u64>().ok().map(|k| k * 1024)
}

/// `iwarp dissect` streams: on a capture of millions of zero-length FPDUs (each one a record
/// and a malformed-segment violation) its peak memory stays within a small multiple of the
/// capture, far below what keeping every FPDU's record would take.
#[test]
fn dissect_memory_is_proportional_to_the_capture() {
    let path = std::env::temp_dir().join(format!("iwarp-cli-{}-zero-fpdus.pcap", std::process::id()));
    let packets = 16_000;
    let file_len = zero_length_fpdu_capture(&path, packets);
    let _cleanup = Temp(path.clone());
    let fpdus = packets * 180;
    let mut child = Command::new(env!("CARGO_BIN_EXE_iwarp"))
        .args(["dissect", path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = child.stdout.take().unwrap();
    // Read the output as it comes (keeping only its last line), so the child never waits on a
    // full pipe.
    let reader = std::thread::spawn(move || {
        use std::io::Read as _;
        let (mut buf, mut line, mut last, mut lines) = (vec![0u8; 1 << 16], Vec::new(), Vec::new(), 0usize);
        loop {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b == b'\n' {
                    lines += 1;
                    std::mem::swap(&mut line, &mut last);
                    line.clear();
                } else {
                    line.push(b);
                }
            }
        }
        (lines, String::from_utf8(last).unwrap())
    });
    // VmHWM only grows: the last sample before the child exits is its peak up to then.
    let mut peak = 0;
    let status = loop {
        if let Some(p) = peak_rss(pid) {
            peak = peak.max(p);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let (lines, summary) = reader.join().unwrap();
    assert_eq!(status.code(), Some(1), "violations: every zero-length FPDU is a malformed segment");
    assert_eq!(summary, format!("1 MPA connections, {fpdus} FPDUs, {fpdus} violations"));
    // A line per FPDU and per violation, plus the header lines and the summary.
    assert!(lines > 2 * fpdus, "{lines} lines of output for {fpdus} FPDUs");
    assert!(peak > 0, "no memory figure read from /proc/{pid}/status");
    // The capture and its reassembled stream, with room for the binary itself.
    let bound = 3 * file_len + (64 << 20);
    assert!(peak < bound, "peak RSS {peak} bytes for a {file_len}-byte capture (bound {bound})");
    // Keeping every FPDU's record would not fit under that bound.
    let records = u64::try_from(fpdus * std::mem::size_of::<iwarp::dissect::FpduInfo>()).unwrap();
    assert!(records > bound, "{records} bytes of FPDU records");
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
    assert_eq!(v["config"]["poll"], "adaptive");
    assert_eq!(v["config"]["shared_device"], false);
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
    for word in ["send", "1K", "iwarp GB/s", "raw p50/p99/p99.9 us", "64 B message rate"] {
        assert!(s.contains(word), "{word}: {s}");
    }
    // Progress lines count the measurements: the raw 1K and 64 B rows, then send 1K.
    let err = stderr(&o);
    assert!(err.contains("bench: [1/3] raw TCP"), "{err}");
    assert!(err.contains("bench: [3/3] send"), "{err}");
}

#[test]
fn bench_plot_draws_both_panels_and_every_op() {
    let file = std::env::temp_dir().join(format!("iwarp-bench-{}.svg", std::process::id()));
    let f = file.to_str().unwrap();
    let o = iwarp(&["bench", "--sizes", "64,4k", "--iters", "20", "--quiet", "--plot", f]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&file).unwrap();
    std::fs::remove_file(&file).ok();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
    for word in
        ["Bandwidth", "round trip", "write iwarp", "read iwarp", "send iwarp", "raw TCP", ">64<", ">4K<"]
    {
        assert!(svg.contains(word), "{word}");
    }
    // Per operation: this stack and raw TCP, in each of the two panels.
    assert_eq!(svg.matches("<polyline").count(), 3 * 2 * 2);
    let o = iwarp(&["bench", "--sizes", "64", "--iters", "5", "--quiet", "--plot", "/nonexistent-dir/x.svg"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot write /nonexistent-dir/x.svg"), "{}", stderr(&o));
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

    use super::{is_nudge_json, iwarp, json_lines, records, stderr, stdout};

    const BIN: &str = env!("CARGO_BIN_EXE_iwarp");

    /// A port nobody listens on (bound to 127.0.0.1:0, then released).
    pub(super) fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// An `iwarp rping -s` child process; on drop it is killed (by its own PID) and reaped.
    pub(super) struct Server {
        child: Option<Child>,
        pub(super) port: u16,
        stderr: mpsc::Receiver<String>,
        stdout: Option<JoinHandle<String>>,
    }

    impl Server {
        pub(super) fn start(extra: &[&str]) -> Server {
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

// --- iwarp perftest --------------------------------------------------------------------------

/// perftest's control-message encoders, shared with the binary.
#[path = "perftest/wire.rs"]
#[allow(dead_code, reason = "the tests use part of the module")]
mod perftest_wire;

mod perftest {
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::thread::JoinHandle;
    use std::time::{Duration, Instant};

    use iwarp::dissect::ddp::Model;
    use iwarp::dissect::{Dir, Options, dissect_file};

    use super::perftest_wire::{self as wire, KeyRecord, Report};
    use super::{Temp, data, iwarp, stderr, stdout};

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
        let server = Server::start(test, args);
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
        let (srv, cli) = run_pair(test, &["-n", "100", "-s", "4096"], &[]);
        for out in [&srv, &cli] {
            assert!(out.contains(title), "{out}");
            assert!(out.contains(" Number of qps   : 1\t\tTransport type : IW\n"), "{out}");
            assert!(out.contains(" local address: LID 0000 QPN 0x"), "{out}");
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

    /// A segment is one of the engine's nudges (see [`super::is_nudge_json`]).
    fn is_nudge(seg: &iwarp::dissect::ddp::Segment) -> bool {
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
        assert_eq!(
            (k1.lid, k1.out_reads, k1.qpn, k1.rkey, k1.vaddr),
            (0, 1, 2, 0xb702_1900, 0x5609_81e2_4000)
        );
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
}

// --- smoltcp transport ----------------------------------------------------------------------

/// A network namespace with a veth pair `va`/`vb` (up, no kernel addresses), deleted on drop
/// whatever happens. Needs root: fails with a message saying so, never skips.
struct SmolNetns {
    name: String,
}

impl SmolNetns {
    fn new(tag: &str) -> SmolNetns {
        let name = format!("iwcli-{tag}-{}", std::process::id());
        let run = |args: &[&str]| {
            let out = Command::new("ip")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run ip {args:?}: {e} (is iproute2 installed?)"));
            assert!(
                out.status.success(),
                "ip {args:?} failed: {} (the smoltcp CLI tests need root: network namespaces, veth, raw sockets)",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        };
        run(&["netns", "add", &name]);
        let ns = SmolNetns { name };
        run(&["-n", &ns.name, "link", "set", "lo", "up"]);
        run(&["-n", &ns.name, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"]);
        run(&["-n", &ns.name, "link", "set", "va", "up"]);
        run(&["-n", &ns.name, "link", "set", "vb", "up"]);
        ns
    }

    /// `iwarp ARGS` inside the namespace.
    fn iwarp(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, env!("CARGO_BIN_EXE_iwarp")]).args(args);
        c
    }
}

impl Drop for SmolNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Waits for `child` at most `limit`; kills it past that.
fn wait_bounded(mut child: std::process::Child, limit: std::time::Duration, what: &str) -> Output {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} ran past {limit:?}: {}{}", stdout(&out), stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
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

#[test]
fn bench_over_smoltcp_reports_the_raw_ratio_and_kernel_tcp() {
    if !iwarp_tests::netns::privileged("bench_over_smoltcp_reports_the_raw_ratio_and_kernel_tcp") {
        return;
    }
    let ns = SmolNetns::new("bench");
    let child = ns
        .iwarp(&[
            "bench",
            "--transport",
            "smoltcp",
            "--iface",
            "va",
            "--peer-iface",
            "vb",
            "--ip",
            "10.82.0.1/24",
            "--peer-ip",
            "10.82.0.2/24",
            "--ops",
            "write,send",
            "--sizes",
            "64,64k",
            "--iters",
            "20",
            "--json",
            "--quiet",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(child, std::time::Duration::from_secs(120), "bench over smoltcp");
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["config"]["transport"], "smoltcp");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        assert!(r["iwarp"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["raw"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["kernel_tcp"]["gbyte_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn bench_smoltcp_flag_errors() {
    let o = iwarp(&["bench", "--transport", "smoltcp", "--iface", "va", "--ip", "10.82.0.1/24"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--peer-iface"), "{}", stderr(&o));
    let o = iwarp(&["bench", "--transport", "smoltcp", "--tap", "tp0", "--ip", "10.82.0.1/24"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("two interfaces"), "{}", stderr(&o));
    let o = iwarp(&[
        "bench",
        "--transport",
        "smoltcp",
        "--iface",
        "iwnosuch8",
        "--peer-iface",
        "iwnosuch9",
        "--ip",
        "10.82.0.1/24",
        "--peer-ip",
        "10.82.0.2/24",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("iwnosuch8"), "{}", stderr(&o));
    let o = iwarp(&["bench", "--peer-iface", "vb"]);
    assert_eq!(o.status.code(), Some(2));
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

// --- iwarp fuzz-peer -------------------------------------------------------------------------

mod fuzz_peer {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::process::{Command, Output, Stdio};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use iwarp::mpa::{Deframed, Deframer, FrameRepr, Framer};

    use super::rping::{Server, free_port};
    use super::{data, iwarp, stderr, stdout};

    const BIN: &str = env!("CARGO_BIN_EXE_iwarp");

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
            (
                &["--target", "127.0.0.1:1", "--recipe", "close-after-reply", "--layers", "mpa"],
                "cannot be used",
            ),
            (
                &["--target", "127.0.0.1:1", "--seed", "1", "--case", "1", "--ops", "x"],
                "not an operation index",
            ),
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
        assert!(
            m.starts_with("the peer failed the health probe before the first case: cannot connect"),
            "{m}"
        );
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
        assert!(
            stderr(&o).starts_with(&format!("fuzz-peer: target {target}, seed 7, 60 s\n")),
            "{}",
            stderr(&o)
        );
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
        let looper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let p = port.to_string();
                let deadline = Instant::now() + Duration::from_secs(120);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let _ = Command::new(BIN)
                        .args(["rping", "-c", "-a", "127.0.0.1", "-p", &p, "-C", "1", "--timeout", "3"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
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

    /// The captures of the findings (tests/data/fuzz-peer/) decode and show what
    /// docs/fuzz-peer.md says they show.
    #[test]
    fn finding_captures_decode() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-peer");
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
                "iwcm-p2p-reset-before-rtr.pcap" | "iwcm-stock-siw-p2p-reset.pcap" => &[
                    "P2P RTR write+read pd 4 bytes 8001c001",
                    "P2P RTR write pd 4 bytes 80018001",
                    "0 FPDUs",
                ],
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
}
