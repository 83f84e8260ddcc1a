//! `iwarp perftest`: perftest's `ib_write_bw -R`, `ib_read_bw -R` and `ib_send_bw -R`, on the
//! wire the same (perftest 4.5-0.17, internal version 6.06; see docs/perftest.md).
//!
//! Two rdma_cm (TCP + MPA) connections, both from the client to the server's port: the
//! control connection carries perftest's lockstep Sends (version, cycle buffer, cache line,
//! MTU, the "pre"/"post" handshakes, the 56-byte key records, the report); the data
//! connection carries the test traffic.

mod args;
mod conn;
mod ctrl;
mod data;
mod report;
mod seam;
mod session;
mod wire;

pub(crate) use args::Args;
use args::*;
use conn::*;
use ctrl::*;
use data::*;
use report::*;
use session::*;

use crate::toolbox::cm_message;
use crate::toolbox::{
    self, Capture, Fail, accept_next, flush_capture, flush_stack_capture, open_capture, open_stack, resolve,
};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use iwarp::netdev::SmolStack;
use iwarp::{CmError, Device, DeviceConfig, ProtectionDomain, RecvWr};
use iwarp::{ListenOptions, Listener};

/// Runs the subcommand and returns the exit status.
pub(crate) fn run(args: &Args) -> ExitCode {
    let result = match (args.address.as_deref(), args.device.as_deref()) {
        (Some(host), None) => client(args, host),
        (None, None) => server(args),
        (Some(host), Some(name)) => seam::client(args, host, name),
        (None, Some(name)) => seam::server(args, name),
    };
    toolbox::exit("perftest", result)
}

// --- client -----------------------------------------------------------------------------------

fn client(args: &Args, host: &str) -> Result<(), Fail> {
    check_client_flags(args)?;
    let p = Params::new(args);
    let addr = resolve(host, args.port)?;
    let stack = open_stack(&args.transport, args.pcap.as_deref())?;
    let capture = open_capture(args.pcap.as_deref(), stack.as_ref())?;
    let result = client_run(args, &p, addr, capture.as_ref(), stack.as_ref());
    flush_capture("perftest", capture.as_ref());
    flush_stack_capture("perftest", stack.as_ref());
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
    let agreed = part_a(p, ctrl)?;
    let bufs = DataBufs::new(device, pd, p, &agreed)?;
    let opts = data_options(args, p, capture);
    // perftest's server opens the data listener only after sending "pre"; a slow server (siw
    // under emulation) may not listen yet when our connect arrives, so pause first and retry a
    // refused connect for up to --timeout (see DATA_LISTENER_PAUSE).
    let started = Instant::now();
    std::thread::sleep(DATA_LISTENER_PAUSE);
    let qp = loop {
        match connect_any(device, stack, addr, pd, &bufs.cq, &opts) {
            Err(CmError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused && started.elapsed() < p.timeout =>
            {
                std::thread::sleep(DATA_LISTENER_PAUSE);
            }
            r => {
                break r.map_err(|e| {
                    Fail::Run(format!("cannot connect the data connection to {addr}: {}", cm_message(&e)))
                })?;
            }
        }
    };
    let data = bufs.into_data(qp.qp);
    print_banner(p, &agreed, args.shown_device(), false);
    let result = client_data(p, &agreed, ctrl, &data);
    close(&data.qp);
    result
}

// --- server -----------------------------------------------------------------------------------

fn server(args: &Args) -> Result<(), Fail> {
    if args.first_fpdu_delay != 0 {
        return Err(Fail::Usage("--first-fpdu-delay is a client option (give the ADDRESS)".into()));
    }
    let p = Params::new(args);
    let host = args.bind.as_deref().unwrap_or("0.0.0.0");
    let stack = open_stack(&args.transport, args.pcap.as_deref())?;
    let bind = match &stack {
        // smoltcp listens on the stack's own address.
        Some(stack) => SocketAddr::from((stack.ip(), args.port)),
        None => resolve(host, args.port)?,
    };
    let capture = open_capture(args.pcap.as_deref(), stack.as_ref())?;
    let device = Device::open(DeviceConfig::default());
    // One client at a time: its control and data connections; more are rejected on the wire.
    let lopts = ListenOptions { max_connections: 2, ..crate::transport::listen_options(stack.as_ref()) };
    let listener = device
        .listen_with(bind, &lopts)
        .map_err(|e| Fail::Run(format!("cannot listen on {bind}: {}", cm_message(&e))))?;
    print_waiting();
    let result = server_run(args, &p, &device, &listener, capture.as_ref());
    flush_capture("perftest", capture.as_ref());
    flush_stack_capture("perftest", stack.as_ref());
    result
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
    let req = accept_next("perftest", listener, deadline)?;
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
    let agreed = part_a(p, ctrl)?;
    let bufs = DataBufs::new(device, pd, p, &agreed)?;
    print_banner(p, &agreed, args.shown_device(), true);
    // The data connection comes from the control connection's peer; anyone else is turned
    // away while we wait for it.
    let deadline = Instant::now() + p.timeout;
    let req = loop {
        let req = accept_next("perftest", listener, Some(deadline))?;
        if req.peer_addr().ip() == peer_ip {
            break req;
        }
        eprintln!("perftest: rejecting {} while waiting for {peer_ip}'s data connection", req.peer_addr());
        let _ = req.reject(&[]);
    };
    if let Some(ev) = ctrl.qp.poll_event() {
        return Err(Fail::Run(format!("{} before the data connection", toolbox::event_text(ev, None))));
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

#[cfg(test)]
mod tests {
    use super::wire::Report;
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
