//! The server refuses, and the caller is told: an ACL user without `EVAL`, `PUBLISH` or
//! `SUBSCRIBE`, `maxmemory` reached; and the errors of `unlock()` and of the options, which
//! callers must tell apart. The "Refusals" table of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::faults;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use faults::{Holder, spawn_waiter};
use locksmith::{Client, Error};

/// A client of `url` with a 600 ms lease whose lost leases arrive on the receiver.
fn reporting_losses(url: &str) -> (Client, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    let c = Client::builder(url)
        .lease(Duration::from_millis(600))
        .command_timeout(Duration::from_secs(1))
        .on_lease_lost(move |_| {
            let _ = tx.send(());
        })
        .build()
        .unwrap();
    (c, rx)
}

/// A server with one ACL user `user` (password `pw`) that has every permission but `denied`;
/// returns the server and that user's URL.
fn acl_server(user: &str, denied: &[&str]) -> (RedisServer, String) {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER")
        .arg(user)
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    for d in denied {
        c.arg(format!("-{d}"));
    }
    c.exec(&mut conn).unwrap();
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    (server, url)
}

/// An ACL user without `EVAL`/`EVALSHA` and `FCALL`: `lock()` gives the server's permission
/// error, and nothing is acquired.
#[test]
fn bad_acl_user_without_eval() {
    let (server, u) = acl_server("noeval", &["eval", "evalsha", "fcall"]);
    let mut conn = server.conn();
    let name = common::unique_name("acl-noeval");
    let n = name.clone();
    let (r1, r2) = with_deadline(Duration::from_secs(20), move || {
        let c = Client::builder(u.as_str())
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let m = c.mutex(&n).unwrap();
        (m.try_lock().map(|g| g.is_some()), m.lock().map(|_| true))
    });
    for r in [r1, r2] {
        let e = r.expect_err("acquired without EVAL permission");
        println!("bad: ACL without EVAL: {e}");
        assert!(e.is_redis() && !e.is_retriable(), "{e}");
        let msg = e.to_string().to_lowercase();
        assert!(msg.contains("perm") || msg.contains("evalsha"), "{e}");
    }
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
}

/// An ACL user with `FCALL` but without `EVAL`/`EVALSHA`: the function library runs the
/// Mutex's acquire and release, and the calls that are scripts only (here the renewal) give
/// the server's permission error; nothing hangs.
#[test]
fn acl_user_with_fcall_but_without_eval() {
    let (server, u) = acl_server("fcallonly", &["eval", "evalsha"]);
    let name = common::unique_name("acl-fcallonly");
    let lost = with_deadline(Duration::from_secs(20), move || {
        let (c, rx) = reporting_losses(&u);
        let m = c.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        let lost = rx.recv_timeout(Duration::from_secs(10)).is_ok();
        (lost, g.unlock())
    });
    // The renewal (EVALSHA) is refused, so the hold is lost: it is not pretended held.
    assert!(lost.0, "the refused renewal was not reported");
    assert!(lost.1.is_err(), "{:?}", lost.1);
    drop(server);
}

/// A hold reported lost never unlocks `Ok`, even where the server would still release it.
/// The renewals of an ACL user with `FCALL` but without `EVALSHA` are refused, so the hold is
/// lost on this side (at its local deadline at the latest) and reported; meanwhile its key
/// lives on, here for a minute (`PEXPIRE` from another connection). The release (an `FCALL`)
/// then finds the key still this acquisition's and frees it: `unlock()` must say the lease
/// was lost, as `on_lease_lost` and `is_held()` did.
#[test]
fn a_hold_reported_lost_does_not_unlock_ok_while_its_key_lives_on() {
    let (server, u) = acl_server("fcalllost", &["eval", "evalsha"]);
    let mut conn = server.conn();
    let name = common::unique_name("acl-lost-key-lives");
    let key = common::lock_key(&name);
    let (r, held, left) = with_deadline(Duration::from_secs(20), move || {
        let (c, rx) = reporting_losses(&u);
        let g = c.mutex(&name).unwrap().lock().unwrap();
        let extended: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(60_000)
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            extended, 1,
            "the key was gone before the test could extend it"
        );
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the refused renewal was not reported");
        let held = g.is_held();
        let r = g.unlock();
        (r, held, common::exists(&mut conn, &key))
    });
    assert!(!held, "a hold reported lost reads held");
    assert!(
        matches!(r, Err(Error::LeaseLost)),
        "unlock after a reported loss: {r:?}"
    );
    // The release still ran: the key of a lost hold is not left behind.
    assert!(!left, "the release left the key of the lost hold");
    drop(server);
}

/// An ACL user without `PUBLISH`: a release that must publish (a waiter's attempt flagged the
/// lock) fails at its `PUBLISH`, before anything changed, and `unlock()` gives the server's
/// error.
#[test]
fn bad_acl_user_without_publish() {
    let (server, u) = acl_server("nopublish", &["publish"]);
    let mut conn = server.conn();
    let name = common::unique_name("acl-nopublish");
    let n = name.clone();
    let url = server.url();
    let r = with_deadline(Duration::from_secs(20), move || {
        let c = Client::builder(u.as_str())
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let m = c.mutex(&n).unwrap();
        let g = m.lock().unwrap();
        let other = Client::open(url.as_str()).unwrap();
        assert!(other.mutex(&n).unwrap().try_lock().unwrap().is_none());
        g.unlock().map_err(|e| (e.to_string(), e.is_redis()))
    });
    let left = common::lock_value(&mut conn, &name);
    println!("bad: ACL without PUBLISH: unlock -> {r:?}; lock left: {left:?}");
    assert!(
        left.is_some_and(|v| v.waiters),
        "the failed release changed the lock"
    );
    let (msg, is_redis) = r.expect_err("unlock without PUBLISH permission reported success");
    assert!(is_redis, "{msg}");
    assert!(
        msg.to_lowercase().contains("perm") || msg.contains("can't run this command"),
        "{msg}"
    );
}

/// An ACL user without `SUBSCRIBE`: its waiters cannot be told of releases, but still make
/// progress by bounded re-checks: a waiter acquires within a second of the release.
#[test]
fn bad_acl_user_without_subscribe() {
    let (server, u) = acl_server("nosubscribe", &["subscribe"]);
    let admin = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("acl-nosubscribe");
    let hm = admin.mutex(&name).unwrap();
    let h = Holder::start(hm);
    let (tx, rx) = mpsc::channel();
    let c = Client::builder(u.as_str()).build().unwrap();
    let w = spawn_waiter(
        c.mutex(&name).unwrap(),
        Duration::from_secs(10),
        Duration::ZERO,
        tx,
    );
    thread::sleep(Duration::from_millis(500));
    let released = Instant::now();
    h.unlock().0.unwrap();
    let out = rx.recv_timeout(Duration::from_secs(15)).unwrap();
    w.join().unwrap();
    println!(
        "bad: ACL without SUBSCRIBE: waiter acquired {:?} after the release",
        out.at - released
    );
    assert!(out.token.is_some());
    assert!(out.at - released < Duration::from_secs(1));
}

/// `maxmemory` reached: `lock()` gives the server's OOM error, never "acquired"; the lock
/// works again once memory is available.
#[test]
fn bad_maxmemory_reached() {
    let (_server, url, mut conn) = common::server_url_conn();
    let client = Client::builder(url.as_str())
        .command_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = common::unique_name("oom");
    let m = client.mutex(&name).unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .exec(&mut conn)
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .exec(&mut conn)
        .unwrap();
    let m2 = m.clone();
    let (r1, r2) = with_deadline(Duration::from_secs(20), move || {
        (
            m2.try_lock().map(|g| g.is_some()),
            m2.try_lock_for(Duration::from_millis(500))
                .map(|g| g.is_some()),
        )
    });
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .exec(&mut conn)
        .unwrap();
    for r in [r1, r2] {
        let e = r.expect_err("acquired while Redis is out of memory");
        println!("bad: maxmemory: {e}");
        assert!(e.is_redis(), "{e}");
        assert!(
            e.to_string().to_lowercase().contains("maxmemory") || e.to_string().contains("OOM"),
            "{e}"
        );
    }
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
    let g = m
        .try_lock()
        .unwrap()
        .expect("free once memory is available");
    g.unlock().unwrap();
}

/// Unlock after a loss with nobody holding (`LeaseLost`), with another owner holding
/// (`NotOwner`, the other owner untouched): distinct, clear errors. (A double unlock cannot
/// be written: `unlock` takes the guard by value.)
#[test]
fn bad_unlock_errors_are_distinct() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let [a, b] = common::clients(&url);
        let name = common::unique_name("unlock-errs");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();
        let lb = b.mutex(&name).unwrap();

        let g = la.lock().unwrap();
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let lost = g
            .unlock()
            .expect_err("unlock after the key vanished succeeded");

        let g = la.lock().unwrap();
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        let gb = lb.lock().unwrap();
        let owner = common::owner_at(&mut conn, &key);
        let ttl = common::pttl(&mut conn, &key);
        let other = g
            .unlock()
            .expect_err("unlock of another owner's lock succeeded");
        println!("bad: unlock after loss: {lost}; unlock while another owns it: {other}");
        assert!(matches!(lost, Error::LeaseLost), "{lost:?}");
        assert!(matches!(other, Error::NotOwner), "{other:?}");
        assert!(lost.is_lease_lost() && other.is_lease_lost());
        assert_ne!(lost.to_string(), other.to_string());
        common::assert_held_by(&mut conn, &key, owner.as_deref().unwrap(), 1);
        assert!(common::pttl(&mut conn, &key) > ttl - 1000);
        assert!(gb.is_held());
        gb.unlock().unwrap();
    });
}

/// Option errors name the field and the bound.
#[test]
fn bad_option_errors_name_field_and_bound() {
    common::on_server(Duration::from_secs(20), move |url, _conn| {
        let cases: [(locksmith::Result<Client>, &str, &str); 3] = [
            (
                Client::builder(url.as_str())
                    .lease(Duration::from_millis(29))
                    .build(),
                "lease",
                "30ms",
            ),
            (
                Client::builder(url.as_str())
                    .lease(Duration::from_secs(1))
                    .renew_interval(Duration::from_secs(1))
                    .build(),
                "renew_interval",
                "1s",
            ),
            (
                Client::builder(url.as_str())
                    .command_timeout(Duration::ZERO)
                    .build(),
                "command_timeout",
                "1ms",
            ),
        ];
        for (r, field, bound) in cases {
            let e = r.expect_err("bad option accepted");
            let msg = e.to_string();
            println!("bad: {field}: {msg}");
            assert!(
                matches!(&e, Error::InvalidConfig { field: f, .. } if *f == field),
                "{e:?}"
            );
            assert!(msg.contains(field) && msg.contains(bound), "{msg}");
        }
    });
}
