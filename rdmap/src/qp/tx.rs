//! The transmit path: work requests become messages, messages become MULPDU-sized DDP
//! segments, and each segment's payload is gathered from its source (local buffers through
//! DDP's [`TableMemory`], our region for a Read Response, or bytes the queue pair holds). Read
//! Responses and the send queue take turns. The memory work requests (local invalidate,
//! fast-register, bind) run here too, in send-queue order, when they reach its head.

use iwarp_ddp::header::{HeaderRepr, SegmentKind};
use iwarp_ddp::stag_table::{Access, AccessError, Addressing, RegionSpec, TableError};
use iwarp_ddp::{MessageTarget, Msn, QueueNumber, STag, Segmenter, TableMemory, TaggedOffset};
use iwarp_mpa::RtrType;

use super::error::Violation;
use super::state::{
    Outbound, OutboundKind, QN_ATOMIC_RESPONSE, QN_READ, QN_SEND, QpState, QueuePair, RTR_SEQ, Response,
    Source, TxMessage,
};
use super::wr::{CheckedSendWr, SendOp, WcStatus};
use crate::atomic::{AtomicRequest, IMMEDIATE_DATA_LEN};
use crate::terminate::RdmapError;
use crate::wire::{Control, Opcode, ReadRequest};

/// A piece of a segment's payload left in registered memory for a vectored write:
/// `len` bytes at `to` of `stag`, which were checked needing `needed`
/// ([`QueuePair::poll_transmit_by_ref`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPiece {
    /// The region (or window).
    pub stag: STag,
    /// The tagged offset of the first byte.
    pub to: u64,
    /// Bytes.
    pub len: usize,
    /// The right the read needs.
    pub needed: Access,
}

/// What [`QueuePair::poll_transmit_by_ref`] emitted: a segment of `written` bytes in the
/// buffer (header and any payload copied) followed by `by_ref` payload bytes left in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    /// Bytes written into the buffer.
    pub written: usize,
    /// Payload bytes in the pieces appended.
    pub by_ref: usize,
}

impl QueuePair {
    /// Queues the RFC 6581 ready-to-receive message, which must be the initiator's first FPDU
    /// when peer-to-peer mode was agreed: a zero-length RDMA Write to STag 1 (not 0, which
    /// Chelsio rejects; siw does the same), a zero-length Read Request (its zero-length
    /// response is absorbed here), or a zero-length Send.
    pub fn queue_rtr(&mut self, rtr: RtrType) {
        const RTR_STAG: STag = STag(1);
        let message = match rtr {
            RtrType::Write => {
                let target = MessageTarget::Tagged { stag: RTR_STAG, to: TaggedOffset(0) };
                self.message(None, target, Opcode::Write, 0, Source::Inline(Vec::new()))
            }
            RtrType::Read => {
                let req = ReadRequest { sink_stag: 1, sink_to: 0, size: 0, source_stag: 1, source_to: 0 };
                let kind = OutboundKind::Read { sink: RTR_STAG, sink_to: 0, len: 0, received: 0 };
                self.outbound.push_back(Outbound { seq: RTR_SEQ, kind });
                let target = self.untagged(QN_READ, 0);
                let body = req.to_bytes().to_vec();
                self.message(None, target, Opcode::ReadRequest, body.len(), Source::Inline(body))
            }
            RtrType::Send => {
                let target = self.untagged(QN_SEND, 0);
                self.message(None, target, Opcode::Send, 0, Source::Inline(Vec::new()))
            }
        };
        if let Ok(m) = message {
            // Ahead of anything the application posted.
            self.tx_next = self.tx_cur.take();
            self.tx_cur = Some(m);
        }
    }

    /// The payload bytes still to send of the messages whose sending has begun (a send-queue
    /// message and a Read Response, one of each at most, and a message set aside while the
    /// peer-to-peer RTR goes first): 0 when every message sent so far went out whole.
    pub fn begun_rest(&self) -> usize {
        [&self.tx_cur, &self.tx_next, &self.resp_cur]
            .into_iter()
            .flatten()
            .map(|m| m.segments.begun_rest())
            .sum()
    }

    /// Whether [`QueuePair::poll_transmit`] may have something to send (or memory work requests
    /// to run): false only when it would certainly return `None`. A few field tests, where a
    /// poll that finds nothing walks both turns and the send queue's head.
    pub fn may_transmit(&self) -> bool {
        self.terminate.is_some()
            || (self.state == QpState::Rts
                && (self.tx_cur.is_some()
                    || self.tx_next.is_some()
                    || self.resp_cur.is_some()
                    || !self.resp_pending.is_empty()
                    || !self.sq.is_empty()))
    }

    /// Writes the next ULPDU (one DDP segment) to send into `buf`, which must hold at least
    /// [`QpConfig::mulpdu`](super::QpConfig::mulpdu) bytes, and returns its length; `None` when
    /// there is nothing to send. Read Responses and the send queue take turns, so neither
    /// starves the other.
    pub fn poll_transmit(&mut self, mem: &mut TableMemory<'_>, buf: &mut [u8]) -> Option<usize> {
        self.poll_segment(mem, buf, None).map(|e| e.written)
    }

    /// [`QueuePair::poll_transmit`], leaving payloads of at least `min` bytes that come from
    /// registered memory (local buffers, the source of a Read Response) where they are: the
    /// segment's header goes into `buf` and the payload's pieces, checked, are appended to
    /// `pieces`, for a transmit path that sends them from there with a vectored write. The
    /// pieces stay valid for as long as the caller holds the table (nothing can deregister or
    /// invalidate them meanwhile); the work request may complete as soon as its last segment
    /// is out of this call, so the caller sends or copies them before it lets go of the table.
    pub fn poll_transmit_by_ref(
        &mut self,
        mem: &mut TableMemory<'_>,
        buf: &mut [u8],
        pieces: &mut Vec<TxPiece>,
        min: usize,
    ) -> Option<Emitted> {
        self.poll_segment(mem, buf, Some((pieces, min)))
    }

    fn poll_segment(
        &mut self,
        mem: &mut TableMemory<'_>,
        buf: &mut [u8],
        mut refs: Option<(&mut Vec<TxPiece>, usize)>,
    ) -> Option<Emitted> {
        if buf.len() < self.config.mulpdu {
            return None;
        }
        if let Some(t) = &mut self.terminate {
            let n = emit_segment(mem, t, buf, None, &mut self.stats.tx_segments).ok().flatten();
            if n.is_some() && t.segments.len() == 0 {
                self.terminate = None;
                self.state = QpState::Error;
            }
            return n;
        }
        if self.state != QpState::Rts {
            return None;
        }
        for _ in 0..2 {
            let response_turn = self.prefer_response;
            self.prefer_response = !self.prefer_response;
            let refs = refs.as_mut().map(|(p, min)| (&mut **p, *min));
            let n = if response_turn {
                self.transmit_response(mem, buf, refs)
            } else {
                self.transmit_sq(mem, buf, refs)
            };
            if n.is_some() {
                return n;
            }
        }
        // A turn that failed the stream (a Read Response whose source was invalidated since
        // the request, a work request that could not start) queued a Terminate: it goes in
        // this call. Left for a later one, it could wait for good, since nothing else may
        // make the caller poll this queue pair again.
        if self.terminate.is_some() {
            return self.poll_segment(mem, buf, refs);
        }
        None
    }

    fn transmit_response(
        &mut self,
        mem: &mut TableMemory<'_>,
        buf: &mut [u8],
        refs: Option<(&mut Vec<TxPiece>, usize)>,
    ) -> Option<Emitted> {
        if self.resp_cur.is_none() {
            let message = match self.resp_pending.pop_front()? {
                Response::Read(req) => {
                    let target =
                        MessageTarget::Tagged { stag: STag(req.sink_stag), to: TaggedOffset(req.sink_to) };
                    let len = usize::try_from(req.size).ok()?;
                    let source = Source::Remote { stag: STag(req.source_stag), to: req.source_to };
                    self.message(None, target, Opcode::ReadResponse, len, source)
                }
                Response::Atomic(resp) => {
                    let msn = self.next_msn(QN_ATOMIC_RESPONSE);
                    let target = MessageTarget::Untagged { rdmap_word: 0, qn: QN_ATOMIC_RESPONSE, msn };
                    let body = resp.to_bytes().to_vec();
                    self.message(None, target, Opcode::AtomicResponse, body.len(), Source::Inline(body))
                }
            };
            match message {
                Ok(m) => self.resp_cur = Some(m),
                Err(_) => {
                    // A response that cannot be segmented (the receive path refuses requests
                    // that would need one) is never dropped silently: the stream ends.
                    self.fail(RdmapError::LocalCatastrophic.terminate_code(), None);
                    return None;
                }
            }
        }
        let t = self.resp_cur.as_mut()?;
        let n = match emit_segment(mem, t, buf, refs, &mut self.stats.tx_segments) {
            Ok(n) => n,
            Err(e) => {
                // The source was checked when the Read Request arrived; it has been
                // invalidated or deregistered since. The response cannot be completed: the
                // stream ends with the protection error the source now fails with.
                self.resp_cur = None;
                self.fail(Violation::Rdmap(RdmapError::Access(e)).terminate_code(), None);
                return None;
            }
        };
        if t.segments.len() == 0 {
            // The response is out: its IRD slot takes the next Read or Atomic Request.
            self.resp_cur = None;
            self.post_rdmap_buffer(QN_READ);
        }
        n
    }

    fn transmit_sq(
        &mut self,
        mem: &mut TableMemory<'_>,
        buf: &mut [u8],
        refs: Option<(&mut Vec<TxPiece>, usize)>,
    ) -> Option<Emitted> {
        if self.tx_cur.is_none() {
            if let Some(next) = self.tx_next.take() {
                self.tx_cur = Some(next);
            } else {
                // Looked at here first: the call costs more than the look, and the head is
                // rarely a memory operation.
                if self.memory_operation_at_head() {
                    self.run_memory_operations(mem);
                }
                let copy_below = refs.as_ref().map_or(usize::MAX, |(_, min)| *min);
                if let Some(emitted) = self.transmit_whole(mem, buf, copy_below) {
                    return emitted;
                }
                let seq = self.sq_front_seq();
                let uses_ord = self.sq.front()?.wr().op.uses_ord();
                if uses_ord && self.outbound.len() >= usize::from(self.config.ord) {
                    return None; // ORD exhausted: the send queue waits for a response.
                }
                let wr = self.sq.pop_front()?;
                match self.start_message(seq, wr) {
                    Ok(m) => self.tx_cur = Some(m),
                    Err(status) => {
                        self.fail_request(Some(seq), status);
                        return None;
                    }
                }
            }
        }
        let t = self.tx_cur.as_mut()?;
        let emitted = emit_segment(mem, t, buf, refs, &mut self.stats.tx_segments);
        let (seq, done) = (t.seq, t.segments.len() == 0);
        match emitted {
            Ok(Some(n)) => {
                if done {
                    self.tx_cur = None;
                    // Send completion means "handed to the transport"; a Read or Atomic
                    // completes when its response has been placed.
                    if let Some(seq) = seq
                        && !self.outbound.iter().any(|o| o.seq == seq)
                    {
                        self.finish(seq, WcStatus::Success);
                    }
                }
                Some(n)
            }
            Ok(None) | Err(_) => {
                // A local buffer could not be read: the request fails, the QP goes to error.
                self.tx_cur = None;
                let seq = seq.or_else(|| self.tx_next.as_ref().and_then(|m| m.seq));
                self.fail_request(seq, WcStatus::LocalProtectionError);
                None
            }
        }
    }

    /// Sends the send queue's head in one go when it is a Send or an RDMA Write whose payload
    /// fits one segment and is copied (under `copy_below` bytes): its header and the bytes
    /// gathered from its local buffer are written into `buf`, and it completes, as
    /// [`QueuePair::transmit_sq`] would do it through a segmented message, whose setup and
    /// bookkeeping cost about as much as the rest of a 64-byte Send's segment. `None`, having
    /// done nothing, for any other head (the segmented path takes it, and reports its
    /// errors); `Some(None)` when the local buffer could not be read: the request failed and
    /// the queue pair is going to error, as there.
    fn transmit_whole(
        &mut self,
        mem: &TableMemory<'_>,
        buf: &mut [u8],
        copy_below: usize,
    ) -> Option<Option<Emitted>> {
        let head = self.sq.front()?;
        let len = usize::try_from(head.len()).ok().filter(|&len| len < copy_below)?;
        let (opcode, kind) = match head.wr().op {
            SendOp::Send { solicited, invalidate } => {
                let kind = SegmentKind::Untagged {
                    rdmap_word: invalidate.map_or(0, |s| s.0),
                    qn: QN_SEND,
                    // Taken below, once the segment is written.
                    msn: self.tx_msn[QN_SEND.index().unwrap_or(0)],
                    mo: 0,
                };
                (send_opcode(solicited, invalidate.is_some()), kind)
            }
            SendOp::Write { remote_stag, remote_to } => {
                // A message whose end would pass TO 2^64 - 1 fails in the segmenter.
                remote_to.checked_add(u64::try_from(len).ok()?)?;
                (Opcode::Write, SegmentKind::Tagged { stag: remote_stag, to: TaggedOffset(remote_to) })
            }
            _ => return None,
        };
        let header = HeaderRepr { last: true, rdmap_control: Control::new(opcode).to_byte(), kind };
        let hlen = header.header_len();
        // One segment, at least a byte of room past the header (the segmenter's own limit).
        if hlen + len.max(1) > self.config.mulpdu {
            return None;
        }
        let (hdr, payload) = buf.get_mut(..hlen + len)?.split_at_mut(hlen);
        header.emit(hdr).ok()?;
        let gathered = mem.gather_sgl(&head.wr().sgl, 0, payload);
        let seq = self.sq_front_seq();
        self.sq.pop_front();
        if matches!(kind, SegmentKind::Untagged { .. }) {
            self.next_msn(QN_SEND);
        }
        if gathered.is_err() {
            self.fail_request(Some(seq), WcStatus::LocalProtectionError);
            return Some(None);
        }
        self.stats.tx_segments += 1;
        // Send completion means "handed to the transport" (a Send or Write is never waiting
        // for a response).
        self.finish(seq, WcStatus::Success);
        Some(Some(Emitted { written: hlen + len, by_ref: 0 }))
    }

    /// Completes the send-queue request `seq` (if any) with `status` and, as any failed work
    /// request does in verbs, takes the queue pair to error: the stream ends with a
    /// Terminate (local catastrophic error).
    fn fail_request(&mut self, seq: Option<u64>, status: WcStatus) {
        if let Some(seq) = seq {
            self.finish(seq, status);
        }
        self.fail(RdmapError::LocalCatastrophic.terminate_code(), None);
    }

    /// Runs the memory work requests at the head of the send queue, in order; each completes
    /// at once. A refused one completes with [`WcStatus::LocalProtectionError`] and, as any
    /// failed work request does in verbs, takes the queue pair to the error state.
    /// [`QueuePair::poll_transmit`] runs them too; this is for a queue pair that may not send
    /// yet (a responder waiting for the initiator's first FPDU), since they need no wire.
    pub fn run_memory_operations(&mut self, mem: &mut TableMemory<'_>) {
        if self.state != QpState::Rts || self.tx_cur.is_some() || self.tx_next.is_some() {
            return;
        }
        while self.memory_operation_at_head() {
            let seq = self.sq_front_seq();
            let Some(wr) = self.sq.pop_front() else { return };
            match Self::memory_operation(mem, wr.into_wr().op) {
                Ok(()) => self.finish(seq, WcStatus::Success),
                Err(_) => {
                    self.fail_request(Some(seq), WcStatus::LocalProtectionError);
                    return;
                }
            }
        }
    }

    /// Whether the send queue's head is a memory work request.
    fn memory_operation_at_head(&self) -> bool {
        self.sq.front().is_some_and(|wr| wr.wr().op.is_memory_operation())
    }

    fn memory_operation(mem: &mut TableMemory<'_>, op: SendOp) -> Result<(), TableError> {
        let spec = |base_va, len, access| RegionSpec {
            base_va,
            len,
            access,
            addressing: Addressing::VirtualAddress,
        };
        match op {
            SendOp::LocalInvalidate { stag } => mem.invalidate_local(stag),
            SendOp::FastRegister { stag, addr, len, access } => {
                mem.fast_register(stag, spec(addr, len, access))
            }
            SendOp::BindWindow { window, region, addr, len, access } => {
                mem.bind_window(window, region, spec(addr, len, access))
            }
            // Not memory operations: transmit_sq starts them as messages.
            _ => Ok(()),
        }
    }

    fn message(
        &mut self,
        seq: Option<u64>,
        target: MessageTarget,
        opcode: Opcode,
        len: usize,
        source: Source,
    ) -> Result<TxMessage, WcStatus> {
        let segments = Segmenter::new(target, Control::new(opcode).to_byte(), len, self.config.mulpdu)
            .map_err(|_| WcStatus::LocalLengthError)?;
        Ok(TxMessage { seq, segments, source })
    }

    fn untagged(&mut self, qn: QueueNumber, rdmap_word: u32) -> MessageTarget {
        MessageTarget::Untagged { rdmap_word, qn, msn: self.next_msn(qn) }
    }

    fn immediate(
        &mut self,
        seq: Option<u64>,
        data: [u8; IMMEDIATE_DATA_LEN],
        solicited: bool,
    ) -> Result<TxMessage, WcStatus> {
        let opcode = if solicited { Opcode::ImmediateDataSe } else { Opcode::ImmediateData };
        let target = self.untagged(QN_SEND, 0);
        self.message(seq, target, opcode, IMMEDIATE_DATA_LEN, Source::Inline(data.to_vec()))
    }

    fn start_message(&mut self, seq: u64, wr: CheckedSendWr) -> Result<TxMessage, WcStatus> {
        let len = usize::try_from(wr.len()).map_err(|_| WcStatus::LocalLengthError)?;
        let wr = wr.into_wr();
        match wr.op {
            SendOp::Send { solicited, invalidate } => {
                let opcode = send_opcode(solicited, invalidate.is_some());
                let target = self.untagged(QN_SEND, invalidate.map_or(0, |s| s.0));
                self.message(Some(seq), target, opcode, len, Source::Local(wr.sgl))
            }
            SendOp::Write { remote_stag, remote_to } => {
                let target = MessageTarget::Tagged { stag: remote_stag, to: TaggedOffset(remote_to) };
                self.message(Some(seq), target, Opcode::Write, len, Source::Local(wr.sgl))
            }
            SendOp::WriteImmediate { remote_stag, remote_to, data, solicited } => {
                // RFC 7306: an RDMA Write, then an Immediate Data message; the work request
                // completes with the second.
                let target = MessageTarget::Tagged { stag: remote_stag, to: TaggedOffset(remote_to) };
                let write = self.message(None, target, Opcode::Write, len, Source::Local(wr.sgl))?;
                self.tx_next = Some(self.immediate(Some(seq), data, solicited)?);
                Ok(write)
            }
            SendOp::SendImmediate { data, solicited } => {
                // RFC 7306: a Send, then an Immediate Data message; the work request completes
                // with the second.
                let target = self.untagged(QN_SEND, 0);
                let send = self.message(None, target, Opcode::Send, len, Source::Local(wr.sgl))?;
                self.tx_next = Some(self.immediate(Some(seq), data, solicited)?);
                Ok(send)
            }
            SendOp::ImmediateData { data, solicited } => self.immediate(Some(seq), data, solicited),
            SendOp::Read { remote_stag, remote_to } => {
                let sink = wr.sgl.first().copied().ok_or(WcStatus::LocalProtectionError)?;
                let req = ReadRequest {
                    sink_stag: sink.lkey.0,
                    sink_to: sink.addr,
                    size: sink.len,
                    source_stag: remote_stag.0,
                    source_to: remote_to,
                };
                let kind = OutboundKind::Read {
                    sink: sink.lkey,
                    sink_to: sink.addr,
                    len: u64::from(sink.len),
                    received: 0,
                };
                self.outbound.push_back(Outbound { seq, kind });
                let target = self.untagged(QN_READ, 0);
                let body = req.to_bytes().to_vec();
                self.message(Some(seq), target, Opcode::ReadRequest, body.len(), Source::Inline(body))
            }
            SendOp::Atomic { remote_stag, remote_to, op, data, data_mask, compare, compare_mask } => {
                let sink = wr.sgl.first().copied().ok_or(WcStatus::LocalProtectionError)?;
                // The sequence number names the request; only its low 32 bits go on the wire,
                // which is unique among the ORD (< 2^14) requests in flight.
                let request_id = u32::try_from(seq & u64::from(u32::MAX)).unwrap_or(0);
                let req = AtomicRequest {
                    op,
                    request_id,
                    remote_stag,
                    remote_to: TaggedOffset(remote_to),
                    add_or_swap_data: data,
                    add_or_swap_mask: data_mask,
                    compare_data: compare,
                    compare_mask,
                };
                self.outbound.push_back(Outbound { seq, kind: OutboundKind::Atomic { request_id, sink } });
                // The DDP buffer for the Atomic Response on queue 3.
                self.post_rdmap_buffer(QN_ATOMIC_RESPONSE);
                let target = self.untagged(QN_READ, 0);
                let body = req.to_bytes().to_vec();
                self.message(Some(seq), target, Opcode::AtomicRequest, body.len(), Source::Inline(body))
            }
            // run_memory_operations took every memory operation at the head of the queue.
            SendOp::LocalInvalidate { .. } | SendOp::FastRegister { .. } | SendOp::BindWindow { .. } => {
                Err(WcStatus::LocalProtectionError)
            }
        }
    }

    pub(super) fn next_msn(&mut self, qn: QueueNumber) -> Msn {
        let i = qn.index().unwrap_or(0);
        let msn = self.tx_msn[i];
        self.tx_msn[i] = msn.next();
        msn
    }
}

/// The opcode of a Send: solicited or not, with an STag to invalidate or not.
fn send_opcode(solicited: bool, invalidate: bool) -> Opcode {
    match (solicited, invalidate) {
        (false, false) => Opcode::Send,
        (true, false) => Opcode::SendSe,
        (false, true) => Opcode::SendInvalidate,
        (true, true) => Opcode::SendSeInvalidate,
    }
}

/// Emits the next segment of `t` into `buf`: header, then the payload read from its source
/// (or, with `refs` and a payload from registered memory of at least its minimum, the header
/// only, the payload's pieces appended to the list). `Ok(None)` if there is no segment left
/// (or `buf` is too short); an error if the source could not be read. Counts each segment
/// emitted in `segments`. A free function, not a method, so that the queue pair's message
/// is worked on where it lies (moving it out and back cost more than the rest of a small
/// Send's segment).
fn emit_segment(
    mem: &TableMemory<'_>,
    t: &mut TxMessage,
    buf: &mut [u8],
    refs: Option<(&mut Vec<TxPiece>, usize)>,
    segments: &mut u64,
) -> Result<Option<Emitted>, AccessError> {
    let Some((header, range)) = t.segments.next() else { return Ok(None) };
    let hlen = header.header_len();
    let offset = range.start as u64;
    let by_ref = match (&t.source, refs) {
        (Source::Local(_) | Source::Remote { .. }, Some((pieces, min)))
            if !range.is_empty() && range.len() >= min =>
        {
            Some(pieces)
        }
        _ => None,
    };
    if let Some(pieces) = by_ref {
        let Some(hdr) = buf.get_mut(..hlen) else { return Ok(None) };
        if header.emit(hdr).is_err() {
            return Ok(None);
        }
        let len = range.len();
        match &t.source {
            Source::Local(sgl) => mem.sgl_pieces(sgl, offset, len, |stag, to, len| {
                pieces.push(TxPiece { stag, to, len, needed: Access::NONE });
            })?,
            Source::Remote { stag, to } => {
                let to = to.checked_add(offset).ok_or(AccessError::ToWrap)?;
                mem.check(*stag, to, len as u64, Access::REMOTE_READ)?;
                pieces.push(TxPiece { stag: *stag, to, len, needed: Access::REMOTE_READ });
            }
            Source::Inline(_) => {}
        }
        *segments += 1;
        return Ok(Some(Emitted { written: hlen, by_ref: len }));
    }
    let total = hlen + range.len();
    let Some(out) = buf.get_mut(..total) else { return Ok(None) };
    let (hdr, payload) = out.split_at_mut(hlen);
    if header.emit(hdr).is_err() {
        return Ok(None);
    }
    match &t.source {
        Source::Local(sgl) => mem.gather_sgl(sgl, offset, payload)?,
        // A zero-length response reads nothing (the Read RTR names no real buffer).
        Source::Remote { .. } if payload.is_empty() => {}
        Source::Remote { stag, to } => {
            let to = to.checked_add(offset).ok_or(AccessError::ToWrap)?;
            mem.fetch_tagged(*stag, to, payload, Access::REMOTE_READ)?;
        }
        Source::Inline(bytes) => match bytes.get(range) {
            Some(b) => payload.copy_from_slice(b),
            None => return Ok(None),
        },
    }
    *segments += 1;
    Ok(Some(Emitted { written: total, by_ref: 0 }))
}
