//! The pub/sub socket: one TCP, TLS or Unix socket per pub/sub connection, read by one
//! thread while other threads write on a clone of it (see `subscriber.rs`, "The transport,
//! and why it is this one"), its bounded handshake, and a TLS probe. A Cluster client's
//! thread opens its connections without blocking ([`opening`]).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use redis::io::tcp::socket2::SockRef;
use redis::{ConnectionAddr, ConnectionInfo, Value};
use rustls::ClientConfig;

use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, MAX_SOCKET_TIMEOUT, Timeouts, keepalive};
use crate::transport::dns;
use crate::transport::tls::{Tls, TlsStream};

pub(crate) mod opening;

/// How long the connection may stay silent before the thread sends a `PING`.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);

/// A TCP, TLS or Unix socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(TlsStream),
    Unix(UnixStream),
}

/// Connects to `host:port` within `by` (and the connect timeout), the DNS lookup of a host
/// name included, trying each address, with TCP keepalive on.
fn connect_tcp(host: &str, port: u16, timeouts: Timeouts, by: Deadline) -> Result<TcpStream> {
    let mut last = None;
    for addr in dns::lookup(host, port, Some(by.cap(timeouts.connect)?))? {
        match TcpStream::connect_timeout(&addr, by.cap(timeouts.connect)?) {
            Ok(s) => {
                s.set_nodelay(true).map_err(Error::io)?;
                SockRef::from(&s)
                    .set_tcp_keepalive(&keepalive())
                    .map_err(Error::io)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => Error::io(e),
        None => Error::InvalidUrl {
            reason: format!("the host `{host}` resolves to no address"),
        },
    })
}

/// Where a TCP or TLS address leads: its host and port, and for a `rediss://` address the
/// pub/sub TLS configuration.
struct TcpTarget<'a> {
    host: &'a str,
    port: u16,
    config: Option<Arc<ClientConfig>>,
}

/// Where the TCP or TLS address `addr` leads (an error where the client has no TLS
/// configuration for it); `None` for another kind of address.
fn tcp_target<'a>(addr: &'a ConnectionAddr, tls: Option<&Tls>) -> Result<Option<TcpTarget<'a>>> {
    let (host, port, insecure) = match addr {
        ConnectionAddr::Tcp(host, port) => (host, *port, None),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => (host, *port, Some(*insecure)),
        _ => return Ok(None),
    };
    let config = match insecure.map(|insecure| tls.and_then(|tls| tls.config(insecure))) {
        None => None,
        Some(Some(config)) => Some(config),
        Some(None) => {
            return Err(Error::Tls {
                reason: "no TLS configuration for a rediss:// address".into(),
            });
        }
    };
    Ok(Some(TcpTarget { host, port, config }))
}

impl Stream {
    /// Connects (and runs the TLS handshake of a `rediss://` address) within `by` and the
    /// connect timeout.
    pub(crate) fn connect(
        info: &ConnectionInfo,
        timeouts: Timeouts,
        tls: Option<&Tls>,
        by: Deadline,
    ) -> Result<Stream> {
        let by = by.min(Deadline::after(timeouts.connect));
        let stream = if let ConnectionAddr::Unix(path) = info.addr() {
            Stream::Unix(UnixStream::connect(path).map_err(Error::io)?)
        } else {
            let Some(TcpTarget { host, port, config }) = tcp_target(info.addr(), tls)? else {
                return Err(Error::InvalidUrl {
                    reason: "this address type is not supported".into(),
                });
            };
            let tcp = connect_tcp(host, port, timeouts, by)?;
            match config {
                None => Stream::Tcp(tcp),
                Some(config) => Stream::Tls(TlsStream::handshake(
                    tcp,
                    host,
                    config,
                    by.cap(timeouts.connect)?,
                )?),
            }
        };
        stream
            .set_timeouts(Some(by.cap(timeouts.connect)?))
            .map_err(Error::io)?;
        Ok(stream)
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tls(s) => {
                s.tcp().set_read_timeout(t)?;
                s.tcp().set_write_timeout(t)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Tls(s) => s.tcp().set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Tls(s) => s.tcp().shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// The read side of a pub/sub connection: the socket and the parser that keeps a partly read
/// reply across read timeouts.
pub(crate) struct ReadHalf {
    pub(crate) stream: Stream,
    /// Keeps a partly read reply across reads (a Cluster client's thread parses from
    /// whatever one non-blocking read brought).
    pub(crate) parser: redis::Parser,
}

impl ReadHalf {
    pub(crate) fn next(&mut self) -> redis::RedisResult<Value> {
        self.parser.parse_value(&mut self.stream)
    }
}

/// `args` as one RESP command.
pub(crate) fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut cmd = redis::Cmd::new();
    for a in args {
        cmd.arg(*a);
    }
    cmd.get_packed_command()
}

/// The error of a pub/sub handshake read, naming the server. (No guess at TLS here: a closed
/// connection is what a server that stops looks like too; `build()` names a TLS port from
/// the command connection, with evidence.)
fn handshake_read_error(e: redis::RedisError, info: &ConnectionInfo) -> Error {
    if e.is_timeout() {
        return Error::from(e);
    }
    let addr = info.addr();
    if e.kind() == redis::ErrorKind::Parse {
        return Error::io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{addr} did not answer as a Redis server ({})",
                first_line(&e)
            ),
        ));
    }
    match crate::error::io_error(&e) {
        Some(io) => Error::io(io::Error::new(
            io.kind(),
            format!("{addr} closed the pub/sub connection during its handshake ({io})"),
        )),
        None => Error::from(e),
    }
}

/// The first line of an error's text (a parse error quotes what it read, over lines).
pub(crate) fn first_line(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    text.lines().next().unwrap_or("").trim().to_owned()
}

/// Opens a TLS connection to `info` and closes it again: the handshake's error, if any (to
/// explain why a first command failed).
pub(crate) fn probe(info: &ConnectionInfo, timeouts: Timeouts, tls: &Tls) -> Result<()> {
    Stream::connect(info, timeouts, Some(tls), Deadline::NONE).map(|s| s.shutdown())
}

/// Opens a pub/sub connection, authenticates, and returns its read and write halves: all
/// within one connect timeout.
pub(crate) fn open(
    info: &ConnectionInfo,
    timeouts: Timeouts,
    tls: Option<&Tls>,
) -> Result<(ReadHalf, Stream)> {
    let by = Deadline::after(timeouts.connect);
    let stream = Stream::connect(info, timeouts, tls, by)?;
    // Each read of the handshake gets what is left of the connect timeout, not all of it.
    let shorten = |s: &Stream| -> Result<()> {
        s.set_timeouts(Some(by.cap(timeouts.connect)?))
            .map_err(Error::io)
    };
    let mut writer = stream.try_clone().map_err(Error::io)?;
    let mut reader = ReadHalf {
        stream,
        parser: redis::Parser::new(),
    };
    let settings = info.redis_settings();
    if let Some(password) = settings.password() {
        let mut args: Vec<&[u8]> = vec![b"AUTH"];
        if let Some(user) = settings.username() {
            args.push(user.as_bytes());
        }
        args.push(password.as_bytes());
        writer.write_all(&encode(&args)).map_err(Error::io)?;
        shorten(&reader.stream)?;
        match reader.next() {
            Ok(Value::ServerError(e)) => {
                return Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::AuthenticationFailed,
                    "pub/sub authentication failed",
                    e.to_string(),
                ))));
            }
            Ok(_) => {}
            Err(e) => return Err(handshake_read_error(e, info)),
        }
    }
    // Name the connection for operators (`CLIENT LIST`); old servers may refuse, which is fine.
    writer
        .write_all(&encode(&[b"CLIENT", b"SETNAME", b"locksmith-pubsub"]))
        .map_err(Error::io)?;
    shorten(&reader.stream)?;
    if let Err(e) = reader.next() {
        return Err(handshake_read_error(e, info));
    }
    // From here on, reads wake up every HEARTBEAT when the connection is idle. The two halves
    // are one socket with one pair of timeouts: set each direction once, from its own side.
    reader
        .stream
        .set_timeouts(Some(HEARTBEAT))
        .map_err(Error::io)?;
    writer
        .set_write_timeout(Some(timeouts.command.min(MAX_SOCKET_TIMEOUT)))
        .map_err(Error::io)?;
    Ok((reader, writer))
}

/// Opens a pub/sub connection to the first master that answers, starting at `start` and
/// going round. With a quorum, listening on any one master is enough: every release
/// publishes on every master it reaches. Returns the halves and the master's index.
pub(crate) fn open_any(
    infos: &[ConnectionInfo],
    start: usize,
    timeouts: Timeouts,
    tls: Option<&Tls>,
) -> Result<(ReadHalf, Stream, usize)> {
    let mut last = None;
    for k in 0..infos.len() {
        let i = (start + k) % infos.len();
        match open(&infos[i], timeouts, tls) {
            Ok((r, w)) => return Ok((r, w, i)),
            Err(e) => last = Some(e.at(&infos[i].addr().to_string())),
        }
    }
    Err(last.unwrap_or(Error::config("masters", "must name at least one Redis URL")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// The keepalive values the docs state (first probe after 15 s idle, then every 5 s, 3
    /// probes), read back from a socket opened as every connection is; also by a host name.
    #[test]
    fn connections_have_the_stated_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let timeouts = Timeouts {
            connect: Duration::from_secs(2),
            command: Duration::from_secs(2),
        };
        for host in ["127.0.0.1", "localhost"] {
            // `localhost` may name ::1 first: refused there, 127.0.0.1 is tried next.
            let s = connect_tcp(host, port, timeouts, Deadline::after(timeouts.connect)).unwrap();
            let sock = SockRef::from(&s);
            assert!(sock.keepalive().unwrap());
            assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(15));
            assert_eq!(
                sock.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(5)
            );
            assert_eq!(sock.tcp_keepalive_retries().unwrap(), 3);
        }
    }
}
