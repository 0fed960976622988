//! Names that never collide between tests or runs, and the Redis keys of a lock name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The default key prefix of the library.
pub const PREFIX: &str = "locksmith:";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// `PID-COUNTER-NANOS`: unique to this call among every process of the host.
pub fn unique_suffix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{n}-{nanos}", std::process::id())
}

/// A lock name unique to this call: `prefix-PID-COUNTER-NANOS`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", unique_suffix())
}

/// The name as it appears inside the braces of a key: `%`, `{`, `}` percent-encoded.
pub fn encode_name(name: &str) -> String {
    name.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// `P{T}:lock` for the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("{PREFIX}{{{}}}:lock", encode_name(name))
}

/// `P{T}:fence` for the default prefix.
pub fn fence_key(name: &str) -> String {
    format!("{PREFIX}{{{}}}:fence", encode_name(name))
}

/// `P{T}:released` for the default prefix.
pub fn release_channel(name: &str) -> String {
    format!("{PREFIX}{{{}}}:released", encode_name(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_keys_encoded() {
        assert_ne!(unique_name("a"), unique_name("a"));
        assert_eq!(lock_key("a{b}%"), "locksmith:{a%7Bb%7D%25}:lock");
        assert_eq!(fence_key("x"), "locksmith:{x}:fence");
        assert_eq!(release_channel("x"), "locksmith:{x}:released");
    }
}
