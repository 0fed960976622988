//! What the end-to-end tests of `locksmith` share: running the binary as a user would (its
//! arguments, no terminal on stdin, a bound on each run), following a `watch` line by line,
//! and locks held by named threads of this process through the library.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub use locksmith_testkit::*;

/// The bound on one run of the binary (a loaded machine, a cluster's slot map, a listing
/// over every master).
pub const RUN_BOUND: Duration = Duration::from_secs(60);

/// The label of the clients that hold the tests' locks.
pub const LABEL: &str = "cli-test";

/// What a run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    /// The exit code.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().expect("an exit code, not a signal"),
            stdout: String::from_utf8(o.stdout).unwrap(),
            stderr: String::from_utf8(o.stderr).unwrap(),
        }
    }
}

/// The binary under test, without `REDIS_URL` or `LOCKSMITH_*` from the test's environment.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_locksmith"));
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("LOCKSMITH_PREFIX")
        .env_remove("LOCKSMITH_MASTER_PASSWORD");
    cmd
}

/// Runs `locksmith ARGS` with stdin from /dev/null (not a terminal), within [`RUN_BOUND`].
pub fn run_cmd(mut cmd: Command) -> Run {
    cmd.stdin(Stdio::null());
    with_deadline(RUN_BOUND, move || Run::from(cmd.output().unwrap()))
}

/// Runs `locksmith ARGS` ([`run_cmd`]).
pub fn run(args: &[&str]) -> Run {
    run_cmd(command(args))
}

/// Runs `locksmith ARGS` and checks that it exited with `code`.
pub fn run_expect(args: &[&str], code: i32) -> Run {
    let r = run(args);
    assert_eq!(r.code, code, "locksmith {args:?}\n{r:#?}");
    r
}

/// The lines of `list --json` output, parsed.
pub fn json_lines(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The object of `name` and `type` among JSON lines.
pub fn json_of<'a>(
    lines: &'a [serde_json::Value],
    name: &str,
    kind: &str,
) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|v| v["name"] == name && v["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} {name} in {lines:#?}"))
}

/// A lock held by a thread of this process with a given name, until [`Held::release`] (or
/// drop).
pub struct Held {
    release: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// The fencing token of the acquisition (0 where the type has none).
    pub token: u64,
}

impl Held {
    /// Frees the lock (the guard is dropped on its thread) and waits for that thread.
    pub fn release(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.release.take();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !thread::panicking() {
            self.stop();
        }
    }
}

/// Runs `acquire` on a new thread named `thread`; it returns a guard and its fencing token.
/// The guard is kept on that thread until the [`Held`] is released.
pub fn hold<G: 'static>(thread: &str, acquire: impl FnOnce() -> (G, u64) + Send + 'static) -> Held {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let handle = thread::Builder::new()
        .name(thread.to_owned())
        .spawn(move || {
            let (guard, token) = acquire();
            ready_tx.send(token).unwrap();
            // Until the sender is dropped.
            let _ = release_rx.recv();
            drop(guard);
        })
        .unwrap();
    let token = ready_rx
        .recv_timeout(RUN_BOUND)
        .expect("the lock was acquired");
    Held {
        release: Some(release_tx),
        thread: Some(handle),
        token,
    }
}

/// A `locksmith watch` running as a child process, its stdout read line by line.
pub struct Watching {
    child: Child,
    lines: Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Watching {
    /// Starts `cmd` (a `watch`) with its stdout piped.
    pub fn start(mut cmd: Command) -> Watching {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Watching {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `pred` (returned), failing after `bound`.
    pub fn until(&mut self, bound: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + bound;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no line {what} within {bound:?}; seen:\n{}",
                        self.seen.join("\n")
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!(
                        "watch ended before a line {what}; seen:\n{}",
                        self.seen.join("\n")
                    )
                }
            }
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A thread that waits (at most [`RUN_BOUND`]) for a semaphore permit of `name` through its
/// own client, so that the holder's release publishes (a release nobody waits for publishes
/// nothing); it sends whether it got one, and frees it at once.
pub fn permit_waiter(client: &locksmith::Client, name: &str) -> (JoinHandle<()>, Receiver<bool>) {
    let sem = client.semaphore(name, 1).unwrap();
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let got = sem.try_acquire_for(RUN_BOUND).unwrap();
        tx.send(got.is_some()).unwrap();
    });
    (handle, rx)
}

/// Waits until the semaphore `name` (default key prefix) has a waiter's flag: its holder's
/// string ends in `|w` (one holder), or its sorted set holds the member `w` (several).
pub fn wait_flagged(conn: &mut redis::Connection, name: &str) {
    let key = format!("{PREFIX}{{{}}}:sem", encode_name(name));
    let flagged = wait_until(RUN_BOUND, || {
        let kind: String = redis::cmd("TYPE").arg(&key).query(conn).unwrap();
        match kind.as_str() {
            "string" => {
                let v: String = redis::cmd("GET").arg(&key).query(conn).unwrap();
                v.ends_with("|w")
            }
            "zset" => {
                let s: Option<f64> = redis::cmd("ZSCORE").arg(&key).arg("w").query(conn).unwrap();
                s.is_some()
            }
            _ => false,
        }
    });
    assert!(flagged, "no waiter flagged the semaphore {name}");
}
