//! The random runs: clients of the Mutex (one master, or a quorum of masters as RedLock) drive
//! the crate's own calls through the model masters under faults, and every grant is checked.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::Value;

use super::host::Host;
use super::store::Reply;
use crate::protocol::keys::LockKeys;
use crate::protocol::lua::{MAX_BLOCK, RESERVE_US};
use crate::protocol::mutex::{self, Acquire, Publish, Release, Renewing};
use crate::protocol::scripts::{self, AcquireReply, Admin, Call, Level, Live, ReleaseReply, Which};

/// A small, fast, replayable random source (SplitMix64).
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 for `n == 0`).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with probability `p`.
    pub(super) fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// How often each fault strikes, per step (probabilities).
#[derive(Debug, Clone, Copy)]
pub(super) struct Faults {
    /// A master restarts with an empty dataset (keys and both Lua states lost).
    pub(super) restart: f64,
    /// FLUSHALL on a master (keys lost, scripts and functions kept).
    pub(super) flush: f64,
    /// One key of a master evicted (or deleted by an operator).
    pub(super) evict: f64,
    /// FUNCTION FLUSH and a reload: the library's Lua state, and so its memory, is new.
    pub(super) reload: f64,
    /// A failover to a replica that missed the last writes.
    pub(super) failover: f64,
    /// A master's clock steps back.
    pub(super) step_back: f64,
    /// A master's clock steps forward.
    pub(super) step_forward: f64,
    /// A quorum client loses or regains its link to a master.
    pub(super) partition: f64,
    /// A script call's reply is lost after the script ran (the client retries).
    pub(super) lost_reply: f64,
    /// An operator frees a lock by force.
    pub(super) force: f64,
}

impl Faults {
    /// No faults at all.
    pub(super) const NONE: Faults = Faults {
        restart: 0.0,
        flush: 0.0,
        evict: 0.0,
        reload: 0.0,
        failover: 0.0,
        step_back: 0.0,
        step_forward: 0.0,
        partition: 0.0,
        lost_reply: 0.0,
        force: 0.0,
    };

    /// These faults, keeping only those `names` (comma-separated field names) lists.
    pub(super) fn only(self, names: &str) -> Faults {
        let keep = |n: &str, p: f64| {
            if names.split(',').any(|x| x.trim() == n) {
                p
            } else {
                0.0
            }
        };
        Faults {
            restart: keep("restart", self.restart),
            flush: keep("flush", self.flush),
            evict: keep("evict", self.evict),
            reload: keep("reload", self.reload),
            failover: keep("failover", self.failover),
            step_back: keep("step_back", self.step_back),
            step_forward: keep("step_forward", self.step_forward),
            partition: keep("partition", self.partition),
            lost_reply: keep("lost_reply", self.lost_reply),
            force: keep("force", self.force),
        }
    }

    /// Every fault, now and then.
    pub(super) const ALL: Faults = Faults {
        restart: 0.0005,
        flush: 0.0005,
        evict: 0.002,
        reload: 0.001,
        failover: 0.0005,
        step_back: 0.001,
        step_forward: 0.0005,
        partition: 0.002,
        lost_reply: 0.01,
        force: 0.0005,
    };
}

/// One run's shape.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// 1: single-server clients; 3 or 5: quorum (RedLock) clients over that many masters.
    pub(super) masters: usize,
    /// Clients (processes), each with its own owner ids, call form and hand-off block.
    pub(super) clients: usize,
    /// Threads per client.
    pub(super) threads: usize,
    /// Lock names (the first two share a hash slot, so a fencing mark).
    pub(super) names: usize,
    /// The faults.
    pub(super) faults: Faults,
    /// The largest clock offset between masters at the start, in microseconds.
    pub(super) skew_us: i64,
    /// The largest clock step, in microseconds.
    pub(super) max_step_us: i64,
    /// The bound of most steps' time, in microseconds (a few ms now and then, rarely a
    /// lease's worth).
    pub(super) tick_us: u64,
    /// The seed.
    pub(super) seed: u64,
}

/// Something that happened to a master, for telling excused findings from others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Restart,
    Flush,
    /// A key evicted: whether it was a fencing mark.
    Evict {
        mark: bool,
    },
    Reload,
    Failover,
    StepBack,
    StepForward,
    /// A force-unlock of the name with this index.
    Force(usize),
}

impl Event {
    /// The keys, and so the mark, are lost.
    fn loses_mark(self) -> bool {
        matches!(
            self,
            Event::Restart | Event::Flush | Event::Evict { mark: true } | Event::Failover
        )
    }

    /// A holder's lock may be gone from the server while it still holds it locally.
    fn loses_lock(self) -> bool {
        matches!(
            self,
            Event::Restart
                | Event::Flush
                | Event::Evict { mark: false }
                | Event::Failover
                | Event::StepForward
                | Event::Force(_)
        )
    }
}

/// A master of the model.
struct Master {
    host: Host,
    /// Its clock's offset from the model's time, in microseconds.
    offset: i64,
    /// Its replica's copy of the keys (taken now and then: it misses the last writes).
    replica: BTreeMap<Vec<u8>, super::store::Entry>,
    events: Vec<(i64, Event)>,
}

/// One held lock, as its holding thread knows it.
#[derive(Debug, Clone)]
struct Hold {
    name: usize,
    owner: String,
    acquisition: String,
    token: u64,
    /// The last token of the hand-off block.
    last: u64,
    count: u32,
    /// Until when the holder knows it holds (the model's time, in microseconds).
    valid_until: i64,
    passes: u32,
    /// Each master's event count at its grant.
    marks: Vec<usize>,
}

/// The highest token granted for a name so far.
#[derive(Debug, Clone)]
struct Best {
    token: u64,
    /// How far the token led its master's clock token (single master): past a block and a
    /// reservation only after the clock stepped back.
    ahead: i64,
    at: i64,
    step: u64,
    marks: Vec<usize>,
    fcall: bool,
    by: String,
}

/// A finding: an invariant broken, or (with `excused`) broken within a limit the guarantees
/// state.
#[derive(Debug, Clone)]
pub(super) struct Finding {
    pub(super) kind: &'static str,
    pub(super) step: u64,
    pub(super) secs: f64,
    pub(super) detail: String,
}

/// What a run found, and how fast it ran.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) findings: Vec<Finding>,
    pub(super) excused: BTreeMap<&'static str, u64>,
    pub(super) grants: u64,
    pub(super) calls: u64,
    pub(super) steps: u64,
    pub(super) elapsed: Duration,
}

impl Outcome {
    /// Script calls per second.
    pub(super) fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct Client {
    fcall: bool,
    block: u32,
    lease_ms: u64,
    /// Masters this client cannot reach now.
    cut: Vec<bool>,
}

struct Thread {
    client: usize,
    owner: String,
    owners: u64,
    holds: Vec<Hold>,
}

/// One run.
pub(super) struct Sim {
    s: Settings,
    rng: Rng,
    masters: Vec<Master>,
    keys: Vec<LockKeys>,
    clients: Vec<Client>,
    threads: Vec<Thread>,
    best: Vec<Option<Best>>,
    /// Per name: the highest token a release or renewal raised on a quorum of masters, and
    /// each master's event count then.
    raised: Vec<Option<(u64, Vec<usize>)>>,
    now: i64,
    step: u64,
    requests: u64,
    started: Instant,
    pub(super) out: Outcome,
    /// Stop at the first finding that is not excused.
    pub(super) stop_at_first: bool,
    /// Print each finding as it is made.
    pub(super) verbose: bool,
    /// Print every script call and fault from this step on (`LOCKSMITH_CHECKER_TRACE`).
    pub(super) trace_from: u64,
    /// Print the first this many of each excused kind (`LOCKSMITH_CHECKER_SHOW_EXCUSED`).
    pub(super) show_excused: u64,
}

const PREFIX: &str = "ck:";

/// The most a token may lead its grant's clock token without a step back: a hand-off block
/// and a reservation (docs/guarantees.md, "Clocks").
const LATEST_LEAD: i64 = MAX_BLOCK as i64 + RESERVE_US as i64;

/// Names whose first two share a fencing mark.
fn names(n: usize) -> Vec<LockKeys> {
    let first = LockKeys::new(PREFIX, "n0");
    let mut out = vec![first.clone()];
    let mut i = 1;
    while out.len() < 2 {
        let k = LockKeys::new(PREFIX, &format!("n{i}"));
        if k.fence == first.fence {
            out.push(k);
        }
        i += 1;
    }
    let mut j = 1;
    while out.len() < n.max(2) {
        let k = LockKeys::new(PREFIX, &format!("m{j}"));
        if k.fence != first.fence {
            out.push(k);
        }
        j += 1;
    }
    out.truncate(n.max(1));
    out
}

/// A call's script, keys and arguments, as the script receives them.
struct Split {
    which: Which,
    keys: Vec<Vec<u8>>,
    argv: Vec<Vec<u8>>,
}

impl From<&Call> for Split {
    fn from(call: &Call) -> Split {
        let (keys, argv) = split(call);
        Split {
            which: call.which,
            keys,
            argv,
        }
    }
}

/// The keys and arguments of a call, as the script receives them.
pub(super) fn split(call: &Call) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let args: Vec<Vec<u8>> = call
        .cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => b.to_vec(),
            _ => Vec::new(),
        })
        .collect();
    let n: usize = std::str::from_utf8(&args[2])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (args[3..3 + n].to_vec(), args[3 + n..].to_vec())
}

/// A reply as the client's parsers take it.
pub(super) fn value(r: &Reply) -> Value {
    match r {
        Reply::Nil => Value::Nil,
        Reply::Int(i) => Value::Int(*i),
        Reply::Bulk(b) => Value::BulkString(b.clone()),
        Reply::Status(s) => Value::SimpleString(s.clone()),
        Reply::Err(e) => redis::parse_redis_value(format!("-{e}\r\n").as_bytes())
            .unwrap_or_else(|_| Value::SimpleString(e.clone())),
        Reply::Arr(items) => Value::Array(items.iter().map(value).collect()),
    }
}

impl Sim {
    /// A run of `s`, masters and Lua states built.
    pub(super) fn new(s: Settings) -> Sim {
        let mut rng = Rng::new(s.seed);
        let masters = (0..s.masters)
            .map(|_| Master {
                host: Host::new().expect("the scripts compile"),
                offset: rng.below(s.skew_us as u64 + 1) as i64 - s.skew_us / 2,
                replica: BTreeMap::new(),
                events: Vec::new(),
            })
            .collect();
        let clients = (0..s.clients)
            .map(|_| Client {
                fcall: rng.chance(0.7),
                block: if s.masters > 1 {
                    0
                } else {
                    rng.pick(&[0, 1, 3, 16, 1024])
                },
                lease_ms: rng.pick(&[20, 50, 200, 1000]),
                cut: vec![false; s.masters],
            })
            .collect();
        let threads = (0..s.clients * s.threads)
            .map(|i| Thread {
                client: i / s.threads,
                owner: format!("c{}t{}o0", i / s.threads, i % s.threads),
                owners: 0,
                holds: Vec::new(),
            })
            .collect();
        let keys = names(s.names);
        Sim {
            best: vec![None; keys.len()],
            raised: vec![None; keys.len()],
            keys,
            masters,
            clients,
            threads,
            now: 1_750_000_000_000_000 + (rng.below(1_000_000_000) as i64),
            step: 0,
            requests: 0,
            started: Instant::now(),
            out: Outcome::default(),
            stop_at_first: false,
            verbose: false,
            show_excused: std::env::var("LOCKSMITH_CHECKER_SHOW_EXCUSED")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            trace_from: std::env::var("LOCKSMITH_CHECKER_TRACE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX),
            rng,
            s,
        }
    }

    /// Sets each master's clock offset (microseconds from the model's time).
    pub(super) fn set_offsets(&mut self, offsets: &[i64]) {
        for (m, o) in self.masters.iter_mut().zip(offsets) {
            m.offset = *o;
        }
    }

    /// Cuts client `c` off from master `m` (for directed runs).
    pub(super) fn cut(&mut self, c: usize, m: usize) {
        self.clients[c].cut[m] = true;
    }

    /// Makes every client use the function library (`FCALL`) or not.
    pub(super) fn set_fcall(&mut self, fcall: bool) {
        for c in &mut self.clients {
            c.fcall = fcall;
        }
    }

    fn quorum(&self) -> usize {
        self.s.masters / 2 + 1
    }

    fn single(&self) -> bool {
        self.s.masters == 1
    }

    fn marks(&self) -> Vec<usize> {
        self.masters.iter().map(|m| m.events.len()).collect()
    }

    fn event(&mut self, m: usize, e: Event) {
        let now = self.now;
        if self.step >= self.trace_from {
            eprintln!("checker trace: step {} master {m}: {e:?}", self.step);
        }
        self.masters[m].events.push((now, e));
    }

    /// The events of the masters `on` since `marks`.
    fn since(&self, marks: &[usize], on: &[usize]) -> Vec<Event> {
        on.iter()
            .flat_map(|&m| {
                self.masters[m].events[marks.get(m).copied().unwrap_or(0)..]
                    .iter()
                    .map(|(_, e)| *e)
            })
            .collect()
    }

    fn request(&mut self) -> String {
        self.requests += 1;
        format!("q{}", self.requests)
    }

    fn note(&mut self, kind: &'static str, excused: Option<&'static str>, detail: String) {
        if let Some(e) = excused {
            let n = self.out.excused.entry(e).or_default();
            *n += 1;
            if *n <= self.show_excused {
                eprintln!(
                    "checker: excused `{kind}` ({e}) at step {}: {detail}",
                    self.step
                );
            }
            return;
        }
        let f = Finding {
            kind,
            step: self.step,
            secs: self.started.elapsed().as_secs_f64(),
            detail,
        };
        if self.verbose {
            eprintln!(
                "checker: finding `{}` at step {} ({:.3} s): {}",
                f.kind, f.step, f.secs, f.detail
            );
        }
        self.out.findings.push(f);
    }

    /// Runs `call` on master `m`; None when the client cannot reach it. The reply may be
    /// lost (`Err(())`) after the script ran.
    fn run(
        &mut self,
        m: usize,
        call: &Split,
        fcall: bool,
        client: usize,
    ) -> Option<Result<Reply, ()>> {
        if self.clients[client].cut[m] {
            return None;
        }
        let (keys, argv) = (&call.keys, &call.argv);
        let now = self.now + self.masters[m].offset;
        let r = self.masters[m].host.run(call.which, keys, argv, fcall, now);
        self.out.calls += 1;
        if self.step >= self.trace_from {
            let text = |v: &[Vec<u8>]| -> Vec<String> {
                v.iter()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .collect()
            };
            eprintln!(
                "checker trace: step {} master {m} clock {now} {} {:?} {:?} {:?} -> {r:?}",
                self.step,
                if fcall { "FCALL" } else { "EVALSHA" },
                call.which,
                text(keys),
                text(argv),
            );
        }
        if let Reply::Err(e) = &r {
            self.note(
                "error-reply",
                None,
                format!("{:?} on master {m} answered {e} to {argv:?}", call.which),
            );
        }
        if self.rng.chance(self.s.faults.lost_reply) {
            return Some(Err(()));
        }
        Some(Ok(r))
    }

    /// The lock key's value and expiry on master `m`.
    fn lock_state(&mut self, m: usize, name: usize) -> Option<(Vec<u8>, Option<i64>)> {
        let key = self.keys[name].lock.as_bytes().to_vec();
        let now = self.now + self.masters[m].offset;
        let mut sh = self.masters[m].host.shared.borrow_mut();
        sh.db.now_us = now;
        sh.db.peek(&key)?;
        sh.db.map.get(&key).map(|e| match &e.val {
            super::store::Val::Str(s) => (s.clone(), e.expire_ms),
            _ => (Vec::new(), e.expire_ms),
        })
    }

    /// Runs a release or renewal `call` of `acquisition` on `m`, checking that it leaves
    /// another acquisition's lock as it was.
    fn run_own(
        &mut self,
        m: usize,
        call: &Split,
        fcall: bool,
        client: usize,
        name: usize,
        acquisition: &str,
    ) -> Option<Result<Reply, ()>> {
        let before = self.lock_state(m, name);
        let r = self.run(m, call, fcall, client);
        let prefix = format!("{acquisition}|");
        if let Some((v, _)) = &before
            && !v.starts_with(prefix.as_bytes())
            && !v.starts_with(b"#")
        {
            let after = self.lock_state(m, name);
            if after.as_ref() != before.as_ref() {
                self.note(
                    "touched-another",
                    None,
                    format!(
                        "{:?} of `{acquisition}` on master {m} changed {:?} into {:?}",
                        call.which,
                        before.map(|b| String::from_utf8_lossy(&b.0).into_owned()),
                        after.map(|a| String::from_utf8_lossy(&a.0).into_owned())
                    ),
                );
            }
        }
        r
    }

    /// A grant of `token` for `name` to thread `t` (a hold from the server, or a hand-off):
    /// checks the token and exclusion, and records it.
    /// `from`: for a hand-off, the event counts at its hold's grant through the server.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        &mut self,
        t: usize,
        name: usize,
        token: u64,
        fcall: bool,
        owner: &str,
        how: &str,
        from: Option<&[usize]>,
    ) {
        self.out.grants += 1;
        let all: Vec<usize> = (0..self.s.masters).collect();
        let now = self.now;
        // Exclusion: nobody else knows it holds the name now.
        for u in 0..self.threads.len() {
            if u == t {
                continue;
            }
            let Some(h) = self.threads[u]
                .holds
                .iter()
                .find(|h| h.name == name)
                .cloned()
            else {
                continue;
            };
            if h.valid_until <= now {
                continue;
            }
            let mut events = self.since(&h.marks, &all);
            if let Some(from) = from {
                // A hand-off: the handing hold's lock may have been lost since its grant.
                events.extend(self.since(from, &all));
            }
            let excuse = events.iter().find(|e| match e {
                Event::Force(n) => *n == name,
                e => e.loses_lock(),
            });
            let excused = excuse.map(|e| match e {
                Event::Restart => "overlap after an empty restart",
                Event::Flush => "overlap after FLUSHALL",
                Event::Evict { .. } => "overlap after an eviction",
                Event::Failover => "overlap after a failover that lost writes",
                Event::StepForward => "overlap after a forward clock step",
                _ => "overlap after a force-unlock",
            });
            let detail = format!(
                "`{}` granted to {owner} ({how}, token {token}) while {} holds it (token {}) for {} µs more",
                self.keys[name].name,
                h.owner,
                h.token,
                h.valid_until - now
            );
            self.note("two-owners", excused, detail);
        }
        // Tokens strictly rise per name.
        if let Some(b) = self.best[name].clone()
            && token <= b.token
        {
            let on_masters = if self.single() { vec![0] } else { all.clone() };
            let events = self.since(&b.marks, &on_masters);
            let lost = events.iter().any(|e| e.loses_mark());
            let back = events.contains(&Event::StepBack);
            let state_new = events
                .iter()
                .any(|e| matches!(e, Event::Restart | Event::Reload | Event::Failover));
            // A hand-off of a hold whose lock a fault took from the server goes on with
            // its block's tokens: the resource refuses them (that holder is fenced).
            let stale = from.is_some_and(|f| {
                self.since(f, &all).iter().any(|e| match e {
                    Event::Force(n) => *n == name,
                    e => e.loses_lock(),
                })
            });
            let (kind, excused) = if stale {
                (
                    "token-back",
                    Some("a hand-off run of a hold lost to a fault (fenced)"),
                )
            } else if lost && (back || (self.single() && b.ahead > LATEST_LEAD)) {
                ("token-back", Some("a mark lost and a clock step back"))
            } else if self.single() {
                if lost && fcall && b.fcall && !state_new {
                    ("token-back-mark-lost-memory-ignored", None)
                } else if lost && !events.contains(&Event::Restart) {
                    (
                        "token-back",
                        Some("a mark lost at once (FLUSHALL, eviction) with no memory of it"),
                    )
                } else {
                    ("token-back", None)
                }
            } else {
                match &self.raised[name] {
                    Some((r, marks)) if token <= *r => {
                        let lost = self.since(marks, &all).iter().any(|e| e.loses_mark());
                        if lost {
                            (
                                "token-back",
                                Some("a quorum token raised, then a mark lost"),
                            )
                        } else {
                            ("token-back-quorum-inversion", None)
                        }
                    }
                    _ if lost => ("token-back", Some("a quorum mark lost")),
                    _ => (
                        "token-back",
                        Some("a quorum token never raised by a release or renewal"),
                    ),
                }
            };
            let detail = format!(
                "`{}`: {owner} got token {token} ({how}, {}) {} below token {} granted to {} {} µs before (step {}); events since: {events:?}",
                self.keys[name].name,
                if fcall { "FCALL" } else { "EVALSHA" },
                b.token - token,
                b.token,
                b.by,
                now - b.at,
                b.step,
            );
            self.note(kind, excused, detail);
        }
        // A raised token below this grant says nothing of later ones; after a regression the
        // checks start afresh (a new epoch).
        if self.raised[name].as_ref().is_some_and(|(r, _)| *r <= token)
            || self.best[name].as_ref().is_some_and(|b| token <= b.token)
        {
            self.raised[name] = None;
        }
        // Each grant is checked against the one before (after a regression, excused or not,
        // the checks go on from the new token, as a resource given a new epoch would).
        {
            let clock = self.now + self.masters[0].offset;
            // A hand-off's token was reserved at its hold's grant: what happened since then
            // is what may excuse a later token below it.
            let marks = from.map_or_else(|| self.marks(), <[usize]>::to_vec);
            self.best[name] = Some(Best {
                token,
                ahead: token as i64 - clock,
                at: now,
                step: self.step,
                marks,
                fcall,
                by: format!("{owner} ({how})"),
            });
        }
    }

    fn lease_us(&self, client: usize) -> i64 {
        self.clients[client].lease_ms as i64 * 1000
    }

    /// The local validity of a lease sent now: the lease less the drift allowance.
    fn validity(&self, client: usize) -> i64 {
        let lease = self.lease_us(client);
        self.now + lease - (lease / 100 + 2_000)
    }

    fn hold_index(&self, t: usize, name: usize) -> Option<usize> {
        self.threads[t].holds.iter().position(|h| h.name == name)
    }

    /// Acquire, or re-enter, `name` for thread `t`.
    fn acquire(&mut self, t: usize, name: usize) {
        let client = self.threads[t].client;
        let (fcall, block, lease_ms) = {
            let c = &self.clients[client];
            (c.fcall, c.block, c.lease_ms)
        };
        let live_hold = self
            .hold_index(t, name)
            .map(|i| self.threads[t].holds[i].clone());
        let request = self.request();
        // A re-entry names the hold's owner (a hold passed by hand-off keeps its first one).
        let owner = live_hold
            .as_ref()
            .map_or_else(|| self.threads[t].owner.clone(), |h| h.owner.clone());
        let keys = self.keys[name].clone();
        let live = live_hold.as_ref().map(|h| Live {
            acquisition: &h.acquisition,
            extend: Duration::from_millis(lease_ms),
        });
        let a = Acquire {
            owner: &owner,
            lease: Duration::from_millis(lease_ms),
            request: &request,
            live,
            block,
            waited: self.rng.chance(0.3),
            quorum: !self.single(),
        };
        let call = Split::from(&mutex::acquire(&keys, &a));
        let mut held = Vec::new();
        let mut maybe_ran = Vec::new();
        for m in 0..self.s.masters {
            let mut r = self.run(m, &call, fcall, client);
            if matches!(r, Some(Err(()))) {
                // The reply was lost: the client retries the very call (same request id).
                r = self.run(m, &call, fcall, client);
            }
            match r {
                Some(Ok(reply)) => match mutex::parse_acquire(&value(&reply), &a) {
                    Some(AcquireReply::Held {
                        token,
                        count,
                        acquisition,
                        last,
                    }) => held.push((m, token, count, acquisition, last)),
                    Some(AcquireReply::Foreign) => self.note(
                        "foreign",
                        None,
                        format!("acquire of `{}` answered foreign on master {m}", keys.name),
                    ),
                    Some(AcquireReply::Busy { .. }) => {}
                    None => self.note(
                        "bad-reply",
                        None,
                        format!("acquire answered {reply:?} on master {m}"),
                    ),
                },
                Some(Err(())) => maybe_ran.push(m),
                None => {}
            }
        }
        let winner = held
            .iter()
            .map(|h| h.3.clone())
            .find(|g| held.iter().filter(|h| &h.3 == g).count() >= self.quorum());
        let Some(acquisition) = winner else {
            if !self.single() {
                let undo: Vec<(usize, u64, String)> =
                    held.iter().map(|h| (h.0, h.1, h.3.clone())).collect();
                let unanswered = if live_hold.is_none() {
                    maybe_ran
                } else {
                    Vec::new()
                };
                self.undo(t, name, &request, &undo, &unanswered);
            }
            return;
        };
        let ours: Vec<_> = held
            .iter()
            .filter(|h| h.3 == acquisition)
            .cloned()
            .collect();
        let token = ours.iter().map(|h| h.1).max().unwrap_or(0);
        let count = ours.iter().map(|h| h.2).max().unwrap_or(1);
        let last = if self.single() { ours[0].4 } else { token };
        if !self.single() {
            let stray: Vec<(usize, u64, String)> = held
                .iter()
                .filter(|h| h.3 != acquisition)
                .map(|h| (h.0, h.1, h.3.clone()))
                .collect();
            self.undo(t, name, &request, &stray, &[]);
        }

        let valid_until = self.validity(client);
        match live_hold {
            Some(h) if h.acquisition == acquisition => {
                let i = self.hold_index(t, name).expect("held");
                let hold = &mut self.threads[t].holds[i];
                hold.count += 1;
                hold.valid_until = hold.valid_until.max(valid_until);
                let _ = count;
            }
            _ => {
                if let Some(i) = self.hold_index(t, name) {
                    // The server had lost the hold: this is a new acquisition.
                    self.threads[t].holds.remove(i);
                }
                self.granted(t, name, token, fcall, &owner, "acquire", None);
                let marks = self.marks();
                self.threads[t].holds.push(Hold {
                    name,
                    owner: owner.clone(),
                    acquisition,
                    token,
                    last,
                    count: 1,
                    valid_until,
                    passes: 0,
                    marks,
                });
            }
        }
    }

    /// A quorum acquire gives back what it does not keep (see `locks/mutex/acquire.rs`).
    fn undo(
        &mut self,
        t: usize,
        name: usize,
        request: &str,
        granted: &[(usize, u64, String)],
        unanswered: &[usize],
    ) {
        let client = self.threads[t].client;
        let fcall = self.clients[client].fcall;
        let keys = self.keys[name].clone();
        let mut jobs: Vec<(Vec<usize>, String, u64, Level)> = Vec::new();
        for (m, token, acquisition) in granted {
            let level = if acquisition == request {
                Level::Outermost
            } else {
                Level::Inner
            };
            match jobs
                .iter_mut()
                .find(|j| &j.1 == acquisition && j.3 == level)
            {
                Some(j) => {
                    j.0.push(*m);
                    j.2 = j.2.max(*token);
                }
                None => jobs.push((vec![*m], acquisition.clone(), *token, level)),
            }
        }
        if !unanswered.is_empty() {
            let token = granted.iter().map(|h| h.1).max().unwrap_or(0);
            jobs.push((
                unanswered.to_vec(),
                request.to_owned(),
                token,
                Level::Outermost,
            ));
        }
        for (targets, acquisition, token, level) in jobs {
            let rel = self.request();
            let call = Split::from(&mutex::release(
                &keys,
                &Release {
                    acquisition: &acquisition,
                    level,
                    request: &rel,
                    publish: Publish::Never,
                    fence: Some(token),
                },
                false,
            ));
            for m in targets {
                self.run_own(m, &call, fcall, client, name, &acquisition);
            }
        }
    }

    /// Releases one level of thread `t`'s hold on `name`, by local hand-off when it can.
    fn release(&mut self, t: usize, name: usize) {
        let Some(i) = self.hold_index(t, name) else {
            return;
        };
        let client = self.threads[t].client;
        let fcall = self.clients[client].fcall;
        let h = self.threads[t].holds[i].clone();
        let keys = self.keys[name].clone();
        // A local hand-off: to another thread of this client that waits for the name.
        if h.count == 1 && h.token < h.last && h.valid_until > self.now && self.rng.chance(0.6) {
            let others: Vec<usize> = (0..self.threads.len())
                .filter(|&u| {
                    u != t && self.threads[u].client == client && self.hold_index(u, name).is_none()
                })
                .collect();
            if !others.is_empty() {
                // One hand-off, or a burst of them at one instant (a hot process's empty
                // lock/unlock cycles run the tokens ahead of the clock).
                let burst = if self.rng.chance(0.2) {
                    1 + self.rng.below(600)
                } else {
                    1
                };
                let (mut from, mut hold) = (t, h.clone());
                self.threads[t].holds.remove(i);
                for _ in 0..burst {
                    if hold.token >= hold.last {
                        break;
                    }
                    let others: Vec<usize> = (0..self.threads.len())
                        .filter(|&u| {
                            u != from
                                && self.threads[u].client == client
                                && self.hold_index(u, name).is_none()
                        })
                        .collect();
                    if others.is_empty() {
                        break;
                    }
                    let u = self.rng.pick(&others);
                    // The handing thread takes a new owner id for its later acquisitions.
                    let th = &mut self.threads[from];
                    th.owners += 1;
                    th.owner = format!("c{}t{}o{}", client, from % self.s.threads, th.owners);
                    hold.token += 1;
                    hold.passes += 1;
                    // The hold keeps its owner on the server.
                    let marks = hold.marks.clone();
                    if self.step >= self.trace_from {
                        eprintln!(
                            "checker trace: step {} hand-off of `{}` ({}) to thread {u}: token {}",
                            self.step, self.keys[name].name, hold.acquisition, hold.token
                        );
                    }
                    self.granted(
                        u,
                        name,
                        hold.token,
                        fcall,
                        &hold.owner,
                        "hand-off",
                        Some(&marks),
                    );
                    from = u;
                }
                self.threads[from].holds.push(hold);
                return;
            }
        }
        let inner = h.count > 1;
        let rel = self.request();
        let single = self.single();
        let masters: Vec<usize> = if single {
            vec![0]
        } else {
            (0..self.s.masters).collect()
        };
        let make = |retry: bool| {
            Split::from(&mutex::release(
                &keys,
                &Release {
                    acquisition: &h.acquisition,
                    level: if inner {
                        Level::Inner
                    } else {
                        Level::Outermost
                    },
                    request: &rel,
                    publish: if single {
                        Publish::IfFlagged
                    } else {
                        Publish::Always
                    },
                    fence: (!single).then_some(h.token),
                },
                retry,
            ))
        };
        let first = make(false);
        let again = make(true);
        let mut raised = 0;
        let mut remaining = None;
        for m in masters {
            let mut r = self.run_own(m, &first, fcall, client, name, &h.acquisition);
            if matches!(r, Some(Err(()))) {
                r = self.run_own(m, &again, fcall, client, name, &h.acquisition);
            }
            if let Some(Ok(reply)) = r {
                match mutex::parse_release(&value(&reply)) {
                    Some(ReleaseReply::Released { remaining: 0, .. })
                    | Some(ReleaseReply::Missing) => {
                        raised += 1;
                        remaining.get_or_insert(0);
                    }
                    Some(ReleaseReply::Released { remaining: n, .. }) => {
                        remaining = Some(n);
                    }
                    Some(_) => {}
                    None => self.note(
                        "bad-reply",
                        None,
                        format!("release answered {reply:?} on master {m}"),
                    ),
                }
            }
        }
        if !self.single() && !inner && raised >= self.quorum() {
            self.raise(name, h.token);
        }
        let th = &mut self.threads[t];
        if inner && remaining.is_some_and(|n| n >= 1) {
            th.holds[i].count -= 1;
        } else {
            th.holds.remove(i);
        }
    }

    /// A release or renewal raised the marks of a quorum to `token`.
    fn raise(&mut self, name: usize, token: u64) {
        if self.raised[name].as_ref().is_none_or(|(r, _)| token > *r) {
            self.raised[name] = Some((token, self.marks()));
        }
    }

    /// Renews every hold of thread `t` (one call per master: `renew.lua` for one lease,
    /// `renew_batch.lua` for several).
    fn renew(&mut self, t: usize) {
        let holds = self.threads[t].holds.clone();
        if holds.is_empty() {
            return;
        }
        let client = self.threads[t].client;
        let fcall = self.clients[client].fcall;
        let lease = Duration::from_millis(self.clients[client].lease_ms);
        let quorum = !self.single();
        let keys: Vec<LockKeys> = holds.iter().map(|h| self.keys[h.name].clone()).collect();
        let leases: Vec<Renewing<'_>> = holds
            .iter()
            .zip(&keys)
            .map(|(h, k)| Renewing {
                keys: k,
                acquisition: &h.acquisition,
                lease,
                token: if quorum { h.token } else { 0 },
            })
            .collect();
        let call = Split::from(&mutex::renew_many(&leases));
        let mut ok = vec![0usize; holds.len()];
        for m in 0..self.s.masters {
            // The renewal's check: each other acquisition's lock left as it was.
            let before: Vec<_> = holds.iter().map(|h| self.lock_state(m, h.name)).collect();
            let r = self.run(m, &call, fcall, client);
            for (j, h) in holds.iter().enumerate() {
                if let Some((v, _)) = &before[j]
                    && !v.starts_with(format!("{}|", h.acquisition).as_bytes())
                {
                    let after = self.lock_state(m, h.name);
                    if after.as_ref() != before[j].as_ref() {
                        self.note(
                            "touched-another",
                            None,
                            format!(
                                "renewal of `{}` on master {m} changed another's lock",
                                h.acquisition
                            ),
                        );
                    }
                }
            }
            if let Some(Ok(reply)) = r {
                for (j, o) in scripts::parse_renews(&value(&reply), holds.len())
                    .into_iter()
                    .enumerate()
                {
                    if o == Some(true) {
                        ok[j] += 1;
                    }
                }
            }
        }
        let valid_until = self.validity(client);
        let need = self.quorum();
        for (j, h) in holds.iter().enumerate() {
            if ok[j] >= need {
                if quorum {
                    self.raise(h.name, h.token);
                }
                if let Some(i) = self.hold_index(t, h.name) {
                    self.threads[t].holds[i].valid_until = valid_until;
                }
            }
        }
    }

    /// An operator frees `name` by force on every master.
    fn force(&mut self, name: usize) {
        let (keys, argv) = split(&mutex::admin(&self.keys[name], Admin::Force));
        for m in 0..self.s.masters {
            let now = self.now + self.masters[m].offset;
            self.masters[m]
                .host
                .run(Which::MutexAdmin, &keys, &argv, false, now);
            self.out.calls += 1;
            self.event(m, Event::Force(name));
        }
    }

    /// One fault, perhaps.
    fn faults(&mut self) {
        let f = self.s.faults;
        let m = self.rng.below(self.s.masters as u64) as usize;
        if self.rng.chance(f.restart) {
            self.masters[m].host.restart().expect("restart");
            // A restart takes time: a few milliseconds at least.
            self.now += 3_000 + self.rng.below(50_000) as i64;
            self.event(m, Event::Restart);
        }
        if self.rng.chance(f.flush) {
            self.masters[m].host.shared.borrow_mut().db.map.clear();
            self.event(m, Event::Flush);
        }
        if self.rng.chance(f.evict) {
            let key = {
                let sh = self.masters[m].host.shared.borrow();
                let keys: Vec<&Vec<u8>> = sh.db.map.keys().collect();
                if keys.is_empty() {
                    None
                } else {
                    let mut ks: Vec<Vec<u8>> = keys.into_iter().cloned().collect();
                    ks.sort();
                    Some(ks[self.rng.below(ks.len() as u64) as usize].clone())
                }
            };
            if let Some(k) = key {
                let mark = k.ends_with(b":fence");
                self.masters[m].host.shared.borrow_mut().db.map.remove(&k);
                self.event(m, Event::Evict { mark });
            }
        }
        if self.rng.chance(f.reload) {
            self.masters[m].host.reload_functions().expect("reload");
            self.event(m, Event::Reload);
        }
        if self.rng.chance(0.02) {
            // The replica catches up now and then.
            let copy: BTreeMap<_, _> = {
                let sh = self.masters[m].host.shared.borrow();
                sh.db
                    .map
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            };
            self.masters[m].replica = copy;
        }
        if self.rng.chance(f.failover) {
            let keys = self.masters[m].replica.clone();
            self.masters[m].host.restart().expect("failover");
            self.masters[m].host.shared.borrow_mut().db.map = keys.into_iter().collect();
            self.now += 2_000 + self.rng.below(30_000) as i64;
            // The replica's clock is another host's.
            let delta = self.rng.below(4_001) as i64 - 2_000;
            self.masters[m].offset += delta;
            self.event(m, Event::Failover);
            if delta < 0 {
                self.event(m, Event::StepBack);
            }
        }
        if self.rng.chance(f.step_back) {
            let by = self
                .rng
                .pick(&[200, 800, 1_500, 20_000, 700_000, 2_000_000])
                .min(self.s.max_step_us);
            self.masters[m].offset -= by;
            self.event(m, Event::StepBack);
        }
        if self.rng.chance(f.step_forward) {
            let by = self
                .rng
                .pick(&[500, 5_000, 300_000, 2_000_000])
                .min(self.s.max_step_us);
            self.masters[m].offset += by;
            self.event(m, Event::StepForward);
        }
        if self.s.masters > 1 && self.rng.chance(f.partition) {
            let c = self.rng.below(self.s.clients as u64) as usize;
            self.clients[c].cut[m] = !self.clients[c].cut[m];
        }
        if self.rng.chance(f.force) {
            let n = self.rng.below(self.keys.len() as u64) as usize;
            self.force(n);
        }
    }

    /// One step: time moves, perhaps a fault, and one thread acts.
    pub(super) fn step(&mut self) {
        self.step += 1;
        // Mostly a few microseconds (busy slots: grants within a hand-off block and within
        // the library's reservation), now and then milliseconds, rarely a lease.
        self.now += match self.rng.below(1000) {
            0..=959 => self.rng.below(self.s.tick_us),
            960..=996 => self.rng.below(2_000),
            _ => self.rng.below(300_000),
        } as i64;
        self.faults();
        // A thread whose lease ran out locally drops the hold (its guard is lost).
        let now = self.now;
        for th in &mut self.threads {
            th.holds.retain(|h| h.valid_until > now);
        }
        let r = self.rng.below(100);
        let holders: Vec<(usize, usize)> = if r < 55 {
            self.threads
                .iter()
                .enumerate()
                .flat_map(|(t, th)| th.holds.iter().map(move |h| (t, h.name)))
                .collect()
        } else {
            Vec::new()
        };
        if !holders.is_empty() && r < 55 {
            let (t, name) = self.rng.pick(&holders);
            if r < 45 {
                self.release(t, name);
            } else {
                // A re-entry.
                self.acquire(t, name);
            }
            return;
        }
        let t = self.rng.below(self.threads.len() as u64) as usize;
        let name = self.rng.below(self.keys.len() as u64) as usize;
        if r < 75 {
            self.acquire(t, name);
        } else if r < 90 {
            // A hot client's empty critical section: lock, then unlock a moment later.
            let had = self.hold_index(t, name).is_some();
            self.acquire(t, name);
            if !had && self.hold_index(t, name).is_some() {
                self.now += self.rng.below(self.s.tick_us) as i64;
                self.release(t, name);
            }
        } else {
            self.renew(t);
        }
    }

    /// Runs until `steps` steps or `budget` passed (or the first finding when asked).
    pub(super) fn run_for(&mut self, steps: u64, budget: Duration) {
        self.started = Instant::now();
        let start_steps = self.step;
        while self.step - start_steps < steps {
            self.step();
            if self.stop_at_first && !self.out.findings.is_empty() {
                break;
            }
            if self.step.is_multiple_of(256) && self.started.elapsed() >= budget {
                break;
            }
        }
        self.out.steps = self.step;
        self.out.elapsed = self.started.elapsed();
    }
}
