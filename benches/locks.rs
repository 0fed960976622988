//! The `locks` benchmark: locksmith against its floors and against a naive polling lock.
//!
//! `cargo bench --bench locks` runs every workload (about 2.5 minutes on 2 cores, bounded by
//! 10); `cargo bench --bench locks -- --quick` runs them all with fewer samples (under a
//! minute). `--only a,b` runs some (`uncontended`, `handoff`, `contended`, `many`, `idle`,
//! `renewal`, `redlock`, `fair`, `rw`, `semaphore`; the floors always run). `--no-pin` leaves CPU placement to the
//! scheduler.
//!
//! The bench starts its own `redis-server` on a free port and, on a machine with two CPUs or
//! more, pins it to CPU 1 and itself (with its threads and child processes) to CPU 0, so that
//! every round trip wakes the other side as it would with Redis on another host. Unpinned, a
//! client and Redis sometimes share a CPU (PING 16 µs on a 2-vCPU VM) and sometimes not
//! (60 µs), and every ratio to the floor moves by up to 4x between runs.
//!
//! The `redlock` workload starts five more `redis-server`s (the RedLock masters), pinned to the
//! same CPU 1: on a 2-core machine the five masters share one core, so its figures are
//! pessimistic against five masters on five hosts.
//!
//! Output: one table on stdout, and the same under `target/locksmith-bench/`
//! (`results.{json,md}`, `-quick` for quick runs) plus `handoff.svg`, a CDF of handoff
//! latency (also written to `docs/handoff.svg` by a full run).
//!
//! Cross-process timing: the holder (this process) reads CLOCK_REALTIME just before
//! `unlock()`, the waiter (a child process re-running this executable with `--child ROLE`)
//! just after `lock()` returns; on one host both read the same clock. A pipe ping-pong checks
//! it: no one-way delay may come out negative, and the midpoint offset must be near zero. An
//! instrumented pass adds Redis's own timestamps (MONITOR, same clock) to split a handoff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fmt::Display;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Mutex as LockMutex, Redlock};

use support::child::{ChildProc, child_input, say};
use support::naive::{self, NaiveLock};
use support::report::{self, Bar, Row, Series, Unit};
use support::{
    LOG, LogTap, RedisServer, Rng, client_level, commandstats, connect, failedstats, micros,
    new_thread_named, numsub, pct, realtime_ns, rss_kib, sorted, stat, stats_brief, stats_delta,
    stats_total, tasks, thread_count, thread_cpu_ns, usecstats,
};

/// The naive lock's lease (locksmith's default lease, for a like-for-like comparison).
const NAIVE_LEASE: Duration = Duration::from_secs(30);
/// Threads per process in the multi-process workloads.
const THREADS: usize = 8;
/// A bound on any single step that talks to a child.
const STEP: Duration = Duration::from_secs(20);

fn s<E: Display>(e: E) -> String {
    e.to_string()
}

/// How much of everything to run.
#[derive(Debug, Clone)]
struct Plan {
    floor_samples: usize,
    uncontended: Duration,
    clock_samples: usize,
    handoff_ls: usize,
    handoff_naive: usize,
    pubsub_samples: usize,
    unpark_samples: usize,
    contended: Duration,
    many: Duration,
    idle_hold: Duration,
    idle_short_lease: bool,
    renew_locks: usize,
    renew_window: Duration,
    redlock_handoff: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                floor_samples: 2000,
                uncontended: Duration::from_millis(1500),
                clock_samples: 200,
                handoff_ls: 100,
                handoff_naive: 30,
                pubsub_samples: 100,
                unpark_samples: 200,
                contended: Duration::from_millis(2500),
                many: Duration::from_secs(1),
                idle_hold: Duration::from_secs(5),
                idle_short_lease: false,
                renew_locks: 2000,
                renew_window: Duration::from_secs(4),
                redlock_handoff: 80,
            }
        } else {
            Plan {
                floor_samples: 5000,
                uncontended: Duration::from_secs(5),
                clock_samples: 1000,
                handoff_ls: 500,
                handoff_naive: 500,
                pubsub_samples: 500,
                unpark_samples: 500,
                contended: Duration::from_secs(10),
                many: Duration::from_secs(3),
                idle_hold: Duration::from_secs(5),
                idle_short_lease: true,
                renew_locks: 10_000,
                renew_window: Duration::from_secs(10),
                redlock_handoff: 300,
            }
        }
    }
}

/// The floors, measured first.
#[derive(Debug, Clone, Copy)]
struct Floors {
    ping_p50: f64,
    evalsha_p50: f64,
    /// PING after 3 ms of idleness.
    idle_ping_p50: f64,
    /// Redis's execution time of EVALSHA `return 1` (mean, commandstats).
    evalsha_exec_us: f64,
}

struct Ctx {
    url: String,
    plan: Plan,
    floors: Floors,
    rows: Vec<Row>,
    notes: Vec<String>,
    /// Sorted handoff samples (µs): locksmith, naive.
    handoff: Option<(Vec<f64>, Vec<f64>)>,
    /// Sorted RedLock handoff samples (µs).
    redlock_handoff: Option<Vec<f64>>,
    /// redis-servers on CPU 1, the bench on CPU 0.
    pinned: bool,
    rng: Rng,
}

impl Ctx {
    fn row(&mut self, r: Row) {
        println!(
            "  {:<12} {:<52} {}",
            r.workload,
            r.figure,
            report::fmt_value(r.value, r.unit)
        );
        self.rows.push(r);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        LogTap::install();
        std::process::exit(child_main(&args[i + 1..]));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    LogTap::install();
    let started = Instant::now();
    let load_start = loadavg();
    // Redis on a CPU of its own, every client on the other: each round trip then wakes the
    // other side, as with Redis on another host. Left to the scheduler, a client and Redis
    // sometimes share a CPU (a 16 µs PING on this kind of VM) and sometimes not (60 µs),
    // which moves every ratio to the floor by up to 4x from one run to the next.
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let pinned =
        !args.iter().any(|a| a == "--no-pin") && cpus >= 2 && support::pin(std::process::id(), 0);
    let server = match RedisServer::start(pinned.then_some(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("locks bench: {e}");
            std::process::exit(1);
        }
    };
    let url = server.url();
    println!(
        "locksmith bench ({} run), redis {} at {url}, {}",
        if quick { "quick" } else { "full" },
        server.version(),
        if pinned {
            "redis on CPU 1, clients on CPU 0"
        } else {
            "not pinned"
        }
    );
    let plan = Plan::new(quick);
    let floors = match measure_floors(&url, plan.floor_samples) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("locks bench: floors: {e}");
            std::process::exit(1);
        }
    };
    let mut ctx = Ctx {
        url: url.clone(),
        plan,
        floors: floors.0,
        rows: floors.1,
        notes: Vec::new(),
        handoff: None,
        redlock_handoff: None,
        pinned,
        rng: Rng::new(),
    };
    type Workload = fn(&mut Ctx) -> Result<(), String>;
    let workloads: [(&str, Workload); 10] = [
        ("fair", |c| family_rows(c, support::family::fair)),
        ("rw", |c| family_rows(c, support::family::rw)),
        ("semaphore", |c| family_rows(c, support::family::semaphore)),
        ("uncontended", uncontended),
        ("handoff", handoff),
        ("contended", contended),
        ("many", many_names),
        ("idle", idle),
        ("renewal", renewal),
        ("redlock", redlock),
    ];
    for (name, f) in workloads {
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        println!("[{:>5.1}s] {name}", started.elapsed().as_secs_f64());
        let r = catch_unwind(AssertUnwindSafe(|| f(&mut ctx)))
            .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&p))));
        if let Err(e) = r {
            eprintln!("workload {name} failed: {e}");
            ctx.rows.push(
                Row::new(name, &format!("FAILED: {e}"), f64::NAN, Unit::Count)
                    .bar(Bar::Equals(0.0)),
            );
        }
    }
    // The floor again, to show how much the machine's load moved during the run.
    if let Ok((f, _)) = measure_floors(&url, ctx.plan.floor_samples / 2) {
        ctx.rows.push(
            Row::new(
                "floor",
                "PING p50 again, at the end of the run",
                f.ping_p50,
                Unit::Us,
            )
            .floor("PING p50 at start", ctx.floors.ping_p50, Unit::Us),
        );
    }
    let elapsed = started.elapsed();
    let load_end = loadavg();
    let warnings = LOG.warnings.load(Ordering::Relaxed);
    let meta: Vec<(String, String)> = vec![
        ("mode".into(), if quick { "quick" } else { "full" }.into()),
        ("redis".into(), server.version()),
        ("cpus".into(), cpus.to_string()),
        (
            "CPU placement".into(),
            if pinned {
                "redis-server pinned to CPU 1 (the 5 RedLock masters too, sharing that one core); the bench, its threads and its child processes to CPU 0 (taskset)".into()
            } else {
                "not pinned (left to the scheduler)".into()
            },
        ),
        ("run time".into(), format!("{:.1} s", elapsed.as_secs_f64())),
        (
            "load average (1/5/15 min) at start / end".into(),
            format!("{load_start} / {load_end}"),
        ),
        (
            "finished at (unix time)".into(),
            (realtime_ns() / 1_000_000_000).to_string(),
        ),
        (
            "library warnings logged in the bench process".into(),
            warnings.to_string(),
        ),
    ];
    let mut notes = vec![
        "Floors are medians of PING and of EVALSHA of `return 1` on one plain connection to the \
         same redis-server, after 1000 warm-up calls, measured first (and PING again at the end)."
            .to_owned(),
        "Naive lock: SET key token NX PX 30000; on failure sleep 100 ms and retry; release by a \
         compare-and-delete script (EVALSHA). No renewal, except the hand-written per-lock one in \
         the renewal workload."
            .to_owned(),
        "Cross-process handoff timing: the holder reads CLOCK_REALTIME (SystemTime) just before \
         unlock(), the waiter in another process just after lock() returns; both processes \
         read the same kernel clock. The clock-check rows validate this with a pipe ping-pong."
            .to_owned(),
        "Redis command counts come from INFO commandstats deltas (the harness's own INFO and \
         PUBSUB calls excluded). Commands run inside scripts are counted there too; \
         'client-sent' counts only what clients send (EVALSHA, SUBSCRIBE, UNSUBSCRIBE, PING, \
         connection set-up, and the naive lock's SET NX attempts)."
            .to_owned(),
    ];
    notes.append(&mut ctx.notes);
    println!();
    print!("{}", report::table(&ctx.rows));
    let met = ctx.rows.iter().filter(|r| r.pass() == Some(true)).count();
    let missed = ctx.rows.iter().filter(|r| r.pass() == Some(false)).count();
    println!(
        "\nbars met: {met}, missed: {missed}; run time {:.1} s",
        elapsed.as_secs_f64()
    );
    write_outputs(&ctx, &meta, &notes, quick);
    drop(server);
}

/// Runs one of the other lock types' workloads (`benches/support/family.rs`).
fn family_rows(
    ctx: &mut Ctx,
    f: fn(&str, f64, usize) -> Result<Vec<Row>, String>,
) -> Result<(), String> {
    let samples = ctx.plan.handoff_ls;
    for r in f(&ctx.url.clone(), ctx.floors.ping_p50, samples)? {
        ctx.row(r);
    }
    Ok(())
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "?".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("locksmith-bench")
}

fn write_outputs(ctx: &Ctx, meta: &[(String, String)], notes: &[String], quick: bool) {
    let dir = out_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return;
    }
    let suffix = if quick { "-quick" } else { "" };
    let title = format!(
        "locksmith benchmark ({} run)",
        if quick { "quick" } else { "full" }
    );
    let files = [
        (
            format!("results{suffix}.json"),
            report::json(meta, &ctx.rows, notes),
        ),
        (
            format!("results{suffix}.md"),
            report::markdown(&title, meta, &ctx.rows, notes),
        ),
    ];
    for (name, text) in files {
        let p = dir.join(name);
        match std::fs::write(&p, text) {
            Ok(()) => println!("wrote {}", p.display()),
            Err(e) => eprintln!("cannot write {}: {e}", p.display()),
        }
    }
    if let Some((ls, nv)) = &ctx.handoff {
        let mut series = vec![
            Series {
                label: format!(
                    "locksmith (pub/sub wake-up): p50 {}, p99 {}",
                    report::fmt_value(pct(ls, 0.5), Unit::Us),
                    report::fmt_value(pct(ls, 0.99), Unit::Us)
                ),
                color: "#1f77b4",
                sorted_us: ls,
            },
            Series {
                label: format!(
                    "naive lock (100 ms polling): p50 {}, p99 {}",
                    report::fmt_value(pct(nv, 0.5), Unit::Us),
                    report::fmt_value(pct(nv, 0.99), Unit::Us)
                ),
                color: "#ff7f0e",
                sorted_us: nv,
            },
        ];
        if let Some(rl) = &ctx.redlock_handoff {
            series.push(Series {
                label: format!(
                    "RedLock, 5 masters on one core (pub/sub wake-up): p50 {}, p99 {}",
                    report::fmt_value(pct(rl, 0.5), Unit::Us),
                    report::fmt_value(pct(rl, 0.99), Unit::Us)
                ),
                color: "#2ca02c",
                sorted_us: rl,
            });
        }
        let counts = series
            .iter()
            .map(|s| s.sorted_us.len().to_string())
            .collect::<Vec<_>>()
            .join(" + ");
        let ping = ctx.floors.ping_p50;
        let guides = [
            (
                format!("PING p50 {}", report::fmt_value(ping, Unit::Us)),
                ping,
            ),
            ("bar: p50 ≤ 6 × PING".to_owned(), 6.0 * ping),
            ("bar: p99 ≤ 20 × PING".to_owned(), 20.0 * ping),
        ];
        let svg = report::cdf_svg(
            &format!("Lock handoff latency across processes (CDF, {counts} samples)"),
            &series,
            &guides,
        );
        let mut paths = vec![dir.join(format!("handoff{suffix}.svg"))];
        if !quick {
            paths.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/handoff.svg"));
        }
        for p in paths {
            if let Some(parent) = p.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::write(&p, &svg) {
                Ok(()) => println!("wrote {}", p.display()),
                Err(e) => eprintln!("cannot write {}: {e}", p.display()),
            }
        }
    }
}

// =============================================================================================
// Floors
// =============================================================================================

fn measure_floors(url: &str, n: usize) -> Result<(Floors, Vec<Row>), String> {
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    naive::load_scripts(&mut con).map_err(s)?;
    let sha = redis::Script::new("return 1").load(&mut con).map_err(s)?;
    let ping = |con: &mut redis::Connection| redis::cmd("PING").query::<String>(con);
    let eval =
        |con: &mut redis::Connection| redis::cmd("EVALSHA").arg(&sha).arg(0).query::<i64>(con);
    for _ in 0..1000 {
        ping(&mut con).map_err(s)?;
        eval(&mut con).map_err(s)?;
    }
    let (c0, u0) = (commandstats(&mut con), usecstats(&mut con));
    let (mut p, mut e) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        ping(&mut con).map_err(s)?;
        p.push(micros(t.elapsed()));
        let t = Instant::now();
        eval(&mut con).map_err(s)?;
        e.push(micros(t.elapsed()));
    }
    let (c1, u1) = (commandstats(&mut con), usecstats(&mut con));
    let exec = stat(&stats_delta(&u0, &u1), "evalsha") as f64
        / stat(&stats_delta(&c0, &c1), "evalsha").max(1) as f64;
    // PING after 3 ms of idleness, as most lock operations in real programs start.
    let mut cold = Vec::with_capacity(n / 20);
    for _ in 0..n / 20 {
        thread::sleep(Duration::from_millis(3));
        let t = Instant::now();
        ping(&mut con).map_err(s)?;
        cold.push(micros(t.elapsed()));
    }
    let cold = sorted(cold);
    let (p, e) = (sorted(p), sorted(e));
    let floors = Floors {
        ping_p50: pct(&p, 0.5),
        evalsha_p50: pct(&e, 0.5),
        idle_ping_p50: pct(&cold, 0.5),
        evalsha_exec_us: exec,
    };
    let rows = vec![
        Row::new("floor", "PING round trip p50", floors.ping_p50, Unit::Us)
            .note(format!("{n} samples")),
        Row::new("floor", "PING round trip p99", pct(&p, 0.99), Unit::Us),
        Row::new(
            "floor",
            "EVALSHA `return 1` round trip p50",
            floors.evalsha_p50,
            Unit::Us,
        ),
        Row::new(
            "floor",
            "EVALSHA `return 1` round trip p99",
            pct(&e, 0.99),
            Unit::Us,
        ),
        Row::new(
            "floor",
            "PING after 3 ms idle p50",
            pct(&cold, 0.5),
            Unit::Us,
        )
        .floor("PING p50", floors.ping_p50, Unit::Us)
        .note(format!(
            "{} samples; the CPUs may have gone idle in between, as before a handoff",
            cold.len()
        )),
    ];
    Ok((floors, rows))
}

// =============================================================================================
// Uncontended cycle
// =============================================================================================

fn uncontended(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "uncontended";
    const CAP: usize = 400_000;
    let client = Client::open(&ctx.url).map_err(s)?;
    let m = client.mutex("bench:uncontended").map_err(s)?;
    let mut nl = NaiveLock::new(&ctx.url, "bench:uncontended", NAIVE_LEASE).map_err(s)?;
    let mut fcon = connect(&ctx.url, Duration::from_secs(5)).map_err(s)?;
    let sha = redis::Script::new("return 1").load(&mut fcon).map_err(s)?;
    let ls_cycle = || -> Result<(), String> { m.lock().map_err(s)?.unlock().map_err(s) };
    let nv_cycle = |nl: &mut NaiveLock| -> Result<(), String> {
        let tok = nl.try_acquire().map_err(s)?.ok_or("naive lock busy")?;
        nl.release(&tok).map_err(s)?;
        Ok(())
    };
    let evalsha = |con: &mut redis::Connection| {
        redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(0)
            .query::<i64>(con)
            .map_err(s)
    };
    for _ in 0..500 {
        ls_cycle()?;
        nv_cycle(&mut nl)?;
        evalsha(&mut fcon)?;
    }
    // Sample buffers written once beforehand, so that filling them does not count as growth.
    let (mut ls, mut nv, mut ev) = (vec![1.0; CAP], vec![1.0; CAP], vec![1.0; CAP / 4]);
    ls.clear();
    nv.clear();
    ev.clear();
    // Interleaved 100 ms slices of locksmith, naive and the EVALSHA floor, so that a burst of
    // load from elsewhere on the machine hits all three alike.
    let slice = Duration::from_millis(100);
    let (mut ls_time, mut nv_time) = (Duration::ZERO, Duration::ZERO);
    let rss0 = rss_kib();
    let mut ls_rss = 0i64;
    while ls_time < ctx.plan.uncontended && ls.len() < CAP - 20_000 {
        let r = rss_kib();
        let t0 = Instant::now();
        while t0.elapsed() < slice {
            let t = Instant::now();
            ls_cycle()?;
            ls.push(micros(t.elapsed()));
        }
        ls_time += t0.elapsed();
        if let (Some(a), Some(b)) = (r, rss_kib()) {
            ls_rss += b as i64 - a as i64;
        }
        let t0 = Instant::now();
        while t0.elapsed() < slice {
            let t = Instant::now();
            nv_cycle(&mut nl)?;
            nv.push(micros(t.elapsed()));
        }
        nv_time += t0.elapsed();
        for _ in 0..200 {
            let t = Instant::now();
            evalsha(&mut fcon)?;
            ev.push(micros(t.elapsed()));
        }
    }
    let rss1 = rss_kib();
    let (n_ls, n_nv) = (ls.len(), nv.len());
    let ls_elapsed = ls_time.as_secs_f64();
    let nv_elapsed = nv_time.as_secs_f64();
    let (ls, nv, ev) = (sorted(ls), sorted(nv), sorted(ev));
    let floor = 2.0 * pct(&ev, 0.5);
    drop(m);
    drop(client);

    let fl = "2 × EVALSHA p50, interleaved";
    ctx.row(
        Row::new(W, "locksmith lock+unlock p50", pct(&ls, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .bar(Bar::RatioAtMost(1.25))
            .note(format!(
                "{n_ls} cycles, one thread, one name, in 100 ms slices alternating with the naive \
                 lock and {} EVALSHA floor samples; against the floor measured first: {:.2}",
                ev.len(),
                pct(&ls, 0.5) / (2.0 * ctx.floors.evalsha_p50)
            )),
    );
    ctx.row(
        Row::new(W, "locksmith lock+unlock p99", pct(&ls, 0.99), Unit::Us).floor(
            fl,
            floor,
            Unit::Us,
        ),
    );
    ctx.row(Row::new(
        W,
        "locksmith cycles/s",
        n_ls as f64 / ls_elapsed,
        Unit::PerSec,
    ));
    ctx.row(
        Row::new(W, "naive lock+unlock p50", pct(&nv, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .note(format!(
                "{n_nv} cycles: SET NX PX + compare-and-delete EVALSHA"
            )),
    );
    ctx.row(
        Row::new(W, "naive lock+unlock p99", pct(&nv, 0.99), Unit::Us).floor(fl, floor, Unit::Us),
    );
    ctx.row(Row::new(
        W,
        "naive cycles/s",
        n_nv as f64 / nv_elapsed,
        Unit::PerSec,
    ));
    if let (Some(a), Some(b)) = (rss0, rss1) {
        ctx.row(
            Row::new(
                W,
                "process RSS growth during the locksmith slices (KiB)",
                ls_rss as f64,
                Unit::Count,
            )
            .note(format!(
                "{:.0} bytes per locksmith cycle (whole run: {} KiB): a released hold stays in \
                 the renewal thread's wheel until its renewal slot (10 s after the acquire with \
                 the default lease)",
                ls_rss as f64 * 1024.0 / n_ls.max(1) as f64,
                b as i64 - a as i64
            )),
        );
    }
    Ok(())
}

// =============================================================================================
// Handoff latency
// =============================================================================================

fn handoff(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "handoff";
    let name = "bench:handoff";
    let channel = format!("locksmith:{{{name}}}:released");
    let url = ctx.url.clone();
    let ping = ctx.floors.ping_p50;
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;

    // --- The clock check: pipe ping-pong with the waiter child. ---
    let mut child = ChildProc::spawn(
        "handoff-waiter-ls",
        "handoff-waiter",
        &[url.clone(), name.into(), "ls".into()],
    )?;
    child.expect("ready", STEP)?;
    let (mut rtts, mut offsets, mut negatives) = (Vec::new(), Vec::new(), 0usize);
    for i in 0..ctx.plan.clock_samples + 20 {
        let t0 = realtime_ns();
        child.send("clock")?;
        let t1: i64 = child.expect("clock", STEP)?.parse().map_err(s)?;
        let t2 = realtime_ns();
        if i < 20 {
            continue;
        }
        if t1 < t0 || t2 < t1 {
            negatives += 1;
        }
        rtts.push((t2 - t0) as f64 / 1e3);
        offsets.push((t1 as f64 - (t0 as f64 + t2 as f64) / 2.0) / 1e3);
    }
    let rtts = sorted(rtts);
    let offsets = sorted(offsets);

    // --- locksmith handoffs; then a smaller instrumented pass (a second, raw subscriber in
    // the waiter's process timestamps the release message). ---
    let client = Client::open(&url).map_err(s)?;
    let m = client.mutex(name).map_err(s)?;
    let (calls0, usec0) = (commandstats(&mut con), usecstats(&mut con));
    let plain = ls_handoffs(
        &mut ctx.rng,
        &mut child,
        &m,
        &mut con,
        &channel,
        ctx.plan.handoff_ls,
        None,
    )?;
    let (calls1, usec1) = (commandstats(&mut con), usecstats(&mut con));
    let script_us = stat(&stats_delta(&usec0, &usec1), "evalsha") as f64
        / stat(&stats_delta(&calls0, &calls1), "evalsha").max(1) as f64;
    let mut monitor = Monitor::open(&url)?;
    let spied = ls_handoffs(
        &mut ctx.rng,
        &mut child,
        &m,
        &mut con,
        &channel,
        (ctx.plan.handoff_ls * 2 / 5).max(40),
        Some(&mut monitor),
    )?;
    drop(monitor);
    drop(child);
    drop(m);
    drop(client);
    let ls = sorted(plain.total.clone());
    let release_rtt = sorted(plain.release_rtt.clone());
    let unverified = plain.unverified + spied.unverified;
    let seg = |k: usize| sorted(spied.split.iter().map(|p| p[k]).collect());
    let segs = [seg(0), seg(1), seg(2), seg(3)];
    let spied_total = sorted(spied.total.clone());

    // --- naive handoffs. ---
    let mut child = ChildProc::spawn(
        "handoff-waiter-naive",
        "handoff-waiter",
        &[url.clone(), name.into(), "naive".into()],
    )?;
    child.expect("ready", STEP)?;
    let mut nl = NaiveLock::new(&url, name, NAIVE_LEASE).map_err(s)?;
    let mut nv = Vec::new();
    for _ in 0..ctx.plan.handoff_naive {
        let tok = nl
            .acquire_until(Instant::now() + Duration::from_secs(5), || {})
            .map_err(s)?
            .ok_or("naive holder could not lock")?;
        child.send("go")?;
        child.expect("waiting", STEP)?;
        // Release at a random phase of the waiter's 100 ms sleep.
        let hold = ctx.rng.duration(Duration::ZERO, naive::RETRY);
        thread::sleep(hold);
        let t0 = realtime_ns();
        nl.release(&tok).map_err(s)?;
        let t1: i64 = child.expect("got", STEP)?.parse().map_err(s)?;
        nv.push((t1 - t0) as f64 / 1e3);
    }
    drop(child);
    let nv = sorted(nv);

    // --- Decomposition: PUBLISH to a subscriber in another process, and a thread wake-up. ---
    let pub_channel = "bench:oneway";
    let listener = ChildProc::spawn(
        "pubsub-listener",
        "pubsub-listener",
        &[url.clone(), pub_channel.into()],
    )?;
    listener.expect("ready", STEP)?;
    let mut oneway = Vec::new();
    for i in 0..ctx.plan.pubsub_samples + 20 {
        let t0 = realtime_ns();
        redis::cmd("PUBLISH")
            .arg(pub_channel)
            .arg(t0.to_string())
            .query::<i64>(&mut con)
            .map_err(s)?;
        let rest = listener.expect("msg", STEP)?;
        let (a, b) = rest.split_once(' ').ok_or("bad msg line")?;
        let (a, b): (i64, i64) = (a.parse().map_err(s)?, b.parse().map_err(s)?);
        if a == t0 && i >= 20 {
            oneway.push((b - a) as f64 / 1e3);
        }
        thread::sleep(Duration::from_millis(1));
    }
    drop(listener);
    let oneway = sorted(oneway);
    let unpark = sorted(unpark_latency(ctx.plan.unpark_samples)?);

    let fl = "PING p50";
    ctx.row(
        Row::new(
            W,
            "clock check: pipe round trip p50",
            pct(&rtts, 0.5),
            Unit::Us,
        )
        .note(format!("{} ping-pongs parent ↔ child", rtts.len())),
    );
    ctx.row(
        Row::new(
            W,
            "clock check: child − parent midpoint offset p50",
            pct(&offsets, 0.5),
            Unit::Us,
        )
        .note(format!(
            "p1 {:.1} µs, p99 {:.1} µs; near zero: one clock",
            pct(&offsets, 0.01),
            pct(&offsets, 0.99)
        )),
    );
    ctx.row(
        Row::new(
            W,
            "clock check: negative one-way delays",
            negatives as f64,
            Unit::Count,
        )
        .bar(Bar::Equals(0.0)),
    );
    ctx.row(
        Row::new(W, "locksmith handoff p50", pct(&ls, 0.5), Unit::Us)
            .floor(fl, ping, Unit::Us)
            .bar(Bar::RatioAtMost(6.0))
            .note(format!(
                "{} samples; holder in this process, waiter blocked in lock() in a child; \
                 {unverified} samples where the waiter was not seen blocked within 2 s",
                ls.len()
            )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith handoff p50, against PING after idle",
            pct(&ls, 0.5),
            Unit::Us,
        )
        .floor(
            "PING after 3 ms idle p50",
            ctx.floors.idle_ping_p50,
            Unit::Us,
        )
        .note("every hop of a handoff starts on CPUs that were idle while the lock was held"),
    );
    ctx.row(
        Row::new(W, "locksmith handoff p90", pct(&ls, 0.9), Unit::Us).floor(fl, ping, Unit::Us),
    );
    ctx.row(
        Row::new(W, "locksmith handoff p99", pct(&ls, 0.99), Unit::Us)
            .floor(fl, ping, Unit::Us)
            .bar(Bar::RatioAtMost(20.0)),
    );
    ctx.row(
        Row::new(W, "locksmith handoff max", pct(&ls, 1.0), Unit::Us).floor(fl, ping, Unit::Us),
    );
    ctx.row(
        Row::new(W, "naive handoff p50", pct(&nv, 0.5), Unit::Us)
            .floor(fl, ping, Unit::Us)
            .note(format!(
                "{} samples, released at a random point of the waiter's 100 ms sleep",
                nv.len()
            )),
    );
    ctx.row(Row::new(W, "naive handoff p99", pct(&nv, 0.99), Unit::Us).floor(fl, ping, Unit::Us));
    ctx.row(Row::new(W, "naive handoff max", pct(&nv, 1.0), Unit::Us).floor(fl, ping, Unit::Us));
    let seg_names = [
        "split: unlock() called → Redis starts the release script",
        "split: release script start → its PUBLISH",
        "split: PUBLISH → Redis starts the waiter's acquire script",
        "split: acquire script start → waiter's lock() returns",
    ];
    let seg_notes = [
        format!(
            "instrumented pass with MONITOR (Redis's timestamps, same clock), {} samples, \
             handoff p50 in that pass {:.0} µs; segment medians do not add up exactly",
            segs[0].len(),
            pct(&spied_total, 0.5)
        ),
        "script work before the publish (type, hmget, hincrby, del, get/set of the fence)"
            .to_owned(),
        "reply and message written, the waiter's subscriber thread wakes, unparks the leader, \
         which sends the acquire script"
            .to_owned(),
        "acquire script, reply, the leader wakes, records the hold, returns".to_owned(),
    ];
    for ((name, note), v) in seg_names.iter().zip(seg_notes).zip(&segs) {
        ctx.row(
            Row::new(W, name, pct(v, 0.5), Unit::Us)
                .floor(fl, ping, Unit::Us)
                .note(note),
        );
    }
    ctx.row(
        Row::new(
            W,
            "part: Redis execution time per locksmith script call (mean)",
            script_us,
            Unit::Us,
        )
        .floor("EVALSHA `return 1`", ctx.floors.evalsha_exec_us, Unit::Us)
        .note("commandstats usec / calls of EVALSHA during the uninstrumented handoffs (acquire attempts and releases)"),
    );
    let pubp = pct(&oneway, 0.5);
    let unp = pct(&unpark, 0.5);
    let ev = ctx.floors.evalsha_p50;
    ctx.row(
        Row::new(
            W,
            "part: release script round trip (holder) p50",
            pct(&release_rtt, 0.5),
            Unit::Us,
        )
        .floor(fl, ping, Unit::Us),
    );
    ctx.row(
        Row::new(
            W,
            "part: PUBLISH → raw subscriber in another process p50",
            pubp,
            Unit::Us,
        )
        .floor(fl, ping, Unit::Us)
        .note(format!(
            "{} samples, redis-rs PubSub in a child, p99 {:.1} µs",
            oneway.len(),
            pct(&oneway, 0.99)
        )),
    );
    ctx.row(
        Row::new(W, "part: thread unpark → running p50", unp, Unit::Us)
            .note(format!("in-process, p99 {:.1} µs", pct(&unpark, 0.99))),
    );
    ctx.row(
        Row::new(
            W,
            "part: sum publish + unpark + EVALSHA floor + 2 script runs",
            pubp + unp + ev + 2.0 * script_us,
            Unit::Us,
        )
        .floor("locksmith handoff p50", pct(&ls, 0.5), Unit::Us)
        .note("the path: release script publishes → subscriber thread reads → unparks the leader → acquire script round trip"),
    );
    ctx.handoff = Some((ls, nv));
    Ok(())
}

/// What a run of locksmith handoffs measured (µs).
struct Handoffs {
    total: Vec<f64>,
    release_rtt: Vec<f64>,
    /// With MONITOR: unlock → release dispatched → PUBLISH → acquire dispatched → return.
    split: Vec<[f64; 4]>,
    unverified: usize,
}

/// `n` handoffs (after 5 unrecorded ones) from a holder here to the waiter `child`.
fn ls_handoffs(
    rng: &mut Rng,
    child: &mut ChildProc,
    m: &LockMutex,
    con: &mut redis::Connection,
    channel: &str,
    n: usize,
    mut monitor: Option<&mut Monitor>,
) -> Result<Handoffs, String> {
    let mut out = Handoffs {
        total: Vec::with_capacity(n),
        release_rtt: Vec::with_capacity(n),
        split: Vec::new(),
        unverified: 0,
    };
    let warm = 5;
    for i in 0..warm + n {
        let g = m
            .try_lock_for(Duration::from_secs(10))
            .map_err(s)?
            .ok_or("holder could not lock")?;
        let ev0 = stat(&commandstats(con), "evalsha");
        child.send("go")?;
        // The waiter is blocked once it subscribed and made its two attempts (the fast path
        // and the one after the subscription was confirmed).
        let until = Instant::now() + Duration::from_secs(2);
        let mut verified = false;
        while Instant::now() < until {
            if numsub(con, channel) >= 1 && stat(&commandstats(con), "evalsha") >= ev0 + 2 {
                verified = true;
                break;
            }
            thread::sleep(Duration::from_micros(200));
        }
        // Time for it to read the busy reply and park; then hold a little, at random.
        thread::sleep(rng.duration(Duration::from_millis(2), Duration::from_millis(6)));
        let t0 = realtime_ns();
        let r0 = Instant::now();
        g.unlock().map_err(s)?;
        let rel = micros(r0.elapsed());
        let got = child.expect("got", STEP)?;
        let t1: i64 = got
            .parse()
            .map_err(|e| format!("bad line `got {got}`: {e}"))?;
        let marks = match monitor.as_deref_mut() {
            Some(mon) => mon.handoff_marks(t0, channel)?,
            None => None,
        };
        if i >= warm {
            out.unverified += usize::from(!verified);
            out.total.push((t1 - t0) as f64 / 1e3);
            out.release_rtt.push(rel);
            if let Some([rel_at, pub_at, acq_at]) = marks {
                let us = |a: i64, b: i64| (b - a) as f64 / 1e3;
                out.split.push([
                    us(t0, rel_at),
                    us(rel_at, pub_at),
                    us(pub_at, acq_at),
                    us(acq_at, t1),
                ]);
            }
        }
    }
    Ok(out)
}

/// A `MONITOR` connection, read only between samples (so it wakes nobody during one).
struct Monitor {
    reader: BufReader<TcpStream>,
}

impl Monitor {
    fn open(url: &str) -> Result<Monitor, String> {
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let mut stream = TcpStream::connect(&addr).map_err(s)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(s)?;
        stream.write_all(b"MONITOR\r\n").map_err(s)?;
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).map_err(s)?;
        if !ok.starts_with("+OK") {
            return Err(format!("MONITOR answered {ok:?}"));
        }
        Ok(Monitor { reader })
    }

    /// Redis's timestamps (ns, CLOCK_REALTIME) of one handoff after `t0`: the holder's release
    /// script dispatched, its PUBLISH on `channel`, the waiter's acquire script dispatched.
    fn handoff_marks(&mut self, t0: i64, channel: &str) -> Result<Option<[i64; 3]>, String> {
        let lock_key = channel.replace(":released", ":lock");
        let (mut rel, mut publ) = (None, None);
        let until = Instant::now() + Duration::from_secs(2);
        let mut line = String::new();
        while Instant::now() < until {
            line.clear();
            if self.reader.read_line(&mut line).is_err() {
                return Ok(None);
            }
            // +1763781420.123456 [0 127.0.0.1:5555] "EVALSHA" "..." ...
            let Some((ts, rest)) = line.trim_start_matches('+').split_once(' ') else {
                continue;
            };
            let Some((sec, usec)) = ts.split_once('.') else {
                continue;
            };
            let (Ok(sec), Ok(usec)) = (sec.parse::<i64>(), usec.parse::<i64>()) else {
                continue;
            };
            let at = sec * 1_000_000_000 + usec * 1000;
            if at < t0 {
                continue;
            }
            let lower = rest.to_ascii_lowercase();
            let evalsha = lower.contains("\"evalsha\"") && rest.contains(&lock_key);
            let names_channel = rest.contains(&format!("\"{channel}\""));
            match (rel, publ) {
                (None, _) if evalsha && names_channel => rel = Some(at),
                (Some(_), None) if lower.contains("\"publish\"") && names_channel => {
                    publ = Some(at);
                }
                (Some(r), Some(p)) if evalsha && !names_channel => return Ok(Some([r, p, at])),
                _ => {}
            }
        }
        Ok(None)
    }
}

/// Time from `unpark()` to the parked thread running, in µs.
fn unpark_latency(n: usize) -> Result<Vec<f64>, String> {
    let flag = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<Instant>();
    let f2 = Arc::clone(&flag);
    let h = thread::Builder::new()
        .name("bench-parked".into())
        .spawn(move || {
            for k in 1..=n as u64 + 10 {
                while f2.load(Ordering::SeqCst) < k {
                    thread::park_timeout(Duration::from_secs(1));
                }
                if tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        })
        .map_err(s)?;
    let mut out = Vec::with_capacity(n);
    for k in 1..=n as u64 + 10 {
        thread::sleep(Duration::from_millis(1));
        let t0 = Instant::now();
        flag.store(k, Ordering::SeqCst);
        h.thread().unpark();
        let t1 = rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| "parked thread did not wake")?;
        if k > 10 {
            out.push(micros(t1 - t0));
        }
    }
    let _ = h.join();
    Ok(out)
}

// =============================================================================================
// Contended throughput
// =============================================================================================

fn contended(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "contended";
    let url = ctx.url.clone();
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;
    for kind in ["ls", "naive"] {
        let label = if kind == "ls" { "locksmith" } else { "naive" };
        let name = format!("bench:contended:{kind}");
        let counter = format!("bench:counter:{kind}");
        let children = (0..2)
            .map(|i| {
                ChildProc::spawn(
                    &format!("contend-{kind}-{i}"),
                    "contend",
                    &[
                        url.clone(),
                        name.clone(),
                        kind.into(),
                        THREADS.to_string(),
                        counter.clone(),
                    ],
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        for c in &children {
            c.expect("ready", Duration::from_secs(60))?;
        }
        redis::cmd("SET")
            .arg(&counter)
            .arg(0)
            .query::<()>(&mut con)
            .map_err(s)?;
        let s0 = commandstats(&mut con);
        let run_ms = ctx.plan.contended.as_millis();
        let mut children = children;
        for c in &mut children {
            c.send(&format!("go {run_ms}"))?;
        }
        let (mut count, mut errors, mut elapsed) = (0u64, 0u64, 0f64);
        let (mut waits, mut censored, mut per_proc) = (Vec::new(), Vec::new(), Vec::new());
        for c in &children {
            let done = c.expect("done", ctx.plan.contended + Duration::from_secs(60))?;
            let f: Vec<u64> = done
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            count += f.first().copied().unwrap_or(0);
            errors += f.get(1).copied().unwrap_or(0);
            elapsed = elapsed.max(f.get(2).copied().unwrap_or(0) as f64 / 1e6);
            per_proc.push(f.first().copied().unwrap_or(0));
            waits.extend(parse_list(&c.expect("waits", STEP)?));
            censored.extend(parse_list(&c.expect("censored", STEP)?));
        }
        let s1 = commandstats(&mut con);
        drop(children);
        let value: i64 = redis::cmd("GET")
            .arg(&counter)
            .query::<Option<i64>>(&mut con)
            .map_err(s)?
            .unwrap_or(0);
        let d = stats_delta(&s0, &s1);
        let n = count.max(1) as f64;
        // Client-sent, without the critical section's own GET and SET (N each). The naive
        // lock's SET NX attempts are the SETs beyond the critical section's.
        let client_sent = client_level(&d) as f64
            + if kind == "naive" {
                stat(&d, "set") as f64 - count as f64
            } else {
                0.0
            };
        let total = stats_total(&d) as f64 - 2.0 * count as f64;
        let waits = sorted(waits);
        let longest = waits
            .last()
            .copied()
            .unwrap_or(0.0)
            .max(censored.iter().copied().fold(0.0, f64::max));
        let med = pct(&waits, 0.5);
        let is_ls = kind == "ls";
        let with_bar = |r: Row, b: Bar| if is_ls { r.bar(b) } else { r };
        ctx.row(
            Row::new(W, &format!("{label} acquisitions/s"), count as f64 / elapsed.max(1e-9), Unit::PerSec)
                .note(format!(
                    "2 processes × {THREADS} threads, one name, {:.1} s; per process {per_proc:?}; {errors} errors",
                    elapsed
                )),
        );
        ctx.row(with_bar(
            Row::new(
                W,
                &format!("{label} client-sent commands per acquisition"),
                client_sent / n,
                Unit::Num,
            )
            .note(format!("commandstats delta: {}", stats_brief(&d))),
            Bar::AtMost(4.0),
        ));
        ctx.row(Row::new(
            W,
            &format!("{label} commands per acquisition incl. inside scripts"),
            total / n,
            Unit::Num,
        ));
        ctx.row(
            Row::new(
                W,
                &format!("{label} lost updates"),
                count as f64 - value as f64,
                Unit::Count,
            )
            .bar(Bar::Equals(0.0))
            .note(format!("counter {value}, acquisitions {count}")),
        );
        ctx.row(with_bar(
            Row::new(
                W,
                &format!("{label} longest wait (incl. unfinished)"),
                longest,
                Unit::Us,
            )
            .floor("median wait", med, Unit::Us)
            .note(format!(
                "wait = lock() call to return; p99 {:.0} µs; {} waits unfinished at the end",
                pct(&waits, 0.99),
                censored.len()
            )),
            Bar::RatioAtMost(50.0),
        ));
    }
    Ok(())
}

fn parse_list(s: &str) -> Vec<f64> {
    s.split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect()
}

// =============================================================================================
// Many names
// =============================================================================================

fn many_names(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "many names";
    let d = ctx.plan.many;
    let client = Client::open(&ctx.url).map_err(s)?;
    let one = ls_cycles(&client, 1, d)?;
    let eight = ls_cycles(&client, THREADS, d)?;
    drop(client);
    let n_one = naive_cycles(&ctx.url, 1, d)?;
    let n_eight = naive_cycles(&ctx.url, THREADS, d)?;
    ctx.row(Row::new(
        W,
        "locksmith 1 thread, 1 name: cycles/s",
        one,
        Unit::PerSec,
    ));
    ctx.row(
        Row::new(
            W,
            "locksmith 8 threads, 8 names: cycles/s",
            eight,
            Unit::PerSec,
        )
        .floor("1 thread", one, Unit::PerSec)
        .bar(Bar::RatioAtLeast(1.8))
        .note("one client shared by the threads; uncontended lock+unlock cycles"),
    );
    ctx.row(Row::new(
        W,
        "naive 1 thread, 1 name: cycles/s",
        n_one,
        Unit::PerSec,
    ));
    ctx.row(
        Row::new(
            W,
            "naive 8 threads, 8 names: cycles/s",
            n_eight,
            Unit::PerSec,
        )
        .floor("1 thread", n_one, Unit::PerSec)
        .note("one connection per thread"),
    );
    Ok(())
}

/// Cycles per second of `threads` threads, each locking and unlocking its own name.
fn ls_cycles(client: &Client, threads: usize, d: Duration) -> Result<f64, String> {
    let cycle = |m: &mut locksmith::Mutex| -> Result<(), String> {
        m.lock().map_err(s)?.unlock().map_err(s)
    };
    cycles_per_sec(
        threads,
        d,
        |i| {
            let mut m = client
                .mutex(&format!("bench:many:{threads}:{i}"))
                .map_err(s)?;
            for _ in 0..100 {
                cycle(&mut m)?;
            }
            Ok(m)
        },
        cycle,
    )
}

/// The same for the naive lock, one connection per thread.
fn naive_cycles(url: &str, threads: usize, d: Duration) -> Result<f64, String> {
    cycles_per_sec(
        threads,
        d,
        |i| NaiveLock::new(url, &format!("bench:many:{threads}:{i}"), NAIVE_LEASE).map_err(s),
        |lk: &mut NaiveLock| {
            let t = lk.try_acquire().map_err(s)?.ok_or("naive lock busy")?;
            lk.release(&t).map(drop).map_err(s)
        },
    )
}

/// Runs `cycle` on `threads` threads for `d`, each on the state its `setup` made (set-up and
/// warm-up happen before a barrier, outside the timed window), and returns cycles per second.
fn cycles_per_sec<S>(
    threads: usize,
    d: Duration,
    setup: impl Fn(usize) -> Result<S, String> + Sync,
    cycle: impl Fn(&mut S) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    let barrier = Barrier::new(threads);
    let results: Vec<Result<u64, String>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (barrier, setup, cycle) = (&barrier, &setup, &cycle);
                sc.spawn(move || -> Result<u64, String> {
                    let state = setup(i);
                    barrier.wait();
                    let mut state = state?;
                    let end = Instant::now() + d;
                    let mut n = 0;
                    while Instant::now() < end {
                        cycle(&mut state)?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok(total as f64 / d.as_secs_f64())
}

// =============================================================================================
// Idle waiting
// =============================================================================================

fn idle(ctx: &mut Ctx) -> Result<(), String> {
    let mut variants = vec![("ls", Some(Duration::from_secs(30))), ("naive", None)];
    if ctx.plan.idle_short_lease {
        variants.push(("ls", Some(Duration::from_secs(3))));
    }
    for (kind, lease) in variants {
        idle_one(ctx, kind, lease)?;
    }
    Ok(())
}

fn idle_one(ctx: &mut Ctx, kind: &str, lease: Option<Duration>) -> Result<(), String> {
    const W: &str = "idle waiting";
    let url = ctx.url.clone();
    let hold = ctx.plan.idle_hold;
    let label = match lease {
        Some(l) if l != Duration::from_secs(30) => format!("locksmith ({} s lease)", l.as_secs()),
        Some(_) => "locksmith".to_owned(),
        None => "naive".to_owned(),
    };
    let name = format!("bench:idle:{kind}:{}", lease.map_or(0, |l| l.as_secs()));
    let channel = format!("locksmith:{{{name}}}:released");
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;
    let timeout_ms = (hold + Duration::from_secs(20)).as_millis().to_string();
    let mut children = (0..2)
        .map(|i| {
            ChildProc::spawn(
                &format!("idle-{kind}-{i}"),
                "idle-wait",
                &[
                    url.clone(),
                    name.clone(),
                    kind.into(),
                    THREADS.to_string(),
                    timeout_ms.clone(),
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for c in &children {
        c.expect("ready", STEP)?;
    }
    // The holder.
    let holder_client = match lease {
        Some(l) => Some(Client::builder(&url).lease(l).build().map_err(s)?),
        None => None,
    };
    let holder_mutex = match &holder_client {
        Some(c) => Some(c.mutex(&name).map_err(s)?),
        None => None,
    };
    let mut naive_holder = NaiveLock::new(&url, &name, NAIVE_LEASE).map_err(s)?;
    LOG.trace_renewals(true);
    let t_hold = Instant::now();
    let (guard, token) = match &holder_mutex {
        Some(m) => (Some(m.lock().map_err(s)?), None),
        None => (
            None,
            Some(naive_holder.try_acquire().map_err(s)?.ok_or("naive busy")?),
        ),
    };
    for c in &mut children {
        c.send("go")?;
    }
    for c in &children {
        c.expect("started", STEP)?;
    }
    if holder_mutex.is_some() {
        let until = Instant::now() + Duration::from_secs(5);
        while numsub(&mut con, &channel) < 2 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
    }
    thread::sleep(Duration::from_millis(500));
    let s0 = commandstats(&mut con);
    let f0 = failedstats(&mut con);
    let (_, renewed0) = LOG.batches();
    let t0 = Instant::now();
    let end = t_hold + hold;
    if end > Instant::now() {
        thread::sleep(end - Instant::now());
    }
    let s1 = commandstats(&mut con);
    let f1 = failedstats(&mut con);
    let (_, renewed1) = LOG.batches();
    let window = t0.elapsed().as_secs_f64();
    LOG.trace_renewals(false);
    let still_held = guard.as_ref().is_none_or(|g| g.is_held());
    if let Some(g) = guard {
        g.unlock().map_err(s)?;
    }
    if let Some(t) = token {
        naive_holder.release(&t).map_err(s)?;
    }
    let (mut acquired, mut failed) = (0u64, 0u64);
    for c in &children {
        let done = c.expect("done", Duration::from_secs(40))?;
        let f: Vec<u64> = done
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        acquired += f.first().copied().unwrap_or(0);
        failed += f.get(1).copied().unwrap_or(0);
    }
    drop(children);
    let d = stats_delta(&s0, &s1);
    let noscript = stat(&stats_delta(&f0, &f1), "evalsha");
    // The holder's part: its renewals (counted from the renewal thread's log) and, on the
    // first renewal on this server, the NOSCRIPT reply and SCRIPT LOAD before the resend.
    let holder = renewed1 - renewed0 + noscript + stat(&d, "script|load");
    let sent = match kind {
        "naive" => stat(&d, "set"),
        _ => client_level(&d),
    }
    .saturating_sub(holder);
    let rate = sent as f64 / window;
    let waiters = 2 * THREADS;
    let mut r = Row::new(
        W,
        &format!("{label}: commands/s sent by {waiters} waiters"),
        rate,
        Unit::PerSec,
    )
    .note(format!(
        "{window:.2} s window of a {:.0} s hold; all commands incl. inside scripts: {} (of which the holder's renewal calls, subtracted: {holder}); holder still held: {still_held}",
        hold.as_secs_f64(),
        stats_brief(&d)
    ));
    if kind == "ls" && lease == Some(Duration::from_secs(30)) {
        // Heartbeat PINGs (0.5/s per process) are the only expected traffic: allow 0.1/s per waiter.
        r = r.bar(Bar::AtMost(0.1 * waiters as f64));
    }
    ctx.row(r);
    if kind == "ls" {
        let attempts = stat(&d, "evalsha").saturating_sub(renewed1 - renewed0 + noscript);
        ctx.row(Row::new(
            W,
            &format!("{label}: waiter acquire attempts in the window"),
            attempts as f64,
            Unit::Count,
        )
        .note("TTL-bounded re-checks: each process's leader re-checks when the holder's TTL (as last seen) runs out"));
    }
    ctx.row(
        Row::new(
            W,
            &format!("{label}: waiters that got the lock after release"),
            acquired as f64,
            Unit::Count,
        )
        .bar(Bar::Equals(waiters as f64))
        .note(format!("{failed} timed out or failed")),
    );
    Ok(())
}

// =============================================================================================
// Renewal at scale
// =============================================================================================

/// What the hand-written renewal thread did: round trips, leases it found lost, the locks.
type NaiveRenewed = (u64, u64, Vec<(String, String)>);

fn renewal(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "renewal";
    let url = ctx.url.clone();
    let n = ctx.plan.renew_locks;
    let window = ctx.plan.renew_window;
    let lease = Duration::from_secs(3);
    let every = lease / 3;
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;

    // --- locksmith ---
    let before = tasks();
    let client = Client::builder(&url).lease(lease).build().map_err(s)?;
    let built = thread_count();
    let renew_tid =
        new_thread_named(&before, "locksmith-renew").ok_or("no locksmith-renew thread")?;
    let mutexes: Vec<LockMutex> = (0..n)
        .map(|i| client.mutex(&format!("bench:renew:{i}")))
        .collect::<Result<_, _>>()
        .map_err(s)?;
    let t_acq = Instant::now();
    let mut guards = Vec::with_capacity(n);
    for m in &mutexes {
        guards.push(m.lock().map_err(s)?);
    }
    let acq = t_acq.elapsed();
    let held_threads = thread_count();
    // The first renewal round on a fresh server finds the script not loaded: measure it
    // apart, and start the window in the steady state.
    let p0 = commandstats(&mut con);
    let f0 = failedstats(&mut con);
    thread::sleep(every + Duration::from_millis(300));
    let p1 = commandstats(&mut con);
    let f1 = failedstats(&mut con);
    LOG.trace_renewals(true);
    let s0 = commandstats(&mut con);
    let sf0 = failedstats(&mut con);
    let c0 = thread_cpu_ns(renew_tid).ok_or("no CPU time")?;
    let t0 = Instant::now();
    thread::sleep(window);
    let c1 = thread_cpu_ns(renew_tid).ok_or("no CPU time")?;
    let s1 = commandstats(&mut con);
    let sf1 = failedstats(&mut con);
    let w = t0.elapsed().as_secs_f64();
    let (batches, renewed) = LOG.batches();
    LOG.trace_renewals(false);
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    let t_rel = Instant::now();
    let mut release_errors = 0;
    for g in guards {
        release_errors += usize::from(g.unlock().is_err());
    }
    let rel = t_rel.elapsed();
    drop(mutexes);
    drop(client);
    let d = stats_delta(&s0, &s1);
    let window_failed = stat(&stats_delta(&sf0, &sf1), "evalsha");
    let first = stats_delta(&p0, &p1);
    let first_failed = stat(&stats_delta(&f0, &f1), "evalsha");
    let cpu = (c1 - c0) as f64 / 1e9 / w * 100.0;
    let base = before.len() as f64;

    // --- naive: one compare-and-PEXPIRE round trip per lock per period, one thread ---
    let mut nl = NaiveLock::new(&url, "bench:renew-naive:0", lease).map_err(s)?;
    let mut tokens = Vec::with_capacity(n);
    let t_nacq = Instant::now();
    for i in 0..n {
        let name = format!("bench:renew-naive:{i}");
        nl.set_name(&name);
        let t = nl
            .try_acquire()
            .map_err(s)?
            .ok_or("naive renew lock busy")?;
        tokens.push((name, t));
    }
    let nacq = t_nacq.elapsed();
    drop(nl);
    let before_n = tasks();
    let stop = Arc::new(AtomicU64::new(0));
    let stop2 = Arc::clone(&stop);
    let url2 = url.clone();
    let lease_ms = lease.as_millis() as u64;
    let h = thread::Builder::new()
        .name("naive-renew".into())
        .spawn(move || -> Result<NaiveRenewed, String> {
            let mut con = connect(&url2, Duration::from_secs(5)).map_err(s)?;
            let sha = naive::sha(naive::RENEW);
            let (mut rtts, mut lost) = (0u64, 0u64);
            while stop2.load(Ordering::SeqCst) == 0 {
                let start = Instant::now();
                for (name, t) in &tokens {
                    let k = naive::key(name);
                    let r: i64 = redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(1)
                        .arg(&k)
                        .arg(t)
                        .arg(lease_ms)
                        .query(&mut con)
                        .map_err(s)?;
                    rtts += 1;
                    lost += u64::from(r != 1);
                }
                let next = start + every;
                while stop2.load(Ordering::SeqCst) == 0 && Instant::now() < next {
                    thread::sleep(Duration::from_millis(5).min(next - Instant::now()));
                }
            }
            Ok((rtts, lost, tokens))
        })
        .map_err(s)?;
    let naive_tid = new_thread_named(&before_n, "naive-renew");
    let ns0 = commandstats(&mut con);
    let nc0 = naive_tid.and_then(thread_cpu_ns);
    let nt0 = Instant::now();
    thread::sleep(window);
    let nc1 = naive_tid.and_then(thread_cpu_ns);
    let ns1 = commandstats(&mut con);
    let nw = nt0.elapsed().as_secs_f64();
    stop.store(1, Ordering::SeqCst);
    let (_, naive_lost, tokens) = h.join().map_err(|_| "naive renewal thread panicked")??;
    let mut rl = NaiveLock::new(&url, "unused", lease).map_err(s)?;
    for (name, t) in &tokens {
        rl.set_name(name);
        let _ = rl.release(t);
    }
    let nd = stats_delta(&ns0, &ns1);
    let ncpu = match (nc0, nc1) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e9 / nw * 100.0,
        _ => f64::NAN,
    };

    ctx.row(
        Row::new(W, "locksmith locks held", n as f64, Unit::Count).note(format!(
            "one client, one thread, {} s lease renewed every {:.0} ms; {:.2} s window; acquired in {:.2} s, released in {:.2} s ({release_errors} release errors)",
            lease.as_secs(),
            every.as_secs_f64() * 1000.0,
            w,
            acq.as_secs_f64(),
            rel.as_secs_f64()
        )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith renewal round trips (pipelined batches) per period",
            batches as f64 / (w / every.as_secs_f64()),
            Unit::Num,
        )
        .note(format!(
            "{batches} batches, {renewed} renewals in {w:.2} s (from the renewal thread's trace log); the locks were acquired over {:.2} s, and renewals due within {:.0} ms share a batch",
            acq.as_secs_f64(),
            (every / 10).min(Duration::from_millis(100)).as_secs_f64() * 1000.0
        )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith renewal EVALSHA per lock per period",
            stat(&d, "evalsha") as f64 / n as f64 / (w / every.as_secs_f64()),
            Unit::Num,
        )
        .note(format!(
            "commandstats: {}; {window_failed} failed EVALSHA",
            stats_brief(&d)
        )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith first renewal round: EVALSHA answered NOSCRIPT",
            first_failed as f64,
            Unit::Count,
        )
        .note(format!(
            "a fresh server has not seen the renew script: the batch comes back NOSCRIPT, the \
             script is loaded and the batch resent; the first {:.1} s after acquiring: {}",
            (every + Duration::from_millis(300)).as_secs_f64(),
            stats_brief(&first)
        )),
    );
    ctx.row(
        Row::new(W, "locksmith renewal-thread CPU", cpu, Unit::Percent)
            .bar(Bar::AtMost(2.0))
            .note("utime+stime of the thread named locksmith-renew (schedstat), share of one core"),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith threads added by build()",
            built as f64 - base,
            Unit::Count,
        )
        .bar(Bar::Equals(2.0)),
    );
    ctx.row(
        Row::new(
            W,
            &format!("locksmith threads added with {n} locks held"),
            held_threads as f64 - base,
            Unit::Count,
        )
        .bar(Bar::Equals(2.0)),
    );
    ctx.row(Row::new(W, "locksmith leases lost", lost as f64, Unit::Count).bar(Bar::Equals(0.0)));
    ctx.row(
        Row::new(
            W,
            "naive renewal round trips per period",
            stat(&nd, "evalsha") as f64 / (nw / every.as_secs_f64()),
            Unit::Num,
        )
        .note(format!(
            "hand-written: one thread, one compare-and-PEXPIRE EVALSHA per lock per period; {n} locks acquired in {:.2} s",
            nacq.as_secs_f64()
        )),
    );
    ctx.row(Row::new(W, "naive renewal-thread CPU", ncpu, Unit::Percent));
    ctx.row(Row::new(
        W,
        "naive leases lost",
        naive_lost as f64,
        Unit::Count,
    ));
    Ok(())
}

// =============================================================================================
// RedLock
// =============================================================================================

/// RedLock masters, each its own `redis-server`.
const MASTERS: usize = 5;

/// A RedLock client over `urls`, as the bench uses it in both processes.
fn build_redlock<S: AsRef<str>>(urls: &[S]) -> Result<Redlock, String> {
    Redlock::builder(urls.iter().map(AsRef::as_ref))
        .lease(Duration::from_secs(30))
        .clock_drift_factor(0.01)
        .master_timeout(Duration::from_millis(50))
        .build()
        .map_err(s)
}

fn evalsha_one(con: &mut redis::Connection, sha: &str) -> Result<i64, String> {
    redis::cmd("EVALSHA")
        .arg(sha)
        .arg(0)
        .query::<i64>(con)
        .map_err(s)
}

/// One EVALSHA of `return 1` on every master, written to all first, then read from all: the
/// shape of one RedLock call, without the library.
fn parallel_round(cons: &mut [redis::Connection], packed: &[u8]) -> Result<(), String> {
    for con in cons.iter_mut() {
        con.send_packed_command(packed).map_err(s)?;
    }
    for con in cons.iter_mut() {
        con.recv_response().map_err(s)?;
    }
    Ok(())
}

fn redlock(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "redlock";
    const CAP: usize = 400_000;
    // Started here, killed when this function returns (or unwinds).
    let servers = (0..MASTERS)
        .map(|_| RedisServer::start(ctx.pinned.then_some(1)))
        .collect::<Result<Vec<_>, _>>()?;
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let placement = if ctx.pinned {
        "all 5 masters pinned to CPU 1, sharing one core (pessimistic against 5 hosts)"
    } else {
        "not pinned"
    };
    println!("  {MASTERS} masters at {}; {placement}", urls.join(" "));
    let mut cons = urls
        .iter()
        .map(|u| connect(u, Duration::from_secs(5)).map_err(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sha = String::new();
    for con in &mut cons {
        sha = redis::Script::new("return 1").load(con).map_err(s)?;
    }

    // --- Floors: per master, PING and EVALSHA round trips, round-robin over the masters. ---
    let n = (ctx.plan.floor_samples / 2).max(500);
    for _ in 0..500 {
        for con in &mut cons {
            redis::cmd("PING").query::<String>(con).map_err(s)?;
            evalsha_one(con, &sha)?;
        }
    }
    let mut ping = (0..MASTERS)
        .map(|_| Vec::with_capacity(n))
        .collect::<Vec<_>>();
    let mut ev = (0..MASTERS)
        .map(|_| Vec::with_capacity(n))
        .collect::<Vec<_>>();
    for _ in 0..n {
        for (i, con) in cons.iter_mut().enumerate() {
            let t = Instant::now();
            redis::cmd("PING").query::<String>(con).map_err(s)?;
            ping[i].push(micros(t.elapsed()));
            let t = Instant::now();
            evalsha_one(con, &sha)?;
            ev[i].push(micros(t.elapsed()));
        }
    }
    let p50s =
        |v: Vec<Vec<f64>>| -> Vec<f64> { v.into_iter().map(|x| pct(&sorted(x), 0.5)).collect() };
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (ping, ev) = (p50s(ping), p50s(ev));
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let (ping_max, ev_max) = (max(&ping), max(&ev));

    // --- Uncontended cycle: RedLock, single-master locksmith and the per-master EVALSHA
    // floor, interleaved in slices so that outside load hits all of them alike. ---
    let rl = build_redlock(&urls)?;
    let m = rl.mutex("bench:redlock:uncontended").map_err(s)?;
    let single = Client::open(&ctx.url).map_err(s)?;
    let sm = single.mutex("bench:redlock:single").map_err(s)?;
    let cycle = |m: &LockMutex| -> Result<(), String> { m.lock().map_err(s)?.unlock().map_err(s) };
    for _ in 0..500 {
        cycle(&m)?;
        cycle(&sm)?;
        for con in &mut cons {
            evalsha_one(con, &sha)?;
        }
    }
    let (mut rs, mut ss) = (vec![1.0; CAP], vec![1.0; CAP]);
    rs.clear();
    ss.clear();
    let packed = redis::cmd("EVALSHA").arg(&sha).arg(0).get_packed_command();
    let mut par = Vec::with_capacity(CAP / 20);
    let mut fev = (0..MASTERS)
        .map(|_| Vec::with_capacity(CAP / 20))
        .collect::<Vec<_>>();
    let slice = Duration::from_millis(100);
    let mut rl_time = Duration::ZERO;
    while rl_time < ctx.plan.uncontended && rs.len() < CAP - 20_000 {
        let t0 = Instant::now();
        while t0.elapsed() < slice {
            let t = Instant::now();
            cycle(&m)?;
            rs.push(micros(t.elapsed()));
        }
        rl_time += t0.elapsed();
        let t0 = Instant::now();
        while t0.elapsed() < slice && ss.len() < CAP {
            let t = Instant::now();
            cycle(&sm)?;
            ss.push(micros(t.elapsed()));
        }
        for _ in 0..40 {
            for (i, con) in cons.iter_mut().enumerate() {
                let t = Instant::now();
                evalsha_one(con, &sha)?;
                fev[i].push(micros(t.elapsed()));
            }
            let t = Instant::now();
            parallel_round(&mut cons, &packed)?;
            par.push(micros(t.elapsed()));
        }
    }
    // Redis's execution time of the RedLock scripts, per master, in a short pass of cycles
    // alone (commandstats cannot tell them from the floor's `return 1`).
    let exec_cycles = 1000;
    let calls0: Vec<_> = cons.iter_mut().map(commandstats).collect();
    let usec0: Vec<_> = cons.iter_mut().map(usecstats).collect();
    for _ in 0..exec_cycles {
        cycle(&m)?;
    }
    let calls1: Vec<_> = cons.iter_mut().map(commandstats).collect();
    let usec1: Vec<_> = cons.iter_mut().map(usecstats).collect();
    let exec: Vec<f64> = (0..MASTERS)
        .map(|i| {
            stat(&stats_delta(&usec0[i], &usec1[i]), "evalsha") as f64
                / stat(&stats_delta(&calls0[i], &calls1[i]), "evalsha").max(1) as f64
        })
        .collect();
    let exec_calls = (0..MASTERS)
        .map(|i| stat(&stats_delta(&calls0[i], &calls1[i]), "evalsha"))
        .sum::<u64>() as f64
        / (MASTERS * exec_cycles) as f64;
    drop(m);
    drop(sm);
    drop(single);
    let n_rs = rs.len();
    let (rs, ss) = (sorted(rs), sorted(ss));
    let fev = p50s(fev);
    let par = sorted(par);
    let fev_max = max(&fev);
    let floor = 2.0 * fev_max;

    // --- Handoff: holder here, waiter blocked in lock() in a child process. ---
    let name = "bench:redlock:handoff";
    let channel = format!("locksmith:{{{name}}}:released");
    let mut child = ChildProc::spawn(
        "handoff-waiter-redlock",
        "handoff-waiter",
        &[urls.join(","), name.into(), "redlock".into()],
    )?;
    child.expect("ready", STEP)?;
    let hm = rl.mutex(name).map_err(s)?;
    let before: Vec<_> = cons.iter_mut().map(commandstats).collect();
    let warm = 5;
    let handoffs = ls_handoffs(
        &mut ctx.rng,
        &mut child,
        &hm,
        &mut cons[0],
        &channel,
        ctx.plan.redlock_handoff,
        None,
    )?;
    let after: Vec<_> = cons.iter_mut().map(commandstats).collect();
    drop(child);
    drop(hm);
    drop(rl);
    let per_master: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| {
            stat(&stats_delta(b, a), "evalsha") as f64 / (ctx.plan.redlock_handoff + warm) as f64
        })
        .collect();
    let hs = sorted(handoffs.total);
    let rel = sorted(handoffs.release_rtt);

    // --- Rows. ---
    ctx.row(
        Row::new(W, "floor: slowest master PING p50", ping_max, Unit::Us)
            .floor("single-server PING p50", ctx.floors.ping_p50, Unit::Us)
            .note(format!(
                "{n} samples per master, round-robin over the {MASTERS} masters; per-master \
                 PING p50 (µs): {}; {placement}",
                list(&ping)
            )),
    );
    ctx.row(
        Row::new(
            W,
            "floor: slowest master EVALSHA `return 1` p50",
            ev_max,
            Unit::Us,
        )
        .floor(
            "single-server EVALSHA p50",
            ctx.floors.evalsha_p50,
            Unit::Us,
        )
        .note(format!("per-master EVALSHA p50 (µs): {}", list(&ev))),
    );
    let fl = "2 × slowest master EVALSHA p50, interleaved";
    ctx.row(
        Row::new(W, "RedLock lock+unlock p50", pct(&rs, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .bar(Bar::RatioAtMost(1.5))
            .note(format!(
                "{n_rs} cycles, one thread, one name, 5 masters written at once then read; \
                 100 ms slices alternating with single-master locksmith cycles and 40 EVALSHA \
                 per master; interleaved per-master EVALSHA p50 (µs): {}; against the floor \
                 measured first: {:.2}",
                list(&fev),
                pct(&rs, 0.5) / (2.0 * ev_max)
            )),
    );
    ctx.row(
        Row::new(
            W,
            "floor: one EVALSHA to all 5 masters at once, p50",
            pct(&par, 0.5),
            Unit::Us,
        )
        .floor("slowest master EVALSHA p50, interleaved", fev_max, Unit::Us)
        .note(format!(
            "{} samples interleaved with the cycles: `return 1` written to every master, then \
             every reply read (one RedLock call's shape, without the library); p99 {:.0} µs",
            par.len(),
            pct(&par, 0.99)
        )),
    );
    ctx.row(
        Row::new(
            W,
            "RedLock lock+unlock p50 against 2 parallel rounds",
            pct(&rs, 0.5),
            Unit::Us,
        )
        .floor(
            "2 × all-masters EVALSHA p50",
            2.0 * pct(&par, 0.5),
            Unit::Us,
        )
        .note("what the library adds to two write-all-then-read-all rounds"),
    );
    ctx.row(
        Row::new(
            W,
            "part: Redis execution per RedLock script call (mean of masters)",
            exec.iter().sum::<f64>() / MASTERS as f64,
            Unit::Us,
        )
        .floor("EVALSHA `return 1`", ctx.floors.evalsha_exec_us, Unit::Us)
        .note(format!(
            "commandstats usec / calls over {exec_cycles} cycles alone; per master (µs): {}; \
             {exec_calls:.2} EVALSHA per master per cycle; with the masters on one core their \
             execution times add up within each call",
            list(&exec)
        )),
    );
    ctx.row(
        Row::new(W, "RedLock lock+unlock p99", pct(&rs, 0.99), Unit::Us).floor(fl, floor, Unit::Us),
    );
    ctx.row(Row::new(
        W,
        "RedLock cycles/s",
        n_rs as f64 / rl_time.as_secs_f64(),
        Unit::PerSec,
    ));
    ctx.row(
        Row::new(
            W,
            "RedLock lock+unlock p50 against single-master",
            pct(&rs, 0.5),
            Unit::Us,
        )
        .floor(
            "single-master cycle p50, interleaved",
            pct(&ss, 0.5),
            Unit::Us,
        )
        .note(format!(
            "{} single-master locksmith cycles on the main redis-server in the same run",
            ss.len()
        )),
    );
    let hfl = "slowest master PING p50";
    ctx.row(
        Row::new(W, "RedLock handoff p50", pct(&hs, 0.5), Unit::Us)
            .floor(hfl, ping_max, Unit::Us)
            .note(format!(
                "{} samples; no bar given for RedLock handoff; holder in this process, waiter \
                 blocked in lock() in a child (subscribed on master 0); same clock method as the \
                 handoff workload; {} samples where the waiter was not seen blocked within 2 s",
                hs.len(),
                handoffs.unverified
            )),
    );
    ctx.row(
        Row::new(W, "RedLock handoff p90", pct(&hs, 0.9), Unit::Us).floor(hfl, ping_max, Unit::Us),
    );
    ctx.row(
        Row::new(W, "RedLock handoff p99", pct(&hs, 0.99), Unit::Us).floor(hfl, ping_max, Unit::Us),
    );
    ctx.row(
        Row::new(W, "RedLock handoff max", pct(&hs, 1.0), Unit::Us).floor(hfl, ping_max, Unit::Us),
    );
    if let Some((ls, _)) = &ctx.handoff {
        let single_p50 = pct(ls, 0.5);
        ctx.row(
            Row::new(
                W,
                "RedLock handoff p50 against single-master",
                pct(&hs, 0.5),
                Unit::Us,
            )
            .floor("single-master handoff p50", single_p50, Unit::Us),
        );
    }
    ctx.row(
        Row::new(
            W,
            "part: RedLock release round trip (holder) p50",
            pct(&rel, 0.5),
            Unit::Us,
        )
        .floor(hfl, ping_max, Unit::Us),
    );
    ctx.row(
        Row::new(
            W,
            "EVALSHA per handoff per master (mean)",
            per_master.iter().sum::<f64>() / MASTERS as f64,
            Unit::Num,
        )
        .note(format!(
            "6 expected: holder's acquire, waiter's two attempts before it blocks, holder's \
             release, waiter's acquire and release; more means retries (a split vote) or undo \
             calls; per master: {}",
            per_master
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    );
    ctx.notes.push(format!(
        "RedLock: {MASTERS} redis-servers started for the redlock workload (lease 30 s, drift \
         factor 0.01, master timeout 50 ms); {placement}. Its floor is the slowest master's \
         EVALSHA `return 1` p50, measured from the bench process in the same run."
    ));
    ctx.redlock_handoff = Some(hs);
    drop(cons);
    drop(servers);
    Ok(())
}

// =============================================================================================
// Children
// =============================================================================================

fn child_main(args: &[String]) -> i32 {
    let Some(role) = args.first() else {
        eprintln!("bench child: no role");
        return 2;
    };
    let input = child_input(Duration::from_secs(900));
    let rest = &args[1..];
    let r = match role.as_str() {
        "handoff-waiter" => child_handoff(rest, &input),
        "pubsub-listener" => child_pubsub(rest),
        "contend" => child_contend(rest, &input),
        "idle-wait" => child_idle(rest, &input),
        other => Err(format!("unknown role {other}")),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench child {role}: {e}");
            say(&format!("error {e}"));
            2
        }
    }
}

fn arg(a: &[String], i: usize) -> Result<&str, String> {
    a.get(i)
        .map(String::as_str)
        .ok_or_else(|| format!("missing argument {i}"))
}

/// A waiter's lock: locksmith's, or the naive one.
enum Waiter {
    Ls(LockMutex),
    Naive(NaiveLock),
}

impl Waiter {
    fn new(client: Option<&Client>, url: &str, name: &str) -> Result<Waiter, String> {
        Ok(match client {
            Some(c) => Waiter::Ls(c.mutex(name).map_err(s)?),
            None => Waiter::Naive(NaiveLock::new(url, name, NAIVE_LEASE).map_err(s)?),
        })
    }

    /// Waits until `deadline` for the lock; runs `held` while holding it, then releases.
    /// `first_miss` runs after the naive lock's first failed attempt. Ok(false): timed out.
    fn with_lock(
        &mut self,
        deadline: Instant,
        first_miss: impl FnMut(),
        held: impl FnOnce() -> Result<(), String>,
    ) -> Result<bool, String> {
        match self {
            Waiter::Ls(m) => match m.try_lock_until(deadline).map_err(s)? {
                Some(g) => {
                    let r = held();
                    g.unlock().map_err(s)?;
                    r.map(|()| true)
                }
                None => Ok(false),
            },
            Waiter::Naive(l) => match l.acquire_until(deadline, first_miss).map_err(s)? {
                Some(t) => {
                    let r = held();
                    if !l.release(&t).map_err(s)? {
                        return Err("naive lock was lost before release".into());
                    }
                    r.map(|()| true)
                }
                None => Ok(false),
            },
        }
    }
}

fn child_handoff(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    // `redlock`: `url` is the masters' URLs, comma-separated.
    let quorum = if kind == "redlock" {
        Some(build_redlock(&url.split(',').collect::<Vec<_>>())?)
    } else {
        None
    };
    let mut w = match &quorum {
        Some(q) => Waiter::Ls(q.mutex(name).map_err(s)?),
        None => Waiter::new(client.as_ref(), url, name)?,
    };
    say("ready");
    while let Ok(line) = input.recv() {
        match line.as_str() {
            "clock" => say(&format!("clock {}", realtime_ns())),
            "go" => {
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut t1 = 0;
                let got = w.with_lock(
                    deadline,
                    || say("waiting"),
                    || {
                        t1 = realtime_ns();
                        Ok(())
                    },
                );
                match got {
                    Ok(true) => say(&format!("got {t1}")),
                    Ok(false) => say("timeout"),
                    Err(e) => say(&format!("error {e}")),
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn child_pubsub(a: &[String]) -> Result<(), String> {
    let (url, channel) = (arg(a, 0)?, arg(a, 1)?);
    let client = redis::Client::open(url).map_err(s)?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(s)?;
    let mut ps = con.as_pubsub();
    ps.subscribe(channel).map_err(s)?;
    say("ready");
    loop {
        let msg = ps.get_message().map_err(s)?;
        let t1 = realtime_ns();
        let p: String = msg.get_payload().map_err(s)?;
        say(&format!("msg {p} {t1}"));
    }
}

/// The critical section of the contended workload: read, add one, write back.
fn bump(con: &mut redis::Connection, key: &str) -> Result<(), String> {
    let v: Option<i64> = redis::cmd("GET").arg(key).query(con).map_err(s)?;
    redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .query::<()>(con)
        .map_err(s)
}

struct Tally {
    count: u64,
    errors: u64,
    waits: Vec<u64>,
    censored: Vec<u64>,
}

fn child_contend(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let threads: usize = arg(a, 3)?.parse().map_err(s)?;
    let counter = arg(a, 4)?;
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    let ready = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let deadline: Mutex<Option<Instant>> = Mutex::new(None);
    let (tallies, elapsed) = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (ready, go, deadline, client) = (&ready, &go, &deadline, client.as_ref());
                sc.spawn(move || -> Result<Tally, String> {
                    let setup = (|| -> Result<(Waiter, redis::Connection), String> {
                        let mut w = Waiter::new(client, url, name)?;
                        // Warm up: the pool connection, a subscription round.
                        w.with_lock(Instant::now() + Duration::from_secs(20), || {}, || Ok(()))?;
                        Ok((w, connect(url, Duration::from_secs(5)).map_err(s)?))
                    })();
                    ready.wait();
                    go.wait();
                    let (mut w, mut crit) = setup?;
                    let end = deadline.lock().map_err(s)?.unwrap_or_else(Instant::now);
                    let mut t = Tally {
                        count: 0,
                        errors: 0,
                        waits: Vec::new(),
                        censored: Vec::new(),
                    };
                    while Instant::now() < end {
                        let start = Instant::now();
                        let mut waited = 0;
                        let r = w.with_lock(
                            end,
                            || {},
                            || {
                                waited = start.elapsed().as_micros() as u64;
                                bump(&mut crit, counter)
                            },
                        );
                        match r {
                            Ok(true) => {
                                t.count += 1;
                                t.waits.push(waited);
                            }
                            Ok(false) => {
                                t.censored.push(start.elapsed().as_micros() as u64);
                                break;
                            }
                            Err(e) => {
                                eprintln!("contend child: {e}");
                                t.errors += 1;
                                // An error after the critical section still counts it.
                                if waited > 0 {
                                    t.count += 1;
                                    t.waits.push(waited);
                                }
                                thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                    Ok(t)
                })
            })
            .collect();
        ready.wait();
        say("ready");
        let run = input
            .recv_timeout(Duration::from_secs(120))
            .ok()
            .and_then(|l| l.strip_prefix("go ").and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0);
        let start = Instant::now();
        if let Ok(mut d) = deadline.lock() {
            *d = Some(start + Duration::from_millis(run));
        }
        go.wait();
        let tallies: Vec<Result<Tally, String>> = hs
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect();
        (tallies, start.elapsed())
    });
    let mut all = Tally {
        count: 0,
        errors: 0,
        waits: Vec::new(),
        censored: Vec::new(),
    };
    for t in tallies {
        match t {
            Ok(mut t) => {
                all.count += t.count;
                all.errors += t.errors;
                all.waits.append(&mut t.waits);
                all.censored.append(&mut t.censored);
            }
            Err(e) => {
                eprintln!("contend child thread: {e}");
                all.errors += 1;
            }
        }
    }
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    say(&format!(
        "done {} {} {}",
        all.count,
        all.errors,
        elapsed.as_micros()
    ));
    say(&format!("waits {}", join(&all.waits)));
    say(&format!("censored {}", join(&all.censored)));
    // Wait for the parent to close stdin (the input thread then ends the process).
    let _ = input.recv_timeout(Duration::from_secs(60));
    Ok(())
}

fn child_idle(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let threads: usize = arg(a, 3)?.parse().map_err(s)?;
    let timeout = Duration::from_millis(arg(a, 4)?.parse().map_err(s)?);
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    say("ready");
    match input.recv_timeout(Duration::from_secs(120)) {
        Ok(l) if l == "go" => {}
        _ => return Err("no go".into()),
    }
    let results: Vec<Result<bool, String>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let client = client.as_ref();
                sc.spawn(move || -> Result<bool, String> {
                    let deadline = Instant::now() + timeout;
                    let mut w = Waiter::new(client, url, name)?;
                    w.with_lock(deadline, || {}, || Ok(()))
                })
            })
            .collect();
        say("started");
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let acquired = results.iter().filter(|r| matches!(r, Ok(true))).count();
    for r in &results {
        if let Err(e) = r {
            eprintln!("idle child: {e}");
        }
    }
    say(&format!("done {acquired} {}", results.len() - acquired));
    let _ = input.recv_timeout(Duration::from_secs(60));
    Ok(())
}
