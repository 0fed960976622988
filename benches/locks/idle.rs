//! Idle waiting: 16 waiters in child processes blocked on a held lock; the commands per
//! second they send while they wait, and whether each gets the lock after the release.

use std::sync::mpsc::Receiver;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::child::{ChildProc, Waiter, arg, say};
use crate::context::{Ctx, NAIVE_LEASE, STEP, THREADS};
use crate::naive::NaiveLock;
use crate::report::{Bar, Row, Unit};
use crate::support::{
    LOG, calls_by_command, client_level, connect, failed_by_command, numsub, s, script_stat, stat,
    stats_brief, stats_delta,
};

pub(crate) fn idle(ctx: &mut Ctx) -> Result<(), String> {
    let mut variants = vec![("ls", Some(Duration::from_secs(30))), ("naive", None)];
    if ctx.plan.idle_short_lease {
        variants.push(("ls", Some(Duration::from_secs(3))));
    }
    for (kind, lease) in variants {
        idle_one(ctx, kind, lease)?;
    }
    Ok(())
}

fn idle_one(ctx: &mut Ctx, kind: &str, lease: Option<Duration>) -> Result<(), String> {
    const W: &str = "idle waiting";
    let url = ctx.url.clone();
    let hold = ctx.plan.idle_hold;
    let label = match lease {
        Some(l) if l != Duration::from_secs(30) => format!("locksmith ({} s lease)", l.as_secs()),
        Some(_) => "locksmith".to_owned(),
        None => "naive".to_owned(),
    };
    let name = format!("bench:idle:{kind}:{}", lease.map_or(0, |l| l.as_secs()));
    let channel = format!("locksmith:{{{name}}}:released");
    let mut con = connect(&url, Duration::from_secs(5)).map_err(s)?;
    let timeout_ms = (hold + Duration::from_secs(20)).as_millis().to_string();
    let mut children = (0..2)
        .map(|i| {
            ChildProc::spawn(
                &format!("idle-{kind}-{i}"),
                "idle-wait",
                &[
                    url.clone(),
                    name.clone(),
                    kind.into(),
                    THREADS.to_string(),
                    timeout_ms.clone(),
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for c in &children {
        c.expect("ready", STEP)?;
    }
    // The holder.
    let holder_client = match lease {
        Some(l) => Some(Client::builder(&url).lease(l).build().map_err(s)?),
        None => None,
    };
    let holder_mutex = match &holder_client {
        Some(c) => Some(c.mutex(&name).map_err(s)?),
        None => None,
    };
    let mut naive_holder = NaiveLock::new(&url, &name, NAIVE_LEASE).map_err(s)?;
    LOG.trace_renewals(true);
    let t_hold = Instant::now();
    let (guard, token) = match &holder_mutex {
        Some(m) => (Some(m.lock().map_err(s)?), None),
        None => (
            None,
            Some(naive_holder.try_acquire().map_err(s)?.ok_or("naive busy")?),
        ),
    };
    for c in &mut children {
        c.send("go")?;
    }
    for c in &children {
        c.expect("started", STEP)?;
    }
    if holder_mutex.is_some() {
        let until = Instant::now() + Duration::from_secs(5);
        while numsub(&mut con, &channel) < 2 && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
    }
    thread::sleep(Duration::from_millis(500));
    let s0 = calls_by_command(&mut con);
    let f0 = failed_by_command(&mut con);
    let (_, renewed0) = LOG.batches();
    let t0 = Instant::now();
    let end = t_hold + hold;
    if end > Instant::now() {
        thread::sleep(end - Instant::now());
    }
    let s1 = calls_by_command(&mut con);
    let f1 = failed_by_command(&mut con);
    let (_, renewed1) = LOG.batches();
    let window = t0.elapsed().as_secs_f64();
    LOG.trace_renewals(false);
    let still_held = guard.as_ref().is_none_or(|g| g.is_held());
    if let Some(g) = guard {
        g.unlock().map_err(s)?;
    }
    if let Some(t) = token {
        naive_holder.release(&t).map_err(s)?;
    }
    let (mut acquired, mut failed) = (0u64, 0u64);
    for c in &children {
        let done = c.expect("done", Duration::from_secs(40))?;
        let f: Vec<u64> = done
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        acquired += f.first().copied().unwrap_or(0);
        failed += f.get(1).copied().unwrap_or(0);
    }
    drop(children);
    let d = stats_delta(&s0, &s1);
    let noscript = script_stat(&stats_delta(&f0, &f1));
    // The holder's part: its renewals (counted from the renewal thread's log) and, on the
    // first renewal on this server, the NOSCRIPT reply and SCRIPT LOAD before the resend.
    let holder = renewed1 - renewed0 + noscript + stat(&d, "script|load");
    let sent = match kind {
        "naive" => stat(&d, "set"),
        _ => client_level(&d),
    }
    .saturating_sub(holder);
    let rate = sent as f64 / window;
    let waiters = 2 * THREADS;
    let mut r = Row::new(
        W,
        &format!("{label}: commands/s sent by {waiters} waiters"),
        rate,
        Unit::PerSec,
    )
    .note(format!(
        "{window:.2} s window of a {:.0} s hold; all commands incl. inside scripts: {} (of which the holder's renewal calls, subtracted: {holder}); holder still held: {still_held}",
        hold.as_secs_f64(),
        stats_brief(&d)
    ));
    if kind == "ls" && lease == Some(Duration::from_secs(30)) {
        // Heartbeat PINGs (0.5/s per process) are the only expected traffic: allow 0.1/s per waiter.
        r = r.bar(Bar::AtMost(0.1 * waiters as f64));
    }
    ctx.row(r);
    if kind == "ls" {
        let attempts = script_stat(&d).saturating_sub(renewed1 - renewed0 + noscript);
        ctx.row(Row::new(
            W,
            &format!("{label}: waiter acquire attempts in the window"),
            attempts as f64,
            Unit::Count,
        )
        .note("TTL-bounded re-checks: each process's leader re-checks when the holder's TTL (as last seen) runs out"));
    }
    ctx.row(
        Row::new(
            W,
            &format!("{label}: waiters that got the lock after release"),
            acquired as f64,
            Unit::Count,
        )
        .bar(Bar::Equals(waiters as f64))
        .note(format!("{failed} timed out or failed")),
    );
    Ok(())
}

pub(crate) fn child_idle(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let threads: usize = arg(a, 3)?.parse().map_err(s)?;
    let timeout = Duration::from_millis(arg(a, 4)?.parse().map_err(s)?);
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    say("ready");
    match input.recv_timeout(Duration::from_secs(120)) {
        Ok(l) if l == "go" => {}
        _ => return Err("no go".into()),
    }
    let results: Vec<Result<bool, String>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let client = client.as_ref();
                sc.spawn(move || -> Result<bool, String> {
                    let deadline = Instant::now() + timeout;
                    let mut w = Waiter::new(client, url, name)?;
                    w.with_lock(deadline, || {}, || Ok(()))
                })
            })
            .collect();
        say("started");
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let acquired = results.iter().filter(|r| matches!(r, Ok(true))).count();
    for r in &results {
        if let Err(e) = r {
            eprintln!("idle child: {e}");
        }
    }
    say(&format!("done {acquired} {}", results.len() - acquired));
    let _ = input.recv_timeout(Duration::from_secs(60));
    Ok(())
}
