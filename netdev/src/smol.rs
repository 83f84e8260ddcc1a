//! Userspace TCP/IP on plain Ethernet: a `smoltcp` stack over a TAP device or a raw Ethernet
//! interface, and [`Link`]s over its TCP sockets.
//!
//! A [`SmolStack`] owns one interface (MAC, IPv4 address/prefix, optional gateway; ARP and the
//! MTU come from smoltcp and the device) and the TCP sockets of its links. It is a shared
//! handle (`Arc<Mutex<..>>`): its [`SmolLink`]s and [`SmolListener`]s hold clones, and the
//! owner drives it with [`SmolStack::poll`], waking up at [`SmolStack::poll_at`] for timers
//! (retransmission, delayed ACK). With [`SmolConfig::auto_poll`] (the default) the links also
//! poll the stack themselves, so an engine that only calls [`Link::recv`] and
//! [`Link::send_vectored`] in its loop keeps the stack going.
//!
//! Devices: a TAP device ([`SmolStack::tap`]) or a raw Ethernet interface through an
//! `AF_PACKET` socket ([`SmolStack::raw`]), for example one end of a veth pair. Both need
//! root (or `CAP_NET_ADMIN` / `CAP_NET_RAW`). Frames cross into the kernel in batches, and
//! where the device offers them with segmentation and checksum offload
//! ([`SmolConfig::offload`], [`SmolStack::offloads`]): smoltcp then sends and takes TCP
//! segments of up to 64 KiB.
//!
//! TCP is tuned for RDMA traffic: large socket buffers (window scaling follows from them),
//! Nagle off, delayed ACK off by default.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, RecvError, State};
use smoltcp::time::{Duration as SmolDuration, Instant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};

use crate::offload::{Offload, Offloads};
pub(crate) use crate::rand::random_u64;
pub use crate::smol_device::DeviceStats;
use crate::smol_device::FrameDevice;
use crate::{Link, LinkError};

/// The first IPv4 address the kernel has on interface `name` (in the calling thread's
/// network namespace), if any.
pub fn interface_ipv4(name: &str) -> io::Result<Option<Ipv4Addr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(addrs
        .filter(|a| a.interface_name == name)
        .filter_map(|a| a.address?.as_sockaddr_in().map(|sin| sin.ip()))
        .next())
}

/// A random locally administered unicast MAC address.
pub fn random_mac() -> [u8; 6] {
    let bytes = random_u64().to_le_bytes();
    let mut mac = [0; 6];
    mac.copy_from_slice(&bytes[..6]);
    mac[0] = (mac[0] & 0xfc) | 0x02;
    mac
}

/// Configuration of a [`SmolStack`].
#[derive(Debug, Clone, PartialEq)]
pub struct SmolConfig {
    /// The interface's MAC address; `None` for a random locally administered one.
    pub mac: Option<[u8; 6]>,
    /// The IPv4 address of the stack.
    pub ip: Ipv4Addr,
    /// Its prefix length (e.g. 24).
    pub prefix_len: u8,
    /// The default gateway, if any.
    pub gateway: Option<Ipv4Addr>,
    /// Receive and send buffer of each TCP socket, in bytes. Above 64 KiB smoltcp scales the
    /// window.
    pub socket_buffer: usize,
    /// Delayed ACK; `None` acknowledges at once (the default: RDMA traffic is bulk and
    /// latency-sensitive at once).
    pub ack_delay: Option<std::time::Duration>,
    /// Nagle's algorithm (off by default: FPDUs are written whole).
    pub nagle: bool,
    /// Listening sockets kept armed per [`SmolListener`]: handshakes in progress (or
    /// connections not yet accepted) at once. smoltcp answers a SYN that no listening socket
    /// takes with RST, so more simultaneous connection attempts than this are refused.
    pub backlog: usize,
    /// How long a listening socket may stay half open (SYN received, the handshake's last
    /// ACK missing) before it is reset and armed again: a SYN from an address that never
    /// answers holds one backlog slot for at most this long.
    pub handshake_timeout: std::time::Duration,
    /// Links poll the stack in [`Link::recv`] (when nothing is buffered) and after
    /// [`Link::send_vectored`], so an engine needs no separate stack poll (timers still want
    /// [`SmolStack::poll`] at [`SmolStack::poll_at`] when the links are idle).
    pub auto_poll: bool,
    /// At most this many interface rounds per [`SmolStack::poll`]; each round processes every
    /// received frame and sends at most one segment per socket.
    pub max_rounds: usize,
    /// Fault injection: each frame (either direction) is dropped with this probability.
    pub drop_chance: f64,
    /// TCP congestion control. Cubic by default: smoltcp retransmits go-back-N, so without
    /// a congestion window a loss costs a whole 4 MiB window of retransmissions.
    pub congestion: tcp::CongestionControl,
    /// Segmentation and checksum offload: [`Offload::Auto`] (the default) uses what the
    /// device offers, [`Offload::Off`] none; [`SmolStack::offloads`] says what is in use.
    pub offload: Offload,
}

impl SmolConfig {
    /// Default TCP socket buffer: 4 MiB each way.
    pub const DEFAULT_BUFFER: usize = 4 << 20;

    /// A configuration with address `ip/prefix_len` and the defaults otherwise.
    pub fn new(ip: Ipv4Addr, prefix_len: u8) -> SmolConfig {
        SmolConfig {
            mac: None,
            ip,
            prefix_len,
            gateway: None,
            socket_buffer: Self::DEFAULT_BUFFER,
            ack_delay: None,
            nagle: false,
            backlog: 4,
            handshake_timeout: std::time::Duration::from_secs(3),
            auto_poll: true,
            max_rounds: 256,
            drop_chance: 0.0,
            congestion: tcp::CongestionControl::Cubic,
            offload: Offload::Auto,
        }
    }
}

struct Inner {
    iface: Interface,
    device: FrameDevice,
    sockets: SocketSet<'static>,
    config: SmolConfig,
    mac: [u8; 6],
    next_port: u16,
    /// Ports with a [`SmolListener`].
    listening: Vec<u16>,
    /// Sockets whose link or listener is gone, removed once closed.
    orphans: Vec<SocketHandle>,
    /// Links' reads poll the stack when nothing is buffered (with `config.auto_poll`); see
    /// [`SmolStack::set_poll_on_read`].
    poll_on_read: bool,
}

impl Inner {
    fn poll(&mut self, now: Instant) -> bool {
        let mut changed = false;
        self.device.start_poll();
        for _ in 0..self.config.max_rounds.max(1) {
            match self.iface.poll(now, &mut self.device, &mut self.sockets) {
                PollResult::SocketStateChanged => changed = true,
                PollResult::None => break,
            }
        }
        // What the rounds queued leaves in one go.
        self.device.flush();
        self.reap_orphans();
        changed
    }

    fn reap_orphans(&mut self) {
        if self.orphans.is_empty() {
            return;
        }
        let sockets = &mut self.sockets;
        self.orphans.retain(|&handle| {
            let closed = sockets.get::<tcp::Socket<'static>>(handle).state() == State::Closed;
            if closed {
                sockets.remove(handle);
            }
            !closed
        });
    }

    fn new_socket(&mut self) -> SocketHandle {
        let size = self.config.socket_buffer.max(1024);
        let rx = tcp::SocketBuffer::new(vec![0; size]);
        let tx = tcp::SocketBuffer::new(vec![0; size]);
        let mut socket = tcp::Socket::new(rx, tx);
        socket.set_nagle_enabled(self.config.nagle);
        socket.set_congestion_control(self.config.congestion);
        socket.set_ack_delay(self.config.ack_delay.map(|d| SmolDuration::from_micros(micros(d))));
        self.sockets.add(socket)
    }

    fn port_in_use(&self, port: u16) -> bool {
        self.listening.contains(&port)
            || self.sockets.iter().any(|(_, socket)| match socket {
                smoltcp::socket::Socket::Tcp(tcp) => {
                    tcp.local_endpoint().is_some_and(|ep| ep.port == port)
                        || tcp.listen_endpoint().port == port
                }
                #[allow(unreachable_patterns)]
                _ => false,
            })
    }

    fn ephemeral_port(&mut self) -> io::Result<u16> {
        for _ in 0..16384 {
            let port = self.next_port;
            self.next_port = if port == u16::MAX { 49152 } else { port + 1 };
            if !self.port_in_use(port) {
                return Ok(port);
            }
        }
        Err(io::Error::new(io::ErrorKind::AddrInUse, "no free ephemeral TCP port on the smoltcp stack"))
    }

    fn tcp(&mut self, handle: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket<'static>>(handle)
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Every stack operation leaves smoltcp's state consistent between calls; recover from a
    // panic elsewhere rather than poisoning every link.
    match inner.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn to_socket_addr(ep: IpEndpoint) -> SocketAddr {
    match ep.addr {
        IpAddress::Ipv4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, ep.port)),
    }
}

/// A userspace TCP/IP stack (smoltcp) on one Ethernet device; a cheap, shared handle.
#[derive(Clone)]
pub struct SmolStack {
    inner: Arc<Mutex<Inner>>,
    fd: RawFd,
}

impl std::fmt::Debug for SmolStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("SmolStack")
            .field("device", &inner.device)
            .field("ip", &inner.config.ip)
            .field("prefix_len", &inner.config.prefix_len)
            .finish_non_exhaustive()
    }
}

impl SmolStack {
    /// A stack on the existing TAP device `name` (`ip tuntap add mode tap name NAME`).
    ///
    /// Errors: the device does not exist (`NotFound`), no permission (`PermissionDenied`:
    /// root or `CAP_NET_ADMIN` needed), the device is attached elsewhere (`AddrInUse`); the
    /// message names the device.
    pub fn tap(name: &str, config: SmolConfig) -> io::Result<SmolStack> {
        SmolStack::new(FrameDevice::open_tap(name, config.offload)?, config)
    }

    /// A stack on the raw Ethernet interface `name` (an `AF_PACKET` socket, promiscuous,
    /// with a receive ring), for example one end of a veth pair, in the calling thread's
    /// network namespace. The kernel side of the interface should carry no address in the
    /// stack's subnet, or the kernel answers too.
    ///
    /// Errors: no such interface (`NotFound`), no permission (`PermissionDenied`: root or
    /// `CAP_NET_RAW` needed); the message names the interface.
    pub fn raw(name: &str, config: SmolConfig) -> io::Result<SmolStack> {
        SmolStack::new(FrameDevice::open_raw(name, config.offload)?, config)
    }

    fn new(mut device: FrameDevice, config: SmolConfig) -> io::Result<SmolStack> {
        if config.prefix_len > 32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("IPv4 prefix length {} is over 32", config.prefix_len),
            ));
        }
        let mac = config.mac.unwrap_or_else(random_mac);
        let ethernet = EthernetAddress(mac);
        if !ethernet.is_unicast() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("MAC address {ethernet} is not a unicast address"),
            ));
        }
        device.set_drop_chance(config.drop_chance);
        let mut iface_config = Config::new(HardwareAddress::Ethernet(ethernet));
        iface_config.random_seed = random_u64();
        let mut iface = Interface::new(iface_config, &mut device, Instant::now());
        let ip = config.ip;
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), config.prefix_len));
        });
        if let Some(gateway) = config.gateway {
            iface.routes_mut().add_default_ipv4_route(gateway).map_err(|_| {
                io::Error::other(format!("cannot add the default route via {gateway}: route table full"))
            })?;
        }
        let fd = device.raw_fd();
        let spread = u16::try_from(random_u64() % 16384).unwrap_or(0);
        let inner = Inner {
            iface,
            device,
            sockets: SocketSet::new(Vec::new()),
            config,
            mac,
            next_port: 49152 + spread,
            listening: Vec::new(),
            orphans: Vec::new(),
            poll_on_read: true,
        };
        Ok(SmolStack { inner: Arc::new(Mutex::new(inner)), fd })
    }

    /// Processes received frames, timers and queued data; true if any socket's state may have
    /// changed (bytes arrived or left, a connection opened or closed).
    pub fn poll(&self, now: Instant) -> bool {
        lock(&self.inner).poll(now)
    }

    /// [`SmolStack::poll`] at the current time.
    pub fn poll_now(&self) -> bool {
        self.poll(Instant::now())
    }

    /// When to poll next at the latest (a timer is due), or `None` if only received frames or
    /// new data can give the stack something to do.
    pub fn poll_at(&self, now: Instant) -> Option<Instant> {
        let mut inner = lock(&self.inner);
        let inner = &mut *inner;
        inner.iface.poll_at(now, &inner.sockets)
    }

    /// How long until the next timer is due ([`SmolStack::poll_at`] relative to `now`).
    pub fn poll_delay(&self, now: Instant) -> Option<std::time::Duration> {
        let mut inner = lock(&self.inner);
        let inner = &mut *inner;
        inner
            .iface
            .poll_delay(now, &inner.sockets)
            .map(|d| std::time::Duration::from_micros(d.total_micros()))
    }

    /// Blocks until a frame arrives, the next timer is due, or `timeout` passed, whichever is
    /// first (it does not poll).
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<()> {
        let delay = self.poll_delay(Instant::now()).map_or(timeout, |d| d.min(timeout));
        crate::smol_device::wait_readable(self.fd, Some(SmolDuration::from_micros(micros(delay))))
    }

    /// The descriptor that becomes readable when a frame arrives, for an event loop (owned by
    /// the stack: do not close it).
    pub fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// [`SmolStack::raw_fd`] borrowed for as long as this handle lives, for registering with
    /// a readiness poll.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        crate::frame_io::borrow_fd(&self.fd)
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        lock(&self.inner).mac
    }

    /// The stack's IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        lock(&self.inner).config.ip
    }

    /// The device's MTU (largest IP packet).
    pub fn mtu(&self) -> usize {
        lock(&self.inner).device.mtu()
    }

    /// Whether a link's read polls the stack when nothing is buffered (on by default, with
    /// [`SmolConfig::auto_poll`]). An engine that polls the stack itself turns it off: then
    /// the bytes a read returns were all taken in by an earlier poll, never by the read
    /// itself, so whatever the application posted before the engine last looked (receive
    /// buffers, say) is known before any bytes its peer sent in answer are read.
    pub fn set_poll_on_read(&self, on: bool) {
        lock(&self.inner).poll_on_read = on;
    }

    /// The offloads the device uses (see [`SmolConfig::offload`]).
    pub fn offloads(&self) -> Offloads {
        lock(&self.inner).device.offloads()
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        lock(&self.inner).device.name().to_owned()
    }

    /// The TCP states of the stack's sockets (listening, connecting and connected ones), for
    /// monitoring and tests.
    pub fn tcp_states(&self) -> Vec<State> {
        let inner = lock(&self.inner);
        inner
            .sockets
            .iter()
            .filter_map(|(_, socket)| match socket {
                smoltcp::socket::Socket::Tcp(tcp) => Some(tcp.state()),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .collect()
    }

    /// The device's frame counters.
    pub fn device_stats(&self) -> DeviceStats {
        lock(&self.inner).device.stats()
    }

    /// Changes the fault-injection drop probability of frames (either direction).
    pub fn set_drop_chance(&self, chance: f64) {
        let mut inner = lock(&self.inner);
        inner.config.drop_chance = chance;
        inner.device.set_drop_chance(chance);
    }

    /// Records every frame crossing the device (as on the wire) into a pcap file at `path`.
    pub fn capture(&self, path: &Path) -> io::Result<()> {
        lock(&self.inner).device.set_capture(path)
    }

    /// Flushes the pcap capture; reports its first write error, if any.
    pub fn flush_capture(&self) -> io::Result<()> {
        lock(&self.inner).device.flush_capture()
    }

    /// Starts connecting to `remote` (IPv4) from an ephemeral port; does not wait. The link
    /// reports `Ok(0)` until it is established; see [`SmolLink::wait_established`].
    pub fn connect(&self, remote: SocketAddr) -> io::Result<SmolLink> {
        let SocketAddr::V4(remote) = remote else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the smoltcp stack speaks IPv4 only, not {remote}"),
            ));
        };
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let port = inner.ephemeral_port()?;
        let handle = inner.new_socket();
        let local = SocketAddrV4::new(inner.config.ip, port);
        let remote_ep = IpEndpoint::new(IpAddress::Ipv4(*remote.ip()), remote.port());
        let result = inner.sockets.get_mut::<tcp::Socket<'static>>(handle).connect(
            inner.iface.context(),
            remote_ep,
            port,
        );
        if let Err(err) = result {
            inner.sockets.remove(handle);
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("connecting to {remote} from {local}: {err}"),
            ));
        }
        if inner.config.auto_poll {
            inner.poll(Instant::now());
        }
        drop(guard);
        Ok(SmolLink::new(self.clone(), handle, Some(SocketAddr::V4(local)), Some(SocketAddr::V4(remote))))
    }

    /// Listens on TCP port `port` of the stack's address. `AddrInUse` if the port already has
    /// a listener or a connection.
    pub fn listen(&self, port: u16) -> io::Result<SmolListener> {
        if port == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot listen on TCP port 0"));
        }
        let mut inner = lock(&self.inner);
        if inner.port_in_use(port) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("TCP port {port} of {} is already in use on the smoltcp stack", inner.config.ip),
            ));
        }
        inner.listening.push(port);
        let mut backlog = Vec::new();
        for _ in 0..inner.config.backlog.max(1) {
            backlog.push(arm(&mut inner, port)?);
        }
        drop(inner);
        Ok(SmolListener { stack: self.clone(), port, backlog })
    }
}

/// A new socket listening on `port`, which gives up a handshake that stalls for the
/// configured handshake timeout.
fn arm(inner: &mut Inner, port: u16) -> io::Result<SocketHandle> {
    let handle = inner.new_socket();
    let timeout = SmolDuration::from_micros(micros(inner.config.handshake_timeout));
    let socket = inner.tcp(handle);
    socket.set_timeout(Some(timeout));
    if let Err(err) = socket.listen(port) {
        inner.sockets.remove(handle);
        return Err(io::Error::other(format!("listening on TCP port {port}: {err}")));
    }
    Ok(handle)
}

/// A listening TCP port of a [`SmolStack`]: a few armed listening sockets (the backlog); each
/// accepted connection is replaced by a fresh listening socket.
#[derive(Debug)]
pub struct SmolListener {
    stack: SmolStack,
    port: u16,
    backlog: Vec<SocketHandle>,
}

impl SmolListener {
    /// The listening port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The local address (the stack's IPv4 address and the port).
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.stack.ip(), self.port))
    }

    /// The stack this listener is on.
    pub fn stack(&self) -> &SmolStack {
        &self.stack
    }

    /// An established connection, if one is ready (polls the stack first when
    /// [`SmolConfig::auto_poll`] is on); never blocks.
    pub fn accept(&mut self) -> io::Result<Option<SmolLink>> {
        let mut inner = lock(&self.stack.inner);
        if inner.config.auto_poll {
            inner.poll(Instant::now());
        }
        for slot in 0..self.backlog.len() {
            let handle = self.backlog[slot];
            let state = inner.tcp(handle).state();
            match state {
                State::Listen | State::SynReceived => {}
                State::Closed => {
                    // Reset during the handshake: listen again.
                    if let Err(err) = inner.tcp(handle).listen(self.port) {
                        return Err(io::Error::other(format!(
                            "re-listening on TCP port {}: {err}",
                            self.port
                        )));
                    }
                }
                _ => {
                    let socket = inner.tcp(handle);
                    // Established: the handshake timeout no longer applies.
                    socket.set_timeout(None);
                    let local = socket.local_endpoint().map(to_socket_addr);
                    let peer = socket.remote_endpoint().map(to_socket_addr);
                    self.backlog[slot] = arm(&mut inner, self.port)?;
                    drop(inner);
                    return Ok(Some(SmolLink::new(self.stack.clone(), handle, local, peer)));
                }
            }
        }
        Ok(None)
    }

    /// Waits (polling the stack) for a connection for at most `timeout`; `TimedOut` if none.
    pub fn accept_timeout(&mut self, timeout: std::time::Duration) -> io::Result<SmolLink> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.stack.poll_now();
            if let Some(link) = self.accept()? {
                return Ok(link);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection on TCP port {} within {timeout:?}", self.port),
                ));
            }
            self.stack.wait(left.min(std::time::Duration::from_millis(10)))?;
        }
    }
}

impl Drop for SmolListener {
    fn drop(&mut self) {
        let mut inner = lock(&self.stack.inner);
        for &handle in &self.backlog {
            inner.tcp(handle).abort();
            inner.orphans.push(handle);
        }
        let port = self.port;
        inner.listening.retain(|&p| p != port);
        inner.poll(Instant::now());
    }
}

/// A TCP connection of a [`SmolStack`] as a [`Link`].
///
/// Dropping it closes the connection in order (the stack finishes sending what was accepted,
/// then frees the socket; it gives up after a minute without progress).
#[derive(Debug)]
pub struct SmolLink {
    stack: SmolStack,
    handle: SocketHandle,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    write_shut: bool,
    read_closed: bool,
}

impl SmolLink {
    fn new(
        stack: SmolStack,
        handle: SocketHandle,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    ) -> Self {
        SmolLink { stack, handle, local, peer, write_shut: false, read_closed: false }
    }

    /// The stack this link is on.
    pub fn stack(&self) -> &SmolStack {
        &self.stack
    }

    /// The TCP state (smoltcp's).
    pub fn state(&self) -> State {
        lock(&self.stack.inner).tcp(self.handle).state()
    }

    /// Whether the handshake is done and the connection still open in both directions or
    /// closing (bytes may flow).
    pub fn is_established(&self) -> bool {
        !matches!(self.state(), State::Closed | State::Listen | State::SynSent | State::SynReceived)
    }

    /// Polls the stack until the connection is established; `ConnectionRefused` if it was
    /// reset, `TimedOut` after `timeout`.
    pub fn wait_established(&self, timeout: std::time::Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.stack.poll_now();
            match self.state() {
                State::SynSent | State::SynReceived | State::Listen => {}
                State::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!("connection to {} refused or reset", fmt_addr(self.peer)),
                    ));
                }
                _ => return Ok(()),
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {}: no answer within {timeout:?}", fmt_addr(self.peer)),
                ));
            }
            self.stack.wait(left.min(std::time::Duration::from_millis(10)))?;
        }
    }

    /// Resets the connection (TCP RST): the peer sees [`LinkError::Reset`].
    pub fn abort(&mut self) {
        let mut inner = lock(&self.stack.inner);
        inner.tcp(self.handle).abort();
        inner.poll(Instant::now());
    }

    /// Bytes accepted by [`Link::send_vectored`] and not yet acknowledged by the peer.
    pub fn send_queue(&self) -> usize {
        lock(&self.stack.inner).tcp(self.handle).send_queue()
    }
}

fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "the peer".to_owned(), |a| a.to_string())
}

impl Link for SmolLink {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.recv_vectored(&mut [IoSliceMut::new(buf)])
    }

    /// Copies straight from the socket's receive buffer into `bufs`, under one lock of the
    /// stack.
    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, LinkError> {
        if self.read_closed {
            return Err(LinkError::Closed);
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        let mut inner = lock(&self.stack.inner);
        let auto_poll = inner.config.auto_poll && inner.poll_on_read;
        for attempt in 0..2 {
            let socket = inner.tcp(self.handle);
            match socket.state() {
                State::SynSent | State::SynReceived | State::Listen => {
                    if attempt == 0 && auto_poll {
                        inner.poll(Instant::now());
                        continue;
                    }
                    return Ok(0);
                }
                _ => {}
            }
            let mut total = 0;
            let mut end = None;
            for buf in bufs.iter_mut() {
                match socket.recv_slice(buf) {
                    Ok(n) => {
                        total += n;
                        if n < buf.len() {
                            break;
                        }
                    }
                    Err(e) => {
                        end = Some(e);
                        break;
                    }
                }
            }
            match (total, end) {
                (0, Some(RecvError::Finished)) => {
                    self.read_closed = true;
                    return Err(LinkError::Closed);
                }
                (0, Some(RecvError::InvalidState)) => return Err(LinkError::Reset),
                (0, None) if attempt == 0 && auto_poll => {
                    inner.poll(Instant::now());
                }
                // The end of the stream, if it came after the bytes, is reported next call.
                (n, _) => {
                    if n > 0 && auto_poll {
                        // Window updates go out without waiting for the next poll.
                        inner.poll(Instant::now());
                    }
                    return Ok(n);
                }
            }
        }
        Ok(0)
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError> {
        if self.write_shut {
            return Err(LinkError::WriteShutdown);
        }
        let mut inner = lock(&self.stack.inner);
        let auto_poll = inner.config.auto_poll;
        let socket = inner.tcp(self.handle);
        match socket.state() {
            State::SynSent | State::SynReceived | State::Listen => return Ok(0),
            State::Established | State::CloseWait => {}
            _ => return Err(LinkError::Reset),
        }
        let mut sent = 0;
        for buf in bufs {
            if buf.is_empty() {
                continue;
            }
            match socket.send_slice(buf) {
                Ok(n) => {
                    sent += n;
                    if n < buf.len() {
                        break;
                    }
                }
                Err(_) => {
                    if sent == 0 {
                        return Err(LinkError::Reset);
                    }
                    break;
                }
            }
        }
        if sent > 0 && auto_poll {
            inner.poll(Instant::now());
        }
        Ok(sent)
    }

    fn shutdown_write(&mut self) {
        if self.write_shut {
            return;
        }
        self.write_shut = true;
        let mut inner = lock(&self.stack.inner);
        inner.tcp(self.handle).close();
        if inner.config.auto_poll {
            inner.poll(Instant::now());
        }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }
}

impl Drop for SmolLink {
    fn drop(&mut self) {
        let mut inner = lock(&self.stack.inner);
        let socket = inner.tcp(self.handle);
        socket.close();
        // A peer that never acknowledges must not keep the socket forever.
        socket.set_timeout(Some(SmolDuration::from_secs(60)));
        inner.orphans.push(self.handle);
        inner.poll(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_macs_are_local_unicast() {
        for _ in 0..32 {
            let mac = random_mac();
            assert_eq!(mac[0] & 0x03, 0x02, "{mac:02x?}");
        }
    }

    #[test]
    fn missing_interfaces_are_named() {
        let cfg = SmolConfig::new(Ipv4Addr::new(10, 9, 0, 1), 24);
        let err = SmolStack::raw("iwnosuchif0", cfg.clone()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("iwnosuchif0"), "{err}");
        let err = SmolStack::tap("iwnosuchtap0", cfg).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("iwnosuchtap0"), "{err}");
    }
}
