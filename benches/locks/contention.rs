//! A contended run, both sides: child processes of several threads each take one hot lock
//! and increment a counter inside ([`run_contended`] here, [`child_contend`] in the children).
//! The `contended` and `hot` workloads both use it.

use std::sync::mpsc::Receiver;
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::child::{ChildProc, Waiter, arg, say};
use crate::context::STEP;
use crate::support::{calls_by_command, connect, s};

/// What one contended run measured.
pub(crate) struct Run {
    /// Acquisitions, all processes together.
    pub(crate) count: u64,
    pub(crate) errors: u64,
    /// The longest process's run time, seconds.
    pub(crate) elapsed: f64,
    /// Acquisitions per process.
    pub(crate) per_proc: Vec<u64>,
    /// Waits (µs) of the acquisitions, and of the waits unfinished at the end.
    pub(crate) waits: Vec<f64>,
    pub(crate) censored: Vec<f64>,
    /// The counter at the end (each acquisition added one).
    pub(crate) value: i64,
    /// Redis commandstats before and after.
    pub(crate) s0: std::collections::BTreeMap<String, u64>,
    pub(crate) s1: std::collections::BTreeMap<String, u64>,
}

/// `procs` child processes of `threads` threads each take lock `name` (locksmith's, `kind`
/// "ls", or the naive one, "naive") for `run` and increment a counter inside.
pub(crate) fn run_contended(
    url: &str,
    kind: &str,
    tag: &str,
    procs: usize,
    threads: usize,
    run: Duration,
) -> Result<Run, String> {
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    let name = format!("bench:{tag}:{kind}");
    let counter = format!("bench:counter:{tag}:{kind}");
    let children = (0..procs)
        .map(|i| {
            ChildProc::spawn(
                &format!("{tag}-{kind}-{i}"),
                "contend",
                &[
                    url.to_owned(),
                    name.clone(),
                    kind.into(),
                    threads.to_string(),
                    counter.clone(),
                ],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for c in &children {
        c.expect("ready", Duration::from_secs(60))?;
    }
    redis::cmd("SET")
        .arg(&counter)
        .arg(0)
        .query::<()>(&mut con)
        .map_err(s)?;
    let s0 = calls_by_command(&mut con);
    let run_ms = run.as_millis();
    let mut children = children;
    for c in &mut children {
        c.send(&format!("go {run_ms}"))?;
    }
    let (mut count, mut errors, mut elapsed) = (0u64, 0u64, 0f64);
    let (mut waits, mut censored, mut per_proc) = (Vec::new(), Vec::new(), Vec::new());
    for c in &children {
        let done = c.expect("done", run + Duration::from_secs(60))?;
        let f: Vec<u64> = done
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        count += f.first().copied().unwrap_or(0);
        errors += f.get(1).copied().unwrap_or(0);
        elapsed = elapsed.max(f.get(2).copied().unwrap_or(0) as f64 / 1e6);
        per_proc.push(f.first().copied().unwrap_or(0));
        waits.extend(parse_list(&c.expect("waits", STEP)?));
        censored.extend(parse_list(&c.expect("censored", STEP)?));
    }
    let s1 = calls_by_command(&mut con);
    drop(children);
    let value: i64 = redis::cmd("GET")
        .arg(&counter)
        .query::<Option<i64>>(&mut con)
        .map_err(s)?
        .unwrap_or(0);
    Ok(Run {
        count,
        errors,
        elapsed,
        per_proc,
        waits,
        censored,
        value,
        s0,
        s1,
    })
}

fn parse_list(s: &str) -> Vec<f64> {
    s.split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect()
}

/// The critical section of the contended workload: read, add one, write back.
fn bump(con: &mut redis::Connection, key: &str) -> Result<(), String> {
    let v: Option<i64> = redis::cmd("GET").arg(key).query(con).map_err(s)?;
    redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .query::<()>(con)
        .map_err(s)
}

struct Tally {
    count: u64,
    errors: u64,
    waits: Vec<u64>,
    censored: Vec<u64>,
}

pub(crate) fn child_contend(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let threads: usize = arg(a, 3)?.parse().map_err(s)?;
    let counter = arg(a, 4)?;
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    let ready = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let deadline: Mutex<Option<Instant>> = Mutex::new(None);
    let (tallies, elapsed) = thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let (ready, go, deadline, client) = (&ready, &go, &deadline, client.as_ref());
                sc.spawn(move || -> Result<Tally, String> {
                    let setup = (|| -> Result<(Waiter, redis::Connection), String> {
                        let mut w = Waiter::new(client, url, name)?;
                        // Warm up: the pool connection, a subscription round.
                        w.with_lock(Instant::now() + Duration::from_secs(20), || {}, || Ok(()))?;
                        Ok((w, connect(url, Duration::from_secs(5)).map_err(s)?))
                    })();
                    ready.wait();
                    go.wait();
                    let (mut w, mut crit) = setup?;
                    let end = deadline.lock().map_err(s)?.unwrap_or_else(Instant::now);
                    let mut t = Tally {
                        count: 0,
                        errors: 0,
                        waits: Vec::new(),
                        censored: Vec::new(),
                    };
                    while Instant::now() < end {
                        let start = Instant::now();
                        let mut waited = 0;
                        let r = w.with_lock(
                            end,
                            || {},
                            || {
                                waited = start.elapsed().as_micros() as u64;
                                bump(&mut crit, counter)
                            },
                        );
                        match r {
                            Ok(true) => {
                                t.count += 1;
                                t.waits.push(waited);
                            }
                            Ok(false) => {
                                t.censored.push(start.elapsed().as_micros() as u64);
                                break;
                            }
                            Err(e) => {
                                eprintln!("contend child: {e}");
                                t.errors += 1;
                                // An error after the critical section still counts it.
                                if waited > 0 {
                                    t.count += 1;
                                    t.waits.push(waited);
                                }
                                thread::sleep(Duration::from_millis(10));
                            }
                        }
                    }
                    Ok(t)
                })
            })
            .collect();
        ready.wait();
        say("ready");
        let run = input
            .recv_timeout(Duration::from_secs(120))
            .ok()
            .and_then(|l| l.strip_prefix("go ").and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0);
        let start = Instant::now();
        if let Ok(mut d) = deadline.lock() {
            *d = Some(start + Duration::from_millis(run));
        }
        go.wait();
        let tallies: Vec<Result<Tally, String>> = hs
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect();
        (tallies, start.elapsed())
    });
    let mut all = Tally {
        count: 0,
        errors: 0,
        waits: Vec::new(),
        censored: Vec::new(),
    };
    for t in tallies {
        match t {
            Ok(mut t) => {
                all.count += t.count;
                all.errors += t.errors;
                all.waits.append(&mut t.waits);
                all.censored.append(&mut t.censored);
            }
            Err(e) => {
                eprintln!("contend child thread: {e}");
                all.errors += 1;
            }
        }
    }
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    say(&format!(
        "done {} {} {}",
        all.count,
        all.errors,
        elapsed.as_micros()
    ));
    say(&format!("waits {}", join(&all.waits)));
    say(&format!("censored {}", join(&all.censored)));
    // Wait for the parent to close stdin (the input thread then ends the process).
    let _ = input.recv_timeout(Duration::from_secs(60));
    Ok(())
}
