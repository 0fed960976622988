//! The local record of one held lock: its lease deadline and state, shared by the guards of
//! one owner and the renewal thread.
//!
//! A holder must learn that it lost the lock no later than anyone else can take it. The
//! record keeps a local deadline (an [`Instant`]): the *send* time of the last successful
//! acquire or renewal, plus the lease, minus a margin for clock-rate drift between this host
//! and Redis. The lease on the server started no earlier than that send time, so the lease
//! there ends no earlier than the local deadline, and [`Hold::is_held`] turns false at that
//! deadline even when Redis cannot be reached at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::keys::LockKeys;
use crate::scripts::{Holder, Kind};

/// Who holds: the owner, the acquisition (its request id) and its fencing token.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) owner: String,
    pub(crate) acquisition: String,
    pub(crate) token: u64,
}

/// How the renewal thread keeps a hold alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    /// The renewal interval.
    pub(crate) every: Duration,
    /// No renewal is sent after this instant (the maximum hold time); `None`: no limit.
    pub(crate) until: Option<Instant>,
}

/// What the renewal thread should do with a hold that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Renew it (it is marked in flight).
    Send,
    /// Its local deadline passed before it could be renewed: it was just marked lost.
    Expired,
    /// Released or lost before: nothing to do.
    Skip,
}

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Held, and the last renewal (if any) succeeded.
    Valid,
    /// The last renewal failed for a reason that may pass; the lease has not run out yet.
    Uncertain,
    /// Lost: renewal found another owner or no key, or the deadline passed.
    Lost,
    /// Released by its owner.
    Released,
}

#[derive(Debug)]
struct State {
    /// Send time of the last successful acquire or renewal.
    last_ok: Instant,
    status: Status,
    /// Re-entry levels held by local guards.
    depth: u32,
    /// A renewal that includes this hold is on the wire.
    in_flight: bool,
}

/// One owner's hold on one lock.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: String,
    /// The acquisition this hold belongs to: the request id of the acquire that created it.
    pub(crate) acquisition: String,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    /// The part of the lease given up for clock drift.
    drift: Duration,
    /// How the renewal thread extends the lease; `None` for a fixed lease.
    pub(crate) renewal: Option<Renewal>,
    /// Which lock type holds it: tells the renewal thread which renew script to send.
    pub(crate) kind: Kind,
    state: Mutex<State>,
    renewal_done: Condvar,
}

impl Hold {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        Identity {
            owner,
            acquisition,
            token,
        }: Identity,
        lease: Duration,
        drift: Duration,
        renewal: Option<Renewal>,
        sent: Instant,
    ) -> Self {
        Hold {
            keys,
            owner,
            acquisition,
            token,
            lease,
            drift,
            renewal,
            kind: Kind::Mutex,
            state: Mutex::new(State {
                last_ok: sent,
                status: Status::Valid,
                depth: 1,
                in_flight: false,
            }),
            renewal_done: Condvar::new(),
        }
    }

    /// The same hold, kept by another lock type's renew script.
    pub(crate) fn with_kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    fn deadline_of(&self, st: &State) -> Option<Instant> {
        st.last_ok
            .checked_add(self.lease.saturating_sub(self.drift))
    }

    /// The local deadline: after it, the lock may be someone else's.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline_of(&self.state.lock())
    }

    /// The status now, counting a passed deadline as lost.
    pub(crate) fn status(&self) -> Status {
        let st = self.state.lock();
        match st.status {
            Status::Valid | Status::Uncertain
                if self.deadline_of(&st).is_some_and(|d| Instant::now() >= d) =>
            {
                Status::Lost
            }
            s => s,
        }
    }

    /// True while the lease is known valid.
    pub(crate) fn is_held(&self) -> bool {
        matches!(self.status(), Status::Valid | Status::Uncertain)
    }

    /// Time left until the local deadline (zero once passed or lost).
    pub(crate) fn validity(&self) -> Duration {
        if !self.is_held() {
            return Duration::ZERO;
        }
        self.deadline().map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        })
    }

    /// A re-entry of this hold: one more level, and the lease was just extended at `sent`.
    /// Returns false if the hold is no longer usable (lost or released).
    pub(crate) fn enter(&self, sent: Instant) -> bool {
        let mut st = self.state.lock();
        if !matches!(st.status, Status::Valid | Status::Uncertain) || st.depth == 0 {
            return false;
        }
        st.depth += 1;
        st.last_ok = st.last_ok.max(sent);
        st.status = Status::Valid;
        true
    }

    /// Leaves one level. For the outermost level the hold is marked released and this waits
    /// (at most `bound`) for a renewal on the wire, so that no renewal reaches Redis after
    /// the release. Returns whether this was the outermost level.
    pub(crate) fn leave(&self, bound: Duration) -> bool {
        let mut st = self.state.lock();
        st.depth = st.depth.saturating_sub(1);
        if st.depth > 0 {
            return false;
        }
        if st.status != Status::Lost {
            st.status = Status::Released;
        }
        let until = Instant::now().checked_add(bound);
        while st.in_flight {
            match until {
                Some(t) => {
                    if self.renewal_done.wait_until(&mut st, t).timed_out() {
                        break;
                    }
                }
                None => self.renewal_done.wait(&mut st),
            }
        }
        true
    }

    /// Marks the hold lost; returns true if it was not lost or released before.
    pub(crate) fn mark_lost(&self) -> bool {
        let mut st = self.state.lock();
        if matches!(st.status, Status::Valid | Status::Uncertain) {
            st.status = Status::Lost;
            true
        } else {
            false
        }
    }

    /// Called by the renewal thread before sending a renewal.
    pub(crate) fn begin_renewal(&self) -> Begin {
        let mut st = self.state.lock();
        if !matches!(st.status, Status::Valid | Status::Uncertain) {
            return Begin::Skip;
        }
        // Past the local deadline the hold is lost for good, even if a renewal would still
        // find the key: `is_held()` never turns true again once it read false.
        if self.deadline_of(&st).is_some_and(|d| Instant::now() >= d) {
            st.status = Status::Lost;
            return Begin::Expired;
        }
        st.in_flight = true;
        Begin::Send
    }

    /// Records the outcome of a renewal sent at `sent`: `Some(true)` extended, `Some(false)`
    /// not owned any more, `None` failed (I/O). Returns the status afterwards.
    pub(crate) fn end_renewal(&self, sent: Instant, outcome: Option<bool>) -> Status {
        let mut st = self.state.lock();
        st.in_flight = false;
        if matches!(st.status, Status::Valid | Status::Uncertain) {
            match outcome {
                Some(true) => {
                    st.last_ok = st.last_ok.max(sent);
                    st.status = Status::Valid;
                }
                Some(false) => st.status = Status::Lost,
                None => {
                    st.status = if self.deadline_of(&st).is_some_and(|d| Instant::now() >= d) {
                        Status::Lost
                    } else {
                        Status::Uncertain
                    }
                }
            }
        }
        let status = st.status;
        drop(st);
        self.renewal_done.notify_all();
        status
    }

    /// Who this hold is, for the release and renew scripts.
    pub(crate) fn holder(&self) -> Holder<'_> {
        Holder {
            owner: &self.owner,
            acquisition: &self.acquisition,
        }
    }

    /// When the next renewal is due; `None` when no renewal is due any more (fixed lease, or
    /// the maximum hold time reached).
    pub(crate) fn next_renewal(&self) -> Option<Instant> {
        let Renewal { every, until } = self.renewal?;
        let at = self.state.lock().last_ok.checked_add(every)?;
        match until {
            Some(u) if at > u => None,
            _ => Some(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(lease_ms: u64, sent: Instant) -> Hold {
        Hold::new(
            Arc::new(LockKeys::new("t:", "x")),
            Identity {
                owner: "o".into(),
                acquisition: "g".into(),
                token: 1,
            },
            Duration::from_millis(lease_ms),
            Duration::from_millis(lease_ms / 100 + 2),
            Some(Renewal {
                every: Duration::from_millis(lease_ms / 3),
                until: None,
            }),
            sent,
        )
    }

    #[test]
    fn deadline_is_send_time_plus_lease_minus_margin() {
        let t = Instant::now();
        let h = hold(1000, t);
        assert_eq!(h.deadline(), Some(t + Duration::from_millis(1000 - 12)));
        assert!(h.is_held());
    }

    #[test]
    fn a_passed_deadline_is_lost_without_any_io() {
        let h = hold(30, Instant::now() - Duration::from_millis(100));
        assert_eq!(h.status(), Status::Lost);
        assert!(!h.is_held());
        assert_eq!(h.validity(), Duration::ZERO);
    }

    #[test]
    fn failed_renewal_is_uncertain_until_the_deadline() {
        let h = hold(10_000, Instant::now());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert_eq!(h.end_renewal(Instant::now(), None), Status::Uncertain);
        assert!(h.is_held());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert_eq!(h.end_renewal(Instant::now(), Some(false)), Status::Lost);
        assert!(!h.is_held());
        assert_eq!(h.begin_renewal(), Begin::Skip);
    }

    #[test]
    fn renewal_stops_at_the_maximum_hold_time() {
        let t = Instant::now();
        let mut h = hold(3000, t);
        assert_eq!(h.next_renewal(), Some(t + Duration::from_secs(1)));
        h.renewal = Some(Renewal {
            every: Duration::from_secs(1),
            until: Some(t + Duration::from_millis(500)),
        });
        assert_eq!(h.next_renewal(), None);
    }

    #[test]
    fn levels_and_release() {
        let h = hold(10_000, Instant::now());
        assert!(h.enter(Instant::now()));
        assert!(!h.leave(Duration::ZERO));
        assert!(h.leave(Duration::ZERO));
        assert_eq!(h.status(), Status::Released);
        assert_eq!(h.begin_renewal(), Begin::Skip);
        assert!(!h.mark_lost());
    }
}
