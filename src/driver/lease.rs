//! What every guard of every lock type holds: one level of a lease, seen through its
//! [`Hold`] (`is_held`, `check`, `validity`), and released exactly once, by `unlock` or, best
//! effort, on drop (a failure then logged at `warn`). The lock type says how a level is
//! released ([`Release`]); the guard types add what is their own (a fencing token, a permit
//! count) and their docs. A level's release by a script ([`release_level`]) and its reply
//! ([`released`]) mean the same for every lock type; so do
//! a grant that came too late ([`unless_late`]) and a renewed hold without a token
//! ([`watched_hold`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::marker::PhantomData;

use crate::driver::calls::eval_twice;
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::protocol::mutex;
use crate::protocol::scripts::{self, Call, Level, ReleaseReply};
use crate::shared::grant::Terms;
use crate::shared::hold::{Hold, Identity};
use crate::shared::{Core, Shared};
use crate::stats::Held;
use crate::transport::conn::Deadline;

/// The target of a release's log lines: the one "Log levels" in the crate docs lists, which
/// operators filter on (the module path would say where the file sits instead).
const LOG_TARGET: &str = "locksmith::locks::lease";

/// What makes a guard belong to the thread that locked: it is `Sync` (other threads may read
/// it through a reference, as scoped threads do) but not `Send` (its release and re-entry are
/// that thread's; a hold moves through [`Detached`](crate::Detached)), as
/// [`std::sync::MutexGuard`].
pub(crate) type ThreadBound = PhantomData<std::sync::MutexGuard<'static, ()>>;

/// What every guard shows of its lease, written once: `is_held`, `check` and `validity` of a
/// guard type whose `lease` field is a [`Lease`]. `$ends` names the method that ends the hold
/// and asks the server (`unlock`).
macro_rules! lease_view {
    ($ends:literal) => {
        /// True while the lease is known to be valid: false once a renewal found the lock gone
        /// or taken, once it was released, or once the local lease deadline passed without a
        /// successful renewal (even when Redis cannot be reached at all).
        ///
        /// It does not ask the server: it reads the state the renewal thread keeps (no I/O,
        /// never blocks). So it turns false no later than another owner can get the lock, but
        /// a lock lost in a way no renewal has seen yet (Redis restarted empty a moment ago)
        /// still reads true until the next renewal or the local deadline.
        #[doc = concat!("[`", $ends, "`](Self::", $ends, ") asks the server.")]
        pub fn is_held(&self) -> bool {
            self.lease.hold().is_held()
        }

        /// Checks that the lease is still valid, for use right before a side effect. Like
        /// [`is_held`](Self::is_held), it does not ask the server (no I/O).
        ///
        /// # Errors
        ///
        /// [`Error::LeaseLost`](crate::Error::LeaseLost) when [`is_held`](Self::is_held) is
        /// false.
        pub fn check(&self) -> crate::Result<()> {
            self.lease.hold().check()
        }

        /// How much longer the lease is known to be valid (zero once lost): the time until the
        /// local deadline, which a successful renewal moves forward.
        pub fn validity(&self) -> std::time::Duration {
            self.lease.hold().validity()
        }
    };
}
pub(crate) use lease_view;

/// What a lock's guard type `$guard { lease, _thread }` has besides its own docs and methods,
/// written once: `new` (a level of a hold of a `$lock`, called `$what` in the warning of a
/// failed release on drop), `Debug` (with the hold's fencing token, or `plain`), the lease's
/// view (`lease_view!`), and `unlock`, whose docs follow the `;`.
macro_rules! lease_guard {
    ($guard:ident of $lock:ty, $what:expr, $debug:ident; $(#[$unlock:meta])*) => {
        impl $guard {
            pub(crate) fn new(
                lock: &$lock,
                hold: std::sync::Arc<$crate::shared::hold::Hold>,
            ) -> Self {
                $guard {
                    lease: $crate::driver::lease::Lease::new(lock, lock.client.shared(), hold, $what),
                    _thread: std::marker::PhantomData,
                }
            }

            $crate::driver::lease::lease_view!("unlock");

            $(#[$unlock])*
            pub fn unlock(self) -> $crate::Result<()> {
                self.lease.unlock()
            }
        }

        impl std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let extra = $crate::driver::lease::lease_guard!(@extra $debug self.lease);
                self.lease.debug_as(f, stringify!($guard), extra)
            }
        }
    };
    (@extra token $lease:expr) => {
        Some(("fencing_token", &$lease.hold().token as &dyn std::fmt::Debug))
    };
    (@extra plain $lease:expr) => {
        None
    };
}
pub(crate) use lease_guard;

/// How a lock type releases one level of a hold of its own.
pub(crate) trait Release: Send + Sync {
    /// Releases one level of `hold` within `by`.
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()>;
}

/// One level of a lease held through a guard, released once: by [`unlock`](Lease::unlock),
/// or when dropped. It owns a clone of the lock's handle (a few `Arc`s), so a guard borrows
/// nothing: `client.mutex("a")?.lock()?` holds the lock, and a function may return a guard.
pub struct Lease {
    lock: Box<dyn Release>,
    /// The state of the client the lock was made from.
    shared: Arc<Shared>,
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
    /// A guard's `Debug`: its type, the lock's name, `extra` (a token, a permit count), and
    /// whether it is held.
    pub(crate) fn debug_as(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        guard: &str,
        extra: Option<(&str, &dyn std::fmt::Debug)>,
    ) -> std::fmt::Result {
        let mut d = f.debug_struct(guard);
        d.field("name", &self.hold.keys.name);
        if let Some((field, value)) = extra {
            d.field(field, value);
        }
        d.field("is_held", &self.hold.is_held())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.debug_as(f, "Lease", None)
    }
}

impl Lease {
    /// A level of `hold`, which (a clone of) `lock`, made from the client of `shared`,
    /// releases.
    pub(crate) fn new<L: Release + Clone + 'static>(
        lock: &L,
        shared: &Arc<Shared>,
        hold: Arc<Hold>,
        what: &'static str,
    ) -> Self {
        let stats = &shared.stats;
        let held = (hold.kind.is_lease()).then(|| stats.held(hold.kind, &hold.keys.name));
        Lease {
            lock: Box::new(lock.clone()),
            shared: Arc::clone(shared),
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

    /// Lets the calling thread go of the hold (see `detached.rs`); `Err(self)`, unchanged,
    /// when it is re-entered (more than one level).
    pub(crate) fn detach(self) -> std::result::Result<Lease, Lease> {
        if self.hold.depth() != 1 {
            return Err(self);
        }
        self.shared.passed_on(&self.hold);
        Ok(self)
    }

    /// Makes the calling thread the owner of a detached hold. When the thread holds the lock
    /// through another hold already, the hold is released (as dropping it would) and the
    /// error says why.
    pub(crate) fn attach(self) -> Result<Lease> {
        if self.shared.attach(&self.hold) {
            return Ok(self);
        }
        Err(Error::misuse(
            "attach: the calling thread holds this lock already, through another guard",
        ))
    }

    /// Ends the outermost level without a release: renewal stops, and the key's lease is set
    /// to end `left` from now (owner-checked: the renew script with that lease), within the
    /// bound of a release. Nothing is published and nothing passes to a local waiter.
    pub(crate) fn expire_after(mut self, left: Duration) -> Result<()> {
        self.released = true;
        let shared = &self.shared;
        shared.ensure_open()?;
        let bound = shared.config.one_call();
        if self.hold.leave(bound).outermost {
            shared.forget(&self.hold);
        }
        let h = &self.hold;
        let call = mutex::renew(
            &h.keys,
            &h.acquisition,
            left,
            shared.backend.fence_of(h.token),
        );
        match shared.backend.renew(&[(call, 1)], bound).outcomes.first() {
            Some(Some(true)) => Ok(()),
            Some(Some(false)) => Err(Error::LeaseLost),
            _ => Err(Error::timeout(
                "the server did not answer in time; the lease ends by itself",
            )),
        }
    }

    /// Releases the level within the bound of a release (one connect and one command
    /// timeout), and reports the outcome.
    /// After the client's shutdown, which released the hold, it does nothing and says so
    /// ([`Error::Shutdown`]).
    pub(crate) fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.shared.ensure_open()?;
        self.lock.release(&self.hold, release_bound(&self.shared))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if self.shared.is_shut_down() {
            // The shutdown released the hold.
            let name = &self.hold.keys.name;
            log::debug!(target: LOG_TARGET, "{} `{name}` dropped after shutdown", self.what);
            return;
        }
        match self.lock.release(&self.hold, release_bound(&self.shared)) {
            // The loss itself was reported once, at `warn`, when it was found.
            Err(e) if e.is_lease_lost() => log::debug!(
                target: LOG_TARGET,
                "{} `{}` dropped after its lease was lost",
                self.what,
                self.hold.keys.name
            ),
            Err(e) => log::warn!(
                target: LOG_TARGET,
                "releasing {} `{}` on drop failed: {e}",
                self.what,
                self.hold.keys.name
            ),
            Ok(()) => {}
        }
    }
}

/// Ends one level of `hold` on this side, before its release asks the server: the level it
/// was, and whether the lease was known valid as it was left (the `held` that [`released`]
/// takes; see [`Left`](crate::shared::hold::Left)). The outermost level stops renewal (the
/// wait for a renewal on the wire is part of `by`; renewals are bounded too) and is forgotten
/// as the thread's hold; its release then frees the lock on the server whatever count it has
/// there: levels the server counts beyond the local ones (an inner release that never
/// arrived, a re-entry whose reply was lost for good) must not keep it.
pub(crate) fn leave_level(shared: &Shared, hold: &Arc<Hold>, by: Deadline) -> (Level, bool) {
    let left = hold.leave(by.left().unwrap_or(Duration::MAX));
    let level = if left.outermost {
        shared.forget(hold);
        Level::Outermost
    } else {
        Level::Inner
    };
    (level, left.held)
}

/// The bound of a release: one connect and one command timeout.
fn release_bound(shared: &Shared) -> Deadline {
    Deadline::after(shared.config.one_call())
}

/// Releases one level of `hold` within `by` by a release script: the level is ended on this
/// side first ([`leave_level`]), and `call` gives the script's call for the level left
/// (`None`: nothing to ask the server, the level was an inner one). The call, of the script
/// `what` whose reply `parse` reads, is retried once on a new connection (a failure clears
/// the pool): the first attempt may have released before its reply was lost, or never ran
/// (Redis restarted empty), and the same call, retried, tells them apart by the release
/// marker the first attempt left; what it cannot tell is a loss. `foreign`: the lock's key,
/// named when it holds something else.
pub(crate) fn release_level(
    core: &Core,
    hold: &Arc<Hold>,
    (what, parse): (&str, impl Fn(&redis::Value) -> Option<ReleaseReply>),
    foreign: &str,
    by: Deadline,
    call: impl FnOnce(Level) -> Option<Call>,
) -> Result<()> {
    let (level, held) = leave_level(core.shared(), hold, by);
    let Some(call) = call(level) else {
        // An inner level of a lease lost before it was left: the loss came first.
        return if held { Ok(()) } else { Err(Error::LeaseLost) };
    };
    let reply = eval_twice(core, &call, by)
        .and_then(|v| parse(&v).ok_or_else(|| scripts::unexpected(what, &v)));
    released(core.shared(), hold, held, foreign, reply)
}

/// `hold`, just granted, when its lease is known valid; else (its reply came so late that the
/// lease may have run out) `lock` releases it within `by` (a failure logged at `debug`, the
/// hold called a late `what`), and `None`.
pub(crate) fn unless_late(
    lock: &dyn Release,
    hold: Arc<Hold>,
    what: &str,
    by: Deadline,
) -> Option<Arc<Hold>> {
    if hold.is_held() {
        return Some(hold);
    }
    if let Err(e) = lock.release(&hold, by) {
        log::debug!(target: LOG_TARGET, "releasing a late {what} of `{}`: {e}", hold.keys.name);
    }
    None
}

/// A hold of `kind` on `keys` for acquisition `request` of `owner` (no fencing token), with
/// the lease of `terms` from `sent`: renewed every renewal interval (until the terms' maximum
/// hold time after `sent`) and watched by the renewal thread from now on, or, for a fixed
/// lease, never renewed (noted for a shutdown to release).
pub(crate) fn watched_hold(
    shared: &Shared,
    keys: &Arc<LockKeys>,
    (owner, request): (&str, &str),
    (kind, terms): (Kind, Terms),
    sent: Instant,
) -> Arc<Hold> {
    let who = Identity {
        owner: owner.to_owned(),
        acquisition: request.to_owned(),
        token: 0,
    };
    let hold = Arc::new(shared.new_hold(keys, (kind, who), terms, sent));
    shared.renewals.register(&hold);
    hold
}

/// What a release's `reply` means for `hold` (see [`release_level`] for the rest), whose
/// level was left with the lease known valid (`held`) or not: `Ok` only where it was, and the
/// server shows this acquisition's level released, by this call or by its first attempt; a
/// loss is reported once.
///
/// `held` was decided in one step with the hold's loss (see
/// [`Left`](crate::shared::hold::Left)): a loss marked first makes every release of the hold
/// an error, even one the server still carries out (a lease lost on this side, by its local
/// deadline or a refused renewal, whose key outlives it for a moment); a release first keeps
/// a later loss from being marked or reported at all. So `on_lease_lost`, `is_held()` and
/// `unlock()` agree in every order.
pub(crate) fn released(
    shared: &Shared,
    hold: &Arc<Hold>,
    held: bool,
    foreign: &str,
    reply: Result<ReleaseReply>,
) -> Result<()> {
    let reply = match reply {
        // Redis could not be asked, but the lease was known lost already: that is the news.
        Err(e) if !held => {
            let name = &hold.keys.name;
            log::debug!(target: LOG_TARGET, "release of a lost lock `{name}` failed: {e}");
            return Err(Error::LeaseLost);
        }
        other => other?,
    };
    match reply {
        // Released, by this call or (`ReleasedBefore`: a retry after a lost reply) by its first
        // attempt, nobody holding the lock in between. Unless the loss was known first: the
        // server still had the key (its lease outlives the local deadline by the drift
        // margin), and released it.
        ReleaseReply::Released { .. } | ReleaseReply::ReleasedBefore if held => Ok(()),
        ReleaseReply::Released { .. } | ReleaseReply::ReleasedBefore => Err(Error::LeaseLost),
        // An inner level finds the lease lost while outer guards still live: they are told,
        // and the loss is reported once.
        ReleaseReply::Missing => {
            shared.report_lost(hold);
            Err(Error::LeaseLost)
        }
        ReleaseReply::OtherOwner => {
            shared.report_lost(hold);
            Err(Error::NotOwner)
        }
        ReleaseReply::Foreign => Err(Error::ForeignKey {
            key: foreign.to_owned(),
        }),
    }
}
