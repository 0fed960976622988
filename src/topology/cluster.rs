//! The Redis Cluster topology: the slot map, a [`Node`] per master (its pool of command
//! connections, as every topology's masters have), and the routing of every script call to
//! the master of its lock's slot. Sending is `topology/send.rs`'s [`Round`], as for every
//! topology; what is the cluster's own is the map, the routing and the redirections.
//!
//! # How calls are routed
//!
//! - **Slot map.** Read with `CLUSTER SHARDS` (Redis 7), or `CLUSTER SLOTS` where a server
//!   does not know it, from any known node: the masters of the current map first, then the
//!   seeds, each within the per-node bound ([`per_node`]: the smaller of [`PER_NODE`] (1 s)
//!   and the connect and command timeouts). A node that did not give the map is asked after
//!   every other from then on, until it gives one again: so a frozen node (one that accepts
//!   connections and never answers) costs one per-node bound, once, not a call's whole
//!   budget. The map is read again when a call meets a redirection it cannot follow from
//!   the reply alone (`CLUSTERDOWN`, `READONLY`, a lost connection), at most every
//!   [`REFRESH_GAP`], and by the pub/sub thread every [`RESOLVE_EVERY`](crate::transport::conn::RESOLVE_EVERY)
//!   while it has shard connections.
//! - **Routing.** Every key of one lock (and its release channel) share one hash tag, hence
//!   one slot (see `keys.rs`): a script call goes to the slot's master, whole. A call never
//!   spans two slots, so `CROSSSLOT` cannot happen.
//! - **Redirections**, all within the call's bound: `MOVED` records the slot's new master and
//!   retries there; `ASK` sends `ASKING` and the command once to the named node; `TRYAGAIN`,
//!   `CLUSTERDOWN`, `MASTERDOWN`, `READONLY` (a demoted master) and lost connections read the
//!   map again and retry after a short backoff (20 ms doubling to 200 ms). The scripts are
//!   idempotent per request id, so a retry after a lost reply does no harm.
//! - **Sharded pub/sub.** On a cluster the scripts publish with `SPUBLISH` (the same scripts
//!   with `publish` replaced by `spublish`, under their own SHA1: `topology/send.rs`'s
//!   `Flavor::Sharded`), so a release reaches only
//!   the shard that owns the lock's slot; the pub/sub thread `SSUBSCRIBE`s each channel on
//!   its slot's master (see `subscriber/pubsub_thread.rs`).
//! - **Renewal** calls (one slot each) are pipelined per master, as every topology renews
//!   (`backend/renew.rs`); a call that meets a redirection or a failed connection is retried
//!   alone through the routing above ([`Cluster::run`]), within the batch's budget.
//!
//! # What is our own, and why
//!
//! The `redis` crate's synchronous `ClusterConnection` routes commands and follows `MOVED`
//! and `ASK`, but it has no pub/sub (let alone sharded pub/sub), opens its connections with
//! its own timeouts (not within a call's deadline), runs its handshake outside our bounded
//! one, and keeps one connection per node where locksmith pools several (so threads working
//! on different locks never queue behind one socket). So the routing is ours, over the same
//! pooled, deadline-bound connections as the other topologies (`conn.rs`). The slot of a key
//! is computed by `keys.rs` (CRC16/XMODEM, checked against `CLUSTER KEYSLOT`); what is used
//! from the crate is the connection, the RESP parser, the error kinds (`MOVED`, `ASK`, ...)
//! and the command encoding.
//!
//! # Files
//!
//! This file holds the cluster's state (the slot map and its nodes), the map's reading, and
//! the routing of calls. Apart from it, `cluster/slots.rs`: the replies that name slots
//! (`CLUSTER SHARDS`, `CLUSTER SLOTS`, `MOVED`, `ASK`) parsed, and the slot of a call.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::{ConnectionAddr, ConnectionInfo, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::protocol::keys::{self, SLOTS};
use crate::subscriber::ShardMap;
use crate::transport::conn::{Deadline, Pool, Timeouts};
use crate::transport::fault::Fault;
use crate::transport::tls::Tls;

mod slots;

use super::send::{Flavor, Node, Part, Round};
pub(crate) use slots::call_slot;
use slots::{Range, parse_shards, parse_slots, redirect};

/// The least time between two reads of the slot map prompted by failures.
pub(crate) const REFRESH_GAP: Duration = Duration::from_millis(50);
/// The most one node may take to give the slot map (connect, handshake and answer
/// together), unless the connect or command timeout is shorter: a node that takes longer is
/// frozen or overloaded, and the others are asked.
pub(crate) const PER_NODE: Duration = Duration::from_secs(1);

/// The bound of one node's answer to a map read under `timeouts`.
pub(crate) fn per_node(timeouts: Timeouts) -> Duration {
    PER_NODE.min(timeouts.connect).min(timeouts.command)
}

/// The most redirections one call follows.
const MAX_REDIRECTS: usize = 16;
/// Retry backoff bounds after `TRYAGAIN`, `CLUSTERDOWN` or a lost connection.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// The slot map: each slot's master, as last read or learnt from a `MOVED`.
#[derive(Debug)]
struct SlotMap {
    owner: Vec<Option<Arc<Node>>>,
}

/// Called when a slot's master changed (the pub/sub thread resubscribes).
type OnChange = Box<dyn Fn() + Send + Sync>;

/// A Redis Cluster: seeds, the slot map and the nodes' pools.
pub(crate) struct Cluster {
    seeds: Vec<ConnectionInfo>,
    timeouts: Timeouts,
    tls: Option<Arc<Tls>>,
    map: RwLock<SlotMap>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Counts changes of the map.
    epoch: AtomicU64,
    last_refresh: Mutex<Option<Instant>>,
    on_change: Mutex<Option<OnChange>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seeds", &self.seeds.len())
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Whether the reply `v` of one try is not final: a redirection (`MOVED`, `ASK`) that names
/// a node, or an error worth another try after reading the map again.
pub(crate) fn redirected(v: &Value) -> bool {
    let Value::ServerError(e) = v else {
        return false;
    };
    match e.kind() {
        Some(ServerErrorKind::Moved | ServerErrorKind::Ask) => redirect(e.details()).is_some(),
        kind => transient(kind),
    }
}

/// Whether a server's error of this kind is worth another try after reading the map again
/// (and a short backoff).
fn transient(kind: Option<ServerErrorKind>) -> bool {
    matches!(
        kind,
        Some(
            ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    )
}

impl Cluster {
    /// Checks the seed URLs; no I/O.
    pub(crate) fn new(
        seeds: Vec<ConnectionInfo>,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
    ) -> Result<Self> {
        if seeds.is_empty() {
            return Err(Error::config(
                "seeds",
                "must name at least one cluster node URL",
            ));
        }
        Ok(Cluster {
            seeds,
            timeouts,
            tls,
            map: RwLock::new(SlotMap {
                owner: vec![None; usize::from(SLOTS)],
            }),
            nodes: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            last_refresh: Mutex::new(None),
            on_change: Mutex::new(None),
        })
    }

    /// Sets what to do when a slot's master changes.
    pub(crate) fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.on_change.lock() = Some(Box::new(f));
    }

    /// Counts changes of the slot map.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The node at `host:port` (its pool made on first use).
    pub(crate) fn node(&self, host: &str, port: u16) -> Result<Arc<Node>> {
        let name = format!("{host}:{port}");
        if let Some(n) = self.nodes.lock().get(&name) {
            return Ok(Arc::clone(n));
        }
        let mut addr = self.seeds[0].addr().clone();
        match &mut addr {
            ConnectionAddr::Tcp(h, p)
            | ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => {
                *h = host.to_owned();
                *p = port;
            }
            _ => addr = ConnectionAddr::Tcp(host.to_owned(), port),
        }
        let info = self.seeds[0].clone().set_addr(addr);
        let pool = Pool::new(info, self.timeouts, self.tls.as_ref())?;
        let node = Arc::new(Node::new(name.clone(), pool));
        Ok(Arc::clone(self.nodes.lock().entry(name).or_insert(node)))
    }

    /// The master of `slot`, as the map knows it.
    pub(crate) fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.map.read().owner[usize::from(slot % SLOTS)].clone()
    }

    /// The distinct masters of the map.
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        let map = self.map.read();
        let mut out: Vec<Arc<Node>> = Vec::new();
        for n in map.owner.iter().flatten() {
            if !out.iter().any(|m| Arc::ptr_eq(m, n)) {
                out.push(Arc::clone(n));
            }
        }
        out
    }

    /// Records `node` as the master of the slots `start..=end`; whether anything changed.
    fn assign(&self, ranges: &[(u16, u16, Arc<Node>)]) -> bool {
        let mut changed = false;
        {
            let mut map = self.map.write();
            for (start, end, node) in ranges {
                for s in *start..=(*end).min(SLOTS - 1) {
                    let cur = &mut map.owner[usize::from(s)];
                    if !cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, node)) {
                        *cur = Some(Arc::clone(node));
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            if let Some(f) = &*self.on_change.lock() {
                f();
            }
        }
        changed
    }

    /// Records what a `MOVED` reply's details say (`slot host:port`).
    pub(crate) fn learn_moved(&self, details: Option<&str>) {
        if let Some((slot, host, port)) = redirect(details)
            && let Ok(n) = self.node(&host, port)
        {
            self.assign(&[(slot, slot, n)]);
        }
    }

    /// Asks `node` for the slot map, within `by` and the per-node bound.
    fn read_map(&self, node: &Node, by: Deadline) -> Result<Vec<Range>, Fault> {
        let round = Round {
            flavor: Flavor::Sharded,
            command: self.timeouts.command,
            reply: self.timeouts.command,
            step: None,
            by: by.min(Deadline::after(per_node(self.timeouts))),
            fresh: false,
            pause: None,
        };
        let ask =
            |what: &str| round.ask(node, &redis::cmd("CLUSTER").arg(what).get_packed_command());
        let asked = node.name.rsplit_once(':').map_or("", |(h, _)| h);
        let tls = matches!(self.seeds[0].addr(), ConnectionAddr::TcpTls { .. });
        let ranges = match ask("SHARDS") {
            Ok(v) => parse_shards(&v, tls, asked),
            // An older server: CLUSTER SLOTS.
            Err(Fault::Redis(_)) => parse_slots(&ask("SLOTS")?, asked),
            Err(e) => return Err(e),
        };
        ranges.filter(|r| !r.is_empty()).ok_or_else(|| {
            Fault::from(std::io::Error::other(format!(
                "{} gave no usable slot map (is it a cluster node?)",
                node.name
            )))
        })
    }

    /// Reads the slot map from the first node that answers (the map's masters, then the
    /// seeds, then other known nodes; nodes whose last map read failed after all of them),
    /// each within the per-node bound, all within `by`. `force`: even if it was read less
    /// than [`REFRESH_GAP`] ago.
    pub(crate) fn refresh(&self, by: Deadline, force: bool) -> Result<(), Fault> {
        {
            let mut last = self.last_refresh.lock();
            if !force && last.is_some_and(|t| t.elapsed() < REFRESH_GAP) {
                return Ok(());
            }
            *last = Some(Instant::now());
        }
        // The masters, the seeds, then nodes that are not masters any more but known.
        let seeds: Vec<_> = (self.seeds.iter())
            .filter_map(|seed| match seed.addr() {
                ConnectionAddr::Tcp(h, p)
                | ConnectionAddr::TcpTls {
                    host: h, port: p, ..
                } => self.node(h, *p).ok(),
                _ => None,
            })
            .collect();
        let known: Vec<_> = self.nodes.lock().values().cloned().collect();
        let mut candidates = self.masters();
        for n in seeds.into_iter().chain(known) {
            if !candidates.iter().any(|c| Arc::ptr_eq(c, &n)) {
                candidates.push(n);
            }
        }
        candidates.sort_by_key(|n| n.demoted.load(Ordering::Relaxed));
        let mut last_err = None;
        for node in candidates {
            if by.passed() {
                break;
            }
            let read = self.read_map(&node, by);
            match &read {
                // The caller's bound ran out: nothing learnt about the node.
                Err(Fault::RanOut { .. }) => {}
                r => node.demoted.store(r.is_err(), Ordering::Relaxed),
            }
            match read {
                Ok(ranges) => {
                    let assigned = (ranges.into_iter())
                        .map(|r| Ok((r.start, r.end, self.node(&r.host, r.port)?)))
                        .collect::<Result<Vec<_>>>()?;
                    self.assign(&assigned);
                    return Ok(());
                }
                Err(e) => {
                    log::debug!(
                        "cluster node {} did not give the slot map: {e}; asked last from now on",
                        node.name
                    );
                    node.pool.clear();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or(Fault::timeout("no cluster node answered")))
    }

    /// Runs one command, `packed`, on the master of `slot`, sent as `round` sends (see
    /// [`Round`]: the scripts are loaded and the command resent after `NOSCRIPT`), following
    /// redirections and retrying after transient cluster errors, within the round's bound
    /// (and at most [`MAX_REDIRECTS`] tries). The reply, maybe a server error.
    pub(crate) fn run(&self, slot: u16, packed: &[u8], round: &Round) -> Result<Value, Fault> {
        let by = round.by;
        let mut ask: Option<Arc<Node>> = None;
        let mut backoff = BACKOFF_MIN;
        let mut last: Option<Fault> = None;
        for _ in 0..MAX_REDIRECTS {
            if by.passed() {
                break;
            }
            let asking = ask.is_some();
            if !asking
                && self.owner(slot).is_none()
                && let Err(e) = self.refresh(by, false)
            {
                last = Some(e);
            }
            let Some(node) = ask.take().or_else(|| self.owner(slot)) else {
                self.pause(&mut backoff, by);
                continue;
            };
            let mut out = Vec::with_capacity(packed.len() + 20);
            if asking {
                redis::cmd("ASKING").write_packed_command(&mut out);
            }
            out.extend_from_slice(packed);
            let reply = (round.run_one(Part::new(0, &node, &out, 1 + usize::from(asking))))
                .and_then(|mut v| v.pop().ok_or(Fault::timeout("no reply")));
            let e = match reply {
                Ok(Value::ServerError(e)) => match (e.kind(), redirect(e.details())) {
                    (Some(ServerErrorKind::Moved), Some((s, host, port))) => {
                        let n = self.node(&host, port)?;
                        log::debug!("slot {s} moved to {}", n.name);
                        self.assign(&[(s, s, n)]);
                        continue;
                    }
                    (Some(ServerErrorKind::Ask), Some((_, host, port))) => {
                        ask = Some(self.node(&host, port)?);
                        continue;
                    }
                    (kind, _) if transient(kind) => Fault::Redis(e.into()),
                    _ => return Ok(Value::ServerError(e)),
                },
                Ok(v) => return Ok(v),
                Err(e) if e.is_broken() => e,
                Err(e) => return Err(e),
            };
            log::debug!("cluster call on {} failed: {e}; retrying", node.name);
            last = Some(e);
            self.pause(&mut backoff, by);
            if let Err(e) = self.refresh(by, false) {
                log::debug!("slot map not read: {e}");
            }
        }
        Err(last.unwrap_or(Fault::timeout("the cluster kept redirecting the call")))
    }

    /// Sleeps for the backoff (shortened to what is left of `by`) and doubles it.
    fn pause(&self, backoff: &mut Duration, by: Deadline) {
        let d = by.left().map_or(*backoff, |l| l.min(*backoff));
        thread::sleep(d);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        for n in self.nodes.lock().values() {
            n.pool.clear();
        }
    }
}

impl ShardMap for Cluster {
    fn epoch(&self) -> u64 {
        Cluster::epoch(self)
    }

    fn refresh(&self, by: Deadline, force: bool) -> Result<()> {
        Ok(Cluster::refresh(self, by, force)?)
    }

    fn owner_of(&self, channel: &str) -> Option<(String, ConnectionInfo)> {
        self.owner(keys::slot(channel))
            .map(|n| (n.name.clone(), n.pool.info().clone()))
    }

    fn learn_moved(&self, details: Option<&str>) {
        Cluster::learn_moved(self, details)
    }
}
