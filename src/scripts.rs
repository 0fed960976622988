//! The Lua scripts behind acquire, release and renew, and their typed replies.
//!
//! Each script lives in `src/scripts/*.lua`, opening with its KEYS/ARGV contract. They are
//! built once per process ([`LazyLock`]) and sent with `EVALSHA`; `redis::Script` falls back
//! to loading the script when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Connection, Script, Value};

use crate::error::{Error, Result};
use crate::keys::LockKeys;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));

/// The answer of the acquire script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The caller holds the lock now, `count` levels deep, under fencing token `token`.
    Held { token: u64, count: u64 },
    /// Another owner holds it, for `ttl` more.
    Busy { ttl: Duration },
}

/// The answer of the release script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// Released one level; `remaining` levels are still held (0: the lock is free).
    Released { remaining: u64 },
    /// The key is gone: the lease had ended (or a retried release already freed it).
    Missing,
    /// Another owner holds the lock.
    OtherOwner,
}

/// Lease in whole milliseconds, as the scripts take it; at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn unexpected(script: &str, v: &Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        format!("{script}: {v:?}"),
    )))
}

/// Runs the acquire script for `owner` with a lease of `lease`.
pub(crate) fn acquire(
    con: &mut Connection,
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    request: &str,
) -> Result<AcquireReply> {
    let v: Value = ACQUIRE
        .key(&keys.lock)
        .key(&keys.fence)
        .arg(owner)
        .arg(millis(lease))
        .arg(request)
        .invoke(con)?;
    parse_acquire(&v).ok_or_else(|| {
        if matches!(&v, Value::Array(a) if a.first().and_then(int) == Some(-1)) {
            Error::ForeignKey {
                key: keys.lock.clone(),
            }
        } else {
            unexpected("acquire", &v)
        }
    })
}

fn parse_acquire(v: &Value) -> Option<AcquireReply> {
    let Value::Array(items) = v else { return None };
    match (items.first().and_then(int)?, items.get(1), items.get(2)) {
        (1, Some(token), Some(count)) => Some(AcquireReply::Held {
            token: u64::try_from(int(token)?).ok()?,
            count: u64::try_from(int(count)?).ok()?,
        }),
        (0, Some(ttl), _) => {
            // -1 (no expiry) and -2 (gone) cannot come from our own keys; a zero wait makes
            // the caller simply try again.
            let ms = u64::try_from(int(ttl)?).unwrap_or(0);
            Some(AcquireReply::Busy {
                ttl: Duration::from_millis(ms),
            })
        }
        _ => None,
    }
}

/// Runs the release script for one level held by `owner`.
pub(crate) fn release(
    con: &mut Connection,
    keys: &LockKeys,
    owner: &str,
    request: &str,
) -> Result<ReleaseReply> {
    let v: Value = RELEASE
        .key(&keys.lock)
        .arg(owner)
        .arg(&keys.channel)
        .arg(request)
        .invoke(con)?;
    match int(&v) {
        Some(n) if n >= 0 => Ok(ReleaseReply::Released {
            remaining: n.unsigned_abs(),
        }),
        Some(-1) => Ok(ReleaseReply::Missing),
        Some(-2) => Ok(ReleaseReply::OtherOwner),
        Some(-3) => Err(Error::ForeignKey {
            key: keys.lock.clone(),
        }),
        _ => Err(unexpected("release", &v)),
    }
}

/// Parses one renew reply: `Some(true)` extended, `Some(false)` not owned any more, `None` an
/// error (the caller decides whether it is `NOSCRIPT`).
pub(crate) fn parse_renew(v: &Value) -> Option<bool> {
    int(v).map(|n| n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies_parse() {
        let held = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"1763781420000001".to_vec()),
            Value::Int(2),
        ]);
        assert_eq!(
            parse_acquire(&held),
            Some(AcquireReply::Held {
                token: 1_763_781_420_000_001,
                count: 2
            })
        );
        let busy = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(
            parse_acquire(&busy),
            Some(AcquireReply::Busy {
                ttl: Duration::from_millis(1500)
            })
        );
        let gone = Value::Array(vec![Value::Int(0), Value::Int(-2)]);
        assert_eq!(
            parse_acquire(&gone),
            Some(AcquireReply::Busy {
                ttl: Duration::ZERO
            })
        );
        assert_eq!(parse_acquire(&Value::Array(vec![Value::Int(-1)])), None);
        assert_eq!(parse_acquire(&Value::Nil), None);
    }

    #[test]
    fn millis_rounds_to_at_least_one() {
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(30)), 30);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
