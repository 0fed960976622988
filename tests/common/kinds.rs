//! Every lock type behind one interface, for the scenarios that hold for each of them: a
//! [`Kind`] opens a [`TestLock`] (a `Mutex`, a `FairMutex`, an `RwLock` as writer or as
//! reader, a `Semaphore` whose guard takes all its permits, a `MultiMutex` of two names), whose
//! guards are [`Held`]. The scenarios below are written once and run for every kind a test file
//! names; the child entry points ([`child_holder`], [`child_workers`]) are called from a
//! `#[test] fn child_kind_...()` of the test file that spawns them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Result};
use locksmith_testkit::checker::{self, Interval, Store, StoreClient};
use locksmith_testkit::{RedisServer, TestChild, child_env, is_child, mono_ns, wait_until};

/// Allowance for scheduling delays on a busy 2-core machine.
pub const SLACK: Duration = Duration::from_millis(400);

/// A lock type, as the scenarios see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Mutex,
    Fair,
    /// An `RwLock` taken for writing.
    Writer,
    /// An `RwLock` taken for reading.
    Reader,
    /// A `Semaphore` of this many permits; a guard takes every one of them.
    Semaphore(u32),
    /// A `MultiMutex` of the name and the name with `:2` after it.
    Multi,
}

/// A guard of any lock type.
pub trait Held {
    /// The fencing token (0 for a read guard or a semaphore's permits, which have none; a
    /// multi guard's token of its first name).
    fn token(&self) -> u64;
    fn is_held(&self) -> bool;
    fn check(&self) -> Result<()>;
    fn validity(&self) -> Duration;
    /// `unlock()`.
    fn unlock(self: Box<Self>) -> Result<()>;
    /// `detach()`: the hold, free to move to another thread; the guard back when it cannot
    /// move (a re-entered hold).
    fn detach(self: Box<Self>) -> std::result::Result<Box<dyn Moving>, Box<dyn Held>>;
}

/// A hold of any lock type detached from its guard ([`locksmith::Detached`]; a permit as it
/// is), which may move to another thread.
pub trait Moving: Send {
    fn is_held(&self) -> bool;
    /// `attach()`: a guard of the calling thread.
    fn attach(self: Box<Self>) -> Result<Box<dyn Held>>;
    /// `unlock()` from the calling thread, without attaching.
    fn unlock(self: Box<Self>) -> Result<()>;
}

/// `detach` of a guard type, and `Moving` for its detached hold.
macro_rules! moving {
    ($($guard:ty),* $(,)?) => {$(
        impl Moving for locksmith::Detached<$guard> {
            fn is_held(&self) -> bool {
                locksmith::Detached::is_held(self)
            }
            fn attach(self: Box<Self>) -> Result<Box<dyn Held>> {
                boxed(locksmith::Detached::attach(*self))
            }
            fn unlock(self: Box<Self>) -> Result<()> {
                locksmith::Detached::unlock(*self)
            }
        }
    )*};
}

moving!(
    locksmith::MutexGuard,
    locksmith::FairMutexGuard,
    locksmith::RwLockWriteGuard,
    locksmith::RwLockReadGuard,
    locksmith::MultiGuard,
);

/// A permit is `Send` already: it moves as it is, with nothing to attach.
impl Moving for locksmith::SemaphorePermit {
    fn is_held(&self) -> bool {
        locksmith::SemaphorePermit::is_held(self)
    }
    fn attach(self: Box<Self>) -> Result<Box<dyn Held>> {
        Ok(self)
    }
    fn unlock(self: Box<Self>) -> Result<()> {
        locksmith::SemaphorePermit::unlock(*self)
    }
}

/// What [`Held::detach`] gives for a guard of type `G`.
fn detached<G: Held + 'static, D: Moving + 'static>(
    r: std::result::Result<D, G>,
) -> std::result::Result<Box<dyn Moving>, Box<dyn Held>> {
    r.map(|d| Box::new(d) as Box<dyn Moving>)
        .map_err(|g| Box::new(g) as Box<dyn Held>)
}

/// A lock handle of any type: the acquire forms every type has, and whether the server says
/// it is taken.
pub trait TestLock: Send + Sync {
    fn kind(&self) -> Kind;
    fn lock(&self) -> Result<Box<dyn Held>>;
    fn try_lock(&self) -> Result<Option<Box<dyn Held>>>;
    fn try_lock_for(&self, timeout: Duration) -> Result<Option<Box<dyn Held>>>;
    fn try_lock_until(&self, deadline: Instant) -> Result<Option<Box<dyn Held>>>;
    /// What the server says: `is_locked()`; the writer (`Writer`) or the readers (`Reader`)
    /// of a read-write lock; no permit available (`Semaphore`); any name locked (`Multi`).
    fn is_locked(&self) -> Result<bool>;
}

fn boxed<G: Held + 'static>(r: Result<G>) -> Result<Box<dyn Held>> {
    r.map(|g| Box::new(g) as Box<dyn Held>)
}

fn boxed_opt<G: Held + 'static>(r: Result<Option<G>>) -> Result<Option<Box<dyn Held>>> {
    r.map(|g| g.map(|g| Box::new(g) as Box<dyn Held>))
}

/// `Held` for a guard type, whose token `$token` reads.
macro_rules! held {
    ($($guard:ty => $token:expr),* $(,)?) => {$(
        impl Held for $guard {
            fn token(&self) -> u64 {
                let token: fn(&$guard) -> u64 = $token;
                token(self)
            }
            fn is_held(&self) -> bool {
                <$guard>::is_held(self)
            }
            fn check(&self) -> Result<()> {
                <$guard>::check(self)
            }
            fn validity(&self) -> Duration {
                <$guard>::validity(self)
            }
            fn unlock(self: Box<Self>) -> Result<()> {
                <$guard>::unlock(*self)
            }
            fn detach(self: Box<Self>) -> std::result::Result<Box<dyn Moving>, Box<dyn Held>> {
                detached(<$guard>::detach(*self))
            }
        }
    )*};
}

held!(
    locksmith::MutexGuard => |g| g.fencing_token(),
    locksmith::FairMutexGuard => |g| g.fencing_token(),
    locksmith::RwLockWriteGuard => |g| g.fencing_token(),
    locksmith::RwLockReadGuard => |_| 0,
    locksmith::MultiGuard => |g| g.fencing_token(g.names().next().unwrap()).unwrap(),
);

impl Held for locksmith::SemaphorePermit {
    fn token(&self) -> u64 {
        0
    }
    fn is_held(&self) -> bool {
        locksmith::SemaphorePermit::is_held(self)
    }
    fn check(&self) -> Result<()> {
        locksmith::SemaphorePermit::check(self)
    }
    fn validity(&self) -> Duration {
        locksmith::SemaphorePermit::validity(self)
    }
    fn unlock(self: Box<Self>) -> Result<()> {
        locksmith::SemaphorePermit::unlock(*self)
    }
    fn detach(self: Box<Self>) -> std::result::Result<Box<dyn Moving>, Box<dyn Held>> {
        Ok(self)
    }
}

/// `TestLock` for a wrapper of a lock handle: its kind, its four acquire forms (the handle's
/// methods named `$lock`, `$try`, ...), and `is_locked` as `$locked` says.
macro_rules! test_lock {
    ($wrapper:ty, $kind:expr, $lock:ident, $try:ident, $for:ident, $until:ident, $locked:expr) => {
        impl TestLock for $wrapper {
            fn kind(&self) -> Kind {
                $kind
            }
            fn lock(&self) -> Result<Box<dyn Held>> {
                boxed(self.0.$lock())
            }
            fn try_lock(&self) -> Result<Option<Box<dyn Held>>> {
                boxed_opt(self.0.$try())
            }
            fn try_lock_for(&self, timeout: Duration) -> Result<Option<Box<dyn Held>>> {
                boxed_opt(self.0.$for(timeout))
            }
            fn try_lock_until(&self, deadline: Instant) -> Result<Option<Box<dyn Held>>> {
                boxed_opt(self.0.$until(deadline))
            }
            fn is_locked(&self) -> Result<bool> {
                let locked: fn(&$wrapper) -> Result<bool> = $locked;
                locked(self)
            }
        }
    };
}

struct MutexLock(locksmith::Mutex);
struct FairLock(locksmith::FairMutex);
struct WriterLock(locksmith::RwLock);
struct ReaderLock(locksmith::RwLock);
struct SemLock(locksmith::Semaphore);
struct MultiLock(locksmith::MultiMutex, Vec<locksmith::Mutex>);

test_lock! { MutexLock, Kind::Mutex, lock, try_lock, try_lock_for, try_lock_until, |l| {
    l.0.is_locked()
} }
test_lock! { FairLock, Kind::Fair, lock, try_lock, try_lock_for, try_lock_until, |l| {
    l.0.is_locked()
} }
test_lock! { WriterLock, Kind::Writer, write, try_write, try_write_for, try_write_until, |l| {
    l.0.writer().map(|w| w.is_some())
} }
test_lock! { ReaderLock, Kind::Reader, read, try_read, try_read_for, try_read_until, |l| {
    l.0.readers().map(|r| !r.is_empty())
} }
test_lock! { MultiLock, Kind::Multi, lock, try_lock, try_lock_for, try_lock_until, |l| {
    // Any of its names.
    for m in &l.1 {
        if m.is_locked()? {
            return Ok(true);
        }
    }
    Ok(false)
} }

impl TestLock for SemLock {
    fn kind(&self) -> Kind {
        Kind::Semaphore(self.0.permits())
    }
    /// One permit: `acquire`, `try_acquire`, ...; several: the `_many` forms, for all of them.
    fn lock(&self) -> Result<Box<dyn Held>> {
        match self.0.permits() {
            1 => boxed(self.0.acquire()),
            n => boxed(self.0.acquire_many(n)),
        }
    }
    fn try_lock(&self) -> Result<Option<Box<dyn Held>>> {
        match self.0.permits() {
            1 => boxed_opt(self.0.try_acquire()),
            n => boxed_opt(self.0.try_acquire_many_for(n, Duration::ZERO)),
        }
    }
    fn try_lock_for(&self, timeout: Duration) -> Result<Option<Box<dyn Held>>> {
        match self.0.permits() {
            1 => boxed_opt(self.0.try_acquire_for(timeout)),
            n => boxed_opt(self.0.try_acquire_many_for(n, timeout)),
        }
    }
    fn try_lock_until(&self, deadline: Instant) -> Result<Option<Box<dyn Held>>> {
        match self.0.permits() {
            1 => boxed_opt(self.0.try_acquire_until(deadline)),
            n => {
                let left = deadline.saturating_duration_since(Instant::now());
                boxed_opt(self.0.try_acquire_many_for(n, left))
            }
        }
    }
    fn is_locked(&self) -> Result<bool> {
        self.0.available().map(|a| a == 0)
    }
}

impl Kind {
    /// Opens lock `name` of this kind on `client`.
    pub fn open(self, client: &Client, name: &str) -> Box<dyn TestLock> {
        match self {
            Kind::Mutex => Box::new(MutexLock(client.mutex(name).unwrap())),
            Kind::Fair => Box::new(FairLock(client.fair_mutex(name).unwrap())),
            Kind::Writer => Box::new(WriterLock(client.rw_lock(name).unwrap())),
            Kind::Reader => Box::new(ReaderLock(client.rw_lock(name).unwrap())),
            Kind::Semaphore(n) => Box::new(SemLock(client.semaphore(name, n).unwrap())),
            Kind::Multi => {
                let names = [name.to_owned(), format!("{name}:2")];
                let each = names.iter().map(|n| client.mutex(n).unwrap()).collect();
                Box::new(MultiLock(client.multi_lock(&names).unwrap(), each))
            }
        }
    }

    /// Whether `other` could take lock `name` of this kind now (for a reader: a writer, as
    /// readers share), giving it back at once.
    pub fn free_for(self, other: &Client, name: &str) -> bool {
        let taker = if self == Kind::Reader {
            Kind::Writer
        } else {
            self
        };
        taker.open(other, name).try_lock().unwrap().is_some()
    }

    /// Whether a guard of this kind excludes every other guard of the same lock.
    pub fn exclusive(self) -> bool {
        self != Kind::Reader
    }

    /// Whether its guards carry fencing tokens.
    pub fn fenced(self) -> bool {
        !matches!(self, Kind::Reader | Kind::Semaphore(_))
    }

    /// How many callers wait for lock `name` of this kind, as the server shows them: the fair
    /// queue's length, the waiting writers or readers of a read-write lock, the subscribers of
    /// the release channel (`Mutex`, `Semaphore`; `Multi`: of both its names).
    pub fn waiting(self, conn: &mut redis::Connection, name: &str) -> usize {
        let tag = format!("locksmith:{{{}}}", locksmith_testkit::encode_name(name));
        let count = |conn: &mut redis::Connection, cmd: &str, key: String| -> usize {
            redis::cmd(cmd).arg(key).query(conn).unwrap()
        };
        match self {
            Kind::Fair => count(conn, "LLEN", format!("{tag}:fair:queue")),
            Kind::Writer => count(conn, "ZCARD", format!("{tag}:rw:wwait")),
            Kind::Reader => count(conn, "ZCARD", format!("{tag}:rw:rwait")),
            Kind::Semaphore(_) => {
                locksmith_testkit::numsub(conn, &format!("{tag}:sem:released")) as usize
            }
            Kind::Mutex => {
                let channel = locksmith_testkit::release_channel(name);
                locksmith_testkit::numsub(conn, &channel) as usize
            }
            // A set waits on the channel of whichever name blocked it.
            Kind::Multi => [name.to_owned(), format!("{name}:2")]
                .iter()
                .map(|n| {
                    let channel = locksmith_testkit::release_channel(n);
                    locksmith_testkit::numsub(conn, &channel) as usize
                })
                .sum(),
        }
    }

    /// Waits until `n` callers wait for lock `name` (see [`Kind::waiting`]).
    pub fn wait_waiting(self, conn: &mut redis::Connection, name: &str, n: usize) {
        assert!(
            wait_until(Duration::from_secs(20), || self.waiting(conn, name) == n),
            "{self:?} {name}: never {n} waiting (now {})",
            self.waiting(conn, name)
        );
    }

    /// How a child process is told the kind (`LS_KIND`).
    pub fn env(self) -> String {
        match self {
            Kind::Mutex => "mutex".into(),
            Kind::Fair => "fair".into(),
            Kind::Writer => "writer".into(),
            Kind::Reader => "reader".into(),
            Kind::Semaphore(n) => format!("semaphore:{n}"),
            Kind::Multi => "multi".into(),
        }
    }

    /// The kind [`Kind::env`] names.
    pub fn parse(s: &str) -> Kind {
        match s {
            "mutex" => Kind::Mutex,
            "fair" => Kind::Fair,
            "writer" => Kind::Writer,
            "reader" => Kind::Reader,
            "multi" => Kind::Multi,
            other => {
                let n = other.strip_prefix("semaphore:").expect("a lock kind");
                Kind::Semaphore(n.parse().unwrap())
            }
        }
    }
}

/// Every kind, a semaphore of one permit.
pub const ALL: [Kind; 6] = [
    Kind::Mutex,
    Kind::Fair,
    Kind::Writer,
    Kind::Reader,
    Kind::Semaphore(1),
    Kind::Multi,
];

/// A client whose leases last `lease`.
pub fn client_with_lease(url: &str, lease: Duration) -> Client {
    Client::builder(url).lease(lease).build().unwrap()
}

// ---------------------------------------------------------------------------------------------
// A holder in a child process
// ---------------------------------------------------------------------------------------------

/// Child (`#[test] fn child_kind_holder()` calls it): takes lock `LS_NAME` of kind `LS_KIND`
/// with lease `LS_LEASE_MS`, prints `locked`, then `lost` once its guard says the lease is gone
/// (`check()` errs too), then `unlock refused` when the unlock reports the loss.
pub fn child_holder() {
    if !is_child("kind-holder") {
        return;
    }
    let kind = Kind::parse(&child_env("LS_KIND"));
    let lease = Duration::from_millis(child_env("LS_LEASE_MS").parse().unwrap());
    let client = client_with_lease(&child_env("LS_URL"), lease);
    let lock = kind.open(&client, &child_env("LS_NAME"));
    let g = lock.lock().unwrap();
    println!("locked");
    while g.is_held() {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(g.check().is_err());
    println!("lost");
    let e = g.unlock().unwrap_err();
    assert!(e.is_lease_lost(), "{e}");
    println!("unlock refused");
}

/// Starts [`child_holder`] and returns once it holds the lock.
pub fn spawn_holder(kind: Kind, url: &str, name: &str, lease: Duration) -> TestChild {
    let c = super::spawn_child(
        "child_kind_holder",
        "kind-holder",
        url,
        name,
        &[
            ("LS_KIND", kind.env()),
            ("LS_LEASE_MS", lease.as_millis().to_string()),
        ],
    );
    c.wait_line("locked", Duration::from_secs(30));
    c
}

/// A holder of kind `holder` killed with SIGKILL: a waiter of kind `waiter` (another client),
/// refused while the holder lived and waiting when it died, gets the lock within a lease
/// (+ slack).
pub fn killed_holder_frees_the_lock_within_a_lease(holder: Kind, waiter: Kind, prefix: &str) {
    let lease = Duration::from_secs(1);
    let (_server, url, mut conn) = super::server_url_conn();
    let name = locksmith_testkit::unique_name(prefix);
    let mut child = spawn_holder(holder, &url, &name, lease);
    let c = client_with_lease(&url, lease);
    assert!(
        holder.open(&c, &name).is_locked().unwrap(),
        "no {holder:?} seen"
    );
    assert!(
        waiter.open(&c, &name).try_lock().unwrap().is_none(),
        "{waiter:?} got in beside a live {holder:?}"
    );
    let (tx, rx) = mpsc::channel();
    let name2 = name.clone();
    let w = thread::spawn(move || {
        let l = waiter.open(&c, &name2);
        let g = l.try_lock_for(Duration::from_secs(20)).unwrap();
        tx.send((Instant::now(), g.is_some())).unwrap();
    });
    waiter.wait_waiting(&mut conn, &name, 1);
    let killed = Instant::now();
    child.kill9();
    let (at, got) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(got, "{waiter:?} never got the lock");
    let waited = at - killed;
    println!("{holder:?} holder killed, {waiter:?} waiter acquired {waited:?} later");
    assert!(waited <= lease + SLACK, "{holder:?}/{waiter:?}: {waited:?}");
    w.join().unwrap();
}

/// A holder of kind `holder` paused (SIGSTOP) for two leases: a waiter of kind `waiter` gets
/// the lock within a lease (+ slack); once resumed, the paused holder reports itself lost and
/// its unlock is refused, and the new holder still holds.
pub fn paused_holder_loses_the_lock_and_says_so(holder: Kind, waiter: Kind, prefix: &str) {
    let lease = Duration::from_secs(1);
    let (_server, url, mut conn) = super::server_url_conn();
    let name = locksmith_testkit::unique_name(prefix);
    let child = spawn_holder(holder, &url, &name, lease);
    let (tx, rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (url2, name2) = (url.clone(), name.clone());
    let w = thread::spawn(move || {
        let c = client_with_lease(&url2, lease);
        let l = waiter.open(&c, &name2);
        let g = l.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
        tx.send(Instant::now()).unwrap();
        release_rx.recv().unwrap();
        // The resumed holder took nothing from the new one.
        assert!(g.is_held());
        assert!(l.is_locked().unwrap());
        g.unlock().unwrap();
    });
    waiter.wait_waiting(&mut conn, &name, 1);
    child.signal("STOP");
    let stopped = Instant::now();
    let at = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let waited = at - stopped;
    assert!(waited <= lease + SLACK, "{holder:?}/{waiter:?}: {waited:?}");
    thread::sleep((lease * 2).saturating_sub(stopped.elapsed()));
    child.signal("CONT");
    child.wait_line("lost", Duration::from_secs(5));
    child.wait_line("unlock refused", Duration::from_secs(5));
    release_tx.send(()).unwrap();
    w.join().unwrap();
}

/// Redis restarts empty while a holder of kind `holder` holds and `n` waiters of kind `waiter`
/// wait: the holder reports itself lost, the waiters wait again after the reconnect and all get
/// the lock soon after the restart: exclusive ones one at a time, with tokens above the old
/// holder's; no call blocks past its bound.
pub fn waiters_recover_from_a_redis_restart(holder: Kind, waiter: Kind, n: usize, prefix: &str) {
    let lease = Duration::from_secs(1);
    let mut server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = locksmith_testkit::unique_name(prefix);
    let c = client_with_lease(&url, lease);
    let lock = holder.open(&c, &name);
    let g = lock.lock().unwrap();
    let old = g.token();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..n)
        .map(|_| {
            let (url, name, tx) = (url.clone(), name.clone(), tx.clone());
            thread::spawn(move || {
                let c = client_with_lease(&url, lease);
                let l = waiter.open(&c, &name);
                let g = l.try_lock_for(Duration::from_secs(20)).unwrap().unwrap();
                let (start, token) = (mono_ns(), g.token());
                thread::sleep(Duration::from_millis(20));
                let end = mono_ns();
                tx.send((Instant::now(), token, start, end, g.is_held()))
                    .unwrap();
                g.unlock().unwrap();
            })
        })
        .collect();
    waiter.wait_waiting(&mut conn, &name, n);
    server.restart();
    let restarted = Instant::now();
    let mut got: Vec<_> = (0..n)
        .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
        .collect();
    for w in waiters {
        w.join().unwrap();
    }
    let last = got.iter().map(|x| x.0 - restarted).max().unwrap();
    println!("{waiter:?}: {n} waiters all served {last:?} after the restart");
    assert!(last < Duration::from_secs(2) + SLACK, "{last:?}");
    assert!(got.iter().all(|x| x.4), "a waiter's guard said lost");
    if waiter.exclusive() {
        got.sort_by_key(|x| x.2);
        for w in got.windows(2) {
            assert!(w[0].3 <= w[1].2, "sections overlapped");
            if waiter.fenced() {
                assert!(w[0].1 < w[1].1, "tokens not increasing");
            }
        }
        if waiter.fenced() && holder.fenced() {
            assert!(got.iter().all(|x| x.1 > old), "a token not above {old}");
        }
    }
    assert!(wait_until(lease + SLACK, || !g.is_held()));
    assert!(g.unlock().unwrap_err().is_lease_lost());
}

// ---------------------------------------------------------------------------------------------
// Exclusion across processes
// ---------------------------------------------------------------------------------------------

/// Child (`#[test] fn child_kind_workers()` calls it): `LS_THREADS` workers doing `LS_ROUNDS`
/// sections each on lock `LS_NAME`; worker `w`'s round `r` takes kind number `(r + w) % len`
/// of `LS_KINDS` (comma-separated). An exclusive section increments the store's value under
/// its fencing token; a shared one reads it and stays 3 ms. Intervals are logged with the
/// lock name `<name>:w` (exclusive) or `<name>:r` (shared).
pub fn child_workers() {
    if !is_child("kind-workers") {
        return;
    }
    let name = child_env("LS_NAME");
    let port: u16 = child_env("LS_STORE").parse().unwrap();
    let threads: u32 = child_env("LS_THREADS").parse().unwrap();
    let rounds: u32 = child_env("LS_ROUNDS").parse().unwrap();
    let client = Client::open(child_env("LS_URL")).unwrap();
    let locks: Vec<Box<dyn TestLock>> = child_env("LS_KINDS")
        .split(',')
        .map(|k| Kind::parse(k).open(&client, &name))
        .collect();
    thread::scope(|s| {
        for worker in 0..threads {
            let (locks, name) = (&locks, &name);
            s.spawn(move || {
                let mut store = StoreClient::connect(port);
                for round in 0..rounds {
                    let lock = &locks[((round + worker) as usize) % locks.len()];
                    let exclusive = lock.kind().exclusive();
                    let g = lock.lock().unwrap();
                    let start = mono_ns();
                    g.check().unwrap();
                    let v = store.read(name);
                    if exclusive {
                        assert!(store.write(name, g.token(), v + 1));
                    } else {
                        thread::sleep(Duration::from_millis(3));
                    }
                    let end = mono_ns();
                    let (mode, token) = if exclusive {
                        ("w", g.token())
                    } else {
                        ("r", 0)
                    };
                    let lock = format!("{name}:{mode}");
                    let held = g.check().is_ok();
                    store.interval(&super::section(&lock, worker, token, (start, end), held));
                    g.unlock().unwrap();
                }
            });
        }
    });
    println!("done");
}

/// 3 processes x 3 threads x `rounds` sections on one lock, each section of one of `kinds` in
/// turn: no exclusive section overlaps any other section, their tokens increase in acquisition
/// order, the store's count is exact; shared sections did overlap one another.
pub fn exclusion_across_processes(kinds: &[Kind], rounds: usize, prefix: &str) {
    let server = RedisServer::start();
    let store = Store::start();
    let name = locksmith_testkit::unique_name(prefix);
    let (procs, threads) = (3, 3);
    let kinds_env: Vec<String> = kinds.iter().map(|k| k.env()).collect();
    let children: Vec<TestChild> = (0..procs)
        .map(|_| {
            super::spawn_child(
                "child_kind_workers",
                "kind-workers",
                &server.url(),
                &name,
                &[
                    ("LS_KINDS", kinds_env.join(",")),
                    ("LS_STORE", store.port().to_string()),
                    ("LS_THREADS", threads.to_string()),
                    ("LS_ROUNDS", rounds.to_string()),
                ],
            )
        })
        .collect();
    for c in &children {
        c.wait_line("done", Duration::from_secs(120));
    }
    let all = store.intervals();
    assert_eq!(all.len(), procs * threads * rounds);
    assert!(all.iter().all(|i| i.held), "a section's guard said lost");
    let writes: Vec<&Interval> = all.iter().filter(|i| i.lock.ends_with(":w")).collect();
    if writes.len() == all.len() {
        let f = checker::assert_clean(&all);
        assert_eq!(f.lost, 0);
        let gaps = checker::handoff_gaps_ms(&all);
        println!("{kinds:?} handoff gaps: {}", checker::percentiles(&gaps));
    }
    for w in &writes {
        for o in &all {
            if std::ptr::eq(*w, o) {
                continue;
            }
            assert!(
                o.end <= w.start || o.start >= w.end,
                "an exclusive section overlapped another section: {w:?} {o:?}"
            );
        }
    }
    let mut by_start = writes.clone();
    by_start.sort_by_key(|i| i.start);
    assert!(by_start.windows(2).all(|p| p[0].token < p[1].token));
    assert_eq!(store.resource(&name).value, writes.len() as u64);
    let mut reads: Vec<&Interval> = all.iter().filter(|i| i.lock.ends_with(":r")).collect();
    if !reads.is_empty() {
        reads.sort_by_key(|i| i.start);
        let overlapped = reads.windows(2).any(|p| p[1].start < p[0].end);
        assert!(overlapped, "shared sections never overlapped");
    }
}

// ---------------------------------------------------------------------------------------------
// Waiters queued behind one another
// ---------------------------------------------------------------------------------------------

/// How a queued waiter asks for the lock: the blocking form, or a `try_*_for` of 5 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Blocking,
    For,
}

impl Form {
    /// Every form.
    pub const ALL: [Form; 2] = [Form::Blocking, Form::For];

    /// The lock through `lock` in this form: `None` when a `try_*_for` timed out.
    fn take(self, lock: &dyn TestLock) -> Option<Box<dyn Held>> {
        match self {
            Form::Blocking => Some(lock.lock().unwrap()),
            Form::For => lock.try_lock_for(QUEUED_WAIT).unwrap(),
        }
    }

    fn env(self) -> String {
        format!("{self:?}")
    }
}

/// How long a `try_*_for` of a queued waiter waits.
const QUEUED_WAIT: Duration = Duration::from_secs(5);

/// How long each queued waiter holds the lock once it has it.
const QUEUED_HOLD: Duration = Duration::from_millis(100);

/// The bound on a hand-over from one queued waiter to the next (the release, its message, the
/// next attempt: milliseconds; a waiter that misses the release sleeps a renewal interval or a
/// lease, 10 s or 30 s here).
pub const HANDOVER: Duration = Duration::from_secs(1);

/// When a queued waiter held the lock: `mono_ns` when its call returned and right before its
/// `unlock`.
#[derive(Debug, Clone, Copy)]
struct Turn {
    got: u64,
    unlocking: u64,
}

/// A queued waiter's turn: takes the lock through `lock` in `form`, holds it
/// [`QUEUED_HOLD`] and unlocks; `None` when it timed out.
fn queued_turn(lock: &dyn TestLock, form: Form) -> Option<Turn> {
    let g = form.take(lock)?;
    let got = mono_ns();
    thread::sleep(QUEUED_HOLD);
    let unlocking = mono_ns();
    g.unlock().unwrap();
    Some(Turn { got, unlocking })
}

/// Child (`#[test] fn child_kind_queued_waiter()` calls it): a queued waiter of kind
/// `LS_KIND` on `LS_NAME` in form `LS_FORM` (local hand-off `LS_HANDOFF`), printing `got NS`
/// and `unlocking NS` (`mono_ns`), or `timed-out`.
pub fn child_queued_waiter() {
    if !is_child("kind-queued") {
        return;
    }
    let kind = Kind::parse(&child_env("LS_KIND"));
    let form = if child_env("LS_FORM") == "Blocking" {
        Form::Blocking
    } else {
        Form::For
    };
    let client = Client::builder(child_env("LS_URL").as_str())
        .local_handoff(child_env("LS_HANDOFF") == "true")
        .build()
        .unwrap();
    let lock = kind.open(&client, &child_env("LS_NAME"));
    match queued_turn(&*lock, form) {
        Some(t) => {
            println!("got {}", t.got);
            println!("unlocking {}", t.unlocking);
        }
        None => println!("timed-out"),
    }
}

/// Two waiters queue for lock `name` held by another client X (as `holder`): B, of kind
/// `first`, and C, of kind `second`, which comes once B waits (`child`: C in a child process,
/// with a client of its own; else C is another thread of B's client, queued behind B in that
/// client). Each holds the lock [`QUEUED_HOLD`] when it gets it. X releases: one waiter gets
/// the lock, and the other within [`HANDOVER`] of that one's release (both at once when both
/// are readers). Every client has the default 30 s lease and renews every 10 s, so a waiter
/// that misses a release sleeps far past the bound.
pub fn queued_waiters_are_served_at_once(
    holder: Kind,
    first: Kind,
    second: Kind,
    handoff: bool,
    form: Form,
    child: bool,
) {
    let what = format!(
        "{holder:?} held, {first:?} then {second:?} queued ({form:?}, hand-off {handoff}, {})",
        if child { "two processes" } else { "one client" }
    );
    let (_server, url, mut conn) = super::server_url_conn();
    let name = locksmith_testkit::unique_name("queued");
    let build = |url: &str| Client::builder(url).local_handoff(handoff).build().unwrap();
    let x = build(&url);
    let y = build(&url);
    let held = holder.open(&x, &name).lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = |label: &'static str, kind: Kind| {
        let (lock, tx) = (kind.open(&y, &name), tx.clone());
        thread::Builder::new()
            .name(label.into())
            .spawn(move || tx.send(queued_turn(&*lock, form)).unwrap())
            .unwrap()
    };
    let b = waiter("queued-b", first);
    first.wait_waiting(&mut conn, &name, 1);
    assert!(
        wait_until(Duration::from_secs(10), || super::thread_sleeps("queued-b")),
        "{what}: B never slept"
    );
    let (c, mut c_child) = if child {
        let more = [
            ("LS_KIND", second.env()),
            ("LS_FORM", form.env()),
            ("LS_HANDOFF", handoff.to_string()),
        ];
        let mut ch = super::spawn_child(
            "child_kind_queued_waiter",
            "kind-queued",
            &url,
            &name,
            &more,
        );
        // C waits on the server too: each client asks for itself.
        let want = if first == second { 2 } else { 1 };
        let both = wait_until(Duration::from_secs(20), || {
            second.waiting(&mut conn, &name) >= want
        });
        if !both {
            ch.kill9();
            panic!("{what}: C never waited");
        }
        (None, Some(ch))
    } else {
        let c = waiter("queued-c", second);
        assert!(
            wait_until(Duration::from_secs(10), || super::thread_sleeps("queued-c")),
            "{what}: C never slept"
        );
        (Some(c), None)
    };
    let released = mono_ns();
    held.unlock().unwrap();
    let b_turn = rx
        .recv_timeout(Duration::from_secs(40))
        .unwrap_or_else(|_| panic!("{what}: B never ended"));
    let c_turn = match &mut c_child {
        Some(ch) => {
            let line = ch.wait_prefixed("got", Duration::from_secs(40));
            let got = line.trim().parse().unwrap();
            let unlocking = ch.wait_prefixed("unlocking", Duration::from_secs(5));
            Some(Turn {
                got,
                unlocking: unlocking.trim().parse().unwrap(),
            })
        }
        None => rx
            .recv_timeout(Duration::from_secs(40))
            .unwrap_or_else(|_| panic!("{what}: C never ended")),
    };
    let (Some(b_turn), Some(c_turn)) = (b_turn, c_turn) else {
        panic!("{what}: a waiter timed out: B {b_turn:?}, C {c_turn:?}");
    };
    let ms = |ns: u64| Duration::from_nanos(ns);
    let (early, late) = if b_turn.got <= c_turn.got {
        (b_turn, c_turn)
    } else {
        (c_turn, b_turn)
    };
    let first_in = ms(early.got.saturating_sub(released));
    let readers = !first.exclusive() && !second.exclusive();
    let handover = if readers {
        ms(late.got.saturating_sub(released))
    } else {
        ms(late.got.saturating_sub(early.unlocking))
    };
    println!("{what}: the first in {first_in:?} after X's release, the second {handover:?} after");
    assert!(
        first_in < HANDOVER,
        "{what}: the first waiter took {first_in:?}"
    );
    assert!(
        handover < HANDOVER,
        "{what}: the second waiter took {handover:?}"
    );
    b.join().unwrap();
    if let Some(c) = c {
        c.join().unwrap();
    }
}
