//! The iWARP measurements: one device, one protection domain and one completion queue, both
//! ends of every connection in this process, driven by the calling thread.
//!
//! One application thread posts for both ends and reaps every completion (they all go to
//! one queue; the queue pair number and the work request id say whose it is), so that with a
//! busy-polling engine thread the run takes two cores, as the raw-TCP baseline's two threads
//! do.

use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion, PollMode, ProtectionDomain,
    QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::{BenchError, Budget, Latency, Op, Throughput};

/// How long the engine may go without completing anything before a measurement fails.
const STALL: Duration = Duration::from_secs(10);
/// The iWARP listener's port on the server's smoltcp stack.
const SMOL_PORT: u16 = 7290;

/// Busy-wait turns before a busy wait starts yielding the core (some tens of microseconds).
const SPINS_BEFORE_YIELD: u32 = 20_000;

/// What a work request id says about its origin (low byte); the pair index is above it.
const TAG_CLIENT_SQ: u64 = 0;
const TAG_SERVER_SQ: u64 = 1;
const TAG_CLIENT_RQ: u64 = 2;
const TAG_SERVER_RQ: u64 = 3;
/// The final Read that proves earlier Writes were placed.
const TAG_FLUSH: u64 = 4;

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
    /// The largest message size of the run (buffers are registered once, this big).
    pub(super) max_size: usize,
    /// Where to record the connections, if anywhere.
    pub(super) pcap: Option<std::sync::Arc<std::sync::Mutex<iwarp::netdev::PcapWriter>>>,
    /// smoltcp: the client's and the server's stacks (else kernel TCP over 127.0.0.1).
    pub(super) smol: Option<(iwarp::netdev::SmolStack, iwarp::netdev::SmolStack)>,
}

/// One connection: both ends, and the receives posted on each.
struct Pair {
    client: QueuePair,
    server: QueuePair,
    client_rq: usize,
    server_rq: usize,
    ord: usize,
}

/// The device, its connections and registered buffers.
pub(super) struct Bench {
    // Fields drop in order: queue pairs and regions before the device.
    pairs: Vec<Pair>,
    client_src: MemoryRegion,
    client_dst: MemoryRegion,
    server_src: MemoryRegion,
    server_dst: MemoryRegion,
    cq: CompletionQueue,
    cfg: Config,
    seq: u64,
    /// Receives kept posted on each end of each pair.
    rq_target: usize,
    /// Outstanding work requests allowed per pair.
    per_pair: usize,
    _device: Device,
}

/// What the connections negotiated.
#[derive(Debug, Clone, Copy)]
pub(super) struct Negotiated {
    pub(super) crc: bool,
    pub(super) revision: u8,
    pub(super) ord: u16,
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

impl Bench {
    /// Opens the device and connects `cfg.qps` queue pairs over 127.0.0.1.
    pub(super) fn open(cfg: Config) -> Result<Bench, BenchError> {
        let device = Device::open(DeviceConfig { poll_mode: cfg.poll, ..DeviceConfig::default() });
        let pd = device.alloc_pd();
        // Room for every completion a measurement can have outstanding.
        let cq = device.create_cq(cfg.qps * (cfg.window + 8) * 4 + 64);
        let per_pair = cfg.window.div_ceil(cfg.qps).max(1);
        let opts = ConnectOptions {
            policy: Policy {
                revision: cfg.revision,
                crc: if cfg.crc { CrcPolicy::Required } else { CrcPolicy::Off },
                ird: 16,
                ord: 16,
                ..Policy::default()
            },
            max_send_wr: per_pair + 64,
            max_recv_wr: per_pair + 64,
            capture: cfg.pcap.clone(),
            ..ConnectOptions::default()
        };
        let bind = match &cfg.smol {
            Some((_, server)) => std::net::SocketAddr::from((server.ip(), SMOL_PORT)),
            None => std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let mut listener =
            crate::transport::AnyListener::listen(&device, cfg.smol.as_ref().map(|s| &s.1), bind)
                .map_err(cm_err("listen"))?;
        let addr = listener.local_addr().ok_or_else(|| BenchError("listen: no local address".into()))?;
        let server = {
            // The client end records the connection; recording both ends would show it twice.
            let server_opts = ConnectOptions { capture: None, ..opts.clone() };
            let (pd, cq, opts, n) = (pd.clone(), cq.clone(), server_opts, cfg.qps);
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
        let mut clients = Vec::with_capacity(cfg.qps);
        for _ in 0..cfg.qps {
            let connected = match &cfg.smol {
                Some((client, _)) => device.connect_smol(client, addr, &pd, &cq, &cq, &opts),
                None => device.connect(addr, &pd, &cq, &cq, &opts),
            };
            match connected {
                Ok(c) => clients.push(c.qp),
                Err(e) => {
                    // The accepting thread gives up on its own after its timeout.
                    let _ = server.join();
                    return Err(cm_err("connect")(e));
                }
            }
        }
        let servers = server.join().map_err(|_| BenchError("the accepting thread panicked".into()))??;
        let pairs = clients
            .into_iter()
            .zip(servers)
            .map(|(client, server)| {
                let ord = usize::from(client.conn_params().ord).max(1);
                Pair { client, server, client_rq: 0, server_rq: 0, ord }
            })
            .collect();
        let remote = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ);
        let src = |pd: &ProtectionDomain| pd.register(cfg.max_size, Access::REMOTE_READ).map_err(reg_err);
        let dst = |pd: &ProtectionDomain| pd.register(cfg.max_size, remote).map_err(reg_err);
        Ok(Bench {
            pairs,
            client_src: src(&pd)?,
            client_dst: dst(&pd)?,
            server_src: src(&pd)?,
            server_dst: dst(&pd)?,
            cq,
            cfg,
            seq: 0,
            rq_target: per_pair + 8,
            per_pair,
            _device: device,
        })
    }

    /// What the first connection negotiated.
    pub(super) fn negotiated(&self) -> Option<Negotiated> {
        self.pairs.first().map(|p| {
            let c = p.client.conn_params();
            Negotiated { crc: c.crc, revision: c.revision, ord: c.ord }
        })
    }

    fn busy(&self) -> bool {
        matches!(self.cfg.poll, PollMode::Busy | PollMode::Inline)
    }

    /// The next completion, failing on a timeout or an unsuccessful status.
    fn next(&self, what: &str) -> Result<WorkCompletion, BenchError> {
        let wc = if self.busy() {
            let deadline = Instant::now() + STALL;
            let mut spins = 0u32;
            loop {
                if let Some(wc) = self.cq.poll() {
                    break Some(wc);
                }
                spins = spins.wrapping_add(1);
                if spins % 1024 == 0 && Instant::now() >= deadline {
                    break None;
                }
                relax(spins);
            }
        } else {
            self.cq.wait(STALL)
        };
        let wc =
            wc.ok_or_else(|| BenchError(format!("{what}: no completion within {} s", STALL.as_secs())))?;
        check(&wc, what)?;
        Ok(wc)
    }

    /// Tops the receive queues of both ends of every pair up to the target.
    fn top_up(&mut self) -> Result<(), BenchError> {
        let len = len32(self.cfg.max_size)?;
        for (i, p) in self.pairs.iter_mut().enumerate() {
            while p.client_rq < self.rq_target {
                let sgl = vec![self.client_dst.sge(0, len)];
                p.client
                    .post_recv(RecvWr { wr_id: wr_id(i, TAG_CLIENT_RQ), sgl })
                    .map_err(post_err("a receive"))?;
                p.client_rq += 1;
            }
            while p.server_rq < self.rq_target {
                let sgl = vec![self.server_dst.sge(0, len)];
                p.server
                    .post_recv(RecvWr { wr_id: wr_id(i, TAG_SERVER_RQ), sgl })
                    .map_err(post_err("a receive"))?;
                p.server_rq += 1;
            }
        }
        Ok(())
    }

    fn client_wr(&self, op: Op, pair: usize, size: usize, tag: u64) -> Result<SendWr, BenchError> {
        let len = len32(size)?;
        let (op, sge) = match op {
            Op::Write => (
                SendOp::Write { remote_stag: self.server_dst.rkey(), remote_to: self.server_dst.addr() },
                self.client_src.sge(0, len),
            ),
            Op::Read => (
                SendOp::Read { remote_stag: self.server_src.rkey(), remote_to: self.server_src.addr() },
                self.client_dst.sge(0, len),
            ),
            Op::Send => (SendOp::Send { solicited: false, invalidate: None }, self.client_src.sge(0, len)),
        };
        Ok(SendWr { wr_id: wr_id(pair, tag), op, sgl: vec![sge], signaled: true })
    }

    /// Streams messages of `size` bytes, `window` outstanding, spread round-robin over the
    /// pairs, until the budget is spent; then waits for all of them.
    pub(super) fn throughput(
        &mut self,
        op: Op,
        size: usize,
        budget: &Budget,
    ) -> Result<Throughput, BenchError> {
        let what = format!("{} {size} B bandwidth", op.name());
        self.top_up()?;
        let n = self.pairs.len();
        let limit: Vec<usize> = self
            .pairs
            .iter()
            .map(|p| if op == Op::Read { self.per_pair.min(p.ord) } else { self.per_pair })
            .collect();
        // Per pair: send-queue work outstanding, and (Send) messages not yet received.
        let mut sq_out = vec![0usize; n];
        let mut in_flight = vec![0usize; n];
        let (mut posted, mut done) = (0u64, 0u64);
        let mut next_pair = 0usize;
        let mut stop = false;
        let start = Instant::now();
        loop {
            // Post while some pair has room.
            while !stop {
                let Some(i) = (0..n)
                    .map(|k| (next_pair + k) % n)
                    .find(|&i| sq_out[i] < limit[i] && (op != Op::Send || in_flight[i] < limit[i]))
                else {
                    break;
                };
                next_pair = (i + 1) % n;
                let wr = self.client_wr(op, i, size, TAG_CLIENT_SQ)?;
                self.pairs[i].client.post_send(wr).map_err(post_err(&what))?;
                sq_out[i] += 1;
                in_flight[i] += 1;
                posted += 1;
                stop = budget.spent(posted, start);
            }
            if stop && done == posted && sq_out.iter().all(|&o| o == 0) {
                break;
            }
            // Reap at least one completion, then whatever else is ready.
            let mut wc = Some(self.next(&what)?);
            while let Some(c) = wc {
                let (i, tag) = split(c.wr_id);
                match tag {
                    TAG_CLIENT_SQ if i < n => {
                        sq_out[i] = sq_out[i].saturating_sub(1);
                        if op != Op::Send {
                            in_flight[i] = in_flight[i].saturating_sub(1);
                            done += 1;
                        }
                    }
                    TAG_SERVER_RQ if i < n && op == Op::Send => {
                        if c.byte_len != size as u64 {
                            return Err(BenchError(format!("{what}: received {} bytes", c.byte_len)));
                        }
                        in_flight[i] = in_flight[i].saturating_sub(1);
                        done += 1;
                        self.pairs[i].server_rq -= 1;
                        let sgl = vec![self.server_dst.sge(0, len32(self.cfg.max_size)?)];
                        let wr = RecvWr { wr_id: wr_id(i, TAG_SERVER_RQ), sgl };
                        self.pairs[i].server.post_recv(wr).map_err(post_err("a receive"))?;
                        self.pairs[i].server_rq += 1;
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
                wr.sgl = vec![self.client_dst.sge(0, len32(size.min(8))?)];
                self.pairs[i].client.post_send(wr).map_err(post_err(&what))?;
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

    /// Round trips of one message of `size` bytes on the first pair.
    pub(super) fn latency(&mut self, op: Op, size: usize, budget: &Budget) -> Result<Latency, BenchError> {
        let what = format!("{} {size} B ping-pong", op.name());
        self.top_up()?;
        let mut samples = Vec::new();
        let start = Instant::now();
        // Send completions of the ping-pong not reaped yet.
        let mut sq_out = 0usize;
        loop {
            let t0 = Instant::now();
            match op {
                Op::Read => {
                    self.pairs[0]
                        .client
                        .post_send(self.client_wr(Op::Read, 0, size, TAG_CLIENT_SQ)?)
                        .map_err(post_err(&what))?;
                    let c = self.next(&what)?;
                    if c.wr_id != wr_id(0, TAG_CLIENT_SQ) || c.opcode != WcOpcode::Read {
                        return Err(unexpected(&what, &c));
                    }
                }
                Op::Write => {
                    self.seq = self.seq.wrapping_add(1);
                    let (mark_at, mark) = marker(size, self.seq);
                    self.client_src
                        .write(mark_at, &mark)
                        .map_err(|_| BenchError("marker out of bounds".into()))?;
                    let wr = self.client_wr(Op::Write, 0, size, TAG_CLIENT_SQ)?;
                    self.pairs[0].client.post_send(wr).map_err(post_err(&what))?;
                    sq_out += 1;
                    self.wait_marker(&self.server_dst, mark_at, &mark, &mut sq_out, &what)?;
                    self.server_src
                        .write(mark_at, &mark)
                        .map_err(|_| BenchError("marker out of bounds".into()))?;
                    let wr = SendWr {
                        wr_id: wr_id(0, TAG_SERVER_SQ),
                        op: SendOp::Write {
                            remote_stag: self.client_dst.rkey(),
                            remote_to: self.client_dst.addr(),
                        },
                        sgl: vec![self.server_src.sge(0, len32(size)?)],
                        signaled: true,
                    };
                    self.pairs[0].server.post_send(wr).map_err(post_err(&what))?;
                    sq_out += 1;
                    self.wait_marker(&self.client_dst, mark_at, &mark, &mut sq_out, &what)?;
                }
                Op::Send => {
                    self.pairs[0]
                        .client
                        .post_send(self.client_wr(Op::Send, 0, size, TAG_CLIENT_SQ)?)
                        .map_err(post_err(&what))?;
                    sq_out += 1;
                    self.wait_recv(TAG_SERVER_RQ, size, &mut sq_out, &what)?;
                    let wr = SendWr {
                        wr_id: wr_id(0, TAG_SERVER_SQ),
                        op: SendOp::Send { solicited: false, invalidate: None },
                        sgl: vec![self.server_src.sge(0, len32(size)?)],
                        signaled: true,
                    };
                    self.pairs[0].server.post_send(wr).map_err(post_err(&what))?;
                    sq_out += 1;
                    self.wait_recv(TAG_CLIENT_RQ, size, &mut sq_out, &what)?;
                }
            }
            samples.push(t0.elapsed());
            if op == Op::Send {
                self.pairs[0].client_rq -= 1;
                self.pairs[0].server_rq -= 1;
                self.top_up()?;
            }
            // Keep the send queues from filling up with unreaped completions.
            while sq_out > 0 {
                let Some(c) = self.cq.poll() else { break };
                check(&c, &what)?;
                match split(c.wr_id) {
                    (0, TAG_CLIENT_SQ | TAG_SERVER_SQ) => sq_out -= 1,
                    _ => return Err(unexpected(&what, &c)),
                }
            }
            if budget.spent(samples.len() as u64, start) {
                break;
            }
        }
        while sq_out > 0 {
            let c = self.next(&what)?;
            match split(c.wr_id) {
                (0, TAG_CLIENT_SQ | TAG_SERVER_SQ) => sq_out -= 1,
                _ => return Err(unexpected(&what, &c)),
            }
        }
        Ok(Latency::from_samples(samples))
    }

    /// Spins until the marker shows in `mr` (the engine places with relaxed atomic stores),
    /// reaping send completions meanwhile (which, inline, also drives the engine).
    fn wait_marker(
        &self,
        mr: &MemoryRegion,
        at: usize,
        mark: &[u8],
        sq_out: &mut usize,
        what: &str,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + STALL;
        let mut seen = [0u8; 8];
        let seen = &mut seen[..mark.len()];
        let mut spins = 0u32;
        loop {
            mr.read(at, seen).map_err(|_| BenchError("marker out of bounds".into()))?;
            if seen == mark {
                return Ok(());
            }
            if let Some(c) = self.cq.poll() {
                check(&c, what)?;
                match split(c.wr_id) {
                    (0, TAG_CLIENT_SQ | TAG_SERVER_SQ) => *sq_out -= 1,
                    _ => return Err(unexpected(what, &c)),
                }
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 && Instant::now() >= deadline {
                return Err(BenchError(format!(
                    "{what}: the Write was not placed within {} s",
                    STALL.as_secs()
                )));
            }
            relax(spins);
        }
    }

    /// Reaps completions until the receive of `tag` on pair 0 completes.
    fn wait_recv(&self, tag: u64, size: usize, sq_out: &mut usize, what: &str) -> Result<(), BenchError> {
        loop {
            let c = self.next(what)?;
            match split(c.wr_id) {
                (0, TAG_CLIENT_SQ | TAG_SERVER_SQ) => *sq_out -= 1,
                (0, t) if t == tag => {
                    if c.byte_len != size as u64 {
                        return Err(BenchError(format!("{what}: received {} bytes", c.byte_len)));
                    }
                    return Ok(());
                }
                _ => return Err(unexpected(what, &c)),
            }
        }
    }

    /// Disconnects every queue pair (the device stops when dropped).
    pub(super) fn close(self) {
        for p in &self.pairs {
            p.client.disconnect();
        }
    }
}

/// One turn of a busy wait: spin, and after a while also yield the core, so that on a machine
/// with more runnable threads than cores the engine (or the peer) gets to run.
fn relax(spins: u32) {
    if spins >= SPINS_BEFORE_YIELD {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
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
