//! The calls of a set of Mutex locks taken at once, all or none (`scripts/multi_acquire.lua`,
//! `multi_release.lua`), and the parsing of their replies.

use std::time::Duration;

use redis::Value;

use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::how;
use crate::protocol::scripts::{
    Call, Holder, Level, Live, ReleaseReply, Which, extend_ms, int, millis, ms, named,
    release_code, text,
};

/// One lock of a set acquired at once: its keys, the owner it is taken for, and the caller's
/// live hold on it (a re-entry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) live: Option<Live<'a>>,
}

/// The set acquire script (`multi_acquire.lua`): every member, or none; a new acquisition of a
/// member gets a lease of `lease` and reserves no token for local hand-offs.
pub(crate) fn acquire(members: &[Member<'_>], lease: Duration, request: &str) -> Call {
    let keys: Vec<&str> = members
        .iter()
        .map(|m| m.keys.lock.as_str())
        .chain(members.iter().map(|m| m.keys.fence.as_str()))
        .collect();
    let mut call = Call::new(Which::MultiAcquire, &keys)
        .arg(millis(lease))
        .arg(request);
    for m in members {
        let (acquisition, extend) = m
            .live
            .map_or(("", 0), |l| (l.acquisition, extend_ms(l.extend)));
        call.cmd.arg(m.owner).arg(acquisition).arg(extend);
    }
    call
}

/// One level of one lock of a set to release: its keys, holder and level, and whether its
/// release must publish even when the lock is not flagged (threads of this client wait).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leaving<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) holder: Holder<'a>,
    pub(crate) level: Level,
    pub(crate) publish: bool,
}

/// The set release script (`multi_release.lua`): one level of each lock, in one call.
/// `retry`: the retry of a call whose first attempt failed on the connection (it may have
/// run): the script then tells, by each lock's release marker, an outermost level the first
/// attempt released.
pub(crate) fn release(leaving: &[Leaving<'_>], request: &str, retry: bool) -> Call {
    let keys: Vec<&str> = leaving
        .iter()
        .flat_map(|l| [l.keys.lock.as_str(), l.keys.channel.as_str()])
        .collect();
    let mut call = Call::new(Which::MultiRelease, &keys).arg(request);
    for l in leaving {
        let mut how = how(l.level, retry);
        if l.publish {
            how.push('p');
        }
        call.cmd.arg(named(l.holder.acquisition)).arg(how);
    }
    call
}

/// The answer of the set acquire script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MultiReply {
    /// Every member is held now: per member, in order, its token, level count and
    /// acquisition (the lock's `gen`).
    Held(Vec<(u64, u64, String)>),
    /// Member `index` (0-based) is held by another owner for `ttl` more; nothing changed.
    Busy { index: usize, ttl: Duration },
    /// Member `index`'s key holds something locksmith did not write; nothing changed.
    Foreign { index: usize },
}

/// Parses a set acquire reply for `n` members.
pub(crate) fn parse_acquire(v: &Value, n: usize) -> Option<MultiReply> {
    let Value::Array(items) = v else { return None };
    let index = |v: Option<&Value>| -> Option<usize> {
        usize::try_from(int(v?)?)
            .ok()?
            .checked_sub(1)
            .filter(|i| *i < n)
    };
    match items.first().and_then(int)? {
        1 if items.len() == 1 + 3 * n => items[1..]
            .chunks(3)
            .map(|m| {
                let token = u64::try_from(int(&m[0])?).ok()?;
                Some((token, u64::try_from(int(&m[1])?).ok()?, text(&m[2])?))
            })
            .collect::<Option<_>>()
            .map(MultiReply::Held),
        0 => Some(MultiReply::Busy {
            index: index(items.get(1))?,
            ttl: ms(items.get(2)?)?,
        }),
        -1 => Some(MultiReply::Foreign {
            index: index(items.get(1))?,
        }),
        _ => None,
    }
}

/// Parses a set release reply for `n` locks: one [`ReleaseReply`] per lock, in order.
pub(crate) fn parse_release(v: &Value, n: usize) -> Option<Vec<ReleaseReply>> {
    let Value::Array(items) = v else { return None };
    if items.len() != 2 * n {
        return None;
    }
    items
        .chunks(2)
        .map(|p| {
            let listeners = u64::try_from(int(&p[1])?).unwrap_or(0);
            release_code(int(&p[0])?, listeners)
        })
        .collect()
}
