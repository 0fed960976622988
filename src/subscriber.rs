//! The subscriber thread: one pub/sub connection per client, and the local waiter queues.
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
//! is then delivered. While the connection is down, leaders re-check every
//! [`RECHECK`](crate::locks::wait::RECHECK) instead of sleeping until their TTL bound.
//!
//! # Writes and reads
//!
//! The thread owns the read side of the connection. `SUBSCRIBE` and `UNSUBSCRIBE` are written
//! by the waiter's own thread on a clone of it, under the table lock, so the order of writes
//! matches the order of table changes and a new waiter's subscription goes out at once.
//! Confirmations come back in the order the commands were written; `pending` pairs each one
//! with the entry it was written for.
//!
//! # The transport, and why it is this one
//!
//! One socket (TCP, TLS over TCP, or Unix), written by waiting threads and read by the
//! subscriber thread at the same time:
//!
//! - Plain TCP and Unix: the socket is cloned; the thread blocks in `read` on its clone while
//!   writers write on theirs. Nothing is shared but the kernel's socket.
//! - TLS ([`TlsStream`](crate::transport::tls::TlsStream)): rustls's connection state is
//!   shared under a lock by the reader and the writers, over a cloned `TcpStream`. The
//!   reader blocks on the socket *without* the lock and takes it only to decrypt what
//!   arrived; a writer takes it to encrypt and send. So a `SUBSCRIBE` goes out at once over
//!   TLS too, and plain TCP pays nothing for TLS (not even a lock).
//!
//! The other design, a thread that owns a `redis` connection and is woken through a private
//! control channel, needs a way to wake a thread blocked in a read: a socket timeout (adding
//! up to its length to every new subscription) or a second socket to poll, and the thread
//! would make every waiter's `SUBSCRIBE` a message to it. The shared-state design keeps the
//! write on the waiter's thread, where it is today. A Cluster client (one pub/sub connection
//! per master, one thread) reads the same `Stream`s when a poller (the `polling` crate, which
//! starts no threads) says they are readable, and opens them as non-blocking steps of its
//! poll loop, so that one frozen master holds up no other (see `subscriber/shards.rs`).
//!
//! Replies are parsed with the `redis` crate's [`redis::Parser`], which keeps a partly read
//! reply across a read timeout and resumes it on the next read; so an idle timeout is
//! harmless wherever it falls, and `PING` probes follow the heartbeat alone.
//!
//! # Files
//!
//! This file holds the state the thread and the waiting threads share (the table of channels
//! and the connection's write half) and the waiters' entry points (`join`, `offer`,
//! `give_way`). The rest, each apart for the reason its own docs give:
//!
//! - `queue.rs`: one lock name's local queue: waiters, release epoch, a passed lock, the call to write on release.
//! - `waiter.rs`: how a waiter sleeps: its place in the queue, its waits, how it leaves.
//! - `outage.rs`: the log lines of a connection's outage.
//! - `single.rs`: the thread's loop on one server: read, dispatch, probe, reconnect.
//! - `shards.rs`: the thread's loop on a cluster: one connection per master, polled.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redis::{ConnectionInfo, Value};

use crate::error::Result;
use crate::stats::{self, Counters};
use crate::transport::conn::{Deadline, Resolve, Timeouts, server_name};
use crate::transport::pubsub::{ReadHalf, Stream, encode, open_any};
use crate::transport::tls::Tls;

mod outage;
mod queue;
mod shards;
mod single;
mod waiter;

use outage::Outage;
use queue::{Channel, ChannelState, Waiter, Yielding};
pub(crate) use queue::{OnRelease, Passed};
pub(crate) use waiter::{Registration, Turn};

/// Where a sharded channel lives, as the pub/sub thread of a Redis Cluster client needs to
/// know: the slot map of the cluster topology, seen from this layer (which sits below the
/// topologies, so it names what it needs instead of importing them).
pub(crate) trait ShardMap: Send + Sync + std::fmt::Debug {
    /// A number that changes whenever the map changes.
    fn epoch(&self) -> u64;
    /// Reads the map again (at most once in a short while unless `force`), within `by`.
    fn refresh(&self, by: Deadline, force: bool) -> Result<()>;
    /// The master that owns `channel`'s slot: its `host:port` and how to reach it.
    fn owner_of(&self, channel: &str) -> Option<(String, ConnectionInfo)>;
    /// Learns a slot's new master from the details of a `MOVED` error.
    fn learn_moved(&self, details: Option<&str>);
}

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

/// The subscriber's table of channels, guarded by one lock (taken before any channel's).
#[derive(Debug, Default)]
struct Table {
    channels: HashMap<String, Arc<Channel>>,
    /// `SUBSCRIBE`s written on the current connection whose confirmation is not yet read.
    pending: VecDeque<Arc<Channel>>,
    /// The write half of the current connection; `None` while disconnected.
    writer: Option<Stream>,
    /// A `PING` was sent and nothing has been read since.
    ping_outstanding: bool,
    /// On a cluster: one connection per master that owns a needed channel, the channels
    /// still to subscribe, and the `SUNSUBSCRIBE`s to send (see `subscriber/shards.rs`).
    sharded: bool,
    shards: HashMap<String, shards::ShardConn>,
    unrouted: Vec<Arc<Channel>>,
    unsubs: Vec<(String, String)>,
}

impl Table {
    /// Writes a command on the current connection. On failure the connection is shut down so
    /// that the reader notices at once and reconnects.
    fn write(&mut self, args: &[&[u8]]) -> bool {
        let Some(w) = self.writer.as_mut() else {
            return false;
        };
        match w.write_all(&encode(args)) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("pub/sub write failed: {e}");
                w.shutdown();
                self.writer = None;
                false
            }
        }
    }

    fn subscribe(&mut self, ch: &Arc<Channel>) {
        if self.sharded {
            // The pub/sub thread opens the master's connection if needed, and subscribes.
            self.unrouted.push(Arc::clone(ch));
            return;
        }
        if self.write(&[b"SUBSCRIBE", ch.name.as_bytes()]) {
            self.pending.push_back(Arc::clone(ch));
        }
    }
}

/// State shared by the subscriber thread and the waiting threads.
#[derive(Debug)]
pub(crate) struct Subscriber {
    /// The masters it may listen on; it listens on one at a time.
    infos: Vec<ConnectionInfo>,
    /// Where the master is now, asked afresh on every reconnect (a topology whose master
    /// moves); `infos` is then not used after the first connection.
    resolver: Option<Arc<dyn Resolve>>,
    /// The index of the master listened on (or tried next).
    current: AtomicUsize,
    timeouts: Timeouts,
    /// The TLS set-up of `rediss://` masters.
    tls: Option<Arc<Tls>>,
    table: Mutex<Table>,
    stop: AtomicBool,
    /// Dropped (closed) to interrupt the thread's reconnect backoff.
    stop_tx: Mutex<Option<Sender<()>>>,
    /// On a cluster: the slot map, and the poller the thread waits on.
    sharded: Option<shards::Sharded>,
    /// The server listened on last, for log lines (a cluster's name theirs per node).
    server: Mutex<String>,
    /// The client's counters (reconnects).
    counters: Arc<Counters>,
}

/// The read side handed to the thread.
pub(crate) struct Reader {
    reader: Option<ReadHalf>,
    stop_rx: Receiver<()>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Subscriber {
    /// Connects eagerly (so a bad address fails `build()`), returning the shared state and the
    /// read side for [`Subscriber::run`].
    pub(crate) fn connect(
        infos: Vec<ConnectionInfo>,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
        resolver: Option<Arc<dyn Resolve>>,
        counters: Arc<Counters>,
    ) -> Result<(Arc<Self>, Reader)> {
        let (reader, writer, current) = open_any(&infos, 0, timeouts, tls.as_deref())?;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let server = infos.get(current).map_or_else(String::new, server_name);
        let sub = Arc::new(Subscriber {
            server: Mutex::new(server),
            infos,
            resolver,
            current: AtomicUsize::new(current),
            timeouts,
            tls,
            table: Mutex::new(Table {
                writer: Some(writer),
                ..Table::default()
            }),
            stop: AtomicBool::new(false),
            stop_tx: Mutex::new(Some(stop_tx)),
            sharded: None,
            counters,
        });
        Ok((
            sub,
            Reader {
                reader: Some(reader),
                stop_rx,
            },
        ))
    }

    /// The subscriber of a cluster client: no connection yet; the thread opens one per
    /// master that owns a channel with waiters.
    pub(crate) fn sharded(
        cluster: Arc<dyn ShardMap>,
        timeouts: Timeouts,
        tls: Option<Arc<Tls>>,
        counters: Arc<Counters>,
    ) -> Result<(Arc<Self>, Reader)> {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let sub = Arc::new(Subscriber {
            server: Mutex::new(String::new()),
            infos: Vec::new(),
            resolver: None,
            current: AtomicUsize::new(0),
            timeouts,
            tls,
            table: Mutex::new(Table {
                sharded: true,
                ..Table::default()
            }),
            stop: AtomicBool::new(false),
            stop_tx: Mutex::new(Some(stop_tx)),
            sharded: Some(shards::Sharded::new(cluster)?),
            counters,
        });
        Ok((
            sub,
            Reader {
                reader: None,
                stop_rx,
            },
        ))
    }

    /// Wakes the thread of a cluster client (a channel to subscribe or unsubscribe, a
    /// changed slot map, a shutdown).
    fn wake_thread(&self) {
        if let Some(sh) = &self.sharded {
            sh.notify();
        }
    }

    /// The slot map changed: the thread moves subscriptions whose slot moved.
    pub(crate) fn map_changed(&self) {
        self.wake_thread();
    }

    /// Whether `ch`'s waiters should re-check on a short period instead of waiting for a
    /// confirmation (its connection is down).
    fn is_down(&self, ch: &Channel) -> bool {
        if self.sharded.is_some() {
            return ch.state.lock().down;
        }
        self.table.lock().writer.is_none()
    }

    /// Asks the thread to stop: closes the socket (ending a blocked read) and the stop channel
    /// (ending a backoff sleep).
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stop_tx.lock().take();
        let mut table = self.table.lock();
        if let Some(w) = table.writer.take() {
            w.shutdown();
        }
        for (_, shard) in table.shards.drain() {
            shard.writer.shutdown();
        }
        drop(table);
        self.wake_thread();
    }

    /// Makes the thread reconnect (the master moved): closes the socket, so that its read
    /// ends and the usual reconnect follows (resubscribe, wake every waiter to re-check).
    pub(crate) fn reconnect_now(&self) {
        if let Some(w) = self.table.lock().writer.as_ref() {
            w.shutdown();
        }
    }

    /// Joins the local queue of `channel`, subscribing it if this is its first waiter.
    pub(crate) fn join(self: &Arc<Self>, channel: &str) -> Registration {
        stats::note_wait();
        let me = Arc::new(Waiter {
            thread: thread::current(),
        });
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
                table.subscribe(&ch);
                ch
            }
        };
        ch.state.lock().queue.push_back(Arc::clone(&me));
        drop(table);
        self.wake_thread();
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
        let table = self.table.lock();
        let ch = table.channels.get(channel).cloned()?;
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
        let counted = !st.refused
            && if table.sharded {
                st.shard.is_some() && !st.down
            } else {
                table.writer.is_some()
            };
        drop(st);
        drop(table);
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
