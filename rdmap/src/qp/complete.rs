//! Completions: send-queue completions in posting order (RFC 5040 section 5.3), receive
//! completions in message order, and flushing every outstanding work request exactly once.

use iwarp_ddp::STag;

use super::state::{QN_SEND, QueuePair, RxBuffer, SqSlot};
use super::wr::{Completion, WcOpcode, WcStatus};
use crate::atomic::IMMEDIATE_DATA_LEN;

impl QueuePair {
    /// Records the outcome of send-queue entry `seq` and delivers what can be delivered in
    /// posting order.
    pub(super) fn finish(&mut self, seq: u64, status: WcStatus) {
        match self.sq_slots.front() {
            // The oldest request (a Send or Write finishing in order, as most do): retired
            // at once, without being marked first.
            Some(front) if front.seq == seq && front.status.is_none() => {
                if let Some(slot) = self.sq_slots.pop_front() {
                    self.retire(&slot, status);
                }
            }
            Some(front) => {
                // Slots hold consecutive sequence numbers, oldest first: index by the
                // difference. Marked, it waits for those before it.
                let index = seq.checked_sub(front.seq).and_then(|i| usize::try_from(i).ok());
                if let Some(slot) = index.and_then(|i| self.sq_slots.get_mut(i))
                    && slot.seq == seq
                    && slot.status.is_none()
                {
                    slot.status = Some(status);
                }
            }
            None => return,
        }
        while let Some(slot) = self.sq_slots.front() {
            let Some(status) = slot.status else { break };
            if let Some(slot) = self.sq_slots.pop_front() {
                self.retire(&slot, status);
            }
        }
    }

    /// Retires a send-queue request taken off the front: its completion, if it is signaled
    /// or failed, and its slot given back.
    #[inline]
    fn retire(&mut self, slot: &SqSlot, status: WcStatus) {
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
        self.sq_retired += 1;
    }

    /// Completes the receive `wr_id`, whose message arrived whole.
    #[inline(always)]
    pub(super) fn complete_recv(
        &mut self,
        wr_id: u64,
        opcode: WcOpcode,
        byte_len: u64,
        solicited: bool,
        invalidated: Option<STag>,
        imm_data: Option<[u8; IMMEDIATE_DATA_LEN]>,
    ) {
        self.completions.push_back(Completion {
            wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len,
            solicited,
            invalidated,
            imm_data,
        });
    }

    /// Completes the receive at the front of queue 0 with `status` (before a Terminate
    /// flushes the rest).
    pub(super) fn fail_front_recv(&mut self, status: WcStatus) {
        self.rx_send = None;
        if let Some(wr) = self.rx.discard_front(QN_SEND).and_then(RxBuffer::into_recv) {
            self.completions
                .push_back(Completion { status, ..Completion::flushed(wr.wr_id, WcOpcode::Recv) });
        }
    }

    /// Completes every outstanding work request with a flush error, exactly once.
    pub(super) fn flush_all(&mut self) {
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
        for wr in self.rx.drain(QN_SEND).into_iter().filter_map(RxBuffer::into_recv) {
            self.completions.push_back(Completion::flushed(wr.wr_id, WcOpcode::Recv));
        }
    }
}
