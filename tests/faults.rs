//! Fault injection: the scenarios and bad inputs of `FAULTS.md`, each against its own
//! `redis-server`, with child processes for holders that are killed or paused, a TCP proxy for
//! faults on the wire, and the fenced store + interval checker of `tests/support/checker.rs`.
//!
//! Test names start with the scenario number (`s01_` .. `s17_`) or `bad_` for the bad-input
//! table. Every blocking step runs under a test-side deadline. Leases are short (1-2 s) and
//! the slack for a busy 2-core machine is [`SLACK`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/checker.rs"]
mod checker;
mod common;
#[path = "support/load.rs"]
mod load;
#[path = "support/proxy.rs"]
mod proxy;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use checker::{Store, StoreClient};
use common::{RedisServer, TestChild, with_deadline};
use locksmith::{Client, Error};
use proxy::Proxy;

/// Allowance for scheduling delays on a busy 2-core machine running four tests at once.
const SLACK: Duration = Duration::from_millis(400);

const ACQUIRE_LUA: &str = include_str!("../src/scripts/acquire.lua");
const RELEASE_LUA: &str = include_str!("../src/scripts/release.lua");
const RENEW_LUA: &str = include_str!("../src/scripts/renew.lua");

fn sha(src: &str) -> String {
    redis::Script::new(src).get_hash().to_string()
}

/// Loads the three scripts, so that no `NOSCRIPT` round trip shows up in a `MONITOR` count.
fn preload_scripts(conn: &mut redis::Connection) {
    for src in [ACQUIRE_LUA, RELEASE_LUA, RENEW_LUA] {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .exec(conn)
            .unwrap();
    }
}

fn keys_matching(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.sort();
    keys
}

fn lock_keys_left(conn: &mut redis::Connection) -> Vec<String> {
    keys_matching(conn, "locksmith:*:lock")
}

fn client_list(conn: &mut redis::Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines().map(str::to_string).collect()
}

fn pubsub_clients(conn: &mut redis::Connection) -> usize {
    client_list(conn)
        .iter()
        .filter(|l| l.contains("name=locksmith-pubsub"))
        .count()
}

/// `INFO errorstats` as `ERRORNAME -> count`.
fn errorstats(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("errorstats").query(conn).unwrap();
    let mut out = HashMap::new();
    for line in info.lines() {
        if let Some((name, rest)) = line.split_once(':')
            && let Some(name) = name.strip_prefix("errorstat_")
            && let Some(n) = rest.strip_prefix("count=")
        {
            out.insert(name.to_string(), n.trim().parse().unwrap());
        }
    }
    out
}

fn token_of(conn: &mut redis::Connection, name: &str) -> u64 {
    common::hget(conn, &common::lock_key(name), "token")
        .expect("lock key with a token")
        .parse()
        .unwrap()
}

/// Counts the messages published on one channel, from a separate subscriber connection.
struct ChannelSpy {
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ChannelSpy {
    fn start(url: &str, channel: &str) -> ChannelSpy {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (c, s) = (Arc::clone(&count), Arc::clone(&stop));
        let (url, channel) = (url.to_string(), channel.to_string());
        let handle = thread::spawn(move || {
            let client = redis::Client::open(url).unwrap();
            let mut con = client
                .get_connection_with_timeout(Duration::from_secs(5))
                .unwrap();
            let mut ps = con.as_pubsub();
            ps.subscribe(&channel).unwrap();
            ps.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            ready_tx.send(()).unwrap();
            while !s.load(Ordering::SeqCst) {
                match ps.get_message() {
                    Ok(_) => {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.is_timeout() => {}
                    Err(_) => break,
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        ChannelSpy {
            count,
            stop,
            handle: Some(handle),
        }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for ChannelSpy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A holder thread: guards are `!Send`, so the guard lives on its own thread, which watches
/// `is_held()` every 2 ms and unlocks when told.
struct Holder {
    token: u64,
    /// First time `is_held()` was seen false (a loss), if any.
    lost_at: Arc<Mutex<Option<Instant>>>,
    unlock_tx: Sender<()>,
    result_rx: Receiver<(Result<(), Error>, Duration)>,
}

impl Holder {
    fn start(mutex: locksmith::Mutex) -> Holder {
        let (tok_tx, tok_rx) = mpsc::channel();
        let (unlock_tx, unlock_rx) = mpsc::channel::<()>();
        let (result_tx, result_rx) = mpsc::channel();
        let lost_at = Arc::new(Mutex::new(None));
        let lost = Arc::clone(&lost_at);
        thread::spawn(move || {
            let g = mutex.lock().unwrap();
            tok_tx.send(g.fencing_token()).unwrap();
            loop {
                if !g.is_held() {
                    let mut l = lost.lock().unwrap();
                    if l.is_none() {
                        *l = Some(Instant::now());
                    }
                }
                match unlock_rx.recv_timeout(Duration::from_millis(2)) {
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
            let start = Instant::now();
            let r = g.unlock();
            let _ = result_tx.send((r, start.elapsed()));
        });
        let token = tok_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Holder {
            token,
            lost_at,
            unlock_tx,
            result_rx,
        }
    }

    fn lost_at(&self) -> Option<Instant> {
        *self.lost_at.lock().unwrap()
    }

    fn unlock(self) -> (Result<(), Error>, Duration) {
        self.unlock_tx.send(()).unwrap();
        self.result_rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap()
    }
}

/// What a waiter thread saw: when its call returned, the token if it got the lock, how long
/// the call took.
#[derive(Debug)]
struct WaitOutcome {
    at: Instant,
    token: Option<u64>,
    took: Duration,
}

/// Starts a waiter thread: `try_lock_for(wait)`, hold for `hold`, unlock.
fn spawn_waiter(
    mutex: locksmith::Mutex,
    wait: Duration,
    hold: Duration,
    tx: Sender<WaitOutcome>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let start = Instant::now();
        let r = mutex.try_lock_for(wait);
        let at = Instant::now();
        match r {
            Ok(Some(g)) => {
                assert!(g.is_held(), "a waiter got a guard that is not held");
                let token = g.fencing_token();
                thread::sleep(hold);
                let _ = tx.send(WaitOutcome {
                    at,
                    token: Some(token),
                    took: at - start,
                });
                let _ = g.unlock();
            }
            Ok(None) => {
                let _ = tx.send(WaitOutcome {
                    at,
                    token: None,
                    took: at - start,
                });
            }
            Err(e) => panic!("waiter failed: {e}"),
        }
    })
}

/// SIGSTOPs process `pid` now and SIGCONTs it after `d`, from a thread.
fn stop_for(pid: u32, d: Duration) -> JoinHandle<()> {
    let kill = move |sig: &str| {
        let st = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(st.success());
    };
    kill("STOP");
    thread::spawn(move || {
        thread::sleep(d);
        kill("CONT");
    })
}

fn wait_numsub(conn: &mut redis::Connection, channel: &str, n: u64) {
    assert!(
        common::wait_until(Duration::from_secs(10), || common::numsub(conn, channel)
            >= n),
        "{channel}: fewer than {n} subscribers"
    );
}

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

/// The load worker (see `support/load.rs`).
#[test]
fn child_worker() {
    if !common::is_child("worker") {
        return;
    }
    load::run_worker();
}

/// Holds `LS_NAME` with lease `LS_LEASE_MS`, prints `locked`, sleeps until killed.
#[test]
fn child_holder() {
    if !common::is_child("holder") {
        return;
    }
    let url = common::child_env("LS_URL");
    let lease: u64 = common::child_env("LS_LEASE_MS").parse().unwrap();
    let client = Client::builder(url.as_str())
        .lease(Duration::from_millis(lease))
        .build()
        .unwrap();
    let lock = client.mutex(&common::child_env("LS_NAME")).unwrap();
    let _g = lock.lock().unwrap();
    println!("locked");
    thread::sleep(Duration::from_secs(60));
}

/// Holds `LS_NAME` and writes to the fenced store every 100 ms after a `check()`; when the
/// check fails prints `lost`, tries one stale write anyway (prints `stale-rejected` or
/// `stale-accepted`), then unlocks (prints `unlock-err` or `unlock-ok`).
#[test]
fn child_fenced_writer() {
    if !common::is_child("fenced_writer") {
        return;
    }
    let url = common::child_env("LS_URL");
    let name = common::child_env("LS_NAME");
    let lease: u64 = common::child_env("LS_LEASE_MS").parse().unwrap();
    let mut store = StoreClient::connect(common::child_env("LS_STORE").parse().unwrap());
    let client = Client::builder(url.as_str())
        .lease(Duration::from_millis(lease))
        .on_lease_lost(|l| println!("on_lease_lost {} {}", l.name, l.fencing_token))
        .build()
        .unwrap();
    let lock = client.mutex(&name).unwrap();
    let g = lock.lock().unwrap();
    let token = g.fencing_token();
    println!("locked");
    let mut n = 0;
    let mut last = Instant::now();
    loop {
        let gap = last.elapsed();
        last = Instant::now();
        if gap > Duration::from_millis(500) {
            println!("resumed after a gap of {gap:?}");
        }
        if g.check().is_ok() {
            if store.write(&name, token, n) {
                n += 1;
            } else {
                println!("write-rejected-while-held");
            }
        } else {
            println!("lost");
            if store.write(&name, token, 1_000_000) {
                println!("stale-accepted");
            } else {
                println!("stale-rejected");
            }
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    match g.unlock() {
        Err(e) if e.is_lease_lost() => println!("unlock-err"),
        Err(e) => println!("unlock-other-err {e}"),
        Ok(()) => println!("unlock-ok"),
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

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
    let mut children: Vec<_> = (0..PROCS)
        .map(|_| TestChild::spawn("child_worker", "worker", &envs))
        .collect();
    for c in &mut children {
        let status = c.wait_timeout(Duration::from_secs(150));
        assert!(status.success(), "worker failed: {status}");
    }
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

/// 2. A holder process is killed with SIGKILL: the waiter acquires once the lease runs out,
///    within the lease + slack, with no release message.
#[test]
fn s02_killed_holder() {
    let lease = Duration::from_secs(1);
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s02");
    let key = common::lock_key(&name);
    let channel = common::release_channel(&name);
    let mut child = TestChild::spawn(
        "child_holder",
        "holder",
        &[
            ("LS_URL", url.clone()),
            ("LS_NAME", name.clone()),
            ("LS_LEASE_MS", lease.as_millis().to_string()),
        ],
    );
    child.wait_line("locked", Duration::from_secs(30));
    let child_token = token_of(&mut conn, &name);
    let spy = ChannelSpy::start(&url, &channel);
    let waiter = Client::open(url.as_str()).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = spawn_waiter(
        waiter.mutex(&name).unwrap(),
        Duration::from_secs(10),
        Duration::ZERO,
        tx,
    );
    wait_numsub(&mut conn, &channel, 2);
    // Let the holder renew at least once more, so the lease is its own, not the first one.
    thread::sleep(lease / 2);
    let remaining = Duration::from_millis(common::pttl(&mut conn, &key).try_into().unwrap());
    let killed_at = Instant::now();
    child.kill9();
    let out = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let messages = spy.count();
    let waited = out.at - killed_at;
    println!(
        "s02: holder SIGKILLed with {remaining:?} of its {lease:?} lease left; waiter acquired \
         {waited:?} later; {messages} release messages"
    );
    assert!(out.token.unwrap() > child_token);
    assert_eq!(messages, 0, "a release message was published");
    assert!(
        waited + Duration::from_millis(50) >= remaining,
        "acquired {waited:?} after the kill, before the {remaining:?} left ran out"
    );
    assert!(
        waited <= lease + SLACK,
        "acquired only {waited:?} after the kill"
    );
    w.join().unwrap();
}

/// 3. A holder panics inside the critical section: the lock is free at once, and a waiter
///    wakes by pub/sub (one acquire attempt after the release) well under the 30 s lease.
#[test]
fn s03_panicking_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let monitor = common::Monitor::start(server.port());
    let name = common::unique_name("s03");
    let key = common::lock_key(&name);
    let holder = Client::open(url.as_str()).unwrap();
    let hl = holder.mutex(&name).unwrap();
    let (locked_tx, locked_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let _g = hl.lock().unwrap();
        locked_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        panic!("deliberate panic inside the critical section");
    });
    locked_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let waiter = Client::open(url.as_str()).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = spawn_waiter(
        waiter.mutex(&name).unwrap(),
        Duration::from_secs(20),
        Duration::ZERO,
        tx,
    );
    wait_numsub(&mut conn, &common::release_channel(&name), 1);
    thread::sleep(Duration::from_millis(200));
    preload_scripts(&mut conn);
    let mark = monitor.sync(&mut conn);
    let panicked_at = Instant::now();
    go_tx.send(()).unwrap();
    assert!(with_deadline(Duration::from_secs(10), move || h
        .join()
        .is_err()));
    let out = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(out.token.is_some(), "waiter timed out");
    let latency = out.at - panicked_at;
    w.join().unwrap();
    monitor.sync(&mut conn);
    let lines = monitor.since(mark);
    let calls = common::Monitor::script_calls_on(&lines, &key);
    if calls > 3 {
        for l in lines.iter().filter(|l| !l.contains(" lua] ")) {
            println!("s03 monitor: {}", &l[..l.len().min(160)]);
        }
    }
    println!(
        "s03: waiter acquired {latency:?} after the panic (lease 30 s); {calls} script calls on \
         the key since (release + acquire + release)"
    );
    assert!(latency < Duration::from_millis(500), "took {latency:?}");
    // The holder's release on unwind, the waiter's one acquire, the waiter's release.
    assert!(calls <= 3, "{calls} script calls: the waiter polled");
}

/// 4. A holder process writing to the fenced store every 100 ms is stopped (SIGSTOP) for two
///    leases: another owner acquires within the lease + slack; after SIGCONT the holder
///    reports the loss before its next write, within one renewal interval; its stale write is
///    rejected by the store.
#[test]
fn s04_paused_holder_is_fenced() {
    let lease = Duration::from_secs(1);
    let renew = lease / 3;
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let store = Store::start();
    let name = common::unique_name("s04");
    let key = common::lock_key(&name);
    let mut child = TestChild::spawn(
        "child_fenced_writer",
        "fenced_writer",
        &[
            ("LS_URL", url.clone()),
            ("LS_NAME", name.clone()),
            ("LS_STORE", store.port().to_string()),
            ("LS_LEASE_MS", lease.as_millis().to_string()),
        ],
    );
    child.wait_line("locked", Duration::from_secs(30));
    let child_token = token_of(&mut conn, &name);
    thread::sleep(Duration::from_millis(500));
    let stopped_at = Instant::now();
    child.signal("STOP");
    let other = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let lock = other.mutex(&name).unwrap();
    let (g, acquired) = {
        let g = lock
            .try_lock_for(lease * 3)
            .unwrap()
            .expect("no other owner got the lock of a stopped holder");
        (g, stopped_at.elapsed())
    };
    let token = g.fencing_token();
    let mut sc = store.client();
    let v = sc.read(&name);
    assert!(
        sc.write(&name, token, v + 1),
        "the new owner's write was refused"
    );
    let wait = (lease * 2).saturating_sub(stopped_at.elapsed());
    thread::sleep(wait);
    let cont_at = Instant::now();
    child.signal("CONT");
    child.wait_line("lost", Duration::from_secs(5));
    let reported = cont_at.elapsed();
    child.wait_line("stale-rejected", Duration::from_secs(5));
    child.wait_line("unlock-err", Duration::from_secs(5));
    let status = child.wait_timeout(Duration::from_secs(10));
    assert!(status.success());
    let res = store.resource(&name);
    let stale_accepted = res
        .writes
        .iter()
        .filter(|w| w.token == child_token && w.accepted)
        .count();
    println!(
        "s04: other owner acquired {acquired:?} after SIGSTOP (lease {lease:?}); the resumed \
         holder reported the loss {reported:?} after SIGCONT (renewal {renew:?}); store: {} \
         accepted, {} rejected, {stale_accepted} accepted writes by the stale holder, all \
         before the pause",
        res.accepted, res.rejected
    );
    assert!(token > child_token);
    assert!(
        acquired <= lease + SLACK,
        "acquired {acquired:?} after SIGSTOP"
    );
    assert!(
        reported <= renew + SLACK,
        "loss reported {reported:?} after SIGCONT"
    );
    assert!(res.rejected >= 1, "the stale write was not rejected");
    let new_owner_first = res.writes.iter().find(|w| w.token == token).unwrap().at;
    assert!(
        res.writes
            .iter()
            .filter(|w| w.token == child_token && w.accepted)
            .all(|w| w.at < new_owner_first),
        "a stale write was accepted after the new owner's"
    );
    assert!(g.is_held(), "the stale holder's unlock hurt the new owner");
    assert_eq!(
        common::hget(&mut conn, &key, "token").unwrap(),
        token.to_string()
    );
    g.unlock().unwrap();
}

/// 5. A lock held for 5 leases while 400 acquires time out mid-wait: never taken by another;
///    after the last release no renewal reaches Redis and only the fencing counter remains.
#[test]
fn s05_timed_out_waiters_leave_nothing() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 50;
    let lease = Duration::from_secs(1);
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s05");
    let key = common::lock_key(&name);
    let u = url.clone();
    let n = name.clone();
    let report = with_deadline(Duration::from_secs(60), move || {
        let holder = Client::builder(u.as_str()).lease(lease).build().unwrap();
        let waiters = Client::open(u.as_str()).unwrap();
        let hl = holder.mutex(&n).unwrap();
        let g = hl.lock().unwrap();
        let held_at = Instant::now();
        let got = Arc::new(AtomicUsize::new(0));
        let late = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let m = waiters.mutex(&n).unwrap();
                let (got, late) = (Arc::clone(&got), Arc::clone(&late));
                thread::spawn(move || {
                    let mut rng = checker::Rng::new(t as u64 + 5);
                    for _ in 0..PER_THREAD {
                        let wait = Duration::from_millis(rng.range(5, 40));
                        let start = Instant::now();
                        if m.try_lock_for(wait).unwrap().is_some() {
                            got.fetch_add(1, Ordering::SeqCst);
                        }
                        let over = start.elapsed().saturating_sub(wait);
                        late.fetch_max(over.as_micros() as u64, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let waits_done = held_at.elapsed();
        assert!(g.is_held());
        thread::sleep((lease * 5).saturating_sub(held_at.elapsed()));
        assert!(g.is_held(), "lost the lock while held for 5 leases");
        let owner_ok = g.fencing_token();
        g.unlock().unwrap();
        let channels = format!("{waiters:?}");
        (
            got.load(Ordering::SeqCst),
            Duration::from_micros(late.load(Ordering::SeqCst)),
            waits_done,
            owner_ok,
            channels,
            holder,
            waiters,
        )
    });
    let (got, late, waits_done, _, dbg, holder, waiters) = report;
    let before = common::script_calls(&mut conn);
    thread::sleep(lease * 2);
    let after = common::script_calls(&mut conn);
    let keys = keys_matching(&mut conn, "*");
    let numsub = common::numsub(&mut conn, &common::release_channel(&name));
    println!(
        "s05: {} timed-out acquires done {waits_done:?} into a 5 s hold, {got} got the lock, \
         worst overshoot of a timeout {late:?}; script calls over 2 leases after the release: \
         {}; keys left {keys:?}; {dbg}",
        THREADS * PER_THREAD,
        after - before
    );
    assert_eq!(got, 0, "another owner took a held lock");
    assert!(
        late < Duration::from_millis(300),
        "a timeout overshot by {late:?}"
    );
    assert_eq!(after, before, "renewals reached Redis after the release");
    assert_eq!(keys, vec![common::fence_key(&name)], "keys left behind");
    assert!(!keys.contains(&key));
    assert_eq!(numsub, 0);
    assert!(dbg.contains("subscribed_channels: 0"), "{dbg}");
    drop((holder, waiters));
}

/// 6. Redis is killed and restarted empty on the same port while holders hold and 10 waiters
///    wait: holders report the loss within a renewal interval + slack and `unlock()` errs; the
///    subscribers reconnect and resubscribe; every waiter acquires within 2 s of the restart;
///    tokens after exceed tokens before; no call blocks past its timeout.
#[test]
fn s06_redis_restarts_empty() {
    let lease = Duration::from_millis(1500);
    let renew = lease / 3;
    let mut server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let names = [common::unique_name("s06a"), common::unique_name("s06b")];
    let lost = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let l2 = Arc::clone(&lost);
    let holder = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(Duration::from_secs(1))
        .on_lease_lost(move |l| l2.lock().unwrap().push((l.name.clone(), Instant::now())))
        .build()
        .unwrap();
    let holders: Vec<Holder> = names
        .iter()
        .map(|n| Holder::start(holder.mutex(n).unwrap()))
        .collect();
    let before = holders.iter().map(|h| h.token).max().unwrap();
    let clients: Vec<Client> = (0..2)
        .map(|_| {
            Client::builder(url.as_str())
                .lease(lease)
                .command_timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..10)
        .map(|i| {
            let m = clients[i % 2].mutex(&names[(i / 2) % 2]).unwrap();
            spawn_waiter(
                m,
                Duration::from_secs(20),
                Duration::from_millis(20),
                tx.clone(),
            )
        })
        .collect();
    for n in &names {
        wait_numsub(&mut conn, &common::release_channel(n), 2);
    }
    thread::sleep(Duration::from_millis(200));

    let other = Client::builder(url.as_str())
        .command_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
        .retry_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let probe = other.mutex(&common::unique_name("s06-probe")).unwrap();
    server.stop();
    let down_at = Instant::now();
    let p = probe.clone();
    let (probe_res, probe_took) = with_deadline(Duration::from_secs(10), move || {
        let s = Instant::now();
        let r = p.try_lock().map(|g| g.is_some());
        (r.map_err(|e| e.to_string()), s.elapsed())
    });
    thread::sleep(Duration::from_millis(300).saturating_sub(down_at.elapsed()));
    server.restart();
    let up_at = Instant::now();
    let mut conn = server.conn();

    let mut outcomes = Vec::new();
    for _ in 0..10 {
        outcomes.push(
            rx.recv_timeout(Duration::from_secs(10))
                .expect("a waiter hung"),
        );
    }
    for w in waiters {
        w.join().unwrap();
    }
    let pubsub_ok = common::wait_until(Duration::from_secs(3), || pubsub_clients(&mut conn) >= 4);
    let subscribes = common::calls(&common::commandstats(&mut conn), "cmdstat_subscribe");
    let lost_list = lost.lock().unwrap().clone();
    let local_lost: Vec<_> = holders.iter().map(Holder::lost_at).collect();
    let unlocks: Vec<_> = holders.into_iter().map(Holder::unlock).collect();
    let last_acquire = outcomes.iter().map(|o| o.at).max().unwrap();
    let after_min = outcomes.iter().filter_map(|o| o.token).min().unwrap();
    println!(
        "s06: probe during the outage: {probe_res:?} after {probe_took:?}; losses reported \
         {:?} after the restart (renewal {renew:?}); waiters all acquired within {:?} of the \
         restart; tokens before <= {before}, after >= {after_min}; unlocks {:?}; SUBSCRIBEs on \
         the new server: {subscribes}",
        lost_list
            .iter()
            .map(|(_, t)| t.saturating_duration_since(up_at))
            .collect::<Vec<_>>(),
        last_acquire.saturating_duration_since(up_at),
        unlocks
            .iter()
            .map(|(r, d)| (r.as_ref().map_err(ToString::to_string).err(), *d))
            .collect::<Vec<_>>(),
    );
    assert!(
        probe_res.is_err(),
        "a lock call succeeded while Redis was down"
    );
    assert!(
        probe_took < Duration::from_secs(3),
        "probe took {probe_took:?}"
    );
    assert!(
        outcomes.iter().all(|o| o.token.is_some()),
        "a waiter timed out: {outcomes:?}"
    );
    assert!(
        last_acquire.saturating_duration_since(up_at) <= Duration::from_secs(2),
        "waiters took until {:?} after the restart",
        last_acquire.saturating_duration_since(up_at)
    );
    assert!(
        after_min > before,
        "tokens went backwards: {after_min} <= {before}"
    );
    for n in &names {
        let t = lost_list
            .iter()
            .find(|(l, _)| l == n)
            .unwrap_or_else(|| panic!("{n}: loss never reported"))
            .1;
        assert!(
            t.saturating_duration_since(up_at) <= renew + SLACK,
            "{n}: loss reported {:?} after the restart",
            t.saturating_duration_since(up_at)
        );
    }
    assert!(local_lost.iter().all(Option::is_some));
    for (r, took) in &unlocks {
        let e = r.as_ref().expect_err("unlock after the restart succeeded");
        assert!(e.is_lease_lost(), "{e}");
        assert!(*took < Duration::from_secs(1) + SLACK);
    }
    assert!(
        pubsub_ok,
        "pub/sub connections not all back: {:?}",
        client_list(&mut conn)
    );
    assert!(
        subscribes >= 1,
        "no channel was resubscribed after the restart"
    );
    for w in &outcomes {
        assert!(w.took < Duration::from_secs(20));
    }
    drop((holder, clients, other));
}

/// 7. Redis stalls (SIGSTOP, `DEBUG SLEEP`) for 0.3 s: no false loss, calls return within the
///    command timeout. Then it stalls for two leases: the holder's local loss comes before any
///    other owner's grant.
#[test]
fn s07_redis_stalls() {
    let lease = Duration::from_secs(1);
    let cmd_timeout = Duration::from_secs(1);
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s07");
    let lost = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&lost);
    let holder = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(cmd_timeout)
        .on_lease_lost(move |_| {
            l2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let other = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(cmd_timeout)
        .connect_timeout(cmd_timeout)
        .build()
        .unwrap();
    let h = Holder::start(holder.mutex(&name).unwrap());
    thread::sleep(Duration::from_millis(400));

    for stall in ["SIGSTOP", "DEBUG SLEEP"] {
        let m = other.mutex(&name).unwrap();
        let stalled_at = Instant::now();
        // The stall ends by itself after 0.3 s, whatever the calls below do.
        let stall_thread = match stall {
            "SIGSTOP" => stop_for(server.pid(), Duration::from_millis(300)),
            _ => {
                let mut c = server.conn();
                thread::spawn(move || {
                    redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg("0.3")
                        .exec(&mut c)
                        .unwrap();
                })
            }
        };
        thread::sleep(Duration::from_millis(20));
        let (got, took) = with_deadline(Duration::from_secs(10), move || {
            let s = Instant::now();
            let r = m.try_lock().map(|g| g.is_some());
            (r.map_err(|e| e.to_string()), s.elapsed())
        });
        stall_thread.join().unwrap();
        let _ = stalled_at;
        println!("s07: {stall} 0.3 s: try_lock from another client gave {got:?} after {took:?}");
        assert_eq!(got, Ok(false), "{stall}: another client got a held lock");
        assert!(
            took <= cmd_timeout + SLACK,
            "{stall}: try_lock took {took:?}"
        );
        thread::sleep(lease);
        assert!(h.lost_at().is_none(), "{stall}: false loss");
        assert_eq!(
            lost.load(Ordering::SeqCst),
            0,
            "{stall}: false loss reported"
        );
    }

    // Long stall: two leases.
    let m = other.mutex(&name).unwrap();
    server.pause();
    let paused_at = Instant::now();
    let competitor = thread::spawn(move || {
        let g = m.try_lock_for(Duration::from_secs(15)).unwrap();
        let at = Instant::now();
        (at, g.map(|g| g.fencing_token()))
    });
    thread::sleep(lease * 2);
    server.resume();
    let (granted_at, token) =
        with_deadline(Duration::from_secs(20), move || competitor.join().unwrap());
    let local_loss = h.lost_at().expect("the holder never saw its loss");
    let holder_token = h.token;
    let (unlock, _) = h.unlock();
    println!(
        "s07: stall of 2 leases: holder saw its loss {:?} into the stall, the competitor was \
         granted {:?} into it ({:?} later); holder unlock: {:?}",
        local_loss - paused_at,
        granted_at - paused_at,
        granted_at.saturating_duration_since(local_loss),
        unlock.as_ref().err().map(ToString::to_string)
    );
    assert!(token.expect("competitor timed out") > holder_token);
    assert!(
        local_loss < granted_at,
        "another owner was granted the lock before the holder knew"
    );
    assert!(local_loss - paused_at <= lease + SLACK);
    assert!(unlock.unwrap_err().is_lease_lost());
    assert!(
        lost.load(Ordering::SeqCst) >= 1,
        "on_lease_lost was not called"
    );
    let _ = &mut conn;
}

/// 8. `CLIENT PAUSE 1000 WRITE` with holders, waiters and a competitor: nobody acquires during
///    the pause and no holder is falsely lost.
#[test]
fn s08_client_pause_write() {
    let lease = Duration::from_secs(2);
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let held = common::unique_name("s08-held");
    let free = common::unique_name("s08-free");
    let lost = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&lost);
    let a = Client::builder(url.as_str())
        .lease(lease)
        .on_lease_lost(move |_| {
            l2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let b = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let c = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let h = Holder::start(a.mutex(&held).unwrap());
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            spawn_waiter(
                b.mutex(&held).unwrap(),
                Duration::from_secs(10),
                Duration::from_millis(10),
                tx.clone(),
            )
        })
        .collect();
    wait_numsub(&mut conn, &common::release_channel(&held), 1);
    thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .exec(&mut conn)
        .unwrap();
    let pause_end = sent + Duration::from_millis(1000);
    thread::sleep(Duration::from_millis(100));
    let cm = c.mutex(&free).unwrap();
    let competitor = thread::spawn(move || {
        let g = cm.try_lock_for(Duration::from_secs(5)).unwrap();
        (Instant::now(), g.is_some())
    });
    thread::sleep(Duration::from_millis(1400));
    assert!(
        h.lost_at().is_none(),
        "holder falsely lost during the pause"
    );
    let released_at = Instant::now();
    let (r, _) = h.unlock();
    r.unwrap();
    let (c_at, c_got) = with_deadline(Duration::from_secs(10), move || competitor.join().unwrap());
    let mut outs = Vec::new();
    for _ in 0..3 {
        outs.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    println!(
        "s08: competitor acquired {:?} after CLIENT PAUSE was sent (pause 1 s); waiters \
         acquired {:?} after the holder's release at {:?}; losses {}",
        c_at - sent,
        outs.iter()
            .map(|o| o.at.saturating_duration_since(released_at))
            .collect::<Vec<_>>(),
        released_at - sent,
        lost.load(Ordering::SeqCst)
    );
    assert!(c_got);
    assert!(
        c_at >= pause_end,
        "the competitor acquired during the pause"
    );
    for o in &outs {
        assert!(o.token.is_some());
        assert!(
            o.at >= released_at,
            "a waiter acquired while the lock was held"
        );
    }
    assert_eq!(lost.load(Ordering::SeqCst), 0, "a holder was reported lost");
}

/// 9. Load as in 1 (2 processes x 4 threads, nested guards) while `CLIENT KILL TYPE normal`
///    runs every 2 s: every call succeeds or returns a retriable error, depths are right, no
///    overlaps, no orphan keys.
#[test]
fn s09_client_kill_under_load() {
    let lease = Duration::from_secs(2);
    let server = RedisServer::start();
    let store = Store::start();
    let names = [common::unique_name("s09a"), common::unique_name("s09b")];
    let envs = [
        ("LS_URL", server.url()),
        ("LS_STORE", store.port().to_string()),
        ("LS_LOCKS", names.join(",")),
        ("LS_THREADS", "4".into()),
        ("LS_ITERS", "0".into()),
        ("LS_SECS", "9".into()),
        ("LS_LEASE_MS", lease.as_millis().to_string()),
        ("LS_NESTED", "1".into()),
        ("LS_HOLD_US", "500".into()),
    ];
    let mut children: Vec<_> = (0..2)
        .map(|_| TestChild::spawn("child_worker", "worker", &envs))
        .collect();
    let mut killed = Vec::new();
    let start = Instant::now();
    thread::sleep(Duration::from_secs(2));
    while start.elapsed() < Duration::from_secs(9) {
        let mut c = server.conn();
        let n: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut c)
            .unwrap();
        killed.push(n);
        thread::sleep(Duration::from_secs(2));
    }
    for c in &mut children {
        let status = c.wait_timeout(Duration::from_secs(60));
        assert!(status.success(), "worker failed: {status}");
    }
    let ended = Instant::now();
    let t = store.worker_totals();
    let intervals = store.intervals();
    let f = checker::assert_clean(&intervals);
    let mut conn = server.conn();
    let left_at_end = lock_keys_left(&mut conn);
    let gone = common::wait_until(lease + SLACK, || lock_keys_left(&mut conn).is_empty());
    let accepted: u64 = names.iter().map(|n| store.resource(n).accepted).sum();
    let value: u64 = names.iter().map(|n| store.resource(n).value).sum();
    println!(
        "s09: killed {killed:?} normal clients; totals {t:?}; {} intervals; lock keys at the \
         end {left_at_end:?} (gone {:?} later: {gone})",
        f.intervals,
        ended.elapsed()
    );
    assert_eq!(t["other"], 0, "non-retriable errors: {t:?}");
    assert_eq!(t["depth_bad"], 0, "wrong re-entry depth: {t:?}");
    assert_eq!(t["lost"], 0, "{t:?}");
    assert!(t["acquired"] > 100, "too little progress: {t:?}");
    assert_eq!(value, accepted, "lost updates");
    assert_eq!(t["accepted"], accepted);
    assert!(killed.iter().sum::<u64>() >= 4, "CLIENT KILL hit nothing");
    assert!(gone, "orphan lock keys: {:?}", lock_keys_left(&mut conn));
}

/// 10. 10 blocked waiters; `CLIENT KILL TYPE pubsub` and, atomically with it (MULTI), the
///     holder's release, whose message is thus lost: every waiter acquires within about a
///     second, none waits for its timeout.
#[test]
fn s10_release_in_resubscribe_gap() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s10");
    let key = common::lock_key(&name);
    let a = Client::open(url.as_str()).unwrap();
    let b = Client::open(url.as_str()).unwrap();
    let h = Holder::start(a.mutex(&name).unwrap());
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            spawn_waiter(
                b.mutex(&name).unwrap(),
                Duration::from_secs(20),
                Duration::from_millis(10),
                tx.clone(),
            )
        })
        .collect();
    wait_numsub(&mut conn, &common::release_channel(&name), 1);
    thread::sleep(Duration::from_millis(300));
    let owner = common::hget(&mut conn, &key, "owner").unwrap();
    let acquisition = common::hget(&mut conn, &key, "gen").unwrap();
    let (killed, released): (u64, i64) = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .cmd("EVAL")
        .arg(RELEASE_LUA)
        .arg(2)
        .arg(&key)
        .arg(common::fence_key(&name))
        .arg(&owner)
        .arg(common::release_channel(&name))
        .arg("test-gap-release")
        .arg(h.token)
        .arg(&acquisition)
        .query(&mut conn)
        .unwrap();
    let released_at = Instant::now();
    assert_eq!(released, 0);
    let mut outs = Vec::new();
    for _ in 0..10 {
        outs.push(rx.recv_timeout(Duration::from_secs(25)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    let lat: Vec<_> = outs.iter().map(|o| o.at - released_at).collect();
    println!(
        "s10: killed {killed} pub/sub connections with the release; waiters acquired {lat:?} after it"
    );
    assert!(killed >= 1);
    assert!(outs.iter().all(|o| o.token.is_some()), "a waiter timed out");
    assert!(
        lat[0] < Duration::from_secs(1),
        "first waiter after {:?}",
        lat[0]
    );
    assert!(
        *lat.iter().max().unwrap() < Duration::from_millis(1500),
        "last waiter after {:?}",
        lat.iter().max()
    );
    let _ = h.unlock();
}

/// 11. The reply to an acquire (fresh and re-entrant) and to a release (inner and outer
///     level) is cut after the command reached Redis: the retry recognises its own request;
///     depth stays right, no second key, no orphan.
#[test]
fn s11_lost_replies() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let monitor = common::Monitor::start(server.port());
    let proxy = Proxy::start(server.port());
    let purl = proxy.url();
    let name = common::unique_name("s11");
    let key = common::lock_key(&name);
    let n = name.clone();
    let client = Client::builder(purl.as_str())
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let acq = sha(ACQUIRE_LUA);
    let rel = sha(RELEASE_LUA);
    preload_scripts(&mut conn);
    let mark = monitor.sync(&mut conn);
    let m = client.mutex(&n).unwrap();
    let count = |c: &mut redis::Connection| common::hget(c, &key, "count");

    proxy.cut_reply_to(&[acq.as_bytes(), key.as_bytes()], 1);
    let g1 = m.lock().expect("acquire after a cut reply");
    assert_eq!(proxy.cuts(), 1, "the reply was not cut");
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("1"),
        "fresh acquire counted twice"
    );
    assert!(g1.is_held());
    let t1 = g1.fencing_token();

    proxy.cut_reply_to(&[acq.as_bytes(), key.as_bytes()], 1);
    let g2 = m.lock().expect("re-entry after a cut reply");
    assert_eq!(proxy.cuts(), 2);
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("2"),
        "re-entry counted twice"
    );
    assert_eq!(g2.fencing_token(), t1);

    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    g2.unlock().expect("inner release after a cut reply");
    assert_eq!(proxy.cuts(), 3);
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("1"),
        "inner release done twice"
    );
    assert!(g1.is_held());

    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    g1.unlock().expect("outer release after a cut reply");
    assert_eq!(proxy.cuts(), 4);
    assert!(!common::exists(&mut conn, &key), "orphan lock key");
    let keys = keys_matching(&mut conn, "locksmith:*");
    assert_eq!(keys, vec![common::fence_key(&name)], "extra keys");
    monitor.sync(&mut conn);
    let lines = monitor.since(mark);
    let calls = common::Monitor::script_calls_on(&lines, &key);
    if calls != 8 {
        for l in lines.iter().filter(|l| !l.contains(" lua] ")) {
            println!("s11 monitor: {}", &l[..l.len().min(200)]);
        }
    }
    println!(
        "s11: 4 replies cut (acquire, re-entry, inner release, outer release); {calls} script \
         calls reached Redis; depth stayed right; keys left {keys:?}"
    );
    assert_eq!(
        calls, 8,
        "each cut call should have run twice (call + retry)"
    );
    // Another client gets the lock at once: nothing left behind.
    let other = Client::open(server.url().as_str()).unwrap();
    assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
}

/// 11c. The reply to the last release is cut after Redis ran it, and a waiter on another
///      client takes the lock at once on the release message. The holder's retry then finds
///      another owner: that is the release having worked, so `unlock()` is `Ok`, not
///      `NotOwner` (nothing of the new owner's is touched either way).
#[test]
fn s11_cut_release_then_taken_at_once() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let name = common::unique_name("s11c");
    let key = common::lock_key(&name);
    let holder = Client::open(proxy.url().as_str()).unwrap();
    let waiter = Client::open(server.url().as_str()).unwrap();
    let rel = sha(RELEASE_LUA);
    preload_scripts(&mut conn);
    let hl = holder.mutex(&name).unwrap();
    let g = hl.lock().unwrap();
    let wl = waiter.mutex(&name).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = thread::spawn(move || {
        let got = wl.try_lock_for(Duration::from_secs(10)).unwrap();
        let owner_token = got.as_ref().map(|g| g.fencing_token());
        tx.send(owner_token).unwrap();
        // Hold until the holder's unlock has returned.
        thread::sleep(Duration::from_millis(500));
        drop(got);
    });
    wait_numsub(&mut conn, &common::release_channel(&name), 1);
    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    // Bounded by the client's command and connect timeouts (5 s each).
    let res = g.unlock();
    let taken = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    println!(
        "s11c: unlock() after a cut release reply: {res:?}; waiter got token {taken:?}; owner \
         now {:?}",
        common::hget(&mut conn, &key, "owner")
    );
    assert_eq!(proxy.cuts(), 1, "the reply was not cut");
    assert!(taken.is_some(), "the waiter never got the lock");
    assert!(res.is_ok(), "a release that worked was reported as {res:?}");
    w.join().unwrap();
}

/// 11b. An `unlock()` whose release never reached Redis (the connection black-holed) errs
///      with a retriable error; the same thread then locks again. That must be a new
///      acquisition (depth 1, a new fencing token) and its unlock must free the lock; the
///      level left on the server by the failed release must not turn it into a re-entry.
#[test]
fn s11_failed_release_then_relock() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let purl = proxy.url();
    let name = common::unique_name("s11b");
    let key = common::lock_key(&name);
    let client = Client::builder(purl.as_str())
        .lease(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let m = client.mutex(&name).unwrap();
    let g = m.lock().unwrap();
    let first = g.fencing_token();
    proxy.black_hole();
    proxy.kill_all();
    let e = g
        .unlock()
        .expect_err("unlock through a black hole succeeded");
    proxy.pass();
    let left = common::hget(&mut conn, &key, "count");
    let g = m.lock().unwrap();
    let count = common::hget(&mut conn, &key, "count");
    let second = g.fencing_token();
    g.unlock().unwrap();
    let after = common::hget(&mut conn, &key, "count");
    println!(
        "s11b: unlock through a black hole: {e} (retriable {}); count left on the server \
         {left:?}; relock by the same thread: count {count:?}, token {} the first; after its \
         unlock the key has count {after:?}",
        e.is_retriable(),
        if second == first {
            "equal to"
        } else {
            "unlike"
        }
    );
    assert!(e.is_retriable(), "{e}");
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "the relock counted as a re-entry"
    );
    assert!(second > first, "the relock reused the old fencing token");
    assert_eq!(after, None, "the lock stayed held after the last unlock");
}

/// 12. The acquire reply is delayed past the lease: no guard is handed out whose validity has
///     passed; the late acquisition is given back; a later attempt gets a valid guard.
#[test]
fn s12_late_acquire_reply() {
    let lease = Duration::from_millis(500);
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let purl = proxy.url();
    let name = common::unique_name("s12");
    let key = common::lock_key(&name);
    let acq = sha(ACQUIRE_LUA);
    let client = Client::builder(purl.as_str())
        .lease(lease)
        .command_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let m = client.mutex(&name).unwrap();

    // One late reply, then normal ones.
    proxy.delay_reply_to(
        &[acq.as_bytes(), key.as_bytes()],
        Duration::from_millis(800),
        1,
    );
    let (took, validity, held, token) = {
        let start = Instant::now();
        let g = m
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("no guard after one late reply");
        let r = (
            start.elapsed(),
            g.validity(),
            g.is_held(),
            g.fencing_token(),
        );
        assert_eq!(common::hget(&mut conn, &key, "count").as_deref(), Some("1"));
        g.unlock().unwrap();
        r
    };
    println!(
        "s12: one acquire reply delayed 800 ms (lease {lease:?}): guard after {took:?} with \
         validity {validity:?}, token {token}"
    );
    assert_eq!(proxy.delays(), 1);
    assert!(held && validity > Duration::ZERO && validity <= lease);
    assert!(took >= Duration::from_millis(800));

    // Every reply late: never a guard (None or an error), and nothing left behind.
    proxy.delay_reply_to(
        &[acq.as_bytes(), key.as_bytes()],
        Duration::from_millis(800),
        100,
    );
    let start = Instant::now();
    let r = m.try_lock_for(Duration::from_secs(2));
    let took = start.elapsed();
    let out = match &r {
        Ok(Some(g)) => format!("a guard, held {} validity {:?}", g.is_held(), g.validity()),
        Ok(None) => "None".into(),
        Err(e) => format!("error {e}"),
    };
    println!(
        "s12: all acquire replies delayed 800 ms: try_lock_for(2 s) gave {out} after {took:?}"
    );
    assert!(
        !matches!(r, Ok(Some(_))),
        "a guard was handed out although every grant came back after its lease"
    );
    assert!(took < Duration::from_secs(2) + Duration::from_millis(800) + SLACK);
    assert!(common::wait_until(lease + SLACK, || !common::exists(
        &mut conn, &key
    )));
}

/// One lock call of scenario 13, described by its outcome.
type LockCall = Box<dyn FnOnce(&locksmith::Mutex) -> String + Send>;

/// Entry point of scenario 13's child: black holes and closed ports, counted threads.
#[test]
fn child_black_hole() {
    if !common::is_child("black_hole") {
        return;
    }
    let port: u16 = common::child_env("LS_PORT").parse().unwrap();
    let base = common::thread_count();
    let t = Duration::from_millis(300);
    let retry = Duration::from_secs(1);
    let bound_build = t * 2 + SLACK;
    // Per call: up to (retry timeout + one more attempt) of (two tries of connect + command).
    let bound_call = retry + (t * 2) * 2 + SLACK;
    let timed = |what: &str, bound: Duration, f: Box<dyn FnOnce() -> String + Send>| {
        let start = Instant::now();
        let out = with_deadline(Duration::from_secs(20), f);
        let took = start.elapsed();
        println!("s13: {what}: {out} after {took:?}");
        assert!(took <= bound, "{what}: took {took:?}, bound {bound:?}");
        out
    };

    // Connect to a black hole (the kernel accepts, nobody answers) and to a closed port.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_url = format!("redis://127.0.0.1:{}/", hole.local_addr().unwrap().port());
    let closed_url = format!("redis://127.0.0.1:{}/", common::free_port());
    for (what, url) in [
        ("build, black hole", hole_url),
        ("build, closed port", closed_url),
    ] {
        let out = timed(
            what,
            bound_build,
            Box::new(move || {
                match Client::builder(url.as_str())
                    .connect_timeout(t)
                    .command_timeout(t)
                    .build()
                {
                    Ok(_) => "BUILT".into(),
                    Err(e) => format!(
                        "error ({}timeout) {e}",
                        if e.is_timeout() { "" } else { "no " }
                    ),
                }
            }),
        );
        assert!(out.starts_with("error"), "{what}: {out}");
    }
    drop(hole);

    // Commands through a proxy that turns into a black hole, then into a closed port.
    let mut proxy = Proxy::start(port);
    let client = Client::builder(proxy.url().as_str())
        .connect_timeout(t)
        .command_timeout(t)
        .retry_timeout(retry)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = common::unique_name("s13");
    let held = client.mutex(&name).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let (res_tx, res_rx) = mpsc::channel();
    let mut h = Some(thread::spawn(move || {
        let g = held.lock().unwrap();
        res_tx.send(String::new()).unwrap();
        rx.recv().unwrap();
        let start = Instant::now();
        let r = g.is_held();
        let u = g.unlock();
        res_tx
            .send(format!(
                "held {r}, unlock {:?} after {:?}",
                u.err().map(|e| e.to_string()),
                start.elapsed()
            ))
            .unwrap();
    }));
    res_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for phase in ["black hole", "closed port"] {
        if phase == "black hole" {
            proxy.black_hole();
            proxy.kill_all();
        } else {
            proxy.stop();
        }
        let c = client.clone();
        let n = common::unique_name("s13-other");
        let calls: [(&str, LockCall); 4] = [
            (
                "try_lock",
                Box::new(|m| {
                    format!(
                        "{:?}",
                        m.try_lock().map(|g| g.is_some()).map_err(|e| e.to_string())
                    )
                }),
            ),
            (
                "lock",
                Box::new(|m| format!("{:?}", m.lock().map(|_| ()).map_err(|e| e.to_string()))),
            ),
            (
                "try_lock_for(500ms)",
                Box::new(|m| {
                    format!(
                        "{:?}",
                        m.try_lock_for(Duration::from_millis(500))
                            .map(|g| g.is_some())
                            .map_err(|e| e.to_string())
                    )
                }),
            ),
            (
                "is_locked",
                Box::new(|m| format!("{:?}", m.is_locked().map_err(|e| e.to_string()))),
            ),
        ];
        for (what, f) in calls {
            let m = c.mutex(&n).unwrap();
            let out = timed(
                &format!("{phase}: {what}"),
                bound_call,
                Box::new(move || f(&m)),
            );
            assert!(out.starts_with("Err"), "{phase}: {what} succeeded: {out}");
        }
        if phase == "black hole" {
            thread::sleep(Duration::from_secs(1));
            tx.send(()).unwrap();
            let out = res_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            println!("s13: black hole: holder after its lease: {out}");
            assert!(out.starts_with("held false"), "{out}");
            h.take().unwrap().join().unwrap();
        }
    }
    drop(client);
    let mut seen = 0;
    let ok = common::wait_until(Duration::from_secs(3), || {
        seen = common::thread_count();
        seen == base
    });
    println!("s13: threads {seen} after the drop, {base} before");
    assert!(ok, "threads not back to the baseline: {seen} vs {base}");
}

/// 13. A proxy that accepts and never answers, and a closed port: every call errs within its
///     timeout, nothing panics, and the thread count is back to the baseline after the drop
///     (in a child process, where no other test adds threads).
#[test]
fn s13_black_hole_and_closed_port() {
    let server = RedisServer::start();
    let mut child = TestChild::spawn(
        "child_black_hole",
        "black_hole",
        &[("LS_PORT", server.port().to_string())],
    );
    let status = child.wait_timeout(Duration::from_secs(120));
    assert!(
        status.success(),
        "scenario 13 failed in the child: {status}"
    );
}

/// What a third party does to the lock key.
#[derive(Debug, Clone, Copy)]
enum KeyFault {
    Del,
    Pexpire,
}

/// 14. Another connection deletes the lock key (or expires it in 1 ms) while 5 waiters wait:
///     the holder reports the loss within a renewal interval + slack, the waiters acquire
///     without a release message, the holder's `unlock()` errs.
fn key_vanishes(fault: KeyFault) {
    let lease = Duration::from_millis(1500);
    let renew = lease / 3;
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s14");
    let key = common::lock_key(&name);
    let channel = common::release_channel(&name);
    let a = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let b = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let h = Holder::start(a.mutex(&name).unwrap());
    let spy = ChannelSpy::start(&url, &channel);
    let spy_count = Arc::clone(&spy.count);
    let (tx, rx) = mpsc::channel();
    let (seen_tx, seen_rx) = mpsc::channel();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let m = b.mutex(&name).unwrap();
            let (tx, seen_tx, spy_count) = (tx.clone(), seen_tx.clone(), Arc::clone(&spy_count));
            thread::spawn(move || {
                let g = m.try_lock_for(Duration::from_secs(10)).unwrap();
                let at = Instant::now();
                let _ = seen_tx.send(spy_count.load(Ordering::SeqCst));
                let token = g.as_ref().map(|g| g.fencing_token());
                thread::sleep(Duration::from_millis(20));
                drop(g);
                tx.send(WaitOutcome {
                    at,
                    token,
                    took: Duration::ZERO,
                })
                .unwrap();
            })
        })
        .collect();
    wait_numsub(&mut conn, &channel, 2);
    thread::sleep(Duration::from_millis(200));
    let fault_at = Instant::now();
    match fault {
        KeyFault::Del => redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap(),
        KeyFault::Pexpire => redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(1)
            .exec(&mut conn)
            .unwrap(),
    }
    let messages_at_first = seen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut outs = Vec::new();
    for _ in 0..5 {
        outs.push(rx.recv_timeout(Duration::from_secs(15)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    let lost_at = h.lost_at();
    let (unlock, _) = h.unlock();
    let first = outs.iter().map(|o| o.at).min().unwrap() - fault_at;
    println!(
        "s14 {fault:?}: holder saw the loss {:?} after the fault (renewal {renew:?}); first \
         waiter acquired {first:?} after it with {messages_at_first} release messages seen; \
         holder unlock: {:?}",
        lost_at.map(|t| t - fault_at),
        unlock.as_ref().err().map(ToString::to_string)
    );
    let lost_after = lost_at.expect("the holder never saw the loss") - fault_at;
    assert!(
        lost_after <= renew + SLACK,
        "loss seen {lost_after:?} after the fault"
    );
    assert!(outs.iter().all(|o| o.token.is_some()), "a waiter timed out");
    assert_eq!(messages_at_first, 0);
    assert!(
        first <= lease + SLACK,
        "first waiter only {first:?} after the fault"
    );
    assert!(unlock.unwrap_err().is_lease_lost());
    drop(spy);
}

#[test]
fn s14_key_deleted_behind_the_holder() {
    key_vanishes(KeyFault::Del);
}

#[test]
fn s14_key_expired_behind_the_holder() {
    key_vanishes(KeyFault::Pexpire);
}

/// 15. `SCRIPT FLUSH` under load is handled transparently (NOSCRIPT seen by Redis, no error
///     seen by callers); a key of another type at the lock's key gives a clear error, is not
///     deleted, and nothing is reported acquired.
#[test]
fn s15_script_flush_and_foreign_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let client = Client::builder(url.as_str())
        .lease(Duration::from_millis(900))
        .build()
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| common::unique_name("s15")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let locks: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
            let (stop, errors, ops) = (Arc::clone(&stop), Arc::clone(&errors), Arc::clone(&ops));
            thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let m = &locks[i % locks.len()];
                    let r = m.lock().and_then(|g| {
                        let inner = m.lock()?;
                        inner.unlock()?;
                        g.unlock()
                    });
                    match r {
                        Ok(()) => {
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            })
        })
        .collect();
    // Also a holder whose renewals run through flushes (lease 900 ms, renewal every 300 ms).
    let lost = Arc::new(AtomicUsize::new(0));
    let long_name = common::unique_name("s15-long");
    let h = Holder::start(client.mutex(&long_name).unwrap());
    for _ in 0..10 {
        thread::sleep(Duration::from_millis(250));
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert!(h.lost_at().is_none(), "a flush cost a holder its lease");
    h.unlock().0.unwrap();
    let noscript = errorstats(&mut conn).get("NOSCRIPT").copied().unwrap_or(0);
    let errors = errors.lock().unwrap().clone();
    println!(
        "s15: {} lock/unlock cycles across 10 SCRIPT FLUSHes: {} errors, {noscript} NOSCRIPT \
         replies handled",
        ops.load(Ordering::Relaxed),
        errors.len()
    );
    assert!(errors.is_empty(), "errors under SCRIPT FLUSH: {errors:?}");
    assert!(
        noscript >= 1,
        "no NOSCRIPT was ever seen: the fault was not hit"
    );
    assert_eq!(lost.load(Ordering::SeqCst), 0);

    // Foreign keys.
    let name = common::unique_name("s15-foreign");
    let key = common::lock_key(&name);
    let m = client.mutex(&name).unwrap();
    let setups: [(&str, &[&str]); 3] = [
        ("string", &["SET", "KEY", "not a lock"]),
        ("list", &["RPUSH", "KEY", "a", "b"]),
        ("hash without owner", &["HSET", "KEY", "field", "value"]),
    ];
    for (kind, cmd) in setups {
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(if *a == "KEY" { key.as_str() } else { a });
        }
        c.exec(&mut conn).unwrap();
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
        let m2 = m.clone();
        let (r1, r2, r3, took) = with_deadline(Duration::from_secs(20), move || {
            let s = Instant::now();
            let r1 = m2.try_lock().map(|g| g.is_some());
            let r2 = m2
                .try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some());
            let r3 = m2.lock().map(|_| true);
            (r1, r2, r3, s.elapsed())
        });
        println!(
            "s15: foreign {kind}: try_lock -> {:?}; lock -> {:?} ({took:?} for three calls)",
            r1.as_ref().map_err(ToString::to_string),
            r3.as_ref().map_err(ToString::to_string)
        );
        for r in [r1, r2, r3] {
            let e = r.expect_err("a foreign key was reported acquired");
            assert!(
                matches!(&e, Error::ForeignKey { key: k } if *k == key),
                "{kind}: not ForeignKey: {e}"
            );
            assert!(e.is_redis() && !e.is_retriable());
            assert!(e.to_string().contains(&key));
        }
        assert!(took < Duration::from_secs(2), "{kind}: took {took:?}");
        let after: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
        assert_eq!(dump, after, "{kind}: the foreign key was changed");
        assert_eq!(
            common::pttl(&mut conn, &key),
            -1,
            "{kind}: the foreign key got a TTL"
        );
    }
    // A held lock whose key is replaced by a foreign value: the holder loses it, and its
    // unlock leaves the foreign value alone.
    redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
    let h = Holder::start(client.mutex(&name).unwrap());
    redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&key)
        .cmd("SET")
        .arg(&key)
        .arg("taken over")
        .exec(&mut conn)
        .unwrap();
    assert!(
        common::wait_until(Duration::from_millis(300) + SLACK, || h.lost_at().is_some()),
        "holder did not notice the foreign value"
    );
    let (r, _) = h.unlock();
    let e = r.expect_err("unlock of a key replaced by a foreign value succeeded");
    println!("s15: holder's unlock over a foreign value: {e}");
    assert!(matches!(e, Error::ForeignKey { .. }), "{e}");
    let v: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert_eq!(v, "taken over");
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
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let out = with_deadline(Duration::from_secs(secs + 120), move || {
        let lost = Arc::new(AtomicUsize::new(0));
        let l2 = Arc::clone(&lost);
        let client = Client::builder(url.as_str())
            .lease(lease)
            .on_lease_lost(move |_| {
                l2.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
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
    let mut threads = 0;
    let threads_ok = common::wait_until(Duration::from_secs(3), || {
        threads = common::thread_count();
        threads == base
    });
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

// ---------------------------------------------------------------------------------------------
// Bad input not covered by tests/bad_input.rs
// ---------------------------------------------------------------------------------------------

/// A server with one ACL user `user` (password `pw`) that has every permission but `denied`;
/// returns the server and that user's URL.
fn acl_server(user: &str, denied: &[&str]) -> (RedisServer, String) {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER")
        .arg(user)
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    for d in denied {
        c.arg(format!("-{d}"));
    }
    c.exec(&mut conn).unwrap();
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    (server, url)
}

/// An ACL user without `EVAL`/`EVALSHA`: `lock()` gives the server's permission error, and
/// nothing is acquired.
#[test]
fn bad_acl_user_without_eval() {
    let (server, u) = acl_server("noeval", &["eval", "evalsha"]);
    let mut conn = server.conn();
    let name = common::unique_name("acl-noeval");
    let n = name.clone();
    let (r1, r2) = with_deadline(Duration::from_secs(20), move || {
        let c = Client::builder(u.as_str())
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let m = c.mutex(&n).unwrap();
        (m.try_lock().map(|g| g.is_some()), m.lock().map(|_| true))
    });
    for r in [r1, r2] {
        let e = r.expect_err("acquired without EVAL permission");
        println!("bad: ACL without EVAL: {e}");
        assert!(e.is_redis() && !e.is_retriable(), "{e}");
        let msg = e.to_string().to_lowercase();
        assert!(msg.contains("perm") || msg.contains("evalsha"), "{e}");
    }
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
}

/// An ACL user without `PUBLISH`: the release script fails at its `PUBLISH`, and `unlock()`
/// gives the server's error.
#[test]
fn bad_acl_user_without_publish() {
    let (server, u) = acl_server("nopublish", &["publish"]);
    let mut conn = server.conn();
    let name = common::unique_name("acl-nopublish");
    let n = name.clone();
    let r = with_deadline(Duration::from_secs(20), move || {
        let c = Client::builder(u.as_str())
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let m = c.mutex(&n).unwrap();
        let g = m.lock().unwrap();
        g.unlock().map_err(|e| (e.to_string(), e.is_redis()))
    });
    println!(
        "bad: ACL without PUBLISH: unlock -> {r:?}; lock key left: {}",
        common::exists(&mut conn, &common::lock_key(&name))
    );
    let (msg, is_redis) = r.expect_err("unlock without PUBLISH permission reported success");
    assert!(is_redis, "{msg}");
    assert!(
        msg.to_lowercase().contains("perm") || msg.contains("can't run this command"),
        "{msg}"
    );
}

/// An ACL user without `SUBSCRIBE`: its waiters cannot be told of releases, but still make
/// progress by bounded re-checks: a waiter acquires within a second of the release.
#[test]
fn bad_acl_user_without_subscribe() {
    let (server, u) = acl_server("nosubscribe", &["subscribe"]);
    let admin = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("acl-nosubscribe");
    let hm = admin.mutex(&name).unwrap();
    let h = Holder::start(hm);
    let (tx, rx) = mpsc::channel();
    let c = Client::builder(u.as_str()).build().unwrap();
    let w = spawn_waiter(
        c.mutex(&name).unwrap(),
        Duration::from_secs(10),
        Duration::ZERO,
        tx,
    );
    thread::sleep(Duration::from_millis(500));
    let released = Instant::now();
    h.unlock().0.unwrap();
    let out = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    w.join().unwrap();
    println!(
        "bad: ACL without SUBSCRIBE: waiter acquired {:?} after the release",
        out.at - released
    );
    assert!(out.token.is_some());
    assert!(out.at - released < Duration::from_secs(1));
}

/// `maxmemory` reached: `lock()` gives the server's OOM error, never "acquired"; the lock
/// works again once memory is available.
#[test]
fn bad_maxmemory_reached() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let client = Client::builder(url.as_str())
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = common::unique_name("oom");
    let m = client.mutex(&name).unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .exec(&mut conn)
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .exec(&mut conn)
        .unwrap();
    let m2 = m.clone();
    let (r1, r2) = with_deadline(Duration::from_secs(20), move || {
        (
            m2.try_lock().map(|g| g.is_some()),
            m2.try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some()),
        )
    });
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .exec(&mut conn)
        .unwrap();
    for r in [r1, r2] {
        let e = r.expect_err("acquired while Redis is out of memory");
        println!("bad: maxmemory: {e}");
        assert!(e.is_redis(), "{e}");
        assert!(
            e.to_string().to_lowercase().contains("maxmemory") || e.to_string().contains("OOM"),
            "{e}"
        );
    }
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
    let g = m
        .try_lock()
        .unwrap()
        .expect("free once memory is available");
    g.unlock().unwrap();
}

/// Unlock after a loss with nobody holding (`LeaseLost`), with another owner holding
/// (`NotOwner`, the other owner untouched): distinct, clear errors. (A double unlock cannot
/// be written: `unlock` takes the guard by value.)
#[test]
fn bad_unlock_errors_are_distinct() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    with_deadline(Duration::from_secs(30), move || {
        let a = Client::open(url.as_str()).unwrap();
        let b = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("unlock-errs");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();
        let lb = b.mutex(&name).unwrap();

        let g = la.lock().unwrap();
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let lost = g
            .unlock()
            .expect_err("unlock after the key vanished succeeded");

        let g = la.lock().unwrap();
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let gb = lb.lock().unwrap();
        let owner = common::hget(&mut conn, &key, "owner");
        let ttl = common::pttl(&mut conn, &key);
        let other = g
            .unlock()
            .expect_err("unlock of another owner's lock succeeded");
        println!("bad: unlock after loss: {lost}; unlock while another owns it: {other}");
        assert!(matches!(lost, Error::LeaseLost), "{lost:?}");
        assert!(matches!(other, Error::NotOwner), "{other:?}");
        assert!(lost.is_lease_lost() && other.is_lease_lost());
        assert_ne!(lost.to_string(), other.to_string());
        assert_eq!(common::hget(&mut conn, &key, "owner"), owner);
        assert_eq!(common::hget(&mut conn, &key, "count").as_deref(), Some("1"));
        assert!(common::pttl(&mut conn, &key) > ttl - 1000);
        assert!(gb.is_held());
        gb.unlock().unwrap();
    });
}

/// Option errors name the field and the bound.
#[test]
fn bad_option_errors_name_field_and_bound() {
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(20), move || {
        let cases: [(locksmith::Result<Client>, &str, &str); 3] = [
            (
                Client::builder(url.as_str())
                    .lease(Duration::from_millis(29))
                    .build(),
                "lease",
                "30ms",
            ),
            (
                Client::builder(url.as_str())
                    .lease(Duration::from_secs(1))
                    .renew_interval(Duration::from_secs(1))
                    .build(),
                "renew_interval",
                "1s",
            ),
            (
                Client::builder(url.as_str())
                    .command_timeout(Duration::ZERO)
                    .build(),
                "command_timeout",
                "1ms",
            ),
        ];
        for (r, field, bound) in cases {
            let e = r.expect_err("bad option accepted");
            let msg = e.to_string();
            println!("bad: {field}: {msg}");
            assert!(
                matches!(&e, Error::InvalidConfig { field: f, .. } if *f == field),
                "{e:?}"
            );
            assert!(msg.contains(field) && msg.contains(bound), "{msg}");
        }
    });
}
