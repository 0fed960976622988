//! [`Redlock`]: one lock over several independent Redis masters.

use crate::client::Client;
use crate::client::builder::ClientBuilder;

/// The quorum lock (RedLock), built with [`Client::redlock`]: one lock over several
/// independent Redis masters (typically 5). A lock is held when a majority of them granted
/// it, so it survives the loss of a minority of masters, including a master that fails over
/// before the lock reached its replica.
///
/// A quorum client is a [`Client`] like the others (owner ids, scripts, one subscriber
/// thread, one renewal thread, two threads in all), and its locks are the same
/// [`Mutex`](crate::Mutex) type with the
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
/// - Fewer than a majority answering gives [`Error::NoQuorum`](crate::Error::NoQuorum) (retried by `lock()` for the
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
/// - **Fencing tokens**: each granting master gives the larger of its clock in microseconds +
///   1 s + 1024 µs and its fencing counter + 1, and sets its counter to it; the token is the
///   largest of the granting masters'. Each release and each renewal raises every reached
///   master's counter to the holder's token. So tokens strictly increase whenever a majority
///   of masters kept their counters and the previous holder renewed or released at least once
///   (any two majorities share a master); independently of that, each token is at least the
///   granting masters' clock in microseconds + 1 s, so tokens also increase whenever
///   acquisitions are further apart than the masters' clock skew.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> locksmith::Result<()> {
/// let quorum = locksmith::Client::redlock([
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
#[derive(Debug, Clone, Copy)]
pub struct Redlock {
    _private: (),
}

impl Redlock {
    /// A builder over the given masters: the same as [`Client::redlock`], whose
    /// [`build`](ClientBuilder::build) gives a [`Client`].
    #[deprecated(
        since = "0.2.0",
        note = "use `Client::redlock`; it gives the same builder"
    )]
    pub fn builder<I, S>(urls: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::redlock(urls)
    }
}

/// The builder of a quorum client: [`ClientBuilder`], as returned by [`Client::redlock`].
#[deprecated(since = "0.2.0", note = "use `ClientBuilder`, from `Client::redlock`")]
pub type RedlockBuilder = ClientBuilder;
