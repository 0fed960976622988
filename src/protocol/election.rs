//! The election's own call (`scripts/election.lua`: announce a leader, proclaim its value,
//! read both) and the parsing of its replies; its leadership is a Mutex (see `mutex.rs`).

use redis::Value;

use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::{AdminReply, parse_admin};
use crate::protocol::scripts::{Call, Which, int, text};

/// What an election call does (`scripts/election.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ElectionOp<'a> {
    /// Announce the leadership of this acquisition.
    Announce(&'a str),
    /// Store the value of this acquisition's leadership.
    Proclaim(&'a str, &'a str),
    /// Read the leader and its value.
    Leader,
}

/// The election call `op` on the election `keys`, whose leader's value is `value_key`.
pub(crate) fn call(keys: &LockKeys, value_key: &str, op: ElectionOp<'_>) -> Call {
    let call = Call::new(Which::Election, &[&keys.lock, value_key, &keys.channel]);
    match op {
        ElectionOp::Announce(acquisition) => call.arg("announce").arg(acquisition),
        ElectionOp::Proclaim(acquisition, value) => {
            call.arg("proclaim").arg(acquisition).arg(value)
        }
        ElectionOp::Leader => call.arg("leader"),
    }
}

/// The reply of an election's `announce` or `proclaim`: `Some(true)` done, `Some(false)` the
/// acquisition does not hold the lock; `None` for a foreign key or a reply of another shape.
pub(crate) fn parse_done(v: &Value) -> Option<bool> {
    match int(v)? {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

/// The reply of an election's `leader`: what the admin script's `holder` would say of the
/// lock, and the leader's stored value (`GEN|VALUE`) when there is one.
pub(crate) fn parse_leader(v: &Value) -> Option<(AdminReply, Option<String>)> {
    let Value::Array(items) = v else { return None };
    match items.as_slice() {
        [first, rest @ ..] if int(first) == Some(1) && rest.len() == 5 => {
            let admin = parse_admin(&Value::Array(items[..5].to_vec()))?;
            let said = match &items[5] {
                Value::Nil | Value::Int(0) | Value::Boolean(false) => None,
                other => Some(text(other)?),
            };
            Some((admin, said))
        }
        _ => Some((parse_admin(v)?, None)),
    }
}
