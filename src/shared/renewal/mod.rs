//! The renewal thread: one per client, extending every held lease in pipelined batches.
//!
//! Guards taken without a fixed lease are registered here before `lock()` returns. The thread
//! keeps them in a [`Wheel`] keyed by their next renewal time (the send time of their last
//! successful renewal plus the renewal interval), sleeps until the earliest one is due or a
//! new registration arrives, and then sends every renewal due within a coalescing window (a
//! fifth of the renewal interval, at most 400 ms) as one pipeline on its own connection.
//! Renewals sent together are due together from then on, so holds taken at different times
//! settle into a few batches per interval (each hold renewed early, by less than the window,
//! once: when it joins a batch). Few large batches cost Redis less per lease than many small
//! ones (Redis pays for every burst of work after an idle stretch; `cargo bench --bench locks
//! -- --only renewal` measures the Redis CPU per renewed lock). The pipeline holds few script
//! calls, each renewing up to [`batch::MAX_PER_CALL`] leases (grouped by [`batch::group`]), so
//! Redis runs one script per call, not one per lease; each lease still gets its own outcome
//! (extended, lost, unknown), and a loss is reported once, by this thread.
//!
//! Cancellation is lazy: a released hold stays in the wheel until it is due and is then
//! dropped, because [`Hold::begin_renewal`] refuses it. A release waits for a renewal of its
//! hold that is on the wire, so no renewal reaches Redis after the release script.
//!
//! The batch goes to every master at once (see `topology/backend/`) and takes at most half the
//! renewal interval: a try on a pooled connection for at most a quarter of the interval (or
//! the command timeout if shorter), then, where that connection failed or stayed silent, a
//! try on a new connection in what is left. So one dead connection (a NAT that dropped it)
//! does not cost the leases of the batch, and the thread is never blocked for longer than
//! that, whatever the command timeout.

mod batch;
mod clock_watch;
pub(crate) mod closing;
mod wheel;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::kind::Kind;
use crate::protocol::{fair_mutex, mutex, rw_lock, semaphore};
use crate::shared::hold::{Begin, Hold, Status};
use crate::stats::Counters;
use crate::topology::backend::{Backend, Refusal};
use clock_watch::ClockWatch;
use closing::Closing;
use wheel::Wheel;

/// The target of the renewal thread's log lines: the one "Log levels" in the crate docs lists,
/// which operators filter on (the module path would say where the file sits instead).
const LOG_TARGET: &str = "locksmith::renewal";

/// Why a lease that ran out unrenewed was lost, in the `warn` line that reports it.
const UNRENEWED: &str = concat!(
    "its lease ran out before a renewal succeeded ",
    "(Redis unreachable or slow, or this process paused)"
);

/// Why a lease was lost while the server refused its renewals for a permission.
const REFUSED: &str = "the server refused its renewal for a permission (see the `error` line)";

/// A lease that was lost while its guard still existed, as told to the
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) callback.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LostLease {
    /// The lock's name.
    pub name: String,
    /// The fencing token of the lost acquisition (`0` for a read lease or permits, which
    /// have none).
    pub fencing_token: u64,
    /// What kind of lease it was: with [`name`](LostLease::name), it tells a reader's lease
    /// from the writer's of one [`RwLock`](crate::RwLock), or a
    /// [`Semaphore`](crate::Semaphore)'s permits from a mutex of the same name.
    pub kind: LeaseKind,
}

/// The kind of a lost lease: which lock type held it, and as what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// A [`Mutex`](crate::Mutex)'s lock (on one master or a quorum).
    Mutex,
    /// A [`FairMutex`](crate::FairMutex)'s lock.
    FairMutex,
    /// A reader's lease of an [`RwLock`](crate::RwLock).
    Read,
    /// The writer's lease of an [`RwLock`](crate::RwLock).
    Write,
    /// The permits of one [`Semaphore`](crate::Semaphore) acquisition.
    Permits,
    /// The leadership of an [`Election`](crate::Election).
    Leadership,
}

/// The application's callback for lost leases.
#[derive(Clone)]
pub(crate) struct LostHook(pub(crate) Arc<dyn Fn(&LostLease) + Send + Sync>);

impl std::fmt::Debug for LostHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LostHook")
    }
}

/// A message to the renewal thread.
#[derive(Debug)]
enum Msg {
    /// New holds are due before the thread's next wake-up.
    Wake,
    /// Stop the thread.
    Stop,
    /// The client shuts down: end and release every hold, then stop.
    Shutdown(Closing),
}

/// Where holds are registered for renewal.
///
/// Registering does not wake the thread unless the new hold's first renewal is due before
/// the thread would wake up anyway, so an acquisition (on the hot path of a handoff) costs no
/// thread wake-up. The thread publishes when it will next wake (`wake_at`) *before* it
/// drains the inbox for the last time ahead of sleeping; a registrar pushes *before* it reads
/// `wake_at`. So either the thread's drain sees the new hold, or the registrar sees the
/// thread's `wake_at` and wakes it if that is too late: no registration is missed.
#[derive(Debug)]
pub(crate) struct Inbox {
    epoch: Instant,
    holds: Mutex<Vec<Arc<Hold>>>,
    /// The tick at which the thread wakes by itself; `u64::MAX`: only when told.
    wake_at: AtomicU64,
    /// Holds released since the thread last looked: they sit in the wheel until their slot
    /// fires, so the thread compacts the wheel when they pile up.
    released: AtomicUsize,
    /// Holds that a lock call found lost (already marked so), to be reported by the thread.
    lost: Mutex<Vec<Arc<Hold>>>,
    /// The holds of a client that no renewal keeps (fixed leases), weakly: what a shutdown
    /// releases besides the renewed ones, whichever thread holds them (a detached hold, a
    /// permit moved to another thread). Holds that ended are dropped from the list each time
    /// it is full (from 64 on), and room is made for as many as are left: memory follows the
    /// holds alive, and a sweep costs no more per hold than a push.
    unrenewed: Mutex<Vec<Weak<Hold>>>,
    tx: Sender<Msg>,
}

impl Inbox {
    /// The renewal thread's tick of `t`: milliseconds since the inbox was made.
    fn tick(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts renewing `hold`; a fixed lease is only noted, for a shutdown to release.
    pub(crate) fn register(&self, hold: &Arc<Hold>) {
        let Some(at) = hold.next_renewal() else {
            if hold.renewal.is_none() {
                let mut fixed = self.unrenewed.lock();
                if fixed.len() >= 64 && fixed.len() == fixed.capacity() {
                    fixed.retain(|w| w.upgrade().is_some_and(|h| h.is_held()));
                    // The next sweep after as many pushes as holds are left, at the least.
                    let left = fixed.len();
                    fixed.reserve(left);
                }
                fixed.push(Arc::downgrade(hold));
            }
            return;
        };
        let due = self.tick(at);
        self.holds.lock().push(Arc::clone(hold));
        if due < self.wake_at.load(Ordering::SeqCst) {
            // The thread lives as long as the client; a send can only fail during its drop.
            let _ = self.tx.send(Msg::Wake);
        }
    }

    /// Notes that `hold` was released (no wake-up); nothing for a fixed lease, which was
    /// never registered.
    pub(crate) fn released(&self, hold: &Hold) {
        if hold.renewal.is_some() {
            self.released.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Has the thread report a hold that another thread just marked lost (the `warn` log and
    /// the `on_lease_lost` callback run on the renewal thread, as for the losses it finds).
    pub(crate) fn lost(&self, hold: Arc<Hold>) {
        self.lost.lock().push(hold);
        let _ = self.tx.send(Msg::Wake);
    }

    /// Stops the thread.
    pub(crate) fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
    }

    /// Has the thread end and release every hold it renews, every fixed-lease hold still
    /// alive, and `closing.holds` besides, within `closing.by`, then stop.
    pub(crate) fn shut_down(&self, mut closing: Closing) {
        let fixed = std::mem::take(&mut *self.unrenewed.lock());
        closing.holds.extend(fixed.iter().filter_map(Weak::upgrade));
        let _ = self.tx.send(Msg::Shutdown(closing));
    }
}

/// Creates the inbox and the renewal thread's state.
pub(crate) fn renewer(
    backend: Arc<Backend>,
    renew_every: Duration,
    on_lost: Option<LostHook>,
    stats: Arc<Counters>,
) -> (Arc<Inbox>, Renewer) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let inbox = Arc::new(Inbox {
        epoch: Instant::now(),
        holds: Mutex::new(Vec::new()),
        wake_at: AtomicU64::new(u64::MAX),
        released: AtomicUsize::new(0),
        lost: Mutex::new(Vec::new()),
        unrenewed: Mutex::new(Vec::new()),
        tx,
    });
    let renewer = Renewer {
        backend,
        rx,
        inbox: Arc::clone(&inbox),
        // Under the retry delay, so a retry is never pulled forward to just after its failure.
        coalesce: (renew_every / 5).min(Duration::from_millis(400)),
        retry: (renew_every / 4).clamp(Duration::from_millis(5), Duration::from_millis(500)),
        timeout: renew_every / 2,
        wheel: Wheel::new(),
        stale: 0,
        on_lost,
        stats,
        clocks: ClockWatch::default(),
        refusal_logged: false,
        refusing: false,
    };
    (inbox, renewer)
}

/// The renewal thread's state.
pub(crate) struct Renewer {
    backend: Arc<Backend>,
    rx: Receiver<Msg>,
    inbox: Arc<Inbox>,
    /// Renewals due this much apart share a batch (sent early by at most this much).
    coalesce: Duration,
    /// Delay before retrying a renewal that failed for a transient reason.
    retry: Duration,
    /// The bound on a batch's I/O, retry on a new connection included.
    timeout: Duration,
    wheel: Wheel<Arc<Hold>>,
    /// Released holds still in the wheel (an estimate: some have fired since).
    stale: usize,
    on_lost: Option<LostHook>,
    stats: Arc<Counters>,
    /// Each master's last clock reading, to see its wall clock step.
    clocks: ClockWatch,
    /// Whether a renewal refused for a permission was logged at `error` (once per client).
    refusal_logged: bool,
    /// Whether the last batch with an answer met a refusal for a permission.
    refusing: bool,
}

impl std::fmt::Debug for Renewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewer")
            .field("scheduled", &self.wheel.len())
            .finish_non_exhaustive()
    }
}

impl Renewer {
    /// Puts `hold` in the wheel for `at`, or for its next renewal (none: it is dropped).
    fn schedule(&mut self, hold: Arc<Hold>, at: Option<Instant>) {
        if let Some(at) = at.or_else(|| hold.next_renewal()) {
            // Round up, so a renewal is never sent before its due time minus the coalescing
            // window.
            let tick = self.inbox.tick(at).saturating_add(1);
            self.wheel.insert(tick, hold);
        }
    }

    /// Moves the inbox into the wheel and publishes the next wake-up, until the inbox stays
    /// empty after the publication (see [`Inbox`]). Returns the next wake-up tick.
    fn drain(&mut self) -> Option<u64> {
        loop {
            let next = self.wheel.next_deadline();
            self.inbox
                .wake_at
                .store(next.unwrap_or(u64::MAX), Ordering::SeqCst);
            let new = std::mem::take(&mut *self.inbox.holds.lock());
            if new.is_empty() {
                return next;
            }
            for h in new {
                self.schedule(h, None);
            }
        }
    }

    /// Reports the holds that lock calls found lost.
    fn report_found_lost(&mut self) {
        let found = std::mem::take(&mut *self.inbox.lost.lock());
        for hold in found {
            self.lost(&hold, "the key expired, was deleted, or has another owner");
        }
    }

    /// Rebuilds the wheel without released holds once they outnumber the live ones (and
    /// 1,024), so memory follows the locks held, not the locks taken during the last
    /// renewal interval. A hold whose lease ran out while it waited in the wheel is lost:
    /// it is reported as its renewal would have reported it.
    fn compact_if_stale(&mut self) {
        self.stale += self.inbox.released.swap(0, Ordering::Relaxed);
        if self.stale < 1024 || self.stale < self.wheel.len() / 2 {
            return;
        }
        let mut all = Vec::with_capacity(self.wheel.len());
        self.wheel.poll(u64::MAX, &mut all);
        self.wheel = Wheel::new();
        self.stale = 0;
        for hold in all {
            if hold.is_held() {
                self.schedule(hold, None);
            } else if hold.mark_lost() {
                self.lost(&hold, self.unrenewed());
            }
        }
        let n = self.wheel.len();
        log::trace!(target: LOG_TARGET, "renewal wheel compacted to {n} leases");
    }

    /// The thread's body.
    pub(crate) fn run(mut self) {
        let mut due = Vec::new();
        let closing = loop {
            let msg = match self.drain() {
                Some(tick) => {
                    let at = self.inbox.epoch + Duration::from_millis(tick);
                    self.rx
                        .recv_timeout(at.saturating_duration_since(Instant::now()))
                }
                None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let first = match msg {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(Msg::Stop),
            };
            let stop = first
                .into_iter()
                .chain(self.rx.try_iter())
                .find_map(|m| match m {
                    Msg::Wake => None,
                    Msg::Stop => Some(None),
                    Msg::Shutdown(c) => Some(Some(c)),
                });
            if let Some(closing) = stop {
                break closing;
            }
            self.drain();
            self.report_found_lost();
            self.compact_if_stale();
            let now = self.inbox.tick(Instant::now() + self.coalesce);
            self.wheel.poll(now, &mut due);
            if !due.is_empty() {
                self.renew(&mut due);
            }
        };
        // Losses found by lock calls just before the client was dropped are still reported.
        self.report_found_lost();
        if let Some(Closing { mut holds, by }) = closing {
            self.drain();
            self.wheel.poll(u64::MAX, &mut holds);
            let n = closing::release_all(&self.backend, holds, by);
            log::debug!(target: LOG_TARGET, "shutdown: released {n} held lock(s)");
        }
        log::debug!(target: LOG_TARGET, "renewal thread stopped");
    }

    /// Renews a batch in one pipelined round trip and reschedules what is still held.
    fn renew(&mut self, due: &mut Vec<Arc<Hold>>) {
        let mut batch = Vec::with_capacity(due.len());
        for hold in due.drain(..) {
            match hold.begin_renewal() {
                Begin::Send => batch.push(hold),
                Begin::Expired => self.lost(&hold, self.unrenewed()),
                Begin::Skip => {}
            }
        }
        if batch.is_empty() {
            return;
        }
        let sent = Instant::now();
        let (outcomes, refused) = self.send(&batch);
        if refused {
            self.refusing = true;
        } else if outcomes.iter().any(Option::is_some) {
            self.refusing = false;
        }
        for (hold, outcome) in batch.into_iter().zip(outcomes) {
            if hold.kind.is_lease() {
                self.stats
                    .renewal(hold.kind, &hold.keys.name, outcome == Some(true));
            }
            match hold.end_renewal(sent, outcome) {
                Some(Status::Valid) => match hold.next_renewal() {
                    Some(at) => self.schedule(hold, Some(at)),
                    None => log::info!(
                        target: LOG_TARGET,
                        "lock `{}` reached its maximum hold time; renewal stopped",
                        hold.keys.name
                    ),
                },
                Some(Status::Uncertain) => self.schedule(hold, Some(Instant::now() + self.retry)),
                Some(Status::Lost) => self.lost(
                    &hold,
                    if outcome == Some(false) {
                        "the key expired, was deleted, or has another owner"
                    } else if self.refusing {
                        REFUSED
                    } else {
                        "Redis could not be reached before the lease ran out"
                    },
                ),
                // Released, or marked lost (and reported) by its owner's thread meanwhile.
                Some(Status::Released) | None => {}
            }
        }
    }

    /// Why a lease ran out unrenewed: the server's refusal while the last answered batch met
    /// one, else no renewal in time.
    fn unrenewed(&self) -> &'static str {
        if self.refusing { REFUSED } else { UNRENEWED }
    }

    /// Reports a lost lease: a warning, and the application's callback.
    fn lost(&self, hold: &Hold, why: &str) {
        if hold.kind == Kind::FairPlace {
            // A waiter's place in a queue, not a lease: the waiter finds out at its next
            // attempt and queues again.
            let name = &hold.keys.name;
            log::debug!(target: LOG_TARGET, "a waiter's place for `{name}` lapsed: {why}");
            return;
        }
        log::warn!(target: LOG_TARGET, "lease of lock `{}` lost: {why}", hold.keys.name);
        if hold.kind.is_lease() {
            self.stats.lease_lost(hold.kind, &hold.keys.name);
        }
        if let Some(hook) = &self.on_lost {
            let kind = match hold.kind {
                Kind::Mutex | Kind::MultiMutex => LeaseKind::Mutex,
                Kind::Election => LeaseKind::Leadership,
                Kind::FairMutex | Kind::FairPlace => LeaseKind::FairMutex,
                Kind::Read => LeaseKind::Read,
                Kind::Write => LeaseKind::Write,
                Kind::Permits => LeaseKind::Permits,
            };
            let lost = LostLease {
                name: hold.keys.name.clone(),
                fencing_token: hold.token,
                kind,
            };
            // A panicking callback must not take the renewal thread down with it.
            let call = std::panic::AssertUnwindSafe(|| (hook.0)(&lost));
            if std::panic::catch_unwind(call).is_err() {
                log::error!(target: LOG_TARGET, "the on_lease_lost callback panicked");
            }
        }
    }

    /// Sends the renewals, many leases to a script call (see [`batch`]); one outcome per hold,
    /// in the order of `batch` (`None` where it is unknown), and whether the server refused a
    /// call for a permission.
    fn send(&mut self, batch: &[Arc<Hold>]) -> (Vec<Option<bool>>, bool) {
        // Mutex leases share calls of the batch script; other lock types' holds keep their
        // own renew script, one call each, sent after them.
        let mut mutexes = Vec::new();
        let mut own = Vec::new();
        for (i, h) in batch.iter().enumerate() {
            let (keys, holder, lease) = (&h.keys, h.holder(), h.lease);
            let call = match h.kind {
                Kind::Mutex | Kind::MultiMutex | Kind::Election => {
                    mutexes.push(i);
                    continue;
                }
                Kind::FairMutex | Kind::FairPlace => fair_mutex::renew(keys, holder, lease),
                Kind::Permits => semaphore::renew(keys, holder, lease),
                Kind::Read | Kind::Write => {
                    rw_lock::renew(keys, holder, lease, h.kind == Kind::Read)
                }
            };
            own.push((call, i));
        }
        // By lease: a call sends each lease once per run of leases that share it.
        mutexes.sort_by_key(|&i| batch[i].lease);
        let slots: Vec<u16> = mutexes.iter().map(|&i| batch[i].keys.slot).collect();
        // The calls, and the batch's holds in the calls' order.
        let mut calls = Vec::new();
        let mut order = Vec::with_capacity(batch.len());
        // On a cluster a call covers one slot; elsewhere leases of any slots share a call.
        for group in batch::group(&slots, self.backend.spreads_slots(), batch::MAX_PER_CALL) {
            let start = order.len();
            order.extend(group.into_iter().map(|k| mutexes[k]));
            let leases: Vec<_> = order[start..]
                .iter()
                .map(|&i| mutex::Renewing {
                    keys: &batch[i].keys,
                    acquisition: &batch[i].acquisition,
                    lease: batch[i].lease,
                    token: self.backend.fence(batch[i].token),
                })
                .collect();
            calls.push((mutex::renew_many(&leases), leases.len()));
        }
        for (call, i) in own {
            calls.push((call, 1));
            order.push(i);
        }
        let renewed = self.backend.renew(&calls, self.timeout);
        let now = Instant::now();
        for (master, us) in &renewed.clocks {
            if let Some(jump) = self.clocks.observe(master, now, *us) {
                log::warn!(target: LOG_TARGET, "{}", jump.describe(master));
                self.stats.clock_jumped();
            }
        }
        if let Some(refusal) = &renewed.refused {
            self.refused(refusal);
        }
        log::trace!(
            target: LOG_TARGET,
            "renewed a batch of {} leases in {} script calls",
            batch.len(),
            calls.len()
        );
        // Back from the calls' order to the batch's.
        let mut outcomes = vec![None; batch.len()];
        for (i, outcome) in order.into_iter().zip(renewed.outcomes) {
            outcomes[i] = outcome;
        }
        (outcomes, renewed.refused.is_some())
    }

    /// Reports a renewal that the server refused for a missing permission: at `error`, once
    /// per client (then at `debug`), naming the command when the server does and the rule to
    /// add. Not a lost race: the leases of that call run out unrenewed.
    fn refused(&mut self, refusal: &Refusal) {
        if self.refusal_logged {
            log::debug!(
                target: LOG_TARGET,
                "renewal refused by {} for a permission: {}",
                refusal.server,
                refusal.message
            );
            return;
        }
        self.refusal_logged = true;
        let add = match &refusal.command {
            Some(cmd) => format!("add `+{cmd}` to the ACL user's rule"),
            None => "the server does not name the command; the renewal scripts call `GET`, \
                     `SET`, `PEXPIRE` and `PEXPIREAT` (the lock types' own scripts more): give \
                     the ACL user the rule of docs/deployments.md"
                .to_owned(),
        };
        log::error!(
            target: LOG_TARGET,
            "renewal refused by {} for a permission ({}): {add}, and check it with \
             `ACL DRYRUN`; the leases it would have renewed will be lost",
            refusal.server,
            refusal.message
        );
    }
}
