//! The pub/sub socket: one TCP, TLS or Unix [`Stream`] per pub/sub connection, read by one
//! thread while other threads write on a clone of it (see `subscriber.rs`, "The transport,
//! and why it is this one"), the handshake's errors, and a TLS probe. Every connection is
//! opened by the steps of [`opening`]: without blocking on the pub/sub thread, driven to
//! its end for the first one (at `build()`) and for the probe.

use std::io;
use std::time::Duration;

use redis::ConnectionInfo;

use crate::error::{Error, Result};
use crate::transport::conn::{Timeouts, reply_error, server_name};
pub(crate) use crate::transport::link::Stream;
use crate::transport::tls::Tls;

pub(crate) mod opening;

use opening::Opening;

/// How long the connection may stay silent before the thread sends a `PING`.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);

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
    redis::Cmd::new().arg(args).get_packed_command()
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
