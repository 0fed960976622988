//! Mutual exclusion: threads and processes, `try_lock*`, `is_locked`, fixed leases, panics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::Client;

/// 8 threads x 100 increments, one shared `Client`: the counter is exact, no two critical
/// sections overlap, and fencing tokens increase in acquisition order.
#[test]
fn threads_sharing_one_client_exclude_each_other() {
    const THREADS: usize = 8;
    const ROUNDS: u64 = 100;
    let (server, url) = common::server_url();
    let name = common::unique_name("mutex-threads");
    let counter = format!("counter:{name}");
    let client = Client::open(url.as_str()).unwrap();
    let lock = client.mutex(&name).unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let last_token = Arc::new(std::sync::Mutex::new(0u64));

    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let lock = lock.clone();
            let counter = counter.clone();
            let inside = Arc::clone(&inside);
            let last_token = Arc::clone(&last_token);
            let url = url.clone();
            thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                for _ in 0..ROUNDS {
                    let guard = lock.lock().unwrap();
                    assert!(
                        !inside.swap(true, Ordering::SeqCst),
                        "critical sections overlap"
                    );
                    {
                        let mut last = last_token.lock().unwrap();
                        assert!(
                            guard.fencing_token() > *last,
                            "token {} after {}",
                            guard.fencing_token(),
                            *last
                        );
                        *last = guard.fencing_token();
                    }
                    common::rmw_increment(&mut conn, &counter);
                    inside.store(false, Ordering::SeqCst);
                    guard.unlock().unwrap();
                }
            })
        })
        .collect();
    with_deadline(Duration::from_secs(60), move || {
        for h in handles {
            h.join().unwrap();
        }
    });

    let mut conn = server.conn();
    let total: u64 = redis::cmd("GET").arg(&counter).query(&mut conn).unwrap();
    assert_eq!(total, THREADS as u64 * ROUNDS);
    assert!(!lock.is_locked().unwrap());
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
}

/// Entry point of the child processes of [`processes_exclude_each_other`].
#[test]
fn child_counter() {
    let Some((url, name)) = common::child_url_name("counter") else {
        return;
    };
    let counter = format!("counter:{name}");
    let tokens = format!("tokens:{name}");
    let rounds: u64 = common::child_var("LS_ROUNDS");
    let client = Client::open(url.as_str()).unwrap();
    let lock = client.mutex(&name).unwrap();
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    common::locked_increments(&lock, &mut conn, &counter, &tokens, rounds);
}

/// 3 processes x 200 increments: the counter is exact and the fencing tokens, recorded
/// inside the critical sections, strictly increase.
#[test]
fn processes_exclude_each_other() {
    const CHILDREN: usize = 3;
    const ROUNDS: u64 = 200;
    let server = RedisServer::start();
    let name = common::unique_name("mutex-procs");
    let envs = [
        ("LS_URL", server.url()),
        ("LS_NAME", name.clone()),
        ("LS_ROUNDS", ROUNDS.to_string()),
    ];
    common::run_children(
        CHILDREN,
        "child_counter",
        "counter",
        &envs,
        Duration::from_secs(90),
    );

    let mut conn = server.conn();
    common::assert_exact_and_fenced(&mut conn, &name, CHILDREN as u64 * ROUNDS);
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
}

/// `try_lock` gives `None` while another client holds the lock and `Some` after release;
/// `is_locked` follows.
#[test]
fn try_lock_under_contention() {
    common::on_server(Duration::from_secs(20), move |url, _conn| {
        let (_, _, [la, lb]) = common::two_owners(&url, "try-lock");
        assert!(!la.is_locked().unwrap());
        assert!(!lb.is_locked().unwrap());

        let guard = la.try_lock().unwrap().expect("free lock");
        assert!(guard.is_held());
        assert!(la.is_locked().unwrap());
        assert!(lb.is_locked().unwrap());
        for _ in 0..3 {
            assert!(lb.try_lock().unwrap().is_none(), "b got a lock a holds");
        }
        drop(guard);
        assert!(!lb.is_locked().unwrap());
        let gb = lb.try_lock().unwrap().expect("released lock");
        assert!(la.try_lock().unwrap().is_none(), "a got a lock b holds");
        gb.unlock().unwrap();
        assert!(!la.is_locked().unwrap());
    });
}

/// `try_lock_for` on a held lock gives `None` no sooner than asked and not much later.
#[test]
fn try_lock_for_times_out() {
    common::on_server(Duration::from_secs(20), move |url, _conn| {
        let (_, _, [la, lb]) = common::two_owners(&url, "try-lock-for");
        let _held = la.lock().unwrap();
        for wait in [Duration::from_millis(100), Duration::from_millis(500)] {
            let start = Instant::now();
            let got = lb.try_lock_for(wait).unwrap();
            let elapsed = start.elapsed();
            assert!(got.is_none(), "b got a lock a holds");
            println!("try_lock_for({wait:?}) gave None after {elapsed:?}");
            assert!(elapsed >= wait, "gave up early: {elapsed:?} < {wait:?}");
            assert!(
                elapsed < wait + Duration::from_secs(1),
                "gave up late: {elapsed:?} for {wait:?}"
            );
        }
    });
}

/// `try_lock_until` on a held lock gives `None` at its deadline, and `Some` on a free lock.
#[test]
fn try_lock_until_deadline() {
    common::on_server(Duration::from_secs(20), move |url, _conn| {
        let (_, _, [la, lb]) = common::two_owners(&url, "try-lock-until");
        let held = la.lock().unwrap();
        let deadline = Instant::now() + Duration::from_millis(300);
        assert!(lb.try_lock_until(deadline).unwrap().is_none());
        let now = Instant::now();
        assert!(now >= deadline, "gave up before the deadline");
        assert!(now < deadline + Duration::from_secs(1), "gave up late");
        // A deadline in the past is one attempt.
        let start = Instant::now();
        assert!(lb.try_lock_until(start).unwrap().is_none());
        assert!(start.elapsed() < Duration::from_secs(1));
        drop(held);
        let g = lb
            .try_lock_until(Instant::now() + Duration::from_secs(2))
            .unwrap();
        assert!(g.is_some(), "free lock not acquired");
    });
}

/// `name()` is the name given; the lock is the documented string key while held (the short
/// form of a fresh grant, its token the server clock in µs), gone after, its value moved to
/// the release marker.
#[test]
fn name_and_key_layout() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("account:42");
        let lock = client.mutex(&name).unwrap();
        assert_eq!(lock.name(), name);
        assert_eq!(lock.clone().name(), name);
        let key = common::lock_key(&name);
        assert!(!common::exists(&mut conn, &key));
        let (s, _): (String, String) = redis::cmd("TIME").query(&mut conn).unwrap();
        let guard = lock.lock().unwrap();
        assert!(common::exists(&mut conn, &key), "no key {key}");
        let raw: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
        let v = common::lock_value_at(&mut conn, &key).expect("a held value");
        assert_eq!(raw.split('|').count(), 5, "not the short form: {raw}");
        assert_eq!((v.count, v.waiters, v.long), (1, false, false));
        assert_eq!(v.token, guard.fencing_token());
        let at: u64 = s.parse().unwrap();
        assert!(
            v.s >= at && v.s <= at + 5,
            "granted at {} s, asked at {at}",
            v.s
        );
        assert_eq!(v.token, v.s * 1_000_000 + v.us);
        let ttl = common::pttl(&mut conn, &key);
        assert!(ttl > 0 && ttl <= 30_000, "PTTL {ttl}");
        guard.unlock().unwrap();
        assert!(!common::exists(&mut conn, &key), "key left after unlock");
        let marker: String = redis::cmd("GET")
            .arg(common::release_channel(&name))
            .query(&mut conn)
            .unwrap();
        assert_eq!(marker, raw, "the release marker holds the released value");
        assert!(!lock.is_locked().unwrap());
    });
}

/// A fixed lease (`with_lease`) is not renewed: the key's TTL only goes down, the guard
/// reports it lost once it passes, and another client gets the lock then, not before. The
/// stale guard's drop does not release the new owner's lock.
#[test]
fn fixed_lease_expires_by_itself() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let [a, b] = common::clients(&url);
        let c = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("fixed-lease");
        let key = common::lock_key(&name);
        let lease = Duration::from_millis(200);
        let la = a.mutex(&name).unwrap().with_lease(lease).unwrap();
        let lb = b.mutex(&name).unwrap();

        let start = Instant::now();
        let guard = la.lock().unwrap();
        assert!(guard.is_held());
        assert!(lb.try_lock().unwrap().is_none());
        let mut last = common::pttl(&mut conn, &key);
        assert!(last > 0 && last <= 200, "PTTL {last} for a 200 ms lease");
        while start.elapsed() < Duration::from_millis(120) {
            let ttl = common::pttl(&mut conn, &key);
            assert!(
                ttl <= last,
                "fixed lease was extended: PTTL {last} -> {ttl}"
            );
            last = ttl;
            thread::sleep(Duration::from_millis(10));
        }

        let gb = lb
            .try_lock_for(Duration::from_secs(3))
            .unwrap()
            .expect("lock free after the fixed lease passed");
        let waited = start.elapsed();
        println!("fixed 200 ms lease: another client acquired after {waited:?}");
        assert!(
            waited >= Duration::from_millis(180),
            "acquired after {waited:?}, before the lease passed"
        );
        assert!(waited < lease + Duration::from_millis(1500));
        assert!(!guard.is_held(), "guard still held after its lease passed");

        let owner = common::owner_at(&mut conn, &key);
        assert!(owner.is_some());
        let res = guard.unlock();
        assert!(res.is_err(), "unlock after the lease passed succeeded");
        assert!(res.unwrap_err().is_lease_lost());
        assert_eq!(common::owner_at(&mut conn, &key), owner);
        assert!(c.mutex(&name).unwrap().try_lock().unwrap().is_none());
        gb.unlock().unwrap();
    });
}

/// A holder that panics inside the critical section releases the lock while unwinding: a
/// waiter on another client gets it at once, far under the 30 s lease.
#[test]
fn panicking_holder_releases() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("panic");
    let [holder_client, waiter_client] = common::clients(&url);
    let holder_lock = holder_client.mutex(&name).unwrap();
    let waiter_lock = waiter_client.mutex(&name).unwrap();

    let (locked_tx, locked_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let holder = thread::spawn(move || {
        let _guard = holder_lock.lock().unwrap();
        locked_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        panic!("deliberate panic inside the critical section");
    });
    locked_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    let ready = Arc::new(Barrier::new(2));
    let (acq_tx, acq_rx) = mpsc::channel();
    let waiter = {
        let ready = Arc::clone(&ready);
        thread::spawn(move || {
            ready.wait();
            let g = waiter_lock.try_lock_for(Duration::from_secs(20)).unwrap();
            acq_tx.send((Instant::now(), g.is_some())).unwrap();
        })
    };
    ready.wait();
    // Let the waiter get to its wait: wait for its subscription.
    let channel = common::release_channel(&name);
    assert!(
        common::wait_until(Duration::from_secs(5), || common::numsub(
            &mut conn, &channel
        ) >= 1),
        "waiter never subscribed to {channel}"
    );

    let panicked_at = Instant::now();
    go_tx.send(()).unwrap();
    let joined = with_deadline(Duration::from_secs(10), move || holder.join().is_err());
    assert!(joined, "holder thread did not panic");
    let (acquired_at, got) = acq_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(got, "waiter timed out");
    let latency = acquired_at.duration_since(panicked_at);
    println!("waiter acquired {latency:?} after the holder panicked");
    assert!(latency < Duration::from_secs(1), "took {latency:?}");
    waiter.join().unwrap();
}

/// `with_lock`: the closure's value comes back; the lock is held while it runs (another
/// client's `try_lock` finds it taken, and the closure may re-enter it) and free after.
#[test]
fn with_lock_holds_the_lock_around_the_closure() {
    let (_server, url) = common::server_url();
    let name = common::unique_name("mutex-with-lock");
    let [ours, theirs] = common::clients::<2>(&url);
    let lock = ours.mutex(&name).unwrap();
    let other = theirs.mutex(&name).unwrap();
    let token = lock
        .with_lock(|guard| {
            assert!(guard.is_held());
            assert!(lock.is_locked().unwrap());
            assert!(
                other.try_lock().unwrap().is_none(),
                "another client took the lock inside with_lock"
            );
            let inner = lock.with_lock(|g| g.fencing_token()).unwrap();
            assert_eq!(inner, guard.fencing_token(), "a re-entry keeps the token");
            assert!(
                guard.is_held(),
                "the inner with_lock released the outer level"
            );
            guard.fencing_token()
        })
        .unwrap();
    assert!(token > 0);
    assert!(!lock.is_locked().unwrap(), "still held after with_lock");
    let g = other.try_lock().unwrap().expect("free after with_lock");
    assert!(g.fencing_token() > token);
}

/// `with_lock` reports the release's error as `unlock` would: the key deleted during the
/// closure gives `LeaseLost`, another client holding it by then `NotOwner` (its hold is left
/// alone); a closure that panics releases the lock as the guard is dropped.
#[test]
fn with_lock_reports_the_release_error_and_a_panic_releases() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("mutex-with-lock-lost");
    let key = common::lock_key(&name);
    let [ours, theirs] = common::clients::<2>(&url);
    let lock = ours.mutex(&name).unwrap();
    let other = theirs.mutex(&name).unwrap();

    let mut ran = false;
    let e = lock
        .with_lock(|_| {
            let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
            ran = true;
        })
        .expect_err("the lease was lost inside the closure");
    assert!(ran);
    assert!(matches!(e, locksmith::Error::LeaseLost), "{e:?}");

    let mut theirs_held = None;
    let e = lock
        .with_lock(|_| {
            let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
            theirs_held = other.try_lock().unwrap();
            assert!(theirs_held.is_some(), "the deleted lock was not free");
        })
        .expect_err("another owner holds the lock after the closure");
    assert!(matches!(e, locksmith::Error::NotOwner), "{e:?}");
    let theirs_held = theirs_held.unwrap();
    assert!(theirs_held.is_held() && lock.is_locked().unwrap());
    theirs_held.unlock().unwrap();

    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lock.with_lock(|_| panic!("a failing critical section"))
    }));
    assert!(panicked.is_err());
    assert!(!lock.is_locked().unwrap(), "the panic left the lock held");
}
