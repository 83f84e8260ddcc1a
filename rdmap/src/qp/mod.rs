//! The RDMAP queue pair (RFC 5040 sections 5-7): send and receive queues, RDMA Write, Read and
//! the Send variants, ORD/IRD, completions, Terminate and flushing. Sans-IO: DDP segments
//! (ULPDUs) come in through [`QueuePair::handle_ulpdu`] and go out through
//! [`QueuePair::poll_transmit`]; registered memory is reached through DDP's
//! [`TableMemory`](iwarp_ddp::TableMemory), which places and reads it.
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
//!
//! The files, one job each: [`wr`] (work requests and completions), [`srq`] (the shared
//! receive queue), `rx` (the receive path), `tx` (the transmit path and the memory work
//! requests), `complete` (completion order and flushing), [`error`] (peer violations and the
//! Terminate each one is reported with).

use std::collections::VecDeque;

use iwarp_ddp::header::UNTAGGED_HEADER_LEN;
use iwarp_ddp::{Msn, QueueNumber, STag, TerminateCode, UntaggedReceiver};

use crate::atomic::ATOMIC_REQUEST_LEN;
use crate::memory::sgl_len;
use crate::wire::{READ_REQUEST_LEN, TerminateHeader};

mod complete;
pub mod error;
mod rx;
pub mod srq;
mod tx;
pub mod wr;

pub use error::Violation;
pub use srq::SharedReceiveQueue;
pub use wr::{Completion, PostError, QpConfig, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

use complete::SqSlot;
use rx::RxBuffer;
use tx::{Outbound, Response, TxMessage};

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

/// Counters a test or a monitor may read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// ULPDUs handed to the transport.
    pub tx_segments: u64,
    /// ULPDUs received.
    pub rx_segments: u64,
}

/// One end of an RDMAP stream.
///
/// A Send from one queue pair into the other's posted receive, each with its own tagged
/// buffer table (what the engine lends a queue pair for one pass):
///
/// ```
/// use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TaggedBufferTable};
/// use iwarp_ddp::{RegionMemory, TableMemory};
/// use iwarp_rdmap::memory::Sge;
/// use iwarp_rdmap::qp::{QpConfig, QueuePair, RecvWr, SendOp, SendWr, WcStatus};
///
/// let pd = ProtectionDomainId(1);
/// let (mut ta, mut tb) = (TaggedBufferTable::new(8), TaggedBufferTable::new(8));
/// let spec = |access| RegionSpec { base_va: 0x1000, len: 5, access, addressing: Addressing::VirtualAddress };
/// let src = ta.register(pd, spec(Access::NONE), RegionMemory::new(b"hello".to_vec())).unwrap();
/// let dst = tb.register(pd, spec(Access::LOCAL_WRITE), RegionMemory::new(vec![0u8; 5])).unwrap();
/// let (mut a, mut b) = (QueuePair::new(QpConfig::default()), QueuePair::new(QpConfig::default()));
/// b.post_recv(RecvWr { wr_id: 2, sgl: Sge { lkey: dst, addr: 0x1000, len: 5 }.into() }).unwrap();
/// let op = SendOp::Send { solicited: false, invalidate: None };
/// a.post_send(SendWr { wr_id: 1, op, sgl: Sge { lkey: src, addr: 0x1000, len: 5 }.into(), signaled: true })
///     .unwrap();
/// let mut segment = vec![0u8; 1442];
/// let n = a.poll_transmit(&mut TableMemory { table: &mut ta, pd }, &mut segment).unwrap();
/// b.handle_ulpdu(&mut TableMemory { table: &mut tb, pd }, &segment[..n]);
/// assert_eq!(b.poll_completion().map(|c| (c.wr_id, c.status, c.byte_len)), Some((2, WcStatus::Success, 5)));
/// assert_eq!(tb.memory(dst).unwrap().to_vec(), b"hello");
/// ```
#[derive(Debug)]
pub struct QueuePair {
    config: QpConfig,
    state: QpState,
    next_seq: u64,
    sq: VecDeque<(u64, SendWr)>,
    sq_slots: VecDeque<SqSlot>,
    /// The untagged queues and what is posted on them: the application's receives on queue
    /// 0, RDMAP's own buffers on queues 1 to 3. DDP checks and places every untagged segment.
    rx: UntaggedReceiver<RxBuffer>,
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
        let mut rx = UntaggedReceiver::new(depth);
        // DDP buffers for the RDMAP-owned queues: IRD Read Request slots and one Terminate.
        for _ in 0..config.ird {
            let _ = rx.post(QN_READ, RxBuffer::IrdSlot);
        }
        let _ = rx.post(QN_TERMINATE, RxBuffer::Terminate);
        QueuePair {
            config,
            state: QpState::Rts,
            next_seq: 0,
            sq: VecDeque::new(),
            sq_slots: VecDeque::new(),
            rx,
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
        if self.rx.posted(QN_SEND) >= self.config.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        wr.validate()?;
        self.rx.post(QN_SEND, RxBuffer::Recv(wr)).map_err(|_| PostError::QueueFull)?;
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
}
