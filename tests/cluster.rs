//! Redis Cluster: slot routing, sharded pub/sub, failover and slot migration, against a real
//! local cluster (3 masters + 3 replicas started by the tests on free ports; see
//! `testkit/src/cluster.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::checker::{self, Interval, Store, StoreClient};
use common::{RedisCluster, lock_key, mono_ns, release_channel, unique_name};
use locksmith::Client;

const CONNECT: Duration = Duration::from_millis(300);
const COMMAND: Duration = Duration::from_millis(300);
/// What a test allows on top of a documented call bound (a loaded machine, timer slack).
const SLACK: Duration = Duration::from_millis(1000);

fn client(cluster: &RedisCluster, lease: Duration) -> Client {
    Client::cluster(cluster.seed_urls())
        .lease(lease)
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Whether node `port` has `key` (with `ASKING`, so that a node importing the slot answers).
fn exists(cluster: &RedisCluster, port: u16, key: &str) -> bool {
    let (n,): (i64,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(key)
        .query(&mut cluster.conn(port))
        .unwrap();
    n == 1
}

/// Lock names whose slots cover every master, including names with braces and non-ASCII.
fn names_over_masters(cluster: &RedisCluster, tag: &str, per_master: usize) -> Vec<String> {
    let masters = cluster.masters();
    let mut by_master = vec![Vec::new(); masters.len()];
    let shapes = ["{x}", "a}b{c", "é{名前}", "{}", "plain"];
    let mut i = 0;
    while by_master.iter().any(|v: &Vec<String>| v.len() < per_master) {
        let name = unique_name(&format!("{tag}-{}-{i}", shapes[i % shapes.len()]));
        let m = cluster.master_of_key(&lock_key(&name));
        let k = masters.iter().position(|p| *p == m).unwrap();
        if by_master[k].len() < per_master {
            by_master[k].push(name);
        }
        i += 1;
    }
    by_master.into_iter().flatten().collect()
}

#[test]
fn bad_cluster_input_gives_clear_errors() {
    let empty: Vec<String> = Vec::new();
    let e = Client::cluster(empty).build().unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    assert!(e.to_string().contains("seeds"), "{e}");
    let e = Client::cluster(["http://127.0.0.1:1/"])
        .build()
        .unwrap_err();
    assert!(e.is_invalid_config(), "{e}");
    let e = Client::cluster(["redis://127.0.0.1:1/2"])
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("database"), "{e}");
    let e = Client::cluster(["redis://127.0.0.1:1/", "rediss://127.0.0.1:2/"])
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("rediss"), "{e}");
    let e = Client::cluster(["redis://127.0.0.1:1/"])
        .master_timeout(Duration::from_millis(50))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("master_timeout"), "{e}");
    let e = Client::cluster(["redis://127.0.0.1:1/"])
        .wait_replicas(1, Duration::from_millis(10))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("wait_replicas"), "{e}");
    // A seed that does not answer: a connection error within the bound, not a hang.
    let t = Instant::now();
    let closed = common::ClosedPort::new();
    let e = Client::cluster([closed.url()])
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap_err();
    assert!(!e.is_invalid_config(), "{e}");
    assert!(t.elapsed() < CONNECT + COMMAND + SLACK, "{:?}", t.elapsed());
}

/// One cluster, several checks in turn: locks on every master (keys where their slot's
/// master is), handoff through sharded pub/sub subscribed on the right node, the lock
/// family, exclusion across processes, then a slot migration of a held lock.
#[test]
fn locks_route_by_slot_and_wait_on_sharded_pubsub() {
    let cluster = RedisCluster::start();
    let lease = Duration::from_secs(3);
    let a = client(&cluster, lease);
    let b = Client::cluster(
        cluster
            .seed_urls()
            .iter()
            .map(String::as_str)
            .take(1)
            .collect::<Vec<&str>>(),
    )
    .lease(lease)
    .build()
    .unwrap();
    assert_eq!(a.masters(), 1);

    // 1. Names on every master: each lock lives on its slot's master.
    let names = names_over_masters(&cluster, "route", 2);
    for name in &names {
        let lock = a.mutex(name).unwrap();
        let g = lock.lock().unwrap();
        let owner = cluster.master_of_key(&lock_key(name));
        assert!(exists(&cluster, owner, &lock_key(name)), "{name}");
        assert!(b.mutex(name).unwrap().try_lock().unwrap().is_none());
        assert!(lock.is_locked().unwrap());
        g.unlock().unwrap();
        assert!(!exists(&cluster, owner, &lock_key(name)));
        assert!(b.mutex(name).unwrap().try_lock().unwrap().is_some());
    }

    // 1a. Every master ran the Mutex's acquire and release as functions (FCALL of the sharded
    // library); after FUNCTION FLUSH on every master, the library is loaded again where a call
    // finds it missing, and the calls go on.
    for m in cluster.masters() {
        let stats = common::commandstats(&mut cluster.conn(m));
        assert!(
            common::calls(&stats, "cmdstat_fcall") >= 2,
            "{m}: {stats:?}"
        );
        redis::cmd("FUNCTION")
            .arg("FLUSH")
            .exec(&mut cluster.conn(m))
            .unwrap();
    }
    for name in &names {
        a.mutex(name).unwrap().lock().unwrap().unlock().unwrap();
    }
    for m in cluster.masters() {
        let failed = common::stat(&common::failed_by_command(&mut cluster.conn(m)), "fcall");
        assert!(failed >= 1, "{m}: no call met the flushed library");
    }

    // 1b. Many held locks over every master, renewed: each renewal call covers one slot
    // (pipelined per master), so every guard stays held through several renewals of a short
    // lease, and no master ever answered CROSSSLOT.
    let short = Client::cluster(cluster.seed_urls())
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let many = names_over_masters(&cluster, "renew", 20);
    let locks: Vec<_> = many.iter().map(|n| short.mutex(n).unwrap()).collect();
    let guards: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    thread::sleep(Duration::from_millis(1500));
    assert!(
        guards.iter().all(|g| g.is_held()),
        "a renewed guard was lost"
    );
    drop(guards);
    for m in cluster.masters() {
        let errors = common::errorstats(&mut cluster.conn(m));
        assert!(!errors.contains_key("CROSSSLOT"), "{m}: {errors:?}");
    }

    // 2. Handoff between clients through sharded pub/sub, on every master: the waiter is
    // subscribed (SSUBSCRIBE) on its slot's master only, and wakes at the release.
    for name in names.iter().step_by(2) {
        let owner = cluster.master_of_key(&lock_key(name));
        let m = a.mutex(name).unwrap();
        let g = m.lock().unwrap();
        let token = g.fencing_token();
        let waiter = {
            let b = b.clone();
            let name = name.clone();
            thread::spawn(move || {
                let m = b.mutex(&name).unwrap();
                let g = m.lock().unwrap();
                (g.fencing_token(), Instant::now())
            })
        };
        let channel = release_channel(name);
        assert!(
            common::wait_until(Duration::from_secs(5), || cluster
                .shard_numsub(owner, &channel)
                == 1),
            "the waiter is not SSUBSCRIBEd on {owner}"
        );
        for m in cluster.masters().into_iter().filter(|m| *m != owner) {
            assert_eq!(cluster.shard_numsub(m, &channel), 0);
        }
        // The lease is 3 s: a wake-up well before that is the release's message.
        thread::sleep(Duration::from_millis(100));
        let released = Instant::now();
        g.unlock().unwrap();
        let (t2, woke) = waiter.join().unwrap();
        assert!(t2 > token);
        let handoff = woke.duration_since(released);
        assert!(handoff < Duration::from_millis(1000), "handoff {handoff:?}");
    }

    // 3. The lock family works through the same routing (their keys share the hash tag).
    let fair = a.fair_mutex(&names[0]).unwrap();
    let g = fair.lock().unwrap();
    assert!(
        b.fair_mutex(&names[0])
            .unwrap()
            .try_lock()
            .unwrap()
            .is_none()
    );
    let waiter = {
        let b = b.clone();
        let name = names[0].clone();
        thread::spawn(move || {
            b.fair_mutex(&name)
                .unwrap()
                .lock()
                .map(|g| g.fencing_token())
        })
    };
    thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    drop(g);
    waiter.join().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    let rw = a.rw_lock(&names[1]).unwrap();
    let r1 = rw.read().unwrap();
    let rw_b = b.rw_lock(&names[1]).unwrap();
    let r2 = rw_b.read().unwrap();
    let try_write = |c: &Client| {
        let (c, name) = (c.clone(), names[1].clone());
        thread::spawn(move || c.rw_lock(&name).unwrap().try_write().unwrap().is_some())
            .join()
            .unwrap()
    };
    assert!(!try_write(&b));
    drop((r1, r2));
    assert!(try_write(&b));
    let sem = a.semaphore(&names[2], 2).unwrap();
    let p1 = sem.acquire().unwrap();
    let _p2 = sem.acquire().unwrap();
    assert!(
        b.semaphore(&names[2], 2)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_none()
    );
    drop(p1);
    assert!(
        b.semaphore(&names[2], 2)
            .unwrap()
            .try_acquire()
            .unwrap()
            .is_some()
    );

    // 4. Exclusion across 3 processes x 4 threads over names on every master.
    exclusion_across_processes(&cluster);

    // 5. Slot migration of a held lock's slot, with a waiter and a renewing guard.
    migration_of_a_held_lock(&cluster, &a, &b);
}

/// Entry point of the child processes of the exclusion check.
#[test]
fn child_cluster_counter() {
    if !common::is_child("cluster-counter") {
        return;
    }
    let seeds = common::child_list("LS_SEEDS", ',');
    let names = common::child_list("LS_NAMES", '\u{1f}');
    let rounds: usize = common::child_var("LS_ROUNDS");
    let store = common::child_var("LS_STORE");
    let before = common::thread_count();
    let client = Client::cluster(&seeds)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let workers: Vec<_> = (0..4u32)
        .map(|w| {
            let client = client.clone();
            let names = names.clone();
            thread::spawn(move || {
                let mut sc = StoreClient::connect(store);
                for k in 0..rounds {
                    let i = (k * 7 + w as usize * 3) % names.len();
                    let lock = client.mutex(&names[i]).unwrap();
                    let g = lock.lock().unwrap();
                    let res = format!("r{i}");
                    let start = mono_ns();
                    let v = sc.read(&res);
                    assert!(sc.write(&res, g.fencing_token(), v + 1));
                    let end = mono_ns();
                    let held = g.check().is_ok();
                    let token = g.fencing_token();
                    sc.interval(&common::section(&res, w, token, (start, end), held));
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // Waiters used shard connections to every master: still exactly two threads (once the
    // joined workers are gone from the count).
    assert_eq!(
        common::settled_thread_count(before + 2, Duration::from_secs(2)),
        before + 2,
        "threads of a cluster client"
    );
}

fn exclusion_across_processes(cluster: &RedisCluster) {
    const CHILDREN: usize = 3;
    const ROUNDS: usize = 40;
    let store = Store::start();
    let names = names_over_masters(cluster, "excl", 2);
    let envs = [
        ("LS_SEEDS", cluster.seed_urls().join(",")),
        ("LS_NAMES", names.join("\u{1f}")),
        ("LS_ROUNDS", ROUNDS.to_string()),
        ("LS_STORE", store.port().to_string()),
    ];
    let t = Instant::now();
    common::run_children(
        CHILDREN,
        "child_cluster_counter",
        "cluster-counter",
        &envs,
        Duration::from_secs(60),
    );
    let total: u64 = (0..names.len())
        .map(|i| store.resource(&format!("r{i}")).value)
        .sum();
    assert_eq!(total, (CHILDREN * 4 * ROUNDS) as u64, "lost updates");
    let f = checker::assert_clean(&store.intervals());
    assert_eq!(f.lost, 0);
    eprintln!(
        "exclusion: {} critical sections over {} names in {:?}",
        f.intervals,
        names.len(),
        t.elapsed()
    );
}

fn migration_of_a_held_lock(cluster: &RedisCluster, a: &Client, b: &Client) {
    // A short lease, so that a renewal that did not follow the key would lose the guard.
    let lease = Duration::from_millis(900);
    let holder = Client::cluster(cluster.seed_urls())
        .lease(lease)
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap();
    let name = unique_name("migrate-{tag}");
    let key = lock_key(&name);
    let slot = cluster.slot_of(&key);
    let held = holder.mutex(&name).unwrap();
    let g = held.lock().unwrap();
    let token = g.fencing_token();
    let waiter = {
        let b = b.clone();
        let name = name.clone();
        thread::spawn(move || {
            let m = b.mutex(&name).unwrap();
            let g = m.lock().unwrap();
            (g.fencing_token(), Instant::now())
        })
    };
    let from = cluster.master_of_slot(slot);
    let to = cluster.masters().into_iter().find(|m| *m != from).unwrap();
    assert!(common::wait_until(Duration::from_secs(5), || cluster
        .shard_numsub(from, &release_channel(&name))
        == 1));
    // Mid-migration (keys moved, slot not yet handed over): calls are answered with ASK by
    // the old owner and must follow it.
    let from2 = cluster.begin_migration(slot, to);
    assert_eq!(from2, from);
    cluster.migrate_keys(slot, from, to);
    assert!(exists(cluster, to, &key));
    // The old owner no longer has the key: it answers ASK, and ASKING finds it on `to`.
    assert!(a.mutex(&name).unwrap().try_lock().unwrap().is_none());
    thread::sleep(lease);
    assert!(g.is_held(), "renewal did not follow the key mid-migration");
    cluster.finish_migration(slot, from, to);
    // Renewal follows the key (the lease would have run out twice by now otherwise).
    thread::sleep(lease * 2);
    assert!(g.is_held(), "renewal did not follow the migrated key");
    assert!(exists(cluster, to, &key));
    // The waiter was moved to the new owner's shard and still wakes on the release.
    assert!(
        common::wait_until(Duration::from_secs(5), || cluster
            .shard_numsub(to, &release_channel(&name))
            == 1),
        "the waiter did not resubscribe on the new owner"
    );
    let released = Instant::now();
    g.unlock().unwrap();
    let (t2, woke) = common::with_deadline(Duration::from_secs(10), move || waiter.join().unwrap());
    assert!(t2 > token);
    assert!(
        woke.duration_since(released) < Duration::from_millis(700),
        "the waiter woke {:?} after the release",
        woke.duration_since(released)
    );
}

/// `CLUSTER FAILOVER` on a replica and `SIGKILL` of a master while locks are held and waiters
/// wait: no overlap except where the earlier holder was told it lost the lock, tokens never
/// go back, every call keeps its bound, held guards are renewed on the promoted replica.
#[test]
fn locks_survive_a_failover_and_a_killed_master() {
    let mut cluster = RedisCluster::start();
    let lease = Duration::from_millis(1500);
    let holders = client(&cluster, lease);
    let waiters = client(&cluster, lease);
    let names = names_over_masters(&cluster, "fail", 1);
    // A guard held across the graceful failover of its master: renewed on the promoted
    // replica (the key replicated before the switch).
    let long_client = client(&cluster, Duration::from_secs(6));
    let long_name = names[0].clone();
    let long_slot = cluster.slot_of(&lock_key(&long_name));
    let long_lock = long_client.mutex(&long_name).unwrap();
    let long_guard = long_lock.lock().unwrap();
    let long_token = long_guard.fencing_token();

    let stop = Arc::new(AtomicBool::new(false));
    let intervals = Arc::new(parking_lot::Mutex::new(Vec::<Interval>::new()));
    let slowest_call_ms = Arc::new(AtomicU64::new(0));
    let wait = Duration::from_secs(2);
    let mut workers = Vec::new();
    for w in 0..6u32 {
        let c = if w % 2 == 0 { &holders } else { &waiters }.clone();
        let name = names[1 + (w as usize / 2) % (names.len() - 1)].clone();
        let (stop, intervals, slowest) = (
            Arc::clone(&stop),
            Arc::clone(&intervals),
            Arc::clone(&slowest_call_ms),
        );
        workers.push(thread::spawn(move || {
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
                thread::sleep(Duration::from_millis(20));
                let end = mono_ns();
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

    // 1. A graceful failover of the long guard's master, with a waiter behind the guard.
    let long_waiter = {
        let c = waiters.clone();
        let name = long_name.clone();
        thread::spawn(move || {
            let m = c.mutex(&name).unwrap();
            let g = m.try_lock_for(Duration::from_secs(30));
            (g.unwrap().map(|g| g.fencing_token()), Instant::now())
        })
    };
    assert!(common::wait_until(Duration::from_secs(5), || cluster
        .shard_numsub(
            cluster.master_of_slot(long_slot),
            &release_channel(&long_name)
        )
        == 1));
    let replica = cluster.replica_of_slot(long_slot);
    let t = Instant::now();
    cluster.failover(replica, Duration::from_secs(20));
    eprintln!("graceful failover took {:?}", t.elapsed());
    thread::sleep(Duration::from_secs(6) + Duration::from_millis(300));
    assert!(
        long_guard.is_held(),
        "the held guard was not renewed on the promoted replica"
    );
    assert!(exists(&cluster, replica, &lock_key(&long_name)));
    assert!(
        common::wait_until(Duration::from_secs(5), || cluster
            .shard_numsub(replica, &release_channel(&long_name))
            == 1),
        "the waiter did not resubscribe on the promoted replica"
    );
    let released = Instant::now();
    long_guard.unlock().unwrap();
    let (token, woke) =
        common::with_deadline(Duration::from_secs(10), move || long_waiter.join().unwrap());
    assert!(token.unwrap() > long_token);
    let handoff = woke.duration_since(released);
    assert!(
        handoff < Duration::from_secs(1),
        "handoff after the failover took {handoff:?}"
    );

    // 2. SIGKILL of a master that serves the workers' locks.
    let victim = cluster.master_of_key(&lock_key(&names[1]));
    let victim_slot = cluster.slot_of(&lock_key(&names[1]));
    // Meanwhile short calls on a lock of another master run out of their bound while the
    // cluster is down (`CLUSTERDOWN` until the promotion): each error must be one that a
    // retry cures, never a hard one.
    let probe_done = Arc::new(AtomicBool::new(false));
    let probe = {
        let (c, done) = (holders.clone(), Arc::clone(&probe_done));
        let name = names
            .iter()
            .find(|n| cluster.master_of_key(&lock_key(n)) != victim)
            .unwrap()
            .clone();
        thread::spawn(move || {
            let lock = c.mutex(&name).unwrap();
            let mut errors = Vec::new();
            while !done.load(Ordering::SeqCst) {
                if let Err(e) = lock.try_lock_for(Duration::from_millis(200)) {
                    errors.push(e);
                }
            }
            errors
        })
    };
    let killed_at = mono_ns();
    let t = Instant::now();
    cluster.kill(victim);
    let promoted = cluster.wait_new_master(victim_slot, victim, Duration::from_secs(30));
    eprintln!("killed master: {promoted} promoted after {:?}", t.elapsed());
    probe_done.store(true, Ordering::SeqCst);
    let errors = common::with_deadline(Duration::from_secs(5), move || probe.join().unwrap());
    eprintln!("{} short calls ran out during the failover", errors.len());
    let hard: Vec<String> = errors
        .iter()
        .filter(|e| !(e.is_retriable() || e.is_timeout()))
        .map(ToString::to_string)
        .collect();
    assert!(hard.is_empty(), "errors a retry would not cure: {hard:?}");
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            intervals
                .lock()
                .iter()
                .filter(|i| i.start > killed_at && i.lock == names[1])
                .count()
                > 0
        }),
        "no lock on the promoted replica"
    );
    let now = mono_ns();
    assert!(common::wait_until(
        Duration::from_secs(5),
        || acquired_since(now) > 3
    ));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    let slowest = Duration::from_millis(slowest_call_ms.load(Ordering::SeqCst));
    assert!(
        slowest < wait.max(CONNECT) + COMMAND + SLACK,
        "a call took {slowest:?}"
    );
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

/// How much later than with nothing frozen a release on a healthy master may reach its waiter
/// while another master and its replica are frozen (a loaded machine's slack).
const FROZEN_EXTRA: Duration = Duration::from_millis(500);

/// What one node that does not give the slot map may cost a map read (see the crate's
/// "Time bounds"): 1 s at the default timeouts.
const PER_NODE: Duration = Duration::from_secs(1);

/// A lock name whose slot's master is `master`.
fn name_on(cluster: &RedisCluster, master: u16, tag: &str) -> String {
    loop {
        let name = unique_name(tag);
        if cluster.master_of_key(&lock_key(&name)) == master {
            return name;
        }
    }
}

/// Rounds of: `holder` holds `name`, a thread of `waiter` waits for it, `holder` releases
/// `RELEASE_AFTER` later; each round's time from the release to the waiter's acquisition.
/// Rounds follow each other for `during`.
fn release_latencies(
    holder: &Client,
    waiter: &Client,
    name: &str,
    during: Duration,
) -> Vec<Duration> {
    /// The waiter is waiting by then (with nothing frozen, it subscribes within milliseconds).
    const RELEASE_AFTER: Duration = Duration::from_millis(300);
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < during {
        let lock = holder.mutex(name).unwrap();
        let g = lock.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let w = {
            let (c, name) = (waiter.clone(), name.to_owned());
            thread::spawn(move || {
                let lock = c.mutex(&name).unwrap();
                let got = lock.try_lock_for(Duration::from_secs(20)).unwrap();
                tx.send(Instant::now()).unwrap();
                got.unwrap().unlock().unwrap();
            })
        };
        thread::sleep(RELEASE_AFTER);
        let released = Instant::now();
        g.unlock().unwrap();
        let acquired = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        w.join().unwrap();
        out.push(acquired.saturating_duration_since(released));
    }
    out
}

/// The master of slot 0 and its replica are frozen (`SIGSTOP`; the cluster's node timeout is
/// raised first, so no failover starts), while a thread of the client waits on a lock there
/// (subscribed there before the freeze). For 12 s after the freeze (the frozen connection is
/// found dead after two heartbeats, then the thread tries to open a new one, again and
/// again), a release on a healthy master reaches its waiter as fast as with nothing frozen:
/// the pub/sub thread opens connections without blocking, and the map is read past the
/// frozen node. The client runs with the default timeouts.
#[test]
fn a_frozen_master_does_not_delay_wakeups_on_healthy_masters() {
    let cluster = RedisCluster::start();
    let frozen = cluster.master_of_slot(0);
    let frozen_replica = cluster.replica_of_slot(0);
    let healthy = *cluster.masters().iter().find(|&&m| m != frozen).unwrap();
    let on_frozen = name_on(&cluster, frozen, "frozen-node");
    let on_healthy = name_on(&cluster, healthy, "healthy-node");
    let holder = Client::cluster(cluster.seed_urls()).build().unwrap();
    let waiter = Client::cluster(cluster.seed_urls()).build().unwrap();

    let before = release_latencies(&holder, &waiter, &on_healthy, Duration::from_secs(1));
    eprintln!("release to wake-up, nothing frozen: {before:?}");

    // A thread of the waiting client waits on a lock of the master to freeze, subscribed
    // there.
    let frozen_lock = holder.mutex(&on_frozen).unwrap();
    let frozen_guard = frozen_lock.lock().unwrap();
    let stuck = {
        let (c, name) = (waiter.clone(), on_frozen.clone());
        thread::spawn(move || {
            let lock = c.mutex(&name).unwrap();
            let _ = lock.try_lock_for(Duration::from_secs(20));
        })
    };
    let channel = release_channel(&on_frozen);
    assert!(common::wait_until(Duration::from_secs(10), || {
        cluster.shard_numsub(frozen, &channel) >= 1
    }));
    // No failover while frozen: the masters keep their slots, as in the first seconds of an
    // outage in a deployment with a longer node timeout.
    for port in cluster.live_ports() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-node-timeout")
            .arg(600_000)
            .query(&mut cluster.conn(port))
            .unwrap();
    }
    cluster.pause(frozen);
    cluster.pause(frozen_replica);
    let during = release_latencies(&holder, &waiter, &on_healthy, Duration::from_secs(12));
    eprintln!("release to wake-up, master of slot 0 frozen: {during:?}");
    // A call on a healthy master that finds its connections lost reads the map again: past
    // the frozen master, within the per-node bound, not the call's whole bound.
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query(&mut cluster.conn(healthy))
        .unwrap_or(());
    let healthy_lock = holder.mutex(&on_healthy).unwrap();
    let t = Instant::now();
    let got = healthy_lock.try_lock();
    let call = t.elapsed();
    eprintln!("try_lock on a healthy master after its connections were lost: {call:?}");
    assert!(matches!(got, Ok(Some(_))), "{:?}", got.err());
    drop(got);
    assert!(
        call < PER_NODE + SLACK,
        "a call on a healthy master took {call:?} while another was frozen"
    );
    cluster.resume(frozen_replica);
    cluster.resume(frozen);
    drop(frozen_guard);
    stuck.join().unwrap();

    let base = before.iter().max().copied().unwrap_or_default();
    let worst = during.iter().max().copied().unwrap_or_default();
    assert!(
        worst < base + FROZEN_EXTRA,
        "with a master frozen a release took {worst:?} to reach its waiter ({base:?} without)"
    );
}
