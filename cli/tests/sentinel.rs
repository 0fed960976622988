//! `locksmith --sentinel ... --master NAME` against a real Sentinel deployment (a master, two
//! replicas, three sentinels): the listing, and `watch`, whose listener finds the master
//! through the sentinels to hear the release channels.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use locksmith::Client;

#[test]
fn list_and_watch_through_sentinel() {
    let set = SentinelSet::start();
    let sentinels = set.sentinel_urls().join(",");
    let c = Client::sentinel(set.sentinel_urls(), set.master_name())
        .label(LABEL)
        .build()
        .unwrap();
    let p = unique_name("sentinel-cli");
    let name = format!("{p}:sem");
    let sem = c.semaphore(&name, 1).unwrap();
    let held = hold("sentinel-worker", move || (sem.acquire().unwrap(), 0));

    let args = |extra: &[&str]| {
        let mut a = vec!["--sentinel", &sentinels, "--master", set.master_name()];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let list_args = args(&["list", &p, "--json"]);
    let list_args: Vec<&str> = list_args.iter().map(String::as_str).collect();
    let r = run_expect(&list_args, 0);
    let json = json_lines(&r.stdout);
    let j = json_of(&json, &name, "semaphore");
    assert_eq!(j["thread"], "sentinel-worker");
    assert_eq!(j["label"], LABEL);

    let watch_args = args(&["watch", &p, "--count", "1000"]);
    let watch_args: Vec<&str> = watch_args.iter().map(String::as_str).collect();
    let mut watch = Watching::start(command(&watch_args));
    let header = watch.until(RUN_BOUND, "the header", |l| {
        l.starts_with("locksmith watch")
    });
    assert!(
        header.contains("releases heard on the release channels"),
        "the listener found the master: {header}"
    );
    watch.until(RUN_BOUND, "with the permit holder", |l| {
        l.starts_with(&name) && l.contains("sentinel-worker")
    });
    // A release publishes when someone waits for it.
    let (waiter, got) = permit_waiter(&c, &name);
    wait_flagged(&mut set.conn(set.master_port()), &name);
    held.release();
    watch.until(RUN_BOUND, "with the published release", |l| {
        l.contains(&format!("published semaphore \"{name}\" permit released"))
    });
    assert!(
        got.recv_timeout(RUN_BOUND).unwrap(),
        "the waiter got the permit"
    );
    waiter.join().unwrap();
}
