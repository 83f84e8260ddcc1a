//! The queue pair's state: the [`QueuePair`] itself, its states and events, the constants of
//! its untagged queues, and the records it keeps (send-queue slots, posted receive buffers,
//! messages being transmitted, requests in flight, responses owed). The other files of the
//! module act on it.

use std::collections::VecDeque;

use iwarp_ddp::header::UNTAGGED_HEADER_LEN;
use iwarp_ddp::placement::{PostedBuffer, Sge, sgl_len};
use iwarp_ddp::untagged::Capacity;
use iwarp_ddp::{Msn, QueueNumber, STag, Segmenter, TerminateCode, UntaggedReceiver};

use super::srq::SharedReceiveQueue;
use super::wr::{CheckedSendWr, Completion, QpConfig, RecvWr, WcOpcode, WcStatus};
use crate::atomic::{ATOMIC_REQUEST_LEN, ATOMIC_RESPONSE_LEN, AtomicResponse};
use crate::memory::Sgl;
use crate::wire::{Opcode, READ_REQUEST_LEN, ReadRequest, TerminateHeader};

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
    pub(super) config: QpConfig,
    pub(super) state: QpState,
    pub(super) next_seq: u64,
    /// The requests posted and not yet started, oldest first. Their sequence numbers are
    /// consecutive and end just before `next_seq` (every request posted in RTS comes here;
    /// none is posted here outside RTS), so they are not stored: see
    /// [`QueuePair::sq_front_seq`].
    pub(super) sq: VecDeque<CheckedSendWr>,
    pub(super) sq_slots: VecDeque<SqSlot>,
    /// The untagged queues and what is posted on them: the application's receives on queue
    /// 0, RDMAP's own buffers on queues 1 to 3. DDP checks and places every untagged segment.
    pub(super) rx: UntaggedReceiver<RxBuffer>,
    pub(super) tx_msn: [Msn; 4],
    pub(super) tx_cur: Option<TxMessage>,
    /// The Immediate Data message that follows the Write of a Write with Immediate Data.
    pub(super) tx_next: Option<TxMessage>,
    pub(super) resp_pending: VecDeque<Response>,
    pub(super) resp_cur: Option<TxMessage>,
    pub(super) prefer_response: bool,
    pub(super) outbound: VecDeque<Outbound>,
    pub(super) srq: Option<SharedReceiveQueue>,
    pub(super) terminate: Option<TxMessage>,
    /// The opcode of the Send being received (of its first segment) and the STag it
    /// invalidates.
    pub(super) rx_send: Option<(Opcode, Option<STag>)>,
    pub(super) completions: VecDeque<Completion>,
    pub(super) events: VecDeque<QpEvent>,
    pub(super) stats: QpStats,
    /// Send-queue work requests retired so far (completed, flushed, or done unsignaled).
    pub(super) sq_retired: u64,
}

pub(super) const QN_SEND: QueueNumber = QueueNumber::Send;
pub(super) const QN_READ: QueueNumber = QueueNumber::ReadRequest;
pub(super) const QN_TERMINATE: QueueNumber = QueueNumber::Terminate;
pub(super) const QN_ATOMIC_RESPONSE: QueueNumber = QueueNumber::AtomicResponse;
/// The sequence number of the internal Read RTR: no work request, so no completion.
pub(super) const RTR_SEQ: u64 = u64::MAX;
/// The DDP buffer an IRD slot offers: room for a Read Request or an Atomic Request.
pub(super) const IRD_SLOT_LEN: u64 =
    if ATOMIC_REQUEST_LEN > READ_REQUEST_LEN { ATOMIC_REQUEST_LEN as u64 } else { READ_REQUEST_LEN as u64 };
/// Room for a received Terminate: control word, segment length, DDP header, Read Request.
pub(super) const TERMINATE_MAX: u64 = 4 + 2 + UNTAGGED_HEADER_LEN as u64 + READ_REQUEST_LEN as u64;

/// A send-queue entry in posting order, until its completion is delivered.
#[derive(Debug)]
pub(super) struct SqSlot {
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) opcode: WcOpcode,
    pub(super) len: u64,
    pub(super) signaled: bool,
    pub(super) status: Option<WcStatus>,
}

/// What a buffer posted on an untagged queue is.
#[derive(Debug)]
pub(super) enum RxBuffer {
    /// The application's receive (queue 0): the payload goes into its scatter list.
    Recv(RecvWr),
    /// An IRD slot (queue 1): room for a Read or Atomic Request.
    IrdSlot,
    /// Room for the peer's Terminate (queue 2).
    Terminate,
    /// Room for the Atomic Response to one of our Atomic Requests (queue 3).
    AtomicResponse,
}

impl RxBuffer {
    /// The application's receive work request, if this is one.
    pub(super) fn into_recv(self) -> Option<RecvWr> {
        match self {
            RxBuffer::Recv(wr) => Some(wr),
            _ => None,
        }
    }
}

impl Capacity for RxBuffer {
    fn capacity(&self) -> u64 {
        match self {
            RxBuffer::Recv(wr) => sgl_len(&wr.sgl),
            RxBuffer::IrdSlot => IRD_SLOT_LEN,
            RxBuffer::Terminate => TERMINATE_MAX,
            RxBuffer::AtomicResponse => ATOMIC_RESPONSE_LEN as u64,
        }
    }
}

impl PostedBuffer for RxBuffer {
    fn scatter_list(&self) -> Option<&[Sge]> {
        match self {
            RxBuffer::Recv(wr) => Some(&wr.sgl),
            // RDMAP reads its own one-segment messages straight from the segment.
            RxBuffer::IrdSlot | RxBuffer::Terminate | RxBuffer::AtomicResponse => None,
        }
    }
}

/// The message being transmitted on one of the two transmit streams.
#[derive(Debug)]
pub(super) struct TxMessage {
    pub(super) seq: Option<u64>,
    pub(super) segments: Segmenter,
    pub(super) source: Source,
}

#[derive(Debug)]
pub(super) enum Source {
    /// Bytes gathered from local buffers.
    Local(Sgl),
    /// A Read Response's bytes from our region `stag` at `to`.
    Remote { stag: STag, to: u64 },
    /// Bytes held by the queue pair (a Read Request body, a Terminate).
    Inline(Vec<u8>),
}

/// A Read or Atomic Request in flight, holding an ORD slot until its response is in.
#[derive(Debug)]
pub(super) struct Outbound {
    pub(super) seq: u64,
    pub(super) kind: OutboundKind,
}

#[derive(Debug)]
pub(super) enum OutboundKind {
    Read { sink: STag, sink_to: u64, len: u64, received: u64 },
    Atomic { request_id: u32, sink: Sge },
}

/// A response owed to the peer for one of its Read or Atomic Requests (an IRD slot).
#[derive(Debug)]
pub(super) enum Response {
    Read(ReadRequest),
    Atomic(AtomicResponse),
}
