//! Waiters are woken by the release message, not by polling.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::Client;

/// A waiter blocked behind a lock with a 30 s lease sends no acquire attempts while it waits
/// (at most the attempt before subscribing and the one after the subscription is confirmed),
/// and acquires well under a second after the holder's release.
#[test]
fn waiter_wakes_on_release_without_polling() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let port = server.port();
    with_deadline(Duration::from_secs(30), move || {
        let monitor = common::Monitor::start(port);
        let holder = Client::open(url.as_str()).unwrap();
        let waiter = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("wakeup");
        let channel = common::release_channel(&name);
        let holder_lock = holder.mutex(&name).unwrap();
        let guard = holder_lock.lock().unwrap();
        let token = guard.fencing_token();

        // The holder does nothing while holding (its first renewal is 10 s away), so every
        // script call from here on is the waiter's.
        let before = common::script_calls(&mut conn);
        let (tx, rx) = mpsc::channel();
        let wl = waiter.mutex(&name).unwrap();
        let w = thread::spawn(move || {
            let g = wl.try_lock_for(Duration::from_secs(20)).unwrap();
            let at = Instant::now();
            tx.send((at, g.as_ref().map(|g| g.fencing_token())))
                .unwrap();
        });
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
            rx.try_recv().err(),
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

        let released_at = Instant::now();
        guard.unlock().unwrap();
        let (acquired_at, got) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let latency = acquired_at.duration_since(released_at);
        println!("wake latency after release: {latency:?}");
        let their_token = got.expect("waiter timed out");
        assert!(their_token > token);
        assert!(
            latency < Duration::from_secs(1),
            "woke {latency:?} after release"
        );
        w.join().unwrap();
    });
}

/// Twenty hand-offs between two clients: each waiter acquires well under a second after the
/// release. Prints min / median / max.
#[test]
fn handoff_latency_rounds() {
    const ROUNDS: usize = 20;
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    with_deadline(Duration::from_secs(60), move || {
        let holder = Client::open(url.as_str()).unwrap();
        let waiter = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("handoff");
        let channel = common::release_channel(&name);
        let hl = holder.mutex(&name).unwrap();
        let mut latencies = Vec::new();
        for _ in 0..ROUNDS {
            let guard = hl.lock().unwrap();
            let (tx, rx) = mpsc::channel();
            let wl = waiter.mutex(&name).unwrap();
            let w = thread::spawn(move || {
                let g = wl.try_lock_for(Duration::from_secs(10)).unwrap();
                tx.send((Instant::now(), g.is_some())).unwrap();
            });
            assert!(common::wait_until(Duration::from_secs(5), || {
                common::numsub(&mut conn, &channel) >= 1
            }));
            thread::sleep(Duration::from_millis(20));
            let released_at = Instant::now();
            drop(guard);
            let (at, got) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(got, "waiter timed out");
            latencies.push(at.duration_since(released_at));
            w.join().unwrap();
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
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    with_deadline(Duration::from_secs(30), move || {
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
