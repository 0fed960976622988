//! The pub/sub socket: one TCP, TLS or Unix socket per pub/sub connection, read by one
//! thread while other threads write on a clone of it (see `subscriber.rs`, "The transport,
//! and why it is this one"), the handshake's errors, and a TLS probe. Every connection is
//! opened by the steps of [`opening`]: without blocking on the pub/sub thread, driven to
//! its end for the first one (at `build()`) and for the probe.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use redis::ConnectionInfo;
use redis::io::tcp::socket2::SockRef;

use crate::error::{Error, Result};
use crate::transport::conn::{Timeouts, reply_error, server_name};
use crate::transport::tls::{Tls, TlsStream};

pub(crate) mod opening;

use opening::Opening;

/// How long the connection may stay silent before the thread sends a `PING`.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);

/// A TCP, TLS or Unix socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(TlsStream),
    Unix(UnixStream),
}

impl Stream {
    /// The socket, for its options and shutdown (the same whatever runs over it).
    fn socket(&self) -> SockRef<'_> {
        match self {
            Stream::Tcp(s) => SockRef::from(s),
            Stream::Tls(s) => SockRef::from(s.tcp()),
            Stream::Unix(s) => SockRef::from(s),
        }
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)?;
        self.socket().set_write_timeout(t)
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.socket().set_nonblocking(on)
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_write_timeout(t)
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.socket().shutdown(Shutdown::Both);
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
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
        return Error::from_redis(e);
    }
    let addr = server_name(info);
    if e.kind() == redis::ErrorKind::Parse {
        // Not RESP: said in one line, as on a command connection.
        return reply_error(e, &addr).into();
    }
    match crate::error::io_error(&e) {
        Some(io) => Error::io(io::Error::new(
            io.kind(),
            format!("{addr} closed the pub/sub connection during its handshake ({io})"),
        )),
        None => Error::from_redis(e),
    }
}

/// Opens a TLS connection to `info` and closes it again: the handshake's error, if any (to
/// explain why a first command failed).
pub(crate) fn probe(info: &ConnectionInfo, timeouts: Timeouts, tls: &Tls) -> Result<()> {
    let (opened, _) = Opening::start(info, timeouts, Some(tls), false)?.finish();
    opened.map(|(r, _)| r.stream.shutdown())
}

/// Opens a pub/sub connection to the first master that answers, starting at `start` and
/// going round, each within the connect timeout. With a quorum, listening on any one master
/// is enough: every release publishes on every master it reaches. Returns the halves and
/// the master's index.
pub(crate) fn open_any(
    infos: &[ConnectionInfo],
    start: usize,
    timeouts: Timeouts,
    tls: Option<&Tls>,
) -> Result<(ReadHalf, Stream, usize)> {
    let mut last = None;
    for k in 0..infos.len() {
        let i = (start + k) % infos.len();
        let opened = Opening::start(&infos[i], timeouts, tls, true).and_then(|op| op.finish().0);
        match opened {
            Ok((r, w)) => return Ok((r, w, i)),
            Err(e) => last = Some(e.at(&infos[i].addr().to_string())),
        }
    }
    Err(last.unwrap_or(Error::config("masters", "must name at least one Redis URL")))
}
