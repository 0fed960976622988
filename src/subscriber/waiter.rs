//! How a waiter sleeps: a thread's place in a lock's local queue ([`Registration`]), its
//! wait for its turn, for the subscription's confirmation, for a release or a passed lock, the call
//! it leaves for the subscriber thread to fire, and how it leaves the queue (handing over to
//! the next leader).
//!
//! Apart from the subscriber thread's code because it runs on the waiting threads; it reaches
//! the subscriber only to leave a queue (the last waiter unsubscribes). See "How a waiter waits" in the parent module for the protocol.

use std::sync::Arc;
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use super::Subscriber;
use super::queue::{Channel, ChannelState, OnRelease, Passed, Wake};
use crate::transport::conn::Deadline;

/// How long a leader parks at a time while its call is being written (the subscriber thread
/// wakes it when the write is done; this only bounds a lost wakeup).
const FIRING_WAIT: Duration = Duration::from_millis(1);

/// A thread's place in a lock's local queue. Dropping it leaves the queue, handing the turn to
/// the next waiter with "try at once".
#[derive(Debug)]
pub(crate) struct Registration {
    pub(super) sub: Arc<Subscriber>,
    pub(super) channel: Arc<Channel>,
    pub(super) me: Arc<Thread>,
    pub(super) left: bool,
}

/// What a leader does first when its turn begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Try to acquire at once.
    TryNow,
    /// Wait for a release after this epoch first (the previous leader just acquired).
    WaitFrom(u64),
}

/// Parks until unparked or until `until` (no bound: `NONE`). False when it had passed already.
fn park_until(until: Deadline) -> bool {
    match until.left() {
        None => thread::park(),
        Some(left) if left.is_zero() => return false,
        Some(left) => thread::park_timeout(left),
    }
    true
}

impl Registration {
    fn is_leader(&self, st: &ChannelState) -> bool {
        st.queue.front().is_some_and(|w| Arc::ptr_eq(w, &self.me))
    }

    /// Waits until this thread leads the queue. `None` when `deadline` passed first.
    ///
    /// A waiter that becomes the leader after a quiet leave
    /// ([`leave_acquired_quietly`](Self::leave_acquired_quietly)) is not woken for it: it
    /// finds out at the next release or hand-off, which wakes it, or at the latest `recheck`
    /// after it last parked here, when it tries at once (a holder whose lease ran out
    /// publishes nothing).
    pub(crate) fn wait_turn(&self, deadline: Deadline, recheck: Duration) -> Option<Turn> {
        loop {
            // An unpark between a check and the park leaves the token set, so the park
            // returns at once: no lost wakeup. A leader at its recheck tries at once.
            let recheck_at = Deadline::after(recheck);
            let turn = self.wait_for(deadline.min(recheck_at), |st| {
                let due = recheck_at.passed();
                self.is_leader(st).then(|| match st.handoff.take() {
                    Some(e) if !due => Turn::WaitFrom(e),
                    _ => Turn::TryNow,
                })
            });
            if turn.is_some() || deadline.passed() {
                return turn;
            }
        }
    }

    /// Waits (bounded by `until`) until the subscription is confirmed. Returns whether it is.
    /// Returns at once while the connection is down: the caller then re-checks on a short
    /// period instead (a disconnect wakes the leader, so a wait in progress ends too).
    pub(crate) fn wait_confirmed(&self, until: Deadline) -> bool {
        self.wait_for(until, |st| {
            (st.confirmed || st.refused || st.passed.is_some() || st.down).then_some(st.confirmed)
        })
        .unwrap_or(false)
    }

    /// Parks until `done` gives an answer from the channel's state (checked under its lock
    /// at each wake-up), or `until` passes (`None`).
    fn wait_for<T>(
        &self,
        until: Deadline,
        mut done: impl FnMut(&mut ChannelState) -> Option<T>,
    ) -> Option<T> {
        loop {
            if let Some(answer) = done(&mut self.channel.state.lock()) {
                return Some(answer);
            }
            if !park_until(until) {
                return None;
            }
        }
    }

    /// Whether the subscription is confirmed on the current connection.
    pub(crate) fn confirmed(&self) -> bool {
        self.channel.state.lock().confirmed
    }

    /// The current release epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.channel.state.lock().epoch
    }

    /// Takes the payload of the last message, if one arrived since the last take.
    pub(crate) fn take_message(&self) -> Option<Vec<u8>> {
        self.channel.state.lock().message.take()
    }

    /// Takes the passed lock handed to the queue, if this thread leads it.
    pub(crate) fn take_passed(&self) -> Option<Passed> {
        let mut st = self.channel.state.lock();
        let leads = self.is_leader(&st);
        st.passed.take_if(|_| leads)
    }

    /// Leaves `on_release` for the subscriber thread to run the moment a release message after
    /// epoch `seen` arrives, before it wakes this leader. Gives it back when such a message
    /// or a passed lock already came, a release of this client gives way, or this thread does not
    /// lead. The leader takes it back with [`disarm`](Self::disarm) before anything else.
    pub(crate) fn arm(
        &self,
        seen: u64,
        on_release: OnRelease,
    ) -> std::result::Result<(), OnRelease> {
        let mut st = self.channel.state.lock();
        let ready = self.is_leader(&st)
            && st.epoch == seen
            && st.passed.is_none()
            && st.on_release.is_none()
            && st.holding_back(Instant::now()).is_none();
        if !ready {
            return Err(on_release);
        }
        st.on_release = Some(on_release);
        Ok(())
    }

    /// Takes back what [`arm`](Self::arm) left, if it was not fired; waits for a firing in
    /// progress to end (one write) otherwise, and returns `None`.
    pub(crate) fn disarm(&self) -> Option<OnRelease> {
        // The subscriber thread wakes the leader once the write is done.
        loop {
            let until = Deadline::after(FIRING_WAIT);
            if let Some(taken) =
                self.wait_for(until, |st| (!st.firing).then(|| st.on_release.take()))
            {
                return taken;
            }
        }
    }

    /// Sleeps until a release after epoch `seen` arrives, a passed lock is handed to this leader,
    /// or `until` passes.
    pub(crate) fn wait_release(&self, seen: u64, until: Deadline) {
        self.wait_for(until, |st| {
            (st.epoch != seen || st.passed.is_some()).then_some(())
        });
    }

    /// Sleeps while a release of this client gives way to others (see
    /// [`Subscriber::give_way`]), until a passed lock is handed to this leader, or until `until`.
    pub(crate) fn wait_give_way(&self, until: Deadline) {
        loop {
            let back = {
                let st = self.channel.state.lock();
                (st.holding_back(Instant::now())).filter(|_| st.passed.is_none())
            };
            match back {
                Some(back) if !until.passed() => park_until(until.min(Deadline::at(back))),
                _ => return,
            };
        }
    }

    /// Leaves the queue after acquiring: the next leader waits for a release after `seen`.
    /// Returns a passed lock handed to this leader meanwhile, if any: the caller acquired the lock
    /// otherwise, so the passed lock is stale (the lock it passes is not on the server any more)
    /// and must not reach the next leader.
    pub(crate) fn leave_acquired(mut self, seen: u64) -> Option<Passed> {
        self.leave(Some(seen), false)
    }

    /// [`leave_acquired`](Self::leave_acquired), without waking the next leader when it has
    /// nothing to do but wait for a release after `seen` (no release or passed came meanwhile,
    /// and the subscription is confirmed and up): the release or hand-off will wake it (see
    /// [`wait_turn`](Self::wait_turn)). For a lock that one holder at a time can take: a
    /// semaphore's next leader must try at once, as more permits may be free.
    pub(crate) fn leave_acquired_quietly(mut self, seen: u64) -> Option<Passed> {
        self.leave(Some(seen), true)
    }

    /// Leaves the queue without the lock (a deadline or an error). Returns a passed lock that nobody
    /// else can take (this was the last waiter): the caller takes it or drops it.
    pub(crate) fn leave_giving_up(mut self) -> Option<Passed> {
        self.leave(None, false)
    }

    /// Leaves the queue. A passed lock pending for this leader is returned when it acquired
    /// (`handoff` is set) or no waiter is left; otherwise it stays for the next leader. The passed lock is returned, not
    /// dropped here, so that no lock of the subscriber is held while it is dropped.
    /// `quiet`: see [`leave_acquired_quietly`](Self::leave_acquired_quietly).
    fn leave(&mut self, handoff: Option<u64>, quiet: bool) -> Option<Passed> {
        if std::mem::replace(&mut self.left, true) {
            return None;
        }
        let mut table = self.sub.table.lock();
        let mut st = self.channel.state.lock();
        let was_leader = self.is_leader(&st);
        st.queue.retain(|w| !Arc::ptr_eq(w, &self.me));
        if was_leader {
            // What the leader armed is its own: never run for the next one (the lock layer takes
            // it back before leaving; this only guards against a path that did not).
            st.on_release = None;
        }
        let take = (was_leader && handoff.is_some()) || st.queue.is_empty();
        let passed = st.passed.take_if(|_| take);
        if st.queue.is_empty() {
            // Last waiter: unsubscribe, unless the table already holds a newer entry.
            let node = st.node.clone();
            drop(st);
            if table.is_current(&self.channel) {
                table.channels.remove(&self.channel.name);
                if let Some(node) = node {
                    table.unsubscribe(&self.sub.route, &node, &self.channel.name);
                }
            }
            return passed;
        }
        drop(table);
        if was_leader {
            st.handoff = handoff;
            let nothing_to_do = quiet
                && handoff == Some(st.epoch)
                && st.passed.is_none()
                && st.confirmed
                && !st.refused
                && !st.down
                && st.yielding.is_none();
            let wake = if nothing_to_do {
                Wake::Nobody
            } else {
                st.leader_wake()
            };
            drop(st);
            wake.now();
        }
        passed
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A passed lock nobody else can take is dropped, which undoes it (after the locks are
        // released: dropping it may talk to Redis).
        drop(self.leave(None, false));
    }
}
