//! TCP: from captured packets to the two byte streams of each connection.
//!
//! Each direction of a connection has a [`Reassembler`]: segments are placed by sequence number
//! (wrapping 32-bit arithmetic, unwrapped against the highest offset seen so far), segments
//! that arrive early wait until the hole before them is filled, and bytes seen twice
//! (retransmissions) are kept from the first copy, with a note when a later copy differs. When
//! the capture misses segments (it started mid-connection, or it was truncated or lossy), the
//! direction has holes: the contiguous prefix is decoded and the holes are reported as gaps.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};

use super::capture::{
    LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL, LINKTYPE_NULL, LINKTYPE_RAW, Packet,
};

/// One TCP segment taken out of a captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment<'a> {
    /// Frame number of the packet.
    pub frame: usize,
    /// Capture timestamp.
    pub timestamp: Duration,
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
    /// Sequence number of the first payload octet (or of the SYN).
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// ACK flag.
    pub ack: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// The payload.
    pub payload: &'a [u8],
}

/// What a packet held, TCP-wise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A TCP segment.
    Tcp(Segment<'a>),
    /// Something else (ARP, UDP, ICMP, an IP fragment, ...).
    Other,
    /// A link type this dissector does not decode.
    UnsupportedLink(u32),
    /// Headers that do not parse (or a packet cut short by the capture's snap length).
    Malformed(String),
}

/// Decodes the link, IP and TCP headers of a packet.
pub fn decode<'a>(packet: &Packet<'a>) -> Decoded<'a> {
    let sliced = match packet.link_type {
        LINKTYPE_ETHERNET => SlicedPacket::from_ethernet(packet.data),
        LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => SlicedPacket::from_ip(packet.data),
        LINKTYPE_LINUX_SLL => SlicedPacket::from_linux_sll(packet.data),
        LINKTYPE_NULL => match packet.data.get(4..) {
            Some(ip) => SlicedPacket::from_ip(ip),
            None => return Decoded::Malformed("loopback header cut short".to_string()),
        },
        other => return Decoded::UnsupportedLink(other),
    };
    let sliced = match sliced {
        Ok(s) => s,
        Err(e) => return Decoded::Malformed(e.to_string()),
    };
    let (src_ip, dst_ip, fragmented) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => (
            IpAddr::V4(v4.header().source_addr()),
            IpAddr::V4(v4.header().destination_addr()),
            v4.payload().fragmented,
        ),
        Some(NetSlice::Ipv6(v6)) => (
            IpAddr::V6(v6.header().source_addr()),
            IpAddr::V6(v6.header().destination_addr()),
            v6.payload().fragmented,
        ),
        None => return Decoded::Other,
    };
    if fragmented {
        return Decoded::Other;
    }
    let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else { return Decoded::Other };
    Decoded::Tcp(Segment {
        frame: packet.number,
        timestamp: packet.timestamp,
        src: SocketAddr::new(src_ip, tcp.source_port()),
        dst: SocketAddr::new(dst_ip, tcp.destination_port()),
        seq: tcp.sequence_number(),
        syn: tcp.syn(),
        ack: tcp.ack(),
        fin: tcp.fin(),
        rst: tcp.rst(),
        payload: tcp.payload(),
    })
}

/// A hole in a reassembled stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Gap {
    /// Stream offset of the first missing octet.
    pub offset: u64,
    /// Octets missing.
    pub len: u64,
}

/// A retransmission whose bytes differ from the first copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    /// Frame number of the differing copy.
    pub frame: usize,
    /// Stream offset of the first differing octet.
    pub offset: u64,
}

/// Reassembles one direction of a TCP connection.
#[derive(Debug, Clone, Default)]
pub struct Reassembler {
    /// Sequence number of stream offset 0.
    base: Option<u32>,
    /// Whether offset 0 is the real start of the stream (the SYN was seen).
    syn_seen: bool,
    /// Highest stream offset reached (end of the furthest segment), for unwrapping.
    high: u64,
    /// The contiguous bytes from offset 0.
    data: Vec<u8>,
    /// Which frame delivered each appended range: (start offset, frame).
    frames: Vec<(u64, usize)>,
    /// Segments beyond a hole: offset -> (frame, bytes).
    pending: BTreeMap<u64, (usize, Vec<u8>)>,
    /// Bytes that arrived before offset 0 (mid-connection captures) and were dropped.
    dropped_before_start: u64,
    conflicts: Vec<Conflict>,
    fin: Option<u64>,
    rst: bool,
}

impl Reassembler {
    /// An empty reassembler: offset 0 is set by the SYN or, failing that, the first segment.
    pub fn new() -> Reassembler {
        Reassembler::default()
    }

    /// Stream offset of sequence number `seq`, or `None` when it lies before offset 0.
    fn offset(&self, base: u32, seq: u32) -> Option<u64> {
        let rel = seq.wrapping_sub(base);
        // Unwrap against the highest offset seen: the nearest candidate wins.
        let high_lo = u32::try_from(self.high & 0xffff_ffff).unwrap_or(0);
        let diff = i64::from(rel.wrapping_sub(high_lo) as i32);
        let abs = i64::try_from(self.high).ok()?.checked_add(diff)?;
        u64::try_from(abs).ok()
    }

    /// Feeds one segment of this direction.
    pub fn handle_segment(
        &mut self,
        frame: usize,
        seq: u32,
        syn: bool,
        fin: bool,
        rst: bool,
        payload: &[u8],
    ) {
        if rst {
            self.rst = true;
        }
        let data_seq = if syn { seq.wrapping_add(1) } else { seq };
        if syn && (self.base.is_none() || (!self.syn_seen && self.data.is_empty() && self.pending.is_empty()))
        {
            self.base = Some(data_seq);
            self.syn_seen = true;
        }
        if self.base.is_none() && (!payload.is_empty() || fin) {
            self.base = Some(data_seq);
        }
        let Some(base) = self.base else { return };
        let (off, payload) = match self.offset(base, data_seq) {
            Some(off) => (off, payload),
            None => {
                // Starts before offset 0 (a mid-connection capture): keep what lies after it.
                let before = usize::try_from(base.wrapping_sub(data_seq)).unwrap_or(usize::MAX);
                match payload.get(before..) {
                    Some(rest) => {
                        self.dropped_before_start += before as u64;
                        (0, rest)
                    }
                    None => {
                        self.dropped_before_start += payload.len() as u64;
                        return;
                    }
                }
            }
        };
        let end = off + payload.len() as u64;
        if fin && self.fin.is_none() {
            self.fin = Some(end);
        }
        self.high = self.high.max(end);
        if !payload.is_empty() {
            self.insert(frame, off, payload);
        }
    }

    fn insert(&mut self, frame: usize, off: u64, payload: &[u8]) {
        let have = self.data.len() as u64;
        if off > have {
            match self.pending.get_mut(&off) {
                None => {
                    self.pending.insert(off, (frame, payload.to_vec()));
                }
                Some((_, existing)) => {
                    let n = existing.len().min(payload.len());
                    if existing.get(..n) != payload.get(..n) {
                        self.conflicts.push(Conflict { frame, offset: off });
                    }
                    if let Some(tail) = payload.get(existing.len()..) {
                        existing.extend_from_slice(tail);
                    }
                }
            }
            return;
        }
        self.append(frame, off, payload);
        // Drain segments that the new bytes made contiguous.
        while let Some((&p_off, _)) = self.pending.first_key_value() {
            if p_off > self.data.len() as u64 {
                break;
            }
            if let Some((p_off, (p_frame, bytes))) = self.pending.pop_first() {
                self.append(p_frame, p_off, &bytes);
            }
        }
    }

    /// Adds bytes at `off <= data.len()`: the overlap is compared, the rest appended.
    fn append(&mut self, frame: usize, off: u64, payload: &[u8]) {
        let Ok(start) = usize::try_from(off) else { return };
        let overlap = self.data.len().saturating_sub(start).min(payload.len());
        let old = self.data.get(start..start + overlap).unwrap_or(&[]);
        let new = payload.get(..overlap).unwrap_or(&[]);
        if let Some(first) = old.iter().zip(new).position(|(a, b)| a != b) {
            self.conflicts.push(Conflict { frame, offset: off + first as u64 });
        }
        let tail = payload.get(overlap..).unwrap_or(&[]);
        if !tail.is_empty() {
            self.frames.push((self.data.len() as u64, frame));
            self.data.extend_from_slice(tail);
        }
    }

    /// The contiguous bytes from offset 0.
    pub fn contiguous(&self) -> &[u8] {
        &self.data
    }

    /// Whether offset 0 is the stream's real start (the SYN was captured).
    pub fn syn_seen(&self) -> bool {
        self.syn_seen
    }

    /// Whether any segment (or SYN) of this direction was seen.
    pub fn seen(&self) -> bool {
        self.base.is_some()
    }

    /// Holes after the contiguous prefix: between it and each later run of buffered bytes.
    pub fn gaps(&self) -> Vec<Gap> {
        let mut gaps = Vec::new();
        let mut end = self.data.len() as u64;
        for (&off, (_, bytes)) in &self.pending {
            if off > end {
                gaps.push(Gap { offset: end, len: off - end });
            }
            end = end.max(off + bytes.len() as u64);
        }
        gaps
    }

    /// Octets buffered beyond the first hole (not decodable).
    pub fn beyond_gap(&self) -> u64 {
        self.pending.values().map(|(_, b)| b.len() as u64).sum()
    }

    /// Retransmissions that carried different bytes.
    pub fn conflicts(&self) -> &[Conflict] {
        &self.conflicts
    }

    /// Octets seen before offset 0 (dropped).
    pub fn dropped_before_start(&self) -> u64 {
        self.dropped_before_start
    }

    /// Stream offset of the FIN, if one was seen.
    pub fn fin(&self) -> Option<u64> {
        self.fin
    }

    /// Whether a RST was seen from this side.
    pub fn rst(&self) -> bool {
        self.rst
    }

    /// The frame that delivered the octet at stream offset `off`.
    pub fn frame_of(&self, off: u64) -> Option<usize> {
        let i = self.frames.partition_point(|&(start, _)| start <= off);
        self.frames.get(i.checked_sub(1)?).map(|&(_, f)| f)
    }
}

/// One TCP connection: `client` is the side that sent the SYN (or, without one, the first
/// segment seen).
#[derive(Debug, Clone)]
pub struct Connection {
    /// Frame number of the first packet.
    pub first_frame: usize,
    /// The active opener (or first sender).
    pub client: SocketAddr,
    /// The other side.
    pub server: SocketAddr,
    /// client -> server.
    pub to_server: Reassembler,
    /// server -> client.
    pub to_client: Reassembler,
    /// Segments seen.
    pub segments: usize,
}

impl Connection {
    fn new(frame: usize, client: SocketAddr, server: SocketAddr) -> Connection {
        Connection {
            first_frame: frame,
            client,
            server,
            to_server: Reassembler::new(),
            to_client: Reassembler::new(),
            segments: 0,
        }
    }

    /// Feeds a segment of this connection (either direction).
    pub fn handle_segment(&mut self, seg: &Segment<'_>) {
        self.segments += 1;
        let dir = if seg.src == self.client { &mut self.to_server } else { &mut self.to_client };
        dir.handle_segment(seg.frame, seg.seq, seg.syn, seg.fin, seg.rst, seg.payload);
    }
}

/// Sorts segments into connections, in order of first appearance.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    conns: Vec<Connection>,
    /// Normalized address pair -> index of its latest connection.
    index: std::collections::HashMap<(SocketAddr, SocketAddr), usize>,
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Feeds one segment.
    pub fn handle_segment(&mut self, seg: &Segment<'_>) {
        let key = if seg.src <= seg.dst { (seg.src, seg.dst) } else { (seg.dst, seg.src) };
        let fresh_syn = seg.syn && !seg.ack;
        let idx = match self.index.get(&key) {
            Some(&i) => {
                // A new SYN on a pair whose connection already carried a SYN or data from this
                // side starts a new connection (port reuse).
                let reuse = fresh_syn
                    && self.conns.get(i).is_some_and(|c| {
                        let d = if seg.src == c.client { &c.to_server } else { &c.to_client };
                        d.syn_seen() || !d.contiguous().is_empty() || d.fin().is_some() || d.rst()
                    });
                if reuse { None } else { Some(i) }
            }
            None => None,
        };
        let idx = match idx {
            Some(i) => i,
            None => {
                // Without a SYN, the side that sent the SYN-ACK is the server.
                let (client, server) =
                    if seg.syn && seg.ack { (seg.dst, seg.src) } else { (seg.src, seg.dst) };
                self.conns.push(Connection::new(seg.frame, client, server));
                let i = self.conns.len() - 1;
                self.index.insert(key, i);
                i
            }
        };
        if let Some(c) = self.conns.get_mut(idx) {
            c.handle_segment(seg);
        }
    }

    /// The connections, in order of first appearance.
    pub fn into_connections(self) -> Vec<Connection> {
        self.conns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(r: &mut Reassembler, frame: usize, seq: u32, payload: &[u8]) {
        r.handle_segment(frame, seq, false, false, false, payload);
    }

    #[test]
    fn in_order_after_syn() {
        let mut r = Reassembler::new();
        r.handle_segment(1, 1000, true, false, false, b"");
        feed(&mut r, 2, 1001, b"abc");
        feed(&mut r, 3, 1004, b"def");
        assert_eq!(r.contiguous(), b"abcdef");
        assert!(r.syn_seen());
        assert!(r.gaps().is_empty());
        assert_eq!(r.frame_of(0), Some(2));
        assert_eq!(r.frame_of(2), Some(2));
        assert_eq!(r.frame_of(3), Some(3));
        assert_eq!(r.frame_of(100), Some(3));
    }

    #[test]
    fn out_of_order_and_duplicates() {
        let mut r = Reassembler::new();
        r.handle_segment(1, 0, true, false, false, b"");
        feed(&mut r, 2, 7, b"ghi");
        feed(&mut r, 3, 4, b"def");
        assert_eq!(r.contiguous(), b"");
        assert_eq!(r.gaps(), vec![Gap { offset: 0, len: 3 }]);
        feed(&mut r, 4, 1, b"abc");
        assert_eq!(r.contiguous(), b"abcdefghi");
        feed(&mut r, 5, 1, b"abcd");
        feed(&mut r, 6, 3, b"cdefghijk");
        assert_eq!(r.contiguous(), b"abcdefghijk");
        assert!(r.conflicts().is_empty());
        // A retransmission with different bytes: first copy wins, conflict reported.
        feed(&mut r, 7, 2, b"XY");
        assert_eq!(r.contiguous(), b"abcdefghijk");
        assert_eq!(r.conflicts(), &[Conflict { frame: 7, offset: 1 }]);
    }

    #[test]
    fn sequence_wraparound() {
        let mut r = Reassembler::new();
        r.handle_segment(1, u32::MAX - 2, true, false, false, b"");
        feed(&mut r, 2, u32::MAX - 1, b"ab");
        feed(&mut r, 4, 2, b"ef");
        feed(&mut r, 3, 0, b"cd");
        assert_eq!(r.contiguous(), b"abcdef");
        assert!(r.gaps().is_empty());
    }

    #[test]
    fn gap_is_reported() {
        let mut r = Reassembler::new();
        r.handle_segment(1, 100, true, false, false, b"");
        feed(&mut r, 2, 101, b"0123");
        feed(&mut r, 4, 109, b"89");
        assert_eq!(r.contiguous(), b"0123");
        assert_eq!(r.gaps(), vec![Gap { offset: 4, len: 4 }]);
        assert_eq!(r.beyond_gap(), 2);
    }

    #[test]
    fn mid_connection_start() {
        let mut r = Reassembler::new();
        feed(&mut r, 1, 5000, b"xyz");
        feed(&mut r, 2, 4998, b"vwx");
        feed(&mut r, 3, 5003, b"!");
        assert!(!r.syn_seen());
        assert_eq!(r.contiguous(), b"xyz!");
        assert_eq!(r.dropped_before_start(), 2);
        // Entirely before the start: dropped.
        feed(&mut r, 4, 4000, b"old");
        assert_eq!(r.contiguous(), b"xyz!");
    }
}
