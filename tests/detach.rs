//! Held locks and threads: guards shared by reference with scoped threads, and holds that move
//! to another thread (`detach` / `attach`), for every lock type, against a real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::kinds::{self, Kind, Moving};
use common::{RedisServer, unique_name, with_deadline};
use locksmith::{Client, Error};

/// Takes lock `name` of kind `kind` through `client` and detaches the hold.
fn take(client: &Client, kind: Kind, name: &str) -> Box<dyn Moving> {
    let guard = kind.open(client, name).lock().unwrap();
    guard
        .detach()
        .unwrap_or_else(|_| panic!("{kind:?}: a hold of one level did not detach"))
}

/// Attaches the hold on the calling thread, checks the guard, and releases it there.
fn attach_and_unlock(moving: Box<dyn Moving>) -> locksmith::Result<()> {
    let g = moving.attach()?;
    g.check()?;
    g.unlock()
}

#[test]
fn ownership_moves_across_threads_for_every_lock_type() {
    common::on_server(Duration::from_secs(60), move |url, _conn| {
        let client = Client::open(url.as_str()).unwrap();
        let other = Client::open(url.as_str()).unwrap();
        // Every lock type: a hold taken on the calling thread, detached, attached on another
        // thread and released there, while a second client finds the lock held throughout
        // and free afterwards.
        for ty in kinds::ALL {
            let name = unique_name("moves");
            let moving = take(&client, ty, &name);
            assert!(moving.is_held(), "{ty:?}: detached and held");
            assert!(!ty.free_for(&other, &name), "{ty:?}: held while detached");
            let (tx, rx) = mpsc::channel();
            let worker = thread::spawn(move || tx.send(attach_and_unlock(moving)).unwrap());
            rx.recv().unwrap().unwrap_or_else(|e| panic!("{ty:?}: {e}"));
            worker.join().unwrap();
            assert!(
                ty.free_for(&other, &name),
                "{ty:?}: free after the worker's unlock"
            );

            // Released from another thread without attaching, and dropped while detached.
            let moving = take(&client, ty, &name);
            thread::spawn(move || moving.unlock())
                .join()
                .unwrap()
                .unwrap();
            assert!(
                ty.free_for(&other, &name),
                "{ty:?}: free after a detached unlock"
            );
            let moving = take(&client, ty, &name);
            thread::spawn(move || drop(moving)).join().unwrap();
            assert!(
                ty.free_for(&other, &name),
                "{ty:?}: free after a detached drop"
            );
        }
    });
}

#[test]
fn guards_are_shared_with_scoped_threads() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let client = Client::open(url.as_str()).unwrap();
        let guard = client
            .mutex(&unique_name("scoped"))
            .unwrap()
            .lock()
            .unwrap();
        let token = guard.fencing_token();
        let set = client
            .multi_lock([unique_name("scoped-a"), unique_name("scoped-b")])
            .unwrap()
            .lock()
            .unwrap();
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    guard.check().unwrap();
                    assert!(guard.is_held());
                    assert_eq!(guard.fencing_token(), token);
                    assert!(guard.validity() > Duration::ZERO);
                    set.check().unwrap();
                });
            }
        });
        guard.unlock().unwrap();
        set.unlock().unwrap();
    });
}

#[test]
fn a_detached_hold_is_renewed_past_several_leases() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let lease = Duration::from_millis(300);
        let client = Client::builder(url.as_str()).lease(lease).build().unwrap();
        let other = Client::open(url.as_str()).unwrap();
        let name = unique_name("renewed");
        let detached = client
            .mutex(&name)
            .unwrap()
            .lock()
            .unwrap()
            .detach()
            .unwrap();
        let token = other
            .mutex(&name)
            .unwrap()
            .holder()
            .unwrap()
            .unwrap()
            .fencing_token;
        // Time is the point: the hold must outlive several of its leases, renewed.
        let until = Instant::now() + lease * 5;
        while Instant::now() < until {
            assert!(detached.is_held());
            assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_none());
            thread::sleep(lease / 3);
        }
        let guard = thread::spawn(move || {
            let g = detached.attach().unwrap();
            (g.fencing_token(), g.unlock())
        });
        let (attached_token, unlocked) = guard.join().unwrap();
        assert_eq!(attached_token, token);
        unlocked.unwrap();
        assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
    });
}

#[test]
fn reentry_after_attach_and_no_detach_of_a_reentered_hold() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let client = Client::open(url.as_str()).unwrap();
        let mutex = client.mutex(&unique_name("reenter")).unwrap();
        let outer = mutex.lock().unwrap();
        let inner = mutex.lock().unwrap();
        // A re-entered hold cannot move: the guard comes back, and the hold is unchanged.
        let inner = inner.detach().expect_err("a re-entered hold moved");
        assert!(inner.is_held());
        drop(inner);
        let token = outer.fencing_token();
        let detached = outer.detach().unwrap();
        let mutex2 = mutex.clone();
        thread::spawn(move || {
            let g = detached.attach().unwrap();
            let nested = mutex2.lock().unwrap();
            assert_eq!(
                nested.fencing_token(),
                token,
                "a re-entry of the attached hold"
            );
            drop(nested);
            assert!(g.is_held());
            g.unlock().unwrap();
        })
        .join()
        .unwrap();
        assert!(mutex.try_lock().unwrap().is_some());
    });
}

#[test]
fn the_detaching_thread_waits_like_any_other_owner() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let client = Client::open(url.as_str()).unwrap();
        let mutex = client.mutex(&unique_name("waits")).unwrap();
        let detached = mutex.lock().unwrap().detach().unwrap();
        assert!(
            mutex
                .try_lock_for(Duration::from_millis(200))
                .unwrap()
                .is_none(),
            "the detaching thread re-entered a detached hold"
        );
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let mutex = mutex.clone();
            thread::spawn(move || {
                tx.send(()).unwrap();
                mutex.lock().unwrap().unlock().unwrap();
            })
        };
        rx.recv().unwrap();
        detached.unlock().unwrap();
        waiter.join().unwrap();
        // The detaching thread takes the lock anew once it is free.
        mutex.lock().unwrap().unlock().unwrap();
    });
}

#[test]
fn attaching_where_the_thread_reads_already_fails_and_releases() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let client = Client::open(url.as_str()).unwrap();
        let lock = client.rw_lock(&unique_name("reads")).unwrap();
        let theirs = thread::scope(|s| {
            s.spawn(|| lock.read().unwrap().detach().unwrap())
                .join()
                .unwrap()
        });
        let mine = lock.read().unwrap();
        let err = theirs
            .attach()
            .expect_err("a thread attached a second read hold");
        assert!(matches!(err, Error::Misuse { .. }), "{err}");
        drop(mine);
        assert!(lock.try_write().unwrap().is_some(), "both reads released");
    });
}

#[test]
fn a_detached_hold_lost_to_an_empty_restart_reports_the_loss() {
    let mut server = RedisServer::start();
    let url = server.url();
    let client = Client::open(url.as_str()).unwrap();
    let mutex = client.mutex(&unique_name("restart")).unwrap();
    let detached = mutex.lock().unwrap().detach().unwrap();
    server.restart();
    let outcome = with_deadline(Duration::from_secs(30), move || {
        thread::spawn(move || detached.unlock()).join().unwrap()
    });
    assert!(
        matches!(outcome, Err(Error::LeaseLost)),
        "a lost detached hold released as {outcome:?}"
    );
}

#[test]
fn a_release_from_another_thread_wakes_a_waiter_as_fast_as_a_normal_release() {
    let server = RedisServer::start();
    with_deadline(Duration::from_secs(60), move || {
        let mut normal = Vec::new();
        let mut detached = Vec::new();
        for _ in 0..5 {
            normal.push(common::mutex_wake(&server, |g| {
                let at = Instant::now();
                g.unlock().unwrap();
                at
            }));
            detached.push(common::mutex_wake(&server, |g| {
                let d = g.detach().unwrap();
                thread::spawn(move || {
                    let at = Instant::now();
                    d.unlock().unwrap();
                    at
                })
                .join()
                .unwrap()
            }));
        }
        normal.sort();
        detached.sort();
        let (n, d) = (normal[2], detached[2]);
        eprintln!("median wake: {d:?} after a detached release, {n:?} after a normal one");
        // The same path: a published release, whichever thread sends it. Generous bounds on a
        // shared machine; the figures are in the failure message.
        assert!(
            d < Duration::from_millis(250) && d <= n * 4 + Duration::from_millis(50),
            "median wake: {d:?} after a detached release, {n:?} after a normal one"
        );
    });
}
