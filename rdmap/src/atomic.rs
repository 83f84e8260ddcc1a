//! RFC 7306 message bodies: Atomic Request, Atomic Response and Immediate Data, and the atomic
//! operations themselves as pure functions (no memory access here: the caller reads the
//! original 64-bit value, calls [`apply`], writes the result back and answers with an
//! [`AtomicResponse`] carrying the original value).
//!
//! # Sources and what was verified
//!
//! The RFC 7306 text itself could not be read from this workspace (the search tool's copies of
//! the RFC only return its first page), so the layouts below were established from a
//! maintained implementation and are marked accordingly:
//!
//! - **Verified against Wireshark** (`epan/dissectors/packet-iwarp-ddp-rdmap.c`,
//!   `dissect_iwarp_atomic`, wireshark/wireshark): the Atomic Request body is a 32-bit word
//!   whose low 4 bits are the atomic operation code (upper 28 bits reserved), then Request
//!   Identifier (32), Remote STag (32), Remote Tagged Offset (64), Add-or-Swap Data (64),
//!   Add-or-Swap Mask (64), Compare Data (64), Compare Mask (64): 52 bytes, big-endian. The
//!   Atomic Response body is Original Request Identifier (32) then Original Remote Data Value
//!   (64): 12 bytes. Wireshark names operation code 0 "FetchAdd" and 2 "CmpSwap".
//! - **Unverified (RFC text not read)**: code 1. Wireshark leaves it unnamed; our recollection
//!   of RFC 7306 section 5 is that 0001b is an unconditional masked Swap, which fits the gap,
//!   so it is decoded as [`AtomicOp::Swap`]. One public implementation uses 1 for
//!   compare-and-swap (docs/protocol-notes.md#rfc-7306-extensions): that reading is rejected
//!   here because Wireshark (a dissector written against the RFC) uses 2. The root crate's
//!   dissector (`dissect/src/ddp.rs`) decodes atomics with this module.
//! - **Unverified (RFC text not read)**: the mask semantics in [`apply`]. They follow the
//!   masked-atomics model RFC 7306 was written to carry (the same one as the InfiniBand
//!   extended atomics): FetchAdd's Add Mask marks field boundaries (a 1 bit stops the carry
//!   out of that bit, so all-zero is a plain 64-bit add and all-ones a carry-less XOR);
//!   Swap replaces the bits set in the Swap Mask; CmpSwap swaps (with the Swap Mask) iff the
//!   original and the Compare Data agree on the bits set in the Compare Mask.
//! - Immediate Data (opcodes 0x8/0x9, see [`crate::wire::Opcode`]) carries exactly 8 bytes of
//!   data (Wireshark reads it so, docs/protocol-notes.md#rfc-7306-extensions; RFC text not
//!   read).

use core::fmt;

use iwarp_ddp::{STag, TaggedOffset};

use crate::wire::{Truncated, be32, be64};

/// Length of an Atomic Request body (4 + 4 + 4 + 8 + 4 x 8).
pub const ATOMIC_REQUEST_LEN: usize = 52;
/// Length of an Atomic Response body (4 + 8).
pub const ATOMIC_RESPONSE_LEN: usize = 12;
/// Length of an Immediate Data body.
pub const IMMEDIATE_DATA_LEN: usize = 8;
/// The bits of the first Atomic Request word that hold the operation code (the other 28 are
/// reserved, sent as zero; Wireshark's field masks 0x0000000F / 0xFFFFFFF0).
pub const ATOMIC_OPCODE_MASK: u32 = 0x0000_000f;

/// The atomic operation code (RFC 7306, Atomic Request "AOpCode").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// 0: FetchAdd, masked add (verified: Wireshark `rdma_atomic_opcode_names`).
    FetchAdd,
    /// 1: Swap, unconditional masked swap (unverified: RFC 7306 recollection; Wireshark leaves
    /// 1 unnamed).
    Swap,
    /// 2: CmpSwap, masked compare and masked swap (verified: Wireshark names 2 "CmpSwap").
    CompareSwap,
    /// Any other value of the 4-bit field; such a request earns a Terminate. (A byte, which
    /// holds the field: with it `SendOp::Atomic` fits in 48 bytes, and a work request in 120.)
    Unknown(u8),
}

impl AtomicOp {
    /// The operation for an opcode value (only the low 4 bits are the opcode field).
    pub fn from_u32(v: u32) -> AtomicOp {
        match v & ATOMIC_OPCODE_MASK {
            0 => AtomicOp::FetchAdd,
            1 => AtomicOp::Swap,
            2 => AtomicOp::CompareSwap,
            other => AtomicOp::Unknown(u8::try_from(other).unwrap_or(u8::MAX)),
        }
    }

    /// The opcode value (4 bits).
    pub fn to_u32(self) -> u32 {
        match self {
            AtomicOp::FetchAdd => 0,
            AtomicOp::Swap => 1,
            AtomicOp::CompareSwap => 2,
            AtomicOp::Unknown(v) => u32::from(v) & ATOMIC_OPCODE_MASK,
        }
    }
}

impl fmt::Display for AtomicOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AtomicOp::FetchAdd => f.write_str("FetchAdd"),
            AtomicOp::Swap => f.write_str("Swap"),
            AtomicOp::CompareSwap => f.write_str("CmpSwap"),
            AtomicOp::Unknown(v) => write!(f, "AtomicOp({v})"),
        }
    }
}

/// The body of an Atomic Request (RFC 7306; opcode 0xA, untagged, QN 1), big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRequest {
    /// The operation.
    pub op: AtomicOp,
    /// Chosen by the requester, echoed in the [`AtomicResponse`].
    pub request_id: u32,
    /// The STag of the 64-bit target on the responder.
    pub remote_stag: STag,
    /// The tagged offset of the target.
    pub remote_to: TaggedOffset,
    /// Add Data (FetchAdd) or Swap Data (Swap, CmpSwap).
    pub add_or_swap_data: u64,
    /// Add Mask (FetchAdd: field boundaries) or Swap Mask (Swap, CmpSwap: bits replaced).
    pub add_or_swap_mask: u64,
    /// Compare Data (CmpSwap).
    pub compare_data: u64,
    /// Compare Mask (CmpSwap: bits compared).
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// Parses the 52-byte body (bytes after it are ignored; reserved bits of the first word
    /// are not checked).
    pub fn parse(b: &[u8]) -> Result<AtomicRequest, Truncated> {
        if b.len() < ATOMIC_REQUEST_LEN {
            return Err(Truncated { needed: ATOMIC_REQUEST_LEN, got: b.len() });
        }
        Ok(AtomicRequest {
            op: AtomicOp::from_u32(be32(b, 0)),
            request_id: be32(b, 4),
            remote_stag: STag(be32(b, 8)),
            remote_to: TaggedOffset(be64(b, 12)),
            add_or_swap_data: be64(b, 20),
            add_or_swap_mask: be64(b, 28),
            compare_data: be64(b, 36),
            compare_mask: be64(b, 44),
        })
    }

    /// The 52-byte body (reserved bits zero).
    pub fn to_bytes(&self) -> [u8; ATOMIC_REQUEST_LEN] {
        let mut b = [0u8; ATOMIC_REQUEST_LEN];
        b[0..4].copy_from_slice(&self.op.to_u32().to_be_bytes());
        b[4..8].copy_from_slice(&self.request_id.to_be_bytes());
        b[8..12].copy_from_slice(&self.remote_stag.0.to_be_bytes());
        b[12..20].copy_from_slice(&self.remote_to.0.to_be_bytes());
        b[20..28].copy_from_slice(&self.add_or_swap_data.to_be_bytes());
        b[28..36].copy_from_slice(&self.add_or_swap_mask.to_be_bytes());
        b[36..44].copy_from_slice(&self.compare_data.to_be_bytes());
        b[44..52].copy_from_slice(&self.compare_mask.to_be_bytes());
        b
    }

    /// The value to write back over `original` ([`apply`] with this request's operation).
    pub fn apply_to(&self, original: u64) -> Option<u64> {
        apply(self.op, original, self)
    }
}

/// The body of an Atomic Response (RFC 7306; opcode 0xB, untagged, QN 3), big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// The request's [`AtomicRequest::request_id`].
    pub request_id: u32,
    /// The target's value before the operation.
    pub original_data: u64,
}

impl AtomicResponse {
    /// Parses the 12-byte body (bytes after it are ignored).
    pub fn parse(b: &[u8]) -> Result<AtomicResponse, Truncated> {
        if b.len() < ATOMIC_RESPONSE_LEN {
            return Err(Truncated { needed: ATOMIC_RESPONSE_LEN, got: b.len() });
        }
        Ok(AtomicResponse { request_id: be32(b, 0), original_data: be64(b, 4) })
    }

    /// The 12-byte body.
    pub fn to_bytes(&self) -> [u8; ATOMIC_RESPONSE_LEN] {
        let mut b = [0u8; ATOMIC_RESPONSE_LEN];
        b[0..4].copy_from_slice(&self.request_id.to_be_bytes());
        b[4..12].copy_from_slice(&self.original_data.to_be_bytes());
        b
    }
}

/// The 8 bytes of an Immediate Data message (RFC 7306; opcodes 0x8 and 0x9), opaque to RDMAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmediateData(pub [u8; IMMEDIATE_DATA_LEN]);

impl ImmediateData {
    /// Parses the 8-byte body (bytes after it are ignored).
    pub fn parse(b: &[u8]) -> Result<ImmediateData, Truncated> {
        b.first_chunk::<IMMEDIATE_DATA_LEN>()
            .map(|d| ImmediateData(*d))
            .ok_or(Truncated { needed: IMMEDIATE_DATA_LEN, got: b.len() })
    }

    /// The 8-byte body.
    pub fn to_bytes(&self) -> [u8; IMMEDIATE_DATA_LEN] {
        self.0
    }
}

/// Masked fetch-and-add: adds `data` to `original` as independent fields, where each 1 bit of
/// `boundary_mask` is the most significant bit of a field and the carry out of it is dropped.
/// Mask 0 is a plain wrapping 64-bit add; mask `!0` adds without any carry (XOR).
///
/// Clearing the field tops, adding (a carry may reach a top bit but can never leave it) and
/// XOR-ing the top bits back gives exactly that.
pub fn masked_add(original: u64, data: u64, boundary_mask: u64) -> u64 {
    let low = (original & !boundary_mask).wrapping_add(data & !boundary_mask);
    low ^ ((original ^ data) & boundary_mask)
}

/// Masked swap: the bits set in `swap_mask` come from `swap_data`, the others stay.
pub fn masked_swap(original: u64, swap_data: u64, swap_mask: u64) -> u64 {
    (original & !swap_mask) | (swap_data & swap_mask)
}

/// The new value of the target after `op` with `req`'s operands, given its `original` value;
/// `None` for an unknown operation (nothing is written; the requester gets a Terminate).
///
/// - FetchAdd: [`masked_add`] with Add Data and Add Mask.
/// - Swap: [`masked_swap`] with Swap Data and Swap Mask.
/// - CmpSwap: if `(original & compare_mask) == (compare_data & compare_mask)`, then
///   [`masked_swap`] with Swap Data and Swap Mask, else `original` unchanged.
///
/// The response always carries `original`. See the module documentation for which parts of
/// these semantics are verified.
pub fn apply(op: AtomicOp, original: u64, req: &AtomicRequest) -> Option<u64> {
    match op {
        AtomicOp::FetchAdd => Some(masked_add(original, req.add_or_swap_data, req.add_or_swap_mask)),
        AtomicOp::Swap => Some(masked_swap(original, req.add_or_swap_data, req.add_or_swap_mask)),
        AtomicOp::CompareSwap => {
            let m = req.compare_mask;
            if original & m == req.compare_data & m {
                Some(masked_swap(original, req.add_or_swap_data, req.add_or_swap_mask))
            } else {
                Some(original)
            }
        }
        AtomicOp::Unknown(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bit-by-bit reference for [`masked_add`]: the carry out of bit i is dropped when mask
    /// bit i is set.
    fn masked_add_reference(a: u64, b: u64, mask: u64) -> u64 {
        let mut out = 0u64;
        let mut carry = 0u64;
        for i in 0..64 {
            let x = (a >> i) & 1;
            let y = (b >> i) & 1;
            let s = x + y + carry;
            out |= (s & 1) << i;
            carry = if (mask >> i) & 1 == 1 { 0 } else { s >> 1 };
        }
        out
    }

    fn req(op: AtomicOp, data: u64, mask: u64, cmp: u64, cmp_mask: u64) -> AtomicRequest {
        AtomicRequest {
            op,
            request_id: 7,
            remote_stag: STag(0x1234_5601),
            remote_to: TaggedOffset(0x1000),
            add_or_swap_data: data,
            add_or_swap_mask: mask,
            compare_data: cmp,
            compare_mask: cmp_mask,
        }
    }

    #[test]
    fn opcodes() {
        assert_eq!(AtomicOp::from_u32(0), AtomicOp::FetchAdd);
        assert_eq!(AtomicOp::from_u32(1), AtomicOp::Swap);
        assert_eq!(AtomicOp::from_u32(2), AtomicOp::CompareSwap);
        assert_eq!(AtomicOp::from_u32(3), AtomicOp::Unknown(3));
        // Reserved upper bits are not part of the code.
        assert_eq!(AtomicOp::from_u32(0xffff_fff2), AtomicOp::CompareSwap);
        for v in 0..16 {
            assert_eq!(AtomicOp::from_u32(v).to_u32(), v);
        }
        assert_eq!(AtomicOp::CompareSwap.to_string(), "CmpSwap");
    }

    #[test]
    fn atomic_request_fixture() {
        let b: [u8; 52] = [
            0x00, 0x00, 0x00, 0x02, // reserved | AOpCode 2 (CmpSwap)
            0x00, 0x00, 0x00, 0x2a, // request id 42
            0x00, 0x01, 0x02, 0x03, // remote STag
            0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x08, // remote TO
            0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22, // swap data
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // swap mask
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // compare data
            0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, // compare mask
        ];
        let r = AtomicRequest::parse(&b).unwrap();
        assert_eq!(r.op, AtomicOp::CompareSwap);
        assert_eq!(r.request_id, 42);
        assert_eq!(r.remote_stag, STag(0x0001_0203));
        assert_eq!(r.remote_to, TaggedOffset(0x7f00_0000_1008));
        assert_eq!(r.add_or_swap_data, 0x1111_1111_2222_2222);
        assert_eq!(r.add_or_swap_mask, u64::MAX);
        assert_eq!(r.compare_data, 5);
        assert_eq!(r.compare_mask, 0xffff_ffff);
        assert_eq!(r.to_bytes(), b);
        assert_eq!(AtomicRequest::parse(&b[..51]), Err(Truncated { needed: 52, got: 51 }));
        // Trailing bytes are ignored; reserved bits are dropped on re-emit.
        let mut long = b.to_vec();
        long[0] = 0xf0;
        long.push(0xee);
        assert_eq!(AtomicRequest::parse(&long).unwrap(), r);
    }

    #[test]
    fn atomic_response_and_immediate_fixtures() {
        let b = [0x00, 0x00, 0x00, 0x2a, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        let r = AtomicResponse::parse(&b).unwrap();
        assert_eq!(r, AtomicResponse { request_id: 42, original_data: 0x0102_0304_0506_0708 });
        assert_eq!(r.to_bytes(), b);
        assert!(AtomicResponse::parse(&b[..11]).is_err());

        let d = ImmediateData::parse(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        assert_eq!(d, ImmediateData([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(d.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(ImmediateData::parse(&[0; 7]), Err(Truncated { needed: 8, got: 7 }));
    }

    #[test]
    fn fetch_add_table() {
        // (original, add data, add mask, result)
        let table: &[(u64, u64, u64, u64)] = &[
            // Mask all-zero: one 64-bit add, wrapping.
            (5, 3, 0, 8),
            (u64::MAX, 1, 0, 0),
            (0x0000_0000_ffff_ffff, 1, 0, 0x0000_0001_0000_0000),
            // Mask all-ones: every bit its own field, no carries: XOR.
            (0b1011, 0b0110, u64::MAX, 0b1101),
            (u64::MAX, 1, u64::MAX, u64::MAX - 1),
            // Two 32-bit fields: the carry out of the low field stops at bit 31.
            (0x0000_0001_ffff_ffff, 0x0000_0001_0000_0001, 0x8000_0000_8000_0000, 0x0000_0002_0000_0000),
            (0xffff_ffff_0000_0000, 0x0000_0001_0000_0000, 0x8000_0000_8000_0000, 0),
            // A carry may reach a boundary bit, just not leave it.
            (0x7f, 0x01, 0x80, 0x80),
            (0xff, 0x01, 0x80, 0x00),
            // Eight byte lanes.
            (0x01ff_01ff_01ff_01ff, 0x0101_0101_0101_0101, 0x8080_8080_8080_8080, 0x0200_0200_0200_0200),
        ];
        for &(orig, data, mask, want) in table {
            let r = req(AtomicOp::FetchAdd, data, mask, 0, 0);
            assert_eq!(apply(AtomicOp::FetchAdd, orig, &r), Some(want), "{orig:#x} + {data:#x} / {mask:#x}");
            assert_eq!(masked_add_reference(orig, data, mask), want);
        }
    }

    #[test]
    fn swap_and_compare_swap_table() {
        // Swap, masks all-ones / all-zero / partial.
        assert_eq!(req(AtomicOp::Swap, 0xaa, u64::MAX, 0, 0).apply_to(0x55), Some(0xaa));
        assert_eq!(req(AtomicOp::Swap, 0xaa, 0, 0, 0).apply_to(0x55), Some(0x55));
        assert_eq!(req(AtomicOp::Swap, 0xabcd, 0xff00, 0, 0).apply_to(0x1234), Some(0xab34));
        // (original, swap data, swap mask, compare data, compare mask, result)
        let table: &[(u64, u64, u64, u64, u64, u64)] = &[
            // Plain CAS: masks all-ones.
            (5, 9, u64::MAX, 5, u64::MAX, 9),
            (6, 9, u64::MAX, 5, u64::MAX, 6),
            // Compare mask all-zero: always equal, always swaps.
            (6, 9, u64::MAX, 5, 0, 9),
            // Swap mask all-zero: compares, then writes the original back.
            (5, 9, 0, 5, u64::MAX, 5),
            // Compare only the low byte; swap only the high half.
            (
                0x1111_2222_3333_4405,
                0xaaaa_bbbb_cccc_dddd,
                0xffff_ffff_0000_0000,
                0x99_05,
                0xff,
                0xaaaa_bbbb_3333_4405,
            ),
            (
                0x1111_2222_3333_4406,
                0xaaaa_bbbb_cccc_dddd,
                0xffff_ffff_0000_0000,
                0x99_05,
                0xff,
                0x1111_2222_3333_4406,
            ),
        ];
        for &(orig, sd, sm, cd, cm, want) in table {
            let r = req(AtomicOp::CompareSwap, sd, sm, cd, cm);
            assert_eq!(apply(AtomicOp::CompareSwap, orig, &r), Some(want), "{orig:#x}");
        }
        assert_eq!(req(AtomicOp::Unknown(7), 1, 1, 1, 1).apply_to(3), None);
    }

    fn arb_op() -> impl Strategy<Value = AtomicOp> {
        (0u32..16).prop_map(AtomicOp::from_u32)
    }

    proptest! {
        #[test]
        fn request_round_trip(op in arb_op(), id: u32, stag: u32, to: u64, d: u64, m: u64, cd: u64, cm: u64) {
            let r = AtomicRequest {
                op, request_id: id, remote_stag: STag(stag), remote_to: TaggedOffset(to),
                add_or_swap_data: d, add_or_swap_mask: m, compare_data: cd, compare_mask: cm,
            };
            prop_assert_eq!(AtomicRequest::parse(&r.to_bytes()).unwrap(), r);
        }

        #[test]
        fn response_round_trip(id: u32, v: u64) {
            let r = AtomicResponse { request_id: id, original_data: v };
            prop_assert_eq!(AtomicResponse::parse(&r.to_bytes()).unwrap(), r);
        }

        #[test]
        fn masked_add_matches_reference(a: u64, b: u64, m: u64) {
            prop_assert_eq!(masked_add(a, b, m), masked_add_reference(a, b, m));
        }

        #[test]
        fn masked_add_extremes(a: u64, b: u64) {
            prop_assert_eq!(masked_add(a, b, 0), a.wrapping_add(b));
            prop_assert_eq!(masked_add(a, b, u64::MAX), a ^ b);
        }

        #[test]
        fn compare_swap_is_cas_with_full_masks(orig: u64, swap: u64, cmp: u64) {
            let r = req(AtomicOp::CompareSwap, swap, u64::MAX, cmp, u64::MAX);
            let want = if orig == cmp { swap } else { orig };
            prop_assert_eq!(r.apply_to(orig), Some(want));
        }
    }
}
