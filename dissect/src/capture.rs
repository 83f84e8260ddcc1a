//! Reading pcap and pcapng captures into a list of packets.
//!
//! The whole file is parsed from memory with `pcap-file`'s slice parsers, so a file cut short
//! (a capture still being written, a truncated download) yields the packets before the cut and
//! a [`Truncation`] note instead of an error.

use std::fmt;
use std::time::Duration;

use pcap_file::PcapError;
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::{Block, PcapNgParser};

/// Link type (LINKTYPE_*) of Ethernet frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of BSD loopback (4-octet address family, then IP).
pub const LINKTYPE_NULL: u32 = 0;
/// Link type of raw IP (version from the first nibble).
pub const LINKTYPE_RAW: u32 = 101;
/// Link type of Linux "cooked" captures (SLL).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// Link type of raw IPv4.
pub const LINKTYPE_IPV4: u32 = 228;
/// Link type of raw IPv6.
pub const LINKTYPE_IPV6: u32 = 229;

/// The file format of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Classic libpcap format.
    Pcap,
    /// pcapng.
    PcapNg,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Pcap => "pcap",
            Format::PcapNg => "pcapng",
        })
    }
}

/// One captured packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Frame number, counted from 1 as Wireshark does.
    pub number: usize,
    /// Capture timestamp (since the Unix epoch, as the file says).
    pub timestamp: Duration,
    /// The link type (LINKTYPE_* value) of the interface the packet was captured on.
    pub link_type: u32,
    /// The captured bytes (possibly fewer than were on the wire).
    pub data: &'a [u8],
    /// Length of the packet on the wire.
    pub orig_len: u32,
}

/// Where and why reading stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Truncation {
    /// Packets read before the damage.
    pub packets: usize,
    /// What was wrong: "file ends inside a packet", or the parser's complaint.
    pub reason: String,
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "capture truncated after {} packets ({})", self.packets, self.reason)
    }
}

/// The packets of a capture file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture<'a> {
    /// pcap or pcapng.
    pub format: Format,
    /// The packets, in file order.
    pub packets: Vec<Packet<'a>>,
    /// Set when the file ends early or is damaged after some packets.
    pub truncated: Option<Truncation>,
}

/// The bytes are not a capture at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotACapture;

impl fmt::Display for NotACapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a pcap or pcapng capture")
    }
}

impl std::error::Error for NotACapture {}

const PCAP_MAGICS: [[u8; 4]; 4] =
    [[0xd4, 0xc3, 0xb2, 0xa1], [0xa1, 0xb2, 0xc3, 0xd4], [0x4d, 0x3c, 0xb2, 0xa1], [0xa1, 0xb2, 0x3c, 0x4d]];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

fn reason(e: &PcapError) -> String {
    match e {
        PcapError::IncompleteBuffer => "file ends inside a packet".to_string(),
        other => other.to_string(),
    }
}

/// Parses a pcap or pcapng file held in memory.
///
/// Fails only when the bytes do not start like a capture; damage after the file header ends
/// the packet list with a [`Truncation`].
pub fn parse(bytes: &[u8]) -> Result<Capture<'_>, NotACapture> {
    let magic: [u8; 4] = bytes.get(..4).and_then(|m| m.try_into().ok()).ok_or(NotACapture)?;
    if PCAP_MAGICS.contains(&magic) {
        Ok(parse_pcap(bytes))
    } else if magic == PCAPNG_MAGIC {
        Ok(parse_pcapng(bytes))
    } else {
        Err(NotACapture)
    }
}

fn parse_pcap(bytes: &[u8]) -> Capture<'_> {
    let mut cap = Capture { format: Format::Pcap, packets: Vec::new(), truncated: None };
    let (mut rest, parser) = match PcapParser::new(bytes) {
        Ok(p) => p,
        Err(e) => {
            cap.truncated = Some(Truncation { packets: 0, reason: format!("file header: {}", reason(&e)) });
            return cap;
        }
    };
    let header = parser.header();
    let link_type = u32::from(header.datalink);
    let nanos = header.ts_resolution == pcap_file::TsResolution::NanoSecond;
    while !rest.is_empty() {
        // The raw parser does not insist on orig_len <= snaplen, which real captures break.
        match parser.next_raw_packet(rest) {
            Ok((r, raw)) => {
                rest = r;
                let data = match raw.data {
                    std::borrow::Cow::Borrowed(d) => d,
                    // The slice parser always borrows; an owned copy cannot outlive this loop.
                    std::borrow::Cow::Owned(_) => &[],
                };
                let frac = if nanos { raw.ts_frac } else { raw.ts_frac.saturating_mul(1000) };
                let timestamp =
                    Duration::from_secs(u64::from(raw.ts_sec)) + Duration::from_nanos(u64::from(frac));
                cap.packets.push(Packet {
                    number: cap.packets.len() + 1,
                    timestamp,
                    link_type,
                    data,
                    orig_len: raw.orig_len,
                });
            }
            Err(e) => {
                cap.truncated = Some(Truncation { packets: cap.packets.len(), reason: reason(&e) });
                break;
            }
        }
    }
    cap
}

fn parse_pcapng(bytes: &[u8]) -> Capture<'_> {
    let mut cap = Capture { format: Format::PcapNg, packets: Vec::new(), truncated: None };
    let (mut rest, mut parser) = match PcapNgParser::new(bytes) {
        Ok(p) => p,
        Err(e) => {
            cap.truncated =
                Some(Truncation { packets: 0, reason: format!("section header: {}", reason(&e)) });
            return cap;
        }
    };
    while !rest.is_empty() {
        let (r, block) = match parser.next_block(rest) {
            Ok(x) => x,
            Err(e) => {
                cap.truncated = Some(Truncation { packets: cap.packets.len(), reason: reason(&e) });
                break;
            }
        };
        rest = r;
        let link = |id: u32| -> Option<u32> {
            let idx = usize::try_from(id).ok()?;
            parser.interfaces().get(idx).map(|i| u32::from(i.linktype))
        };
        let (iface, timestamp, data, orig_len) = match block {
            Block::EnhancedPacket(epb) => (epb.interface_id, epb.timestamp, epb.data, epb.original_len),
            Block::SimplePacket(spb) => (0, Duration::ZERO, spb.data, spb.original_len),
            Block::Packet(pb) => {
                (u32::from(pb.interface_id), Duration::from_nanos(pb.timestamp), pb.data, pb.original_len)
            }
            _ => continue,
        };
        let Some(link_type) = link(iface) else {
            cap.truncated = Some(Truncation {
                packets: cap.packets.len(),
                reason: format!("packet on undeclared interface {iface}"),
            });
            break;
        };
        let data = match data {
            std::borrow::Cow::Borrowed(d) => d,
            std::borrow::Cow::Owned(_) => &[],
        };
        cap.packets.push(Packet { number: cap.packets.len() + 1, timestamp, link_type, data, orig_len });
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_a_capture() {
        assert_eq!(parse(b""), Err(NotACapture));
        assert_eq!(parse(b"abc"), Err(NotACapture));
        assert_eq!(parse(b"hello, this is text\n"), Err(NotACapture));
    }

    #[test]
    fn pcap_header_only_and_truncated() {
        let mut file = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&65535u32.to_le_bytes());
        file.extend_from_slice(&1u32.to_le_bytes());
        let cap = parse(&file).unwrap();
        assert_eq!(cap.format, Format::Pcap);
        assert!(cap.packets.is_empty());
        assert_eq!(cap.truncated, None);
        // One packet header announcing 10 bytes, then only 3.
        let mut cut = file.clone();
        cut.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 10, 0, 0, 0, 1, 2, 3]);
        let cap = parse(&cut).unwrap();
        assert!(cap.packets.is_empty());
        assert_eq!(cap.truncated.unwrap().packets, 0);
        // File header cut short.
        let cap = parse(&file[..10]).unwrap();
        assert!(cap.truncated.is_some());
    }
}
