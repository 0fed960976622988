//! Many names: lock/unlock cycles per second with 8 threads on 8 names against 1 thread, for
//! locksmith and the naive lock, and locksmith's 8 threads against the naive lock's.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::context::{Ctx, NAIVE_LEASE, THREADS};
use crate::naive::NaiveLock;
use crate::report::{Bar, Row, Unit};
use crate::support::{connect, process_cpu_us, redis_command_us, redis_cpu_us, s};

/// The commands a locksmith cycle sends: a function call each, or the scripts where the server
/// runs no functions.
const LOCKSMITH_SENDS: &[&str] = &["fcall", "evalsha"];
/// The commands a naive cycle sends.
const NAIVE_SENDS: &[&str] = &["set", "evalsha"];

pub(crate) fn many_names(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "many names";
    let d = ctx.plan.many;
    let mut admin = connect(&ctx.url, Duration::from_secs(5)).map_err(s)?;
    let client = Client::open(&ctx.url).map_err(s)?;
    let one = ls_cycles(&client, 1, d)?;
    let (eight, ls_cpu) = cpu_per_cycle(&mut admin, d, LOCKSMITH_SENDS, || {
        ls_cycles(&client, THREADS, d)
    })?;
    drop(client);
    let n_one = naive_cycles(&ctx.url, 1, d)?;
    let (n_eight, naive_cpu) = cpu_per_cycle(&mut admin, d, NAIVE_SENDS, || {
        naive_cycles(&ctx.url, THREADS, d)
    })?;
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
        .note(format!(
            "one client shared by the threads; uncontended lock+unlock cycles; {ls_cpu}"
        )),
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
        .note(format!("one connection per thread; {naive_cpu}")),
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

/// Runs `f` (cycles per second over `d`) and says what one cycle cost in CPU: Redis's
/// (`INFO cpu`, socket I/O and event loop included; of it, the time in the commands `sent`,
/// their scripts included, from `INFO commandstats`) and this process's, each also as the share of one core
/// over the window, so that a reader sees which side was the bottleneck and where Redis's
/// time went.
fn cpu_per_cycle(
    admin: &mut redis::Connection,
    d: Duration,
    sent: &[&str],
    f: impl FnOnce() -> Result<f64, String>,
) -> Result<(f64, String), String> {
    let (c0, r0, p0, t0) = (
        redis_command_us(admin, sent)?,
        redis_cpu_us(admin)?,
        process_cpu_us(),
        Instant::now(),
    );
    let rate = f()?;
    let (r1, p1, t1) = (redis_cpu_us(admin)?, process_cpu_us(), Instant::now());
    let c1 = redis_command_us(admin, sent)?;
    // The window is `d` of cycles plus the threads' set-up; per cycle over the cycles counted.
    let cycles = (rate * d.as_secs_f64()).max(1.0);
    let wall = (t1 - t0).as_secs_f64() * 1e6;
    Ok((
        rate,
        format!(
            "per cycle: Redis CPU {:.1} µs (one core {:.0}% busy; in commands {:.1} µs), bench \
             process CPU {:.1} µs ({:.0}% of a core), set-up included",
            (r1 - r0) / cycles,
            100.0 * (r1 - r0) / wall,
            (c1 - c0) / cycles,
            (p1 - p0) / cycles,
            100.0 * (p1 - p0) / wall
        ),
    ))
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
