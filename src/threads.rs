//! Threads the stack starts on behalf of a call (the engine, inline mode's async driver, the
//! connection manager's set-up threads).
//!
//! A thread's first moments run in the C library: glibc gives a new thread its own malloc
//! arena, and making one maps 128 MiB and unmaps the parts that do not fit its alignment. Some
//! programs patch those C library functions at run time: libfabric's `memhooks` memory monitor
//! (what its verbs provider's registration cache uses where userfaultfd is not available)
//! overwrites the first 13 bytes of `munmap`, `mmap`, `madvise` and others with a jump to its
//! own code when a domain opens. A thread that is inside `munmap` at that moment returns from
//! the system call into the middle of the new instruction and dies (SIGSEGV at `munmap+9`, a
//! write to `munmap+6`). libfabric opens the device (and so starts the engine) in
//! `fi_getinfo` and opens the domain right after: under load the engine thread was still
//! making its arena then, and about one `fi_pingpong` client in a few hundred crashed.
//!
//! [`spawn_settled`] returns only once the new thread runs the caller's code, past the C
//! library's set-up, and has done its own (the engine allocates what its loop needs), so
//! nothing the call started is inside those functions when it returns: an idle engine waits
//! in system calls of its own, not the C library's.

use std::io;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Starts a thread named `name` that runs `f`, and returns once `f` has said it is
/// [`Settled::settled`] (or dropped that handle, or returned).
///
/// Fails as [`std::thread::Builder::spawn`] does.
pub(crate) fn spawn_settled<F, T>(name: &str, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce(Settled) -> T + Send + 'static,
    T: Send + 'static,
{
    let (tell, told) = mpsc::sync_channel::<()>(1);
    let thread = std::thread::Builder::new().name(name.into()).spawn(move || f(Settled(tell)))?;
    // An error here is the handle dropped unused: the thread is past its set-up all the same.
    let _ = told.recv();
    Ok(thread)
}

/// What a thread started by [`spawn_settled`] uses to let the spawner return.
#[derive(Debug)]
pub(crate) struct Settled(mpsc::SyncSender<()>);

impl Settled {
    /// The thread has done what it must do before the spawner goes on (its own set-up).
    pub(crate) fn settled(self) {
        let _ = self.0.send(());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::spawn_settled;

    #[test]
    fn the_spawn_returns_once_the_thread_says_it_has_settled() {
        for _ in 0..50 {
            let begun = Arc::new(AtomicBool::new(false));
            let flag = begun.clone();
            let t = spawn_settled("settled-test", move |settled| {
                // Long enough that a spawn that did not wait would return well before this.
                std::thread::sleep(Duration::from_millis(1));
                flag.store(true, Ordering::Release);
                settled.settled();
                7
            })
            .unwrap();
            assert!(begun.load(Ordering::Acquire), "spawn_settled returned before the thread settled");
            assert_eq!(t.thread().name(), Some("settled-test"));
            assert_eq!(t.join().unwrap(), 7);
        }
    }

    #[test]
    fn a_thread_that_never_says_so_does_not_hold_the_spawner() {
        let t = spawn_settled("settled-test", drop).unwrap();
        t.join().unwrap();
        let t = spawn_settled("settled-test", |_| panic!("before settling")).unwrap();
        assert!(t.join().is_err());
    }
}
