//! `iwarp bench --device NAME`: Write, Read and Send bandwidth on a device driven through the
//! backend seam (an rdma-core device such as siw0 or rxe0 with the `verbs` feature), beside
//! the userspace engine measured the same way in the same run, and the ratios device /
//! engine. Both ends run in this process, connected over `--device-addr`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use iwarp::Access;
use iwarp::backend::{Backend, Endpoint, EndpointOptions, Op as WrOp, Status, open_backend};

use super::Op;

/// How long one completion may take before the measurement is called failed.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

/// One measurement's result: bytes per second and messages per second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) bytes_per_s: f64,
    pub(crate) msgs_per_s: f64,
}

/// Opens the device, or says why not.
pub(crate) fn open(name: &str) -> Result<Arc<dyn Backend>, String> {
    open_backend(name).map_err(|e| e.to_string())
}

/// Reads outstanding each way on both ends of a measurement.
const READS_OUTSTANDING: u8 = 16;

/// Measures `op` at `size` with `window` work requests outstanding for `duration`.
pub(crate) fn measure(
    backend: &Arc<dyn Backend>,
    ip: IpAddr,
    op: Op,
    size: usize,
    window: u16,
    duration: Duration,
) -> Result<Rate, String> {
    let len = u32::try_from(size).map_err(|_| format!("{size} B is more than one work request takes"))?;
    let depth = u32::from(window).max(1) + 1;
    // 16 Reads outstanding each way, the engine's default, on every device (a verbs device
    // allowing fewer gets its maximum): a device is not held to one Read at a time.
    let opts = EndpointOptions {
        queue_depth: depth,
        rd_atomic: Some(READS_OUTSTANDING),
        ..EndpointOptions::default()
    };
    let listener = backend.listen(SocketAddr::new(ip, 0)).map_err(|e| format!("listen: {e}"))?;
    let addr = listener.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Receives the server has taken and posted again: the client's credit for Sends (iWARP
    // has no receiver-not-ready retry; a Send without a receive buffer ends the connection).
    let reposted = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<Result<(u32, u64), String>>();
    let server = {
        let (stop, opts, reposted) = (stop.clone(), opts.clone(), reposted.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let ep = listener
                .next_request(COMPLETION_TIMEOUT)
                .and_then(|r| r.accept(&opts))
                .map_err(|e| format!("accept: {e}"));
            let ep = match ep {
                Ok(ep) => ep,
                Err(e) => {
                    let _ = tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            let access = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
            let region = ep.register(size, access).map_err(|e| e.to_string())?;
            let slots = u32::from(window).max(1);
            if op == Op::Send {
                for i in 0..slots {
                    ep.post_recv(u64::from(i), region.local(0, len)).map_err(|e| e.to_string())?;
                }
            }
            let _ = tx.send(Ok((region.rkey(), region.addr())));
            while !stop.load(Ordering::Relaxed) {
                if let Some(wc) = ep.poll(Duration::from_millis(20)) {
                    // The client's end closes when it is done: its receives come back flushed.
                    if wc.status == Status::Flushed {
                        break;
                    }
                    if wc.status != Status::Success {
                        return Err(format!("server completion {wc:?}"));
                    }
                    ep.post_recv(wc.wr_id, region.local(0, len)).map_err(|e| e.to_string())?;
                    reposted.fetch_add(1, Ordering::Release);
                }
            }
            Ok(())
        })
    };
    let result = (|| {
        let client = backend.connect(addr, &opts).map_err(|e| format!("connect: {e}"))?;
        let (rkey, raddr) =
            rx.recv_timeout(COMPLETION_TIMEOUT).map_err(|_| "the server did not answer".to_owned())??;
        let credit = (op == Op::Send).then_some(&*reposted);
        run_client(&*client, op, len, window, duration, (rkey, raddr), credit)
    })();
    stop.store(true, Ordering::Relaxed);
    let served = server.join().map_err(|_| "server thread panicked".to_owned())?;
    let rate = result?;
    served?;
    Ok(rate)
}

fn run_client(
    ep: &dyn Endpoint,
    op: Op,
    size: u32,
    window: u16,
    duration: Duration,
    (rkey, raddr): (u32, u64),
    credit: Option<&AtomicU64>,
) -> Result<Rate, String> {
    let local = ep.register(size as usize, Access::NONE).map_err(|e| e.to_string())?;
    let wr = match op {
        Op::Write => WrOp::Write { rkey, addr: raddr },
        Op::Read => WrOp::Read { rkey, addr: raddr },
        Op::Send => WrOp::Send,
    };
    let window = u64::from(window).max(1);
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    loop {
        let running = start.elapsed() < duration;
        while running
            && posted - done < window
            && credit.is_none_or(|c| posted < window + c.load(Ordering::Acquire))
        {
            ep.post_send(posted, wr, Some(local.local(0, size))).map_err(|e| e.to_string())?;
            posted += 1;
        }
        if done < posted {
            let wc =
                ep.poll(COMPLETION_TIMEOUT).ok_or_else(|| format!("no completion after {done} messages"))?;
            if wc.status != Status::Success {
                return Err(format!("completion {wc:?}"));
            }
            done += 1;
        } else if running {
            std::thread::yield_now();
        } else {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Rate { bytes_per_s: (done as f64) * f64::from(size) / secs, msgs_per_s: done as f64 / secs })
}
