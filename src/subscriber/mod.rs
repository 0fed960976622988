//! The subscriber thread: the client's pub/sub connections (one to its one server, or one per
//! Cluster master that waiters need), and the local waiter queues.
//!
//! # How a waiter waits
//!
//! Every lock name that has local waiters has one [`Channel`] entry: the lock's release
//! channel, a FIFO of waiting threads, and an *epoch* that counts release messages (and
//! reconnects). Only the thread at the front of the queue, the *leader*, talks to Redis; the
//! others sleep until they reach the front, so one release never sets off a herd of scripts
//! from one process.
//!
//! The leader takes an epoch snapshot, runs the acquire script, and on failure sleeps until the
//! epoch moves past its snapshot or the TTL that the failed attempt returned runs out (a
//! crashed holder publishes nothing). Because the snapshot is taken *before* the attempt, a
//! release that lands between the attempt and the sleep is never missed.
//!
//! A sleeping leader may leave a [`OnRelease`]: its next acquire, primed on a connection by the
//! lock layer. The release message fires it on this thread, before the leader is woken, so
//! the acquire is on the wire while the leader wakes (the two overlap instead of following
//! each other), and the leader reads the reply. A leader's call is not written while a release of this
//! client gives way to others, and is taken back (or its firing waited for) before the leader
//! does anything else.
//!
//! A leader that leaves hands over: after acquiring, it passes its snapshot, so the next leader
//! waits for a release that happened after that acquire; after giving up (timeout or error),
//! it passes nothing, so the next leader tries at once. Thus no local waiter is left sleeping
//! until its TTL bound when the woken leader loses to another process: the leader itself stays
//! subscribed and is woken by the next release.
//!
//! # Why the subscription is confirmed before an attempt
//!
//! A release published before Redis processed our `SUBSCRIBE` is not delivered. So the leader
//! waits until the subscriber thread has read the confirmation of the channel's `SUBSCRIBE`
//! (bounded by the command timeout) before its first attempt; any release after that attempt
//! is then delivered. While the channel's connection is down (lost, or failing to open: the
//! channel is `down`), leaders re-check every [`RECHECK`](crate::driver::wait::RECHECK)
//! instead of sleeping until their TTL bound.
//!
//! # Writes and reads
//!
//! The thread owns the read side of each connection. `SUBSCRIBE` and `UNSUBSCRIBE` are
//! written by the waiter's own thread on a clone of it, under the table lock, so the order of
//! writes matches the order of table changes and a new waiter's subscription goes out at
//! once when its server's connection is open (else the thread opens one and subscribes it:
//! `Table::unrouted`). Confirmations come back in the order the commands were written; each
//! connection's `pending` pairs each one with the entry it was written for.
//!
//! # One server, or a shard map
//!
//! The thread does not care how many servers it listens on: a [`Route`] names each
//! channel's server (its `node`, `host:port`). On a Cluster, that is the master of the
//! channel's slot ([`ShardMap`]), and the commands are the sharded ones (`SSUBSCRIBE`,
//! `smessage`: releases publish with `SPUBLISH` on that master); on one server (or the
//! master a Sentinel names, or one master of a quorum: every release publishes on every
//! master it reaches), every channel has the same node, and the commands are `SUBSCRIBE` and
//! `message`. The first connection to that one server is opened by `build()`, so that a bad
//! address fails there; a Cluster's open when waiters need them.
//!
//! # The transport, and why it is this one
//!
//! One socket per server (TCP, TLS over TCP, or Unix), written by waiting threads and read
//! by the subscriber thread at the same time:
//!
//! - Plain TCP and Unix: the socket is cloned; the thread reads its clone while writers
//!   write on theirs. Nothing is shared but the kernel's socket.
//! - TLS ([`TlsStream`](crate::transport::tls::TlsStream)): rustls's connection state is
//!   shared under a lock by the reader and the writers, over a cloned `TcpStream`. The
//!   reader waits for the socket *without* the lock and takes it only to decrypt what
//!   arrived; a writer takes it to encrypt and send. So a `SUBSCRIBE` goes out at once over
//!   TLS too, and plain TCP pays nothing for TLS (not even a lock).
//!
//! The thread waits on a [`polling::Poller`] (epoll; it starts no thread) for its sockets
//! to become readable, for `Poller::notify` (a channel to route, a changed slot map, a
//! shutdown) or for its next timer (a heartbeat, a backoff), and opens connections as
//! non-blocking steps of the same loop (`transport/pubsub/opening.rs`), so that one frozen
//! server holds up no other (see `pubsub_thread.rs`).
//!
//! The other design, a thread that owns a `redis` connection and is woken through a private
//! control channel, would make every waiter's `SUBSCRIBE` a message to it. The shared-state
//! design keeps the write on the waiter's thread.
//!
//! Replies are parsed with the `redis` crate's [`redis::Parser`], which keeps a partly read
//! reply and resumes it when more bytes arrive; so a read may end anywhere.
//!
//! # Files
//!
//! This file holds the state the thread and the waiting threads share (the table of channels
//! and the connections' write halves) and the waiters' entry points (`join`, `offer`,
//! `give_way`). The rest, each apart for the reason its own docs give:
//!
//! - `queue.rs`: one lock name's local queue: waiters, release epoch, a passed lock, the call to write on release.
//! - `waiter.rs`: how a waiter sleeps: its place in the queue, its waits, how it leaves.
//! - `outage.rs`: the log lines of a connection's outage.
//! - `route.rs`: where each channel's server is, and the commands that subscribe there.
//! - `replies.rs`: what the thread does with each reply it reads.
//! - `pubsub_thread.rs`: the thread's loop: open, read, dispatch, probe, reconnect, follow the map.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use polling::Poller;
use redis::{ConnectionInfo, Value};

use crate::error::{Error, Result};
use crate::stats::{self, Counters};
use crate::transport::conn::{Resolve, Timeouts, server_name};
use crate::transport::pubsub::{ReadHalf, Stream, encode, open_any};
use crate::transport::tls::Tls;

mod outage;
mod pubsub_thread;
mod queue;
mod replies;
mod route;
mod waiter;

use outage::Outage;
use queue::{Channel, ChannelState, Yielding};
pub(crate) use queue::{OnRelease, Passed};
pub(crate) use route::ShardMap;
use route::{OneServer, Route};
pub(crate) use waiter::{Registration, Turn};

/// The target of the thread's log lines: operators filter on the targets that "Log levels"
/// in the crate docs lists.
const TARGET: &str = "locksmith::subscriber";

/// The target of the log lines that follow a cluster's slots (the crate docs list it).
const SHARDS: &str = "locksmith::subscriber::shards";

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The bytes of a simple or bulk string.
fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The write side and bookkeeping of one server's pub/sub connection.
#[derive(Debug)]
struct Link {
    writer: Stream,
    /// Subscriptions written whose confirmation is not yet read.
    pending: VecDeque<Arc<Channel>>,
    /// The channels of our own unsubscriptions not yet answered (to tell them from one the
    /// server pushes).
    unsubs: Vec<String>,
    ping_outstanding: bool,
    last_read: Instant,
    /// Since when no channel is subscribed here.
    empty_since: Option<Instant>,
    /// A write failed: the socket is shut down, and the thread drops the link.
    broken: bool,
}

impl Link {
    fn new(writer: Stream) -> Link {
        Link {
            writer,
            pending: VecDeque::new(),
            unsubs: Vec::new(),
            ping_outstanding: false,
            last_read: Instant::now(),
            empty_since: None,
            broken: false,
        }
    }

    /// Writes a command. On failure the connection is shut down, so that the reader notices
    /// at once, and the thread drops it.
    fn write(&mut self, args: &[&[u8]]) -> bool {
        if !self.broken
            && let Err(e) = self.writer.write_all(&encode(args))
        {
            log::debug!(target: TARGET, "pub/sub write failed: {e}");
            self.writer.shutdown();
            self.broken = true;
        }
        !self.broken
    }
}

/// The subscriber's table of channels, guarded by one lock (taken before any channel's).
#[derive(Debug, Default)]
struct Table {
    channels: HashMap<String, Arc<Channel>>,
    /// The open connections, by node (`host:port`).
    links: HashMap<String, Link>,
    /// Channels the thread is to subscribe (their server had no open connection).
    unrouted: Vec<Arc<Channel>>,
}

impl Table {
    /// Whether `ch` is the table's entry for its name (not one that left, replaced by a newer).
    fn is_current(&self, ch: &Arc<Channel>) -> bool {
        (self.channels.get(&ch.name)).is_some_and(|c| Arc::ptr_eq(c, ch))
    }

    /// Writes the subscription of `ch` on its server's connection, if that is open. `Err`
    /// with the server where it is not written (no open connection, or the write failed),
    /// `Err(None)` where its server is not known (the slot map has no master for its slot).
    fn subscribe(
        &mut self,
        route: &Route,
        ch: &Arc<Channel>,
    ) -> std::result::Result<(), Option<Box<(String, ConnectionInfo)>>> {
        let (node, info) = route.owner_of(&ch.name).ok_or(None)?;
        let Some(link) = self.links.get_mut(&node) else {
            return Err(Some(Box::new((node, info))));
        };
        if !link.write(&[route.command(false), ch.name.as_bytes()]) {
            return Err(Some(Box::new((node, info))));
        }
        link.pending.push_back(Arc::clone(ch));
        let mut st = ch.state.lock();
        st.node = Some(node);
        st.refused = false;
        // Back after an outage: releases may have been missed, so the leader re-checks.
        if std::mem::take(&mut st.down) {
            st.epoch += 1;
            st.wake_leader();
        }
        Ok(())
    }

    /// Writes the unsubscription of channel `name` on `node`'s connection.
    fn unsubscribe(&mut self, route: &Route, node: &str, name: &str) {
        if let Some(link) = self.links.get_mut(node)
            && link.write(&[route.command(true), name.as_bytes()])
        {
            link.unsubs.push(name.to_owned());
        }
    }
}

/// State shared by the subscriber thread and the waiting threads.
#[derive(Debug)]
pub(crate) struct Subscriber {
    /// Where each channel's server is.
    route: Route,
    timeouts: Timeouts,
    /// The TLS set-up of `rediss://` servers.
    tls: Option<Arc<Tls>>,
    table: Mutex<Table>,
    stop: AtomicBool,
    /// What the thread waits on: its sockets, and `notify` (a channel to subscribe, a changed
    /// slot map, a shutdown).
    poller: Poller,
    /// Where the servers are should be asked again (a connection failed or was lost, a
    /// redirection, a pushed unsubscription).
    refresh: AtomicBool,
    /// Each connection's outage, for its log lines (by node on a cluster; one for the one
    /// server, wherever it moves).
    outages: Mutex<HashMap<String, Outage>>,
    /// The client's counters (reconnects).
    counters: Arc<Counters>,
}

/// What the thread starts with: the first connection, opened by `build()` (one server).
pub(crate) type Reader = Option<(String, ReadHalf)>;

impl Subscriber {
    fn new(
        route: Route,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
        counters: Arc<Counters>,
    ) -> Result<Self> {
        Ok(Subscriber {
            route,
            timeouts,
            tls,
            table: Mutex::new(Table::default()),
            stop: AtomicBool::new(false),
            poller: Poller::new().map_err(Error::io)?,
            refresh: AtomicBool::new(false),
            outages: Mutex::new(HashMap::new()),
            counters,
        })
    }

    /// The subscriber of one server (of the first of `infos` that answers, where the
    /// resolver, if any, finds the master later): connects eagerly (so a bad address fails
    /// `build()`), returning the shared state and the first connection for
    /// [`Subscriber::run`].
    pub(crate) fn connect(
        infos: Vec<ConnectionInfo>,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
        resolver: Option<Arc<dyn Resolve>>,
        counters: Arc<Counters>,
    ) -> Result<(Arc<Self>, Reader)> {
        let (reader, writer, current) = open_any(&infos, 0, timeouts, tls.as_deref())?;
        let info = infos
            .get(current)
            .cloned()
            .ok_or(Error::config("masters", "must name at least one Redis URL"))?;
        let node = server_name(&info);
        let one = OneServer {
            current: Mutex::new((current, node.clone(), info)),
            infos,
            resolver,
        };
        let sub = Subscriber::new(Route::One(Box::new(one)), timeouts, tls, counters)?;
        let link = Link::new(writer);
        sub.table.lock().links.insert(node.clone(), link);
        Ok((Arc::new(sub), Some((node, reader))))
    }

    /// The subscriber of a cluster client: no connection yet; the thread opens one per
    /// master that owns a channel with waiters.
    pub(crate) fn sharded(
        cluster: Arc<dyn ShardMap>,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
        counters: Arc<Counters>,
    ) -> Result<(Arc<Self>, Reader)> {
        let sub = Subscriber::new(Route::Slots(cluster), timeouts, tls, counters)?;
        Ok((Arc::new(sub), None))
    }

    /// The slot map changed: wakes the thread, which moves subscriptions whose slot moved.
    pub(crate) fn map_changed(&self) {
        let _ = self.poller.notify();
    }

    /// The outage of `node`'s connection, for its log lines.
    fn outage<T>(&self, node: &str, f: impl FnOnce(&mut Outage) -> T) -> T {
        let key = if self.route.sharded() { node } else { "" };
        f(self.outages.lock().entry(key.to_owned()).or_default())
    }

    /// Asks the thread to stop: closes the sockets and wakes it.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.reconnect_now();
        let _ = self.poller.notify();
        // No message will be read any more: waiters stop sleeping on one and re-check (a
        // client shut down then ends their calls).
        for ch in self.table.lock().channels.values() {
            let mut st = ch.state.lock();
            st.down = true;
            st.unsubscribed();
        }
    }

    /// Makes the thread reconnect (the master moved): closes the sockets, so that their
    /// reads end and the usual reconnect follows (ask where the master is, resubscribe,
    /// wake every waiter to re-check).
    pub(crate) fn reconnect_now(&self) {
        for link in self.table.lock().links.values() {
            link.writer.shutdown();
        }
    }

    /// Joins the local queue of `channel`, subscribing it if this is its first waiter.
    pub(crate) fn join(self: &Arc<Self>, channel: &str) -> Registration {
        stats::note_wait();
        let me = Arc::new(thread::current());
        let mut table = self.table.lock();
        let ch = match table.channels.get(channel) {
            Some(ch) => Arc::clone(ch),
            None => {
                let ch = Arc::new(Channel {
                    name: channel.to_owned(),
                    state: Mutex::new(ChannelState {
                        others_heard: true,
                        ..ChannelState::default()
                    }),
                });
                table.channels.insert(channel.to_owned(), Arc::clone(&ch));
                if table.subscribe(&self.route, &ch).is_err() {
                    // The thread opens the server's connection, and subscribes.
                    table.unrouted.push(Arc::clone(&ch));
                    let _ = self.poller.notify();
                }
                ch
            }
        };
        ch.state.lock().queue.push_back(Arc::clone(&me));
        drop(table);
        Registration {
            sub: Arc::clone(self),
            channel: ch,
            me,
            left: false,
        }
    }

    /// Joins `channel` as one of waiters that all wake on each message (no turn to wait
    /// for: every such waiter may ask Redis). The channel must be used this way only.
    pub(crate) fn join_all(self: &Arc<Self>, channel: &str) -> Registration {
        let reg = self.join(channel);
        reg.channel.state.lock().broadcast = true;
        reg
    }

    /// Hands `passed` to the leader of `channel`'s local queue and wakes it. Refused (the passed lock
    /// comes back) when nobody queues, when a passed lock is pending already, or on a channel whose
    /// waiters all wake at once. The passed lock is never lost: it stays in the queue until a
    /// leader takes it ([`Registration::take_passed`]), passes from a leader that leaves to
    /// the next, and comes back to the last waiter that leaves (see [`Registration`]).
    pub(crate) fn offer(&self, channel: &str, passed: Passed) -> std::result::Result<(), Passed> {
        let Some(ch) = self.table.lock().channels.get(channel).cloned() else {
            return Err(passed);
        };
        // The queue is checked under the channel's lock, which a leaving waiter takes too:
        // the passed lock lands in a queue that has a waiter, who takes it or passes it on.
        let mut st = ch.state.lock();
        if st.queue.is_empty() || st.passed.is_some() || st.broadcast {
            return Err(passed);
        }
        st.passed = Some(passed);
        let wake = st.leader_wake();
        drop(st);
        wake.now();
        Ok(())
    }

    /// Marks a release through Redis of the lock of `channel`, about to be sent by a thread
    /// of this client, as giving way: the leader of the channel's queue does not ask Redis
    /// (see [`Registration::wait_give_way`]) until a later release than that one arrives
    /// (someone else took the lock and freed it; [`GiveWay::hold`] may ask for more) or
    /// `until` passes. `None` when no thread of this client queues for the lock.
    pub(crate) fn give_way(&self, channel: &str, until: Instant) -> Option<GiveWay> {
        let ch = self.table.lock().channels.get(channel).cloned()?;
        let mut st = ch.state.lock();
        let from = st.epoch;
        // Held back from now on only if others heard the last one: a client alone on the
        // lock does not wait for the reply of each release to learn it.
        if st.others_heard {
            st.yielding = Some(Yielding {
                from,
                releases: 1,
                until,
            });
        }
        // Its SUBSCRIBE was sent on the current connection (every channel of the table is,
        // when it has one) and not refused: the release's message will count this client.
        let counted = !st.refused && st.node.is_some() && !st.down;
        drop(st);
        Some(GiveWay {
            channel: ch,
            from,
            counted,
        })
    }

    /// Whether threads of this client queue for the lock released on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.table.lock().channels.contains_key(channel)
    }

    /// How many channels are subscribed (for tests and `Debug`).
    pub(crate) fn channel_count(&self) -> usize {
        self.table.lock().channels.len()
    }
}

/// A release of this client giving way on one channel (see [`Subscriber::give_way`]).
/// Dropped, it ends at once, and the leader competes.
#[derive(Debug)]
pub(crate) struct GiveWay {
    channel: Arc<Channel>,
    /// The epoch when it began: its own release's message moves the epoch past it once.
    from: u64,
    /// This client's subscription was confirmed, or sent, when it began: the release's
    /// message counts it among its receivers.
    counted: bool,
}

impl GiveWay {
    /// Whether this client's own subscription is among the receivers of the release's
    /// message (its subscription was confirmed, or sent, before the release was sent).
    /// A subscription sent on the pub/sub connection just before the release went out on
    /// another may still reach Redis after it: the count is then one short, and the leader
    /// competes at once, as without giving way.
    pub(crate) fn counted(&self) -> bool {
        self.counted
    }

    /// Others heard the release: keeps giving way until `until` (from now), unless
    /// `releases` later releases end it first.
    pub(crate) fn hold(mut self, releases: u64, until: Instant) {
        let mut st = self.channel.state.lock();
        st.others_heard = true;
        // A later release of this client, begun meanwhile, has the say.
        if st.yielding.is_none_or(|y| y.from == self.from) {
            st.yielding = Some(Yielding {
                from: self.from,
                releases,
                until,
            });
            // Fewer releases than before may end it now.
            st.wake_leader();
        }
        drop(st);
        // Nothing left to end on drop (no epoch reaches u64::MAX).
        self.from = u64::MAX;
    }

    /// Nobody but this client heard the release: the leader competes now, and the next
    /// release does not hold it back before its reply.
    pub(crate) fn alone(self) {
        self.channel.state.lock().others_heard = false;
    }
}

impl Drop for GiveWay {
    fn drop(&mut self) {
        let mut st = self.channel.state.lock();
        if st.yielding.is_some_and(|y| y.from == self.from) {
            st.yielding = None;
            st.wake_leader();
        }
    }
}
