//! The C boundary: errno, panics, the C structures shared with the application, the
//! registries that map a C pointer back to its object, and symbol versions.
//!
//! Every exported function runs its body through [`ptr_call`], [`errno_call`] or
//! [`minus1_call`], which catch a panic (reported as `EIO`) and turn an error into the C
//! convention of the function: NULL, the error number itself, or -1, with `errno` set in
//! every case. A pointer argument is looked up in the [`Registry`] of its type before it is
//! used: a NULL, foreign or stale pointer is an error (`EINVAL`), never dereferenced.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, PoisonError, RwLock};

/// An error number (`EINVAL`, ...).
pub(crate) type Errno = c_int;

/// The result of an exported function's body.
pub(crate) type Result<T> = std::result::Result<T, Errno>;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, turning a panic into `EIO`: no panic unwinds into C.
fn run<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!(function = name, "internal error (panic): returning EIO");
        Err(libc::EIO)
    })
}

/// The body of a function returning a pointer: NULL and `errno` on error.
pub(crate) fn ptr_call<T>(name: &str, f: impl FnOnce() -> Result<*mut T>) -> *mut T {
    run(name, f).unwrap_or_else(|e| {
        set_errno(e);
        std::ptr::null_mut()
    })
}

/// The body of a function returning 0 or an error number (most of libibverbs): the error
/// number, with `errno` set to it too.
pub(crate) fn errno_call(name: &str, f: impl FnOnce() -> Result<()>) -> c_int {
    match run(name, f) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

/// The body of a function returning a non-negative value or -1 with `errno` (librdmacm,
/// `ibv_get_cq_event`, `ibv_poll_cq`).
pub(crate) fn minus1_call(name: &str, f: impl FnOnce() -> Result<c_int>) -> c_int {
    run(name, f).unwrap_or_else(|e| {
        set_errno(e);
        -1
    })
}

/// A C structure the application holds a pointer to. Its fields are plain C data: the
/// application reads them (and may write some, as `qp_context`), this library writes them
/// when an API call changes them, with no synchronisation, exactly as rdma-core does.
pub(crate) struct CStruct<T>(UnsafeCell<T>);

// SAFETY: the wrapped values are plain C data (integers and pointers the library never
// dereferences through this wrapper without a registry lookup); sharing them between
// threads is what the C API does with the same structures.
unsafe impl<T> Send for CStruct<T> {}
// SAFETY: as for Send; concurrent access follows the C API's rules (the application
// serialises calls on one object, as with rdma-core).
unsafe impl<T> Sync for CStruct<T> {}

impl<T> CStruct<T> {
    pub(crate) fn new(value: T) -> CStruct<T> {
        CStruct(UnsafeCell::new(value))
    }

    /// The pointer the application gets.
    pub(crate) fn ptr(&self) -> *mut T {
        self.0.get()
    }

    /// Changes fields: `f` must not keep the reference. Only called while the library owns
    /// the object (before handing it out) or from an API call on it.
    pub(crate) fn update(&self, f: impl FnOnce(&mut T)) {
        // SAFETY: the pointer is valid (it points into self); the C API has the caller
        // serialise calls that change an object with any use of it, so no other reference
        // to the fields is live during `f`.
        f(unsafe { &mut *self.0.get() })
    }

    /// A copy of the structure.
    pub(crate) fn read(&self) -> T
    where
        T: Copy,
    {
        // SAFETY: the pointer is valid and aligned; T is Copy plain data.
        unsafe { std::ptr::read(self.0.get()) }
    }
}

/// A zeroed C structure (every rdma-core structure is valid all-zero: integers, pointers,
/// nullable function pointers, pthread objects whose zero is their static initializer).
pub(crate) fn zeroed<T: ZeroedC>() -> T {
    // SAFETY: ZeroedC is only implemented for C structures valid when all-zero (see the
    // trait).
    unsafe { std::mem::zeroed() }
}

/// C structures whose all-zero bit pattern is a valid value.
///
/// # Safety
///
/// Implement only for `repr(C)` types made of integers, raw pointers, `Option`s of function
/// pointers, arrays and unions of those.
pub(crate) unsafe trait ZeroedC {}

/// A hasher for addresses: one multiplication.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type AddrMap<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;

/// The live objects of one kind, by the address of the C structure the application holds.
/// Looking a pointer up is how every exported function checks its arguments; the `Arc` it
/// gives keeps the object alive for the call even if another thread destroys it meanwhile.
pub(crate) struct Registry<T> {
    map: RwLock<AddrMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new() -> Registry<T> {
        Registry { map: RwLock::new(HashMap::with_hasher(BuildHasherDefault::new())) }
    }

    pub(crate) fn insert<C>(&self, ptr: *mut C, obj: Arc<T>) {
        self.insert_key(ptr as usize, obj);
    }

    /// The object behind `ptr`, or `EINVAL` (NULL, foreign, destroyed).
    pub(crate) fn get<C>(&self, ptr: *const C) -> Result<Arc<T>> {
        if ptr.is_null() {
            return Err(libc::EINVAL);
        }
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(ptr as usize))
            .cloned()
            .ok_or(libc::EINVAL)
    }

    pub(crate) fn remove<C>(&self, ptr: *const C) -> Option<Arc<T>> {
        self.remove_key(ptr as usize)
    }

    /// Registers `obj` under a number instead of an address.
    pub(crate) fn insert_key(&self, key: usize, obj: Arc<T>) {
        self.map.write().unwrap_or_else(PoisonError::into_inner).insert(key, obj);
    }

    /// The object registered under `key`, or `EINVAL`.
    pub(crate) fn get_key(&self, key: usize) -> Result<Arc<T>> {
        self.map.read().unwrap_or_else(PoisonError::into_inner).get(&key).cloned().ok_or(libc::EINVAL)
    }

    pub(crate) fn remove_key(&self, key: usize) -> Option<Arc<T>> {
        self.map.write().unwrap_or_else(PoisonError::into_inner).remove(&key)
    }

    /// Runs `f` on every live object (on a snapshot: `f` may use the registry).
    pub(crate) fn for_each(&self, f: impl Fn(&T)) {
        let all: Vec<Arc<T>> =
            self.map.read().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
        for o in &all {
            f(o);
        }
    }
}

/// A static NUL-terminated C string.
pub(crate) fn cstr(s: &'static std::ffi::CStr) -> *const c_char {
    s.as_ptr()
}

/// Copies `s` into a fixed C char array, NUL-terminated (cut if too long).
pub(crate) fn fill_chars(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// Gives every listed function its rdma-core symbol version as the default version
/// (`name@@NODE`). The directive must sit in the module that defines the functions (the
/// same object file).
macro_rules! symver {
    ($node:literal: $($name:ident),+ $(,)?) => {
        $(
            core::arch::global_asm!(concat!(
                ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
            ));
        )+
    };
}
