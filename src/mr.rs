//! Protection domains, memory regions and memory windows.
//!
//! A region is registered over the application's own memory: an owned buffer it hands in
//! (`Vec<u8>`, `Box<[u8]>`, `bytes::BytesMut`, a page-aligned [`PageBuffer`]) and gets back,
//! written in place, from [`MemoryRegion::deregister`]; or foreign memory (a pointer and a
//! length under the `ibv_reg_mr` contract: [`RegionMemory::from_raw_parts`], `unsafe`, for a C
//! verbs ABI). While registered, the memory belongs to the engine's tagged buffer table, and
//! the engine places peer data straight into it.
//!
//! The application reads and writes its region in three ways (the model is written down in
//! `iwarp_ddp::dma`):
//!
//! - copies ([`MemoryRegion::read`], [`MemoryRegion::write`], [`MemoryRegion::to_vec`]): safe
//!   at any time; each takes the engine's lock, so it never overlaps a placement;
//! - scoped borrows ([`MemoryRegion::with_bytes`], [`MemoryRegion::with_bytes_mut`]): safe
//!   zero-copy access while the engine waits; the closure must be short and must not wait for
//!   the engine (polling a completion queue in inline mode would wait for itself);
//! - the zero-copy view ([`MemoryRegion::view`]): `unsafe`, the RDMA contract: bytes a peer
//!   writes are defined once the completion that follows them has been polled, until the
//!   application lets the peer write again.
//!
//! Each region gets a virtual address range of its own, which peers use as the tagged offset,
//! as with Linux verbs. Deregistration takes the engine's lock, so it waits for a pass in
//! progress and never frees memory under a placement or a Read Response: a message whose
//! later segments meet the deregistered region is terminated instead.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use iwarp_ddp::dma::{Buffer, RegionView};
use iwarp_ddp::stag_table::{Access, Addressing, Entry, ProtectionDomainId, RegionSpec, TableError};
use iwarp_ddp::{OutOfBounds, RegionMemory, STag};
use iwarp_rdmap::memory::Sge;
use iwarp_rdmap::qp::SendOp;

use crate::engine::{Engine, EngineCore};

#[cfg(doc)]
use iwarp_ddp::PageBuffer;

/// Why a region could not be registered, deregistered or re-validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    /// The tagged buffer table refused it (full, bad range, windows still bound).
    Table(TableError),
    /// A region of zero bytes or one above 4 GiB - 1 (an SGE length is 32 bits).
    BadLength(usize),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::Table(e) => write!(f, "tagged buffer table: {e}"),
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
/// // The application's own vector, registered in place and given back.
/// let mr = pd.register_buffer(vec![7u8; 32], Access::REMOTE_WRITE).unwrap();
/// let back = mr.deregister().unwrap().into_vec().unwrap();
/// assert_eq!(back, vec![7u8; 32]);
/// ```
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) id: ProtectionDomainId,
    pub(crate) dev: Arc<Engine>,
}

fn check_len(len: usize) -> Result<(), RegisterError> {
    if len == 0 || u32::try_from(len).is_err() {
        return Err(RegisterError::BadLength(len));
    }
    Ok(())
}

impl ProtectionDomain {
    /// Registers `len` zeroed bytes, page aligned, allocated by the stack, with the `access`
    /// rights.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, RegisterError> {
        check_len(len)?;
        self.register_memory(RegionMemory::zeroed(len), access)
    }

    /// Registers a page-aligned copy of `bytes`.
    pub fn register_bytes(&self, bytes: &[u8], access: Access) -> Result<MemoryRegion, RegisterError> {
        check_len(bytes.len())?;
        self.register_memory(RegionMemory::from_bytes(bytes), access)
    }

    /// Registers the application's own buffer (a `Vec<u8>` over its length, a `Box<[u8]>`, a
    /// `bytes::BytesMut`, a [`PageBuffer`]) in place: peers' Writes land in it, and
    /// [`MemoryRegion::deregister`] gives it back. A refused registration drops the buffer.
    pub fn register_buffer(
        &self,
        buffer: impl Into<Buffer>,
        access: Access,
    ) -> Result<MemoryRegion, RegisterError> {
        self.register_memory(RegionMemory::new(buffer), access)
    }

    /// Registers `memory`: an owned buffer, or foreign memory made with the `unsafe`
    /// [`RegionMemory::from_raw_parts`] (verbs `ibv_reg_mr`; its contract holds until the
    /// region is deregistered or dropped).
    ///
    /// ```
    /// use iwarp::{Access, Device, DeviceConfig, PollMode, RegionMemory};
    /// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
    /// let pd = device.alloc_pd();
    /// let mut buf = vec![0u8; 64]; // memory a C caller owns, say
    /// // SAFETY: `buf` outlives the region (deregistered below, before `buf` is used again),
    /// // and nothing else touches it meanwhile.
    /// let memory = unsafe { RegionMemory::from_raw_parts(buf.as_mut_ptr(), buf.len()) };
    /// let mr = pd.register_memory(memory, Access::LOCAL_WRITE).unwrap();
    /// mr.write(0, b"in place").unwrap();
    /// drop(mr.deregister().unwrap()); // a Buffer::Foreign: nothing to free
    /// assert_eq!(&buf[..8], b"in place");
    /// ```
    pub fn register_memory(
        &self,
        memory: RegionMemory,
        access: Access,
    ) -> Result<MemoryRegion, RegisterError> {
        let len = memory.len();
        check_len(len)?;
        let view = memory.view();
        let mut core = self.dev.core();
        let va = core.alloc_va(len as u64);
        let spec =
            RegionSpec { base_va: va, len: len as u64, access, addressing: Addressing::VirtualAddress };
        let stag = core.table.register(self.id, spec, memory).map_err(|(e, _)| RegisterError::Table(e))?;
        drop(core);
        Ok(MemoryRegion::new(stag, va, len, view, &self.dev))
    }

    /// Allocates a region over `buffer` that starts invalid, for fast registration (verbs
    /// `ibv_alloc_mr`): a [`SendOp::FastRegister`] work request (see
    /// [`MemoryRegion::fast_register_op`]) makes it valid with the key and rights it names;
    /// [`SendOp::LocalInvalidate`] or a peer's Send with Invalidate make it invalid again
    /// (a peer's only if the region grants some remote right; neither while a memory window
    /// is bound to it).
    pub fn alloc_mr(&self, buffer: impl Into<Buffer>) -> Result<MemoryRegion, RegisterError> {
        let memory = RegionMemory::new(buffer);
        let len = memory.len();
        check_len(len)?;
        let view = memory.view();
        let mut core = self.dev.core();
        let va = core.alloc_va(len as u64);
        let stag = core.table.allocate_invalid(self.id, memory).map_err(|(e, _)| RegisterError::Table(e))?;
        drop(core);
        Ok(MemoryRegion::new(stag, va, len, view, &self.dev))
    }

    /// Allocates a memory window (verbs `ibv_alloc_mw`, type 2), bound to nothing: a
    /// [`SendOp::BindWindow`] work request (see [`MemoryWindow::bind_op`]) binds it to part
    /// of a region.
    pub fn alloc_mw(&self) -> Result<MemoryWindow, RegisterError> {
        let stag = self.dev.core().table.allocate_window(self.id).map_err(RegisterError::Table)?;
        Ok(MemoryWindow { stag: AtomicU32::new(stag.0), dev: self.dev.clone() })
    }
}

/// The table entry at `stag`'s index and its current STag (the handle's key may be ahead of
/// the table's, when a key update's work request has not run or failed).
fn current(core: &EngineCore, stag: STag) -> Option<(STag, Entry)> {
    let e = *core.table.get_index(stag.index())?;
    Some((STag::from_parts(stag.index(), e.key)?, e))
}

/// A registered memory region. Deregistered when dropped (its buffer is then freed, or for
/// foreign memory left to its owner); [`MemoryRegion::deregister`] gives the buffer back.
///
/// ```
/// use iwarp::{Access, Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let mr = device.alloc_pd().register(64, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE)).unwrap();
/// mr.write(8, &[1, 2, 3]).unwrap();
/// let mut back = [0u8; 3];
/// mr.read(8, &mut back).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// assert_eq!(mr.with_bytes(|b| b[9]), 2);
/// let sge = mr.sge(8, 3); // for a work request's scatter/gather list
/// assert_eq!(sge.addr, mr.addr() + 8);
/// ```
pub struct MemoryRegion {
    /// The STag: the table index never changes, the key does (fast-register, re-validate).
    stag: AtomicU32,
    va: u64,
    len: usize,
    view: RegionView,
    dev: Arc<Engine>,
    /// Still registered (cleared by `deregister`, so that Drop leaves the table alone).
    live: bool,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("stag", &self.lkey())
            .field("va", &format_args!("{:#x}", self.va))
            .field("len", &self.len)
            .finish()
    }
}

impl MemoryRegion {
    fn new(stag: STag, va: u64, len: usize, view: RegionView, dev: &Arc<Engine>) -> MemoryRegion {
        MemoryRegion { stag: AtomicU32::new(stag.0), va, len, view, dev: dev.clone(), live: true }
    }

    /// The STag, used locally as the lkey.
    pub fn lkey(&self) -> STag {
        STag(self.stag.load(Ordering::Relaxed))
    }

    /// The STag, given to peers as the rkey.
    pub fn rkey(&self) -> STag {
        self.lkey()
    }

    /// The virtual address of the first byte (the tagged offset peers use).
    pub fn addr(&self) -> u64 {
        self.va
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration refuses zero bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { lkey: self.lkey(), addr: self.va + offset as u64, len }
    }

    /// The whole region as one element.
    pub fn sge_all(&self) -> Sge {
        self.sge(0, u32::try_from(self.len()).unwrap_or(u32::MAX))
    }

    /// Runs `f` on the region's memory with the engine's lock held (nothing places into it
    /// meanwhile).
    fn with_memory<R>(&self, f: impl FnOnce(&mut RegionMemory) -> R) -> Option<R> {
        let mut core = self.dev.core_for_copy();
        core.table.region_memory_mut(self.lkey().index()).map(f)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        let out = OutOfBounds { offset, len: data.len(), memory_len: self.len };
        self.with_memory(|m| m.write(offset, data)).unwrap_or(Err(out))
    }

    /// Copies bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        let oob = OutOfBounds { offset, len: out.len(), memory_len: self.len };
        self.with_memory(|m| m.read(offset, out)).unwrap_or(Err(oob))
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with_memory(|m| m.to_vec()).unwrap_or_default()
    }

    /// Runs `f` on the region's bytes in place, safely: the engine places nothing while `f`
    /// runs (it waits for the engine's lock). Keep `f` short, and never wait for the engine
    /// inside it (in inline mode polling a completion queue would wait for itself).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let core = self.dev.core_for_copy();
        let memory = core.table.region_memory(self.lkey().index());
        // The region is registered while the handle lives: the slice is always there.
        f(memory.and_then(|m| m.slice(0, m.len())).unwrap_or_default())
    }

    /// Runs `f` on the region's bytes in place, mutably; see [`MemoryRegion::with_bytes`].
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut core = self.dev.core_for_copy();
        let memory = core.table.region_memory_mut(self.lkey().index());
        f(memory
            .and_then(|m| {
                let len = m.len();
                m.slice_mut(0, len)
            })
            .unwrap_or_default())
    }

    /// The zero-copy view of the region's bytes, under the RDMA contract: its accessors are
    /// `unsafe` (see `iwarp_ddp::dma` for the model). Its lifetime ends with the handle.
    ///
    /// A zero-copy receiver: it registers its own vector, a peer RDMA Writes into it and then
    /// Sends; once the receive completion of that Send is polled, the Write is in place.
    ///
    /// ```
    /// use std::time::Duration;
    /// use iwarp::{Access, ConnectOptions, Device, DeviceConfig, RecvWr, SendOp, SendWr, WcOpcode};
    ///
    /// let t = Duration::from_secs(5);
    /// let (receiver_dev, sender_dev) = (Device::open(DeviceConfig::default()), Device::open(DeviceConfig::default()));
    /// let (rpd, rcq) = (receiver_dev.alloc_pd(), receiver_dev.create_cq(8));
    /// let (spd, scq) = (sender_dev.alloc_pd(), sender_dev.create_cq(8));
    /// let listener = receiver_dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    /// let addr = listener.local_addr().unwrap();
    /// let (pd, cq) = (rpd.clone(), rcq.clone());
    /// let accepting = std::thread::spawn(move || {
    ///     listener.accept(t).unwrap().accept(&pd, &cq, &cq, &ConnectOptions::default()).unwrap()
    /// });
    /// let sender = sender_dev.connect(addr, &spd, &scq, &scq, &ConnectOptions::default()).unwrap().qp;
    /// let receiver = accepting.join().unwrap();
    ///
    /// // The receiver's own memory, registered in place.
    /// let inbox = rpd.register_buffer(vec![0u8; 8192], Access::REMOTE_WRITE).unwrap();
    /// receiver.post_recv(RecvWr { wr_id: 1, sgl: Default::default() }).unwrap();
    /// // The peer Writes, then Sends (zero bytes: only the completion matters).
    /// let data = spd.register_bytes(&[42u8; 8192], Access::NONE).unwrap();
    /// let write = SendOp::Write { remote_stag: inbox.rkey(), remote_to: inbox.addr() };
    /// let send = SendOp::Send { solicited: false, invalidate: None };
    /// sender.post_send_list([
    ///     SendWr { wr_id: 2, op: write, sgl: data.sge_all().into(), signaled: false },
    ///     SendWr { wr_id: 3, op: send, sgl: Default::default(), signaled: false },
    /// ]).unwrap();
    /// assert_eq!(rcq.wait(t).unwrap().opcode, WcOpcode::Recv);
    /// // SAFETY: the Send's receive completion, posted by the peer after its Write, has been
    /// // polled: the Write is in place; the peer writes nothing more and nothing else writes
    /// // the region while the slice lives.
    /// let bytes = unsafe { inbox.view().as_slice() };
    /// assert!(bytes.iter().all(|&b| b == 42));
    /// # sender.disconnect();
    /// ```
    pub fn view(&self) -> &RegionView {
        &self.view
    }

    /// Sets the key part of the handle's STag (verbs `ib_update_fast_reg_key`) and returns the
    /// new STag, for a [`SendOp::FastRegister`] that gives the region that key.
    pub fn update_key(&self, key: u8) -> STag {
        let stag = STag::from_parts(self.lkey().index(), key).unwrap_or(self.lkey());
        self.stag.store(stag.0, Ordering::Relaxed);
        stag
    }

    /// A fast-register work request for this region (allocated with
    /// [`ProtectionDomain::alloc_mr`], or invalidated since): its first `len` bytes at
    /// [`MemoryRegion::addr`] become valid with `access` under the key `key` (the handle's
    /// STag takes the key now, as [`MemoryRegion::update_key`]).
    pub fn fast_register_op(&self, key: u8, len: u64, access: Access) -> SendOp {
        SendOp::FastRegister { stag: self.update_key(key), addr: self.va, len, access }
    }

    /// Makes the region valid again after an invalidation (a local invalidate, or a peer's
    /// Send with Invalidate), with the same range and rights and the new key `key`, at once
    /// rather than through a work request. Returns the new STag; the old one stays invalid.
    pub fn revalidate(&self, key: u8) -> Result<STag, RegisterError> {
        let mut core = self.dev.core();
        let (stag, _) =
            current(&core, self.lkey()).ok_or(RegisterError::Table(TableError::NoSuchStag(self.lkey())))?;
        let new = core.table.rekey(stag, key).map_err(RegisterError::Table)?;
        self.stag.store(new.0, Ordering::Relaxed);
        Ok(new)
    }

    /// Whether the STag is valid now (a peer may use it as far as its rights go).
    pub fn is_valid(&self) -> bool {
        let core = self.dev.core();
        current(&core, self.lkey()).is_some_and(|(s, e)| e.valid && s == self.lkey())
    }

    /// Deregisters the region and gives its memory back: the buffer it was registered over,
    /// with what peers and the application wrote in it ([`Buffer::Foreign`] for foreign
    /// memory, which is the caller's again). Waits for an engine pass in progress; a message
    /// still arriving for the region is terminated. Refused while memory windows are bound to
    /// it (the region is handed back with the error).
    pub fn deregister(self) -> Result<Buffer, (MemoryRegion, RegisterError)> {
        let result = {
            let mut core = self.dev.core();
            match current(&core, self.lkey()) {
                Some((stag, _)) => core.table.deregister(stag).map(|(_, memory)| memory),
                None => Err(TableError::NoSuchStag(self.lkey())),
            }
        };
        match result {
            Ok(memory) => {
                let mut this = self;
                this.live = false;
                Ok(memory.map_or_else(|| Buffer::Vec(Vec::new()), RegionMemory::into_buffer))
            }
            Err(e) => Err((self, RegisterError::Table(e))),
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let mut core = self.dev.core();
        if let Some((stag, _)) = current(&core, self.lkey()) {
            // Windows still bound are unbound: the memory must not outlive the registration.
            let _ = core.table.deregister_unbinding(stag);
        }
    }
}

/// A memory window (type 2): a peer-visible part of a region with rights of its own, bound
/// and re-bound by work requests ([`SendOp::BindWindow`]) and unbound by invalidation.
/// Deallocated when dropped.
pub struct MemoryWindow {
    stag: AtomicU32,
    dev: Arc<Engine>,
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow").field("stag", &self.rkey()).finish()
    }
}

impl MemoryWindow {
    /// The window's STag, given to peers as the rkey.
    pub fn rkey(&self) -> STag {
        STag(self.stag.load(Ordering::Relaxed))
    }

    /// A bind work request: the window, under the new key `key` (the handle's STag takes it
    /// now), grants `access` to `len` bytes of `region` from byte `offset`. The range must lie
    /// inside the region, the rights within the region's, and the window must be unbound
    /// (newly allocated, or invalidated).
    pub fn bind_op(&self, key: u8, region: &MemoryRegion, offset: usize, len: u64, access: Access) -> SendOp {
        let window = STag::from_parts(self.rkey().index(), key).unwrap_or(self.rkey());
        self.stag.store(window.0, Ordering::Relaxed);
        SendOp::BindWindow { window, region: region.lkey(), addr: region.addr() + offset as u64, len, access }
    }

    /// Whether the window is bound and valid now.
    pub fn is_valid(&self) -> bool {
        let core = self.dev.core();
        current(&core, self.rkey()).is_some_and(|(s, e)| e.valid && s == self.rkey())
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let mut core = self.dev.core();
        if let Some((stag, _)) = current(&core, self.rkey()) {
            let _ = core.table.deregister(stag);
        }
    }
}
