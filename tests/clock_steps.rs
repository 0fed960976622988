//! The server's wall clock steps while locks are used (an NTP step, a VM restored from a
//! snapshot, an operator's `date -s`): fencing tokens never go back, a forward step that ends
//! leases early is noticed by the holder and said in the log and the stats.
//!
//! The servers run with the harness's clock library preloaded (`testkit/src/clock_shift.c`),
//! which offsets their `CLOCK_REALTIME` by a value the test moves; see
//! [`common::clock_shift`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer, SentinelSet, clock_shift, with_deadline};
use locksmith::Client;

/// A server whose wall clock the test can step.
fn server() -> RedisServer {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    RedisServer::start()
}

/// One token of each kind of grant on `name`, each taken and released at once: a `Mutex` of
/// `a` and of `b` (two clients), a `FairMutex`, an `RwLock` writer and a two-name
/// `MultiMutex`, in that order.
fn tokens(a: &Client, b: &Client, name: &str) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let mutex = a.mutex(name).unwrap();
    let g = mutex.try_lock().unwrap().expect("free");
    out.push(("Mutex (first client)", g.fencing_token()));
    g.unlock().unwrap();
    let mutex = b.mutex(name).unwrap();
    let g = mutex.try_lock().unwrap().expect("free");
    out.push(("Mutex (second client)", g.fencing_token()));
    g.unlock().unwrap();
    let fair = a.fair_mutex(name).unwrap();
    let g = fair.try_lock().unwrap().expect("free");
    out.push(("FairMutex", g.fencing_token()));
    g.unlock().unwrap();
    let rw = b.rw_lock(name).unwrap();
    let g = rw.try_write().unwrap().expect("free");
    out.push(("RwLock writer", g.fencing_token()));
    g.unlock().unwrap();
    let other = format!("{name}/other");
    let multi = a.multi_lock([name, other.as_str()]).unwrap();
    let g = multi.try_lock().unwrap().expect("free");
    out.push(("MultiMutex", g.fencing_token(name).unwrap()));
    g.unlock().unwrap();
    out
}

/// Tokens of every lock type strictly rise across a step back of the server clock by `step`,
/// and keep rising while the clock is still behind the tokens issued before it.
fn tokens_rise_across_a_step_back(step: Duration) {
    let server = server();
    let a = Client::open(server.url().as_str()).unwrap();
    let b = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-back");
    let before = tokens(&a, &b, &name);
    clock_shift::step_back(server.port(), step);
    let after = tokens(&a, &b, &name);
    let again = tokens(&a, &b, &name);
    let mut last = 0;
    for (what, token) in before.iter().chain(&after).chain(&again) {
        assert!(
            *token > last,
            "{what}: token {token} after {last}, with the server clock stepped back {step:?} \
             (tokens before the step {before:?}, after it {after:?}, then {again:?})"
        );
        last = *token;
    }
    // Mutex and FairMutex tokens of one name rise together: one mark per name.
    assert!(after[0].1 > before[4].1);
}

/// A step back of 10 s (an NTP step): no token goes back.
#[test]
fn tokens_rise_across_a_10_s_step_back() {
    tokens_rise_across_a_step_back(Duration::from_secs(10));
}

/// A step back of an hour (a VM restored from an old snapshot): no token goes back.
#[test]
fn tokens_rise_across_a_1_hour_step_back() {
    tokens_rise_across_a_step_back(Duration::from_secs(3600));
}

/// Local hand-offs issue tokens from a block the grant reserved; after a step back, another
/// client's grant still lands above the whole block.
#[test]
fn tokens_rise_above_a_hand_off_block_across_a_step_back() {
    let server = server();
    let local = Client::builder(server.url().as_str())
        .local_handoff_max_count(1024)
        .build()
        .unwrap();
    let other = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-block");
    let lock = local.mutex(&name).unwrap();
    // Two threads pass the lock between them many times: hand-offs take tokens of the block.
    let mut seen: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..200)
                        .map(|_| {
                            let g = lock.lock().unwrap();
                            g.fencing_token()
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    seen.sort_unstable();
    let highest = *seen.last().unwrap();
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    let g = other
        .mutex(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    assert!(
        g.fencing_token() > highest,
        "token {} after a step back, below the {highest} issued before (by {} grants and \
         hand-offs)",
        g.fencing_token(),
        seen.len()
    );
}

/// A step forward of 20 s under a held 3 s lease: Redis expires the key by its wall clock at
/// once and another client takes the lock. The old holder learns of it by its next renewal
/// (within a renewal interval, 1 s here), its `unlock()` is never `Ok`, and the client says
/// that the server's clock jumped, once, in its stats.
#[test]
fn a_forward_step_ends_a_lease_and_the_holder_is_told() {
    let server = server();
    let lease = Duration::from_secs(3);
    let holder = Client::builder(server.url().as_str())
        .lease(lease)
        .build()
        .unwrap();
    let other = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-forward");
    let lock = holder.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    let token = guard.fencing_token();
    // One renewal first, so that the client has read the server's clock once.
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= 1));
    clock_shift::step_forward(server.port(), Duration::from_secs(20));
    let stepped = Instant::now();
    let taken = other
        .mutex(&name)
        .unwrap()
        .try_lock_for(Duration::from_secs(2))
        .unwrap()
        .expect("the key expired with the forward step");
    assert!(taken.fencing_token() > token);
    let seen = with_deadline(Duration::from_secs(10), {
        let holder = holder.clone();
        move || {
            assert!(common::wait_until(Duration::from_secs(5), || holder
                .stats()
                .leases_lost
                >= 1));
            stepped.elapsed()
        }
    });
    assert!(!guard.is_held());
    assert!(guard.check().is_err());
    assert!(
        guard.unlock().is_err(),
        "unlock was Ok after the lease was lost"
    );
    assert!(
        seen < Duration::from_millis(2500),
        "the holder learned of the loss {seen:?} after the step (renewal interval 1 s)"
    );
    // Said in the round that found the loss.
    assert_eq!(holder.stats().clock_jumps, 1, "one jump, counted once");
    println!("loss seen {seen:?} after a 20 s forward step; lease 3 s");
}

/// A step back of 10 s under held leases: nothing is lost (the keys now expire later by the
/// server's clock), the client says once that the clock jumped, and the holder's next token
/// after a release is still above the old one.
#[test]
fn a_step_back_is_said_once_and_leases_are_kept() {
    let server = server();
    let lease = Duration::from_millis(1500);
    let holder = Client::builder(server.url().as_str())
        .lease(lease)
        .build()
        .unwrap();
    let names: Vec<String> = (0..3)
        .map(|i| common::unique_name(&format!("clock-back-held-{i}")))
        .collect();
    let locks: Vec<_> = names.iter().map(|n| holder.mutex(n).unwrap()).collect();
    let guards: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= 3));
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    let renewed = holder.stats().renewals;
    // Two more rounds after the step (one renewal interval is 500 ms here).
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= renewed + 6));
    let stats = holder.stats();
    assert_eq!(stats.clock_jumps, 1, "one jump for three leases: {stats:?}");
    assert_eq!(stats.leases_lost, 0);
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    for g in guards {
        g.check().unwrap();
        g.unlock().unwrap();
    }
    for (lock, old) in locks.iter().zip(tokens) {
        let g = lock.try_lock().unwrap().expect("free");
        assert!(g.fencing_token() > old);
    }
}

/// Through Sentinel: the master's clock stepped back 10 s, tokens of every lock type keep rising
/// (the slot marks are on the master, and replicate).
#[test]
fn tokens_rise_across_a_step_back_through_sentinel() {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    let set = SentinelSet::start();
    let client = |()| {
        Client::sentinel(set.sentinel_urls(), set.master_name())
            .build()
            .unwrap()
    };
    let (a, b) = (client(()), client(()));
    let name = common::unique_name("clock-sentinel");
    let before = tokens(&a, &b, &name);
    clock_shift::step_back(set.master_port(), Duration::from_secs(10));
    let after = tokens(&a, &b, &name);
    for ((what, old), (_, new)) in before.iter().zip(&after) {
        assert!(
            new > old,
            "{what}: {new} after {old}, with the master's clock stepped back"
        );
    }
    assert!(after[0].1 > before[4].1);
}

/// On a cluster: the clock of every master stepped back 10 s, tokens of names on every master
/// keep rising.
#[test]
fn tokens_rise_across_a_step_back_on_a_cluster() {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    let cluster = RedisCluster::start();
    let client = || Client::cluster(cluster.seed_urls()).build().unwrap();
    let (a, b) = (client(), client());
    // Names on different masters.
    let names: Vec<String> = (0..6)
        .map(|i| common::unique_name(&format!("clock-cluster-{i}")))
        .collect();
    let before: Vec<_> = names.iter().map(|n| tokens(&a, &b, n)).collect();
    for port in cluster.masters() {
        clock_shift::step_back(port, Duration::from_secs(10));
    }
    for (name, before) in names.iter().zip(before) {
        let after = tokens(&a, &b, name);
        assert!(
            after[0].1 > before[4].1,
            "{name}: {after:?} after {before:?}, with the masters' clocks stepped back"
        );
    }
}
