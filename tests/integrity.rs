//! Integrity of a hold under re-entry, drop order, loss and retry: re-entries through handles
//! with other terms, lost inner releases, acquisitions the server replaced, fence key expiry,
//! eviction policy, and reporting every lost lease exactly once.
//!
//! Every test runs against its own `redis-server`; faults on the wire come from the TCP proxy
//! of `testkit/src/proxy.rs`. Every blocking step runs under a test-side deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::{Client, Error, LostLease};

static ACQUIRE_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("acquire.lua").unwrap());
static RELEASE_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("release.lua").unwrap());

fn sha(src: &str) -> String {
    redis::Script::new(src).get_hash().to_string()
}

fn preload_scripts(conn: &mut redis::Connection) {
    for src in [*ACQUIRE_LUA, *RELEASE_LUA] {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .exec(conn)
            .unwrap();
    }
}

fn count(conn: &mut redis::Connection, name: &str) -> Option<String> {
    common::lock_value(conn, name).map(|v| v.count.to_string())
}

/// Asserts that the server's expiry of `name` is no earlier than the guard's local deadline:
/// the PTTL is read first, so the server side can only look shorter than it is.
fn assert_local_deadline_within_server_expiry(
    conn: &mut redis::Connection,
    name: &str,
    guard: &locksmith::MutexGuard,
    what: &str,
) {
    let pttl = common::pttl(conn, &common::lock_key(name));
    let validity = guard.validity();
    assert!(
        u128::try_from(pttl.max(0)).unwrap() + 1 >= validity.as_millis(),
        "{what}: the server expires the lock in {pttl} ms, but the guard believes it valid for \
         {validity:?}"
    );
}

/// A watchdog hold re-entered through a handle with a short fixed lease: the re-entry must
/// not shorten the lease on the server. Another client stays out for as long as the outer
/// guard says it holds the lock.
#[test]
fn reentry_with_a_shorter_fixed_lease_keeps_the_lease() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::builder(&url)
            .lease(Duration::from_secs(5))
            .build()
            .unwrap();
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("reenter-short");
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let short = m.with_lease(Duration::from_millis(300)).unwrap();
        let inner = short.try_lock().unwrap().expect("re-entry");
        assert_eq!(inner.fencing_token(), outer.fencing_token());
        assert_local_deadline_within_server_expiry(&mut conn, &name, &outer, "after re-entry");
        drop(inner);
        assert_local_deadline_within_server_expiry(&mut conn, &name, &outer, "after inner drop");
        // Past the inner handle's lease: the outer hold still excludes others.
        let theirs = other.mutex(&name).unwrap();
        let got = theirs.try_lock_for(Duration::from_millis(700)).unwrap();
        let held = outer.is_held();
        assert!(
            got.is_none() || !held,
            "another client acquired while the outer guard says held"
        );
        assert!(held, "the outer guard lost its lease");
        outer.unlock().unwrap();
    });
}

/// A fixed-lease hold re-entered through a watchdog handle (and through a handle with a longer
/// fixed lease): the lock still frees itself when the fixed lease of its acquisition ends, and
/// the local deadline never passes the server's expiry.
#[test]
fn reentry_through_a_watchdog_handle_keeps_a_fixed_lease_fixed() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let client = Client::builder(&url)
            .lease(Duration::from_secs(10))
            .build()
            .unwrap();
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("reenter-fixed");
        let m = client.mutex(&name).unwrap();
        let fixed = m.with_lease(Duration::from_millis(800)).unwrap();
        let longer = m.with_lease(Duration::from_secs(20)).unwrap();
        let start = Instant::now();
        let outer = fixed.lock().unwrap();
        let inner = m.lock().unwrap();
        assert_local_deadline_within_server_expiry(&mut conn, &name, &inner, "watchdog re-entry");
        let inner2 = longer.lock().unwrap();
        assert_local_deadline_within_server_expiry(&mut conn, &name, &inner2, "longer re-entry");
        let pttl = common::pttl(&mut conn, &common::lock_key(&name));
        assert!(
            pttl <= 800,
            "a re-entry extended the fixed lease to {pttl} ms"
        );
        // The fixed lease ends 800 ms after the acquisition, whatever the re-entries asked.
        let theirs = other.mutex(&name).unwrap();
        let got = theirs.try_lock_for(Duration::from_secs(4)).unwrap();
        let waited = start.elapsed();
        assert!(got.is_some(), "the fixed lease was extended by a re-entry");
        assert!(!outer.is_held() && !inner.is_held() && !inner2.is_held());
        println!("fixed lease of 800 ms with two re-entries: taken by another after {waited:?}");
        drop(got);
        drop((inner2, inner, outer));
    });
}

/// A fixed-lease re-entry on a fixed-lease hold must not move the local deadline past the
/// server's expiry.
#[test]
fn reentry_of_a_fixed_lease_does_not_move_the_local_deadline() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(&url).unwrap();
        let name = common::unique_name("reenter-fixed-deadline");
        let m = client.mutex(&name).unwrap();
        let fixed = m.with_lease(Duration::from_secs(3)).unwrap();
        let outer = fixed.lock().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let short = m.with_lease(Duration::from_millis(300)).unwrap();
        let inner = short.lock().unwrap();
        assert_local_deadline_within_server_expiry(&mut conn, &name, &outer, "outer");
        assert_local_deadline_within_server_expiry(&mut conn, &name, &inner, "inner");
        drop(inner);
        outer.unlock().unwrap();
    });
}

/// Past its maximum hold time a hold is no longer renewed; a re-entry must not extend it
/// either, or a holder that re-enters in a loop keeps the lock forever.
#[test]
fn reentry_after_the_maximum_hold_time_does_not_extend_the_lease() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::builder(&url)
            .lease(Duration::from_secs(3))
            .build()
            .unwrap();
        let name = common::unique_name("reenter-max-hold");
        let m = client.mutex(&name).unwrap();
        let capped = m.with_max_hold(Duration::from_millis(100)).unwrap();
        let outer = capped.lock().unwrap();
        // The lease began before `lock()` returned: it has at most 3000 ms less the time
        // since then left.
        let locked = Instant::now();
        // Past the maximum hold time (no renewal is due before it), within the lease.
        std::thread::sleep(Duration::from_millis(300));
        let inner = m.lock().unwrap();
        assert_eq!(
            inner.fencing_token(),
            outer.fencing_token(),
            "not a re-entry"
        );
        let elapsed = locked.elapsed();
        let pttl = common::pttl(&mut conn, &common::lock_key(&name));
        println!("re-entry {elapsed:?} after the acquisition: the key expires in {pttl} ms");
        assert!(
            u128::try_from(pttl).unwrap() <= 3000 - elapsed.as_millis() + 1,
            "a re-entry past the maximum hold time extended the lease to {pttl} ms"
        );
        assert_local_deadline_within_server_expiry(&mut conn, &name, &inner, "inner");
        drop(inner);
        drop(outer);
    });
}

/// With a quorum, a re-entry that finds its acquisition gone on one master (a minority) is
/// still a re-entry: the new acquisition that master made is given back at once, and the
/// outermost release leaves no key on any master.
#[test]
fn quorum_reentry_with_a_minority_replaced_leaves_no_stray_grant() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut conns: Vec<_> = servers.iter().map(RedisServer::conn).collect();
    with_deadline(Duration::from_secs(30), move || {
        let quorum = locksmith::Client::redlock(&urls).build().unwrap();
        let name = common::unique_name("quorum-reenter");
        let key = common::lock_key(&name);
        let m = quorum.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conns[0]).unwrap();
        let inner = m.try_lock().unwrap().expect("a re-entry on a quorum");
        assert_eq!(inner.fencing_token(), outer.fencing_token());
        assert!(outer.is_held());
        let counts: Vec<_> = conns
            .iter_mut()
            .map(|c| common::lock_value_at(c, &key).map(|v| v.count))
            .collect();
        println!("counts after the re-entry: {counts:?}");
        assert_eq!(
            counts[0], None,
            "the stray grant on the replaced master stayed"
        );
        inner.unlock().unwrap();
        outer.unlock().unwrap();
        for c in &mut conns {
            assert!(
                !common::exists(c, &key),
                "a key left after the outermost release"
            );
        }
    });
}

/// An inner release that never reached Redis leaves the server one level higher than the
/// holder; the outermost `unlock()` must still free the lock (or fail), never return `Ok`
/// while the key stays.
#[test]
fn lost_inner_release_does_not_keep_the_lock() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::builder(&purl)
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let name = common::unique_name("lost-inner-release");
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let inner = m.lock().unwrap();
        proxy.black_hole();
        proxy.kill_all();
        let e = inner.unlock().expect_err("a release through a black hole");
        proxy.pass();
        assert_eq!(count(&mut conn, &name).as_deref(), Some("2"));
        let res = outer.unlock();
        let key_left = common::exists(&mut conn, &common::lock_key(&name));
        println!("inner release lost ({e}); outermost unlock: {res:?}; key left: {key_left}");
        assert!(
            res.is_err() || !key_left,
            "unlock() returned Ok while the lock stayed held on the server"
        );
        let other = Client::open(&url).unwrap();
        assert!(
            other.mutex(&name).unwrap().try_lock().unwrap().is_some(),
            "the lock is still held after the outermost unlock"
        );
    });
}

/// A re-entry whose reply was lost for good (the call and its retry both ran on Redis, both
/// replies were cut) leaves the server one level higher; the outermost `unlock()` frees it.
#[test]
fn lost_reentry_reply_does_not_keep_the_lock() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    preload_scripts(&mut conn);
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::builder(&purl)
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let name = common::unique_name("lost-reentry");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let acq = sha(&ACQUIRE_LUA);
        proxy.cut_reply_to(&[acq.as_bytes(), key.as_bytes()], 2);
        let e = m.try_lock().expect_err("a re-entry whose replies were cut");
        assert_eq!(proxy.cuts(), 2, "the replies were not cut");
        assert_eq!(count(&mut conn, &name).as_deref(), Some("2"));
        assert!(outer.is_held());
        let res = outer.unlock();
        let key_left = common::exists(&mut conn, &key);
        println!("re-entry reply lost ({e}); outermost unlock: {res:?}; key left: {key_left}");
        assert!(
            res.is_err() || !key_left,
            "unlock() returned Ok while the lock stayed held on the server"
        );
        let other = Client::open(&url).unwrap();
        assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
    });
}

/// The retry of an outermost release whose first reply was cut is recognised: `Ok`, the key
/// gone, and nothing of a new owner touched.
#[test]
fn outermost_release_retry_is_idempotent() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    preload_scripts(&mut conn);
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::open(&purl).unwrap();
        let name = common::unique_name("outer-retry");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let inner = m.lock().unwrap();
        let rel = sha(&RELEASE_LUA);
        proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
        inner.unlock().unwrap();
        assert_eq!(count(&mut conn, &name).as_deref(), Some("1"));
        proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
        outer.unlock().unwrap();
        assert_eq!(proxy.cuts(), 2);
        assert!(!common::exists(&mut conn, &key));
        let other = Client::open(&url).unwrap();
        assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
    });
}

fn reports_of(lost: &Mutex<Vec<LostLease>>, token: u64) -> usize {
    lost.lock()
        .unwrap()
        .iter()
        .filter(|l| l.fencing_token == token)
        .count()
}

/// The lock key is deleted behind a holder, and the holder re-enters before any renewal
/// noticed: the server grants a new acquisition. The outer guard must be marked lost at once
/// (and reported once), and the call gets a fresh hold with a new token, whose release frees
/// the lock; the outer guard's release then touches nothing.
#[test]
fn reentry_into_a_replaced_acquisition_marks_the_outer_hold_lost() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let (client, lost) = common::lost_log(Client::builder(&url).lease(Duration::from_secs(30)));
        let name = common::unique_name("reenter-replaced");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        let inner = m
            .try_lock()
            .unwrap()
            .expect("the lock is free on the server");
        assert!(
            !outer.is_held(),
            "the outer guard says held, but its acquisition is gone from the server"
        );
        assert!(inner.is_held());
        assert!(inner.fencing_token() > outer.fencing_token());
        assert_eq!(count(&mut conn, &name).as_deref(), Some("1"));
        inner.unlock().unwrap();
        assert!(!common::exists(&mut conn, &key));
        assert!(!outer.is_held());
        assert!(outer.unlock().is_err());
        let token = {
            let g = m.lock().unwrap();
            g.fencing_token()
        };
        assert!(token > 0);
        drop(m);
        drop(client);
        let reports = lost.lock().unwrap().len();
        assert_eq!(reports, 1, "lost leases reported: {reports}");
    });
}

/// A fixed lease that ran out while its guard still lives ended by design: when the same
/// thread locks again (a new acquisition), nothing is reported lost; a renewed lease lost the
/// same way is reported once.
#[test]
fn a_fixed_lease_that_ran_out_is_not_reported_lost() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let (client, lost) = common::lost_log(Client::builder(&url).lease(Duration::from_secs(30)));
        let name = common::unique_name("fixed-ran-out");
        let m = client.mutex(&name).unwrap();
        let fixed = m.with_lease(Duration::from_millis(100)).unwrap();
        let old = fixed.lock().unwrap();
        assert!(common::wait_until(Duration::from_secs(5), || {
            !old.is_held() && !common::exists(&mut conn, &common::lock_key(&name))
        }));
        let new = m.lock().unwrap();
        assert!(new.fencing_token() > old.fencing_token());
        new.unlock().unwrap();
        assert!(old.unlock().is_err());
        drop((fixed, m));
        drop(client);
        let reports = lost.lock().unwrap().len();
        assert_eq!(reports, 0, "a fixed lease that ended was reported lost");
    });
}

/// A re-entry that finds another owner on the server: the outer hold is lost, and says so at
/// once (and is reported once) instead of waiting for its next renewal.
#[test]
fn reentry_that_finds_another_owner_marks_the_outer_hold_lost() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let (client, lost) = common::lost_log(Client::builder(&url).lease(Duration::from_secs(30)));
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("reenter-taken");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let token = outer.fencing_token();
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        let theirs = other.mutex(&name).unwrap();
        let g = theirs.try_lock().unwrap().expect("free after the DEL");
        assert!(m.try_lock().unwrap().is_none());
        assert!(!outer.is_held(), "the outer guard still says held");
        drop(g);
        drop(outer);
        drop(m);
        drop(client);
        assert_eq!(reports_of(&lost, token), 1);
    });
}

/// An inner release finds the key gone while a renewal of the same hold is on the wire
/// (its reply held back by the proxy); the renewal then finds it gone too. The loss is
/// reported once, not once by each.
#[test]
fn a_loss_seen_by_a_release_and_a_renewal_at_once_is_reported_once() {
    let (_server, mut conn, proxy, purl) = common::proxied();
    preload_scripts(&mut conn);
    let renew = sha(locksmith_testkit::lua_source("renew.lua").unwrap());
    let _: () = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(locksmith_testkit::lua_source("renew.lua").unwrap())
        .query(&mut conn)
        .unwrap();
    with_deadline(Duration::from_secs(20), move || {
        let (client, lost) =
            common::lost_log(Client::builder(&purl).lease(Duration::from_millis(1500)));
        let name = common::unique_name("lost-twice");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let outer = m.lock().unwrap();
        let inner = m.lock().unwrap();
        let token = outer.fencing_token();
        proxy.delay_reply_to(
            &[renew.as_bytes(), key.as_bytes()],
            Duration::from_millis(600),
            1,
        );
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        // The next renewal ran on Redis (and found no key); its reply is held back.
        assert!(common::wait_until(Duration::from_secs(5), || proxy
            .delays()
            == 1));
        assert!(matches!(inner.unlock(), Err(Error::LeaseLost)));
        assert!(!outer.is_held());
        // Dropping the outer guard waits for the renewal on the wire; dropping the client
        // joins the renewal thread, after it handled that renewal's reply.
        drop(outer);
        drop(m);
        drop(client);
        assert_eq!(
            reports_of(&lost, token),
            1,
            "one loss, reported more than once"
        );
    });
}

/// A hold whose lease ran out while the renewal thread was busy, and which the renewal wheel
/// then dropped in a compaction (after over 1,024 releases), is reported lost exactly once.
#[test]
fn holds_dropped_by_compaction_are_reported_once() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let lost = Arc::new(Mutex::new(Vec::<LostLease>::new()));
        // The first report blocks the renewal thread until the test lets it go.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let gate = Mutex::new(Some(gate_rx));
        let (blocked_tx, blocked_rx) = mpsc::channel::<()>();
        let blocked_tx = Mutex::new(blocked_tx);
        let l = Arc::clone(&lost);
        let client = Client::builder(&url)
            .lease(Duration::from_millis(600))
            .on_lease_lost(move |x| {
                l.lock().unwrap().push(x.clone());
                if let Some(rx) = gate.lock().unwrap().take() {
                    let _ = blocked_tx.lock().unwrap().send(());
                    let _ = rx.recv_timeout(Duration::from_secs(30));
                }
            })
            .build()
            .unwrap();
        let a = client.mutex(&common::unique_name("compact-a")).unwrap();
        let b_name = common::unique_name("compact-b");
        let b = client.mutex(&b_name).unwrap();
        let ga = a.lock().unwrap();
        let gb = b.lock().unwrap();
        let (ta, tb) = (ga.fencing_token(), gb.fencing_token());
        // B is lost at its next renewal; its report blocks the renewal thread.
        let _: () = redis::cmd("DEL")
            .arg(common::lock_key(&b_name))
            .query(&mut conn)
            .unwrap();
        blocked_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        // Meanwhile A's lease runs out, unrenewed, and over 1,024 holds are released.
        assert!(common::wait_until(Duration::from_secs(5), || !ga.is_held()));
        let churn = client.mutex(&common::unique_name("compact-churn")).unwrap();
        for _ in 0..1100 {
            churn.lock().unwrap().unlock().unwrap();
        }
        drop(gate_tx);
        // A must be reported (once) while its guard still exists.
        let reported = common::wait_until(Duration::from_secs(5), || reports_of(&lost, ta) > 0);
        drop((ga, gb));
        drop((a, b, churn));
        drop(client);
        let (ra, rb) = (reports_of(&lost, ta), reports_of(&lost, tb));
        println!("reports: A {ra}, B {rb}");
        assert!(
            reported,
            "a hold dropped by compaction was never reported lost"
        );
        assert_eq!(
            (ra, rb),
            (1, 1),
            "every lost lease is reported exactly once"
        );
    });
}

/// A Mutex on one server leaves no key of its name behind for long (the release marker lives
/// for what the lease had left; the fencing mark is its hash slot's, one of at most 16,384),
/// and tokens keep rising when everything is gone (an empty restart).
#[test]
fn tokens_keep_rising_with_the_mark() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::builder(&url)
            .lease(Duration::from_secs(2))
            .build()
            .unwrap();
        let name = common::unique_name("no-counter");
        let m = client.mutex(&name).unwrap();
        let first = m.lock().unwrap();
        let t1 = first.fencing_token();
        first.unlock().unwrap();
        common::assert_mark_covers(&mut conn, &name, t1);
        let marker = common::release_channel(&name);
        let pttl = common::pttl(&mut conn, &marker);
        assert!(
            pttl > 0 && pttl <= 2_000,
            "the release marker expires in {pttl} ms"
        );
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        let second = m.lock().unwrap();
        assert!(second.fencing_token() > t1);
        second.unlock().unwrap();
    });
}

/// A grant over an orphaned acquisition of the same owner (a release whose reply was lost)
/// replaces it, above the orphan's block, which the slot's fencing mark reaches; and it reserves
/// no hand-off block when it must start above the clock's token.
#[test]
fn a_grant_over_an_orphan_starts_above_its_block() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(&url).unwrap();
        let name = common::unique_name("orphan");
        let key = common::lock_key(&name);
        let m = client.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        let v = common::lock_value(&mut conn, &name).unwrap();
        g.unlock().unwrap();
        // An orphan of this thread's owner whose block reaches a minute ahead of the clock (a
        // grant after a step back of the clock), and the mark its grant left.
        let far = v.token + 60_000_000;
        let orphan = format!("orphan|{}|1024|{}|{}|1|orphan||{far}", v.owner, v.s, v.us);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&orphan)
            .arg("PX")
            .arg(60_000)
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(common::fence_key(&name))
            .arg(far + 1024)
            .query(&mut conn)
            .unwrap();
        let g = m.lock().unwrap();
        assert_eq!(g.fencing_token(), far + 1024 + 1);
        let v = common::lock_value(&mut conn, &name).unwrap();
        assert_eq!((v.token, v.upto, v.long), (far + 1025, far + 1025, true));
        g.unlock().unwrap();
    });
}

/// With a quorum, the releases (and renewals) raise a master's fencing mark to the holder's
/// token, where it was behind; a mark is one key per hash slot and never expires.
#[test]
fn quorum_releases_raise_the_marks() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut conns: Vec<_> = servers.iter().map(RedisServer::conn).collect();
    with_deadline(Duration::from_secs(30), move || {
        let quorum = locksmith::Client::redlock(&urls).build().unwrap();
        let name = common::unique_name("fence-ttl-quorum");
        let fence = common::fence_key(&name);
        let m = quorum.mutex(&name).unwrap();
        // A counter behind the holder's token (as on a master that missed the grant) is
        // raised by the release.
        let g = m.lock().unwrap();
        for c in &mut conns {
            let _: () = redis::cmd("SET").arg(&fence).arg(1).query(c).unwrap();
        }
        let token = g.fencing_token();
        g.unlock().unwrap();
        for c in &mut conns {
            common::assert_mark_covers(c, &name, token);
        }
    });
}

/// Every log record of this test binary, as "LEVEL message".
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        LOG.lock()
            .unwrap()
            .push(format!("{} {}", record.level(), record.args()));
    }
    fn flush(&self) {}
}

fn warnings_naming(port: u16) -> Vec<String> {
    let needle = format!(":{port}");
    LOG.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains(&needle) && l.contains("evict"))
        .cloned()
        .collect()
}

/// A Redis that may evict lock keys (a `maxmemory` limit and a policy other than
/// `noeviction`) gets one warning when a client starts; a server that keeps them gets none;
/// a user that may not run `CONFIG GET` starts quietly.
#[test]
fn eviction_policy_is_checked_at_start() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&Recorder).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
    });
    let server = RedisServer::start();
    let port = server.port();
    let url = server.url();
    let mut conn = server.conn();
    with_deadline(Duration::from_secs(20), move || {
        drop(Client::open(&url).unwrap());
        assert_eq!(warnings_naming(port), Vec::<String>::new());

        for (k, v) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(k)
                .arg(v)
                .query(&mut conn)
                .unwrap();
        }
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-config")
            .query(&mut conn)
            .unwrap();
        let restricted = format!("redis://locker:secret@127.0.0.1:{port}/");
        let c = Client::open(&restricted).unwrap();
        let m = c.mutex("evict-acl").unwrap();
        m.lock().unwrap().unlock().unwrap();
        drop(m);
        drop(c);
        assert_eq!(warnings_naming(port), Vec::<String>::new());

        drop(Client::open(&url).unwrap());
        let warned = warnings_naming(port);
        println!("{warned:?}");
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("allkeys-lru"));
    });
}
