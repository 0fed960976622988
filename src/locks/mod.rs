//! The lock types, side by side, each in a room of its own and none importing another:
//! `mutex/` (with its guard and its local hand-off), `multi.rs` (several mutex locks at once),
//! `fair_mutex.rs`, `rwlock.rs`, `semaphore.rs`. What more than one of them uses lives in the
//! rooms below them:
//!
//! - `time.rs`: a call's deadline and the bound of its I/O;
//! - `wait.rs`: the retry loop of an acquire, and how long a waiter sleeps;
//! - `family.rs`: the keys and the script call of the lock types other than the plain mutex
//!   (a set of mutex locks, `multi.rs`, runs its scripts through it too);
//! - `holder.rs`: who holds a lock, as the server tells it, and the owner id that says so;
//! - `lease.rs`: what every guard shows of its lease, and its release once.

pub(crate) mod driver;
pub(crate) mod fair_mutex;
pub(crate) mod family;
pub(crate) mod holder;
pub(crate) mod lease;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod time;
pub(crate) mod wait;
