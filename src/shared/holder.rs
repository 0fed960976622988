//! What an operator sees of a lock: who holds it ([`Holder`]), which lock type it is
//! ([`LockKind`]) and everything about one held name ([`LockInfo`]); and the owner id every
//! lock type stores on the server, which carries the client's label and the holding thread's
//! name so that the server state alone can say who holds what.
//!
//! # The owner id
//!
//! `<client id>:<thread number>[.<n>]/<label>/<thread name>`: the client's random id and the
//! thread's number tell owners apart (two threads are two owners, see
//! [`Client`](crate::Client)); the label ([`ClientBuilder::label`]) and the thread's name
//! (empty when the thread has none, cut to [`MAX_THREAD_NAME`] bytes) are there for people.
//! Both are percent-encoded where they hold `%`, `/`, `|` or a control character, so the id
//! never holds a `|` (the separator of the lock's value) and splits at its first two `/`.
//! Stored with every acquisition, they cost the server a few dozen bytes per lock: no extra key,
//! no extra call.
//!
//! [`ClientBuilder::label`]: crate::ClientBuilder::label

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::Error;
use crate::protocol::keys::percent_encode;

/// The longest label [`ClientBuilder::label`](crate::ClientBuilder::label) accepts, in bytes.
pub(crate) const MAX_LABEL_LEN: usize = 128;

/// How much of a thread's name the owner id keeps, in bytes.
pub(crate) const MAX_THREAD_NAME: usize = 64;

/// Who holds a lock, as the server tells it.
///
/// Returned by [`Mutex::holder`](crate::Mutex::holder),
/// [`FairMutex::holder`](crate::FairMutex::holder), [`RwLock::writer`](crate::RwLock::writer),
/// [`RwLock::readers`](crate::RwLock::readers), [`Semaphore::holders`](crate::Semaphore::holders)
/// and, for every held lock, [`Client::locks`](crate::Client::locks).
///
/// Both durations are by the server's clock, so they mean the same whichever machine asks.
///
/// With the `serde` feature it is `Serialize` and `Deserialize`: its fields by their names,
/// each duration as serde writes a [`Duration`] (`{"secs": .., "nanos": ..}`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Holder {
    /// The holding client's label ([`ClientBuilder::label`](crate::ClientBuilder::label);
    /// by default `"<hostname>:<pid>"`). Empty for a holder written by a version of locksmith
    /// that stored no label.
    pub label: String,
    /// The holding thread's name, or its number within its process when it has no name.
    pub thread: String,
    /// How many times the holder holds it: the re-entry depth of a lock, the number of
    /// permits held of a [`Semaphore`](crate::Semaphore).
    pub hold_count: u32,
    /// The holder's fencing token; 0 where the lock type has none (a reader, a permit).
    pub fencing_token: u64,
    /// How long ago the holder acquired it (the outermost level), by the server's clock.
    pub held_for: Duration,
    /// How long the lease has left on the server, unless renewed.
    pub lease_left: Duration,
}

impl Holder {
    /// A holder from the owner id stored on the server and what the lock type knows of it.
    pub(crate) fn new(
        owner: &str,
        hold_count: u32,
        fencing_token: u64,
        held_for: Duration,
        lease_left: Duration,
    ) -> Holder {
        let (label, thread) = parse_owner(owner);
        Holder {
            label,
            thread,
            hold_count,
            fencing_token,
            held_for,
            lease_left,
        }
    }
}

/// The lock types, as [`Client::locks`](crate::Client::locks) and
/// [`Client::force_unlock`](crate::Client::force_unlock) name them.
///
/// With the `serde` feature, it is written and read as its [`as_str`](LockKind::as_str) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum LockKind {
    /// A [`Mutex`](crate::Mutex) (also a name held through a
    /// [`MultiMutex`](crate::MultiMutex)).
    Mutex,
    /// A [`FairMutex`](crate::FairMutex).
    FairMutex,
    /// An [`RwLock`](crate::RwLock).
    RwLock,
    /// A [`Semaphore`](crate::Semaphore).
    Semaphore,
    /// An [`Election`](crate::Election): its holder is the leader.
    Election,
}

impl LockKind {
    /// Every kind, in the order listings use. A slice: a new kind makes it longer, not of
    /// another type.
    pub const ALL: &'static [LockKind] = &[
        LockKind::Mutex,
        LockKind::FairMutex,
        LockKind::RwLock,
        LockKind::Semaphore,
        LockKind::Election,
    ];

    /// `"mutex"`, `"fair_mutex"`, `"rw_lock"`, `"semaphore"` or `"election"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::FairMutex => "fair_mutex",
            LockKind::RwLock => "rw_lock",
            LockKind::Semaphore => "semaphore",
            LockKind::Election => "election",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses [`LockKind::as_str`]'s names.
impl FromStr for LockKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<LockKind, Error> {
        LockKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::config(
                    "lock type",
                    "must be one of mutex, fair_mutex, rw_lock, semaphore, election",
                )
            })
    }
}

/// One lock name of one type, with its holders: an item of
/// [`Client::locks`](crate::Client::locks) and [`Client::lock_info`](crate::Client::lock_info).
///
/// With the `serde` feature it is `Serialize` and `Deserialize`, field by field (`kind` as
/// [`LockKind`] is, each holder as [`Holder`] is).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's name, as the program that took it gave it.
    pub name: String,
    /// Its type.
    pub kind: LockKind,
    /// Who holds it: the one holder of a mutex or a writer, every reader of a read-write lock,
    /// every permit holder of a semaphore. Empty when nobody holds it (only waiters).
    pub holders: Vec<Holder>,
    /// Whether readers hold it (a [`RwLock`](crate::RwLock) held for reading).
    pub shared: bool,
    /// How many wait for it: the queue of a [`FairMutex`](crate::FairMutex), the waiting
    /// writers and readers of an [`RwLock`](crate::RwLock); `None` where the type keeps no
    /// count on the server (a [`Mutex`](crate::Mutex) or [`Semaphore`](crate::Semaphore),
    /// whose waiters only listen for the release).
    pub waiters: Option<usize>,
    /// What the leader of an [`Election`](crate::Election) proclaimed (its holder is the
    /// leader, its fencing token the term); `None` for the other types.
    pub value: Option<String>,
}

/// Whether `label` may be a client's label: not empty, at most [`MAX_LABEL_LEN`] bytes, no
/// control characters.
pub(crate) fn validate_label(label: &str) -> Result<(), Error> {
    if label.is_empty() {
        return Err(Error::config("label", "must not be empty"));
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(Error::config(
            "label",
            "must be at most 128 bytes (MAX_LABEL_LEN)",
        ));
    }
    if label.chars().any(char::is_control) {
        return Err(Error::config(
            "label",
            "must be printable: no control characters",
        ));
    }
    Ok(())
}

/// The default label: `"<hostname>:<pid>"` (the host name from the system where it can be
/// read without a system call of our own, else from `HOSTNAME`/`COMPUTERNAME`, else
/// `"localhost"`).
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .or_else(|| std::env::var("COMPUTERNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned());
    let mut label = format!("{host}:{}", std::process::id());
    // A label must pass its own check; a host name never comes near 128 bytes, but cut anyway.
    truncate(&mut label, MAX_LABEL_LEN);
    label.retain(|c| !c.is_control());
    label
}

/// `s` with `%`, `/`, `|` and control characters percent-encoded (UTF-8 bytes).
pub(crate) fn encode_part(s: &str) -> String {
    percent_encode(s, |c| matches!(c, '%' | '/' | '|') || c.is_control())
}

/// Undoes [`encode_part`]; a malformed escape is kept as it is.
fn decode_part(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The owner id suffix for `label` and the calling thread: `/<label>/<thread name>`, encoded.
pub(crate) fn owner_suffix(label_encoded: &str) -> String {
    thread_local! {
        static NAME: String = {
            let mut name = std::thread::current().name().unwrap_or("").to_owned();
            truncate(&mut name, MAX_THREAD_NAME);
            encode_part(&name)
        };
    }
    NAME.with(|n| format!("/{label_encoded}/{n}"))
}

/// The label and the thread of an owner id (see the module docs): the thread's number when
/// it had no name; an id without label (an older version's) gives an empty label.
pub(crate) fn parse_owner(owner: &str) -> (String, String) {
    let (id, rest) = owner.split_once('/').unwrap_or((owner, ""));
    let seq = id
        .rsplit_once(':')
        .map_or("", |(_, s)| s.split('.').next().unwrap_or(""));
    let (label, thread) = rest.split_once('/').unwrap_or((rest, ""));
    let thread = if thread.is_empty() {
        seq.to_owned()
    } else {
        decode_part(thread)
    };
    (decode_part(label), thread)
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_round_trip_labels_and_thread_names() {
        for (label, thread) in [
            ("web-1:4242", "worker-3"),
            ("a/b|c%d", "x/y"),
            ("tab\there", ""),
            ("ünïcode", "名前"),
        ] {
            let owner = format!(
                "0f8e7c1a-5b2d-4c3e-9f1a-2b3c4d5e6f70:7.2/{}/{}",
                encode_part(label),
                encode_part(thread)
            );
            assert!(!owner.contains('|'), "{owner}");
            let (l, t) = parse_owner(&owner);
            assert_eq!(l, label);
            assert_eq!(t, if thread.is_empty() { "7" } else { thread });
        }
    }

    #[test]
    fn owner_ids_without_label_give_the_thread_number() {
        assert_eq!(
            parse_owner("0f8e7c1a-5b2d-4c3e-9f1a-2b3c4d5e6f70:12"),
            (String::new(), "12".to_owned())
        );
        assert_eq!(parse_owner(""), (String::new(), String::new()));
        // A malformed escape stays as it is.
        assert_eq!(parse_owner("x:1/%zz%4/t%"), ("%zz%4".into(), "t%".into()));
    }

    #[test]
    fn labels_are_checked() {
        assert!(validate_label("web-1:4242").is_ok());
        assert!(validate_label(&"x".repeat(MAX_LABEL_LEN)).is_ok());
        assert!(validate_label("").is_err());
        assert!(validate_label(&"x".repeat(MAX_LABEL_LEN + 1)).is_err());
        assert!(validate_label("a\nb").is_err());
        assert!(validate_label(&default_label()).is_ok());
    }

    #[test]
    fn lock_kinds_parse_their_names() {
        for &k in LockKind::ALL {
            assert_eq!(k.as_str().parse::<LockKind>().ok(), Some(k));
            assert_eq!(k.to_string(), k.as_str());
        }
        assert!("lock".parse::<LockKind>().is_err());
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        let mut s = "ééé".to_owned();
        truncate(&mut s, 3);
        assert_eq!(s, "é");
    }
}
