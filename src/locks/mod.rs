//! The lock types, side by side, each in a room of its own and none importing another:
//! `mutex/` (with its guard and its local hand-off), `multi.rs` (several mutex locks at once),
//! `fair_mutex.rs`, `rwlock.rs`, `semaphore.rs`. Each room is its lock type's protocol (what
//! one acquire call says to Redis) and its guard. What more than one of them uses lives in the
//! rooms below them:
//!
//! - `driver.rs`: the waiting driver, which runs every acquire call of every type: the fast
//!   path, the local queue, the sleep until a release, the retries, the give-up, the stats;
//! - `time.rs`: a call's budget, its deadline and the bound of its I/O;
//! - `wait.rs`: the retry loop of an attempt, how long a waiter sleeps, and a primed attempt
//!   left for the subscriber thread to write;
//! - `calls.rs`: one script call retried once on a new connection, and what an operator's
//!   query of a lock type other than the plain mutex shows;
//! - `holder.rs`: who holds a lock, as the server tells it, and the owner id that says so;
//! - `lease.rs`: what every guard shows of its lease, its release once, and what a release's
//!   reply means;
//! - `detached.rs`: a hold that moves between threads ([`Detached`](crate::Detached)).

pub(crate) mod calls;
pub(crate) mod detached;
pub(crate) mod driver;
pub(crate) mod fair_mutex;
pub(crate) mod holder;
pub(crate) mod lease;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod time;
pub(crate) mod wait;
