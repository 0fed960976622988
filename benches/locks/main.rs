//! The `locks` benchmark: locksmith against its floors and against a naive polling lock.
//!
//! `cargo bench --bench locks` runs every workload (about 2.5 minutes on 2 cores, bounded by
//! 10); `cargo bench --bench locks -- --quick` runs them all with fewer samples (under a
//! minute). `--only a,b` runs some (`uncontended`, `handoff`, `handoff-unpinned`, `contended`,
//! `hot`, `many`, `server-cost`, `idle`, `renewal`, `redlock`, `fair`, `rw`, `semaphore`, `tls`,
//! `cluster`, `multi`, `capacity`; the floors always run). `--no-pin` leaves CPU placement to the
//! scheduler; the `handoff-unpinned` workload leaves it to the scheduler in any case (a Redis of
//! its own, the bench and its waiter child unpinned for its length). The `server-cost` workload
//! also starts a Redis of its own (pinned like the main one), whose statistics it resets.
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
//!
//! The `cluster` workload starts a Redis Cluster of three masters (then one of a single
//! master), pinned to the same CPU 1. The `capacity` workload starts a `redis-server` of its
//! own, then a three-master cluster, both pinned like the main one, and drives them from child
//! processes of many threads.
//!
//! Layout: this file parses the arguments, starts the server, runs the workloads in order,
//! dispatches a child process's role to its workload (`child_main`, the one place that names
//! every role) and writes the report. Each workload has a file of its own ([`uncontended`],
//! [`handoff`], [`contended`], [`hot`], [`many`], [`server_cost`], [`idle`], [`renewal`],
//! [`redlock`], [`tls`], [`cluster`], [`multi`], [`capacity`], and [`family`] for `fair`, `rw` and
//! `semaphore`) holding both its parent side and, where it uses child processes, the child's
//! side; no workload imports another. What
//! two workloads share lives in the support modules below them: [`floors`] (the floors every
//! figure is compared with), [`handoff_runs`] (a run of handoffs to a waiter child, for
//! `handoff` and `redlock`), [`contention`] (a contended run of child processes, for
//! `contended` and `hot`), [`context`] (what every workload is given: the plan, the floors,
//! the rows, the bounds), [`child`] (the parent/child line protocol), [`naive`] (the baseline
//! lock), [`report`] (the table, JSON, Markdown and SVG output) and [`support`] (sample
//! statistics, the log tap, error text); the server, Redis statistics, clocks and thread figures come
//! from `locksmith-testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod capacity;
mod child;
mod cluster;
mod contended;
mod contention;
mod context;
mod family;
mod floors;
mod handoff;
mod handoff_runs;
mod hot;
mod idle;
mod many;
mod multi;
mod naive;
mod redlock;
mod renewal;
mod report;
mod server_cost;
mod support;
mod tls;
mod uncontended;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use child::{child_input, say};
use contended::contended;
use contention::child_contend;
use context::{Ctx, Plan};
use floors::measure_floors;
use handoff::{child_pubsub, handoff, handoff_unpinned};
use handoff_runs::child_handoff;
use hot::hot;
use idle::{child_idle, idle};
use many::many_names;
use redlock::redlock;
use renewal::renewal;
use report::{Bar, Row, Series, Unit};
use server_cost::server_cost;
use support::{LOG, LogTap, RedisServer, Rng, pct, realtime_ns};
use uncontended::uncontended;

/// The entry point of a child process (`--child ROLE ARGS...`): runs the child's side of the
/// workload that names the role, and returns the exit code. The one place that names every
/// role.
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
        "capacity" => capacity::child_capacity(rest, &input),
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
    let server = match RedisServer::try_start(pinned.then_some(1)) {
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
        rng: Rng::from_clock(),
    };
    type Workload = fn(&mut Ctx) -> Result<(), String>;
    let workloads: [(&str, Workload); 17] = [
        ("fair", |c| family_rows(c, family::fair)),
        ("rw", |c| family_rows(c, family::rw)),
        ("semaphore", |c| family_rows(c, family::semaphore)),
        ("uncontended", uncontended),
        ("handoff", handoff),
        ("handoff-unpinned", handoff_unpinned),
        ("contended", contended),
        ("hot", hot),
        ("many", many_names),
        ("server-cost", server_cost),
        ("idle", idle),
        ("renewal", renewal),
        ("redlock", redlock),
        ("tls", tls::tls),
        ("cluster", cluster::cluster),
        ("multi", multi::multi),
        ("capacity", capacity::capacity),
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

/// Runs one workload of the other lock types ([`family`]) and records its rows.
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
