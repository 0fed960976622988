//! Lock names and the Redis keys derived from them.
//!
//! For prefix `P` and name `N`, the lock uses three Redis names that share one hash tag, so
//! that they land in one Redis Cluster slot whatever `N` contains:
//!
//! | what | name |
//! |---|---|
//! | lock (hash: `owner`, `count`, `token`, `gen`, `req`, `rel`) | `P{T}:lock` |
//! | fencing counter (integer, expires [`FENCE_TTL`] after its last write) | `P{T}:fence` |
//! | release channel | `P{T}:released` |
//!
//! `T` is `N` with `%` written as `%25`, `{` as `%7B` and `}` as `%7D`. The escape is
//! injective, so two names never share keys, and the tag never contains a brace, so Redis
//! hashes exactly `T`. The prefix may not contain braces (checked by the builder), so the
//! first `{` of every key is the tag's.

use std::time::Duration;

use crate::error::{Error, Result};

/// How long a lock's fencing counter outlives its last write (a grant, or with a quorum a
/// renewal or release that raised it). The scripts hold the same value (`FENCE_TTL_MS`), and
/// `acquire.lua` explains why tokens stay strictly increasing after the counter expired: a
/// token leads the granting server's clock by far less than this, and the counter expires by
/// that same clock.
#[cfg_attr(not(test), allow(dead_code))] // the scripts carry it; a unit test checks they agree
pub(crate) const FENCE_TTL: Duration = Duration::from_secs(24 * 3600);

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Checks a lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no NUL byte.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "the name is empty"
    } else if name.len() > MAX_NAME_LEN {
        "the name is longer than 1024 bytes"
    } else if name.contains('\0') {
        "the name contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName { reason })
}

/// Checks a key prefix: no braces (they would move the cluster hash tag), at most 256 bytes.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.contains(['{', '}']) {
        return Err(Error::config("key_prefix", "must not contain '{' or '}'"));
    }
    if prefix.len() > 256 {
        return Err(Error::config("key_prefix", "must be at most 256 bytes"));
    }
    if prefix.contains('\0') {
        return Err(Error::config("key_prefix", "must not contain a NUL byte"));
    }
    Ok(())
}

/// The Redis names of one lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LockKeys {
    /// The user's name for the lock.
    pub(crate) name: String,
    /// The hash that holds owner, re-entry count and token.
    pub(crate) lock: String,
    /// The fencing counter.
    pub(crate) fence: String,
    /// The channel a release is published on.
    pub(crate) channel: String,
}

impl LockKeys {
    /// Derives the keys of `name` under `prefix`; both must already be validated.
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let mut tag = String::with_capacity(name.len() + 2);
        for c in name.chars() {
            match c {
                '%' => tag.push_str("%25"),
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                c => tag.push(c),
            }
        }
        let base = format!("{prefix}{{{tag}}}");
        LockKeys {
            name: name.to_owned(),
            lock: format!("{base}:lock"),
            fence: format!("{base}:fence"),
            channel: format!("{base}:released"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(validate_name("").is_err());
        assert!(validate_name("a\0b").is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        for ok in [
            "a",
            "account:42",
            "é ü 名前",
            "with space",
            "new\nline",
            "*?[]{}",
        ] {
            assert!(validate_name(ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn prefixes_are_validated() {
        assert!(validate_prefix("locksmith:").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("a{b").is_err());
        assert!(validate_prefix("a}b").is_err());
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = LockKeys::new("locksmith:", "account:42");
        assert_eq!(k.lock, "locksmith:{account:42}:lock");
        assert_eq!(k.fence, "locksmith:{account:42}:fence");
        assert_eq!(k.channel, "locksmith:{account:42}:released");
    }

    #[test]
    fn braces_are_escaped_injectively() {
        let a = LockKeys::new("p:", "{x}");
        assert_eq!(a.lock, "p:{%7Bx%7D}:lock");
        let b = LockKeys::new("p:", "%7Bx%7D");
        assert_eq!(b.lock, "p:{%257Bx%257D}:lock");
        assert_ne!(a.lock, b.lock);
        // The hash tag is everything between the first '{' and the next '}'.
        for k in [&a, &b] {
            for key in [&k.lock, &k.fence, &k.channel] {
                let open = key.find('{').unwrap_or(0);
                let close = key[open..].find('}').unwrap_or(0) + open;
                assert_eq!(&key[..open], "p:");
                assert!(!key[open + 1..close].contains('{'));
            }
        }
    }
}
