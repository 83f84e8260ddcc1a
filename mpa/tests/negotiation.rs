//! Table-driven tests of MPA negotiation: both ends run through Request -> Reply on the wire
//! bytes, and siw's frames from tests/data/siw are answered and accepted.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use iwarp_mpa::{
    ConnParams, CrcPolicy, FrameKind, FrameRepr, IrdOrd, LlpErrorCode, NegotiationError, Policy, RtrType,
    RtrTypes,
};

/// Runs a whole handshake through emitted and re-parsed bytes.
fn handshake(init: &Policy, resp: &Policy) -> Result<(ConnParams, ConnParams), (NegotiationError, bool)> {
    let req_bytes = init.request(b"").map_err(|e| (e, false))?.to_vec().unwrap();
    let req = FrameRepr::parse(&req_bytes).unwrap();
    let (reply, server) = match resp.respond(&req, b"") {
        Ok(r) => r,
        Err(refusal) => {
            // A refusal with a Reply sends a reject: the initiator must see it as such.
            if let Some(rej) = refusal.reply {
                let bytes = rej.to_vec().unwrap();
                let parsed = FrameRepr::parse(&bytes).unwrap();
                assert!(parsed.reject);
                assert!(matches!(init.accept_reply(&parsed), Err(NegotiationError::Rejected { .. })));
                return Err((refusal.error, true));
            }
            return Err((refusal.error, false));
        }
    };
    let reply_bytes = reply.to_vec().unwrap();
    let reply = FrameRepr::parse(&reply_bytes).unwrap();
    let client = init.accept_reply(&reply).map_err(|e| (e, false))?;
    Ok((client, server))
}

/// A plain revision-2 Reply (no CRC, no markers) carrying `word`.
fn reply_with(word: IrdOrd) -> FrameRepr<'static> {
    FrameRepr {
        kind: FrameKind::Reply,
        markers: false,
        crc: false,
        reject: false,
        revision: 2,
        ird_ord: Some(word),
        reserved: 0,
        private_data: &[],
    }
}

fn check_consistent(c: &ConnParams, s: &ConnParams) {
    assert_eq!(c.crc, s.crc, "both ends agree on CRC");
    assert_eq!(c.markers_tx, s.markers_rx, "markers towards the responder");
    assert_eq!(s.markers_tx, c.markers_rx, "markers towards the initiator");
    assert_eq!(c.rtr, s.rtr, "RTR type");
    assert_eq!(c.revision, s.revision);
    if c.revision == 2 {
        assert!(c.ord <= s.ird, "initiator ORD {} fits responder IRD {}", c.ord, s.ird);
        assert!(s.ord <= c.ird, "responder ORD {} fits initiator IRD {}", s.ord, c.ird);
    }
    assert!(s.must_wait_for_peer() && !c.must_wait_for_peer());
}

#[test]
fn crc_table() {
    use CrcPolicy::*;
    // (initiator, responder, Ok(crc) or Err(error code, reject sent))
    type Row = (CrcPolicy, CrcPolicy, Result<bool, (LlpErrorCode, bool)>);
    let table: &[Row] = &[
        (Off, Off, Ok(false)),
        (Off, Wanted, Ok(true)),
        (Off, Required, Ok(true)),
        (Off, Strict, Err((LlpErrorCode::InvalidRequestReply, true))),
        (Wanted, Off, Ok(true)),
        (Wanted, Wanted, Ok(true)),
        (Wanted, Strict, Ok(true)),
        (Required, Off, Ok(true)),
        (Required, Strict, Ok(true)),
        (Strict, Off, Ok(true)),
        (Strict, Strict, Ok(true)),
    ];
    for &(i, r, expect) in table {
        let init = Policy { crc: i, ..Policy::default() };
        let resp = Policy { crc: r, ..Policy::default() };
        match (handshake(&init, &resp), expect) {
            (Ok((c, s)), Ok(crc)) => {
                check_consistent(&c, &s);
                assert_eq!(c.crc, crc, "{i:?} x {r:?}");
            }
            (Err((e, rejected)), Err((code, rej))) => {
                assert_eq!(e.llp_code(), Some(code), "{i:?} x {r:?}");
                assert_eq!(rejected, rej, "{i:?} x {r:?}");
            }
            (got, _) => panic!("{i:?} x {r:?}: {got:?}"),
        }
    }
}

/// A Reply without C refused by an initiator that requires CRC (siw `mpa_crc_required`).
#[test]
fn required_crc_refuses_plain_reply() {
    let init = Policy { crc: CrcPolicy::Required, ..Policy::default() };
    let reply = reply_with(IrdOrd { ird: 1, ord: 1, ..IrdOrd::default() });
    let e = init.accept_reply(&reply).unwrap_err();
    assert_eq!(e, NegotiationError::CrcRequired);
    assert_eq!(e.llp_code(), Some(LlpErrorCode::InvalidRequestReply));
    // Wanted takes the same Reply and uses CRC anyway: our C turns it on.
    let wanted = Policy { crc: CrcPolicy::Wanted, ..Policy::default() };
    assert!(wanted.accept_reply(&reply).unwrap().crc);
}

#[test]
fn markers_table() {
    for (i_want, i_can, r_want, r_can) in itertools_product() {
        let init = Policy { markers_wanted: i_want, markers_supported: i_can, ..Policy::default() };
        let resp = Policy { markers_wanted: r_want, markers_supported: r_can, ..Policy::default() };
        let res = handshake(&init, &resp);
        let case = (i_want, i_can, r_want, r_can);
        if i_want && !r_can {
            // The responder cannot insert markers: it rejects (siw does this for every M).
            let (e, rejected) = res.unwrap_err();
            assert_eq!(e, NegotiationError::MarkersUnsupported, "{case:?}");
            assert!(rejected);
        } else if r_want && !i_can {
            let (e, rejected) = res.unwrap_err();
            assert_eq!(e, NegotiationError::MarkersUnsupported, "{case:?}");
            assert!(!rejected, "the initiator refuses after the Reply and terminates");
            assert_eq!(e.llp_code(), Some(LlpErrorCode::InvalidRequestReply));
        } else {
            let (c, s) = res.unwrap();
            check_consistent(&c, &s);
            assert_eq!(c.markers_rx, i_want, "{case:?}");
            assert_eq!(s.markers_rx, r_want, "{case:?}");
        }
    }
}

fn itertools_product() -> Vec<(bool, bool, bool, bool)> {
    let b = [false, true];
    let mut v = Vec::new();
    for a in b {
        for c in b {
            for d in b {
                for e in b {
                    v.push((a, c, d, e));
                }
            }
        }
    }
    v
}

#[test]
fn revision_table() {
    // (initiator rev, responder rev, Ok(revision in use) / Err)
    for (ir, rr, expect) in [(1u8, 1u8, Some(1u8)), (1, 2, Some(1)), (2, 1, Some(1)), (2, 2, Some(2))] {
        let init = Policy { revision: ir, ..Policy::default() };
        let resp = Policy { revision: rr, ..Policy::default() };
        let (c, s) = handshake(&init, &resp).unwrap();
        check_consistent(&c, &s);
        assert_eq!(Some(c.revision), expect, "{ir} x {rr}");
        assert_eq!(c.peer_ird_ord.is_some(), c.revision == 2);
    }
    // A peer-to-peer initiator cannot fall back to revision 1.
    let init = Policy { peer_to_peer: true, ..Policy::default() };
    let resp = Policy { revision: 1, ..Policy::default() };
    let (e, _) = handshake(&init, &resp).unwrap_err();
    assert_eq!(e, NegotiationError::EnhancedMissing);
}

#[test]
fn revision_edge_cases() {
    let p = Policy::default();
    let mut req = p.request(b"").unwrap();
    // Revision 0 (pre-RFC drafts, accepted by Linux) is answered with revision 1.
    req.revision = 0;
    req.ird_ord = None;
    let (reply, params) = p.respond(&req, b"").unwrap();
    assert_eq!((reply.revision, params.revision), (1, 1));
    // Above 2: closed without a Reply.
    req.revision = 3;
    let refusal = p.respond(&req, b"").unwrap_err();
    assert_eq!(refusal.error, NegotiationError::UnsupportedRevision { revision: 3 });
    assert!(refusal.reply.is_none());
    assert_eq!(refusal.error.llp_code(), Some(LlpErrorCode::InvalidRequestReply));
    // A Reply of a higher revision than the Request is invalid.
    let v1 = Policy { revision: 1, ..Policy::default() };
    let (reply2, _) = p.respond(&p.request(b"").unwrap(), b"").unwrap();
    assert_eq!(v1.accept_reply(&reply2), Err(NegotiationError::UnsupportedRevision { revision: 2 }));
    // A revision-2 Reply without the Enhanced word answers an Enhanced Request wrongly.
    let bare = FrameRepr { ird_ord: None, ..reply2 };
    assert_eq!(p.accept_reply(&bare), Err(NegotiationError::EnhancedMissing));
    // A Request where a Reply is due, and the other way round.
    assert!(matches!(p.accept_reply(&p.request(b"").unwrap()), Err(NegotiationError::Frame(_))));
    assert!(p.respond(&reply2, b"").is_err());
}

#[test]
fn ird_ord_table() {
    // (init ird, init ord, resp ird, resp ord, relaxed) -> Ok((ci, co, si, so)) or Err(code)
    type Row = (u16, u16, u16, u16, bool, Result<(u16, u16, u16, u16), LlpErrorCode>);
    let table: &[Row] = &[
        (1, 1, 1, 1, true, Ok((1, 1, 1, 1))),
        (128, 128, 128, 128, true, Ok((128, 128, 128, 128))),
        // Responder wants more Reads than the initiator's IRD: lowered when relaxed.
        (4, 4, 16, 16, true, Ok((4, 4, 4, 4))),
        (4, 4, 16, 16, false, Err(LlpErrorCode::InsufficientIrd)),
        // Initiator wants more Reads than the responder's IRD: the initiator lowers its ORD.
        (16, 16, 4, 4, true, Ok((16, 4, 4, 4))),
        (16, 16, 4, 4, false, Err(LlpErrorCode::InsufficientIrd)),
        // No Reads at all is fine.
        (0, 0, 0, 0, false, Ok((0, 0, 0, 0))),
        (8, 0, 8, 2, false, Ok((8, 0, 0, 2))),
    ];
    for &(ii, io, ri, ro, relaxed, expect) in table {
        let init = Policy { ird: ii, ord: io, relaxed_ird_ord: relaxed, ..Policy::default() };
        let resp = Policy { ird: ri, ord: ro, relaxed_ird_ord: relaxed, ..Policy::default() };
        let row = (ii, io, ri, ro, relaxed);
        match (handshake(&init, &resp), expect) {
            (Ok((c, s)), Ok(want)) => {
                check_consistent(&c, &s);
                assert_eq!((c.ird, c.ord, s.ird, s.ord), want, "{row:?}");
            }
            (Err((e, _)), Err(code)) => assert_eq!(e.llp_code(), Some(code), "{row:?}"),
            (got, _) => panic!("{row:?}: {got:?}"),
        }
    }
}

#[test]
fn responder_ord_above_initiator_ird_is_insufficient() {
    let init = Policy { ird: 1, ord: 1, ..Policy::default() };
    let reply = reply_with(IrdOrd { ird: 1, ord: 5, ..IrdOrd::default() });
    let e = init.accept_reply(&reply).unwrap_err();
    assert!(matches!(e, NegotiationError::InsufficientIrd { .. }));
    assert_eq!(e.llp_code(), Some(LlpErrorCode::InsufficientIrd));
}

#[test]
fn rtr_table() {
    let w = RtrTypes { write: true, ..RtrTypes::NONE };
    let r = RtrTypes { read: true, ..RtrTypes::NONE };
    let s = RtrTypes { send: true, ..RtrTypes::NONE };
    let wr = RtrTypes { write: true, read: true, send: false };
    // (initiator p2p, offered, responder p2p, accepted) -> Ok(rtr) / Err(code)
    type Row = (bool, RtrTypes, bool, RtrTypes, Result<Option<RtrType>, LlpErrorCode>);
    let table: &[Row] = &[
        (true, wr, true, wr, Ok(Some(RtrType::Write))),
        (true, r, true, wr, Ok(Some(RtrType::Read))),
        (true, RtrTypes::ALL, true, s, Ok(Some(RtrType::Send))),
        (true, RtrTypes::ALL, true, RtrTypes::ALL, Ok(Some(RtrType::Write))),
        (true, s, true, wr, Err(LlpErrorCode::NoMatchingRtr)),
        (true, w, true, r, Err(LlpErrorCode::NoMatchingRtr)),
        // A responder agrees to peer-to-peer whenever the initiator asks (siw's initiator
        // terminates otherwise); only an initiator's own setting decides whether it offers.
        (true, wr, false, wr, Ok(Some(RtrType::Write))),
        (false, wr, true, wr, Ok(None)),
    ];
    for &(ip, offered, rp, accepted, expect) in table {
        let init = Policy { peer_to_peer: ip, rtr: offered, ..Policy::default() };
        let resp = Policy { peer_to_peer: rp, rtr: accepted, ..Policy::default() };
        let row = (ip, offered, rp, accepted);
        match (handshake(&init, &resp), expect) {
            (Ok((c, s)), Ok(want)) => {
                check_consistent(&c, &s);
                assert_eq!(c.rtr, want, "{row:?}");
                if c.rtr == Some(RtrType::Read) {
                    assert!(c.ord >= 1 && s.ird >= 1, "a Read RTR needs ORD/IRD 1: {c:?} {s:?}");
                }
            }
            (Err((e, rejected)), Err(code)) => {
                assert_eq!(e.llp_code(), Some(code), "{row:?}");
                assert!(rejected, "the responder rejects: {row:?}");
            }
            (got, _) => panic!("{row:?}: {got:?}"),
        }
    }
}

#[test]
fn reply_choosing_unoffered_or_several_rtr_types() {
    let init = Policy { peer_to_peer: true, ..Policy::default() };
    for chosen in [RtrTypes { send: true, ..RtrTypes::NONE }, RtrTypes::ALL, RtrTypes::NONE] {
        let reply = reply_with(IrdOrd { ird: 1, ord: 1, peer_to_peer: true, rtr: chosen });
        let e = init.accept_reply(&reply).unwrap_err();
        assert_eq!(e.llp_code(), Some(LlpErrorCode::NoMatchingRtr), "{chosen:?}");
    }
}

#[test]
fn private_data_limits() {
    let p = Policy::default();
    assert!(p.request(&[0; 252]).is_ok());
    assert_eq!(p.request(&[0; 253]).unwrap_err(), NegotiationError::PrivateDataTooLong { len: 257 });
    let v1 = Policy { revision: 1, ..Policy::default() };
    assert!(v1.request(&[0; 256]).is_ok());
    assert!(v1.request(&[0; 257]).is_err());
    // Received private data up to 512 is accepted (RFC 5044), and handed to the application.
    let big = [7u8; 400];
    let req = FrameRepr { private_data: &big, ..p.request(b"").unwrap() };
    let bytes = req.to_vec().unwrap();
    let parsed = FrameRepr::parse(&bytes).unwrap();
    assert_eq!(parsed.private_data, &big[..]);
    assert!(p.respond(&parsed, b"ok").is_ok());
    // The reject carries the application's private data.
    let rej = p.reject(&parsed, b"go away").unwrap();
    assert!(rej.reject);
    let e = p.accept_reply(&rej).unwrap_err();
    assert_eq!(e, NegotiationError::Rejected { private_data: b"go away".to_vec() });
    assert_eq!(e.llp_code(), None);
}

#[test]
fn invalid_policies() {
    for bad in [
        Policy { revision: 3, ..Policy::default() },
        Policy { revision: 0, ..Policy::default() },
        Policy { ird: 0x4000, ..Policy::default() },
        Policy { revision: 1, peer_to_peer: true, ..Policy::default() },
        Policy { peer_to_peer: true, rtr: RtrTypes::NONE, ..Policy::default() },
    ] {
        assert!(matches!(bad.request(b""), Err(NegotiationError::InvalidPolicy(_))), "{bad:?}");
    }
}

// --- siw's frames, as captured in tests/data/siw -----------------------------------------

fn frame(kind: FrameKind, flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = match kind {
        FrameKind::Request => b"MPA ID Req Frame".to_vec(),
        FrameKind::Reply => b"MPA ID Rep Frame".to_vec(),
    };
    v.push(flags);
    v.push(rev);
    v.extend_from_slice(&u16::try_from(pd.len()).unwrap().to_be_bytes());
    v.extend_from_slice(pd);
    v
}

/// siw's rping client (siw-rping.pcap) against this stack as responder, and siw's Reply.
#[test]
fn siw_default_request() {
    let req = frame(FrameKind::Request, 0x10, 2, &[0, 1, 0, 1]);
    let req = FrameRepr::parse(&req).unwrap();
    let (reply, s) = Policy::default().respond(&req, b"").unwrap();
    assert_eq!(reply.to_vec().unwrap(), frame(FrameKind::Reply, 0x10, 2, &[0, 1, 0, 1]));
    assert_eq!((s.crc, s.markers_rx, s.markers_tx, s.ird, s.ord, s.rtr), (false, false, false, 1, 1, None));
    // And siw's Reply to our default Request is identical in shape.
    let siw_reply = frame(FrameKind::Reply, 0x10, 2, &[0, 1, 0, 1]);
    let c = Policy::default().accept_reply(&FrameRepr::parse(&siw_reply).unwrap()).unwrap();
    assert_eq!((c.crc, c.ird, c.ord, c.rtr, c.revision), (false, 1, 1, None, 2));
}

/// siw with `mpa_crc_required=1` (siw-rping-crc.pcap): C in both frames.
#[test]
fn siw_crc_request() {
    let req = frame(FrameKind::Request, 0x50, 2, &[0, 1, 0, 1]);
    let (reply, s) = Policy::default().respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    assert!(reply.crc && s.crc);
    // Asking a default siw for CRC: its Reply carries C (host-probe-*.pcap).
    let ours = Policy { crc: CrcPolicy::Required, ..Policy::default() };
    let c = ours.accept_reply(&FrameRepr::parse(&frame(FrameKind::Reply, 0x50, 2, &[0, 1, 0, 1])).unwrap());
    assert!(c.unwrap().crc);
}

/// siw with `peer_to_peer=1` (siw-rping-p2p.pcap): offers write+read RTR, picks write.
#[test]
fn siw_peer_to_peer() {
    let req = frame(FrameKind::Request, 0x10, 2, &[0x80, 0x01, 0xc0, 0x01]);
    let resp = Policy { peer_to_peer: true, ..Policy::default() };
    let (reply, s) = resp.respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    assert_eq!(reply.to_vec().unwrap(), frame(FrameKind::Reply, 0x10, 2, &[0x80, 0x01, 0x80, 0x01]));
    assert_eq!(s.rtr, Some(RtrType::Write));
    // Our peer-to-peer Request looks like siw's, and siw's Reply settles on a Write RTR.
    let init = Policy { peer_to_peer: true, ..Policy::default() };
    assert_eq!(init.request(b"").unwrap().to_vec().unwrap(), req);
    let siw_reply = frame(FrameKind::Reply, 0x10, 2, &[0x80, 0x01, 0x80, 0x01]);
    let c = init.accept_reply(&FrameRepr::parse(&siw_reply).unwrap()).unwrap();
    assert_eq!(c.rtr, Some(RtrType::Write));
}

/// siw with `mpa_version=1` (siw-rping-mpav1.pcap, siw-send-bw-mpav1.pcap): no private data.
#[test]
fn siw_revision_1() {
    let req = frame(FrameKind::Request, 0x00, 1, &[]);
    let (reply, s) = Policy::default().respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    assert_eq!(reply.to_vec().unwrap(), frame(FrameKind::Reply, 0x00, 1, &[]));
    assert_eq!((s.revision, s.peer_ird_ord), (1, None));
    // Our revision-2 Request answered by a revision-1 siw falls back.
    let c = Policy::default().accept_reply(&FrameRepr::parse(&frame(FrameKind::Reply, 0, 1, &[])).unwrap());
    assert_eq!(c.unwrap().revision, 1);
}

/// siw rejects any Request with M set: this stack reports the reject cleanly.
#[test]
fn siw_rejects_markers() {
    let ours = Policy { markers_wanted: true, ..Policy::default() };
    let req = ours.request(b"").unwrap();
    assert!(req.markers);
    // siw's reject: the Request's bits with M cleared and R set, no private data.
    let siw_reject = frame(FrameKind::Reply, 0x20 | 0x10, 2, &[0, 1, 0, 1]);
    let e = ours.accept_reply(&FrameRepr::parse(&siw_reject).unwrap()).unwrap_err();
    assert_eq!(e, NegotiationError::Rejected { private_data: vec![] });
    // A siw-like responder (no marker support) built from this crate does the same.
    let siw_like = Policy { markers_supported: false, ..Policy::default() };
    let refusal = siw_like.respond(&req, b"").unwrap_err();
    assert!(refusal.reply.unwrap().reject);
}

/// siw's ib_read_bw data connection (siw-read-bw.pcap): IRD = ORD = 128.
#[test]
fn siw_perftest_read() {
    let req = frame(FrameKind::Request, 0x10, 2, &[0, 0x80, 0, 0x80]);
    let resp = Policy { ird: 128, ord: 128, ..Policy::default() };
    let (reply, s) = resp.respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    assert_eq!(reply.ird_ord.map(|w| (w.ird, w.ord)), Some((128, 128)));
    assert_eq!((s.ird, s.ord), (128, 128));
    // A responder with smaller limits answers with them; the initiator lowers its ORD.
    let small = Policy { ird: 16, ord: 16, ..Policy::default() };
    let (reply, s) = small.respond(&FrameRepr::parse(&req).unwrap(), b"").unwrap();
    assert_eq!((s.ird, s.ord), (16, 16));
    let init = Policy { ird: 128, ord: 128, ..Policy::default() };
    let c = init.accept_reply(&reply).unwrap();
    assert_eq!((c.ird, c.ord), (128, 16));
}
