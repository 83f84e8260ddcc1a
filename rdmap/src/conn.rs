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

use iwarp_ddp::{TerminateCode, TerminateLayer};
use iwarp_mpa::{ConnParams, DeframeError, Deframed, Deframer, Framer, Role};

use crate::memory::TableMemory;
use crate::qp::{QpConfig, QueuePair};

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
        }
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

    /// Takes received bytes (any chunking). FPDUs wholly inside `bytes` are deframed and
    /// placed straight from it; only an FPDU cut by the end of a chunk is staged, and only
    /// until its last byte arrives.
    pub fn handle_bytes(&mut self, mem: &mut TableMemory<'_>, mut bytes: &[u8]) {
        while !self.rx_failed && !self.pending.is_empty() {
            // Complete the staged FPDU with just the bytes it still needs.
            let step = match self.deframer.deframe(&self.pending) {
                Ok(Deframed::NeedMore(n)) => {
                    let take = n.saturating_sub(self.pending.len()).min(bytes.len());
                    self.pending.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.pending.len() < n {
                        return;
                    }
                    continue;
                }
                Ok(Deframed::Fpdu(f)) => {
                    self.awaiting_peer = false;
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
        }
        while !self.rx_failed && !bytes.is_empty() {
            match self.deframer.deframe(bytes) {
                Ok(Deframed::Fpdu(f)) => {
                    self.awaiting_peer = false;
                    let n = f.wire_len;
                    self.qp.handle_ulpdu(mem, f.ulpdu);
                    bytes = &bytes[n..];
                }
                Ok(Deframed::NeedMore(_)) => {
                    self.pending.extend_from_slice(bytes);
                    return;
                }
                Err(e) => return self.rx_error(e),
            }
        }
    }

    /// The received stream cannot be deframed: terminate with the LLP code, and drop what
    /// arrives from now on (memory stays bounded while the Terminate goes out).
    fn rx_error(&mut self, e: DeframeError) {
        // The peer has spoken (badly): the Terminate may go out even from a responder.
        self.awaiting_peer = false;
        self.rx_failed = true;
        self.pending = Vec::new();
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
