//! Local hand-off: a `Mutex` released while threads of the same client wait passes to the
//! first of them without a round trip. Exclusion and fencing across processes, the bound that
//! forces a release through Redis, the give-way to other clients after it, re-entry and lease
//! loss after a hand-off, the option off, and its bad values.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, with_deadline};
use locksmith::{Client, Error};

/// A child process: `LS_THREADS` threads of one client, each making `LS_ROUNDS` counted
/// increments under the lock (see `common::locked_increments`).
#[test]
fn child_threads_counter() {
    let Some((url, name)) = common::child_url_name("threads-counter") else {
        return;
    };
    let rounds: u64 = common::child_var("LS_ROUNDS");
    let threads: usize = common::child_var("LS_THREADS");
    let client = Client::open(url.as_str()).unwrap();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let lock = client.mutex(&name).unwrap();
            let url = url.clone();
            let name = name.clone();
            thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let (counter, tokens) = (format!("counter:{name}"), format!("tokens:{name}"));
                common::locked_increments(&lock, &mut conn, &counter, &tokens, rounds);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Tokens that follow their predecessor by exactly one: local hand-offs (a grant through
/// Redis takes the server clock in microseconds, far past the last token of a block).
fn handoffs(tokens: &[u64]) -> usize {
    tokens.windows(2).filter(|w| w[1] == w[0] + 1).count()
}

/// 3 processes x 8 threads on one lock, hand-off on (the default): no increment is lost, the
/// fencing tokens recorded inside the critical sections strictly increase in acquisition
/// order across the processes, and hand-offs did happen.
#[test]
fn three_processes_of_eight_threads_exclude_and_fence() {
    const CHILDREN: usize = 3;
    const THREADS: usize = 8;
    const ROUNDS: u64 = 40;
    let server = RedisServer::start();
    let name = fresh_name(&server.url(), "handoff-procs");
    let envs = [
        ("LS_URL", server.url()),
        ("LS_NAME", name.clone()),
        ("LS_ROUNDS", ROUNDS.to_string()),
        ("LS_THREADS", THREADS.to_string()),
    ];
    common::run_children(
        CHILDREN,
        "child_threads_counter",
        "threads-counter",
        &envs,
        Duration::from_secs(120),
    );
    let mut conn = server.conn();
    let total = (CHILDREN * THREADS) as u64 * ROUNDS;
    common::assert_exact_and_fenced(&mut conn, &name, total);
    assert!(!common::exists(&mut conn, &common::lock_key(&name)));
    let tokens: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("tokens:{name}"))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap();
    let n = handoffs(&tokens);
    println!("{n} of {total} acquisitions were local hand-offs");
    assert!(n > 0, "no local hand-off happened");
}

/// One critical section seen by a local thread: its token and when it started.
type Entry = (u64, Instant);

/// Runs 4 threads of `local` in a loop on `name` (each section works for `work`), lets a
/// waiter of `remote` take the lock once meanwhile, and returns how long it waited and the
/// local sections in acquisition order.
fn contend_with_a_remote_waiter(
    local: &Client,
    remote: &Client,
    name: &str,
    work: Duration,
) -> (Duration, Vec<Entry>) {
    let log: Arc<StdMutex<Vec<Entry>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let (lock, log, stop) = (local.mutex(name).unwrap(), log.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let g = lock.lock().unwrap();
                    log.lock()
                        .unwrap()
                        .push((g.fencing_token(), Instant::now()));
                    thread::sleep(work);
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    assert!(common::wait_until(Duration::from_secs(10), || log
        .lock()
        .unwrap()
        .len()
        >= 50));
    let theirs = remote.mutex(name).unwrap();
    let t = Instant::now();
    let got = theirs.try_lock_for(Duration::from_secs(20)).unwrap();
    let waited = t.elapsed();
    assert!(got.is_some(), "the remote waiter never got the lock");
    drop(got);
    // Some more local sections after the remote one.
    let seen = log.lock().unwrap().len();
    assert!(common::wait_until(Duration::from_secs(10), || log
        .lock()
        .unwrap()
        .len()
        >= seen + 20));
    stop.store(true, Ordering::SeqCst);
    for h in hs {
        h.join().unwrap();
    }
    let entries = std::mem::take(&mut *log.lock().unwrap());
    (waited, entries)
}

/// A new lock name. Every acquisition through Redis reserves its block of hand-off tokens
/// (its token is the server clock + a lead), so these tests tell a grant through Redis from a
/// hand-off by its token jumping with the clock.
fn fresh_name(_url: &str, what: &str) -> String {
    common::unique_name(what)
}

/// The runs of consecutive tokens (one acquisition through Redis and its hand-offs).
fn runs(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=entries.len() {
        if i == entries.len() || entries[i].0 != entries[i - 1].0 + 1 {
            out.push(&entries[start..i]);
            start = i;
        }
    }
    out
}

/// The count bound: at most `local_handoff_max_count` hand-offs follow an acquisition through
/// Redis; then the release goes through Redis, and a waiter of another client gets the lock
/// while the local threads keep contending.
#[test]
fn the_count_bound_forces_a_release_through_redis() {
    common::on_server(Duration::from_secs(60), move |url, _conn| {
        let local = Client::builder(&url)
            .local_handoff_max_count(3)
            .local_handoff_max_time(Duration::from_secs(5))
            .build()
            .unwrap();
        let remote = Client::open(&url).unwrap();
        let name = fresh_name(&url, "handoff-count");
        let (waited, entries) =
            contend_with_a_remote_waiter(&local, &remote, &name, Duration::from_micros(200));
        let runs = runs(&entries);
        let longest = runs.iter().map(|r| r.len()).max().unwrap();
        println!(
            "remote waited {waited:?}; {} sections in {} runs, longest {longest}",
            entries.len(),
            runs.len()
        );
        assert!(
            longest <= 4,
            "a run of {longest} sections: more than 3 hand-offs"
        );
        assert!(longest >= 2, "no local hand-off happened");
        assert!(waited < Duration::from_secs(5), "remote waited {waited:?}");
    });
}

/// The time bound: no hand-off starts later than `local_handoff_max_time` after the
/// acquisition through Redis, whatever the count allows.
#[test]
fn the_time_bound_forces_a_release_through_redis() {
    common::on_server(Duration::from_secs(60), move |url, _conn| {
        let max_time = Duration::from_millis(15);
        let local = Client::builder(&url)
            .local_handoff_max_count(1024)
            .local_handoff_max_time(max_time)
            .build()
            .unwrap();
        let remote = Client::open(&url).unwrap();
        let name = fresh_name(&url, "handoff-time");
        let (waited, entries) =
            contend_with_a_remote_waiter(&local, &remote, &name, Duration::from_millis(1));
        let runs = runs(&entries);
        let longest = runs
            .iter()
            .map(|r| r[r.len() - 1].1 - r[0].1)
            .max()
            .unwrap();
        let most = runs.iter().map(|r| r.len()).max().unwrap();
        println!(
            "remote waited {waited:?}; {} sections in {} runs, longest {longest:?} ({most} sections)",
            entries.len(),
            runs.len()
        );
        // The last hand-off of a run starts before max_time after the acquisition through
        // Redis, which came before the run's first section: with 1 ms sections and 1024
        // hand-offs allowed, only the time bound keeps runs this short (250 ms: slack for a
        // busy machine).
        assert!(
            longest < max_time + Duration::from_millis(250),
            "a run lasted {longest:?}"
        );
        assert!(most >= 2, "no local hand-off happened");
        assert!(waited < Duration::from_secs(5), "remote waited {waited:?}");
    });
}

/// How a run of one hand-off ended (see [`end_a_run`]).
struct RunEnd {
    /// The token of the acquisition through Redis, and that of the hand-off.
    first: u64,
    handed: u64,
    /// When the release that ended the run began.
    released_at: Instant,
    /// The token of the local thread that queued meanwhile, and when it got the lock.
    next: u64,
    next_at: Instant,
}

/// Makes a run of one hand-off on `lock` (whose client allows one: `local_handoff_max_count(1)`
/// and a long `local_handoff_max_time`) and ends it with a release through Redis while another
/// thread of the client queues: the main thread acquires through Redis and hands the lock to
/// thread b; thread c then queues; `meanwhile` makes others listen (it returns how many
/// subscribers the channel has then, and what must live until the end); b releases.
fn end_a_run<T: Send>(
    lock: &locksmith::Mutex,
    conn: &mut redis::Connection,
    meanwhile: impl FnOnce(&mut redis::Connection) -> (u64, T),
) -> (RunEnd, T) {
    let channel = common::release_channel(lock.name());
    let g = lock.lock().unwrap();
    let first = g.fencing_token();
    let (rx_b, tx_go, hb) = locker(lock.clone());
    common::wait_numsub(conn, &channel, 1);
    g.unlock().unwrap();
    let handed = rx_b.recv().unwrap();
    // b took the hand-off and left the queue, which was then empty: the client unsubscribed.
    assert!(
        common::wait_until(Duration::from_secs(10), || common::numsub(conn, &channel)
            == 0),
        "the client stayed subscribed"
    );
    let lock_c = lock.clone();
    let hc = thread::spawn(move || {
        let g = lock_c
            .try_lock_for(Duration::from_secs(30))
            .unwrap()
            .unwrap();
        let got = (g.fencing_token(), Instant::now());
        g.unlock().unwrap();
        got
    });
    common::wait_numsub(conn, &channel, 1);
    let (listeners, keep) = meanwhile(conn);
    common::wait_numsub(conn, &channel, listeners);
    tx_go.send(()).unwrap();
    let released_at = hb.join().unwrap();
    let (next, next_at) = hc.join().unwrap();
    let end = RunEnd {
        first,
        handed,
        released_at,
        next,
        next_at,
    };
    (end, keep)
}

/// A client that hands off once in a row and gives way for `give_way`.
fn one_handoff_then_give_way(url: &str, give_way: Duration) -> Client {
    Client::builder(url)
        .local_handoff_max_count(1)
        .local_handoff_max_time(Duration::from_secs(30))
        .local_handoff_give_way(give_way)
        .build()
        .unwrap()
}

/// Ends a run of one hand-off (see [`end_a_run`]) while `remotes` waiters of other clients
/// wait too (each holds the lock 50 ms once it has it), and checks that every one of them got
/// the lock before the client's own queued thread, and that the last remote release ended
/// the give-way (long here) at once.
fn remote_waiters_go_first(remotes: usize) {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let give_way = Duration::from_secs(10);
        let local = one_handoff_then_give_way(&url, give_way);
        let name = fresh_name(&url, "handoff-give-way");
        let lock = local.mutex(&name).unwrap();
        let theirs: Vec<_> = (0..remotes)
            .map(|_| Client::open(&url).unwrap().mutex(&name).unwrap())
            .collect();
        let (end, remote_threads) = end_a_run(&lock, &mut conn, |_| {
            let hs: Vec<_> = theirs
                .into_iter()
                .map(|m| {
                    thread::spawn(move || {
                        let g = m.try_lock_for(Duration::from_secs(30)).unwrap().unwrap();
                        let token = g.fencing_token();
                        thread::sleep(Duration::from_millis(50));
                        let released = Instant::now();
                        g.unlock().unwrap();
                        (token, released)
                    })
                })
                .collect();
            (1 + remotes as u64, hs)
        });
        let remote: Vec<(u64, Instant)> = remote_threads
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let last_token = remote.iter().map(|r| r.0).max().unwrap();
        let last_release = remote.iter().map(|r| r.1).max().unwrap();
        println!(
            "{remotes} remote waiter(s) went first; the local thread got the lock {:?} after \
             the last remote release",
            end.next_at.saturating_duration_since(last_release)
        );
        assert_eq!(end.handed, end.first + 1, "not handed off locally");
        assert!(
            remote.iter().all(|r| r.0 > end.handed) && end.next > last_token,
            "the local thread went before a remote waiter: run {}..={}, remote {remote:?}, \
             local {}",
            end.first,
            end.handed,
            end.next
        );
        // The remote releases ended the give-way: not its bound.
        assert!(
            end.next_at.saturating_duration_since(last_release) < Duration::from_secs(5),
            "the local thread waited for the give-way bound after the remote releases"
        );
    });
}

/// When a run of hand-offs reaches its bound, its release goes through Redis, and a waiter of
/// another client gets the lock next, ahead of the client's own queued thread, which gives
/// way until the other owner's release.
#[test]
fn after_a_bounded_run_a_remote_waiter_goes_first() {
    remote_waiters_go_first(1);
}

/// With waiters of two other clients, both get the lock after a bounded run before the
/// client's own queued thread: it gives way for as many releases as others heard its own.
#[test]
fn after_a_bounded_run_every_remote_waiter_goes_first() {
    remote_waiters_go_first(2);
}

/// A subscriber of the release channel that never takes the lock makes the client's queued
/// thread give way after a release through Redis, for the give-way bound and not much longer;
/// without it (only the client's own subscription heard the release), the thread goes at once.
#[test]
fn a_listener_that_does_not_take_the_lock_costs_the_give_way_bound() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let give_way = Duration::from_secs(1);
        let client = one_handoff_then_give_way(&url, give_way);

        let alone = client.mutex(&fresh_name(&url, "give-way-alone")).unwrap();
        let (end, ()) = end_a_run(&alone, &mut conn, |_| (1, ()));
        let without = end.next_at - end.released_at;

        let name = fresh_name(&url, "give-way-listener");
        let heard = client.mutex(&name).unwrap();
        let u = url.clone();
        let (end, spy) = end_a_run(&heard, &mut conn, move |_| {
            (
                2,
                common::ChannelSpy::start(&u, &common::release_channel(&name)),
            )
        });
        let with = end.next_at - end.released_at;
        println!("next local holder after the run: {without:?} alone, {with:?} with a listener");
        assert!(
            spy.sync(&mut conn) >= 1,
            "the listener did not hear the release"
        );
        assert_eq!(end.handed, end.first + 1, "not handed off locally");
        assert!(end.next > end.handed);
        assert!(
            without < give_way,
            "gave way with nobody else listening: {without:?}"
        );
        assert!(with >= give_way, "did not give way: {with:?}");
        assert!(
            with < give_way + Duration::from_secs(2),
            "gave way for longer than its bound: {with:?}"
        );
    });
}

/// A client whose run of hand-offs may last the whole lease: the tests below hold the lock
/// while a second thread gets in line, which may take longer than the default 10 ms on a busy
/// machine (the lock would then be released through Redis, as it should).
fn patient(url: &str) -> Client {
    Client::builder(url)
        .local_handoff_max_time(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A thread that locks `lock`, sends its token, holds it until told, and unlocks. Returns
/// (the token's receiver, a sender that releases it, the thread, which returns when its
/// release began).
fn locker(
    lock: locksmith::Mutex,
) -> (
    mpsc::Receiver<u64>,
    mpsc::Sender<()>,
    thread::JoinHandle<Instant>,
) {
    let (tx_token, rx_token) = mpsc::channel();
    let (tx_go, rx_go) = mpsc::channel::<()>();
    let h = thread::spawn(move || {
        let g = lock.lock().unwrap();
        tx_token.send(g.fencing_token()).unwrap();
        rx_go.recv().unwrap();
        let at = Instant::now();
        g.unlock().unwrap();
        at
    });
    (rx_token, tx_go, h)
}

/// Holds `lock` in a thread of its own until told, after the main thread has made sure a
/// second thread queues for it. Returns (token of the first holder, a sender that releases
/// it).
fn hold_in_thread(lock: locksmith::Mutex) -> (u64, mpsc::Sender<()>, thread::JoinHandle<Instant>) {
    let (rx_token, tx_go, h) = locker(lock);
    (rx_token.recv().unwrap(), tx_go, h)
}

/// After a hand-off, the receiving thread holds the lock with the next token while the
/// server still names the first owner; it re-enters (the server counts its levels) and its
/// inner guard releases one level; no other thread, the handing one included, is granted
/// the lock meanwhile; its outermost release frees it.
#[test]
fn reentry_after_a_handoff() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let client = patient(&url);
        let name = fresh_name(&url, "handoff-reentry");
        let key = common::lock_key(&name);
        let lock = client.mutex(&name).unwrap();
        let (token_a, release_a, ha) = hold_in_thread(lock.clone());
        let owner_a = common::lock_value_at(&mut conn, &key)
            .map(|v| v.owner)
            .unwrap();

        let (tx, rx) = mpsc::channel();
        let (tx_done, rx_done) = mpsc::channel::<()>();
        let lock_b = lock.clone();
        let hb = thread::spawn(move || {
            let g = lock_b.lock().unwrap();
            tx.send(("outer", g.fencing_token(), g.is_held())).unwrap();
            let inner = lock_b.lock().unwrap();
            tx.send(("inner", inner.fencing_token(), inner.is_held()))
                .unwrap();
            rx_done.recv().unwrap();
            inner.unlock().unwrap();
            tx.send(("inner released", 0, g.is_held())).unwrap();
            rx_done.recv().unwrap();
            g.unlock().unwrap();
        });
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
        release_a.send(()).unwrap();
        ha.join().unwrap();

        let (_, token_b, held) = rx.recv().unwrap();
        assert_eq!(token_b, token_a + 1, "not handed off locally");
        assert!(held);
        let (_, inner, held) = rx.recv().unwrap();
        assert_eq!(inner, token_b, "a nested guard has the outer guard's token");
        assert!(held);
        common::assert_held_by(&mut conn, &key, &owner_a, 2);

        // The handing thread is not the owner any more, on the server's owner id or not;
        // nor is any other thread of the client.
        let again = lock.clone();
        let handing = thread::spawn(move || again.try_lock().unwrap().is_none());
        assert!(handing.join().unwrap(), "another thread re-entered");
        assert!(
            lock.try_lock().unwrap().is_none(),
            "another thread re-entered"
        );

        tx_done.send(()).unwrap();
        let (_, _, held) = rx.recv().unwrap();
        assert!(held, "the outer guard is still held");
        assert_eq!(
            common::lock_value_at(&mut conn, &key)
                .map(|v| v.count.to_string())
                .as_deref(),
            Some("1")
        );
        tx_done.send(()).unwrap();
        hb.join().unwrap();
        assert!(!common::exists(&mut conn, &key));
    });
}

/// A thread that handed the lock on and locks again later waits for it like anyone else,
/// and gets it with a higher token.
#[test]
fn the_handing_thread_locks_again_after_the_receiver() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let client = patient(&url);
        let name = fresh_name(&url, "handoff-again");
        let lock = client.mutex(&name).unwrap();
        let g = lock.lock().unwrap();
        let token_a = g.fencing_token();
        let (rx, tx_go, hb) = locker(lock.clone());
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
        g.unlock().unwrap();
        assert_eq!(rx.recv().unwrap(), token_a + 1);
        // The server still names this thread's old owner id: it must not be granted.
        assert!(lock.try_lock().unwrap().is_none());
        tx_go.send(()).unwrap();
        let again = lock.try_lock_for(Duration::from_secs(10)).unwrap().unwrap();
        assert!(again.fencing_token() > token_a + 1);
        hb.join().unwrap();
        again.unlock().unwrap();
        assert!(!common::exists(&mut conn, &common::lock_key(&name)));
    });
}

/// A lease lost while the lock is held through a hand-off is reported to the thread that
/// holds it then: `on_lease_lost` names its token, its guard says so, and its `unlock()`
/// errs.
#[test]
fn a_lease_lost_after_a_handoff_is_the_receivers() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let (tx_lost, rx_lost) = mpsc::channel();
        let tx_lost = StdMutex::new(tx_lost);
        let client = Client::builder(&url)
            .lease(Duration::from_secs(3))
            .renew_interval(Duration::from_millis(100))
            .local_handoff_max_time(Duration::from_secs(3))
            .on_lease_lost(move |l| {
                let _ = tx_lost.lock().unwrap().send(l.fencing_token);
            })
            .build()
            .unwrap();
        let name = fresh_name(&url, "handoff-lost");
        let lock = client.mutex(&name).unwrap();
        let (token_a, release_a, ha) = hold_in_thread(lock.clone());
        let (tx, rx) = mpsc::channel();
        let (tx_go, rx_go) = mpsc::channel::<()>();
        let hb = thread::spawn(move || {
            let g = lock.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            rx_go.recv().unwrap();
            let held = g.is_held();
            let checked = g.check();
            let unlocked = g.unlock();
            (held, checked, unlocked)
        });
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
        release_a.send(()).unwrap();
        ha.join().unwrap();
        let token_b = rx.recv().unwrap();
        assert_eq!(token_b, token_a + 1, "not handed off locally");

        redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .exec(&mut conn)
            .unwrap();
        let lost = rx_lost.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(lost, token_b, "the loss was not reported as the receiver's");
        tx_go.send(()).unwrap();
        let (held, checked, unlocked) = hb.join().unwrap();
        assert!(!held);
        assert!(matches!(checked, Err(Error::LeaseLost)), "{checked:?}");
        assert!(unlocked.is_err());
        assert!(rx_lost.try_recv().is_err(), "a loss was reported twice");
    });
}

/// With `local_handoff(false)` every release goes through Redis: the waiting thread gets the
/// lock from Redis, under its own owner id and a token from the server.
#[test]
fn option_off_releases_through_redis() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let client = Client::builder(&url).local_handoff(false).build().unwrap();
        let name = fresh_name(&url, "handoff-off");
        let key = common::lock_key(&name);
        let lock = client.mutex(&name).unwrap();
        let (token_a, release_a, ha) = hold_in_thread(lock.clone());
        let owner_a = common::lock_value_at(&mut conn, &key)
            .map(|v| v.owner)
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let hb = thread::spawn(move || {
            let g = lock.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            g.unlock().unwrap();
        });
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
        let before = common::script_calls(&mut conn);
        release_a.send(()).unwrap();
        ha.join().unwrap();
        let token_b = rx.recv().unwrap();
        hb.join().unwrap();
        assert!(
            token_b > token_a + 1,
            "handed off locally: {token_a} then {token_b}"
        );
        assert_ne!(common::owner_at(&mut conn, &key), Some(owner_a));
        // The release, the waiter's acquire and its release, at least.
        assert!(common::script_calls(&mut conn) >= before + 3);
    });
}

/// Bad hand-off bounds are refused by `build()`, naming the option, before any I/O.
#[test]
fn bad_handoff_bounds_are_refused() {
    // A closed port: a refusal must come before any connection is tried.
    let url = format!("redis://127.0.0.1:{}/", common::free_port());
    let refused = |b: locksmith::ClientBuilder, field: &str| match b.build() {
        Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
        other => panic!("{field}: expected InvalidConfig, got {other:?}"),
    };
    refused(
        Client::builder(&url).local_handoff_max_count(0),
        "local_handoff_max_count",
    );
    refused(
        Client::builder(&url).local_handoff_max_count(1024 + 1),
        "local_handoff_max_count",
    );
    refused(
        Client::builder(&url).local_handoff_max_time(Duration::ZERO),
        "local_handoff_max_time",
    );
    refused(
        Client::builder(&url)
            .lease(Duration::from_secs(1))
            .local_handoff_max_time(Duration::from_secs(2)),
        "local_handoff_max_time",
    );
    refused(
        Client::builder(&url)
            .lease(Duration::from_secs(1))
            .local_handoff_max_time(Duration::from_millis(10))
            .local_handoff_give_way(Duration::from_millis(1001)),
        "local_handoff_give_way",
    );
    // In range, the same values are fine (the build then fails on the closed port).
    let ok = Client::builder(&url)
        .local_handoff_max_count(1024)
        .local_handoff_max_time(Duration::from_secs(30))
        .local_handoff_give_way(Duration::from_secs(30))
        .connect_timeout(Duration::from_millis(200))
        .build();
    assert!(!matches!(ok, Err(Error::InvalidConfig { .. })), "{ok:?}");
    let off = Client::builder(&url)
        .local_handoff_give_way(Duration::ZERO)
        .connect_timeout(Duration::from_millis(200))
        .build();
    assert!(!matches!(off, Err(Error::InvalidConfig { .. })), "{off:?}");
}

/// A hand-off takes the next token of the block the grant reserved, and the slot's fencing mark
/// reaches the whole block (the grant raised it so), so that the next grant through Redis after
/// the run's release starts above every token the run could have issued.
#[test]
fn the_mark_reaches_a_hand_off_run_block() {
    let (_server, url, mut conn) = common::server_url_conn();
    with_deadline(Duration::from_secs(30), move || {
        let client = patient(&url);
        let name = fresh_name(&url, "handoff-block");
        let key = common::lock_key(&name);
        let lock = client.mutex(&name).unwrap();
        let (token_a, release_a, ha) = hold_in_thread(lock.clone());
        let upto = common::lock_value_at(&mut conn, &key).unwrap().upto;
        assert!(upto > token_a, "no hand-off block was reserved");
        let (tx, rx) = mpsc::channel();
        let lock_b = lock.clone();
        let hb = thread::spawn(move || {
            let g = lock_b.lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            g.unlock().unwrap();
        });
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);
        release_a.send(()).unwrap();
        ha.join().unwrap();
        let token_b = rx.recv().unwrap();
        hb.join().unwrap();
        assert_eq!(token_b, token_a + 1, "not handed off locally");
        common::assert_mark_covers(&mut conn, &name, upto);
        let other = Client::open(url.as_str()).unwrap();
        let g = other.mutex(&name).unwrap().lock().unwrap();
        assert!(
            g.fencing_token() > upto,
            "token {} after a run whose block reached {upto}",
            g.fencing_token()
        );
        g.unlock().unwrap();
    });
}

/// A run of hand-offs whose acquisition the server no longer has stops once this client
/// knows it: here another thread of the client was granted the lock through Redis (the key
/// was deleted, as an empty restart would lose it). A holds the lock; C queues for it; the key
/// goes; B takes the lock through Redis with a token from the server clock. A's hold is lost
/// from that moment (the server granted the name to another acquisition), so A must not hand
/// its stale acquisition to C, whose token would then sit below B's while B holds the lock.
/// C gets the lock from Redis after B, with a token above B's.
#[test]
fn a_run_stops_when_another_thread_is_granted_the_lock_through_redis() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let (tx_lost, rx_lost) = mpsc::channel();
        let tx_lost = StdMutex::new(tx_lost);
        let client = Client::builder(&url)
            .lease(Duration::from_secs(30))
            .local_handoff_max_time(Duration::from_secs(30))
            .on_lease_lost(move |l| {
                let _ = tx_lost.lock().unwrap().send(l.fencing_token);
            })
            .build()
            .unwrap();
        let name = fresh_name(&url, "handoff-superseded");
        let lock = client.mutex(&name).unwrap();
        let (tx_a, rx_a) = mpsc::channel();
        let (release_a, rx_go_a) = mpsc::channel::<()>();
        let lock_a = lock.clone();
        let ha = thread::spawn(move || {
            let g = lock_a.lock().unwrap();
            tx_a.send(g.fencing_token()).unwrap();
            rx_go_a.recv().unwrap();
            (g.is_held(), g.unlock())
        });
        let token_a = rx_a.recv().unwrap();
        let (rx_c, release_c, hc) = locker(lock.clone());
        common::wait_numsub(&mut conn, &common::release_channel(&name), 1);

        redis::cmd("DEL")
            .arg(common::lock_key(&name))
            .exec(&mut conn)
            .unwrap();
        let lock_b = lock.clone();
        let (tx_b, rx_b) = mpsc::channel();
        let (tx_go_b, rx_go_b) = mpsc::channel::<()>();
        let hb = thread::spawn(move || {
            let g = lock_b
                .try_lock()
                .unwrap()
                .expect("the lock was free on the server");
            tx_b.send(g.fencing_token()).unwrap();
            rx_go_b.recv().unwrap();
            g.unlock().unwrap();
        });
        let token_b = rx_b.recv().unwrap();
        assert!(
            token_b > token_a,
            "B's token {token_b} not above A's {token_a}"
        );
        let lost = rx_lost.recv_timeout(Duration::from_secs(5));
        assert_eq!(lost, Ok(token_a), "A's loss was not reported");

        // A's release: no hand-off of the lost acquisition to C.
        release_a.send(()).unwrap();
        let (held_a, unlocked_a) = ha.join().unwrap();
        assert!(!held_a, "A's guard reads held beside B's acquisition");
        assert!(unlocked_a.is_err(), "A's unlock: {unlocked_a:?}");
        assert!(
            rx_c.recv_timeout(Duration::from_millis(300)).is_err(),
            "C was handed the lock while B holds it"
        );
        tx_go_b.send(()).unwrap();
        hb.join().unwrap();
        let token_c = rx_c.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            token_c > token_b,
            "C's token {token_c} is not above B's {token_b}"
        );
        release_c.send(()).unwrap();
        hc.join().unwrap();
    });
}
