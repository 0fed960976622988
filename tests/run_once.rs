//! Run-once jobs: `MutexGuard::unlock_after` keeps a lock at least its minimum hold after the
//! acquisition, against a real server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{RedisServer, unique_name};
use locksmith::{Client, Error};

#[test]
fn unlock_after_keeps_the_lock_until_the_minimum_hold() {
    common::on_server(Duration::from_secs(30), |url, _| {
        let [client, other] = common::clients::<2>(&url);
        let name = unique_name("at-least");
        let min_hold = Duration::from_millis(800);
        let acquired = Instant::now();
        let guard = client.mutex(&name).unwrap().lock().unwrap();
        guard.unlock_after(min_hold).unwrap();
        let mutex = other.mutex(&name).unwrap();
        assert!(
            mutex.try_lock().unwrap().is_none(),
            "free before its minimum hold"
        );
        let stats = client.stats();
        assert_eq!(stats.acquired, stats.released, "the guard ended");
        // Free once the minimum hold has passed (it expires by itself: nobody publishes).
        let g = mutex
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("free after its minimum hold");
        let free = acquired.elapsed();
        assert!(
            free >= min_hold - Duration::from_millis(20),
            "free {free:?} after the acquisition, before its minimum hold {min_hold:?}"
        );
        drop(g);
    });
}

#[test]
fn unlock_after_a_passed_minimum_releases_at_once() {
    common::on_server(Duration::from_secs(30), |url, _| {
        let [client, other] = common::clients::<2>(&url);
        let name = unique_name("passed");
        let guard = client.mutex(&name).unwrap().lock().unwrap();
        guard.unlock_after(Duration::ZERO).unwrap();
        assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());

        // An inner level is released as `unlock` releases it: the outer level still holds.
        let mutex = client.mutex(&name).unwrap();
        let outer = mutex.lock().unwrap();
        let inner = mutex.lock().unwrap();
        inner.unlock_after(Duration::from_secs(60)).unwrap();
        assert!(outer.is_held());
        outer.unlock().unwrap();
        assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
    });
}

#[test]
fn unlock_after_a_lost_lease_says_so() {
    let mut server = RedisServer::start();
    let url = server.url();
    let client = Client::open(url.as_str()).unwrap();
    let guard = client.mutex(&unique_name("lost")).unwrap().lock().unwrap();
    server.restart();
    // Within one connect and one command timeout, as every release.
    let outcome = guard.unlock_after(Duration::from_secs(60));
    assert!(
        matches!(outcome, Err(Error::LeaseLost)),
        "unlock_after of a lost lease: {outcome:?}"
    );
}
