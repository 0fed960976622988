//! The load worker of the fault and soak tests: threads that take hot locks and do a
//! read-modify-write increment on the fenced store inside each critical section, logging the
//! interval. Run in child processes (`#[test] fn child_worker()` calls [`run_worker`]).
//!
//! Settings come from the environment:
//!
//! | var | meaning |
//! |---|---|
//! | `LS_URL` | Redis URL |
//! | `LS_STORE` | port of the [`Store`](super::checker::Store) |
//! | `LS_LOCKS` | comma-separated lock names (also the store's resource names) |
//! | `LS_THREADS` | worker threads |
//! | `LS_ITERS` | critical sections per thread (0: until `LS_SECS` passed) |
//! | `LS_SECS` | run time when `LS_ITERS` is 0 |
//! | `LS_LEASE_MS` | the client's lease |
//! | `LS_NESTED` | `1`: take a nested guard in each section and check the depth in Redis |
//! | `LS_HOLD_US` | time spent inside the section between read and write |
//! | `LS_SEED` | seed of the lock choice |
//!
//! Totals are reported to the store as `M key value` lines: `acquired`, `accepted`,
//! `rejected`, `retriable`, `other`, `lost`, `depth_bad`, `timeouts`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use super::checker::{Interval, Rng, StoreClient, mono_ns};

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("worker needs env var {var}"))
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

#[derive(Debug, Default)]
struct Totals {
    acquired: AtomicU64,
    accepted: AtomicU64,
    rejected: AtomicU64,
    retriable: AtomicU64,
    other: AtomicU64,
    lost: AtomicU64,
    depth_bad: AtomicU64,
    timeouts: AtomicU64,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// Counts an error of a lock call: retriable (allowed under connection faults) or other.
fn classify(totals: &Totals, what: &str, e: &locksmith::Error) {
    if e.is_retriable() {
        bump(&totals.retriable);
        println!("retriable error from {what}: {e}");
    } else if e.is_lease_lost() {
        bump(&totals.lost);
        println!("lease lost at {what}: {e}");
    } else {
        bump(&totals.other);
        println!("UNEXPECTED error from {what}: {e}");
    }
}

/// The settings of workers of 4 threads on `names` (the store at `store_port`) that run for
/// `secs` with lease `lease`, take a nested guard in each section and stay `hold_us` inside.
pub fn nested_envs(
    url: String,
    store_port: u16,
    names: &[String],
    secs: u64,
    lease: Duration,
    hold_us: u64,
) -> Vec<(&'static str, String)> {
    vec![
        ("LS_URL", url),
        ("LS_STORE", store_port.to_string()),
        ("LS_LOCKS", names.join(",")),
        ("LS_THREADS", "4".into()),
        ("LS_ITERS", "0".into()),
        ("LS_SECS", secs.to_string()),
        ("LS_LEASE_MS", lease.as_millis().to_string()),
        ("LS_NESTED", "1".into()),
        ("LS_HOLD_US", hold_us.to_string()),
    ]
}

/// A Redis connection for depth checks that reconnects after a `CLIENT KILL`.
struct Inspector {
    client: redis::Client,
    conn: Option<redis::Connection>,
}

impl Inspector {
    fn count(&mut self, key: &str) -> Option<String> {
        for _ in 0..5 {
            if self.conn.is_none() {
                self.conn = self
                    .client
                    .get_connection_with_timeout(Duration::from_secs(2))
                    .ok();
            }
            if let Some(c) = self.conn.as_mut() {
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                // The re-entry count of the lock's value (the one parse the tests share).
                match redis::cmd("GET").arg(key).query::<Option<String>>(c) {
                    Ok(v) => {
                        return v
                            .and_then(|v| locksmith_testkit::LockValue::parse(&v))
                            .map(|v| v.count.to_string());
                    }
                    Err(_) => self.conn = None,
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        Some("unreachable".into())
    }
}

/// The load worker's child entry point (`#[test] fn child_worker()` calls it): runs
/// [`run_worker`] in the child of role `worker`, returns at once anywhere else.
pub fn child_worker() {
    if locksmith_testkit::is_child("worker") {
        run_worker();
    }
}

/// Runs the worker threads described by the environment, then reports the totals.
pub fn run_worker() {
    let url = env("LS_URL");
    let store_port: u16 = env("LS_STORE").parse().unwrap();
    let locks: Vec<String> = env("LS_LOCKS").split(',').map(str::to_string).collect();
    let threads: u32 = env("LS_THREADS").parse().unwrap();
    let iters: u64 = env_or("LS_ITERS", "0").parse().unwrap();
    let secs: u64 = env_or("LS_SECS", "10").parse().unwrap();
    let lease = Duration::from_millis(env_or("LS_LEASE_MS", "2000").parse().unwrap());
    let nested = env_or("LS_NESTED", "0") == "1";
    let hold = Duration::from_micros(env_or("LS_HOLD_US", "0").parse().unwrap());
    let seed: u64 = env_or("LS_SEED", "1").parse().unwrap();

    let client = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(Duration::from_secs(2))
        .retry_timeout(Duration::from_secs(5))
        .on_lease_lost(|l| println!("on_lease_lost: {} token {}", l.name, l.fencing_token))
        .build()
        .unwrap();
    let totals = Arc::new(Totals::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let pid = std::process::id();
    let handles: Vec<_> = (0..threads)
        .map(|w| {
            let client = client.clone();
            let locks = locks.clone();
            let totals = Arc::clone(&totals);
            let url = url.clone();
            thread::spawn(move || {
                let mut store = StoreClient::connect(store_port);
                let mut rng = Rng::new(seed ^ (u64::from(pid) << 16) ^ u64::from(w));
                let mut inspector = Inspector {
                    client: redis::Client::open(url).unwrap(),
                    conn: None,
                };
                let mutexes: Vec<_> = locks.iter().map(|n| client.mutex(n).unwrap()).collect();
                let mut done = 0u64;
                loop {
                    if iters > 0 && done >= iters || iters == 0 && Instant::now() >= until {
                        break;
                    }
                    done += 1;
                    let k = rng.range(0, mutexes.len() as u64) as usize;
                    let (m, name) = (&mutexes[k], &locks[k]);
                    let g = match m.try_lock_for(Duration::from_secs(10)) {
                        Ok(Some(g)) => g,
                        Ok(None) => {
                            bump(&totals.timeouts);
                            println!("try_lock_for(10s) timed out on {name}");
                            continue;
                        }
                        Err(e) => {
                            classify(&totals, "lock", &e);
                            continue;
                        }
                    };
                    let start = mono_ns();
                    let token = g.fencing_token();
                    if g.check().is_err() {
                        bump(&totals.lost);
                        store.interval(&super::section(name, w, token, (start, start), false));
                        let _ = g.unlock();
                        continue;
                    }
                    bump(&totals.acquired);
                    if nested {
                        let key = format!("locksmith:{{{name}}}:lock");
                        match m.lock() {
                            Ok(inner) => {
                                let depth = inspector.count(&key);
                                if depth.as_deref() != Some("2") && inner.is_held() {
                                    bump(&totals.depth_bad);
                                    println!("DEPTH nested: count {depth:?}, expected 2");
                                }
                                match inner.unlock() {
                                    Ok(()) => {
                                        let depth = inspector.count(&key);
                                        if depth.as_deref() != Some("1") && g.is_held() {
                                            bump(&totals.depth_bad);
                                            println!("DEPTH after inner unlock: {depth:?}");
                                        }
                                    }
                                    Err(e) => classify(&totals, "inner unlock", &e),
                                }
                            }
                            Err(e) => classify(&totals, "nested lock", &e),
                        }
                    }
                    let v = store.read(name);
                    if !hold.is_zero() {
                        thread::sleep(hold);
                    }
                    if store.write(name, token, v + 1) {
                        bump(&totals.accepted);
                    } else {
                        bump(&totals.rejected);
                        println!("stale write rejected on {name} (token {token})");
                    }
                    let end = mono_ns();
                    let held = g.check().is_ok();
                    store.interval(&super::section(name, w, token, (start, end), held));
                    if !held {
                        println!("holder of {name} reported itself lost (token {token})");
                    }
                    match g.unlock() {
                        Ok(()) => {}
                        Err(e) => classify(&totals, "unlock", &e),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut store = StoreClient::connect(store_port);
    let t = &totals;
    for (k, v) in [
        ("acquired", &t.acquired),
        ("accepted", &t.accepted),
        ("rejected", &t.rejected),
        ("retriable", &t.retriable),
        ("other", &t.other),
        ("lost", &t.lost),
        ("depth_bad", &t.depth_bad),
        ("timeouts", &t.timeouts),
    ] {
        store.report(k, v.load(Ordering::Relaxed));
    }
    println!("worker done");
}
