//! Deadlines from timeouts the caller gives: a timeout too long to be added to the clock
//! ([`Duration::MAX`], the usual way to say "wait forever") must not panic, as `Instant`'s
//! addition does on overflow.

use std::time::{Duration, Instant};

/// As good as never: about a century.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `timeout` from `start` (a clock reading the caller has anyway), or `None` when it cannot
/// be added to the clock: no deadline.
pub(crate) fn after(start: Instant, timeout: Duration) -> Option<Instant> {
    start.checked_add(timeout)
}

/// `timeout` from now, at most a century from now.
pub(crate) fn saturating(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout.min(NEVER)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{after, saturating};

    #[test]
    fn an_endless_timeout_is_no_deadline_or_a_far_one() {
        assert!(after(Instant::now(), Duration::MAX).is_none());
        assert!(after(Instant::now(), Duration::from_secs(1)).is_some_and(|d| d > Instant::now()));
        let far = saturating(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(50 * 365 * 24 * 3600));
        let near = saturating(Duration::from_millis(5));
        assert!(near <= Instant::now() + Duration::from_millis(5));
    }
}
