//! The fair mutex's calls (`scripts/fair_mutex.lua`, one script whose first argument names
//! the operation in one letter), and what their replies mean (its acquire and release replies
//! are parsed by `scripts.rs`'s [`parse_grant`](crate::protocol::scripts::parse_grant) and
//! the Mutex's [`parse_release`](crate::protocol::mutex::parse_release)).
//!
//! An uncontended acquire and release take the fewest arguments the script accepts: the holder
//! as one string (`GEN|OWNER`, or the prefix `GEN|` that names an acquisition), the lease, and
//! what the operation needs besides.

use std::time::Duration;

use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::{
    Admin, Call, Holder, Level, Live, Which, extend_ms, member, millis, named,
};

/// A call of the fair mutex's script with its keys (the lock, the queue, the waiters'
/// heartbeats and the name's fencing mark: every operation may grant the lock to a waiter),
/// then the release marker when `marker`; the caller adds the arguments.
fn fair(keys: &LockKeys, marker: bool) -> Call {
    let lock = &keys.lock;
    let [queue, waiters, released] =
        ["queue", "waiters", "released"].map(|k| format!("{lock}:{k}"));
    let all = [lock, &queue, &waiters, &keys.fence, &released].map(String::as_str);
    Call::new(Which::Fair, &all[..if marker { 5 } else { 4 }])
}

/// A fair mutex acquire for acquisition `request` of `owner` (`enqueue`: join the queue when not
/// granted, or keep its place there for `lease`; `live`: the calling thread's live hold, a
/// re-entry). `lease` is also that of a new acquisition, unless `fixed` gives a fixed lease for
/// it, which a grant to this very call made earlier then takes from now.
pub(crate) fn acquire(
    keys: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    enqueue: bool,
    live: Option<Live<'_>>,
    fixed: Option<Duration>,
) -> Call {
    let call = fair(keys, false)
        .arg("a")
        .arg(member(owner, request))
        .arg(millis(lease));
    if live.is_none() && fixed.is_none() {
        return call.arg_if(enqueue, "1");
    }
    let (acquisition, extend) = live.map_or(("", 0), |l| (l.acquisition, extend_ms(l.extend)));
    let call = call
        .arg(if enqueue { "1" } else { "0" })
        .arg(acquisition)
        .arg(extend);
    match fixed {
        Some(f) => call.arg(millis(f)),
        None => call,
    }
}

/// A fair mutex release of `level` of `holder`'s acquisition; `request` names an inner level's
/// release (a retry of the same call releases nothing twice). A retry sends the same call.
pub(crate) fn release(keys: &LockKeys, holder: Holder<'_>, level: Level, request: &str) -> Call {
    let call = fair(keys, true).arg("r").arg(named(holder.acquisition));
    match level {
        Level::Inner => call.arg(request).arg("1"),
        Level::Outermost => call,
    }
}

/// A fair mutex renewal: the caller's lock, or its place in the queue (its heartbeat).
pub(crate) fn renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration) -> Call {
    let who = member(holder.owner, holder.acquisition);
    fair(keys, false).arg("n").arg(who).arg(millis(lease))
}

/// A waiter leaves the fair mutex's queue.
pub(crate) fn cancel(keys: &LockKeys, owner: &str, request: &str) -> Call {
    fair(keys, false).arg("c").arg(member(owner, request))
}

/// An operator's call: the fair mutex's holder (and its TTL), its live waiters and the server
/// clock; or a force, which frees it whoever holds it and grants it to the first live waiter.
pub(crate) fn admin(keys: &LockKeys, op: Admin) -> Call {
    fair(keys, false).arg(op.letter())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scripts::{HOLDER, LEASE, args};

    #[test]
    fn uncontended_calls_send_few_arguments() {
        let fair = LockKeys::family("p:", "a", "fair", "grant:");
        let live = Live {
            acquisition: "l",
            extend: Duration::from_millis(1500),
        };
        assert_eq!(
            &args(&acquire(&fair, "o", "g", LEASE, false, None, None))[2..],
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
            &args(&release(&fair, HOLDER, Level::Outermost, "r"))[7..],
            ["p:{a}:fair:released", "r", "g|"]
        );
        assert_eq!(
            &args(&release(&fair, HOLDER, Level::Inner, "r"))[8..],
            ["r", "g|", "r", "1"]
        );
        assert_eq!(
            &args(&acquire(&fair, "o", "g", LEASE, false, Some(live), None))[7..],
            ["a", "g|o", "3000", "0", "l", "1500"]
        );
        let fixed = Some(Duration::from_millis(300));
        assert_eq!(
            &args(&acquire(&fair, "o", "g", LEASE, true, None, fixed))[7..],
            ["a", "g|o", "3000", "1", "", "0", "300"]
        );
    }
}
