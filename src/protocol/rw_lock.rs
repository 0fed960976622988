//! The read-write lock's calls (`scripts/rw_*.lua`, one script per operation, and
//! `renew_holder.lua`, which the semaphore's holders share), and what their replies mean (its
//! acquire and release replies are parsed by `scripts.rs`'s
//! [`parse_grant`](crate::protocol::scripts::parse_grant) and
//! [`parse_family_release`](crate::protocol::scripts::parse_family_release)).
//!
//! An uncontended acquire and release take the fewest arguments the scripts accept: the holder
//! as one string (`GEN|OWNER`, or the prefix `GEN|` that names an acquisition), the lease, and
//! what the operation needs besides.

use std::time::Duration;

use redis::Value;

use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::{
    Admin, Call, Holder, Which, extend_ms, member, millis, named, renew_holder,
};

/// A call of `which` with the first `n` of the read-write lock's keys, from the writer's
/// `P{T}:rw`: the writer, the readers, the waiting writers, deferring readers and eager
/// readers, then the name's fencing mark (only a write acquire issues a token); the caller
/// adds the arguments.
fn rw(which: Which, write: &LockKeys, n: usize) -> Call {
    let w = &write.lock;
    let [r, ww, wr, we] = ["readers", "wwait", "rwait", "eager"].map(|k| format!("{w}:{k}"));
    let keys = [w, &r, &ww, &wr, &we, &write.fence].map(String::as_str);
    Call::new(which, &keys[..n])
}

/// Which hold of a read-write lock a call concerns, as the scripts name it.
fn side(read: bool) -> &'static str {
    if read { "read" } else { "write" }
}

/// A write acquire (`register`: register as a waiting writer when not granted).
pub(crate) fn write(
    write: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    register: bool,
) -> Call {
    rw(Which::RwWrite, write, 6)
        .arg(member(owner, request))
        .arg(millis(lease))
        .arg_if(register, "1")
}

/// A read acquire (`defer`: defer to waiting writers; `register`: register as a waiting reader
/// when not granted).
pub(crate) fn read(
    write: &LockKeys,
    owner: &str,
    request: &str,
    lease: Duration,
    defer: bool,
    register: bool,
) -> Call {
    // Only a registering reader needs the waiting readers' sets.
    rw(Which::RwRead, write, if register { 5 } else { 3 })
        .arg(if defer { "defer" } else { "eager" })
        .arg(member(owner, request))
        .arg(millis(lease))
        .arg_if(register, "1")
}

/// The release of `holder`'s write (`read` false) or read acquisition; `keys` are the hold's
/// (the writer's `P{T}:rw` or the readers' `P{T}:rw:readers`). `publish`: threads of the
/// caller's client wait to write, so a release that frees the lock for a writer publishes
/// whether or not a waiter flagged it (they queue in the client, not on the server). A retry
/// sends the same call.
pub(crate) fn release(keys: &LockKeys, holder: Holder<'_>, read: bool, publish: bool) -> Call {
    let marker = if read {
        let root = keys.lock.strip_suffix(":readers").unwrap_or(&keys.lock);
        format!("{root}:released:{}", holder.acquisition)
    } else {
        format!("{}:released", keys.lock)
    };
    Call::new(Which::RwRelease, &[&keys.lock, &marker])
        .arg(side(read))
        .arg(named(holder.acquisition))
        .arg_if(publish, "p")
}

/// The renewal of `holder`'s write or read acquisition (`keys`: the hold's, as for
/// [`release`]), by `renew_holder.lua`.
pub(crate) fn renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration, read: bool) -> Call {
    renew_holder(keys, side(read), holder, lease)
}

/// A re-entry of `holder`'s write or read acquisition, which must have `extend` left after it
/// (zero: the expiry is left as it is).
pub(crate) fn reenter(write: &LockKeys, holder: Holder<'_>, read: bool, extend: Duration) -> Call {
    rw(Which::RwReenter, write, 2)
        .arg(side(read))
        .arg(named(holder.acquisition))
        .arg(extend_ms(extend))
}

/// A waiter leaves the read-write lock's waiting sets.
pub(crate) fn cancel(write: &LockKeys, owner: &str, request: &str) -> Call {
    rw(Which::RwCancel, write, 5).arg(member(owner, request))
}

/// An operator's call: the read-write lock's writer (and its TTL), readers, registered waiters
/// and the server clock; or a force, which frees the writer and every reader, and wakes every
/// waiter.
pub(crate) fn admin(write: &LockKeys, op: Admin) -> Call {
    match op {
        Admin::Holder => rw(Which::RwAdmin, write, 5).arg("info"),
        Admin::Force => rw(Which::RwAdmin, write, 2).arg("force"),
    }
}

/// Parses a read-write lock's re-entry reply ([`reenter`]): `Some(true)` the acquisition
/// still holds (one more level), `Some(false)` it does not any more; `None` for a reply of
/// another shape.
pub(crate) fn parse_reenter(v: &Value) -> Option<bool> {
    match v {
        Value::Int(1) => Some(true),
        Value::Int(0) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scripts::{HOLDER, LEASE, args};

    #[test]
    fn read_and_release_calls_send_few_arguments() {
        let rw = LockKeys::family("p:", "a", "rw", "free");
        assert_eq!(
            &args(&read(&rw, "o", "g", LEASE, true, false))[2..],
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
        let write = args(&write(&rw, "o", "g", LEASE, true));
        assert_eq!(
            (write[2].as_str(), write[8].as_str()),
            ("6", "p:{#17817}:fence")
        );
        let readers = LockKeys {
            lock: "p:{a}:rw:readers".into(),
            ..rw.clone()
        };
        assert_eq!(
            &args(&release(&readers, HOLDER, true, false))[2..],
            ["2", "p:{a}:rw:readers", "p:{a}:rw:released:g", "read", "g|"]
        );
        assert_eq!(
            &args(&release(&rw, HOLDER, false, true))[2..],
            ["2", "p:{a}:rw", "p:{a}:rw:released", "write", "g|", "p"]
        );
    }

    #[test]
    fn read_write_calls_name_their_operation() {
        let rw = LockKeys::family("p:", "a", "rw", "free");
        let write = write(&rw, "o", "g", LEASE, false);
        assert_eq!(write.which, Which::RwWrite);
        assert_eq!(&args(&write)[9..], ["g|o", "3000"]);
        let eager = read(&rw, "o", "g", LEASE, false, true);
        assert_eq!(eager.which, Which::RwRead);
        assert_eq!(&args(&eager)[8..], ["eager", "g|o", "3000", "1"]);
        let renew = renew(&rw, HOLDER, LEASE, false);
        assert_eq!(renew.which, Which::RenewHolder);
        assert_eq!(&args(&renew)[2..], ["1", "p:{a}:rw", "write", "g|", "3000"]);
        let reenter = reenter(&rw, HOLDER, true, Duration::ZERO);
        assert_eq!(&args(&reenter)[5..], ["read", "g|", "0"]);
        let cancel = cancel(&rw, "o", "g");
        assert_eq!(cancel.which, Which::RwCancel);
        assert_eq!(&args(&cancel)[8..], ["g|o"]);
        assert_eq!(&args(&admin(&rw, Admin::Holder))[8..], ["info"]);
        assert_eq!(
            &args(&admin(&rw, Admin::Force))[2..],
            ["2", "p:{a}:rw", "p:{a}:rw:readers", "force"]
        );
    }

    #[test]
    fn reentries_parse() {
        assert_eq!(parse_reenter(&Value::Int(1)), Some(true));
        assert_eq!(parse_reenter(&Value::Int(0)), Some(false));
        assert_eq!(parse_reenter(&Value::Int(2)), None);
        assert_eq!(parse_reenter(&Value::Nil), None);
    }
}
