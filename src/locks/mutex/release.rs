//! The [`Mutex`](super::Mutex) release on the masters: one level of an acquisition, retried
//! once where a connection failed, and the quorum's verdict over the masters' replies
//! ([`merge`], a pure function).

use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::{self, Publish};
use crate::protocol::scripts::{Level, ReleaseReply};
use crate::topology::backend::Backend;
use crate::topology::quorum;
use crate::transport::conn::Deadline;
use crate::transport::fault::Fault;

/// Releases `level` of `acquisition` (whose fencing token is `token`) on every master,
/// retrying once (on a new connection) where the connection failed, all within `by`.
/// `publish`: the release publishes even when no waiter flagged the lock (threads of this
/// client wait); with a quorum it always does (waiters listen on one master).
pub(crate) fn release(
    backend: &Backend,
    keys: &LockKeys,
    (acquisition, token): (&str, u64),
    level: Level,
    publish: bool,
    by: Deadline,
) -> Result<ReleaseReply> {
    let request = crate::shared::grant::request_id();
    let release = mutex::Release {
        acquisition,
        level,
        request: &request,
        publish: if publish || !backend.single() {
            Publish::Always
        } else {
            Publish::IfFlagged
        },
        fence: backend.fence_of(token),
    };
    // Each master's reply, parsed once: a reply of the wrong shape is a fault like any other.
    let parse = |replies: Vec<(usize, Result<redis::Value, Fault>)>| -> Vec<_> {
        let read = |v: redis::Value| {
            mutex::parse_release(&v).ok_or_else(|| Fault::bad_reply("release", &v))
        };
        replies
            .into_iter()
            .map(|(i, r)| (i, r.and_then(read)))
            .collect()
    };
    let call = mutex::release(keys, &release, false);
    let mut replies = parse(backend.call_on(&call, &backend.all(), by, false));
    let (retry, fresh) = retry_targets(&replies, backend.quorum());
    if !retry.is_empty() && !by.passed() {
        log::debug!(
            "release of `{}` failed on {} master(s); retrying once",
            keys.name,
            retry.len()
        );
        // The first attempt may have released the last level before its reply was lost: the
        // key is then gone, or already another owner's (a waiter took it at once). So is it
        // when Redis restarted empty, or the lease was lost: the retry asks the script to
        // tell them apart by the release marker (`ReleasedBefore`), and what it cannot tell
        // is a loss.
        let again = mutex::release(keys, &release, true);
        quorum::replace_replies(
            &mut replies,
            parse(backend.call_on(&again, &retry, by, fresh)),
        );
    }
    let mut parsed = replies.into_iter().map(|(_, r)| r.map_err(Error::from));
    if backend.single() {
        return parsed.next().unwrap_or(Err(Error::NoQuorum {
            reached: 0,
            needed: 1,
        }));
    }
    merge(parsed, backend.quorum())
}

/// Which masters a release retries, after the first round's `replies`, and whether on a new
/// connection (`fresh`).
///
/// A quorum master skipped as marked down (it failed a moment ago, maybe for one slow
/// reply) never saw the release. While the masters that answered released fewer than a
/// quorum, the outcome rests on the skipped ones: the retry goes to them too, on a new
/// connection (`fresh`), costing at most one more per-master timeout. Skipping them would
/// fail the unlock of a lock still held on them, for the whole marked-down pause; once the
/// others decided the outcome, waiting for them again would cost the caller for nothing.
fn retry_targets(
    replies: &[(usize, Result<ReleaseReply, Fault>)],
    quorum: usize,
) -> (Vec<usize>, bool) {
    let released = (replies.iter())
        .filter(|(_, r)| {
            matches!(
                r,
                Ok(ReleaseReply::Released { .. } | ReleaseReply::ReleasedBefore)
            )
        })
        .count();
    let undecided = released < quorum;
    let retry = (replies.iter())
        .filter(|(_, r)| {
            r.as_ref()
                .err()
                .is_some_and(|e| e.is_retriable() && (undecided || !e.is_marked_down()))
        })
        .map(|(i, _)| *i)
        .collect();
    let fresh = undecided
        && replies
            .iter()
            .any(|(_, r)| matches!(r, Err(Fault::MarkedDown)));
    (retry, fresh)
}

/// The quorum's verdict over the masters' release replies: released when `quorum` released;
/// otherwise another owner's, a foreign key, an error when too few answered to tell, or
/// missing.
fn merge(
    replies: impl IntoIterator<Item = Result<ReleaseReply>>,
    quorum: usize,
) -> Result<ReleaseReply> {
    let (mut released, mut remaining, mut listeners, mut other, mut foreign, mut errors) =
        (0, 0, 0u64, false, false, Vec::new());
    for r in replies {
        match r {
            // Each client listens on one master at a time: the sum counts each once.
            Ok(ReleaseReply::Released {
                remaining: n,
                listeners: l,
            }) => {
                released += 1;
                remaining = remaining.max(n);
                listeners = listeners.saturating_add(l);
            }
            Ok(ReleaseReply::ReleasedBefore) => released += 1,
            Ok(ReleaseReply::Missing) => {}
            Ok(ReleaseReply::OtherOwner) => other = true,
            Ok(ReleaseReply::Foreign) => foreign = true,
            Err(e) => errors.push(e),
        }
    }
    if released >= quorum {
        Ok(ReleaseReply::Released {
            remaining,
            listeners,
        })
    } else if other {
        Ok(ReleaseReply::OtherOwner)
    } else if foreign {
        Ok(ReleaseReply::Foreign)
    } else if released + errors.len() >= quorum {
        // Could not tell: not enough masters answered.
        Err(errors.into_iter().next().unwrap_or(Error::NoQuorum {
            reached: released,
            needed: quorum,
        }))
    } else {
        Ok(ReleaseReply::Missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn released(listeners: u64) -> Result<ReleaseReply> {
        Ok(ReleaseReply::Released {
            remaining: 0,
            listeners,
        })
    }

    #[test]
    fn a_quorum_released_sums_listeners() {
        let r = merge(
            [released(1), Ok(ReleaseReply::ReleasedBefore), released(2)],
            2,
        );
        assert!(matches!(
            r,
            Ok(ReleaseReply::Released {
                remaining: 0,
                listeners: 3
            })
        ));
    }

    #[test]
    fn marked_down_masters_are_retried_while_the_outcome_rests_on_them() {
        let undecided = [
            (0, Ok(ReleaseReply::ReleasedBefore)),
            (1, Err(Fault::MarkedDown)),
            (2, Err(Fault::timeout("no reply"))),
        ];
        assert_eq!(retry_targets(&undecided, 2), (vec![1, 2], true));
        let decided = [
            (0, Ok(ReleaseReply::ReleasedBefore)),
            (1, Ok(ReleaseReply::ReleasedBefore)),
            (2, Err(Fault::MarkedDown)),
            (3, Err(Fault::timeout("no reply"))),
        ];
        assert_eq!(retry_targets(&decided, 2), (vec![3], false));
    }

    #[test]
    fn too_few_answers_cannot_tell() {
        let r = merge(
            [
                released(0),
                Err(Error::timeout("no reply")),
                Ok(ReleaseReply::Missing),
            ],
            2,
        );
        assert!(r.is_err());
        let r = merge(
            [
                released(0),
                Ok(ReleaseReply::Missing),
                Ok(ReleaseReply::Missing),
            ],
            2,
        );
        assert!(matches!(r, Ok(ReleaseReply::Missing)));
        let r = merge([Ok(ReleaseReply::OtherOwner), Ok(ReleaseReply::Missing)], 2);
        assert!(matches!(r, Ok(ReleaseReply::OtherOwner)));
    }
}
