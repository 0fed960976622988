//! An acquire on the masters: on one master, or on a quorum (held by `Q` of `N`, whatever was
//! granted undone otherwise), and the primed acquire a sleeping leader leaves for the
//! subscriber thread to write (see [`Primed`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use super::{Backend, MAX_PRIMED, jitter, one};
use crate::error::{Error, Result};
use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::{self, Publish};
use crate::protocol::scripts::{AcquireReply, Call, Level, Live, Which};
use crate::transport::conn::{Conn, Deadline};
use crate::transport::fault::Fault;

/// What an acquire across the masters came to.
#[derive(Debug, Clone)]
pub(crate) enum Acquired {
    /// Held by the caller, in the acquisition the masters call `gen`; the tokens after
    /// `token` up to `last` are reserved for its local hand-offs (`last == token`: none).
    Held {
        token: u64,
        count: u64,
        acquisition: String,
        last: u64,
    },
    /// Not held; worth another attempt after `wait` at the latest. `split`: some masters
    /// granted it (a quorum lock in transition, for example a release that reached some
    /// masters but not yet others).
    Busy { wait: Duration, split: bool },
}

/// One acquire call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireCall<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    /// Unique per acquire call, the same on its retries; names the acquisition when granted.
    pub(crate) request: &'a str,
    /// The caller's live hold on this lock: `Some` makes this a re-entry.
    pub(crate) live: Option<Live<'a>>,
    /// When the call started; a quorum grant's validity is judged against it.
    pub(crate) sent: Instant,
    /// The bound of the call.
    pub(crate) by: Deadline,
    /// Tokens a new acquisition reserves after its own for local hand-offs (0: none).
    pub(crate) block: u32,
    /// The caller waited for the lock (an attempt after a release, or after a failed one): a
    /// new acquisition is flagged at once, so that its release publishes.
    pub(crate) waited: bool,
}

impl AcquireCall<'_> {
    /// The script's view of the call (`quorum`: on a quorum of masters).
    fn script(&self, quorum: bool) -> mutex::Acquire<'_> {
        mutex::Acquire {
            owner: self.owner,
            lease: self.lease,
            request: self.request,
            live: self.live,
            block: self.block,
            waited: self.waited,
            quorum,
        }
    }
}

/// An acquire script call packed on a connection, for a thread that does not wait for its
/// reply to write it: the pub/sub thread writes a leader's acquire the moment the release
/// message arrives, before it wakes the leader, so that the acquire does not wait for that
/// thread hop (see the waiting driver, `locks/driver.rs`). The leader reads the reply.
pub(crate) struct Primed {
    con: Conn,
    packed: Vec<u8>,
    which: Which,
    /// For a primed Mutex acquire: its request id and hand-off block, by which its reply is
    /// read (a fresh grant answers with its token alone).
    acquire: Option<(String, u32)>,
    _slot: PrimedSlot,
}

/// One of a client's [`MAX_PRIMED`] places for a primed acquire, given back when dropped.
struct PrimedSlot(Arc<AtomicUsize>);

impl PrimedSlot {
    fn take(count: &Arc<AtomicUsize>) -> Option<PrimedSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PRIMED).then_some(n + 1)
            })
            .ok()
            .map(|_| PrimedSlot(Arc::clone(count)))
    }
}

impl Drop for PrimedSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Primed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primed").finish_non_exhaustive()
    }
}

impl Primed {
    /// Writes the call. Bounded by the command timeout (set when primed); a write on an idle
    /// connection only fills the socket's buffer.
    pub(crate) fn fire(&mut self) -> Result<()> {
        self.con.send_now(&self.packed).map_err(Error::from)
    }
}

/// An acquire script's reply to `a`, parsed.
fn acquire_reply(v: Value, a: &mutex::Acquire<'_>) -> Result<AcquireReply, Fault> {
    mutex::parse_acquire(&v, a).ok_or_else(|| Fault::bad_reply("acquire", &v))
}

/// What one master's acquire reply means for the caller.
fn single_acquired(keys: &LockKeys, reply: Result<AcquireReply, Fault>) -> Result<Acquired> {
    match reply? {
        AcquireReply::Held {
            token,
            count,
            acquisition,
            last,
        } => Ok(Acquired::Held {
            token,
            count,
            acquisition,
            last,
        }),
        AcquireReply::Busy { ttl } => Ok(Acquired::Busy {
            wait: ttl,
            split: false,
        }),
        AcquireReply::Foreign => Err(Error::ForeignKey {
            key: keys.lock.clone(),
        }),
    }
}

impl Backend {
    /// A single plain master's acquire, ready for another thread to write the moment the lock
    /// is released (see [`Primed`]): the script call packed, on an idle pooled connection
    /// whose timeouts are set to the command timeout. `None` where that does not apply (a
    /// quorum, a cluster, a client that waits for replicas, a re-entry) or when no idle
    /// connection is at hand (opening one is left to the plain path), or [`MAX_PRIMED`] are
    /// primed already.
    pub(crate) fn prime_acquire(&self, a: &AcquireCall<'_>) -> Option<Primed> {
        if a.live.is_some() {
            return None;
        }
        let script = a.script(false);
        let mut primed = self.prime_script(&mutex::acquire(a.keys, &script))?;
        primed.acquire = Some((a.request.to_owned(), script.block()));
        Some(primed)
    }

    /// Any script call primed as [`prime_acquire`](Backend::prime_acquire) primes an acquire
    /// (a set's acquire, for one): on a single plain master only, when an idle pooled
    /// connection is at hand and fewer than [`MAX_PRIMED`] are primed.
    pub(crate) fn prime_script(&self, call: &Call) -> Option<Primed> {
        if self.nodes.len() != 1 || self.cluster.is_some() || self.wait.is_some() {
            return None;
        }
        let slot = PrimedSlot::take(&self.primed)?;
        let mut con = self.nodes[0].pool.idle()?;
        if let Err(e) = con.set_timeouts(self.command_timeout) {
            log::debug!("priming a script call: {e}");
            return None;
        }
        Some(Primed {
            con,
            packed: self.pack(call),
            which: call.which,
            acquire: None,
            _slot: slot,
        })
    }

    /// Gives back the connection of an acquire that was primed and never written.
    pub(crate) fn unprime(&self, p: Primed) {
        self.nodes[0].pool.put(p.con);
    }

    /// The outcome of a primed acquire that was written (`wrote`), within `by`. A failed write
    /// is a failure of the connection: the caller retries the same request on the plain path
    /// (a request id makes the retry of a call that ran answer as that call did).
    pub(crate) fn finish_acquire(
        &self,
        mut p: Primed,
        wrote: Result<()>,
        keys: &LockKeys,
        by: Deadline,
    ) -> Result<Acquired> {
        let (request, block) = p.acquire.take().unwrap_or_default();
        let script = mutex::Acquire {
            owner: "",
            lease: Duration::ZERO,
            request: &request,
            live: None,
            block,
            waited: true,
            quorum: false,
        };
        let reply = self
            .finish_primed(p, wrote, by)
            .and_then(|v| acquire_reply(v, &script));
        single_acquired(keys, reply)
    }

    /// The reply of a primed script call that was written (`wrote`), within `by`; as
    /// [`finish_acquire`](Backend::finish_acquire), unparsed.
    pub(crate) fn finish_script(
        &self,
        p: Primed,
        wrote: Result<()>,
        by: Deadline,
    ) -> Result<Value> {
        self.finish_primed(p, wrote, by).map_err(Error::from)
    }

    /// [`finish_script`](Backend::finish_script), with its fault. A failed write (`wrote`:
    /// the public error of [`Primed::fire`], an I/O error or a socket's timeout) counts
    /// against the connection as any other failure does.
    fn finish_primed(&self, p: Primed, wrote: Result<()>, by: Deadline) -> Result<Value, Fault> {
        if let Err(e) = wrote {
            let e = Fault::Other(e);
            self.failed(0, &e);
            return Err(e);
        }
        let Primed {
            con, packed, which, ..
        } = p;
        let read_by = by.min(Deadline::after(self.call_timeout));
        self.collect(0, con, &packed, 1, which, self.call_timeout, read_by, by)
            .and_then(|mut v| one(v.pop()))
    }

    /// Acquires on the masters. `sent` must be taken before this call; the validity of a
    /// quorum grant is judged against it.
    pub(crate) fn acquire(&self, a: &AcquireCall<'_>) -> Result<Acquired> {
        let AcquireCall {
            keys,
            lease,
            request,
            live,
            sent,
            by,
            ..
        } = *a;
        // A quorum never hands off locally (see `Client::redlock`): it reserves no tokens.
        let script = a.script(!self.single());
        let call = mutex::acquire(keys, &script);
        if self.single() && self.wait.is_some() {
            return self.acquire_replicated(&call, a);
        }
        // With a quorum, one round is kept back for giving back a partial grant at once.
        let round_by = if self.single() {
            by
        } else {
            by.minus(self.call_timeout)
        };
        let replies = self.call_all(&call, &self.all(), round_by, false);
        let parsed: Vec<(usize, Result<AcquireReply, Fault>)> = replies
            .into_iter()
            .map(|(i, r)| (i, r.and_then(|v| acquire_reply(v, &script))))
            .collect();
        if self.single() {
            return match parsed.into_iter().next().map(|(_, r)| r) {
                Some(r) => single_acquired(keys, r),
                None => Err(Error::NoQuorum {
                    reached: 0,
                    needed: 1,
                }),
            };
        }
        let (mut held, mut busy, mut failed, mut maybe_ran, mut foreign) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), false);
        let mut first_error = None;
        for (i, r) in parsed {
            match r {
                Ok(AcquireReply::Held {
                    token,
                    count,
                    acquisition,
                    ..
                }) => held.push((i, token, count, acquisition)),
                Ok(AcquireReply::Busy { ttl }) => busy.push(ttl),
                Ok(AcquireReply::Foreign) => foreign = true,
                Err(e) => {
                    failed.push(i);
                    // A master skipped as marked down, or left for lack of time, never got the
                    // command; any other failure may have come after the script ran there.
                    if !e.nothing_sent() {
                        maybe_ran.push(i);
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        let n = self.nodes.len();
        // The masters may disagree on the acquisition (a re-entry on some, a new acquisition
        // on those that had lost the hold): only one acquisition granted by a quorum is held.
        let winner = held
            .iter()
            .map(|h| &h.3)
            .find(|g| held.iter().filter(|h| &h.3 == *g).count() >= self.quorum)
            .cloned();
        if let Some(acquisition) = winner.filter(|_| !foreign) {
            let elapsed = sent.elapsed();
            if lease > elapsed + self.drift(lease) {
                let ours = held.iter().filter(|h| h.3 == acquisition);
                let token = ours.clone().map(|h| h.1).max().unwrap_or(0);
                let count = ours.map(|h| h.2).max().unwrap_or(1);
                // Masters that granted another acquisition give it back.
                let stray: Vec<_> = held
                    .iter()
                    .filter(|h| h.3 != acquisition)
                    .cloned()
                    .collect();
                self.undo(keys, request, &stray, &[], by);
                return Ok(Acquired::Held {
                    token,
                    count,
                    acquisition,
                    last: token,
                });
            }
        }
        // Not held: give back what was granted, on the masters that granted it and (unless
        // this was a re-entry, whose levels must not be undone twice) on those that did not
        // answer, since the script may have run there before the reply was lost.
        let split = !held.is_empty();
        let unanswered = if live.is_none() {
            maybe_ran
        } else {
            Vec::new()
        };
        self.undo(keys, request, &held, &unanswered, by);
        if foreign {
            return Err(Error::ForeignKey {
                key: keys.lock.clone(),
            });
        }
        if failed.len() > n - self.quorum {
            log::debug!(
                "no quorum for `{}`: {} of {} masters answered ({})",
                keys.name,
                n - failed.len(),
                n,
                first_error.map(|e| e.to_string()).unwrap_or_default()
            );
            return Err(Error::NoQuorum {
                reached: n - failed.len(),
                needed: self.quorum,
            });
        }
        // Enough masters must become free: wait for the shortest remaining leases that make
        // that possible, or (a split vote) retry after a random delay.
        busy.sort();
        let free_now = n - busy.len();
        let wait = match self.quorum.checked_sub(free_now) {
            Some(k) if k > 0 => busy.get(k - 1).copied().unwrap_or(Duration::ZERO),
            _ => jitter(self.call_timeout.max(Duration::from_millis(5))),
        };
        Ok(Acquired::Busy { wait, split })
    }

    /// One master, with replica confirmation: the script and `WAIT` in one round trip; a grant
    /// fewer replicas confirmed than asked for is undone at once (within one more command
    /// timeout) and reported as [`Error::NotReplicated`].
    fn acquire_replicated(&self, call: &Call, a: &AcquireCall<'_>) -> Result<Acquired> {
        let mut packed = self.pack(call);
        self.push_wait(&mut packed);
        let needed = self.wait.map_or(0, |(n, _)| n);
        let replies = self
            .round(&[0], &packed, 2, call.which, self.call_timeout, a.by, false)
            .pop()
            .map(|(_, r)| r)
            .unwrap_or(Err(Fault::timeout("no reply")));
        let (reply, acked) = match replies {
            Ok(mut values) => {
                let acked = values.pop();
                (one(values.pop()), acked)
            }
            Err(e) => (Err(e), None),
        };
        let reply = reply.and_then(|v| acquire_reply(v, &a.script(false)))?;
        match reply {
            AcquireReply::Held {
                token,
                count,
                acquisition,
                last,
            } => {
                let acked = match acked {
                    Some(Value::Int(k)) => usize::try_from(k).unwrap_or(0),
                    _ => 0,
                };
                if acked >= needed {
                    return Ok(Acquired::Held {
                        token,
                        count,
                        acquisition,
                        last,
                    });
                }
                // The undo gets its own command timeout: the wait may have used up the
                // call's bound, and the grant must not stay behind.
                let undo_by = Deadline::after(self.command_timeout);
                self.undo(
                    a.keys,
                    a.request,
                    &[(0, token, count, acquisition)],
                    &[],
                    undo_by,
                );
                log::debug!(
                    "acquisition of `{}` confirmed by {acked} of {needed} replicas; undone",
                    a.keys.name
                );
                Err(Error::NotReplicated { acked, needed })
            }
            AcquireReply::Busy { ttl } => Ok(Acquired::Busy {
                wait: ttl,
                split: false,
            }),
            AcquireReply::Foreign => Err(Error::ForeignKey {
                key: a.keys.lock.clone(),
            }),
        }
    }

    /// Gives back what an acquire that is not kept granted: on each master of `granted`
    /// (master, token, count, acquisition) its own level (a new acquisition is freed, a
    /// re-entry counted down), and on `unanswered` the new acquisition `request` may have made.
    fn undo(
        &self,
        keys: &LockKeys,
        request: &str,
        granted: &[(usize, u64, u64, String)],
        unanswered: &[usize],
        by: Deadline,
    ) {
        // One round per acquisition and level, to every master concerned at once. The masters
        // that did not answer just failed, and so are marked down: the undo goes to them all
        // the same, on a new connection (`fresh`), since the acquire may have run there and its
        // grant would otherwise stay for a lease. It is bounded by the round the acquire kept
        // back for it.
        let mut jobs: Vec<(Vec<usize>, &str, u64, Level, bool)> = Vec::new();
        for (i, token, _, acquisition) in granted {
            let level = if acquisition == request {
                Level::Outermost
            } else {
                Level::Inner
            };
            match jobs
                .iter_mut()
                .find(|j| j.1 == acquisition.as_str() && j.3 == level)
            {
                Some(job) => {
                    job.0.push(*i);
                    job.2 = job.2.max(*token);
                }
                None => jobs.push((vec![*i], acquisition.as_str(), *token, level, false)),
            }
        }
        if !unanswered.is_empty() {
            let token = granted.iter().map(|h| h.1).max().unwrap_or(0);
            jobs.push((unanswered.to_vec(), request, token, Level::Outermost, true));
        }
        for (targets, acquisition, token, level, fresh) in jobs {
            let request = crate::protocol::grant::request_id();
            let release = mutex::Release {
                acquisition,
                level,
                request: &request,
                publish: Publish::Never,
                fence: self.fence_of(token),
            };
            let _ = self.call_all(&mutex::release(keys, &release, false), &targets, by, fresh);
        }
    }
}
