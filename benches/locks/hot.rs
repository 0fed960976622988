//! The hot lock: many threads of few processes updating one balance (lock, GET, SET+1,
//! unlock), against the critical section's own limit: one thread running GET and SET back to
//! back with no lock at all, measured in the same run. Local hand-off (on by default) passes
//! the lock between the threads of one process without a round trip; the 3 x 8 row checks
//! that the other processes still get their share.

use std::time::{Duration, Instant};

use crate::contention::{Run, run_contended};
use crate::context::{Ctx, THREADS};
use crate::report::{Bar, Row, Unit};
use crate::support::{connect, pct, s, sorted};

/// One thread, GET then SET of the read value + 1, back to back for `run`, no lock: the
/// critical section's own limit, in sections per second.
fn section_limit(url: &str, run: Duration) -> Result<f64, String> {
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    let key = "bench:hot:limit";
    for _ in 0..1000 {
        redis::cmd("GET")
            .arg(key)
            .query::<Option<i64>>(&mut con)
            .map_err(s)?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < run {
        let v: Option<i64> = redis::cmd("GET").arg(key).query(&mut con).map_err(s)?;
        redis::cmd("SET")
            .arg(key)
            .arg(v.unwrap_or(0) + 1)
            .query::<()>(&mut con)
            .map_err(s)?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

pub(crate) fn hot(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "hot";
    let url = ctx.url.clone();
    let run = ctx.plan.contended;
    let limit = section_limit(&url, run / 2)?;
    ctx.row(
        Row::new(
            W,
            "no lock, 1 thread: GET+SET per second",
            limit,
            Unit::PerSec,
        )
        .note(format!("{:.1} s back to back", (run / 2).as_secs_f64())),
    );

    let one = run_contended(&url, "ls", "hot1", 1, THREADS, run)?;
    let rate = one.count as f64 / one.elapsed.max(1e-9);
    ctx.row(
        Row::new(
            W,
            &format!("1 process × {THREADS} threads: acquisitions/s"),
            rate,
            Unit::PerSec,
        )
        .floor("no lock, 1 thread", limit, Unit::PerSec)
        .bar(Bar::RatioAtLeast(0.70))
        .note(format!(
            "lock, GET, SET+1, unlock; {:.1} s; per thread: see waits; {} errors; lost updates {}",
            one.elapsed,
            one.errors,
            one.count as i64 - one.value
        )),
    );
    // The limit again after the runs: the machine is shared, and a drift shows here.
    let limit_after = section_limit(&url, run / 4)?;
    ctx.row(
        Row::new(
            W,
            "no lock, 1 thread, again after",
            limit_after,
            Unit::PerSec,
        )
        .floor("no lock, 1 thread", limit, Unit::PerSec),
    );

    const PROCS: usize = 3;
    let three = run_contended(&url, "ls", "hot3", PROCS, THREADS, run)?;
    three_rows(ctx, &three, PROCS)?;
    Ok(())
}

fn three_rows(ctx: &mut Ctx, r: &Run, procs: usize) -> Result<(), String> {
    const W: &str = "hot";
    let label = format!("{procs} processes × {THREADS} threads");
    ctx.row(
        Row::new(
            W,
            &format!("{label}: acquisitions/s"),
            r.count as f64 / r.elapsed.max(1e-9),
            Unit::PerSec,
        )
        .note(format!(
            "{:.1} s; per process {:?}; {} errors",
            r.elapsed, r.per_proc, r.errors
        )),
    );
    ctx.row(
        Row::new(
            W,
            &format!("{label}: lost updates"),
            r.count as f64 - r.value as f64,
            Unit::Count,
        )
        .bar(Bar::Equals(0.0))
        .note(format!("counter {}, acquisitions {}", r.value, r.count)),
    );
    let fair = r.count as f64 / procs as f64;
    let min = r.per_proc.iter().copied().min().unwrap_or(0) as f64;
    ctx.row(
        Row::new(
            W,
            &format!("{label}: smallest process share"),
            min,
            Unit::Count,
        )
        .floor("fair share", fair, Unit::Count)
        .bar(Bar::RatioAtLeast(1.0 / 3.0))
        .note(format!("acquisitions per process {:?}", r.per_proc)),
    );
    let waits = sorted(r.waits.clone());
    let longest = waits
        .last()
        .copied()
        .unwrap_or(0.0)
        .max(r.censored.iter().copied().fold(0.0, f64::max));
    let med = pct(&waits, 0.5);
    ctx.row(
        Row::new(
            W,
            &format!("{label}: longest wait (incl. unfinished)"),
            longest,
            Unit::Us,
        )
        .floor("median wait", med, Unit::Us)
        .bar(Bar::RatioAtMost(50.0))
        .note(format!(
            "wait = lock() call to return; p99 {:.0} µs; {} unfinished at the end",
            pct(&waits, 0.99),
            r.censored.len()
        )),
    );
    Ok(())
}
