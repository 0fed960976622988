//! Held locks and threads: guards shared by reference with scoped threads, and holds that move
//! to another thread (`detach` / `attach`), for every lock type, against a real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, unique_name, with_deadline};
use locksmith::{Client, Detached, Error, MutexGuard};

/// Every lock type, as the scenarios below take and check it: a hold taken on the calling
/// thread, detached, attached on another thread and released there, while a second client
/// finds the lock held throughout and free afterwards.
#[derive(Clone, Copy, Debug)]
enum Type {
    Mutex,
    Fair,
    Writer,
    Reader,
    Permits,
    Set,
}

const TYPES: [Type; 6] = [
    Type::Mutex,
    Type::Fair,
    Type::Writer,
    Type::Reader,
    Type::Permits,
    Type::Set,
];

/// A detached hold of any type, moved to another thread and back into a guard there.
enum Moving {
    Mutex(Detached<locksmith::MutexGuard>),
    Fair(Detached<locksmith::FairMutexGuard>),
    Writer(Detached<locksmith::RwLockWriteGuard>),
    Reader(Detached<locksmith::RwLockReadGuard>),
    Permits(Detached<locksmith::SemaphorePermit>),
    Set(Detached<locksmith::MultiGuard>),
}

impl Moving {
    /// Takes `name` of type `ty` through `client` and detaches it.
    fn take(client: &Client, ty: Type, name: &str) -> Moving {
        match ty {
            Type::Mutex => Moving::Mutex(
                client
                    .mutex(name)
                    .unwrap()
                    .lock()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
            Type::Fair => Moving::Fair(
                client
                    .fair_mutex(name)
                    .unwrap()
                    .lock()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
            Type::Writer => Moving::Writer(
                client
                    .rw_lock(name)
                    .unwrap()
                    .write()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
            Type::Reader => Moving::Reader(
                client
                    .rw_lock(name)
                    .unwrap()
                    .read()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
            Type::Permits => Moving::Permits(
                client
                    .semaphore(name, 1)
                    .unwrap()
                    .acquire()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
            Type::Set => Moving::Set(
                client
                    .multi_lock([format!("{name}:a"), format!("{name}:b")])
                    .unwrap()
                    .lock()
                    .unwrap()
                    .detach()
                    .unwrap(),
            ),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Moving::Mutex(d) => d.is_held(),
            Moving::Fair(d) => d.is_held(),
            Moving::Writer(d) => d.is_held(),
            Moving::Reader(d) => d.is_held(),
            Moving::Permits(d) => d.is_held(),
            Moving::Set(d) => d.is_held(),
        }
    }

    /// Attaches the hold on the calling thread, checks the guard, and releases it there.
    fn attach_and_unlock(self) -> locksmith::Result<()> {
        match self {
            Moving::Mutex(d) => {
                let g = d.attach()?;
                g.check()?;
                g.unlock()
            }
            Moving::Fair(d) => {
                let g = d.attach()?;
                g.check()?;
                g.unlock()
            }
            Moving::Writer(d) => {
                let g = d.attach()?;
                g.check()?;
                g.unlock()
            }
            Moving::Reader(d) => {
                let g = d.attach()?;
                g.check()?;
                g.unlock()
            }
            Moving::Permits(d) => {
                let p = d.attach()?;
                p.check()?;
                p.release()
            }
            Moving::Set(d) => {
                let g = d.attach()?;
                g.check()?;
                g.unlock()
            }
        }
    }

    /// Releases the hold from the calling thread, without attaching it.
    fn unlock(self) -> locksmith::Result<()> {
        match self {
            Moving::Mutex(d) => d.unlock(),
            Moving::Fair(d) => d.unlock(),
            Moving::Writer(d) => d.unlock(),
            Moving::Reader(d) => d.unlock(),
            Moving::Permits(d) => d.unlock(),
            Moving::Set(d) => d.unlock(),
        }
    }
}

/// Whether `other` can take `name` of type `ty` now (a writer for a reader's lock: readers
/// share), giving it back at once.
fn free_for(other: &Client, ty: Type, name: &str) -> bool {
    match ty {
        Type::Mutex => other.mutex(name).unwrap().try_lock().unwrap().is_some(),
        Type::Fair => other
            .fair_mutex(name)
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some(),
        Type::Writer | Type::Reader => other.rw_lock(name).unwrap().try_write().unwrap().is_some(),
        Type::Permits => other
            .semaphore(name, 1)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_some(),
        Type::Set => other
            .multi_lock([format!("{name}:a"), format!("{name}:b")])
            .unwrap()
            .try_lock()
            .unwrap()
            .is_some(),
    }
}

#[test]
fn ownership_moves_across_threads_for_every_lock_type() {
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(60), move || {
        let client = Client::open(url.as_str()).unwrap();
        let other = Client::open(url.as_str()).unwrap();
        for ty in TYPES {
            let name = unique_name("moves");
            let moving = Moving::take(&client, ty, &name);
            assert!(moving.is_held(), "{ty:?}: detached and held");
            assert!(!free_for(&other, ty, &name), "{ty:?}: held while detached");
            let (tx, rx) = mpsc::channel();
            let worker = thread::spawn(move || tx.send(moving.attach_and_unlock()).unwrap());
            rx.recv().unwrap().unwrap_or_else(|e| panic!("{ty:?}: {e}"));
            worker.join().unwrap();
            assert!(
                free_for(&other, ty, &name),
                "{ty:?}: free after the worker's unlock"
            );

            // Released from another thread without attaching, and dropped while detached.
            let moving = Moving::take(&client, ty, &name);
            thread::spawn(move || moving.unlock())
                .join()
                .unwrap()
                .unwrap();
            assert!(
                free_for(&other, ty, &name),
                "{ty:?}: free after a detached unlock"
            );
            let moving = Moving::take(&client, ty, &name);
            thread::spawn(move || drop(moving)).join().unwrap();
            assert!(
                free_for(&other, ty, &name),
                "{ty:?}: free after a detached drop"
            );
        }
    });
}

#[test]
fn guards_are_shared_with_scoped_threads() {
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
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
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
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
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
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
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
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
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
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
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
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

/// How long a waiter of another client takes to get the lock once `release` frees it
/// (`release` gets the holding guard, and returns when it began the release).
fn wake_time(server: &RedisServer, release: impl FnOnce(MutexGuard) -> Instant) -> Duration {
    let holder = Client::open(server.url().as_str()).unwrap();
    let waiter = Client::open(server.url().as_str()).unwrap();
    let name = unique_name("wake");
    let guard = holder.mutex(&name).unwrap().lock().unwrap();
    let w = {
        let name = name.clone();
        thread::spawn(move || {
            let g = waiter.mutex(&name).unwrap().lock().unwrap();
            let at = Instant::now();
            drop(g);
            at
        })
    };
    // The waiter sleeps on the release channel once its attempt flagged the lock ('w': its
    // release publishes).
    let mut conn = server.conn();
    let flagged = common::wait_until(Duration::from_secs(5), || {
        let v: Option<String> = redis::cmd("GET")
            .arg(common::lock_key(&name))
            .query(&mut conn)
            .unwrap();
        v.is_some_and(|v| v.ends_with('w'))
    });
    assert!(flagged, "the waiter never flagged the lock");
    let started = release(guard);
    w.join().unwrap().saturating_duration_since(started)
}

#[test]
fn a_release_from_another_thread_wakes_a_waiter_as_fast_as_a_normal_release() {
    let server = RedisServer::start();
    with_deadline(Duration::from_secs(60), move || {
        let mut normal = Vec::new();
        let mut detached = Vec::new();
        for _ in 0..5 {
            normal.push(wake_time(&server, |g| {
                let at = Instant::now();
                g.unlock().unwrap();
                at
            }));
            detached.push(wake_time(&server, |g| {
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
