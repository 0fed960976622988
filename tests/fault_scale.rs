//! Load and scale: one hot lock across processes with the fenced store and the interval
//! checker, 5,000 locks renewed while the CPU is busy, and 10,000 lock/unlock cycles that
//! leave no subscription, connection, thread or key behind. Scenarios 1, 16 and 17 of
//! `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{checker, load};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use checker::Store;
use common::{RedisServer, TestChild, client_list, lock_keys_left, with_deadline};
use locksmith::Client;

/// The load worker (see `common/load.rs`).
#[test]
fn child_worker() {
    load::child_worker();
}

/// 1. 4 processes x 4 threads on one hot lock, read-modify-write counter in the fenced
///    store: the counter is exact, no two critical sections overlap, tokens increase.
#[test]
fn s01_hot_lock_across_processes() {
    const PROCS: usize = 4;
    const THREADS: u64 = 4;
    const ITERS: u64 = 150;
    let server = RedisServer::start();
    let store = Store::start();
    let name = common::unique_name("s01");
    let envs = [
        ("LS_URL", server.url()),
        ("LS_STORE", store.port().to_string()),
        ("LS_LOCKS", name.clone()),
        ("LS_THREADS", THREADS.to_string()),
        ("LS_ITERS", ITERS.to_string()),
        ("LS_LEASE_MS", "2000".into()),
        ("LS_HOLD_US", "200".into()),
    ];
    let start = Instant::now();
    common::run_children(
        PROCS,
        "child_worker",
        "worker",
        &envs,
        Duration::from_secs(150),
    );
    let elapsed = start.elapsed();
    let total = PROCS as u64 * THREADS * ITERS;
    let t = store.worker_totals();
    let res = store.resource(&name);
    let intervals = store.intervals();
    let f = checker::assert_clean(&intervals);
    let gaps = checker::handoff_gaps_ms(&intervals);
    println!(
        "s01: {total} sections in {elapsed:?}; counter {}; totals {t:?}; {} intervals, {} lost; \
         handoff gaps {}",
        res.value,
        f.intervals,
        f.lost,
        checker::percentiles(&gaps)
    );
    assert_eq!(t["other"] + t["retriable"] + t["timeouts"], 0, "{t:?}");
    assert_eq!(t["acquired"], total);
    assert_eq!(
        res.value, total,
        "lost updates: counter {} of {total}",
        res.value
    );
    assert_eq!(res.accepted, total);
    assert_eq!(res.rejected, 0);
    assert_eq!(f.lost, 0);
    assert_eq!(intervals.len() as u64, total);
    let mut conn = server.conn();
    assert!(lock_keys_left(&mut conn).is_empty());
}

/// 16. One process holds 5,000 locks (lease 2 s) while two threads burn CPU: every renewal
///     sweep finishes in time (validity never drops below lease - 2 renewal intervals) and no
///     lease is lost over 60 s (`LOCKSMITH_FAULTS_HOLD_SECS` to change).
#[test]
fn s16_many_locks_under_cpu_load() {
    const LOCKS: usize = 5000;
    let lease = Duration::from_secs(2);
    let renew = lease / 3;
    let secs: u64 = std::env::var("LOCKSMITH_FAULTS_HOLD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let (_server, url, mut conn) = common::server_url_conn();
    let out = with_deadline(Duration::from_secs(secs + 120), move || {
        let (client, lost) = common::count_losses(Client::builder(url.as_str()).lease(lease));
        let prefix = common::unique_name("s16");
        let locks: Vec<_> = (0..LOCKS)
            .map(|i| client.mutex(&format!("{prefix}-{i}")).unwrap())
            .collect();
        let start = Instant::now();
        let guards: Vec<_> = locks.iter().map(|m| m.lock().unwrap()).collect();
        let acquire_time = start.elapsed();
        let stop = Arc::new(AtomicBool::new(false));
        let burners: Vec<_> = (0..2)
            .map(|_| {
                let stop = Arc::clone(&stop);
                thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    x
                })
            })
            .collect();
        let hold_start = Instant::now();
        let mut min_validity = lease;
        let mut samples = 0;
        let mut min_pttl = i64::MAX;
        let mut rng = checker::Rng::new(16);
        while hold_start.elapsed() < Duration::from_secs(secs) {
            for g in &guards {
                min_validity = min_validity.min(g.validity());
            }
            for _ in 0..10 {
                let i = rng.range(0, LOCKS as u64) as usize;
                let key = common::lock_key(locks[i].name());
                min_pttl = min_pttl.min(common::pttl(&mut conn, &key));
            }
            samples += 1;
            thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::SeqCst);
        for b in burners {
            b.join().unwrap();
        }
        let all_held = guards.iter().all(|g| g.is_held());
        let start = Instant::now();
        for g in guards {
            g.unlock().unwrap();
        }
        let release_time = start.elapsed();
        (
            acquire_time,
            release_time,
            min_validity,
            min_pttl,
            samples,
            all_held,
            lost.load(Ordering::SeqCst),
        )
    });
    let (acquire_time, release_time, min_validity, min_pttl, samples, all_held, lost) = out;
    let floor = lease - renew * 2 - lease / 100 - Duration::from_millis(2);
    println!(
        "s16: {LOCKS} locks acquired in {acquire_time:?}, held {secs} s under 2 CPU burners: \
         minimum validity {min_validity:?} over {samples} sweeps of all guards (floor \
         {floor:?}), minimum PTTL sampled {min_pttl} ms, {lost} losses; released in \
         {release_time:?}"
    );
    assert_eq!(lost, 0);
    assert!(all_held);
    assert!(
        min_pttl > 0,
        "a lock key expired or vanished (PTTL {min_pttl})"
    );
    assert!(
        min_validity >= floor,
        "a renewal sweep ran late: validity fell to {min_validity:?}"
    );
}

/// Entry point of scenario 17's child: 10,000 lock/unlock cycles over 100 names, then the
/// client is dropped; checks its own threads, and the server's subscriptions and clients.
#[test]
fn child_churn() {
    if !common::is_child("churn") {
        return;
    }
    let url = common::child_env("LS_URL");
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let base = common::thread_count();
    let clients_before = client_list(&mut conn).len();
    let prefix = common::unique_name("s17");
    let names: Vec<String> = (0..100).map(|i| format!("{prefix}-{i}")).collect();
    let client = Client::open(url.as_str()).unwrap();
    let start = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let locks: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
            thread::spawn(move || {
                for i in 0..2500 {
                    let g = locks[(t * 37 + i * 7) % locks.len()].lock().unwrap();
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let took = start.elapsed();
    let during = client_list(&mut conn).len();
    drop(client);
    let threads = common::settled_thread_count(base, Duration::from_secs(3));
    let threads_ok = threads == base;
    let mut clients = 0;
    let clients_ok = common::wait_until(Duration::from_secs(3), || {
        clients = client_list(&mut conn).len();
        clients == clients_before
    });
    let mut numsub = redis::cmd("PUBSUB");
    numsub.arg("NUMSUB");
    for n in &names {
        numsub.arg(common::release_channel(n));
    }
    let counts: Vec<(String, u64)> = numsub.query(&mut conn).unwrap();
    let subscribed: Vec<_> = counts.iter().filter(|(_, n)| *n > 0).collect();
    let keys = lock_keys_left(&mut conn);
    println!(
        "s17: 10000 cycles over 100 names in {took:?}; clients {clients_before} before, \
         {during} during, {clients} after the drop; threads {base} before, {threads} after; \
         channels still subscribed {}; lock keys left {}",
        subscribed.len(),
        keys.len()
    );
    assert!(subscribed.is_empty(), "still subscribed: {subscribed:?}");
    assert!(
        clients_ok,
        "connections left open: {clients} vs {clients_before}"
    );
    assert!(threads_ok, "threads left: {threads} vs {base}");
    assert!(keys.is_empty(), "lock keys left: {keys:?}");
}

/// 17. 10,000 lock/unlock cycles over 100 names, then the client drops: no channel still
///     subscribed, its connections closed, threads back to the baseline (in a child process).
#[test]
fn s17_churn_then_drop() {
    let server = RedisServer::start();
    let mut child = TestChild::spawn("child_churn", "churn", &[("LS_URL", server.url())]);
    let status = child.wait_timeout(Duration::from_secs(180));
    assert!(
        status.success(),
        "scenario 17 failed in the child: {status}"
    );
}
