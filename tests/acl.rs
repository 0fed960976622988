//! ACL users: the rules that `docs/deployments.md` gives are taken from its text and run, each
//! under a program that uses every call of the lock types it covers (several locks held at
//! once through several renewal periods, a `MultiMutex`, a waiter woken by a release,
//! `force_unlock`), as that user, on command AND pub/sub connections, with `ACL LOG` empty at
//! the end; and each command of the `Mutex` rule is needed.
//! (A user without `SUBSCRIBE` is in `tests/fault_refusals.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::capture;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, ServerCert, TlsFiles, with_deadline};
use locksmith::{Client, LockKind};

/// The deployment guide, whose rules these tests run.
const DEPLOYMENTS: &str = include_str!("../docs/deployments.md");

/// The rule that `docs/deployments.md` marks `<!-- acl-rule: NAME -->`: the words of the fenced
/// `ACL SETUSER` block that follows the mark, after the user name (the password `>password`
/// becomes `>pw`).
fn doc_rule(name: &str) -> Vec<String> {
    let mark = format!("<!-- acl-rule: {name} -->");
    let at = DEPLOYMENTS
        .find(&mark)
        .unwrap_or_else(|| panic!("docs/deployments.md has no `{mark}`"));
    let rest = &DEPLOYMENTS[at + mark.len()..];
    let open = rest.find("```").expect("a fenced block after the mark");
    let body = &rest[open..];
    let body = &body[body.find('\n').unwrap() + 1..];
    let body = &body[..body.find("```").expect("the fenced block ends")];
    let words: Vec<&str> = body.split_whitespace().collect();
    assert_eq!(
        words.get(..2),
        Some(&["ACL", "SETUSER"][..]),
        "the `{name}` rule is not an ACL SETUSER: {body}"
    );
    assert!(
        words.contains(&&*format!("~{}*", common::PREFIX)),
        "the `{name}` rule is not for the prefix {}",
        common::PREFIX
    );
    words[3..]
        .iter()
        .map(|w| {
            if *w == ">password" {
                ">pw".to_owned()
            } else {
                (*w).to_owned()
            }
        })
        .collect()
}

/// The commands a rule allows (its `+` words).
fn rule_commands(rule: &[String]) -> Vec<String> {
    rule.iter()
        .filter_map(|w| w.strip_prefix('+'))
        .map(str::to_owned)
        .collect()
}

/// The commands of the minimal rule (`Mutex` and `MultiMutex`), as `docs/deployments.md`
/// gives them.
fn mutex_rule_commands() -> Vec<String> {
    rule_commands(&doc_rule("mutex"))
}

/// Creates user `user` with `rule` (words after the user name, as in the doc), less the
/// commands in `without`, plus those in `plus`.
fn set_user_rule(
    server: &RedisServer,
    user: &str,
    rule: &[String],
    without: &[&str],
    plus: &[&str],
) {
    let mut conn = server.conn();
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER").arg(user).arg("reset");
    for w in rule {
        if !w
            .strip_prefix('+')
            .is_some_and(|cmd| without.contains(&cmd))
        {
            c.arg(w);
        }
    }
    for cmd in plus {
        c.arg(format!("+{cmd}"));
    }
    c.exec(&mut conn).unwrap();
}

/// Creates user `user` (password `pw`) with the minimal rule of the doc, less the commands in
/// `without`.
fn set_user(server: &RedisServer, user: &str, without: &[&str]) {
    set_user_plus(server, user, without, &[]);
}

/// Like [`set_user`], with the commands in `plus` allowed as well.
fn set_user_plus(server: &RedisServer, user: &str, without: &[&str], plus: &[&str]) {
    set_user_rule(server, user, &doc_rule("mutex"), without, plus);
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

/// Builds a client as `user` with a short lease (600 ms, renewed every 200 ms).
fn client_as(server: &RedisServer, user: &str) -> Result<Client, String> {
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    Client::builder(&url)
        .lease(LEASE)
        .command_timeout(Duration::from_secs(1))
        .build()
        .map_err(|e| format!("build: {e}"))
}

/// The lease of the programs below: short, so that holding for [`HOLD`] spans several renewals.
const LEASE: Duration = Duration::from_millis(600);

/// How long the programs hold their locks: two leases, six renewal periods. Time is the point
/// here (the renewals must run), not a stand-in for synchronisation.
const HOLD: Duration = Duration::from_millis(1200);

/// A waiter of `waiting` on `name`'s lock, woken by the release that `release` makes: it must
/// have the lock within a second of the release. `sleeping` tells when the waiter sleeps.
fn woken_by_release(
    try_take: impl FnOnce() -> Result<bool, String> + Send + 'static,
    sleeping: impl FnMut() -> bool,
    release: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let r = try_take();
        tx.send((Instant::now(), r)).unwrap();
    });
    let asleep = common::wait_until(Duration::from_secs(5), sleeping);
    let released = Instant::now();
    let r = release();
    let (at, got) = rx
        .recv_timeout(Duration::from_secs(15))
        .map_err(|e| format!("waiter: {e}"))?;
    waiter.join().unwrap();
    r?;
    if !asleep {
        return Err("the waiter never went to sleep".into());
    }
    match got {
        Ok(true) if at - released < Duration::from_secs(1) => Ok(()),
        other => Err(format!(
            "waiter: {other:?} {:?} after the release",
            at - released
        )),
    }
}

/// The `Mutex` program, as `user`: three `Mutex`es (one re-entered) and a two-name
/// `MultiMutex` held at once for six renewal periods, `is_locked()`, a waiter of another
/// client woken by a release, and `force_unlock` of a lock another client holds.
fn run_mutexes(server: &RedisServer, user: &str) -> Result<(), String> {
    let (a, b) = (client_as(server, user)?, client_as(server, user)?);
    let mut admin = server.conn();
    with_deadline(Duration::from_secs(30), move || {
        let names: Vec<String> = (0..3)
            .map(|i| common::unique_name(&format!("acl-{i}")))
            .collect();
        let mutexes: Vec<_> = names.iter().map(|n| a.mutex(n).unwrap()).collect();
        let mut guards = Vec::new();
        for m in &mutexes {
            guards.push(m.lock().map_err(|e| format!("lock: {e}"))?);
        }
        // A re-entry a little later moves the lease back to a whole one (`PEXPIRE`).
        thread::sleep(Duration::from_millis(10));
        let inner = mutexes[0].lock().map_err(|e| format!("re-entry: {e}"))?;
        drop(inner);
        let multi = a
            .multi_lock([common::unique_name("acl-m1"), common::unique_name("acl-m2")])
            .unwrap();
        let set = multi.lock().map_err(|e| format!("multi lock: {e}"))?;
        if !mutexes[1]
            .is_locked()
            .map_err(|e| format!("is_locked: {e}"))?
        {
            return Err("is_locked() says free".into());
        }
        thread::sleep(HOLD);
        for (g, n) in guards.iter().zip(&names) {
            g.check()
                .map_err(|e| format!("`{n}` after {HOLD:?}: {e}"))?;
        }
        set.check()
            .map_err(|e| format!("multi after {HOLD:?}: {e}"))?;
        set.unlock().map_err(|e| format!("multi unlock: {e}"))?;
        // A waiter of the other client, woken by the release of the last lock.
        let last = guards.pop().unwrap();
        let mb = b.mutex(&names[2]).unwrap();
        let channel = common::release_channel(&names[2]);
        woken_by_release(
            move || {
                mb.try_lock_for(Duration::from_secs(10))
                    .map(|g| g.is_some())
                    .map_err(|e| e.to_string())
            },
            || common::numsub(&mut admin, &channel) >= 1,
            || last.unlock().map_err(|e| format!("unlock: {e}")),
        )?;
        for g in guards {
            g.unlock().map_err(|e| format!("unlock: {e}"))?;
        }
        // `force_unlock` of a lock the other client holds: its guard learns of the loss.
        let victim = b.mutex(&names[0]).unwrap();
        let held = victim.lock().map_err(|e| format!("lock: {e}"))?;
        if !mutexes[0]
            .force_unlock()
            .map_err(|e| format!("force_unlock: {e}"))?
        {
            return Err("force_unlock found nobody".into());
        }
        if held.unlock().is_ok() {
            return Err("unlock() after force_unlock was Ok".into());
        }
        Ok(())
    })
}

/// The program of the other lock types, as `user`: two `FairMutex`es, an `RwLock` read and
/// another's write, two `Semaphore` permits held at once for six renewal periods; a
/// `FairMutex` waiter of another client woken by a release; `force_unlock` of each type and
/// `Client::force_unlock`; `Client::locks` (a `SCAN`) and the holders.
fn run_other_types(server: &RedisServer, user: &str) -> Result<(), String> {
    let (a, b) = (client_as(server, user)?, client_as(server, user)?);
    with_deadline(Duration::from_secs(30), move || {
        let e = |what: &'static str| move |e: locksmith::Error| format!("{what}: {e}");
        let fair: Vec<_> = (0..2)
            .map(|i| {
                a.fair_mutex(&common::unique_name(&format!("acl-f{i}")))
                    .unwrap()
            })
            .collect();
        let rw: Vec<_> = (0..2)
            .map(|i| {
                a.rw_lock(&common::unique_name(&format!("acl-rw{i}")))
                    .unwrap()
            })
            .collect();
        let sem = a.semaphore(&common::unique_name("acl-sem"), 3).unwrap();
        let f0 = fair[0].lock().map_err(e("fair lock"))?;
        let f1 = fair[1].lock().map_err(e("fair lock"))?;
        let r0 = rw[0].read().map_err(e("read"))?;
        let w1 = rw[1].write().map_err(e("write"))?;
        let p1 = sem.acquire().map_err(e("acquire"))?;
        let p2 = sem.acquire_many(2).map_err(e("acquire_many"))?;
        thread::sleep(HOLD);
        f0.check().map_err(e("fair after the hold"))?;
        f1.check().map_err(e("fair after the hold"))?;
        r0.check().map_err(e("read after the hold"))?;
        w1.check().map_err(e("write after the hold"))?;
        p1.check().map_err(e("permit after the hold"))?;
        p2.check().map_err(e("permits after the hold"))?;
        // Who holds what, as an operator asks.
        let listed = a.locks("acl-").map_err(e("locks"))?.count();
        if listed == 0 {
            return Err("Client::locks listed nothing".into());
        }
        fair[0].holder().map_err(e("holder"))?;
        rw[0].readers().map_err(e("readers"))?;
        sem.holders().map_err(e("holders"))?;
        sem.available().map_err(e("available"))?;
        // A waiter of the other client, woken by the release.
        let fb = b.fair_mutex(fair[1].name()).unwrap();
        let queued = a.fair_mutex(fair[1].name()).unwrap();
        woken_by_release(
            move || {
                fb.try_lock_for(Duration::from_secs(10))
                    .map(|g| g.is_some())
                    .map_err(|e| e.to_string())
            },
            || queued.waiters().is_ok_and(|n| n >= 1),
            || f1.unlock().map_err(|e| format!("fair unlock: {e}")),
        )?;
        r0.unlock().map_err(e("read unlock"))?;
        p1.unlock().map_err(e("release"))?;
        // force_unlock of each type, and by name, of locks the other client holds.
        let held_fair = b.fair_mutex(fair[1].name()).unwrap();
        let hf = held_fair.lock().map_err(e("fair lock"))?;
        if !fair[1].force_unlock().map_err(e("fair force_unlock"))? {
            return Err("fair force_unlock found nobody".into());
        }
        if !rw[1].force_unlock().map_err(e("rw force_unlock"))? {
            return Err("rw force_unlock found nobody".into());
        }
        if !sem.force_unlock().map_err(e("semaphore force_unlock"))? {
            return Err("semaphore force_unlock found nobody".into());
        }
        if !a
            .force_unlock(fair[0].name(), LockKind::FairMutex)
            .map_err(e("Client::force_unlock"))?
        {
            return Err("Client::force_unlock found nobody".into());
        }
        for (what, r) in [
            ("fair", hf.unlock()),
            ("fair", f0.unlock()),
            ("write", w1.unlock()),
            ("permits", p2.unlock()),
        ] {
            if r.is_ok() {
                return Err(format!("{what} unlock after force_unlock was Ok"));
            }
        }
        Ok(())
    })
}

/// Asserts that the server logged no denial but of the optional commands.
fn assert_no_denial(server: &RedisServer) {
    let unexpected: Vec<_> = acl_denials(server)
        .into_iter()
        .filter(|d| !optional(d))
        .collect();
    assert!(unexpected.is_empty(), "ACL LOG: {unexpected:?}");
}

/// The `Mutex` rule of `docs/deployments.md`, from its text: several locks held at once through
/// several renewals (the batch renewal script), a `MultiMutex`, a waiter, `force_unlock`, and
/// not one denial.
#[test]
fn the_doc_mutex_rule_runs_every_mutex_call() {
    let server = RedisServer::start();
    set_user_rule(&server, "locksmith", &doc_rule("mutex"), &[], &[]);
    if let Err(e) = run_mutexes(&server, "locksmith") {
        panic!("{e}; ACL LOG: {:?}", acl_denials(&server));
    }
    assert_no_denial(&server);
}

/// The rule for every lock type, from the text of `docs/deployments.md`: the `Mutex` program
/// and the other types' program under it, and not one denial.
#[test]
fn the_doc_rule_for_every_type_runs_every_call() {
    let server = RedisServer::start();
    set_user_rule(&server, "locksmith", &doc_rule("all"), &[], &[]);
    for r in [
        run_mutexes(&server, "locksmith"),
        run_other_types(&server, "locksmith"),
    ] {
        if let Err(e) = r {
            panic!("{e}; ACL LOG: {:?}", acl_denials(&server));
        }
    }
    assert_no_denial(&server);
}

/// A renewal the server refuses for a permission (here the doc's `Mutex` rule less
/// `PEXPIREAT`, which renews two or more leases at once) is not a lost race: one `error` line
/// per client names the rule to fix and `ACL DRYRUN`, and the leases are reported lost for
/// that reason.
#[test]
fn a_renewal_refused_for_a_permission_is_logged_once_at_error() {
    capture::install();
    let server = RedisServer::start();
    set_user(&server, "nopexpireat", &["pexpireat"]);
    let client = client_as(&server, "nopexpireat").unwrap();
    let names: Vec<String> = (0..3)
        .map(|i| common::unique_name(&format!("acl-refused-{i}")))
        .collect();
    let warns_of_ours = || -> Vec<String> {
        capture::lines()
            .into_iter()
            .filter(|l| l.level == log::Level::Warn && l.text.contains("acl-refused-"))
            .map(|l| l.text)
            .collect()
    };
    let (lost, reported) = with_deadline(Duration::from_secs(30), move || {
        let mutexes: Vec<_> = names.iter().map(|n| client.mutex(n).unwrap()).collect();
        let guards: Vec<_> = mutexes.iter().map(|m| m.lock().unwrap()).collect();
        // Until the leases run out unrenewed (the local deadline: one lease at most), and the
        // renewal thread reports each loss; the guards live until then.
        let lost = common::wait_until(Duration::from_secs(10), || {
            guards.iter().all(|g| !g.is_held())
        });
        let reported = common::wait_until(Duration::from_secs(5), || warns_of_ours().len() >= 3);
        drop(guards);
        (lost, reported)
    });
    assert!(lost, "the leases were renewed without PEXPIREAT");
    let ours = |l: &capture::Line| l.target.starts_with("locksmith");
    let lines: Vec<capture::Line> = capture::lines().into_iter().filter(ours).collect();
    let errors: Vec<&capture::Line> = lines
        .iter()
        .filter(|l| l.level == log::Level::Error && l.text.contains("for a permission"))
        .collect();
    assert_eq!(errors.len(), 1, "{lines:#?}");
    let e = &errors[0].text;
    assert_eq!(errors[0].target, "locksmith::renewal");
    assert!(e.contains("ACL DRYRUN"), "{e}");
    // Redis 7.2 and Valkey name the command; 7.0 does not, and the line says what to add.
    assert!(e.contains("`+pexpireat`") || e.contains("PEXPIREAT"), "{e}");
    let warns = warns_of_ours();
    assert!(reported, "{warns:#?}");
    assert!(
        warns
            .iter()
            .all(|w| w.contains("refused its renewal for a permission")),
        "{warns:#?}"
    );
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

/// Each command of the `Mutex` rule of the doc is needed: without it, the `Mutex` program either
/// fails or the server logs a denial of it.
#[test]
fn every_command_of_the_rule_is_needed() {
    let server = RedisServer::start();
    for (i, cmd) in mutex_rule_commands().iter().enumerate() {
        let user = format!("without{i}");
        set_user(&server, &user, &[cmd.as_str()]);
        // Each run loads the scripts itself.
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec(&mut server.conn())
            .unwrap();
        let r = run_mutexes(&server, &user);
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
