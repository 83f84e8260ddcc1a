//! The file descriptors applications wait on: a completion channel, an rdma_cm event
//! channel, a context's async fd (a queue nothing posts to: the device raises no async
//! events, and a read blocks, or fails with `EAGAIN`). Each is one eventfd in semaphore mode: an event is a record
//! (the number of the object it concerns) in a queue beside it, and the eventfd counts the
//! records, each `read` taking one count; the reader then takes the oldest record. The
//! descriptor is real, so applications poll it, make it non-blocking (`read` then fails with
//! `EAGAIN`), and a blocking read is a cancellation point (`pthread_cancel` works on a thread
//! waiting in `ibv_get_cq_event`). One descriptor a channel, and closing it leaves a thread
//! blocked reading it asleep, as a kernel channel does (rping destroys its channel while its
//! event thread waits, and exits); a pipe took two, and its write end had to be kept open
//! after the channel was destroyed, since closing it woke such a thread with end-of-file.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, PoisonError};

use crate::ffi::Result;

/// Records waiting at most in one queue; an event beyond them is dropped rather than stalling
/// the engine (as a full pipe of 8-byte records did).
const MAX_RECORDS: usize = 8192;

/// A queue of event records behind one descriptor.
pub(crate) struct EventQueue {
    fd: OwnedFd,
    records: Mutex<VecDeque<u64>>,
}

impl EventQueue {
    /// An empty queue: an eventfd in semaphore mode (and close-on-exec) counting from 0.
    pub(crate) fn new() -> Result<EventQueue> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
        }
        // SAFETY: eventfd succeeded: the descriptor is open and owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventQueue { fd, records: Mutex::new(VecDeque::new()) })
    }

    /// The descriptor the application gets.
    pub(crate) fn fd(&self) -> c_int {
        self.fd.as_raw_fd()
    }

    /// Posts an event record; false if the queue is full.
    pub(crate) fn post(&self, id: u64) -> bool {
        {
            let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            if records.len() >= MAX_RECORDS {
                tracing::warn!(id, "event queue full: an event is dropped");
                return false;
            }
            records.push_back(id);
        }
        // The record is queued before it is counted: a reader that takes the count finds it.
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live local array to a descriptor this queue owns.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        n == 8
    }

    /// The oldest record, after [`read_record`] took its count from the descriptor.
    pub(crate) fn take(&self) -> Option<u64> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner).pop_front()
    }
}

unsafe extern "C-unwind" {
    /// libc's `read(2)`, declared as able to unwind: it is a cancellation point, and
    /// `pthread_cancel` unwinds the thread from inside it.
    #[link_name = "read"]
    fn read_cancellable(fd: c_int, buf: *mut c_void, count: usize) -> isize;
}

/// Takes one event's count from `fd`, blocking unless the application made the descriptor
/// non-blocking: `Ok` (the record is then the oldest in the descriptor's queue), or
/// `Err(errno)` (`EAGAIN`, `EINTR`, `EBADF`, ...). Called only where no value with a
/// destructor is live, so that a thread cancelled inside the read unwinds through plain
/// frames.
#[inline(always)]
pub(crate) fn read_record(fd: c_int) -> std::result::Result<(), c_int> {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live local array; `fd` is a descriptor number
    // (an invalid one makes read fail with EBADF).
    let n = unsafe { read_cancellable(fd, count.as_mut_ptr().cast(), count.len()) };
    match n {
        8 => Ok(()),
        n if n < 0 => Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)),
        _ => Err(libc::EIO),
    }
}
