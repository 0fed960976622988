//! What the lock types other than the plain mutex (fair mutex, read-write lock, semaphore)
//! share: their key names, and their one script call retried once on a new connection.

use redis::Value;

use crate::client::shared::Core;
use crate::error::Result;
use crate::protocol::keys::LockKeys;
use crate::protocol::scripts;
use crate::transport::conn::Deadline;

/// The keys of a lock type other than the plain mutex: `P{T}:<suffix>` for the main key, and
/// the channel prefix `P{T}:<suffix>:<channel>` (`fence` names the plain mutex's counter: these
/// types take their tokens from the server clock and write no counter).
pub(crate) fn family_keys(prefix: &str, name: &str, suffix: &str, channel: &str) -> LockKeys {
    let base = LockKeys::new(prefix, name);
    let root = base
        .fence
        .strip_suffix(":fence")
        .unwrap_or(&base.fence)
        .to_owned();
    LockKeys {
        name: base.name,
        lock: format!("{root}:{suffix}"),
        fence: base.fence,
        channel: format!("{root}:{suffix}:{channel}"),
        slot: base.slot,
    }
}

/// Runs a script call once, and once more at once (on a new connection: a failure clears the
/// pool) when the connection failed; both within one connect plus one command timeout, and
/// within `by`, as the plain mutex's attempt. The scripts recognise a retry by its ids.
pub(crate) fn eval_twice(client: &Core, call: &scripts::Call, by: Deadline) -> Result<Value> {
    let shared = client.shared();
    let by = by.min(Deadline::after(shared.config.one_call()));
    match shared.backend.eval_single(call, by) {
        Err(e) if e.is_retriable() && !by.passed() => shared.backend.eval_single(call, by),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_keys_share_the_hash_tag_and_the_fence() {
        let k = family_keys("p:", "a{b}", "fair", "grant:");
        assert_eq!(k.lock, "p:{a%7Bb%7D}:fair");
        assert_eq!(k.fence, "p:{a%7Bb%7D}:fence");
        assert_eq!(k.channel, "p:{a%7Bb%7D}:fair:grant:");
    }
}
