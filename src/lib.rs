//! Distributed, reentrant locks on Redis for threaded Rust programs.
//!
//! Several processes on several machines change one shared thing: an account balance, a stock
//! count, "has this record been saved yet". An in-process [`std::sync::Mutex`] cannot help
//! across processes; a locksmith [`Mutex`] can. It is built for programs that are not async:
//! plain threads and worker pools, `let _g = lock.lock()?`.
//!
//! The package is `redis-locksmith`; the library in it is `locksmith`:
//!
//! ```toml
//! [dependencies]
//! redis-locksmith = "0.1"
//! ```
//!
//! ```no_run
//! # fn main() -> locksmith::Result<()> {
//! let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
//! let account = client.mutex("account:42")?;
//! {
//!     let guard = account.lock()?;          // blocks until held; the lease is renewed meanwhile
//!     let token = guard.fencing_token();    // hand it to the resource, see "Guarantees"
//!     // ... read the balance, add to it, write it back (with `token`) ...
//! }                                          // released here
//! # Ok(()) }
//! ```
//!
//! # A tour
//!
//! - A [`Client`] locks on one deployment. It owns a small pool of command connections, one
//!   pub/sub connection and exactly two threads, whatever the number of locks and waiters:
//!   `locksmith-pubsub` wakes local waiters when a lock is released, `locksmith-renew`
//!   extends every held lease in pipelined batches driven by a timer wheel (opening a
//!   connection to a host name, not an IP address, adds a short-lived `locksmith-dns` thread
//!   so that the lookup keeps the call's bound). Clones share all of it. One [`ClientBuilder`] with the same options serves every deployment:
//!   [`Client::builder`] (one server; or [`Client::open`] with the defaults),
//!   [`Client::sentinel`] (a master found and followed through Redis Sentinel),
//!   [`Client::redlock`] (a quorum of independent masters) and [`Client::cluster`] (Redis
//!   Cluster: each lock on the master of its slot, waiters on sharded pub/sub; a cluster
//!   client keeps one pub/sub connection per master that owns a channel it waits on, still
//!   read by the one `locksmith-pubsub` thread).
//! - [`Client::mutex`] gives a [`Mutex`], a cheap handle on a named lock, with
//!   [`lock`](Mutex::lock), [`try_lock`](Mutex::try_lock),
//!   [`try_lock_for`](Mutex::try_lock_for) and [`try_lock_until`](Mutex::try_lock_until).
//! - [`Client::multi_lock`] gives a [`MultiMutex`]: several of those locks taken at once,
//!   all or none, without deadlock (see "Several locks at once"); its [`MultiGuard`] holds
//!   them all.
//! - A quorum client ([`Client::redlock`] describes the algorithm) is the same client over several
//!   independent masters (typically 5): a lock is held when a majority granted it, so it
//!   survives the loss of a minority of masters. Its locks are the same [`Mutex`] with the
//!   same guards.
//! - [`Client::fair_mutex`] gives a [`FairMutex`]: waiters are served in arrival order across
//!   processes, and a release grants the lock straight to the next waiter. Use it when
//!   starvation matters.
//! - [`Client::rw_lock`] gives an [`RwLock`]: many readers or one writer across processes,
//!   reentrant per thread, writer preference by default. Use it for a read-mostly resource.
//! - [`Client::semaphore`] gives a [`Semaphore`]: at most N permits held at once across
//!   processes, each acquisition a lease renewed while held. Use it to cap how many workers
//!   use a resource at once.
//! - These three work on one server, through Sentinel and on a Redis Cluster, with the same
//!   machinery as [`Mutex`] (scripts, the two threads, renewal, `on_lease_lost`, the same [`Error`]).
//!   A quorum client refuses them ([`Error::Unsupported`] from every call that would reach
//!   Redis): a queue, a set of readers or a permit count cannot be kept by majority vote
//!   across independent masters (each type's "Topologies" section says why).
//! - With Sentinel, [`ClientBuilder::wait_replicas`] makes the master confirm that replicas
//!   have each acquisition ([`Error::NotReplicated`] otherwise): it narrows, not closes, the
//!   window in which a failover loses a lock.
//! - A [`MutexGuard`] holds the lock; dropping it releases, [`MutexGuard::unlock`] releases
//!   and reports errors; [`Mutex::with_lock`] runs a closure under the lock and reports the
//!   release's errors (and the other types' `with_*` forms). [`MutexGuard::is_held`] and [`MutexGuard::check`] say whether the
//!   lease is still valid; [`MutexGuard::fencing_token`] is the number a resource can use to
//!   refuse a stale holder.
//! - A guard belongs to the thread that locked (it is `Sync`, not `Send`); `detach` gives a
//!   [`Detached`] hold that another thread attaches or releases (a thread pool's worker).
//! - [`Client::election`] gives an [`Election`]: one of several instances leads
//!   ([`Leadership`], whose term is a fencing token), and everyone can see which
//!   ([`Election::leader`], [`Election::observe`]). [`MutexGuard::unlock_after`] keeps a lock
//!   for a minimum time, for a job that must run once per period.
//! - [`Client::shutdown`] releases what a client holds and stops its two threads within a
//!   timeout, from any clone in any thread: for a program that stops, or replaces its client.
//!   Ownership is per thread of a client: read "Cautions" before a `fork` or a rayon pool.
//!
//! # Several locks at once
//!
//! Moving money between two accounts needs both. Taking two [`Mutex`]es one after the other
//! deadlocks as soon as two callers name them in opposite orders (each holds one and waits
//! for the other, forever with [`Mutex::lock`]). [`Client::multi_lock`] takes a set in one
//! go: all of it, or none of it, whatever order the names come in.
//!
//! ```no_run
//! # fn main() -> locksmith::Result<()> {
//! let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
//! let pair = client.multi_lock(["account:7", "account:3"])?;
//! let guard = pair.lock()?;                          // both accounts, never just one
//! let from = guard.fencing_token("account:7");       // each name has its own token
//! let to = guard.fencing_token("account:3");
//! // ... write both balances in one transaction, each write fenced with its token ...
//! # let _ = (from, to);
//! # Ok(()) }                                        // both released here
//! ```
//!
//! On one server and through Sentinel the set is taken by one script, so no other owner
//! ever sees it half-taken, and a waiter holds none of it while it sleeps on the release of
//! the name that blocked it: no cycle of waiters can form. On a Redis Cluster the set is
//! taken one slot at a time in one global order (by slot, then name), which keeps it free of
//! deadlock too. [`MultiMutex`] says why every caller eventually gets its set. A function may
//! return guards (they own their lock handle); if you take [`Mutex`]es one by one instead,
//! always take them in one fixed order (for example sorted by name), everywhere.
//!
//! # How it works
//!
//! - **Acquire** is one Lua script, one round trip: when the lock key is free it stores this
//!   owner (the client's random UUID plus a per-thread number), a re-entry count of 1, a new
//!   fencing token and a lease (key expiry); when this owner already holds it, the count goes
//!   up; otherwise it answers how long the current lease has left.
//! - **Release** is one Lua script, owner- and acquisition-checked: an inner guard counts one
//!   level down; the outermost guard renames the key to the lock's release marker (so that a
//!   retried release can tell that it released) whatever count the server holds, and
//!   publishes on the lock's release channel. A holder whose lease ran out never deletes the
//!   next holder's lock.
//! - **Waiting never polls.** A waiter subscribes to the lock's release channel (through the
//!   client's one pub/sub connection) and sleeps until a release or until the holder's
//!   remaining lease runs out (a crashed holder publishes nothing). Within one client, one
//!   thread per lock name asks Redis at a time; the others queue locally.
//! - **Local hand-off** (on by default, see [`ClientBuilder::local_handoff`]). A [`Mutex`]
//!   released while threads of the same client queue for it passes to the first of them
//!   without a round trip; the lock stays held on the server. Each hand-off is an acquisition
//!   of its own (the next fencing token of a block the acquisition through Redis reserved, its
//!   own guard, lease deadline, renewal, re-entry count and maximum hold time). After 16
//!   hand-offs, or once 10 ms have passed since the acquisition through Redis, the release
//!   goes through Redis, so that waiters in other processes compete for the lock again; when
//!   others heard that release, this client's threads give way to them for up to 5 ms first.
//! - **Renewal.** While a guard lives, its lease is extended every third of the lease. A
//!   renewal that finds the lock gone marks the guard lost and logs a warning.
//! - **Bounded calls.** Every call carries a deadline down to each socket operation, so it
//!   returns within its documented bound whatever Redis does (see "Time bounds").
//!
//! # Guarantees
//!
//! What holds, **while the lease is valid**, with one Redis server that keeps its data:
//!
//! - **Mutual exclusion**: at most one owner holds a lock name at a time.
//! - **Liveness**: a holder that crashes blocks others for at most one lease; a released lock
//!   is taken by a waiter at once, without polling.
//! - **Owner safety**: release and renewal are owner-checked; a stale holder never deletes or
//!   extends another owner's lock.
//! - **Honest loss**: a holder learns it lost the lock *no later than* another owner can get
//!   it. [`MutexGuard::is_held`] is false from the local lease deadline on (the send time of
//!   the last successful acquire or renewal, plus the lease, minus 1% + 2 ms for clock
//!   drift), even when Redis cannot be reached; a guard is never handed out whose validity
//!   has already passed.
//! - **Fencing tokens** strictly increase per lock name, across owners, lock types and
//!   clients, local hand-offs included, and whatever the
//!   server's wall clock does: every grant takes a token above the fencing mark of the name's
//!   hash slot (the highest token issued there) and raises it (see [`MutexGuard::fencing_token`]). Across a
//!   restart of Redis with an empty dataset, which loses the marks, they rise as long as the
//!   server's clock did not go back meanwhile.
//! - **Bounded local hand-off**: a waiter in another process is kept out by one run of local
//!   hand-offs at most (the count and time bounds above, plus the critical section of the
//!   run's last holder); then the lock is released through Redis, and waiters in other
//!   processes that ask within the give-way get it, one run each, ahead of this client's
//!   threads.
//!
//! What does **not** hold:
//!
//! - **Fairness between processes**: a released lock goes to whichever waiter's acquire
//!   reaches Redis first, and with local hand-off the releasing process's threads have it for
//!   a whole run first (the give-way after a run lets other processes go first only within
//!   its bound, and only among processes that wait). Turn
//!   [`local_handoff`](ClientBuilder::local_handoff) off, or use a [`FairMutex`], where that
//!   matters more than throughput.
//! - A lock is a **lease**. It excludes others only while the lease is valid, and only if
//!   process pauses (GC, swapping, `SIGSTOP`), network delays and clock-rate drift stay small
//!   compared with the lease. A holder paused for longer than its lease may wake up believing
//!   it holds a lock someone else has: check [`MutexGuard::check`] before a side effect, and
//!   better, have the resource check the fencing token.
//! - A single Redis with asynchronous replicas can **lose a lock in a failover** (the lock was
//!   written to the old master but not replicated), and a Redis that restarts without
//!   persistence loses every lock. Two owners can then hold the same lock; fencing tokens let
//!   the resource tell them apart.
//! - Clocks: the lease is measured by Redis's clock and, conservatively, by this host's
//!   monotonic clock; the two must *run* at about the same rate (1% is allowed for). Redis
//!   expires keys by its wall clock: a step forward of the server's clock may end leases
//!   there early (the holder learns at its next renewal, and the renewal thread logs the
//!   jump at `warn` and counts it in [`Stats::clock_jumps`]); a step back makes them last
//!   longer, so a holder that died blocks its lock for its lease + the step. Tokens are not
//!   affected (see `docs/guarantees.md`, "Clocks").
//!
//! ## Time bounds
//!
//! Every blocking call returns within its own bound, also while Redis is stalled (frozen,
//! or behind a network that swallows packets), is a black hole (accepts connections and
//! never answers), or refuses connections. A call's bound covers everything it may do: a
//! try on a pooled connection, a retry on a new one, opening it (the DNS lookup of a host
//! name, on a short-lived thread the call waits for within its bound; TCP connect; the `AUTH`
//! / `SELECT` handshake), loading a script after `NOSCRIPT` (or the function library after
//! "Function not found"), waiting for the pub/sub
//! subscription, backoff sleeps. Each step takes the smaller of its own timeout and what is
//! left of the call's bound (give or take the kernel's timer granularity, a few
//! milliseconds). With `connect` and `command` the client's
//! [`connect_timeout`](ClientBuilder::connect_timeout) and
//! [`command_timeout`](ClientBuilder::command_timeout):
//!
//! | call | returns within |
//! |---|---|
//! | [`Mutex::try_lock`] | `connect + command` |
//! | [`Mutex::try_lock_for`]`(d)` | `max(d, connect) + command` |
//! | [`Mutex::try_lock_until`]`(t)` | `max(t - now, connect) + command` |
//! | [`Mutex::lock`] | while Redis cannot be reached: `max(retry_timeout, connect + command)` from the start of the first attempt that failed; while another owner holds the lock, it waits |
//! | [`MutexGuard::unlock`], dropping a guard | `connect + command` (including the wait for a renewal on the wire) |
//! | [`Mutex::is_locked`] | `connect + command` |
//! | [`Client::open`], [`ClientBuilder::build`] | `2 × connect + command` (one master); with Sentinel, `3 × connect + 2 × command`; with Cluster, `2 × (connect + command)` (the slot map, every master's `PING`, then a `CONFIG GET` on each; the pub/sub connections open later, on the pub/sub thread) |
//!
//! On a Redis Cluster, a call follows `MOVED` and `ASK` redirections and retries after
//! `TRYAGAIN`, `CLUSTERDOWN` or a lost connection only within what is left of its bound (see
//! `docs/deployments.md`). A read of the slot map asks one node at a time, each within
//! the *per-node bound*, the smaller of 1 s, `connect` and `command`; a node that did not
//! answer is asked last from then on, so a frozen node costs a call at most one per-node
//! bound, once. The pub/sub thread opens its connection to each master as non-blocking
//! steps (connect, TLS handshake, `AUTH`) within `connect` of their own: a frozen master
//! delays no wake-up of a lock on another master (a release there reaches its waiter as fast
//! as with nothing frozen); the waiters of its own locks re-check every 100 ms, each call
//! within its bound.
//!
//! With Sentinel, opening a connection includes asking a sentinel for the master's address
//! (its TLS handshake and `AUTH` included) and the master's TLS handshake, `AUTH`
//! ([`ClientBuilder::master_auth`]), `SELECT` ([`ClientBuilder::master_db`]) and `ROLE`: all of
//! it within the connect timeout, so the bounds above hold. The sentinels are asked in turn,
//! each within the *per-sentinel bound*, the smaller of 1 s, `connect` and `command` (for its
//! connect, TLS handshake, `AUTH` and answer together); the one that answered is asked first
//! next time, one that failed last. So one frozen sentinel (accepting connections, never
//! answering) or a dead one costs a call, a [`ClientBuilder::build`] or the following of a
//! failover at most one per-sentinel bound, once, and never the whole connect timeout.
//! With [`ClientBuilder::wait_replicas`]`(n, wait)`, `command` above reads `command + wait`
//! (the script and `WAIT` share a round trip), and a call refused with
//! [`Error::NotReplicated`] takes up to one more `command` to undo its grant.
//!
//! A renewal batch takes at most half the renewal interval: a try on its pooled connection
//! for at most a quarter of the interval (or the command timeout if shorter), then, if that
//! connection failed or stayed silent (a NAT or load balancer that dropped it), a try on a
//! new connection in what is left. So one dead connection does not cost a lease, whatever the
//! command timeout. [`ClientBuilder::renew_interval`] is at most half the lease, so a renewal
//! and its retry end before the lease does. Every connection has TCP keepalive on.
//!
//! # Cautions
//!
//! A lock is owned by *a thread of a client* (the client's id and a per-thread number), not
//! by a task or a process image. Two ways to share that owner by accident:
//!
//! - **`fork`.** A child process made by `fork` (without `exec`) inherits the parent's guards
//!   and clients, ids included. When the child drops or unlocks an inherited guard, the
//!   release is the parent's owner releasing: the parent's lock is freed while the parent
//!   still works under it (its next renewal finds it lost). A lock call through an inherited
//!   client would re-enter the parent's locks the same way. In a forked child,
//!   [`std::mem::forget`] the inherited guards and make a new [`Client`]; better, fork before
//!   making clients, or `exec`.
//! - **Work-stealing pools** (rayon, and any pool that runs many tasks on one thread). Locks
//!   are reentrant per thread: a task that takes a lock while another task on the same
//!   thread holds it (a nested `join`, a task stolen while the first waits) re-enters that
//!   lock instead of waiting, and the two tasks run their critical sections together. Take
//!   locks only in tasks that do not yield to the pool while holding them, or run the locked
//!   work on threads of your own; a [`Detached`] hold moves a lock between threads, not tasks.
//! - **Async code.** Every call blocks its thread (within its stated bound), and a guard is
//!   not `Send`. On an async runtime, run the locked work in one blocking section (with
//!   tokio: `spawn_blocking(move || mutex.with_lock(|_| work()))`). To hold a lock across
//!   `.await`s, [`detach`](MutexGuard::detach) the guard in the blocking section that took it
//!   and keep the [`Detached`] hold (`Send + 'static`) in the task; release it with
//!   [`Detached::unlock`] in another blocking section (dropping it releases too). Nothing
//!   re-enters a detached hold, so tasks that share a runtime thread do not share it.
//!
//! # Log levels
//!
//! Through the [`log`] crate; never an owner id or a password (the one fencing token logged
//! is that of a holder removed by `force_unlock`, in its `warn`; a URL is shown as
//! `host:port`, or with its credentials replaced by `***`). Each line's target is the module
//! that logs it (a file split out of a module for reading keeps that module's target), under
//! `locksmith` (`locksmith::renewal`, `locksmith::subscriber`, ...), so `locksmith=debug`
//! selects them all. With [`env_logger`](https://docs.rs/env_logger), say:
//!
//! ```text
//! // main.rs
//! env_logger::init();
//! // shell
//! RUST_LOG=locksmith=debug ./my-service
//! RUST_LOG=locksmith=info,locksmith::subscriber=debug ./my-service   # every reconnect try
//! ```
//!
//! What an operator may see at `warn` and `info`, and what to do:
//!
//! | level | target | line | what to do |
//! |---|---|---|---|
//! | `warn` | `locksmith::renewal` | ``lease of lock `NAME` lost: Redis could not be reached before the lease ran out`` (or `...: the key expired, was deleted, or has another owner`, `...: its lease ran out before a renewal succeeded (Redis unreachable or slow, or this process paused)`) | One line per lost lease. The holder's critical section may have overlapped another owner's: the guard's `check()`/`unlock()` return the loss, `on_lease_lost` is called. Look for an outage of Redis at that time, or a lease too short for this network. |
//! | `warn` | `locksmith::subscriber` | `pub/sub connection to HOST:PORT lost: ERROR; reconnecting` | Once per outage (on a cluster, per master). Waiters re-check their locks on a short period until it is back; check that Redis is up. |
//! | `warn` | `locksmith::subscriber` | `pub/sub connection to HOST:PORT still down after 1m ... (N tries; waiters re-check their locks meanwhile): ERROR` | At most once a minute while it stays down. |
//! | `info` | `locksmith::subscriber` | `pub/sub connection to HOST:PORT restored after 5.3s (N failed tries); waiters re-check their locks` | Nothing: the outage is over. |
//! | `warn` | `locksmith::subscriber` (`locksmith::subscriber::shards` on a cluster) | ``SUBSCRIBE CHANNEL refused: ERROR; its waiters re-check`` (`SSUBSCRIBE` on a cluster) | The ACL user lacks the pub/sub permission (`+subscribe`, `&*` channels): waiters fall back to polling. Grant it. |
//! | `info` | `locksmith::subscriber::shards` | `the slot of CHANNEL moved; resubscribing its waiters`, ``HOST:PORT dropped the subscription to CHANNEL (its slot moved); resubscribing`` | Nothing: a resharding or failover is being followed. |
//! | `warn` | `locksmith::locks::lease` | ``releasing lock `NAME` on drop failed: ERROR`` (`the read lock`, `the write lock`, `a permit`) | Redis could not be reached to release: the lock stays taken until its lease runs out (others wait up to one lease). A guard dropped after its lease was lost logs at `debug` only (the loss was reported). |
//! | `info` | `locksmith::renewal` | ``lock `NAME` reached its maximum hold time; renewal stopped`` | The holder is slower than `max_hold`: the lock frees itself within a lease. |
//! | `warn` | `locksmith::locks::mutex` | ``lock `NAME` was freed by force: it was held by LABEL (thread T, fencing token N, L level(s), for D)`` | Someone called [`Mutex::force_unlock`]: the holder named learns of its loss at its next renewal. Check that it was meant. |
//! | `warn` | `locksmith::locks::fair_mutex`, `locksmith::locks::rwlock`, `locksmith::locks::semaphore` | ``force_unlock of fair mutex `NAME` removed its holder: LABEL (thread T)`` (`read-write lock ... its writer` / `its readers: ...`, `semaphore ... its holders: ...`) | Someone called `force_unlock` on that type: each holder named learns of its loss at its next renewal. Check that it was meant. |
//! | `info` | `locksmith::topology::sentinel` | ``the master `NAME` is now at HOST:PORT`` | Nothing: a failover is being followed. |
//! | `warn` | `locksmith::client::builder` | `Redis at HOST:PORT may evict lock keys: maxmemory-policy is P with maxmemory N; ...` | At start. Set `maxmemory-policy noeviction`: an evicted lock key is a lock granted twice. |
//! | `warn` | `locksmith::client::builder` | `a rediss:// URL ends in #insecure: the server's certificate is NOT verified, ...` | At start. Remove `#insecure` and trust the server's CA with `tls_root_cert`. |
//! | `warn` | `locksmith::topology::backend` | `master HOST:PORT did not answer: ERROR` (quorum client, at start) | A minority of masters down is survived; bring it back. |
//! | `warn` | `locksmith::topology::backend` | `renewal of N leases on HOST:PORT confirmed by A of R replicas in time; the leases are kept` | With `wait_replicas`: replicas lag or are down. |
//! | `error` | `locksmith::renewal` | ``renewal refused by HOST:PORT for a permission (ERROR): add `+CMD` to the ACL user's rule, and check it with `ACL DRYRUN`; ...`` | Once per client. The ACL user's rule lacks a command a renewal script calls (on Redis 7.0 the server does not name it: the line lists what the scripts call): its leases will be lost. Give it the rule of `docs/deployments.md` ("ACL users"). |
//! | `error` | `locksmith::renewal` | `the on_lease_lost callback panicked` | Fix the callback. |
//!
//! - `debug`: every reconnect try, every failed renewal before a loss, retries of a call,
//!   client start, thread stops.
//! - `trace`: renewal batches.
//!
//! Errors say where: a failed connection names the server (`HOST:PORT: Connection refused`),
//! a call that retried says how long and how often (`(tried 7 times over 10.0s)`), and a
//! port where something else than Redis answers gives ``HOST:PORT did not answer as a Redis
//! server (...)``.
//!
//! # URLs
//!
//! A server is named by `redis://[user:password@]host[:port][/db]`, `rediss://...` (TLS, the
//! feature `tls`; a trailing `#insecure` skips certificate verification, with the feature
//! `tls-insecure` only) or `unix:///path/to/socket`. For Valkey, `valkey://`, `valkeys://` and
//! `valkey+unix://` are accepted wherever these are (one server, Sentinel, Cluster, RedLock)
//! and mean the same. [`Client::open`] and [`Client::builder`] also take a
//! [`redis::ConnectionInfo`] the program already has (see [`IntoServer`]).
//!
//! # Cargo features
//!
//! `default = ["tls"]`. The features:
//!
//! - `tls` (default): `rediss://` (and `valkeys://`) URLs, through rustls with its `ring`
//!   crypto provider (pure Rust and C/assembly built by `cc`: no cmake, no system OpenSSL).
//!   Certificates are verified against the system's root certificates
//!   ([`ClientBuilder::tls_root_cert`] trusts a private CA instead). Every rustls configuration
//!   the client makes carries the `ring` provider itself: locksmith neither installs nor reads
//!   rustls's process-wide default provider, so a program may install its own, before or after
//!   a client connects. Without the feature (`default-features = false`), rustls and ring are
//!   not built, and `build()` refuses a `rediss://` URL, or a certificate given to
//!   [`ClientBuilder::tls_root_cert`] or [`ClientBuilder::tls_client_cert`], with
//!   [`Error::InvalidConfig`] naming the feature, before any I/O.
//! - `tls-insecure` (implies `tls`): accepts `rediss://...#insecure` URLs, which turn the
//!   check of the server's certificate off (for a test server only: anyone on the path can
//!   pose as the server). Without it, such a URL fails `build()` with [`Error::InvalidConfig`]
//!   naming the feature.
//!
//! - `serde`: `Serialize` and `Deserialize` (through serde's derive) on what a program reports
//!   or ships elsewhere: [`Holder`], [`LockInfo`], [`LockKind`] (as its
//!   [`as_str`](LockKind::as_str) name), [`Stats`] and its [`Histogram`]s. Durations are
//!   written as serde writes a [`Duration`](std::time::Duration).
//!
//! - `testing`: `locksmith::testing::Server`, a throwaway `redis-server` for the tests of your
//!   own crate (enable it in `[dev-dependencies]`; the module `testing` shows a `#[test]`).
//! - `metrics`: reports what [`Client::stats`] counts through the facade of the
//!   [`metrics`](https://docs.rs/metrics) crate (as `log` is for logs: it starts no thread,
//!   and without an installed recorder each report costs a check of the global recorder).
//!   Install any recorder of that ecosystem, such as `metrics-exporter-prometheus` (the
//!   `metrics` example prints what Prometheus would scrape). Every client of the process
//!   reports into the one recorder. The metrics, in Prometheus names:
//!
//! | name | type | what |
//! |---|---|---|
//! | `locksmith_acquired_total` | counter | acquisitions ([`Stats::acquired`]) |
//! | `locksmith_acquired_locally_total` | counter | of which by local hand-off ([`Stats::acquired_locally`]) |
//! | `locksmith_contended_total` | counter | of which had to wait ([`Stats::contended`]) |
//! | `locksmith_timed_out_total` | counter | `try_*_for`/`try_*_until` calls that gave up ([`Stats::timed_out`]) |
//! | `locksmith_busy_total` | counter | one-attempt `try_*` calls that found the lock held ([`Stats::busy`]) |
//! | `locksmith_failed_total` | counter | acquire calls that returned an error ([`Stats::failed`]) |
//! | `locksmith_released_total` | counter | guards ended ([`Stats::released`]) |
//! | `locksmith_leases_lost_total` | counter | leases lost while held ([`Stats::leases_lost`]) |
//! | `locksmith_renewals_total` | counter | renewals that extended a lease ([`Stats::renewals`]) |
//! | `locksmith_renewal_failures_total` | counter | renewals that did not ([`Stats::renewal_failures`]) |
//! | `locksmith_reconnects_total` | counter | pub/sub reconnections ([`Stats::reconnects`]); no label |
//! | `locksmith_clock_jumps_total` | counter | steps of a master's wall clock ([`Stats::clock_jumps`]); no label |
//! | `locksmith_wait_seconds` | histogram | from an acquire call to its guard ([`Stats::wait`]) |
//! | `locksmith_hold_seconds` | histogram | from a guard's acquisition to its end ([`Stats::hold`]) |
//! | `locksmith_held` | gauge | guards alive now (`acquired - released`) |
//!
//!   Every metric but `locksmith_reconnects_total` and `locksmith_clock_jumps_total` (a
//!   connection's, a master's: no lock type's) has the label `type`: `mutex`, `fair_mutex`,
//!   `rw_lock`, `semaphore`, `multi_mutex` or `election` (the renewals and lost leases of a
//!   [`MultiMutex`] count under `mutex`: its locks are mutex locks). None has the lock's name
//!   by default, as names are unbounded;
//!   [`ClientBuilder::metrics_lock_names`](ClientBuilder) adds a `name` label (a `MultiMutex`'s
//!   names joined by `,`), for a small fixed set of names only: each name is a time series
//!   of every metric.
//!
//! TLS is on by default because a managed Redis nearly always requires it; a build that only
//! reaches servers over plain TCP or a Unix socket leaves it out with
//! `default-features = false`.
//!
//! # Layout
//!
//! For readers of the source: the folders are the layers, lowest first. A file uses its own
//! folder and those above it in this list, never one below; the lock types stand side by side
//! and none uses another; and no file imports a file that imports it back (`tests/layers.rs`
//! checks all three).
//!
//! - `kind.rs`, `stats.rs`, `error.rs`: which kind of lock a call or a hold is; the client's
//!   counters ([`Stats`]) and their metrics; [`Error`] and [`Result`].
//! - `transport/`: sockets to one server: connections and their pool (`conn.rs`), a
//!   connection's socket and its opening (`link.rs`), TLS (`tls/`, the `tls` feature), the
//!   pub/sub socket and its non-blocking opening (`pubsub.rs`, `pubsub/opening.rs`).
//! - `subscriber/`: the pub/sub thread (`pubsub_thread.rs`, one loop for one server and for a
//!   cluster's masters; `route.rs`, where a channel is subscribed; `replies.rs`) and the local
//!   waiter queues (`queue.rs`, `waiter.rs`).
//! - `protocol/`: key names, the script table and each lock type's calls and replies beside
//!   its Lua (`scripts.rs`, `mutex.rs`, `fair_mutex.rs`, `rw_lock.rs`, `semaphore.rs`, ...).
//! - `topology/`: how a call reaches the masters: independent masters (one, Sentinel's, or a
//!   RedLock quorum) or a Cluster (`cluster/`), all `Node`s sending through one round
//!   (`send.rs`), routed and renewed alike (`backend/`), and the quorum's arithmetic over
//!   replies (`quorum.rs`).
//! - `shared/`: what every lock type shares: the client's core and two threads (`mod.rs`), its
//!   settings (`config.rs`), owner ids (`holder.rs`), the record of holds (`grant.rs`,
//!   `hold.rs`) and the `locksmith-renew` thread with its timer wheel (`renewal/`).
//! - `driver/`: the waiting driver, which runs every acquire call of every lock type (the fast
//!   path, the local queue, the sleep until a release, retries, the give-up, stats), and its
//!   helpers: a call's budget (`time.rs`), retries and sleeps (`wait.rs`), one-shot calls
//!   (`calls.rs`), leases and releases (`lease.rs`), detached holds (`detached.rs`).
//! - `locks/`: the lock types, side by side (`mutex/`, `multi.rs`, `fair_mutex.rs`,
//!   `rwlock.rs`, `semaphore.rs`), each its protocol under the driver (one attempt, what a
//!   wake brings, the cancel of a waiter that gives up) and its guard.
//! - `client/`: the public face: [`ClientBuilder`], [`Client`], connecting, listing locks.
//! - `testing.rs` (the `testing` feature), outside the layers: the throwaway server for tests;
//!   it uses nothing of the library, and nothing uses it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod driver;
mod error;
mod kind;
mod locks;
mod protocol;
mod shared;
mod stats;
mod subscriber;
#[cfg(feature = "testing")]
pub mod testing;
mod topology;
mod transport;

pub use client::inspect::Locks;
pub use client::server::IntoServer;
pub use client::{Client, builder::ClientBuilder};
pub use driver::detached::Detached;
pub use error::{Error, RedisFailure, RedisFailureKind, Result};
pub use locks::fair_mutex::{FairMutex, FairMutexGuard};
pub use locks::multi::{MultiGuard, MultiMutex};
pub use locks::mutex::election::{Election, Leader, Leadership, Observer};
pub use locks::mutex::{Mutex, guard::MutexGuard};
pub use locks::rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use locks::semaphore::{Semaphore, SemaphorePermit};
pub use protocol::keys::MAX_NAME_LEN;
pub use shared::holder::{Holder, LockInfo, LockKind};
pub use shared::renewal::{LeaseKind, LostLease};
pub use stats::{Histogram, Stats};

/// The Rust snippets of the README and of `docs/*.md`, compiled (and run where they need no
/// server) as doctests, so that a snippet that no longer compiles fails the build.
#[cfg(doctest)]
mod markdown_snippets {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../docs/deployments.md")]
    struct Deployments;
    #[doc = include_str!("../docs/faults.md")]
    struct Faults;
    #[doc = include_str!("../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../docs/how-it-works.md")]
    struct HowItWorks;
    #[doc = include_str!("../docs/key-layout.md")]
    struct KeyLayout;
    #[doc = include_str!("../docs/lock-types.md")]
    struct LockTypes;
    #[doc = include_str!("../docs/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
}
