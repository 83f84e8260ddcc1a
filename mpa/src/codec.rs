//! The FPDU framer (ULPDU -> FPDU) and the incremental deframer (byte stream -> ULPDUs).
//!
//! Both keep the stream position of their direction, counted from the first octet after the
//! Request or Reply frame, which is where markers are anchored (see [`crate::fpdu`]).

use core::fmt;

use crate::LlpErrorCode;
use crate::fpdu::{
    self, CRC_LEN, LENGTH_LEN, MARKER_INTERVAL, MARKER_LEN, MAX_ULPDU, crc_from_wire, crc_to_wire,
    marker_bytes, pad_len, wire_offset,
};

/// What went wrong while framing a ULPDU (local misuse only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramerError {
    /// The ULPDU is longer than the 16-bit length field allows.
    UlpduTooLong {
        /// Its length.
        len: usize,
    },
    /// The output buffer is shorter than the FPDU.
    BufferTooSmall {
        /// Bytes the FPDU needs on the wire.
        needed: usize,
        /// Bytes offered.
        got: usize,
    },
    /// In-place framing asked for on a stream with markers.
    MarkersInPlace,
}

impl fmt::Display for FramerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FramerError::UlpduTooLong { len } => {
                write!(f, "ULPDU of {len} bytes exceeds {MAX_ULPDU}")
            }
            FramerError::BufferTooSmall { needed, got } => {
                write!(f, "FPDU needs {needed} bytes, buffer has {got}")
            }
            FramerError::MarkersInPlace => f.write_str("in-place framing cannot insert markers"),
        }
    }
}

impl std::error::Error for FramerError {}

/// Writes content octets into an output buffer, inserting markers at their stream positions.
struct MarkedWriter<'a> {
    out: &'a mut [u8],
    off: usize,
    pos: u64,
    fpdu_start: u64,
    markers: bool,
}

impl MarkedWriter<'_> {
    /// Writes the marker due at the current position, if one is.
    fn marker_if_due(&mut self) {
        if self.markers && self.pos.is_multiple_of(MARKER_INTERVAL) {
            let m = marker_bytes(self.pos, self.fpdu_start);
            self.out[self.off..self.off + MARKER_LEN].copy_from_slice(&m);
            self.off += MARKER_LEN;
            self.pos += MARKER_LEN as u64;
        }
    }

    fn put(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            self.marker_if_due();
            let room =
                if self.markers { fpdu::to_next_marker(self.pos).min(bytes.len()) } else { bytes.len() };
            // `to_next_marker` is 0 only at a marker position, which `marker_if_due` just
            // moved past, so `room` is at least 1 here.
            let (now, rest) = bytes.split_at(room);
            self.out[self.off..self.off + now.len()].copy_from_slice(now);
            self.off += now.len();
            self.pos += now.len() as u64;
            bytes = rest;
        }
    }
}

/// Frames ULPDUs into FPDUs for one direction of a connection.
#[derive(Debug, Clone)]
pub struct Framer {
    crc: bool,
    markers: bool,
    pos: u64,
}

impl Framer {
    /// A framer at the start of its direction's stream (stream position 0).
    pub fn new(crc: bool, markers: bool) -> Framer {
        Framer::at_position(crc, markers, 0)
    }

    /// A framer whose next FPDU starts at stream position `pos` (relative to the marker base).
    pub fn at_position(crc: bool, markers: bool, pos: u64) -> Framer {
        Framer { crc, markers, pos }
    }

    /// Stream position of the next FPDU.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Whether CRC32c is computed (otherwise the CRC field is zero).
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// Whether markers are inserted.
    pub fn markers(&self) -> bool {
        self.markers
    }

    /// Length on the wire of the next FPDU if it carries `ulpdu_len` octets.
    pub fn wire_len(&self, ulpdu_len: usize) -> usize {
        fpdu::wire_len(self.pos, ulpdu_len, self.markers)
    }

    /// Frames one ULPDU into `out`, returning the FPDU's length on the wire.
    pub fn frame(&mut self, ulpdu: &[u8], out: &mut [u8]) -> Result<usize, FramerError> {
        self.frame_vectored(&[ulpdu], out)
    }

    /// Frames one ULPDU given as consecutive parts (a DDP header and its payload, say) into
    /// `out`, returning the FPDU's length on the wire. Nothing is allocated.
    pub fn frame_vectored(&mut self, parts: &[&[u8]], out: &mut [u8]) -> Result<usize, FramerError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len16 = u16::try_from(len).map_err(|_| FramerError::UlpduTooLong { len })?;
        let needed = self.wire_len(len);
        if out.len() < needed {
            return Err(FramerError::BufferTooSmall { needed, got: out.len() });
        }
        let mut w = MarkedWriter { out, off: 0, pos: self.pos, fpdu_start: self.pos, markers: self.markers };
        w.put(&len16.to_be_bytes());
        for p in parts {
            w.put(p);
        }
        w.put(&[0u8; 3][..pad_len(len)]);
        // The CRC covers every octet before the CRC field, including a marker right before it.
        w.marker_if_due();
        let crc = if self.crc { fpdu::crc_update(0, &w.out[..w.off]) } else { 0 };
        w.put(&crc_to_wire(crc));
        debug_assert_eq!(w.off, needed);
        self.pos = w.pos;
        Ok(needed)
    }

    /// Frames a ULPDU that the caller already wrote at `buf[2..2 + ulpdu_len]`, so that it is
    /// never copied: writes the length field, the pad and the CRC around it and returns the
    /// FPDU's length. Only without markers (which would have to be inserted inside the
    /// ULPDU): with markers it returns [`FramerError::MarkersInPlace`].
    pub fn frame_in_place(&mut self, buf: &mut [u8], ulpdu_len: usize) -> Result<usize, FramerError> {
        if self.markers {
            return Err(FramerError::MarkersInPlace);
        }
        let len16 = u16::try_from(ulpdu_len).map_err(|_| FramerError::UlpduTooLong { len: ulpdu_len })?;
        let needed = fpdu::fpdu_len(ulpdu_len);
        let got = buf.len();
        let fpdu = buf.get_mut(..needed).ok_or(FramerError::BufferTooSmall { needed, got })?;
        fpdu[..LENGTH_LEN].copy_from_slice(&len16.to_be_bytes());
        let crc_at = needed - CRC_LEN;
        // The pad is 0-3 bytes: a loop, not a call to `memset` (most FPDUs have none).
        for b in &mut fpdu[LENGTH_LEN + ulpdu_len..crc_at] {
            *b = 0;
        }
        let crc = if self.crc { fpdu::crc_update(0, &fpdu[..crc_at]) } else { 0 };
        fpdu[crc_at..].copy_from_slice(&crc_to_wire(crc));
        self.pos = self.pos.wrapping_add(needed as u64);
        Ok(needed)
    }

    /// Frames a ULPDU whose first octets the caller wrote at `head[2..]` and whose other
    /// octets, `rest`, stay where they are (registered memory that a vectored write sends):
    /// writes the length field at `head[..2]` and returns the pad and CRC to send after
    /// `rest`, and their length. Only without markers ([`FramerError::MarkersInPlace`]).
    pub fn frame_around<'p>(
        &mut self,
        head: &mut [u8],
        rest: impl Iterator<Item = &'p [u8]> + Clone,
    ) -> Result<([u8; 3 + CRC_LEN], usize), FramerError> {
        if self.markers {
            return Err(FramerError::MarkersInPlace);
        }
        let needed = LENGTH_LEN;
        let got = head.len();
        if got < needed {
            return Err(FramerError::BufferTooSmall { needed, got });
        }
        let len = got - LENGTH_LEN + rest.clone().map(<[u8]>::len).sum::<usize>();
        let len16 = u16::try_from(len).map_err(|_| FramerError::UlpduTooLong { len })?;
        head[..LENGTH_LEN].copy_from_slice(&len16.to_be_bytes());
        let pad = pad_len(len);
        let mut trailer = [0; 3 + CRC_LEN];
        if self.crc {
            let crc = rest.fold(fpdu::crc_update(0, head), fpdu::crc_update);
            let crc = fpdu::crc_update(crc, &trailer[..pad]);
            trailer[pad..pad + CRC_LEN].copy_from_slice(&crc_to_wire(crc));
        }
        self.pos = self.pos.wrapping_add(fpdu::fpdu_len(len) as u64);
        Ok((trailer, pad + CRC_LEN))
    }

    /// Frames one ULPDU into a new vector (convenient in tests and tools; the data path uses
    /// [`Framer::frame`] with its own buffers).
    pub fn frame_to_vec(&mut self, ulpdu: &[u8]) -> Result<Vec<u8>, FramerError> {
        let mut v = vec![0; self.wire_len(ulpdu.len())];
        let n = self.frame(ulpdu, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

/// A stream that cannot be deframed any further: the connection must be terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeframeError {
    /// ULPDU_Length above the receive limit.
    UlpduTooLong {
        /// The length field.
        len: usize,
        /// The receive limit.
        limit: usize,
    },
    /// The CRC field does not match the FPDU.
    Crc {
        /// CRC32c computed over the FPDU.
        computed: u32,
        /// CRC32c carried in the CRC field.
        received: u32,
        /// The FPDU's length on the wire (to skip it when only analysing a stream).
        wire_len: usize,
    },
    /// A marker is not where it should be or points elsewhere than the FPDU start.
    Marker {
        /// Stream position of the marker.
        position: u64,
        /// Its FPDU pointer.
        pointer: u16,
        /// The pointer expected.
        expected: u16,
        /// Its reserved half (must be zero).
        reserved: u16,
        /// The FPDU's length on the wire.
        wire_len: usize,
    },
}

impl DeframeError {
    /// The LLP error code the Terminate for this error carries.
    pub fn llp_code(&self) -> LlpErrorCode {
        match self {
            DeframeError::Crc { .. } => LlpErrorCode::Crc,
            // Without a trustworthy length the next FPDU start cannot be found.
            DeframeError::UlpduTooLong { .. } | DeframeError::Marker { .. } => {
                LlpErrorCode::MarkerOrFpduStart
            }
        }
    }

    /// The FPDU's wire length when it is known, so that an analyser can step over it.
    pub fn wire_len(&self) -> Option<usize> {
        match self {
            DeframeError::Crc { wire_len, .. } | DeframeError::Marker { wire_len, .. } => Some(*wire_len),
            DeframeError::UlpduTooLong { .. } => None,
        }
    }
}

impl fmt::Display for DeframeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeframeError::UlpduTooLong { len, limit } => {
                write!(f, "ULPDU length {len} exceeds the receive limit {limit}")
            }
            DeframeError::Crc { computed, received, .. } => {
                write!(f, "bad CRC32c: computed 0x{computed:08x}, received 0x{received:08x}")
            }
            DeframeError::Marker { position, pointer, expected, reserved, .. } => write!(
                f,
                "bad marker at stream position {position}: pointer {pointer} (expected {expected}), reserved 0x{reserved:04x}"
            ),
        }
    }
}

impl std::error::Error for DeframeError {}

/// What the CRC field of a received FPDU said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrcCheck {
    /// CRC negotiated and the field matches.
    Good(u32),
    /// CRC not negotiated; the field (normally zero) was not checked.
    NotChecked(u32),
    /// CRC negotiated, the field did not match, and the deframer was built to report rather
    /// than fail ([`Deframer::lenient`], for analysers).
    Bad {
        /// Computed value.
        computed: u32,
        /// Received value.
        received: u32,
    },
}

/// One deframed FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<'a> {
    /// The ULPDU (a DDP segment), markers removed.
    pub ulpdu: &'a [u8],
    /// Bytes of input the FPDU occupied (markers included): drop them before the next call.
    pub wire_len: usize,
    /// Stream position of the FPDU's first octet.
    pub position: u64,
    /// Pad octets.
    pub pad: usize,
    /// The CRC verdict.
    pub crc: CrcCheck,
    /// Markers inside the FPDU.
    pub markers: usize,
    /// Whether `ulpdu` borrows the input (true) or the deframer's scratch buffer (markers
    /// inside the ULPDU had to be cut out).
    pub borrowed: bool,
}

/// The result of one deframing step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deframed<'a> {
    /// A whole FPDU.
    Fpdu(Fpdu<'a>),
    /// The input holds only part of the next FPDU: at least this many bytes in all are needed.
    NeedMore(usize),
}

/// Deframes one direction of a connection from the bytes the caller buffers.
///
/// Call [`Deframer::deframe`] with the bytes received and not yet consumed (starting at an
/// FPDU boundary); it returns either one FPDU, which occupies its first `wire_len` bytes, or
/// how many bytes it needs. Asking costs O(1) until the FPDU is complete, so the caller may
/// call it after every chunk, however small.
#[derive(Debug, Clone)]
pub struct Deframer {
    crc: bool,
    markers: bool,
    pos: u64,
    max_ulpdu: usize,
    lenient: bool,
    scratch: Vec<u8>,
}

impl Deframer {
    /// A deframer at the start of its direction's stream, accepting ULPDUs up to 65535.
    pub fn new(crc: bool, markers: bool) -> Deframer {
        Deframer { crc, markers, pos: 0, max_ulpdu: MAX_ULPDU, lenient: false, scratch: Vec::new() }
    }

    /// Bytes allocated for ULPDUs that markers split (the largest such ULPDU seen so far):
    /// the deframer's only buffer.
    pub fn scratch_capacity(&self) -> usize {
        self.scratch.capacity()
    }

    /// Sets the stream position of the next FPDU.
    pub fn with_position(mut self, pos: u64) -> Deframer {
        self.pos = pos;
        self
    }

    /// Sets the largest ULPDU accepted (at most 65535).
    pub fn with_max_ulpdu(mut self, max: usize) -> Deframer {
        self.max_ulpdu = max.min(MAX_ULPDU);
        self
    }

    /// Reports bad CRCs as [`CrcCheck::Bad`] instead of failing (for analysers, never for a
    /// live connection).
    pub fn lenient(mut self) -> Deframer {
        self.lenient = true;
        self
    }

    /// Stream position of the next FPDU.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Steps over `n` bytes of stream (an analyser skipping a bad FPDU).
    pub fn skip(&mut self, n: usize) {
        self.pos = self.pos.wrapping_add(n as u64);
    }

    /// Content octet `index` of the FPDU at the start of `buf` (a stream with markers), if
    /// `buf` holds it.
    fn content_byte(&self, buf: &[u8], index: usize) -> Option<u8> {
        buf.get(wire_offset(self.pos, index)).copied()
    }

    /// Deframes the FPDU at the start of `buf`.
    pub fn deframe<'a>(&'a mut self, buf: &'a [u8]) -> Result<Deframed<'a>, DeframeError> {
        if !self.markers {
            return self.deframe_plain(buf);
        }
        // With markers: each of the FPDU's octets is found through the marker arithmetic.
        let (Some(hi), Some(lo)) = (self.content_byte(buf, 0), self.content_byte(buf, 1)) else {
            return Ok(Deframed::NeedMore(wire_offset(self.pos, 1) + 1));
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len > self.max_ulpdu {
            return Err(DeframeError::UlpduTooLong { len, limit: self.max_ulpdu });
        }
        let pad = pad_len(len);
        let content = fpdu::fpdu_len(len);
        let wire_len = fpdu::wire_len(self.pos, len, true);
        if buf.len() < wire_len {
            return Ok(Deframed::NeedMore(wire_len));
        }
        let fpdu = &buf[..wire_len];
        let crc_index = content - CRC_LEN;
        let nmarkers = fpdu::markers_in(self.pos, content);
        if nmarkers > 0 {
            self.check_markers(fpdu)?;
        }
        let crc_off = wire_offset(self.pos, crc_index);
        let received = self.read_crc(fpdu, crc_index);
        let crc = self.check_crc(&fpdu[..crc_off], received, wire_len)?;
        let start = self.pos;
        self.pos = self.pos.wrapping_add(wire_len as u64);
        let ulpdu_start = wire_offset(start, LENGTH_LEN);
        let ulpdu_end_wire =
            if len == 0 { ulpdu_start } else { wire_offset(start, LENGTH_LEN + len - 1) + 1 };
        let contiguous = ulpdu_end_wire - ulpdu_start == len;
        let ulpdu: &[u8] = if contiguous {
            &fpdu[ulpdu_start..ulpdu_end_wire]
        } else {
            self.scratch.clear();
            let mut off = ulpdu_start;
            let mut p = start + ulpdu_start as u64;
            while self.scratch.len() < len {
                if p.is_multiple_of(MARKER_INTERVAL) {
                    off += MARKER_LEN;
                    p += MARKER_LEN as u64;
                }
                let take = fpdu::to_next_marker(p).min(len - self.scratch.len());
                self.scratch.extend_from_slice(&fpdu[off..off + take]);
                off += take;
                p += take as u64;
            }
            &self.scratch
        };
        Ok(Deframed::Fpdu(Fpdu {
            ulpdu,
            wire_len,
            position: start,
            pad,
            crc,
            markers: nmarkers,
            borrowed: contiguous,
        }))
    }

    /// [`Deframer::deframe`] for a stream without markers, where the FPDU's octets lie
    /// together: the length, the ULPDU, the pad and the CRC read straight from the buffer
    /// (the general path finds each octet through the marker arithmetic, a tenth of a small
    /// message's receive cost).
    fn deframe_plain<'a>(&mut self, buf: &'a [u8]) -> Result<Deframed<'a>, DeframeError> {
        let Some(&[hi, lo]) = buf.first_chunk::<LENGTH_LEN>() else {
            return Ok(Deframed::NeedMore(LENGTH_LEN));
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len > self.max_ulpdu {
            return Err(DeframeError::UlpduTooLong { len, limit: self.max_ulpdu });
        }
        let wire_len = fpdu::fpdu_len(len);
        let Some(fpdu) = buf.get(..wire_len) else { return Ok(Deframed::NeedMore(wire_len)) };
        let (covered, crc_field) = fpdu.split_at(wire_len - CRC_LEN);
        let received = crc_from_wire(crc_field.try_into().unwrap_or_default());
        let crc = self.check_crc(covered, received, wire_len)?;
        let position = self.pos;
        self.pos = self.pos.wrapping_add(wire_len as u64);
        Ok(Deframed::Fpdu(Fpdu {
            ulpdu: &fpdu[LENGTH_LEN..LENGTH_LEN + len],
            wire_len,
            position,
            pad: pad_len(len),
            crc,
            markers: 0,
            borrowed: true,
        }))
    }

    /// Checks the CRC `received` of an FPDU of `wire_len` octets whose covered octets (markers
    /// included) are `covered`, as the deframer's settings say.
    fn check_crc(&self, covered: &[u8], received: u32, wire_len: usize) -> Result<CrcCheck, DeframeError> {
        if !self.crc {
            return Ok(CrcCheck::NotChecked(received));
        }
        let computed = fpdu::crc_update(0, covered);
        // Under fuzzing the check is bypassed so that inputs reach the layers above (smoltcp
        // does the same with its checksums); the fuzz targets say so.
        if computed == received || cfg!(fuzzing) {
            Ok(CrcCheck::Good(received))
        } else if self.lenient {
            Ok(CrcCheck::Bad { computed, received })
        } else {
            Err(DeframeError::Crc { computed, received, wire_len })
        }
    }

    /// The CRC field's value (its four content octets, wherever markers put them).
    fn read_crc(&self, fpdu: &[u8], crc_index: usize) -> u32 {
        let mut b = [0u8; 4];
        for (i, out) in b.iter_mut().enumerate() {
            *out = self.content_byte(fpdu, crc_index + i).unwrap_or(0);
        }
        crc_from_wire(b)
    }

    fn check_markers(&self, fpdu: &[u8]) -> Result<(), DeframeError> {
        for p in fpdu::marker_positions(self.pos, fpdu.len()) {
            let off = usize::try_from(p - self.pos).unwrap_or(usize::MAX);
            let Some(m) = fpdu.get(off..off + MARKER_LEN) else { break };
            let reserved = u16::from_be_bytes([m[0], m[1]]);
            let pointer = u16::from_be_bytes([m[2], m[3]]);
            let expected = u16::try_from(off).unwrap_or(u16::MAX);
            if reserved != 0 || pointer != expected {
                return Err(DeframeError::Marker {
                    position: p,
                    pointer,
                    expected,
                    reserved,
                    wire_len: fpdu.len(),
                });
            }
        }
        Ok(())
    }
}

/// A deframer that owns its receive buffer: push chunks in, take FPDUs out.
#[derive(Debug, Clone)]
pub struct StreamDeframer {
    deframer: Deframer,
    buf: Vec<u8>,
    start: usize,
    consumed: usize,
}

impl StreamDeframer {
    /// Wraps a deframer.
    pub fn new(deframer: Deframer) -> StreamDeframer {
        StreamDeframer { deframer, buf: Vec::new(), start: 0, consumed: 0 }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.drop_consumed();
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes buffered and not yet deframed.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start - self.consumed
    }

    fn drop_consumed(&mut self) {
        self.start += self.consumed;
        self.consumed = 0;
        // Compact once the dead prefix dominates, so memory stays bounded by one FPDU.
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
    }

    /// The next whole FPDU, `Ok(None)` when more bytes are needed.
    pub fn next_fpdu(&mut self) -> Result<Option<Fpdu<'_>>, DeframeError> {
        self.drop_consumed();
        match self.deframer.deframe(&self.buf[self.start..])? {
            Deframed::Fpdu(f) => {
                self.consumed = f.wire_len;
                Ok(Some(f))
            }
            Deframed::NeedMore(_) => Ok(None),
        }
    }
}

/// The chunk lengths [`fuzz_deframe`] cuts a stream into: 1 to 128 octets, a sequence fixed
/// by `seed` (xorshift), so that the cuts fall at every position relative to the FPDUs
/// without feeding most inputs one octet at a time (which made the fuzz target slow).
fn fuzz_chunks(seed: u8, stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut x = u32::from(seed) | 0x100;
    let mut rest = stream;
    core::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let len = usize::from(x.to_le_bytes()[0] & 0x7f) + 1;
        let (now, later) = rest.split_at(len.min(rest.len()));
        rest = later;
        Some(now)
    })
}

/// Fuzz entry point (fuzz/fuzz_targets/mpa_deframe.rs): deframes `stream` whole and in
/// chunks, with CRC, markers, the start position and the chunk lengths chosen by `sel`, and
/// checks that both give the same ULPDUs and that every ULPDU respects the limits. Panics
/// only on a bug.
#[doc(hidden)]
pub fn fuzz_deframe(sel: u8, stream: &[u8]) {
    let crc = sel & 1 != 0;
    let markers = sel & 2 != 0;
    let start = u64::from(sel >> 2) * 4 * 9;
    let limit = if sel & 0x80 != 0 { 1500 } else { MAX_ULPDU };
    let mut whole = Vec::new();
    let mut d = Deframer::new(crc, markers).with_position(start).with_max_ulpdu(limit);
    let mut rest = stream;
    let whole_end = loop {
        match d.deframe(rest) {
            Ok(Deframed::Fpdu(f)) => {
                assert!(f.ulpdu.len() <= limit && f.wire_len <= rest.len());
                whole.push(f.ulpdu.to_vec());
                rest = &rest[f.wire_len..];
            }
            Ok(Deframed::NeedMore(n)) => {
                assert!(n > rest.len());
                break None;
            }
            Err(e) => break Some(e),
        }
    };
    let mut s = StreamDeframer::new(Deframer::new(crc, markers).with_position(start).with_max_ulpdu(limit));
    let mut chunked = Vec::new();
    let mut chunked_end = None;
    'outer: for c in fuzz_chunks(sel, stream) {
        s.push(c);
        loop {
            match s.next_fpdu() {
                Ok(Some(f)) => chunked.push(f.ulpdu.to_vec()),
                Ok(None) => break,
                Err(e) => {
                    chunked_end = Some(e);
                    break 'outer;
                }
            }
        }
    }
    assert_eq!(whole, chunked);
    assert_eq!(whole_end, chunked_end);
}

#[cfg(test)]
#[expect(clippy::cast_possible_truncation, reason = "test data patterns wrap on purpose")]
mod tests {
    use super::*;

    fn deframe_all(d: &mut Deframer, mut stream: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !stream.is_empty() {
            match d.deframe(stream).unwrap() {
                Deframed::Fpdu(f) => {
                    out.push(f.ulpdu.to_vec());
                    let n = f.wire_len;
                    stream = &stream[n..];
                }
                Deframed::NeedMore(n) => panic!("need {n} with {} left", stream.len()),
            }
        }
        out
    }

    #[test]
    fn fixture_no_crc() {
        let mut f = Framer::new(false, false);
        let v = f.frame_to_vec(&[0xaa, 0xbb, 0xcc]).unwrap();
        assert_eq!(v, [0x00, 0x03, 0xaa, 0xbb, 0xcc, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]);
        assert_eq!(f.position(), 12);
    }

    #[test]
    fn fixture_crc() {
        let mut f = Framer::new(true, false);
        let v = f.frame_to_vec(b"ab").unwrap();
        let crc = crc32c::crc32c(&[0x00, 0x02, b'a', b'b']);
        let mut expect = vec![0x00, 0x02, b'a', b'b'];
        expect.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(v, expect);
        let mut d = Deframer::new(true, false);
        match d.deframe(&v).unwrap() {
            Deframed::Fpdu(p) => {
                assert_eq!(p.ulpdu, b"ab");
                assert_eq!(p.crc, CrcCheck::Good(crc));
                assert!(p.borrowed);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_crc_is_an_error() {
        let mut v = Framer::new(true, false).frame_to_vec(b"hello").unwrap();
        v[3] ^= 1;
        let err = Deframer::new(true, false).deframe(&v).unwrap_err();
        assert!(matches!(err, DeframeError::Crc { wire_len: 12, .. }));
        assert_eq!(err.llp_code(), LlpErrorCode::Crc);
        let mut lenient = Deframer::new(true, false).lenient();
        assert!(matches!(lenient.deframe(&v), Ok(Deframed::Fpdu(Fpdu { crc: CrcCheck::Bad { .. }, .. }))));
    }

    #[test]
    fn need_more_then_whole() {
        let v = Framer::new(true, false).frame_to_vec(&[7u8; 100]).unwrap();
        let mut d = Deframer::new(true, false);
        assert_eq!(d.deframe(&v[..1]).unwrap(), Deframed::NeedMore(2));
        for cut in 2..v.len() {
            assert_eq!(d.deframe(&v[..cut]).unwrap(), Deframed::NeedMore(v.len()), "cut {cut}");
        }
        assert!(matches!(d.deframe(&v).unwrap(), Deframed::Fpdu(_)));
    }

    #[test]
    fn ulpdu_limit() {
        let v = Framer::new(false, false).frame_to_vec(&[0u8; 300]).unwrap();
        let mut d = Deframer::new(false, false).with_max_ulpdu(299);
        let e = d.deframe(&v).unwrap_err();
        assert_eq!(e, DeframeError::UlpduTooLong { len: 300, limit: 299 });
        assert_eq!(e.llp_code(), LlpErrorCode::MarkerOrFpduStart);
        // The length alone decides: two bytes are enough to refuse.
        assert!(Deframer::new(false, false).with_max_ulpdu(10).deframe(&[0x01, 0x00]).is_err());
        let big = Framer::new(true, false).frame_to_vec(&vec![1u8; MAX_ULPDU]).unwrap();
        assert_eq!(deframe_all(&mut Deframer::new(true, false), &big)[0].len(), MAX_ULPDU);
        assert_eq!(
            Framer::new(false, false).frame_to_vec(&vec![0; MAX_ULPDU + 1]),
            Err(FramerError::UlpduTooLong { len: MAX_ULPDU + 1 })
        );
    }

    #[test]
    fn in_place_equals_copying() {
        for crc in [false, true] {
            for len in [0usize, 1, 2, 3, 4, 1442, 65535] {
                let ulpdu: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
                let mut a = Framer::new(crc, false);
                let expect = a.frame_to_vec(&ulpdu).unwrap();
                let mut b = Framer::new(crc, false);
                let mut buf = vec![0xee; len + 16];
                buf[2..2 + len].copy_from_slice(&ulpdu);
                let n = b.frame_in_place(&mut buf, len).unwrap();
                assert_eq!(&buf[..n], &expect[..], "crc {crc} len {len}");
                assert_eq!(a.position(), b.position());
            }
        }
        let mut m = Framer::new(false, true);
        assert_eq!(m.frame_in_place(&mut [0u8; 64], 4), Err(FramerError::MarkersInPlace));
        let mut f = Framer::new(false, false);
        assert_eq!(
            f.frame_in_place(&mut [0u8; 8], 4),
            Err(FramerError::BufferTooSmall { needed: 12, got: 8 })
        );
    }

    /// Framing around bytes left elsewhere (a head in the buffer, the rest in pieces) puts the
    /// same octets on the wire as framing the whole ULPDU.
    #[test]
    fn around_equals_copying() {
        for crc in [false, true] {
            for (len, head) in [(14usize, 14usize), (15, 14), (1442, 18), (65535, 14), (3000, 2999)] {
                let ulpdu: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let mut a = Framer::new(crc, false);
                let expect = a.frame_to_vec(&ulpdu).unwrap();
                let mut b = Framer::new(crc, false);
                let mut buf = vec![0; 2 + head];
                buf[2..].copy_from_slice(&ulpdu[..head]);
                let pieces = ulpdu[head..].chunks(1000);
                let (trailer, n) = b.frame_around(&mut buf, pieces.clone()).unwrap();
                let mut got = buf.clone();
                pieces.for_each(|p| got.extend_from_slice(p));
                got.extend_from_slice(&trailer[..n]);
                assert_eq!(got, expect, "crc {crc} len {len}");
                assert_eq!(a.position(), b.position());
            }
        }
        let mut m = Framer::new(false, true);
        assert_eq!(m.frame_around(&mut [0u8; 16], std::iter::empty()), Err(FramerError::MarkersInPlace));
    }

    #[test]
    fn buffer_too_small() {
        let mut f = Framer::new(false, false);
        let mut out = [0u8; 11];
        assert_eq!(f.frame(b"abc", &mut out), Err(FramerError::BufferTooSmall { needed: 12, got: 11 }));
        assert_eq!(f.position(), 0);
    }

    #[test]
    fn vectored_equals_contiguous() {
        let mut a = Framer::new(true, true);
        let mut b = Framer::new(true, true);
        let data: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
        let mut out_a = vec![0; 2000];
        let mut out_b = vec![0; 2000];
        let na = a.frame(&data, &mut out_a).unwrap();
        let nb = b.frame_vectored(&[&data[..14], &data[14..700], &data[700..]], &mut out_b).unwrap();
        assert_eq!(out_a[..na], out_b[..nb]);
    }

    /// The first FPDU after the handshake starts with a marker whose pointer is 0.
    #[test]
    fn marker_at_fpdu_start() {
        let mut f = Framer::new(false, true);
        let v = f.frame_to_vec(b"xy").unwrap();
        assert_eq!(v, [0, 0, 0, 0, 0x00, 0x02, b'x', b'y', 0, 0, 0, 0]);
        let mut d = Deframer::new(false, true);
        assert_eq!(deframe_all(&mut d, &v), vec![b"xy".to_vec()]);
    }

    /// Markers in the middle of the length field, the ULPDU, the pad and the CRC: possible
    /// when the stream is not 4-aligned to the marker grid, so framers are started at odd
    /// positions to put a marker at each spot.
    #[test]
    fn markers_everywhere() {
        let payload: Vec<u8> = (0..48u8).collect();
        // 2 + 41 = 43, pad 1: content = len(2) ulpdu(41) pad(1) crc(4) = 48.
        let ulpdu = &payload[..41];
        for (what, content_index) in
            [("length", 1usize), ("ulpdu", 20), ("pad", 43), ("crc", 45), ("before crc", 44)]
        {
            let start = 512 - content_index as u64;
            for crc in [false, true] {
                let mut f = Framer::at_position(crc, true, start);
                let v = f.frame_to_vec(ulpdu).unwrap();
                assert_eq!(v.len(), 48 + 4, "{what}");
                // The marker sits at the 512 boundary and points back to the FPDU start.
                assert_eq!(&v[content_index..content_index + 4], &[0, 0, 0, content_index as u8], "{what}");
                let mut d = Deframer::new(crc, true).with_position(start);
                match d.deframe(&v).unwrap() {
                    Deframed::Fpdu(p) => {
                        assert_eq!(p.ulpdu, ulpdu, "{what}");
                        assert_eq!(p.markers, 1);
                        assert_eq!(p.borrowed, what != "ulpdu", "{what}");
                        if crc {
                            assert!(matches!(p.crc, CrcCheck::Good(_)));
                        }
                    }
                    other => panic!("{what}: {other:?}"),
                }
                // A corrupted pointer is a marker error.
                let mut bad = v.clone();
                bad[content_index + 3] ^= 4;
                let e = Deframer::new(crc, true).with_position(start).deframe(&bad).unwrap_err();
                assert!(matches!(e, DeframeError::Marker { position: 512, .. }), "{what}: {e:?}");
                assert_eq!(e.llp_code(), LlpErrorCode::MarkerOrFpduStart);
            }
        }
    }

    #[test]
    fn marker_reserved_must_be_zero() {
        let mut v = Framer::new(false, true).frame_to_vec(b"abcd").unwrap();
        v[0] = 1;
        assert!(matches!(
            Deframer::new(false, true).deframe(&v),
            Err(DeframeError::Marker { reserved: 0x0100, .. })
        ));
    }

    #[test]
    fn long_ulpdu_many_markers() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let mut f = Framer::new(true, true);
        let mut stream = Vec::new();
        for chunk in [&data[..], &data[..1], &data[..508], &data[..3000]] {
            stream.extend(f.frame_to_vec(chunk).unwrap());
        }
        let mut d = Deframer::new(true, true);
        let got = deframe_all(&mut d, &stream);
        assert_eq!(got, vec![data.clone(), data[..1].to_vec(), data[..508].to_vec(), data[..3000].to_vec()]);
        assert_eq!(d.position(), f.position());
        // Every 512th octet of the stream holds a marker.
        for p in (0..stream.len()).step_by(512) {
            assert_eq!(&stream[p..p + 2], &[0, 0]);
        }
    }

    #[test]
    fn stream_deframer_one_byte_chunks() {
        let mut f = Framer::new(true, true);
        let msgs: Vec<Vec<u8>> = (0..20).map(|i| vec![i as u8; i * 37]).collect();
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend(f.frame_to_vec(m).unwrap());
        }
        let mut s = StreamDeframer::new(Deframer::new(true, true));
        let mut got = Vec::new();
        for b in &wire {
            s.push(std::slice::from_ref(b));
            while let Some(p) = s.next_fpdu().unwrap() {
                got.push(p.ulpdu.to_vec());
            }
        }
        assert_eq!(got, msgs);
        assert_eq!(s.buffered(), 0);
    }
}
