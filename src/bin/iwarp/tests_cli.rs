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
