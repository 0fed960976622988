//! [`Backend`]: what a lock needs of its masters, whatever the topology: send a call to one
//! master or to all, read each master's reply, and the quorum those replies are weighed by.
//!
//! Every topology's masters are [`Node`]s (`topology/send.rs`), sent to by the same
//! [`Round`] (writes first, then reads, within one bound; `NOSCRIPT` reloads). The topologies
//! differ only in whom a call goes to ([`Route`]):
//!
//! - independent masters: one server (found directly or through Sentinel,
//!   `topology/sentinel.rs`), the quorum 1 of 1, or a quorum `N/2 + 1` of `N` (RedLock);
//!   every call goes to all of them at once, and with a quorum a master whose connection
//!   failed is skipped for a short while (a few times the per-master timeout), so that one
//!   stalled master cannot make every call wait for a new connection to it;
//! - a cluster (`topology/cluster.rs`): each call goes to the master of its lock's slot, as
//!   to one server, following redirections; the quorum is 1.
//!
//! The renewal of a batch of leases, the same for both, is `renew.rs`; a call primed for
//! another thread to write, `prime.rs`; the operator's reads (`SCAN`, a command on every
//! master, a quorum's yes or no), `admin.rs`.
//!
//! The backend knows calls and replies only: what a lock type's arguments and replies mean
//! stays with the lock type (the Mutex acquire and release are in `locks/mutex/`). What the
//! replies of a quorum come to is `topology/quorum.rs`, pure functions over them.
//!
//! With a quorum:
//!
//! - **acquire** holds when at least `Q` masters granted it and the validity
//!   `lease - elapsed - drift` is still positive (`drift = lease * factor + 2 ms`); otherwise
//!   what was granted is released at once, on every master that granted it or did not answer;
//! - **release** succeeds when `Q` masters released; the lease was lost otherwise;
//! - **renewal** keeps a hold when `Q` masters extended it, and loses it when so many refused
//!   that `Q` cannot be reached any more.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::Value;

use super::cluster::{Cluster, call_slot};
pub(crate) use super::quorum::Refusal;
use super::quorum::{replace_replies, worth_retrying};
pub(crate) use super::send::Node;
use super::send::{Flavor, Part, Replies, Round, one};
use crate::error::{Error, Result};
use crate::protocol::scripts::Call;
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;

mod admin;
mod prime;
mod renew;

pub(crate) use prime::Primed;

/// Whom a call goes to: every independent master at once, or its slot's master on a cluster.
#[derive(Debug)]
enum Route {
    Nodes(Vec<Arc<Node>>),
    Cluster(Arc<Cluster>),
}

/// The masters, the quorum, and the bounds of a call.
#[derive(Debug)]
pub(crate) struct Backend {
    route: Route,
    /// The scripts as the masters run them (sharded on a cluster).
    flavor: Flavor,
    /// Whether the Mutex acquire and release go as `FCALL` of the function library (every
    /// master reached at `build()` loaded and ran it; see `protocol/library.rs`).
    functions: AtomicBool,
    /// Bound on one round of calls: the command timeout for one master (plus the replicas'
    /// wait), the per-master timeout for a quorum.
    call_timeout: Duration,
    /// The command timeout (what pooled connections are set to).
    command_timeout: Duration,
    /// Replicas that must confirm each acquire and renewal (`WAIT`), and the wait's timeout.
    wait: Option<(usize, Duration)>,
    /// How many primed calls hold a connection now (at most [`MAX_PRIMED`](prime::MAX_PRIMED)).
    primed: Arc<AtomicUsize>,
    drift_factor: f64,
}

/// The target of the backend's `warn` lines (see the crate docs' table of log lines), for
/// those written in its children as well.
const TARGET: &str = module_path!();

/// A small random duration in `[lo, 2 lo)`, for the RedLock retry delay.
pub(crate) fn jitter(lo: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
    lo + lo * r / 1000
}

impl Backend {
    /// Independent masters: one server, or a quorum of them.
    pub(crate) fn new(
        nodes: Vec<Node>,
        call_timeout: Duration,
        command_timeout: Duration,
        drift_factor: f64,
    ) -> Self {
        Backend {
            route: Route::Nodes(nodes.into_iter().map(Arc::new).collect()),
            flavor: Flavor::Plain,
            functions: AtomicBool::new(false),
            call_timeout,
            command_timeout,
            wait: None,
            primed: Arc::new(AtomicUsize::new(0)),
            drift_factor,
        }
    }

    /// A backend on a Redis Cluster: each lock lives on its slot's master, as on one master.
    pub(crate) fn for_cluster(
        cluster: Arc<Cluster>,
        command_timeout: Duration,
        drift_factor: f64,
    ) -> Self {
        Backend {
            route: Route::Cluster(cluster),
            flavor: Flavor::Sharded,
            ..Backend::new(Vec::new(), command_timeout, command_timeout, drift_factor)
        }
    }

    /// Whether keys spread over Redis Cluster slots: then a script call covers one slot.
    pub(crate) fn spreads_slots(&self) -> bool {
        matches!(self.route, Route::Cluster(_))
    }

    /// Asks for `WAIT replicas timeout` after each acquire and renewal (independent masters
    /// only). A round and each read then allow for the wait as well.
    pub(crate) fn with_wait_replicas(mut self, wait: Option<(usize, Duration)>) -> Self {
        if let (Route::Nodes(_), Some((_, t))) = (&self.route, wait) {
            self.call_timeout = self.call_timeout.saturating_add(t);
            self.wait = wait;
        }
        self
    }

    /// The replicas that must confirm each acquire and renewal, when asked for.
    pub(crate) fn wait_replicas(&self) -> Option<usize> {
        self.wait.map(|(k, _)| k)
    }

    /// How many masters a lock is held on: 1 on a cluster (its slot's master).
    pub(crate) fn masters(&self) -> usize {
        match &self.route {
            Route::Nodes(n) => n.len(),
            Route::Cluster(_) => 1,
        }
    }

    /// The number of masters whose agreement holds a lock (1 of 1, or a majority).
    pub(crate) fn quorum(&self) -> usize {
        self.masters() / 2 + 1
    }

    /// Whether a lock lives on one master (one server, or its slot's master on a cluster).
    pub(crate) fn single(&self) -> bool {
        self.masters() == 1
    }

    /// Every master a call goes to, by index.
    pub(crate) fn all(&self) -> Vec<usize> {
        (0..self.masters()).collect()
    }

    /// The bound on one round of calls: the command timeout for one master (plus the
    /// replicas' wait), the per-master timeout for a quorum.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The command timeout.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The token to raise the masters' fencing marks to: with one master its mark is never
    /// behind, so nothing (0) saves the script a read.
    pub(crate) fn fence(&self, token: u64) -> u64 {
        if self.single() { 0 } else { token }
    }

    /// [`fence`](Backend::fence) for a Mutex script: `None` with one master (a Mutex there
    /// never raises its mark).
    pub(crate) fn fence_of(&self, token: u64) -> Option<u64> {
        (!self.single()).then_some(token)
    }

    /// The part of a lease given up to allow for clock drift between hosts.
    pub(crate) fn drift(&self, lease: Duration) -> Duration {
        lease.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// The bound on one reply: the command timeout, plus the replicas' wait when asked for.
    fn reply_timeout(&self) -> Duration {
        (self.command_timeout).saturating_add(self.wait.map_or(Duration::ZERO, |(_, t)| t))
    }

    /// How a round is sent: reads within `step` of its start and within `by`; `fresh`: a
    /// retry, on new connections. A quorum's master that failed is skipped for a while.
    fn round(&self, step: Option<Duration>, by: Deadline, fresh: bool) -> Round {
        Round {
            flavor: self.flavor,
            command: self.command_timeout,
            reply: self.reply_timeout(),
            step,
            by,
            fresh,
            pause: (!self.single()).then(|| (self.call_timeout * 10).min(Duration::from_secs(1))),
        }
    }

    /// `call` packed as these masters run it: `FCALL` where the function library runs.
    fn pack(&self, call: &Call) -> Vec<u8> {
        self.flavor
            .pack(call, self.functions.load(Ordering::Relaxed))
    }

    /// Sends `packed` (the command `cmd`, packed as the masters run it) to the masters
    /// `targets` at once within `by`: each master's single reply, a server error as `Err`. On
    /// a cluster, to the master of `cmd`'s slot, following redirections. `fresh`: a retry, on
    /// new connections, and to masters marked down too.
    fn one_each(
        &self,
        targets: &[usize],
        cmd: &redis::Cmd,
        packed: &[u8],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        match &self.route {
            Route::Nodes(nodes) => {
                let targets = targets.iter().filter_map(|&i| Some((i, &**nodes.get(i)?)));
                (self.round(Some(self.call_timeout), by, fresh)).each(targets, packed)
            }
            Route::Cluster(c) => {
                let reply = c.run(call_slot(cmd), packed, &self.round(None, by, false));
                vec![(0, reply.and_then(|v| one(Some(v))))]
            }
        }
    }

    /// Runs `call` on the masters `targets` at once, within `by` (on a cluster, on the master
    /// of its slot). `fresh`: a retry, on new connections, and to masters marked down too.
    pub(crate) fn call_on(
        &self,
        call: &Call,
        targets: &[usize],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        self.one_each(targets, &call.cmd, &self.pack(call), by, fresh)
    }

    /// Runs `call` on the one master of a lock (a single server, or its slot's master).
    pub(crate) fn call_one(&self, call: &Call, by: Deadline) -> Result<Value, Fault> {
        self.call_on(call, &[0], by, false)
            .pop()
            .map_or(Err(Fault::timeout("no reply")), |(_, r)| r)
    }

    /// One master with replica confirmation: `call` and `WAIT` in one round trip, within
    /// `by`; the call's reply, and how many replicas confirmed it.
    pub(crate) fn call_waited(&self, call: &Call, by: Deadline) -> (Result<Value, Fault>, usize) {
        let Some(node) = self.wait.and(self.first()) else {
            return (self.call_one(call, by), 0);
        };
        let mut packed = self.pack(call);
        self.push_wait(&mut packed);
        let round = self.round(Some(self.call_timeout), by, false);
        match round.run_one(Part::new(0, node, &packed, 2)) {
            Ok(mut values) => {
                let acked = acked(values.pop().as_ref());
                (one(values.pop()), acked)
            }
            Err(e) => (Err(e), 0),
        }
    }

    /// The first independent master (`None` on a cluster).
    fn first(&self) -> Option<&Node> {
        match &self.route {
            Route::Nodes(n) => n.first().map(|n| &**n),
            Route::Cluster(_) => None,
        }
    }

    /// Appends `WAIT n timeout` to `packed` when replica confirmation is on.
    fn push_wait(&self, packed: &mut Vec<u8>) {
        if let Some((n, t)) = self.wait {
            redis::cmd("WAIT")
                .arg(n)
                .arg(t.as_millis().max(1) as u64)
                .write_packed_command(packed);
        }
    }

    /// Runs `send` on every master at once within `by`, and once more, on a new connection,
    /// on each master whose connection failed (see [`worth_retrying`]), within the same bound:
    /// each master's last reply.
    fn retried(&self, by: Deadline, send: impl Fn(&[usize]) -> Replies<Value>) -> Replies<Value> {
        let mut replies = send(&self.all());
        let retry = worth_retrying(&replies);
        if !retry.is_empty() && !by.passed() {
            replace_replies(&mut replies, send(&retry));
        }
        replies
    }

    /// Runs one script call on the one master of a single-server client (the lock types
    /// whose scripts keep a queue or a set of holders, which a quorum cannot vote on).
    /// Within `by`.
    pub(crate) fn eval_single(&self, call: &Call, by: Deadline) -> Result<Value> {
        if !self.single() {
            return Err(Error::unsupported(
                "this lock type needs a client on one Redis server, Sentinel or a Cluster, \
                 not a quorum of masters",
            ));
        }
        Ok(self.call_one(call, by)?)
    }

    /// Runs one script call on every master at once (on a cluster, the master of its slot),
    /// within `by`, retrying once on a new connection where the connection failed: each
    /// master's reply. For calls that any master may answer on its own (what an operator
    /// reads or does to a lock); the caller weighs the replies.
    pub(crate) fn eval_each(&self, call: &Call, by: Deadline) -> Vec<Result<Value>> {
        let packed = self.pack(call);
        self.retried(by, |to| self.one_each(to, &call.cmd, &packed, by, false))
            .into_iter()
            .map(|(_, r)| r.map_err(Error::from))
            .collect()
    }

    /// The masters now: the independent masters, or a cluster's masters as its map has them
    /// now.
    fn nodes(&self) -> Vec<Arc<Node>> {
        match &self.route {
            Route::Nodes(n) => n.clone(),
            Route::Cluster(c) => c.masters(),
        }
    }

    /// Checks that every master answers and loads the scripts and the function library (see
    /// [`Round::start`]), on a cluster after reading its slot map. Fails when a master whose
    /// answer every lock needs does not answer (one server, a cluster's master); warns of a
    /// master of a quorum that does not. Used once, when the client is built; within `by`.
    pub(crate) fn ping(&self, by: Deadline) -> Result<()> {
        if let Route::Cluster(c) = &self.route {
            c.refresh(by, true)?;
        }
        let nodes = self.nodes();
        let masters: Vec<(usize, &Node)> = nodes.iter().map(|n| &**n).enumerate().collect();
        let (answers, functions) = self
            .round(Some(self.call_timeout), by, false)
            .start(&masters);
        for (i, r) in answers {
            match r {
                Err(e) if self.quorum() == 1 => return Err(e.into()),
                Err(e) => {
                    let name = &masters[i].1.name;
                    log::warn!(target: TARGET, "master {name} did not answer: {e}");
                }
                Ok(()) => {}
            }
        }
        self.functions.store(functions, Ordering::Relaxed);
        Ok(())
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        match &self.route {
            Route::Nodes(n) => n.iter().for_each(|n| n.pool.clear()),
            Route::Cluster(c) => c.clear(),
        }
    }
}

/// How many replicas a `WAIT` reply says confirmed (0 for anything else).
fn acked(v: Option<&Value>) -> usize {
    match v {
        Some(Value::Int(k)) => usize::try_from(*k).unwrap_or(0),
        _ => 0,
    }
}
