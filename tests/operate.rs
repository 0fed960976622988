//! What an operator sees and does: who holds each lock type, seen from another process
//! (`holder`, `writer`/`readers`, `holders`), the listing of every held lock (`Client::locks`,
//! `Client::lock_info`) on one server and on a cluster, labels, and a forced unlock through the
//! client with a waiter in another process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisCluster, TestChild, with_deadline};
use locksmith::{Client, LockKind};

/// The lease the child holds with: long enough that nothing expires during a test.
const LEASE_MS: u64 = 20_000;

/// Holds, from a thread named `billing-worker`: the mutex `LS_NAME:m` twice (re-entered), the
/// fair mutex `LS_NAME:f`, a read lock on `LS_NAME:r` and 2 of the 3 permits of `LS_NAME:s`;
/// labelled `LS_LABEL` when set. Prints `held`, then sleeps until killed.
#[test]
fn child_every_type() {
    let Some((url, name)) = common::child_url_name("every_type") else {
        return;
    };
    let cluster = std::env::var("LS_CLUSTER").is_ok();
    let mut builder = if cluster {
        Client::cluster(url.split(','))
    } else {
        Client::builder(url.as_str())
    };
    builder = builder.lease(Duration::from_millis(LEASE_MS));
    if let Ok(label) = std::env::var("LS_LABEL") {
        builder = builder.label(label);
    }
    let client = builder.build().unwrap();
    thread::Builder::new()
        .name("billing-worker".into())
        .spawn(move || {
            let m = client.mutex(&format!("{name}:m")).unwrap();
            let _m1 = m.lock().unwrap();
            let _m2 = m.lock().unwrap();
            let f = client.fair_mutex(&format!("{name}:f")).unwrap();
            let _f = f.lock().unwrap();
            let r = client.rw_lock(&format!("{name}:r")).unwrap();
            let _r = r.read().unwrap();
            let s = client.semaphore(&format!("{name}:s"), 3).unwrap();
            let _s = s.acquire_many(2).unwrap();
            println!("held");
            thread::sleep(Duration::from_secs(120));
        })
        .unwrap()
        .join()
        .unwrap();
}

/// Waits up to 30 s for the mutex `LS_NAME`, prints `got` (or `timed-out`), releases it and
/// exits.
#[test]
fn child_waiter() {
    if !common::is_child("waiter") {
        return;
    }
    let client = Client::open(common::child_env("LS_URL").as_str()).unwrap();
    let m = client.mutex(&common::child_env("LS_NAME")).unwrap();
    println!("waiting");
    let g = m.try_lock_for(Duration::from_secs(30)).unwrap();
    println!("{}", if g.is_some() { "got" } else { "timed-out" });
}

fn spawn_every_type(url: &str, name: &str, label: Option<&str>, cluster: bool) -> TestChild {
    let mut envs = vec![("LS_URL", url.to_owned()), ("LS_NAME", name.to_owned())];
    if let Some(l) = label {
        envs.push(("LS_LABEL", l.to_owned()));
    }
    if cluster {
        envs.push(("LS_CLUSTER", "1".to_owned()));
    }
    let child = TestChild::spawn("child_every_type", "every_type", &envs);
    child.wait_line("held", Duration::from_secs(30));
    child
}

/// Every type's holder, seen from another process: label, thread name, count, token and
/// times by the server's clock.
#[test]
fn holders_of_every_type_are_seen_from_another_process() {
    common::on_server(Duration::from_secs(60), move |url, _conn| {
        let name = common::unique_name("operate");
        let started = Instant::now();
        let mut child = spawn_every_type(&url, &name, Some("billing/eu-1 50%"), false);
        let ops = Client::builder(url.as_str()).label("ops").build().unwrap();
        let lease = Duration::from_millis(LEASE_MS);

        let h = ops.mutex(&format!("{name}:m")).unwrap().holder().unwrap();
        let h = h.expect("the child holds the mutex");
        println!("mutex holder: {h:?}");
        assert_eq!(h.label, "billing/eu-1 50%");
        assert_eq!(h.thread, "billing-worker");
        assert_eq!(h.hold_count, 2);
        assert!(h.fencing_token > 0);
        assert!(h.held_for <= started.elapsed() + Duration::from_secs(1));
        assert!(h.lease_left <= lease && h.lease_left > Duration::ZERO);

        let fair = ops.fair_mutex(&format!("{name}:f")).unwrap();
        let h = fair
            .holder()
            .unwrap()
            .expect("the child holds the fair mutex");
        assert_eq!(
            (h.label.as_str(), h.thread.as_str()),
            ("billing/eu-1 50%", "billing-worker")
        );
        assert_eq!(h.hold_count, 1);
        assert!(h.fencing_token > 0);
        assert_eq!(fair.waiters().unwrap(), 0);

        let rw = ops.rw_lock(&format!("{name}:r")).unwrap();
        assert!(rw.writer().unwrap().is_none());
        let readers = rw.readers().unwrap();
        assert_eq!(readers.len(), 1, "{readers:?}");
        assert_eq!(readers[0].thread, "billing-worker");

        // Any permit count: the holders do not depend on the handle's.
        let holders = ops
            .semaphore(&format!("{name}:s"), 1)
            .unwrap()
            .holders()
            .unwrap();
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].hold_count, 2);
        assert_eq!(holders[0].label, "billing/eu-1 50%");

        // Nothing held: no holder.
        assert!(
            ops.mutex(&format!("{name}:free"))
                .unwrap()
                .holder()
                .unwrap()
                .is_none()
        );
        child.kill9();
    });
}

/// `Client::locks` lists every held lock under a name prefix, each type once, with its
/// holders; `lock_info` tells everything about one name.
///
/// It reads the keys with `SCAN`, never `KEYS` (which blocks Redis for the whole keyspace).
#[test]
fn locks_lists_every_type_under_a_prefix() {
    let (server, url) = common::server_url();
    let mut stats_conn = server.conn();
    with_deadline(Duration::from_secs(60), move || {
        let name = common::unique_name("listing");
        let mut child = spawn_every_type(&url, &name, None, false);
        let ops = Client::open(url.as_str()).unwrap();
        // Something else under another name, not to be listed.
        let other = ops.mutex(&common::unique_name("elsewhere")).unwrap();
        let _g = other.lock().unwrap();

        let listed = by_name(ops.locks(&name).unwrap());
        println!("{listed:#?}");
        let mut expected: Vec<String> = ["m", "f", "r", "s"]
            .iter()
            .map(|s| format!("{name}:{s}"))
            .collect();
        expected.sort();
        assert_eq!(listed.keys().cloned().collect::<Vec<_>>(), expected);
        assert_eq!(listed[&format!("{name}:m")].kind, LockKind::Mutex);
        assert_eq!(listed[&format!("{name}:f")].kind, LockKind::FairMutex);
        assert_eq!(listed[&format!("{name}:f")].waiters, Some(0));
        let rw = &listed[&format!("{name}:r")];
        assert_eq!(rw.kind, LockKind::RwLock);
        assert!(rw.shared);
        assert_eq!(listed[&format!("{name}:s")].kind, LockKind::Semaphore);
        for info in listed.values() {
            assert_eq!(info.holders.len(), 1, "{info:?}");
            // No label given: "<hostname>:<pid>" of the child.
            assert!(
                info.holders[0]
                    .label
                    .ends_with(&format!(":{}", child.pid())),
                "{info:?}"
            );
        }
        // The default prefix "" lists ours too (and the other lock).
        let all = by_name(ops.locks("").unwrap());
        assert!(all.len() >= 5);
        assert!(all.contains_key(other.name()));

        let stats = common::commandstats(&mut stats_conn);
        assert_eq!(common::calls(&stats, "cmdstat_keys"), 0, "{stats:?}");
        assert!(common::calls(&stats, "cmdstat_scan") >= 2, "{stats:?}");

        let info = ops.lock_info(&format!("{name}:m")).unwrap();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].holders[0].hold_count, 2);
        assert!(ops.lock_info(&format!("{name}:none")).unwrap().is_empty());
        child.kill9();
    });
}

/// On a cluster, the listing reads every master.
#[test]
fn locks_reads_every_master_of_a_cluster() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seed_urls();
    with_deadline(Duration::from_secs(90), move || {
        let name = common::unique_name("cluster-listing");
        let mut child = spawn_every_type(&seeds.join(","), &name, Some("c1"), true);
        let ops = Client::cluster(seeds.iter()).build().unwrap();
        // Enough mutex names to land on every master.
        let names: Vec<String> = (0..24).map(|i| format!("{name}:n{i}")).collect();
        let handles: Vec<_> = names.iter().map(|n| ops.mutex(n).unwrap()).collect();
        let guards: Vec<_> = handles.iter().map(|m| m.lock().unwrap()).collect();
        let listed = by_name(ops.locks(&name).unwrap());
        for n in &names {
            assert_eq!(listed.get(n).map(|i| i.kind), Some(LockKind::Mutex), "{n}");
        }
        for s in ["m", "f", "r", "s"] {
            let info = &listed[&format!("{name}:{s}")];
            assert_eq!(info.holders[0].label, "c1", "{info:?}");
        }
        assert_eq!(listed.len(), names.len() + 4);
        drop(guards);
        child.kill9();
    });
}

/// `Client::force_unlock` frees a mutex held by a process that is alive and well: a waiter in
/// a third process has it within 2 s, not a lease of 20 s.
#[test]
fn force_unlock_through_the_client_wakes_a_waiter_in_another_process() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let name = common::unique_name("force");
        let mut holder = spawn_every_type(&url, &name, Some("stuck"), false);
        let mutex = format!("{name}:m");
        let mut waiter = TestChild::spawn(
            "child_waiter",
            "waiter",
            &[("LS_URL", url.clone()), ("LS_NAME", mutex.clone())],
        );
        // The waiter listens on the release channel before its first attempt.
        common::wait_numsub(&mut conn, &common::release_channel(&mutex), 1);
        let ops = Client::open(url.as_str()).unwrap();
        let t0 = Instant::now();
        assert!(ops.force_unlock(&mutex, LockKind::Mutex).unwrap());
        waiter.wait_line("got", Duration::from_secs(2));
        println!(
            "a waiter in another process had it {:?} after the forced unlock",
            t0.elapsed()
        );
        // The waiter exits, which releases it: nothing left to force.
        assert!(waiter.wait_timeout(Duration::from_secs(10)).success());
        assert!(!ops.force_unlock(&mutex, LockKind::Mutex).unwrap());
        holder.kill9();
    });
}

fn by_name(locks: locksmith::Locks) -> BTreeMap<String, locksmith::LockInfo> {
    locks
        .map(|l| {
            let l = l.unwrap();
            (l.name.clone(), l)
        })
        .collect()
}
