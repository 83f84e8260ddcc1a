//! `iwarp perftest`: perftest's `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R`, on the
//! wire the same (perftest 4.5-0.17, internal version 6.06; see docs/perftest.md).
//!
//! Two rdma_cm (TCP + MPA) connections, both from the client to the server's port: the
//! control connection carries perftest's lockstep Sends (version, cycle buffer, cache line,
//! MTU, the "pre"/"post" handshakes, the 56-byte key records, the report); the data
//! connection carries the test traffic.

mod wire;

use crate::{cm_message, io_message};
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::netdev::PcapWriter;
use iwarp::{
    Access, CmError, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, ProtectionDomain,
    QpEvent, QpState, QueuePair, RecvWr, STag, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use wire::{KeyRecord, Report};

/// Exit status of a failed run.
const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error found after parsing.
const EXIT_USAGE: u8 = 2;
/// perftest's port.
const DEFAULT_PORT: u16 = 18515;
/// perftest's largest message size (`MAX_SIZE`, 8 MiB).
const MAX_SIZE: u32 = 8 << 20;
/// Our cycle buffer (the page size) and cache line size, sent in messages 2 and 3.
const CYCLE_BUFFER: u32 = 4096;
/// Cache line size.
const CACHE_LINE: u32 = 64;
/// The verbs MTU enum we report: 3 = 1024 bytes, what siw shows on a 1500-byte netdev.
const MTU_ENUM: u8 = 3;
/// Outstanding reads on the read test's data connection (siw's `max_qp_rd_atom`).
const MAX_OUT_READS: u16 = 128;
/// perftest's RESULT_LINE.
const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";
/// Iterations above which the peak is estimated from a sample of windows.
const PEAK_FULL_LIMIT: usize = 4000;

/// The test to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Test {
    /// RDMA Write bandwidth (ib_write_bw).
    Write,
    /// RDMA Read bandwidth (ib_read_bw).
    Read,
    /// Send bandwidth (ib_send_bw, with perftest's iWARP credit flow control).
    Send,
}

/// Measure bandwidth as perftest's `ib_write_bw -R`, `ib_read_bw -R` or `ib_send_bw -R`,
/// interoperating with them (perftest 4.5-0.17, e.g. over Linux siw).
///
/// Without an address it runs the server: it listens on the port (all addresses unless
/// --bind) and serves one client. With an address it runs the client, which opens perftest's
/// two rdma_cm connections (control, then data), exchanges keys with Sends, runs the test and
/// prints perftest's table. Write/read: the server prints the client's numbers; send: each
/// side prints its own (the server's peak is 0.00, as perftest's).
///
/// -R is implied (perftest over iWARP needs it) and -F is accepted for compatibility. Both
/// sides must agree on -s, -n/-D and --report_gbits, as with perftest.
///
/// Against Linux siw 6.1 no flag is needed: siw may leave a first message that follows its MPA
/// Reply at once unread, and the client nudges it (docs/siw-quirks.md).
///
/// Exit status: 0 when the test ran, 1 on a failure (refused, rejected, a Terminate, a
/// timeout, a peer that does not speak the protocol; one line on stderr names the cause), 2
/// on bad flags.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The test: write, read or send.
    #[arg(value_enum)]
    test: Test,
    /// The server's address: run the client. Without it, run the server.
    #[arg(value_name = "ADDRESS")]
    address: Option<String>,
    /// Message size in bytes (1 to 8388608).
    #[arg(short = 's', long = "size", default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SIZE)))]
    size: u32,
    /// Messages to send [default: 5000 for write, 1000 for read and send]; at least 5.
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(5..=100_000_000))]
    iters: Option<u64>,
    /// Run for SECS seconds instead of a number of messages (both sides need the same -D).
    #[arg(short = 'D', long = "duration", value_name = "SECS", conflicts_with = "iters",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration: Option<u64>,
    /// TCP port of both connections.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Send queue depth (cut to -n).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    tx_depth: u32,
    /// Receive queue depth of send (cut to -n, rounded up to even).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    rx_depth: u32,
    /// Signal every N-th work request (cut to the tx depth; 1 for sizes above 8192).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    cq_mod: u32,
    /// Outstanding RDMA Reads (read test), at most 128.
    #[arg(short = 'o', long = "outs", default_value_t = MAX_OUT_READS,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_OUT_READS)))]
    outs: u16,
    /// Use rdma_cm for the data connection and the key exchange (always on: implied).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Do not fail on CPU frequency warnings (accepted, no effect).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Device name shown in the table (perftest's -d).
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME", default_value = "iwarp0")]
    ib_dev: String,
    /// Report bandwidth in Gb/sec instead of MB/sec (both sides need the same flag).
    #[arg(long = "report_gbits", alias = "report-gbits")]
    report_gbits: bool,
    /// Ask for MPA CRC32c on both connections.
    #[arg(long)]
    crc: bool,
    /// Client: milliseconds to wait between the MPA Reply and the first Send on each
    /// connection (not needed against Linux siw 6.1: the client nudges a peer that leaves it
    /// unread).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    first_fpdu_delay: u64,
    /// Server: the address to listen on [default: 0.0.0.0].
    #[arg(long, value_name = "ADDR")]
    bind: Option<String>,
    /// Seconds a connection attempt or a control message may take (the data phase is not
    /// limited while the peer makes progress).
    #[arg(long, value_name = "SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout: u64,
    /// Server: give up when no client connects within SECS (default: wait forever).
    #[arg(long, value_name = "SECS")]
    accept_timeout: Option<u64>,
    /// Server: how long the client's run may last (the wait for its end-of-run record; in
    /// duration mode -D plus --timeout is used when longer).
    #[arg(long, value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    run_timeout: u64,
    /// Record both connections into this pcap file (readable by tshark and `iwarp dissect`).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    #[command(flatten)]
    transport: crate::transport::TransportArgs,
}

/// Why a run failed.
#[derive(Debug)]
enum Fail {
    /// A flag combination clap cannot check.
    Usage(String),
    /// Anything else.
    Run(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail::Run(s)
    }
}

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    let result = match args.address.as_deref() {
        Some(host) => client(args, host),
        None => server(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("perftest: {m}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Fail::Run(m)) => {
            eprintln!("perftest: {m}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The largest cycle buffer a peer may make this side use (perftest sends its page size).
const MAX_PEER_CYCLE: u32 = 16 << 20;

// --- parameters -------------------------------------------------------------------------------

/// The run's parameters after perftest's adjustments.
#[derive(Debug, Clone)]
struct Params {
    test: Test,
    size: u32,
    /// Messages (0 in duration mode).
    iters: u64,
    duration: Option<Duration>,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
    out_reads: u16,
    gbits: bool,
    timeout: Duration,
}

impl Params {
    fn new(args: &Args) -> Params {
        let default_iters = if args.test == Test::Write { 5000 } else { 1000 };
        let duration = args.duration.map(Duration::from_secs);
        let iters = if duration.is_some() { 0 } else { args.iters.unwrap_or(default_iters) };
        let cut = |d: u32| if iters == 0 { d } else { u32::try_from(iters).unwrap_or(u32::MAX).min(d) };
        let tx_depth = cut(args.tx_depth);
        let mut rx_depth = cut(args.rx_depth);
        if iters != 0 && rx_depth % 2 == 1 {
            rx_depth += 1;
        }
        let cq_mod = if args.size > 8192 { 1 } else { args.cq_mod.min(tx_depth) };
        Params {
            test: args.test,
            size: args.size,
            iters,
            duration,
            tx_depth,
            rx_depth,
            cq_mod,
            out_reads: if args.test == Test::Read { args.outs } else { 1 },
            gbits: args.report_gbits,
            timeout: Duration::from_secs(args.timeout),
        }
    }
}

/// What the control exchange settled: the larger cycle buffer and cache line, the MTU.
#[derive(Debug, Clone, Copy)]
struct Agreed {
    cycle: u32,
    cache_line: u32,
    mtu: u8,
}

impl Agreed {
    /// Bytes of each half of the data buffer: max(size, cycle buffer), cache-line rounded.
    fn half(&self, size: u32) -> usize {
        let line = usize::try_from(self.cache_line.max(1)).unwrap_or(64);
        let n = usize::try_from(size.max(self.cycle)).unwrap_or(usize::MAX);
        n.div_ceil(line) * line
    }

    /// Offset of message `i` in a half: successive small messages step through the cycle
    /// buffer by the size rounded up to a cache line; larger ones all use offset 0.
    fn offset(&self, size: u32, i: u64) -> u64 {
        if size > self.cycle / 2 {
            return 0;
        }
        let line = u64::from(self.cache_line.max(1));
        let step = u64::from(size).div_ceil(line) * line;
        let slots = (u64::from(self.cycle) / step).max(1);
        (i % slots) * step
    }
}

// --- helpers ----------------------------------------------------------------------------------

/// A random 64-bit value (std's per-process hash keys, mixed with the time).
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Random payload bytes (xorshift), as perftest fills its buffers.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut x = random_u64() | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, Fail> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| Fail::Run(format!("cannot resolve {host}: {}", io_message(&e))))?;
    let mut first = None;
    for a in addrs {
        if a.is_ipv4() {
            return Ok(a);
        }
        first.get_or_insert(a);
    }
    // perftest -R is IPv4 only; take what there is.
    first.ok_or_else(|| Fail::Run(format!("cannot resolve {host}: no address")))
}

fn register(pd: &ProtectionDomain, len: usize, access: Access) -> Result<MemoryRegion, Fail> {
    pd.register(len, access).map_err(|e| Fail::Run(e.to_string()))
}

/// The data buffer's rights: local write, remote read and remote write (iWARP Read sinks
/// need remote write, as perftest grants on iWARP).
const DATA_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

type Capture = Arc<Mutex<PcapWriter>>;
use iwarp::netdev::SmolStack;
use iwarp::{ListenOptions, Listener};

/// Opens the smoltcp stack of `--transport smoltcp` (with `--pcap`: capturing its frames).
fn open_stack(args: &Args) -> Result<Option<SmolStack>, Fail> {
    let Some((dev, config)) = args.transport.check().map_err(Fail::Usage)? else {
        return Ok(None);
    };
    let stack = crate::transport::open_stack(&dev, config).map_err(Fail::Run)?;
    if let Some(path) = &args.pcap {
        crate::transport::capture(&stack, path).map_err(Fail::Run)?;
    }
    Ok(Some(stack))
}

/// Flushes the frames a smoltcp stack recorded (`--pcap`).
fn flush_stack_capture(stack: Option<&SmolStack>) {
    if let Some(stack) = stack
        && let Err(e) = stack.flush_capture()
    {
        eprintln!("perftest: cannot write the capture: {}", io_message(&e));
    }
}

/// Connects over the kernel's TCP or the smoltcp stack.
fn connect_any(
    device: &Device,
    stack: Option<&SmolStack>,
    addr: SocketAddr,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Result<iwarp::Connected, CmError> {
    let opts = ConnectOptions { transport: crate::transport::transport(stack), ..opts.clone() };
    device.connect(addr, pd, cq, cq, &opts)
}

fn open_capture(args: &Args) -> Result<Option<Capture>, Fail> {
    if args.transport.smoltcp() {
        // The stack records the real frames instead.
        return Ok(None);
    }
    match &args.pcap {
        Some(path) => PcapWriter::create(path)
            .map(|w| Some(w.shared()))
            .map_err(|e| Fail::Run(format!("cannot create {}: {}", path.display(), io_message(&e)))),
        None => Ok(None),
    }
}

fn flush_capture(c: Option<&Capture>) {
    if let Some(c) = c {
        let mut w = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = w.flush() {
            eprintln!("perftest: cannot write the capture: {}", io_message(&e));
        }
    }
}

/// Options of either connection: `ird_ord` for the IRD/ORD word (0/0 except the read test's
/// data connection), one pre-posted receive on the control connection.
fn conn_options(args: &Args, ird_ord: u16, capture: Option<&Capture>) -> ConnectOptions {
    ConnectOptions {
        policy: Policy {
            ird: ird_ord,
            ord: ird_ord,
            crc: if args.crc { CrcPolicy::Wanted } else { CrcPolicy::Off },
            ..Policy::default()
        },
        timeout: Duration::from_secs(args.timeout),
        first_fpdu_delay: Duration::from_millis(args.first_fpdu_delay),
        capture: capture.cloned(),
        ..ConnectOptions::default()
    }
}

fn event_text(ev: QpEvent) -> String {
    match ev {
        QpEvent::LlpLost => "the peer closed the connection".to_string(),
        QpEvent::RemoteTerminate { header, siw } => {
            format!("the peer sent a Terminate: {} (read as siw lays it out: {})", header.cause, siw.cause)
        }
        QpEvent::LocalTerminate(code) => {
            format!("terminated the connection after a protocol error by the peer: {code}")
        }
    }
}

/// A failed completion as text, preferring the queue pair's event (the likelier cause).
fn wc_failure(qp: &QueuePair, wc: &WorkCompletion, what: &str) -> String {
    if let Some(ev) = qp.wait_event(Duration::from_millis(200)) {
        return format!("{} while waiting for {what}", event_text(ev));
    }
    if wc.status == WcStatus::WrFlushError {
        return format!("the connection closed while waiting for {what}");
    }
    format!("{:?} completion failed with {:?} while waiting for {what}", wc.opcode, wc.status)
}

/// Waits (at most `limit`) until the peer has closed `qp` or it left RTS.
fn wait_closed(qp: &QueuePair, limit: Duration) {
    let deadline = Instant::now() + limit;
    while qp.state() == QpState::Rts && Instant::now() < deadline {
        if qp.poll_event().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Closes `qp` and waits (briefly) until its stream is shut.
fn close(qp: &QueuePair) {
    qp.disconnect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while qp.state() != QpState::Error && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

// --- control channel --------------------------------------------------------------------------

/// The control connection: one 56-byte receive posted at all times, lockstep Sends.
struct Ctrl {
    qp: QueuePair,
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    /// Completions of the other kind seen while waiting for one kind.
    stash: Vec<WorkCompletion>,
    timeout: Duration,
    server: bool,
    next_wr: u64,
}

/// The control connection's buffers, registered before it is made (its receive is posted
/// before the connection goes live).
struct CtrlBufs {
    cq: CompletionQueue,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
}

impl CtrlBufs {
    fn new(device: &Device, pd: &ProtectionDomain) -> Result<CtrlBufs, Fail> {
        Ok(CtrlBufs {
            cq: device.create_cq(16),
            recv_mr: register(pd, wire::MAX_MSG, Access::LOCAL_WRITE)?,
            send_mr: register(pd, wire::MAX_MSG, Access::NONE)?,
        })
    }

    /// The receive posted before the connection goes live.
    fn first_recv(&self) -> RecvWr {
        RecvWr { wr_id: 0, sgl: self.recv_mr.sge_all().into() }
    }

    fn into_ctrl(self, qp: QueuePair, timeout: Duration, server: bool) -> Ctrl {
        Ctrl {
            qp,
            cq: self.cq,
            recv_mr: self.recv_mr,
            send_mr: self.send_mr,
            stash: Vec::new(),
            timeout,
            server,
            next_wr: 1,
        }
    }
}

impl Ctrl {
    /// Waits for the next completion of `want` (Send or Recv); `limit` None waits as long as
    /// the connection lives.
    fn wait(
        &mut self,
        want: WcOpcode,
        what: &str,
        limit: Option<Duration>,
    ) -> Result<WorkCompletion, String> {
        if let Some(i) = self.stash.iter().position(|wc| wc.opcode == want) {
            return Ok(self.stash.remove(i));
        }
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            if let Some(ev) = self.qp.poll_event() {
                return Err(format!("{} while waiting for {what}", event_text(ev)));
            }
            let slice = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(format!("timed out waiting for {what}"));
                    }
                    left.min(Duration::from_millis(50))
                }
                None => Duration::from_millis(50),
            };
            let Some(wc) = self.cq.wait(slice) else { continue };
            if wc.status != WcStatus::Success {
                return Err(wc_failure(&self.qp, &wc, what));
            }
            if wc.opcode == want {
                return Ok(wc);
            }
            self.stash.push(wc);
        }
    }

    /// Sends one control message and waits for its completion.
    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), String> {
        self.send_mr.write(0, msg).map_err(|e| format!("control send buffer: {e:?}"))?;
        self.next_wr += 1;
        let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
        let wr = SendWr {
            wr_id: self.next_wr,
            op: SendOp::Send { solicited: false, invalidate: None },
            sgl: self.send_mr.sge(0, len).into(),
            signaled: true,
        };
        self.qp.post_send(wr).map_err(|e| format!("cannot post the Send of {what}: {e:?}"))?;
        self.wait(WcOpcode::Send, &format!("the Send of {what}"), Some(self.timeout))?;
        Ok(())
    }

    /// Receives one control message (the `expect` bytes perftest copies out), then reposts.
    fn recv(&mut self, expect: usize, what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String> {
        self.wait(WcOpcode::Recv, &format!("the peer's {what}"), limit)?;
        let mut b = vec![0u8; expect.min(wire::MAX_MSG)];
        self.recv_mr.read(0, &mut b).map_err(|e| format!("control receive buffer: {e:?}"))?;
        self.next_wr += 1;
        let wr = RecvWr { wr_id: self.next_wr, sgl: self.recv_mr.sge_all().into() };
        self.qp.post_recv(wr).map_err(|e| format!("cannot post a control receive: {e:?}"))?;
        Ok(b)
    }

    /// One lockstep exchange: the client sends first and waits for the answer; the server
    /// receives, reposts, then answers. Returns the peer's message.
    fn exchange(&mut self, msg: &[u8], what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String> {
        if self.server {
            let got = self.recv(msg.len(), what, limit)?;
            self.send(msg, what)?;
            Ok(got)
        } else {
            self.send(msg, what)?;
            self.recv(msg.len(), what, limit)
        }
    }

    /// Part A: version, cycle buffer, cache line, MTU, then the "pre" handshake.
    fn part_a(&mut self) -> Result<Agreed, String> {
        let t = Some(self.timeout);
        let v = self.exchange(&wire::version_msg(wire::VERSION), "version", t)?;
        match wire::parse_version(&v) {
            Some(peer) if peer >= wire::MIN_PEER_VERSION => {}
            _ => {
                let end = v.iter().position(|&c| c == 0).unwrap_or(v.len());
                return Err(format!(
                    "the peer's perftest version {:?} is older than {} or not a version",
                    String::from_utf8_lossy(&v[..end]),
                    wire::MIN_PEER_VERSION
                ));
            }
        }
        let cycle = wire::parse_u32(&self.exchange(&wire::u32_msg(CYCLE_BUFFER), "cycle buffer size", t)?);
        let line = wire::parse_u32(&self.exchange(&wire::u32_msg(CACHE_LINE), "cache line size", t)?);
        let mtu = wire::parse_mtu(&self.exchange(&wire::mtu_msg(MTU_ENUM), "MTU", t)?);
        self.exchange(&[0u8; wire::KEY_RECORD_LEN], "\"pre\" handshake", t)?;
        Ok(Agreed {
            // The peer's cycle buffer sizes our data buffer: bounded, so a client cannot make
            // a server hold more than MAX_PEER_CYCLE (perftest's own is a page).
            cycle: cycle.clamp(CYCLE_BUFFER, MAX_PEER_CYCLE),
            cache_line: line.clamp(CACHE_LINE, 4096),
            mtu: mtu.map_or(MTU_ENUM, |m| m.min(MTU_ENUM)),
        })
    }

    /// The "post" handshake and K1-K3; returns the peer's record (the last one).
    fn keys(&mut self, mine: &KeyRecord) -> Result<KeyRecord, String> {
        let t = Some(self.timeout);
        self.exchange(&[0u8; wire::KEY_RECORD_LEN], "\"post\" handshake", t)?;
        let mut peer = KeyRecord::default();
        for k in 1..=3 {
            let b = self.exchange(&mine.to_bytes(), &format!("key record K{k}"), t)?;
            peer = KeyRecord::parse(&b).ok_or_else(|| format!("short key record K{k}"))?;
        }
        Ok(peer)
    }
}

// --- output -----------------------------------------------------------------------------------

fn test_title(t: Test) -> &'static str {
    match t {
        Test::Write => "RDMA_Write BW Test",
        Test::Read => "RDMA_Read BW Test",
        Test::Send => "Send BW Test",
    }
}

/// C's `%#0Nx`: no `0x` for zero.
fn c_alt_hex(v: u32, width: usize) -> String {
    if v == 0 { format!("{:0width$}", 0) } else { format!("{v:#0width$x}") }
}

/// The table header block (both sides), ending with the server's waiting note.
fn print_banner(p: &Params, a: &Agreed, dev: &str, server: bool) {
    let mut s = String::new();
    let _ = writeln!(s, "{RESULT_LINE}");
    let _ = writeln!(s, "                    {}", test_title(p.test));
    let _ = writeln!(s, " Dual-port       : OFF\t\tDevice         : {dev}");
    let _ = writeln!(s, " Number of qps   : 1\t\tTransport type : IW");
    let _ = writeln!(s, " Connection type : RC\t\tUsing SRQ      : OFF");
    let _ = writeln!(s, " PCIe relax order: ON");
    let _ = writeln!(s, " ibv_wr* API     : OFF");
    if !server {
        let _ = writeln!(s, " TX depth        : {}", p.tx_depth);
    }
    if server && p.test == Test::Send {
        let _ = writeln!(s, " RX depth        : {}", p.rx_depth);
    }
    let _ = writeln!(s, " CQ Moderation   : {}", p.cq_mod);
    let _ = writeln!(s, " Mtu             : {}[B]", wire::mtu_bytes(a.mtu));
    let _ = writeln!(s, " Link type       : Ethernet");
    let _ = writeln!(s, " GID index       : 0");
    if p.test == Test::Read {
        let _ = writeln!(s, " Outstand reads  : {}", p.out_reads);
    } else {
        let _ = writeln!(s, " Max inline data : 0[B]");
    }
    let _ = writeln!(s, " rdma_cm QPs\t : ON");
    let _ = writeln!(s, " Data ex. method : rdma_cm");
    if server {
        let _ = writeln!(s, "{RESULT_LINE}");
        let _ = writeln!(s, " Waiting for client rdma_cm QP to connect");
        let _ = writeln!(s, " Please run the same command with the IB/RoCE interface IP");
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

fn print_addresses(mine: &KeyRecord, peer: &KeyRecord) {
    let mut s = String::new();
    for (what, r) in [("local", mine), ("remote", peer)] {
        let _ = writeln!(
            s,
            " {what} address: LID {} QPN {} PSN {}",
            c_alt_hex(r.lid, 4),
            c_alt_hex(r.qpn, 6),
            c_alt_hex(r.psn, 8)
        );
        let gid: Vec<String> = r.gid.iter().map(|b| format!("{b:02}")).collect();
        let _ = writeln!(s, " GID: {}", gid.join(":"));
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

fn print_result(r: &Report, gbits: bool) {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    let mut s = String::new();
    let _ = writeln!(s, " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]");
    if gbits && r.bw_avg < 0.1 {
        let _ = writeln!(
            s,
            " {:<7}    {:<10}       {:<7.6}            {:<7.6}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
    } else {
        let _ = writeln!(
            s,
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
    }
    let _ = write!(s, "{RESULT_LINE}");
    println!("{s}");
}

// --- measurements -----------------------------------------------------------------------------

/// Bytes per second in the report's unit: MiB/s, or Gb/s (1.25e8 bytes/s).
fn unit_rate(bytes_per_sec: f64, gbits: bool) -> f64 {
    if gbits { bytes_per_sec / 1.25e8 } else { bytes_per_sec / f64::from(1u32 << 20) }
}

fn to_f64(n: u64) -> f64 {
    // Message counts stay far below 2^53.
    #[expect(clippy::cast_precision_loss, reason = "counts below 2^53")]
    let f = n as f64;
    f
}

/// perftest's report from per-message post and completion times (nanoseconds from a common
/// start): average over the whole run, peak over the best window of messages.
fn iteration_report(p: &Params, posted: &[u64], completed: &[u64]) -> Report {
    let n = posted.len().min(completed.len());
    let size = f64::from(p.size);
    let (Some(&first), Some(&last)) = (posted.first(), completed.get(n.wrapping_sub(1))) else {
        return Report { size: u64::from(p.size), ..Report::default() };
    };
    let total = (last.saturating_sub(first)).max(1);
    let secs = to_f64(total) / 1e9;
    let n64 = u64::try_from(n).unwrap_or(u64::MAX);
    let avg = size * to_f64(n64) / secs;
    // Peak: the shortest average time per message over any window [i, j].
    let stride = n.div_ceil(PEAK_FULL_LIMIT).max(1);
    let mut best = f64::INFINITY;
    for i in (0..n).step_by(stride) {
        for j in (i..n).step_by(stride) {
            let t = to_f64(completed[j].saturating_sub(posted[i]).max(1))
                / to_f64(u64::try_from(j - i + 1).unwrap_or(1));
            if t < best {
                best = t;
            }
        }
    }
    let peak = if best.is_finite() { size / (best / 1e9) } else { 0.0 };
    Report {
        size: u64::from(p.size),
        iters: n64,
        bw_peak: unit_rate(peak, p.gbits),
        bw_avg: unit_rate(avg, p.gbits),
        msg_rate: to_f64(n64) / secs / 1e6,
    }
}

/// Duration mode: completions inside the sample window; no peak.
fn duration_report(p: &Params, count: u64, window: Duration) -> Report {
    let secs = window.as_secs_f64().max(1e-9);
    Report {
        size: u64::from(p.size),
        iters: count,
        bw_peak: 0.0,
        bw_avg: unit_rate(f64::from(p.size) * to_f64(count) / secs, p.gbits),
        msg_rate: to_f64(count) / secs / 1e6,
    }
}

/// The duration-mode sample window: warm-up margin D/4, sample D/2, cool-down D/4.
struct Window {
    start: Instant,
    begin: Instant,
    end: Instant,
    stop: Instant,
    at_begin: Option<u64>,
    at_end: Option<u64>,
}

impl Window {
    fn new(d: Duration) -> Window {
        let start = Instant::now();
        let margin = d / 4;
        Window {
            start,
            begin: start + margin,
            end: start + d - margin,
            stop: start + d,
            at_begin: None,
            at_end: None,
        }
    }

    /// Notes the completion count as time passes; returns whether the run is over.
    fn tick(&mut self, count: u64) -> bool {
        let now = Instant::now();
        if self.at_begin.is_none() && now >= self.begin {
            self.at_begin = Some(count);
        }
        if self.at_end.is_none() && now >= self.end {
            self.at_end = Some(count);
        }
        now >= self.stop
    }

    fn report(&self, p: &Params) -> Report {
        let count = self.at_end.unwrap_or(0).saturating_sub(self.at_begin.unwrap_or(0));
        let _ = self.start;
        duration_report(p, count, self.end - self.begin)
    }
}

// --- data connection --------------------------------------------------------------------------

/// The data connection and its buffers.
struct Data {
    qp: QueuePair,
    cq: CompletionQueue,
    /// Two halves of `half` bytes: the first is sent/read from, the second advertised.
    buf: MemoryRegion,
    half: usize,
    /// send_bw's credit words, as perftest's: [4..8] is the word the peer writes (advertised).
    credit: MemoryRegion,
    /// The sources of the send_bw server's credit Writes, one 4-byte word per send-queue
    /// slot.
    credit_src: MemoryRegion,
}

impl Data {
    /// This side's key record.
    fn record(&self, p: &Params, psn: u32) -> KeyRecord {
        let (rkey, vaddr) = if p.test == Test::Send {
            (self.credit.rkey().0, self.credit.addr() + 4)
        } else {
            (self.buf.rkey().0, self.buf.addr() + self.half as u64)
        };
        KeyRecord {
            out_reads: u32::from(p.out_reads),
            qpn: self.qp.qp_num(),
            psn,
            rkey,
            vaddr,
            gid: local_gid(),
            ..KeyRecord::default()
        }
    }
}

/// The GID shown in the key record: a locally administered MAC (02:00:00:00:00:01, no real
/// netdev here) and ten zero bytes, laid out as siw's.
fn local_gid() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    g
}

/// A data connection's completion queue and buffers, before the connection.
struct DataBufs {
    cq: CompletionQueue,
    buf: MemoryRegion,
    half: usize,
    credit: MemoryRegion,
    credit_src: MemoryRegion,
}

impl DataBufs {
    fn new(device: &Device, pd: &ProtectionDomain, p: &Params, a: &Agreed) -> Result<DataBufs, Fail> {
        let half = a.half(p.size);
        let buf = register(pd, 2 * half, DATA_ACCESS)?;
        buf.write(0, &random_bytes(half)).map_err(|e| Fail::Run(format!("data buffer: {e:?}")))?;
        let credit = register(pd, 8, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))?;
        let credit_src = register(pd, 4 * send_depth(p), Access::LOCAL_WRITE)?;
        let depth = usize::try_from(p.tx_depth + p.rx_depth).unwrap_or(1024) + 64;
        Ok(DataBufs { cq: device.create_cq(depth), buf, half, credit, credit_src })
    }

    fn into_data(self, qp: QueuePair) -> Data {
        let DataBufs { cq, buf, half, credit, credit_src } = self;
        Data { qp, cq, buf, half, credit, credit_src }
    }
}

/// The data connection's send queue depth.
fn send_depth(p: &Params) -> usize {
    usize::try_from(p.tx_depth.max(p.rx_depth)).unwrap_or(512) + 16
}

fn data_options(args: &Args, p: &Params, capture: Option<&Capture>) -> ConnectOptions {
    let ird_ord = if p.test == Test::Read { p.out_reads } else { 0 };
    ConnectOptions {
        max_send_wr: send_depth(p),
        max_recv_wr: usize::try_from(p.rx_depth).unwrap_or(512) + 16,
        ..conn_options(args, ird_ord, capture)
    }
}

/// The write/read client's run: N (or -D seconds of) Writes or Reads, at most tx depth
/// outstanding, every cq_mod-th and the last signaled.
fn run_rdma_client(p: &Params, a: &Agreed, d: &Data, peer: &KeyRecord) -> Result<Report, String> {
    let size = p.size;
    let tx = u64::from(p.tx_depth);
    let cq_mod = u64::from(p.cq_mod.max(1));
    let n = p.iters;
    let cap = usize::try_from(n).unwrap_or(0);
    let (mut tposted, mut tcompleted) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let start = Instant::now();
    let mut window = p.duration.map(Window::new);
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    let mut stopping = false;
    let what = if p.test == Test::Read { "RDMA Read" } else { "RDMA Write" };
    loop {
        if let Some(w) = window.as_mut() {
            stopping |= w.tick(completed);
        }
        let more = if n == 0 { !stopping } else { posted < n };
        if !more && completed >= posted {
            break;
        }
        while more_to_post(n, posted, stopping) && posted - completed < tx {
            let off = a.offset(size, posted);
            let last = n != 0 && posted + 1 == n;
            let signaled = (posted + 1) % cq_mod == 0 || last || (n == 0 && posted - completed + 1 >= tx);
            let op = match p.test {
                Test::Read => SendOp::Read { remote_stag: STag(peer.rkey), remote_to: peer.vaddr + off },
                _ => SendOp::Write { remote_stag: STag(peer.rkey), remote_to: peer.vaddr + off },
            };
            let local = usize::try_from(off).unwrap_or(0);
            let wr = SendWr { wr_id: posted, op, sgl: d.buf.sge(local, size).into(), signaled };
            match d.qp.post_send(wr) {
                Ok(()) => {}
                Err(iwarp::PostError::QueueFull) => break,
                Err(e) => return Err(format!("cannot post an {what}: {e:?}")),
            }
            if n != 0 {
                tposted.push(nanos(start));
            }
            posted += 1;
        }
        let Some(wc) = d.cq.wait(Duration::from_millis(20)) else {
            if let Some(ev) = d.qp.poll_event() {
                return Err(format!("{} during the {what}s", event_text(ev)));
            }
            if last_progress.elapsed() > p.timeout {
                return Err(format!("no {what} completed for {} s", p.timeout.as_secs()));
            }
            continue;
        };
        if wc.status != WcStatus::Success {
            return Err(wc_failure(&d.qp, &wc, &format!("{what} completions")));
        }
        last_progress = Instant::now();
        let done = wc.wr_id + 1;
        if done > completed {
            if n != 0 {
                let now = nanos(start);
                tcompleted.resize(usize::try_from(done).unwrap_or(0), now);
            }
            completed = done;
        }
    }
    Ok(match window {
        Some(w) => w.report(p),
        None => iteration_report(p, &tposted, &tcompleted),
    })
}

fn more_to_post(n: u64, posted: u64, stopping: bool) -> bool {
    if n == 0 { !stopping } else { posted < n }
}

fn nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The send_bw client: Sends while (sent + 1 - credit) < rx depth, credit being the count
/// the server last wrote into our credit word.
fn run_send_client(p: &Params, d: &Data) -> Result<Report, String> {
    let size = p.size;
    let tx = u64::from(p.tx_depth);
    let rx = u64::from(p.rx_depth);
    let cq_mod = u64::from(p.cq_mod.max(1));
    let n = p.iters;
    let cap = usize::try_from(n).unwrap_or(0);
    let (mut tposted, mut tcompleted) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let start = Instant::now();
    let mut window = p.duration.map(Window::new);
    let (mut posted, mut completed) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    let mut stopping = false;
    loop {
        if let Some(w) = window.as_mut() {
            stopping |= w.tick(completed);
        }
        if !more_to_post(n, posted, stopping) && completed >= posted {
            break;
        }
        let mut word = [0u8; 4];
        d.credit.read(4, &mut word).map_err(|e| format!("credit word: {e:?}"))?;
        let credit = u64::from(u32::from_le_bytes(word));
        let mut progressed = false;
        while more_to_post(n, posted, stopping)
            && posted - completed < tx
            && (posted + 1).saturating_sub(credit) < rx
        {
            let last = n != 0 && posted + 1 == n;
            // In duration mode the run may stop while the client waits for credits: the Send
            // after which the credits run out is signaled too, so that the Sends outstanding
            // then still end in a completion.
            let credit_bound = n == 0 && (posted + 2).saturating_sub(credit) >= rx;
            let signaled = (posted + 1) % cq_mod == 0
                || last
                || (n == 0 && posted - completed + 1 >= tx)
                || credit_bound;
            let wr = SendWr {
                wr_id: posted,
                op: SendOp::Send { solicited: false, invalidate: None },
                sgl: d.buf.sge(0, size).into(),
                signaled,
            };
            match d.qp.post_send(wr) {
                Ok(()) => {}
                Err(iwarp::PostError::QueueFull) => break,
                Err(e) => return Err(format!("cannot post a Send: {e:?}")),
            }
            if n != 0 {
                tposted.push(nanos(start));
            }
            posted += 1;
            progressed = true;
        }
        // Credits arrive as RDMA Writes (no completion here): poll briefly.
        let wait = if progressed || posted > completed { Duration::from_millis(1) } else { Duration::ZERO };
        match d.cq.wait(wait) {
            Some(wc) => {
                if wc.status != WcStatus::Success {
                    return Err(wc_failure(&d.qp, &wc, "Send completions"));
                }
                last_progress = Instant::now();
                let done = wc.wr_id + 1;
                if done > completed {
                    if n != 0 {
                        let now = nanos(start);
                        tcompleted.resize(usize::try_from(done).unwrap_or(0), now);
                    }
                    completed = done;
                }
            }
            None => {
                if let Some(ev) = d.qp.poll_event() {
                    return Err(format!("{} during the Sends", event_text(ev)));
                }
                if progressed {
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > p.timeout {
                    return Err(format!(
                        "no progress for {} s (sent {posted}, credit {credit}, rx depth {rx})",
                        p.timeout.as_secs()
                    ));
                }
                std::hint::spin_loop();
            }
        }
    }
    Ok(match window {
        Some(w) => w.report(p),
        None => iteration_report(p, &tposted, &tcompleted),
    })
}

/// Posts one `size`-byte receive into the second half of the buffer.
fn post_data_recv(d: &Data, p: &Params, wr_id: u64) -> Result<(), String> {
    let wr = RecvWr { wr_id, sgl: d.buf.sge(d.half, p.size).into() };
    d.qp.post_recv(wr).map_err(|e| format!("cannot post a data receive: {e:?}"))
}

/// The send_bw server after K4: counts receives, reposts until N are posted, and writes its
/// cumulative count into the client's credit word whenever
/// (count mod rx depth) mod floor(rx depth / 3) == 0.
fn run_send_server(p: &Params, d: &Data, peer: &KeyRecord, mut posted_recvs: u64) -> Result<Report, String> {
    let n = p.iters;
    let rx = u64::from(p.rx_depth.max(1));
    let every = (rx / 3).max(1);
    let mut received = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut stop_at: Option<Instant> = None;
    let mut wr = posted_recvs;
    let mut last_progress = Instant::now();
    let slots = u64::try_from(d.credit_src.len() / 4).unwrap_or(1).max(1);
    let mut credit_seq = 0u64;
    // Credit Writes posted and not completed yet.
    let mut credits_out = 0u64;
    loop {
        if n != 0 && received >= n {
            break;
        }
        if let Some(s) = stop_at
            && Instant::now() >= s
        {
            break;
        }
        let Some(wc) = d.cq.wait(Duration::from_millis(20)) else {
            if let Some(ev) = d.qp.poll_event() {
                return Err(format!("{} during the Sends", event_text(ev)));
            }
            // Duration mode waits for the first message without limit (the client starts it).
            if (n != 0 || first.is_some()) && last_progress.elapsed() > p.timeout {
                return Err(format!("no Send arrived for {} s ({received} received)", p.timeout.as_secs()));
            }
            continue;
        };
        if wc.status != WcStatus::Success {
            return Err(wc_failure(&d.qp, &wc, "the client's Sends"));
        }
        if wc.opcode != WcOpcode::Recv {
            credits_out = credits_out.saturating_sub(1);
            continue;
        }
        last_progress = Instant::now();
        received += 1;
        last = last_progress;
        if first.is_none() {
            first = Some(last);
            stop_at = p.duration.map(|dur| last + dur);
        }
        if n == 0 || posted_recvs < n {
            wr += 1;
            post_data_recv(d, p, wr)?;
            posted_recvs += 1;
        }
        if (received % rx).is_multiple_of(every) {
            // Each Write gets its own source word: a word still waiting to be sent must not
            // change under it.
            let count = u32::try_from(received).unwrap_or(u32::MAX);
            let slot = usize::try_from(credit_seq % slots).unwrap_or(0) * 4;
            credit_seq += 1;
            d.credit_src
                .write(slot, &wire::credit_bytes(count))
                .map_err(|e| format!("credit word: {e:?}"))?;
            let w = SendWr {
                wr_id: u64::MAX - received,
                op: SendOp::Write { remote_stag: STag(peer.rkey), remote_to: peer.vaddr },
                sgl: d.credit_src.sge(slot, 4).into(),
                signaled: true,
            };
            d.qp.post_send(w).map_err(|e| format!("cannot post a credit Write: {e:?}"))?;
            credits_out += 1;
        }
    }
    // The last credit Writes go out before the connection is torn down (a disconnect flushes
    // what is still queued).
    let deadline = Instant::now() + p.timeout;
    while credits_out > 0 && Instant::now() < deadline {
        match d.cq.wait(Duration::from_millis(20)) {
            Some(wc) if wc.opcode != WcOpcode::Recv => credits_out -= 1,
            Some(_) => {}
            None => {
                if let Some(ev) = d.qp.poll_event() {
                    return Err(format!("{} after the Sends", event_text(ev)));
                }
            }
        }
    }
    let elapsed = first.map_or(Duration::ZERO, |f| last - f).max(Duration::from_nanos(1));
    let mut r = duration_report(p, received, elapsed);
    if p.duration.is_some() {
        r.iters = received;
    }
    Ok(r)
}

// --- client -----------------------------------------------------------------------------------

fn client(args: &Args, host: &str) -> Result<(), Fail> {
    if args.bind.is_some() || args.accept_timeout.is_some() {
        return Err(Fail::Usage("--bind and --accept-timeout are server options (no ADDRESS)".into()));
    }
    let p = Params::new(args);
    let addr = resolve(host, args.port)?;
    let stack = open_stack(args)?;
    let capture = open_capture(args)?;
    let result = client_run(args, &p, addr, capture.as_ref(), stack.as_ref());
    flush_capture(capture.as_ref());
    flush_stack_capture(stack.as_ref());
    result
}

fn client_run(
    args: &Args,
    p: &Params,
    addr: SocketAddr,
    capture: Option<&Capture>,
    stack: Option<&SmolStack>,
) -> Result<(), Fail> {
    let device = Device::open(DeviceConfig::default());
    let pd = device.alloc_pd();
    let bufs = CtrlBufs::new(&device, &pd)?;
    let mut opts = conn_options(args, 0, capture);
    opts.max_send_wr = 2;
    opts.max_recv_wr = 2;
    opts.recv = vec![bufs.first_recv()];
    let connected = connect_any(&device, stack, addr, &pd, &bufs.cq, &opts)
        .map_err(|e| Fail::Run(format!("cannot connect to {addr}: {}", cm_message(&e))))?;
    let mut ctrl = bufs.into_ctrl(connected.qp, p.timeout, false);
    let result = client_session(args, p, addr, &device, &pd, &mut ctrl, capture, stack);
    if result.is_ok() {
        // The server closes the control connection after the data connection.
        wait_closed(&ctrl.qp, Duration::from_secs(2));
    }
    close(&ctrl.qp);
    result
}

#[expect(clippy::too_many_arguments, reason = "the client's session state, passed down once")]
fn client_session(
    args: &Args,
    p: &Params,
    addr: SocketAddr,
    device: &Device,
    pd: &ProtectionDomain,
    ctrl: &mut Ctrl,
    capture: Option<&Capture>,
    stack: Option<&SmolStack>,
) -> Result<(), Fail> {
    if p.test == Test::Write {
        // ib_write_bw sleeps a second once the control connection is up.
        std::thread::sleep(Duration::from_secs(1));
    }
    let agreed = ctrl.part_a()?;
    let bufs = DataBufs::new(device, pd, p, &agreed)?;
    let opts = data_options(args, p, capture);
    // perftest's server opens the data listener only after sending "pre"; a slow server (siw
    // under emulation) may not listen yet when our connect arrives, so retry a refused connect
    // for up to --timeout.
    let started = Instant::now();
    let qp = loop {
        match connect_any(device, stack, addr, pd, &bufs.cq, &opts) {
            Err(CmError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused && started.elapsed() < p.timeout =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => {
                break r.map_err(|e| {
                    Fail::Run(format!("cannot connect the data connection to {addr}: {}", cm_message(&e)))
                })?;
            }
        }
    };
    let data = bufs.into_data(qp.qp);
    print_banner(p, &agreed, &args.ib_dev, false);
    let result = client_data(p, &agreed, ctrl, &data);
    close(&data.qp);
    result
}

fn client_data(p: &Params, agreed: &Agreed, ctrl: &mut Ctrl, data: &Data) -> Result<(), Fail> {
    let psn = u32::try_from(random_u64() & 0x00ff_ffff).unwrap_or(0);
    let mine = data.record(p, psn);
    let peer = ctrl.keys(&mine)?;
    print_addresses(&mine, &peer);
    let t = Some(p.timeout);
    let report = match p.test {
        Test::Write | Test::Read => {
            let report = run_rdma_client(p, agreed, data, &peer)?;
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            for (i, m) in report.to_msgs().iter().enumerate() {
                ctrl.exchange(m, &format!("report field {}", i + 1), t)?;
            }
            report
        }
        Test::Send => {
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            run_send_client(p, data)?
        }
    };
    ctrl.exchange(&mine.to_bytes(), "key record K5", t)?;
    print_result(&report, p.gbits);
    Ok(())
}

// --- server -----------------------------------------------------------------------------------

fn server(args: &Args) -> Result<(), Fail> {
    if args.first_fpdu_delay != 0 {
        return Err(Fail::Usage("--first-fpdu-delay is a client option (give the ADDRESS)".into()));
    }
    let p = Params::new(args);
    let host = args.bind.as_deref().unwrap_or("0.0.0.0");
    let stack = open_stack(args)?;
    let bind = match &stack {
        // smoltcp listens on the stack's own address.
        Some(stack) => SocketAddr::from((stack.ip(), args.port)),
        None => resolve(host, args.port)?,
    };
    let capture = open_capture(args)?;
    let device = Device::open(DeviceConfig::default());
    // One client at a time: its control and data connections; more are rejected on the wire.
    let lopts = ListenOptions { max_connections: 2, ..crate::transport::listen_options(stack.as_ref()) };
    let listener = device
        .listen_with(bind, &lopts)
        .map_err(|e| Fail::Run(format!("cannot listen on {bind}: {}", cm_message(&e))))?;
    println!();
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    let result = server_run(args, &p, &device, &listener, capture.as_ref());
    flush_capture(capture.as_ref());
    flush_stack_capture(stack.as_ref());
    result
}

fn accept_next(listener: &Listener, deadline: Option<Instant>) -> Result<iwarp::ConnectRequest, Fail> {
    loop {
        let slice = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Fail::Run("no client connected in time (--accept-timeout)".into()));
                }
                left.min(Duration::from_secs(1))
            }
            None => Duration::from_secs(1),
        };
        match listener.accept(slice) {
            Ok(req) => return Ok(req),
            Err(CmError::Timeout) => {}
            Err(e) => eprintln!("perftest: a connection attempt failed: {}", cm_message(&e)),
        }
    }
}

fn server_run(
    args: &Args,
    p: &Params,
    device: &Device,
    listener: &Listener,
    capture: Option<&Capture>,
) -> Result<(), Fail> {
    let pd = device.alloc_pd();
    let bufs = CtrlBufs::new(device, &pd)?;
    let deadline = args.accept_timeout.map(|s| Instant::now() + Duration::from_secs(s));
    let req = accept_next(listener, deadline)?;
    let peer_addr = req.peer_addr();
    let mut opts = conn_options(args, 0, capture);
    opts.max_send_wr = 2;
    opts.max_recv_wr = 2;
    opts.recv = vec![bufs.first_recv()];
    let qp = req.accept(&pd, &bufs.cq, &bufs.cq, &opts).map_err(|e| {
        Fail::Run(format!("cannot accept the connection from {peer_addr}: {}", cm_message(&e)))
    })?;
    let mut ctrl = bufs.into_ctrl(qp, p.timeout, true);
    let result = server_session(args, p, device, &pd, listener, &mut ctrl, capture, peer_addr.ip());
    close(&ctrl.qp);
    result.map_err(|f| match f {
        Fail::Run(m) => Fail::Run(format!("client {peer_addr}: {m}")),
        f => f,
    })
}

#[expect(clippy::too_many_arguments, reason = "the server's session state, passed down once")]
fn server_session(
    args: &Args,
    p: &Params,
    device: &Device,
    pd: &ProtectionDomain,
    listener: &Listener,
    ctrl: &mut Ctrl,
    capture: Option<&Capture>,
    peer_ip: std::net::IpAddr,
) -> Result<(), Fail> {
    if p.test == Test::Write {
        std::thread::sleep(Duration::from_secs(1));
    }
    let agreed = ctrl.part_a()?;
    let bufs = DataBufs::new(device, pd, p, &agreed)?;
    print_banner(p, &agreed, &args.ib_dev, true);
    // The data connection comes from the control connection's peer; anyone else is turned
    // away while we wait for it.
    let deadline = Instant::now() + p.timeout;
    let req = loop {
        let req = accept_next(listener, Some(deadline))?;
        if req.peer_addr().ip() == peer_ip {
            break req;
        }
        eprintln!("perftest: rejecting {} while waiting for {peer_ip}'s data connection", req.peer_addr());
        let _ = req.reject(&[]);
    };
    if let Some(ev) = ctrl.qp.poll_event() {
        return Err(Fail::Run(format!("{} before the data connection", event_text(ev))));
    }
    let mut opts = data_options(args, p, capture);
    // send_bw: the data receives (rx depth of them, at most N) go up with the connection.
    let first_recvs = if p.test == Test::Send {
        let k = if p.iters == 0 { u64::from(p.rx_depth) } else { u64::from(p.rx_depth).min(p.iters) };
        (0..k).map(|i| RecvWr { wr_id: i, sgl: bufs.buf.sge(bufs.half, p.size).into() }).collect()
    } else {
        Vec::new()
    };
    let posted = u64::try_from(first_recvs.len()).unwrap_or(0);
    opts.recv = first_recvs;
    let qp = req
        .accept(pd, &bufs.cq, &bufs.cq, &opts)
        .map_err(|e| Fail::Run(format!("cannot accept the data connection: {}", cm_message(&e))))?;
    let data = bufs.into_data(qp);
    let result = server_data(p, ctrl, &data, posted, Duration::from_secs(args.run_timeout));
    if result.is_ok() {
        // The client closes the data connection first.
        wait_closed(&data.qp, Duration::from_secs(2));
    }
    close(&data.qp);
    result
}

fn server_data(
    p: &Params,
    ctrl: &mut Ctrl,
    data: &Data,
    posted: u64,
    run_timeout: Duration,
) -> Result<(), Fail> {
    let psn = u32::try_from(random_u64() & 0x00ff_ffff).unwrap_or(0);
    let mine = data.record(p, psn);
    let peer = ctrl.keys(&mine)?;
    print_addresses(&mine, &peer);
    let t = Some(p.timeout);
    // How long the client's run may take: --run-timeout, or its duration and a margin.
    let run = Some(run_timeout.max(p.duration.map_or(Duration::ZERO, |d| d + p.timeout)));
    let report = match p.test {
        Test::Write | Test::Read => {
            // The client runs; we wait for its K4 as long as a run may last.
            ctrl.exchange(&mine.to_bytes(), "key record K4 (end of the client's run)", run)?;
            let mut fields: [Vec<u8>; 5] = Default::default();
            for (i, f) in fields.iter_mut().enumerate() {
                // perftest's server answers with uninitialised memory; zeros here.
                *f = ctrl.exchange(&[0u8; wire::REPORT_FIELD_LEN], &format!("report field {}", i + 1), t)?;
            }
            Report::from_msgs(&fields)
        }
        Test::Send => {
            ctrl.exchange(&mine.to_bytes(), "key record K4", t)?;
            let peer_data = peer;
            run_send_server(p, data, &peer_data, posted)?
        }
    };
    ctrl.exchange(&mine.to_bytes(), "key record K5", if p.test == Test::Send { run } else { t })?;
    print_result(&report, p.gbits);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_line_layout() {
        let r = Report { size: 8192, iters: 8, bw_peak: 2.274, bw_avg: 2.180, msg_rate: 0.000279 };
        let line = format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
            r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
        );
        assert_eq!(line, " 8192       8                2.27               2.18   \t\t   0.000279");
    }

    #[test]
    fn offsets_step_through_the_cycle_buffer() {
        let a = Agreed { cycle: 4096, cache_line: 64, mtu: 3 };
        assert_eq!(a.offset(8192, 5), 0);
        assert_eq!(a.offset(100, 0), 0);
        assert_eq!(a.offset(100, 1), 128);
        assert_eq!(a.offset(100, 32), 0);
        assert_eq!(a.half(8192), 8192);
        assert_eq!(a.half(100), 4096);
    }

    #[test]
    fn c_hex() {
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(2, 6), "0x0002");
        assert_eq!(c_alt_hex(0xd5e42f, 8), "0xd5e42f");
    }
}
