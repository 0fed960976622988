//! The masters a client locks on: one Redis, or a quorum of independent ones (RedLock).
//!
//! Both are the same model: `N` masters and a quorum `Q` (1 of 1, or `N/2 + 1` of `N`). A
//! script call goes to every master *at once* without a thread per master: the command is
//! written on each master's connection first, then the replies are read, all within one
//! bound measured from the first write. So five masters cost about one round trip, not five.
//!
//! With one master, replies map straight to the caller's outcome (and Redis errors pass through
//! unchanged). With a quorum:
//!
//! - **acquire** holds when at least `Q` masters granted it and the validity
//!   `lease - elapsed - drift` is still positive (`drift = lease * factor + 2 ms`); otherwise
//!   what was granted is released at once, on every master that granted it or did not answer;
//! - **release** succeeds when `Q` masters released; the lease was lost otherwise;
//! - **renewal** keeps a hold when `Q` masters extended it, and loses it when so many refused
//!   that `Q` cannot be reached any more.
//!
//! A master that failed at the connection level is skipped for a short while (a few times
//! the per-master timeout), so that one stalled master cannot make every call wait for a new
//! connection to it.
//!
//! The acquire (and the primed acquire of a sleeping leader) is in `acquire.rs`; here are the
//! masters, the rounds every call makes, release, renewal and the other calls.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;

use std::sync::Arc;

use super::cluster::Cluster;
use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::library::{self, PLAIN};
use crate::protocol::mutex::{self, Publish};
use crate::protocol::scripts::{self, Call, Level, ReleaseReply, Which};
use crate::transport::conn::{Conn, Deadline, Pool};
use crate::transport::fault::Fault;

mod acquire;

pub(crate) use acquire::{AcquireCall, Acquired, Primed};

/// One Redis master.
#[derive(Debug)]
pub(crate) struct Node {
    /// The master's URL without its password, for messages.
    pub(crate) name: String,
    pub(crate) pool: Pool,
    /// Skip this master until then (quorum mode only), after a connection failure.
    down_until: Mutex<Option<Instant>>,
}

impl Node {
    pub(crate) fn new(name: String, pool: Pool) -> Self {
        Node {
            name,
            pool,
            down_until: Mutex::new(None),
        }
    }
}

/// What one round of renewals found: one outcome per lease, in the order of the calls
/// (`Some(true)` kept, `Some(false)` lost, `None` unknown), a refusal for a permission if a
/// call met one, and each master's clock.
#[derive(Debug)]
pub(crate) struct Renewed {
    pub(crate) outcomes: Vec<Option<bool>>,
    pub(crate) refused: Option<Refusal>,
    /// Each master that answered, by name, with its clock (`TIME`, in microseconds since the
    /// epoch) as read in the round: see `renewal::clock_watch`.
    pub(crate) clocks: Vec<(String, u64)>,
}

/// A renewal the server refused for a missing permission: not a lost race, a rule to fix.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The server's error.
    pub(crate) message: String,
    /// The command refused, when the server names it (Redis 7.2 and later, Valkey).
    pub(crate) command: Option<String>,
    /// Where (`host:port`).
    pub(crate) server: String,
}

impl Refusal {
    fn of(v: &Value, server: &str) -> Option<Refusal> {
        scripts::permission_refusal(v).map(|(message, command)| Refusal {
            message,
            command,
            server: server.to_owned(),
        })
    }
}

/// The masters, the quorum, and the bounds of one call.
#[derive(Debug)]
pub(crate) struct Backend {
    nodes: Vec<Node>,
    quorum: usize,
    /// Bound on one round of calls: the command timeout for one master, the per-master
    /// timeout for a quorum.
    call_timeout: Duration,
    /// The command timeout (what pooled connections are set to).
    command_timeout: Duration,
    drift_factor: f64,
    /// Replicas that must confirm each acquire and renewal (`WAIT`), and the wait's timeout.
    wait: Option<(usize, Duration)>,
    /// A Redis Cluster: every call goes to the master of its lock's slot (`nodes` is empty).
    cluster: Option<Arc<Cluster>>,
    /// How many primed acquires hold a connection now (at most [`MAX_PRIMED`]).
    primed: Arc<AtomicUsize>,
    /// Whether the Mutex acquire and release go as `FCALL` of the function library (every
    /// master reached at `build()` loaded and ran it; see `protocol/library.rs`).
    functions: AtomicBool,
}

/// The most acquires one client keeps primed at once (see [`Backend::prime_acquire`]): each
/// holds a pooled connection while its leader sleeps, so a client with many waiting leaders
/// (many names) keeps this many connections for them, and its other leaders wait unprimed.
pub(crate) const MAX_PRIMED: usize = 8;

/// A small random duration in `[lo, 2 lo)`, for the RedLock retry delay.
pub(crate) fn jitter(lo: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
    lo + lo * r / 1000
}

impl Backend {
    pub(crate) fn new(
        nodes: Vec<Node>,
        call_timeout: Duration,
        command_timeout: Duration,
        drift_factor: f64,
    ) -> Self {
        let quorum = nodes.len() / 2 + 1;
        Backend {
            primed: Arc::new(AtomicUsize::new(0)),
            nodes,
            quorum,
            call_timeout,
            command_timeout,
            drift_factor,
            wait: None,
            cluster: None,
            functions: AtomicBool::new(false),
        }
    }

    /// `call` packed as this backend sends it: `FCALL` where the function library runs.
    pub(crate) fn pack(&self, call: &Call) -> Vec<u8> {
        PLAIN.pack(call, self.functions.load(Ordering::Relaxed))
    }

    /// A backend on a Redis Cluster: each lock lives on its slot's master, as on one master.
    pub(crate) fn for_cluster(
        cluster: Arc<Cluster>,
        command_timeout: Duration,
        drift_factor: f64,
    ) -> Self {
        let mut b = Backend::new(Vec::new(), command_timeout, command_timeout, drift_factor);
        b.quorum = 1;
        b.cluster = Some(cluster);
        b
    }

    /// Whether keys spread over Redis Cluster slots: then a script call covers one slot.
    pub(crate) fn spreads_slots(&self) -> bool {
        self.cluster.is_some()
    }

    /// Asks for `WAIT replicas timeout` after each acquire and renewal (one master only). A
    /// round and each read then allow for the wait as well.
    pub(crate) fn with_wait_replicas(mut self, wait: Option<(usize, Duration)>) -> Self {
        if let Some((_, t)) = wait {
            self.call_timeout = self.call_timeout.saturating_add(t);
        }
        self.wait = wait;
        self
    }

    /// The bound on one reply: the command timeout, plus the replicas' wait when asked for.
    fn reply_timeout(&self) -> Duration {
        self.command_timeout
            .saturating_add(self.wait.map_or(Duration::ZERO, |(_, t)| t))
    }

    /// Appends `WAIT n timeout` to `packed` when replica confirmation is on; whether it did.
    fn push_wait(&self, packed: &mut Vec<u8>) -> bool {
        match self.wait {
            Some((n, t)) => {
                redis::cmd("WAIT")
                    .arg(n)
                    .arg(t.as_millis().max(1) as u64)
                    .write_packed_command(packed);
                true
            }
            None => false,
        }
    }

    /// How many masters a lock is held on: 1 on a cluster (its slot's master).
    pub(crate) fn masters(&self) -> usize {
        if self.cluster.is_some() {
            return 1;
        }
        self.nodes.len()
    }

    fn single(&self) -> bool {
        self.nodes.len() == 1 || self.cluster.is_some()
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

    /// Sends `packed` (holding `replies` commands) to the masters `targets` at once and
    /// collects each master's replies, all within `step` of the start of the round and within
    /// `by`. `fresh`: a retry, on new connections, and to masters marked down too.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        targets: &[usize],
        packed: &[u8],
        replies: usize,
        which: Which,
        step: Duration,
        by: Deadline,
        fresh: bool,
    ) -> Vec<(usize, Result<Vec<Value>, Fault>)> {
        let read_by = by.min(Deadline::after(step));
        let mut sent: Vec<(usize, Conn)> = Vec::with_capacity(targets.len());
        let mut out = Vec::with_capacity(targets.len());
        // Masters with an idle connection get the command first; opening a connection (up to
        // the connect timeout for a stalled master) comes after, so it delays nobody's send.
        let mut new = Vec::new();
        for &i in targets {
            let node = &self.nodes[i];
            if !self.single()
                && !fresh
                && let Some(t) = *node.down_until.lock()
                && Instant::now() < t
            {
                out.push((i, Err(Fault::MarkedDown)));
                continue;
            }
            match node.pool.idle().filter(|_| !fresh) {
                Some(con) => self.send(i, con, packed, by, &mut sent, &mut out),
                None => new.push(i),
            }
        }
        for i in new {
            match self.nodes[i].pool.connect(by) {
                Ok(con) => self.send(i, con, packed, by, &mut sent, &mut out),
                Err(e) => {
                    self.failed(i, &e);
                    out.push((i, Err(e)));
                }
            }
        }
        for (i, con) in sent {
            let result = self.collect(i, con, packed, replies, which, step, read_by, by);
            out.push((i, result));
        }
        out
    }

    /// Writes `packed` on `con`, recording the connection or the failure.
    fn send(
        &self,
        i: usize,
        mut con: Conn,
        packed: &[u8],
        by: Deadline,
        sent: &mut Vec<(usize, Conn)>,
        out: &mut Vec<(usize, Result<Vec<Value>, Fault>)>,
    ) {
        match con.send(packed, self.command_timeout, by) {
            Ok(()) => sent.push((i, con)),
            Err(e) => {
                if matches!(e, Fault::RanOut { .. }) {
                    // Nothing was written: the connection is as good as before.
                    self.nodes[i].pool.put(con);
                } else {
                    self.failed(i, &e);
                }
                out.push((i, Err(e)));
            }
        }
    }

    /// Reads the `replies` replies to `packed`, written on master `i`'s `con`: reloads the
    /// script and resends on `NOSCRIPT` (within `step` and `by`), turns a `READONLY` reply
    /// into a failure of the connection, and gives the connection back to the pool or notes
    /// the failure. Reads end by `read_by`.
    #[allow(clippy::too_many_arguments)]
    fn collect(
        &self,
        i: usize,
        mut con: Conn,
        packed: &[u8],
        replies: usize,
        which: Which,
        step: Duration,
        read_by: Deadline,
        by: Deadline,
    ) -> Result<Vec<Value>, Fault> {
        let result = self.receive(&mut con, replies, read_by);
        let result = match result {
            Ok(values)
                if values
                    .iter()
                    .any(|v| is_noscript(v) || library::is_no_function(v)) =>
            {
                // After a restart, SCRIPT FLUSH or FUNCTION FLUSH: load, and resend on this
                // master alone, still within the call's bound.
                let again = by.min(Deadline::after(step));
                let scripts = values.iter().any(is_noscript);
                let functions = values.iter().any(library::is_no_function);
                by.cap(self.command_timeout)
                    .and_then(|t| con.set_timeouts(t))
                    .and_then(|()| {
                        if scripts {
                            which.load(con.raw())?;
                        }
                        if functions {
                            PLAIN.load_on(con.raw())?;
                        }
                        Ok(())
                    })
                    .and_then(|()| con.send(packed, self.command_timeout, again))
                    .and_then(|()| self.receive(&mut con, replies, again))
            }
            other => other,
        };
        // A master demoted to a replica (a failover) answers writes with `READONLY`: the
        // whole reply is a failure of the connection, retried where the master is now.
        let result = result.and_then(|values| match values.iter().position(is_readonly) {
            Some(k) => Err(one(values.into_iter().nth(k))
                .err()
                .unwrap_or(Fault::timeout("no reply"))),
            None => Ok(values),
        });
        match &result {
            Err(e) => self.failed(i, e),
            Ok(_) if con.is_open() => self.nodes[i].pool.put(con),
            Ok(_) => {}
        }
        result
    }

    /// Reads `n` replies, each read bounded by the command timeout and by `by` (checked again
    /// every 256 replies of a long pipeline).
    fn receive(&self, con: &mut Conn, n: usize, by: Deadline) -> Result<Vec<Value>, Fault> {
        let mut values = Vec::with_capacity(n);
        for k in 0..n {
            if k % 256 == 0 {
                // Past the deadline, a reply that has already arrived is still taken: a
                // stalled master read before this one must not fail a healthy one.
                let t = by
                    .cap(self.reply_timeout())
                    .unwrap_or(Duration::from_millis(1));
                con.set_read_timeout(t)?;
            }
            values.push(con.recv_now()?);
        }
        Ok(values)
    }

    /// Notes a failure of master `i`: a broken connection (or a master demoted by a failover)
    /// marks it down for a short while. Out of time before any I/O, the server did nothing
    /// wrong.
    fn failed(&self, i: usize, e: &Fault) {
        if !(e.is_broken() || e.is_readonly()) {
            return;
        }
        // After a restart or a CLIENT KILL every pooled connection is dead: drop them all, so
        // that a retry opens a fresh one instead of taking the next dead one.
        self.nodes[i].pool.forget_master();
        if !self.single() {
            let pause = (self.call_timeout * 10).min(Duration::from_secs(1));
            *self.nodes[i].down_until.lock() = Instant::now().checked_add(pause);
            log::debug!("master {} failed: {e}", self.nodes[i].name);
        }
    }

    fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Runs `call` on the masters `targets` at once, within `by`; `fresh` as in `round`.
    fn call_all(
        &self,
        call: &Call,
        targets: &[usize],
        by: Deadline,
        fresh: bool,
    ) -> Vec<(usize, Result<Value, Fault>)> {
        if let Some(c) = &self.cluster {
            return vec![(0, c.call(call, by).and_then(|v| one(Some(v))))];
        }
        let packed = self.pack(call);
        self.round(
            targets,
            &packed,
            1,
            call.which,
            self.call_timeout,
            by,
            fresh,
        )
        .into_iter()
        .map(|(i, r)| (i, r.and_then(|mut v| one(v.pop()))))
        .collect()
    }

    /// Runs `call` on every master at once within `by`, and once more, on a new connection,
    /// on each master whose connection failed (see [`worth_retrying`]), within the same bound:
    /// each master's last reply.
    fn call_all_retried(&self, call: &Call, by: Deadline) -> Vec<(usize, Result<Value, Fault>)> {
        let mut replies = self.call_all(call, &self.all(), by, false);
        let retry = worth_retrying(&replies);
        if !retry.is_empty() && !by.passed() {
            replace_replies(&mut replies, self.call_all(call, &retry, by, false));
        }
        replies
    }

    /// Runs one script call on the one master of a single-server client (the lock types
    /// whose scripts keep a queue or a set of holders, which a quorum cannot vote on).
    /// Within `by`.
    pub(crate) fn eval_single(&self, call: &Call, by: Deadline) -> Result<Value> {
        if !self.single() {
            return Err(Error::config(
                "masters",
                "this lock type needs a client on one Redis server",
            ));
        }
        self.call_all(call, &[0], by, false)
            .pop()
            .map_or(Err(Error::timeout("no reply")), |(_, r)| {
                r.map_err(Error::from)
            })
    }

    /// Runs one script call on every master at once (on a cluster, the master of its slot),
    /// within `by`, retrying once on a new connection where the connection failed: each
    /// master's reply. For calls that any master may answer on its own (what an operator
    /// reads or does to a lock); the caller weighs the replies.
    pub(crate) fn eval_each(&self, call: &Call, by: Deadline) -> Vec<Result<Value>> {
        self.call_all_retried(call, by)
            .into_iter()
            .map(|(_, r)| r.map_err(Error::from))
            .collect()
    }

    /// The number of masters whose agreement holds a lock (1 of 1, or a majority).
    pub(crate) fn quorum(&self) -> usize {
        self.quorum
    }

    /// Releases `level` of the Mutex acquisition `acquisition` (its hold's fencing token
    /// `token`) on every master, retrying once (on a new connection) where the connection
    /// failed, all within `by`. `publish`: whether the release publishes even when no waiter
    /// flagged the lock (threads of this client wait); with a quorum it always does (waiters
    /// listen on one master).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &self,
        keys: &LockKeys,
        acquisition: &str,
        request: &str,
        token: u64,
        level: Level,
        publish: bool,
        by: Deadline,
    ) -> Result<ReleaseReply> {
        let release = mutex::Release {
            acquisition,
            level,
            request,
            publish: if publish || !self.single() {
                Publish::Always
            } else {
                Publish::IfFlagged
            },
            fence: self.fence_of(token),
        };
        let call = mutex::release(keys, &release, false);
        let mut replies = self.call_all(&call, &self.all(), by, false);
        // A quorum master skipped as marked down (it failed a moment ago, maybe for one slow
        // reply) never saw the release. While the masters that answered released fewer than
        // a quorum, the outcome rests on the skipped ones: the retry goes to them too, on a
        // new connection, costing at most one more per-master timeout. Skipping them would
        // fail the unlock of a lock still held on them, for the whole marked-down pause.
        let released = replies
            .iter()
            .filter(|(_, r)| {
                r.as_ref()
                    .ok()
                    .and_then(mutex::parse_release)
                    .is_some_and(|r| {
                        matches!(
                            r,
                            ReleaseReply::Released { .. } | ReleaseReply::ReleasedBefore
                        )
                    })
            })
            .count();
        let undecided = released < self.quorum;
        let retry: Vec<usize> = replies
            .iter()
            .filter(|(_, r)| {
                r.as_ref()
                    .err()
                    .is_some_and(|e| e.is_retriable() && (undecided || !e.is_marked_down()))
            })
            .map(|(i, _)| *i)
            .collect();
        let fresh = replies
            .iter()
            .any(|(i, r)| retry.contains(i) && r.as_ref().err().is_some_and(Fault::is_marked_down));
        // The retry takes a new connection (a failure clears the master's idle ones), and
        // skips a quorum master marked down when the others decided the outcome already:
        // waiting for it again would then cost the caller for nothing.
        if !retry.is_empty() && !by.passed() {
            log::debug!(
                "release of `{}` failed on {} master(s); retrying once",
                keys.name,
                retry.len()
            );
            // The first attempt may have released the last level before its reply was lost:
            // the key is then gone, or already another owner's (a waiter took it at once).
            // So is it when Redis restarted empty, or the lease was lost: the retry asks the
            // script to tell them apart by the release marker (`ReleasedBefore`), and what it
            // cannot tell is a loss.
            let again = mutex::release(keys, &release, true);
            replace_replies(&mut replies, self.call_all(&again, &retry, by, fresh));
        }
        let mut parsed = replies.into_iter().map(|(_, r)| {
            r.and_then(|v| mutex::parse_release(&v).ok_or_else(|| Fault::bad_reply("release", &v)))
                .map_err(Error::from)
        });
        if self.single() {
            return parsed.next().unwrap_or(Err(Error::NoQuorum {
                reached: 0,
                needed: 1,
            }));
        }
        let (mut released, mut remaining, mut listeners, mut other, mut foreign, mut errors) =
            (0, 0, 0u64, false, false, Vec::new());
        for r in parsed {
            match r {
                // Each client listens on one master at a time: the sum counts each once.
                Ok(ReleaseReply::Released {
                    remaining: n,
                    listeners: l,
                }) => {
                    released += 1;
                    remaining = remaining.max(n);
                    listeners = listeners.saturating_add(l);
                }
                Ok(ReleaseReply::ReleasedBefore) => released += 1,
                Ok(ReleaseReply::Missing) => {}
                Ok(ReleaseReply::OtherOwner) => other = true,
                Ok(ReleaseReply::Foreign) => foreign = true,
                Err(e) => errors.push(e),
            }
        }
        if released >= self.quorum {
            Ok(ReleaseReply::Released {
                remaining,
                listeners,
            })
        } else if other {
            Ok(ReleaseReply::OtherOwner)
        } else if foreign {
            Ok(ReleaseReply::Foreign)
        } else if released + errors.len() >= self.quorum {
            // Could not tell: not enough masters answered.
            Err(errors.into_iter().next().unwrap_or(Error::NoQuorum {
                reached: released,
                needed: self.quorum,
            }))
        } else {
            Ok(ReleaseReply::Missing)
        }
    }

    /// Renews a batch of leases on every master in one pipelined round trip per master,
    /// all within `budget`. Each call covers the number of leases paired with it (a batch
    /// call several, a per-lock call one). A master whose connection fails (or stays silent
    /// for half the budget: a connection that a NAT dropped) gets the batch again at once on
    /// a new connection, within what is left, unless the outcome of every lease is known
    /// already. One outcome per lease, in the order of the calls: `Some(true)` kept,
    /// `Some(false)` lost, `None` unknown.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        if let Some(c) = &self.cluster {
            let (replies, clocks) = c.renew(calls, budget);
            let mut outcomes = Vec::new();
            let mut refused = None;
            for ((_, count), v) in calls.iter().zip(replies) {
                match v {
                    Some(v) => {
                        if refused.is_none() {
                            refused = Refusal::of(&v, "a cluster master");
                        }
                        outcomes.extend(scripts::parse_renews(&v, *count));
                    }
                    None => outcomes.extend(std::iter::repeat_n(None, *count)),
                }
            }
            return Renewed {
                outcomes,
                refused,
                clocks,
            };
        }
        let mut packed = Vec::new();
        let functions = self.functions.load(Ordering::Relaxed);
        for (c, _) in calls {
            PLAIN.write(c, functions, None, &mut packed);
        }
        // Each master's clock, read in the same round: see `renewal::clock_watch`.
        packed.extend_from_slice(&redis::cmd("TIME").get_packed_command());
        let waits = self.push_wait(&mut packed);
        let by = Deadline::after(budget);
        let first = (budget / 2).min(self.reply_timeout());
        let counts: Vec<usize> = calls.iter().map(|c| c.1).collect();
        let n: usize = counts.iter().sum();
        let expected = calls.len() + 1 + usize::from(waits);
        let which = Which::RenewBatch;
        let mut replies = self.round(&self.all(), &packed, expected, which, first, by, false);
        let mut outcomes = self.renewed(&counts, &replies);
        let retry = worth_retrying(&replies);
        if !retry.is_empty() && !by.passed() && outcomes.iter().any(Option::is_none) {
            log::debug!(
                "renewal of {n} leases failed on {} master(s); retrying on a new connection",
                retry.len()
            );
            // Renewing again is harmless: a renewal only sets the lease from now on.
            let again = self.round(&retry, &packed, expected, which, budget, by, true);
            replace_replies(&mut replies, again);
            outcomes = self.renewed(&counts, &replies);
        }
        let mut refused = None;
        for (i, r) in &replies {
            if let (None, Ok(values)) = (&refused, r) {
                refused = values
                    .iter()
                    .find_map(|v| Refusal::of(v, &self.nodes[*i].name));
            }
            match r {
                // At `debug`: a renewal is retried until the lease runs out, and a lease
                // that is lost is reported once, at `warn`, by the renewal thread.
                Err(e) => log::debug!(
                    "renewal of {n} leases on {} failed: {e}",
                    self.nodes[*i].name
                ),
                Ok(values) if waits => {
                    let acked = match values.last() {
                        Some(Value::Int(k)) => usize::try_from(*k).unwrap_or(0),
                        _ => 0,
                    };
                    let needed = self.wait.map_or(0, |(n, _)| n);
                    if acked < needed {
                        log::warn!(
                            "renewal of {n} leases on {} confirmed by {acked} of {needed} \
                             replicas in time; the leases are kept",
                            self.nodes[*i].name
                        );
                    }
                }
                Ok(_) => {}
            }
        }
        let clocks = replies
            .iter()
            .filter_map(|(i, r)| {
                let v = r.as_ref().ok()?.get(calls.len())?;
                Some((self.nodes[*i].name.clone(), scripts::parse_time(v)?))
            })
            .collect();
        Renewed {
            outcomes,
            refused,
            clocks,
        }
    }

    /// The outcome of each renewed lease from the masters' replies: reply `k` of a master
    /// answers for the `counts[k]` leases of call `k`.
    fn renewed(
        &self,
        counts: &[usize],
        replies: &[(usize, Result<Vec<Value>, Fault>)],
    ) -> Vec<Option<bool>> {
        let masters = self.nodes.len();
        let n: usize = counts.iter().sum();
        let mut yes = vec![0usize; n];
        let mut no = vec![0usize; n];
        for (i, r) in replies {
            let Ok(values) = r else { continue };
            let mut k = 0;
            for (v, &count) in values.iter().zip(counts) {
                let outcomes = scripts::parse_renews(v, count);
                if outcomes.iter().any(Option::is_none) {
                    log::debug!("renewal error on {}: {v:?}", self.nodes[*i].name);
                }
                for outcome in outcomes {
                    match outcome {
                        Some(true) => yes[k] += 1,
                        Some(false) => no[k] += 1,
                        None => {}
                    }
                    k += 1;
                }
            }
        }
        yes.iter()
            .zip(&no)
            .map(|(&y, &f)| {
                if y >= self.quorum {
                    Some(true)
                } else if f > masters - self.quorum {
                    Some(false)
                } else {
                    None
                }
            })
            .collect()
    }

    /// Runs `cmd` once on every master, in one round bounded like a script call; each master's
    /// name (its URL without password) with its reply.
    pub(crate) fn each_master(&self, cmd: redis::Cmd) -> Vec<(String, Result<Value>)> {
        if let Some(c) = &self.cluster {
            return c
                .each_master(&cmd)
                .into_iter()
                .map(|(n, r)| (n, r.and_then(|v| one(Some(v))).map_err(Error::from)))
                .collect();
        }
        let call = Call {
            which: Which::Renew,
            cmd,
        };
        self.call_all(&call, &self.all(), Deadline::NONE, false)
            .into_iter()
            .map(|(i, r)| (self.nodes[i].name.clone(), r.map_err(Error::from)))
            .collect()
    }

    /// The keys that match `pattern` on each master, read with `SCAN` (never `KEYS`: each
    /// step returns after about `count` keys, so Redis is never busy with one call for long),
    /// each master with its own cursor, every step within the command timeout and the whole
    /// within `by`. Each master's name with its keys (a key may come twice; callers dedupe).
    pub(crate) fn scan(&self, pattern: &str, by: Deadline) -> Vec<(String, Result<Vec<String>>)> {
        let step = |i: usize, cursor: &str| -> Result<Value, Fault> {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            if let Some(c) = &self.cluster {
                return c.on_master(i, &cmd, by);
            }
            let call = Call {
                which: Which::Renew,
                cmd,
            };
            self.call_all(&call, &[i], by, true)
                .into_iter()
                .next()
                .map_or(Err(Fault::timeout("no reply")), |(_, r)| r)
        };
        let names: Vec<String> = match &self.cluster {
            Some(c) => c.master_names(),
            None => self.nodes.iter().map(|n| n.name.clone()).collect(),
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

    /// Whether a quorum of masters has the lock key, asked within `by`: a master whose
    /// connection failed (a pooled connection that died in a restart) is asked once more at
    /// once, on a new connection, within the same bound, as an acquire is.
    pub(crate) fn exists(&self, keys: &LockKeys, by: Deadline) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(&keys.lock);
        self.quorum_says(cmd, by, |r| match r {
            Ok(v) => Some(matches!(v, Value::Int(1))),
            Err(_) => None,
        })
    }

    /// Whether a quorum of masters answers `cmd` with a reply that `yes` calls true (`None`:
    /// no answer), asked within `by`: a master whose connection failed (a pooled connection
    /// that died in a restart) is asked once more at once, on a new connection, within the
    /// same bound, as an acquire is.
    fn quorum_says(
        &self,
        cmd: redis::Cmd,
        by: Deadline,
        yes: impl Fn(&Result<Value, Fault>) -> Option<bool>,
    ) -> Result<bool> {
        let call = Call {
            which: Which::Renew,
            cmd,
        };
        let replies = self.call_all_retried(&call, by);
        let (mut answered, mut held) = (0, 0);
        let mut first_error = None;
        for (_, r) in replies {
            match yes(&r) {
                Some(y) => {
                    answered += 1;
                    held += usize::from(y);
                }
                None => {
                    first_error.get_or_insert(r.err().unwrap_or(Fault::timeout("no reply")));
                }
            }
        }
        if answered < self.quorum {
            return Err(first_error.map_or(
                Error::NoQuorum {
                    reached: answered,
                    needed: self.quorum,
                },
                Error::from,
            ));
        }
        Ok(held >= self.quorum)
    }

    /// Whether a quorum of masters holds the Mutex `keys` (its key is there; a key of another
    /// type counts as held, since no acquire can take the lock while it is there), asked
    /// within `by`, as [`exists`](Backend::exists) asks.
    pub(crate) fn is_locked(&self, keys: &LockKeys, by: Deadline) -> Result<bool> {
        let mut cmd = redis::cmd("GETRANGE");
        cmd.arg(&keys.lock).arg(0).arg(0);
        self.quorum_says(cmd, by, |r| match r {
            Ok(Value::BulkString(b)) => Some(!b.is_empty()),
            Ok(Value::SimpleString(s)) => Some(!s.is_empty()),
            Ok(_) => Some(false),
            // WRONGTYPE: a key, not a string.
            Err(Fault::Redis(e)) if e.code() == Some("WRONGTYPE") => Some(true),
            Err(_) => None,
        })
    }

    /// Checks that every master answers and loads the scripts into their caches, so that the
    /// first calls (and the first renewal batch) do not meet `NOSCRIPT`, and the function
    /// library: the Mutex acquire and release go as `FCALL` when every master that answered
    /// loaded it and ran its `ping` function. Used once, when the client is built; within `by`.
    pub(crate) fn ping(&self, by: Deadline) -> Result<()> {
        if let Some(c) = &self.cluster {
            return c.start(by);
        }
        let mut packed = redis::cmd("PING").get_packed_command();
        // Every lock type's script: a renewal batch may mix them, and none meets `NOSCRIPT`
        // on its first use.
        for which in Which::ALL {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(which.source())
                .write_packed_command(&mut packed);
        }
        PLAIN.load().write_packed_command(&mut packed);
        let replies = self.round(
            &self.all(),
            &packed,
            2 + Which::ALL.len(),
            Which::Renew,
            self.call_timeout,
            by,
            false,
        );
        let mut loaded = None;
        for (i, r) in replies {
            // Only the PING must succeed; a refused SCRIPT LOAD (an ACL) is left to the calls,
            // which then report the server's error by name, and a refused FUNCTION LOAD (an
            // ACL, a server before 7.0) leaves the calls on EVALSHA.
            let r = r.and_then(|mut values| {
                let library = values.split_off(values.len().min(1 + Which::ALL.len()));
                let library = match library.into_iter().next() {
                    Some(v) if library::loaded(&v) => Ok(()),
                    other => one(other).map(drop),
                };
                if let Err(e) = &library {
                    log::debug!("function library not loaded on {}: {e}", self.nodes[i].name);
                }
                let loads = values.split_off(1.min(values.len()));
                if let Some(e) = loads.into_iter().find_map(|v| one(Some(v)).err()) {
                    log::debug!("scripts not loaded on {}: {e}", self.nodes[i].name);
                }
                one(values.pop()).map(|_| library.is_ok())
            });
            match r {
                Ok(ok) => loaded = Some(loaded.unwrap_or(true) && ok),
                Err(e) => {
                    if self.single() {
                        return Err(e.into());
                    }
                    log::warn!("master {} did not answer: {e}", self.nodes[i].name);
                }
            }
        }
        if loaded == Some(true) {
            // FCALL may still be refused where FUNCTION LOAD was not (an ACL).
            let ping = PLAIN.ping().get_packed_command();
            let runs = self
                .round(
                    &self.all(),
                    &ping,
                    1,
                    Which::Renew,
                    self.call_timeout,
                    by,
                    false,
                )
                .into_iter()
                .all(|(i, r)| match r.and_then(|mut v| one(v.pop())) {
                    Ok(Value::Int(1)) => true,
                    Ok(_) => false,
                    // A master that does not answer now is judged by its FUNCTION LOAD.
                    Err(e) if unanswered(&e) => true,
                    Err(e) => {
                        log::debug!("FCALL refused on {}: {e}", self.nodes[i].name);
                        false
                    }
                });
            self.functions.store(runs, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        if let Some(c) = &self.cluster {
            c.clear();
        }
        for n in &self.nodes {
            n.pool.clear();
        }
    }
}

/// Whether `e` says that a master gave no answer now (a failed connection, a timeout, no
/// time left, an answer that was not RESP), rather than an error of its own.
fn unanswered(e: &Fault) -> bool {
    match e {
        Fault::Redis(r) | Fault::Other(Error::Redis(r)) => r.code().is_none(),
        Fault::Other(Error::Timeout { .. }) => true,
        Fault::Other(_) => false,
        Fault::RanOut { .. }
        | Fault::MarkedDown
        | Fault::Timeout { .. }
        | Fault::Io { .. }
        | Fault::NotRedis { .. }
        | Fault::BadReply { .. } => true,
    }
}

fn is_readonly(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::ReadOnly))
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
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

/// The single reply of a one-command round, with a server error turned into `Err`.
fn one(v: Option<Value>) -> Result<Value, Fault> {
    match v {
        Some(Value::ServerError(e)) => Err(Fault::Redis(e.into())),
        Some(v) => Ok(v),
        None => Err(Fault::timeout("no reply")),
    }
}

/// The masters among `replies` whose call failed in a way a new connection may mend: not a
/// master marked down, which another wait would only cost the others.
fn worth_retrying<T>(replies: &[(usize, Result<T, Fault>)]) -> Vec<usize> {
    replies
        .iter()
        .filter(|(_, r)| {
            r.as_ref()
                .err()
                .is_some_and(|e| e.is_retriable() && !e.is_marked_down())
        })
        .map(|(i, _)| *i)
        .collect()
}

/// Puts each master's reply of a retry, `again`, in the place of its first reply in `replies`.
fn replace_replies<T>(replies: &mut [(usize, T)], again: Vec<(usize, T)>) {
    for (i, r) in again {
        if let Some(slot) = replies.iter_mut().find(|(j, _)| *j == i) {
            slot.1 = r;
        }
    }
}
