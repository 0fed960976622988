//! Capacity: deduplicating saves at the limit of one Redis core. Child processes of many
//! threads each run save cycles on record names that are new (one in [`REPEAT_EVERY`] repeats
//! an earlier name of the thread): take the record's lock with `try_lock`, check a "saved"
//! marker (`GET`), save (`SET` of the marker, on the same server, standing in for the
//! database write) unless the check found it saved, release. Three kinds of cycle, side by
//! side on one `redis-server` of the workload's own (pinned like the main one):
//!
//! - `ls`: locksmith's `Mutex` (`client.mutex(name)`, `try_lock`, `unlock`), one client per
//!   process shared by its threads;
//! - `naive`: `SET NX PX` and a compare-and-delete script, one connection per thread;
//! - `bare`: two plain `SET`s in place of the lock and the release (the same round trips,
//!   the cheapest commands): the floor of a cycle.
//!
//! The children run on every CPU at idle priority (`taskset`, `chrt --idle 0`) when the bench
//! pins: they use what the Redis core leaves and never take it from Redis, so that Redis can
//! reach its limit on a 2-core machine.
//!
//! Each kind runs closed-loop (every thread as fast as it goes) to find the limit, then
//! open-loop at about 50 % and 90 % of that limit (each thread starts a cycle at fixed
//! intervals; a cycle's time runs from when it was due, so that queueing counts). Redis's CPU
//! over each window comes from `INFO cpu` (`used_cpu_user` + `used_cpu_sys`), the clients' from
//! `/proc/self/stat` of every child (utime + stime, what `getrusage` reports; and utime alone,
//! the clients' own code without the kernel's socket work). A cycle's
//! capacity per Redis core is cycles ÷ Redis CPU seconds: it holds whether or not the clients
//! kept Redis busy, and the Redis CPU share of the closed-loop window says how close to the
//! limit the run came.
//!
//! Then the same closed-loop runs (`ls` and `bare`) on a Redis Cluster of three masters (no
//! replicas), with the masters' CPU summed: on a 2-core machine the three masters share one
//! core, so this shows what routing over masters costs per cycle, not the scaling of masters
//! on hosts of their own.

use std::collections::BTreeMap;
use std::sync::mpsc::Receiver;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;
use locksmith_testkit::{RedisCluster, key_slot, process_cpu_ns, process_user_ns};

use crate::child::{ChildProc, arg, say};
use crate::context::{Ctx, NAIVE_LEASE, STEP};
use crate::naive::{self, NaiveLock};
use crate::report::{Row, Unit};
use crate::support::{RedisServer, connect, pin, redis_cpu_us, s};

const W: &str = "capacity";
/// One cycle in this many repeats an earlier name of its thread (whose check finds it saved).
const REPEAT_EVERY: u64 = 50;
/// The width of a latency histogram bucket: 2 %.
const BUCKET: f64 = 1.02;

/// The kinds of cycle, in the order they run, with the label of their rows.
const KINDS: [(&str, &str); 3] = [
    ("bare", "SET pairs"),
    ("naive", "naive lock"),
    ("ls", "Mutex"),
];

/// What one window of every child measured.
#[derive(Debug, Default)]
struct Window {
    cycles: u64,
    errors: u64,
    busy: u64,
    /// Seconds.
    wall: f64,
    /// Redis CPU over the window, µs (summed over the masters of a cluster).
    server_us: f64,
    /// The children's CPU over their runs, µs.
    client_us: f64,
    /// The user part of it (utime: the code of the process, not the kernel's work on its
    /// sockets), µs.
    client_user_us: f64,
    /// Latency histogram: bucket → count.
    hist: BTreeMap<i64, u64>,
    /// The rate asked for (cycles/s, all threads), 0: closed loop.
    asked: f64,
}

impl Window {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.wall
    }
    fn server_per_cycle(&self) -> f64 {
        self.server_us / self.cycles.max(1) as f64
    }
    fn client_per_cycle(&self) -> f64 {
        self.client_us / self.cycles.max(1) as f64
    }
    fn client_user_per_cycle(&self) -> f64 {
        self.client_user_us / self.cycles.max(1) as f64
    }
    /// Cycles per second of Redis CPU.
    fn per_core(&self) -> f64 {
        self.cycles as f64 / (self.server_us / 1e6)
    }
    /// Redis's CPU share of the window (1.0: one core busy all along).
    fn share(&self) -> f64 {
        self.server_us / 1e6 / self.wall
    }
    fn pct(&self, p: f64) -> f64 {
        let total: u64 = self.hist.values().sum();
        if total == 0 {
            return f64::NAN;
        }
        let rank = ((p * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&b, &c) in &self.hist {
            seen += c;
            if seen >= rank {
                return BUCKET.powf(b as f64 + 0.5);
            }
        }
        f64::NAN
    }
}

/// The servers a run drives: one, or a cluster's masters.
struct Target {
    /// What the children are given: a URL, or the seed URLs joined by `,`.
    spec: String,
    /// For a cluster: `start-end=url` per master, joined by `,` (empty: one server).
    slots: String,
    /// Connections that read each server's CPU.
    admin: Vec<redis::Connection>,
}

impl Target {
    fn cpu_us(&mut self) -> Result<f64, String> {
        let mut t = 0.0;
        for c in &mut self.admin {
            t += redis_cpu_us(c)?;
        }
        Ok(t)
    }
}

pub(crate) fn capacity(ctx: &mut Ctx) -> Result<(), String> {
    let server = RedisServer::try_start(ctx.pinned.then_some(1))?;
    let url = server.url();
    let mut admin = connect(&url, Duration::from_secs(5)).map_err(s)?;
    naive::load_scripts(&mut admin).map_err(s)?;
    let mut target = Target {
        spec: url.clone(),
        slots: String::new(),
        admin: vec![admin],
    };
    let (procs, threads, window) = (
        ctx.plan.capacity_procs,
        ctx.plan.capacity_threads,
        ctx.plan.capacity,
    );
    let ping = ctx.floors.ping_p50;
    let mut per_core: BTreeMap<&str, f64> = BTreeMap::new();
    let mut server_cost: BTreeMap<&str, f64> = BTreeMap::new();
    let mut client_cost: BTreeMap<&str, f64> = BTreeMap::new();
    let mut client_user: BTreeMap<&str, f64> = BTreeMap::new();
    let mut rows = Vec::new();
    for (kind, label) in KINDS {
        let mut children = spawn(&target, kind, procs, threads, ctx.pinned)?;
        let sat = run(&mut children, threads, &mut target, window, 0.0)?;
        let limit = sat.rate();
        let half = run(&mut children, threads, &mut target, window, limit * 0.5)?;
        let ninety = run(&mut children, threads, &mut target, window, limit * 0.9)?;
        drop(children);
        per_core.insert(kind, sat.per_core());
        server_cost.insert(kind, sat.server_per_cycle());
        client_cost.insert(kind, sat.client_per_cycle());
        client_user.insert(kind, sat.client_user_per_cycle());
        let vs_bare = |r: Row, m: &BTreeMap<&str, f64>, unit: Unit| match m.get("bare") {
            Some(&b) if kind != "bare" => r.floor("SET pairs, same run", b, unit),
            _ => r,
        };
        rows.push(
            Row::new(
                W,
                &format!("{label}: saves/s, closed loop"),
                limit,
                Unit::PerSec,
            )
            .note(format!(
                "{procs} processes x {threads} threads, {:.2} s window; {} cycles, {} errors, \
                     {} found busy; each cycle: {} a check (GET) and a save (SET) unless the \
                     check found the record saved (1 in {REPEAT_EVERY} names repeats)",
                sat.wall,
                sat.cycles,
                sat.errors,
                sat.busy,
                match kind {
                    "ls" => "client.mutex(name), try_lock, unlock around",
                    "naive" => "SET NX PX and the compare-and-delete EVALSHA around",
                    _ => "a SET before and a SET after",
                }
            )),
        );
        rows.push(
            Row::new(
                W,
                &format!("{label}: Redis CPU share, closed loop"),
                sat.share() * 100.0,
                Unit::Percent,
            )
            .note(
                "used_cpu_user+used_cpu_sys (INFO cpu) over the window ÷ the window: near 100 % \
                 is the limit of the one core Redis runs on; lower, the clients (at idle priority \
                 on every core) ran out first, and the per-core figure is Redis's CPU per \
                 cycle turned into a rate (pessimistic: an idle Redis wakes once per command)",
            ),
        );
        rows.push(vs_bare(
            Row::new(
                W,
                &format!("{label}: cycles/s per Redis core"),
                sat.per_core(),
                Unit::PerSec,
            )
            .note("closed-loop cycles ÷ Redis CPU seconds (INFO cpu) over the window"),
            &per_core,
            Unit::PerSec,
        ));
        rows.push(vs_bare(
            Row::new(
                W,
                &format!("{label}: Redis CPU per cycle"),
                sat.server_per_cycle(),
                Unit::Us,
            ),
            &server_cost,
            Unit::Us,
        ));
        rows.push(vs_bare(
            Row::new(
                W,
                &format!("{label}: client CPU per cycle"),
                sat.client_per_cycle(),
                Unit::Us,
            )
            .note("utime+stime of the child processes (/proc/self/stat) over their runs ÷ cycles"),
            &client_cost,
            Unit::Us,
        ));
        rows.push(vs_bare(
            Row::new(
                W,
                &format!("{label}: client user CPU per cycle"),
                sat.client_user_per_cycle(),
                Unit::Us,
            )
            .note(
                "utime alone of the child processes over their runs ÷ cycles: the clients' own \
                 code (the library's, the redis crate's parser), without the kernel's socket \
                 work, which is alike for every kind of cycle of the same round trips",
            ),
            &client_user,
            Unit::Us,
        ));
        for (w, at) in [(&half, 50), (&ninety, 90)] {
            let note = format!(
                "open loop: each of {} threads starts a cycle every {:.0} µs (asked {:.0}/s, \
                 ran {:.0}/s, Redis CPU share {:.0} %); a cycle's time runs from when it was due",
                procs * threads,
                (procs * threads) as f64 / w.asked * 1e6,
                w.asked,
                w.rate(),
                w.share() * 100.0
            );
            for p in [0.5, 0.99] {
                rows.push(
                    Row::new(
                        W,
                        &format!("{label}: cycle p{:.0} at {at} % of the limit", p * 100.0),
                        w.pct(p),
                        Unit::Us,
                    )
                    .floor("4 × PING p50", 4.0 * ping, Unit::Us)
                    .note(if p == 0.5 {
                        note.clone()
                    } else {
                        String::new()
                    }),
                );
            }
        }
    }
    drop(target);
    drop(server);

    // A cluster of three masters, on the core the single server had.
    let cluster = RedisCluster::start_with(3, 0);
    if ctx.pinned {
        for pid in cluster.pids() {
            pin(pid, 1);
        }
    }
    let shards = cluster.shards();
    let mut target = Target {
        spec: cluster.seed_urls().join(","),
        slots: shards
            .iter()
            .map(|sh| format!("{}-{}={}", sh.start, sh.end, cluster.url(sh.master)))
            .collect::<Vec<_>>()
            .join(","),
        admin: shards.iter().map(|sh| cluster.conn(sh.master)).collect(),
    };
    for (kind, label) in [("bare", "SET pairs"), ("ls", "Mutex")] {
        let mut children = spawn(&target, kind, procs, threads, ctx.pinned)?;
        let sat = run(&mut children, threads, &mut target, window, 0.0)?;
        drop(children);
        let one = per_core.get(kind).copied().unwrap_or(f64::NAN);
        rows.push(
            Row::new(
                W,
                &format!("3-master cluster, {label}: saves/s, closed loop"),
                sat.rate(),
                Unit::PerSec,
            )
            .note(format!(
                "{procs} processes x {threads} threads; {} cycles, {} errors; the masters' CPU \
                 share together {:.0} % (they share one core)",
                sat.cycles,
                sat.errors,
                sat.share() * 100.0
            )),
        );
        rows.push(
            Row::new(
                W,
                &format!("3-master cluster, {label}: cycles/s per Redis core"),
                sat.per_core(),
                Unit::PerSec,
            )
            .floor("one server, same run", one, Unit::PerSec)
            .note("cycles ÷ the three masters' CPU seconds (INFO cpu, summed)"),
        );
        rows.push(
            Row::new(
                W,
                &format!("3-master cluster, {label}: client CPU per cycle"),
                sat.client_per_cycle(),
                Unit::Us,
            )
            .floor(
                "one server, same run",
                client_cost.get(kind).copied().unwrap_or(f64::NAN),
                Unit::Us,
            ),
        );
    }
    drop(target);
    drop(cluster);
    for r in rows {
        ctx.row(r);
    }
    Ok(())
}

/// Starts `procs` children of `threads` threads each and waits until they are warm. With
/// `spread`, the children run on every CPU at idle priority (`taskset`, `chrt --idle`): they
/// use what the Redis core leaves, and never take it from Redis.
fn spawn(
    target: &Target,
    kind: &str,
    procs: usize,
    threads: usize,
    spread: bool,
) -> Result<Vec<ChildProc>, String> {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let wrapper: Vec<String> = if spread {
        [
            "taskset",
            "-c",
            &format!("0-{}", cpus - 1),
            "chrt",
            "--idle",
            "0",
        ]
        .map(str::to_owned)
        .to_vec()
    } else {
        Vec::new()
    };
    let children = (0..procs)
        .map(|i| {
            ChildProc::spawn_via(
                &format!("capacity-{kind}-{i}"),
                &wrapper,
                "capacity",
                &[
                    target.spec.clone(),
                    kind.to_owned(),
                    threads.to_string(),
                    format!("{kind}{i}"),
                    target.slots.clone(),
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for c in &children {
        c.expect("ready", Duration::from_secs(60))?;
    }
    Ok(children)
}

/// One window: every child's threads run cycles from a common start for `window`, closed loop
/// (`rate` 0) or at `rate` cycles/s all together.
fn run(
    children: &mut [ChildProc],
    threads: usize,
    target: &mut Target,
    window: Duration,
    rate: f64,
) -> Result<Window, String> {
    let threads = children.len() * threads;
    let period_us = if rate > 0.0 {
        (threads as f64 / rate * 1e6) as u64
    } else {
        0
    };
    let start = realtime_ns() + 300_000_000;
    let ms = window.as_millis();
    let line = format!("run {start} {ms} {period_us}");
    for c in children.iter_mut() {
        c.send(&line)?;
    }
    sleep_until_realtime(start);
    let c0 = target.cpu_us()?;
    let t0 = Instant::now();
    sleep_until_realtime(start + window.as_nanos() as u64);
    let c1 = target.cpu_us()?;
    let wall = t0.elapsed().as_secs_f64();
    let mut w = Window {
        wall,
        server_us: c1 - c0,
        asked: rate,
        ..Window::default()
    };
    for c in children.iter() {
        let done = c.expect("done", window + STEP)?;
        let f: Vec<f64> = done
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0.0);
        w.cycles += at(0) as u64;
        w.errors += at(1) as u64;
        w.busy += at(2) as u64;
        w.client_us += at(3);
        w.client_user_us += at(4);
        for pair in c.expect("hist", STEP)?.split_whitespace() {
            if let Some((b, n)) = pair.split_once(':')
                && let (Ok(b), Ok(n)) = (b.parse::<i64>(), n.parse::<u64>())
            {
                *w.hist.entry(b).or_default() += n;
            }
        }
    }
    if w.cycles == 0 {
        return Err("no cycle completed".into());
    }
    Ok(w)
}

/// CLOCK_REALTIME in ns: one clock for the parent and its children.
fn realtime_ns() -> u64 {
    u64::try_from(crate::support::realtime_ns()).unwrap_or(0)
}

fn sleep_until_realtime(ns: u64) {
    let now = realtime_ns();
    if ns > now {
        thread::sleep(Duration::from_nanos(ns - now));
    }
}

// ---------------------------------------------------------------------------------------------
// The child's side
// ---------------------------------------------------------------------------------------------

/// Connections by hash slot: a cluster's masters, or one server for every slot.
struct Route {
    /// (first slot, last slot, index into `conns`).
    ranges: Vec<(u16, u16, usize)>,
    conns: Vec<redis::Connection>,
}

impl Route {
    fn new(url: &str, slots: &str) -> Result<Route, String> {
        if slots.is_empty() {
            return Ok(Route {
                ranges: Vec::new(),
                conns: vec![connect(url, Duration::from_secs(5)).map_err(s)?],
            });
        }
        let mut r = Route {
            ranges: Vec::new(),
            conns: Vec::new(),
        };
        for part in slots.split(',') {
            let (range, u) = part.split_once('=').ok_or("bad slot map")?;
            let (a, b) = range.split_once('-').ok_or("bad slot range")?;
            r.ranges
                .push((a.parse().map_err(s)?, b.parse().map_err(s)?, r.conns.len()));
            r.conns.push(connect(u, Duration::from_secs(5)).map_err(s)?);
        }
        Ok(r)
    }

    /// The connection for keys whose hash tag is `tag`.
    fn conn(&mut self, tag: &str) -> &mut redis::Connection {
        let i = if self.ranges.is_empty() {
            0
        } else {
            let slot = key_slot(tag);
            self.ranges
                .iter()
                .find(|r| r.0 <= slot && slot <= r.1)
                .map_or(0, |r| r.2)
        };
        &mut self.conns[i]
    }
}

/// One thread's lock side.
enum Locker {
    Ls(Client),
    Naive(NaiveLock),
    /// The two plain SETs, routed by slot.
    Bare(Route),
}

/// One thread's tools: its lock side and the connection(s) for the check and the save.
struct Worker {
    locker: Locker,
    data: Route,
    /// Cycles so far (names are `rec:TAG:T:K`).
    k: u64,
    tag: String,
}

/// What one cycle did.
enum Outcome {
    Done,
    Busy,
}

impl Worker {
    fn name(&mut self) -> String {
        self.k += 1;
        let k = if self.k.is_multiple_of(REPEAT_EVERY) && self.k > REPEAT_EVERY {
            self.k - REPEAT_EVERY / 2
        } else {
            self.k
        };
        format!("rec:{}:{k}", self.tag)
    }

    /// The check and the save: `GET` of the marker, `SET` of it when not saved yet.
    fn check_and_save(data: &mut Route, name: &str) -> Result<(), String> {
        let key = format!("saved:{{{name}}}");
        let con = data.conn(name);
        let saved: Option<String> = redis::cmd("GET").arg(&key).query(con).map_err(s)?;
        if saved.is_none() {
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .query::<()>(con)
                .map_err(s)?;
        }
        Ok(())
    }

    fn cycle(&mut self) -> Result<Outcome, String> {
        let name = self.name();
        let data = &mut self.data;
        match &mut self.locker {
            Locker::Ls(client) => {
                let m = client.mutex(&name).map_err(s)?;
                let Some(g) = m.try_lock().map_err(s)? else {
                    return Ok(Outcome::Busy);
                };
                let r = Self::check_and_save(data, &name);
                g.unlock().map_err(s)?;
                r?;
            }
            Locker::Naive(l) => {
                l.set_name(&name);
                let Some(t) = l.try_acquire().map_err(s)? else {
                    return Ok(Outcome::Busy);
                };
                let r = Self::check_and_save(data, &name);
                if !l.release(&t).map_err(s)? {
                    return Err("naive lock lost before release".into());
                }
                r?;
            }
            Locker::Bare(route) => {
                let key = format!("bare:{{{name}}}");
                let con = route.conn(&name);
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .query::<()>(con)
                    .map_err(s)?;
                Self::check_and_save(data, &name)?;
                let con = route.conn(&name);
                redis::cmd("SET")
                    .arg(&key)
                    .arg(0)
                    .query::<()>(con)
                    .map_err(s)?;
            }
        }
        Ok(Outcome::Done)
    }
}

/// What one thread did in a run.
#[derive(Default)]
struct Tally {
    cycles: u64,
    errors: u64,
    busy: u64,
    hist: BTreeMap<i64, u64>,
}

fn bucket(us: f64) -> i64 {
    (us.max(1.0).ln() / BUCKET.ln()).floor() as i64
}

/// `capacity URL KIND THREADS TAG SLOTS`: builds the threads' tools, warms them up, says
/// `ready`; then for each `run START_NS MS PERIOD_US` runs every thread from realtime
/// `START_NS` for `MS` (a cycle every `PERIOD_US` per thread, 0: back to back) and says
/// `done CYCLES ERRORS BUSY CPU_US` and `hist BUCKET:COUNT...`.
pub(crate) fn child_capacity(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (spec, kind) = (arg(a, 0)?, arg(a, 1)?);
    let threads: usize = arg(a, 2)?.parse().map_err(s)?;
    let tag = arg(a, 3)?;
    let slots = a.get(4).map_or("", String::as_str);
    let first_url = spec.split(',').next().unwrap_or(spec);
    let client = if kind == "ls" {
        Some(if slots.is_empty() {
            Client::open(spec).map_err(s)?
        } else {
            Client::cluster(spec.split(',')).build().map_err(s)?
        })
    } else {
        None
    };
    let mut workers = (0..threads)
        .map(|t| -> Result<Worker, String> {
            let locker = match kind {
                "ls" => Locker::Ls(client.clone().ok_or("no client")?),
                "naive" => {
                    Locker::Naive(NaiveLock::new(first_url, "unused", NAIVE_LEASE).map_err(s)?)
                }
                "bare" => Locker::Bare(Route::new(first_url, slots)?),
                other => return Err(format!("unknown kind {other}")),
            };
            Ok(Worker {
                locker,
                data: Route::new(first_url, slots)?,
                k: 0,
                tag: format!("{tag}:{}:{t}", std::process::id()),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Warm up: every thread's connections and the scripts.
    for w in &mut workers {
        for _ in 0..20 {
            w.cycle()?;
        }
    }
    say("ready");
    while let Ok(line) = input.recv() {
        let f: Vec<u64> = line
            .strip_prefix("run ")
            .ok_or_else(|| format!("unexpected line {line}"))?
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let (start, ms, period) = (
            f.first().copied().unwrap_or(0),
            f.get(1).copied().unwrap_or(0),
            f.get(2).copied().unwrap_or(0),
        );
        let end = start + ms * 1_000_000;
        sleep_until_realtime(start.saturating_sub(20_000_000));
        let cpu0 = process_cpu_ns().unwrap_or(0);
        let user0 = process_user_ns().unwrap_or(0);
        let tallies: Vec<Tally> = thread::scope(|sc| {
            let hs: Vec<_> = workers
                .iter_mut()
                .enumerate()
                .map(|(i, w)| sc.spawn(move || work(w, start, end, period, i, threads)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let cpu1 = process_cpu_ns().unwrap_or(0);
        let user1 = process_user_ns().unwrap_or(0);
        let mut all = Tally::default();
        for t in tallies {
            all.cycles += t.cycles;
            all.errors += t.errors;
            all.busy += t.busy;
            for (b, n) in t.hist {
                *all.hist.entry(b).or_default() += n;
            }
        }
        say(&format!(
            "done {} {} {} {} {}",
            all.cycles,
            all.errors,
            all.busy,
            (cpu1.saturating_sub(cpu0)) as f64 / 1e3,
            (user1.saturating_sub(user0)) as f64 / 1e3
        ));
        say(&format!(
            "hist {}",
            all.hist
                .iter()
                .map(|(b, n)| format!("{b}:{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    Ok(())
}

/// One thread's run: cycles from realtime `start` until `end` (ns), back to back or one every
/// `period` µs (thread `i` of `n` offset by `i/n` of a period, so that the threads spread).
fn work(w: &mut Worker, start: u64, end: u64, period: u64, i: usize, n: usize) -> Tally {
    let mut t = Tally::default();
    sleep_until_realtime(start);
    let mut due = start + period * 1000 * i as u64 / n.max(1) as u64;
    loop {
        if period > 0 {
            sleep_until_realtime(due);
        }
        let began = if period > 0 { due } else { realtime_ns() };
        if began >= end {
            break;
        }
        match w.cycle() {
            Ok(Outcome::Done) => {
                t.cycles += 1;
                let us = realtime_ns().saturating_sub(began) as f64 / 1e3;
                *t.hist.entry(bucket(us)).or_default() += 1;
            }
            Ok(Outcome::Busy) => t.busy += 1,
            Err(e) => {
                t.errors += 1;
                if t.errors <= 3 {
                    eprintln!("capacity child: {e}");
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        due += period * 1000;
    }
    t
}
