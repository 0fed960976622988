//! Re-entry: per thread within one `Client`; other threads and other clients are other owners.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

fn count(conn: &mut redis::Connection, name: &str) -> Option<u64> {
    common::lock_value(conn, name).map(|v| v.count)
}

/// Nested guards on one thread share the fencing token; the lock value counts the depth; the lock is
/// released only with the outermost guard, in whatever order they go.
#[test]
fn nested_guards_on_one_thread() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let [client, other] = common::clients(&url);
        let name = common::unique_name("nested");
        let lock = client.mutex(&name).unwrap();
        let same_name = client.mutex(&name).unwrap();
        let theirs = other.mutex(&name).unwrap();

        let g1 = lock.lock().unwrap();
        assert_eq!(count(&mut conn, &name), Some(1));
        let g2 = lock.lock().unwrap();
        assert_eq!(count(&mut conn, &name), Some(2));
        let g3 = lock.try_lock().unwrap().expect("re-entry by try_lock");
        let g4 = lock
            .try_lock_for(Duration::ZERO)
            .unwrap()
            .expect("re-entry by try_lock_for(0)");
        // Another `Mutex` value of the same name on the same client is the same lock.
        let g5 = same_name
            .try_lock()
            .unwrap()
            .expect("re-entry via another Mutex value");
        assert_eq!(count(&mut conn, &name), Some(5));
        let token = g1.fencing_token();
        for g in [&g2, &g3, &g4, &g5] {
            assert_eq!(g.fencing_token(), token, "nested guard has another token");
            assert!(g.is_held());
        }

        // Out of order: drop an inner one first, then unlock the outermost by hand.
        drop(g3);
        assert_eq!(count(&mut conn, &name), Some(4));
        g5.unlock().unwrap();
        g4.unlock().unwrap();
        assert_eq!(count(&mut conn, &name), Some(2));
        assert!(theirs.try_lock().unwrap().is_none());
        g2.unlock().unwrap();
        assert_eq!(count(&mut conn, &name), Some(1));
        assert!(lock.is_locked().unwrap());
        assert!(theirs.try_lock().unwrap().is_none());
        g1.unlock().unwrap();
        assert!(!lock.is_locked().unwrap());
        assert!(!common::exists(&mut conn, &common::lock_key(&name)));

        // A fresh acquisition is a new owner period with a larger token.
        let g = lock.lock().unwrap();
        assert!(g.fencing_token() > token);
        assert_eq!(count(&mut conn, &name), Some(1));
    });
}

/// Another thread of the same `Client` is another owner: it waits while the first thread
/// holds the lock at any depth, and gets it once the outermost guard goes.
#[test]
fn other_thread_waits_for_outermost_guard() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let (_client, _name, lock) = common::one_owner(&url, "other-thread");

        let outer = lock.lock().unwrap();
        let inner = lock.lock().unwrap();
        let token = outer.fencing_token();

        // A second thread: one try_lock (must be None), then a blocking lock().
        let (started_tx, started_rx) = mpsc::channel();
        let (acquired_tx, acquired_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let theirs = lock.clone();
        let other = thread::spawn(move || {
            let tried = theirs.try_lock().unwrap().map(|g| g.fencing_token());
            started_tx.send(tried).unwrap();
            let g = theirs.lock().unwrap();
            acquired_tx
                .send((Instant::now(), g.fencing_token()))
                .unwrap();
            // Hold until the main thread has checked it cannot re-enter.
            done_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            g.unlock().unwrap();
        });

        let tried = started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            tried, None,
            "another thread of the same client entered the lock"
        );
        assert_eq!(
            acquired_rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout),
            "other thread acquired while held at depth 2"
        );
        drop(inner);
        assert_eq!(
            acquired_rx.recv_timeout(Duration::from_millis(300)),
            Err(RecvTimeoutError::Timeout),
            "other thread acquired while held at depth 1"
        );
        assert!(lock.is_locked().unwrap());

        let released_at = Instant::now();
        outer.unlock().unwrap();
        let (acquired_at, their_token) = acquired_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("other thread never acquired after the outermost guard went");
        println!(
            "other thread acquired {:?} after release",
            acquired_at.duration_since(released_at)
        );
        assert!(their_token > token);

        // Now the main thread is the other owner.
        assert!(
            lock.try_lock().unwrap().is_none(),
            "main thread entered the other thread's lock"
        );
        done_tx.send(()).unwrap();
        other.join().unwrap();
        assert!(lock.try_lock().unwrap().is_some());
    });
}

/// Two clients are two owners, even in one thread.
#[test]
fn two_clients_are_two_owners() {
    common::on_server(Duration::from_secs(20), move |url, _conn| {
        let ([a, _], name, [la, lb]) = common::two_owners(&url, "two-clients");

        let ga = la.lock().unwrap();
        assert!(lb.try_lock().unwrap().is_none());
        common::assert_waits_in_vain(Duration::from_millis(200), |d| lb.try_lock_for(d));
        // A clone of the client is the same owner.
        let a2 = a.clone();
        let ga2 = a2
            .mutex(&name)
            .unwrap()
            .try_lock()
            .unwrap()
            .map(|g| g.fencing_token());
        assert_eq!(
            ga2,
            Some(ga.fencing_token()),
            "a clone of the client is another owner"
        );

        let token = ga.fencing_token();
        drop(ga);
        let gb = lb.try_lock().unwrap().expect("b after a released");
        assert!(gb.fencing_token() > token);
        assert!(la.try_lock().unwrap().is_none());
    });
}

/// One thread may hold several different locks and re-enter each.
#[test]
fn several_locks_on_one_thread() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(url.as_str()).unwrap();
        let names: Vec<String> = (0..3).map(|_| common::unique_name("multi")).collect();
        let locks: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
        let outer: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
        let inner: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
        for (o, i) in outer.iter().zip(&inner) {
            assert_eq!(o.fencing_token(), i.fencing_token());
        }
        for n in &names {
            assert_eq!(count(&mut conn, n), Some(2));
        }
        drop(inner);
        for n in &names {
            assert_eq!(count(&mut conn, n), Some(1));
        }
        drop(outer);
        for n in &names {
            assert!(!common::exists(&mut conn, &common::lock_key(n)));
        }
    });
}

/// A guard whose lease ran out locally is no basis for a re-entry: the thread's next `lock()`
/// is a new acquisition (new token, depth 1) even though its old level is still on the server,
/// and the stale guard's release must not touch the new acquisition.
#[test]
fn stale_guard_never_releases_a_later_acquisition() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("stale-guard");
        let key = common::lock_key(&name);
        let lock = client
            .mutex(&name)
            .unwrap()
            .with_lease(Duration::from_millis(100))
            .unwrap();
        let stale = lock.lock().unwrap();
        // Keep the key on the server while the local lease deadline passes.
        redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(10_000)
            .exec(&mut conn)
            .unwrap();
        assert!(common::wait_until(Duration::from_secs(2), || !stale.is_held()));

        let fresh = lock.lock().unwrap();
        assert!(fresh.fencing_token() > stale.fencing_token());
        assert_eq!(count(&mut conn, &name), Some(1));

        let err = stale.unlock().unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        assert_eq!(
            count(&mut conn, &name),
            Some(1),
            "the stale guard released a level"
        );
        assert!(fresh.is_held());
        fresh.unlock().unwrap();
        assert!(!common::exists(&mut conn, &key));
    });
}
