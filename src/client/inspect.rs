//! What an operator asks of a whole deployment: which locks are held ([`Client::locks`]),
//! everything about one name ([`Client::lock_info`]), and clearing a stuck lock
//! ([`Client::force_unlock`]). Each lock type answers for its own keys (its `holder`,
//! `writer`/`readers`, `holders` and `force_unlock`); this file finds the keys, with `SCAN` on
//! every master, and asks the right type.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use super::Client;
use crate::error::Result;
use crate::protocol::keys;
use crate::shared::holder::{LockInfo, LockKind};
use crate::transport::conn::Deadline;

/// The bound of the `SCAN` that [`Client::locks`] starts with, over every master.
pub(crate) const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The key suffixes (after the hash tag) that say a lock type holds or waits for a name.
const SUFFIXES: [(&str, LockKind); 11] = [
    (":lock", LockKind::Mutex),
    (":fair", LockKind::FairMutex),
    (":fair:queue", LockKind::FairMutex),
    (":rw", LockKind::RwLock),
    (":rw:readers", LockKind::RwLock),
    (":rw:wwait", LockKind::RwLock),
    (":rw:rwait", LockKind::RwLock),
    (":rw:eager", LockKind::RwLock),
    (":sem", LockKind::Semaphore),
    (":sem:leases", LockKind::Semaphore),
    (":elect", LockKind::Election),
];

/// The locks held under a client's key prefix: an iterator of [`LockInfo`], from
/// [`Client::locks`].
///
/// The names were found by one `SCAN` when it was made; each item is read from the server
/// when the iterator reaches it (one or two calls), so a lock released in between is left out
/// and its holders are as they are at that moment. An item is an `Err` when its lock could
/// not be read (the iterator goes on after it).
#[derive(Debug)]
#[must_use = "an iterator does nothing unless consumed"]
pub struct Locks {
    client: Client,
    pending: VecDeque<(String, LockKind)>,
}

impl Iterator for Locks {
    type Item = Result<LockInfo>;

    fn next(&mut self) -> Option<Result<LockInfo>> {
        while let Some((name, kind)) = self.pending.pop_front() {
            match self.client.info_of(&name, kind) {
                Ok(info) if info.holders.is_empty() => continue,
                other => return Some(other),
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.pending.len()))
    }
}

impl Client {
    /// The locks held under this client's key prefix whose name starts with `prefix` (`""`:
    /// all), of every type, each with its holders, in the order of their names.
    ///
    /// The keys are found with `SCAN` (never `KEYS`, which stops Redis for the whole
    /// keyspace), on every master of a cluster or of a quorum client; then each lock is read
    /// as the iterator reaches it. A quorum client lists a name any master has, and reads its
    /// holder from a majority ([`Mutex::holder`](crate::Mutex::holder)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) when `prefix` holds a NUL byte or is longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN); an error of the first master whose `SCAN`
    /// failed, or [`Error::Timeout`](crate::Error::Timeout) when the scan took longer than 60 s (each
    /// step is also bounded by the client's command timeout). A lock that cannot be read
    /// later is an `Err` item.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> locksmith::Result<()> {
    /// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
    /// for lock in client.locks("account:")? {
    ///     let lock = lock?;
    ///     for h in &lock.holders {
    ///         println!("{} {} held by {} ({}) for {:?}", lock.kind, lock.name, h.label,
    ///             h.thread, h.held_for);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn locks(&self, prefix: &str) -> Result<Locks> {
        self.core.shared().ensure_open()?;
        if !prefix.is_empty() {
            keys::validate_name(prefix)?;
        }
        let config_prefix = &self.core.shared().config.prefix;
        let pattern = format!(
            "{}{{{}*",
            keys::glob_escape(config_prefix),
            keys::glob_escape(&keys::encode_name(prefix))
        );
        let by = Deadline::after(LIST_TIMEOUT);
        let mut found = BTreeSet::new();
        for (master, result) in self.core.shared().backend.scan(&pattern, by) {
            for key in result.map_err(|e| e.at(&master))? {
                if let Some((name, kind)) = classify(config_prefix, &key)
                    && self.kinds().contains(&kind)
                {
                    found.insert((name, kind));
                }
            }
        }
        Ok(Locks {
            client: self.clone(),
            pending: found.into_iter().collect(),
        })
    }

    /// Everything about the name `name`: each lock type that holds it or has waiters for it,
    /// with its holders and (where the type counts them) its waiters. Empty when no type uses
    /// the name. Asks each type in turn: a few calls, no `SCAN`. A quorum client asks only
    /// for the [`Mutex`](crate::Mutex), the one type it can hold.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`](crate::Error::InvalidName) as for [`mutex`](Client::mutex); the first error of a call to
    /// Redis.
    pub fn lock_info(&self, name: &str) -> Result<Vec<LockInfo>> {
        keys::validate_name(name)?;
        let mut out = Vec::new();
        for &kind in self.kinds() {
            let info = self.info_of(name, kind)?;
            if !info.holders.is_empty() || info.waiters.is_some_and(|w| w > 0) {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Frees the lock `name` of type `kind` on the server, whoever holds it: the
    /// `force_unlock` of [`Mutex`](crate::Mutex::force_unlock),
    /// [`FairMutex`](crate::FairMutex::force_unlock),
    /// [`RwLock`](crate::RwLock::force_unlock),
    /// [`Semaphore`](crate::Semaphore::force_unlock) or
    /// [`Election`](crate::Election::force_unlock) (a new election follows), for tools that
    /// have a name and a type.
    /// `true` when something was held.
    ///
    /// # Errors
    ///
    /// As the type's `force_unlock`.
    pub fn force_unlock(&self, name: &str, kind: LockKind) -> Result<bool> {
        match kind {
            LockKind::Mutex => self.mutex(name)?.force_unlock(),
            LockKind::FairMutex => self.fair_mutex(name)?.force_unlock(),
            LockKind::RwLock => self.rw_lock(name)?.force_unlock(),
            LockKind::Semaphore => self.semaphore(name, 1)?.force_unlock(),
            LockKind::Election => self.election(name)?.force_unlock(),
        }
    }

    /// The lock types this client can hold: all of them on one server, Sentinel or a cluster;
    /// on a quorum client the [`Mutex`](crate::Mutex) and the [`Election`](crate::Election)
    /// (the others need one server).
    fn kinds(&self) -> &'static [LockKind] {
        if self.masters() > 1 {
            &[LockKind::Mutex, LockKind::Election]
        } else {
            LockKind::ALL
        }
    }

    /// What type `kind` holds of `name` (holders empty when nothing).
    fn info_of(&self, name: &str, kind: LockKind) -> Result<LockInfo> {
        let mut shared = false;
        let mut waiters = None;
        let mut value = None;
        let holders = match kind {
            LockKind::Mutex => self.mutex(name)?.holder()?.into_iter().collect(),
            LockKind::FairMutex => {
                let lock = self.fair_mutex(name)?;
                waiters = Some(lock.waiters()?);
                lock.holder()?.into_iter().collect()
            }
            LockKind::RwLock => {
                let lock = self.rw_lock(name)?;
                waiters = Some(lock.waiting()?);
                match lock.writer()? {
                    Some(w) => vec![w],
                    None => {
                        let readers = lock.readers()?;
                        shared = !readers.is_empty();
                        readers
                    }
                }
            }
            LockKind::Semaphore => self.semaphore(name, 1)?.holders()?,
            LockKind::Election => match self.election(name)?.leader()? {
                Some(leader) => {
                    value = leader.value.clone();
                    vec![leader.into_holder()]
                }
                None => Vec::new(),
            },
        };
        Ok(LockInfo {
            name: name.to_owned(),
            kind,
            holders,
            shared,
            waiters,
            value,
        })
    }
}

/// The name and type a key under `prefix` belongs to; `None` for a key that is no lock's
/// (a fencing mark, a release marker, a channel's namesake, anything not locksmith's).
fn classify(prefix: &str, key: &str) -> Option<(String, LockKind)> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (tag, suffix) = (&rest[..close], &rest[close + 1..]);
    let kind = SUFFIXES.iter().find(|(s, _)| *s == suffix)?.1;
    Some((keys::decode_name(tag)?, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_classified_by_their_suffix() {
        let p = "locksmith:";
        for (key, name, kind) in [
            ("locksmith:{account:42}:lock", "account:42", LockKind::Mutex),
            ("locksmith:{a%7Bb%7D}:rw:readers", "a{b}", LockKind::RwLock),
            ("locksmith:{x}:fair:queue", "x", LockKind::FairMutex),
            ("locksmith:{x}:sem", "x", LockKind::Semaphore),
        ] {
            assert_eq!(classify(p, key), Some((name.into(), kind)), "{key}");
        }
        for other in [
            "locksmith:{x}:fence",
            "locksmith:{x}:released",
            "locksmith:{x}",
            "other:{x}:lock",
            "locksmith:x:lock",
            "locksmith:{%zz}:lock",
        ] {
            assert_eq!(classify(p, other), None, "{other}");
        }
    }
}
