//! `iwarp rping --device NAME`: the same ping, client and server, over a device driven through
//! the backend seam (src/backend.rs): an rdma-core device (siw0, rxe0 in a guest, the verbs
//! drop-in iwarp0 on the host) with the `verbs` feature, or the engine named `iwarp`.
//!
//! The messages, buffers and their order are those of the engine path in cli/src/rping.rs, so
//! either end talks to rdmacm-utils' rping and to `iwarp rping` without the flag. What the
//! seam does not carry (MPA options, capture, smoltcp, QP events) is refused up front.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::Access;
use iwarp::backend::{BackendError, CompletionOp, Endpoint, EndpointOptions, Op, Region, Status};

use super::args::Args;
use super::proto::{
    BUF_ACCESS, BufInfo, INFO_LEN, MAX_SIZE, Stop, c_string, client_checks, echo_len, mid_ping, pattern,
    usize_of,
};
use crate::toolbox::{Fail, close_endpoint, open_device, refuse_with_device, resolve};

/// rping's queue pair: 16 send work requests (the seam has one depth for both queues).
const QUEUE_DEPTH: u32 = 16;
/// [`INFO_LEN`] as work requests count bytes.
const INFO_LEN32: u32 = 16;
const _: () = assert!(INFO_LEN32 as usize == INFO_LEN);
/// How long the server waits for a client without --accept-timeout.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// The flags the seam path cannot honour, as a usage error.
fn check_flags(args: &Args) -> Result<(), Fail> {
    let refused = [
        (args.crc, "--crc"),
        (args.markers, "--markers"),
        (args.mpa_rev != 2, "--mpa-rev"),
        (args.p2p, "--p2p"),
        (args.first_fpdu_delay != 0, "--first-fpdu-delay"),
        (args.pcap.is_some(), "--pcap"),
        (args.persistent, "-P"),
        (args.transport.transport != crate::transport::Kind::Kernel, "--transport"),
    ];
    refuse_with_device(&refused)
}

fn verbs(what: &str) -> impl Fn(BackendError) -> Fail + '_ {
    move |e| Fail::Run(format!("{what}: {e}"))
}

fn options(args: &Args) -> EndpointOptions {
    EndpointOptions {
        queue_depth: QUEUE_DEPTH,
        timeout: Duration::from_secs(args.timeout),
        // rping posts its receive before connecting and before accepting: the peer's first
        // Send may come at once.
        early_recvs: (1, INFO_LEN32),
        ..EndpointOptions::default()
    }
}

/// One connection over the seam and its 16-byte message buffers.
struct Conn {
    ep: Box<dyn Endpoint>,
    recv: Arc<dyn Region>,
    send: Arc<dyn Region>,
    timeout: Duration,
    next_wr: u64,
}

impl Conn {
    fn new(ep: Box<dyn Endpoint>, timeout: Duration) -> Result<Conn, Fail> {
        let recv = ep.early_recv_region().ok_or_else(|| Fail::Run("no early receive region".into()))?;
        let send = ep.register(INFO_LEN, Access::NONE).map_err(verbs("send buffer"))?;
        Ok(Conn { ep, recv, send, timeout, next_wr: 1 })
    }

    fn failed(e: BackendError) -> Stop {
        Stop::Failed(e.to_string())
    }

    fn send_info(&mut self, info: Option<BufInfo>) -> Result<(), Stop> {
        let bytes = info.map_or([0u8; INFO_LEN], BufInfo::to_bytes);
        self.send.write(0, &bytes).map_err(Conn::failed)?;
        self.post(Op::Send, &*self.send.clone(), INFO_LEN32)
    }

    fn post(&mut self, op: Op, region: &dyn Region, len: u32) -> Result<(), Stop> {
        self.next_wr += 1;
        self.ep.post_send(self.next_wr, op, Some(region.local(0, len))).map_err(Conn::failed)
    }

    /// Waits for the next completion of `want`, skipping successful Send completions.
    fn wait(&mut self, want: CompletionOp, what: &str) -> Result<u32, Stop> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Stop::Failed(format!(
                    "timed out after {} s waiting for {what}",
                    self.timeout.as_secs()
                )));
            }
            let Some(wc) = self.ep.poll(left.min(Duration::from_millis(50))) else { continue };
            match wc.status {
                Status::Success if wc.op == want => return Ok(wc.byte_len),
                Status::Success => {}
                Status::Flushed => return Err(Stop::Closed),
                s => {
                    return Err(Stop::Failed(format!(
                        "a completion failed with {s:?} while waiting for {what}"
                    )));
                }
            }
        }
    }

    fn recv_info(&mut self, what: &str) -> Result<BufInfo, Stop> {
        let len = self.wait(CompletionOp::Recv, what)?;
        if len as usize != INFO_LEN {
            return Err(Stop::Failed(format!(
                "received bogus data, size {len} (expected {INFO_LEN}) while waiting for {what}"
            )));
        }
        let mut b = [0u8; INFO_LEN];
        self.recv.read(0, &mut b).map_err(Conn::failed)?;
        self.next_wr += 1;
        self.ep.post_recv(self.next_wr, self.recv.local(0, INFO_LEN32)).map_err(Conn::failed)?;
        Ok(BufInfo::parse(&b))
    }

    fn close(&self) {
        close_endpoint(&*self.ep);
    }
}

fn info_of(region: &dyn Region, size: u32) -> BufInfo {
    BufInfo { addr: region.addr(), rkey: region.rkey(), size }
}

pub(super) fn client(args: &Args, name: &str) -> Result<(), Fail> {
    check_flags(args)?;
    let Some(host) = args.addr.as_deref() else {
        return Err(Fail::Usage("the client needs the server's address (-a ADDR)".into()));
    };
    let addr = resolve(host, args.port)?;
    let backend = open_device(name)?;
    let size = usize_of(args.size);
    let ep = backend
        .connect(addr, &options(args))
        .map_err(|e| Fail::Run(format!("cannot connect to {addr} through {name}: {e}")))?;
    if args.debug {
        eprintln!("rping: connected to {addr} through device {name}");
    }
    let mut conn = Conn::new(ep, Duration::from_secs(args.timeout))?;
    let start = conn.ep.register(size, BUF_ACCESS).map_err(verbs("start buffer"))?;
    let sink = conn.ep.register(size, BUF_ACCESS).map_err(verbs("rdma buffer"))?;
    let result = client_pings(args, &mut conn, &*start, &*sink, size);
    conn.close();
    if args.debug && result.is_ok() {
        eprintln!("rping: client done, disconnected");
    }
    result
}

fn client_pings(
    args: &Args,
    conn: &mut Conn,
    start: &dyn Region,
    sink: &dyn Region,
    size: usize,
) -> Result<(), Fail> {
    let count = args.count.unwrap_or(0);
    let size32 = u32::try_from(size).unwrap_or(u32::MAX);
    let mut k = 0u64;
    while count == 0 || k < count {
        let fail = |s: Stop| match s {
            Stop::Closed => Fail::Run(format!("the server closed the connection during ping {k}")),
            Stop::Failed(m) => Fail::Run(format!("ping {k}: {m}")),
        };
        let data = pattern(k, size);
        start.write(0, &data).map_err(verbs("start buffer"))?;
        sink.write(0, &vec![0u8; size]).map_err(verbs("rdma buffer"))?;
        let start_info = info_of(start, size32);
        if args.debug {
            eprintln!("rping: ping {k}: advertising the start buffer: {start_info}");
        }
        conn.send_info(Some(start_info)).map_err(fail)?;
        conn.recv_info("the server's go-ahead after its RDMA Read (RDMA_WRITE_ADV)").map_err(fail)?;
        let sink_info = info_of(sink, size32);
        if args.debug {
            eprintln!("rping: ping {k}: advertising the rdma buffer: {sink_info}");
        }
        conn.send_info(Some(sink_info)).map_err(fail)?;
        conn.recv_info("the server's go-ahead after its RDMA Write (RDMA_WRITE_COMPLETE)").map_err(fail)?;
        let mut got = vec![0u8; size];
        sink.read(0, &mut got).map_err(verbs("rdma buffer"))?;
        client_checks(k, &data, &got, args.validate, args.verbose)?;
        k += 1;
    }
    Ok(())
}

pub(super) fn server(args: &Args, name: &str) -> Result<(), Fail> {
    check_flags(args)?;
    let host = args.addr.as_deref().unwrap_or("0.0.0.0");
    let bind = resolve(host, args.port)?;
    let backend = open_device(name)?;
    let listener = backend
        .listen(bind)
        .map_err(|e| Fail::Run(format!("cannot listen on {bind} through {name}: {e}")))?;
    if args.debug {
        eprintln!("rping: listening on {} through device {name}", listener.local_addr());
    }
    let wait = args.accept_timeout.map_or(FOREVER, Duration::from_secs);
    let req = listener.next_request(wait).map_err(|e| Fail::Run(format!("no connection: {e}")))?;
    let ep =
        req.accept(&options(args)).map_err(|e| Fail::Run(format!("cannot accept the connection: {e}")))?;
    let on = listener.local_addr();
    let mut conn = Conn::new(ep, Duration::from_secs(args.timeout))?;
    let result = serve_pings(args, &mut conn);
    conn.close();
    match result {
        Ok(k) => {
            if args.debug {
                eprintln!("rping: the client disconnected after {k} pings (device {name}, on {on})");
            }
            Ok(())
        }
        Err(m) => Err(Fail::Run(m)),
    }
}

fn serve_pings(args: &Args, conn: &mut Conn) -> Result<u64, String> {
    let limit = args.max_memory << 20;
    let mut buf = conn.ep.register(usize_of(args.size), BUF_ACCESS).map_err(|e| e.to_string())?;
    let mut k = 0u64;
    loop {
        let a = match conn.recv_info("the client's start buffer advertisement (RDMA_READ_ADV)") {
            Ok(a) => a,
            Err(Stop::Closed) => return Ok(k),
            Err(e) => return Err(format!("ping {k}: {e}")),
        };
        if args.debug {
            eprintln!("rping: ping {k}: client start buffer {a}");
        }
        let len = usize_of(a.size);
        if a.size > MAX_SIZE || a.size as u64 > limit {
            return Err(format!(
                "ping {k}: the client advertised {} bytes, more than this server takes",
                a.size
            ));
        }
        if len > buf.len() {
            buf = conn.ep.register(len, BUF_ACCESS).map_err(|e| e.to_string())?;
        }
        let err = mid_ping(k);
        conn.post(Op::Read { rkey: a.rkey, addr: a.addr }, &*buf, a.size).map_err(err)?;
        conn.wait(CompletionOp::Read, "the RDMA Read of the client's buffer (RDMA_READ_COMPLETE)")
            .map_err(err)?;
        let mut data = vec![0u8; len];
        buf.read(0, &mut data).map_err(|e| e.to_string())?;
        if args.verbose {
            println!("server ping data: {}", c_string(&data));
        }
        conn.send_info(None).map_err(err)?;
        let b = conn.recv_info("the client's rdma buffer advertisement (RDMA_WRITE_ADV)").map_err(err)?;
        if args.debug {
            eprintln!("rping: ping {k}: client rdma buffer {b}");
        }
        let echo = echo_len(k, &data, &b)?;
        conn.post(Op::Write { rkey: b.rkey, addr: b.addr }, &*buf, echo).map_err(err)?;
        conn.wait(CompletionOp::Write, "the RDMA Write to the client (RDMA_WRITE_COMPLETE)").map_err(err)?;
        conn.send_info(None).map_err(err)?;
        k += 1;
    }
}
