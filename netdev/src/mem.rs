//! An in-memory link pair with fault injection, for deterministic tests.
//!
//! Each direction is a bounded byte queue; the two ends share it behind a mutex, so the ends
//! may live on different threads. [`MemFaults`] changes the behaviour of both directions.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Link, LinkError};

/// One direction: bytes sent by one end, not yet received by the other.
#[derive(Debug, Default)]
struct Pipe {
    bytes: VecDeque<u8>,
    /// The sender shut down its writing side (or was dropped): after the queued bytes, the
    /// receiver sees `Closed`.
    write_closed: bool,
    /// The receiver was dropped: the sender gets `Reset` (nobody will ever read).
    receiver_gone: bool,
}

#[derive(Debug)]
struct Shared {
    /// `pipes[s]` carries bytes sent by end `s` to end `1 - s`.
    pipes: [Pipe; 2],
    capacity: usize,
    cut: bool,
    stalled: bool,
    slow_reader: Option<usize>,
    /// Woken when end `s` may have something to do (bytes, room, close, reset).
    wakers: [Option<Arc<mio::Waker>>; 2],
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding the lock cannot leave `Shared` inconsistent in a way that matters
    // to a test link (every update is a single field or queue operation), so recover.
    match shared.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn wake(wakers: impl IntoIterator<Item = Option<Arc<mio::Waker>>>) {
    for waker in wakers.into_iter().flatten() {
        // A failed wake-up only costs latency: the engine polls its links anyway.
        let _ = waker.wake();
    }
}

/// One end of an in-memory link pair made by [`MemLink::pair`].
///
/// Dropping an end closes both its directions: the peer reads what is queued, then `Closed`;
/// the peer's sends get `Reset`.
#[derive(Debug)]
pub struct MemLink {
    shared: Arc<Mutex<Shared>>,
    /// 0 or 1: this end sends into `pipes[side]` and receives from `pipes[1 - side]`.
    side: usize,
}

impl MemLink {
    /// Two connected ends; each direction holds at most `capacity` bytes in flight.
    pub fn pair(capacity: usize) -> (MemLink, MemLink) {
        let shared = Arc::new(Mutex::new(Shared {
            pipes: [Pipe::default(), Pipe::default()],
            capacity,
            cut: false,
            stalled: false,
            slow_reader: None,
            wakers: [None, None],
        }));
        (MemLink { shared: Arc::clone(&shared), side: 0 }, MemLink { shared, side: 1 })
    }

    /// The fault-injection handle of this pair (both ends share it).
    pub fn faults(&self) -> MemFaults {
        MemFaults { shared: Arc::clone(&self.shared) }
    }

    /// Sets a waker that is woken whenever this end may have something to do: bytes arrived,
    /// room freed up, the peer closed, the link was cut or un-stalled. Lets an event-driven
    /// engine wait on in-memory links too.
    pub fn set_waker(&mut self, waker: Option<Arc<mio::Waker>>) {
        lock(&self.shared).wakers[self.side] = waker;
    }

    /// Bytes queued towards the peer and not yet received by it.
    pub fn unread_by_peer(&self) -> usize {
        lock(&self.shared).pipes[self.side].bytes.len()
    }

    fn peer(&self) -> usize {
        1 - self.side
    }
}

impl Link for MemLink {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        let peer = self.peer();
        let (result, waker) = {
            let mut shared = lock(&self.shared);
            if shared.cut {
                return Err(LinkError::Reset);
            }
            if shared.stalled || buf.is_empty() {
                return Ok(0);
            }
            let limit = shared.slow_reader.unwrap_or(usize::MAX).min(buf.len());
            let pipe = &mut shared.pipes[peer];
            if pipe.bytes.is_empty() {
                return if pipe.write_closed { Err(LinkError::Closed) } else { Ok(0) };
            }
            let n = limit.min(pipe.bytes.len());
            for (dst, src) in buf.iter_mut().zip(pipe.bytes.drain(..n)) {
                *dst = src;
            }
            (Ok(n), shared.wakers[peer].clone())
        };
        wake([waker]);
        result
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, LinkError> {
        let side = self.side;
        let (result, waker) = {
            let mut shared = lock(&self.shared);
            if shared.cut {
                return Err(LinkError::Reset);
            }
            let capacity = shared.capacity;
            let pipe = &mut shared.pipes[side];
            if pipe.write_closed {
                return Err(LinkError::WriteShutdown);
            }
            if pipe.receiver_gone {
                return Err(LinkError::Reset);
            }
            let mut room = capacity.saturating_sub(pipe.bytes.len());
            let mut sent = 0;
            for buf in bufs {
                if room == 0 {
                    break;
                }
                let take = room.min(buf.len());
                pipe.bytes.extend(&buf[..take]);
                room -= take;
                sent += take;
            }
            let waker = if sent > 0 { shared.wakers[1 - side].clone() } else { None };
            (Ok(sent), waker)
        };
        wake([waker]);
        result
    }

    fn shutdown_write(&mut self) {
        let waker = {
            let mut shared = lock(&self.shared);
            shared.pipes[self.side].write_closed = true;
            shared.wakers[self.peer()].clone()
        };
        wake([waker]);
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        None
    }
}

impl Drop for MemLink {
    fn drop(&mut self) {
        let peer = self.peer();
        let waker = {
            let mut shared = lock(&self.shared);
            shared.pipes[self.side].write_closed = true;
            let incoming = &mut shared.pipes[peer];
            incoming.receiver_gone = true;
            incoming.bytes.clear();
            shared.wakers[self.side] = None;
            shared.wakers[peer].clone()
        };
        wake([waker]);
    }
}

/// Fault injection for a [`MemLink`] pair; cheap to clone, usable from any thread. Every fault
/// applies to both directions.
#[derive(Debug, Clone)]
pub struct MemFaults {
    shared: Arc<Mutex<Shared>>,
}

impl MemFaults {
    fn update(&self, f: impl FnOnce(&mut Shared)) {
        let wakers = {
            let mut shared = lock(&self.shared);
            f(&mut shared);
            shared.wakers.clone()
        };
        wake(wakers);
    }

    /// Cuts the link: queued bytes are lost and both ends get [`LinkError::Reset`] from every
    /// later `recv` and `send`. Permanent.
    pub fn cut(&self) {
        self.update(|shared| {
            shared.cut = true;
            for pipe in &mut shared.pipes {
                pipe.bytes.clear();
            }
        });
    }

    /// Stalls (or resumes) delivery: while stalled, sends are still accepted up to the capacity
    /// but `recv` delivers nothing (not even a close) and returns `Ok(0)`.
    pub fn stall(&self, stalled: bool) {
        self.update(|shared| shared.stalled = stalled);
    }

    /// Limits how many bytes one `recv` delivers (`None`: no limit), like a peer whose TCP
    /// hands over data in small pieces. `Some(0)` is treated as `Some(1)`.
    pub fn slow_reader(&self, max_bytes_per_recv: Option<usize>) {
        self.update(|shared| shared.slow_reader = max_bytes_per_recv.map(|n| n.max(1)));
    }

    /// Changes how many bytes each direction holds. Bytes already queued beyond a smaller
    /// capacity stay queued; sends are refused until the queue drains below it.
    pub fn set_capacity(&self, capacity: usize) {
        self.update(|shared| shared.capacity = capacity);
    }

    /// Whether [`MemFaults::cut`] was called.
    pub fn is_cut(&self) -> bool {
        lock(&self.shared).cut
    }

    /// Flips the bits of `mask` in the byte at `offset` of what is queued from end `from` to
    /// its peer (a corrupted segment TCP's checksum missed). Returns whether that byte was
    /// queued (nothing changes otherwise).
    pub fn corrupt(&self, from: usize, offset: usize, mask: u8) -> bool {
        let mut done = false;
        self.update(|shared| {
            if let Some(b) = shared.pipes[from & 1].bytes.get_mut(offset) {
                *b ^= mask.max(1);
                done = true;
            }
        });
        done
    }

    /// Swaps the `len` bytes at `offset` of what is queued from end `from` with the `len`
    /// bytes after them (segments delivered out of order). Returns whether both pieces were
    /// queued (nothing changes otherwise).
    pub fn reorder(&self, from: usize, offset: usize, len: usize) -> bool {
        let mut done = false;
        self.update(|shared| {
            let q = &mut shared.pipes[from & 1].bytes;
            let Some(end) = offset.checked_add(len.saturating_mul(2)) else { return };
            if len == 0 || end > q.len() {
                return;
            }
            let slice = q.make_contiguous();
            slice[offset..end].rotate_left(len);
            done = true;
        });
        done
    }

    /// Closes the writing side of end `from` (as its `shutdown_write` would): its peer reads
    /// what is queued, then [`LinkError::Closed`].
    pub fn close_write(&self, from: usize) {
        self.update(|shared| shared.pipes[from & 1].write_closed = true);
    }

    /// Bytes queued from end `from` towards its peer.
    pub fn queued(&self, from: usize) -> usize {
        lock(&self.shared).pipes[from & 1].bytes.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn corrupt_and_reorder_change_only_what_they_say() {
        let (mut a, mut b) = MemLink::pair(64);
        let faults = a.faults();
        assert_eq!(a.send(b"0123456789").unwrap(), 10);
        assert_eq!(faults.queued(0), 10);
        assert!(faults.corrupt(0, 1, 0x01));
        assert!(!faults.corrupt(0, 10, 0x01), "beyond what is queued");
        assert!(faults.reorder(0, 2, 3));
        assert!(!faults.reorder(0, 8, 2), "the second piece is not all queued");
        let mut buf = [0u8; 16];
        let n = b.recv(&mut buf).unwrap();
        // '1' ^ 1 = '0'; "234" and "567" swapped.
        assert_eq!(&buf[..n], b"0056723489");
    }

    fn drain(link: &mut MemLink, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..100_000 {
            match link.recv(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if out.len() >= max {
                break;
            }
        }
        out
    }

    #[test]
    fn bytes_arrive_in_order_across_vectored_sends() {
        let (mut a, mut b) = MemLink::pair(1024);
        let n =
            a.send_vectored(&[IoSlice::new(b"hello "), IoSlice::new(b""), IoSlice::new(b"world")]).unwrap();
        assert_eq!(n, 11);
        assert_eq!(a.send(b"!").unwrap(), 1);
        assert_eq!(drain(&mut b, usize::MAX), b"hello world!");
        assert_eq!(b.recv(&mut [0; 8]).unwrap(), 0);
        // And the other direction is independent.
        assert_eq!(b.send(b"back").unwrap(), 4);
        assert_eq!(drain(&mut a, usize::MAX), b"back");
    }

    #[test]
    fn send_accepts_at_most_the_free_capacity() {
        let (mut a, mut b) = MemLink::pair(10);
        assert_eq!(a.send_vectored(&[IoSlice::new(&[1; 6]), IoSlice::new(&[2; 6])]).unwrap(), 10);
        assert_eq!(a.send(&[3; 4]).unwrap(), 0);
        assert_eq!(a.unread_by_peer(), 10);
        let mut buf = [0u8; 4];
        assert_eq!(b.recv(&mut buf).unwrap(), 4);
        assert_eq!(a.send(&[3; 8]).unwrap(), 4);
        assert_eq!(drain(&mut b, usize::MAX), [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn set_capacity_shrinks_and_grows() {
        let (mut a, mut b) = MemLink::pair(10);
        let faults = a.faults();
        assert_eq!(a.send(&[0; 8]).unwrap(), 8);
        faults.set_capacity(4);
        assert_eq!(a.send(&[0; 8]).unwrap(), 0);
        assert_eq!(b.recv(&mut [0; 6]).unwrap(), 6);
        assert_eq!(a.send(&[0; 8]).unwrap(), 2);
        faults.set_capacity(100);
        assert_eq!(a.send(&[0; 200]).unwrap(), 96);
    }

    #[test]
    fn cut_resets_both_ends() {
        let (mut a, mut b) = MemLink::pair(100);
        a.send(b"lost").unwrap();
        let faults = b.faults();
        faults.cut();
        assert!(faults.is_cut());
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Reset)));
        assert!(matches!(a.recv(&mut [0; 8]), Err(LinkError::Reset)));
        assert!(matches!(a.send(b"x"), Err(LinkError::Reset)));
        assert!(matches!(b.send(b"x"), Err(LinkError::Reset)));
    }

    #[test]
    fn stall_holds_bytes_and_close_until_resumed() {
        let (mut a, mut b) = MemLink::pair(8);
        let faults = a.faults();
        faults.stall(true);
        assert_eq!(a.send(&[7; 20]).unwrap(), 8);
        a.shutdown_write();
        assert_eq!(b.recv(&mut [0; 8]).unwrap(), 0);
        assert_eq!(b.recv(&mut [0; 8]).unwrap(), 0);
        faults.stall(false);
        assert_eq!(drain(&mut b, usize::MAX), [7; 8]);
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Closed)));
    }

    #[test]
    fn half_close_delivers_the_rest_then_closed_and_the_other_direction_still_works() {
        let (mut a, mut b) = MemLink::pair(100);
        a.send(b"last words").unwrap();
        a.shutdown_write();
        a.shutdown_write();
        assert!(matches!(a.send(b"more"), Err(LinkError::WriteShutdown)));
        assert_eq!(drain(&mut b, usize::MAX), b"last words");
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Closed)));
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Closed)));
        assert_eq!(b.send(b"reply").unwrap(), 5);
        assert_eq!(drain(&mut a, usize::MAX), b"reply");
    }

    #[test]
    fn slow_reader_limits_each_recv() {
        let (mut a, mut b) = MemLink::pair(100);
        b.faults().slow_reader(Some(3));
        a.send(b"abcdefgh").unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(b.recv(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        assert_eq!(b.recv(&mut buf).unwrap(), 3);
        b.faults().slow_reader(None);
        assert_eq!(b.recv(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"gh");
    }

    #[test]
    fn dropping_an_end_closes_and_resets_the_peer() {
        let (mut a, mut b) = MemLink::pair(100);
        a.send(b"bye").unwrap();
        b.send(b"unread").unwrap();
        drop(a);
        assert_eq!(drain(&mut b, usize::MAX), b"bye");
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Closed)));
        assert!(matches!(b.send(b"x"), Err(LinkError::Reset)));
    }

    #[test]
    fn waker_fires_on_arrival() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(7)).unwrap());
        let (mut a, mut b) = MemLink::pair(100);
        b.set_waker(Some(waker));
        let t = std::thread::spawn(move || {
            a.send(b"ping").unwrap();
            a
        });
        let mut events = mio::Events::with_capacity(4);
        poll.poll(&mut events, Some(Duration::from_secs(5))).unwrap();
        assert!(events.iter().any(|e| e.token() == mio::Token(7)));
        let _a = t.join().unwrap();
        assert_eq!(drain(&mut b, 4), b"ping");
    }

    #[test]
    fn two_threads_move_a_megabyte_each_way_through_a_small_window() {
        const TOTAL: usize = 1 << 20;
        let (a, b) = MemLink::pair(4096);
        b.faults().slow_reader(Some(1000));
        let pattern = |i: usize| u8::try_from(i % 251).unwrap();
        let run = move |mut link: MemLink| {
            let data: Vec<u8> = (0..TOTAL).map(pattern).collect();
            let (mut sent, mut got) = (0, Vec::with_capacity(TOTAL));
            let mut buf = vec![0u8; 3000];
            let deadline = Instant::now() + Duration::from_secs(10);
            for _ in 0..10_000_000 {
                if sent == TOTAL && got.len() == TOTAL {
                    break;
                }
                assert!(Instant::now() < deadline, "transfer timed out");
                if sent < TOTAL {
                    let end = (sent + 1500).min(TOTAL);
                    sent += link.send_vectored(&[IoSlice::new(&data[sent..end])]).unwrap();
                }
                let n = if got.len() < TOTAL { link.recv(&mut buf).unwrap() } else { 0 };
                got.extend_from_slice(&buf[..n]);
                if n == 0 {
                    std::thread::yield_now();
                }
            }
            link.shutdown_write();
            (got, link)
        };
        let ta = std::thread::spawn(move || run(a));
        let tb = std::thread::spawn(move || run(b));
        let (got_a, mut a) = ta.join().unwrap();
        let (got_b, mut b) = tb.join().unwrap();
        let expected: Vec<u8> = (0..TOTAL).map(pattern).collect();
        assert!(got_a == expected && got_b == expected);
        assert!(matches!(a.recv(&mut [0; 8]), Err(LinkError::Closed)));
        assert!(matches!(b.recv(&mut [0; 8]), Err(LinkError::Closed)));
    }
}
