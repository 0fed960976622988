//! The `serde` feature: what a real server's listing and a client's stats say survives a round
//! trip through JSON unchanged, and reads as documented (a lock type by its name, a histogram
//! refused with another number of buckets).
//!
//! `cargo test --features serde --test serde`.

#![cfg(feature = "serde")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use locksmith::{Client, Histogram, LockInfo, LockKind, Stats};

#[test]
fn lock_info_and_stats_round_trip_through_json() {
    let (_server, url) = common::server_url();
    let client = Client::builder(url.as_str())
        .label("serde-test")
        .build()
        .unwrap();
    let name = common::unique_name("serde");
    let lock = client.mutex(&name).unwrap();
    let _outer = lock.lock().unwrap();
    let _inner = lock.lock().unwrap();
    let sem = client.semaphore(&name, 3).unwrap();
    let _permits = sem.acquire_many(2).unwrap();

    let infos = client.lock_info(&name).unwrap();
    assert_eq!(infos.len(), 2, "{infos:?}");
    for info in &infos {
        let text = serde_json::to_string(info).unwrap();
        let back: LockInfo = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, info, "{text}");
    }
    let mutex = infos.iter().find(|i| i.kind == LockKind::Mutex).unwrap();
    let v = serde_json::to_value(mutex).unwrap();
    assert_eq!(v["name"], name.as_str());
    assert_eq!(v["kind"], "mutex");
    assert_eq!(v["holders"][0]["label"], "serde-test");
    assert_eq!(v["holders"][0]["hold_count"], 2);
    assert!(v["holders"][0]["lease_left"]["secs"].is_u64(), "{v}");
    assert!(v["waiters"].is_null() && v["value"].is_null(), "{v}");
    for kind in [LockKind::FairMutex, LockKind::Election] {
        let text = serde_json::to_string(&kind).unwrap();
        assert_eq!(text, format!("\"{}\"", kind.as_str()));
        assert_eq!(serde_json::from_str::<LockKind>(&text).unwrap(), kind);
    }
    assert!(serde_json::from_str::<LockKind>("\"spinlock\"").is_err());

    let stats = client.stats();
    assert!(stats.acquired >= 3 && stats.wait.count() >= 3, "{stats:?}");
    let text = serde_json::to_string(&stats).unwrap();
    let back: Stats = serde_json::from_str(&text).unwrap();
    assert_eq!(back, stats);
    assert_eq!(back.wait.p99(), stats.wait.p99());
    assert!(back.hold.max() <= Duration::from_secs(60));

    // A histogram with another number of buckets is refused, not misread.
    let mut v = serde_json::to_value(&stats.wait).unwrap();
    v["counts"].as_array_mut().unwrap().pop();
    let e = serde_json::from_value::<Histogram>(v).unwrap_err();
    assert!(e.to_string().contains("bucket counts"), "{e}");
}
