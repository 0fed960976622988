//! Connections to one Redis server: URL checks, and a small pool of command connections.
//!
//! The pool starts no thread. A caller takes an idle connection (or opens one, bounded by the
//! connect timeout), runs its commands, and gives it back unless the connection failed. So
//! threads working on different locks never queue behind one socket, and a broken connection
//! is replaced on the next use.

use std::time::Duration;

use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::error::{Error, Result};
use crate::tls::Tls;

/// How many idle connections the pool keeps; more may be open while many threads are busy.
const MAX_IDLE: usize = 32;

/// Checks a Redis URL and names the part that is wrong.
///
/// Accepted: `redis://[user:password@]host[:port][/db]`, the same with `rediss://` (TLS;
/// a trailing `#insecure` skips certificate verification), `redis+unix:///path` and
/// `unix:///path`.
pub(crate) fn parse_url(url: &str) -> Result<ConnectionInfo> {
    let bad = |reason: String| Error::InvalidUrl { reason };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(format!(
            "`{}` has no scheme (expected redis://)",
            redact(url)
        )));
    };
    match scheme {
        "redis" | "rediss" => {
            let authority = rest.split(['/', '#', '?']).next().unwrap_or("");
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = match host_port.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || host_port.starts_with('[') => (h, Some(p)),
                _ => (host_port, None),
            };
            if host.is_empty() {
                return Err(bad("the host is missing".into()));
            }
            if let Some(port) = port {
                match port.parse::<u16>() {
                    Ok(p) if p > 0 => {}
                    _ => {
                        return Err(bad(format!(
                            "the port `{port}` is not a number from 1 to 65535"
                        )));
                    }
                }
            }
        }
        "redis+unix" | "unix" => {}
        other => {
            return Err(bad(format!(
                "the scheme `{other}` is not supported (expected redis://, rediss:// or \
                 redis+unix://)"
            )));
        }
    }
    let info = url
        .into_connection_info()
        .map_err(|e| bad(e.detail().unwrap_or("could not be parsed").to_owned()))?;
    match info.addr() {
        ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. } | ConnectionAddr::Unix(..) => {
            Ok(info)
        }
        _ => Err(bad("this address type is not supported".into())),
    }
}

/// The URL with any password replaced, for messages and logs.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_owned(),
    }
}

/// Connect and command timeouts, clamped so that no system call sees an absurd value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) command: Duration,
}

/// The longest timeout handed to the operating system; longer ones mean "practically never".
pub(crate) const MAX_SOCKET_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A pool of command connections to one server.
pub(crate) struct Pool {
    client: redis::Client,
    timeouts: Timeouts,
    idle: Mutex<Vec<redis::Connection>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("idle", &self.idle.lock().len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool for `info`; a `rediss://` address gets its certificates from `tls`.
    pub(crate) fn new(info: ConnectionInfo, timeouts: Timeouts, tls: Option<&Tls>) -> Result<Self> {
        Ok(Pool {
            client: client_for(info, tls)?,
            timeouts,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Opens a new connection with both timeouts set.
    pub(crate) fn connect(&self) -> Result<redis::Connection> {
        let con = self
            .client
            .get_connection_with_timeout(self.timeouts.connect.min(MAX_SOCKET_TIMEOUT))?;
        let t = Some(self.timeouts.command.min(MAX_SOCKET_TIMEOUT));
        con.set_read_timeout(t)?;
        con.set_write_timeout(t)?;
        Ok(con)
    }

    /// An idle connection, if there is one.
    pub(crate) fn idle(&self) -> Option<redis::Connection> {
        self.idle.lock().pop()
    }

    /// Gives a healthy connection back.
    pub(crate) fn put(&self, con: redis::Connection) {
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

/// The `redis` client of an address: TLS through the `redis` crate's rustls support, with
/// the builder's certificates (the system's roots when none were given).
fn client_for(info: ConnectionInfo, tls: Option<&Tls>) -> Result<redis::Client> {
    match (info.addr(), tls) {
        (ConnectionAddr::TcpTls { .. }, Some(tls))
            if tls.certs.root.is_some() || tls.certs.client.is_some() =>
        {
            Ok(redis::Client::build_with_tls(info, tls.certs.for_redis())?)
        }
        _ => Ok(redis::Client::open(info)?),
    }
}

/// True when the error says the connection itself is no good any more.
pub(crate) fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_bad_part() {
        let msg = |u: &str| {
            parse_url(u)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
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
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://u:secret@h:1/"), "redis://***@h:1/");
        assert_eq!(redact("redis://h:1/"), "redis://h:1/");
    }
}
