//! Waiters are woken by the release message, not by polling.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use common::with_deadline;
use locksmith::Client;

/// A waiter blocked behind a lock with a 30 s lease sends no acquire attempts while it waits
/// (at most the attempt before subscribing and the one after the subscription is confirmed),
/// and acquires well under a second after the holder's release.
#[test]
fn waiter_wakes_on_release_without_polling() {
    let (server, url, mut conn) = common::server_url_conn();
    let port = server.port();
    with_deadline(Duration::from_secs(30), move || {
        let monitor = common::Monitor::start(port);
        let [holder, waiter] = common::clients(&url);
        let name = common::unique_name("wakeup");
        let channel = common::release_channel(&name);
        let holder_lock = holder.mutex(&name).unwrap();
        let guard = holder_lock.lock().unwrap();
        let token = guard.fencing_token();

        // The holder does nothing while holding (its first renewal is 10 s away), so every
        // script call from here on is the waiter's.
        let before = common::script_calls(&mut conn);
        let w = common::await_lock(waiter.mutex(&name).unwrap(), Duration::from_secs(20));
        // Settled once it has tried again after its SUBSCRIBE (seen by MONITOR), not after a
        // while: on a busy machine that re-check may come late.
        assert!(
            monitor.wait_blocked(&channel, &common::lock_key(&name), Duration::from_secs(5)),
            "waiter never subscribed to {channel} and tried again"
        );
        let settled = common::script_calls(&mut conn);
        thread::sleep(Duration::from_millis(1500));
        let after = common::script_calls(&mut conn);
        assert_eq!(
            w.rx.try_recv().err(),
            Some(TryRecvError::Empty),
            "waiter finished early"
        );
        println!(
            "waiter script calls: {} while getting ready, {} during 1.5 s of waiting",
            settled - before,
            after - settled
        );
        assert!(
            after - before <= 2,
            "waiter made {} acquire attempts while the lock was held",
            after - before
        );
        assert_eq!(after, settled, "waiter polled Redis while waiting");

        let (latency, their_token) =
            w.woken_by(|| guard.unlock().unwrap(), Duration::from_secs(10));
        println!("wake latency after release: {latency:?}");
        assert!(their_token > token);
        assert!(
            latency < Duration::from_secs(1),
            "woke {latency:?} after release"
        );
    });
}

/// Twenty hand-offs between two clients: each waiter acquires well under a second after the
/// release. Prints min / median / max.
#[test]
fn handoff_latency_rounds() {
    const ROUNDS: usize = 20;
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let [holder, waiter] = common::clients(&url);
        let name = common::unique_name("handoff");
        let channel = common::release_channel(&name);
        let hl = holder.mutex(&name).unwrap();
        let mut latencies = Vec::new();
        for _ in 0..ROUNDS {
            let guard = hl.lock().unwrap();
            let w = common::await_lock(waiter.mutex(&name).unwrap(), Duration::from_secs(10));
            assert!(common::wait_until(Duration::from_secs(5), || {
                common::numsub(&mut conn, &channel) >= 1
            }));
            thread::sleep(Duration::from_millis(20));
            let (latency, _) = w.woken_by(|| drop(guard), Duration::from_secs(10));
            latencies.push(latency);
        }
        latencies.sort();
        println!(
            "hand-off latency over {ROUNDS} rounds: min {:?}, median {:?}, max {:?}",
            latencies[0],
            latencies[ROUNDS / 2],
            latencies[ROUNDS - 1]
        );
        assert!(latencies[ROUNDS - 1] < Duration::from_secs(1));
    });
}

/// Six waiters on two clients, blocked behind a third: after the release they all get the
/// lock in turn, quickly, with increasing tokens and no overlap.
#[test]
fn many_waiters_all_acquire_in_turn() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let holder = Client::open(url.as_str()).unwrap();
        let clients = [
            Client::open(url.as_str()).unwrap(),
            Client::open(url.as_str()).unwrap(),
        ];
        let name = common::unique_name("many-waiters");
        let channel = common::release_channel(&name);
        let holder_lock = holder.mutex(&name).unwrap();
        let guard = holder_lock.lock().unwrap();
        let first_token = guard.fencing_token();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let inside = Arc::new(StdMutex::new(false));
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let lock = clients[i % 2].mutex(&name).unwrap();
                let order = Arc::clone(&order);
                let inside = Arc::clone(&inside);
                thread::spawn(move || {
                    let g = if i % 3 == 0 {
                        lock.lock().unwrap()
                    } else {
                        lock.try_lock_for(Duration::from_secs(15))
                            .unwrap()
                            .expect("waiter timed out")
                    };
                    {
                        let mut inside = inside.lock().unwrap();
                        assert!(!*inside, "critical sections overlap");
                        *inside = true;
                    }
                    order.lock().unwrap().push(g.fencing_token());
                    thread::sleep(Duration::from_millis(20));
                    *inside.lock().unwrap() = false;
                    g.unlock().unwrap();
                })
            })
            .collect();
        // Both clients' subscribers are on the channel before the release.
        assert!(common::wait_until(Duration::from_secs(5), || {
            common::numsub(&mut conn, &channel) >= 2
        }));
        thread::sleep(Duration::from_millis(100));
        let released_at = Instant::now();
        drop(guard);
        for h in handles {
            h.join().unwrap();
        }
        let took = released_at.elapsed();
        println!("6 waiters done {took:?} after the first release");
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 6);
        assert!(order[0] > first_token);
        for w in order.windows(2) {
            assert!(w[0] < w[1], "tokens not increasing: {order:?}");
        }
    });
}

/// Whether a waiter for `name` subscribed to its release channel and tried again after that
/// (seen by MONITOR within 5 s): from then on it sleeps until a release.
fn blocked(monitor: &common::Monitor, name: &str) -> bool {
    monitor.wait_blocked(
        &common::release_channel(name),
        &common::lock_key(name),
        Duration::from_secs(5),
    )
}

/// A waiter that becomes the leader of its client's queue when the thread ahead of it takes
/// the lock is not woken for that: the next release will wake it. When the lock then vanishes
/// without a release (its key deleted: the holder's lease is lost and nothing is published),
/// the waiter still tries again within about a lease, instead of waiting for a message that
/// never comes.
#[test]
fn a_quiet_leader_tries_again_within_a_lease_when_no_release_comes() {
    let (server, url, mut conn) = common::server_url_conn();
    let port = server.port();
    with_deadline(Duration::from_secs(40), move || {
        let monitor = common::Monitor::start(port);
        let lease = Duration::from_secs(1);
        // Releases go through Redis: the first waiter acquires there, not by a hand-off.
        let client = Client::builder(url.as_str())
            .lease(lease)
            .local_handoff(false)
            .build()
            .unwrap();
        let name = common::unique_name("quiet");
        let holder = client.mutex(&name).unwrap();
        let guard = holder.lock().unwrap();

        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let stop_rx = Arc::new(StdMutex::new(stop_rx));
        let waiter = |label: &'static str| {
            let (lock, tx, stop) = (
                client.mutex(&name).unwrap(),
                tx.clone(),
                Arc::clone(&stop_rx),
            );
            thread::Builder::new()
                .name(label.into())
                .spawn(move || {
                    let g = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                    tx.send((label, Instant::now(), g.is_some())).unwrap();
                    // The first to get it keeps its guard until the test ends.
                    let _ = stop.lock().unwrap().recv();
                })
                .unwrap()
        };
        let first = waiter("quiet-first");
        assert!(blocked(&monitor, &name), "the first waiter never blocked");
        let second = waiter("quiet-second");
        // It joins the queue behind the first without a call to Redis, and parks.
        assert!(
            common::wait_until(Duration::from_secs(5), || common::thread_sleeps(
                "quiet-second"
            )),
            "the second waiter never parked"
        );

        guard.unlock().unwrap();
        let (label, _, got) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((label, got), ("quiet-first", true));
        // The lock vanishes with no release message: the first waiter's lease is lost.
        redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .query::<()>(&mut conn)
            .unwrap();
        let deleted = Instant::now();
        let (label, at, got) = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("the second waiter never tried again");
        assert_eq!((label, got), ("quiet-second", true));
        let waited = at.duration_since(deleted);
        println!("the second waiter got the lock {waited:?} after the key was deleted");
        assert!(
            waited < lease + Duration::from_secs(2),
            "the second waiter took {waited:?} (lease {lease:?})"
        );
        drop(stop_tx);
        first.join().unwrap();
        second.join().unwrap();
    });
}

/// A waiting leader's next acquire is primed on a pooled connection, for the subscriber thread
/// to write the moment the release message arrives. When that connection died while it
/// waited (here every command connection is killed), the write or its reply fails, and the
/// waiter takes the lock at the release all the same, on a new connection, at once rather
/// than at its next re-check.
#[test]
fn a_waiter_whose_connections_died_while_it_waited_takes_the_lock_at_the_release() {
    let (server, url, mut conn) = common::server_url_conn();
    let port = server.port();
    with_deadline(Duration::from_secs(40), move || {
        let monitor = common::Monitor::start(port);
        let [holder, waiter] = common::clients(&url);
        let name = common::unique_name("primed");
        let held = holder.mutex(&name).unwrap();
        let guard = held.lock().unwrap();

        let w = common::await_lock(waiter.mutex(&name).unwrap(), Duration::from_secs(20));
        assert!(blocked(&monitor, &name), "the waiter never blocked");
        // Every command connection but this one (pub/sub ones stay: the release must reach
        // the waiter).
        let killed: u64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
            .query(&mut conn)
            .unwrap();
        assert!(killed >= 2, "killed {killed} connections");

        let (waited, _) = w.woken_by(|| guard.unlock().unwrap(), Duration::from_secs(15));
        println!("the waiter got the lock {waited:?} after the release");
        // Its re-check would come only when the holder's 30 s lease ran out.
        assert!(waited < Duration::from_secs(5), "took {waited:?}");
    });
}

/// A sleeping leader's primed acquire holds a connection, but a client keeps only a few primed
/// at once: 100 threads waiting on 100 names leave the waiting client with far fewer than 100
/// command connections (the pool keeps up to 32 idle, and 8 are primed at most).
#[test]
fn many_sleeping_leaders_keep_few_connections() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        const NAMES: usize = 100;
        let [holder, waiter] = common::clients(&url);
        let names: Vec<String> = (0..NAMES)
            .map(|i| common::unique_name(&format!("few-conns-{i}")))
            .collect();
        let held: Vec<_> = names.iter().map(|n| holder.mutex(n).unwrap()).collect();
        let guards: Vec<_> = held.iter().map(|m| m.lock().unwrap()).collect();
        let normal = |conn: &mut redis::Connection| -> usize {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("TYPE")
                .arg("normal")
                .query(conn)
                .unwrap();
            list.lines().count()
        };
        let before = normal(&mut conn);
        let calls = common::script_calls(&mut conn);

        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = names
            .iter()
            .map(|n| {
                let (lock, tx) = (waiter.mutex(n).unwrap(), tx.clone());
                thread::spawn(move || {
                    let g = lock.try_lock_for(Duration::from_secs(30)).unwrap();
                    tx.send(g.is_some()).unwrap();
                })
            })
            .collect();
        // Each waiter leads its own name's queue: one attempt before it subscribes, one once
        // the subscription is confirmed, then it primes its next acquire and sleeps (the
        // holder's lease is 30 s).
        assert!(
            common::wait_until(Duration::from_secs(20), || {
                common::script_calls(&mut conn) - calls >= 2 * NAMES as u64
            }),
            "the waiters did not make their two attempts each"
        );
        // Connections that served the attempts and were not kept are closed by then, or soon.
        let bound = 32 + 8 + 4;
        let mut waiting = usize::MAX;
        let settled = common::wait_until(Duration::from_secs(10), || {
            waiting = normal(&mut conn) - before;
            waiting <= bound
        });
        println!("{NAMES} sleeping leaders: {waiting} command connections of the waiting client");
        assert!(
            settled,
            "{waiting} command connections for {NAMES} sleeping leaders"
        );

        drop(guards);
        for _ in 0..NAMES {
            assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
    });
}

/// A waiter in another process, for the flag test below: waits at most 20 s for `LS_NAME`,
/// records when it got it (`SET LS_DONE <mono_ns>`), prints `acquired`.
#[test]
fn child_flag_waiter() {
    if !common::is_child("flag_waiter") {
        return;
    }
    let url = common::child_env("LS_URL");
    let client = Client::open(url.as_str()).unwrap();
    let m = client.mutex(&common::child_env("LS_NAME")).unwrap();
    let g = m.try_lock_for(Duration::from_secs(20)).unwrap();
    let at = common::mono_ns();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("SET")
        .arg(common::child_env("LS_DONE"))
        .arg(if g.is_some() { at } else { 0 })
        .exec(&mut conn)
        .unwrap();
    println!("acquired");
}

/// A release publishes only when a waiter's failed attempt flagged the lock. The holder
/// re-enters and releases the inner level while a waiter of another process waits (each
/// rewrites the lock's value, and must keep the flag): its outermost release still publishes,
/// and the waiter takes the lock within a second of it, not at its re-check (the holder's
/// 30 s lease).
#[test]
fn a_waiters_flag_survives_reentry_and_inner_release() {
    let (server, url, mut conn) = common::server_url_conn();
    let port = server.port();
    let (released, at) = with_deadline(Duration::from_secs(60), move || {
        let name = common::unique_name("flag");
        let done = format!("test:done:{name}");
        let monitor = common::Monitor::start(port);
        let holder = Client::open(url.as_str()).unwrap();
        let m = holder.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        assert!(!common::lock_value(&mut conn, &name).unwrap().waiters);
        let child = common::spawn_child(
            "child_flag_waiter",
            "flag_waiter",
            &url,
            &name,
            &[("LS_DONE", done.clone())],
        );
        // Settled once it has tried again after its SUBSCRIBE: it sleeps until a release.
        assert!(
            monitor.wait_blocked(
                &common::release_channel(&name),
                &common::lock_key(&name),
                Duration::from_secs(20)
            ),
            "the waiter never subscribed and tried again"
        );
        assert!(common::lock_value(&mut conn, &name).unwrap().waiters);
        let inner = m.lock().unwrap();
        let v = common::lock_value(&mut conn, &name).unwrap();
        assert_eq!((v.count, v.waiters), (2, true), "{v:?}");
        inner.unlock().unwrap();
        let v = common::lock_value(&mut conn, &name).unwrap();
        assert_eq!((v.count, v.waiters), (1, true), "{v:?}");
        let released = common::mono_ns();
        g.unlock().unwrap();
        child.wait_line("acquired", Duration::from_secs(30));
        let at: u64 = redis::cmd("GET").arg(&done).query(&mut conn).unwrap();
        (released, at)
    });
    assert!(at > 0, "the waiter timed out");
    let latency = common::ms_between(released, at);
    println!("the other process's waiter took the lock {latency:.1} ms after the release");
    assert!(
        latency < 1000.0,
        "the waiter took the lock {latency:.1} ms after the release"
    );
}

#[test]
fn child_kind_queued_waiter() {
    common::kinds::child_queued_waiter();
}

/// Two waiters of one client queue behind another client's holder: the first gets the lock
/// at the release, the second within milliseconds of the first's release, for every lock type
/// that one holder at a time takes (the read-write lock's cases are in `rwlock.rs`), in every
/// form, with local hand-off on and off; and the same with the second waiter in another process.
#[test]
fn a_second_queued_waiter_gets_the_lock_at_the_first_ones_release() {
    use common::kinds::{self, Form, Kind};
    with_deadline(Duration::from_secs(300), || {
        for kind in [Kind::Mutex, Kind::Fair, Kind::Semaphore(1), Kind::Multi] {
            for handoff in [true, false] {
                for form in Form::ALL {
                    for child in [false, true] {
                        kinds::queued_waiters_are_served_at_once(
                            kind, kind, kind, handoff, form, child,
                        );
                    }
                }
            }
        }
    });
}
