//! The script calls of the lock types other than the plain mutex (fair mutex, read-write lock,
//! semaphore), and what their fast replies mean.
//!
//! The fair mutex and the semaphore have one script each (`scripts/fair_mutex.lua`,
//! `sem_permits.lua`) whose first argument names the operation in one letter; the read-write
//! lock has one script per operation (`scripts/rw_*.lua`). An uncontended acquire and release
//! take the fewest arguments the scripts accept: the holder as one string (`GEN|OWNER`, or the
//! prefix `GEN|` that names an acquisition), the lease, and what the operation needs besides.
//!
//! The replies these scripts share with no other are parsed here too ([`parse_acquire`],
//! [`parse_family_release`], [`parse_reenter`], [`parse_used`]).

use std::time::Duration;

use redis::Value;

use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::{
    AcquireReply, Call, Holder, Level, Live, ReleaseReply, Which, evalsha, int, millis,
};

/// The holder string a grant starts with: `GEN|OWNER`.
fn member(owner: &str, request: &str) -> String {
    format!("{request}|{owner}")
}

/// The prefix that names an acquisition: `GEN|`.
fn acquisition(holder: Holder<'_>) -> String {
    format!("{}|", holder.acquisition)
}

fn call(which: Which, keys: &[&str], args: &[&str]) -> Call {
    let mut cmd = evalsha(which, keys);
    cmd.arg(args);
    Call { which, cmd }
}

/// The fair mutex's keys: the lock, the queue, the waiters' heartbeats and the name's fencing
/// mark (every operation may grant the lock to a waiter).
fn fair_keys(keys: &LockKeys) -> [String; 4] {
    [
        keys.lock.clone(),
        format!("{}:queue", keys.lock),
        format!("{}:waiters", keys.lock),
        keys.fence.clone(),
    ]
}

/// A fair mutex acquire for acquisition `request` of `owner` (`enqueue`: join the queue when not
/// granted; `live`: the calling thread's live hold, a re-entry).
pub(crate) fn fair_acquire(
    keys: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    enqueue: bool,
    live: Option<Live<'_>>,
) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    let who = member(owner, request);
    let lease = millis(lease).to_string();
    let mut args = vec!["a", who.as_str(), lease.as_str()];
    let extend;
    match live {
        Some(l) => {
            extend = if l.extend.is_zero() {
                0
            } else {
                millis(l.extend)
            }
            .to_string();
            args.extend([if enqueue { "1" } else { "0" }, l.acquisition, &extend]);
        }
        None if enqueue => args.push("1"),
        None => {}
    }
    call(Which::Fair, &[&lock, &queue, &waiters, &fence], &args)
}

/// A fair mutex release of `level` of `holder`'s acquisition; `request` names an inner level's
/// release (a retry of the same call releases nothing twice). A retry sends the same call.
pub(crate) fn fair_release(
    keys: &LockKeys,
    holder: Holder<'_>,
    level: Level,
    request: &str,
) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    let marker = format!("{}:released", keys.lock);
    let named = acquisition(holder);
    let mut args = vec!["r", named.as_str()];
    if level == Level::Inner {
        args.extend([request, "1"]);
    }
    call(
        Which::Fair,
        &[&lock, &queue, &waiters, &fence, &marker],
        &args,
    )
}

/// A fair mutex renewal: the caller's lock, or its place in the queue (its heartbeat).
pub(crate) fn fair_renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    let who = member(holder.owner, holder.acquisition);
    let lease = millis(lease).to_string();
    call(
        Which::Fair,
        &[&lock, &queue, &waiters, &fence],
        &["n", &who, &lease],
    )
}

/// A waiter leaves the fair mutex's queue.
pub(crate) fn fair_cancel(keys: &LockKeys, owner: &str, request: &str) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    let who = member(owner, request);
    call(
        Which::Fair,
        &[&lock, &queue, &waiters, &fence],
        &["c", &who],
    )
}

/// The read-write lock's keys, from the writer's `P{T}:rw`: the writer, the readers, and the
/// waiting writers, deferring readers and eager readers.
fn rw_keys(write: &LockKeys) -> [String; 5] {
    let w = &write.lock;
    [
        w.clone(),
        format!("{w}:readers"),
        format!("{w}:wwait"),
        format!("{w}:rwait"),
        format!("{w}:eager"),
    ]
}

/// Which hold of a read-write lock a call concerns, as the scripts name it.
fn side(read: bool) -> &'static str {
    if read { "read" } else { "write" }
}

/// A write acquire (`register`: register as a waiting writer when not granted).
pub(crate) fn rw_write(
    write: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    register: bool,
) -> Call {
    let keys = rw_keys(write);
    let who = member(owner, request);
    let lease = millis(lease).to_string();
    let mut args = vec![who.as_str(), lease.as_str()];
    if register {
        args.push("1");
    }
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    keys.push(&write.fence);
    call(Which::RwWrite, &keys, &args)
}

/// A read acquire (`defer`: defer to waiting writers; `register`: register as a waiting reader
/// when not granted).
pub(crate) fn rw_read(
    write: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    defer: bool,
    register: bool,
) -> Call {
    let keys = rw_keys(write);
    let who = member(owner, request);
    let lease = millis(lease).to_string();
    let mode = if defer { "defer" } else { "eager" };
    let mut args = vec![mode, who.as_str(), lease.as_str()];
    // Only a registering reader needs the waiting readers' sets.
    let keys: Vec<&str> = if register {
        args.push("1");
        keys.iter().map(String::as_str).collect()
    } else {
        keys[..3].iter().map(String::as_str).collect()
    };
    call(Which::RwRead, &keys, &args)
}

/// The release of `holder`'s write (`read` false) or read acquisition; `keys` are the hold's
/// (the writer's `P{T}:rw` or the readers' `P{T}:rw:readers`). `publish`: threads of the
/// caller's client wait to write, so a release that frees the lock for a writer publishes
/// whether or not a waiter flagged it (they queue in the client, not on the server). A retry
/// sends the same call.
pub(crate) fn rw_release(keys: &LockKeys, holder: Holder<'_>, read: bool, publish: bool) -> Call {
    let named = acquisition(holder);
    let marker = if read {
        let root = keys.lock.strip_suffix(":readers").unwrap_or(&keys.lock);
        format!("{root}:released:{}", holder.acquisition)
    } else {
        format!("{}:released", keys.lock)
    };
    let side = side(read);
    let args: &[&str] = if publish {
        &[side, &named, "p"]
    } else {
        &[side, &named]
    };
    call(Which::RwRelease, &[&keys.lock, &marker], args)
}

/// The renewal of `holder`'s write or read acquisition (`keys`: the hold's, as for
/// [`rw_release`]).
pub(crate) fn rw_renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration, read: bool) -> Call {
    let named = acquisition(holder);
    let lease = millis(lease).to_string();
    call(Which::RwRenew, &[&keys.lock], &[side(read), &named, &lease])
}

/// A re-entry of `holder`'s write or read acquisition, which must have `extend` left after it
/// (zero: the expiry is left as it is).
pub(crate) fn rw_reenter(
    write: &LockKeys,
    holder: Holder<'_>,
    read: bool,
    extend: Duration,
) -> Call {
    let [w, r, ..] = rw_keys(write);
    let named = acquisition(holder);
    let ms = if extend.is_zero() { 0 } else { millis(extend) }.to_string();
    call(Which::RwReenter, &[&w, &r], &[side(read), &named, &ms])
}

/// A waiter leaves the read-write lock's waiting sets.
pub(crate) fn rw_cancel(write: &LockKeys, owner: &str, request: &str) -> Call {
    let keys = rw_keys(write);
    let who = member(owner, request);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    call(Which::RwCancel, &keys, &[&who])
}

/// A semaphore acquire of `n` permits, for a handle of `permits` (`waits`: the caller waits for
/// a release when not granted, and flags the semaphore so that a release publishes).
pub(crate) fn sem_acquire(
    keys: &LockKeys,
    owner: &str,
    request: &str,
    n: u32,
    permits: u32,
    lease: Duration,
    waits: bool,
) -> Call {
    let who = format!("{request}|{owner}|{n}");
    let lease = millis(lease).to_string();
    let permits = permits.to_string();
    let mut args = vec!["a", who.as_str(), lease.as_str(), permits.as_str()];
    if waits {
        args.push("1");
    }
    call(Which::Sem, &[&keys.lock], &args)
}

/// The release of `holder`'s permits. A retry sends the same call.
pub(crate) fn sem_release(keys: &LockKeys, holder: Holder<'_>) -> Call {
    let named = acquisition(holder);
    let marker = format!("{}:released:{}", keys.lock, holder.acquisition);
    call(Which::Sem, &[&keys.lock, &marker], &["r", &named])
}

/// The renewal of `holder`'s permits.
pub(crate) fn sem_renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration) -> Call {
    let named = acquisition(holder);
    let lease = millis(lease).to_string();
    call(Which::Sem, &[&keys.lock], &["n", &named, &lease])
}

/// The permits held by live leases.
pub(crate) fn sem_used(keys: &LockKeys) -> Call {
    call(Which::Sem, &[&keys.lock], &["u"])
}

/// The fair mutex's holder (and its TTL), its live waiters and the server clock.
pub(crate) fn fair_info(keys: &LockKeys) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    call(Which::Fair, &[&lock, &queue, &waiters, &fence], &["i"])
}

/// Frees the fair mutex whoever holds it; the first live waiter is granted it.
pub(crate) fn fair_force(keys: &LockKeys) -> Call {
    let [lock, queue, waiters, fence] = fair_keys(keys);
    call(Which::Fair, &[&lock, &queue, &waiters, &fence], &["f"])
}

/// The read-write lock's writer (and its TTL), readers, registered waiters and the server clock.
pub(crate) fn rw_info(write: &LockKeys) -> Call {
    let keys = rw_keys(write);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    call(Which::RwAdmin, &keys, &["info"])
}

/// Frees the read-write lock's writer and every reader, and wakes every waiter.
pub(crate) fn rw_force(write: &LockKeys) -> Call {
    let [w, r, ..] = rw_keys(write);
    call(Which::RwAdmin, &[&w, &r], &["force"])
}

/// The semaphore's holders (with their leases left) and the server clock.
pub(crate) fn sem_info(keys: &LockKeys) -> Call {
    call(Which::Sem, &[&keys.lock], &["i"])
}

/// Frees every permit of the semaphore, and wakes every waiter.
pub(crate) fn sem_force(keys: &LockKeys) -> Call {
    call(Which::Sem, &[&keys.lock], &["f"])
}

/// What a holder's value (or sorted set member) says: its owner id, its count (levels, or
/// permits), its fencing token (0 where none) and the server clock at its grant in µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) owner: String,
    pub(crate) count: u32,
    pub(crate) token: u64,
    pub(crate) since_us: Option<u64>,
}

/// The server clock at a grant, from its `S` and `US` fields, in µs.
fn micros(s: &str, us: &str) -> Option<u64> {
    s.parse::<u64>()
        .ok()?
        .checked_mul(1_000_000)?
        .checked_add(us.parse().ok()?)
}

/// A value's fields, its trailing flags (`|` and letters) left out.
fn fields(v: &str) -> Vec<&str> {
    let mut f: Vec<&str> = v.split('|').collect();
    if f.len() > 1
        && f.last()
            .is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        f.pop();
    }
    f
}

/// The kinds of holder values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A fair mutex: `GEN|OWNER|S|US`, or `GEN|OWNER|S|US|REQ|REL|COUNT`; a token.
    Fair,
    /// A read-write lock's writer: `GEN|OWNER|S|US`; a token.
    Writer,
    /// A reader: `GEN|OWNER|S|US`; no token.
    Reader,
    /// A semaphore's holder: `GEN|OWNER|N|S|US`; no token.
    Permits,
}

/// Parses a holder's value of `shape`, as the scripts' `i` and `f` operations return them.
pub(crate) fn parse_held(v: &str, shape: Shape) -> Option<Held> {
    let f = fields(v);
    match (shape, f.as_slice()) {
        (Shape::Permits, [_, owner, n, s, us]) => Some(Held {
            owner: (*owner).to_owned(),
            count: n.parse().ok()?,
            token: 0,
            since_us: Some(micros(s, us)?),
        }),
        (Shape::Fair, [_, owner, s, us, rest @ ..]) if rest.is_empty() || rest.len() == 3 => {
            let since = micros(s, us)?;
            Some(Held {
                owner: (*owner).to_owned(),
                count: rest.get(2).map_or(Some(1), |c| c.parse().ok())?,
                token: since,
                since_us: Some(since),
            })
        }
        (Shape::Writer | Shape::Reader, [_, owner, s, us]) => {
            let since = micros(s, us)?;
            Some(Held {
                owner: (*owner).to_owned(),
                count: 1,
                token: if shape == Shape::Writer { since } else { 0 },
                since_us: Some(since),
            })
        }
        _ => None,
    }
}

/// An acquire reply of one of these scripts for acquisition `request`: the fast reply (a grant
/// on a free lock) is one integer, the fencing token (`1` where the type has none); the other
/// replies are the acquire script's (see [`crate::protocol::scripts::parse_acquire`]).
pub(crate) fn parse_acquire(v: &Value, request: &str) -> Option<AcquireReply> {
    match v {
        Value::Int(token) => {
            let token = u64::try_from(*token).ok()?;
            Some(AcquireReply::Held {
                token,
                count: 1,
                acquisition: request.to_owned(),
                last: token,
            })
        }
        _ => crate::protocol::scripts::parse_acquire(v),
    }
}

/// Parses the release reply of a fair mutex (`scripts/fair_mutex.lua`), a read-write lock
/// (`rw_release.lua`) or a semaphore (`sem_permits.lua`): `0` released (for a fair mutex's
/// inner level, `n >= 1` levels are left), `-1` [`ReleaseReply::Missing`], `-2`
/// [`ReleaseReply::OtherOwner`], `-3` [`ReleaseReply::Foreign`], `-4`
/// [`ReleaseReply::ReleasedBefore`]. Nothing is published that the caller counts, so
/// `listeners` is 0. `None` for a reply of another shape.
pub(crate) fn parse_family_release(v: &Value) -> Option<ReleaseReply> {
    match v {
        Value::Int(n) if *n >= 0 => Some(ReleaseReply::Released {
            remaining: n.unsigned_abs(),
            listeners: 0,
        }),
        Value::Int(-1) => Some(ReleaseReply::Missing),
        Value::Int(-2) => Some(ReleaseReply::OtherOwner),
        Value::Int(-3) => Some(ReleaseReply::Foreign),
        Value::Int(-4) => Some(ReleaseReply::ReleasedBefore),
        _ => None,
    }
}

/// Parses a read-write lock's re-entry reply ([`rw_reenter`]): `Some(true)` the acquisition
/// still holds (one more level), `Some(false)` it does not any more; `None` for a reply of
/// another shape.
pub(crate) fn parse_reenter(v: &Value) -> Option<bool> {
    match v {
        Value::Int(1) => Some(true),
        Value::Int(0) => Some(false),
        _ => None,
    }
}

/// Parses a semaphore's permits-used reply ([`sem_used`]): the permits live leases hold.
/// `None` for a reply of another shape.
pub(crate) fn parse_used(v: &Value) -> Option<u32> {
    match v {
        Value::Int(_) => Some(u32::try_from(int(v)?).unwrap_or(u32::MAX)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scripts::args;

    #[test]
    fn uncontended_calls_send_few_arguments() {
        let holder = Holder {
            owner: "o",
            acquisition: "g",
        };
        let lease = Duration::from_secs(3);
        let fair = LockKeys::family("p:", "a", "fair", "grant:");
        assert_eq!(
            &args(&fair_acquire(&fair, "o", "g", lease, false, None))[2..],
            [
                "4",
                "p:{a}:fair",
                "p:{a}:fair:queue",
                "p:{a}:fair:waiters",
                "p:{#17817}:fence",
                "a",
                "g|o",
                "3000"
            ]
        );
        assert_eq!(
            &args(&fair_release(&fair, holder, Level::Outermost, "r"))[7..],
            ["p:{a}:fair:released", "r", "g|"]
        );
        assert_eq!(
            &args(&fair_release(&fair, holder, Level::Inner, "r"))[8..],
            ["r", "g|", "r", "1"]
        );
        let live = Live {
            acquisition: "l",
            extend: Duration::from_millis(1500),
        };
        assert_eq!(
            &args(&fair_acquire(&fair, "o", "g", lease, false, Some(live)))[7..],
            ["a", "g|o", "3000", "0", "l", "1500"]
        );
        let sem = LockKeys::family("p:", "a", "sem", "released");
        assert_eq!(
            &args(&sem_acquire(&sem, "o", "g", 2, 4, lease, false))[2..],
            ["1", "p:{a}:sem", "a", "g|o|2", "3000", "4"]
        );
        assert_eq!(
            &args(&sem_release(&sem, holder))[2..],
            ["2", "p:{a}:sem", "p:{a}:sem:released:g", "r", "g|"]
        );
        let rw = LockKeys::family("p:", "a", "rw", "free");
        assert_eq!(
            &args(&rw_read(&rw, "o", "g", lease, true, false))[2..],
            [
                "3",
                "p:{a}:rw",
                "p:{a}:rw:readers",
                "p:{a}:rw:wwait",
                "defer",
                "g|o",
                "3000"
            ]
        );
        let write = args(&rw_write(&rw, "o", "g", lease, true));
        assert_eq!(
            (write[2].as_str(), write[8].as_str()),
            ("6", "p:{#17817}:fence")
        );
        let readers = LockKeys {
            lock: "p:{a}:rw:readers".into(),
            ..rw.clone()
        };
        assert_eq!(
            &args(&rw_release(&readers, holder, true, false))[2..],
            ["2", "p:{a}:rw:readers", "p:{a}:rw:released:g", "read", "g|"]
        );
        assert_eq!(
            &args(&rw_release(&rw, holder, false, true))[2..],
            ["2", "p:{a}:rw", "p:{a}:rw:released", "write", "g|", "p"]
        );
    }

    fn held(owner: &str, count: u32, token: u64, since_us: Option<u64>) -> Option<Held> {
        Some(Held {
            owner: owner.to_owned(),
            count,
            token,
            since_us,
        })
    }

    #[test]
    fn holder_values_parse() {
        let since = 1_764_000_000_000_042;
        let token = since;
        assert_eq!(
            parse_held("g|o:1/web/t|1764000000|42", Shape::Fair),
            held("o:1/web/t", 1, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|r||3|w", Shape::Fair),
            held("o", 3, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|wd", Shape::Writer),
            held("o", 1, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|w", Shape::Reader),
            held("o", 1, 0, Some(since))
        );
        assert_eq!(
            parse_held("g|o|3|1764000000|42", Shape::Permits),
            held("o", 3, 0, Some(since))
        );
        for bad in ["", "x", "g|o|s|us", "g|o|1|2|3", "o:1/g"] {
            assert_eq!(parse_held(bad, Shape::Writer), None, "{bad}");
        }
    }

    #[test]
    fn a_fast_grant_is_one_integer() {
        assert_eq!(
            parse_acquire(&Value::Int(1_764_000_000_000_000), "g"),
            Some(AcquireReply::Held {
                token: 1_764_000_000_000_000,
                count: 1,
                acquisition: "g".into(),
                last: 1_764_000_000_000_000,
            })
        );
        assert_eq!(parse_acquire(&Value::Int(-1), "g"), None);
        assert_eq!(
            parse_acquire(&Value::Array(vec![Value::Int(-1)]), "g"),
            Some(AcquireReply::Foreign)
        );
    }

    #[test]
    fn family_releases_reentries_and_permits_parse() {
        assert_eq!(
            parse_family_release(&Value::Int(0)),
            Some(ReleaseReply::Released {
                remaining: 0,
                listeners: 0
            })
        );
        assert_eq!(
            parse_family_release(&Value::Int(2)),
            Some(ReleaseReply::Released {
                remaining: 2,
                listeners: 0
            })
        );
        for (n, r) in [
            (-1, ReleaseReply::Missing),
            (-2, ReleaseReply::OtherOwner),
            (-3, ReleaseReply::Foreign),
            (-4, ReleaseReply::ReleasedBefore),
        ] {
            assert_eq!(parse_family_release(&Value::Int(n)), Some(r), "{n}");
        }
        assert_eq!(parse_family_release(&Value::Int(-5)), None);
        assert_eq!(parse_family_release(&Value::Nil), None);
        assert_eq!(
            parse_family_release(&Value::Array(vec![Value::Int(0), Value::Int(1)])),
            None
        );
        assert_eq!(parse_reenter(&Value::Int(1)), Some(true));
        assert_eq!(parse_reenter(&Value::Int(0)), Some(false));
        assert_eq!(parse_reenter(&Value::Int(2)), None);
        assert_eq!(parse_reenter(&Value::Nil), None);
        assert_eq!(parse_used(&Value::Int(3)), Some(3));
        assert_eq!(parse_used(&Value::Int(2_147_483_647)), Some(2_147_483_647));
        assert_eq!(parse_used(&Value::Int(i64::MAX)), Some(u32::MAX));
        assert_eq!(parse_used(&Value::Int(-1)), Some(u32::MAX));
        assert_eq!(parse_used(&Value::Nil), None);
    }

    #[test]
    fn read_write_calls_name_their_operation() {
        let holder = Holder {
            owner: "o",
            acquisition: "g",
        };
        let rw = LockKeys::family("p:", "a", "rw", "free");
        let lease = Duration::from_secs(3);
        let write = rw_write(&rw, "o", "g", lease, false);
        assert_eq!(write.which, Which::RwWrite);
        assert_eq!(&args(&write)[9..], ["g|o", "3000"]);
        let eager = rw_read(&rw, "o", "g", lease, false, true);
        assert_eq!(eager.which, Which::RwRead);
        assert_eq!(&args(&eager)[8..], ["eager", "g|o", "3000", "1"]);
        let renew = rw_renew(&rw, holder, lease, false);
        assert_eq!(renew.which, Which::RwRenew);
        assert_eq!(&args(&renew)[2..], ["1", "p:{a}:rw", "write", "g|", "3000"]);
        let reenter = rw_reenter(&rw, holder, true, Duration::ZERO);
        assert_eq!(&args(&reenter)[5..], ["read", "g|", "0"]);
        let cancel = rw_cancel(&rw, "o", "g");
        assert_eq!(cancel.which, Which::RwCancel);
        assert_eq!(&args(&cancel)[8..], ["g|o"]);
        assert_eq!(&args(&rw_info(&rw))[8..], ["info"]);
        assert_eq!(
            &args(&rw_force(&rw))[2..],
            ["2", "p:{a}:rw", "p:{a}:rw:readers", "force"]
        );
    }
}
