//! rping's protocol pieces both of `iwarp rping`'s paths use (the engine's and the backend
//! seam's): the advertisement, the ping pattern, the buffer rights, why a wait stopped.

use std::fmt;

use iwarp::{Access, MemoryRegion};

use crate::toolbox::Fail;

/// The largest ping size here (rping stops at 65535).
pub(super) const MAX_SIZE: u32 = 16 << 20;
/// Length of rping's `struct rping_rdma_info` and of every Send.
pub(super) const INFO_LEN: usize = 16;
/// The first character of the pattern's cycle.
pub(super) const FIRST_LETTER: u8 = b'A';
/// The last character of the pattern's cycle (`'z'`); 58 characters from `'A'`.
pub(super) const LAST_LETTER: u8 = b'z';

/// Why a wait for a completion ended without it.
#[derive(Debug)]
pub(super) enum Stop {
    /// The peer closed the connection (or it was lost).
    Closed,
    /// A Terminate, an error completion, a timeout, a malformed message.
    Failed(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Closed => f.write_str("the peer closed the connection"),
            Stop::Failed(m) => f.write_str(m),
        }
    }
}

/// rping's `struct rping_rdma_info`: a buffer advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BufInfo {
    /// The buffer's address: the tagged offset to use.
    pub(super) addr: u64,
    /// Its STag.
    pub(super) rkey: u32,
    /// Its size (the ping size).
    pub(super) size: u32,
}

impl BufInfo {
    pub(super) fn of(mr: &MemoryRegion, size: u32) -> BufInfo {
        BufInfo { addr: mr.addr(), rkey: mr.rkey().0, size }
    }

    pub(super) fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    pub(super) fn parse(b: &[u8; INFO_LEN]) -> BufInfo {
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        let mut rkey = [0u8; 4];
        rkey.copy_from_slice(&b[8..12]);
        let mut size = [0u8; 4];
        size.copy_from_slice(&b[12..]);
        BufInfo {
            addr: u64::from_be_bytes(addr),
            rkey: u32::from_be_bytes(rkey),
            size: u32::from_be_bytes(size),
        }
    }
}

impl fmt::Display for BufInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "addr {:#018x} rkey {:#010x} size {}", self.addr, self.rkey, self.size)
    }
}

/// The data of ping `k`, as rping builds it: `rdma-ping-k: ` then characters counting up from
/// `'A' + k mod 58` (wrapping from `'z'` to `'A'`), then one NUL as the last byte.
pub(super) fn pattern(k: u64, size: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size];
    if size == 0 {
        return buf;
    }
    let prefix = format!("rdma-ping-{k}: ");
    let n = prefix.len().min(size - 1);
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let cycle = u64::from(LAST_LETTER - FIRST_LETTER) + 1;
    let mut c = FIRST_LETTER + u8::try_from(k % cycle).unwrap_or(0);
    for b in &mut buf[n..size - 1] {
        *b = c;
        c = if c >= LAST_LETTER { FIRST_LETTER } else { c + 1 };
    }
    buf
}

/// The bytes up to the first NUL, as text (what rping's `printf("%s")` shows).
pub(super) fn c_string(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// rping's buffer rights: local write, remote read, remote write.
pub(super) const BUF_ACCESS: Access =
    Access::LOCAL_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_WRITE);

pub(super) fn usize_of(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The text of a data mismatch in ping `k`.
pub(super) fn mismatch(k: u64, data: &[u8], got: &[u8]) -> String {
    let at = got.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0);
    format!(
        "data mismatch in ping {k}: first difference at byte {at} (sent {:#04x}, got {:#04x})",
        data.get(at).copied().unwrap_or(0),
        got.get(at).copied().unwrap_or(0)
    )
}

/// How a server's wait in the middle of ping `k` failed, as text.
pub(super) fn mid_ping(k: u64) -> impl Fn(Stop) -> String + Copy {
    move |e| match e {
        Stop::Closed => format!("ping {k}: the client closed the connection in the middle of a ping"),
        Stop::Failed(m) => format!("ping {k}: {m}"),
    }
}

/// How many bytes of ping `k`'s `data` the server writes back: rping echoes the string it
/// read, NUL included (strlen + 1), which must fit the client's sink buffer `sink`.
pub(super) fn echo_len(k: u64, data: &[u8], sink: &BufInfo) -> Result<u32, String> {
    let echo = data.iter().position(|&x| x == 0).map_or(data.len(), |i| i + 1);
    let echo = u32::try_from(echo).unwrap_or(u32::MAX);
    if echo > sink.size {
        return Err(format!(
            "ping {k}: the client's rdma buffer ({} bytes) is smaller than the data ({echo})",
            sink.size
        ));
    }
    Ok(echo)
}

/// A client's checks of ping `k` once its data came back: with `validate` the data must equal
/// what was sent; with `verbose` it is printed as rping does.
pub(super) fn client_checks(
    k: u64,
    sent: &[u8],
    got: &[u8],
    validate: bool,
    verbose: bool,
) -> Result<(), Fail> {
    if validate && got != sent {
        return Err(Fail::Run(mismatch(k, sent, got)));
    }
    if verbose {
        println!("ping data: {}", c_string(got));
    }
    Ok(())
}
