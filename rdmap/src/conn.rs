//! A queue pair over MPA: the byte-stream side of one iWARP connection after its handshake.
//!
//! [`Connection::handle_bytes`] takes what TCP delivered (any chunking), deframes FPDUs and
//! hands their ULPDUs to the queue pair; [`Connection::poll_transmit`] frames the queue pair's
//! segments into bytes for TCP. An MPA error (CRC, marker, length) terminates the stream with
//! the LLP code for it.
//!
//! Who speaks first (RFC 5044 section 7.1.2, RFC 6581): the responder sends nothing until the
//! initiator's first FPDU has arrived (a responder that sends first breaks siw, see
//! tests/data/siw/siw-ucmatose.pcap); with peer-to-peer agreed, the initiator's first FPDU is
//! the RTR message of the agreed type.

use std::io::IoSliceMut;

use iwarp_ddp::dma::PAGE_SIZE;
use iwarp_ddp::header::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN, control};
use iwarp_ddp::{AccessError, TerminateCode, TerminateLayer};
use iwarp_mpa::fpdu::{CRC_LEN, LENGTH_LEN, crc_from_wire, crc_update, pad_len};
use iwarp_mpa::{ConnParams, DeframeError, Deframed, Deframer, Framer, Role};

use crate::memory::TableMemory;
use crate::qp::{DirectSink, QpConfig, QueuePair, TxPiece};

/// The least payload for which an FPDU's payload is read straight into place
/// (see [`Connection::receive`]) unless [`Connection::set_direct_min`] says otherwise. Over
/// kernel TCP on loopback a read into place saves a copy of the payload and costs a system
/// call per FPDU; the receiving thread's CPU time per byte breaks even between 16 and 32 KiB
/// of payload (`cargo bench -p iwarp-rdmap --bench receive`).
pub const DIRECT_MIN: usize = 24 * 1024;

/// The most bytes from an FPDU's start to the end of its DDP header (an untagged header; a
/// tagged one is 4 bytes shorter, and those 4 payload bytes then come through the buffer).
const HEAD_MAX: usize = LENGTH_LEN + UNTAGGED_HEADER_LEN;

/// How far past the end of the next header a read that stops there (after large FPDUs)
/// asks. A large message's last FPDU is usually short (a 64 KiB Write's second FPDU is about
/// 100 bytes on the wire), and with it in the read that ends the payload before it, a message
/// alone on its connection takes one read per FPDU read into place plus the header's, not one
/// more for its short tail (kernel TCP on loopback, 1,000 queue pairs with a 64 KiB Write each
/// in flight: about 4 `readv` per message before, see docs/architecture.md). What it costs:
/// up to this many bytes of a following large payload come through the receive buffer (copied
/// into place instead of read there). It is an eighth of the least payload read into place
/// where that is less ([`Connection::set_direct_min`]: 64 bytes over smoltcp, whose reads are
/// copies, not system calls), so no payload read into place comes more than an eighth through
/// the buffer.
pub const LOOKAHEAD: usize = 512;

/// For how many small FPDUs after a large one (one read into place, or large enough to be)
/// buffered reads still stop at the end of the next FPDU's header (and [`LOOKAHEAD`] bytes
/// past it): a large message's last segment is usually short, and a read past it would take
/// the next message's first FPDUs into the receive buffer. After that many small FPDUs in a
/// row, reads take whatever is there again (many small FPDUs per read).
const LARGE_LINGER: u8 = 8;

/// An FPDU whose payload goes straight from the link into the place its segment names; its
/// pad and CRC follow.
#[derive(Debug)]
struct DirectRx {
    /// The MPA length field and the segment's header, as received.
    head: [u8; LENGTH_LEN + UNTAGGED_HEADER_LEN],
    head_len: usize,
    sink: DirectSink,
    payload_len: usize,
    /// Payload bytes received so far (placed, or dropped after `refused`).
    done: usize,
    /// The error the place gave part-way: the rest of the payload is dropped, and the
    /// segment fails with it once its CRC is in.
    refused: Option<AccessError>,
    /// Pad and CRC bytes: how many, and those received.
    trailer: [u8; 3 + CRC_LEN],
    trailer_len: usize,
    trailer_have: usize,
    /// CRC32c of the FPDU's bytes so far.
    crc: u32,
}

impl DirectRx {
    fn wire_len(&self) -> usize {
        self.head_len + self.payload_len + self.trailer_len
    }
}

/// Counts of a connection's received bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxStats {
    /// Bytes received, all told.
    pub bytes: u64,
    /// Payload bytes the link read straight into place ([`Connection::receive`]): the rest
    /// went through a receive buffer first.
    pub in_place: u64,
}

/// Whether FPDUs like one of `ulpdu_len` bytes are worth reading into place (the next read
/// then asks for just the next header), on a stream with or without markers and the least
/// payload read into place.
fn large(markers: bool, direct_min: Option<usize>, ulpdu_len: usize) -> bool {
    !markers && direct_min.is_some_and(|min| ulpdu_len >= min + TAGGED_HEADER_LEN)
}

/// The large-FPDU countdown ([`LARGE_LINGER`]) after a whole FPDU with a ULPDU of `ulpdu_len`
/// bytes was taken from the receive buffer: a large one restarts it, a small one wears it off.
fn after_fpdu(rx_large: u8, markers: bool, direct_min: Option<usize>, ulpdu_len: usize) -> u8 {
    if large(markers, direct_min, ulpdu_len) { LARGE_LINGER } else { rx_large.saturating_sub(1) }
}

/// The least payload a transmit batch sends from registered memory rather than copying it
/// ([`Connection::poll_transmit_batch`]): below it, an extra piece in the vectored write costs
/// more than the copy.
pub const TX_BY_REF_MIN: usize = 2048;

/// Destination-minus-source distances, modulo [`PAGE_SIZE`], at which a large forward copy
/// runs many times slower on some CPUs: each store is taken for one that the loads just behind
/// it may depend on (their addresses agree in the low 12 bits), and `rep movsb`, which the
/// kernel's copy from user memory and glibc's `memcpy` use for large copies, waits on every
/// one. On the project's VM (AMD EPYC) a 64 KiB `rep movsb` took 22-36 us at distances 1 to 31 bytes and
/// 1.5-2.3 us at every other distance measured (0, 32-64, 80, 96, 128 ... 4092).
pub const SLOW_COPY_DISTANCES: std::ops::RangeInclusive<usize> = 1..=31;

/// Whether copying from `src` to `dst` (addresses, or offsets that agree with them modulo
/// [`PAGE_SIZE`]) falls at one of the [`SLOW_COPY_DISTANCES`].
pub fn slow_copy(dst: usize, src: usize) -> bool {
    SLOW_COPY_DISTANCES.contains(&(dst.wrapping_sub(src) % PAGE_SIZE))
}

/// Counts of a connection's transmitted bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Bytes framed for the link through [`Connection::poll_transmit_batch`].
    pub bytes: u64,
    /// Of those, payload bytes left in registered memory for the vectored write (the rest
    /// were copied into the batch).
    pub by_ref: u64,
    /// Of the copied ones, payload bytes large enough to be left in registered memory that
    /// were copied because the kernel's copy of them would have run at a slow distance
    /// ([`TxBatch`]).
    pub moved: u64,
}

/// One part of a [`TxBatch`], in wire order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxPart {
    /// Bytes of the batch's own buffer: length fields, headers, copied payloads, pads, CRCs.
    Meta(std::ops::Range<usize>),
    /// Payload bytes in registered memory.
    Memory(TxPiece),
}

/// FPDUs framed for one vectored write ([`Connection::poll_transmit_batch`]).
///
/// A payload of at least [`TX_BY_REF_MIN`] bytes goes out from registered memory, where the
/// kernel copies it into its socket buffer, unless that copy would run at one of the
/// [`SLOW_COPY_DISTANCES`]. The kernel copies a write into a page fragment of the writing
/// thread's, from where the last write left it; when nothing the thread wrote is in flight any
/// more, that fragment is free again and the write starts at its first byte. That is likely
/// when the connection's last batch sent all there was and the peer has answered since (a
/// ping-pong's every message, a lone Read's response), and then a payload's destination is
/// taken to agree with its offset in the batch, modulo the page: a 64 KiB Write from
/// page-aligned memory, whose payload starts 16 bytes into the write (after the length field
/// and the tagged header), was copied at distance 16, and the kernel's copy of its first FPDU
/// took most of the round trip of a 64 KiB Write ping-pong. Such a payload is copied into the
/// batch instead, at a place half a page from its source, so that neither this copy nor the
/// kernel's from there is slow. In a stream (one way, or Read Responses queued behind each
/// other) the fragment's offset is anyone's guess, and nothing is moved.
#[derive(Debug, Default)]
pub struct TxBatch {
    /// The batch's own bytes are `meta[..meta_len]`; the bytes after them are room kept from
    /// earlier batches (stale, never sent), so that framing an FPDU into the buffer does not
    /// zero-fill a MULPDU of room each time.
    meta: Vec<u8>,
    meta_len: usize,
    parts: Vec<TxPart>,
    pieces: Vec<TxPiece>,
    len: usize,
}

impl TxBatch {
    /// The most parts a batch holds (a vectored write takes at most 1024 buffers).
    pub const MAX_PARTS: usize = 512;

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.meta_len = 0;
        self.parts.clear();
        self.pieces.clear();
        self.len = 0;
    }

    /// Bytes in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room for `len` bytes of the batch's own at `at`, where they end now:
    /// the buffer grows (zero-filled) only past the longest batch so far.
    fn meta_room(meta: &mut Vec<u8>, at: usize, len: usize) -> &mut [u8] {
        if meta.len() < at + len {
            meta.resize(at + len, 0);
        }
        &mut meta[at..at + len]
    }

    /// The parts, in wire order.
    pub fn parts(&self) -> &[TxPart] {
        &self.parts
    }

    /// Appends `bytes` (a payload from registered memory) as a part of the batch's own, copied
    /// to the place in the buffer half a page (modulo [`PAGE_SIZE`]) from where they are, which
    /// is at most a page past the end of the batch's bytes: the gap is never sent.
    fn push_moved(&mut self, bytes: &[u8]) {
        let end = self.meta_len;
        // Room first: growing the buffer may move it.
        Self::meta_room(&mut self.meta, end, PAGE_SIZE + bytes.len());
        let want = (bytes.as_ptr() as usize).wrapping_add(PAGE_SIZE / 2) % PAGE_SIZE;
        let at = end + want.wrapping_sub((self.meta.as_ptr() as usize).wrapping_add(end)) % PAGE_SIZE;
        self.meta[at..at + bytes.len()].copy_from_slice(bytes);
        self.meta_len = at + bytes.len();
        self.push_meta(at);
    }

    /// Ends a meta part at the end of the buffer that started at `at`, merged with the part
    /// before it when that is meta too.
    fn push_meta(&mut self, at: usize) {
        let end = self.meta_len;
        self.len += end - at;
        if let Some(TxPart::Meta(r)) = self.parts.last_mut()
            && r.end == at
        {
            r.end = end;
            return;
        }
        if end > at {
            self.parts.push(TxPart::Meta(at..end));
        }
    }

    /// The batch's bytes as buffers for a vectored write, appended to `out`; registered memory
    /// is read through `mem`, the table the batch was framed from, still held. A part that no
    /// longer resolves (which holding the table rules out) yields an error.
    pub fn io_slices<'a>(
        &'a self,
        mem: &'a TableMemory<'_>,
        out: &mut Vec<std::io::IoSlice<'a>>,
    ) -> Result<(), AccessError> {
        for p in &self.parts {
            let bytes = match p {
                TxPart::Meta(r) => &self.meta[r.clone()],
                TxPart::Memory(m) => mem.source(m.stag, m.to, m.len, m.needed)?,
            };
            out.push(std::io::IoSlice::new(bytes));
        }
        Ok(())
    }

    /// Appends to `out` the batch's bytes after the first `sent` (what a link did not take),
    /// copied, so that they can go out after the table is let go; returns how many.
    pub fn unsent(
        &self,
        mem: &TableMemory<'_>,
        sent: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, AccessError> {
        let mut skip = sent;
        let start = out.len();
        for p in &self.parts {
            let bytes = match p {
                TxPart::Meta(r) => &self.meta[r.clone()],
                TxPart::Memory(m) => mem.source(m.stag, m.to, m.len, m.needed)?,
            };
            if skip >= bytes.len() {
                skip -= bytes.len();
                continue;
            }
            out.extend_from_slice(&bytes[skip..]);
            skip = 0;
        }
        Ok(out.len() - start)
    }
}

/// What one [`Connection::receive`] step read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveStep {
    /// Bytes the link delivered.
    pub read: usize,
    /// Bytes asked for: a read that brought fewer emptied the link.
    pub asked: usize,
}

/// One connection: the queue pair, the framer for what it sends and the deframer for what it
/// receives.
#[derive(Debug)]
pub struct Connection {
    qp: QueuePair,
    framer: Framer,
    deframer: Deframer,
    /// An FPDU cut by the end of a received chunk, waiting for the rest.
    pending: Vec<u8>,
    /// Staging for a segment the framer spreads markers over (allocated only when markers
    /// are sent: without them segments are written in place).
    segment: Vec<u8>,
    /// MULPDU: the largest segment.
    mulpdu: usize,
    /// The responder waits for the initiator's first FPDU before sending.
    awaiting_peer: bool,
    /// The received stream could not be deframed: later bytes are dropped unread, so memory
    /// stays bounded while the Terminate goes out and the connection closes.
    rx_failed: bool,
    /// CRC and markers on the received stream.
    rx_crc: bool,
    rx_markers: bool,
    /// The least payload that is read straight into place; `None`: never.
    direct_min: Option<usize>,
    /// The FPDU being read straight into place.
    direct: Option<DirectRx>,
    /// Large FPDUs arrive: while non-zero, buffered reads stop at the end of the next FPDU's
    /// header and the lookahead ([`Connection::buffered_ask`]). Set to [`LARGE_LINGER`] by a
    /// large FPDU, less one for each small one.
    rx_large: u8,
    /// The least payload a transmit batch sends from registered memory; `None`: never.
    tx_by_ref_min: Option<usize>,
    rx_stats: RxStats,
    tx_stats: TxStats,
    /// `rx_stats.bytes` when the last transmit batch that framed anything was framed: bytes
    /// received since then mean the peer answered what went before (see [`TxBatch`]).
    rx_at_last_batch: u64,
    /// Whether that batch left nothing to send behind it.
    tx_drained: bool,
}

impl Connection {
    /// A connection in RTS with the negotiated MPA parameters and queue-pair settings.
    pub fn new(params: &ConnParams, config: QpConfig) -> Connection {
        Connection::with_qp(params, QueuePair::new(config))
    }

    /// A connection around a queue pair built by the caller (one attached to a shared
    /// receive queue, say).
    pub fn with_qp(params: &ConnParams, mut qp: QueuePair) -> Connection {
        let config = *qp.config();
        if params.role == Role::Initiator
            && let Some(rtr) = params.rtr
        {
            qp.queue_rtr(rtr);
        }
        Connection {
            qp,
            framer: Framer::new(params.crc, params.markers_tx),
            deframer: Deframer::new(params.crc, params.markers_rx),
            pending: Vec::new(),
            segment: if params.markers_tx { vec![0; config.mulpdu] } else { Vec::new() },
            mulpdu: config.mulpdu,
            awaiting_peer: params.must_wait_for_peer(),
            rx_failed: false,
            rx_crc: params.crc,
            rx_markers: params.markers_rx,
            direct_min: Some(DIRECT_MIN),
            direct: None,
            rx_large: 0,
            tx_by_ref_min: Some(TX_BY_REF_MIN),
            rx_stats: RxStats::default(),
            tx_stats: TxStats::default(),
            rx_at_last_batch: 0,
            tx_drained: true,
        }
    }

    /// Sets the least payload a transmit batch sends from registered memory rather than
    /// copying it ([`Connection::poll_transmit_batch`]); `None`: always copy. Default
    /// [`TX_BY_REF_MIN`].
    pub fn set_tx_by_ref_min(&mut self, min: Option<usize>) {
        self.tx_by_ref_min = min;
    }

    /// Counts of the bytes received so far.
    pub fn rx_stats(&self) -> RxStats {
        self.rx_stats
    }

    /// Counts of the bytes framed for transmission so far.
    pub fn tx_stats(&self) -> TxStats {
        self.tx_stats
    }

    /// Sets the least payload for which an FPDU's payload is read straight into place ([`Connection::receive`]); `None` turns that off (every FPDU goes through the
    /// receive buffer). Default [`DIRECT_MIN`]. It never applies with markers.
    pub fn set_direct_min(&mut self, min: Option<usize>) {
        self.direct_min = min;
    }

    /// Whether this (responder) end is still waiting for the initiator's first FPDU.
    pub fn awaiting_peer(&self) -> bool {
        self.awaiting_peer
    }

    /// The queue pair.
    pub fn qp(&mut self) -> &mut QueuePair {
        &mut self.qp
    }

    /// The queue pair, read-only.
    pub fn qp_ref(&self) -> &QueuePair {
        &self.qp
    }

    /// Reads from the link once and processes what it brought: `read` is the link's
    /// non-blocking vectored receive (it fills the buffers it is given in order, as
    /// `readv(2)` does, and returns the bytes read, 0 when nothing is available). While the
    /// payload of a large FPDU is due, the link reads it straight into the place the segment
    /// names (the region of an RDMA Write or Read Response, the scatter list of a posted
    /// receive), with its CRC computed over the placed bytes, and the FPDU's pad and CRC, the
    /// next FPDU's header and [`LOOKAHEAD`] bytes more (at most) in the same call; otherwise
    /// it reads into `rx` and [`Connection::handle_bytes`] takes the bytes. After a large
    /// FPDU a buffered read asks only as far as the next header and the lookahead, so the
    /// next payload can go into place too.
    ///
    /// The place is checked before the first byte lands and again before each read (a region
    /// deregistered meanwhile is never touched: the rest of the payload is dropped and the
    /// segment fails); a bad CRC terminates the stream, and the message never completes.
    pub fn receive<E>(
        &mut self,
        mem: &mut TableMemory<'_>,
        rx: &mut [u8],
        read: impl FnOnce(&mut [IoSliceMut<'_>]) -> Result<usize, E>,
    ) -> Result<ReceiveStep, E> {
        self.receive_then(mem, rx, read, |_| {})
    }

    /// [`Connection::receive`], calling `after_read` with the queue pair between the read and
    /// the handling of what it brought. A caller that takes receive work requests from
    /// another thread posts them there: a peer may send into a receive as soon as the
    /// application posted it and told the peer so, and the bytes of that Send can only be in
    /// a read that returned after the post, so receives taken then are there for them, where
    /// receives taken before the read may miss some (and the Send would find no buffer).
    pub fn receive_then<E>(
        &mut self,
        mem: &mut TableMemory<'_>,
        rx: &mut [u8],
        read: impl FnOnce(&mut [IoSliceMut<'_>]) -> Result<usize, E>,
        after_read: impl FnOnce(&mut QueuePair),
    ) -> Result<ReceiveStep, E> {
        let lookahead = self.lookahead();
        if !self.rx_failed
            && let Some(d) = self.direct.as_mut()
            && d.done < d.payload_len
        {
            let want = d.payload_len - d.done;
            // The front of `rx` takes what follows the payload; the rest, dropped payload.
            let (next, scratch) = rx.split_at_mut((d.trailer_len + HEAD_MAX + lookahead).min(rx.len() / 2));
            let place = match d.refused {
                None => self.qp.direct_bytes(mem, d.sink, d.done, want),
                Some(e) => Err(e),
            };
            let (dst, next) = match place {
                Ok(dst) if !dst.is_empty() => {
                    let whole = dst.len() == want;
                    (dst, if whole { next } else { &mut [][..] })
                }
                Ok(_) | Err(_) => {
                    d.refused = Some(place.err().unwrap_or(AccessError::BaseOrBounds));
                    let n = want.min(scratch.len());
                    (&mut scratch[..n], &mut [][..])
                }
            };
            let (in_dst, asked) = (dst.len(), dst.len() + next.len());
            let n = read(&mut [IoSliceMut::new(dst), IoSliceMut::new(next)])?.min(asked);
            after_read(&mut self.qp);
            let placed = n.min(in_dst);
            if self.rx_crc {
                d.crc = crc_update(d.crc, &dst[..placed]);
            }
            d.done += placed;
            self.rx_stats.bytes += placed as u64;
            if d.refused.is_none() {
                self.rx_stats.in_place += placed as u64;
            }
            if n > in_dst {
                self.handle_bytes(mem, &next[..n - in_dst]);
            }
            return Ok(ReceiveStep { read: n, asked });
        }
        let asked = self.buffered_ask().map_or(rx.len(), |n| n + lookahead).min(rx.len());
        let n = read(&mut [IoSliceMut::new(&mut rx[..asked])])?.min(asked);
        after_read(&mut self.qp);
        self.handle_bytes(mem, &rx[..n]);
        Ok(ReceiveStep { read: n, asked })
    }

    /// Takes received bytes (any chunking). FPDUs wholly inside `bytes` are deframed and
    /// placed straight from it; an FPDU cut by the end of a chunk is staged until its last
    /// byte arrives, or, once its header is in if its payload is at least
    /// [`Connection::set_direct_min`] bytes, placed piece by piece as they arrive (as
    /// [`Connection::receive`] does).
    pub fn handle_bytes(&mut self, mem: &mut TableMemory<'_>, mut bytes: &[u8]) {
        self.rx_stats.bytes += bytes.len() as u64;
        loop {
            if self.rx_failed {
                return;
            }
            if self.direct.is_some() {
                bytes = self.feed_direct(mem, bytes);
                if self.direct.is_some() {
                    return;
                }
                continue;
            }
            if !self.pending.is_empty() {
                // Complete the staged FPDU with just the bytes it still needs.
                let step = match self.deframer.deframe(&self.pending) {
                    Ok(Deframed::NeedMore(n)) => {
                        let take = n.saturating_sub(self.pending.len()).min(bytes.len());
                        self.pending.extend_from_slice(&bytes[..take]);
                        bytes = &bytes[take..];
                        if self.pending.len() < n {
                            let staged = std::mem::take(&mut self.pending);
                            if !self.start_direct(mem, &staged, n) {
                                self.pending = staged;
                                return;
                            }
                            // The staged bytes went into place; the buffer is kept for reuse.
                            self.pending = staged;
                            self.pending.clear();
                        }
                        continue;
                    }
                    Ok(Deframed::Fpdu(f)) => {
                        self.awaiting_peer = false;
                        self.rx_large =
                            after_fpdu(self.rx_large, self.rx_markers, self.direct_min, f.ulpdu.len());
                        self.qp.handle_ulpdu(mem, f.ulpdu);
                        Ok(f.wire_len)
                    }
                    Err(e) => Err(e),
                };
                match step {
                    Ok(n) => {
                        self.pending.drain(..n);
                    }
                    Err(e) => return self.rx_error(e),
                }
                continue;
            }
            if bytes.is_empty() {
                return;
            }
            match self.deframer.deframe(bytes) {
                Ok(Deframed::Fpdu(f)) => {
                    self.awaiting_peer = false;
                    self.rx_large =
                        after_fpdu(self.rx_large, self.rx_markers, self.direct_min, f.ulpdu.len());
                    let n = f.wire_len;
                    self.qp.handle_ulpdu(mem, f.ulpdu);
                    bytes = &bytes[n..];
                }
                Ok(Deframed::NeedMore(n)) => {
                    if !self.start_direct(mem, bytes, n) {
                        self.pending.extend_from_slice(bytes);
                        return;
                    }
                    bytes = &[];
                }
                Err(e) => return self.rx_error(e),
            }
        }
    }

    /// How far past the next header a read that stops there asks: [`LOOKAHEAD`], or an
    /// eighth of the least payload read into place where that is less.
    fn lookahead(&self) -> usize {
        self.direct_min.map_or(0, |min| (min / 8).min(LOOKAHEAD))
    }

    /// Where the next buffered read stops, when not at the end of the receive buffer
    /// (`None`): while large FPDUs arrive (and never with markers), at the end of the next
    /// header that may start a payload read into place (then [`Connection::receive`] asks
    /// the lookahead more). That is the rest of the pad and CRC of an FPDU read into place,
    /// or the rest of a staged FPDU too small for that (or cut before its length), and then
    /// the next FPDU's length and header; or, for a staged large FPDU, the rest of its own
    /// header.
    fn buffered_ask(&self) -> Option<usize> {
        if let Some(d) = &self.direct {
            return Some(d.trailer_len - d.trailer_have + HEAD_MAX);
        }
        if self.rx_large == 0 || self.rx_markers || self.rx_failed {
            return None;
        }
        let have = self.pending.len();
        let [hi, lo, ..] = self.pending[..] else { return Some(HEAD_MAX - have) };
        let ulpdu_len = usize::from(u16::from_be_bytes([hi, lo]));
        let head_len = match self.pending.get(LENGTH_LEN) {
            Some(c) if c & control::TAGGED != 0 => LENGTH_LEN + TAGGED_HEADER_LEN,
            _ => HEAD_MAX,
        };
        if have < head_len && large(false, self.direct_min, ulpdu_len) {
            return Some(head_len - have);
        }
        let wire_len = LENGTH_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN;
        Some(wire_len.saturating_sub(have) + HEAD_MAX)
    }

    /// `have` is the start of an FPDU of `wire_len` bytes that has not all arrived: if its
    /// header is in, its payload is large enough and the queue pair has a place for it
    /// ([`QueuePair::direct_sink`]), the FPDU goes on piece by piece ([`DirectRx`]) and the
    /// payload bytes in `have` go into place now. Returns whether it did.
    fn start_direct(&mut self, mem: &mut TableMemory<'_>, have: &[u8], wire_len: usize) -> bool {
        let Some(min) = self.direct_min else { return false };
        if self.rx_markers || have.len() <= LENGTH_LEN || self.qp_ref().state() != crate::qp::QpState::Rts {
            return false;
        }
        let ulpdu_len = usize::from(u16::from_be_bytes([have[0], have[1]]));
        let header_len =
            if have[LENGTH_LEN] & control::TAGGED != 0 { TAGGED_HEADER_LEN } else { UNTAGGED_HEADER_LEN };
        let head_len = LENGTH_LEN + header_len;
        let trailer_len = pad_len(ulpdu_len) + CRC_LEN;
        if ulpdu_len < header_len
            || have.len() < head_len
            || wire_len != head_len + (ulpdu_len - header_len) + trailer_len
        {
            return false;
        }
        let payload_len = ulpdu_len - header_len;
        let arrived = have.len() - head_len;
        if arrived >= payload_len || payload_len < min {
            return false;
        }
        let Some(sink) = self.qp.direct_sink(mem, &have[LENGTH_LEN..head_len], payload_len) else {
            return false;
        };
        let mut head = [0; LENGTH_LEN + UNTAGGED_HEADER_LEN];
        head[..head_len].copy_from_slice(&have[..head_len]);
        self.awaiting_peer = false;
        self.rx_large = LARGE_LINGER;
        self.direct = Some(DirectRx {
            head,
            head_len,
            sink,
            payload_len,
            done: 0,
            refused: None,
            trailer: [0; 3 + CRC_LEN],
            trailer_len,
            trailer_have: 0,
            crc: if self.rx_crc { crc_update(0, &have[..head_len]) } else { 0 },
        });
        let rest = self.feed_direct(mem, &have[head_len..]);
        debug_assert!(rest.is_empty());
        true
    }

    /// Puts received bytes of the FPDU being read into place where they belong (payload into
    /// place, then pad and CRC), finishes it when its last byte is in, and returns the bytes
    /// after it.
    fn feed_direct<'b>(&mut self, mem: &mut TableMemory<'_>, mut bytes: &'b [u8]) -> &'b [u8] {
        let Some(d) = self.direct.as_mut() else { return bytes };
        while d.done < d.payload_len && !bytes.is_empty() {
            let want = (d.payload_len - d.done).min(bytes.len());
            let place = match d.refused {
                None => self.qp.direct_bytes(mem, d.sink, d.done, want),
                Some(e) => Err(e),
            };
            let k = match place {
                Ok(dst) if !dst.is_empty() => {
                    let k = dst.len();
                    dst.copy_from_slice(&bytes[..k]);
                    k
                }
                Ok(_) | Err(_) => {
                    d.refused = Some(place.err().unwrap_or(AccessError::BaseOrBounds));
                    want
                }
            };
            if self.rx_crc {
                d.crc = crc_update(d.crc, &bytes[..k]);
            }
            d.done += k;
            bytes = &bytes[k..];
        }
        if d.done == d.payload_len {
            let k = (d.trailer_len - d.trailer_have).min(bytes.len());
            d.trailer[d.trailer_have..d.trailer_have + k].copy_from_slice(&bytes[..k]);
            d.trailer_have += k;
            bytes = &bytes[k..];
            if d.trailer_have == d.trailer_len {
                self.finish_direct(mem);
            }
        }
        bytes
    }

    /// The FPDU read into place is complete: check its CRC, then let the queue pair act on
    /// the segment (a bad CRC terminates the stream instead).
    fn finish_direct(&mut self, mem: &mut TableMemory<'_>) {
        let Some(d) = self.direct.take() else { return };
        let wire_len = d.wire_len();
        let pad = d.trailer_len - CRC_LEN;
        let mut field = [0; CRC_LEN];
        field.copy_from_slice(&d.trailer[pad..d.trailer_len]);
        let received = crc_from_wire(field);
        if self.rx_crc {
            let computed = crc_update(d.crc, &d.trailer[..pad]);
            // Bypassed under fuzzing, as the deframer's check is.
            if computed != received && !cfg!(fuzzing) {
                return self.rx_error(DeframeError::Crc { computed, received, wire_len });
            }
        }
        self.deframer.skip(wire_len);
        self.qp.handle_placed(mem, &d.head[LENGTH_LEN..d.head_len], d.payload_len, d.refused);
    }

    /// The received stream cannot be deframed: terminate with the LLP code, and drop what
    /// arrives from now on (memory stays bounded while the Terminate goes out).
    fn rx_error(&mut self, e: DeframeError) {
        // The peer has spoken (badly): the Terminate may go out even from a responder.
        self.awaiting_peer = false;
        self.rx_failed = true;
        self.pending = Vec::new();
        self.direct = None;
        self.rx_large = 0;
        let code = TerminateCode { layer: TerminateLayer::Llp, error_type: 0, code: e.llp_code().code() };
        self.qp.handle_llp_error(code);
    }

    /// Bytes allocated to hold received data between calls: the staged FPDU that a chunk
    /// boundary cut (at most one FPDU) and the deframer's marker scratch buffer (at most one
    /// ULPDU). After a framing error both are released as bytes keep arriving.
    pub fn rx_buffered_capacity(&self) -> usize {
        self.pending.capacity() + self.deframer.scratch_capacity()
    }

    /// The most bytes one FPDU of this connection can take on the wire (markers included).
    pub fn max_fpdu_len(&self) -> usize {
        let markers = self.framer.markers();
        // The most markers fall into an FPDU that starts at a marker position (0 mod 512).
        iwarp_mpa::fpdu::wire_len(0, self.mulpdu, markers)
    }

    /// Frames what the queue pair has to send into `buf`, as many whole FPDUs as fit, and
    /// returns the bytes written. Without markers the queue pair writes each segment straight
    /// into `buf` and the framer adds length, pad and CRC around it: no copy, no staging. The
    /// caller keeps `buf` between calls (nothing here clears or zero-fills it).
    pub fn poll_transmit_into(&mut self, mem: &mut TableMemory<'_>, buf: &mut [u8]) -> usize {
        if self.awaiting_peer {
            // Nothing goes out yet; memory work requests need no wire.
            self.qp.run_memory_operations(mem);
            return 0;
        }
        let room = self.max_fpdu_len();
        let mut at = 0;
        while buf.len() - at >= room {
            let out = &mut buf[at..];
            let written = if self.framer.markers() {
                let Some(n) = self.qp.poll_transmit(mem, &mut self.segment) else { break };
                self.framer.frame(&self.segment[..n], out)
            } else {
                let Some(n) = self.qp.poll_transmit(mem, &mut out[iwarp_mpa::fpdu::LENGTH_LEN..]) else {
                    break;
                };
                self.framer.frame_in_place(out, n)
            };
            match written {
                Ok(w) => at += w,
                Err(_) => break,
            }
        }
        at
    }

    /// Frames what the queue pair has to send, about `limit` bytes of whole FPDUs, into
    /// `batch` for one vectored write, and returns the bytes added. Without markers, a payload
    /// of at least [`TX_BY_REF_MIN`] bytes from registered memory is not copied: the batch
    /// names it where it is ([`TxPart::Memory`]), between its header and its pad and CRC
    /// (computed over it here) in the batch's own bytes. With markers every FPDU is framed
    /// into the batch's bytes ([`Connection::poll_transmit_into`]).
    ///
    /// The parts that name registered memory are valid while the caller holds the table
    /// `mem` borrows: within that time it sends them ([`TxBatch::io_slices`]) and copies what
    /// the link did not take ([`TxBatch::unsent`]), since the work requests they belong to may
    /// have completed already.
    pub fn poll_transmit_batch(
        &mut self,
        mem: &mut TableMemory<'_>,
        batch: &mut TxBatch,
        limit: usize,
    ) -> usize {
        let start = batch.len;
        // Payloads are moved off slow distances only where the write is likely to start at the
        // first byte of the kernel's page fragment: the last batch sent everything there was,
        // and the peer answered since.
        let answered = self.tx_drained && self.rx_stats.bytes != self.rx_at_last_batch;
        // The limit gives way at a message's end: a message begun in the batch whose rest fits
        // in one more FPDU is finished in it (up to two FPDUs past the limit). A 256 KiB Write
        // is 8 FPDUs of 32 KiB and a ninth of 180 bytes; left to the next batch, that one went
        // out in a write of its own, and where the sending thread lost its core to the reader
        // it woke, the message was complete at the peer 150 us after the rest of it (a
        // traced 256 KiB Write ping-pong).
        let finishing = |c: &Self, framed: usize| {
            let rest = c.qp.begun_rest();
            rest > 0 && rest <= c.mulpdu && framed < limit.saturating_add(2 * c.mulpdu)
        };
        while (batch.len - start < limit || finishing(self, batch.len - start))
            && batch.parts.len() + 3 <= TxBatch::MAX_PARTS
            && self.qp.may_transmit()
        {
            let by_ref = self.tx_by_ref_min.filter(|_| !self.framer.markers());
            let Some(min) = by_ref.filter(|_| !self.awaiting_peer) else {
                let at = batch.meta_len;
                let room = TxBatch::meta_room(&mut batch.meta, at, self.max_fpdu_len());
                let n = self.poll_transmit_into(mem, room);
                if n == 0 {
                    break;
                }
                batch.meta_len = at + n;
                batch.push_meta(at);
                continue;
            };
            let at = batch.meta_len;
            let room = TxBatch::meta_room(&mut batch.meta, at, self.max_fpdu_len());
            let first = batch.pieces.len();
            let Some(e) = self.qp.poll_transmit_by_ref(mem, &mut room[LENGTH_LEN..], &mut batch.pieces, min)
            else {
                break;
            };
            if e.by_ref == 0 {
                // The whole segment was copied into the batch: framed where it lies, its pad
                // and CRC after it (no trailer to copy, one part).
                let Ok(n) = self.framer.frame_in_place(&mut batch.meta[at..], e.written) else { break };
                batch.meta_len = at + n;
                batch.push_meta(at);
                continue;
            }
            let head = &mut batch.meta[at..at + LENGTH_LEN + e.written];
            let pieces = &batch.pieces[first..];
            // The pieces were checked in this call, under the same borrow of the table: they
            // resolve. Should one not, the FPDU goes out with a CRC the peer refuses.
            let slices = pieces.iter().map(|p| mem.source(p.stag, p.to, p.len, p.needed).unwrap_or_default());
            let Ok((trailer, n)) = self.framer.frame_around(head, slices) else {
                break;
            };
            batch.meta_len = at + LENGTH_LEN + e.written;
            batch.push_meta(at);
            for i in first..batch.pieces.len() {
                let p = batch.pieces[i];
                // Where the kernel's copy puts it, as far as the page goes: its offset in the
                // write the batch is (see `TxBatch`). Looked at only where a move may be due.
                let slow = answered
                    .then(|| mem.source(p.stag, p.to, p.len, p.needed).ok())
                    .flatten()
                    .filter(|b| b.len() == p.len && slow_copy(batch.len, b.as_ptr() as usize));
                if let Some(bytes) = slow {
                    batch.push_moved(bytes);
                    self.tx_stats.moved += p.len as u64;
                    continue;
                }
                batch.parts.push(TxPart::Memory(p));
                batch.len += p.len;
                self.tx_stats.by_ref += p.len as u64;
            }
            let at = batch.meta_len;
            TxBatch::meta_room(&mut batch.meta, at, n).copy_from_slice(&trailer[..n]);
            batch.meta_len = at + n;
            batch.push_meta(at);
        }
        let added = batch.len - start;
        if added > 0 {
            self.rx_at_last_batch = self.rx_stats.bytes;
            self.tx_drained = !self.qp.may_transmit();
        }
        self.tx_stats.bytes += added as u64;
        added
    }

    /// Frames what the queue pair has to send, up to about `limit` bytes, appending to `out`;
    /// returns the bytes appended (a convenience over [`Connection::poll_transmit_into`]).
    pub fn poll_transmit(&mut self, mem: &mut TableMemory<'_>, out: &mut Vec<u8>, limit: usize) -> usize {
        let start = out.len();
        let room = self.max_fpdu_len();
        while out.len() - start < limit {
            let at = out.len();
            out.resize(at + room, 0);
            let n = self.poll_transmit_into(mem, &mut out[at..]);
            out.truncate(at + n);
            if n == 0 {
                break;
            }
        }
        out.len() - start
    }

    /// Frames `ulpdu` as the next FPDU of this side's stream, bypassing the queue pair: for
    /// tests and tools that play a misbehaving peer. Returns the bytes appended to `out`.
    pub fn inject_ulpdu(&mut self, ulpdu: &[u8], out: &mut Vec<u8>) -> usize {
        Self::frame_into(&mut self.framer, ulpdu, out)
    }

    /// Frames one ULPDU onto the end of `out`; returns the bytes appended (0 on failure).
    fn frame_into(framer: &mut Framer, ulpdu: &[u8], out: &mut Vec<u8>) -> usize {
        let at = out.len();
        out.resize(at + framer.wire_len(ulpdu.len()), 0);
        match framer.frame(ulpdu, &mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                n
            }
            Err(_) => {
                out.truncate(at);
                0
            }
        }
    }

    /// Frames a zero-length RDMA Write to STag 1 (the shape of RFC 6581's Write RTR, which
    /// every peer takes without checking the STag) as the next FPDU of this side's stream,
    /// bypassing the queue pair, and appends it to `out`; returns the bytes appended. It
    /// places nothing and completes nothing: the engine sends it to make a peer that left
    /// earlier FPDUs unread in its socket read again (see docs/siw-quirks.md). Call it only
    /// between messages (when [`Connection::poll_transmit_into`] has nothing more).
    pub fn nudge(&mut self, out: &mut Vec<u8>) -> usize {
        let mut ulpdu = [0u8; iwarp_ddp::header::TAGGED_HEADER_LEN];
        let mut seg = iwarp_ddp::header::Segment::new_unchecked(&mut ulpdu[..]);
        seg.set_ddp_control(true, true);
        seg.set_rdmap_control(crate::wire::Control::new(crate::wire::Opcode::Write).to_byte());
        seg.set_stag(iwarp_ddp::STag(1));
        seg.set_to(iwarp_ddp::TaggedOffset(0));
        Self::frame_into(&mut self.framer, &ulpdu, out)
    }

    /// The lower layer closed or failed.
    pub fn handle_llp_lost(&mut self) {
        self.qp.handle_llp_lost();
    }
}
