//! Ethernet frame devices under a [`crate::SmolStack`]: a TAP device or a raw Ethernet
//! interface (`AF_PACKET` through pnet's datalink channel), as a `smoltcp` [`Device`].
//!
//! smoltcp's own `TunTapInterface` and `RawSocket` share their descriptor through an `Rc`, so
//! a stack built on them would not be `Send`; these devices own their descriptors directly.
//! Optional fault injection drops frames at random (both directions), and an optional pcap
//! capture records every frame that crosses the device, as it is on the wire.

use std::fs;
use std::io::{self, BufWriter};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter as RawPcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use pnet_datalink::{Channel, ChannelType, DataLinkReceiver, DataLinkSender};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use socket2::{Domain, Protocol, Socket, Type};

/// Ethernet header bytes on top of the interface MTU.
const ETHERNET_HEADER: usize = 14;
/// `ETH_P_ALL` in network byte order, the protocol of a packet socket that sees every frame.
const ETH_P_ALL_BE: u16 = 0x0003_u16.to_be();
/// Socket buffer asked for on raw packet sockets (the kernel clamps it to `rmem_max`).
const PACKET_SOCKET_BUFFER: usize = 8 << 20;
/// Frame buffer size: any frame a Linux interface hands over (GRO aside) fits.
const FRAME_BUFFER: usize = 65536 + ETHERNET_HEADER;

/// Counters of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames received from the device and handed to the stack.
    pub rx_frames: u64,
    /// Frames the stack transmitted.
    pub tx_frames: u64,
    /// Frames dropped by fault injection (either direction).
    pub injected_drops: u64,
    /// Frames the device would not take (transmit queue full) or errors on send.
    pub tx_errors: u64,
    /// Receive errors other than "nothing to read".
    pub rx_errors: u64,
}

/// Where frames go in and out.
enum Port {
    Tap(tun_tap::Iface),
    Raw { tx: Box<dyn DataLinkSender>, rx: Box<dyn DataLinkReceiver> },
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

/// A frame device for smoltcp; see the module docs.
pub(crate) struct FrameDevice {
    name: String,
    port: Port,
    fd: RawFd,
    mtu: usize,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    /// Drop probability scaled to `u32::MAX`; 0 disables fault injection.
    drop_threshold: u32,
    rng: u64,
    capture: Option<Capture>,
    pub(crate) stats: DeviceStats,
}

impl std::fmt::Debug for FrameDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.port {
            Port::Tap(_) => "tap",
            Port::Raw { .. } => "raw",
        };
        f.debug_struct("FrameDevice")
            .field("name", &self.name)
            .field("kind", &kind)
            .field("mtu", &self.mtu)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The MTU of interface `name` from sysfs, or a "not found" error naming it.
fn interface_mtu(name: &str, what: &str, hint: &str) -> io::Result<usize> {
    let path = format!("/sys/class/net/{name}/mtu");
    let text = fs::read_to_string(&path).map_err(|err| {
        if err.kind() == io::ErrorKind::NotFound {
            io::Error::new(io::ErrorKind::NotFound, format!("{what} {name} not found{hint}"))
        } else {
            io::Error::new(err.kind(), format!("reading the MTU of {what} {name}: {err}"))
        }
    })?;
    text.trim().parse::<usize>().map_err(|err| {
        io::Error::new(io::ErrorKind::InvalidData, format!("MTU of {what} {name} ({path}): {err}"))
    })
}

fn permission_error(err: &io::Error, what: String, need: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: permission denied ({need}): {err}"))
}

fn is_permission(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::PermissionDenied || err.raw_os_error() == Some(1)
}

impl FrameDevice {
    /// Attaches to the existing TAP device `name`.
    pub(crate) fn open_tap(name: &str) -> io::Result<FrameDevice> {
        let mtu =
            interface_mtu(name, "TAP device", &format!(" (create it: ip tuntap add mode tap name {name})"))?;
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tap).map_err(|err| {
            if is_permission(&err) {
                permission_error(&err, format!("opening TAP device {name}"), "needs root or CAP_NET_ADMIN")
            } else if err.raw_os_error() == Some(16) {
                io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("TAP device {name} is in use by another process: {err}"),
                )
            } else if err.raw_os_error() == Some(22) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{name} is not a TAP device (or has other flags): {err}"),
                )
            } else {
                io::Error::new(err.kind(), format!("opening TAP device {name}: {err}"))
            }
        })?;
        iface.set_non_blocking().map_err(|err| {
            io::Error::new(err.kind(), format!("TAP device {name}: non-blocking mode: {err}"))
        })?;
        let fd = iface.as_raw_fd();
        Ok(FrameDevice::new(name, Port::Tap(iface), fd, mtu))
    }

    /// Opens a raw `AF_PACKET` channel on the Ethernet interface `name` (for example one end
    /// of a veth pair).
    pub(crate) fn open_raw(name: &str) -> io::Result<FrameDevice> {
        let mtu = interface_mtu(name, "network interface", "")?;
        let interface =
            pnet_datalink::interfaces().into_iter().find(|iface| iface.name == name).ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("network interface {name} not found"))
            })?;
        let need = "raw Ethernet needs root or CAP_NET_RAW";
        let socket = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(i32::from(ETH_P_ALL_BE))))
            .map_err(|err| {
                if is_permission(&err) {
                    permission_error(&err, format!("opening a raw socket on {name}"), need)
                } else {
                    io::Error::new(err.kind(), format!("opening a raw socket on {name}: {err}"))
                }
            })?;
        // Best effort: a larger receive buffer absorbs bursts between two polls.
        let _ = socket.set_recv_buffer_size(PACKET_SOCKET_BUFFER);
        let _ = socket.set_send_buffer_size(PACKET_SOCKET_BUFFER);
        let fd = socket.into_raw_fd();
        let config = pnet_datalink::Config {
            write_buffer_size: FRAME_BUFFER,
            read_buffer_size: FRAME_BUFFER,
            read_timeout: Some(Duration::ZERO),
            write_timeout: Some(Duration::ZERO),
            channel_type: ChannelType::Layer2,
            promiscuous: true,
            socket_fd: Some(fd),
            ..pnet_datalink::Config::default()
        };
        match pnet_datalink::channel(&interface, config) {
            Ok(Channel::Ethernet(tx, rx)) => Ok(FrameDevice::new(name, Port::Raw { tx, rx }, fd, mtu)),
            Ok(_) => Err(io::Error::other(format!("raw channel on {name}: unexpected channel type"))),
            Err(err) if is_permission(&err) => {
                Err(permission_error(&err, format!("binding a raw socket to {name}"), need))
            }
            Err(err) => Err(io::Error::new(err.kind(), format!("binding a raw socket to {name}: {err}"))),
        }
    }

    fn new(name: &str, port: Port, fd: RawFd, mtu: usize) -> FrameDevice {
        FrameDevice {
            name: name.to_owned(),
            port,
            fd,
            mtu,
            rx_buf: vec![0; FRAME_BUFFER],
            tx_buf: vec![0; FRAME_BUFFER],
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

    /// The interface MTU (IP packet size).
    pub(crate) fn mtu(&self) -> usize {
        self.mtu
    }

    /// The descriptor to wait on for received frames.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd
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
            snaplen: 65535,
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

    /// Reads one frame into `rx_buf`; its length, or `None` when nothing is there.
    fn read_frame(&mut self) -> Option<usize> {
        loop {
            let len = match &mut self.port {
                Port::Tap(iface) => match iface.recv(&mut self.rx_buf) {
                    Ok(len) => len,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => return None,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        self.stats.rx_errors += 1;
                        return None;
                    }
                },
                Port::Raw { rx, .. } => match rx.next() {
                    Ok(frame) => {
                        let len = frame.len().min(self.rx_buf.len());
                        self.rx_buf[..len].copy_from_slice(&frame[..len]);
                        len
                    }
                    Err(err) if matches!(err.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
                        return None;
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        self.stats.rx_errors += 1;
                        return None;
                    }
                },
            };
            if Self::inject_drop(&mut self.rng, self.drop_threshold, &mut self.stats) {
                continue;
            }
            self.stats.rx_frames += 1;
            if let Some(capture) = &mut self.capture {
                capture.record(&self.rx_buf[..len]);
            }
            return Some(len);
        }
    }

    fn tx_token(&mut self) -> SmolTxToken<'_> {
        let sink = match &mut self.port {
            Port::Tap(iface) => Sink::Tap(iface),
            Port::Raw { tx, .. } => Sink::Raw(tx),
        };
        SmolTxToken {
            sink,
            buf: &mut self.tx_buf,
            rng: &mut self.rng,
            drop_threshold: self.drop_threshold,
            capture: &mut self.capture,
            stats: &mut self.stats,
        }
    }
}

/// Waits until `fd` is readable or `timeout` passed (smoltcp's `select` helper).
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<smoltcp::time::Duration>) -> io::Result<()> {
    phy::wait(fd, timeout)
}

enum Sink<'a> {
    Tap(&'a tun_tap::Iface),
    Raw(&'a mut Box<dyn DataLinkSender>),
}

/// A received frame.
pub(crate) struct SmolRxToken<'a> {
    frame: &'a [u8],
}

/// Room for one frame to transmit.
pub(crate) struct SmolTxToken<'a> {
    sink: Sink<'a>,
    buf: &'a mut Vec<u8>,
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
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        let frame = &mut self.buf[..len];
        let result = f(frame);
        if FrameDevice::inject_drop(self.rng, self.drop_threshold, self.stats) {
            return result;
        }
        let frame = &self.buf[..len];
        if let Some(capture) = self.capture.as_mut() {
            capture.record(frame);
        }
        let sent = match self.sink {
            Sink::Tap(iface) => iface.send(frame).map(|_| ()),
            Sink::Raw(tx) => tx.send_to(frame, None).unwrap_or(Ok(())),
        };
        match sent {
            Ok(()) => self.stats.tx_frames += 1,
            // A full queue loses the frame, as a NIC would; TCP retransmits.
            Err(_) => self.stats.tx_errors += 1,
        }
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
        let len = self.read_frame()?;
        // Split the borrows: the received frame lives in `rx_buf`, the reply goes out through
        // the port and `tx_buf`.
        let sink = match &mut self.port {
            Port::Tap(iface) => Sink::Tap(iface),
            Port::Raw { tx, .. } => Sink::Raw(tx),
        };
        let tx = SmolTxToken {
            sink,
            buf: &mut self.tx_buf,
            rng: &mut self.rng,
            drop_threshold: self.drop_threshold,
            capture: &mut self.capture,
            stats: &mut self.stats,
        };
        Some((SmolRxToken { frame: &self.rx_buf[..len] }, tx))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<Self::TxToken<'_>> {
        Some(self.tx_token())
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + ETHERNET_HEADER;
        caps
    }
}

/// Borrows a frame device's descriptor, held beside the device by a stack handle.
///
/// The one `unsafe` of the frame I/O: the devices keep their descriptor inside types that
/// expose only the raw number (pnet's channel, tun-tap's interface).
#[expect(unsafe_code, reason = "a raw descriptor borrowed for the lifetime of its owner's handle")]
pub(crate) fn borrow_fd(fd: &RawFd) -> std::os::fd::BorrowedFd<'_> {
    // SAFETY: `fd` is the `fd` field of a `SmolStack`, next to the `Arc` that owns the frame
    // device holding the descriptor open (`Port::Tap` or `Port::Raw`). The device is only
    // dropped with the last handle, so the descriptor stays open for as long as the handle
    // that lends `fd`, which is what the returned borrow's lifetime is tied to.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }
}
