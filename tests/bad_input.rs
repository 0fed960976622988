//! Bad input: names, options, timeouts and URLs give clear errors (never panics or hangs), and
//! odd but valid names work.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use common::with_deadline;
use locksmith::Client;

/// Commands Redis has seen, leaving out the inspection commands of the test itself.
fn commands_seen(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let mut stats = common::commandstats(conn);
    stats.remove("cmdstat_info");
    stats
}

/// Empty names, names over 1 KiB and names with NUL are rejected by `mutex()` with
/// `is_invalid_name()`, before any I/O. 1 KiB exactly is fine.
#[test]
fn invalid_names_are_rejected_before_io() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::open(url.as_str()).unwrap();
        thread::sleep(Duration::from_millis(100));
        let before = commands_seen(&mut conn);

        let long_ascii = "x".repeat(1025);
        let long_unicode = format!("{}x", "é".repeat(512));
        assert_eq!(long_unicode.len(), 1025);
        for bad in [
            "",
            "\0",
            "a\0b",
            "abc\0",
            long_ascii.as_str(),
            long_unicode.as_str(),
        ] {
            let err = client.mutex(bad).expect_err("bad name accepted");
            assert!(err.is_invalid_name(), "{bad:?}: wrong error kind: {err}");
            assert!(!err.to_string().is_empty());
            assert!(!err.is_redis() && !err.is_timeout() && !err.is_invalid_config());
        }
        let err = client.mutex("").unwrap_err();
        println!("empty name: {err}");
        let err = client.mutex(&long_ascii).unwrap_err();
        println!("1025-byte name: {err}");
        assert_eq!(
            commands_seen(&mut conn),
            before,
            "an invalid name caused I/O"
        );

        let max = format!("{:x<1024}", common::unique_name("max"));
        assert_eq!(max.len(), 1024);
        let lock = client.mutex(&max).expect("a 1024-byte name is valid");
        lock.lock().unwrap().unlock().unwrap();
        let max_unicode = "é".repeat(512);
        let _ = client
            .mutex(&max_unicode)
            .expect("a 1024-byte unicode name is valid");
    });
}

/// Unicode, spaces, newlines, glob characters and braces in names work, each as its own lock,
/// under its documented (percent-encoded) key.
#[test]
fn odd_names_work() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let [a, b] = common::clients(&url);
        let u = common::unique_name("odd");
        let names: Vec<String> = [
            "ключ-🔒-鍵",
            "with space",
            "new\nline",
            "tab\tcr\r",
            "a*",
            "a?",
            "[ab]",
            "{braces}",
            "}{",
            "{",
            "%",
            "%7B",
            "%25",
            "\\",
            "\"quoted\"",
            "ends:with:lock",
        ]
        .iter()
        .map(|n| format!("{u}{n}"))
        .collect();
        for name in &names {
            let la = a.mutex(name).unwrap();
            let lb = b.mutex(name).unwrap();
            assert_eq!(la.name(), name.as_str());
            let g = la.lock().unwrap();
            let key = common::lock_key(name);
            assert!(common::exists(&mut conn, &key), "{name:?}: no key {key:?}");
            assert!(lb.is_locked().unwrap());
            assert!(
                lb.try_lock().unwrap().is_none(),
                "{name:?}: b got a held lock"
            );
            g.unlock().unwrap();
            assert!(!common::exists(&mut conn, &key), "{name:?}: key left");
            let gb = lb.try_lock().unwrap().expect("free after unlock");
            gb.unlock().unwrap();
        }

        // Encoding is one-to-one: "{", "%7B" and "%257B" are three locks, all held at once.
        let distinct = [
            format!("{u}{{"),
            format!("{u}%7B"),
            format!("{u}%257B"),
            format!("{u}%"),
            format!("{u}%25"),
        ];
        let locks: Vec<_> = distinct.iter().map(|n| a.mutex(n).unwrap()).collect();
        let guards: Vec<_> = locks
            .iter()
            .map(|l| l.try_lock().unwrap().expect("distinct name already locked"))
            .collect();
        for n in &distinct {
            assert!(common::exists(&mut conn, &common::lock_key(n)));
        }
        drop(guards);
    });
}

/// A release of `ab` never wakes a waiter of `a*`. While `a*` is held and a waiter blocks on
/// it, `ab` is handed twenty times from another client to a second waiter on the *same* client
/// as the `a*` waiter (so that client's subscriber does receive `ab`'s release messages). The
/// `a*` waiter stays blocked and sends no acquire attempt for `a*` meanwhile (counted with
/// `MONITOR`). Then `a*` is released and the waiter gets it at once.
#[test]
fn release_of_ab_never_wakes_waiters_of_a_star() {
    const CYCLES: usize = 20;
    let (server, url, mut conn) = common::server_url_conn();
    let monitor = common::Monitor::start(server.port());
    with_deadline(Duration::from_secs(30), move || {
        let [holder, waiter] = common::clients(&url);
        let u = common::unique_name("glob");
        let star = format!("{u}a*");
        let ab = format!("{u}ab");
        let star_key = common::lock_key(&star);
        let ab_channel = common::release_channel(&ab);

        let hl = holder.mutex(&star).unwrap();
        let held = hl.lock().unwrap();
        let w = common::await_lock(waiter.mutex(&star).unwrap(), Duration::from_secs(20));
        let channel = common::release_channel(&star);
        assert!(common::wait_until(Duration::from_secs(5), || {
            common::numsub(&mut conn, &channel) >= 1
        }));
        // Let the waiter's attempt after the subscription confirmation happen.
        thread::sleep(Duration::from_millis(200));
        let mark = monitor.sync(&mut conn);

        // The `ab` waiter, on the same client as the `a*` waiter.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let abl = waiter.mutex(&ab).unwrap();
        let ab_waiter = thread::spawn(move || {
            while go_rx.recv().is_ok() {
                let g = abl.try_lock_for(Duration::from_secs(5)).unwrap();
                done_tx.send(g.is_some()).unwrap();
            }
        });
        let ab_holder = holder.mutex(&ab).unwrap();
        for i in 0..CYCLES {
            let g = ab_holder.lock().unwrap();
            go_tx.send(()).unwrap();
            assert!(common::wait_until(Duration::from_secs(5), || {
                common::numsub(&mut conn, &ab_channel) >= 1
            }));
            thread::sleep(Duration::from_millis(10));
            g.unlock().unwrap();
            let got = done_rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert!(got, "cycle {i}: the {ab:?} waiter timed out");
        }
        drop(go_tx);
        ab_waiter.join().unwrap();
        thread::sleep(Duration::from_millis(100));

        monitor.sync(&mut conn);
        let lines = monitor.since(mark);
        let attempts = common::Monitor::script_calls_on(&lines, &star_key);
        assert_eq!(
            w.rx.try_recv().err(),
            Some(TryRecvError::Empty),
            "waiter finished"
        );
        assert_eq!(
            attempts, 0,
            "{CYCLES} releases of {ab:?} caused {attempts} acquire attempts by the waiter of {star:?}"
        );

        let (latency, _) = w.woken_by(|| held.unlock().unwrap(), Duration::from_secs(10));
        println!("waiter of {star:?} woke {latency:?} after its release");
        assert!(latency < Duration::from_secs(1));
    });
}

/// Options out of range give `is_invalid_config()` naming the option; bounds are inclusive
/// where documented (lease 30 ms).
#[test]
fn invalid_options_are_rejected() {
    common::on_server(Duration::from_secs(30), move |url, _conn| {
        let u = url.as_str();
        let config_err = |res: locksmith::Result<Client>, what: &str, word: &str| {
            let err = res.err().unwrap_or_else(|| panic!("{what}: accepted"));
            println!("{what}: {err}");
            assert!(err.is_invalid_config(), "{what}: wrong error kind: {err}");
            assert!(
                err.to_string().to_lowercase().contains(word),
                "{what}: message {err:?} does not name {word:?}"
            );
        };
        config_err(
            Client::builder(u).lease(Duration::ZERO).build(),
            "lease 0",
            "lease",
        );
        config_err(
            Client::builder(u).lease(Duration::from_millis(29)).build(),
            "lease 29 ms",
            "lease",
        );
        config_err(
            Client::builder(u)
                .lease(Duration::from_secs(1))
                .renew_interval(Duration::from_secs(1))
                .build(),
            "renew_interval == lease",
            "renew",
        );
        config_err(
            Client::builder(u)
                .lease(Duration::from_secs(1))
                .renew_interval(Duration::from_secs(2))
                .build(),
            "renew_interval > lease",
            "renew",
        );
        config_err(
            Client::builder(u)
                .renew_interval(Duration::from_secs(30))
                .build(),
            "renew_interval == default lease",
            "renew",
        );
        for prefix in ["a{b", "a}b", "{", "}"] {
            config_err(
                Client::builder(u).key_prefix(prefix).build(),
                &format!("key_prefix {prefix:?}"),
                "prefix",
            );
        }

        let long = "x".repeat(128 + 1);
        for (label, what) in [
            ("", "empty"),
            ("a\nb", "a newline"),
            (long.as_str(), "129 bytes"),
        ] {
            config_err(
                Client::builder(u).label(label).build(),
                &format!("label {what}"),
                "label",
            );
        }

        // Accepted: the minimum lease, a renewal at half the lease, an odd prefix, a label
        // with the characters an owner id encodes.
        let c = Client::builder(u)
            .label("api/eu-1|50% ünï")
            .build()
            .expect("a printable label is valid");
        drop(c);
        let c = Client::builder(u)
            .lease(Duration::from_millis(30))
            .build()
            .expect("lease 30 ms is valid");
        drop(c);
        let c = Client::builder(u)
            .lease(Duration::from_secs(1))
            .renew_interval(Duration::from_millis(500))
            .key_prefix("my app:")
            .build()
            .expect("renew_interval of half the lease is valid");
        drop(c);

        // Fixed leases have the same bounds.
        let client = Client::open(u).unwrap();
        let name = common::unique_name("fixed");
        for lease in [Duration::ZERO, Duration::from_millis(29)] {
            let err = client
                .mutex(&name)
                .unwrap()
                .with_lease(lease)
                .expect_err("bad fixed lease accepted");
            assert!(err.is_invalid_config(), "with_lease({lease:?}): {err}");
        }
        let _ = client
            .mutex(&name)
            .unwrap()
            .with_lease(Duration::from_millis(30))
            .expect("fixed lease 30 ms is valid");
    });
}

/// A custom key prefix is used for every key.
#[test]
fn custom_prefix_is_used() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let client = Client::builder(url.as_str())
            .key_prefix("my app:")
            .build()
            .unwrap();
        let name = common::unique_name("prefixed");
        let lock = client.mutex(&name).unwrap();
        let g = lock.lock().unwrap();
        assert!(common::exists(
            &mut conn,
            &format!("my app:{{{name}}}:lock")
        ));
        assert!(!common::exists(&mut conn, &common::lock_key(&name)));
        g.unlock().unwrap();
        // The release marker, under the prefix too.
        assert!(common::exists(
            &mut conn,
            &format!("my app:{{{name}}}:released")
        ));
    });
}

/// Timeouts near `Duration::MAX` and deadlines far away never overflow: on a free lock they
/// return at once, on a held one they wait until the release.
#[test]
fn huge_timeouts_do_not_overflow() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let [a, b] = common::clients(&url);
        let name = common::unique_name("huge-timeout");
        let la = a.mutex(&name).unwrap();

        for wait in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::MAX - Duration::from_nanos(1),
        ] {
            let start = Instant::now();
            let g = la.try_lock_for(wait).unwrap().expect("free lock");
            drop(g);
            assert!(start.elapsed() < Duration::from_secs(1));
        }
        let far = Instant::now()
            .checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
            .expect("Instant + 100 years");
        let g = la.try_lock_until(far).unwrap().expect("free lock");
        drop(g);

        // Held: a waiter with Duration::MAX waits, then gets it after the release.
        let held = la.lock().unwrap();
        let w = common::await_lock(b.mutex(&name).unwrap(), Duration::MAX);
        let channel = common::release_channel(&name);
        assert!(common::wait_until(Duration::from_secs(5), || {
            common::numsub(&mut conn, &channel) >= 1
        }));
        assert_eq!(w.rx.try_recv().err(), Some(TryRecvError::Empty));
        let (latency, _) = w.woken_by(|| held.unlock().unwrap(), Duration::from_secs(5));
        assert!(latency < Duration::from_secs(1));
    });
}

/// `try_lock_for(Duration::ZERO)` and `try_lock()` on a held lock are exactly one acquire
/// attempt each, with no subscription.
#[test]
fn zero_timeout_is_one_attempt() {
    common::on_server(Duration::from_secs(20), move |url, mut conn| {
        let [holder, waiter] = common::clients(&url);
        let name = common::unique_name("zero");
        let channel = common::release_channel(&name);
        let hl = holder.mutex(&name).unwrap();
        let held = hl.lock().unwrap();
        let wl = waiter.mutex(&name).unwrap();
        thread::sleep(Duration::from_millis(100));

        let subscribes = |s: &HashMap<String, u64>| {
            [
                "cmdstat_subscribe",
                "cmdstat_psubscribe",
                "cmdstat_ssubscribe",
            ]
            .iter()
            .map(|c| common::calls(s, c))
            .sum::<u64>()
        };
        let before = common::commandstats(&mut conn);
        let calls_before = common::script_calls(&mut conn);
        let start = Instant::now();
        assert!(wl.try_lock_for(Duration::ZERO).unwrap().is_none());
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(common::script_calls(&mut conn) - calls_before, 1);
        assert!(wl.try_lock().unwrap().is_none());
        assert_eq!(common::script_calls(&mut conn) - calls_before, 2);
        thread::sleep(Duration::from_millis(100));
        let after = common::commandstats(&mut conn);
        assert_eq!(
            subscribes(&after),
            subscribes(&before),
            "a zero wait subscribed"
        );
        assert_eq!(common::numsub(&mut conn, &channel), 0);
        held.unlock().unwrap();
        assert!(wl.try_lock_for(Duration::ZERO).unwrap().is_some());
    });
}

/// Bad URLs give an invalid-config (URL) error naming the problem, not a panic, at once.
#[test]
fn bad_urls_are_errors() {
    let urls = [
        "http://x".to_string(),
        "redis://".to_string(),
        "redis://127.0.0.1:notaport/".to_string(),
        "redis://127.0.0.1:99999/".to_string(),
        "not a url".to_string(),
        String::new(),
    ];
    for url in urls {
        let u = url.clone();
        let start = Instant::now();
        let msg = with_deadline(Duration::from_secs(10), move || {
            let res = Client::builder(u.as_str())
                .connect_timeout(Duration::from_secs(1))
                .command_timeout(Duration::from_secs(1))
                .build();
            res.err().map(|e| (e.to_string(), e.is_invalid_config()))
        });
        let (msg, invalid) = msg.unwrap_or_else(|| panic!("{url:?}: client built"));
        assert!(invalid, "{url:?}: not an invalid-config (URL) error: {msg}");
        println!("{url:?} -> {msg} ({:?})", start.elapsed());
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{url:?}: slow to fail"
        );
        assert!(!msg.is_empty());
        assert!(Client::open(url.as_str()).is_err());
    }
}

/// Each bad part of a URL is named in the message (not "could not be parsed").
#[test]
fn bad_url_messages_name_the_part() {
    for (url, part) in [
        ("redis://127.0.0.1/abc", "database `abc`"),
        ("redis://127.0.0.1:6379/-2", "database `-2`"),
        (
            "redis://127.0.0.1:6379/?protocol=resp9",
            "protocol version: resp9",
        ),
        ("rediss://127.0.0.1:6379/#secure", "#insecure"),
        ("redis://0.0.0.0:6379/", "wildcard address"),
        ("redis://127.0.0.1:notaport/", "port `notaport`"),
        ("127.0.0.1:6379", "no scheme"),
        ("http://127.0.0.1/", "scheme `http`"),
    ] {
        let e = Client::open(url).unwrap_err();
        let msg = e.to_string();
        println!("{url:?} -> {msg}");
        assert!(e.is_invalid_config(), "{url:?}: {e:?}");
        assert!(
            msg.contains(part),
            "{url:?}: `{msg}` does not name {part:?}"
        );
        assert!(!msg.contains("could not be parsed"), "{url:?}: {msg}");
    }
}

/// A closed port gives an error within the connect timeout.
#[test]
fn closed_port_is_an_error() {
    let closed = common::ClosedPort::new();
    let url = closed.url();
    let start = Instant::now();
    let err = with_deadline(Duration::from_secs(10), move || {
        Client::builder(url.as_str())
            .connect_timeout(Duration::from_secs(1))
            .build()
            .err()
            .map(|e| (e.to_string(), e.is_redis() || e.is_timeout()))
    });
    let (msg, kind_ok) = err.expect("client built against a closed port");
    println!("closed port -> {msg} ({:?})", start.elapsed());
    assert!(
        kind_ok,
        "closed port: neither a Redis nor a timeout error: {msg}"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A black hole (accepts TCP, never answers) with 300 ms timeouts gives an error within ~2 s.
#[test]
fn black_hole_is_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let start = Instant::now();
    let err = with_deadline(Duration::from_secs(10), move || {
        Client::builder(format!("redis://127.0.0.1:{port}/").as_str())
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
            .build()
            .err()
            .map(|e| (e.to_string(), e.is_redis() || e.is_timeout()))
    });
    let elapsed = start.elapsed();
    let (msg, kind_ok) = err.expect("client built against a black hole");
    println!("black hole -> {msg} ({elapsed:?})");
    assert!(
        kind_ok,
        "black hole: neither a Redis nor a timeout error: {msg}"
    );
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    drop(listener);
}

/// An endpoint that answers with HTTP gives an error (not a panic) within the limit.
#[test]
fn non_redis_endpoint_is_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let server = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !stop2.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(500)))
                        .unwrap();
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf);
                    let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                    // Keep it open a little: the client must not wait for more.
                    let _ = s.read(&mut buf);
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    let start = Instant::now();
    let msg = with_deadline(Duration::from_secs(10), move || {
        Client::builder(format!("redis://127.0.0.1:{port}/").as_str())
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
            .build()
            .err()
            .map(|e| e.to_string())
    });
    let elapsed = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    let msg = msg.expect("client built against an HTTP endpoint");
    println!("HTTP endpoint -> {msg} ({elapsed:?})");
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    // One line that names the server and says what is wrong with it.
    assert!(
        msg.contains(&format!(
            "127.0.0.1:{port} did not answer as a Redis server"
        )),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    server.join().unwrap();
}
