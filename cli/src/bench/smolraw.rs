//! The smoltcp raw-TCP baseline: a plain `SmolLink` byte stream and an echo ping-pong between
//! two smoltcp stacks (the two ends of a veth pair), one thread per end, busy-polling.

use std::time::{Duration, Instant};

use iwarp::netdev::{Link, LinkError, SmolLink, SmolStack};

use super::results::{BenchError, Budget, FrameCost, Latency, Samples, Throughput};

/// The longest a transfer may stall before the measurement fails.
const STALL: Duration = Duration::from_secs(10);
/// The port of the next raw connection on the server stack (each measurement takes a new
/// one: the previous connection's socket may still hold its port while it closes).
static PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(7300);

fn link_err(what: &'static str) -> impl Fn(LinkError) -> BenchError {
    move |e| BenchError(format!("smoltcp raw TCP {what}: {e}"))
}

/// Connects a link from `client` to a listener on `server`.
fn pair(client: &SmolStack, server: &SmolStack) -> Result<(SmolLink, SmolLink), BenchError> {
    let io = |what: &'static str| move |e: std::io::Error| BenchError(format!("smoltcp raw TCP {what}: {e}"));
    let port = PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut listener = server.listen(port).map_err(io("listen"))?;
    let remote = listener.local_addr();
    let link = client.connect(remote).map_err(io("connect"))?;
    let deadline = Instant::now() + STALL;
    loop {
        client.poll_now();
        server.poll_now();
        if let Some(accepted) = listener.accept().map_err(io("accept"))? {
            link.wait_established(STALL).map_err(io("connect"))?;
            return Ok((link, accepted));
        }
        if Instant::now() > deadline {
            return Err(BenchError("smoltcp raw TCP: no connection within 10 s".into()));
        }
    }
}

/// Writes all of `buf`, busy-polling.
fn write_all(link: &mut SmolLink, mut buf: &[u8]) -> Result<(), BenchError> {
    let mut idle = Instant::now();
    while !buf.is_empty() {
        let n = link.send(buf).map_err(link_err("write"))?;
        if n == 0 {
            link.stack().poll_now();
            if idle.elapsed() > STALL {
                return Err(BenchError("smoltcp raw TCP: the write stalled".into()));
            }
        } else {
            idle = Instant::now();
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// Fills `buf`, busy-polling; false at end of stream before any byte.
fn read_exact(link: &mut SmolLink, buf: &mut [u8]) -> Result<bool, BenchError> {
    let mut got = 0;
    let mut idle = Instant::now();
    while got < buf.len() {
        match link.recv(&mut buf[got..]) {
            Ok(0) => {
                link.stack().poll_now();
                if idle.elapsed() > STALL {
                    return Err(BenchError("smoltcp raw TCP: the read stalled".into()));
                }
            }
            Ok(n) => {
                got += n;
                idle = Instant::now();
            }
            Err(LinkError::Closed) if got == 0 => return Ok(false),
            Err(e) => return Err(link_err("read")(e)),
        }
    }
    Ok(true)
}

/// The process's CPU time so far (every thread), in seconds.
pub(super) fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Frames through both devices so far, sent and received.
fn frames_sent(client: &SmolStack, server: &SmolStack) -> u64 {
    let (c, s) = (client.device_stats(), server.device_stats());
    c.tx_frames + c.rx_frames + s.tx_frames + s.rx_frames
}

/// Stream bandwidth: the client writes `size`-byte messages until the budget is spent, the
/// server (its own thread) reads until end of stream. Also what the frames cost: how many
/// went through the two devices (sent and received) and the process's CPU time meanwhile.
pub(super) fn stream(
    client: &SmolStack,
    server: &SmolStack,
    size: usize,
    budget: &Budget,
) -> Result<(Throughput, FrameCost), BenchError> {
    let (mut tx, mut rx) = pair(client, server)?;
    let (frames_before, cpu_before) = (frames_sent(client, server), cpu_seconds());
    let reader = std::thread::Builder::new()
        .name("bench-smol-rx".into())
        .spawn(move || -> Result<u64, BenchError> {
            let mut buf = vec![0u8; 256 * 1024];
            let mut bytes = 0u64;
            let mut idle = Instant::now();
            loop {
                match rx.recv(&mut buf) {
                    Ok(0) => {
                        rx.stack().poll_now();
                        if idle.elapsed() > STALL {
                            return Err(BenchError("smoltcp raw TCP: the reader stalled".into()));
                        }
                    }
                    Ok(n) => {
                        bytes += n as u64;
                        idle = Instant::now();
                    }
                    Err(LinkError::Closed) => return Ok(bytes),
                    Err(e) => return Err(link_err("read")(e)),
                }
            }
        })
        .map_err(|e| BenchError(format!("cannot start a thread: {e}")))?;
    let payload = vec![0x5au8; size];
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        write_all(&mut tx, &payload)?;
        sent += 1;
        if budget.spent(sent, start) {
            break;
        }
    }
    tx.shutdown_write();
    // Keep the sender's stack going until the reader has everything.
    while !reader.is_finished() {
        client.poll_now();
        if start.elapsed() > STALL * 6 {
            break;
        }
    }
    let bytes = reader.join().map_err(|_| BenchError("the reader panicked".into()))??;
    let secs = start.elapsed().as_secs_f64();
    let cost = FrameCost {
        frames: frames_sent(client, server) - frames_before,
        cpu_secs: cpu_seconds() - cpu_before,
        secs,
    };
    if bytes != sent * size as u64 {
        return Err(BenchError(format!(
            "smoltcp raw TCP: sent {} bytes, received {bytes}",
            sent * size as u64
        )));
    }
    Ok((Throughput { msgs: sent, bytes, secs }, cost))
}

/// Echo ping-pong of `size` bytes: round-trip times.
pub(super) fn ping_pong(
    client: &SmolStack,
    server: &SmolStack,
    size: usize,
    budget: &Budget,
) -> Result<Latency, BenchError> {
    let (mut c, mut s) = pair(client, server)?;
    let echo = std::thread::Builder::new()
        .name("bench-smol-echo".into())
        .spawn(move || -> Result<(), BenchError> {
            let mut buf = vec![0u8; size];
            while read_exact(&mut s, &mut buf)? {
                write_all(&mut s, &buf)?;
            }
            Ok(())
        })
        .map_err(|e| BenchError(format!("cannot start a thread: {e}")))?;
    let msg = vec![0xa5u8; size];
    let mut back = vec![0u8; size];
    let mut samples = Samples::new();
    let start = Instant::now();
    loop {
        let t = Instant::now();
        write_all(&mut c, &msg)?;
        if !read_exact(&mut c, &mut back)? {
            return Err(BenchError("smoltcp raw TCP: the echo side closed".into()));
        }
        samples.push(t.elapsed());
        if budget.spent(samples.len() as u64, start) {
            break;
        }
    }
    c.shutdown_write();
    while !echo.is_finished() {
        client.poll_now();
        if start.elapsed() > STALL * 6 {
            break;
        }
    }
    echo.join().map_err(|_| BenchError("the echo thread panicked".into()))??;
    Ok(Latency::from_samples(samples))
}
