//! What an operator reads and does to a `Mutex` whoever holds it: `holder()` (who, how deep,
//! which token, for how long, how much lease left) and `force_unlock()` (frees it, wakes its
//! waiters at once, keeps tokens rising, and the dispossessed holder learns of it at its next
//! renewal at the latest and never gets `Ok` from its unlock).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::capture;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::{Client, Error};

/// A waiter in another process: waits at most 20 s for `LS_NAME`, records when it got the lock
/// and its token (`SET LS_DONE "<mono_ns> <token>"`, `0 0` when it timed out), prints
/// `acquired`, then holds the lock until `LS_HOLD_MS` passed.
#[test]
fn child_admin_waiter() {
    if !common::is_child("admin_waiter") {
        return;
    }
    let url = common::child_env("LS_URL");
    let client = Client::builder(url.as_str())
        .label("waiter")
        .build()
        .unwrap();
    let m = client.mutex(&common::child_env("LS_NAME")).unwrap();
    let g = m.try_lock_for(Duration::from_secs(20)).unwrap();
    let at = common::mono_ns();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let done = match &g {
        Some(g) => format!("{at} {}", g.fencing_token()),
        None => "0 0".to_owned(),
    };
    redis::cmd("SET")
        .arg(common::child_env("LS_DONE"))
        .arg(done)
        .exec(&mut conn)
        .unwrap();
    println!("acquired");
    let hold: u64 = common::child_var("LS_HOLD_MS");
    thread::sleep(Duration::from_millis(hold));
    drop(g);
}

/// `holder()` from the lock's value: the holding client's label and thread name, its re-entry
/// depth, its token, how long it has held the lock and how much lease is left, by the server's
/// clock; `None` when free (no key, or a tombstone); `ForeignKey` for a key locksmith did not
/// write.
#[test]
fn holder_tells_who_holds_and_for_how_long() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let (_asker, name, m) = common::one_owner(&url, "holder");
        assert_eq!(m.holder().unwrap(), None);
        let (tx, rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let u = url.clone();
        let n = name.clone();
        let holder = thread::Builder::new()
            .name("worker/3".into())
            .spawn(move || {
                let c = Client::builder(u.as_str())
                    .label("web-1:4242")
                    .lease(Duration::from_secs(9))
                    .build()
                    .unwrap();
                let lock = c.mutex(&n).unwrap();
                let outer = lock.lock().unwrap();
                let inner = lock.lock().unwrap();
                tx.send((Instant::now(), outer.fencing_token())).unwrap();
                go_rx.recv().unwrap();
                drop(inner);
                outer.unlock().unwrap();
            })
            .unwrap();
        let (locked_at, token) = rx.recv().unwrap();
        // Time is the point: the lock is held a while before it is asked about.
        thread::sleep(Duration::from_millis(200));
        let h = m.holder().unwrap().expect("a holder");
        let waited = locked_at.elapsed();
        println!("{h:?}");
        assert_eq!(h.label, "web-1:4242");
        assert_eq!(h.thread, "worker/3");
        assert_eq!(h.hold_count, 2);
        assert_eq!(h.fencing_token, token);
        assert!(
            h.held_for >= Duration::from_millis(150) && h.held_for <= waited + SLACK,
            "held for {:?} by the server's clock, {waited:?} here",
            h.held_for
        );
        assert!(
            h.lease_left > Duration::from_secs(6) && h.lease_left <= Duration::from_secs(9),
            "lease left {:?}",
            h.lease_left
        );
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(m.holder().unwrap(), None);
        let key = common::lock_key(&name);
        redis::cmd("SET")
            .arg(&key)
            .arg("not a lock")
            .exec(&mut conn)
            .unwrap();
        assert!(matches!(m.holder(), Err(Error::ForeignKey { .. })));
        assert!(matches!(m.force_unlock(), Err(Error::ForeignKey { .. })));
        let v: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
        assert_eq!(v, "not a lock", "a foreign key was changed");
    });
}

/// Slack for a busy 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

/// `force_unlock()` while a waiter of another process waits: the waiter takes the lock within
/// a second (the release is published), with a higher token; the dispossessed holder (lease
/// 3 s, renewed every second) sees `is_held()` turn false and `on_lease_lost` called within a
/// renewal interval (plus slack), and its `unlock()` is an error, never `Ok`. The force is
/// logged at `warn` with the label of the holder removed. A second `force_unlock()` on a free
/// lock answers `false`.
#[test]
fn force_unlock_frees_wakes_the_waiter_and_tells_the_holder() {
    capture::install();
    let (server, url, mut conn) = common::server_url_conn();
    let port = server.port();
    let lease = Duration::from_secs(3);
    with_deadline(Duration::from_secs(60), move || {
        let name = common::unique_name("force");
        let done = format!("test:done:{name}");
        let monitor = common::Monitor::start(port);
        let (lost_tx, lost_rx) = mpsc::channel();
        let holder = Client::builder(url.as_str())
            .label("stuck-holder")
            .lease(lease)
            .on_lease_lost(move |l| {
                let _ = lost_tx.send((Instant::now(), l.fencing_token));
            })
            .build()
            .unwrap();
        let m = holder.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        let token = g.fencing_token();
        let child = common::spawn_child(
            "child_admin_waiter",
            "admin_waiter",
            &url,
            &name,
            &[("LS_DONE", done.clone()), ("LS_HOLD_MS", "300".into())],
        );
        assert!(
            monitor.wait_blocked(
                &common::release_channel(&name),
                &common::lock_key(&name),
                Duration::from_secs(20)
            ),
            "the waiter never subscribed and tried again"
        );
        let admin = Client::open(url.as_str()).unwrap();
        let am = admin.mutex(&name).unwrap();
        let forced = common::mono_ns();
        let forced_at = Instant::now();
        assert!(am.force_unlock().unwrap(), "nothing was held");
        child.wait_line("acquired", Duration::from_secs(30));
        let got: String = redis::cmd("GET").arg(&done).query(&mut conn).unwrap();
        let (at, their_token) = got.split_once(' ').unwrap();
        let (at, their_token): (u64, u64) = (at.parse().unwrap(), their_token.parse().unwrap());
        assert!(at > 0, "the waiter timed out");
        let latency = common::ms_between(forced, at);
        println!("the other process's waiter took the lock {latency:.1} ms after the force");
        assert!(
            latency < 1000.0,
            "the waiter took the lock {latency:.1} ms after the force"
        );
        assert!(their_token > token, "{their_token} <= {token}");

        // The dispossessed holder finds out at its next renewal (every second) at the latest.
        let (lost_at, lost_token) = lost_rx
            .recv_timeout(Duration::from_secs(1) + SLACK)
            .expect("on_lease_lost was not called");
        assert_eq!(lost_token, token);
        assert!(!g.is_held());
        println!(
            "the holder learned of it {:?} after the force",
            lost_at - forced_at
        );
        let e = g
            .unlock()
            .expect_err("the dispossessed holder's unlock was Ok");
        println!("its unlock: {e}");
        assert!(e.is_lease_lost() || matches!(e, Error::NotOwner), "{e}");

        let warned: Vec<_> = capture::lines()
            .into_iter()
            .filter(|l| l.text.contains("freed by force") && l.text.contains(&name))
            .collect();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_eq!(warned[0].level, log::Level::Warn);
        assert!(warned[0].text.contains("stuck-holder"), "{}", warned[0]);

        // Once the waiter is done, nothing is held: false, and nothing logged.
        assert!(common::wait_until(Duration::from_secs(10), || {
            am.holder().unwrap().is_none()
        }));
        assert!(!am.force_unlock().unwrap());
    });
}

/// A holder's release that races a `force_unlock()` and is retried (its first attempt's
/// connection failed) is told of the loss, never `Ok`: the force deletes the value instead of
/// moving it to the release marker, where a retry looks for it.
#[test]
fn a_retried_release_after_a_force_is_not_ok() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let (_holder, name, m) = common::one_owner(&url, "force-retry");
        let g = m.lock().unwrap();
        let v = common::lock_value(&mut conn, &name).unwrap();
        let admin = Client::open(url.as_str()).unwrap();
        assert!(admin.mutex(&name).unwrap().force_unlock().unwrap());
        assert!(!common::exists(&mut conn, &common::release_channel(&name)));
        // The retry of the holder's outermost release, as the client sends it.
        let retry: i64 = redis::cmd("EVAL")
            .arg(locksmith_testkit::lua_source("release.lua").unwrap())
            .arg(2)
            .arg(common::lock_key(&name))
            .arg(common::release_channel(&name))
            .arg(format!("{}|", v.acquisition))
            .arg("r")
            .arg("")
            .arg("")
            .arg("")
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            retry, -1,
            "a retried release after a force was told it released"
        );
        let e = g.unlock().expect_err("unlock after a force was Ok");
        assert!(e.is_lease_lost(), "{e}");
    });
}

/// Tokens keep rising across a `force_unlock()`: when the holder's hand-off block reaches
/// beyond the next grant's token (here a holder whose token is a minute ahead of the clock, as
/// after a step back, and the mark its grant left), the next grant starts above the block: the
/// slot's fencing mark reaches it.
#[test]
fn a_force_keeps_tokens_rising() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let name = common::unique_name("force-block");
        let key = common::lock_key(&name);
        let client = Client::open(url.as_str()).unwrap();
        let m = client.mutex(&name).unwrap();
        let t0 = m.lock().unwrap().fencing_token();
        let far = t0 + 60_000_000;
        let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
        redis::cmd("SET")
            .arg(&key)
            .arg(format!("g|x:1/label/thread|1024|{s}|{us}|1|g||{far}"))
            .arg("PX")
            .arg(30_000)
            .exec(&mut conn)
            .unwrap();
        redis::cmd("SET")
            .arg(common::fence_key(&name))
            .arg(far + 1024)
            .exec(&mut conn)
            .unwrap();
        let h = m.holder().unwrap().expect("the crafted holder");
        assert_eq!((h.label.as_str(), h.thread.as_str()), ("label", "thread"));
        assert_eq!(h.fencing_token, far);
        assert!(m.force_unlock().unwrap());
        assert_eq!(
            common::lock_state_at(&mut conn, &key),
            common::LockState::Missing
        );
        assert_eq!(m.holder().unwrap(), None);
        let g = m.lock().unwrap();
        assert_eq!(g.fencing_token(), far + 1024 + 1);
        g.unlock().unwrap();
    });
}

/// On a quorum of masters: `holder()` is the holder a majority agrees on (the lock gone from
/// one master changes nothing; gone from two, the masters disagree and it says so),
/// `Client::locks` finds it, `force_unlock()` frees it on every master.
#[test]
fn holder_and_force_on_a_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut conns: Vec<_> = servers.iter().map(RedisServer::conn).collect();
    with_deadline(Duration::from_secs(30), move || {
        let quorum = Client::redlock(&urls).label("q-holder").build().unwrap();
        let name = common::unique_name("force-quorum");
        let m = quorum.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .exec(&mut conns[0])
            .unwrap();
        let h = m.holder().unwrap().expect("held on a majority");
        assert_eq!(h.label, "q-holder");
        // The largest token of the masters that hold it; the client's is the largest of all
        // three (the one whose key was deleted may have given it).
        assert!(h.fencing_token <= g.fencing_token());
        assert!(g.fencing_token() - h.fencing_token < 1_000_000);
        // The listing scans every master and reads the holder from the majority.
        let listed: Vec<_> = quorum.locks(&name).unwrap().map(|l| l.unwrap()).collect();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].holders[0].label, "q-holder");
        // A quorum client holds only mutexes: lock_info asks for nothing else.
        let info = quorum.lock_info(&name).unwrap();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].kind, locksmith::LockKind::Mutex);
        // Gone from a second master: one master alone names the holder, so the masters
        // disagree, and the answer says so rather than "free".
        redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .exec(&mut conns[1])
            .unwrap();
        match m.holder() {
            Err(locksmith::Error::NoQuorum { reached, needed }) => {
                assert_eq!((reached, needed), (1, 2));
            }
            other => panic!("masters that disagree gave {other:?}"),
        }
        assert!(m.force_unlock().unwrap());
        for c in &mut conns {
            assert!(common::lock_value(c, &name).is_none());
        }
        assert_eq!(m.holder().unwrap(), None);
        assert!(g.unlock().is_err());
    });
}
