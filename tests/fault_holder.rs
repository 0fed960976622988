//! Faults of the holder: a holder process killed (`SIGKILL`), a holder that panics inside its
//! critical section, a holder process paused (`SIGSTOP`) past its lease and fenced off, and a
//! held lock whose waiters time out mid-wait. Scenarios 2 to 5 of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{checker, faults};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use checker::{Store, StoreClient};
use common::{ChannelSpy, keys_matching, token_of, wait_numsub, with_deadline};
use faults::{SLACK, preload_scripts, spawn_waiter};
use locksmith::Client;

/// Holds `LS_NAME` with lease `LS_LEASE_MS`, prints `locked`, sleeps until killed.
#[test]
fn child_holder() {
    if !common::is_child("holder") {
        return;
    }
    let url = common::child_env("LS_URL");
    let lease: u64 = common::child_var("LS_LEASE_MS");
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
    let Some((url, name)) = common::child_url_name("fenced_writer") else {
        return;
    };
    let lease: u64 = common::child_var("LS_LEASE_MS");
    let mut store = StoreClient::connect(common::child_var("LS_STORE"));
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

/// 2. A holder process is killed with SIGKILL: the waiter acquires once the lease runs out,
///    within the lease + slack, with no release message published before it acquired.
#[test]
fn s02_killed_holder() {
    let lease = Duration::from_secs(1);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("s02");
    let key = common::lock_key(&name);
    let channel = common::release_channel(&name);
    let mut child = common::spawn_leased("child_holder", "holder", &url, &name, lease);
    child.wait_line("locked", Duration::from_secs(30));
    let child_token = token_of(&mut conn, &name);
    let spy = ChannelSpy::start(&url, &channel);
    let waiter = Client::open(url.as_str()).unwrap();
    let m = waiter.mutex(&name).unwrap();
    let (tx, rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let w = thread::spawn(move || {
        let g = m.try_lock_for(Duration::from_secs(10)).unwrap();
        let at = Instant::now();
        tx.send((at, g.as_ref().map(|g| g.fencing_token())))
            .unwrap();
        // Hold until the test has counted the release messages: this guard's own release
        // must not be among them.
        let _ = release_rx.recv_timeout(Duration::from_secs(20));
        drop(g);
    });
    wait_numsub(&mut conn, &channel, 2);
    // Let the holder renew at least once more, so the lease is its own, not the first one.
    thread::sleep(lease / 2);
    let remaining = Duration::from_millis(common::pttl(&mut conn, &key).try_into().unwrap());
    let killed_at = Instant::now();
    child.kill9();
    let (at, token) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // Every message published up to now, while the waiter still holds the lock.
    let messages = spy.sync(&mut conn);
    release_tx.send(()).unwrap();
    let waited = at - killed_at;
    println!(
        "s02: holder SIGKILLed with {remaining:?} of its {lease:?} lease left; waiter acquired \
         {waited:?} later; {messages} release messages before it did"
    );
    assert!(token.unwrap() > child_token);
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
    let (server, url, mut conn) = common::server_url_conn();
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
    // The waiter is asleep on the lock once it has tried again after its SUBSCRIBE: wait for
    // that attempt in the MONITOR log rather than for a while.
    let blocked = monitor.wait_blocked(
        &common::release_channel(&name),
        &key,
        Duration::from_secs(10),
    );
    assert!(blocked, "the waiter did not try again after subscribing");
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
    // The point is "at the release, not at the 30 s lease"; the bound leaves room for a loaded
    // machine (586 ms was once seen with the whole suite running).
    assert!(latency < Duration::from_secs(3), "took {latency:?}");
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
    let (_server, url, mut conn) = common::server_url_conn();
    let store = Store::start();
    let name = common::unique_name("s04");
    let key = common::lock_key(&name);
    let mut child = common::spawn_child(
        "child_fenced_writer",
        "fenced_writer",
        &url,
        &name,
        &[
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
        common::lock_value_at(&mut conn, &key).map(|v| v.token),
        Some(token)
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
    let (_server, url, mut conn) = common::server_url_conn();
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
    // The release marker lived for what the lease had left; only the fencing mark of the
    // name's slot stays.
    assert_eq!(
        keys,
        vec![common::fence_key(&name)],
        "keys left behind: {keys:?}"
    );
    assert!(!keys.contains(&key));
    assert_eq!(numsub, 0);
    assert!(dbg.contains("subscribed_channels: 0"), "{dbg}");
    drop((holder, waiters));
}
