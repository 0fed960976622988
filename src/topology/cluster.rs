//! The Redis Cluster topology: the slot map, one pool of command connections per master,
//! and the routing of every script call to the master of its lock's slot.
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
//! - **Renewal** calls (one slot each) are pipelined per master; a call that meets a
//!   redirection or a failed connection is retried alone through the routing above, within
//!   the batch's budget.
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
//! This file holds the cluster's state (the slot map, the nodes and their pools), the map's
//! reading, and the routing of calls. Apart from it:
//!
//! - `cluster/slots.rs`: the replies that name slots (`CLUSTER SHARDS`, `CLUSTER SLOTS`,
//!   `MOVED`, `ASK`) parsed, and the slot of a call.
//! - `cluster/renew.rs`: a batch of renewals, pipelined per master.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::{ConnectionAddr, ConnectionInfo, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::protocol::keys::{self, SLOTS};
use crate::protocol::scripts::Call;
use crate::subscriber::ShardMap;
use crate::transport::conn::{Deadline, Pool, Timeouts};
use crate::transport::fault::Fault;
use crate::transport::tls::Tls;

mod renew;
mod slots;

use super::send::{Flavor, Part, Round, one};
use slots::redirect;
use slots::{Range, call_slot, parse_shards, parse_slots};

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

/// One node (a master, as far as the map knows) and its pool.
#[derive(Debug)]
pub(crate) struct ClusterNode {
    /// `host:port`, for messages and as the node's identity.
    pub(crate) name: String,
    /// How to reach it (with the seeds' credentials and TLS).
    pub(crate) info: ConnectionInfo,
    pub(crate) pool: Pool,
    /// Its last map read failed: it is asked after every other node.
    demoted: AtomicBool,
}

/// The slot map: each slot's master, as last read or learnt from a `MOVED`.
#[derive(Debug)]
struct SlotMap {
    owner: Vec<Option<Arc<ClusterNode>>>,
}

/// Called when a slot's master changed (the pub/sub thread resubscribes).
type OnChange = Box<dyn Fn() + Send + Sync>;

/// A Redis Cluster: seeds, the slot map and the nodes' pools.
pub(crate) struct Cluster {
    seeds: Vec<ConnectionInfo>,
    timeouts: Timeouts,
    tls: Option<Arc<Tls>>,
    map: RwLock<SlotMap>,
    nodes: Mutex<HashMap<String, Arc<ClusterNode>>>,
    /// Counts changes of the map.
    epoch: AtomicU64,
    last_refresh: Mutex<Option<Instant>>,
    on_change: Mutex<Option<OnChange>>,
    /// Whether the Mutex acquire and release go as `FCALL` of the sharded function library
    /// (every master loaded and ran it at `start`).
    functions: AtomicBool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("seeds", &self.seeds.len())
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What one try of a command on one node came to.
enum Tried {
    /// A reply (maybe a server error other than a redirection).
    Done(Value),
    /// `MOVED`/`ASK` to this node.
    Moved(u16, String, u16),
    Ask(String, u16),
    /// Worth another try after reading the map again (and a short backoff).
    Again(Fault),
}

fn classify(v: Value) -> Tried {
    let Value::ServerError(e) = &v else {
        return Tried::Done(v);
    };
    match e.kind() {
        Some(ServerErrorKind::Moved) => match redirect(e.details()) {
            Some((slot, host, port)) => Tried::Moved(slot, host, port),
            None => Tried::Done(v),
        },
        Some(ServerErrorKind::Ask) => match redirect(e.details()) {
            Some((_, host, port)) => Tried::Ask(host, port),
            None => Tried::Done(v),
        },
        Some(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => Tried::Again(Fault::Redis(e.clone().into())),
        _ => Tried::Done(v),
    }
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
            functions: AtomicBool::new(false),
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

    fn uses_tls(&self) -> bool {
        matches!(self.seeds[0].addr(), ConnectionAddr::TcpTls { .. })
    }

    /// The node at `host:port` (its pool made on first use).
    pub(crate) fn node(&self, host: &str, port: u16) -> Result<Arc<ClusterNode>> {
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
        let pool = Pool::new(info.clone(), self.timeouts, self.tls.as_ref())?;
        let node = Arc::new(ClusterNode {
            name: name.clone(),
            info,
            pool,
            demoted: AtomicBool::new(false),
        });
        Ok(Arc::clone(self.nodes.lock().entry(name).or_insert(node)))
    }

    fn seed_node(&self, i: usize) -> Result<Arc<ClusterNode>> {
        match self.seeds[i].addr() {
            ConnectionAddr::Tcp(h, p)
            | ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => self.node(h, *p),
            _ => Err(Error::InvalidUrl {
                reason: "a cluster node needs a TCP address".into(),
            }),
        }
    }

    /// The master of `slot`, as the map knows it.
    pub(crate) fn owner(&self, slot: u16) -> Option<Arc<ClusterNode>> {
        self.map.read().owner[usize::from(slot % SLOTS)].clone()
    }

    /// The distinct masters of the map.
    pub(crate) fn masters(&self) -> Vec<Arc<ClusterNode>> {
        let map = self.map.read();
        let mut out: Vec<Arc<ClusterNode>> = Vec::new();
        for n in map.owner.iter().flatten() {
            if !out.iter().any(|m| Arc::ptr_eq(m, n)) {
                out.push(Arc::clone(n));
            }
        }
        out
    }

    /// Records `node` as the master of the slots `start..=end`; whether anything changed.
    fn assign(&self, ranges: &[(u16, u16, Arc<ClusterNode>)]) -> bool {
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
    fn read_map(&self, node: &ClusterNode, by: Deadline) -> Result<Vec<Range>, Fault> {
        let by = by.min(Deadline::after(per_node(self.timeouts)));
        let mut con = match node.pool.idle() {
            Some(c) => c,
            None => node.pool.connect(by)?,
        };
        let t = self.timeouts.command;
        let shards = redis::cmd("CLUSTER").arg("SHARDS").get_packed_command();
        con.send(&shards, t, by)?;
        let v = con.recv(t, by)?;
        let ranges = match &v {
            Value::ServerError(_) => {
                // An older server: CLUSTER SLOTS.
                let slots = redis::cmd("CLUSTER").arg("SLOTS").get_packed_command();
                con.send(&slots, t, by)?;
                let v = con.recv(t, by)?;
                if let Value::ServerError(e) = v {
                    return Err(Fault::Redis(e.into()));
                }
                parse_slots(&v)
            }
            v => parse_shards(v, self.uses_tls()),
        };
        node.pool.put(con);
        // A node that never met another (a one-master cluster) does not know its own IP and
        // says "" (or "?"): that means the address it was asked at.
        let asked = node.name.rsplit_once(':').map_or("", |(h, _)| h);
        let ranges = ranges.map(|rs| {
            rs.into_iter()
                .map(|mut r| {
                    if r.host.is_empty() || r.host == "?" {
                        asked.clone_into(&mut r.host);
                    }
                    r
                })
                .collect::<Vec<_>>()
        });
        ranges.filter(|r| !r.is_empty()).ok_or_else(|| {
            Fault::from(redis::RedisError::from(std::io::Error::other(format!(
                "{} gave no usable slot map (is it a cluster node?)",
                node.name
            ))))
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
        let mut candidates = self.masters();
        for i in 0..self.seeds.len() {
            if let Ok(n) = self.seed_node(i)
                && !candidates.iter().any(|c| Arc::ptr_eq(c, &n))
            {
                candidates.push(n);
            }
        }
        // Nodes that are not masters any more, but known, are worth asking too.
        for n in self.nodes.lock().values() {
            if !candidates.iter().any(|c| Arc::ptr_eq(c, n)) {
                candidates.push(Arc::clone(n));
            }
        }
        // A stable sort: the order above among the nodes that answered last time, and
        // among those that did not.
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
                    let mut assigned = Vec::with_capacity(ranges.len());
                    for r in ranges {
                        assigned.push((r.start, r.end, self.node(&r.host, r.port)?));
                    }
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

    /// How the cluster sends: with the sharded scripts, within `by` and the command timeout;
    /// a `READONLY` reply is left to the routing, a broken connection drops the node's pool.
    fn sender(&self, step: Option<Duration>, by: Deadline) -> Round<impl Fn(usize, &Pool, &Fault)> {
        Round {
            flavor: Flavor::Sharded,
            command: self.timeouts.command,
            reply: self.timeouts.command,
            step,
            by,
            fresh: false,
            readonly_fails: false,
            failed: |_, pool: &Pool, e: &Fault| {
                if e.is_broken() {
                    pool.clear();
                }
            },
        }
    }

    /// Sends `packed` (one command) to `node`, preceded by `ASKING` when `asking`, and reads
    /// its reply (see [`Round`]: the scripts are loaded and the command resent after
    /// `NOSCRIPT`). Within `by`.
    fn try_on(
        &self,
        node: &ClusterNode,
        packed: &[u8],
        asking: bool,
        by: Deadline,
    ) -> Result<Value, Fault> {
        let mut out = Vec::with_capacity(packed.len() + 20);
        if asking {
            redis::cmd("ASKING").write_packed_command(&mut out);
        }
        out.extend_from_slice(packed);
        let part = Part::new(0, &node.pool, &out, 1 + usize::from(asking));
        let reply = self.sender(None, by).run(vec![part]).pop();
        reply
            .map_or(Err(Fault::timeout("no reply")), |(_, r)| r)
            .and_then(|mut v| v.pop().ok_or(Fault::timeout("no reply")))
    }

    /// Runs one command on the master of `slot`, following redirections and retrying after
    /// transient cluster errors, within `by` (and at most [`MAX_REDIRECTS`] tries).
    pub(crate) fn run(&self, slot: u16, packed: &[u8], by: Deadline) -> Result<Value, Fault> {
        let mut ask: Option<Arc<ClusterNode>> = None;
        let mut backoff = BACKOFF_MIN;
        let mut last: Option<Fault> = None;
        for _ in 0..MAX_REDIRECTS {
            if by.passed() {
                break;
            }
            let (node, asking) = match ask.take() {
                Some(n) => (n, true),
                None => match self.owner(slot) {
                    Some(n) => (n, false),
                    None => {
                        if let Err(e) = self.refresh(by, false) {
                            last = Some(e);
                        }
                        match self.owner(slot) {
                            Some(n) => (n, false),
                            None => {
                                self.pause(&mut backoff, by);
                                continue;
                            }
                        }
                    }
                },
            };
            let tried = match self.try_on(&node, packed, asking, by) {
                Ok(v) => classify(v),
                Err(e) if e.is_broken() => Tried::Again(e),
                Err(e) => return Err(e),
            };
            match tried {
                Tried::Done(v) => return Ok(v),
                Tried::Moved(s, host, port) => {
                    let n = self.node(&host, port)?;
                    log::debug!("slot {s} moved to {}", n.name);
                    self.assign(&[(s, s, n)]);
                }
                Tried::Ask(host, port) => ask = Some(self.node(&host, port)?),
                Tried::Again(e) => {
                    log::debug!("cluster call on {} failed: {e}; retrying", node.name);
                    last = Some(e);
                    self.pause(&mut backoff, by);
                    if let Err(e) = self.refresh(by, false) {
                        log::debug!("slot map not read: {e}");
                    }
                }
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

    /// Runs the plain command `cmd` on the master of its key's slot, within `by`.
    pub(crate) fn command(&self, cmd: &redis::Cmd, by: Deadline) -> Result<Value, Fault> {
        self.run(call_slot(cmd), &cmd.get_packed_command(), by)
    }

    /// Runs a script call on its slot's master (the sharded script), within `by`.
    pub(crate) fn call(&self, call: &Call, by: Deadline) -> Result<Value, Fault> {
        self.run(call_slot(&call.cmd), &self.packed(call), by)
    }

    /// Reads the map and checks that every master answers `PING` and has the scripts
    /// loaded, and the function library (the Mutex acquire and release go as `FCALL` when every
    /// master loaded and ran it; see [`Round::start`]), within `by`. Fails when no node gives
    /// a map, or a master does not answer.
    pub(crate) fn start(&self, by: Deadline) -> Result<()> {
        self.refresh(by, true)?;
        let masters = self.masters();
        let pools: Vec<(usize, &Pool)> = masters.iter().map(|n| &n.pool).enumerate().collect();
        let name = |i: usize| masters[i].name.clone();
        let (answers, functions) = self.sender(None, by).start(&pools, name);
        for (_, r) in answers {
            r?;
        }
        self.functions.store(functions, Ordering::Relaxed);
        Ok(())
    }

    /// `call` packed as this cluster sends it: the sharded script or function.
    fn packed(&self, call: &Call) -> Vec<u8> {
        Flavor::Sharded.pack(call, self.functions.load(Ordering::Relaxed))
    }

    /// Runs `cmd` on every master, all within one connect and one command timeout.
    pub(crate) fn each_master(&self, cmd: &redis::Cmd) -> Vec<(String, Result<Value, Fault>)> {
        let by = Deadline::after(self.timeouts.connect.saturating_add(self.timeouts.command));
        self.masters()
            .into_iter()
            .map(|n| (n.name.clone(), self.on(&n, cmd, by)))
            .collect()
    }

    /// Runs `cmd` on `node` (one of [`masters`](Self::masters)), within `by`; a server error
    /// as `Err`.
    pub(crate) fn on(
        &self,
        node: &ClusterNode,
        cmd: &redis::Cmd,
        by: Deadline,
    ) -> Result<Value, Fault> {
        self.try_on(node, &cmd.get_packed_command(), false, by)
            .and_then(|v| one(Some(v)))
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
            .map(|n| (n.name.clone(), n.info.clone()))
    }

    fn learn_moved(&self, details: Option<&str>) {
        Cluster::learn_moved(self, details)
    }
}
