//! Steps of a master's wall clock, seen from the renewal thread: a pure function of readings,
//! no clock read and no I/O here.
//!
//! Every renewal round reads each master's clock (`TIME`, sent in the same pipeline as the
//! renewals). Between two rounds, the server's clock should move as far as this host's
//! monotonic clock did. Redis expires keys by its wall clock, so when it moved further (a step
//! forward: NTP, a VM resumed) leases there may have ended early, and when it moved less (a
//! step back) leases there last longer than asked. A difference beyond [`tolerance`] is a
//! jump; it is reported once, for the master, however many locks it holds.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The difference between the two clocks' progress that counts as a jump, after `elapsed` of
/// this host's monotonic clock: 500 ms, plus 1 % of the time (the clock-rate allowance).
pub(crate) fn tolerance(elapsed: Duration) -> Duration {
    Duration::from_millis(500) + elapsed / 100
}

/// A jump of a master's clock: how far, and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Jump {
    /// `true`: the server's clock ran ahead (a step forward).
    pub(crate) forward: bool,
    /// How far beyond the monotonic clock's progress.
    pub(crate) by: Duration,
}

impl Jump {
    /// The log line for a jump of the clock of `master`.
    pub(crate) fn describe(&self, master: &str) -> String {
        let secs = self.by.as_secs_f64();
        if self.forward {
            format!(
                "the clock of {master} jumped forward {secs:.1} s: leases there may have ended \
                 early (their holders learn of it at their next renewal)"
            )
        } else {
            format!(
                "the clock of {master} jumped back {secs:.1} s: leases there now last longer \
                 than asked (a lock whose holder died stays held for its lease + {secs:.1} s)"
            )
        }
    }
}

/// The last clock reading of each master.
#[derive(Debug, Default)]
pub(crate) struct ClockWatch {
    last: HashMap<String, (Instant, u64)>,
}

impl ClockWatch {
    /// Takes the reading `server_us` (the server's clock, microseconds since the epoch) of
    /// `master`, received at `at` (this host's monotonic clock): the jump since its last
    /// reading, if any.
    pub(crate) fn observe(&mut self, master: &str, at: Instant, server_us: u64) -> Option<Jump> {
        let prev = self.last.insert(master.to_owned(), (at, server_us));
        let (then, was) = prev?;
        let local = at.checked_duration_since(then)?;
        let local_us = u64::try_from(local.as_micros()).unwrap_or(u64::MAX);
        let (forward, diff_us) = match server_us.checked_sub(was) {
            Some(moved) if moved >= local_us => (true, moved - local_us),
            Some(moved) => (false, local_us - moved),
            None => (false, (was - server_us).saturating_add(local_us)),
        };
        let by = Duration::from_micros(diff_us);
        (by > tolerance(local)).then_some(Jump { forward, by })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    /// A watch of the master `m` that read 100 s on the server's clock, then `server_us` a
    /// second later: the watch, when it read the second time, and the jump it saw then.
    fn jumped_in_a_second(server_us: u64) -> (ClockWatch, Instant, Jump) {
        let mut w = ClockWatch::default();
        let t0 = Instant::now();
        w.observe("m", t0, 100 * S);
        let t1 = t0 + Duration::from_secs(1);
        let j = w.observe("m", t1, server_us).unwrap();
        (w, t1, j)
    }

    #[test]
    fn steady_clocks_are_no_jump() {
        let mut w = ClockWatch::default();
        let t0 = Instant::now();
        assert_eq!(w.observe("m", t0, 100 * S), None);
        // 10 s on both clocks, 200 ms of round-trip noise: within 500 ms + 1 %.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(w.observe("m", t1, 110 * S + 200_000), None);
        // An hour later, 30 s of rate difference: within 500 ms + 36 s.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!(w.observe("m", t2, 3710 * S + 30 * S), None);
    }

    #[test]
    fn a_forward_step_is_one_jump() {
        let (mut w, t1, j) = jumped_in_a_second(121 * S);
        assert!(j.forward);
        assert_eq!(j.by, Duration::from_secs(20));
        assert!(j.describe("h:1").contains("jumped forward 20.0 s"));
        // The next round runs steady again: no second report.
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(w.observe("m", t2, 122 * S), None);
    }

    #[test]
    fn a_step_back_is_one_jump_whatever_its_size() {
        // Back 10 s while 1 s passed: the server's clock is 9 s behind where it was.
        let (mut w, t1, j) = jumped_in_a_second(91 * S);
        assert!(!j.forward);
        assert_eq!(j.by, Duration::from_secs(10));
        assert!(j.describe("h:1").contains("jumped back 10.0 s"));
        // Back 0.4 s only (within the tolerance) after 2 s: moved 1.6 s of 2.
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(w.observe("m", t2, 92 * S + 600_000), None);
    }

    #[test]
    fn masters_are_watched_apart() {
        let mut w = ClockWatch::default();
        let t0 = Instant::now();
        w.observe("a", t0, 100 * S);
        w.observe("b", t0, 500 * S);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(w.observe("a", t1, 101 * S), None);
        assert!(w.observe("b", t1, 600 * S).is_some());
    }
}
