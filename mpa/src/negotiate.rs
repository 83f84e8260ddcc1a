//! Connection setup: local policy + the peer's frame -> the connection's parameters.
//!
//! Rules (RFC 5044 section 7.1, RFC 6581 section 5, and what Linux siw and iw_cxgb4 do):
//!
//! - CRC is used in both directions when either frame has C set. [`CrcPolicy`] adds when to
//!   refuse a peer: `Required` refuses a Reply without C (siw's `mpa_crc_required`), `Strict`
//!   also makes a responder reject a Request without C.
//! - M asks the *other* side to insert markers into what it sends: markers towards the
//!   responder iff the Reply has M, towards the initiator iff the Request has M. siw cannot
//!   send markers and rejects a Request with M; this stack can (see [`Policy::markers_supported`]).
//! - Revision: a responder answers revision 0 and 1 with a revision-1 Reply (no IRD/ORD) and
//!   revision 2 with revision 2 when its policy allows; above 2 is an invalid Request, closed
//!   without a Reply (as siw does). An initiator refuses a Reply whose revision is above its
//!   Request's, and an Enhanced Request answered without Enhanced unless it can fall back
//!   (no peer-to-peer wanted).
//! - IRD/ORD (RFC 6581): the responder's ORD is capped by the initiator's IRD and its IRD
//!   answers the initiator's ORD; in relaxed mode (siw's default) each side lowers its ORD to
//!   the peer's IRD instead of failing, otherwise a shortfall is "insufficient IRD" (LLP 0x06).
//! - Peer-to-peer: the initiator offers RTR types; the responder (whatever its own
//!   `peer_to_peer` setting, which only makes an initiator offer) picks one it accepts
//!   (Write, else Read, else Send, siw's order) or fails with "no matching RTR" (LLP 0x07).
//!   The initiator always sends first: the RTR message when one was agreed, else its first
//!   FPDU (RFC 5044 says the responder must not send before it has received one).
//! - Rejects carry no error code: a Reply with R set and optional private data, then close.

use core::fmt;

use crate::LlpErrorCode;
use crate::frame::{
    FrameError, FrameKind, FrameRepr, IRD_ORD_LEN, IRD_ORD_MAX, IrdOrd, MAX_PRIVATE_DATA_SEND, RtrType,
    RtrTypes,
};

/// When to use, and when to insist on, CRC32c.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CrcPolicy {
    /// Do not ask for CRC; use it when the peer asks (siw's default).
    #[default]
    Off,
    /// Ask for CRC; whatever the peer says, CRC is on (either side's C turns it on).
    Wanted,
    /// Ask for CRC and, as initiator, refuse a Reply that does not confirm it with C.
    Required,
    /// Ask for CRC and refuse any peer that does not set C, in either role.
    Strict,
}

impl CrcPolicy {
    fn sets_c(self) -> bool {
        self != CrcPolicy::Off
    }
}

/// Which end of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the Request (the active side, rdma_connect).
    Initiator,
    /// Sent the Reply (the passive side, rdma_accept).
    Responder,
}

/// The local side's MPA settings for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// MPA revision to speak: 1 (RFC 5044) or 2 (RFC 6581, IRD/ORD and RTR).
    pub revision: u8,
    /// CRC32c policy.
    pub crc: CrcPolicy,
    /// Ask the peer to insert markers into what it sends us (M).
    pub markers_wanted: bool,
    /// Whether this side inserts markers when the peer asks. When false, a peer asking for
    /// markers is refused (siw's behaviour).
    pub markers_supported: bool,
    /// Inbound RDMA Read (and Atomic) requests this side can have outstanding (at most
    /// [`IRD_ORD_MAX`]).
    pub ird: u16,
    /// Outbound RDMA Read (and Atomic) requests this side wants to have outstanding.
    pub ord: u16,
    /// Lower ORD to what the peer's IRD allows instead of failing with insufficient IRD.
    pub relaxed_ird_ord: bool,
    /// Peer-to-peer mode as initiator: offer RTR in the Request. A responder always agrees to
    /// peer-to-peer when the initiator asks for it (Linux siw's initiator terminates with "no
    /// matching RTR" when the Reply leaves it out), picking one of [`Policy::rtr`].
    pub peer_to_peer: bool,
    /// RTR types offered (initiator) or accepted (responder).
    pub rtr: RtrTypes,
}

impl Default for Policy {
    /// siw's defaults with rping's IRD/ORD: revision 2, no CRC, no markers asked for but
    /// supported, IRD = ORD = 1, relaxed, no peer-to-peer, Write and Read RTR accepted.
    fn default() -> Policy {
        Policy {
            revision: 2,
            crc: CrcPolicy::Off,
            markers_wanted: false,
            markers_supported: true,
            ird: 1,
            ord: 1,
            relaxed_ird_ord: true,
            peer_to_peer: false,
            rtr: RtrTypes { send: false, write: true, read: true },
        }
    }
}

/// What negotiation settled for one connection, seen from one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// This end's role.
    pub role: Role,
    /// The MPA revision in use (of the Reply).
    pub revision: u8,
    /// CRC32c on in both directions.
    pub crc: bool,
    /// Markers in what this end sends.
    pub markers_tx: bool,
    /// Markers in what this end receives.
    pub markers_rx: bool,
    /// Inbound Read/Atomic requests this end accepts.
    pub ird: u16,
    /// Outbound Read/Atomic requests this end may have outstanding.
    pub ord: u16,
    /// The RTR message the initiator sends first, when peer-to-peer was agreed.
    pub rtr: Option<RtrType>,
    /// The peer's IRD/ORD word, when it sent one (revision 2).
    pub peer_ird_ord: Option<IrdOrd>,
}

impl ConnParams {
    /// Who sends the first FPDU: always the initiator (its RTR message, or with no RTR its
    /// first ULP message; RFC 5044 section 7.1.1 forbids the responder to send first).
    pub fn first_sender(&self) -> Role {
        Role::Initiator
    }

    /// Whether this end must wait for the peer's first FPDU before sending.
    pub fn must_wait_for_peer(&self) -> bool {
        self.role == Role::Responder
    }
}

/// Why a connection could not be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NegotiationError {
    /// The peer's frame is malformed or of the wrong kind.
    Frame(FrameError),
    /// The peer's revision is not one this side can speak.
    UnsupportedRevision {
        /// The revision received.
        revision: u8,
    },
    /// An Enhanced Request was answered without Enhanced or with another revision, and this
    /// side cannot fall back.
    EnhancedMissing,
    /// The responder rejected the connection (Reply with R set).
    Rejected {
        /// The private data of the reject.
        private_data: Vec<u8>,
    },
    /// The peer wants markers and this side does not insert them.
    MarkersUnsupported,
    /// The peer did not set C though this side's policy insists on CRC.
    CrcRequired,
    /// The IRD/ORD of the two ends do not fit together (RFC 6581).
    InsufficientIrd {
        /// What this end needs the peer to accept (its ORD) or offers (its IRD).
        local: IrdOrd,
        /// The peer's word.
        peer: IrdOrd,
    },
    /// Peer-to-peer with no RTR type both ends accept, or a Reply choosing not exactly one of
    /// the offered types.
    NoMatchingRtr {
        /// Types offered by the initiator.
        offered: RtrTypes,
        /// Types accepted by the responder (or chosen in the Reply).
        accepted: RtrTypes,
    },
    /// Local misuse: private data over [`MAX_PRIVATE_DATA_SEND`] (with the IRD/ORD word).
    PrivateDataTooLong {
        /// Bytes asked for, IRD/ORD word included.
        len: usize,
    },
    /// Local misuse: a policy that cannot be put on the wire.
    InvalidPolicy(&'static str),
}

impl NegotiationError {
    /// The LLP error code a Terminate carries for this failure, where one is sent (after an
    /// accepted Reply the initiator terminates with 0x04, 0x06 or 0x07; rejects and
    /// malformed Requests carry no code).
    pub fn llp_code(&self) -> Option<LlpErrorCode> {
        match self {
            NegotiationError::Frame(_)
            | NegotiationError::UnsupportedRevision { .. }
            | NegotiationError::EnhancedMissing
            | NegotiationError::MarkersUnsupported
            | NegotiationError::CrcRequired => Some(LlpErrorCode::InvalidRequestReply),
            NegotiationError::InsufficientIrd { .. } => Some(LlpErrorCode::InsufficientIrd),
            NegotiationError::NoMatchingRtr { .. } => Some(LlpErrorCode::NoMatchingRtr),
            NegotiationError::Rejected { .. }
            | NegotiationError::PrivateDataTooLong { .. }
            | NegotiationError::InvalidPolicy(_) => None,
        }
    }
}

impl fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NegotiationError::Frame(e) => write!(f, "{e}"),
            NegotiationError::UnsupportedRevision { revision } => {
                write!(f, "unsupported MPA revision {revision}")
            }
            NegotiationError::EnhancedMissing => {
                f.write_str("MPA Reply lacks the enhanced (revision 2) IRD/ORD word")
            }
            NegotiationError::Rejected { private_data } => {
                write!(f, "connection rejected by the peer ({} bytes of private data)", private_data.len())
            }
            NegotiationError::MarkersUnsupported => f.write_str("peer asks for MPA markers, not supported"),
            NegotiationError::CrcRequired => f.write_str("peer does not agree to the required CRC"),
            NegotiationError::InsufficientIrd { local, peer } => write!(
                f,
                "insufficient IRD: local IRD {} ORD {}, peer IRD {} ORD {}",
                local.ird, local.ord, peer.ird, peer.ord
            ),
            NegotiationError::NoMatchingRtr { offered, accepted } => {
                write!(f, "no matching RTR type: offered {offered}, accepted {accepted}")
            }
            NegotiationError::PrivateDataTooLong { len } => write!(
                f,
                "private data of {len} bytes exceeds {MAX_PRIVATE_DATA_SEND} (IRD/ORD word included)"
            ),
            NegotiationError::InvalidPolicy(why) => write!(f, "invalid MPA policy: {why}"),
        }
    }
}

impl std::error::Error for NegotiationError {}

impl From<FrameError> for NegotiationError {
    fn from(e: FrameError) -> NegotiationError {
        NegotiationError::Frame(e)
    }
}

/// A responder's refusal: the error, and the Reject Reply to send before closing, if any
/// (none for a malformed Request, which is closed without an answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal<'a> {
    /// Why.
    pub error: NegotiationError,
    /// The Reply with R set to send, if one is sent.
    pub reply: Option<FrameRepr<'a>>,
}

/// The preference order when choosing among offered RTR types (siw and cxgb4: Write, Read).
const RTR_PREFERENCE: [RtrType; 3] = [RtrType::Write, RtrType::Read, RtrType::Send];

impl Policy {
    fn check(&self) -> Result<(), NegotiationError> {
        if !(1..=2).contains(&self.revision) {
            return Err(NegotiationError::InvalidPolicy("revision must be 1 or 2"));
        }
        if self.ird > IRD_ORD_MAX || self.ord > IRD_ORD_MAX {
            return Err(NegotiationError::InvalidPolicy("IRD and ORD must be at most 16383"));
        }
        if self.peer_to_peer && self.revision != 2 {
            return Err(NegotiationError::InvalidPolicy("peer-to-peer needs MPA revision 2"));
        }
        if self.peer_to_peer && self.rtr.is_empty() {
            return Err(NegotiationError::InvalidPolicy("peer-to-peer needs an RTR type"));
        }
        Ok(())
    }

    fn check_private_data(len: usize, enhanced: bool) -> Result<(), NegotiationError> {
        let total = len + if enhanced { IRD_ORD_LEN } else { 0 };
        if total > MAX_PRIVATE_DATA_SEND {
            return Err(NegotiationError::PrivateDataTooLong { len: total });
        }
        Ok(())
    }

    /// The IRD/ORD word this side offers as initiator.
    fn offer(&self) -> IrdOrd {
        let read_rtr = self.peer_to_peer && self.rtr.read;
        IrdOrd {
            ird: self.ird,
            // A zero-length Read RTR is a Read Request and needs ORD >= 1 (siw_connect).
            ord: if read_rtr { self.ord.max(1) } else { self.ord },
            peer_to_peer: self.peer_to_peer,
            rtr: if self.peer_to_peer { self.rtr } else { RtrTypes::NONE },
        }
    }

    /// The Request this side sends as initiator, carrying `private_data` (the IRD/ORD word is
    /// added in front of it for revision 2).
    pub fn request<'a>(&self, private_data: &'a [u8]) -> Result<FrameRepr<'a>, NegotiationError> {
        self.check()?;
        let enhanced = self.revision == 2;
        Self::check_private_data(private_data.len(), enhanced)?;
        Ok(FrameRepr {
            kind: FrameKind::Request,
            markers: self.markers_wanted,
            crc: self.crc.sets_c(),
            reject: false,
            revision: self.revision,
            ird_ord: enhanced.then(|| self.offer()),
            reserved: 0,
            private_data,
        })
    }

    /// A Reject Reply to `request`, for an application that refuses the connection.
    pub fn reject<'a>(
        &self,
        request: &FrameRepr<'_>,
        private_data: &'a [u8],
    ) -> Result<FrameRepr<'a>, NegotiationError> {
        let revision = request.revision.min(self.revision);
        let enhanced = revision == 2 && request.ird_ord.is_some();
        Self::check_private_data(private_data.len(), enhanced)?;
        Ok(FrameRepr {
            kind: FrameKind::Reply,
            markers: false,
            crc: false,
            reject: true,
            revision,
            ird_ord: enhanced.then(|| IrdOrd { ird: self.ird, ord: self.ord, ..IrdOrd::default() }),
            reserved: 0,
            private_data,
        })
    }

    /// As responder: answers `request` with the Reply to send and the connection's
    /// parameters, or refuses it.
    pub fn respond<'a>(
        &self,
        request: &FrameRepr<'_>,
        private_data: &'a [u8],
    ) -> Result<(FrameRepr<'a>, ConnParams), Refusal<'a>> {
        let close = |error| Refusal { error, reply: None };
        self.check().map_err(close)?;
        if request.kind != FrameKind::Request {
            return Err(close(FrameError::UnexpectedKind { expected: FrameKind::Request }.into()));
        }
        if request.revision > 2 {
            return Err(close(NegotiationError::UnsupportedRevision { revision: request.revision }));
        }
        // Revisions 0 and 1 get a revision-1 Reply; 2 gets what the policy speaks.
        let revision = request.revision.clamp(1, self.revision);
        let peer_word = if revision == 2 { request.ird_ord } else { None };
        let refuse = |error| {
            let reply = self.reject(request, &[]).ok().map(|r| FrameRepr { revision, ..r });
            Refusal { error, reply }
        };
        if request.markers && !self.markers_supported {
            return Err(refuse(NegotiationError::MarkersUnsupported));
        }
        if self.crc == CrcPolicy::Strict && !request.crc {
            return Err(refuse(NegotiationError::CrcRequired));
        }
        let enhanced = peer_word.is_some();
        Self::check_private_data(private_data.len(), enhanced).map_err(close)?;

        let (word, params) = match peer_word {
            Some(peer) => {
                let (word, rtr) = self.answer_word(&peer).map_err(refuse)?;
                (Some(word), (word.ird, word.ord, rtr))
            }
            None => (None, (self.ird, self.ord, None)),
        };
        let (ird, ord, rtr) = params;
        let reply = FrameRepr {
            kind: FrameKind::Reply,
            markers: self.markers_wanted,
            crc: request.crc || self.crc.sets_c(),
            reject: false,
            revision,
            ird_ord: word,
            reserved: 0,
            private_data,
        };
        let conn = ConnParams {
            role: Role::Responder,
            revision,
            crc: reply.crc,
            markers_tx: request.markers,
            markers_rx: self.markers_wanted,
            ird,
            ord,
            rtr,
            peer_ird_ord: peer_word,
        };
        Ok((reply, conn))
    }

    /// The responder's IRD/ORD word for the initiator's `peer` word, and the RTR chosen.
    fn answer_word(&self, peer: &IrdOrd) -> Result<(IrdOrd, Option<RtrType>), NegotiationError> {
        let rtr = if peer.peer_to_peer {
            let common = peer.rtr.intersection(self.rtr);
            let chosen = RTR_PREFERENCE.into_iter().find(|t| common.intersection((*t).into()) == (*t).into());
            match chosen {
                Some(t) => Some(t),
                None => {
                    return Err(NegotiationError::NoMatchingRtr { offered: peer.rtr, accepted: self.rtr });
                }
            }
        } else {
            None
        };
        let local = IrdOrd { ird: self.ird, ord: self.ord, ..IrdOrd::default() };
        // Our ORD may not exceed the initiator's IRD; our IRD answers its ORD.
        let ord = if self.ord > peer.ird {
            if !self.relaxed_ird_ord {
                return Err(NegotiationError::InsufficientIrd { local, peer: *peer });
            }
            peer.ird
        } else {
            self.ord
        };
        // A zero-length Read RTR is an inbound Read Request: it needs IRD >= 1.
        let min_ird = u16::from(rtr == Some(RtrType::Read));
        let wanted = peer.ord.max(min_ird);
        let ird = if wanted > self.ird {
            if !self.relaxed_ird_ord || min_ird > self.ird {
                return Err(NegotiationError::InsufficientIrd { local, peer: *peer });
            }
            // Relaxed: offer what we have; the initiator lowers its ORD to it.
            self.ird
        } else {
            wanted
        };
        let word =
            IrdOrd { ird, ord, peer_to_peer: rtr.is_some(), rtr: rtr.map_or(RtrTypes::NONE, RtrTypes::from) };
        Ok((word, rtr))
    }

    /// As initiator: checks the responder's `reply` to the Request this policy produced
    /// ([`Policy::request`]) and settles the connection's parameters.
    pub fn accept_reply(&self, reply: &FrameRepr<'_>) -> Result<ConnParams, NegotiationError> {
        self.check()?;
        if reply.kind != FrameKind::Reply {
            return Err(FrameError::UnexpectedKind { expected: FrameKind::Reply }.into());
        }
        if reply.reject {
            return Err(NegotiationError::Rejected { private_data: reply.private_data.to_vec() });
        }
        if reply.revision > self.revision {
            return Err(NegotiationError::UnsupportedRevision { revision: reply.revision });
        }
        if reply.markers && !self.markers_supported {
            return Err(NegotiationError::MarkersUnsupported);
        }
        if matches!(self.crc, CrcPolicy::Required | CrcPolicy::Strict) && !reply.crc {
            return Err(NegotiationError::CrcRequired);
        }
        let offered = self.offer();
        let (ird, ord, rtr, peer_word) = match (self.revision, reply.ird_ord) {
            (2, Some(peer)) => {
                let rtr = if self.peer_to_peer && peer.peer_to_peer {
                    match peer.rtr.single() {
                        Some(t) if offered.rtr.intersection(t.into()) == t.into() => Some(t),
                        _ => {
                            return Err(NegotiationError::NoMatchingRtr {
                                offered: offered.rtr,
                                accepted: peer.rtr,
                            });
                        }
                    }
                } else {
                    None
                };
                // The responder may not have more Reads outstanding towards us than our IRD.
                if peer.ord > offered.ird {
                    return Err(NegotiationError::InsufficientIrd { local: offered, peer });
                }
                let ord = if offered.ord > peer.ird {
                    if !self.relaxed_ird_ord || rtr == Some(RtrType::Read) && peer.ird == 0 {
                        return Err(NegotiationError::InsufficientIrd { local: offered, peer });
                    }
                    peer.ird
                } else {
                    offered.ord
                };
                (offered.ird, ord, rtr, Some(peer))
            }
            (2, None) if self.peer_to_peer || reply.revision == 2 => {
                return Err(NegotiationError::EnhancedMissing);
            }
            // A revision-1 answer to an Enhanced Request: fall back to RFC 5044, where IRD/ORD
            // are whatever the upper layers agree on.
            _ => (self.ird, self.ord, None, None),
        };
        Ok(ConnParams {
            role: Role::Initiator,
            revision: reply.revision,
            crc: self.crc.sets_c() || reply.crc,
            markers_tx: reply.markers,
            markers_rx: self.markers_wanted,
            ird,
            ord,
            rtr,
            peer_ird_ord: peer_word,
        })
    }
}

/// Fuzz entry point (fuzz/fuzz_targets/mpa_frame.rs): parses `frame` as a peer's Request or
/// Reply and runs it through a policy chosen by `sel`, in the role the frame asks for; a frame
/// that parses must re-emit to the same bytes, and an accepted Request's Reply must parse.
/// Panics only on a bug.
#[doc(hidden)]
pub fn fuzz_negotiation(sel: u8, frame: &[u8]) {
    let crc = match sel & 3 {
        0 => CrcPolicy::Off,
        1 => CrcPolicy::Wanted,
        2 => CrcPolicy::Required,
        _ => CrcPolicy::Strict,
    };
    let policy = Policy {
        revision: if sel & 4 != 0 { 1 } else { 2 },
        crc,
        markers_wanted: sel & 8 != 0,
        markers_supported: sel & 16 != 0,
        ird: u16::from(sel >> 5),
        ord: u16::from(sel >> 6),
        relaxed_ird_ord: sel & 0x20 != 0,
        peer_to_peer: sel & 0x80 != 0 && sel & 4 == 0,
        rtr: RtrTypes { send: sel & 1 != 0, write: true, read: sel & 2 != 0 },
    };
    let Ok(Some((repr, len))) = FrameRepr::parse_prefix(frame) else { return };
    let again = repr.to_vec().unwrap_or_default();
    assert_eq!(again.get(..), frame.get(..len));
    match repr.kind {
        FrameKind::Request => match policy.respond(&repr, b"fuzz") {
            Ok((reply, params)) => {
                let bytes = reply.to_vec().unwrap_or_default();
                assert_eq!(FrameRepr::parse(&bytes).ok(), Some(reply));
                assert!(params.ird <= IRD_ORD_MAX && params.ord <= IRD_ORD_MAX);
                assert_eq!(params.crc, reply.crc || repr.crc);
            }
            Err(refusal) => {
                if let Some(r) = refusal.reply {
                    assert!(r.reject && r.to_vec().is_ok());
                }
            }
        },
        FrameKind::Reply => {
            if let Ok(params) = policy.accept_reply(&repr) {
                assert!(params.ord <= policy.ord.max(1) && !repr.reject);
            }
        }
    }
}
