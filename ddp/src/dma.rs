//! The DMA engine: the one module of the stack that reads and writes registered memory through
//! raw pointers. Everything else reaches region bytes through the safe methods here.
//!
//! # The model
//!
//! Registered memory is the application's memory, as on an RNIC. A region is registered over
//! bytes the application hands in ([`RegionMemory`]):
//!
//! - an **owned buffer** (`Vec<u8>`, `Box<[u8]>`, `bytes::BytesMut`, or a page-aligned
//!   [`PageBuffer`] the stack allocates): the region owns it while registered, never moves or
//!   reallocates it, and gives it back, bytes intact, on deregistration
//!   ([`RegionMemory::into_buffer`]);
//! - **foreign memory** ([`RegionMemory::from_raw_parts`], `unsafe`): a pointer and a length
//!   under the contract of verbs' `ibv_reg_mr`: the bytes stay valid, and are not freed or
//!   unmapped, until the registration is gone (for a C verbs ABI).
//!
//! Inside the stack a [`RegionMemory`] is owned by the tagged buffer table entry it is
//! registered in, and behaves like an owned byte buffer: copies out take `&self`
//! ([`RegionMemory::read`]), copies in and atomics take `&mut self` ([`RegionMemory::write`],
//! [`RegionMemory::fetch_update_u64`]). The engine holds the table, hence every region, behind
//! one lock for a whole pass, and the application's safe copies
//! (`iwarp::MemoryRegion::read`/`write`) take the same lock: no two accesses through the stack
//! ever overlap in time, so none of them is a data race. The borrow checker proves it inside
//! the stack; no `Arc`, no atomics, no per-segment lock, and a copy is a plain `memcpy`.
//!
//! **Deregistration and invalidation.** Removing a region from the table needs the table
//! mutably, which an in-flight placement or Read Response segment borrows: deregistration
//! waits for the engine's pass to end (it takes the engine's lock) and can never free memory
//! under a copy. Invalidation only flips the entry's valid bit; the next access through the
//! STag is refused before any byte is touched. A message whose later segments meet a
//! deregistered or invalidated region is terminated, never placed.
//!
//! **Zero-copy access** ([`RegionView`]) is the RDMA contract, and therefore `unsafe`: a peer
//! (or the engine on behalf of a local work request) may read or write the region whenever a
//! valid STag, a posted receive or an outstanding RDMA Read names it. Bytes a peer writes are
//! defined once the completion that follows them has been polled (the completion queue
//! publishes the engine's writes with a release store that the poll acquires), and stay
//! defined until the application lets the peer write again. Bytes the application writes are
//! seen by the engine once the work request that reads them is posted. A view may be used
//! only inside such a window; outside it, the view and the engine's copy would race (undefined
//! behaviour, as in C: the verbs contract is the same).
//!
//! The raw copies are `core::ptr::copy_nonoverlapping` over the checked sub-range only: the
//! engine never forms a reference to more of the region than the bytes it copies, so it does
//! not alias an application's view of other bytes of the same region.
//!
//! `unsafe` lives only in this module, each block with its `// SAFETY:` argument; the tests at
//! the bottom also run under AddressSanitizer (scripts/asan.sh).

use core::alloc::Layout;
use core::fmt;
use core::mem::ManuallyDrop;
use core::ptr::{self, NonNull};

use bytes::BytesMut;

/// The alignment of a [`PageBuffer`]: the page size of every target the stack runs on.
pub const PAGE_SIZE: usize = 4096;

/// An access outside a [`RegionMemory`] (or one whose end overflows `usize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutOfBounds {
    /// The offset of the access's first byte.
    pub offset: usize,
    /// The access's length.
    pub len: usize,
    /// The memory's length.
    pub memory_len: usize,
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "access of {} bytes at offset {} outside memory of {} bytes",
            self.len, self.offset, self.memory_len
        )
    }
}

impl std::error::Error for OutOfBounds {}

/// A zeroed, page-aligned byte buffer the stack allocates (what
/// `ProtectionDomain::register(len, ..)` registers), owned like a `Box<[u8]>`.
pub struct PageBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a PageBuffer owns its allocation exclusively, like a Box<[u8]>; nothing else points
// into it, so moving it to another thread or sharing `&PageBuffer` is as safe as for a Box.
unsafe impl Send for PageBuffer {}
// SAFETY: as above; `&PageBuffer` only gives out `&[u8]`.
unsafe impl Sync for PageBuffer {}

impl PageBuffer {
    /// `len` zero bytes, the first at a multiple of [`PAGE_SIZE`]. Aborts, as `Vec` does, if
    /// the allocation fails.
    pub fn zeroed(len: usize) -> PageBuffer {
        if len == 0 {
            return PageBuffer { ptr: NonNull::dangling(), len: 0 };
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (len > 0).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        PageBuffer { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, PAGE_SIZE) {
            Ok(l) => l,
            // Only a length within a page of isize::MAX gets here; no allocator could serve it.
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<[u8; PAGE_SIZE]>()),
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl core::ops::Deref for PageBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of an allocation of `len` initialised (zeroed) bytes owned
        // by `self` (or dangling with len 0), and `&self` excludes any `&mut` to them.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl core::ops::DerefMut for PageBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference to the bytes.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with exactly this layout and not freed since.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl fmt::Debug for PageBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageBuffer").field("len", &self.len).finish_non_exhaustive()
    }
}

/// Foreign memory given back on deregistration: the pointer and length a
/// [`RegionMemory::from_raw_parts`] registration was made with. The stack frees nothing; the
/// memory is the caller's again. Neither `Clone` nor constructible outside this module: at
/// most one registration holds the memory at a time.
#[derive(Debug, PartialEq, Eq)]
pub struct ForeignMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a ForeignMemory is an address and a length; nothing dereferences it outside
// `RegionMemory`, whose `from_raw_parts` contract covers use from any thread.
unsafe impl Send for ForeignMemory {}

impl ForeignMemory {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An owned allocation with guard bytes before and after a window; the window is what a
/// region registers, the guards are there to be checked. For tests and fuzzing: a write or
/// read that strays out of the window by even one byte changes (or returns) a guard byte.
pub struct GuardedBuffer {
    alloc: Vec<u8>,
    before: usize,
    len: usize,
}

impl GuardedBuffer {
    /// `before` guard bytes holding `guard`, then the window holding `window`, then `after`
    /// guard bytes holding `guard`.
    pub fn new(before: usize, window: &[u8], after: usize, guard: u8) -> GuardedBuffer {
        let mut alloc = Vec::with_capacity(before + window.len() + after);
        alloc.resize(before, guard);
        alloc.extend_from_slice(window);
        alloc.resize(before + window.len() + after, guard);
        GuardedBuffer { alloc, before, len: window.len() }
    }

    /// The whole allocation: guards and window.
    pub fn allocation(&self) -> &[u8] {
        &self.alloc
    }

    /// The window.
    pub fn window(&self) -> &[u8] {
        &self.alloc[self.before..self.before + self.len]
    }

    /// Whether every guard byte still holds `guard`.
    pub fn guards_hold(&self, guard: u8) -> bool {
        let (head, rest) = self.alloc.split_at(self.before);
        head.iter().chain(&rest[self.len..]).all(|&b| b == guard)
    }
}

impl fmt::Debug for GuardedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedBuffer")
            .field("before", &self.before)
            .field("len", &self.len)
            .field("after", &(self.alloc.len() - self.before - self.len))
            .finish()
    }
}

/// The memory a region was registered over, given back by [`RegionMemory::into_buffer`].
#[derive(Debug)]
pub enum Buffer {
    /// A vector (its length is the region's; its capacity comes back unchanged).
    Vec(Vec<u8>),
    /// A boxed slice.
    Boxed(Box<[u8]>),
    /// A `bytes::BytesMut`.
    BytesMut(BytesMut),
    /// A page-aligned buffer the stack allocated.
    Page(PageBuffer),
    /// Foreign memory registered with [`RegionMemory::from_raw_parts`].
    Foreign(ForeignMemory),
    /// A buffer with guard bytes around the registered window.
    Guarded(GuardedBuffer),
}

impl Buffer {
    /// The bytes of an owned buffer (the window of a guarded one); `None` for foreign memory,
    /// which only its owner may read.
    pub fn as_slice(&self) -> Option<&[u8]> {
        match self {
            Buffer::Vec(v) => Some(v),
            Buffer::Boxed(b) => Some(b),
            Buffer::BytesMut(b) => Some(b),
            Buffer::Page(p) => Some(p),
            Buffer::Foreign(_) => None,
            Buffer::Guarded(g) => Some(g.window()),
        }
    }

    /// The buffer as a vector: a `Vec` comes back as it was, other owned buffers are copied;
    /// `None` for foreign memory.
    pub fn into_vec(self) -> Option<Vec<u8>> {
        match self {
            Buffer::Vec(v) => Some(v),
            Buffer::Boxed(b) => Some(b.into_vec()),
            other => other.as_slice().map(<[u8]>::to_vec),
        }
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Buffer {
        Buffer::Vec(v)
    }
}

impl From<Box<[u8]>> for Buffer {
    fn from(b: Box<[u8]>) -> Buffer {
        Buffer::Boxed(b)
    }
}

impl From<BytesMut> for Buffer {
    fn from(b: BytesMut) -> Buffer {
        Buffer::BytesMut(b)
    }
}

impl From<PageBuffer> for Buffer {
    fn from(p: PageBuffer) -> Buffer {
        Buffer::Page(p)
    }
}

impl From<GuardedBuffer> for Buffer {
    fn from(g: GuardedBuffer) -> Buffer {
        Buffer::Guarded(g)
    }
}

/// Who owns the bytes behind a [`RegionMemory`] and how to give them back.
enum Owner {
    /// A vector taken apart (`ptr`, `len` and this capacity rebuild it).
    Vec { capacity: usize },
    /// A boxed slice taken apart (`ptr` and `len` rebuild it).
    Boxed,
    /// Kept whole: its buffer does not move when the handle moves.
    BytesMut(BytesMut),
    /// Kept whole, likewise.
    Page(PageBuffer),
    /// Kept whole, likewise; `ptr` points at the window.
    Guarded(GuardedBuffer),
    /// The caller's, under the `from_raw_parts` contract.
    Foreign,
}

/// The bytes of a registered region: the application's memory, owned by the region while it
/// is registered. See the module documentation for the model.
pub struct RegionMemory {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

// SAFETY: a RegionMemory owns its bytes exclusively (owned buffers), or holds foreign memory
// whose registration contract (`from_raw_parts`) makes it usable from any thread until
// deregistered; moving the handle to another thread moves that ownership, as for a Box.
unsafe impl Send for RegionMemory {}
// SAFETY: `&RegionMemory` only copies bytes out (`read`, `to_vec`, `slice`); every write
// takes `&mut self`. Shared references therefore only ever read concurrently, as with `&[u8]`.
unsafe impl Sync for RegionMemory {}

impl fmt::Debug for RegionMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.owner {
            Owner::Vec { .. } => "Vec",
            Owner::Boxed => "Box",
            Owner::BytesMut(_) => "BytesMut",
            Owner::Page(_) => "Page",
            Owner::Guarded(_) => "Guarded",
            Owner::Foreign => "Foreign",
        };
        f.debug_struct("RegionMemory").field("len", &self.len).field("owner", &kind).finish()
    }
}

impl Drop for RegionMemory {
    fn drop(&mut self) {
        // Owned buffers are rebuilt and dropped (freed); foreign memory is left alone.
        drop(self.take_buffer());
    }
}

impl RegionMemory {
    /// Memory over an owned buffer, which comes back, bytes intact, from
    /// [`RegionMemory::into_buffer`].
    pub fn new(buffer: impl Into<Buffer>) -> RegionMemory {
        match buffer.into() {
            Buffer::Vec(v) => {
                let mut v = ManuallyDrop::new(v);
                let (len, capacity) = (v.len(), v.capacity());
                // A Vec's pointer is never null (dangling when it has not allocated).
                let ptr = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
                RegionMemory { ptr, len, owner: Owner::Vec { capacity } }
            }
            Buffer::Boxed(b) => {
                let len = b.len();
                let raw: *mut [u8] = Box::into_raw(b);
                let ptr = NonNull::new(raw.cast::<u8>()).unwrap_or(NonNull::dangling());
                RegionMemory { ptr, len, owner: Owner::Boxed }
            }
            Buffer::BytesMut(mut b) => {
                let ptr = NonNull::new(b.as_mut_ptr()).unwrap_or(NonNull::dangling());
                RegionMemory { ptr, len: b.len(), owner: Owner::BytesMut(b) }
            }
            Buffer::Page(mut p) => {
                let ptr = NonNull::new(p.as_mut_ptr()).unwrap_or(NonNull::dangling());
                RegionMemory { ptr, len: p.len(), owner: Owner::Page(p) }
            }
            Buffer::Guarded(mut g) => {
                let (before, len) = (g.before, g.len);
                let base = g.alloc.as_mut_ptr();
                // `before` is inside the allocation (new made it so).
                let ptr = NonNull::new(base.wrapping_add(before)).unwrap_or(NonNull::dangling());
                RegionMemory { ptr, len, owner: Owner::Guarded(g) }
            }
            Buffer::Foreign(f) => {
                // SAFETY: a ForeignMemory only comes from `into_buffer` of a `from_raw_parts`
                // registration, and is not Clone: its contract, which covers registrations
                // made again from the memory it gives back, still holds, and no other
                // registration holds the memory now.
                unsafe { RegionMemory::from_raw_parts(f.ptr, f.len) }
            }
        }
    }

    /// `len` zero bytes in a page-aligned buffer the stack allocates.
    pub fn zeroed(len: usize) -> RegionMemory {
        RegionMemory::new(PageBuffer::zeroed(len))
    }

    /// A page-aligned buffer holding a copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> RegionMemory {
        let mut p = PageBuffer::zeroed(bytes.len());
        p.copy_from_slice(bytes);
        RegionMemory::new(p)
    }

    /// Memory the caller owns and keeps: `len` bytes at `ptr` (verbs' `ibv_reg_mr`). Nothing is
    /// freed when the region goes; [`RegionMemory::into_buffer`] gives back
    /// [`Buffer::Foreign`].
    ///
    /// # Safety
    ///
    /// Until this `RegionMemory`, and every one made again from the [`Buffer::Foreign`] it
    /// gives back, is dropped or turned back into a [`Buffer`]:
    ///
    /// - `ptr` is non-null and `[ptr, ptr + len)` is one allocation (or mapping) of `len`
    ///   readable and writable bytes, initialised, which is not freed, unmapped or shrunk, and
    ///   which no other registration covers;
    /// - nothing accesses those bytes while the stack may (see the module's model): the
    ///   application touches them only between the completion that published the stack's
    ///   last access and the work request (or STag grant) that allows the next one, and never
    ///   through a Rust reference that outlives that window.
    ///
    /// `len` may be 0 (any non-null `ptr`).
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> RegionMemory {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        RegionMemory { ptr, len, owner: Owner::Foreign }
    }

    /// Ends the registration's hold on the bytes and gives back what was registered.
    pub fn into_buffer(mut self) -> Buffer {
        let b = self.take_buffer();
        // `self` now owns nothing; its Drop gives back nothing more.
        drop(self);
        b
    }

    /// Rebuilds the buffer and leaves `self` owning nothing (length 0, foreign).
    fn take_buffer(&mut self) -> Buffer {
        let (ptr, len) = (self.ptr.as_ptr(), self.len);
        let owner = core::mem::replace(&mut self.owner, Owner::Foreign);
        self.ptr = NonNull::dangling();
        self.len = 0;
        match owner {
            Owner::Vec { capacity } => {
                // SAFETY: ptr, len and capacity are exactly what a Vec<u8> was taken apart into
                // in `new` (ManuallyDrop, never freed or reallocated since), and the Vec is
                // rebuilt only once: `owner` was replaced above.
                Buffer::Vec(unsafe { Vec::from_raw_parts(ptr, len, capacity) })
            }
            Owner::Boxed => {
                let raw = ptr::slice_from_raw_parts_mut(ptr, len);
                // SAFETY: ptr and len are what `Box::into_raw` returned for a Box<[u8]> in
                // `new`; rebuilt only once, as above.
                Buffer::Boxed(unsafe { Box::from_raw(raw) })
            }
            Owner::BytesMut(b) => Buffer::BytesMut(b),
            Owner::Page(p) => Buffer::Page(p),
            Owner::Guarded(g) => Buffer::Guarded(g),
            Owner::Foreign => Buffer::Foreign(ForeignMemory { ptr, len }),
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks `[offset, offset + len)` against the memory.
    #[inline]
    fn bounds(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds { offset, len, memory_len: self.len }),
        }
    }

    /// Whether `[offset, offset + len)` lies inside the memory (the end not overflowing).
    pub fn contains_range(&self, offset: usize, len: usize) -> bool {
        self.bounds(offset, len).is_ok()
    }

    /// Copies `src` into the memory at `offset` (one `memcpy`). Nothing is written if the range
    /// is not inside the memory.
    #[inline]
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        self.bounds(offset, src.len())?;
        if !src.is_empty() {
            // SAFETY: `[offset, offset + src.len())` is inside the memory (checked above), whose
            // `len` bytes are valid for writes (owned buffer, or the from_raw_parts contract);
            // `&mut self` excludes every other access through the stack; `src` is a distinct
            // borrow, so the ranges cannot overlap (the caller cannot hold a slice of this
            // memory while lending it mutably).
            unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) }
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from `offset` into `dst` (one `memcpy`). `dst` is untouched if
    /// the range is not inside the memory.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.bounds(offset, dst.len())?;
        if !dst.is_empty() {
            // SAFETY: the source range is inside the memory (checked), valid for reads and
            // initialised; `&self` excludes writes through the stack; `dst` is an exclusive
            // borrow the memory cannot alias.
            unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) }
        }
        Ok(())
    }

    /// Sets `len` bytes from `offset` to `byte`. Nothing is written if the range is not
    /// inside the memory.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        self.bounds(offset, len)?;
        if len > 0 {
            // SAFETY: the range is inside the memory (checked) and `&mut self` is exclusive.
            unsafe { ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) }
        }
        Ok(())
    }

    /// `len` bytes from `offset`, borrowed: for the engine's zero-copy transmit (a gather
    /// list handed to the socket). `None` if the range is not inside the memory.
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        self.bounds(offset, len).ok()?;
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: the range is inside the memory (checked), initialised and valid for reads for
        // as long as `&self` lives (the memory is not freed before `self`); `&self` excludes
        // writes through the stack for that long. Only the accessed sub-range is borrowed.
        Some(unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// `len` bytes from `offset`, borrowed mutably: for the engine's zero-copy receive (the
    /// socket reads straight into place). `None` if the range is not inside the memory.
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        self.bounds(offset, len).ok()?;
        if len == 0 {
            return Some(&mut []);
        }
        // SAFETY: as in `slice`; `&mut self` makes the borrow exclusive within the stack.
        Some(unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }

    /// A copy of all the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // The range is the whole memory, so the read cannot fail.
        let _ = self.read(0, &mut v);
        v
    }

    /// Replaces the native-endian 64-bit value at `offset` (8-byte aligned within the
    /// memory, whole word inside it) with `f(value)` and returns the value it had: an RFC 7306
    /// atomic, atomic against every other access through the stack (`&mut self`). `None`
    /// when `offset` is unaligned or out of bounds.
    pub fn fetch_update_u64(&mut self, offset: usize, f: impl FnOnce(u64) -> u64) -> Option<u64> {
        if !offset.is_multiple_of(8) {
            return None;
        }
        let mut word = [0u8; 8];
        self.read(offset, &mut word).ok()?;
        let old = u64::from_ne_bytes(word);
        self.write(offset, &f(old).to_ne_bytes()).ok()?;
        Some(old)
    }

    /// The application's zero-copy handle on these bytes (see [`RegionView`]).
    pub fn view(&self) -> RegionView {
        RegionView { ptr: self.ptr, len: self.len }
    }
}

/// The application's zero-copy access to a registered region, under the RDMA contract (the
/// module documentation): reading or writing through it is `unsafe` because a peer may write
/// the region at any moment the application allowed it to.
///
/// ```
/// use iwarp_ddp::dma::RegionMemory;
/// let mut memory = RegionMemory::new(vec![0u8; 16]);
/// memory.write(4, b"peer").unwrap(); // what a placement does
/// let view = memory.view();
/// // SAFETY: nothing can write the memory now: it is in no table (no STag, no posted
/// // receive names it) and `memory` is not borrowed mutably while `bytes` lives.
/// let bytes = unsafe { view.as_slice() };
/// assert_eq!(&bytes[4..8], b"peer");
/// ```
#[derive(Debug)]
pub struct RegionView {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RegionView is an address and a length; every access through it is an unsafe
// method whose contract covers the other thread's accesses, so sending it is harmless.
unsafe impl Send for RegionView {}
// SAFETY: as above: `&RegionView` gives nothing but the address without `unsafe`.
unsafe impl Sync for RegionView {}

impl RegionView {
    /// The region's first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The region's first byte, for writing (through `unsafe` code under the contract).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's bytes, in place.
    ///
    /// # Safety
    ///
    /// For as long as the slice lives: the region stays registered (the view's owner is not
    /// deregistered or dropped), and nothing writes the bytes: no peer Write, Read Response,
    /// received Send or atomic can be placed in them (the completion after the last one was
    /// polled, and the application has not allowed the next), and no `&mut` to them exists.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller guarantees the bytes are alive, initialised and not written while
        // the slice lives; `ptr`/`len` describe the registered memory.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The region's bytes, in place, for writing.
    ///
    /// # Safety
    ///
    /// For as long as the slice lives: the region stays registered, nothing else reads or
    /// writes the bytes: no work request that reads them (Send, Write, a Read Response to a
    /// peer's Read) or writes them is in flight, no peer may access them, and no other
    /// reference to them exists.
    #[expect(clippy::mut_from_ref, reason = "the exclusivity is the caller's contract, as with raw pointers")]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the caller guarantees exclusive access to the live, initialised bytes for the
        // slice's lifetime.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| i.to_le_bytes()[0].wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Every kind of memory, holding `initial`.
    fn every_kind(initial: &[u8]) -> Vec<RegionMemory> {
        let mut bytes_mut = BytesMut::with_capacity(initial.len() + 7);
        bytes_mut.extend_from_slice(initial);
        let mut spare = Vec::with_capacity(initial.len() + 13);
        spare.extend_from_slice(initial);
        vec![
            RegionMemory::new(initial.to_vec()),
            RegionMemory::new(spare),
            RegionMemory::new(initial.to_vec().into_boxed_slice()),
            RegionMemory::new(bytes_mut),
            RegionMemory::from_bytes(initial),
            RegionMemory::new(GuardedBuffer::new(9, initial, 11, 0xee)),
        ]
    }

    #[test]
    fn every_alignment_against_vec_model() {
        for mem_len in [0usize, 1, 7, 8, 9, 31, 40] {
            let initial = pattern(mem_len, 0x55);
            for mut m in every_kind(&initial) {
                for offset in 0..=mem_len.min(20) {
                    for len in 0..=20usize {
                        let mut model = m.to_vec();
                        let data = pattern(len, 0xa0);
                        let r = m.write(offset, &data);
                        let fits = offset + len <= mem_len;
                        if fits {
                            assert_eq!(r, Ok(()));
                            model[offset..offset + len].copy_from_slice(&data);
                        } else {
                            assert_eq!(r, Err(OutOfBounds { offset, len, memory_len: mem_len }));
                        }
                        assert_eq!(m.to_vec(), model, "write {offset}+{len} into {m:?}");
                        let mut out = vec![0xeeu8; len];
                        assert_eq!(m.read(offset, &mut out).is_ok(), fits);
                        if fits {
                            assert_eq!(out, model[offset..offset + len]);
                            assert_eq!(m.slice(offset, len), Some(&model[offset..offset + len]));
                        } else {
                            assert!(out.iter().all(|&b| b == 0xee), "dst untouched on error");
                            assert!(m.slice(offset, len).is_none());
                            assert!(m.slice_mut(offset, len).is_none());
                        }
                    }
                }
                match m.into_buffer() {
                    Buffer::Guarded(g) => assert!(g.guards_hold(0xee), "guard bytes changed"),
                    b => assert_eq!(b.as_slice().map(<[u8]>::len), Some(mem_len)),
                }
            }
        }
    }

    #[test]
    fn buffers_come_back_as_they_were_handed_in() {
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(b"vector");
        let ptr = v.as_ptr();
        let mut m = RegionMemory::new(v);
        m.write(0, b"V").unwrap();
        let Buffer::Vec(v) = m.into_buffer() else { panic!("not a Vec") };
        assert_eq!((v.as_slice(), v.capacity(), v.as_ptr()), (&b"Vector"[..], 100, ptr));

        let mut m = RegionMemory::new(Box::<[u8]>::from(&b"boxed"[..]));
        m.write(4, b"!").unwrap();
        let Buffer::Boxed(b) = m.into_buffer() else { panic!("not a Box") };
        assert_eq!(&*b, b"boxe!");

        let mut bm = BytesMut::with_capacity(64);
        bm.extend_from_slice(b"bytes-mut");
        let mut m = RegionMemory::new(bm);
        m.fill(0, 5, b'B').unwrap();
        let Buffer::BytesMut(bm) = m.into_buffer() else { panic!("not a BytesMut") };
        assert_eq!(&bm[..], b"BBBBB-mut");
        assert!(bm.capacity() >= 64);

        let m = RegionMemory::zeroed(3 * PAGE_SIZE + 5);
        assert_eq!(m.view().as_ptr() as usize % PAGE_SIZE, 0, "page aligned");
        let Buffer::Page(p) = m.into_buffer() else { panic!("not a page buffer") };
        assert_eq!(p.len(), 3 * PAGE_SIZE + 5);
        assert!(p.iter().all(|&b| b == 0));
        assert!(PageBuffer::zeroed(0).is_empty());
        assert!(RegionMemory::zeroed(0).is_empty());
        assert!(format!("{p:?} {:?}", RegionMemory::zeroed(1)).contains("Page"));

        assert_eq!(Buffer::from(vec![1u8]).into_vec(), Some(vec![1]));
        assert_eq!(Buffer::from(Box::<[u8]>::from(&[2u8][..])).into_vec(), Some(vec![2]));
        assert_eq!(Buffer::from(PageBuffer::zeroed(2)).into_vec(), Some(vec![0, 0]));
    }

    /// A raw registration of the middle of an allocation: random operations agree with a
    /// shadow model, and not one byte outside the registered window changes. The window
    /// itself is read back only after the registration is gone.
    #[test]
    fn raw_registration_stays_inside_its_window() {
        let mut backing = vec![0x5au8; 64 + 100 + 64];
        let window = &mut backing[64..164];
        let (ptr, len) = (window.as_mut_ptr(), window.len());
        // SAFETY: `backing` outlives `m` (turned back into a buffer before `backing` is read
        // again) and nothing else touches it meanwhile.
        let mut m = unsafe { RegionMemory::from_raw_parts(ptr, len) };
        let mut model = vec![0x5au8; 100];
        for (i, (off, n)) in [(0usize, 100usize), (99, 1), (37, 29), (100, 0), (95, 6), (usize::MAX, 2)]
            .into_iter()
            .enumerate()
        {
            let data = pattern(n, i.to_le_bytes()[0]);
            if m.write(off, &data).is_ok() {
                model[off..off + n].copy_from_slice(&data);
            }
            let fill_at = off.wrapping_add(1);
            if m.fill(fill_at, n, 0x77).is_ok() {
                model[fill_at..fill_at + n].fill(0x77);
            }
            assert_eq!(m.to_vec(), model);
        }
        assert_eq!(
            m.fetch_update_u64(8, |v| v.wrapping_add(1)),
            Some(u64::from_ne_bytes(model[8..16].try_into().unwrap()))
        );
        let Buffer::Foreign(f) = m.into_buffer() else { panic!("not foreign") };
        assert_eq!((f.as_ptr(), f.len(), f.is_empty()), (ptr, len, false));
        let word = u64::from_ne_bytes(model[8..16].try_into().unwrap()).wrapping_add(1);
        model[8..16].copy_from_slice(&word.to_ne_bytes());
        assert!(backing[..64].iter().chain(&backing[164..]).all(|&b| b == 0x5a), "guard bytes changed");
        assert_eq!(&backing[64..164], &model[..]);
        // A foreign buffer can be registered again; dropping the region frees nothing.
        let again = RegionMemory::new(Buffer::Foreign(f));
        assert_eq!(again.len(), 100);
        drop(again);
        assert_eq!(backing.len(), 228);
    }

    #[test]
    fn fetch_update_u64_is_one_read_modify_write() {
        let mut m = RegionMemory::zeroed(20);
        m.write(8, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(m.fetch_update_u64(8, |v| v + 3), Some(5));
        let mut b = [0u8; 8];
        m.read(8, &mut b).unwrap();
        assert_eq!(u64::from_ne_bytes(b), 8);
        assert_eq!(m.fetch_update_u64(4, |v| v), None, "unaligned");
        assert_eq!(m.fetch_update_u64(16, |v| v), None, "the word passes the end");
        assert_eq!(m.to_vec()[16..], [0; 4]);
    }

    #[test]
    fn bounds_and_overflow() {
        let mut m = RegionMemory::zeroed(16);
        assert!(m.write(16, &[]).is_ok());
        assert!(m.write(17, &[]).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        assert!(m.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(m.fill(usize::MAX, 2, 1).is_err());
        assert!(m.fill(1, usize::MAX, 1).is_err());
        assert!(!m.contains_range(usize::MAX, 1));
        assert!(m.contains_range(0, 16));
        assert_eq!(m.slice(16, 0), Some(&[][..]));
        assert_eq!(m.slice_mut(3, 0), Some(&mut [][..]));
        let e = m.write(15, &[1, 2]).unwrap_err();
        assert_eq!(e, OutOfBounds { offset: 15, len: 2, memory_len: 16 });
        assert!(e.to_string().contains("16 bytes"));
        assert_eq!(m.to_vec(), vec![0u8; 16]);
        m.slice_mut(2, 3).unwrap().copy_from_slice(b"abc");
        assert_eq!(&m.to_vec()[..6], b"\0\0abc\0");
    }

    /// Regions move between threads with the table, and readers share them.
    #[test]
    fn memory_moves_and_is_shared_across_threads() {
        let mut m = RegionMemory::new(vec![0u8; 4096]);
        let mut m = std::thread::spawn(move || {
            m.fill(0, 4096, 3).unwrap();
            m
        })
        .join()
        .unwrap();
        let view = m.view();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| assert!(m.to_vec().iter().all(|&b| b == 3)));
            }
        });
        m.write(0, &[9]).unwrap();
        // SAFETY: no other access to the memory exists now; the slice ends before `m` is used.
        let first = unsafe { view.as_slice()[0] };
        assert_eq!((first, view.len(), view.is_empty()), (9, 4096, false));
        // SAFETY: as above, and this is the only reference to the bytes while it lives.
        unsafe { view.as_mut_slice()[1] = 8 };
        assert_eq!(m.to_vec()[..3], [9, 8, 3]);
        assert_eq!(view.as_mut_ptr().cast_const(), view.as_ptr());
    }

    proptest! {
        /// Random writes, reads and fills on every kind of memory agree with a Vec model; the
        /// guarded kind's guard bytes never change.
        #[test]
        fn ops_agree_with_vec(len in 0usize..100, ops in proptest::collection::vec((0usize..110, 0usize..40, any::<u8>(), 0u8..3), 0..20)) {
            for mut m in every_kind(&vec![0u8; len]) {
                let mut model = vec![0u8; len];
                for &(off, n, b, op) in &ops {
                    let fits = off + n <= len;
                    match op {
                        0 => {
                            let data = pattern(n, b);
                            prop_assert_eq!(m.write(off, &data).is_ok(), fits);
                            if fits { model[off..off + n].copy_from_slice(&data); }
                        }
                        1 => {
                            prop_assert_eq!(m.fill(off, n, b).is_ok(), fits);
                            if fits { model[off..off + n].fill(b); }
                        }
                        _ => {
                            let mut out = vec![0u8; n];
                            prop_assert_eq!(m.read(off, &mut out).is_ok(), fits);
                            if fits { prop_assert_eq!(&out[..], &model[off..off + n]); }
                        }
                    }
                    prop_assert_eq!(m.to_vec(), model.clone());
                }
                if let Buffer::Guarded(g) = m.into_buffer() {
                    prop_assert!(g.guards_hold(0xee));
                    prop_assert_eq!(g.window(), &model[..]);
                    prop_assert_eq!(g.allocation().len(), len + 20);
                }
            }
        }
    }
}
