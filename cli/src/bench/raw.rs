//! The raw-TCP baseline: a length-prefixed stream and a ping-pong over `std::net::TcpStream`
//! on 127.0.0.1 with TCP_NODELAY, a server thread and the calling thread as the client. The
//! stream also runs over a veth pair between two network namespaces (see `veth.rs`).

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::results::{BenchError, Budget, Latency, Samples, Throughput};
use super::veth::VethPath;

/// How long a socket may go without progress before the measurement fails.
const STALL: Duration = Duration::from_secs(10);
/// Buffering of the stream measurement, like the engine's transmit batch.
const STREAM_BUFFER: usize = 256 * 1024;

fn io_err(what: &str) -> impl Fn(io::Error) -> BenchError + '_ {
    move |e| BenchError(format!("raw TCP {what}: {e}"))
}

/// Binds a listener on 127.0.0.1 (or on the server's end of `veth`, in its namespace) and
/// accepts one connection on a new thread, which then runs `serve` on it.
fn server<T: Send + 'static>(
    veth: Option<&VethPath>,
    serve: impl FnOnce(TcpStream) -> Result<T, BenchError> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<Result<T, BenchError>>), BenchError> {
    servers(veth, 1, move |mut streams| match streams.pop() {
        Some(s) => serve(s),
        None => Err(BenchError("raw TCP: no connection accepted".into())),
    })
}

/// [`server`] for `n` connections: the thread accepts all of them, in the order they were
/// made, before it runs `serve`.
fn servers<T: Send + 'static>(
    veth: Option<&VethPath>,
    n: usize,
    serve: impl FnOnce(Vec<TcpStream>) -> Result<T, BenchError> + Send + 'static,
) -> Result<(SocketAddr, JoinHandle<Result<T, BenchError>>), BenchError> {
    let listener = match veth {
        None => TcpListener::bind("127.0.0.1:0"),
        Some(v) => v.server.run(|| TcpListener::bind((v.server_ip, 0)))?,
    }
    .map_err(io_err("listen"))?;
    let addr = listener.local_addr().map_err(io_err("listen"))?;
    listener.set_nonblocking(true).map_err(io_err("listen"))?;
    let handle = std::thread::Builder::new()
        .name("raw-tcp-server".into())
        .spawn(move || {
            super::pin::server_side();
            let deadline = Instant::now() + STALL;
            let mut streams = Vec::with_capacity(n);
            while streams.len() < n {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).map_err(io_err("accept"))?;
                        stream.set_nodelay(true).map_err(io_err("accept"))?;
                        streams.push(stream);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(io_err("accept")(e)),
                }
            }
            serve(streams)
        })
        .map_err(io_err("server thread"))?;
    Ok((addr, handle))
}

/// The 4-byte length that goes before each message of `size` bytes in a stream.
fn length_prefix(size: usize) -> Result<[u8; 4], BenchError> {
    u32::try_from(size)
        .map(u32::to_be_bytes)
        .map_err(|_| BenchError(format!("raw TCP: {size} bytes do not fit a 4-byte length")))
}

fn join<T>(handle: JoinHandle<Result<T, BenchError>>) -> Result<T, BenchError> {
    handle.join().map_err(|_| BenchError("raw TCP server thread panicked".into()))?
}

fn connect(addr: SocketAddr, veth: Option<&VethPath>) -> Result<TcpStream, BenchError> {
    let s = match veth {
        None => TcpStream::connect_timeout(&addr, STALL),
        Some(v) => v.client.run(|| TcpStream::connect_timeout(&addr, STALL))?,
    }
    .map_err(io_err("connect"))?;
    s.set_nodelay(true).map_err(io_err("connect"))?;
    Ok(s)
}

/// Stream bandwidth: the client writes 4-byte-length-prefixed messages of `size` bytes until
/// the budget is spent, the server reads and counts them until end of stream; over 127.0.0.1,
/// or over `veth`. The client's writes carry as many messages as fill a 256 KiB buffer, or
/// with `per_write`, that many messages each (one system call per list of that length).
pub(super) fn stream(
    size: usize,
    budget: &Budget,
    veth: Option<&VethPath>,
    per_write: Option<usize>,
) -> Result<Throughput, BenchError> {
    let prefix = length_prefix(size)?;
    let (addr, handle) = server(veth, move |s| {
        s.set_read_timeout(Some(STALL)).map_err(io_err("read"))?;
        let mut r = BufReader::with_capacity(STREAM_BUFFER, s);
        let mut buf = vec![0u8; size];
        let (mut msgs, mut bytes) = (0u64, 0u64);
        loop {
            let mut len = [0u8; 4];
            match r.read_exact(&mut len) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok((msgs, bytes)),
                Err(e) => return Err(io_err("read")(e)),
            }
            let len = usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
            if len != size {
                return Err(BenchError(format!("raw TCP: message of {len} bytes, expected {size}")));
            }
            r.read_exact(&mut buf).map_err(io_err("read"))?;
            msgs += 1;
            bytes += size as u64;
        }
    })?;
    let s = connect(addr, veth)?;
    s.set_write_timeout(Some(STALL)).map_err(io_err("write"))?;
    let payload = vec![0x5au8; size];
    let start = Instant::now();
    let mut sent = 0u64;
    if let Some(n) = per_write {
        // The messages of one list, framed once; written whole, one call per list.
        let n = n.max(1);
        let list: Vec<u8> = (0..n).flat_map(|_| prefix.iter().chain(&payload).copied()).collect();
        let mut w = &s;
        loop {
            w.write_all(&list).map_err(io_err("write"))?;
            sent += n as u64;
            if budget.spent(sent, start) {
                break;
            }
        }
    } else {
        let mut w = BufWriter::with_capacity(STREAM_BUFFER, &s);
        loop {
            w.write_all(&prefix).and_then(|()| w.write_all(&payload)).map_err(io_err("write"))?;
            sent += 1;
            if (sent.is_multiple_of(32) || size >= 4096 || budget.iters.is_some())
                && budget.spent(sent, start)
            {
                break;
            }
        }
        w.flush().map_err(io_err("write"))?;
    }
    finish_stream(std::slice::from_ref(&s), handle, start, sent)
}

/// Ends a stream measurement: the client's connections end (for writing), and the server's
/// count of messages and bytes must be what was sent.
fn finish_stream(
    clients: &[TcpStream],
    handle: JoinHandle<Result<(u64, u64), BenchError>>,
    start: Instant,
    sent: u64,
) -> Result<Throughput, BenchError> {
    for s in clients {
        s.shutdown(Shutdown::Write).map_err(io_err("shutdown"))?;
    }
    let (msgs, bytes) = join(handle)?;
    let secs = start.elapsed().as_secs_f64();
    if msgs != sent {
        return Err(BenchError(format!("raw TCP: sent {sent} messages, the server counted {msgs}")));
    }
    Ok(Throughput { msgs, bytes, secs })
}

/// The most bytes [`streams`] writes to one connection per turn (fewer messages per write
/// for large ones).
const TURN_BYTES: usize = 4 << 20;

/// Stream bandwidth over `conns` connections at once, as `iwarp bench --qps N` spreads its
/// messages over N queue pairs: the client writes `per_turn` 4-byte-length-prefixed messages
/// of `size` bytes to each connection in turn, one system call per connection per turn (fewer
/// messages when a turn's would pass 4 MiB), until the budget is spent at the end of a turn;
/// the server reads each connection's turn in the same order, and counts the messages until
/// end of stream. Over 127.0.0.1.
pub(super) fn streams(
    size: usize,
    budget: &Budget,
    conns: usize,
    per_turn: usize,
) -> Result<Throughput, BenchError> {
    let prefix = length_prefix(size)?;
    let conns = conns.max(1);
    let per_turn = per_turn.clamp(1, (TURN_BYTES / (size + 4)).max(1));
    let turn_len = per_turn * (size + 4);
    let (addr, handle) = servers(None, conns, move |mut streams| {
        let mut turn = vec![0u8; turn_len];
        let (mut msgs, mut bytes) = (0u64, 0u64);
        for s in &streams {
            s.set_read_timeout(Some(STALL)).map_err(io_err("read"))?;
        }
        loop {
            for (i, s) in streams.iter_mut().enumerate() {
                // The client ends after a whole turn: the end of stream comes on the first
                // connection, where a turn begins.
                if !read_exact(s, &mut turn, false).map_err(io_err("read"))? {
                    return if i == 0 {
                        Ok((msgs, bytes))
                    } else {
                        Err(BenchError(format!("raw TCP: connection {i} of {conns} ended mid-turn")))
                    };
                }
                for m in turn.chunks_exact(size + 4) {
                    let len =
                        usize::try_from(u32::from_be_bytes([m[0], m[1], m[2], m[3]])).unwrap_or(usize::MAX);
                    if len != size {
                        return Err(BenchError(format!("raw TCP: message of {len} bytes, expected {size}")));
                    }
                }
                msgs += per_turn as u64;
                bytes += (per_turn * size) as u64;
            }
        }
    })?;
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        let s = connect(addr, None)?;
        s.set_write_timeout(Some(STALL)).map_err(io_err("write"))?;
        clients.push(s);
    }
    let payload = vec![0x5au8; size];
    let turn: Vec<u8> = (0..per_turn).flat_map(|_| prefix.iter().chain(&payload).copied()).collect();
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        for s in &mut clients {
            write_all(s, &turn, false).map_err(io_err("write"))?;
            sent += per_turn as u64;
        }
        if budget.spent(sent, start) {
            break;
        }
    }
    finish_stream(&clients, handle, start, sent)
}

/// Reads exactly `buf.len()` bytes, spinning on a nonblocking socket when `busy`.
fn read_exact(s: &mut TcpStream, mut buf: &mut [u8], busy: bool) -> io::Result<bool> {
    let first = buf.is_empty();
    let deadline = Instant::now() + STALL;
    let mut got_any = first;
    while !buf.is_empty() {
        match s.read(buf) {
            Ok(0) if !got_any => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                got_any = true;
                buf = &mut buf[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if busy && e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf`, spinning on a nonblocking socket when `busy`.
fn write_all(s: &mut TcpStream, mut buf: &[u8], busy: bool) -> io::Result<()> {
    let deadline = Instant::now() + STALL;
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if busy && e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                std::hint::spin_loop();
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn prepare(s: &TcpStream, busy: bool) -> io::Result<()> {
    if busy {
        s.set_nonblocking(true)
    } else {
        s.set_read_timeout(Some(STALL))?;
        s.set_write_timeout(Some(STALL))
    }
}

/// A raw-TCP echo connection, for ping-pongs: the client sends `size` bytes, a server thread
/// echoes them. With `busy`, both ends spin on nonblocking sockets; otherwise both block.
pub(super) struct Echo {
    s: TcpStream,
    out: Vec<u8>,
    back: Vec<u8>,
    busy: bool,
    server: JoinHandle<Result<(), BenchError>>,
}

impl Echo {
    pub(super) fn open(size: usize, busy: bool) -> Result<Echo, BenchError> {
        let (addr, server) = server(None, move |mut s| {
            prepare(&s, busy).map_err(io_err("ping-pong setup"))?;
            let mut buf = vec![0u8; size];
            while read_exact(&mut s, &mut buf, busy).map_err(io_err("echo read"))? {
                write_all(&mut s, &buf, busy).map_err(io_err("echo write"))?;
            }
            Ok(())
        })?;
        let s = connect(addr, None)?;
        prepare(&s, busy).map_err(io_err("ping-pong setup"))?;
        Ok(Echo { s, out: vec![0xa5u8; size], back: vec![0u8; size], busy, server })
    }

    /// One round trip, timed.
    pub(super) fn round_trip(&mut self) -> Result<Duration, BenchError> {
        let t0 = Instant::now();
        write_all(&mut self.s, &self.out, self.busy).map_err(io_err("ping write"))?;
        if !read_exact(&mut self.s, &mut self.back, self.busy).map_err(io_err("pong read"))? {
            return Err(BenchError("raw TCP: the echo server closed the connection".into()));
        }
        Ok(t0.elapsed())
    }

    /// Ends the connection and the server thread.
    pub(super) fn close(self) -> Result<(), BenchError> {
        self.s.shutdown(Shutdown::Write).map_err(io_err("shutdown"))?;
        join(self.server)
    }
}

/// Ping-pong over an [`Echo`]: one sample per round trip, each after a pause of `gap`.
pub(super) fn ping_pong(
    size: usize,
    budget: &Budget,
    busy: bool,
    gap: Duration,
) -> Result<Latency, BenchError> {
    let mut echo = Echo::open(size, busy)?;
    let mut samples = Samples::new();
    let start = Instant::now();
    loop {
        if !gap.is_zero() {
            std::thread::sleep(gap);
        }
        samples.push(echo.round_trip()?);
        if budget.spent(samples.len() as u64, start) {
            break;
        }
    }
    echo.close()?;
    Ok(Latency::from_samples(samples))
}
