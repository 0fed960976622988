//! The Mutex's calls (`scripts/acquire.lua`, `release.lua`, `renew.lua`, `renew_batch.lua`,
//! `mutex_admin.lua`) and the parsing of their replies.
//!
//! An uncontended acquire and release take the fewest arguments the scripts accept (see
//! [`acquire`] and [`release`]); the acquire and release are also functions of the library
//! (`library.rs`), called with the same arguments.

use std::time::Duration;

use redis::Value;

use crate::protocol::keys::{LockKeys, digits};
use crate::protocol::scripts::{
    AcquireReply, Admin, Call, Joined, Level, Live, MAX_BLOCK, ReleaseReply, Which, extend_ms, int,
    micros, millis, ms, named, parse_grant, release_code, text,
};

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
    debug_assert!(!a.owner.contains('|') && !a.request.contains('|'));
    let call = Call::new(Which::Acquire, &[&keys.lock, &keys.fence])
        .arg(Joined([
            a.request.as_bytes(),
            b"|",
            a.owner.as_bytes(),
            b"|",
            digits::<10>(u64::from(a.block()), &mut [0; 20]),
        ]))
        .arg(millis(a.lease));
    let live = a.live.map(|l| (l.acquisition, extend_ms(l.extend)));
    if live.is_none() && !a.waited {
        return call;
    }
    let (acquisition, extend) = live.unwrap_or(("", 0));
    call.arg(acquisition).arg(extend).arg_if(a.waited, "w")
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
    let all = [&keys.lock, &keys.channel, &keys.fence].map(String::as_str);
    let call = Call::new(
        Which::Release,
        &all[..if r.fence.is_some() { 3 } else { 2 }],
    )
    .arg(named(r.acquisition));
    let mut how = how(r.level, retry);
    match r.publish {
        Publish::IfFlagged => {}
        Publish::Always => how.push('p'),
        Publish::Never => how.push('n'),
    }
    if how.is_empty() && r.fence.is_none() {
        return call;
    }
    let rel = match r.level {
        Level::Inner => r.request,
        Level::Outermost => "",
    };
    call.arg(how)
        .arg(rel)
        .arg(r.fence.map_or_else(String::new, |t| t.to_string()))
}

/// How a release script (`release.lua`, `multi_release.lua`) is told which level goes: `i` an
/// inner level, `r` the retry of an outermost level, nothing for its first try; the caller
/// adds how it publishes.
pub(crate) fn how(level: Level, retry: bool) -> String {
    match level {
        Level::Inner => "i",
        Level::Outermost if retry => "r",
        Level::Outermost => "",
    }
    .to_owned()
}

/// The renew script for the Mutex acquisition `acquisition`; `fence`: with a quorum, the
/// holder's token, which the fencing mark is raised to.
pub(crate) fn renew(
    keys: &LockKeys,
    acquisition: &str,
    lease: Duration,
    fence: Option<u64>,
) -> Call {
    let all = [&keys.lock, &keys.fence].map(String::as_str);
    let call = Call::new(Which::Renew, &all[..if fence.is_some() { 2 } else { 1 }])
        .arg(named(acquisition))
        .arg(millis(lease));
    match fence {
        Some(token) => call.arg(token),
        None => call,
    }
}

/// One lease of a batched renewal: the lock, its acquisition (which alone names the holder),
/// the lease to set, and the token to raise the fencing mark to (0: leave the mark alone, as
/// with a single master).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewing<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) acquisition: &'a str,
    pub(crate) lease: Duration,
    pub(crate) token: u64,
}

/// The renewal of `leases` in one script call: `renew.lua` for one lease, `renew_batch.lua`
/// for several. Its reply gives one outcome per lease (see [`parse_renews`](crate::protocol::scripts::parse_renews)). The caller
/// keeps a call within one Cluster slot where that matters, and its size bounded.
pub(crate) fn renew_many(leases: &[Renewing<'_>]) -> Call {
    if let [one] = leases {
        let fence = (one.token != 0).then_some(one.token);
        return renew(one.keys, one.acquisition, one.lease, fence);
    }
    // The tokens are all 0 (a single master) or none is (a quorum): one mode for the call.
    let fence = leases.iter().any(|l| l.token != 0);
    let mut keys: Vec<&str> = leases.iter().map(|l| l.keys.lock.as_str()).collect();
    if fence {
        keys.extend(leases.iter().map(|l| l.keys.fence.as_str()));
    }
    // Runs of consecutive leases with one lease: each run's lease is sent once (the caller
    // orders the leases so that runs are long).
    let runs: Vec<_> = leases
        .chunk_by(|a, b| millis(a.lease) == millis(b.lease))
        .collect();
    let mut call = Call::new(Which::RenewBatch, &keys);
    call.cmd.arg(if fence { "1" } else { "0" }).arg(runs.len());
    for run in runs {
        call.cmd.arg(millis(run[0].lease)).arg(run.len());
    }
    for l in leases {
        call.cmd.arg(named(l.acquisition));
    }
    if fence {
        for l in leases {
            call.cmd.arg(l.token);
        }
    }
    call
}

/// Parses a Mutex acquire reply to the call `a`: the integer of a fresh grant (count 1, the
/// acquisition named after the request, the block asked for), or as
/// [`parse_acquire`](crate::protocol::scripts::parse_acquire).
pub(crate) fn parse_acquire(v: &Value, a: &Acquire<'_>) -> Option<AcquireReply> {
    parse_grant(v, a.request, a.block())
}

/// The admin script call for `op` on the Mutex `keys`.
pub(crate) fn admin(keys: &LockKeys, op: Admin) -> Call {
    Call::new(Which::MutexAdmin, &[&keys.lock, &keys.channel]).arg(match op {
        Admin::Holder => "holder",
        Admin::Force => "force",
    })
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
    match (items.first().and_then(int)?, items.get(1..).unwrap_or(&[])) {
        (1, [value, pttl, s, us]) => Some(AdminReply::Held {
            value: text(value)?,
            pttl: ms(pttl).unwrap_or_default(),
            now_us: micros(u64::try_from(int(s)?).ok()?, u64::try_from(int(us)?).ok()?)?,
        }),
        (0, []) => Some(AdminReply::Free),
        (-1, []) => Some(AdminReply::Foreign),
        _ => None,
    }
}

/// Parses a release reply: `{0, receivers}` freed and published, or a [`release_code`].
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
    release_code(int(v)?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::scripts::args;

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
            &args(&admin(&k, Admin::Force))[2..],
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
        let fresh = parse_acquire(&Value::Int(1_000), &a);
        assert_eq!(
            fresh,
            Some(AcquireReply::Held {
                token: 1_000,
                count: 1,
                acquisition: "q".into(),
                last: 1_016,
            })
        );
        // A waiter, then a re-entry: the same keys and grant, then what each adds.
        let head = ["p:{a}:lock", "p:{#17817}:fence", "q|o|16", "3000"];
        a.waited = true;
        let waited = args(&acquire(&k, &a));
        assert_eq!(&waited[3..], [&head[..], &["", "0", "w"]].concat());
        a.waited = false;
        a.live = Some(Live {
            acquisition: "g",
            extend: Duration::from_secs(3),
        });
        let reentry = args(&acquire(&k, &a));
        assert_eq!(&reentry[3..], [&head[..], &["g", "3000"]].concat());
        // A quorum reserves no block.
        a.quorum = true;
        a.live = None;
        assert_eq!(
            &args(&acquire(&k, &a))[2..],
            ["2", "p:{a}:lock", "p:{#17817}:fence", "q|o|0", "3000"]
        );
        assert_eq!(
            parse_acquire(&Value::Int(1_000), &a).map(|r| match r {
                AcquireReply::Held { last, .. } => last,
                _ => 0,
            }),
            Some(1_000)
        );
        assert_eq!(parse_acquire(&Value::Int(-1), &a), None);
    }

    fn renewing<'a>(keys: &'a LockKeys, acquisition: &'a str, token: u64) -> Renewing<'a> {
        Renewing {
            keys,
            acquisition,
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
    fn a_batch_sends_each_lease_once_per_run() {
        let keys: Vec<LockKeys> = (0..4)
            .map(|i| LockKeys::new("p:", &i.to_string()))
            .collect();
        let mut leases: Vec<Renewing<'_>> = keys.iter().map(|k| renewing(k, "g", 0)).collect();
        leases[3].lease = Duration::from_secs(9);
        let a = args(&renew_many(&leases));
        assert_eq!(
            &a[7..],
            ["0", "2", "3000", "3", "9000", "1", "g|", "g|", "g|", "g|"]
        );
    }

    #[test]
    fn release_replies_parse() {
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
    }
}
