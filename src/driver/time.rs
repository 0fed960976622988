//! The budget of a lock call: its deadline (never, for `lock()`; passed, for one attempt), and
//! the hard bound of its I/O.

use std::time::Instant;

use crate::shared::Shared;
use crate::transport::conn::{Deadline, Timeouts};

/// What a lock call may spend: it waits until `deadline`, and its I/O ends by `limit`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Until when the call waits for the lock.
    pub(crate) deadline: Deadline,
    /// By when its I/O ends, whatever Redis does (see [`hard_limit`]).
    pub(crate) limit: Deadline,
}

impl Budget {
    /// The budget of a call that starts now and waits until `deadline`.
    pub(crate) fn new(shared: &Shared, deadline: Deadline) -> Budget {
        Budget {
            deadline,
            limit: hard_limit(deadline, Instant::now(), shared.config.timeouts),
        }
    }

    /// Whether the deadline has passed: the call makes no attempt more.
    pub(crate) fn past(&self) -> bool {
        self.deadline.passed()
    }
}

/// The hard bound of a lock call started at `start` that waits until `deadline`: its I/O
/// ends by `max(deadline, start + connect timeout) + command timeout`. So an attempt made at
/// the deadline still gets one command timeout, and one that must connect first gets a
/// connect timeout more. Never (as `lock()`): each attempt is bounded alone.
pub(crate) fn hard_limit(deadline: Deadline, start: Instant, t: Timeouts) -> Deadline {
    let Some(d) = deadline.instant() else {
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
    use std::time::Duration;

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
            hard_limit(Deadline::at(start), start, t),
            Deadline::at(start + ms(1300))
        );
        // A short wait still gets the connect timeout; a long one its deadline + one command.
        assert_eq!(
            hard_limit(Deadline::at(start + ms(500)), start, t),
            Deadline::at(start + ms(1300))
        );
        assert_eq!(
            hard_limit(Deadline::at(start + ms(5000)), start, t),
            Deadline::at(start + ms(5300))
        );
        // lock(): each attempt is bounded alone.
        assert_eq!(hard_limit(Deadline::NONE, start, t), Deadline::NONE);
        let huge = Timeouts {
            connect: Duration::MAX,
            command: Duration::MAX,
        };
        assert_eq!(hard_limit(Deadline::at(start), start, huge), Deadline::NONE);
    }
}
