//! Completion queues: the engine pushes work completions, the application polls them with no
//! lock and no system call, waits for them (blocking or async), or asks to be woken by the
//! next (solicited) one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::engine::{Engine, WaitingApp, Watch};
use crate::shared::{CqShared, Waiter, WorkCompletion};

/// How long [`CompletionQueue::wait`] spins before it sleeps.
pub(crate) const WAIT_SPIN: Duration = Duration::from_micros(20);
/// The longest sleep of a wait with a deadline before it looks again. Nothing is owed to
/// the look: the input, a completion or an interrupt ends either sleep, as for a wait without
/// a deadline, which has no timer at all. Its length is what a timer costs: a queue's alarm is
/// armed again only once it has gone off (`readiness::Alarm`), so once per such sleep. At
/// 10 ms, a ping-pong with 10 ms between round trips armed it on every round trip, on the way
/// from the client's send to its sleep, and the server's went off 2 ms after each answer for
/// nothing.
pub(crate) const LONGEST_NAP: Duration = Duration::from_secs(1);
/// Turns of that spin (about 24 ns each on the project's VM) before it also yields the core
/// between looks: the engine thread it waits for may need that core.
const WAIT_SPINS_BEFORE_YIELD: u32 = 64;

/// One turn of a wait's spin while the engine is awake (`spins`: the turns so far): after the
/// first turns it also offers the core between looks, since the awake engine thread (or the
/// peer feeding it) may be waiting for this very core.
pub(crate) fn spin_turn(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins > WAIT_SPINS_BEFORE_YIELD {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// A completion queue.
///
/// ```
/// use iwarp::{Device, DeviceConfig, PollMode};
/// let device = Device::open(DeviceConfig { poll_mode: PollMode::Inline, ..DeviceConfig::default() });
/// let cq = device.create_cq(64);
/// assert!(cq.poll().is_none());
/// ```
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
    pub(crate) dev: Arc<Engine>,
}

impl CompletionQueue {
    pub(crate) fn new(dev: Arc<Engine>, depth: usize) -> CompletionQueue {
        CompletionQueue { shared: Arc::new(CqShared::new(depth)), dev }
    }

    /// The next completion, if one is ready: a flag's load when there is none, else the
    /// queue's own lock (never the engine's); in inline mode it first lets the engine make
    /// progress on this thread.
    pub fn poll(&self) -> Option<WorkCompletion> {
        crate::engine::looked();
        if let Some(wc) = self.shared.pop() {
            return Some(wc);
        }
        if self.dev.inline() {
            self.dev.progress();
            return self.shared.pop();
        }
        crate::engine::found_nothing();
        None
    }

    /// Fills `out` with ready completions, oldest first; returns how many (0 when none is
    /// ready, or `out` is empty). As `ibv_poll_cq` with `num_entries`: one call takes the
    /// queue's lock once for the whole batch, where a loop of [`CompletionQueue::poll`] takes
    /// it per completion. In inline mode an empty queue first lets the engine make progress on
    /// this thread, as `poll` does.
    ///
    /// ```
    /// # use iwarp::{Device, DeviceConfig, WorkCompletion};
    /// let device = Device::open(DeviceConfig::default());
    /// let cq = device.create_cq(64);
    /// let mut batch = [WorkCompletion::default(); 16];
    /// let n = cq.poll_many(&mut batch);
    /// for wc in &batch[..n] {
    ///     println!("{} finished: {:?}", wc.wr_id, wc.status);
    /// }
    /// ```
    pub fn poll_many(&self, out: &mut [WorkCompletion]) -> usize {
        crate::engine::looked();
        let n = self.shared.pop_into(out);
        if n == 0 && !out.is_empty() && self.dev.inline() {
            self.dev.progress();
            return self.shared.pop_into(out);
        }
        if n == 0 {
            crate::engine::found_nothing();
        }
        n
    }

    /// Waits up to `timeout` for a completion: spins briefly while the engine is awake, then
    /// sleeps until the engine pushes one. While the engine sleeps (adaptive mode), the
    /// thread first runs the engine's passes itself for the device's
    /// [`crate::DeviceConfig::spin`], yielding the core between them: a completion that is
    /// about to arrive (the next window of a stream) is found without putting this thread to
    /// sleep and waking it again, and on a busy machine the yields leave the core to whoever
    /// needs it. It does so only while this queue's recent waits saw their completion within
    /// about twice that time (dense traffic): when completions come later (sparse messages, a
    /// slow peer), those passes find nothing and only take the core from the threads that
    /// have the input, so the thread goes to sleep at once. With dense traffic too, the queue
    /// measures whether its recent waits were quicker driving or sleeping at once, takes the
    /// quicker way and tries the other now and then (a thread running passes races the engine
    /// thread for the input, which can cost more than a wake-up). Then, while the engine has nothing
    /// to do, the thread sleeps where the connections' input wakes it and runs the engine's
    /// pass itself, so the input reaches it with one wake-up rather than two (the engine's,
    /// then its own).
    ///
    /// A `timeout` too long to be added to the current time ([`Duration::MAX`]) waits with no
    /// deadline, until a completion comes or [`CompletionQueue::interrupt`] ends the wait,
    /// as `ibv_get_cq_event` blocks. Such a wait sleeps without a timer; one with a deadline
    /// wakes at least once a second to look again.
    pub fn wait(&self, timeout: Duration) -> Option<WorkCompletion> {
        // A completion that is there at once says nothing about the traffic, and costs no
        // clock read (in a ping-pong every other wait is one: the send's completion, pushed
        // by the pass that sent it). A clock read is about 25 ns on a virtual machine, and a
        // wait that sleeps took four of them.
        if let Some(wc) = self.poll() {
            return Some(wc);
        }
        if !timeout.is_zero() {
            crate::engine::waits_in_polls();
        }
        let _waiting = WaitingApp::new(&self.dev);
        let epoch = self.shared.interrupts();
        let start = Instant::now();
        let deadline = crate::deadline::after(start, timeout);
        let mut spin_until = start + WAIT_SPIN;
        let spin = self.dev.config.spin;
        let adaptive = self.dev.config.poll_mode == crate::PollMode::Adaptive;
        // Whether to drive or sleep (adaptive mode), chosen when the wait first finds the
        // engine asleep: a wait that finds its completion at once or the engine awake makes
        // no choice, so the one wait in eight that tries the other way is one that measures
        // it. Chosen at every wait's start, the tries followed the parity of the waits: in a
        // ping-pong, where every other wait returns the send's completion at once, they could
        // all fall on those, and the way tried never got measured again.
        let mut choice = None;
        let mut drive_until = start;
        // Whether the wait found the engine asleep, so that the choice came into play.
        let mut chose = false;
        let mut spins = 0u32;
        // The first turn has looked already, at `start`.
        let mut first = true;
        loop {
            let now = if first {
                start
            } else {
                if let Some(wc) = self.poll() {
                    if adaptive {
                        let took = start.elapsed();
                        self.shared.record_wait(start, took);
                        if let (true, Some(drove)) = (chose, choice) {
                            self.shared.record_choice(drove, took);
                        }
                    }
                    return Some(wc);
                }
                Instant::now()
            };
            first = false;
            if deadline.is_some_and(|d| now >= d) || self.shared.interrupts() != epoch {
                return None;
            }
            // Spin a little while the engine is awake (it is about to push); with the engine
            // asleep, spinning would only keep the core from the thread that has the input.
            let parked = self.dev.doorbell.parked();
            if self.dev.inline() {
                std::hint::spin_loop();
                continue;
            }
            if now < spin_until && !parked {
                // Offering the core after the first turns: a spin that kept it had the
                // receiving side of a 64 B Send stream spend two thirds of its thread's time
                // here while its engine waited (3.3-3.7 Mmsg/s on two cores, 4.0-4.2 with the
                // yields).
                spin_turn(&mut spins);
                continue;
            }
            if parked && !chose {
                chose = true;
                if adaptive {
                    choice = self.shared.choose_drive(spin, start);
                    if choice == Some(true) {
                        drive_until = start + spin;
                    }
                }
            }
            if parked && now < drive_until {
                // The engine sleeps: run its pass here, giving the core away between passes.
                if !self.dev.waiting_pass(|| self.shared.wake_due(epoch)) {
                    std::thread::yield_now();
                }
                continue;
            }
            // At most LONGEST_NAP at a time when there is a deadline; without one, no timer at
            // all: the input, a completion or an interrupt wakes either sleep.
            let nap = deadline.map(|d| (d - now).min(LONGEST_NAP));
            // While the engine sleeps, wait in this queue's own readiness poll: the input it
            // waits for then wakes this thread, which runs the pass itself.
            match self.dev.wait_polling(&self.shared, now, nap, epoch) {
                Watch::Refused => {}
                Watch::Slept => continue,
                Watch::LeftToHolder => {
                    // Another thread holding the core (mostly the engine's) places the input that
                    // woke this one.
                    spin_until = Instant::now() + WAIT_SPIN;
                    continue;
                }
            }
            self.shared.add_waiter(Waiter::Thread(std::thread::current()));
            // Re-check after registering, so a push or an interrupt between the poll and the
            // registration is not missed.
            if self.shared.wake_due(epoch) {
                continue;
            }
            match nap {
                Some(nap) => std::thread::park_timeout(nap),
                None => std::thread::park(),
            }
        }
    }

    /// Makes every thread blocked in [`CompletionQueue::wait`] on this queue (through any
    /// handle of it) return now, with `None` unless a completion is there, as if its timeout
    /// had passed; a wait that starts after the call is not affected. For a thread that waits
    /// for completions with a long timeout and must also answer something else (a command,
    /// a shutdown): waking it this way spares it from waking on a short timeout over and over
    /// (each such sleep arms a timer, which costs microseconds on the wake-up path of a
    /// virtual machine).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use iwarp::{Device, DeviceConfig};
    /// let device = Device::open(DeviceConfig::default());
    /// let cq = device.create_cq(16);
    /// let waiter = {
    ///     let cq = cq.clone();
    ///     std::thread::spawn(move || cq.wait(Duration::from_secs(600)))
    /// };
    /// // The waiter may not be waiting yet: a wait that starts later is not interrupted.
    /// while !waiter.is_finished() {
    ///     cq.interrupt();
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert!(waiter.join().unwrap().is_none());
    /// ```
    pub fn interrupt(&self) {
        self.shared.interrupt();
    }

    /// Waits asynchronously for the next completion (any runtime: the future is woken by
    /// the engine's push, with one registration per wait however often it is polled).
    pub fn next(&self) -> NextCompletion<'_> {
        NextCompletion { cq: self, wait: AsyncWait::default() }
    }

    /// The completions as an async stream (`futures_core::Stream`), owning a handle of the
    /// queue so it can move into a task.
    ///
    /// ```
    /// # use iwarp::{Device, DeviceConfig};
    /// let device = Device::open(DeviceConfig::default());
    /// let completions = device.create_cq(16).stream();
    /// # drop(completions);
    /// ```
    pub fn stream(&self) -> CompletionStream {
        CompletionStream { cq: self.clone(), wait: AsyncWait::default() }
    }

    /// Arms the queue: the next completion (only a solicited one, with `solicited_only`)
    /// sets the notification that [`CompletionQueue::wait_notification`] waits for, as verbs'
    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) {
        self.shared.arm(solicited_only);
    }

    /// Has `hook` called each time a notification armed by [`CompletionQueue::req_notify`]
    /// fires, in place of the notification [`CompletionQueue::wait_notification`] waits for
    /// (a verbs completion channel: the hook writes the event to a file descriptor). It runs
    /// on the thread that pushed the completion, usually the engine's, right after that
    /// completion is in the queue, once per arming; it must be short and must not call into
    /// the stack. A queue takes one hook; returns false if it has one already.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use iwarp::{Device, DeviceConfig};
    /// let device = Device::open(DeviceConfig::default());
    /// let cq = device.create_cq(16);
    /// let events = Arc::new(AtomicUsize::new(0));
    /// let counter = events.clone();
    /// assert!(cq.set_notify_hook(move || {
    ///     counter.fetch_add(1, Ordering::Relaxed);
    /// }));
    /// cq.req_notify(false);
    /// # drop(device);
    /// ```
    pub fn set_notify_hook(&self, hook: impl Fn() + Send + Sync + 'static) -> bool {
        self.shared.set_hook(Box::new(hook))
    }

    /// Waits up to `timeout` for the notification armed by [`CompletionQueue::req_notify`];
    /// returns whether it fired (and disarms it).
    pub fn wait_notification(&self, timeout: Duration) -> bool {
        crate::engine::looked();
        let deadline = crate::deadline::saturating(timeout);
        loop {
            if self.shared.take_notification() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if self.dev.inline() {
                self.dev.progress();
                continue;
            }
            self.shared.add_waiter(Waiter::Thread(std::thread::current()));
            if self.shared.notified() {
                continue;
            }
            std::thread::park_timeout((deadline - now).min(Duration::from_millis(10)));
        }
    }
}

/// One async wait's registration with a completion queue (and, inline, with the engine's
/// driver thread).
#[derive(Debug, Default)]
struct AsyncWait {
    id: Option<u64>,
    counted: bool,
}

impl AsyncWait {
    /// The next completion, or `Pending` with the task registered to be woken.
    fn poll(&mut self, cq: &CompletionQueue, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        if let Some(wc) = cq.poll() {
            self.end(cq);
            return Poll::Ready(wc);
        }
        self.id = Some(cq.shared.register_task(self.id, cx.waker()));
        if !self.counted {
            self.counted = true;
            cq.dev.async_wait_started();
        }
        // Re-check after registering: a push in between is not missed.
        match cq.shared.pop() {
            Some(wc) => {
                self.end(cq);
                Poll::Ready(wc)
            }
            None => Poll::Pending,
        }
    }

    fn end(&mut self, cq: &CompletionQueue) {
        if let Some(id) = self.id.take() {
            cq.shared.unregister_task(id);
        }
        if std::mem::take(&mut self.counted) {
            cq.dev.async_wait_ended();
        }
    }
}

/// The future of [`CompletionQueue::next`].
#[derive(Debug)]
pub struct NextCompletion<'a> {
    cq: &'a CompletionQueue,
    wait: AsyncWait,
}

impl Future for NextCompletion<'_> {
    type Output = WorkCompletion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        let this = self.get_mut();
        this.wait.poll(this.cq, cx)
    }
}

impl Drop for NextCompletion<'_> {
    fn drop(&mut self) {
        self.wait.end(self.cq);
    }
}

/// The completions of a queue as an async stream ([`CompletionQueue::stream`]); it never
/// ends.
#[derive(Debug)]
pub struct CompletionStream {
    cq: CompletionQueue,
    wait: AsyncWait,
}

impl futures_core::Stream for CompletionStream {
    type Item = WorkCompletion;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WorkCompletion>> {
        let this = self.get_mut();
        this.wait.poll(&this.cq, cx).map(Some)
    }
}

impl Drop for CompletionStream {
    fn drop(&mut self) {
        self.wait.end(&self.cq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceConfig, PollMode, WcOpcode};
    use std::sync::atomic::Ordering;

    /// A wait whose completion is there at once makes no drive-or-sleep choice: every eighth
    /// choice tries the way not preferred, and choices taken by such waits (in a ping-pong,
    /// every other wait returns the send's completion at once) could all be the tries, which
    /// then never measured anything.
    #[test]
    fn a_wait_answered_at_once_makes_no_choice() {
        let device = Device::open(DeviceConfig { poll_mode: PollMode::Adaptive, ..DeviceConfig::default() });
        let cq = device.create_cq(16);
        for i in 0..20 {
            cq.shared.push(WorkCompletion::flushed(1, i, WcOpcode::Send));
            assert_eq!(cq.wait(Duration::from_secs(5)).map(|wc| wc.wr_id), Some(i));
        }
        assert_eq!(cq.shared.choices.load(Ordering::Relaxed), 0);
    }

    /// `poll_many` takes the oldest completions first, no more than fit, and leaves the rest
    /// for the next call, in order.
    #[test]
    fn poll_many_takes_the_oldest_that_fit_and_leaves_the_rest() {
        let device = Device::open(DeviceConfig::default());
        let cq = device.create_cq(16);
        let mut out = [WorkCompletion::flushed(0, u64::MAX, WcOpcode::Recv); 4];
        assert_eq!(cq.poll_many(&mut out), 0);
        for i in 0..6 {
            cq.shared.push(WorkCompletion::flushed(1, i, WcOpcode::Send));
        }
        assert_eq!(cq.poll_many(&mut []), 0);
        assert_eq!(cq.poll_many(&mut out), 4);
        assert_eq!(out.map(|wc| wc.wr_id), [0, 1, 2, 3]);
        assert_eq!(cq.poll_many(&mut out), 2);
        assert_eq!(out[..2].iter().map(|wc| wc.wr_id).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(out[2].wr_id, 2, "entries beyond the count are left as they were");
        assert_eq!(cq.poll_many(&mut out), 0);
        assert!(cq.poll().is_none());
        cq.shared.push(WorkCompletion::flushed(1, 6, WcOpcode::Send));
        assert_eq!(cq.poll().map(|wc| wc.wr_id), Some(6), "an emptied queue takes new pushes");
    }

    /// Completions pushed as one batch and taken across the point where the queue's storage
    /// wraps around come out whole and in order.
    #[test]
    fn poll_many_takes_a_batch_across_the_queues_wrap() {
        let device = Device::open(DeviceConfig::default());
        let cq = device.create_cq(32);
        let wc = |i| WorkCompletion::flushed(1, i, WcOpcode::Send);
        cq.shared.push_all_quiet((0..12).map(wc), || {});
        let mut out = [WorkCompletion::default(); 16];
        assert_eq!(cq.poll_many(&mut out[..10]), 10);
        // Two left near the end of the storage (16 entries to begin with): the next twelve
        // wrap around to its start.
        cq.shared.push_all_quiet((12..24).map(wc), || {});
        let mut got = Vec::new();
        for take in [5, 16] {
            let n = cq.poll_many(&mut out[..take]);
            got.extend(out[..n].iter().map(|wc| wc.wr_id));
        }
        assert_eq!(got, (10..24).collect::<Vec<_>>());
        assert_eq!(cq.poll_many(&mut out), 0);
    }
}
