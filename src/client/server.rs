//! What [`Client::open`](super::Client::open) and [`Client::builder`](super::Client::builder)
//! take: a URL, or a server's address and settings the program already has as a
//! [`redis::ConnectionInfo`] ([`IntoServer`]), kept by the builder as a `ConnectionInfo` (or
//! as why it cannot be used, which `build()` returns).

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

use crate::error::{Error, Result};
use crate::transport::conn;

/// A server as [`Client::open`](crate::Client::open) and
/// [`Client::builder`](crate::Client::builder) take it: the types that the `redis` crate's
/// [`IntoConnectionInfo`] takes, and `&String`.
///
/// - A URL (`&str`, `String`, `&String`): `redis://[user:password@]host[:port][/db]`,
///   `rediss://...` (TLS), `redis+unix:///path`, `unix:///path`, and the same with `valkey`
///   for `redis` (see the crate's "URLs"). A URL that cannot be used makes `build()` (or
///   `open`) return [`Error::InvalidUrl`], naming the part that is wrong.
/// - A [`redis::ConnectionInfo`]: its address (TCP, TLS or a Unix socket), user, password,
///   database and protocol are used as a URL's would be. Its TCP settings are not: every
///   connection has this crate's (keepalive, see the crate's "Time bounds").
/// - A [`redis::ConnectionAddr`], or a `(host, port)` pair: that address, without
///   credentials, database 0.
///
/// Implemented for those types only (sealed).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
///
/// let info = ConnectionAddr::Tcp("10.0.0.1".into(), 6379)
///     .into_connection_info()?
///     .set_redis_settings(RedisConnectionInfo::default().set_password("s3cret").set_db(2));
/// let client = locksmith::Client::open(info)?;
/// # Ok(()) }
/// ```
pub trait IntoServer: sealed::Sealed {}

mod sealed {
    /// Keeps [`IntoServer`](super::IntoServer) to the types implemented here; turns a value
    /// into the server's address and settings.
    pub trait Sealed {
        /// The server's address and settings, or why they cannot be used.
        fn into_info(self) -> crate::Result<redis::ConnectionInfo>;
    }
}

/// A server as the builder keeps it: its address and settings, or why they cannot be used
/// (the reason of an [`Error::InvalidUrl`], returned by `build()`).
#[derive(Clone)]
pub(crate) struct Server(std::result::Result<Box<ConnectionInfo>, String>);

impl Server {
    /// The server's address and settings; [`Error::InvalidUrl`] when they cannot be used.
    pub(crate) fn info(&self) -> Result<ConnectionInfo> {
        let unusable = |reason| Error::InvalidUrl { reason };
        self.0.clone().map(|info| *info).map_err(unusable)
    }

    /// `server`'s address and settings when they can be used (see [`conn::check_info`]).
    pub(crate) fn new(server: impl IntoServer) -> Server {
        Server(match server.into_info().and_then(conn::check_info) {
            Ok(info) => Ok(Box::new(info)),
            Err(Error::InvalidUrl { reason }) => Err(reason),
            Err(e) => Err(e.to_string()),
        })
    }
}

/// What a server is called, never with its credentials: `host:port` (or the socket's path),
/// and its database when not 0; or why it cannot be used.
impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Ok(info) => {
                let mut d = f.debug_struct("Server");
                d.field("addr", &conn::server_name(info));
                let settings = info.redis_settings();
                if settings.db() != 0 {
                    d.field("db", &settings.db());
                }
                if let Some(user) = settings.username() {
                    d.field("user", &user);
                }
                if settings.password().is_some() {
                    d.field("password", &"***");
                }
                d.finish()
            }
            Err(reason) => f.debug_tuple("Unusable").field(reason).finish(),
        }
    }
}

/// `IntoServer` for each type, with how it becomes the server's address and settings.
macro_rules! into_server {
    ($(impl$(<$t:ident: $b:path>)? for $ty:ty => |$s:ident| $into:expr;)+) => {$(
        impl$(<$t: $b>)? IntoServer for $ty {}
        impl$(<$t: $b>)? sealed::Sealed for $ty {
            fn into_info(self) -> Result<ConnectionInfo> {
                let $s = self;
                $into
            }
        }
    )+};
}

into_server! {
    impl for &str => |url| conn::parse_url(url);
    impl for String => |url| conn::parse_url(&url);
    impl for &String => |url| conn::parse_url(url);
    impl for ConnectionInfo => |info| Ok(info);
    impl for ConnectionAddr => |addr| addr.into_connection_info().map_err(Error::from_redis);
    impl<T: Into<String>> for (T, u16) =>
        |pair| pair.into_connection_info().map_err(Error::from_redis);
}
