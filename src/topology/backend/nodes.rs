//! [`Nodes`]: independent masters, each with its own pool: one Redis server (found directly or
//! through Sentinel), or a quorum of them (RedLock). One master is the quorum 1 of 1.
//!
//! A call goes to every master *at once* without a thread per master, as a
//! [`Round`](crate::topology::send::Round) sends it (`topology/send.rs`: every write first,
//! then the reads, within one bound; `NOSCRIPT` reloads; `READONLY`, a master demoted by a
//! failover, is a failure of the connection).
//!
//! With a quorum, a master that failed at the connection level is skipped for a short while
//! (a few times the per-master timeout), so that one stalled master cannot make every call
//! wait for a new connection to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::Value;

use super::prime::{Primed, PrimedSlot};
use super::{Refusal, Renewed};
use crate::error::Result;
use crate::protocol::scripts::{self, Call};
use crate::topology::quorum::{self, replace_replies, worth_retrying};
use crate::topology::send::{Flavor, Part, Replies, Round, one};
use crate::transport::conn::{Deadline, Pool};
use crate::transport::fault::Fault;

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

/// The masters and the bounds of one call.
#[derive(Debug)]
pub(crate) struct Nodes {
    pub(crate) nodes: Vec<Node>,
    /// Bound on one round of calls: the command timeout for one master, the per-master
    /// timeout for a quorum.
    pub(crate) call_timeout: Duration,
    /// The command timeout (what pooled connections are set to).
    pub(crate) command_timeout: Duration,
    /// Replicas that must confirm each acquire and renewal (`WAIT`), and the wait's timeout.
    pub(crate) wait: Option<(usize, Duration)>,
    /// How many primed calls hold a connection now (at most [`MAX_PRIMED`](super::prime::MAX_PRIMED)).
    primed: Arc<AtomicUsize>,
    /// Whether the Mutex acquire and release go as `FCALL` of the function library (every
    /// master reached at `build()` loaded and ran it; see `protocol/library.rs`).
    functions: AtomicBool,
}

impl Nodes {
    pub(crate) fn new(nodes: Vec<Node>, call_timeout: Duration, command_timeout: Duration) -> Self {
        Nodes {
            nodes,
            call_timeout,
            command_timeout,
            wait: None,
            primed: Arc::new(AtomicUsize::new(0)),
            functions: AtomicBool::new(false),
        }
    }

    /// `N/2 + 1` of `N`: 1 of 1 on one server.
    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    fn single(&self) -> bool {
        self.nodes.len() == 1
    }

    pub(crate) fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// `call` packed as these masters run it: `FCALL` where the function library runs.
    pub(super) fn pack(&self, call: &Call) -> Vec<u8> {
        Flavor::Plain.pack(call, self.functions.load(Ordering::Relaxed))
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

    /// How this topology sends a round: reads within `step` of its start and within `by`;
    /// `fresh`: a retry, on new connections.
    fn sender(
        &self,
        step: Duration,
        by: Deadline,
        fresh: bool,
    ) -> Round<impl Fn(usize, &Pool, &Fault) + '_> {
        Round {
            flavor: Flavor::Plain,
            command: self.command_timeout,
            reply: self.reply_timeout(),
            step: Some(step),
            by,
            fresh,
            readonly_fails: true,
            failed: |i, _: &Pool, e: &Fault| self.failed(i, e),
        }
    }

    /// Sends `packed` (holding `replies` commands) to the masters `targets` at once and
    /// collects each master's replies, all within `step` of the start of the round and within
    /// `by`. `fresh`: a retry, on new connections, and to masters marked down too.
    fn round(
        &self,
        targets: &[usize],
        packed: &[u8],
        replies: usize,
        step: Duration,
        by: Deadline,
        fresh: bool,
    ) -> Replies<Vec<Value>> {
        let mut out = Vec::new();
        let mut parts = Vec::with_capacity(targets.len());
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
            parts.push(Part::new(i, &node.pool, packed, replies));
        }
        out.extend(self.sender(step, by, fresh).run(parts));
        out
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

    /// Runs the plain command `cmd` on the masters `targets` at once, as
    /// [`one_each`](Self::one_each) runs a script call.
    pub(crate) fn command_on(
        &self,
        cmd: &redis::Cmd,
        targets: &[usize],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        self.one_each(targets, &cmd.get_packed_command(), by, fresh)
    }

    /// A round of one command, `packed`, on the masters `targets` at once within `by`: each
    /// master's single reply, a server error as `Err`. `fresh` as in `round`.
    pub(super) fn one_each(
        &self,
        targets: &[usize],
        packed: &[u8],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        self.round(targets, packed, 1, self.call_timeout, by, fresh)
            .into_iter()
            .map(|(i, r)| (i, r.and_then(|mut v| one(v.pop()))))
            .collect()
    }

    /// One master with replica confirmation: `call` and `WAIT` in one round trip, within
    /// `by`; the call's reply, and how many replicas confirmed it.
    pub(crate) fn call_waited(&self, call: &Call, by: Deadline) -> (Result<Value, Fault>, usize) {
        let mut packed = self.pack(call);
        self.push_wait(&mut packed);
        let reply = self
            .round(&[0], &packed, 2, self.call_timeout, by, false)
            .pop()
            .map_or(Err(Fault::timeout("no reply")), |(_, r)| r);
        match reply {
            Ok(mut values) => {
                let acked = acked(values.pop().as_ref());
                (one(values.pop()), acked)
            }
            Err(e) => (Err(e), 0),
        }
    }

    /// Renews a batch of leases on every master in one pipelined round trip per master, all
    /// within `budget`: see [`Backend::renew`](super::Backend::renew). A master whose
    /// connection fails (or stays silent for half the budget: a connection that a NAT
    /// dropped) gets the batch again at once on a new connection, within what is left, unless
    /// the outcome of every lease is known already.
    pub(crate) fn renew(&self, calls: &[(Call, usize)], budget: Duration) -> Renewed {
        let functions = self.functions.load(Ordering::Relaxed);
        let mut packed = Flavor::Plain.renewals(calls.iter().map(|c| &c.0), functions);
        let waits = self.push_wait(&mut packed);
        let by = Deadline::after(budget);
        let first = (budget / 2).min(self.reply_timeout());
        let counts: Vec<usize> = calls.iter().map(|c| c.1).collect();
        let n: usize = counts.iter().sum();
        let expected = calls.len() + 1 + usize::from(waits);
        let mut replies = self.round(&self.all(), &packed, expected, first, by, false);
        let mut outcomes = self.renewed(&counts, &replies);
        let retry = worth_retrying(&replies);
        if !retry.is_empty() && !by.passed() && outcomes.iter().any(Option::is_none) {
            log::debug!(
                "renewal of {n} leases failed on {} master(s); retrying on a new connection",
                retry.len()
            );
            // Renewing again is harmless: a renewal only sets the lease from now on.
            let again = self.round(&retry, &packed, expected, budget, by, true);
            replace_replies(&mut replies, again);
            outcomes = self.renewed(&counts, &replies);
        }
        let mut refused = None;
        for (i, r) in &replies {
            let name = &self.nodes[*i].name;
            if let (None, Ok(values)) = (&refused, r) {
                refused = values.iter().find_map(|v| Refusal::of(v, name));
            }
            match r {
                // At `debug`: a renewal is retried until the lease runs out, and a lease
                // that is lost is reported once, at `warn`, by the renewal thread.
                Err(e) => log::debug!("renewal of {n} leases on {name} failed: {e}"),
                Ok(values) if waits => {
                    let acked = acked(values.last());
                    let needed = self.wait.map_or(0, |(n, _)| n);
                    if acked < needed {
                        log::warn!(
                            target: super::TARGET,
                            "renewal of {n} leases on {name} confirmed by {acked} of {needed} \
                             replicas in time; the leases are kept",
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
    fn renewed(&self, counts: &[usize], replies: &Replies<Vec<Value>>) -> Vec<Option<bool>> {
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
        let (masters, q) = (self.nodes.len(), self.quorum());
        yes.iter()
            .zip(&no)
            .map(|(&y, &f)| quorum::decided(y, f, masters, q))
            .collect()
    }

    /// Checks that every master answers and loads the scripts and the function library (see
    /// [`Round::start`]); fails when one server does not answer, warns of a master of a
    /// quorum that does not. Within `by`.
    pub(crate) fn ping(&self, by: Deadline) -> Result<()> {
        let masters: Vec<(usize, &Pool)> = self.nodes.iter().map(|n| &n.pool).enumerate().collect();
        let name = |i: usize| self.nodes[i].name.clone();
        let (answers, functions) = self
            .sender(self.call_timeout, by, false)
            .start(&masters, name);
        for (i, r) in answers {
            if let Err(e) = r {
                if self.single() {
                    return Err(e.into());
                }
                let name = &self.nodes[i].name;
                log::warn!(target: super::TARGET, "master {name} did not answer: {e}");
            }
        }
        self.functions.store(functions, Ordering::Relaxed);
        Ok(())
    }

    /// `call` ready for another thread to write (see [`Primed`]): on a single plain master
    /// only (not a client that waits for replicas), when an idle pooled connection is at hand
    /// and fewer than [`MAX_PRIMED`](super::prime::MAX_PRIMED) are primed; its timeouts set to the
    /// command timeout.
    pub(crate) fn prime(&self, call: &Call) -> Option<Primed> {
        if !self.single() || self.wait.is_some() {
            return None;
        }
        let slot = PrimedSlot::take(&self.primed)?;
        let mut con = self.nodes[0].pool.idle()?;
        if let Err(e) = con.set_timeouts(self.command_timeout) {
            log::debug!("priming a script call: {e}");
            return None;
        }
        Some(Primed::new(con, self.pack(call), slot))
    }

    /// Gives back the connection of a call that was primed and never written.
    pub(crate) fn unprime(&self, p: Primed) {
        self.nodes[0].pool.put(p.con);
    }

    /// The reply of a primed call that was written (`wrote`), within `by`. A failed write
    /// (the public error of [`Primed::fire`], an I/O error or a socket's timeout) counts
    /// against the connection as any other failure does.
    pub(crate) fn finish(
        &self,
        p: Primed,
        wrote: Result<()>,
        by: Deadline,
    ) -> Result<Value, Fault> {
        if let Err(e) = wrote {
            let e = Fault::Other(e);
            self.failed(0, &e);
            return Err(e);
        }
        let part = Part::new(0, &self.nodes[0].pool, &p.packed, 1);
        let read_by = by.min(Deadline::after(self.call_timeout));
        self.sender(self.call_timeout, by, false)
            .collect(&part, p.con, read_by)
            .and_then(|mut v| one(v.pop()))
    }

    /// Drops every idle connection.
    pub(crate) fn clear(&self) {
        for n in &self.nodes {
            n.pool.clear();
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
