//! One model process: a client (through the fault proxy) and a few threads, each running its
//! seeded operation plan until the run time is over. Every critical section, every timed call
//! and every `on_lease_lost` callback is written to this process's log file (see
//! [`super::log`]); at the end the client is dropped and the process checks that its threads
//! are back to where they were.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Mutex, MutexGuard};

use crate::check::{Call, CallKind, Outcome, Section};
use crate::checker::mono_ns;
use crate::journal::Journal;
use crate::plan::{Acquire, Handle, Level, Op, OpPlan, Settings};

/// The payload of a planned panic, so the panic hook can stay quiet about it.
#[derive(Debug)]
pub struct PlannedPanic;

/// Quiets planned panics; every other panic is reported as usual.
pub fn quiet_planned_panics() {
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !info.payload().is::<PlannedPanic>() {
            default(info);
        }
    }));
}

/// What one thread needs.
pub struct Ctx<'a> {
    pub log: &'a Journal,
    pub settings: &'a Settings,
    pub client: &'a Client,
    pub proc: usize,
    pub owner: String,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How an error counts: allowed under faults, or not.
pub fn classify(e: &locksmith::Error) -> Outcome {
    let msg = e.to_string().replace(['\t', '\n'], " ");
    if e.is_retriable() || e.is_timeout() || e.is_lease_lost() {
        Outcome::Expected(msg)
    } else {
        Outcome::Unexpected(msg)
    }
}

impl Ctx<'_> {
    /// One command plus one connect timeout: the bound of `try_lock`, `unlock` and drop, and
    /// what `try_lock_for`/`try_lock_until` may take beyond their deadline.
    fn one_round_trip(&self) -> u64 {
        ns(self.settings.command_timeout + self.settings.connect_timeout)
    }

    fn call(&self, kind: CallKind, name: &str, start: u64, bound: u64, outcome: Outcome) {
        self.log.call(&Call {
            kind,
            name: name.to_string(),
            owner: self.owner.clone(),
            proc: self.proc,
            start,
            end: mono_ns(),
            bound,
            outcome,
        });
    }

    /// Takes `m` as the level says, logging the call.
    fn acquire<'m>(&self, m: &'m Mutex, how: Acquire) -> Option<MutexGuard<'m>> {
        let start = mono_ns();
        let (kind, bound, result) = match how {
            Acquire::Lock => (
                CallKind::Lock,
                ns(self.settings.retry_timeout) + self.one_round_trip(),
                m.lock().map(Some),
            ),
            Acquire::TryLock => (CallKind::TryLock, self.one_round_trip(), m.try_lock()),
            Acquire::TryLockFor(d) => (
                CallKind::TryLockFor,
                ns(d) + self.one_round_trip(),
                m.try_lock_for(d),
            ),
            Acquire::TryLockUntil(offset) => {
                let now = Instant::now();
                let d = Duration::from_millis(offset.unsigned_abs());
                let deadline = if offset >= 0 {
                    now + d
                } else {
                    now.checked_sub(d).unwrap_or(now)
                };
                (
                    CallKind::TryLockUntil,
                    ns(deadline.saturating_duration_since(now)) + self.one_round_trip(),
                    m.try_lock_until(deadline),
                )
            }
        };
        let (outcome, guard) = match result {
            Ok(Some(g)) => (Outcome::Ok, Some(g)),
            Ok(None) => (Outcome::NotAcquired, None),
            Err(e) => (classify(&e), None),
        };
        self.call(kind, m.name(), start, bound, outcome);
        guard
    }

    fn release(&self, name: &str, guard: MutexGuard<'_>, unlock: bool) {
        let start = mono_ns();
        if unlock {
            let outcome = match guard.unlock() {
                Ok(()) => Outcome::Ok,
                Err(e) => classify(&e),
            };
            self.call(
                CallKind::Unlock,
                name,
                start,
                self.one_round_trip(),
                outcome,
            );
        } else {
            drop(guard);
            self.call(
                CallKind::Drop,
                name,
                start,
                self.one_round_trip(),
                Outcome::Ok,
            );
        }
    }
}

/// A section being recorded. Written to the log when dropped, so that a section left by a
/// panic is recorded too (it is declared after its guard, so it is written before the guard's
/// release runs).
struct Recorder<'a> {
    log: &'a Journal,
    section: Section,
    /// A check already failed: later checks no longer move `end`.
    failed: bool,
}

impl Recorder<'_> {
    /// Checks the guard, alternately by `is_held()` and `check()`.
    fn observe(&mut self, guard: &MutexGuard<'_>, by_check: bool) {
        let at = mono_ns();
        let held = if by_check {
            guard.check().is_ok()
        } else {
            guard.is_held()
        };
        if self.failed {
            return;
        }
        if held {
            self.section.end = at;
        } else {
            self.failed = true;
            self.section.told = at;
        }
    }

    /// Holds for `d`, checking every few milliseconds.
    fn hold(&mut self, guard: &MutexGuard<'_>, d: Duration, step: &mut u64) {
        let until = Instant::now() + d;
        loop {
            *step += 1;
            self.observe(guard, step.is_multiple_of(2));
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            thread::sleep(left.min(Duration::from_millis(2 + *step % 13)));
        }
    }
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        self.log.section(&self.section);
    }
}

fn handle(base: &Mutex, h: Handle) -> Mutex {
    match h {
        Handle::Plain => base.clone(),
        Handle::Lease(d) => base.with_lease(d).expect("valid lease"),
        Handle::MaxHold(d) => base.with_max_hold(d).expect("valid max hold"),
    }
}

/// Runs `levels[i..]` on `base`: acquire through this level's handle, hold, the next level,
/// hold again, maybe panic, release.
fn run_level(ctx: &Ctx<'_>, base: &Mutex, levels: &[Level], i: usize, step: &mut u64) {
    let level = &levels[i];
    let m = handle(base, level.handle);
    let call_start = mono_ns();
    let Some(guard) = ctx.acquire(&m, level.acquire) else {
        return;
    };
    let mut rec = Recorder {
        log: ctx.log,
        section: Section {
            name: m.name().to_string(),
            owner: ctx.owner.clone(),
            token: guard.fencing_token(),
            call_start,
            start: mono_ns(),
            end: 0,
            told: 0,
            depth: i as u32,
            handle: level.handle.to_string(),
        },
        failed: false,
    };
    rec.hold(&guard, level.before, step);
    if i + 1 < levels.len() {
        run_level(ctx, base, levels, i + 1, step);
    }
    rec.hold(&guard, level.after, step);
    if level.panic {
        panic::panic_any(PlannedPanic);
    }
    drop(rec);
    ctx.release(m.name(), guard, level.unlock);
}

/// Runs one operation; a planned panic is caught here (the guards were dropped on the way).
pub fn run_op(ctx: &Ctx<'_>, op: &Op, step: &mut u64) {
    let base = ctx
        .client
        .mutex(&ctx.settings.names[op.name])
        .expect("valid name");
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        run_level(ctx, &base, &op.levels, 0, step);
    }));
    if let Err(payload) = r
        && !payload.is::<PlannedPanic>()
    {
        panic::resume_unwind(payload);
    }
    thread::sleep(op.pause);
}

/// The whole process: build the client, run the threads from `begin` until `stop_at`, drop the client,
/// report the threads left over.
pub fn run_process(
    seed: u64,
    proc: usize,
    settings: &Settings,
    url: &str,
    log_path: PathBuf,
    begin: Instant,
    stop_at: Instant,
) {
    quiet_planned_panics();
    let log = Arc::new(Journal::create(&log_path));
    let threads_before = crate::common::thread_count();
    {
        let lost_log = Arc::clone(&log);
        let mut builder = Client::builder(url);
        if settings.hot {
            // Sections here last milliseconds: let a run of hand-offs last up to the lease, so
            // that runs are ended by the count bound too, not only by the default 10 ms.
            builder = builder.local_handoff_max_time(settings.lease);
        }
        let client = builder
            .lease(settings.lease)
            .command_timeout(settings.command_timeout)
            .connect_timeout(settings.connect_timeout)
            .retry_timeout(settings.retry_timeout)
            .on_lease_lost(move |lost| lost_log.lost(&lost.name, lost.fencing_token, mono_ns()))
            .build()
            .expect("client");
        thread::sleep(begin.saturating_duration_since(Instant::now()));
        thread::scope(|s| {
            for t in 0..settings.threads {
                let (log, client) = (&*log, &client);
                s.spawn(move || {
                    let ctx = Ctx {
                        log,
                        settings,
                        client,
                        proc,
                        owner: format!("p{proc}t{t}"),
                    };
                    let mut step = 0;
                    for op in OpPlan::new(seed, proc, t, settings) {
                        if Instant::now() >= stop_at {
                            break;
                        }
                        run_op(&ctx, &op, &mut step);
                    }
                });
            }
        });
    }
    // The client and its threads are gone once the last clone dropped: wait for the kernel to
    // show it (a joined thread may linger in /proc for a moment).
    let mut after = crate::common::thread_count();
    crate::common::wait_until(Duration::from_secs(3), || {
        after = crate::common::thread_count();
        after <= threads_before
    });
    log.threads(proc, threads_before, after);
    log.flush();
}
