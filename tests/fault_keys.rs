//! Faults of the keys: the lock key deleted or expired behind its holder by another
//! connection, `SCRIPT FLUSH` under load, and a key of another type at the lock's key.
//! Scenarios 14 and 15 of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::faults;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{ChannelSpy, errorstats, wait_numsub, with_deadline};
use faults::{Holder, SLACK, WaitOutcome};
use locksmith::{Client, Error};

/// What a third party does to the lock key.
#[derive(Debug, Clone, Copy)]
enum KeyFault {
    Del,
    Pexpire,
}

/// 14. Another connection deletes the lock key (or expires it in 1 ms) while 5 waiters wait:
///     the holder reports the loss within a renewal interval + slack, the waiters acquire
///     without a release message, the holder's `unlock()` errs.
fn key_vanishes(fault: KeyFault) {
    let lease = Duration::from_millis(1500);
    let renew = lease / 3;
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("s14");
    let key = common::lock_key(&name);
    let channel = common::release_channel(&name);
    let a = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let b = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let h = Holder::start(a.mutex(&name).unwrap());
    let spy = ChannelSpy::start(&url, &channel);
    let spy_count = spy.counter();
    let (tx, rx) = mpsc::channel();
    let (seen_tx, seen_rx) = mpsc::channel();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let m = b.mutex(&name).unwrap();
            let (tx, seen_tx, spy_count) = (tx.clone(), seen_tx.clone(), Arc::clone(&spy_count));
            thread::spawn(move || {
                let g = m.try_lock_for(Duration::from_secs(10)).unwrap();
                let at = Instant::now();
                let _ = seen_tx.send(spy_count.load(Ordering::SeqCst));
                let token = g.as_ref().map(|g| g.fencing_token());
                thread::sleep(Duration::from_millis(20));
                drop(g);
                tx.send(WaitOutcome {
                    at,
                    token,
                    took: Duration::ZERO,
                })
                .unwrap();
            })
        })
        .collect();
    wait_numsub(&mut conn, &channel, 2);
    thread::sleep(Duration::from_millis(200));
    let fault_at = Instant::now();
    match fault {
        KeyFault::Del => redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap(),
        KeyFault::Pexpire => redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(1)
            .exec(&mut conn)
            .unwrap(),
    }
    let messages_at_first = seen_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut outs = Vec::new();
    for _ in 0..5 {
        outs.push(rx.recv_timeout(Duration::from_secs(15)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    let lost_at = h.lost_at();
    let (unlock, _) = h.unlock();
    let first = outs.iter().map(|o| o.at).min().unwrap() - fault_at;
    println!(
        "s14 {fault:?}: holder saw the loss {:?} after the fault (renewal {renew:?}); first \
         waiter acquired {first:?} after it with {messages_at_first} release messages seen; \
         holder unlock: {:?}",
        lost_at.map(|t| t - fault_at),
        unlock.as_ref().err().map(ToString::to_string)
    );
    let lost_after = lost_at.expect("the holder never saw the loss") - fault_at;
    assert!(
        lost_after <= renew + SLACK,
        "loss seen {lost_after:?} after the fault"
    );
    assert!(outs.iter().all(|o| o.token.is_some()), "a waiter timed out");
    assert_eq!(messages_at_first, 0);
    assert!(
        first <= lease + SLACK,
        "first waiter only {first:?} after the fault"
    );
    assert!(unlock.unwrap_err().is_lease_lost());
    drop(spy);
}

#[test]
fn s14_key_deleted_behind_the_holder() {
    key_vanishes(KeyFault::Del);
}

#[test]
fn s14_key_expired_behind_the_holder() {
    key_vanishes(KeyFault::Pexpire);
}

/// 15. `SCRIPT FLUSH` and `FUNCTION FLUSH` under load are handled transparently (NOSCRIPT and
///     "Function not found" seen by Redis, no error seen by callers); a key of another type at the lock's key gives a clear error, is not
///     deleted, and nothing is reported acquired.
#[test]
fn s15_script_flush_and_foreign_keys() {
    let (_server, url, mut conn) = common::server_url_conn();
    let client = Client::builder(url.as_str())
        .lease(Duration::from_millis(900))
        .build()
        .unwrap();
    let names: Vec<String> = (0..3).map(|_| common::unique_name("s15")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let ops = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let locks: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
            let (stop, errors, ops) = (Arc::clone(&stop), Arc::clone(&errors), Arc::clone(&ops));
            thread::spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let m = &locks[i % locks.len()];
                    let r = m.lock().and_then(|g| {
                        let inner = m.lock()?;
                        inner.unlock()?;
                        g.unlock()
                    });
                    match r {
                        Ok(()) => {
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            })
        })
        .collect();
    // Also a holder whose renewals run through flushes (lease 900 ms, renewal every 300 ms).
    let lost = Arc::new(AtomicUsize::new(0));
    let long_name = common::unique_name("s15-long");
    let h = Holder::start(client.mutex(&long_name).unwrap());
    for _ in 0..10 {
        thread::sleep(Duration::from_millis(250));
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
        redis::cmd("FUNCTION").arg("FLUSH").exec(&mut conn).unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert!(h.lost_at().is_none(), "a flush cost a holder its lease");
    h.unlock().0.unwrap();
    let noscript = errorstats(&mut conn).get("NOSCRIPT").copied().unwrap_or(0);
    let no_function = common::stat(&common::failed_by_command(&mut conn), "fcall");
    let errors = errors.lock().unwrap().clone();
    println!(
        "s15: {} lock/unlock cycles across 10 SCRIPT and FUNCTION FLUSHes: {} errors, \
         {noscript} NOSCRIPT and {no_function} \"Function not found\" replies handled",
        ops.load(Ordering::Relaxed),
        errors.len()
    );
    assert!(errors.is_empty(), "errors under SCRIPT FLUSH: {errors:?}");
    assert!(
        noscript >= 1,
        "no NOSCRIPT was ever seen: the fault was not hit"
    );
    assert!(
        no_function >= 1,
        "no \"Function not found\" was ever seen: the fault was not hit"
    );
    assert_eq!(lost.load(Ordering::SeqCst), 0);

    // Foreign keys.
    let name = common::unique_name("s15-foreign");
    let key = common::lock_key(&name);
    let m = client.mutex(&name).unwrap();
    let setups: [(&str, &[&str]); 3] = [
        ("string", &["SET", "KEY", "not a lock"]),
        ("list", &["RPUSH", "KEY", "a", "b"]),
        ("hash", &["HSET", "KEY", "field", "value"]),
    ];
    for (kind, cmd) in setups {
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(if *a == "KEY" { key.as_str() } else { a });
        }
        c.exec(&mut conn).unwrap();
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
        let m2 = m.clone();
        let (r1, r2, r3, took) = with_deadline(Duration::from_secs(20), move || {
            let s = Instant::now();
            let r1 = m2.try_lock().map(|g| g.is_some());
            let r2 = m2
                .try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some());
            let r3 = m2.lock().map(|_| true);
            (r1, r2, r3, s.elapsed())
        });
        println!(
            "s15: foreign {kind}: try_lock -> {:?}; lock -> {:?} ({took:?} for three calls)",
            r1.as_ref().map_err(ToString::to_string),
            r3.as_ref().map_err(ToString::to_string)
        );
        for r in [r1, r2, r3] {
            let e = r.expect_err("a foreign key was reported acquired");
            assert!(
                matches!(&e, Error::ForeignKey { key: k } if *k == key),
                "{kind}: not ForeignKey: {e}"
            );
            assert!(e.is_redis() && !e.is_retriable());
            assert!(e.to_string().contains(&key));
        }
        assert!(took < Duration::from_secs(2), "{kind}: took {took:?}");
        let after: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
        assert_eq!(dump, after, "{kind}: the foreign key was changed");
        assert_eq!(
            common::pttl(&mut conn, &key),
            -1,
            "{kind}: the foreign key got a TTL"
        );
    }
    // A held lock whose key is replaced by a foreign value: the holder loses it, and its
    // unlock leaves the foreign value alone.
    redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
    let h = Holder::start(client.mutex(&name).unwrap());
    redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&key)
        .cmd("SET")
        .arg(&key)
        .arg("taken over")
        .exec(&mut conn)
        .unwrap();
    assert!(
        common::wait_until(Duration::from_millis(300) + SLACK, || h.lost_at().is_some()),
        "holder did not notice the foreign value"
    );
    let (r, _) = h.unlock();
    let e = r.expect_err("unlock of a key replaced by a foreign value succeeded");
    println!("s15: holder's unlock over a foreign value: {e}");
    assert!(matches!(e, Error::ForeignKey { .. }), "{e}");
    let v: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    assert_eq!(v, "taken over");
}
