//! [`MutexGuard`]: proof of holding a lock, and its release.

use std::sync::Arc;
use std::time::Duration;

use super::handoff::{self, GivingWay};
use crate::driver::detached::detachable;
use crate::driver::lease::{Lease, ThreadBound, lease_guard, leave_level, released};
use crate::error::Result;
use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::{Level, ReleaseReply};
use crate::shared::Shared;
use crate::shared::hold::Hold;
use crate::transport::conn::Deadline;

/// A held lock. Dropping it releases one level of the lock (the lock is free once the
/// outermost guard of the owning thread is gone); [`unlock`](MutexGuard::unlock) does the same
/// and reports errors.
///
/// While the guard lives, the client's renewal thread extends the lease (unless the lock was
/// made with a fixed lease, see [`Mutex::with_lease`]). A guard is a *lease*, not a
/// guarantee: if renewal fails for longer than the lease (Redis unreachable, the key deleted,
/// a failover that lost it), the lock may pass to another owner while this guard still exists.
/// [`is_held`](MutexGuard::is_held) turns false no later than that can happen; check it, or
/// better, pass the [`fencing_token`](MutexGuard::fencing_token) to the resource, before a
/// side effect that must not overlap another owner's.
///
/// A guard belongs to the thread that locked: its re-entry and its release are that thread's,
/// as with [`std::sync::MutexGuard`]. So it is not `Send`, but it is `Sync`: threads that
/// borrow it (scoped threads writing the parts of one job) may call
/// [`is_held`](MutexGuard::is_held), [`check`](MutexGuard::check),
/// [`fencing_token`](MutexGuard::fencing_token) and [`validity`](MutexGuard::validity). A
/// hold moves to another thread through [`detach`](MutexGuard::detach) (see
/// [`Detached`](crate::Detached)).
///
/// A guard owns what it needs (a clone of the cheap [`Mutex`](crate::Mutex) handle), so it
/// borrows nothing: a temporary handle is enough, and a function can return guards.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// use locksmith::{Client, MutexGuard};
///
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let _g = client.mutex("report:daily")?.lock()?; // the handle may go at once
///
/// // Takes both accounts in one fixed order (by name), so that two callers that name
/// // them in opposite orders cannot deadlock; `Client::multi_lock` does this for you.
/// fn lock_pair(client: &Client, a: &str, b: &str) -> locksmith::Result<[MutexGuard; 2]> {
///     let (first, second) = if a <= b { (a, b) } else { (b, a) };
///     let g1 = client.mutex(first)?.lock()?;
///     let g2 = client.mutex(second)?.lock()?;
///     Ok([g1, g2])
/// }
/// let _both = lock_pair(&client, "account:7", "account:3")?;
/// # Ok(()) }
/// ```
///
/// A guard cannot be sent to another thread, but it can be shared with one:
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<locksmith::MutexGuard>();
/// ```
///
/// ```
/// fn is_sync<T: Sync>() {}
/// is_sync::<locksmith::MutexGuard>();
/// is_sync::<locksmith::FairMutexGuard>();
/// is_sync::<locksmith::RwLockReadGuard>();
/// is_sync::<locksmith::RwLockWriteGuard>();
/// is_sync::<locksmith::MultiGuard>();
/// is_sync::<locksmith::SemaphorePermit>();
/// ```
///
/// [`Mutex::with_lease`]: crate::Mutex::with_lease
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    lease: Lease,
    _thread: ThreadBound,
}

lease_guard! { MutexGuard of super::Mutex, "lock", token;
    /// Releases this level of the lock and reports the outcome. The outermost guard of the
    /// owning thread frees the lock on the server, whatever re-entry count the server has (an
    /// inner release that failed, or a re-entry whose reply was lost, cannot keep it); an
    /// inner guard counts one level down and never frees it.
    ///
    /// It asks the server (unless the lock is handed to another thread of this client, see
    /// below), and so it is what tells a lock lost in a way no renewal has seen yet. Returns
    /// within the connect timeout plus the command timeout, whatever Redis does (a retry on a
    /// new connection, and the wait for a renewal on the wire, included). Dropping the guard
    /// does the same within the same bound.
    ///
    /// A release whose first attempt failed on the connection is retried on a new one; the
    /// first attempt may have run before its reply was lost. The retry reports `Ok` only
    /// where the server shows that the first attempt released the lock: a release moves the
    /// lock's value to a release marker key that lives as long as the lease had left, and the
    /// retry finds this acquisition's value there. Otherwise (Redis restarted empty, the lease
    /// ran out, or the marker expired) it reports the loss.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) when the lease had run out (or the key
    /// was deleted, or Redis lost it in a restart) and nobody holds the lock, and whenever the
    /// loss was known here first ([`is_held`](MutexGuard::is_held) false, `on_lease_lost`
    /// called), even if the server still had the key (it is freed all the same);
    /// [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds it now (it is left
    /// untouched); [`Error::Redis`](crate::Error::Redis) when Redis could not be asked: the lock
    /// then frees itself when its lease runs out, since renewal stopped. A lock handed to
    /// another thread of this client (see
    /// [`ClientBuilder::local_handoff`](crate::ClientBuilder::local_handoff)) is released
    /// without asking Redis, so this returns `Ok` then; a lease lost on the server
    /// meanwhile is found by the receiving thread's next renewal and reported as its loss.
}

impl MutexGuard {
    /// The fencing token of this acquisition: strictly increasing per lock name across all
    /// owners, the same for nested guards of one acquisition.
    ///
    /// Pass it to the resource the lock protects, and have the resource refuse a write whose
    /// token is lower than one it has seen: that keeps a holder that lost its lease (paused,
    /// partitioned, or behind a failover) from overwriting a newer owner's work.
    ///
    /// Tokens come from the server's clock and the fencing mark of the name's hash slot, by this
    /// rule:
    ///
    /// - An acquisition through Redis that finds the lock free gets the server's clock in
    ///   microseconds, or the highest token issued on the slot + 1 when that is as high already
    ///   (the server's clock went back), and leaves the mark reaching its last token. So tokens
    ///   strictly rise per name whatever the server's clock does, as long as the mark is kept.
    /// - It reserves the next tokens (16: the longest run of
    ///   [local hand-offs](crate::ClientBuilder::local_handoff) it may start)
    ///   for local hand-offs: each hand-off takes the next one. The mark covers the whole
    ///   block, so the next acquisition through Redis, anywhere, starts above it.
    /// - When the mark is lost (Redis restarted empty, a failover to a replica that had not
    ///   received it, `DEL`, `FLUSHALL`, eviction) the next token is the clock's again: above
    ///   every token issued before when more time passed since the last grant than any token
    ///   led the server's clock (at most 1024 µs plus
    ///   1 ms, unless the clock stepped back or a quorum's masters' clocks disagree). A restart
    ///   takes longer than that; a `DEL` of the mark between two grants a moment apart may
    ///   not (see `docs/key-layout.md`, "Tokens").
    ///
    /// With a quorum of masters ([`Client::redlock`](crate::Client::redlock)) releases and
    /// renewals also raise each master's mark to the holder's token. The other lock types of
    /// one name share the mark, so their tokens and the `Mutex`'s rise together.
    pub fn fencing_token(&self) -> u64 {
        self.lease.hold().token
    }

    /// Ends the hold no sooner than `min_hold` after it was acquired, for a job that must run
    /// once per period across instances (ShedLock's `lockAtLeastFor`): when `min_hold` has
    /// passed since the acquisition, it releases at once, as [`unlock`](MutexGuard::unlock);
    /// otherwise it stops renewing and sets the lock's lease on the server to end `min_hold`
    /// after the acquisition, so that a faster instance cannot take the lock, and run the same
    /// job again, before then. Nothing is published and the lock passes to no local waiter:
    /// others find it free when it expires (a waiter that saw a longer lease wakes then at the
    /// latest). An inner level (a re-entry) is released as `unlock` releases it.
    ///
    /// It asks the server once. Returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`unlock`](MutexGuard::unlock): [`Error::LeaseLost`](crate::Error::LeaseLost) when
    /// the lock was no longer held by this acquisition (the lease had run out, or another owner
    /// has it); [`Error::Timeout`](crate::Error::Timeout) or [`Error::Redis`](crate::Error::Redis)
    /// when the server could not be asked: the lease then ends by itself, at most one lease
    /// after the last renewal, since renewal stopped.
    pub fn unlock_after(self, min_hold: Duration) -> Result<()> {
        let hold = self.lease.hold();
        let left = min_hold.saturating_sub(hold.acquired.elapsed());
        if left.is_zero() || hold.depth() > 1 {
            return self.unlock();
        }
        self.lease.expire_after(left)
    }
}

/// Releases one level of `hold` within `by`: stops renewal first (for the outermost level),
/// then runs the owner- and acquisition-checked release script (the backend retries once, with
/// the same request id, where the
/// connection failed; the script recognises a retry, so a level is never released twice).
pub(crate) fn release(
    shared: &Arc<Shared>,
    keys: &LockKeys,
    hold: &Arc<Hold>,
    by: Deadline,
) -> Result<()> {
    // The outermost level, with threads of this client waiting: hand the lock to the first
    // of them, within the bound of a run of hand-offs, without a round trip.
    if handoff::pass(shared, hold) {
        return Ok(());
    }
    let (level, held) = leave_level(shared, hold, by);
    // Threads of this client queue for the lock, and it goes through Redis: other
    // processes' waiters get a head start (the message may arrive before the reply).
    let giving_way = match level {
        Level::Outermost => GivingWay::begin(shared, hold),
        Level::Inner => None,
    };
    // Threads of this client wait for the lock: their waits did not all begin with an
    // acquire that flagged it, so the release publishes for them (see `handoff.rs`).
    let publish = level == Level::Outermost && shared.subscriber.has_waiters(&keys.channel);
    let acquisition = (hold.acquisition.as_str(), hold.token);
    let reply = super::release::release(&shared.backend, keys, acquisition, level, publish, by);
    if let (
        Ok(ReleaseReply::Released {
            remaining: 0,
            listeners,
        }),
        Some(g),
    ) = (&reply, giving_way)
    {
        g.settle(*listeners);
    }
    released(shared, hold, held, &keys.lock, reply)
}

detachable!(MutexGuard);
