//! Faults on the connection: `CLIENT KILL` of the command connections under load and of the
//! subscriber inside the resubscribe gap, replies lost or delayed by a TCP proxy, a black hole
//! and a closed port. Scenarios 9 to 13 of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{checker, faults, load, proxy};
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use checker::Store;
use common::{RedisServer, TestChild, keys_matching, lock_keys_left, wait_numsub, with_deadline};
use faults::{ACQUIRE_LUA, Holder, RELEASE_LUA, SLACK, preload_scripts, sha, spawn_waiter};
use locksmith::Client;
use proxy::Proxy;

/// The load worker (see `common/load.rs`).
#[test]
fn child_worker() {
    load::child_worker();
}

/// 9. Load as in 1 (2 processes x 4 threads, nested guards) while `CLIENT KILL TYPE normal`
///    runs every 2 s: every call succeeds or returns a retriable error, depths are right, no
///    overlaps, no orphan keys.
#[test]
fn s09_client_kill_under_load() {
    let lease = Duration::from_secs(2);
    let server = RedisServer::start();
    let store = Store::start();
    let names = [common::unique_name("s09a"), common::unique_name("s09b")];
    let envs = load::nested_envs(server.url(), store.port(), &names, 9, lease, 500);
    let mut children: Vec<_> = (0..2)
        .map(|_| TestChild::spawn("child_worker", "worker", &envs))
        .collect();
    let mut killed = Vec::new();
    let start = Instant::now();
    thread::sleep(Duration::from_secs(2));
    while start.elapsed() < Duration::from_secs(9) {
        let mut c = server.conn();
        let n: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .query(&mut c)
            .unwrap();
        killed.push(n);
        thread::sleep(Duration::from_secs(2));
    }
    for c in &mut children {
        let status = c.wait_timeout(Duration::from_secs(60));
        assert!(status.success(), "worker failed: {status}");
    }
    let ended = Instant::now();
    let t = store.worker_totals();
    let intervals = store.intervals();
    let f = checker::assert_clean(&intervals);
    let mut conn = server.conn();
    let left_at_end = lock_keys_left(&mut conn);
    let gone = common::wait_until(lease + SLACK, || lock_keys_left(&mut conn).is_empty());
    let accepted: u64 = names.iter().map(|n| store.resource(n).accepted).sum();
    let value: u64 = names.iter().map(|n| store.resource(n).value).sum();
    println!(
        "s09: killed {killed:?} normal clients; totals {t:?}; {} intervals; lock keys at the \
         end {left_at_end:?} (gone {:?} later: {gone})",
        f.intervals,
        ended.elapsed()
    );
    assert_eq!(t["other"], 0, "non-retriable errors: {t:?}");
    assert_eq!(t["depth_bad"], 0, "wrong re-entry depth: {t:?}");
    assert_eq!(t["lost"], 0, "{t:?}");
    assert!(t["acquired"] > 100, "too little progress: {t:?}");
    assert_eq!(value, accepted, "lost updates");
    assert_eq!(t["accepted"], accepted);
    assert!(killed.iter().sum::<u64>() >= 4, "CLIENT KILL hit nothing");
    assert!(gone, "orphan lock keys: {:?}", lock_keys_left(&mut conn));
}

/// 10. 10 blocked waiters; `CLIENT KILL TYPE pubsub` and, atomically with it (MULTI), the
///     holder's release, whose message is thus lost: every waiter acquires within about a
///     second, none waits for its timeout.
#[test]
fn s10_release_in_resubscribe_gap() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("s10");
    let key = common::lock_key(&name);
    let [a, b] = common::clients(&url);
    let h = Holder::start(a.mutex(&name).unwrap());
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            spawn_waiter(
                b.mutex(&name).unwrap(),
                Duration::from_secs(20),
                Duration::from_millis(10),
                tx.clone(),
            )
        })
        .collect();
    wait_numsub(&mut conn, &common::release_channel(&name), 1);
    thread::sleep(Duration::from_millis(300));
    let held = common::lock_value_at(&mut conn, &key).unwrap();
    // The waiters' leader flagged the lock: its release publishes.
    assert!(held.waiters, "no waiter flagged the lock");
    let (killed, released): (u64, Vec<i64>) = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .cmd("EVAL")
        .arg(*RELEASE_LUA)
        .arg(2)
        .arg(&key)
        .arg(common::release_channel(&name))
        .arg(format!("{}|", held.acquisition))
        .query(&mut conn)
        .unwrap();
    let released_at = Instant::now();
    // Freed and published, to nobody: the pub/sub connections were gone already.
    assert_eq!(released, [0, 0]);
    let mut outs = Vec::new();
    for _ in 0..10 {
        outs.push(rx.recv_timeout(Duration::from_secs(25)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    let lat: Vec<_> = outs.iter().map(|o| o.at - released_at).collect();
    println!(
        "s10: killed {killed} pub/sub connections with the release; waiters acquired {lat:?} after it"
    );
    assert!(killed >= 1);
    assert!(outs.iter().all(|o| o.token.is_some()), "a waiter timed out");
    assert!(
        lat[0] < Duration::from_secs(1),
        "first waiter after {:?}",
        lat[0]
    );
    assert!(
        *lat.iter().max().unwrap() < Duration::from_millis(1500),
        "last waiter after {:?}",
        lat.iter().max()
    );
    let _ = h.unlock();
}

/// 11. The reply to an acquire (fresh and re-entrant) and to a release (inner and outer
///     level) is cut after the command reached Redis: the retry recognises its own request;
///     depth stays right, no second key, no orphan.
#[test]
fn s11_lost_replies() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let monitor = common::Monitor::start(server.port());
    let proxy = Proxy::start(server.port());
    let purl = proxy.url();
    let name = common::unique_name("s11");
    let key = common::lock_key(&name);
    let n = name.clone();
    let client = Client::builder(purl.as_str())
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let acq = sha(&ACQUIRE_LUA);
    let rel = sha(&RELEASE_LUA);
    preload_scripts(&mut conn);
    let mark = monitor.sync(&mut conn);
    let m = client.mutex(&n).unwrap();
    let count =
        |c: &mut redis::Connection| common::lock_value_at(c, &key).map(|v| v.count.to_string());

    proxy.cut_reply_to(&[acq.as_bytes(), key.as_bytes()], 1);
    let g1 = m.lock().expect("acquire after a cut reply");
    assert_eq!(proxy.cuts(), 1, "the reply was not cut");
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("1"),
        "fresh acquire counted twice"
    );
    assert!(g1.is_held());
    let t1 = g1.fencing_token();

    proxy.cut_reply_to(&[acq.as_bytes(), key.as_bytes()], 1);
    let g2 = m.lock().expect("re-entry after a cut reply");
    assert_eq!(proxy.cuts(), 2);
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("2"),
        "re-entry counted twice"
    );
    assert_eq!(g2.fencing_token(), t1);

    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    g2.unlock().expect("inner release after a cut reply");
    assert_eq!(proxy.cuts(), 3);
    assert_eq!(
        count(&mut conn).as_deref(),
        Some("1"),
        "inner release done twice"
    );
    assert!(g1.is_held());

    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    g1.unlock().expect("outer release after a cut reply");
    assert_eq!(proxy.cuts(), 4);
    assert!(!common::exists(&mut conn, &key), "orphan lock key");
    let keys = keys_matching(&mut conn, "locksmith:*");
    // The slot's fencing mark stays, the release marker for what the lease had left.
    assert_eq!(
        keys,
        vec![common::fence_key(&name), common::release_channel(&name)],
        "extra keys"
    );
    monitor.sync(&mut conn);
    let lines = monitor.since(mark);
    let calls = common::Monitor::script_calls_on(&lines, &key);
    if calls != 8 {
        for l in lines.iter().filter(|l| !l.contains(" lua] ")) {
            println!("s11 monitor: {}", &l[..l.len().min(200)]);
        }
    }
    println!(
        "s11: 4 replies cut (acquire, re-entry, inner release, outer release); {calls} script \
         calls reached Redis; depth stayed right; keys left {keys:?}"
    );
    assert_eq!(
        calls, 8,
        "each cut call should have run twice (call + retry)"
    );
    // Another client gets the lock at once: nothing left behind.
    let other = Client::open(server.url().as_str()).unwrap();
    assert!(other.mutex(&name).unwrap().try_lock().unwrap().is_some());
}

/// 11c. The reply to the last release is cut after Redis ran it, and a waiter on another
///      client takes the lock at once on the release message. The holder's retry then finds
///      another owner: that is the release having worked, so `unlock()` is `Ok`, not
///      `NotOwner` (nothing of the new owner's is touched either way).
#[test]
fn s11_cut_release_then_taken_at_once() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let proxy = Proxy::start(server.port());
    let name = common::unique_name("s11c");
    let key = common::lock_key(&name);
    let holder = Client::open(proxy.url().as_str()).unwrap();
    let waiter = Client::open(server.url().as_str()).unwrap();
    let rel = sha(&RELEASE_LUA);
    preload_scripts(&mut conn);
    let hl = holder.mutex(&name).unwrap();
    let g = hl.lock().unwrap();
    let wl = waiter.mutex(&name).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = thread::spawn(move || {
        let got = wl.try_lock_for(Duration::from_secs(10)).unwrap();
        let owner_token = got.as_ref().map(|g| g.fencing_token());
        tx.send(owner_token).unwrap();
        // Hold until the holder's unlock has returned.
        thread::sleep(Duration::from_millis(500));
        drop(got);
    });
    wait_numsub(&mut conn, &common::release_channel(&name), 1);
    proxy.cut_reply_to(&[rel.as_bytes(), key.as_bytes()], 1);
    // Bounded by the client's command and connect timeouts (5 s each).
    let res = g.unlock();
    let taken = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    println!(
        "s11c: unlock() after a cut release reply: {res:?}; waiter got token {taken:?}; owner \
         now {:?}",
        common::owner_at(&mut conn, &key)
    );
    assert_eq!(proxy.cuts(), 1, "the reply was not cut");
    assert!(taken.is_some(), "the waiter never got the lock");
    assert!(res.is_ok(), "a release that worked was reported as {res:?}");
    w.join().unwrap();
}

/// 11b. An `unlock()` whose release never reached Redis (the connection black-holed) errs
///      with a retriable error; the same thread then locks again. That must be a new
///      acquisition (depth 1, a new fencing token) and its unlock must free the lock; the
///      level left on the server by the failed release must not turn it into a re-entry.
#[test]
fn s11_failed_release_then_relock() {
    let (_server, mut conn, proxy, purl) = common::proxied();
    let name = common::unique_name("s11b");
    let key = common::lock_key(&name);
    let client = Client::builder(purl.as_str())
        .lease(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let m = client.mutex(&name).unwrap();
    let g = m.lock().unwrap();
    let first = g.fencing_token();
    proxy.black_hole();
    proxy.kill_all();
    let e = g
        .unlock()
        .expect_err("unlock through a black hole succeeded");
    proxy.pass();
    let left = common::lock_value_at(&mut conn, &key).map(|v| v.count.to_string());
    let g = m.lock().unwrap();
    let count = common::lock_value_at(&mut conn, &key).map(|v| v.count.to_string());
    let second = g.fencing_token();
    g.unlock().unwrap();
    let after = common::lock_value_at(&mut conn, &key).map(|v| v.count.to_string());
    println!(
        "s11b: unlock through a black hole: {e} (retriable {}); count left on the server \
         {left:?}; relock by the same thread: count {count:?}, token {} the first; after its \
         unlock the key has count {after:?}",
        e.is_retriable(),
        if second == first {
            "equal to"
        } else {
            "unlike"
        }
    );
    assert!(e.is_retriable(), "{e}");
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "the relock counted as a re-entry"
    );
    assert!(second > first, "the relock reused the old fencing token");
    assert_eq!(after, None, "the lock stayed held after the last unlock");
}

/// 12. The acquire reply is delayed past the lease: no guard is handed out whose validity has
///     passed; the late acquisition is given back; a later attempt gets a valid guard.
#[test]
fn s12_late_acquire_reply() {
    let lease = Duration::from_millis(500);
    let (_server, mut conn, proxy, purl) = common::proxied();
    let name = common::unique_name("s12");
    let key = common::lock_key(&name);
    let acq = sha(&ACQUIRE_LUA);
    let client = Client::builder(purl.as_str())
        .lease(lease)
        .command_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let m = client.mutex(&name).unwrap();

    // One late reply, then normal ones.
    proxy.delay_reply_to(
        &[acq.as_bytes(), key.as_bytes()],
        Duration::from_millis(800),
        1,
    );
    let (took, validity, held, token) = {
        let start = Instant::now();
        let g = m
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("no guard after one late reply");
        let r = (
            start.elapsed(),
            g.validity(),
            g.is_held(),
            g.fencing_token(),
        );
        assert_eq!(
            common::lock_value_at(&mut conn, &key)
                .map(|v| v.count.to_string())
                .as_deref(),
            Some("1")
        );
        g.unlock().unwrap();
        r
    };
    println!(
        "s12: one acquire reply delayed 800 ms (lease {lease:?}): guard after {took:?} with \
         validity {validity:?}, token {token}"
    );
    assert_eq!(proxy.delays(), 1);
    assert!(held && validity > Duration::ZERO && validity <= lease);
    assert!(took >= Duration::from_millis(800));

    // Every reply late: never a guard (None or an error), and nothing left behind.
    proxy.delay_reply_to(
        &[acq.as_bytes(), key.as_bytes()],
        Duration::from_millis(800),
        100,
    );
    let start = Instant::now();
    let r = m.try_lock_for(Duration::from_secs(2));
    let took = start.elapsed();
    let out = match &r {
        Ok(Some(g)) => format!("a guard, held {} validity {:?}", g.is_held(), g.validity()),
        Ok(None) => "None".into(),
        Err(e) => format!("error {e}"),
    };
    println!(
        "s12: all acquire replies delayed 800 ms: try_lock_for(2 s) gave {out} after {took:?}"
    );
    assert!(
        !matches!(r, Ok(Some(_))),
        "a guard was handed out although every grant came back after its lease"
    );
    assert!(took < Duration::from_secs(2) + Duration::from_millis(800) + SLACK);
    assert!(common::wait_until(lease + SLACK, || !common::exists(
        &mut conn, &key
    )));
}

/// One lock call of scenario 13, described by its outcome.
type LockCall = Box<dyn FnOnce(&locksmith::Mutex) -> String + Send>;

/// Entry point of scenario 13's child: black holes and closed ports, counted threads.
#[test]
fn child_black_hole() {
    if !common::is_child("black_hole") {
        return;
    }
    let port: u16 = common::child_var("LS_PORT");
    let base = common::thread_count();
    let t = Duration::from_millis(300);
    let retry = Duration::from_secs(1);
    let bound_build = t * 2 + SLACK;
    // Per call: up to (retry timeout + one more attempt) of (two tries of connect + command).
    let bound_call = retry + (t * 2) * 2 + SLACK;
    let timed = |what: &str, bound: Duration, f: Box<dyn FnOnce() -> String + Send>| {
        let start = Instant::now();
        let out = with_deadline(Duration::from_secs(20), f);
        let took = start.elapsed();
        println!("s13: {what}: {out} after {took:?}");
        assert!(took <= bound, "{what}: took {took:?}, bound {bound:?}");
        out
    };

    // Connect to a black hole (the kernel accepts, nobody answers) and to a closed port.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_url = format!("redis://127.0.0.1:{}/", hole.local_addr().unwrap().port());
    let closed = common::ClosedPort::new();
    let closed_url = closed.url();
    for (what, url) in [
        ("build, black hole", hole_url),
        ("build, closed port", closed_url),
    ] {
        let out = timed(
            what,
            bound_build,
            Box::new(move || {
                match Client::builder(url.as_str())
                    .connect_timeout(t)
                    .command_timeout(t)
                    .build()
                {
                    Ok(_) => "BUILT".into(),
                    Err(e) => format!(
                        "error ({}timeout) {e}",
                        if e.is_timeout() { "" } else { "no " }
                    ),
                }
            }),
        );
        assert!(out.starts_with("error"), "{what}: {out}");
    }
    drop(hole);

    // Commands through a proxy that turns into a black hole, then into a closed port.
    let mut proxy = Proxy::start(port);
    let client = Client::builder(proxy.url().as_str())
        .connect_timeout(t)
        .command_timeout(t)
        .retry_timeout(retry)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let name = common::unique_name("s13");
    let held = client.mutex(&name).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let (res_tx, res_rx) = mpsc::channel();
    let mut h = Some(thread::spawn(move || {
        let g = held.lock().unwrap();
        res_tx.send(String::new()).unwrap();
        rx.recv().unwrap();
        let start = Instant::now();
        let r = g.is_held();
        let u = g.unlock();
        res_tx
            .send(format!(
                "held {r}, unlock {:?} after {:?}",
                u.err().map(|e| e.to_string()),
                start.elapsed()
            ))
            .unwrap();
    }));
    res_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for phase in ["black hole", "closed port"] {
        if phase == "black hole" {
            proxy.black_hole();
            proxy.kill_all();
        } else {
            proxy.stop();
        }
        let c = client.clone();
        let n = common::unique_name("s13-other");
        let calls: [(&str, LockCall); 4] = [
            (
                "try_lock",
                Box::new(|m| {
                    format!(
                        "{:?}",
                        m.try_lock().map(|g| g.is_some()).map_err(|e| e.to_string())
                    )
                }),
            ),
            (
                "lock",
                Box::new(|m| format!("{:?}", m.lock().map(|_| ()).map_err(|e| e.to_string()))),
            ),
            (
                "try_lock_for(500ms)",
                Box::new(|m| {
                    format!(
                        "{:?}",
                        m.try_lock_for(Duration::from_millis(500))
                            .map(|g| g.is_some())
                            .map_err(|e| e.to_string())
                    )
                }),
            ),
            (
                "is_locked",
                Box::new(|m| format!("{:?}", m.is_locked().map_err(|e| e.to_string()))),
            ),
        ];
        for (what, f) in calls {
            let m = c.mutex(&n).unwrap();
            let out = timed(
                &format!("{phase}: {what}"),
                bound_call,
                Box::new(move || f(&m)),
            );
            assert!(out.starts_with("Err"), "{phase}: {what} succeeded: {out}");
        }
        if phase == "black hole" {
            thread::sleep(Duration::from_secs(1));
            tx.send(()).unwrap();
            let out = res_rx.recv_timeout(Duration::from_secs(10)).unwrap();
            println!("s13: black hole: holder after its lease: {out}");
            assert!(out.starts_with("held false"), "{out}");
            h.take().unwrap().join().unwrap();
        }
    }
    drop(client);
    let seen = common::settled_thread_count(base, Duration::from_secs(3));
    println!("s13: threads {seen} after the drop, {base} before");
    assert_eq!(
        seen, base,
        "threads not back to the baseline: {seen} vs {base}"
    );
}

/// 13. A proxy that accepts and never answers, and a closed port: every call errs within its
///     timeout, nothing panics, and the thread count is back to the baseline after the drop
///     (in a child process, where no other test adds threads).
#[test]
fn s13_black_hole_and_closed_port() {
    let server = RedisServer::start();
    let mut child = TestChild::spawn(
        "child_black_hole",
        "black_hole",
        &[("LS_PORT", server.port().to_string())],
    );
    let status = child.wait_timeout(Duration::from_secs(120));
    assert!(
        status.success(),
        "scenario 13 failed in the child: {status}"
    );
}
