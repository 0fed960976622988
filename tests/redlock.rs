//! RedLock: one lock over five independent masters. Mutual exclusion across processes, a
//! minority of masters down, stalled or restarted empty, a lost majority, wakeup without
//! polling, fencing tokens.
//!
//! Each test starts its own five `redis-server`s. Every blocking step runs under
//! [`with_deadline`] (or a bounded child-process wait), so a hang fails the test. The masters
//! live in an [`Arc<Masters>`] shared with the test body; a [`Reaper`] kept by the test thread
//! kills them when the test ends, even if a hung body thread is left behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::{Client, Error};

/// Masters per test.
const N: usize = 5;
/// The per-master timeout used throughout (the library default).
const MASTER_TIMEOUT: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Five `redis-server`s that the test body may stop, restart, pause and resume.
#[derive(Debug)]
struct Masters {
    servers: Vec<StdMutex<RedisServer>>,
    urls: Vec<String>,
}

impl Masters {
    /// Starts [`N`] servers (in parallel) and a [`Reaper`] for them.
    fn start() -> (Arc<Masters>, Reaper) {
        let servers: Vec<RedisServer> = thread::scope(|s| {
            let started: Vec<_> = (0..N).map(|_| s.spawn(RedisServer::start)).collect();
            started.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let urls = servers.iter().map(RedisServer::url).collect();
        let masters = Arc::new(Masters {
            servers: servers.into_iter().map(StdMutex::new).collect(),
            urls,
        });
        (Arc::clone(&masters), Reaper(masters))
    }

    fn server(&self, i: usize) -> StdGuard<'_, RedisServer> {
        self.servers[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// SIGKILL: the master is gone, with its data.
    fn stop(&self, i: usize) {
        self.server(i).stop();
    }

    /// A new, empty server on the same port.
    fn restart(&self, i: usize) {
        self.server(i).restart();
    }

    fn pause(&self, i: usize) {
        self.server(i).pause();
    }

    fn resume(&self, i: usize) {
        self.server(i).resume();
    }

    fn conn(&self, i: usize) -> redis::Connection {
        self.server(i).conn()
    }

    /// Script calls (`EVALSHA` and `FCALL`) summed over the masters `which`.
    fn evalsha(&self, which: impl IntoIterator<Item = usize>) -> u64 {
        which
            .into_iter()
            .map(|i| {
                let stats = common::commandstats(&mut self.conn(i));
                common::calls(&stats, "cmdstat_evalsha") + common::calls(&stats, "cmdstat_fcall")
            })
            .sum()
    }

    /// `PUBSUB NUMSUB channel` summed over all masters.
    fn numsub(&self, channel: &str) -> u64 {
        (0..N)
            .map(|i| common::numsub(&mut self.conn(i), channel))
            .sum()
    }
}

/// Kills every master when dropped (at the end of the test, or while unwinding after a
/// failed deadline); the servers' own `Drop` then removes their directories.
#[derive(Debug)]
struct Reaper(Arc<Masters>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for i in 0..N {
            self.0.stop(i);
        }
    }
}

/// A RedLock client over `masters` with the given lease and renewal interval, the default
/// per-master timeout and drift factor, and a 1 s retry timeout.
fn redlock(masters: &Masters, lease: Duration, renew: Duration) -> Client {
    Client::redlock(masters.urls())
        .lease(lease)
        .renew_interval(renew)
        .clock_drift_factor(0.01)
        .master_timeout(MASTER_TIMEOUT)
        .retry_timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// The library's debug messages, kept for the diagnostics of a failed test (the `log` crate is
/// a dependency of the library; this minimal logger records instead of printing).
static CAPTURED: StdMutex<Vec<(Instant, String)>> = StdMutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Debug && m.target().starts_with("locksmith")
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            CAPTURED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((Instant::now(), line));
        }
    }

    fn flush(&self) {}
}

/// Starts recording the library's log (once per process).
fn capture_log() {
    static LOGGER: Capture = Capture;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// Recorded log lines since `from` that contain one of `needles`, with their time in ms
/// after `from`.
fn captured(from: Instant, needles: &[String]) -> Vec<String> {
    CAPTURED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(t, l)| *t >= from && needles.iter().any(|n| l.contains(n.as_str())))
        .map(|(t, l)| format!("  +{} ms {l}", t.duration_since(from).as_millis()))
        .collect()
}

/// A client from `build` holding the lock whose key is `key` on every master from index
/// `from` on, for tests whose premise is such a grant. On a busy machine a grant may come from
/// a bare majority (the others' replies came after the per-master timeout and were undone,
/// and those masters are then skipped for a while by that client): a new client tries again.
fn holding_on(
    m: &Masters,
    key: &str,
    from: usize,
    build: impl Fn() -> Client,
    name: &str,
) -> (Client, locksmith::MutexGuard) {
    for _ in 0..20 {
        let c = build();
        let g = c.mutex(name).unwrap().lock().unwrap();
        if (from..N).all(|i| common::exists(&mut m.conn(i), key)) {
            return (c, g);
        }
        let _ = g.unlock();
    }
    panic!("no grant by masters {}..={N} in 20 attempts", from + 1);
}

fn is_no_quorum(e: &Error) -> bool {
    matches!(e, Error::NoQuorum { needed: 3, reached } if *reached < 3)
}

// ---------------------------------------------------------------------------------------------
// 1. Mutual exclusion across processes
// ---------------------------------------------------------------------------------------------

/// Entry point of the child processes of [`processes_exclude_each_other_over_five_masters`].
#[test]
fn child_redlock_counter() {
    if !common::is_child("redlock-counter") {
        return;
    }
    let urls = common::child_list("LS_URLS", ',');
    let name = common::child_env("LS_NAME");
    let rounds: u64 = common::child_var("LS_ROUNDS");
    let counter = format!("counter:{name}");
    let tokens = format!("tokens:{name}");
    let quorum = Client::redlock(&urls)
        .lease(Duration::from_secs(5))
        .master_timeout(MASTER_TIMEOUT)
        .build()
        .unwrap();
    let lock = quorum.mutex(&name).unwrap();
    // The counter and the token list live on master 1, on a plain connection.
    let mut conn = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    common::locked_increments(&lock, &mut conn, &counter, &tokens, rounds);
}

/// 3 processes x 100 read-modify-write increments, each under a RedLock over five masters:
/// the counter is exact and the fencing tokens, recorded inside the critical sections,
/// strictly increase.
#[test]
fn processes_exclude_each_other_over_five_masters() {
    const CHILDREN: usize = 3;
    const ROUNDS: u64 = 100;
    let (masters, _reaper) = Masters::start();
    let name = common::unique_name("redlock-procs");
    let envs = [
        ("LS_URLS", masters.urls().join(",")),
        ("LS_NAME", name.clone()),
        ("LS_ROUNDS", ROUNDS.to_string()),
    ];
    let start = Instant::now();
    common::run_children(
        CHILDREN,
        "child_redlock_counter",
        "redlock-counter",
        &envs,
        Duration::from_secs(45),
    );
    println!(
        "{CHILDREN} processes x {ROUNDS} increments over {N} masters took {:?}",
        start.elapsed()
    );

    let mut conn = masters.conn(0);
    common::assert_exact_and_fenced(&mut conn, &name, CHILDREN as u64 * ROUNDS);
    for i in 0..N {
        assert!(
            !common::exists(&mut masters.conn(i), &common::lock_key(&name)),
            "lock key left on master {}",
            i + 1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Masters down: a minority is survivable, a majority is NoQuorum
// ---------------------------------------------------------------------------------------------

/// With 2 of 5 masters killed, acquire, renewal (is_held through more than two renewal
/// intervals of a 600 ms lease; a competitor on another client gets nothing) and release
/// work. With 3 of 5 killed, `lock()` returns `NoQuorum` after about its 1 s retry timeout and
/// `try_lock_for(500 ms)` returns `Err(NoQuorum)` (not `Ok(None)`) at about its deadline.
/// After the masters are restarted, locking works again.
#[test]
fn minority_down_works_majority_down_is_no_quorum() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let lease = Duration::from_millis(600);
        let renew = Duration::from_millis(200);
        let a = redlock(&m, lease, renew);
        let b = redlock(&m, lease, renew);
        assert_eq!((a.masters(), a.quorum()), (5, 3));
        let name = common::unique_name("redlock-down");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();
        let lb = b.mutex(&name).unwrap();

        // Masters 1 and 2 (the ones the clients' subscribers listen on) die.
        m.stop(0);
        m.stop(1);
        let t = Instant::now();
        let guard = la
            .try_lock_for(Duration::from_secs(3))
            .unwrap()
            .expect("3 of 5 masters can grant the lock");
        println!("2 of 5 down: acquired in {:?}", t.elapsed());
        assert!(guard.is_held());

        // Hold for 3.5 renewal intervals: longer than the lease, so only renewals on the
        // three live masters keep it.
        let held_at = Instant::now();
        let mut min_validity = Duration::MAX;
        let mut competitor_tries = 0;
        while held_at.elapsed() < renew * 7 / 2 {
            assert!(
                guard.is_held(),
                "lost the lease after {:?} with 3 of 5 masters up",
                held_at.elapsed()
            );
            min_validity = min_validity.min(guard.validity());
            if competitor_tries < 10 {
                assert!(
                    lb.try_lock().unwrap().is_none(),
                    "a competitor got a lock held on 3 of 5 masters"
                );
                competitor_tries += 1;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            lb.try_lock_for(Duration::from_millis(200))
                .unwrap()
                .is_none(),
            "a competitor got a lock held on 3 of 5 masters"
        );
        for i in 2..N {
            let ttl = common::pttl(&mut m.conn(i), &key);
            assert!(ttl > 0, "lock key on master {} has PTTL {ttl}", i + 1);
        }
        println!(
            "2 of 5 down: held {:?} with a {lease:?} lease, smallest validity seen {min_validity:?}",
            held_at.elapsed()
        );
        assert!(guard.is_held());
        guard.unlock().unwrap();
        for i in 2..N {
            assert!(
                !common::exists(&mut m.conn(i), &key),
                "key left after unlock"
            );
        }
        let gb = lb
            .try_lock()
            .unwrap()
            .expect("competitor gets the lock after the release");
        gb.unlock().unwrap();

        // A third master dies: no majority.
        m.stop(2);
        let t = Instant::now();
        let err = la.lock().expect_err("lock() with 3 of 5 masters down");
        let took = t.elapsed();
        println!("3 of 5 down: lock() returned `{err}` after {took:?}");
        assert!(is_no_quorum(&err), "expected NoQuorum, got {err:?}");
        assert!(err.is_retriable());
        assert!(
            took >= Duration::from_millis(400),
            "lock() gave up after {took:?}, well before its 1 s retry timeout"
        );
        assert!(
            took < Duration::from_millis(1000 + 600),
            "lock() took {took:?} for a 1 s retry timeout"
        );

        let t = Instant::now();
        let res = la.try_lock_for(Duration::from_millis(500));
        let took = t.elapsed();
        println!(
            "3 of 5 down: try_lock_for(500ms) returned {:?} after {took:?}",
            res.as_ref().map(Option::is_some)
        );
        match res {
            Err(e) => assert!(is_no_quorum(&e), "expected NoQuorum, got {e:?}"),
            Ok(g) => panic!(
                "try_lock_for returned Ok({:?}) without a quorum; expected Err(NoQuorum)",
                g.map(|g| g.fencing_token())
            ),
        }
        assert!(
            took < Duration::from_millis(500 + 400),
            "try_lock_for(500ms) took {took:?}"
        );

        let t = Instant::now();
        let res = la.try_lock();
        let took = t.elapsed();
        println!(
            "3 of 5 down: try_lock() gave an error: {} after {took:?}",
            res.is_err()
        );
        assert!(res.is_err_and(|e| is_no_quorum(&e)));
        assert!(
            took < MASTER_TIMEOUT * 2 + Duration::from_millis(200),
            "took {took:?}"
        );

        // Back up (empty): locking works again once the masters are no longer skipped.
        for i in 0..3 {
            m.restart(i);
        }
        let t = Instant::now();
        let guard = la
            .try_lock_for(Duration::from_secs(5))
            .unwrap()
            .expect("lock after the masters came back");
        let took = t.elapsed();
        println!("masters restarted: acquired after {took:?}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert!(lb.try_lock().unwrap().is_none());
        guard.unlock().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A stalled master
// ---------------------------------------------------------------------------------------------

/// One master frozen with SIGSTOP: for 1.6 s (spanning several periods in which the master is
/// skipped and then tried again), every `try_lock` and `lock` on a free lock succeeds (4 of 5
/// answer) within twice the per-master timeout + 100 ms, and so does every `unlock`.
#[test]
fn stalled_master_costs_at_most_the_master_timeout() {
    const PAUSED: usize = 2;
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let q = redlock(&m, Duration::from_secs(2), Duration::from_millis(600));
        let name = common::unique_name("redlock-paused");
        let lock = q.mutex(&name).unwrap();
        // Warm up: pooled connections and loaded scripts on every master.
        for _ in 0..3 {
            lock.lock().unwrap().unlock().unwrap();
        }

        let bound = MASTER_TIMEOUT * 2 + Duration::from_millis(100);
        capture_log();
        m.pause(PAUSED);
        let paused_at = Instant::now();
        // (call, ms since the pause, took, outcome)
        let mut log: Vec<(&str, u128, Duration, String)> = Vec::new();
        let mut round = 0;
        while paused_at.elapsed() < Duration::from_millis(1600) {
            let call = if round % 2 == 0 { "try_lock" } else { "lock" };
            round += 1;
            let at = paused_at.elapsed().as_millis();
            let t = Instant::now();
            let res = if call == "try_lock" {
                lock.try_lock()
            } else {
                lock.lock().map(Some)
            };
            let took = t.elapsed();
            match res {
                Ok(Some(g)) => {
                    log.push((call, at, took, "held".into()));
                    let at = paused_at.elapsed().as_millis();
                    let t = Instant::now();
                    let r = g.unlock();
                    log.push(("unlock", at, t.elapsed(), format!("{r:?}")));
                }
                Ok(None) => log.push((call, at, took, "None (busy)".into())),
                Err(e) => log.push((call, at, took, format!("Err({e})"))),
            }
            thread::sleep(Duration::from_millis(25));
        }
        m.resume(PAUSED);

        let mut worst = Duration::ZERO;
        let mut failures = Vec::new();
        for (call, at, took, outcome) in &log {
            worst = worst.max(*took);
            let ok = if *call == "unlock" {
                outcome == "Ok(())"
            } else {
                outcome == "held"
            };
            if !ok || *took >= bound {
                failures.push(format!("  {call} at +{at} ms took {took:?}: {outcome}"));
            }
        }
        println!(
            "master {} paused: {} calls, slowest {worst:?} (bound {bound:?})",
            PAUSED + 1,
            log.len()
        );
        if !failures.is_empty() {
            // Why each master failed, from the library's debug log.
            let needles: Vec<String> = m.urls().iter().map(|u| format!("master {u}")).collect();
            let why = captured(paused_at, &needles);
            panic!(
                "{} of {} calls failed or were slow with master {} ({}) paused:\n{}\n\
                 library log (first 25 lines):\n{}",
                failures.len(),
                log.len(),
                PAUSED + 1,
                m.urls()[PAUSED],
                failures.join("\n"),
                why.iter().take(25).cloned().collect::<Vec<_>>().join("\n")
            );
        }

        // Resumed: still fine.
        let g = lock
            .try_lock_for(Duration::from_secs(3))
            .unwrap()
            .expect("lock after the master resumed");
        g.unlock().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// 4. A minority master restarts empty
// ---------------------------------------------------------------------------------------------

/// Client A holds; master 1 restarts empty. Client B gets master 1 but no majority, so
/// `try_lock_for(1 s)` returns `None` (and B gives master 1 back). A's guard stays held
/// through renewals and unlocks fine; then B gets the lock.
#[test]
fn minority_master_restarted_empty_lets_no_second_owner_in() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        // A lease far longer than the renewal interval: a loaded machine that delays A's
        // renewals by a second or two must not let A's lease run out (B's grant would then be
        // the lease's end, not a master's empty restart letting a second owner in).
        let lease = Duration::from_secs(8);
        let renew = Duration::from_millis(500);
        let a = redlock(&m, lease, renew);
        let name = common::unique_name("redlock-restart");
        let key = common::lock_key(&name);
        let la = a.mutex(&name).unwrap();

        let ga = la.lock().unwrap();
        m.restart(0);
        assert!(!common::exists(&mut m.conn(0), &key));
        // B connects after the restart, so that it does reach the empty master (a client
        // with a connection from before the restart skips that master for a while after the
        // connection fails).
        let b = redlock(&m, lease, renew);
        let lb = b.mutex(&name).unwrap();

        let t = Instant::now();
        let got = lb.try_lock_for(Duration::from_secs(1)).unwrap();
        let took = t.elapsed();
        println!(
            "B's try_lock_for(1s) with master 1 empty: {:?} after {took:?}",
            got.is_some()
        );
        assert!(
            got.is_none(),
            "B acquired a lock A holds on 4 of 5 masters (token {:?}, A's {})",
            got.as_ref().map(|g| g.fencing_token()),
            ga.fencing_token()
        );
        drop(got);
        assert!(took >= Duration::from_secs(1), "gave up after {took:?}");
        assert!(took < Duration::from_millis(2000), "gave up after {took:?}");
        // B's attempt was granted on the empty master (the acquire script wrote its fence
        // counter there) and undone.
        let mut c0 = m.conn(0);
        assert!(
            common::exists(&mut c0, &common::fence_key(&name)),
            "B's acquire never ran on the restarted master"
        );
        assert!(
            !common::exists(&mut c0, &key),
            "B left its grant on master 1"
        );

        // A keeps the lock through another renewal interval or two.
        thread::sleep(renew * 2);
        assert!(ga.is_held(), "A lost its lease");
        ga.check().unwrap();
        assert!(lb.try_lock().unwrap().is_none());
        ga.unlock().unwrap();

        let gb = lb
            .try_lock()
            .unwrap()
            .expect("B gets the lock after A's release");
        gb.unlock().unwrap();
    });
}

/// A waiter's own undo on a minority master must not wake it: the undo of a partial grant
/// publishes a release on the master it deleted the key on, and the waiter (whose pub/sub
/// connection is on that master) must not treat it as news and retry in a tight loop. With
/// the holder's 30 s lease (no renewals in the window), every script call on masters 2-5
/// during B's `try_lock_for(1 s)` is B's acquire attempt.
#[test]
fn waiter_with_minority_grant_does_not_spin() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let lease = Duration::from_secs(30);
        let a = redlock(&m, lease, lease / 3);
        let name = common::unique_name("redlock-spin");
        let la = a.mutex(&name).unwrap();
        let ga = la.lock().unwrap();
        m.restart(0);
        // Built after the restart: B reaches the empty master (see the test above), and
        // its pub/sub connection is on master 1.
        let b = redlock(&m, lease, lease / 3);
        let lb = b.mutex(&name).unwrap();

        let publishes = || {
            let stats = common::commandstats(&mut m.conn(0));
            common::calls(&stats, "cmdstat_publish")
        };
        let before = m.evalsha(1..N);
        let published_before = publishes();
        let got = lb.try_lock_for(Duration::from_secs(1)).unwrap();
        let attempts = (m.evalsha(1..N) - before) / (N as u64 - 1);
        let published = publishes() - published_before;
        println!(
            "B made {attempts} acquire attempts in 1 s behind a minority grant; \
             {published} releases were published on master 1 meanwhile"
        );
        assert!(got.is_none());
        drop(got);
        assert!(
            common::exists(&mut m.conn(0), &common::fence_key(&name)),
            "B's acquire never ran on the restarted master"
        );
        // The fast-path attempt, the one after the subscription is confirmed, and a few
        // more for timer bounds at most.
        assert!(
            attempts <= 5,
            "B made {attempts} acquire attempts in 1 s while the lock stayed held: it polls"
        );
        ga.unlock().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// 5. A lost majority
// ---------------------------------------------------------------------------------------------

/// A guard whose majority is lost (3 of 5 masters killed while held; lease 900 ms renewed
/// every 300 ms) reports `is_held() == false` within the lease (+ slack) of the kill, and its
/// `unlock()` errs.
#[test]
fn guard_that_lost_its_majority_is_not_held() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let lease = Duration::from_millis(900);
        let renew = Duration::from_millis(300);
        let q = redlock(&m, lease, renew);
        let name = common::unique_name("redlock-lost");
        let lock = q.mutex(&name).unwrap();
        let guard = lock.lock().unwrap();
        // Past the first renewal.
        thread::sleep(renew + renew / 2);
        assert!(guard.is_held());

        // The majority is gone once the third master dies: a renewal sent after that instant
        // cannot succeed, so the local deadline is at most `lease - drift` after it.
        let killed_at = Instant::now();
        m.stop(0);
        m.stop(1);
        let majority_lost_at = Instant::now();
        m.stop(2);
        let lost = common::wait_until(lease + Duration::from_secs(1), || !guard.is_held());
        let lost_after = majority_lost_at.elapsed();
        println!(
            "3 of 5 killed: is_held() false {lost_after:?} after the third kill began \
             ({:?} after the first; lease {lease:?}, renewal every {renew:?})",
            killed_at.elapsed()
        );
        assert!(lost, "still held {lost_after:?} after losing the majority");
        assert!(
            lost_after < lease + Duration::from_millis(300),
            "is_held() stayed true {lost_after:?} after the majority was lost"
        );
        assert!(guard.check().is_err_and(|e| e.is_lease_lost()));
        assert_eq!(guard.validity(), Duration::ZERO);

        let res = guard.unlock();
        println!("unlock() of the lost guard: {res:?}");
        assert!(
            res.is_err(),
            "unlock() of a guard without a majority succeeded"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 6. Wakeup without polling
// ---------------------------------------------------------------------------------------------

/// A waiter on another client blocked in `lock()` behind a 30 s lease sends no acquire
/// attempts while it waits and acquires well under a second after the release.
#[test]
fn waiter_wakes_on_release_without_polling() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let lease = Duration::from_secs(30);
        let holder = redlock(&m, lease, lease / 3);
        let waiter = redlock(&m, lease, lease / 3);
        let name = common::unique_name("redlock-wakeup");
        let channel = common::release_channel(&name);
        let hl = holder.mutex(&name).unwrap();
        let guard = hl.lock().unwrap();
        let token = guard.fencing_token();

        // The holder's first renewal is 10 s away: every script call from here on is the
        // waiter's.
        let before = m.evalsha(0..N);
        let (tx, rx) = mpsc::channel();
        let wl = waiter.mutex(&name).unwrap();
        let w = thread::spawn(move || {
            let g = wl.lock().unwrap();
            tx.send((Instant::now(), g.fencing_token())).unwrap();
            g.unlock().unwrap();
        });
        assert!(
            common::wait_until(Duration::from_secs(5), || m.numsub(&channel) >= 1),
            "waiter never subscribed to {channel}"
        );
        // Settled: no script call from the waiter over 300 ms (a loaded machine may run its
        // attempt after subscribing late).
        let mut settled = m.evalsha(0..N);
        let ready_by = Instant::now() + Duration::from_secs(10);
        loop {
            thread::sleep(Duration::from_millis(300));
            let now = m.evalsha(0..N);
            if now == settled || Instant::now() > ready_by {
                break;
            }
            settled = now;
        }
        thread::sleep(Duration::from_millis(1500));
        let after = m.evalsha(0..N);
        assert_eq!(
            rx.try_recv().err(),
            Some(TryRecvError::Empty),
            "waiter finished early"
        );
        println!(
            "waiter EVALSHA calls over {N} masters: {} while getting ready, {} during 1.5 s of waiting",
            settled - before,
            after - settled
        );
        assert!(
            after - settled <= 1,
            "waiter polled while waiting: {} script calls in 1.5 s",
            after - settled
        );
        assert!(
            settled - before <= 2 * N as u64,
            "waiter made {} script calls (more than two attempts) getting ready",
            settled - before
        );

        let released_at = Instant::now();
        guard.unlock().unwrap();
        let (acquired_at, their_token) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let latency = acquired_at.duration_since(released_at);
        println!("RedLock wake latency after release: {latency:?}");
        assert!(their_token > token);
        assert!(
            latency < Duration::from_secs(1),
            "woke {latency:?} after release"
        );
        w.join().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// 7. Fencing tokens
// ---------------------------------------------------------------------------------------------

/// Three clients take turns. Tokens strictly increase, also after master 1 and later master 2
/// restart empty. Master 1's fence counter is seeded far above the clock (in microseconds),
/// so once a grant includes master 1 the tokens come from the counters and not from the
/// masters' clocks: they only keep increasing after master 1 restarts (its counter gone, its
/// clock far below) because every release raised the other masters' counters to the holder's
/// token.
#[test]
fn fencing_tokens_increase_across_owners_and_restarts() {
    const TURNS: usize = 4;
    const SEED: u64 = 5_000_000_000_000_000; // ~2128 in microseconds; below 2^53.
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(40), move || {
        let clients: Vec<Client> = (0..3)
            .map(|_| redlock(&m, Duration::from_secs(2), Duration::from_millis(600)))
            .collect();
        let name = common::unique_name("redlock-fence");
        let locks: Vec<_> = clients.iter().map(|c| c.mutex(&name).unwrap()).collect();
        redis::cmd("SET")
            .arg(common::fence_key(&name))
            .arg(SEED)
            .exec(&mut m.conn(0))
            .unwrap();

        let mut tokens: Vec<(&str, u64)> = Vec::new();
        let turns = |phase: &'static str, tokens: &mut Vec<(&str, u64)>| {
            for _ in 0..TURNS {
                for lock in &locks {
                    let g = lock
                        .try_lock_for(Duration::from_secs(3))
                        .unwrap()
                        .expect("free lock");
                    tokens.push((phase, g.fencing_token()));
                    g.unlock().unwrap();
                }
            }
        };
        turns("all up", &mut tokens);
        m.restart(0);
        turns("master 1 restarted", &mut tokens);
        m.restart(1);
        turns("master 2 restarted", &mut tokens);

        println!(
            "tokens: first {:?}, last {:?} ({} in all)",
            tokens.first(),
            tokens.last(),
            tokens.len()
        );
        // A grant whose majority left master 1 out (a slow reply marks a master down for a
        // moment on a busy machine) takes its token from the others' clocks: that may happen
        // in the first turns only, before a grant that included master 1 and its release
        // raised the others' counters. From then on, and after every restart, every token is
        // above the seed.
        let seeded = tokens
            .iter()
            .position(|t| t.1 > SEED)
            .expect("no grant took master 1's counter");
        assert!(
            tokens[..seeded].iter().all(|t| t.0 == "all up"),
            "master 1's counter was never taken before it restarted: {tokens:?}"
        );
        assert!(
            tokens[seeded..].iter().all(|t| t.1 > SEED),
            "a token fell back to the clock: {tokens:?}"
        );
        for w in tokens.windows(2) {
            assert!(
                w[0].1 < w[1].1,
                "fencing token went from {:?} to {:?}",
                w[0],
                w[1]
            );
        }
    });
}

/// A grant whose reply comes too late is undone all the same. B's acquire runs on master 1
/// (where the lock key was lost), but the reply is held back past the per-master timeout, so
/// master 1 counts as failed and is marked down; the other four refuse (A holds the lock
/// there). The undo must still reach master 1 (on a new connection): the acquire ran there,
/// and its grant would otherwise sit there for B's whole lease.
#[test]
fn a_late_grant_on_a_minority_master_is_undone() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(30), move || {
        let lease = Duration::from_secs(30);
        let name = common::unique_name("redlock-late-grant");
        let key = common::lock_key(&name);
        // A holds on masters 2 to 5, which refuse B; master 1 loses the key.
        let (_a, ga) = holding_on(&m, &key, 1, || redlock(&m, lease, lease / 3), &name);
        let _: i64 = redis::cmd("DEL").arg(&key).query(&mut m.conn(0)).unwrap();

        let proxy = locksmith_testkit::proxy::Proxy::start(m.server(0).port());
        let mut urls = m.urls();
        urls[0] = proxy.url();
        let b = Client::redlock(urls)
            .lease(lease)
            .master_timeout(MASTER_TIMEOUT)
            .build()
            .unwrap();
        let lb = b.mutex(&name).unwrap();
        proxy.delay_script_replies(MASTER_TIMEOUT * 6, 1);
        assert!(lb.try_lock().unwrap().is_none(), "B got a lock A holds");
        assert_eq!(proxy.delays(), 1, "B's acquire reply was not held back");
        // The undo's reply may itself come late on this busy machine; its command does not.
        let undone = common::wait_until(Duration::from_secs(2), || {
            !common::exists(&mut m.conn(0), &key)
        });
        assert!(undone, "B's late grant stayed on master 1");
        ga.unlock().unwrap();
    });
}

/// An unlock is decided by the masters that hold the lock, even those marked down a moment
/// ago. A holds on masters 2 to 5 (and maybe 1), then loses the key on master 1 (as in the
/// test above). One slow reply on masters 2 and 3 (held back past the per-master timeout)
/// marks them down for a short while; an unlock in that while, skipping them, would see two
/// releases and a missing key, fewer than a quorum, and fail with "master marked down"
/// although the lock is held on four masters that answer. It must reach them and succeed.
#[test]
fn an_unlock_reaches_masters_marked_down_a_moment_ago() {
    let (masters, _reaper) = Masters::start();
    let m = Arc::clone(&masters);
    with_deadline(Duration::from_secs(30), move || {
        let lease = Duration::from_secs(30);
        let proxies: Vec<_> = (1..3)
            .map(|i| locksmith_testkit::proxy::Proxy::start(m.server(i).port()))
            .collect();
        let mut urls = m.urls();
        urls[1] = proxies[0].url();
        urls[2] = proxies[1].url();
        let name = common::unique_name("redlock-unlock-marked-down");
        let key = common::lock_key(&name);
        // A holds on masters 2 to 5 (the unlock must find three releases among them).
        let build = || {
            Client::redlock(urls.clone())
                .lease(lease)
                .master_timeout(MASTER_TIMEOUT)
                .build()
                .unwrap()
        };
        let (a, ga) = holding_on(&m, &key, 1, build, &name);
        let _: i64 = redis::cmd("DEL").arg(&key).query(&mut m.conn(0)).unwrap();

        // One slow reply each on masters 2 and 3: the acquire of another lock, which marks 2
        // and 3 down (whether it holds on 1, 4 and 5 in time on a busy machine is no matter;
        // nor is a master marked down before, which this acquire then skipped).
        for p in &proxies {
            p.delay_script_replies(MASTER_TIMEOUT * 6, 1);
        }
        let other = a.mutex(&common::unique_name("redlock-marker")).unwrap();
        let go = other.try_lock();
        println!(
            "replies held back: {:?}; other lock: {:?}",
            proxies.iter().map(|p| p.delays()).collect::<Vec<_>>(),
            go.as_ref().map(Option::is_some)
        );
        ga.unlock().unwrap();
        for i in 1..N {
            assert!(
                !common::exists(&mut m.conn(i), &key),
                "the lock stayed on master {}",
                i + 1
            );
        }
        drop(go);
    });
}
