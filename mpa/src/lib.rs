//! MPA, Marker PDU Aligned framing for TCP (RFC 5044), with the enhanced connection setup of
//! RFC 6581.
//!
//! MPA turns a TCP byte stream into framed PDUs (FPDUs) for DDP and negotiates each
//! connection with a Request/Reply exchange. This crate is sans-IO: it owns no socket, spawns
//! no thread and reads no clock. The pieces:
//!
//! - [`frame`]: the Request and Reply frames ([`FrameRepr`] parse/emit, [`IrdOrd`]).
//! - [`negotiate`]: local [`Policy`] + the peer's frame -> [`ConnParams`], or an error naming the
//!   LLP Terminate code ([`LlpErrorCode`]).
//! - [`fpdu`]: FPDU layout: pad, CRC byte order, markers, MULPDU.
//! - [`codec`]: the [`Framer`] (ULPDU -> FPDU into a caller's buffer) and the incremental
//!   [`Deframer`] (bytes -> ULPDUs, zero-copy when no marker is in the way).
//!
//! ```
//! use iwarp_mpa::{Deframed, Deframer, Framer, Policy, FrameRepr};
//!
//! // Handshake: the initiator's Request, the responder's Reply.
//! let initiator = Policy::default();
//! let responder = Policy::default();
//! let request = initiator.request(b"hello").unwrap().to_vec().unwrap();
//! let request = FrameRepr::parse(&request).unwrap();
//! let (reply, server) = responder.respond(&request, b"").unwrap();
//! let client = initiator.accept_reply(&reply).unwrap();
//! assert_eq!(client.crc, server.crc);
//!
//! // Data: frame a ULPDU, deframe it on the other side.
//! let mut framer = Framer::new(client.crc, client.markers_tx);
//! let wire = framer.frame_to_vec(b"a DDP segment").unwrap();
//! let mut deframer = Deframer::new(server.crc, server.markers_rx);
//! match deframer.deframe(&wire).unwrap() {
//!     Deframed::Fpdu(f) => assert_eq!(f.ulpdu, b"a DDP segment"),
//!     Deframed::NeedMore(n) => unreachable!("{n}"),
//! }
//! ```
#![forbid(unsafe_code)]

pub mod codec;
mod error;
pub mod fpdu;
pub mod frame;
pub mod negotiate;

pub use codec::{CrcCheck, DeframeError, Deframed, Deframer, Fpdu, Framer, FramerError, StreamDeframer};
pub use error::LlpErrorCode;
pub use frame::{FrameError, FrameKind, FrameRepr, IrdOrd, RtrType, RtrTypes};
pub use negotiate::{ConnParams, CrcPolicy, NegotiationError, Policy, Refusal, Role};
