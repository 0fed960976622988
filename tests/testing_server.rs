//! `locksmith::testing::Server` (the `testing` feature): a throwaway server that answers, on a
//! port of its own, without persistence, and is gone (no process, no zombie) once dropped; a
//! missing binary, one that exits at once and one that never answers give errors that say so,
//! within the start-up bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{TestChild, child_env, is_child};
use locksmith::testing::Server;

/// The process id of the server at `url`, from `INFO server`.
fn server_pid(url: &str) -> u32 {
    let mut conn = common::connect(url, Duration::from_secs(5)).unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:")?.trim().parse().ok())
        .expect("a process id")
}

/// A config value of the server at `url`.
fn config(url: &str, name: &str) -> String {
    let mut conn = common::connect(url, Duration::from_secs(5)).unwrap();
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(&mut conn)
        .unwrap();
    pair.get(1).cloned().unwrap_or_default()
}

/// Whether process `pid` exists, a zombie included (Linux: its `/proc` entry).
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_server_answers_on_its_own_port_and_is_gone_once_dropped() {
    let started = Instant::now();
    let a = Server::start().unwrap();
    let b = Server::start().unwrap();
    println!("two servers started in {:?}", started.elapsed());
    assert_ne!(a.port(), b.port());
    assert_eq!(a.url(), format!("redis://127.0.0.1:{}/", a.port()));
    assert_eq!(config(&a.url(), "save"), "");
    assert_eq!(config(&a.url(), "appendonly"), "no");
    assert_eq!(config(&a.url(), "bind"), "127.0.0.1");

    // Locks on one are not seen on the other.
    let name = common::unique_name("testing-server");
    let on_a = locksmith::Client::open(a.url().as_str()).unwrap();
    let on_b = locksmith::Client::open(b.url().as_str()).unwrap();
    let held = on_a
        .mutex(&name)
        .unwrap()
        .with_lock(|_| on_b.mutex(&name).unwrap().is_locked().unwrap())
        .unwrap();
    assert!(!held, "a lock on one server showed on the other");

    let (pid, port, url) = (server_pid(&a.url()), a.port(), a.url());
    assert!(process_exists(pid));
    drop(a);
    assert!(
        !process_exists(pid),
        "the server {pid} is still there (or a zombie)"
    );
    assert!(
        common::connect(&url, Duration::from_millis(500)).is_err(),
        "something still answers on port {port}"
    );
    assert!(server_pid(&b.url()) > 0, "dropping one stopped the other");
}

/// Runs the child `child_start_error` with `envs`: it expects `Server::start` to fail within
/// the bound with an error that contains `expect`.
fn expect_start_error(expect: &str, not_found: bool, envs: &[(&str, String)]) {
    let mut envs = envs.to_vec();
    envs.push(("LS_EXPECT", expect.to_owned()));
    envs.push(("LS_NOT_FOUND", u8::from(not_found).to_string()));
    let mut child = TestChild::spawn("child_start_error", "start-error", &envs);
    let status = child.wait_timeout(Duration::from_secs(30));
    assert!(status.success(), "the child failed: {status}");
}

/// Entry point of the children of the tests below.
#[test]
fn child_start_error() {
    if !is_child("start-error") {
        return;
    }
    let started = Instant::now();
    let e = Server::start().expect_err("no server should have started");
    let took = started.elapsed();
    let text = e.to_string();
    println!("after {took:?}: {text}");
    assert!(text.contains(&child_env("LS_EXPECT")), "{text}");
    assert_eq!(e.is_not_found(), child_env("LS_NOT_FOUND") == "1", "{e:?}");
    assert!(took < Duration::from_secs(11), "took {took:?}");
    if let Ok(pid_file) = std::env::var("LS_PID_FILE") {
        let pid: u32 = std::fs::read_to_string(pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!process_exists(pid), "the server {pid} was left running");
    }
}

#[test]
fn a_missing_binary_says_how_to_name_one() {
    let empty = std::env::temp_dir().join(common::unique_name("empty-path"));
    std::fs::create_dir_all(&empty).unwrap();
    expect_start_error(
        "redis-server not found on PATH; set LOCKSMITH_TEST_SERVER",
        true,
        &[
            ("PATH", empty.to_string_lossy().into_owned()),
            ("LOCKSMITH_TEST_SERVER", String::new()),
        ],
    );
    expect_start_error(
        "`/nonexistent/valkey-server` (from LOCKSMITH_TEST_SERVER) not found",
        true,
        &[("LOCKSMITH_TEST_SERVER", "/nonexistent/valkey-server".into())],
    );
    let _ = std::fs::remove_dir(&empty);
}

#[test]
fn a_server_that_exits_at_once_is_reported_with_what_it_printed() {
    expect_start_error(
        "`/bin/echo` (from LOCKSMITH_TEST_SERVER) exited at start on port ",
        false,
        &[("LOCKSMITH_TEST_SERVER", "/bin/echo".into())],
    );
    expect_start_error(
        "it printed:\n--port ",
        false,
        &[("LOCKSMITH_TEST_SERVER", "/bin/echo".into())],
    );
}

/// A "server" that never answers: `Server::start` gives up after its bound and kills it.
#[test]
fn a_server_that_never_answers_is_killed_after_the_bound() {
    let dir = std::env::temp_dir().join(common::unique_name("silent-server"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("silent-server");
    let pid_file = dir.join("pid");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$$\" > '{}'\necho 'silent server, pid' \"$$\"\nexec sleep 60\n",
            pid_file.display()
        ),
    )
    .unwrap();
    let made_executable = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    assert!(made_executable.success());
    let started = Instant::now();
    expect_start_error(
        "did not answer PING on 127.0.0.1:",
        false,
        &[
            (
                "LOCKSMITH_TEST_SERVER",
                script.to_string_lossy().into_owned(),
            ),
            ("LS_PID_FILE", pid_file.to_string_lossy().into_owned()),
        ],
    );
    assert!(started.elapsed() >= Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}
