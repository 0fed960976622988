//! [`Election`]: one instance leads, everyone can see which. The leadership is a [`Mutex`] on
//! the election's own keys (`P{T}:elect`), of [`Kind::Election`], taken through the waiting
//! driver as a campaign (see `Acquire` in `mutex/mod.rs`): every candidate of a client waits
//! on the election's channel, and every grant is flagged, so that a resignation publishes there for the observers as for the
//! candidates. What only an election does (announce a leader, proclaim its value, read both)
//! is `scripts/election.lua`.
//!
//! The term is the leadership's fencing token: it rises with every new leadership of the name,
//! across leaders, clients, and an empty restart of Redis, as a `Mutex`'s tokens do.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::Mutex;
use super::guard::MutexGuard;
use crate::driver::detached::Detached;
use crate::driver::time::Budget;
use crate::driver::{self, Watch, timed_forms};
use crate::error::{Error, Result};
use crate::kind::Kind;
use crate::protocol::election::{self, ElectionOp};
use crate::protocol::keys::{self, LockKeys};
use crate::protocol::scripts;
use crate::shared::Core;
use crate::shared::holder::Holder;
use crate::topology::quorum;
use crate::transport::conn::Deadline;

/// The longest value a leader may [`proclaim`](Leadership::proclaim), in bytes.
pub(crate) const MAX_PROCLAIM_LEN: usize = 64 * 1024;

/// A named election among the processes that use the same Redis and key prefix: at most one
/// of them leads at a time, and everyone can see which. Made by
/// [`Client::election`](crate::Client::election); a cheap handle (`Clone + Send + Sync`).
///
/// - [`campaign`](Election::campaign) blocks until the calling process leads, and gives a
///   [`Leadership`]; [`try_campaign`](Election::try_campaign),
///   [`try_campaign_for`](Election::try_campaign_for) and [`try_campaign_until`](Election::try_campaign_until)
///   wait no longer than they say, with the bounds of the [`Mutex`] forms;
/// - [`leader`](Election::leader) says who leads now, with its term and the value it
///   proclaimed;
/// - [`observe`](Election::observe) follows the changes: a new leader, a new value, no leader.
///
/// The leadership is a lease, renewed while the [`Leadership`] lives, as a `Mutex` guard's.
/// A leader that dies is replaced once its lease ends (the candidates wake then); one that
/// resigns, or whose `Leadership` is dropped, at once. Its [`term`](Leadership::term) is a
/// fencing token: pass it to what the leader writes, so that a deposed leader's late writes
/// can be refused.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> locksmith::Result<()> {
/// let client = locksmith::Client::open("redis://127.0.0.1:6379/")?;
/// let election = client.election("scheduler")?;
/// let leadership = election.campaign()?;
/// leadership.proclaim("10.0.0.7:8080")?;
/// while leadership.is_leader() {
///     // ... schedule, stamping writes with leadership.term() ...
/// #   break;
/// }
/// leadership.resign()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    mutex: Mutex,
    /// The key of the leader's value.
    value_key: Arc<str>,
}

/// The leader of an [`Election`], as the server tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leading client's label ([`ClientBuilder::label`](crate::ClientBuilder::label)).
    pub label: String,
    /// The thread that campaigned: its name, or its number within its process.
    pub thread: String,
    /// The leadership's term: its fencing token, which rises with every new leadership.
    pub term: u64,
    /// What the leader [`proclaim`](Leadership::proclaim)ed, if it did.
    pub value: Option<String>,
    /// How long ago it was elected, by the server's clock.
    pub held_for: Duration,
    /// How long its lease has left on the server, unless renewed.
    pub lease_left: Duration,
}

impl Leader {
    /// The leader as a lock's holder (for listings): its term is the fencing token.
    pub(crate) fn into_holder(self) -> Holder {
        Holder {
            label: self.label,
            thread: self.thread,
            hold_count: 1,
            fencing_token: self.term,
            held_for: self.held_for,
            lease_left: self.lease_left,
        }
    }
}

impl Election {
    pub(crate) fn new(client: Core, prefix: &str, name: &str) -> Election {
        let keys = Arc::new(LockKeys::election(prefix, name));
        let value_key = keys::election_value(&keys).into();
        let mut mutex = Mutex::new(client, keys);
        mutex.kind = Kind::Election;
        Election { mutex, value_key }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.mutex.name()
    }

    timed_forms! { guard: Leadership, call: campaign_by, fails: "campaign() ended without the leadership";
        /// Blocks until the calling process leads: its [`Leadership`], renewed while it lives.
        ///
        /// While another candidate leads, this waits, woken when the leadership ends (a
        /// resignation publishes; a dead leader's lease runs out).
        fn campaign, errors {
        /// [`Error::ForeignKey`] when the election's key holds something else;
        /// [`Error::LeaseLost`] when the leadership was lost before it could be announced (the
        /// call then leads nothing).
        }
        /// Makes exactly one attempt. `Ok(None)` when another candidate leads.
        fn try_campaign;
        /// Waits at most `timeout` to lead. `Ok(None)` when another candidate led throughout.
        fn try_campaign_for;
        /// Waits until `deadline` at most to lead. `Ok(None)` when another candidate led
        /// throughout.
        fn try_campaign_until;
    }

    /// A campaign by `deadline`, through the driver; then the announcement that wakes the
    /// observers.
    fn campaign_by(&self, deadline: Deadline) -> Result<Option<Leadership>> {
        let Some(guard) = self.mutex.acquire(deadline)? else {
            return Ok(None);
        };
        let term = guard.fencing_token();
        // A new acquisition holds one level: it always moves.
        let held = guard.detach().map_err(|_| Error::LeaseLost)?;
        let acquisition = held.parts().hold().acquisition.clone();
        if !self.done(ElectionOp::Announce(&acquisition))? {
            // Lost before it could be announced: the leadership is no one's.
            return Err(Error::LeaseLost);
        }
        Ok(Some(Leadership {
            election: self.clone(),
            held,
            term,
        }))
    }

    /// Runs `op` (announce, proclaim) on every master: `true` where a quorum did it, `false`
    /// where a quorum says the acquisition does not lead.
    fn done(&self, op: ElectionOp<'_>) -> Result<bool> {
        let shared = self.mutex.client.shared();
        shared.ensure_open()?;
        let by = Deadline::after(shared.config.one_call());
        let call = election::call(&self.mutex.keys, &self.value_key, op);
        let t = quorum::tally(shared.backend.eval_each(&call, by), |v| {
            match election::parse_done(&v) {
                Some(done) => Ok(done),
                // `-1`: a key locksmith did not write.
                None if scripts::int(&v) == Some(-1) => Err(Error::ForeignKey {
                    key: self.mutex.keys.lock.clone(),
                }),
                None => Err(scripts::unexpected("election", &v)),
            }
        })?;
        let quorum = shared.backend.quorum();
        let yes = t.answers.iter().filter(|&&y| y).count();
        let no = t.answers.len() - yes;
        if yes >= quorum {
            Ok(true)
        } else if no >= quorum || t.answers.is_empty() && t.first_error.is_none() {
            Ok(false)
        } else {
            Err(t.error(yes, quorum))
        }
    }

    /// Who leads now, with the value it proclaimed, as the server tells it (a majority of
    /// masters, on a quorum client). `None` when nobody leads.
    ///
    /// Returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// As [`Mutex::holder`].
    pub fn leader(&self) -> Result<Option<Leader>> {
        self.leader_by(Deadline::after(
            self.mutex.client.shared().config.one_call(),
        ))
    }

    fn leader_by(&self, by: Deadline) -> Result<Option<Leader>> {
        let call = election::call(&self.mutex.keys, &self.value_key, ElectionOp::Leader);
        let read = |v: &Value| {
            let (admin, said) = election::parse_leader(v)
                .ok_or_else(|| scripts::unexpected("election leader", v))?;
            Ok(self
                .mutex
                .admin_holder(admin)?
                .map(|(acquisition, h)| (acquisition, h, said)))
        };
        let Some((acquisition, holder, said)) = self.mutex.agreed_holder(&call, by, read)? else {
            return Ok(None);
        };
        // The value of this leadership only: one left by an earlier leader is not its.
        let value = said.and_then(|s| {
            s.strip_prefix(&format!("{acquisition}|"))
                .map(str::to_owned)
        });
        Ok(Some(Leader {
            label: holder.label,
            thread: holder.thread,
            term: holder.fencing_token,
            value,
            held_for: holder.held_for,
            lease_left: holder.lease_left,
        }))
    }

    /// Follows the election: an iterator of its states, the first one as it is now, then
    /// each change (a new leader, a new value, no leader), woken by the election's messages
    /// like a waiter (see [`Observer`]).
    ///
    /// # Errors
    ///
    /// None today (the subscription is made, and confirmed within the command timeout, by
    /// the client's pub/sub thread); the signature leaves room for one.
    pub fn observe(&self) -> Result<Observer> {
        Ok(Observer {
            election: self.clone(),
            watch: Watch::join(&self.mutex.client, &self.mutex.keys.channel),
            last: None,
            until: Deadline::NONE,
            _thread: PhantomData,
        })
    }

    /// Ends the leadership on the server, whoever holds it, as
    /// [`Mutex::force_unlock`]: the candidates and observers are woken, and the deposed
    /// leader finds out at its next renewal. `true` when someone led.
    ///
    /// # Errors
    ///
    /// As [`Mutex::force_unlock`].
    pub fn force_unlock(&self) -> Result<bool> {
        self.mutex.force_unlock()
    }
}

/// The leadership of an [`Election`]: the calling process leads while it lives. `Send +
/// Sync`: a scheduler's threads may share it, and it may move to the thread that does the
/// leader's work. Dropping it resigns (a failure then logged at `warn`).
///
/// A leadership is a lease, renewed by the client's renewal thread. A leader must stop acting
/// as one no later than [`is_leader`](Leadership::is_leader) turns false: that happens when a
/// renewal finds the leadership gone (taken by force, lost in a failover or an empty
/// restart), and at the latest when the local deadline passes without a successful renewal,
/// which is before the lease can end on the server (the lease minus what the renewals need:
/// `lease - (1 % + 2 ms)` after the last renewal sent; see
/// [`validity`](Leadership::validity)). The client's
/// [`on_lease_lost`](crate::ClientBuilder::on_lease_lost) is called then too, with
/// [`LeaseKind::Leadership`](crate::LeaseKind::Leadership). Check `is_leader()` (or
/// [`check`](Leadership::check)) before each act, and pass [`term`](Leadership::term) to
/// what the leader writes.
#[must_use = "if unused the leadership ends at once"]
pub struct Leadership {
    election: Election,
    held: Detached<MutexGuard>,
    term: u64,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.name())
            .field("term", &self.term)
            .field("is_leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// The term: this leadership's fencing token, above every earlier leadership's.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The election.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// True while the leadership is known valid (no I/O, as
    /// [`MutexGuard::is_held`](crate::MutexGuard::is_held)).
    pub fn is_leader(&self) -> bool {
        self.held.is_held()
    }

    /// `Ok` while the leadership is known valid, for use right before acting as the leader.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when [`is_leader`](Leadership::is_leader) is false.
    pub fn check(&self) -> Result<()> {
        self.held.check()
    }

    /// How much longer the leadership is known valid: the time until the local deadline,
    /// which each successful renewal moves forward (zero once lost).
    pub fn validity(&self) -> Duration {
        self.held.parts().hold().validity()
    }

    /// Sets the value observers see with this leader (an address, a version), and wakes
    /// them. Returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for a value longer than 64 KiB (65536 bytes; nothing is
    /// sent); [`Error::LeaseLost`] when this process no longer leads (nothing is stored);
    /// [`Error::Redis`] when Redis could not be asked.
    pub fn proclaim(&self, value: &str) -> Result<()> {
        if value.len() > MAX_PROCLAIM_LEN {
            return Err(Error::misuse(
                "proclaim: the value must be at most 65536 bytes",
            ));
        }
        self.check()?;
        let acquisition = &self.held.parts().hold().acquisition;
        if self
            .election
            .done(ElectionOp::Proclaim(acquisition, value))?
        {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// Ends the leadership: released on the server, which wakes the candidates and the
    /// observers at once. Honest as [`MutexGuard::unlock`]: never `Ok` when the leadership
    /// was lost already. Returns within the connect timeout plus the command timeout.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the leadership had ended (its lease ran out, it was taken
    /// by force, Redis lost it); [`Error::NotOwner`] when another leader holds it now;
    /// [`Error::Redis`] when Redis could not be asked (the leadership then ends when its lease
    /// runs out, since renewal stopped).
    pub fn resign(self) -> Result<()> {
        self.held.unlock()
    }
}

/// A follower of an [`Election`]'s changes, made by [`Election::observe`]: an iterator whose
/// first item is the leader when it was made, then one item per change (a new leader, a new
/// value, no leader), each the leader then (`None`: nobody leads). An item is an `Err` when
/// the election could not be read (after retrying for the client's retry timeout); the
/// iterator goes on after it.
///
/// It waits as a lock's waiter does, woken through pub/sub by the election's messages: no
/// polling, and no command while nothing happens. A leader that dies publishes nothing: it is
/// seen gone (or replaced) when its lease ends, when the observer reads the election again.
/// So while a leader lives, an observer reads the election once per lease at most, when the
/// lease it last saw would end; with no leader, never until a message comes. While the
/// client's pub/sub connection is down it re-reads every 100 ms.
///
/// An observer belongs to the thread that made it (its wake-ups go to that thread).
#[derive(Debug)]
pub struct Observer {
    election: Election,
    /// Its place among the followers of the election's channel.
    watch: Watch,
    /// The last state yielded: the leader's term and value (`None` inside: no leader);
    /// `None` before the first item.
    last: Option<Option<(u64, Option<String>)>>,
    /// When the leader last read would be gone unless renewed: the next read then.
    until: Deadline,
    _thread: PhantomData<*const ()>,
}

impl Iterator for Observer {
    type Item = Result<Option<Leader>>;

    /// Blocks until the next change (the first item at once).
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_by(Deadline::NONE) {
                Ok(Some(state)) => return Some(Ok(state)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Observer {
    /// The next change within `timeout`: `Some(state)`, or `None` when nothing changed in
    /// that time. Returns within `timeout` plus the time of one read (the connect and the
    /// command timeout, more while Redis cannot be reached: see [`Observer`]).
    ///
    /// # Errors
    ///
    /// As [`Election::leader`].
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Option<Leader>>> {
        self.next_by(Deadline::after(timeout))
    }

    fn next_by(&mut self, deadline: Deadline) -> Result<Option<Option<Leader>>> {
        if self.last.is_none() {
            return self.read(deadline).map(|(state, _)| Some(state));
        }
        loop {
            if !self.watch.wait(deadline.min(self.until)) && !self.until.passed() {
                // The deadline passed with nothing to read.
                return Ok(None);
            }
            let (state, changed) = self.read(deadline)?;
            if changed {
                return Ok(Some(state));
            }
            if deadline.passed() {
                return Ok(None);
            }
        }
    }

    /// Reads the election (retrying while Redis cannot be reached, within the client's retry
    /// timeout), and says whether it changed since the last state yielded.
    fn read(&mut self, deadline: Deadline) -> Result<(Option<Leader>, bool)> {
        self.watch.mark();
        let election = &self.election;
        let core = &election.mutex.client;
        let budget = Budget::new(core.shared(), deadline);
        let leader = driver::within(core, election.name(), &budget, |by| {
            let one = Deadline::after(core.shared().config.one_call());
            election.leader_by(by.min(one))
        })?;
        self.until = leader.as_ref().map_or(Deadline::NONE, |l| {
            Deadline::after(l.lease_left + Duration::from_millis(5))
        });
        let now = leader.as_ref().map(|l| (l.term, l.value.clone()));
        let changed = self.last.as_ref() != Some(&now);
        self.last = Some(now);
        Ok((leader, changed))
    }
}

// A handle and a leadership are shared across threads by design; an observer is not.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Election>();
    assert_send_sync::<Leadership>();
};
