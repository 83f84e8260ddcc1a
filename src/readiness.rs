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
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{EventfdFlags, Timespec, eventfd};
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};

/// A registration's key: a connection's key, or one of the reserved ones below.
pub(crate) type Token = u64;
/// The doorbell's token.
pub(crate) const DOORBELL: Token = u64::MAX;
/// The first attached stack's token; the next ones count down from it.
pub(crate) const STACK_BASE: Token = u64::MAX - 1;
/// The token of the close watch (see [`Poll::add_link`]); never reported itself.
const CLOSES: Token = 1 << 62;
/// The token of a poll's [`Alarm`]; never reported itself.
const ALARM: Token = 1 << 61;
/// The token of the links' poll inside a [`DoorbellPoll`]; never reported itself.
const LINKS: Token = 1 << 60;

/// What one readiness event says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ready {
    pub(crate) token: Token,
    /// Bytes to read, the peer's close, or an error (which a read reports).
    pub(crate) readable: bool,
    /// Room to write, or an error (which a write reports).
    pub(crate) writable: bool,
    /// Reported by the close watch (see [`Poll::add_link`]): the peer closed, or the socket
    /// has an error; read until a read says which, even after one that came back short.
    pub(crate) closed: bool,
}

/// Events taken from the kernel per `epoll_wait` call.
const BATCH: usize = 256;
/// The most `epoll_wait` calls one [`Poll::wait`] makes to take everything ready (a bound
/// for a flood of new edges; a million descriptors' worth).
const MAX_ROUNDS: usize = 4096;

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

    /// Events made up by a test, as if a poll had collected them.
    #[cfg(test)]
    pub(crate) fn of(ready: impl IntoIterator<Item = Ready>) -> Events {
        Events { ready: ready.into_iter().collect() }
    }
}

/// The poll and its doorbell.
#[derive(Debug)]
pub(crate) struct Poll {
    epoll: OwnedFd,
    /// `None` in a poll nothing wakes ([`Poll::unringable`]).
    doorbell: Option<OwnedFd>,
    /// Whether links added with [`Poll::add_link`] are watched for the peer's close too.
    watch_closes: bool,
    /// The close watch: a second epoll instance inside the first, made with the first link
    /// (see [`Poll::add_link`]).
    closes: OnceLock<OwnedFd>,
}

impl Poll {
    pub(crate) fn new() -> io::Result<Poll> {
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        let doorbell = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        epoll::add(&epoll, &doorbell, EventData::new_u64(DOORBELL), EventFlags::IN | EventFlags::ET)?;
        Ok(Poll { epoll, doorbell: Some(doorbell), watch_closes: false, closes: OnceLock::new() })
    }

    /// A poll without a doorbell, for a thread that sleeps only until its descriptors are
    /// ready or its timeout passes (a listener's): one descriptor less. [`Poll::wake`] does
    /// nothing there.
    pub(crate) fn unringable() -> io::Result<Poll> {
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        Ok(Poll { epoll, doorbell: None, watch_closes: false, closes: OnceLock::new() })
    }

    /// A poll that also reports the peer's close of a link added with [`Poll::add_link`]
    /// however it came (the engine's).
    pub(crate) fn watching_closes() -> io::Result<Poll> {
        Ok(Poll { watch_closes: true, ..Poll::new()? })
    }

    /// Registers `fd` for readable (and with `writable`, writable) edges under `token`.
    ///
    /// Exclusively: when several polls watch one socket (the engine's, and the poll of a
    /// completion queue whose waiter sleeps there), an event wakes one sleeping thread, in
    /// the order of registration among the polls that have a sleeper. The kernel offers the
    /// event to the polls in that order and stops at the first that has a sleeper: the polls
    /// before it record the event for their next wait, the ones after it never see it. So
    /// the thread woken must take every event it was given (see [`Poll::wait`]) and have a
    /// pass handle them, itself or through the thread that holds the engine's core.
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, token: Token, writable: bool) -> io::Result<()> {
        // A peer's close makes the socket readable too (EPOLLRDHUP may not be combined with
        // EPOLLEXCLUSIVE; `add_link` watches closes on their own).
        let mut flags = EventFlags::IN | EventFlags::ET | EventFlags::EXCLUSIVE;
        if writable {
            flags |= EventFlags::OUT;
        }
        Ok(epoll::add(&self.epoll, fd, EventData::new_u64(token), flags)?)
    }

    /// Registers a connection's socket as [`Poll::add`] does (readable and writable), and,
    /// in a poll [`Poll::watching_closes`], for the peer's close and errors on their own;
    /// returns whether it is watched so.
    ///
    /// A readable edge does not tell data from the peer's close, and the close can arrive
    /// under the same edge as the last data (both in before the event was collected): the
    /// read that takes the data consumes the close too, and only another read, one that
    /// returns 0, reports it. Watched here, the close is an event of its own, so a read that
    /// comes back short of what it asked for may take the socket as drained without that
    /// second read (a system call on every message received). The watch is a nested epoll
    /// instance, since `EPOLLRDHUP` may not be combined with `EPOLLEXCLUSIVE`: wake-ups for
    /// data do not match its registrations and cost no more than a mask test. It is made
    /// with the first link, not with the poll: a device that never connects holds one
    /// descriptor less, and a process that opens a device before its first socket keeps
    /// the socket's number (netcat-traditional, run over rsockets on the drop-in, refuses
    /// descriptors above 16, and its accepted socket's number comes right after the ones
    /// the device opened).
    pub(crate) fn add_link(&self, fd: BorrowedFd<'_>, token: Token) -> io::Result<bool> {
        self.add(fd, token, true)?;
        let Some(closes) = self.close_watch() else { return Ok(false) };
        if let Err(e) = epoll::add(closes, fd, EventData::new_u64(token), EventFlags::RDHUP | EventFlags::ET)
        {
            let _ = epoll::delete(&self.epoll, fd);
            return Err(e.into());
        }
        Ok(true)
    }

    /// The close watch, made on first use; `None` in a poll that does not watch closes, or
    /// when it cannot be made (links then go unwatched).
    fn close_watch(&self) -> Option<&OwnedFd> {
        if !self.watch_closes {
            return None;
        }
        if let Some(closes) = self.closes.get() {
            return Some(closes);
        }
        let closes = epoll::create(CreateFlags::CLOEXEC).ok()?;
        epoll::add(&self.epoll, &closes, EventData::new_u64(CLOSES), EventFlags::IN | EventFlags::ET).ok()?;
        // A racing caller's watch wins; this one is closed (its registration goes with it).
        Some(self.closes.get_or_init(|| closes))
    }

    /// Removes `fd`.
    pub(crate) fn delete(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if let Some(closes) = self.closes.get() {
            // Not there for a descriptor added with `add`.
            let _ = epoll::delete(closes, fd);
        }
        Ok(epoll::delete(&self.epoll, fd)?)
    }

    /// A second poll that watches this one's doorbell: a thread sleeping there is woken by a
    /// ring, and by the links only while they are heard, their readiness recorded by this poll
    /// meanwhile. This poll itself is inside it, not heard until [`DoorbellPoll::hear_links`] turns it on:
    /// a thread asleep there can be made deaf to the links, or hear them again, by another
    /// thread, without being woken (see `Engine::deafen`).
    pub(crate) fn doorbell_only(&self) -> io::Result<DoorbellPoll> {
        let doorbell = self.doorbell.as_ref().ok_or(io::ErrorKind::Unsupported)?;
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        epoll::add(&epoll, doorbell, EventData::new_u64(DOORBELL), EventFlags::IN | EventFlags::ET)?;
        // Registered with no events: it reports nothing until turned on.
        epoll::add(&epoll, &self.epoll, EventData::new_u64(LINKS), EventFlags::empty())?;
        // Without a timer its sleeps carry their own timeouts, in whole milliseconds.
        let timer = timer_in(&epoll);
        Ok(DoorbellPoll { epoll, timer })
    }

    /// Rings the doorbell: one thread sleeping in the poll wakes (each ring is a new edge).
    pub(crate) fn wake(&self) {
        // The counter only overflows after 2^64 - 2 rings without a read; a full counter
        // (EAGAIN) still leaves the descriptor readable, so nothing is lost either way.
        if let Some(doorbell) = &self.doorbell {
            let _ = rustix::io::write(doorbell, &1u64.to_ne_bytes());
        }
    }

    /// Waits up to `timeout` (`None`: without limit; zero: only collects what is ready) and
    /// fills `events` with what happened (the doorbell included, as [`DOORBELL`]).
    ///
    /// Everything ready is taken, in as many calls as it needs: a thread woken in a
    /// completion queue's poll may be the only one an edge was reported to (see
    /// [`Poll::add`]), and events left behind there would wait for that queue's next wait,
    /// which may never come (1,000 connections completing on one queue, more than a call's
    /// [`BATCH`] of them ready at once).
    pub(crate) fn wait(&self, events: &mut Events, timeout: Option<Duration>) {
        events.ready.clear();
        let mut timespec = timeout.map(timespec);
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        let mut raw = [const { MaybeUninit::<epoll::Event>::uninit() }; BATCH];
        let mut closes = false;
        let mut rounds = 0;
        // EINTR and the like end it: report what there is; the caller passes and comes back.
        while let Ok((got, _)) = epoll::wait(self.epoll.as_fd(), &mut raw[..], timespec.as_ref()) {
            let full = got.len() == BATCH;
            for e in got.iter() {
                match e.data.u64() {
                    CLOSES => {
                        closes = true;
                        continue;
                    }
                    // It only ended the sleep.
                    ALARM => continue,
                    _ => {}
                }
                events.ready.push(ready(e));
            }
            rounds += 1;
            if !full || rounds == MAX_ROUNDS {
                break;
            }
            // Edge-triggered: the next call reports only what this one left, each descriptor
            // at most once, until a new edge.
            timespec = Some(zero);
        }
        if let (true, Some(inner)) = (closes, self.closes.get()) {
            // Edge-triggered in the outer instance: take all it has, or the rest would wait
            // for the next close.
            while let Ok((got, _)) = epoll::wait(inner.as_fd(), &mut raw[..], Some(&zero)) {
                let n = got.len();
                events.ready.extend(got.iter().map(|e| Ready { closed: true, ..ready(e) }));
                if n < BATCH {
                    break;
                }
            }
        }
    }
}

/// A timer that ends the sleeps in one poll, for the one thread at a time that sleeps there
/// with a timeout (a completion queue's waiter, see `Engine::wait_polling`).
///
/// A sleep in `epoll_wait` with a timeout arms a kernel timer and cancels it on waking: in a
/// ping-pong that is twice per round trip, and it cost 0.25-0.3 us of an 8 B Send round trip
/// of 6.7 us (two devices, one core) against a blocking raw TCP ping-pong's sleep in `recv`,
/// which has none. The alarm is armed only when the time it is set for comes too late for a
/// sleep: a waiter that must look again within a second (`cq::LONGEST_NAP`) arms it about
/// once a second, not once per sleep, and sleeps without a timeout. Going off early only ends
/// one sleep, which the waiter takes as a spurious wake-up (it checks its own deadline).
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    /// The timer, registered in the poll it was first used with (made on first use).
    timer: Option<OwnedFd>,
    /// When it goes off, if armed; one before now has gone off already.
    armed: Option<Instant>,
    /// The system refused the timer: sleeps carry their own timeouts.
    refused: bool,
}

impl Alarm {
    /// The timeout for a sleep in `poll` that must end by `timeout` after `now` (`None`: no
    /// limit): none when the alarm goes off in time, after arming it if it would not; and
    /// whether it was armed. Always used with the same poll.
    pub(crate) fn cover(
        &mut self,
        poll: &Poll,
        now: Instant,
        timeout: Option<Duration>,
    ) -> (Option<Duration>, bool) {
        let Some(t) = timeout else { return (None, false) };
        let Some(by) = now.checked_add(t) else { return (timeout, false) };
        if t.is_zero() || self.refused {
            return (timeout, false);
        }
        if self.armed.is_some_and(|at| at > now && at <= by) {
            return (None, false);
        }
        let Some(timer) = self.timer(poll) else {
            self.refused = true;
            return (timeout, false);
        };
        if arm(timer, t) {
            self.armed = Some(by);
            (None, true)
        } else {
            self.armed = None;
            (timeout, false)
        }
    }

    /// The timer, made and registered in `poll` on first use.
    fn timer(&mut self, poll: &Poll) -> Option<&OwnedFd> {
        if self.timer.is_none() {
            self.timer = Some(timer_in(&poll.epoll)?);
        }
        self.timer.as_ref()
    }
}

/// A one-shot timer registered in `epoll` (its expiries reported as [`ALARM`]); `None` if the
/// system refuses one.
fn timer_in(epoll: &OwnedFd) -> Option<OwnedFd> {
    let flags = TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC;
    let timer = rustix::time::timerfd_create(TimerfdClockId::Monotonic, flags).ok()?;
    // Edge-triggered: each expiry is one event; the count it leaves is never read.
    epoll::add(epoll, &timer, EventData::new_u64(ALARM), EventFlags::IN | EventFlags::ET).ok()?;
    Some(timer)
}

/// Sets `timer` to go off once, `t` from now (replacing any earlier setting and clearing an
/// expiry not read yet); whether the system took it.
fn arm(timer: &OwnedFd, t: Duration) -> bool {
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    let value = Itimerspec { it_interval: zero, it_value: timespec(t) };
    rustix::time::timerfd_settime(timer, TimerfdTimerFlags::empty(), &value).is_ok()
}

/// What ended a sleep in a [`DoorbellPoll`] besides its timers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Woke {
    /// The doorbell rang.
    pub(crate) rang: bool,
    /// A link was ready while the links were heard.
    pub(crate) links: bool,
}

/// A poll of another poll's doorbell, and of its links when they are heard (see
/// [`Poll::doorbell_only`]), with a timer that ends its sleeps on time.
#[derive(Debug)]
pub(crate) struct DoorbellPoll {
    epoll: OwnedFd,
    timer: Option<OwnedFd>,
}

impl DoorbellPoll {
    /// Sleeps until the doorbell rings, a link is ready (while they are heard) or `timeout`
    /// passes (`None`: no limit); which of the first two woke it. `epoll_wait` takes its
    /// timeout in milliseconds, rounded up: the engine's 200 us sleep on the doorbell alone
    /// (`Engine::sleep`) lasted a whole one, and input that no thread watched meanwhile
    /// waited for it. The sleep is ended by the timer, armed for exactly `timeout`, instead
    /// (one more system call per sleep).
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Woke {
        let mut raw = [const { MaybeUninit::<epoll::Event>::uninit() }; 4];
        let limit = match timeout {
            None => None,
            Some(t) => {
                let timed = !t.is_zero() && self.timer.as_ref().is_some_and(|timer| arm(timer, t));
                // Re-arming the timer clears an expiry an earlier sleep left unread (it ended
                // on a ring), so epoll does not report that one in this sleep.
                (!timed).then(|| timespec(t))
            }
        };
        let mut woke = Woke::default();
        if let Ok((got, _)) = epoll::wait(self.epoll.as_fd(), &mut raw[..], limit.as_ref()) {
            for e in got.iter() {
                match e.data.u64() {
                    DOORBELL => woke.rang = true,
                    LINKS => woke.links = true,
                    _ => {}
                }
            }
        }
        woke
    }

    /// Turns the links of `poll` (the poll this one was made from) on or off in this poll;
    /// whether the system took it. Turned on while a link has unread readiness recorded,
    /// the poll reports it at once. Safe to call while another thread sleeps here: that
    /// sleep hears the links, or stops hearing them, from then on.
    pub(crate) fn hear_links(&self, poll: &Poll, on: bool) -> bool {
        let flags = if on { EventFlags::IN | EventFlags::ET } else { EventFlags::empty() };
        epoll::modify(&self.epoll, &poll.epoll, EventData::new_u64(LINKS), flags).is_ok()
    }
}

/// `t` as epoll's timeout.
pub(crate) fn timespec(t: Duration) -> Timespec {
    Timespec { tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX), tv_nsec: i64::from(t.subsec_nanos()) }
}

/// What one epoll event says.
fn ready(e: &epoll::Event) -> Ready {
    let flags = e.flags;
    let error = flags.intersects(EventFlags::ERR | EventFlags::HUP);
    Ready {
        token: e.data.u64(),
        readable: error || flags.intersects(EventFlags::IN | EventFlags::RDHUP),
        writable: error || flags.contains(EventFlags::OUT),
        closed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A sleep without a timeout of its own still ends in time through the alarm, which is
    /// armed again only for a sleep that must end before it goes off.
    #[test]
    fn the_alarm_ends_sleeps_in_time_and_is_armed_only_when_late() {
        let poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let mut alarm = Alarm::default();
        assert_eq!(alarm.cover(&poll, Instant::now(), None), (None, false), "no limit: no alarm");
        let zero = Some(Duration::ZERO);
        assert_eq!(alarm.cover(&poll, Instant::now(), zero), (zero, false), "a look: no alarm");

        let start = Instant::now();
        let (timeout, armed) = alarm.cover(&poll, start, Some(Duration::from_millis(30)));
        assert_eq!((timeout, armed), (None, true));
        // A later sleep that may end later is covered by the same alarm.
        let (timeout, armed) = alarm.cover(&poll, Instant::now(), Some(Duration::from_secs(5)));
        assert_eq!((timeout, armed), (None, false));
        // The sleep itself has no timeout (the test's own bound is the alarm's 30 ms, or the
        // thread below that would end it after 10 s).
        let rescue = {
            let doorbell = poll.doorbell.as_ref().unwrap().try_clone().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(10));
                let _ = rustix::io::write(&doorbell, &1u64.to_ne_bytes());
            })
        };
        poll.wait(&mut events, timeout);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(5), "{took:?}");
        assert!(events.is_empty(), "the alarm is not reported: {events:?}");
        // Gone off: the next timed sleep arms it again; one that must end sooner than it
        // goes off does too.
        let now = Instant::now();
        assert_eq!(alarm.cover(&poll, now, Some(Duration::from_secs(1))), (None, true));
        assert_eq!(alarm.cover(&poll, now, Some(Duration::from_millis(20))), (None, true));
        let start = Instant::now();
        poll.wait(&mut events, None);
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "the earlier setting went off: {took:?}");
        drop(rescue);
    }

    /// The doorbell-only poll: a ring ends its sleep (true); a sleep nobody rings ends on its
    /// timer after its time and not before, not a millisecond later as `epoll_wait`'s own
    /// timeout would (the median of 20 sleeps of 200 us is taken, against a machine's
    /// hiccups); and a timer an earlier sleep left armed does not cut a later sleep short.
    #[test]
    fn doorbell_only_sleeps_end_on_a_ring_or_on_time() {
        let poll = Poll::new().unwrap();
        let quiet = poll.doorbell_only().unwrap();
        assert!(quiet.timer.is_some(), "no timer on this system");
        poll.wake();
        assert!(quiet.wait(Some(Duration::from_secs(5))).rang, "the ring ends the sleep");
        let mut took: Vec<Duration> = (0..20)
            .map(|_| {
                let start = Instant::now();
                assert_eq!(quiet.wait(Some(Duration::from_micros(200))), Woke::default());
                start.elapsed()
            })
            .collect();
        took.sort();
        assert!(took[0] >= Duration::from_micros(200), "{took:?}");
        assert!(took[10] < Duration::from_micros(900), "{took:?}");
        // A sleep armed for 1 ms ends on a ring at once; its timer, still armed, goes off
        // while nobody sleeps, and its event waits for the next sleep, which sleeps on to its
        // own end.
        poll.wake();
        assert!(quiet.wait(Some(Duration::from_millis(1))).rang);
        std::thread::sleep(Duration::from_millis(5));
        let start = Instant::now();
        assert_eq!(quiet.wait(Some(Duration::from_millis(60))), Woke::default());
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(60), "{took:?}");
    }

    /// The links inside the doorbell poll: off in a new one; heard, a link's readiness ends a
    /// sleep there (and the poll records it for its own waiter); turned off while a thread
    /// sleeps there, they no longer wake it, while the poll goes on recording; turned on, what
    /// was recorded ends the next sleep at once.
    #[test]
    fn the_doorbell_poll_hears_the_links_only_while_they_are_on() {
        let poll = Poll::new().unwrap();
        let quiet = poll.doorbell_only().unwrap();
        let mut events = Events::with_capacity(8);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        poll.add(server.as_fd(), 7, false).unwrap();
        let short = Some(Duration::from_millis(20));

        client.write_all(b"a").unwrap();
        assert_eq!(quiet.wait(short), Woke::default(), "off in a new poll");
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.iter().any(|e| e.token == 7), "recorded meanwhile");

        assert!(quiet.hear_links(&poll, true));
        client.write_all(b"b").unwrap();
        assert!(quiet.wait(Some(Duration::from_secs(5))).links, "heard");
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.iter().any(|e| e.token == 7));

        // Turned off by another thread while this one sleeps: the data that comes next does
        // not end the sleep, which lasts its time.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                assert!(quiet.hear_links(&poll, false));
                let mut client = &client;
                client.write_all(b"c").unwrap();
            });
            let start = Instant::now();
            let woke = quiet.wait(Some(Duration::from_millis(300)));
            assert_eq!(woke, Woke::default(), "deaf");
            assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
        });
        // On again: what was recorded ends the sleep at once, and the poll still has it.
        assert!(quiet.hear_links(&poll, true));
        assert!(quiet.wait(Some(Duration::from_secs(5))).links);
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.iter().any(|e| e.token == 7 && e.readable));
        poll.wake();
        assert!(quiet.wait(Some(Duration::from_secs(5))).rang, "the doorbell is heard either way");
    }

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

    /// Data and the peer's close in before the poll is collected: one readable edge for
    /// both, and, in a poll that watches closes, the close on its own as well.
    #[test]
    fn a_close_under_the_same_edge_as_data_is_reported_on_its_own() {
        for watching in [false, true] {
            let poll = if watching { Poll::watching_closes() } else { Poll::new() }.unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            assert_eq!(poll.add_link(server.as_fd(), 7).unwrap(), watching);
            let mut events = Events::with_capacity(8);
            poll.wait(&mut events, Some(Duration::ZERO));
            assert!(events.iter().all(|e| !e.readable), "{watching}: {events:?}");
            client.write_all(b"x").unwrap();
            client.shutdown(std::net::Shutdown::Write).unwrap();
            // Both are in once the socket reports the close.
            let mut fds = [rustix::event::PollFd::new(&server, rustix::event::PollFlags::RDHUP)];
            let five = Timespec { tv_sec: 5, tv_nsec: 0 };
            assert_eq!(rustix::event::poll(&mut fds, Some(&five)).unwrap(), 1, "{watching}: no close");
            poll.wait(&mut events, Some(Duration::from_secs(5)));
            let closes: Vec<_> = events.iter().filter(|e| e.token == 7 && e.closed).collect();
            assert!(events.iter().any(|e| e.token == 7 && e.readable && !e.closed), "{watching}: {events:?}");
            assert_eq!(closes.len(), usize::from(watching), "{watching}: {events:?}");
            assert!(closes.iter().all(|e| e.readable), "{watching}: {events:?}");
            poll.delete(server.as_fd()).unwrap();
        }
    }

    /// More descriptors ready than one `epoll_wait` call takes: one wait reports them all.
    #[test]
    fn a_wait_takes_every_ready_descriptor_beyond_one_calls_batch() {
        let poll = Poll::new().unwrap();
        let n = BATCH + 8;
        let fds: Vec<OwnedFd> =
            (0..n).map(|_| eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).unwrap()).collect();
        for (token, fd) in (100..).zip(&fds) {
            poll.add(fd.as_fd(), token, false).unwrap();
            rustix::io::write(fd, &1u64.to_ne_bytes()).unwrap();
        }
        let mut events = Events::with_capacity(8);
        poll.wait(&mut events, Some(Duration::from_secs(5)));
        let mut tokens: Vec<Token> = events.iter().filter(|e| e.readable).map(|e| e.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (100..).take(n).collect::<Vec<Token>>());
        // Edge-triggered: all of them were taken.
        poll.wait(&mut events, Some(Duration::ZERO));
        assert!(events.is_empty(), "{events:?}");
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
