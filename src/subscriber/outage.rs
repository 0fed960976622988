//! The log lines of a pub/sub connection's outage: when it starts, now and then while it
//! lasts, when it ends.
//!
//! Apart from the threads' loops because it is a policy of its own (how often a condition
//! that lasts is reported), kept by the thread's loop (`pubsub_thread.rs`) for the one server or
//! for each cluster master, and tested with synthetic instants: it reads no clock.
//!
//! Its log lines keep the parent's target, `locksmith::subscriber`: operators filter on
//! the targets that "Log levels" in the crate docs lists.

use std::time::{Duration, Instant};

/// How often a pub/sub connection that stays down is reported at `warn` (every try is logged
/// at `debug`).
pub(crate) const DOWN_REPORT_EVERY: Duration = Duration::from_secs(60);

/// The log lines of one connection's outage: one `warn` when it is lost, then at most one
/// every [`DOWN_REPORT_EVERY`] while it stays down (for how long, how many tries, the last
/// error), one `info` when it is back; every try at `debug`. So a client whose Redis is down
/// for an hour logs about 60 lines, not 3600.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// When the connection was lost (`None`: it is up).
    since: Option<Instant>,
    /// Failed tries since.
    tries: u32,
    /// The last `warn` line of this outage.
    reported: Option<Instant>,
}

impl Outage {
    /// The connection to `server` was lost at `now` (or could not be opened, if it was up):
    /// the one `warn` line of the outage.
    pub(crate) fn lost(&mut self, server: &str, e: &dyn std::fmt::Display, now: Instant) {
        if self.since.is_some() {
            return;
        }
        self.since = Some(now);
        self.tries = 0;
        self.reported = Some(now);
        log::warn!(
            target: "locksmith::subscriber",
            "pub/sub connection to {server} lost: {e}; reconnecting"
        );
    }

    /// A try to reconnect to `server` failed at `now`; the next one is in `retry_in` (if
    /// known). True when this wrote a `warn` line (the outage's first, or a reminder after
    /// [`DOWN_REPORT_EVERY`]).
    pub(crate) fn failed(
        &mut self,
        server: &str,
        e: &dyn std::fmt::Display,
        retry_in: Option<Duration>,
        now: Instant,
    ) -> bool {
        let first = self.since.is_none();
        if first {
            self.lost(server, e, now);
        }
        self.tries = self.tries.saturating_add(1);
        let retry = retry_in.map(|d| format!(" (retrying in {d:?})"));
        log::debug!(
            target: "locksmith::subscriber",
            "pub/sub reconnect to {server} failed{}: {e}",
            retry.unwrap_or_default()
        );
        let due = self
            .reported
            .is_none_or(|t| now.saturating_duration_since(t) >= DOWN_REPORT_EVERY);
        if !due {
            return first;
        }
        self.reported = Some(now);
        let down = self
            .since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        log::warn!(
            target: "locksmith::subscriber",
            "pub/sub connection to {server} still down after {:?} ({} tries; waiters re-check \
             their locks meanwhile): {e}",
            Duration::from_secs(down.as_secs()),
            self.tries
        );
        true
    }

    /// Whether the connection is down (lost, or failing to open).
    pub(crate) fn is_down(&self) -> bool {
        self.since.is_some()
    }

    /// The connection to `server` is up again at `now` (an `info` line if it had been down).
    /// True when it had been down (a reconnect).
    pub(crate) fn restored(&mut self, server: &str, now: Instant) -> bool {
        let was_down = self.since.is_some();
        if let Some(t) = self.since.take() {
            log::info!(
                target: "locksmith::subscriber",
                "pub/sub connection to {server} restored after {:.1?} ({} failed tries); \
                 waiters re-check their locks",
                now.saturating_duration_since(t),
                self.tries
            );
        }
        self.tries = 0;
        self.reported = None;
        was_down
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outage writes a `warn` line when it starts and then at most one every
    /// `DOWN_REPORT_EVERY`, however often the reconnect fails; it starts afresh once restored.
    #[test]
    fn an_outage_warns_once_then_once_a_period() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut o = Outage::default();
        o.lost("h:1", &"eof", at(0));
        let warned: Vec<u64> = (1..=185)
            .filter(|&s| o.failed("h:1", &"refused", None, at(s)))
            .collect();
        assert_eq!(warned, [60, 120, 180]);
        assert_eq!(o.tries, 185);
        o.restored("h:1", at(186));
        assert!(o.since.is_none());
        // Down again: the first failed try is the outage's first warn line.
        assert!(o.failed("h:1", &"refused", None, at(200)));
        assert!(!o.failed("h:1", &"refused", None, at(201)));
    }
}
