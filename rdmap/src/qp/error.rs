//! Peer violations and the Terminate each is reported with (RFC 5040 section 7): every error
//! the receive and transmit paths find is a [`Violation`] variant naming the layer's own error
//! type, and [`Violation::terminate_code`] is the one place a violation becomes a code. Then
//! `QueuePair::fail` queues the Terminate and flushes.

use iwarp_ddp::header::{HeaderError, UNTAGGED_HEADER_LEN};
use iwarp_ddp::{AccessError, MessageTarget, Segmenter, TerminateCode, TerminateLayer, UntaggedError};
use iwarp_mpa::LlpErrorCode;

use super::state::{QN_TERMINATE, QpEvent, QpState, QueuePair, Source, TxMessage};
use crate::terminate::{RdmapError, TerminateMessage};
use crate::wire::{Control, Opcode};

/// Why a stream is terminated: the error, as the layer that found it names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A ULPDU the DDP header cannot be read from: too short for one, or (with a code of its
    /// own) a bad DDP version.
    Header(HeaderError),
    /// A tagged segment refused by the tagged buffer table (DDP tagged buffer errors).
    Tagged(AccessError),
    /// An untagged segment refused by the untagged queues, or unplaceable in its buffer.
    Untagged(UntaggedError),
    /// An RDMAP error.
    Rdmap(RdmapError),
    /// A lower-layer (MPA) error.
    Llp(LlpErrorCode),
}

impl Violation {
    /// The Terminate code (docs/protocol-notes.md#terminate-codes): each layer's error type maps
    /// itself; a ULPDU too short for a DDP header has no DDP code and is reported as the LLP's
    /// "marker or FPDU start error" (the FPDU did not carry a segment).
    pub fn terminate_code(&self) -> TerminateCode {
        match self {
            Violation::Header(e) => e
                .terminate_code()
                .unwrap_or_else(|| Violation::Llp(LlpErrorCode::MarkerOrFpduStart).terminate_code()),
            Violation::Tagged(e) => e.terminate_code(),
            Violation::Untagged(e) => e.terminate_code(),
            Violation::Rdmap(e) => e.terminate_code(),
            Violation::Llp(c) => TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code: c.code() },
        }
    }
}

impl From<RdmapError> for Violation {
    fn from(e: RdmapError) -> Violation {
        Violation::Rdmap(e)
    }
}

impl From<UntaggedError> for Violation {
    fn from(e: UntaggedError) -> Violation {
        Violation::Untagged(e)
    }
}

impl core::fmt::Display for Violation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Violation::Header(e) => write!(f, "{e}"),
            Violation::Tagged(e) => write!(f, "{e}"),
            Violation::Untagged(e) => write!(f, "{e}"),
            Violation::Rdmap(e) => write!(f, "{e}"),
            Violation::Llp(c) => write!(f, "{c}"),
        }
    }
}

impl std::error::Error for Violation {}

impl QueuePair {
    /// Terminates the stream for a violation: queues the Terminate (RFC 5040 section 7),
    /// reports it, and flushes every outstanding work request. Only the first error counts.
    pub(super) fn fail(&mut self, code: TerminateCode, offending: Option<&[u8]>) {
        if self.state != QpState::Rts && self.state != QpState::Closing {
            return;
        }
        self.events.push_back(QpEvent::LocalTerminate(code));
        let body = TerminateMessage::for_error(code, offending).to_vec();
        let msn = self.next_msn(QN_TERMINATE);
        let target = MessageTarget::Untagged { rdmap_word: 0, qn: QN_TERMINATE, msn };
        let ctrl = Control::new(Opcode::Terminate).to_byte();
        let segments =
            Segmenter::new(target, ctrl, body.len(), self.config.mulpdu.max(UNTAGGED_HEADER_LEN + 64));
        self.flush_all();
        match segments {
            Ok(segments) => {
                self.terminate = Some(TxMessage { seq: None, segments, source: Source::Inline(body) });
                self.state = QpState::Terminate;
            }
            Err(_) => self.state = QpState::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp_ddp::{Msn, QueueNumber};

    /// Each layer's errors keep their own codes (docs/protocol-notes.md#terminate-codes).
    #[test]
    fn each_layer_maps_its_own_errors() {
        let c = |v: Violation| {
            let c = v.terminate_code();
            (c.layer.to_u8(), c.error_type, c.code)
        };
        assert_eq!(c(Violation::Header(HeaderError::Truncated { needed: 14, got: 3 })), (2, 0, 0x03));
        assert_eq!(
            c(Violation::Header(HeaderError::BadDdpVersion { version: 0, tagged: true })),
            (1, 1, 0x04)
        );
        assert_eq!(c(Violation::Tagged(AccessError::ToWrap)), (1, 1, 0x03));
        assert_eq!(c(Violation::Untagged(UntaggedError::InvalidQn(QueueNumber::Unknown(7)))), (1, 2, 0x01));
        let no_buffer = UntaggedError::NoBuffer { qn: QueueNumber::Send, msn: Msn(1) };
        assert_eq!(c(no_buffer.into()), (1, 2, 0x02));
        assert_eq!(c(RdmapError::UnexpectedReadResponse.into()), (0, 2, 0x06));
        assert_eq!(c(Violation::Llp(LlpErrorCode::Crc)), (2, 0, 0x02));
        assert!(Violation::Llp(LlpErrorCode::Crc).to_string().contains("CRC"));
        assert!(Violation::Tagged(AccessError::ToWrap).to_string().contains("wraps"));
    }
}
