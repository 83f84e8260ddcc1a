//! The data connection: the Write and Read client loops, and the Send client and server
//! loops, with perftest's windows of outstanding work requests.

use super::args::*;
use super::conn::*;
use super::report::*;
use crate::toolbox::{self, Capture, Fail, register};
use std::time::{Duration, Instant};

use iwarp::{
    Access, CompletionQueue, ConnectOptions, Device, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, STag,
    SendOp, SendWr, WcOpcode, WcStatus,
};

use super::wire::{self, KeyRecord, Report};

/// The data connection and its buffers.
pub(super) struct Data {
    pub(super) qp: QueuePair,
    pub(super) bufs: DataBufs,
}

/// What a data connection posts: an RDMA Write or Read of `size` bytes at `local` in the first
/// half of the buffer, a Send of its first `size` bytes, or a credit Write of source word
/// `slot`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Post {
    Rdma { read: bool, rkey: u32, addr: u64, local: u64 },
    Send,
    Credit { slot: usize, rkey: u32, addr: u64 },
}

/// A successful completion: its work request and whether it was a receive.
#[derive(Debug, Clone, Copy)]
pub(super) struct Done {
    pub(super) wr_id: u64,
    pub(super) recv: bool,
}

/// A data connection and its buffers, as the test loops drive them: the engine's queue pair
/// here, the seam's endpoint in seam.rs.
pub(super) trait DataPath {
    /// The number shown as the queue pair's in the key record.
    fn qpn(&self) -> u32;
    /// The key and address this side advertises: the second half of the buffer, or for send
    /// the credit word the peer writes.
    fn advertised(&self, p: &Params) -> (u32, u64);
    /// Posts one work request with `size` bytes; false when the send queue is full.
    fn post(&self, wr_id: u64, post: Post, size: u32, signaled: bool) -> Result<bool, String>;
    /// Posts one `size`-byte receive into the second half of the buffer.
    fn post_recv(&self, wr_id: u64, size: u32) -> Result<(), String>;
    /// The next completion within `t`; a failed one as text, `what` naming what was awaited.
    fn wait(&self, t: Duration, what: &dyn Fn() -> String) -> Result<Option<Done>, String>;
    /// A connection event (the peer closed, a Terminate) as text, if one came.
    fn event(&self) -> Option<String>;
    /// The count the send server last wrote into our credit word.
    fn credit(&self) -> Result<u64, String>;
    /// Source words of the send server's credit Writes.
    fn credit_slots(&self) -> u64;
    /// Writes credit source word `slot`.
    fn set_credit(&self, slot: usize, count: u32) -> Result<(), String>;

    /// This side's key record.
    fn record(&self, p: &Params, psn: u32) -> KeyRecord {
        let (rkey, vaddr) = self.advertised(p);
        KeyRecord {
            out_reads: u32::from(p.out_reads),
            qpn: self.qpn(),
            psn,
            rkey,
            vaddr,
            gid: local_gid(),
            ..KeyRecord::default()
        }
    }
}

impl DataPath for Data {
    fn qpn(&self) -> u32 {
        self.qp.qp_num()
    }

    fn advertised(&self, p: &Params) -> (u32, u64) {
        if p.test == Test::Send {
            (self.bufs.credit.rkey().0, self.bufs.credit.addr() + 4)
        } else {
            (self.bufs.buf.rkey().0, self.bufs.buf.addr() + self.bufs.half as u64)
        }
    }

    fn post(&self, wr_id: u64, post: Post, size: u32, signaled: bool) -> Result<bool, String> {
        let (op, sgl) = match post {
            Post::Rdma { read, rkey, addr, local } => {
                let (remote_stag, remote_to) = (STag(rkey), addr);
                let op = if read {
                    SendOp::Read { remote_stag, remote_to }
                } else {
                    SendOp::Write { remote_stag, remote_to }
                };
                (op, self.bufs.buf.sge(usize::try_from(local).unwrap_or(0), size))
            }
            Post::Send => (SendOp::Send { solicited: false, invalidate: None }, self.bufs.buf.sge(0, size)),
            Post::Credit { slot, rkey, addr } => (
                SendOp::Write { remote_stag: STag(rkey), remote_to: addr },
                self.bufs.credit_src.sge(slot, 4),
            ),
        };
        match self.qp.post_send(SendWr { wr_id, op, sgl: sgl.into(), signaled }) {
            Ok(()) => Ok(true),
            Err(iwarp::PostError::QueueFull) => Ok(false),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    fn post_recv(&self, wr_id: u64, size: u32) -> Result<(), String> {
        let wr = RecvWr { wr_id, sgl: self.bufs.buf.sge(self.bufs.half, size).into() };
        self.qp.post_recv(wr).map_err(|e| format!("cannot post a data receive: {e:?}"))
    }

    fn wait(&self, t: Duration, what: &dyn Fn() -> String) -> Result<Option<Done>, String> {
        let Some(wc) = self.bufs.cq.wait(t) else { return Ok(None) };
        if wc.status != WcStatus::Success {
            return Err(wc_failure(&self.qp, &wc, &what()));
        }
        Ok(Some(Done { wr_id: wc.wr_id, recv: wc.opcode == WcOpcode::Recv }))
    }

    fn event(&self) -> Option<String> {
        self.qp.poll_event().map(|ev| toolbox::event_text(ev, None))
    }

    fn credit(&self) -> Result<u64, String> {
        let mut word = [0u8; 4];
        self.bufs.credit.read(4, &mut word).map_err(|e| format!("credit word: {e:?}"))?;
        Ok(u64::from(u32::from_le_bytes(word)))
    }

    fn credit_slots(&self) -> u64 {
        u64::try_from(self.bufs.credit_src.len() / 4).unwrap_or(1).max(1)
    }

    fn set_credit(&self, slot: usize, count: u32) -> Result<(), String> {
        self.bufs
            .credit_src
            .write(slot, &wire::credit_bytes(count))
            .map_err(|e| format!("credit word: {e:?}"))
    }
}

/// The GID shown in the key record: a locally administered MAC (02:00:00:00:00:01, no real
/// netdev here) and ten zero bytes, laid out as siw's.
pub(super) fn local_gid() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    g
}

/// A data connection's completion queue and buffers (made before the connection).
pub(super) struct DataBufs {
    pub(super) cq: CompletionQueue,
    /// Two halves of `half` bytes: the first is sent/read from, the second advertised.
    pub(super) buf: MemoryRegion,
    pub(super) half: usize,
    /// send_bw's credit words, as perftest's: [4..8] is the word the peer writes (advertised).
    pub(super) credit: MemoryRegion,
    /// The sources of the send_bw server's credit Writes, one 4-byte word per send-queue
    /// slot.
    pub(super) credit_src: MemoryRegion,
}

impl DataBufs {
    pub(super) fn new(
        device: &Device,
        pd: &ProtectionDomain,
        p: &Params,
        a: &Agreed,
    ) -> Result<DataBufs, Fail> {
        let half = a.half(p.size);
        let buf = register(pd, 2 * half, DATA_ACCESS)?;
        buf.write(0, &random_bytes(half)).map_err(|e| Fail::Run(format!("data buffer: {e:?}")))?;
        let credit = register(pd, 8, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))?;
        let credit_src = register(pd, 4 * send_depth(p), Access::LOCAL_WRITE)?;
        let depth = usize::try_from(p.tx_depth + p.rx_depth).unwrap_or(1024) + 64;
        Ok(DataBufs { cq: device.create_cq(depth), buf, half, credit, credit_src })
    }

    pub(super) fn into_data(self, qp: QueuePair) -> Data {
        Data { qp, bufs: self }
    }
}

/// The data connection's send queue depth.
pub(super) fn send_depth(p: &Params) -> usize {
    usize::try_from(p.tx_depth.max(p.rx_depth)).unwrap_or(512) + 16
}

pub(super) fn data_options(args: &Args, p: &Params, capture: Option<&Capture>) -> ConnectOptions {
    let ird_ord = if p.test == Test::Read { p.out_reads } else { 0 };
    ConnectOptions {
        max_send_wr: send_depth(p),
        max_recv_wr: usize::try_from(p.rx_depth).unwrap_or(512) + 16,
        ..conn_options(args, ird_ord, capture)
    }
}

/// The write/read client's run: N (or -D seconds of) Writes or Reads, at most tx depth
/// outstanding, every cq_mod-th and the last signaled.
pub(super) fn run_rdma_client(
    p: &Params,
    a: &Agreed,
    d: &impl DataPath,
    peer: &KeyRecord,
) -> Result<Report, String> {
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
    let read = p.test == Test::Read;
    let what = if read { "RDMA Read" } else { "RDMA Write" };
    let failed = || format!("{what} completions");
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
            let op = Post::Rdma { read, rkey: peer.rkey, addr: peer.vaddr + off, local: off };
            match d.post(posted, op, size, signaled) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(format!("cannot post an {what}: {e}")),
            }
            if n != 0 {
                tposted.push(nanos(start));
            }
            posted += 1;
        }
        let Some(wc) = d.wait(Duration::from_millis(20), &failed)? else {
            if let Some(ev) = d.event() {
                return Err(format!("{ev} during the {what}s"));
            }
            if last_progress.elapsed() > p.timeout {
                return Err(format!("no {what} completed for {} s", p.timeout.as_secs()));
            }
            continue;
        };
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

pub(super) fn more_to_post(n: u64, posted: u64, stopping: bool) -> bool {
    if n == 0 { !stopping } else { posted < n }
}

pub(super) fn nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The send_bw client: Sends while (sent + 1 - credit) < rx depth, credit being the count
/// the server last wrote into our credit word.
pub(super) fn run_send_client(p: &Params, d: &impl DataPath) -> Result<Report, String> {
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
        let credit = d.credit()?;
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
            match d.post(posted, Post::Send, size, signaled) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(format!("cannot post a Send: {e}")),
            }
            if n != 0 {
                tposted.push(nanos(start));
            }
            posted += 1;
            progressed = true;
        }
        // Credits arrive as RDMA Writes (no completion here): poll briefly.
        let wait = if progressed || posted > completed { Duration::from_millis(1) } else { Duration::ZERO };
        match d.wait(wait, &|| "Send completions".to_owned())? {
            Some(wc) => {
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
                if let Some(ev) = d.event() {
                    return Err(format!("{ev} during the Sends"));
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
    // The server's last credit Write is on its way once the last Send has completed here:
    // let it land (briefly) before the connection is torn down, so that this end has read
    // all of the server's traffic (a capture of it holds every credit Write, as siw's does).
    if n != 0 {
        let last = (1..=n).rev().find(|&c| credit_due(c, rx)).unwrap_or(0);
        let until = Instant::now() + Duration::from_millis(200);
        while d.credit()? < last && Instant::now() < until {
            let _ = d.wait(Duration::from_millis(1), &|| "the server's last credit".to_owned())?;
        }
    }
    Ok(match window {
        Some(w) => w.report(p),
        None => iteration_report(p, &tposted, &tcompleted),
    })
}

/// Whether the send_bw server writes its count into the client's credit word once it has
/// received `count` messages: when (count mod rx depth) mod floor(rx depth / 3) == 0.
fn credit_due(count: u64, rx_depth: u64) -> bool {
    let rx = rx_depth.max(1);
    (count % rx).is_multiple_of((rx / 3).max(1))
}

/// The send_bw server after K4: counts receives, reposts until N are posted, and writes its
/// cumulative count into the client's credit word whenever
/// (count mod rx depth) mod floor(rx depth / 3) == 0.
pub(super) fn run_send_server(
    p: &Params,
    d: &impl DataPath,
    peer: &KeyRecord,
    mut posted_recvs: u64,
) -> Result<Report, String> {
    let n = p.iters;
    let rx = u64::from(p.rx_depth);
    let mut received = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut stop_at: Option<Instant> = None;
    let mut wr = posted_recvs;
    let mut last_progress = Instant::now();
    let slots = d.credit_slots();
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
        let Some(wc) = d.wait(Duration::from_millis(20), &|| "the client's Sends".to_owned())? else {
            if let Some(ev) = d.event() {
                return Err(format!("{ev} during the Sends"));
            }
            // Duration mode waits for the first message without limit (the client starts it).
            if (n != 0 || first.is_some()) && last_progress.elapsed() > p.timeout {
                return Err(format!("no Send arrived for {} s ({received} received)", p.timeout.as_secs()));
            }
            continue;
        };
        if !wc.recv {
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
            d.post_recv(wr, p.size)?;
            posted_recvs += 1;
        }
        if credit_due(received, rx) {
            // Each Write gets its own source word: a word still waiting to be sent must not
            // change under it.
            let count = u32::try_from(received).unwrap_or(u32::MAX);
            let slot = usize::try_from(credit_seq % slots).unwrap_or(0) * 4;
            credit_seq += 1;
            d.set_credit(slot, count)?;
            let w = Post::Credit { slot, rkey: peer.rkey, addr: peer.vaddr };
            match d.post(u64::MAX - received, w, 4, true) {
                Ok(true) => {}
                Ok(false) => return Err("cannot post a credit Write: the send queue is full".into()),
                Err(e) => return Err(format!("cannot post a credit Write: {e}")),
            }
            credits_out += 1;
        }
    }
    // The last credit Writes go out before the connection is torn down (a disconnect flushes
    // what is still queued).
    let deadline = Instant::now() + p.timeout;
    while credits_out > 0 && Instant::now() < deadline {
        match d.wait(Duration::from_millis(20), &|| "the credit Writes".to_owned()) {
            Ok(Some(wc)) if !wc.recv => credits_out -= 1,
            Ok(Some(_)) => {}
            // A failed completion ends a credit Write too (or a receive: the count is a bound).
            Err(_) => credits_out -= 1,
            Ok(None) => {
                if let Some(ev) = d.event() {
                    return Err(format!("{ev} after the Sends"));
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
