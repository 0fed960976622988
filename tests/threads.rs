//! Thread accounting: exactly two background threads per `Client`, however many locks it holds
//! or waits for, and none left after the last clone drops.
//!
//! Thread counts are process-wide, and libtest starts a new thread for each test it runs, so
//! this binary holds a single `#[test]` that runs its scenarios one after the other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{assert_threads, thread_count, with_deadline};
use locksmith::Client;

#[test]
fn threads_per_client() {
    let (server, url) = common::server_url();
    {
        let url = url.clone();
        let mut conn = server.conn();
        with_deadline(Duration::from_secs(60), move || {
            holders_and_waiters(&url, &mut conn);
        });
    }
    {
        let url = url.clone();
        with_deadline(Duration::from_secs(30), move || failed_connects(&url));
    }
    let mut conn = server.conn();
    with_deadline(Duration::from_secs(60), move || {
        dropped_client_leaves_nothing(&url, &mut conn);
    });
}

/// A client holding 1,000 locks, and a second client with 100 threads blocked on them, add
/// two threads each and nothing else; after the drops the count is back to the baseline.
fn holders_and_waiters(url: &str, conn: &mut redis::Connection) {
    const HELD: usize = 1000;
    const WAITERS: usize = 100;
    let base = thread_count();
    let a = Client::open(url).unwrap();
    assert_threads(base + 2, "after the first client");

    let names: Vec<String> = (0..HELD).map(|_| common::unique_name("threads")).collect();
    let locks: Vec<_> = names.iter().map(|n| a.mutex(n).unwrap()).collect();
    let start = Instant::now();
    let guards: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    println!("acquired {HELD} locks in {:?}", start.elapsed());
    assert!(guards.iter().all(|g| g.is_held()));
    assert_threads(base + 2, "holding 1,000 locks");

    let b = Client::open(url).unwrap();
    assert_threads(base + 4, "after the second client");

    let (done_tx, done_rx) = mpsc::channel();
    let waited: Vec<&String> = names.iter().step_by(HELD / WAITERS).collect();
    let waiters: Vec<_> = waited
        .iter()
        .map(|name| {
            let lock = b.mutex(name).unwrap();
            let done_tx = done_tx.clone();
            thread::spawn(move || {
                let g = lock.lock().unwrap();
                g.unlock().unwrap();
                done_tx.send(()).unwrap();
            })
        })
        .collect();
    // Every waiter is really waiting once its release channel has a subscriber.
    for name in &waited {
        let channel = common::release_channel(name);
        assert!(
            common::wait_until(Duration::from_secs(10), || common::numsub(conn, &channel)
                >= 1),
            "no subscriber on {channel}"
        );
    }
    assert_eq!(
        done_rx.try_recv(),
        Err(mpsc::TryRecvError::Empty),
        "a waiter got a held lock"
    );
    assert_threads(base + 4 + WAITERS, "with 100 blocked waiters");

    let start = Instant::now();
    drop(guards);
    for _ in 0..WAITERS {
        done_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a waiter never acquired after the release");
    }
    println!(
        "released {HELD} locks; all {WAITERS} waiters done after {:?}",
        start.elapsed()
    );
    for w in waiters {
        w.join().unwrap();
    }
    assert_threads(base + 4, "after the waiters finished");

    drop(locks);
    drop(a);
    assert_threads(base + 2, "after dropping the first client");
    drop(b);
    assert_threads(base, "after dropping both clients");
}

/// Clients that fail to build (closed port, black hole, bad URL) leave no thread behind.
fn failed_connects(url: &str) {
    let base = thread_count();
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let black_hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole = black_hole.local_addr().unwrap().port();
    for target in [
        format!("redis://127.0.0.1:{closed}/"),
        format!("redis://127.0.0.1:{hole}/"),
        "http://x".to_string(),
        url.replacen("redis://", "rediss://", 1),
    ] {
        let res = Client::builder(target.as_str())
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
            .build();
        assert!(res.is_err(), "{target}: client built");
        assert_threads(base, &format!("after a failed build for {target}"));
    }
    drop(black_hole);
}

/// 1,000 lock/unlock cycles over 20 names from 4 threads, then the client drops: threads
/// back to baseline, no channel subscribed, the client's connections closed, and no keys
/// left but the fencing counters.
fn dropped_client_leaves_nothing(url: &str, conn: &mut redis::Connection) {
    let base = thread_count();
    let clients_before = client_count(conn);
    let names: Vec<String> = (0..20).map(|_| common::unique_name("drop")).collect();
    let client = Client::open(url).unwrap();
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let locks: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
            thread::spawn(move || {
                for i in 0..250 {
                    let g = locks[(t * 7 + i) % locks.len()].lock().unwrap();
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_threads(base + 2, "after the workers finished");
    assert!(client_count(conn) > clients_before);
    drop(client);
    assert_threads(base, "after dropping the client");

    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{}*", common::PREFIX))
        .query(conn)
        .unwrap();
    assert!(channels.is_empty(), "still subscribed: {channels:?}");
    assert!(
        common::wait_until(Duration::from_secs(2), || client_count(conn)
            == clients_before),
        "the dropped client's connections are still open ({} clients, {} before)",
        client_count(conn),
        clients_before
    );
    for name in &names {
        assert!(
            !common::exists(conn, &common::lock_key(name)),
            "{name} left locked"
        );
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", common::PREFIX))
        .query(conn)
        .unwrap();
    // Fencing counters (the other lock types'), and release markers, which live for what the
    // lease had left.
    assert!(
        keys.iter()
            .all(|k| k.ends_with(":fence") || k.ends_with(":released")),
        "keys left behind: {keys:?}"
    );
}

fn client_count(conn: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count()
}
