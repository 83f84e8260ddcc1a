//! `iwarp dissect`: exit codes, text, JSON Lines and `-v` output, errors, memory.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

use std::path::Path;
use std::process::Command;

use common::{Temp, data, iwarp, json_lines, records, stderr, stdout};

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
    let r = iwarp_dissect::dissect(file, &iwarp_dissect::Options { keep_ulpdu: true }).unwrap();
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
    let records = u64::try_from(fpdus * std::mem::size_of::<iwarp_dissect::FpduInfo>()).unwrap();
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
