//! Work requests and their completions: what the application posts to a queue pair
//! ([`SendWr`], [`RecvWr`]), the one validation both the application's post and the queue pair
//! run, and what comes back ([`Completion`]).

use iwarp_ddp::STag;
use iwarp_ddp::stag_table::Access;

use crate::atomic::{AtomicOp, IMMEDIATE_DATA_LEN};
use crate::memory::{Sgl, sgl_len};

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
// An 8-byte tag: the fields after it start on a word, and the moves of a work request on its
// way to the wire copy whole, aligned words (see `SglRepr` in memory.rs for why that matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
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
    /// Local invalidate (verbs `IBV_WR_LOCAL_INV`): the local region or memory window `stag`
    /// (valid, in the queue pair's protection domain) becomes invalid when the work request
    /// reaches the head of the send queue; every later access through the STag fails. A
    /// region with memory windows bound is refused: invalidate the windows first.
    LocalInvalidate {
        /// The STag to invalidate.
        stag: STag,
    },
    /// Fast-register (verbs `IB_WR_REG_MR`): the invalid region at `stag`'s index (allocated
    /// for it, or invalidated) takes `stag`'s key (the application picks it) and becomes
    /// valid over the first `len` bytes of its memory, addressed from `addr`, with `access`.
    /// Also how a region is made valid again after an invalidation.
    FastRegister {
        /// The region's STag with its new key.
        stag: STag,
        /// The virtual address (tagged offset) of the region's first byte.
        addr: u64,
        /// Bytes, at most the region's memory.
        len: u64,
        /// The rights granted.
        access: Access,
    },
    /// Bind a memory window (verbs `IBV_WR_BIND_MW`, type 2): the invalid window at
    /// `window`'s index takes `window`'s key and grants `access` to `[addr, addr + len)` of the
    /// valid region `region` (inside it, with a subset of its rights). Invalidation unbinds it.
    BindWindow {
        /// The window's STag with its new key.
        window: STag,
        /// The region (its lkey).
        region: STag,
        /// The window's first byte, as a tagged offset of the region.
        addr: u64,
        /// Bytes.
        len: u64,
        /// The rights granted to peers.
        access: Access,
    },
    /// RFC 7306 Atomic operation on the 64-bit value at `remote_to` of the peer's
    /// `remote_stag`; the original value lands, as a native-endian `u64`, in the single
    /// 8-byte local element.
    Atomic {
        /// Peer's STag (needs remote atomic rights there).
        remote_stag: STag,
        /// The operation (beside the STag: the fields are laid out in this order).
        op: AtomicOp,
        /// Peer's tagged offset (8-byte aligned).
        remote_to: u64,
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
            SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
            SendOp::FastRegister { .. } => WcOpcode::FastRegister,
            SendOp::BindWindow { .. } => WcOpcode::BindWindow,
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
    pub(super) fn uses_ord(&self) -> bool {
        matches!(self, SendOp::Read { .. } | SendOp::Atomic { .. })
    }

    /// Whether the operation works on local memory only (registration work requests): it
    /// sends nothing and completes when it reaches the head of the send queue.
    pub fn is_memory_operation(&self) -> bool {
        matches!(
            self,
            SendOp::LocalInvalidate { .. } | SendOp::FastRegister { .. } | SendOp::BindWindow { .. }
        )
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
        self.checked_len(config).map(|_| ())
    }

    /// Validates the work request once ([`SendWr::validate`]) and keeps what the check
    /// found, so that [`crate::qp::QueuePair::post_checked_send`] neither checks it nor sums
    /// its scatter/gather list again. (Inlined: the request then goes from the caller's
    /// frame into the checked one without a move through this call's.)
    #[inline]
    pub fn check(self, config: &QpConfig) -> Result<CheckedSendWr, PostError> {
        let len = self.checked_len(config)?;
        Ok(CheckedSendWr { wr: self, len })
    }

    /// The checks of [`SendWr::validate`]; the request's total length when they pass.
    fn checked_len(&self, config: &QpConfig) -> Result<u32, PostError> {
        let Ok(len) = u32::try_from(sgl_len(&self.sgl)) else {
            return Err(PostError::TooLong);
        };
        if self.op.is_rfc7306() && !config.rfc7306 {
            return Err(PostError::ExtensionNotNegotiated);
        }
        match self.op {
            SendOp::Read { .. } if self.sgl.len() != 1 => Err(PostError::ReadNeedsOneSge),
            SendOp::ImmediateData { .. } if !self.sgl.is_empty() => Err(PostError::BadSgl),
            op if op.is_memory_operation() && !self.sgl.is_empty() => Err(PostError::BadSgl),
            SendOp::Atomic { .. } if self.sgl.len() != 1 || self.sgl.first().map(|s| s.len) != Some(8) => {
                Err(PostError::BadSgl)
            }
            _ => Ok(len),
        }
    }
}

/// A send work request that passed [`SendWr::validate`] (made by [`SendWr::check`]), with
/// its total length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSendWr {
    wr: SendWr,
    len: u32,
}

impl CheckedSendWr {
    /// The work request.
    pub fn wr(&self) -> &SendWr {
        &self.wr
    }

    /// The total length of its scatter/gather list.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether its scatter/gather list holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The work request, giving up the check.
    pub fn into_wr(self) -> SendWr {
        self.wr
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
    /// A local buffer was not accessible (bad lkey, bounds, rights), or a memory work
    /// request (invalidate, fast-register, bind) was refused.
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
    /// A local invalidate ([`SendOp::LocalInvalidate`]).
    LocalInvalidate,
    /// A fast-register ([`SendOp::FastRegister`]).
    FastRegister,
    /// A memory window bind ([`SendOp::BindWindow`]).
    BindWindow,
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
    /// An Atomic needs exactly one 8-byte local element; Immediate Data and the memory work
    /// requests take none.
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
            PostError::BadSgl => "an atomic needs one 8-byte SGE; immediate data and memory operations none",
            PostError::UsesSrq => "the queue pair receives through a shared receive queue",
        })
    }
}

impl std::error::Error for PostError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_requests_move_as_whole_aligned_words() {
        // Whole words after an 8-byte tag (see `SglRepr` in memory.rs), and a checked send
        // request within the 128 bytes that a move copies with inline loads and stores
        // (larger moves became calls to memmove, which cost more than the stalls saved).
        assert_eq!(core::mem::size_of::<SendOp>(), 56);
        assert_eq!(core::mem::size_of::<Sgl>(), 48);
        assert!(core::mem::size_of::<CheckedSendWr>() <= 128);
        assert_eq!(core::mem::size_of::<RecvWr>(), 56);
    }
}
