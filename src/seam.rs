//! The types and traits of the backend seam (re-exported by src/backend.rs, which documents
//! them): devices, capabilities, work requests and completions in the terms every backend
//! shares, and the traits a backend implements.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iwarp_ddp::stag_table::Access;

use iwarp_mpa::NegotiationError;

use crate::cm::CmError;

/// The name of the userspace engine in device lists and on `--device`.
pub const ENGINE_DEVICE: &str = "iwarp";

/// How a device carries RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTransport {
    /// This stack's userspace engine: iWARP over kernel TCP or smoltcp.
    UserspaceIwarp,
    /// An rdma-core iWARP device (siw, an iWARP NIC, or the verbs drop-in over this engine).
    Iwarp,
    /// An rdma-core RoCE device (rxe, a RoCE NIC): never talks to an iWARP peer.
    Roce,
    /// An InfiniBand device.
    Infiniband,
    /// Something else rdma-core reports.
    Other,
}

impl DeviceTransport {
    /// Whether a device of this transport can be the peer of an iWARP device.
    pub fn speaks_iwarp(self) -> bool {
        matches!(self, DeviceTransport::UserspaceIwarp | DeviceTransport::Iwarp)
    }
}

impl fmt::Display for DeviceTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceTransport::UserspaceIwarp => "iWARP (userspace engine)",
            DeviceTransport::Iwarp => "iWARP",
            DeviceTransport::Roce => "RoCE",
            DeviceTransport::Infiniband => "InfiniBand",
            DeviceTransport::Other => "other",
        })
    }
}

/// What a device supports, for the operations and features the seam has. A conformance test
/// that needs one a device lacks is skipped, and says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// RDMA Write, Read and Send (every backend).
    pub rdma: bool,
    /// Send and Write with immediate data (RFC 7306 on iWARP; native on RoCE).
    pub immediate: bool,
    /// Fetch-and-add and compare-and-swap (RFC 7306 atomics on iWARP; siw has none).
    pub atomics: bool,
    /// Private data in the connection request and reply, readable by the other side.
    pub private_data: bool,
    /// The passive side can reject a request (the initiator sees a refusal).
    pub reject: bool,
    /// Completion notification (armed CQ, completion channel).
    pub cq_notify: bool,
    /// Shared receive queues ([`Backend::create_srq`]).
    pub srq: bool,
    /// Memory windows, type 2 ([`Endpoint::alloc_mw`], [`Endpoint::post_bind`]), and their
    /// invalidation ([`Op::LocalInvalidate`]).
    pub memory_windows: bool,
}

/// One device: its name, transport and capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The name `--device` takes (`iwarp` for the engine, rdma-core's device name otherwise).
    pub name: String,
    /// Its transport.
    pub transport: DeviceTransport,
    /// What it supports.
    pub caps: Capabilities,
}

/// What the seam's calls fail with.
#[derive(Debug)]
pub enum BackendError {
    /// No device of that name (the message says which ones there are, or why there are none).
    NoDevice(String),
    /// The device or this backend lacks the operation or feature.
    Unsupported(&'static str),
    /// Connection management failed (refused, timed out...).
    Connect(String),
    /// The peer rejected the connection request. rdma_cm reports some refusals the same
    /// way (on iWARP, a port with no listener: the TCP connection refused), with no private
    /// data.
    Rejected {
        /// The private data of its reject (on InfiniBand and RoCE, padded with zeros to
        /// the connection manager's fixed size).
        private_data: Vec<u8>,
    },
    /// A verbs call failed (registration, queue creation, posting...).
    Verbs(String),
    /// An offset or length outside a region.
    OutOfBounds,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::NoDevice(m) => write!(f, "no such device: {m}"),
            BackendError::Unsupported(what) => write!(f, "not supported by this device: {what}"),
            BackendError::Connect(m) => write!(f, "connection failed: {m}"),
            BackendError::Rejected { private_data } => {
                write!(f, "connection rejected by the peer ({} bytes of private data)", private_data.len())
            }
            BackendError::Verbs(m) => write!(f, "verbs call failed: {m}"),
            BackendError::OutOfBounds => f.write_str("offset or length outside the region"),
        }
    }
}

impl std::error::Error for BackendError {}

impl From<CmError> for BackendError {
    fn from(e: CmError) -> BackendError {
        match e {
            CmError::Rejected { private_data }
            | CmError::Negotiation(NegotiationError::Rejected { private_data }) => {
                BackendError::Rejected { private_data }
            }
            e => BackendError::Connect(e.to_string()),
        }
    }
}

/// What posting a receive to an endpoint made with a shared receive queue is refused with.
pub(crate) const SRQ_POST_RECV: &str =
    "a receive posted to an endpoint made with a shared receive queue (post it to the queue)";

/// Settings for one endpoint, either side of the connection.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// Private data for the request (connect) or reply (accept).
    pub private_data: Vec<u8>,
    /// Send and receive queue depth, and the completion queue's (twice that).
    pub queue_depth: u32,
    /// Time allowed to connect or to wait for a request.
    pub timeout: Duration,
    /// Receives posted before the connection is up, `(count, bytes each)`: iWARP has no
    /// receiver-not-ready retry, so a peer's first Send may arrive before the application
    /// could post anything once connected. They are in one region
    /// ([`Endpoint::early_recv_region`]); receive `i` (its `wr_id`) is the `i`-th slice.
    /// Not with [`EndpointOptions::srq`] (post to the shared queue before connecting instead).
    pub early_recvs: (u32, u32),
    /// Take receive buffers from this shared receive queue (made by the same backend)
    /// instead of the endpoint's own receive queue: [`Endpoint::post_recv`] is then refused,
    /// the endpoint is in the queue's protection domain (a region either registers serves
    /// both), and a receive completes on the completion queue of the endpoint whose peer's
    /// message filled it, which is how the application tells the connections apart.
    pub srq: Option<Arc<dyn SharedRecvQueue>>,
    /// RDMA Reads (and atomics) outstanding each way: the IRD and ORD this side offers (the
    /// engine's MPA IRD/ORD word, rdma_cm's responder resources and initiator depth). None:
    /// the backend's default (the engine's 16, the verbs backend's 1).
    pub rd_atomic: Option<u8>,
}

impl Default for EndpointOptions {
    fn default() -> EndpointOptions {
        EndpointOptions {
            private_data: Vec::new(),
            queue_depth: 64,
            timeout: Duration::from_secs(10),
            early_recvs: (0, 0),
            srq: None,
            rd_atomic: None,
        }
    }
}

/// A work request's operation, in the terms every backend shares (verbs' 32-bit keys and
/// immediate data, remote addresses as the peer's region reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Send into the peer's next receive buffer.
    Send,
    /// Send with 32-bit immediate data.
    SendImm(u32),
    /// RDMA Write to the peer's `rkey` at `addr`.
    Write {
        /// The peer region's key.
        rkey: u32,
        /// Its address ([`Region::addr`] plus an offset).
        addr: u64,
    },
    /// RDMA Write with 32-bit immediate data (consumes a receive buffer on the peer).
    WriteImm {
        /// The peer region's key.
        rkey: u32,
        /// Its address.
        addr: u64,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA Read from the peer's `rkey` at `addr` into the local buffer.
    Read {
        /// The peer region's key.
        rkey: u32,
        /// Its address.
        addr: u64,
    },
    /// Atomic fetch-and-add of the 8 bytes at `addr`; the old value lands in the local buffer.
    FetchAdd {
        /// The peer region's key.
        rkey: u32,
        /// Its address (8-byte aligned).
        addr: u64,
        /// The addend.
        add: u64,
    },
    /// Atomic compare-and-swap of the 8 bytes at `addr`; the old value lands locally.
    CompareSwap {
        /// The peer region's key.
        rkey: u32,
        /// Its address (8-byte aligned).
        addr: u64,
        /// The value expected.
        compare: u64,
        /// The value written when it matched.
        swap: u64,
    },
    /// Invalidates a memory window of this endpoint by its current key (no local buffer): a
    /// peer's access through the key fails from then on.
    LocalInvalidate {
        /// The window's key ([`Window::rkey`]).
        rkey: u32,
    },
}

/// A local buffer: `len` bytes at `offset` of a region of the same endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// The region's local key ([`Region::lkey`]).
    pub lkey: u32,
    /// Its address plus the offset.
    pub addr: u64,
    /// The length.
    pub len: u32,
}

/// How a work request ended, in the terms every backend shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Done.
    Success,
    /// A local buffer was too small (a receive for a longer Send).
    LocalLength,
    /// A local key or bound was wrong.
    LocalProtection,
    /// The local queue pair failed the request (verbs' `IBV_WC_LOC_QP_OP_ERR`).
    LocalQpOperation,
    /// The peer refused the access (key, rights or bounds).
    RemoteAccess,
    /// The peer failed the operation.
    RemoteOperation,
    /// Flushed: the connection went down before the request ran.
    Flushed,
    /// Something else (the backend's own status number).
    Other(u32),
}

/// The operation a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionOp {
    /// A Send (with or without immediate data) was sent.
    Send,
    /// An RDMA Write was done.
    Write,
    /// An RDMA Read was done.
    Read,
    /// An atomic was done.
    Atomic,
    /// A Send arrived in a receive buffer.
    Recv,
    /// Immediate data arrived (a Write with immediate, or an Immediate Data message).
    RecvImm,
    /// A memory window was bound ([`Endpoint::post_bind`]).
    Bind,
    /// A key was invalidated ([`Op::LocalInvalidate`]).
    LocalInvalidate,
    /// Something else.
    Other,
}

/// A completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// The outcome.
    pub status: Status,
    /// The operation (meaningful on success only: verbs leave it undefined otherwise).
    pub op: CompletionOp,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// Immediate data received.
    pub imm: Option<u32>,
}

/// A backend: a device that makes connections.
pub trait Backend: Send + Sync {
    /// The device's name, transport and capabilities.
    fn info(&self) -> DeviceInfo;
    /// Listens for connections at `addr` (port 0: any free port).
    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn BackendListener>, BackendError>;
    /// Connects to a listener at `addr`.
    fn connect(&self, addr: SocketAddr, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError>;
    /// Creates a shared receive queue holding up to `depth` receives, in a protection domain
    /// of its own, for endpoints made with it in [`EndpointOptions::srq`]
    /// ([`BackendError::Unsupported`] where [`Capabilities::srq`] is false).
    fn create_srq(&self, depth: u32) -> Result<Arc<dyn SharedRecvQueue>, BackendError>;
}

/// A shared receive queue: receive buffers that any endpoint made with it takes from, the
/// next one for the next message that arrives on any of them. A receive taken stays with
/// that endpoint (it completes there, or completes flushed there if that connection goes
/// down first); the receives not taken stay posted when one of the connections goes down.
pub trait SharedRecvQueue: Send + Sync + fmt::Debug {
    /// Registers `len` zeroed bytes of application memory with `access`, in the queue's
    /// protection domain (the endpoints made with the queue share it).
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError>;
    /// Posts a receive buffer.
    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError>;
    /// The backend's own type, for the backend to find its queue again.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A listening endpoint.
pub trait BackendListener: Send {
    /// The address it listens at.
    fn local_addr(&self) -> SocketAddr;
    /// Waits for a request and returns it, not yet accepted.
    fn next_request(&self, timeout: Duration) -> Result<Box<dyn PendingRequest>, BackendError>;
}

/// A connection request waiting for the application's answer.
pub trait PendingRequest: Send {
    /// The private data of the request.
    fn private_data(&self) -> Vec<u8>;
    /// Accepts it: the new endpoint is connected.
    fn accept(self: Box<Self>, opts: &EndpointOptions) -> Result<Box<dyn Endpoint>, BackendError>;
    /// Rejects it with `private_data`.
    fn reject(self: Box<Self>, private_data: &[u8]) -> Result<(), BackendError>;
}

/// One side of a connection: its queue pair, completion queue and protection domain.
pub trait Endpoint: Send {
    /// Registers `len` zeroed bytes of application memory with `access`.
    fn register(&self, len: usize, access: Access) -> Result<Arc<dyn Region>, BackendError>;
    /// Registers the application's own buffer with `access`, in place: the device reads and
    /// writes these bytes, with no copy (rdma-core's `ibv_reg_mr` over the buffer's address;
    /// the engine's registration of an owned buffer). [`Region::into_buffer`] gives it back.
    /// An empty buffer is refused.
    fn register_buffer(&self, buffer: Vec<u8>, access: Access) -> Result<Arc<dyn Region>, BackendError>;
    /// The private data the peer sent with its request or reply.
    fn peer_private_data(&self) -> Vec<u8>;
    /// The region of the receives posted before the connection came up
    /// ([`EndpointOptions::early_recvs`]), if any were asked for.
    fn early_recv_region(&self) -> Option<Arc<dyn Region>>;
    /// Posts a signaled send-queue work request with one local buffer (or none).
    fn post_send(&self, wr_id: u64, op: Op, local: Option<Local>) -> Result<(), BackendError>;
    /// Posts a receive buffer (refused on an endpoint made with a shared receive queue).
    fn post_recv(&self, wr_id: u64, local: Local) -> Result<(), BackendError>;
    /// Takes the next completion, waiting up to `timeout`.
    fn poll(&self, timeout: Duration) -> Option<Completion>;
    /// Arms the completion queue and waits up to `timeout` for its notification (a completion
    /// that arrives after the arming); false when none came.
    fn wait_notification(&self, timeout: Duration) -> Result<bool, BackendError>;
    /// Disconnects: outstanding work requests complete flushed, on both sides.
    fn disconnect(&self);
    /// Allocates a type 2 memory window in the endpoint's protection domain, unbound
    /// ([`BackendError::Unsupported`] where [`Capabilities::memory_windows`] is false).
    fn alloc_mw(&self) -> Result<Arc<dyn Window>, BackendError>;
    /// Posts a signaled bind of `window` to `len` bytes of `region` (one of this endpoint's)
    /// from byte `offset`, granting peers `access` (within the region's own rights), under a
    /// new key: returned, and the window's [`Window::rkey`] from now on. The window must be
    /// unbound (new, or invalidated). The bind completes as [`CompletionOp::Bind`].
    fn post_bind(
        &self,
        wr_id: u64,
        window: &dyn Window,
        region: &dyn Region,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, BackendError>;
}

/// A memory window: a peer's view, under a key of its own, of part of a region.
pub trait Window: Send + Sync + fmt::Debug {
    /// The key peers use, as of the last bind.
    fn rkey(&self) -> u32;
    /// The backend's own type, for the backend to find its window again.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Registered application memory.
pub trait Region: Send + Sync {
    /// Its address, as work requests name it.
    fn addr(&self) -> u64;
    /// Its length.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The local key.
    fn lkey(&self) -> u32;
    /// The remote key.
    fn rkey(&self) -> u32;
    /// Copies `data` in at `offset`.
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError>;
    /// Copies `out.len()` bytes out from `offset`.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError>;
    /// The backend's own type, for the backend to find its region again (a bind names one).
    fn as_any(&self) -> &dyn std::any::Any;
    /// Deregisters the region and returns its memory: for a region of
    /// [`Endpoint::register_buffer`], the application's buffer itself (the same allocation,
    /// with what peers wrote into it); otherwise its bytes. `None`, and the region stays
    /// registered until its last handle is dropped, while another handle to it is alive (or
    /// when the device refuses to deregister it, e.g. a memory window is bound to it).
    fn into_buffer(self: Arc<Self>) -> Option<Vec<u8>>;
    /// The local buffer `len` bytes at `offset`.
    fn local(&self, offset: usize, len: u32) -> Local {
        Local { lkey: self.lkey(), addr: self.addr() + offset as u64, len }
    }
}

/// The backend's own type behind one of the seam's objects (its `as_any`), or
/// [`BackendError::Unsupported`] naming `what` when another backend made it.
pub(crate) fn own<'a, T: 'static>(
    any: &'a dyn std::any::Any,
    what: &'static str,
) -> Result<&'a T, BackendError> {
    any.downcast_ref::<T>().ok_or(BackendError::Unsupported(what))
}
