//! [`Mutex`]: a named distributed lock, and its protocol under the waiting driver (an
//! attempt, the primed attempt, and a lock handed over by a thread of this client), which is
//! also an election's campaign.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::calls::twice;
use crate::driver::lease::{Release, unless_late};
use crate::driver::wait::Fired;
use crate::driver::{self, Attempt, Protocol, Queue, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::protocol::lock_value;
use crate::protocol::mutex::{self, AdminReply};
use crate::protocol::scripts::{self, AcquireReply, Admin, Level, Live};
use crate::shared::Core;
use crate::shared::config::{validate_lease, validate_max_hold};
use crate::shared::grant::{Grant, Terms, request_id};
use crate::shared::hold::Hold;
use crate::shared::holder::Holder;
use crate::subscriber::{Passed, Registration};
use crate::topology::backend::Primed;
use crate::topology::quorum;
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;
use acquire::{AcquireCall, Acquired};
use guard::MutexGuard;

mod acquire;
pub(crate) mod election;
pub(crate) mod guard;
pub(crate) mod handoff;
pub(crate) mod release;

/// A distributed, reentrant lock on a name, shared by every process that uses the same Redis
/// and key prefix.
///
/// A `Mutex` is a cheap handle (`Clone + Send + Sync`): it holds the lock's key names and a
/// clone of its [`Client`]. Locking returns a [`MutexGuard`]; the lock is held until the
/// outermost guard of the owning thread is dropped or [`unlock`](MutexGuard::unlock)ed.
///
/// | method | waits | returns |
/// |---|---|---|
/// | [`lock`](Mutex::lock) | until held | `Result<MutexGuard>` |
/// | [`try_lock`](Mutex::try_lock) | no: one attempt | `Result<Option<MutexGuard>>` |
/// | [`try_lock_for`](Mutex::try_lock_for) | at most the given time | `Result<Option<MutexGuard>>` |
/// | [`try_lock_until`](Mutex::try_lock_until) | until the given instant | `Result<Option<MutexGuard>>` |
///
/// `None` means another owner held the lock throughout; `Err` means Redis could not be asked
/// or answered with an error.
///
/// # Ownership and re-entry
///
/// The owner of a lock is one thread of one [`Client`]. The owning thread may lock it again
/// and gets a nested guard with the same fencing token; other threads, of this client or any
/// other, wait until the outermost guard goes. A re-entry keeps the terms (lease, renewal,
/// maximum hold time) of the acquisition it enters, through whichever handle it came. A
/// re-entry that finds the acquisition gone from the server (the key expired or was deleted)
/// marks the outer guards lost at once and gets a new acquisition, with a new token (or
/// `None`, or a wait, when another owner has the lock).
///
/// # Waiting
///
/// Waiting threads do not poll: they sleep until the lock's release channel says it was
/// released, bounded by the remaining lease of the holder (a crashed holder publishes
/// nothing). Within one client, only one thread per lock name asks Redis at a time; the others
/// queue locally in arrival order.
///
/// # Local hand-off
///
/// With [`local_handoff`](crate::ClientBuilder::local_handoff) on (the default), a release
/// while threads of the same client queue for the lock hands it to the first of them without
/// a round trip, up to a bounded run of hand-offs; then the release goes through Redis so that
/// other processes' waiters can win it. The receiving thread's guard is as from Redis: the
/// next fencing token, its own lease deadline, renewal, re-entry and maximum hold time. Locks
/// with a fixed lease ([`with_lease`](Mutex::with_lease)) always release through Redis, and a
/// hand-off goes only to a thread asking for the same terms (the client's lease, renewed).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// use std::time::Duration;
///
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let stock = client.mutex("stock:sku-1234")?;
/// if let Some(guard) = stock.try_lock_for(Duration::from_millis(500))? {
///     // ... read the count, check it, write it back ...
///     guard.unlock()?;
/// }
/// # Ok(()) }
/// ```
///
/// [`Client`]: crate::Client
#[derive(Debug, Clone)]
pub struct Mutex {
    client: Core,
    keys: Arc<LockKeys>,
    /// A fixed lease, never renewed (the lock frees itself when it runs out); `None`: the
    /// client's lease, renewed by the renewal thread while the guard lives.
    fixed_lease: Option<Duration>,
    /// Overrides the client's maximum hold time.
    max_hold: Option<Duration>,
    /// What its holds are: a mutex's, or an election's leadership (see `election.rs`).
    kind: Kind,
}

impl Mutex {
    pub(crate) fn new(client: Core, keys: Arc<LockKeys>) -> Self {
        Mutex {
            client,
            keys,
            fixed_lease: None,
            max_hold: None,
            kind: Kind::Mutex,
        }
    }

    /// The same lock with a maximum hold time: renewal stops `max` after each acquisition,
    /// so the lock frees itself at most one lease later even if its holder is stuck. Overrides
    /// the client's [`max_hold`](crate::ClientBuilder::max_hold).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `max` is under 30 ms.
    ///
    /// Like [`with_lease`](Mutex::with_lease), it sets the terms of new acquisitions only: a
    /// re-entry keeps the terms of the acquisition it enters.
    pub fn with_max_hold(&self, max: Duration) -> Result<Mutex> {
        validate_max_hold(max)?;
        Ok(Mutex {
            max_hold: Some(max),
            ..self.clone()
        })
    }

    /// The same lock with a fixed lease: never renewed, so the lock frees itself `lease` after
    /// each acquisition even if its holder is still working. Use it for work with a known
    /// bound, where a stuck holder must not keep the lock.
    ///
    /// The lease is that of new acquisitions. A thread that already holds the lock re-enters
    /// its acquisition and keeps that acquisition's terms, through whatever handle: a re-entry
    /// never shortens the lease on the server, and never extends a fixed lease.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `lease` is under 30 ms or over 365 days.
    pub fn with_lease(&self, lease: Duration) -> Result<Mutex> {
        validate_lease(lease)?;
        Ok(Mutex {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Whether anyone (any process, any thread) holds the lock right now.
    ///
    /// Asks the server. Returns within the connect timeout plus the command timeout; a pooled
    /// connection that died (Redis restarted) is retried at once on a new one, within that
    /// bound.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked.
    pub fn is_locked(&self) -> Result<bool> {
        let shared = self.client.shared();
        shared.ensure_open()?;
        let by = Deadline::after(shared.config.one_call());
        // Its key is there; a key of another type counts as held, since no acquire can take
        // the lock while it is there.
        let mut cmd = redis::cmd("GETRANGE");
        cmd.arg(&self.keys.lock).arg(0).arg(0);
        shared.backend.quorum_says(&cmd, by, |r| match r {
            Ok(redis::Value::BulkString(b)) => Some(!b.is_empty()),
            Ok(redis::Value::SimpleString(s)) => Some(!s.is_empty()),
            Ok(_) => Some(false),
            // WRONGTYPE: a key, not a string.
            Err(Fault::Redis(e)) if e.code() == Some("WRONGTYPE") => Some(true),
            Err(_) => None,
        })
    }

    /// Who holds the lock now, as the server tells it: the holding client's label and thread,
    /// its re-entry depth, fencing token, how long it has held the lock and how much lease
    /// it has left (both by the server's clock). `None` when nobody holds it.
    ///
    /// Asks the server once (on a quorum of masters, every master at once: the holder a
    /// majority agrees on). Returns within the connect timeout plus
    /// the command timeout, a dead pooled connection retried at once on a new one within that
    /// bound.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked (with a quorum: when fewer than a majority
    /// answered); [`Error::NoQuorum`] on a quorum client when masters name a holder but no
    /// majority names the same one (the masters disagree: a split vote, or an acquisition or
    /// release half done; it settles within a lease); [`Error::ForeignKey`] when the lock's
    /// key holds something else.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// if let Some(h) = client.mutex("report:daily")?.holder()? {
    ///     println!("held by {} ({}) for {:?}", h.label, h.thread, h.held_for);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Result<Option<Holder>> {
        let by = Deadline::after(self.client.shared().config.one_call());
        let call = mutex::admin(&self.keys, Admin::Holder);
        let read = |v: &redis::Value| {
            Ok(self
                .admin_reply(v)?
                .map(|(acquisition, h)| (acquisition, h, ())))
        };
        Ok(self.agreed_holder(&call, by, read)?.map(|(_, h, ())| h))
    }

    /// Frees the lock on the server whoever holds it, and wakes its waiters. Returns whether
    /// anyone held it. For an operator: a holder that is stuck, or gone without its lease
    /// running out soon enough.
    ///
    /// The holder is not asked: it finds out at its next renewal at the latest (a third of
    /// its lease), when [`MutexGuard::is_held`] turns false and the loss is reported (the `warn`
    /// log, [`on_lease_lost`](crate::ClientBuilder::on_lease_lost)); its
    /// [`unlock`](MutexGuard::unlock) then reports the loss, never `Ok`. Until then it may
    /// still believe it holds the lock, so the resource must check the
    /// [`fencing_token`](MutexGuard::fencing_token): the next holder's token is above every
    /// token the dispossessed holder has or may still hand to its own threads. Logged at
    /// `warn`, naming the holder removed.
    ///
    /// Returns within the connect timeout plus the command timeout (with a quorum of masters,
    /// every master is asked at once; `true` when any of them held it).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked (with a quorum: when no master answered
    /// and none freed it); [`Error::ForeignKey`] when the lock's key holds something else
    /// (it is left untouched).
    pub fn force_unlock(&self) -> Result<bool> {
        let shared = self.client.shared();
        shared.ensure_open()?;
        let by = Deadline::after(shared.config.one_call());
        let call = mutex::admin(&self.keys, Admin::Force);
        let mut told: Vec<String> = Vec::new();
        let t = quorum::tally(shared.backend.eval_each(&call, by), |v| {
            let found = self.admin_reply(&v)?;
            if let Some((acquisition, h)) = &found
                && !told.contains(acquisition)
            {
                log::warn!(
                    "lock `{}` was freed by force: it was held by {} (thread {}, fencing \
                     token {}, {} level(s), for {:?})",
                    self.keys.name,
                    if h.label.is_empty() { "?" } else { &h.label },
                    h.thread,
                    h.fencing_token,
                    h.hold_count,
                    h.held_for
                );
                told.push(acquisition.clone());
            }
            Ok(found.is_some())
        })?;
        // Any master that answered (freeing the lock or not) tells.
        Ok(t.need(1)?.contains(&true))
    }

    /// The holder a quorum of masters agrees on (with one master, the one there), from `call`
    /// run on each within `by`, whose reply `read` turns into the holder's acquisition, the
    /// holder, and what else the call read (`X`, taken from a master that agrees).
    fn agreed_holder<X>(
        &self,
        call: &scripts::Call,
        by: Deadline,
        read: impl Fn(&redis::Value) -> Result<Option<(String, Holder, X)>>,
    ) -> Result<Option<(String, Holder, X)>> {
        self.client.shared().ensure_open()?;
        let backend = &self.client.shared().backend;
        let answers = quorum::tally(backend.eval_each(call, by), |v| read(&v))?;
        let seen = answers
            .need(backend.quorum())?
            .into_iter()
            .flatten()
            .collect();
        agree(seen, backend.quorum())
    }

    fn admin_reply(&self, v: &redis::Value) -> Result<Option<(String, Holder)>> {
        let reply = mutex::parse_admin(v).ok_or_else(|| scripts::unexpected("mutex_admin", v))?;
        self.admin_holder(reply)
    }

    /// The holder an admin reading names: its acquisition and what it shows.
    fn admin_holder(&self, reply: AdminReply) -> Result<Option<(String, Holder)>> {
        let foreign = || Error::ForeignKey {
            key: self.keys.lock.clone(),
        };
        match reply {
            AdminReply::Free => Ok(None),
            AdminReply::Foreign => Err(foreign()),
            AdminReply::Held {
                value,
                pttl,
                now_us,
            } => {
                let Some(h) = lock_value::parse(&value) else {
                    return Err(foreign());
                };
                let held_for = Duration::from_micros(now_us.saturating_sub(h.granted));
                let count = u32::try_from(h.count).unwrap_or(u32::MAX);
                let holder = Holder::new(&h.owner, count, h.token, held_for, pttl);
                Ok(Some((h.acquisition, holder)))
            }
        }
    }

    timed_forms! { guard: MutexGuard, call: acquire, fails: "lock() ended without the lock";
        /// Blocks until the lock is held by the calling thread.
        ///
        /// While another owner holds the lock, this waits.
        fn lock, errors {
        /// [`Error::ForeignKey`] when the lock's key holds something else.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let lock = client.mutex("report:daily")?;
        /// let _guard = lock.lock()?;
        /// // held until `_guard` goes out of scope
        /// # Ok(()) }
        /// ```
        }
        /// Makes exactly one attempt. `Ok(None)` when another owner holds the lock.
        fn try_lock;
        /// Waits at most `timeout` for the lock. `Ok(None)` when another owner held it
        /// throughout. A zero timeout makes exactly one attempt, like
        /// [`try_lock`](Mutex::try_lock); a timeout too large to represent waits without a
        /// deadline.
        fn try_lock_for;
        /// Waits until `deadline` at most for the lock. `Ok(None)` when another owner held it
        /// throughout.
        fn try_lock_until;
        /// Runs `f` while holding the lock, then releases it, and returns what `f` returned:
        /// [`lock`](Mutex::lock), `f(&guard)`, [`unlock`](MutexGuard::unlock).
        ///
        /// It waits for the lock as [`lock`](Mutex::lock) does (until held; while Redis cannot be
        /// reached, it retries within the client's
        /// [`retry_timeout`](crate::ClientBuilder::retry_timeout)), and the release takes at most
        /// the connect timeout plus the command timeout. `f` gets the guard by reference: it may
        /// read its [`fencing_token`](MutexGuard::fencing_token) and [`check`](MutexGuard::check)
        /// it, and lock the same lock again (a re-entry, as with `lock`).
        ///
        /// If `f` panics, the guard is dropped while the panic unwinds, which releases the lock as
        /// dropping any guard does, and the panic goes on.
        ///
        /// # Errors
        ///
        /// As [`lock`](Mutex::lock), and `f` is not called. As [`unlock`](MutexGuard::unlock)
        /// when the release fails after `f` ran: most often [`Error::LeaseLost`] or
        /// [`Error::NotOwner`], the lease ended while `f` ran, so what `f` did may have overlapped
        /// another owner's work. `f`'s value is then dropped and the error returned in its place;
        /// call `lock` and `unlock` yourself to keep the value whatever the release says.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let stock = client.mutex("stock:sku-1234")?;
        /// let token = stock.with_lock(|guard| {
        ///     // ... read the count, check it, write it back fenced with the token ...
        ///     guard.fencing_token()
        /// })?; // released here; an Err if the lease was lost meanwhile
        /// # let _ = token;
        /// # Ok(()) }
        /// ```
        fn with_lock;
    }

    /// The terms of this handle's new acquisitions.
    fn terms(&self) -> Terms {
        let terms = self.client.terms_with(self.fixed_lease);
        Terms {
            max_hold: self.max_hold.or(terms.max_hold),
            ..terms
        }
    }

    /// This handle's acquire call for `owner`: its lease, and the tokens a new acquisition
    /// reserves for local hand-offs; `live` makes it a re-entry; `waited` as in
    /// [`mutex::Acquire::waited`].
    fn acquire_call<'a>(
        &'a self,
        owner: &'a str,
        request: &'a str,
        live: Option<Live<'a>>,
        waited: bool,
        sent: Instant,
        by: Deadline,
    ) -> AcquireCall<'a> {
        let config = &self.client.shared().config;
        let block = config.handoff.map_or(0, |h| h.max_count);
        AcquireCall {
            keys: &self.keys,
            script: mutex::Acquire {
                owner,
                lease: self.terms().lease,
                request,
                live,
                block,
                waited,
                // A quorum never hands off locally (see `Client::redlock`): no tokens reserved.
                quorum: !self.client.shared().backend.single(),
            },
            sent,
            by,
        }
    }

    /// What an acquire's reply means: `sent` is when the call was written, `live` the
    /// caller's live hold when it was a re-entry.
    fn settle(
        &self,
        reply: Acquired,
        owner: &str,
        sent: Instant,
        live: Option<&Arc<Hold>>,
        by: Deadline,
    ) -> Result<Attempt<MutexGuard>> {
        let shared = self.client.shared();
        let (token, count, acquisition, last) = match reply {
            (
                AcquireReply::Held {
                    token,
                    count,
                    acquisition,
                    last,
                },
                _,
            ) => (token, count, acquisition, last),
            (AcquireReply::Busy { ttl }, split) => {
                // Another owner holds the lock on the server (on a quorum of masters, unless
                // split): the live hold is lost, and learns it now rather than at its next
                // renewal.
                if let Some(h) = live
                    && !split
                {
                    shared.report_lost(h);
                }
                return Ok(Attempt::Busy { ttl, split });
            }
            (AcquireReply::Foreign, _) => {
                return Err(Error::ForeignKey {
                    key: self.keys.lock.clone(),
                });
            }
        };
        let grant = Grant {
            token,
            count,
            sent,
            acquisition: &acquisition,
            last,
        };
        let Some(hold) =
            shared.adopt_as(self.kind, &self.keys, owner.to_owned(), grant, self.terms())
        else {
            self.free_unusable(&acquisition, token, by);
            return Ok(Attempt::busy(Duration::ZERO));
        };
        // The reply came so late that the lease may already have run out: never hand out a
        // guard whose validity has passed. The level goes back (counted as held and released,
        // as a guard given back at once), and the next attempt tries again.
        let Some(hold) = unless_late(self, hold, "acquisition", by) else {
            drop(shared.stats.held(self.kind, &self.keys.name));
            return Ok(Attempt::busy(Duration::ZERO));
        };
        Ok(Attempt::Held(MutexGuard::new(self, hold)))
    }

    /// Frees an acquisition that no hold of this thread may use (see [`Shared::adopt_as`](crate::shared::Shared::adopt_as)),
    /// acquisition-checked, so that the next attempt makes a new one. Its hand-off tokens were
    /// never issued; whoever waits for it is told.
    fn free_unusable(&self, acquisition: &str, token: u64, by: Deadline) {
        let shared = self.client.shared();
        let (backend, level) = (&shared.backend, Level::Outermost);
        if let Err(e) =
            release::release(backend, &self.keys, (acquisition, token), level, false, by)
        {
            log::debug!("freeing an unusable grant of `{}`: {e}", self.keys.name);
        }
    }

    /// An acquire call by `deadline`, through the driver (see `driver/mod.rs`).
    fn acquire(&self, deadline: Deadline) -> Result<Option<MutexGuard>> {
        let shared = self.client.shared();
        let mut call = Acquire {
            mutex: self,
            owner: shared.owner(),
            request: request_id(),
        };
        driver::acquire(&mut call, self.kind, deadline)
    }
}

/// One acquire call of a [`Mutex`]: its owner and request id, the same in every attempt (the
/// script recognises a retry of an acquire whose reply was lost).
///
/// An election's campaign (a mutex of [`Kind::Election`], see `election.rs`) is the same call
/// with every candidate of a client woken by each message of the election (announcements and
/// proclamations come there too), and every attempt flagged, so that the leadership's release
/// publishes for the observers as for the candidates.
struct Acquire<'a> {
    mutex: &'a Mutex,
    owner: String,
    request: String,
}

impl Acquire<'_> {
    /// Whether this call is an election's campaign.
    fn campaign(&self) -> bool {
        self.mutex.kind == Kind::Election
    }
}

impl<'a> Protocol<'a> for Acquire<'a> {
    type Held = MutexGuard;

    fn lock(&self) -> (&'a Core, &'a LockKeys) {
        (&self.mutex.client, &self.mutex.keys)
    }

    /// Every candidate of a campaign wakes on each message of the election.
    fn queue(&self) -> Queue {
        if self.campaign() {
            Queue::Together
        } else {
            Queue::Line
        }
    }

    fn lease(&self) -> Duration {
        self.mutex.terms().lease
    }

    /// Threads of this client that queue for the lock go first, unless this thread
    /// re-enters: waiting behind threads that wait for its own lock would never end. A
    /// candidate tries at once.
    fn defers(&self) -> bool {
        let shared = self.mutex.client.shared();
        !self.campaign()
            && shared.subscriber.has_waiters(&self.mutex.keys.channel)
            && shared.live_hold(&self.mutex.keys).is_none()
    }

    /// One acquire script round trip. A waiter's attempt (and every attempt of a campaign)
    /// flags the grant, so that its release publishes for whoever else waits (a leader of
    /// another client that gives way sleeps until it).
    ///
    /// A re-entry (the thread holds the lock through a live guard) keeps the terms of the
    /// hold's acquisition, whatever this handle's terms: it never shortens the key's lease,
    /// extends a renewed hold's lease to at least its own length, and leaves a fixed lease
    /// as it is. A re-entry that finds the hold's acquisition gone from the server marks the
    /// hold lost at once (its guards then say so); it gets a new acquisition with this
    /// handle's terms, or `Busy` when another owner holds the lock.
    ///
    /// Retried at once on a new connection when the first try failed at the connection level
    /// (same request id: the script recognises a retry of an acquire whose reply was lost, so
    /// a re-entry is never counted twice); both within one connect plus one command timeout.
    fn attempt(&mut self, waiting: bool, by: Deadline) -> Result<Attempt<MutexGuard>> {
        let waited = waiting || self.campaign();
        let (mutex, request) = (self.mutex, &self.request);
        let shared = mutex.client.shared();
        twice(&mutex.client, by, |by| {
            let sent = Instant::now();
            // Levels of this owner on the server without a live local guard are orphans (a
            // release whose reply was lost); the script replaces them instead of counting on
            // top of them.
            let live = shared.live_hold(&mutex.keys);
            // A re-entry speaks for the owner on the server: after a local hand-off that is
            // the thread that took the lock through Redis, not this one.
            let owner = live
                .as_ref()
                .map_or(self.owner.as_str(), |h| h.owner.as_str());
            let reentry = live.as_ref().map(|h| Live {
                acquisition: &h.acquisition,
                extend: h.reentry_extension(sent),
            });
            let call = mutex.acquire_call(owner, request, reentry, waited, sent, by);
            let reply = acquire::acquire(&shared.backend, &call)?;
            mutex.settle(reply, owner, sent, live.as_ref(), by)
        })
    }

    /// Only on a single master, for a thread without a live hold of this lock, and when an
    /// idle pooled connection is at hand.
    fn prime(&mut self, by: Deadline) -> Option<Primed> {
        let shared = self.mutex.client.shared();
        if shared.live_hold(&self.mutex.keys).is_some() {
            return None;
        }
        let call =
            self.mutex
                .acquire_call(&self.owner, &self.request, None, true, Instant::now(), by);
        shared
            .backend
            .prime_script(&mutex::acquire(call.keys, &call.script))
    }

    fn fired(&mut self, fired: Fired, by: Deadline) -> Result<Attempt<MutexGuard>> {
        let (mutex, sent) = (self.mutex, fired.sent);
        let call = mutex.acquire_call(&self.owner, &self.request, None, true, sent, by);
        let v = fired.reply(&mutex.client.shared().backend, by)?;
        let reply = acquire::acquire_reply(v, &call.script)?;
        mutex.settle((reply, false), &self.owner, sent, None, by)
    }

    /// A lock handed over by a thread of this client (see `handoff.rs`). Taking it does no
    /// I/O, unless it cannot be taken (then it is released through Redis within `by`).
    fn passed(&mut self, passed: Passed, by: Deadline) -> Option<MutexGuard> {
        let shared = self.mutex.client.shared();
        let hold = handoff::receive(shared, passed, self.mutex.terms(), by)?;
        Some(MutexGuard::new(self.mutex, hold))
    }

    /// A candidate leaves as every candidate woke: the next one needs no turn.
    fn leave(&self, reg: Registration, seen: u64) {
        if self.campaign() {
            drop(reg);
        } else {
            drop(reg.leave_acquired_quietly(seen));
        }
    }
}

impl Release for Mutex {
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()> {
        guard::release(self.client.shared(), &self.keys, hold, by)
    }
}

/// The holder a quorum of masters' answers `seen` name, merged: the highest token, count and
/// time held, the shortest lease left. `None` when none names one.
///
/// # Errors
///
/// [`Error::NoQuorum`] when some masters name a holder but no majority names the same one
/// (the masters disagree: a split vote, or a holder whose acquisition or release is half
/// done).
fn agree<X>(seen: Vec<(String, Holder, X)>, quorum: usize) -> Result<Option<(String, Holder, X)>> {
    let agree = |a: &String| seen.iter().filter(|(b, ..)| b == a).count();
    let Some(acquisition) = seen
        .iter()
        .map(|(a, ..)| a.clone())
        .find(|a| agree(a) >= quorum)
    else {
        return match seen.iter().map(|(a, ..)| agree(a)).max() {
            Some(reached) => Err(Error::NoQuorum {
                reached,
                needed: quorum,
            }),
            None => Ok(None),
        };
    };
    let mut ours = seen.into_iter().filter(|(a, ..)| *a == acquisition);
    let Some((_, mut holder, extra)) = ours.next() else {
        return Ok(None);
    };
    for (_, h, _) in ours {
        holder.fencing_token = holder.fencing_token.max(h.fencing_token);
        holder.hold_count = holder.hold_count.max(h.hold_count);
        holder.held_for = holder.held_for.max(h.held_for);
        holder.lease_left = holder.lease_left.min(h.lease_left);
    }
    Ok(Some((acquisition, holder, extra)))
}
