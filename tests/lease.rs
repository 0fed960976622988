//! Leases: expiry after a holder dies, renewal while held, loss detection, fencing tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::Client;

/// Entry point of the holder process of [`killed_holder_lease_expires`]: acquires with the
/// lease `LS_LEASE_MS`, prints `locked`, then sleeps (at most a minute) until killed.
#[test]
fn child_holder() {
    let Some((url, name)) = common::child_url_name("holder") else {
        return;
    };
    let lease_ms: u64 = common::child_var("LS_LEASE_MS");
    let client = Client::builder(url.as_str())
        .lease(Duration::from_millis(lease_ms))
        .build()
        .unwrap();
    let lock = client.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    println!("locked");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(100));
    }
    drop(guard);
}

/// A holder process killed with SIGKILL (lease 1 s, renewed while it lived) never releases;
/// a waiter gets the lock once the remaining lease has run out: not before, and within the
/// lease + 1.5 s.
#[test]
fn killed_holder_lease_expires() {
    let lease = Duration::from_secs(1);
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = common::unique_name("killed-holder");
    let key = common::lock_key(&name);
    let mut child = common::spawn_leased("child_holder", "holder", &server.url(), &name, lease);
    child.wait_line("locked", Duration::from_secs(30));

    // Hold on well past the first lease: renewal keeps the dead-to-be holder's lock alive.
    thread::sleep(lease + Duration::from_millis(500));
    assert!(
        common::exists(&mut conn, &key),
        "holder's lease was not renewed"
    );
    let child_token = common::lock_value_at(&mut conn, &key)
        .expect("a held lock")
        .token;

    let url = server.url();
    let waiter = Client::open(url.as_str()).unwrap();
    let lock = waiter.mutex(&name).unwrap();
    assert!(lock.try_lock().unwrap().is_none());

    let remaining = Duration::from_millis(common::pttl(&mut conn, &key).try_into().unwrap());
    let killed_at = Instant::now();
    child.kill9();
    let (acquired_at, token) = with_deadline(Duration::from_secs(10), move || {
        let g = lock
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("lock still held 5 s after the holder was killed");
        (Instant::now(), g.fencing_token())
    });
    let waited = acquired_at.duration_since(killed_at);
    println!("holder killed with {remaining:?} of lease left; waiter acquired after {waited:?}");
    assert!(
        waited + Duration::from_millis(250) >= remaining,
        "acquired after {waited:?}, before the remaining lease {remaining:?} ran out"
    );
    assert!(
        waited <= lease + Duration::from_millis(1500),
        "acquired only after {waited:?}"
    );
    assert!(token > child_token);
}

/// With a 300 ms lease, a lock held for more than three leases is renewed throughout: no
/// other client gets it and the guard stays held. After release it is free at once, and no
/// renewal reaches Redis any more.
#[test]
fn renewal_keeps_lock_alive() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let lease = Duration::from_millis(300);
        let a = Client::builder(url.as_str()).lease(lease).build().unwrap();
        let b = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("renewal");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();
        let lb = b.mutex(&name).unwrap();

        let guard = la.lock().unwrap();
        let start = Instant::now();
        let mut checks = 0;
        while start.elapsed() < lease * 3 + Duration::from_millis(100) {
            assert!(
                lb.try_lock().unwrap().is_none(),
                "another client got the lock after {:?}",
                start.elapsed()
            );
            assert!(guard.is_held(), "guard lost after {:?}", start.elapsed());
            let ttl = common::pttl(&mut conn, &key);
            assert!(ttl > 0, "PTTL {ttl} after {:?}", start.elapsed());
            checks += 1;
            thread::sleep(Duration::from_millis(25));
        }
        println!("{checks} checks over {:?}", start.elapsed());
        guard.unlock().unwrap();

        let gb = lb.try_lock().unwrap().expect("free after release");
        // b's lease is 30 s (first renewal after 10 s), a holds nothing: silence.
        let calls = common::script_calls(&mut conn);
        thread::sleep(lease + Duration::from_millis(200));
        assert_eq!(
            common::script_calls(&mut conn),
            calls,
            "renewals still sent after release"
        );
        gb.unlock().unwrap();
    });
}

/// What a third party does to the lock key behind the holder's back.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Del,
    Pexpire,
}

fn apply(conn: &mut redis::Connection, key: &str, fault: Fault) {
    match fault {
        Fault::Del => redis::cmd("DEL").arg(key).exec(conn).unwrap(),
        Fault::Pexpire => redis::cmd("PEXPIRE").arg(key).arg(1).exec(conn).unwrap(),
    }
}

/// The lock key vanishes: the holder reports the loss within one renewal interval + slack,
/// another client can acquire, and the stale guard's `unlock()` errs with `is_lease_lost()`
/// without touching the new owner's lock.
fn lease_lost(fault: Fault) {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        // Lease 3 s, renewed every 1 s: a loss must be seen long before the local deadline.
        let lease = Duration::from_secs(3);
        let renew = lease / 3;
        let a = Client::builder(url.as_str()).lease(lease).build().unwrap();
        let [b, c] = common::clients(&url);
        let name = common::unique_name("lost");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();

        let guard = la.lock().unwrap();
        let owner_a = common::lock_value_at(&mut conn, &key)
            .map(|v| v.owner)
            .unwrap();
        assert!(guard.is_held());
        let fault_at = Instant::now();
        apply(&mut conn, &key, fault);
        assert!(
            common::wait_until(renew + Duration::from_millis(500), || !guard.is_held()),
            "holder still thinks it holds the lock {:?} after {fault:?}",
            fault_at.elapsed()
        );
        println!(
            "{fault:?}: holder saw the loss after {:?}",
            fault_at.elapsed()
        );

        let lb = b.mutex(&name).unwrap();
        let gb = lb
            .try_lock()
            .unwrap()
            .expect("lock free after the key vanished");
        let owner_b = common::lock_value_at(&mut conn, &key)
            .map(|v| v.owner)
            .unwrap();
        assert_ne!(owner_a, owner_b);

        let err = guard
            .unlock()
            .expect_err("unlock of a lost lease succeeded");
        assert!(err.is_lease_lost(), "unexpected error: {err}");
        assert_eq!(
            common::lock_value_at(&mut conn, &key)
                .map(|v| v.owner)
                .as_deref(),
            Some(&*owner_b)
        );
        assert!(lb.is_locked().unwrap());
        assert!(c.mutex(&name).unwrap().try_lock().unwrap().is_none());
        gb.unlock().unwrap();
        assert!(!common::exists(&mut conn, &key));
    });
}

#[test]
fn lease_lost_when_key_deleted() {
    lease_lost(Fault::Del);
}

#[test]
fn lease_lost_when_key_expired() {
    lease_lost(Fault::Pexpire);
}

/// The key is deleted and another client takes the lock before the holder's next renewal:
/// that renewal must not extend or take over the new owner's lock, and the holder reports
/// the loss within one renewal interval + slack.
#[test]
fn stale_renewal_leaves_new_owner_alone() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let lease = Duration::from_secs(3);
        let a = Client::builder(url.as_str()).lease(lease).build().unwrap();
        let b = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("stale-renewal");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();
        let lb = b.mutex(&name).unwrap();

        let guard = la.lock().unwrap();
        let fault_at = Instant::now();
        apply(&mut conn, &key, Fault::Del);
        let gb = lb.try_lock().unwrap().expect("lock free after DEL");
        let owner_b = common::owner_at(&mut conn, &key);
        assert!(
            common::wait_until(lease / 3 + Duration::from_millis(500), || !guard.is_held()),
            "holder did not notice the takeover"
        );
        println!("holder saw the takeover after {:?}", fault_at.elapsed());
        common::assert_held_by(&mut conn, &key, owner_b.as_deref().unwrap(), 1);
        let ttl = common::pttl(&mut conn, &key);
        // b's lease is 30 s; a's renewal would have set it to at most 3 s.
        assert!(
            ttl > 3_000,
            "new owner's PTTL is {ttl} ms: renewed by the stale holder?"
        );
        let err = guard
            .unlock()
            .expect_err("unlock of a lost lease succeeded");
        assert!(err.is_lease_lost(), "unexpected error: {err}");
        assert_eq!(common::owner_at(&mut conn, &key), owner_b);
        assert!(a.mutex(&name).unwrap().try_lock().unwrap().is_none());
        gb.unlock().unwrap();
    });
}

/// Several clients taking turns (with automatic and fixed leases, and nested re-entry) get
/// strictly increasing fencing tokens.
#[test]
fn fencing_tokens_increase_across_owners() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let clients: Vec<Client> = (0..4)
            .map(|_| Client::open(url.as_str()).unwrap())
            .collect();
        let name = common::unique_name("fencing");
        let mut last = 0u64;
        for round in 0..24 {
            let client = &clients[round % clients.len()];
            let lock = if round % 3 == 0 {
                client
                    .mutex(&name)
                    .unwrap()
                    .with_lease(Duration::from_secs(5))
                    .unwrap()
            } else {
                client.mutex(&name).unwrap()
            };
            let g = lock
                .try_lock_for(Duration::from_secs(5))
                .unwrap()
                .expect("free lock");
            let t = g.fencing_token();
            assert!(t > last, "round {round}: token {t} after {last}");
            let nested = lock.try_lock().unwrap().expect("re-entry");
            assert_eq!(nested.fencing_token(), t);
            drop(nested);
            last = t;
            g.unlock().unwrap();
        }
    });
}

/// Tokens keep increasing across a server restart that loses every key, counters included.
#[test]
fn fencing_tokens_survive_restart() {
    let mut server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("fencing-restart");
    let before = {
        let url = url.clone();
        let name = name.clone();
        with_deadline(Duration::from_secs(20), move || {
            let client = Client::open(url.as_str()).unwrap();
            let lock = client.mutex(&name).unwrap();
            let mut last = 0;
            for _ in 0..5 {
                let g = lock.lock().unwrap();
                assert!(g.fencing_token() > last);
                last = g.fencing_token();
            }
            last
        })
    };
    server.restart();
    let mut conn = server.conn();
    assert!(!common::exists(&mut conn, &common::fence_key(&name)));
    let after = with_deadline(Duration::from_secs(20), move || {
        let client = Client::open(url.as_str()).unwrap();
        let lock = client.mutex(&name).unwrap();
        let g = lock.lock().unwrap();
        g.fencing_token()
    });
    println!("token before restart {before}, after {after}");
    assert!(after > before, "token went backwards: {before} -> {after}");
}

/// The local lease deadline is the send time of the acquire plus the lease, less the stated
/// margin of `clock_drift_factor` × lease + 2 ms (1 % + 2 ms by default): a fresh guard's
/// validity is just under it, by no more than the acquire's round trip. The margin is what
/// allows for the two clocks' rates (a 1 % difference by default); no test can make this
/// host's clock run at another rate, so the margin is what is checked.
#[test]
fn the_local_deadline_keeps_the_stated_margin() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let lease = Duration::from_secs(10);
        for (factor, margin) in [
            (None, lease / 100 + Duration::from_millis(2)),
            (Some(0.1), lease / 10 + Duration::from_millis(2)),
        ] {
            let mut b = Client::builder(&url).lease(lease);
            if let Some(f) = factor {
                b = b.clock_drift_factor(f);
            }
            let client = b.build().unwrap();
            let m = client.mutex(&common::unique_name("margin")).unwrap();
            let before = Instant::now();
            let g = m.lock().unwrap();
            let validity = g.validity();
            let round_trip = before.elapsed();
            let most = lease - margin;
            println!(
                "factor {factor:?}: validity {validity:?}, at most {most:?}, round trip {round_trip:?}"
            );
            assert!(validity <= most, "{validity:?} > {most:?}");
            assert!(
                validity + round_trip + Duration::from_millis(1) >= most,
                "{validity:?}"
            );
            g.unlock().unwrap();
        }
    });
}
