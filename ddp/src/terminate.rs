//! Terminate error codes (RFC 5040 section 7): the `layer / error type / error code` triple a
//! Terminate message carries.
//!
//! Every peer violation this crate detects maps to exactly one [`TerminateCode`], in one
//! function per error type (`terminate_code`, `rdmap_terminate_code`), tested against the table
//! in docs/protocol-notes.md#terminate-codes.

use core::fmt;

/// The layer field of a Terminate control word (4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminateLayer {
    /// 0: RDMAP.
    Rdmap,
    /// 1: DDP.
    Ddp,
    /// 2: the lower layer protocol (MPA).
    Llp,
    /// Any other value, as read off the wire.
    Unknown(u8),
}

impl TerminateLayer {
    /// The layer for a 4-bit wire value.
    pub fn from_u8(v: u8) -> TerminateLayer {
        match v & 0x0f {
            0 => TerminateLayer::Rdmap,
            1 => TerminateLayer::Ddp,
            2 => TerminateLayer::Llp,
            other => TerminateLayer::Unknown(other),
        }
    }

    /// The 4-bit wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            TerminateLayer::Rdmap => 0,
            TerminateLayer::Ddp => 1,
            TerminateLayer::Llp => 2,
            TerminateLayer::Unknown(v) => v & 0x0f,
        }
    }
}

impl fmt::Display for TerminateLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TerminateLayer::Rdmap => "RDMAP",
            TerminateLayer::Ddp => "DDP",
            TerminateLayer::Llp => "LLP",
            TerminateLayer::Unknown(_) => "layer?",
        })
    }
}

/// DDP error types (layer 1).
pub mod ddp_type {
    /// 0: local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 0;
    /// 1: tagged buffer error.
    pub const TAGGED_BUFFER: u8 = 1;
    /// 2: untagged buffer error.
    pub const UNTAGGED_BUFFER: u8 = 2;
}

/// RDMAP error types (layer 0).
pub mod rdmap_type {
    /// 0: local catastrophic error.
    pub const LOCAL_CATASTROPHIC: u8 = 0;
    /// 1: remote protection error.
    pub const REMOTE_PROTECTION: u8 = 1;
    /// 2: remote operation error.
    pub const REMOTE_OPERATION: u8 = 2;
}

/// A Terminate `layer / error type / error code` triple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateCode {
    /// The layer that detected the error.
    pub layer: TerminateLayer,
    /// The error type (4 bits), meaning depends on the layer.
    pub error_type: u8,
    /// The error code (8 bits), meaning depends on layer and type.
    pub code: u8,
}

impl TerminateCode {
    /// A DDP (layer 1) code.
    pub const fn ddp(error_type: u8, code: u8) -> TerminateCode {
        TerminateCode { layer: TerminateLayer::Ddp, error_type, code }
    }

    /// An RDMAP (layer 0) code.
    pub const fn rdmap(error_type: u8, code: u8) -> TerminateCode {
        TerminateCode { layer: TerminateLayer::Rdmap, error_type, code }
    }

    /// Whether the triple is one RFC 5040 (and RFC 5044 for the LLP) defines, per the table
    /// in docs/protocol-notes.md#terminate-codes. A received control word that decodes to an
    /// undefined triple was probably written with siw's bit-field layout.
    pub fn is_defined(&self) -> bool {
        match (self.layer, self.error_type) {
            (TerminateLayer::Rdmap, 0) | (TerminateLayer::Ddp, 0) => self.code == 0,
            (TerminateLayer::Rdmap, 1) => matches!(self.code, 0x00..=0x04 | 0x09 | 0xff),
            (TerminateLayer::Rdmap, 2) => matches!(self.code, 0x05..=0x09 | 0xff),
            (TerminateLayer::Ddp, 1) => matches!(self.code, 0x00..=0x04),
            (TerminateLayer::Ddp, 2) => matches!(self.code, 0x01..=0x06),
            (TerminateLayer::Llp, 0) => matches!(self.code, 0x01..=0x07),
            _ => false,
        }
    }

    /// The first two bytes of the RFC 5040 Terminate control word: `layer:4 | type:4`, `code:8`
    /// (the RFC layout, layer in the high nibble; siw sends it the other way round, see
    /// docs/protocol-notes.md#siws-bit-field-layout).
    pub fn to_bytes(self) -> [u8; 2] {
        [(self.layer.to_u8() << 4) | (self.error_type & 0x0f), self.code]
    }
}

impl fmt::Display for TerminateCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} type {} code {:#04x}", self.layer, self.error_type, self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_display() {
        let c = TerminateCode::ddp(ddp_type::UNTAGGED_BUFFER, 0x01);
        assert_eq!(c.to_bytes(), [0x12, 0x01]);
        assert_eq!(c.to_string(), "DDP type 2 code 0x01");
        assert_eq!(TerminateCode::rdmap(1, 0x04).to_bytes(), [0x01, 0x04]);
        assert_eq!(TerminateLayer::Llp.to_u8(), 2);
        for v in 0u8..16 {
            assert_eq!(TerminateLayer::from_u8(v).to_u8(), v);
        }
    }

    #[test]
    fn defined_codes_follow_the_table() {
        let def = |l, t, c| TerminateCode { layer: l, error_type: t, code: c }.is_defined();
        assert!(def(TerminateLayer::Rdmap, 1, 0x04));
        assert!(!def(TerminateLayer::Rdmap, 1, 0x05));
        assert!(def(TerminateLayer::Rdmap, 2, 0x06));
        assert!(def(TerminateLayer::Ddp, 1, 0x04));
        assert!(!def(TerminateLayer::Ddp, 2, 0x00));
        assert!(def(TerminateLayer::Llp, 0, 0x07));
        assert!(!def(TerminateLayer::Llp, 1, 0x02));
        assert!(!def(TerminateLayer::Unknown(5), 0, 0));
    }
}
