//! Time for lock calls: the deadline of a call (`None`: none), and the hard bound of its I/O.

use std::time::{Duration, Instant};

use crate::transport::conn::{Deadline, Timeouts};

/// Whether `deadline` has passed (`None`: never).
pub(crate) fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// `d` from now; `None` when that is beyond what an `Instant` holds.
pub(crate) fn after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// The earlier of a deadline (`None`: none) and `b`.
pub(crate) fn min_instant(a: Option<Instant>, b: Instant) -> Instant {
    a.map_or(b, |a| a.min(b))
}

/// The hard bound of a lock call started at `start` that waits until `deadline`: its I/O
/// ends by `max(deadline, start + connect timeout) + command timeout`. So an attempt made at
/// the deadline still gets one command timeout, and one that must connect first gets a
/// connect timeout more. `None` (no deadline, as `lock()`): each attempt is bounded alone.
pub(crate) fn hard_limit(deadline: Option<Instant>, start: Instant, t: Timeouts) -> Deadline {
    let Some(d) = deadline else {
        return Deadline::NONE;
    };
    start
        .checked_add(t.connect)
        .and_then(|c| d.max(c).checked_add(t.command))
        .map_or(Deadline::NONE, Deadline::at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_call_ends_by_its_deadline_plus_one_command_or_connect_plus_command() {
        let t = Timeouts {
            connect: Duration::from_secs(1),
            command: Duration::from_millis(300),
        };
        let start = Instant::now();
        let ms = Duration::from_millis;
        // try_lock: the deadline is the start.
        assert_eq!(
            hard_limit(Some(start), start, t),
            Deadline::at(start + ms(1300))
        );
        // A short wait still gets the connect timeout; a long one its deadline + one command.
        assert_eq!(
            hard_limit(Some(start + ms(500)), start, t),
            Deadline::at(start + ms(1300))
        );
        assert_eq!(
            hard_limit(Some(start + ms(5000)), start, t),
            Deadline::at(start + ms(5300))
        );
        // lock(): each attempt is bounded alone.
        assert_eq!(hard_limit(None, start, t), Deadline::NONE);
        let huge = Timeouts {
            connect: Duration::MAX,
            command: Duration::MAX,
        };
        assert_eq!(hard_limit(Some(start), start, huge), Deadline::NONE);
    }
}
