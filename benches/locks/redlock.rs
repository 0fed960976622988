//! RedLock: five more `redis-server`s as the masters (pinned to the same CPU as the first);
//! lock+unlock cycles against the slowest master's floor and against parallel rounds, and the
//! handoff between processes.

use std::time::{Duration, Instant};

use locksmith::{Client, Mutex as LockMutex};

use crate::child::ChildProc;
use crate::context::{Ctx, STEP};
use crate::handoff_runs::{build_redlock, ls_handoffs};
use crate::report::{Bar, Row, Unit};
use crate::support::{
    RedisServer, calls_by_command, connect, micros, pct, s, script_stat, sorted, stats_delta,
    usec_by_command,
};

/// RedLock masters, each its own `redis-server`.
const MASTERS: usize = 5;

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

pub(crate) fn redlock(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "redlock";
    const CAP: usize = 400_000;
    // Started here, killed when this function returns (or unwinds).
    let servers = (0..MASTERS)
        .map(|_| RedisServer::try_start(ctx.pinned.then_some(1)))
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
    let calls0: Vec<_> = cons.iter_mut().map(calls_by_command).collect();
    let usec0: Vec<_> = cons.iter_mut().map(usec_by_command).collect();
    for _ in 0..exec_cycles {
        cycle(&m)?;
    }
    let calls1: Vec<_> = cons.iter_mut().map(calls_by_command).collect();
    let usec1: Vec<_> = cons.iter_mut().map(usec_by_command).collect();
    let exec: Vec<f64> = (0..MASTERS)
        .map(|i| {
            script_stat(&stats_delta(&usec0[i], &usec1[i])) as f64
                / script_stat(&stats_delta(&calls0[i], &calls1[i])).max(1) as f64
        })
        .collect();
    let exec_calls = (0..MASTERS)
        .map(|i| script_stat(&stats_delta(&calls0[i], &calls1[i])))
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
    let before: Vec<_> = cons.iter_mut().map(calls_by_command).collect();
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
    let after: Vec<_> = cons.iter_mut().map(calls_by_command).collect();
    drop(child);
    drop(hm);
    drop(rl);
    let per_master: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| {
            script_stat(&stats_delta(b, a)) as f64 / (ctx.plan.redlock_handoff + warm) as f64
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
