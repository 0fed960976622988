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

use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::Holder;

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

impl Status {
    /// Held: valid or uncertain, neither lost nor released.
    fn holding(self) -> bool {
        matches!(self, Status::Valid | Status::Uncertain)
    }
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

/// What [`Hold::leave`] found, decided in one step with any loss of the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Left {
    /// The level left was the outermost: the hold is released (or stays lost).
    pub(crate) outermost: bool,
    /// The lease was known valid as the level was left: not marked lost, and its local
    /// deadline not passed. A release whose level was left otherwise is never `Ok`, whatever
    /// the server answers: the loss came first (and is, or will be, reported as one).
    pub(crate) held: bool,
}

/// Where a hold stands in a run of local hand-offs: the acquisition through Redis that
/// started the run, and what the run may still hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chain {
    /// Send time of the acquire through Redis that started the run.
    pub(crate) since: Instant,
    /// Local hand-offs in the run up to this hold (0: this hold came from Redis).
    pub(crate) passes: u32,
    /// The last fencing token reserved for the run (the hold's own token: none left).
    pub(crate) last: u64,
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
    /// Its place in a run of local hand-offs (a [`Mutex`](crate::Mutex) hold only).
    pub(crate) chain: Chain,
    /// When this hold began: the send time of its acquire, or its local hand-off.
    pub(crate) acquired: Instant,
    state: Mutex<State>,
    renewal_done: Condvar,
}

impl Hold {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        who: Identity,
        lease: Duration,
        drift: Duration,
        renewal: Option<Renewal>,
        sent: Instant,
    ) -> Self {
        Hold {
            keys,
            owner: who.owner,
            acquisition: who.acquisition,
            token: who.token,
            lease,
            drift,
            renewal,
            kind: Kind::Mutex,
            chain: Chain {
                since: sent,
                passes: 0,
                last: who.token,
            },
            acquired: sent,
            state: Mutex::new(State {
                last_ok: sent,
                status: Status::Valid,
                depth: 1,
                in_flight: false,
            }),
            renewal_done: Condvar::new(),
        }
    }

    /// The same hold, in this place of a run of local hand-offs.
    pub(crate) fn with_chain(mut self, chain: Chain) -> Self {
        self.chain = chain;
        self
    }

    /// The same hold, begun at `at` (a local hand-off: its lease runs from the last renewal
    /// of the hold it succeeds, its hold from the hand-off).
    pub(crate) fn acquired_at(mut self, at: Instant) -> Self {
        self.acquired = at;
        self
    }

    /// Gives up the outermost level for a local hand-off: the hold stays valid (and renewed)
    /// with no level held until the receiving thread [`retire`](Hold::retire)s it, or it is
    /// released through Redis. Returns false (and changes nothing) unless the caller's level
    /// is the only one and the lease is known valid. [`unpass`](Hold::unpass) undoes it.
    pub(crate) fn pass(&self) -> bool {
        let mut st = self.state.lock();
        if st.depth != 1 || !self.live(&st) {
            return false;
        }
        st.depth = 0;
        true
    }

    /// Takes the level back after a hand-off that found nobody to take it.
    pub(crate) fn unpass(&self) {
        self.state.lock().depth = 1;
    }

    /// Retires a passed hold for its successor, which takes over its lease: marks it
    /// released (no renewal is sent for it any more) and returns the send time of its last
    /// successful acquire or renewal. `None` (and released) when the lease is not known valid
    /// any more: the successor must not be made.
    pub(crate) fn retire(&self) -> Option<Instant> {
        let mut st = self.state.lock();
        let valid = st.depth == 0 && self.live(&st);
        if st.status != Status::Lost {
            st.status = Status::Released;
        }
        valid.then_some(st.last_ok)
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

    /// Whether the local deadline has passed.
    fn expired(&self, st: &State) -> bool {
        self.deadline_of(st).is_some_and(|d| Instant::now() >= d)
    }

    /// Whether the lease is known valid: held (valid or uncertain), its deadline not passed.
    fn live(&self, st: &State) -> bool {
        st.status.holding() && !self.expired(st)
    }

    /// The levels local guards hold (0 while passed on in a local hand-off, or released).
    pub(crate) fn depth(&self) -> u32 {
        self.state.lock().depth
    }

    /// The local deadline: after it, the lock may be someone else's.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline_of(&self.state.lock())
    }

    /// The status now, counting a passed deadline as lost.
    pub(crate) fn status(&self) -> Status {
        let st = self.state.lock();
        match st.status {
            s if s.holding() && self.expired(&st) => Status::Lost,
            s => s,
        }
    }

    /// True while the lease is known valid.
    pub(crate) fn is_held(&self) -> bool {
        self.status().holding()
    }

    /// `Ok` while the lease is known valid, [`Error::LeaseLost`](crate::Error::LeaseLost)
    /// once it is not: what every guard's `check()` answers.
    pub(crate) fn check(&self) -> crate::error::Result<()> {
        if self.is_held() {
            Ok(())
        } else {
            Err(crate::error::Error::LeaseLost)
        }
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

    /// How long a re-entry sent at `sent` makes the key's lease at least: the hold's own
    /// lease while it is renewed (as a renewal sent then would); zero for a fixed lease, which
    /// ends a fixed time after its acquisition whatever re-entries come, and zero past the
    /// maximum hold time, after which no renewal extends the lease and no re-entry may either
    /// (a holder re-entering in a loop would otherwise keep the lock forever).
    ///
    /// A re-entry keeps the terms of the hold's acquisition (lease, renewal, maximum hold
    /// time), whatever handle it came through: a handle's terms apply to new acquisitions.
    pub(crate) fn reentry_extension(&self, sent: Instant) -> Duration {
        match self.renewal {
            Some(Renewal { until, .. }) if until.is_none_or(|u| sent <= u) => self.lease,
            _ => Duration::ZERO,
        }
    }

    /// A re-entry of this hold, sent at `sent`: one more level. The server moved the key's
    /// expiry to at least `sent` plus [`reentry_extension`](Hold::reentry_extension) (never
    /// earlier), so the local deadline moves with it only when that is the hold's lease.
    /// Returns false if the hold is no longer usable (lost, released, or past its deadline).
    pub(crate) fn enter(&self, sent: Instant) -> bool {
        let mut st = self.state.lock();
        if !self.live(&st) || st.depth == 0 {
            return false;
        }
        st.depth += 1;
        if !self.reentry_extension(sent).is_zero() {
            st.last_ok = st.last_ok.max(sent);
        }
        st.status = Status::Valid;
        true
    }

    /// Leaves one level. For the outermost level the hold is marked released and this waits
    /// (at most `bound`) for a renewal on the wire, so that no renewal reaches Redis after
    /// the release. Returns whether this was the outermost level, and whether the lease was
    /// known valid as the level was left (see [`Left`]).
    pub(crate) fn leave(&self, bound: Duration) -> Left {
        let mut st = self.state.lock();
        // Read under the lock every loss is marked under: a loss marked before this is seen
        // here, and one after it finds the outermost level released (`mark_lost`,
        // `end_renewal` and `begin_renewal` then change nothing and report nothing).
        let held = self.live(&st);
        st.depth = st.depth.saturating_sub(1);
        let outermost = st.depth == 0;
        if outermost {
            if st.status != Status::Lost {
                st.status = Status::Released;
            }
            // A bound too far to be an instant waits as long as it takes.
            self.renewal_done
                .wait_while_for(&mut st, |st| st.in_flight, bound);
        }
        Left { outermost, held }
    }

    /// Ends the hold at its client's shutdown, whatever levels its guards hold: it is marked
    /// released (no renewal is sent for it, its guards read it as not held). Returns whether
    /// its lease was known valid until then: the one it is then released for on the server.
    pub(crate) fn close(&self) -> bool {
        let mut st = self.state.lock();
        let live = self.live(&st);
        if st.status.holding() {
            st.status = Status::Released;
        }
        live
    }

    /// Marks the hold lost; returns true if it was not lost or released before.
    pub(crate) fn mark_lost(&self) -> bool {
        let mut st = self.state.lock();
        let was = st.status.holding();
        if was {
            st.status = Status::Lost;
        }
        was
    }

    /// Called by the renewal thread before sending a renewal.
    pub(crate) fn begin_renewal(&self) -> Begin {
        let mut st = self.state.lock();
        if !st.status.holding() {
            return Begin::Skip;
        }
        // Past the local deadline the hold is lost for good, even if a renewal would still
        // find the key: `is_held()` never turns true again once it read false.
        if self.expired(&st) {
            st.status = Status::Lost;
            return Begin::Expired;
        }
        st.in_flight = true;
        Begin::Send
    }

    /// Records the outcome of a renewal sent at `sent`: `Some(true)` extended, `Some(false)`
    /// not owned any more, `None` failed (I/O). Returns the status afterwards, or `None` when
    /// the hold had been released or marked lost meanwhile (by its owner's thread): then the
    /// outcome changes nothing, and a loss was reported by whoever marked it.
    pub(crate) fn end_renewal(&self, sent: Instant, outcome: Option<bool>) -> Option<Status> {
        let mut st = self.state.lock();
        st.in_flight = false;
        let status = if st.status.holding() {
            st.status = match outcome {
                Some(true) => {
                    st.last_ok = st.last_ok.max(sent);
                    Status::Valid
                }
                Some(false) => Status::Lost,
                None if self.expired(&st) => Status::Lost,
                None => Status::Uncertain,
            };
            Some(st.status)
        } else {
            None
        };
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
        assert_eq!(h.end_renewal(Instant::now(), None), Some(Status::Uncertain));
        assert!(h.is_held());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert_eq!(
            h.end_renewal(Instant::now(), Some(false)),
            Some(Status::Lost)
        );
        assert!(!h.is_held());
        assert_eq!(h.begin_renewal(), Begin::Skip);
    }

    #[test]
    fn a_renewal_ending_after_the_hold_was_marked_lost_changes_nothing() {
        let h = hold(10_000, Instant::now());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert!(h.mark_lost());
        assert_eq!(h.end_renewal(Instant::now(), Some(false)), None);
        assert_eq!(h.begin_renewal(), Begin::Skip);
        let r = hold(10_000, Instant::now());
        assert_eq!(r.begin_renewal(), Begin::Send);
        assert!(r.leave(Duration::ZERO).outermost);
        assert_eq!(r.end_renewal(Instant::now(), Some(true)), None);
        assert_eq!(r.status(), Status::Released);
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
    fn a_fixed_lease_reentry_keeps_the_deadline() {
        let t = Instant::now();
        let mut h = hold(10_000, t);
        h.renewal = None;
        let before = h.deadline();
        let later = t + Duration::from_secs(1);
        assert_eq!(h.reentry_extension(later), Duration::ZERO);
        assert!(h.enter(later));
        assert_eq!(h.deadline(), before);
        let w = hold(10_000, t);
        assert_eq!(w.reentry_extension(later), Duration::from_secs(10));
        assert!(w.enter(later));
        assert_eq!(w.deadline(), before.map(|d| d + Duration::from_secs(1)));
    }

    #[test]
    fn no_reentry_extends_past_the_maximum_hold_time() {
        let t = Instant::now();
        let mut h = hold(10_000, t);
        h.renewal = Some(Renewal {
            every: Duration::from_secs(3),
            until: Some(t + Duration::from_millis(500)),
        });
        assert_eq!(h.reentry_extension(t), Duration::from_secs(10));
        let later = t + Duration::from_secs(1);
        assert_eq!(h.reentry_extension(later), Duration::ZERO);
        let before = h.deadline();
        assert!(h.enter(later));
        assert_eq!(h.deadline(), before);
    }

    #[test]
    fn a_hold_passes_at_its_outermost_level_only_and_retires_once() {
        let h = hold(10_000, Instant::now());
        assert!(h.enter(Instant::now()));
        assert!(!h.pass(), "an inner level passed");
        assert!(!h.leave(Duration::ZERO).outermost);
        assert!(h.pass());
        assert!(h.is_held(), "a passed hold stays valid until retired");
        assert!(!h.enter(Instant::now()), "a passed hold was re-entered");
        h.unpass();
        assert!(h.pass());
        let sent = h.state.lock().last_ok;
        assert_eq!(h.retire(), Some(sent));
        assert_eq!(h.status(), Status::Released);
        assert_eq!(h.retire(), None);
        assert_eq!(h.begin_renewal(), Begin::Skip);
        // A lease that ran out in transit is not taken over.
        let late = hold(30, Instant::now() - Duration::from_millis(100));
        assert!(!late.pass());
        let lost = hold(10_000, Instant::now());
        assert!(lost.pass());
        assert!(lost.mark_lost());
        assert_eq!(lost.retire(), None);
        assert_eq!(lost.status(), Status::Lost);
    }

    /// The loss and the release of the outermost level decide in one step: whichever comes
    /// first wins, and the other sees it. A loss first: the level is left not held (its
    /// release is never `Ok`). A release first: no loss is marked or reported afterwards.
    #[test]
    fn a_loss_and_a_release_agree_in_either_order() {
        // The renewal thread finds the loss, then the owner leaves.
        let h = hold(10_000, Instant::now());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert_eq!(
            h.end_renewal(Instant::now(), Some(false)),
            Some(Status::Lost)
        );
        let left = h.leave(Duration::ZERO);
        assert!(left.outermost && !left.held, "{left:?}");
        assert_eq!(h.status(), Status::Lost);
        // A loss marked by a lock call, then the owner leaves an inner level, then the last.
        let h = hold(10_000, Instant::now());
        assert!(h.enter(Instant::now()));
        assert!(h.mark_lost());
        assert_eq!(
            h.leave(Duration::ZERO),
            Left {
                outermost: false,
                held: false
            }
        );
        assert_eq!(
            h.leave(Duration::ZERO),
            Left {
                outermost: true,
                held: false
            }
        );
        // The owner leaves, then the renewal's outcome (or a lock call's loss) arrives.
        let h = hold(10_000, Instant::now());
        assert_eq!(h.begin_renewal(), Begin::Send);
        assert_eq!(
            h.leave(Duration::ZERO),
            Left {
                outermost: true,
                held: true
            }
        );
        assert_eq!(h.end_renewal(Instant::now(), Some(false)), None);
        assert!(!h.mark_lost());
        assert_eq!(h.begin_renewal(), Begin::Skip);
        assert_eq!(h.status(), Status::Released);
        // A local deadline passed before the owner left: not held, as `is_held` said.
        let late = hold(30, Instant::now() - Duration::from_millis(100));
        assert!(!late.is_held());
        assert!(!late.leave(Duration::ZERO).held);
    }

    /// The same race run by two threads, released together by a barrier many times: a loss
    /// reported (the renewal's outcome marked it) and a release left held never both happen,
    /// and one of them always does.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_loss_and_a_release_racing_never_both_win() {
        for _ in 0..2_000 {
            let h = Arc::new(hold(10_000, Instant::now()));
            assert_eq!(h.begin_renewal(), Begin::Send);
            let start = Arc::new(std::sync::Barrier::new(2));
            let renewal = {
                let (h, start) = (Arc::clone(&h), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    h.end_renewal(Instant::now(), Some(false)) == Some(Status::Lost)
                })
            };
            start.wait();
            let left = h.leave(Duration::from_secs(5));
            let reported = renewal.join().unwrap();
            assert!(left.outermost);
            assert!(
                reported != left.held,
                "loss reported: {reported}, release left held: {}",
                left.held
            );
        }
    }

    #[test]
    fn levels_and_release() {
        let h = hold(10_000, Instant::now());
        assert!(h.enter(Instant::now()));
        assert!(!h.leave(Duration::ZERO).outermost);
        assert!(h.leave(Duration::ZERO).outermost);
        assert_eq!(h.status(), Status::Released);
        assert_eq!(h.begin_renewal(), Begin::Skip);
        assert!(!h.mark_lost());
    }
}
