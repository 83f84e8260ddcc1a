//! `iwarp rping`: the ping of rdmacm-utils' `rping`, on the wire the same, over this stack.
//!
//! Per ping (see docs/rping.md): the client Sends the advertisement of its "start"
//! buffer, the server RDMA Reads it and Sends a go-ahead, the client Sends the advertisement
//! of its "rdma" (sink) buffer, the server RDMA Writes the data there and Sends a second
//! go-ahead. Advertisements are rping's 16-byte `struct rping_rdma_info` (address u64, STag
//! u32, size u32, big-endian); go-aheads are 16 zero bytes.

mod args;
mod proto;
mod seam;

pub(crate) use args::Args;
use args::Rtr;
use proto::{
    BUF_ACCESS, BufInfo, INFO_LEN, MAX_SIZE, Stop, c_string, client_checks, echo_len, mid_ping, mismatch,
    pattern, usize_of,
};

use crate::toolbox::{self, Capture, Fail, flush_stack_capture, open_capture, open_stack, register, resolve};
use crate::toolbox::{cm_message, io_message};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy, RtrTypes};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, ProtectionDomain, QpEvent,
    QpState, QueuePair, RecvWr, STag, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use iwarp::{ListenOptions, Listener};

/// The server's budget of buffer memory, shared by its connections.
#[derive(Debug)]
struct Budget {
    used: std::sync::atomic::AtomicU64,
    limit: u64,
}

impl Budget {
    /// Takes `n` bytes, or says there is no room.
    fn take(&self, n: u64) -> bool {
        use std::sync::atomic::Ordering;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(n)));
    }
}

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    let result = match (&args.device, args.server) {
        (Some(name), true) => seam::server(args, name),
        (Some(name), false) => seam::client(args, name),
        (None, true) => server(args),
        (None, false) => client(args),
    };
    toolbox::exit("rping", result)
}

fn connect_options(args: &Args, capture: Option<&Capture>) -> ConnectOptions {
    ConnectOptions {
        capture: capture.cloned(),
        // rping: responder_resources = initiator_depth = 1, on the wire `00 01 00 01`.
        policy: Policy {
            ird: 1,
            ord: 1,
            crc: if args.crc { CrcPolicy::Wanted } else { CrcPolicy::Off },
            markers_wanted: args.markers,
            revision: args.mpa_rev,
            peer_to_peer: args.p2p,
            rtr: if args.rtr.is_empty() {
                Policy::default().rtr
            } else {
                RtrTypes {
                    write: args.rtr.contains(&Rtr::Write),
                    read: args.rtr.contains(&Rtr::Read),
                    send: args.rtr.contains(&Rtr::Send),
                }
            },
            ..Policy::default()
        },
        timeout: Duration::from_secs(args.timeout),
        // rping's queue pair: 16 send WRs, 2 receive WRs.
        max_send_wr: 16,
        max_recv_wr: 2,
        first_fpdu_delay: Duration::from_millis(args.first_fpdu_delay),
        ..ConnectOptions::default()
    }
}

/// One connection's queue pair and its 16-byte message buffers.
struct Conn {
    qp: QueuePair,
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    timeout: Duration,
    next_wr: u64,
    /// The connection's event, seen while a completion was still to be taken
    /// ([`toolbox::completion_or_event`]).
    event: Option<QpEvent>,
}

impl Conn {
    fn post_recv(&mut self) -> Result<(), Stop> {
        self.next_wr += 1;
        let wr = RecvWr { wr_id: self.next_wr, sgl: self.recv_mr.sge_all().into() };
        self.qp.post_recv(wr).map_err(|e| Stop::Failed(format!("cannot post a receive: {e:?}")))
    }

    /// Sends 16 bytes: an advertisement, or with `None` a go-ahead of zeros.
    fn send_info(&mut self, info: Option<BufInfo>) -> Result<(), Stop> {
        let bytes = info.map_or([0u8; INFO_LEN], BufInfo::to_bytes);
        self.send_mr.write(0, &bytes).map_err(|e| Stop::Failed(format!("send buffer: {e:?}")))?;
        self.next_wr += 1;
        let wr = SendWr {
            wr_id: self.next_wr,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: self.send_mr.sge_all().into(),
            signaled: true,
        };
        self.qp.post_send(wr).map_err(|e| Stop::Failed(format!("cannot post a Send: {e:?}")))
    }

    fn post(&mut self, op: SendOp, mr: &MemoryRegion, len: u32) -> Result<(), Stop> {
        self.next_wr += 1;
        let wr = SendWr { wr_id: self.next_wr, op, sgl: mr.sge(0, len).into(), signaled: true };
        self.qp.post_send(wr).map_err(|e| Stop::Failed(format!("cannot post {op:?}: {e:?}")))
    }

    /// Waits for the next completion of `want`, skipping successful Send completions. `what`
    /// names the wait in error messages.
    fn wait(&mut self, want: WcOpcode, what: &str) -> Result<WorkCompletion, Stop> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Stop::Failed(format!(
                    "timed out after {} s waiting for {what}",
                    self.timeout.as_secs()
                )));
            }
            let slice = left.min(Duration::from_millis(50));
            let wc = match toolbox::completion_or_event(&self.cq, &self.qp, &mut self.event, slice) {
                Ok(Some(wc)) => wc,
                Ok(None) => continue,
                Err(ev) => return Err(event_stop(ev, what)),
            };
            if wc.status != WcStatus::Success {
                // The event (Terminate, connection lost) usually explains the failure better,
                // and may be published just after the flushed completions.
                if let Some(ev) = self.qp.wait_event(Duration::from_millis(200)) {
                    return Err(event_stop(ev, what));
                }
                if wc.status == WcStatus::WrFlushError {
                    return Err(Stop::Closed);
                }
                return Err(Stop::Failed(format!(
                    "{:?} completion failed with {:?} while waiting for {what}",
                    wc.opcode, wc.status
                )));
            }
            if wc.opcode == want {
                return Ok(wc);
            }
        }
    }

    /// Waits for a 16-byte Send from the peer and reposts the receive.
    fn recv_info(&mut self, what: &str) -> Result<BufInfo, Stop> {
        let wc = self.wait(WcOpcode::Recv, what)?;
        if wc.byte_len != INFO_LEN as u64 {
            return Err(Stop::Failed(format!(
                "received bogus data, size {} (expected {INFO_LEN}) while waiting for {what}",
                wc.byte_len
            )));
        }
        let mut b = [0u8; INFO_LEN];
        self.recv_mr.read(0, &mut b).map_err(|e| Stop::Failed(format!("receive buffer: {e:?}")))?;
        self.post_recv()?;
        Ok(BufInfo::parse(&b))
    }

    /// Closes the connection and waits (briefly) until the stream is shut.
    fn close(&self) {
        self.qp.disconnect();
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.qp.state() != QpState::Error && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn event_stop(ev: QpEvent, what: &str) -> Stop {
    match ev {
        QpEvent::LlpLost => Stop::Closed,
        ev => Stop::Failed(toolbox::event_text(ev, Some(what))),
    }
}

// --- client ---------------------------------------------------------------------------------

fn client(args: &Args) -> Result<(), Fail> {
    if args.persistent {
        return Err(Fail::Usage("-P is a server option".into()));
    }
    if args.p2p && args.mpa_rev != 2 {
        return Err(Fail::Usage("--p2p needs MPA revision 2 (--mpa-rev 2)".into()));
    }
    let Some(host) = args.addr.as_deref() else {
        return Err(Fail::Usage("the client needs the server's address (-a ADDR)".into()));
    };
    let addr = resolve(host, args.port)?;
    let size = usize_of(args.size);
    let stack = open_stack(&args.transport, args.pcap.as_deref())?;
    let device = Device::open(DeviceConfig::default());
    let pd = device.alloc_pd();
    let cq = device.create_cq(32);
    let recv_mr = register(&pd, INFO_LEN, Access::LOCAL_WRITE)?;
    let send_mr = register(&pd, INFO_LEN, Access::NONE)?;
    let start_mr = register(&pd, size, BUF_ACCESS)?;
    let rdma_mr = register(&pd, size, BUF_ACCESS)?;
    let capture = open_capture(args.pcap.as_deref(), stack.as_ref())?;
    let opts = ConnectOptions {
        transport: crate::transport::transport(stack.as_ref()),
        ..connect_options(args, capture.as_ref())
    };
    let connected = device
        .connect(addr, &pd, &cq, &cq, &opts)
        .map_err(|e| Fail::Run(format!("cannot connect to {addr}: {}", cm_message(&e))))?;
    let mut conn = Conn {
        qp: connected.qp,
        cq,
        recv_mr,
        send_mr,
        timeout: Duration::from_secs(args.timeout),
        next_wr: 0,
        event: None,
    };
    if args.debug {
        let p = conn.qp.conn_params();
        eprintln!(
            "rping: connected to {addr}: MPA rev {}, CRC {}, IRD {} ORD {}",
            p.revision,
            if p.crc { "on" } else { "off" },
            p.ird,
            p.ord
        );
    }
    let result = client_pings(args, &mut conn, &start_mr, &rdma_mr, size);
    conn.close();
    flush_stack_capture("rping", stack.as_ref());
    if args.debug && result.is_ok() {
        eprintln!("rping: client done, disconnected");
    }
    result
}

fn client_pings(
    args: &Args,
    conn: &mut Conn,
    start_mr: &MemoryRegion,
    rdma_mr: &MemoryRegion,
    size: usize,
) -> Result<(), Fail> {
    let count = args.count.unwrap_or(0);
    conn.post_recv().map_err(|s| Fail::Run(format!("ping 0: {s}")))?;
    let mut k = 0u64;
    while count == 0 || k < count {
        let (data, got) = one_ping(conn, k, start_mr, rdma_mr, size, args.debug)?;
        client_checks(k, &data, &got, args.validate, args.verbose)?;
        k += 1;
    }
    Ok(())
}

/// Ping `k` of a client (its receive for the first go-ahead posted): returns the data sent and
/// the data that came back.
fn one_ping(
    conn: &mut Conn,
    k: u64,
    start_mr: &MemoryRegion,
    rdma_mr: &MemoryRegion,
    size: usize,
    debug: bool,
) -> Result<(Vec<u8>, Vec<u8>), Fail> {
    let size32 = u32::try_from(size).unwrap_or(u32::MAX);
    let start_info = BufInfo::of(start_mr, size32);
    let rdma_info = BufInfo::of(rdma_mr, size32);
    let fail = |s: Stop| match s {
        Stop::Closed => Fail::Run(format!("the server closed the connection during ping {k}")),
        Stop::Failed(m) => Fail::Run(format!("ping {k}: {m}")),
    };
    let data = pattern(k, size);
    start_mr.write(0, &data).map_err(|e| Fail::Run(format!("start buffer: {e:?}")))?;
    if debug {
        eprintln!("rping: ping {k}: advertising the start buffer: {start_info}");
    }
    conn.send_info(Some(start_info)).map_err(fail)?;
    conn.recv_info("the server's go-ahead after its RDMA Read (RDMA_WRITE_ADV)").map_err(fail)?;
    if debug {
        eprintln!("rping: ping {k}: advertising the rdma buffer: {rdma_info}");
    }
    conn.send_info(Some(rdma_info)).map_err(fail)?;
    conn.recv_info("the server's go-ahead after its RDMA Write (RDMA_WRITE_COMPLETE)").map_err(fail)?;
    Ok((data, rdma_mr.to_vec()))
}

// --- the health probe of `iwarp fuzz-peer` ----------------------------------------------------

/// Settings of a health probe: one validated ping through this stack's own API, which makes
/// the peer complete a connection, an RDMA Read, an RDMA Write and Sends both ways.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    /// Time allowed for the connection and each completion.
    pub(crate) timeout: Duration,
    /// Offer peer-to-peer mode (the client; a server agrees when asked).
    pub(crate) p2p: bool,
    /// Record the probe's connection here.
    pub(crate) capture: Option<Capture>,
}

impl Probe {
    fn options(&self) -> ConnectOptions {
        ConnectOptions {
            capture: self.capture.clone(),
            policy: Policy { ird: 1, ord: 1, peer_to_peer: self.p2p, ..Policy::default() },
            timeout: self.timeout,
            max_send_wr: 16,
            max_recv_wr: 2,
            ..ConnectOptions::default()
        }
    }
}

fn fail_text(f: Fail) -> String {
    match f {
        Fail::Usage(m) | Fail::Run(m) => m,
    }
}

/// One validated ping, as `iwarp rping -c -C 1 -V`, against the rping server at `addr`.
pub(crate) fn probe_client(device: &Device, addr: SocketAddr, probe: &Probe) -> Result<(), String> {
    const SIZE: usize = 64;
    let pd = device.alloc_pd();
    let cq = device.create_cq(32);
    let regions = (|| {
        Ok((
            register(&pd, INFO_LEN, Access::LOCAL_WRITE)?,
            register(&pd, INFO_LEN, Access::NONE)?,
            register(&pd, SIZE, BUF_ACCESS)?,
            register(&pd, SIZE, BUF_ACCESS)?,
        ))
    })();
    let (recv_mr, send_mr, start_mr, rdma_mr) = regions.map_err(fail_text)?;
    let connected = device
        .connect(addr, &pd, &cq, &cq, &probe.options())
        .map_err(|e| format!("cannot connect to {addr}: {}", cm_message(&e)))?;
    let mut conn =
        Conn { qp: connected.qp, cq, recv_mr, send_mr, timeout: probe.timeout, next_wr: 0, event: None };
    let result = conn.post_recv().map_err(|s| s.to_string()).and_then(|()| {
        let (data, got) = one_ping(&mut conn, 0, &start_mr, &rdma_mr, SIZE, false).map_err(fail_text)?;
        if got == data { Ok(()) } else { Err(mismatch(0, &data, &got)) }
    });
    conn.close();
    result
}

/// Serves one connection the peer made on `stream`, as `iwarp rping -s`; succeeds when the
/// client completed at least one ping and closed.
pub(crate) fn probe_server(
    device: &Arc<Device>,
    stream: std::net::TcpStream,
    probe: &Probe,
) -> Result<(), String> {
    let peer = stream.peer_addr().map_err(|e| io_message(&e))?;
    let link = iwarp::netdev::TcpLink::from_std(stream, &iwarp::netdev::LinkOptions::default())
        .map_err(|e| io_message(&e))?;
    let settings = ServerSettings {
        budget: Budget { used: 0.into(), limit: 16 << 20 },
        opts: probe.options(),
        size: 64,
        verbose: false,
        debug: false,
        timeout: probe.timeout,
    };
    let Some(p) = Prepared::new(device, &settings).map_err(fail_text)? else {
        return Err("no buffer memory".into());
    };
    let Prepared { device: _, pd, cq, recv_mr, send_mr, mut rdma_mr } = p;
    let first = RecvWr { wr_id: 1, sgl: recv_mr.sge_all().into() };
    let opts = ConnectOptions { recv: vec![first], ..settings.opts.clone() };
    let qp = device
        .accept_link(Box::new(link), &pd, &cq, &cq, &opts)
        .map_err(|e| format!("cannot accept the connection from {peer}: {}", cm_message(&e)))?;
    let mut conn = Conn { qp, cq, recv_mr, send_mr, timeout: probe.timeout, next_wr: 1, event: None };
    let result = serve_pings(&mut conn, &pd, &mut rdma_mr, peer, &settings);
    conn.close();
    match result {
        Ok(0) => Err(format!("{peer} closed the connection before a whole ping")),
        Ok(_) => Ok(()),
        Err(m) => Err(m),
    }
}

// --- server ---------------------------------------------------------------------------------

fn server(args: &Args) -> Result<(), Fail> {
    if args.validate && args.debug {
        eprintln!("rping: -V has no effect on the server");
    }
    let host = args.addr.as_deref().unwrap_or("0.0.0.0");
    let stack = open_stack(&args.transport, args.pcap.as_deref())?;
    let bind = match &stack {
        // smoltcp listens on the stack's own address.
        Some(stack) => SocketAddr::from((stack.ip(), args.port)),
        None => resolve(host, args.port)?,
    };
    // Three regions per client (two small, one that may grow), with room to spare.
    let max_clients = usize::try_from(args.max_clients).unwrap_or(4096);
    let regions = u32::try_from(4 * max_clients + 64).unwrap_or(u32::MAX).max(4096);
    let device = Arc::new(Device::open(DeviceConfig { max_regions: regions, ..DeviceConfig::default() }));
    let lopts =
        ListenOptions { max_connections: max_clients, ..crate::transport::listen_options(stack.as_ref()) };
    let listener = device
        .listen_with(bind, &lopts)
        .map_err(|e| Fail::Run(format!("cannot listen on {bind}: {}", cm_message(&e))))?;
    if args.debug {
        let shown = listener.local_addr().unwrap_or(bind);
        eprintln!("rping: listening on {shown}");
    }
    let capture = open_capture(args.pcap.as_deref(), stack.as_ref())?;
    let settings = Arc::new(ServerSettings {
        budget: Budget { used: 0.into(), limit: args.max_memory << 20 },
        opts: connect_options(args, capture.as_ref()),
        size: usize_of(args.size),
        verbose: args.verbose,
        debug: args.debug,
        timeout: Duration::from_secs(args.timeout),
    });
    let accept_deadline = args.accept_timeout.map(|s| Instant::now() + Duration::from_secs(s));
    loop {
        let req = accept_next(&listener, accept_deadline, args.debug)?;
        let peer = req.peer_addr();
        let Some(prepared) = Prepared::new(&device, &settings)? else {
            eprintln!("rping: rejecting {peer}: the buffer memory budget (--max-memory) is spent");
            let _ = req.reject(&[]);
            continue;
        };
        let served = match accept_and_post(req, prepared, &settings) {
            Ok(served) => served,
            Err(m) => {
                eprintln!("rping: cannot accept the connection from {peer}: {m}");
                settings.budget.give(settings.size as u64);
                continue;
            }
        };
        if args.persistent {
            let settings = settings.clone();
            let spawned = std::thread::Builder::new().name(format!("rping-{peer}")).spawn(move || {
                if let Err(m) = serve(served, peer, &settings) {
                    eprintln!("rping: connection from {peer}: {m}");
                }
            });
            if let Err(e) = spawned {
                eprintln!("rping: cannot start a thread for {peer}: {e}");
            }
        } else {
            let result =
                serve(served, peer, &settings).map_err(|m| Fail::Run(format!("connection from {peer}: {m}")));
            flush_stack_capture("rping", stack.as_ref());
            return result;
        }
    }
}

/// Accepts with the receive for the client's first Send already posted (it may arrive as
/// soon as the client has the Reply), as rping posts it before `rdma_accept`.
fn accept_and_post(req: iwarp::ConnectRequest, p: Prepared, s: &ServerSettings) -> Result<Served, String> {
    let Prepared { device, pd, cq, recv_mr, send_mr, rdma_mr } = p;
    let first = RecvWr { wr_id: 1, sgl: recv_mr.sge_all().into() };
    let opts = ConnectOptions { recv: vec![first], ..s.opts.clone() };
    let qp = req.accept(&pd, &cq, &cq, &opts).map_err(|e| cm_message(&e))?;
    let conn = Conn { qp, cq, recv_mr, send_mr, timeout: s.timeout, next_wr: 1, event: None };
    Ok(Served { _device: device, conn, pd, rdma_mr })
}

/// Waits for the next well-formed connection request; handshakes that fail are reported and
/// skipped.
fn accept_next(
    listener: &Listener,
    deadline: Option<Instant>,
    debug: bool,
) -> Result<iwarp::ConnectRequest, Fail> {
    let req = toolbox::accept_next("rping", listener, deadline)?;
    if debug {
        let ird_ord = req
            .peer_ird_ord()
            .map_or_else(|| "no IRD/ORD (MPA rev 1)".to_string(), |w| format!("IRD {} ORD {}", w.ird, w.ord));
        eprintln!("rping: connection request from {}: {ird_ord}", req.peer_addr());
    }
    Ok(req)
}

/// What every server connection shares.
#[derive(Debug)]
struct ServerSettings {
    budget: Budget,
    opts: ConnectOptions,
    size: usize,
    verbose: bool,
    debug: bool,
    timeout: Duration,
}

/// A connection's resources, made before the request is accepted.
struct Prepared {
    device: Arc<Device>,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    rdma_mr: MemoryRegion,
}

impl Prepared {
    /// A connection's resources, its buffer taken from the budget; `None` when the budget has
    /// no room for it.
    fn new(device: &Arc<Device>, s: &ServerSettings) -> Result<Option<Prepared>, Fail> {
        if !s.budget.take(s.size as u64) {
            return Ok(None);
        }
        let made = (|| {
            let pd = device.alloc_pd();
            let cq = device.create_cq(32);
            let recv_mr = register(&pd, INFO_LEN, Access::LOCAL_WRITE)?;
            let send_mr = register(&pd, INFO_LEN, Access::NONE)?;
            let rdma_mr = register(&pd, s.size, BUF_ACCESS)?;
            Ok(Prepared { device: device.clone(), pd, cq, recv_mr, send_mr, rdma_mr })
        })();
        if made.is_err() {
            s.budget.give(s.size as u64);
        }
        made.map(Some)
    }
}

/// An accepted connection with its receive posted.
struct Served {
    // Kept for the connection's lifetime: its memory regions deregister from it when dropped.
    _device: Arc<Device>,
    conn: Conn,
    pd: ProtectionDomain,
    rdma_mr: MemoryRegion,
}

/// Serves one connection until the client closes it between pings.
fn serve(served: Served, peer: SocketAddr, s: &ServerSettings) -> Result<(), String> {
    let Served { _device, mut conn, pd, mut rdma_mr } = served;
    let result = serve_pings(&mut conn, &pd, &mut rdma_mr, peer, s);
    conn.close();
    s.budget.give(rdma_mr.len() as u64);
    result.map(|_| ())
}

fn serve_pings(
    conn: &mut Conn,
    pd: &ProtectionDomain,
    rdma_mr: &mut MemoryRegion,
    peer: SocketAddr,
    s: &ServerSettings,
) -> Result<u64, String> {
    if s.debug {
        let p = conn.qp.conn_params();
        eprintln!(
            "rping: accepted {peer}: MPA rev {}, CRC {}, IRD {} ORD {}",
            p.revision,
            if p.crc { "on" } else { "off" },
            p.ird,
            p.ord
        );
    }
    let mut k = 0u64;
    loop {
        let a = match conn.recv_info("the client's start buffer advertisement (RDMA_READ_ADV)") {
            Ok(a) => a,
            Err(Stop::Closed) => {
                if s.debug {
                    eprintln!("rping: {peer} disconnected after {k} pings");
                }
                return Ok(k);
            }
            Err(e) => return Err(format!("ping {k}: {e}")),
        };
        if s.debug {
            eprintln!("rping: {peer} ping {k}: client start buffer {a}");
        }
        let len = usize_of(a.size);
        if a.size > MAX_SIZE {
            return Err(format!("ping {k}: the client advertised {} bytes, more than {MAX_SIZE}", a.size));
        }
        if len > rdma_mr.len() {
            let more = (len - rdma_mr.len()) as u64;
            if !s.budget.take(more) {
                return Err(format!(
                    "ping {k}: the client advertised {len} bytes; the server's buffer memory budget \
                     (--max-memory {} MiB) has no room for them",
                    s.budget.limit >> 20
                ));
            }
            match register(pd, len, BUF_ACCESS) {
                Ok(mr) => *rdma_mr = mr,
                Err(f) => {
                    s.budget.give(more);
                    return Err(format!("{f:?}"));
                }
            }
        }
        let read = SendOp::Read { remote_stag: STag(a.rkey), remote_to: a.addr };
        let err = mid_ping(k);
        conn.post(read, rdma_mr, a.size).map_err(err)?;
        conn.wait(WcOpcode::Read, "the RDMA Read of the client's buffer (RDMA_READ_COMPLETE)")
            .map_err(err)?;
        let mut data = vec![0u8; len];
        rdma_mr.read(0, &mut data).map_err(|e| format!("rdma buffer: {e:?}"))?;
        if s.verbose {
            println!("server ping data: {}", c_string(&data));
        }
        conn.send_info(None).map_err(err)?;
        let b = conn.recv_info("the client's rdma buffer advertisement (RDMA_WRITE_ADV)").map_err(err)?;
        if s.debug {
            eprintln!("rping: {peer} ping {k}: client rdma buffer {b}");
        }
        let echo = echo_len(k, &data, &b)?;
        let write = SendOp::Write { remote_stag: STag(b.rkey), remote_to: b.addr };
        conn.post(write, rdma_mr, echo).map_err(err)?;
        conn.wait(WcOpcode::Write, "the RDMA Write to the client (RDMA_WRITE_COMPLETE)").map_err(err)?;
        conn.send_info(None).map_err(err)?;
        k += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_rping() {
        let p = pattern(0, 64);
        assert_eq!(&p[..63], b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr");
        assert_eq!(p[63], 0);
        let p = pattern(1, 64);
        assert!(p[..63].starts_with(b"rdma-ping-1: B") && p[..63].ends_with(b"rs"));
        let p = pattern(10, 64);
        assert!(p.starts_with(b"rdma-ping-10: K"));
        let p = pattern(57, 30);
        assert!(p.starts_with(b"rdma-ping-57: zABC"));
        let p = pattern(1_000_000_000_000, 23);
        assert_eq!(&p, b"rdma-ping-100000000000\0");
    }

    #[test]
    fn buf_info_layout() {
        let i = BufInfo { addr: 0x0000_5605_a16a_3440, rkey: 0x08b0_bb00, size: 64 };
        let b = i.to_bytes();
        assert_eq!(b, [0, 0, 0x56, 0x05, 0xa1, 0x6a, 0x34, 0x40, 0x08, 0xb0, 0xbb, 0x00, 0, 0, 0, 0x40]);
        assert_eq!(BufInfo::parse(&b), i);
    }
}
