//! One lock name's local queue ([`Channel`]): its waiting threads (the front one leads), its
//! release epoch, whether its subscription is confirmed, and what waits for the leader (a
//! a passed lock, a call to write on release, a release of this client giving way).
//!
//! Apart because both sides of the subscriber use it: the waiting threads (`waiter.rs`) sleep
//! on it, and the thread's loop (`pubsub_thread.rs`) delivers release messages and confirmations
//! to it. It knows nothing of connections.
//!
//! Its log lines keep the parent's target, `locksmith::subscriber`: operators filter on
//! the targets that "Log levels" in the crate docs lists.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::Thread;
use std::time::Instant;

use parking_lot::Mutex;

/// Something a thread hands to the leader of a lock's local queue (a held lock, passed on
/// without a round trip). Opaque here: the lock layer gives and takes it. Dropping it must
/// undo it (the lock layer's type releases the lock through Redis when dropped unused).
pub(crate) type Passed = Box<dyn Any + Send>;

/// A write the subscriber thread makes for a leader the moment a release message arrives,
/// before it wakes the leader (see [`Registration::arm`]): the leader's next acquire, so that
/// it does not wait for the thread hop. Opaque here: the lock layer primes it, and reads the
/// reply once woken. It must not block beyond a write on an idle socket.
///
/// [`Registration::arm`]: super::Registration::arm
pub(crate) struct OnRelease(pub(crate) Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for OnRelease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnRelease")
    }
}

/// The state of one lock name's local waiters.
#[derive(Debug, Default)]
pub(super) struct ChannelState {
    /// Counts release messages and reconnects.
    pub(super) epoch: u64,
    /// The subscription of this entry was confirmed on its current connection.
    pub(super) confirmed: bool,
    /// The server refused the `SUBSCRIBE` (an ACL without the permission): leaders re-check
    /// on a short period instead of waiting for a confirmation that will not come.
    pub(super) refused: bool,
    /// Waiting threads, one `Arc` per registration (told apart by address); the front one is
    /// the leader.
    pub(super) queue: VecDeque<Arc<Thread>>,
    /// What the departed leader left for the next: `Some(epoch)` to wait for a release after
    /// that epoch, `None` to try at once.
    pub(super) handoff: Option<u64>,
    /// The payload of the last message not yet taken (a grant names its fencing token).
    pub(super) message: Option<Vec<u8>>,
    /// Every waiter is woken, not only the leader (waiters that can all proceed at once,
    /// such as the readers of a read-write lock).
    pub(super) broadcast: bool,
    /// What a thread handed to the leader (see [`Subscriber::offer`]): it belongs to
    /// whoever leads the queue, and passes to the next leader when the leader leaves.
    ///
    /// [`Subscriber::offer`]: super::Subscriber::offer
    pub(super) passed: Option<Passed>,
    /// The node (`host:port`) the channel's subscription is written on.
    pub(super) node: Option<String>,
    /// The connection to the channel's server is down (lost, or could not be opened);
    /// leaders re-check on a short period until its subscription is written again.
    pub(super) down: bool,
    /// A thread of this client releases (or just released) the lock through Redis and lets
    /// others go first (see [`Subscriber::give_way`]).
    ///
    /// [`Subscriber::give_way`]: super::Subscriber::give_way
    pub(super) yielding: Option<Yielding>,
    /// The leader's call, to write on the next release message (see [`Registration::arm`]).
    ///
    /// [`Registration::arm`]: super::Registration::arm
    pub(super) on_release: Option<OnRelease>,
    /// The subscriber thread is writing the leader's call (outside this lock): the leader
    /// waits for it to end before it reads what the write left.
    pub(super) firing: bool,
    /// Others than this client heard the last release of this client that could give way
    /// (true on a new entry): the next one holds the leader back from its start, before its
    /// reply tells.
    pub(super) others_heard: bool,
}

/// A release of this client giving way to others, as the channel keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Yielding {
    /// The epoch when it began: the release's own message moves the epoch past it once.
    pub(super) from: u64,
    /// How many later releases (other owners' turns) it waits for.
    pub(super) releases: u64,
    /// When it ends at the latest.
    pub(super) until: Instant,
}

impl ChannelState {
    /// Whether the leader holds back now: a release of this client gives way, its bound has
    /// not passed, and fewer releases than it waits for arrived after its own (the epoch
    /// after `from`). `Some(until)` while it does.
    pub(super) fn holding_back(&self, now: Instant) -> Option<Instant> {
        let y = self.yielding?;
        let end = y.from.saturating_add(1).saturating_add(y.releases);
        (now < y.until && self.epoch < end).then_some(y.until)
    }

    /// The channel's subscription is gone (its connection lost, or its slot moved): it is
    /// to be subscribed again, and its leader re-checks (a release may have been missed).
    /// The node it was subscribed on, if any.
    pub(super) fn unsubscribed(&mut self) -> Option<String> {
        self.confirmed = false;
        self.epoch += 1;
        self.wake_leader();
        self.node.take()
    }

    /// Wakes the leader (every waiter of a broadcast channel), under the channel's lock:
    /// for paths that are not hot. See [`leader_wake`](Self::leader_wake).
    pub(super) fn wake_leader(&self) {
        self.leader_wake().now();
    }

    /// Who [`wake_leader`](Self::wake_leader) would wake, to be woken once the channel's
    /// lock is released: a thread woken under it may run on this core at once, only to block
    /// on that lock and yield back (a hand-off between two threads of one core then costs
    /// several context switches instead of one).
    pub(super) fn leader_wake(&self) -> Wake {
        if self.broadcast {
            Wake::All(self.queue.iter().map(|w| Thread::clone(w)).collect())
        } else {
            match self.queue.front() {
                Some(w) => Wake::One(Thread::clone(w)),
                None => Wake::Nobody,
            }
        }
    }
}

/// Threads to unpark, taken under a channel's lock and woken after it is released.
#[must_use]
pub(super) enum Wake {
    Nobody,
    One(Thread),
    All(Vec<Thread>),
}

impl Wake {
    pub(super) fn now(self) {
        match self {
            Wake::Nobody => {}
            Wake::One(t) => t.unpark(),
            Wake::All(ts) => ts.iter().for_each(Thread::unpark),
        }
    }
}

/// One subscribed release channel and its waiters.
#[derive(Debug)]
pub(super) struct Channel {
    pub(super) name: String,
    pub(super) state: Mutex<ChannelState>,
}

impl Channel {
    /// A release message arrived (`message` or `smessage`): the epoch moves on and the leader
    /// wakes to try.
    ///
    /// A leader's call is written first, then the leader woken: its acquire is on the wire
    /// before the thread hop. Not while a release of this client gives way to others: their
    /// turn comes first.
    pub(super) fn deliver(&self, payload: Option<Vec<u8>>) {
        let mut st = self.state.lock();
        st.epoch += 1;
        st.message = payload;
        if st.holding_back(Instant::now()).is_none()
            && let Some(on_release) = st.on_release.take()
        {
            st.firing = true;
            drop(st);
            (on_release.0)();
            st = self.state.lock();
            st.firing = false;
        }
        let wake = st.leader_wake();
        drop(st);
        wake.now();
    }

    /// The confirmation of the oldest subscription written on a connection (`subscribe` or
    /// `ssubscribe`) arrived, naming `channel`.
    pub(super) fn confirm(&self, channel: &[u8]) {
        if self.name.as_bytes() == channel {
            let mut st = self.state.lock();
            st.confirmed = true;
            st.wake_leader();
        } else {
            log::debug!(target: "locksmith::subscriber", "pub/sub confirmation out of order");
        }
    }
}
