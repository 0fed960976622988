//! The public face: [`Client`], a handle on one deployment, which makes the lock handles. A
//! client's settings are in `builder.rs`, how it connects is in `connect.rs`, the listing of
//! locks is in `inspect.rs`; what its clones, locks and threads share is in `src/shared/`.

use std::sync::Arc;

use crate::error::Result;
use crate::locks::fair_mutex::FairMutex;
use crate::locks::multi::MultiMutex;
use crate::locks::mutex::Mutex;
use crate::locks::mutex::election::Election;
use crate::locks::rwlock::RwLock;
use crate::locks::semaphore::Semaphore;
use crate::protocol::keys::{self, LockKeys};
use crate::shared::Core;
use crate::stats::Stats;

pub(crate) mod builder;
mod connect;
pub(crate) mod inspect;
pub(crate) mod server;

/// A connection to one Redis server, shared by all locks made from it.
///
/// A client owns a small pool of command connections, one pub/sub connection, and exactly
/// two background threads, whatever the number of locks and waiters:
/// `locksmith-pubsub` listens for releases and wakes local waiters, `locksmith-renew` extends
/// held leases in pipelined batches. Cloning is cheap and shares all of it; the threads stop
/// and are joined when the last clone (and the last [`Mutex`] made from it) is dropped, or
/// at once, with every lock released, by [`shutdown`](Client::shutdown).
///
/// Each client has a random id; together with a per-thread number it forms the *owner* of a
/// lock. So two clients are two owners, as two processes would be, and two threads of one
/// client are two owners too.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let lock = client.mutex("account:42")?;
/// let guard = lock.lock()?;
/// // ... read, change and write the account ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    core: Core,
}

// A client is shared across threads by design; pin that down.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<Mutex>();
    assert_send_sync::<MultiMutex>();
};

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.core.fmt(f)
    }
}

impl Client {
    /// A handle on the lock called `name`. Cheap: nothing is sent to Redis.
    ///
    /// Any UTF-8 name works (spaces, `*`, `?`, braces, unicode), and names never interfere:
    /// a release of `ab` never wakes waiters of `a*`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] when the name is empty, longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, or contains a NUL byte.
    ///
    /// [`Error::InvalidName`]: crate::Error::InvalidName
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.handle(name, |core, prefix| {
            Mutex::new(core, Arc::new(LockKeys::new(prefix, name)))
        })
    }

    /// A handle on several mutex locks taken together, all or none, without deadlock whatever
    /// order callers name them in (see [`MultiMutex`]). Each name is the lock
    /// [`mutex`](Client::mutex) gives for it, so the two exclude each other name by name.
    /// Duplicates collapse. Cheap: nothing is sent to Redis.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) when there is no name, or a name is
    /// invalid as for [`mutex`](Client::mutex).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let pair = client.multi_lock(["account:1", "account:2"])?;
    /// let guard = pair.lock()?; // both, or (with the try_ forms) neither
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<I, S>(&self, names: I) -> Result<MultiMutex>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.core.shared().ensure_open()?;
        MultiMutex::new(self.core.clone(), names)
    }

    /// A handle on the fair mutex called `name`: waiters get it in arrival order, across
    /// processes, and a release hands it directly to the next waiter. Cheap: nothing is sent
    /// to Redis. Its keys are its own: a [`Mutex`] of the same name is another lock.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] as for [`mutex`](Client::mutex).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let printer = client.fair_mutex("printer")?;
    /// let guard = printer.lock()?; // waiters are served first come, first served
    /// guard.unlock()?; // hands the lock to the next waiter in the queue
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::InvalidName`]: crate::Error::InvalidName
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        self.handle(name, |core, prefix| FairMutex::new(core, prefix, name))
    }

    /// A handle on the counting semaphore called `name`, with `permits` permits: at most
    /// that many are held at once across processes, each acquisition a lease renewed while
    /// held. Cheap: nothing is sent to Redis. See [`Semaphore`] for what changing `permits`
    /// of a live semaphore does.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] as for [`mutex`](Client::mutex); [`Error::InvalidConfig`] when
    /// `permits` is 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let pool = client.semaphore("db-connections", 20)?;
    /// let _permit = pool.acquire()?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::InvalidName`]: crate::Error::InvalidName
    /// [`Error::InvalidConfig`]: crate::Error::InvalidConfig
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        self.handle(name, |core, prefix| {
            Semaphore::new(core, prefix, name, permits)
        })?
    }

    /// A handle on the read-write lock called `name`: many readers at once or one writer,
    /// across processes, with writer preference by default. Cheap: nothing is sent to Redis.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] as for [`mutex`](Client::mutex).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let catalog = client.rw_lock("catalog")?;
    /// let _r = catalog.read()?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::InvalidName`]: crate::Error::InvalidName
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        self.handle(name, |core, prefix| RwLock::new(core, prefix, name))
    }

    /// A handle on the election called `name` (see [`Election`]): one candidate leads at a
    /// time, and everyone can see which, with its term and the value it proclaimed. On every
    /// deployment a [`Mutex`] runs on: one server, Sentinel, a cluster, a quorum of masters.
    /// Cheap: nothing is sent to Redis. An election's keys are its own: a `Mutex` of the same
    /// name is another lock.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] as for [`mutex`](Client::mutex).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// if let Some(leader) = client.election("scheduler")?.leader()? {
    ///     println!("led by {} (term {}): {:?}", leader.label, leader.term, leader.value);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::InvalidName`]: crate::Error::InvalidName
    pub fn election(&self, name: &str) -> Result<Election> {
        self.handle(name, |core, prefix| Election::new(core, prefix, name))
    }

    /// The handle `make` makes from the client and its key prefix, once `name` is known to be
    /// a valid name.
    fn handle<T>(&self, name: &str, make: impl FnOnce(Core, &str) -> T) -> Result<T> {
        self.core.shared().ensure_open()?;
        keys::validate_name(name)?;
        Ok(make(self.core.clone(), &self.core.shared().config.prefix))
    }

    /// How many masters this client locks on: 1 for one server and for Sentinel, `N` for a
    /// quorum client; 1 for a cluster client (each lock lives on the one master of its slot).
    pub fn masters(&self) -> usize {
        self.core.shared().backend.masters()
    }

    /// How many masters must grant a lock: a majority (`masters() / 2 + 1`).
    pub fn quorum(&self) -> usize {
        self.masters() / 2 + 1
    }

    /// What this client counted of its locks' activity since it was built: acquisitions
    /// (local hand-offs, contended ones), calls that timed out, lost leases, renewals,
    /// pub/sub reconnects, and the distributions of wait and hold times. [`Stats`] says
    /// precisely what each counts.
    ///
    /// Every clone of the client, and every lock and guard made from it, counts into the
    /// same counters. Cheap: it reads a few hundred relaxed atomics, sends nothing to Redis
    /// and takes no lock that a lock call takes; counting costs each lock call a few relaxed
    /// atomic additions.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// client.mutex("report")?.lock()?.unlock()?;
    /// let stats = client.stats();
    /// println!(
    ///     "{} acquired ({} contended), wait p99 {:?}, hold max {:?}",
    ///     stats.acquired,
    ///     stats.contended,
    ///     stats.wait.p99(),
    ///     stats.hold.max()
    /// );
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> Stats {
        self.core.shared().stats.snapshot()
    }

    /// Shuts the client down, for every clone of it, within `timeout`: releases what it
    /// holds, stops its two threads and joins them. For a program that stops (or replaces a
    /// client) and must not leave its locks to their leases.
    ///
    /// What it holds is released best effort: every lease it renews (held guards, detached
    /// holds, permits, a leadership) and every hold of a fixed lease (`with_lease`, on
    /// whichever thread, detached or not), each with its lock type's release, one after
    /// another within `timeout` (a failure is logged at `debug`; that lock then frees itself
    /// when its lease runs out, since it is no longer renewed).
    ///
    /// Afterwards, on every clone and every lock handle made from it: each guard reads as not
    /// held, dropping one does nothing, and its `unlock` (and a `Detached`'s, a permit's
    /// `release`, a leadership's `resign`) returns [`Error::Shutdown`]; every call that would
    /// ask Redis (a lock, an `is_locked`, a new handle) returns [`Error::Shutdown`] before it
    /// sends anything; a call waiting for a lock ends with it. [`stats`](Client::stats) still
    /// reads. Guards may be dropped before or after it, in any thread.
    ///
    /// Takes `&self`: any clone, in any thread, may call it, any number of times. The first
    /// call starts the shutdown; each call returns once both threads have ended, or at its
    /// own `timeout`. A shutdown from a client's own
    /// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) callback does not wait for the
    /// renewal thread it runs on (which ends when the callback returns).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when a thread had not ended within `timeout` (Redis stalled in the
    /// middle of a renewal batch, which ends within half a renewal interval): the client is
    /// shut down all the same, and the threads end by themselves; the last clone's drop, or
    /// another call, joins them.
    ///
    /// [`Error::Shutdown`]: crate::Error::Shutdown
    /// [`Error::Timeout`]: crate::Error::Timeout
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let worker = client.clone();
    /// std::thread::spawn(move || -> locksmith::Result<()> {
    ///     let _job = worker.mutex("job:7")?.lock()?;
    ///     // ... work until the process is told to stop ...
    ///     Ok(())
    /// });
    /// // On SIGTERM: release whatever the workers hold, without waiting for them.
    /// client.shutdown(Duration::from_secs(2))?;
    /// # Ok(()) }
    /// ```
    pub fn shutdown(&self, timeout: std::time::Duration) -> Result<()> {
        self.core.shutdown(timeout)
    }
}
