//! [`MultiMutex`]: several mutex locks taken at once, all or none, and its [`MultiGuard`].
//!
//! # How a set is taken
//!
//! The set is split into parts, one per Redis Cluster slot (one part on a single server or
//! through Sentinel), in one global order: by slot, then by name. Each part is taken by one
//! script (`multi_acquire.lua`) that looks at every lock of the part first and writes nothing
//! unless all of them can be had; then it takes them all. The locks are the very keys of
//! [`Mutex`](crate::Mutex) (same key, same fencing mark, same owner ids and re-entry rules),
//! so the two exclude each other name by name.
//!
//! A part that cannot be had names the lock that blocked it and that lock's remaining lease.
//! The caller then waits as a `Mutex` waiter of that lock does: in the lock's local queue (one
//! thread per lock name asks Redis at a time), asleep on its release channel until a release
//! or until the blocking lease has run out (a crashed holder publishes nothing), and tries the
//! whole part again. A waiter holds nothing of its part while it waits.
//!
//! # Why there is no deadlock
//!
//! A deadlock needs a cycle of callers, each holding a lock the next one waits for. With one
//! part (one server, Sentinel, or a cluster set within one slot) a waiting call holds nothing
//! of its set, so it is in no such cycle. Across cluster slots a call holds its earlier parts
//! while it waits for a later one; every call takes parts in the same global order (slot, then
//! name), so a caller only ever waits for a part above every part it holds, and a cycle would
//! need a part above itself. Whatever order the caller names the names in, the order of taking
//! is the global one.
//!
//! # Why every caller gets its set
//!
//! A holder's lease ends: by its release (which publishes), or by expiry at most one lease
//! (or the maximum hold time plus one lease) after its last renewal. So a lock that blocks a
//! waiter becomes free again within a bounded time, and the waiter is woken by exactly that
//! event (the release message, or the blocking lease's end) and tries again at once; it does
//! not sleep through a chance, and it never backs off on a timer. A failed attempt leaves
//! nothing behind, so waiters cannot block each other by trying (no livelock: two waiters that
//! both fail left no lock taken). Within one client the waiters of a lock queue in arrival
//! order. Between processes there is no queue (as with [`Mutex`](crate::Mutex)): a set is
//! taken the first time one attempt finds all its locks free, so under heavy contention the
//! wait is as for a `Mutex` on the busiest of its names, and the tests measure it.
//!
//! # Local hand-off
//!
//! A lock held through a set never passes locally to another thread: its acquisition
//! reserves no hand-off tokens, and its release goes through Redis. A set waiter that is
//! handed a lock by a `Mutex` holder of its own client (it leads that lock's local queue)
//! gives it back through Redis at once and tries its set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::calls::{eval_twice, twice};
use crate::driver::detached::{Detached, Guard, Parts};
use crate::driver::lease::{ThreadBound, leave_level, released};
use crate::driver::time::Budget;
use crate::driver::wait::Fired;
use crate::driver::{self, Attempt, Protocol, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::{self, LockKeys};
use crate::protocol::multi::{self, Leaving, Member, MultiReply};
use crate::protocol::scripts::{self, Holder, Level, Live};
use crate::shared::Core;
use crate::shared::config::validate_lease;
use crate::shared::grant::{Grant, Terms, request_id};
use crate::shared::hold::Hold;
use crate::stats::Held;
use crate::topology::backend::Primed;
use crate::transport::conn::Deadline;

/// Several named locks taken at once, all or none, without deadlock whatever order callers
/// name them in. Made by [`Client::multi_lock`](crate::Client::multi_lock).
///
/// Each name is the lock [`Client::mutex`](crate::Client::mutex) gives for it: a `Mutex` on
/// one name and a `MultiMutex` that includes it exclude each other, and a thread that holds
/// one of the names (through either) re-enters it as part of the set, with one owner per
/// thread as for `Mutex`.
///
/// | method | waits | returns |
/// |---|---|---|
/// | [`lock`](MultiMutex::lock) | until the whole set is held | `Result<MultiGuard>` |
/// | [`try_lock`](MultiMutex::try_lock) | no: one attempt | `Result<Option<MultiGuard>>` |
/// | [`try_lock_for`](MultiMutex::try_lock_for) | at most the given time | `Result<Option<MultiGuard>>` |
/// | [`try_lock_until`](MultiMutex::try_lock_until) | until the given instant | `Result<Option<MultiGuard>>` |
///
/// `None` means the set could not be had in time; the call then holds none of it.
///
/// # All or nothing
///
/// On one server and through Sentinel the whole set is taken by one script: it holds every
/// name, or it changed nothing, and no other owner ever sees the set half-taken. On a Redis
/// Cluster, names whose keys share a slot are taken by one script, and the slots one after
/// the other in one global order (by slot, then by name); a call that cannot have a later
/// slot's names releases the earlier ones before it returns, so it never *keeps* part of a
/// set, but another owner may see the earlier part held while the call waits.
///
/// # No deadlock, and progress
///
/// A waiting call holds nothing of its set on one server (and, on a cluster, only slots
/// below the one it waits for, taken in the one global order), so waiters never form a cycle.
/// A waiter sleeps on the release channel of the name that blocked it (no polling; the
/// blocking lease's end bounds the sleep, since a crashed holder publishes nothing) and tries
/// the whole set again the moment it is woken. A failed attempt leaves nothing taken, so
/// waiters do not hold each other up by trying. Every holder's lease ends (a release, or at
/// most one lease after its renewal stops), so each blocking name becomes free again and the
/// waiter is there when it does; within a client, waiters of a name queue in arrival order.
/// As with [`Mutex`](crate::Mutex), waiters of different processes are not queued: a set goes
/// to the first attempt that finds all its names free.
///
/// # Time bounds
///
/// As [`Mutex`](crate::Mutex)'s: [`try_lock`](MultiMutex::try_lock) within
/// `connect + command`, [`try_lock_for`](MultiMutex::try_lock_for)`(d)` within
/// `max(d, connect) + command`, [`lock`](MultiMutex::lock) retrying while Redis cannot be
/// reached for `max(retry_timeout, connect + command)`. On a cluster, the slots share that
/// bound, and giving back the slots already taken when a later one cannot be had takes up to
/// one `connect + command` more per slot.
///
/// # Topologies
///
/// One server, Sentinel and Cluster. A quorum client ([`Client::redlock`](crate::Client::redlock))
/// refuses a set with [`Error::Unsupported`]: each master would have to grant the *whole*
/// set, and a contended set is nearly always free on some masters and taken on others (each
/// master sees the releases of its names at other times), so a set would keep failing on
/// split votes and undoing grants on every master, under exactly the contention it exists
/// for. Take the names one by one with [`Mutex`](crate::Mutex) in one fixed order there.
///
/// Replica confirmation ([`wait_replicas`](crate::ClientBuilder::wait_replicas)) is not
/// asked for a set (as for the other lock types than `Mutex`).
///
/// # Local hand-off
///
/// Off for names held through a set: releasing a [`MultiGuard`] always goes through Redis and
/// publishes, and an acquisition through a set reserves no hand-off tokens.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// // Two transfers that name the accounts in opposite orders never deadlock.
/// let both = client.multi_lock(["account:7", "account:3"])?;
/// let guard = both.lock()?;
/// let from = guard.fencing_token("account:7"); // each name's own token
/// let to = guard.fencing_token("account:3");
/// // ... debit one, credit the other, each write fenced with its token ...
/// # let _ = (from, to);
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MultiMutex {
    client: Core,
    /// The parts in the global order: one per slot on a cluster, else one; each by name.
    parts: Arc<[Vec<Arc<LockKeys>>]>,
    /// A fixed lease for the names it acquires, never renewed; `None`: the client's lease,
    /// renewed while the guard lives.
    fixed_lease: Option<Duration>,
}

impl MultiMutex {
    /// A set of the names: duplicates collapse; at least one name, each as for
    /// [`Client::mutex`](crate::Client::mutex).
    pub(crate) fn new<I, S>(client: Core, names: I) -> Result<MultiMutex>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let prefix = client.shared().config.prefix.clone();
        let mut all: Vec<Arc<LockKeys>> = Vec::new();
        for name in names {
            let name = name.as_ref();
            keys::validate_name(name)?;
            all.push(Arc::new(LockKeys::new(&prefix, name)));
        }
        if all.is_empty() {
            return Err(Error::InvalidName {
                reason: "a set of locks needs at least one name",
            });
        }
        // The global order: by slot, then by name (bytes); every caller takes parts in it.
        all.sort_by(|a, b| (a.slot, &a.name).cmp(&(b.slot, &b.name)));
        all.dedup_by(|a, b| a.name == b.name);
        let spread = client.shared().backend.spreads_slots();
        let mut parts: Vec<Vec<Arc<LockKeys>>> = Vec::new();
        for k in all {
            match parts.last_mut() {
                Some(p) if !spread || p[0].slot == k.slot => p.push(k),
                _ => parts.push(vec![k]),
            }
        }
        Ok(MultiMutex {
            client,
            parts: parts.into(),
            fixed_lease: None,
        })
    }

    /// The same set with a fixed lease: never renewed, so each name it acquires frees itself
    /// `lease` after the acquisition even if its holder is still working. Use it for work
    /// with a known bound, where a stuck holder must not keep the locks.
    ///
    /// The lease is that of new acquisitions. A thread that already holds one of the names
    /// re-enters its acquisition and keeps that acquisition's terms, through whatever handle
    /// (a [`Mutex`](crate::Mutex) or a set): a re-entry never shortens the lease on the
    /// server, and never extends a fixed lease. So the names of one set may end at different
    /// times: [`MultiGuard::validity`] is the shortest.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `lease` is under 30 ms or over 365 days.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// use std::time::Duration;
    ///
    /// let pair = client
    ///     .multi_lock(["account:7", "account:3"])?
    ///     .with_lease(Duration::from_secs(10))?;
    /// let guard = pair.lock()?; // both free again 10 s from now at the latest
    /// // ... the transfer ...
    /// guard.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<MultiMutex> {
        validate_lease(lease)?;
        Ok(MultiMutex {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// The terms of this handle's new acquisitions.
    fn terms(&self) -> Terms {
        self.client.terms_with(self.fixed_lease)
    }

    /// The names of the set, without duplicates, in the order they are taken (by Redis
    /// Cluster slot, then by name).
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let names: Vec<&str> = self
            .parts
            .iter()
            .flatten()
            .map(|k| k.name.as_str())
            .collect();
        names.into_iter()
    }

    timed_forms! { guard: MultiGuard, call: acquire, fails: "lock() ended without the set";
        /// Blocks until the calling thread holds every name of the set.
        ///
        /// While another owner holds one of the names, this waits (holding none of the set on
        /// one server).
        fn lock, errors {
        /// [`Error::ForeignKey`] when a name's key holds something else;
        /// [`Error::Unsupported`] on a quorum client. The call then holds none of the set.
        }
        /// Makes exactly one attempt (one per slot on a cluster). `Ok(None)` when another owner
        /// holds one of the names; the call then holds none of them.
        fn try_lock;
        /// Waits at most `timeout` for the whole set. `Ok(None)` when it could not be had in
        /// time; the call then holds none of it.
        fn try_lock_for;
        /// Waits until `deadline` at most for the whole set. `Ok(None)` when it could not be had
        /// in time; the call then holds none of it.
        fn try_lock_until;
        /// Runs `f` while holding the whole set, then releases it, and returns what `f` returned:
        /// [`lock`](MultiMutex::lock), `f(&guard)`, [`unlock`](MultiGuard::unlock). The same as
        /// [`Mutex::with_lock`](crate::Mutex::with_lock): a panic in `f` releases the set as the
        /// guard is dropped.
        ///
        /// # Errors
        ///
        /// As [`lock`](MultiMutex::lock), and `f` is not called; as
        /// [`unlock`](MultiGuard::unlock) when the release fails after `f` ran (the lease of one
        /// of the names lost while `f` ran: [`Error::LeaseLost`], [`Error::NotOwner`]): `f`'s
        /// value is then dropped and the error returned in its place.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let pair = client.multi_lock(["account:7", "account:3"])?;
        /// pair.with_lock(|guard| {
        ///     let from = guard.fencing_token("account:7");
        ///     let to = guard.fencing_token("account:3");
        ///     // ... write both balances in one transaction, each write fenced with its token ...
        /// #   let _ = (from, to);
        /// })?;
        /// # Ok(()) }
        /// ```
        fn with_lock;
    }

    /// Takes the parts in order, each through the driver (see `driver/mod.rs`); gives back
    /// what was taken when a later part cannot be had. Counted in the client's
    /// [`Stats`](crate::Stats) under the names joined by `,`.
    fn acquire(&self, deadline: Deadline) -> Result<Option<MultiGuard>> {
        let names = self.names().collect::<Vec<_>>().join(",");
        driver::counted(&self.client, Kind::MultiMutex, &names, deadline, || {
            self.acquire_parts(&names, deadline)
        })
    }

    fn acquire_parts(&self, names: &str, deadline: Deadline) -> Result<Option<MultiGuard>> {
        let shared = self.client.shared();
        if shared.backend.masters() > 1 {
            return Err(Error::unsupported(
                "a set of locks needs a client on one Redis server, Sentinel or a Cluster, \
                 not a quorum of masters",
            ));
        }
        let owner = shared.owner();
        let budget = Budget::new(shared, deadline);
        let mut holds: Vec<Arc<Hold>> = Vec::new();
        for part in self.parts.iter() {
            let mut call = Part {
                set: self,
                part,
                owner: &owner,
                request: request_id(),
                blocked: 0,
            };
            match driver::drive(&mut call, &budget) {
                Ok(Some(h)) => holds.extend(h),
                other => {
                    // The parts taken before go back (none before the first part).
                    let by = Deadline::after(shared.config.one_call());
                    if let Err(e) = release_holds(&self.client, &holds, by) {
                        log::debug!("giving back part of a set of locks: {e}");
                    }
                    return other.map(|_| None);
                }
            }
        }
        Ok(Some(MultiGuard {
            set: HeldSet {
                _held: shared.stats.held(Kind::MultiMutex, names),
                client: self.client.clone(),
                holds,
                released: false,
            },
            _thread: std::marker::PhantomData,
        }))
    }
}

/// One acquire call of a part of a set (its locks in one slot): it waits as a `Mutex` waiter
/// of the lock that blocked it last does.
struct Part<'a> {
    set: &'a MultiMutex,
    part: &'a [Arc<LockKeys>],
    owner: &'a str,
    request: String,
    /// The lock that blocked the part last.
    blocked: usize,
}

impl<'a> Part<'a> {
    /// The part's members: their keys and owners, and `live` holds (a re-entry).
    fn members<'m>(&self, live: &'m [Option<Arc<Hold>>], sent: Instant) -> Vec<Member<'m>>
    where
        'a: 'm,
    {
        let (part, owner) = (self.part, self.owner);
        part.iter()
            .zip(live)
            .map(|(keys, h)| Member {
                keys,
                // A re-entry speaks for the owner on the server (after a local hand-off, the
                // thread that took the lock through Redis).
                owner: h.as_ref().map_or(owner, |h| h.owner.as_str()),
                live: h.as_ref().map(|h| Live {
                    acquisition: &h.acquisition,
                    extend: h.reentry_extension(sent),
                }),
            })
            .collect()
    }

    /// Frees acquisition `acquisition` of `owner` of the lock `keys`, which no hold of this
    /// thread may use (see [`Shared::adopt_as`](crate::shared::Shared::adopt_as)), within `by`.
    fn free_unusable(&self, keys: &LockKeys, owner: &str, acquisition: &str, by: Deadline) {
        let leaving = [Leaving {
            keys,
            holder: Holder { owner, acquisition },
            level: Level::Outermost,
            publish: false,
        }];
        let call = multi::release(&leaving, &request_id(), false);
        if let Err(e) = eval_twice(&self.set.client, &call, by) {
            log::debug!("freeing an unusable grant of `{}`: {e}", keys.name);
        }
    }

    /// What a set acquire's reply `v` means, for the part's `members` (with the caller's
    /// `live` holds; the call was written at `sent`): the holds, or the lock that blocks the
    /// part (its waiter then waits for that lock). A grant that cannot be used is given back
    /// within `by`.
    fn settle(
        &mut self,
        members: &[Member<'_>],
        live: &[Option<Arc<Hold>>],
        v: &redis::Value,
        sent: Instant,
        by: Deadline,
    ) -> Result<Attempt<Vec<Arc<Hold>>>> {
        let (set, part) = (self.set, self.part);
        let shared = set.client.shared();
        let terms = set.terms();
        let reply = multi::parse_acquire(v, part.len())
            .ok_or_else(|| scripts::unexpected("multi_acquire", v))?;
        let granted = match reply {
            MultiReply::Busy { index, ttl } => {
                // Another owner holds a lock this thread thought it held: that hold is lost.
                if let Some(h) = &live[index] {
                    shared.report_lost(h);
                }
                self.blocked = index;
                return Ok(Attempt::busy(ttl));
            }
            MultiReply::Foreign { index } => {
                return Err(Error::ForeignKey {
                    key: part[index].lock.clone(),
                });
            }
            MultiReply::Held(granted) => granted,
        };
        let mut holds = Vec::with_capacity(part.len());
        let mut unusable: Vec<(usize, String)> = Vec::new();
        for (i, (token, count, acquisition)) in granted.iter().enumerate() {
            let grant = Grant {
                token: *token,
                count: *count,
                sent,
                acquisition,
                last: *token,
            };
            let who = members[i].owner.to_owned();
            match shared.adopt_as(Kind::Mutex, &part[i], who, grant, terms) {
                Some(h) => holds.push(h),
                None => unusable.push((i, acquisition.clone())),
            }
        }
        if unusable.is_empty() && holds.iter().all(|h| h.is_held()) {
            return Ok(Attempt::Held(holds));
        }
        // Part of the grant cannot be used (an acquisition this thread counts as lost, or a
        // reply so late that a lease may have run out): give back every level this attempt
        // took, and try again at once.
        if let Err(e) = release_holds(&set.client, &holds, by) {
            log::debug!("giving back a late set acquisition: {e}");
        }
        for (i, acquisition) in unusable {
            self.free_unusable(&part[i], members[i].owner, &acquisition, by);
        }
        self.blocked = 0;
        Ok(Attempt::busy(Duration::ZERO))
    }
}

impl<'a> Protocol<'a> for Part<'a> {
    type Held = Vec<Arc<Hold>>;

    /// The part is called by its first lock's name.
    fn lock(&self) -> (&'a Core, &'a LockKeys) {
        (&self.set.client, &self.part[0])
    }

    fn channel(&self) -> &'a str {
        &self.part[self.blocked].channel
    }

    /// Threads of this client that queue for one of the names go first, unless this thread
    /// holds one of them: waiting behind threads that wait for its own lock would never end.
    fn defers(&self) -> bool {
        let shared = self.set.client.shared();
        let queued = self
            .part
            .iter()
            .any(|k| shared.subscriber.has_waiters(&k.channel));
        queued && !self.part.iter().any(|k| shared.live_hold(k).is_some())
    }

    /// One set acquire round trip for the part (retried once on a new connection when the
    /// connection failed, with the same request id), within `by` and one call's bound.
    fn attempt(&mut self, _waiting: bool, by: Deadline) -> Result<Attempt<Vec<Arc<Hold>>>> {
        let set = self.set;
        let shared = set.client.shared();
        let sent = Instant::now();
        let live: Vec<Option<Arc<Hold>>> = self.part.iter().map(|k| shared.live_hold(k)).collect();
        let members = self.members(&live, sent);
        let call = multi::acquire(&members, self.set.terms().lease, &self.request);
        let v = eval_twice(&set.client, &call, by)?;
        self.settle(&members, &live, &v, sent, by)
    }

    /// Only on a single plain master, for a thread without a live hold of any of the part's
    /// locks, when an idle pooled connection is at hand.
    fn prime(&mut self, _by: Deadline) -> Option<Primed> {
        let shared = self.set.client.shared();
        if self.part.iter().any(|k| shared.live_hold(k).is_some()) {
            return None;
        }
        let live = vec![None; self.part.len()];
        let members = self.members(&live, Instant::now());
        let call = multi::acquire(&members, self.set.terms().lease, &self.request);
        shared.backend.prime_script(&call)
    }

    fn fired(&mut self, fired: Fired, by: Deadline) -> Result<Attempt<Vec<Arc<Hold>>>> {
        let sent = fired.sent;
        let v = fired.reply(&self.set.client.shared().backend, by)?;
        let live = vec![None; self.part.len()];
        let members = self.members(&live, sent);
        self.settle(&members, &live, &v, sent, by)
    }
}

/// Releases one level of each hold within `by`: renewal stops first for an outermost level,
/// then one script per slot. Returns the first error; every lock is released all the same.
fn release_holds(core: &Core, holds: &[Arc<Hold>], by: Deadline) -> Result<()> {
    let shared = core.shared();
    let levels: Vec<(&Arc<Hold>, Level, bool)> = (holds.iter())
        .map(|h| {
            let (level, held) = leave_level(shared, h, by);
            (h, level, held)
        })
        .collect();
    let spread = shared.backend.spreads_slots();
    let mut first: Option<Error> = None;
    for slot in levels.chunk_by(|(a, ..), (b, ..)| !spread || a.keys.slot == b.keys.slot) {
        if let Err(e) = release_part(core, slot, by) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Releases one level of each lock of one slot in one script call (retried once on a new
/// connection, with the same request id).
fn release_part(core: &Core, levels: &[(&Arc<Hold>, Level, bool)], by: Deadline) -> Result<()> {
    let shared = core.shared();
    let leaving: Vec<Leaving<'_>> = levels
        .iter()
        .map(|(h, level, _)| Leaving {
            keys: &h.keys,
            holder: h.holder(),
            level: *level,
            // Threads of this client wait for the lock: their waits did not all begin with an
            // acquire that flagged it, so its release publishes for them.
            publish: *level == Level::Outermost && shared.subscriber.has_waiters(&h.keys.channel),
        })
        .collect();
    let request = request_id();
    // The first attempt may have released before its reply was lost, or never ran (Redis
    // restarted empty): the retry asks the script to tell them apart by each lock's release
    // marker, and what it cannot tell is a loss.
    let mut retry = false;
    let reply = twice(core, by, |by| {
        let call = multi::release(&leaving, &request, std::mem::replace(&mut retry, true));
        shared.backend.eval_single(&call, by)
    });
    let v = match reply {
        Ok(v) => v,
        // Redis could not be asked, but every lease was known lost already: that is the news.
        Err(e) if levels.iter().all(|(.., held)| !held) => {
            log::debug!("release of a lost set failed: {e}");
            return Err(Error::LeaseLost);
        }
        Err(e) => return Err(e),
    };
    let replies = multi::parse_release(&v, levels.len())
        .ok_or_else(|| scripts::unexpected("multi_release", &v))?;
    let mut first = None;
    for ((h, _, held), reply) in levels.iter().zip(replies) {
        if let Err(e) = released(shared, h, *held, &h.keys.lock, Ok(reply)) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// A held set of locks. Dropping it releases one level of every name (each name is free once
/// the outermost guard of the owning thread is gone, as with [`MutexGuard`](crate::MutexGuard));
/// [`unlock`](MultiGuard::unlock) does the same and reports errors.
///
/// The renewal thread renews every name's lease (in its batches) while the guard lives
/// (unless the set was made with a fixed lease, see [`MultiMutex::with_lease`]). A
/// loss of any name is reported (the `warn` log and
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost), once per name), and a guard with
/// one lost name is not held: check [`is_held`](MultiGuard::is_held) or
/// [`check`](MultiGuard::check), and better, pass each name's
/// [`fencing_token`](MultiGuard::fencing_token) to the resource.
///
/// A guard belongs to the thread that locked (its re-entry and release are that thread's): it
/// is `Sync` but not `Send`, and a hold moves to another thread through `detach` (see
/// [`MutexGuard`](crate::MutexGuard) and [`Detached`]).
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    set: HeldSet,
    _thread: ThreadBound,
}

/// The holds of a set, one per name in the set's order, released once: by `unlock`, or when
/// dropped. What a [`MultiGuard`] holds, and what it is while detached.
#[derive(Debug)]
pub struct HeldSet {
    client: Core,
    holds: Vec<Arc<Hold>>,
    /// Set once released (by `unlock`), so `Drop` does nothing.
    released: bool,
    /// Counts the set as held until it ends (see [`Stats`](crate::Stats)).
    _held: Held,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("names", &self.names().collect::<Vec<_>>())
            .field("is_held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl MultiGuard {
    /// The fencing token of `name`'s acquisition: strictly increasing per name across all
    /// owners (the same rule as [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token)),
    /// the same for a name this thread already held and re-entered. `None` when `name` is
    /// not in the set.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.set
            .holds
            .iter()
            .find(|h| h.keys.name == name)
            .map(|h| h.token)
    }

    /// The names held, in the order they were taken (by Redis Cluster slot, then by name).
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.set.holds.iter().map(|h| h.keys.name.as_str())
    }

    /// True while every name's lease is known to be valid: false once any one was lost,
    /// released, or passed its local deadline without a successful renewal.
    pub fn is_held(&self) -> bool {
        self.set.is_held()
    }

    /// Checks that every name's lease is still valid, for use right before a side effect.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when [`is_held`](MultiGuard::is_held) is false.
    pub fn check(&self) -> Result<()> {
        self.set.check()
    }

    /// How much longer every lease is known to be valid: the smallest of the names' (zero
    /// once one is lost).
    pub fn validity(&self) -> Duration {
        self.set
            .holds
            .iter()
            .map(|h| h.validity())
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Releases one level of every name and reports the outcome: one script call (one per
    /// slot on a cluster), through Redis.
    ///
    /// Returns within the connect timeout plus the command timeout (per slot on a cluster),
    /// whatever Redis does. Dropping the guard does the same within the same bound.
    ///
    /// # Errors
    ///
    /// The first of: [`Error::LeaseLost`] when a name's lease had run out;
    /// [`Error::NotOwner`] when another owner holds a name now (it is left untouched);
    /// [`Error::Redis`] when Redis could not be asked (the locks then free themselves when
    /// their leases run out, since renewal stopped). Every other name is released all the
    /// same.
    pub fn unlock(self) -> Result<()> {
        self.set.unlock()
    }

    /// Lets the calling thread go of the set, so that another thread can take it over: a
    /// [`Detached`] hold, `Send + 'static`, which any thread may
    /// [`attach`](Detached::attach) (becoming its owner), [`unlock`](Detached::unlock) or
    /// drop. Every name's lease keeps being renewed. No I/O.
    ///
    /// # Errors
    ///
    /// Gives the guard back, unchanged, where the set cannot move: one of its names is
    /// re-entered (this thread holds more than one level of it).
    pub fn detach(self) -> std::result::Result<Detached<MultiGuard>, MultiGuard> {
        if self.set.holds.iter().any(|h| h.depth() != 1) {
            return Err(self);
        }
        let shared = self.set.client.shared();
        for h in &self.set.holds {
            shared.passed_on(h);
        }
        Ok(Detached::new(self.set))
    }
}

impl Guard for MultiGuard {
    type Parts = HeldSet;

    fn attach(set: HeldSet) -> Result<MultiGuard> {
        let shared = set.client.shared();
        // The holds are attached in order, up to the first that cannot be.
        let attached = set.holds.iter().take_while(|h| shared.attach(h)).count();
        if attached < set.holds.len() {
            for h in &set.holds[..attached] {
                shared.passed_on(h);
            }
            // The set is released as a dropped `Detached` would be.
            return Err(Error::misuse(
                "attach: the calling thread holds a name of this set already, through another \
                 guard",
            ));
        }
        Ok(MultiGuard {
            set,
            _thread: std::marker::PhantomData,
        })
    }
}

impl Parts for HeldSet {
    fn is_held(&self) -> bool {
        !self.released && self.holds.iter().all(|h| h.is_held())
    }

    /// A set is never checked once released (`unlock` takes it, `Drop` ends it).
    fn check(&self) -> Result<()> {
        self.holds.iter().try_for_each(|h| h.check())
    }

    fn unlock(mut self) -> Result<()> {
        self.release()
    }
}

impl HeldSet {
    /// Releases one level of every name, once, within the bound of a release.
    fn release(&mut self) -> Result<()> {
        self.released = true;
        // After a shutdown, which released the set: nothing to do.
        self.client.shared().ensure_open()?;
        let by = Deadline::after(self.client.shared().config.one_call());
        release_holds(&self.client, &self.holds, by)
    }
}

impl Drop for HeldSet {
    fn drop(&mut self) {
        if self.released || self.client.shared().is_shut_down() {
            return;
        }
        if let Err(e) = self.release() {
            let names: Vec<&str> = self.holds.iter().map(|h| h.keys.name.as_str()).collect();
            log::warn!("releasing the set {names:?} on drop failed: {e}");
        }
    }
}
