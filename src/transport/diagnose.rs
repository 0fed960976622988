//! What a failed first command means, where TLS is the likely cause: the TLS check that
//! failed, a TLS port that does not answer (probed with a handshake of its own), a plain-text
//! connection made to a TLS port.

use crate::error::{Error, RedisFailure, io_error};
use crate::transport::pubsub;
use crate::transport::tls::{Tls, bad, classify, closed_by_peer, handshake_error, speaks_tls};

/// The error of a client's first command (at `build()`), explained where TLS is the likely
/// cause: a failed TLS check on a `rediss://` master names the check; a TLS master that does
/// not answer in time is probed with a handshake of its own, to tell a plain-text port from a
/// slow server; a plain-text connection that the server closed at once was made to a TLS
/// port when that port answers a TLS handshake. `e` is a public error, or a fault that
/// becomes one.
pub(crate) fn explain(
    e: impl Into<Error>,
    infos: &[redis::ConnectionInfo],
    tls: Option<&Tls>,
    timeouts: crate::transport::conn::Timeouts,
) -> Error {
    use redis::ConnectionAddr;
    let e = e.into();
    let tls_master = infos.iter().find_map(|i| match i.addr() {
        ConnectionAddr::TcpTls { host, .. } => Some((i, host.clone())),
        _ => None,
    });
    if let (Some(tls), Some((info, host))) = (tls, tls_master) {
        let e = classify(e, &host);
        if e.is_tls() {
            return e;
        }
        if let Error::Redis(RedisFailure(r)) = &e
            && let Some(io) = io_error(r)
            && !r.is_timeout()
        {
            return handshake_error(io, &host);
        }
        if e.is_timeout() {
            return match pubsub::probe(info, timeouts, tls) {
                Err(p) if p.is_tls() => p,
                Err(p) if p.is_timeout() => bad(format!(
                    "`{host}` did not answer the TLS handshake within the connect timeout: is \
                     this a plain-text port (then use redis://), or is the server stalled?"
                )),
                _ => e,
            };
        }
        return e;
    }
    let plain = infos.iter().find_map(|i| match i.addr() {
        ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
        _ => None,
    });
    // Closed by the server after the connection was made (not refused, not timed out).
    let closed = |r: &redis::RedisError| {
        r.is_connection_dropped()
            && !r.is_connection_refusal()
            && io_error(r).is_some_and(|io| closed_by_peer(io.kind()))
    };
    match (&e, plain) {
        // A closed connection is no evidence of TLS by itself (a server that stops, a proxy,
        // `maxclients`): TLS is named only when the port answers a TLS handshake.
        (Error::Redis(RedisFailure(r)), Some((host, port)))
            if closed(r) && speaks_tls(&host, port, timeouts.connect) =>
        {
            bad(format!(
                "{host}:{port} closed the connection at the first plain-text command ({r}) \
                 and answers a TLS handshake: use a rediss:// URL"
            ))
        }
        _ => e,
    }
}
