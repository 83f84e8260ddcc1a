//! FPDU layout (RFC 5044 section 4): length, pad, CRC32c, markers and MULPDU.
//!
//! ```text
//! | ULPDU_Length (16, BE) | ULPDU | PAD (0..3 zero octets) | CRC32c (32) |
//! ```
//!
//! The pad makes `2 + ULPDU_Length + PAD` a multiple of four. The CRC32c (Castagnoli) covers
//! every octet of the FPDU before the CRC field, markers included, and goes on the wire as the
//! little-endian bytes of the standard CRC-32C value (so `crc32c(b"Hello world!") ==
//! 0x7B98E751` is sent as `51 E7 98 7B`). Without negotiated CRC the field is present and zero.
//!
//! Markers (RFC 5044 section 4.3) are 4 octets, 16 reserved zero bits and a 16-bit FPDU
//! pointer, at every 512th octet of a direction's stream, counted from the first octet after
//! the Request (initiator to responder) or Reply (responder to initiator). A marker belongs to
//! the FPDU whose octets surround it; one that falls exactly where an FPDU starts belongs to
//! that FPDU and is its first four octets. The FPDU pointer is the distance from the marker
//! back to the start of its FPDU (zero for a marker at the start).

/// Length of the ULPDU_Length field.
pub const LENGTH_LEN: usize = 2;
/// Length of the CRC field.
pub const CRC_LEN: usize = 4;
/// Length of a marker.
pub const MARKER_LEN: usize = 4;
/// Marker spacing in the TCP stream.
pub const MARKER_INTERVAL: u64 = 512;
/// Marker spacing as a length.
const INTERVAL_LEN: usize = 512;
/// Content octets between two markers.
const MARKER_GAP: usize = INTERVAL_LEN - MARKER_LEN;
/// The largest ULPDU the 16-bit length field can describe.
pub const MAX_ULPDU: usize = 65535;
/// The FPDU overhead without markers: length field and CRC (the pad comes on top).
pub const OVERHEAD: usize = LENGTH_LEN + CRC_LEN;

/// Pad octets after a ULPDU of `ulpdu_len` octets: `(4 - (ulpdu_len + 2) % 4) % 4`.
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ulpdu_len + LENGTH_LEN) % 4) % 4
}

/// FPDU length without markers: length field, ULPDU, pad and CRC.
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// MULPDU, the largest ULPDU to send in one FPDU for a path with this EMSS (RFC 5044
/// section 8.1): without markers `EMSS - (6 + EMSS mod 4)`; with markers, room for one
/// marker per 512 octets of the segment is taken too.
///
/// Returns 0 when the EMSS is too small to carry any ULPDU.
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let aligned = emss - emss % 4;
    let marker_room = if markers { MARKER_LEN * emss.div_ceil(INTERVAL_LEN) } else { 0 };
    aligned.saturating_sub(OVERHEAD + marker_room).min(MAX_ULPDU)
}

/// The CRC field as it goes on the wire for a computed CRC32c value.
pub const fn crc_to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC32c value carried by a CRC field read off the wire.
pub const fn crc_from_wire(field: [u8; 4]) -> u32 {
    u32::from_le_bytes(field)
}

/// From this many bytes on, [`crc_update`] folds with carry-less multiplication (`crc-fast`:
/// about 3 times the SSE4.2 `crc32` loop at 64 KiB on a CPU with VPCLMULQDQ); below it the
/// `crc32` loop is as quick and needs no setup. Measured on the project's VM (ns per call,
/// `crc32c` / `crc-fast`): 18 B 6.2 / 6.9, 64 B 7.2 / 6.3, 88 B 9.5 / 7.2, 256 B 24.8 / 10.1,
/// 512 B 48.4 / 11.0.
const FOLD_MIN: usize = 64;

/// The CRC32c of an FPDU computed piece by piece: `crc_update(crc_update(0, a), b)` is the
/// CRC of `a` followed by `b` (for a receiver that checks bytes as they land in place).
/// `crc_update(0, a)` is the CRC of `a`.
pub fn crc_update(crc: u32, bytes: &[u8]) -> u32 {
    // An empty piece (the pad of an FPDU whose ULPDU ends on a word, say) changes nothing;
    // the crate's call costs dozens of instructions even then.
    if bytes.is_empty() {
        return crc;
    }
    if bytes.len() < FOLD_MIN {
        return crc32c::crc32c_append(crc, bytes);
    }
    if crc == 0 {
        // A CRC from the start (a whole FPDU in one piece, as small ones are): the crate's
        // direct call. Its `Digest`, needed to carry a running value on, copies the
        // algorithm's tables into itself (a 200-byte memcpy per piece).
        return crc_fast::crc32_iscsi(bytes);
    }
    // The running register of the reflected CRC-32C is the complement of the value so far.
    let mut digest =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(bytes);
    // A 32-bit CRC's value is the low half.
    u32::try_from(digest.finalize() & u64::from(u32::MAX)).unwrap_or_default()
}

/// Distance from stream position `pos` to the next marker position (0 when `pos` is one).
pub const fn to_next_marker(pos: u64) -> usize {
    ((MARKER_INTERVAL - pos % MARKER_INTERVAL) % MARKER_INTERVAL) as usize
}

/// How many markers precede content octet `index` of an FPDU that starts at stream position
/// `start` (content = the FPDU's own octets: length, ULPDU, pad, CRC).
pub const fn markers_before(start: u64, index: usize) -> usize {
    let room = to_next_marker(start);
    if index < room { 0 } else { 1 + (index - room) / MARKER_GAP }
}

/// Wire offset (from the FPDU's first octet) of content octet `index`, markers counted.
pub const fn wire_offset(start: u64, index: usize) -> usize {
    index + MARKER_LEN * markers_before(start, index)
}

/// Number of markers inside an FPDU with `content_len` content octets starting at `start`.
pub const fn markers_in(start: u64, content_len: usize) -> usize {
    if content_len == 0 { 0 } else { markers_before(start, content_len - 1) }
}

/// Length on the wire of an FPDU carrying a `ulpdu_len`-octet ULPDU, starting at stream
/// position `start`, with or without markers.
pub const fn wire_len(start: u64, ulpdu_len: usize, markers: bool) -> usize {
    let content = fpdu_len(ulpdu_len);
    if markers { content + MARKER_LEN * markers_in(start, content) } else { content }
}

/// The stream positions of the markers inside an FPDU of `wire_len` octets at `start`.
pub fn marker_positions(start: u64, wire_len: usize) -> impl Iterator<Item = u64> {
    let first = start + to_next_marker(start) as u64;
    let end = start + wire_len as u64;
    (0..).map(move |k| first + k * MARKER_INTERVAL).take_while(move |&p| p < end)
}

/// The four octets of a marker at stream position `pos` in an FPDU starting at `fpdu_start`.
///
/// The pointer is 16 bits; `pos - fpdu_start` is below 512 + 65535 + 10 only while FPDUs obey
/// [`MAX_ULPDU`], so the distance is truncated to 16 bits only for impossible FPDUs.
pub fn marker_bytes(pos: u64, fpdu_start: u64) -> [u8; 4] {
    let ptr = u16::try_from(pos - fpdu_start).unwrap_or(u16::MAX).to_be_bytes();
    [0, 0, ptr[0], ptr[1]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_for_every_length_mod_4() {
        // 2 + len + pad must be a multiple of 4 and pad < 4.
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(3), 3);
        assert_eq!(pad_len(4), 2);
        assert_eq!(pad_len(1442), 0);
        assert_eq!(pad_len(28), 2);
        assert_eq!(pad_len(65535), 3);
        for len in 0..2000 {
            let p = pad_len(len);
            assert!(p < 4);
            assert_eq!((LENGTH_LEN + len + p) % 4, 0, "len {len}");
            assert_eq!(fpdu_len(len) % 4, 0);
        }
    }

    #[test]
    fn mulpdu_values() {
        // siw on a 1500-byte MTU with TCP timestamps: EMSS 1448, ULPDUs of 1442.
        assert_eq!(mulpdu(1448, false), 1442);
        assert_eq!(mulpdu(1460, false), 1454);
        assert_eq!(mulpdu(1449, false), 1442);
        assert_eq!(mulpdu(1451, false), 1442);
        assert_eq!(mulpdu(1448, true), 1448 - 6 - 12);
        assert_eq!(mulpdu(512, true), 512 - 6 - 4);
        assert_eq!(mulpdu(65536, false), 65530);
        assert_eq!(mulpdu(70000, false), MAX_ULPDU);
        assert_eq!(mulpdu(5, false), 0);
        for emss in [100usize, 536, 1220, 1448, 1460, 8948, 9000] {
            for m in [false, true] {
                let u = mulpdu(emss, m);
                // The FPDU fits in one segment wherever it lands in the marker grid.
                for start in [0u64, 1, 2, 100, 255, 508, 510, 511] {
                    assert!(wire_len(start, u, m) <= emss, "emss {emss} markers {m}");
                }
            }
        }
    }

    /// `crc_update` gives crc32c's values on both sides of the switch to folding, for the RFC
    /// 3720 vectors and for a stream cut anywhere, in pieces of every length class.
    #[test]
    fn crc_update_matches_crc32c_however_cut() {
        assert_eq!(crc_update(0, &[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc_update(0x1234_5678, &[]), 0x1234_5678);
        assert_eq!(crc_update(crc_update(0, b"Hello "), &[]), crc32c::crc32c(b"Hello "));
        let zeros = [0u8; 4096];
        assert_eq!(crc_update(0, &zeros), crc32c::crc32c(&zeros));
        let data: Vec<u8> = (0..70_000u32).map(|i| i.wrapping_mul(2_654_435_761).to_be_bytes()[1]).collect();
        for len in [0, 1, 31, 511, 512, 513, 4096, 65_535, 70_000] {
            assert_eq!(crc_update(0, &data[..len]), crc32c::crc32c(&data[..len]), "len {len}");
        }
        for cut in [0usize, 1, 3, 16, 511, 512, 1000, 30_001, 65_536, 69_999] {
            for piece in [1usize, 7, 300, 600, 4096, 70_000] {
                let mut crc = crc_update(0, &data[..cut]);
                for c in data[cut..].chunks(piece) {
                    crc = crc_update(crc, c);
                }
                assert_eq!(crc, crc32c::crc32c(&data), "cut {cut} piece {piece}");
            }
        }
    }

    #[test]
    fn crc_wire_order() {
        let crc = crc32c::crc32c(b"Hello world!");
        assert_eq!(crc, 0x7B98_E751);
        assert_eq!(crc_to_wire(crc), [0x51, 0xE7, 0x98, 0x7B]);
        assert_eq!(crc_from_wire([0x51, 0xE7, 0x98, 0x7B]), crc);
        // RFC 3720 appendix B.4 vectors for CRC32c.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c::crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c::crc32c(&inc), 0x46DD_794E);
    }

    #[test]
    fn marker_arithmetic() {
        assert_eq!(to_next_marker(0), 0);
        assert_eq!(to_next_marker(1), 511);
        assert_eq!(to_next_marker(512), 0);
        assert_eq!(markers_before(0, 0), 1);
        assert_eq!(markers_before(0, 507), 1);
        assert_eq!(markers_before(0, 508), 2);
        assert_eq!(markers_before(1, 510), 0);
        assert_eq!(markers_before(1, 511), 1);
        assert_eq!(wire_offset(0, 0), 4);
        assert_eq!(wire_offset(511, 0), 0);
        assert_eq!(wire_offset(511, 1), 5);
        // An FPDU ending right before a marker position does not carry that marker.
        assert_eq!(markers_in(508, 4), 0);
        assert_eq!(markers_in(508, 5), 1);
        assert_eq!(wire_len(0, 2, true), 12);
        assert_eq!(wire_len(504, 2, true), 8);
        assert_eq!(wire_len(508, 2, true), 12);
        assert_eq!(marker_positions(508, 12).collect::<Vec<_>>(), vec![512]);
        assert_eq!(marker_positions(0, 1030).collect::<Vec<_>>(), vec![0, 512, 1024]);
        assert_eq!(marker_positions(1, 511).count(), 0);
        assert_eq!(marker_bytes(512, 500), [0, 0, 0, 12]);
    }
}
