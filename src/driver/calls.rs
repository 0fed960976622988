//! What the lock types other than the plain mutex (fair mutex, read-write lock, semaphore)
//! share: their one script call retried once on a new connection, and what
//! their holders look like to an operator.

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::lock_value::{Shape, parse_held};
use crate::protocol::scripts::{self, AcquireReply, int, parse_grant, text, unexpected};
use crate::shared::Core;
use crate::shared::holder::{Holder, parse_owner};
use crate::transport::conn::Deadline;

/// Runs a script call once, and once more at once (on a new connection: a failure clears the
/// pool) when the connection failed; both within one connect plus one command timeout, and
/// within `by`, as the plain mutex's attempt. The scripts recognise a retry by its ids.
pub(crate) fn eval_twice(client: &Core, call: &scripts::Call, by: Deadline) -> Result<Value> {
    let backend = &client.shared().backend;
    twice(client, by, |by| backend.eval_single(call, by))
}

/// Runs `once` within `by` and one connect plus one command timeout, and once more at once,
/// within the same bound, when the connection failed (a failure clears the pool: the second
/// runs on a new connection).
pub(crate) fn twice<T>(
    client: &Core,
    by: Deadline,
    mut once: impl FnMut(Deadline) -> Result<T>,
) -> Result<T> {
    let by = by.min(Deadline::after(client.shared().config.one_call()));
    match once(by) {
        Err(e) if e.is_retriable() && !by.passed() => {
            log::debug!("a call failed ({e}); retrying once on a new connection");
            once(by)
        }
        other => other,
    }
}

/// The reply `v` of the acquire call `what` of acquisition `request` on the lock of `keys`:
/// [`Error::ForeignKey`] when its key holds something else.
pub(crate) fn acquire_reply(
    v: &Value,
    request: &str,
    keys: &LockKeys,
    what: &str,
) -> Result<AcquireReply> {
    match parse_grant(v, request, 0) {
        Some(AcquireReply::Foreign) => Err(Error::ForeignKey {
            key: keys.lock.clone(),
        }),
        Some(reply) => Ok(reply),
        None => Err(unexpected(what, v)),
    }
}

/// Runs an operator's query (`info`) or `force_unlock` call within the connect plus the command
/// timeout (retried once on a new connection), as the lock types' other one-shot calls. A reply
/// `{-1}` is the lock's key holding something locksmith did not write.
pub(crate) fn ask(
    client: &Core,
    call: &scripts::Call,
    keys: &LockKeys,
    what: &str,
) -> Result<Value> {
    client.shared().ensure_open()?;
    let by = Deadline::after(client.shared().config.one_call());
    let v = eval_twice(client, call, by)?;
    if let Value::Array(items) = &v
        && let [first] = items.as_slice()
        && int(first) == Some(-1)
    {
        return Err(Error::ForeignKey {
            key: keys.lock.clone(),
        });
    }
    if matches!(v, Value::Nil) {
        return Err(unexpected(what, &v));
    }
    Ok(v)
}

/// Runs a `force_unlock` call `what` (as [`ask`]): its reply and the values it removed; `None`
/// when nothing was held.
pub(crate) fn forced(
    client: &Core,
    call: &scripts::Call,
    keys: &LockKeys,
    what: &str,
) -> Result<Option<(Value, Vec<String>)>> {
    let v = ask(client, call, keys, what)?;
    let removed = removed(&v).ok_or_else(|| unexpected(what, &v))?;
    Ok((!removed.is_empty()).then_some((v, removed)))
}

/// Runs the `force_unlock` call `what` of a lock type with one kind of holder (as [`forced`]),
/// and logs the holders it removed (as [`log_forced`]: under `target`, the lock type's module,
/// of the lock type `lock`, whose values have `shape`): whether it removed any.
pub(crate) fn force_holders(
    client: &Core,
    call: &scripts::Call,
    keys: &LockKeys,
    what: &str,
    (target, lock, shape): (&str, &str, Shape),
) -> Result<bool> {
    let Some((_, removed)) = forced(client, call, keys, what)? else {
        return Ok(false);
    };
    log_forced((target, lock, &keys.name), "holder", &removed, shape);
    Ok(true)
}

/// The server clock (µs) in the first two items of an `info` reply (`TIME`'s fields).
pub(crate) fn clock_us(items: &[Value]) -> Option<u64> {
    let s: u64 = text(items.first()?)?.parse().ok()?;
    let us: u64 = text(items.get(1)?)?.parse().ok()?;
    s.checked_mul(1_000_000)?.checked_add(us)
}

/// The holder a value of `shape` names, with its lease left (ms, as `PTTL` gives it) and the
/// server clock now (µs).
pub(crate) fn holder_of(
    value: &str,
    shape: Shape,
    lease_left_ms: i64,
    now_us: u64,
) -> Option<Holder> {
    let held = parse_held(value, shape)?;
    let held_for = held.since_us.map_or(Duration::ZERO, |s| {
        Duration::from_micros(now_us.saturating_sub(s))
    });
    let left = Duration::from_millis(u64::try_from(lease_left_ms).unwrap_or(0));
    Some(Holder::new(
        &held.owner,
        held.count,
        held.token,
        held_for,
        left,
    ))
}

/// The one holder named by items 2 (its value, of `shape`; empty: nobody holds the lock) and
/// 3 (its lease left, in ms) of the `info` reply `items` of the call `what`, with the server
/// clock `now` (µs) its items 0 and 1 gave.
pub(crate) fn lone_holder(
    items: Vec<Value>,
    now: Option<u64>,
    shape: Shape,
    what: &str,
) -> Result<Option<Holder>> {
    let holder = match (items.get(2).and_then(text), items.get(3), now) {
        (Some(v), _, _) if v.is_empty() => return Ok(None),
        (Some(v), Some(ttl), Some(now)) => holder_of(&v, shape, int(ttl).unwrap_or(0), now),
        _ => None,
    };
    holder
        .map(Some)
        .ok_or_else(|| unexpected(what, &Value::Array(items)))
}

/// The holders of a flat list `[value, lease left in ms, ...]` of an `info` reply.
pub(crate) fn holders_of(v: &Value, shape: Shape, now_us: u64) -> Option<Vec<Holder>> {
    let Value::Array(items) = v else { return None };
    items
        .chunks(2)
        .map(|p| match p {
            [value, left] => holder_of(&text(value)?, shape, int(left)?, now_us),
            _ => None,
        })
        .collect()
}

/// The values a `force_unlock` removed: one string, or a list of them; empty strings (nothing
/// held there) left out.
pub(crate) fn removed(v: &Value) -> Option<Vec<String>> {
    let all = match v {
        Value::Array(items) => items.iter().map(text).collect::<Option<Vec<_>>>()?,
        other => vec![text(other)?],
    };
    Some(all.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Logs (at `warn`, under `target`, the lock type's module) the holders (`role`: holder,
/// writer, reader) a `force_unlock` of the lock `what` `name` removed, by label and thread.
pub(crate) fn log_forced(
    (target, what, name): (&str, &str, &str),
    role: &str,
    removed: &[String],
    shape: Shape,
) {
    let who: Vec<String> = removed
        .iter()
        .map(|v| match parse_held(v, shape) {
            Some(h) => {
                let (label, thread) = parse_owner(&h.owner);
                format!("{label} (thread {thread})")
            }
            None => "an unreadable holder".to_owned(),
        })
        .collect();
    log::warn!(
        target: target,
        "force_unlock of {what} `{name}` removed its {role}{}: {}",
        if who.len() == 1 { "" } else { "s" },
        who.join(", ")
    );
}
