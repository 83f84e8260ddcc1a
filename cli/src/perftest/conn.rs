//! What both connections use: their options, random payloads, failed completions as text,
//! and closing.

use super::args::*;
use crate::toolbox::{self, Capture};
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use iwarp::mpa::{CrcPolicy, Policy};
use iwarp::{
    Access, CmError, CompletionQueue, ConnectOptions, Device, ProtectionDomain, QpState, QueuePair, WcStatus,
    WorkCompletion,
};

/// A random 64-bit value (std's per-process hash keys, mixed with the time).
pub(super) fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Random payload bytes (xorshift), as perftest fills its buffers.
pub(super) fn random_bytes(len: usize) -> Vec<u8> {
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

/// How long the client lets the server set up its data listener after the "pre" handshake
/// before it connects, and between connects the server refused. siw's listener takes a
/// connection only once its endpoint is marked listening, after the socket's `listen()` has
/// returned; a connection that completes in between is not taken, its MPA Request goes
/// unanswered and the server's perftest waits for it for good (docs/siw-quirks.md, "A new
/// listener takes connections a little after listen()"). perftest's own client takes a few
/// milliseconds to resolve the address before it connects; this leaves the server more.
pub(super) const DATA_LISTENER_PAUSE: Duration = Duration::from_millis(50);

/// The data buffer's rights: local write, remote read and remote write (iWARP Read sinks
/// need remote write, as perftest grants on iWARP).
pub(super) const DATA_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

use iwarp::netdev::SmolStack;

/// Connects over the kernel's TCP or the smoltcp stack.
pub(super) fn connect_any(
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

/// Options of either connection: `ird_ord` for the IRD/ORD word (0/0 except the read test's
/// data connection), one pre-posted receive on the control connection.
pub(super) fn conn_options(args: &Args, ird_ord: u16, capture: Option<&Capture>) -> ConnectOptions {
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

/// A failed completion as text, preferring the queue pair's event (the likelier cause).
pub(super) fn wc_failure(qp: &QueuePair, wc: &WorkCompletion, what: &str) -> String {
    if let Some(ev) = qp.wait_event(Duration::from_millis(200)) {
        return toolbox::event_text(ev, Some(what));
    }
    if wc.status == WcStatus::WrFlushError {
        return format!("the connection closed while waiting for {what}");
    }
    format!("{:?} completion failed with {:?} while waiting for {what}", wc.opcode, wc.status)
}

/// Waits (at most `limit`) until the peer has closed `qp` or it left RTS.
pub(super) fn wait_closed(qp: &QueuePair, limit: Duration) {
    let deadline = Instant::now() + limit;
    while qp.state() == QpState::Rts && Instant::now() < deadline {
        if qp.poll_event().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Closes `qp` and waits (briefly) until its stream is shut.
pub(super) fn close(qp: &QueuePair) {
    qp.disconnect();
    let deadline = Instant::now() + Duration::from_secs(2);
    while qp.state() != QpState::Error && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}
