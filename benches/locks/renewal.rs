//! Renewal at scale: 10,000 locks held; the renewal thread's CPU time, Redis's CPU time per
//! renewed lock, the threads the client adds, leases lost, against one script call per lock
//! (the per-lock renew script, as the library sent it before renewals were batched) and a
//! hand-written per-lock renewal thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Mutex as LockMutex};

use crate::context::Ctx;
use crate::naive::{self, NaiveLock};
use crate::report::{Bar, Row, Unit};
use crate::support::{
    LOG, calls_by_command, connect, failed_by_command, new_thread_named, redis_cpu_us, s, stat,
    stats_brief, stats_delta, tasks, thread_count, thread_cpu_ns, usec_by_command,
};

/// What the hand-written renewal thread did: round trips, leases it found lost, the locks.
type NaiveRenewed = (u64, u64, Vec<(String, String)>);

pub(crate) fn renewal(ctx: &mut Ctx) -> Result<(), String> {
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
    let p0 = calls_by_command(&mut con);
    let f0 = failed_by_command(&mut con);
    thread::sleep(every + Duration::from_millis(300));
    let p1 = calls_by_command(&mut con);
    let f1 = failed_by_command(&mut con);
    LOG.trace_renewals(true);
    let s0 = calls_by_command(&mut con);
    let sf0 = failed_by_command(&mut con);
    let u0 = usec_by_command(&mut con);
    let r0 = redis_cpu_us(&mut con)?;
    let c0 = thread_cpu_ns(renew_tid).ok_or("no CPU time")?;
    let t0 = Instant::now();
    thread::sleep(window);
    let c1 = thread_cpu_ns(renew_tid).ok_or("no CPU time")?;
    let r1 = redis_cpu_us(&mut con)?;
    let u1 = usec_by_command(&mut con);
    let s1 = calls_by_command(&mut con);
    let sf1 = failed_by_command(&mut con);
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
    let periods = w / every.as_secs_f64();
    let redis_per_lock = (r1 - r0) / (n as f64 * periods);
    let usec = stats_delta(&u0, &u1);

    // --- the per-lock path: one EVALSHA of the per-lock renew script per lock per period ---
    let one = per_lock_script(&mut con, n, lease, window)?;

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
    let ns0 = calls_by_command(&mut con);
    let nc0 = naive_tid.and_then(thread_cpu_ns);
    let nt0 = Instant::now();
    thread::sleep(window);
    let nc1 = naive_tid.and_then(thread_cpu_ns);
    let ns1 = calls_by_command(&mut con);
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
            (every / 5).min(Duration::from_millis(400)).as_secs_f64() * 1000.0
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
        Row::new(
            W,
            "Redis CPU per renewed lock: one script call per lock",
            one.per_lock,
            Unit::Us,
        )
        .note(format!(
            "used_cpu_user+used_cpu_sys (INFO cpu) over {:.2} s / ({n} locks x {:.1} periods): \
             {n} locks as the library writes them, each renewed by one EVALSHA of \
             src/protocol/scripts/renew.lua per period, pipelined {} per 100 ms as the renewal thread \
             sent them before batching; {} EVALSHA, Redis execution {:.2} µs per call \
             (commandstats)",
            one.window,
            one.periods,
            n / 10,
            one.calls,
            one.exec_per_call
        )),
    );
    ctx.row(
        Row::new(
            W,
            "locksmith Redis CPU per renewed lock",
            redis_per_lock,
            Unit::Us,
        )
        .floor("one script call per lock, same run", one.per_lock, Unit::Us)
        .bar(Bar::RatioAtMost(0.333))
        .note(format!(
            "used_cpu_user+used_cpu_sys (INFO cpu) over the {w:.2} s window / ({n} locks x \
                 {periods:.1} periods); Redis execution of the renewal scripts: {:.0} µs in {} \
                 calls (commandstats)",
            stat(&usec, "evalsha"),
            stat(&d, "evalsha")
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

/// What the per-lock renewal path cost Redis.
struct PerLock {
    /// Redis CPU time per renewed lock, µs.
    per_lock: f64,
    window: f64,
    periods: f64,
    calls: u64,
    exec_per_call: f64,
}

/// Writes `n` locks as the library does and renews each with one `EVALSHA` of the
/// per-lock renew script per period (`lease / 3`) for `window`: a tenth of the locks every
/// tenth of the period, pipelined, as the renewal thread sent them before it batched them.
fn per_lock_script(
    con: &mut redis::Connection,
    n: usize,
    lease: Duration,
    window: Duration,
) -> Result<PerLock, String> {
    let every = lease / 3;
    let lease_ms = lease.as_millis() as u64;
    let script = redis::Script::new(include_str!("../../src/protocol/scripts/renew.lua"));
    script.prepare_invoke().load(con).map_err(s)?;
    let sha = script.get_hash().to_owned();
    let owner = "0123456789abcdef0123456789abcdef:1";
    let keys: Vec<(String, String)> = (0..n)
        .map(|i| {
            (
                format!("locksmith:{{bench:renew-one:{i}}}:lock"),
                format!("g{i}"),
            )
        })
        .collect();
    let mut p = redis::pipe();
    for (k, g) in &keys {
        p.cmd("SET")
            .arg(k)
            .arg(format!("{g}|{owner}|0|1700000000|0"))
            .arg("PX")
            .arg(lease_ms)
            .ignore();
    }
    p.query::<()>(con).map_err(s)?;
    let slices = 10;
    let per_slice = n.div_ceil(slices);
    let renew_slice = |con: &mut redis::Connection, k: usize| -> Result<u64, String> {
        let mut p = redis::pipe();
        for (key, g) in keys.iter().skip(k * per_slice).take(per_slice) {
            p.cmd("EVALSHA")
                .arg(&sha)
                .arg(1)
                .arg(key)
                .arg(format!("{g}|"))
                .arg(lease_ms);
        }
        let r: Vec<i64> = p.query(con).map_err(s)?;
        Ok(r.iter().filter(|&&x| x != 1).count() as u64)
    };
    // One period first (the script is loaded, the keys warm), then the measured window.
    let mut lost = 0;
    let start = Instant::now();
    let slice = every / slices as u32;
    let mut k = 0usize;
    let mut next = start;
    let mut measured: Option<(Instant, f64, Stats2)> = None;
    let mut end = None;
    loop {
        if measured.is_none() && next >= start + every {
            measured = Some((Instant::now(), redis_cpu_us(con)?, Stats2::take(con)));
            end = Some(Instant::now() + window);
        }
        if end.is_some_and(|e| next >= e) {
            break;
        }
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        }
        lost += renew_slice(con, k % slices)?;
        k += 1;
        next += slice;
    }
    let (t0, r0, st0) = measured.ok_or("no measured window")?;
    let r1 = redis_cpu_us(con)?;
    let st1 = Stats2::take(con);
    let w = t0.elapsed().as_secs_f64();
    let _ = redis::cmd("DEL")
        .arg(keys.iter().map(|k| &k.0).collect::<Vec<_>>())
        .query::<i64>(con);
    if lost > 0 {
        return Err(format!("per-lock renew script found {lost} locks gone"));
    }
    let periods = w / every.as_secs_f64();
    let calls = stat(&stats_delta(&st0.calls, &st1.calls), "evalsha");
    let usec = stat(&stats_delta(&st0.usec, &st1.usec), "evalsha");
    Ok(PerLock {
        per_lock: (r1 - r0) / (n as f64 * periods),
        window: w,
        periods,
        calls,
        exec_per_call: usec as f64 / calls.max(1) as f64,
    })
}

/// Calls and execution time by command, taken together.
struct Stats2 {
    calls: locksmith_testkit::Stats,
    usec: locksmith_testkit::Stats,
}

impl Stats2 {
    fn take(con: &mut redis::Connection) -> Stats2 {
        Stats2 {
            calls: calls_by_command(con),
            usec: usec_by_command(con),
        }
    }
}
