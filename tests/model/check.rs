//! The records of a model run and the checker that judges them. Pure logic: no clock, no I/O,
//! so the unit tests below can plant every kind of violation and see it found.
//!
//! # What a section proves
//!
//! A section is one guard's life as its thread saw it. `start` is stamped right after the
//! acquiring call returned; then the thread checks the guard (`is_held()` or `check()`) now and
//! then, stamping the time right *before* each check; `end` is the stamp of the last check that
//! passed before the first one that failed. The library promises that a guard reports itself
//! held only while its lease is valid on the server (the local deadline is never later than
//! the server's expiry), and the grant came before the call returned. So if that promise holds,
//! the lock was this owner's on the server throughout `[start, end]`.
//!
//! From that, two findings are certain and never a matter of timing:
//!
//! - **Overlap**: two acquisitions of one name by different owners whose `[start, end]`
//!   windows intersect were both held at one moment, unless the earlier one had been told of
//!   its loss (`on_lease_lost`) before the later one began, or Redis restarted empty in between
//!   (a documented loss of every lock; for a mutex acquisition handed off locally, since the
//!   call that began its run: a run that outlived a restart is the stale holder's), or a forced
//!   unlock removed the one (see below).
//! - **Token order**: if `X.end < Y.start` then X was granted before Y (or the two overlapped,
//!   which is a violation anyway), so `X.token < Y.token` must hold, across restarts of Redis
//!   too, unless Y's own acquiring call spanned a restart (Y may then have been granted by the
//!   server that was lost, before X), or Y was handed off locally in a run that began before
//!   a restart (the stale holder's tokens, which the resource refuses).
//!
//! The other lock types are judged the same way, each by what it promises:
//!
//! - **Fair mutex**: as a mutex (exclusion, tokens in grant order).
//! - **Read-write lock**: a write section is judged as a mutex's against every other write
//!   section (exclusion, tokens); a read section of one owner must not intersect a write
//!   section of another, unless the one that began first had been told of its loss before the
//!   other began (a write lease by `on_lease_lost`; a read lease has no token to be told
//!   about, so only its own checks count) or Redis restarted empty in between. Readers may
//!   overlap each other, and a writer its own read levels.
//! - **Semaphore**: at the start of every section, the permits of the sections whose windows
//!   contain that moment (that one included) must fit in the count, leaving out those lost
//!   in a restart in between. Each section is one acquisition (permits are not reentrant).
//!
//! Sections are judged per lock, a name and a type. A `MultiMutex` set holds each of its
//! names as a mutex (the same keys): its guard is recorded as one section per name, each
//! judged with that name's mutex sections.
//!
//! # A forced unlock
//!
//! The fault plan may call `force_unlock` on one lock (a name and a type): the fault's window
//! is the call, from its start to its return, so the lock was freed on the server at some
//! moment within it. The library frees it whoever holds it, and the holder it removed finds
//! out at its next renewal at the latest. So a forced unlock excuses the overlap with the
//! holder it removed, and nothing else (one that returned `false` found nobody holding, and
//! excuses nothing):
//!
//! - **Who it may have removed**: an acquisition of that name and type whose acquiring call
//!   began before the force returned (it may have been granted before the force ran, however
//!   late its call returned); and a mutex acquisition handed off locally from one (another
//!   thread of the same process with the next token: it continues the same acquisition on
//!   the server, with the same lease).
//! - **What is excused**: its overlap with an acquisition whose call returned after the
//!   force began (which may have been granted after it), between holders of one lock as
//!   between a reader and a writer. Only while it stopped reporting itself held within one
//!   lease of the force's return: its last renewal that the force did not make fail was sent
//!   before the force returned and set its local deadline; a holder that believed longer is
//!   not excused. Two acquisitions granted after the force are judged as ever. For a
//!   semaphore, at the start of a section that began after the force began, the permits of
//!   the sections it may have removed (that one's too) do not count; the others do.
//! - **Tokens keep rising** across a forced unlock. X's token came before Y's for certain when
//!   X's call returned before Y's token could be allocated (Y's call began, or for a hand-off
//!   the call of the acquisition it continues), overlapping or not; or, as ever, when X ended
//!   before Y began, unless Y may have been removed by a force that X may have been granted
//!   after (Y was granted first, and its call returned late).
//! - **Releases**: the removed holder's `unlock()` reports the loss (`LeaseLost` or
//!   `NotOwner`, allowed errors). An `unlock()` that began after the force returned, of an
//!   acquisition granted before the force began, must not report `Ok` (the release calls
//!   name the guard they released by its sections' start); except at a read-write lock's
//!   inner level (counted locally, it does not ask the server) and at a mutex's outermost
//!   level while another thread of its process was taking that mutex (the lock may have
//!   passed to it locally, without asking the server: a set never does). A release that
//!   returned before the force began is fine; one that ran while it did cannot be judged.
//!
//! Calls are judged against their documented bound plus a slack, minus the time the calling
//! process spent stopped (`SIGSTOP`) by the fault plan. An `on_lease_lost` callback comes at
//! most once per acquisition (a forced unlock's `force_unlock` call is judged by its bound
//! too). Errors other than timeouts, connection failures and lost leases are findings, and so is any thread, connection, channel or lock key left over at the end.

use std::collections::HashMap;
use std::fmt;

use locksmith::LockKind;

/// One guard's critical section (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    /// `p<process>t<thread>`: one thread of one client, the library's unit of ownership (the
    /// part before the `t` names the process: a lock handed off locally stays in it).
    pub owner: String,
    pub token: u64,
    /// Stamped right before the acquiring call.
    pub call_start: u64,
    /// Stamped right after the acquiring call returned.
    pub start: u64,
    /// The stamp of the last passing check; 0 when the first check already failed.
    pub end: u64,
    /// The stamp of the first failing check; 0 when none failed.
    pub told: u64,
    /// Re-entry depth (0: outermost) and the handle used, for messages.
    pub depth: u32,
    pub handle: String,
    /// What the section held.
    pub access: Access,
}

/// What a section held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A mutex's lock (alone, or one name of a `MultiMutex` set: a set holds each of its
    /// names as a mutex).
    Excl,
    /// A fair mutex's lock.
    Fair,
    /// A read lock of a read-write lock.
    Read,
    /// The write lock of a read-write lock.
    Write,
    /// `n` permits of a semaphore of `of` permits.
    Permits { n: u32, of: u32 },
    /// The leadership of an election (its token is the term).
    Lead,
}

impl Access {
    pub fn as_string(self) -> String {
        match self {
            Access::Excl => "x".into(),
            Access::Fair => "f".into(),
            Access::Read => "r".into(),
            Access::Write => "w".into(),
            Access::Permits { n, of } => format!("p{n}/{of}"),
            Access::Lead => "l".into(),
        }
    }

    pub fn parse(s: &str) -> Option<Access> {
        Some(match s {
            "x" => Access::Excl,
            "f" => Access::Fair,
            "r" => Access::Read,
            "w" => Access::Write,
            "l" => Access::Lead,
            _ => {
                let (n, of) = s.strip_prefix('p')?.split_once('/')?;
                Access::Permits {
                    n: n.parse().ok()?,
                    of: of.parse().ok()?,
                }
            }
        })
    }

    /// Held by one owner at a time (a token, re-entry grouped by it).
    fn exclusive(self) -> bool {
        matches!(
            self,
            Access::Excl | Access::Fair | Access::Write | Access::Lead
        )
    }

    /// The type of lock held.
    pub fn kind(self) -> LockKind {
        match self {
            Access::Excl => LockKind::Mutex,
            Access::Fair => LockKind::FairMutex,
            Access::Read | Access::Write => LockKind::RwLock,
            Access::Permits { .. } => LockKind::Semaphore,
            Access::Lead => LockKind::Election,
        }
    }
}

/// What a call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// `Ok(None)` of a `try_*` form.
    NotAcquired,
    /// An error the documentation allows under faults: timeout, connection-level, lease lost.
    Expected(String),
    /// Any other error.
    Unexpected(String),
}

/// The kinds of timed calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Lock,
    TryLock,
    TryLockFor,
    TryLockUntil,
    Unlock,
    Drop,
    /// `Client::force_unlock`, by the fault plan (see [`FaultKind::ForcedUnlock`]).
    ForceUnlock,
    /// An election's observer, followed to the end of the run: `Unexpected` when the last
    /// state it yielded is not the election's state then (see `model/worker.rs`).
    Observe,
}

impl CallKind {
    pub fn parse(s: &str) -> Option<CallKind> {
        Some(match s {
            "lock" => CallKind::Lock,
            "try_lock" => CallKind::TryLock,
            "try_lock_for" => CallKind::TryLockFor,
            "try_lock_until" => CallKind::TryLockUntil,
            "unlock" => CallKind::Unlock,
            "drop" => CallKind::Drop,
            "force_unlock" => CallKind::ForceUnlock,
            "observe" => CallKind::Observe,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Lock => "lock",
            CallKind::TryLock => "try_lock",
            CallKind::TryLockFor => "try_lock_for",
            CallKind::TryLockUntil => "try_lock_until",
            CallKind::Unlock => "unlock",
            CallKind::Drop => "drop",
            CallKind::ForceUnlock => "force_unlock",
            CallKind::Observe => "observe",
        }
    }
}

/// One timed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub kind: CallKind,
    /// The method called (`try_read_for`, `acquire_many(2)`, `unlock`, ...), for messages.
    pub method: String,
    pub name: String,
    pub owner: String,
    /// Index of the process, to subtract the time it was stopped (`usize::MAX` for the fault
    /// driver's own calls).
    pub proc: usize,
    pub start: u64,
    pub end: u64,
    /// The documented bound of this call in ns, without slack. For `lock()` it is the retry
    /// timeout plus one command and connect timeout, counted from its first failed attempt:
    /// the check counts it from the later of the call's start and the last fault before an
    /// error, plus one lease when that fault began while the call waited (`lock()` waits
    /// without bound for a live holder, and a waiter meets a fault only when it next asks).
    pub bound: u64,
    pub outcome: Outcome,
    /// For a release (`unlock` or drop): the `start` of the guard's section(s), which with
    /// the owner names the guard released; 0 for any other call.
    pub of: u64,
}

/// An `on_lease_lost` callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostReport {
    pub name: String,
    pub token: u64,
    pub at: u64,
}

/// The kinds of faults, as far as the checker cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// A process of the model was stopped (`SIGSTOP`) for the whole window.
    ProcessStopped(usize),
    /// Redis was killed and started again empty at the window's start.
    RestartEmpty,
    /// `force_unlock` of the lock `name` of type `kind`: the window is the call, from its
    /// start to its return, so the lock was freed on the server at some moment within it.
    /// `freed`: it returned `true` (it removed a holder) or an error (it may have run);
    /// `false` says nobody held the lock, so it removed nobody and excuses nothing.
    ForcedUnlock {
        name: String,
        kind: LockKind,
        freed: bool,
    },
    /// The server's wall clock stepped forward (at once, within the window): Redis expires
    /// keys by that clock, so every lock whose lease had less left than the step was freed,
    /// as if force-unlocked (see below): it excuses what a forced unlock of every lock would.
    ClockForward,
    /// The server's wall clock stepped back by this many microseconds. It excuses nothing by
    /// itself; combined with an empty restart, which loses the fencing marks, a token granted
    /// after the restart may be below one granted before by up to the steps back: those before
    /// the restart, and those after it that came before the lock's first grant after it, which
    /// sets its mark again (the limit `docs/guarantees.md` states).
    ClockBack(u64),
    /// Anything else (Redis stopped or sleeping, connections killed, replies cut, ...).
    Other,
}

/// One fault of the fault plan as it was carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub what: String,
    pub start: u64,
    pub end: u64,
}

/// What the end-of-run inspection found left over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Per process: (threads before the client was built, threads after it was dropped).
    pub threads: Vec<(usize, usize, usize)>,
    /// Redis connections still open once every client was dropped (the inspector excluded).
    pub connections: Vec<String>,
    /// Channels still subscribed.
    pub channels: Vec<String>,
    /// Lock keys still there a lease after the last process exited.
    pub keys: Vec<String>,
}

/// Everything a run produced.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub sections: Vec<Section>,
    pub calls: Vec<Call>,
    pub lost: Vec<LostReport>,
    pub faults: Vec<Fault>,
    pub leftovers: Leftovers,
    /// The run's lease (ns): the longest a waiting `lock()` sleeps without asking Redis (the
    /// TTL its last attempt saw, or a waiter's re-check), so the longest a fault that begins
    /// while it waits can go unnoticed before its first failed attempt.
    pub lease: u64,
}

/// A violation the checker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Two owners held one name at one moment. Each side lists the sections (guards) of one
    /// acquisition, outermost first.
    Overlap {
        earlier: Vec<Section>,
        later: Vec<Section>,
    },
    /// One owner held two acquisitions (two tokens) of one name at one moment.
    TwoAcquisitions {
        earlier: Vec<Section>,
        later: Vec<Section>,
    },
    /// More permits of a semaphore were held at one moment than its count: the sections
    /// holding them at the start of the last one.
    Overcount { count: u32, held: Vec<Section> },
    /// A later acquisition got a token not above an earlier one's.
    TokenOrder {
        earlier: Vec<Section>,
        later: Vec<Section>,
    },
    /// An `unlock()` that began after a forced unlock of its lock had returned reported `Ok`,
    /// though its acquisition was granted before that force began: the force had freed the
    /// lock, so the release must report the loss.
    ReleasedAfterForce {
        call: Call,
        section: Section,
        force: Fault,
    },
    /// A call took longer than its bound plus slack (`took` excludes stopped time).
    Bound {
        call: Call,
        took_ms: u64,
        limit_ms: u64,
    },
    /// An error the documentation does not allow.
    UnexpectedError(Call),
    /// `on_lease_lost` told of one acquisition more than once.
    LostTwice {
        name: String,
        token: u64,
        times: usize,
    },
    /// A thread, connection, channel or key was left over.
    Leftover(String),
    /// A waiting acquire call slept while its lock was free on the server, nobody else was
    /// calling for it and no fault was near, for longer than the bound: from `from` to `to`.
    Unserved { call: Call, from: u64, to: u64 },
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn acq(list: &[Section], t0: u64) -> String {
    let (start, end) = list
        .iter()
        .fold((u64::MAX, 0), |(a, b), s| (a.min(s.start), b.max(s.end)));
    let first = &list[0];
    let mut out = format!(
        "{} token {} held {:+.1} .. {:+.1} ms:",
        first.owner,
        first.token,
        ms(start.saturating_sub(t0)),
        ms(end.saturating_sub(t0)),
    );
    for s in list {
        out.push_str(&format!("\n      {}", sec(s, t0)));
    }
    out
}

fn sec(s: &Section, t0: u64) -> String {
    format!(
        "depth {} {} via {}: call {:+.1} start {:+.1} end {:+.1} told {} (ms)",
        s.depth,
        s.access.as_string(),
        s.handle,
        ms(s.call_start.saturating_sub(t0)),
        ms(s.start.saturating_sub(t0)),
        ms(s.end.saturating_sub(t0)),
        if s.told == 0 {
            "never".to_string()
        } else {
            format!("{:+.1}", ms(s.told.saturating_sub(t0)))
        }
    )
}

impl Finding {
    /// A readable line; times in ms relative to `t0`.
    pub fn describe(&self, t0: u64) -> String {
        match self {
            Finding::Overlap { earlier, later } => format!(
                "OVERLAP on `{}`:\n    {}\n    {}",
                earlier[0].name,
                acq(earlier, t0),
                acq(later, t0)
            ),
            Finding::TwoAcquisitions { earlier, later } => format!(
                "TWO ACQUISITIONS of `{}` by one owner at once:\n    {}\n    {}",
                earlier[0].name,
                acq(earlier, t0),
                acq(later, t0)
            ),
            Finding::Overcount { count, held } => {
                let n: u32 = held
                    .iter()
                    .map(|s| match s.access {
                        Access::Permits { n, .. } => n,
                        _ => 0,
                    })
                    .sum();
                let mut out = format!(
                    "OVERCOUNT on `{}`: {n} permits of {count} held at {:+.1} ms:",
                    held[0].name,
                    ms(held
                        .iter()
                        .map(|s| s.start)
                        .max()
                        .unwrap_or(0)
                        .saturating_sub(t0))
                );
                for s in held {
                    out.push_str(&format!(
                        "\n    {} {}: {}",
                        s.owner,
                        s.access.as_string(),
                        sec(s, t0)
                    ));
                }
                out
            }
            Finding::TokenOrder { earlier, later } => format!(
                "TOKEN ORDER on `{}`:\n    {}\n  before\n    {}",
                earlier[0].name,
                acq(earlier, t0),
                acq(later, t0)
            ),
            Finding::ReleasedAfterForce {
                call,
                section,
                force,
            } => format!(
                "OK AFTER FORCE: {} of `{}` by {} at {:+.1} .. {:+.1} ms returned Ok, but `{}` \
                 was force-unlocked at {:+.1} .. {:+.1} ms ({}) after this acquisition:\n      {}",
                call.method,
                call.name,
                call.owner,
                ms(call.start.saturating_sub(t0)),
                ms(call.end.saturating_sub(t0)),
                section.name,
                ms(force.start.saturating_sub(t0)),
                ms(force.end.saturating_sub(t0)),
                force.what,
                sec(section, t0)
            ),
            Finding::Bound {
                call,
                took_ms,
                limit_ms,
            } => format!(
                "BOUND: {} of `{}` by {} at {:+.1} ms took {took_ms} ms (limit {limit_ms} ms) -> {:?}",
                call.method,
                call.name,
                call.owner,
                ms(call.start.saturating_sub(t0)),
                call.outcome
            ),
            Finding::UnexpectedError(call) => format!(
                "ERROR: {} of `{}` by {} at {:+.1} ms -> {:?}",
                call.method,
                call.name,
                call.owner,
                ms(call.start.saturating_sub(t0)),
                call.outcome
            ),
            Finding::LostTwice { name, token, times } => {
                format!("LOST TWICE: on_lease_lost told {times} times of `{name}` token {token}")
            }
            Finding::Leftover(what) => format!("LEFTOVER: {what}"),
            Finding::Unserved { call, from, to } => format!(
                "UNSERVED: {} {} of `{}` (called {:+.1} ms, returned {:+.1} ms, {:?}) slept \
                 while the lock was free from {:+.1} to {:+.1} ms ({:.1} ms)",
                call.owner,
                call.method,
                call.name,
                ms(call.start.saturating_sub(t0)),
                ms(call.end.saturating_sub(t0)),
                call.outcome,
                ms(from.saturating_sub(t0)),
                ms(to.saturating_sub(t0)),
                ms(to - from)
            ),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(0))
    }
}

/// One acquisition: the sections of one owner with one token, merged.
#[derive(Debug, Clone)]
struct Acq<'a> {
    first: &'a Section,
    all: Vec<&'a Section>,
    start: u64,
    end: u64,
    call_start: u64,
    /// The earliest its token may have been allocated: its acquiring call's start, or for a
    /// mutex acquisition handed off locally, that of the acquisition it continues (see
    /// [`handed_off`]).
    alloc: u64,
}

impl Acq<'_> {
    fn sections(&self) -> Vec<Section> {
        let mut v: Vec<Section> = self.all.iter().map(|s| (*s).clone()).collect();
        v.sort_by_key(|s| (s.depth, s.start));
        v
    }

    fn span(&self) -> Span {
        Span {
            alloc: self.alloc,
            start: self.start,
            end: self.end,
        }
    }
}

/// What the forced-unlock rules need of a section or an acquisition: when its grant may have
/// been allocated at the earliest, when its call returned, its last passing check.
#[derive(Debug, Clone, Copy)]
struct Span {
    alloc: u64,
    start: u64,
    end: u64,
}

impl Section {
    fn span(&self) -> Span {
        Span {
            alloc: self.call_start,
            start: self.start,
            end: self.end,
        }
    }
}

/// Checks a history. `slack` is added to every bound (ns).
pub fn check(h: &History, slack: u64) -> Vec<Finding> {
    let mut findings = Vec::new();
    check_sections(h, &mut findings);
    check_readers(h, &mut findings);
    check_permits(h, &mut findings);
    check_forced_releases(h, &mut findings);
    check_calls(h, slack, &mut findings);
    check_served(h, slack, &mut findings);
    check_lost_reports(h, &mut findings);
    check_leftovers(&h.leftovers, &mut findings);
    findings
}

/// The steps back of the server clock (microseconds) that an empty restart between `from` and
/// `to` leaves unguarded for a lock whose grants began at `granted`: every step before the last
/// such restart, and each step after it, before `to`, that came before any grant of the lock
/// after the restart (the restart lost the fencing mark; the lock's first grant after it sets
/// the mark again, which guards every later step). 0 without such a restart.
fn back_around_restart(faults: &[Fault], from: u64, to: u64, granted: &[u64]) -> u64 {
    let Some(restart) = faults
        .iter()
        .filter(|f| f.kind == FaultKind::RestartEmpty && f.start >= from && f.start <= to)
        .map(|f| f.start)
        .max()
    else {
        return 0;
    };
    let marked = granted
        .iter()
        .copied()
        .filter(|&g| g > restart && g < to)
        .min()
        .unwrap_or(to);
    faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::ClockBack(us) if f.start <= restart || f.start < marked => Some(us),
            _ => None,
        })
        .sum()
}

/// Whether `b`'s token, not above `a`'s, is excused by an empty restart combined with a step
/// back of the clock (the limit `docs/guarantees.md` states): a restart between them, and `b`'s
/// token below `a`'s by no more than the steps back it left unguarded (see
/// [`back_around_restart`]). `granted`: when the lock's grants began.
fn excused_by_a_step_back(faults: &[Fault], a: &Acq<'_>, b: &Acq<'_>, granted: &[u64]) -> bool {
    let back = back_around_restart(faults, a.call_start.min(b.call_start), b.start, granted);
    back > 0 && a.first.token - b.first.token <= back
}

fn restart_between(faults: &[Fault], from: u64, to: u64) -> bool {
    faults
        .iter()
        .any(|f| f.kind == FaultKind::RestartEmpty && f.start >= from && f.start <= to)
}

/// The forced unlocks of the lock `name` of type `kind`; with `freed`, only those that may
/// have removed a holder.
///
/// With `freed`, a forward step of the server's clock counts as a force of every lock: it may
/// have freed any of them. Without it (a force that may have found nobody holding) it does not:
/// a lock whose lease outlasted the step is still held, and its release is rightly `Ok`.
fn forces<'a>(faults: &'a [Fault], name: &str, kind: LockKind, freed: bool) -> Vec<&'a Fault> {
    faults
        .iter()
        .filter(|f| match &f.kind {
            FaultKind::ForcedUnlock {
                name: n,
                kind: k,
                freed: r,
            } => n == name && *k == kind && (*r || !freed),
            FaultKind::ClockForward => freed,
            _ => false,
        })
        .collect()
}

/// Whether one of `forces` may have freed `x`'s hold on the server and `y` been granted after
/// it: `x`'s token may have been allocated before the force returned, and `y`'s acquiring
/// call returned after the force began.
///
/// With `lease`, `x` must moreover have stopped reporting itself held within that lease of
/// the force's return: its last renewal that the force did not make fail was sent before the
/// force returned and set its local deadline (a fixed lease's is no later), and the deadline
/// ends its `is_held()`. A holder that believed longer is not the dispossessed one (or its
/// renewal wrongly succeeded): it is not excused.
fn forced(forces: &[&Fault], x: Span, y: Span, lease: Option<u64>) -> bool {
    forces.iter().any(|f| {
        x.alloc < f.end
            && y.start > f.start
            && lease.is_none_or(|l| x.end <= f.end.saturating_add(l))
    })
}

/// The process of an owner: `p<process>` of `p<process>t<thread>`.
fn process(owner: &str) -> &str {
    owner.split_once('t').map_or(owner, |(p, _)| p)
}

/// Finds the mutex acquisitions that were handed off locally and gives each the allocation of
/// the acquisition it continues. A hold handed off keeps the lock on the server as it is (the
/// same owner and acquisition there) and gives the receiving thread the next token of the
/// block its acquisition through Redis reserved: so an acquisition by another thread of the
/// same process, with the next token, that began no earlier, is taken for its successor. (A
/// grant through Redis takes the server clock in microseconds, or a token above the last
/// block: it lands on the next token only when the slot's fencing mark runs ahead of the
/// clock, which only bursts of empty cycles do.) A set never takes part in a hand-off.
fn handed_off(list: &mut [Acq<'_>]) {
    list.sort_by_key(|a| (a.first.token, a.start));
    for i in 1..list.len() {
        let (before, rest) = list.split_at_mut(i);
        let b = &mut rest[0];
        if b.first.handle == "set" {
            continue;
        }
        let from = before.iter().rev().find(|a| {
            a.first.token.checked_add(1) == Some(b.first.token)
                && a.first.handle != "set"
                && a.first.owner != b.first.owner
                && process(&a.first.owner) == process(&b.first.owner)
                && a.start <= b.start
        });
        if let Some(a) = from {
            b.alloc = b.alloc.min(a.alloc);
        }
    }
}

/// A lock: its name and type.
type LockId<'a> = (&'a str, LockKind);

fn check_sections(h: &History, out: &mut Vec<Finding>) {
    // Acquisitions per lock (name and type): sections whose first check passed, grouped by
    // (owner, token).
    let mut by_lock: HashMap<LockId<'_>, HashMap<(&str, u64), Acq<'_>>> = HashMap::new();
    for s in h
        .sections
        .iter()
        .filter(|s| s.end != 0 && s.access.exclusive())
    {
        let acqs = by_lock.entry((&s.name, s.access.kind())).or_default();
        acqs.entry((&s.owner, s.token))
            .and_modify(|a| {
                a.start = a.start.min(s.start);
                a.end = a.end.max(s.end);
                a.call_start = a.call_start.min(s.call_start);
                a.alloc = a.call_start;
                if s.depth < a.first.depth {
                    a.first = s;
                }
                a.all.push(s);
            })
            .or_insert(Acq {
                first: s,
                all: vec![s],
                start: s.start,
                end: s.end,
                call_start: s.call_start,
                alloc: s.call_start,
            });
    }
    let lost = first_lost(h);
    for ((name, kind), acqs) in by_lock {
        let mut list: Vec<Acq<'_>> = acqs.into_values().collect();
        if kind == LockKind::Mutex {
            handed_off(&mut list);
        }
        let granted: Vec<u64> = list.iter().map(|a| a.start).collect();
        let forces = forces(&h.faults, name, kind, true);
        list.sort_by_key(|a| (a.start, a.end));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                // b.start >= a.start: sorted.
                if b.start < a.end {
                    let excused = lost
                        .get(&(name, a.first.token))
                        .is_some_and(|&at| at <= b.start)
                        // (A hand-off continues the acquisition of its run, allocated by
                        // the call that began the run: a run that outlived a restart is the
                        // stale holder's, as its first holder was.)
                        || restart_between(&h.faults, a.alloc.min(b.alloc), b.start)
                        || forced(&forces, a.span(), b.span(), Some(h.lease))
                        || forced(&forces, b.span(), a.span(), Some(h.lease));
                    if !excused {
                        let pair = (a.sections(), b.sections());
                        out.push(if a.first.owner == b.first.owner {
                            Finding::TwoAcquisitions {
                                earlier: pair.0,
                                later: pair.1,
                            }
                        } else {
                            Finding::Overlap {
                                earlier: pair.0,
                                later: pair.1,
                            }
                        });
                        continue;
                    }
                }
                // a's token was allocated before b's for certain when a's call returned
                // before b's token could be allocated; or when a ended before b began,
                // because b cannot have been granted first and then have waited for a's
                // release (the two would have overlapped) unless a forced unlock freed b's
                // hold for a.
                let ordered = a.start < b.alloc
                    || (a.end < b.start && !forced(&forces, b.span(), a.span(), None));
                if ordered
                    && a.first.token >= b.first.token
                    // Tokens increase across a restart too (the server clock is their floor);
                    // only a grant that may predate the restart (one whose acquiring call
                    // spanned it, or a hand-off of a run whose first call did: the stale
                    // holder's tokens, which the resource refuses) may carry a lower token
                    // than a section after it.
                    && !restart_between(&h.faults, b.alloc, b.start)
                    // A restart combined with a step back of the clock: lower by up to the
                    // step.
                    && !excused_by_a_step_back(&h.faults, a, b, &granted)
                {
                    out.push(Finding::TokenOrder {
                        earlier: a.sections(),
                        later: b.sections(),
                    });
                }
            }
        }
    }
}

/// The first `on_lease_lost` report of each (name, token) with a token. Read leases and
/// permits have none (token 0): their reports cannot be told apart, and excuse nothing.
fn first_lost(h: &History) -> HashMap<(&str, u64), u64> {
    h.lost
        .iter()
        .filter(|l| l.token != 0)
        .fold(HashMap::new(), |mut m, l| {
            let e = m.entry((l.name.as_str(), l.token)).or_insert(l.at);
            *e = (*e).min(l.at);
            m
        })
}

/// No read section of one owner intersects a write section of another (see the module docs).
fn check_readers(h: &History, out: &mut Vec<Finding>) {
    let lost = first_lost(h);
    let held = |a: Access| {
        let list: Vec<&Section> = h
            .sections
            .iter()
            .filter(|s| s.end != 0 && s.access == a)
            .collect();
        list
    };
    let (reads, writes) = (held(Access::Read), held(Access::Write));
    for r in &reads {
        let forces = forces(&h.faults, &r.name, LockKind::RwLock, true);
        for w in writes
            .iter()
            .filter(|w| w.name == r.name && w.owner != r.owner)
        {
            let (a, b) = if (w.start, w.end) <= (r.start, r.end) {
                (*w, *r)
            } else {
                (*r, *w)
            };
            if b.start >= a.end {
                continue;
            }
            let told = a.access == Access::Write
                && lost
                    .get(&(a.name.as_str(), a.token))
                    .is_some_and(|&at| at <= b.start);
            if told
                || restart_between(&h.faults, a.call_start.min(b.call_start), b.start)
                || forced(&forces, a.span(), b.span(), Some(h.lease))
                || forced(&forces, b.span(), a.span(), Some(h.lease))
            {
                continue;
            }
            out.push(Finding::Overlap {
                earlier: vec![a.clone()],
                later: vec![b.clone()],
            });
        }
    }
}

/// The permits held at the start of every semaphore section fit in the count.
fn check_permits(h: &History, out: &mut Vec<Finding>) {
    let permits = |s: &Section| match s.access {
        Access::Permits { n, of } => Some((n, of)),
        _ => None,
    };
    let mut by_name: HashMap<&str, Vec<&Section>> = HashMap::new();
    for s in h
        .sections
        .iter()
        .filter(|s| s.end != 0 && permits(s).is_some())
    {
        by_name.entry(&s.name).or_default().push(s);
    }
    let mut names: Vec<_> = by_name.into_iter().collect();
    names.sort_by_key(|(n, _)| *n);
    for (name, mut list) in names {
        let forces = forces(&h.faults, name, LockKind::Semaphore, true);
        list.sort_by_key(|s| (s.start, s.end));
        for (i, b) in list.iter().enumerate() {
            // Sections that began no later than b and still held at b's start, b included.
            let mut held: Vec<&Section> = list[..i]
                .iter()
                .filter(|a| {
                    b.start < a.end
                        && !restart_between(&h.faults, a.call_start.min(b.call_start), b.start)
                })
                .copied()
                .collect();
            held.push(b);
            // A force that began before b returned freed every permit granted before it
            // returned: those (b's own too) no longer count at b's start, as far as their
            // holders stopped believing within a lease of it.
            held.retain(|x| !forced(&forces, x.span(), b.span(), Some(h.lease)));
            let n: u32 = held.iter().filter_map(|s| permits(s)).map(|p| p.0).sum();
            let count = held.iter().filter_map(|s| permits(s)).map(|p| p.1).max();
            if let Some(count) = count
                && n > count
            {
                out.push(Finding::Overcount {
                    count,
                    held: held.into_iter().cloned().collect(),
                });
            }
        }
    }
}

/// Whether another thread of `c`'s process was taking the mutex `name` (alone or in a set)
/// while `c` ran: `c` may then have handed the lock to it without asking the server.
fn local_waiter(h: &History, c: &Call, name: &str) -> bool {
    h.calls.iter().any(|w| {
        matches!(
            w.kind,
            CallKind::Lock | CallKind::TryLock | CallKind::TryLockFor | CallKind::TryLockUntil
        ) && w.proc == c.proc
            && w.owner != c.owner
            && w.name.split('+').any(|n| n == name)
            && w.start <= c.end
            && w.end >= c.start
    })
}

/// No `unlock()` that began after a forced unlock of its lock had returned reports `Ok` for an
/// acquisition granted before that force began (see the module docs).
fn check_forced_releases(h: &History, out: &mut Vec<Finding>) {
    if !h
        .faults
        .iter()
        .any(|f| matches!(f.kind, FaultKind::ForcedUnlock { .. }))
    {
        return;
    }
    // The sections of each guard: a set's guard has one per name.
    let mut guards: HashMap<(&str, u64), Vec<&Section>> = HashMap::new();
    for s in &h.sections {
        guards.entry((&s.owner, s.start)).or_default().push(s);
    }
    for c in h
        .calls
        .iter()
        .filter(|c| c.kind == CallKind::Unlock && c.outcome == Outcome::Ok && c.of != 0)
    {
        for s in guards.get(&(c.owner.as_str(), c.of)).into_iter().flatten() {
            let kind = s.access.kind();
            // A read-write lock counts its inner levels here: only the outermost asks.
            if kind == LockKind::RwLock && s.depth > 0 {
                continue;
            }
            // A mutex's outermost level may pass to a waiting thread of its own client,
            // without asking the server (its successor finds the loss).
            if s.access == Access::Excl
                && s.handle != "set"
                && s.depth == 0
                && local_waiter(h, c, &s.name)
            {
                continue;
            }
            // One that found nobody holding contradicts the release as much.
            if let Some(f) = forces(&h.faults, &s.name, kind, false)
                .into_iter()
                .find(|f| s.start < f.start && c.start > f.end)
            {
                out.push(Finding::ReleasedAfterForce {
                    call: c.clone(),
                    section: (*s).clone(),
                    force: f.clone(),
                });
            }
        }
    }
}

/// Time process `proc` spent stopped within `[from, to]`.
fn stopped(faults: &[Fault], proc: usize, from: u64, to: u64) -> u64 {
    faults
        .iter()
        .filter(|f| f.kind == FaultKind::ProcessStopped(proc))
        .map(|f| to.min(f.end).saturating_sub(from.max(f.start)))
        .sum()
}

/// How many findings the forward steps of the server clock excused: those a check finds once
/// every forward step is taken for a fault that excuses nothing (bounds aside).
pub fn excused_by_clock_steps(h: &History) -> usize {
    let mut without = h.clone();
    for f in &mut without.faults {
        if f.kind == FaultKind::ClockForward {
            f.kind = FaultKind::Other;
        }
    }
    check(&without, u64::MAX)
        .len()
        .saturating_sub(check(h, u64::MAX).len())
}

/// How many findings the forced unlocks that removed a holder excused: those a check finds
/// once every force is taken for one that found nobody holding (bounds aside). Shows that the
/// forces met holders that went on believing, and what the excuse covered.
pub fn excused_by_forces(h: &History) -> usize {
    let mut without = h.clone();
    for f in &mut without.faults {
        if let FaultKind::ForcedUnlock { freed, .. } = &mut f.kind {
            *freed = false;
        }
    }
    check(&without, u64::MAX)
        .len()
        .saturating_sub(check(h, u64::MAX).len())
}

/// Sections per kind of access, and how many of them were told of a loss.
pub fn section_summary(h: &History) -> String {
    fn kind(a: Access) -> &'static str {
        match a {
            Access::Excl => "mutex",
            Access::Fair => "fair mutex",
            Access::Read => "read",
            Access::Write => "write",
            Access::Permits { .. } => "permits",
            Access::Lead => "leadership",
        }
    }
    [
        "mutex",
        "fair mutex",
        "read",
        "write",
        "permits",
        "leadership",
    ]
    .iter()
    .map(|what| {
        let of: Vec<&Section> = h
            .sections
            .iter()
            .filter(|s| kind(s.access) == *what)
            .collect();
        let told = of.iter().filter(|s| s.told != 0).count();
        format!("{what} {} ({told} told lost)", of.len())
    })
    .chain(std::iter::once({
        // Sections of names held through a `MultiMutex` (one per name of the set).
        let sets = h.sections.iter().filter(|s| s.handle == "set").count();
        format!("mutex sections in sets {sets}")
    }))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Per call kind: calls, and the one that came closest to (or went furthest past) its bound
/// (without slack; ms, measured as the check does).
pub fn call_summary(h: &History) -> String {
    let mut out = Vec::new();
    for kind in [
        CallKind::Lock,
        CallKind::TryLock,
        CallKind::TryLockFor,
        CallKind::TryLockUntil,
        CallKind::Unlock,
        CallKind::Drop,
        CallKind::ForceUnlock,
        CallKind::Observe,
    ] {
        let calls: Vec<&Call> = h.calls.iter().filter(|c| c.kind == kind).collect();
        if matches!(kind, CallKind::ForceUnlock | CallKind::Observe) && calls.is_empty() {
            continue;
        }
        let worst = calls
            .iter()
            .filter_map(|c| {
                let took = measured(h, c)?;
                Some((took as i64 - c.bound as i64, took, c.bound))
            })
            .max();
        match worst {
            Some((_, took, bound)) => out.push(format!(
                "{} {} (closest to its bound: {} ms of {} ms)",
                kind.as_str(),
                calls.len(),
                took / 1_000_000,
                bound / 1_000_000
            )),
            None => out.push(format!("{} {}", kind.as_str(), calls.len())),
        }
    }
    out.join(", ")
}

/// How long a call took as its bound counts it: from its start to its end, less the time its
/// process was stopped. `None` for a `lock()` that succeeded.
///
/// A `lock()` that failed is counted from the later of its start and the last fault that
/// began before it ended, since it waits for a live holder without bound and only its errors
/// are bounded (from its first failed attempt). When that fault began while it waited, its
/// first attempt may come up to one lease later (a leader sleeps on the TTL it last saw, a
/// waiter re-checks after a lease): that lease is not counted either.
fn measured(h: &History, c: &Call) -> Option<u64> {
    let (from, asleep) = match (c.kind, &c.outcome) {
        (CallKind::Lock, Outcome::Ok) => return None,
        (CallKind::Lock, _) => {
            // A forced unlock makes no call fail: it is no such fault.
            let fault = h
                .faults
                .iter()
                .filter(|f| f.start <= c.end && !matches!(f.kind, FaultKind::ForcedUnlock { .. }))
                .map(|f| f.start)
                .fold(c.start, u64::max);
            (fault, if fault > c.start { h.lease } else { 0 })
        }
        _ => (c.start, 0),
    };
    Some(
        c.end
            .saturating_sub(from)
            .saturating_sub(stopped(&h.faults, c.proc, from, c.end))
            .saturating_sub(asleep),
    )
}

fn check_calls(h: &History, slack: u64, out: &mut Vec<Finding>) {
    for c in &h.calls {
        if let Outcome::Unexpected(_) = c.outcome {
            out.push(Finding::UnexpectedError(c.clone()));
        }
        let Some(took) = measured(h, c) else {
            continue;
        };
        let limit = c.bound.saturating_add(slack);
        if took > limit {
            out.push(Finding::Bound {
                call: c.clone(),
                took_ms: took / 1_000_000,
                limit_ms: limit / 1_000_000,
            });
        }
    }
}

/// Every waiter is served while its lock is free. A waiting acquire call (`lock`,
/// `try_lock_for`, `try_lock_until`) that ended with the lock or without it (not with an
/// error) must not have slept through a stretch longer than `bound` in which its lock was
/// certainly free on the server: a release wakes every waiter it frees (by its message, or a
/// hand-over within the client), so such a stretch is a missed wake-up, not a matter of timing.
///
/// "Certainly free" is judged from what the run recorded, leaning to "maybe busy" wherever it
/// cannot tell: every section keeps the lock busy from its acquiring call's start to the end
/// of the release call of its guard (for one lease more when that release failed, for ever
/// when none was recorded); another acquire call that got the lock, for the bound before it
/// returned (away from faults a grant comes a round trip before its reply); one that failed,
/// from its start to a lease after its end (it may have been granted); one that gave up,
/// never (it held nothing, and kept others out only by waiting: if it waited in a server's
/// queue while the lock was free, it slept through the same stretch, and is judged itself).
/// No stretch within a lease after any fault counts (a stopped process's holds and
/// registrations outlive it, a restart loses releases). Elections are left out: a leader's
/// term is not a wait's concern.
fn check_served(h: &History, bound: u64, out: &mut Vec<Finding>) {
    let failed = |o: &Outcome| matches!(o, Outcome::Expected(_) | Outcome::Unexpected(_));
    let elections: std::collections::HashSet<&str> = h
        .sections
        .iter()
        .filter(|s| s.access == Access::Lead)
        .map(|s| s.name.as_str())
        .collect();
    // The release call of each guard: its sections' start and a name -> its end, and whether
    // it failed.
    let mut releases: HashMap<(u64, &str), (u64, bool)> = HashMap::new();
    for c in &h.calls {
        if matches!(c.kind, CallKind::Unlock | CallKind::Drop) {
            for n in c.name.split('+') {
                releases.insert((c.of, n), (c.end, failed(&c.outcome)));
            }
        }
    }
    // Per name: the spans in which it may have been busy, each with the acquire call it comes
    // from (its owner and start), so that a waiter's own call and section are left out.
    let mut busy: HashMap<&str, Vec<(u64, u64, &str, u64)>> = HashMap::new();
    for c in &h.calls {
        if !matches!(
            c.kind,
            CallKind::Lock | CallKind::TryLock | CallKind::TryLockFor | CallKind::TryLockUntil
        ) {
            continue;
        }
        let span = match c.outcome {
            // Granted at most a round trip before it returned, away from faults (and the
            // bound covers a slow thread); its section takes over from there.
            Outcome::Ok => (c.end.saturating_sub(bound).max(c.start), c.end),
            // It may have been granted anywhere in it, the grant lasting a lease.
            Outcome::Expected(_) | Outcome::Unexpected(_) => {
                (c.start, c.end.saturating_add(h.lease))
            }
            // It waited and gave up: it held nothing, so it kept nobody out but by waiting,
            // where it is judged itself.
            Outcome::NotAcquired => continue,
        };
        for n in c.name.split('+') {
            busy.entry(n)
                .or_default()
                .push((span.0, span.1, &c.owner, c.start));
        }
    }
    for s in &h.sections {
        let end = match releases.get(&(s.start, s.name.as_str())) {
            Some(&(end, false)) => end,
            Some(&(end, true)) => end.saturating_add(h.lease),
            None => u64::MAX,
        };
        // Granted at most the bound before its call returned (as for an acquire call).
        let from = s.start.saturating_sub(bound).max(s.call_start.min(s.start));
        busy.entry(&s.name)
            .or_default()
            .push((from, end, &s.owner, s.call_start));
    }
    let near_faults: Vec<(u64, u64)> = h
        .faults
        .iter()
        .map(|f| (f.start, f.end.saturating_add(h.lease)))
        .collect();
    for w in &h.calls {
        let waits = matches!(
            w.kind,
            CallKind::Lock | CallKind::TryLockFor | CallKind::TryLockUntil
        );
        if !waits || failed(&w.outcome) || w.end <= w.start.saturating_add(bound) {
            continue;
        }
        if w.name.split('+').any(|n| elections.contains(n)) {
            continue;
        }
        let mut spans = near_faults.clone();
        for n in w.name.split('+') {
            // The waiter's own call, and its own sections (stamped right around the call).
            let own = |&&(_, _, owner, call): &&(u64, u64, &str, u64)| {
                owner == w.owner && call <= w.start && w.start - call < 1_000_000
            };
            let list = busy.get(n).map(Vec::as_slice).unwrap_or(&[]);
            spans.extend(list.iter().filter(|e| !own(e)).map(|&(a, b, _, _)| (a, b)));
        }
        spans.retain(|&(a, b)| b > w.start && a < w.end);
        spans.sort_unstable();
        let mut free_from = w.start;
        for &(a, b) in spans.iter().chain(std::iter::once(&(w.end, w.end))) {
            if a > free_from && a - free_from > bound {
                out.push(Finding::Unserved {
                    call: w.clone(),
                    from: free_from,
                    to: a.min(w.end),
                });
                break;
            }
            free_from = free_from.max(b);
            if free_from >= w.end {
                break;
            }
        }
    }
}

/// Every lost lease is reported once: never twice for one acquisition.
fn check_lost_reports(h: &History, out: &mut Vec<Finding>) {
    let mut seen: HashMap<(&str, u64), usize> = HashMap::new();
    // A read lease's or a permit's loss is reported with token 0: those cannot be told apart.
    for l in h.lost.iter().filter(|l| l.token != 0) {
        *seen.entry((&l.name, l.token)).or_default() += 1;
    }
    let mut twice: Vec<_> = seen.into_iter().filter(|(_, n)| *n > 1).collect();
    twice.sort();
    for ((name, token), times) in twice {
        out.push(Finding::LostTwice {
            name: name.to_string(),
            token,
            times,
        });
    }
}

fn check_leftovers(l: &Leftovers, out: &mut Vec<Finding>) {
    for &(proc, before, after) in &l.threads {
        if after > before {
            out.push(Finding::Leftover(format!(
                "process {proc}: {before} threads before the client, {after} after it was dropped"
            )));
        }
    }
    for c in &l.connections {
        out.push(Finding::Leftover(format!("connection {c}")));
    }
    for c in &l.channels {
        out.push(Finding::Leftover(format!("channel {c}")));
    }
    for k in &l.keys {
        out.push(Finding::Leftover(format!("key {k}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn s(owner: &str, token: u64, start: u64, end: u64) -> Section {
        Section {
            name: "n".into(),
            owner: owner.into(),
            token,
            call_start: start.saturating_sub(1) * MS,
            start: start * MS,
            end: end * MS,
            told: 0,
            depth: 0,
            handle: "plain".into(),
            access: Access::Excl,
        }
    }

    fn with(access: Access, sec: Section) -> Section {
        Section { access, ..sec }
    }

    fn sections(list: Vec<Section>) -> History {
        History {
            sections: list,
            ..History::default()
        }
    }

    #[test]
    fn clean_history_passes() {
        let h = sections(vec![
            s("a", 1, 10, 20),
            s("b", 2, 21, 30),
            // nested guard of the same acquisition
            Section {
                depth: 1,
                ..s("b", 2, 22, 25)
            },
            s("a", 3, 31, 40),
        ]);
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn planted_overlap_is_found() {
        let h = sections(vec![s("a", 1, 10, 20), s("b", 2, 19, 30)]);
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
        // A long section hides no later overlap.
        let h = sections(vec![
            s("a", 1, 0, 100),
            s("b", 2, 10, 20),
            s("c", 3, 50, 60),
        ]);
        let overlaps = check(&h, 0)
            .into_iter()
            .filter(|f| matches!(f, Finding::Overlap { .. }))
            .count();
        assert_eq!(overlaps, 2);
    }

    #[test]
    fn a_section_whose_first_check_failed_overlaps_nothing() {
        let mut lost = s("a", 1, 10, 0);
        lost.end = 0;
        lost.told = 11 * MS;
        let h = sections(vec![lost, s("b", 2, 12, 30)]);
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn a_holder_told_by_callback_before_the_next_grant_is_excused() {
        let mut h = sections(vec![s("a", 1, 10, 20), s("b", 2, 15, 30)]);
        h.lost.push(LostReport {
            name: "n".into(),
            token: 1,
            at: 15 * MS,
        });
        assert_eq!(check(&h, 0), vec![]);
        // Told too late: still an overlap.
        h.lost[0].at = 16 * MS;
        assert_eq!(check(&h, 0).len(), 1);
    }

    #[test]
    fn a_lease_reported_lost_twice_is_found() {
        let mut h = History::default();
        let lost = LostReport {
            name: "n".into(),
            token: 1,
            at: 5,
        };
        h.lost.push(lost.clone());
        h.lost.push(LostReport {
            token: 2,
            ..lost.clone()
        });
        assert_eq!(check(&h, 0), vec![]);
        h.lost.push(lost);
        assert!(matches!(
            check(&h, 0).as_slice(),
            [Finding::LostTwice { times: 2, .. }]
        ));
    }

    #[test]
    fn a_restart_between_excuses_the_overlap_but_not_a_later_one() {
        let mut h = sections(vec![s("a", 1, 10, 20), s("b", 2, 15, 30)]);
        h.faults.push(Fault {
            kind: FaultKind::RestartEmpty,
            what: "restart".into(),
            start: 12 * MS,
            end: 13 * MS,
        });
        assert_eq!(check(&h, 0), vec![]);
        h.sections.push(s("c", 3, 29, 40));
        assert_eq!(check(&h, 0).len(), 1);
    }

    #[test]
    fn tokens_must_increase_across_a_restart() {
        let mut h = sections(vec![s("a", 5, 10, 20), s("b", 4, 30, 40)]);
        h.faults.push(Fault {
            kind: FaultKind::RestartEmpty,
            what: "restart".into(),
            start: 25 * MS,
            end: 26 * MS,
        });
        assert_eq!(check(&h, 0).len(), 1);
        // b's acquiring call spanned the restart: it may have been granted before a.
        h.sections[1].call_start = 5 * MS;
        assert_eq!(check(&h, 0), vec![]);
    }

    /// A run of local hand-offs that outlived an empty restart hands out the lost
    /// acquisition's tokens, below a grant made after the restart (the stale holder's, which
    /// the resource refuses): excused, as its first holder would be; a run that began after
    /// the restart is not.
    #[test]
    fn a_hand_off_run_across_a_restart_is_the_stale_holders() {
        let run = |first: u64| {
            let mut h = sections(vec![
                // p0t0 was granted token 100 by the server that restarted; p1t0 token 900
                // after the restart; p0t1 took 101 from p0t0's run.
                s("p0t0", 100, first, first + 2),
                s("p1t0", 900, 30, 32),
                // p0t1 began to wait after the restart.
                Section {
                    call_start: 28 * MS,
                    ..s("p0t1", 101, 33, 40)
                },
            ]);
            h.faults.push(Fault {
                kind: FaultKind::RestartEmpty,
                what: "restart".into(),
                start: 25 * MS,
                end: 26 * MS,
            });
            check(&h, 0)
        };
        assert_eq!(run(10), vec![]);
        assert!(
            matches!(run(27).as_slice(), [Finding::TokenOrder { .. }]),
            "{:?}",
            run(27)
        );
    }

    #[test]
    fn a_restart_with_a_step_back_excuses_tokens_lower_by_up_to_the_step() {
        let mut h = sections(vec![s("a", 500, 10, 20), s("b", 200, 30, 40)]);
        let restart = Fault {
            kind: FaultKind::RestartEmpty,
            what: "restart".into(),
            start: 25 * MS,
            end: 26 * MS,
        };
        h.faults.push(restart.clone());
        assert_eq!(check(&h, 0).len(), 1, "a restart alone excuses nothing");
        // A step back after the restart, before any grant of the lock after it, excuses too.
        h.faults.push(Fault {
            kind: FaultKind::ClockBack(1_000),
            what: "StepClock(-0.001 s)".into(),
            start: 27 * MS,
            end: 27 * MS,
        });
        assert_eq!(check(&h, 0), vec![]);
        // Not once a grant after the restart set the lock's mark again.
        let mut marked = sections(vec![
            s("a", 500, 10, 20),
            s("c", 700, 26, 26),
            s("b", 200, 30, 40),
        ]);
        marked.faults = h.faults.clone();
        // b below a (no longer excused) and below c.
        assert_eq!(check(&marked, 0).len(), 2);
        // One before it: lower by up to the step (300 of 299 is too much, of 300 is not).
        h.faults = vec![
            Fault {
                kind: FaultKind::ClockBack(299),
                what: "StepClock(-0.000299 s)".into(),
                start: 22 * MS,
                end: 22 * MS,
            },
            restart,
        ];
        assert_eq!(check(&h, 0).len(), 1);
        h.faults[0].kind = FaultKind::ClockBack(300);
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn one_owner_with_two_tokens_at_once_is_found() {
        let h = sections(vec![
            s("a", 1, 10, 30),
            Section {
                depth: 1,
                ..s("a", 2, 12, 20)
            },
        ]);
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::TwoAcquisitions { .. }]),
            "{f:?}"
        );
    }

    #[test]
    fn planted_token_regression_is_found() {
        let h = sections(vec![s("a", 5, 10, 20), s("b", 5, 21, 30)]);
        assert!(matches!(
            check(&h, 0).as_slice(),
            [Finding::TokenOrder { .. }]
        ));
        let h = sections(vec![s("a", 5, 10, 20), s("b", 4, 21, 30)]);
        assert_eq!(check(&h, 0).len(), 1);
    }

    #[test]
    fn readers_overlap_each_other_but_no_writer() {
        let r = |owner, start, end| with(Access::Read, s(owner, 0, start, end));
        let w = |owner, token, start, end| with(Access::Write, s(owner, token, start, end));
        // Readers together, then a writer, then a writer taking a read level of its own.
        let mut h = sections(vec![
            r("a", 10, 30),
            r("b", 15, 25),
            w("c", 1, 31, 40),
            r("c", 33, 38),
            r("a", 41, 50),
        ]);
        assert_eq!(check(&h, 0), vec![]);
        // A reader of another owner inside the write section.
        h.sections.push(r("b", 35, 36));
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
        // A writer that began inside a read section.
        let h = sections(vec![r("a", 10, 30), w("b", 1, 29, 40)]);
        assert_eq!(check(&h, 0).len(), 1);
        // Two writers: as two mutex holders.
        let h = sections(vec![w("a", 1, 10, 30), w("b", 2, 29, 40)]);
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
    }

    #[test]
    fn a_writer_told_of_its_loss_is_excused_a_reader_is_not_by_callback() {
        let r = |owner, start, end| with(Access::Read, s(owner, 0, start, end));
        let w = |owner, token, start, end| with(Access::Write, s(owner, token, start, end));
        let mut h = sections(vec![w("a", 7, 10, 30), r("b", 20, 40)]);
        h.lost.push(LostReport {
            name: "n".into(),
            token: 7,
            at: 20 * MS,
        });
        assert_eq!(check(&h, 0), vec![]);
        // A read lease's loss carries token 0: it excuses nothing, and is never "twice".
        let mut h = sections(vec![r("a", 10, 30), w("b", 8, 20, 40)]);
        for _ in 0..2 {
            h.lost.push(LostReport {
                name: "n".into(),
                token: 0,
                at: 15 * MS,
            });
        }
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
    }

    #[test]
    fn permits_in_use_never_exceed_the_count() {
        let p = |owner, n, start, end| with(Access::Permits { n, of: 3 }, s(owner, 0, start, end));
        // 1 + 2 at once, then 2 + 1 once the first is gone; one owner may hold two.
        let mut h = sections(vec![
            p("a", 1, 10, 30),
            p("b", 2, 12, 20),
            p("c", 2, 31, 40),
            p("c", 1, 32, 35),
        ]);
        assert_eq!(check(&h, 0), vec![]);
        // A fourth permit while three are held.
        h.sections.push(p("d", 1, 33, 34));
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::Overcount { count: 3, held }] if held.len() == 3),
            "{f:?}"
        );
        // An empty restart in between gives every permit back.
        h.faults.push(Fault {
            kind: FaultKind::RestartEmpty,
            what: "restart".into(),
            start: 32 * MS + 500_000,
            end: 33 * MS,
        });
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn access_round_trips() {
        for a in [
            Access::Excl,
            Access::Fair,
            Access::Read,
            Access::Write,
            Access::Permits { n: 2, of: 3 },
        ] {
            assert_eq!(Access::parse(&a.as_string()), Some(a));
        }
        assert_eq!(Access::parse("p2"), None);
    }

    fn call(kind: CallKind, start: u64, end: u64, bound: u64, outcome: Outcome) -> Call {
        Call {
            kind,
            method: kind.as_str().into(),
            name: "n".into(),
            owner: "p0t0".into(),
            proc: 0,
            start: start * MS,
            end: end * MS,
            bound: bound * MS,
            outcome,
            of: 0,
        }
    }

    #[test]
    fn bounds_with_slack_and_stopped_time() {
        let slack = 100 * MS;
        let mut h = History::default();
        h.calls
            .push(call(CallKind::TryLock, 0, 350, 250, Outcome::Ok));
        assert_eq!(check(&h, slack), vec![]);
        h.calls
            .push(call(CallKind::TryLock, 0, 351, 250, Outcome::NotAcquired));
        assert_eq!(check(&h, slack).len(), 1);
        // The process was stopped for 200 ms of it: fine.
        h.faults.push(Fault {
            kind: FaultKind::ProcessStopped(0),
            what: "SIGSTOP".into(),
            start: 100 * MS,
            end: 300 * MS,
        });
        assert_eq!(check(&h, slack), vec![]);
        // Another process's stop does not count.
        h.faults[0].kind = FaultKind::ProcessStopped(1);
        assert_eq!(check(&h, slack).len(), 1);
    }

    #[test]
    fn lock_is_bounded_only_when_it_fails_and_from_the_last_fault() {
        let slack = 100 * MS;
        let mut h = History::default();
        // Another owner holds the lock all along: the calls wait for it.
        h.sections.push(s("h", 1, 0, 60_000));
        h.calls
            .push(call(CallKind::Lock, 0, 60_000, 2000, Outcome::Ok));
        assert_eq!(check(&h, slack), vec![]);
        h.calls.push(call(
            CallKind::Lock,
            0,
            5000,
            2000,
            Outcome::Expected("t".into()),
        ));
        assert_eq!(check(&h, slack).len(), 1);
        // A forced unlock makes no call fail: the bound still counts from the start.
        h.faults.push(force("n", LockKind::Mutex, 3000, 3000));
        assert_eq!(check(&h, slack).len(), 1);
        h.faults.clear();
        h.faults.push(Fault {
            kind: FaultKind::Other,
            what: "SIGSTOP redis".into(),
            start: 3000 * MS,
            end: 6000 * MS,
        });
        assert_eq!(check(&h, slack), vec![]);
        // A fault that began while it waited: it may have slept up to a lease before its
        // first attempt met the fault.
        h.calls[1].end = 6000 * MS;
        assert_eq!(check(&h, slack).len(), 1);
        h.lease = 1000 * MS;
        assert_eq!(check(&h, slack), vec![]);
        h.calls[1].end = 6101 * MS;
        assert_eq!(check(&h, slack).len(), 1);
        // A call that began after the fault met it at once: no lease of grace.
        h.calls[1].start = 3500 * MS;
        h.calls[1].end = 6000 * MS;
        assert_eq!(check(&h, slack).len(), 1);
    }

    /// A release call of the guard whose sections began at `of` (ms).
    fn released(owner: &str, of: u64, start: u64, end: u64, outcome: Outcome) -> Call {
        Call {
            owner: owner.into(),
            of: of * MS,
            ..call(CallKind::Unlock, start, end, 250, outcome)
        }
    }

    #[test]
    fn a_waiter_that_sleeps_through_a_free_lock_is_found() {
        let bound = 100 * MS;
        let mut h = History::default();
        // `a` holds from 0 to 300 ms (its release returns at 310); `p0t0` waits from 50 ms.
        h.sections.push(s("a", 1, 1, 300));
        h.calls.push(released("a", 1, 300, 310, Outcome::Ok));
        h.calls
            .push(call(CallKind::TryLockFor, 50, 320, 1000, Outcome::Ok));
        assert_eq!(check(&h, bound), vec![]);
        // Served 500 ms after the release: a missed wake-up.
        h.calls[1].end = 810 * MS;
        let f = check(&h, bound);
        assert!(
            matches!(f.as_slice(), [Finding::Unserved { from, to, .. }]
                if *from == 310 * MS && *to == 810 * MS),
            "{f:?}"
        );
        // Timed out the same way: the same finding.
        h.calls[1].outcome = Outcome::NotAcquired;
        assert_eq!(check(&h, bound).len(), 1);
        // Another waiter that gave up meanwhile held nothing: the same finding.
        h.calls.push(call(
            CallKind::TryLockFor,
            305,
            750,
            600,
            Outcome::NotAcquired,
        ));
        h.calls[2].owner = "p1t0".into();
        assert_eq!(check(&h, bound).len(), 2);
        // One that got the lock soon after the release held it until it released it: fine.
        h.calls[2].outcome = Outcome::Ok;
        h.calls[2].end = 320 * MS;
        h.sections.push(s("p1t0", 2, 320, 800));
        h.calls.push(released("p1t0", 320, 800, 805, Outcome::Ok));
        assert_eq!(check(&h, bound), vec![]);
        h.calls.truncate(2);
        h.sections.truncate(1);
        // A release that failed may leave the lock held for a lease.
        h.calls[0].outcome = Outcome::Expected("t".into());
        h.lease = 1000 * MS;
        assert_eq!(check(&h, bound), vec![]);
        h.calls[0].outcome = Outcome::Ok;
        // A guard whose release was never recorded keeps the lock busy.
        h.calls.remove(0);
        assert_eq!(check(&h, bound), vec![]);
    }

    #[test]
    fn a_fault_near_a_free_stretch_excuses_it() {
        let bound = 100 * MS;
        let mut h = History {
            lease: 200 * MS,
            ..History::default()
        };
        h.sections.push(s("a", 1, 1, 300));
        h.calls.push(released("a", 1, 300, 310, Outcome::Ok));
        h.calls
            .push(call(CallKind::Lock, 50, 810, 2250, Outcome::Ok));
        assert_eq!(check(&h, bound).len(), 1);
        // A connection kill from 400 to 550 ms, judged until a lease after: 310..400 and
        // 750..810 are each within the bound.
        h.faults.push(Fault {
            kind: FaultKind::Other,
            what: "CLIENT KILL".into(),
            start: 400 * MS,
            end: 550 * MS,
        });
        assert_eq!(check(&h, bound), vec![]);
        // A waiter's own section (after its call) is not what kept it out.
        h.faults.clear();
        h.sections.push(Section {
            call_start: 50 * MS,
            ..s("p0t0", 2, 810, 900)
        });
        assert_eq!(check(&h, bound).len(), 1);
    }

    fn force(name: &str, kind: LockKind, start: u64, end: u64) -> Fault {
        Fault {
            kind: FaultKind::ForcedUnlock {
                name: name.into(),
                kind,
                freed: true,
            },
            what: format!("ForceUnlock({name:?}, {kind})"),
            start: start * MS,
            end: end * MS,
        }
    }

    /// A history with a lease of 100 ms (the bound on how long a dispossessed holder may go
    /// on believing after the force returned).
    fn forced_history(list: Vec<Section>, faults: Vec<Fault>) -> History {
        History {
            sections: list,
            faults,
            lease: 100 * MS,
            ..History::default()
        }
    }

    fn owned(owner: &str, token: u64, start: u64, end: u64) -> Section {
        s(owner, token, start, end)
    }

    #[test]
    fn a_forced_unlock_excuses_the_dispossessed_holder_only() {
        // a held from before the force; b was granted after it began.
        let overlap = || vec![owned("p0t0", 1, 10, 30), owned("p1t0", 2, 20, 40)];
        let h = forced_history(overlap(), vec![force("n", LockKind::Mutex, 15, 16)]);
        assert_eq!(check(&h, 0), vec![]);
        assert_eq!(excused_by_forces(&h), 1);
        // No force, or one that found nobody holding: an overlap.
        let mut found_none = force("n", LockKind::Mutex, 15, 16);
        found_none.kind = FaultKind::ForcedUnlock {
            name: "n".into(),
            kind: LockKind::Mutex,
            freed: false,
        };
        for faults in [vec![], vec![found_none]] {
            let h = forced_history(overlap(), faults);
            let f = check(&h, 0);
            assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
        }
        // A force of another name, or of another type of the same name, excuses nothing.
        for other in [
            force("m", LockKind::Mutex, 15, 16),
            force("n", LockKind::FairMutex, 15, 16),
        ] {
            let h = forced_history(overlap(), vec![other]);
            let f = check(&h, 0);
            assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
        }
        // Two sections that both began after the force: nothing excuses their overlap.
        let mut h = forced_history(overlap(), vec![force("n", LockKind::Mutex, 15, 16)]);
        h.sections.push(owned("p2t0", 3, 35, 50));
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::Overlap { earlier, later }]
                if earlier[0].owner == "p1t0" && later[0].owner == "p2t0"),
            "{f:?}"
        );
        // A section that began after the force returned is no dispossessed holder even when
        // the other began during the force.
        let h = forced_history(
            vec![owned("p0t0", 1, 17, 30), owned("p1t0", 2, 20, 40)],
            vec![force("n", LockKind::Mutex, 15, 16)],
        );
        assert_eq!(check(&h, 0).len(), 1);
        // The dispossessed holder went on believing past a lease after the force returned:
        // not what a force explains.
        let h = History {
            lease: 10 * MS,
            ..forced_history(overlap(), vec![force("n", LockKind::Mutex, 15, 16)])
        };
        assert_eq!(check(&h, 0).len(), 1);
        // A holder whose acquiring call began before the force returned may have been granted
        // before it and removed, whenever its call returned.
        let mut late = owned("p0t0", 1, 25, 45);
        late.call_start = 14 * MS;
        let h = forced_history(
            vec![owned("p1t0", 2, 20, 40), late],
            vec![force("n", LockKind::Mutex, 15, 16)],
        );
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn tokens_still_rise_across_a_forced_unlock() {
        let f16 = || vec![force("n", LockKind::Mutex, 15, 16)];
        // An excused overlap whose later grant came after the earlier one returned: its
        // token must be higher.
        let h = forced_history(
            vec![owned("p0t0", 5, 10, 30), owned("p1t0", 4, 20, 40)],
            f16(),
        );
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::TokenOrder { .. }]),
            "{f:?}"
        );
        // One after the other across the force.
        let h = forced_history(
            vec![owned("p0t0", 5, 10, 14), owned("p1t0", 4, 20, 30)],
            f16(),
        );
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::TokenOrder { .. }]),
            "{f:?}"
        );
        // A grant from before the force whose call returned after a later holder was done:
        // granted first, so its lower token is right.
        let mut early = owned("p0t0", 4, 40, 41);
        early.call_start = 12 * MS;
        let h = forced_history(vec![owned("p1t0", 5, 18, 30), early], f16());
        assert_eq!(check(&h, 0), vec![]);
    }

    #[test]
    fn a_local_successor_of_a_dispossessed_holder_is_dispossessed_too() {
        let f16 = || vec![force("n", LockKind::Mutex, 15, 16)];
        // p0t0 held from before the force and handed the lock to p0t1 (the next token) after
        // it; p1t0 was granted after the force began.
        let successor = || {
            let mut x = owned("p0t1", 8, 21, 30);
            x.call_start = 17 * MS;
            x
        };
        let h = forced_history(
            vec![
                owned("p0t0", 7, 10, 20),
                successor(),
                owned("p1t0", 100, 19, 40),
            ],
            f16(),
        );
        assert_eq!(check(&h, 0), vec![]);
        // The same in another process: no hand-off, a new holder overlapping another.
        let mut other = successor();
        other.owner = "p2t0".into();
        let h = forced_history(
            vec![owned("p0t0", 7, 10, 20), other, owned("p1t0", 100, 19, 40)],
            f16(),
        );
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
    }

    #[test]
    fn a_forced_unlock_frees_the_permits_granted_before_it() {
        let p = |owner, n, start, end| with(Access::Permits { n, of: 3 }, s(owner, 0, start, end));
        let f16 = || vec![force("n", LockKind::Semaphore, 15, 16)];
        let h = forced_history(vec![p("p0t0", 2, 10, 30), p("p1t0", 2, 20, 40)], f16());
        assert_eq!(check(&h, 0), vec![]);
        let h = forced_history(vec![p("p0t0", 2, 10, 30), p("p1t0", 2, 20, 40)], vec![]);
        assert_eq!(check(&h, 0).len(), 1);
        // Those granted after it still count.
        let h = forced_history(
            vec![
                p("p0t0", 2, 10, 30),
                p("p1t0", 2, 20, 40),
                p("p2t0", 2, 25, 35),
            ],
            f16(),
        );
        let f = check(&h, 0);
        assert!(
            matches!(f.as_slice(), [Finding::Overcount { count: 3, held }] if held.len() == 2),
            "{f:?}"
        );
    }

    #[test]
    fn a_forced_unlock_of_a_rw_lock_frees_its_readers() {
        let r = with(Access::Read, owned("p0t0", 0, 10, 30));
        let w = with(Access::Write, owned("p1t0", 3, 20, 40));
        let h = forced_history(
            vec![r.clone(), w.clone()],
            vec![force("n", LockKind::RwLock, 15, 16)],
        );
        assert_eq!(check(&h, 0), vec![]);
        let h = forced_history(vec![r, w], vec![force("n", LockKind::Mutex, 15, 16)]);
        let f = check(&h, 0);
        assert!(matches!(f.as_slice(), [Finding::Overlap { .. }]), "{f:?}");
    }

    #[test]
    fn a_release_after_a_forced_unlock_must_not_report_ok() {
        let section = owned("p0t0", 1, 10, 20);
        let unlock = |start: u64, end: u64, outcome: Outcome| Call {
            owner: "p0t0".into(),
            of: 10 * MS,
            ..call(CallKind::Unlock, start, end, 250, outcome)
        };
        let h = |sec: Section, calls: Vec<Call>| History {
            calls,
            ..forced_history(vec![sec], vec![force("n", LockKind::Mutex, 15, 16)])
        };
        // Began after the force returned: Ok is a finding, the loss is the right answer.
        let f = check(&h(section.clone(), vec![unlock(21, 22, Outcome::Ok)]), 0);
        assert!(
            matches!(f.as_slice(), [Finding::ReleasedAfterForce { .. }]),
            "{f:?}"
        );
        // As when the force said nobody held it: the one or the other is wrong.
        let mut none = h(section.clone(), vec![unlock(21, 22, Outcome::Ok)]);
        none.faults[0].kind = FaultKind::ForcedUnlock {
            name: "n".into(),
            kind: LockKind::Mutex,
            freed: false,
        };
        assert_eq!(check(&none, 0).len(), 1);
        let lost = Outcome::Expected("lease lost".into());
        assert_eq!(
            check(&h(section.clone(), vec![unlock(21, 22, lost)]), 0),
            vec![]
        );
        // Returned before the force began, or ran while it did: nothing to tell.
        assert_eq!(
            check(&h(section.clone(), vec![unlock(12, 14, Outcome::Ok)]), 0),
            vec![]
        );
        assert_eq!(
            check(&h(section.clone(), vec![unlock(15, 17, Outcome::Ok)]), 0),
            vec![]
        );
        // Another thread of the process was waiting for the mutex: a local hand-off, Ok.
        let waiter = Call {
            owner: "p0t1".into(),
            ..call(CallKind::Lock, 18, 23, 2000, Outcome::Ok)
        };
        let ok = unlock(21, 22, Outcome::Ok);
        assert_eq!(
            check(&h(section.clone(), vec![ok.clone(), waiter.clone()]), 0),
            vec![]
        );
        // A set never hands off.
        let set = Section {
            handle: "set".into(),
            ..section.clone()
        };
        assert_eq!(check(&h(set, vec![ok.clone(), waiter]), 0).len(), 1);
        // A read-write lock's inner level is released without asking the server.
        let inner = Section {
            depth: 1,
            ..with(Access::Read, section)
        };
        let mut hist = h(inner, vec![ok]);
        hist.faults = vec![force("n", LockKind::RwLock, 15, 16)];
        assert_eq!(check(&hist, 0), vec![]);
        hist.sections[0].depth = 0;
        assert_eq!(check(&hist, 0).len(), 1);
    }

    #[test]
    fn unexpected_errors_and_leftovers_are_found() {
        let mut h = History::default();
        h.calls.push(call(
            CallKind::Unlock,
            0,
            1,
            250,
            Outcome::Unexpected("x".into()),
        ));
        h.leftovers.threads.push((0, 3, 4));
        h.leftovers.keys.push("k".into());
        assert_eq!(check(&h, 0).len(), 3);
    }
}
