//! Secrets never leave the process: no password given in a URL or by `master_auth` appears in
//! any `Debug`, `Display`, error or log line, at any level, for any topology and any failure.
//!
//! Read the way an attacker reads logs: a logger keeps every record down to `trace`, each test
//! runs failure cases against servers it starts, formats every value and error it can reach
//! with `{:?}` and `{}` (and each error's sources), and all of it is searched for the secrets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::capture;
use std::time::Duration;

use common::sentinel::{MASTER_PASS, MASTER_USER, SENTINEL_PASS};
use common::{ClosedPort, RedisCluster, RedisServer, SentinelSet, ServerCert, TlsFiles};
use locksmith::{Client, ClientBuilder};

/// The password of the servers started here, and the wrong one tried on them.
const SECRET: &str = "s3cretpw";
const WRONG: &str = "wr0ngpw";

const CONNECT: Duration = Duration::from_millis(300);
const COMMAND: Duration = Duration::from_millis(300);

/// Everything the test saw, to search for the secrets at the end.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn debug(&mut self, what: &str, v: &impl std::fmt::Debug) {
        self.0.push(format!("{what}: {v:?}"));
        self.0.push(format!("{what}: {v:#?}"));
    }

    /// An error's `Display`, `Debug` and every source's.
    fn error(&mut self, what: &str, e: &(dyn std::error::Error + 'static)) {
        self.0.push(format!("{what}: {e} / {e:?}"));
        let mut source = e.source();
        while let Some(s) = source {
            self.0.push(format!("{what} (source): {s} / {s:?}"));
            source = s.source();
        }
    }

    fn result<T: std::fmt::Debug>(&mut self, what: &str, r: &locksmith::Result<T>) {
        match r {
            Ok(v) => self.debug(what, v),
            Err(e) => self.error(what, e),
        }
    }

    /// Builds `b`, keeping the builder's `Debug` and the result's `Debug` or error.
    fn build(&mut self, what: &str, b: ClientBuilder) -> Option<Client> {
        self.debug(what, &b);
        let r = b.build();
        self.result(what, &r);
        r.ok()
    }

    /// Fails when any secret appears in what was seen or in any log line so far.
    fn assert_clean(&self, secrets: &[&str]) {
        let logs = capture::lines();
        let mut leaks = Vec::new();
        let texts = self
            .0
            .iter()
            .cloned()
            .chain(logs.iter().map(|l| l.to_string()));
        for t in texts {
            if secrets.iter().any(|s| t.contains(s)) {
                leaks.push(t);
            }
        }
        assert!(
            leaks.is_empty(),
            "{} line(s) show a secret:\n{}",
            leaks.len(),
            leaks.join("\n")
        );
        assert!(self.0.len() > 4, "the test saw too little: {:?}", self.0);
    }
}

/// Short timeouts, so that the failures come fast.
fn quick(b: ClientBuilder) -> ClientBuilder {
    b.connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(Duration::from_millis(700))
}

/// Every topology's builder for one URL (labelled without the URL: a label must not be
/// what leaks).
fn every_topology(url: &str, label: &str) -> Vec<(String, ClientBuilder)> {
    vec![
        (format!("builder({label})"), quick(Client::builder(url))),
        (
            format!("sentinel({label})"),
            quick(Client::sentinel([url], "m")).master_auth(Some("u"), SECRET),
        ),
        (
            format!("redlock({label})"),
            quick(Client::redlock([url, url, url])),
        ),
        (format!("cluster({label})"), quick(Client::cluster([url]))),
    ]
}

/// Malformed URLs, and well-formed ones that nothing answers, on every topology.
#[test]
fn bad_urls_and_absent_servers_keep_the_password() {
    capture::install();
    let mut seen = Seen::default();
    let closed = ClosedPort::new();
    let p = closed.port();
    let urls = [
        format!("default:{SECRET}@127.0.0.1:{p}"),
        format!(":{SECRET}@127.0.0.1:{p}"),
        format!("redis:/u:{SECRET}@127.0.0.1:{p}"),
        format!("redis://:{SECRET}@127.0.0.1:notaport/"),
        format!("redis://u:{SECRET}@127.0.0.1:0/"),
        format!("redis://:{SECRET}@/"),
        format!("redis://:{SECRET}@:{p}/"),
        format!("http://u:{SECRET}@127.0.0.1:{p}/"),
        format!("redis://:{SECRET}@127.0.0.1:{p}/abc"),
        format!("redis://u:{SECRET}@127.0.0.1:{p}/?protocol=resp9"),
        format!("redis://:{SECRET}%ff@127.0.0.1:{p}/"),
        format!("redis://:{SECRET}@0.0.0.0:{p}/"),
        format!("redis://:{SECRET}@[::1/"),
        format!("rediss://:{SECRET}@127.0.0.1:{p}/#bogus"),
        format!("redis+unix:///tmp/locksmith-none.sock?pass={SECRET}"),
        format!("unix:///tmp/locksmith-none.sock?user=u&pass={SECRET}&db=x"),
        // Well-formed: nobody listens.
        format!("redis://u:{SECRET}@127.0.0.1:{p}/"),
        format!("redis://:{SECRET}@127.0.0.1:{p}/"),
        format!("redis://u:{SECRET}@127.0.0.1:{p}/3"),
        format!("rediss://u:{SECRET}@127.0.0.1:{p}/"),
        format!("redis+unix:///tmp/locksmith-none.sock?pass={SECRET}"),
    ];
    for (i, url) in urls.iter().enumerate() {
        let label = format!("url #{i}");
        let r = Client::open(url);
        seen.result(&format!("open({label})"), &r);
        for (what, b) in every_topology(url, &label) {
            seen.build(&what, b);
        }
    }
    seen.assert_clean(&[SECRET]);
}

/// A wrong password, then the right one through an outage: builds, locks, guards, a lost
/// lease and the reconnects, on one server.
#[test]
fn a_wrong_password_and_an_outage_keep_the_password() {
    capture::install();
    let mut seen = Seen::default();
    let mut server = RedisServer::start();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .exec(&mut server.conn())
        .unwrap();
    let port = server.port();
    let wrong = format!("redis://default:{WRONG}@127.0.0.1:{port}/");
    let right = format!("redis://default:{SECRET}@127.0.0.1:{port}/");
    for (what, b) in every_topology(&wrong, "wrong password") {
        seen.build(&what, b);
    }
    let anonymous = format!("redis://127.0.0.1:{port}/");
    seen.build("no password", quick(Client::builder(&anonymous)));

    let client = seen
        .build(
            "right password",
            quick(Client::builder(&right)).lease(Duration::from_millis(600)),
        )
        .expect("the right password is accepted");
    let quorum = seen
        .build(
            "right password, quorum",
            quick(Client::redlock([&right, &right, &right])),
        )
        .expect("the right password is accepted");
    seen.debug("client", &client);
    seen.debug("quorum", &quorum);
    let m = client.mutex("secrets:a").unwrap();
    seen.debug("mutex", &m);
    let g = m.lock().unwrap();
    seen.debug("guard", &g);
    seen.debug("fair", &client.fair_mutex("secrets:f").unwrap());
    seen.debug("rw", &client.rw_lock("secrets:r").unwrap());
    seen.debug("sem", &client.semaphore("secrets:s", 2).unwrap());

    // The server goes away: the lease is lost, calls fail, the pub/sub connection retries.
    server.stop();
    // Until the lease is lost (the renewal thread and the pub/sub thread have failed by then).
    assert!(common::wait_until(Duration::from_secs(10), || !g.is_held()));
    seen.result("check during outage", &g.check());
    seen.result("unlock during outage", &g.unlock());
    seen.result("lock during outage", &m.lock().map(|_| ()));
    seen.result("try_lock during outage", &m.try_lock().map(|g| g.is_some()));
    seen.result("is_locked during outage", &m.is_locked());
    let qm = quorum.mutex("secrets:q").unwrap();
    seen.result("quorum lock during outage", &qm.lock().map(|_| ()));
    seen.build("right password, no server", quick(Client::builder(&right)));
    server.restart();
    seen.result("lock after restart", &m.try_lock().map(|g| g.is_some()));
    seen.debug("client after", &client);
    drop(client);
    drop(quorum);
    seen.assert_clean(&[SECRET, WRONG]);
}

/// A server given as a `redis::ConnectionInfo` with a password (right, wrong, and where
/// nobody listens): the builder's and the client's `Debug`, the errors and the logs never
/// show it.
#[test]
fn connection_info_keeps_the_password() {
    use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

    capture::install();
    let mut seen = Seen::default();
    let server = RedisServer::start();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .exec(&mut server.conn())
        .unwrap();
    let closed = ClosedPort::new();
    let info = |port: u16, password: &str| {
        ConnectionAddr::Tcp("127.0.0.1".into(), port)
            .into_connection_info()
            .unwrap()
            .set_redis_settings(
                RedisConnectionInfo::default()
                    .set_username("default")
                    .set_password(password)
                    .set_db(1),
            )
    };
    seen.build(
        "info, wrong password",
        quick(Client::builder(info(server.port(), WRONG))),
    );
    seen.build(
        "info, nobody listens",
        quick(Client::builder(info(closed.port(), SECRET))),
    );
    let r = Client::open(info(closed.port(), SECRET));
    seen.result("open(info), nobody listens", &r);
    let client = seen
        .build(
            "info, right password",
            quick(Client::builder(info(server.port(), SECRET))),
        )
        .expect("the right password is accepted");
    seen.debug("client", &client);
    let m = client.mutex("secrets:info").unwrap();
    seen.debug("guard", &m.lock().unwrap());
    seen.assert_clean(&[SECRET, WRONG]);
}

/// TLS to a plain port and plain text to a TLS port, with passwords.
#[test]
fn tls_on_the_wrong_port_keeps_the_password() {
    if common::skip_without_tls("tls_on_the_wrong_port_keeps_the_password") {
        return;
    }
    capture::install();
    let mut seen = Seen::default();
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let tls_to_plain = format!("rediss://u:{SECRET}@127.0.0.1:{}/", server.port());
    let plain_to_tls = format!("redis://u:{SECRET}@127.0.0.1:{}/", server.tls_port());
    let unknown_ca = format!("rediss://u:{SECRET}@127.0.0.1:{}/", server.tls_port());
    for (what, url) in [
        ("TLS to the plain port", &tls_to_plain),
        ("plain text to the TLS port", &plain_to_tls),
    ] {
        seen.build(
            what,
            quick(Client::builder(url)).tls_root_cert(files.ca_pem()),
        );
        seen.build(
            what,
            quick(Client::cluster([url])).tls_root_cert(files.ca_pem()),
        );
    }
    seen.build("an unknown CA", quick(Client::builder(&unknown_ca)));
    seen.assert_clean(&[SECRET]);
}

/// Sentinel with TLS and passwords everywhere: the sentinels' password in their URLs, the
/// master's by `master_auth`; right and wrong ones.
#[test]
fn sentinel_passwords_stay_secret() {
    if common::skip_without_tls("sentinel_passwords_stay_secret") {
        return;
    }
    capture::install();
    let mut seen = Seen::default();
    let files = TlsFiles::generate();
    let set = SentinelSet::start_secure(&files);
    let builder = |urls: Vec<String>, password: &str| {
        quick(Client::sentinel(urls, set.master_name()))
            .tls_root_cert(files.ca_pem())
            .master_auth(Some(MASTER_USER), password)
            .connect_timeout(Duration::from_secs(1))
            .command_timeout(Duration::from_secs(1))
    };
    let wrong_sentinels: Vec<String> = set
        .sentinel_urls()
        .iter()
        .map(|u| u.replace(SENTINEL_PASS, WRONG))
        .collect();
    seen.build("wrong master password", builder(set.sentinel_urls(), WRONG));
    seen.build(
        "wrong sentinel password",
        builder(wrong_sentinels, MASTER_PASS),
    );
    let client = seen
        .build("right passwords", builder(set.sentinel_urls(), MASTER_PASS))
        .expect("the right passwords are accepted");
    let m = client.mutex("secrets:sentinel").unwrap();
    let g = m.lock().unwrap();
    seen.debug("guard", &g);
    seen.debug("client", &client);
    g.unlock().unwrap();
    drop(client);
    seen.assert_clean(&[MASTER_PASS, SENTINEL_PASS, WRONG]);
}

/// A cluster whose nodes require a password: the right one (the client reaches every
/// master with it), and a wrong one.
#[test]
fn cluster_passwords_stay_secret() {
    capture::install();
    let mut seen = Seen::default();
    let cluster = RedisCluster::start_with(3, 0);
    let ports = cluster.live_ports();
    for port in &ports {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(SECRET)
            .exec(&mut cluster.conn(*port))
            .unwrap();
    }
    let seeds = |pw: &str| -> Vec<String> {
        ports
            .iter()
            .map(|p| format!("redis://default:{pw}@127.0.0.1:{p}/"))
            .collect()
    };
    seen.build("wrong password", quick(Client::cluster(seeds(WRONG))));
    let client = seen
        .build("right password", quick(Client::cluster(seeds(SECRET))))
        .expect("the right password is accepted");
    for i in 0..6 {
        let m = client.mutex(&format!("secrets:cluster:{i}")).unwrap();
        let g = m.lock().unwrap();
        seen.debug("guard", &g);
        g.unlock().unwrap();
    }
    seen.debug("client", &client);
    drop(client);
    seen.assert_clean(&[SECRET, WRONG]);
}
