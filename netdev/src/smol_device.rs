//! Ethernet frame devices under a [`crate::SmolStack`]: a TAP device or a raw Ethernet
//! interface (a packet socket), as a `smoltcp` [`Device`].
//!
//! Frames cross into the kernel in batches: received ones are drained many per system call
//! (`recvmmsg` on a packet socket) when the stack polls, and the frames smoltcp emits are
//! queued and handed over together (`sendmmsg`) when the poll ends or the queue is full.
//! Where the kernel offers them the device uses offloads ([`crate::Offloads`], see
//! `offload.rs`): smoltcp then sends TCP segments of up to 64 KiB that the kernel (or the NIC)
//! cuts to the wire's MSS, leaves checksums to the kernel, and takes coalesced segments back.
//! The system calls themselves are in `frame_io.rs`, the crate's one module with `unsafe`.
//!
//! Optional fault injection drops frames at random (both directions), and an optional pcap
//! capture records every frame as it crosses into or out of the kernel (segments larger than
//! the wire's, with partial checksums, where offloads are on).

use std::fs;
use std::io::{self, BufWriter};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter as RawPcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use smoltcp::phy::{self, Checksum, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use crate::frame_io::{self, PacketSocket, RingFrame, RxRing, TapFile};
use crate::offload::{Offload, Offloader, Offloads, RxChecksum, RxVerdict, VNET_HDR_LEN, VnetHdr};

/// Ethernet header bytes on top of the interface MTU.
const ETHERNET_HEADER: usize = 14;
/// Room for any frame the kernel hands over (coalesced TCP segments up to the largest IPv4
/// packet, a VLAN tag) after its virtio-net header.
const RX_SLOT: usize = VNET_HDR_LEN + ETHERNET_HEADER + 4 + 65535;
/// Frames received per system call at most.
const RX_BATCH: usize = 32;
/// Frames queued for one system call at most.
const TX_BATCH: usize = 32;
/// The snapshot length of captures: whole frames, large offloaded ones included.
const CAPTURE_SNAPLEN: u32 = 262_144;

/// Counters of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames received from the device and handed to the stack.
    pub rx_frames: u64,
    /// Frames the stack transmitted (taken by the kernel).
    pub tx_frames: u64,
    /// Frames dropped by fault injection (either direction).
    pub injected_drops: u64,
    /// Frames the device would not take (transmit queue full) or errors on send.
    pub tx_errors: u64,
    /// Receive errors other than "nothing to read" (frames too long for the buffer among
    /// them).
    pub rx_errors: u64,
    /// Received frames dropped for a wrong TCP checksum, where the device checks them
    /// (receive checksum offload on, and the kernel did not vouch for the frame). Where
    /// smoltcp checks them it drops them silently.
    pub rx_checksum_errors: u64,
    /// Frames sent as one TCP segment for the kernel or the NIC to cut to the wire's size
    /// (TSO/GSO).
    pub tx_gso_frames: u64,
    /// Frames received larger than the wire carries (coalesced by the kernel, GRO, or
    /// never cut by a local sender).
    pub rx_gso_frames: u64,
    /// System calls that received frames (or found none).
    pub rx_syscalls: u64,
    /// System calls that sent frames.
    pub tx_syscalls: u64,
    /// Frames the kernel dropped before the stack saw them (its receive ring or queue for
    /// the stack was full); packet sockets only.
    pub rx_kernel_drops: u64,
}

/// Where frames go in and out.
enum Port {
    Tap(TapFile),
    Packet(PacketSocket),
}

/// The capture file, shared so that it can be flushed while the pcap writer owns it.
#[derive(Clone)]
struct CaptureFile(Arc<Mutex<BufWriter<fs::File>>>);

impl CaptureFile {
    fn lock(&self) -> MutexGuard<'_, BufWriter<fs::File>> {
        // A panic mid-write leaves at worst one truncated record.
        match self.0.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl io::Write for CaptureFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock().flush()
    }
}

/// Pcap recording of real frames.
struct Capture {
    writer: RawPcapWriter<CaptureFile>,
    file: CaptureFile,
    error: Option<io::Error>,
}

impl Capture {
    fn record(&mut self, frame: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let orig_len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        if let Err(err) = self.writer.write_packet(&PcapPacket::new(at, orig_len, frame)) {
            self.error = Some(io::Error::other(err.to_string()));
        }
    }
}

/// Frames received in one system call, handed to smoltcp one at a time.
struct RxQueue {
    /// One buffer per frame: the virtio-net header (where used), then the frame.
    slots: Vec<Vec<u8>>,
    /// What the kernel put into each slot (0: a frame too long for it).
    lens: Vec<usize>,
    /// The next slot to hand over, and how many are filled.
    next: usize,
    filled: usize,
}

/// Where received frames come from.
enum RxPath {
    /// A packet socket's receive ring; a frame too large for a ring slot is read from the
    /// socket into `big`.
    Ring { ring: RxRing, big: Vec<u8> },
    /// Batches read by system calls: `recvmmsg` on a packet socket without a ring, one
    /// read of a TAP.
    Queue(RxQueue),
}

/// Where the received frame being handed to smoltcp is, and its length with the
/// virtio-net header.
#[derive(Debug, Clone, Copy)]
enum Held {
    /// In the ring slot held.
    Ring,
    /// In `big`.
    Big(usize),
    /// In a slot of the queue.
    Slot(usize, usize),
}

/// The bytes of the received frame `held` (virtio-net header first).
fn held_bytes(rx: &mut RxPath, held: Held) -> &mut [u8] {
    match (rx, held) {
        (RxPath::Ring { ring, .. }, Held::Ring) => ring.held(),
        (RxPath::Ring { big, .. }, Held::Big(n)) => big.get_mut(..n).unwrap_or_default(),
        (RxPath::Queue(q), Held::Slot(i, n)) => {
            q.slots.get_mut(i).and_then(|slot| slot.get_mut(..n)).unwrap_or_default()
        }
        _ => &mut [],
    }
}

/// Frames smoltcp emitted, waiting to be handed over together.
struct TxQueue {
    /// One buffer per frame, as in [`RxQueue`]; grown to the largest frame put there.
    slots: Vec<Vec<u8>>,
    /// Bytes of each queued message (header and frame).
    lens: Vec<usize>,
    queued: usize,
}

/// A frame device for smoltcp; see the module docs.
pub(crate) struct FrameDevice {
    name: String,
    port: Port,
    fd: RawFd,
    /// The wire's MTU (largest IP packet).
    mtu: usize,
    /// Bytes in front of each frame: the virtio-net header, or none.
    head: usize,
    offloader: Offloader,
    rx: RxPath,
    /// Whether the kernel may be asked for frames again in this poll once those received
    /// are handed over (system-call paths): at the start of a poll, after frames were sent,
    /// and while each call fills the whole queue. Otherwise every round of smoltcp's poll
    /// would cost a system call that finds nothing. A ring is looked at for free.
    rx_armed: bool,
    tx: TxQueue,
    /// Drop probability scaled to `u32::MAX`; 0 disables fault injection.
    drop_threshold: u32,
    rng: u64,
    capture: Option<Capture>,
    stats: DeviceStats,
}

impl std::fmt::Debug for FrameDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.port {
            Port::Tap(_) => "tap",
            Port::Packet(_) => "raw",
        };
        f.debug_struct("FrameDevice")
            .field("name", &self.name)
            .field("kind", &kind)
            .field("mtu", &self.mtu)
            .field("offloads", &self.offloader.offloads())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The MTU of interface `name`, or a "not found" error naming it.
fn interface_mtu(name: &str, what: &str, hint: &str) -> io::Result<usize> {
    frame_io::interface_mtu(name).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => {
            io::Error::new(io::ErrorKind::NotFound, format!("{what} {name} not found{hint}"))
        }
        kind => io::Error::new(kind, format!("reading the MTU of {what} {name}: {err}")),
    })
}

fn permission_error(err: &io::Error, what: String, need: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: permission denied ({need}): {err}"))
}

fn is_permission(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::PermissionDenied || err.raw_os_error() == Some(libc::EPERM)
}

impl FrameDevice {
    /// Attaches to the existing TAP device `name`, with the offloads it takes when `offload`
    /// asks for them.
    pub(crate) fn open_tap(name: &str, offload: Offload) -> io::Result<FrameDevice> {
        let mtu =
            interface_mtu(name, "TAP device", &format!(" (create it: ip tuntap add mode tap name {name})"))?;
        let (tap, vnet) = TapFile::open(name, true).map_err(|err| {
            if is_permission(&err) {
                permission_error(&err, format!("opening TAP device {name}"), "needs root or CAP_NET_ADMIN")
            } else if err.raw_os_error() == Some(libc::EBUSY) {
                io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("TAP device {name} is in use by another process: {err}"),
                )
            } else if err.raw_os_error() == Some(libc::EINVAL) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{name} is not a TAP device (or has other flags): {err}"),
                )
            } else {
                io::Error::new(err.kind(), format!("opening TAP device {name}: {err}"))
            }
        })?;
        // What the kernel may hand over and take: segments to cut and partial checksums, or
        // partial checksums alone, or neither (then it cuts and sums before handing frames
        // over, and takes only whole ones).
        let (tso, csum) = if vnet && offload == Offload::Auto {
            if tap.set_offload(frame_io::TAP_OFFLOAD_TSO).is_ok() {
                (true, true)
            } else {
                (false, tap.set_offload(frame_io::TAP_OFFLOAD_CSUM).is_ok())
            }
        } else {
            (false, false)
        };
        if vnet && !csum {
            // Whatever an earlier user of the device asked for.
            let _ = tap.set_offload(0);
        }
        let offloads = Offloads {
            vnet_header: vnet,
            tx_checksum: csum,
            rx_checksum: csum,
            tso,
            gro: tso,
            batched_io: false,
            rx_ring: false,
            qdisc_bypass: false,
        };
        let fd = tap.raw_fd();
        Ok(FrameDevice::new(name, Port::Tap(tap), fd, mtu, offloads, None))
    }

    /// Opens a packet socket on the Ethernet interface `name` (for example one end of a veth
    /// pair), with the offloads the kernel takes when `offload` asks for them.
    pub(crate) fn open_raw(name: &str, offload: Offload) -> io::Result<FrameDevice> {
        let mtu = interface_mtu(name, "network interface", "")?;
        let need = "raw Ethernet needs root or CAP_NET_RAW";
        // The virtio-net header even without offloads: a local sender's frames (a veth
        // peer's) come with partial checksums and as large segments, which it makes out.
        let ring_mtu = Some(mtu);
        let (sock, features) = PacketSocket::open(name, true, ring_mtu).map_err(|err| {
            if is_permission(&err) {
                permission_error(&err, format!("opening a raw socket on {name}"), need)
            } else if err.kind() == io::ErrorKind::NotFound {
                io::Error::new(io::ErrorKind::NotFound, format!("network interface {name} not found"))
            } else {
                io::Error::new(err.kind(), format!("opening a raw socket on {name}: {err}"))
            }
        })?;
        let on = features.vnet_header && offload == Offload::Auto;
        let qdisc_bypass = !on && sock.bypass_qdisc();
        let offloads = Offloads {
            vnet_header: features.vnet_header,
            tx_checksum: on,
            rx_checksum: on,
            tso: on,
            gro: on,
            batched_io: true,
            rx_ring: features.ring.is_some(),
            qdisc_bypass,
        };
        let fd = sock.raw_fd();
        Ok(FrameDevice::new(name, Port::Packet(sock), fd, mtu, offloads, features.ring))
    }

    fn new(
        name: &str,
        port: Port,
        fd: RawFd,
        mtu: usize,
        offloads: Offloads,
        ring: Option<RxRing>,
    ) -> FrameDevice {
        let head = if offloads.vnet_header { VNET_HDR_LEN } else { 0 };
        let rx = match ring {
            Some(ring) => RxPath::Ring { ring, big: vec![0; RX_SLOT] },
            None => {
                let batch = if matches!(port, Port::Packet(_)) { RX_BATCH } else { 1 };
                RxPath::Queue(RxQueue {
                    slots: vec![vec![0; RX_SLOT]; batch],
                    lens: vec![0; batch],
                    next: 0,
                    filled: 0,
                })
            }
        };
        FrameDevice {
            name: name.to_owned(),
            port,
            fd,
            mtu,
            head,
            offloader: Offloader::new(offloads, mtu),
            rx,
            rx_armed: true,
            tx: TxQueue { slots: vec![Vec::new(); TX_BATCH], lens: vec![0; TX_BATCH], queued: 0 },
            drop_threshold: 0,
            rng: crate::smol::random_u64() | 1,
            capture: None,
            stats: DeviceStats::default(),
        }
    }

    /// The interface's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The interface MTU (IP packet size on the wire).
    pub(crate) fn mtu(&self) -> usize {
        self.mtu
    }

    /// The counters, with the kernel's drops brought up to date.
    pub(crate) fn stats(&mut self) -> DeviceStats {
        if let Port::Packet(sock) = &self.port
            && let Ok(drops) = sock.take_drops()
        {
            self.stats.rx_kernel_drops += drops;
        }
        self.stats
    }

    /// The offloads in use.
    pub(crate) fn offloads(&self) -> Offloads {
        self.offloader.offloads()
    }

    /// The descriptor to wait on for received frames.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// A stack poll begins: frames waiting in the kernel are read when smoltcp asks.
    pub(crate) fn start_poll(&mut self) {
        self.rx_armed = true;
    }

    /// Hands every queued frame to the kernel, and the ring slot held back to it (the end of
    /// a stack poll).
    pub(crate) fn flush(&mut self) {
        flush_queue(&self.port, &mut self.tx, &mut self.stats, &mut self.rx_armed);
        if let RxPath::Ring { ring, .. } = &mut self.rx {
            ring.give_back();
        }
    }

    /// Drops each frame (either direction) with probability `chance` (0 disables).
    pub(crate) fn set_drop_chance(&mut self, chance: f64) {
        let chance = chance.clamp(0.0, 1.0);
        // A probability scaled to the u32 range; the float-to-int `as` saturates.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold = (chance * f64::from(u32::MAX)) as u32;
        self.drop_threshold = threshold;
    }

    /// Records every frame into a pcap file at `path` (Ethernet link type).
    pub(crate) fn set_capture(&mut self, path: &std::path::Path) -> io::Result<()> {
        let file = fs::File::create(path).map_err(|err| {
            io::Error::new(err.kind(), format!("creating pcap file {}: {err}", path.display()))
        })?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: CAPTURE_SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::native(),
        };
        let file = CaptureFile(Arc::new(Mutex::new(BufWriter::new(file))));
        let writer = RawPcapWriter::with_header(file.clone(), header)
            .map_err(|err| io::Error::other(format!("writing pcap file {}: {err}", path.display())))?;
        self.capture = Some(Capture { writer, file, error: None });
        Ok(())
    }

    /// Flushes the capture and reports its first error, if any.
    pub(crate) fn flush_capture(&mut self) -> io::Result<()> {
        if let Some(capture) = &mut self.capture {
            if let Some(err) = capture.error.take() {
                return Err(err);
            }
            io::Write::flush(&mut capture.file)?;
        }
        Ok(())
    }

    /// Whether the next frame is dropped by fault injection (xorshift64).
    fn inject_drop(rng: &mut u64, threshold: u32, stats: &mut DeviceStats) -> bool {
        if threshold == 0 {
            return false;
        }
        let mut x = *rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *rng = x;
        let drop = u32::try_from(x >> 32).unwrap_or(u32::MAX) < threshold;
        if drop {
            stats.injected_drops += 1;
        }
        drop
    }

    /// The next received frame for smoltcp, or `None` when none is there. Frames lost to
    /// fault injection, too long for their buffer or with a checksum found wrong are
    /// skipped here.
    fn next_frame(&mut self) -> Option<Held> {
        loop {
            let held = fetch(&self.port, &mut self.rx, &mut self.rx_armed, &mut self.stats)?;
            let bytes = held_bytes(&mut self.rx, held);
            if bytes.len() <= self.head {
                self.stats.rx_errors += 1;
                continue;
            }
            if Self::inject_drop(&mut self.rng, self.drop_threshold, &mut self.stats) {
                continue;
            }
            let (head, frame) = bytes.split_at_mut(self.head);
            let hdr = VnetHdr::parse(head);
            if let Some(capture) = &mut self.capture {
                capture.record(frame);
            }
            if hdr.is_some_and(|h| h.is_gso()) || frame.len() > self.mtu + ETHERNET_HEADER {
                self.stats.rx_gso_frames += 1;
            }
            let checksum = hdr.map_or(RxChecksum::Unknown, |h| h.rx_checksum());
            if self.offloader.incoming(frame, checksum) == RxVerdict::BadChecksum {
                self.stats.rx_checksum_errors += 1;
                continue;
            }
            self.stats.rx_frames += 1;
            return Some(held);
        }
    }
}

/// Takes the next received frame from the ring, or from the queue (refilled by a system
/// call where allowed).
fn fetch(port: &Port, rx: &mut RxPath, armed: &mut bool, stats: &mut DeviceStats) -> Option<Held> {
    match rx {
        RxPath::Ring { ring, big } => loop {
            match ring.next()? {
                RingFrame::Whole { .. } => return Some(Held::Ring),
                RingFrame::Queued => {
                    ring.give_back();
                    let Port::Packet(sock) = port else { return None };
                    stats.rx_syscalls += 1;
                    match sock.recv_one(big) {
                        Ok(Some(len)) if len > 0 => return Some(Held::Big(len)),
                        _ => stats.rx_errors += 1,
                    }
                }
                RingFrame::Cut => {
                    ring.give_back();
                    stats.rx_errors += 1;
                }
            }
        },
        RxPath::Queue(q) => {
            if q.next >= q.filled {
                if !*armed {
                    return None;
                }
                refill(port, q, armed, stats);
                if q.filled == 0 {
                    return None;
                }
            }
            let i = q.next;
            q.next += 1;
            Some(Held::Slot(i, q.lens[i]))
        }
    }
}

/// Reads frames from the kernel into the receive queue (one system call).
fn refill(port: &Port, q: &mut RxQueue, armed: &mut bool, stats: &mut DeviceStats) {
    q.next = 0;
    q.filled = 0;
    stats.rx_syscalls += 1;
    let result = match port {
        Port::Packet(sock) => sock.recv_batch(&mut q.slots, &mut q.lens),
        Port::Tap(tap) => match q.slots.first_mut() {
            Some(slot) => tap.recv(slot).map(|len| {
                q.lens[0] = len;
                usize::from(len > 0)
            }),
            None => Ok(0),
        },
    };
    match result {
        Ok(n) => {
            q.filled = n;
            // A full queue: more may be waiting.
            *armed = n > 0 && n == q.slots.len();
        }
        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
        Err(_) => {
            stats.rx_errors += 1;
            *armed = false;
        }
    }
}

/// Hands the queued frames to the kernel. One the kernel refuses is lost, as on a NIC whose
/// ring is full; TCP sends it again.
fn flush_queue(port: &Port, tx: &mut TxQueue, stats: &mut DeviceStats, rx_armed: &mut bool) {
    let n = tx.queued;
    if n == 0 {
        return;
    }
    match port {
        Port::Packet(sock) => {
            let mut done = 0;
            while done < n {
                let frames: Vec<&[u8]> = (done..n).map(|i| &tx.slots[i][..tx.lens[i]]).collect();
                stats.tx_syscalls += 1;
                match sock.send_batch(&frames) {
                    Ok(k) if k > 0 => {
                        done += k;
                        stats.tx_frames += k as u64;
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    _ => {
                        done += 1;
                        stats.tx_errors += 1;
                    }
                }
            }
        }
        Port::Tap(tap) => {
            for i in 0..n {
                stats.tx_syscalls += 1;
                match tap.send(&tx.slots[i][..tx.lens[i]]) {
                    Ok(_) => stats.tx_frames += 1,
                    Err(_) => stats.tx_errors += 1,
                }
            }
        }
    }
    tx.queued = 0;
    // Frames went out: answers (ACKs) may be waiting.
    *rx_armed = true;
}

/// Waits until `fd` is readable or `timeout` passed (smoltcp's `select` helper).
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<smoltcp::time::Duration>) -> io::Result<()> {
    phy::wait(fd, timeout)
}

/// A received frame.
pub(crate) struct SmolRxToken<'a> {
    frame: &'a [u8],
}

/// Room for one frame to transmit, in the transmit queue.
pub(crate) struct SmolTxToken<'a> {
    port: &'a Port,
    queue: &'a mut TxQueue,
    rx_armed: &'a mut bool,
    head: usize,
    offloader: &'a mut Offloader,
    rng: &'a mut u64,
    drop_threshold: u32,
    capture: &'a mut Option<Capture>,
    stats: &'a mut DeviceStats,
}

impl phy::RxToken for SmolRxToken<'_> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(self.frame)
    }
}

impl phy::TxToken for SmolTxToken<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        if self.queue.queued >= self.queue.slots.len() {
            flush_queue(self.port, self.queue, self.stats, self.rx_armed);
        }
        let slot_index = self.queue.queued;
        let total = self.head + len;
        let slot = &mut self.queue.slots[slot_index];
        if slot.len() < total {
            slot.resize(total, 0);
        }
        let (head, frame) = slot[..total].split_at_mut(self.head);
        let result = f(frame);
        if FrameDevice::inject_drop(self.rng, self.drop_threshold, self.stats) {
            return result;
        }
        let offloads = self.offloader.offloads();
        if offloads.tx_checksum || offloads.tso {
            let hdr = self.offloader.outgoing(frame);
            if hdr.is_gso() {
                self.stats.tx_gso_frames += 1;
            }
            if let Ok(head) = <&mut [u8; VNET_HDR_LEN]>::try_from(head) {
                hdr.emit(head);
            }
        } else if let Ok(head) = <&mut [u8; VNET_HDR_LEN]>::try_from(head) {
            VnetHdr::default().emit(head);
        }
        if let Some(capture) = self.capture.as_mut() {
            capture.record(frame);
        }
        self.queue.lens[slot_index] = total;
        self.queue.queued += 1;
        result
    }
}

impl Device for FrameDevice {
    type RxToken<'a>
        = SmolRxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = SmolTxToken<'a>
    where
        Self: 'a;

    fn receive(&mut self, _timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let held = self.next_frame()?;
        // Split the borrows: the received frame stays where it was received (a ring slot, a
        // buffer), a reply goes into the transmit queue.
        let head = self.head;
        let frame = held_bytes(&mut self.rx, held).get(head..).unwrap_or_default();
        let tx = SmolTxToken {
            port: &self.port,
            queue: &mut self.tx,
            rx_armed: &mut self.rx_armed,
            head,
            offloader: &mut self.offloader,
            rng: &mut self.rng,
            drop_threshold: self.drop_threshold,
            capture: &mut self.capture,
            stats: &mut self.stats,
        };
        Some((SmolRxToken { frame }, tx))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Self::TxToken<'_>> {
        Some(SmolTxToken {
            port: &self.port,
            queue: &mut self.tx,
            rx_armed: &mut self.rx_armed,
            head: self.head,
            offloader: &mut self.offloader,
            rng: &mut self.rng,
            drop_threshold: self.drop_threshold,
            capture: &mut self.capture,
            stats: &mut self.stats,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.offloader.stack_mtu() + ETHERNET_HEADER;
        caps.checksum.tcp = self.offloader.stack_tcp_checksum();
        caps.checksum.ipv4 = Checksum::Both;
        caps
    }
}

#[cfg(test)]
mod tests {
    //! What leaves a stack and what it takes, seen from another packet socket on the peer end
    //! of a veth pair (in a private network namespace; skipped without root).

    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant};

    use super::{ETHERNET_HEADER, RX_SLOT};
    use crate::frame_io::PacketSocket;
    use crate::frame_io::tests::{VETH, in_private_netns};
    use crate::{Link, Offload, SmolConfig, SmolStack};

    const IP_A: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
    const IP_B: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
    /// The largest frame a 1500-byte MTU puts on the wire.
    const WIRE_FRAME: usize = 1500 + ETHERNET_HEADER;

    fn stack(dev: &str, ip: Ipv4Addr, offload: Offload) -> SmolStack {
        let mut cfg = SmolConfig::new(ip, 24);
        cfg.offload = offload;
        SmolStack::raw(dev, cfg).unwrap()
    }

    /// Reads every frame waiting on `observer`; their lengths and source MAC addresses.
    fn observe(observer: &PacketSocket, seen: &mut Vec<(usize, [u8; 6])>) {
        let mut slots = vec![vec![0u8; RX_SLOT]; 16];
        let mut lens = vec![0; 16];
        loop {
            let n = observer.recv_batch(&mut slots, &mut lens).unwrap();
            for (slot, &len) in slots.iter().zip(&lens).take(n) {
                let mut src = [0; 6];
                src.copy_from_slice(&slot[6..12]);
                seen.push((len, src));
            }
            if n < slots.len() {
                return;
            }
        }
    }

    /// Moves 4 MiB from `a` to `b` (stacks, or `b` the kernel's socket), polling the stacks
    /// and reading `observer` meanwhile; the lengths of the frames it saw from `a`.
    fn frames_seen(
        stacks: &[&SmolStack],
        tx: &mut crate::SmolLink,
        mut rx: impl FnMut(&mut [u8]) -> usize,
        observer: &PacketSocket,
    ) -> Vec<usize> {
        let from = stacks[0].mac();
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        let (mut sent, mut got) = (0, Vec::with_capacity(data.len()));
        let mut buf = vec![0; 1 << 16];
        let mut seen = Vec::new();
        let start = Instant::now();
        while got.len() < data.len() {
            if sent < data.len() {
                sent += tx.send(&data[sent..]).unwrap();
            }
            for stack in stacks {
                stack.poll_now();
            }
            observe(observer, &mut seen);
            loop {
                let n = rx(&mut buf);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(start.elapsed() < Duration::from_secs(30), "stuck at {} bytes", got.len());
        }
        assert!(got == data, "the bytes arrived changed");
        observe(observer, &mut seen);
        seen.into_iter().filter(|(_, src)| *src == from).map(|(len, _)| len).collect()
    }

    /// Connects `a` to a listener on `b`.
    fn connect(a: &SmolStack, b: &SmolStack, port: u16) -> (crate::SmolLink, crate::SmolLink) {
        let mut listener = b.listen(port).unwrap();
        let tx = a.connect(SocketAddr::from((b.ip(), port))).unwrap();
        let start = Instant::now();
        loop {
            a.poll_now();
            if let Some(rx) = listener.accept().unwrap() {
                return (tx, rx);
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no connection");
        }
    }

    /// With the offloads on, the stack hands the kernel TCP segments far larger than the wire
    /// takes: a small fraction of the frames 4 MiB takes at a 1500-byte MTU (about 2900). The
    /// kernel cuts them to the peer's MSS, or passes them on whole through the veth (as into a
    /// TAP): the peer end sees wire-sized frames, or larger ones of whole segments. Without
    /// offloads every frame is wire-sized and the stack sends every one.
    #[test]
    fn segmentation_offload_sends_few_large_frames_on_a_veth() {
        in_private_netns("segmentation_offload_sends_few_large_frames_on_a_veth", VETH, || {
            for (port, offload) in [(7300, Offload::Auto), (7301, Offload::Off)] {
                let a = stack("fa", IP_A, offload);
                let b = stack("fb", IP_B, offload);
                // Another socket on the peer end sees every frame that arrives there.
                let (observer, _) = PacketSocket::open("fb", false, None).unwrap();
                let (mut tx, mut rx) = connect(&a, &b, port);
                let sent_before = a.device_stats().tx_frames;
                let lens = frames_seen(&[&a, &b], &mut tx, |buf| rx.recv(buf).unwrap(), &observer);
                let stats = a.device_stats();
                let sent = stats.tx_frames - sent_before;
                let largest = lens.iter().copied().max().unwrap_or(0);
                let supers = lens.iter().filter(|&&len| len > WIRE_FRAME).count();
                println!(
                    "veth, {offload:?} ({}): {sent} frames sent, {} seen on the peer end, {supers} larger than the wire's, the largest {largest} bytes; {stats:?}",
                    a.offloads(),
                    lens.len()
                );
                assert!(!lens.is_empty(), "the observer saw nothing");
                assert!(largest <= 65535 + ETHERNET_HEADER, "a {largest}-byte frame");
                match offload {
                    Offload::Auto => {
                        assert!(stats.tx_gso_frames > 0 && sent < 2900 / 8, "{sent} frames sent: {stats:?}")
                    }
                    Offload::Off => {
                        assert!(stats.tx_gso_frames == 0 && sent > 2800, "{sent} frames sent: {stats:?}");
                        assert!(largest <= WIRE_FRAME, "a {largest}-byte frame without offloads");
                    }
                }
            }
        });
    }

    /// Through a TAP device the kernel takes the stack's TCP segments whole, as a host takes
    /// a guest's through virtio-net: the kernel's side of the TAP sees frames far larger than
    /// the wire's with the offloads on, none without; the kernel's TCP gets every byte.
    #[test]
    fn segmentation_offload_sends_super_frames_into_a_tap() {
        const TAP: &[&[&str]] = &[
            &["tuntap", "add", "mode", "tap", "name", "ft0"],
            &["addr", "add", "10.80.0.1/24", "dev", "ft0"],
            &["link", "set", "ft0", "up"],
        ];
        in_private_netns("segmentation_offload_sends_super_frames_into_a_tap", TAP, || {
            for (port, offload) in [(7302, Offload::Auto), (7303, Offload::Off)] {
                let mut cfg = SmolConfig::new(Ipv4Addr::new(10, 80, 0, 2), 24);
                cfg.offload = offload;
                let a = SmolStack::tap("ft0", cfg).unwrap();
                let (observer, _) = PacketSocket::open("ft0", false, None).unwrap();
                let listener = std::net::TcpListener::bind(("10.80.0.1", port)).unwrap();
                let mut tx = a.connect(SocketAddr::from(([10, 80, 0, 1], port))).unwrap();
                let start = Instant::now();
                while !tx.is_established() {
                    a.poll_now();
                    assert!(start.elapsed() < Duration::from_secs(10), "no connection");
                }
                let (kernel, _) = listener.accept().unwrap();
                kernel.set_nonblocking(true).unwrap();
                let read = |buf: &mut [u8]| match std::io::Read::read(&mut &kernel, buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                    Err(e) => panic!("kernel read: {e}"),
                };
                let lens = frames_seen(&[&a], &mut tx, read, &observer);
                let largest = lens.iter().copied().max().unwrap_or(0);
                let supers = lens.iter().filter(|&&len| len > WIRE_FRAME).count();
                println!(
                    "tap, {offload:?} ({}): the kernel saw {} frames, {supers} larger than the wire's, the largest {largest} bytes; {:?}",
                    a.offloads(),
                    lens.len(),
                    a.device_stats()
                );
                match offload {
                    Offload::Auto => assert!(supers > 0 && largest > 4 * WIRE_FRAME, "no super-frames"),
                    Offload::Off => assert!(largest <= WIRE_FRAME, "a {largest}-byte frame without offloads"),
                }
            }
        });
    }

    /// A SYN with a wrong TCP checksum from the wire is dropped, whether smoltcp checks the sum
    /// (offloads off) or the device does (on: nobody vouched for the frame); the same SYN with
    /// the right one is answered.
    #[test]
    fn wire_checksum_errors_are_caught_with_offloads_on_and_off() {
        in_private_netns("wire_checksum_errors_are_caught_with_offloads_on_and_off", VETH, || {
            for (port, offload) in [(7310, Offload::Auto), (7311, Offload::Off)] {
                let a = stack("fa", IP_A, offload);
                let _listener = a.listen(port).unwrap();
                let (peer, _) = PacketSocket::open("fb", false, None).unwrap();
                let peer_mac = [0x02, 0, 0, 0, 0x79, 0x02];
                let builder = etherparse::PacketBuilder::ethernet2(peer_mac, a.mac())
                    .ipv4(IP_B.octets(), IP_A.octets(), 64)
                    .tcp(40000, port, 1000, 65535)
                    .syn();
                let mut good = Vec::new();
                builder.write(&mut good, &[]).unwrap();
                // The TCP checksum: Ethernet, IPv4 (20 bytes), then 16 bytes into TCP.
                let mut bad = good.clone();
                bad[14 + 20 + 16] ^= 0x5a;
                // Whatever `a` sends within `wait`.
                let answers = |wait: Duration| {
                    let mut seen = Vec::new();
                    let until = Instant::now() + wait;
                    while Instant::now() < until {
                        a.poll_now();
                        observe(&peer, &mut seen);
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    seen.into_iter().filter(|(_, src)| *src == a.mac()).count()
                };
                assert_eq!(peer.send_batch(&[&bad]).unwrap(), 1);
                assert_eq!(answers(Duration::from_millis(300)), 0, "{offload:?}: a bad SYN was answered");
                if offload == Offload::Auto {
                    assert_eq!(a.device_stats().rx_checksum_errors, 1, "{:?}", a.device_stats());
                }
                assert_eq!(peer.send_batch(&[&good]).unwrap(), 1);
                // A SYN-ACK, or first an ARP request for the sender's address.
                assert!(answers(Duration::from_millis(500)) > 0, "{offload:?}: the good SYN went unanswered");
            }
        });
    }
}
