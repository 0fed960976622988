//! `locksmith --cluster` against a real Redis Cluster (3 masters, started on free ports), with
//! locks on every master held by named threads of this process through the library. One
//! test, one cluster: starting one costs seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use locksmith::Client;

const LEASE: Duration = Duration::from_secs(30);
/// Far below the lease: a waiter woken within it was woken by the release.
const WAKE_BOUND: Duration = Duration::from_secs(5);

fn client(cluster: &RedisCluster) -> Client {
    Client::cluster(cluster.seed_urls())
        .label(LABEL)
        .lease(LEASE)
        .build()
        .unwrap()
}

/// One name per master, all starting with `prefix`.
fn names_on_every_master(cluster: &RedisCluster, prefix: &str) -> Vec<String> {
    let masters = cluster.masters();
    let mut names: Vec<Option<String>> = vec![None; masters.len()];
    let mut i = 0;
    while names.iter().any(Option::is_none) {
        let name = format!("{prefix}:{i}");
        let m = cluster.master_of_key(&lock_key(&name));
        let k = masters.iter().position(|p| *p == m).unwrap();
        names[k].get_or_insert(name);
        i += 1;
    }
    names.into_iter().map(Option::unwrap).collect()
}

#[test]
fn list_show_unlock_and_watch_on_a_cluster() {
    let cluster = RedisCluster::start_with(3, 0);
    let seeds = cluster.seed_urls().join(",");
    let c = client(&cluster);
    let waiter_client = client(&cluster);
    let p = unique_name("cl");
    let names = names_on_every_master(&cluster, &p);
    assert_eq!(names.len(), 3);

    let mut held = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let m = c.mutex(name).unwrap();
        held.push(hold(&format!("node-worker-{i}"), move || {
            let g = m.lock().unwrap();
            let t = g.fencing_token();
            (g, t)
        }));
    }
    let sem_name = format!("{p}:sem");
    let sem = c.semaphore(&sem_name, 4).unwrap();
    let held_sem = hold("sem-worker", move || (sem.acquire_many(3).unwrap(), 0));
    let rw_name = format!("{p}:rw");
    let rw = c.rw_lock(&rw_name).unwrap();
    let held_rw = hold("writer", move || {
        let g = rw.write().unwrap();
        let t = g.fencing_token();
        (g, t)
    });

    // list: every master's locks, as a table and as JSON.
    let r = run_expect(&["--cluster", &seeds, "list", &p], 0);
    assert_eq!(r.stdout.lines().count(), 1 + 5, "{}", r.stdout);
    for (i, name) in names.iter().enumerate() {
        let row = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{}", r.stdout));
        assert!(row.contains(&format!("node-worker-{i}")), "{row}");
        assert!(row.contains(&held[i].token.to_string()), "{row}");
    }
    assert!(r.stdout.contains("rw_lock (write)"), "{}", r.stdout);
    let r = run_expect(&["--cluster", &seeds, "list", &p, "--json"], 0);
    let json = json_lines(&r.stdout);
    assert_eq!(json.len(), 5, "{}", r.stdout);
    for (i, name) in names.iter().enumerate() {
        let j = json_of(&json, name, "mutex");
        assert_eq!(j["label"], LABEL);
        assert_eq!(j["thread"], format!("node-worker-{i}"));
        assert_eq!(j["fencing_token"], held[i].token);
    }
    let js = json_of(&json, &sem_name, "semaphore");
    assert_eq!(js["hold_count"], 3);
    assert_eq!(js["thread"], "sem-worker");
    let jr = json_of(&json, &rw_name, "rw_lock");
    assert_eq!(jr["shared"], false);
    assert_eq!(jr["thread"], "writer");
    assert_eq!(jr["fencing_token"], held_rw.token);

    // show.
    let r = run_expect(&["--cluster", &seeds, "show", &sem_name], 0);
    assert!(
        r.stdout.contains("3 permits held by 1 holder"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!("{LABEL} (thread sem-worker)")),
        "{}",
        r.stdout
    );

    // unlock: refused without a terminal, then done with --yes, and the waiter woken.
    let target = names[1].clone();
    run_expect(&["--cluster", &seeds, "unlock", &target], 4);
    let w = waiter_client.mutex(&target).unwrap();
    let (got_tx, got_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = w.try_lock_for(RUN_BOUND).unwrap();
        got_tx
            .send((Instant::now(), g.as_ref().map(|g| g.fencing_token())))
            .unwrap();
    });
    let master = cluster.master_of_key(&lock_key(&target));
    let channel = release_channel(&target);
    assert!(
        wait_until(RUN_BOUND, || cluster.shard_numsub(master, &channel) >= 1),
        "the waiter never subscribed"
    );
    let r = run_expect(&["--cluster", &seeds, "unlock", &target, "--yes"], 0);
    let unlocked = Instant::now();
    assert!(r.stdout.contains("node-worker-1"), "{r:?}");
    let (at, token) = got_rx.recv_timeout(RUN_BOUND).unwrap();
    assert!(token.expect("the waiter got the lock") > held[1].token);
    assert!(
        at.saturating_duration_since(unlocked) < WAKE_BOUND,
        "woken {:?} after the unlock",
        at.saturating_duration_since(unlocked)
    );
    waiter.join().unwrap();

    // watch: the once-a-second re-read alone.
    let r = run_expect(&["--cluster", &seeds, "watch", &p, "--once"], 0);
    assert!(
        r.stdout.contains("cluster: re-read once a second"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&names[0]) && r.stdout.contains(&sem_name),
        "{}",
        r.stdout
    );
    let mut watch = Watching::start(command(&[
        "--cluster",
        &seeds,
        "watch",
        &p,
        "--count",
        "1000",
    ]));
    watch.until(RUN_BOUND, "with the semaphore", |l| {
        l.starts_with(&sem_name)
    });
    held_sem.release();
    watch.until(RUN_BOUND, "with the release", |l| {
        l.contains(&format!(
            "released  semaphore \"{sem_name}\" by {LABEL} (thread sem-worker)"
        ))
    });
    drop(watch);

    drop((held, held_rw));
    run_expect(&["--cluster", &seeds, "list", &p], 3);
}
