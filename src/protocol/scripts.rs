//! The Lua scripts behind acquire, release and renew, and their typed replies.
//!
//! Each script lives in `src/protocol/scripts/*.lua`, opening with its KEYS/ARGV contract. They are
//! hashed once per process ([`LazyLock`]) and sent with `EVALSHA`; a master that answers
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`) gets the script loaded and the call resent
//! (see `topology/backend/`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Connection, Script, Value};

use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::stats::LockType;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Acquire.source()));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Release.source()));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Renew.source()));
static RENEW_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(Which::RenewBatch.source()));
static FAIR: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Fair.source()));
static SEM: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Sem.source()));
static RW: LazyLock<Script> = LazyLock::new(|| Script::new(Which::Rw.source()));
static MULTI_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(Which::MultiAcquire.source()));
static MULTI_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(Which::MultiRelease.source()));

/// Which lock type a hold belongs to, so that the renewal thread sends its renew script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A [`Mutex`](crate::Mutex) (also on a quorum).
    Mutex,
    /// A [`FairMutex`](crate::FairMutex)'s lock.
    Fair,
    /// A waiter's place in a [`FairMutex`](crate::FairMutex)'s queue (its heartbeat): not a
    /// lease the application holds, so its loss is not reported as one.
    FairPlace,
    /// The permits of one [`Semaphore`](crate::Semaphore) acquisition.
    Sem,
    /// A reader of an [`RwLock`](crate::RwLock).
    Read,
    /// The writer of an [`RwLock`](crate::RwLock).
    Write,
}

impl Kind {
    /// The lock type a hold of this kind is counted under (a [`MultiMutex`](crate::MultiMutex)'s
    /// holds are mutex locks); `None` for a waiter's place, which is not a lock held.
    pub(crate) fn lock_type(self) -> Option<LockType> {
        match self {
            Kind::Mutex => Some(LockType::Mutex),
            Kind::Fair => Some(LockType::FairMutex),
            Kind::FairPlace => None,
            Kind::Sem => Some(LockType::Semaphore),
            Kind::Read | Kind::Write => Some(LockType::RwLock),
        }
    }
}

/// A call of the read-write lock script: operation `op` for `holder`, with the operation's
/// own arguments `extra` (see `scripts/rw_lock.lua`). The keys derive from the lock's tag.
pub(crate) fn rw(
    keys: &LockKeys,
    op: &str,
    holder: Holder<'_>,
    lease: Duration,
    extra: &[&str],
) -> Call {
    rw_with(keys, op, holder, lease, extra, None)
}

/// [`rw`], with a seventh key (`marker`) where the operation takes one.
fn rw_with(
    keys: &LockKeys,
    op: &str,
    holder: Holder<'_>,
    lease: Duration,
    extra: &[&str],
    marker: Option<&str>,
) -> Call {
    let root = keys.fence.strip_suffix(":fence").unwrap_or(&keys.fence);
    let main = format!("{root}:rw");
    let readers = format!("{root}:rw:readers");
    let wwait = format!("{root}:rw:wwait");
    let rwait = format!("{root}:rw:rwait");
    let eager = format!("{root}:rw:eager");
    let mut all = vec![main.as_str(), &keys.fence, &readers, &wwait, &rwait, &eager];
    all.extend(marker);
    let mut cmd = evalsha(Which::Rw, &all);
    cmd.arg(op)
        .arg(holder.owner)
        .arg(holder.acquisition)
        .arg(millis(lease))
        .arg(format!("{root}:rw:open"))
        .arg(format!("{root}:rw:free"))
        .arg(extra);
    Call {
        which: Which::Rw,
        cmd,
    }
}

/// A call of the semaphore script: operation `op` for the acquisition of `holder`, with the
/// operation's own arguments `extra` (see `scripts/sem_permits.lua`).
pub(crate) fn sem(
    keys: &LockKeys,
    op: &str,
    holder: Holder<'_>,
    lease: Duration,
    extra: &[&str],
) -> Call {
    sem_with(keys, op, holder, lease, extra, None)
}

/// [`sem`], with a third key (`marker`) where the operation takes one.
fn sem_with(
    keys: &LockKeys,
    op: &str,
    holder: Holder<'_>,
    lease: Duration,
    extra: &[&str],
    marker: Option<&str>,
) -> Call {
    let leases = format!("{}:leases", keys.lock);
    let mut all = vec![keys.lock.as_str(), &leases];
    all.extend(marker);
    let mut cmd = evalsha(Which::Sem, &all);
    cmd.arg(op)
        .arg(format!("{}/{}", holder.owner, holder.acquisition))
        .arg(millis(lease))
        .arg(&keys.channel)
        .arg(extra);
    Call {
        which: Which::Sem,
        cmd,
    }
}

/// The semaphore's release of `holder`'s acquisition (`retry`: the retry of a release whose
/// first attempt failed on the connection). The release writes a marker that lives `marker`
/// (at least the time its retry may come after it), by which the retry tells whether the
/// first attempt released it.
pub(crate) fn sem_release(
    keys: &LockKeys,
    holder: Holder<'_>,
    lease: Duration,
    retry: bool,
    marker: Duration,
) -> Call {
    let key = format!(
        "{}:released:{}/{}",
        keys.lock, holder.owner, holder.acquisition
    );
    let ms = millis(marker).to_string();
    let extra = [if retry { "1" } else { "0" }, ms.as_str()];
    sem_with(keys, "release", holder, lease, &extra, Some(&key))
}

/// The read-write lock's release of a reader (see [`sem_release`] for `retry` and `marker`).
pub(crate) fn rw_release_read(
    keys: &LockKeys,
    holder: Holder<'_>,
    lease: Duration,
    retry: bool,
    marker: Duration,
) -> Call {
    let root = keys.fence.strip_suffix(":fence").unwrap_or(&keys.fence);
    let key = format!("{root}:rw:released:{}/{}", holder.owner, holder.acquisition);
    let ms = millis(marker).to_string();
    let extra = [if retry { "1" } else { "0" }, ms.as_str()];
    rw_with(keys, "release_read", holder, lease, &extra, Some(&key))
}

/// A call of the fair mutex script: operation `op` for `holder`, with the operation's own
/// arguments `extra` (see `scripts/fair_mutex.lua`).
pub(crate) fn fair(
    keys: &LockKeys,
    op: &str,
    holder: Holder<'_>,
    lease: Duration,
    extra: &[&str],
) -> Call {
    let queue = format!("{}:queue", keys.lock);
    let waiters = format!("{}:waiters", keys.lock);
    let mut cmd = evalsha(Which::Fair, &[&keys.lock, &keys.fence, &queue, &waiters]);
    cmd.arg(op)
        .arg(holder.owner)
        .arg(holder.acquisition)
        .arg(millis(lease))
        .arg(&keys.channel)
        .arg(extra);
    Call {
        which: Which::Fair,
        cmd,
    }
}

/// The answer of the acquire script on one master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The caller holds the lock now, `count` levels deep, under fencing token `token`, in
    /// the acquisition the server calls `gen`; tokens after `token` up to `last` are reserved
    /// for local hand-offs of this acquisition (`last == token`: none).
    Held {
        token: u64,
        count: u64,
        acquisition: String,
        last: u64,
    },
    /// Another owner holds it, for `ttl` more.
    Busy { ttl: Duration },
    /// The key holds something locksmith did not write.
    Foreign,
}

/// The answer of the release script on one master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    /// Released one level; `remaining` levels are still held (0: the lock is free).
    /// `listeners`: how many subscribers received the release message (the caller's own
    /// client among them when it listens on the channel; 0 when nothing was published).
    Released { remaining: u64, listeners: u64 },
    /// The key is gone: the lease had ended, or Redis lost it (a restart, a failover). On a
    /// retry, also where the first attempt may have freed it but the server cannot tell.
    Missing,
    /// A retry only: the first attempt released the lock before its reply was lost. The key
    /// is gone with the fencing counter still at the caller's acquisition, or its owner now
    /// was granted it right after that acquisition (see `scripts/release.lua`).
    ReleasedBefore,
    /// Another owner holds the lock.
    OtherOwner,
    /// The key holds something locksmith did not write.
    Foreign,
}

/// Lease in whole milliseconds, as the scripts take it; at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// The error for a reply of the wrong shape.
pub(crate) fn unexpected(script: &str, v: &Value) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected script reply",
        format!("{script}: {v:?}"),
    )))
}

/// One of the scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Acquire,
    Release,
    Renew,
    /// The renew script for several locks in one call.
    RenewBatch,
    Fair,
    Sem,
    Rw,
    /// Acquires several mutex locks at once, all or none.
    MultiAcquire,
    /// Releases one level of several mutex locks at once.
    MultiRelease,
}

impl Which {
    pub(crate) const ALL: [Which; 9] = [
        Which::Acquire,
        Which::Release,
        Which::Renew,
        Which::RenewBatch,
        Which::Fair,
        Which::Sem,
        Which::Rw,
        Which::MultiAcquire,
        Which::MultiRelease,
    ];

    fn script(self) -> &'static Script {
        match self {
            Which::Acquire => &ACQUIRE,
            Which::Release => &RELEASE,
            Which::Renew => &RENEW,
            Which::RenewBatch => &RENEW_BATCH,
            Which::Fair => &FAIR,
            Which::Sem => &SEM,
            Which::Rw => &RW,
            Which::MultiAcquire => &MULTI_ACQUIRE,
            Which::MultiRelease => &MULTI_RELEASE,
        }
    }

    /// The script's Lua source.
    pub(crate) fn source(self) -> &'static str {
        match self {
            Which::Acquire => include_str!("scripts/acquire.lua"),
            Which::Release => include_str!("scripts/release.lua"),
            Which::Renew => include_str!("scripts/renew.lua"),
            Which::RenewBatch => include_str!("scripts/renew_batch.lua"),
            Which::Fair => include_str!("scripts/fair_mutex.lua"),
            Which::Sem => include_str!("scripts/sem_permits.lua"),
            Which::Rw => include_str!("scripts/rw_lock.lua"),
            Which::MultiAcquire => include_str!("scripts/multi_acquire.lua"),
            Which::MultiRelease => include_str!("scripts/multi_release.lua"),
        }
    }

    /// Loads the script into a server's cache (after `NOSCRIPT`), and every other script
    /// with it: a renewal batch mixes the renew scripts of several lock types.
    pub(crate) fn load(self, con: &mut Connection) -> Result<()> {
        self.script().prepare_invoke().load(con)?;
        for other in Which::ALL {
            if other != self {
                other.script().prepare_invoke().load(con)?;
            }
        }
        Ok(())
    }
}

/// A script call: which script, and its `EVALSHA` command.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) which: Which,
    pub(crate) cmd: redis::Cmd,
}

fn evalsha(which: Which, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(which.script().get_hash()).arg(keys.len()).arg(keys);
    cmd
}

/// The caller's live hold on a lock, for a re-entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live<'a> {
    /// The hold's acquisition (the lock's `gen`).
    pub(crate) acquisition: &'a str,
    /// The lease the key must have left after the re-entry (the hold's own lease); zero
    /// leaves the expiry as it is (a fixed lease).
    pub(crate) extend: Duration,
}

/// The acquire script for `owner`: a new acquisition gets a lease of `lease` and reserves
/// `block` tokens after its own for local hand-offs; with `live` (the calling thread holds
/// the lock through a live guard) this is a re-entry of it.
pub(crate) fn acquire(
    keys: &LockKeys,
    owner: &str,
    lease: Duration,
    request: &str,
    live: Option<Live<'_>>,
    block: u32,
) -> Call {
    let mut cmd = evalsha(Which::Acquire, &[&keys.lock, &keys.fence]);
    let (acquisition, extend) = match live {
        Some(l) if l.extend.is_zero() => (l.acquisition, 0),
        Some(l) => (l.acquisition, millis(l.extend)),
        None => ("", 0),
    };
    cmd.arg(owner)
        .arg(millis(lease))
        .arg(request)
        .arg(acquisition)
        .arg(extend)
        .arg(block);
    Call {
        which: Which::Acquire,
        cmd,
    }
}

/// One lock of a set acquired at once: its keys, the owner it is taken for, and the caller's
/// live hold on it (a re-entry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) live: Option<Live<'a>>,
}

/// The set acquire script (`multi_acquire.lua`): every member, or none; a new acquisition of a
/// member gets a lease of `lease` and reserves no token for local hand-offs.
pub(crate) fn multi_acquire(members: &[Member<'_>], lease: Duration, request: &str) -> Call {
    let keys: Vec<&str> = members
        .iter()
        .flat_map(|m| [m.keys.lock.as_str(), m.keys.fence.as_str()])
        .collect();
    let mut cmd = evalsha(Which::MultiAcquire, &keys);
    cmd.arg(millis(lease)).arg(request);
    for m in members {
        let (acquisition, extend) = match m.live {
            Some(l) if l.extend.is_zero() => (l.acquisition, 0),
            Some(l) => (l.acquisition, millis(l.extend)),
            None => ("", 0),
        };
        cmd.arg(m.owner).arg(acquisition).arg(extend);
    }
    Call {
        which: Which::MultiAcquire,
        cmd,
    }
}

/// One level of one lock of a set to release: its keys, holder and level.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leaving<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) holder: Holder<'a>,
    pub(crate) level: Level,
}

/// The set release script (`multi_release.lua`): one level of each lock, in one call.
pub(crate) fn multi_release(leaving: &[Leaving<'_>], request: &str) -> Call {
    let keys: Vec<&str> = leaving
        .iter()
        .flat_map(|l| [l.keys.lock.as_str(), l.keys.fence.as_str()])
        .collect();
    let mut cmd = evalsha(Which::MultiRelease, &keys);
    cmd.arg(request);
    for l in leaving {
        cmd.arg(l.holder.owner)
            .arg(&l.keys.channel)
            .arg(l.holder.acquisition)
            .arg(match l.level {
                Level::Inner => "1",
                Level::Outermost => "0",
            });
    }
    Call {
        which: Which::MultiRelease,
        cmd,
    }
}

/// The answer of the set acquire script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MultiReply {
    /// Every member is held now: per member, in order, its token, level count and
    /// acquisition (the lock's `gen`).
    Held(Vec<(u64, u64, String)>),
    /// Member `index` (0-based) is held by another owner for `ttl` more; nothing changed.
    Busy { index: usize, ttl: Duration },
    /// Member `index`'s key holds something locksmith did not write; nothing changed.
    Foreign { index: usize },
}

/// Parses a set acquire reply for `n` members.
pub(crate) fn parse_multi_acquire(v: &Value, n: usize) -> Option<MultiReply> {
    let Value::Array(items) = v else { return None };
    let index = |v: Option<&Value>| -> Option<usize> {
        usize::try_from(int(v?)?)
            .ok()?
            .checked_sub(1)
            .filter(|i| *i < n)
    };
    match items.first().and_then(int)? {
        1 if items.len() == 1 + 3 * n => {
            let mut held = Vec::with_capacity(n);
            for m in items[1..].chunks(3) {
                held.push((
                    u64::try_from(int(&m[0])?).ok()?,
                    u64::try_from(int(&m[1])?).ok()?,
                    text(&m[2])?,
                ));
            }
            Some(MultiReply::Held(held))
        }
        0 => Some(MultiReply::Busy {
            index: index(items.get(1))?,
            ttl: Duration::from_millis(u64::try_from(int(items.get(2)?)?).unwrap_or(0)),
        }),
        -1 => Some(MultiReply::Foreign {
            index: index(items.get(1))?,
        }),
        _ => None,
    }
}

/// Parses a set release reply for `n` locks: one [`ReleaseReply`] per lock, in order.
pub(crate) fn parse_multi_release(v: &Value, n: usize) -> Option<Vec<ReleaseReply>> {
    let Value::Array(items) = v else { return None };
    if items.len() != 2 * n {
        return None;
    }
    items
        .chunks(2)
        .map(|p| {
            let listeners = u64::try_from(int(&p[1])?).unwrap_or(0);
            match int(&p[0])? {
                r if r >= 0 => Some(ReleaseReply::Released {
                    remaining: r.unsigned_abs(),
                    listeners,
                }),
                -1 => Some(ReleaseReply::Missing),
                -2 => Some(ReleaseReply::OtherOwner),
                -3 => Some(ReleaseReply::Foreign),
                -4 => Some(ReleaseReply::ReleasedBefore),
                _ => None,
            }
        })
        .collect()
}

/// The retry of a set's release `call` (its first attempt failed on the connection): per
/// member, the fencing token of an outermost level's acquisition, by which the script tells
/// that the first attempt released it (see [`release_retry`]).
pub(crate) fn multi_release_retry(call: &Call, leaving: &[Leaving<'_>], tokens: &[u64]) -> Call {
    let mut retry = call.clone();
    for (l, token) in leaving.iter().zip(tokens) {
        match l.level {
            Level::Outermost => retry.cmd.arg(*token),
            Level::Inner => retry.cmd.arg(""),
        };
    }
    retry
}

/// Who releases or renews: the owner, and the acquisition (the lock's `gen` field) its guard belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    pub(crate) owner: &'a str,
    pub(crate) acquisition: &'a str,
}

/// Which levels a release gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// The holder's outermost level: the lock is freed, whatever count the server has.
    Outermost,
    /// An inner level: one level is counted down; the lock is never freed by it.
    Inner,
}

/// The release script for a level of `holder`'s acquisition under `token`.
pub(crate) fn release(
    keys: &LockKeys,
    holder: Holder<'_>,
    request: &str,
    token: u64,
    level: Level,
) -> Call {
    release_publishing_on(&keys.channel, keys, holder, request, token, level)
}

/// The retry of `call` (a release whose first attempt failed on the connection), for an
/// outermost level whose acquisition reserved tokens up to `last` (its own token when none):
/// the script then answers [`ReleaseReply::ReleasedBefore`] where it can tell that the first
/// attempt released it. An inner level is retried as it was: its first attempt never frees
/// the lock, so a lock gone is a lock lost.
pub(crate) fn release_retry(call: &Call, level: Level, last: u64) -> Call {
    let mut retry = call.clone();
    if level == Level::Outermost {
        retry.cmd.arg(last);
    }
    retry
}

/// The release script without the release message: undoes a partial quorum grant.
pub(crate) fn undo(
    keys: &LockKeys,
    holder: Holder<'_>,
    request: &str,
    token: u64,
    level: Level,
) -> Call {
    release_publishing_on("", keys, holder, request, token, level)
}

/// The release script, publishing on `channel` (nowhere when empty).
fn release_publishing_on(
    channel: &str,
    keys: &LockKeys,
    holder: Holder<'_>,
    request: &str,
    token: u64,
    level: Level,
) -> Call {
    let mut cmd = evalsha(Which::Release, &[&keys.lock, &keys.fence]);
    cmd.arg(holder.owner)
        .arg(channel)
        .arg(request)
        .arg(token)
        .arg(holder.acquisition)
        .arg(match level {
            Level::Inner => "1",
            Level::Outermost => "0",
        });
    Call {
        which: Which::Release,
        cmd,
    }
}

/// The renew script for `holder`'s acquisition under `token`.
pub(crate) fn renew(keys: &LockKeys, holder: Holder<'_>, lease: Duration, token: u64) -> Call {
    let mut cmd = evalsha(Which::Renew, &[&keys.lock, &keys.fence]);
    cmd.arg(holder.owner)
        .arg(millis(lease))
        .arg(token)
        .arg(holder.acquisition);
    Call {
        which: Which::Renew,
        cmd,
    }
}

/// One lease of a batched renewal: the lock, its holder, the lease to set, and the token to
/// raise the fencing counter to (0: leave the counter alone, as with a single master).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewing<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) holder: Holder<'a>,
    pub(crate) lease: Duration,
    pub(crate) token: u64,
}

/// The renewal of `leases` in one script call: `renew.lua` for one lease, `renew_batch.lua`
/// for several. Its reply gives one outcome per lease (see [`parse_renews`]). The caller
/// keeps a call within one Cluster slot where that matters, and its size bounded.
pub(crate) fn renew_many(leases: &[Renewing<'_>]) -> Call {
    if let [one] = leases {
        return renew(one.keys, one.holder, one.lease, one.token);
    }
    // The tokens are all 0 (a single master) or none is (a quorum): one mode for the call.
    let fence = leases.iter().any(|l| l.token != 0);
    let mut keys: Vec<&str> = leases.iter().map(|l| l.keys.lock.as_str()).collect();
    if fence {
        keys.extend(leases.iter().map(|l| l.keys.fence.as_str()));
    }
    // Runs of consecutive leases with one lease: each run's lease is sent once (the caller
    // orders the leases so that runs are long). No owner: the acquisition alone names it.
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for l in leases {
        let ms = millis(l.lease);
        match runs.last_mut() {
            Some((lease, count)) if *lease == ms => *count += 1,
            _ => runs.push((ms, 1)),
        }
    }
    let mut cmd = evalsha(Which::RenewBatch, &keys);
    cmd.arg(if fence { "1" } else { "0" }).arg(runs.len());
    for (lease, count) in runs {
        cmd.arg(lease).arg(count);
    }
    for l in leases {
        cmd.arg(l.holder.acquisition);
    }
    if fence {
        for l in leases {
            cmd.arg(l.token);
        }
    }
    Call {
        which: Which::RenewBatch,
        cmd,
    }
}

/// Parses an acquire reply.
pub(crate) fn parse_acquire(v: &Value) -> Option<AcquireReply> {
    let Value::Array(items) = v else { return None };
    match (items.first().and_then(int)?, items.get(1), items.get(2)) {
        (1, Some(token), Some(count)) => {
            let token = u64::try_from(int(token)?).ok()?;
            // The last token reserved for local hand-offs; a reply without one reserved none.
            let last = match items.get(4) {
                Some(v) => u64::try_from(int(v)?).ok()?.max(token),
                None => token,
            };
            Some(AcquireReply::Held {
                token,
                count: u64::try_from(int(count)?).ok()?,
                acquisition: text(items.get(3)?)?,
                last,
            })
        }
        (0, Some(ttl), _) => {
            // -1 (no expiry) and -2 (gone) cannot come from our own keys; a zero wait makes
            // the caller simply try again.
            let ms = u64::try_from(int(ttl)?).unwrap_or(0);
            Some(AcquireReply::Busy {
                ttl: Duration::from_millis(ms),
            })
        }
        (-1, _, _) => Some(AcquireReply::Foreign),
        _ => None,
    }
}

/// Parses a release reply.
pub(crate) fn parse_release(v: &Value) -> Option<ReleaseReply> {
    // The lock freed and the release published: `{0, receivers}`.
    if let Value::Array(items) = v {
        return match items.as_slice() {
            [freed, receivers] if int(freed)? == 0 => Some(ReleaseReply::Released {
                remaining: 0,
                listeners: u64::try_from(int(receivers)?).ok()?,
            }),
            _ => None,
        };
    }
    match int(v)? {
        n if n >= 0 => Some(ReleaseReply::Released {
            remaining: n.unsigned_abs(),
            listeners: 0,
        }),
        -1 => Some(ReleaseReply::Missing),
        -2 => Some(ReleaseReply::OtherOwner),
        -3 => Some(ReleaseReply::Foreign),
        -4 => Some(ReleaseReply::ReleasedBefore),
        _ => None,
    }
}

/// Parses one renew reply: `Some(true)` extended, `Some(false)` not owned any more.
pub(crate) fn parse_renew(v: &Value) -> Option<bool> {
    int(v).map(|n| n == 1)
}

/// The outcomes of a renew call that covers `n` leases: for several, the batch script's array
/// of the (1-based) positions NOT extended, every other lease extended; for one lease, the
/// per-lock script's reply. `None` for each lease where the reply says nothing sure about it
/// (an error, or a reply of the wrong shape).
pub(crate) fn parse_renews(v: &Value, n: usize) -> Vec<Option<bool>> {
    match v {
        _ if n == 1 => vec![parse_renew(v)],
        Value::Array(failed) => {
            let mut out = vec![Some(true); n];
            for f in failed {
                match int(f).and_then(|i| usize::try_from(i).ok()) {
                    Some(i) if (1..=n).contains(&i) => out[i - 1] = Some(false),
                    _ => return vec![None; n],
                }
            }
            out
        }
        _ => vec![None; n],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_replies_parse() {
        let held = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"1763781420000001".to_vec()),
            Value::Int(2),
            Value::BulkString(b"1f".to_vec()),
        ]);
        assert_eq!(
            parse_acquire(&held),
            Some(AcquireReply::Held {
                token: 1_763_781_420_000_001,
                count: 2,
                acquisition: "1f".into(),
                last: 1_763_781_420_000_001,
            })
        );
        let block = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"100".to_vec()),
            Value::Int(1),
            Value::BulkString(b"1f".to_vec()),
            Value::BulkString(b"116".to_vec()),
        ]);
        assert_eq!(
            parse_acquire(&block),
            Some(AcquireReply::Held {
                token: 100,
                count: 1,
                acquisition: "1f".into(),
                last: 116,
            })
        );
        // A grant without the acquisition it belongs to is not a grant.
        let anonymous = Value::Array(vec![Value::Int(1), Value::Int(7), Value::Int(1)]);
        assert_eq!(parse_acquire(&anonymous), None);
        let busy = Value::Array(vec![Value::Int(0), Value::Int(1500)]);
        assert_eq!(
            parse_acquire(&busy),
            Some(AcquireReply::Busy {
                ttl: Duration::from_millis(1500)
            })
        );
        let gone = Value::Array(vec![Value::Int(0), Value::Int(-2)]);
        assert_eq!(
            parse_acquire(&gone),
            Some(AcquireReply::Busy {
                ttl: Duration::ZERO
            })
        );
        assert_eq!(
            parse_acquire(&Value::Array(vec![Value::Int(-1)])),
            Some(AcquireReply::Foreign)
        );
        assert_eq!(
            parse_release(&Value::Int(2)),
            Some(ReleaseReply::Released {
                remaining: 2,
                listeners: 0
            })
        );
        assert_eq!(
            parse_release(&Value::Array(vec![Value::Int(0), Value::Int(3)])),
            Some(ReleaseReply::Released {
                remaining: 0,
                listeners: 3
            })
        );
        assert_eq!(
            parse_release(&Value::Array(vec![Value::Int(1), Value::Int(3)])),
            None
        );
        assert_eq!(
            parse_release(&Value::Array(vec![Value::Int(0), Value::Int(-1)])),
            None
        );
        assert_eq!(
            parse_release(&Value::Int(-2)),
            Some(ReleaseReply::OtherOwner)
        );
        assert_eq!(parse_release(&Value::Nil), None);
        assert_eq!(parse_acquire(&Value::Nil), None);
    }

    #[test]
    fn scripts_keep_the_fence_ttl_of_keys_rs() {
        let line = format!(
            "local FENCE_TTL_MS = {}",
            crate::protocol::keys::FENCE_TTL.as_millis()
        );
        for which in [
            Which::Acquire,
            Which::Release,
            Which::Renew,
            Which::RenewBatch,
            Which::Fair,
            Which::Rw,
        ] {
            assert!(which.source().contains(&line), "{which:?}");
        }
    }

    #[test]
    fn scripts_seed_a_lost_counter_past_the_largest_block() {
        // Every script that grants from the counter seeds a lost one by acquire.lua's lead
        // (the largest block is compared with the client's bound in client.rs).
        let acquire = Which::Acquire.source();
        assert!(acquire.contains("local MAX_LEAD_US = 1000000"));
        assert!(acquire.contains("local SEED_LEAD_US = MAX_LEAD_US + MAX_BLOCK"));
        let block = acquire
            .lines()
            .find_map(|l| l.strip_prefix("local MAX_BLOCK = "))
            .unwrap_or("?");
        let seed = format!("local SEED_LEAD_US = 1000000 + {block}");
        for which in [Which::Fair, Which::Rw, Which::MultiAcquire] {
            assert!(which.source().contains(&seed), "{which:?}");
        }
    }

    #[test]
    fn a_retried_outermost_release_names_the_last_reserved_token() {
        let k = LockKeys::new("p:", "a");
        let holder = Holder {
            owner: "o",
            acquisition: "g",
        };
        let call = release(&k, holder, "r", 0, Level::Outermost);
        let retry = args(&release_retry(&call, Level::Outermost, 42));
        assert_eq!(retry.last().map(String::as_str), Some("42"));
        assert_eq!(args(&release_retry(&call, Level::Inner, 42)), args(&call));
        assert_eq!(
            parse_release(&Value::Int(-4)),
            Some(ReleaseReply::ReleasedBefore)
        );
    }

    fn renewing<'a>(keys: &'a LockKeys, acquisition: &'a str, token: u64) -> Renewing<'a> {
        Renewing {
            keys,
            holder: Holder {
                owner: "o",
                acquisition,
            },
            lease: Duration::from_millis(3000),
            token,
        }
    }

    fn args(call: &Call) -> Vec<String> {
        call.cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn one_lease_is_renewed_by_the_per_lock_script() {
        let k = LockKeys::new("p:", "a");
        let call = renew_many(&[renewing(&k, "g", 0)]);
        assert_eq!(call.which, Which::Renew);
        let a = args(&call);
        assert_eq!(a[0], "EVALSHA");
        assert_eq!(
            &a[2..],
            ["2", "p:{a}:lock", "p:{a}:fence", "o", "3000", "0", "g"]
        );
    }

    #[test]
    fn a_batch_lists_locks_then_counters() {
        let (a, b) = (LockKeys::new("p:", "a"), LockKeys::new("p:", "b"));
        let single = renew_many(&[renewing(&a, "ga", 0), renewing(&b, "gb", 0)]);
        assert_eq!(single.which, Which::RenewBatch);
        assert_eq!(
            &args(&single)[2..],
            [
                "2",
                "p:{a}:lock",
                "p:{b}:lock",
                "0",
                "1",
                "3000",
                "2",
                "ga",
                "gb"
            ]
        );
        let quorum = renew_many(&[renewing(&a, "ga", 7), renewing(&b, "gb", 9)]);
        assert_eq!(
            &args(&quorum)[2..],
            [
                "4",
                "p:{a}:lock",
                "p:{b}:lock",
                "p:{a}:fence",
                "p:{b}:fence",
                "1",
                "1",
                "3000",
                "2",
                "ga",
                "gb",
                "7",
                "9"
            ]
        );
    }

    #[test]
    fn a_batch_sends_each_lease_once_per_run_and_no_owner() {
        let keys: Vec<LockKeys> = (0..4)
            .map(|i| LockKeys::new("p:", &i.to_string()))
            .collect();
        let mut leases: Vec<Renewing<'_>> = keys.iter().map(|k| renewing(k, "g", 0)).collect();
        leases[2].holder.owner = "other";
        leases[3].lease = Duration::from_secs(9);
        let a = args(&renew_many(&leases));
        assert_eq!(
            &a[7..],
            ["0", "2", "3000", "3", "9000", "1", "g", "g", "g", "g"]
        );
    }

    #[test]
    fn renew_replies_give_one_outcome_per_lease() {
        // The batch script lists the positions it did not extend.
        let batch = Value::Array(vec![Value::Int(2)]);
        assert_eq!(
            parse_renews(&batch, 3),
            [Some(true), Some(false), Some(true)]
        );
        assert_eq!(parse_renews(&Value::Array(vec![]), 2), [Some(true); 2]);
        // A position that no lease has: nothing is sure.
        assert_eq!(
            parse_renews(&Value::Array(vec![Value::Int(3)]), 2),
            [None, None]
        );
        assert_eq!(
            parse_renews(&Value::Array(vec![Value::Int(0)]), 2),
            [None, None]
        );
        assert_eq!(parse_renews(&Value::Int(1), 2), [None, None]);
        assert_eq!(parse_renews(&Value::Nil, 2), [None, None]);
        assert_eq!(parse_renews(&Value::Int(1), 1), [Some(true)]);
        assert_eq!(parse_renews(&Value::Int(0), 1), [Some(false)]);
        assert_eq!(parse_renews(&Value::Nil, 1), [None]);
    }

    #[test]
    fn millis_rounds_to_at_least_one() {
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_millis(30)), 30);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
