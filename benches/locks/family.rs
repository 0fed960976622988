//! Workloads of the other lock types: `fair` (fair mutex handoff against PING and against
//! the plain mutex's handoff measured the same way in the same run), `rw` (read throughput
//! with 8 readers) and `semaphore` (acquire/release cycles with 8 threads on 4 permits); the
//! last two against a floor measured in the same run: 8 threads each doing two PING round
//! trips per cycle on a connection of its own (a lock cycle is two round trips).
//!
//! Handoffs here are measured between two clients of this process (each with its own
//! connections and threads, as two processes would have): the holder reads `Instant::now()`
//! just before `unlock()`, the waiter just after its `lock()` returned. The plain mutex and
//! the fair mutex are measured by the same code, alternating, so both see the same machine.

use std::sync::{Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::report::{Bar, Row, Unit};
use crate::support::{Rng, connect, numsub, pct, sorted};

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn llen(con: &mut redis::Connection, key: &str) -> Result<u64, String> {
    redis::cmd("LLEN").arg(key).query(con).map_err(s)
}

/// Polls `cond` (every 50 µs, at most 5 s) until it holds.
fn wait_for(mut cond: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond()? {
        if Instant::now() > end {
            return Err("the waiter was not seen waiting within 5 s".into());
        }
        thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

/// One handoff sample per round, for a lock type given by three closures: the waiter's
/// `acquire_release` (on its own thread: blocks in lock, sends the instant it got it, then
/// releases when told), the holder's `hold` (locks and returns an unlocker), and `waiting`
/// (true once the waiter is blocked).
macro_rules! handoffs {
    ($n:expr, $rng:expr, $holder:expr, $waiter:expr, $waiting:expr) => {{
        let (go_tx, go_rx) = mpsc::channel::<bool>();
        let (got_tx, got_rx) = mpsc::channel::<Result<Instant, String>>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let waiter = $waiter;
        let w = thread::spawn(move || {
            while let Ok(true) = go_rx.recv() {
                match waiter.lock() {
                    Ok(g) => {
                        let _ = got_tx.send(Ok(Instant::now()));
                        let _ = done_rx.recv();
                        drop(g);
                    }
                    Err(e) => {
                        let _ = got_tx.send(Err(e.to_string()));
                    }
                }
            }
        });
        let mut out = Vec::with_capacity($n);
        let mut run = || -> Result<(), String> {
            for _ in 0..$n {
                let g = $holder.lock().map_err(s)?;
                go_tx.send(true).map_err(s)?;
                wait_for(&mut $waiting)?;
                // Release at a random phase after the waiter went to sleep.
                thread::sleep($rng.duration(Duration::from_micros(500), Duration::from_millis(2)));
                let t0 = Instant::now();
                g.unlock().map_err(s)?;
                let t1 = got_rx.recv_timeout(Duration::from_secs(20)).map_err(s)??;
                out.push((t1 - t0).as_secs_f64() * 1e6);
                done_tx.send(()).map_err(s)?;
            }
            Ok(())
        };
        let r = run();
        let _ = go_tx.send(false);
        drop(done_tx);
        let _ = w.join();
        r.map(|()| sorted(out))
    }};
}

/// Fair mutex handoff p50 against PING and against the plain mutex's handoff.
pub fn fair(url: &str, ping_p50: f64, samples: usize) -> Result<Vec<Row>, String> {
    const W: &str = "fair";
    let mut rng = Rng::from_clock();
    let holder = Client::open(url).map_err(s)?;
    let waiter = Client::open(url).map_err(s)?;
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    let (mut plain, mut fair) = (Vec::new(), Vec::new());
    // Alternate in blocks, so that both see the same machine.
    let block = (samples / 5).max(10);
    for _ in 0..samples.div_ceil(block) {
        let name = "bench:fair:plain";
        let channel = format!("locksmith:{{{name}}}:released");
        let h = holder.mutex(name).map_err(s)?;
        let wl = waiter.mutex(name).map_err(s)?;
        plain.extend(handoffs!(block, rng, h, wl, || Ok(numsub(
            &mut con, &channel
        ) >= 1))?);
        let name = "bench:fair:fair";
        let queue = format!("locksmith:{{{name}}}:fair:queue");
        let h = holder.fair_mutex(name).map_err(s)?;
        let wl = waiter.fair_mutex(name).map_err(s)?;
        fair.extend(handoffs!(block, rng, h, wl, || Ok(llen(
            &mut con, &queue
        )? >= 1))?);
    }
    let (plain, fair) = (sorted(plain), sorted(fair));
    let (p50_plain, p50_fair) = (pct(&plain, 0.5), pct(&fair, 0.5));
    Ok(vec![
        Row::new(W, "fair mutex handoff p50", p50_fair, Unit::Us)
            .floor("PING p50", ping_p50, Unit::Us)
            .bar(Bar::RatioAtMost(4.0))
            .note(format!(
                "{} samples, p90 {:.1} µs; two clients in one process; the release grants, \
                 the waiter wakes holding the lock",
                fair.len(),
                pct(&fair, 0.9)
            )),
        Row::new(W, "plain mutex handoff p50, same run", p50_plain, Unit::Us)
            .floor("PING p50", ping_p50, Unit::Us)
            .note(format!(
                "{} samples, p90 {:.1} µs; measured the same way, alternating with the fair \
                 mutex; wake, then an acquire round trip",
                plain.len(),
                pct(&plain, 0.9)
            )),
        Row::new(
            W,
            "fair handoff p50 / plain handoff p50",
            p50_fair / p50_plain,
            Unit::Num,
        )
        .bar(Bar::AtMost(1.0))
        .note("below 1: the fair mutex hands off faster than the plain one"),
    ])
}

/// Runs `cycle` on 8 threads for `d` (after a barrier; set-up outside the window) and returns
/// cycles per second in total.
fn rate<S>(
    d: Duration,
    setup: impl Fn(usize) -> Result<S, String> + Sync,
    cycle: impl Fn(&mut S) -> Result<(), String> + Sync,
) -> Result<f64, String> {
    const THREADS: usize = 8;
    let barrier = Barrier::new(THREADS);
    let counts: Vec<Result<u64, String>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|i| {
                let (barrier, setup, cycle) = (&barrier, &setup, &cycle);
                sc.spawn(move || -> Result<u64, String> {
                    let st = setup(i);
                    barrier.wait();
                    let mut st = st?;
                    let end = Instant::now() + d;
                    let mut n = 0;
                    while Instant::now() < end {
                        cycle(&mut st)?;
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
    for c in counts {
        total += c?;
    }
    Ok(total as f64 / d.as_secs_f64())
}

/// The floor of `rw` and `semaphore`: two PINGs per cycle, 8 threads.
fn ping_pairs(url: &str, d: Duration) -> Result<f64, String> {
    rate(
        d,
        |_| connect(url, Duration::from_secs(5)).map_err(s),
        |con| {
            for _ in 0..2 {
                redis::cmd("PING").query::<String>(con).map_err(s)?;
            }
            Ok(())
        },
    )
}

fn window(samples: usize) -> Duration {
    Duration::from_millis(samples as u64 * 4)
}

/// Read throughput: 8 reader threads (two clients) on one read-write lock.
pub fn rw(url: &str, _ping_p50: f64, samples: usize) -> Result<Vec<Row>, String> {
    const W: &str = "rw";
    let d = window(samples);
    let clients = [Client::open(url).map_err(s)?, Client::open(url).map_err(s)?];
    let floor = ping_pairs(url, d)?;
    let reads = rate(
        d,
        |i| clients[i % 2].rw_lock("bench:rw").map_err(s),
        |l| l.read().map_err(s)?.unlock().map_err(s),
    )?;
    Ok(vec![
        Row::new(W, "read lock cycles/s, 8 readers", reads, Unit::Num)
            .floor("8 threads x 2 PINGs per cycle", floor, Unit::Num)
            .note(format!(
                "{:.1} s window; two clients of 4 threads; readers never wait for each other",
                d.as_secs_f64()
            )),
    ])
}

/// Semaphore cycles: 8 threads (two clients) on 4 permits.
pub fn semaphore(url: &str, _ping_p50: f64, samples: usize) -> Result<Vec<Row>, String> {
    const W: &str = "semaphore";
    let d = window(samples);
    let clients = [Client::open(url).map_err(s)?, Client::open(url).map_err(s)?];
    let floor = ping_pairs(url, d)?;
    let uncontended = rate(
        d,
        |i| clients[i % 2].semaphore("bench:sem:free", 8).map_err(s),
        |sem| sem.acquire().map_err(s)?.unlock().map_err(s),
    )?;
    let contended = rate(
        d,
        |i| clients[i % 2].semaphore("bench:sem:four", 4).map_err(s),
        |sem| sem.acquire().map_err(s)?.unlock().map_err(s),
    )?;
    Ok(vec![
        Row::new(
            W,
            "cycles/s, 8 threads on 8 permits",
            uncontended,
            Unit::Num,
        )
        .floor("8 threads x 2 PINGs per cycle", floor, Unit::Num)
        .note("never waits: the cost of acquire + release"),
        Row::new(W, "cycles/s, 8 threads on 4 permits", contended, Unit::Num)
            .floor("8 threads x 2 PINGs per cycle", floor, Unit::Num)
            .note("half the threads wait at any time; woken by release messages"),
    ])
}
