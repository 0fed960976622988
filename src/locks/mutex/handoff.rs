//! Local hand-off: a [`Mutex`](crate::Mutex) released while other threads of the same client
//! wait for it passes to the leader of their queue without a round trip to Redis.
//!
//! # How a hold passes
//!
//! The releasing thread ([`pass`]) keeps the lock on the server as it is (its owner and
//! acquisition stay there) and hands its [`Hold`] to the leader of the lock's local queue (the
//! same FIFO as every local waiter's, see `subscriber.rs`) inside a [`Baton`]. The receiving
//! thread ([`receive`]) retires that hold and makes its successor: the same owner and
//! acquisition on the server, the next fencing token, the same lease deadline, its own
//! level count, its own maximum hold time, registered for renewal and in the thread's slot
//! for re-entry. So the successor behaves as a hold from Redis, and a loss found later by the
//! renewal thread is the successor's, reported with its token.
//!
//! # Why it stays safe
//!
//! - Exclusion: the lock never becomes free on the server during a run of hand-offs, so no
//!   other owner can take it; locally, a hold passes to exactly one thread (the passed lock slot of
//!   the queue holds one baton, taken by one leader).
//! - Fencing: the acquisition through Redis reserved a block of tokens after its own (the
//!   acquire script raised the name's fencing mark to the block's last), and each hand-off takes the next
//!   one; a run stops when the block is used up. Any later acquisition, anywhere, gets a
//!   token above the block.
//! - Other processes: a run ends after `local_handoff_max_count` hand-offs or once
//!   `local_handoff_max_time` has passed since the acquisition through Redis; that release
//!   goes through Redis and publishes, so remote waiters compete for the lock again.
//! - The handing thread's owner id stays on the server while another thread holds the lock;
//!   the handing thread takes a new id for its later acquisitions (see
//!   [`Shared::owner`]), so the acquire script never takes the holder's levels for its
//!   orphans.
//! - A baton nobody takes (the last waiter left) is dropped, and dropping it releases the
//!   lock through Redis, owner- and acquisition-checked, as a guard's drop would.
//! - A run whose acquisition the server lost (the key expired or was deleted, Redis restarted
//!   empty) goes on until a renewal finds out, at most one renewal interval. But once another
//!   thread of this client is granted the name through Redis, the client knows: the run's
//!   holds are marked lost and reported, and a baton in transit makes no successor (see
//!   [`Shared::adopt_passed`]). Otherwise the run would hand out tokens from its block, which
//!   lie below the new grant's, while the new holder holds the lock.
//!
//! # Giving way after a run
//!
//! A release through Redis wakes this client's leader and other processes' waiters with the
//! same message, and the leader, awake already or woken first, usually wins the race: a
//! remote waiter could lose run after run. So a release through Redis while threads of this
//! client queue ([`GivingWay`]) tells the leader not to take that release's message as its
//! cue. If the release script reports `n` receivers of its message beyond this client's own
//! subscription, the leader waits for `n` later releases (each of the others may take the
//! lock once and free it: the lock goes round the processes, instead of the others racing
//! each other while this client stays out) or for `local_handoff_give_way`, whichever comes
//! first, then competes as before; otherwise it competes at once. A listener that never
//! takes the lock thus costs at most the give-way per release through Redis. The leader is
//! held back from the start of the release (its message may arrive before its reply) when
//! others heard the previous one; a client alone on a lock so pays nothing. This is
//! fairness only: exclusion and fencing do not depend on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kind::Kind;
use crate::protocol::scripts::Level;
use crate::shared::Shared;
use crate::shared::grant::Terms;
use crate::shared::hold::{Chain, Hold, Identity, Renewal};
use crate::subscriber::{GiveWay, Passed};
use crate::transport::conn::Deadline;

/// A hold on its way from one thread to another. Dropped unused, it releases the lock
/// through Redis.
pub(crate) struct Baton {
    shared: Arc<Shared>,
    hold: Arc<Hold>,
    /// Taken over by a successor, or given back to the handing thread: nothing to release.
    done: bool,
}

impl Baton {
    /// Releases the passed lock through Redis within `by` (and one connect plus one command
    /// timeout), owner- and acquisition-checked, as a guard's release would.
    fn release_by(&mut self, by: Deadline) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let shared = &self.shared;
        let hold = &self.hold;
        let by = by.min(Deadline::after(shared.config.one_call()));
        // Marks it released (it has no level left) and waits for a renewal on the wire.
        hold.leave(by.left().unwrap_or(Duration::MAX));
        shared.renewals.released(hold);
        shared.end_run(hold);
        let publish = shared.subscriber.has_waiters(&hold.keys.channel);
        let acquisition = (hold.acquisition.as_str(), hold.token);
        let (keys, level) = (&hold.keys, Level::Outermost);
        if let Err(e) =
            super::release::release(&shared.backend, keys, acquisition, level, publish, by)
        {
            log::debug!(
                "releasing `{}` after a hand-off nobody took: {e}",
                hold.keys.name
            );
        }
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        self.release_by(Deadline::NONE);
    }
}

/// Hands `hold` (the calling thread's, at its outermost level) to the leader of its lock's
/// local queue, if the client hands off and the run's bound allows it. Returns true when the
/// leader has it: the level is released, without any I/O. False: nothing changed, release
/// through Redis.
pub(crate) fn pass(shared: &Arc<Shared>, hold: &Arc<Hold>) -> bool {
    let Some(bound) = shared.config.handoff else {
        return false;
    };
    let chain = hold.chain;
    // Only a renewed Mutex hold passes: a fixed lease ends a fixed time after its acquisition
    // through Redis, and a hold past its maximum hold time is no longer renewed.
    if hold.kind != Kind::Mutex
        || hold.renewal.is_none()
        || hold.next_renewal().is_none()
        || chain.passes >= bound.max_count
        || hold.token >= chain.last
        || chain.since.elapsed() >= bound.max_time
        || !shared.subscriber.has_waiters(&hold.keys.channel)
    {
        return false;
    }
    if !hold.pass() {
        return false;
    }
    let baton: Passed = Box::new(Baton {
        shared: Arc::clone(shared),
        hold: Arc::clone(hold),
        done: false,
    });
    match shared.subscriber.offer(&hold.keys.channel, baton) {
        Ok(()) => {
            shared.passed_on(hold);
            true
        }
        Err(back) => {
            // Nobody to take it after all (the last waiter just left): the level is the
            // caller's again, and it releases through Redis.
            if let Ok(mut b) = back.downcast::<Baton>() {
                b.done = true;
            }
            hold.unpass();
            false
        }
    }
}

/// Takes a hold handed to the calling thread, which asks for a new acquisition with
/// `terms`: its successor, held by this thread, with the next fencing token. `None` when it
/// cannot be taken (its lease is no longer known valid, or the terms differ: another lease
/// length, or a fixed lease); the lock is then released through Redis within `by` (the
/// caller's bound), and the caller goes on as a waiter.
pub(crate) fn receive(
    shared: &Shared,
    passed: Passed,
    terms: Terms,
    by: Deadline,
) -> Option<Arc<Hold>> {
    let mut baton = passed.downcast::<Baton>().ok()?;
    let old = Arc::clone(&baton.hold);
    if !terms.watchdog || terms.lease != old.lease {
        baton.release_by(by);
        return None;
    }
    let now = Instant::now();
    let Some(last_ok) = old.retire() else {
        baton.release_by(by);
        return None;
    };
    baton.done = true;
    drop(baton);
    shared.renewals.released(&old);
    let successor = Arc::new(
        Hold::new(
            Arc::clone(&old.keys),
            Identity {
                owner: old.owner.clone(),
                acquisition: old.acquisition.clone(),
                token: old.token + 1,
            },
            old.lease,
            shared.backend.drift(old.lease),
            Some(Renewal {
                every: shared.config.renew_every,
                until: terms.max_hold.and_then(|m| now.checked_add(m)),
            }),
            last_ok,
        )
        .with_chain(Chain {
            since: old.chain.since,
            passes: old.chain.passes + 1,
            last: old.chain.last,
        })
        .acquired_at(now),
    );
    // Refused when this client was granted the lock through Redis anew since the run began:
    // the server no longer has the run's acquisition, so its next token would sit below the
    // new grant's. The successor is reported lost; its acquisition is another's (or nobody's)
    // on the server, so nothing is released there.
    shared.adopt_passed(&successor).then_some(successor)
}

/// The outermost release through Redis of a [`Mutex`](crate::Mutex) for which threads of
/// this client queue: its message does not wake the leader of their queue to compete at
/// once (see "Giving way after a run" above). Begun before the release is sent (its message
/// may come back before its reply), settled by the reply.
pub(crate) struct GivingWay {
    way: GiveWay,
    give_way: Duration,
}

impl GivingWay {
    /// Begins giving way for the release of `hold` about to be sent, if the client hands off
    /// and gives way, and threads of this client queue for the lock.
    pub(crate) fn begin(shared: &Shared, hold: &Hold) -> Option<GivingWay> {
        let bound = shared.config.handoff?;
        if hold.kind != Kind::Mutex || bound.give_way.is_zero() {
            return None;
        }
        let until = Instant::now().checked_add(bound.give_way)?;
        let way = shared.subscriber.give_way(&hold.keys.channel, until)?;
        Some(GivingWay {
            way,
            give_way: bound.give_way,
        })
    }

    /// The release freed the lock and `listeners` subscribers received its message: when
    /// some were others than this client, the leader gives way for the option's time from
    /// now, or until as many later releases as there were others (each of them may take the
    /// lock once first, so that they do not race each other with this client out of it);
    /// otherwise it competes at once.
    pub(crate) fn settle(self, listeners: u64) {
        let others = listeners.saturating_sub(u64::from(self.way.counted()));
        match Instant::now().checked_add(self.give_way) {
            Some(until) if others > 0 => self.way.hold(others, until),
            _ => self.way.alone(),
        }
    }
}
