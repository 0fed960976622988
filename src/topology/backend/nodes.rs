//! [`Nodes`]: independent masters, each with its own pool: one Redis server (found directly or
//! through Sentinel), or a quorum of them (RedLock). One master is the quorum 1 of 1.
//!
//! A call goes to every master *at once* without a thread per master: the command is written
//! on each master's connection first, then the replies are read, all within one bound
//! measured from the first write. So five masters cost about one round trip, not five. On a
//! reply, `NOSCRIPT` (or a missing function) loads the scripts and resends on that master,
//! and `READONLY` (a master demoted by a failover) is a failure of the connection.
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
use super::{Refusal, Renewed, one, unanswered};
use crate::error::Result;
use crate::protocol::library::{self, PLAIN};
use crate::protocol::scripts::{self, Call, Which};
use crate::topology::quorum::{self, replace_replies, worth_retrying};
use crate::transport::conn::{Conn, Deadline, Pool};
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

/// Each master's replies to one round.
pub(crate) type Replies<T> = Vec<(usize, Result<T, Fault>)>;

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
        PLAIN.pack(call, self.functions.load(Ordering::Relaxed))
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

    /// Sends `packed` (holding `replies` commands) to the masters `targets` at once and
    /// collects each master's replies, all within `step` of the start of the round and within
    /// `by`. `fresh`: a retry, on new connections, and to masters marked down too. `which`:
    /// the script to load on `NOSCRIPT` (`None` for plain commands).
    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        targets: &[usize],
        packed: &[u8],
        replies: usize,
        which: Option<Which>,
        step: Duration,
        by: Deadline,
        fresh: bool,
    ) -> Replies<Vec<Value>> {
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
        out: &mut Replies<Vec<Value>>,
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
        which: Option<Which>,
        step: Duration,
        read_by: Deadline,
        by: Deadline,
    ) -> Result<Vec<Value>, Fault> {
        let result = match self.receive(&mut con, replies, read_by) {
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
                        if let Some(which) = which.filter(|_| scripts) {
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

    /// Runs the plain command `cmd` on the masters `targets` at once, as
    /// [`one_each`](Self::one_each) runs a script call.
    pub(crate) fn command_on(
        &self,
        cmd: &redis::Cmd,
        targets: &[usize],
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        self.one_each(targets, &cmd.get_packed_command(), None, by, fresh)
    }

    /// A round of one command, `packed`, on the masters `targets` at once within `by`: each
    /// master's single reply, a server error as `Err`. `which` and `fresh` as in `round`.
    pub(super) fn one_each(
        &self,
        targets: &[usize],
        packed: &[u8],
        which: Option<Which>,
        by: Deadline,
        fresh: bool,
    ) -> Replies<Value> {
        self.round(targets, packed, 1, which, self.call_timeout, by, fresh)
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
            .round(
                &[0],
                &packed,
                2,
                Some(call.which),
                self.call_timeout,
                by,
                false,
            )
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
        let which = Some(Which::RenewBatch);
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

    /// Checks that every master answers and loads the scripts into their caches, so that the
    /// first calls (and the first renewal batch) do not meet `NOSCRIPT`, and the function
    /// library: the Mutex acquire and release go as `FCALL` when every master that answered
    /// loaded it and ran its `ping` function. Within `by`.
    pub(crate) fn ping(&self, by: Deadline) -> Result<()> {
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
            None,
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
                    let name = &self.nodes[i].name;
                    log::warn!(target: super::TARGET, "master {name} did not answer: {e}");
                }
            }
        }
        if loaded == Some(true) {
            // FCALL may still be refused where FUNCTION LOAD was not (an ACL).
            let runs = self
                .command_on(&PLAIN.ping(), &self.all(), by, false)
                .into_iter()
                .all(|(i, r)| match r {
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
        Some(Primed::new(con, self.pack(call), call.which, slot))
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
        let (con, packed, which) = (p.con, p.packed, p.which);
        let read_by = by.min(Deadline::after(self.call_timeout));
        self.collect(
            0,
            con,
            &packed,
            1,
            Some(which),
            self.call_timeout,
            read_by,
            by,
        )
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

fn is_readonly(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::ReadOnly))
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}
