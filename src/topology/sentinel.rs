//! The Sentinel topology: the master that a Redis Sentinel deployment names, found through any
//! sentinel that answers and followed through failovers.
//!
//! # How the master is found and followed
//!
//! - **Discovery.** `SENTINEL get-master-addr-by-name NAME` is asked of the sentinels in turn
//!   until one gives an address, each within the per-sentinel bound ([`per_sentinel`]: the
//!   smaller of [`PER_SENTINEL`] (1 s) and the connect and command timeouts) for its
//!   connect, TLS handshake, `AUTH` and answer together. The order is kept: the sentinel that
//!   answered moves to the front, one that failed (no answer in time, a refused connection,
//!   an error, or no master of that name) to the back. So a frozen sentinel (one that
//!   accepts connections and never answers) costs one per-sentinel bound, once, and is then
//!   asked last, while the others answer; a dead one costs a refused connection. The answer
//!   is cached until a failure makes it doubtful.
//! - **Verification.** Every new command connection to the master sends `ROLE` in its
//!   handshake; a server that is not (or no longer) a master is refused as a connection
//!   failure, and the cached address is forgotten.
//! - **Following a failover.** A connection error or a `READONLY` reply (the old master was
//!   demoted to a replica) drops the pooled connections and forgets the address; the call's
//!   retry (or the renewal's retry on a new connection) asks the sentinels again. After a
//!   graceful switch the old master stays up, a master, until Sentinel demotes it (seconds
//!   later): so the pub/sub thread also asks the sentinels every second or so (when it wakes,
//!   at least every heartbeat of 2 s), each time bounded by a quarter second; a move drops
//!   every pooled connection to the old master (a generation count) and reconnects the
//!   pub/sub connection. This is instead of subscribing to `+switch-master`, which would need
//!   a second pub/sub connection (to a sentinel) read by the same thread. The pub/sub
//!   connection asks the sentinels afresh on every reconnect, and is told to reconnect whenever
//!   the command side finds the master at another address; it then resubscribes and wakes
//!   every local waiter to re-check (see `subscriber/pubsub_thread.rs`). When Sentinel demotes
//!   the old master it closes its clients (`CLIENT KILL`), so both kinds of connection notice
//!   then at the latest.
//! - **Bounds.** A resolution happens inside opening a connection: the sentinel's connect
//!   (with its TLS handshake and `AUTH`), its answer and the master's connect, TLS handshake
//!   and `AUTH`/`SELECT` together keep the connect timeout, and the call's own deadline, so
//!   every call keeps the bound of the crate's "Time bounds".
//!
//! # TLS and credentials
//!
//! As in the `redis` crate's sentinel support (`SentinelNodeConnectionInfo`: a TLS mode and a
//! `RedisConnectionInfo` for the servers the sentinels name), the sentinels and the master are
//! configured apart. A sentinel URL carries the sentinel's own credentials (`user:pass@`,
//! `AUTH` in the `redis` crate's handshake) and scheme. The master's connections, command and
//! pub/sub, use TLS exactly when the sentinel URLs are `rediss://` (not verifying the
//! certificate when they end in `#insecure`), with the builder's certificates, and
//! authenticate with the master's own credentials and database
//! (`ClientBuilder::master_auth`, `ClientBuilder::master_db`), which a sentinel URL cannot
//! carry. So all sentinel URLs must agree on the scheme. The master's certificate is checked
//! against the address the sentinels announce (an IP address unless the deployment announces
//! host names).
//!
//! # Why not `redis::sentinel`
//!
//! The `redis` crate's `SentinelClient` opens its connections with its own timeouts and runs
//! the `ROLE` check as a separate round trip without a caller's deadline; locksmith needs every
//! step of a lock call inside that call's bound, a pooled command connection that it opens
//! itself (its own bounded handshake), and the same address for the pub/sub connection, which
//! is not a `redis` connection. What is used from the crate is the connection to a sentinel
//! and the command encoding.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::error::{Error, RedisFailure, Result};
use crate::transport::conn::{self, Deadline, Resolve, Timeouts};
use crate::transport::fault::Fault;
use crate::transport::link;
use crate::transport::tls::Tls;

/// The most one sentinel may take to answer (connect, TLS handshake, `AUTH` and the answer
/// together), unless the connect or command timeout is shorter: a sentinel answers from
/// memory, so one that takes longer is frozen or overloaded, and the others are asked.
pub(crate) const PER_SENTINEL: Duration = Duration::from_secs(1);

/// The bound of one sentinel's answer under `timeouts`.
pub(crate) fn per_sentinel(timeouts: Timeouts) -> Duration {
    PER_SENTINEL.min(timeouts.connect).min(timeouts.command)
}

/// Called when the master was found at another address than before.
type OnSwitch = Box<dyn Fn() + Send + Sync>;

/// The sentinels of one deployment, and what they last said about the master.
pub(crate) struct Sentinel {
    /// Each sentinel's URL without its password (for messages), and a client for it.
    sentinels: Vec<(String, link::Opener)>,
    /// How the master is reached: `None` over plain TCP, else TLS verifying its certificate
    /// (`Some(false)`) or not (`Some(true)`, `#insecure`).
    master_tls: Option<bool>,
    /// The master's credentials and database.
    master_settings: RedisConnectionInfo,
    /// The order in which the sentinels are asked (indices into `sentinels`): the one that
    /// answered last first, those that failed last.
    order: Mutex<Vec<usize>>,
    master: String,
    timeouts: Timeouts,
    /// The master's address as last resolved (`None` once doubtful), and the last address
    /// it was found at (kept when the first is forgotten), to tell a switch.
    master_at: Mutex<(Option<ConnectionAddr>, Option<ConnectionAddr>)>,
    on_switch: Mutex<Option<OnSwitch>>,
    /// Counts the master's moves.
    generation: AtomicU64,
}

impl fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("master", &self.master)
            .field("sentinels", &self.sentinels.len())
            .finish_non_exhaustive()
    }
}

impl Sentinel {
    /// Checks the sentinel URLs (parsed as `infos`; the builder checked that there is one, and
    /// a master name); no I/O. `settings`:
    /// the master's credentials and database; `tls`: the certificates of `rediss://`
    /// sentinels (and masters).
    pub(crate) fn new(
        urls: &[String],
        infos: Vec<ConnectionInfo>,
        master: &str,
        timeouts: Timeouts,
        settings: RedisConnectionInfo,
        tls: Option<&Tls>,
    ) -> Result<Self> {
        let master_tls = tls_mode(urls, &infos)?;
        let sentinels = infos
            .into_iter()
            .map(|info| Ok((conn::server_name(&info), link::client_for(info, tls)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sentinel {
            sentinels,
            master_tls,
            master_settings: settings,
            order: Mutex::new((0..urls.len()).collect()),
            master: master.to_owned(),
            timeouts,
            master_at: Mutex::new((None, None)),
            on_switch: Mutex::new(None),
            generation: AtomicU64::new(0),
        })
    }

    /// Sets what to do when the master moves (tell the pub/sub connection to follow it).
    pub(crate) fn on_switch(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.on_switch.lock() = Some(Box::new(f));
    }

    /// Asks sentinel `i` for the master's address, within `by` and the per-sentinel bound.
    /// `Ok(None)`: the sentinel does not know a master of that name.
    fn ask(&self, i: usize, by: Deadline) -> Result<Option<ConnectionAddr>, Fault> {
        let by = by.min(Deadline::after(per_sentinel(self.timeouts)));
        let (_, client) = &self.sentinels[i];
        let mut con = link::open(client, by.cap(self.timeouts.connect)?)?;
        let t = by.cap(self.timeouts.command)?;
        con.stream.set_timeouts(Some(t))?;
        let reply = con.query(
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.master),
        )?;
        let named: Option<(String, u16)> =
            redis::from_redis_value(reply).map_err(|e| Fault::Redis(e.into()))?;
        Ok(named.map(|(host, port)| match self.master_tls {
            None => ConnectionAddr::Tcp(host, port),
            Some(insecure) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params: None,
            },
        }))
    }

    /// Asks the sentinels in turn until one names the master, each within the per-sentinel
    /// bound (and all within `by`); moves the one that answered to the front of the order,
    /// and those that failed to the back.
    fn ask_all(&self, by: Deadline) -> Result<ConnectionAddr, Fault> {
        let order = self.order.lock().clone();
        let (mut unknown, mut last_err) = (0, None);
        for i in order {
            if by.passed() {
                break;
            }
            match self.ask(i, by) {
                Ok(Some(addr)) => {
                    self.reorder(i, true);
                    return Ok(addr);
                }
                Ok(None) => {
                    log::debug!(
                        "sentinel {} knows no master `{}`; asked last from now on",
                        self.sentinels[i].0,
                        self.master
                    );
                    unknown += 1;
                }
                Err(e) => {
                    log::debug!(
                        "sentinel {} did not answer: {e}; asked last from now on",
                        self.sentinels[i].0
                    );
                    last_err = Some(e);
                }
            }
            self.reorder(i, false);
        }
        if unknown > 0 && last_err.is_none() {
            return Err(Fault::Other(Error::config(
                "master_name",
                format!(
                    "no sentinel knows a master named `{}` ({unknown} asked)",
                    self.master
                ),
            )));
        }
        Err(match last_err {
            // A refusal of the credentials says where they go.
            Some(Fault::Redis(r)) => match conn::auth_hint(
                Error::Redis(RedisFailure(r)),
                "a sentinel",
                "a sentinel's own user:password go in its URL",
            ) {
                Error::Redis(RedisFailure(r)) => Fault::Redis(r),
                e => Fault::Other(e),
            },
            Some(f) => f,
            None => Fault::timeout("no sentinel answered"),
        })
    }

    /// Sentinel `i` is asked first from now on when it answered, last when it failed (the
    /// others keep their order).
    fn reorder(&self, i: usize, answered: bool) {
        let mut order = self.order.lock();
        order.retain(|&k| k != i);
        let at = if answered { 0 } else { order.len() };
        order.insert(at, i);
    }

    /// Records the master's address; a move bumps the generation (pooled connections to the
    /// old master are dropped) and tells the pub/sub connection to follow.
    fn found(&self, a: &ConnectionAddr) {
        let before = std::mem::replace(
            &mut *self.master_at.lock(),
            (Some(a.clone()), Some(a.clone())),
        );
        if before.1.is_some_and(|l| l != *a) {
            self.generation.fetch_add(1, Ordering::SeqCst);
            log::info!("the master `{}` is now at {a}", self.master);
            if let Some(f) = &*self.on_switch.lock() {
                f();
            }
        }
    }
}

impl Resolve for Sentinel {
    fn resolve(&self, by: Deadline, fresh: bool) -> Result<ConnectionInfo, Fault> {
        let cached = (!fresh).then(|| self.master_at.lock().0.clone()).flatten();
        let addr = match cached {
            Some(a) => a,
            None => self.ask_all(by).inspect(|a| self.found(a))?,
        };
        Ok(addr
            .into_connection_info()?
            .set_redis_settings(self.master_settings.clone()))
    }

    fn forget(&self) {
        self.master_at.lock().0.take();
    }

    fn check(&self, by: Deadline) {
        match self.ask_all(by) {
            Ok(a) => self.found(&a),
            Err(e) => log::debug!("sentinels not reached for `{}`: {e}", self.master),
        }
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// The TLS mode of the master, from the sentinel URLs (which must agree on it): `None` plain,
/// `Some(insecure)` TLS. Also refuses a database in a sentinel URL (a sentinel has none).
fn tls_mode(urls: &[String], infos: &[ConnectionInfo]) -> Result<Option<bool>> {
    let mut mode = None;
    for (k, (url, info)) in urls.iter().zip(infos).enumerate() {
        if info.redis_settings().db() != 0 {
            return Err(Error::config(
                "sentinels",
                format!(
                    "`{}` names a database, but a sentinel has none; set the master's with \
                     master_db",
                    conn::redact(url)
                ),
            ));
        }
        let this = match info.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => Some(*insecure),
            _ => None,
        };
        if k > 0 && this != mode {
            return Err(Error::config(
                "sentinels",
                "mix redis://, rediss:// and rediss://...#insecure URLs; the master is reached \
                 over TLS exactly when the sentinels are, so all sentinel URLs must use one",
            ));
        }
        mode = this;
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_failed_sentinel_is_asked_last_and_one_that_answered_first() {
        let urls: Vec<String> = (1..=3).map(|p| format!("redis://127.0.0.1:{p}/")).collect();
        let infos = urls.iter().map(|u| conn::parse_url(u).unwrap()).collect();
        let timeouts = Timeouts {
            connect: Duration::from_secs(5),
            command: Duration::from_secs(5),
        };
        let s = Sentinel::new(
            &urls,
            infos,
            "m",
            timeouts,
            RedisConnectionInfo::default(),
            None,
        )
        .unwrap();
        s.reorder(0, false);
        assert_eq!(*s.order.lock(), vec![1, 2, 0]);
        s.reorder(1, false);
        assert_eq!(*s.order.lock(), vec![2, 0, 1]);
        s.reorder(1, true);
        assert_eq!(*s.order.lock(), vec![1, 2, 0]);
        // The bound: 1 s, or a shorter connect or command timeout.
        assert_eq!(per_sentinel(timeouts), PER_SENTINEL);
        let short = Timeouts {
            connect: Duration::from_millis(300),
            command: Duration::from_millis(200),
        };
        assert_eq!(per_sentinel(short), Duration::from_millis(200));
    }
}
