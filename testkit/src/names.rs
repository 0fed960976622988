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

/// The fencing mark of `name`'s hash slot for the default prefix: `P{#N}:fence`, with `#N`
/// the first tag of that form that hashes to the slot (as the library picks it).
pub fn fence_key(name: &str) -> String {
    let slot = key_slot(&encode_name(name));
    let n = (0u32..)
        .find(|n| key_slot(&format!("#{n}")) == slot)
        .unwrap_or_default();
    format!("{PREFIX}{{#{n}}}:fence")
}

/// The Redis Cluster hash slot of a hash tag: CRC16/XMODEM mod 16384.
pub fn key_slot(tag: &str) -> u16 {
    let crc = tag.bytes().fold(0u16, |mut crc, b| {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
        crc
    });
    crc % 16384
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
        // The library's own unit test pins the same tag (`keys::every_slot_has_a_mark_in_it`).
        assert_eq!(fence_key("x"), "locksmith:{#2329}:fence");
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(release_channel("x"), "locksmith:{x}:released");
    }
}
