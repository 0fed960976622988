//! The semaphore's calls (`scripts/sem_permits.lua`, one script whose first argument names the
//! operation in one letter; its renewal is `renew_holder.lua`, shared with the read-write
//! lock's readers), and what their replies mean (its acquire and release replies are parsed by
//! `scripts.rs`'s [`parse_grant`](crate::protocol::scripts::parse_grant) and
//! [`parse_family_release`](crate::protocol::scripts::parse_family_release)).

use std::time::Duration;

use redis::Value;

use crate::protocol::keys::LockKeys;
use crate::protocol::scripts::{Admin, Call, Holder, Which, millis, named, renew_holder};

/// A semaphore acquire of `n` permits, for a handle of `permits` (`waits`: the caller waits for
/// a release when not granted, and flags the semaphore so that a release publishes).
pub(crate) fn acquire(
    keys: &LockKeys,
    owner: &str,
    request: &str,
    n: u32,
    permits: u32,
    lease: Duration,
    waits: bool,
) -> Call {
    Call::new(Which::Sem, &[&keys.lock])
        .arg("a")
        .arg(format!("{request}|{owner}|{n}"))
        .arg(millis(lease))
        .arg(permits)
        .arg_if(waits, "1")
}

/// The release of `holder`'s permits. A retry sends the same call.
pub(crate) fn release(keys: &LockKeys, holder: Holder<'_>) -> Call {
    let marker = format!("{}:released:{}", keys.lock, holder.acquisition);
    Call::new(Which::Sem, &[&keys.lock, &marker])
        .arg("r")
        .arg(named(holder.acquisition))
}

/// The renewal of `holder`'s permits (`renew_holder.lua`: its string, or its member of the
/// holders' sorted set).
pub(crate) fn renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration) -> Call {
    renew_holder(keys, "permits", holder, lease)
}

/// The permits held by live leases.
pub(crate) fn used(keys: &LockKeys) -> Call {
    Call::new(Which::Sem, &[&keys.lock]).arg("u")
}

/// An operator's call: the semaphore's holders (with their leases left) and the server clock;
/// or a force, which frees every permit and wakes every waiter.
pub(crate) fn admin(keys: &LockKeys, op: Admin) -> Call {
    Call::new(Which::Sem, &[&keys.lock]).arg(op.letter())
}

/// Parses a semaphore's permits-used reply ([`used`]): the permits live leases hold.
/// `None` for a reply of another shape.
pub(crate) fn parse_used(v: &Value) -> Option<u32> {
    let Value::Int(n) = v else { return None };
    Some(u32::try_from(*n).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scripts::{HOLDER, LEASE, args};

    #[test]
    fn calls_send_few_arguments() {
        let sem = LockKeys::family("p:", "a", "sem", "released");
        let renew = renew(&sem, HOLDER, LEASE);
        assert_eq!(renew.which, Which::RenewHolder);
        assert_eq!(
            &args(&renew)[2..],
            ["1", "p:{a}:sem", "permits", "g|", "3000"]
        );
        assert_eq!(
            &args(&acquire(&sem, "o", "g", 2, 4, LEASE, false))[2..],
            ["1", "p:{a}:sem", "a", "g|o|2", "3000", "4"]
        );
        assert_eq!(
            &args(&release(&sem, HOLDER))[2..],
            ["2", "p:{a}:sem", "p:{a}:sem:released:g", "r", "g|"]
        );
    }

    #[test]
    fn permits_used_parse() {
        assert_eq!(parse_used(&Value::Int(3)), Some(3));
        assert_eq!(parse_used(&Value::Int(2_147_483_647)), Some(2_147_483_647));
        assert_eq!(parse_used(&Value::Int(i64::MAX)), Some(u32::MAX));
        assert_eq!(parse_used(&Value::Int(-1)), Some(u32::MAX));
        assert_eq!(parse_used(&Value::Nil), None);
    }
}
