//! A hold that moves between threads: [`Detached`], what a guard becomes when its thread lets
//! go of it, until a thread attaches it again or releases it.
//!
//! A guard belongs to the thread that locked: its re-entry and its release are that thread's.
//! A detached hold belongs to no thread. Its lease keeps being renewed; any thread may ask
//! whether it is held, release it, or attach it, becoming its owning thread. While it is
//! detached no thread re-enters it: the thread that detached it takes a new owner id for its
//! later acquisitions, so a `lock()` of the same name from it waits as any other owner's would.

use std::marker::PhantomData;

use crate::driver::lease::Lease;
use crate::error::Result;

/// A held lock that no thread owns, on its way from the thread that locked it to the thread
/// that does the work: `Send + 'static`, made by a guard's `detach`.
///
/// - [`attach`](Detached::attach), on the thread that now runs the work, gives back an
///   ordinary guard owned by that thread, which may re-enter from there and release;
/// - [`unlock`](Detached::unlock) releases from any thread, with the same honest results as a
///   guard's `unlock` (never `Ok` after a loss);
/// - dropping it releases, as dropping a guard does (a failure then logged at `warn`).
///
/// The lease keeps being renewed while the hold is detached, and the hold counts as held in
/// [`Client::stats`](crate::Client::stats); [`holder`](crate::Mutex::holder) and the CLI show
/// the thread that took the lock. `on_lease_lost` reports a detached hold's loss as any other.
///
/// While a hold is detached, no thread re-enters it. A `lock()` of the same name from the
/// thread that detached it waits as any other owner's would: if that thread is also the one
/// that must release the detached hold, it waits for itself until the lease runs out (a
/// renewed lease never does). Use `try_lock_for` where that can happen.
///
/// ```
/// fn is_send<T: Send + 'static>() {}
/// is_send::<locksmith::Detached<locksmith::MutexGuard>>();
/// is_send::<locksmith::Detached<locksmith::FairMutexGuard>>();
/// is_send::<locksmith::Detached<locksmith::RwLockReadGuard>>();
/// is_send::<locksmith::Detached<locksmith::RwLockWriteGuard>>();
/// is_send::<locksmith::Detached<locksmith::MultiGuard>>();
/// ```
///
/// The guards themselves stay with their thread:
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<locksmith::FairMutexGuard>();
/// ```
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<locksmith::RwLockReadGuard>();
/// ```
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<locksmith::RwLockWriteGuard>();
/// ```
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<locksmith::MultiGuard>();
/// ```
///
/// # Examples
///
/// A dispatcher takes the lock for a job; a pool thread does the work and releases it:
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let job = client.mutex("invoice:2041")?.lock()?.detach().expect("held once");
/// let worker = std::thread::spawn(move || -> locksmith::Result<()> {
///     let guard = job.attach()?;
///     // ... the work, stamped with guard.fencing_token() ...
///     guard.unlock()
/// });
/// worker.join().expect("the worker panicked")?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
pub struct Detached<G: Guard> {
    parts: G::Parts,
    _guard: PhantomData<fn() -> G>,
}

impl<G: Guard> std::fmt::Debug for Detached<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached")
            .field("is_held", &self.parts.is_held())
            .finish_non_exhaustive()
    }
}

impl<G: Guard> Detached<G> {
    /// A detached hold of `parts`.
    pub(crate) fn new(parts: G::Parts) -> Self {
        Detached {
            parts,
            _guard: PhantomData,
        }
    }

    /// What the hold is while detached.
    pub(crate) fn parts(&self) -> &G::Parts {
        &self.parts
    }

    /// Makes the calling thread the hold's owner: an ordinary guard, which re-enters and
    /// releases from this thread. No I/O.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`](crate::Error::Misuse) when the calling thread holds the
    /// same lock already through another guard (a read lock of the same
    /// [`RwLock`](crate::RwLock)): a thread holds a lock once. The hold is then released, as
    /// when a `Detached` is dropped.
    pub fn attach(self) -> Result<G> {
        G::attach(self.parts)
    }

    /// Releases the hold from the calling thread, with the results of the guard's `unlock`:
    /// it asks the server, and returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As the guard's `unlock`: [`Error::LeaseLost`](crate::Error::LeaseLost) when the lease
    /// had run out, [`Error::NotOwner`](crate::Error::NotOwner) when another owner holds the
    /// lock now, [`Error::Redis`](crate::Error::Redis) when Redis could not be asked.
    pub fn unlock(self) -> Result<()> {
        self.parts.unlock()
    }

    /// True while the lease is known to be valid; no I/O, as a guard's `is_held`.
    pub fn is_held(&self) -> bool {
        self.parts.is_held()
    }

    /// Checks that the lease is still valid, for use right before a side effect; no I/O.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) when [`is_held`](Detached::is_held) is
    /// false.
    pub fn check(&self) -> Result<()> {
        self.parts.check()
    }
}

/// A guard type that can be detached: what its hold is while detached, and how a thread
/// attaches it. Implemented by every guard type of the crate, and by nothing else (this trait
/// cannot be named outside the crate).
pub trait Guard: Sized {
    /// What the hold is while detached.
    #[doc(hidden)]
    type Parts: Parts;

    /// Makes the calling thread the owner of the hold of `parts`.
    #[doc(hidden)]
    fn attach(parts: Self::Parts) -> Result<Self>;
}

/// A detached hold: its lease, and its release, from any thread. Dropping it releases.
pub trait Parts: Send + 'static {
    /// True while the lease is known to be valid.
    #[doc(hidden)]
    fn is_held(&self) -> bool;

    /// `Ok` while the lease is known to be valid.
    #[doc(hidden)]
    fn check(&self) -> Result<()>;

    /// Releases the hold.
    #[doc(hidden)]
    fn unlock(self) -> Result<()>;
}

impl Parts for Lease {
    fn is_held(&self) -> bool {
        self.hold().is_held()
    }

    fn check(&self) -> Result<()> {
        self.hold().check()
    }

    fn unlock(self) -> Result<()> {
        Lease::unlock(self)
    }
}

/// A guard type `$guard { lease, _thread }` that can be detached: its `detach`, and how a
/// thread attaches it (see `detached.rs`).
macro_rules! detachable {
    ($guard:ident) => {
        impl $guard {
            /// Lets the calling thread go of the hold, so that another thread can take it over:
            /// a [`Detached`](crate::Detached) hold, `Send + 'static`, which any thread may
            /// [`attach`](crate::Detached::attach) (becoming its owner),
            /// [`unlock`](crate::Detached::unlock) or drop. The lease keeps being renewed. No
            /// I/O.
            ///
            /// # Errors
            ///
            /// Gives the guard back, unchanged, where the hold cannot move: it is re-entered
            /// (this thread holds more than one level of it).
            pub fn detach(self) -> std::result::Result<$crate::Detached<$guard>, $guard> {
                match self.lease.detach() {
                    Ok(lease) => Ok($crate::Detached::new(lease)),
                    Err(lease) => Err($guard {
                        lease,
                        _thread: std::marker::PhantomData,
                    }),
                }
            }
        }

        impl $crate::driver::detached::Guard for $guard {
            type Parts = $crate::driver::lease::Lease;

            fn attach(parts: Self::Parts) -> $crate::Result<Self> {
                Ok($guard {
                    lease: parts.attach()?,
                    _thread: std::marker::PhantomData,
                })
            }
        }
    };
}
pub(crate) use detachable;

// A detached hold moves between threads by design.
const _: () = {
    const fn assert_send<T: Send + 'static>() {}
    assert_send::<Lease>();
};
