//! Uncontended cycle: one thread locks and unlocks a free lock, against two EVALSHA round
//! trips measured interleaved with it (and the naive lock's cycle).

use std::time::{Duration, Instant};

use locksmith::Client;

use crate::context::{Ctx, NAIVE_LEASE};
use crate::naive::NaiveLock;
use crate::report::{Bar, Row, Unit};
use crate::support::{connect, micros, pct, rss_kib, s, sorted};

pub(crate) fn uncontended(ctx: &mut Ctx) -> Result<(), String> {
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
