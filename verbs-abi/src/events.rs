//! The file descriptors applications wait on: a completion channel, an rdma_cm event
//! channel, a context's async fd. Each is the read end of a pipe whose write end the library
//! keeps: an event is one 8-byte record (the number of the object it concerns), written
//! whole (pipe writes up to PIPE_BUF are atomic) and read whole. The descriptor is real, so
//! applications poll it, make it non-blocking (`read` then fails with `EAGAIN`), and a
//! blocking read is a cancellation point (`pthread_cancel` works on a thread waiting in
//! `ibv_get_cq_event`).

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

use crate::ffi::Result;

/// A pipe carrying event records.
pub(crate) struct EventPipe {
    read: OwnedFd,
    write: Option<OwnedFd>,
}

/// Write ends of pipes whose channel was destroyed, kept open a while: closing one would
/// wake a thread still blocked reading the channel with end-of-file (an error), where a
/// kernel channel leaves such a thread asleep (rping destroys its channel while its event
/// thread waits, and exits). The oldest are closed once more than [`GRAVEYARD`] pile up.
static CLOSED: Mutex<VecDeque<OwnedFd>> = Mutex::new(VecDeque::new());
const GRAVEYARD: usize = 64;

impl Drop for EventPipe {
    fn drop(&mut self) {
        if let Some(w) = self.write.take() {
            let mut closed = CLOSED.lock().unwrap_or_else(PoisonError::into_inner);
            closed.push_back(w);
            while closed.len() > GRAVEYARD {
                closed.pop_front();
            }
        }
    }
}

impl EventPipe {
    pub(crate) fn new() -> Result<EventPipe> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by no one else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The library never blocks on the write end: a full pipe (8192 unread events) drops
        // the event rather than stalling the engine.
        // SAFETY: fcntl on a descriptor this function owns.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        Ok(EventPipe { read, write: Some(write) })
    }

    /// The descriptor the application gets.
    pub(crate) fn fd(&self) -> c_int {
        self.read.as_raw_fd()
    }

    /// Posts an event record; false if the pipe is full.
    pub(crate) fn post(&self, id: u64) -> bool {
        let bytes = id.to_ne_bytes();
        let Some(w) = &self.write else { return false };
        // SAFETY: writes 8 bytes from a live local array to a descriptor this pipe owns.
        let n = unsafe { libc::write(w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        if n != 8 {
            tracing::warn!(id, "event pipe full: an event is dropped");
        }
        n == 8
    }
}

/// A descriptor that never becomes readable: the event queue of a device context's async
/// events, which nothing posts to. An eventfd: one descriptor where a pipe takes two (a
/// process that counts its descriptors, as netcat does over rsockets, sees a number close to
/// rdma-core's), and closing it leaves a thread blocked reading it asleep, as a kernel
/// context's does. A read blocks (or fails with `EAGAIN` once the application made the
/// descriptor non-blocking).
pub(crate) struct QuietFd(OwnedFd);

impl QuietFd {
    pub(crate) fn new() -> Result<QuietFd> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
        }
        // SAFETY: eventfd succeeded: the descriptor is open and owned by no one else.
        Ok(QuietFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor the application gets.
    pub(crate) fn fd(&self) -> c_int {
        self.0.as_raw_fd()
    }
}

unsafe extern "C-unwind" {
    /// libc's `read(2)`, declared as able to unwind: it is a cancellation point, and
    /// `pthread_cancel` unwinds the thread from inside it.
    #[link_name = "read"]
    fn read_cancellable(fd: c_int, buf: *mut c_void, count: usize) -> isize;
}

/// Reads one event record from `fd`, blocking unless the application made the descriptor
/// non-blocking: the record, or `Err(errno)` (`EAGAIN`, `EINTR`, ...; `EIO` when the other
/// end is gone). Called only where no value with a destructor is live, so that a thread
/// cancelled inside the read unwinds through plain frames.
#[inline(always)]
pub(crate) fn read_record(fd: c_int) -> std::result::Result<u64, c_int> {
    let mut record = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local array; `fd` is a descriptor number
    // (an invalid one makes read fail with EBADF).
    let n = unsafe { read_cancellable(fd, record.as_mut_ptr().cast(), record.len()) };
    match n {
        8 => Ok(u64::from_ne_bytes(record)),
        n if n < 0 => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)),
        _ => Err(libc::EIO),
    }
}
