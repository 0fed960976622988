//! The Lua scripts behind acquire, release and renew, and their typed replies.
//!
//! Each script lives in `src/protocol/scripts/*.lua`, opening with its KEYS/ARGV contract; its
//! source is that body with the constants and shared helpers it uses put before it (see
//! [`crate::protocol::lua`]). They are built and hashed once per process ([`LazyLock`]) and
//! sent with `EVALSHA`; a master that answers
//! `NOSCRIPT` (after a restart or `SCRIPT FLUSH`) gets the script loaded and the call resent
//! (see `topology/backend/`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Connection, Script, Value};

use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::transport::fault::Fault;

/// Every script's source (see [`crate::protocol::lua`]), in the order of [`Which::ALL`].
static SOURCES: LazyLock<Vec<String>> = LazyLock::new(|| {
    Which::ALL
        .iter()
        .map(|w| crate::protocol::lua::assemble(w.body()))
        .collect()
});

/// Every script, hashed, in the order of [`Which::ALL`].
static SCRIPTS: LazyLock<Vec<Script>> =
    LazyLock::new(|| SOURCES.iter().map(|s| Script::new(s)).collect());

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
    /// A retry only: the first attempt released the lock before its reply was lost. For a
    /// Mutex: the release marker holds the caller's acquisition (see `scripts/release.lua`).
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

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// The public error for a reply of the wrong shape: [`Fault::BadReply`] naming `script` and
/// quoting `v`.
pub(crate) fn unexpected(script: &str, v: &Value) -> Error {
    Fault::bad_reply(script, v).into()
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
    /// A read-write lock's write acquire.
    RwWrite,
    /// A read-write lock's read acquire.
    RwRead,
    /// The release of a read-write lock's writer or reader.
    RwRelease,
    /// The renewal of a read-write lock's writer or reader.
    RwRenew,
    /// A re-entry of a read-write lock's writer or reader.
    RwReenter,
    /// A waiter leaves a read-write lock's waiting sets.
    RwCancel,
    /// Reads a read-write lock, or frees it by force, for an operator.
    RwAdmin,
    /// Acquires several mutex locks at once, all or none.
    MultiAcquire,
    /// Releases one level of several mutex locks at once.
    MultiRelease,
    /// Reads a mutex lock, or frees it by force, for an operator.
    MutexAdmin,
    /// What only an election does: announce a leader, proclaim its value, read both.
    Election,
}

impl Which {
    pub(crate) const ALL: [Which; 17] = [
        Which::Acquire,
        Which::Release,
        Which::Renew,
        Which::RenewBatch,
        Which::Fair,
        Which::Sem,
        Which::RwWrite,
        Which::RwRead,
        Which::RwRelease,
        Which::RwRenew,
        Which::RwReenter,
        Which::RwCancel,
        Which::RwAdmin,
        Which::MultiAcquire,
        Which::MultiRelease,
        Which::MutexAdmin,
        Which::Election,
    ];

    fn index(self) -> usize {
        Which::ALL.iter().position(|w| *w == self).unwrap_or(0)
    }

    fn script(self) -> &'static Script {
        &SCRIPTS[self.index()]
    }

    /// The file of the script's body, in `src/protocol/scripts/`.
    pub(crate) fn file(self) -> &'static str {
        match self {
            Which::Acquire => "acquire.lua",
            Which::Release => "release.lua",
            Which::Renew => "renew.lua",
            Which::RenewBatch => "renew_batch.lua",
            Which::Fair => "fair_mutex.lua",
            Which::Sem => "sem_permits.lua",
            Which::RwWrite => "rw_write.lua",
            Which::RwRead => "rw_read.lua",
            Which::RwRelease => "rw_release.lua",
            Which::RwRenew => "rw_renew.lua",
            Which::RwReenter => "rw_reenter.lua",
            Which::RwCancel => "rw_cancel.lua",
            Which::RwAdmin => "rw_admin.lua",
            Which::MultiAcquire => "multi_acquire.lua",
            Which::MultiRelease => "multi_release.lua",
            Which::MutexAdmin => "mutex_admin.lua",
            Which::Election => "election.lua",
        }
    }

    /// The script's body: its file's text.
    pub(crate) fn body(self) -> &'static str {
        match self {
            Which::Acquire => include_str!("scripts/acquire.lua"),
            Which::Release => include_str!("scripts/release.lua"),
            Which::Renew => include_str!("scripts/renew.lua"),
            Which::RenewBatch => include_str!("scripts/renew_batch.lua"),
            Which::Fair => include_str!("scripts/fair_mutex.lua"),
            Which::Sem => include_str!("scripts/sem_permits.lua"),
            Which::RwWrite => include_str!("scripts/rw_write.lua"),
            Which::RwRead => include_str!("scripts/rw_read.lua"),
            Which::RwRelease => include_str!("scripts/rw_release.lua"),
            Which::RwRenew => include_str!("scripts/rw_renew.lua"),
            Which::RwReenter => include_str!("scripts/rw_reenter.lua"),
            Which::RwCancel => include_str!("scripts/rw_cancel.lua"),
            Which::RwAdmin => include_str!("scripts/rw_admin.lua"),
            Which::MultiAcquire => include_str!("scripts/multi_acquire.lua"),
            Which::MultiRelease => include_str!("scripts/multi_release.lua"),
            Which::MutexAdmin => include_str!("scripts/mutex_admin.lua"),
            Which::Election => include_str!("scripts/election.lua"),
        }
    }

    /// The script's Lua source, as it is sent: the body with the constants and helpers it
    /// uses (see [`crate::protocol::lua`]).
    pub(crate) fn source(self) -> &'static str {
        &SOURCES[self.index()]
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

/// The Lua source the client sends for the script whose body is the file `file` of
/// `src/protocol/scripts/` (`"acquire.lua"`, `"rw_write.lua"`, ...), or `None` for no such
/// script. For tests that recognise a script's calls by its SHA1, or run it themselves.
pub fn lua_source(file: &str) -> Option<&'static str> {
    Which::ALL
        .into_iter()
        .find(|w| w.file() == file)
        .map(Which::source)
}

/// A script call: which script, and its `EVALSHA` command.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) which: Which,
    pub(crate) cmd: redis::Cmd,
}

/// The arguments of `call`, as text, for the tests that check what a call sends.
#[cfg(test)]
pub(crate) fn args(call: &Call) -> Vec<String> {
    call.cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".into(),
        })
        .collect()
}

pub(crate) fn evalsha(which: Which, keys: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(which.script().get_hash()).arg(keys.len()).arg(keys);
    cmd
}

pub(crate) use crate::protocol::lua::MAX_BLOCK;

/// `GEN|`: how the Mutex scripts name an acquisition (the lock's value begins with it).
fn gen_prefix(acquisition: &str) -> String {
    format!("{acquisition}|")
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

/// One Mutex acquire call, as the acquire script takes it (`scripts/acquire.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acquire<'a> {
    /// The owner id (never contains `|`).
    pub(crate) owner: &'a str,
    /// The lease of a new acquisition.
    pub(crate) lease: Duration,
    /// The request id: names the acquisition when granted.
    pub(crate) request: &'a str,
    /// The calling thread's live hold on the lock: a re-entry.
    pub(crate) live: Option<Live<'a>>,
    /// Tokens a new acquisition reserves after its own for local hand-offs.
    pub(crate) block: u32,
    /// The caller waited for the lock: a new acquisition is flagged at once, so that its
    /// release publishes (others may wait too).
    pub(crate) waited: bool,
    /// A quorum of masters: releases and renewals raise the fencing mark (and no block is
    /// reserved).
    pub(crate) quorum: bool,
}

impl Acquire<'_> {
    /// The hand-off block the call asks for: none with a quorum.
    pub(crate) fn block(&self) -> u32 {
        if self.quorum {
            0
        } else {
            self.block.min(MAX_BLOCK)
        }
    }
}

/// The acquire script call (see [`Acquire`]).
pub(crate) fn acquire(keys: &LockKeys, a: &Acquire<'_>) -> Call {
    let mut cmd = evalsha(Which::Acquire, &[&keys.lock, &keys.fence]);
    debug_assert!(!a.owner.contains('|') && !a.request.contains('|'));
    cmd.arg(format!("{}|{}|{}", a.request, a.owner, a.block()))
        .arg(millis(a.lease));
    let live = a.live.map(|l| {
        let extend = if l.extend.is_zero() {
            0
        } else {
            millis(l.extend)
        };
        (l.acquisition, extend)
    });
    if live.is_some() || a.waited {
        let (acquisition, extend) = live.unwrap_or(("", 0));
        cmd.arg(acquisition).arg(extend);
    }
    if a.waited {
        cmd.arg("w");
    }
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
        .map(|m| m.keys.lock.as_str())
        .chain(members.iter().map(|m| m.keys.fence.as_str()))
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

/// One level of one lock of a set to release: its keys, holder and level, and whether its
/// release must publish even when the lock is not flagged (threads of this client wait).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leaving<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) holder: Holder<'a>,
    pub(crate) level: Level,
    pub(crate) publish: bool,
}

/// The set release script (`multi_release.lua`): one level of each lock, in one call.
/// `retry`: the retry of a call whose first attempt failed on the connection (it may have
/// run): the script then tells, by each lock's release marker, an outermost level the first
/// attempt released.
pub(crate) fn multi_release(leaving: &[Leaving<'_>], request: &str, retry: bool) -> Call {
    let keys: Vec<&str> = leaving
        .iter()
        .flat_map(|l| [l.keys.lock.as_str(), l.keys.channel.as_str()])
        .collect();
    let mut cmd = evalsha(Which::MultiRelease, &keys);
    cmd.arg(request);
    for l in leaving {
        let mut how = String::new();
        match l.level {
            Level::Inner => how.push('i'),
            Level::Outermost if retry => how.push('r'),
            Level::Outermost => {}
        }
        if l.publish {
            how.push('p');
        }
        cmd.arg(gen_prefix(l.holder.acquisition)).arg(how);
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

/// Who releases or renews: the owner, and the acquisition (the lock's `gen`) its guard belongs to.
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

/// Whether a Mutex release publishes on the lock's release channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// When the lock is flagged (a waiter's failed acquire flagged it).
    IfFlagged,
    /// Always when it frees the lock: threads of the releasing client wait (their waits did
    /// not all begin with an acquire that flagged it), or a quorum (waiters listen on one
    /// master, and may have flagged the lock on others only).
    Always,
    /// Never: a quorum acquire undoing a partial grant (its own waiters must not be woken by
    /// it, and nobody else waits for it).
    Never,
}

/// One Mutex release call, as the release script takes it (`scripts/release.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Release<'a> {
    /// The acquisition the guard belongs to.
    pub(crate) acquisition: &'a str,
    pub(crate) level: Level,
    /// Unique per release call, the same on its retry (an inner level's retry is told by it).
    pub(crate) request: &'a str,
    pub(crate) publish: Publish,
    /// With a quorum: the holder's token, which the fencing mark is raised to.
    pub(crate) fence: Option<u64>,
}

/// The release script for `r`; `retry`: the retry of a call whose first attempt failed on the
/// connection (it may have run, its reply lost), which the script then tells apart for an
/// outermost level by the release marker ([`ReleaseReply::ReleasedBefore`]). An inner level is
/// retried as it was: its request id tells the script it was counted already.
pub(crate) fn release(keys: &LockKeys, r: &Release<'_>, retry: bool) -> Call {
    let mut cmd = match r.fence {
        Some(_) => evalsha(Which::Release, &[&keys.lock, &keys.channel, &keys.fence]),
        None => evalsha(Which::Release, &[&keys.lock, &keys.channel]),
    };
    cmd.arg(gen_prefix(r.acquisition));
    let mut how = String::new();
    if r.level == Level::Inner {
        how.push('i');
    } else if retry {
        how.push('r');
    }
    match r.publish {
        Publish::IfFlagged => {}
        Publish::Always => how.push('p'),
        Publish::Never => how.push('n'),
    }
    let common = how.is_empty() && r.fence.is_none();
    if !common {
        let rel = match r.level {
            Level::Inner => r.request,
            Level::Outermost => "",
        };
        cmd.arg(how)
            .arg(rel)
            .arg(r.fence.map_or_else(String::new, |t| t.to_string()));
    }
    Call {
        which: Which::Release,
        cmd,
    }
}

/// The renew script for the Mutex acquisition `acquisition`; `fence`: with a quorum, the
/// holder's token, which the fencing mark is raised to.
pub(crate) fn renew(
    keys: &LockKeys,
    acquisition: &str,
    lease: Duration,
    fence: Option<u64>,
) -> Call {
    let mut cmd = match fence {
        Some(_) => evalsha(Which::Renew, &[&keys.lock, &keys.fence]),
        None => evalsha(Which::Renew, &[&keys.lock]),
    };
    cmd.arg(gen_prefix(acquisition)).arg(millis(lease));
    if let Some(token) = fence {
        cmd.arg(token);
    }
    Call {
        which: Which::Renew,
        cmd,
    }
}

/// One lease of a batched renewal: the lock, its holder, the lease to set, and the token to
/// raise the fencing mark to (0: leave the mark alone, as with a single master).
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
        let fence = (one.token != 0).then_some(one.token);
        return renew(one.keys, one.holder.acquisition, one.lease, fence);
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
        cmd.arg(gen_prefix(l.holder.acquisition));
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

/// Parses a Mutex acquire reply to the call `a`: the integer of a fresh grant (count 1, the
/// acquisition named after the request, the block asked for), or as [`parse_acquire`].
pub(crate) fn parse_mutex_acquire(v: &Value, a: &Acquire<'_>) -> Option<AcquireReply> {
    if let Value::Int(token) = v {
        let token = u64::try_from(*token).ok()?;
        return Some(AcquireReply::Held {
            token,
            count: 1,
            acquisition: a.request.to_owned(),
            last: token.checked_add(u64::from(a.block()))?,
        });
    }
    parse_acquire(v)
}

/// What an operator asks of a Mutex (`scripts/mutex_admin.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admin {
    /// Read the lock: its value, its lease left, the server clock.
    Holder,
    /// Free it whoever holds it.
    Force,
}

/// The admin script call for `op` on the Mutex `keys`.
pub(crate) fn mutex_admin(keys: &LockKeys, op: Admin) -> Call {
    let mut cmd = evalsha(Which::MutexAdmin, &[&keys.lock, &keys.channel]);
    cmd.arg(match op {
        Admin::Holder => "holder",
        Admin::Force => "force",
    });
    Call {
        which: Which::MutexAdmin,
        cmd,
    }
}

/// What the admin script found of a Mutex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminReply {
    /// Held (when asked: a force freed it), with this value (see `lock_value.rs`), its lease
    /// left and the server clock in microseconds.
    Held {
        value: String,
        pttl: Duration,
        now_us: u64,
    },
    /// Free.
    Free,
    /// The key holds something locksmith did not write.
    Foreign,
}

/// Parses an admin script reply (either operation).
pub(crate) fn parse_admin(v: &Value) -> Option<AdminReply> {
    let Value::Array(items) = v else { return None };
    let ms = |v: &Value| Duration::from_millis(u64::try_from(int(v).unwrap_or(0)).unwrap_or(0));
    let clock = |s: &Value, us: &Value| -> Option<u64> {
        let s = u64::try_from(int(s)?).ok()?;
        s.checked_mul(1_000_000)?
            .checked_add(u64::try_from(int(us)?).ok()?)
    };
    match (items.first().and_then(int)?, items.get(1..).unwrap_or(&[])) {
        (1, [value, pttl, s, us]) => Some(AdminReply::Held {
            value: text(value)?,
            pttl: ms(pttl),
            now_us: clock(s, us)?,
        }),
        (0, []) => Some(AdminReply::Free),
        (-1, []) => Some(AdminReply::Foreign),
        _ => None,
    }
}

/// What an election call does (`scripts/election.lua`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ElectionOp<'a> {
    /// Announce the leadership of this acquisition.
    Announce(&'a str),
    /// Store the value of this acquisition's leadership.
    Proclaim(&'a str, &'a str),
    /// Read the leader and its value.
    Leader,
}

/// The election call `op` on the election `keys`, whose leader's value is `value_key`.
pub(crate) fn election(keys: &LockKeys, value_key: &str, op: ElectionOp<'_>) -> Call {
    let mut cmd = evalsha(Which::Election, &[&keys.lock, value_key, &keys.channel]);
    match op {
        ElectionOp::Announce(acquisition) => cmd.arg("announce").arg(acquisition),
        ElectionOp::Proclaim(acquisition, value) => cmd.arg("proclaim").arg(acquisition).arg(value),
        ElectionOp::Leader => cmd.arg("leader"),
    };
    Call {
        which: Which::Election,
        cmd,
    }
}

/// The reply of an election's `announce` or `proclaim`: `Some(true)` done, `Some(false)` the
/// acquisition does not hold the lock; `None` for a foreign key or a reply of another shape.
pub(crate) fn parse_election_done(v: &Value) -> Option<bool> {
    match int(v)? {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

/// The reply of an election's `leader`: what the admin script's `holder` would say of the
/// lock, and the leader's stored value (`GEN|VALUE`) when there is one.
pub(crate) fn parse_election_leader(v: &Value) -> Option<(AdminReply, Option<String>)> {
    let Value::Array(items) = v else { return None };
    match items.as_slice() {
        [first, rest @ ..] if int(first) == Some(1) && rest.len() == 5 => {
            let admin = parse_admin(&Value::Array(items[..5].to_vec()))?;
            let said = match &items[5] {
                Value::Nil | Value::Int(0) | Value::Boolean(false) => None,
                other => Some(text(other)?),
            };
            Some((admin, said))
        }
        _ => Some((parse_admin(v)?, None)),
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

/// A refusal for a missing permission (an ACL rule without a command the script calls), from
/// a script call's reply: the server's message, and the command when the server names it.
///
/// Redis 7.2 and Valkey answer `NOPERM User U has no permissions to run the 'CMD' command`
/// (inside a script too); Redis 7.0 answers a command called by a script with `ERR The user
/// executing the script can't run this command or subcommand`, naming none.
pub(crate) fn permission_refusal(v: &Value) -> Option<(String, Option<String>)> {
    let Value::ServerError(e) = v else {
        return None;
    };
    let details = e.details().unwrap_or("");
    let refused = e.code() == "NOPERM"
        || details.contains("can't run this command")
        || details.contains("no permissions to run");
    if !refused {
        return None;
    }
    let command = details
        .split_once("to run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(cmd, _)| cmd.to_ascii_lowercase());
    Some((format!("{} {details}", e.code()), command))
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

/// The server clock of a `TIME` reply, in microseconds since the epoch.
pub(crate) fn parse_time(v: &Value) -> Option<u64> {
    let (s, us): (u64, u64) = redis::from_redis_value(v.clone()).ok()?;
    s.checked_mul(1_000_000)?.checked_add(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::lua::MARKER;

    #[test]
    #[allow(clippy::unwrap_used)]
    fn permission_refusals_are_told_apart() {
        let err = |code: &str, detail: &str| {
            redis::parse_redis_value(format!("-{code} {detail}\r\n").as_bytes()).unwrap()
        };
        let newer = err(
            "NOPERM",
            "User u has no permissions to run the 'pexpireat' command script: 1f, on @user_script:1.",
        );
        let (_, cmd) = permission_refusal(&newer).unwrap();
        assert_eq!(cmd.as_deref(), Some("pexpireat"));
        let older = err(
            "ERR",
            "The user executing the script can't run this command or subcommand script: 1f",
        );
        assert_eq!(permission_refusal(&older).unwrap().1, None);
        assert!(permission_refusal(&err("ERR", "renew_batch: 2 keys and 3 arguments")).is_none());
        assert!(permission_refusal(&Value::Int(1)).is_none());
    }

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
    fn every_script_is_built_with_what_it_names() {
        for w in Which::ALL {
            let source = w.source();
            let rest = w.body().rsplit(MARKER).next().unwrap_or("");
            assert!(source.ends_with(rest.trim_start_matches('\n')), "{w:?}");
            assert!(!source.contains(MARKER), "{w:?}");
            assert_eq!(lua_source(w.file()), Some(source));
        }
        // The fast path's block is capped by the generated header's MAX_BLOCK.
        let acquire = Which::Acquire.source();
        assert!(acquire.contains(&format!("local MAX_BLOCK = {MAX_BLOCK} ")));
        // Before the fast path, the fence's grant alone (and what it names) is built: the
        // value's helpers only after it.
        let fast = acquire
            .find("if redis.call('set', KEYS[1], v, 'nx'")
            .unwrap_or(0);
        assert!(
            acquire
                .find("local function take_token")
                .unwrap_or(usize::MAX)
                < fast
        );
        assert!(acquire.find("local function new_held").unwrap_or(0) > fast);
        // Every script that issues or raises a token does it through the fence, written once.
        let fence = |w: Which, f: &str| w.body().contains(&format!("{f}("));
        for w in [Which::Acquire, Which::MultiAcquire] {
            assert!(fence(w, "take_token"), "{w:?}");
        }
        for w in [Which::Fair, Which::RwWrite] {
            assert!(fence(w, "stamp"), "{w:?}");
        }
        for w in [Which::Release, Which::Renew, Which::RenewBatch] {
            assert!(fence(w, "raise_mark"), "{w:?}");
        }
        for w in Which::ALL {
            assert!(!fence(w, "reach") && !w.body().contains("MARKS."), "{w:?}");
        }
        assert_eq!(lua_source("rw_lock.lua"), None);
    }

    fn rel<'a>(level: Level, publish: Publish) -> Release<'a> {
        Release {
            acquisition: "g",
            level,
            request: "r",
            publish,
            fence: None,
        }
    }

    #[test]
    fn the_common_release_sends_the_acquisition_alone() {
        let k = LockKeys::new("p:", "a");
        let common = release(&k, &rel(Level::Outermost, Publish::IfFlagged), false);
        assert_eq!(
            &args(&common)[2..],
            ["2", "p:{a}:lock", "p:{a}:released", "g|"]
        );
        let retry = release(&k, &rel(Level::Outermost, Publish::IfFlagged), true);
        assert_eq!(&args(&retry)[5..], ["g|", "r", "", ""]);
        let inner = release(&k, &rel(Level::Inner, Publish::IfFlagged), true);
        assert_eq!(&args(&inner)[5..], ["g|", "i", "r", ""]);
        let mut quorum = rel(Level::Outermost, Publish::Always);
        quorum.fence = Some(7);
        let q = args(&release(&k, &quorum, false));
        assert_eq!(
            &q[2..],
            [
                "3",
                "p:{a}:lock",
                "p:{a}:released",
                "p:{#17817}:fence",
                "g|",
                "p",
                "",
                "7"
            ]
        );
        let undo = release(&k, &rel(Level::Outermost, Publish::Never), false);
        assert_eq!(&args(&undo)[5..], ["g|", "n", "", ""]);
        assert_eq!(
            parse_release(&Value::Int(-4)),
            Some(ReleaseReply::ReleasedBefore)
        );
        assert_eq!(
            parse_release(&Value::Int(0)),
            Some(ReleaseReply::Released {
                remaining: 0,
                listeners: 0
            })
        );
    }

    #[test]
    fn admin_replies_parse() {
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let held = Value::Array(vec![
            Value::Int(1),
            s("g|o|0|1|2"),
            Value::Int(1500),
            s("1700000000"),
            s("25"),
        ]);
        assert_eq!(
            parse_admin(&held),
            Some(AdminReply::Held {
                value: "g|o|0|1|2".into(),
                pttl: Duration::from_millis(1500),
                now_us: 1_700_000_000_000_025,
            })
        );
        assert_eq!(
            parse_admin(&Value::Array(vec![Value::Int(0)])),
            Some(AdminReply::Free)
        );
        assert_eq!(
            parse_admin(&Value::Array(vec![Value::Int(-1)])),
            Some(AdminReply::Foreign)
        );
        assert_eq!(parse_admin(&Value::Array(vec![])), None);
        assert_eq!(parse_admin(&Value::Array(vec![Value::Int(1)])), None);
        assert_eq!(parse_admin(&Value::Nil), None);
        let k = LockKeys::new("p:", "a");
        assert_eq!(
            &args(&mutex_admin(&k, Admin::Force))[2..],
            ["2", "p:{a}:lock", "p:{a}:released", "force"]
        );
    }

    #[test]
    fn acquire_calls_and_the_fast_reply() {
        let k = LockKeys::new("p:", "a");
        let mut a = Acquire {
            owner: "o",
            lease: Duration::from_secs(3),
            request: "q",
            live: None,
            block: 16,
            waited: false,
            quorum: false,
        };
        assert_eq!(
            &args(&acquire(&k, &a))[2..],
            ["2", "p:{a}:lock", "p:{#17817}:fence", "q|o|16", "3000"]
        );
        let fresh = parse_mutex_acquire(&Value::Int(1_000), &a);
        assert_eq!(
            fresh,
            Some(AcquireReply::Held {
                token: 1_000,
                count: 1,
                acquisition: "q".into(),
                last: 1_016,
            })
        );
        a.waited = true;
        assert_eq!(
            &args(&acquire(&k, &a))[3..],
            [
                "p:{a}:lock",
                "p:{#17817}:fence",
                "q|o|16",
                "3000",
                "",
                "0",
                "w"
            ]
        );
        a.waited = false;
        a.live = Some(Live {
            acquisition: "g",
            extend: Duration::from_secs(3),
        });
        assert_eq!(
            &args(&acquire(&k, &a))[3..],
            [
                "p:{a}:lock",
                "p:{#17817}:fence",
                "q|o|16",
                "3000",
                "g",
                "3000"
            ]
        );
        // A quorum reserves no block.
        a.quorum = true;
        a.live = None;
        assert_eq!(
            &args(&acquire(&k, &a))[2..],
            ["2", "p:{a}:lock", "p:{#17817}:fence", "q|o|0", "3000"]
        );
        assert_eq!(
            parse_mutex_acquire(&Value::Int(1_000), &a).map(|r| match r {
                AcquireReply::Held { last, .. } => last,
                _ => 0,
            }),
            Some(1_000)
        );
        assert_eq!(parse_mutex_acquire(&Value::Int(-1), &a), None);
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

    #[test]
    fn one_lease_is_renewed_by_the_per_lock_script() {
        let k = LockKeys::new("p:", "a");
        let call = renew_many(&[renewing(&k, "g", 0)]);
        assert_eq!(call.which, Which::Renew);
        let a = args(&call);
        assert_eq!(a[0], "EVALSHA");
        assert_eq!(&a[2..], ["1", "p:{a}:lock", "g|", "3000"]);
        let quorum = renew_many(&[renewing(&k, "g", 7)]);
        assert_eq!(
            &args(&quorum)[2..],
            ["2", "p:{a}:lock", "p:{#17817}:fence", "g|", "3000", "7"]
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
                "ga|",
                "gb|"
            ]
        );
        let quorum = renew_many(&[renewing(&a, "ga", 7), renewing(&b, "gb", 9)]);
        assert_eq!(
            &args(&quorum)[2..],
            [
                "4",
                "p:{a}:lock",
                "p:{b}:lock",
                "p:{#17817}:fence",
                "p:{#17814}:fence",
                "1",
                "1",
                "3000",
                "2",
                "ga|",
                "gb|",
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
            ["0", "2", "3000", "3", "9000", "1", "g|", "g|", "g|", "g|"]
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
