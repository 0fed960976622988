//! The crate's error type.

use std::error::Error as StdError;
use std::fmt;

/// A specialised [`Result`](std::result::Result) for locksmith operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in locksmith.
///
/// Input errors ([`InvalidName`](Error::InvalidName),
/// [`InvalidConfig`](Error::InvalidConfig), [`InvalidUrl`](Error::InvalidUrl)) are returned
/// before anything is sent to Redis; so are [`Unsupported`](Error::Unsupported) (a call this
/// client's topology or this lock type cannot serve) and [`Misuse`](Error::Misuse) (a call
/// that cannot be right however Redis answers: a bug in the calling code, not in the
/// settings). Errors about ownership
/// ([`LeaseLost`](Error::LeaseLost), [`NotOwner`](Error::NotOwner)) mean that this holder's
/// lease ended before it was released: whatever the critical section did after that point may
/// have overlapped another owner's.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock name is empty, longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes or
    /// contains a NUL byte.
    InvalidName {
        /// Why the name was refused.
        reason: &'static str,
    },
    /// A configuration value is out of its allowed range: a setting refused by
    /// [`build`](crate::ClientBuilder::build), or a lock handle's own setting (a fixed lease,
    /// a maximum hold time, a permit count).
    InvalidConfig {
        /// The option that was refused, e.g. `"lease"`.
        field: &'static str,
        /// The bound it broke, e.g. `"must be at least 30ms"`.
        reason: String,
    },
    /// The Redis URL could not be used.
    InvalidUrl {
        /// Which part of the URL is wrong and why.
        reason: String,
    },
    /// A call that this client's topology or this lock type does not serve, such as a
    /// [`FairMutex`](crate::FairMutex), an [`RwLock`](crate::RwLock), a
    /// [`Semaphore`](crate::Semaphore) or a [`MultiMutex`](crate::MultiMutex) on a quorum
    /// client ([`Client::redlock`](crate::Client::redlock)). Nothing was sent.
    Unsupported {
        /// What is not supported, and on what.
        what: String,
    },
    /// A call the calling code should not make, refused before anything changed on the
    /// server: a thread that holds a read lock asks for the write lock of the same
    /// [`RwLock`](crate::RwLock) (it would wait for itself), a thread attaches a
    /// [`Detached`](crate::Detached) hold of a lock it holds already, more permits than the
    /// semaphore has, a leader's value over its size bound.
    Misuse {
        /// What the call did wrong.
        what: String,
    },
    /// Redis answered with an error, or the connection to it failed: see
    /// [`RedisFailure::kind`] and [`RedisFailure::code`].
    Redis(RedisFailure),
    /// Redis did not answer within the connect or command timeout (or a quorum master within
    /// the per-master timeout).
    ///
    /// Non-exhaustive: match it as `Error::Timeout { what, .. }`.
    #[non_exhaustive]
    Timeout {
        /// What timed out.
        what: &'static str,
        /// The server that did not answer (`host:port`, never a password), when known.
        server: Option<String>,
        /// How many times the call tried, and over how long, when it retried before it gave
        /// up.
        tries: Option<(u32, std::time::Duration)>,
    },
    /// This holder's lease ended: the lock key expired or was deleted, and nobody holds it now.
    LeaseLost,
    /// Another owner holds the lock now; this holder's lease had ended before.
    NotOwner,
    /// The lock's key exists but was not written by locksmith (another type or another
    /// layout). Nothing was changed.
    ForeignKey {
        /// The Redis key that is in the way.
        key: String,
    },
    /// Too few masters of a quorum client ([`Client::redlock`](crate::Client::redlock))
    /// answered for a majority to be possible.
    NoQuorum {
        /// How many masters answered.
        reached: usize,
        /// How many are needed (a majority).
        needed: usize,
    },
    /// A TLS connection could not be set up: the server's certificate is not signed by a
    /// trusted CA, has expired or is for another host; the server does not speak TLS, or
    /// refused the client certificate; or a certificate given to the builder is unusable.
    /// Returned by `build()`, before anything is locked.
    Tls {
        /// Which check failed, and what to do about it.
        reason: String,
    },
    /// Fewer replicas than [`wait_replicas`](crate::ClientBuilder::wait_replicas) asks for
    /// confirmed an acquisition within its timeout. The acquisition was undone: the lock is
    /// not held by this call.
    NotReplicated {
        /// How many replicas confirmed the write in time.
        acked: usize,
        /// How many were asked for.
        needed: usize,
    },
    /// A background thread could not be started.
    Spawn(std::io::Error),
    /// The client was shut down ([`Client::shutdown`](crate::Client::shutdown)): what it held
    /// was released then, so a guard's `unlock` has nothing left to do, and no new call is
    /// sent to Redis. Make a new client to lock again.
    Shutdown,
}

/// What Redis, or the connection to it, answered: the failure inside [`Error::Redis`].
///
/// Its text ([`Display`](std::fmt::Display)) is the Redis client's, with the server named
/// where it is known; [`kind`](RedisFailure::kind) sorts it, and [`code`](RedisFailure::code)
/// gives the code of an error reply (`READONLY`, `NOPERM`, ...).
/// [`source`](std::error::Error::source) reaches the error of the Redis client underneath,
/// whose type is not part of this crate's API.
#[derive(Debug, Clone)]
pub struct RedisFailure(pub(crate) redis::RedisError);

/// What kind of failure a [`RedisFailure`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedisFailureKind {
    /// The connection failed: refused, reset, closed, or another I/O error on it.
    Connection,
    /// The server refused the credentials (`WRONGPASS`, `NOAUTH`).
    Auth,
    /// The server answered with an error reply; [`RedisFailure::code`] names it.
    Server,
    /// An answer that could not be read, or not the answer the call expects.
    Response,
    /// Anything else.
    Other,
}

impl RedisFailure {
    /// What kind of failure this is.
    pub fn kind(&self) -> RedisFailureKind {
        use redis::ErrorKind as K;
        let e = &self.0;
        if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) {
            return RedisFailureKind::Auth;
        }
        match e.kind() {
            K::Io => RedisFailureKind::Connection,
            _ if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() => {
                RedisFailureKind::Connection
            }
            K::AuthenticationFailed => RedisFailureKind::Auth,
            K::Server(_) | K::Extension => RedisFailureKind::Server,
            K::Parse | K::UnexpectedReturnType | K::RESP3NotSupported => RedisFailureKind::Response,
            _ => RedisFailureKind::Other,
        }
    }

    /// The code of the server's error reply (its first word: `ERR`, `READONLY`, `NOPERM`,
    /// `WRONGTYPE`, ...), when the server answered with one.
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for RedisFailure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

impl Error {
    /// True for [`Error::NotReplicated`].
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, Error::NotReplicated { .. })
    }

    /// True for [`Error::InvalidName`].
    pub fn is_invalid_name(&self) -> bool {
        matches!(self, Error::InvalidName { .. })
    }

    /// True for [`Error::InvalidConfig`] and [`Error::InvalidUrl`].
    pub fn is_invalid_config(&self) -> bool {
        matches!(self, Error::InvalidConfig { .. } | Error::InvalidUrl { .. })
    }

    /// True for [`Error::Unsupported`].
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// True for [`Error::Misuse`].
    pub fn is_misuse(&self) -> bool {
        matches!(self, Error::Misuse { .. })
    }

    /// True when the lease was lost: [`Error::LeaseLost`] or [`Error::NotOwner`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost | Error::NotOwner)
    }

    /// True for [`Error::Tls`].
    pub fn is_tls(&self) -> bool {
        matches!(self, Error::Tls { .. })
    }

    /// True for [`Error::Timeout`] and for Redis I/O errors caused by a timeout.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Redis(RedisFailure(e)) => e.is_timeout(),
            _ => false,
        }
    }

    /// True for errors that come from Redis or from the connection to it.
    pub fn is_redis(&self) -> bool {
        matches!(
            self,
            Error::Redis(RedisFailure(_)) | Error::ForeignKey { .. } | Error::NoQuorum { .. }
        )
    }

    /// True for connection-level failures (refused, reset, timed out, no quorum) and for the
    /// passing states of a failover that a retry may cure: `READONLY` from a master demoted by
    /// a failover, and on a Redis Cluster `CLUSTERDOWN`, `TRYAGAIN` and `MASTERDOWN` (what a
    /// call that ran out of its bound while the cluster was failing over last saw).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::NoQuorum { .. } => true,
            Error::Redis(RedisFailure(e)) => redis_retriable(e),
            _ => false,
        }
    }

    /// An [`Error::Timeout`] about `what`, with no server and no tries yet (see
    /// [`at`](Error::at) and [`after_tries`](Error::after_tries)).
    pub(crate) fn timeout(what: &'static str) -> Self {
        Error::Timeout {
            what,
            server: None,
            tries: None,
        }
    }

    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }

    /// An [`Error::Unsupported`] that says `what`.
    pub(crate) fn unsupported(what: impl Into<String>) -> Self {
        Error::Unsupported { what: what.into() }
    }

    /// An [`Error::Misuse`] that says `what`.
    pub(crate) fn misuse(what: impl Into<String>) -> Self {
        Error::Misuse { what: what.into() }
    }

    /// An I/O error on a connection to Redis. Not a `From` impl, so that a user's unrelated
    /// `?` on an I/O error never turns into a "redis error".
    pub(crate) fn io(e: std::io::Error) -> Self {
        Error::from_redis(redis::RedisError::from(e))
    }
}

/// One rule of a setting: `Ok` where `holds`, else the [`Error::InvalidConfig`] of `field`
/// that says `reason`.
pub(crate) fn ensure(holds: bool, field: &'static str, reason: impl Into<String>) -> Result<()> {
    if holds {
        return Ok(());
    }
    Err(Error::config(field, reason))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidName { reason } => write!(f, "invalid lock name: {reason}"),
            Error::InvalidConfig { field, reason } => {
                write!(f, "invalid configuration: `{field}` {reason}")
            }
            Error::InvalidUrl { reason } => write!(f, "invalid redis url: {reason}"),
            Error::Unsupported { what } => write!(f, "not supported: {what}"),
            Error::Misuse { what } => write!(f, "misuse: {what}"),
            Error::Redis(RedisFailure(e)) => write!(f, "redis error: {e}"),
            Error::Timeout {
                what,
                server,
                tries,
            } => {
                write!(f, "timed out: {what}")?;
                if let Some(server) = server {
                    write!(f, " at {server}")?;
                }
                if let Some((n, took)) = tries {
                    write!(f, " (tried {n} times over {took:.1?})")?;
                }
                Ok(())
            }
            Error::LeaseLost => write!(f, "lease lost: the lock is no longer held by this owner"),
            Error::NotOwner => write!(
                f,
                "not the owner: the lease was lost and another owner holds the lock"
            ),
            Error::ForeignKey { key } => write!(
                f,
                "key `{key}` holds a value that locksmith did not write; it was left untouched"
            ),
            Error::NoQuorum { reached, needed } => write!(
                f,
                "no quorum: {reached} master(s) answered, {needed} needed"
            ),
            Error::Tls { reason } => write!(f, "TLS failure: {reason}"),
            Error::NotReplicated { acked, needed } => write!(
                f,
                "not replicated: {acked} of {needed} replica(s) confirmed the acquisition in \
                 time; it was undone"
            ),
            Error::Spawn(e) => write!(f, "could not start a background thread: {e}"),
            Error::Shutdown => write!(
                f,
                "the client was shut down: its locks were released then, and it sends nothing \
                 more to Redis"
            ),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

/// What a socket's timeout says as an [`Error::Timeout`].
pub(crate) const NO_ANSWER: &str = "no answer from Redis within the timeout";

impl Error {
    /// A Redis client's error in this crate's terms: a timeout as [`Error::Timeout`], anything
    /// else as [`Error::Redis`]. Not a `From` impl, so that the Redis client's type stays out
    /// of this crate's API.
    pub(crate) fn from_redis(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Error::timeout(NO_ANSWER)
        } else {
            Error::Redis(RedisFailure(e))
        }
    }
}

/// An I/O error's text with words added (the server it happened with, how long a call
/// retried), keeping the original error as its source: its kind, and a TLS error inside it,
/// stay visible to the checks that look for them.
#[derive(Debug)]
struct Context {
    text: String,
    source: redis::RedisError,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl StdError for Context {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// Whether a retry may cure `e` (see [`Error::is_retriable`]): a failed connection, a
/// timeout, or a passing state of a failover. Not an answer that was not RESP: an I/O error of
/// kind `InvalidData` that no TLS error explains (bytes that are not TLS are the TLS layer's
/// to name, and stay retriable as any failed connection).
pub(crate) fn redis_retriable(e: &redis::RedisError) -> bool {
    let not_resp = io_error(e).is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData)
        && rustls_error(e).is_none();
    if not_resp {
        return false;
    }
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly
                    | redis::ServerErrorKind::ClusterDown
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::MasterDown
            )
        )
}

/// The rustls error behind `e`, if any (through `RedisError` and `io::Error` wrappers).
#[cfg(feature = "tls")]
pub(crate) fn rustls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    in_arc(e)
        .and_then(rustls_error)
        .or_else(|| e.downcast_ref())
        .or_else(|| {
            e.downcast_ref::<std::io::Error>()?
                .get_ref()?
                .downcast_ref()
        })
        .or_else(|| rustls_error(e.source()?))
}

/// Without the feature `tls`, no error comes from rustls.
#[cfg(not(feature = "tls"))]
fn rustls_error(_e: &(dyn StdError + 'static)) -> Option<std::convert::Infallible> {
    None
}

/// The `io::Error` inside a Redis error, if it is one (`RedisError` keeps it behind an
/// `Arc`).
pub(crate) fn io_error(r: &redis::RedisError) -> Option<&std::io::Error> {
    let inner = StdError::source(r)?;
    in_arc(inner).unwrap_or(inner).downcast_ref()
}

/// The error inside `e` when `e` is the `Arc<dyn Error>` in which `RedisError` keeps its
/// cause (whose own `source` skips it).
fn in_arc<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    let inner = e.downcast_ref::<std::sync::Arc<dyn StdError + Send + Sync>>()?;
    Some(inner.as_ref())
}

impl Error {
    /// A connection-level error (an I/O error inside [`Error::Redis`]) with its text rewritten
    /// by `text` (given the old text), its kind kept and the old error as its source; other
    /// errors unchanged.
    pub(crate) fn with_context(self, text: impl FnOnce(&str) -> String) -> Error {
        match self {
            Error::Redis(RedisFailure(r)) => match io_error(&r).map(|io| io.kind()) {
                Some(kind) => {
                    let text = text(&r.to_string());
                    Error::Redis(RedisFailure(redis::RedisError::from(std::io::Error::new(
                        kind,
                        Context { text, source: r },
                    ))))
                }
                None => Error::Redis(RedisFailure(r)),
            },
            e => e,
        }
    }

    /// Names the server (`name`: `host:port`, never a password) a connection-level error or a
    /// timeout happened with, unless it names one already.
    pub(crate) fn at(mut self, name: &str) -> Error {
        if let Error::Timeout { server, .. } = &mut self {
            server.get_or_insert_with(|| name.to_owned());
            return self;
        }
        self.with_context(|t| {
            if t.contains(name) {
                t.to_owned()
            } else {
                format!("{name}: {t}")
            }
        })
    }

    /// Says how often and for how long a call tried before it gave up with this
    /// (connection-level or timeout) error.
    pub(crate) fn after_tries(mut self, tries: u32, took: std::time::Duration) -> Error {
        if tries < 2 {
            return self;
        }
        if let Error::Timeout { tries: told, .. } = &mut self {
            *told = Some((tries, took));
            return self;
        }
        self.with_context(|t| format!("{t} (tried {tries} times over {took:.1?})"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A server error as the cluster code builds it from a reply.
    fn server_error(reply: &[u8]) -> Error {
        match redis::parse_redis_value(reply) {
            Ok(redis::Value::ServerError(e)) => Error::Redis(RedisFailure(e.into())),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn a_timeout_names_its_server_and_tries() {
        let e = Error::timeout("no answer");
        assert_eq!(e.to_string(), "timed out: no answer");
        // One try is not worth saying; the first server named is kept.
        let e = e
            .after_tries(1, Duration::from_millis(300))
            .at("127.0.0.1:6501")
            .at("127.0.0.1:6502")
            .after_tries(3, Duration::from_millis(1500));
        assert_eq!(
            e.to_string(),
            "timed out: no answer at 127.0.0.1:6501 (tried 3 times over 1.5s)"
        );
        assert!(e.is_timeout() && e.is_retriable(), "{e:?}");
        assert!(matches!(
            e,
            Error::Timeout {
                what: "no answer",
                ..
            }
        ));
    }

    #[test]
    fn a_redis_failure_says_its_kind_and_code() {
        let failure = |e: Error| match e {
            Error::Redis(f) => f,
            other => panic!("not a Redis failure: {other:?}"),
        };
        let f = failure(server_error(
            b"-READONLY You can't write against a replica.\r\n",
        ));
        assert_eq!(
            (f.kind(), f.code()),
            (RedisFailureKind::Server, Some("READONLY"))
        );
        assert!(f.to_string().contains("write against a replica"), "{f}");
        let f = failure(server_error(
            b"-WRONGPASS invalid username-password pair\r\n",
        ));
        assert_eq!(f.kind(), RedisFailureKind::Auth);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let f = failure(Error::io(refused));
        assert_eq!((f.kind(), f.code()), (RedisFailureKind::Connection, None));
        // The Redis client's error stays reachable as a source, not as a type of the API.
        assert!(std::error::Error::source(&f).is_some());
        let e = Error::Redis(f);
        assert!(e.is_redis() && e.is_retriable(), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn passing_cluster_states_are_retriable() {
        for reply in [
            &b"-CLUSTERDOWN The cluster is down\r\n"[..],
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ] {
            let e = server_error(reply);
            assert!(e.is_retriable(), "{e}");
            assert!(e.is_redis() && !e.is_lease_lost(), "{e}");
        }
        // A script error or an unknown command is not cured by a retry.
        for reply in [
            &b"-ERR unknown command 'X'\r\n"[..],
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        ] {
            let e = server_error(reply);
            assert!(!e.is_retriable(), "{e}");
        }
    }
}
