//! The engine's state and one pass over it: what an RNIC's processor does between doorbells.
//!
//! For each connection, a pass moves the work requests applications posted (lock-free rings)
//! into the queue pair, reads what the link has, feeds it through MPA/DDP/RDMAP (placing
//! payload straight into registered memory), frames what the queue pair has to send and
//! writes it to the link, and publishes completions and events. A failing connection only
//! affects itself: its queue pair flushes and it is dropped once everything is reported.

use std::io::IoSlice;
use std::sync::Arc;

use iwarp_ddp::stag_table::{ProtectionDomainId, TaggedBufferTable};
use iwarp_netdev::{Link, SmolStack};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::qp::{Completion, QpState, WcOpcode, WcStatus};
use iwarp_rdmap::table_memory::TableMemory;

use crate::cq::WorkCompletion;
use crate::qp::{QpShared, flushed};

/// Bytes read from a link per call.
const RX_CHUNK: usize = 256 * 1024;
/// Bytes framed per pass before writing them out.
const TX_BATCH: usize = 256 * 1024;
/// The `mio` token of the first attached stack; the next ones count down from it (the
/// doorbell is `usize::MAX`, connections use their small QP numbers).
pub(crate) const STACK_TOKEN_BASE: usize = usize::MAX - 1;
/// Reads per connection per pass, so one busy connection cannot starve the others.
const RX_READS_PER_PASS: usize = 8;

/// One connection the engine runs.
struct ConnSlot {
    /// `iwarp_conn` span: every event of this connection is recorded inside it.
    span: tracing::Span,
    conn: Connection,
    link: Box<dyn Link>,
    pd: ProtectionDomainId,
    shared: Arc<QpShared>,
    /// Framed bytes for the link: `tx[tx_off..tx_len]` are still to be written. Allocated
    /// once, never zero-filled again: the queue pair and framer write into it directly.
    tx: Vec<u8>,
    tx_off: usize,
    tx_len: usize,
    link_down: bool,
    write_shut: bool,
    /// The queue pair's retired send count when last looked at.
    sq_retired: u64,
}

impl std::fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSlot").field("qp_num", &self.shared.qp_num).finish_non_exhaustive()
    }
}

/// Everything the engine owns.
#[derive(Debug)]
pub(crate) struct EngineCore {
    pub(crate) table: TaggedBufferTable,
    /// Where connections' sockets are registered for readiness (adaptive and event modes).
    registry: Option<mio::Registry>,
    conns: Vec<ConnSlot>,
    /// Userspace TCP/IP stacks whose links the connections use, polled every pass.
    stacks: Vec<SmolStack>,
    rx: Vec<u8>,
    next_pd: u32,
    next_qp: u32,
    next_va: u64,
}

impl EngineCore {
    pub(crate) fn new(max_regions: u32, registry: Option<mio::Registry>) -> EngineCore {
        EngineCore {
            table: TaggedBufferTable::new(max_regions),
            registry,
            conns: Vec::new(),
            stacks: Vec::new(),
            rx: vec![0; RX_CHUNK],
            next_pd: 1,
            next_qp: 1,
            next_va: 0x7f10_0000_0000,
        }
    }

    pub(crate) fn alloc_pd(&mut self) -> u32 {
        let id = self.next_pd;
        self.next_pd += 1;
        id
    }

    pub(crate) fn alloc_qp_num(&mut self) -> u32 {
        let n = self.next_qp;
        self.next_qp += 1;
        n
    }

    /// A virtual address range for a new region (page aligned, never reused).
    pub(crate) fn alloc_va(&mut self, len: u64) -> u64 {
        let va = self.next_va;
        self.next_va = self.next_va.saturating_add(len.div_ceil(4096).max(1) * 4096 + 4096);
        va
    }

    pub(crate) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Adds a smoltcp stack to the ones polled every pass (once: a stack already attached is
    /// left as is). Its frame descriptor wakes an engine waiting in `mio::Poll`.
    pub(crate) fn attach_stack(&mut self, stack: &SmolStack) -> bool {
        let fd = stack.raw_fd();
        if self.stacks.iter().any(|s| s.raw_fd() == fd) {
            return false;
        }
        if let Some(r) = &self.registry {
            let token = mio::Token(STACK_TOKEN_BASE - self.stacks.len());
            let _ = r.register(&mut mio::unix::SourceFd(&fd), token, mio::Interest::READABLE);
        }
        self.stacks.push(stack.clone());
        true
    }

    /// Stacks attached.
    pub(crate) fn stacks(&self) -> &[SmolStack] {
        &self.stacks
    }

    /// How long the engine may sleep before a stack's timer (retransmission, delayed ACK) is
    /// due; `None` when no stack has one pending.
    pub(crate) fn stack_delay(&self) -> Option<std::time::Duration> {
        let now = iwarp_netdev::smoltcp::time::Instant::now();
        self.stacks.iter().filter_map(|s| s.poll_delay(now)).min()
    }

    fn poll_stacks(&self) -> bool {
        let mut work = false;
        for stack in &self.stacks {
            work |= stack.poll_now();
        }
        work
    }

    /// Hands a connected link and its queue pair to the engine.
    pub(crate) fn add(
        &mut self,
        conn: Connection,
        link: Box<dyn Link>,
        pd: ProtectionDomainId,
        shared: Arc<QpShared>,
    ) {
        let span = tracing::debug_span!(
            "iwarp_conn",
            qp = shared.qp_num,
            peer = ?link.peer_addr(),
            crc = shared.params.crc,
            mulpdu = shared.config.mulpdu
        );
        span.in_scope(|| tracing::debug!(ird = shared.config.ird, ord = shared.config.ord, "connection up"));
        let tx = vec![0; TX_BATCH + conn.max_fpdu_len()];
        self.conns.push(ConnSlot {
            span,
            conn,
            link,
            pd,
            shared,
            tx,
            tx_off: 0,
            tx_len: 0,
            link_down: false,
            write_shut: false,
            sq_retired: 0,
        });
    }

    /// Closes every connection (the device is going away): each queue pair flushes its work,
    /// the completions are published, and work posted later is flushed by the poster.
    pub(crate) fn shutdown(&mut self) {
        for slot in &mut self.conns {
            slot.conn.qp().close();
            slot.link.shutdown_write();
            while let Some(c) = slot.conn.qp().poll_completion() {
                let wc = work_completion(slot.shared.qp_num, c);
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvImmediate) {
                    slot.shared.recv_cq.push(wc);
                    slot.shared.rq_retired();
                } else {
                    slot.shared.send_cq.push(wc);
                }
            }
            slot.shared.set_state(QpState::Error);
            slot.shared.retire();
        }
        self.conns.clear();
    }

    /// One pass over every connection; whether anything happened.
    pub(crate) fn progress(&mut self) -> bool {
        // Frames received reach the sockets before the connections read them...
        let mut work = self.poll_stacks();
        let EngineCore { table, conns, rx, registry, .. } = self;
        for slot in conns.iter_mut() {
            work |= pass(slot, table, rx);
        }
        // Drop connections that are finished and fully reported.
        let registry = registry.as_ref();
        conns.retain_mut(|s| {
            let done = s.conn.qp_ref().state() == QpState::Error && (s.link_down || s.write_shut);
            let keep = !done || s.tx_off < s.tx_len;
            if !keep {
                if let (Some(r), Some(source)) = (registry, s.link.source()) {
                    let _ = r.deregister(source);
                }
                // Work posted from now on is flushed by whoever finds it.
                s.shared.retire();
            }
            keep
        });
        // ... and what they wrote leaves now rather than at the next pass.
        if !self.stacks.is_empty() {
            work |= self.poll_stacks();
        }
        work
    }
}

fn pass(slot: &mut ConnSlot, table: &mut TaggedBufferTable, rx: &mut [u8]) -> bool {
    let span = slot.span.clone();
    let _entered = span.enter();
    let mut work = false;
    let mut mem = TableMemory { table, pd: slot.pd };
    let shared = slot.shared.clone();

    // Work requests from the application.
    while let Some(wr) = shared.sq.pop() {
        work = true;
        let (wr_id, opcode) = (wr.wr_id, wr.op.wc_opcode());
        tracing::trace!(wr_id, op = ?wr.op, "post_send");
        if let Err(e) = slot.conn.qp().post_send(wr) {
            // Checked on the application side already; should the queue pair refuse it, it
            // completes with an error rather than vanishing.
            tracing::debug!(wr_id, error = %e, "post_send refused");
            shared.send_cq.push(WorkCompletion {
                status: WcStatus::LocalLengthError,
                ..flushed(shared.qp_num, wr_id, opcode)
            });
            shared.sq_retired(1);
        }
    }
    while let Some(wr) = shared.rq.pop() {
        work = true;
        let wr_id = wr.wr_id;
        if let Err(e) = slot.conn.qp().post_recv(wr) {
            tracing::debug!(wr_id, error = %e, "post_recv refused");
            shared.recv_cq.push(WorkCompletion {
                status: WcStatus::LocalLengthError,
                ..flushed(shared.qp_num, wr_id, WcOpcode::Recv)
            });
            shared.rq_retired();
        }
    }
    if shared.take_disconnect() {
        work = true;
        slot.conn.qp().close();
    }

    // Input.
    if !slot.link_down {
        for _ in 0..RX_READS_PER_PASS {
            match slot.link.recv(rx) {
                Ok(0) => break,
                Ok(n) => {
                    work = true;
                    slot.conn.handle_bytes(&mut mem, &rx[..n]);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "link down");
                    work = true;
                    slot.link_down = true;
                    slot.conn.handle_llp_lost();
                    break;
                }
            }
        }
    }

    // Output.
    if !slot.link_down {
        if slot.tx_off == slot.tx_len {
            slot.tx_off = 0;
            slot.tx_len = slot.conn.poll_transmit_into(&mut mem, &mut slot.tx);
        }
        if slot.tx_off < slot.tx_len {
            match slot.link.send_vectored(&[IoSlice::new(&slot.tx[slot.tx_off..slot.tx_len])]) {
                Ok(n) => {
                    work |= n > 0;
                    slot.tx_off += n;
                }
                Err(_) => {
                    work = true;
                    slot.link_down = true;
                    slot.conn.handle_llp_lost();
                }
            }
        }
        // A queue pair that is done closes its side of the stream once its last bytes (a
        // Terminate, say) are out.
        if slot.conn.qp_ref().state() == QpState::Error && slot.tx_off == slot.tx_len && !slot.write_shut {
            slot.link.shutdown_write();
            slot.write_shut = true;
            work = true;
        }
    }

    // Events, then completions: the reason for a flush is there before the flushed requests.
    while let Some(e) = slot.conn.qp().poll_event() {
        tracing::debug!(event = ?e, "queue pair event");
        work = true;
        shared.push_event(e);
    }
    while let Some(c) = slot.conn.qp().poll_completion() {
        work = true;
        tracing::trace!(wr_id = c.wr_id, status = ?c.status, opcode = ?c.opcode, len = c.byte_len, "completion");
        let wc = work_completion(shared.qp_num, c);
        if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvImmediate) {
            shared.recv_cq.push(wc);
            shared.rq_retired();
        } else {
            shared.send_cq.push(wc);
        }
    }
    let retired = slot.conn.qp_ref().sq_retired();
    shared.sq_retired(usize::try_from(retired - slot.sq_retired).unwrap_or(usize::MAX));
    slot.sq_retired = retired;
    shared.send_cq.drain_backlog();
    shared.recv_cq.drain_backlog();
    shared.set_state(slot.conn.qp_ref().state());
    work
}

/// The application's view of a queue pair's completion.
pub(crate) fn work_completion(qp_num: u32, c: Completion) -> WorkCompletion {
    WorkCompletion {
        qp_num,
        wr_id: c.wr_id,
        status: c.status,
        opcode: c.opcode,
        byte_len: c.byte_len,
        solicited: c.solicited,
        invalidated: c.invalidated,
        imm_data: c.imm_data,
    }
}
