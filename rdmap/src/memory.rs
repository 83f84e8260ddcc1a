//! What a queue pair needs from registered memory.
//!
//! Local buffers are named the way verbs name them: a scatter/gather element is an lkey (the
//! STag of a local region), an address in that region's tagged-offset space, and a length.
//! The engine implements [`Memory`] over the tagged buffer table and the regions' memory
//! (`iwarp_ddp`), bound to the queue pair's protection domain; tests may use a model.

use iwarp_ddp::STag;
use iwarp_ddp::stag_table::{Access, AccessError};

/// A scatter/gather element: `len` bytes at tagged offset `addr` of the region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// The local STag.
    pub lkey: STag,
    /// The tagged offset (a virtual address for VA-based regions).
    pub addr: u64,
    /// Bytes.
    pub len: u32,
}

/// Total length of a scatter/gather list.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.len)).sum()
}

/// Registered memory as a queue pair sees it, within its protection domain.
///
/// Every call checks the STag (valid, key, PD), the `access` rights asked for and the bounds,
/// in that order, and touches nothing when a check fails.
pub trait Memory {
    /// Checks that `len` bytes at `to` of `stag` may be accessed with `access`.
    fn check(&self, stag: STag, to: u64, len: u64, access: Access) -> Result<(), AccessError>;

    /// Writes `data` at `to` of `stag`.
    fn place(&mut self, stag: STag, to: u64, data: &[u8], access: Access) -> Result<(), AccessError>;

    /// Reads `out.len()` bytes at `to` of `stag` into `out`.
    fn fetch(&self, stag: STag, to: u64, out: &mut [u8], access: Access) -> Result<(), AccessError>;

    /// Applies an RFC 7306 atomic to the 64-bit value at `to` of `stag` (remote atomic rights,
    /// 8-byte aligned): stores `f(original)` and returns `original`, as one atomic
    /// read-modify-write.
    fn atomic(&mut self, stag: STag, to: u64, f: &mut dyn FnMut(u64) -> u64) -> Result<u64, AccessError>;

    /// Invalidates `stag` for a peer's Send with Invalidate: it must exist in this protection
    /// domain; afterwards every access through it fails.
    fn invalidate(&mut self, stag: STag) -> Result<(), AccessError>;
}

/// Calls `f(element, tagged offset, range of the message bytes)` for each piece of message
/// bytes `[offset, offset + len)` as they fall on the elements of `sgl`.
fn walk(
    sgl: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut skip = offset;
    let mut done = 0;
    for s in sgl {
        if done == len {
            break;
        }
        let elen = u64::from(s.len);
        if skip >= elen {
            skip -= elen;
            continue;
        }
        let room = usize::try_from(elen - skip).unwrap_or(usize::MAX);
        let n = room.min(len - done);
        let to = s.addr.checked_add(skip).ok_or(AccessError::ToWrap)?;
        f(s, to, done..done + n)?;
        done += n;
        skip = 0;
    }
    if done < len { Err(AccessError::BaseOrBounds) } else { Ok(()) }
}

/// Reads message bytes `[offset, offset + out.len())` gathered from `sgl` (local access).
pub fn gather(mem: &impl Memory, sgl: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
    let len = out.len();
    walk(sgl, offset, len, |s, to, r| mem.fetch(s.lkey, to, &mut out[r], Access::NONE))
}

/// Writes `data` at message offset `offset` scattered over `sgl` (local write access).
pub fn scatter(mem: &mut impl Memory, sgl: &[Sge], offset: u64, data: &[u8]) -> Result<(), AccessError> {
    walk(sgl, offset, data.len(), |s, to, r| mem.place(s.lkey, to, &data[r], Access::LOCAL_WRITE))
}
