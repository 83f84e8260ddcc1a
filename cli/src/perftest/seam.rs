//! `iwarp perftest --device NAME`: the same tests, client and server, over a device driven
//! through the backend seam (src/backend.rs): an rdma-core device (siw0, rxe0 in a guest, the
//! verbs drop-in iwarp0 on the host) with the `verbs` feature, or the engine named `iwarp`.
//!
//! The control connection's lockstep messages ([`Lockstep`]) and the test loops
//! ([`DataPath`]) are those of the engine path, so either end talks to perftest's `ib_*_bw -R`
//! and to `iwarp perftest` without the flag. What the seam does not carry (MPA CRC, the first
//! FPDU delay, capture, smoltcp) is refused up front. The seam signals every work request, so
//! -Q only shapes what the client asks for, not what completes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::Access;
use iwarp::backend::{
    Backend, BackendError, BackendListener, Completion, CompletionOp, Endpoint, EndpointOptions, Op, Region,
    Status,
};

use super::args::*;
use super::conn::{DATA_ACCESS, DATA_LISTENER_PAUSE, random_bytes};
use super::ctrl::{Lockstep, wait_slice};
use super::data::{DataPath, Done, Post, send_depth};
use super::report::print_banner;
use super::session::{check_client_flags, client_data, part_a, print_waiting, server_data};
use super::wire;
use crate::toolbox::{Fail, close_endpoint, open_device, refuse_with_device, resolve};

/// [`wire::MAX_MSG`] as work requests count bytes.
const MAX_MSG32: u32 = 56;
const _: () = assert!(MAX_MSG32 as usize == wire::MAX_MSG);
/// How long the server waits for a client without --accept-timeout.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The flags the seam path cannot honour, as a usage error.
fn check_flags(args: &Args) -> Result<(), Fail> {
    refuse_with_device(&[
        (args.crc, "--crc"),
        (args.first_fpdu_delay != 0, "--first-fpdu-delay"),
        (args.pcap.is_some(), "--pcap"),
        (args.transport.transport != crate::transport::Kind::Kernel, "--transport"),
    ])
}

fn failed(what: &str) -> impl Fn(BackendError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A failed completion as text.
fn completion_failure(wc: &Completion, what: &str) -> String {
    if wc.status == Status::Flushed {
        return format!("the connection closed while waiting for {what}");
    }
    format!("a completion failed with {:?} while waiting for {what}", wc.status)
}

/// The control connection: the receive of the first message goes up with it (the peer's
/// first Send may come at once; iWARP has no receiver-not-ready retry).
fn ctrl_options(p: &Params) -> EndpointOptions {
    EndpointOptions {
        queue_depth: 4,
        timeout: p.timeout,
        early_recvs: (1, MAX_MSG32),
        rd_atomic: Some(0),
        ..Default::default()
    }
}

/// The data connection: the send queue of the engine path, Reads outstanding for the read
/// test only.
fn data_options(p: &Params) -> EndpointOptions {
    EndpointOptions {
        queue_depth: u32::try_from(send_depth(p)).unwrap_or(u32::MAX),
        timeout: p.timeout,
        rd_atomic: Some(if p.test == Test::Read { u8::try_from(p.out_reads).unwrap_or(u8::MAX) } else { 0 }),
        ..Default::default()
    }
}

/// The control connection over the seam: one 56-byte receive posted at all times.
struct SeamCtrl {
    ep: Box<dyn Endpoint>,
    recv: Arc<dyn Region>,
    send: Arc<dyn Region>,
    /// Completions of the other kind seen while waiting for one kind (Sends, receives).
    stashed: [u32; 2],
    timeout: Duration,
    server: bool,
    next_wr: u64,
}

impl SeamCtrl {
    fn new(ep: Box<dyn Endpoint>, timeout: Duration, server: bool) -> Result<SeamCtrl, Fail> {
        let recv = ep.early_recv_region().ok_or_else(|| Fail::Run("no early receive region".into()))?;
        let send = ep
            .register(wire::MAX_MSG, Access::NONE)
            .map_err(|e| Fail::Run(failed("control send buffer")(e)))?;
        Ok(SeamCtrl { ep, recv, send, stashed: [0; 2], timeout, server, next_wr: 1 })
    }

    /// Waits for the next completion of a Send (`recv` false) or a receive.
    fn wait(&mut self, recv: bool, what: &str, limit: Option<Duration>) -> Result<(), String> {
        let (want, other) = (usize::from(recv), usize::from(!recv));
        if self.stashed[want] > 0 {
            self.stashed[want] -= 1;
            return Ok(());
        }
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            let Some(wc) = self.ep.poll(wait_slice(deadline, what)?) else { continue };
            if wc.status != Status::Success {
                return Err(completion_failure(&wc, what));
            }
            if (wc.op == CompletionOp::Recv) == recv {
                return Ok(());
            }
            self.stashed[other] += 1;
        }
    }
}

impl Lockstep for SeamCtrl {
    fn server(&self) -> bool {
        self.server
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), String> {
        self.send.write(0, msg).map_err(failed("control send buffer"))?;
        self.next_wr += 1;
        let len = u32::try_from(msg.len()).unwrap_or(u32::MAX);
        self.ep
            .post_send(self.next_wr, Op::Send, Some(self.send.local(0, len)))
            .map_err(failed(&format!("cannot post the Send of {what}")))?;
        self.wait(false, &format!("the Send of {what}"), Some(self.timeout))
    }

    fn recv(&mut self, expect: usize, what: &str, limit: Option<Duration>) -> Result<Vec<u8>, String> {
        self.wait(true, &format!("the peer's {what}"), limit)?;
        let mut b = vec![0u8; expect.min(wire::MAX_MSG)];
        self.recv.read(0, &mut b).map_err(failed("control receive buffer"))?;
        self.next_wr += 1;
        self.ep
            .post_recv(self.next_wr, self.recv.local(0, MAX_MSG32))
            .map_err(failed("cannot post a control receive"))?;
        Ok(b)
    }
}

/// The data connection over the seam and its buffers, laid out as the engine path's.
struct SeamData {
    ep: Box<dyn Endpoint>,
    /// Two halves of `half` bytes: the first is sent/read from, the second advertised.
    buf: Arc<dyn Region>,
    half: usize,
    /// send_bw's credit words: [4..8] is the word the peer writes (advertised).
    credit: Arc<dyn Region>,
    /// The sources of the send_bw server's credit Writes, one word per send-queue slot.
    credit_src: Arc<dyn Region>,
}

impl SeamData {
    fn new(ep: Box<dyn Endpoint>, p: &Params, a: &Agreed) -> Result<SeamData, Fail> {
        let run = |what: &'static str| move |e: BackendError| Fail::Run(format!("{what}: {e}"));
        let half = a.half(p.size);
        let buf = ep.register(2 * half, DATA_ACCESS).map_err(run("data buffer"))?;
        buf.write(0, &random_bytes(half)).map_err(run("data buffer"))?;
        let credit =
            ep.register(8, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)).map_err(run("credit word"))?;
        let credit_src = ep.register(4 * send_depth(p), Access::LOCAL_WRITE).map_err(run("credit words"))?;
        Ok(SeamData { ep, buf, half, credit, credit_src })
    }
}

impl DataPath for SeamData {
    fn qpn(&self) -> u32 {
        // The seam does not show queue pair numbers; perftest only prints the peer's.
        0
    }

    fn advertised(&self, p: &Params) -> (u32, u64) {
        if p.test == Test::Send {
            (self.credit.rkey(), self.credit.addr() + 4)
        } else {
            (self.buf.rkey(), self.buf.addr() + self.half as u64)
        }
    }

    fn post(&self, wr_id: u64, post: Post, size: u32, _signaled: bool) -> Result<bool, String> {
        let (op, local) = match post {
            Post::Rdma { read: true, rkey, addr, local } => {
                (Op::Read { rkey, addr }, self.buf.local(usize::try_from(local).unwrap_or(0), size))
            }
            Post::Rdma { read: false, rkey, addr, local } => {
                (Op::Write { rkey, addr }, self.buf.local(usize::try_from(local).unwrap_or(0), size))
            }
            Post::Send => (Op::Send, self.buf.local(0, size)),
            Post::Credit { slot, rkey, addr } => (Op::Write { rkey, addr }, self.credit_src.local(slot, 4)),
        };
        self.ep.post_send(wr_id, op, Some(local)).map_err(|e| e.to_string())?;
        Ok(true)
    }

    fn post_recv(&self, wr_id: u64, size: u32) -> Result<(), String> {
        self.ep
            .post_recv(wr_id, self.buf.local(self.half, size))
            .map_err(failed("cannot post a data receive"))
    }

    fn wait(&self, t: Duration, what: &dyn Fn() -> String) -> Result<Option<Done>, String> {
        let Some(wc) = self.ep.poll(t) else { return Ok(None) };
        if wc.status != Status::Success {
            return Err(completion_failure(&wc, &what()));
        }
        Ok(Some(Done { wr_id: wc.wr_id, recv: wc.op == CompletionOp::Recv }))
    }

    fn event(&self) -> Option<String> {
        // The seam reports a closed connection as flushed completions.
        None
    }

    fn credit(&self) -> Result<u64, String> {
        let mut word = [0u8; 4];
        self.credit.read(4, &mut word).map_err(failed("credit word"))?;
        Ok(u64::from(u32::from_le_bytes(word)))
    }

    fn credit_slots(&self) -> u64 {
        u64::try_from(self.credit_src.len() / 4).unwrap_or(1).max(1)
    }

    fn set_credit(&self, slot: usize, count: u32) -> Result<(), String> {
        self.credit_src.write(slot, &wire::credit_bytes(count)).map_err(failed("credit word"))
    }
}

/// Waits (at most `limit`) until the peer has closed `ep`: a receive comes back flushed.
fn wait_closed(ep: &dyn Endpoint, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        if ep.poll(left.min(Duration::from_millis(50))).is_some_and(|wc| wc.status != Status::Success) {
            return;
        }
    }
}

// --- client -----------------------------------------------------------------------------------

pub(super) fn client(args: &Args, host: &str, name: &str) -> Result<(), Fail> {
    check_client_flags(args)?;
    check_flags(args)?;
    let p = Params::new(args);
    let addr = resolve(host, args.port)?;
    let backend = open_device(name)?;
    let ep = backend
        .connect(addr, &ctrl_options(&p))
        .map_err(|e| Fail::Run(format!("cannot connect to {addr} through {name}: {e}")))?;
    let mut ctrl = SeamCtrl::new(ep, p.timeout, false)?;
    let result = client_session(args, &p, addr, &*backend, &mut ctrl);
    if result.is_ok() {
        // The server closes the control connection after the data connection.
        wait_closed(&*ctrl.ep, Duration::from_secs(2));
    }
    close_endpoint(&*ctrl.ep);
    result
}

fn client_session(
    args: &Args,
    p: &Params,
    addr: SocketAddr,
    backend: &dyn Backend,
    ctrl: &mut SeamCtrl,
) -> Result<(), Fail> {
    let agreed = part_a(p, ctrl)?;
    // perftest's server opens the data listener only after sending "pre": pause first and
    // retry a refused connect for up to --timeout (see DATA_LISTENER_PAUSE).
    let started = Instant::now();
    std::thread::sleep(DATA_LISTENER_PAUSE);
    let ep = loop {
        match backend.connect(addr, &data_options(p)) {
            Ok(ep) => break ep,
            Err(BackendError::Connect(_) | BackendError::Rejected { .. })
                if started.elapsed() < p.timeout =>
            {
                std::thread::sleep(DATA_LISTENER_PAUSE);
            }
            Err(e) => return Err(Fail::Run(format!("cannot connect the data connection to {addr}: {e}"))),
        }
    };
    let data = SeamData::new(ep, p, &agreed)?;
    print_banner(p, &agreed, args.shown_device(), false);
    let result = client_data(p, &agreed, ctrl, &data);
    close_endpoint(&*data.ep);
    result
}

// --- server -----------------------------------------------------------------------------------

pub(super) fn server(args: &Args, name: &str) -> Result<(), Fail> {
    check_flags(args)?;
    let p = Params::new(args);
    let bind = resolve(args.bind.as_deref().unwrap_or("0.0.0.0"), args.port)?;
    let backend = open_device(name)?;
    let listener = backend
        .listen(bind)
        .map_err(|e| Fail::Run(format!("cannot listen on {bind} through {name}: {e}")))?;
    print_waiting();
    let wait = args.accept_timeout.map_or(FOREVER, Duration::from_secs);
    let req = listener.next_request(wait).map_err(|e| Fail::Run(format!("no connection: {e}")))?;
    let ep =
        req.accept(&ctrl_options(&p)).map_err(|e| Fail::Run(format!("cannot accept the connection: {e}")))?;
    let mut ctrl = SeamCtrl::new(ep, p.timeout, true)?;
    let result = server_session(args, &p, &*listener, &mut ctrl);
    close_endpoint(&*ctrl.ep);
    result
}

fn server_session(
    args: &Args,
    p: &Params,
    listener: &dyn BackendListener,
    ctrl: &mut SeamCtrl,
) -> Result<(), Fail> {
    let agreed = part_a(p, ctrl)?;
    print_banner(p, &agreed, args.shown_device(), true);
    let req = listener.next_request(p.timeout).map_err(|e| Fail::Run(format!("no data connection: {e}")))?;
    let ep = req
        .accept(&data_options(p))
        .map_err(|e| Fail::Run(format!("cannot accept the data connection: {e}")))?;
    let data = SeamData::new(ep, p, &agreed)?;
    // send_bw: the data receives (rx depth of them, at most N). The client sends only after
    // the key records, so they are up in time. Write/read: one receive, which comes back
    // flushed when the client closes.
    let k = match p.test {
        Test::Send if p.iters == 0 => u64::from(p.rx_depth),
        Test::Send => u64::from(p.rx_depth).min(p.iters),
        _ => 1,
    };
    for i in 0..k {
        data.post_recv(i, p.size)?;
    }
    let posted = if p.test == Test::Send { k } else { 0 };
    let result = server_data(p, ctrl, &data, posted, Duration::from_secs(args.run_timeout));
    if result.is_ok() {
        // The client closes the data connection first.
        wait_closed(&*data.ep, Duration::from_secs(2));
    }
    close_endpoint(&*data.ep);
    result
}
