//! [`Semaphore`] and [`SemaphorePermit`]: a counting semaphore whose permits are leases.
//!
//! # Protocol
//!
//! Redis keeps, per semaphore, one key: while one acquisition holds permits, a string
//! `GEN|OWNER|N|S|US` (the acquisition, its owner, its permits and the server clock at the
//! grant) expiring with its lease; while several do, a sorted set of such members by lease
//! deadline on the server's clock. One script (`scripts/sem_permits.lua`) acquires, releases,
//! renews and counts atomically: an acquire on a free semaphore is `TIME` and one `SET NX`, a
//! release a `GET` and a `RENAME` to a release marker (by which a retried release tells that
//! its first attempt released it). An acquire that finds other holders drops the acquisitions
//! whose lease ran out, so the permits of a dead holder come back one lease after its last
//! renewal, and succeeds when the permits held by live leases plus the permits wanted fit in
//! the caller's permit count.
//!
//! Waiting is the plain mutex's: the semaphore's release channel, one local leader per client
//! asking Redis, the others queued locally; a leader sleeps until a release is published or
//! the first lease runs out (a dead holder publishes nothing). A leader's attempt flags the
//! semaphore, and a release publishes only when it is flagged. A leader that got its permits
//! lets the next local waiter try at once, since more permits may be free.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::driver::calls::{self, ask, eval_twice};
use crate::driver::lease::{Lease, Release, lease_view, release_level, unless_late, watched_hold};
use crate::driver::{self, Attempt, Protocol, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::protocol::lock_value::Shape;
use crate::protocol::scripts::Admin;
use crate::protocol::scripts::{self, AcquireReply};
use crate::protocol::semaphore;
use crate::shared::Core;
use crate::shared::config::validate_lease;
use crate::shared::grant::request_id;
use crate::shared::hold::Hold;
use crate::shared::holder::Holder;
use crate::subscriber::Registration;
use crate::transport::conn::Deadline;

/// A distributed counting semaphore with leased permits: at most `permits` permits are held
/// at a time, across every process that uses the same Redis, key prefix and name.
///
/// Use it to cap how many workers use a resource at once (connections to a fragile service,
/// licences, concurrent exports). Each acquisition is a lease renewed by the client's renewal
/// thread while its [`SemaphorePermit`] lives (or a fixed lease, never renewed, through a
/// handle made with [`with_lease`](Semaphore::with_lease)); its permits come back when the
/// permit is released or dropped, and by themselves one lease after a holder died.
///
/// | method | waits | returns |
/// |---|---|---|
/// | [`acquire`](Semaphore::acquire) | until one permit is free | `Result<SemaphorePermit>` |
/// | [`acquire_many`](Semaphore::acquire_many) | until `n` permits are free | `Result<SemaphorePermit>` |
/// | [`try_acquire`](Semaphore::try_acquire) | no: one attempt | `Result<Option<SemaphorePermit>>` |
/// | [`try_acquire_for`](Semaphore::try_acquire_for) | at most the given time | `Result<Option<SemaphorePermit>>` |
/// | [`try_acquire_until`](Semaphore::try_acquire_until) | until the given instant | `Result<Option<SemaphorePermit>>` |
///
/// # What it promises
///
/// - **The count is never exceeded**, whatever holders crash or restart: an acquire succeeds
///   only when the permits of live leases plus the permits wanted fit in the count, atomically
///   on the server, and a lease ends by the server's clock only. As with every lock here, a
///   holder paused for longer than its lease may still *believe* it holds a permit: check
///   [`SemaphorePermit::is_held`] before the work a permit guards.
/// - A permit comes back when released, and by itself one lease after its holder stopped
///   renewing it (the holder died or was paused).
/// - Waiting never polls: a release wakes the waiters of every client.
/// - Permits are not reentrant and not fair: each acquisition is new, and under contention
///   any waiter may get a freed permit first.
///
/// # No `is_locked`
///
/// Unlike the other lock types, a semaphore has no `is_locked`: "locked" could mean "some
/// permit is held" or "no permit is free", and code that reads one where the other was meant
/// is wrong only under load. Ask the question itself: [`available`](Semaphore::available)
/// says how many permits this handle's count leaves free (0: an acquire would wait), and
/// [`holders`](Semaphore::holders) who holds permits (empty: none is held).
///
/// # Changing the permit count
///
/// The count is not stored in Redis: every acquire carries its caller's count, and succeeds
/// when the permits held plus those wanted fit in *that* count. So to change the count of a
/// live semaphore, give the new count to [`Client::semaphore`](crate::Client::semaphore) in
/// every process (a rolling restart works):
///
/// - **Raising** it lets new acquires through at once.
/// - **Lowering** it revokes nothing: permits already held stay held until released; new
///   acquires with the lower count wait until the permits in use fit under it.
/// - While both counts are in use, the permits held never exceed the larger one, and an
///   acquirer with the lower count never takes a permit above its own count.
///
/// # Topologies
///
/// One Redis server, reached directly ([`Client::open`](crate::Client::open),
/// [`Client::builder`](crate::Client::builder)) or through Sentinel
/// ([`Client::sentinel`](crate::Client::sentinel)). On a client over several masters
/// ([`Client::redlock`](crate::Client::redlock)) every call that reaches Redis returns
/// [`Error::Unsupported`] before anything is sent: a count cannot be kept by majority
/// vote. With 5 masters each allowing `n` permits and every acquisition on 3 of them, up to
/// `5n/3` acquisitions could each hold a majority at once.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let exports = client.semaphore("exports", 4)?; // at most 4 exports at once, anywhere
/// let permit = exports.acquire()?;
/// // ... run one export ...
/// permit.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    client: Core,
    keys: Arc<LockKeys>,
    permits: u32,
    /// A fixed lease for its acquisitions, never renewed; `None`: the client's lease, renewed
    /// while the permit lives.
    fixed_lease: Option<Duration>,
}

impl Semaphore {
    /// Checks the arguments; nothing is sent to Redis.
    pub(crate) fn new(client: Core, prefix: &str, name: &str, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::config("permits", "must be at least 1"));
        }
        Ok(Semaphore {
            keys: Arc::new(LockKeys::family(prefix, name, "sem", "released")),
            client,
            permits,
            fixed_lease: None,
        })
    }

    /// The same semaphore with a fixed lease: never renewed, so the permits of each
    /// acquisition come back by themselves `lease` after it, even if their holder is still
    /// working. Use it for work with a known bound, where a stuck holder must not keep its
    /// permits.
    ///
    /// The lease is that of new acquisitions through this handle; permits are not reentrant,
    /// so every acquisition is new, and nothing (another acquisition, a permit moved to another
    /// thread) extends a fixed lease.
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
    /// let exports = client.semaphore("exports", 4)?.with_lease(Duration::from_secs(300))?;
    /// let permit = exports.acquire()?; // back by itself 5 minutes from now at the latest
    /// // ... run one export ...
    /// permit.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<Semaphore> {
        validate_lease(lease)?;
        Ok(Semaphore {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// This handle's permit count.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// How many permits are free right now, for this handle's count (0 when more are held,
    /// after the count was lowered).
    ///
    /// Returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked.
    pub fn available(&self) -> Result<u32> {
        let call = semaphore::used(&self.keys);
        let v = ask(&self.client, &call, &self.keys, "semaphore used")?;
        let used =
            semaphore::parse_used(&v).ok_or_else(|| scripts::unexpected("semaphore used", &v))?;
        Ok(self.permits.saturating_sub(used))
    }

    /// Who holds permits now, as the server tells it: one [`Holder`] per acquisition, with
    /// `hold_count` the permits it holds and its lease left; empty when every permit is free.
    /// It does not depend on this handle's permit count. Fencing tokens are 0 (permits have
    /// none).
    ///
    /// One script call: returns within the connect timeout plus the command timeout (a pooled
    /// connection that died is retried at once on a new one, within that bound).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked; [`Error::ForeignKey`] when the
    /// semaphore's key holds something else; [`Error::Unsupported`] on a client over
    /// several masters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let exports = client.semaphore("exports", 4)?;
    /// for h in exports.holders()? {
    ///     println!("{} permits held by {} ({})", h.hold_count, h.label, h.thread);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn holders(&self) -> Result<Vec<Holder>> {
        let call = semaphore::admin(&self.keys, Admin::Holder);
        let v = ask(&self.client, &call, &self.keys, "semaphore info")?;
        let holders = match &v {
            Value::Array(items) if items.len() == 3 => calls::clock_us(items)
                .and_then(|now| calls::holders_of(&items[2], Shape::Permits, now)),
            _ => None,
        };
        holders.ok_or_else(|| scripts::unexpected("semaphore holders", &v))
    }

    /// Frees every permit on the server, whoever holds it (an operator's tool, for holders
    /// that are stuck but alive), and wakes every waiter at once. Returns `true` when any
    /// permit was held.
    ///
    /// Each dispossessed holder finds out at its next renewal at the latest: its permit's
    /// [`is_held`](SemaphorePermit::is_held) turns false, `on_lease_lost` is called, and its
    /// [`unlock`](SemaphorePermit::unlock) is an error, never `Ok`. Logged at `warn` with
    /// the label and thread of each holder removed.
    ///
    /// One script call, within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`holders`](Semaphore::holders); a foreign key is left alone.
    pub fn force_unlock(&self) -> Result<bool> {
        let call = semaphore::admin(&self.keys, Admin::Force);
        let what = "semaphore force_unlock";
        let logged = (module_path!(), "semaphore", Shape::Permits);
        calls::force_holders(&self.client, &call, &self.keys, what, logged)
    }

    timed_forms! { guard: SemaphorePermit, call: acquire_one, fails: "acquire() ended without a permit";
        /// Blocks until one permit is held.
        fn acquire, errors {
        /// [`Error::ForeignKey`] when the semaphore's keys hold something else;
        /// [`Error::Unsupported`] on a client over several masters.
        }
        /// Makes exactly one attempt for one permit. `Ok(None)` when none is free.
        fn try_acquire;
        /// Waits at most `timeout` for one permit. `Ok(None)` when none came free in time. A zero
        /// timeout makes exactly one attempt.
        fn try_acquire_for;
        /// Waits until `deadline` at most for one permit.
        fn try_acquire_until;
        /// Runs `f` while holding one permit, then releases it, and returns what `f` returned:
        /// [`acquire`](Semaphore::acquire), `f(&permit)`, [`unlock`](SemaphorePermit::unlock).
        /// The same as [`Mutex::with_lock`](crate::Mutex::with_lock): a panic in `f` releases the
        /// permit as it is dropped.
        ///
        /// # Errors
        ///
        /// As [`acquire`](Semaphore::acquire), and `f` is not called; as
        /// [`unlock`](SemaphorePermit::unlock) when the release fails after `f` ran (the
        /// permit's lease lost while `f` ran: [`Error::LeaseLost`], [`Error::NotOwner`]): `f`'s
        /// value is then dropped and the error returned in its place.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let uplink = client.semaphore("uplink", 10)?;
        /// let sent = uplink.with_permit(|_permit| {
        ///     // ... one of at most 10 uploads at once ...
        ///     1024
        /// })?;
        /// # let _ = sent;
        /// # Ok(()) }
        /// ```
        fn with_permit;
    }

    timed_forms! { guard: SemaphorePermit, call: acquire_n(n: u32), fails: "acquire() ended without a permit";
        /// Blocks until `n` permits are held together, as one acquisition (one lease, released
        /// together).
        fn acquire_many, errors {
        /// [`Error::Misuse`] when `n` is 0 or more than the permit count (it could never
        /// be granted); otherwise as [`acquire`](Semaphore::acquire).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let bandwidth = client.semaphore("uplink", 10)?;
        /// let big_upload = bandwidth.acquire_many(4)?;
        /// assert_eq!(big_upload.permits(), 4);
        /// # Ok(()) }
        /// ```
        }
        /// Makes exactly one attempt for `n` permits together. `Ok(None)` when fewer than `n`
        /// are free.
        fn try_acquire_many;
        /// Waits at most `timeout` for `n` permits together. `Ok(None)` when fewer than `n` came
        /// free in time.
        fn try_acquire_many_for;
        /// Waits until `deadline` at most for `n` permits together. `Ok(None)` when fewer than
        /// `n` came free in time.
        fn try_acquire_many_until;
    }

    /// An acquire call for one permit by `deadline`.
    fn acquire_one(&self, deadline: Deadline) -> Result<Option<SemaphorePermit>> {
        self.acquire_n(1, deadline)
    }

    /// An acquire call for `n` permits by `deadline`, through the driver (see
    /// `driver/mod.rs`).
    fn acquire_n(&self, n: u32, deadline: Deadline) -> Result<Option<SemaphorePermit>> {
        if n == 0 || n > self.permits {
            return Err(Error::misuse(format!(
                "n: must be from 1 to the permit count ({}); {n} could never be granted",
                self.permits
            )));
        }
        let mut call = Acquire {
            sem: self,
            owner: self.client.shared().owner(),
            request: request_id(),
            n,
        };
        driver::acquire(&mut call, Kind::Permits, deadline)
    }
}

/// One acquire call of a [`Semaphore`] for `n` permits, as acquisition `request` of `owner`.
struct Acquire<'a> {
    sem: &'a Semaphore,
    owner: String,
    request: String,
    n: u32,
}

impl<'a> Protocol<'a> for Acquire<'a> {
    type Held = SemaphorePermit;

    fn lock(&self) -> (&'a Core, &'a LockKeys) {
        (&self.sem.client, &self.sem.keys)
    }

    /// One acquire call for the permits (`waiting`: the caller waits for a release when not
    /// granted, and flags the semaphore for it).
    fn attempt(&mut self, waiting: bool, by: Deadline) -> Result<Attempt<SemaphorePermit>> {
        let (sem, owner, request, n) = (self.sem, &self.owner, &self.request, self.n);
        let shared = sem.client.shared();
        let terms = sem.client.terms_with(sem.fixed_lease);
        let sent = Instant::now();
        let call = semaphore::acquire(
            &sem.keys,
            owner,
            request,
            n,
            sem.permits,
            terms.lease,
            waiting,
        );
        let v = eval_twice(&sem.client, &call, by)?;
        match calls::acquire_reply(&v, request, &sem.keys, "semaphore acquire")? {
            AcquireReply::Held { .. } => {
                let who = (owner.as_str(), request.as_str());
                let hold = watched_hold(shared, &sem.keys, who, (Kind::Permits, terms), sent);
                // A reply so late that the lease may have run out: the permits go back.
                Ok(match unless_late(sem, hold, "permit", by) {
                    Some(hold) => Attempt::Held(SemaphorePermit {
                        lease: Lease::new(sem, shared, hold, "a permit of"),
                        n,
                    }),
                    None => Attempt::busy(Duration::ZERO),
                })
            }
            AcquireReply::Busy { ttl } => Ok(Attempt::busy(ttl)),
            // A foreign key is an error of `acquire_reply` already.
            AcquireReply::Foreign => Err(scripts::unexpected("semaphore acquire", &v)),
        }
    }

    /// The next waiter tries at once: more permits may be free.
    fn leave(&self, reg: Registration, _seen: u64) {
        drop(reg);
    }
}

/// Permits held from a [`Semaphore`]: one acquisition, one lease. Dropping it gives the
/// permits back; [`unlock`](SemaphorePermit::unlock) does the same and reports errors.
///
/// The lease is renewed while the permit lives (unless the semaphore was made with a fixed
/// lease, see [`Semaphore::with_lease`]). If renewal fails for longer than the lease
/// (Redis unreachable, or this process paused), the permits may go to another holder while
/// this value still exists; [`is_held`](SemaphorePermit::is_held) turns false no later than
/// that can happen.
///
/// Unlike a mutex guard, a permit belongs to no thread: it is `Send`, so it may be moved to
/// another thread as it is (it needs no [`Detached`](crate::Detached)) and released there.
#[must_use = "if unused the permits are released at once"]
#[clippy::has_significant_drop]
pub struct SemaphorePermit {
    lease: Lease,
    n: u32,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lease
            .debug_as(f, "SemaphorePermit", Some(("permits", &self.n)))
    }
}

impl SemaphorePermit {
    /// How many permits this acquisition holds.
    pub fn permits(&self) -> u32 {
        self.n
    }

    lease_view!("unlock");

    /// Gives the permits back, waking waiters.
    ///
    /// It asks the server. Returns within the connect timeout plus the command timeout (so
    /// does a drop). A release retried after a failed connection reports `Ok` only where the
    /// server shows that its first attempt released the permits (by a short-lived marker the
    /// release leaves); otherwise (Redis restarted empty, the lease ran out) the loss.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease had run out or Redis lost the permits in a restart
    /// (the permits were already back);
    /// [`Error::Redis`] when Redis could not be asked (the permits then come back when the
    /// lease runs out, since renewal stopped).
    pub fn unlock(self) -> Result<()> {
        self.lease.unlock()
    }
}

impl Release for Semaphore {
    /// Gives the permits of `hold` back within `by`.
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()> {
        let script = ("semaphore release", scripts::parse_family_release);
        // Permits have one level, and no thread's slot: leaving it stops their renewal.
        release_level(&self.client, hold, script, &self.keys.lock, by, |_| {
            Some(semaphore::release(&self.keys, hold.holder()))
        })
    }
}

// Handles and permits are shared or moved across threads by design.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    const fn assert_send<T: Send>() {}
    assert_send_sync::<Semaphore>();
    assert_send::<SemaphorePermit>();
};
