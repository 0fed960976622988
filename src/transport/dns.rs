//! Host-name lookups that keep a call's bound.
//!
//! The system's resolver (`getaddrinfo`, behind [`ToSocketAddrs`]) takes no timeout: a DNS
//! server that does not answer holds the caller for the resolver's own timeouts and retries
//! (`/etc/resolv.conf`, 5 s a try by default), longer than most call bounds. So a host that is
//! an IP address is parsed, with no lookup at all, and any other name is looked up on a
//! short-lived thread (`locksmith-dns`) that the caller waits for within what is left of its
//! bound. When the answer does not come in time the call fails with a timeout; the thread ends
//! on its own when the resolver gives up, and its late answer is dropped.
//!
//! Only the opening of a connection to a host name pays this (a thread start, some tens of
//! microseconds): pooled connections are reused, and a client's two threads stay two.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::thread;
use std::time::Duration;

use crate::error::{Error, Result};

/// What a lookup that did not finish in time says.
pub(crate) const LOOKUP_TIMED_OUT: &str = "the DNS lookup of the host name";

/// `host` as an IP address (`[::1]` too), which needs no lookup.
fn address(host: &str) -> Option<IpAddr> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    bare.unwrap_or(host).parse().ok()
}

/// Runs `f` on a short-lived thread and waits for it at most `left` (`None`: as long as it
/// takes). `Err` (a timeout naming `what`) when it is not done in time; `f` then finishes
/// unobserved.
pub(crate) fn within<T, F>(left: Option<Duration>, what: &'static str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = crossbeam_channel::bounded(1);
    thread::Builder::new()
        .name("locksmith-dns".into())
        .spawn(move || {
            // The caller may have given up: nobody to tell then.
            let _ = tx.send(f());
        })
        .map_err(Error::io)?;
    match left {
        Some(left) => rx.recv_timeout(left).map_err(|_| Error::timeout(what)),
        None => rx.recv().map_err(|_| Error::timeout(what)),
    }
}

/// The addresses of `host:port`, within `left`: an IP address at once, a name by a lookup
/// that keeps the bound (see the module's text).
pub(crate) fn lookup(host: &str, port: u16, left: Option<Duration>) -> Result<Vec<SocketAddr>> {
    if let Some(ip) = address(host) {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let name = host.to_owned();
    let found = within(left, LOOKUP_TIMED_OUT, move || {
        (name.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect::<Vec<_>>)
    })?
    .map_err(Error::io)?;
    if found.is_empty() {
        return Err(Error::InvalidUrl {
            reason: format!("the host `{host}` resolves to no address"),
        });
    }
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn addresses_need_no_lookup() {
        assert!(address("127.0.0.1").is_some());
        assert!(address("[::1]").is_some());
        assert!(address("::1").is_some());
        assert!(address("localhost").is_none());
        let a = lookup("127.0.0.1", 6380, Some(Duration::ZERO)).unwrap();
        assert_eq!(a, vec!["127.0.0.1:6380".parse().unwrap()]);
    }

    #[test]
    fn a_name_is_looked_up() {
        let a = lookup("localhost", 6380, Some(Duration::from_secs(5))).unwrap();
        assert!(
            a.iter().all(|a| a.ip().is_loopback() && a.port() == 6380),
            "{a:?}"
        );
    }

    /// A lookup that does not answer (here a step blocked until the test lets it go) costs
    /// the caller its bound, not the lookup's time.
    #[test]
    fn a_step_that_does_not_finish_keeps_the_bound() {
        let (release, blocked) = crossbeam_channel::bounded::<()>(1);
        let started = Instant::now();
        let r = within(
            Some(Duration::from_millis(100)),
            LOOKUP_TIMED_OUT,
            move || blocked.recv().ok(),
        );
        let took = started.elapsed();
        assert!(
            matches!(r, Err(Error::Timeout { what, .. }) if what == LOOKUP_TIMED_OUT),
            "{r:?}"
        );
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_secs(1),
            "{took:?}"
        );
        release.send(()).unwrap();
    }
}
