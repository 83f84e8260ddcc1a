//! Connection management, rdma_cm style: connect, listen, accept or reject with private data.
//!
//! The MPA Request/Reply exchange runs on the caller's thread over a blocking socket with a
//! time limit (siw waits 10 s for a Reply and 5 s for a Request; the defaults here match);
//! the connected socket then goes to the engine with its queue pair. As with Linux rdma_cm
//! over iWARP, the application's private data goes straight into the MPA frames, after the
//! IRD/ORD word of revision 2.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp_mpa::frame::HEADER_LEN;
use iwarp_mpa::{ConnParams, FrameError, FrameRepr, IrdOrd, NegotiationError, Policy, Role};
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
use crate::shared::QpShared;

/// Settings for one connection, either end.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
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
    /// A pause between the Reply and the first FPDU the initiator sends: siw 6.1 hooks its
    /// receive path up only after sending its Reply, and a very fast first FPDU can stall
    /// there (protocol-notes.md). Zero against this stack.
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

/// The byte stream of a connection during its MPA exchange: a blocking kernel socket, or a
/// link of a userspace TCP/IP stack (polled while waiting).
#[derive(Debug)]
enum Transport {
    /// Kernel TCP.
    Tcp(TcpStream),
    /// smoltcp.
    Smol(SmolLink),
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

impl Transport {
    /// Writes all of `bytes` by `deadline`.
    fn write_all(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), CmError> {
        match self {
            Transport::Tcp(stream) => {
                // The request and reply are small: the socket buffer takes them at once.
                stream.write_all(bytes)?;
                Ok(())
            }
            Transport::Smol(link) => {
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
        }
    }

    /// Fills `buf` by `deadline`, reading no byte more.
    fn read_exact_until(&mut self, mut buf: &mut [u8], deadline: Instant) -> Result<(), CmError> {
        while !buf.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            match self {
                Transport::Tcp(stream) => {
                    stream.set_read_timeout(Some(left))?;
                    match stream.read(buf) {
                        Ok(0) => return Err(CmError::Closed),
                        Ok(n) => buf = &mut buf[n..],
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Transport::Smol(link) => match link.recv(buf) {
                    Ok(0) => smol_wait(link, deadline)?,
                    Ok(n) => buf = &mut buf[n..],
                    Err(e) => return Err(link_error(e)),
                },
            }
        }
        Ok(())
    }

    /// Reads one whole MPA frame, no byte more (what follows belongs to the FPDU stream).
    fn read_frame(&mut self, deadline: Instant) -> Result<Vec<u8>, CmError> {
        let mut buf = vec![0u8; HEADER_LEN];
        self.read_exact_until(&mut buf, deadline)?;
        let pd_len = usize::from(u16::from_be_bytes([buf[18], buf[19]]));
        // Check the key and the length before reading more.
        match FrameRepr::parse(&buf) {
            Ok(_) | Err(FrameError::Truncated { .. }) => {}
            Err(e) => return Err(CmError::Frame(e)),
        }
        if pd_len > iwarp_mpa::frame::MAX_PRIVATE_DATA {
            return Err(CmError::Frame(FrameError::PrivateDataTooLong {
                len: pd_len,
                limit: iwarp_mpa::frame::MAX_PRIVATE_DATA,
            }));
        }
        buf.resize(HEADER_LEN + pd_len, 0);
        self.read_exact_until(&mut buf[HEADER_LEN..], deadline)?;
        Ok(buf)
    }

    /// MULPDU for the connection: the MSS as the EMSS (1448-ish on Ethernet, about 64 KiB on
    /// loopback; MTU - 40 on a smoltcp stack), less MPA's framing.
    fn mulpdu(&self, markers: bool) -> usize {
        let mss = match self {
            Transport::Tcp(stream) => socket2::SockRef::from(stream)
                .mss()
                .ok()
                .and_then(|m| usize::try_from(m).ok())
                .unwrap_or(1448),
            Transport::Smol(link) => link.stack().mtu().saturating_sub(40),
        };
        iwarp_mpa::fpdu::mulpdu(mss.clamp(128, 65535), markers).max(64)
    }

    /// The link the engine runs.
    fn into_link(self, opts: &LinkOptions) -> Result<Box<dyn Link>, CmError> {
        Ok(match self {
            Transport::Tcp(stream) => Box::new(TcpLink::from_std(stream, opts)?),
            Transport::Smol(link) => Box::new(link),
        })
    }
}

/// Starts the queue pair of a connection whose MPA exchange (`handshake`: the Request and the
/// Reply as sent) is done.
#[expect(clippy::too_many_arguments, reason = "one private helper, called from connect and accept")]
fn start(
    dev: &Arc<Engine>,
    transport: Transport,
    handshake: (&[u8], &[u8]),
    params: ConnParams,
    pd: &ProtectionDomain,
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Result<QueuePair, CmError> {
    let config = QpConfig {
        mulpdu: transport.mulpdu(params.markers_tx),
        ird: params.ird,
        ord: params.ord,
        max_send_wr: opts.max_send_wr,
        max_recv_wr: opts.max_recv_wr,
        rfc7306: opts.rfc7306,
    };
    let tcp = transport.into_link(&opts.link)?;
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
    for wr in &opts.recv {
        conn.qp().post_recv(wr.clone()).map_err(|e| CmError::Io(io::Error::other(e.to_string())))?;
    }
    let mut core = dev.core();
    let cqs = (send_cq.shared.clone(), recv_cq.shared.clone());
    let shared = core.add(conn, link, pd.id, |qp_num, key| {
        QpShared::new(qp_num, key, config, params, cqs, opts.srq.is_some())
    });
    drop(core);
    dev.ring();
    Ok(QueuePair { shared, dev: dev.clone() })
}

impl Device {
    /// Connects to an iWARP listener at `addr` (rdma_connect): TCP, then the MPA Request and
    /// Reply, then the queue pair runs on the engine.
    pub fn connect(
        &self,
        addr: SocketAddr,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<Connected, CmError> {
        let request = opts.policy.request(&opts.private_data)?.to_vec().map_err(CmError::Frame)?;
        let deadline = Instant::now() + opts.timeout;
        let stream = TcpStream::connect_timeout(&addr, opts.timeout)?;
        stream.set_nodelay(true)?;
        self.handshake(Transport::Tcp(stream), request, deadline, pd, send_cq, recv_cq, opts)
    }

    /// Connects to an iWARP listener at `remote` over a userspace TCP/IP stack (smoltcp on a
    /// TAP device or raw Ethernet interface): the stack's TCP, then the MPA Request and Reply,
    /// then the queue pair runs on the engine, which drives the stack from then on (the
    /// stack is attached to the device, see [`Device::attach_stack`]). MULPDU follows from
    /// the device's MTU (MTU - 40 as the EMSS).
    pub fn connect_smol(
        &self,
        stack: &SmolStack,
        remote: SocketAddr,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<Connected, CmError> {
        let request = opts.policy.request(&opts.private_data)?.to_vec().map_err(CmError::Frame)?;
        let deadline = Instant::now() + opts.timeout;
        self.attach_stack(stack);
        let link = stack.connect(remote)?;
        link.wait_established(opts.timeout)?;
        self.handshake(Transport::Smol(link), request, deadline, pd, send_cq, recv_cq, opts)
    }

    /// The initiator's MPA exchange on a connected transport, then the queue pair.
    #[expect(clippy::too_many_arguments, reason = "one private helper of connect and connect_smol")]
    fn handshake(
        &self,
        mut transport: Transport,
        request: Vec<u8>,
        deadline: Instant,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<Connected, CmError> {
        transport.write_all(&request, deadline)?;
        let reply_bytes = transport.read_frame(deadline)?;
        let reply = FrameRepr::parse(&reply_bytes).map_err(CmError::Frame)?;
        let params = opts.policy.accept_reply(&reply)?;
        let private_data = reply.private_data.to_vec();
        if !opts.first_fpdu_delay.is_zero() {
            std::thread::sleep(opts.first_fpdu_delay);
        }
        let handshake = (&request[..], &reply_bytes[..]);
        let qp = start(&self.engine, transport, handshake, params, pd, send_cq, recv_cq, opts)?;
        Ok(Connected { qp, private_data })
    }

    /// Listens for iWARP connections on `addr` (rdma_listen).
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener, CmError> {
        let listener = TcpListener::bind(addr)?;
        Ok(Listener { listener, dev: self.engine.clone() })
    }

    /// Listens for iWARP connections on TCP port `port` of a userspace TCP/IP stack
    /// (smoltcp); the stack is attached to the device ([`Device::attach_stack`]).
    pub fn listen_smol(&self, stack: &SmolStack, port: u16) -> Result<SmolCmListener, CmError> {
        let listener = stack.listen(port)?;
        self.attach_stack(stack);
        Ok(SmolCmListener { listener, dev: self.engine.clone() })
    }
}

/// Checks that a frame read from a new connection is an MPA Request.
fn check_request(request: &[u8]) -> Result<(), CmError> {
    let parsed = FrameRepr::parse(request).map_err(CmError::Frame)?;
    if parsed.kind != iwarp_mpa::FrameKind::Request {
        return Err(CmError::Frame(FrameError::UnexpectedKind { expected: iwarp_mpa::FrameKind::Request }));
    }
    Ok(())
}

/// A listening endpoint on a userspace TCP/IP stack ([`Device::listen_smol`]).
#[derive(Debug)]
pub struct SmolCmListener {
    listener: SmolListener,
    dev: Arc<Engine>,
}

impl SmolCmListener {
    /// The address it listens on (the stack's address and the port).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Waits up to `timeout` for the next connection request: a TCP connection whose MPA
    /// Request has arrived (within 5 s of the connection).
    pub fn accept(&mut self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        let link = self.listener.accept_timeout(timeout)?;
        let peer = link.peer_addr().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let mut transport = Transport::Smol(link);
        let request = transport.read_frame(Instant::now() + Duration::from_secs(5))?;
        check_request(&request)?;
        Ok(ConnectRequest { stream: transport, peer, request, dev: self.dev.clone() })
    }
}

/// A listening endpoint.
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
    listener: TcpListener,
    dev: Arc<Engine>,
}

impl Listener {
    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits up to `timeout` for the next connection request: a TCP connection whose MPA
    /// Request has arrived (within 5 s of the connection, as siw allows).
    pub fn accept(&self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true)?;
        let (stream, peer) = loop {
            match self.listener.accept() {
                Ok(s) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(CmError::Timeout);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        let mut stream = Transport::Tcp(stream);
        let request = stream.read_frame(Instant::now() + Duration::from_secs(5))?;
        // Validate now, so that the application only sees well-formed requests.
        check_request(&request)?;
        Ok(ConnectRequest { stream, peer, request, dev: self.dev.clone() })
    }
}

/// A connection request waiting for the application's decision (RDMA_CM_EVENT_CONNECT_REQUEST).
#[derive(Debug)]
pub struct ConnectRequest {
    stream: Transport,
    peer: SocketAddr,
    request: Vec<u8>,
    dev: Arc<Engine>,
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
    /// pair. A Request that the policy cannot take is rejected on the wire and reported.
    pub fn accept(
        mut self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: &ConnectOptions,
    ) -> Result<QueuePair, CmError> {
        let request = FrameRepr::parse(&self.request).map_err(CmError::Frame)?;
        match opts.policy.respond(&request, &opts.private_data) {
            Ok((reply, params)) => {
                let bytes = reply.to_vec().map_err(CmError::Frame)?;
                self.stream.write_all(&bytes, Instant::now() + opts.timeout)?;
                let handshake = (&self.request[..], &bytes[..]);
                start(&self.dev, self.stream, handshake, params, pd, send_cq, recv_cq, opts)
            }
            Err(refusal) => {
                if let Some(reply) = refusal.reply
                    && let Ok(bytes) = reply.to_vec()
                {
                    let _ = self.stream.write_all(&bytes, Instant::now() + opts.timeout);
                }
                Err(refusal.error.into())
            }
        }
    }

    /// Rejects (rdma_reject): a Reply with the reject bit and `private_data`, then close.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        let request = FrameRepr::parse(&self.request).map_err(CmError::Frame)?;
        let reply = Policy::default().reject(&request, private_data)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        self.stream.write_all(&reply.to_vec().map_err(CmError::Frame)?, deadline)?;
        if let Transport::Tcp(stream) = &mut self.stream {
            stream.flush()?;
        }
        Ok(())
    }
}
