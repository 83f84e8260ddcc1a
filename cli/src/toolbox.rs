//! What the commands that run connections share: the failure type and exit statuses, name
//! resolution, registration, the smoltcp stack and capture setup, waiting for a connection
//! request, the text of a queue pair's events, and opening and closing what `--device` drives
//! through the backend seam.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::backend::{Backend, Endpoint, Status, devices, open_backend};
use iwarp::netdev::{PcapWriter, SmolStack};
use iwarp::{
    Access, CmError, CompletionQueue, ConnectRequest, Listener, MemoryRegion, ProtectionDomain, QpEvent,
    QueuePair, WcStatus, WorkCompletion,
};

use crate::transport::TransportArgs;

/// Exit status of a failed run.
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit status of a usage error clap cannot catch.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Why a run failed.
#[derive(Debug)]
pub(crate) enum Fail {
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

/// The exit status of a run of `command`, its failure printed as `command: message`.
pub(crate) fn exit(command: &str, result: Result<(), Fail>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("{command}: {m}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Fail::Run(m)) => {
            eprintln!("{command}: {m}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The address of `host` (a name or a literal) at `port`, an IPv4 one where there is one.
pub(crate) fn resolve(host: &str, port: u16) -> Result<SocketAddr, Fail> {
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
    first.ok_or_else(|| Fail::Run(format!("cannot resolve {host}: no address")))
}

/// `len` zeroed bytes registered with `access`.
pub(crate) fn register(pd: &ProtectionDomain, len: usize, access: Access) -> Result<MemoryRegion, Fail> {
    pd.register(len, access).map_err(|e| Fail::Run(e.to_string()))
}

/// Opens the smoltcp stack of `--transport smoltcp`, capturing its frames into `pcap`.
pub(crate) fn open_stack(transport: &TransportArgs, pcap: Option<&Path>) -> Result<Option<SmolStack>, Fail> {
    let Some((dev, config)) = transport.check().map_err(Fail::Usage)? else {
        return Ok(None);
    };
    let stack = crate::transport::open_stack(&dev, config).map_err(Fail::Run)?;
    if let Some(path) = pcap {
        crate::transport::capture(&stack, path).map_err(Fail::Run)?;
    }
    Ok(Some(stack))
}

/// Flushes the frames a smoltcp stack recorded (`--pcap`).
pub(crate) fn flush_stack_capture(command: &str, stack: Option<&SmolStack>) {
    if let Some(stack) = stack
        && let Err(e) = stack.flush_capture()
    {
        eprintln!("{command}: cannot write the capture: {}", io_message(&e));
    }
}

/// A pcap file shared by this process's connections.
pub(crate) type Capture = std::sync::Arc<std::sync::Mutex<PcapWriter>>;

/// Opens the `--pcap` file for connections over the kernel's TCP; none over a smoltcp stack
/// (`stack`), which records the real frames itself.
pub(crate) fn open_capture(pcap: Option<&Path>, stack: Option<&SmolStack>) -> Result<Option<Capture>, Fail> {
    match pcap {
        Some(path) if stack.is_none() => PcapWriter::create(path)
            .map(|w| Some(w.shared()))
            .map_err(|e| Fail::Usage(format!("cannot create {}: {}", path.display(), io_message(&e)))),
        _ => Ok(None),
    }
}

/// Writes out what the capture holds.
pub(crate) fn flush_capture(command: &str, c: Option<&Capture>) {
    if let Some(c) = c {
        let mut w = c.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = w.flush() {
            eprintln!("{command}: cannot write the capture: {}", io_message(&e));
        }
    }
}

/// Waits for the next well-formed connection request (until `deadline`, if any); handshakes
/// that fail are reported and skipped.
pub(crate) fn accept_next(
    command: &str,
    listener: &Listener,
    deadline: Option<Instant>,
) -> Result<ConnectRequest, Fail> {
    loop {
        let slice = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Fail::Run("no connection arrived in time (--accept-timeout)".into()));
                }
                left.min(Duration::from_secs(1))
            }
            None => Duration::from_secs(1),
        };
        match listener.accept(slice) {
            Ok(req) => return Ok(req),
            Err(CmError::Timeout) => {}
            Err(e) => eprintln!("{command}: a connection attempt failed: {}", cm_message(&e)),
        }
    }
}

/// How long a wait that found the connection's event gives the completions of the same pass
/// to show: the engine publishes a pass's events just before its completions.
const COMPLETIONS_AFTER_EVENT: Duration = Duration::from_millis(10);

/// The next completion on `cq`, waiting at most `slice`, or the connection's event once no
/// completion comes before it: a peer that sends its last message and closes at once has both
/// arrive in one read, and the message is what the caller waits for. Looked at the other way
/// round, the close hid it (`iwarp perftest read` against a drop-in server failed "the peer
/// closed the connection" in a CI run, after the server had printed its results). An event
/// seen while a successful completion was still to come is kept in `held` and returned next
/// (before any failed completion: the event explains it). `Ok(None)`: nothing within `slice`.
pub(crate) fn completion_or_event(
    cq: &CompletionQueue,
    qp: &QueuePair,
    held: &mut Option<QpEvent>,
    slice: Duration,
) -> Result<Option<WorkCompletion>, QpEvent> {
    if let Some(wc) = cq.poll() {
        return match held.take() {
            Some(ev) if wc.status != WcStatus::Success => Err(ev),
            ev => {
                *held = ev;
                Ok(Some(wc))
            }
        };
    }
    match held.take().or_else(|| qp.poll_event()) {
        Some(ev) => match cq.wait(COMPLETIONS_AFTER_EVENT) {
            Some(wc) if wc.status == WcStatus::Success => {
                *held = Some(ev);
                Ok(Some(wc))
            }
            _ => Err(ev),
        },
        None => Ok(cq.wait(slice)),
    }
}

/// A queue pair's event as the commands print it; `waiting`: what the command was waiting
/// for when it came.
pub(crate) fn event_text(ev: QpEvent, waiting: Option<&str>) -> String {
    let during = waiting.map_or_else(String::new, |w| format!(" while waiting for {w}"));
    match ev {
        QpEvent::LlpLost => "the peer closed the connection".to_string(),
        QpEvent::RemoteTerminate { header, siw } => format!(
            "the peer sent a Terminate{during}: {} (read as siw lays it out: {})",
            header.cause, siw.cause
        ),
        QpEvent::LocalTerminate(code) => {
            format!("terminated the connection after a protocol error by the peer{during}: {code}")
        }
    }
}

/// The message of an I/O error without its "(os error N)" suffix: what the commands print.
pub(crate) fn io_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// A connection-manager error as the commands print it.
pub(crate) fn cm_message(e: &iwarp::CmError) -> String {
    match e {
        iwarp::CmError::Io(io) => io_message(io),
        e => e.to_string(),
    }
}

/// Opens `--device NAME`, or a usage error that names it and lists the devices there are.
pub(crate) fn open_device(name: &str) -> Result<Arc<dyn Backend>, Fail> {
    open_backend(name).map_err(|e| {
        let (list, why) = devices();
        let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
        let e = e.to_string();
        let mut m = format!("--device {name}: {e}; the devices here: {}", names.join(", "));
        if let Some(why) = why.filter(|w| !e.contains(w.as_str())) {
            m.push_str(&format!(" (no rdma-core devices: {why})"));
        }
        Fail::Usage(m)
    })
}

/// The first of `refused` (a flag given, and its name) as the usage error of a flag the
/// backend seam cannot carry.
pub(crate) fn refuse_with_device(refused: &[(bool, &str)]) -> Result<(), Fail> {
    match refused.iter().find(|(on, _)| *on) {
        Some((_, flag)) => Err(Fail::Usage(format!("{flag} is not available with --device"))),
        None => Ok(()),
    }
}

/// Disconnects a seam endpoint and drains what comes back flushed (briefly).
pub(crate) fn close_endpoint(ep: &dyn Endpoint) {
    ep.disconnect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match ep.poll(Duration::from_millis(50)) {
            Some(wc) if wc.status == Status::Flushed => break,
            Some(_) => {}
            None => break,
        }
    }
}
