//! [`Backend`]: what a lock needs of its masters, whatever the topology: send a call to one
//! master or to all, read each master's reply, and the quorum those replies are weighed by.
//!
//! The topologies behind it ([`Masters`]):
//!
//! - [`Nodes`] (`nodes.rs`): independent masters, each with its own pool: one server (found
//!   directly or through Sentinel, `topology/sentinel.rs`), the quorum 1 of 1, or a quorum
//!   `N/2 + 1` of `N` (RedLock); every call goes to all of them at once.
//! - [`Cluster`] (`topology/cluster.rs`): each call goes to the master of its lock's slot, as
//!   to one server; the quorum is 1.
//!
//! Both send through the same [`Round`](super::send::Round) (`topology/send.rs`): they differ
//! in routing and in the quorum, not in sending.
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
use std::time::Duration;

use redis::Value;

use super::cluster::Cluster;
use super::quorum::{self, replace_replies, worth_retrying};
pub(crate) use super::quorum::{Refusal, Renewed};
use super::send::{Replies, one};
use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::Call;
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;

mod nodes;
mod prime;

pub(crate) use nodes::{Node, Nodes};
pub(crate) use prime::Primed;

/// The topology a client locks on. A closed set of two, matched in the few places where they
/// differ: a call's route (every master at once, or its slot's master), renewal, `SCAN`, and
/// the start; the rest of [`Backend`] is the same for both.
#[derive(Debug)]
enum Masters {
    Nodes(Nodes),
    Cluster(Arc<Cluster>),
}

/// The masters, the quorum, and the allowance for clock drift.
#[derive(Debug)]
pub(crate) struct Backend {
    masters: Masters,
    /// The command timeout (what pooled connections are set to).
    command_timeout: Duration,
    drift_factor: f64,
}

/// The target of the backend's `warn` lines (see the crate docs' table of log lines), for
/// those written in `nodes.rs` as well.
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
            masters: Masters::Nodes(Nodes::new(nodes, call_timeout, command_timeout)),
            command_timeout,
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
            masters: Masters::Cluster(cluster),
            command_timeout,
            drift_factor,
        }
    }

    /// The independent masters; `None` on a cluster.
    fn nodes(&self) -> Option<&Nodes> {
        match &self.masters {
            Masters::Nodes(n) => Some(n),
            Masters::Cluster(_) => None,
        }
    }

    /// Whether keys spread over Redis Cluster slots: then a script call covers one slot.
    pub(crate) fn spreads_slots(&self) -> bool {
        matches!(self.masters, Masters::Cluster(_))
    }

    /// Asks for `WAIT replicas timeout` after each acquire and renewal (one master only). A
    /// round and each read then allow for the wait as well.
    pub(crate) fn with_wait_replicas(mut self, wait: Option<(usize, Duration)>) -> Self {
        if let Masters::Nodes(n) = &mut self.masters {
            if let Some((_, t)) = wait {
                n.call_timeout = n.call_timeout.saturating_add(t);
            }
            n.wait = wait;
        }
        self
    }

    /// The replicas that must confirm each acquire and renewal, when asked for.
    pub(crate) fn wait_replicas(&self) -> Option<usize> {
        self.nodes()?.wait.map(|(k, _)| k)
    }

    /// How many masters a lock is held on: 1 on a cluster (its slot's master).
    pub(crate) fn masters(&self) -> usize {
        match &self.masters {
            Masters::Nodes(n) => n.nodes.len(),
            Masters::Cluster(_) => 1,
        }
    }

    /// The number of masters whose agreement holds a lock (1 of 1, or a majority).
    pub(crate) fn quorum(&self) -> usize {
        match &self.masters {
            Masters::Nodes(n) => n.quorum(),
            Masters::Cluster(_) => 1,
        }
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
        self.nodes()
            .map_or(self.command_timeout, |n| n.call_timeout)
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

    /// Runs `call` on the masters `targets` at once, within `by` (on a cluster, on the master
    /// of its slot). `fresh`: a retry, on new connections, and to masters marked down too.
    pub(crate) fn call_on(
        &self,
        call: &Call,
        targets: &[usize],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        match &self.masters {
            Masters::Nodes(n) => n.one_each(targets, &n.pack(call), by, fresh),
            Masters::Cluster(c) => vec![(0, c.call(call, by).and_then(|v| one(Some(v))))],
        }
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
        match self.nodes() {
            Some(n) => n.call_waited(call, by),
            None => (self.call_one(call, by), 0),
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
        self.retried(by, |targets| self.call_on(call, targets, by, false))
            .into_iter()
            .map(|(_, r)| r.map_err(Error::from))
            .collect()
    }

    /// Renews a batch of leases on every master in one pipelined round trip per master (on a
    /// cluster, per slot's master), all within `budget`. Each call covers the number of
    /// leases paired with it (a batch call several, a per-lock call one). One outcome per
    /// lease, in the order of the calls: `Some(true)` kept, `Some(false)` lost, `None`
    /// unknown.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        match &self.masters {
            Masters::Nodes(n) => n.renew(calls, budget),
            Masters::Cluster(c) => c.renew(calls, budget),
        }
    }

    /// Runs `cmd` once on every master, in one round bounded like a script call; each master's
    /// name (its URL without password) with its reply.
    pub(crate) fn each_master(&self, cmd: redis::Cmd) -> Vec<(String, Result<Value>)> {
        let replies: Vec<(String, Result<Value, Fault>)> = match &self.masters {
            Masters::Nodes(n) => n
                .command_on(&cmd, &n.all(), Deadline::NONE, false)
                .into_iter()
                .map(|(i, r)| (n.nodes[i].name.clone(), r))
                .collect(),
            Masters::Cluster(c) => c.each_master(&cmd),
        };
        replies
            .into_iter()
            .map(|(name, r)| (name, r.map_err(Error::from)))
            .collect()
    }

    /// The keys that match `pattern` on each master, read with `SCAN` (never `KEYS`: each
    /// step returns after about `count` keys, so Redis is never busy with one call for long),
    /// each master with its own cursor, every step within the command timeout and the whole
    /// within `by`. Each master's name with its keys (a key may come twice; callers dedupe).
    pub(crate) fn scan(&self, pattern: &str, by: Deadline) -> Vec<(String, Result<Vec<String>>)> {
        // A cluster's masters as the map has them now, kept for the whole scan.
        let cluster = match &self.masters {
            Masters::Cluster(c) => c.masters(),
            Masters::Nodes(_) => Vec::new(),
        };
        let step = |i: usize, cursor: &str| -> Result<Value, Fault> {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            match &self.masters {
                Masters::Nodes(n) => n
                    .command_on(&cmd, &[i], by, true)
                    .pop()
                    .map_or(Err(Fault::timeout("no reply")), |(_, r)| r),
                Masters::Cluster(c) => cluster
                    .get(i)
                    .map_or(Err(Fault::timeout("no reply")), |n| c.on(n, &cmd, by)),
            }
        };
        let names: Vec<String> = match &self.masters {
            Masters::Nodes(n) => n.nodes.iter().map(|n| n.name.clone()).collect(),
            Masters::Cluster(_) => cluster.iter().map(|n| n.name.clone()).collect(),
        };
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let mut keys = Vec::new();
                let mut cursor = "0".to_owned();
                let result = loop {
                    if by.passed() {
                        break Err(Fault::timeout("SCAN of the lock keys"));
                    }
                    match step(i, &cursor).and_then(scan_reply) {
                        Ok((next, found)) => {
                            keys.extend(found);
                            if next == "0" {
                                break Ok(keys);
                            }
                            cursor = next;
                        }
                        Err(e) => break Err(e),
                    }
                };
                (name, result.map_err(Error::from))
            })
            .collect()
    }

    /// Whether a quorum of masters has the lock key, asked within `by`, as
    /// [`quorum_says`](Self::quorum_says) asks.
    pub(crate) fn exists(&self, keys: &LockKeys, by: Deadline) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        self.quorum_says(&cmd, by, |r| match r {
            Ok(v) => Some(matches!(v, Value::Int(1))),
            Err(_) => None,
        })
    }

    /// Whether a quorum of masters answers `cmd` with a reply that `yes` calls true (`None`:
    /// no answer), asked within `by`: a master whose connection failed (a pooled connection
    /// that died in a restart) is asked once more at once, on a new connection, within the
    /// same bound, as an acquire is.
    pub(crate) fn quorum_says(
        &self,
        cmd: &redis::Cmd,
        by: Deadline,
        yes: impl Fn(&Result<Value, Fault>) -> Option<bool>,
    ) -> Result<bool> {
        let send = |targets: &[usize]| match &self.masters {
            Masters::Nodes(n) => n.command_on(cmd, targets, by, false),
            Masters::Cluster(c) => vec![(0, c.command(cmd, by).and_then(|v| one(Some(v))))],
        };
        let replies = self.retried(by, send).into_iter().map(|(_, r)| {
            yes(&r).ok_or_else(|| Error::from(r.err().unwrap_or(Fault::timeout("no reply"))))
        });
        let held = quorum::tally(replies, Ok)?.need(self.quorum())?;
        Ok(held.into_iter().filter(|&y| y).count() >= self.quorum())
    }

    /// Checks that every master answers and loads the scripts (see [`Nodes::ping`]), or on a
    /// cluster reads the slot map first. Used once, when the client is built; within `by`.
    pub(crate) fn ping(&self, by: Deadline) -> Result<()> {
        match &self.masters {
            Masters::Nodes(n) => n.ping(by),
            Masters::Cluster(c) => c.start(by),
        }
    }

    /// Any script call ready for another thread to write the moment a lock is released (see
    /// [`Primed`]): on a single plain master only, when an idle pooled connection is at hand
    /// and fewer than [`MAX_PRIMED`](prime::MAX_PRIMED) are primed. `None` otherwise (a quorum, a cluster, a
    /// client that waits for replicas): the plain path is taken.
    pub(crate) fn prime_script(&self, call: &Call) -> Option<Primed> {
        self.nodes()?.prime(call)
    }

    /// Gives back the connection of a call that was primed and never written.
    pub(crate) fn unprime(&self, p: Primed) {
        if let Some(n) = self.nodes() {
            n.unprime(p);
        }
    }

    /// The reply of a primed script call that was written (`wrote`), within `by`. A failed
    /// write is a failure of the connection: the caller retries the same request on the plain
    /// path (a request id makes the retry of a call that ran answer as that call did).
    pub(crate) fn finish_script(
        &self,
        p: Primed,
        wrote: Result<()>,
        by: Deadline,
    ) -> Result<Value> {
        // Only independent masters prime a call.
        let n = self.nodes().ok_or(Error::timeout("no reply"))?;
        Ok(n.finish(p, wrote, by)?)
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        match &self.masters {
            Masters::Nodes(n) => n.clear(),
            Masters::Cluster(c) => c.clear(),
        }
    }
}

/// A `SCAN` reply: the next cursor and the keys of this step.
fn scan_reply(v: Value) -> Result<(String, Vec<String>), Fault> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    if let Value::Array(parts) = &v
        && let [cursor, Value::Array(keys)] = parts.as_slice()
        && let Some(cursor) = text(cursor)
    {
        return Ok((cursor, keys.iter().filter_map(text).collect()));
    }
    Err(Fault::bad_reply("SCAN", &v))
}
