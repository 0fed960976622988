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
//!   (a documented loss of every lock).
//! - **Token order**: if `X.end < Y.start` then X was granted before Y (or the two overlapped,
//!   which is a violation anyway), so `X.token < Y.token` must hold, across restarts of Redis
//!   too, unless Y's own acquiring call spanned a restart (Y may then have been granted by the
//!   server that was lost, before X).
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
//! Calls are judged against their documented bound plus a slack, minus the time the calling
//! process spent stopped (`SIGSTOP`) by the fault plan. An `on_lease_lost` callback comes at
//! most once per acquisition. Errors other than timeouts, connection failures and lost leases
//! are findings, and so is any thread, connection, channel or lock key left over at the end.

use std::collections::HashMap;
use std::fmt;

/// One guard's critical section (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    /// `p<process>t<thread>`: one thread of one client, the library's unit of ownership.
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
    /// A mutex's or fair mutex's lock.
    Excl,
    /// A read lock of a read-write lock.
    Read,
    /// The write lock of a read-write lock.
    Write,
    /// `n` permits of a semaphore of `of` permits.
    Permits { n: u32, of: u32 },
}

impl Access {
    pub fn as_string(self) -> String {
        match self {
            Access::Excl => "x".into(),
            Access::Read => "r".into(),
            Access::Write => "w".into(),
            Access::Permits { n, of } => format!("p{n}/{of}"),
        }
    }

    pub fn parse(s: &str) -> Option<Access> {
        Some(match s {
            "x" => Access::Excl,
            "r" => Access::Read,
            "w" => Access::Write,
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
        matches!(self, Access::Excl | Access::Write)
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
    /// Index of the process, to subtract the time it was stopped.
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
}

/// An `on_lease_lost` callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostReport {
    pub name: String,
    pub token: u64,
    pub at: u64,
}

/// The kinds of faults, as far as the checker cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A process of the model was stopped (`SIGSTOP`) for the whole window.
    ProcessStopped(usize),
    /// Redis was killed and started again empty at the window's start.
    RestartEmpty,
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
                    ms(held.last().map_or(0, |s| s.start).saturating_sub(t0))
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
}

impl Acq<'_> {
    fn sections(&self) -> Vec<Section> {
        let mut v: Vec<Section> = self.all.iter().map(|s| (*s).clone()).collect();
        v.sort_by_key(|s| (s.depth, s.start));
        v
    }
}

/// Checks a history. `slack` is added to every bound (ns).
pub fn check(h: &History, slack: u64) -> Vec<Finding> {
    let mut findings = Vec::new();
    check_sections(h, &mut findings);
    check_readers(h, &mut findings);
    check_permits(h, &mut findings);
    check_calls(h, slack, &mut findings);
    check_lost_reports(h, &mut findings);
    check_leftovers(&h.leftovers, &mut findings);
    findings
}

fn restart_between(faults: &[Fault], from: u64, to: u64) -> bool {
    faults
        .iter()
        .any(|f| f.kind == FaultKind::RestartEmpty && f.start >= from && f.start <= to)
}

fn check_sections(h: &History, out: &mut Vec<Finding>) {
    // Acquisitions per name: sections whose first check passed, grouped by (owner, token).
    let mut by_name: HashMap<&str, HashMap<(&str, u64), Acq<'_>>> = HashMap::new();
    for s in h
        .sections
        .iter()
        .filter(|s| s.end != 0 && s.access.exclusive())
    {
        let acqs = by_name.entry(&s.name).or_default();
        acqs.entry((&s.owner, s.token))
            .and_modify(|a| {
                a.start = a.start.min(s.start);
                a.end = a.end.max(s.end);
                a.call_start = a.call_start.min(s.call_start);
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
            });
    }
    let lost = first_lost(h);
    for (name, acqs) in by_name {
        let mut list: Vec<Acq<'_>> = acqs.into_values().collect();
        list.sort_by_key(|a| (a.start, a.end));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                // b.start >= a.start: sorted.
                let excused = |a: &Acq<'_>, b: &Acq<'_>| {
                    lost.get(&(name, a.first.token))
                        .is_some_and(|&at| at <= b.start)
                        || restart_between(&h.faults, a.call_start.min(b.call_start), b.start)
                };
                if b.start < a.end {
                    if excused(a, b) {
                        continue;
                    }
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
                } else if a.end < b.start
                    && a.first.token >= b.first.token
                    // Tokens increase across a restart too (the server clock is their floor);
                    // only a grant that may predate the restart (one whose acquiring call
                    // spanned it) may carry a lower token than a section after it.
                    && !restart_between(&h.faults, b.call_start, b.start)
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
            if told || restart_between(&h.faults, a.call_start.min(b.call_start), b.start) {
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
    for (_, mut list) in names {
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

/// Time process `proc` spent stopped within `[from, to]`.
fn stopped(faults: &[Fault], proc: usize, from: u64, to: u64) -> u64 {
    faults
        .iter()
        .filter(|f| f.kind == FaultKind::ProcessStopped(proc))
        .map(|f| to.min(f.end).saturating_sub(from.max(f.start)))
        .sum()
}

/// Sections per kind of access, and how many of them were told of a loss.
pub fn section_summary(h: &History) -> String {
    fn kind(a: Access) -> &'static str {
        match a {
            Access::Excl => "mutex or fair mutex",
            Access::Read => "read",
            Access::Write => "write",
            Access::Permits { .. } => "permits",
        }
    }
    ["mutex or fair mutex", "read", "write", "permits"]
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
            format!("of which in sets {sets}")
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
    ] {
        let calls: Vec<&Call> = h.calls.iter().filter(|c| c.kind == kind).collect();
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
            let fault = h
                .faults
                .iter()
                .filter(|f| f.start <= c.end)
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
