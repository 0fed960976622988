//! [`RwLock`], [`RwLockReadGuard`] and [`RwLockWriteGuard`]: many readers or one writer.
//!
//! # Protocol
//!
//! Redis keeps the writer (a string `GEN|OWNER|S|US`: its acquisition, owner and the server
//! clock at the grant, expiring with its lease), the readers (one reader as such a string; several
//! as a sorted set of them by lease deadline, on the server's clock), and the waiting writers and
//! readers (sorted sets by the deadline of their registration, refreshed by each attempt; a
//! waiter re-attempts at least every renewal interval). One script per operation (`scripts/rw_*.lua`)
//! does it atomically; an uncontended one runs two or three commands: a write is `TIME`,
//! one `EXISTS` of the five keys and a `SET`, a read `TIME`, one `EXISTS` of the writer and the
//! waiting writers and a `SET NX`, a release a `GET` and a `RENAME` to a release marker (by which
//! a retried release tells that its first attempt released it).
//!
//! Re-entry is counted here, per thread: the server holds one entry per acquisition. A nested
//! guard costs one round trip, which checks that the server still has the hold's acquisition
//! (and extends its lease as a renewal would): a re-entry after the entry was lost (expired,
//! deleted, or gone in an empty restart) is never counted on it. The outer guards are marked
//! lost at once, and the re-entry is a new acquisition, or none when another owner holds the
//! lock, as for [`Mutex`](crate::Mutex).
//!
//! # Waking
//!
//! Readers and writers listen on two channels. A release that opens the lock to readers
//! publishes on the readers' channel, and *every* local reader wakes at once (a broadcast
//! registration with the subscriber); a release that frees it for a writer publishes on the
//! writers' channel, where one writer per client, the leader of the local queue, asks Redis.
//! A release publishes only for the waiters that flagged the holder in their way when they
//! registered (a letter each at the end of the writer's value: a waiting writer, a deferring
//! reader, an eager reader; a waiting writer flags the readers), and a writer granted while
//! others are registered is flagged for them at once: no waiter is missed, and an uncontended
//! cycle publishes nothing. Every sleep is also bounded by the lease of whoever is in the way (a
//! dead holder publishes nothing) and by the renewal interval (to refresh the waiter's
//! registration). A reader that defers to waiting writers also sleeps at most until the first
//! waiting writer's deadline (that writer's own lease after its last attempt): a release while
//! a writer waits wakes no reader, and a waiting writer that died publishes nothing when its
//! registration runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::driver::calls::{self, ask, eval_twice};
use crate::driver::detached::detachable;
use crate::driver::lease::{Lease, Release, ThreadBound, lease_guard, release_level, unless_late};
use crate::driver::time::Budget;
use crate::driver::{self, Attempt, Protocol, Queue, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::protocol::lock_value::Shape;
use crate::protocol::rw_lock;
use crate::protocol::scripts::Admin;
use crate::protocol::scripts::{self, AcquireReply, Level};
use crate::shared::Core;
use crate::shared::config::validate_lease;
use crate::shared::grant::{Grant, request_id};
use crate::shared::hold::Hold;
use crate::shared::holder::Holder;
use crate::subscriber::Registration;
use crate::transport::conn::Deadline;

/// A distributed read-write lock: many readers at once, or one writer, across processes.
///
/// Use it for a read-mostly resource, where readers may overlap one another but not a writer:
/// a configuration blob, a cache rebuilt now and then, a file that is mostly read.
///
/// | readers | writers |
/// |---|---|
/// | [`read`](RwLock::read), [`try_read`](RwLock::try_read), [`try_read_for`](RwLock::try_read_for), [`try_read_until`](RwLock::try_read_until) | [`write`](RwLock::write), [`try_write`](RwLock::try_write), [`try_write_for`](RwLock::try_write_for), [`try_write_until`](RwLock::try_write_until) |
///
/// # What it promises
///
/// - While the leases are valid: never a writer together with another writer or with a reader
///   of another thread. Each reader and the writer hold leases of their own, renewed by the
///   client's renewal thread in its batches; a dead holder blocks others for at most a lease.
/// - **Re-entry per thread**: a reader may read again, a writer may write again, and a writer
///   may also take read levels (which it keeps after releasing the write lock: a downgrade).
///   A re-entry asks Redis whether the hold it enters is still there: one that finds it gone
///   (the lease ran out, or Redis lost it) marks the outer guards lost and is a new
///   acquisition (`None` from a `try_*` form while another owner holds the lock), as a
///   [`Mutex`](crate::Mutex) re-entry is.
///   A thread that holds only a read lock cannot take the write lock: that would wait for
///   itself, so it is refused with [`Error::Misuse`].
/// - **Writer preference** by default: once a writer waits, new readers wait behind it, so a
///   stream of readers cannot starve a writer. [`with_reader_preference`](RwLock::with_reader_preference)
///   lets readers in as long as no writer holds the lock. A waiting writer that died blocks
///   deferring readers for at most a lease *of that writer* after its last attempt, whoever
///   holds or releases the lock; one that gives up (a timed-out `try_write_for`)
///   unblocks them at once.
/// - **Waking**: a release that opens the lock to readers wakes all waiting readers at once;
///   one that frees it for a writer wakes one writer per client.
/// - Write guards carry a fencing token (strictly increasing per name, from the server clock
///   at the grant); read guards do not.
/// - A handle made with [`with_lease`](RwLock::with_lease) takes fixed leases, never
///   renewed: its holds free themselves a fixed time after each acquisition.
///
/// # Topologies
///
/// One Redis server, reached directly ([`Client::open`](crate::Client::open),
/// [`Client::builder`](crate::Client::builder)) or through Sentinel
/// ([`Client::sentinel`](crate::Client::sentinel)). On a client over several masters
/// ([`Client::redlock`](crate::Client::redlock)) every acquiring call returns
/// [`Error::Unsupported`] before anything is sent: the readers, the waiting writers that
/// hold readers back, and the decision whom a release wakes live in one server's atomic
/// scripts, and are not kept by majority vote across independent masters.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let config = client.rw_lock("config")?;
/// {
///     let _r = config.read()?; // many readers at once, in every process
///     // ... read the configuration ...
/// }
/// let w = config.write()?; // alone
/// let _token = w.fencing_token();
/// // ... rewrite the configuration ...
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    client: Core,
    /// The readers' keys (their `lock` names the readers' set: it tells a thread's read hold
    /// from its write hold).
    read_keys: Arc<LockKeys>,
    write_keys: Arc<LockKeys>,
    prefer_writers: bool,
    /// A fixed lease for its read and write acquisitions, never renewed; `None`: the
    /// client's lease, renewed while the guard lives.
    fixed_lease: Option<Duration>,
}

impl RwLock {
    pub(crate) fn new(client: Core, prefix: &str, name: &str) -> Self {
        let write_keys = LockKeys::family(prefix, name, "rw", "free");
        let read_keys = LockKeys {
            lock: format!("{}:readers", write_keys.lock),
            channel: format!("{}:open", write_keys.lock),
            ..write_keys.clone()
        };
        RwLock {
            client,
            read_keys: Arc::new(read_keys),
            write_keys: Arc::new(write_keys),
            prefer_writers: true,
            fixed_lease: None,
        }
    }

    /// The same lock with a fixed lease for its read and write acquisitions: never renewed,
    /// so a reader's or the writer's hold frees itself `lease` after each acquisition even if
    /// its holder is still working. Use it for work with a known bound, where a stuck holder
    /// must not keep the lock.
    ///
    /// The lease is that of new acquisitions. A thread that already holds the lock re-enters
    /// its acquisition and keeps that acquisition's terms, through whatever handle: a re-entry
    /// never shortens the lease on the server, and never extends a fixed lease. A writer that
    /// takes read levels (a downgrade) makes a read acquisition of its own, with the terms of
    /// the handle it reads through.
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
    /// let index = client.rw_lock("search-index")?.with_lease(Duration::from_secs(60))?;
    /// let rebuild = index.write()?; // free again at the latest 60 s from now
    /// // ... rebuild the index ...
    /// rebuild.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<RwLock> {
        validate_lease(lease)?;
        Ok(RwLock {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// The same lock, letting readers in whenever no writer *holds* it, even while writers
    /// wait (readers may then starve writers). The default is writer preference.
    pub fn with_reader_preference(&self) -> RwLock {
        RwLock {
            prefer_writers: false,
            ..self.clone()
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.write_keys.name
    }

    /// The keys a thread's read hold (`read`) or write hold is known by.
    fn keys(&self, read: bool) -> &Arc<LockKeys> {
        if read {
            &self.read_keys
        } else {
            &self.write_keys
        }
    }

    /// Whether anyone (any process, any thread) holds the lock right now: a writer, or any
    /// reader.
    ///
    /// One script call: returns within the connect timeout plus the command timeout (a pooled
    /// connection that died is retried at once on a new one, within that bound).
    ///
    /// # Errors
    ///
    /// As [`writer`](RwLock::writer).
    pub fn is_locked(&self) -> Result<bool> {
        let (now, items) = self.info()?;
        if !readers_in(now, &items)?.is_empty() {
            return Ok(true);
        }
        Ok(calls::lone_holder(items, Some(now), Shape::Writer, "rw writer")?.is_some())
    }

    /// Who holds the write lock now, as the server tells it (any process, any thread): `None`
    /// when no writer holds it. `held_for` is since the write acquisition, by the server's
    /// clock; `hold_count` is 1 (re-entry is counted by the holding client).
    ///
    /// One script call: returns within the connect timeout plus the command timeout (a pooled
    /// connection that died is retried at once on a new one, within that bound).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked; [`Error::ForeignKey`] when the lock's keys
    /// hold something else; [`Error::Unsupported`] on a client over several masters.
    pub fn writer(&self) -> Result<Option<Holder>> {
        let (now, items) = self.info()?;
        calls::lone_holder(items, Some(now), Shape::Writer, "rw writer")
    }

    /// Who holds read locks now, as the server tells it: one [`Holder`] per read acquisition
    /// (a thread's nested read guards are one), with its lease left; empty when nobody reads.
    /// Fencing tokens are 0 (readers have none).
    ///
    /// One script call, within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`writer`](RwLock::writer).
    pub fn readers(&self) -> Result<Vec<Holder>> {
        let (now, items) = self.info()?;
        readers_in(now, &items)
    }

    /// How many wait for the lock now: the registered waiting writers and readers (both
    /// kinds), as the server counts them. One script call, within the connect timeout plus the
    /// command timeout. Used by [`Client::locks`](crate::Client::locks).
    pub(crate) fn waiting(&self) -> Result<usize> {
        let (_, items) = self.info()?;
        items
            .get(5)
            .and_then(scripts::int)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| scripts::unexpected("rw waiting", &Value::Array(items)))
    }

    /// The server clock (µs) and `{S, US, writer, ttl, readers, waiting}` (see
    /// `scripts/rw_admin.lua`).
    fn info(&self) -> Result<(u64, Vec<Value>)> {
        let call = rw_lock::admin(&self.write_keys, Admin::Holder);
        match ask(&self.client, &call, &self.write_keys, "rw info")? {
            Value::Array(items) if items.len() == 6 => match calls::clock_us(&items) {
                Some(now) => Ok((now, items)),
                None => Err(scripts::unexpected("rw info", &Value::Array(items))),
            },
            other => Err(scripts::unexpected("rw info", &other)),
        }
    }

    /// Frees the lock on the server whoever holds it (an operator's tool, for holders that are
    /// stuck but alive): the writer and every reader. Waiting writers and readers are woken at
    /// once. Returns `true` when anyone held it.
    ///
    /// Each dispossessed holder finds out at its next renewal at the latest: its guard's
    /// `is_held` turns false, `on_lease_lost` is called, and its `unlock` is an error, never
    /// `Ok`. Write tokens keep rising (the next writer's token is above the slot's fencing
    /// mark). Logged at `warn` with the label and thread of each holder removed.
    ///
    /// One script call, within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`writer`](RwLock::writer); foreign keys are left alone.
    pub fn force_unlock(&self) -> Result<bool> {
        let call = rw_lock::admin(&self.write_keys, Admin::Force);
        let forced = calls::forced(&self.client, &call, &self.write_keys, "rw force_unlock")?;
        let Some((v, removed)) = forced else {
            return Ok(false);
        };
        // The writer first (its value starts the list, when there was one); the rest are
        // readers.
        let wrote = matches!(&v, Value::Array(items)
            if items.first().and_then(scripts::text).is_some_and(|w| !w.is_empty()));
        let (writer, readers) = removed.split_at(usize::from(wrote).min(removed.len()));
        let lock = (module_path!(), "read-write lock", self.name());
        for (role, removed, shape) in [
            ("writer", writer, Shape::Writer),
            ("reader", readers, Shape::Reader),
        ] {
            if !removed.is_empty() {
                calls::log_forced(lock, role, removed, shape);
            }
        }
        Ok(true)
    }

    timed_forms! { guard: RwLockReadGuard, call: read_until, fails: "read() ended without the lock";
        /// Blocks until the calling thread holds a read lock.
        fn read, errors {
        /// [`Error::ForeignKey`] when the lock's keys hold something else;
        /// [`Error::Unsupported`] on a client over several masters.
        }
        /// Makes exactly one attempt at a read lock. `Ok(None)` when a writer holds the lock (or,
        /// with writer preference, waits for it).
        fn try_read;
        /// Waits at most `timeout` for a read lock.
        fn try_read_for;
        /// Waits until `deadline` at most for a read lock.
        fn try_read_until;
        /// Runs `f` while holding a read lock, then releases it, and returns what `f` returned:
        /// [`read`](RwLock::read), `f(&guard)`, [`unlock`](RwLockReadGuard::unlock). The same as
        /// [`Mutex::with_lock`](crate::Mutex::with_lock): a panic in `f` releases the read lock as
        /// the guard is dropped.
        ///
        /// # Errors
        ///
        /// As [`read`](RwLock::read), and `f` is not called; as
        /// [`unlock`](RwLockReadGuard::unlock) when the release fails after `f` ran (a lease lost
        /// while `f` ran: [`Error::LeaseLost`], [`Error::NotOwner`]): `f`'s value is then dropped
        /// and the error returned in its place.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let prices = client.rw_lock("prices")?;
        /// let count = prices.with_read(|_guard| {
        ///     // ... read the price list ...
        ///     42
        /// })?;
        /// prices.with_write(|guard| {
        ///     // ... rewrite it, fenced with guard.fencing_token() ...
        /// #   let _ = (guard, count);
        /// })?;
        /// # Ok(()) }
        /// ```
        fn with_read;
    }

    timed_forms! { guard: RwLockWriteGuard, call: write_until, fails: "write() ended without the lock";
        /// Blocks until the calling thread holds the write lock.
        fn write, errors {
        /// [`Error::ForeignKey`] when the lock's keys hold something else;
        /// [`Error::Unsupported`] on a client over several masters; [`Error::Misuse`] when the
        /// calling thread holds a read lock but not the write lock (it would wait for itself).
        }
        /// Makes exactly one attempt at the write lock. `Ok(None)` when another owner holds the
        /// lock (a writer, or readers).
        fn try_write;
        /// Waits at most `timeout` for the write lock.
        fn try_write_for;
        /// Waits until `deadline` at most for the write lock.
        fn try_write_until;
        /// Runs `f` while holding the write lock, then releases it, and returns what `f` returned:
        /// [`write`](RwLock::write), `f(&guard)`, [`unlock`](RwLockWriteGuard::unlock). The same
        /// as [`with_read`](RwLock::with_read) for the write lock.
        ///
        /// # Errors
        ///
        /// As [`write`](RwLock::write), and `f` is not called; as
        /// [`unlock`](RwLockWriteGuard::unlock) when the release fails after `f` ran: `f`'s value
        /// is then dropped and the error returned in its place.
        fn with_write;
    }

    /// A nested level of the calling thread's live hold (its read hold when `read`, else its
    /// write hold), within `limit`: `None` when it has none.
    ///
    /// The server is asked whether the hold's acquisition still holds (extending its lease
    /// as the acquisition's terms say, never shortening it). One that does not (the lease ran
    /// out, the key was deleted, Redis restarted empty) is marked lost at once and reported,
    /// and `None` is returned: the caller makes a new acquisition, which another owner's grant
    /// keeps out. A re-entry counted on the lost hold would say "held" beside that owner.
    fn reenter(&self, read: bool, budget: &Budget) -> Result<Option<Arc<Hold>>> {
        let shared = self.client.shared();
        let keys = self.keys(read);
        let Some(hold) = shared.live_hold(keys) else {
            return Ok(None);
        };
        let sent = Instant::now();
        let call = rw_lock::reenter(
            &self.write_keys,
            hold.holder(),
            read,
            hold.reentry_extension(sent),
        );
        let reply = driver::within(&self.client, self.name(), budget, |by| {
            eval_twice(&self.client, &call, by)
        })?;
        match rw_lock::parse_reenter(&reply) {
            // Held by this acquisition: one more level (lost or released locally meanwhile:
            // a new acquisition).
            Some(true) => Ok(hold.enter(sent).then_some(hold)),
            Some(false) => {
                shared.report_lost(&hold);
                Ok(None)
            }
            None => Err(scripts::unexpected("rw reenter", &reply)),
        }
    }

    /// A read (`read`) or write call by `deadline`, through the driver (see
    /// `driver/mod.rs`).
    fn acquire(&self, read: bool, deadline: Deadline) -> Result<Option<Arc<Hold>>> {
        let mut call = Acquire {
            lock: self,
            read,
            owner: self.client.shared().owner(),
            request: request_id(),
        };
        let kind = if read { Kind::Read } else { Kind::Write };
        driver::acquire(&mut call, kind, deadline)
    }

    fn read_until(&self, deadline: Deadline) -> Result<Option<RwLockReadGuard>> {
        Ok(self
            .acquire(true, deadline)?
            .map(|h| RwLockReadGuard::new(self, h)))
    }

    fn write_until(&self, deadline: Deadline) -> Result<Option<RwLockWriteGuard>> {
        Ok(self
            .acquire(false, deadline)?
            .map(|h| RwLockWriteGuard::new(self, h)))
    }
}

/// The live readers in an `info` reply's `items` (its fifth), with the server clock `now` (µs).
fn readers_in(now: u64, items: &[Value]) -> Result<Vec<Holder>> {
    items
        .get(4)
        .and_then(|r| calls::holders_of(r, Shape::Reader, now))
        .ok_or_else(|| scripts::unexpected("rw readers", &Value::Array(items.to_vec())))
}

/// One read (`read`) or write call of an [`RwLock`], as acquisition `request` of `owner`.
struct Acquire<'a> {
    lock: &'a RwLock,
    read: bool,
    owner: String,
    request: String,
}

impl<'a> Protocol<'a> for Acquire<'a> {
    type Held = Arc<Hold>;

    /// The lock's writers' keys (its name).
    fn lock(&self) -> (&'a Core, &'a LockKeys) {
        (&self.lock.client, &self.lock.write_keys)
    }

    /// Readers wait on the readers' channel, writers on the writers'.
    fn channel(&self) -> &'a str {
        &self.lock.keys(self.read).channel
    }

    /// Every waiting reader of this client wakes on each message: they may all proceed. One
    /// writer per client asks Redis at a time; the others queue locally.
    fn queue(&self) -> Queue {
        if self.read {
            Queue::Together
        } else {
            Queue::Line
        }
    }

    /// A re-entry of the thread's live hold. A thread that holds a read lock but not the
    /// write lock cannot write: it would wait for itself.
    fn enter(&mut self, budget: &Budget) -> Result<Option<Arc<Hold>>> {
        if let Some(h) = self.lock.reenter(self.read, budget)? {
            return Ok(Some(h));
        }
        let shared = self.lock.client.shared();
        if !self.read && shared.live_hold(&self.lock.read_keys).is_some() {
            return Err(Error::misuse(
                "write: the calling thread holds a read lock of this RwLock; release it before \
                 writing",
            ));
        }
        Ok(None)
    }

    /// A reader tries at once whoever waits: readers do not exclude one another.
    fn defers(&self) -> bool {
        let shared = self.lock.client.shared();
        !self.read && shared.subscriber.has_waiters(self.channel())
    }

    /// One read or write attempt; a waiter's registers it as a waiter on the server, which
    /// counts it (writers defer new readers). A grant whose reply came so late that the lease
    /// may have run out is given back within `by`.
    fn attempt(&mut self, waiting: bool, by: Deadline) -> Result<Attempt<Arc<Hold>>> {
        let (lock, read, owner, request) = (self.lock, self.read, &self.owner, &self.request);
        let sent = Instant::now();
        let (terms, keys) = (lock.client.terms_with(lock.fixed_lease), &lock.write_keys);
        let (lease, prefer_writers) = (terms.lease, lock.prefer_writers);
        let call = if read {
            rw_lock::read(keys, owner, request, lease, prefer_writers, waiting)
        } else {
            rw_lock::write(keys, owner, request, lease, waiting)
        };
        let v = eval_twice(&lock.client, &call, by)?;
        let token = match calls::acquire_reply(&v, request, keys, "rw acquire")? {
            // One server entry per acquisition (re-entry is counted here), named by the server
            // after this call's request id.
            AcquireReply::Held {
                token, acquisition, ..
            } if acquisition == *request => token,
            AcquireReply::Busy { ttl } => return Ok(Attempt::busy(ttl)),
            _ => return Err(scripts::unexpected("rw acquire", &v)),
        };
        // A read grant has no fencing token (its fast reply is 1).
        let (kind, token) = if read {
            (Kind::Read, 0)
        } else {
            (Kind::Write, token)
        };
        let grant = Grant {
            token,
            count: 1,
            sent,
            acquisition: request,
            last: 0,
        };
        let shared = lock.client.shared();
        // `adopt_as` cannot refuse a new acquisition (count 1, a request id no hold has); if it
        // did, it is answered as not held, and the entry runs out by its lease.
        let hold = shared.adopt_as(kind, lock.keys(read), owner.clone(), grant, terms);
        let hold = hold.and_then(|h| unless_late(lock, h, "grant", by));
        Ok(hold.map_or(Attempt::busy(Duration::ZERO), Attempt::Held))
    }

    /// A renewal interval: a waiter's registration on the server must be refreshed.
    fn max_sleep(&self) -> Duration {
        self.lock.client.shared().config.renew_every
    }

    fn leave(&self, reg: Registration, seen: u64) {
        if self.read {
            drop(reg);
        } else {
            drop(reg.leave_acquired(seen));
        }
    }

    /// A waiting writer that gives up must not keep deferring readers out. A reader's
    /// registration would only cost a spurious wake-up; it expires alone.
    fn cancel(&mut self, by: Deadline) -> Result<Option<Arc<Hold>>> {
        if !self.read {
            let call = rw_lock::cancel(&self.lock.write_keys, &self.owner, &self.request);
            if let Err(e) = eval_twice(&self.lock.client, &call, by) {
                log::debug!("leaving the writers' queue of `{}`: {e}", self.lock.name());
            }
        }
        Ok(None)
    }
}

impl Release for RwLock {
    /// Releases one level of `hold` within `by`; at the outermost level, the server entry. A
    /// read guard's hold is of [`Kind::Read`], a write guard's of [`Kind::Write`].
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()> {
        let read = hold.kind == Kind::Read;
        let script = ("rw release", scripts::parse_family_release);
        // An inner level: the thread still holds the lock, and nothing is asked. Writers of
        // this client that queue behind the one that asks Redis are not registered on the
        // server, so no flag says they wait: the release publishes for them.
        let call = |level: Level| {
            (level == Level::Outermost).then(|| {
                let shared = self.client.shared();
                let publish = shared.subscriber.has_waiters(&self.write_keys.channel);
                rw_lock::release(self.keys(read), hold.holder(), read, publish)
            })
        };
        release_level(&self.client, hold, script, &self.write_keys.lock, by, call)
    }
}

/// The guard type `$name` of the `$what` of an [`RwLock`] (see `lease_guard!`).
macro_rules! guard {
    ($name:ident, $what:literal) => {
        lease_guard! { $name of RwLock, concat!("the ", $what, " of"), plain;
            #[doc = concat!("Releases this level of the ", $what, " and reports the outcome.")]
            ///
            /// It asks the server (an inner level excepted: re-entry is counted here).
            /// Returns within the connect timeout plus the command timeout (so does a drop).
            /// A release retried after a failed connection reports `Ok` only where the server
            /// shows that its first attempt released the lock (a writer by its fencing token,
            /// a reader by a short-lived marker its release leaves).
            ///
            /// # Errors
            ///
            /// [`Error::LeaseLost`] when the lease had run out (or Redis lost the lock in a
            /// restart); [`Error::NotOwner`] when
            /// another owner holds the lock now; [`Error::Redis`] when Redis could not be
            /// asked (the lease then runs out by itself, since renewal stopped).
        }
    };
}

/// A held read lock of an [`RwLock`]. Dropping it releases one level;
/// [`unlock`](RwLockReadGuard::unlock) does the same and reports errors. A lease, renewed
/// while the guard lives (unless the lock was made with a fixed lease, see
/// [`RwLock::with_lease`]): see [`MutexGuard`](crate::MutexGuard) for what that means.
///
/// A guard belongs to the thread that locked (its re-entry and release are that thread's): it
/// is `Sync` but not `Send`, and a hold moves to another thread through `detach` (see
/// [`MutexGuard`](crate::MutexGuard) and [`Detached`](crate::Detached)).
#[must_use = "if unused the read lock is released at once"]
#[clippy::has_significant_drop]
pub struct RwLockReadGuard {
    lease: Lease,
    _thread: ThreadBound,
}

/// The held write lock of an [`RwLock`]. Dropping it releases one level;
/// [`unlock`](RwLockWriteGuard::unlock) does the same and reports errors. A lease, renewed
/// while the guard lives (unless the lock was made with a fixed lease, see
/// [`RwLock::with_lease`]): see [`MutexGuard`](crate::MutexGuard) for what that means.
///
/// A guard belongs to the thread that locked (its re-entry and release are that thread's): it
/// is `Sync` but not `Send`, and a hold moves to another thread through `detach` (see
/// [`MutexGuard`](crate::MutexGuard) and [`Detached`](crate::Detached)).
#[must_use = "if unused the write lock is released at once"]
#[clippy::has_significant_drop]
pub struct RwLockWriteGuard {
    lease: Lease,
    _thread: ThreadBound,
}

guard!(RwLockReadGuard, "read lock");
guard!(RwLockWriteGuard, "write lock");
detachable!(RwLockReadGuard);
detachable!(RwLockWriteGuard);

impl RwLockWriteGuard {
    /// The fencing token of this write acquisition: strictly increasing per lock name, the
    /// same for nested write guards. Hand it to the resource with every write. It is the
    /// server clock at the grant in microseconds, or the highest token issued on the name's
    /// fencing mark + 1 where that is higher (the clock went back); tokens rise across a loss
    /// of the mark (an empty restart) under the conditions
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token) states.
    pub fn fencing_token(&self) -> u64 {
        self.lease.hold().token
    }
}

// A handle is shared across threads by design; guards are not.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RwLock>();
};
