//! The LLP (MPA) error codes that an RDMAP Terminate carries in layer 2.
//!
//! RFC 5040 section 7.1 names the LLP layer's codes by reference to MPA; the values below are
//! the ones the Linux siw driver (`enum llp_mpa_ecode`) and iw_cxgb4 put on the wire.

use core::fmt;

/// An MPA error code for a Terminate with layer 2 (LLP), error type 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LlpErrorCode {
    /// 0x01: the TCP connection was lost.
    TcpConnectionLost = 0x01,
    /// 0x02: an FPDU failed its CRC32c check.
    Crc = 0x02,
    /// 0x03: a marker was wrong or an FPDU did not start where one should.
    MarkerOrFpduStart = 0x03,
    /// 0x04: an invalid MPA Request or Reply.
    InvalidRequestReply = 0x04,
    /// 0x05: local catastrophic error.
    LocalCatastrophic = 0x05,
    /// 0x06: insufficient IRD (RFC 6581).
    InsufficientIrd = 0x06,
    /// 0x07: no matching RTR type (RFC 6581).
    NoMatchingRtr = 0x07,
}

impl LlpErrorCode {
    /// The code's value on the wire.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The code for a wire value, if it is one of the defined ones.
    pub fn from_code(code: u8) -> Option<LlpErrorCode> {
        Some(match code {
            0x01 => LlpErrorCode::TcpConnectionLost,
            0x02 => LlpErrorCode::Crc,
            0x03 => LlpErrorCode::MarkerOrFpduStart,
            0x04 => LlpErrorCode::InvalidRequestReply,
            0x05 => LlpErrorCode::LocalCatastrophic,
            0x06 => LlpErrorCode::InsufficientIrd,
            0x07 => LlpErrorCode::NoMatchingRtr,
            _ => return None,
        })
    }
}

impl fmt::Display for LlpErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            LlpErrorCode::TcpConnectionLost => "TCP connection lost",
            LlpErrorCode::Crc => "CRC error",
            LlpErrorCode::MarkerOrFpduStart => "marker or FPDU start error",
            LlpErrorCode::InvalidRequestReply => "invalid MPA Request/Reply",
            LlpErrorCode::LocalCatastrophic => "local catastrophic error",
            LlpErrorCode::InsufficientIrd => "insufficient IRD",
            LlpErrorCode::NoMatchingRtr => "no matching RTR",
        };
        write!(f, "{s} (LLP 0x{:02x})", self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for c in 0u8..=0xff {
            if let Some(e) = LlpErrorCode::from_code(c) {
                assert_eq!(e.code(), c);
            }
        }
        assert_eq!(LlpErrorCode::from_code(0), None);
        assert_eq!(LlpErrorCode::from_code(8), None);
        assert_eq!(LlpErrorCode::NoMatchingRtr.code(), 7);
        assert_eq!(LlpErrorCode::Crc.to_string(), "CRC error (LLP 0x02)");
    }
}
