//! Checks of the test harness itself (`locksmith-testkit`, reached as `tests/common`), so that
//! a fault test that relies on `pause`, `restart`, `commandstats` or a channel spy fails for
//! the right reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::RedisServer;

fn ping(conn: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(conn)
}

#[test]
fn server_pause_resume_restart_stop() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert_ne!(port, 6379);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    let mut conn = server.conn();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");
    // DEBUG is enabled for local connections.
    redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(0)
        .exec(&mut conn)
        .unwrap();

    // Paused: a command times out; resumed: it is answered.
    server.pause();
    conn.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let start = Instant::now();
    let res = ping(&mut conn);
    assert!(res.is_err(), "a paused server answered");
    assert!(start.elapsed() < Duration::from_secs(2));
    server.resume();
    let mut conn = server.conn();
    assert_eq!(ping(&mut conn).unwrap(), "PONG");

    // Restart: same port, empty.
    redis::cmd("SET").arg("k").arg("v").exec(&mut conn).unwrap();
    let pid = server.pid();
    server.restart();
    assert_ne!(server.pid(), pid);
    assert_eq!(server.port(), port);
    let mut conn = server.conn();
    assert!(
        !common::exists(&mut conn, "k"),
        "restarted server is not empty"
    );

    // Commandstats count calls.
    let before = common::commandstats(&mut conn);
    for _ in 0..3 {
        ping(&mut conn).unwrap();
    }
    let after = common::commandstats(&mut conn);
    assert_eq!(
        common::calls(&after, "cmdstat_ping") - common::calls(&before, "cmdstat_ping"),
        3
    );

    // Stopped: nothing listens.
    server.stop();
    assert!(
        redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection_with_timeout(Duration::from_millis(300))
            .is_err()
    );
}

#[test]
fn unique_names_and_keys() {
    let names: HashSet<String> = (0..1000).map(|_| common::unique_name("n")).collect();
    assert_eq!(names.len(), 1000);
    assert_eq!(
        common::lock_key("account:42"),
        "locksmith:{account:42}:lock"
    );
    assert_eq!(common::lock_key("a{b}%"), "locksmith:{a%7Bb%7D%25}:lock");
    assert_eq!(common::fence_key("x"), "locksmith:{#2329}:fence");
    assert_eq!(common::release_channel("x"), "locksmith:{x}:released");
    assert!(common::thread_count() >= 1);
}

#[test]
#[should_panic(expected = "did not finish within")]
fn with_deadline_fails_a_hang() {
    common::with_deadline(Duration::from_millis(100), || {
        std::thread::sleep(Duration::from_secs(2));
    });
}

/// The channel spy's `sync` counts every message published before it, and no marker.
#[test]
fn channel_spy_sync_counts_what_came_before() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let spy = common::ChannelSpy::start(&server.url(), "spy-test");
    assert_eq!(spy.sync(&mut conn), 0);
    for _ in 0..3 {
        redis::cmd("PUBLISH")
            .arg("spy-test")
            .arg("m")
            .exec(&mut conn)
            .unwrap();
    }
    // No wait between the publishes and the sync: the marker is delivered after them.
    assert_eq!(spy.sync(&mut conn), 3);
    assert_eq!(spy.sync(&mut conn), 3);
    assert_eq!(spy.count(), 3);
}
