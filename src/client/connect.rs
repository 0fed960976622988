//! How a [`ClientBuilder`] connects: [`ClientBuilder::build`] for one server, a Sentinel
//! master or a quorum, its cluster path, the TLS set-up of `rediss://` URLs, and the warning
//! for masters that may evict lock keys.
//!
//! Apart from the builder's options (`builder.rs`) because this is where the client meets
//! Redis: the topology is made, the first connections open within their bounds, and the two
//! threads start. The options only record and check settings, and do no I/O.
//!
//! Its log lines keep the parent's target, `locksmith::client::builder`: operators filter on
//! the targets that "Log levels" in the crate docs lists.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo};

use super::Client;
use super::builder::{ClientBuilder, DEFAULT_MASTER_TIMEOUT, Topology};
use crate::error::{Error, Result, ensure};
use crate::shared::Core;
use crate::shared::config::Config;
use crate::stats::Counters;
use crate::subscriber::{Reader, Subscriber};
use crate::topology::backend::{Backend, Node};
use crate::topology::cluster::Cluster;
use crate::topology::sentinel::Sentinel;
use crate::transport::conn::Resolve;
use crate::transport::conn::{self, Deadline, Pool};
use crate::transport::diagnose;
use crate::transport::tls::{self, Tls};

impl ClientBuilder {
    /// Checks the settings, connects to Redis and starts the client's two threads.
    ///
    /// Returns within twice the connect timeout plus the command timeout (one master): a
    /// command connection that answers `PING`, then the pub/sub connection.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] or [`Error::InvalidUrl`] for bad settings (before any I/O);
    /// [`Error::Tls`] when a certificate given to the builder is unusable (before any I/O) or
    /// a TLS connection cannot be set up (naming the check that failed);
    /// [`Error::Redis`] when Redis cannot be reached within the connect timeout or refuses
    /// the connection; [`Error::Spawn`] when a thread cannot be started.
    pub fn build(self) -> Result<Client> {
        let config = self.config()?;
        let master_settings = self.master_settings()?;
        // How each master is reached, where a Sentinel master is now, and the TLS set-up.
        let (infos, resolver, tls) = match &self.topology {
            Topology::Cluster(seeds) => {
                let infos = parse_urls(seeds)?;
                return self.build_cluster(config, infos);
            }
            Topology::Single(server) => self.masters(vec![server.info()?])?,
            Topology::Quorum(urls) => self.masters(parse_urls(urls)?)?,
            Topology::Sentinel { sentinels, master } => {
                let sentinel_infos = parse_urls(sentinels)?;
                // The master is reached over TLS exactly when the sentinels are.
                let tls = self.tls_setup(&sentinel_infos)?;
                let sentinel = Arc::new(Sentinel::new(
                    sentinels,
                    sentinel_infos.clone(),
                    master,
                    config.timeouts,
                    master_settings,
                    tls.as_deref(),
                )?);
                // A TLS failure with the sentinels is named like one with a master.
                let info = sentinel
                    .resolve(Deadline::after(config.one_call()), true)
                    .map_err(|e| {
                        diagnose::explain(e, &sentinel_infos, tls.as_deref(), config.timeouts)
                    })?;
                (vec![info], Some(sentinel), tls)
            }
        };
        // What each master is called in messages: a Sentinel master by its name, as it moves.
        let names = match &self.topology {
            Topology::Sentinel { master, .. } => vec![format!("the Sentinel master `{master}`")],
            _ => infos.iter().map(conn::server_name).collect(),
        };
        // A quorum's connections open within the per-master timeout, so that a stalled
        // master delays a call by no more than that.
        let (call_timeout, node_timeouts) = match self.topology {
            Topology::Quorum(_) => {
                let t = self.master_timeout.unwrap_or(DEFAULT_MASTER_TIMEOUT);
                let mut timeouts = config.timeouts;
                timeouts.connect = timeouts.connect.min(t.max(Duration::from_millis(50)));
                (t, timeouts)
            }
            _ => (config.timeouts.command, config.timeouts),
        };
        // Where a Sentinel master is now, for the command pools and the pub/sub connection.
        let moves = resolver.clone().map(|r| r as Arc<dyn Resolve>);
        let mut nodes = Vec::new();
        for (info, name) in infos.iter().zip(names) {
            let pool = Pool::new(info.clone(), node_timeouts, tls.as_ref())?;
            nodes.push(Node::new(name, pool.with_resolver(moves.clone())));
        }
        let command = config.timeouts.command;
        let backend = Backend::new(nodes, call_timeout, command, self.drift_factor);
        let backend = Arc::new(backend.with_wait_replicas(config.wait_replicas));
        // Connect eagerly, so that a wrong address fails here and not in the first lock().
        backend
            .ping(Deadline::after(config.one_call()))
            .map_err(|e| match resolver {
                Some(_) => conn::auth_hint(
                    e,
                    "the Sentinel master",
                    "its credentials are set with master_auth (a sentinel URL's own \
                     user:password are the sentinel's)",
                ),
                None => e,
            })
            .map_err(|e| diagnose::explain(e, &infos, tls.as_deref(), node_timeouts))?;
        self.start(config, backend, |counters| {
            let (subscriber, reader) =
                Subscriber::connect(infos, node_timeouts, tls, moves, counters)?;
            if let Some(r) = &resolver {
                // When the command side finds the master elsewhere, the pub/sub connection
                // follows.
                let sub = Arc::downgrade(&subscriber);
                r.on_switch(move || sub.upgrade().map_or((), |s| s.reconnect_now()));
            }
            Ok((subscriber, reader))
        })
    }

    /// Starts the client on `backend`, whose masters answered: warns of masters that may
    /// evict lock keys, counts from here on, opens the pub/sub side (`subscribe`, given the
    /// counters) and starts the client's threads.
    fn start(
        self,
        config: Config,
        backend: Arc<Backend>,
        subscribe: impl FnOnce(Arc<Counters>) -> Result<(Arc<Subscriber>, Reader)>,
    ) -> Result<Client> {
        warn_if_locks_evictable(&backend);
        let counters = Arc::new(Counters::new(self.metrics_lock_names));
        let (subscriber, reader) = subscribe(Arc::clone(&counters))?;
        let core = Core::start(config, backend, subscriber, reader, self.on_lost, counters)?;
        Ok(Client { core })
    }

    /// Connects to a Redis Cluster (its seeds as `infos`): the slot map from a seed, every
    /// master's `PING`, then the client's threads (the pub/sub connections open when waiters
    /// need them).
    fn build_cluster(self, config: Config, infos: Vec<ConnectionInfo>) -> Result<Client> {
        if let Some(bad) = infos.iter().find(|i| {
            !matches!(
                i.addr(),
                ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }
            )
        }) {
            return Err(Error::InvalidUrl {
                reason: format!("a cluster node needs a TCP address, not {}", bad.addr()),
            });
        }
        let db0 = infos.iter().all(|i| i.redis_settings().db() == 0);
        ensure(db0, "seeds", "a cluster has database 0 only")?;
        let tls = self.tls_setup(&infos)?;
        let over_tls = |i: &ConnectionInfo| matches!(i.addr(), ConnectionAddr::TcpTls { .. });
        let mixed = infos.iter().any(over_tls) != infos.iter().all(over_tls);
        ensure(!mixed, "seeds", "must all be redis:// or all be rediss://")?;
        let timeouts = config.timeouts;
        let cluster = Arc::new(Cluster::new(infos.clone(), timeouts, tls.clone())?);
        let backend = Backend::for_cluster(cluster.clone(), timeouts.command, self.drift_factor);
        backend
            .ping(Deadline::after(config.one_call()))
            .map_err(|e| diagnose::explain(e, &infos, tls.as_deref(), timeouts))?;
        self.start(config, Arc::new(backend), |counters| {
            let (subscriber, reader) =
                Subscriber::sharded(cluster.clone(), timeouts, tls, counters)?;
            let sub = Arc::downgrade(&subscriber);
            cluster.on_change(move || sub.upgrade().map_or((), |s| s.map_changed()));
            Ok((subscriber, reader))
        })
    }
}

impl ClientBuilder {
    /// The masters of one server or of a quorum, given by `infos`: how each is reached, and
    /// the TLS set-up (no resolver: they do not move).
    fn masters(&self, infos: Vec<ConnectionInfo>) -> Result<Masters> {
        let tls = self.tls_setup(&infos)?;
        Ok((infos, None, tls))
    }

    /// The TLS set-up for the `rediss://` masters among `infos` (`None` without any). Logs
    /// a warning once for `#insecure` URLs. Refuses what this build's features cannot serve
    /// (see [`tls::check_features`]).
    fn tls_setup(&self, infos: &[ConnectionInfo]) -> Result<Option<Arc<Tls>>> {
        // Each `rediss://` master's `#insecure` flag.
        let flags = infos.iter().filter_map(|i| match i.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => Some(*insecure),
            _ => None,
        });
        let (verified, insecure) = (flags.clone().any(|i| !i), flags.clone().any(|i| i));
        // Before any I/O: a `rediss://` URL or a certificate that this build cannot use.
        tls::check_features(&self.tls, verified, insecure)?;
        if !verified && !insecure {
            return Ok(None);
        }
        if insecure {
            log::warn!(
                target: "locksmith::client::builder",
                "a rediss:// URL ends in #insecure: the server's certificate is NOT verified, \
                 so anyone on the path can pose as that server"
            );
        }
        let tls = Tls::new(self.tls.clone(), verified, insecure)?;
        Ok(Some(Arc::new(tls)))
    }
}

/// How each master is reached, where it is now (a master that Sentinel names) and the TLS
/// set-up.
type Masters = (Vec<ConnectionInfo>, Option<Arc<Sentinel>>, Option<Arc<Tls>>);

/// Each URL checked (see [`conn::parse_url`]).
fn parse_urls(urls: &[String]) -> Result<Vec<ConnectionInfo>> {
    urls.iter().map(|u| conn::parse_url(u)).collect()
}

/// Logs a warning for each master that may evict lock keys to make room: a `maxmemory` limit
/// with a `maxmemory-policy` other than `noeviction`. Lock keys carry an expiry, so the
/// `volatile-*` policies evict them as readily as the `allkeys-*` ones; an evicted lock key is
/// a lock granted twice (and an evicted fencing mark, which `allkeys-*` may pick, loosens the
/// token order as `docs/key-layout.md` says). Skipped quietly where `CONFIG GET` is refused
/// (an ACL, a managed service).
fn warn_if_locks_evictable(backend: &Backend) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory*");
    for (master, reply) in backend.each_master(cmd) {
        // An array of pairs in RESP2, a map in RESP3: the `redis` crate reads both.
        let settings: HashMap<String, String> = match reply {
            Ok(v) => redis::from_redis_value(v).unwrap_or_default(),
            Err(e) => {
                log::debug!(
                    target: "locksmith::client::builder",
                    "CONFIG GET maxmemory* refused by {master}: {e}"
                );
                continue;
            }
        };
        let limit: Option<u64> = settings.get("maxmemory").and_then(|v| v.parse().ok());
        match (limit, settings.get("maxmemory-policy")) {
            (Some(limit), Some(policy)) if limit > 0 && policy != "noeviction" => log::warn!(
                target: "locksmith::client::builder",
                "Redis at {master} may evict lock keys: maxmemory-policy is {policy} with \
                 maxmemory {limit}; use noeviction, or an evicted lock can be granted twice"
            ),
            _ => {}
        }
    }
}
