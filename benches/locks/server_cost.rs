//! Server cost: Redis's own time per uncontended lock+unlock cycle, for every lock type, against
//! the naive lock's (`SET NX PX`, then a compare-and-delete script) measured in the same run on
//! the same server, and the cost of single parts of a script (one `redis.call` of each kind the
//! scripts make, the arguments, the script call itself).
//!
//! The workload starts a `redis-server` of its own (pinned like the main one), so that
//! `CONFIG RESETSTAT` before each measured phase disturbs no other workload. A phase is one
//! thread doing a fixed number of operations on one connection or one client; its figure is
//! the `usec` that `INFO commandstats` gives the commands the client sent (`EVALSHA`, and the
//! naive lock's `SET`), which includes what runs inside a script. Cycles alternate between the
//! lock types in rounds, so that load that comes and goes on the machine touches all of them.
//! The acquire/release split holds many names at once (a phase of acquires, then a phase of
//! releases; every name cycled once before, so that its keys exist, as in a cycle: the
//! `Mutex`'s release marker, the slot's fencing mark).
//!
//! Under callgrind (`benches/callgrind/server-cost.sh`), each `CONFIG RESETSTAT` makes
//! callgrind dump its counts (`--dump-before=configResetStatCommand`); a phase begins and ends
//! with one, and the workload prints the phases in order, so phase k's instructions are in
//! dump 2k.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use locksmith::Client;

use crate::context::{Ctx, NAIVE_LEASE};
use crate::naive::NaiveLock;
use crate::report::{Bar, Row, Unit};
use crate::support::{RedisServer, Stats, calls_by_command, connect, s, usec_by_command};

const W: &str = "server cost";

/// Permits of the semaphore measured.
const PERMITS: u32 = 4;

/// The lock types measured, the naive lock (the floor) first.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Naive,
    Mutex,
    Fair,
    Read,
    Write,
    Semaphore,
    Multi,
}

const KINDS: [Kind; 7] = [
    Kind::Naive,
    Kind::Mutex,
    Kind::Fair,
    Kind::Read,
    Kind::Write,
    Kind::Semaphore,
    Kind::Multi,
];

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Naive => "naive (SET NX PX + compare-and-delete)",
            Kind::Mutex => "Mutex",
            Kind::Fair => "FairMutex",
            Kind::Read => "RwLock read",
            Kind::Write => "RwLock write",
            Kind::Semaphore => "Semaphore (4 permits)",
            Kind::Multi => "MultiMutex (2 names)",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Naive => "naive",
            Kind::Mutex => "mutex",
            Kind::Fair => "fair",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Semaphore => "sem",
            Kind::Multi => "multi",
        }
    }
}

/// A lock of one kind on one name (two for `Multi`).
enum Lock {
    Naive(NaiveLock),
    /// A naive lock on a connection shared with other names (one connection for many names,
    /// as locksmith's pool).
    NaiveShared(Rc<RefCell<NaiveLock>>, String),
    Mutex(locksmith::Mutex),
    Fair(locksmith::FairMutex),
    Rw(locksmith::RwLock, bool),
    Semaphore(locksmith::Semaphore),
    Multi(locksmith::MultiMutex),
}

/// What a lock's acquire returned, to be released.
enum Held {
    Naive(String),
    Mutex(locksmith::MutexGuard),
    Fair(locksmith::FairMutexGuard),
    Read(locksmith::RwLockReadGuard),
    Write(locksmith::RwLockWriteGuard),
    Semaphore(locksmith::SemaphorePermit),
    Multi(locksmith::MultiGuard),
}

impl Lock {
    fn new(kind: Kind, client: &Client, url: &str, name: &str) -> Result<Lock, String> {
        Ok(match kind {
            Kind::Naive => Lock::Naive(NaiveLock::new(url, name, NAIVE_LEASE).map_err(s)?),
            Kind::Mutex => Lock::Mutex(client.mutex(name).map_err(s)?),
            Kind::Fair => Lock::Fair(client.fair_mutex(name).map_err(s)?),
            Kind::Read => Lock::Rw(client.rw_lock(name).map_err(s)?, false),
            Kind::Write => Lock::Rw(client.rw_lock(name).map_err(s)?, true),
            Kind::Semaphore => Lock::Semaphore(client.semaphore(name, PERMITS).map_err(s)?),
            Kind::Multi => Lock::Multi(
                client
                    .multi_lock([format!("{name}:a"), format!("{name}:b")])
                    .map_err(s)?,
            ),
        })
    }

    fn acquire(&mut self) -> Result<Held, String> {
        Ok(match self {
            Lock::Naive(l) => Held::Naive(l.try_acquire().map_err(s)?.ok_or("naive lock busy")?),
            Lock::NaiveShared(l, name) => {
                let mut l = l.borrow_mut();
                l.set_name(name);
                Held::Naive(l.try_acquire().map_err(s)?.ok_or("naive lock busy")?)
            }
            Lock::Mutex(l) => Held::Mutex(l.lock().map_err(s)?),
            Lock::Fair(l) => Held::Fair(l.lock().map_err(s)?),
            Lock::Rw(l, false) => Held::Read(l.read().map_err(s)?),
            Lock::Rw(l, true) => Held::Write(l.write().map_err(s)?),
            Lock::Semaphore(l) => Held::Semaphore(l.acquire().map_err(s)?),
            Lock::Multi(l) => Held::Multi(l.lock().map_err(s)?),
        })
    }

    fn release(&mut self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Lock::Naive(l), Held::Naive(t)) => {
                if !l.release(&t).map_err(s)? {
                    return Err("naive lock lost".into());
                }
            }
            (Lock::NaiveShared(l, name), Held::Naive(t)) => {
                let mut l = l.borrow_mut();
                l.set_name(name);
                if !l.release(&t).map_err(s)? {
                    return Err("naive lock lost".into());
                }
            }
            (_, Held::Naive(_)) => return Err("naive token for another lock".into()),
            (_, Held::Mutex(g)) => g.unlock().map_err(s)?,
            (_, Held::Fair(g)) => g.unlock().map_err(s)?,
            (_, Held::Read(g)) => g.unlock().map_err(s)?,
            (_, Held::Write(g)) => g.unlock().map_err(s)?,
            (_, Held::Semaphore(p)) => p.unlock().map_err(s)?,
            (_, Held::Multi(g)) => g.unlock().map_err(s)?,
        }
        Ok(())
    }

    fn cycle(&mut self) -> Result<(), String> {
        let h = self.acquire()?;
        self.release(h)
    }
}

/// What Redis counted in one phase.
#[derive(Default)]
struct Counted {
    usec: Stats,
    calls: Stats,
}

impl Counted {
    /// Adds another phase's counts.
    fn add(&mut self, o: &Counted) {
        for (k, v) in &o.usec {
            *self.usec.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.calls {
            *self.calls.entry(k.clone()).or_default() += v;
        }
    }

    /// Redis time of the commands a client sends in these phases: script calls and `SET`
    /// (the naive lock's; every other `SET` runs inside a script, and is inside its time).
    fn client_usec(&self, naive: bool) -> u64 {
        let mut names = vec![
            "evalsha",
            "evalsha_ro",
            "eval",
            "eval_ro",
            "fcall",
            "fcall_ro",
        ];
        if naive {
            names.push("set");
        }
        names
            .iter()
            .map(|n| self.usec.get(*n).copied().unwrap_or(0))
            .sum()
    }

    /// Calls per operation of every command but the harness's own, e.g. `evalsha 2, get 1`.
    fn per_op(&self, ops: usize) -> String {
        let mut v: Vec<_> = self
            .calls
            .iter()
            .filter(|(k, _)| !k.starts_with("config") && k.as_str() != "info")
            .collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|(k, n)| format!("{k} {}", fmt_per(**n as f64 / ops as f64)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn fmt_per(x: f64) -> String {
    if (x - x.round()).abs() < 0.01 {
        format!("{:.0}", x.round())
    } else {
        format!("{x:.2}")
    }
}

/// The phases of one run, in order (printed, so a callgrind dump can be matched to its phase).
struct Phases {
    admin: redis::Connection,
    n: usize,
}

impl Phases {
    /// Resets Redis's statistics, runs `f` (which does `ops` operations) and returns what Redis
    /// counted.
    fn run(
        &mut self,
        name: &str,
        ops: usize,
        f: impl FnOnce() -> Result<(), String>,
    ) -> Result<Counted, String> {
        self.n += 1;
        println!("    phase {}: {name}, {ops} operations", self.n);
        reset(&mut self.admin)?;
        f()?;
        let c = Counted {
            usec: usec_by_command(&mut self.admin),
            calls: calls_by_command(&mut self.admin),
        };
        // Another reset where the phase ends, so that under callgrind the work between phases
        // (making the next locks) falls in a dump of its own.
        reset(&mut self.admin)?;
        Ok(c)
    }
}

fn reset(con: &mut redis::Connection) -> Result<(), String> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(con)
        .map_err(s)
}

pub(crate) fn server_cost(ctx: &mut Ctx) -> Result<(), String> {
    let server = RedisServer::try_start(ctx.pinned.then_some(1))?;
    let url = server.url();
    println!("    redis-server pid {} for this workload", server.pid());
    let (cycles, rounds) = (ctx.plan.cost_cycles, ctx.plan.cost_rounds);
    let client = Client::open(&url).map_err(s)?;
    let mut phases = Phases {
        admin: connect(&url, Duration::from_secs(5)).map_err(s)?,
        n: 0,
    };
    {
        let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;
        crate::naive::load_scripts(&mut con).map_err(s)?;
    }
    let mut locks = Vec::new();
    for kind in KINDS {
        let mut l = Lock::new(kind, &client, &url, &format!("bench:cost:{}", kind.tag()))?;
        for _ in 0..200 {
            l.cycle()?;
        }
        locks.push((kind, l));
    }
    // Whole cycles, alternating between the kinds in rounds.
    let mut whole: Vec<Counted> = KINDS.iter().map(|_| Counted::default()).collect();
    for _ in 0..rounds {
        for (i, (kind, l)) in locks.iter_mut().enumerate() {
            let c = phases.run(&format!("{} cycles", kind.tag()), cycles, || {
                (0..cycles).try_for_each(|_| l.cycle())
            })?;
            whole[i].add(&c);
        }
    }
    drop(locks);
    // Acquire and release apart: many names held at once, in rounds as well.
    let mut many = Vec::new();
    let shared = Rc::new(RefCell::new(
        NaiveLock::new(&url, "bench:cost:naive", NAIVE_LEASE).map_err(s)?,
    ));
    for kind in KINDS {
        let mut ls = (0..cycles)
            .map(|j| {
                let name = format!("bench:cost:{}:{j}", kind.tag());
                match kind {
                    Kind::Naive => Ok(Lock::NaiveShared(Rc::clone(&shared), name)),
                    _ => Lock::new(kind, &client, &url, &name),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        for l in &mut ls {
            l.cycle()?;
        }
        many.push(ls);
    }
    let mut split: Vec<(Counted, Counted)> = KINDS
        .iter()
        .map(|_| (Counted::default(), Counted::default()))
        .collect();
    for _ in 0..rounds {
        for (i, ls) in many.iter_mut().enumerate() {
            let tag = KINDS[i].tag();
            let mut held = Vec::with_capacity(cycles);
            let a = phases.run(&format!("{tag} acquires"), cycles, || {
                for l in ls.iter_mut() {
                    held.push(l.acquire()?);
                }
                Ok(())
            })?;
            let r = phases.run(&format!("{tag} releases"), cycles, || {
                for (l, h) in ls.iter_mut().zip(held) {
                    l.release(h)?;
                }
                Ok(())
            })?;
            split[i].0.add(&a);
            split[i].1.add(&r);
        }
    }
    drop(many);
    drop(client);
    let parts = parts(&mut phases, &url, cycles, rounds)?;

    let total = (cycles * rounds) as f64;
    let per = |c: &Counted, kind: Kind, n: f64| c.client_usec(kind == Kind::Naive) as f64 / n;
    let floor = per(&whole[0], Kind::Naive, total);
    let floor_acq = split[0].0.usec.get("set").copied().unwrap_or(0) as f64 / total;
    let floor_rel = per(&split[0].1, Kind::Naive, total);
    let floor_name = "naive lock's cycle, same run";
    for (i, kind) in KINDS.iter().enumerate() {
        let v = per(&whole[i], *kind, total);
        let mut row = Row::new(
            W,
            &format!("{}: Redis time per lock+unlock cycle", kind.label()),
            v,
            Unit::Us,
        )
        .note(format!(
            "{} cycles in {rounds} rounds; one Redis core serves {:.0} cycles/s; per cycle: {}",
            cycles * rounds,
            1e6 / v,
            whole[i].per_op(cycles * rounds)
        ));
        if *kind != Kind::Naive {
            row = row.floor(floor_name, floor, Unit::Us);
        }
        if *kind == Kind::Mutex {
            row = row.bar(Bar::RatioAtMost(2.5));
        }
        ctx.row(row);
    }
    for (i, kind) in KINDS.iter().enumerate() {
        let (a, r) = &split[i];
        let (va, vr) = (per(a, *kind, total), per(r, *kind, total));
        let mut ra = Row::new(W, &format!("{}: acquire", kind.label()), va, Unit::Us).note(
            format!("{cycles} names held; per acquire: {}", a.per_op(cycles)),
        );
        let mut rr = Row::new(W, &format!("{}: release", kind.label()), vr, Unit::Us)
            .note(format!("per release: {}", r.per_op(cycles * rounds)));
        if *kind != Kind::Naive {
            ra = ra.floor("SET NX PX", floor_acq, Unit::Us);
            rr = rr.floor("compare-and-delete", floor_rel, Unit::Us);
        }
        ctx.row(ra);
        ctx.row(rr);
    }
    let call = parts.first().map_or(f64::NAN, |p| p.1);
    for (i, (name, v)) in parts.iter().enumerate() {
        let row = Row::new(W, &format!("part: {name}"), *v, Unit::Us);
        ctx.row(if i == 0 {
            row.note("EVALSHA of `return 1`, no keys, no arguments")
        } else {
            row.floor("script call", call, Unit::Us)
                .note("EVALSHA of a script making this call alone; the floor is `return 1`")
        });
    }
    ctx.notes.push(
        "Server cost: Redis time from INFO commandstats `usec` of what the client sent (EVALSHA, \
         and the naive lock's SET; a script's time includes the commands it runs), reset by \
         CONFIG RESETSTAT before each phase on a redis-server of the workload's own; one thread, \
         one name per lock type, uncontended."
            .to_owned(),
    );
    drop(server);
    Ok(())
}

/// A Redis function library with one function that returns 1 (a part: a function call
/// instead of `EVALSHA`).
const FUNCTION: &str = "#!lua name=bench_cost\n\
    redis.register_function('bench_cost_one', function(keys, args) return 1 end)";

/// The parts of a script, each timed as a script of its own (`EVALSHA` on one connection,
/// `n` calls): the script call itself, the acquire script's arguments, and one `redis.call` of
/// each kind the lock scripts make, and a Redis function call; `rounds` rounds of `n` calls of each. Returns (name, Redis
/// time per call).
fn parts(
    phases: &mut Phases,
    url: &str,
    n: usize,
    rounds: usize,
) -> Result<Vec<(String, f64)>, String> {
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    let key = "locksmith:{bench:cost:part}:lock";
    let fence = "locksmith:{bench:cost:part}:fence";
    let marker = "locksmith:{bench:cost:part}:released";
    let owner = "0f2c7a8e-5b1d-4c3e-9a7f-2d6b8e4c1a90:7";
    let req = "0f2c7a8e-5b1d-4c3e-9a7f-2d6b8e4c1a90:123456";
    // What the Mutex acquire sends: `REQ|OWNER|B` and the lease.
    let request = format!("AbCdEfGhIjKlMnOpQrStUv1f|{owner}|16");
    let acquire_args = [request.as_str(), "30000"];
    let (hash_args, string_args) = ([owner, req], [req]);
    redis::cmd("SET")
        .arg(fence)
        .arg("1700000000000000")
        .query::<()>(&mut con)
        .map_err(s)?;
    // (name, script, keys, arguments)
    let none: &[&str] = &[];
    let specs: Vec<(&str, &str, Vec<&str>, &[&str])> = vec![
        ("script call (EVALSHA `return 1`)", "return 1", vec![], none),
        (
            "1 key + 2 arguments of the Mutex acquire",
            "return 1",
            vec![key],
            &acquire_args,
        ),
        (
            "TYPE (missing key)",
            "return redis.call('type', KEYS[1])['ok']",
            vec![key],
            none,
        ),
        ("TIME", "return redis.call('time')[1]", vec![], none),
        (
            "GET fence counter",
            "return redis.call('get', KEYS[1])",
            vec![fence],
            none,
        ),
        (
            "SET fence counter PX",
            "return redis.call('set', KEYS[1], '1700000000000000', 'px', 86400000)",
            vec![fence],
            none,
        ),
        (
            "hash lock: DEL + 5-field HSET + PEXPIRE, then DEL",
            "redis.call('del', KEYS[1]) \
             redis.call('hset', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', \
             '1700000000000001', 'gen', ARGV[2], 'req', ARGV[2]) \
             redis.call('pexpire', KEYS[1], 30000) return redis.call('del', KEYS[1])",
            vec![key],
            &hash_args,
        ),
        (
            "string lock: SET NX PX, then DEL",
            "redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', 30000) \
             return redis.call('del', KEYS[1])",
            vec![key],
            &string_args,
        ),
        (
            "string lock: SET NX PX, then RENAME (a release to its marker)",
            "redis.call('set', KEYS[1], ARGV[1], 'nx', 'px', 30000) \
             return redis.call('rename', KEYS[1], KEYS[2])",
            vec![key, marker],
            &string_args,
        ),
        (
            "DEL (missing key)",
            "return redis.call('del', KEYS[1])",
            vec![key],
            none,
        ),
        (
            "PUBLISH, no subscriber",
            "return redis.call('publish', KEYS[1], 'released')",
            vec!["locksmith:{bench:cost:part}:released"],
            none,
        ),
        (
            "string.format of a token",
            "return string.format('%.0f', 1700000000000001)",
            vec![],
            none,
        ),
        (
            "INCR fence counter",
            "return redis.call('incr', KEYS[1])",
            vec![fence],
            none,
        ),
        ("function call (FCALL `return 1`)", FUNCTION, vec![], none),
        (
            "FCALL with 1 key + 2 arguments of the Mutex acquire",
            FUNCTION,
            vec![key],
            &acquire_args,
        ),
    ];
    let mut cmds = Vec::new();
    for (name, body, keys, args) in specs {
        let mut cmd = if body == FUNCTION {
            redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(body)
                .query::<String>(&mut con)
                .map_err(s)?;
            redis::cmd("FCALL").arg("bench_cost_one").clone()
        } else {
            let sha: String = redis::Script::new(body).load(&mut con).map_err(s)?;
            redis::cmd("EVALSHA").arg(sha).clone()
        };
        cmd.arg(keys.len()).arg(&keys).arg(args);
        for _ in 0..200 {
            cmd.query::<redis::Value>(&mut con).map_err(s)?;
        }
        cmds.push((name, cmd));
    }
    // In rounds, as the cycles.
    let mut usec = vec![0u64; cmds.len()];
    for _ in 0..rounds {
        for (i, (name, cmd)) in cmds.iter().enumerate() {
            let c = phases.run(&format!("part {name}"), n, || {
                (0..n).try_for_each(|_| cmd.query::<redis::Value>(&mut con).map(drop).map_err(s))
            })?;
            usec[i] += c.client_usec(false);
        }
    }
    Ok(cmds
        .iter()
        .zip(usec)
        .map(|((name, _), u)| ((*name).to_owned(), u as f64 / (n * rounds) as f64))
        .collect())
}
