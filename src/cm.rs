//! Connection management, rdma_cm style: connect, listen, accept or reject with private data,
//! over either TCP/IP ([`Transport`]: the kernel's, or this stack's own smoltcp).
//!
//! The initiator's MPA Request/Reply exchange runs on the caller's thread with a time limit
//! (siw waits 10 s for a Reply; the default here matches). A [`Listener`] runs the handshakes
//! of every incoming connection at once, without blocking on any of them: a client that
//! connects and stays silent costs one of the listener's pending slots until its request
//! timeout (5 s, as siw allows), never the other clients' time. The connected stream then goes
//! to the engine with its queue pair. As with Linux rdma_cm over iWARP, the application's
//! private data goes straight into the MPA frames, after the IRD/ORD word of revision 2.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use iwarp_mpa::frame::{Frame, HEADER_LEN};
use iwarp_mpa::{ConnParams, FrameError, FrameKind, FrameRepr, IrdOrd, NegotiationError, Policy, Role};
use iwarp_netdev::{
    CapturingLink, Direction, Link, LinkError, LinkOptions, PcapWriter, SmolLink, SmolListener, SmolStack,
    TcpLink,
};
use iwarp_rdmap::conn::Connection;
use iwarp_rdmap::qp::{QpConfig, QueuePair as RdmapQp, RecvWr, SharedReceiveQueue};

use crate::cq::CompletionQueue;
use crate::device::Device;
use crate::engine::Engine;
use crate::mr::ProtectionDomain;
use crate::qp::QueuePair;
use crate::readiness::{Events, Poll};
use crate::shared::{ConnCount, QpShared};
use crate::threads::spawn_settled;

/// Which TCP/IP carries a connection.
#[derive(Debug, Clone, Default)]
pub enum Transport {
    /// The kernel's TCP.
    #[default]
    Kernel,
    /// This stack's own TCP/IP (smoltcp) on a TAP device or a raw Ethernet interface; the
    /// device's engine drives the stack from the first connection on (see
    /// [`Device::attach_stack`]).
    Smol(SmolStack),
}

/// Settings for one connection, either end.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The TCP/IP to connect over (the initiator's; a listener has its own).
    pub transport: Transport,
    /// MPA settings: revision, CRC, markers, IRD/ORD, peer-to-peer RTR.
    pub policy: Policy,
    /// Private data for the Request (connect) or Reply (accept); at most 252 bytes with MPA
    /// revision 2, 256 with revision 1.
    pub private_data: Vec<u8>,
    /// Time allowed for the TCP connection and the MPA exchange.
    pub timeout: Duration,
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth.
    pub max_recv_wr: usize,
    /// The peer takes the RFC 7306 extensions (agreed out of band; siw does not).
    pub rfc7306: bool,
    /// A pause between the Reply and the first FPDU the initiator sends. Not needed against
    /// siw any more (the engine nudges a peer that leaves its first FPDU unread, see
    /// docs/siw-quirks.md); zero by default.
    pub first_fpdu_delay: Duration,
    /// Socket settings.
    pub link: LinkOptions,
    /// Receive buffers posted before the connection goes live, as verbs applications post
    /// them before `rdma_accept`/`rdma_connect`: the peer's first Send may arrive right
    /// after the MPA exchange, before the application could post anything.
    pub recv: Vec<RecvWr>,
    /// Take receive buffers from this shared receive queue instead of the queue pair's own
    /// (posting to the queue pair is then an error).
    pub srq: Option<SharedReceiveQueue>,
    /// Record what crosses the connection into this pcap writer (Ethernet/IPv4/TCP framing
    /// synthesized around the stream, readable by tshark and `iwarp dissect`).
    pub capture: Option<Arc<Mutex<PcapWriter>>>,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            transport: Transport::Kernel,
            policy: Policy { ird: 16, ord: 16, ..Policy::default() },
            private_data: Vec::new(),
            timeout: Duration::from_secs(10),
            max_send_wr: 512,
            max_recv_wr: 512,
            rfc7306: false,
            first_fpdu_delay: Duration::ZERO,
            link: LinkOptions::default(),
            recv: Vec::new(),
            srq: None,
            capture: None,
        }
    }
}

/// Settings of a [`Listener`].
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// The TCP/IP to listen on. With smoltcp the listener takes the stack's address and the
    /// port of the address given to [`Device::listen_with`].
    pub transport: Transport,
    /// Incoming connections whose MPA Request has not fully arrived, at most, at once; more
    /// wait in the TCP backlog until a slot frees (a Request arrives, or its time is up).
    pub max_pending: usize,
    /// How long a new connection has to deliver its MPA Request (siw allows 5 s).
    pub request_timeout: Duration,
    /// Connections made through the listener that may be alive at once; a Request beyond it
    /// is rejected on the wire (an MPA Reject) and never reaches [`Listener::accept`].
    pub max_connections: usize,
}

impl Default for ListenOptions {
    fn default() -> ListenOptions {
        ListenOptions {
            transport: Transport::Kernel,
            max_pending: 64,
            request_timeout: Duration::from_secs(5),
            max_connections: usize::MAX,
        }
    }
}

/// Why a connection could not be made.
#[derive(Debug)]
pub enum CmError {
    /// A socket error (refused, unreachable, reset).
    Io(io::Error),
    /// No answer in time.
    Timeout,
    /// The peer closed the connection during the handshake.
    Closed,
    /// The peer's frame is not a valid MPA Request/Reply.
    Frame(FrameError),
    /// The two ends' MPA settings do not fit (or the local settings are invalid).
    Negotiation(NegotiationError),
    /// The peer rejected the connection.
    Rejected {
        /// The private data of its reject.
        private_data: Vec<u8>,
    },
    /// The device already runs as many connections as its configuration allows
    /// ([`crate::DeviceConfig::max_connections`]).
    TooManyConnections {
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmError::Io(e) => write!(f, "{e}"),
            CmError::Timeout => f.write_str("timed out waiting for the MPA handshake"),
            CmError::Closed => f.write_str("peer closed the connection during the MPA handshake"),
            CmError::Frame(e) => write!(f, "bad MPA frame from the peer: {e}"),
            CmError::Negotiation(NegotiationError::Rejected { private_data })
            | CmError::Rejected { private_data } => {
                write!(f, "connection rejected by the peer ({} bytes of private data)", private_data.len())
            }
            CmError::Negotiation(e) => write!(f, "MPA negotiation failed: {e}"),
            CmError::TooManyConnections { limit } => {
                write!(f, "the device already runs its limit of {limit} connections")
            }
        }
    }
}

impl std::error::Error for CmError {}

impl From<io::Error> for CmError {
    fn from(e: io::Error) -> CmError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CmError::Timeout,
            io::ErrorKind::UnexpectedEof => CmError::Closed,
            _ => CmError::Io(e),
        }
    }
}

impl From<NegotiationError> for CmError {
    fn from(e: NegotiationError) -> CmError {
        match e {
            NegotiationError::Rejected { private_data } => CmError::Rejected { private_data },
            NegotiationError::Frame(f) => CmError::Frame(f),
            e => CmError::Negotiation(e),
        }
    }
}

/// A connection made by [`Device::connect`].
#[derive(Debug)]
pub struct Connected {
    /// The queue pair.
    pub qp: QueuePair,
    /// The private data of the peer's Reply.
    pub private_data: Vec<u8>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn link_error(e: LinkError) -> CmError {
    match e {
        LinkError::Closed => CmError::Closed,
        LinkError::Reset => {
            CmError::Io(io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by the peer"))
        }
        LinkError::WriteShutdown => {
            CmError::Io(io::Error::new(io::ErrorKind::BrokenPipe, "write side shut down"))
        }
        LinkError::Io(e) => e.into(),
        other => CmError::Io(io::Error::other(other.to_string())),
    }
}

/// Waits a little for a smoltcp link to make progress: polls its stack, then waits for a
/// frame or its next timer (at most until `deadline`).
fn smol_wait(link: &SmolLink, deadline: Instant) -> Result<(), CmError> {
    let stack = link.stack();
    stack.poll_now();
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(CmError::Timeout);
    }
    stack.wait(left.min(Duration::from_millis(5)))?;
    stack.poll_now();
    Ok(())
}

/// An MPA frame arriving in pieces: takes exactly the frame's bytes, no byte more (what
/// follows belongs to the FPDU stream).
#[derive(Debug, Default)]
struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// How many more bytes to read (at least one until the frame is whole).
    fn want(&self) -> usize {
        let total = if self.buf.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            Frame::new_unchecked(&self.buf[..]).total_len()
        };
        total - self.buf.len()
    }

    /// Whether the frame is whole; an error as soon as the bytes cannot be a frame (wrong
    /// key, private data too long), before any more is read.
    fn whole(&self) -> Result<bool, FrameError> {
        match FrameRepr::parse_prefix(&self.buf)? {
            Some(_) => Ok(true),
            None => Ok(false),
        }
    }
}

/// The byte stream of a connection during its MPA exchange: a kernel socket, or a link of a
/// userspace TCP/IP stack (polled while waiting).
enum Stream {
    /// Kernel TCP.
    Tcp(TcpStream),
    /// smoltcp.
    Smol(SmolLink),
    /// A byte stream the caller provides ([`Device::connect_link`], [`Device::accept_link`]).
    Link(Box<dyn Link>),
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::Tcp(s) => f.debug_tuple("Tcp").field(s).finish(),
            Stream::Smol(l) => f.debug_tuple("Smol").field(l).finish(),
            Stream::Link(_) => f.write_str("Link"),
        }
    }
}

/// How long a handshake over a caller's link waits between looks at it.
const LINK_POLL: Duration = Duration::from_millis(1);

impl Stream {
    /// Reads what is there without waiting; `Ok(0)` when nothing is.
    fn try_read(&mut self, buf: &mut [u8]) -> Result<usize, CmError> {
        match self {
            Stream::Tcp(stream) => match stream.read(buf) {
                Ok(0) => Err(CmError::Closed),
                Ok(n) => Ok(n),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(0),
                Err(e) => Err(e.into()),
            },
            Stream::Smol(link) => link.recv(buf).map_err(link_error),
            Stream::Link(link) => link.recv(buf).map_err(link_error),
        }
    }

    /// Reads more of `frame` without waiting; whether it is whole now.
    fn read_more(&mut self, frame: &mut FrameReader) -> Result<bool, CmError> {
        loop {
            if frame.whole().map_err(CmError::Frame)? {
                return Ok(true);
            }
            let at = frame.buf.len();
            frame.buf.resize(at + frame.want(), 0);
            let n = self.try_read(&mut frame.buf[at..]);
            frame.buf.truncate(at + *n.as_ref().unwrap_or(&0));
            if n? == 0 {
                return Ok(false);
            }
        }
    }

    /// Reads one whole MPA frame by `deadline`.
    fn read_frame(&mut self, deadline: Instant) -> Result<Vec<u8>, CmError> {
        let mut frame = FrameReader::default();
        while !self.read_more(&mut frame)? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            match self {
                Stream::Tcp(stream) => wait_readable(stream, left.min(Duration::from_millis(100)))?,
                Stream::Smol(link) => smol_wait(link, deadline)?,
                Stream::Link(_) => std::thread::sleep(left.min(LINK_POLL)),
            }
        }
        Ok(frame.buf)
    }

    /// Writes all of `bytes` by `deadline`.
    fn write_all(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), CmError> {
        match self {
            Stream::Tcp(stream) => {
                // The request and reply are small: the socket buffer takes them at once.
                stream.set_nonblocking(false)?;
                stream.set_write_timeout(Some(
                    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                ))?;
                let written = stream.write_all(bytes);
                stream.set_nonblocking(true)?;
                written?;
                Ok(())
            }
            Stream::Smol(link) => {
                while !bytes.is_empty() {
                    match link.send(bytes) {
                        Ok(0) => smol_wait(link, deadline)?,
                        Ok(n) => bytes = &bytes[n..],
                        Err(e) => return Err(link_error(e)),
                    }
                }
                link.stack().poll_now();
                Ok(())
            }
            Stream::Link(link) => {
                while !bytes.is_empty() {
                    match link.send(bytes) {
                        Ok(0) if Instant::now() >= deadline => return Err(CmError::Timeout),
                        Ok(0) => std::thread::sleep(LINK_POLL),
                        Ok(n) => bytes = &bytes[n..],
                        Err(e) => return Err(link_error(e)),
                    }
                }
                Ok(())
            }
        }
    }

    /// MULPDU for the connection: the MSS as the EMSS (1448-ish on Ethernet, about 64 KiB on
    /// loopback; MTU - 40 on a smoltcp stack), less MPA's framing.
    fn mulpdu(&self, markers: bool) -> usize {
        let mss = match self {
            Stream::Tcp(stream) => socket2::SockRef::from(stream)
                .mss()
                .ok()
                .and_then(|m| usize::try_from(m).ok())
                .unwrap_or(1448),
            Stream::Smol(link) => link.stack().mtu().saturating_sub(40),
            // A caller's link: Ethernet's segment size.
            Stream::Link(_) => 1448,
        };
        iwarp_mpa::fpdu::mulpdu(mss.clamp(128, 65535), markers).max(64)
    }

    /// The link the engine runs.
    fn into_link(self, opts: &LinkOptions) -> Result<Box<dyn Link>, CmError> {
        Ok(match self {
            Stream::Tcp(stream) => Box::new(TcpLink::from_std(stream, opts)?),
            Stream::Smol(link) => Box::new(link),
            Stream::Link(link) => link,
        })
    }
}

/// The least payload that a connection over a smoltcp stack reads straight into place.
const SMOL_DIRECT_MIN: usize = 512;

/// Waits until `stream` is readable (or `timeout` passes), with `poll(2)`: no descriptor
/// is made for the wait.
fn wait_readable(stream: &TcpStream, timeout: Duration) -> Result<(), CmError> {
    use rustix::event::{PollFd, PollFlags};
    let t = crate::readiness::timespec(timeout);
    match rustix::event::poll(&mut [PollFd::new(stream, PollFlags::IN)], Some(&t)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(io::Error::from(e).into()),
    }
}

/// Starts the queue pair of a connection whose MPA exchange (`handshake`: the Request and the
/// Reply as sent) is done.
struct Start<'a> {
    stream: Stream,
    handshake: (&'a [u8], &'a [u8]),
    params: ConnParams,
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    opts: &'a ConnectOptions,
    /// The listener's count of its live connections, for a connection accepted through one.
    count: Option<ConnCount>,
}

impl Start<'_> {
    fn run(self, dev: &Arc<Engine>) -> Result<QueuePair, CmError> {
        let Start { stream, handshake, params, pd, send_cq, recv_cq, opts, count } = self;
        let config = QpConfig {
            mulpdu: stream.mulpdu(params.markers_tx),
            ird: params.ird,
            ord: params.ord,
            max_send_wr: opts.max_send_wr,
            max_recv_wr: opts.max_recv_wr,
            rfc7306: opts.rfc7306,
        };
        // A userspace stack's receive is a copy out of its buffer, far cheaper than a system
        // call: even MTU-sized payloads go straight into place. Over the kernel's TCP, the
        // default (iwarp_rdmap::conn::DIRECT_MIN) holds.
        let direct_min = matches!(stream, Stream::Smol(_)).then_some(Some(SMOL_DIRECT_MIN));
        let tcp = stream.into_link(&opts.link)?;
        let link: Box<dyn Link> = match &opts.capture {
            Some(writer) => {
                let mut link = CapturingLink::new(tcp, writer.clone())?;
                // The MPA exchange happened on the bare socket: put it first in the capture.
                let (first, second) = match params.role {
                    Role::Initiator => (Direction::Outbound, Direction::Inbound),
                    Role::Responder => (Direction::Inbound, Direction::Outbound),
                };
                link.record_earlier(first, handshake.0);
                link.record_earlier(second, handshake.1);
                Box::new(link)
            }
            None => tcp,
        };
        let qp = match &opts.srq {
            Some(srq) => RdmapQp::with_srq(config, srq.clone()),
            None => RdmapQp::new(config),
        };
        let mut conn = Connection::with_qp(&params, qp);
        if let Some(min) = direct_min {
            conn.set_direct_min(min);
        }
        for wr in &opts.recv {
            conn.qp().post_recv(wr.clone()).map_err(|e| CmError::Io(io::Error::other(e.to_string())))?;
        }
        let mut core = dev.core();
        let limit = dev.config.max_connections;
        if core.connections() >= limit {
            return Err(CmError::TooManyConnections { limit });
        }
        let cqs = (send_cq.shared.clone(), recv_cq.shared.clone());
        let shared = core.add(conn, link, pd.id, |qp_num, key| {
            QpShared::new(qp_num, key, config, params, cqs, opts.srq.is_some(), count)
                .with_preposted_recvs(opts.recv.len())
        });
        drop(core);
        dev.ring();
        Ok(QueuePair::new(shared, dev.clone()))
    }
}

impl Device {
    /// Connects to an iWARP listener at `addr` over `opts.transport` (rdma_connect): TCP,
    /// then the MPA Request and Reply, then the queue pair runs on the engine. Over smoltcp
    /// the stack is attached to the device and MULPDU follows from its MTU (MTU - 40 as the
    /// EMSS).
    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<Connected, CmError> {
        connect(&self.engine, addr, pd, send_cq, recv_cq, opts)
    }

    /// [`Device::connect`] as a future (for any async runtime): the handshake runs on a thread
    /// of its own and the future completes with its outcome.
    pub fn connect_async(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> CmFuture<Result<Connected, CmError>> {
        let (engine, pd, send_cq, recv_cq, opts) =
            (self.engine.clone(), pd.clone(), send_cq.clone(), recv_cq.clone(), opts.clone());
        CmFuture::spawn(move || connect(&engine, addr, &pd, &send_cq, &recv_cq, &opts))
    }

    /// Runs a connection over a byte stream the caller provides instead of a TCP connection
    /// the manager makes (an in-memory pair with fault injection, say): the initiator's MPA
    /// exchange on it, then the queue pair on the engine. `opts.transport` is not used.
    pub fn connect_link(
        &self,
        link: Box<dyn Link>,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<Connected, CmError> {
        let request = opts.policy.request(&opts.private_data)?.to_vec().map_err(CmError::Frame)?;
        let deadline = crate::deadline::saturating(opts.timeout);
        handshake(&self.engine, Stream::Link(link), request, deadline, pd, send_cq, recv_cq, opts)
    }

    /// The responder's side of [`Device::connect_link`]: waits (within `opts.timeout`) for
    /// the MPA Request on `link` and accepts it with `opts`.
    pub fn accept_link(
        &self,
        link: Box<dyn Link>,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<QueuePair, CmError> {
        let mut stream = Stream::Link(link);
        let request = stream.read_frame(crate::deadline::saturating(opts.timeout))?;
        check_request(&request)?;
        let peer = SocketAddr::from(([0, 0, 0, 0], 0));
        let req =
            ConnectRequest { stream, peer, request, dev: self.engine.clone(), count: ConnCount::default() };
        req.accept(pd, send_cq, recv_cq, opts)
    }

    /// Listens for iWARP connections on `addr` (rdma_listen) over the kernel's TCP, with the
    /// default [`ListenOptions`].
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener, CmError> {
        self.listen_with(addr, &ListenOptions::default())
    }

    /// Listens for iWARP connections on `addr` with `opts` (the transport, the bounds on
    /// pending handshakes and live connections). Over smoltcp the listener takes TCP port
    /// `addr.port()` of the stack, which is attached to the device.
    pub fn listen_with(&self, addr: SocketAddr, opts: &ListenOptions) -> Result<Listener, CmError> {
        let incoming = match &opts.transport {
            Transport::Kernel => {
                let listener = TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                Incoming::Tcp(listener)
            }
            Transport::Smol(stack) => {
                let listener = stack.listen(addr.port())?;
                self.attach_stack(stack);
                Incoming::Smol(listener)
            }
        };
        let local = match &incoming {
            Incoming::Tcp(l) => l.local_addr()?,
            Incoming::Smol(l) => l.local_addr(),
        };
        // Nothing wakes a listener's wait: it sleeps until a descriptor is ready or its
        // timeout passes.
        let poll = Poll::unringable()?;
        if let Incoming::Tcp(l) = &incoming {
            poll.add(l.as_fd(), LISTENING, false)?;
        }
        Ok(Listener {
            inner: Arc::new(ListenerInner {
                state: Mutex::new(ListenState { incoming, pending: Vec::new(), poll, next_token: 0 }),
                dev: self.engine.clone(),
                opts: opts.clone(),
                local,
                live: ConnCount::default(),
            }),
        })
    }
}

/// Connects over `opts.transport` (see [`Device::connect`]).
fn connect(
    engine: &Arc<Engine>,
    addr: SocketAddr,
    pd: &ProtectionDomain,
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Result<Connected, CmError> {
    let limit = engine.config.max_connections;
    if engine.core().connections() >= limit {
        return Err(CmError::TooManyConnections { limit });
    }
    let request = opts.policy.request(&opts.private_data)?.to_vec().map_err(CmError::Frame)?;
    let deadline = crate::deadline::saturating(opts.timeout);
    let stream = match &opts.transport {
        Transport::Kernel => {
            let stream = TcpStream::connect_timeout(&addr, opts.timeout)?;
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            Stream::Tcp(stream)
        }
        Transport::Smol(stack) => {
            engine.attach_stack(stack);
            let link = stack.connect(addr)?;
            link.wait_established(opts.timeout)?;
            Stream::Smol(link)
        }
    };
    handshake(engine, stream, request, deadline, pd, send_cq, recv_cq, opts)
}

/// The initiator's MPA exchange on a connected stream, then the queue pair.
#[expect(clippy::too_many_arguments, reason = "one private helper of the connects")]
fn handshake(
    engine: &Arc<Engine>,
    mut stream: Stream,
    request: Vec<u8>,
    deadline: Instant,
    pd: &ProtectionDomain,
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Result<Connected, CmError> {
    stream.write_all(&request, deadline)?;
    let reply_bytes = stream.read_frame(deadline)?;
    let reply = FrameRepr::parse(&reply_bytes).map_err(CmError::Frame)?;
    if reply.kind != FrameKind::Reply {
        return Err(CmError::Frame(FrameError::UnexpectedKind { expected: FrameKind::Reply }));
    }
    let params = match opts.policy.accept_reply(&reply) {
        Ok(p) => p,
        Err(e) => {
            terminate_after_reply(&mut stream, &opts.policy, &reply, &e, deadline);
            return Err(e.into());
        }
    };
    let private_data = reply.private_data.to_vec();
    if !opts.first_fpdu_delay.is_zero() {
        std::thread::sleep(opts.first_fpdu_delay);
    }
    let start = Start {
        stream,
        handshake: (&request, &reply_bytes),
        params,
        pd,
        send_cq,
        recv_cq,
        opts,
        count: None,
    };
    Ok(Connected { qp: start.run(engine)?, private_data })
}

/// A blocking connection-management call run on a thread of its own, as a future: it works
/// under any async runtime (the thread wakes the task when the call returns).
#[derive(Debug)]
pub struct CmFuture<T> {
    state: Arc<Mutex<(Option<T>, Option<std::task::Waker>)>>,
}

impl<T: Send + 'static> CmFuture<T> {
    fn spawn(f: impl FnOnce() -> T + Send + 'static) -> CmFuture<T> {
        let state: Arc<Mutex<(Option<T>, Option<std::task::Waker>)>> = Arc::new(Mutex::new((None, None)));
        let shared = Arc::clone(&state);
        let run = move || {
            let out = f();
            let waker = {
                let mut s = lock(&shared);
                s.0 = Some(out);
                s.1.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        };
        let job = Arc::new(Mutex::new(Some(run)));
        let on_thread = Arc::clone(&job);
        let spawned = spawn_settled("iwarp-cm", move |settled| {
            settled.settled();
            if let Some(run) = lock(&on_thread).take() {
                run();
            }
        });
        if spawned.is_err() {
            // No thread: the call runs here (blocking), and the future is ready at once.
            let run = lock(&job).take();
            if let Some(run) = run {
                run();
            }
        }
        CmFuture { state }
    }
}

impl<T> std::future::Future for CmFuture<T> {
    type Output = T;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let mut s = lock(&self.state);
        match s.0.take() {
            Some(out) => std::task::Poll::Ready(out),
            None => {
                match &mut s.1 {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    w => *w = Some(cx.waker().clone()),
                }
                std::task::Poll::Pending
            }
        }
    }
}

/// Tells the responder why its Reply cannot be taken (RFC 6581: an LLP Terminate, as siw
/// sends, when the Reply itself was acceptable as a frame but its settings are not), then the
/// caller closes. Best effort: the connection is failing anyway.
fn terminate_after_reply(
    stream: &mut Stream,
    policy: &Policy,
    reply: &FrameRepr<'_>,
    error: &NegotiationError,
    deadline: Instant,
) {
    let Some(code) = error.llp_code() else { return };
    if reply.reject {
        return;
    }
    let params = ConnParams {
        role: Role::Initiator,
        revision: reply.revision,
        crc: reply.crc || policy.crc != iwarp_mpa::CrcPolicy::Off,
        markers_tx: reply.markers,
        markers_rx: policy.markers_wanted,
        ird: 1,
        ord: 1,
        rtr: None,
        peer_ird_ord: reply.ird_ord,
    };
    let mut conn = Connection::new(&params, QpConfig::default());
    let terminate =
        iwarp_ddp::TerminateCode { layer: iwarp_ddp::TerminateLayer::Llp, error_type: 0, code: code.code() };
    conn.qp().handle_llp_error(terminate);
    let mut bytes = Vec::new();
    // An empty table: the queue pair touches no memory (a Terminate is all it sends).
    let mut table = iwarp_ddp::TaggedBufferTable::new(0);
    let mut none =
        iwarp_rdmap::memory::TableMemory { table: &mut table, pd: iwarp_ddp::ProtectionDomainId(0) };
    conn.poll_transmit(&mut none, &mut bytes, 4096);
    if !bytes.is_empty() {
        let _ = stream.write_all(&bytes, deadline);
    }
}

/// The readiness token of the listening socket in a listener's poll.
const LISTENING: u64 = u64::MAX;

/// Where connections come in.
#[derive(Debug)]
enum Incoming {
    Tcp(TcpListener),
    Smol(SmolListener),
}

/// A connection whose MPA Request is still arriving.
#[derive(Debug)]
struct Pending {
    stream: Stream,
    frame: FrameReader,
    peer: SocketAddr,
    deadline: Instant,
}

#[derive(Debug)]
struct ListenState {
    incoming: Incoming,
    pending: Vec<Pending>,
    /// Readiness of the listening socket and the pending kernel sockets.
    poll: Poll,
    next_token: u64,
}

impl ListenState {
    /// Takes new connections while fewer than `max` handshakes are pending.
    fn admit(&mut self, max: usize, timeout: Duration) -> Result<(), CmError> {
        while self.pending.len() < max {
            let (stream, peer) = match &mut self.incoming {
                Incoming::Tcp(l) => match l.accept() {
                    Ok((stream, peer)) => {
                        stream.set_nonblocking(true)?;
                        stream.set_nodelay(true)?;
                        (Stream::Tcp(stream), peer)
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    // Reset before we took it, or interrupted: try the next one.
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted
                        ) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
                Incoming::Smol(l) => match l.accept()? {
                    Some(link) => {
                        let peer = link.peer_addr().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                        (Stream::Smol(link), peer)
                    }
                    None => return Ok(()),
                },
            };
            let token = self.next_token;
            self.next_token += 1;
            if let Stream::Tcp(s) = &stream {
                self.poll.add(s.as_fd(), token, false)?;
            }
            let deadline = crate::deadline::saturating(timeout);
            self.pending.push(Pending { stream, frame: FrameReader::default(), peer, deadline });
        }
        Ok(())
    }

    /// Reads what the pending connections have; the first whole, valid Request comes out.
    /// Connections whose Request is malformed, that closed, or whose time is up are dropped.
    fn progress(&mut self) -> Option<Pending> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let outcome = p
                .stream
                .read_more(&mut p.frame)
                .and_then(|whole| if whole { check_request(&p.frame.buf).map(|()| true) } else { Ok(false) });
            match outcome {
                Ok(true) => {
                    let p = self.pending.swap_remove(i);
                    self.forget(&p);
                    return Some(p);
                }
                Ok(false) if now < p.deadline => i += 1,
                Ok(false) | Err(_) => {
                    if let Err(e) = outcome {
                        tracing::debug!(peer = %p.peer, error = %e, "dropping a connection during its MPA Request");
                    } else {
                        tracing::debug!(peer = %p.peer, "no MPA Request in time: dropping the connection");
                    }
                    let p = self.pending.swap_remove(i);
                    self.forget(&p);
                }
            }
        }
        None
    }

    fn forget(&self, p: &Pending) {
        if let Stream::Tcp(s) = &p.stream {
            let _ = self.poll.delete(s.as_fd());
        }
    }

    /// Waits until something may have changed, at most `timeout` (and no later than the
    /// first pending deadline).
    fn wait(&mut self, timeout: Duration) -> Result<(), CmError> {
        let now = Instant::now();
        let first = self.pending.iter().map(|p| p.deadline.saturating_duration_since(now)).min();
        let nap = first.map_or(timeout, |d| d.min(timeout));
        match &self.incoming {
            Incoming::Tcp(_) => {
                self.poll.wait(&mut Events::with_capacity(64), Some(nap));
            }
            Incoming::Smol(l) => {
                let stack = l.stack();
                stack.poll_now();
                stack.wait(nap.min(Duration::from_millis(5)))?;
                stack.poll_now();
            }
        }
        Ok(())
    }
}

/// Checks that a frame read from a new connection is an MPA Request.
fn check_request(request: &[u8]) -> Result<(), CmError> {
    let parsed = FrameRepr::parse(request).map_err(CmError::Frame)?;
    if parsed.kind != FrameKind::Request {
        return Err(CmError::Frame(FrameError::UnexpectedKind { expected: FrameKind::Request }));
    }
    Ok(())
}

/// A listening endpoint: incoming connections' MPA Requests are read concurrently (at most
/// [`ListenOptions::max_pending`] at once, each within [`ListenOptions::request_timeout`]),
/// and [`Listener::accept`] hands out the first that is whole.
///
/// ```
/// use std::time::Duration;
/// use iwarp::{CmError, ConnectOptions, Device, DeviceConfig};
///
/// let device = Device::open(DeviceConfig::default());
/// let pd = device.alloc_pd();
/// let cq = device.create_cq(16);
/// let listener = device.listen("127.0.0.1:0".parse().unwrap()).unwrap();
/// let addr = listener.local_addr().unwrap();
/// // Refuse every connection, saying why in the private data.
/// let server = std::thread::spawn(move || {
///     let req = listener.accept(Duration::from_secs(5)).unwrap();
///     assert_eq!(req.private_data(), b"may I?");
///     req.reject(b"no").unwrap();
/// });
/// let opts = ConnectOptions { private_data: b"may I?".to_vec(), ..ConnectOptions::default() };
/// match device.connect(addr, &pd, &cq, &cq, &opts) {
///     Err(CmError::Rejected { private_data }) => assert_eq!(private_data, b"no"),
///     other => panic!("{other:?}"),
/// }
/// server.join().unwrap();
/// ```
#[derive(Debug)]
pub struct Listener {
    inner: Arc<ListenerInner>,
}

#[derive(Debug)]
struct ListenerInner {
    state: Mutex<ListenState>,
    dev: Arc<Engine>,
    opts: ListenOptions,
    local: SocketAddr,
    /// Connections made through this listener that are alive.
    live: ConnCount,
}

impl Listener {
    /// [`Listener::accept`] as a future (for any async runtime): the wait runs on a thread of
    /// its own.
    pub fn accept_async(&self, timeout: Duration) -> CmFuture<Result<ConnectRequest, CmError>> {
        let inner = Arc::clone(&self.inner);
        CmFuture::spawn(move || inner.accept(timeout))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.local)
    }

    /// Connection handshakes in progress (MPA Requests not yet whole).
    pub fn pending(&self) -> usize {
        lock(&self.inner.state).pending.len()
    }

    /// Connections made through this listener that are still alive.
    pub fn connections(&self) -> usize {
        self.inner.live.get()
    }

    /// Waits up to `timeout` for the next connection request: a connection whose MPA Request
    /// has arrived whole and well-formed. Meanwhile every pending handshake makes progress.
    pub fn accept(&self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        self.inner.accept(timeout)
    }
}

impl ListenerInner {
    fn accept(&self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        let deadline = crate::deadline::saturating(timeout);
        let mut state = lock(&self.state);
        loop {
            state.admit(self.opts.max_pending.max(1), self.opts.request_timeout)?;
            while let Some(p) = state.progress() {
                let mut stream = p.stream;
                if self.live.get() >= self.opts.max_connections {
                    // At the limit: refuse this client on the wire and keep serving.
                    tracing::debug!(peer = %p.peer, "listener at its connection limit: rejecting");
                    if let Ok(request) = FrameRepr::parse(&p.frame.buf)
                        && let Ok(reply) = Policy::default().reject(&request, &[])
                        && let Ok(bytes) = reply.to_vec()
                    {
                        let _ = stream.write_all(&bytes, Instant::now() + Duration::from_secs(1));
                    }
                    continue;
                }
                return Ok(ConnectRequest {
                    stream,
                    peer: p.peer,
                    request: p.frame.buf,
                    dev: self.dev.clone(),
                    count: self.live.clone(),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            state.wait(left.min(Duration::from_millis(100)))?;
        }
    }
}

/// A connection request waiting for the application's decision (RDMA_CM_EVENT_CONNECT_REQUEST).
#[derive(Debug)]
pub struct ConnectRequest {
    stream: Stream,
    peer: SocketAddr,
    request: Vec<u8>,
    dev: Arc<Engine>,
    count: ConnCount,
}

impl ConnectRequest {
    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The MPA Request (validated when the request was accepted from the listener).
    pub fn request(&self) -> Option<FrameRepr<'_>> {
        FrameRepr::parse(&self.request).ok()
    }

    /// The initiator's private data (after the IRD/ORD word).
    pub fn private_data(&self) -> &[u8] {
        self.request().map_or(&[], |r| r.private_data)
    }

    /// The initiator's IRD/ORD word (MPA revision 2).
    pub fn peer_ird_ord(&self) -> Option<IrdOrd> {
        self.request().and_then(|r| r.ird_ord)
    }

    /// Accepts (rdma_accept): sends the Reply with `opts.private_data` and starts the queue
    /// pair. A Request that the policy cannot take is rejected on the wire and reported; so is
    /// one beyond the device's connection limit.
    pub fn accept(
        mut self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<QueuePair, CmError> {
        let request = FrameRepr::parse(&self.request).map_err(CmError::Frame)?;
        let deadline = crate::deadline::saturating(opts.timeout);
        let limit = self.dev.config.max_connections;
        if self.dev.core().connections() >= limit {
            if let Ok(reply) = Policy::default().reject(&request, &[])
                && let Ok(bytes) = reply.to_vec()
            {
                let _ = self.stream.write_all(&bytes, deadline);
            }
            return Err(CmError::TooManyConnections { limit });
        }
        match opts.policy.respond(&request, &opts.private_data) {
            Ok((reply, params)) => {
                let bytes = reply.to_vec().map_err(CmError::Frame)?;
                self.stream.write_all(&bytes, deadline)?;
                let start = Start {
                    stream: self.stream,
                    handshake: (&self.request, &bytes),
                    params,
                    pd,
                    send_cq,
                    recv_cq,
                    opts,
                    count: Some(self.count),
                };
                start.run(&self.dev)
            }
            Err(refusal) => {
                if let Some(reply) = refusal.reply
                    && let Ok(bytes) = reply.to_vec()
                {
                    let _ = self.stream.write_all(&bytes, deadline);
                }
                Err(refusal.error.into())
            }
        }
    }

    /// [`ConnectRequest::accept`] as a future (for any async runtime).
    pub fn accept_async(
        self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> CmFuture<Result<QueuePair, CmError>> {
        let (pd, send_cq, recv_cq, opts) = (pd.clone(), send_cq.clone(), recv_cq.clone(), opts.clone());
        CmFuture::spawn(move || self.accept(&pd, &send_cq, &recv_cq, &opts))
    }

    /// Rejects (rdma_reject): a Reply with the reject bit and `private_data`, then close.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        let request = FrameRepr::parse(&self.request).map_err(CmError::Frame)?;
        let reply = Policy::default().reject(&request, private_data)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        self.stream.write_all(&reply.to_vec().map_err(CmError::Frame)?, deadline)?;
        if let Stream::Tcp(stream) = &mut self.stream {
            stream.flush()?;
        }
        Ok(())
    }
}
