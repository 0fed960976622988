//! Child processes: the bench re-runs its own executable with `--child ROLE ARGS...`; parent
//! and child talk in lines over the child's stdin and stdout. Every read is bounded, and a
//! child is killed when its handle is dropped (also while unwinding from a failed workload).
//!
//! The child's side: `child_main` in `main.rs` dispatches a role to the file of its
//! workload, [`child_input`] and [`say`] are its lines, and [`Waiter`] is the lock a waiting
//! child takes, locksmith's or the naive one.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Mutex as LockMutex};

use crate::context::NAIVE_LEASE;
use crate::naive::NaiveLock;
use crate::support::s;

/// The parent's handle on one child.
#[derive(Debug)]
pub struct ChildProc {
    pub label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<String>,
}

impl ChildProc {
    /// Starts `current_exe --child role args...`.
    pub fn spawn(label: &str, role: &str, args: &[String]) -> Result<ChildProc, String> {
        ChildProc::spawn_via(label, &[], role, args)
    }

    /// Starts `wrapper... current_exe --child role args...`: `wrapper` is a command that runs
    /// the next one in its own process (`taskset -c ...`, `chrt --idle 0`), or nothing.
    pub fn spawn_via(
        label: &str,
        wrapper: &[String],
        role: &str,
        args: &[String],
    ) -> Result<ChildProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        let mut child = cmd
            .arg("--child")
            .arg(role)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn child {label}: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("child without stdout")?;
        let (tx, rx) = mpsc::channel();
        thread::Builder::new()
            .name("bench-child-rx".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| format!("reader thread: {e}"))?;
        Ok(ChildProc {
            label: label.to_owned(),
            child,
            stdin,
            rx,
        })
    }

    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let w = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(w, "{line}")
            .and_then(|()| w.flush())
            .map_err(|e| format!("write to child {}: {e}", self.label))
    }

    /// The next line, waiting at most `timeout`.
    pub fn recv(&self, timeout: Duration) -> Result<String, String> {
        self.rx.recv_timeout(timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => {
                format!("child {} said nothing within {timeout:?}", self.label)
            }
            RecvTimeoutError::Disconnected => format!("child {} exited", self.label),
        })
    }

    /// The rest of the next line starting with `word`; other lines are an error.
    pub fn expect(&self, word: &str, timeout: Duration) -> Result<String, String> {
        let line = self.recv(timeout)?;
        match line.split_once(' ') {
            Some((w, rest)) if w == word => Ok(rest.to_owned()),
            None if line == word => Ok(String::new()),
            _ => Err(format!(
                "child {}: expected `{word}`, got `{}`",
                self.label,
                truncate(&line, 200)
            )),
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        // Closing stdin ends the child; kill it if it has not gone within a second.
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The child's side: lines from the parent. EOF on stdin ends the process, and so does a
/// watchdog after `max_life`, so that no child outlives a crashed or hung parent.
pub fn child_input(max_life: Duration) -> Receiver<String> {
    let _ = thread::Builder::new()
        .name("bench-watchdog".into())
        .spawn(move || {
            thread::sleep(max_life);
            eprintln!("bench child {}: watchdog expired", std::process::id());
            std::process::exit(3);
        });
    let (tx, rx) = mpsc::channel();
    let _ = thread::Builder::new()
        .name("bench-stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if line == "quit" || tx.send(line).is_err() {
                    break;
                }
            }
            std::process::exit(0);
        });
    rx
}

/// Writes one line to the parent.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Argument `i` of a child role.
pub fn arg(a: &[String], i: usize) -> Result<&str, String> {
    a.get(i)
        .map(String::as_str)
        .ok_or_else(|| format!("missing argument {i}"))
}

/// A waiter's lock: locksmith's, or the naive one.
pub enum Waiter {
    Ls(LockMutex),
    Naive(NaiveLock),
}

impl Waiter {
    pub fn new(client: Option<&Client>, url: &str, name: &str) -> Result<Waiter, String> {
        Ok(match client {
            Some(c) => Waiter::Ls(c.mutex(name).map_err(s)?),
            None => Waiter::Naive(NaiveLock::new(url, name, NAIVE_LEASE).map_err(s)?),
        })
    }

    /// Waits until `deadline` for the lock; runs `held` while holding it, then releases.
    /// `first_miss` runs after the naive lock's first failed attempt. Ok(false): timed out.
    pub fn with_lock(
        &mut self,
        deadline: Instant,
        first_miss: impl FnMut(),
        held: impl FnOnce() -> Result<(), String>,
    ) -> Result<bool, String> {
        match self {
            Waiter::Ls(m) => match m.try_lock_until(deadline).map_err(s)? {
                Some(g) => {
                    let r = held();
                    g.unlock().map_err(s)?;
                    r.map(|()| true)
                }
                None => Ok(false),
            },
            Waiter::Naive(l) => match l.acquire_until(deadline, first_miss).map_err(s)? {
                Some(t) => {
                    let r = held();
                    if !l.release(&t).map_err(s)? {
                        return Err("naive lock was lost before release".into());
                    }
                    r.map(|()| true)
                }
                None => Ok(false),
            },
        }
    }
}
