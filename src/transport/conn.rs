//! Connections to one Redis server: URL checks, and a small pool of command connections.
//!
//! The pool starts no thread. A caller takes an idle connection (or opens one, bounded by the
//! connect timeout), runs its commands, and gives it back unless the connection failed. So
//! threads working on different locks never queue behind one socket, and a broken connection
//! is replaced on the next use.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use crate::error::{Error, RedisFailure, Result};
use crate::transport::fault::Fault;
pub(crate) use crate::transport::link::Conn;
use crate::transport::link::{self, Opener, client_for, open};
use crate::transport::tls::Tls;

/// How many idle connections the pool keeps; more may be open while many threads are busy.
const MAX_IDLE: usize = 32;

/// Checks a Redis URL and names the part that is wrong.
///
/// Accepted: `redis://[user:password@]host[:port][/db]`, the same with `rediss://` (TLS;
/// a trailing `#insecure` skips certificate verification), `redis+unix:///path` and
/// `unix:///path`. `valkey://`, `valkeys://` and `valkey+unix://` are the same three (the
/// `redis` crate reads them alike).
pub(crate) fn parse_url(url: &str) -> Result<ConnectionInfo> {
    let bad = |reason: String| Error::InvalidUrl { reason };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(format!(
            "`{}` has no scheme (expected redis://)",
            redact(url)
        )));
    };
    match scheme {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            let authority = rest.split(['/', '#', '?']).next().unwrap_or("");
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = match host_port.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || host_port.starts_with('[') => (h, Some(p)),
                _ => (host_port, None),
            };
            check_host(host, port)?;
            check_db(
                rest[authority.len()..]
                    .split(['?', '#'])
                    .next()
                    .unwrap_or(""),
            )?;
        }
        "redis+unix" | "valkey+unix" | "unix" => {}
        other => {
            return Err(bad(format!(
                "the scheme `{other}` is not supported (expected redis://, rediss:// or \
                 redis+unix://)"
            )));
        }
    }
    let info = url.into_connection_info().map_err(|e| bad(url_error(&e)))?;
    check_info(info)
}

/// Checks a server's address and settings (from a URL or given as they are): a TCP, TLS or
/// Unix address, a host and a port other than 0, a database from 0 up.
pub(crate) fn check_info(info: ConnectionInfo) -> Result<ConnectionInfo> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            check_host(host, Some(&port.to_string()))?;
        }
        ConnectionAddr::Unix(..) => {}
        _ => return Err(link::unsupported()),
    }
    let db = info.redis_settings().db();
    if db < 0 {
        let reason = format!("the database `{db}` is not a number from 0 up");
        return Err(Error::InvalidUrl { reason });
    }
    Ok(info)
}

/// A TCP address's host (not empty) and port, if given (a number from 1 to 65535).
fn check_host(host: &str, port: Option<&str>) -> Result<()> {
    let bad = |reason: String| Err(Error::InvalidUrl { reason });
    if host.is_empty() {
        return bad("the host is missing".into());
    }
    if let Some(port) = port
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return bad(format!("the port `{port}` is not a number from 1 to 65535"));
    }
    Ok(())
}

/// The path of a `redis://` URL: empty, `/`, or `/` and a database number.
fn check_db(path: &str) -> Result<()> {
    let db = path.trim_matches('/');
    if db.is_empty() || db.parse::<i64>().is_ok_and(|n| n >= 0) {
        return Ok(());
    }
    Err(Error::InvalidUrl {
        reason: format!(
            "the database `{db}` is not a number from 0 up (the path of redis://host:port/db \
             is the database)"
        ),
    })
}

/// Why the `redis` crate refused a URL, in its words without its error kind (its messages
/// never hold the URL: `Invalid protocol version: resp9`, `Redis URL did not parse`, ...).
fn url_error(e: &redis::RedisError) -> String {
    let text = e.to_string().replace(" - InvalidClientConfig", "");
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "the URL could not be parsed".into(),
    }
}

/// The URL as it may be shown (in a message, a log line or a `Debug`): the user and password
/// before an `@` replaced by `***`, and the value of a `pass=` or `password=` query parameter
/// too. The one redaction of the crate: every URL shown goes through it, well-formed or not
/// (a URL without a scheme, or with a password that holds a `/`, is redacted as well).
pub(crate) fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |s| s + 3);
    let mut out = match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    };
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&");
        out = format!("{head}{query}");
    }
    out
}

/// What a server is called in messages and logs: `host:port` (or a socket's path), never
/// its credentials.
pub(crate) fn server_name(info: &ConnectionInfo) -> String {
    info.addr().to_string()
}

/// The fault of a reply read from `server`: one that is not RESP at all (an HTTP server, an
/// SSH banner on that port) says so in one line, and is not retried; a connection-level
/// failure names the server.
pub(crate) fn reply_error(e: redis::RedisError, server: &str) -> Fault {
    if e.kind() == redis::ErrorKind::Parse {
        let first = e.to_string();
        let first = first.lines().next().unwrap_or("").trim();
        return Fault::NotRedis {
            text: format!("{server} did not answer as a Redis server ({first})"),
        };
    }
    Fault::from(e).at(server)
}

/// Connect and command timeouts, clamped so that no system call sees an absurd value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) command: Duration,
}

/// The longest timeout handed to the operating system; longer ones mean "practically never".
pub(crate) const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The instant by which a call must be done; every blocking step of the call takes the
/// smaller of its own timeout and what is left, so that the bounds of the steps compose into
/// the call's bound. `None` inside: no bound beyond the steps' own timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// No bound of its own.
    pub(crate) const NONE: Deadline = Deadline(None);

    /// `d` from now (no bound when that cannot be represented).
    pub(crate) fn after(d: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(d))
    }

    /// At `t`.
    pub(crate) fn at(t: Instant) -> Deadline {
        Deadline(Some(t))
    }

    /// The earlier of the two.
    pub(crate) fn min(self, other: Deadline) -> Deadline {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Deadline(Some(a.min(b))),
            (a, b) => Deadline(a.or(b)),
        }
    }

    /// `d` earlier (the same when unbounded).
    pub(crate) fn minus(self, d: Duration) -> Deadline {
        match self.0 {
            Some(t) => Deadline(Some(t.checked_sub(d).unwrap_or(t))),
            None => self,
        }
    }

    /// The instant (`None`: no bound).
    pub(crate) fn instant(self) -> Option<Instant> {
        self.0
    }

    /// Whether the deadline has passed.
    pub(crate) fn passed(self) -> bool {
        self.0.is_some_and(|t| Instant::now() >= t)
    }

    /// Time left (`None`: unbounded).
    pub(crate) fn left(self) -> Option<Duration> {
        self.0.map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// `timeout`, shortened to what is left, for one blocking step; [`Fault::RanOut`] when
    /// nothing is left (a socket timeout cannot be zero).
    pub(crate) fn cap(self, timeout: Duration) -> Result<Duration, Fault> {
        let t = match self.left() {
            Some(left) => timeout.min(left),
            None => timeout,
        };
        if t.is_zero() {
            return Err(Fault::RanOut { server: None });
        }
        Ok(t.min(MAX_SOCKET_TIMEOUT))
    }
}

/// Where a topology's master is now: asked on every new connection of a pool that has one,
/// and by the pub/sub connection on every (re)connect (see `topology/sentinel.rs`).
pub(crate) trait Resolve: Send + Sync + std::fmt::Debug {
    /// The master's address (without credentials), within `by`. `fresh`: ask again even when
    /// an answer is cached.
    fn resolve(&self, by: Deadline, fresh: bool) -> Result<ConnectionInfo, Fault>;
    /// The cached address is doubtful (a connection failed, or the server is not a master).
    fn forget(&self);
    /// Asks where the master is now, within `by`, and notes a move (bumping the generation);
    /// run in the background, at most every [`RESOLVE_EVERY`].
    fn check(&self, by: Deadline);
    /// Counts the master's moves: a pooled connection opened in an older generation goes to
    /// a server that is no longer the master.
    fn generation(&self) -> u64;
}

/// How often the background check asks where the master is.
pub(crate) const RESOLVE_EVERY: Duration = Duration::from_secs(1);

impl Conn {
    /// Sets both socket timeouts to `t` (no system call when they already are).
    pub(crate) fn set_timeouts(&mut self, t: Duration) -> Result<(), Fault> {
        self.set_timeout(t, true)?;
        self.set_timeout(t, false)
    }

    /// Sets the socket's read timeout to `t` (no system call when it already is).
    pub(crate) fn set_read_timeout(&mut self, t: Duration) -> Result<(), Fault> {
        self.set_timeout(t, true)
    }

    /// Sets the socket's read (`read`) or write timeout to `t`, with no system call when it
    /// already is.
    fn set_timeout(&mut self, t: Duration, read: bool) -> Result<(), Fault> {
        let t = coarse(t);
        let sock = self.stream.socket();
        if read && self.read != t {
            sock.set_read_timeout(Some(t))?;
            self.read = t;
        } else if !read && self.write != t {
            sock.set_write_timeout(Some(t))?;
            self.write = t;
        }
        Ok(())
    }

    /// Bounds the next write (`read` false) or read by `timeout`, shortened by `by`. A write
    /// and a read usually want different timeouts (the command's, the reply's), so each sets
    /// only its own (and the other where it was never set: a new connection's TLS handshake
    /// both writes and reads): a command then costs no `setsockopt` at all.
    fn bound(&mut self, timeout: Duration, by: Deadline, read: bool) -> Result<(), Fault> {
        let t = by.cap(timeout).map_err(|e| e.at(&self.server))?;
        self.set_timeout(t, read)?;
        let other = if read { self.write } else { self.read };
        if other.is_zero() {
            self.set_timeout(t, !read)?;
        }
        Ok(())
    }

    /// Writes `packed`, waiting at most `timeout` for the socket (shortened by `by`).
    pub(crate) fn send(
        &mut self,
        packed: &[u8],
        timeout: Duration,
        by: Deadline,
    ) -> Result<(), Fault> {
        self.bound(timeout, by, false)?;
        self.send_now(packed)
    }

    /// Writes a packed command with the timeouts as they are.
    pub(crate) fn send_now(&mut self, packed: &[u8]) -> Result<(), Fault> {
        self.send_packed_command(packed)
            .map_err(|e| Fault::from(e).at(&self.server))
    }

    /// Reads one reply, waiting at most `timeout` (shortened by `by`).
    pub(crate) fn recv(&mut self, timeout: Duration, by: Deadline) -> Result<Value, Fault> {
        self.bound(timeout, by, true)?;
        self.recv_now()
    }

    /// Reads one reply with the timeouts as they are.
    pub(crate) fn recv_now(&mut self) -> Result<Value, Fault> {
        self.recv_response()
            .map_err(|e| reply_error(e, &self.server))
    }
}

/// `t` rounded down to whole milliseconds (or `t` itself when shorter than one): a timeout cut
/// by a call's deadline differs by microseconds from one call to the next, and would otherwise
/// cost a `setsockopt` on every command. The kernel's timers are coarser still.
fn coarse(t: Duration) -> Duration {
    match u64::try_from(t.as_millis()) {
        Ok(0) => t,
        Ok(ms) => Duration::from_millis(ms),
        Err(_) => t,
    }
}

/// A pool of command connections to one server.
pub(crate) struct Pool {
    /// The server's address with its credentials, as given (for a cluster node's pub/sub
    /// connection).
    info: ConnectionInfo,
    /// Opens the TCP (or TLS, or Unix) connection and runs its `AUTH` / `SELECT` (see
    /// [`open`]).
    client: Opener,
    timeouts: Timeouts,
    idle: Mutex<Vec<Conn>>,
    /// Where the master is now, for a topology whose master moves (the `client` above is
    /// then unused); each new connection also checks with `ROLE` that it reached a master.
    resolver: Option<std::sync::Arc<dyn Resolve>>,
    /// The TLS set-up for the resolved master's `rediss://` address.
    tls: Option<std::sync::Arc<Tls>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.idle.lock().len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool for `info`; a `rediss://` address gets its configuration from `tls`.
    pub(crate) fn new(
        info: ConnectionInfo,
        timeouts: Timeouts,
        tls: Option<&std::sync::Arc<Tls>>,
    ) -> Result<Self> {
        Ok(Pool {
            client: client_for(info.clone(), tls.map(|t| &**t))?,
            info,
            timeouts,
            idle: Mutex::new(Vec::new()),
            resolver: None,
            tls: tls.cloned(),
        })
    }

    /// The server's address with its credentials, as given.
    pub(crate) fn info(&self) -> &ConnectionInfo {
        &self.info
    }

    /// Takes the master's address from `resolver`, if any, on every new connection.
    pub(crate) fn with_resolver(mut self, resolver: Option<std::sync::Arc<dyn Resolve>>) -> Self {
        self.resolver = resolver;
        self
    }

    /// The master may have moved: drops the idle connections and the cached address.
    pub(crate) fn forget_master(&self) {
        self.clear();
        if let Some(r) = &self.resolver {
            r.forget();
        }
    }

    /// Opens a new connection: connect, `AUTH` and `SELECT` within the connect timeout (and
    /// `ROLE` with a resolver), all within `by`.
    pub(crate) fn connect(&self, by: Deadline) -> Result<Conn, Fault> {
        let by = by.min(Deadline::after(self.timeouts.connect));
        let generation = self.resolver.as_ref().map_or(0, |r| r.generation());
        let moved = match &self.resolver {
            // With this pool's credentials and database.
            Some(r) => {
                let info = r.resolve(by, false)?;
                let info = info.set_redis_settings(self.info.redis_settings().clone());
                Some(client_for(info, self.tls.as_deref())?)
            }
            None => None,
        };
        let client = moved.as_ref().unwrap_or(&self.client);
        let server = server_name(&client.info);
        let connect = by.cap(self.timeouts.connect).map_err(|e| e.at(&server))?;
        let mut con = open(client, connect).map_err(|e| e.at(&server))?;
        con.generation = generation;
        if let Some(r) = &self.resolver {
            let role = redis::cmd("ROLE").get_packed_command();
            con.send(&role, self.timeouts.connect, by)?;
            let reply = con.recv(self.timeouts.connect, by)?;
            if let Err(e) = check_master(&reply) {
                r.forget();
                return Err(e);
            }
        }
        con.set_timeouts(self.timeouts.command.min(MAX_SOCKET_TIMEOUT))?;
        Ok(con)
    }

    /// An idle connection, if there is one.
    pub(crate) fn idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock();
        if let Some(r) = &self.resolver {
            // Connections to a server that is no longer the master are dropped.
            let now = r.generation();
            idle.retain(|c| c.generation == now);
        }
        idle.pop()
    }

    /// Gives a healthy connection back.
    pub(crate) fn put(&self, con: Conn) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(con);
        }
    }

    /// Drops every idle connection (they are reopened on demand).
    pub(crate) fn clear(&self) {
        self.idle.lock().clear();
    }
}

/// Checks a `ROLE` reply: a server that is not a master is refused like a failed connection
/// (so that a call retries and the address is resolved again).
fn check_master(reply: &Value) -> Result<(), Fault> {
    let role: String = match reply {
        Value::Array(items) => items
            .first()
            .and_then(|r| redis::from_redis_value_ref(r).ok()),
        _ => None,
    }
    .unwrap_or_default();
    if role == "master" {
        return Ok(());
    }
    Err(Fault::from(redis::RedisError::from(std::io::Error::other(
        format!("the server named as master is not one (ROLE: {role:?})"),
    ))))
}

/// Whether `r` is a refusal of credentials: a failed `AUTH`, or a server error coded
/// `WRONGPASS` or `NOAUTH`, alone or among the errors of a pipeline (a connection's set-up).
fn refuses_credentials(r: &redis::RedisError) -> bool {
    r.kind() == redis::ErrorKind::AuthenticationFailed
        || r.clone().into_server_errors().is_some_and(|errors| {
            (errors.iter()).any(|(_, e)| matches!(e.code(), "WRONGPASS" | "NOAUTH"))
        })
}

/// `e` with `hint` added when it is a refusal of credentials (see [`refuses_credentials`]);
/// other errors unchanged.
pub(crate) fn auth_hint(e: Error, whom: &str, hint: &str) -> Error {
    match e {
        Error::Redis(RedisFailure(r)) if refuses_credentials(&r) => {
            Error::Redis(RedisFailure(redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "credentials refused",
                format!("{whom} refused the credentials ({r}); {hint}"),
            ))))
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_credentials_are_known_by_their_code() {
        let server = |reply: &[u8]| match redis::parse_redis_value(reply) {
            Ok(Value::ServerError(e)) => redis::RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        };
        assert!(refuses_credentials(&server(
            b"-WRONGPASS invalid password\r\n"
        )));
        assert!(refuses_credentials(&server(
            b"-NOAUTH Authentication required.\r\n"
        )));
        let failed = (redis::ErrorKind::AuthenticationFailed, "auth failed");
        assert!(refuses_credentials(&redis::RedisError::from(failed)));
        // The code decides, not the text.
        assert!(!refuses_credentials(&server(
            b"-ERR WRONGPASS in a message\r\n"
        )));
        let e = auth_hint(
            Error::Redis(RedisFailure(server(b"-NOPERM no\r\n"))),
            "a sentinel",
            "hint",
        );
        assert!(!e.to_string().contains("hint"), "{e}");
        let e = auth_hint(
            Error::Redis(RedisFailure(server(b"-WRONGPASS no\r\n"))),
            "a sentinel",
            "hint",
        );
        assert!(
            e.to_string().contains("a sentinel refused the credentials"),
            "{e}"
        );
    }

    #[test]
    fn socket_timeouts_are_whole_milliseconds_never_longer() {
        let ms = Duration::from_millis;
        assert_eq!(coarse(Duration::from_micros(4_999_873)), ms(4_999));
        assert_eq!(coarse(Duration::from_micros(4_999_001)), ms(4_999));
        assert_eq!(coarse(ms(1_000)), ms(1_000));
        // Below a millisecond: as it is (a zero timeout would mean none at all).
        assert_eq!(
            coarse(Duration::from_micros(700)),
            Duration::from_micros(700)
        );
        for us in [1_u64, 999, 1_000, 1_001, 123_456_789] {
            let t = Duration::from_micros(us);
            assert!(coarse(t) <= t && !coarse(t).is_zero(), "{t:?}");
        }
    }

    /// What `parse_url` says is wrong with `u` (empty when nothing is).
    fn msg(u: &str) -> String {
        parse_url(u)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn urls_name_the_bad_part() {
        assert!(msg("http://x").contains("scheme `http`"));
        assert!(msg("redis://").contains("host"));
        assert!(msg("redis://127.0.0.1:notaport/").contains("port `notaport`"));
        assert!(msg("redis://127.0.0.1:0/").contains("port"));
        assert!(msg("rediss://127.0.0.1:0/").contains("port"));
        assert!(parse_url("rediss://127.0.0.1:6380/").is_ok());
        assert!(parse_url("rediss://u:p@127.0.0.1:6380#insecure").is_ok());
        assert!(msg("127.0.0.1:6379").contains("no scheme"));
        assert!(parse_url("redis://127.0.0.1:6379/").is_ok());
        assert!(parse_url("redis://user:pw@localhost/2").is_ok());
        assert!(parse_url("redis+unix:///tmp/redis.sock").is_ok());
        assert!(msg("redis://127.0.0.1/abc").contains("database `abc`"));
        assert!(msg("redis://127.0.0.1:6379/-1").contains("database `-1`"));
        assert!(parse_url("redis://127.0.0.1:6379/3?protocol=resp2").is_ok());
        assert!(msg("redis://127.0.0.1/?protocol=resp9").contains("protocol version: resp9"));
        assert!(msg("rediss://127.0.0.1/#bogus").contains("#insecure"));
        assert!(msg("redis://0.0.0.0/").contains("wildcard"));
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_deadline_shortens_each_step_and_refuses_when_spent() {
        let step = Duration::from_secs(1);
        assert_eq!(Deadline::NONE.cap(step).unwrap(), step);
        assert!(!Deadline::NONE.passed());
        let soon = Deadline::after(Duration::from_millis(200));
        let t = soon.cap(step).unwrap();
        assert!(t <= Duration::from_millis(200) && t > Duration::from_millis(100));
        assert_eq!(soon.min(Deadline::NONE), soon);
        assert_eq!(Deadline::NONE.min(soon), soon);
        let spent = Deadline::at(Instant::now());
        assert!(spent.passed());
        match spent.cap(step) {
            Err(Fault::RanOut { server: None }) => {}
            other => panic!("{other:?}"),
        }
        assert!(soon.minus(Duration::from_millis(300)).passed());
        assert_eq!(Deadline::NONE.minus(step), Deadline::NONE);
        // Absurd timeouts stay representable for the socket.
        assert_eq!(
            Deadline::NONE.cap(Duration::MAX).unwrap(),
            MAX_SOCKET_TIMEOUT
        );
        assert_eq!(Deadline::after(Duration::MAX), Deadline::NONE);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn valkey_schemes_mean_the_redis_ones() {
        for (valkey, redis) in [
            (
                "valkey://u:pw@127.0.0.1:6379/2",
                "redis://u:pw@127.0.0.1:6379/2",
            ),
            ("valkeys://h.example:6380/", "rediss://h.example:6380/"),
            (
                "valkeys://h.example:6380/#insecure",
                "rediss://h.example:6380/#insecure",
            ),
            ("valkey+unix:///tmp/v.sock", "redis+unix:///tmp/v.sock"),
        ] {
            let (v, r) = (parse_url(valkey).unwrap(), parse_url(redis).unwrap());
            assert_eq!(v.addr(), r.addr(), "{valkey}");
            let (vs, rs) = (v.redis_settings(), r.redis_settings());
            assert_eq!(
                (vs.db(), vs.username(), vs.password()),
                (rs.db(), rs.username(), rs.password()),
                "{valkey}"
            );
        }
        assert!(msg("valkey://").contains("host"));
        assert!(msg("valkeys://127.0.0.1:0/").contains("port"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://u:secret@h:1/"), "redis://***@h:1/");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
        assert_eq!(redact("u:secret@h:1"), "***@h:1");
        assert_eq!(redact("redis://:se/cr@et@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis:/u:secret@h"), "***@h");
        assert_eq!(
            redact("unix:///s.sock?user=u&pass=secret&db=1"),
            "unix:///s.sock?user=u&pass=***&db=1"
        );
        assert_eq!(
            redact("redis+unix:///s?password=x"),
            "redis+unix:///s?password=***"
        );
    }
}
