//! The quorum's arithmetic: pure functions over the masters' replies, with no I/O, so that
//! every vote can be checked without a server. With one master the quorum is 1 of 1, and each
//! function gives that master's answer.
//!
//! - [`tally`]: each master's reply read into an answer, or the first error (a foreign key
//!   ends it at once); [`Tally::need`] asks that a quorum answered.
//! - [`decided`]: a yes/no question decided by a quorum, or still open.
//! - [`free_in`]: how long until enough busy masters free a lock for a quorum.
//! - [`Renewed`]: what a round of renewals came to, lease by lease.
//! - [`worth_retrying`], [`replace_replies`]: which masters a retry goes to, and its replies
//!   put in the place of the first ones.

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::protocol::scripts;
use crate::transport::fault::Fault;

/// What one round of renewals found: one outcome per lease, in the order of the calls
/// (`Some(true)` kept, `Some(false)` lost, `None` unknown), a refusal for a permission if a
/// call met one, and each master's clock.
#[derive(Debug)]
pub(crate) struct Renewed {
    pub(crate) outcomes: Vec<Option<bool>>,
    pub(crate) refused: Option<Refusal>,
    /// Each master that answered, by name, with its clock (`TIME`, in microseconds since the
    /// epoch) as read in the round: see `renewal::clock_watch`.
    pub(crate) clocks: Vec<(String, u64)>,
}

/// A renewal the server refused for a missing permission: not a lost race, a rule to fix.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The server's error.
    pub(crate) message: String,
    /// The command refused, when the server names it (Redis 7.2 and later, Valkey).
    pub(crate) command: Option<String>,
    /// Where (`host:port`).
    pub(crate) server: String,
}

impl Refusal {
    pub(crate) fn of(v: &Value, server: &str) -> Option<Refusal> {
        scripts::permission_refusal(v).map(|(message, command)| Refusal {
            message,
            command,
            server: server.to_owned(),
        })
    }
}

/// The masters' replies to one call, each read into an answer.
#[derive(Debug)]
pub(crate) struct Tally<T> {
    /// The answers, one per master that answered.
    pub(crate) answers: Vec<T>,
    /// The first error of a master that did not answer.
    pub(crate) first_error: Option<Error>,
}

impl<T> Tally<T> {
    /// The first error, or [`Error::NoQuorum`] with `reached` when no master failed.
    pub(crate) fn error(self, reached: usize, needed: usize) -> Error {
        self.first_error
            .unwrap_or(Error::NoQuorum { reached, needed })
    }

    /// The answers when at least `quorum` masters answered; the first error otherwise.
    pub(crate) fn need(self, quorum: usize) -> Result<Vec<T>> {
        let answered = self.answers.len();
        if answered < quorum {
            return Err(self.error(answered, quorum));
        }
        Ok(self.answers)
    }
}

/// Reads each master's reply with `read`. A [`Error::ForeignKey`] (the lock's key holds
/// something else) ends the tally: it is the caller's answer on any master.
pub(crate) fn tally<V, T>(
    replies: impl IntoIterator<Item = Result<V>>,
    mut read: impl FnMut(V) -> Result<T>,
) -> Result<Tally<T>> {
    let mut t = Tally {
        answers: Vec::new(),
        first_error: None,
    };
    for reply in replies {
        match reply.and_then(&mut read) {
            Ok(answer) => t.answers.push(answer),
            Err(e @ Error::ForeignKey { .. }) => return Err(e),
            Err(e) => {
                t.first_error.get_or_insert(e);
            }
        }
    }
    Ok(t)
}

/// A question `masters` masters answer yes or no: `Some(true)` when `yes` reach `quorum`,
/// `Some(false)` when so many said no that `quorum` cannot be reached, `None` otherwise.
pub(crate) fn decided(yes: usize, no: usize, masters: usize, quorum: usize) -> Option<bool> {
    if yes >= quorum {
        Some(true)
    } else if no > masters.saturating_sub(quorum) {
        Some(false)
    } else {
        None
    }
}

/// How long until a lock that the masters `busy` hold (each with its lease left) is free on
/// `quorum` of `masters`: the `k`-th shortest lease, `k` the masters still missing. `None`
/// when enough masters are free now (a split vote: worth a retry after a random delay).
pub(crate) fn free_in(mut busy: Vec<Duration>, masters: usize, quorum: usize) -> Option<Duration> {
    busy.sort();
    let free_now = masters.saturating_sub(busy.len());
    match quorum.checked_sub(free_now) {
        Some(k) if k > 0 => Some(busy.get(k - 1).copied().unwrap_or(Duration::ZERO)),
        _ => None,
    }
}

/// The masters among `replies` whose call failed in a way a new connection may mend: not a
/// master marked down, which another wait would only cost the others.
pub(crate) fn worth_retrying<T>(replies: &[(usize, Result<T, Fault>)]) -> Vec<usize> {
    replies
        .iter()
        .filter(|(_, r)| {
            r.as_ref()
                .err()
                .is_some_and(|e| e.is_retriable() && !e.is_marked_down())
        })
        .map(|(i, _)| *i)
        .collect()
}

/// Puts each master's reply of a retry, `again`, in the place of its first reply in `replies`.
pub(crate) fn replace_replies<T>(replies: &mut [(usize, T)], again: Vec<(usize, T)>) {
    for (i, r) in again {
        if let Some(slot) = replies.iter_mut().find(|(j, _)| *j == i) {
            slot.1 = r;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_decides_and_a_blocking_minority_loses() {
        assert_eq!(decided(3, 0, 5, 3), Some(true));
        assert_eq!(decided(2, 2, 5, 3), None);
        assert_eq!(decided(0, 3, 5, 3), Some(false));
        assert_eq!(decided(1, 0, 1, 1), Some(true));
        assert_eq!(decided(0, 1, 1, 1), Some(false));
        assert_eq!(decided(0, 0, 1, 1), None);
    }

    #[test]
    fn the_wait_is_for_the_masters_still_missing() {
        let ms = Duration::from_millis;
        // 5 masters, quorum 3, 4 busy: 1 free, 2 more needed.
        assert_eq!(
            free_in(vec![ms(40), ms(10), ms(30), ms(20)], 5, 3),
            Some(ms(20))
        );
        // 3 free of 5: a split vote.
        assert_eq!(free_in(vec![ms(10), ms(20)], 5, 3), None);
        assert_eq!(free_in(vec![ms(7)], 1, 1), Some(ms(7)));
    }

    #[test]
    fn a_tally_needs_a_quorum_and_stops_at_a_foreign_key() {
        let replies = vec![Ok(1), Err(Error::timeout("no reply")), Ok(2)];
        let t = tally(replies, Ok).unwrap();
        assert_eq!(t.answers, vec![1, 2]);
        assert!(t.first_error.is_some());
        let t = tally(vec![Ok(1), Err(Error::timeout("x"))], Ok).unwrap();
        assert!(matches!(t.need(2), Err(Error::Timeout { .. })));
        let t = tally(Vec::<Result<i32>>::new(), Ok).unwrap();
        assert!(matches!(
            t.need(1),
            Err(Error::NoQuorum {
                reached: 0,
                needed: 1
            })
        ));
        let foreign = || Error::ForeignKey { key: "k".into() };
        assert!(tally(vec![Ok(1), Err(foreign()), Ok(2)], Ok).is_err());
    }

    #[test]
    fn retries_skip_marked_down_masters_and_replace_in_place() {
        let replies: Vec<(usize, Result<u8, Fault>)> = vec![
            (0, Ok(1)),
            (1, Err(Fault::MarkedDown)),
            (2, Err(Fault::timeout("no reply"))),
        ];
        let retry = worth_retrying(&replies);
        assert_eq!(retry, vec![2]);
        let mut replies = replies;
        replace_replies(&mut replies, vec![(2, Ok(9))]);
        assert!(matches!(replies[2], (2, Ok(9))));
    }
}
