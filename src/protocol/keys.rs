//! Lock names and the Redis keys derived from them.
//!
//! For prefix `P` and name `N`, the lock uses three Redis names that share one hash tag, so
//! that they land in one Redis Cluster slot whatever `N` contains:
//!
//! | what | name |
//! |---|---|
//! | lock (a string: acquisition, owner, hand-off block, grant time, and after a re-entry the count and the last calls; see `scripts/acquire.lua`) | `P{T}:lock` |
//! | fencing mark of the name's hash slot (integer, the highest token any grant of a name of that slot issued; every lock type's grants raise it) | `P{#N}:fence` (see [`mark_number`]) |
//! | release channel, and the release marker key (the last released value) | `P{T}:released` |
//!
//! `T` is `N` with `%` written as `%25`, `{` as `%7B` and `}` as `%7D`. The escape is
//! injective, so two names never share keys, and the tag never contains a brace, so Redis
//! hashes exactly `T`. The prefix may not contain braces (checked by the builder), so the
//! first `{` of every key is the tag's. The escapes are [`percent_encode`]'s, which also
//! writes the parts of an owner id (`shared/holder.rs`).
//!
//! [`slot`] is the Redis Cluster hash slot of a tag (CRC16/XMODEM mod 16384, as Redis
//! computes it), so that calls covering several locks can be grouped by slot.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};

/// For each Redis Cluster hash slot, the smallest `N` whose tag `#N` hashes to it, plus one
/// (zero: not found yet): the slot's fencing mark is `P{#N}:fence`, in the same slot as every
/// name's keys there, so the scripts may touch it on a cluster too. One mark per slot (at
/// most 16,384 keys per prefix, never expiring) rather than one per name: a name used once
/// leaves no key behind for long, and a grant raises the mark with one `SET ... GET`, without
/// an expiry to set.
static MARK_TAGS: [AtomicU32; SLOTS as usize] = [const { AtomicU32::new(0) }; SLOTS as usize];

/// The next `N` whose tag `#N` the search of [`mark_number`] has not hashed yet.
static MARK_SEARCH: Mutex<u32> = Mutex::new(0);

/// The `N` of the fencing mark tag `#N` of `slot` (see [`MARK_TAGS`]). Found when first asked
/// for: the search hashes the tags in order from `#0` until one lands in `slot`, noting the
/// first tag of every slot it meets on the way, and goes on from there at the next miss
/// (about 170,000 tags for every slot, so about 16,000 for the first one).
fn mark_number(slot: u16) -> u32 {
    let mark = &MARK_TAGS[usize::from(slot % SLOTS)];
    if mark.load(Ordering::Relaxed) == 0 {
        let mut next = MARK_SEARCH.lock().unwrap_or_else(PoisonError::into_inner);
        while mark.load(Ordering::Relaxed) == 0 {
            let mut tag = [0; 20];
            let start = tag.len() - 1 - digits::<10>(u64::from(*next), &mut tag).len();
            tag[start] = b'#';
            let found = &MARK_TAGS[usize::from(crc16(&tag[start..]) % SLOTS)];
            if found.load(Ordering::Relaxed) == 0 {
                found.store(*next + 1, Ordering::Relaxed);
            }
            *next += 1;
        }
    }
    mark.load(Ordering::Relaxed) - 1
}

/// Writes `n` in base `RADIX` (2 to 16, lower-case hex digits) at the end of `buf`, and
/// returns the digits written.
pub(crate) fn digits<const RADIX: u64>(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = DIGITS[(n % RADIX) as usize];
        n /= RADIX;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Appends `n` in base `RADIX` to `out` (see [`digits`]).
pub(crate) fn push_digits<const RADIX: u64>(out: &mut String, n: u64) {
    out.extend(
        digits::<RADIX>(n, &mut [0; 20])
            .iter()
            .map(|&d| char::from(d)),
    );
}

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
    /// The lock: a string holding the acquisition, its owner, its grant time (its token) and
    /// its re-entry count.
    pub(crate) lock: String,
    /// The fencing mark of the name's hash slot (see [`mark_number`]), shared by every lock type
    /// and every name of the slot.
    pub(crate) fence: String,
    /// The channel a release is published on; also the key of a Mutex's release marker.
    pub(crate) channel: String,
    /// The Redis Cluster hash slot of all three (they share one hash tag).
    pub(crate) slot: u16,
}

/// The number of Redis Cluster hash slots.
pub(crate) const SLOTS: u16 = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0, no reflection), the checksum Redis
/// Cluster hashes keys with.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = (crc << 1) ^ if crc & 0x8000 != 0 { 0x1021 } else { 0 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16/XMODEM of `bytes`.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from(((crc >> 8) as u8) ^ b)]
    })
}

/// The Redis Cluster hash slot of a key: of its hash tag (what lies between the first `{`
/// and the next `}`, when that is not empty), else of the whole key.
pub(crate) fn slot(key: &str) -> u16 {
    let tag = key
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty());
    crc16(tag.unwrap_or(key).as_bytes()) % SLOTS
}

/// `name` as it appears inside the hash tag of its keys: `%`, `{` and `}` percent-encoded, so
/// that two names never share keys and the tag never holds a brace.
pub(crate) fn encode_name(name: &str) -> Cow<'_, str> {
    let special = |c| matches!(c, '%' | '{' | '}');
    if name.contains(special) {
        Cow::Owned(percent_encode(name, special))
    } else {
        Cow::Borrowed(name)
    }
}

/// `s` with each character that `special` picks written as the escapes of its UTF-8 bytes
/// (`%` and two upper-case hex digits: `{` is `%7B`).
pub(crate) fn percent_encode(s: &str, special: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        if special(c) {
            for b in c.encode_utf8(&mut [0; 4]).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Undoes [`encode_name`]: `None` for a tag that no name encodes to (a key locksmith did not
/// write).
pub(crate) fn decode_name(tag: &str) -> Option<String> {
    let mut out = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let c = match rest.get(i + 1..i + 3)? {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// `s` with the characters a `SCAN ... MATCH` pattern treats as special (`*`, `?`, `[`, `]`,
/// `\`) escaped, so that it matches itself.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `P{#N}:fence`: the fencing mark of `slot` under `prefix` (see [`mark_number`]).
pub(crate) fn mark_key(prefix: &str, slot: u16) -> String {
    let mut key = String::with_capacity(prefix.len() + 16);
    key.push_str(prefix);
    key.push_str("{#");
    push_digits::<10>(&mut key, u64::from(mark_number(slot)));
    key.push_str("}:fence");
    key
}

/// The key of the value the leader of an election proclaimed: `P{T}:elect:value`, beside
/// `keys` (see [`LockKeys::election`]).
pub(crate) fn election_value(keys: &LockKeys) -> String {
    [&keys.lock, ":value"].concat()
}

impl LockKeys {
    /// The keys of a lock type other than the plain mutex: `P{T}:<suffix>` for the main key,
    /// and the channel prefix `P{T}:<suffix>:<channel>` (`fence` is the name's fencing mark,
    /// which the plain mutex's grants raise too).
    pub(crate) fn family(prefix: &str, name: &str, suffix: &str, channel: &str) -> Self {
        let lock = [prefix, "{", &encode_name(name), "}:", suffix].concat();
        let channel = [&lock, ":", channel].concat();
        LockKeys::with(prefix, name, lock, channel)
    }

    /// The keys of the election `name` under `prefix`: its leadership is a Mutex on
    /// `P{T}:elect`, whose releases, announcements and proclamations are published on
    /// `P{T}:elect:changes` (also its release marker's key); the leader's value is
    /// [`election_value`].
    pub(crate) fn election(prefix: &str, name: &str) -> Self {
        LockKeys::family(prefix, name, "elect", "changes")
    }

    /// Derives the keys of `name` under `prefix`; both must already be validated.
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        let lock = [prefix, "{", &tag, "}:lock"].concat();
        let channel = [prefix, "{", &tag, "}:released"].concat();
        LockKeys::with(prefix, name, lock, channel)
    }

    /// The keys of `name` whose main key is `lock` and channel `channel`, with the fencing mark
    /// of `lock`'s hash slot.
    fn with(prefix: &str, name: &str, lock: String, channel: String) -> Self {
        let slot = slot(&lock);
        LockKeys {
            name: name.to_owned(),
            slot,
            fence: mark_key(prefix, slot),
            lock,
            channel,
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
    fn family_keys_share_the_hash_tag_and_the_fence() {
        let k = LockKeys::family("p:", "a{b}", "fair", "grant:");
        assert_eq!(k.lock, "p:{a%7Bb%7D}:fair");
        assert_eq!(k.fence, LockKeys::new("p:", "a{b}").fence);
        assert_eq!(k.channel, "p:{a%7Bb%7D}:fair:grant:");
        assert_eq!(k.slot, LockKeys::new("p:", "a{b}").slot);
    }

    #[test]
    fn names_decode_from_their_tags() {
        for name in ["a", "50%", "{x}", "%7B", "é{}%", "*?[]"] {
            assert_eq!(decode_name(&encode_name(name)).as_deref(), Some(name));
        }
        assert_eq!(decode_name("%zz"), None);
        assert_eq!(decode_name("%2"), None);
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
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
        assert_eq!(
            k.fence,
            format!("locksmith:{{#{}}}:fence", mark_number(k.slot))
        );
        assert_eq!(k.channel, "locksmith:{account:42}:released");
    }

    #[test]
    fn every_slot_has_a_mark_in_it() {
        for s in 0..SLOTS {
            let tag = format!("#{}", mark_number(s));
            assert_eq!(slot(&format!("p:{{{tag}}}:fence")), s);
        }
        // The harness computes the same tags (testkit's `fence_key`).
        assert_eq!(mark_number(slot("x")), 2329);
        assert_eq!(mark_number(0), 4549);
    }

    #[test]
    fn crc16_matches_known_vectors() {
        // The check value of CRC16/XMODEM, and the one the Redis Cluster spec gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
        assert_eq!(crc16(b"A"), 0x58E5);
    }

    #[test]
    fn slots_match_redis() {
        // Values of `CLUSTER KEYSLOT` on a Redis 7 server.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag hashes the whole key; only the first `{` counts.
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
        assert_eq!(slot("locksmith:{é ü 名前}:lock"), 15294);
        assert_eq!(slot("{a}"), 15495);
        assert_eq!(slot("x{}y"), 16116);
        assert_eq!(slot("foo{{bar}}zap"), 4015);
    }

    #[test]
    fn a_lock_knows_the_slot_of_its_keys() {
        for name in ["account:42", "{x}", "%7B", "é ü 名前", "a}b{c"] {
            let k = LockKeys::new("locksmith:", name);
            for key in [&k.lock, &k.fence, &k.channel] {
                assert_eq!(slot(key), k.slot, "{name:?} {key}");
            }
        }
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
