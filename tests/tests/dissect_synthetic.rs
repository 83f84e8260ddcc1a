//! `iwarp_dissect` on synthetic captures built with etherparse: TCP reassembly (reordering,
//! retransmissions, sequence wraparound, gaps, mid-connection starts), markers, CRC and marker
//! corruption, rejected connections, pcapng with several interfaces.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

use etherparse::PacketBuilder;
use iwarp_dissect::{self as dissect, CrcVerdict, Dir, Options, Report, ViolationKind};
use iwarp_mpa::Framer;

const CLIENT: ([u8; 4], u16) = ([10, 0, 0, 2], 40000);
const SERVER: ([u8; 4], u16) = ([10, 0, 0, 1], 7174);
const CLIENT_ISN: u32 = 0xffff_ff00; // wraps within the first few hundred bytes
const SERVER_ISN: u32 = 0x1234_5678;

/// One TCP segment of the synthetic connection.
#[derive(Clone)]
struct Seg {
    to_server: bool,
    seq: u32,
    syn: bool,
    fin: bool,
    payload: Vec<u8>,
}

fn tcp_packet(s: &Seg, ethernet: bool) -> Vec<u8> {
    let (src, dst) = if s.to_server { (CLIENT, SERVER) } else { (SERVER, CLIENT) };
    let ip = if ethernet {
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(src.0, dst.0, 64)
    } else {
        PacketBuilder::ipv4(src.0, dst.0, 64)
    };
    let mut b = ip.tcp(src.1, dst.1, s.seq, 65535);
    if s.syn {
        b = b.syn();
    }
    if !(s.syn && s.to_server) {
        b = b.ack(1);
    }
    if s.fin {
        b = b.fin();
    }
    let mut out = Vec::new();
    b.write(&mut out, &s.payload).unwrap();
    out
}

/// A classic pcap file (Ethernet) holding the segments.
fn pcap(segs: &[Seg]) -> Vec<u8> {
    let mut f = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    for (i, s) in segs.iter().enumerate() {
        let p = tcp_packet(s, true);
        let len = u32::try_from(p.len()).unwrap();
        f.extend_from_slice(&(1_700_000_000u32).to_le_bytes());
        f.extend_from_slice(&u32::try_from(i).unwrap().to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.extend_from_slice(&p);
    }
    f
}

fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
    let mut body = body.to_vec();
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    let total = u32::try_from(body.len() + 12).unwrap();
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&total.to_le_bytes());
}

/// A pcapng file with two interfaces: raw IP (101) and Ethernet (1); segments alternate.
fn pcapng(segs: &[Seg]) -> Vec<u8> {
    let mut f = Vec::new();
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut f, 0x0a0d_0d0a, &shb);
    for link in [101u16, 1] {
        let mut idb = link.to_le_bytes().to_vec();
        idb.extend_from_slice(&[0, 0]);
        idb.extend_from_slice(&65535u32.to_le_bytes());
        block(&mut f, 1, &idb);
    }
    for (i, s) in segs.iter().enumerate() {
        let iface = u32::try_from(i % 2).unwrap();
        let p = tcp_packet(s, iface == 1);
        let mut epb = iface.to_le_bytes().to_vec();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&u32::try_from(i).unwrap().to_le_bytes());
        let len = u32::try_from(p.len()).unwrap();
        epb.extend_from_slice(&len.to_le_bytes());
        epb.extend_from_slice(&len.to_le_bytes());
        epb.extend_from_slice(&p);
        block(&mut f, 6, &epb);
    }
    f
}

fn mpa_frame(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = key.to_vec();
    v.push(flags);
    v.push(rev);
    v.extend_from_slice(&u16::try_from(pd.len()).unwrap().to_be_bytes());
    v.extend_from_slice(pd);
    v
}

/// ULPDUs that look like DDP segments: control octets, then filler; sizes cross marker spacing.
fn ulpdus(n: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let len = [18usize, 700, 33, 1442, 19, 520][i % 6];
            // An untagged Send: QN 0, MSN i + 1, MO 0, then filler.
            let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
            u.extend_from_slice(&(u32::try_from(i).unwrap() + 1).to_be_bytes());
            u.extend_from_slice(&[0, 0, 0, 0]);
            u.extend((0..len - 18).map(|j| seed.wrapping_add(((i * 7 + j) % 256).to_le_bytes()[0])));
            u
        })
        .collect()
}

struct Conn {
    /// Initiator -> responder stream (Request + FPDUs) and responder -> initiator.
    i2r: Vec<u8>,
    r2i: Vec<u8>,
    sent_i2r: Vec<Vec<u8>>,
    sent_r2i: Vec<Vec<u8>>,
}

fn conn(crc: bool, m_req: bool, m_rep: bool) -> Conn {
    let c = if crc { 0x40 } else { 0 };
    let mut i2r = mpa_frame(b"MPA ID Req Frame", c | 0x10 | if m_req { 0x80 } else { 0 }, 2, &[0, 1, 0, 1]);
    let mut r2i = mpa_frame(b"MPA ID Rep Frame", c | 0x10 | if m_rep { 0x80 } else { 0 }, 2, &[0, 1, 0, 1]);
    let sent_i2r = ulpdus(7, 1);
    let sent_r2i = ulpdus(5, 100);
    // Markers toward the responder when the Reply has M, toward the initiator when the Request has.
    let mut f = Framer::new(crc, m_rep);
    for u in &sent_i2r {
        i2r.extend(f.frame_to_vec(u).unwrap());
    }
    let mut f = Framer::new(crc, m_req);
    for u in &sent_r2i {
        r2i.extend(f.frame_to_vec(u).unwrap());
    }
    Conn { i2r, r2i, sent_i2r, sent_r2i }
}

/// Handshake segments + data cut into `chunk`-byte segments, alternating directions.
fn segments(c: &Conn, chunk: usize) -> Vec<Seg> {
    let mut segs = vec![
        Seg { to_server: true, seq: CLIENT_ISN, syn: true, fin: false, payload: vec![] },
        Seg { to_server: false, seq: SERVER_ISN, syn: true, fin: false, payload: vec![] },
    ];
    let cut = |to_server: bool, isn: u32, bytes: &[u8]| -> Vec<Seg> {
        let mut off = 0usize;
        bytes
            .chunks(chunk)
            .map(|p| {
                let seq = isn.wrapping_add(1).wrapping_add(u32::try_from(off).unwrap());
                off += p.len();
                Seg { to_server, seq, syn: false, fin: false, payload: p.to_vec() }
            })
            .collect()
    };
    let a = cut(true, CLIENT_ISN, &c.i2r);
    let b = cut(false, SERVER_ISN, &c.r2i);
    for i in 0..a.len().max(b.len()) {
        segs.extend(a.get(i).cloned());
        segs.extend(b.get(i).cloned());
    }
    segs
}

fn run(file: &[u8]) -> Report {
    dissect::dissect(file, &Options { keep_ulpdu: true }).unwrap()
}

fn received(r: &Report, dir: Dir) -> Vec<Vec<u8>> {
    r.connections[0].fpdus.iter().filter(|f| f.dir == dir).map(|f| f.ulpdu.clone().unwrap()).collect()
}

#[test]
fn in_order_with_markers_and_crc() {
    let c = conn(true, true, true);
    let r = run(&pcap(&segments(&c, 1000)));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.mpa_connections(), 1);
    let conn0 = &r.connections[0];
    assert_eq!(conn0.initiator.to_string(), "10.0.0.2:40000");
    let n = conn0.negotiated.unwrap();
    assert!(n.crc && n.markers_to_initiator && n.markers_to_responder);
    assert_eq!(received(&r, Dir::InitiatorToResponder), c.sent_i2r);
    assert_eq!(received(&r, Dir::ResponderToInitiator), c.sent_r2i);
    let fpdus = &conn0.fpdus;
    assert!(fpdus.iter().all(|f| matches!(f.crc, CrcVerdict::Good { .. })));
    // A marker every 512 octets of each direction, starting at position 0.
    for d in [Dir::InitiatorToResponder, Dir::ResponderToInitiator] {
        let marks: Vec<u64> = fpdus.iter().filter(|f| f.dir == d).flat_map(|f| f.markers.clone()).collect();
        let end = fpdus.iter().filter(|f| f.dir == d).map(|f| f.offset + f.wire_len as u64).max().unwrap();
        let expected: Vec<u64> = (0..).map(|k| k * 512).take_while(|&p| p < end).collect();
        assert_eq!(marks, expected, "{d}");
    }
}

#[test]
fn reordered_duplicated_and_wrapping_segments() {
    let c = conn(true, false, true);
    let mut segs = segments(&c, 97);
    // Swap neighbours (after the SYNs), then retransmit every fifth segment at the end.
    for i in (2..segs.len() - 1).step_by(3) {
        segs.swap(i, i + 1);
    }
    let dups: Vec<Seg> = segs.iter().skip(2).step_by(5).cloned().collect();
    segs.extend(dups);
    let r = run(&pcap(&segs));
    // The swap puts the responder's first FPDU ahead of the initiator's: the one violation.
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    assert_eq!(r.violations[0].kind, ViolationKind::ResponderFirst);
    assert!(r.notes.iter().all(|n| !n.message.contains("gap")), "{:?}", r.notes);
    assert_eq!(received(&r, Dir::InitiatorToResponder), c.sent_i2r);
    assert_eq!(received(&r, Dir::ResponderToInitiator), c.sent_r2i);
}

#[test]
fn retransmission_with_different_bytes_is_noted_first_copy_wins() {
    let c = conn(true, false, false);
    let mut segs = segments(&c, 200);
    let mut bad = segs[4].clone();
    assert!(bad.to_server);
    bad.payload[50] ^= 0xff;
    segs.push(bad);
    let r = run(&pcap(&segs));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.notes.iter().any(|n| n.message.contains("differs from the first copy")), "{:?}", r.notes);
    assert_eq!(received(&r, Dir::InitiatorToResponder), c.sent_i2r);
}

#[test]
fn gap_decodes_prefix_and_notes_the_hole() {
    let c = conn(false, false, false);
    let mut segs = segments(&c, 300);
    // Drop the third client data segment.
    let idx = segs.iter().enumerate().filter(|(_, s)| s.to_server && !s.syn).nth(2).unwrap().0;
    segs.remove(idx);
    let r = run(&pcap(&segs));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let got = received(&r, Dir::InitiatorToResponder);
    assert!(!got.is_empty() && got.len() < c.sent_i2r.len());
    assert_eq!(got[..], c.sent_i2r[..got.len()]);
    assert_eq!(received(&r, Dir::ResponderToInitiator), c.sent_r2i);
    assert!(
        r.notes.iter().any(|n| n.message.contains("gap in the capture at TCP stream offset 600")),
        "{:?}",
        r.notes
    );
}

#[test]
fn capture_starting_mid_connection_is_not_mpa() {
    let c = conn(false, false, false);
    let segs = segments(&c, 100);
    let r = run(&pcap(&segs[6..]));
    assert_eq!(r.mpa_connections(), 0);
    assert_eq!(r.connections.len(), 1);
    assert!(r.violations.is_empty());
    assert!(r.notes.iter().any(|n| n.message.contains("no MPA handshake seen")), "{:?}", r.notes);
    assert!(r.notes.iter().any(|n| n.message.contains("mid-connection")), "{:?}", r.notes);
}

#[test]
fn pcapng_with_two_interfaces() {
    let c = conn(true, false, false);
    let r = run(&pcapng(&segments(&c, 400)));
    assert_eq!(r.format, dissect::capture::Format::PcapNg);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(received(&r, Dir::InitiatorToResponder), c.sent_i2r);
    assert_eq!(received(&r, Dir::ResponderToInitiator), c.sent_r2i);
}

#[test]
fn corrupted_crc_and_marker_are_violations() {
    let c = conn(true, false, true);
    // Flip a ULPDU octet of the second FPDU toward the responder (not a marker).
    let mut bad = c.i2r.clone();
    let req_len = 24;
    let first_fpdu = Framer::new(true, true).wire_len(c.sent_i2r[0].len());
    bad[req_len + first_fpdu + 10] ^= 1;
    let r = run(&pcap(&segments(&Conn { i2r: bad, ..conn(true, false, true) }, 500)));
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    assert_eq!(r.violations[0].kind, ViolationKind::BadCrc);
    assert_eq!(r.violations[0].dir, Some(Dir::InitiatorToResponder));
    // Decoding went on: every FPDU is there, one of them Bad.
    assert_eq!(received(&r, Dir::InitiatorToResponder).len(), c.sent_i2r.len());
    assert_eq!(r.violation_summary().unwrap(), "1 violation (1 bad CRC)");

    // The marker at position 512 toward the responder: its pointer octets.
    let mut bad = c.i2r.clone();
    bad[req_len + 512 + 3] ^= 0x40;
    let r = run(&pcap(&segments(&Conn { i2r: bad, ..conn(true, false, true) }, 500)));
    assert!(r.violations.iter().any(|v| v.kind == ViolationKind::BadMarker), "{:?}", r.violations);
}

#[test]
fn reject_bit_in_request_is_malformed() {
    // R is only defined for a Reply (RFC 5044 section 7.1).
    let mut c = conn(false, false, false);
    c.i2r[16] |= 0x20;
    let r = run(&pcap(&segments(&c, 500)));
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
    assert_eq!(r.violations[0].kind, ViolationKind::MalformedFrame);
}

#[test]
fn rejected_reply() {
    let mut c = conn(false, false, false);
    c.r2i = mpa_frame(b"MPA ID Rep Frame", 0x30, 2, &[0, 1, 0, 1, 0xde, 0xad]);
    c.i2r.truncate(24);
    let r = run(&pcap(&segments(&c, 500)));
    assert!(r.violations.is_empty());
    let conn0 = &r.connections[0];
    let rep = conn0.reply.as_ref().unwrap();
    assert!(rep.reject);
    assert_eq!(rep.private_data, [0, 1, 0, 1, 0xde, 0xad]);
    assert!(conn0.negotiated.unwrap().rejected);
    assert!(conn0.fpdus.is_empty());
}

#[test]
fn truncated_and_garbage_files_never_panic() {
    let c = conn(true, true, true);
    let file = pcap(&segments(&c, 333));
    for cut in (0..file.len()).step_by(37) {
        match dissect::dissect(&file[..cut], &Options::default()) {
            Ok(r) => {
                if cut > 24 && cut < file.len() {
                    assert!(r.truncated.is_some() || r.packets > 0, "cut {cut}");
                }
            }
            Err(e) => assert!(cut < 4, "cut {cut}: {e}"),
        }
    }
    // Byte flips anywhere: decode or report, never panic.
    for i in (24..file.len()).step_by(11) {
        let mut f = file.clone();
        f[i] ^= 0xa5;
        let _ = dissect::dissect(&f, &Options::default());
    }
    assert!(matches!(
        dissect::dissect(b"not a capture at all", &Options::default()),
        Err(dissect::DissectError::NotACapture)
    ));
}

/// Untagged segment: control octets, RDMAP word 0, QN, MSN, MO, payload.
fn untagged_seg(last: bool, op: u8, qn: u32, msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![if last { 0x41 } else { 0x01 }, 0x40 | op, 0, 0, 0, 0];
    for w in [qn, msn, mo] {
        u.extend_from_slice(&w.to_be_bytes());
    }
    u.extend_from_slice(payload);
    u
}

fn tagged_seg(last: bool, op: u8, stag: u32, to: u64, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![if last { 0xc1 } else { 0x81 }, 0x40 | op];
    u.extend_from_slice(&stag.to_be_bytes());
    u.extend_from_slice(&to.to_be_bytes());
    u.extend_from_slice(payload);
    u
}

/// A connection (no CRC, no markers) carrying the given ULPDUs; the initiator's go first.
fn custom(i2r_ulpdus: &[Vec<u8>], r2i_ulpdus: &[Vec<u8>]) -> Report {
    let mut i2r = mpa_frame(b"MPA ID Req Frame", 0x10, 2, &[0, 1, 0, 1]);
    let mut r2i = mpa_frame(b"MPA ID Rep Frame", 0x10, 2, &[0, 1, 0, 1]);
    let mut f = Framer::new(false, false);
    for u in i2r_ulpdus {
        i2r.extend(f.frame_to_vec(u).unwrap());
    }
    let mut f = Framer::new(false, false);
    for u in r2i_ulpdus {
        r2i.extend(f.frame_to_vec(u).unwrap());
    }
    let c = Conn { i2r, r2i, sent_i2r: vec![], sent_r2i: vec![] };
    run(&pcap(&segments(&c, 4000)))
}

fn kinds(r: &Report) -> Vec<ViolationKind> {
    r.violations.iter().map(|v| v.kind).collect()
}

#[test]
fn msn_gap_and_mo_jump() {
    let r = custom(&[untagged_seg(true, 3, 0, 1, 0, &[1; 8]), untagged_seg(true, 3, 0, 3, 0, &[2; 8])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MsnSequence], "{:?}", r.violations);
    assert!(r.violations[0].message.contains("MSN gap: MSN 3, expected 2"), "{:?}", r.violations);
    // MO jump: a two-segment message whose second segment claims MO 100 after 8 bytes.
    let r =
        custom(&[untagged_seg(false, 3, 0, 1, 0, &[1; 8]), untagged_seg(true, 3, 0, 1, 100, &[2; 8])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MoMismatch], "{:?}", r.violations);
    assert!(r.violations[0].message.contains("MO 100, expected 8"), "{:?}", r.violations);
    // Correct two-segment message, then the next MSN: clean.
    let r = custom(
        &[
            untagged_seg(false, 3, 0, 1, 0, &[1; 8]),
            untagged_seg(true, 3, 0, 1, 8, &[2; 8]),
            untagged_seg(true, 3, 0, 2, 0, &[3; 4]),
        ],
        &[],
    );
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

fn read_request(sink: u32, size: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&sink.to_be_bytes());
    b.extend_from_slice(&0x1000u64.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&0x77u32.to_be_bytes());
    b.extend_from_slice(&0x2000u64.to_be_bytes());
    untagged_seg(true, 1, 1, 1, 0, &b)
}

#[test]
fn read_response_length_checked() {
    let ok = custom(
        &[read_request(0x55, 24)],
        &[tagged_seg(false, 2, 0x55, 0x1000, &[0; 16]), tagged_seg(true, 2, 0x55, 0x1010, &[0; 8])],
    );
    assert!(ok.violations.is_empty(), "{:?}", ok.violations);
    let bad = custom(&[read_request(0x55, 24)], &[tagged_seg(true, 2, 0x55, 0x1000, &[0; 16])]);
    assert_eq!(kinds(&bad), [ViolationKind::ReadResponse], "{:?}", bad.violations);
    assert!(bad.violations[0].message.contains("16 bytes"), "{:?}", bad.violations);
}

#[test]
fn terminate_rfc_and_siw_layouts() {
    use iwarp_dissect::ddp::Body;
    // RFC layout: DDP (1) untagged (2) invalid QN (0x01), M + D, length, copied 18-byte header.
    let copied = untagged_seg(true, 3, 9, 1, 0, &[]);
    let mut p = vec![0x12, 0x01, 0xc0, 0x00, 0x00, 0x12];
    p.extend_from_slice(&copied);
    let siw_p = [[0x21, 0x01, 0x03, 0x00].as_slice(), &[0x00, 0x12], &copied].concat();
    for (payload, used) in [(p, "rfc"), (siw_p, "siw")] {
        let r =
            custom(&[untagged_seg(true, 3, 0, 1, 0, &[0; 4])], &[untagged_seg(true, 7, 2, 1, 0, &payload)]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        let f = r.connections[0].fpdus.iter().find(|f| f.dir == Dir::ResponderToInitiator).unwrap();
        let Some(Body::Terminate(t)) = &f.segment.as_ref().unwrap().body else { panic!("{f:?}") };
        assert_eq!(t.used, used);
        let eff = if used == "siw" { t.siw.clone().unwrap() } else { t.rfc.clone() };
        assert_eq!((eff.layer, eff.error_type, eff.code, eff.m, eff.d, eff.r), (1, 2, 1, true, true, false));
        assert!(eff.defined);
        if used == "siw" {
            assert!(!t.rfc.defined, "{t:?}");
        }
        assert_eq!(t.segment_len, Some(18));
        assert_eq!(t.ddp_header.unwrap().opcode, "Send");
    }
}

#[test]
fn terminate_copies_follow_rdmap_layout() {
    use iwarp_dissect::ddp::Body;
    let decode = |payload: &[u8]| {
        let r =
            custom(&[untagged_seg(true, 3, 0, 1, 0, &[0; 4])], &[untagged_seg(true, 7, 2, 1, 0, payload)]);
        let f = r.connections[0].fpdus.iter().find(|f| f.dir == Dir::ResponderToInitiator).unwrap().clone();
        (r, f)
    };
    // D without M: the length field is still on the wire (not valid), then the copied header.
    let copied = untagged_seg(true, 3, 0, 9, 0, &[]);
    let p = [[0x12, 0x02, 0x40, 0x00, 0xab, 0xcd].as_slice(), &copied].concat();
    let (r, f) = decode(&p);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let Some(Body::Terminate(t)) = &f.segment.as_ref().unwrap().body else { panic!("{f:?}") };
    assert_eq!(t.segment_len, None);
    let h = t.ddp_header.unwrap();
    assert_eq!(h.opcode, "Send");
    assert!(matches!(h.model, iwarp_dissect::ddp::Model::Untagged { qn: 0, msn: 9, .. }), "{h:?}");
    // Remote protection on a Read Request: M, D and R with the 28-byte Read Request copy.
    let rr = read_request(0x55, 24);
    let p = [[0x01, 0x00, 0xe0, 0x00, 0x00, 46].as_slice(), &rr].concat();
    let (r, f) = decode(&p);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let Some(Body::Terminate(t)) = &f.segment.as_ref().unwrap().body else { panic!("{f:?}") };
    assert_eq!((t.used, t.segment_len), ("rfc", Some(46)));
    assert_eq!(t.ddp_header.unwrap().opcode, "ReadReq");
    let q = t.read_request.unwrap();
    assert_eq!((q.sink_stag, q.size, q.source_stag), (0x55, 24, 0x77));
    // RFC layout with R but no Read Request copy: malformed.
    let p = [[0x01, 0x00, 0xe0, 0x00, 0x00, 46].as_slice(), &rr[..18]].concat();
    let (r, _) = decode(&p);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp], "{:?}", r.violations);
    assert!(r.violations[0].message.contains("Terminate message truncated"), "{:?}", r.violations);
    // siw sets R on every remote protection error, with only the DDP header attached.
    let p = [[0x10, 0x00, 0x07, 0x00, 0x00, 0x00].as_slice(), &copied].concat();
    let (r, f) = decode(&p);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let Some(Body::Terminate(t)) = &f.segment.as_ref().unwrap().body else { panic!("{f:?}") };
    assert_eq!(t.used, "siw");
    assert!(t.ddp_header.is_some() && t.read_request.is_none(), "{t:?}");
}

#[test]
fn malformed_ddp_rdmap() {
    // Unknown opcode 0xC.
    let r = custom(&[untagged_seg(true, 0xc, 0, 1, 0, &[])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp]);
    assert!(r.violations[0].message.contains("unknown RDMAP opcode 0xc"), "{:?}", r.violations);
    // DDP version 2.
    let mut u = untagged_seg(true, 3, 0, 1, 0, &[]);
    u[0] = 0x42;
    let r = custom(&[u], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp]);
    assert!(r.violations[0].message.contains("invalid DDP version 2"), "{:?}", r.violations);
    // A tagged opcode (Write) in an untagged segment.
    let r = custom(&[untagged_seg(true, 0, 0, 1, 0, &[])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp]);
}

/// A 52-byte RFC 7306 Atomic Request body (op code in the low 4 bits of the first word).
fn atomic_request(op_word: u32, id: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&op_word.to_be_bytes());
    body.extend_from_slice(&id.to_be_bytes()); // request id
    body.extend_from_slice(&0x99u32.to_be_bytes()); // remote STag
    for v in [0x4000u64, 5, u64::MAX, 6, u64::MAX] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    assert_eq!(body.len(), 52);
    body
}

#[test]
fn atomic_request_and_immediate_data() {
    use iwarp_dissect::ddp::Body;
    let r = custom(
        &[
            untagged_seg(true, 0xa, 1, 1, 0, &atomic_request(2, 7)), // CompareSwap
            untagged_seg(true, 8, 0, 1, 0, &0x1122u64.to_be_bytes()),
            untagged_seg(true, 0xa, 1, 2, 0, &atomic_request(1, 8)), // Swap
            // Reserved upper bits are not part of the op code: FetchAdd.
            untagged_seg(true, 0xa, 1, 3, 0, &atomic_request(0xffff_fff0, 9)),
        ],
        &[untagged_seg(true, 0xb, 3, 1, 0, &[0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8])],
    );
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let f = &r.connections[0].fpdus;
    let body = |i: usize| f[i].segment.as_ref().unwrap().body.clone();
    let Some(Body::AtomicRequest(a)) = body(0) else { panic!("{:?}", f[0]) };
    assert_eq!(
        (a.op, a.op_name, a.request_id, a.remote_stag, a.remote_to),
        (2, "CompareSwap", 7, 0x99, 0x4000)
    );
    assert_eq!(
        (a.add_swap_data, a.add_swap_mask, a.compare_data, a.compare_mask),
        (5, u64::MAX, 6, u64::MAX)
    );
    assert_eq!(body(1), Some(Body::ImmediateData { data: 0x1122 }));
    let Some(Body::AtomicRequest(a)) = body(2) else { panic!("{:?}", f[2]) };
    assert_eq!((a.op, a.op_name, a.request_id), (1, "Swap", 8));
    let Some(Body::AtomicRequest(a)) = body(3) else { panic!("{:?}", f[3]) };
    assert_eq!((a.op, a.op_name, a.request_id), (0, "FetchAdd", 9));
    let resp = f.iter().find(|f| f.dir == Dir::ResponderToInitiator).unwrap();
    assert_eq!(
        resp.segment.as_ref().unwrap().body,
        Some(Body::AtomicResponse { request_id: 7, original: 0x0102_0304_0506_0708 })
    );
    // JSON keeps the dissector's field names.
    let json = serde_json::to_value(body(0)).unwrap();
    assert_eq!(json["type"], "atomic_request");
    assert_eq!(json["op_name"], "CompareSwap");
    assert_eq!(json["add_swap_mask"], u64::MAX);
}

#[test]
fn atomic_bodies_truncated() {
    // 51 bytes: one short of an Atomic Request (the old decoder demanded 56).
    let r = custom(&[untagged_seg(true, 0xa, 1, 1, 0, &atomic_request(2, 7)[..51])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp], "{:?}", r.violations);
    assert!(
        r.violations[0].message.contains("Atomic Request body truncated: 52 bytes needed, 51 present"),
        "{:?}",
        r.violations
    );
    // An unknown op code still decodes (the responder would answer it with a Terminate).
    let r = custom(&[untagged_seg(true, 0xa, 1, 1, 0, &atomic_request(3, 7))], &[]);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let Some(iwarp_dissect::ddp::Body::AtomicRequest(a)) =
        &r.connections[0].fpdus[0].segment.as_ref().unwrap().body
    else {
        panic!()
    };
    assert_eq!((a.op, a.op_name), (3, "unknown"));
    let r = custom(&[untagged_seg(true, 3, 0, 1, 0, &[0; 4])], &[untagged_seg(true, 0xb, 3, 1, 0, &[0; 11])]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp], "{:?}", r.violations);
    assert!(r.violations[0].message.contains("Atomic Response body truncated: 12 bytes needed"));
    let r = custom(&[untagged_seg(true, 8, 0, 1, 0, &[0; 7])], &[]);
    assert_eq!(kinds(&r), [ViolationKind::MalformedDdp], "{:?}", r.violations);
    assert!(r.violations[0].message.contains("Immediate Data truncated: 8 bytes needed, 7 present"));
}
