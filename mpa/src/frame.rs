//! MPA Request and Reply frames (RFC 5044 section 7.1, RFC 6581 section 5).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                Key "MPA ID Req Frame" / "MPA ID Rep Frame"    |
//! |                          (16 octets)                          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |M|C|R|H| Res   |     Rev       |          PD_Length            |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~ Private data (PD_Length octets; with H set it starts with the ~
//! ~ RFC 6581 IRD/ORD word)                                        ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! [`Frame`] is a view over the bytes (raw field access, used by the dissector to show even
//! malformed frames); [`FrameRepr`] is the checked, semantic form with `parse` and `emit`.

use core::fmt;

/// The 16-octet key of a Request frame.
pub const REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// The 16-octet key of a Reply frame.
pub const REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Length of the fixed part of a Request/Reply frame (key, flags, revision, PD_Length).
pub const HEADER_LEN: usize = 20;
/// The largest private data an MPA frame may carry (RFC 5044 section 7.1: PD_Length
/// "MUST NOT be larger than 512").
pub const MAX_PRIVATE_DATA: usize = 512;
/// The largest private data (IRD/ORD word included) this stack ever sends: the Linux kernel's
/// siw aborts the handshake when a received PD_Length exceeds 256 (siw_cm.c, `MPA_MAX_PRIVDATA`).
pub const MAX_PRIVATE_DATA_SEND: usize = 256;
/// Length of the RFC 6581 IRD/ORD word at the start of enhanced private data.
pub const IRD_ORD_LEN: usize = 4;

/// Flag bits of the flags octet.
pub mod flags {
    /// M: the sender wants markers in the FPDUs it receives.
    pub const MARKERS: u8 = 0x80;
    /// C: the sender wants CRC32c in the FPDUs (if either side sets it, both use it).
    pub const CRC: u8 = 0x40;
    /// R: reject (meaningful in a Reply only).
    pub const REJECT: u8 = 0x20;
    /// H: RFC 6581 enhanced connection establishment; private data starts with IRD/ORD.
    pub const ENHANCED: u8 = 0x10;
    /// The four reserved low bits (siw uses 0x08 privately for its GSO hint).
    pub const RESERVED: u8 = 0x0f;
}

mod field {
    use core::ops::Range;
    pub(crate) const KEY: Range<usize> = 0..16;
    pub(crate) const FLAGS: usize = 16;
    pub(crate) const REV: usize = 17;
    pub(crate) const PD_LEN: Range<usize> = 18..20;
    pub(crate) const PD: usize = 20;
}

/// Which of the two frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// "MPA ID Req Frame", sent by the initiator.
    Request,
    /// "MPA ID Rep Frame", sent by the responder.
    Reply,
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Request => "Request",
            FrameKind::Reply => "Reply",
        })
    }
}

/// Everything that can be wrong with the bytes of a Request or Reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the frame needs; `needed` is the full frame length known so far.
    Truncated {
        /// Bytes needed for the frame (at least [`HEADER_LEN`]).
        needed: usize,
    },
    /// The 16-octet key is neither the Request nor the Reply key.
    BadKey,
    /// A different frame kind than the one expected at this point of the handshake.
    UnexpectedKind {
        /// The kind expected.
        expected: FrameKind,
    },
    /// PD_Length above [`MAX_PRIVATE_DATA`] (or, when emitting, above the buffer).
    PrivateDataTooLong {
        /// The length found.
        len: usize,
        /// The limit it exceeds.
        limit: usize,
    },
    /// The reject bit is set in a Request (it is only defined for a Reply).
    RejectInRequest,
    /// The Enhanced bit is set but the revision is not 2 (RFC 6581 section 5).
    EnhancedNotRevision2 {
        /// The revision found.
        revision: u8,
    },
    /// The Enhanced bit is set but the private data is shorter than the IRD/ORD word.
    MissingIrdOrd {
        /// PD_Length found.
        pd_len: usize,
    },
    /// The output buffer is not the length the frame needs.
    BufferSize {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes offered.
        got: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { needed } => {
                write!(f, "MPA frame truncated: {needed} bytes needed")
            }
            FrameError::BadKey => f.write_str("not an MPA Request/Reply frame (bad key)"),
            FrameError::UnexpectedKind { expected } => {
                write!(f, "expected an MPA {expected} frame")
            }
            FrameError::PrivateDataTooLong { len, limit } => {
                write!(f, "MPA private data length {len} exceeds {limit}")
            }
            FrameError::RejectInRequest => f.write_str("reject bit set in an MPA Request"),
            FrameError::EnhancedNotRevision2 { revision } => {
                write!(f, "enhanced bit set with MPA revision {revision} (needs 2)")
            }
            FrameError::MissingIrdOrd { pd_len } => {
                write!(f, "enhanced bit set but private data ({pd_len} bytes) lacks the IRD/ORD word")
            }
            FrameError::BufferSize { needed, got } => {
                write!(f, "MPA frame needs a {needed}-byte buffer, got {got}")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// The RFC 6581 IRD/ORD word: two big-endian 16-bit halves.
///
/// IRD half: bit 15 `A` peer-to-peer, bit 14 `B` zero-length Send RTR, low 14 bits IRD.
/// ORD half: bit 15 `C` zero-length RDMA Write RTR, bit 14 `D` zero-length RDMA Read RTR,
/// low 14 bits ORD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// `A`: peer-to-peer mode (an RTR message opens the data phase).
    pub peer_to_peer: bool,
    /// The RTR message types offered (Request) or the one chosen (Reply).
    pub rtr: RtrTypes,
}

/// The largest IRD or ORD the word can carry.
pub const IRD_ORD_MAX: u16 = 0x3fff;

impl IrdOrd {
    const P2P: u16 = 0x8000;
    const SEND_RTR: u16 = 0x4000;
    const WRITE_RTR: u16 = 0x8000;
    const READ_RTR: u16 = 0x4000;

    /// Decodes the 4-byte word.
    pub fn from_bytes(b: [u8; 4]) -> IrdOrd {
        let ird = u16::from_be_bytes([b[0], b[1]]);
        let ord = u16::from_be_bytes([b[2], b[3]]);
        IrdOrd {
            ird: ird & IRD_ORD_MAX,
            ord: ord & IRD_ORD_MAX,
            peer_to_peer: ird & Self::P2P != 0,
            rtr: RtrTypes {
                send: ird & Self::SEND_RTR != 0,
                write: ord & Self::WRITE_RTR != 0,
                read: ord & Self::READ_RTR != 0,
            },
        }
    }

    /// Encodes the word; IRD and ORD above [`IRD_ORD_MAX`] are clamped to it.
    pub fn to_bytes(self) -> [u8; 4] {
        let mut ird = self.ird.min(IRD_ORD_MAX);
        let mut ord = self.ord.min(IRD_ORD_MAX);
        if self.peer_to_peer {
            ird |= Self::P2P;
        }
        if self.rtr.send {
            ird |= Self::SEND_RTR;
        }
        if self.rtr.write {
            ord |= Self::WRITE_RTR;
        }
        if self.rtr.read {
            ord |= Self::READ_RTR;
        }
        let i = ird.to_be_bytes();
        let o = ord.to_be_bytes();
        [i[0], i[1], o[0], o[1]]
    }
}

/// A set of RFC 6581 ready-to-receive (RTR) message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrTypes {
    /// Zero-length Send.
    pub send: bool,
    /// Zero-length RDMA Write.
    pub write: bool,
    /// Zero-length RDMA Read (a Read Request of length 0).
    pub read: bool,
}

impl RtrTypes {
    /// No RTR type.
    pub const NONE: RtrTypes = RtrTypes { send: false, write: false, read: false };
    /// All three RTR types.
    pub const ALL: RtrTypes = RtrTypes { send: true, write: true, read: true };

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// The types in both sets.
    pub fn intersection(self, other: RtrTypes) -> RtrTypes {
        RtrTypes {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// The single type, if the set holds exactly one.
    pub fn single(self) -> Option<RtrType> {
        match (self.send, self.write, self.read) {
            (true, false, false) => Some(RtrType::Send),
            (false, true, false) => Some(RtrType::Write),
            (false, false, true) => Some(RtrType::Read),
            _ => None,
        }
    }
}

impl From<RtrType> for RtrTypes {
    fn from(t: RtrType) -> RtrTypes {
        RtrTypes { send: t == RtrType::Send, write: t == RtrType::Write, read: t == RtrType::Read }
    }
}

impl fmt::Display for RtrTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (on, name) in [(self.send, "send"), (self.write, "write"), (self.read, "read")] {
            if on {
                if !first {
                    f.write_str("+")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// One RTR message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrType {
    /// Zero-length Send.
    Send,
    /// Zero-length RDMA Write (siw's choice when offered).
    Write,
    /// Zero-length RDMA Read Request.
    Read,
}

impl fmt::Display for RtrType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RtrType::Send => "send",
            RtrType::Write => "write",
            RtrType::Read => "read",
        })
    }
}

/// A read-only or read-write view over the bytes of a Request or Reply frame.
///
/// After [`Frame::new_checked`] succeeded no accessor panics.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer after checking it holds the whole frame ([`Frame::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Frame<T>, FrameError> {
        let f = Frame::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks the buffer holds the header and all the private data PD_Length announces.
    pub fn check_len(&self) -> Result<(), FrameError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated { needed: HEADER_LEN });
        }
        let needed = self.total_len();
        if b.len() < needed {
            return Err(FrameError::Truncated { needed });
        }
        Ok(())
    }

    /// The kind named by the key, if it is one of the two keys.
    pub fn kind(&self) -> Option<FrameKind> {
        let key = &self.buffer.as_ref()[field::KEY];
        if key == REQUEST_KEY {
            Some(FrameKind::Request)
        } else if key == REPLY_KEY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }

    /// The raw flags octet.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The revision octet.
    pub fn revision(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    /// PD_Length.
    pub fn pd_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PD_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Header plus private data length.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_len())
    }

    /// All private data, the IRD/ORD word included when present.
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PD..self.total_len()]
    }

    /// Consumes the view, giving back the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    fn set_key(&mut self, kind: FrameKind) {
        let key = match kind {
            FrameKind::Request => REQUEST_KEY,
            FrameKind::Reply => REPLY_KEY,
        };
        self.buffer.as_mut()[field::KEY].copy_from_slice(key);
    }

    fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }

    fn set_revision(&mut self, v: u8) {
        self.buffer.as_mut()[field::REV] = v;
    }

    fn set_pd_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::PD_LEN].copy_from_slice(&v.to_be_bytes());
    }

    fn private_data_mut(&mut self) -> &mut [u8] {
        let end = self.total_len();
        &mut self.buffer.as_mut()[field::PD..end]
    }
}

/// The semantic content of a Request or Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: the sender wants markers in what it receives.
    pub markers: bool,
    /// C: the sender wants CRC.
    pub crc: bool,
    /// R: the responder rejects the connection (Reply only).
    pub reject: bool,
    /// Rev: 1 (RFC 5044) or 2 (RFC 6581); 0 was used by pre-RFC drafts and Linux accepts it.
    pub revision: u8,
    /// The IRD/ORD word, present exactly when the Enhanced bit is set.
    pub ird_ord: Option<IrdOrd>,
    /// The reserved low four flag bits, kept so that a frame can be shown and re-emitted as
    /// received (siw sets 0x08 privately). Sent as zero by this stack.
    pub reserved: u8,
    /// The upper layer's private data (after the IRD/ORD word when there is one).
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Parses a complete frame held at the start of `buf` (bytes after it are ignored).
    ///
    /// Checks the key, PD_Length against [`MAX_PRIVATE_DATA`], the reject bit (Reply only) and
    /// the Enhanced bit (revision 2 and room for the IRD/ORD word).
    pub fn parse(buf: &'a [u8]) -> Result<FrameRepr<'a>, FrameError> {
        if buf.len() < HEADER_LEN {
            return Err(FrameError::Truncated { needed: HEADER_LEN });
        }
        let view = Frame::new_unchecked(buf);
        let kind = view.kind().ok_or(FrameError::BadKey)?;
        let pd_len = usize::from(view.pd_len());
        if pd_len > MAX_PRIVATE_DATA {
            return Err(FrameError::PrivateDataTooLong { len: pd_len, limit: MAX_PRIVATE_DATA });
        }
        view.check_len()?;
        let flag_bits = view.flags();
        let revision = view.revision();
        let reject = flag_bits & flags::REJECT != 0;
        if reject && kind == FrameKind::Request {
            return Err(FrameError::RejectInRequest);
        }
        let pd = &buf[field::PD..view.total_len()];
        let (ird_ord, private_data) = if flag_bits & flags::ENHANCED != 0 {
            if revision != 2 {
                return Err(FrameError::EnhancedNotRevision2 { revision });
            }
            match pd.split_first_chunk::<IRD_ORD_LEN>() {
                Some((word, rest)) => (Some(IrdOrd::from_bytes(*word)), rest),
                None => return Err(FrameError::MissingIrdOrd { pd_len }),
            }
        } else {
            (None, pd)
        };
        Ok(FrameRepr {
            kind,
            markers: flag_bits & flags::MARKERS != 0,
            crc: flag_bits & flags::CRC != 0,
            reject,
            revision,
            ird_ord,
            reserved: flag_bits & flags::RESERVED,
            private_data,
        })
    }

    /// Parses a frame from the start of a byte stream: `Ok(None)` means more bytes are needed;
    /// otherwise the frame and the number of bytes it occupies.
    pub fn parse_prefix(buf: &'a [u8]) -> Result<Option<(FrameRepr<'a>, usize)>, FrameError> {
        match FrameRepr::parse(buf) {
            Ok(repr) => Ok(Some((repr, repr.buffer_len()))),
            Err(FrameError::Truncated { .. }) => {
                // A wrong key is "malformed", not "need more", as soon as it can be seen.
                if buf.len() >= REQUEST_KEY.len() && Frame::new_unchecked(buf).kind_prefix_bad() {
                    return Err(FrameError::BadKey);
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// PD_Length: the private data plus the IRD/ORD word when present.
    pub fn pd_len(&self) -> usize {
        self.private_data.len() + if self.ird_ord.is_some() { IRD_ORD_LEN } else { 0 }
    }

    /// The frame's length on the wire.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }

    /// Writes the frame into `buf`, which must be exactly [`FrameRepr::buffer_len`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), FrameError> {
        let pd_len = self.pd_len();
        if pd_len > MAX_PRIVATE_DATA {
            return Err(FrameError::PrivateDataTooLong { len: pd_len, limit: MAX_PRIVATE_DATA });
        }
        if self.reject && self.kind == FrameKind::Request {
            return Err(FrameError::RejectInRequest);
        }
        if self.ird_ord.is_some() && self.revision != 2 {
            return Err(FrameError::EnhancedNotRevision2 { revision: self.revision });
        }
        let needed = self.buffer_len();
        if buf.len() != needed {
            return Err(FrameError::BufferSize { needed, got: buf.len() });
        }
        let mut bits = self.reserved & flags::RESERVED;
        for (on, bit) in [
            (self.markers, flags::MARKERS),
            (self.crc, flags::CRC),
            (self.reject, flags::REJECT),
            (self.ird_ord.is_some(), flags::ENHANCED),
        ] {
            if on {
                bits |= bit;
            }
        }
        let mut view = Frame::new_unchecked(buf);
        view.set_key(self.kind);
        view.set_flags(bits);
        view.set_revision(self.revision);
        // pd_len <= MAX_PRIVATE_DATA was checked above, so it fits in 16 bits.
        view.set_pd_len(u16::try_from(pd_len).unwrap_or(u16::MAX));
        let pd = view.private_data_mut();
        let rest = match self.ird_ord {
            Some(word) => {
                pd[..IRD_ORD_LEN].copy_from_slice(&word.to_bytes());
                &mut pd[IRD_ORD_LEN..]
            }
            None => pd,
        };
        rest.copy_from_slice(self.private_data);
        Ok(())
    }

    /// Emits the frame into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, FrameError> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Whether the first 16 bytes are already known not to be either key.
    fn kind_prefix_bad(&self) -> bool {
        self.buffer.as_ref().len() >= field::KEY.end && self.kind().is_none()
    }
}

impl fmt::Display for FrameRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MPA {} rev {}", self.kind, self.revision)?;
        for (on, name) in [(self.markers, "M"), (self.crc, "C"), (self.reject, "R")] {
            if on {
                write!(f, " {name}")?;
            }
        }
        if let Some(w) = self.ird_ord {
            write!(f, " IRD {} ORD {}", w.ird, w.ord)?;
            if w.peer_to_peer {
                write!(f, " P2P RTR {}", w.rtr)?;
            }
        }
        write!(f, " pd {} bytes", self.private_data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// siw's rping client Request: rev 2, enhanced, IRD/ORD 1/1 (tests/data/siw/siw-rping.pcap).
    static SIW_RPING_REQUEST: [u8; 24] = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'q', b' ', b'F', b'r', b'a', b'm', b'e', 0x10,
        0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];

    /// siw's peer-to-peer Reply: write RTR chosen, `80 01 80 01`.
    static SIW_P2P_REPLY: [u8; 24] = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'p', b' ', b'F', b'r', b'a', b'm', b'e', 0x10,
        0x02, 0x00, 0x04, 0x80, 0x01, 0x80, 0x01,
    ];

    #[test]
    fn deconstruct_request() {
        let f = Frame::new_checked(&SIW_RPING_REQUEST[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Request));
        assert_eq!(f.flags(), flags::ENHANCED);
        assert_eq!(f.revision(), 2);
        assert_eq!(f.pd_len(), 4);
        assert_eq!(f.private_data(), &[0, 1, 0, 1]);
    }

    #[test]
    fn parse_request() {
        let r = FrameRepr::parse(&SIW_RPING_REQUEST).unwrap();
        assert_eq!(
            r,
            FrameRepr {
                kind: FrameKind::Request,
                markers: false,
                crc: false,
                reject: false,
                revision: 2,
                ird_ord: Some(IrdOrd { ird: 1, ord: 1, peer_to_peer: false, rtr: RtrTypes::NONE }),
                reserved: 0,
                private_data: &[],
            }
        );
    }

    #[test]
    fn parse_emit_p2p_reply() {
        let r = FrameRepr::parse(&SIW_P2P_REPLY).unwrap();
        let w = r.ird_ord.unwrap();
        assert!(w.peer_to_peer);
        assert_eq!(w.rtr.single(), Some(RtrType::Write));
        assert_eq!((w.ird, w.ord), (1, 1));
        let mut out = [0u8; 24];
        r.emit(&mut out).unwrap();
        assert_eq!(out, SIW_P2P_REPLY);
    }

    #[test]
    fn construct_request() {
        let repr = FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            ird_ord: Some(IrdOrd { ird: 1, ord: 1, ..Default::default() }),
            reserved: 0,
            private_data: &[],
        };
        assert_eq!(repr.buffer_len(), 24);
        assert_eq!(repr.to_vec().unwrap(), SIW_RPING_REQUEST);
    }

    #[test]
    fn ird_ord_word_bits() {
        let offered = IrdOrd::from_bytes([0x80, 0x01, 0xc0, 0x01]);
        assert!(offered.peer_to_peer);
        assert_eq!(offered.rtr, RtrTypes { send: false, write: true, read: true });
        assert_eq!(offered.to_bytes(), [0x80, 0x01, 0xc0, 0x01]);
        let all = IrdOrd { ird: 0x3fff, ord: 0x3fff, peer_to_peer: true, rtr: RtrTypes::ALL };
        assert_eq!(all.to_bytes(), [0xff, 0xff, 0xff, 0xff]);
        let clamped = IrdOrd { ird: 0xffff, ord: 0x4000, ..Default::default() };
        assert_eq!(clamped.to_bytes(), [0x3f, 0xff, 0x3f, 0xff]);
        assert_eq!(IrdOrd::from_bytes([0x00, 0x80, 0x00, 0x80]).ird, 128);
    }

    #[test]
    fn rev1_with_private_data_and_flags() {
        let repr = FrameRepr {
            kind: FrameKind::Reply,
            markers: true,
            crc: true,
            reject: true,
            revision: 1,
            ird_ord: None,
            reserved: 0,
            private_data: b"no",
        };
        let v = repr.to_vec().unwrap();
        assert_eq!(&v[..16], REPLY_KEY);
        assert_eq!(&v[16..], &[0xe0, 0x01, 0x00, 0x02, b'n', b'o']);
        assert_eq!(FrameRepr::parse(&v).unwrap(), repr);
    }

    #[test]
    fn reserved_bits_kept() {
        let mut b = SIW_RPING_REQUEST;
        b[16] |= 0x08;
        let r = FrameRepr::parse(&b).unwrap();
        assert_eq!(r.reserved, 0x08);
        assert_eq!(r.to_vec().unwrap(), b);
    }

    #[test]
    fn malformed() {
        let mut b = SIW_RPING_REQUEST;
        b[0] = b'X';
        assert_eq!(FrameRepr::parse(&b), Err(FrameError::BadKey));

        assert_eq!(FrameRepr::parse(&SIW_RPING_REQUEST[..19]), Err(FrameError::Truncated { needed: 20 }));
        assert_eq!(FrameRepr::parse(&SIW_RPING_REQUEST[..22]), Err(FrameError::Truncated { needed: 24 }));

        let mut b = SIW_RPING_REQUEST;
        b[16] |= flags::REJECT;
        assert_eq!(FrameRepr::parse(&b), Err(FrameError::RejectInRequest));

        let mut b = SIW_RPING_REQUEST;
        b[17] = 1;
        assert_eq!(FrameRepr::parse(&b), Err(FrameError::EnhancedNotRevision2 { revision: 1 }));

        let mut b = SIW_RPING_REQUEST.to_vec();
        b[19] = 2;
        b.truncate(22);
        assert_eq!(FrameRepr::parse(&b), Err(FrameError::MissingIrdOrd { pd_len: 2 }));

        let mut b = SIW_RPING_REQUEST.to_vec();
        b[18] = 0x02;
        b[19] = 0x01; // 513
        b.resize(20 + 513, 0);
        assert_eq!(FrameRepr::parse(&b), Err(FrameError::PrivateDataTooLong { len: 513, limit: 512 }));
    }

    #[test]
    fn max_private_data_round_trip() {
        let pd = [0xa5u8; 512];
        let repr = FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 1,
            ird_ord: None,
            reserved: 0,
            private_data: &pd,
        };
        let v = repr.to_vec().unwrap();
        assert_eq!(v.len(), 532);
        assert_eq!(FrameRepr::parse(&v).unwrap(), repr);
        let too_long = FrameRepr { private_data: &[0; 513], ..repr };
        assert!(matches!(too_long.to_vec(), Err(FrameError::PrivateDataTooLong { .. })));
        let enhanced_too_long =
            FrameRepr { revision: 2, ird_ord: Some(IrdOrd::default()), private_data: &[0; 509], ..repr };
        assert!(matches!(enhanced_too_long.to_vec(), Err(FrameError::PrivateDataTooLong { .. })));
    }

    #[test]
    fn emit_wrong_buffer() {
        let r = FrameRepr::parse(&SIW_RPING_REQUEST).unwrap();
        let mut small = [0u8; 23];
        assert_eq!(r.emit(&mut small), Err(FrameError::BufferSize { needed: 24, got: 23 }));
    }

    #[test]
    fn parse_prefix_stream() {
        let mut stream = SIW_RPING_REQUEST.to_vec();
        stream.extend_from_slice(&[0, 0x20]);
        for cut in 0..SIW_RPING_REQUEST.len() {
            assert_eq!(FrameRepr::parse_prefix(&stream[..cut]), Ok(None), "cut {cut}");
        }
        let (r, n) = FrameRepr::parse_prefix(&stream).unwrap().unwrap();
        assert_eq!(n, 24);
        assert_eq!(r.kind, FrameKind::Request);
        assert_eq!(FrameRepr::parse_prefix(b"GET / HTTP/1.1\r\nHost"), Err(FrameError::BadKey));
    }
}
