//! What every lock room shares: the client's core, its settings and the record of its holds.
//!
//! Here: the state every lock, guard and thread of the client shares ([`Shared`]: the id, the
//! backend, the subscriber, the renewal inbox, the registry of this client's holds), and
//! [`Core`], which owns the two threads and is what a [`Client`](crate::Client) and every
//! lock handle keep alive. Below it:
//!
//! - [`config`]: the client's settings ([`Config`]);
//! - [`holder`]: owner ids, labels and what an operator sees of a holder;
//! - [`grant`]: one acquisition's request id, lease terms, the server's grant, and what the
//!   client made of it;
//! - [`hold`]: the local record of one held lock (its lease deadline, renewal and state),
//!   shared by its guards and the renewal thread;
//! - [`renewal`]: the `locksmith-renew` thread and its timer wheel, which keep the holds'
//!   leases.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex as PlMutex;

use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::keys::LockKeys;
use crate::stats::Counters;
use crate::subscriber::{Reader, Subscriber};
use crate::topology::backend::Backend;
use crate::transport::conn::Deadline;
use config::Config;
use grant::{Grant, Terms};
use hold::{Chain, Hold, Identity, Renewal};
use renewal::closing::Closing;
use renewal::{Inbox, LostHook};

pub(crate) mod config;
pub(crate) mod grant;
pub(crate) mod hold;
pub(crate) mod holder;
pub(crate) mod renewal;

/// State shared by a client's clones, locks, guards and threads.
#[derive(Debug)]
pub(crate) struct Shared {
    /// This client's random id: the first half of every owner id.
    pub(crate) id: String,
    pub(crate) config: Config,
    pub(crate) backend: Arc<Backend>,
    pub(crate) subscriber: Arc<Subscriber>,
    /// The renewal thread's inbox: holds to renew, released or lost.
    pub(crate) renewals: Arc<Inbox>,
    /// What the client counts (see [`Stats`](crate::Stats)).
    pub(crate) stats: Arc<Counters>,
    /// The holds of this client, by lock key and thread, so that a re-entry finds its hold.
    holds: PlMutex<HashMap<(String, u64), Weak<Hold>>>,
    /// With local hand-off: the acquisition of this client's newest Mutex grant through Redis
    /// on each lock key, until its run of hand-offs ends through Redis. A newer grant of the
    /// name to this client shows that the server no longer has the older acquisition (the
    /// key expired, was deleted, or Redis restarted empty): its run must not hand out another
    /// token (see `locks/mutex/handoff.rs`). Taken after `holds`, never before.
    runs: PlMutex<HashMap<String, String>>,
    /// Set by [`Client::shutdown`](crate::Client::shutdown): no new call goes to Redis, and
    /// guards release nothing (the shutdown released their holds).
    shut_down: AtomicBool,
}

thread_local! {
    /// Holds this thread let go of to other threads: local hand-offs, detached holds (see
    /// [`Shared::owner`]).
    static MOVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A small number that tells the threads of this process apart (`ThreadId` has no stable
/// integer form).
pub(crate) fn thread_seq() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static SEQ: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SEQ.with(|s| *s)
}

impl Shared {
    /// `Err(`[`Error::Shutdown`]`)` once the client was shut down: what every call that would
    /// send something new to Redis checks first.
    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// Whether the client was shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// The owner id of the calling thread for a new acquisition, with the number of holds this
    /// thread let go of to other threads so far when there were any. A thread that handed a
    /// lock on, or detached a hold, keeps its old id on the server while another thread (or
    /// none) holds it there; its own later acquisitions must not pass for that owner (the
    /// acquire script would take the other thread's levels for orphans of its own and replace
    /// them, or count a re-entry on them). So each move gives the thread a new id.
    ///
    /// The id is written once per thread, client and move, and kept for the thread's next
    /// acquisitions: a client's id starts it, and the id (random per client) fixes the label.
    pub(crate) fn owner(&self) -> String {
        thread_local! {
            /// The calling thread's last owner id, and its count of moves when it was written.
            static OWNER: std::cell::RefCell<(u64, String)> =
                const { std::cell::RefCell::new((0, String::new())) };
        }
        let moved = MOVED.with(std::cell::Cell::get);
        OWNER.with_borrow_mut(|(n, owner)| {
            let ours = owner
                .strip_prefix(self.id.as_str())
                .is_some_and(|rest| rest.starts_with(':'));
            if !ours || *n != moved {
                let suffix = holder::owner_suffix(&self.config.label);
                *owner = match moved {
                    0 => format!("{}:{}{suffix}", self.id, thread_seq()),
                    n => format!("{}:{}.{n}{suffix}", self.id, thread_seq()),
                };
                *n = moved;
            }
            owner.clone()
        })
    }

    /// Forgets the calling thread's slot for `hold` (handed to another thread, or detached),
    /// keeping it renewed, and gives the thread a new owner id for its later acquisitions
    /// (see [`owner`](Shared::owner)).
    pub(crate) fn passed_on(&self, hold: &Arc<Hold>) {
        self.leave_slot(hold);
        MOVED.with(|p| p.set(p.get().wrapping_add(1).max(1)));
    }

    /// Records a detached hold attached to the calling thread: its slot, for re-entry. Its
    /// renewal never stopped. `false` (and nothing changed) when the thread holds the lock
    /// through another hold already (a reader of the same lock).
    pub(crate) fn attach(&self, hold: &Arc<Hold>) -> bool {
        let slot = (hold.keys.lock.clone(), thread_seq());
        let mut holds = self.holds.lock();
        if holds
            .get(&slot)
            .and_then(Weak::upgrade)
            .is_some_and(|h| !Arc::ptr_eq(&h, hold) && h.is_held())
        {
            return false;
        }
        holds.insert(slot, Arc::downgrade(hold));
        true
    }

    /// Records a hold handed to the calling thread: its slot for re-entry, and its renewal.
    /// A hold of the thread's own on the same lock that still claims to be valid is lost (the
    /// server names one acquisition only) and is reported.
    ///
    /// Returns false, and records nothing, when this client was granted the lock through
    /// Redis under another acquisition since the run of `hold` began: the server no longer
    /// has the run's acquisition, and the hold is marked lost and reported (as the receiver's
    /// loss, which its renewal would have found). Decided under the lock under which
    /// [`adopt_as`](Shared::adopt_as) records a new grant: either the grant comes first and
    /// this refuses, or this comes first and the grant finds the hold and marks it lost.
    pub(crate) fn adopt_passed(&self, hold: &Arc<Hold>) -> bool {
        let slot = (hold.keys.lock.clone(), thread_seq());
        let mut holds = self.holds.lock();
        if self
            .runs
            .lock()
            .get(&hold.keys.lock)
            .is_some_and(|a| *a != hold.acquisition)
        {
            drop(holds);
            self.report_lost(hold);
            return false;
        }
        let old = holds.insert(slot, Arc::downgrade(hold));
        drop(holds);
        self.stats.acquired_locally(Kind::Mutex, &hold.keys.name);
        if let Some(old) = old.and_then(|w| w.upgrade()) {
            self.report_lost(&old);
        }
        self.renewals.register(hold);
        true
    }

    /// Records a new Mutex acquisition through Redis, `acquisition` on `keys`, as the one
    /// whose run of local hand-offs may go on (with local hand-off only; under `holds`). The
    /// holds of other threads of this client from an older run on the name are lost: the
    /// server granted the name anew, so it no longer has their acquisition. They are marked
    /// lost and reported now, so that none of them says "held" beside the new acquisition or
    /// hands its stale acquisition on with a token below the new one.
    fn new_run(
        &self,
        holds: &HashMap<(String, u64), Weak<Hold>>,
        keys: &LockKeys,
        acquisition: &str,
    ) {
        if self.config.handoff.is_none() {
            return;
        }
        let before = self
            .runs
            .lock()
            .insert(keys.lock.clone(), acquisition.to_owned());
        let Some(before) = before.filter(|b| b != acquisition) else {
            return;
        };
        // Only when a run of this client was still going on the name: rare, so the scan
        // costs nothing on the common path.
        for ((key, _), h) in holds {
            if *key == keys.lock
                && let Some(h) = h.upgrade()
                && h.kind == Kind::Mutex
                && h.acquisition == before
            {
                self.report_lost(&h);
            }
        }
    }

    /// Ends the run of `hold`'s acquisition (its release through Redis): a later grant of the
    /// name starts a run of its own without finding this one.
    pub(crate) fn end_run(&self, hold: &Hold) {
        if self.config.handoff.is_none() || hold.kind != Kind::Mutex {
            return;
        }
        let mut runs = self.runs.lock();
        // Taken out and put back when another run holds the name (rare): one look-up.
        if let Some((lock, run)) = runs.remove_entry(&hold.keys.lock)
            && run != hold.acquisition
        {
            runs.insert(lock, run);
        }
    }

    /// The calling thread's hold on `keys`, if its lease is known valid.
    pub(crate) fn live_hold(&self, keys: &LockKeys) -> Option<Arc<Hold>> {
        self.holds
            .lock()
            .get(&(keys.lock.clone(), thread_seq()))
            .and_then(Weak::upgrade)
            .filter(|h| h.is_held())
    }

    /// A new hold of `kind` on `keys` for `who`, with the lease of `terms` from `sent`:
    /// renewed every renewal interval (until the terms' maximum hold time after `sent`), or,
    /// for a fixed lease, never renewed.
    pub(crate) fn new_hold(
        &self,
        keys: &Arc<LockKeys>,
        (kind, who): (Kind, Identity),
        terms: Terms,
        sent: Instant,
    ) -> Hold {
        let renewal = terms.watchdog.then(|| Renewal {
            every: self.config.renew_every,
            until: terms.max_hold.and_then(|m| sent.checked_add(m)),
        });
        let drift = self.backend.drift(terms.lease);
        Hold::new(Arc::clone(keys), who, terms.lease, drift, renewal, sent).with_kind(kind)
    }

    /// Records a successful acquire of a hold renewed by lock type `kind`'s script: a re-entry
    /// joins the existing hold, a new acquisition gets a new one, registered for renewal
    /// before the caller sees it.
    ///
    /// The server names the acquisition (`grant.gen`). When the thread's hold belongs to
    /// another one, the server no longer has that hold's acquisition (the key expired, was
    /// deleted, or was replaced as an orphan): the hold is marked lost at once, and reported,
    /// so that its guards never say "held" beside the new acquisition.
    ///
    /// Returns the hold the caller holds the lock through (a new one, or its live hold
    /// re-entered); `None` for an unusable grant: the server answered for an acquisition that
    /// this thread's guards already count as lost (its local deadline passed while the call
    /// was on its way), and no guard may be handed out for it. The caller frees it and tries
    /// again.
    pub(crate) fn adopt_as(
        &self,
        kind: Kind,
        keys: &Arc<LockKeys>,
        owner: String,
        grant: Grant<'_>,
        terms: Terms,
    ) -> Option<Arc<Hold>> {
        let slot = (keys.lock.clone(), thread_seq());
        let mut holds = self.holds.lock();
        let existing = holds.get(&slot).and_then(Weak::upgrade);
        if let Some(h) = &existing {
            if h.acquisition == grant.acquisition {
                // A re-entry joins the thread's hold (with a quorum, a master that restarted
                // may have answered with a newer token; the acquisition is still the same).
                // A hold that can no longer be entered must not get a second hold of the same
                // acquisition beside it: its guards would release the new one's levels.
                return h.enter(grant.sent).then(|| Arc::clone(h));
            }
            self.report_lost(h);
        }
        if grant.count > 1 {
            // Levels of an acquisition no local hold knows (its hold is gone): never handed
            // out as a new one.
            return None;
        }
        let who = Identity {
            owner,
            acquisition: grant.acquisition.to_owned(),
            token: grant.token,
        };
        let hold = Arc::new(
            self.new_hold(keys, (kind, who), terms, grant.sent)
                .with_chain(Chain {
                    since: grant.sent,
                    passes: 0,
                    last: grant.last.max(grant.token),
                }),
        );
        if kind == Kind::Mutex {
            self.new_run(&holds, keys, grant.acquisition);
        }
        holds.insert(slot, Arc::downgrade(&hold));
        drop(holds);
        self.renewals.register(&hold);
        Some(hold)
    }

    /// Marks `hold` lost, and reports the loss (the `warn` log and the `on_lease_lost`
    /// callback, on the renewal thread), if it was held until now: each loss is reported
    /// once. A hold whose local deadline has passed is left as it is: a renewed one is
    /// reported by the renewal thread when its renewal is due, and a lease that ended by design
    /// (a fixed lease, the maximum hold time) is not a loss to report.
    pub(crate) fn report_lost(&self, hold: &Arc<Hold>) {
        if hold.is_held() && hold.mark_lost() {
            self.renewals.lost(Arc::clone(hold));
        }
    }

    /// Stops renewing a hold the renewal thread keeps alive that is not a thread's lock level
    /// (such as a waiter's place in a queue), waiting at most `bound` for a
    /// renewal of it on the wire. Returns whether its lease was known valid until then (see
    /// [`Left`](crate::shared::hold::Left)).
    pub(crate) fn unwatch(&self, hold: &Hold, bound: Duration) -> bool {
        let held = hold.leave(bound).held;
        self.renewals.released(hold);
        held
    }

    /// Forgets the calling thread's hold on its lock if it is `hold` (its outermost level was
    /// released), and tells the renewal thread one more released hold sits in its wheel.
    pub(crate) fn forget(&self, hold: &Arc<Hold>) {
        self.leave_slot(hold);
        self.end_run(hold);
        self.renewals.released(hold);
    }

    /// Empties the calling thread's slot for the lock of `hold` if `hold` is in it.
    fn leave_slot(&self, hold: &Arc<Hold>) {
        let slot = (hold.keys.lock.clone(), thread_seq());
        if let Entry::Occupied(e) = self.holds.lock().entry(slot)
            && std::ptr::eq(e.get().as_ptr(), Arc::as_ptr(hold))
        {
            e.remove();
        }
    }
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// The two threads, until they are joined (by a shutdown, or when the last clone goes).
    threads: PlMutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.subscriber.shutdown();
        self.shared.renewals.stop();
        let me = thread::current().id();
        for t in self.threads.get_mut().drain(..) {
            // Never join a thread from itself (it cannot happen today: neither thread holds a
            // client), so a drop can never deadlock.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        self.shared.backend.clear();
    }
}

/// What a [`Client`](crate::Client) is inside, and what every lock handle made from it keeps:
/// the shared state and the client's two threads. Cloning is cheap; the threads stop and are
/// joined when the last clone goes.
#[derive(Clone)]
pub(crate) struct Core {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.inner.shared;
        f.debug_struct("Client")
            .field("lease", &s.config.lease)
            .field("key_prefix", &s.config.prefix)
            .field("subscribed_channels", &s.subscriber.channel_count())
            .finish_non_exhaustive()
    }
}

impl Core {
    /// Starts the client's two threads.
    pub(crate) fn start(
        config: Config,
        backend: Arc<Backend>,
        subscriber: Arc<Subscriber>,
        reader: Reader,
        on_lost: Option<LostHook>,
        stats: Arc<Counters>,
    ) -> Result<Core> {
        let (inbox, renewer) = renewal::renewer(
            Arc::clone(&backend),
            config.renew_every,
            on_lost,
            Arc::clone(&stats),
        );
        let shared = Arc::new(Shared {
            id: uuid::Uuid::new_v4().to_string(),
            config: config.clone(),
            backend: Arc::clone(&backend),
            subscriber: Arc::clone(&subscriber),
            renewals: inbox,
            stats,
            holds: PlMutex::new(HashMap::new()),
            runs: PlMutex::new(HashMap::new()),
            shut_down: AtomicBool::new(false),
        });
        let spawn = |name: &str| thread::Builder::new().name(name.into());
        let sub = Arc::clone(&subscriber);
        let mut threads = Vec::with_capacity(2);
        let started = spawn("locksmith-pubsub")
            .spawn(move || sub.run(reader))
            .and_then(|pubsub| {
                threads.push(pubsub);
                spawn("locksmith-renew").spawn(move || renewer.run())
            });
        match started {
            Ok(renew) => threads.push(renew),
            Err(e) => {
                subscriber.shutdown();
                for t in threads {
                    let _ = t.join();
                }
                return Err(Error::Spawn(e));
            }
        }
        log::debug!("client connected to {} master(s)", backend.masters());
        Ok(Core {
            inner: Arc::new(Inner {
                shared,
                threads: PlMutex::new(threads),
            }),
        })
    }

    /// Shuts the client down (see [`Client::shutdown`](crate::Client::shutdown)): the first
    /// call marks it shut down and has the renewal thread release every hold (the renewed
    /// ones in its wheel, and those of this client's record besides) within `timeout`, and
    /// the pub/sub thread stop; every call then waits, within its own `timeout`, for both
    /// threads to end. Never waits for the calling thread itself (a callback on the renewal
    /// thread that shuts its client down).
    pub(crate) fn shutdown(&self, timeout: Duration) -> Result<()> {
        let by = Deadline::after(timeout);
        let shared = &self.inner.shared;
        if !shared.shut_down.swap(true, Ordering::SeqCst) {
            let holds: Vec<Arc<Hold>> = shared
                .holds
                .lock()
                .values()
                .filter_map(Weak::upgrade)
                .collect();
            shared.renewals.shut_down(Closing { holds, by });
            shared.subscriber.shutdown();
            log::debug!("client shutting down");
        }
        let me = thread::current().id();
        loop {
            {
                let mut threads = self.inner.threads.lock();
                let done = threads.extract_if(.., |t| t.thread().id() != me && t.is_finished());
                done.for_each(|t| {
                    let _ = t.join();
                });
                if threads.iter().all(|t| t.thread().id() == me) {
                    shared.backend.clear();
                    return Ok(());
                }
            }
            if by.passed() {
                return Err(Error::timeout(
                    "the client's threads did not stop within the shutdown timeout",
                ));
            }
            let nap = Duration::from_millis(5);
            thread::sleep(by.left().map_or(nap, |left| left.min(nap)));
        }
    }

    /// The state the client's locks, guards and threads share.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// The terms of a handle with a fixed lease (`fixed`), or the client's own (`None`: its
    /// lease, renewed while held, up to its maximum hold time).
    pub(crate) fn terms_with(&self, fixed: Option<Duration>) -> Terms {
        let config = &self.shared().config;
        Terms {
            lease: fixed.unwrap_or(config.lease),
            watchdog: fixed.is_none(),
            max_hold: config.max_hold,
        }
    }
}
