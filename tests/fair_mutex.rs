//! The fair mutex on real `redis-server` processes: exclusion across processes, FIFO order
//! across processes, direct hand-off (no acquire round trip after the wake), no barging, dead
//! and paused holders and waiters, time-outs leaving the queue, bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bounds, kinds};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, TestChild, with_deadline};
use kinds::{Kind, SLACK, client_with_lease};
use locksmith::{Client, Error, LostLease};

fn tag(name: &str) -> String {
    format!("locksmith:{{{}}}", common::encode_name(name))
}

fn queue_key(name: &str) -> String {
    format!("{}:fair:queue", tag(name))
}

fn fair_key(name: &str) -> String {
    format!("{}:fair", tag(name))
}

fn llen(conn: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("LLEN").arg(key).query(conn).unwrap()
}

/// Waits until the queue holds `n` waiters (each waiter is in it after its enqueue script).
fn wait_queued(conn: &mut redis::Connection, name: &str, n: usize) {
    assert!(
        common::wait_until(Duration::from_secs(20), || llen(conn, &queue_key(name))
            == n),
        "queue of {name} never reached {n} (now {})",
        llen(conn, &queue_key(name))
    );
}

#[test]
fn lock_reenter_and_try_lock_of_another_owner() {
    let server = RedisServer::start();
    let name = common::unique_name("fair-basic");
    let a = Client::open(server.url()).unwrap();
    let b = Client::open(server.url()).unwrap();
    let la = a.fair_mutex(&name).unwrap();
    let lb = b.fair_mutex(&name).unwrap();
    with_deadline(Duration::from_secs(30), move || {
        let g1 = la.lock().unwrap();
        let g2 = la.try_lock().unwrap().expect("re-entry");
        assert_eq!(g1.fencing_token(), g2.fencing_token());
        assert!(lb.try_lock().unwrap().is_none());
        assert!(
            lb.try_lock_for(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
        drop(g2);
        assert!(la.is_locked().unwrap());
        let t1 = g1.fencing_token();
        g1.unlock().unwrap();
        assert!(!la.is_locked().unwrap());
        let g = lb.try_lock().unwrap().expect("free now");
        assert!(g.fencing_token() > t1);
        assert!(g.is_held());
        g.check().unwrap();
    });
}

/// The woken waiter already holds the lock: between the holder's release and the waiter's
/// guard, exactly one script reaches Redis (the release itself).
#[test]
fn handoff_is_a_grant_without_an_acquire_round_trip() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-grant");
    let holder = Client::open(&url).unwrap();
    let lock = holder.fair_mutex(&name).unwrap();
    let g = lock.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (name2, url2) = (name.clone(), url.clone());
    let w = thread::spawn(move || {
        let c = Client::open(&url2).unwrap();
        let l = c.fair_mutex(&name2).unwrap();
        let g = l.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
        tx.send(g.fencing_token()).unwrap();
        done_rx.recv().unwrap();
        g.unlock().unwrap();
    });
    wait_queued(&mut conn, &name, 1);
    let before = common::script_calls(&mut conn);
    let t = g.fencing_token();
    g.unlock().unwrap();
    let token = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let after = common::script_calls(&mut conn);
    done_tx.send(()).unwrap();
    assert!(token > t);
    assert_eq!(
        after - before,
        1,
        "scripts between release and the waiter's guard"
    );
    w.join().unwrap();
}

/// A release grants the lock inside the release script, so a `try_lock` right after it
/// cannot barge in before the queued waiter (a plain mutex could be taken here).
#[test]
fn try_lock_never_barges_past_a_queued_waiter() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-barge");
    let [a, c] = common::clients(&url);
    let la = a.fair_mutex(&name).unwrap();
    let lc = c.fair_mutex(&name).unwrap();
    for _ in 0..5 {
        let g = la.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        let (name2, url2) = (name.clone(), url.clone());
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let w = thread::spawn(move || {
            let b = Client::open(&url2).unwrap();
            let lb = b.fair_mutex(&name2).unwrap();
            let g = lb.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            done_rx.recv().unwrap();
            g.unlock().unwrap();
        });
        wait_queued(&mut conn, &name, 1);
        g.unlock().unwrap();
        assert!(
            lc.try_lock().unwrap().is_none(),
            "try_lock barged past a queued waiter"
        );
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        done_tx.send(()).unwrap();
        w.join().unwrap();
    }
}

/// A waiter that times out leaves the queue, and the lock is free after the holder's release.
#[test]
fn timed_out_waiter_leaves_the_queue() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-timeout");
    let [a, b] = common::clients(&url);
    let la = a.fair_mutex(&name).unwrap();
    let lb = b.fair_mutex(&name).unwrap();
    let g = la.lock().unwrap();
    let started = Instant::now();
    assert!(
        lb.try_lock_for(Duration::from_millis(300))
            .unwrap()
            .is_none()
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300));
    assert!(waited < Duration::from_millis(300) + SLACK, "{waited:?}");
    assert_eq!(llen(&mut conn, &queue_key(&name)), 0);
    g.unlock().unwrap();
    assert!(!la.is_locked().unwrap(), "granted to a waiter that left");
    // Nothing of the waiter is left, only the release marker (which expires with the lease the
    // holder had left); the slot's fencing mark is not the name's.
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", tag(&name)))
        .query(&mut conn)
        .unwrap();
    keys.sort();
    assert_eq!(keys, vec![format!("{}:released", fair_key(&name))]);
}

/// A queued waiter keeps its place for longer than a lease: the renewal thread renews its
/// heartbeat, so it is not skipped as dead.
#[test]
fn a_long_queued_waiter_keeps_its_place() {
    let lease = Duration::from_millis(600);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-heartbeat");
    let a = client_with_lease(&url, lease);
    let la = a.fair_mutex(&name).unwrap();
    let g = la.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let mut waiters = Vec::new();
    for i in 0..2 {
        let (name2, url2, tx) = (name.clone(), url.clone(), tx.clone());
        waiters.push(thread::spawn(move || {
            let c = client_with_lease(&url2, lease);
            let l = c.fair_mutex(&name2).unwrap();
            let g = l.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
            tx.send(i).unwrap();
            g.unlock().unwrap();
        }));
        wait_queued(&mut conn, &name, i + 1);
    }
    // Three leases in the queue (the holder renews too).
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            llen(&mut conn, &queue_key(&name)),
            2,
            "a live waiter was dropped"
        );
    }
    g.unlock().unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    for w in waiters {
        w.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes
// ---------------------------------------------------------------------------------------------

/// Child: waiters with global indexes `LS_FIRST, LS_FIRST + LS_STEP, ...` (`LS_THREADS` of
/// them); waiter `i` joins the queue once `i` waiters are queued, then records `i` in the
/// list `order:<name>` when it gets the lock.
#[test]
fn child_fifo_waiters() {
    let Some((url, name)) = common::child_url_name("fifo") else {
        return;
    };
    let first: usize = common::child_var("LS_FIRST");
    let step: usize = common::child_var("LS_STEP");
    let threads: usize = common::child_var("LS_THREADS");
    let client = Client::open(&url).unwrap();
    let lock = client.fair_mutex(&name).unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (lock, url, name) = (lock.clone(), url.clone(), name.clone());
            thread::spawn(move || {
                let i = first + k * step;
                let mut conn = redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                wait_queued(&mut conn, &name, i);
                let g = lock.try_lock_for(Duration::from_secs(60)).unwrap().unwrap();
                redis::cmd("RPUSH")
                    .arg(format!("order:{name}"))
                    .arg(format!("{i}:{}", g.fencing_token()))
                    .exec(&mut conn)
                    .unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    println!("done");
}

/// FIFO across processes: 3 processes x 3 threads queue in a known interleaved order behind
/// a holder; the lock goes to them in exactly that order, with increasing tokens.
#[test]
fn fifo_order_across_processes() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-fifo");
    let holder = Client::open(&url).unwrap();
    let lock = holder.fair_mutex(&name).unwrap();
    let g = lock.lock().unwrap();
    let (procs, threads) = (3, 3);
    let children: Vec<TestChild> = (0..procs)
        .map(|p| {
            common::spawn_child(
                "child_fifo_waiters",
                "fifo",
                &url,
                &name,
                &[
                    ("LS_FIRST", p.to_string()),
                    ("LS_STEP", procs.to_string()),
                    ("LS_THREADS", threads.to_string()),
                ],
            )
        })
        .collect();
    wait_queued(&mut conn, &name, procs * threads);
    g.unlock().unwrap();
    for c in &children {
        c.wait_line("done", Duration::from_secs(60));
    }
    let order: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("order:{name}"))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    let idx: Vec<usize> = order
        .iter()
        .map(|s| s.split(':').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(idx, (0..procs * threads).collect::<Vec<_>>(), "not FIFO");
    let tokens: Vec<u64> = order
        .iter()
        .map(|s| s.split(':').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn child_kind_workers() {
    kinds::child_workers();
}

/// Exclusion across 3 processes x 3 threads: no overlapping critical sections, tokens in
/// acquisition order, and the counter exact.
#[test]
fn exclusion_across_processes() {
    kinds::exclusion_across_processes(&[Kind::Fair], 15, "fair-excl");
}

#[test]
fn child_kind_holder() {
    kinds::child_holder();
}

/// Child: joins the queue of the fair mutex (behind a holder), prints `queued` once the queue
/// holds it, and waits.
#[test]
fn child_fair_waiter() {
    let Some((url, name)) = common::child_url_name("fair-waiter") else {
        return;
    };
    let lease = common::child_ms("LS_LEASE_MS");
    let client = client_with_lease(&url, lease);
    let lock = client.fair_mutex(&name).unwrap();
    let (url2, name2) = (url.clone(), name.clone());
    thread::spawn(move || {
        let mut conn = redis::Client::open(url2.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        wait_queued(&mut conn, &name2, 1);
        println!("queued");
    });
    let g = lock.lock().unwrap();
    println!("locked {}", g.fencing_token());
    thread::sleep(Duration::from_secs(60));
}

/// A holder killed with SIGKILL: the queued waiter gets the lock within a lease (+ slack).
#[test]
fn killed_holder_frees_the_lock_within_a_lease() {
    kinds::killed_holder_frees_the_lock_within_a_lease(Kind::Fair, Kind::Fair, "fair-kill");
}

/// A queued waiter killed with SIGKILL is skipped: the holder releases (granting the dead
/// waiter), and the next live waiter gets the lock at most a lease after the kill (+ slack).
#[test]
fn dead_queued_waiter_is_skipped_within_its_bound() {
    let lease = Duration::from_secs(1);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-deadwaiter");
    let holder = client_with_lease(&url, lease);
    let lock = holder.fair_mutex(&name).unwrap();
    let g = lock.lock().unwrap();
    let mut dead = common::spawn_leased("child_fair_waiter", "fair-waiter", &url, &name, lease);
    dead.wait_line("queued", Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    let (url2, name2) = (url.clone(), name.clone());
    let w = thread::spawn(move || {
        let c = client_with_lease(&url2, lease);
        let l = c.fair_mutex(&name2).unwrap();
        let g = l.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
        tx.send((Instant::now(), g.fencing_token())).unwrap();
        g.unlock().unwrap();
    });
    wait_queued(&mut conn, &name, 2);
    let killed = Instant::now();
    dead.kill9();
    // Released at once: granted to the dead waiter, whose heartbeat has not run out yet.
    g.unlock().unwrap();
    let (at, _token) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let waited = at - killed;
    println!("fair: dead queued waiter skipped {waited:?} after the kill");
    assert!(waited <= lease + SLACK, "{waited:?}");
    w.join().unwrap();
}

/// Clients with different leases on one lock: a holder with a long lease (20 s), and waiters
/// with a short one (2 s). The first waiter is killed (SIGKILL) and the holder releases at
/// once, granting the dead waiter. The next live waiter is served at most the *dead waiter's*
/// lease after the kill (+ slack), not the holder's: no message comes when the dead waiter's
/// grant runs out, so the live waiter's sleep must end by the heartbeat deadline of the waiter
/// ahead of it.
#[test]
fn dead_waiter_is_skipped_by_its_own_lease_whoever_releases() {
    let long = Duration::from_secs(20);
    let short = Duration::from_secs(2);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-deadwaiter-leases");
    with_deadline(Duration::from_secs(60), move || {
        let holder = client_with_lease(&url, long);
        let lock = holder.fair_mutex(&name).unwrap();
        let g = lock.lock().unwrap();
        let mut dead = common::spawn_leased("child_fair_waiter", "fair-waiter", &url, &name, short);
        dead.wait_line("queued", Duration::from_secs(30));
        let (tx, rx) = mpsc::channel();
        let (url2, name2) = (url.clone(), name.clone());
        let w = thread::spawn(move || {
            let c = client_with_lease(&url2, short);
            let l = c.fair_mutex(&name2).unwrap();
            let g = l.try_lock_for(Duration::from_secs(40)).unwrap();
            tx.send((Instant::now(), g.is_some())).unwrap();
        });
        wait_queued(&mut conn, &name, 2);
        let killed = Instant::now();
        dead.kill9();
        g.unlock().unwrap();
        let (at, got) = rx.recv_timeout(Duration::from_secs(45)).unwrap();
        let waited = at - killed;
        println!(
            "fair: dead waiter (lease {short:?}) skipped {waited:?} after the kill; holder's \
             lease {long:?}"
        );
        assert!(got, "the live waiter never got the lock");
        assert!(waited <= short + SLACK, "{waited:?}");
        w.join().unwrap();
    });
}

/// A waiter paused (SIGSTOP) past its place's lease queues anew once resumed, and a grant
/// message it reads only then gives it nothing: the message may be one from before the pause,
/// whose grant ran out unseen while another client took the lock. Here the test publishes
/// such a message itself (a token below the holder's), as a delayed one would arrive; the
/// holder keeps the lock, and the waiter is granted after its release, with a higher token.
/// Found by the model test (cluster clock mix, seed 1795839998028: both waiting threads of a
/// process stopped for 4 s took grants that had run out meanwhile).
#[test]
fn a_grant_message_from_before_a_pause_gives_nothing() {
    let lease = Duration::from_secs(1);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-stale-grant");
    with_deadline(Duration::from_secs(60), move || {
        let holder = client_with_lease(&url, lease);
        let lock = holder.fair_mutex(&name).unwrap();
        let g = lock.lock().unwrap();
        let w = common::spawn_leased("child_fair_waiter", "fair-waiter", &url, &name, lease);
        w.wait_line("queued", Duration::from_secs(30));
        let me: String = redis::cmd("LINDEX")
            .arg(queue_key(&name))
            .arg(0)
            .query(&mut conn)
            .unwrap();
        let waiters = format!("{}:fair:waiters", tag(&name));
        let place = |conn: &mut redis::Connection| -> u64 {
            let dl: Option<u64> = redis::cmd("HGET")
                .arg(&waiters)
                .arg(&me)
                .query(conn)
                .unwrap();
            dl.unwrap_or(0)
        };
        let server_ms = |conn: &mut redis::Connection| -> u64 {
            let t: (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
            t.0 * 1000 + t.1 / 1000
        };
        w.signal("STOP");
        let before = place(&mut conn);
        assert!(
            common::wait_until(lease * 5, || server_ms(&mut conn) > before),
            "the paused waiter's place did not run out"
        );
        w.signal("CONT");
        // The waiter's next attempt (within the holder's TTL) queues it anew.
        assert!(
            common::wait_until(Duration::from_secs(10), || place(&mut conn) > before),
            "the resumed waiter did not queue again"
        );
        // Its client makes the place anew when that reply arrives; a message read before
        // then meets the old place, whose validity has passed. Give the reply time to land,
        // so that the message below meets the new place (the case that went wrong).
        thread::sleep(Duration::from_millis(300));
        let stale = g.fencing_token() - 1;
        let channel = format!("{}:fair:grant:{me}", tag(&name));
        let heard: u64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg(stale.to_string())
            .query(&mut conn)
            .unwrap();
        assert_eq!(heard, 1, "the waiter does not listen on {channel}");
        // A waiter that took the message would print its token at once.
        thread::sleep(Duration::from_millis(500));
        assert!(g.is_held());
        let token = g.fencing_token();
        g.unlock().unwrap();
        let got: u64 = w
            .wait_prefixed("locked", Duration::from_secs(10))
            .parse()
            .unwrap();
        assert!(
            got > token,
            "the waiter took the lock with token {got} while the holder (token {token}) held it"
        );
    });
}

/// A holder paused (SIGSTOP) for two leases: a queued waiter gets the lock within a lease
/// (+ slack); once resumed, the paused holder reports itself lost and its unlock is refused.
#[test]
fn paused_holder_loses_the_lock_and_says_so() {
    kinds::paused_holder_loses_the_lock_and_says_so(Kind::Fair, Kind::Fair, "fair-pause");
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_names_and_foreign_keys() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::open(server.url()).unwrap();
    for bad in ["", "a\0b"] {
        assert!(client.fair_mutex(bad).unwrap_err().is_invalid_name());
    }
    assert!(
        client
            .fair_mutex(&"x".repeat(locksmith::MAX_NAME_LEN + 1))
            .unwrap_err()
            .is_invalid_name()
    );
    let name = common::unique_name("fair-foreign");
    redis::cmd("SET")
        .arg(fair_key(&name))
        .arg("not a lock")
        .exec(&mut conn)
        .unwrap();
    let lock = client.fair_mutex(&name).unwrap();
    assert!(matches!(lock.try_lock(), Err(Error::ForeignKey { .. })));
    assert!(matches!(
        lock.try_lock_for(Duration::from_millis(100)),
        Err(Error::ForeignKey { .. })
    ));
    assert!(matches!(lock.holder(), Err(Error::ForeignKey { .. })));
    assert!(matches!(lock.force_unlock(), Err(Error::ForeignKey { .. })));
    let v: String = redis::cmd("GET")
        .arg(fair_key(&name))
        .query(&mut conn)
        .unwrap();
    assert_eq!(v, "not a lock");
    // Names with braces and patterns are separate locks.
    let a = client.fair_mutex("{a}*").unwrap();
    let b = client.fair_mutex("{a}?").unwrap();
    let _ga = a.lock().unwrap();
    assert!(b.try_lock().unwrap().is_some());
}

/// Redis restarts empty while a holder holds and three waiters queue: the holder reports
/// itself lost, the waiters re-queue after the reconnect and all get the lock, one at a time,
/// with tokens above the old holder's; no call blocks past its bound.
#[test]
fn waiters_recover_from_a_redis_restart() {
    kinds::waiters_recover_from_a_redis_restart(Kind::Fair, Kind::Fair, 3, "fair-restart");
}

/// The lock is free but a live waiter is queued (its grant ran out, say): `try_lock` does not
/// take it, and the call grants it to that waiter instead. A waiter whose heartbeat ran out is
/// skipped. (The waiter is written into Redis directly, so the state is exact.)
#[test]
fn try_lock_of_a_free_lock_never_passes_a_live_waiter() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = common::unique_name("fair-free-queue");
    let c = Client::open(server.url()).unwrap();
    let l = c.fair_mutex(&name).unwrap();
    let waiters = format!("{}:fair:waiters", tag(&name));
    let now_ms = |conn: &mut redis::Connection| -> u64 {
        let t: Vec<u64> = redis::cmd("TIME").query(conn).unwrap();
        t[0] * 1000 + t[1] / 1000
    };
    for (id, live) in [("dead-owner/1", false), ("live-owner/2", true)] {
        let now = now_ms(&mut conn);
        let deadline = if live { now + 10_000 } else { now - 1 };
        redis::cmd("RPUSH")
            .arg(queue_key(&name))
            .arg(id)
            .exec(&mut conn)
            .unwrap();
        redis::cmd("HSET")
            .arg(&waiters)
            .arg(id)
            .arg(deadline)
            .exec(&mut conn)
            .unwrap();
    }
    assert!(l.try_lock().unwrap().is_none(), "barged past a live waiter");
    assert_eq!(
        fair_fields(&mut conn, &name)
            .map(|f| f[1].clone())
            .as_deref(),
        Some("live-owner"),
        "the free lock was not granted to the live waiter"
    );
    assert_eq!(
        llen(&mut conn, &queue_key(&name)),
        0,
        "dead waiter not skipped"
    );
}

// ---------------------------------------------------------------------------------------------
// Integrity: the server names the acquisition, the outermost release frees, retries are
// recognised, fence counters expire, losses are reported once
// ---------------------------------------------------------------------------------------------

/// The fair mutex's script as the client sends it (with its shared helpers).
static FAIR_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("fair_mutex.lua").unwrap());
static SEM_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("sem_permits.lua").unwrap());
/// One of the read-write lock's scripts (its write acquire) as the client sends it.
static RW_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("rw_write.lua").unwrap());

fn sha(src: &str) -> String {
    redis::Script::new(src).get_hash().to_string()
}

/// The fields of the fair lock's value (`GEN|OWNER|S|US`, or with `|REQ|REL|COUNT` after a
/// re-entry or an inner release), its waiting flag `|w` left out; `None` when it is missing.
fn fair_fields(conn: &mut redis::Connection, name: &str) -> Option<Vec<String>> {
    let v: Option<String> = redis::cmd("GET").arg(fair_key(name)).query(conn).unwrap();
    let v = v?;
    let v = v.strip_suffix("|w").unwrap_or(&v);
    Some(v.split('|').map(str::to_owned).collect())
}

/// The level count the server keeps for the fair lock.
fn fair_count(conn: &mut redis::Connection, name: &str) -> Option<String> {
    let f = fair_fields(conn, name)?;
    Some(match f.len() {
        4 => "1".to_owned(),
        _ => f.last()?.clone(),
    })
}

/// The fair mutex script's calls of operation `op` on lock `name` (the operation travels as a
/// one-letter bulk string of its own).
fn fair_op(name: &str, op: &str) -> [Vec<u8>; 3] {
    let letter = match op {
        "acquire" => "a",
        "release" => "r",
        other => panic!("no fair mutex operation {other}"),
    };
    [
        sha(&FAIR_LUA).into_bytes(),
        fair_key(name).into_bytes(),
        format!("$1\r\n{letter}\r\n").into_bytes(),
    ]
}

/// Building a client loads every lock type's script, so that none meets `NOSCRIPT` (and an
/// extra round trip) on its first use.
#[test]
fn every_lock_type_script_is_loaded_at_build() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        let _client = Client::open(&url).unwrap();
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(sha(&FAIR_LUA))
            .arg(sha(&SEM_LUA))
            .arg(sha(&RW_LUA))
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            loaded,
            [true, true, true],
            "fair, semaphore, rw scripts loaded"
        );
    });
}

/// An inner release that never reached Redis leaves the server one level higher than the
/// holder; the outermost `unlock()` still frees the lock (or fails), never `Ok` while the key
/// stays.
#[test]
fn lost_inner_release_does_not_keep_the_fair_lock() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::builder(&purl)
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let name = common::unique_name("fair-lost-inner");
        let m = client.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let inner = m.lock().unwrap();
        proxy.black_hole();
        proxy.kill_all();
        let e = inner.unlock().expect_err("a release through a black hole");
        proxy.pass();
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("2"));
        let res = outer.unlock();
        let key_left = common::exists(&mut conn, &fair_key(&name));
        println!("inner release lost ({e}); outermost unlock: {res:?}; key left: {key_left}");
        assert!(
            res.is_err() || !key_left,
            "unlock() returned Ok while the lock stayed held on the server"
        );
        let other = Client::open(&url).unwrap();
        assert!(
            other
                .fair_mutex(&name)
                .unwrap()
                .try_lock()
                .unwrap()
                .is_some(),
            "the lock is still held after the outermost unlock"
        );
    });
}

/// A re-entry whose reply was lost for good (the call and its retry both ran, both replies
/// were cut) leaves the server one level higher; the outermost `unlock()` frees it.
#[test]
fn lost_reentry_reply_does_not_keep_the_fair_lock() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::builder(&purl)
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let name = common::unique_name("fair-lost-reentry");
        let m = client.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let op = fair_op(&name, "acquire");
        let pats: Vec<&[u8]> = op.iter().map(Vec::as_slice).collect();
        proxy.cut_reply_to(&pats, 2);
        let e = m.try_lock().expect_err("a re-entry whose replies were cut");
        assert_eq!(proxy.cuts(), 2, "the replies were not cut");
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("2"));
        assert!(outer.is_held());
        let res = outer.unlock();
        let key_left = common::exists(&mut conn, &fair_key(&name));
        println!("re-entry reply lost ({e}); outermost unlock: {res:?}; key left: {key_left}");
        assert!(
            res.is_err() || !key_left,
            "unlock() returned Ok while the lock stayed held on the server"
        );
        let other = Client::open(&url).unwrap();
        assert!(
            other
                .fair_mutex(&name)
                .unwrap()
                .try_lock()
                .unwrap()
                .is_some()
        );
    });
}

/// A cut acquire reply is recognised on the retry: one level on the server, not two, and no
/// orphan left behind; a cut re-entry reply counts one level, not two.
#[test]
fn cut_fair_acquire_replies_count_once() {
    let (_server, mut conn, proxy, purl) = common::proxied();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::open(&purl).unwrap();
        let name = common::unique_name("fair-cut-acquire");
        let m = client.fair_mutex(&name).unwrap();
        let op = fair_op(&name, "acquire");
        let pats: Vec<&[u8]> = op.iter().map(Vec::as_slice).collect();
        proxy.cut_reply_to(&pats, 1);
        let outer = m.try_lock().unwrap().expect("free");
        assert_eq!(proxy.cuts(), 1, "the reply was not cut");
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
        proxy.cut_reply_to(&pats, 1);
        let inner = m.try_lock().unwrap().expect("a re-entry");
        assert_eq!(proxy.cuts(), 2, "the reply was not cut");
        assert_eq!(inner.fencing_token(), outer.fencing_token());
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("2"));
        inner.unlock().unwrap();
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
        outer.unlock().unwrap();
        assert!(!common::exists(&mut conn, &fair_key(&name)));
    });
}

/// The retry of an outermost release whose reply was cut is recognised while a waiter is
/// queued: the first try granted the lock to the waiter, and the retry must neither fail nor
/// touch the waiter's grant.
#[test]
fn cut_fair_release_reply_leaves_the_next_grant_alone() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::open(&purl).unwrap();
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("fair-cut-release");
        let m = client.fair_mutex(&name).unwrap();
        let theirs = other.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let inner = m.lock().unwrap();
        let op = fair_op(&name, "release");
        let pats: Vec<&[u8]> = op.iter().map(Vec::as_slice).collect();
        proxy.cut_reply_to(&pats, 1);
        inner.unlock().unwrap();
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
        let (tx, rx) = mpsc::channel();
        let (seen_tx, seen_rx) = mpsc::channel::<()>();
        let waiter = thread::spawn(move || {
            let g = theirs
                .try_lock_for(Duration::from_secs(20))
                .unwrap()
                .unwrap();
            tx.send(g.fencing_token()).unwrap();
            // Held until the main thread looked at the key.
            seen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            g.unlock().unwrap();
        });
        wait_queued(&mut conn, &name, 1);
        proxy.cut_reply_to(&pats, 1);
        let t1 = outer.fencing_token();
        outer.unlock().unwrap();
        assert_eq!(proxy.cuts(), 2);
        let t2 = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(t2 > t1);
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
        seen_tx.send(()).unwrap();
        waiter.join().unwrap();
        assert!(!common::exists(&mut conn, &fair_key(&name)));
    });
}

/// The lock key is deleted behind a holder, and the holder re-enters: the server grants a new
/// acquisition. The outer guard is marked lost at once (and reported once); the new guard's
/// release frees the lock.
#[test]
fn fair_reentry_into_a_replaced_acquisition_marks_the_outer_hold_lost() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let (client, lost) = common::lost_log(Client::builder(&url));
        let name = common::unique_name("fair-reenter-replaced");
        let m = client.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let _: () = redis::cmd("DEL")
            .arg(fair_key(&name))
            .query(&mut conn)
            .unwrap();
        let inner = m.try_lock().unwrap().expect("free on the server");
        assert!(
            !outer.is_held(),
            "the outer guard says held, but its acquisition is gone from the server"
        );
        assert!(inner.is_held());
        assert!(inner.fencing_token() > outer.fencing_token());
        assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
        inner.unlock().unwrap();
        assert!(!common::exists(&mut conn, &fair_key(&name)));
        assert!(outer.unlock().is_err());
        drop(m);
        drop(client);
        assert_eq!(lost.lock().unwrap().len(), 1, "lost leases reported");
    });
}

/// A re-entry that finds another owner: the outer hold is lost, says so at once, and is
/// reported once.
#[test]
fn fair_reentry_that_finds_another_owner_marks_the_outer_hold_lost() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let (client, lost) = common::lost_log(Client::builder(&url));
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("fair-reenter-taken");
        let m = client.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let token = outer.fencing_token();
        let _: () = redis::cmd("DEL")
            .arg(fair_key(&name))
            .query(&mut conn)
            .unwrap();
        let theirs = other.fair_mutex(&name).unwrap();
        let g = theirs.try_lock().unwrap().expect("free after the DEL");
        assert!(m.try_lock().unwrap().is_none());
        assert!(!outer.is_held(), "the outer guard still says held");
        drop(g);
        drop(outer);
        drop(m);
        drop(client);
        let reports = lost
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.fencing_token == token)
            .count();
        assert_eq!(reports, 1);
    });
}

/// A re-entry never moves the local deadline past the server's expiry, and never shortens
/// the server's expiry.
#[test]
fn fair_reentry_keeps_the_local_deadline_within_the_server_expiry() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = client_with_lease(&url, Duration::from_secs(5));
        let name = common::unique_name("fair-reenter-expiry");
        let m = client.fair_mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        // A longer expiry on the server (as a slower renewal path might leave): a re-entry
        // must not cut it down to its own lease.
        let _: () = redis::cmd("PEXPIRE")
            .arg(fair_key(&name))
            .arg(60_000)
            .query(&mut conn)
            .unwrap();
        let inner = m.try_lock().unwrap().expect("a re-entry");
        let pttl = common::pttl(&mut conn, &fair_key(&name));
        assert!(
            pttl > 50_000,
            "the re-entry shortened the expiry to {pttl} ms"
        );
        let pttl_ms = u128::try_from(pttl).unwrap();
        assert!(pttl_ms + 1 >= inner.validity().as_millis());
        drop(inner);
        drop(outer);
    });
}

/// Tokens rise from one holder to the next, through a grant to a waiter, raise the name's
/// fencing mark (which expires within a day), and rise across an empty restart.
#[test]
fn fair_tokens_rise_and_raise_the_mark() {
    let mut server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(20), move || {
        let [client, other] = common::clients(&url);
        let name = common::unique_name("fair-tokens");
        let m = client.fair_mutex(&name).unwrap();
        let theirs = other.fair_mutex(&name).unwrap();
        let g = m.lock().unwrap();
        let t1 = g.fencing_token();
        let waiter = thread::spawn(move || {
            let g = theirs.lock().unwrap();
            let t = g.fencing_token();
            g.unlock().unwrap();
            t
        });
        wait_queued(&mut server.conn(), &name, 1);
        g.unlock().unwrap();
        let t2 = waiter.join().unwrap();
        assert!(t2 > t1, "granted {t2} after {t1}");
        let g = m.lock().unwrap();
        let t3 = g.fencing_token();
        assert!(t3 > t2);
        g.unlock().unwrap();
        common::assert_mark_covers(&mut server.conn(), &name, t3);
        server.restart();
        let g = m.lock().unwrap();
        assert!(
            g.fencing_token() > t3,
            "not above the token before the restart"
        );
        g.unlock().unwrap();
    });
}

/// Every blocking call of a fair mutex keeps its documented bound against a stalled server
/// (`SIGSTOP`): `try_lock` and `is_locked` within connect + command timeout, the `_for` /
/// `_until` forms by `max(wait, connect) + command`, `lock()` within `max(retry, connect +
/// command)`, `unlock()` and a guard's drop within connect + command. Twice: first on pooled
/// connections, then on new ones.
#[test]
fn every_fair_call_keeps_its_bound_against_a_stalled_server() {
    bounds::every_call_keeps_its_bound_against_a_stalled_server(&[Kind::Fair]);
}

/// A waiter's place in the queue is not a lease the application holds: when its heartbeat
/// finds it gone (here: the queue deleted behind it), nothing is reported lost, and the waiter
/// still times out as asked.
#[test]
fn a_lost_queue_place_is_not_reported_as_a_lost_lease() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let lost = std::sync::Arc::new(std::sync::Mutex::new(Vec::<LostLease>::new()));
        let l = std::sync::Arc::clone(&lost);
        let client = Client::builder(&url)
            .lease(Duration::from_millis(600))
            .on_lease_lost(move |x| l.lock().unwrap().push(x.clone()))
            .build()
            .unwrap();
        let holder = Client::open(&url).unwrap();
        let name = common::unique_name("fair-place-lost");
        let hm = holder.fair_mutex(&name).unwrap();
        let g = hm.lock().unwrap();
        let m = client.fair_mutex(&name).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let r = m.try_lock_for(Duration::from_secs(3)).unwrap();
            tx.send(r.is_none()).unwrap();
        });
        wait_queued(&mut conn, &name, 1);
        let waiters = format!("{}:fair:waiters", tag(&name));
        let _: () = redis::cmd("DEL")
            .arg(queue_key(&name))
            .arg(&waiters)
            .query(&mut conn)
            .unwrap();
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).unwrap(),
            "not granted"
        );
        waiter.join().unwrap();
        drop(g);
        drop(client);
        let reports = lost.lock().unwrap().len();
        assert_eq!(reports, 0, "a queue place was reported as a lost lease");
    });
}

/// Waiters with leases of different lengths (clients with different settings): a waiter with
/// a short lease never shortens the life of the queue below a longer waiter's place. Before,
/// it set the queue's expiry to its own lease, so the queue could vanish with the longer
/// waiter's place in it, and a later arrival go first.
#[test]
fn a_short_waiter_lease_never_shortens_the_queue() {
    let (server, url) = common::server_url();
    let name = common::unique_name("fair-mixed-leases");
    let holder = Client::open(&url).unwrap();
    let long = client_with_lease(&url, Duration::from_secs(20));
    let short = client_with_lease(&url, Duration::from_secs(1));
    with_deadline(Duration::from_secs(30), move || {
        let lock = holder.fair_mutex(&name).unwrap();
        let guard = lock.lock().unwrap();
        let mut conn = server.conn();
        thread::scope(|s| {
            let waiter = |client: &Client, name: &str| {
                let m = client.fair_mutex(name).unwrap();
                let got = m.try_lock_for(Duration::from_secs(20)).unwrap();
                assert!(got.is_some());
            };
            let (l, n) = (&long, name.as_str());
            let first = s.spawn(move || waiter(l, n));
            wait_queued(&mut conn, &name, 1);
            let sh = &short;
            let second = s.spawn(move || waiter(sh, n));
            wait_queued(&mut conn, &name, 2);
            for key in [queue_key(&name), format!("{}:fair:waiters", tag(&name))] {
                let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
                assert!(
                    pttl > 10_000,
                    "{key} expires in {pttl} ms, before the 20 s lease of a queued waiter"
                );
            }
            drop(guard);
            first.join().unwrap();
            second.join().unwrap();
        });
    });
}

/// A client over several masters (RedLock) is refused by every lock type of the family, with
/// a clear error and nothing left on the masters: a queue, a set of readers or a set of
/// permits cannot be kept by majority vote across independent masters.
#[test]
fn the_lock_family_refuses_a_client_over_several_masters() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let quorum = Client::redlock(&urls).build().unwrap();
    let name = common::unique_name("fair-quorum");
    with_deadline(Duration::from_secs(30), move || {
        let refused = |r: locksmith::Result<bool>| {
            let e = r.unwrap_err();
            assert!(e.is_unsupported(), "{e}");
            assert!(e.to_string().contains("one Redis server"), "{e}");
        };
        let fair = quorum.fair_mutex(&name).unwrap();
        refused(fair.try_lock().map(|g| g.is_some()));
        refused(fair.lock().map(|_| true));
        refused(fair.is_locked());
        refused(
            fair.try_lock_for(Duration::from_millis(100))
                .map(|g| g.is_some()),
        );
        let rw = quorum.rw_lock(&name).unwrap();
        refused(rw.read().map(|_| true));
        refused(rw.try_write().map(|g| g.is_some()));
        let sem = quorum.semaphore(&name, 2).unwrap();
        refused(sem.acquire().map(|_| true));
        refused(
            sem.try_acquire_for(Duration::from_millis(100))
                .map(|p| p.is_some()),
        );
        refused(sem.available().map(|_| true));
        for s in &servers {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("locksmith:*")
                .query(&mut s.conn())
                .unwrap();
            assert!(keys.is_empty(), "{keys:?}");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The waiting flag: a release publishes (grants) only when a waiter flagged the lock
// ---------------------------------------------------------------------------------------------

/// Child: waits for the fair mutex `LS_NAME` with a 30 s lease and prints `got` once it holds
/// it.
#[test]
fn child_fair_long_waiter() {
    let Some((url, name)) = common::child_url_name("fair-long-waiter") else {
        return;
    };
    let client = client_with_lease(&url, Duration::from_secs(30));
    let lock = client.fair_mutex(&name).unwrap();
    let _g = lock.lock().unwrap();
    println!("got");
    thread::sleep(Duration::from_secs(60));
}

/// Uncontended cycles publish nothing. A waiter in another process flags the lock when it
/// queues; the holder then re-enters and releases an inner level (each rewrites the lock's
/// value, which must keep the flag), and its outermost release grants the lock to the waiter
/// at once. With the flag lost, the release would grant nobody and the waiter would sleep
/// until the holder's 30 s lease ran out.
#[test]
fn a_queued_waiter_is_granted_at_the_release_after_a_reentry() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("fair-flag");
    let client = client_with_lease(&url, Duration::from_secs(30));
    let lock = client.fair_mutex(&name).unwrap();
    let before = common::calls(&common::commandstats(&mut conn), "cmdstat_publish");
    for _ in 0..20 {
        lock.lock().unwrap().unlock().unwrap();
    }
    let after = common::calls(&common::commandstats(&mut conn), "cmdstat_publish");
    assert_eq!(after, before, "uncontended cycles published");
    let outer = lock.lock().unwrap();
    let child = TestChild::spawn(
        "child_fair_long_waiter",
        "fair-long-waiter",
        &[("LS_URL", url.clone()), ("LS_NAME", name.clone())],
    );
    wait_queued(&mut conn, &name, 1);
    let inner = lock.lock().unwrap();
    assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("2"));
    inner.unlock().unwrap();
    assert_eq!(fair_count(&mut conn, &name).as_deref(), Some("1"));
    let released = Instant::now();
    outer.unlock().unwrap();
    child.wait_line("got", Duration::from_secs(5));
    let waited = released.elapsed();
    println!("fair: the queued waiter got the lock {waited:?} after the release");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

// ---------------------------------------------------------------------------------------------
// The operator's view: who holds it, who waits, and force_unlock
// ---------------------------------------------------------------------------------------------

/// Another client sees the holder (its label, thread name, levels, token, how long it has held
/// it and its lease left, by the server's clock) and the queue; `force_unlock` grants the lock
/// to the queued waiter (another client) at once, with a larger token, and the old holder is
/// told: its guard says lost within a renewal, `on_lease_lost` is called once, and its unlock
/// is an error.
#[test]
fn another_client_sees_the_holder_and_force_unlock_hands_it_on() {
    common::on_server(Duration::from_secs(40), move |url, mut conn| {
        let name = common::unique_name("fair-operator");
        let lease = Duration::from_millis(1500);
        let (app, lost) = common::lost_log(Client::builder(&url).label("app-1").lease(lease));
        let operator = Client::open(&url).unwrap();
        let seen = operator.fair_mutex(&name).unwrap();
        assert_eq!(seen.holder().unwrap(), None);
        assert_eq!(seen.waiters().unwrap(), 0);

        let (to_holder, from_main) = mpsc::channel::<&str>();
        let (to_main, from_holder) = mpsc::channel::<String>();
        let m = app.fair_mutex(&name).unwrap();
        let holder = thread::Builder::new()
            .name("fair-holder".into())
            .spawn(move || {
                let g = m.lock().unwrap();
                let inner = m.lock().unwrap();
                to_main.send(g.fencing_token().to_string()).unwrap();
                assert_eq!(from_main.recv().unwrap(), "forced");
                let lost_at = Instant::now();
                assert!(
                    common::wait_until(lease + SLACK, || !g.is_held()),
                    "the guard still says held after the force_unlock"
                );
                to_main.send(format!("{:?}", lost_at.elapsed())).unwrap();
                drop(inner);
                let e = g.unlock().expect_err("unlock after a force_unlock");
                to_main.send(e.to_string()).unwrap();
            })
            .unwrap();
        let token: u64 = from_holder.recv().unwrap().parse().unwrap();
        let started = Instant::now();
        thread::sleep(Duration::from_millis(300));
        let h = seen.holder().unwrap().expect("held");
        println!("fair holder: {h:?}");
        assert_eq!(h.label, "app-1");
        assert_eq!(h.thread, "fair-holder");
        assert_eq!(h.hold_count, 2);
        assert_eq!(h.fencing_token, token);
        assert!(h.held_for >= Duration::from_millis(250), "{:?}", h.held_for);
        assert!(h.held_for <= started.elapsed() + SLACK, "{:?}", h.held_for);
        assert!(h.lease_left > Duration::ZERO && h.lease_left <= lease);

        // A waiter of another client queues.
        let waiter_client = client_with_lease(&url, Duration::from_secs(30));
        let (got_tx, got_rx) = mpsc::channel();
        let wname = name.clone();
        let waiter = thread::spawn(move || {
            let g = waiter_client.fair_mutex(&wname).unwrap().lock().unwrap();
            got_tx.send((Instant::now(), g.fencing_token())).unwrap();
            g.unlock().unwrap();
        });
        wait_queued(&mut conn, &name, 1);
        assert_eq!(seen.waiters().unwrap(), 1);

        let forced = Instant::now();
        assert!(seen.force_unlock().unwrap());
        to_holder.send("forced").unwrap();
        let (at, new_token) = got_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let woken = at - forced;
        println!("fair: the waiter held the lock {woken:?} after force_unlock");
        assert!(woken < Duration::from_secs(1), "{woken:?}");
        assert!(new_token > token);
        let told = from_holder.recv().unwrap();
        println!("fair: the old holder saw its loss {told} after force_unlock");
        let e = from_holder.recv().unwrap();
        println!("fair: the old holder's unlock: {e}");
        holder.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(seen.holder().unwrap(), None);
        assert!(!seen.force_unlock().unwrap(), "nothing held");
        drop(app);
        let lost = lost.lock().unwrap();
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(lost[0].fencing_token, token);
    });
}

/// `with_lock`: the closure's value comes back, the lock is held while it runs (another
/// client's `try_lock` fails) and free after; a `force_unlock` by another client during the
/// closure makes it return the release's error, as `unlock` would.
#[test]
fn with_lock_holds_the_lock_around_the_closure_and_reports_a_loss() {
    let server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("fair-with-lock");
    let [ours, theirs] = common::clients::<2>(&url);
    let lock = ours.fair_mutex(&name).unwrap();
    let other = theirs.fair_mutex(&name).unwrap();
    let token = lock
        .with_lock(|guard| {
            assert!(guard.is_held());
            assert!(other.try_lock().unwrap().is_none(), "taken twice");
            guard.fencing_token()
        })
        .unwrap();
    assert!(!lock.is_locked().unwrap(), "still held after with_lock");
    let g = other.try_lock().unwrap().expect("free after with_lock");
    assert!(g.fencing_token() > token);
    g.unlock().unwrap();

    let e = lock
        .with_lock(|_| assert!(other.force_unlock().unwrap()))
        .expect_err("the lock was forced away inside the closure");
    assert!(e.is_lease_lost(), "{e:?}");
    assert!(!lock.is_locked().unwrap());
}

/// The lease of a fixed-lease test: short, so that the tests see it end.
const FIXED: Duration = Duration::from_millis(300);

/// `with_lease`: the lock ends by itself after the fixed lease, unrenewed (the client's lease
/// is 30 s), and a re-entry through a renewed handle does not extend it; another client then
/// takes it. A lease out of bounds is `InvalidConfig`.
#[test]
fn fixed_lease_ends_by_itself() {
    common::on_server(Duration::from_secs(60), |url, mut conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("fair-fixed");
        let plain = a.fair_mutex(&name).unwrap();
        for lease in [
            Duration::ZERO,
            Duration::from_millis(29),
            Duration::from_secs(366 * 24 * 3600),
        ] {
            let err = plain
                .with_lease(lease)
                .expect_err("a bad fixed lease accepted");
            assert!(err.is_invalid_config(), "with_lease({lease:?}): {err}");
        }
        let fixed = plain.with_lease(FIXED).unwrap();
        let start = Instant::now();
        let g = fixed.lock().unwrap();
        let inner = plain.lock().unwrap();
        assert_eq!(g.fencing_token(), inner.fencing_token());
        assert!(common::pttl(&mut conn, &fair_key(&name)) <= 300);
        let other = b.fair_mutex(&name).unwrap();
        let taken = other
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(!g.is_held() && !inner.is_held());
        assert!(inner.unlock().is_err() && g.unlock().is_err());
        taken.unlock().unwrap();
    });
}

/// A waiter with a fixed lease, granted the lock by a release: its fixed lease starts when it
/// takes the grant (no more than the lease is left on the server then), nothing renews or
/// extends it, and the next waiter gets the lock when it ends.
#[test]
fn fixed_lease_waiter_granted_by_a_release() {
    common::on_server(Duration::from_secs(60), |url, mut conn| {
        let [a, b, c] = common::clients::<3>(&url);
        let name = common::unique_name("fair-fixed-grant");
        let first = a.fair_mutex(&name).unwrap().lock().unwrap();
        let (took_tx, took_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let waiter = {
            let lock = c.fair_mutex(&name).unwrap().with_lease(FIXED).unwrap();
            thread::spawn(move || {
                let g = lock
                    .try_lock_for(Duration::from_secs(10))
                    .unwrap()
                    .expect("never granted");
                took_tx.send(Instant::now()).unwrap();
                done_rx.recv().unwrap();
                assert!(!g.is_held(), "the fixed lease was kept");
                assert!(g.unlock().is_err());
            })
        };
        wait_queued(&mut conn, &name, 1);
        first.unlock().unwrap();
        let took = took_rx.recv().unwrap();
        let ttl = common::pttl(&mut conn, &fair_key(&name));
        assert!((0..=300).contains(&ttl), "a fixed grant with {ttl} ms left");
        let taken = b
            .fair_mutex(&name)
            .unwrap()
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease of the granted waiter never ended");
        let held = took.elapsed();
        assert!(
            held + Duration::from_millis(20) >= FIXED,
            "taken {held:?} after the grant"
        );
        done_tx.send(()).unwrap();
        waiter.join().unwrap();
        taken.unlock().unwrap();
    });
}

/// `Client::shutdown` releases a fixed-lease fair lock too: another client takes it at once,
/// long before the 30 s fixed lease would end.
#[test]
fn fixed_lease_released_at_shutdown() {
    common::on_server(Duration::from_secs(30), |url, _conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("fair-fixed-shutdown");
        let g = a
            .fair_mutex(&name)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap()
            .lock()
            .unwrap();
        let other = b.fair_mutex(&name).unwrap();
        assert!(other.try_lock().unwrap().is_none());
        a.shutdown(Duration::from_secs(5)).unwrap();
        let taken = other
            .try_lock()
            .unwrap()
            .expect("still held after the shutdown");
        assert!(matches!(g.unlock(), Err(Error::Shutdown)));
        taken.unlock().unwrap();
    });
}
