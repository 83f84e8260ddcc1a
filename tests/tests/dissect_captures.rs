//! `iwarp_dissect` against the real siw/rxe captures in `tests/data/siw` (see its README).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

use iwarp_dissect::ddp::{Body, Model, Segment};
use iwarp_dissect::{self as dissect, Connection, CrcVerdict, Dir, FpduInfo, Options, Report, ViolationKind};

fn dissect(name: &str) -> Report {
    let path = iwarp_tests::testdata_dir().join("siw").join(name);
    dissect::dissect_file(&path, &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn mpa_conns(r: &Report) -> Vec<&Connection> {
    r.connections.iter().filter(|c| c.mpa).collect()
}

/// Every capture in the directory, so that a new one cannot be forgotten.
fn all_captures() -> Vec<String> {
    let dir = iwarp_tests::testdata_dir().join("siw");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap") || n.ends_with(".pcapng"))
        .collect();
    names.sort();
    assert!(names.len() >= 16, "{names:?}");
    names
}

/// rev 2 + H, IRD/ORD as given, no markers, no P2P.
fn assert_v2(c: &Connection, ird_ord: u16, crc: bool) {
    for f in [c.request.as_ref().unwrap(), c.reply.as_ref().unwrap()] {
        assert_eq!(f.revision, 2);
        assert!(f.enhanced);
        assert_eq!(f.flags & 0xf0, if crc { 0x50 } else { 0x10 });
        assert!(!f.markers && !f.reject);
        let w = f.ird_ord.unwrap();
        assert_eq!((w.ird, w.ord, w.p2p), (ird_ord, ird_ord, false));
        assert_eq!(f.pd_len, 4);
    }
    let n = c.negotiated.unwrap();
    assert_eq!(n.crc, crc);
    assert!(!n.markers_to_initiator && !n.markers_to_responder && !n.rejected);
    assert_eq!(n.rtr, None);
}

fn assert_crc(c: &Connection, on: bool) {
    assert!(!c.fpdus.is_empty());
    for f in &c.fpdus {
        match f.crc {
            CrcVerdict::Good { .. } => assert!(on, "{f:?}"),
            CrcVerdict::NotChecked { value } => assert!(!on && value == 0, "{f:?}"),
            CrcVerdict::Bad { .. } => panic!("bad CRC {f:?}"),
        }
        assert!(f.markers.is_empty());
        assert_eq!((2 + f.ulpdu_len + f.pad) % 4, 0);
    }
}

#[test]
fn every_capture_decodes_without_violations() {
    for name in all_captures() {
        let r = dissect(&name);
        if name == "siw-ucmatose.pcap" {
            assert_eq!(r.violations.len(), 1, "{name}: {:?}", r.violations);
            assert_eq!(r.violations[0].kind, ViolationKind::ResponderFirst);
        } else {
            assert!(r.violations.is_empty(), "{name}: {:?}", r.violations);
        }
        // Every FPDU of every capture decodes as DDP/RDMAP.
        for c in mpa_conns(&r) {
            assert!(c.fpdus.iter().all(|f| f.segment.is_some()), "{name}");
        }
        assert_eq!(r.truncated, None, "{name}");
        assert!(r.packets > 0, "{name}");
        let expected_mpa = if name.starts_with("rxe") { 0 } else { 1 };
        assert!(r.mpa_connections() >= expected_mpa, "{name}");
        for c in mpa_conns(&r) {
            assert!(c.request.is_some() && c.reply.is_some(), "{name} conn {}", c.id);
            // The siw guest B (10.77.0.2) is the initiator in the two-guest captures.
            if name.starts_with("siw-") {
                assert_eq!(c.initiator.ip().to_string(), "10.77.0.2", "{name}");
                assert_eq!(c.responder.ip().to_string(), "10.77.0.1", "{name}");
            }
        }
    }
}

#[test]
fn rping_defaults() {
    let r = dissect("siw-rping.pcap");
    let conns = mpa_conns(&r);
    assert_eq!(conns.len(), 1);
    let c = conns[0];
    assert_v2(c, 1, false);
    assert_eq!(c.request.as_ref().unwrap().private_data, [0, 1, 0, 1]);
    assert_crc(c, false);
    // The initiator speaks first: a Send (untagged, last, opcode 3).
    let first = c.fpdus.first().unwrap();
    assert_eq!(first.dir, Dir::InitiatorToResponder);
    let ddp = first.ddp.unwrap();
    assert!(!ddp.tagged && ddp.last);
    assert_eq!(ddp.opcode_name, "Send");
    // Per ping: Send, Read Req, Read Resp, Send, Send, Write, Send: all four opcodes occur.
    for op in ["Send", "ReadReq", "ReadResp", "Write"] {
        assert!(c.fpdus.iter().any(|f| f.ddp.unwrap().opcode_name == op), "{op}");
    }
    // Offsets chain: each FPDU starts where the previous one of its direction ended.
    for d in [Dir::InitiatorToResponder, Dir::ResponderToInitiator] {
        let mut next = 0;
        for (i, f) in c.fpdus.iter().filter(|f| f.dir == d).enumerate() {
            assert_eq!(f.index, i + 1);
            assert_eq!(f.offset, next);
            next += f.wire_len as u64;
        }
    }
}

#[test]
fn rping_crc_21_good_fpdus() {
    let r = dissect("siw-rping-crc.pcap");
    let c = mpa_conns(&r)[0];
    assert_v2(c, 1, true);
    assert_eq!(c.fpdus.len(), 21);
    assert_crc(c, true);
}

#[test]
fn write_bw_crc_80_good_fpdus() {
    let r = dissect("siw-write-bw-crc.pcap");
    assert_eq!(r.mpa_connections(), 2);
    assert_eq!(r.fpdus(), 80);
    for c in mpa_conns(&r) {
        assert!(c.negotiated.unwrap().crc);
        if !c.fpdus.is_empty() {
            assert_crc(c, true);
        }
    }
    // 8 KiB Writes: 5 x 1442 + 1066 tagged FPDUs.
    let lens: Vec<usize> = r.connections.iter().flat_map(|c| &c.fpdus).map(|f| f.ulpdu_len).collect();
    assert!(lens.iter().filter(|&&l| l == 1442).count() >= 40);
    assert!(lens.contains(&1066));
}

#[test]
fn perftest_two_connections() {
    for name in ["siw-write-bw.pcap", "siw-read-bw.pcap", "siw-send-bw.pcap", "siw-write-bw-crc.pcap"] {
        let r = dissect(name);
        let conns = mpa_conns(&r);
        assert_eq!(conns.len(), 2, "{name}");
        assert_eq!(conns[0].request.as_ref().unwrap().private_data, [0, 0, 0, 0], "{name}");
        assert_crc(conns[1], name.contains("crc"));
    }
    let r = dissect("siw-read-bw.pcap");
    let conns = mpa_conns(&r);
    assert_v2(conns[0], 0, false);
    assert_v2(conns[1], 128, false);
    assert_eq!(conns[1].reply.as_ref().unwrap().private_data, [0, 0x80, 0, 0x80]);
    assert!(conns[1].fpdus.iter().any(|f| f.ddp.unwrap().opcode_name == "ReadResp"));
    assert!(conns[1].fpdus.iter().any(|f| f.ddp.unwrap().opcode_name == "ReadReq"));
}

#[test]
fn mpa_v1_captures() {
    for name in ["siw-rping-mpav1.pcap", "siw-send-bw-mpav1.pcap"] {
        let r = dissect(name);
        for c in mpa_conns(&r) {
            for f in [c.request.as_ref().unwrap(), c.reply.as_ref().unwrap()] {
                assert_eq!(f.revision, 1, "{name}");
                assert!(!f.enhanced && f.ird_ord.is_none() && f.pd_len == 0, "{name}");
            }
        }
    }
    // rping v1: the client sends one Send, then FIN.
    let r = dissect("siw-rping-mpav1.pcap");
    let c = mpa_conns(&r)[0];
    assert_eq!(c.fpdus.len(), 1);
    assert_eq!(c.fpdus[0].dir, Dir::InitiatorToResponder);
    assert_eq!(c.fpdus[0].ddp.unwrap().opcode_name, "Send");
    assert_eq!(dissect("siw-send-bw-mpav1.pcap").mpa_connections(), 2);
}

#[test]
fn peer_to_peer_rtr() {
    for name in ["siw-rping-p2p.pcap", "siw-ucmatose-p2p.pcap"] {
        let r = dissect(name);
        let c = mpa_conns(&r)[0];
        let req = c.request.as_ref().unwrap();
        let rep = c.reply.as_ref().unwrap();
        assert_eq!(req.private_data, [0x80, 0x01, 0xc0, 0x01], "{name}");
        assert_eq!(rep.private_data, [0x80, 0x01, 0x80, 0x01], "{name}");
        let (q, p) = (req.ird_ord.unwrap(), rep.ird_ord.unwrap());
        assert!(q.p2p && q.rtr_write && q.rtr_read && !q.rtr_send);
        assert!(p.p2p && p.rtr_write && !p.rtr_read && !p.rtr_send);
        assert_eq!(c.negotiated.unwrap().rtr, Some("write"));
        // First FPDU: the initiator's zero-length tagged RDMA Write (14-byte tagged header only).
        let first = &c.fpdus[0];
        assert_eq!(first.dir, Dir::InitiatorToResponder, "{name}");
        assert_eq!(first.offset, 0);
        assert_eq!(first.ulpdu_len, 14, "{name}");
        let ddp = first.ddp.unwrap();
        assert!(ddp.tagged && ddp.last);
        assert_eq!(ddp.opcode_name, "Write");
    }
}

#[test]
fn ucmatose_responder_sends_first_is_the_only_violation() {
    let r = dissect("siw-ucmatose.pcap");
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    let v = &r.violations[0];
    assert_eq!(v.kind, ViolationKind::ResponderFirst);
    assert_eq!(v.dir, Some(Dir::ResponderToInitiator));
    assert!(v.message.contains("responder sent 2 FPDUs before the initiator's first FPDU"), "{v}");
    let c = mpa_conns(&r)[0];
    assert_v2(c, 1, false);
    assert_eq!(c.fpdus.len(), 2);
    assert!(c.fpdus.iter().all(|f| f.dir == Dir::ResponderToInitiator));
    assert_eq!(v.frame, c.fpdus[0].frame);
    // Two 64-byte Sends, MSN 1 and 2.
    let msns: Vec<(u32, usize)> = c.fpdus.iter().map(|f| (untagged(f).2, seg(f).payload_len)).collect();
    assert_eq!(msns, [(1, 64), (2, 64)]);
}

fn seg(f: &FpduInfo) -> &Segment {
    f.segment.as_ref().unwrap()
}

/// (QN, MO, MSN) of an untagged segment.
fn untagged(f: &FpduInfo) -> (u32, u32, u32) {
    match seg(f).header.model {
        Model::Untagged { qn, mo, msn, .. } => (qn, mo, msn),
        Model::Tagged { .. } => panic!("tagged {f:?}"),
    }
}

#[test]
fn rping_ddp_fields() {
    let r = dissect("siw-rping.pcap");
    let c = mpa_conns(&r)[0];
    let first = seg(&c.fpdus[0]);
    assert_eq!(first.header.opcode, "Send");
    assert_eq!(untagged(&c.fpdus[0]), (0, 0, 1));
    assert_eq!(first.payload_len, 16);
    // Each Read Request's size equals the total of its Read Response, sink STag/TO match.
    let reqs: Vec<_> = c
        .fpdus
        .iter()
        .filter_map(|f| match &seg(f).body {
            Some(Body::ReadRequest(q)) => Some((f.dir, *q)),
            _ => None,
        })
        .collect();
    let resps: Vec<_> = c.fpdus.iter().filter(|f| seg(f).header.opcode == "ReadResp").collect();
    assert_eq!(reqs.len(), 3);
    assert_eq!(resps.len(), 3);
    for ((dir, q), resp) in reqs.iter().zip(&resps) {
        assert_eq!(*dir, Dir::ResponderToInitiator);
        assert_eq!(resp.dir, Dir::InitiatorToResponder);
        assert!(seg(resp).header.last);
        assert_eq!(seg(resp).payload_len, q.size as usize);
        assert_eq!(seg(resp).header.model, Model::Tagged { stag: q.sink_stag, to: q.sink_to });
    }
}

#[test]
fn write_bw_messages_are_8_kib() {
    let r = dissect("siw-write-bw.pcap");
    let c = mpa_conns(&r)[1];
    let writes: Vec<&FpduInfo> = c.fpdus.iter().filter(|f| seg(f).header.opcode == "Write").collect();
    // Group into messages by L; every message: 5 x 1428 + 1052 = 8192 payload bytes, TO advancing.
    let mut msgs: Vec<Vec<&FpduInfo>> = vec![vec![]];
    for w in &writes {
        msgs.last_mut().unwrap().push(w);
        if seg(w).header.last {
            msgs.push(vec![]);
        }
    }
    msgs.pop();
    assert!(msgs.len() >= 8, "{}", msgs.len());
    for m in &msgs {
        let lens: Vec<usize> = m.iter().map(|f| seg(f).payload_len).collect();
        assert_eq!(lens, [1428, 1428, 1428, 1428, 1428, 1052]);
        assert_eq!(lens.iter().sum::<usize>(), 8192);
        assert!(m.iter().all(|f| f.ulpdu_len == seg(f).payload_len + 14));
        let Model::Tagged { stag, to } = seg(m[0]).header.model else { panic!() };
        let mut next = to;
        for f in m {
            assert_eq!(seg(f).header.model, Model::Tagged { stag, to: next });
            next += seg(f).payload_len as u64;
        }
    }
}

#[test]
fn send_bw_msn_progression() {
    let r = dissect("siw-send-bw.pcap");
    let c = mpa_conns(&r)[1];
    for dir in [Dir::InitiatorToResponder, Dir::ResponderToInitiator] {
        let mut expected_msn = 1;
        let mut mo = 0;
        let mut big = 0;
        // perftest also writes a few 4-byte tagged flags; the Sends are the untagged segments.
        let sends =
            c.fpdus.iter().filter(|f| f.dir == dir && matches!(seg(f).header.model, Model::Untagged { .. }));
        for f in sends {
            let (qn, m, msn) = untagged(f);
            assert_eq!((qn, msn, m), (0, expected_msn, mo), "{f:?}");
            mo += u32::try_from(seg(f).payload_len).unwrap();
            if seg(f).header.last {
                if mo == 8192 {
                    big += 1;
                }
                expected_msn += 1;
                mo = 0;
            }
        }
        if dir == Dir::InitiatorToResponder {
            // The client's 8 KiB Sends: MSN 1, 2, ... each spread over several segments.
            assert!(big >= 8 && expected_msn > 8, "{big} {expected_msn}");
        }
    }
}

#[test]
fn read_bw_requests_and_multi_fpdu_responses() {
    let r = dissect("siw-read-bw.pcap");
    let c = mpa_conns(&r)[1];
    let reqs: Vec<_> = c
        .fpdus
        .iter()
        .filter_map(|f| match &seg(f).body {
            Some(Body::ReadRequest(q)) => Some(*q),
            _ => None,
        })
        .collect();
    assert!(reqs.len() >= 8);
    assert!(reqs.iter().all(|q| q.size == 8192));
    let resp: Vec<&FpduInfo> = c.fpdus.iter().filter(|f| seg(f).header.opcode == "ReadResp").collect();
    let total: usize = resp.iter().map(|f| seg(f).payload_len).sum();
    assert_eq!(total, 8192 * reqs.len());
    let lasts = resp.iter().filter(|f| seg(f).header.last).count();
    assert_eq!(lasts, reqs.len());
    assert!(resp.len() >= 6 * reqs.len());
}

#[test]
fn host_probes() {
    for name in ["host-probe-netns.pcap", "host-probe-hostfwd.pcap"] {
        let r = dissect(name);
        let conns = mpa_conns(&r);
        assert_eq!(conns.len(), 3, "{name}");
        let revs: Vec<(u8, u8, bool)> = conns
            .iter()
            .map(|c| {
                let (q, p) = (c.request.as_ref().unwrap(), c.reply.as_ref().unwrap());
                (q.revision, p.revision, p.crc)
            })
            .collect();
        assert_eq!(revs, [(1, 1, false), (2, 2, false), (1, 1, true)], "{name}");
        let w = conns[1].reply.as_ref().unwrap().ird_ord.unwrap();
        assert_eq!((w.ird, w.ord), (4, 4));
        assert_eq!(conns[1].reply.as_ref().unwrap().private_data, [0, 4, 0, 4]);
        assert!(conns[2].negotiated.unwrap().crc);
        assert!(conns.iter().all(|c| c.fpdus.is_empty()));
    }
    for name in ["host-probe-netns-rev.pcap", "host-probe-guestfwd.pcap"] {
        let r = dissect(name);
        let c = mpa_conns(&r)[0];
        let q = c.request.as_ref().unwrap();
        assert_eq!((q.revision, q.private_data.as_slice()), (2, &[0, 1, 0, 1][..]), "{name}");
        // siw's first Send: the 16-byte rping buffer advert after an 18-byte untagged header.
        let f = &c.fpdus[0];
        assert_eq!(f.dir, Dir::InitiatorToResponder);
        assert_eq!(f.ulpdu_len, 18 + 16, "{name}");
        assert_eq!(f.ddp.unwrap().opcode_name, "Send");
    }
}

#[test]
fn rxe_has_no_mpa() {
    let r = dissect("rxe-rping.pcap");
    assert_eq!(r.mpa_connections(), 0);
    assert_eq!(r.fpdus(), 0);
    assert!(r.violations.is_empty());
    assert!(r.notes.iter().any(|n| n.message.contains("no MPA connection")));
}

#[test]
fn ulpdu_bytes_kept_on_request() {
    let path = iwarp_tests::testdata_dir().join("siw/siw-rping-crc.pcap");
    let r = dissect::dissect_file(&path, &Options { keep_ulpdu: true }).unwrap();
    for f in r.connections.iter().flat_map(|c| &c.fpdus) {
        let u = f.ulpdu.as_ref().unwrap();
        assert_eq!(u.len(), f.ulpdu_len);
        assert_eq!(u[0], f.ddp.unwrap().ddp);
    }
    assert!(
        dissect("siw-rping-crc.pcap").connections.iter().flat_map(|c| &c.fpdus).all(|f| f.ulpdu.is_none())
    );
}

/// The `dissect` fuzz target's entry point (`iwarp_dissect::fuzz_dissect`) accepts every real
/// capture and every prefix of it (a capture cut short) without a broken invariant, and its
/// streamed counts agree with the collected report.
#[test]
fn fuzz_entry_on_the_captures_and_their_prefixes() {
    let mut fpdus_of_prefixes = 0;
    for name in all_captures() {
        let path = iwarp_tests::testdata_dir().join("siw").join(&name);
        let bytes = std::fs::read(&path).unwrap();
        let report = dissect::dissect(&bytes, &Options { keep_ulpdu: true }).unwrap();
        let s = dissect::fuzz_dissect(&bytes).unwrap_or_else(|| panic!("{name}: not a capture"));
        assert_eq!(s.connections, report.connections.len(), "{name}");
        assert_eq!(s.mpa_connections, report.mpa_connections(), "{name}");
        assert_eq!(s.fpdus, report.fpdus(), "{name}");
        assert_eq!(s.violations, report.violations.len(), "{name}");
        assert_eq!(s.notes, report.notes.len(), "{name}");
        assert_eq!(s.violation_summary(), report.violation_summary(), "{name}");
        for cut in (24..bytes.len()).step_by(997) {
            fpdus_of_prefixes += dissect::fuzz_dissect(&bytes[..cut]).unwrap().fpdus;
        }
    }
    assert!(fpdus_of_prefixes > 100, "the cut captures still hold FPDUs: {fpdus_of_prefixes}");
    assert_eq!(dissect::fuzz_dissect(b"not a capture"), None);
}
