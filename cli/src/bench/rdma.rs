//! The iWARP measurements, shaped like two hosts: the client and the server each have their
//! own device (their own engine), protection domain, completion queue and thread. The
//! calling thread is the client; a server thread answers what each measurement needs of it
//! (keeping receive buffers posted, answering ping-pongs). `--shared-device` puts both ends
//! on one device (one engine), the layout that hides wake-up costs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp::mpa::frame::IRD_ORD_MAX;
use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, ProtectionDomain,
    QpState, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::raw;
use super::results::{BenchError, Budget, Latency, Op, Samples, Throughput};

/// How long the engine may go without completing anything before a measurement fails.
const STALL: Duration = Duration::from_secs(10);
/// How long each side's turn lasts when the ping-pong alternates with the raw-TCP baseline's
/// back to back (`Bench::latency`): long enough that the first round trips after a switch
/// (the engines woken, the other side's spin still running) stay out of the percentiles,
/// short against the load changes that moved a baseline measured apart by a factor of two
/// from one run to the next on a shared machine.
pub(super) const TURN: Duration = Duration::from_millis(10);
/// The iWARP listener's port on the server's smoltcp stack.
const SMOL_PORT: u16 = 7290;

/// Busy-wait turns before a busy wait starts yielding the core (some microseconds: a `pause`
/// takes about 24 ns on the project's VM, and 20,000 turns, half a millisecond, kept four busy
/// threads on two cores waiting for the scheduler at every hand-over).
const SPINS_BEFORE_YIELD: u32 = 256;
/// The same inline on a machine with fewer cores than spinning threads, where each turn runs
/// a pass of the thread's engine (a system call at least, several microseconds under
/// emulation): 256 turns kept the core a quarter of a millisecond or more from the peer's
/// thread, which on a single core is the one with the work. With a core for each spinning
/// thread the yields only slow the spin down, as raw TCP's busy-poll ping-pong never yields:
/// yielding after 4 turns made the inline 8 B Write ping-pong 19-20 us against 15 after 256
/// turns (raw 10.5, 2 cores).
const INLINE_SPINS_BEFORE_YIELD: u32 = 4;
/// How long the client, out of credits for Sends, yields the core to the server (which is
/// about to hand some back) before it sleeps: a sleeping thread takes tens of microseconds to
/// wake on a virtual machine, more than the server takes to turn a window around.
const CREDIT_SPIN: Duration = Duration::from_micros(100);
/// Queue pairs a failed measurement's error describes at most (see [`Bench::explain`]).
const EXPLAINED: usize = 4;
/// Receives posted per pair beyond the client's credits.
const RQ_SLACK: usize = 8;
/// How often the server thread looks for its next command while it spins (busy and inline
/// modes).
const SERVER_TICK: Duration = Duration::from_millis(2);
/// How long the server thread's blocking waits for a completion or a Write last at most: a
/// new command interrupts them (`CompletionQueue::interrupt`, `QueuePair::interrupt_input`).
/// Waking on a short timeout instead, as a real server would not, armed a timer at every
/// sleep; on this project's test machine (a virtual machine) that made waking the server 7-8
/// us slower, and Send ping-pongs 10 ms apart took 21 us at p50 against 14 us with the server
/// sleeping untimed (Write ping-pongs: 24-26 against 18-22 us).
const SERVER_WAIT: Duration = Duration::from_secs(1);

/// What a work request id says about its origin (low byte); the pair index is above it.
const TAG_SQ: u64 = 0;
const TAG_RQ: u64 = 2;
/// The final Read that proves earlier Writes were placed.
const TAG_FLUSH: u64 = 4;

/// Completions the sink takes per poll (as perftest's receiver polls).
const SINK_BATCH: usize = 16;

fn wr_id(pair: usize, tag: u64) -> u64 {
    ((pair as u64) << 8) | tag
}

fn split(wr_id: u64) -> (usize, u64) {
    (usize::try_from(wr_id >> 8).unwrap_or(usize::MAX), wr_id & 0xff)
}

/// Settings of the iWARP side.
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub(super) poll: PollMode,
    pub(super) crc: bool,
    pub(super) revision: u8,
    pub(super) qps: usize,
    pub(super) window: usize,
    /// Bandwidth runs: every this many work requests of a pair (and the last of each list)
    /// ask for a completion.
    pub(super) cq_mod: usize,
    /// Receives the server keeps posted for Sends, over all pairs (at least a window's worth
    /// per pair; `--rx-depth`, 512 by default as `ib_send_bw`'s receive depth): `window`
    /// bounds the sender's outstanding work requests, as perftest's transmit depth does, not
    /// the receiver's buffers.
    pub(super) rx_depth: usize,
    /// The largest message size of the run (buffers are registered once, this big).
    pub(super) max_size: usize,
    /// Both ends on one device.
    pub(super) shared_device: bool,
    /// Payloads straight between the links and registered memory (DeviceConfig::zero_copy).
    pub(super) zero_copy: bool,
    /// A pause between the round trips of the latency measurements.
    pub(super) gap: Duration,
    /// Where to record the connections, if anywhere.
    pub(super) pcap: Option<std::sync::Arc<std::sync::Mutex<iwarp::netdev::PcapWriter>>>,
    /// smoltcp: the client's and the server's stacks (else kernel TCP over 127.0.0.1).
    pub(super) smol: Option<(iwarp::netdev::SmolStack, iwarp::netdev::SmolStack)>,
}

impl Config {
    fn busy(&self) -> bool {
        matches!(self.poll, PollMode::Busy | PollMode::Inline)
    }

    fn inline(&self) -> bool {
        self.poll == PollMode::Inline
    }

    /// Turns a spinning thread waits before it also yields the core (see [`relax`]): few
    /// inline when the benchmark's spinning threads outnumber the cores it may run on. Asks
    /// the system (the affinity mask, cgroup quotas): once per run, not per turn.
    fn patience(&self) -> u32 {
        let spinning = spinning_threads(self.poll, self.shared_device);
        if self.inline() && cores() < spinning { INLINE_SPINS_BEFORE_YIELD } else { SPINS_BEFORE_YIELD }
    }
}

/// Threads the benchmark keeps spinning in `mode`: its client and server threads in busy and
/// inline modes, and a busy mode's engine threads (one per device); none otherwise.
pub(super) fn spinning_threads(mode: PollMode, shared_device: bool) -> usize {
    match (mode, shared_device) {
        (PollMode::Busy, true) => 3,
        (PollMode::Busy, false) => 4,
        (PollMode::Inline, _) => 2,
        (PollMode::Adaptive | PollMode::Event, _) => 0,
    }
}

/// The cores this process may run on (its affinity mask and cgroup quota), at least one.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// How the client, out of credits for Sends, sleeps until the server reposts buffers.
#[derive(Debug)]
struct CreditBell {
    /// The client sleeps (or is about to): unpark it.
    waiting: std::sync::atomic::AtomicBool,
    client: std::thread::Thread,
}

/// Messages the server has received (and reposted the receives of), per pair and in all: the
/// client's credits for Sends. The total spares the client a sum over every pair per turn.
#[derive(Debug)]
struct Received {
    per_pair: Vec<AtomicU64>,
    total: AtomicU64,
}

impl Received {
    fn new(pairs: usize) -> Received {
        Received { per_pair: (0..pairs).map(|_| AtomicU64::new(0)).collect(), total: AtomicU64::new(0) }
    }

    fn pair(&self, i: usize) -> u64 {
        self.per_pair[i].load(Ordering::Acquire)
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// `n` more received on pair `i` (the pair's count first: a client that sees the total
    /// move finds the pair's moved too).
    fn add(&self, i: usize, n: u64) {
        self.per_pair[i].fetch_add(n, Ordering::SeqCst);
        self.total.fetch_add(n, Ordering::SeqCst);
    }
}

/// One end's memory: a source and a destination buffer, `max_size` bytes each.
struct Buffers {
    src: MemoryRegion,
    dst: MemoryRegion,
}

impl Buffers {
    fn register(pd: &ProtectionDomain, size: usize) -> Result<Buffers, BenchError> {
        let remote = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);
        Ok(Buffers {
            src: pd.register(size, Access::REMOTE_READ).map_err(reg_err)?,
            dst: pd.register(size, remote).map_err(reg_err)?,
        })
    }
}

/// What the server thread does during a measurement.
#[derive(Debug, Clone, Copy)]
enum Serve {
    /// Nothing: the client's Writes and Reads need no help.
    Idle,
    /// Keep receive buffers posted and count the messages received (Send bandwidth).
    Sink,
    /// Answer each Write of `size` bytes (seen by its marker) with a Write back.
    WritePong(usize),
    /// Answer each received Send with a Send of `size` bytes.
    SendPong(usize),
    /// Finish.
    Stop,
}

/// The server end, as its thread sees it.
struct Server {
    qps: Vec<QueuePair>,
    cq: CompletionQueue,
    bufs: Buffers,
    /// The client's destination buffer (key, address), where answering Writes go.
    client_dst: (iwarp::STag, u64),
    /// Receives posted per pair.
    posted: Vec<usize>,
    /// Receives completed per pair and not reposted yet.
    consumed: Vec<usize>,
    /// The pairs whose `consumed` is above zero, in the order they first received: reposting
    /// looks at these alone, not at every pair, and gives the client its credits back in
    /// about the order it spent them.
    dirty: Vec<usize>,
    /// Messages received (read by the client for flow control).
    received: Arc<Received>,
    credits: Arc<CreditBell>,
    /// Send-queue work outstanding.
    sq_out: usize,
    /// The last ping-pong marker seen in the destination buffer.
    mark: [u8; 8],
    rq_target: usize,
    max_size: usize,
    busy: bool,
    /// The server's device runs inline: this thread drives it.
    inline: bool,
    /// Spinning turns before a yield ([`Config::patience`]).
    patience: u32,
    /// Turns of the idle step (inline) that found nothing, in a row.
    idle_turns: u32,
}

/// Measurement results, on the client's device.
pub(super) struct Bench {
    // Fields drop in order: queue pairs and regions before the devices.
    qps: Vec<QueuePair>,
    bufs: Buffers,
    /// The server's regions' keys and addresses.
    peer: (iwarp::STag, u64, iwarp::STag, u64),
    cq: CompletionQueue,
    cfg: Config,
    seq: u64,
    /// Receives posted per pair, and the target kept posted.
    posted: Vec<usize>,
    rq_target: usize,
    /// Outstanding work requests allowed per pair.
    per_pair: usize,
    ords: Vec<usize>,
    received: Arc<Received>,
    credits: Arc<CreditBell>,
    commands: Sender<Serve>,
    acks: Receiver<Result<(), BenchError>>,
    /// The server's completion queue and first queue pair, to interrupt its waits (for
    /// completions, for the Writes of a Write ping-pong) when a command is sent.
    server_cq: CompletionQueue,
    server_qp: QueuePair,
    server: Option<JoinHandle<()>>,
    /// Resident memory growth per connection end while the connections were set up idle.
    idle_bytes_per_qp: Option<u64>,
    /// Spinning turns before a yield ([`Config::patience`]).
    patience: u32,
    devices: Vec<Device>,
}

/// What the connections negotiated.
#[derive(Debug, Clone, Copy)]
pub(super) struct Negotiated {
    pub(super) crc: bool,
    pub(super) revision: u8,
    pub(super) ord: u16,
}

/// Work requests the client keeps outstanding per queue pair: the window spread over the
/// pairs, at least one each.
pub(super) fn per_pair(window: usize, qps: usize) -> usize {
    window.div_ceil(qps.max(1)).max(1)
}

/// Sends a client may have in flight per queue pair (received or not): the receives the
/// server keeps posted for them, beyond its slack; `rx_depth` over all pairs, at least a
/// window's share per pair.
pub(super) fn send_credits(window: usize, qps: usize, rx_depth: usize) -> usize {
    let qps = qps.max(1);
    window.div_ceil(qps).max(1).max(rx_depth / qps)
}

fn cm_err(what: &'static str) -> impl Fn(iwarp::CmError) -> BenchError {
    move |e| BenchError(format!("{what}: {e}"))
}

fn reg_err(e: iwarp::RegisterError) -> BenchError {
    BenchError(format!("memory registration failed: {e}"))
}

fn post_err(what: &str) -> impl Fn(iwarp::PostError) -> BenchError + '_ {
    move |e| BenchError(format!("posting {what} failed: {e}"))
}

fn len32(size: usize) -> Result<u32, BenchError> {
    u32::try_from(size).map_err(|_| BenchError(format!("a message of {size} bytes is too long")))
}

/// The process's resident memory in bytes (Linux), if it can be read.
pub(super) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Bench {
    /// Opens the devices and connects `cfg.qps` queue pairs.
    pub(super) fn open(cfg: Config) -> Result<Bench, BenchError> {
        let dev_config =
            DeviceConfig { poll_mode: cfg.poll, zero_copy: cfg.zero_copy, ..DeviceConfig::default() };
        let mut devices = vec![Device::open(dev_config)];
        if !cfg.shared_device {
            // Pinned (`--pin`), its engine thread on the server's CPU.
            devices.push(super::pin::on_server_cpu(|| Device::open(dev_config)).map_err(BenchError)?);
        }
        let (client_dev, server_dev) = (&devices[0], &devices[devices.len() - 1]);
        let (pd, server_pd) = (client_dev.alloc_pd(), server_dev.alloc_pd());
        let per_pair = per_pair(cfg.window, cfg.qps);
        let rq_target = send_credits(cfg.window, cfg.qps, cfg.rx_depth) + RQ_SLACK;
        // Room for every completion a measurement can have outstanding: a window's, and on
        // the server every posted receive's.
        let cq_depth = (cfg.qps * (cfg.window + 8) * 4).max(cfg.qps * rq_target) + 64;
        let (cq, server_cq) = (client_dev.create_cq(cq_depth), server_dev.create_cq(cq_depth));
        // Reads as deep as the window, as perftest's are (its outstanding reads are the
        // device's maximum, 128 on siw, then at most its transmit depth), and never under
        // the stack's default of 16.
        let ird_ord = u16::try_from(per_pair.max(16)).unwrap_or(u16::MAX).min(IRD_ORD_MAX);
        let opts = ConnectOptions {
            policy: Policy {
                revision: cfg.revision,
                crc: if cfg.crc { CrcPolicy::Required } else { CrcPolicy::Off },
                ird: ird_ord,
                ord: ird_ord,
                ..Policy::default()
            },
            // The window on the first pair alone too (`Bench::throughput_one`).
            max_send_wr: per_pair.max(cfg.window) + 64,
            max_recv_wr: rq_target + 64,
            capture: cfg.pcap.clone(),
            transport: crate::transport::transport(cfg.smol.as_ref().map(|s| &s.0)),
            ..ConnectOptions::default()
        };
        let bind = match &cfg.smol {
            Some((_, server)) => std::net::SocketAddr::from((server.ip(), SMOL_PORT)),
            None => std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let listener = crate::transport::listen(server_dev, cfg.smol.as_ref().map(|s| &s.1), bind)
            .map_err(cm_err("listen"))?;
        let addr = listener.local_addr().map_err(|e| BenchError(format!("listen: {e}")))?;
        let rss_before = resident_bytes();
        let accepting = {
            // The client end records the connection; recording both ends would show it twice.
            let server_opts = ConnectOptions { capture: None, ..opts.clone() };
            let (pd, cq, opts, n) = (server_pd.clone(), server_cq.clone(), server_opts, cfg.qps);
            std::thread::Builder::new()
                .name("bench-accept".into())
                .spawn(move || -> Result<Vec<QueuePair>, BenchError> {
                    let mut qps = Vec::with_capacity(n);
                    for _ in 0..n {
                        let req = listener.accept(STALL).map_err(cm_err("accept"))?;
                        qps.push(req.accept(&pd, &cq, &cq, &opts).map_err(cm_err("accept"))?);
                    }
                    Ok(qps)
                })
                .map_err(|e| BenchError(format!("cannot start the accepting thread: {e}")))?
        };
        let mut qps = Vec::with_capacity(cfg.qps);
        for _ in 0..cfg.qps {
            let connected = client_dev.connect(addr, &pd, &cq, &cq, &opts);
            match connected {
                Ok(c) => qps.push(c.qp),
                Err(e) => {
                    // The accepting thread gives up on its own after its timeout.
                    let _ = accepting.join();
                    return Err(cm_err("connect")(e));
                }
            }
        }
        let server_qps =
            accepting.join().map_err(|_| BenchError("the accepting thread panicked".into()))??;
        // Both ends of every connection live in this process: growth per end.
        let idle_bytes_per_qp = match (rss_before, resident_bytes()) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) / (2 * cfg.qps as u64)),
            _ => None,
        };
        let ords = qps.iter().map(|q| usize::from(q.conn_params().ord).max(1)).collect();
        let bufs = Buffers::register(&pd, cfg.max_size)?;
        let server_bufs = Buffers::register(&server_pd, cfg.max_size)?;
        let peer =
            (server_bufs.src.rkey(), server_bufs.src.addr(), server_bufs.dst.rkey(), server_bufs.dst.addr());
        let received = Arc::new(Received::new(cfg.qps));
        let credits = Arc::new(CreditBell {
            waiting: std::sync::atomic::AtomicBool::new(false),
            client: std::thread::current(),
        });
        let server_qp = server_qps
            .first()
            .cloned()
            .ok_or_else(|| BenchError("the server accepted no connection".into()))?;
        let patience = cfg.patience();
        let server = Server {
            posted: vec![0; server_qps.len()],
            consumed: vec![0; server_qps.len()],
            dirty: Vec::with_capacity(server_qps.len()),
            qps: server_qps,
            cq: server_cq.clone(),
            bufs: server_bufs,
            client_dst: (bufs.dst.rkey(), bufs.dst.addr()),
            received: received.clone(),
            credits: credits.clone(),
            sq_out: 0,
            mark: [0; 8],
            rq_target,
            max_size: cfg.max_size,
            busy: cfg.busy(),
            inline: cfg.inline(),
            patience,
            idle_turns: 0,
        };
        let (commands, command_rx) = mpsc::channel();
        let (ack_tx, acks) = mpsc::channel();
        let server = std::thread::Builder::new()
            .name("bench-server".into())
            .spawn(move || {
                super::pin::server_side();
                server.run(&command_rx, &ack_tx)
            })
            .map_err(|e| BenchError(format!("cannot start the server thread: {e}")))?;
        Ok(Bench {
            posted: vec![0; qps.len()],
            qps,
            bufs,
            peer,
            cq,
            cfg,
            seq: 0,
            rq_target,
            per_pair,
            ords,
            received,
            credits,
            commands,
            acks,
            server_cq,
            server_qp,
            server: Some(server),
            idle_bytes_per_qp,
            patience,
            devices,
        })
    }

    /// `e` with what the queue pairs that left RTS say about it: a flushed completion tells
    /// only that its queue pair went to error, the queue pair's events tell why (a Terminate
    /// sent or received, the connection lost). The client's pairs and the server's first, at
    /// most [`EXPLAINED`] of them.
    pub(super) fn explain(&self, e: BenchError) -> BenchError {
        let ends = self.qps.iter().enumerate().map(|(i, qp)| ("client", i, qp));
        let mut why: Vec<String> = ends
            .chain([("server", 0, &self.server_qp)])
            .filter(|(_, _, qp)| qp.state() != QpState::Rts)
            .map(|(side, i, qp)| {
                let events: Vec<String> =
                    std::iter::from_fn(|| qp.poll_event()).map(|ev| format!("{ev:?}")).collect();
                let events = if events.is_empty() { "no event".to_string() } else { events.join(", ") };
                format!("{side} queue pair {i} {:?}: {events}", qp.state())
            })
            .collect();
        if why.is_empty() {
            return e;
        }
        let more = why.len().saturating_sub(EXPLAINED);
        why.truncate(EXPLAINED);
        if more > 0 {
            why.push(format!("{more} more"));
        }
        BenchError(format!("{} ({})", e.0, why.join("; ")))
    }

    /// What the first connection negotiated.
    pub(super) fn negotiated(&self) -> Option<Negotiated> {
        self.qps.first().map(|q| {
            let c = q.conn_params();
            Negotiated { crc: c.crc, revision: c.revision, ord: c.ord }
        })
    }

    /// Bytes received by both ends so far, and how many of them the links read straight into
    /// registered memory.
    pub(super) fn received(&self) -> (u64, u64) {
        self.devices.iter().map(Device::stats).fold((0, 0), |(b, p), s| (b + s.rx_bytes, p + s.rx_in_place))
    }

    /// Bytes framed by both ends so far, those written straight from registered memory,
    /// those a full link left to be copied and sent later, and those copied because the
    /// kernel's copy from registered memory would have been slow.
    pub(super) fn sent(&self) -> (u64, u64, u64, u64) {
        self.devices.iter().map(Device::stats).fold((0, 0, 0, 0), |(b, r, s, m), x| {
            (b + x.tx_bytes, r + x.tx_by_ref, s + x.tx_staged, m + x.tx_moved)
        })
    }

    /// Each device's engine counters so far, named by the end it serves (`shared` when both
    /// ends run on one device).
    pub(super) fn engines(&self) -> Vec<(&'static str, iwarp::EngineStats)> {
        match self.devices.as_slice() {
            [one] => vec![("shared", one.stats())],
            devices => devices.iter().zip(["client", "server"]).map(|(d, name)| (name, d.stats())).collect(),
        }
    }

    /// Resident memory per idle connection end, measured while connecting.
    pub(super) fn idle_bytes_per_qp(&self) -> Option<u64> {
        self.idle_bytes_per_qp
    }

    /// Tells the server thread what to do next and waits until it is ready.
    fn serve(&self, what: Serve) -> Result<(), BenchError> {
        self.commands.send(what).map_err(|_| BenchError("the server thread is gone".into()))?;
        // A server waiting for completions or Writes looks at its commands when its wait ends.
        self.server_cq.interrupt();
        self.server_qp.interrupt_input();
        match self.acks.recv_timeout(STALL) {
            Ok(r) => r,
            Err(_) => Err(BenchError("the server thread did not answer".into())),
        }
    }

    /// The next completion, failing on a timeout or an unsuccessful status. A server thread
    /// that failed meanwhile stopped answering: its error is the one reported.
    fn next(&self, what: &str) -> Result<WorkCompletion, BenchError> {
        let Some(wc) = next_completion(&self.cq, self.cfg.busy(), self.patience) else {
            return Err(self.server_failure(what).unwrap_or_else(|| {
                BenchError(format!("{what}: no completion within {} s", STALL.as_secs()))
            }));
        };
        check(&wc, what)?;
        Ok(wc)
    }

    /// The error of a server thread that failed (and stopped answering), if it did.
    fn server_failure(&self, what: &str) -> Option<BenchError> {
        match self.acks.try_recv() {
            Ok(Err(e)) => Some(BenchError(format!("{what}: the server failed: {e}"))),
            _ => None,
        }
    }

    /// Tops the client's receive queues up to the target.
    fn top_up(&mut self) -> Result<(), BenchError> {
        let sge = self.bufs.dst.sge(0, len32(self.cfg.max_size)?);
        for (i, qp) in self.qps.iter().enumerate() {
            let n = self.rq_target.saturating_sub(self.posted[i]);
            if n > 0 {
                let wrs = (0..n).map(|_| RecvWr { wr_id: wr_id(i, TAG_RQ), sgl: sge.into() });
                qp.post_recv_list(wrs).map_err(|e| BenchError(format!("posting receives failed: {e}")))?;
                self.posted[i] += n;
            }
        }
        Ok(())
    }

    fn client_wr(&self, op: Op, pair: usize, size: usize, tag: u64) -> Result<SendWr, BenchError> {
        let len = len32(size)?;
        let (src_key, src_addr, dst_key, dst_addr) = self.peer;
        let (op, sge) = match op {
            Op::Write => {
                (SendOp::Write { remote_stag: dst_key, remote_to: dst_addr }, self.bufs.src.sge(0, len))
            }
            Op::Read => {
                (SendOp::Read { remote_stag: src_key, remote_to: src_addr }, self.bufs.dst.sge(0, len))
            }
            Op::Send => (SendOp::Send { solicited: false, invalidate: None }, self.bufs.src.sge(0, len)),
        };
        Ok(SendWr { wr_id: wr_id(pair, tag), op, sgl: sge.into(), signaled: true })
    }

    /// Streams messages of `size` bytes, `window` outstanding, spread round-robin over the
    /// pairs, until the budget is spent; then waits for all of them.
    pub(super) fn throughput(
        &mut self,
        op: Op,
        size: usize,
        budget: &Budget,
    ) -> Result<Throughput, BenchError> {
        let limit: Vec<usize> = self
            .ords
            .iter()
            .map(|&ord| if op == Op::Read { self.per_pair.min(ord) } else { self.per_pair })
            .collect();
        self.stream(op, size, budget, &limit, "bandwidth")
    }

    /// Write bandwidth over the first queue pair alone, the whole window outstanding on it:
    /// with several pairs, what their aggregate is compared with, measured in the same run
    /// (one process's figures move together with where the scheduler puts its threads).
    /// Writes only: a Read over one of the pairs is bounded by its ORD, the window's share
    /// (at least 16), and a Send by the receives the server keeps posted on it.
    pub(super) fn throughput_one(&mut self, size: usize, budget: &Budget) -> Result<Throughput, BenchError> {
        let limit = [self.cfg.window.max(1)];
        self.stream(Op::Write, size, budget, &limit, "bandwidth over one QP")
    }

    /// Streams over the first `limit.len()` pairs, at most `limit[i]` outstanding on pair `i`.
    fn stream(
        &mut self,
        op: Op,
        size: usize,
        budget: &Budget,
        limit: &[usize],
        measure: &str,
    ) -> Result<Throughput, BenchError> {
        let what = format!("{} {size} B {measure}", op.name());
        self.serve(if op == Op::Send { Serve::Sink } else { Serve::Idle })?;
        let n = limit.len();
        // Sends beyond the receives the server has posted would be a peer error on iWARP (no
        // RNR retry): the server's reposts are the client's credits.
        let credits = self.rq_target - RQ_SLACK;
        // Per pair: send-queue work outstanding, and (Send) messages posted.
        let mut sq_out = vec![0usize; n];
        // The same over all pairs.
        let mut outstanding = 0usize;
        // Pairs whose send queue has room, in the order they got it (each limit is at least
        // 1): with many pairs, a search for one per completion would cost more than the
        // message.
        let mut ready: VecDeque<usize> = (0..n).collect();
        // Pairs with room but no credit left for a Send, in the order they ran out. Credits
        // come back in about the order the Sends went, so only the first of them is looked at:
        // with 1,000 pairs, one credit per pair and a look at every pair per turn, the
        // client spent its time searching (0.11 Mmsg/s).
        let mut starved: VecDeque<usize> = VecDeque::new();
        // Per pair, for each signaled work request outstanding: how many it retires when it
        // completes (itself and the unsignaled ones posted before it; the send queue completes
        // in order).
        let mut covers: Vec<VecDeque<usize>> = vec![VecDeque::new(); n];
        let mut sent = vec![0u64; n];
        let base: Vec<u64> = (0..n).map(|i| self.received.pair(i)).collect();
        // Only the first `n` pairs carry Sends here: the total's growth is theirs.
        let base_total = self.received.total();
        let in_flight = |i: usize, sent: &[u64]| -> usize {
            let got = self.received.pair(i) - base[i];
            usize::try_from(sent[i].saturating_sub(got)).unwrap_or(usize::MAX)
        };
        let (mut posted, mut done) = (0u64, 0u64);
        let mut stop = false;
        let start = Instant::now();
        let mut batch = Vec::new();
        // Turns spent waiting for the server to receive, and since when.
        let mut waits = 0u32;
        let mut waiting_since: Option<Instant> = None;
        loop {
            // Post while some pair has room (and, for Sends, credits), a list per pair.
            while !stop {
                while let Some(&i) = starved.front()
                    && in_flight(i, &sent) < credits
                {
                    starved.pop_front();
                    ready.push_back(i);
                }
                let Some(i) = ready.pop_front() else { break };
                // Sends beyond the pair's credits wait among the starved.
                let unspent = match op {
                    Op::Send => credits.saturating_sub(in_flight(i, &sent)),
                    _ => usize::MAX,
                };
                if unspent == 0 {
                    starved.push_back(i);
                    continue;
                }
                waiting_since = None;
                let room = (limit[i] - sq_out[i]).min(unspent);
                batch.clear();
                // A count budget is checked per message, a time budget once per list (a
                // clock read per 64-byte message costs as much as posting it).
                while batch.len() < room && !stop {
                    batch.push(self.client_wr(op, i, size, TAG_SQ)?);
                    posted += 1;
                    stop = budget.iters.is_some() && budget.spent(posted, start);
                }
                stop = stop || budget.spent(posted, start);
                let k = batch.len();
                let cq_mod = self.cfg.cq_mod.min(limit[i]).max(1);
                let mut run = 0;
                for (j, wr) in batch.iter_mut().enumerate() {
                    run += 1;
                    wr.signaled = run == cq_mod || j + 1 == k;
                    if wr.signaled {
                        covers[i].push_back(run);
                        run = 0;
                    }
                }
                self.qps[i]
                    .post_send_list(batch.drain(..))
                    .map_err(|e| BenchError(format!("posting {what} failed: {e}")))?;
                sq_out[i] += k;
                outstanding += k;
                sent[i] += k as u64;
                if sq_out[i] < limit[i] {
                    ready.push_back(i);
                }
            }
            if op == Op::Send {
                done = self.received.total() - base_total;
            }
            if stop && done == posted && outstanding == 0 {
                break;
            }
            // Reap at least one completion when some are outstanding, then whatever else is
            // ready; a Send run waits for the server to receive too.
            let mut wc = if outstanding > 0 {
                Some(self.next(&what)?)
            } else {
                // Out of credits: sleep until the server reposts (it unparks this thread).
                // Inline, only this thread moves the client's engine: a Send completes once
                // framed, and what was framed for a full link goes out only in a later pass.
                if self.cfg.inline() {
                    self.devices[0].progress();
                }
                waits = waits.wrapping_add(1);
                let since = *waiting_since.get_or_insert_with(Instant::now);
                // Only a sender out of credits can find the peer stalled (a completion that
                // does not come fails `next`): no clock read per turn where messages flow.
                if budget.iters.is_none() && start.elapsed() > budget.duration + STALL {
                    // A server that failed says why (and then stops receiving).
                    return Err(self
                        .server_failure(&what)
                        .unwrap_or_else(|| BenchError(format!("{what}: the peer stopped receiving"))));
                }
                if self.cfg.busy() || waits < 64 {
                    relax(waits, self.patience);
                } else if since.elapsed() < CREDIT_SPIN {
                    std::thread::yield_now();
                } else {
                    self.credits.waiting.store(true, Ordering::SeqCst);
                    if self.received.total() - base_total == done {
                        std::thread::park_timeout(SERVER_TICK);
                    }
                    self.credits.waiting.store(false, Ordering::SeqCst);
                    waits = 0;
                    waiting_since = None;
                }
                None
            };
            while let Some(c) = wc {
                match split(c.wr_id) {
                    (i, TAG_SQ) if i < n => {
                        let retired = covers[i].pop_front().unwrap_or(1).min(sq_out[i]);
                        if sq_out[i] >= limit[i] && sq_out[i] - retired < limit[i] {
                            ready.push_back(i);
                        }
                        sq_out[i] -= retired;
                        outstanding -= retired;
                        if op != Op::Send {
                            done += retired as u64;
                        }
                    }
                    _ => return Err(unexpected(&what, &c)),
                }
                wc = self.cq.poll();
                if let Some(c) = &wc {
                    check(c, &what)?;
                }
            }
        }
        if op == Op::Write {
            // A Write completes when handed to TCP; a Read behind it completes only after the
            // peer placed everything before it.
            for i in 0..n {
                let mut wr = self.client_wr(Op::Read, i, size.min(8), TAG_FLUSH)?;
                wr.sgl = self.bufs.dst.sge(0, len32(size.min(8))?).into();
                self.qps[i].post_send(wr).map_err(post_err(&what))?;
            }
            for _ in 0..n {
                let c = self.next(&what)?;
                if split(c.wr_id).1 != TAG_FLUSH {
                    return Err(unexpected(&what, &c));
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        Ok(Throughput { msgs: done, bytes: done * size as u64, secs })
    }

    /// Round trips of one message of `size` bytes on the first pair until the budget is spent,
    /// each after the pause of `--gap`. With `baseline`, the raw-TCP echo's round trips take
    /// turns with these (one each with a gap, else [`TURN`] of each), so that both meet the
    /// same load on the machine: the second value holds them (empty without `baseline`), the
    /// third counts the turns (0 without). The budget counts this stack's round trips, or the
    /// time of the whole. Never inlined, so that callgrind can count what happens within it
    /// (docs/architecture.md, "What a message costs on the way").
    #[inline(never)]
    pub(super) fn latency(
        &mut self,
        op: Op,
        size: usize,
        budget: &Budget,
        mut baseline: Option<&mut raw::Echo>,
    ) -> Result<(Latency, Latency, u64), BenchError> {
        let what = format!("{} {size} B ping-pong", op.name());
        self.serve(match op {
            Op::Write => Serve::WritePong(size),
            Op::Send => Serve::SendPong(size),
            Op::Read => Serve::Idle,
        })?;
        self.top_up()?;
        let gap = self.cfg.gap;
        let pause = || {
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        };
        // A turn is one round trip with a gap (every round trip then starts from the same
        // idle), else TURN of them.
        let turn_over = |turn: Instant| !gap.is_zero() || turn.elapsed() >= TURN;
        let (mut samples, mut raw_samples) = (Samples::new(), Samples::new());
        let start = Instant::now();
        // Send completions of the ping-pong not reaped yet.
        let mut sq_out = 0usize;
        let mut turns = 0u64;
        loop {
            if let Some(echo) = baseline.as_deref_mut() {
                turns += 1;
                let turn = Instant::now();
                loop {
                    pause();
                    raw_samples.push(echo.round_trip()?);
                    if turn_over(turn) || budget.spent(raw_samples.len() as u64, start) {
                        break;
                    }
                }
            }
            let turn = Instant::now();
            loop {
                pause();
                samples.push(self.round_trip(op, size, &mut sq_out, &what)?);
                if baseline.is_none() || turn_over(turn) || budget.spent(samples.len() as u64, start) {
                    break;
                }
            }
            if budget.spent(samples.len() as u64, start) {
                break;
            }
        }
        while sq_out > 0 {
            let c = self.next(&what)?;
            match split(c.wr_id) {
                (0, TAG_SQ) => sq_out -= 1,
                _ => return Err(unexpected(&what, &c)),
            }
        }
        Ok((Latency::from_samples(samples), Latency::from_samples(raw_samples), turns))
    }

    /// One timed round trip of the ping-pong, then the untimed upkeep: the receive reposted
    /// (Send) and the send completions there are reaped.
    fn round_trip(
        &mut self,
        op: Op,
        size: usize,
        sq_out: &mut usize,
        what: &str,
    ) -> Result<Duration, BenchError> {
        let t0 = Instant::now();
        match op {
            Op::Read => {
                self.qps[0].post_send(self.client_wr(Op::Read, 0, size, TAG_SQ)?).map_err(post_err(what))?;
                let c = self.next(what)?;
                if c.wr_id != wr_id(0, TAG_SQ) || c.opcode != WcOpcode::Read {
                    return Err(unexpected(what, &c));
                }
            }
            Op::Write => {
                self.seq = self.seq.wrapping_add(1);
                let (mark_at, mark) = marker(size, self.seq);
                self.bufs.src.write(mark_at, &mark).map_err(|_| BenchError("marker out of bounds".into()))?;
                self.qps[0].post_send(self.client_wr(Op::Write, 0, size, TAG_SQ)?).map_err(post_err(what))?;
                *sq_out += 1;
                self.wait_marker(mark_at, &mark, sq_out, what)?;
            }
            Op::Send => {
                self.qps[0].post_send(self.client_wr(Op::Send, 0, size, TAG_SQ)?).map_err(post_err(what))?;
                *sq_out += 1;
                self.wait_recv(size, sq_out, what)?;
                self.posted[0] -= 1;
            }
        }
        let took = t0.elapsed();
        if op == Op::Send {
            self.top_up()?;
        }
        // Keep the send queue from filling up with unreaped completions.
        while *sq_out > 0 {
            let Some(c) = self.cq.poll() else { break };
            check(&c, what)?;
            match split(c.wr_id) {
                (0, TAG_SQ) => *sq_out -= 1,
                _ => return Err(unexpected(what, &c)),
            }
        }
        Ok(took)
    }

    /// Spins until the server's answering Write shows the marker in the client's buffer,
    /// reaping send completions meanwhile (which, inline, also drives the engine).
    fn wait_marker(&self, at: usize, mark: &[u8], sq_out: &mut usize, what: &str) -> Result<(), BenchError> {
        let deadline = Instant::now() + STALL;
        let mut seen = [0u8; 8];
        let seen = &mut seen[..mark.len()];
        let mut spins = 0u32;
        let qp = &self.qps[0];
        loop {
            let epoch = qp.input_epoch();
            self.bufs.dst.read(at, seen).map_err(|_| BenchError("marker out of bounds".into()))?;
            if seen == mark {
                return Ok(());
            }
            if let Some(c) = self.cq.poll() {
                check(&c, what)?;
                match split(c.wr_id) {
                    (0, TAG_SQ) => *sq_out -= 1,
                    _ => return Err(unexpected(what, &c)),
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && Instant::now() >= deadline {
                return Err(BenchError(format!(
                    "{what}: the Write was not placed within {} s",
                    STALL.as_secs()
                )));
            }
            wait_for_memory(qp, epoch, spins, self.cfg.busy(), self.patience, deadline);
        }
    }

    /// Reaps completions until a receive on pair 0 completes.
    fn wait_recv(&self, size: usize, sq_out: &mut usize, what: &str) -> Result<(), BenchError> {
        loop {
            let c = self.next(what)?;
            match split(c.wr_id) {
                (0, TAG_SQ) => *sq_out -= 1,
                (0, TAG_RQ) => {
                    if c.byte_len != size as u64 {
                        return Err(BenchError(format!("{what}: received {} bytes", c.byte_len)));
                    }
                    return Ok(());
                }
                _ => return Err(unexpected(what, &c)),
            }
        }
    }

    /// Stops the server thread and disconnects every queue pair (the devices stop when
    /// dropped).
    pub(super) fn close(mut self) {
        let _ = self.commands.send(Serve::Stop);
        self.server_cq.interrupt();
        self.server_qp.interrupt_input();
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
        for qp in &self.qps {
            qp.disconnect();
        }
    }
}

/// The next completion of `cq` within [`STALL`]: spinning (busy and inline modes) or
/// blocking.
fn next_completion(cq: &CompletionQueue, busy: bool, patience: u32) -> Option<WorkCompletion> {
    if !busy {
        return cq.wait(STALL);
    }
    let deadline = Instant::now() + STALL;
    let mut spins = 0u32;
    loop {
        if let Some(wc) = cq.poll() {
            return Some(wc);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && Instant::now() >= deadline {
            return None;
        }
        relax(spins, patience);
    }
}

impl Server {
    /// Serves commands until told to stop; acknowledges each once it is ready for it.
    fn run(mut self, commands: &Receiver<Serve>, acks: &Sender<Result<(), BenchError>>) {
        let mut current = Serve::Idle;
        loop {
            // Inline, nothing runs the server's engine unless this thread does: never block.
            let idle = matches!(current, Serve::Idle | Serve::Stop) && !self.inline;
            let next = match idle {
                true => commands.recv().ok(),
                false => match commands.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => {
                        if let Err(e) = self.step(current) {
                            let _ = acks.send(Err(e));
                            current = Serve::Idle;
                        }
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => None,
                },
            };
            let Some(next) = next else { return };
            if let Serve::Stop = next {
                return;
            }
            if let Serve::WritePong(size) = next {
                // The marker as it stands; the client's next Write changes it.
                let (at, len) = (size - size.min(8), size.min(8));
                self.mark = [0; 8];
                let _ = self.bufs.dst.read(at, &mut self.mark[..len]);
            }
            let ready = self.top_up().and_then(|()| self.reap_sends());
            current = if ready.is_ok() { next } else { Serve::Idle };
            if acks.send(ready).is_err() {
                return;
            }
        }
    }

    /// Keeps `rq_target` receives posted on every pair.
    fn top_up(&mut self) -> Result<(), BenchError> {
        let sge = self.bufs.dst.sge(0, len32(self.max_size)?);
        for (i, qp) in self.qps.iter().enumerate() {
            let n = self.rq_target.saturating_sub(self.posted[i]);
            if n > 0 {
                let wrs = (0..n).map(|_| RecvWr { wr_id: wr_id(i, TAG_RQ), sgl: sge.into() });
                qp.post_recv_list(wrs).map_err(|e| BenchError(format!("server: posting receives: {e}")))?;
                self.posted[i] += n;
            }
        }
        Ok(())
    }

    /// Reaps the completions that are ready (which, inline, also drives the engine).
    fn reap_sends(&mut self) -> Result<(), BenchError> {
        while let Some(c) = self.cq.poll() {
            self.completed(&c, "server")?;
        }
        self.repost()
    }

    /// Accounts for one completion: a send done, or a message received (its buffer is
    /// reposted by the next [`Server::repost`]). Returns the pair of a receive.
    fn completed(&mut self, c: &WorkCompletion, what: &str) -> Result<Option<usize>, BenchError> {
        check(c, what)?;
        match split(c.wr_id) {
            (_, TAG_SQ) => {
                self.sq_out = self.sq_out.saturating_sub(1);
                Ok(None)
            }
            (i, TAG_RQ) if i < self.qps.len() => {
                self.posted[i] -= 1;
                if self.consumed[i] == 0 {
                    self.dirty.push(i);
                }
                self.consumed[i] += 1;
                Ok(Some(i))
            }
            _ => Err(unexpected(what, c)),
        }
    }

    /// Reposts the buffers of the messages received since the last call, a list per pair
    /// (one doorbell each), then tells the client they are received.
    fn repost(&mut self) -> Result<(), BenchError> {
        let sge = self.bufs.dst.sge(0, len32(self.max_size)?);
        let mut dirty = std::mem::take(&mut self.dirty);
        for &i in &dirty {
            let n = std::mem::take(&mut self.consumed[i]);
            let wrs = (0..n).map(|_| RecvWr { wr_id: wr_id(i, TAG_RQ), sgl: sge.into() });
            self.qps[i]
                .post_recv_list(wrs)
                .map_err(|e| BenchError(format!("server: reposting receives: {e}")))?;
            self.posted[i] += n;
            self.received.add(i, n as u64);
            if self.credits.waiting.swap(false, Ordering::SeqCst) {
                self.credits.client.unpark();
            }
        }
        dirty.clear();
        self.dirty = dirty;
        Ok(())
    }

    /// Waits for a completion, or until the client sends a command: blocking, at most
    /// [`SERVER_WAIT`] (the command interrupts the wait); spinning, at most [`SERVER_TICK`].
    fn wait(&self) -> Option<WorkCompletion> {
        if !self.busy {
            return self.cq.wait(SERVER_WAIT);
        }
        let deadline = Instant::now() + SERVER_TICK;
        let mut spins = 0u32;
        loop {
            if let Some(wc) = self.cq.poll() {
                return Some(wc);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && Instant::now() >= deadline {
                return None;
            }
            relax(spins, self.patience);
        }
    }

    /// One step of the current measurement.
    fn step(&mut self, what: Serve) -> Result<(), BenchError> {
        match what {
            Serve::Idle | Serve::Stop => {
                // Only reached inline: polling drives the engine; with nothing to do, the core
                // goes to the client's thread now and then.
                match self.cq.poll() {
                    Some(c) => {
                        self.idle_turns = 0;
                        self.completed(&c, "server")?;
                    }
                    None => {
                        self.idle_turns = self.idle_turns.wrapping_add(1);
                        relax(self.idle_turns, self.patience);
                    }
                }
                Ok(())
            }
            Serve::Sink => {
                // Everything that is in, then the buffers back in one list. What follows the
                // first is taken SINK_BATCH at a time (one lock of the queue per batch).
                let Some(first) = self.wait() else { return self.repost() };
                self.completed(&first, "server receive")?;
                let mut batch = [WorkCompletion::default(); SINK_BATCH];
                loop {
                    let n = self.cq.poll_many(&mut batch);
                    for c in &batch[..n] {
                        self.completed(c, "server receive")?;
                    }
                    if n < SINK_BATCH {
                        break;
                    }
                }
                self.repost()
            }
            Serve::SendPong(size) => {
                // Answer every ping that is in, not only the first.
                let mut next = self.wait();
                while let Some(c) = next {
                    if self.completed(&c, "server pong")? == Some(0) {
                        let sgl = self.bufs.src.sge(0, len32(size)?).into();
                        let op = SendOp::Send { solicited: false, invalidate: None };
                        self.qps[0]
                            .post_send(SendWr { wr_id: wr_id(0, TAG_SQ), op, sgl, signaled: true })
                            .map_err(post_err("the pong"))?;
                        self.sq_out += 1;
                        // The ping's receive goes back before the next look, right behind the
                        // pong (off the round trip's path; the slack covers the next ping
                        // should it come first): the client answers a pong with its next ping
                        // at once, so while pings keep coming in this loop need not end, and
                        // a repost left for its end came too late (the receives ran out, "no
                        // buffer available", after 9 round trips where 9 were posted, in a
                        // debug build under load).
                        self.repost()?;
                    }
                    next = self.cq.poll();
                }
                self.repost()
            }
            Serve::WritePong(size) => self.write_pong(size),
        }
    }

    /// Waits for the client's Write to show a new marker, then answers it. Gives up, to look
    /// at its commands, after [`SERVER_TICK`] when spinning; blocking, when a command
    /// interrupts its wait (or after [`SERVER_WAIT`]): a short timeout would arm a timer at
    /// every sleep, as for the completion waits.
    fn write_pong(&mut self, size: usize) -> Result<(), BenchError> {
        let (at, len) = (size - size.min(8), size.min(8));
        let deadline = Instant::now() + if self.busy { SERVER_TICK } else { SERVER_WAIT };
        let mut seen = [0u8; 8];
        let mut spins = 0u32;
        loop {
            let epoch = self.qps[0].input_epoch();
            self.bufs
                .dst
                .read(at, &mut seen[..len])
                .map_err(|_| BenchError("marker out of bounds".into()))?;
            if seen != self.mark {
                self.mark = seen;
                break;
            }
            self.reap_sends()?;
            spins = spins.wrapping_add(1);
            if self.busy {
                if spins.is_multiple_of(256) && Instant::now() >= deadline {
                    return Ok(());
                }
                wait_for_memory(&self.qps[0], epoch, spins, self.busy, self.patience, deadline);
            } else if self.qps[0].wait_input(epoch, deadline.saturating_duration_since(Instant::now()))
                == epoch
            {
                // Interrupted by a command, or out of time.
                return Ok(());
            }
        }
        self.bufs.src.write(at, &seen[..len]).map_err(|_| BenchError("marker out of bounds".into()))?;
        let (remote_stag, remote_to) = self.client_dst;
        let wr = SendWr {
            wr_id: wr_id(0, TAG_SQ),
            op: SendOp::Write { remote_stag, remote_to },
            sgl: self.bufs.src.sge(0, len32(size)?).into(),
            signaled: true,
        };
        self.qps[0].post_send(wr).map_err(post_err("the answering Write"))?;
        self.sq_out += 1;
        Ok(())
    }
}

/// One turn of a busy wait: spin, and after `patience` turns also yield the core, so that on a
/// machine with more runnable threads than cores the engine (or the peer) gets to run.
fn relax(spins: u32, patience: u32) {
    if spins >= patience {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// One turn of waiting for a peer's Write to show in memory on `qp` (RDMA Writes complete
/// nothing at their target, so the target looks), `epoch` being the queue pair's input count
/// read before the last look. With a busy or inline engine this thread spins as the engine
/// does. Otherwise this one waits in `QueuePair::wait_input` (which spins briefly only while
/// the engine is awake) until more input was taken off the connection (or `deadline`).
/// Spinning here first left the input in the socket while the engine slept (event mode: the
/// 8 B Write ping-pong took 15.3 us back to back, the Send one 8.8). Yielding instead of
/// sleeping kept it runnable, and with another process spinning on this 2-core machine the
/// engine thread woken to place the Write waited for the scheduler's next tick: the Write
/// ping-pong's p50 was 4 ms at 256 B to 1 MiB.
fn wait_for_memory(qp: &QueuePair, epoch: u64, spins: u32, busy: bool, patience: u32, deadline: Instant) {
    if busy {
        relax(spins, patience);
    } else {
        qp.wait_input(epoch, deadline.saturating_duration_since(Instant::now()));
    }
}

/// Where the ping-pong's sequence marker goes (the last up-to-8 bytes) and its bytes.
fn marker(size: usize, seq: u64) -> (usize, Vec<u8>) {
    let m = size.min(8);
    (size - m, seq.to_le_bytes()[..m].to_vec())
}

fn check(wc: &WorkCompletion, what: &str) -> Result<(), BenchError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(BenchError(format!("{what}: {:?} completed with status {:?}", wc.opcode, wc.status)))
    }
}

fn unexpected(what: &str, wc: &WorkCompletion) -> BenchError {
    BenchError(format!(
        "{what}: unexpected completion {:?} (wr_id {:#x}, qp {})",
        wc.opcode, wc.wr_id, wc.qp_num
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code panics on failure")]

    use super::*;

    /// A measurement that fails because a queue pair left RTS says why: here the server closed
    /// its end, and the error names both queue pairs with their states and events.
    #[test]
    fn a_failed_measurement_names_the_queue_pairs_that_left_rts() {
        let cfg = Config {
            poll: PollMode::Adaptive,
            crc: false,
            revision: 2,
            qps: 1,
            window: 4,
            cq_mod: 1,
            rx_depth: 512,
            shared_device: false,
            zero_copy: true,
            gap: Duration::ZERO,
            max_size: 64,
            pcap: None,
            smol: None,
        };
        let mut bench = Bench::open(cfg).unwrap();
        bench.server_qp.disconnect();
        let deadline = Instant::now() + STALL;
        while bench.qps[0].state() == QpState::Rts {
            assert!(Instant::now() < deadline, "the client's queue pair stayed in RTS");
            std::thread::sleep(Duration::from_millis(1));
        }
        let budget = Budget { iters: Some(10), duration: Duration::from_secs(1) };
        let e = bench.latency(Op::Send, 64, &budget, None).map_err(|e| bench.explain(e)).unwrap_err().0;
        // The server's thread sees its receives flushed; the client's queue pair lost its
        // connection with it.
        assert!(e.contains("WrFlushError"), "{e}");
        assert!(e.contains("client queue pair 0 Error: LlpLost"), "{e}");
        assert!(e.contains("server queue pair 0 Error"), "{e}");
        bench.close();
    }
}
