//! Contended throughput: child processes with several threads each take one hot lock and
//! increment a counter inside it; acquisitions per second, commands per acquisition, lost
//! updates and the longest wait, for locksmith and the naive lock.

use crate::contention::{Run, run_contended};
use crate::context::{Ctx, THREADS};
use crate::report::{Bar, Row, Unit};
use crate::support::{client_level, pct, sorted, stat, stats_brief, stats_delta, stats_total};

pub(crate) fn contended(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "contended";
    let url = ctx.url.clone();
    for kind in ["ls", "naive"] {
        let label = if kind == "ls" { "locksmith" } else { "naive" };
        let Run {
            count,
            errors,
            elapsed,
            per_proc,
            waits,
            censored,
            value,
            s0,
            s1,
        } = run_contended(&url, kind, "contended", 2, THREADS, ctx.plan.contended)?;
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
