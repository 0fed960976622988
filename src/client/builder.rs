//! [`ClientBuilder`], and the entry points that give one ([`Client::open`],
//! [`Client::builder`], [`Client::sentinel`], [`Client::redlock`], [`Client::cluster`]):
//! the topology, the settings (their setters made by one `setters!` macro, each with its
//! docs) and their checks. How a builder connects ([`ClientBuilder::build`]:
//! the connections, the TLS set-up and the start of the client's two threads) is in
//! `connect.rs`.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisConnectionInfo;

use super::Client;
use super::server::{IntoServer, Server};
use crate::error::{Result, ensure};
use crate::protocol::keys;
use crate::shared::config::validate_max_hold;
use crate::shared::config::{Config, HandoffBound, MAX_HANDOFF_COUNT, MAX_LEASE, MIN_LEASE};
use crate::shared::holder;
use crate::shared::renewal::{LostHook, LostLease};
use crate::transport::conn::{self, Timeouts};
use crate::transport::tls::TlsCerts;

/// The default per-master timeout of a quorum client.
pub(super) const DEFAULT_MASTER_TIMEOUT: Duration = Duration::from_millis(50);

/// Which servers a client locks on.
#[derive(Clone)]
pub(super) enum Topology {
    /// One server (or why the one given cannot be used).
    Single(Server),
    /// The master a Sentinel deployment names.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
    /// Independent masters, a majority of which must grant a lock (RedLock).
    Quorum(Vec<String>),
    /// A Redis Cluster, found through any of these seed nodes.
    Cluster(Vec<String>),
}

/// The URLs redacted ([`conn::redact`]), a server given otherwise by its address: a
/// builder's `Debug` never shows a password.
impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls = |urls: &[String]| urls.iter().map(|u| conn::redact(u)).collect::<Vec<_>>();
        match self {
            Topology::Single(server) => f.debug_tuple("Single").field(server).finish(),
            Topology::Sentinel { sentinels, master } => f
                .debug_struct("Sentinel")
                .field("sentinels", &urls(sentinels))
                .field("master", master)
                .finish(),
            Topology::Quorum(masters) => f.debug_tuple("Quorum").field(&urls(masters)).finish(),
            Topology::Cluster(seeds) => f.debug_tuple("Cluster").field(&urls(seeds)).finish(),
        }
    }
}

impl Topology {
    /// Each list of URLs names one at least, and a Sentinel master has a name.
    fn validate(&self) -> Result<()> {
        let (field, urls, what) = match self {
            Topology::Single(_) => return Ok(()),
            Topology::Quorum(urls) => ("masters", urls, "Redis URL"),
            Topology::Cluster(urls) => ("seeds", urls, "cluster node URL"),
            Topology::Sentinel { sentinels, .. } => ("sentinels", sentinels, "sentinel URL"),
        };
        let why = format!("must name at least one {what}");
        ensure(!urls.is_empty(), field, why)?;
        let nameless = matches!(self, Topology::Sentinel { master, .. } if master.is_empty());
        ensure(!nameless, "master_name", "must not be empty")
    }
}

/// Builds a [`Client`] with settings other than the defaults.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::builder("redis://127.0.0.1:6379/")
///     .lease(Duration::from_secs(10))
///     .key_prefix("billing:")
///     .command_timeout(Duration::from_secs(2))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct ClientBuilder {
    pub(super) topology: Topology,
    /// Per-master timeout of a quorum client (`None`: the default, 50 ms).
    pub(super) master_timeout: Option<Duration>,
    pub(super) drift_factor: f64,
    /// Replicas that must confirm each acquire and renewal, and how long to wait for them.
    wait_replicas: Option<(usize, Duration)>,
    lease: Duration,
    renew_every: Option<Duration>,
    prefix: String,
    label: Option<String>,
    connect_timeout: Duration,
    command_timeout: Duration,
    retry_timeout: Duration,
    max_hold: Option<Duration>,
    pub(super) on_lost: Option<LostHook>,
    pub(super) tls: TlsCerts,
    /// The Sentinel master's credentials (the `redis` crate's `Debug` never shows the
    /// password).
    master_auth: Option<RedisConnectionInfo>,
    /// The Sentinel master's database.
    master_db: Option<i64>,
    local_handoff: bool,
    local_handoff_max_count: u32,
    local_handoff_max_time: Duration,
    local_handoff_give_way: Duration,
    /// The metrics carry the lock's name as a label.
    pub(super) metrics_lock_names: bool,
}

/// The builder's setters: each stores its argument (as the expression after `=>` makes it)
/// in its field and gives the builder back; [`build`](ClientBuilder::build) checks them all.
/// `pub fn name(arg: T) => field = value;` stands for
/// `pub fn name(mut self, arg: T) -> Self { self.field = value; self }`, with the doc
/// comments written above it.
macro_rules! setters {
    ($($(#[$attr:meta])*
    pub fn $name:ident($($arg:ident: $ty:ty),+) => $($field:ident).+ = $value:expr;)+) => {
        impl ClientBuilder {
            $($(#[$attr])*
            pub fn $name(mut self, $($arg: $ty),+) -> Self {
                self.$($field).+ = $value;
                self
            })+
        }
    };
}

setters! {
    /// Whether a [`Mutex`] released while other threads of this client wait for it is handed
    /// to the next of them directly, without a round trip to Redis (default: on).
    ///
    /// The lock then stays held on the server by this client, and this client's queue of
    /// waiting threads (first come, first served) decides who holds it next. Each hand-off is
    /// an acquisition of its own: a new fencing token (strictly higher, as from Redis), a
    /// guard whose lease, renewal, [`is_held`](crate::MutexGuard::is_held),
    /// [`check`](crate::MutexGuard::check), re-entry and maximum hold time behave as after
    /// an acquisition through Redis.
    ///
    /// **Trade-off**: hand-offs make a hot lock much faster for the threads of one process,
    /// and less fair to other processes, whose waiters cannot win the lock while it passes
    /// from thread to thread here. The run is bounded: after 16 hand-offs in a row, or once
    /// 10 ms have passed since the lock was taken through Redis, the next release goes
    /// through Redis and wakes every waiter, remote ones included. So a remote waiter is kept
    /// out by one run at most (10 ms plus one critical section at a time, the run's last
    /// holder's). After each run that others heard, this client's threads give them a head
    /// start of up to 5 ms (they wait for as many later releases as others heard the release,
    /// or that long, whichever comes first), so that a remote waiter does not lose run after
    /// run to them. Turn it off where strict fairness between processes matters more than
    /// throughput (or use a [`FairMutex`], which never hands off locally).
    ///
    /// Each acquisition through Redis reserves the fencing tokens of its run's hand-offs,
    /// unless the lock's token counter is already 1 s ahead of the server's clock (see
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token)): such an acquisition
    /// reserves none, and its release goes through Redis.
    ///
    /// Not for quorum clients ([`Client::redlock`]): each of their acquisitions is granted
    /// by a majority of masters, so the option is accepted there and has no effect. Locks
    /// with a fixed lease ([`Mutex::with_lease`]) are never handed off either: a fixed lease
    /// ends a fixed time after an acquisition through Redis.
    ///
    /// [`Mutex`]: crate::Mutex
    /// [`FairMutex`]: crate::FairMutex
    /// [`Mutex::with_lease`]: crate::Mutex::with_lease
    pub fn local_handoff(on: bool) => local_handoff = on;

    /// How many local hand-offs in a row may follow an acquisition through Redis (default 16;
    /// from 1 to 1024). Hidden: the bounds of a run are the library's own; tests that need a
    /// run of a known length set it.
    #[doc(hidden)]
    pub fn local_handoff_max_count(count: u32) => local_handoff_max_count = count;

    /// How long after an acquisition through Redis local hand-offs may still start (default
    /// 10 ms; more than zero, at most the lease). Hidden, as
    /// [`local_handoff_max_count`](Self::local_handoff_max_count).
    #[doc(hidden)]
    pub fn local_handoff_max_time(time: Duration) => local_handoff_max_time = time;

    /// How long this client's waiting threads let others go first after a release through
    /// Redis that others heard (default 5 ms; from zero to the lease). Hidden, as
    /// [`local_handoff_max_count`](Self::local_handoff_max_count).
    #[doc(hidden)]
    pub fn local_handoff_give_way(time: Duration) => local_handoff_give_way = time;

    /// The watchdog lease (default 30 s): how long a lock stays held after its holder stops
    /// renewing it, for example because its process died. Held locks are renewed every
    /// third of it. At least 30 ms, at most 365 days.
    pub fn lease(lease: Duration) => lease = lease;

    /// How often held leases are renewed (default: a third of the lease). At least 10 ms and
    /// at most half the lease. A renewal's I/O is bounded by half this interval: a try on a
    /// pooled connection (at most a quarter of the interval, or the command timeout if
    /// shorter), then, if that connection failed or stayed silent, one on a new connection.
    pub fn renew_interval(every: Duration) => renew_every = Some(every);

    /// The prefix of every Redis key and channel (default `"locksmith:"`). At most 256
    /// bytes, without `{` or `}` (they would move the Redis Cluster hash tag).
    pub fn key_prefix(prefix: impl Into<String>) => prefix = prefix.into();

    /// A short human label for this client (default `"<hostname>:<pid>"`), stored with every
    /// lock it holds so that [`Mutex::holder`](crate::Mutex::holder),
    /// [`Client::locks`](crate::Client::locks) and the `locksmith` command-line tool can say
    /// who holds a lock. Not empty, at most 128 bytes,
    /// no control characters; checked by [`build`](Self::build) (`Error::InvalidConfig`).
    /// Anyone who can read the lock keys can read it: put no secret in it.
    pub fn label(label: impl Into<String>) => label = Some(label.into());

    /// The bound on opening a connection (default 5 s): the TCP connect and the `AUTH` /
    /// `SELECT` handshake together. See the crate's "Time bounds" for how it adds up with the
    /// command timeout in each call.
    pub fn connect_timeout(timeout: Duration) => connect_timeout = timeout;

    /// The bound on one command's round trip (default 5 s). A renewal uses the shorter of this
    /// and a quarter of the renewal interval, so a long command timeout never costs a lease.
    pub fn command_timeout(timeout: Duration) => command_timeout = timeout;

    /// The bound on one master's answer to one call of a quorum client (default 50 ms): far
    /// below the lease, so that a stalled master costs an attempt little of its validity. At
    /// least 1 ms and below half the lease. A quorum's connections open within the smaller of
    /// the connect timeout and this (but at least 50 ms).
    ///
    /// Applies to [`Client::redlock`] only: set on another topology, `build()` refuses it with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig).
    pub fn master_timeout(timeout: Duration) => master_timeout = Some(timeout);

    /// The share of the lease given up for clocks running at different rates (default 0.01);
    /// the drift allowed is `lease x factor + 2 ms`. From 0 to below 0.5.
    ///
    /// With [`Client::redlock`] it shortens the validity of a quorum grant. On every topology
    /// it also sets the margin of a guard's local lease deadline
    /// ([`MutexGuard::is_held`](crate::MutexGuard::is_held) turns false this much before the
    /// lease ends, measured from the send time of the last acquire or renewal).
    pub fn clock_drift_factor(factor: f64) => drift_factor = factor;

    /// Asks the master, after each acquire and each renewal, to confirm that at least
    /// `replicas` replicas have the write (`WAIT replicas timeout`, pipelined in the same round
    /// trip as the script). Off by default.
    ///
    /// When fewer confirm within `timeout`, the acquisition is undone (a re-entry counts one
    /// level down) and the call fails with
    /// [`Error::NotReplicated`](crate::Error::NotReplicated); no key is left behind. A renewal
    /// that is not confirmed keeps the guard and logs a `warn`.
    ///
    /// Each call's bound grows by `timeout`, and by one more command timeout for the undo
    /// after a refusal (see the crate's "Time bounds"). `timeout` is at least 1 ms and at most
    /// a quarter of the renewal interval, so that a renewal's wait fits in its slot.
    ///
    /// This **narrows, not closes**, the failover window: a lock confirmed by `n` replicas
    /// survives a failover to one of them, but the replicas may still lose it (a promoted
    /// replica that had not got it, a restart without persistence), and Redis's `WAIT` does
    /// not make the write strongly consistent. Fencing tokens remain the resource's defence;
    /// [`Client::redlock`] is the choice when losing a lock in a failover is not acceptable.
    /// One server and Sentinel only: refused on a quorum client.
    pub fn wait_replicas(replicas: usize, timeout: Duration) =>
        wait_replicas = Some((replicas, timeout));

    /// How long a lock call keeps retrying while Redis cannot be reached (connection refused,
    /// reset or timed out) before it returns the error (default 10 s), counted from the start
    /// of the first attempt that failed; no attempt runs past it. Also bounded by the call's
    /// own deadline; [`try_lock`](crate::Mutex::try_lock) retries once at most, within its
    /// bound.
    pub fn retry_timeout(timeout: Duration) => retry_timeout = timeout;

    /// The longest time any lock of this client is kept by renewal (default: no limit).
    /// After it, renewal stops and the lease runs out, so a holder that is alive but stuck
    /// cannot keep a lock forever; its guard then reports [`is_held`](crate::MutexGuard::is_held)
    /// false. Per lock: [`Mutex::with_max_hold`].
    ///
    /// [`Mutex::with_max_hold`]: crate::Mutex::with_max_hold
    pub fn max_hold(max: Duration) => max_hold = Some(max);

    /// A callback told, once per lease, when a lease is lost while a guard of it still exists:
    /// the key vanished or has another owner (found by a renewal, or by a re-entry or an inner
    /// release of the holding thread), or the lease ran out before it could be renewed (Redis
    /// unreachable, the renewal thread late). Leases that end by design (a fixed lease, or
    /// the maximum hold time) are not reported. It runs on the renewal thread: keep it short
    /// and never block in it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::builder("redis://127.0.0.1:6379/")
    ///     .on_lease_lost(|lost| eprintln!("lost lock {} (token {})", lost.name, lost.fencing_token))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn on_lease_lost(f: impl Fn(&LostLease) + Send + Sync + 'static) =>
        on_lost = Some(LostHook(Arc::new(f)));

    /// Whether the metrics (with the `metrics` feature) carry a `name` label, the lock's name
    /// (a [`MultiMutex`](crate::MultiMutex)'s names joined by `,`), besides their `type`
    /// label. Off by default: the number of lock names is unbounded, and each name makes a
    /// time series of every metric in the metrics backend. Turn it on only for a small, fixed
    /// set of names. [`Client::stats`](crate::Client::stats) never tells names apart.
    #[cfg(feature = "metrics")]
    pub fn metrics_lock_names(on: bool) => metrics_lock_names = on;

    /// Trusts the CA whose certificate (PEM) is given, for `rediss://` connections, instead
    /// of the system's root certificates (for a private CA, or a managed service's own). The
    /// PEM may hold several certificates. Checked by [`build`](Self::build).
    pub fn tls_root_cert(pem: impl Into<Vec<u8>>) => tls.root = Some(pem.into());

    /// Presents this client certificate and its private key (both PEM) on `rediss://`
    /// connections, for servers that require mutual TLS (`tls-auth-clients yes`). Checked by
    /// [`build`](Self::build).
    pub fn tls_client_cert(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) =>
        tls.client = Some((cert_pem.into(), key_pem.into()));

    /// The credentials of the master found through Sentinel: `AUTH [username] password` on
    /// every connection to it, command and pub/sub (default: none). A sentinel URL's own
    /// `user:pass@` authenticates to that sentinel only; the master usually has other
    /// credentials. `username` `None` is the `default` user (a `requirepass` password).
    ///
    /// Applies to [`Client::sentinel`] only (other topologies take the credentials from their
    /// URLs): set on another topology, or with an empty password or user name, `build()`
    /// refuses it with [`Error::InvalidConfig`](crate::Error::InvalidConfig). A wrong password
    /// fails `build()` with the server's refusal.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = locksmith::Client::sentinel(
    ///     ["rediss://sentinel:s3cret@10.0.0.1:26379", "rediss://sentinel:s3cret@10.0.0.2:26379"],
    ///     "mymaster",
    /// )
    /// .tls_root_cert(std::fs::read("ca.crt")?)
    /// .master_auth(Some("locksmith"), "m4ster-s3cret")
    /// .master_db(2)
    /// .build()?;
    /// # Ok(()) }
    /// ```
    pub fn master_auth(username: Option<&str>, password: &str) => master_auth = Some(
        match username {
            Some(user) => RedisConnectionInfo::default().set_username(user),
            None => RedisConnectionInfo::default(),
        }
        .set_password(password),
    );

    /// The database of the master found through Sentinel (`SELECT db` on every command
    /// connection; default 0). Applies to [`Client::sentinel`] only (other topologies take it
    /// from their URLs' `/db`): set on another topology, or negative, `build()` refuses it with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig). A database the server does not
    /// have fails `build()` with the server's refusal.
    pub fn master_db(db: i64) => master_db = Some(db);
}

impl ClientBuilder {
    pub(super) fn config(&self) -> Result<Config> {
        let label_part = match &self.label {
            Some(l) => {
                holder::validate_label(l)?;
                holder::encode_part(l)
            }
            None => holder::encode_part(&holder::default_label()),
        };
        let lease = self.lease;
        ensure(
            lease >= MIN_LEASE,
            "lease",
            format!("must be at least {MIN_LEASE:?}"),
        )?;
        ensure(lease <= MAX_LEASE, "lease", "must be at most 365 days")?;
        let renew_every = self.renew_every.unwrap_or(lease / 3);
        // A renewal is sent `renew_every` after the last one and may take half that (a try on
        // a pooled connection, then one on a new connection); past half the lease, a renewal
        // delayed by the one before it could end after the lease did.
        ensure(
            renew_every <= lease / 2,
            "renew_interval",
            format!(
                "must be at most half the lease ({:?} of {lease:?}), so that a renewal and its \
                 retry end before the lease does",
                lease / 2
            ),
        )?;
        let ms = Duration::from_millis(1);
        let why = "must be at least 10ms";
        ensure(renew_every >= 10 * ms, "renew_interval", why)?;
        for (field, timeout) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
        ] {
            ensure(timeout >= ms, field, "must be at least 1ms")?;
        }
        if let Some(max) = self.max_hold {
            validate_max_hold(max)?;
        }
        keys::validate_prefix(&self.prefix)?;
        self.topology.validate()?;
        let why = "must be at least 0 and below 0.5";
        ensure(
            (0.0..0.5).contains(&self.drift_factor),
            "clock_drift_factor",
            why,
        )?;
        let quorum = matches!(self.topology, Topology::Quorum(_));
        let why = "applies to a quorum client (Client::redlock) only";
        ensure(
            self.master_timeout.is_none() || quorum,
            "master_timeout",
            why,
        )?;
        if let Some(t) = self
            .master_timeout
            .or(quorum.then_some(DEFAULT_MASTER_TIMEOUT))
        {
            let why = "must be at least 1ms and below half the lease";
            ensure(t >= ms && t < lease / 2, "master_timeout", why)?;
        }
        if let Some((n, t)) = self.wait_replicas {
            let cluster = matches!(self.topology, Topology::Cluster(_));
            let replicas = "wait_replicas";
            ensure(!cluster, replicas, "is not supported on a cluster client")?;
            let why = "applies to one server or Sentinel, not to a quorum client";
            ensure(!quorum, replicas, why)?;
            ensure(n > 0, replicas, "must ask for at least 1 replica")?;
            let slot = renew_every / 4;
            let why = format!(
                "timeout must be at least 1ms and at most a quarter of the renewal interval \
                 ({slot:?})"
            );
            ensure(t >= ms && t <= slot, replicas, why)?;
        }
        let off = "(turn hand-offs off with local_handoff(false))";
        ensure(
            (1..=MAX_HANDOFF_COUNT).contains(&self.local_handoff_max_count),
            "local_handoff_max_count",
            format!("must be from 1 to {MAX_HANDOFF_COUNT} {off}"),
        )?;
        let time = self.local_handoff_max_time;
        let why = format!("must be more than zero and at most the lease ({lease:?}) {off}");
        ensure(
            !time.is_zero() && time <= lease,
            "local_handoff_max_time",
            why,
        )?;
        let why = format!("must be at most the lease ({lease:?}) (zero turns it off)");
        ensure(
            self.local_handoff_give_way <= lease,
            "local_handoff_give_way",
            why,
        )?;
        let handoff = (self.local_handoff && !quorum).then_some(HandoffBound {
            max_count: self.local_handoff_max_count,
            max_time: time,
            give_way: self.local_handoff_give_way,
        });
        Ok(Config {
            handoff,
            wait_replicas: self.wait_replicas,
            lease,
            renew_every,
            prefix: self.prefix.clone(),
            label: label_part,
            timeouts: Timeouts {
                connect: self.connect_timeout,
                command: self.command_timeout,
            },
            retry_timeout: self.retry_timeout,
            max_hold: self.max_hold,
        })
    }

    /// The Sentinel master's credentials and database, checked.
    pub(super) fn master_settings(&self) -> Result<RedisConnectionInfo> {
        let sentinel = matches!(self.topology, Topology::Sentinel { .. });
        let elsewhere = |what: &str, url: &str| {
            format!(
                "applies to a Sentinel client (Client::sentinel) only; put the {what} in the URL \
                 ({url})"
            )
        };
        let settings = self.master_auth.clone().unwrap_or_default();
        if self.master_auth.is_some() {
            let field = "master_auth";
            let why = elsewhere("credentials", "redis://user:password@host");
            ensure(sentinel, field, why)?;
            let empty = settings.password().is_none_or(str::is_empty);
            ensure(!empty, field, "the password must not be empty")?;
            let why = "the user name must not be empty (None is the default user)";
            ensure(settings.username() != Some(""), field, why)?;
        }
        if let Some(db) = self.master_db {
            let why = elsewhere("database", "redis://host/db");
            ensure(sentinel, "master_db", why)?;
            ensure(db >= 0, "master_db", "must not be negative")?;
            return Ok(settings.set_db(db));
        }
        Ok(settings)
    }
}

impl Client {
    /// Connects with the default settings to `server`: a URL (`&str` or `String`), or a
    /// [`redis::ConnectionInfo`] the program already has (see [`IntoServer`]). A 30 s lease
    /// renewed every 10 s, key prefix `"locksmith:"`, 5 s connect and command timeouts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    /// let client = locksmith::Client::open(url)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::build`].
    pub fn open(server: impl IntoServer) -> Result<Client> {
        Self::builder(server).build()
    }

    /// A builder for a client of `server` (a URL or a [`redis::ConnectionInfo`], as
    /// [`Client::open`] takes it) with other settings. A server that cannot be used is
    /// reported by [`build`](ClientBuilder::build)
    /// ([`Error::InvalidUrl`](crate::Error::InvalidUrl)).
    pub fn builder(server: impl IntoServer) -> ClientBuilder {
        Self::with_topology(Topology::Single(Server::new(server)))
    }

    /// A builder for a client of the master that the Sentinel deployment calls `master_name`:
    /// found through any sentinel of `sentinel_urls` that answers, and followed through
    /// failovers (see the crate's "Deployments"). The same options as [`Client::builder`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::sentinel(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "mymaster",
    /// )
    /// .build()?;
    /// let lock = client.mutex("invoice:9")?;
    /// let guard = lock.lock()?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel<I: IntoIterator<Item = S>, S: AsRef<str>>(
        sentinel_urls: I,
        master_name: &str,
    ) -> ClientBuilder {
        Self::with_topology(Topology::Sentinel {
            sentinels: owned(sentinel_urls),
            master: master_name.to_owned(),
        })
    }

    /// A builder for a quorum (RedLock) client over several independent masters (at least
    /// one; an odd number, usually 3 or 5, is the sensible choice): a lock is held when a
    /// majority of them granted it, so it survives the loss of a minority of masters,
    /// including a master that fails over before the lock reached its replica. The same
    /// options as [`Client::builder`], plus [`master_timeout`](ClientBuilder::master_timeout);
    /// a quorum client never hands a lock off locally
    /// ([`local_handoff`](ClientBuilder::local_handoff) has no effect): every acquisition is
    /// granted by a majority. A quorum client is a [`Client`] like the others (owner ids,
    /// scripts, one subscriber thread, one renewal thread), and its locks are the same
    /// [`Mutex`](crate::Mutex) with the same guards;
    /// [`MutexGuard::validity`](crate::MutexGuard::validity) tells how much longer the lock is
    /// known held.
    ///
    /// # The algorithm
    ///
    /// - Acquire runs the acquire script on every master **at once**, each bounded by the
    ///   per-master timeout (default 50 ms). The lock is held when `N/2 + 1` masters granted
    ///   it and the validity `lease - elapsed - drift` is positive (`drift = lease x factor +
    ///   2 ms`). Otherwise what was granted is released at once on every master, and the
    ///   attempt is retried: after a random delay on a split vote, or when a release is
    ///   published (waiters listen on one master; every release publishes on every master it
    ///   reaches).
    /// - Renewal extends the lease on every master; the guard stays held only while a majority
    ///   extended it in time, and is marked lost when a majority cannot be reached any more.
    /// - Fewer than a majority answering gives [`Error::NoQuorum`](crate::Error::NoQuorum)
    ///   (retried by `lock()` for the client's retry timeout, then returned).
    ///
    /// # What it promises, and what it does not
    ///
    /// - Mutual exclusion holds while a majority of masters keeps the lock (no master restarts
    ///   empty and no majority fails at once) and while process pauses, network delays and
    ///   clock *rate* differences stay well inside the validity. A master that restarts empty
    ///   while a lock is held is a minority and cannot let a second owner in by itself;
    ///   restart masters with a delay of one lease (or persistence) to keep it that way.
    /// - It is still a lease: the published criticism of RedLock (a GC pause or a clock jump
    ///   longer than the validity lets two holders overlap) applies. The answer on the
    ///   resource side is the fencing token.
    /// - **Fencing tokens**: each granting master gives a token above its fencing mark (the
    ///   highest token it issued or was told of; its clock in microseconds when that is
    ///   higher) and raises the mark to it; the lock's token is the largest of the granting
    ///   masters'. Each release and each renewal raises every reached master's mark to the
    ///   holder's token. So tokens strictly increase whenever a majority of masters kept
    ///   their marks and the previous holder renewed or released at least once (any two
    ///   majorities share a master), whatever the masters' clocks say; where that does not
    ///   hold (a majority lost its marks), tokens still increase when acquisitions are further
    ///   apart than the masters' clock skew.
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
    ///     .master_timeout(Duration::from_millis(50))
    ///     .build()?;
    /// let lock = quorum.mutex("invoice:9")?;
    /// let guard = lock.lock()?;
    /// println!("held for at least {:?} more", guard.validity());
    /// # Ok(()) }
    /// ```
    pub fn redlock<I: IntoIterator<Item = S>, S: AsRef<str>>(master_urls: I) -> ClientBuilder {
        Self::with_topology(Topology::Quorum(owned(master_urls)))
    }

    /// A builder for a client of a Redis Cluster, found through any node of `seed_urls` that
    /// answers (one is enough; several survive the loss of some). The same options as
    /// [`Client::builder`], TLS and ACL included: every node is reached with the seeds'
    /// scheme, user and password. Not accepted here:
    /// [`master_timeout`](ClientBuilder::master_timeout) (quorum clients only),
    /// [`wait_replicas`](ClientBuilder::wait_replicas), and a database other than 0.
    ///
    /// Each lock lives on the master of its slot (all its keys and its release channel share
    /// one hash tag), with the guarantees of one master per lock; see the crate's
    /// "Deployments" for what a failover may cost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::cluster([
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    ///     "redis://10.0.0.3:7000/",
    /// ])
    /// .build()?;
    /// let lock = client.mutex("invoice:9")?;
    /// let guard = lock.lock()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I: IntoIterator<Item = S>, S: AsRef<str>>(seed_urls: I) -> ClientBuilder {
        Self::with_topology(Topology::Cluster(owned(seed_urls)))
    }

    fn with_topology(topology: Topology) -> ClientBuilder {
        ClientBuilder {
            topology,
            master_timeout: None,
            drift_factor: 0.01,
            wait_replicas: None,
            lease: Duration::from_secs(30),
            renew_every: None,
            prefix: "locksmith:".to_owned(),
            label: None,
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            retry_timeout: Duration::from_secs(10),
            max_hold: None,
            on_lost: None,
            tls: TlsCerts::default(),
            master_auth: None,
            master_db: None,
            local_handoff: true,
            local_handoff_max_count: 16,
            local_handoff_max_time: Duration::from_millis(10),
            local_handoff_give_way: Duration::from_millis(5),
            metrics_lock_names: false,
        }
    }
}

/// The URLs given, as the builder keeps them.
fn owned<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Vec<String> {
    urls.into_iter().map(|u| u.as_ref().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    /// The acquire script reserves at most the largest block a client may ask for: the lead
    /// a token may have over the server clock (what a lost fencing mark's rule counts on) is
    /// bounded by it.
    #[test]
    fn the_acquire_script_caps_blocks_at_the_largest_count() {
        let line = format!("local MAX_BLOCK = {}", super::MAX_HANDOFF_COUNT);
        let source = crate::protocol::scripts::Which::Acquire.source();
        assert!(source.contains(&line), "acquire.lua lacks `{line}`");
    }
}
