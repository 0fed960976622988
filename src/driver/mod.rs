//! The one waiting driver under every lock type, and the helpers every lock type's calls use:
//!
//! - `time.rs`: a call's budget, its deadline and the bound of its I/O;
//! - `wait.rs`: the retry loop of an attempt, how long a waiter sleeps, and a primed attempt
//!   left for the subscriber thread to write;
//! - `calls.rs`: one script call retried once on a new connection, an acquire reply read once,
//!   and what an operator's query of a lock type other than the plain mutex shows;
//! - `lease.rs`: what every guard shows of its lease, its release once, and what a release's
//!   reply means;
//! - `detached.rs`: a hold that moves between threads ([`Detached`](crate::Detached)).
//!
//! # The driver
//!
//! A lock type says how one acquire call talks to Redis: its [`Protocol`] (one attempt, where
//! its waiters listen, what a wake may bring, how a waiter leaves the server's queue). The
//! driver owns the rest, the same for every type: the four forms of a call (through its
//! [`Budget`]), the fast path, the local queue, the sleep until a release (with the next
//! attempt primed for the subscriber thread where the protocol can prime one), the retries
//! while Redis cannot be reached, the give-up, and the stats.
//!
//! One call goes:
//!
//! 1. [`Protocol::enter`]: a re-entry that needs no attempt of the driver's;
//! 2. the fast path, one attempt, unless threads of this client wait for the lock already
//!    ([`Protocol::defers`]: they go first) and the call may wait;
//! 3. the queue: the waiter joins the lock's local queue ([`Queue`]) on its channel, and then,
//!    in turn: takes what a wake brought (a lock handed over by a thread of this client, a
//!    grant message), sleeps until a release (bounded by the holder's lease), waits for its
//!    subscription's confirmation and makes a waiter's attempt, until it holds the lock or its
//!    deadline passes. A waiter that gives up or fails leaves the server's queue
//!    ([`Protocol::cancel`]).

use std::time::Duration;

use crate::driver::time::Budget;
use crate::driver::wait::{Fired, RECHECK, retrying, wait_release_firing};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::shared::Core;
use crate::subscriber::{Passed, Registration, Turn};
use crate::topology::backend::{Primed, jitter};
use crate::transport::conn::Deadline;

pub(crate) mod calls;
pub(crate) mod detached;
pub(crate) mod lease;
pub(crate) mod time;
pub(crate) mod wait;

/// The outcome of one attempt.
pub(crate) enum Attempt<H> {
    /// Granted.
    Held(H),
    /// Another owner holds the lock for at most `ttl` (or this waiter waits in the server's
    /// queue). `split`: a quorum lock seen in transition, granted by some masters only.
    Busy { ttl: Duration, split: bool },
}

impl<H> Attempt<H> {
    /// Not granted; try again within `ttl` at the latest.
    pub(crate) fn busy(ttl: Duration) -> Self {
        Attempt::Busy { ttl, split: false }
    }
}

/// How the waiters of one lock wait in this client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    /// In line: one waiter at a time asks Redis, the others wait their turn (a mutex, a
    /// writer, a semaphore, a part of a set, a fair waiter on its own channel).
    Line,
    /// Together: every waiter wakes on each release and asks (readers, who may all proceed).
    Together,
}

/// What a lock type does in one acquire call; the driver calls it. The defaults are those of
/// a lock with no hand-off, no priming and no queue on the server, whose waiters listen on its
/// keys' channel and whose holders have the client's lease. `'a`: the lock's handle, which the
/// call borrows (its client and keys serve the whole call, the driver's logs and stats too).
pub(crate) trait Protocol<'a> {
    /// What a grant gives the caller (a guard).
    type Held;

    /// The client the lock was made from, and the lock's keys (its name, in logs and stats).
    fn lock(&self) -> (&'a Core, &'a LockKeys);

    /// The channel where the releases this waiter waits for (or its grant) are published.
    /// A set of locks waits on the lock that blocked it last, so this may change.
    fn channel(&self) -> &'a str {
        &self.lock().1.channel
    }

    /// How its waiters queue in this client.
    fn queue(&self) -> Queue {
        Queue::Line
    }

    /// How long a waiter waits at most for its turn before it tries anyway, and sleeps after
    /// its turn began with a release to wait for (the lease a holder has).
    fn lease(&self) -> Duration {
        self.lock().0.shared().config.lease
    }

    /// Before any attempt: a re-entry that the driver need not try for, or an error.
    fn enter(&mut self, _budget: &Budget) -> Result<Option<Self::Held>> {
        Ok(None)
    }

    /// Whether the first attempt waits in line: threads of this client wait already.
    fn defers(&self) -> bool {
        let shared = self.lock().0.shared();
        shared.subscriber.has_waiters(self.channel())
    }

    /// One attempt within `by` (and one call's bound). `waiting`: the caller waits for a
    /// release when it is not granted (it queues, or flags the lock for a publish).
    fn attempt(&mut self, waiting: bool, by: Deadline) -> Result<Attempt<Self::Held>>;

    /// The next waiter's attempt, ready for the subscriber thread to write the moment a
    /// release message comes; `None` where this protocol or this call cannot prime one.
    fn prime(&mut self, _by: Deadline) -> Option<Primed> {
        None
    }

    /// What the primed attempt that was written says.
    fn fired(&mut self, fired: Fired, _by: Deadline) -> Result<Attempt<Self::Held>> {
        self.lock().0.shared().backend.unprime(fired.primed);
        Ok(Attempt::busy(Duration::ZERO))
    }

    /// A lock handed to this waiter by a thread of this client; `None` when it cannot take
    /// it (the passed lock then goes back through Redis when dropped).
    fn passed(&mut self, _gift: Passed, _by: Deadline) -> Option<Self::Held> {
        None
    }

    /// What a wake brought besides a release: a grant addressed to this waiter.
    fn woken(&mut self, _reg: &Registration, _by: Deadline) -> Option<Self::Held> {
        None
    }

    /// The longest a waiter sleeps without news, whatever the holder's TTL (see
    /// `Waiter::rest`).
    fn max_sleep(&self) -> Duration {
        Duration::MAX
    }

    /// Leaves the local queue after a grant; `seen`: the release epoch the grant belongs to.
    fn leave(&self, reg: Registration, seen: u64) {
        drop(reg.leave_acquired_quietly(seen));
    }

    /// A waiter that gives up, or fails, leaves the server's queue within `by`: the grant it
    /// got meanwhile, if any.
    fn cancel(&mut self, _by: Deadline) -> Result<Option<Self::Held>> {
        Ok(None)
    }
}

/// The four forms of a lock type's acquire, written once: the blocking one (`lock`), a
/// one-attempt `try_*`, a `try_*_for` and a `try_*_until`, each calling `self.$call(deadline)`
/// with its [`Deadline`] (after the form's own arguments, when `call` names them, as
/// `call: acquire_n(n: u32)`), and the bounds and errors of the timed ones in their docs. The type
/// gives each form its first paragraph, and the blocking form's errors (`errors { .. }`) the
/// errors besides Redis's, and what follows them; the retries of the blocking form are
/// written here. `fails` is what a blocking call that ended without the lock says (it cannot
/// happen: without a deadline the driver ends holding the lock or with an error). A last,
/// optional `fn $with;` adds the closure form (`with_lock`): the blocking form, `f(&guard)`,
/// then the guard's `unlock`, its docs all the type's.
macro_rules! timed_forms {
    (
        guard: $guard:ty, call: $call:ident $(($($arg:ident: $argty:ty),*))?, fails: $fails:literal;
        $(#[$block_doc:meta])* fn $block:ident, errors { $(#[$errors:meta])* }
        $(#[$try_doc:meta])* fn $try:ident;
        $(#[$for_doc:meta])* fn $for:ident;
        $(#[$until_doc:meta])* fn $until:ident;
        $($(#[$with_doc:meta])* fn $with:ident;)?
    ) => {
        $(#[$block_doc])*
        ///
        /// While Redis cannot be reached (refused, reset, or no answer within the timeouts),
        /// it retries with backoff and returns the error within
        /// `max(retry_timeout, connect_timeout + command_timeout)` of the start of the first
        /// attempt that failed (see [`retry_timeout`](crate::ClientBuilder::retry_timeout)).
        ///
        /// # Errors
        ///
        /// [`Error::Redis`](crate::Error::Redis) when Redis cannot be reached or answers with
        /// an error;
        $(#[$errors])*
        pub fn $block(&self $($(, $arg: $argty)*)?) -> $crate::Result<$guard> {
            $crate::driver::held(
                self.$call($($($arg,)*)? $crate::transport::conn::Deadline::NONE),
                $fails,
            )
        }

        $(#[$try_doc])*
        ///
        /// Returns within the connect timeout plus the command timeout, whatever Redis does:
        /// the attempt, and its retry on a new connection when a pooled one failed, share that
        /// bound.
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($block), "`](Self::", stringify!($block), ").")]
        pub fn $try(&self $($(, $arg: $argty)*)?) -> $crate::Result<Option<$guard>> {
            let now = std::time::Instant::now();
            self.$call($($($arg,)*)? $crate::transport::conn::Deadline::at(now))
        }

        $(#[$for_doc])*
        ///
        /// Returns within `max(timeout, connect_timeout) + command_timeout`, whatever Redis
        /// does: an attempt still running at the deadline gets one command timeout more, and
        /// one that must open a connection first gets the connect timeout.
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($block), "`](Self::", stringify!($block), ").")]
        pub fn $for(
            &self,
            $($($arg: $argty,)*)?
            timeout: std::time::Duration,
        ) -> $crate::Result<Option<$guard>> {
            self.$call($($($arg,)*)? $crate::transport::conn::Deadline::after(timeout))
        }

        $(#[$until_doc])*
        ///
        /// Returns within `max(deadline - now, connect_timeout) + command_timeout`, whatever
        /// Redis does.
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($block), "`](Self::", stringify!($block), ").")]
        pub fn $until(
            &self,
            $($($arg: $argty,)*)?
            deadline: std::time::Instant,
        ) -> $crate::Result<Option<$guard>> {
            self.$call($($($arg,)*)? $crate::transport::conn::Deadline::at(deadline))
        }

        $(
            $(#[$with_doc])*
            pub fn $with<T>(&self, f: impl FnOnce(&$guard) -> T) -> $crate::Result<T> {
                let guard = self.$block()?;
                let value = f(&guard);
                guard.unlock()?;
                Ok(value)
            }
        )?
    };
}
pub(crate) use timed_forms;

/// An acquire call of `p`, by `deadline` (never: waits until held; passed: one attempt),
/// counted in the client's [`Stats`](crate::Stats) as a call of kind `kind` on `name`.
pub(crate) fn acquire<'a, P: Protocol<'a>>(
    p: &mut P,
    kind: Kind,
    deadline: Deadline,
) -> Result<Option<P::Held>> {
    let (core, keys) = p.lock();
    counted(core, kind, &keys.name, deadline, || {
        drive(p, &Budget::new(core.shared(), deadline))
    })
}

/// `call`, counted as an acquire call of kind `kind` on `name` by `deadline`.
pub(crate) fn counted<H>(
    core: &Core,
    kind: Kind,
    name: &str,
    deadline: Deadline,
    call: impl FnOnce() -> Result<Option<H>>,
) -> Result<Option<H>> {
    core.shared().ensure_open()?;
    let may_wait = !deadline.passed();
    core.shared().stats.acquire(kind, name, may_wait, call)
}

/// The outcome of a call that waits without a deadline: it ends holding the lock or with an
/// error.
pub(crate) fn held<H>(outcome: Result<Option<H>>, what: &'static str) -> Result<H> {
    outcome?.ok_or(Error::timeout(what))
}

/// One acquire call of `p` within `budget`: the fast path, then the queue.
pub(crate) fn drive<'a, P: Protocol<'a>>(p: &mut P, budget: &Budget) -> Result<Option<P::Held>> {
    if let Some(h) = p.enter(budget)? {
        return Ok(Some(h));
    }
    if budget.past() || !p.defers() {
        // Exactly one attempt when the deadline has passed, else retried while Redis cannot
        // be reached (see [`retrying`]).
        match attempt_retrying(p, false, budget)? {
            Attempt::Held(h) => return Ok(Some(h)),
            Attempt::Busy { .. } if budget.past() => return Ok(None),
            Attempt::Busy { .. } => {}
        }
    }
    wait(p, budget)
}

/// A call of a lock type within a budget that is not an attempt (a read-write lock's check of
/// its re-entry): exactly one when the deadline has passed, else retried while Redis cannot be
/// reached, as every attempt is.
pub(crate) use crate::driver::wait::retrying as within;

/// Attempts until one gets an answer (see [`retrying`]).
fn attempt_retrying<'a, P: Protocol<'a>>(
    p: &mut P,
    waiting: bool,
    budget: &Budget,
) -> Result<Attempt<P::Held>> {
    let (core, keys) = p.lock();
    retrying(core, &keys.name, budget, |by| p.attempt(waiting, by))
}

/// Leaves without the lock (a deadline), unless a lock handed over or granted meanwhile
/// cannot go to anyone else: then the call holds it all the same.
fn give_up<'a, P: Protocol<'a>>(
    p: &mut P,
    reg: Option<Registration>,
    budget: &Budget,
) -> Result<Option<P::Held>> {
    if let Some(passed) = reg.and_then(Registration::leave_giving_up)
        && let Some(h) = p.passed(passed, budget.limit)
    {
        return Ok(Some(h));
    }
    p.cancel(budget.limit)
}

/// How many quick retries a quorum waiter makes after a release message when the lock is in
/// transition (granted by some masters only): the release it heard may not have reached the
/// other masters yet.
const SPLIT_RETRIES: u32 = 4;

/// A waiter in a lock's local queue.
struct Waiter {
    reg: Registration,
    /// The channel it joined.
    channel: String,
    /// What it does next: wait for a release after an epoch, or try at once.
    turn: Turn,
    /// Until when it sleeps without news: the TTL its last attempt returned.
    bound: Deadline,
    /// Quick retries left for a quorum lock seen in transition.
    split_retries: u32,
}

/// How a waiter leaves the local queue.
enum Exit<H> {
    /// Holding the lock; the grant belongs to the release after this epoch.
    Held(H, u64),
    /// Without it: the deadline passed.
    GiveUp,
    /// Without it: an attempt failed.
    Failed(Error),
    /// To wait in another lock's queue (a set of locks blocked by another of its locks).
    Moved,
}

/// What a sleep until a release ended with.
enum Woke<H> {
    /// Leave the queue.
    Exit(Exit<H>),
    /// A primed attempt found the lock taken again: sleep until the next release.
    Busy(Duration),
    /// Try now.
    Try,
}

/// Waits in the local queue until the call is done, on one channel or, for a set of locks,
/// on the channel of the lock that blocks it.
fn wait<'a, P: Protocol<'a>>(p: &mut P, budget: &Budget) -> Result<Option<P::Held>> {
    loop {
        let Some(mut w) = Waiter::join(p, budget) else {
            return give_up(p, None, budget);
        };
        match w.run(p, budget) {
            Exit::Held(h, seen) => {
                p.leave(w.reg, seen);
                return Ok(Some(h));
            }
            Exit::GiveUp => return give_up(p, Some(w.reg), budget),
            // A lock handed over or granted meanwhile is held all the same.
            Exit::Failed(e) => {
                return match give_up(p, Some(w.reg), budget) {
                    Ok(Some(h)) => Ok(Some(h)),
                    _ => Err(e),
                };
            }
            Exit::Moved => {}
        }
    }
}

impl Waiter {
    /// Joins the queue on the protocol's channel and waits for its turn; `None` when the
    /// deadline passed first.
    fn join<'a, P: Protocol<'a>>(p: &P, budget: &Budget) -> Option<Waiter> {
        let shared = p.lock().0.shared();
        let channel = p.channel().to_owned();
        let (reg, turn) = match p.queue() {
            Queue::Together => (shared.subscriber.join_all(&channel), Turn::TryNow),
            Queue::Line => {
                let reg = shared.subscriber.join(&channel);
                let turn = reg.wait_turn(budget.deadline, p.lease())?;
                (reg, turn)
            }
        };
        Some(Waiter {
            reg,
            channel,
            turn,
            // A turn that begins with a wait for a release (the thread ahead just acquired)
            // sleeps no longer than any other sleep of this protocol.
            bound: Deadline::after(p.lease().min(p.max_sleep())),
            split_retries: 0,
        })
    }

    /// Waits in turn until it leaves the queue.
    fn run<'a, P: Protocol<'a>>(&mut self, p: &mut P, budget: &Budget) -> Exit<P::Held> {
        loop {
            if let Some(h) = self.received(p, budget) {
                return Exit::Held(h, self.reg.epoch());
            }
            if let Turn::WaitFrom(seen) = self.turn {
                match self.sleep(p, seen, budget) {
                    Woke::Exit(exit) => return exit,
                    Woke::Busy(ttl) if p.channel() == self.channel => {
                        self.rest(p, ttl, true, seen + 1);
                        continue;
                    }
                    Woke::Busy(_) => return Exit::Moved,
                    Woke::Try => {}
                }
            }
            if let Some(exit) = self.try_once(p, budget) {
                return exit;
            }
            if budget.past() {
                return Exit::GiveUp;
            }
            if p.channel() != self.channel {
                return Exit::Moved;
            }
        }
    }

    /// A lock handed to this waiter (by a thread of this client, or a grant addressed to it).
    fn received<'a, P: Protocol<'a>>(&self, p: &mut P, budget: &Budget) -> Option<P::Held> {
        if let Some(passed) = self.reg.take_passed()
            && let Some(h) = p.passed(passed, budget.limit)
        {
            return Some(h);
        }
        p.woken(&self.reg, budget.limit)
    }

    /// Sleeps until a release after epoch `seen`, bounded by the holder's lease and the
    /// deadline, with the next attempt primed where the protocol can prime one. The fired
    /// attempt's outcome counts; nothing when nothing was fired, or the fired call failed
    /// (the plain path then retries the same request, which answers as the first did).
    fn sleep<'a, P: Protocol<'a>>(
        &mut self,
        p: &mut P,
        seen: u64,
        budget: &Budget,
    ) -> Woke<P::Held> {
        let until = budget.deadline.min(self.bound);
        let fired = match p.prime(budget.limit) {
            None => {
                self.reg.wait_release(seen, until);
                None
            }
            Some(primed) => {
                let shared = p.lock().0.shared();
                wait_release_firing(shared, &self.reg, primed, seen, until).and_then(|fired| {
                    p.fired(fired, budget.limit)
                        .inspect_err(|e| {
                            log::debug!("a primed acquire of `{}` failed: {e}", p.lock().1.name);
                        })
                        .ok()
                })
            }
        };
        if let Some(Attempt::Held(h)) = fired {
            // Any passed lock that came meanwhile is stale, as after a waiter's attempt.
            return Woke::Exit(Exit::Held(h, seen + 1));
        }
        if let Some(h) = self.received(p, budget) {
            return Woke::Exit(Exit::Held(h, self.reg.epoch()));
        }
        if budget.past() {
            return Woke::Exit(Exit::GiveUp);
        }
        if let Some(Attempt::Busy { ttl, .. }) = fired {
            return Woke::Busy(ttl);
        }
        if self.reg.epoch() != seen {
            self.split_retries = SPLIT_RETRIES;
        }
        Woke::Try
    }

    /// The lock was found held for `ttl` more: sleep until a release after `seen`, the
    /// holder's TTL bounding the sleep (a crashed holder publishes nothing; the lock type's
    /// longest sleep too), [`RECHECK`] at most without a confirmed subscription (see
    /// [`sleep_bound`]). `confirmed`: the subscription was confirmed before the attempt.
    fn rest<'a, P: Protocol<'a>>(&mut self, p: &P, ttl: Duration, confirmed: bool, seen: u64) {
        let until = Deadline::after(ttl.min(p.max_sleep()) + Duration::from_millis(1));
        self.bound = sleep_bound(until, confirmed && self.reg.confirmed());
        self.turn = Turn::WaitFrom(seen);
    }

    /// A waiter's attempt, once its subscription is confirmed (a release before the
    /// SUBSCRIBE took effect would be missed) and no release of this client gives way to
    /// other processes' waiters. `Some` when the waiter leaves the queue.
    fn try_once<'a, P: Protocol<'a>>(
        &mut self,
        p: &mut P,
        budget: &Budget,
    ) -> Option<Exit<P::Held>> {
        let shared = p.lock().0.shared();
        let confirmed = self
            .reg
            .wait_confirmed(shared.config.confirm_by(budget.deadline));
        let give_way = budget.deadline.min(Deadline::after(p.lease()));
        self.reg.wait_give_way(give_way);
        if let Some(h) = self.received(p, budget) {
            return Some(Exit::Held(h, self.reg.epoch()));
        }
        let seen = self.reg.epoch();
        match attempt_retrying(p, true, budget) {
            // A hand-off that reached this waiter meanwhile passes a lock that is not on the
            // server any more (this attempt found it free): leaving drops it, which changes
            // nothing there.
            Ok(Attempt::Held(h)) => Some(Exit::Held(h, seen)),
            Ok(Attempt::Busy { split: true, .. }) if self.split_retries > 0 => {
                self.split_retries -= 1;
                let wait =
                    jitter(Duration::from_millis(1) * (1 << (SPLIT_RETRIES - self.split_retries)));
                self.bound = Deadline::after(wait);
                self.turn = Turn::WaitFrom(seen);
                None
            }
            Ok(Attempt::Busy { ttl, .. }) => {
                self.rest(p, ttl, confirmed, seen);
                None
            }
            Err(e) => Some(Exit::Failed(e)),
        }
    }
}

/// A follower of a channel that waits for no lock (an election's observer): it joins the
/// channel with every other follower, its subscription confirmed (bounded) before the first
/// read, and sleeps until a message after what it read, as a waiter does.
#[derive(Debug)]
pub(crate) struct Watch {
    reg: Registration,
    /// The release epoch of the last read.
    seen: u64,
}

impl Watch {
    /// Joins `channel` of `core`'s subscriber.
    pub(crate) fn join(core: &Core, channel: &str) -> Watch {
        let shared = core.shared();
        let reg = shared.subscriber.join_all(channel);
        reg.wait_confirmed(shared.config.confirm_by(Deadline::NONE));
        let seen = reg.epoch();
        Watch { reg, seen }
    }

    /// Marks every message so far as read: call it right before reading what they announce.
    pub(crate) fn mark(&mut self) {
        self.seen = self.reg.epoch();
    }

    /// Sleeps until a message after the last mark, or `until`; while the subscription is not
    /// confirmed (the pub/sub connection is down), [`RECHECK`] at most. True when it is time
    /// to read again: a message came, or the sleep was cut short for want of a subscription.
    pub(crate) fn wait(&self, until: Deadline) -> bool {
        let confirmed = self.reg.confirmed();
        self.reg
            .wait_release(self.seen, sleep_bound(until, confirmed));
        self.reg.epoch() != self.seen || (!confirmed && !until.passed())
    }
}

/// How long a sleep without news may last, at most `until`: without a confirmed
/// subscription, which could miss the release, [`RECHECK`] at most (the sleep after a busy
/// attempt, and a watch's).
fn sleep_bound(until: Deadline, confirmed: bool) -> Deadline {
    if confirmed {
        until
    } else {
        until.min(Deadline::after(RECHECK))
    }
}
