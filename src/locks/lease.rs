//! What every guard of every lock type holds: one level of a lease, seen through its
//! [`Hold`] (`is_held`, `check`, `validity`), and released exactly once, by `unlock` or, best
//! effort, on drop (a failure then logged at `warn`). The lock type says how a level is
//! released ([`Release`]); the guard types add what is their own (a fencing token, a permit
//! count) and their docs.

use std::sync::Arc;
use std::time::Duration;

use crate::client::shared::Core;
use crate::error::Result;
use crate::protocol::hold::Hold;
use crate::stats::Held;
use crate::transport::conn::Deadline;

/// How a lock type releases one level of a hold of its own.
pub(crate) trait Release: Send + Sync {
    /// Releases one level of `hold` within `by`.
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()>;

    /// The client the lock was made from.
    fn core(&self) -> &Core;
}

/// One level of a lease held through a guard, released once: by [`unlock`](Lease::unlock),
/// or when dropped. It owns a clone of the lock's handle (a few `Arc`s), so a guard borrows
/// nothing: `client.mutex("a")?.lock()?` holds the lock, and a function may return a guard.
pub(crate) struct Lease {
    lock: Box<dyn Release>,
    hold: Arc<Hold>,
    /// Set once the level was released (by `unlock`), so `Drop` does nothing.
    released: bool,
    /// What a failed release on drop is called in its warning, before the lock's name:
    /// `lock`, `the read lock of`, `a permit of`.
    what: &'static str,
    /// Counts the level as held until it ends (see [`Stats`](crate::Stats)).
    _held: Option<Held>,
}

impl Lease {
    /// A level of `hold`, which (a clone of) `lock` releases.
    pub(crate) fn new<L: Release + Clone + 'static>(
        lock: &L,
        hold: Arc<Hold>,
        what: &'static str,
    ) -> Self {
        let stats = &lock.core().shared().stats;
        let held = (hold.kind.lock_type()).map(|ty| stats.held(ty, &hold.keys.name));
        Lease {
            lock: Box::new(lock.clone()),
            hold,
            released: false,
            what,
            _held: held,
        }
    }

    /// The hold this level belongs to.
    pub(crate) fn hold(&self) -> &Hold {
        &self.hold
    }

    /// The lock's name.
    pub(crate) fn name(&self) -> &str {
        &self.hold.keys.name
    }

    /// True while the lease is known to be valid.
    pub(crate) fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// `Ok` while the lease is known to be valid; [`Error::LeaseLost`](crate::Error::LeaseLost)
    /// otherwise.
    pub(crate) fn check(&self) -> Result<()> {
        self.hold.check()
    }

    /// How much longer the lease is known to be valid (zero once lost).
    pub(crate) fn validity(&self) -> Duration {
        self.hold.validity()
    }

    /// Releases the level within the bound of a release (one connect and one command
    /// timeout), and reports the outcome.
    pub(crate) fn unlock(self) -> Result<()> {
        let by = release_bound(&*self.lock);
        self.unlock_by(by)
    }

    /// Releases the level within `by`, and reports the outcome.
    pub(crate) fn unlock_by(mut self, by: Deadline) -> Result<()> {
        self.released = true;
        self.lock.release(&self.hold, by)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        match self.lock.release(&self.hold, release_bound(&*self.lock)) {
            // The loss itself was reported once, at `warn`, when it was found.
            Err(e) if e.is_lease_lost() => log::debug!(
                "{} `{}` dropped after its lease was lost",
                self.what,
                self.hold.keys.name
            ),
            Err(e) => log::warn!(
                "releasing {} `{}` on drop failed: {e}",
                self.what,
                self.hold.keys.name
            ),
            Ok(()) => {}
        }
    }
}

/// The bound of a release: one connect and one command timeout.
fn release_bound(lock: &dyn Release) -> Deadline {
    Deadline::after(lock.core().shared().config.one_call())
}
