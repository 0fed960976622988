//! Handoff latency: a holder in this process unlocks, a waiter in a child process is
//! blocked in `lock()`; the time from `unlock()` to the waiter's `lock()` returning, on one
//! clock (CLOCK_REALTIME, checked by a pipe ping-pong), split into its parts with Redis's own
//! `MONITOR` timestamps. Also the naive lock's handoff, PUBLISH to a raw subscriber, and
//! thread unpark latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::child::{ChildProc, arg, say};
use crate::context::{Ctx, NAIVE_LEASE, STEP};
use crate::handoff_runs::{Monitor, ls_handoffs};
use crate::naive::{self, NaiveLock};
use crate::report::{Bar, Row, Unit};
use crate::support::{
    calls_by_command, connect, micros, pct, realtime_ns, s, script_stat, sorted, stats_delta,
    usec_by_command,
};

pub(crate) fn handoff(ctx: &mut Ctx) -> Result<(), String> {
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
    let (calls0, usec0) = (calls_by_command(&mut con), usec_by_command(&mut con));
    let plain = ls_handoffs(
        &mut ctx.rng,
        &mut child,
        &m,
        &mut con,
        &channel,
        ctx.plan.handoff_ls,
        None,
    )?;
    let (calls1, usec1) = (calls_by_command(&mut con), usec_by_command(&mut con));
    let script_us = script_stat(&stats_delta(&usec0, &usec1)) as f64
        / script_stat(&stats_delta(&calls0, &calls1)).max(1) as f64;
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
        "script work before the publish (get, the check of the acquisition)".to_owned(),
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
        .note("commandstats usec / calls of script calls (EVALSHA, FCALL) during the uninstrumented handoffs (acquire attempts and releases)"),
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

pub(crate) fn child_pubsub(a: &[String]) -> Result<(), String> {
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

/// Cross-process handoffs with nothing pinned: a Redis of its own started unpinned, and this
/// process (its threads and the waiter child it starts) let run on every CPU for the length
/// of the workload, then pinned back. The rows compare against a PING floor measured on that
/// server, unpinned too, in the same workload.
pub(crate) fn handoff_unpinned(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "handoff-unpinned";
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "0".into());
    let me = std::process::id().to_string();
    let affinity = |cpus: &str| {
        std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &me])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ctx.pinned && !affinity(&online) {
        return Err("cannot unpin this process (taskset)".into());
    }
    let result = unpinned_rows(ctx, W);
    if ctx.pinned && !affinity("0") {
        eprintln!("{W}: could not pin the bench back to CPU 0; later rows run unpinned");
    }
    let (ping, ls) = result?;
    let fl = "PING p50, unpinned server";
    ctx.row(
        Row::new(
            W,
            "locksmith handoff p50, unpinned",
            pct(&ls, 0.5),
            Unit::Us,
        )
        .floor(fl, ping, Unit::Us)
        .bar(Bar::RatioAtMost(6.0))
        .note(format!(
            "{} samples; redis-server, bench and waiter child all left to the scheduler \
                 (CPUs {online})",
            ls.len()
        )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith handoff p99, unpinned",
            pct(&ls, 0.99),
            Unit::Us,
        )
        .floor(fl, ping, Unit::Us)
        .bar(Bar::RatioAtMost(20.0)),
    );
    Ok(())
}

/// The PING floor and the handoffs (µs, sorted) of [`handoff_unpinned`].
fn unpinned_rows(ctx: &mut Ctx, w: &str) -> Result<(f64, Vec<f64>), String> {
    let server = crate::support::RedisServer::try_start(None)?;
    let url = server.url();
    let name = "bench:handoff-unpinned";
    let channel = format!("locksmith:{{{name}}}:released");
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;
    let (floors, _) = crate::floors::measure_floors(&url, ctx.plan.floor_samples)?;
    let ping = floors.ping_p50;
    let mut child = ChildProc::spawn(
        &format!("{w}-waiter"),
        "handoff-waiter",
        &[url.clone(), name.into(), "ls".into()],
    )?;
    child.expect("ready", STEP)?;
    let client = Client::open(&url).map_err(s)?;
    let m = client.mutex(name).map_err(s)?;
    let runs = ls_handoffs(
        &mut ctx.rng,
        &mut child,
        &m,
        &mut con,
        &channel,
        ctx.plan.handoff_ls,
        None,
    )?;
    Ok((ping, sorted(runs.total)))
}
