//! [`Memory`] over DDP's tagged buffer table and the regions' shared memory: what the engine
//! gives a queue pair, bound to the queue pair's protection domain.

use iwarp_ddp::placement::{TaggedTarget, resolve_tagged};
use iwarp_ddp::stag_table::{Access, AccessError, ProtectionDomainId, TaggedBufferTable};
use iwarp_ddp::{STag, TaggedOffset};

use crate::memory::Memory;

/// The table, seen from one protection domain.
#[derive(Debug)]
pub struct TableMemory<'a> {
    /// The tagged buffer table.
    pub table: &'a mut TaggedBufferTable,
    /// The queue pair's protection domain.
    pub pd: ProtectionDomainId,
}

impl TableMemory<'_> {
    fn resolve(&self, stag: STag, to: u64, len: usize, access: Access) -> Result<TaggedTarget, AccessError> {
        let len = u64::try_from(len).map_err(|_| AccessError::BaseOrBounds)?;
        resolve_tagged(self.table, self.pd, stag, TaggedOffset(to), len, access)
    }
}

impl Memory for TableMemory<'_> {
    fn check(&self, stag: STag, to: u64, len: u64, access: Access) -> Result<(), AccessError> {
        self.table.check(stag, self.pd, access, TaggedOffset(to), len).map(|_| ())
    }

    fn place(&mut self, stag: STag, to: u64, data: &[u8], access: Access) -> Result<(), AccessError> {
        let t = self.resolve(stag, to, data.len(), access)?;
        t.memory.write(t.offset, data).map_err(|_| AccessError::BaseOrBounds)
    }

    fn fetch(&self, stag: STag, to: u64, out: &mut [u8], access: Access) -> Result<(), AccessError> {
        let t = self.resolve(stag, to, out.len(), access)?;
        t.memory.read(t.offset, out).map_err(|_| AccessError::BaseOrBounds)
    }

    fn atomic(&mut self, stag: STag, to: u64, f: &mut dyn FnMut(u64) -> u64) -> Result<u64, AccessError> {
        let t = self.resolve(stag, to, 8, Access::REMOTE_ATOMIC)?;
        // Unaligned targets are refused (RFC 7306 requires 8-byte alignment).
        t.memory.fetch_update_u64(t.offset, f).ok_or(AccessError::BaseOrBounds)
    }

    fn invalidate(&mut self, stag: STag) -> Result<(), AccessError> {
        match self.table.get(stag) {
            Some(e) if e.valid && e.key == stag.key() && e.pd == self.pd => {
                self.table.invalidate(stag).map_err(|_| AccessError::InvalidStag)
            }
            Some(e) if e.valid && e.key == stag.key() => Err(AccessError::StagNotAssociated),
            _ => Err(AccessError::InvalidStag),
        }
    }
}
