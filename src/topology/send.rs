//! Sending, as every topology does it. A [`Round`] writes each master's [`Part`] (its packed
//! commands) on a pooled connection, idle ones first, then reads every master's replies, all
//! within one bound measured from the first write: so five masters cost about one round trip,
//! not five. On a reply, `NOSCRIPT` (or a missing function) loads the scripts and resends on
//! that master; `READONLY` (a master demoted by a failover) is a failure of the connection
//! where the topology says so. [`Round::start`] is the check every topology makes once, when
//! the client is built: each master answers, and has the scripts and the function library.
//!
//! Every topology's masters are [`Node`]s, and the independent masters (`backend/`) and the
//! cluster (`cluster.rs`) send to them alike; they differ in whom a call goes to (every
//! master, or its slot's master), in whether a master that failed is skipped for a while (a
//! quorum's), and in their [`Flavor`]: the scripts as their masters run them, a cluster's
//! with `publish` made a sharded `spublish` (under its own SHA1, and in its own function
//! library).

use std::sync::LazyLock;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ServerErrorKind, Value};

use crate::error::{Error, RedisFailure};
use crate::protocol::library::{self, Library, PLAIN};
use crate::protocol::scripts::{Call, Which};
use crate::transport::conn::{Conn, Deadline, Pool};
use crate::transport::fault::Fault;

/// Each master's replies to one round, by the master's index.
pub(crate) type Replies<T> = Vec<(usize, Result<T, Fault>)>;

/// The scripts as a topology's masters run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// As written: one server, Sentinel's master, a quorum of independent masters.
    Plain,
    /// On a cluster: `publish` is `spublish` (sharded pub/sub).
    Sharded,
}

/// The scripts as a cluster runs them, in the order of [`Which::ALL`].
static SHARDED: LazyLock<Vec<(Which, redis::Script, String)>> = LazyLock::new(|| {
    Which::ALL
        .iter()
        .map(|&w| {
            let source = sharded_source(w.source());
            (w, redis::Script::new(&source), source)
        })
        .collect()
});

/// The function library of the sharded scripts.
static SHARDED_LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::new(sharded_source));

/// A script's source with every `publish` made a sharded `spublish`.
pub(crate) fn sharded_source(source: &str) -> String {
    source.replace("redis.call('publish'", "redis.call('spublish'")
}

fn sharded(which: Which) -> &'static (Which, redis::Script, String) {
    SHARDED
        .iter()
        .find(|(w, ..)| *w == which)
        .unwrap_or(&SHARDED[0])
}

impl Flavor {
    /// The function library that holds the Mutex acquire and release.
    pub(crate) fn library(self) -> &'static Library {
        match self {
            Flavor::Plain => &PLAIN,
            Flavor::Sharded => &SHARDED_LIBRARY,
        }
    }

    /// Writes `call` to `out`: `FCALL` of its function when `functions` and the library holds
    /// it, `EVALSHA` of the script otherwise.
    pub(crate) fn write(self, call: &Call, functions: bool, out: &mut Vec<u8>) {
        let sha = match self {
            Flavor::Plain => None,
            Flavor::Sharded => Some(sharded(call.which).1.get_hash()),
        };
        self.library().write(call, functions, sha, out);
    }

    /// `call` packed (see [`write`](Self::write)).
    pub(crate) fn pack(self, call: &Call, functions: bool) -> Vec<u8> {
        if self == Flavor::Plain {
            return PLAIN.pack(call, functions);
        }
        let mut out = Vec::new();
        self.write(call, functions, &mut out);
        out
    }

    /// A renewal pipeline: each of `calls`, then `TIME` (the master's clock, read in the same
    /// round: see `renewal::clock_watch`).
    pub(crate) fn renewals<'c>(
        self,
        calls: impl IntoIterator<Item = &'c Call>,
        functions: bool,
    ) -> Vec<u8> {
        let mut packed = Vec::new();
        for c in calls {
            self.write(c, functions, &mut packed);
        }
        redis::cmd("TIME").write_packed_command(&mut packed);
        packed
    }

    /// Appends `SCRIPT LOAD` of every lock type's script to `out` (a renewal batch may mix
    /// them, and none should meet `NOSCRIPT` twice); how many commands.
    fn write_loads(self, out: &mut Vec<u8>) -> usize {
        for w in Which::ALL {
            let source = match self {
                Flavor::Plain => w.source(),
                Flavor::Sharded => sharded(w).2.as_str(),
            };
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .write_packed_command(out);
        }
        Which::ALL.len()
    }
}

/// One Redis master, as every topology has it: its name, its pool, and what its last failure
/// says. The independent masters are fixed; a cluster makes one per node its map names.
#[derive(Debug)]
pub(crate) struct Node {
    /// The master's URL without its password (a cluster node's `host:port`), for messages.
    pub(crate) name: String,
    pub(crate) pool: Pool,
    /// Skipped until then, after a failure of its connection (a quorum's master).
    down_until: Mutex<Option<Instant>>,
    /// Its last read of a cluster's slot map failed: it is asked after every other node.
    pub(crate) demoted: AtomicBool,
}

impl Node {
    pub(crate) fn new(name: String, pool: Pool) -> Self {
        Node {
            name,
            pool,
            down_until: Mutex::new(None),
            demoted: AtomicBool::new(false),
        }
    }

    /// Notes a failure: a broken connection (or a master demoted by a failover) drops every
    /// pooled connection (after a restart or a `CLIENT KILL` they are all dead, and a retry
    /// should open a new one) and a Sentinel's cached address, and with `pause` skips the
    /// master for that long. Out of time before any I/O, the server did nothing wrong.
    fn failed(&self, e: &Fault, pause: Option<Duration>) {
        if !(e.is_broken() || e.is_readonly()) {
            return;
        }
        self.pool.forget_master();
        if let Some(pause) = pause {
            *self.down_until.lock() = Instant::now().checked_add(pause);
            log::debug!("master {} failed: {e}", self.name);
        }
    }

    fn is_down(&self) -> bool {
        self.down_until.lock().is_some_and(|t| Instant::now() < t)
    }
}

/// One master's part of a round: its index (as the caller counts them), the master, the
/// commands packed, and how many replies they ask for.
pub(crate) struct Part<'a> {
    pub(crate) to: usize,
    pub(crate) node: &'a Node,
    pub(crate) packed: &'a [u8],
    pub(crate) replies: usize,
}

impl<'a> Part<'a> {
    pub(crate) fn new(to: usize, node: &'a Node, packed: &'a [u8], replies: usize) -> Self {
        Part {
            to,
            node,
            packed,
            replies,
        }
    }
}

/// How one round is sent: the topology's scripts, the bounds, and what a failure does.
pub(crate) struct Round {
    /// The scripts as the masters run them. On a cluster (the sharded flavor) a `READONLY`
    /// reply is followed as a redirection is; elsewhere it fails the whole reply as a failure
    /// of the connection.
    pub(crate) flavor: Flavor,
    /// The bound on each write, and on each step of loading the scripts (the command
    /// timeout).
    pub(crate) command: Duration,
    /// The bound on each read (the command timeout, plus the replicas' wait when asked for).
    pub(crate) reply: Duration,
    /// The reads end `step` after the start of the round (a resend after loading the scripts
    /// gets another `step`), and all by `by`. `None`: by `by` alone.
    pub(crate) step: Option<Duration>,
    pub(crate) by: Deadline,
    /// A retry: on new connections only, and to masters skipped after a failure too.
    pub(crate) fresh: bool,
    /// How long a master whose connection failed is skipped (a quorum's masters); `None`:
    /// never skipped.
    pub(crate) pause: Option<Duration>,
}

impl Round {
    /// `by`, and `step` from now.
    pub(crate) fn within(&self) -> Deadline {
        match self.step {
            Some(s) => self.by.min(Deadline::after(s)),
            None => self.by,
        }
    }

    pub(crate) fn failed(&self, p: &Part<'_>, e: &Fault) {
        p.node.failed(e, self.pause);
    }

    /// Sends every part at once and collects each master's replies. Masters with an idle
    /// connection get their part first; opening a connection (up to the connect timeout for
    /// a stalled master) comes after, so it delays nobody's send.
    pub(crate) fn run(&self, parts: Vec<Part<'_>>) -> Replies<Vec<Value>> {
        let read_by = self.within();
        let mut sent = Vec::with_capacity(parts.len());
        let mut out = Vec::with_capacity(parts.len());
        let mut new = Vec::new();
        for p in parts {
            match self.idle(&p).transpose() {
                Some(con) => self.send(p, con, &mut sent, &mut out),
                None => new.push(p),
            }
        }
        for p in new {
            let con = self.connect(&p);
            self.send(p, con, &mut sent, &mut out);
        }
        for (p, con) in sent {
            let result = self.collect(&p, con, read_by);
            out.push((p.to, result));
        }
        out
    }

    /// [`run`](Self::run) with a single part (one master): its replies, without the lists
    /// that keep several masters' parts apart.
    pub(crate) fn run_one(&self, p: Part<'_>) -> Result<Vec<Value>, Fault> {
        let read_by = self.within();
        let con = match self.idle(&p)? {
            Some(con) => con,
            None => self.connect(&p)?,
        };
        let con = self.write(&p, con)?;
        self.collect(&p, con, read_by)
    }

    /// `p`'s master's idle connection (`None`: a new one is needed; a retry takes no idle
    /// one), or `Err` for a master skipped after a failure.
    fn idle(&self, p: &Part<'_>) -> Result<Option<Conn>, Fault> {
        if self.pause.is_some() && !self.fresh && p.node.is_down() {
            return Err(Fault::MarkedDown);
        }
        Ok(p.node.pool.idle().filter(|_| !self.fresh))
    }

    /// A new connection to `p`'s master, within `by`; a failure is recorded.
    fn connect(&self, p: &Part<'_>) -> Result<Conn, Fault> {
        p.node
            .pool
            .connect(self.by)
            .inspect_err(|e| self.failed(p, e))
    }

    /// Sends one command, `packed`, to `node` alone: its reply, a server error as `Err`.
    pub(crate) fn ask(&self, node: &Node, packed: &[u8]) -> Result<Value, Fault> {
        self.run_one(Part::new(0, node, packed, 1))
            .and_then(|mut v| one(v.pop()))
    }

    /// Sends one command, `packed`, to each of `masters` (each with its index) at once: each
    /// master's reply, a server error as `Err`. A single master's goes through
    /// [`run_one`](Self::run_one).
    pub(crate) fn each<'a>(
        &self,
        masters: impl IntoIterator<Item = (usize, &'a Node)>,
        packed: &[u8],
    ) -> Replies<Value> {
        let mut parts: Vec<_> = (masters.into_iter())
            .map(|(i, node)| Part::new(i, node, packed, 1))
            .collect();
        if let [_] = parts.as_slice()
            && let Some(p) = parts.pop()
        {
            return vec![(p.to, self.ask(p.node, packed))];
        }
        (self.run(parts).into_iter())
            .map(|(i, r)| (i, r.and_then(|mut v| one(v.pop()))))
            .collect()
    }

    /// Writes `p` on `con` (unless opening it failed), recording the connection or the failure.
    fn send<'a>(
        &self,
        p: Part<'a>,
        con: Result<Conn, Fault>,
        sent: &mut Vec<(Part<'a>, Conn)>,
        out: &mut Replies<Vec<Value>>,
    ) {
        match con.and_then(|con| self.write(&p, con)) {
            Ok(con) => sent.push((p, con)),
            Err(e) => out.push((p.to, Err(e))),
        }
    }

    /// Writes `p` on `con`: the connection to read the replies from, or the failure (recorded).
    fn write(&self, p: &Part<'_>, mut con: Conn) -> Result<Conn, Fault> {
        match con.send(p.packed, self.command, self.by) {
            Ok(()) => Ok(con),
            Err(e) => {
                if matches!(e, Fault::RanOut { .. }) {
                    // Nothing was written: the connection is as good as before.
                    p.node.pool.put(con);
                } else {
                    self.failed(p, &e);
                }
                Err(e)
            }
        }
    }

    /// Reads the replies to `p`, written on `con`, by `read_by`: loads the scripts and
    /// resends on `NOSCRIPT` (within another `step`), fails on `READONLY` where the topology
    /// says so, and gives the connection back to the pool or reports the failure.
    pub(crate) fn collect(
        &self,
        p: &Part<'_>,
        mut con: Conn,
        read_by: Deadline,
    ) -> Result<Vec<Value>, Fault> {
        let result = match self.receive(&mut con, p.replies, read_by) {
            Ok(values)
                if values
                    .iter()
                    .any(|v| is_noscript(v) || library::is_no_function(v)) =>
            {
                // After a restart, SCRIPT FLUSH or FUNCTION FLUSH: load, and resend on this
                // master alone, still within the call's bound.
                let again = self.within();
                let scripts = values.iter().any(is_noscript);
                let functions = values.iter().any(library::is_no_function);
                self.reload(&mut con, scripts, functions)
                    .and_then(|()| con.send(p.packed, self.command, again))
                    .and_then(|()| self.receive(&mut con, p.replies, again))
            }
            other => other,
        };
        // A master demoted to a replica (a failover) answers writes with `READONLY`: the
        // whole reply is a failure of the connection, retried where the master is now.
        let result = result.and_then(|values| match values.iter().position(is_readonly) {
            Some(k) if self.flavor == Flavor::Plain => Err(one(values.into_iter().nth(k))
                .err()
                .unwrap_or(Fault::timeout("no reply"))),
            _ => Ok(values),
        });
        match &result {
            Err(e) => self.failed(p, e),
            Ok(_) if con.is_open() => p.node.pool.put(con),
            Ok(_) => {}
        }
        result
    }

    /// Reads `n` replies, each read bounded by the reply bound and by `by` (checked again
    /// every 256 replies of a long pipeline).
    fn receive(&self, con: &mut Conn, n: usize, by: Deadline) -> Result<Vec<Value>, Fault> {
        let mut values = Vec::with_capacity(n);
        for k in 0..n {
            if k % 256 == 0 {
                // Past the deadline, a reply that has already arrived is still taken: a
                // stalled master read before this one must not fail a healthy one.
                let t = by.cap(self.reply).unwrap_or(Duration::from_millis(1));
                con.set_read_timeout(t)?;
            }
            values.push(con.recv_now()?);
        }
        Ok(values)
    }

    /// Loads every script (`scripts`) and the function library (`functions`) on `con`, in
    /// one round trip within `by`.
    fn reload(&self, con: &mut Conn, scripts: bool, functions: bool) -> Result<(), Fault> {
        let mut packed = Vec::new();
        let loads = if scripts {
            self.flavor.write_loads(&mut packed)
        } else {
            0
        };
        if functions {
            self.flavor
                .library()
                .load()
                .write_packed_command(&mut packed);
        }
        con.send(&packed, self.command, self.by)?;
        for k in 0..loads + usize::from(functions) {
            match con.recv(self.command, self.by)? {
                v if k >= loads && library::loaded(&v) => {}
                Value::ServerError(e) => return Err(Fault::Redis(e.into())),
                _ => {}
            }
        }
        Ok(())
    }

    /// Checks that each of `masters` (index and pool) answers `PING`, and loads the scripts
    /// into their caches, so that the first calls (and the first renewal batch) do not meet
    /// `NOSCRIPT`, and the function library. Each master's answer to `PING`, and whether the
    /// Mutex acquire and release may go as `FCALL`: every master that answered loaded the
    /// library and ran its `ping` function.
    pub(crate) fn start(&self, masters: &[(usize, &Node)]) -> (Replies<()>, bool) {
        let mut packed = redis::cmd("PING").get_packed_command();
        let loads = self.flavor.write_loads(&mut packed);
        let library = self.flavor.library();
        library.load().write_packed_command(&mut packed);
        let name = |i: usize| masters.iter().find(|m| m.0 == i).map_or("", |m| &m.1.name);
        let mut loaded = None;
        let mut answers = Vec::new();
        let parts = (masters.iter()).map(|&(to, node)| Part::new(to, node, &packed, 2 + loads));
        for (i, r) in self.run(parts.collect()) {
            // Only the PING must succeed; a refused SCRIPT LOAD (an ACL) is left to the calls,
            // which then report the server's error by name, and a refused FUNCTION LOAD (an
            // ACL, a server before 7.0) leaves the calls on EVALSHA.
            // The replies: PING's, each SCRIPT LOAD's, then FUNCTION LOAD's.
            let r = r.and_then(|mut values| {
                let lib = match values.pop() {
                    Some(v) if library::loaded(&v) => Ok(()),
                    other => one(other).map(drop),
                };
                if let Err(e) = &lib {
                    log::debug!("function library not loaded on {}: {e}", name(i));
                }
                if let Some(e) = (values.iter().skip(1)).find_map(|v| one(Some(v.clone())).err()) {
                    log::debug!("scripts not loaded on {}: {e}", name(i));
                }
                one(values.into_iter().next()).map(|_| lib.is_ok())
            });
            if let Ok(ok) = r {
                loaded = Some(loaded.unwrap_or(true) && ok);
            }
            answers.push((i, r.map(drop)));
        }
        if loaded != Some(true) {
            return (answers, false);
        }
        // FCALL may still be refused where FUNCTION LOAD was not (an ACL). Asked of the
        // masters that answered: one that did not is judged by its FUNCTION LOAD, and costs
        // no second wait.
        let answered = (masters.iter().copied())
            .filter(|(i, _)| answers.iter().any(|(j, r)| i == j && r.is_ok()));
        let ping = library.ping().get_packed_command();
        let runs = (self.each(answered, &ping).into_iter()).all(|(i, r)| match r {
            Ok(Value::Int(1)) => true,
            Ok(_) => false,
            // A master that does not answer now is judged by its FUNCTION LOAD.
            Err(e) if unanswered(&e) => true,
            Err(e) => {
                log::debug!("FCALL refused on {}: {e}", name(i));
                false
            }
        });
        (answers, runs)
    }
}

/// The single reply of a one-command round, with a server error turned into `Err`.
pub(crate) fn one(v: Option<Value>) -> Result<Value, Fault> {
    match v {
        Some(Value::ServerError(e)) => Err(Fault::Redis(e.into())),
        Some(v) => Ok(v),
        None => Err(Fault::timeout("no reply")),
    }
}

/// Whether `e` says that a master gave no answer now (a failed connection, a timeout, no
/// time left, an answer that was not RESP), rather than an error of its own.
fn unanswered(e: &Fault) -> bool {
    match e {
        Fault::Redis(r) | Fault::Other(Error::Redis(RedisFailure(r))) => r.code().is_none(),
        Fault::Other(e) => e.is_timeout(),
        _ => true,
    }
}

fn is_readonly(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::ReadOnly))
}

pub(crate) fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_scripts_publish_with_spublish_only() {
        for w in Which::ALL {
            let s = sharded_source(w.source());
            assert!(!s.contains("redis.call('publish'"), "{w:?}");
            if w.source().contains("redis.call('publish'") {
                assert!(s.contains("redis.call('spublish'"), "{w:?}");
                assert_ne!(
                    sharded(w).1.get_hash(),
                    redis::Script::new(w.source()).get_hash()
                );
            }
        }
    }
}
