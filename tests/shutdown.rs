//! `Client::shutdown`: what the client holds is released at once (another client takes it
//! without waiting for a lease), its two threads are gone, guards and new calls on every clone
//! say the client was shut down, a waiter's call ends, and a shutdown while Redis is frozen
//! returns within its timeout.
//!
//! Thread counts are process-wide, and libtest starts a new thread for each test it runs, so
//! this binary holds a single `#[test]` that runs its scenarios one after the other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{assert_threads, thread_count, with_deadline};
use locksmith::{Client, Error};

#[track_caller]
fn assert_shut_down<T: std::fmt::Debug>(r: locksmith::Result<T>, what: &str) {
    assert!(matches!(r, Err(Error::Shutdown)), "{what}: {r:?}");
}

#[test]
fn shutdown() {
    let (server, url) = common::server_url();
    {
        let url = url.clone();
        with_deadline(Duration::from_secs(60), move || releases_and_stops(&url));
    }
    {
        let url = url.clone();
        with_deadline(Duration::from_secs(60), move || ends_a_waiting_call(&url));
    }
    with_deadline(Duration::from_secs(60), move || {
        returns_in_time_while_redis_is_frozen(server)
    });
}

/// A client holding a lock of each type (one of them re-entered, one with a fixed lease, one
/// detached and one held by another thread of a clone) shuts down: another client takes each
/// at once, the two threads are gone while clones and guards live on, and every guard and
/// call says the client was shut down.
fn releases_and_stops(url: &str) {
    let base = thread_count();
    let a = Client::open(url).unwrap();
    let b = Client::builder(url)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    assert_threads(base + 4, "after two clients");
    let name = |what: &str| common::unique_name(&format!("shutdown-{what}"));
    let (m, fixed, detached, fair, rw, sem, other) = (
        name("m"),
        name("fixed"),
        name("detached"),
        name("fair"),
        name("rw"),
        name("sem"),
        name("other"),
    );

    let mutex = a.mutex(&m).unwrap();
    let outer = mutex.lock().unwrap();
    let inner = mutex.lock().unwrap();
    let fixed_guard = a
        .mutex(&fixed)
        .unwrap()
        .with_lease(Duration::from_secs(30))
        .unwrap()
        .lock()
        .unwrap();
    let held_elsewhere = a
        .mutex(&detached)
        .unwrap()
        .lock()
        .unwrap()
        .detach()
        .unwrap();
    let fair_guard = a.fair_mutex(&fair).unwrap().lock().unwrap();
    let read = a.rw_lock(&rw).unwrap().read().unwrap();
    let permit = a.semaphore(&sem, 1).unwrap().acquire().unwrap();
    // Another thread of a clone holds a lock until told to drop it.
    let (drop_tx, drop_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel();
    let clone = a.clone();
    let other_name = other.clone();
    let holder = thread::spawn(move || {
        let g = clone.mutex(&other_name).unwrap().lock().unwrap();
        held_tx.send(()).unwrap();
        drop_rx.recv().unwrap();
        assert!(!g.is_held(), "a guard reads held after the shutdown");
        drop(g);
        assert_shut_down(clone.mutex(&other_name), "a handle from a clone");
    });
    held_rx.recv().unwrap();
    for n in [&m, &fixed, &detached, &fair, &other] {
        assert!(b.mutex(n).is_ok());
    }
    assert!(b.mutex(&m).unwrap().try_lock().unwrap().is_none());

    let start = Instant::now();
    a.shutdown(Duration::from_secs(5)).unwrap();
    println!("shutdown took {:?}", start.elapsed());
    assert_threads(base + 3, "after the shutdown, clones and guards alive");

    // Everything is free for another client at once (their leases have 30 s left).
    let taken: Vec<_> = [&m, &fixed, &detached, &other]
        .into_iter()
        .map(|n| {
            let g = b.mutex(n).unwrap().try_lock().unwrap();
            g.unwrap_or_else(|| panic!("{n} still held after the shutdown"))
        })
        .collect();
    let fair_b = b.fair_mutex(&fair).unwrap().try_lock().unwrap().unwrap();
    let write_b = b.rw_lock(&rw).unwrap().try_write().unwrap().unwrap();
    let permit_b = b
        .semaphore(&sem, 1)
        .unwrap()
        .try_acquire()
        .unwrap()
        .unwrap();

    // Guards: not held, and their release says why; a drop does nothing (b holds the lock).
    assert!(!outer.is_held() && !permit.is_held());
    assert_shut_down(inner.unlock(), "unlock of an inner guard");
    assert_shut_down(outer.unlock(), "unlock");
    assert_shut_down(fixed_guard.unlock(), "unlock of a fixed lease");
    assert_shut_down(held_elsewhere.unlock(), "unlock of a detached hold");
    assert_shut_down(permit.unlock(), "unlock of a permit");
    drop(fair_guard);
    drop(read);
    drop_tx.send(()).unwrap();
    holder.join().unwrap();
    for g in taken {
        g.unlock().unwrap();
    }
    fair_b.unlock().unwrap();
    write_b.unlock().unwrap();
    permit_b.unlock().unwrap();

    // New calls on every clone and handle, before anything is sent.
    assert_shut_down(mutex.lock(), "lock");
    assert_shut_down(mutex.try_lock(), "try_lock");
    assert_shut_down(mutex.is_locked(), "is_locked");
    assert_shut_down(a.clone().mutex(&m), "a handle");
    assert_shut_down(a.multi_lock([&m, &fixed]), "a set");
    assert_shut_down(a.locks(""), "a listing");
    // A second shutdown, from any clone, has nothing left to do.
    a.clone().shutdown(Duration::from_secs(1)).unwrap();
    let _ = a.stats();
    drop((a, mutex));
    drop(b);
    assert_threads(base, "after dropping both clients");
}

/// A thread of the client waiting for a lock another client holds ends its call with
/// `Error::Shutdown` soon after the shutdown, long before the holder's lease would end.
fn ends_a_waiting_call(url: &str) {
    let a = Client::open(url).unwrap();
    let b = Client::builder(url)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let name = common::unique_name("shutdown-wait");
    let held = b.mutex(&name).unwrap().lock().unwrap();
    let lock = a.mutex(&name).unwrap();
    let waiter = thread::spawn(move || {
        let r = lock.lock();
        (r.map(|_| ()), Instant::now())
    });
    let channel = common::release_channel(&name);
    let server = &mut redis::Client::open(url).unwrap().get_connection().unwrap();
    assert!(
        common::wait_until(Duration::from_secs(10), || common::numsub(server, &channel)
            >= 1),
        "the waiter never subscribed"
    );
    let start = Instant::now();
    a.shutdown(Duration::from_secs(5)).unwrap();
    let (r, ended) = waiter.join().unwrap();
    assert_shut_down(r, "a waiting lock call");
    let took = ended.saturating_duration_since(start);
    assert!(
        took < Duration::from_secs(3),
        "the waiter ended {took:?} after the shutdown"
    );
    assert!(held.is_held());
    held.unlock().unwrap();
}

/// With Redis frozen (`SIGSTOP`) while the client holds a lock, a shutdown returns within its
/// timeout and a small margin, whatever it managed to release.
fn returns_in_time_while_redis_is_frozen(server: common::RedisServer) {
    let client = Client::builder(server.url().as_str())
        .lease(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(2))
        .command_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let name = common::unique_name("shutdown-frozen");
    let guard = client.mutex(&name).unwrap().lock().unwrap();
    let other = client
        .mutex(&common::unique_name("shutdown-frozen"))
        .unwrap();
    let dropped = other.lock().unwrap();
    server.pause();
    // Let a renewal batch start against the frozen server.
    thread::sleep(Duration::from_millis(1200));
    let timeout = Duration::from_millis(500);
    let start = Instant::now();
    let r = client.shutdown(timeout);
    let took = start.elapsed();
    println!("shutdown with Redis frozen: {r:?} after {took:?}");
    assert!(
        took < timeout + Duration::from_millis(250),
        "shutdown took {took:?} with a timeout of {timeout:?}"
    );
    assert!(
        r.is_ok() || r.as_ref().is_err_and(Error::is_timeout),
        "{r:?}"
    );
    // Guards ask nothing of the frozen server any more: at once, whatever the timeouts.
    let start = Instant::now();
    assert_shut_down(guard.unlock(), "unlock");
    drop(dropped);
    assert_shut_down(other.try_lock(), "try_lock");
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(100),
        "guards and calls took {took:?}"
    );
    server.resume();
}
