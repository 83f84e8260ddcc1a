//! perftest's control-channel messages (v4.5-0.17, internal version 6.06), byte for byte.
//!
//! Every message is one Send of at most 56 bytes on the control connection; see
//! docs/perftest.md#the-control-connection. This module is plain data (std only) so that the CLI
//! tests can include it and check it against the siw captures.

/// The most any control message carries: the peer has one receive of this size posted.
pub(crate) const MAX_MSG: usize = 56;
/// Length of the version message.
pub(crate) const VERSION_LEN: usize = 16;
/// The version string perftest 4.5-0.17 sends.
pub(crate) const VERSION: &str = "6.06";
/// The oldest peer version perftest accepts.
pub(crate) const MIN_PEER_VERSION: f64 = 5.70;
/// Length of the key record (`struct pingpong_dest` on x86-64).
pub(crate) const KEY_RECORD_LEN: usize = 56;
/// Length of each report field.
pub(crate) const REPORT_FIELD_LEN: usize = 8;

/// The version message: ASCII, NUL-padded to 16 bytes.
pub(crate) fn version_msg(version: &str) -> [u8; VERSION_LEN] {
    let mut b = [0u8; VERSION_LEN];
    let n = version.len().min(VERSION_LEN - 1);
    b[..n].copy_from_slice(&version.as_bytes()[..n]);
    b
}

/// Reads a version message as perftest does (`atof` of the NUL-terminated text); `None` when
/// it is not a number.
pub(crate) fn parse_version(b: &[u8]) -> Option<f64> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let text = std::str::from_utf8(&b[..end]).ok()?;
    // atof: the longest numeric prefix.
    let prefix: String = text.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    prefix.parse().ok()
}

/// A 32-bit big-endian value (cycle buffer, cache line size).
pub(crate) fn u32_msg(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Reads a 32-bit big-endian message (missing bytes read as zero).
pub(crate) fn parse_u32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    for (d, s) in w.iter_mut().zip(b) {
        *d = *s;
    }
    u32::from_be_bytes(w)
}

/// The MTU message: the verbs MTU enum in decimal, NUL-terminated (2 bytes: `"3\0"` = 1024).
pub(crate) fn mtu_msg(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// Reads an MTU message: the enum value (1..=5 are valid).
pub(crate) fn parse_mtu(b: &[u8]) -> Option<u8> {
    match b.first() {
        Some(c @ b'1'..=b'5') => Some(c - b'0'),
        _ => None,
    }
}

/// Bytes of a verbs MTU enum (1 = 256 ... 5 = 4096).
pub(crate) fn mtu_bytes(mtu_enum: u8) -> u32 {
    128u32 << mtu_enum.clamp(1, 5)
}

/// perftest's `struct pingpong_dest`: the key record of the "pre"/"post" and K handshakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyRecord {
    /// LID (0 on iWARP).
    pub(crate) lid: u32,
    /// Outstanding reads (1 for write/send, the device maximum for read).
    pub(crate) out_reads: u32,
    /// The data queue pair's number.
    pub(crate) qpn: u32,
    /// A random 24-bit packet sequence number.
    pub(crate) psn: u32,
    /// The advertised buffer's STag.
    pub(crate) rkey: u32,
    /// The struct's padding word (uninitialised stack bytes in perftest; zero here).
    pub(crate) pad: u32,
    /// The advertised buffer's tagged offset.
    pub(crate) vaddr: u64,
    /// The GID (siw: the MAC and ten zero bytes).
    pub(crate) gid: [u8; 16],
    /// SRQ number (0).
    pub(crate) srqn: u32,
    /// GID index (0).
    pub(crate) gid_index: u32,
}

impl KeyRecord {
    /// The 56 bytes on the wire, every field big-endian.
    pub(crate) fn to_bytes(self) -> [u8; KEY_RECORD_LEN] {
        let mut b = [0u8; KEY_RECORD_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[20..24].copy_from_slice(&self.pad.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// Reads a record; `None` when `b` is not 56 bytes.
    pub(crate) fn parse(b: &[u8]) -> Option<KeyRecord> {
        if b.len() != KEY_RECORD_LEN {
            return None;
        }
        let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Some(KeyRecord {
            lid: w(0),
            out_reads: w(4),
            qpn: w(8),
            psn: w(12),
            rkey: w(16),
            pad: w(20),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: w(48),
            gid_index: w(52),
        })
    }
}

/// The report a write/read client sends after its run: five 8-byte big-endian fields, each
/// its own Send.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Report {
    /// Message size in bytes.
    pub(crate) size: u64,
    /// Iterations.
    pub(crate) iters: u64,
    /// Peak bandwidth in the report's unit.
    pub(crate) bw_peak: f64,
    /// Average bandwidth in the report's unit.
    pub(crate) bw_avg: f64,
    /// Message rate in Mpps.
    pub(crate) msg_rate: f64,
}

impl Report {
    /// The five messages, in order.
    pub(crate) fn to_msgs(self) -> [[u8; REPORT_FIELD_LEN]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// Reads the five messages (each padded or cut to 8 bytes).
    pub(crate) fn from_msgs(m: &[Vec<u8>; 5]) -> Report {
        let f = |b: &Vec<u8>| {
            let mut w = [0u8; REPORT_FIELD_LEN];
            for (d, s) in w.iter_mut().zip(b) {
                *d = *s;
            }
            u64::from_be_bytes(w)
        };
        Report {
            size: f(&m[0]),
            iters: f(&m[1]),
            bw_peak: f64::from_bits(f(&m[2])),
            bw_avg: f64::from_bits(f(&m[3])),
            msg_rate: f64::from_bits(f(&m[4])),
        }
    }
}

/// A send_bw credit value: the receiver's cumulative count, 4 bytes in x86 host order.
pub(crate) fn credit_bytes(count: u32) -> [u8; 4] {
    count.to_le_bytes()
}
