//! ACL users: the whole core (lock, re-entry, renewal, a waiter woken by a release, the
//! release) runs under exactly the minimal rule that `docs/deployments.md` gives, as that
//! user, on command AND pub/sub connections; and each permission of the rule is needed.
//! (A user without `SUBSCRIBE` is in `tests/fault_refusals.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, ServerCert, TlsFiles, with_deadline};
use locksmith::Client;

/// The commands of the minimal rule, as in `docs/deployments.md`: `PING` and `SCRIPT LOAD` (at
/// `build()`, and after a `NOSCRIPT`), `EVALSHA`, `GETRANGE` (`is_locked()`),
/// `SUBSCRIBE`/`UNSUBSCRIBE`, and the commands the scripts call.
const RULE_COMMANDS: &[&str] = &[
    "ping",
    "script|load",
    "evalsha",
    "getrange",
    "subscribe",
    "unsubscribe",
    "time",
    "get",
    "set",
    "rename",
    "pexpire",
    "pttl",
    "publish",
];

/// Creates user `user` (password `pw`) with the minimal rule for the prefix `locksmith:`,
/// less the commands in `without`.
fn set_user(server: &RedisServer, user: &str, without: &[&str]) {
    set_user_plus(server, user, without, &[]);
}

/// Like [`set_user`], with the commands in `plus` allowed as well.
fn set_user_plus(server: &RedisServer, user: &str, without: &[&str], plus: &[&str]) {
    let mut conn = server.conn();
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER").arg(user).arg("reset").arg("on").arg(">pw");
    c.arg(format!("~{}*", common::PREFIX))
        .arg(format!("&{}*", common::PREFIX));
    c.arg("-@all");
    for cmd in RULE_COMMANDS.iter().filter(|c| !without.contains(c)) {
        c.arg(format!("+{cmd}"));
    }
    for cmd in plus {
        c.arg(format!("+{cmd}"));
    }
    c.exec(&mut conn).unwrap();
}

/// Whether a denial is of an optional command, which the client is refused quietly:
/// `CONFIG GET` (the eviction-policy warning), `CLIENT SETNAME` (the pub/sub connection's
/// name) and `FUNCTION LOAD` (the function library; the scripts go as `EVALSHA` without it).
fn optional(denial: &str) -> bool {
    ["config|get", "client|setname", "function|load"]
        .iter()
        .any(|c| denial.contains(c))
}

/// The commands of the `ACL LOG` entries (denials), oldest last.
fn acl_denials(server: &RedisServer) -> Vec<String> {
    let mut conn = server.conn();
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .arg(100)
        .query(&mut conn)
        .unwrap();
    let mut out = Vec::new();
    for entry in log {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let text: Vec<String> = fields
            .iter()
            .map(|v| match v {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                _ => String::new(),
            })
            .collect();
        let get = |k: &str| {
            text.iter()
                .position(|t| t == k)
                .and_then(|i| text.get(i + 1))
                .cloned()
                .unwrap_or_default()
        };
        out.push(format!(
            "{} {} {} ({})",
            get("username"),
            get("reason"),
            get("object"),
            get("context")
        ));
    }
    out
}

/// The core as user `user`: two clients, a lock with re-entry held over three leases (so it
/// is renewed), `is_locked()`, a waiter of the other client woken by the release. Returns what went wrong.
fn run_core(server: &RedisServer, user: &str, renew: bool) -> Result<(), String> {
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    let name = common::unique_name(&format!("acl-{user}"));
    let lease = Duration::from_millis(600);
    let mut admin = server.conn();
    with_deadline(Duration::from_secs(30), move || {
        let build = || {
            Client::builder(&url)
                .lease(lease)
                .command_timeout(Duration::from_secs(1))
                .build()
                .map_err(|e| format!("build: {e}"))
        };
        let (a, b) = (build()?, build()?);
        let ma = a.mutex(&name).unwrap();
        let g = ma.lock().map_err(|e| format!("lock: {e}"))?;
        // Time is the point: the lease runs down by a few milliseconds, so that the re-entry
        // moves it back to a whole lease (`PEXPIRE`; within the same millisecond it has
        // nothing to extend).
        thread::sleep(Duration::from_millis(10));
        let inner = ma.lock().map_err(|e| format!("re-entry: {e}"))?;
        drop(inner);
        if !ma.is_locked().map_err(|e| format!("is_locked: {e}"))? {
            return Err("is_locked() says free".into());
        }
        let mb = b.mutex(&name).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            let r = mb
                .try_lock_for(Duration::from_secs(10))
                .map(|g| g.map(|g| g.fencing_token()));
            tx.send((Instant::now(), r)).unwrap();
        });
        let channel = common::release_channel(&name);
        if !common::wait_until(Duration::from_secs(5), || {
            common::numsub(&mut admin, &channel) >= 1
        }) {
            // Still let the waiter finish before saying so.
            drop(g);
            let _ = rx.recv_timeout(Duration::from_secs(15));
            let _ = waiter.join();
            return Err("the waiter never subscribed".into());
        }
        if renew {
            thread::sleep(3 * lease);
        }
        if !g.is_held() {
            return Err("the lease was not renewed".into());
        }
        let released = Instant::now();
        g.unlock().map_err(|e| format!("unlock: {e}"))?;
        let (at, r) = rx.recv_timeout(Duration::from_secs(15)).unwrap();
        waiter.join().unwrap();
        match r {
            Ok(Some(_)) if at - released < Duration::from_secs(1) => Ok(()),
            other => Err(format!(
                "waiter: {other:?} {:?} after the release",
                at - released
            )),
        }
    })
}

/// The whole core under exactly the minimal rule: it works, the server logs no denial, and
/// the pub/sub connection authenticated as that user too.
#[test]
fn whole_core_under_the_minimal_rule() {
    let server = RedisServer::start();
    set_user(&server, "locksmith", &[]);
    run_core(&server, "locksmith", true).unwrap();
    let denials = acl_denials(&server);
    let unexpected: Vec<_> = denials.iter().filter(|d| !optional(d)).collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
    // Without `FUNCTION LOAD` and `FCALL`, every script went as EVALSHA.
    let stats = common::commandstats(&mut server.conn());
    assert_eq!(common::calls(&stats, "cmdstat_fcall"), 0);
}

/// With `+function|load +fcall` added to the rule, the Mutex acquire and release go as
/// `FCALL` of the function library, and nothing is denied.
#[test]
fn functions_run_where_the_rule_allows_them() {
    let server = RedisServer::start();
    set_user_plus(&server, "locksmith", &[], &["function|load", "fcall"]);
    run_core(&server, "locksmith", true).unwrap();
    let unexpected: Vec<_> = acl_denials(&server)
        .into_iter()
        .filter(|d| !d.contains("config|get") && !d.contains("client|setname"))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
    let stats = common::commandstats(&mut server.conn());
    // Two acquires and a re-entry, two releases; the renewals stay EVALSHA.
    assert!(common::calls(&stats, "cmdstat_fcall") >= 4, "{stats:?}");
    assert!(common::calls(&stats, "cmdstat_evalsha") >= 1, "{stats:?}");
}

/// With `FUNCTION LOAD` allowed but `FCALL` refused, the client stays on EVALSHA: the core
/// works, and the only denial is the one `FCALL` it tried at `build()`.
#[test]
fn a_refused_fcall_leaves_the_scripts_on_evalsha() {
    let server = RedisServer::start();
    set_user_plus(&server, "locksmith", &[], &["function|load"]);
    run_core(&server, "locksmith", false).unwrap();
    let stats = common::commandstats(&mut server.conn());
    assert_eq!(common::calls(&stats, "cmdstat_fcall"), 0, "{stats:?}");
    let fcall_denials = acl_denials(&server)
        .iter()
        .filter(|d| d.contains("fcall"))
        .count();
    // One per client built (run_core builds two).
    assert!(fcall_denials <= 2, "{fcall_denials}");
}

/// The pub/sub handshake authenticates as the URL's user (it would be `default` otherwise).
#[test]
fn pubsub_connection_authenticates_as_the_user() {
    let server = RedisServer::start();
    set_user(&server, "locksmith", &[]);
    // `default` may not subscribe: only the user's own pub/sub connection can.
    let mut admin = server.conn();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-subscribe")
        .exec(&mut admin)
        .unwrap();
    let url = format!("redis://locksmith:pw@127.0.0.1:{}/", server.port());
    let c = Client::builder(&url).build().unwrap();
    let name = common::unique_name("acl-pubsub");
    let m = c.mutex(&name).unwrap();
    let held = Client::open(&url).unwrap();
    let hm = held.mutex(&name).unwrap();
    let g = hm.lock().unwrap();
    let w = thread::spawn(move || m.try_lock_for(Duration::from_secs(10)).unwrap().is_some());
    common::wait_numsub(&mut admin, &common::release_channel(&name), 1);
    let users: Vec<String> = common::client_list(&mut admin)
        .into_iter()
        .filter(|l| l.contains(" sub=1 "))
        .collect();
    assert!(
        !users.is_empty() && users.iter().all(|l| l.contains(" user=locksmith ")),
        "{users:?}"
    );
    g.unlock().unwrap();
    assert!(w.join().unwrap());
}

/// Each command of the rule is needed: without it, the core either fails or the server logs
/// a denial of it. (Renewal is left out: its script calls nothing the others do not.)
#[test]
fn every_command_of_the_rule_is_needed() {
    let server = RedisServer::start();
    for (i, cmd) in RULE_COMMANDS.iter().enumerate() {
        let user = format!("without{i}");
        set_user(&server, &user, &[cmd]);
        // Each run loads the scripts itself.
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec(&mut server.conn())
            .unwrap();
        let r = run_core(&server, &user, false);
        let denied = acl_denials(&server)
            .iter()
            .any(|d| d.starts_with(&format!("{user} ")) && d.contains(&format!(" {cmd} ")));
        println!("without {cmd}: {r:?}, denial logged: {denied}");
        assert!(r.is_err() || denied, "`{cmd}` is not needed");
    }
}

/// An ACL user over TLS: both apply together.
#[test]
fn acl_user_over_tls() {
    if common::skip_without_tls("acl_user_over_tls") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    set_user(&server, "locksmith", &[]);
    let url = format!("rediss://locksmith:pw@127.0.0.1:{}/", server.tls_port());
    let c = Client::builder(&url)
        .tls_root_cert(files.ca_pem())
        .build()
        .unwrap();
    let m = c.mutex(&common::unique_name("acl-tls")).unwrap();
    m.lock().unwrap().unlock().unwrap();
    let unexpected: Vec<_> = acl_denials(&server)
        .into_iter()
        .filter(|d| !optional(d))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");
}
