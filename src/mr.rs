//! Protection domains and memory regions.
//!
//! A region's memory belongs to the stack ([`iwarp_ddp::RegionMemory`], shared with the
//! engine): the application reads and writes it through copies, never through a slice a peer
//! could be writing at the same moment (see the model in `iwarp_ddp::memory`). Each region
//! gets a virtual address range of its own, which peers use as the tagged offset, as with
//! Linux verbs.

use std::fmt;
use std::sync::Arc;

use iwarp_ddp::stag_table::{Access, Addressing, ProtectionDomainId, RegionSpec, TableError};
use iwarp_ddp::{OutOfBounds, RegionMemory, STag};
use iwarp_rdmap::memory::Sge;

use crate::engine::Engine;

/// Why a region could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    /// The tagged buffer table refused it (full, bad range).
    Table(TableError),
    /// A region of zero bytes or one above 4 GiB - 1 (an SGE length is 32 bits).
    BadLength(usize),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::Table(e) => write!(f, "cannot register memory: {e:?}"),
            RegisterError::BadLength(n) => write!(f, "cannot register {n} bytes (1 to 4 GiB - 1)"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// A protection domain: regions and queue pairs in one domain only see each other.
///
/// ```
/// use iwarp::{Access, Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let pd = device.alloc_pd();
/// let mr = pd.register_bytes(b"advertised", Access::REMOTE_READ).unwrap();
/// // A peer reads it with the rkey and the address.
/// println!("rkey {} addr {:#x} len {}", mr.rkey(), mr.addr(), mr.len());
/// ```
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) id: ProtectionDomainId,
    pub(crate) dev: Arc<Engine>,
}

impl ProtectionDomain {
    /// Registers `len` zeroed bytes with the `access` rights.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, RegisterError> {
        self.adopt(RegionMemory::zeroed(len), access)
    }

    /// Registers a copy of `bytes`.
    pub fn register_bytes(&self, bytes: &[u8], access: Access) -> Result<MemoryRegion, RegisterError> {
        self.adopt(RegionMemory::from_bytes(bytes), access)
    }

    fn adopt(&self, memory: Arc<RegionMemory>, access: Access) -> Result<MemoryRegion, RegisterError> {
        let len = memory.len();
        if len == 0 || u32::try_from(len).is_err() {
            return Err(RegisterError::BadLength(len));
        }
        let mut core = self.dev.core();
        let va = core.alloc_va(len as u64);
        let spec =
            RegionSpec { base_va: va, len: len as u64, access, addressing: Addressing::VirtualAddress };
        let stag = core.table.register(self.id, spec, memory.clone()).map_err(RegisterError::Table)?;
        Ok(MemoryRegion { stag, va, memory, dev: self.dev.clone() })
    }
}

/// A registered memory region. Deregistered when dropped; a placement in flight keeps the
/// memory alive until it is done.
///
/// ```
/// use iwarp::{Access, Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let mr = device.alloc_pd().register(64, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)).unwrap();
/// mr.write(8, &[1, 2, 3]).unwrap();
/// let mut back = [0u8; 3];
/// mr.read(8, &mut back).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// let sge = mr.sge(8, 3); // for a work request's scatter/gather list
/// assert_eq!(sge.addr, mr.addr() + 8);
/// ```
pub struct MemoryRegion {
    stag: STag,
    va: u64,
    memory: Arc<RegionMemory>,
    dev: Arc<Engine>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("stag", &self.stag)
            .field("va", &format_args!("{:#x}", self.va))
            .field("len", &self.memory.len())
            .finish()
    }
}

impl MemoryRegion {
    /// The STag, used locally as the lkey.
    pub fn lkey(&self) -> STag {
        self.stag
    }

    /// The STag, given to peers as the rkey.
    pub fn rkey(&self) -> STag {
        self.stag
    }

    /// The virtual address of the first byte (the tagged offset peers use).
    pub fn addr(&self) -> u64 {
        self.va
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether the region is empty (never: registration refuses zero bytes).
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { lkey: self.stag, addr: self.va + offset as u64, len }
    }

    /// The whole region as one element.
    pub fn sge_all(&self) -> Sge {
        self.sge(0, u32::try_from(self.len()).unwrap_or(u32::MAX))
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.memory.write(offset, data)
    }

    /// Copies bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.memory.read(offset, out)
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        self.memory.to_vec()
    }

    /// The region's memory (for zero-copy users inside the stack).
    pub fn memory(&self) -> &Arc<RegionMemory> {
        &self.memory
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self.dev.core().table.deregister(self.stag);
    }
}
