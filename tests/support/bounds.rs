//! Time bounds of the fair mutex, read-write lock and semaphore calls against a stalled
//! server (`SIGSTOP`): each call is timed and checked against its documented bound, with a
//! generous allowance for a busy machine.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

/// The command timeout of the clients under test.
pub const COMMAND: Duration = Duration::from_millis(300);
/// The connect timeout: longer than the command timeout, so a bound that counts one where the
/// other belongs shows.
pub const CONNECT: Duration = Duration::from_secs(1);
/// The retry timeout of the blocking forms without a deadline.
pub const RETRY: Duration = Duration::from_secs(1);
/// Allowance for scheduling delays on a busy 2-core machine running several tests at once.
pub const SLACK: Duration = Duration::from_secs(1);
/// How long the `_for` / `_until` forms wait.
pub const WAIT: Duration = Duration::from_millis(500);

/// One call within connect + command timeout.
pub const ONE: Duration = Duration::from_millis(1300);

/// The bound of a `_for(WAIT)` / `_until(now + WAIT)` call: `max(WAIT, connect) + command`.
pub fn waiting() -> Duration {
    WAIT.max(CONNECT) + COMMAND
}

/// The bound of a call without a deadline (`lock()`, `read()`, `acquire()`):
/// `max(retry, connect + command)`.
pub fn retrying() -> Duration {
    RETRY.max(ONE)
}

/// A client with the timeouts above.
pub fn client(url: &str) -> locksmith::Client {
    locksmith::Client::builder(url)
        .command_timeout(COMMAND)
        .connect_timeout(CONNECT)
        .retry_timeout(RETRY)
        .build()
        .unwrap()
}

/// Sends `SIGCONT` to a process when dropped, so that a failing test never leaves a stopped
/// `redis-server` behind.
pub struct ContinueOnDrop(pub u32);

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        locksmith_testkit::signal(self.0, "CONT");
    }
}

/// Timed calls and their bounds.
#[derive(Debug, Default)]
pub struct Timings(Vec<(String, Duration, Duration, String, bool)>);

impl Timings {
    /// Times `f` (which describes its outcome) against `bound`; `must_fail`: the call cannot
    /// succeed while the server is stalled.
    pub fn time(
        &mut self,
        what: impl Into<String>,
        bound: Duration,
        must_fail: bool,
        f: impl FnOnce() -> String,
    ) {
        let start = Instant::now();
        let outcome = f();
        let took = start.elapsed();
        let what = what.into();
        println!("{what}: {outcome} after {took:?} (bound {bound:?} + slack)");
        self.0.push((what, took, bound, outcome, must_fail));
    }

    /// Asserts that every call kept its bound (plus [`SLACK`]) and failed where it must.
    pub fn assert_kept(&self) {
        let mut failures = Vec::new();
        for (what, took, bound, outcome, must_fail) in &self.0 {
            if *took > *bound + SLACK {
                failures.push(format!("{what}: took {took:?}, bound {bound:?}"));
            }
            if *must_fail && !outcome.starts_with("Err") {
                failures.push(format!("{what}: {outcome} against a stalled server"));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

pub fn show<T>(r: &locksmith::Result<T>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("Err({e})"),
    }
}

pub fn show_opt<T>(r: &locksmith::Result<Option<T>>) -> String {
    match r {
        Ok(Some(_)) => "Ok(Some)".into(),
        Ok(None) => "Ok(None)".into(),
        Err(e) => format!("Err({e})"),
    }
}
