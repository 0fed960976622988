//! Many names: lock/unlock cycles per second with 8 threads on 8 names against 1 thread, for
//! locksmith and the naive lock, and locksmith's 8 threads against the naive lock's.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::context::{Ctx, NAIVE_LEASE, THREADS};
use crate::naive::NaiveLock;
use crate::report::{Bar, Row, Unit};
use crate::support::s;

pub(crate) fn many_names(ctx: &mut Ctx) -> Result<(), String> {
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
    ctx.row(
        Row::new(
            W,
            "locksmith 8 threads, 8 names against naive",
            eight,
            Unit::PerSec,
        )
        .floor("naive 8 threads, 8 names", n_eight, Unit::PerSec)
        .bar(Bar::RatioAtLeast(0.8))
        .note(
            "same run, same server (pinned to one core when the bench pins): what the lock's \
             work on the server costs in throughput when Redis is the bottleneck",
        ),
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
