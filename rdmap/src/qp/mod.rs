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
//! Terminate each one is reported with), `state` (the queue pair's fields and records, which
//! the others act on).

use std::collections::VecDeque;

use iwarp_ddp::{Msn, TerminateCode, UntaggedReceiver};

mod complete;
pub mod error;
mod rx;
pub mod srq;
mod state;
mod tx;
pub mod wr;

pub use error::Violation;
pub use rx::DirectSink;
pub use srq::SharedReceiveQueue;
pub use tx::{Emitted, TxPiece};
pub use wr::{CheckedSendWr, Completion, PostError, QpConfig, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};

use state::{QN_READ, QN_SEND, QN_TERMINATE, RxBuffer, SqSlot};
pub use state::{QpEvent, QpState, QpStats, QueuePair};

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
        self.post_checked_send(wr.check(&self.config)?)
    }

    /// Posts a send-queue work request that [`SendWr::check`] validated already (a poster
    /// that checks on its own thread hands it over without the queue pair checking again).
    /// Only the check that depends on the connection, RFC 7306 operations, is repeated, in
    /// case the request was checked against other settings than this queue pair's.
    pub fn post_checked_send(&mut self, wr: CheckedSendWr) -> Result<(), PostError> {
        if self.sq_slots.len() >= self.config.max_send_wr {
            return Err(PostError::QueueFull);
        }
        if wr.wr().op.is_rfc7306() && !self.config.rfc7306 {
            return Err(PostError::ExtensionNotNegotiated);
        }
        let seq = self.add_slot(&wr);
        if self.state == QpState::Rts {
            self.sq.push_back(wr);
        } else {
            self.finish(seq, WcStatus::WrFlushError);
        }
        Ok(())
    }

    /// Posts every request of `wrs`, in order, as [`QueuePair::post_checked_send`] does each,
    /// leaving `wrs` empty; `refused` hears of each one refused (with its `wr_id`, its
    /// completion's opcode and why). A list that the queue pair takes whole (the usual case:
    /// room for all, RTS, no extension it did not negotiate) moves in one piece, or with an
    /// empty send queue, by swapping the two deques: no request is copied.
    pub fn post_checked_sends(
        &mut self,
        wrs: &mut VecDeque<CheckedSendWr>,
        mut refused: impl FnMut(u64, WcOpcode, PostError),
    ) {
        let whole = self.state == QpState::Rts
            && self.sq_slots.len() + wrs.len() <= self.config.max_send_wr
            && (self.config.rfc7306 || !wrs.iter().any(|wr| wr.wr().op.is_rfc7306()));
        if !whole {
            while let Some(wr) = wrs.pop_front() {
                let (wr_id, opcode) = (wr.wr().wr_id, wr.wr().op.wc_opcode());
                if let Err(e) = self.post_checked_send(wr) {
                    refused(wr_id, opcode, e);
                }
            }
            return;
        }
        for wr in wrs.iter() {
            self.add_slot(wr);
        }
        if self.sq.is_empty() {
            std::mem::swap(&mut self.sq, wrs);
        } else {
            self.sq.append(wrs);
        }
    }

    /// Gives `wr` the next sequence number and its slot in the send queue's completion order.
    #[inline]
    fn add_slot(&mut self, wr: &CheckedSendWr) -> u64 {
        let len = u64::from(wr.len());
        let (wr_id, opcode, signaled) = (wr.wr().wr_id, wr.wr().op.wc_opcode(), wr.wr().signaled);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sq_slots.push_back(SqSlot { seq, wr_id, opcode, len, signaled, status: None });
        seq
    }

    /// The sequence number of the send queue's oldest request (the next one's, when empty).
    pub(super) fn sq_front_seq(&self) -> u64 {
        self.next_seq - self.sq.len() as u64
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
        self.post_own_recv(wr)
    }

    /// Posts a receive on queue 0 of a queue pair in RTS without a shared receive queue.
    #[inline]
    fn post_own_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.rx.posted(QN_SEND) >= self.config.max_recv_wr {
            return Err(PostError::QueueFull);
        }
        wr.validate()?;
        self.rx.post(QN_SEND, RxBuffer::Recv(wr)).map_err(|_| PostError::QueueFull)?;
        Ok(())
    }

    /// Posts every receive of `wrs`, in order, as [`QueuePair::post_recv`] does each, leaving
    /// `wrs` empty; `refused` hears of each one refused (its `wr_id` and why). The state and
    /// the shared receive queue are looked at once for the list.
    pub fn post_recvs(&mut self, wrs: &mut VecDeque<RecvWr>, mut refused: impl FnMut(u64, PostError)) {
        if self.srq.is_some() {
            wrs.drain(..).for_each(|wr| refused(wr.wr_id, PostError::UsesSrq));
            return;
        }
        if self.state != QpState::Rts {
            let flushed = wrs.drain(..).map(|wr| Completion::flushed(wr.wr_id, WcOpcode::Recv));
            self.completions.extend(flushed);
            return;
        }
        for wr in wrs.drain(..) {
            let wr_id = wr.wr_id;
            if let Err(e) = self.post_own_recv(wr) {
                refused(wr_id, e);
            }
        }
    }

    /// The next completion, in the order RFC 5040 section 5.3 allows: send-queue completions
    /// in posting order, receive completions in message order.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// The completions [`QueuePair::poll_completion`] would hand out next, oldest first,
    /// without taking them.
    pub fn pending_completions(&self) -> impl ExactSizeIterator<Item = &Completion> {
        self.completions.iter()
    }

    /// Forgets every pending completion (for a caller that read them where they lie with
    /// [`QueuePair::pending_completions`]).
    pub fn clear_completions(&mut self) {
        self.completions.clear();
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
