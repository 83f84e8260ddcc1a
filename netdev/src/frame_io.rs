//! The kernel's frame interfaces under a smoltcp stack: packet sockets (`AF_PACKET`) and TAP
//! devices, their offload settings, and many frames per system call.
//!
//! The one module of `iwarp-netdev` with `unsafe` code: a bind, socket options and ioctls
//! that no maintained crate wraps (a packet socket's `sockaddr_ll`, `PACKET_VNET_HDR`,
//! `PACKET_QDISC_BYPASS`, `PACKET_IGNORE_OUTGOING`, promiscuous membership; `TUNSETIFF` with
//! `IFF_VNET_HDR`, `TUNSETVNETHDRSZ`, `TUNSETOFFLOAD`; `SIOCGIFMTU`), and borrowing a device's
//! descriptor for a readiness poll. Sockets are made with `socket2`, the multi-frame calls
//! (`recvmmsg`, `sendmmsg`) and interface indices go through `nix`. Every `unsafe` block says
//! why it is sound; the tests at the bottom also run under AddressSanitizer (scripts/asan.sh).

#![expect(unsafe_code, reason = "ioctls and socket options without a safe wrapper; see the module docs")]

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read as _, Write as _};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;

use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, recvmmsg, sendmmsg};
use socket2::{Domain, Protocol, Socket, Type};

use crate::offload::VNET_HDR_LEN;

/// `ETH_P_ALL` (every protocol) in network byte order.
const ETH_P_ALL_BE: u16 = 0x0003_u16.to_be();
/// `AF_PACKET`, as the address family field of a `sockaddr_ll` holds it.
const AF_PACKET: libc::c_ushort = 17;
/// `PACKET_MR_PROMISC`, as a `packet_mreq` holds it.
const PACKET_MR_PROMISC: libc::c_ushort = 1;
/// Socket buffers asked for on packet sockets (see [`size_buffers`]): a burst between two polls
/// waits there.
const PACKET_SOCKET_BUFFER: usize = 16 << 20;
/// `TUN_F_CSUM | TUN_F_TSO4`: the TAP takes partial checksums and TCP/IPv4 segments to cut,
/// and may hand them over.
pub(crate) const TAP_OFFLOAD_TSO: u32 = libc::TUN_F_CSUM | libc::TUN_F_TSO4;
/// `TUN_F_CSUM` alone.
pub(crate) const TAP_OFFLOAD_CSUM: u32 = libc::TUN_F_CSUM;

/// An interface request naming `name` (checked: non-empty, shorter than `IFNAMSIZ`, no NUL).
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not an interface name"),
        ));
    }
    // SAFETY: `ifreq` is plain data (a name array and a union of integers, socket addresses
    // and a pointer); all-zero bytes are a valid value of every field.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in req.ifr_name.iter_mut().zip(bytes) {
        *to = libc::c_char::from_ne_bytes([*from]);
    }
    Ok(req)
}

/// `ENODEV` (no such interface) as `NotFound`; other errors as they are.
fn no_device_is_not_found(err: io::Error) -> io::Error {
    if err.raw_os_error() == Some(libc::ENODEV) { io::Error::from(io::ErrorKind::NotFound) } else { err }
}

/// The MTU of interface `name` in the calling thread's network namespace (`SIOCGIFMTU`).
pub(crate) fn interface_mtu(name: &str) -> io::Result<usize> {
    let mut req = ifreq(name)?;
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    // SAFETY: SIOCGIFMTU reads the name from `req` and writes an int into its union; `req`
    // is a valid, writable `ifreq` that outlives the call, and the descriptor is open.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &raw mut req) };
    if rc < 0 {
        return Err(no_device_is_not_found(io::Error::last_os_error()));
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds `ifru_mtu` (and any bit pattern is a
    // valid `c_int` anyway).
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    usize::try_from(mtu)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("MTU {mtu} of {name}")))
}

/// Sets an integer option at level `SOL_PACKET`.
fn set_packet_option(sock: &Socket, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    set_int_option(sock, libc::SOL_PACKET, option, value)
}

/// Sets an integer socket option.
fn set_int_option(
    sock: &Socket,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the value points at a live `c_int` and the length is its size; the descriptor
    // is open for the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            option,
            (&raw const value).cast(),
            socklen_of::<libc::c_int>(),
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Gives the socket buffers of [`PACKET_SOCKET_BUFFER`] bytes each: past `rmem_max` and
/// `wmem_max` where the process may (`SO_RCVBUFFORCE`, `CAP_NET_ADMIN`), within them otherwise.
/// Coalesced segments larger than a ring slot wait in the receive buffer, a 64 KiB one each:
/// the kernel's default room holds three.
fn size_buffers(sock: &Socket) {
    let bytes = libc::c_int::try_from(PACKET_SOCKET_BUFFER).unwrap_or(libc::c_int::MAX);
    if set_int_option(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes).is_err() {
        let _ = sock.set_recv_buffer_size(PACKET_SOCKET_BUFFER);
    }
    if set_int_option(sock, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, bytes).is_err() {
        let _ = sock.set_send_buffer_size(PACKET_SOCKET_BUFFER);
    }
}

/// The size of `T` as a socket length.
fn socklen_of<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
}

/// What a packet socket was set up with.
#[derive(Debug)]
pub(crate) struct PacketFeatures {
    /// Each frame carries a virtio-net header (`PACKET_VNET_HDR`).
    pub(crate) vnet_header: bool,
    /// The receive ring, where the kernel took one.
    pub(crate) ring: Option<RxRing>,
}

/// A packet socket bound to one interface: every frame it receives, promiscuously, and the
/// frames to send on it, many per system call.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    sock: Socket,
}

impl PacketSocket {
    /// Opens a non-blocking packet socket on interface `name` (in the calling thread's
    /// network namespace), with a virtio-net header on every frame when `vnet_header` is
    /// asked for and the kernel takes it.
    ///
    /// With `ring_mtu`, frames are received through a ring shared with the kernel
    /// ([`RxRing`]) with slots for frames of that MTU; larger ones (coalesced segments) are
    /// then read with [`PacketSocket::recv_one`]. Without one, or where the kernel refuses
    /// the ring, with [`PacketSocket::recv_batch`].
    pub(crate) fn open(
        name: &str,
        vnet_header: bool,
        ring_mtu: Option<usize>,
    ) -> io::Result<(PacketSocket, PacketFeatures)> {
        let index = nix::net::if_::if_nametoindex(name)
            .map_err(|e| no_device_is_not_found(io::Error::from(e)))
            .and_then(|i| {
                libc::c_int::try_from(i)
                    .map_err(|_| io::Error::other(format!("interface index {i} of {name}")))
            })?;
        // Protocol 0: the socket receives nothing until it is bound to one interface below.
        let sock = Socket::new(Domain::PACKET, Type::RAW.nonblocking().cloexec(), Some(Protocol::from(0)))?;
        // Best effort: larger buffers absorb bursts between two polls.
        size_buffers(&sock);
        // Before the bind, so that every frame received has the header or none does.
        let vnet_header = vnet_header && set_packet_option(&sock, libc::PACKET_VNET_HDR, 1).is_ok();
        // What this host sends out on the interface is not for this stack (and with the
        // bypass, its own frames do not come back anyway). Best effort: since Linux 4.20.
        let _ = set_packet_option(&sock, libc::PACKET_IGNORE_OUTGOING, 1);
        // Also before the bind: frames go to the ring from the first one on.
        let ring = ring_mtu.and_then(|mtu| RxRing::new(&sock, mtu, vnet_header).ok());
        // SAFETY: `sockaddr_ll` is plain data; all-zero is a valid value of every field.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = AF_PACKET;
        addr.sll_protocol = ETH_P_ALL_BE;
        addr.sll_ifindex = index;
        // SAFETY: the address points at a live `sockaddr_ll` and the length is its size; the
        // descriptor is open.
        let rc = unsafe {
            libc::bind(sock.as_raw_fd(), (&raw const addr).cast(), socklen_of::<libc::sockaddr_ll>())
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // Frames for other MAC addresses too: smoltcp has its own.
        let mreq = libc::packet_mreq {
            mr_ifindex: index,
            mr_type: PACKET_MR_PROMISC,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        // SAFETY: the value points at a live `packet_mreq` and the length is its size; the
        // descriptor is open.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                (&raw const mreq).cast(),
                socklen_of::<libc::packet_mreq>(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((PacketSocket { sock }, PacketFeatures { vnet_header, ring }))
    }

    /// Sends frames past the interface's queueing discipline (`PACKET_QDISC_BYPASS`), and
    /// past other packet sockets (tcpdump), straight to the driver; whether the kernel took
    /// the option. Not for segmentation requests: the kernel drops those on that path
    /// whenever the device cannot take them as they are (a veth, which leaves segments
    /// from user space to be cut in software).
    pub(crate) fn bypass_qdisc(&self) -> bool {
        set_packet_option(&self.sock, libc::PACKET_QDISC_BYPASS, 1).is_ok()
    }

    /// The socket's descriptor.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Receives up to `slots.len()` frames in one system call, each into its slot; their
    /// lengths go to `lens` (0 for a frame that did not fit its slot, which is dropped).
    /// `Ok(0)` when none is waiting.
    pub(crate) fn recv_batch(&self, slots: &mut [Vec<u8>], lens: &mut [usize]) -> io::Result<usize> {
        let n = slots.len().min(lens.len());
        if n == 0 {
            return Ok(0);
        }
        let mut headers = MultiHeaders::<()>::preallocate(n, None);
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> =
            slots.iter_mut().take(n).map(|s| [IoSliceMut::new(s.as_mut_slice())]).collect();
        let results = match recvmmsg(
            self.sock.as_raw_fd(),
            &mut headers,
            iovs.iter_mut(),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
            None,
        ) {
            Ok(results) => results,
            Err(nix::errno::Errno::EAGAIN) => return Ok(0),
            Err(e) => return Err(io::Error::from(e)),
        };
        let mut count = 0;
        for (len, msg) in lens.iter_mut().zip(results) {
            // With MSG_TRUNC the length is the frame's, even when the slot was shorter.
            *len = if msg.flags.contains(MsgFlags::MSG_TRUNC) { 0 } else { msg.bytes };
            count += 1;
        }
        Ok(count)
    }

    /// Frames the kernel dropped for this socket since the last call (its receive ring or
    /// queue was full), from `PACKET_STATISTICS`.
    pub(crate) fn take_drops(&self) -> io::Result<u64> {
        let mut stats = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
        let mut len = socklen_of::<libc::tpacket_stats>();
        // SAFETY: the value and length point at a live, writable `tpacket_stats` and its
        // size, which the kernel fills (at most that many bytes); the descriptor is open.
        let rc = unsafe {
            libc::getsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&raw mut stats).cast(),
                &raw mut len,
            )
        };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(u64::from(stats.tp_drops)) }
    }

    /// Receives one frame from the socket's queue into `buf` (a ring's frame too large for
    /// its slot, copied there by the kernel); its length, 0 when it did not fit (it is
    /// dropped), or `Ok(None)` when none is waiting.
    pub(crate) fn recv_one(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match nix::sys::socket::recv(self.sock.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC)
        {
            // With MSG_TRUNC a packet socket returns the frame's whole length.
            Ok(len) => Ok(Some(if len > buf.len() { 0 } else { len })),
            Err(nix::errno::Errno::EAGAIN) => Ok(None),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    /// Sends `frames` in one system call (as far as the kernel takes them); returns how many
    /// it took, in order. `Ok(0)` or an error for the first one that it refused.
    pub(crate) fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        if frames.is_empty() {
            return Ok(0);
        }
        let mut headers = MultiHeaders::<()>::preallocate(frames.len(), None);
        let iovs: Vec<[IoSlice<'_>; 1]> = frames.iter().map(|f| [IoSlice::new(f)]).collect();
        let addrs: Vec<Option<()>> = vec![None; frames.len()];
        let no_control: [ControlMessage<'_>; 0] = [];
        let sent =
            sendmmsg(self.sock.as_raw_fd(), &mut headers, &iovs, addrs, no_control, MsgFlags::MSG_DONTWAIT)
                .map_err(io::Error::from)?;
        Ok(sent.count())
    }
}

/// Bytes of ring memory per packet socket.
const RING_BYTES: usize = 8 << 20;
/// Bytes per ring block (the unit the kernel allocates; a slot never spans two).
const RING_BLOCK: usize = 1 << 20;
/// Ring slot bytes beyond the frame: the slot header, the address, the virtio-net header,
/// alignment, a VLAN tag.
const RING_SLOT_OVERHEAD: usize = 128;
/// `TPACKET_V2`.
const TPACKET_V2: libc::c_int = 1;

/// A receive ring shared with the kernel (`PACKET_RX_RING`, `TPACKET_V2`): the kernel writes
/// each frame into the next free slot and marks it the user's; the stack reads it there, in
/// place, and gives the slot back. Finding no frame costs no system call, and a frame costs
/// none either. A frame larger than a slot is cut there, and the whole of it queued on the
/// socket (`PACKET_COPY_THRESH`), marked in its slot.
pub(crate) struct RxRing {
    /// The mapping: `slots` slots of `slot_size` bytes, in blocks of [`RING_BLOCK`].
    base: std::ptr::NonNull<u8>,
    len: usize,
    slot_size: usize,
    slots_per_block: usize,
    slots: usize,
    /// Bytes of virtio-net header in front of each frame.
    head: usize,
    /// The next slot to look at.
    next: usize,
    /// The slot handed out and not yet given back, and where its bytes are (header
    /// included).
    held: Option<(usize, std::ops::Range<usize>)>,
}

// SAFETY: the ring owns its mapping (no other handle to it exists in the process); moving the
// owner to another thread moves that exclusive access with it.
unsafe impl Send for RxRing {}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing").field("slots", &self.slots).field("slot_size", &self.slot_size).finish()
    }
}

/// What the kernel says of a frame in a ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingFrame {
    /// The frame is in the slot, whole: `len` bytes (after the virtio-net header, if any).
    Whole { len: usize },
    /// The frame was larger than the slot and is waiting, whole, in the socket's queue.
    Queued,
    /// The frame was larger than the slot and is lost.
    Cut,
}

impl RxRing {
    /// Sets up a ring on `sock` (not yet bound) with slots for frames of interface MTU `mtu`,
    /// and maps it.
    fn new(sock: &Socket, mtu: usize, vnet_header: bool) -> io::Result<RxRing> {
        let slot_size = (mtu.min(65535) + RING_SLOT_OVERHEAD).next_multiple_of(libc::TPACKET_ALIGNMENT);
        let slots_per_block = RING_BLOCK / slot_size;
        let blocks = RING_BYTES / RING_BLOCK;
        if slots_per_block == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("MTU {mtu} too large for a ring"),
            ));
        }
        let to_uint =
            |n: usize| libc::c_uint::try_from(n).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
        set_packet_option(sock, libc::PACKET_VERSION, TPACKET_V2)?;
        // Frames larger than a slot are queued on the socket whole, besides their cut copy.
        set_packet_option(sock, libc::PACKET_COPY_THRESH, 1)?;
        let req = libc::tpacket_req {
            tp_block_size: to_uint(RING_BLOCK)?,
            tp_block_nr: to_uint(blocks)?,
            tp_frame_size: to_uint(slot_size)?,
            tp_frame_nr: to_uint(slots_per_block * blocks)?,
        };
        // SAFETY: the value points at a live `tpacket_req` and the length is its size; the
        // descriptor is open.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_RX_RING,
                (&raw const req).cast(),
                socklen_of::<libc::tpacket_req>(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = RING_BLOCK * blocks;
        // SAFETY: a new shared mapping of the ring the kernel just made for this descriptor,
        // at an address the kernel picks; nothing else in the process refers to it. The
        // mapping outlives the descriptor if need be (the kernel keeps the ring's pages for
        // as long as they are mapped).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                sock.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            std::ptr::NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::other("ring mapped at 0"))?;
        Ok(RxRing {
            base,
            len,
            slot_size,
            slots_per_block,
            slots: slots_per_block * blocks,
            head: if vnet_header { VNET_HDR_LEN } else { 0 },
            next: 0,
            held: None,
        })
    }

    /// Where slot `i` starts in the mapping.
    fn slot_offset(&self, i: usize) -> usize {
        (i / self.slots_per_block) * RING_BLOCK + (i % self.slots_per_block) * self.slot_size
    }

    /// The status word of slot `i`, which the kernel writes concurrently.
    fn status(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        let offset = self.slot_offset(i);
        debug_assert!(offset + std::mem::size_of::<libc::tpacket2_hdr>() <= self.len);
        // SAFETY: the offset is inside the mapping (slot `i` < `slots` lies in one of the
        // blocks) and slot starts are 16-byte aligned, so the pointer is valid and aligned for
        // the slot header's first field, a `u32` the kernel only ever writes whole. The
        // mapping lives as long as `self`, which the returned borrow is tied to.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast::<u32>()) }
    }

    /// The next frame the kernel handed over, if any, which is then held (the one held
    /// before is given back first). Finding none costs no system call.
    pub(crate) fn next(&mut self) -> Option<RingFrame> {
        use std::sync::atomic::Ordering;
        self.give_back();
        let i = self.next;
        // Acquire: the kernel fills the slot, then publishes it by setting its status.
        let status = self.status(i).load(Ordering::Acquire);
        if status & libc::TP_STATUS_USER == 0 {
            return None;
        }
        let offset = self.slot_offset(i);
        // SAFETY: the slot is the user's (status read with acquire above), so the kernel
        // neither writes its header nor frees it until it is given back; the header lies
        // inside the mapping at a 16-byte aligned offset, and a `tpacket2_hdr` is plain data.
        let hdr: libc::tpacket2_hdr =
            unsafe { std::ptr::read(self.base.as_ptr().add(offset).cast::<libc::tpacket2_hdr>()) };
        self.next = (i + 1) % self.slots;
        let (mac, snaplen, len) = (usize::from(hdr.tp_mac), hdr.tp_snaplen as usize, hdr.tp_len as usize);
        let start = mac.checked_sub(self.head);
        let frame = match start {
            Some(start)
                if mac + snaplen <= self.slot_size && start >= std::mem::size_of::<libc::tpacket2_hdr>() =>
            {
                self.held = Some((i, offset + start..offset + mac + snaplen));
                if snaplen == len {
                    RingFrame::Whole { len: snaplen }
                } else if status & libc::TP_STATUS_COPY != 0 {
                    RingFrame::Queued
                } else {
                    RingFrame::Cut
                }
            }
            _ => {
                // Not what the kernel writes; treated as lost.
                self.held = Some((i, offset..offset));
                RingFrame::Cut
            }
        };
        Some(frame)
    }

    /// The bytes of the frame held (virtio-net header first, if any), to read and change in
    /// place.
    pub(crate) fn held(&mut self) -> &mut [u8] {
        let Some((_, range)) = self.held.clone() else { return &mut [] };
        // SAFETY: the range lies inside the held slot (checked in `next` against the slot's
        // size), which is the user's until `give_back`; `give_back` and `next` take `&mut
        // self`, so this borrow ends before the kernel may write the slot again, and no
        // other reference to these bytes exists in the process.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(range.start), range.len()) }
    }

    /// Gives the held slot back to the kernel.
    pub(crate) fn give_back(&mut self) {
        use std::sync::atomic::Ordering;
        if let Some((i, _)) = self.held.take() {
            // Release: every read of the slot happens before the kernel may refill it.
            self.status(i).store(libc::TP_STATUS_KERNEL, Ordering::Release);
        }
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once: no borrow of it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// A TAP device attached to this process: one frame per read or write.
#[derive(Debug)]
pub(crate) struct TapFile {
    file: File,
}

impl TapFile {
    /// Attaches to the existing TAP device `name` (non-blocking, no packet information), with
    /// a virtio-net header on every frame when `vnet_header` is asked for; returns whether the
    /// header is on.
    pub(crate) fn open(name: &str, vnet_header: bool) -> io::Result<(TapFile, bool)> {
        match TapFile::attach(name, vnet_header) {
            Ok(tap) => Ok((tap, vnet_header)),
            // A kernel without the header (or refusing it) still gives plain frames.
            Err(err) if vnet_header && err.raw_os_error() == Some(libc::EINVAL) => {
                TapFile::attach(name, false).map(|tap| (tap, false))
            }
            Err(err) => Err(err),
        }
    }

    fn attach(name: &str, vnet_header: bool) -> io::Result<TapFile> {
        let mut req = ifreq(name)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | if vnet_header { libc::IFF_VNET_HDR } else { 0 };
        req.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).unwrap_or(0);
        // SAFETY: TUNSETIFF reads the name and flags from `req` and may write the name back;
        // `req` is a valid, writable `ifreq` that outlives the call, and the descriptor is
        // open.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &raw mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if vnet_header {
            let size = libc::c_int::try_from(VNET_HDR_LEN).unwrap_or(libc::c_int::MAX);
            // SAFETY: TUNSETVNETHDRSZ reads one `c_int` through the pointer, which points at
            // a live one; the descriptor is open.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &raw const size) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(TapFile { file })
    }

    /// Tells the kernel which offloads this end takes (`TUNSETOFFLOAD`, `TUN_F_*` flags):
    /// what it may hand over, and so what it may be handed.
    pub(crate) fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value (no pointer); the descriptor is
        // open.
        let rc =
            unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETOFFLOAD, libc::c_ulong::from(flags)) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// The descriptor.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Reads one frame; `Ok(0)` when none is waiting.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        match (&self.file).read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            other => other,
        }
    }

    /// Writes one frame.
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }
}

/// Borrows a frame device's descriptor, held beside the device by a stack handle.
///
/// The devices live behind the stack's lock; a handle keeps the raw number beside it so that
/// an engine can register it for readiness without taking the lock.
pub(crate) fn borrow_fd(fd: &RawFd) -> BorrowedFd<'_> {
    // SAFETY: `fd` is the `fd` field of a `SmolStack`, next to the `Arc` that owns the frame
    // device holding the descriptor open (`PacketSocket` or `TapFile`). The device is only
    // dropped with the last handle, so the descriptor stays open for as long as the handle
    // that lends `fd`, which is what the returned borrow's lifetime is tied to.
    unsafe { BorrowedFd::borrow_raw(*fd) }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test patterns wrap on purpose")]
pub(crate) mod tests {
    use super::*;
    use crate::offload::VnetHdr;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// Runs `body` on a thread of its own in a new, private network namespace (gone when the
    /// thread ends, with everything made in it) after running the `ip` commands `setup`
    /// there; `None` (skipped) without root.
    pub(crate) fn in_private_netns<T: Send + 'static>(
        test: &str,
        setup: &'static [&'static [&'static str]],
        body: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        if !iwarp_tests::netns::privileged(test) {
            return None;
        }
        let thread = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            // No IPv6: its multicast listener reports would arrive among the test's frames.
            // (A thread reaches the sysctls of the namespace it is in.)
            for key in ["all", "default"] {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{key}/disable_ipv6"), "1")
                    .expect("disabling IPv6 in the test namespace");
            }
            for args in setup {
                let out = Command::new("ip").args(*args).output().expect("running ip");
                assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            // A veth set up is operational only once the kernel's link watch has run (up to a
            // second later, more under load): until then its queueing discipline drops every
            // frame sent through it. Wait for that, as a program would wait for the link.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let out = Command::new("ip").args(["-o", "link", "show", "type", "veth"]).output();
                let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                if text.lines().all(|l| l.contains("state UP")) || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            body()
        });
        Some(thread.join().expect("the test thread"))
    }

    /// A veth pair `fa`/`fb`, both up, without addresses.
    pub(crate) const VETH: &[&[&str]] = &[
        &["link", "add", "fa", "type", "veth", "peer", "name", "fb"],
        &["link", "set", "fa", "up"],
        &["link", "set", "fb", "up"],
    ];

    /// An Ethernet frame of `len` bytes with a local EtherType and a pattern from `seed`.
    fn test_frame(len: usize, seed: u8) -> Vec<u8> {
        let mut f: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xbb]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xaa]);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f
    }

    /// Receives on `sock` until `want` frames came or 5 s passed.
    fn recv_all(sock: &PacketSocket, want: usize, slot: usize) -> Vec<Vec<u8>> {
        let mut slots = vec![vec![0u8; slot]; 8];
        let mut lens = vec![0; 8];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < deadline {
            let n = sock.recv_batch(&mut slots, &mut lens).unwrap();
            for i in 0..n {
                got.push(slots[i][..lens[i]].to_vec());
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got
    }

    #[test]
    fn constants_match_the_kernel_headers() {
        assert_eq!(i32::from(u16::from_be(ETH_P_ALL_BE)), libc::ETH_P_ALL);
        assert_eq!(i32::from(AF_PACKET), libc::AF_PACKET);
        assert_eq!(i32::from(PACKET_MR_PROMISC), libc::PACKET_MR_PROMISC);
    }

    #[test]
    fn interface_names_are_checked() {
        assert_eq!(interface_mtu("").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(interface_mtu("a-name-that-is-too-long").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(interface_mtu("iwnosuch0").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(interface_mtu("lo").unwrap(), 65536);
    }

    #[test]
    fn frames_cross_a_veth_pair_in_batches() {
        in_private_netns("frames_cross_a_veth_pair_in_batches", VETH, || {
            let (a, fa) = PacketSocket::open("fa", false, None).unwrap();
            let (b, _) = PacketSocket::open("fb", false, None).unwrap();
            assert!(a.bypass_qdisc(), "PACKET_QDISC_BYPASS");
            // Room past rmem_max for the coalesced segments a ring slot cannot hold (root here).
            assert!(a.sock.recv_buffer_size().unwrap() >= PACKET_SOCKET_BUFFER);
            assert!(!fa.vnet_header);
            let frames: Vec<Vec<u8>> = (0..20).map(|i| test_frame(60 + i * 70, i as u8)).collect();
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            assert_eq!(a.send_batch(&refs).unwrap(), frames.len());
            let got = recv_all(&b, frames.len(), 2048);
            assert_eq!(got, frames);
            // A frame longer than its slot is reported with length 0, not cut.
            assert_eq!(a.send_batch(&[&test_frame(1000, 9)]).unwrap(), 1);
            let got = recv_all(&b, 1, 100);
            assert_eq!(got, vec![Vec::<u8>::new()]);
            // Nothing more waits; sending nothing sends nothing.
            assert_eq!(b.recv_batch(&mut [vec![0; 100]], &mut [0]).unwrap(), 0);
            assert_eq!(a.send_batch(&[]).unwrap(), 0);
        });
    }

    #[test]
    fn virtio_headers_travel_with_frames() {
        in_private_netns("virtio_headers_travel_with_frames", VETH, || {
            let (a, fa) = PacketSocket::open("fa", true, None).unwrap();
            let (b, fb) = PacketSocket::open("fb", true, None).unwrap();
            assert!(fa.vnet_header && fb.vnet_header, "PACKET_VNET_HDR");
            let frame = test_frame(200, 1);
            let mut msg = vec![0u8; VNET_HDR_LEN];
            msg.extend_from_slice(&frame);
            assert_eq!(a.send_batch(&[&msg]).unwrap(), 1);
            let got = recv_all(&b, 1, 4096);
            assert_eq!(got.len(), 1);
            let hdr = VnetHdr::parse(&got[0]).unwrap();
            assert!(!hdr.is_gso());
            assert_eq!(&got[0][VNET_HDR_LEN..], &frame[..]);
        });
    }

    #[test]
    fn taps_take_offloads() {
        const TAP: &[&[&str]] =
            &[&["tuntap", "add", "mode", "tap", "name", "ft0"], &["link", "set", "ft0", "up"]];
        in_private_netns("taps_take_offloads", TAP, || {
            assert_eq!(interface_mtu("ft0").unwrap(), 1500);
            let (tap, vnet) = TapFile::open("ft0", true).unwrap();
            assert!(vnet);
            tap.set_offload(TAP_OFFLOAD_TSO).unwrap();
            tap.set_offload(0).unwrap();
            // A frame written with an empty header is taken whole.
            let mut msg = vec![0u8; VNET_HDR_LEN];
            msg.extend_from_slice(&test_frame(100, 3));
            assert_eq!(tap.send(&msg).unwrap(), msg.len());
            drop(tap);
            // Not a TAP device: refused.
            assert!(TapFile::open("lo", false).is_err());
        });
    }

    /// A measurement, not a test (`cargo test --release -p iwarp-netdev -- --ignored
    /// --nocapture frame_path_ceiling`, as root): what the kernel's packet-socket path over a
    /// veth pair carries at MTU 1500 with nothing above it. One thread hands `fa` 64 KiB TCP
    /// segments to cut (as a stack with segmentation offload does, 16 per `sendmmsg`), another
    /// drains `fb`'s receive ring and counts the stream bytes; no TCP, no ACKs, no copies
    /// beyond the kernel's. An upper bound for any stack on this path (docs/architecture.md,
    /// "The smoltcp frame path").
    #[test]
    #[ignore = "a measurement; run it on purpose"]
    fn frame_path_ceiling() {
        use crate::offload::tests as offload_tests;
        use crate::offload::{MAX_IP_PACKET, Offloader};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        const SECONDS: f64 = 3.0;
        in_private_netns("frame_path_ceiling", VETH, || {
            let (tx, f) = PacketSocket::open("fa", true, None).unwrap();
            assert!(f.vnet_header, "no virtio-net header on this kernel");
            let (rx, f) = PacketSocket::open("fb", true, Some(1500)).unwrap();
            let mut ring = f.ring.expect("no receive ring on this kernel");
            // One 64 KiB segment (to a MAC and an address nobody here has); the offloader
            // fills the virtio-net header.
            let mut frame = offload_tests::frame(0x10, None, MAX_IP_PACKET - 40);
            let hdr = Offloader::new(offload_tests::all(), 1500).outgoing(&mut frame);
            assert!(hdr.is_gso());
            let mut msg = vec![0u8; VNET_HDR_LEN];
            hdr.emit((&mut msg[..]).try_into().unwrap());
            msg.extend_from_slice(&frame);
            let stop = Arc::new(AtomicBool::new(false));
            let sender = {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let batch: Vec<&[u8]> = (0..16).map(|_| &msg[..]).collect();
                    let (mut calls, mut sent) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        calls += 1;
                        match tx.send_batch(&batch) {
                            Ok(n) => sent += n as u64,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                            Err(e) => panic!("sendmmsg: {e}"),
                        }
                    }
                    (calls, sent)
                })
            };
            let start = Instant::now();
            let cpu = || {
                let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
                ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
            };
            let cpu0 = cpu();
            let (mut frames, mut bytes, mut big) = (0u64, 0u64, 0u64);
            while start.elapsed().as_secs_f64() < SECONDS {
                match ring.next() {
                    Some(RingFrame::Whole { len }) => {
                        frames += 1;
                        bytes += len.saturating_sub(VNET_HDR_LEN + 54) as u64;
                        ring.give_back();
                    }
                    Some(_) => {
                        big += 1;
                        ring.give_back();
                    }
                    None => std::hint::spin_loop(),
                }
            }
            let secs = start.elapsed().as_secs_f64();
            let cpu_secs = cpu() - cpu0;
            stop.store(true, Ordering::Relaxed);
            let (calls, sent) = sender.join().unwrap();
            let drops = rx.take_drops().unwrap_or(0);
            println!(
                "frame path, MTU 1500: {:.3} GB/s of stream received in {frames} frames ({:.0} kframes/s, {big} too large for a slot), \
                 {sent} segments of 64 KiB sent in {calls} calls, {drops} frames dropped by the kernel, {:.2} cores busy",
                bytes as f64 / secs / 1e9,
                frames as f64 / secs / 1e3,
                cpu_secs / secs
            );
        });
    }
}
