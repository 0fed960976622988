//! The leased semaphore on real `redis-server` processes: permit accounting across processes
//! (with holders killed and restarted), wake-up on release, dead and paused holders, changing
//! the permit count, bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bounds, checker, kinds};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use checker::{Interval, Store, StoreClient, mono_ns};
use common::{RedisServer, TestChild, with_deadline};
use kinds::{Kind, SLACK, client_with_lease};
use locksmith::{Client, Error};

fn holders_key(name: &str) -> String {
    format!("locksmith:{{{}}}:sem", common::encode_name(name))
}

/// How many acquisitions the semaphore's key holds: one as a string, several as a sorted set
/// (besides its waiting flag), none when missing.
fn holders(conn: &mut redis::Connection, key: &str) -> usize {
    let ty: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
    match ty.as_str() {
        "string" => 1,
        "zset" => {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query(conn)
                .unwrap();
            members.iter().filter(|m| m.as_str() != "w").count()
        }
        _ => 0,
    }
}

/// The largest number of `held` intervals of `lock` open at one time (an end and a start at
/// the same instant do not overlap).
fn max_concurrent(intervals: &[Interval]) -> usize {
    let mut events: Vec<(u64, i32)> = intervals
        .iter()
        .filter(|i| i.held)
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    events.sort();
    let (mut now, mut max) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        max = max.max(now);
    }
    usize::try_from(max).unwrap()
}

#[test]
fn sweep_counts_overlaps() {
    let iv = |s, e, held| Interval {
        lock: "l".into(),
        pid: 1,
        worker: 0,
        token: 0,
        start: s,
        end: e,
        held,
    };
    assert_eq!(max_concurrent(&[iv(0, 10, true), iv(10, 20, true)]), 1);
    assert_eq!(
        max_concurrent(&[iv(0, 10, true), iv(5, 20, true), iv(6, 7, true)]),
        3
    );
    assert_eq!(max_concurrent(&[iv(0, 10, true), iv(5, 20, false)]), 1);
}

#[test]
fn permits_are_counted() {
    let server = RedisServer::start();
    let name = common::unique_name("sem-basic");
    let a = Client::open(server.url()).unwrap();
    let b = Client::open(server.url()).unwrap();
    let sa = a.semaphore(&name, 3).unwrap();
    let sb = b.semaphore(&name, 3).unwrap();
    with_deadline(Duration::from_secs(30), move || {
        assert_eq!(sa.available().unwrap(), 3);
        let p1 = sa.acquire().unwrap();
        let p2 = sb.acquire_many(2).unwrap();
        assert_eq!(p2.permits(), 2);
        assert_eq!(sa.available().unwrap(), 0);
        assert!(sa.try_acquire().unwrap().is_none());
        assert!(
            sb.try_acquire_for(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
        p1.unlock().unwrap();
        assert!(
            sa.try_acquire_many_for(2, Duration::ZERO)
                .unwrap()
                .is_none()
        );
        assert!(sa.try_acquire_many(2).unwrap().is_none());
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(sa.try_acquire_many_until(2, soon).unwrap().is_none());
        assert!(sa.try_acquire_many(0).unwrap_err().is_misuse());
        let p3 = sb.try_acquire().unwrap().expect("one free");
        assert!(p3.is_held());
        p3.check().unwrap();
        drop(p2);
        assert_eq!(sa.available().unwrap(), 2);
        drop(p3);
        let two = sa.try_acquire_many(2).unwrap().expect("two free");
        assert_eq!(two.permits(), 2);
        two.unlock().unwrap();
        let until = Instant::now() + Duration::from_secs(1);
        let three = sb
            .try_acquire_many_until(3, until)
            .unwrap()
            .expect("all free");
        three.unlock().unwrap();
        // A permit may be released by another thread.
        let p = sa.acquire_many(3).unwrap();
        thread::scope(|s| {
            s.spawn(move || p.unlock().unwrap());
        });
        assert_eq!(sa.available().unwrap(), 3);
    });
}

#[test]
fn a_release_wakes_a_waiter_at_once() {
    let (server, url) = common::server_url();
    let name = common::unique_name("sem-wake");
    let a = Client::open(&url).unwrap();
    let sa = a.semaphore(&name, 1).unwrap();
    let p = sa.acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let (url2, name2) = (url.clone(), name.clone());
    let w = thread::spawn(move || {
        let b = Client::open(&url2).unwrap();
        let sb = b.semaphore(&name2, 1).unwrap();
        let p = sb.acquire().unwrap();
        tx.send(Instant::now()).unwrap();
        p.unlock().unwrap();
    });
    let mut conn = server.conn();
    let channel = format!("locksmith:{{{}}}:sem:released", common::encode_name(&name));
    assert!(common::wait_until(Duration::from_secs(10), || {
        common::numsub(&mut conn, &channel) == 1
    }));
    // The waiter may still be in its attempt; it re-checks after the release either way.
    let released = Instant::now();
    p.unlock().unwrap();
    let at = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        at - released < Duration::from_secs(2),
        "woken {:?} after the release (lease 30 s)",
        at - released
    );
    w.join().unwrap();
}

/// Two handles with different counts share the permits: each acquire is checked against its
/// caller's count; lowering revokes nothing.
#[test]
fn changing_the_permit_count() {
    let server = RedisServer::start();
    let name = common::unique_name("sem-count");
    let c = Client::open(server.url()).unwrap();
    let one = c.semaphore(&name, 1).unwrap();
    let three = c.semaphore(&name, 3).unwrap();
    let p1 = one.acquire().unwrap();
    assert!(one.try_acquire().unwrap().is_none());
    let p2 = three
        .try_acquire()
        .unwrap()
        .expect("raised count: free at once");
    let p3 = three
        .try_acquire()
        .unwrap()
        .expect("raised count: free at once");
    assert!(three.try_acquire().unwrap().is_none());
    assert_eq!(one.available().unwrap(), 0);
    // Lowering back to one: three permits stay held until released.
    assert!(p1.is_held() && p2.is_held() && p3.is_held());
    drop(p3);
    assert_eq!(three.available().unwrap(), 1);
    assert!(one.try_acquire().unwrap().is_none(), "2 held, count 1");
    drop(p2);
    assert!(one.try_acquire().unwrap().is_none(), "1 held, count 1");
    drop(p1);
    assert!(one.try_acquire().unwrap().is_some());
}

#[test]
fn bad_input() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = Client::open(server.url()).unwrap();
    assert!(c.semaphore("", 1).unwrap_err().is_invalid_name());
    assert!(matches!(
        c.semaphore("s", 0),
        Err(Error::InvalidConfig {
            field: "permits",
            ..
        })
    ));
    let s = c.semaphore("s", 2).unwrap();
    for n in [0, 3] {
        assert!(matches!(s.acquire_many(n), Err(Error::Misuse { .. })));
    }
    let name = common::unique_name("sem-foreign");
    redis::cmd("SET")
        .arg(holders_key(&name))
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    let s = c.semaphore(&name, 2).unwrap();
    assert!(matches!(s.try_acquire(), Err(Error::ForeignKey { .. })));
    assert!(matches!(s.holders(), Err(Error::ForeignKey { .. })));
    assert!(matches!(s.force_unlock(), Err(Error::ForeignKey { .. })));
    let v: String = redis::cmd("GET")
        .arg(holders_key(&name))
        .query(&mut conn)
        .unwrap();
    assert_eq!(v, "x");
}

// ---------------------------------------------------------------------------------------------
// Across processes
// ---------------------------------------------------------------------------------------------

/// Child: `LS_THREADS` workers, each taking one permit at a time for `LS_RUN_MS`, logging every
/// critical section as an interval.
#[test]
fn child_sem_workers() {
    let Some((url, name)) = common::child_url_name("sem-workers") else {
        return;
    };
    let port: u16 = common::child_var("LS_STORE");
    let threads: u32 = common::child_var("LS_THREADS");
    let permits: u32 = common::child_var("LS_PERMITS");
    let run = common::child_ms("LS_RUN_MS");
    let lease = common::child_ms("LS_LEASE_MS");
    let client = client_with_lease(&url, lease);
    let sem = client.semaphore(&name, permits).unwrap();
    println!("started");
    let end = Instant::now() + run;
    thread::scope(|s| {
        for worker in 0..threads {
            let (sem, name) = (&sem, &name);
            s.spawn(move || {
                let mut store = StoreClient::connect(port);
                while Instant::now() < end {
                    let p = sem.acquire().unwrap();
                    let start = mono_ns();
                    p.check().unwrap();
                    thread::sleep(Duration::from_millis(2));
                    let stop = mono_ns();
                    let held = p.check().is_ok();
                    store.interval(&common::section(name, worker, 0, (start, stop), held));
                    p.unlock().unwrap();
                }
            });
        }
    });
    println!("done");
}

fn spawn_workers(url: &str, name: &str, store: &Store, permits: u32, run_ms: u64) -> TestChild {
    common::spawn_child(
        "child_sem_workers",
        "sem-workers",
        url,
        name,
        &[
            ("LS_STORE", store.port().to_string()),
            ("LS_THREADS", "3".to_string()),
            ("LS_PERMITS", permits.to_string()),
            ("LS_RUN_MS", run_ms.to_string()),
            ("LS_LEASE_MS", "1000".to_string()),
        ],
    )
}

/// 3 processes x 3 threads on 3 permits: never more than 3 critical sections at once, and
/// more than one at a time (it is a semaphore, not a mutex).
#[test]
fn permit_accounting_across_processes() {
    let server = RedisServer::start();
    let store = Store::start();
    let name = common::unique_name("sem-acct");
    let permits = 3;
    let children: Vec<TestChild> = (0..3)
        .map(|_| spawn_workers(&server.url(), &name, &store, permits, 1500))
        .collect();
    for c in &children {
        c.wait_line("done", Duration::from_secs(60));
    }
    let intervals = store.intervals();
    let max = max_concurrent(&intervals);
    println!(
        "semaphore: {} sections, at most {max} at once",
        intervals.len()
    );
    assert!(intervals.len() > 50, "{}", intervals.len());
    assert!(max <= permits as usize, "{max} permits held at once");
    assert!(max >= 2, "never more than one holder");
}

/// Worker processes killed with SIGKILL (mid-section, holding permits) and restarted, while
/// others run: the count is never exceeded, and the dead processes' permits come back.
#[test]
fn count_holds_while_holders_crash_and_restart() {
    let server = RedisServer::start();
    let store = Store::start();
    let name = common::unique_name("sem-crash");
    let permits = 2;
    let survivors: Vec<TestChild> = (0..2)
        .map(|_| spawn_workers(&server.url(), &name, &store, permits, 5000))
        .collect();
    for _ in 0..3 {
        let mut victim = spawn_workers(&server.url(), &name, &store, permits, 60_000);
        victim.wait_line("started", Duration::from_secs(30));
        let before = store.intervals().len();
        assert!(common::wait_until(Duration::from_secs(10), || {
            store.intervals().len() > before + 10
        }));
        victim.kill9();
    }
    for c in &survivors {
        c.wait_line("done", Duration::from_secs(60));
    }
    let intervals = store.intervals();
    let max = max_concurrent(&intervals);
    println!(
        "semaphore with crashes: {} sections, at most {max} at once",
        intervals.len()
    );
    assert!(max <= permits as usize, "{max} permits held at once");
    let c = Client::open(server.url()).unwrap();
    let sem = c.semaphore(&name, permits).unwrap();
    // Every permit back within a lease of the last kill.
    assert!(common::wait_until(Duration::from_secs(1) + SLACK, || {
        sem.available().unwrap() == permits
    }));
}

#[test]
fn child_kind_holder() {
    kinds::child_holder();
}

/// Child: waits for one permit of `LS_NAME` (count 1) with lease `LS_LEASE_MS`.
#[test]
fn child_sem_waiter() {
    let Some((url, name)) = common::child_url_name("sem-waiter") else {
        return;
    };
    let lease = common::child_ms("LS_LEASE_MS");
    let client = client_with_lease(&url, lease);
    let sem = client.semaphore(&name, 1).unwrap();
    let _p = sem.acquire().unwrap();
    println!("held");
    thread::sleep(Duration::from_secs(60));
}

/// Clients with different leases on one semaphore: a holder (2 s lease) and a waiting permit
/// request (2 s lease) are killed (SIGKILL) while a waiter with a long lease (30 s) waits. The
/// waiter gets the permit at most the *dead holder's* lease after the kill (+ slack): a dead
/// waiter holds nothing, and the live waiter's sleep ends by the first lease that runs out,
/// whoever's it is.
#[test]
fn dead_holder_and_waiter_are_skipped_by_their_own_lease() {
    let short = Duration::from_secs(2);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("sem-dead-leases");
    let channel = format!("locksmith:{{{}}}:sem:released", common::encode_name(&name));
    let mut holder = kinds::spawn_holder(Kind::Semaphore(1), &url, &name, short);
    let mut waiter = common::spawn_leased("child_sem_waiter", "sem-waiter", &url, &name, short);
    common::wait_numsub(&mut conn, &channel, 1);
    let (tx, rx) = mpsc::channel();
    let (url2, name2) = (url.clone(), name.clone());
    let live = thread::spawn(move || {
        let c = client_with_lease(&url2, Duration::from_secs(30));
        let sem = c.semaphore(&name2, 1).unwrap();
        let p = sem.try_acquire_for(Duration::from_secs(40)).unwrap();
        tx.send((Instant::now(), p.is_some())).unwrap();
    });
    common::wait_numsub(&mut conn, &channel, 2);
    let killed = Instant::now();
    waiter.kill9();
    holder.kill9();
    let (at, got) = rx.recv_timeout(Duration::from_secs(45)).unwrap();
    let waited = at - killed;
    println!(
        "semaphore: dead holder and waiter (lease {short:?}) skipped {waited:?} after the kill"
    );
    assert!(got, "the live waiter never got a permit");
    assert!(waited <= short + SLACK, "{waited:?}");
    live.join().unwrap();
}

/// A holder of both permits killed with SIGKILL: a waiter for both gets them within a lease.
#[test]
fn killed_holder_gives_its_permits_back_within_a_lease() {
    let both = Kind::Semaphore(2);
    kinds::killed_holder_frees_the_lock_within_a_lease(both, both, "sem-kill");
}

/// A holder paused (SIGSTOP) for two leases: a waiter gets the permit within a lease
/// (+ slack); the resumed holder reports itself lost, and took nothing from the new one.
#[test]
fn paused_holder_loses_its_permit_and_says_so() {
    let one = Kind::Semaphore(1);
    kinds::paused_holder_loses_the_lock_and_says_so(one, one, "sem-pause");
}

/// Redis restarts empty while a holder holds the only permit and two threads wait: the holder
/// reports itself lost, and the waiters get the permit one at a time soon after the restart.
#[test]
fn waiters_recover_from_a_redis_restart() {
    let one = Kind::Semaphore(1);
    kinds::waiters_recover_from_a_redis_restart(one, one, 2, "sem-restart");
}

// ---------------------------------------------------------------------------------------------
// Faults on the wire
// ---------------------------------------------------------------------------------------------

static SEM_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("sem_permits.lua").unwrap());

/// A cut acquire reply is recognised on the retry: the permits are counted once, not twice;
/// a cut release reply is recognised too: `Ok`, and every permit free again.
#[test]
fn cut_semaphore_replies_count_once() {
    let (_server, mut conn, proxy, purl) = common::proxied();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::open(&purl).unwrap();
        let name = common::unique_name("sem-cut");
        let sem = client.semaphore(&name, 3).unwrap();
        let sha = redis::Script::new(&SEM_LUA).get_hash().to_string();
        let hk = holders_key(&name);
        for op in ["$1\r\na\r\n", "$1\r\nr\r\n"] {
            proxy.cut_reply_to(&[sha.as_bytes(), hk.as_bytes(), op.as_bytes()], 1);
        }
        let p = sem
            .try_acquire_many_for(2, Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(holders(&mut conn, &hk), 1, "one acquisition on the server");
        assert_eq!(sem.available().unwrap(), 1, "two permits counted once");
        p.unlock().unwrap();
        assert_eq!(proxy.cuts(), 2, "the replies were not cut");
        assert_eq!(sem.available().unwrap(), 3);
    });
}

/// Every blocking call of a semaphore keeps its documented bound against a stalled server
/// (`SIGSTOP`): `try_acquire` and `available` within connect + command timeout, the `_for` /
/// `_until` forms by `max(wait, connect) + command`, `acquire()` within `max(retry, connect +
/// command)`, `release()` and a permit's drop within connect + command. Twice: first on
/// pooled connections, then on new ones.
#[test]
fn every_semaphore_call_keeps_its_bound_against_a_stalled_server() {
    bounds::every_call_keeps_its_bound_against_a_stalled_server(&[Kind::Semaphore(1)]);
}

/// Holders with leases of different lengths (clients with different settings): an acquire
/// with a short lease never shortens the life of the semaphore's keys below a longer lease
/// still running. Before, it set the keys' expiry to its own lease, so the longer holder's
/// permits vanished from Redis with them, and were counted free, while it still held them.
#[test]
fn a_short_lease_never_shortens_a_longer_holders_keys() {
    let (server, url) = common::server_url();
    let name = common::unique_name("sem-mixed-leases");
    let long = client_with_lease(&url, Duration::from_secs(20));
    let short = client_with_lease(&url, Duration::from_secs(1));
    with_deadline(Duration::from_secs(30), move || {
        // The longer holder first (one holder: a string), then both (a sorted set); and the
        // other way round, on a second name.
        for (round, long_first) in [(0, true), (1, false)] {
            let name = format!("{name}:{round}");
            let sl = long.semaphore(&name, 2).unwrap();
            let ss = short.semaphore(&name, 2).unwrap();
            let (held, brief) = if long_first {
                let held = sl.acquire().unwrap();
                (held, ss.acquire().unwrap())
            } else {
                let brief = ss.acquire().unwrap();
                (sl.acquire().unwrap(), brief)
            };
            brief.unlock().unwrap();
            let mut conn = server.conn();
            let key = holders_key(&name);
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
            assert!(
                pttl > 10_000,
                "{key} expires in {pttl} ms, before the 20 s lease still held"
            );
            assert!(held.is_held());
            assert_eq!(ss.available().unwrap(), 1);
            held.unlock().unwrap();
        }
    });
}

/// Child: waits for one permit of `LS_NAME` (count `LS_N`) with a 30 s lease and prints `got`
/// once it holds it.
#[test]
fn child_sem_long_waiter() {
    let Some((url, name)) = common::child_url_name("sem-long-waiter") else {
        return;
    };
    let n: u32 = common::child_var("LS_N");
    let client = client_with_lease(&url, Duration::from_secs(30));
    let sem = client.semaphore(&name, n).unwrap();
    let _p = sem.acquire().unwrap();
    println!("got");
    thread::sleep(Duration::from_secs(60));
}

/// Uncontended cycles publish nothing. A waiter in another process flags the semaphore, and a
/// release wakes it at once: with one holder (the semaphore a string) and with two (a sorted
/// set). With the flag lost, the waiter would sleep until the first 30 s lease ran out.
#[test]
fn a_waiter_is_woken_at_the_release_with_one_holder_or_several() {
    let (_server, url, mut conn) = common::server_url_conn();
    let client = client_with_lease(&url, Duration::from_secs(30));
    let other = client_with_lease(&url, Duration::from_secs(30));
    for count in [1, 2] {
        let name = common::unique_name("sem-flag");
        let sem = client.semaphore(&name, count).unwrap();
        let before = common::calls(&common::commandstats(&mut conn), "cmdstat_publish");
        for _ in 0..20 {
            sem.acquire().unwrap().unlock().unwrap();
        }
        let after = common::calls(&common::commandstats(&mut conn), "cmdstat_publish");
        assert_eq!(after, before, "uncontended cycles published");
        let mine = sem.acquire().unwrap();
        let theirs =
            (count == 2).then(|| other.semaphore(&name, count).unwrap().acquire().unwrap());
        assert_eq!(holders(&mut conn, &holders_key(&name)), count as usize);
        let child = common::spawn_child(
            "child_sem_long_waiter",
            "sem-long-waiter",
            &url,
            &name,
            &[("LS_N", count.to_string())],
        );
        let channel = format!("locksmith:{{{}}}:sem:released", common::encode_name(&name));
        common::wait_numsub(&mut conn, &channel, 1);
        // Subscribed; its attempt after the subscription flags the semaphore.
        assert!(common::wait_until(Duration::from_secs(10), || {
            let ty: String = redis::cmd("TYPE")
                .arg(holders_key(&name))
                .query(&mut conn)
                .unwrap();
            if ty == "string" {
                let v: String = redis::cmd("GET")
                    .arg(holders_key(&name))
                    .query(&mut conn)
                    .unwrap();
                v.ends_with("|w")
            } else {
                let flag: Option<f64> = redis::cmd("ZSCORE")
                    .arg(holders_key(&name))
                    .arg("w")
                    .query(&mut conn)
                    .unwrap();
                flag.is_some()
            }
        }));
        let released = Instant::now();
        mine.unlock().unwrap();
        child.wait_line("got", Duration::from_secs(5));
        let waited = released.elapsed();
        println!("semaphore ({count}): the waiter got a permit {waited:?} after the release");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        drop(theirs);
    }
}

/// Another client sees the permit holders (label, thread, permits, how long, lease left): one
/// holder, then two of two clients; `force_unlock` frees every permit and wakes a waiter of
/// another client at once; each old holder is told (its permit says lost within a renewal,
/// `on_lease_lost`, its release an error).
#[test]
fn another_client_sees_the_holders_and_force_unlock_frees_them() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let name = common::unique_name("sem-operator");
        let lost = std::sync::Arc::new(std::sync::Mutex::new(Vec::<locksmith::LostLease>::new()));
        let app = |label: &str| {
            let l = std::sync::Arc::clone(&lost);
            Client::builder(&url)
                .label(label)
                .lease(Duration::from_millis(1500))
                .on_lease_lost(move |x| l.lock().unwrap().push(x.clone()))
                .build()
                .unwrap()
        };
        let (a, b) = (app("app-a"), app("app-b"));
        let operator = Client::open(&url).unwrap();
        // The operator's handle has another count: what it sees does not depend on it.
        let seen = operator.semaphore(&name, 1).unwrap();
        assert!(seen.holders().unwrap().is_empty());
        let pa = thread::Builder::new()
            .name("permits-a".into())
            .spawn({
                let s = a.semaphore(&name, 3).unwrap();
                move || s.acquire_many(2).unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
        thread::sleep(Duration::from_millis(200));
        let one = seen.holders().unwrap();
        println!("semaphore, one holder: {one:?}");
        assert_eq!(one.len(), 1);
        assert_eq!(
            (
                one[0].label.as_str(),
                one[0].thread.as_str(),
                one[0].hold_count
            ),
            ("app-a", "permits-a", 2)
        );
        assert!(
            one[0].held_for >= Duration::from_millis(150),
            "{:?}",
            one[0].held_for
        );
        assert!(
            one[0].held_for < Duration::from_secs(5),
            "{:?}",
            one[0].held_for
        );
        assert!(one[0].lease_left > Duration::ZERO);
        let pb = thread::Builder::new()
            .name("permits-b".into())
            .spawn({
                let s = b.semaphore(&name, 3).unwrap();
                move || s.acquire().unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
        let mut two = seen.holders().unwrap();
        two.sort_by(|x, y| x.label.cmp(&y.label));
        println!("semaphore, two holders: {two:?}");
        let who: Vec<(&str, &str, u32)> = two
            .iter()
            .map(|h| (h.label.as_str(), h.thread.as_str(), h.hold_count))
            .collect();
        assert_eq!(who, [("app-a", "permits-a", 2), ("app-b", "permits-b", 1)]);
        assert!(two.iter().all(|h| h.fencing_token == 0));

        // A waiter of another client wants the third permit and one more.
        let waiter_client = client_with_lease(&url, Duration::from_secs(30));
        let ws = waiter_client.semaphore(&name, 3).unwrap();
        let (got_tx, got_rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let p = ws.acquire_many(2).unwrap();
            got_tx.send(Instant::now()).unwrap();
            p.unlock().unwrap();
        });
        let channel = format!("locksmith:{{{}}}:sem:released", common::encode_name(&name));
        common::wait_numsub(&mut conn, &channel, 1);
        let forced = Instant::now();
        assert!(seen.force_unlock().unwrap());
        let woken = got_rx.recv_timeout(Duration::from_secs(10)).unwrap() - forced;
        println!("semaphore: the waiter held its permits {woken:?} after force_unlock");
        assert!(woken < Duration::from_secs(1), "{woken:?}");
        waiter.join().unwrap();
        for p in [pa, pb] {
            assert!(common::wait_until(
                Duration::from_millis(1500) + SLACK,
                || !p.is_held()
            ));
            assert!(p.unlock().unwrap_err().is_lease_lost());
        }
        assert!(!seen.force_unlock().unwrap(), "nothing held");
        drop((a, b));
        assert_eq!(lost.lock().unwrap().len(), 2);
    });
}

/// `with_permit`: the closure's value comes back, the permit is held while it runs (another
/// client finds none free) and free after; a `force_unlock` by another client during the
/// closure makes it return the release's error, as `release` would.
#[test]
fn with_permit_holds_a_permit_around_the_closure() {
    let server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("sem-with-permit");
    let [ours, theirs] = common::clients::<2>(&url);
    let sem = ours.semaphore(&name, 1).unwrap();
    let other = theirs.semaphore(&name, 1).unwrap();
    let permits = sem
        .with_permit(|permit| {
            assert!(permit.is_held());
            assert_eq!(other.available().unwrap(), 0);
            assert!(other.try_acquire().unwrap().is_none(), "two permits of one");
            permit.permits()
        })
        .unwrap();
    assert_eq!(permits, 1);
    assert_eq!(other.available().unwrap(), 1, "the permit was kept");

    let e = sem
        .with_permit(|_| assert!(other.force_unlock().unwrap()))
        .expect_err("the permit was forced away inside the closure");
    assert!(e.is_lease_lost(), "{e:?}");
    assert_eq!(other.available().unwrap(), 1);
}

/// The lease of a fixed-lease test: short, so that the tests see it end.
const FIXED: Duration = Duration::from_millis(300);

/// `with_lease`: the permits of an acquisition come back by themselves after the fixed lease,
/// unrenewed (the client's lease is 30 s), held beside another client's permit or alone, and
/// whichever thread has the permit. A lease out of bounds is `InvalidConfig`.
#[test]
fn fixed_lease_ends_by_itself() {
    common::on_server(Duration::from_secs(60), |url, _conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("sem-fixed");
        let plain = a.semaphore(&name, 2).unwrap();
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
        let other = b.semaphore(&name, 2).unwrap();

        // Alone (one string on the server), the permit moved to another thread.
        let start = Instant::now();
        let permit = fixed.acquire_many(2).unwrap();
        let permit = thread::spawn(move || permit).join().unwrap();
        assert!(other.try_acquire().unwrap().is_none());
        let taken = other
            .try_acquire_many_for(2, Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(!permit.is_held());
        assert!(permit.unlock().is_err());
        taken.unlock().unwrap();

        // Beside another client's renewed permit (a sorted set on the server).
        let theirs = other.acquire().unwrap();
        let start = Instant::now();
        let permit = fixed.acquire().unwrap();
        assert_eq!(other.available().unwrap(), 0);
        let taken = other
            .try_acquire_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(theirs.is_held() && !permit.is_held());
        drop(permit);
        theirs.unlock().unwrap();
        taken.unlock().unwrap();
    });
}

/// `Client::shutdown` releases fixed-lease permits too, on whichever thread they are: another
/// client takes them at once, long before the 30 s fixed lease would end.
#[test]
fn fixed_lease_released_at_shutdown() {
    common::on_server(Duration::from_secs(30), |url, _conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("sem-fixed-shutdown");
        let fixed = a
            .semaphore(&name, 1)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap();
        let permit = fixed.acquire().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        let elsewhere = thread::spawn(move || {
            rx.recv().unwrap();
            assert!(matches!(permit.unlock(), Err(Error::Shutdown)));
        });
        let other = b.semaphore(&name, 1).unwrap();
        assert!(other.try_acquire().unwrap().is_none());
        a.shutdown(Duration::from_secs(5)).unwrap();
        let taken = other
            .try_acquire()
            .unwrap()
            .expect("still held after the shutdown");
        tx.send(()).unwrap();
        elsewhere.join().unwrap();
        taken.unlock().unwrap();
    });
}
