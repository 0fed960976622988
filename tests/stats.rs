//! `Client::stats` after a known workload on a real server: exact counts of acquisitions
//! (uncontended, re-entered, contended, handed off locally, of every lock type), calls that
//! timed out or found the lock busy, a lease lost by deleting its key, renewals, and a
//! pub/sub reconnect by `CLIENT KILL TYPE pubsub`; bounds where time is involved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{wait_numsub, wait_until, with_deadline};
use locksmith::{Client, Stats};

/// The counts of `s` that a workload sets exactly, in one tuple to compare at once:
/// (acquired, acquired_locally, contended, timed_out, busy, failed, released).
fn counts(s: &Stats) -> (u64, u64, u64, u64, u64, u64, u64) {
    (
        s.acquired,
        s.acquired_locally,
        s.contended,
        s.timed_out,
        s.busy,
        s.failed,
        s.released,
    )
}

/// Acquisitions of every lock type, uncontended, re-entered, contended (a waiter in another
/// thread while another client holds the lock), handed off locally, plus timeouts and busy
/// `try_` calls: each is counted exactly once, in the right counters, by every clone of the
/// client and by no other client; the waits and holds land in their histograms.
#[test]
fn counts_a_known_workload() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        // A run of local hand-offs may last long enough for the second thread to get in line.
        let client = Client::builder(url.as_str())
            .local_handoff_max_time(Duration::from_secs(30))
            .build()
            .unwrap();
        let other = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("stats");
        assert_eq!(counts(&client.stats()), (0, 0, 0, 0, 0, 0, 0));

        // 5 uncontended mutex acquisitions, and a re-entry (two guards: two acquisitions).
        let lock = client.mutex(&name).unwrap();
        for _ in 0..5 {
            lock.lock().unwrap().unlock().unwrap();
        }
        let outer = lock.lock().unwrap();
        let inner = lock.lock().unwrap();
        // Held for a known time: the hold histogram's max is at least that.
        thread::sleep(Duration::from_millis(200));
        drop(inner);
        drop(outer);
        assert_eq!(counts(&client.stats()), (7, 0, 0, 0, 0, 0, 7));

        // One of each other type (a semaphore's `acquire_many` and a set of locks count once).
        drop(client.fair_mutex(&name).unwrap().lock().unwrap());
        let rw = client.rw_lock(&name).unwrap();
        drop(rw.read().unwrap());
        drop(rw.write().unwrap());
        drop(client.semaphore(&name, 3).unwrap().acquire_many(2).unwrap());
        let pair = [format!("{name}-a"), format!("{name}-b")];
        drop(client.multi_lock(&pair).unwrap().lock().unwrap());
        assert_eq!(counts(&client.stats()), (12, 0, 0, 0, 0, 0, 12));

        // Another client holds a lock: 3 calls time out, one `try_lock` finds it busy.
        let busy = format!("{name}-busy");
        let held = other.mutex(&busy).unwrap().lock().unwrap();
        let mine = client.mutex(&busy).unwrap();
        for _ in 0..3 {
            assert!(
                mine.try_lock_for(Duration::from_millis(30))
                    .unwrap()
                    .is_none()
            );
        }
        assert!(mine.try_lock().unwrap().is_none());
        assert_eq!(counts(&client.stats()), (12, 0, 0, 3, 1, 0, 12));

        // A waiter in another thread, woken by the other client's release: contended, with a
        // wait of at least the time the lock stayed held once it waited.
        let waiter = {
            let mine = mine.clone();
            thread::spawn(move || mine.lock().unwrap().unlock().unwrap())
        };
        wait_numsub(&mut conn, &common::release_channel(&busy), 1);
        let queued = Instant::now();
        thread::sleep(Duration::from_millis(100));
        held.unlock().unwrap();
        waiter.join().unwrap();
        let waited = queued.elapsed();
        let s = client.stats();
        assert_eq!(counts(&s), (13, 0, 1, 3, 1, 0, 13));
        assert!(s.wait.max() >= Duration::from_millis(100), "{s:?}");
        assert!(s.wait.max() <= waited + Duration::from_millis(100), "{s:?}");

        // A local hand-off: thread A holds, thread B queues, A's release hands it to B.
        let handed = format!("{name}-handoff");
        let lock = client.mutex(&handed).unwrap();
        let (tx_locked, rx_locked) = mpsc::channel();
        let (tx_go, rx_go) = mpsc::channel::<()>();
        let a = {
            let lock = lock.clone();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                tx_locked.send(g.fencing_token()).unwrap();
                rx_go.recv().unwrap();
                g.unlock().unwrap();
            })
        };
        let token_a = rx_locked.recv().unwrap();
        let b = {
            let lock = lock.clone();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                let token = g.fencing_token();
                g.unlock().unwrap();
                token
            })
        };
        wait_numsub(&mut conn, &common::release_channel(&handed), 1);
        tx_go.send(()).unwrap();
        a.join().unwrap();
        assert_eq!(b.join().unwrap(), token_a + 1, "not handed off locally");
        let s = client.stats();
        assert_eq!(counts(&s), (15, 1, 2, 3, 1, 0, 15));

        // The histograms saw every acquisition and every hold.
        assert_eq!(s.wait.count(), s.acquired);
        assert_eq!(s.hold.count(), s.released);
        assert!(s.hold.max() >= Duration::from_millis(200), "{s:?}");
        assert!(s.hold.p50() <= s.hold.p99() && s.hold.p99() <= s.hold.max());
        assert!(s.wait.p50() <= s.wait.max());
        assert_eq!(s.leases_lost, 0);

        // Clones share the counters; another client counts apart.
        let clone = client.clone();
        drop(clone.mutex(&name).unwrap().lock().unwrap());
        assert_eq!(client.stats().acquired, 16);
        assert_eq!(clone.stats(), client.stats());
        assert_eq!(counts(&other.stats()), (1, 0, 0, 0, 0, 0, 1));
    });
}

/// A lease renewed a few times, then lost by deleting its key: renewals counted, the loss
/// counted once (with the renewal that found the key gone), and a pub/sub connection killed
/// under a waiter counted as one reconnect.
#[test]
fn counts_renewals_a_lost_lease_and_a_reconnect() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let client = Client::builder(url.as_str())
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let name = common::unique_name("stats-lost");
        let guard = client.mutex(&name).unwrap().lock().unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || client.stats().renewals >= 2),
            "not renewed: {:?}",
            client.stats()
        );
        assert_eq!(client.stats().renewal_failures, 0);
        let _: () = redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .query(&mut conn)
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || client.stats().leases_lost == 1),
            "the loss was not counted: {:?}",
            client.stats()
        );
        assert!(!guard.is_held());
        let s = client.stats();
        assert_eq!(s.leases_lost, 1);
        assert!(s.renewal_failures >= 1, "{s:?}");
        drop(guard);
        assert_eq!(client.stats().released, 1);

        // A waiter keeps the pub/sub connection subscribed; killing it makes one reconnect.
        let other = Client::open(url.as_str()).unwrap();
        let busy = format!("{name}-busy");
        let held = other.mutex(&busy).unwrap().lock().unwrap();
        let waiter = {
            let lock = client.mutex(&busy).unwrap();
            thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
        };
        wait_numsub(&mut conn, &common::release_channel(&busy), 1);
        assert_eq!(client.stats().reconnects, 0);
        let killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn)
            .unwrap();
        assert_eq!(killed, 1, "only the waiting client's pub/sub connection");
        assert!(
            wait_until(Duration::from_secs(10), || client.stats().reconnects == 1),
            "the reconnect was not counted: {:?}",
            client.stats()
        );
        held.unlock().unwrap();
        waiter.join().unwrap();
        let s = client.stats();
        assert_eq!(s.reconnects, 1);
        assert_eq!((s.acquired, s.contended), (2, 1));
    });
}

/// On a cluster: acquisitions counted as on one server, and the sharded pub/sub connection to
/// one master, killed under a waiter, counted as one reconnect.
#[test]
fn counts_on_a_cluster() {
    let cluster = common::RedisCluster::start();
    with_deadline(Duration::from_secs(90), move || {
        let client = Client::cluster(cluster.seed_urls()).build().unwrap();
        let other = Client::cluster(cluster.seed_urls()).build().unwrap();
        let name = common::unique_name("stats-cluster");
        let master = cluster.master_of_key(&common::lock_key(&name));
        let channel = common::release_channel(&name);
        drop(client.mutex(&name).unwrap().lock().unwrap());

        let held = other.mutex(&name).unwrap().lock().unwrap();
        let waiter = {
            let lock = client.mutex(&name).unwrap();
            thread::spawn(move || lock.lock().unwrap().unlock().unwrap())
        };
        let mut conn = cluster.conn(master);
        assert!(
            wait_until(Duration::from_secs(10), || {
                let (_, n): (String, u64) = redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg(&channel)
                    .query(&mut conn)
                    .unwrap();
                n == 1
            }),
            "the waiter did not subscribe"
        );
        let killed: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query(&mut conn)
            .unwrap();
        assert_eq!(killed, 1);
        assert!(
            wait_until(Duration::from_secs(10), || client.stats().reconnects == 1),
            "the reconnect was not counted: {:?}",
            client.stats()
        );
        held.unlock().unwrap();
        waiter.join().unwrap();
        let s = client.stats();
        assert_eq!(counts(&s), (2, 0, 1, 0, 0, 0, 2));
        assert_eq!(s.reconnects, 1);
    });
}
