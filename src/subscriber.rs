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
//! A sleeping leader may leave a [`Shot`]: its next acquire, primed on a connection by the
//! lock layer. The release message fires it on this thread, before the leader is woken, so
//! the acquire is on the wire while the leader wakes (the two overlap instead of following
//! each other), and the leader reads the reply. A shot is not fired while a release of this
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

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redis::{ConnectionInfo, ServerErrorKind, Value};

use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, RESOLVE_EVERY, Resolve, Timeouts, server_name};
use crate::transport::pubsub::{ReadHalf, Stream, encode, open_any};
use crate::transport::tls::Tls;

mod shards;

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

/// How long a leader parks at a time while its shot is being fired (the subscriber thread
/// wakes it when the write is done; this only bounds a lost wakeup).
const FIRING_WAIT: Duration = Duration::from_millis(1);

/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How often a pub/sub connection that stays down is reported at `warn` (every try is logged
/// at `debug`).
pub(crate) const DOWN_REPORT_EVERY: Duration = Duration::from_secs(60);

/// The log lines of one connection's outage: one `warn` when it is lost, then at most one
/// every [`DOWN_REPORT_EVERY`] while it stays down (for how long, how many tries, the last
/// error), one `info` when it is back; every try at `debug`. So a client whose Redis is down
/// for an hour logs about 60 lines, not 3600.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// When the connection was lost (`None`: it is up).
    since: Option<Instant>,
    /// Failed tries since.
    tries: u32,
    /// The last `warn` line of this outage.
    reported: Option<Instant>,
}

impl Outage {
    /// The connection to `server` was lost at `now` (or could not be opened, if it was up):
    /// the one `warn` line of the outage.
    pub(crate) fn lost(&mut self, server: &str, e: &dyn std::fmt::Display, now: Instant) {
        if self.since.is_some() {
            return;
        }
        self.since = Some(now);
        self.tries = 0;
        self.reported = Some(now);
        log::warn!("pub/sub connection to {server} lost: {e}; reconnecting");
    }

    /// A try to reconnect to `server` failed at `now`; the next one is in `retry_in` (if
    /// known). True when this wrote a `warn` line (the outage's first, or a reminder after
    /// [`DOWN_REPORT_EVERY`]).
    pub(crate) fn failed(
        &mut self,
        server: &str,
        e: &dyn std::fmt::Display,
        retry_in: Option<Duration>,
        now: Instant,
    ) -> bool {
        let first = self.since.is_none();
        if first {
            self.lost(server, e, now);
        }
        self.tries = self.tries.saturating_add(1);
        match retry_in {
            Some(d) => log::debug!("pub/sub reconnect to {server} failed (retrying in {d:?}): {e}"),
            None => log::debug!("pub/sub reconnect to {server} failed: {e}"),
        }
        let due = self
            .reported
            .is_none_or(|t| now.saturating_duration_since(t) >= DOWN_REPORT_EVERY);
        if !due {
            return first;
        }
        self.reported = Some(now);
        let down = self
            .since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        log::warn!(
            "pub/sub connection to {server} still down after {:?} ({} tries; waiters re-check \
             their locks meanwhile): {e}",
            Duration::from_secs(down.as_secs()),
            self.tries
        );
        true
    }

    /// The connection to `server` is up again at `now` (an `info` line if it had been down).
    pub(crate) fn restored(&mut self, server: &str, now: Instant) {
        if let Some(t) = self.since.take() {
            log::info!(
                "pub/sub connection to {server} restored after {:.1?} ({} failed tries); \
                 waiters re-check their locks",
                now.saturating_duration_since(t),
                self.tries
            );
        }
        self.tries = 0;
        self.reported = None;
    }
}

/// The bytes of a simple or bulk string.
fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Something a thread hands to the leader of a lock's local queue (a held lock, passed on
/// without a round trip). Opaque here: the lock layer gives and takes it. Dropping it must
/// undo it (the lock layer's type releases the lock through Redis when dropped unused).
pub(crate) type Gift = Box<dyn Any + Send>;

/// A write the subscriber thread makes for a leader the moment a release message arrives,
/// before it wakes the leader (see [`Registration::arm`]): the leader's next acquire, so that
/// it does not wait for the thread hop. Opaque here: the lock layer primes it, and reads the
/// reply once woken. It must not block beyond a write on an idle socket.
pub(crate) struct Shot(pub(crate) Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Shot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shot")
    }
}

/// One thread waiting for a lock.
#[derive(Debug)]
struct Waiter {
    thread: Thread,
}

/// The state of one lock name's local waiters.
#[derive(Debug, Default)]
struct ChannelState {
    /// Counts release messages and reconnects.
    epoch: u64,
    /// The `SUBSCRIBE` for this entry was confirmed on the current connection.
    confirmed: bool,
    /// The server refused the `SUBSCRIBE` (an ACL without the permission): leaders re-check
    /// on a short period instead of waiting for a confirmation that will not come.
    refused: bool,
    /// Waiting threads; the front one is the leader.
    queue: VecDeque<Arc<Waiter>>,
    /// What the departed leader left for the next: `Some(epoch)` to wait for a release after
    /// that epoch, `None` to try at once.
    handoff: Option<u64>,
    /// The payload of the last message not yet taken (a grant names its fencing token).
    message: Option<Vec<u8>>,
    /// Every waiter is woken, not only the leader (waiters that can all proceed at once,
    /// such as the readers of a read-write lock).
    broadcast: bool,
    /// What a thread handed to the leader (see [`Subscriber::offer`]): it belongs to
    /// whoever leads the queue, and passes to the next leader when the leader leaves.
    gift: Option<Gift>,
    /// On a cluster: the node (`host:port`) the channel is `SSUBSCRIBE`d on (or being).
    shard: Option<String>,
    /// On a cluster: the connection to the channel's master could not be opened; leaders
    /// re-check on a short period until it is.
    down: bool,
    /// A thread of this client releases (or just released) the lock through Redis and lets
    /// others go first (see [`Subscriber::give_way`]).
    yielding: Option<Yielding>,
    /// The leader's shot, to fire on the next release message (see [`Registration::arm`]).
    shot: Option<Shot>,
    /// The subscriber thread is firing the shot (outside this lock): the leader waits for
    /// it to end before it reads what the shot left.
    firing: bool,
    /// Others than this client heard the last release of this client that could give way
    /// (true on a new entry): the next one holds the leader back from its start, before its
    /// reply tells.
    others_heard: bool,
}

/// A release of this client giving way to others, as the channel keeps it.
#[derive(Debug, Clone, Copy)]
struct Yielding {
    /// The epoch when it began: the release's own message moves the epoch past it once.
    from: u64,
    /// How many later releases (other owners' turns) it waits for.
    releases: u64,
    /// When it ends at the latest.
    until: Instant,
}

impl ChannelState {
    /// Whether the leader holds back now: a release of this client gives way, its bound has
    /// not passed, and fewer releases than it waits for arrived after its own (the epoch
    /// after `from`). `Some(until)` while it does.
    fn holding_back(&self, now: Instant) -> Option<Instant> {
        let y = self.yielding?;
        let end = y.from.saturating_add(1).saturating_add(y.releases);
        (now < y.until && self.epoch < end).then_some(y.until)
    }

    /// Wakes the leader (every waiter of a broadcast channel), under the channel's lock:
    /// for paths that are not hot. See [`leader_wake`](Self::leader_wake).
    fn wake_leader(&self) {
        self.leader_wake().now();
    }

    /// Who [`wake_leader`](Self::wake_leader) would wake, to be woken once the channel's
    /// lock is released: a thread woken under it may run on this core at once, only to block
    /// on that lock and yield back (a hand-off between two threads of one core then costs
    /// several context switches instead of one).
    fn leader_wake(&self) -> Wake {
        if self.broadcast {
            Wake::All(self.queue.iter().map(|w| w.thread.clone()).collect())
        } else {
            match self.queue.front() {
                Some(w) => Wake::One(w.thread.clone()),
                None => Wake::Nobody,
            }
        }
    }
}

/// Threads to unpark, taken under a channel's lock and woken after it is released.
#[must_use]
enum Wake {
    Nobody,
    One(Thread),
    All(Vec<Thread>),
}

impl Wake {
    fn now(self) {
        match self {
            Wake::Nobody => {}
            Wake::One(t) => t.unpark(),
            Wake::All(ts) => ts.iter().for_each(Thread::unpark),
        }
    }
}

/// One subscribed release channel and its waiters.
#[derive(Debug)]
struct Channel {
    name: String,
    state: Mutex<ChannelState>,
}

impl Channel {
    /// A release message arrived (`message` or `smessage`): the epoch moves on and the leader
    /// wakes to try.
    ///
    /// A leader's shot is fired first, then the leader woken: its acquire is on the wire
    /// before the thread hop. Not while a release of this client gives way to others: their
    /// turn comes first.
    fn deliver(&self, payload: Option<Vec<u8>>) {
        let mut st = self.state.lock();
        st.epoch += 1;
        st.message = payload;
        let shot = match st.holding_back(Instant::now()) {
            None => st.shot.take(),
            Some(_) => None,
        };
        if let Some(shot) = shot {
            st.firing = true;
            drop(st);
            (shot.0)();
            st = self.state.lock();
            st.firing = false;
        }
        let wake = st.leader_wake();
        drop(st);
        wake.now();
    }

    /// The confirmation of the oldest subscription written on a connection (`subscribe` or
    /// `ssubscribe`) arrived, naming `channel`.
    fn confirm(&self, channel: &[u8]) {
        if self.name.as_bytes() == channel {
            let mut st = self.state.lock();
            st.confirmed = true;
            st.wake_leader();
        } else {
            log::debug!("pub/sub confirmation out of order");
        }
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

    /// The thread's body: read, dispatch, reconnect, until shut down.
    pub(crate) fn run(&self, reader: Reader) {
        let Reader { reader, stop_rx } = reader;
        if let Some(sh) = &self.sharded {
            self.run_sharded(sh);
            drop(stop_rx);
            return;
        }
        let mut conn = reader;
        let mut backoff = BACKOFF_MIN;
        let mut outage = Outage::default();
        let mut checked = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            if let Some(r) = &self.resolver
                && checked.elapsed() >= RESOLVE_EVERY
            {
                // Where is the master now? A move makes this thread reconnect to it (and the
                // command connections drop their pooled ones). Bounded, so that dispatching
                // releases waits for it at most this long.
                checked = Instant::now();
                r.check(Deadline::after(
                    self.timeouts
                        .connect
                        .min(self.timeouts.command)
                        .min(RESOLVE_EVERY / 4),
                ));
            }
            let Some(r) = conn.as_mut() else {
                match self.reconnect() {
                    Ok(r) => {
                        outage.restored(&self.server(), Instant::now());
                        conn = Some(r);
                        backoff = BACKOFF_MIN;
                    }
                    Err(e) => {
                        outage.failed(&self.server(), &e, Some(backoff), Instant::now());
                        // Sleeps for the backoff, or less when shut down.
                        let _ = stop_rx.recv_timeout(backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                continue;
            };
            if let Err(e) = self.read_one(r) {
                if self.stop.load(Ordering::SeqCst) {
                    break;
                }
                outage.lost(&self.server(), &e, Instant::now());
                conn = None;
                self.disconnected();
            }
        }
        log::debug!("subscriber thread stopped");
    }

    /// Reads and handles one reply, or notices an idle connection. A read timeout, between
    /// replies or inside one (the parser resumes it), means the connection was silent for a
    /// heartbeat.
    fn read_one(&self, r: &mut ReadHalf) -> io::Result<()> {
        match r.next() {
            Ok(value) => {
                self.dispatch(value);
                Ok(())
            }
            Err(e) if e.is_timeout() => self.idle(),
            Err(e) => Err(io::Error::other(e.to_string())),
        }
    }

    /// The connection was silent for a heartbeat: probe it, or give up on it if the previous
    /// probe got no answer.
    fn idle(&self) -> io::Result<()> {
        let mut table = self.table.lock();
        if table.ping_outstanding {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer to PING"));
        }
        if table.channels.is_empty() {
            return Ok(());
        }
        if table.write(&[b"PING"]) {
            table.ping_outstanding = true;
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "PING could not be sent",
            ))
        }
    }

    fn dispatch(&self, value: Value) {
        let mut table = self.table.lock();
        table.ping_outstanding = false;
        let Value::Array(items) = value else {
            // `+PONG` when nothing is subscribed, or an error reply: most likely a refused
            // SUBSCRIBE (an ACL without the permission). Its waiters stay unconfirmed and
            // fall back to bounded re-checks.
            if let Value::ServerError(e) = value {
                // Valkey 8.0.0 answered `UNSUBSCRIBE` on a connection without subscriptions
                // (its only channel's `SUBSCRIBE` was refused) with a `NOSUB` error; Redis and
                // later Valkey releases send the usual `unsubscribe` reply, ignored below.
                // Either way it answers our `UNSUBSCRIBE`, not a `SUBSCRIBE`: the pending
                // ones stay pending.
                if e.kind() == Some(ServerErrorKind::NoSub) {
                    log::debug!("pub/sub: {e}");
                    return;
                }
                let refused = table.pending.pop_front();
                drop(table);
                match refused {
                    Some(ch) => {
                        log::warn!("SUBSCRIBE {} refused: {e}; its waiters re-check", ch.name);
                        let mut st = ch.state.lock();
                        st.refused = true;
                        st.wake_leader();
                    }
                    None => log::warn!("pub/sub error reply: {e}"),
                }
            }
            return;
        };
        let kind = items.first().and_then(bytes).unwrap_or_default();
        let channel = items.get(1).and_then(bytes).unwrap_or_default();
        match kind {
            b"message" => {
                let Some(ch) = std::str::from_utf8(channel)
                    .ok()
                    .and_then(|c| table.channels.get(c))
                    .cloned()
                else {
                    return;
                };
                drop(table);
                ch.deliver(items.get(2).and_then(bytes).map(<[u8]>::to_vec));
            }
            b"subscribe" => {
                let Some(ch) = table.pending.pop_front() else {
                    return;
                };
                drop(table);
                ch.confirm(channel);
            }
            _ => {}
        }
    }

    /// Marks every channel unconfirmed and wakes every leader, so each falls back to bounded
    /// re-checks while the connection is down.
    fn disconnected(&self) {
        let mut table = self.table.lock();
        if let Some(w) = table.writer.take() {
            w.shutdown();
        }
        table.pending.clear();
        table.ping_outstanding = false;
        for ch in table.channels.values() {
            let mut st = ch.state.lock();
            st.confirmed = false;
            st.epoch += 1;
            st.wake_leader();
        }
    }

    /// The server listened on last (`host:port`, never a password).
    fn server(&self) -> String {
        self.server.lock().clone()
    }

    /// Opens a new connection and subscribes every channel that still has waiters. Each leader
    /// is woken once (epoch bump) to re-check, since releases may have been missed meanwhile.
    fn reconnect(&self) -> Result<ReadHalf> {
        let start = self.current.load(Ordering::Relaxed);
        let (reader, writer, server, current) = match &self.resolver {
            Some(r) => {
                let info = r.resolve(Deadline::after(self.timeouts.connect), true)?;
                let (reader, writer, _) = open_any(
                    std::slice::from_ref(&info),
                    0,
                    self.timeouts,
                    self.tls.as_deref(),
                )?;
                (reader, writer, server_name(&info), start)
            }
            None => {
                let (reader, writer, current) =
                    open_any(&self.infos, start, self.timeouts, self.tls.as_deref())?;
                let server = self
                    .infos
                    .get(current)
                    .map_or_else(String::new, server_name);
                (reader, writer, server, current)
            }
        };
        self.current.store(current, Ordering::Relaxed);
        *self.server.lock() = server;
        let mut table = self.table.lock();
        if self.stop.load(Ordering::SeqCst) {
            writer.shutdown();
            return Err(Error::Timeout {
                what: "shutting down",
            });
        }
        table.writer = Some(writer);
        let channels: Vec<_> = table.channels.values().cloned().collect();
        for ch in &channels {
            table.subscribe(ch);
            let mut st = ch.state.lock();
            st.refused = false;
            st.epoch += 1;
            st.wake_leader();
        }
        Ok(reader)
    }

    /// Joins the local queue of `channel`, subscribing it if this is its first waiter.
    pub(crate) fn join(self: &Arc<Self>, channel: &str) -> Registration {
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

    /// Hands `gift` to the leader of `channel`'s local queue and wakes it. Refused (the gift
    /// comes back) when nobody queues, when a gift is pending already, or on a channel whose
    /// waiters all wake at once. The gift is never lost: it stays in the queue until a
    /// leader takes it ([`Registration::take_gift`]), passes from a leader that leaves to
    /// the next, and comes back to the last waiter that leaves (see [`Registration`]).
    pub(crate) fn offer(&self, channel: &str, gift: Gift) -> std::result::Result<(), Gift> {
        let Some(ch) = self.table.lock().channels.get(channel).cloned() else {
            return Err(gift);
        };
        // The queue is checked under the channel's lock, which a leaving waiter takes too:
        // the gift lands in a queue that has a waiter, who takes it or passes it on.
        let mut st = ch.state.lock();
        if st.queue.is_empty() || st.gift.is_some() || st.broadcast {
            return Err(gift);
        }
        st.gift = Some(gift);
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

/// A thread's place in a lock's local queue. Dropping it leaves the queue, handing the turn to
/// the next waiter with "try at once".
#[derive(Debug)]
pub(crate) struct Registration {
    sub: Arc<Subscriber>,
    channel: Arc<Channel>,
    me: Arc<Waiter>,
    left: bool,
}

/// What a leader does first when its turn begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Try to acquire at once.
    TryNow,
    /// Wait for a release after this epoch first (the previous leader just acquired).
    WaitFrom(u64),
}

fn park_until(until: Option<Instant>) -> bool {
    match until {
        None => {
            thread::park();
            true
        }
        Some(t) => {
            let now = Instant::now();
            if now >= t {
                return false;
            }
            thread::park_timeout(t - now);
            true
        }
    }
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
    pub(crate) fn wait_turn(&self, deadline: Option<Instant>, recheck: Duration) -> Option<Turn> {
        let mut recheck_at = Instant::now().checked_add(recheck);
        loop {
            let now = Instant::now();
            let due = recheck_at.is_some_and(|r| now >= r);
            {
                let mut st = self.channel.state.lock();
                if self.is_leader(&st) {
                    return Some(match st.handoff.take() {
                        Some(e) if !due => Turn::WaitFrom(e),
                        _ => Turn::TryNow,
                    });
                }
            }
            if deadline.is_some_and(|d| now >= d) {
                return None;
            }
            if due {
                recheck_at = now.checked_add(recheck);
            }
            // An unpark between the check and the park leaves the token set, so the park
            // returns at once: no lost wakeup. It ends at the earlier of the two (`None`: no
            // bound).
            park_until(deadline.into_iter().chain(recheck_at).min());
        }
    }

    /// Waits (bounded by `until`) until the subscription is confirmed. Returns whether it is.
    /// Returns at once while the connection is down: the caller then re-checks on a short
    /// period instead (a disconnect wakes the leader, so a wait in progress ends too).
    pub(crate) fn wait_confirmed(&self, until: Instant) -> bool {
        loop {
            {
                let st = self.channel.state.lock();
                if st.confirmed || st.refused || st.gift.is_some() {
                    return st.confirmed;
                }
            }
            if self.sub.is_down(&self.channel) || !park_until(Some(until)) {
                return false;
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

    /// Takes the gift handed to the queue, if this thread leads it.
    pub(crate) fn take_gift(&self) -> Option<Gift> {
        let mut st = self.channel.state.lock();
        if self.is_leader(&st) {
            st.gift.take()
        } else {
            None
        }
    }

    /// Leaves `shot` for the subscriber thread to fire the moment a release message after
    /// epoch `seen` arrives, before it wakes this leader. Gives it back when such a message
    /// or a gift already came, a release of this client gives way, or this thread does not
    /// lead. The leader takes it back with [`disarm`](Self::disarm) before anything else.
    pub(crate) fn arm(&self, seen: u64, shot: Shot) -> std::result::Result<(), Shot> {
        let mut st = self.channel.state.lock();
        let ready = self.is_leader(&st)
            && st.epoch == seen
            && st.gift.is_none()
            && st.shot.is_none()
            && st.holding_back(Instant::now()).is_none();
        if !ready {
            return Err(shot);
        }
        st.shot = Some(shot);
        Ok(())
    }

    /// Takes back the shot [`arm`](Self::arm) left, if it was not fired; waits for a firing in
    /// progress to end (one write) otherwise, and returns `None`.
    pub(crate) fn disarm(&self) -> Option<Shot> {
        loop {
            {
                let mut st = self.channel.state.lock();
                if !st.firing {
                    return st.shot.take();
                }
            }
            // The subscriber thread wakes the leader once the write is done.
            park_until(Some(Instant::now() + FIRING_WAIT));
        }
    }

    /// Sleeps until a release after epoch `seen` arrives, a gift is handed to this leader,
    /// or `until` passes.
    pub(crate) fn wait_release(&self, seen: u64, until: Instant) {
        loop {
            {
                let st = self.channel.state.lock();
                if st.epoch != seen || st.gift.is_some() {
                    return;
                }
            }
            if !park_until(Some(until)) {
                return;
            }
        }
    }

    /// Sleeps while a release of this client gives way to others (see
    /// [`Subscriber::give_way`]), until a gift is handed to this leader, or until `until`.
    pub(crate) fn wait_give_way(&self, until: Instant) {
        loop {
            let wake = {
                let st = self.channel.state.lock();
                if st.gift.is_some() {
                    return;
                }
                match st.holding_back(Instant::now()) {
                    Some(back) => back.min(until),
                    None => return,
                }
            };
            if !park_until(Some(wake)) && wake == until {
                return;
            }
        }
    }

    /// Leaves the queue after acquiring: the next leader waits for a release after `seen`.
    /// Returns a gift handed to this leader meanwhile, if any: the caller acquired the lock
    /// otherwise, so the gift is stale (the lock it passes is not on the server any more)
    /// and must not reach the next leader.
    pub(crate) fn leave_acquired(mut self, seen: u64) -> Option<Gift> {
        self.leave(Some(seen), true, false)
    }

    /// [`leave_acquired`](Self::leave_acquired), without waking the next leader when it has
    /// nothing to do but wait for a release after `seen` (no release or gift came meanwhile,
    /// and the subscription is confirmed and up): the release or hand-off will wake it (see
    /// [`wait_turn`](Self::wait_turn)). For a lock that one holder at a time can take: a
    /// semaphore's next leader must try at once, as more permits may be free.
    pub(crate) fn leave_acquired_quietly(mut self, seen: u64) -> Option<Gift> {
        self.leave(Some(seen), true, true)
    }

    /// Leaves the queue without the lock (a deadline or an error). Returns a gift that nobody
    /// else can take (this was the last waiter): the caller takes it or drops it.
    pub(crate) fn leave_giving_up(mut self) -> Option<Gift> {
        self.leave(None, false, false)
    }

    /// Leaves the queue. A gift pending for this leader is returned when `take` is set or
    /// no waiter is left; otherwise it stays for the next leader. The gift is returned, not
    /// dropped here, so that no lock of the subscriber is held while it is dropped.
    /// `quiet`: see [`leave_acquired_quietly`](Self::leave_acquired_quietly).
    fn leave(&mut self, handoff: Option<u64>, take: bool, quiet: bool) -> Option<Gift> {
        if std::mem::replace(&mut self.left, true) {
            return None;
        }
        let mut table = self.sub.table.lock();
        let mut st = self.channel.state.lock();
        let was_leader = self.is_leader(&st);
        st.queue.retain(|w| !Arc::ptr_eq(w, &self.me));
        if was_leader {
            // A shot is the leader's own: never fired for the next one (the lock layer takes
            // it back before leaving; this only guards against a path that did not).
            st.shot = None;
        }
        let gift = if (was_leader && take) || st.queue.is_empty() {
            st.gift.take()
        } else {
            None
        };
        if st.queue.is_empty() {
            // Last waiter: unsubscribe, unless the table already holds a newer entry.
            drop(st);
            let current = table
                .channels
                .get(&self.channel.name)
                .is_some_and(|c| Arc::ptr_eq(c, &self.channel));
            if current {
                table.channels.remove(&self.channel.name);
                if table.sharded {
                    let shard = self.channel.state.lock().shard.clone();
                    if let Some(node) = shard {
                        table.unsubs.push((node, self.channel.name.clone()));
                        drop(table);
                        self.sub.wake_thread();
                    }
                } else {
                    table.write(&[b"UNSUBSCRIBE", self.channel.name.as_bytes()]);
                }
            }
            return gift;
        }
        drop(table);
        if was_leader {
            st.handoff = handoff;
            let nothing_to_do = quiet
                && handoff == Some(st.epoch)
                && st.gift.is_none()
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
        gift
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // A gift nobody else can take is dropped, which undoes it (after the locks are
        // released: dropping it may talk to Redis).
        drop(self.leave(None, false, false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// An outage writes a `warn` line when it starts and then at most one every
    /// `DOWN_REPORT_EVERY`, however often the reconnect fails; it starts afresh once restored.
    #[test]
    fn an_outage_warns_once_then_once_a_period() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut o = Outage::default();
        o.lost("h:1", &"eof", at(0));
        let warned: Vec<u64> = (1..=185)
            .filter(|&s| o.failed("h:1", &"refused", None, at(s)))
            .collect();
        assert_eq!(warned, [60, 120, 180]);
        assert_eq!(o.tries, 185);
        o.restored("h:1", at(186));
        assert!(o.since.is_none());
        // Down again: the first failed try is the outage's first warn line.
        assert!(o.failed("h:1", &"refused", None, at(200)));
        assert!(!o.failed("h:1", &"refused", None, at(201)));
    }

    /// Gives its chunks one per read, with a read timeout between them.
    struct Chunks(VecDeque<Option<&'static [u8]>>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.pop_front() {
                Some(Some(c)) => {
                    buf[..c.len()].copy_from_slice(c);
                    Ok(c.len())
                }
                Some(None) => Err(io::ErrorKind::WouldBlock.into()),
                None => Ok(0),
            }
        }
    }

    /// A subscriber with no connection, for feeding replies to [`Subscriber::dispatch`].
    fn unconnected() -> Subscriber {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            command: Duration::from_secs(1),
        };
        Subscriber {
            infos: Vec::new(),
            resolver: None,
            current: AtomicUsize::new(0),
            timeouts,
            tls: None,
            table: Mutex::new(Table::default()),
            stop: AtomicBool::new(false),
            stop_tx: Mutex::new(None),
            sharded: None,
            server: Mutex::new(String::new()),
        }
    }

    /// The error replies as the server sends them.
    #[allow(clippy::unwrap_used)]
    fn reply(wire: &[u8]) -> Value {
        redis::Parser::new().parse_value(&mut &wire[..]).unwrap()
    }

    /// Valkey 8.0.0's `NOSUB` error, its answer to an `UNSUBSCRIBE` on a connection without
    /// subscriptions, leaves the `SUBSCRIBE` written after it pending; a refusal (`NOPERM`)
    /// still marks the channel refused; Redis's reply to the same `UNSUBSCRIBE` changes nothing.
    #[test]
    fn a_nosub_error_is_not_taken_for_a_refused_subscribe() {
        let sub = unconnected();
        let ch = Arc::new(Channel {
            name: "locksmith:{a}:released".into(),
            state: Mutex::new(ChannelState::default()),
        });
        sub.table.lock().pending.push_back(Arc::clone(&ch));

        sub.dispatch(reply(
            b"-NOSUB 'unsubscribe' command executed not in subscribed mode\r\n",
        ));
        sub.dispatch(reply(
            b"*3\r\n$11\r\nunsubscribe\r\n$17\r\nlocksmith:{b}:rel\r\n:0\r\n",
        ));
        assert!(!ch.state.lock().refused);
        assert_eq!(sub.table.lock().pending.len(), 1);

        sub.dispatch(reply(
            b"-NOPERM this user has no permissions to access one of the channels\r\n",
        ));
        assert!(ch.state.lock().refused);
        assert!(sub.table.lock().pending.is_empty());
    }

    /// A read timeout inside a reply loses nothing: the parser resumes it on the next read,
    /// and the reply after it is read whole.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_reply_split_by_a_read_timeout_is_resumed() {
        let mut r = Chunks(VecDeque::from([
            Some(&b"*3\r\n$7\r\nmessage\r\n$2"[..]),
            None,
            Some(&b"\r\nch\r\n$8\r\nreleased\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nx\r\n:1\r\n"[..]),
        ]));
        let mut p = redis::Parser::new();
        let e = p.parse_value(&mut r).unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        let v = p.parse_value(&mut r).unwrap();
        let Value::Array(items) = v else {
            panic!("{v:?}")
        };
        let words: Vec<_> = items.iter().filter_map(bytes).collect();
        assert_eq!(words, [&b"message"[..], b"ch", b"released"]);
        let Value::Array(items) = p.parse_value(&mut r).unwrap() else {
            panic!()
        };
        assert_eq!(items.first().and_then(bytes), Some(&b"subscribe"[..]));
        assert!(p.parse_value(&mut r).is_err());
    }
}
