//! `locksmith` against one real redis-server: the binary run as a user would, with locks
//! held by named threads of this process through the library.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use locksmith::Client;

/// How long a holder's lease is: far longer than any wake-up the tests wait for, so that a
/// waiter that gets the lock within [`WAKE_BOUND`] was woken by a release, not by the lease
/// running out.
const LEASE: Duration = Duration::from_secs(30);
const WAKE_BOUND: Duration = Duration::from_secs(5);

fn client(server: &RedisServer) -> Client {
    Client::builder(server.url())
        .label(LABEL)
        .lease(LEASE)
        .build()
        .unwrap()
}

#[test]
fn list_shows_every_type_as_a_table_and_as_json() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let waiter_client = client(&server);
    let p = unique_name("list");
    let (m, f, rw, s) = (
        format!("{p}:mutex"),
        format!("{p}:fair"),
        format!("{p}:rw"),
        format!("{p}:sem"),
    );

    let mutex = c.mutex(&m).unwrap();
    let held_mutex = hold("worker-1", move || {
        let g = mutex.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let fair = c.fair_mutex(&f).unwrap();
    let held_fair = hold("worker-2", move || {
        let g = fair.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    // One waiter in the fair mutex's queue, from another client.
    let fair_waiter = waiter_client.fair_mutex(&f).unwrap();
    let (waited_tx, waited_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = fair_waiter.try_lock_for(RUN_BOUND).unwrap();
        waited_tx.send(g.is_some()).unwrap();
    });
    let readers: Vec<Held> = ["reader-1", "reader-2"]
        .into_iter()
        .map(|t| {
            let lock = c.rw_lock(&rw).unwrap();
            hold(t, move || (lock.read().unwrap(), 0))
        })
        .collect();
    let sem = c.semaphore(&s, 5).unwrap();
    let held_sem = hold("pool-user", move || (sem.acquire_many(2).unwrap(), 0));

    // The waiter is queued once the fair mutex reports it.
    assert!(
        wait_until(RUN_BOUND, || {
            let r = run(&["--url", &url, "list", &f, "--json"]);
            r.code == 0 && json_lines(&r.stdout)[0]["waiters"] == 1
        }),
        "the fair mutex's waiter never showed"
    );

    let r = run_expect(&["--url", &url, "list", &p], 0);
    let lines: Vec<&str> = r.stdout.lines().collect();
    // A header, and one row per holder: 1 + 1 + 2 readers + 1.
    assert_eq!(lines.len(), 6, "{}", r.stdout);
    for col in [
        "NAME",
        "TYPE",
        "HOLDER",
        "THREAD",
        "COUNT",
        "HELD FOR",
        "LEASE LEFT",
        "TOKEN",
        "WAITERS",
    ] {
        assert!(lines[0].contains(col), "{}", r.stdout);
    }
    let row = |name: &str, thread: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")) && l.contains(thread))
            .unwrap_or_else(|| panic!("no row {name} {thread}:\n{}", r.stdout))
            .to_string()
    };
    let mrow = row(&m, "worker-1");
    assert!(mrow.contains(" mutex ") && mrow.contains(LABEL), "{mrow}");
    assert!(mrow.contains(&held_mutex.token.to_string()), "{mrow}");
    assert!(
        mrow.trim_end().ends_with('-'),
        "a mutex keeps no count: {mrow}"
    );
    let frow = row(&f, "worker-2");
    assert!(
        frow.contains("fair_mutex") && frow.trim_end().ends_with(" 1"),
        "{frow}"
    );
    assert!(frow.contains(&held_fair.token.to_string()), "{frow}");
    assert!(row(&rw, "reader-1").contains("rw_lock (read)"));
    assert!(row(&rw, "reader-2").contains("rw_lock (read)"));
    assert!(row(&s, "pool-user").contains("semaphore"));

    let r = run_expect(&["--url", &url, "list", &p, "--json"], 0);
    let json = json_lines(&r.stdout);
    assert_eq!(json.len(), 4, "one line per lock: {}", r.stdout);
    let jm = json_of(&json, &m, "mutex");
    assert_eq!(jm["label"], LABEL);
    assert_eq!(jm["thread"], "worker-1");
    assert_eq!(jm["hold_count"], 1);
    assert_eq!(jm["fencing_token"], held_mutex.token);
    assert!(jm["waiters"].is_null());
    let held_for = jm["held_for_ms"].as_u64().unwrap();
    let lease_left = jm["lease_left_ms"].as_u64().unwrap();
    assert!(held_for < RUN_BOUND.as_millis() as u64 * 2, "{jm}");
    assert!(
        lease_left > 0 && lease_left <= LEASE.as_millis() as u64,
        "{jm}"
    );
    let jf = json_of(&json, &f, "fair_mutex");
    assert_eq!(jf["thread"], "worker-2");
    assert_eq!(jf["fencing_token"], held_fair.token);
    assert_eq!(jf["waiters"], 1);
    let jr = json_of(&json, &rw, "rw_lock");
    assert_eq!(jr["shared"], true);
    let threads: Vec<&str> = jr["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["thread"].as_str().unwrap())
        .collect();
    assert_eq!(threads.len(), 2);
    assert!(threads.contains(&"reader-1") && threads.contains(&"reader-2"));
    let js = json_of(&json, &s, "semaphore");
    assert_eq!(js["hold_count"], 2);
    assert_eq!(js["fencing_token"], 0);
    assert_eq!(js["label"], LABEL);

    // The name prefix narrows the list.
    let r = run_expect(&["--url", &url, "list", &s, "--json"], 0);
    assert_eq!(json_lines(&r.stdout).len(), 1, "{}", r.stdout);

    held_fair.release();
    assert!(
        waited_rx.recv_timeout(RUN_BOUND).unwrap(),
        "the waiter got the fair mutex"
    );
    waiter.join().unwrap();
    drop((held_mutex, readers, held_sem));
    let r = run_expect(&["--url", &url, "list", &p], 3);
    assert!(r.stdout.is_empty(), "{r:?}");
    assert!(r.stderr.contains("no lock held"), "{r:?}");
}

#[test]
fn the_url_comes_from_redis_url_and_the_prefix_from_the_option() {
    let server = RedisServer::start();
    let other = Client::builder(server.url())
        .label(LABEL)
        .key_prefix("other:")
        .build()
        .unwrap();
    let name = unique_name("prefixed");
    let m = other.mutex(&name).unwrap();
    let _held = hold("prefixed-holder", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let mut cmd = command(&["list", &name]);
    cmd.env("REDIS_URL", server.url());
    let r = run_cmd(cmd);
    assert_eq!(r.code, 3, "not under the default prefix: {r:?}");
    let mut cmd = command(&["list", &name, "--prefix", "other:"]);
    cmd.env("REDIS_URL", server.url());
    let r = run_cmd(cmd);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains(&name) && r.stdout.contains("prefixed-holder"),
        "{r:?}"
    );
    let mut cmd = command(&["show", &name]);
    cmd.env("LOCKSMITH_PREFIX", "other:")
        .env("REDIS_URL", server.url());
    assert_eq!(run_cmd(cmd).code, 0);
}

#[test]
fn show_names_every_type_of_a_name_and_its_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let waiter_client = client(&server);
    let name = unique_name("shown");
    let m = c.mutex(&name).unwrap();
    let held_m = hold("m-holder", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let f = c.fair_mutex(&name).unwrap();
    let held_f = hold("f-holder", move || {
        let g = f.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let fw = waiter_client.fair_mutex(&name).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        done_tx
            .send(fw.try_lock_for(RUN_BOUND).unwrap().is_some())
            .unwrap();
    });
    assert!(wait_until(RUN_BOUND, || {
        run(&["--url", &url, "show", &name])
            .stdout
            .contains("1 in its queue")
    }));

    let r = run_expect(&["--url", &url, "show", &name], 0);
    let out = &r.stdout;
    assert!(out.contains(&format!("mutex \"{name}\": held")), "{out}");
    assert!(
        out.contains(&format!("fair_mutex \"{name}\": held")),
        "{out}"
    );
    assert!(
        out.contains(&format!("holder: {LABEL} (thread m-holder)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("holder: {LABEL} (thread f-holder)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("fencing token {}", held_m.token)),
        "{out}"
    );
    assert!(
        out.contains(&format!("fencing token {}", held_f.token)),
        "{out}"
    );
    assert!(out.contains("waiters: 1 in its queue"), "{out}");
    assert!(
        out.contains("not counted (a mutex keeps no count)"),
        "{out}"
    );

    let r = run_expect(&["--url", &url, "show", &name, "--json"], 0);
    let json = json_lines(&r.stdout);
    assert_eq!(json.len(), 2, "{}", r.stdout);
    assert_eq!(json_of(&json, &name, "fair_mutex")["waiters"], 1);

    held_f.release();
    assert!(done_rx.recv_timeout(RUN_BOUND).unwrap());
    waiter.join().unwrap();
    drop(held_m);
    let r = run_expect(&["--url", &url, "show", &unique_name("nothing")], 3);
    assert!(r.stderr.contains("nothing holds or waits"), "{r:?}");
}

#[test]
fn unlock_yes_frees_the_lock_and_wakes_its_waiter_at_once() {
    let server = RedisServer::start();
    let url = server.url();
    let holder_client = client(&server);
    let waiter_client = client(&server);
    let name = unique_name("stuck");
    let m = holder_client.mutex(&name).unwrap();
    let held = hold("stuck-worker", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let w = waiter_client.mutex(&name).unwrap();
    let (got_tx, got_rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = w.try_lock_for(RUN_BOUND).unwrap();
        got_tx
            .send((Instant::now(), g.as_ref().map(|g| g.fencing_token())))
            .unwrap();
    });
    // The waiter is subscribed to the release channel before the unlock.
    wait_numsub(&mut server.conn(), &release_channel(&name), 1);

    let r = run_expect(&["--url", &url, "unlock", &name, "--yes"], 0);
    let unlocked = Instant::now();
    assert!(
        r.stdout
            .contains(&format!("force-unlocked the mutex \"{name}\"")),
        "{r:?}"
    );
    assert!(
        r.stdout.contains(&format!("{LABEL} (thread stuck-worker)")),
        "{r:?}"
    );
    let (at, token) = got_rx.recv_timeout(RUN_BOUND).unwrap();
    let token = token.expect("the waiter got the lock");
    assert!(
        token > held.token,
        "fencing tokens keep rising: {token} <= {}",
        held.token
    );
    assert!(
        at.saturating_duration_since(unlocked) < WAKE_BOUND,
        "the waiter was woken {:?} after the unlock (the lease is {LEASE:?})",
        at.saturating_duration_since(unlocked)
    );
    waiter.join().unwrap();
    drop(held);
}

#[test]
fn unlock_without_a_terminal_or_yes_refuses_and_changes_nothing() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let name = unique_name("kept");
    let m = c.mutex(&name).unwrap();
    let probe = c.mutex(&name).unwrap();
    let _held = hold("keeper", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let r = run_expect(&["--url", &url, "unlock", &name], 4);
    assert!(
        r.stderr.contains("not a terminal") && r.stderr.contains("--yes"),
        "{r:?}"
    );
    // Piped input is no confirmation either.
    let mut cmd = command(&["--url", &url, "unlock", &name]);
    cmd.stdin(Stdio::piped());
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"yes\n").unwrap();
    }
    let out = with_deadline(RUN_BOUND, move || child.wait_with_output().unwrap());
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(probe.is_locked().unwrap(), "still held");
    let r = run_expect(&["--url", &url, "list", &name, "--json"], 0);
    assert_eq!(json_lines(&r.stdout)[0]["thread"], "keeper");
}

#[test]
fn unlock_asks_which_type_when_several_use_the_name() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let name = unique_name("shared-name");
    let m = c.mutex(&name).unwrap();
    let probe = c.mutex(&name).unwrap();
    let _held_m = hold("m", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let s = c.semaphore(&name, 3).unwrap();
    let _held_s = hold("s", move || (s.acquire().unwrap(), 0));

    let r = run_expect(&["--url", &url, "unlock", &name, "--yes"], 2);
    assert!(
        r.stderr.contains("mutex, semaphore") && r.stderr.contains("--type"),
        "{r:?}"
    );
    assert!(probe.is_locked().unwrap());

    let r = run_expect(
        &[
            "--url",
            &url,
            "unlock",
            &name,
            "--type",
            "semaphore",
            "--yes",
        ],
        0,
    );
    assert!(r.stdout.contains("force-unlocked the semaphore"), "{r:?}");
    assert!(
        probe.is_locked().unwrap(),
        "the mutex of that name is untouched"
    );
    let r = run_expect(&["--url", &url, "list", &name, "--json"], 0);
    let json = json_lines(&r.stdout);
    assert_eq!(json.len(), 1);
    assert_eq!(json[0]["type"], "mutex");
    // Nothing left of that type: not found.
    let r = run_expect(
        &[
            "--url",
            &url,
            "unlock",
            &name,
            "--type",
            "semaphore",
            "--yes",
        ],
        3,
    );
    assert!(r.stderr.contains("nothing holds the semaphore"), "{r:?}");
}

#[test]
fn unlock_of_a_name_nothing_holds_is_not_found() {
    let server = RedisServer::start();
    let r = run_expect(
        &[
            "--url",
            &server.url(),
            "unlock",
            &unique_name("free"),
            "--yes",
        ],
        3,
    );
    assert!(r.stderr.contains("nothing holds"), "{r:?}");
}

#[test]
fn watch_once_draws_the_table_without_escapes() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let name = unique_name("watched");
    let m = c.mutex(&name).unwrap();
    let held = hold("watched-worker", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let r = run_expect(&["--url", &url, "watch", &name, "--once"], 0);
    assert!(r.stdout.starts_with("locksmith watch"), "{r:?}");
    assert_eq!(r.stdout.matches("locksmith watch").count(), 1, "{r:?}");
    assert!(
        r.stdout.contains("releases heard on the release channels"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains(&name) && r.stdout.contains("watched-worker"),
        "{r:?}"
    );
    assert!(r.stdout.contains(&held.token.to_string()), "{r:?}");
    assert!(!r.stdout.contains('\x1b'), "no ANSI without a terminal");

    let r = run_expect(&["--url", &url, "watch", &name, "--count", "2"], 0);
    assert_eq!(r.stdout.matches("locksmith watch").count(), 2, "{r:?}");
}

#[test]
fn watch_shows_releases_as_they_are_published_and_acquisitions_at_the_reread() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let p = unique_name("live");
    let sem_name = format!("{p}:sem");
    let mutex_name = format!("{p}:mutex");
    let sem = c.semaphore(&sem_name, 1).unwrap();
    let held = hold("permit-holder", move || (sem.acquire().unwrap(), 0));

    let mut watch = Watching::start(command(&["--url", &url, "watch", &p, "--count", "1000"]));
    watch.until(RUN_BOUND, "with the permit holder", |l| {
        l.starts_with(&sem_name) && l.contains("permit-holder")
    });
    // A release publishes when someone waits for it.
    let (waiter, got) = permit_waiter(&client(&server), &sem_name);
    wait_flagged(&mut server.conn(), &sem_name);
    held.release();
    watch.until(RUN_BOUND, "with the published release", |l| {
        l.contains(&format!(
            "published semaphore \"{sem_name}\" permit released"
        ))
    });
    assert!(
        got.recv_timeout(RUN_BOUND).unwrap(),
        "the waiter got the permit"
    );
    waiter.join().unwrap();
    // A mutex taken and freed without waiters publishes nothing: the re-read shows it.
    let m = c.mutex(&mutex_name).unwrap();
    let held = hold("mutex-holder", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    watch.until(RUN_BOUND, "with the acquisition", |l| {
        l.contains(&format!(
            "acquired  mutex \"{mutex_name}\" by {LABEL} (thread mutex-holder)"
        ))
    });
    held.release();
    watch.until(RUN_BOUND, "with the release", |l| {
        l.contains(&format!(
            "released  mutex \"{mutex_name}\" by {LABEL} (thread mutex-holder)"
        ))
    });
}

#[test]
fn errors_have_their_exit_codes() {
    let closed = ClosedPort::new();
    let r = run_expect(&["--url", &closed.url(), "--timeout", "2", "list"], 1);
    assert!(r.stderr.starts_with("locksmith: "), "{r:?}");
    assert!(r.stdout.is_empty());

    let r = run_expect(&["--url", "http://127.0.0.1:1/", "list"], 2);
    assert!(r.stderr.contains("scheme"), "{r:?}");
    run_expect(
        &[
            "--url",
            "redis://u:s3cret@127.0.0.1:1/",
            "--cluster",
            "redis://h/",
            "list",
        ],
        2,
    );
    run_expect(&["frobnicate"], 2);
    run_expect(&["unlock"], 2);
    let r = run_expect(&["--url", &closed.url(), "--prefix", "a{b", "list"], 2);
    assert!(
        r.stderr.contains("key_prefix") || r.stderr.contains('{'),
        "{r:?}"
    );

    // A password in a URL never reaches a message.
    let r = run(&[
        "--url",
        &format!("redis://u:s3cret@127.0.0.1:{}/", closed.port()),
        "list",
    ]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(!r.stderr.contains("s3cret"), "{r:?}");
}

#[test]
fn help_documents_every_command_and_the_exit_codes() {
    let r = run_expect(&["--help"], 0);
    for s in [
        "list",
        "show",
        "unlock",
        "watch",
        "--url",
        "--sentinel",
        "--cluster",
        "--prefix",
    ] {
        assert!(r.stdout.contains(s), "{s}: {}", r.stdout);
    }
    assert!(r.stdout.contains("Exit codes"), "{}", r.stdout);
    for sub in ["list", "show", "unlock", "watch"] {
        let r = run_expect(&[sub, "--help"], 0);
        assert!(r.stdout.contains("Exit codes"), "{sub}: {}", r.stdout);
    }
    let r = run_expect(&["list", "--help"], 0);
    assert!(r.stdout.contains("lease_left_ms") && r.stdout.contains("holders"));
    let r = run_expect(&["watch", "--help"], 0);
    assert!(r.stdout.contains("Cluster") && r.stdout.contains("once a second"));
}

#[test]
fn tls_with_a_private_ca() {
    if skip_without_tls("tls_with_a_private_ca") {
        return;
    }
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    let url = server.tls_url();
    let c = Client::builder(&url)
        .label(LABEL)
        .tls_root_cert(files.ca_pem())
        .build()
        .unwrap();
    let name = unique_name("tls");
    let sem = c.semaphore(&name, 1).unwrap();
    let held = hold("tls-worker", move || (sem.acquire().unwrap(), 0));
    let ca = files.path("ca.crt");
    let ca = ca.to_str().unwrap();

    // The system's roots do not know the test CA.
    let r = run_expect(&["--url", &url, "list", &name], 1);
    assert!(
        r.stderr.contains("certificate") || r.stderr.contains("TLS"),
        "{r:?}"
    );
    let r = run_expect(&["--url", &url, "--tls-ca", ca, "list", &name, "--json"], 0);
    assert_eq!(json_lines(&r.stdout)[0]["thread"], "tls-worker");
    let r = run_expect(
        &["--url", &url, "--tls-ca", "/nonexistent/ca.crt", "list"],
        2,
    );
    assert!(r.stderr.contains("--tls-ca"), "{r:?}");

    // The listener of `watch` connects over TLS with the same CA.
    let mut watch = Watching::start(command(&[
        "--url", &url, "--tls-ca", ca, "watch", &name, "--count", "1000",
    ]));
    let header = watch.until(RUN_BOUND, "the header", |l| {
        l.starts_with("locksmith watch")
    });
    assert!(header.contains("releases heard"), "{header}");
    // A release publishes when someone waits for it.
    let (waiter, got) = permit_waiter(&c, &name);
    wait_flagged(&mut server.conn(), &name);
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

/// Runs `locksmith ARGS` on a pseudo-terminal (util-linux `script`), typing `answer`; `None`
/// when `script` is not installed.
fn run_on_a_terminal(args: &[&str], answer: &str) -> Option<Run> {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_locksmith"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-q", "-e", "-c", &quoted.join(" "), "/dev/null"])
        .env_remove("REDIS_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("script: {e}"),
    };
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
    }
    Some(with_deadline(RUN_BOUND, move || {
        Run::from(child.wait_with_output().unwrap())
    }))
}

#[test]
fn unlock_on_a_terminal_asks_and_does_only_what_was_answered() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let name = unique_name("asked");
    let m = c.mutex(&name).unwrap();
    let probe = c.mutex(&name).unwrap();
    let held = hold("asked-worker", move || {
        let g = m.lock().unwrap();
        let t = g.fencing_token();
        (g, t)
    });
    let args = ["--url", url.as_str(), "unlock", name.as_str()];
    let Some(r) = run_on_a_terminal(&args, "n\n") else {
        eprintln!(
            "unlock_on_a_terminal_asks_and_does_only_what_was_answered: skipped, no `script`"
        );
        return;
    };
    assert_eq!(r.code, 4, "{r:?}");
    // The question names the lock and its holder (stderr and stdout share the terminal).
    assert!(
        r.stdout
            .contains(&format!("Force-unlock the mutex \"{name}\"")),
        "{r:?}"
    );
    assert!(
        r.stdout.contains(&format!(
            "held by {LABEL} (thread asked-worker), token {}",
            held.token
        )),
        "{r:?}"
    );
    assert!(r.stdout.contains("not confirmed"), "{r:?}");
    assert!(probe.is_locked().unwrap(), "answered no: still held");

    let r = run_on_a_terminal(&args, "y\n").unwrap();
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("force-unlocked the mutex"), "{r:?}");
    assert!(!probe.is_locked().unwrap(), "answered yes: freed");
    drop(held);
}

#[test]
fn an_election_is_listed_shown_watched_and_unlocked_into_a_new_election() {
    let server = RedisServer::start();
    let url = server.url();
    let c = client(&server);
    let name = unique_name("leader");
    let channel = format!("{PREFIX}{{{}}}:elect:changes", encode_name(&name));
    let e = c.election(&name).unwrap();
    let led = hold("campaigner", move || {
        let l = e.campaign().unwrap();
        l.proclaim("10.0.0.7:8080").unwrap();
        let term = l.term();
        (l, term)
    });
    let term = led.token;

    let r = run_expect(&["--url", &url, "list", &name], 0);
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{r:?}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "election", "{row}");
    assert_eq!(cells[2], LABEL, "{row}");
    assert_eq!(cells[3], "campaigner", "{row}");
    assert_eq!(cells[cells.len() - 2..], [term.to_string().as_str(), "-"]);

    let r = run_expect(&["--url", &url, "list", &name, "--json"], 0);
    let json = json_lines(&r.stdout);
    let v = json_of(&json, &name, "election");
    assert_eq!(v["value"], "10.0.0.7:8080");
    assert_eq!(v["fencing_token"], term);
    assert_eq!(v["thread"], "campaigner");

    let r = run_expect(&["--url", &url, "show", &name], 0);
    let out = &r.stdout;
    assert!(
        out.contains(&format!("election \"{name}\": led (term {term})\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!("  leader: {LABEL} (thread campaigner)\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!("    term          {term}\n")),
        "{out}"
    );
    assert!(out.contains("    value         10.0.0.7:8080\n"), "{out}");
    assert!(out.contains("an election keeps no count"), "{out}");
    let r = run_expect(&["--url", &url, "show", &name, "--json"], 0);
    assert_eq!(json_lines(&r.stdout)[0]["value"], "10.0.0.7:8080");

    // A candidate of another client waits for the leadership.
    let subscribed = numsub(&mut server.conn(), &channel);
    let candidate = client(&server).election(&name).unwrap();
    let (next_tx, next_rx) = mpsc::channel();
    let waiter = thread::Builder::new()
        .name("candidate".into())
        .spawn(move || {
            let l = candidate.try_campaign_for(RUN_BOUND).unwrap();
            next_tx.send(l.as_ref().map(|l| l.term())).unwrap();
            // Leads until the test has seen it.
            thread::sleep(Duration::from_millis(500));
        })
        .unwrap();
    wait_numsub(&mut server.conn(), &channel, subscribed + 1);
    let mut watch = Watching::start(command(&["--url", &url, "watch", &name, "--count", "1000"]));
    watch.until(RUN_BOUND, "with the leader", |l| {
        l.starts_with(&name) && l.contains("campaigner")
    });

    let r = run_expect(&["--url", &url, "unlock", &name, "--type", "election"], 4);
    assert!(r.stderr.contains("--yes"), "{r:?}");
    let r = run_expect(
        &[
            "--url", &url, "unlock", &name, "--type", "election", "--yes",
        ],
        0,
    );
    assert!(
        r.stdout.contains(&format!(
            "force-unlocked the election \"{name}\": ended the leadership of {LABEL} (thread \
             campaigner) (term {term}); a new election follows"
        )),
        "{r:?}"
    );
    let next = next_rx
        .recv_timeout(RUN_BOUND)
        .unwrap()
        .expect("the candidate was elected");
    assert!(next > term, "terms keep rising: {next} <= {term}");
    watch.until(RUN_BOUND, "with the published release", |l| {
        l.contains(&format!(
            "published election \"{name}\" released (the leadership ended"
        ))
    });
    watch.until(RUN_BOUND, "with the new leader's announcement", |l| {
        l.contains(&format!(
            "published election \"{name}\" elected (a new leader)"
        ))
    });
    waiter.join().unwrap();
    drop(led);
}
