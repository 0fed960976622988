//! One model process: a client (through the fault proxy) and a few threads, each running its
//! seeded operation plan (plain mutexes, the fair mutex, the read-write lock, the semaphore)
//! until the run time is over. Every critical section, every timed call
//! and every `on_lease_lost` callback is written to this process's log file (see
//! [`super::log`]); at the end the client is dropped and the process checks that its threads
//! are back to where they were.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{
    Client, Detached, Election, FairMutex, FairMutexGuard, Leadership, MultiGuard, MultiMutex,
    Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore, SemaphorePermit,
};

use crate::check::{Access, Call, CallKind, Outcome, Section};
use crate::checker::mono_ns;
use crate::journal::Journal;
use crate::plan::{Acquire, Handle, Level, Mode, Move, Op, OpPlan, Settings, Target};

thread_local! {
    /// The guards this thread holds (the lock's name and the start of the guard's sections),
    /// outermost first: those a planned panic drops while unwinding are recorded as drop calls
    /// once it is caught.
    static HELD: std::cell::RefCell<Vec<(String, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

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

/// A lock handle of any type.
#[derive(Clone)]
enum Lock {
    Mutex(Mutex),
    Fair(FairMutex),
    Rw(RwLock),
    Sem(Semaphore),
    Multi(MultiMutex),
    Election(Election),
}

impl Lock {
    /// The lock's name; a set's names joined by `+`, for the call log.
    fn name(&self) -> String {
        match self {
            Lock::Mutex(m) => m.name().to_owned(),
            Lock::Fair(m) => m.name().to_owned(),
            Lock::Rw(l) => l.name().to_owned(),
            Lock::Sem(s) => s.name().to_owned(),
            Lock::Multi(m) => m.names().collect::<Vec<_>>().join("+"),
            Lock::Election(e) => e.name().to_owned(),
        }
    }

    /// The handle a level uses.
    fn handle(&self, h: Handle) -> Lock {
        match (self, h) {
            (Lock::Mutex(m), Handle::Lease(d)) => Lock::Mutex(m.with_lease(d).expect("lease")),
            (Lock::Mutex(m), Handle::MaxHold(d)) => {
                Lock::Mutex(m.with_max_hold(d).expect("max hold"))
            }
            (Lock::Rw(l), Handle::ReaderPreference) => Lock::Rw(l.with_reader_preference()),
            _ => self.clone(),
        }
    }
}

/// A guard or permit of any type.
enum Guard {
    Mutex(MutexGuard),
    Fair(FairMutexGuard),
    Read(RwLockReadGuard),
    Write(RwLockWriteGuard),
    Permit(SemaphorePermit),
    Multi(MultiGuard),
    Leader(Leadership),
}

macro_rules! each_guard {
    ($g:expr, $v:ident => $e:expr) => {
        match $g {
            Guard::Leader($v) => $e,
            Guard::Multi($v) => $e,
            Guard::Mutex($v) => $e,
            Guard::Fair($v) => $e,
            Guard::Read($v) => $e,
            Guard::Write($v) => $e,
            Guard::Permit($v) => $e,
        }
    };
}

impl Guard {
    fn is_held(&self) -> bool {
        match self {
            Guard::Leader(l) => l.is_leader(),
            Guard::Multi(g) => g.is_held(),
            Guard::Mutex(g) => g.is_held(),
            Guard::Fair(g) => g.is_held(),
            Guard::Read(g) => g.is_held(),
            Guard::Write(g) => g.is_held(),
            Guard::Permit(g) => g.is_held(),
        }
    }

    fn check(&self) -> locksmith::Result<()> {
        each_guard!(self, g => g.check())
    }

    /// The fencing token; 0 for a type without one (read locks, permits).
    fn token(&self) -> u64 {
        match self {
            Guard::Mutex(g) => g.fencing_token(),
            Guard::Fair(g) => g.fencing_token(),
            Guard::Write(g) => g.fencing_token(),
            Guard::Leader(l) => l.term(),
            Guard::Read(_) | Guard::Permit(_) | Guard::Multi(_) => 0,
        }
    }

    /// The names held and each one's fencing token: one entry, or one per name of a set.
    fn held(&self, name: &str) -> Vec<(String, u64)> {
        match self {
            Guard::Multi(g) => g
                .names()
                .map(|n| (n.to_owned(), g.fencing_token(n).unwrap_or(0)))
                .collect(),
            _ => vec![(name.to_owned(), self.token())],
        }
    }

    fn unlock(self) -> (&'static str, locksmith::Result<()>) {
        match self {
            Guard::Mutex(g) => ("unlock", g.unlock()),
            Guard::Fair(g) => ("unlock", g.unlock()),
            Guard::Read(g) => ("unlock", g.unlock()),
            Guard::Write(g) => ("unlock", g.unlock()),
            Guard::Permit(p) => ("unlock", p.unlock()),
            Guard::Multi(g) => ("unlock", g.unlock()),
            Guard::Leader(l) => ("resign", l.resign()),
        }
    }
}

impl Guard {
    /// Lets this thread go of the hold (`Err`: it cannot move, and is given back).
    #[allow(clippy::result_large_err)] // the guard given back, as the library's `detach`
    fn detach(self) -> Result<Moving, Guard> {
        match self {
            Guard::Mutex(g) => g.detach().map(Moving::Mutex).map_err(Guard::Mutex),
            Guard::Fair(g) => g.detach().map(Moving::Fair).map_err(Guard::Fair),
            Guard::Read(g) => g.detach().map(Moving::Read).map_err(Guard::Read),
            Guard::Write(g) => g.detach().map(Moving::Write).map_err(Guard::Write),
            // A permit is `Send` already: it moves as it is.
            Guard::Permit(p) => Ok(Moving::Permit(p)),
            Guard::Multi(g) => g.detach().map(Moving::Multi).map_err(Guard::Multi),
            // A leadership is `Send` already: it moves as it is, not through `detach`.
            Guard::Leader(l) => Err(Guard::Leader(l)),
        }
    }
}

/// A detached hold of any type, on its way to another thread.
enum Moving {
    Mutex(Detached<MutexGuard>),
    Fair(Detached<FairMutexGuard>),
    Read(Detached<RwLockReadGuard>),
    Write(Detached<RwLockWriteGuard>),
    Permit(SemaphorePermit),
    Multi(Detached<MultiGuard>),
}

impl Moving {
    /// Makes the calling thread the hold's owner.
    fn attach(self) -> locksmith::Result<Guard> {
        Ok(match self {
            Moving::Mutex(d) => Guard::Mutex(d.attach()?),
            Moving::Fair(d) => Guard::Fair(d.attach()?),
            Moving::Read(d) => Guard::Read(d.attach()?),
            Moving::Write(d) => Guard::Write(d.attach()?),
            Moving::Permit(p) => Guard::Permit(p),
            Moving::Multi(d) => Guard::Multi(d.attach()?),
        })
    }

    /// Releases the hold from the calling thread.
    fn unlock(self) -> locksmith::Result<()> {
        match self {
            Moving::Mutex(d) => d.unlock(),
            Moving::Fair(d) => d.unlock(),
            Moving::Read(d) => d.unlock(),
            Moving::Write(d) => d.unlock(),
            Moving::Permit(p) => p.unlock(),
            Moving::Multi(d) => d.unlock(),
        }
    }
}

/// The form of an acquiring call.
#[derive(Clone, Copy)]
enum Form {
    Block,
    Try,
    For(Duration),
    Until(Instant),
}

/// Calls `$l`'s method of the form, naming it.
macro_rules! forms {
    ($form:expr, $wrap:path, $l:expr, $block:ident, $try_:ident, $for_:ident, $until:ident) => {
        match $form {
            Form::Block => (
                stringify!($block).to_string(),
                $l.$block().map(|g| Some($wrap(g))),
            ),
            Form::Try => (
                stringify!($try_).to_string(),
                $l.$try_().map(|o| o.map($wrap)),
            ),
            Form::For(d) => (
                stringify!($for_).to_string(),
                $l.$for_(d).map(|o| o.map($wrap)),
            ),
            Form::Until(t) => (
                stringify!($until).to_string(),
                $l.$until(t).map(|o| o.map($wrap)),
            ),
        }
    };
}

/// One acquiring call of `lock` in `mode` and `form`: the method's name and its result.
fn take(lock: &Lock, mode: Mode, form: Form) -> (String, locksmith::Result<Option<Guard>>) {
    match (lock, mode) {
        (Lock::Mutex(m), _) => forms!(
            form,
            Guard::Mutex,
            m,
            lock,
            try_lock,
            try_lock_for,
            try_lock_until
        ),
        (Lock::Election(e), _) => forms!(
            form,
            Guard::Leader,
            e,
            campaign,
            try_campaign,
            try_campaign_for,
            try_campaign_until
        ),
        (Lock::Multi(m), _) => forms!(
            form,
            Guard::Multi,
            m,
            lock,
            try_lock,
            try_lock_for,
            try_lock_until
        ),
        (Lock::Fair(m), _) => forms!(
            form,
            Guard::Fair,
            m,
            lock,
            try_lock,
            try_lock_for,
            try_lock_until
        ),
        (Lock::Rw(l), Mode::Write) => forms!(
            form,
            Guard::Write,
            l,
            write,
            try_write,
            try_write_for,
            try_write_until
        ),
        (Lock::Rw(l), _) => forms!(
            form,
            Guard::Read,
            l,
            read,
            try_read,
            try_read_for,
            try_read_until
        ),
        (Lock::Sem(s), Mode::Permits(n)) if n > 1 => {
            // `acquire_many` and its timed form; a zero timeout makes exactly one attempt.
            let timed = |d: Duration| s.try_acquire_many_for(n, d).map(|o| o.map(Guard::Permit));
            match form {
                Form::Block => (
                    format!("acquire_many({n})"),
                    s.acquire_many(n).map(|p| Some(Guard::Permit(p))),
                ),
                Form::Try => (
                    format!("try_acquire_many_for({n}, 0)"),
                    timed(Duration::ZERO),
                ),
                Form::For(d) => (format!("try_acquire_many_for({n})"), timed(d)),
                Form::Until(t) => (
                    format!("try_acquire_many_for({n}, until)"),
                    timed(t.saturating_duration_since(Instant::now())),
                ),
            }
        }
        (Lock::Sem(s), _) => forms!(
            form,
            Guard::Permit,
            s,
            acquire,
            try_acquire,
            try_acquire_for,
            try_acquire_until
        ),
    }
}

impl Ctx<'_> {
    /// One command plus one connect timeout: the bound of `try_lock`, `unlock` and drop, and
    /// what `try_lock_for`/`try_lock_until` may take beyond their deadline.
    fn one_round_trip(&self) -> u64 {
        ns(self.settings.command_timeout + self.settings.connect_timeout)
    }

    /// The record of a call that returned now (not of a release: `of` is 0).
    fn call(
        &self,
        kind: CallKind,
        method: &str,
        name: &str,
        start: u64,
        bound: u64,
        outcome: Outcome,
    ) -> Call {
        Call {
            kind,
            method: method.to_string(),
            name: name.to_string(),
            owner: self.owner.clone(),
            proc: self.proc,
            start,
            end: mono_ns(),
            bound,
            outcome,
            of: 0,
        }
    }

    /// Takes `lock` as the level says, logging the call.
    fn acquire(&self, lock: &Lock, mode: Mode, how: Acquire) -> Option<Guard> {
        let start = mono_ns();
        let now = Instant::now();
        let (kind, bound, form) = match how {
            Acquire::Lock => (
                CallKind::Lock,
                ns(self.settings.retry_timeout) + self.one_round_trip(),
                Form::Block,
            ),
            Acquire::TryLock => (CallKind::TryLock, self.one_round_trip(), Form::Try),
            Acquire::TryLockFor(d) => (
                CallKind::TryLockFor,
                ns(d) + self.one_round_trip(),
                Form::For(d),
            ),
            Acquire::TryLockUntil(offset) => {
                let d = Duration::from_millis(offset.unsigned_abs());
                let deadline = if offset >= 0 {
                    now + d
                } else {
                    now.checked_sub(d).unwrap_or(now)
                };
                (
                    CallKind::TryLockUntil,
                    ns(deadline.saturating_duration_since(now)) + self.one_round_trip(),
                    Form::Until(deadline),
                )
            }
        };
        let (method, result) = take(lock, mode, form);
        let (outcome, guard) = match result {
            Ok(Some(g)) => (Outcome::Ok, Some(g)),
            Ok(None) => (Outcome::NotAcquired, None),
            Err(e) => (classify(&e), None),
        };
        self.log
            .call(&self.call(kind, &method, &lock.name(), start, bound, outcome));
        guard
    }

    /// Releases `guard`, whose section(s) began at `of`, logging the call.
    fn release(&self, name: &str, guard: Guard, unlock: bool, of: u64) {
        let start = mono_ns();
        if unlock {
            let (method, result) = guard.unlock();
            let outcome = match result {
                Ok(()) => Outcome::Ok,
                Err(e) => classify(&e),
            };
            self.log.call(&Call {
                of,
                ..self.call(
                    CallKind::Unlock,
                    method,
                    name,
                    start,
                    self.one_round_trip(),
                    outcome,
                )
            });
        } else {
            drop(guard);
            self.log.call(&Call {
                of,
                ..self.call(
                    CallKind::Drop,
                    "drop",
                    name,
                    start,
                    self.one_round_trip(),
                    Outcome::Ok,
                )
            });
        }
    }
}

impl Ctx<'_> {
    /// Moves the hold of `guard` (an outermost level, whose sections `rec` records) to where
    /// `moves` says, and releases it there (`unlock`, or a drop), logging the call.
    fn move_hold(&self, name: &str, guard: Guard, rec: Recorder<'_>, level: &Level, of: u64) {
        let moving = match guard.detach() {
            Ok(m) => m,
            Err(g) => {
                // Not at an outermost level with one guard: cannot happen here.
                drop(rec);
                self.release(name, g, level.unlock, of);
                return;
            }
        };
        match level.moves {
            Move::Stay | Move::DropDetached => {
                drop(rec);
                self.release_moving(name, moving, false, of);
            }
            Move::Release => thread::scope(|s| {
                s.spawn(move || {
                    drop(rec);
                    self.release_moving(name, moving, level.unlock, of);
                });
            }),
            Move::Attach(hold) => thread::scope(|s| {
                s.spawn(move || self.attach_and_release(name, moving, rec, level, hold, of));
            }),
        }
    }

    /// Attaches `moving` on the calling thread, holds it `hold` more (checking now and then),
    /// and releases it.
    fn attach_and_release(
        &self,
        name: &str,
        moving: Moving,
        mut rec: Recorder<'_>,
        level: &Level,
        hold: Duration,
        of: u64,
    ) {
        let start = mono_ns();
        match moving.attach() {
            Ok(guard) => {
                let mut step = 0;
                rec.hold(&guard, hold, &mut step);
                drop(rec);
                self.release(name, guard, level.unlock, of);
            }
            Err(e) => {
                drop(rec);
                self.log.call(&Call {
                    of,
                    ..self.call(CallKind::Unlock, "attach", name, start, 0, classify(&e))
                });
            }
        }
    }

    /// Releases a detached hold from the calling thread: `unlock`, or a drop.
    fn release_moving(&self, name: &str, moving: Moving, unlock: bool, of: u64) {
        let start = mono_ns();
        let (kind, method, outcome) = if unlock {
            let outcome = match moving.unlock() {
                Ok(()) => Outcome::Ok,
                Err(e) => classify(&e),
            };
            (CallKind::Unlock, "detached unlock", outcome)
        } else {
            drop(moving);
            (CallKind::Drop, "detached drop", Outcome::Ok)
        };
        self.log.call(&Call {
            of,
            ..self.call(kind, method, name, start, self.one_round_trip(), outcome)
        });
    }
}

/// A section being recorded. Written to the log when dropped, so that a section left by a
/// panic is recorded too (it is declared after its guard, so it is written before the guard's
/// release runs).
struct Recorder<'a> {
    log: &'a Journal,
    /// One section per name held (several for a set, which is checked as a whole).
    sections: Vec<Section>,
    /// A check already failed: later checks no longer move `end`.
    failed: bool,
}

impl Recorder<'_> {
    /// Checks the guard, alternately by `is_held()` and `check()`.
    fn observe(&mut self, guard: &Guard, by_check: bool) {
        let at = mono_ns();
        let held = if by_check {
            guard.check().is_ok()
        } else {
            guard.is_held()
        };
        if self.failed {
            return;
        }
        for s in &mut self.sections {
            if held {
                s.end = at;
            } else {
                s.told = at;
            }
        }
        self.failed |= !held;
    }

    /// Holds for `d`, checking every few milliseconds.
    fn hold(&mut self, guard: &Guard, d: Duration, step: &mut u64) {
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
        for s in &self.sections {
            self.log.section(s);
        }
    }
}

/// Runs `levels[i..]` on `base`: acquire through this level's handle, hold, the next level,
/// hold again, maybe panic, release.
fn run_level(ctx: &Ctx<'_>, base: &Lock, levels: &[Level], i: usize, step: &mut u64) {
    let level = &levels[i];
    let lock = base.handle(level.handle);
    let call_start = mono_ns();
    let Some(guard) = ctx.acquire(&lock, level.mode, level.acquire) else {
        return;
    };
    let access = match level.mode {
        Mode::Excl if matches!(base, Lock::Fair(_)) => Access::Fair,
        Mode::Excl if matches!(base, Lock::Election(_)) => Access::Lead,
        Mode::Excl => Access::Excl,
        Mode::Read => Access::Read,
        Mode::Write => Access::Write,
        Mode::Permits(n) => Access::Permits {
            n,
            of: ctx.settings.sem_permits,
        },
    };
    let start = mono_ns();
    HELD.with(|h| h.borrow_mut().push((lock.name(), start)));
    let sections = guard
        .held(&lock.name())
        .into_iter()
        .map(|(name, token)| Section {
            name,
            owner: ctx.owner.clone(),
            token,
            call_start,
            start,
            end: 0,
            told: 0,
            depth: i as u32,
            handle: match guard {
                Guard::Multi(_) => "set".to_owned(),
                _ => level.handle.to_string(),
            },
            access,
        })
        .collect();
    let mut rec = Recorder {
        log: ctx.log,
        sections,
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
    HELD.with(|h| h.borrow_mut().pop());
    if i == 0 && level.moves != Move::Stay {
        ctx.move_hold(&lock.name(), guard, rec, level, start);
        return;
    }
    drop(rec);
    ctx.release(&lock.name(), guard, level.unlock, start);
}

/// Runs one operation; a planned panic is caught here (the guards were dropped on the way).
pub fn run_op(ctx: &Ctx<'_>, op: &Op, step: &mut u64) {
    let (client, name) = (ctx.client, ctx.settings.name(op.target));
    let base = match op.target {
        Target::Multi { names, len } => Lock::Multi(
            client
                .multi_lock(names[..len].iter().map(|&i| &ctx.settings.names[i]))
                .expect("valid names"),
        ),
        Target::Mutex(_) => Lock::Mutex(client.mutex(name).expect("valid name")),
        Target::Fair => Lock::Fair(client.fair_mutex(name).expect("valid name")),
        Target::Election => Lock::Election(client.election(name).expect("valid name")),
        Target::Rw => Lock::Rw(client.rw_lock(name).expect("valid name")),
        Target::Sem => Lock::Sem(
            client
                .semaphore(name, ctx.settings.sem_permits)
                .expect("valid semaphore"),
        ),
    };
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        run_level(ctx, &base, &op.levels, 0, step);
    }));
    if let Err(payload) = r {
        if !payload.is::<PlannedPanic>() {
            panic::resume_unwind(payload);
        }
        // The unwinding dropped the guards the thread held: each drop had returned by now.
        let now = mono_ns();
        for (name, of) in HELD.with(|h| std::mem::take(&mut *h.borrow_mut())) {
            ctx.log.call(&Call {
                of,
                ..ctx.call(
                    CallKind::Drop,
                    "drop_in_unwinding",
                    &name,
                    now,
                    0,
                    Outcome::Ok,
                )
            });
        }
    }
    thread::sleep(op.pause);
}

/// Follows the election through the run and past its end, and logs (an `observe` call)
/// whether the last state the observer yielded is the election's state once it settled: a
/// leadership ends when its holder resigns, at the latest a lease after (a stopped holder's
/// lease runs out), and the observer must see each end, or the successor, within a lease.
fn observe_election(
    log: &Journal,
    settings: &Settings,
    client: &Client,
    proc: usize,
    stop_at: Instant,
) {
    let start = mono_ns();
    let lease = settings.max_lease();
    let election = client
        .election(&settings.election_name)
        .expect("valid name");
    let Ok(mut observer) = election.observe() else {
        return;
    };
    let mut last: Option<Option<u64>> = None;
    let mut follow = |until: Instant, last: &mut Option<Option<u64>>| loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        // An error is a fault's (Redis restarted, a connection killed): the next read retries.
        if let Ok(Some(state)) = observer.next_timeout(left) {
            *last = Some(state.map(|l| l.term));
        }
    };
    follow(stop_at + Duration::from_secs(2), &mut last);
    // Every thread's last operation ends (some after a wait of their own) and every lease runs
    // out: then the observer's last state must be the election's, within a lease of each
    // change.
    let give_up = stop_at + lease * 2 + Duration::from_secs(30);
    let outcome = loop {
        let now = match election.leader() {
            Ok(now) => now.map(|l| l.term),
            Err(e) => break classify(&e),
        };
        if last == Some(now) {
            follow(Instant::now() + Duration::from_millis(200), &mut last);
            if last == Some(now) && election.leader().ok().map(|l| l.map(|l| l.term)) == Some(now) {
                break Outcome::Ok;
            }
            continue;
        }
        if Instant::now() >= give_up {
            break Outcome::Unexpected(format!(
                "the observer's last state is {last:?}, the election's {now:?}"
            ));
        }
        follow(Instant::now() + lease + Duration::from_secs(2), &mut last);
        if last != Some(now) && election.leader().ok().map(|l| l.map(|l| l.term)) == Some(now) {
            break Outcome::Unexpected(format!(
                "the observer did not see the election's state {now:?} within a lease: its \
                 last state is {last:?}"
            ));
        }
    };
    let end = mono_ns();
    log.call(&Call {
        kind: CallKind::Observe,
        method: "observe".into(),
        name: settings.election_name.clone(),
        owner: format!("p{proc}observer"),
        proc,
        start,
        end,
        bound: end - start,
        outcome,
        of: 0,
    });
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
        // A cluster client is given every node as a seed, comma-separated.
        let mut builder = if settings.cluster {
            Client::cluster(url.split(','))
        } else if settings.sentinel {
            // `MASTER|URL,URL,...`: the master's name and every sentinel.
            let (master, urls) = url.split_once('|').unwrap();
            Client::sentinel(urls.split(','), master)
        } else {
            Client::builder(url)
        };
        if settings.hot {
            // Sections here last milliseconds: let a run of hand-offs last up to the lease, so
            // that runs are ended by the count bound too, not only by the default 10 ms.
            builder = builder.local_handoff_max_time(settings.lease);
        }
        if let Some(count) = settings.block {
            builder = builder.local_handoff_max_count(count);
        }
        let builder = builder
            .lease(settings.lease_of(proc))
            .command_timeout(settings.command_timeout)
            .connect_timeout(settings.connect_timeout)
            .retry_timeout(settings.retry_timeout)
            .on_lease_lost(move |lost| lost_log.lost(&lost.name, lost.fencing_token, mono_ns()));
        // Starting the client is set-up, not what the run checks: with every process starting
        // at once on a loaded machine, a start-up check can overrun the short timeouts the run
        // uses, so a start that timed out is tried again (for at most 10 s).
        let tried_until = Instant::now() + Duration::from_secs(10);
        let client = loop {
            match builder.clone().build() {
                Err(e) if e.is_timeout() && Instant::now() < tried_until => continue,
                built => break built.expect("client"),
            }
        };
        thread::sleep(begin.saturating_duration_since(Instant::now()));
        thread::scope(|s| {
            if settings.elections {
                let (log, client) = (&*log, &client);
                s.spawn(move || observe_election(log, settings, client, proc, stop_at));
            }
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
