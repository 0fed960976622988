//! The lock types, side by side, each in a room of its own and none importing another:
//! `mutex/` (with its guard, its acquire and release, its local hand-off and the election
//! built on it), `multi.rs` (several mutex locks at once), `fair_mutex.rs`, `rwlock.rs`,
//! `semaphore.rs`. Each room is its lock type's protocol (what one acquire call says to Redis)
//! and its guard. What more than one of them uses lives below them: the waiting driver and
//! its helpers in `driver/`, the client's core and the record of holds in `shared/`.

pub(crate) mod fair_mutex;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
