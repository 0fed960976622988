//! The script table and what every lock type's calls share.
//!
//! Each script lives in `src/protocol/scripts/*.lua`, opening with its KEYS/ARGV contract; its
//! source is that body with the constants and shared helpers it uses put before it (see
//! [`crate::protocol::lua`]). [`Which`] names them, and one table (the `scripts!` list below)
//! gives each its file: the enum, the file list, the sources and their SHA1s follow from it.
//! They are built and hashed once per process ([`LazyLock`]) and sent with `EVALSHA`; a master
//! that answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`) gets the script loaded and the
//! call resent (see `topology/backend/`).
//!
//! Each lock type's calls and the parsing of their replies are in the module of its name,
//! beside its Lua (`mutex.rs`, `multi.rs`, `election.rs`, `fair_mutex.rs`, `rw_lock.rs`,
//! `semaphore.rs`); here are what they share: [`Call`] (its keys, then its arguments added
//! with [`Call::arg`]), [`renew_holder`] (the read-write lock's and the semaphore's renewal),
//! [`Holder`], [`Live`], [`Level`] and [`Admin`], the replies an acquire and a release come to
//! ([`AcquireReply`], [`ReleaseReply`]) and the parsers several types use, the server clock
//! ([`micros`]), and the renewal replies (the holders' values an operator's calls return are
//! parsed in `lock_value.rs`).
//!
//! The scripts keep the calling conventions they have: the fair mutex and the semaphore name
//! an operation by a one-letter first argument of one script, the read-write lock and the
//! Mutex have a script per operation. The wire form is what fault tests and operators' tools
//! recognise a call by, so it stays; what the types share on the server is written once in the
//! prelude (`scripts/prelude/*.lua`) and, for a holder's renewal, in `renew_holder.lua`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ServerErrorKind, Value};

use crate::error::Error;
use crate::protocol::keys::LockKeys;
use crate::transport::fault::Fault;

/// The script table: each script's name in [`Which`] and its file in `src/protocol/scripts/`.
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $file:literal,)*) => {
        /// One of the scripts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Which {
            $($(#[$doc])* $name,)*
        }

        impl Which {
            /// Every script, in the table's order.
            pub(crate) const ALL: [Which; [$($file),*].len()] = [$(Which::$name),*];

            /// The file of the script's body, in `src/protocol/scripts/`.
            #[cfg(test)]
            pub(crate) fn file(self) -> &'static str {
                match self {
                    $(Which::$name => $file,)*
                }
            }

            /// The script's body: its file's text.
            pub(crate) fn body(self) -> &'static str {
                match self {
                    $(Which::$name => include_str!(concat!("scripts/", $file)),)*
                }
            }
        }
    };
}

scripts! {
    /// A Mutex acquire (its fast path is also a function, `library.rs`).
    Acquire = "acquire.lua",
    /// The release of one level of a Mutex.
    Release = "release.lua",
    /// The renewal of one Mutex lease.
    Renew = "renew.lua",
    /// The renew script for several locks in one call.
    RenewBatch = "renew_batch.lua",
    /// Every operation of the fair mutex, named by a one-letter opcode.
    Fair = "fair_mutex.lua",
    /// Every operation of the semaphore but its renewal, named by a one-letter opcode.
    Sem = "sem_permits.lua",
    /// A read-write lock's write acquire.
    RwWrite = "rw_write.lua",
    /// A read-write lock's read acquire.
    RwRead = "rw_read.lua",
    /// The release of a read-write lock's writer or reader.
    RwRelease = "rw_release.lua",
    /// The renewal of a holder that is a string or a member of a sorted set of holders: a
    /// read-write lock's writer or reader, or a semaphore's holder.
    RenewHolder = "renew_holder.lua",
    /// A re-entry of a read-write lock's writer or reader.
    RwReenter = "rw_reenter.lua",
    /// A waiter leaves a read-write lock's waiting sets.
    RwCancel = "rw_cancel.lua",
    /// Reads a read-write lock, or frees it by force, for an operator.
    RwAdmin = "rw_admin.lua",
    /// Acquires several mutex locks at once, all or none.
    MultiAcquire = "multi_acquire.lua",
    /// Releases one level of several mutex locks at once.
    MultiRelease = "multi_release.lua",
    /// Reads a mutex lock, or frees it by force, for an operator.
    MutexAdmin = "mutex_admin.lua",
    /// What only an election does: announce a leader, proclaim its value, read both.
    Election = "election.lua",
}

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

impl Which {
    fn script(self) -> &'static Script {
        &SCRIPTS[self as usize]
    }

    /// The script's Lua source, as it is sent: the body with the constants and helpers it
    /// uses (see [`crate::protocol::lua`]).
    pub(crate) fn source(self) -> &'static str {
        &SOURCES[self as usize]
    }
}

/// The Lua source the client sends for the script whose body is the file `file` of
/// `src/protocol/scripts/` (`"acquire.lua"`, `"rw_write.lua"`, ...), or `None` for no such
/// script. (The integration tests build the same text with the harness's `lua_source`.)
#[cfg(test)]
pub(crate) fn lua_source(file: &str) -> Option<&'static str> {
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

impl Call {
    /// `EVALSHA` of `which` with `keys`; the caller adds the arguments ([`arg`](Call::arg)).
    pub(crate) fn new(which: Which, keys: &[&str]) -> Call {
        // Room for a lock call's arguments at once, rather than growing as they are added.
        let mut cmd = redis::Cmd::with_capacity(12, 256);
        cmd.arg("EVALSHA")
            .arg(which.script().get_hash())
            .arg(keys.len())
            .arg(keys);
        Call { which, cmd }
    }

    /// The call with `arg` added (a number is sent in decimal, as the scripts read it).
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Call {
        self.cmd.arg(arg);
        self
    }

    /// The call with `arg` added when `on`.
    pub(crate) fn arg_if(self, on: bool, arg: &str) -> Call {
        if on { self.arg(arg) } else { self }
    }
}

/// The renewal of `holder`'s string, or its member of a sorted set of holders, at `keys.lock`
/// (`renew_holder.lua`): `what` is `"write"` or `"read"` (a read-write lock's writer or
/// reader) or `"permits"` (a semaphore's holder).
pub(crate) fn renew_holder(
    keys: &LockKeys,
    what: &str,
    holder: Holder<'_>,
    lease: Duration,
) -> Call {
    Call::new(Which::RenewHolder, &[&keys.lock])
        .arg(what)
        .arg(named(holder.acquisition))
        .arg(millis(lease))
}

pub(crate) use crate::protocol::lua::MAX_BLOCK;

/// `GEN|`: how the scripts name an acquisition (a holder's value begins with it).
pub(crate) fn named(acquisition: &str) -> Joined<'_, 2> {
    Joined([acquisition.as_bytes(), b"|"])
}

/// One argument of a call made of its parts, written one after the other straight into the
/// call's command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Joined<'a, const N: usize>(pub(crate) [&'a [u8]; N]);

impl<const N: usize> redis::ToRedisArgs for Joined<'_, N> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // The writer appends to the command's buffer: it cannot fail.
            let _ = std::io::Write::write_all(&mut arg, part);
        }
    }
}

/// The holder string a grant starts with: `GEN|OWNER`.
pub(crate) fn member(owner: &str, request: &str) -> String {
    format!("{request}|{owner}")
}

/// A re-entry's `extend` in milliseconds, as the scripts take it: 0 leaves the expiry alone.
pub(crate) fn extend_ms(extend: Duration) -> u64 {
    if extend.is_zero() { 0 } else { millis(extend) }
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

/// A number of milliseconds in a reply (a lease left, a wait), as a duration; a negative
/// number is zero.
pub(crate) fn ms(v: &Value) -> Option<Duration> {
    Some(Duration::from_millis(u64::try_from(int(v)?).unwrap_or(0)))
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

/// The caller's live hold on a lock, for a re-entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live<'a> {
    /// The hold's acquisition (the lock's `gen`).
    pub(crate) acquisition: &'a str,
    /// The lease the key must have left after the re-entry (the hold's own lease); zero
    /// leaves the expiry as it is (a fixed lease).
    pub(crate) extend: Duration,
}

/// Who releases or renews: the owner, and the acquisition (the lock's `gen`) its guard belongs to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    pub(crate) owner: &'a str,
    pub(crate) acquisition: &'a str,
}

/// What an operator asks of a lock (each type's admin call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admin {
    /// Read the lock: its holders, their leases left, the server clock.
    Holder,
    /// Free it whoever holds it, and wake every waiter.
    Force,
}

impl Admin {
    /// The operation's letter in the scripts that name it by one (`fair_mutex.lua`,
    /// `sem_permits.lua`).
    pub(crate) fn letter(self) -> &'static str {
        match self {
            Admin::Holder => "i",
            Admin::Force => "f",
        }
    }
}

/// Which levels a release gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// The holder's outermost level: the lock is freed, whatever count the server has.
    Outermost,
    /// An inner level: one level is counted down; the lock is never freed by it.
    Inner,
}

/// Parses an acquire reply in its array form: `{1, token, count, gen[, last]}` held, `{0, ttl}`
/// busy, `{-1}` foreign.
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
            Some(AcquireReply::Busy { ttl: ms(ttl)? })
        }
        (-1, _, _) => Some(AcquireReply::Foreign),
        _ => None,
    }
}

/// Parses an acquire reply for acquisition `request`, which asked for `block` tokens for local
/// hand-offs: the fast reply (a grant on a free lock) is one integer, the fencing token (`1`
/// where the type has none), naming the acquisition after the request; the other replies are
/// as [`parse_acquire`] reads them.
pub(crate) fn parse_grant(v: &Value, request: &str, block: u32) -> Option<AcquireReply> {
    if let Value::Int(token) = v {
        let token = u64::try_from(*token).ok()?;
        return Some(AcquireReply::Held {
            token,
            count: 1,
            acquisition: request.to_owned(),
            last: token.checked_add(u64::from(block))?,
        });
    }
    parse_acquire(v)
}

/// A release script's code: `n >= 0` released (`n` levels left), `-1`
/// [`ReleaseReply::Missing`], `-2` [`ReleaseReply::OtherOwner`], `-3` [`ReleaseReply::Foreign`],
/// `-4` [`ReleaseReply::ReleasedBefore`]; `listeners` received what the release published.
pub(crate) fn release_code(n: i64, listeners: u64) -> Option<ReleaseReply> {
    match n {
        n if n >= 0 => Some(ReleaseReply::Released {
            remaining: n.unsigned_abs(),
            listeners,
        }),
        -1 => Some(ReleaseReply::Missing),
        -2 => Some(ReleaseReply::OtherOwner),
        -3 => Some(ReleaseReply::Foreign),
        -4 => Some(ReleaseReply::ReleasedBefore),
        _ => None,
    }
}

/// Parses the release reply of a fair mutex (`scripts/fair_mutex.lua`), a read-write lock
/// (`rw_release.lua`) or a semaphore (`sem_permits.lua`): one integer, a [`release_code`] (for
/// a fair mutex's inner level, `n >= 1` levels are left). Nothing is published that the caller
/// counts, so `listeners` is 0. `None` for a reply of another shape.
pub(crate) fn parse_family_release(v: &Value) -> Option<ReleaseReply> {
    match v {
        Value::Int(n) => release_code(*n, 0),
        _ => None,
    }
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
    let refused = e.kind() == Some(ServerErrorKind::NoPerm)
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
        // One lease's renew script: 1 extended, another integer not owned any more.
        _ if n == 1 => vec![int(v).map(|r| r == 1)],
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
    micros(s, us)
}

/// A server clock reading of `s` seconds and `us` microseconds (as `TIME` gives it, and as the
/// scripts store a grant's time), in microseconds since the epoch.
pub(crate) fn micros(s: u64, us: u64) -> Option<u64> {
    s.checked_mul(1_000_000)?.checked_add(us)
}

/// The holder and lease the tests of the calls use.
#[cfg(test)]
pub(crate) const HOLDER: Holder<'static> = Holder {
    owner: "o",
    acquisition: "g",
};
#[cfg(test)]
pub(crate) const LEASE: Duration = Duration::from_secs(3);

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
            // The harness's copy, which the integration tests use, is the text sent.
            assert_eq!(
                locksmith_testkit::lua_source(w.file()),
                Some(source),
                "{w:?}"
            );
        }
        let files: Vec<&str> = Which::ALL.iter().map(|w| w.file()).collect();
        let harness: Vec<&str> = locksmith_testkit::script_files().collect();
        assert_eq!(harness, files);
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
        assert_eq!(lua_source("rw_renew.lua"), None);
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

    #[test]
    fn a_fast_grant_is_one_integer() {
        assert_eq!(
            parse_grant(&Value::Int(1_764_000_000_000_000), "g", 0),
            Some(AcquireReply::Held {
                token: 1_764_000_000_000_000,
                count: 1,
                acquisition: "g".into(),
                last: 1_764_000_000_000_000,
            })
        );
        assert_eq!(parse_grant(&Value::Int(-1), "g", 0), None);
        assert_eq!(
            parse_grant(&Value::Array(vec![Value::Int(-1)]), "g", 0),
            Some(AcquireReply::Foreign)
        );
    }

    #[test]
    fn family_releases_parse() {
        assert_eq!(
            parse_family_release(&Value::Int(0)),
            Some(ReleaseReply::Released {
                remaining: 0,
                listeners: 0
            })
        );
        assert_eq!(
            parse_family_release(&Value::Int(2)),
            Some(ReleaseReply::Released {
                remaining: 2,
                listeners: 0
            })
        );
        for (n, r) in [
            (-1, ReleaseReply::Missing),
            (-2, ReleaseReply::OtherOwner),
            (-3, ReleaseReply::Foreign),
            (-4, ReleaseReply::ReleasedBefore),
        ] {
            assert_eq!(parse_family_release(&Value::Int(n)), Some(r), "{n}");
        }
        assert_eq!(parse_family_release(&Value::Int(-5)), None);
        assert_eq!(parse_family_release(&Value::Nil), None);
        assert_eq!(
            parse_family_release(&Value::Array(vec![Value::Int(0), Value::Int(1)])),
            None
        );
    }
}
