//! Time bounds of every lock type's calls against a stalled server (`SIGSTOP`), a black hole
//! or a closed port: each call is timed and checked against its documented bound, with a
//! generous allowance for a busy machine.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use super::kinds::Kind;

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
#[derive(Debug, Default, Clone)]
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

    /// The calls of `other` after these.
    pub fn extend(&mut self, other: Timings) {
        self.0.extend(other.0);
    }

    /// What each call returned, in order.
    pub fn outcomes(&self) -> Vec<&str> {
        self.0.iter().map(|c| c.3.as_str()).collect()
    }

    /// Asserts that every call kept its bound (plus [`SLACK`]) and failed where it must.
    pub fn assert_kept(&self) {
        self.assert_kept_under("a stalled server");
    }

    /// [`Timings::assert_kept`], the fault named `fault` in the failures.
    pub fn assert_kept_under(&self, fault: &str) {
        let mut failures = Vec::new();
        for (what, took, bound, outcome, must_fail) in &self.0 {
            if *took > *bound + SLACK {
                failures.push(format!("{what}: took {took:?}, bound {bound:?}"));
            }
            if *must_fail && !outcome.starts_with("Err") {
                failures.push(format!("{what}: {outcome} under {fault}"));
            }
        }
        assert!(failures.is_empty(), "{fault}: {failures:#?}");
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

/// Every blocking call of each of `kinds` against a fault: on a client of its own for each kind
/// (`client()`), four locks are taken (two to unlock, two to drop) and one is left free; then
/// `fault()` strikes, and twice (the first calls meet the pooled connections, the later ones
/// open new ones) each kind's calls are timed, the kinds at once: `try_lock` and `is_locked`
/// within connect + command timeout, the `_for` / `_until` forms by `max(wait, connect) +
/// command`, `lock()` within `max(retry, connect + command)`, `unlock()` and a guard's drop
/// within connect + command. All but the drop must fail.
pub fn time_every_call(
    kinds: &[Kind],
    client: impl Fn() -> locksmith::Client + Sync,
    fault: impl FnOnce(),
) -> Timings {
    let ready = Barrier::new(kinds.len() + 1);
    let struck = Barrier::new(kinds.len() + 1);
    thread::scope(|s| {
        let threads: Vec<_> = kinds
            .iter()
            .map(|&kind| {
                let (client, ready, struck) = (&client, &ready, &struck);
                s.spawn(move || {
                    let client = client();
                    let open = |n: &str| kind.open(&client, &locksmith_testkit::unique_name(n));
                    let held_locks: Vec<_> = ["held-a", "held-b", "held-c", "held-d"]
                        .iter()
                        .map(|n| open(n))
                        .collect();
                    let mut held: Vec<_> = held_locks.iter().map(|l| l.lock().unwrap()).collect();
                    let free = open("free");
                    ready.wait();
                    struck.wait();
                    let mut t = Timings::default();
                    for round in 1..=2 {
                        let call = |c: &str| format!("{kind:?} {round}: {c}");
                        t.time(call("try_lock"), ONE, true, || show_opt(&free.try_lock()));
                        t.time(call("try_lock_for"), waiting(), true, || {
                            show_opt(&free.try_lock_for(WAIT))
                        });
                        t.time(call("try_lock_until"), waiting(), true, || {
                            show_opt(&free.try_lock_until(Instant::now() + WAIT))
                        });
                        t.time(call("lock"), retrying(), true, || show(&free.lock()));
                        t.time(call("is_locked"), ONE, true, || show(&free.is_locked()));
                        let g = held.remove(0);
                        t.time(call("unlock"), ONE, true, || show(&g.unlock()));
                        let g = held.remove(0);
                        t.time(call("drop"), ONE, false, || {
                            drop(g);
                            "dropped".into()
                        });
                    }
                    t
                })
            })
            .collect();
        ready.wait();
        fault();
        struck.wait();
        let mut all = Timings::default();
        for t in threads {
            all.extend(t.join().unwrap());
        }
        all
    })
}

/// [`time_every_call`] for `kinds` against a server stalled by `SIGSTOP`, on clients with the
/// timeouts above; asserts every bound kept.
pub fn every_call_keeps_its_bound_against_a_stalled_server(kinds: &[Kind]) {
    let server = locksmith_testkit::RedisServer::start();
    let pid = server.pid();
    let _cont = ContinueOnDrop(pid);
    let url = server.url();
    let kinds = kinds.to_vec();
    let timings = locksmith_testkit::with_deadline(Duration::from_secs(90), move || {
        time_every_call(
            &kinds,
            || client(&url),
            || locksmith_testkit::signal(pid, "STOP"),
        )
    });
    timings.assert_kept();
}
