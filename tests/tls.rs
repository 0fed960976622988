//! TLS (`rediss://`, the feature `tls`): the core over TLS (lock, re-entry, renewal, handoff
//! between two clients through a pub/sub connection that is TLS too), mutual TLS, each failure
//! named by `build()` before anything is locked, `#insecure` only with the feature
//! `tls-insecure`, and the process's default rustls provider left alone.
//!
//! Every server is a real `redis-server` with a TLS port and certificates made by `openssl`
//! for this run ([`common::TlsFiles`]). Its plain port serves only the test's own inspection
//! connection; `CLIENT LIST` shows which port each of the client's connections came in on.

#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::thread;
use std::time::Duration;

use common::{RedisServer, ServerCert, TlsFiles, with_deadline};
use locksmith::{Client, Error};

/// An inspection connection, named so that [`client_ports`] leaves it out.
fn inspect(server: &RedisServer) -> redis::Connection {
    let mut conn = server.conn();
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg("inspect")
        .exec(&mut conn)
        .unwrap();
    conn
}

/// The names and `laddr` ports of the server's clients, except the test's inspection
/// connections.
fn client_ports(server: &RedisServer) -> Vec<(String, u16)> {
    let mut conn = inspect(server);
    common::client_list(&mut conn)
        .iter()
        .filter(|l| !l.contains(" name=inspect "))
        .map(|l| {
            let field = |k: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(k))
                    .unwrap_or("")
                    .to_owned()
            };
            let port = field("laddr=")
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            (field("name="), port)
        })
        .collect()
}

fn tls_client(server: &RedisServer, files: &TlsFiles) -> Client {
    Client::builder(server.tls_url())
        .tls_root_cert(files.ca_pem())
        .lease(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Lock, re-entry and renewal over TLS, on connections that all came in on the TLS port
/// (commands and pub/sub).
#[test]
fn lock_reentry_and_renewal_over_tls() {
    if common::skip_without_tls("lock_reentry_and_renewal_over_tls") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let url = server.tls_url();
    let ca = files.ca_pem();
    let name = common::unique_name("tls-core");
    let n = name.clone();
    let (token, reentered, held_after) = with_deadline(Duration::from_secs(30), move || {
        let c = Client::builder(&url)
            .tls_root_cert(ca)
            .lease(Duration::from_millis(600))
            .build()
            .unwrap();
        let m = c.mutex(&n).unwrap();
        let g = m.lock().unwrap();
        let inner = m.lock().unwrap();
        let reentered = inner.fencing_token() == g.fencing_token();
        drop(inner);
        // Three leases: held only if renewals went through.
        thread::sleep(Duration::from_millis(1800));
        let held = g.is_held();
        let token = g.fencing_token();
        g.unlock().unwrap();
        (token, reentered, held)
    });
    assert!(token > 0);
    assert!(reentered, "re-entry got another token");
    assert!(held_after, "the lease was not renewed over TLS");
    let mut conn = server.conn();
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
}

/// Two clients hand a lock over through a release message on the TLS pub/sub connection: the
/// waiter is subscribed (on the TLS port), makes no attempts while it waits (no polling), and
/// acquires right after the release, long before the holder's lease would run out.
#[test]
fn handoff_between_two_clients_over_tls() {
    if common::skip_without_tls("handoff_between_two_clients_over_tls") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let a = tls_client(&server, &files);
    let b = tls_client(&server, &files);
    let name = common::unique_name("tls-handoff");
    let ma = a.mutex(&name).unwrap();
    let g = ma.lock().unwrap();
    let waiter = common::await_lock(b.mutex(&name).unwrap(), Duration::from_secs(20));
    let mut conn = inspect(&server);
    common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
    let pubsub: Vec<_> = client_ports(&server)
        .into_iter()
        .filter(|(n, _)| n == "locksmith-pubsub")
        .collect();
    assert_eq!(pubsub.len(), 2, "{pubsub:?}");
    assert!(
        pubsub.iter().all(|(_, p)| *p == server.tls_port()),
        "{pubsub:?}"
    );
    // The waiter waits for the message, not on a timer.
    let before = common::script_calls(&mut conn);
    thread::sleep(Duration::from_millis(500));
    let during = common::script_calls(&mut conn) - before;
    assert!(during <= 1, "{during} attempts while waiting: polling");
    let first = g.fencing_token();
    let (took, token) = waiter.woken_by(|| g.unlock().unwrap(), Duration::from_secs(20));
    println!("TLS handoff: acquired {took:?} after the release");
    assert!(token > first);
    assert!(took < Duration::from_secs(2));
    // Every connection of both clients came in on the TLS port.
    let ports = client_ports(&server);
    assert!(ports.len() >= 4, "{ports:?}");
    assert!(
        ports.iter().all(|(_, p)| *p == server.tls_port()),
        "{ports:?}"
    );
}

/// Mutual TLS: a server that requires client certificates serves a client that presents one,
/// and `build()` of a client without one fails with a TLS error.
#[test]
fn mutual_tls() {
    if common::skip_without_tls("mutual_tls") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, true);
    let (cert, key) = files.client_pem();
    let c = Client::builder(server.tls_url())
        .tls_root_cert(files.ca_pem())
        .tls_client_cert(cert, key)
        .build()
        .unwrap();
    let m = c.mutex(&common::unique_name("mtls")).unwrap();
    m.lock().unwrap().unlock().unwrap();

    let e = build_err(Client::builder(server.tls_url()).tls_root_cert(files.ca_pem()));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("client certificate"), "{e}");
}

/// `build()` of a client whose TLS set-up fails: the error, within a bound.
fn build_err(b: locksmith::ClientBuilder) -> Error {
    let e = with_deadline(Duration::from_secs(20), move || {
        b.connect_timeout(Duration::from_secs(2)).build().err()
    })
    .expect("build() succeeded");
    println!("refused: {e}");
    e
}

#[test]
fn wrong_ca_is_named() {
    if common::skip_without_tls("wrong_ca_is_named") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let e = build_err(Client::builder(server.tls_url()).tls_root_cert(files.other_ca_pem()));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("not signed by a trusted CA"), "{e}");
}

#[test]
fn system_roots_do_not_trust_a_private_ca() {
    if common::skip_without_tls("system_roots_do_not_trust_a_private_ca") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let e = build_err(Client::builder(server.tls_url()));
    assert!(e.is_tls(), "{e:?}");
}

#[test]
fn expired_certificate_is_named() {
    if common::skip_without_tls("expired_certificate_is_named") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Expired, false);
    let e = build_err(Client::builder(server.tls_url()).tls_root_cert(files.ca_pem()));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("expired"), "{e}");
}

#[test]
fn mismatched_certificate_is_named() {
    if common::skip_without_tls("mismatched_certificate_is_named") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::WrongHost, false);
    let e = build_err(Client::builder(server.tls_url()).tls_root_cert(files.ca_pem()));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("not valid for that host"), "{e}");
}

/// Plain text to the TLS port, and TLS to the plain port: both named.
#[test]
fn plain_text_and_tls_on_the_wrong_port_are_named() {
    if common::skip_without_tls("plain_text_and_tls_on_the_wrong_port_are_named") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let plain_to_tls = format!("redis://127.0.0.1:{}/", server.tls_port());
    let e = build_err(Client::builder(&plain_to_tls));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("rediss://"), "{e}");
    let tls_to_plain = format!("rediss://127.0.0.1:{}/", server.port());
    let e = build_err(Client::builder(&tls_to_plain).tls_root_cert(files.ca_pem()));
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("plain-text port"), "{e}");
}

/// `#insecure` skips verification (here: of a certificate from an unknown CA), for commands
/// and pub/sub.
#[test]
#[cfg(feature = "tls-insecure")]
fn insecure_url_skips_verification() {
    if common::skip_without_tls("insecure_url_skips_verification") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::WrongHost, false);
    let url = format!("{}#insecure", server.tls_url());
    let c = Client::builder(&url).build().unwrap();
    let m = c.mutex(&common::unique_name("insecure")).unwrap();
    m.lock().unwrap().unlock().unwrap();
}

/// A certificate given to the builder that is not PEM is refused by `build()` before any I/O.
#[test]
fn unusable_certificates_are_named() {
    let e = Client::builder("rediss://127.0.0.1:1/")
        .tls_root_cert(b"not a certificate".to_vec())
        .build()
        .unwrap_err();
    assert!(e.is_tls(), "{e:?}");
    assert!(e.to_string().contains("root certificate"), "{e}");
}

/// Without the feature `tls-insecure`, an `#insecure` URL is refused by `build()` before any
/// I/O, naming the feature (on every topology).
#[test]
#[cfg(not(feature = "tls-insecure"))]
fn insecure_url_needs_its_feature() {
    let url = "rediss://127.0.0.1:1/#insecure";
    for b in [
        Client::builder(url),
        Client::redlock([url]),
        Client::cluster([url]),
        Client::sentinel([url], "m"),
    ] {
        let e = b.build().unwrap_err();
        assert!(e.is_invalid_config(), "{e:?}");
        assert!(e.to_string().contains("`tls-insecure` feature"), "{e}");
    }
}

/// A rediss:// client neither installs nor reads rustls's process-wide default provider:
/// after it connected (commands and pub/sub), none is installed, and the program can install
/// its own; a provider that can make no connection at all (no cipher suite) installed as the
/// default does not stop a client from connecting. Run in a process of its own, whose
/// default provider no other test has touched.
#[test]
fn the_process_default_provider_is_left_alone() {
    if common::skip_without_tls("the_process_default_provider_is_left_alone") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let ca = String::from_utf8(files.ca_pem()).unwrap();
    common::run_children(
        1,
        "child_provider",
        "provider",
        &[
            ("LS_URL", server.tls_url()),
            ("LS_CA", ca),
            ("LS_NAME", common::unique_name("provider")),
        ],
        Duration::from_secs(60),
    );
}

/// The child process of [`the_process_default_provider_is_left_alone`].
#[test]
fn child_provider() {
    use rustls::crypto::{CryptoProvider, ring};

    let Some((url, name)) = common::child_url_name("provider") else {
        return;
    };
    let ca = common::child_env("LS_CA").into_bytes();
    let lock_once = || {
        let client = Client::builder(url.as_str())
            .tls_root_cert(ca.clone())
            .build()
            .unwrap();
        let m = client.mutex(&name).unwrap();
        // A waiter is woken through the pub/sub connection, which is TLS too.
        let guard = m.lock().unwrap();
        let waiter = {
            let m = m.clone();
            thread::spawn(move || m.lock().unwrap().unlock().unwrap())
        };
        thread::sleep(Duration::from_millis(100));
        guard.unlock().unwrap();
        waiter.join().unwrap();
    };
    assert!(CryptoProvider::get_default().is_none());
    lock_once();
    assert!(
        CryptoProvider::get_default().is_none(),
        "a rediss:// client installed a default provider"
    );
    // The program's own default, and one that could make no TLS connection at all.
    let useless = CryptoProvider {
        cipher_suites: Vec::new(),
        ..ring::default_provider()
    };
    useless
        .install_default()
        .expect("no default provider was installed before");
    lock_once();
    assert!(
        CryptoProvider::get_default()
            .unwrap()
            .cipher_suites
            .is_empty()
    );
    println!("PROVIDER OK");
}
