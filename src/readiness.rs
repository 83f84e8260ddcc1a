//! The engine's readiness poll: one epoll instance with every link and stack registered
//! (edge-triggered), and an eventfd doorbell that wakes whoever sleeps in it.
//!
//! Any thread may wait in it at the same time as others, each with its own event buffer: the
//! kernel hands each event to one waiter, the one that started waiting last. That is what
//! lets a thread waiting for a completion sleep in the poll itself while the engine thread
//! sleeps there too: the input it waits for then wakes it, not the engine thread first and
//! then it (see `CompletionQueue::wait`).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{EventfdFlags, Timespec, eventfd};

/// A registration's key: a connection's key, or one of the reserved ones below.
pub(crate) type Token = u64;
/// The doorbell's token.
pub(crate) const DOORBELL: Token = u64::MAX;
/// The first attached stack's token; the next ones count down from it.
pub(crate) const STACK_BASE: Token = u64::MAX - 1;

/// What one readiness event says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    pub(crate) token: Token,
    /// Bytes to read, the peer's close, or an error (which a read reports).
    pub(crate) readable: bool,
    /// Room to write, or an error (which a write reports).
    pub(crate) writable: bool,
}

/// Events taken from the kernel per `epoll_wait` call.
const BATCH: usize = 256;

/// An event buffer, one per waiting thread.
#[derive(Debug, Default)]
pub(crate) struct Events {
    ready: Vec<Ready>,
}

impl Events {
    pub(crate) fn with_capacity(n: usize) -> Events {
        Events { ready: Vec::with_capacity(n) }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Ready> {
        self.ready.iter()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }
}

/// The poll and its doorbell.
#[derive(Debug)]
pub(crate) struct Poll {
    epoll: OwnedFd,
    doorbell: OwnedFd,
}

impl Poll {
    pub(crate) fn new() -> io::Result<Poll> {
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        let doorbell = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        epoll::add(&epoll, &doorbell, EventData::new_u64(DOORBELL), EventFlags::IN | EventFlags::ET)?;
        Ok(Poll { epoll, doorbell })
    }

    /// Registers `fd` for readable (and with `writable`, writable) edges under `token`.
    ///
    /// Exclusively: when several polls watch one socket (the engine's, and the poll of a
    /// completion queue whose waiter sleeps there), an event wakes one sleeping thread, in
    /// the order of registration among the polls that have a sleeper; a poll without one
    /// still records the event for its next wait.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, token: Token, writable: bool) -> io::Result<()> {
        // A peer's close makes the socket readable too (EPOLLRDHUP may not be combined with
        // EPOLLEXCLUSIVE).
        let mut flags = EventFlags::IN | EventFlags::ET | EventFlags::EXCLUSIVE;
        if writable {
            flags |= EventFlags::OUT;
        }
        Ok(epoll::add(&self.epoll, fd, EventData::new_u64(token), flags)?)
    }

    /// Removes `fd`.
    pub(crate) fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        Ok(epoll::delete(&self.epoll, fd)?)
    }

    /// Rings the doorbell: one thread sleeping in the poll wakes (each ring is a new edge).
    pub(crate) fn wake(&self) {
        // The counter only overflows after 2^64 - 2 rings without a read; a full counter
        // (EAGAIN) still leaves the descriptor readable, so nothing is lost either way.
        let _ = rustix::io::write(&self.doorbell, &1u64.to_ne_bytes());
    }

    /// Waits up to `timeout` (`None`: without limit; zero: only collects what is ready) and
    /// fills `events` with what happened (the doorbell included, as [`DOORBELL`]).
    pub(crate) fn wait(&self, events: &mut Events, timeout: Option<Duration>) {
        events.ready.clear();
        let timespec = timeout.map(|t| Timespec {
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let mut raw = [const { MaybeUninit::<epoll::Event>::uninit() }; BATCH];
        // EINTR and the like: report nothing; the caller passes and comes back.
        let Ok((got, _)) = epoll::wait(self.epoll.as_fd(), &mut raw[..], timespec.as_ref()) else { return };
        for e in got.iter() {
            let flags = e.flags;
            let error = flags.intersects(EventFlags::ERR | EventFlags::HUP);
            events.ready.push(Ready {
                token: e.data.u64(),
                readable: error || flags.intersects(EventFlags::IN | EventFlags::RDHUP),
                writable: error || flags.contains(EventFlags::OUT),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn doorbell_and_socket_readiness_are_reported_with_their_tokens() {
        let poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.is_empty());
        poll.wake();
        poll.wait(&mut events, Some(Duration::from_secs(5)));
        assert!(events.iter().any(|e| e.token == DOORBELL));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        poll.add(server.as_fd(), 7, false).unwrap();
        client.write_all(b"x").unwrap();
        poll.wait(&mut events, Some(Duration::from_secs(5)));
        assert!(events.iter().any(|e| e.token == 7 && e.readable && !e.writable));
        // Edge-triggered: nothing new, no event.
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.is_empty());
        poll.delete(server.as_fd()).unwrap();
        client.write_all(b"y").unwrap();
        poll.wait(&mut events, Some(Duration::from_millis(20)));
        assert!(events.is_empty());
    }

    #[test]
    fn two_threads_can_wait_at_once_and_one_of_them_gets_the_event() {
        let poll = std::sync::Arc::new(Poll::new().unwrap());
        let waiter = {
            let poll = poll.clone();
            std::thread::spawn(move || {
                let mut events = Events::with_capacity(4);
                poll.wait(&mut events, Some(Duration::from_secs(5)));
                events.iter().any(|e| e.token == DOORBELL)
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        poll.wake();
        assert!(waiter.join().unwrap());
    }
}
