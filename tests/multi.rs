//! `MultiMutex`: several locks at once, all or nothing, without deadlock; on one server and on
//! a Redis Cluster with the names on different masters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex as StdMutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer, Rng, lock_key, with_deadline};
use locksmith::{Client, Error};

/// The accounts of the transfer tests, and the money each starts with.
const ACCOUNTS: usize = 5;
const START: i64 = 1_000;
/// The bound each transfer waits at most for its pair: far above any wait the test expects.
const TRANSFER_BOUND: Duration = Duration::from_secs(20);

/// The names of a set, the order they are taken in, duplicates, and bad input.
#[test]
fn a_set_collapses_duplicates_and_refuses_bad_names() {
    let server = RedisServer::start();
    let client = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("multi-names");
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));
    let set = client.multi_lock([&b, &a, &b]).unwrap();
    // One global order (by cluster slot, then name), whatever order the names came in.
    let names: Vec<&str> = set.names().collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&a.as_str()) && names.contains(&b.as_str()));
    let other = client.multi_lock([&a, &b]).unwrap();
    assert_eq!(other.names().collect::<Vec<_>>(), names);
    let empty: [&str; 0] = [];
    assert!(matches!(
        client.multi_lock(empty).unwrap_err(),
        Error::InvalidName { .. }
    ));
    assert!(matches!(
        client.multi_lock([a.as_str(), ""]).unwrap_err(),
        Error::InvalidName { .. }
    ));
    let guard = set.lock().unwrap();
    assert_eq!(guard.names().count(), 2);
    assert!(guard.fencing_token(&a).is_some());
    assert!(guard.fencing_token("not in the set").is_none());
    assert!(guard.is_held());
    guard.check().unwrap();
    assert!(guard.validity() > Duration::ZERO);
    guard.unlock().unwrap();
    let mut conn = server.conn();
    assert!(!common::exists(&mut conn, &lock_key(&a)));
    assert!(!common::exists(&mut conn, &lock_key(&b)));
}

/// A set locks the same keys as `Mutex`: each excludes the other, tokens come from the same
/// counter and rise per name, and a thread that holds one name re-enters it as part of a set.
#[test]
fn a_set_and_a_mutex_on_one_of_its_names_exclude_each_other() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let [c1, c2] = common::clients(&url);
        let name = common::unique_name("multi-excl");
        let (a, b) = (format!("{name}-a"), format!("{name}-b"));
        let m = c1.mutex(&a).unwrap().lock().unwrap();
        let t0 = m.fencing_token();
        let set2 = c2.multi_lock([&a, &b]).unwrap();
        assert!(set2.try_lock().unwrap().is_none(), "a set took a held name");
        // The same thread re-enters its Mutex as part of a set: the same token.
        let set1 = c1.multi_lock([&b, &a]).unwrap();
        let g1 = set1.try_lock().unwrap().expect("re-entry as part of a set");
        assert_eq!(g1.fencing_token(&a), Some(t0));
        drop(m);
        // Still held through the set: the Mutex was an outer level, the set an inner one
        // on `a` (released without freeing), so `a` is the set's.
        assert!(c2.mutex(&a).unwrap().try_lock().unwrap().is_none());
        assert!(c2.mutex(&b).unwrap().try_lock().unwrap().is_none());
        g1.unlock().unwrap();
        let g2 = set2.try_lock().unwrap().expect("free set");
        assert!(g2.fencing_token(&a).unwrap() > t0, "tokens rise per name");
        let mb = c1.mutex(&b).unwrap();
        assert!(
            mb.try_lock().unwrap().is_none(),
            "a Mutex took a name of a set"
        );
        drop(g2);
        let t = mb
            .try_lock()
            .unwrap()
            .expect("free after the set")
            .fencing_token();
        assert!(t > 0);
    });
}

/// All or nothing: while another client holds one name, `try_lock` on a set with it holds
/// none of the others (checked on the server), and a waiter is woken by that name's release,
/// long before the holder's lease could have run out.
#[test]
fn a_set_is_all_or_nothing_and_its_waiter_wakes_on_the_release() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let holder = Client::builder(url.as_str())
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        let waiter = Client::builder(url.as_str())
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        let name = common::unique_name("multi-aon");
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|s| format!("{name}-{s}"))
            .collect();
        let held = holder.mutex(&names[1]).unwrap().lock().unwrap();
        let set = waiter
            .multi_lock([&names[2], &names[0], &names[1]])
            .unwrap();
        for _ in 0..3 {
            assert!(set.try_lock().unwrap().is_none());
            assert!(!common::exists(&mut conn, &lock_key(&names[0])));
            assert!(!common::exists(&mut conn, &lock_key(&names[2])));
        }
        // A bounded wait that ends without the set holds none of it either.
        common::assert_waits_in_vain(Duration::from_millis(300), |d| set.try_lock_for(d));
        assert!(!common::exists(&mut conn, &lock_key(&names[0])));
        assert!(!common::exists(&mut conn, &lock_key(&names[2])));

        let (tx, rx) = mpsc::channel();
        let waiting = thread::spawn(move || {
            let g = set.try_lock_for(Duration::from_secs(20)).unwrap();
            tx.send(Instant::now()).unwrap();
            g.expect("the set after the release").unlock().unwrap();
        });
        // The waiter is asleep on the release channel of the name that blocked it.
        common::wait_until(Duration::from_secs(10), || {
            let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(common::release_channel(&names[1]))
                .query(&mut conn)
                .unwrap();
            n.first().is_some_and(|(_, k)| *k >= 1)
        });
        thread::sleep(Duration::from_millis(200));
        assert!(rx.try_recv().is_err(), "the waiter got a held name");
        let released = Instant::now();
        held.unlock().unwrap();
        let got = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let woke = got.duration_since(released);
        assert!(
            woke < Duration::from_secs(2),
            "woken {woke:?} after the release: not by it (the lease is 30 s)"
        );
        waiting.join().unwrap();
    });
}

/// A guard with one lost name is not held, and the loss is reported with that name.
#[test]
fn a_set_with_one_lost_name_is_not_held() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let lost = Arc::new(StdMutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&lost);
        let client = Client::builder(url.as_str())
            .lease(Duration::from_millis(600))
            .on_lease_lost(move |l| seen.lock().unwrap().push(l.name.clone()))
            .build()
            .unwrap();
        let name = common::unique_name("multi-lost");
        let (a, b) = (format!("{name}-a"), format!("{name}-b"));
        let g = client.multi_lock([&a, &b]).unwrap().lock().unwrap();
        // Renewal keeps both past several leases.
        thread::sleep(Duration::from_millis(1500));
        assert!(g.is_held(), "renewal did not keep the set");
        let _: () = redis::cmd("DEL")
            .arg(lock_key(&b))
            .query(&mut conn)
            .unwrap();
        common::wait_until(Duration::from_secs(5), || !g.is_held());
        assert!(matches!(g.check(), Err(Error::LeaseLost)));
        assert_eq!(g.validity(), Duration::ZERO);
        common::wait_until(Duration::from_secs(5), || !lost.lock().unwrap().is_empty());
        assert_eq!(*lost.lock().unwrap(), std::slice::from_ref(&b));
        // `a` is still held on the server until the guard goes.
        assert!(common::exists(&mut conn, &lock_key(&a)));
        drop(g);
        assert!(!common::exists(&mut conn, &lock_key(&a)));
    });
}

/// A quorum client refuses a set, as its docs say.
#[test]
fn a_quorum_client_refuses_a_set() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let client = Client::redlock(urls).build().unwrap();
    let set = client.multi_lock(["x", "y"]).unwrap();
    assert!(matches!(
        set.try_lock().unwrap_err(),
        Error::Unsupported { .. }
    ));
}

/// The transfers of one process: `threads` threads, each moving money between random pairs of
/// the accounts, naming the pair in random order, until `run` is over. Each transfer checks on
/// the server that nobody else is inside either account (an `INCR` that must answer 1), moves
/// the money with a read-modify-write, and counts itself. Returns the longest call. The data
/// lives on `data_url` (on a cluster, the master of the tag `{prefix}`).
fn transfers(
    urls: &[String],
    cluster: bool,
    prefix: &str,
    data_url: &str,
    threads: usize,
    run: Duration,
) -> Duration {
    let client = if cluster {
        Client::cluster(urls).build().unwrap()
    } else {
        Client::open(urls[0].as_str()).unwrap()
    };
    let end = Instant::now() + run;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let client = client.clone();
            let prefix = prefix.to_owned();
            let data_url = data_url.to_owned();
            thread::spawn(move || {
                let mut rng = Rng::new(common::mono_ns() ^ ((t as u64) << 32));
                let mut data = Data::open(&data_url);
                let mut longest = Duration::ZERO;
                while Instant::now() < end {
                    let from = rng.range(0, ACCOUNTS as u64) as usize;
                    let mut to = rng.range(0, ACCOUNTS as u64 - 1) as usize;
                    if to >= from {
                        to += 1;
                    }
                    let (x, y) = (account(&prefix, from), account(&prefix, to));
                    let started = Instant::now();
                    let guard = client
                        .multi_lock([&x, &y])
                        .unwrap()
                        .try_lock_for(TRANSFER_BOUND)
                        .unwrap();
                    longest = longest.max(started.elapsed());
                    let guard = guard.expect("a transfer waited past its bound");
                    for a in [from, to] {
                        let inside = data.incr(&data_key(&prefix, a, "inside"), 1);
                        assert_eq!(inside, 1, "two transfers inside account {a}");
                    }
                    let amount = rng.range(1, 50) as i64;
                    let fb = data.get(&data_key(&prefix, from, "balance"));
                    let tb = data.get(&data_key(&prefix, to, "balance"));
                    data.set(&data_key(&prefix, from, "balance"), fb - amount);
                    data.set(&data_key(&prefix, to, "balance"), tb + amount);
                    for a in [from, to] {
                        data.incr(&data_key(&prefix, a, "inside"), -1);
                    }
                    data.incr(&format!("{{{prefix}}}:transfers"), 1);
                    guard.unlock().unwrap();
                }
                longest
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap_or_default()
}

/// Account `i`'s lock name under `prefix`.
fn account(prefix: &str, i: usize) -> String {
    format!("{prefix}:acct{i}")
}

/// A data key of account `i`, all under the one hash tag `{prefix}`.
fn data_key(prefix: &str, i: usize, what: &str) -> String {
    format!("{{{prefix}}}:acct{i}:{what}")
}

/// The test's own data, on one server.
struct Data(redis::Connection);

impl Data {
    fn open(url: &str) -> Data {
        Data(redis::Client::open(url).unwrap().get_connection().unwrap())
    }

    fn incr(&mut self, key: &str, by: i64) -> i64 {
        redis::cmd("INCRBY")
            .arg(key)
            .arg(by)
            .query(&mut self.0)
            .unwrap()
    }

    fn get(&mut self, key: &str) -> i64 {
        let v: Option<i64> = redis::cmd("GET").arg(key).query(&mut self.0).unwrap();
        v.unwrap_or(0)
    }

    fn set(&mut self, key: &str, v: i64) {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(v)
            .query(&mut self.0)
            .unwrap();
    }
}

/// Entry point of the child processes of the deadlock-freedom tests.
#[test]
fn child_transfers() {
    if !common::is_child("transfers") {
        return;
    }
    let urls = common::child_list("LS_URLS", ' ');
    let cluster = common::child_env("LS_CLUSTER") == "1";
    let prefix = common::child_env("LS_PREFIX");
    let data_url = common::child_env("LS_DATA");
    let run = common::child_ms("LS_RUN_MS");
    let longest = transfers(&urls, cluster, &prefix, &data_url, 4, run);
    let mut data = Data::open(&data_url);
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{{{prefix}}}:longest"))
        .arg(u64::try_from(longest.as_millis()).unwrap())
        .query(&mut data.0)
        .unwrap();
}

/// 3 processes x 4 threads transfer between random pairs of 5 accounts for 10 s, naming each
/// pair in random order: every transfer completes within its bound, nobody is ever inside an
/// account with another (a server-side counter), and the money is conserved.
fn deadlock_freedom(urls: Vec<String>, cluster: bool, prefix: &str, data_url: &str) {
    const RUN: Duration = Duration::from_secs(10);
    let mut data = Data::open(data_url);
    for i in 0..ACCOUNTS {
        data.set(&data_key(prefix, i, "balance"), START);
    }
    let envs = [
        ("LS_URLS", urls.join(" ")),
        ("LS_CLUSTER", if cluster { "1" } else { "0" }.to_owned()),
        ("LS_PREFIX", prefix.to_owned()),
        ("LS_DATA", data_url.to_owned()),
        ("LS_RUN_MS", RUN.as_millis().to_string()),
    ];
    common::run_children(
        3,
        "child_transfers",
        "transfers",
        &envs,
        RUN + TRANSFER_BOUND + Duration::from_secs(60),
    );
    let longest: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("{{{prefix}}}:longest"))
        .arg(0)
        .arg(-1)
        .query(&mut data.0)
        .unwrap();
    assert_eq!(longest.len(), 3, "a process did not finish its transfers");
    let longest = Duration::from_millis(longest.into_iter().max().unwrap_or(0));
    let total: i64 = (0..ACCOUNTS)
        .map(|i| data.get(&data_key(prefix, i, "balance")))
        .sum();
    assert_eq!(total, START * ACCOUNTS as i64, "money was created or lost");
    let done = data.get(&format!("{{{prefix}}}:transfers"));
    println!("{done} transfers in {RUN:?} by 3 x 4 threads; the longest wait {longest:?}");
    assert!(done > 100, "only {done} transfers");
    assert!(longest < TRANSFER_BOUND, "a call took {longest:?}");
    for i in 0..ACCOUNTS {
        assert_eq!(data.get(&data_key(prefix, i, "inside")), 0);
    }
}

#[test]
fn transfers_between_random_pairs_never_deadlock() {
    let server = RedisServer::start();
    let prefix = common::unique_name("multi-dl");
    deadlock_freedom(vec![server.url()], false, &prefix, &server.url());
    let mut conn = server.conn();
    for i in 0..ACCOUNTS {
        assert!(!common::exists(&mut conn, &lock_key(&account(&prefix, i))));
    }
}

#[test]
fn transfers_across_cluster_masters_never_deadlock() {
    let cluster = RedisCluster::start();
    let prefix = common::unique_name("multi-dlc");
    let masters: std::collections::HashSet<u16> = (0..ACCOUNTS)
        .map(|i| cluster.master_of_key(&lock_key(&account(&prefix, i))))
        .collect();
    assert!(masters.len() >= 2, "the accounts all live on one master");
    let data_url = cluster.url(cluster.master_of_key(&format!("{{{prefix}}}:x")));
    deadlock_freedom(cluster.seed_urls(), true, &prefix, &data_url);
}

/// A thread that holds a set re-enters it at once, even while threads of its own client queue
/// for its names (waiting behind them, for its own locks, would never end).
#[test]
fn a_holder_re_enters_its_set_past_its_own_queue() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let client = Client::open(url.as_str()).unwrap();
        let name = common::unique_name("multi-reenter");
        let (a, b) = (format!("{name}-a"), format!("{name}-b"));
        let set = client.multi_lock([&a, &b]).unwrap();
        let outer = set.lock().unwrap();
        // Another thread of the same client queues for `a`.
        let waiter = {
            let m = client.mutex(&a).unwrap();
            thread::spawn(move || m.try_lock_for(Duration::from_secs(30)).unwrap().is_some())
        };
        common::wait_until(Duration::from_secs(10), || {
            let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(common::release_channel(&a))
                .query(&mut conn)
                .unwrap();
            n.first().is_some_and(|(_, k)| *k >= 1)
        });
        let t = Instant::now();
        let inner = set
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("re-entry of a held set");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(inner.fencing_token(&a), outer.fencing_token(&a));
        drop(inner);
        drop(outer);
        assert!(
            waiter.join().unwrap(),
            "the waiter did not get `a` after the set"
        );
    });
}

/// Through Sentinel, a set is taken by one script on the master the sentinels name: it
/// excludes a `Mutex` on one of its names, and leaves nothing behind.
#[test]
fn a_set_through_sentinel() {
    let set = common::SentinelSet::start();
    let urls = set.sentinel_urls();
    let master = set.master_name().to_owned();
    let mut conn = set.conn(set.master_port());
    with_deadline(Duration::from_secs(60), move || {
        let c1 = Client::sentinel(urls.clone(), &master).build().unwrap();
        let c2 = Client::sentinel(urls, &master).build().unwrap();
        let name = common::unique_name("multi-sentinel");
        let (a, b) = (format!("{name}-a"), format!("{name}-b"));
        let g = c1.multi_lock([&b, &a]).unwrap().lock().unwrap();
        assert!(common::exists(&mut conn, &lock_key(&a)));
        assert!(common::exists(&mut conn, &lock_key(&b)));
        assert!(c2.mutex(&a).unwrap().try_lock().unwrap().is_none());
        let m = c2.mutex(&b).unwrap();
        let waiter = thread::spawn(move || {
            m.try_lock_for(Duration::from_secs(20))
                .unwrap()
                .map(|g| g.fencing_token())
        });
        let tb = g.fencing_token(&b).unwrap();
        g.unlock().unwrap();
        assert!(waiter.join().unwrap().expect("b after the set") > tb);
        assert!(!common::exists(&mut conn, &lock_key(&a)));
    });
}

/// On a cluster, a set across slots that cannot have a later slot gives back the earlier ones
/// before it returns: nothing of it is left held.
#[test]
fn a_cluster_set_gives_back_what_it_took() {
    let cluster = RedisCluster::start();
    let name = common::unique_name("multi-cl");
    // Names on different masters, ordered by slot as the set takes them.
    let mut names: Vec<String> = (0..20).map(|i| format!("{name}-{i}")).collect();
    names.sort_by_key(|n| cluster.slot_of(&lock_key(n)));
    let first = names[0].clone();
    let last = names
        .iter()
        .rev()
        .find(|n| cluster.master_of_key(&lock_key(n)) != cluster.master_of_key(&lock_key(&first)))
        .expect("names on two masters")
        .clone();
    let mut conn = cluster.conn(cluster.master_of_key(&lock_key(&first)));
    let seeds = cluster.seed_urls();
    with_deadline(Duration::from_secs(60), move || {
        let c1 = Client::cluster(seeds.clone()).build().unwrap();
        let c2 = Client::cluster(seeds).build().unwrap();
        let held = c2.mutex(&last).unwrap().lock().unwrap();
        let set = c1.multi_lock([&last, &first]).unwrap();
        assert_eq!(
            set.names().collect::<Vec<_>>(),
            [first.as_str(), last.as_str()]
        );
        assert!(set.try_lock().unwrap().is_none());
        assert!(!common::exists(&mut conn, &lock_key(&first)));
        assert!(
            set.try_lock_for(Duration::from_millis(300))
                .unwrap()
                .is_none()
        );
        assert!(!common::exists(&mut conn, &lock_key(&first)));
        drop(held);
        let g = set
            .try_lock_for(Duration::from_secs(10))
            .unwrap()
            .expect("the set");
        assert!(common::exists(&mut conn, &lock_key(&first)));
        g.unlock().unwrap();
        assert!(!common::exists(&mut conn, &lock_key(&first)));
    });
}

/// `MultiMutex::with_lock`: the closure's value comes back, every name is held while it runs
/// (another client can take none of them) and free after; one name's key deleted during the
/// closure makes it return the release's error, as `unlock` would.
#[test]
fn with_lock_holds_the_set_around_the_closure() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("multi-with-lock");
    let (a, b) = (format!("{name}-a"), format!("{name}-b"));
    let [ours, theirs] = common::clients::<2>(&url);
    let set = ours.multi_lock([&a, &b]).unwrap();
    let tokens = set
        .with_lock(|guard| {
            assert!(guard.is_held());
            for n in [&a, &b] {
                assert!(
                    theirs.mutex(n).unwrap().try_lock().unwrap().is_none(),
                    "{n}"
                );
            }
            (guard.fencing_token(&a), guard.fencing_token(&b))
        })
        .unwrap();
    assert!(tokens.0.is_some() && tokens.1.is_some());
    for n in [&a, &b] {
        assert!(
            !theirs.mutex(n).unwrap().is_locked().unwrap(),
            "{n} still held"
        );
    }

    let e = set
        .with_lock(|_| {
            let _: () = redis::cmd("DEL")
                .arg(lock_key(&b))
                .query(&mut conn)
                .unwrap();
        })
        .expect_err("a name's lease was lost inside the closure");
    assert!(e.is_lease_lost(), "{e:?}");
    assert!(!theirs.mutex(&a).unwrap().is_locked().unwrap(), "{a} kept");
}

/// The lease of a fixed-lease test: short, so that the tests see it end.
const FIXED: Duration = Duration::from_millis(300);

/// `with_lease`: the names a set acquires end by themselves after the fixed lease, unrenewed
/// (the client's lease is 30 s), while a name the thread held already through a renewed
/// `Mutex` keeps that acquisition's terms (renewed, held on). A lease out of bounds is
/// `InvalidConfig`.
#[test]
fn fixed_lease_ends_by_itself() {
    common::on_server(Duration::from_secs(60), |url, mut conn| {
        let [a, b] = common::clients::<2>(&url);
        let (x, y) = (
            common::unique_name("multi-fixed-x"),
            common::unique_name("multi-fixed-y"),
        );
        let set = a.multi_lock([&x, &y]).unwrap();
        for lease in [
            Duration::ZERO,
            Duration::from_millis(29),
            Duration::from_secs(366 * 24 * 3600),
        ] {
            let err = set
                .with_lease(lease)
                .expect_err("a bad fixed lease accepted");
            assert!(err.is_invalid_config(), "with_lease({lease:?}): {err}");
        }
        let fixed = set.with_lease(FIXED).unwrap();

        // The whole set, new.
        let start = Instant::now();
        let g = fixed.lock().unwrap();
        assert!(common::pttl(&mut conn, &lock_key(&x)) <= 300);
        let theirs = b.multi_lock([&y, &x]).unwrap();
        assert!(theirs.try_lock().unwrap().is_none());
        let taken = theirs
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(!g.is_held());
        assert!(g.unlock().is_err());
        taken.unlock().unwrap();

        // `x` held already through a renewed Mutex: re-entered, it keeps its terms.
        let held = a.mutex(&x).unwrap().lock().unwrap();
        let start = Instant::now();
        let g = fixed.lock().unwrap();
        let y_taken = b
            .mutex(&y)
            .unwrap()
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed lease never ended");
        // One fixed lease later, `x` is still held: its renewed acquisition goes on.
        assert!(start.elapsed() + Duration::from_millis(20) >= FIXED);
        assert!(held.is_held(), "the renewed acquisition of x ended");
        assert!(b.mutex(&x).unwrap().try_lock().unwrap().is_none());
        assert!(!g.is_held());
        drop(g);
        held.unlock().unwrap();
        y_taken.unlock().unwrap();
    });
}

/// `Client::shutdown` releases the names of a fixed-lease set too: another client takes them
/// at once, long before the 30 s fixed lease would end.
#[test]
fn fixed_lease_released_at_shutdown() {
    common::on_server(Duration::from_secs(30), |url, _conn| {
        let [a, b] = common::clients::<2>(&url);
        let names = [
            common::unique_name("multi-fixed-shutdown-1"),
            common::unique_name("multi-fixed-shutdown-2"),
        ];
        let g = a
            .multi_lock(&names)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap()
            .lock()
            .unwrap();
        let theirs = b.multi_lock(&names).unwrap();
        assert!(theirs.try_lock().unwrap().is_none());
        a.shutdown(Duration::from_secs(5)).unwrap();
        let taken = theirs
            .try_lock()
            .unwrap()
            .expect("still held after the shutdown");
        assert!(matches!(g.unlock(), Err(Error::Shutdown)));
        taken.unlock().unwrap();
    });
}
