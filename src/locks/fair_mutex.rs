//! [`FairMutex`] and [`FairMutexGuard`]: a mutex whose waiters are served in arrival order,
//! across processes, with direct hand-off.
//!
//! # Protocol
//!
//! The lock is one string, `GEN|OWNER|S|US` (the acquisition, the owner, and the server clock
//! at the grant), with the level count and the last acquire and release request ids appended
//! after a re-entry or an inner release; the fencing token is the clock at the grant in
//! microseconds (the time of a higher token where the name's fencing mark was above the
//! clock). Beside it, the lock keeps a queue of waiter ids in Redis, and
//! for each waiter a heartbeat deadline on the server's clock. One script
//! (`scripts/fair_mutex.lua`) does everything atomically:
//!
//! - **acquire** takes the lock when it is free and nobody is queued (one `SET` after one
//!   `EXISTS` of the lock and the queue); otherwise the caller joins the queue (or refreshes
//!   its place), and flags the lock (`|w` at the end of its value). It never barges past a
//!   live waiter.
//! - **release** at the last level moves the lock to a release marker (`RENAME`); when the lock
//!   is flagged it first *grants* it to the first live waiter: it writes that waiter as the
//!   owner, with a new fencing token, and publishes the token on the waiter's own channel. The
//!   waiter wakes up holding the lock: no acquire round trip follows the wake. An unflagged
//!   lock has nobody queued behind it: its release publishes nothing.
//! - **renew** extends the caller's lock, or its place in the queue (its heartbeat). The
//!   renewal thread sends it for held locks and for queued waiters alike, in its batches.
//!
//! Tokens come from the fence (`scripts/prelude/fence.lua`): the server clock at the grant,
//! or above the slot's fencing mark where the clock is not (a step back), and the grant raises
//! the mark. A fair mutex reserves no hand-off blocks.
//!
//! # Why the grant is safe to use at once
//!
//! A granted lock lasts until the waiter's heartbeat deadline on the server. That deadline is
//! at least the send time of the waiter's last successful heartbeat (or enqueue) plus the
//! lease, and the grant happened after it; so a waiter that takes the grant from the message
//! counts its lease from that send time, never later than the server does. (Only while that
//! place lasts: a place lost while the process was paused and made anew says nothing of a grant
//! published before it, so after that the waiter asks the server, see `Acquire::woken`.) A
//! waiter that died before picking the grant up loses it at that deadline, and the next waiter
//! is granted by the first script that runs after it. No message comes then, so a waiter's
//! sleep is bounded by the lock's TTL and by the heartbeat deadline of every waiter ahead of
//! it, each by that waiter's own lease (clients with different leases may queue on one lock):
//! the next live waiter asks at that deadline, whoever released and whatever lease the
//! releasing client had.
//!
//! A waiter with a fixed lease ([`FairMutex::with_lease`]) never takes a grant from the
//! message: a grant lasts to the waiter's heartbeat deadline, and each heartbeat of its place
//! extends a lock granted to it, neither of which is its fixed lease. So before each attempt it
//! stops its place's heartbeats (waiting for one on the wire), and the attempt that finds the
//! lock granted to this very call sets the lock's expiry to the fixed lease from then, exactly
//! (the acquire script's seventh argument). Nothing extends it afterwards: the lock is not
//! renewed, no heartbeat of the waiter is left, and a re-entry leaves a fixed lease as it is.
//!
//! # Why no grant is missed
//!
//! A waiter subscribes its own channel, and waits (bounded) for the confirmation, before it
//! joins the queue; a grant can only be published after it joined. A grant whose message was
//! lost anyway (a reconnect) is found by the next acquire call, which recognises a lock
//! granted to this very call; the waiter makes that call when a reconnect wakes it, or at the
//! latest when the lock's TTL runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use crate::driver::calls::{self, ask, eval_twice};
use crate::driver::detached::detachable;
use crate::driver::lease::{
    Lease, Release, ThreadBound, lease_guard, release_level, unless_late, watched_hold,
};
use crate::driver::{self, Attempt, Protocol, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::fair_mutex;
use crate::protocol::keys::LockKeys;
use crate::protocol::lock_value::Shape;
use crate::protocol::scripts::Admin;
use crate::protocol::scripts::{self, AcquireReply, Holder as Who, Level, Live};
use crate::shared::Core;
use crate::shared::config::validate_lease;
use crate::shared::grant::{Grant, Terms, request_id};
use crate::shared::hold::Hold;
use crate::shared::holder::Holder;
use crate::subscriber::Registration;
use crate::transport::conn::Deadline;

/// A distributed, reentrant, *fair* lock: waiters get it in the order they asked for it,
/// across threads and processes, and a release hands it straight to the next waiter.
///
/// Use it instead of [`Mutex`](crate::Mutex) when starvation matters: under contention a plain
/// mutex goes to whichever waiter asks first after a release, so an unlucky one can wait
/// for many rounds; a fair mutex serves its queue first come, first served.
///
/// A `FairMutex` is a cheap handle (`Clone + Send + Sync`), made by
/// [`Client::fair_mutex`](crate::Client::fair_mutex). Its keys are its own: a
/// [`Mutex`](crate::Mutex) of the same name is another lock.
///
/// | method | waits | returns |
/// |---|---|---|
/// | [`lock`](FairMutex::lock) | until held | `Result<FairMutexGuard>` |
/// | [`try_lock`](FairMutex::try_lock) | no: one attempt | `Result<Option<FairMutexGuard>>` |
/// | [`try_lock_for`](FairMutex::try_lock_for) | at most the given time | `Result<Option<FairMutexGuard>>` |
/// | [`try_lock_until`](FairMutex::try_lock_until) | until the given instant | `Result<Option<FairMutexGuard>>` |
///
/// # What it promises
///
/// - Everything a [`Mutex`](crate::Mutex) promises while the lease is valid: mutual
///   exclusion, re-entry per thread, fencing tokens, renewal, honest loss.
/// - **Strict FIFO among live waiters**: the lock goes to waiters in the order their
///   requests reached Redis. [`try_lock`](FairMutex::try_lock) never barges past a queued
///   waiter: it fails while anyone is queued.
/// - **Direct hand-off**: a release grants the lock to the first waiter and tells it by
///   pub/sub; the woken waiter already holds it.
/// - **Dead waiters are skipped**: a queued waiter's place is a lease (the client's lease,
///   renewed by the renewal thread, measured by the server's clock). A waiter that died is
///   skipped at most one lease *of that waiter* after its last heartbeat, and a grant it
///   never picked up is lost at that same deadline; then the next waiter is granted, whoever
///   released and whatever the releasing client's lease.
/// - A waiter that gives up (`try_lock_for` timing out) leaves the queue.
/// - A handle made with [`with_lease`](FairMutex::with_lease) takes fixed leases, never
///   renewed: the lock frees itself a fixed time after each acquisition, and the queue moves
///   on.
///
/// # Topologies
///
/// One Redis server, reached directly ([`Client::open`](crate::Client::open),
/// [`Client::builder`](crate::Client::builder)) or through Sentinel
/// ([`Client::sentinel`](crate::Client::sentinel)). On a client over several masters
/// ([`Client::redlock`](crate::Client::redlock)) every acquiring call returns
/// [`Error::Unsupported`] before anything is sent: the arrival order of a queue cannot be
/// agreed by majority vote across independent masters (two waiters may each be first on a
/// different majority), and a direct hand-off is one server's atomic decision.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let printer = client.fair_mutex("printer")?;
/// {
///     let guard = printer.lock()?; // first come, first served
///     let _token = guard.fencing_token();
///     // ... print ...
/// } // released here, and granted to the next waiter in the queue
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FairMutex {
    client: Core,
    keys: Arc<LockKeys>,
    /// A fixed lease for its acquisitions, never renewed; `None`: the client's lease, renewed
    /// while the guard lives.
    fixed_lease: Option<Duration>,
}

/// A waiter's place in the queue, kept alive by the renewal thread while it waits.
struct QueuePlace<'a> {
    client: &'a Core,
    hold: Option<Arc<Hold>>,
    /// The place was lost (this process paused past its lease) and made anew: a grant
    /// message may then be one from before, see [`Acquire::woken`].
    remade: bool,
}

impl QueuePlace<'_> {
    /// The earliest time the lock can have been granted to this waiter: the send time of
    /// its last successful heartbeat (the grant came after it, and lasts at least a lease
    /// from it).
    fn granted_since(&self) -> Option<Instant> {
        let hold = self.hold.as_ref()?;
        let keep = hold
            .lease
            .saturating_sub(self.client.shared().backend.drift(hold.lease));
        hold.deadline()?.checked_sub(keep)
    }

    /// Stops keeping the place; whether there was one. No wait for a heartbeat on the wire:
    /// once the place is left, a heartbeat finds it gone and extends nothing.
    fn leave(&mut self) -> bool {
        self.stop(Duration::ZERO)
    }

    /// Stops renewing the place (on the server it stays until its deadline), waiting at most
    /// `bound` for a heartbeat on the wire; whether there was one. A heartbeat extends a lock
    /// granted to the waiter as it extends its place: a waiter with a fixed lease stops them
    /// before any call that may take a grant, so that none lands after it.
    fn stop(&mut self, bound: Duration) -> bool {
        let Some(h) = self.hold.take() else {
            return false;
        };
        self.client.shared().unwatch(&h, bound);
        true
    }

    /// Keeps the place of acquisition `who` (owner, request) on the lock of `keys`, by the
    /// renewal thread from `sent`, the send time of the call that made it (a place lost while
    /// paused is made anew).
    fn keep(&mut self, keys: &Arc<LockKeys>, who: (&str, &str), sent: Instant) {
        if self.hold.as_ref().is_some_and(|h| h.is_held()) {
            return;
        }
        self.remade |= self.leave();
        // A place is renewed with the client's lease, without a maximum hold time.
        let terms = Terms {
            max_hold: None,
            ..self.client.terms_with(None)
        };
        self.hold = Some(watched_hold(
            self.client.shared(),
            keys,
            who,
            (Kind::FairPlace, terms),
            sent,
        ));
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

impl FairMutex {
    pub(crate) fn new(client: Core, prefix: &str, name: &str) -> Self {
        FairMutex {
            keys: Arc::new(LockKeys::family(prefix, name, "fair", "grant:")),
            client,
            fixed_lease: None,
        }
    }

    /// The same lock with a fixed lease: never renewed, so the lock frees itself `lease` after
    /// each acquisition even if its holder is still working. Use it for work with a known
    /// bound, where a stuck holder must not keep the lock (and the queue behind it).
    ///
    /// The lease is that of new acquisitions. A thread that already holds the lock re-enters
    /// its acquisition and keeps that acquisition's terms, through whatever handle: a re-entry
    /// never shortens the lease on the server, and never extends a fixed lease.
    ///
    /// In the queue, a waiter with a fixed lease keeps its place as every waiter does (the
    /// client's lease, renewed), and a release grants it the lock as it grants any waiter.
    /// But it does not take the grant from the release's message: it asks the server (one
    /// more round trip), and its fixed lease starts then; until that call, the grant lasts to
    /// the waiter's heartbeat deadline, as a renewed waiter's grant does, so a waiter that
    /// died is still skipped. A fixed-lease waiter that gives up just as it is granted the
    /// lock passes it on to the next waiter (a renewed one keeps it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `lease` is under 30 ms or over 365 days.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// use std::time::Duration;
    ///
    /// let printer = client.fair_mutex("printer")?.with_lease(Duration::from_secs(120))?;
    /// let job = printer.lock()?; // in turn; free again 2 minutes after it is taken at the latest
    /// // ... print ...
    /// job.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn with_lease(&self, lease: Duration) -> Result<FairMutex> {
        validate_lease(lease)?;
        Ok(FairMutex {
            fixed_lease: Some(lease),
            ..self.clone()
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// Whether anyone (any process, any thread) holds the lock right now, or it was granted
    /// to a waiter that has not picked it up yet.
    ///
    /// Asks the server. Returns within the connect timeout plus the command timeout; a pooled
    /// connection that died (Redis restarted) is retried at once on a new one, within that
    /// bound.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked; [`Error::Unsupported`] on a client over
    /// several masters, before anything is sent (as every call of a fair mutex).
    pub fn is_locked(&self) -> Result<bool> {
        if self.client.shared().backend.masters() > 1 {
            return Err(Error::unsupported(
                "this lock type needs a client on one Redis server, Sentinel or a Cluster, \
                 not a quorum of masters",
            ));
        }
        let shared = self.client.shared();
        shared.ensure_open()?;
        let by = Deadline::after(shared.config.one_call());
        shared.backend.exists(&self.keys, by)
    }

    /// Who holds the lock now, as the server tells it (any process, any thread): `None` when
    /// it is free. A lock granted to a waiter that has not picked it up yet is held by that
    /// waiter. `hold_count` is the number of levels the server counts, `held_for` is since the
    /// acquisition (its outermost level), both durations by the server's clock.
    ///
    /// One script call: returns within the connect timeout plus the command timeout (a pooled
    /// connection that died is retried at once on a new one, within that bound).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis cannot be asked; [`Error::ForeignKey`] when the lock's key
    /// holds something else; [`Error::Unsupported`] on a client over several masters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// let printer = client.fair_mutex("printer")?;
    /// if let Some(h) = printer.holder()? {
    ///     println!("held by {} ({}) for {:?}, {} waiting", h.label, h.thread, h.held_for,
    ///         printer.waiters()?);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Result<Option<Holder>> {
        let items = self.info()?;
        let now = calls::clock_us(&items);
        calls::lone_holder(items, now, Shape::Fair, "fair holder")
    }

    /// How many live waiters are queued for the lock (waiters whose heartbeat lapsed, dead
    /// processes, are not counted; they are dropped from the queue as it moves on).
    ///
    /// One script call, within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`holder`](FairMutex::holder).
    pub fn waiters(&self) -> Result<usize> {
        let items = self.info()?;
        match items.get(4).and_then(scripts::int).map(usize::try_from) {
            Some(Ok(n)) => Ok(n),
            _ => Err(scripts::unexpected("fair waiters", &Value::Array(items))),
        }
    }

    /// The server's `{S, US, holder, ttl, waiters}` (see `scripts/fair_mutex.lua`).
    fn info(&self) -> Result<Vec<Value>> {
        let call = fair_mutex::admin(&self.keys, Admin::Holder);
        match ask(&self.client, &call, &self.keys, "fair info")? {
            Value::Array(items) if items.len() == 5 => Ok(items),
            other => Err(scripts::unexpected("fair info", &other)),
        }
    }

    /// Frees the lock on the server whoever holds it (an operator's tool, for a holder that is
    /// stuck but alive), and grants it to the first live waiter in the queue, who is told at
    /// once; the queue stays. Returns `true` when someone held it.
    ///
    /// The dispossessed holder finds out at its next renewal at the latest: its guard's
    /// [`is_held`](FairMutexGuard::is_held) turns false, `on_lease_lost` is called, and its
    /// [`unlock`](FairMutexGuard::unlock) is an error, never `Ok`. Fencing tokens keep rising
    /// (the next grant's token is above the slot's fencing mark). Logged at `warn` with
    /// the label and thread of the holder removed.
    ///
    /// One script call, within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`holder`](FairMutex::holder); a foreign key is left alone.
    pub fn force_unlock(&self) -> Result<bool> {
        let call = fair_mutex::admin(&self.keys, Admin::Force);
        let logged = (module_path!(), "fair mutex", Shape::Fair);
        calls::force_holders(&self.client, &call, &self.keys, "fair force_unlock", logged)
    }

    timed_forms! { guard: FairMutexGuard, call: acquire, fails: "lock() ended without the lock";
        /// Blocks until the lock is held by the calling thread, after every waiter that queued
        /// before it.
        fn lock, errors {
        /// [`Error::ForeignKey`] when the lock's key holds something else;
        /// [`Error::Unsupported`] on a client over several masters.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> locksmith::Result<()> {
        /// # let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
        /// let lock = client.fair_mutex("report:daily")?;
        /// let _guard = lock.lock()?;
        /// # Ok(()) }
        /// ```
        }
        /// Makes exactly one attempt, without joining the queue. `Ok(None)` when another owner
        /// holds the lock or a live waiter is queued for it (a fair mutex never barges).
        fn try_lock;
        /// Waits at most `timeout` for the lock, in the queue. `Ok(None)` when it was not granted
        /// in time (the caller then leaves the queue). A zero timeout is
        /// [`try_lock`](FairMutex::try_lock); a timeout too large to represent waits without a
        /// deadline.
        fn try_lock_for;
        /// Waits until `deadline` at most for the lock, as
        /// [`try_lock_for`](FairMutex::try_lock_for).
        fn try_lock_until;
        /// Runs `f` while holding the lock, then releases it, and returns what `f` returned:
        /// [`lock`](FairMutex::lock) (in the queue), `f(&guard)`,
        /// [`unlock`](FairMutexGuard::unlock). The same as
        /// [`Mutex::with_lock`](crate::Mutex::with_lock): a panic in `f` releases the lock as the
        /// guard is dropped.
        ///
        /// # Errors
        ///
        /// As [`lock`](FairMutex::lock), and `f` is not called; as
        /// [`unlock`](FairMutexGuard::unlock) when the release fails after `f` ran (a lease lost
        /// while `f` ran: [`Error::LeaseLost`], [`Error::NotOwner`]): `f`'s value is then dropped
        /// and the error returned in its place.
        fn with_lock;
    }

    /// Releases acquisition `acquisition` of `owner` (owner- and acquisition-checked: to the
    /// next waiter); a failure is logged as `what` and left to the lease.
    fn give_back(&self, owner: &str, acquisition: &str, by: Deadline, what: &str) {
        let call = release_call(&self.keys, Who { owner, acquisition }, Level::Outermost);
        if let Err(e) = eval_twice(&self.client, &call, by) {
            log::debug!("{what} of `{}`: {e}", self.keys.name);
        }
    }

    /// An acquire call by `deadline`, through the driver (see `driver/mod.rs`).
    fn acquire(&self, deadline: Deadline) -> Result<Option<FairMutexGuard>> {
        let owner = self.client.shared().owner();
        let request = request_id();
        // Grants to this waiter are published on a channel of its own.
        let channel = format!("{}{owner}/{request}", self.keys.channel);
        let mut call = Acquire {
            mutex: self,
            channel: &channel,
            owner,
            request,
            place: QueuePlace {
                client: &self.client,
                hold: None,
                remade: false,
            },
        };
        driver::acquire(&mut call, Kind::FairMutex, deadline)
    }
}

/// One acquire call of a [`FairMutex`]: the first attempt without queueing (it succeeds when
/// the lock is free with nobody queued, or for a re-entry), then the queue on the server,
/// whose grant to this waiter comes as a message on a channel of its own.
struct Acquire<'a> {
    mutex: &'a FairMutex,
    owner: String,
    request: String,
    channel: &'a str,
    place: QueuePlace<'a>,
}

impl<'a> Protocol<'a> for Acquire<'a> {
    type Held = FairMutexGuard;

    fn lock(&self) -> (&'a Core, &'a LockKeys) {
        (&self.mutex.client, &self.mutex.keys)
    }

    /// The grant channel is subscribed, and confirmed (bounded), before this waiter joins
    /// the queue: no grant can be published before it listens.
    fn channel(&self) -> &'a str {
        self.channel
    }

    /// The queue is on the server: the first attempt never waits in a local one.
    fn defers(&self) -> bool {
        false
    }

    /// One attempt: the first one without queueing, re-entering the thread's live hold (a
    /// re-entry keeps the terms of the acquisition it enters: it never shortens the lease on
    /// the server); a waiter's (`enqueue`) granted, or its place in the queue kept from the
    /// call's send time.
    fn attempt(&mut self, enqueue: bool, by: Deadline) -> Result<Attempt<FairMutexGuard>> {
        let shared = self.mutex.client.shared();
        let live = (!enqueue)
            .then(|| shared.live_hold(&self.mutex.keys))
            .flatten();
        let sent = Instant::now();
        let live_arg = live.as_ref().map(|h| Live {
            acquisition: &h.acquisition,
            extend: h.reentry_extension(sent),
        });
        let (mutex, request) = (self.mutex, &self.request);
        let fixed = mutex.fixed_lease;
        if fixed.is_some() {
            // This call may take a grant to this waiter and start its fixed lease: no
            // heartbeat of its place may extend the lock after it.
            self.place.stop(by.left().unwrap_or(Duration::MAX));
        }
        // The lease of the place in the queue (and of a new acquisition without `fixed`).
        let lease = mutex.client.shared().config.lease;
        let (keys, owner) = (&mutex.keys, &self.owner);
        let call = fair_mutex::acquire(keys, owner, request, lease, enqueue, live_arg, fixed);
        let v = eval_twice(&mutex.client, &call, by)?;
        let reply = calls::acquire_reply(&v, request, &mutex.keys, "fair acquire")?;
        let ttl = match self.take_grant(reply, sent, by) {
            Ok(guard) => return Ok(guard.map_or(Attempt::busy(Duration::ZERO), Attempt::Held)),
            Err(AcquireReply::Busy { ttl }) => ttl,
            Err(_) => Duration::ZERO,
        };
        // Another owner holds the lock, or the server no longer has the live hold's
        // acquisition: that hold is lost, and learns it now rather than at its next renewal
        // (its guards then say so).
        if let Some(h) = &live {
            shared.report_lost(h);
        }
        if enqueue {
            let who = (self.owner.as_str(), self.request.as_str());
            self.place.keep(&self.mutex.keys, who, sent);
        }
        Ok(Attempt::busy(ttl))
    }

    /// A grant message for this waiter, taken while its place is known valid.
    ///
    /// Once the place was made anew, a message no longer says when its grant was made: a
    /// grant published while this process was paused, which ran out unseen (the lock has
    /// another holder by now), may be read only after the new place began, and would look
    /// valid from it. So the server is asked instead: the next attempt finds a lock granted
    /// to this very call, with its lease counted from that attempt, or queues again.
    ///
    /// A waiter with a fixed lease never takes a grant from a message: its next attempt asks
    /// the server, which starts the fixed lease (see [`FairMutex::with_lease`]).
    fn woken(&mut self, reg: &Registration, by: Deadline) -> Option<FairMutexGuard> {
        let token = reg.take_message().and_then(|m| parse_token(&m))?;
        if self.mutex.fixed_lease.is_some() {
            return None;
        }
        if self.place.remade {
            return match self.attempt(true, by) {
                Ok(Attempt::Held(guard)) => Some(guard),
                Ok(Attempt::Busy { .. }) => None,
                Err(e) => {
                    log::debug!("asking for a grant of `{}`: {e}", self.mutex.keys.name);
                    None
                }
            };
        }
        let since = self.place.granted_since()?;
        let grant = AcquireReply::Held {
            token,
            count: 1,
            acquisition: self.request.clone(),
            last: 0,
        };
        self.take_grant(grant, since, by).ok().flatten()
    }

    /// Leaves the queue; a grant that came in the meantime is kept, unless the waiter has a
    /// fixed lease: that grant lasts to the waiter's heartbeat deadline, not for its lease, so
    /// it passes on to the next waiter.
    fn cancel(&mut self, by: Deadline) -> Result<Option<FairMutexGuard>> {
        let since = self.place.granted_since();
        self.place.leave();
        let (mutex, owner, request) = (self.mutex, &self.owner, &self.request);
        let call = fair_mutex::cancel(&mutex.keys, owner, request);
        let v = eval_twice(&mutex.client, &call, by)?;
        let reply = calls::acquire_reply(&v, request, &mutex.keys, "fair cancel")?;
        if mutex.fixed_lease.is_some() {
            if let AcquireReply::Held { acquisition, .. } = reply {
                mutex.give_back(owner, &acquisition, by, "passing on a grant");
            }
            return Ok(None);
        }
        Ok(since.and_then(|since| self.take_grant(reply, since, by).ok().flatten()))
    }
}

impl Acquire<'_> {
    /// The guard of the grant `reply` holds, counted from `since`; the reply itself when it
    /// is no grant. `Ok(None)` when the grant's validity already passed (a very late reply or
    /// message), or it is an acquisition no local hold may use (see [`Shared::adopt_as`](crate::shared::Shared::adopt_as)):
    /// the lock is then given back (to the next waiter).
    fn take_grant(
        &self,
        reply: AcquireReply,
        since: Instant,
        by: Deadline,
    ) -> std::result::Result<Option<FairMutexGuard>, AcquireReply> {
        let (token, count, acquisition) = match reply {
            AcquireReply::Held {
                token,
                count,
                acquisition,
                ..
            } => (token, count, acquisition),
            other => return Err(other),
        };
        let grant = Grant {
            token,
            count,
            sent: since,
            acquisition: &acquisition,
            last: 0,
        };
        let (mutex, owner) = (self.mutex, &self.owner);
        let shared = mutex.client.shared();
        let terms = mutex.client.terms_with(mutex.fixed_lease);
        let Some(hold) = shared.adopt_as(Kind::FairMutex, &mutex.keys, owner.clone(), grant, terms)
        else {
            // Free the acquisition nobody may use, so that the next attempt makes a new one.
            mutex.give_back(owner, &acquisition, by, "freeing a stale grant");
            return Ok(None);
        };
        Ok(unless_late(mutex, hold, "grant", by).map(|h| FairMutexGuard::new(mutex, h)))
    }
}

/// The fencing token in a grant message.
fn parse_token(m: &[u8]) -> Option<u64> {
    std::str::from_utf8(m).ok()?.parse().ok()
}

/// A held [`FairMutex`]. Dropping it releases one level (at the last level the lock is
/// granted to the next waiter); [`unlock`](FairMutexGuard::unlock) does the same and reports
/// errors.
///
/// As with [`MutexGuard`](crate::MutexGuard), the guard is a lease renewed while it lives
/// (unless the lock was made with a fixed lease, see [`FairMutex::with_lease`]);
/// check [`is_held`](FairMutexGuard::is_held) or pass the
/// [`fencing_token`](FairMutexGuard::fencing_token) to the resource before a side effect.
///
/// A guard belongs to the thread that locked (its re-entry and release are that thread's): it
/// is `Sync` but not `Send`, and a hold moves to another thread through `detach` (see
/// [`MutexGuard`](crate::MutexGuard) and [`Detached`](crate::Detached)).
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct FairMutexGuard {
    lease: Lease,
    _thread: ThreadBound,
}

lease_guard! { FairMutexGuard of FairMutex, "lock", token;
    /// Releases this level; at the last level the lock is granted to the first live waiter.
    ///
    /// It asks the server. Returns within the connect timeout plus the command timeout (so
    /// does a drop). A release retried after a failed connection reports `Ok` only where the
    /// server shows that its first attempt released the lock, as
    /// [`MutexGuard::unlock`](crate::MutexGuard::unlock).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the lease had run out (or Redis lost the lock in a restart)
    /// and nobody holds the lock;
    /// [`Error::NotOwner`] when another owner holds it now; [`Error::Redis`] when Redis could
    /// not be asked (the lock then frees itself when its lease runs out).
}

impl FairMutexGuard {
    /// The fencing token of this acquisition (see
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token)): strictly increasing
    /// per lock name across owners, the same for nested guards. It is the server clock at the
    /// grant in microseconds, or, where the name's fencing mark is already that high (the
    /// server clock went back), the highest token issued + 1: tokens rise whatever the server
    /// clock does, and across a loss of the mark (an empty restart) under the conditions
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token) states.
    pub fn fencing_token(&self) -> u64 {
        self.lease.hold().token
    }
}

impl Release for FairMutex {
    /// Releases one level of `hold` within `by` (see `mutex/guard.rs` for the order: renewal
    /// stops first).
    fn release(&self, hold: &Arc<Hold>, by: Deadline) -> Result<()> {
        let script = ("fair release", crate::protocol::mutex::parse_release);
        // The first attempt may have released the last level before its reply was lost (the
        // lock then moved to the release marker, or was granted to the next waiter with a copy
        // there).
        release_level(&self.client, hold, script, &self.keys.lock, by, |level| {
            Some(release_call(&self.keys, hold.holder(), level))
        })
    }
}

/// The release call of `level` of `holder`'s acquisition, under a new request id (a retry
/// of the same call releases nothing twice).
fn release_call(keys: &LockKeys, holder: Who<'_>, level: Level) -> scripts::Call {
    fair_mutex::release(keys, holder, level, &request_id())
}

// A handle is shared across threads by design; a guard is not (see above).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FairMutex>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_messages_parse() {
        assert_eq!(
            parse_token(b"1763781420000001"),
            Some(1_763_781_420_000_001)
        );
        assert_eq!(parse_token(b"x"), None);
    }
}

detachable!(FairMutexGuard);
