//! Child processes of a test: the test binary re-runs itself with one `#[test] fn child_xxx()`
//! selected, and that function returns at once unless [`ROLE_VAR`] names its role.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use crate::server::signal;

/// The environment variable naming the role of a child process.
pub const ROLE_VAR: &str = "LOCKSMITH_TEST_ROLE";

/// True in a child process started for `role`. A `#[test] fn child_xxx()` returns at once
/// unless this is true.
pub fn is_child(role: &str) -> bool {
    std::env::var(ROLE_VAR).as_deref() == Ok(role)
}

/// An environment variable of a child process.
///
/// # Panics
/// If it is not set.
pub fn child_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("child needs env var {var}"))
}

/// A child process running one test of the current test binary. Killed and reaped on `Drop`.
#[derive(Debug)]
pub struct TestChild {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
}

impl TestChild {
    /// Re-runs the current test binary with `[test_name, --exact, --nocapture,
    /// --test-threads=1]`, [`ROLE_VAR`] set to `role`, and `envs`. Its stdout is read line by
    /// line (see [`TestChild::wait_line`]) and echoed with a prefix; stderr is inherited.
    pub fn spawn(test_name: &str, role: &str, envs: &[(&str, String)]) -> TestChild {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let tag = format!("[child {role} {}]", child.id());
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("{tag} {line}");
                // If nobody listens any more, keep draining so the child never blocks.
                let _ = tx.send(line);
            }
        });
        TestChild {
            child: Some(child),
            lines,
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits at most `dur` for a stdout line that is `line`, or ends with `" " + line` (libtest
    /// prints `test child_xxx ... ` without a newline before the child's first output).
    ///
    /// # Panics
    /// If the line does not come in time or the child closes its stdout first.
    pub fn wait_line(&self, line: &str, dur: Duration) {
        let deadline = Instant::now() + dur;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.trim() == line || l.trim_end().ends_with(&format!(" {line}")) => {
                    return;
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("child did not print {line:?} within {dur:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("child closed stdout before printing {line:?}")
                }
            }
        }
    }

    /// Waits at most `dur` for a stdout line whose word after `prefix` and a space follows
    /// (after libtest's `test child_xxx ... ` as for [`wait_line`](Self::wait_line)), and
    /// returns that rest of the line.
    ///
    /// # Panics
    /// If no such line comes in time or the child closes its stdout first.
    pub fn wait_prefixed(&self, prefix: &str, dur: Duration) -> String {
        let deadline = Instant::now() + dur;
        let start = format!("{prefix} ");
        let inner = format!(" {prefix} ");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let l = l.trim();
                    let rest = l
                        .strip_prefix(&start)
                        .or_else(|| l.rfind(&inner).map(|i| &l[i + inner.len()..]));
                    if let Some(rest) = rest {
                        return rest.to_owned();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("child did not print {prefix:?} within {dur:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("child closed stdout before printing {prefix:?}")
                }
            }
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`, ...) with the `kill` command.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Waits at most `dur` for the child to exit.
    ///
    /// # Panics
    /// If it is still running after `dur` (it is killed first).
    pub fn wait_timeout(&mut self, dur: Duration) -> ExitStatus {
        let deadline = Instant::now() + dur;
        loop {
            let child = self.child.as_mut().expect("child already reaped");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                self.kill9();
                panic!("child did not exit within {dur:?}; killed");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        self.kill9_quiet();
    }
}

impl TestChild {
    fn kill9_quiet(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
