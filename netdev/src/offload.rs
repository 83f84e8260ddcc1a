//! Segmentation and checksum offload between smoltcp and the kernel, as a virtio NIC offloads
//! for its guest.
//!
//! A TAP device opened with `IFF_VNET_HDR` and a packet socket with `PACKET_VNET_HDR` put a
//! 10-byte virtio-net header ([`VnetHdr`]) in front of every frame. Going out, it asks the
//! kernel to fill the TCP checksum (`NEEDS_CSUM`) and to cut a TCP segment larger than the
//! wire allows into MSS-sized ones (GSO, done by the NIC where it has TSO); coming in, it says
//! whether the kernel already knows the checksum to be good (`DATA_VALID`), or that the frame
//! never crossed a wire and its checksum was never computed (`NEEDS_CSUM`: a local sender's
//! partial checksum, or segments the kernel coalesced, GRO).
//!
//! smoltcp sends no segment larger than the peer's MSS option, so for TSO the device keeps
//! two views of the MSS ([`Offloader`]): the peer's real one, remembered per connection from
//! its SYN and used as the segment size the kernel cuts to, and a large one written into the
//! SYN before smoltcp reads it, so that smoltcp hands over segments of up to 64 KiB. The MSS
//! this stack advertises is clamped back to the wire's on the way out, so peers never see
//! anything but the wire's sizes.
//!
//! Frames here are Ethernet frames; only IPv4/TCP ones are looked into, everything else
//! passes untouched. Nothing here panics on malformed frames: those pass unchanged and
//! smoltcp drops them.

use std::collections::HashMap;
use std::fmt;

/// Bytes of the virtio-net header in front of each frame (`struct virtio_net_hdr`; the
/// `num_buffers` field of the mergeable-buffers variant is not used).
pub(crate) const VNET_HDR_LEN: usize = 10;
/// Ethernet header bytes.
const ETH_LEN: usize = 14;
/// The IPv4 EtherType.
const ETHERTYPE_IPV4: u16 = 0x0800;
/// IP protocol number of TCP.
const PROTO_TCP: u8 = 6;
/// Offset of the checksum in the TCP header.
const TCP_CHECKSUM_AT: u16 = 16;
/// The largest IPv4 packet: what a TCP segment handed over for segmentation may fill.
pub(crate) const MAX_IP_PACKET: usize = 65535;
/// IPv4 and TCP headers without options.
const MIN_HEADERS: usize = 40;

/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum is partial (covers the pseudo-header only) and
/// the rest is to be summed from `csum_start`, the result stored at `csum_offset` from there.
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the kernel (or NIC) checked the checksum and found it good.
const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_ECN` (a flag on the GSO type).
const GSO_ECN: u8 = 0x80;

/// What the kernel says about a received frame's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxChecksum {
    /// Nothing: the frame is as it came off the wire, its checksum unchecked.
    Unknown,
    /// The kernel or the NIC checked it and found it good.
    Valid,
    /// Partial: the sender was local (or the kernel coalesced segments) and left the sum to
    /// be finished; no wire carried the frame, there is nothing to check.
    Partial,
}

/// The virtio-net header (`struct virtio_net_hdr`), fields in the host's byte order (packet
/// sockets always use it; TAP devices do for a little-endian host, which is what the device
/// asks for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VnetHdr {
    flags: u8,
    gso_type: u8,
    hdr_len: u16,
    gso_size: u16,
    csum_start: u16,
    csum_offset: u16,
}

impl VnetHdr {
    /// Reads a header; `None` if `bytes` is shorter than one.
    pub(crate) fn parse(bytes: &[u8]) -> Option<VnetHdr> {
        let b: &[u8; VNET_HDR_LEN] = bytes.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// Writes the header into the first [`VNET_HDR_LEN`] bytes of `out` (which must hold
    /// them).
    pub(crate) fn emit(&self, out: &mut [u8; VNET_HDR_LEN]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }

    /// The checksum state of a received frame.
    pub(crate) fn rx_checksum(&self) -> RxChecksum {
        if self.flags & F_NEEDS_CSUM != 0 {
            RxChecksum::Partial
        } else if self.flags & F_DATA_VALID != 0 {
            RxChecksum::Valid
        } else {
            RxChecksum::Unknown
        }
    }

    /// Whether the frame is a segmentation request (or a coalesced segment).
    pub(crate) fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != 0
    }

    /// The segment size of a segmentation request.
    #[cfg(test)]
    pub(crate) fn gso_size(&self) -> u16 {
        self.gso_size
    }
}

/// The offloads a frame device uses: what the kernel (and the NIC behind it) does for the
/// stack, and how frames cross into the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Offloads {
    /// Frames carry a virtio-net header: the kernel says per frame whether it knows the
    /// checksum good, and takes checksum and segmentation requests.
    pub vnet_header: bool,
    /// Transmit checksum offload: the kernel (or the NIC) computes TCP checksums.
    pub tx_checksum: bool,
    /// Receive checksum offload: frames the kernel vouches for are not summed again; the
    /// others still are, in software, and dropped when wrong.
    pub rx_checksum: bool,
    /// TCP segmentation offload (TSO/GSO): smoltcp hands over TCP segments of up to 64 KiB,
    /// cut to the wire's MSS by the kernel or the NIC.
    pub tso: bool,
    /// Receive coalescing (GRO/LRO): the kernel hands over TCP segments larger than the
    /// wire's, already checked.
    pub gro: bool,
    /// Many frames per system call (`sendmmsg`, and `recvmmsg` where there is no receive
    /// ring, on a packet socket; a TAP device takes one frame per call).
    pub batched_io: bool,
    /// Frames are received through a ring shared with the kernel (`PACKET_RX_RING`): no
    /// system call per frame, nor to find that none is there.
    pub rx_ring: bool,
    /// Frames sent skip the interface's queueing discipline (`PACKET_QDISC_BYPASS`): less
    /// work per frame, but other packet sockets (tcpdump) no longer see what this stack
    /// sends.
    pub qdisc_bypass: bool,
}

impl fmt::Display for Offloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (self.tso, "tso"),
            (self.gro, "gro"),
            (self.tx_checksum, "tx-csum"),
            (self.rx_checksum, "rx-csum"),
            (self.vnet_header, "vnet-hdr"),
            (self.rx_ring, "rx-ring"),
            (self.batched_io, "mmsg"),
            (self.qdisc_bypass, "qdisc-bypass"),
        ];
        let mut first = true;
        for (on, name) in names {
            if on {
                if !first {
                    f.write_str(" ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// Whether a frame device asks the kernel for offloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// Every offload the device offers (the default); none where it offers none.
    #[default]
    Auto,
    /// None: smoltcp computes and checks every checksum and sends wire-sized segments.
    Off,
}

/// What happened to a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxVerdict {
    /// Hand it to smoltcp.
    Pass,
    /// Its TCP checksum is wrong (checked in software because smoltcp does not check): drop.
    BadChecksum,
}

/// A connection, as the device sees it: the peer's address and port and the local port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    peer: [u8; 4],
    peer_port: u16,
    local_port: u16,
}

/// What the device remembers of a connection.
#[derive(Debug, Clone, Copy)]
struct Flow {
    /// The MSS in the peer's SYN.
    mss: u16,
    /// FINs seen: bit 0 from the peer, bit 1 from this stack.
    fins: u8,
}

/// At most this many connections' MSS are remembered; past it, segments of a forgotten
/// connection are cut to the wire's largest.
const MAX_FLOWS: usize = 65536;

/// The device's side of the offloads: prepares outgoing frames and looks at incoming ones.
#[derive(Debug)]
pub(crate) struct Offloader {
    offloads: Offloads,
    /// The wire's MTU (largest IP packet).
    wire_mtu: usize,
    flows: HashMap<FlowKey, Flow>,
}

/// The IPv4/TCP layout of a frame: offsets and lengths, all checked against the frame.
#[derive(Debug, Clone, Copy)]
struct TcpFrame {
    /// Where the IPv4 header starts (after Ethernet).
    ip: usize,
    /// Where the TCP header starts.
    tcp: usize,
    /// TCP header length with options.
    tcp_len: usize,
    /// Where the IPv4 packet ends (its total length).
    end: usize,
}

impl TcpFrame {
    /// The layout of an unfragmented IPv4/TCP frame, or `None` for anything else (or a
    /// malformed frame).
    fn parse(frame: &[u8]) -> Option<TcpFrame> {
        let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
        if ethertype != ETHERTYPE_IPV4 {
            return None;
        }
        let ip = ETH_LEN;
        let ver_ihl = *frame.get(ip)?;
        let ihl = usize::from(ver_ihl & 0x0f) * 4;
        if ver_ihl >> 4 != 4 || ihl < 20 {
            return None;
        }
        let total = usize::from(u16::from_be_bytes([*frame.get(ip + 2)?, *frame.get(ip + 3)?]));
        let frag = u16::from_be_bytes([*frame.get(ip + 6)?, *frame.get(ip + 7)?]);
        // A fragment (more fragments, or an offset) is not a whole TCP segment.
        if frag & 0x3fff != 0 || *frame.get(ip + 9)? != PROTO_TCP {
            return None;
        }
        let tcp = ip + ihl;
        let end = ip + total;
        if total < ihl + 20 || end > frame.len() {
            return None;
        }
        let tcp_len = usize::from(*frame.get(tcp + 12)? >> 4) * 4;
        if tcp_len < 20 || tcp + tcp_len > end {
            return None;
        }
        Some(TcpFrame { ip, tcp, tcp_len, end })
    }

    fn flags(&self, frame: &[u8]) -> u8 {
        frame[self.tcp + 13]
    }

    fn is_syn(&self, frame: &[u8]) -> bool {
        self.flags(frame) & 0x02 != 0
    }

    fn payload_len(&self) -> usize {
        self.end - self.tcp - self.tcp_len
    }

    fn ip_header_len(&self) -> usize {
        self.tcp - self.ip
    }

    /// The MSS option's value field (two bytes), if the header has one.
    fn mss_option(&self, frame: &[u8]) -> Option<usize> {
        let mut at = self.tcp + 20;
        let end = self.tcp + self.tcp_len;
        while at < end {
            match frame[at] {
                0 => return None,
                1 => at += 1,
                kind => {
                    let len = usize::from(*frame.get(at + 1)?);
                    if len < 2 || at + len > end {
                        return None;
                    }
                    if kind == 2 && len == 4 {
                        return Some(at + 2);
                    }
                    at += len;
                }
            }
        }
        None
    }

    /// The key of the connection: `incoming` frames come from the peer.
    fn flow(&self, frame: &[u8], incoming: bool) -> FlowKey {
        let (src, dst) = (self.ip + 12, self.ip + 16);
        let port = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
        let (sport, dport) = (port(self.tcp), port(self.tcp + 2));
        let addr = |at: usize| [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
        if incoming {
            FlowKey { peer: addr(src), peer_port: sport, local_port: dport }
        } else {
            FlowKey { peer: addr(dst), peer_port: dport, local_port: sport }
        }
    }

    /// The ones' complement sum of the TCP pseudo-header (addresses, protocol, TCP length).
    fn pseudo_header_sum(&self, frame: &[u8]) -> u64 {
        let tcp_len = self.end - self.tcp;
        sum_words(&frame[self.ip + 12..self.ip + 20]) + u64::from(PROTO_TCP) + tcp_len as u64
    }

    /// Whether the TCP checksum (pseudo-header, header and payload) is right.
    fn checksum_ok(&self, frame: &[u8]) -> bool {
        fold(self.pseudo_header_sum(frame) + sum_words(&frame[self.tcp..self.end])) == 0xffff
    }

    /// Computes the full TCP checksum and stores it.
    fn fill_checksum(&self, frame: &mut [u8]) {
        let at = self.tcp + usize::from(TCP_CHECKSUM_AT);
        frame[at..at + 2].fill(0);
        let sum = fold(self.pseudo_header_sum(frame) + sum_words(&frame[self.tcp..self.end]));
        frame[at..at + 2].copy_from_slice(&(!sum).to_be_bytes());
    }

    /// Stores the pseudo-header sum (not complemented) where the checksum goes, as a
    /// `NEEDS_CSUM` frame carries it: the kernel or the NIC adds the rest.
    fn fill_partial_checksum(&self, frame: &mut [u8]) {
        let at = self.tcp + usize::from(TCP_CHECKSUM_AT);
        let sum = fold(self.pseudo_header_sum(frame));
        frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    }
}

/// The ones' complement sum of `bytes` as big-endian 16-bit words (a last odd byte padded
/// with zero), not yet folded: [`fold`] finishes it. Sums 32-bit words into 64 bits, which
/// cannot overflow for any frame.
fn sum_words(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(4);
    let mut sum: u64 = 0;
    for c in &mut chunks {
        sum += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    match *chunks.remainder() {
        [a, b, c] => sum += u64::from(u32::from_be_bytes([a, b, c, 0])),
        [a, b] => sum += u64::from(u32::from_be_bytes([a, b, 0, 0])),
        [a] => sum += u64::from(u32::from_be_bytes([a, 0, 0, 0])),
        _ => {}
    }
    sum
}

/// Folds a wide ones' complement sum to 16 bits.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 0xffff.
    u16::try_from(sum).unwrap_or(0xffff)
}

impl Offloader {
    /// An offloader for a device whose wire MTU is `wire_mtu`, using `offloads`.
    pub(crate) fn new(offloads: Offloads, wire_mtu: usize) -> Offloader {
        Offloader { offloads, wire_mtu, flows: HashMap::new() }
    }

    /// The offloads in use.
    pub(crate) fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// The largest IP packet smoltcp may emit: 64 KiB with TSO, the wire's MTU without.
    pub(crate) fn stack_mtu(&self) -> usize {
        if self.offloads.tso { MAX_IP_PACKET } else { self.wire_mtu }
    }

    /// smoltcp's TCP checksum capability: whether it computes checksums of what it sends, and
    /// whether it checks those of what it receives (the device or the kernel does what it
    /// does not).
    pub(crate) fn stack_tcp_checksum(&self) -> smoltcp::phy::Checksum {
        use smoltcp::phy::Checksum;
        match (self.offloads.tx_checksum, self.offloads.rx_checksum) {
            (false, false) => Checksum::Both,
            (true, false) => Checksum::Rx,
            (false, true) => Checksum::Tx,
            (true, true) => Checksum::None,
        }
    }

    /// The MSS this stack advertises on the wire.
    fn wire_mss(&self) -> u16 {
        u16::try_from(self.wire_mtu.saturating_sub(MIN_HEADERS)).unwrap_or(u16::MAX)
    }

    /// Connections whose MSS is remembered (for tests and statistics).
    #[cfg(test)]
    fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Prepares a frame smoltcp emitted for the kernel and returns its virtio-net header:
    /// clamps an advertised MSS to the wire's, asks for the TCP checksum to be computed
    /// (leaving the pseudo-header sum in its place) and for a segment larger than the wire
    /// takes to be cut to the peer's MSS.
    pub(crate) fn outgoing(&mut self, frame: &mut [u8]) -> VnetHdr {
        let Some(t) = TcpFrame::parse(frame) else { return VnetHdr::default() };
        let mut hdr = VnetHdr::default();
        let key = t.flow(frame, false);
        let flags = t.flags(frame);
        if flags & 0x04 != 0 {
            self.flows.remove(&key);
        } else if flags & 0x01 != 0 {
            self.fin(key, 0b10);
        }
        if self.offloads.tso
            && t.is_syn(frame)
            && let Some(at) = t.mss_option(frame)
        {
            let mss = u16::from_be_bytes([frame[at], frame[at + 1]]).min(self.wire_mss());
            frame[at..at + 2].copy_from_slice(&mss.to_be_bytes());
            // The checksum is filled below: TSO goes with transmit checksum offload.
        }
        if self.offloads.tx_checksum {
            t.fill_partial_checksum(frame);
            hdr.flags = F_NEEDS_CSUM;
            hdr.csum_start = u16::try_from(t.tcp).unwrap_or(u16::MAX);
            hdr.csum_offset = TCP_CHECKSUM_AT;
        }
        if self.offloads.tso {
            // What one wire segment of this connection may carry.
            let wire = self.wire_mtu.saturating_sub(t.ip_header_len() + t.tcp_len);
            let seg = self.flows.get(&key).map_or(wire, |f| usize::from(f.mss).min(wire));
            if t.payload_len() > seg && seg > 0 {
                hdr.gso_type = GSO_TCPV4;
                hdr.gso_size = u16::try_from(seg).unwrap_or(u16::MAX);
                hdr.hdr_len = u16::try_from(t.tcp + t.tcp_len).unwrap_or(u16::MAX);
            }
        }
        hdr
    }

    /// Looks at a received frame before smoltcp does: checks its TCP checksum where smoltcp
    /// does not and the kernel has not, finishes a partial one where smoltcp checks, and with
    /// TSO remembers a peer's MSS and shows smoltcp a large one instead.
    pub(crate) fn incoming(&mut self, frame: &mut [u8], checksum: RxChecksum) -> RxVerdict {
        let Some(t) = TcpFrame::parse(frame) else { return RxVerdict::Pass };
        if !self.offloads.rx_checksum {
            if checksum == RxChecksum::Partial {
                // smoltcp checks every checksum: give it a whole one.
                t.fill_checksum(frame);
            }
        } else if checksum == RxChecksum::Unknown && !t.checksum_ok(frame) {
            // smoltcp does not check: nobody vouched for this one, so check it here.
            return RxVerdict::BadChecksum;
        }
        let key = t.flow(frame, true);
        let flags = t.flags(frame);
        if flags & 0x04 != 0 {
            self.flows.remove(&key);
            return RxVerdict::Pass;
        }
        if flags & 0x01 != 0 {
            self.fin(key, 0b01);
        }
        if self.offloads.tso
            && t.is_syn(frame)
            && let Some(at) = t.mss_option(frame)
        {
            if !self.offloads.rx_checksum && checksum == RxChecksum::Unknown && !t.checksum_ok(frame) {
                // Left as it is for smoltcp to drop: a checksum filled after the change below
                // would hide the damage.
                return RxVerdict::Pass;
            }
            let mss = u16::from_be_bytes([frame[at], frame[at + 1]]);
            if self.flows.len() >= MAX_FLOWS && !self.flows.contains_key(&key) {
                // Forget one connection; its segments are then cut to the wire's largest.
                if let Some(old) = self.flows.keys().next().copied() {
                    self.flows.remove(&old);
                }
            }
            self.flows.insert(key, Flow { mss, fins: 0 });
            let big = u16::try_from(self.stack_mtu() - MIN_HEADERS).unwrap_or(u16::MAX);
            frame[at..at + 2].copy_from_slice(&big.max(mss).to_be_bytes());
            if !self.offloads.rx_checksum {
                // smoltcp checks this checksum (already found good above, or by the kernel).
                t.fill_checksum(frame);
            }
        }
        RxVerdict::Pass
    }

    /// Notes a FIN (`bit`: 1 from the peer, 2 from this stack); forgets the connection once
    /// both directions are closed.
    fn fin(&mut self, key: FlowKey, bit: u8) {
        if let Some(flow) = self.flows.get_mut(&key) {
            flow.fins |= bit;
            if flow.fins == 0b11 {
                self.flows.remove(&key);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test patterns wrap on purpose")]
pub(crate) mod tests {
    use super::*;

    /// An Ethernet/IPv4/TCP frame from 10.0.0.1:1000 to 10.0.0.2:2000 with `flags`, an MSS
    /// option when given, and `payload` bytes, with valid IPv4 and TCP checksums.
    pub(crate) fn frame(flags: u8, mss: Option<u16>, payload: usize) -> Vec<u8> {
        let opts = if mss.is_some() { 4 } else { 0 };
        let tcp_len = 20 + opts;
        let total = 20 + tcp_len + payload;
        let mut f = vec![0u8; ETH_LEN + total];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETH_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = PROTO_TCP;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let ip_sum = fold(sum_words(&ip[..20]));
        ip[10..12].copy_from_slice(&(!ip_sum).to_be_bytes());
        let tcp = &mut ip[20..];
        tcp[0..2].copy_from_slice(&1000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&2000u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&7u32.to_be_bytes());
        tcp[12] = u8::try_from(tcp_len / 4).unwrap() << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
        if let Some(mss) = mss {
            tcp[20] = 2;
            tcp[21] = 4;
            tcp[22..24].copy_from_slice(&mss.to_be_bytes());
        }
        for (i, b) in tcp[tcp_len..].iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let t = TcpFrame::parse(&f).unwrap();
        t.fill_checksum(&mut f);
        f
    }

    /// Every offload a packet socket with a virtio-net header can have.
    pub(crate) fn all() -> Offloads {
        Offloads { vnet_header: true, tx_checksum: true, rx_checksum: true, tso: true, ..Offloads::default() }
    }

    /// The same frame seen from the other end (addresses and ports swapped).
    fn reversed(mut f: Vec<u8>) -> Vec<u8> {
        let ip = ETH_LEN;
        let (a, b) = (f[ip + 12..ip + 16].to_vec(), f[ip + 16..ip + 20].to_vec());
        f[ip + 12..ip + 16].copy_from_slice(&b);
        f[ip + 16..ip + 20].copy_from_slice(&a);
        let tcp = ip + 20;
        let (p, q) = (f[tcp..tcp + 2].to_vec(), f[tcp + 2..tcp + 4].to_vec());
        f[tcp..tcp + 2].copy_from_slice(&q);
        f[tcp + 2..tcp + 4].copy_from_slice(&p);
        TcpFrame::parse(&f).unwrap().fill_checksum(&mut f);
        f
    }

    #[test]
    fn header_round_trip() {
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        let mut out = [0u8; VNET_HDR_LEN];
        hdr.emit(&mut out);
        assert_eq!(VnetHdr::parse(&out), Some(hdr));
        assert!(hdr.is_gso());
        assert_eq!(hdr.rx_checksum(), RxChecksum::Partial);
        assert_eq!(VnetHdr::parse(&out[..9]), None);
        let valid = VnetHdr { flags: F_DATA_VALID, ..VnetHdr::default() };
        assert_eq!(valid.rx_checksum(), RxChecksum::Valid);
        assert_eq!(VnetHdr::default().rx_checksum(), RxChecksum::Unknown);
        assert!(!VnetHdr { gso_type: GSO_ECN, ..VnetHdr::default() }.is_gso());
    }

    #[test]
    fn checksum_matches_a_known_segment() {
        // The sum over a frame with its checksum in place folds to all ones.
        for payload in [0, 1, 2, 3, 1447, 9000] {
            let f = frame(0x18, None, payload);
            let t = TcpFrame::parse(&f).unwrap();
            assert!(t.checksum_ok(&f), "payload {payload}");
            let mut bad = f.clone();
            let last = bad.len() - 1;
            bad[last] ^= 0x40;
            assert!(payload == 0 || !t.checksum_ok(&bad), "payload {payload}");
        }
        // RFC 1071's example: 0001 f203 f4f5 f6f7 sums to ddf2.
        assert_eq!(fold(sum_words(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])), 0xddf2);
    }

    #[test]
    fn outgoing_segments_are_offloaded() {
        let mut o = Offloader::new(all(), 1500);
        // The peer's SYN: its MSS is remembered and smoltcp is shown a large one.
        let mut syn = reversed(frame(0x02, Some(1400), 0));
        assert_eq!(o.incoming(&mut syn, RxChecksum::Unknown), RxVerdict::Pass);
        let t = TcpFrame::parse(&syn).unwrap();
        let at = t.mss_option(&syn).unwrap();
        assert_eq!(u16::from_be_bytes([syn[at], syn[at + 1]]), 65495);
        assert_eq!(o.flows(), 1);
        // Our SYN-ACK: the large MSS smoltcp advertises is clamped to the wire's.
        let mut synack = frame(0x12, Some(65495), 0);
        let hdr = o.outgoing(&mut synack);
        let t = TcpFrame::parse(&synack).unwrap();
        let at = t.mss_option(&synack).unwrap();
        assert_eq!(u16::from_be_bytes([synack[at], synack[at + 1]]), 1460);
        assert_eq!(hdr.flags, F_NEEDS_CSUM);
        assert!(!hdr.is_gso());
        // A 64 KiB segment is cut to the peer's MSS, its checksum left partial.
        let mut big = frame(0x18, None, 60000);
        let hdr = o.outgoing(&mut big);
        assert!(hdr.is_gso());
        assert_eq!((hdr.gso_size(), hdr.hdr_len, hdr.csum_start, hdr.csum_offset), (1400, 54, 34, 16));
        let t = TcpFrame::parse(&big).unwrap();
        let partial = u16::from_be_bytes([big[t.tcp + 16], big[t.tcp + 17]]);
        assert_eq!(partial, fold(t.pseudo_header_sum(&big)));
        // A small one is not.
        let mut small = frame(0x18, None, 1000);
        assert!(!o.outgoing(&mut small).is_gso());
        // Both FINs forget the connection.
        o.outgoing(&mut frame(0x11, None, 0));
        assert_eq!(o.flows(), 1);
        o.incoming(&mut reversed(frame(0x11, None, 0)), RxChecksum::Valid);
        assert_eq!(o.flows(), 0);
        // A connection not remembered is cut to the wire's largest segment.
        let hdr = o.outgoing(&mut frame(0x18, None, 60000));
        assert_eq!(hdr.gso_size(), 1460);
    }

    #[test]
    fn received_checksums_are_checked_unless_vouched_for() {
        let mut o = Offloader::new(all(), 1500);
        let mut bad = frame(0x18, None, 100);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(o.incoming(&mut bad.clone(), RxChecksum::Unknown), RxVerdict::BadChecksum);
        assert_eq!(o.incoming(&mut bad.clone(), RxChecksum::Valid), RxVerdict::Pass);
        assert_eq!(o.incoming(&mut bad, RxChecksum::Partial), RxVerdict::Pass);
        assert_eq!(o.incoming(&mut frame(0x18, None, 100), RxChecksum::Unknown), RxVerdict::Pass);
    }

    #[test]
    fn without_offloads_frames_stay_whole_and_partial_sums_are_finished() {
        let mut o = Offloader::new(Offloads::default(), 1500);
        assert_eq!(o.stack_mtu(), 1500);
        assert!(matches!(o.stack_tcp_checksum(), smoltcp::phy::Checksum::Both));
        let mut f = frame(0x18, None, 3000);
        let before = f.clone();
        assert_eq!(o.outgoing(&mut f), VnetHdr::default());
        assert_eq!(f, before);
        // A partial checksum (a local sender's) is finished so that smoltcp's check passes.
        let t = TcpFrame::parse(&f).unwrap();
        t.fill_partial_checksum(&mut f);
        assert!(!t.checksum_ok(&f));
        assert_eq!(o.incoming(&mut f, RxChecksum::Partial), RxVerdict::Pass);
        assert!(t.checksum_ok(&f));
        // The SYN's MSS is left as it is.
        let mut syn = reversed(frame(0x02, Some(1400), 0));
        let before = syn.clone();
        o.incoming(&mut syn, RxChecksum::Unknown);
        assert_eq!(syn, before);
    }

    #[test]
    fn malformed_frames_pass_untouched() {
        let mut o = Offloader::new(all(), 1500);
        let good = frame(0x02, Some(1400), 0);
        for cut in 0..good.len() {
            let mut f = good[..cut].to_vec();
            let before = f.clone();
            assert_eq!(o.incoming(&mut f, RxChecksum::Unknown), RxVerdict::Pass);
            assert_eq!(o.outgoing(&mut f), VnetHdr::default());
            assert_eq!(f, before, "cut at {cut}");
        }
        // A bad option length ends the option walk.
        let mut f = good.clone();
        f[ETH_LEN + 20 + 21] = 0;
        assert!(TcpFrame::parse(&f).unwrap().mss_option(&f).is_none());
        // Not IPv4: untouched.
        let mut arp = good;
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let before = arp.clone();
        assert_eq!(o.outgoing(&mut arp), VnetHdr::default());
        assert_eq!(arp, before);
    }

    #[test]
    fn offloads_are_named() {
        assert_eq!(Offloads::default().to_string(), "none");
        assert_eq!(all().to_string(), "tso tx-csum rx-csum vnet-hdr");
    }
}
