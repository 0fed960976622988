//! [`Redlock`]: one lock over several independent Redis masters.

use std::time::Duration;

use crate::client::{Client, ClientBuilder, LostLease};
use crate::error::{Error, Result};
use crate::mutex::Mutex;

/// The default per-master timeout.
const DEFAULT_MASTER_TIMEOUT: Duration = Duration::from_millis(50);

/// A lock client over several independent Redis masters (typically 5): a lock is held when a
/// majority of them granted it, so it survives the loss of a minority of masters, including a
/// master that fails over before the lock reached its replica.
///
/// It is the same machinery as [`Client`] (owner ids, scripts, one subscriber thread, one
/// renewal thread, two threads in all), and its locks are the same [`Mutex`] type with the
/// same guards; [`MutexGuard::validity`](crate::MutexGuard::validity) tells how much longer
/// the lock is known held.
///
/// # The algorithm
///
/// - Acquire runs the acquire script on every master **at once**, each bounded by the
///   per-master timeout (default 50 ms). The lock is held when `N/2 + 1` masters granted it
///   and the validity `lease - elapsed - drift` is positive (`drift = lease x factor + 2 ms`).
///   Otherwise what was granted is released at once on every master, and the attempt is
///   retried: after a random delay on a split vote, or when a release is published (waiters
///   listen on one master; every release publishes on every master it reaches).
/// - Renewal extends the lease on every master; the guard stays held only while a majority
///   extended it in time, and is marked lost when a majority cannot be reached any more.
/// - Fewer than a majority answering gives [`Error::NoQuorum`] (retried by `lock()` for the
///   client's retry timeout, then returned).
///
/// # What it promises, and what it does not
///
/// - Mutual exclusion holds while a majority of masters keeps the lock (no master restarts
///   empty and no majority fails at once) and while process pauses, network delays and clock
///   *rate* differences stay well inside the validity. A master that restarts empty while a
///   lock is held is a minority and cannot let a second owner in by itself; restart masters
///   with a delay of one lease (or persistence) to keep it that way.
/// - It is still a lease: the published criticism of RedLock (a GC pause or a clock jump
///   longer than the validity lets two holders overlap) applies. The answer on the resource
///   side is the fencing token.
/// - **Fencing tokens**: the token is the largest of the counters of the masters that granted
///   the lock. Each release and each renewal raises every reached master's counter to the
///   holder's token. So tokens strictly increase whenever a majority of masters kept their
///   counters and the previous holder renewed or released at least once (any two majorities
///   share a master); independently of that, each token is at least the granting masters'
///   clock in microseconds, so tokens also increase whenever acquisitions are further apart
///   than the masters' clock skew.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> locksmith::Result<()> {
/// let quorum = locksmith::Redlock::builder([
///         "redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/", "redis://10.0.0.3:6379/",
///         "redis://10.0.0.4:6379/", "redis://10.0.0.5:6379/"])
///     .lease(Duration::from_secs(30))
///     .clock_drift_factor(0.01)
///     .build()?;
/// let lock = quorum.mutex("invoice:9")?;
/// let guard = lock.lock()?;
/// println!("held for at least {:?} more", guard.validity());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Redlock {
    client: Client,
    masters: usize,
}

impl Redlock {
    /// A builder over the given masters (at least one; an odd number, usually 3 or 5, is
    /// the sensible choice).
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        RedlockBuilder {
            inner: Client::builder(urls.first().map_or("", String::as_str)),
            urls,
            master_timeout: DEFAULT_MASTER_TIMEOUT,
        }
    }

    /// A handle on the lock called `name`, held on a majority of the masters.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] as for [`Client::mutex`].
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.client.mutex(name)
    }

    /// How many masters there are.
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// How many masters must grant a lock: a majority.
    pub fn quorum(&self) -> usize {
        self.masters / 2 + 1
    }
}

/// Builds a [`Redlock`]. The options not listed here are those of [`ClientBuilder`], with the
/// same defaults.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct RedlockBuilder {
    inner: ClientBuilder,
    urls: Vec<String>,
    master_timeout: Duration,
}

impl RedlockBuilder {
    /// The lease (default 30 s), as [`ClientBuilder::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.lease(lease);
        self
    }

    /// How often held leases are renewed (default: a third of the lease), as
    /// [`ClientBuilder::renew_interval`]: at most half the lease.
    pub fn renew_interval(mut self, every: Duration) -> Self {
        self.inner = self.inner.renew_interval(every);
        self
    }

    /// The share of the lease given up for clocks running at different rates (default
    /// 0.01); the drift allowed is `lease x factor + 2 ms`. From 0 to below 0.5.
    pub fn clock_drift_factor(mut self, factor: f64) -> Self {
        self.inner = self.inner.drift_factor(factor);
        self
    }

    /// The bound on one master's answer to one call (default 50 ms): far below the lease,
    /// so that a stalled master costs an attempt little of its validity. At least 1 ms and
    /// below half the lease.
    pub fn master_timeout(mut self, timeout: Duration) -> Self {
        self.master_timeout = timeout;
        self
    }

    /// The key prefix, as [`ClientBuilder::key_prefix`].
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.inner = self.inner.key_prefix(prefix);
        self
    }

    /// The bound on opening a connection (default 5 s; a quorum's connections use the
    /// smaller of this and the per-master timeout, but at least 50 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.connect_timeout(timeout);
        self
    }

    /// The bound on one command's round trip (default 5 s), as
    /// [`ClientBuilder::command_timeout`]. A lock call as a whole keeps the bounds of the
    /// crate's "Time bounds", with this and the connect timeout.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.command_timeout(timeout);
        self
    }

    /// How long a lock call keeps retrying without a quorum (default 10 s), as
    /// [`ClientBuilder::retry_timeout`].
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.retry_timeout(timeout);
        self
    }

    /// The longest time a lock is kept by renewal, as [`ClientBuilder::max_hold`].
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.inner = self.inner.max_hold(max);
        self
    }

    /// A callback for lost leases, as [`ClientBuilder::on_lease_lost`].
    pub fn on_lease_lost(mut self, f: impl Fn(&LostLease) + Send + Sync + 'static) -> Self {
        self.inner = self.inner.on_lease_lost(f);
        self
    }

    /// Checks the settings, connects to the masters that answer, and starts the two threads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] or [`Error::InvalidUrl`] for bad settings or URLs (before any
    /// I/O); [`Error::Redis`] when no master accepts a pub/sub connection; [`Error::Spawn`]
    /// when a thread cannot be started. Masters that are down at build time are tried again
    /// on every call.
    pub fn build(self) -> Result<Redlock> {
        if self.urls.is_empty() {
            return Err(Error::config("masters", "must name at least one Redis URL"));
        }
        let masters = self.urls.len();
        let client = self.inner.masters(self.urls, self.master_timeout).build()?;
        Ok(Redlock { client, masters })
    }
}
