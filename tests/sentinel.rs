//! Sentinel: a master found through the sentinels and followed through failovers, with real
//! processes (1 master, 2 replicas, 3 sentinels started by each test on free ports; see
//! `testkit/src/sentinel.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::checker::{self, Interval};
use common::{SentinelSet, lock_key, mono_ns, unique_name};
use locksmith::Client;

const CONNECT: Duration = Duration::from_millis(300);
const COMMAND: Duration = Duration::from_millis(300);
/// What a test allows on top of a documented call bound (a loaded machine, timer slack).
const SLACK: Duration = Duration::from_millis(1000);

fn client(set: &SentinelSet, lease: Duration) -> Client {
    Client::sentinel(set.sentinel_urls(), set.master_name())
        .lease(lease)
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn exists(set: &SentinelSet, port: u16, key: &str) -> bool {
    let mut con = set.conn(port);
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut con)
        .unwrap()
        == 1
}

#[test]
fn lock_and_unlock_through_sentinel() {
    let set = SentinelSet::start();
    let master = set.master_port();
    // Any iterable of strings: a Vec<String>, a Vec<&str>, an array.
    let urls = set.sentinel_urls();
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let by_refs = Client::sentinel(refs, set.master_name()).build().unwrap();
    let c = client(&set, Duration::from_secs(5));
    assert_eq!(c.masters(), 1);
    let name = unique_name("sentinel-basic");
    let lock = c.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    assert!(exists(&set, master, &lock_key(&name)));
    // Another client of the same deployment sees it held.
    assert!(by_refs.mutex(&name).unwrap().try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    assert!(!exists(&set, master, &lock_key(&name)));
    let other = by_refs.mutex(&name).unwrap();
    assert!(other.try_lock().unwrap().is_some());
}

#[test]
fn bad_sentinel_input_gives_clear_errors() {
    // No sentinel at all: refused before any I/O.
    let empty: Vec<String> = Vec::new();
    let e = Client::sentinel(empty, "mymaster").build().unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    assert!(e.to_string().contains("sentinel"), "{e}");
    let e = Client::sentinel(["redis://127.0.0.1:1/"], "")
        .build()
        .unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    let e = Client::sentinel(["http://127.0.0.1:1/"], "m")
        .build()
        .unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    // master_timeout belongs to a quorum client.
    let e = Client::sentinel(["redis://127.0.0.1:1/"], "m")
        .master_timeout(Duration::from_millis(50))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("master_timeout"), "{e}");
    // The master's credentials and database: for Sentinel only, and sensible.
    let refused = |b: locksmith::ClientBuilder, field: &str| {
        let e = b.build().unwrap_err();
        assert!(e.is_invalid_config(), "{e}");
        assert!(e.to_string().contains(field), "{e}");
    };
    let port = common::free_port();
    let one = format!("redis://127.0.0.1:{port}/");
    refused(Client::builder(&one).master_auth(None, "pw"), "master_auth");
    refused(Client::redlock([&one]).master_db(1), "master_db");
    let s = || Client::sentinel([&one], "m");
    refused(s().master_auth(None, ""), "master_auth");
    refused(s().master_auth(Some(""), "pw"), "master_auth");
    refused(s().master_db(-1), "master_db");
    // Sentinel URLs: one scheme for all (the master's TLS follows it), and no database.
    refused(
        Client::sentinel([one.clone(), format!("rediss://127.0.0.1:{port}/")], "m"),
        "sentinels",
    );
    refused(
        Client::sentinel([format!("redis://127.0.0.1:{port}/3")], "m"),
        "master_db",
    );
    // The builder's Debug never shows the master's password.
    let shown = format!("{:?}", s().master_auth(Some("u"), "hush-hush"));
    assert!(!shown.contains("hush-hush"), "{shown}");
    // No sentinel reachable: a connection error within the build bound.
    let closed = common::ClosedPort::new();
    let t = Instant::now();
    let e = Client::sentinel([closed.url()], "m")
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap_err();
    assert!(e.is_redis() || e.is_timeout(), "{e}");
    assert!(t.elapsed() < CONNECT + COMMAND + SLACK);
    // A master name no sentinel knows.
    let set = SentinelSet::start();
    let e = Client::sentinel(set.sentinel_urls(), "no-such-master")
        .build()
        .unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    assert!(e.to_string().contains("no-such-master"), "{e}");
}

/// The bound within which lock calls reach the new master after the sentinels named it: the
/// pub/sub thread asks the sentinels at least every heartbeat (2 s) while idle, and a move
/// drops the pooled connections to the old master.
const FOLLOW_BOUND: Duration = Duration::from_secs(4);
/// From `SIGKILL` of the master to the first lock on the promoted replica: the sentinels'
/// detection (1 s) and election (a failed election is retried after the failover timeout,
/// 3 s), plus `FOLLOW_BOUND`.
const KILL_BOUND: Duration = Duration::from_secs(12);

#[test]
fn locks_follow_a_graceful_failover_and_a_killed_master() {
    let mut set = SentinelSet::start();
    let lease = Duration::from_millis(1500);
    let holders = client(&set, lease);
    let waiters = client(&set, lease);

    // A guard held across the graceful failover, with a waiter of another client behind it.
    // Its renewals between the promotion and the moment the client learns of it (Sentinel
    // announces the switch about a second after the promotion, the client asks every second
    // or two) reach the old master only and are lost; the lease is long enough that the key
    // replicated before the promotion outlives that gap plus one renewal interval, so the
    // guard must be renewed on the new master, not lost.
    let long_lease = Duration::from_secs(12);
    let long_client = client(&set, long_lease);
    let long_name = unique_name("sentinel-long");
    let long_lock = long_client.mutex(&long_name).unwrap();
    let long_guard = long_lock.lock().unwrap();
    let long_token = long_guard.fencing_token();

    // Workers: short critical sections on two locks, each logged as an interval.
    let stop = Arc::new(AtomicBool::new(false));
    let intervals = Arc::new(parking_lot::Mutex::new(Vec::<Interval>::new()));
    let slowest_call_ms = Arc::new(AtomicU64::new(0));
    let wait = Duration::from_secs(2);
    let names = [unique_name("sentinel-a"), unique_name("sentinel-b")];
    let mut workers = Vec::new();
    for w in 0..4u32 {
        let c = if w % 2 == 0 { &holders } else { &waiters }.clone();
        let name = names[w as usize % 2].clone();
        let (stop, intervals, slowest) = (
            Arc::clone(&stop),
            Arc::clone(&intervals),
            Arc::clone(&slowest_call_ms),
        );
        workers.push(std::thread::spawn(move || {
            let lock = c.mutex(&name).unwrap();
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let got = lock.try_lock_for(wait);
                slowest.fetch_max(t.elapsed().as_millis() as u64, Ordering::SeqCst);
                let Ok(Some(g)) = got else { continue };
                let start = mono_ns();
                if g.check().is_err() {
                    continue;
                }
                std::thread::sleep(Duration::from_millis(20));
                let end = mono_ns();
                // Told it lost the lock: by the final check, or by the release (a lock granted
                // by the old master after the promotion is gone from the new one).
                let token = g.fencing_token();
                let held = g.check().is_ok() & g.unlock().is_ok();
                intervals
                    .lock()
                    .push(common::section(&name, w, token, (start, end), held));
            }
        }));
    }
    let acquired_since = |t: u64| intervals.lock().iter().filter(|i| i.start > t).count();
    assert!(common::wait_until(
        Duration::from_secs(5),
        || acquired_since(0) > 5
    ));

    // 1. A graceful failover.
    let long_waiter = {
        let c = waiters.clone();
        let name = long_name.clone();
        std::thread::spawn(move || {
            let lock = c.mutex(&name).unwrap();
            let t = Instant::now();
            let g = lock.try_lock_for(Duration::from_secs(30)).unwrap();
            (g.map(|g| g.fencing_token()), t.elapsed())
        })
    };
    let second = set.failover(Duration::from_secs(15));
    let t = Instant::now();
    // The old master is still up (Sentinel demotes it later): the clients must leave it on
    // their own.
    assert!(
        common::wait_until(FOLLOW_BOUND, || {
            common::script_calls(&mut set.conn(second)) > 0
        }),
        "no lock call on the new master within {FOLLOW_BOUND:?} of the switch"
    );
    eprintln!(
        "graceful failover: first script call on the new master after {:?}",
        t.elapsed()
    );
    // The guard held across the switch is renewed on the new master: one lease after the
    // switch it is still held, and its key lives there.
    std::thread::sleep(long_lease + Duration::from_millis(300));
    assert!(
        long_guard.is_held(),
        "the held guard was not renewed on the new master"
    );
    assert!(exists(&set, second, &lock_key(&long_name)));
    let released = Instant::now();
    long_guard.unlock().unwrap();
    // Its waiter (another client, subscribed before the switch) gets it at once: woken by
    // the release through its moved pub/sub connection, not by the lease running out.
    let (token, _) = long_waiter.join().unwrap();
    let handoff = released.elapsed();
    assert!(token.unwrap() > long_token);
    assert!(
        handoff < Duration::from_secs(1),
        "handoff after the switch took {handoff:?}"
    );

    // 2. SIGKILL of the new master.
    let killed_at = mono_ns();
    let t = Instant::now();
    set.kill(second);
    let third = set.wait_new_master(second, KILL_BOUND);
    assert_ne!(third, second);
    let promoted = t.elapsed();
    assert!(
        common::wait_until(
            KILL_BOUND.saturating_sub(t.elapsed()) + FOLLOW_BOUND,
            || { acquired_since(killed_at) > 0 }
        ),
        "no lock on the promoted replica"
    );
    eprintln!(
        "killed master: replica promoted after {promoted:?}, first lock after {:?}",
        t.elapsed()
    );
    // Some more work on the third master, then stop.
    let now = mono_ns();
    assert!(common::wait_until(
        Duration::from_secs(5),
        || acquired_since(now) > 3
    ));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }

    // No call outlived its bound (max(wait, connect) + command), not even during the outage.
    let slowest = Duration::from_millis(slowest_call_ms.load(Ordering::SeqCst));
    assert!(
        slowest < wait.max(CONNECT) + COMMAND + SLACK,
        "a call took {slowest:?}"
    );
    // Every overlap involves a holder that was told it lost the lock; tokens never go back.
    let log = intervals.lock().clone();
    let f = checker::check(&log);
    eprintln!(
        "{} intervals, {} reported lost, slowest call {slowest:?}",
        f.intervals, f.lost
    );
    assert!(f.overlaps.is_empty(), "overlaps: {:?}", f.overlaps);
    assert!(
        f.token_regressions.is_empty(),
        "token regressions: {:?}",
        f.token_regressions
    );
}

/// What one sentinel that does not answer may cost (see the crate's "Time bounds"): the
/// smaller of 1 s and the connect and command timeouts, so 1 s at the default timeouts.
const PER_SENTINEL: Duration = Duration::from_secs(1);

/// The first sentinel listed is frozen (`SIGSTOP`: the kernel still accepts its connections,
/// it never answers), with the default timeouts. Client `a` was built before, so it prefers
/// that sentinel (it answered last); client `b` is built while it is frozen, which costs at
/// most the per-sentinel bound more than with every sentinel healthy. Both follow a graceful
/// failover within the bound of healthy sentinels plus one per-sentinel bound.
#[test]
fn a_frozen_sentinel_costs_at_most_one_per_sentinel_bound() {
    let set = SentinelSet::start();
    let first = set.master_port();
    let build = || {
        let t = Instant::now();
        let c = Client::sentinel(set.sentinel_urls(), set.master_name())
            .lease(Duration::from_secs(2))
            .build()
            .unwrap();
        (c, t.elapsed())
    };
    let (a, healthy) = build();
    set.pause_sentinel(0);
    let (b, frozen) = build();
    eprintln!("built in {healthy:?} with every sentinel healthy, {frozen:?} with one frozen");
    assert!(
        frozen < healthy + PER_SENTINEL + SLACK,
        "building the client took {frozen:?} with one sentinel frozen ({healthy:?} without)"
    );

    // A worker per client locks and unlocks all along, before and after the switch.
    let stop = Arc::new(AtomicBool::new(false));
    let mut names = Vec::new();
    let workers: Vec<_> = [a, b]
        .into_iter()
        .map(|c| {
            let stop = Arc::clone(&stop);
            let name = unique_name("sentinel-frozen");
            names.push(name.clone());
            std::thread::spawn(move || {
                let lock = c.mutex(&name).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(Some(g)) = lock.try_lock_for(Duration::from_secs(2)) {
                        std::thread::sleep(Duration::from_millis(20));
                        let _ = g.unlock();
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();
    assert!(common::wait_until(Duration::from_secs(5), || {
        common::script_calls(&mut set.conn(first)) >= 4
    }));
    let second = set.failover(Duration::from_secs(15));
    let t = Instant::now();
    let bound = FOLLOW_BOUND + PER_SENTINEL + SLACK;
    // Each client's lock calls reach the new master: its lock's release marker (the value of
    // the last acquisition released) changes there (what was replicated before the promotion
    // is the starting point).
    let fence = |name: &str| -> Option<Vec<u8>> {
        redis::cmd("DUMP")
            .arg(common::release_channel(name))
            .query(&mut set.conn(second))
            .unwrap_or_default()
    };
    let before: Vec<_> = names.iter().map(|n| fence(n)).collect();
    let both = common::wait_until(bound, || {
        names.iter().zip(&before).all(|(n, b)| fence(n) != *b)
    });
    eprintln!(
        "graceful failover with the first sentinel frozen: both followed={both} after {:?}",
        t.elapsed()
    );
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        both,
        "a client made no lock call on the new master within {bound:?} of the switch"
    );
    set.resume_sentinel(0);
}

#[test]
fn wait_replicas_confirms_or_undoes() {
    let set = SentinelSet::start();
    let master = set.master_port();
    let replicas: Vec<u16> = set
        .server_ports()
        .into_iter()
        .filter(|p| *p != master)
        .collect();
    assert_eq!(replicas.len(), 2);
    let wait = Duration::from_millis(100);
    let c = Client::sentinel(set.sentinel_urls(), set.master_name())
        .lease(Duration::from_millis(1500))
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .wait_replicas(2, wait)
        .build()
        .unwrap();

    // Healthy replicas: held, and both replicas have the key when lock() returns.
    let name = unique_name("sentinel-wait");
    let lock = c.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    for &r in &replicas {
        assert!(
            exists(&set, r, &lock_key(&name)),
            "replica {r} lacks the key"
        );
    }

    // Replicas frozen: the held guard's renewals are not confirmed but keep it...
    for &r in &replicas {
        set.pause(r);
    }
    let other_name = unique_name("sentinel-wait-refused");
    let other = c.mutex(&other_name).unwrap();
    let t = Instant::now();
    let refused = other.lock();
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(1000));
    let still_held = guard.is_held();
    for &r in &replicas {
        set.resume(r);
    }
    // ...and a new acquisition fails with NotReplicated, leaving no key, within its bound.
    let e = refused.unwrap_err();
    assert!(e.is_not_replicated(), "{e}");
    assert!(!e.is_retriable());
    assert!(!exists(&set, master, &lock_key(&other_name)));
    assert!(
        took < CONNECT + 2 * COMMAND + wait + SLACK,
        "lock() took {took:?}"
    );
    assert!(still_held, "an unconfirmed renewal lost the guard");
    guard.unlock().unwrap();
    assert!(!exists(&set, master, &lock_key(&name)));

    // Refused on a quorum client, and with a timeout that does not fit a renewal.
    let e = Client::redlock(["redis://127.0.0.1:1/"])
        .wait_replicas(1, wait)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("wait_replicas"), "{e}");
    let e = Client::sentinel(set.sentinel_urls(), set.master_name())
        .lease(Duration::from_millis(1500))
        .wait_replicas(1, Duration::from_millis(200))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("wait_replicas"), "{e}");
}

/// A Sentinel deployment as production often runs it: TLS for the sentinels, the master, its
/// replication and the sentinels' links; a password on the sentinels; an ACL user (other than
/// the sentinels' credentials) on the master. Lock, hand-off between two clients, and a
/// graceful failover while a lock is held; a wrong master password fails `build()` clearly.
#[test]
fn tls_sentinels_and_an_acl_user_on_the_master() {
    if common::skip_without_tls("tls_sentinels_and_an_acl_user_on_the_master") {
        return;
    }
    use common::sentinel::{MASTER_PASS, MASTER_USER};
    let files = common::TlsFiles::generate();
    let set = SentinelSet::start_secure(&files);
    let builder = |password: &str| {
        Client::sentinel(set.sentinel_urls(), set.master_name())
            .tls_root_cert(files.ca_pem())
            .master_auth(Some(MASTER_USER), password)
            // Long enough that the key replicated before the promotion outlives the time the
            // client takes to learn of it (see the test above).
            .lease(Duration::from_secs(12))
            .connect_timeout(CONNECT)
            .command_timeout(COMMAND)
            .retry_timeout(Duration::from_secs(20))
    };

    // A wrong master password: refused at build(), within its bound, saying why.
    let t = Instant::now();
    let e = builder("not-the-password").build().unwrap_err();
    assert!(
        e.to_string().contains("WRONGPASS") && e.to_string().contains("master_auth"),
        "{e}"
    );
    assert!(t.elapsed() < 3 * CONNECT + 2 * COMMAND + SLACK);
    // A wrong sentinel password: refused too, naming the sentinels.
    let wrong: Vec<String> = set
        .sentinel_urls()
        .iter()
        .map(|u| u.replace(":sentinel-pw@", ":wrong@"))
        .collect();
    let e = Client::sentinel(wrong, set.master_name())
        .tls_root_cert(files.ca_pem())
        .master_auth(Some(MASTER_USER), MASTER_PASS)
        .connect_timeout(CONNECT)
        .build()
        .unwrap_err();
    assert!(
        e.to_string().contains("a sentinel refused the credentials"),
        "{e}"
    );

    // Sentinels whose certificate is not signed by the trusted CA: a TLS error, naming it.
    let e = Client::sentinel(set.sentinel_urls(), set.master_name())
        .tls_root_cert(files.other_ca_pem())
        .connect_timeout(CONNECT)
        .build()
        .unwrap_err();
    assert!(e.is_tls(), "{e}");

    let a = builder(MASTER_PASS).build().unwrap();
    let b = builder(MASTER_PASS).build().unwrap();
    let master = set.master_port();
    let name = unique_name("sentinel-tls");
    let key = lock_key(&name);
    let (la, lb) = (a.mutex(&name).unwrap(), b.mutex(&name).unwrap());

    // Locked through TLS as the ACL user: the key is on the master, and every connection of
    // the clients there is the ACL user's.
    let guard = la.lock().unwrap();
    assert!(exists(&set, master, &key));
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut set.conn(master))
        .unwrap();
    let ours = clients
        .lines()
        .filter(|l| l.contains("user=locksmith"))
        .count();
    assert!(
        ours >= 4,
        "command and pub/sub connections of both clients: {clients}"
    );

    // Hand-off between the clients: b waits, a releases, b gets it (woken by the release).
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let g = lb.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
        tx.send(Instant::now()).unwrap();
        let token = g.fencing_token();
        g.unlock().unwrap();
        (lb, token)
    });
    assert!(common::wait_until(Duration::from_secs(5), || {
        clients_waiting(&set, master) > 0
    }));
    let released = Instant::now();
    guard.unlock().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        got - released < Duration::from_secs(1),
        "{:?}",
        got - released
    );
    let (lb, handed) = waiter.join().unwrap();
    let g = lb.lock().unwrap();
    let token = g.fencing_token();
    assert!(token > handed);

    // A graceful failover while b holds the lock: the guard is renewed on the new master
    // (the key replicated before the promotion), reached over TLS as the ACL user.
    let new = set.failover(Duration::from_secs(20));
    assert_ne!(new, master);
    assert!(exists(&set, new, &key), "{}", set.logs(10));
    // Renewed there: the key's time to live on the new master goes up (it only goes down
    // otherwise).
    let before = pttl(&set, new, &key);
    assert!(before > 0);
    assert!(
        common::wait_until(Duration::from_secs(10), || pttl(&set, new, &key) > before),
        "{}",
        set.logs(10)
    );
    assert!(g.is_held());
    g.unlock().unwrap();
    assert!(!exists(&set, new, &key));
    // The other client locks on the new master too, with a greater token.
    let g = la.try_lock_for(Duration::from_secs(5)).unwrap().unwrap();
    assert!(g.fencing_token() > token);
    assert!(exists(&set, new, &key));
    drop(g);
    drop(lb);
}

/// How many channels have subscribers on the master (a waiter subscribes to its lock's).
fn clients_waiting(set: &SentinelSet, port: u16) -> i64 {
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query(&mut set.conn(port))
        .unwrap();
    channels.len() as i64
}

fn pttl(set: &SentinelSet, port: u16, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut set.conn(port))
        .unwrap()
}

/// The fair mutex, the read-write lock and the semaphore through a Sentinel client: the same
/// lock objects as on one server, on the master the sentinels name.
#[test]
fn the_lock_family_works_through_sentinel() {
    let set = SentinelSet::start();
    let a = client(&set, Duration::from_secs(5));
    let b = client(&set, Duration::from_secs(5));
    let name = unique_name("sentinel-family");
    common::with_deadline(Duration::from_secs(30), move || {
        let fair = a.fair_mutex(&name).unwrap();
        let guard = fair.lock().unwrap();
        let other = b.fair_mutex(&name).unwrap();
        assert!(other.try_lock().unwrap().is_none());
        guard.unlock().unwrap();
        assert!(other.try_lock().unwrap().is_some());

        let (ra, rb) = (a.rw_lock(&name).unwrap(), b.rw_lock(&name).unwrap());
        let read = ra.read().unwrap();
        let shared = rb.try_read().unwrap().expect("readers share the lock");
        assert!(rb.try_write().is_err(), "a reader may not write");
        drop(shared);
        assert!(
            rb.try_write().unwrap().is_none(),
            "a writer waits for readers"
        );
        read.unlock().unwrap();
        let write = rb.try_write().unwrap().expect("free for a writer");
        assert!(write.fencing_token() > 0);
        assert!(ra.try_read().unwrap().is_none());
        drop(write);

        let (sa, sb) = (
            a.semaphore(&name, 2).unwrap(),
            b.semaphore(&name, 2).unwrap(),
        );
        let two = sa.acquire_many(2).unwrap();
        assert!(sb.try_acquire().unwrap().is_none());
        assert_eq!(sb.available().unwrap(), 0);
        two.unlock().unwrap();
        assert!(sb.try_acquire().unwrap().is_some());
    });
}
