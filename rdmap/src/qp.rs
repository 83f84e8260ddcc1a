//! The RDMAP queue pair (RFC 5040 sections 5-7): send and receive queues, RDMA Write, Read and
//! the Send variants, ORD/IRD, completions, Terminate and flushing. Sans-IO: DDP segments
//! (ULPDUs) come in through [`QueuePair::handle_ulpdu`] and go out through
//! [`QueuePair::poll_transmit`]; memory is reached through [`Memory`].
//!
//! States (RFC 5040 section 6 and the verbs QP states it maps to):
//!
//! ```text
//!   Rts --(local error: Terminate queued)--> Terminate --(Terminate sent)--> Error
//!   Rts --(Terminate received / LLP lost)--------------------------------> Error
//!   Rts --(close)--> Closing --(queues drained)--> Error
//! ```
//!
//! "Only the first error counts": once the QP has left `Rts`, later errors are ignored. On
//! leaving `Rts` every work request not yet completed completes exactly once with
//! [`WcStatus::WrFlushError`] (those already finished complete with their own status, in
//! posting order), and work posted afterwards is flushed at once, as verbs do.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use iwarp_ddp::header::{SegmentKind, SegmentRepr, UNTAGGED_HEADER_LEN};
use iwarp_ddp::stag_table::{Access, AccessError};
use iwarp_ddp::{
    MessageTarget, Msn, QueueNumber, STag, Segmenter, TaggedOffset, TerminateCode, UntaggedError,
    UntaggedQueues,
};

use iwarp_mpa::RtrType;

use crate::atomic::{
    ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, AtomicOp, AtomicRequest, AtomicResponse, IMMEDIATE_DATA_LEN,
    ImmediateData,
};
use crate::memory::{Memory, Sge, Sgl, gather, scatter, sgl_len};
use crate::terminate::{RdmapError, TerminateMessage};
use crate::wire::{Control, Opcode, RDMAP_VERSION, READ_REQUEST_LEN, ReadRequest, TerminateHeader};

/// Queue-pair settings, fixed when the connection reaches RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Largest ULPDU (DDP segment) to send: MPA's MULPDU.
    pub mulpdu: usize,
    /// Inbound Read Requests this side accepts outstanding (negotiated IRD).
    pub ird: u16,
    /// Outbound Read Requests this side may have outstanding (negotiated ORD).
    pub ord: u16,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth.
    pub max_recv_wr: usize,
    /// The peer takes the RFC 7306 extensions (Immediate Data, Atomics). Negotiated per
    /// connection: siw does not, so posting them to a siw peer is an API error.
    pub rfc7306: bool,
}

impl Default for QpConfig {
    fn default() -> QpConfig {
        QpConfig { mulpdu: 1442, ird: 1, ord: 1, max_send_wr: 128, max_recv_wr: 128, rfc7306: false }
    }
}

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send the gathered bytes to the peer's next receive buffer.
    Send {
        /// Solicited event (the peer's completion wakes a solicited-only waiter).
        solicited: bool,
        /// Invalidate this STag on the peer when the message arrives.
        invalidate: Option<STag>,
    },
    /// RDMA Write the gathered bytes to `remote_to` of the peer's `remote_stag`.
    Write {
        /// Peer's STag (needs remote write rights there).
        remote_stag: STag,
        /// Peer's tagged offset.
        remote_to: u64,
    },
    /// RDMA Read from `remote_to` of the peer's `remote_stag` into the (single-element) local
    /// list, whose lkey the peer's Read Response names as its sink STag.
    Read {
        /// Peer's STag (needs remote read rights there).
        remote_stag: STag,
        /// Peer's tagged offset.
        remote_to: u64,
    },
    /// RFC 7306 Immediate Data: 8 bytes delivered in the peer's receive completion (it
    /// consumes one of the peer's receive buffers, whose bytes stay untouched).
    ImmediateData {
        /// The data.
        data: [u8; IMMEDIATE_DATA_LEN],
        /// Immediate Data with Solicited Event.
        solicited: bool,
    },
    /// RFC 7306 RDMA Write with Immediate Data: an RDMA Write followed by an Immediate Data
    /// message; one completion.
    WriteImmediate {
        /// Peer's STag (needs remote write rights there).
        remote_stag: STag,
        /// Peer's tagged offset.
        remote_to: u64,
        /// The immediate data.
        data: [u8; IMMEDIATE_DATA_LEN],
        /// The Immediate Data message asks for a solicited event.
        solicited: bool,
    },
    /// RFC 7306 Send with Immediate Data: a Send (its bytes into the peer's next receive
    /// buffer) followed by an Immediate Data message (which takes the buffer after it, the
    /// data in its completion); one completion here.
    SendImmediate {
        /// The immediate data.
        data: [u8; IMMEDIATE_DATA_LEN],
        /// The Immediate Data message asks for a solicited event.
        solicited: bool,
    },
    /// RFC 7306 Atomic operation on the 64-bit value at `remote_to` of the peer's
    /// `remote_stag`; the original value lands, as a native-endian `u64`, in the single
    /// 8-byte local element.
    Atomic {
        /// Peer's STag (needs remote atomic rights there).
        remote_stag: STag,
        /// Peer's tagged offset (8-byte aligned).
        remote_to: u64,
        /// The operation.
        op: AtomicOp,
        /// Add Data (FetchAdd) or Swap Data (Swap, CompareSwap).
        data: u64,
        /// Add Mask or Swap Mask.
        data_mask: u64,
        /// Compare Data (CompareSwap).
        compare: u64,
        /// Compare Mask (CompareSwap).
        compare_mask: u64,
    },
}

impl SendOp {
    /// The opcode of this operation's completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } | SendOp::SendImmediate { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteImmediate { .. } => WcOpcode::Write,
            SendOp::Read { .. } => WcOpcode::Read,
            SendOp::ImmediateData { .. } => WcOpcode::ImmediateData,
            SendOp::Atomic { .. } => WcOpcode::Atomic,
        }
    }

    /// Whether the operation is an RFC 7306 extension (to be posted only to peers that take
    /// them).
    pub fn is_rfc7306(&self) -> bool {
        matches!(
            self,
            SendOp::ImmediateData { .. }
                | SendOp::WriteImmediate { .. }
                | SendOp::SendImmediate { .. }
                | SendOp::Atomic { .. }
        )
    }

    /// Whether the operation takes an ORD slot (a Read or Atomic Request).
    fn uses_ord(&self) -> bool {
        matches!(self, SendOp::Read { .. } | SendOp::Atomic { .. })
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local buffers: the source of a Send or Write, the sink of a Read.
    pub sgl: Sgl,
    /// Generate a completion on success (errors and flushes always complete).
    pub signaled: bool,
}

/// A receive-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send's bytes go.
    pub sgl: Sgl,
}

impl SendWr {
    /// Checks the work request against the queue pair's settings: the one validation both
    /// the application's post and the queue pair run, so that a request refused later would
    /// already be refused at post time.
    pub fn validate(&self, config: &QpConfig) -> Result<(), PostError> {
        if u32::try_from(sgl_len(&self.sgl)).is_err() {
            return Err(PostError::TooLong);
        }
        if self.op.is_rfc7306() && !config.rfc7306 {
            return Err(PostError::ExtensionNotNegotiated);
        }
        match self.op {
            SendOp::Read { .. } if self.sgl.len() != 1 => Err(PostError::ReadNeedsOneSge),
            SendOp::ImmediateData { .. } if !self.sgl.is_empty() => Err(PostError::BadSgl),
            SendOp::Atomic { .. } if self.sgl.len() != 1 || self.sgl.first().map(|s| s.len) != Some(8) => {
                Err(PostError::BadSgl)
            }
            _ => Ok(()),
        }
    }
}

impl RecvWr {
    /// Checks the receive buffer: its total length must fit a message length (32 bits).
    pub fn validate(&self) -> Result<(), PostError> {
        match u32::try_from(sgl_len(&self.sgl)) {
            Ok(_) => Ok(()),
            Err(_) => Err(PostError::TooLong),
        }
    }
}

/// Completion status, as verbs names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local buffer was not accessible (bad lkey, bounds, rights).
    LocalProtectionError,
    /// The incoming message did not fit the receive buffer.
    LocalLengthError,
    /// The peer reported a protection error for this operation.
    RemoteAccessError,
    /// The peer reported an operation error.
    RemoteOperationError,
    /// The queue pair left RTS before this request completed.
    WrFlushError,
}

/// Which operation a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send variant.
    Send,
    /// An RDMA Write.
    Write,
    /// An RDMA Read.
    Read,
    /// An RFC 7306 Immediate Data message sent.
    ImmediateData,
    /// An RFC 7306 Atomic operation.
    Atomic,
    /// A received Send.
    Recv,
    /// A received RFC 7306 Immediate Data message ([`Completion::imm_data`]).
    RecvImmediate,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// The outcome.
    pub status: WcStatus,
    /// The operation.
    pub opcode: WcOpcode,
    /// Bytes transferred (received, for a receive).
    pub byte_len: u64,
    /// A received Send asked for a solicited event.
    pub solicited: bool,
    /// A received Send with Invalidate invalidated this STag.
    pub invalidated: Option<STag>,
    /// The data of a received Immediate Data message.
    pub imm_data: Option<[u8; IMMEDIATE_DATA_LEN]>,
}

impl Completion {
    /// The completion of a work request flushed when its queue pair left RTS.
    pub fn flushed(wr_id: u64, opcode: WcOpcode) -> Completion {
        Completion {
            wr_id,
            status: WcStatus::WrFlushError,
            opcode,
            byte_len: 0,
            solicited: false,
            invalidated: None,
            imm_data: None,
        }
    }
}

/// Queue-pair states (RFC 5040 section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Ready to send and receive.
    Rts,
    /// A local error queued a Terminate that has not been sent yet.
    Terminate,
    /// Closing gracefully: no new work, draining.
    Closing,
    /// Done; every work request has completed.
    Error,
}

/// Something the application must hear about, apart from completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// This side found a peer violation and terminated the stream with `code`.
    LocalTerminate(TerminateCode),
    /// The peer terminated the stream; `header` read the RFC way, `siw` the way Linux siw lays
    /// it out (both given: the peer's layout is not known).
    RemoteTerminate {
        /// RFC 5040 layout.
        header: TerminateHeader,
        /// siw's bit-field layout.
        siw: TerminateHeader,
    },
    /// The lower layer went away with the queue pair in RTS.
    LlpLost,
}

/// Why a work request could not be posted (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full.
    QueueFull,
    /// An RDMA Read needs exactly one local element (its sink buffer).
    ReadNeedsOneSge,
    /// A message longer than 2^32 - 1 bytes.
    TooLong,
    /// An RFC 7306 operation to a peer not configured as taking them ([`QpConfig::rfc7306`]).
    ExtensionNotNegotiated,
    /// An Atomic needs exactly one 8-byte local element; Immediate Data takes none.
    BadSgl,
    /// The queue pair takes its receive buffers from a shared receive queue.
    UsesSrq,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PostError::QueueFull => "work queue full",
            PostError::ReadNeedsOneSge => "an RDMA Read needs exactly one local SGE",
            PostError::TooLong => "message longer than 4 GiB - 1",
            PostError::ExtensionNotNegotiated => {
                "RFC 7306 operation (immediate data, atomics) to a peer that does not take them"
            }
            PostError::BadSgl => "an atomic needs one 8-byte SGE, immediate data none",
            PostError::UsesSrq => "the queue pair receives through a shared receive queue",
        })
    }
}

impl std::error::Error for PostError {}

/// A send-queue entry in posting order, until its completion is delivered.
#[derive(Debug)]
struct SqSlot {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
    len: u64,
    signaled: bool,
    status: Option<WcStatus>,
}

/// The message being transmitted on one of the two transmit streams.
#[derive(Debug)]
struct TxMessage {
    seq: Option<u64>,
    segments: Segmenter,
    source: Source,
}

#[derive(Debug)]
enum Source {
    /// Bytes gathered from local buffers.
    Local(Sgl),
    /// A Read Response's bytes from our region `stag` at `to`.
    Remote { stag: STag, to: u64 },
    /// Bytes held by the queue pair (a Read Request body, a Terminate).
    Inline(Vec<u8>),
}

/// A Read or Atomic Request in flight, holding an ORD slot until its response is in.
#[derive(Debug)]
struct Outbound {
    seq: u64,
    kind: OutboundKind,
}

#[derive(Debug)]
enum OutboundKind {
    Read { sink: STag, sink_to: u64, len: u64, received: u64 },
    Atomic { request_id: u32, sink: Sge },
}

/// A response owed to the peer for one of its Read or Atomic Requests (an IRD slot).
#[derive(Debug)]
enum Response {
    Read(ReadRequest),
    Atomic(AtomicResponse),
}

/// A shared receive queue: receive buffers any of the queue pairs attached to it may take,
/// one per incoming message, in posting order.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<Mutex<SrqInner>>,
}

#[derive(Debug)]
struct SrqInner {
    wrs: VecDeque<RecvWr>,
    max: usize,
}

impl SharedReceiveQueue {
    /// A shared receive queue holding at most `max` buffers.
    pub fn new(max: usize) -> SharedReceiveQueue {
        SharedReceiveQueue { inner: Arc::new(Mutex::new(SrqInner { wrs: VecDeque::new(), max })) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SrqInner> {
        // A panic while holding the lock cannot leave the queue inconsistent (each operation
        // is a single push or pop), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Posts a receive buffer.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let mut q = self.lock();
        if q.wrs.len() >= q.max {
            return Err(PostError::QueueFull);
        }
        q.wrs.push_back(wr);
        Ok(())
    }

    /// Buffers posted and not yet taken.
    pub fn len(&self) -> usize {
        self.lock().wrs.len()
    }

    /// Whether no buffer is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take(&self) -> Option<RecvWr> {
        self.lock().wrs.pop_front()
    }
}

/// Counters a test or a monitor may read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// ULPDUs handed to the transport.
    pub tx_segments: u64,
    /// ULPDUs received.
    pub rx_segments: u64,
}

/// One end of an RDMAP stream.
#[derive(Debug)]
pub struct QueuePair {
    config: QpConfig,
    state: QpState,
    next_seq: u64,
    sq: VecDeque<(u64, SendWr)>,
    sq_slots: VecDeque<SqSlot>,
    rq: VecDeque<RecvWr>,
    rx_queues: UntaggedQueues,
    tx_msn: [Msn; 4],
    tx_cur: Option<TxMessage>,
    /// The Immediate Data message that follows the Write of a Write with Immediate Data.
    tx_next: Option<TxMessage>,
    resp_pending: VecDeque<Response>,
    resp_cur: Option<TxMessage>,
    prefer_response: bool,
    outbound: VecDeque<Outbound>,
    srq: Option<SharedReceiveQueue>,
    terminate: Option<TxMessage>,
    /// Bytes and flags of the Send being received: (solicited, invalidate).
    rx_send: Option<(bool, Option<STag>)>,
    completions: VecDeque<Completion>,
    events: VecDeque<QpEvent>,
    stats: QpStats,
    /// Send-queue work requests retired so far (completed, flushed, or done unsignaled).
    sq_retired: u64,
}

const QN_SEND: QueueNumber = QueueNumber::Send;
const QN_READ: QueueNumber = QueueNumber::ReadRequest;
const QN_TERMINATE: QueueNumber = QueueNumber::Terminate;
const QN_ATOMIC_RESPONSE: QueueNumber = QueueNumber::AtomicResponse;
/// The sequence number of the internal Read RTR: no work request, so no completion.
const RTR_SEQ: u64 = u64::MAX;
/// The DDP buffer an IRD slot offers: room for a Read Request or an Atomic Request.
const IRD_SLOT_LEN: u64 =
    if ATOMIC_REQUEST_LEN > READ_REQUEST_LEN { ATOMIC_REQUEST_LEN as u64 } else { READ_REQUEST_LEN as u64 };
/// Room for a received Terminate: control word, segment length, DDP header, Read Request.
const TERMINATE_MAX: u64 = 4 + 2 + UNTAGGED_HEADER_LEN as u64 + READ_REQUEST_LEN as u64;

impl QueuePair {
    /// A queue pair in RTS with the negotiated `config`.
    pub fn new(config: QpConfig) -> QueuePair {
        let depth = config.max_recv_wr.max(usize::from(config.ird)).max(1);
        let mut rx_queues = UntaggedQueues::new(depth);
        // DDP buffers for the RDMAP-owned queues: IRD Read Request slots and one Terminate.
        for _ in 0..config.ird {
            let _ = rx_queues.post(QN_READ, IRD_SLOT_LEN);
        }
        let _ = rx_queues.post(QN_TERMINATE, TERMINATE_MAX);
        QueuePair {
            config,
            state: QpState::Rts,
            next_seq: 0,
            sq: VecDeque::new(),
            sq_slots: VecDeque::new(),
            rq: VecDeque::new(),
            rx_queues,
            tx_msn: [Msn(1); 4],
            tx_cur: None,
            tx_next: None,
            resp_pending: VecDeque::new(),
            resp_cur: None,
            prefer_response: false,
            outbound: VecDeque::new(),
            srq: None,
            terminate: None,
            rx_send: None,
            completions: VecDeque::new(),
            events: VecDeque::new(),
            stats: QpStats::default(),
            sq_retired: 0,
        }
    }

    /// A queue pair in RTS that takes its receive buffers from `srq`.
    pub fn with_srq(config: QpConfig, srq: SharedReceiveQueue) -> QueuePair {
        let mut qp = QueuePair::new(config);
        qp.srq = Some(srq);
        qp
    }

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

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }

    /// Send-queue work requests retired since the queue pair was made: completed (signaled
    /// or not), failed or flushed. Posted minus retired is what occupies the send queue.
    pub fn sq_retired(&self) -> u64 {
        self.sq_retired
    }

    /// Posts a send-queue work request. In a state other than RTS it is flushed at once.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.sq_slots.len() >= self.config.max_send_wr {
            return Err(PostError::QueueFull);
        }
        wr.validate(&self.config)?;
        let len = sgl_len(&wr.sgl);
        let opcode = wr.op.wc_opcode();
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = SqSlot { seq, wr_id: wr.wr_id, opcode, len, signaled: wr.signaled, status: None };
        self.sq_slots.push_back(slot);
        if self.state == QpState::Rts {
            self.sq.push_back((seq, wr));
        } else {
            self.finish(seq, WcStatus::WrFlushError);
        }
        Ok(())
    }

    /// Posts a receive buffer. In a state other than RTS it is flushed at once.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::UsesSrq);
        }
        if self.state != QpState::Rts {
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
            return Ok(());
        }
        if self.rq.len() >= self.config.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        wr.validate()?;
        self.rx_queues.post(QN_SEND, sgl_len(&wr.sgl)).map_err(|_| PostError::QueueFull)?;
        self.rq.push_back(wr);
        Ok(())
    }

    /// The next completion, in the order RFC 5040 section 5.3 allows: send-queue completions
    /// in posting order, receive completions in message order.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// Asks for a graceful close: no new work is accepted; what is queued is flushed.
    pub fn close(&mut self) {
        if self.state == QpState::Rts {
            self.state = QpState::Closing;
            self.flush_all();
            self.state = QpState::Error;
        }
    }

    /// The lower layer (TCP/MPA) is gone.
    pub fn handle_llp_lost(&mut self) {
        if matches!(self.state, QpState::Rts | QpState::Terminate | QpState::Closing) {
            if self.state == QpState::Rts {
                self.events.push_back(QpEvent::LlpLost);
            }
            self.terminate = None;
            self.flush_all();
            self.state = QpState::Error;
        }
    }

    /// A local lower-layer error (MPA CRC, marker, framing) found in the peer's bytes: the
    /// stream is terminated with `code` (LLP layer), copying nothing.
    pub fn handle_llp_error(&mut self, code: TerminateCode) {
        self.fail(code, None);
    }

    // --- receive path -------------------------------------------------------------------

    /// Processes one received ULPDU (a DDP segment). Peer violations terminate the stream
    /// (see [`QueuePair::poll_event`]); nothing here panics or writes outside the regions
    /// the checks allow.
    pub fn handle_ulpdu(&mut self, mem: &mut impl Memory, ulpdu: &[u8]) {
        if !matches!(self.state, QpState::Rts | QpState::Closing) {
            return;
        }
        self.stats.rx_segments += 1;
        let seg = match SegmentRepr::parse(ulpdu) {
            Ok(s) => s,
            Err(e) => {
                // Too short to be a DDP segment: an FPDU that cannot carry one, an LLP framing
                // problem from DDP's point of view.
                let code = e.terminate_code().unwrap_or(TerminateCode {
                    layer: iwarp_ddp::TerminateLayer::Llp,
                    error_type: 0,
                    code: 0x03,
                });
                return self.fail(code, Some(ulpdu));
            }
        };
        let control = Control::from_byte(seg.header.rdmap_control);
        let tagged = matches!(seg.header.kind, SegmentKind::Tagged { .. });
        let op = control.opcode;
        let result = if control.version != RDMAP_VERSION {
            Err(RdmapError::InvalidVersion { version: control.version }.terminate_code())
        } else if op.is_tagged() != tagged
            || matches!(op, Opcode::Unknown(_))
            || (op.is_extension() && !self.config.rfc7306)
        {
            Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code())
        } else {
            match seg.header.kind {
                SegmentKind::Tagged { stag, to } => self.rx_tagged(mem, op, stag, to, &seg),
                SegmentKind::Untagged { .. } => self.rx_untagged(mem, op, &seg),
            }
        };
        if let Err(code) = result {
            self.fail(code, Some(ulpdu));
        }
    }

    fn rx_tagged(
        &mut self,
        mem: &mut impl Memory,
        op: Opcode,
        stag: STag,
        to: TaggedOffset,
        seg: &SegmentRepr<'_>,
    ) -> Result<(), TerminateCode> {
        let placement_error = |e: AccessError| e.terminate_code();
        match op {
            // A zero-length Write places nothing and is not checked: it is the RFC 6581 RTR
            // message, which siw sends with STag 1, an STag nobody registered.
            Opcode::Write if seg.payload.is_empty() => Ok(()),
            Opcode::Write => {
                mem.place(stag, to.0, seg.payload, Access::REMOTE_WRITE).map_err(placement_error)
            }
            Opcode::ReadResponse => {
                // Read Responses arrive in the order of the Read Requests (RFC 5040 5.5).
                let Some(Outbound { seq, kind: OutboundKind::Read { sink, sink_to, len, received } }) =
                    self.outbound.front_mut()
                else {
                    return Err(RdmapError::UnexpectedReadResponse.terminate_code());
                };
                if stag != *sink || Some(to.0) != sink_to.checked_add(*received) {
                    return Err(AccessError::StagNotAssociated.terminate_code());
                }
                let n = seg.payload.len() as u64;
                if *received + n > *len {
                    return Err(AccessError::BaseOrBounds.terminate_code());
                }
                if n > 0 {
                    mem.place(stag, to.0, seg.payload, Access::LOCAL_WRITE).map_err(placement_error)?;
                }
                *received += n;
                if seg.header.last {
                    if *received != *len {
                        return Err(RdmapError::CatastrophicStream.terminate_code());
                    }
                    let seq = *seq;
                    self.outbound.pop_front();
                    self.finish(seq, WcStatus::Success);
                }
                Ok(())
            }
            _ => Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code()),
        }
    }

    fn rx_untagged(
        &mut self,
        mem: &mut impl Memory,
        op: Opcode,
        seg: &SegmentRepr<'_>,
    ) -> Result<(), TerminateCode> {
        let SegmentKind::Untagged { rdmap_word, qn, mo, .. } = seg.header.kind else {
            return Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code());
        };
        let expected_qn = op.queue().map(QueueNumber::from);
        if expected_qn != Some(qn) {
            // A known opcode on another queue than its own.
            return Err(UntaggedError::InvalidQn(qn).terminate_code().unwrap_or(TerminateCode::ddp(2, 0x01)));
        }
        if qn == QN_READ && mo == 0 && self.rx_queues.posted(QN_READ) == Some(0) {
            return Err(RdmapError::IrdExceeded { ird: u32::from(self.config.ird) }.terminate_code());
        }
        if qn == QN_SEND && mo == 0 && self.rx_queues.posted(QN_SEND) == Some(0) {
            self.take_from_srq();
        }
        let immediate = matches!(op, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        // Immediate Data consumes a receive buffer but places nothing in it.
        let placed_len = if immediate { 0 } else { seg.payload.len() };
        let placed = match self.rx_queues.accept(seg.header.kind, seg.header.last, placed_len) {
            Ok(p) => p,
            Err(e) => {
                if qn == QN_SEND && matches!(e, UntaggedError::MessageTooLong { .. }) {
                    // The receive the message was meant for fails as too short (verbs'
                    // IBV_WC_LOC_LEN_ERR), then the stream is terminated.
                    self.fail_front_recv(WcStatus::LocalLengthError);
                }
                return Err(e.terminate_code().unwrap_or(TerminateCode::ddp(2, 0x01)));
            }
        };
        let whole = |expected: usize| {
            if seg.header.last && placed.offset == 0 && seg.payload.len() == expected {
                Ok(())
            } else {
                // A request or immediate message longer (or shorter) than its fixed body.
                Err(TerminateCode::ddp(2, 0x05))
            }
        };
        match op {
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let solicited = matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate);
                let invalidate = matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
                    .then_some(STag(rdmap_word));
                self.rx_send.get_or_insert((solicited, invalidate));
                let Some(wr) = self.rq.front() else { return Err(TerminateCode::ddp(2, 0x02)) };
                if scatter(mem, &wr.sgl, u64::from(placed.offset), seg.payload).is_err() {
                    // The receive buffer's own elements could not be written (a bad lkey).
                    self.fail_front_recv(WcStatus::LocalProtectionError);
                    return Err(TerminateCode::ddp(2, 0x05));
                }
                if let Some(len) = placed.completed_len {
                    let (solicited, invalidate) = self.rx_send.take().unwrap_or((false, None));
                    if let Some(stag) = invalidate {
                        mem.invalidate(stag).map_err(|e| match e {
                            AccessError::StagNotAssociated | AccessError::AccessRights => {
                                RdmapError::InvalidateNotPermitted { stag }.terminate_code()
                            }
                            _ => RdmapError::CannotInvalidate { stag }.terminate_code(),
                        })?;
                    }
                    self.complete_recv(WcOpcode::Recv, len, solicited, invalidate, None);
                }
                Ok(())
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                whole(IMMEDIATE_DATA_LEN)?;
                let data = ImmediateData::parse(seg.payload).map_err(|_| TerminateCode::ddp(2, 0x05))?;
                let solicited = op == Opcode::ImmediateDataSe;
                self.complete_recv(WcOpcode::RecvImmediate, 0, solicited, None, Some(data.0));
                Ok(())
            }
            Opcode::ReadRequest => {
                whole(READ_REQUEST_LEN)?;
                let req = ReadRequest::parse(seg.payload).map_err(|_| TerminateCode::ddp(2, 0x05))?;
                // A zero-length Read reads nothing and is not checked: the RFC 6581 Read RTR.
                if req.size > 0 {
                    mem.check(STag(req.source_stag), req.source_to, u64::from(req.size), Access::REMOTE_READ)
                        .map_err(|e| RdmapError::Access(e).terminate_code())?;
                }
                self.resp_pending.push_back(Response::Read(req));
                Ok(())
            }
            Opcode::AtomicRequest => {
                whole(ATOMIC_REQUEST_LEN)?;
                let req = AtomicRequest::parse(seg.payload).map_err(|_| TerminateCode::ddp(2, 0x05))?;
                if let AtomicOp::Unknown(op) = req.op {
                    return Err(RdmapError::UnsupportedAtomicOp { op }.terminate_code());
                }
                let mut apply = |original: u64| req.apply_to(original).unwrap_or(original);
                let original = mem
                    .atomic(req.remote_stag, req.remote_to.0, &mut apply)
                    .map_err(|e| RdmapError::Access(e).terminate_code())?;
                let resp = AtomicResponse { request_id: req.request_id, original_data: original };
                self.resp_pending.push_back(Response::Atomic(resp));
                Ok(())
            }
            Opcode::AtomicResponse => {
                whole(ATOMIC_RESPONSE_LEN)?;
                let resp = AtomicResponse::parse(seg.payload).map_err(|_| TerminateCode::ddp(2, 0x05))?;
                let Some(Outbound { seq, kind: OutboundKind::Atomic { request_id, sink } }) =
                    self.outbound.front()
                else {
                    return Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code());
                };
                if *request_id != resp.request_id {
                    return Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code());
                }
                let (seq, sink) = (*seq, *sink);
                self.outbound.pop_front();
                let status = match scatter(mem, &[sink], 0, &resp.original_data.to_ne_bytes()) {
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
            _ => Err(RdmapError::UnexpectedOpcode { opcode: op }.terminate_code()),
        }
    }

    /// Completes the receive at the front of the queue with `status` (before a Terminate
    /// flushes the rest).
    fn fail_front_recv(&mut self, status: WcStatus) {
        self.rx_send = None;
        if let Some(wr) = self.rq.pop_front() {
            self.completions
                .push_back(Completion { status, ..Completion::flushed(wr.wr_id, WcOpcode::Recv) });
        }
    }

    /// Moves one buffer from the shared receive queue, if any, to this queue pair's queue 0.
    fn take_from_srq(&mut self) {
        let Some(wr) = self.srq.as_ref().and_then(SharedReceiveQueue::take) else { return };
        if self.rx_queues.post(QN_SEND, sgl_len(&wr.sgl)).is_ok() {
            self.rq.push_back(wr);
        } else {
            // Cannot happen (queue 0 had no buffer); the request still completes once.
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
        }
    }

    fn complete_recv(
        &mut self,
        opcode: WcOpcode,
        byte_len: u64,
        solicited: bool,
        invalidated: Option<STag>,
        imm_data: Option<[u8; IMMEDIATE_DATA_LEN]>,
    ) {
        if let Some(wr) = self.rq.pop_front() {
            self.completions.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::Success,
                opcode,
                byte_len,
                solicited,
                invalidated,
                imm_data,
            });
        }
    }

    // --- transmit path ------------------------------------------------------------------

    /// Writes the next ULPDU (one DDP segment) to send into `buf`, which must hold at least
    /// [`QpConfig::mulpdu`] bytes, and returns its length; `None` when there is nothing to
    /// send. Read Responses and the send queue take turns, so neither starves the other.
    pub fn poll_transmit(&mut self, mem: &mut impl Memory, buf: &mut [u8]) -> Option<usize> {
        if buf.len() < self.config.mulpdu {
            return None;
        }
        if let Some(mut t) = self.terminate.take() {
            let n = self.emit_segment(mem, &mut t, buf);
            if n.is_none() || t.segments.len() != 0 {
                self.terminate = Some(t);
            } else {
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
            let n = if response_turn { self.transmit_response(mem, buf) } else { self.transmit_sq(mem, buf) };
            if n.is_some() {
                return n;
            }
        }
        None
    }

    fn transmit_response(&mut self, mem: &mut impl Memory, buf: &mut [u8]) -> Option<usize> {
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
            self.resp_cur = Some(message.ok()?);
        }
        let mut t = self.resp_cur.take()?;
        let n = self.emit_segment(mem, &mut t, buf);
        if t.segments.len() == 0 {
            // The response is out: its IRD slot takes the next Read or Atomic Request.
            let _ = self.rx_queues.post(QN_READ, IRD_SLOT_LEN);
        } else {
            self.resp_cur = Some(t);
        }
        n
    }

    fn transmit_sq(&mut self, mem: &mut impl Memory, buf: &mut [u8]) -> Option<usize> {
        if self.tx_cur.is_none() {
            if let Some(next) = self.tx_next.take() {
                self.tx_cur = Some(next);
            } else {
                let (seq, wr) = self.sq.front()?;
                let (seq, uses_ord) = (*seq, wr.op.uses_ord());
                if uses_ord && self.outbound.len() >= usize::from(self.config.ord) {
                    return None; // ORD exhausted: the send queue waits for a response.
                }
                let (_, wr) = self.sq.pop_front()?;
                match self.start_message(seq, wr) {
                    Ok(m) => self.tx_cur = Some(m),
                    Err(status) => {
                        self.finish(seq, status);
                        return None;
                    }
                }
            }
        }
        let mut t = self.tx_cur.take()?;
        let n = self.emit_segment(mem, &mut t, buf);
        match n {
            None => {
                // A local buffer could not be read: the request fails, the QP goes to error.
                let seq = t.seq.or_else(|| self.tx_next.as_ref().and_then(|m| m.seq));
                if let Some(seq) = seq {
                    self.finish(seq, WcStatus::LocalProtectionError);
                }
                self.fail(RdmapError::LocalCatastrophic.terminate_code(), None);
            }
            Some(_) if t.segments.len() == 0 => {
                if let Some(seq) = t.seq {
                    // Send completion means "handed to the transport"; a Read or Atomic
                    // completes when its response has been placed.
                    if !self.outbound.iter().any(|o| o.seq == seq) {
                        self.finish(seq, WcStatus::Success);
                    }
                }
            }
            Some(_) => self.tx_cur = Some(t),
        }
        n
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

    fn start_message(&mut self, seq: u64, wr: SendWr) -> Result<TxMessage, WcStatus> {
        let len = usize::try_from(sgl_len(&wr.sgl)).map_err(|_| WcStatus::LocalLengthError)?;
        match wr.op {
            SendOp::Send { solicited, invalidate } => {
                let opcode = match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (true, false) => Opcode::SendSe,
                    (false, true) => Opcode::SendInvalidate,
                    (true, true) => Opcode::SendSeInvalidate,
                };
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
                let _ = self.rx_queues.post(QN_ATOMIC_RESPONSE, ATOMIC_RESPONSE_LEN as u64);
                let target = self.untagged(QN_READ, 0);
                let body = req.to_bytes().to_vec();
                self.message(Some(seq), target, Opcode::AtomicRequest, body.len(), Source::Inline(body))
            }
        }
    }

    fn next_msn(&mut self, qn: QueueNumber) -> Msn {
        let i = qn.index().unwrap_or(0);
        let msn = self.tx_msn[i];
        self.tx_msn[i] = msn.next();
        msn
    }

    /// Emits the next segment of `t` into `buf`: header, then the payload read from its
    /// source. `None` if the source could not be read.
    fn emit_segment(&mut self, mem: &mut impl Memory, t: &mut TxMessage, buf: &mut [u8]) -> Option<usize> {
        let (header, range) = t.segments.next()?;
        let hlen = header.header_len();
        let plen = range.len();
        let total = hlen + plen;
        let out = buf.get_mut(..total)?;
        let (hdr, payload) = out.split_at_mut(hlen);
        header.emit(hdr).ok()?;
        let offset = range.start as u64;
        let ok = match &t.source {
            Source::Local(sgl) => gather(mem, sgl, offset, payload).is_ok(),
            // A zero-length response reads nothing (the Read RTR names no real buffer).
            Source::Remote { .. } if payload.is_empty() => true,
            Source::Remote { stag, to } => to
                .checked_add(offset)
                .is_some_and(|to| mem.fetch(*stag, to, payload, Access::REMOTE_READ).is_ok()),
            Source::Inline(bytes) => match bytes.get(range) {
                Some(b) => {
                    payload.copy_from_slice(b);
                    true
                }
                None => false,
            },
        };
        if !ok {
            return None;
        }
        self.stats.tx_segments += 1;
        Some(total)
    }

    // --- errors, completions, flushing --------------------------------------------------

    /// Terminates the stream for a violation: queues the Terminate (RFC 5040 section 7),
    /// reports it, and flushes every outstanding work request. Only the first error counts.
    fn fail(&mut self, code: TerminateCode, offending: Option<&[u8]>) {
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

    /// Records the outcome of send-queue entry `seq` and delivers what can be delivered in
    /// posting order.
    fn finish(&mut self, seq: u64, status: WcStatus) {
        // Slots hold consecutive sequence numbers, oldest first: index by the difference.
        let index = self.sq_slots.front().and_then(|f| seq.checked_sub(f.seq));
        if let Some(slot) = index.and_then(|i| usize::try_from(i).ok()).and_then(|i| self.sq_slots.get_mut(i))
            && slot.seq == seq
            && slot.status.is_none()
        {
            slot.status = Some(status);
        }
        while let Some(slot) = self.sq_slots.front() {
            let Some(status) = slot.status else { break };
            if slot.signaled || status != WcStatus::Success {
                self.completions.push_back(Completion {
                    wr_id: slot.wr_id,
                    status,
                    opcode: slot.opcode,
                    byte_len: if status == WcStatus::Success { slot.len } else { 0 },
                    solicited: false,
                    invalidated: None,
                    imm_data: None,
                });
            }
            self.sq_slots.pop_front();
            self.sq_retired += 1;
        }
    }

    /// Completes every outstanding work request with a flush error, exactly once.
    fn flush_all(&mut self) {
        self.sq.clear();
        self.tx_cur = None;
        self.resp_cur = None;
        self.tx_next = None;
        self.resp_pending.clear();
        self.outbound.clear();
        self.rx_send = None;
        let pending: Vec<u64> = self.sq_slots.iter().filter(|s| s.status.is_none()).map(|s| s.seq).collect();
        for seq in pending {
            self.finish(seq, WcStatus::WrFlushError);
        }
        while let Some(wr) = self.rq.pop_front() {
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
        }
    }
}
