//! The receive path: each ULPDU is parsed, its RDMAP opcode checked against the DDP model it
//! came on, and DDP places it: tagged segments through the tagged buffer table, untagged ones
//! into the buffer posted on their queue ([`UntaggedReceiver`]). RDMAP then acts on complete
//! messages: receive completions, Read Requests queued for a response, atomics, Terminates.
//! Every violation is a [`Violation`]; nothing here panics or writes outside the regions the
//! checks allow.

use iwarp_ddp::header::{HeaderRepr, SegmentKind, SegmentRepr};
use iwarp_ddp::placement::{Payload, PostedBuffer, sgl_len};
use iwarp_ddp::stag_table::{Access, AccessError};
use iwarp_ddp::{QueueNumber, STag, TableMemory, TaggedOffset, UntaggedError};

use super::error::Violation;
use super::srq::SharedReceiveQueue;
use super::state::{
    Outbound, OutboundKind, QN_ATOMIC_RESPONSE, QN_READ, QN_SEND, QpEvent, QpState, QueuePair, Response,
    RxBuffer,
};
use super::wr::{Completion, WcOpcode, WcStatus};
use crate::atomic::{
    ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, AtomicOp, AtomicRequest, AtomicResponse, IMMEDIATE_DATA_LEN,
    ImmediateData,
};
use crate::terminate::RdmapError;
use crate::wire::{Control, Opcode, RDMAP_VERSION, READ_REQUEST_LEN, ReadRequest, TerminateHeader};

/// Where a segment's payload goes when the receive path reads it straight from the link
/// ([`QueuePair::direct_sink`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectSink {
    /// Tagged: the region bytes at `to` of `stag`, needing `needed` (an RDMA Write's remote
    /// write right, or local write for the sink of our Read).
    Tagged {
        /// The STag the segment names.
        stag: STag,
        /// The tagged offset of the payload's first byte.
        to: u64,
        /// The right the placement needs.
        needed: Access,
    },
    /// The scatter list of the receive at the front of queue 0, from message offset `mo`.
    Recv {
        /// The segment's message offset.
        mo: u64,
    },
}

/// The body of an RDMAP message of fixed size `expected`, which must have arrived whole, in
/// one segment, parsed by `parse`.
fn fixed_body<T, E>(
    opcode: Opcode,
    seg: &SegmentRepr<'_>,
    mo: u32,
    expected: usize,
    parse: impl FnOnce(&[u8]) -> Result<T, E>,
) -> Result<T, Violation> {
    let error = RdmapError::BodyLength { opcode, len: seg.payload.len(), expected };
    if !(seg.header.last && mo == 0 && seg.payload.len() == expected) {
        return Err(error.into());
    }
    parse(seg.payload).map_err(|_| error.into())
}

impl QueuePair {
    /// Processes one received ULPDU (a DDP segment). Peer violations terminate the stream
    /// (see [`QueuePair::poll_event`]); nothing here panics or writes outside the regions
    /// the checks allow.
    pub fn handle_ulpdu(&mut self, mem: &mut TableMemory<'_>, ulpdu: &[u8]) {
        if !matches!(self.state, QpState::Rts | QpState::Closing) {
            return;
        }
        self.stats.rx_segments += 1;
        let result = match SegmentRepr::parse(ulpdu) {
            Ok(seg) => self.rx_segment(mem, &seg, Payload::Bytes(seg.payload)),
            Err(e) => Err(Violation::Header(e)),
        };
        if let Err(v) = result {
            self.fail(v.terminate_code(), Some(ulpdu));
        }
    }

    /// Where the payload of a segment whose header has arrived, and not yet all of its
    /// payload, may go straight from the link ([`DirectSink`]): a tagged RDMA Write or Read
    /// Response, or a Send into the receive at the front of queue 0, that passes now the
    /// checks its placement will make. `None`: the segment is taken whole
    /// ([`QueuePair::handle_ulpdu`]), where any error is found and reported.
    pub fn direct_sink(
        &self,
        mem: &TableMemory<'_>,
        header: &[u8],
        payload_len: usize,
    ) -> Option<DirectSink> {
        if self.state != QpState::Rts || payload_len == 0 {
            return None;
        }
        let (header, _) = HeaderRepr::parse(header).ok()?;
        let control = Control::from_byte(header.rdmap_control);
        if control.version != RDMAP_VERSION {
            return None;
        }
        let len = payload_len as u64;
        match (control.opcode, header.kind) {
            (Opcode::Write, SegmentKind::Tagged { stag, to }) => {
                mem.check(stag, to.0, len, Access::REMOTE_WRITE).ok()?;
                Some(DirectSink::Tagged { stag, to: to.0, needed: Access::REMOTE_WRITE })
            }
            (Opcode::ReadResponse, SegmentKind::Tagged { stag, to }) => {
                let Some(Outbound {
                    kind: OutboundKind::Read { sink, sink_to, len: total, received }, ..
                }) = self.outbound.front()
                else {
                    return None;
                };
                let fits = *received + len <= *total && (!header.last || *received + len == *total);
                if stag != *sink || Some(to.0) != sink_to.checked_add(*received) || !fits {
                    return None;
                }
                mem.check(stag, to.0, len, Access::LOCAL_WRITE).ok()?;
                Some(DirectSink::Tagged { stag, to: to.0, needed: Access::LOCAL_WRITE })
            }
            (Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate, kind) => {
                let SegmentKind::Untagged { qn, mo, .. } = kind else { return None };
                if qn != QN_SEND {
                    return None;
                }
                let sgl = self.rx.sink(kind, header.last, payload_len)?;
                // Every element the payload falls on must take it now.
                let end = u64::from(mo).checked_add(len)?;
                (end <= sgl_len(sgl)).then_some(())?;
                Some(DirectSink::Recv { mo: u64::from(mo) })
            }
            _ => None,
        }
    }

    /// The bytes where payload bytes `[offset, offset + len)` of a segment taking the
    /// [`DirectSink`] `sink` go (fewer than `len` where a scatter element ends first),
    /// checked again now: the place may have gone since the segment's header arrived (a
    /// deregistration between engine passes), and then the error says why.
    pub fn direct_bytes<'m>(
        &self,
        mem: &'m mut TableMemory<'_>,
        sink: DirectSink,
        offset: usize,
        len: usize,
    ) -> Result<&'m mut [u8], AccessError> {
        let at = offset as u64;
        match sink {
            DirectSink::Tagged { stag, to, needed } => {
                let to = to.checked_add(at).ok_or(AccessError::ToWrap)?;
                mem.tagged_sink(stag, to, len, needed)
            }
            DirectSink::Recv { mo } => {
                let Some(sgl) = self.rx.front(QN_SEND).and_then(PostedBuffer::scatter_list) else {
                    return Err(AccessError::BaseOrBounds);
                };
                mem.sgl_sink(sgl, mo + at, len)
            }
        }
    }

    /// Processes a segment whose payload (`payload_len` bytes) was read straight into its
    /// [`DirectSink`]: `header` is the segment's header as received, `refused` the error
    /// [`QueuePair::direct_bytes`] gave part-way, if any. The same checks and actions as
    /// [`QueuePair::handle_ulpdu`], without the copy.
    pub fn handle_placed(
        &mut self,
        mem: &mut TableMemory<'_>,
        header: &[u8],
        payload_len: usize,
        refused: Option<AccessError>,
    ) {
        if !matches!(self.state, QpState::Rts | QpState::Closing) {
            return;
        }
        self.stats.rx_segments += 1;
        let result = match HeaderRepr::parse(header) {
            Ok((header, _)) => {
                let seg = SegmentRepr { header, payload: &[] };
                self.rx_segment(mem, &seg, Payload::InPlace { len: payload_len, refused })
            }
            Err(e) => Err(Violation::Header(e)),
        };
        if let Err(v) = result {
            self.fail(v.terminate_code(), Some(header));
        }
    }

    fn rx_segment(
        &mut self,
        mem: &mut TableMemory<'_>,
        seg: &SegmentRepr<'_>,
        payload: Payload<'_>,
    ) -> Result<(), Violation> {
        let control = Control::from_byte(seg.header.rdmap_control);
        let tagged = matches!(seg.header.kind, SegmentKind::Tagged { .. });
        let op = control.opcode;
        if control.version != RDMAP_VERSION {
            return Err(RdmapError::InvalidVersion { version: control.version }.into());
        }
        if op.is_tagged() != tagged
            || matches!(op, Opcode::Unknown(_))
            || (op.is_extension() && !self.config.rfc7306)
        {
            return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
        }
        match seg.header.kind {
            SegmentKind::Tagged { stag, to } => self.rx_tagged(mem, op, stag, to, seg, payload),
            SegmentKind::Untagged { .. } => self.rx_untagged(mem, op, seg, payload),
        }
    }

    fn rx_tagged(
        &mut self,
        mem: &mut TableMemory<'_>,
        op: Opcode,
        stag: STag,
        to: TaggedOffset,
        seg: &SegmentRepr<'_>,
        payload: Payload<'_>,
    ) -> Result<(), Violation> {
        match op {
            // A zero-length Write places nothing and is not checked: it is the RFC 6581 RTR
            // message, which siw sends with STag 1, an STag nobody registered.
            Opcode::Write if payload.is_empty() => Ok(()),
            Opcode::Write => mem.place(stag, to.0, payload, Access::REMOTE_WRITE).map_err(Violation::Tagged),
            Opcode::ReadResponse => {
                // Read Responses arrive in the order of the Read Requests (RFC 5040 5.5).
                let Some(Outbound { seq, kind: OutboundKind::Read { sink, sink_to, len, received } }) =
                    self.outbound.front_mut()
                else {
                    return Err(RdmapError::UnexpectedReadResponse.into());
                };
                if stag != *sink || Some(to.0) != sink_to.checked_add(*received) {
                    return Err(Violation::Tagged(AccessError::StagNotAssociated));
                }
                let n = payload.len() as u64;
                if *received + n > *len {
                    return Err(Violation::Tagged(AccessError::BaseOrBounds));
                }
                if n > 0 {
                    mem.place(stag, to.0, payload, Access::LOCAL_WRITE).map_err(Violation::Tagged)?;
                }
                *received += n;
                if seg.header.last {
                    if *received != *len {
                        return Err(RdmapError::CatastrophicStream.into());
                    }
                    let seq = *seq;
                    self.outbound.pop_front();
                    self.finish(seq, WcStatus::Success);
                }
                Ok(())
            }
            _ => Err(RdmapError::UnexpectedOpcode { opcode: op }.into()),
        }
    }

    fn rx_untagged(
        &mut self,
        mem: &mut TableMemory<'_>,
        op: Opcode,
        seg: &SegmentRepr<'_>,
        payload: Payload<'_>,
    ) -> Result<(), Violation> {
        let SegmentKind::Untagged { qn, mo, .. } = seg.header.kind else {
            return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
        };
        if op.queue().map(QueueNumber::from) != Some(qn) {
            // A known opcode on another queue than its own.
            return Err(UntaggedError::InvalidQn(qn).into());
        }
        if qn == QN_READ && mo == 0 && self.rx.posted(QN_READ) == 0 {
            return Err(RdmapError::IrdExceeded { ird: u32::from(self.config.ird) }.into());
        }
        if qn == QN_SEND && mo == 0 && self.rx.posted(QN_SEND) == 0 {
            self.take_from_srq();
        }
        // Every segment of a message carries the message's opcode: a later segment whose
        // opcode differs from the first one's (a Send SE continuing a Send) belongs to no
        // message, and places nothing.
        if qn == QN_SEND && mo > 0 && self.rx_send.is_some_and(|(first, _)| first != op) {
            return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
        }
        let immediate = matches!(op, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        // Immediate Data consumes a receive buffer but places nothing in it.
        let placed = if immediate { Payload::Bytes(&[]) } else { payload };
        let received = match self.rx.handle(mem, seg.header.kind, seg.header.last, placed) {
            Ok(r) => r,
            Err(e) => {
                match e {
                    // The receive the message was meant for fails as too short (verbs'
                    // IBV_WC_LOC_LEN_ERR), or with its own buffer unwritable, before the
                    // stream is terminated.
                    UntaggedError::MessageTooLong { .. } if qn == QN_SEND => {
                        self.fail_front_recv(WcStatus::LocalLengthError);
                    }
                    UntaggedError::LocalBuffer(_) if qn == QN_SEND => {
                        self.fail_front_recv(WcStatus::LocalProtectionError);
                    }
                    _ => {}
                }
                return Err(e.into());
            }
        };
        // The buffer a last segment consumed completes here, or, should the message turn out
        // bad, with a flush error: it is off the queue already, and completes exactly once.
        let mut completed = received.completed;
        let result = self.rx_message(mem, op, seg, &mut completed, received.placement.completed_len);
        if let Some(wr) = completed.and_then(RxBuffer::into_recv) {
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
        }
        result
    }

    /// Acts on an untagged segment DDP accepted (and placed): on a whole message, completes
    /// the receive `completed` holds (taking it), or acts on RDMAP's own message.
    fn rx_message(
        &mut self,
        mem: &mut TableMemory<'_>,
        op: Opcode,
        seg: &SegmentRepr<'_>,
        completed: &mut Option<RxBuffer>,
        completed_len: Option<u64>,
    ) -> Result<(), Violation> {
        let SegmentKind::Untagged { rdmap_word, mo, .. } = seg.header.kind else {
            return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
        };
        match op {
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let invalidate = matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
                    .then_some(STag(rdmap_word));
                self.rx_send.get_or_insert((op, invalidate));
                if let (Some(RxBuffer::Recv(_)), Some(len)) = (&*completed, completed_len) {
                    let (op, invalidate) = self.rx_send.take().unwrap_or((op, None));
                    let solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate);
                    if let Some(stag) = invalidate {
                        mem.invalidate_remote(stag).map_err(|e| {
                            if e.is_protection_error() {
                                RdmapError::InvalidateNotPermitted { stag }
                            } else {
                                RdmapError::CannotInvalidate { stag }
                            }
                        })?;
                    }
                    if let Some(wr) = completed.take().and_then(RxBuffer::into_recv) {
                        self.complete_recv(wr.wr_id, WcOpcode::Recv, len, solicited, invalidate, None);
                    }
                }
                Ok(())
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                let data = fixed_body(op, seg, mo, IMMEDIATE_DATA_LEN, ImmediateData::parse)?;
                let solicited = op == Opcode::ImmediateDataSe;
                if let Some(wr) = completed.take().and_then(RxBuffer::into_recv) {
                    self.complete_recv(wr.wr_id, WcOpcode::RecvImmediate, 0, solicited, None, Some(data.0));
                }
                Ok(())
            }
            Opcode::ReadRequest => {
                let req = fixed_body(op, seg, mo, READ_REQUEST_LEN, ReadRequest::parse)?;
                // No Read Response can reach a sink range that ends past 2^64 - 1 (its tagged
                // offsets would wrap): refused now, not kept in an IRD slot it would never leave.
                if req.sink_to.checked_add(u64::from(req.size)).is_none() {
                    return Err(RdmapError::ReadSinkWraps { sink_to: req.sink_to, size: req.size }.into());
                }
                // A zero-length Read reads nothing and is not checked: the RFC 6581 Read RTR.
                if req.size > 0 {
                    mem.check(STag(req.source_stag), req.source_to, u64::from(req.size), Access::REMOTE_READ)
                        .map_err(RdmapError::Access)?;
                }
                self.resp_pending.push_back(Response::Read(req));
                Ok(())
            }
            Opcode::AtomicRequest => {
                let req = fixed_body(op, seg, mo, ATOMIC_REQUEST_LEN, AtomicRequest::parse)?;
                if let AtomicOp::Unknown(op) = req.op {
                    return Err(RdmapError::UnsupportedAtomicOp { op: u32::from(op) }.into());
                }
                let apply = |original: u64| req.apply_to(original).unwrap_or(original);
                let original =
                    mem.atomic(req.remote_stag, req.remote_to.0, apply).map_err(RdmapError::Access)?;
                let resp = AtomicResponse { request_id: req.request_id, original_data: original };
                self.resp_pending.push_back(Response::Atomic(resp));
                Ok(())
            }
            Opcode::AtomicResponse => {
                let resp = fixed_body(op, seg, mo, ATOMIC_RESPONSE_LEN, AtomicResponse::parse)?;
                let Some(Outbound { seq, kind: OutboundKind::Atomic { request_id, sink } }) =
                    self.outbound.front()
                else {
                    return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
                };
                if *request_id != resp.request_id {
                    return Err(RdmapError::UnexpectedOpcode { opcode: op }.into());
                }
                let (seq, sink) = (*seq, *sink);
                self.outbound.pop_front();
                let status = match mem.place_sgl(&[sink], 0, &resp.original_data.to_ne_bytes()) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocalProtectionError,
                };
                self.finish(seq, status);
                Ok(())
            }
            Opcode::Terminate => {
                let header = TerminateHeader::parse(seg.payload).ok();
                let siw = TerminateHeader::parse_siw(seg.payload).ok();
                if let (Some(header), Some(siw)) = (header, siw) {
                    self.events.push_back(QpEvent::RemoteTerminate { header, siw });
                }
                self.terminate = None;
                self.flush_all();
                self.state = QpState::Error;
                Ok(())
            }
            _ => Err(RdmapError::UnexpectedOpcode { opcode: op }.into()),
        }
    }

    /// Moves one buffer from the shared receive queue, if any, to this queue pair's queue 0.
    fn take_from_srq(&mut self) {
        let Some(wr) = self.srq.as_ref().and_then(SharedReceiveQueue::take) else { return };
        if let Err((_, buffer)) = self.rx.post(QN_SEND, RxBuffer::Recv(wr))
            && let Some(wr) = buffer.into_recv()
        {
            // Cannot happen (queue 0 had no buffer); the request still completes once.
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
        }
    }

    /// Offers the next IRD slot (a response went out) or the DDP buffer for an Atomic
    /// Response (an Atomic Request goes out).
    pub(super) fn post_rdmap_buffer(&mut self, qn: QueueNumber) {
        let buffer = if qn == QN_ATOMIC_RESPONSE { RxBuffer::AtomicResponse } else { RxBuffer::IrdSlot };
        // The queues hold at least IRD (or max_recv_wr) buffers, and a slot is offered only
        // after one was taken; a refusal could only mean a full queue, which then already
        // holds enough buffers.
        let _ = self.rx.post(qn, buffer);
    }
}
