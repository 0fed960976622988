//! Test harness shared by the integration tests: the `locksmith-testkit` crate (in
//! `testkit/`), re-exported here so that every test file reaches it as `common::...`, plus
//! the helpers that need the library itself.
//!
//! - [`RedisServer`]: a private `redis-server` on a free port (never 6379), killed on `Drop`.
//! - [`unique_name`]: lock names that never collide between tests or runs.
//! - [`commandstats`] / [`script_calls`]: what Redis saw, from `INFO commandstats`.
//! - [`Monitor`]: every command Redis runs, from `MONITOR`, to attribute calls to one key.
//! - [`thread_count`]: threads of this process, from `/proc/self/status`; [`thread_sleeps`]:
//!   whether a named thread is parked.
//! - [`with_deadline`] / [`wait_until`]: every blocking step is bounded, so a hang fails the
//!   test instead of stalling CI.
//! - [`TestChild`]: re-runs the current test binary as a child process whose entry point is a
//!   `#[test] fn child_xxx()` that returns at once unless [`ROLE_VAR`] names it.
//! - [`locked_increments`] / [`assert_exact_and_fenced`]: counted critical sections under a
//!   [`locksmith::Mutex`], and the check that none was lost and tokens increased.
//!
//! And the modules some test files share: [`kinds`] (every lock type behind one trait, and the
//! scenarios written once for all of them), [`bounds`] (calls timed against a stalled server),
//! [`faults`] (holder and waiter threads of the fault tests), [`load`] (the load worker of the
//! fault and soak tests), [`capture`] (a logger that keeps every record).

#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::thread;
use std::time::Duration;

pub use locksmith_testkit::*;

pub mod bounds;
pub mod capture;
pub mod faults;
pub mod kinds;
pub mod load;

/// A read-modify-write increment of `key` (GET, a short pause to widen the race, SET): without
/// mutual exclusion, concurrent callers lose updates.
pub fn rmw_increment(conn: &mut redis::Connection, key: &str) {
    let v: Option<u64> = redis::cmd("GET").arg(key).query(conn).unwrap();
    thread::sleep(Duration::from_micros(200));
    redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .exec(conn)
        .unwrap();
}

/// `rounds` critical sections under `lock`, each appending its fencing token to the list
/// `tokens` (so the list is in acquisition order) and incrementing `counter`.
pub fn locked_increments(
    lock: &locksmith::Mutex,
    conn: &mut redis::Connection,
    counter: &str,
    tokens: &str,
    rounds: u64,
) {
    for _ in 0..rounds {
        let guard = lock.lock().unwrap();
        redis::cmd("RPUSH")
            .arg(tokens)
            .arg(guard.fencing_token())
            .exec(conn)
            .unwrap();
        rmw_increment(conn, counter);
        guard.unlock().unwrap();
    }
}

/// After [`locked_increments`] by several workers: the counter is exactly `expected` and the
/// recorded fencing tokens strictly increase in acquisition order.
pub fn assert_exact_and_fenced(conn: &mut redis::Connection, name: &str, expected: u64) {
    let total: u64 = redis::cmd("GET")
        .arg(format!("counter:{name}"))
        .query(conn)
        .unwrap();
    assert_eq!(total, expected, "increments were lost");
    let tokens: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("tokens:{name}"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    assert_eq!(tokens.len() as u64, expected);
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "fencing tokens not increasing: {} then {}",
            w[0],
            w[1]
        );
    }
}

/// Checks the fencing mark of `name`'s hash slot (`P{#N}:fence`) after grants whose highest
/// token was `token`: it holds at least that token, and has no expiry (one key per slot).
pub fn assert_mark_covers(conn: &mut redis::Connection, name: &str, token: u64) {
    let key = fence_key(name);
    let mark: Option<u64> = redis::cmd("GET").arg(&key).query(conn).unwrap();
    let mark = mark.unwrap_or_else(|| panic!("no fencing mark at {key}"));
    assert!(mark >= token, "the mark {mark} is below the token {token}");
    assert_eq!(pttl(conn, &key), -1, "the mark {key} has an expiry");
}

/// A private `redis-server` and its URL.
pub fn server_url() -> (RedisServer, String) {
    let server = RedisServer::start();
    let url = server.url();
    (server, url)
}

/// A private `redis-server`, its URL and a connection to it.
pub fn server_url_conn() -> (RedisServer, String, redis::Connection) {
    let (server, url) = server_url();
    let conn = server.conn();
    (server, url, conn)
}

/// `N` clients of `url`, each with the default settings (each its own owner of the locks it
/// takes).
pub fn clients<const N: usize>(url: &str) -> [locksmith::Client; N] {
    std::array::from_fn(|_| locksmith::Client::open(url).unwrap())
}

/// Runs `n` copies of the child `test_name` (role `role`, settings `envs`) at once, and waits
/// until each has exited successfully, within `timeout` each.
pub fn run_children(
    n: usize,
    test_name: &str,
    role: &str,
    envs: &[(&str, String)],
    timeout: Duration,
) {
    let mut children: Vec<TestChild> = (0..n)
        .map(|_| TestChild::spawn(test_name, role, envs))
        .collect();
    for child in &mut children {
        let status = child.wait_timeout(timeout);
        assert!(status.success(), "a {test_name} process failed: {status}");
    }
}

/// In the child process of role `role` (see [`TestChild`]): its `LS_URL` and `LS_NAME`;
/// `None` in any other process, where the child's `#[test]` returns at once.
pub fn child_url_name(role: &str) -> Option<(String, String)> {
    is_child(role).then(|| (child_env("LS_URL"), child_env("LS_NAME")))
}

/// A client built by `builder` that counts the leases it reports lost (`on_lease_lost`).
pub fn count_losses(
    builder: locksmith::ClientBuilder,
) -> (
    locksmith::Client,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let lost = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let l = std::sync::Arc::clone(&lost);
    let client = builder
        .on_lease_lost(move |_| {
            l.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .build()
        .unwrap();
    (client, lost)
}

/// A private `redis-server`, a connection to it, and a [`proxy::Proxy`] in front of it with
/// the proxy's URL.
pub fn proxied() -> (RedisServer, redis::Connection, proxy::Proxy, String) {
    let server = RedisServer::start();
    let conn = server.conn();
    let proxy = proxy::Proxy::start(server.port());
    let purl = proxy.url();
    (server, conn, proxy, purl)
}

/// Starts the child `test_name` (role `role`) for lock `name` of `url`: `LS_URL`, `LS_NAME`,
/// then the settings `more`.
pub fn spawn_child(
    test_name: &str,
    role: &str,
    url: &str,
    name: &str,
    more: &[(&str, String)],
) -> TestChild {
    let mut envs = vec![("LS_URL", url.to_owned()), ("LS_NAME", name.to_owned())];
    envs.extend(more.iter().cloned());
    TestChild::spawn(test_name, role, &envs)
}

/// [`spawn_child`] with the lease `LS_LEASE_MS`.
pub fn spawn_leased(
    test_name: &str,
    role: &str,
    url: &str,
    name: &str,
    lease: Duration,
) -> TestChild {
    let lease_ms = ("LS_LEASE_MS", lease.as_millis().to_string());
    spawn_child(test_name, role, url, name, &[lease_ms])
}

/// A thread waiting for a lock ([`await_lock`]).
pub struct Awaiting {
    pub thread: thread::JoinHandle<()>,
    /// When its wait ended, and the fencing token it got (`None`: it timed out).
    pub rx: std::sync::mpsc::Receiver<(std::time::Instant, Option<u64>)>,
}

impl Awaiting {
    /// Runs `release`, then waits at most `timeout` for the waiter, which must have got the
    /// lock: how long after the release began it did, and its token. Joins the waiter.
    pub fn woken_by(self, release: impl FnOnce(), timeout: Duration) -> (Duration, u64) {
        let released = std::time::Instant::now();
        release();
        let (at, token) = self.rx.recv_timeout(timeout).unwrap();
        let token = token.expect("the waiter timed out");
        self.thread.join().unwrap();
        (at.duration_since(released), token)
    }
}

/// A thread waiting for `lock` (`try_lock_for(wait)`): it reports when its wait ended and the
/// fencing token it got, then releases.
pub fn await_lock(lock: locksmith::Mutex, wait: Duration) -> Awaiting {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = thread::spawn(move || {
        let g = lock.try_lock_for(wait).unwrap();
        let at = std::time::Instant::now();
        tx.send((at, g.as_ref().map(|g| g.fencing_token())))
            .unwrap();
    });
    Awaiting { thread, rx }
}

/// Every lease a client reports lost (`on_lease_lost`), in order.
pub type LostLog = std::sync::Arc<std::sync::Mutex<Vec<locksmith::LostLease>>>;

/// A client built by `builder` that keeps every lost lease it reports.
pub fn lost_log(builder: locksmith::ClientBuilder) -> (locksmith::Client, LostLog) {
    let lost = LostLog::default();
    let l = std::sync::Arc::clone(&lost);
    let client = builder
        .on_lease_lost(move |x| l.lock().unwrap().push(x.clone()))
        .build()
        .unwrap();
    (client, lost)
}

/// The owner of the lock at `key`, as the server has it (`None`: not held).
pub fn owner_at(conn: &mut redis::Connection, key: &str) -> Option<String> {
    lock_value_at(conn, key).map(|v| v.owner)
}

/// Checks that `owner` holds the lock at `key`, `levels` deep, as the server has it.
pub fn assert_held_by(conn: &mut redis::Connection, key: &str, owner: &str, levels: u64) {
    let v = lock_value_at(conn, key).unwrap_or_else(|| panic!("{key} is not held"));
    assert_eq!(v.owner, owner, "{key}: another owner");
    assert_eq!(v.count, levels, "{key}: another count of levels");
}

/// Runs `scenario` with the URL of a private server and a connection to it, failing the test
/// when it takes longer than `limit`.
pub fn on_server<T: Send + 'static>(
    limit: Duration,
    scenario: impl FnOnce(String, redis::Connection) -> T + Send + 'static,
) -> T {
    let (_server, url, conn) = server_url_conn();
    with_deadline(limit, move || scenario(url, conn))
}

/// Two clients of `url` (two owners), a fresh lock name from `prefix`, and that lock's mutex
/// through each client.
pub fn two_owners(
    url: &str,
    prefix: &str,
) -> ([locksmith::Client; 2], String, [locksmith::Mutex; 2]) {
    let clients = clients::<2>(url);
    let name = unique_name(prefix);
    let locks = [0, 1].map(|i| clients[i].mutex(&name).unwrap());
    (clients, name, locks)
}

/// The critical section of worker `worker` of this process under lock `lock`, with `token`,
/// from `start` to `end` (monotonic ns), and whether the guard still held at its end.
pub fn section(
    lock: &str,
    worker: u32,
    token: u64,
    (start, end): (u64, u64),
    held: bool,
) -> checker::Interval {
    checker::Interval {
        lock: lock.to_owned(),
        pid: std::process::id(),
        worker,
        token,
        start,
        end,
        held,
    }
}

/// Checks that a bounded wait (`try_for(wait)`: a `try_lock_for`) ends without the lock, and
/// not before `wait` passed.
pub fn assert_waits_in_vain<G>(
    wait: Duration,
    try_for: impl FnOnce(Duration) -> locksmith::Result<Option<G>>,
) {
    let start = std::time::Instant::now();
    assert!(try_for(wait).unwrap().is_none(), "got a held lock");
    let waited = start.elapsed();
    assert!(waited >= wait, "gave up after {waited:?}, before {wait:?}");
}

/// In a child process: the setting `var`, parsed.
pub fn child_var<T: std::str::FromStr>(var: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    child_env(var).parse().unwrap()
}

/// In a child process: the setting `var`, a number of milliseconds.
pub fn child_ms(var: &str) -> Duration {
    Duration::from_millis(child_var(var))
}

/// In a child process: the setting `var`, a list of strings `sep` parts.
pub fn child_list(var: &str, sep: char) -> Vec<String> {
    child_env(var).split(sep).map(str::to_owned).collect()
}

/// A client of `url` (one owner), a fresh lock name from `prefix`, and that lock's mutex.
pub fn one_owner(url: &str, prefix: &str) -> (locksmith::Client, String, locksmith::Mutex) {
    let client = locksmith::Client::open(url).unwrap();
    let name = unique_name(prefix);
    let lock = client.mutex(&name).unwrap();
    (client, name, lock)
}

/// How long a waiter of another client takes to get the lock once `release` frees it
/// (`release` gets the holding guard, and returns when it began the release).
pub fn mutex_wake(
    server: &RedisServer,
    release: impl FnOnce(locksmith::MutexGuard) -> std::time::Instant,
) -> Duration {
    let holder = locksmith::Client::open(server.url().as_str()).unwrap();
    let waiter = locksmith::Client::open(server.url().as_str()).unwrap();
    let name = unique_name("wake");
    let guard = holder.mutex(&name).unwrap().lock().unwrap();
    let w = {
        let name = name.clone();
        thread::spawn(move || {
            let g = waiter.mutex(&name).unwrap().lock().unwrap();
            let at = std::time::Instant::now();
            drop(g);
            at
        })
    };
    // The waiter sleeps on the release channel once its attempt flagged the lock ('w': its
    // release publishes).
    let mut conn = server.conn();
    let flagged = wait_until(Duration::from_secs(5), || {
        let v: Option<String> = redis::cmd("GET")
            .arg(lock_key(&name))
            .query(&mut conn)
            .unwrap();
        v.is_some_and(|v| v.ends_with('w'))
    });
    assert!(flagged, "the waiter never flagged the lock");
    let started = release(guard);
    w.join().unwrap().saturating_duration_since(started)
}

/// Whether the thread of this process called `name` sleeps (state `S`: parked, since it does
/// no I/O where the test looks for it).
pub fn thread_sleeps(name: &str) -> bool {
    tasks().iter().any(|(tid, comm)| {
        comm == name
            && std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
                .unwrap_or(false)
    })
}
