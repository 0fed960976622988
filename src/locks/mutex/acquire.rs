//! The [`Mutex`](super::Mutex) acquire on the masters: on one master (with `WAIT` for
//! replicas when asked for), or on a quorum (held by `Q` of `N`, whatever was granted undone
//! otherwise), and one master's reply read ([`acquire_reply`], which also reads the reply of
//! the primed acquire a sleeping leader leaves for the subscriber thread to write). The
//! quorum's vote over the masters' replies is [`vote`], a pure function.

use std::time::{Duration, Instant};

use redis::Value;

use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::{self, Publish};
use crate::protocol::scripts::{self, AcquireReply, Level};
use crate::topology::backend::{Backend, jitter};
use crate::topology::quorum;
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;

/// What an acquire across the masters came to: the reply as one master's would be (on a
/// quorum, `Busy` with how long to wait at the latest), and whether it was a split vote: some
/// masters granted it (a quorum lock in transition, for example a release that reached some
/// masters but not yet others).
pub(crate) type Acquired = (AcquireReply, bool);

/// One acquire call: the script's arguments (its request id unique per acquire call, the
/// same on its retries; its `live` hold making it a re-entry), when it started and its bound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireCall<'a> {
    pub(crate) keys: &'a LockKeys,
    /// The script's arguments (`quorum` where the lock lives on a quorum of masters).
    pub(crate) script: mutex::Acquire<'a>,
    /// When the call started; a quorum grant's validity is judged against it.
    pub(crate) sent: Instant,
    /// The bound of the call.
    pub(crate) by: Deadline,
}

/// A grant of one master: (master, token, count, acquisition).
type Granted = (usize, u64, u64, String);

/// An acquire script's reply to `a`, parsed.
pub(crate) fn acquire_reply(v: Value, a: &mutex::Acquire<'_>) -> Result<AcquireReply, Fault> {
    mutex::parse_acquire(&v, a).ok_or_else(|| Fault::bad_reply("acquire", &v))
}

/// The quorum's vote over the masters' acquire replies.
#[derive(Debug, Default)]
struct Votes {
    held: Vec<Granted>,
    busy: Vec<Duration>,
    failed: usize,
    /// Masters whose failure may have come after the script ran there.
    maybe_ran: Vec<usize>,
    foreign: bool,
    first_error: Option<Fault>,
}

/// Sorts the masters' acquire replies into the vote.
fn vote(parsed: Vec<(usize, Result<AcquireReply, Fault>)>) -> Votes {
    let mut v = Votes::default();
    for (i, r) in parsed {
        match r {
            Ok(AcquireReply::Held {
                token,
                count,
                acquisition,
                ..
            }) => v.held.push((i, token, count, acquisition)),
            Ok(AcquireReply::Busy { ttl }) => v.busy.push(ttl),
            Ok(AcquireReply::Foreign) => v.foreign = true,
            Err(e) => {
                v.failed += 1;
                // A master skipped as marked down, or left for lack of time, never got the
                // command; any other failure may have come after the script ran there.
                if !e.nothing_sent() {
                    v.maybe_ran.push(i);
                }
                v.first_error.get_or_insert(e);
            }
        }
    }
    v
}

/// The acquisition a quorum granted, if any: the masters may disagree (a re-entry on some, a
/// new acquisition on those that had lost the hold), and only one granted by a quorum holds.
fn winner(held: &[Granted], quorum: usize) -> Option<String> {
    held.iter()
        .map(|h| &h.3)
        .find(|g| held.iter().filter(|h| &h.3 == *g).count() >= quorum)
        .cloned()
}

/// Acquires on the masters. `a.sent` must be taken before this call; the validity of a
/// quorum grant is judged against it.
pub(crate) fn acquire(backend: &Backend, a: &AcquireCall<'_>) -> Result<Acquired> {
    let (keys, by, script) = (a.keys, a.by, &a.script);
    let call = mutex::acquire(keys, script);
    if backend.single() {
        if backend.wait_replicas().is_some() {
            return acquire_replicated(backend, &call, a);
        }
        return Ok((acquire_reply(backend.call_one(&call, by)?, script)?, false));
    }
    // With a quorum, one round is kept back for giving back a partial grant at once.
    let round_by = by.minus(backend.call_timeout());
    let replies = backend.call_on(&call, &backend.all(), round_by, false);
    let votes = vote(
        replies
            .into_iter()
            .map(|(i, r)| (i, r.and_then(|v| acquire_reply(v, script))))
            .collect(),
    );
    let (n, q) = (backend.masters(), backend.quorum());
    if let Some(acquisition) = winner(&votes.held, q).filter(|_| !votes.foreign)
        && a.script.lease > a.sent.elapsed() + backend.drift(a.script.lease)
    {
        return Ok((kept(backend, a, &votes.held, acquisition), false));
    }
    // Not held: give back what was granted, on the masters that granted it and (unless this
    // was a re-entry, whose levels must not be undone twice) on those that did not answer,
    // since the script may have run there before the reply was lost.
    let split = !votes.held.is_empty();
    let unanswered = if a.script.live.is_none() {
        &votes.maybe_ran[..]
    } else {
        &[]
    };
    undo(backend, keys, a.script.request, &votes.held, unanswered, by);
    if votes.foreign {
        return Ok((AcquireReply::Foreign, false));
    }
    if votes.failed > n - q {
        log::debug!(
            "no quorum for `{}`: {} of {n} masters answered ({})",
            keys.name,
            n - votes.failed,
            votes.first_error.map(|e| e.to_string()).unwrap_or_default()
        );
        return Err(Error::NoQuorum {
            reached: n - votes.failed,
            needed: q,
        });
    }
    // Enough masters must become free: wait for the shortest remaining leases that make that
    // possible, or (a split vote) retry after a random delay.
    let wait = quorum::free_in(votes.busy, n, q)
        .unwrap_or_else(|| jitter(backend.call_timeout().max(Duration::from_millis(5))));
    Ok((AcquireReply::Busy { ttl: wait }, split))
}

/// The grant of `acquisition`, which a quorum of masters granted (`held`: every master's
/// grant): its highest token and count. Masters that granted another acquisition give it back.
fn kept(
    backend: &Backend,
    a: &AcquireCall<'_>,
    held: &[Granted],
    acquisition: String,
) -> AcquireReply {
    let ours = held.iter().filter(|h| h.3 == acquisition);
    let token = ours.clone().map(|h| h.1).max().unwrap_or(0);
    let count = ours.map(|h| h.2).max().unwrap_or(1);
    let stray: Vec<_> = held
        .iter()
        .filter(|h| h.3 != acquisition)
        .cloned()
        .collect();
    undo(backend, a.keys, a.script.request, &stray, &[], a.by);
    AcquireReply::Held {
        token,
        count,
        acquisition,
        last: token,
    }
}

/// One master, with replica confirmation: the script and `WAIT` in one round trip; a grant
/// fewer replicas confirmed than asked for is undone at once (within one more command
/// timeout) and reported as [`Error::NotReplicated`].
fn acquire_replicated(
    backend: &Backend,
    call: &scripts::Call,
    a: &AcquireCall<'_>,
) -> Result<Acquired> {
    let (reply, acked) = backend.call_waited(call, a.by);
    let reply = acquire_reply(reply?, &a.script)?;
    let needed = backend.wait_replicas().unwrap_or(0);
    let AcquireReply::Held {
        token,
        count,
        acquisition,
        ..
    } = &reply
    else {
        return Ok((reply, false));
    };
    if acked >= needed {
        return Ok((reply, false));
    }
    // The undo gets its own command timeout: the wait may have used up the call's bound, and
    // the grant must not stay behind.
    let undo_by = Deadline::after(backend.command_timeout());
    let granted = [(0, *token, *count, acquisition.clone())];
    undo(backend, a.keys, a.script.request, &granted, &[], undo_by);
    log::debug!(
        "acquisition of `{}` confirmed by {acked} of {needed} replicas; undone",
        a.keys.name
    );
    Err(Error::NotReplicated { acked, needed })
}

/// Gives back what an acquire that is not kept granted: on each master of `granted` its own
/// level (a new acquisition is freed, a re-entry counted down), and on `unanswered` the new
/// acquisition `request` may have made.
fn undo(
    backend: &Backend,
    keys: &LockKeys,
    request: &str,
    granted: &[Granted],
    unanswered: &[usize],
    by: Deadline,
) {
    // One round per acquisition and level, to every master concerned at once. The masters
    // that did not answer just failed, and so are marked down: the undo goes to them all the
    // same, on a new connection (`fresh`), since the acquire may have run there and its grant
    // would otherwise stay for a lease. It is bounded by the round the acquire kept back.
    // A master's grant is the new acquisition `request` (its outermost level goes) or a
    // re-entry of another one (one inner level goes).
    let mut jobs: Vec<(Vec<usize>, &str, u64, bool)> = Vec::new();
    for (i, token, _, acquisition) in granted {
        match jobs.iter_mut().find(|j| j.1 == acquisition.as_str()) {
            Some(job) => {
                job.0.push(*i);
                job.2 = job.2.max(*token);
            }
            None => jobs.push((vec![*i], acquisition.as_str(), *token, false)),
        }
    }
    if !unanswered.is_empty() {
        let token = granted.iter().map(|h| h.1).max().unwrap_or(0);
        jobs.push((unanswered.to_vec(), request, token, true));
    }
    for (targets, acquisition, token, fresh) in jobs {
        let level = if acquisition == request {
            Level::Outermost
        } else {
            Level::Inner
        };
        let id = crate::shared::grant::request_id();
        let release = mutex::Release {
            acquisition,
            level,
            request: &id,
            publish: Publish::Never,
            fence: backend.fence_of(token),
        };
        let call = mutex::release(keys, &release, false);
        let _ = backend.call_on(&call, &targets, by, fresh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(acquisition: &str, token: u64) -> Result<AcquireReply, Fault> {
        Ok(AcquireReply::Held {
            token,
            count: 1,
            acquisition: acquisition.into(),
            last: token,
        })
    }

    #[test]
    fn a_quorum_of_one_acquisition_wins() {
        let v = vote(vec![
            (0, held("a", 3)),
            (1, held("b", 4)),
            (2, held("a", 5)),
            (
                3,
                Ok(AcquireReply::Busy {
                    ttl: Duration::from_millis(9),
                }),
            ),
            (4, Err(Fault::MarkedDown)),
        ]);
        assert_eq!(winner(&v.held, 3), None);
        assert_eq!(winner(&v.held, 2).as_deref(), Some("a"));
        assert_eq!((v.failed, v.busy.len(), v.foreign), (1, 1, false));
        // A master skipped as marked down never ran the script.
        assert!(v.maybe_ran.is_empty());
    }

    #[test]
    fn a_lost_reply_may_have_run() {
        let v = vote(vec![
            (0, Err(Fault::timeout("no reply"))),
            (1, Ok(AcquireReply::Foreign)),
        ]);
        assert_eq!(v.maybe_ran, vec![0]);
        assert!(v.foreign && v.first_error.is_some());
    }
}
