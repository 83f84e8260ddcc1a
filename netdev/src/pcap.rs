//! pcap capture of what crosses a link, with Ethernet/IPv4/TCP framing synthesized.
//!
//! A link is a byte stream, so the capture invents the packets a TCP stack would have sent: a
//! SYN / SYN-ACK / ACK handshake when capture starts, one data segment per [`TCP_MSS`] bytes
//! with consistent sequence and acknowledgment numbers per direction, a FIN per direction at
//! close and an RST on reset. Checksums are valid (etherparse computes them), so Wireshark and
//! tshark decode the MPA/DDP/RDMAP traffic inside without complaint.

use std::collections::HashSet;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, IoSlice, IoSliceMut, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::{Link, LinkError};

/// Payload bytes per synthesized data segment (Ethernet MTU 1500 minus IPv4, TCP and the TCP
/// timestamp option, as on a typical Linux connection).
pub const TCP_MSS: usize = 1448;

/// Advertised receive window of every synthesized segment.
const WINDOW: u16 = 65535;
/// Initial sequence numbers of the synthesized handshake (arbitrary, distinct per side).
const ISN_LOCAL: u32 = 0x1000_0000;
const ISN_REMOTE: u32 = 0x2000_0000;
/// MAC addresses of the synthesized frames (locally administered).
const MAC_LOCAL: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const MAC_REMOTE: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// Synthesized addresses for links without real IPv4 ones.
const SYNTH_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const SYNTH_REMOTE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const SYNTH_LOCAL_PORT_BASE: u16 = 49152;
const SYNTH_REMOTE_PORT: u16 = 7174;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Capture state stays usable after a panic elsewhere: at worst one frame is half written.
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Wall-clock time as a pcap timestamp (time since the Unix epoch).
pub(crate) fn now() -> Duration {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// `n` as a TCP sequence-space length; segments are at most [`TCP_MSS`] bytes, so it fits.
fn seq_len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Which way a segment travels, seen from the link that is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent by the captured link (its local end plays the TCP client).
    Outbound,
    /// Received by the captured link.
    Inbound,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Outbound => 0,
            Direction::Inbound => 1,
        }
    }
}

/// The synthesized TCP connection of one captured link: addresses and, per direction, the next
/// sequence number and whether FIN was written.
#[derive(Debug, Clone)]
pub struct PcapFlow {
    local: SocketAddrV4,
    remote: SocketAddrV4,
    /// Next sequence number, indexed by [`Direction::index`].
    next_seq: [u32; 2],
    fin: [bool; 2],
    reset: bool,
}

impl PcapFlow {
    /// The address the captured link's packets come from.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// The address the captured link's packets go to.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }
}

/// A `Write` handle the pcap-file writer owns while we keep another, so we can flush.
#[derive(Clone)]
struct SharedSink(Arc<Mutex<Box<dyn Write + Send>>>);

impl Write for SharedSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.0).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        lock(&self.0).flush()
    }
}

/// Writes a pcap file (Ethernet link type, nanosecond timestamps) of synthesized TCP flows.
///
/// Several links can share one writer through `Arc<Mutex<PcapWriter>>`
/// (see [`CapturingLink`]); each gets its own flow.
pub struct PcapWriter {
    pcap: pcap_file::pcap::PcapWriter<SharedSink>,
    sink: SharedSink,
    flows: u16,
    /// Address pairs (lower first) of the flows opened with real addresses.
    real_pairs: HashSet<(SocketAddrV4, SocketAddrV4)>,
    frame: Vec<u8>,
}

impl fmt::Debug for PcapWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapWriter").field("flows", &self.flows).finish_non_exhaustive()
    }
}

fn pcap_err(err: pcap_file::PcapError) -> io::Error {
    match err {
        pcap_file::PcapError::IoError(err) => err,
        other => io::Error::other(other),
    }
}

impl PcapWriter {
    /// Writes the pcap file header to `out` and returns the writer.
    pub fn new<W: Write + Send + 'static>(out: W) -> io::Result<PcapWriter> {
        let sink = SharedSink(Arc::new(Mutex::new(Box::new(out))));
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        let pcap = pcap_file::pcap::PcapWriter::with_header(sink.clone(), header).map_err(pcap_err)?;
        Ok(PcapWriter { pcap, sink, flows: 0, real_pairs: HashSet::new(), frame: Vec::with_capacity(1600) })
    }

    /// Creates (or truncates) the file at `path`, buffered.
    pub fn create(path: impl AsRef<Path>) -> io::Result<PcapWriter> {
        PcapWriter::new(BufWriter::new(File::create(path)?))
    }

    /// Wraps the writer for sharing between [`CapturingLink`]s.
    pub fn shared(self) -> Arc<Mutex<PcapWriter>> {
        Arc::new(Mutex::new(self))
    }

    /// Flushes buffered frames to the output.
    pub fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }

    /// Starts a flow between `local` and `remote` and writes its handshake (local end as the
    /// client). Real addresses are used when both are IPv4 and no earlier flow of this writer
    /// had the same pair; otherwise the flow gets 10.0.0.1 / 10.0.0.2 with a client port
    /// unique within this writer.
    pub fn open_flow(
        &mut self,
        local: Option<SocketAddr>,
        remote: Option<SocketAddr>,
        at: Duration,
    ) -> io::Result<PcapFlow> {
        let n = self.flows;
        self.flows = self.flows.wrapping_add(1);
        let (local, remote) = match (local, remote) {
            // Both ends of one loopback connection captured into the same file would make two
            // flows with one address pair: the second gets synthesized addresses instead.
            (Some(SocketAddr::V4(l)), Some(SocketAddr::V4(r)))
                if self.real_pairs.insert((l.min(r), l.max(r))) =>
            {
                (l, r)
            }
            _ => (
                SocketAddrV4::new(SYNTH_LOCAL_IP, SYNTH_LOCAL_PORT_BASE + n % 16384),
                SocketAddrV4::new(SYNTH_REMOTE_IP, SYNTH_REMOTE_PORT),
            ),
        };
        let mut flow =
            PcapFlow { local, remote, next_seq: [ISN_LOCAL, ISN_REMOTE], fin: [false; 2], reset: false };
        self.segment(&flow, Direction::Outbound, Flags::SYN, &[], at)?;
        flow.next_seq[1] = ISN_REMOTE;
        flow.next_seq[0] = ISN_LOCAL.wrapping_add(1);
        self.segment(&flow, Direction::Inbound, Flags::SYN_ACK, &[], at)?;
        flow.next_seq[1] = ISN_REMOTE.wrapping_add(1);
        self.segment(&flow, Direction::Outbound, Flags::ACK, &[], at)?;
        Ok(flow)
    }

    /// Writes `data` sent in direction `dir` as data segments of at most [`TCP_MSS`] bytes.
    /// Nothing is written after the flow was reset or that direction's FIN.
    pub fn write_data(
        &mut self,
        flow: &mut PcapFlow,
        dir: Direction,
        data: &[u8],
        at: Duration,
    ) -> io::Result<()> {
        if flow.reset || flow.fin[dir.index()] {
            return Ok(());
        }
        for chunk in data.chunks(TCP_MSS) {
            self.segment(flow, dir, Flags::PSH_ACK, chunk, at)?;
            let seq = &mut flow.next_seq[dir.index()];
            *seq = seq.wrapping_add(seq_len(chunk.len()));
        }
        Ok(())
    }

    /// Writes the FIN of direction `dir` (once).
    pub fn write_fin(&mut self, flow: &mut PcapFlow, dir: Direction, at: Duration) -> io::Result<()> {
        if flow.reset || flow.fin[dir.index()] {
            return Ok(());
        }
        self.segment(flow, dir, Flags::FIN_ACK, &[], at)?;
        flow.fin[dir.index()] = true;
        let seq = &mut flow.next_seq[dir.index()];
        *seq = seq.wrapping_add(1);
        Ok(())
    }

    /// Writes an RST sent in direction `dir` (once per flow); nothing follows it.
    pub fn write_rst(&mut self, flow: &mut PcapFlow, dir: Direction, at: Duration) -> io::Result<()> {
        if flow.reset {
            return Ok(());
        }
        self.segment(flow, dir, Flags::RST_ACK, &[], at)?;
        flow.reset = true;
        Ok(())
    }

    fn segment(
        &mut self,
        flow: &PcapFlow,
        dir: Direction,
        flags: Flags,
        payload: &[u8],
        at: Duration,
    ) -> io::Result<()> {
        let (src, dst, src_mac, dst_mac) = match dir {
            Direction::Outbound => (flow.local, flow.remote, MAC_LOCAL, MAC_REMOTE),
            Direction::Inbound => (flow.remote, flow.local, MAC_REMOTE, MAC_LOCAL),
        };
        let seq = flow.next_seq[dir.index()];
        let ack = flow.next_seq[1 - dir.index()];
        let mut builder = PacketBuilder::ethernet2(src_mac, dst_mac)
            .ipv4(src.ip().octets(), dst.ip().octets(), 64)
            .tcp(src.port(), dst.port(), seq, WINDOW);
        if flags.syn {
            builder = builder.syn();
        }
        if flags.ack {
            builder = builder.ack(ack);
        }
        if flags.psh {
            builder = builder.psh();
        }
        if flags.fin {
            builder = builder.fin();
        }
        if flags.rst {
            builder = builder.rst();
        }
        self.frame.clear();
        builder.write(&mut self.frame, payload).map_err(io::Error::other)?;
        let len = u32::try_from(self.frame.len()).map_err(io::Error::other)?;
        self.pcap.write_packet(&PcapPacket::new(at, len, &self.frame)).map_err(pcap_err)?;
        Ok(())
    }
}

/// TCP flags of a synthesized segment.
#[derive(Debug, Clone, Copy)]
struct Flags {
    syn: bool,
    ack: bool,
    psh: bool,
    fin: bool,
    rst: bool,
}

impl Flags {
    const NONE: Flags = Flags { syn: false, ack: false, psh: false, fin: false, rst: false };
    const SYN: Flags = Flags { syn: true, ..Flags::NONE };
    const SYN_ACK: Flags = Flags { syn: true, ack: true, ..Flags::NONE };
    const ACK: Flags = Flags { ack: true, ..Flags::NONE };
    const PSH_ACK: Flags = Flags { psh: true, ack: true, ..Flags::NONE };
    const FIN_ACK: Flags = Flags { fin: true, ack: true, ..Flags::NONE };
    const RST_ACK: Flags = Flags { rst: true, ack: true, ..Flags::NONE };
}

/// A link that records everything it sends and receives into a shared [`PcapWriter`].
///
/// Capture failures never disturb the link: the first one stops the capture of this link and
/// is kept for [`CapturingLink::capture_error`].
#[derive(Debug)]
pub struct CapturingLink<L: Link> {
    inner: L,
    writer: Arc<Mutex<PcapWriter>>,
    flow: PcapFlow,
    error: Option<io::Error>,
    scratch: Vec<u8>,
}

impl<L: Link> CapturingLink<L> {
    /// Starts capturing `inner` into `writer` (writes the synthesized handshake).
    pub fn new(inner: L, writer: Arc<Mutex<PcapWriter>>) -> io::Result<CapturingLink<L>> {
        let flow = lock(&writer).open_flow(inner.local_addr(), inner.peer_addr(), now())?;
        Ok(CapturingLink { inner, writer, flow, error: None, scratch: Vec::new() })
    }

    /// The wrapped link.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// The wrapped link, mutably (bytes moved through it directly are not captured).
    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The synthesized flow this link is recorded as.
    pub fn flow(&self) -> &PcapFlow {
        &self.flow
    }

    /// The first capture error, after which this link is no longer recorded.
    pub fn capture_error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }

    /// Records bytes that crossed the connection before the link was wrapped (a connection
    /// handshake done on the bare socket), so that the capture holds the whole stream.
    pub fn record_earlier(&mut self, dir: Direction, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.record(|w, flow| w.write_data(flow, dir, bytes, now()));
        }
    }

    fn record(&mut self, f: impl FnOnce(&mut PcapWriter, &mut PcapFlow) -> io::Result<()>) {
        if self.error.is_some() {
            return;
        }
        if let Err(err) = f(&mut lock(&self.writer), &mut self.flow) {
            self.error = Some(err);
        }
    }
}

impl<L: Link> CapturingLink<L> {
    /// Records what a receive brought: `data`, the bytes read, or the end of the stream.
    fn record_recv(&mut self, result: &Result<usize, LinkError>, data: &[u8]) {
        match result {
            Ok(0) => {}
            Ok(_) => self.record(|w, flow| w.write_data(flow, Direction::Inbound, data, now())),
            Err(LinkError::Closed) => self.record(|w, flow| w.write_fin(flow, Direction::Inbound, now())),
            Err(LinkError::Reset) => self.record(|w, flow| w.write_rst(flow, Direction::Inbound, now())),
            Err(_) => {}
        }
    }
}

impl<L: Link> Link for CapturingLink<L> {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        let result = self.inner.recv(buf);
        let n = *result.as_ref().unwrap_or(&0);
        self.record_recv(&result, &buf[..n]);
        result
    }

    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, LinkError> {
        let result = self.inner.recv_vectored(bufs);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let mut left = *result.as_ref().unwrap_or(&0);
        for b in bufs.iter() {
            let k = left.min(b.len());
            scratch.extend_from_slice(&b[..k]);
            left -= k;
        }
        self.record_recv(&result, &scratch);
        self.scratch = scratch;
        result
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError> {
        let result = self.inner.send_vectored(bufs);
        match &result {
            Ok(0) => {}
            Ok(n) => {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                let mut left = *n;
                for buf in bufs {
                    let take = left.min(buf.len());
                    scratch.extend_from_slice(&buf[..take]);
                    left -= take;
                    if left == 0 {
                        break;
                    }
                }
                self.record(|w, flow| w.write_data(flow, Direction::Outbound, &scratch, now()));
                self.scratch = scratch;
            }
            Err(LinkError::Reset) => self.record(|w, flow| w.write_rst(flow, Direction::Inbound, now())),
            Err(_) => {}
        }
        result
    }

    fn shutdown_write(&mut self) {
        self.inner.shutdown_write();
        self.record(|w, flow| w.write_fin(flow, Direction::Outbound, now()));
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.peer_addr()
    }

    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.fd()
    }
}

impl<L: Link> Drop for CapturingLink<L> {
    fn drop(&mut self) {
        // Dropping a link closes it: record our FIN and push the frames out.
        self.record(|w, flow| {
            w.write_fin(flow, Direction::Outbound, now())?;
            w.flush()
        });
    }
}
