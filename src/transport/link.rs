//! The socket of a command connection, and how one is opened: the `redis` crate's connection
//! (TCP, Unix), or a TLS connection of this crate's. `rediss://` is ours because the `redis`
//! crate's TLS builds its rustls configurations from rustls's process-wide default provider
//! (and installs one), which a library must leave to the program (see `tls/mod.rs`); its
//! replies are still read by the `redis` crate's parser.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use redis::io::tcp::socket2::SockRef;
use redis::{
    ConnectionAddr, ConnectionInfo, ConnectionLike, RedisConnectionInfo, RedisResult, Value,
};

use crate::error::{Error, Result};
use crate::transport::dns;
use crate::transport::fault::Fault;
use crate::transport::tls::{self, Tls, TlsConn};

/// The socket of a command connection: the `redis` crate's connection (TCP or Unix), or a
/// TLS connection of this crate's (`rediss://`: the `redis` crate's TLS would use, and
/// install, rustls's process-wide default provider; see `tls/mod.rs`).
pub(crate) enum Link {
    Redis(redis::Connection),
    Tls(Box<TlsConn>),
}

impl Link {
    /// Sets the socket's read timeout.
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> RedisResult<()> {
        match self {
            Link::Redis(c) => c.set_read_timeout(t),
            Link::Tls(c) => Ok(c.tcp().set_read_timeout(t)?),
        }
    }

    /// Sets the socket's write timeout.
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> RedisResult<()> {
        match self {
            Link::Redis(c) => c.set_write_timeout(t),
            Link::Tls(c) => Ok(c.tcp().set_write_timeout(t)?),
        }
    }

    /// Writes a packed command (or several).
    pub(crate) fn send_packed_command(&mut self, packed: &[u8]) -> RedisResult<()> {
        match self {
            Link::Redis(c) => c.send_packed_command(packed),
            Link::Tls(c) => c.send(packed),
        }
    }

    /// Reads one reply.
    pub(crate) fn recv_response(&mut self) -> RedisResult<Value> {
        match self {
            Link::Redis(c) => c.recv_response(),
            Link::Tls(c) => c.recv(),
        }
    }

    /// Sends `cmd` and reads its reply; an error reply is an `Err`.
    pub(crate) fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        self.send_packed_command(&cmd.get_packed_command())?;
        self.recv_response()?.extract_error()
    }

    /// False once the connection read an end of stream or a protocol error.
    pub(crate) fn is_open(&self) -> bool {
        match self {
            Link::Redis(c) => c.is_open(),
            Link::Tls(c) => c.is_open(),
        }
    }
}

/// How connections to one address are opened: the `redis` crate's client (TCP, Unix), or a
/// TLS configuration of this crate's (`rediss://`).
#[derive(Clone)]
pub(crate) enum Opener {
    Redis(redis::Client),
    Tls {
        info: ConnectionInfo,
        config: tls::Config,
    },
}

impl Opener {
    /// The address (and the settings of the handshake the opening runs, if any).
    pub(crate) fn info(&self) -> &ConnectionInfo {
        match self {
            Opener::Redis(client) => client.get_connection_info(),
            Opener::Tls { info, .. } => info,
        }
    }

    /// Opens the connection on this thread within `connect` (the host name looked up without
    /// a bound), and runs the handshake of its settings.
    fn connect(&self, connect: Duration) -> Result<Link, Fault> {
        match self {
            Opener::Redis(client) => Ok(Link::Redis(client.get_connection_with_timeout(connect)?)),
            Opener::Tls { info, config } => connect_tls(info, config, connect),
        }
    }
}

/// Opens `client`'s TCP (or TLS, or Unix) connection within `connect`. The `redis` crate looks
/// a host name up itself, with no bound (and so does a TLS connection, as it does): a
/// connection to a host name is opened on a short-lived thread waited for at most `connect`
/// (see [`dns`]), so that the lookup keeps the call's bound. An IP address or a Unix socket
/// is opened on the caller's thread.
pub(crate) fn open(client: &Opener, connect: Duration) -> Result<Link, Fault> {
    let name = match client.info().addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => {
            !dns::is_address(host)
        }
        _ => false,
    };
    if !name {
        return client.connect(connect);
    }
    let client = client.clone();
    dns::within(Some(connect), dns::LOOKUP_TIMED_OUT, move || {
        client.connect(connect)
    })?
}

/// Opens a TLS connection to `info` within `connect`, as the `redis` crate opens its own: the
/// host's addresses tried in turn (each within `connect`), the socket set as `info`'s TCP
/// settings say, and the `AUTH` / `SELECT` of `info`'s settings, if any, within what is left
/// (which runs the TLS handshake; without them, the first command does).
fn connect_tls(
    info: &ConnectionInfo,
    config: &tls::Config,
    connect: Duration,
) -> Result<Link, Fault> {
    let start = Instant::now();
    let ConnectionAddr::TcpTls { host, port, .. } = info.addr() else {
        return Err(Fault::Other(tls::bad("not a rediss:// address")));
    };
    let mut tcp = None;
    let mut last = None;
    for addr in (host.as_str(), *port)
        .to_socket_addrs()
        .map_err(redis::RedisError::from)?
    {
        match TcpStream::connect_timeout(&addr, connect) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let tcp = match (tcp, last) {
        (Some(tcp), _) => tcp,
        (None, Some(e)) => return Err(redis::RedisError::from(e).into()),
        (None, None) => {
            return Err(Fault::Other(Error::InvalidUrl {
                reason: format!("the host `{host}` resolves to no address"),
            }));
        }
    };
    let settings = info.tcp_settings();
    tcp.set_nodelay(settings.nodelay())
        .map_err(redis::RedisError::from)?;
    if let Some(keepalive) = settings.keepalive() {
        SockRef::from(&tcp)
            .set_tcp_keepalive(keepalive)
            .map_err(redis::RedisError::from)?;
    }
    let mut link = Link::Tls(Box::new(TlsConn::new(tcp, host, config.clone())?));
    let redis = info.redis_settings();
    let mut setup = Vec::new();
    if let Some(auth) = auth(redis) {
        setup.push(auth);
    }
    if redis.db() != 0 {
        let mut select = redis::cmd("SELECT");
        select.arg(redis.db());
        setup.push(select);
    }
    if !setup.is_empty() {
        let left = connect
            .checked_sub(start.elapsed())
            .filter(|left| !left.is_zero())
            .ok_or_else(|| {
                let timed_out =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "Connection timed out");
                redis::RedisError::from(timed_out)
            })?;
        link.set_read_timeout(Some(left))?;
        link.set_write_timeout(Some(left))?;
        for cmd in &setup {
            link.query(cmd)?;
        }
        link.set_read_timeout(None)?;
        link.set_write_timeout(None)?;
    }
    Ok(link)
}

/// How connections to an address are opened: TLS with `tls`'s configuration for the address's
/// `#insecure` flag, else the `redis` crate's client.
pub(crate) fn client_for(info: ConnectionInfo, tls: Option<&Tls>) -> Result<Opener> {
    match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => {
            let config = tls.and_then(|tls| tls.config(*insecure));
            let none = || tls::bad("no TLS configuration for a rediss:// address");
            Ok(Opener::Tls {
                config: config.ok_or_else(none)?,
                info,
            })
        }
        _ => Ok(Opener::Redis(
            redis::Client::open(info).map_err(Error::from_redis)?,
        )),
    }
}

/// The `AUTH [username] password` of `settings`; `None` without a password.
pub(crate) fn auth(settings: &RedisConnectionInfo) -> Option<redis::Cmd> {
    let password = settings.password()?;
    let mut auth = redis::cmd("AUTH");
    if let Some(user) = settings.username() {
        auth.arg(user);
    }
    auth.arg(password);
    Some(auth)
}
