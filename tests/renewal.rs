//! Batched renewal: many held leases are extended in few script calls, each lease keeps its
//! own outcome, and every lost lease is reported exactly once, on one server and on a quorum.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::Duration;

use common::RedisServer;
use locksmith::{Client, LeaseKind, LostLease, MutexGuard};

const LEASE: Duration = Duration::from_millis(1500);
const EVERY: Duration = Duration::from_millis(500);

/// Names of the leases reported lost, with how often each was reported.
type Reports = Arc<StdMutex<HashMap<String, usize>>>;

fn recorder() -> (Reports, impl Fn(&LostLease) + Send + Sync + 'static) {
    let reports: Reports = Arc::default();
    let r = Arc::clone(&reports);
    (reports, move |lost: &LostLease| {
        *r.lock().unwrap().entry(lost.name.clone()).or_default() += 1;
    })
}

/// A client with the tests' lease and renewal interval, recording the leases it reports lost.
fn reporting_client(server: &RedisServer) -> (Client, Reports) {
    let (reports, hook) = recorder();
    let client = Client::builder(server.url().as_str())
        .lease(LEASE)
        .renew_interval(EVERY)
        .on_lease_lost(hook)
        .build()
        .unwrap();
    (client, reports)
}

fn evalsha(conn: &mut redis::Connection) -> u64 {
    common::script_calls(conn)
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    let base = common::unique_name(prefix);
    (0..n).map(|i| format!("{base}:{i}")).collect()
}

/// 300 locks held for 4 renewal intervals: renewed in calls of many leases (a few calls per
/// interval, where one call per lease would make 1,200), and every key's lease was extended.
#[test]
fn many_locks_are_renewed_in_few_calls() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let client = Client::builder(server.url().as_str())
        .lease(LEASE)
        .renew_interval(EVERY)
        .build()
        .unwrap();
    let names = names("batch", 300);
    let mutexes: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
    let guards: Vec<MutexGuard> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
    let before = evalsha(&mut conn);
    thread::sleep(EVERY * 4);
    let renewals = evalsha(&mut conn) - before;
    assert!(guards.iter().all(MutexGuard::is_held));
    // 300 leases x 4 intervals = 1,200 renewals; calls of up to 128 leases, and a batch may
    // be split where the acquisitions spread over the coalescing window.
    assert!(
        (4..=60).contains(&renewals),
        "{renewals} EVALSHA for 1,200 renewals"
    );
    // Each key was extended by its last renewal: more than a lease minus two intervals left.
    for n in &names {
        let ttl = common::pttl(&mut conn, &common::lock_key(n));
        assert!(
            ttl > (LEASE - EVERY * 2).as_millis() as i64,
            "{n}: {ttl} ms"
        );
    }
    for g in guards {
        g.unlock().unwrap();
    }
}

/// In one batch, 5 keys deleted and 2 replaced by a string behind their holders: exactly those
/// 7 leases are reported lost, each once (also two intervals later), and the other 93 stay
/// held and renewed.
#[test]
fn mixed_outcomes_in_one_call_report_exactly_the_lost() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (client, reports) = reporting_client(&server);
    let names = names("mixed", 100);
    let mutexes: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
    let guards: Vec<MutexGuard> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
    let deleted: Vec<usize> = vec![3, 17, 50, 51, 99];
    let foreign: Vec<usize> = vec![20, 64];
    for &i in &deleted {
        redis::cmd("DEL")
            .arg(common::lock_key(&names[i]))
            .exec(&mut conn)
            .unwrap();
    }
    for &i in &foreign {
        let key = common::lock_key(&names[i]);
        redis::cmd("DEL").arg(&key).exec(&mut conn).unwrap();
        redis::cmd("SET")
            .arg(&key)
            .arg("not a lock")
            .exec(&mut conn)
            .unwrap();
    }
    let before = evalsha(&mut conn);
    let lost: Vec<usize> = deleted.iter().chain(&foreign).copied().collect();
    assert!(
        common::wait_until(EVERY * 3, || reports.lock().unwrap().len() >= lost.len()),
        "reported: {:?}",
        reports.lock().unwrap()
    );
    // Two more intervals: no lease is reported twice, none of the others at all.
    thread::sleep(EVERY * 2);
    let renewals = evalsha(&mut conn) - before;
    let got = reports.lock().unwrap().clone();
    let want: HashMap<String, usize> = lost.iter().map(|&i| (names[i].clone(), 1)).collect();
    assert_eq!(got, want);
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_held(), !lost.contains(&i), "{}", names[i]);
    }
    assert!(renewals <= 20, "{renewals} EVALSHA for about 300 renewals");
    // The foreign values were left as they were.
    for &i in &foreign {
        let v: String = redis::cmd("GET")
            .arg(common::lock_key(&names[i]))
            .query(&mut conn)
            .unwrap();
        assert_eq!(v, "not a lock");
    }
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.unlock().is_ok(), !lost.contains(&i), "{}", names[i]);
    }
}

/// A renewal extends only the acquisition it belongs to. Among 10 leases renewed in one call,
/// one lock's hash is made to name another acquisition of the same owner (its `gen` changed,
/// its owner kept, its TTL set long): that lease is reported lost, once, and its key is left
/// as it was (neither extended nor shortened), while the other 9 stay held. Acquisition ids
/// of different calls, clients and processes never repeat, so a changed owner always comes
/// with a changed `gen`.
#[test]
fn a_renewal_extends_only_its_own_acquisition() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (client, reports) = reporting_client(&server);
    let names = names("own", 10);
    let mutexes: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
    let guards: Vec<MutexGuard> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
    let key = common::lock_key(&names[4]);
    let owner = common::lock_value_at(&mut conn, &key)
        .map(|v| v.owner)
        .unwrap();
    let ours = common::lock_value_at(&mut conn, &key)
        .map(|v| v.acquisition)
        .unwrap();
    // Other clients' acquisitions have other ids, even from the same process.
    let other = Client::open(server.url().as_str()).unwrap();
    let other_name = common::unique_name("other");
    let other_mutex = other.mutex(&other_name).unwrap();
    let g = other_mutex.lock().unwrap();
    let gens: Vec<String> = names
        .iter()
        .map(|n| {
            common::lock_value_at(&mut conn, &common::lock_key(n))
                .map(|v| v.acquisition)
                .unwrap()
        })
        .collect();
    let theirs = common::lock_value_at(&mut conn, &common::lock_key(&other_name))
        .map(|v| v.acquisition)
        .unwrap();
    assert!(!gens.contains(&theirs), "{theirs} in {gens:?}");
    assert_eq!(
        gens.iter().collect::<std::collections::HashSet<_>>().len(),
        gens.len()
    );
    g.unlock().unwrap();
    // Another acquisition of the same owner whose id begins with this one's: the renewal
    // checks the whole id (up to the separator), not a prefix of it.
    let later = format!("{ours}0");
    let raw: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
    redis::cmd("SET")
        .arg(&key)
        .arg(format!("{later}{}", &raw[ours.len()..]))
        .arg("PX")
        .arg(60_000)
        .exec(&mut conn)
        .unwrap();
    assert!(
        common::wait_until(EVERY * 3, || !reports.lock().unwrap().is_empty()),
        "the lease of another acquisition was not reported lost"
    );
    thread::sleep(EVERY * 2);
    let got = reports.lock().unwrap().clone();
    assert_eq!(got, HashMap::from([(names[4].clone(), 1)]));
    let ttl = common::pttl(&mut conn, &key);
    assert!(
        (50_000..=60_000).contains(&ttl),
        "PTTL {ttl} ms: the other acquisition's lease was changed"
    );
    assert_eq!(
        common::lock_value_at(&mut conn, &key).map(|v| v.acquisition),
        Some(later)
    );
    assert_eq!(common::owner_at(&mut conn, &key), Some(owner));
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.is_held(), i != 4, "{}", names[i]);
        assert_eq!(g.unlock().is_ok(), i != 4, "{}", names[i]);
    }
    // The other acquisition's key was not released by the stale guard either.
    assert!(common::exists(&mut conn, &key));
}

/// After `SCRIPT FLUSH` the next batch meets `NOSCRIPT`, loads the scripts and is resent: no
/// lease is lost.
#[test]
fn renewal_survives_script_flush() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (client, reports) = reporting_client(&server);
    let names = names("flush", 150);
    let mutexes: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
    let guards: Vec<MutexGuard> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
    let failed = |conn: &mut redis::Connection| {
        common::errorstats(conn)
            .get("NOSCRIPT")
            .copied()
            .unwrap_or(0)
    };
    let noscript = failed(&mut conn);
    for _ in 0..2 {
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
        thread::sleep(EVERY * 2);
    }
    assert!(failed(&mut conn) > noscript, "no batch met NOSCRIPT");
    assert!(reports.lock().unwrap().is_empty(), "{:?}", reports.lock());
    assert!(guards.iter().all(MutexGuard::is_held));
    for n in &names {
        let ttl = common::pttl(&mut conn, &common::lock_key(n));
        assert!(
            ttl > (LEASE - EVERY * 2).as_millis() as i64,
            "{n}: {ttl} ms"
        );
    }
    for g in guards {
        g.unlock().unwrap();
    }
}

/// On a quorum of 3 masters: batched renewal raises every master's fencing counter to the
/// holder's token, a lease whose key is gone on 1 master stays held, and a lease whose key is
/// gone on 2 is reported lost, once.
#[test]
fn quorum_renewal_keeps_outcomes_and_fences() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut conns: Vec<redis::Connection> = servers.iter().map(RedisServer::conn).collect();
    let (reports, hook) = recorder();
    let quorum = Client::redlock(servers.iter().map(RedisServer::url).collect::<Vec<_>>())
        .lease(LEASE)
        .renew_interval(EVERY)
        .master_timeout(Duration::from_millis(200))
        .on_lease_lost(hook)
        .build()
        .unwrap();
    let names = names("quorum", 90);
    let mutexes: Vec<_> = names.iter().map(|n| quorum.mutex(n).unwrap()).collect();
    let guards: Vec<MutexGuard> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
    // Counters pushed back on master 0: the renewal must raise them to the holders' tokens.
    for n in &names {
        redis::cmd("SET")
            .arg(common::fence_key(n))
            .arg(1)
            .exec(&mut conns[0])
            .unwrap();
    }
    let minority: Vec<usize> = vec![1, 40, 89];
    let majority: Vec<usize> = vec![2, 41, 60, 88];
    for &i in &minority {
        redis::cmd("DEL")
            .arg(common::lock_key(&names[i]))
            .exec(&mut conns[2])
            .unwrap();
    }
    for &i in &majority {
        for c in &mut conns[..2] {
            redis::cmd("DEL")
                .arg(common::lock_key(&names[i]))
                .exec(c)
                .unwrap();
        }
    }
    assert!(common::wait_until(EVERY * 3, || reports
        .lock()
        .unwrap()
        .len()
        >= majority.len()));
    thread::sleep(EVERY * 2);
    let want: HashMap<String, usize> = majority.iter().map(|&i| (names[i].clone(), 1)).collect();
    assert_eq!(*reports.lock().unwrap(), want);
    for (i, g) in guards.iter().enumerate() {
        assert_eq!(g.is_held(), !majority.contains(&i), "{}", names[i]);
        if majority.contains(&i) {
            continue;
        }
        let fence: u64 = redis::cmd("GET")
            .arg(common::fence_key(&names[i]))
            .query(&mut conns[0])
            .unwrap();
        assert!(fence >= g.fencing_token(), "{}: {fence}", names[i]);
    }
    for (i, g) in guards.into_iter().enumerate() {
        assert_eq!(g.unlock().is_ok(), !majority.contains(&i), "{}", names[i]);
    }
}

/// A lost lease says what kind it was: the server state of a mutex, a fair mutex, a reader
/// and a writer of two read-write locks, and a semaphore's permits is deleted behind their
/// guards, and each loss is reported with its lock's name and its kind.
#[test]
fn a_lost_lease_says_what_kind_it_was() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let (tx, rx) = std::sync::mpsc::channel::<LostLease>();
    let client = Client::builder(server.url().as_str())
        .lease(LEASE)
        .renew_interval(EVERY)
        .on_lease_lost(move |lost| {
            let _ = tx.send(lost.clone());
        })
        .build()
        .unwrap();
    let base = common::unique_name("kinds");
    let name = |kind: &str| format!("{base}:{kind}");
    let mutex = client.mutex(&name("mutex")).unwrap();
    let fair = client.fair_mutex(&name("fair")).unwrap();
    let read = client.rw_lock(&name("read")).unwrap();
    let write = client.rw_lock(&name("write")).unwrap();
    let sem = client.semaphore(&name("permits"), 3).unwrap();
    let guards = (
        mutex.lock().unwrap(),
        fair.lock().unwrap(),
        read.read().unwrap(),
        write.write().unwrap(),
        sem.acquire_many(2).unwrap(),
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{base}*"))
        .query(&mut conn)
        .unwrap();
    assert!(keys.len() >= 5, "keys of the five locks: {keys:?}");
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();

    // Each lease is found lost by its next renewal, within an interval.
    let mut reported = HashMap::new();
    while reported.len() < 5 {
        let lost = rx
            .recv_timeout(EVERY * 4)
            .unwrap_or_else(|_| panic!("reported so far: {reported:?}"));
        assert!(
            reported.insert(lost.name.clone(), lost.kind).is_none(),
            "{} reported twice",
            lost.name
        );
    }
    let expected = HashMap::from([
        (name("mutex"), LeaseKind::Mutex),
        (name("fair"), LeaseKind::FairMutex),
        (name("read"), LeaseKind::Read),
        (name("write"), LeaseKind::Write),
        (name("permits"), LeaseKind::Permits),
    ]);
    assert_eq!(reported, expected);
    assert!(!guards.0.is_held() && !guards.2.is_held() && !guards.4.is_held());
}
