//! `valkey://`, `valkeys://` (and `valkey+unix://`) URLs mean what `redis://`, `rediss://` (and
//! `redis+unix://`) mean, wherever a URL is taken: one server, TLS, Sentinel, RedLock and
//! Cluster. Each test locks through the Valkey spelling and checks on the server that the lock
//! is where the same URL in the Redis spelling would have put it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{RedisCluster, RedisServer, SentinelSet, ServerCert, TlsFiles, unique_name};
use locksmith::Client;

/// `url` with its `redis` scheme spelt `valkey` (`redis://` → `valkey://`, `rediss://` →
/// `valkeys://`).
fn valkey(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let scheme = scheme.replacen("redis", "valkey", 1);
    format!("{scheme}://{rest}")
}

fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    common::exists(conn, key)
}

/// One server: user, password and database of a `valkey://` URL are used as in `redis://`,
/// and a client of each spelling sees the other's lock.
#[test]
fn one_server_by_a_valkey_url() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("vk")
        .arg("on")
        .arg(">vk-pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .exec(&mut conn)
        .unwrap();
    let url = format!("valkey://vk:vk-pw@127.0.0.1:{}/3", server.port());
    let by_valkey = Client::open(url.as_str()).unwrap();
    let by_redis = Client::open(format!("redis://127.0.0.1:{}/3", server.port()).as_str()).unwrap();
    let name = unique_name("valkey-url");
    let lock = by_valkey.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    // The lock is in database 3, not 0.
    assert!(!exists(&mut conn, &common::lock_key(&name)));
    redis::cmd("SELECT").arg(3).exec(&mut conn).unwrap();
    assert!(exists(&mut conn, &common::lock_key(&name)));
    assert!(by_redis.mutex(&name).unwrap().try_lock().unwrap().is_none());
    guard.unlock().unwrap();
    assert!(by_redis.mutex(&name).unwrap().try_lock().unwrap().is_some());
    // Bad parts are named as for redis://.
    let e = Client::open("valkey://127.0.0.1:0/").unwrap_err();
    assert!(e.to_string().contains("port"), "{e}");
    let e = Client::open("valkeys://").unwrap_err();
    assert!(e.to_string().contains("host"), "{e}");
}

/// `valkeys://` is TLS, verified against the given CA, and `#insecure` skips verification
/// (with the feature `tls-insecure`; refused without it).
#[test]
fn tls_by_a_valkeys_url() {
    if common::skip_without_tls("tls_by_a_valkeys_url") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let url = valkey(&server.tls_url());
    assert!(url.starts_with("valkeys://"), "{url}");
    let c = Client::builder(&url)
        .tls_root_cert(files.ca_pem())
        .build()
        .unwrap();
    let lock = c.mutex(&unique_name("valkeys")).unwrap();
    lock.lock().unwrap().unlock().unwrap();
    // Verified: the system roots do not trust the test CA.
    let e = Client::builder(&url)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap_err();
    assert!(e.is_tls(), "{e:?}");
    let insecure = Client::builder(format!("{url}#insecure")).build();
    if cfg!(feature = "tls-insecure") {
        let lock = insecure
            .unwrap()
            .mutex(&unique_name("valkeys-insecure"))
            .unwrap();
        lock.lock().unwrap().unlock().unwrap();
    } else {
        let e = insecure.unwrap_err();
        assert!(e.to_string().contains("`tls-insecure` feature"), "{e}");
    }
}

/// Sentinel: `valkey://` sentinel URLs find the master as `redis://` ones do (and the two
/// spellings of plain text may be mixed: they are one scheme).
#[test]
fn sentinel_by_valkey_urls() {
    let set = SentinelSet::start();
    let mut urls: Vec<String> = set.sentinel_urls().iter().map(|u| valkey(u)).collect();
    urls[0] = set.sentinel_urls()[0].clone();
    let c = Client::sentinel(urls, set.master_name()).build().unwrap();
    let name = unique_name("valkey-sentinel");
    let lock = c.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    let mut conn = set.conn(set.master_port());
    assert!(exists(&mut conn, &common::lock_key(&name)));
    guard.unlock().unwrap();
    assert!(!exists(&mut conn, &common::lock_key(&name)));
}

/// RedLock: `valkey://` masters.
#[test]
fn redlock_by_valkey_urls() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| valkey(&s.url())).collect();
    let c = Client::redlock(urls).build().unwrap();
    assert_eq!(c.masters(), 3);
    let name = unique_name("valkey-redlock");
    let lock = c.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    for s in &servers {
        assert!(exists(&mut s.conn(), &common::lock_key(&name)));
    }
    guard.unlock().unwrap();
}

/// Cluster: `valkey://` seeds; the other nodes are reached with the seeds' scheme.
#[test]
fn cluster_by_valkey_urls() {
    let cluster = RedisCluster::start_with(3, 0);
    let seeds: Vec<String> = cluster.seed_urls().iter().map(|u| valkey(u)).collect();
    let c = Client::cluster(seeds[..1].to_vec()).build().unwrap();
    // Names on several masters: the others are reached through the slot map.
    let names: Vec<String> = (0..16).map(|k| unique_name(&format!("vk-{k}"))).collect();
    let masters: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| cluster.master_of_key(&common::lock_key(n)))
        .collect();
    assert!(masters.len() >= 2, "16 names all on one master");
    for n in &names {
        let lock = c.mutex(n).unwrap();
        let guard = lock.lock().unwrap();
        let port = cluster.master_of_key(&common::lock_key(n));
        assert!(exists(&mut cluster.conn(port), &common::lock_key(n)));
        guard.unlock().unwrap();
    }
}
