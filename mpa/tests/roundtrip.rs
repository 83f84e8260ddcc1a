//! Property tests: framing any ULPDU sequence and deframing it in any chunking gives the
//! sequence back; Request/Reply frames survive emit -> parse; corrupted streams fail cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

use iwarp_mpa::{
    CrcCheck, DeframeError, Deframed, Deframer, FrameKind, FrameRepr, Framer, IrdOrd, RtrTypes,
    StreamDeframer,
};
use proptest::prelude::*;

fn ulpdus() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let one = prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..64),
        3 => proptest::collection::vec(any::<u8>(), 64..1500),
        1 => proptest::collection::vec(any::<u8>(), 1500..5000),
    ];
    proptest::collection::vec(one, 0..12)
}

/// Chunk sizes: all 1-byte chunks, or random sizes.
fn chunking() -> impl Strategy<Value = Option<Vec<usize>>> {
    prop_oneof![Just(None), proptest::collection::vec(1usize..700, 1..40).prop_map(Some)]
}

fn frame_all(msgs: &[Vec<u8>], crc: bool, markers: bool, start: u64) -> (Vec<u8>, u64) {
    let mut f = Framer::at_position(crc, markers, start);
    let mut wire = Vec::new();
    for m in msgs {
        let before = wire.len();
        wire.resize(before + f.wire_len(m.len()), 0);
        let n = f.frame(m, &mut wire[before..]).unwrap();
        assert_eq!(n, wire.len() - before);
    }
    (wire, f.position())
}

fn chunks<'a>(wire: &'a [u8], sizes: &Option<Vec<usize>>) -> Vec<&'a [u8]> {
    match sizes {
        None => wire.chunks(1).collect(),
        Some(sizes) => {
            let mut out = Vec::new();
            let mut rest = wire;
            let mut i = 0;
            while !rest.is_empty() {
                let n = sizes[i % sizes.len()].min(rest.len());
                let (a, b) = rest.split_at(n);
                out.push(a);
                rest = b;
                i += 1;
            }
            out
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn frame_then_deframe_in_chunks(
        msgs in ulpdus(),
        crc in any::<bool>(),
        markers in any::<bool>(),
        // FPDUs start 4-aligned to the marker grid in real streams; odd starts are covered too.
        start in prop_oneof![Just(0u64), (0u64..2048).prop_map(|x| x * 4), 0u64..4096],
        sizes in chunking(),
    ) {
        let (wire, end) = frame_all(&msgs, crc, markers, start);
        let mut s = StreamDeframer::new(Deframer::new(crc, markers).with_position(start));
        let mut got = Vec::new();
        for c in chunks(&wire, &sizes) {
            s.push(c);
            while let Some(p) = s.next_fpdu().unwrap() {
                if crc {
                    prop_assert!(matches!(p.crc, CrcCheck::Good(_)));
                } else {
                    prop_assert_eq!(p.crc, CrcCheck::NotChecked(0));
                }
                if !markers {
                    prop_assert!(p.borrowed);
                    prop_assert_eq!(p.markers, 0);
                }
                got.push(p.ulpdu.to_vec());
            }
        }
        prop_assert_eq!(&got, &msgs);
        prop_assert_eq!(s.buffered(), 0);
        // Each marker position of the stream holds a marker with zero reserved bits.
        if markers {
            let mut p = start + iwarp_mpa::fpdu::to_next_marker(start) as u64;
            while p < end {
                let off = usize::try_from(p - start).unwrap();
                prop_assert_eq!(&wire[off..off + 2], &[0u8, 0][..]);
                p += 512;
            }
        }
    }

    /// Flipping any bit of a CRC-protected stream never yields wrong data silently: the
    /// deframer either errors, asks for more bytes, or the flip hit a length/marker and the
    /// stream fails later; a delivered ULPDU is always one of the originals.
    #[test]
    fn corruption_is_detected(
        msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..600), 1..6),
        markers in any::<bool>(),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let (mut wire, _) = frame_all(&msgs, true, markers, 0);
        let i = flip.index(wire.len());
        wire[i] ^= 1 << bit;
        let mut d = Deframer::new(true, markers);
        let mut rest = &wire[..];
        let mut delivered = 0;
        loop {
            match d.deframe(rest) {
                Ok(Deframed::Fpdu(p)) => {
                    prop_assert_eq!(p.ulpdu, &msgs[delivered][..]);
                    delivered += 1;
                    let n = p.wire_len;
                    rest = &rest[n..];
                    if rest.is_empty() {
                        // Every FPDU arrived intact: the flip must have been caught somewhere.
                        prop_assert!(false, "corruption at {} went undetected", i);
                    }
                }
                Ok(Deframed::NeedMore(_)) => break,
                Err(DeframeError::Crc { .. } | DeframeError::Marker { .. }) => break,
                Err(e) => prop_assert!(false, "unexpected {:?}", e),
            }
        }
    }

    #[test]
    fn request_reply_round_trip(
        reply in any::<bool>(),
        markers in any::<bool>(),
        crc in any::<bool>(),
        reject in any::<bool>(),
        enhanced in any::<bool>(),
        rev in 0u8..=255,
        word in any::<[u8; 4]>(),
        reserved in 0u8..16,
        pd in proptest::collection::vec(any::<u8>(), 0..=508),
    ) {
        let kind = if reply { FrameKind::Reply } else { FrameKind::Request };
        let repr = FrameRepr {
            kind,
            markers,
            crc,
            reject: reject && reply,
            revision: if enhanced { 2 } else { rev },
            ird_ord: enhanced.then(|| IrdOrd::from_bytes(word)),
            reserved,
            private_data: &pd,
        };
        let bytes = repr.to_vec().unwrap();
        prop_assert_eq!(bytes.len(), 20 + pd.len() + if enhanced { 4 } else { 0 });
        prop_assert_eq!(FrameRepr::parse(&bytes).unwrap(), repr);
        let (again, n) = FrameRepr::parse_prefix(&bytes).unwrap().unwrap();
        prop_assert_eq!(again, repr);
        prop_assert_eq!(n, bytes.len());
        if enhanced {
            prop_assert_eq!(&bytes[20..24], &word[..]);
        }
    }

    #[test]
    fn frame_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = FrameRepr::parse(&bytes);
        let _ = FrameRepr::parse_prefix(&bytes);
        let mut with_key = b"MPA ID Rep Frame".to_vec();
        with_key.extend_from_slice(&bytes);
        if let Ok(r) = FrameRepr::parse(&with_key) {
            // What parses re-emits to the same prefix (reserved bits included).
            prop_assert_eq!(&r.to_vec().unwrap()[..], &with_key[..r.buffer_len()]);
        }
    }

    #[test]
    fn deframe_arbitrary_bytes_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
        crc in any::<bool>(),
        markers in any::<bool>(),
        start in 0u64..1024,
        limit in 0usize..70000,
    ) {
        let mut d = Deframer::new(crc, markers).with_position(start).with_max_ulpdu(limit);
        let mut rest = &bytes[..];
        while let Ok(Deframed::Fpdu(p)) = d.deframe(rest) {
            prop_assert!(p.ulpdu.len() <= limit.min(65535));
            prop_assert!(p.wire_len > 0 && p.wire_len <= rest.len());
            let n = p.wire_len;
            rest = &rest[n..];
        }
    }
}

#[test]
fn rtr_types_display() {
    assert_eq!(RtrTypes::ALL.to_string(), "send+write+read");
    assert_eq!(RtrTypes::NONE.to_string(), "none");
}
