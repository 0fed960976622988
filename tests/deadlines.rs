//! Time bounds: every blocking call returns within its documented bound under three faults,
//! each against its own `redis-server`:
//!
//! - **stalled**: the server is frozen with `SIGSTOP` (the kernel still accepts connections
//!   and buffers commands; nothing answers);
//! - **black hole**: a TCP proxy that stops forwarding, and accepts new connections without
//!   ever answering;
//! - **closed port**: the proxy is gone; open connections are reset, new ones refused.
//!
//! The server asks for a password and the client uses database 1, so every new connection
//! has a handshake (`AUTH`, `SELECT`) that can stall too. And the connections the client
//! keeps must not make one dead socket cost a lease: a renewal, an acquire and a release
//! whose reply never comes on a pooled connection are retried on a fresh one in time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::bounds::{
    self, COMMAND, CONNECT, ContinueOnDrop, ONE, RETRY, SLACK, Timings, show, show_opt,
};
use common::faults::{ACQUIRE_LUA, RELEASE_LUA, RENEW_LUA, sha};
use common::kinds::Kind;
use common::proxy::Proxy;
use common::{RedisServer, signal, with_deadline};
use locksmith::{Client, Error};

const PASSWORD: &str = "deadlines-secret";

/// Makes the server ask for a password (every new connection then authenticates).
fn require_password(server: &RedisServer) {
    let mut conn = server.conn();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .exec(&mut conn)
        .unwrap();
}

/// A URL with the password and database 1, to `port`.
fn url_to(port: u16) -> String {
    url_to_host("127.0.0.1", port)
}

/// A URL with the password and database 1, to `host:port`.
fn url_to_host(host: &str, port: u16) -> String {
    format!("redis://:{PASSWORD}@{host}:{port}/1")
}

fn client(url: &str) -> locksmith::Result<Client> {
    Client::builder(url)
        .command_timeout(COMMAND)
        .connect_timeout(CONNECT)
        .retry_timeout(RETRY)
        .build()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Stalled,
    BlackHole,
    ClosedPort,
}

/// Runs every blocking call of the API under `fault` and checks each against its bound.
fn every_call_keeps_its_bound(fault: Fault) {
    every_call_keeps_its_bound_at("127.0.0.1", fault);
}

/// [`every_call_keeps_its_bound`], with the server named `host` in the URL: the calls of
/// [`bounds::time_every_call`] on a mutex, then `Client::build`.
fn every_call_keeps_its_bound_at(host: &str, fault: Fault) {
    let server = RedisServer::start();
    require_password(&server);
    let pid = server.pid();
    // Declared after the server, so dropped (SIGCONT) before it is killed.
    let _cont = ContinueOnDrop(pid);
    let proxy = (fault != Fault::Stalled).then(|| Proxy::start(server.port()));
    let url = url_to_host(host, proxy.as_ref().map_or(server.port(), Proxy::port));

    let timings = with_deadline(Duration::from_secs(120), move || {
        let mut proxy = proxy;
        let strike = || match fault {
            Fault::Stalled => signal(pid, "STOP"),
            Fault::BlackHole => proxy.as_ref().unwrap().black_hole(),
            Fault::ClosedPort => proxy.as_mut().unwrap().stop(),
        };
        let mut t = bounds::time_every_call(&[Kind::Mutex], || client(&url).unwrap(), strike);
        t.time("Client::build", CONNECT * 2 + COMMAND, true, || {
            show(&client_build(&url))
        });
        t
    });
    timings.assert_kept_under(&format!("{fault:?}"));
}

fn client_build(url: &str) -> locksmith::Result<Client> {
    client(url)
}

#[test]
fn stalled_server_every_call_keeps_its_bound() {
    every_call_keeps_its_bound(Fault::Stalled);
}

#[test]
fn black_hole_every_call_keeps_its_bound() {
    every_call_keeps_its_bound(Fault::BlackHole);
}

/// The same with a host name in the URL (every other bound test uses 127.0.0.1): the name's
/// lookup is inside each call's bound. (A DNS server that does not answer cannot be staged
/// without root; `transport::dns`'s unit test holds a lookup past the bound instead.)
#[test]
fn black_hole_by_host_name_every_call_keeps_its_bound() {
    every_call_keeps_its_bound_at("localhost", Fault::BlackHole);
}

/// A client that names its server `localhost`: locks, and its waiter is woken by the release
/// (the pub/sub connection resolves the name too).
#[test]
fn a_host_name_serves_locks_and_wakeups() {
    let server = RedisServer::start();
    let url = format!("redis://localhost:{}/", server.port());
    let mut admin = server.conn();
    with_deadline(Duration::from_secs(30), move || {
        let (a, b) = (Client::open(&url).unwrap(), Client::open(&url).unwrap());
        let name = common::unique_name("by-name");
        let g = a.mutex(&name).unwrap().lock().unwrap();
        let mb = b.mutex(&name).unwrap();
        let waiter = std::thread::spawn(move || {
            mb.try_lock_for(Duration::from_secs(10))
                .unwrap()
                .map(|_| Instant::now())
        });
        common::wait_numsub(&mut admin, &common::release_channel(&name), 1);
        let released = Instant::now();
        g.unlock().unwrap();
        let got = waiter.join().unwrap().expect("the waiter got the lock");
        assert!(
            got - released < Duration::from_secs(1),
            "{:?}",
            got - released
        );
    });
}

#[test]
fn closed_port_every_call_keeps_its_bound() {
    every_call_keeps_its_bound(Fault::ClosedPort);
}

/// `Client::build` against a server that is stalled from the start: the first connection's
/// handshake (`AUTH`, `SELECT`) must not wait a connect timeout per command.
#[test]
fn build_against_a_stalled_server_keeps_its_bound() {
    let server = RedisServer::start();
    require_password(&server);
    let pid = server.pid();
    let _cont = ContinueOnDrop(pid);
    signal(pid, "STOP");
    let url = url_to(server.port());
    let (took, out) = with_deadline(Duration::from_secs(60), move || {
        let start = Instant::now();
        let r = client_build(&url);
        (start.elapsed(), show(&r))
    });
    let bound = CONNECT * 2 + COMMAND;
    println!("build against a stalled server: {out} after {took:?} (bound {bound:?} + slack)");
    assert!(out.starts_with("Err"), "{out}");
    assert!(took <= bound + SLACK, "took {took:?}, bound {bound:?}");
}

/// A renewal whose reply never comes on a pooled connection (a NAT or load balancer that
/// dropped it silently) is retried on a fresh connection within the renewal period: with the
/// default 5 s command timeout, a 3 s lease must survive it.
#[test]
fn a_dead_pooled_connection_does_not_cost_the_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = Duration::from_secs(3);
    let (client, lost) = common::count_losses(Client::builder(proxy.url().as_str()).lease(lease));
    let name = common::unique_name("dead-pooled");
    let key = common::lock_key(&name);
    let renew_sha = sha(&RENEW_LUA);
    let other = Client::open(server.url()).unwrap();
    let other_m = other.mutex(&name).unwrap();

    let proxy = Arc::new(proxy);
    let p = Arc::clone(&proxy);
    let report = with_deadline(Duration::from_secs(60), move || {
        let m = client.mutex(&name).unwrap();
        let g = m.lock().unwrap();
        // The next renewal of this lock goes out, Redis runs it, and its reply is held back
        // longer than the command timeout: the connection is as good as dead.
        p.delay_reply_to(
            &[renew_sha.as_bytes(), key.as_bytes()],
            Duration::from_secs(6),
            1,
        );
        assert!(
            common::wait_until(lease * 2, || p.delays() >= 1),
            "no renewal was sent"
        );
        let stuck_at = Instant::now();
        // Watch for more than a lease after the renewal got stuck.
        let mut first_loss = None;
        while stuck_at.elapsed() < lease + Duration::from_millis(500) {
            if !g.is_held() && first_loss.is_none() {
                first_loss = Some(stuck_at.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let still = g.is_held();
        let taken = other_m.try_lock().map(|g| g.is_some());
        let unlocked = g.unlock().map_err(|e| e.to_string());
        (first_loss, still, taken, unlocked)
    });
    let (first_loss, still, taken, unlocked) = report;
    println!(
        "dead pooled connection: loss at {first_loss:?}, held at the end {still}, \
         other owner took it {taken:?}, unlock {unlocked:?}, lost callbacks {}",
        lost.load(Ordering::SeqCst)
    );
    assert_eq!(
        first_loss, None,
        "the lease was lost while Redis was healthy"
    );
    assert!(still);
    assert!(!taken.unwrap(), "another owner took a held lock");
    assert_eq!(lost.load(Ordering::SeqCst), 0);
    unlocked.unwrap();
}

/// An acquire and a release whose reply never comes on the pooled connection are retried on
/// a fresh connection, and the retry still fits the call's bound (it succeeds, too).
#[test]
fn acquire_and_release_retry_on_a_fresh_connection_within_the_bound() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = Client::builder(proxy.url().as_str())
        .command_timeout(COMMAND)
        .connect_timeout(CONNECT)
        .build()
        .unwrap();
    let name = common::unique_name("dead-pooled-acquire");
    let key = common::lock_key(&name);
    // The acquisitions reserve hand-off blocks: the retried acquire must answer with its
    // block, or the retried release takes the lock for another's.
    let (acquire_sha, release_sha) = (sha(&ACQUIRE_LUA), sha(&RELEASE_LUA));
    let proxy = Arc::new(proxy);
    let p = Arc::clone(&proxy);
    let (acquired, released) = with_deadline(Duration::from_secs(60), move || {
        let m = client.mutex(&name).unwrap();
        // Warm the pool, so that the next calls take a pooled connection.
        drop(m.try_lock().unwrap().unwrap());
        p.delay_reply_to(&[acquire_sha.as_bytes(), key.as_bytes()], COMMAND * 10, 1);
        let start = Instant::now();
        let g = m.try_lock();
        let acquired = (start.elapsed(), show_opt(&g));
        let g = g.unwrap().unwrap();
        p.delay_reply_to(&[release_sha.as_bytes(), key.as_bytes()], COMMAND * 10, 1);
        let start = Instant::now();
        let r = g.unlock();
        let released = (start.elapsed(), show(&r));
        (acquired, released)
    });
    println!("acquire over a dead pooled connection: {acquired:?}; release: {released:?}");
    assert_eq!(proxy.delays(), 2, "both replies were held back");
    let bound = COMMAND + CONNECT + SLACK;
    assert_eq!(acquired.1, "Ok(Some)");
    assert!(acquired.0 <= bound, "{acquired:?}");
    assert_eq!(released.1, "Ok");
    assert!(released.0 <= bound, "{released:?}");
}

/// Settings under which no renewal can keep a lease are refused, naming the field and bound.
#[test]
fn settings_that_cannot_keep_a_lease_are_refused() {
    let (_server, url) = common::server_url();
    let lease = Duration::from_secs(1);
    // A renewal sent 999 ms after the last one would arrive after the local lease deadline.
    let e = Client::builder(&url)
        .lease(lease)
        .renew_interval(Duration::from_millis(999))
        .build()
        .expect_err("a renewal interval that cannot keep the lease was accepted");
    println!("refused: {e}");
    assert!(
        matches!(&e, Error::InvalidConfig { field, .. } if *field == "renew_interval"),
        "{e:?}"
    );
    assert!(e.to_string().contains("half the lease"), "{e}");
    let ok = Client::builder(&url)
        .lease(lease)
        .renew_interval(lease / 2)
        .build();
    assert!(ok.is_ok(), "half the lease was refused: {ok:?}");
}

/// Every connection of a client (pooled and pub/sub) has TCP keepalive on, so a connection
/// that a NAT or load balancer dropped is found out even while it is idle. Read from `ss`.
#[test]
fn every_connection_has_tcp_keepalive() {
    let Ok(probe) = Command::new("ss").arg("-V").output() else {
        println!("skipped: `ss` is not installed");
        return;
    };
    assert!(probe.status.success());
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let m = client.mutex(&common::unique_name("keepalive")).unwrap();
    let g = m.lock().unwrap();
    let port = server.port();
    let out = Command::new("ss")
        .args(["-Htno", "state", "established"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    // The pooled connection and the pub/sub connection, at least.
    assert!(lines.len() >= 2, "client connections not found: {text}");
    for l in &lines {
        assert!(
            l.contains("keepalive"),
            "a connection without keepalive: {l}"
        );
    }
    drop(g);
}

/// A quorum of three masters: with one master stalled, `try_lock` still holds the lock within
/// its bound (the stalled master costs the per-master timeout, not a command timeout); with
/// every master stalled, every call still returns within its bound.
#[test]
fn redlock_calls_keep_their_bounds_with_stalled_masters() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    for s in &servers {
        require_password(s);
    }
    let pids: Vec<u32> = servers.iter().map(RedisServer::pid).collect();
    // Declared after the servers, so dropped (SIGCONT) before they are killed.
    let _cont: Vec<ContinueOnDrop> = pids.iter().map(|&p| ContinueOnDrop(p)).collect();
    let urls: Vec<String> = servers.iter().map(|s| url_to(s.port())).collect();

    let results = with_deadline(Duration::from_secs(120), move || {
        let quorum = locksmith::Client::redlock(&urls)
            .command_timeout(COMMAND)
            .connect_timeout(CONNECT)
            .retry_timeout(RETRY)
            .build()
            .unwrap();
        let m = |name: &str| quorum.mutex(&common::unique_name(name)).unwrap();
        let (held, free) = (m("rl-held"), m("rl-free"));
        let g = held.lock().unwrap();
        let mut t = Timings::default();

        // One master of three stalled: a majority still answers.
        signal(pids[0], "STOP");
        t.time("one stalled: try_lock", ONE, false, || {
            let r = free.try_lock();
            let s = show_opt(&r);
            drop(r);
            s
        });

        // All stalled.
        signal(pids[1], "STOP");
        signal(pids[2], "STOP");
        t.time("all stalled: try_lock", ONE, true, || {
            show_opt(&free.try_lock())
        });
        let wait = Duration::from_millis(500);
        t.time(
            "all stalled: try_lock_for(500ms)",
            bounds::waiting(),
            true,
            || show_opt(&free.try_lock_for(wait)),
        );
        t.time("all stalled: lock", bounds::retrying(), true, || {
            show(&free.lock())
        });
        t.time("all stalled: is_locked", ONE, true, || {
            show(&free.is_locked())
        });
        t.time("all stalled: unlock", ONE, true, || show(&g.unlock()));
        t
    });
    assert_eq!(
        results.outcomes()[0],
        "Ok(Some)",
        "with one master of three stalled, the lock was not taken"
    );
    results.assert_kept_under("stalled masters");
}
