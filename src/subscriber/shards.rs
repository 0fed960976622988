//! Sharded pub/sub for a Cluster client: one connection per master that owns a channel with
//! local waiters, all read by the one pub/sub thread.
//!
//! - **Subscribing.** A new channel is queued (`Table::unrouted`) and the thread woken; it
//!   finds the master of the channel's slot in the slot map and writes `SSUBSCRIBE` on its
//!   connection. Releases publish with `SPUBLISH` on the same master (the scripts' sharded
//!   variants), so a waiter hears its lock's release from the one shard that owns it.
//! - **Opening, without blocking.** A master without a connection gets one opened as steps
//!   of the poll loop (`transport/pubsub/opening.rs`: a non-blocking connect, TLS
//!   handshake and `AUTH` / `CLIENT SETNAME`, each advanced when the poller says the socket
//!   is ready), within the connect timeout of its own; its channels wait for it, and nothing
//!   else does. A master whose connection failed is tried again after a backoff of its own
//!   (20 ms doubling to 1 s), its channels' leaders re-checking every
//!   [`RECHECK`](super::RECHECK) meanwhile. So a frozen master (accepting connections,
//!   never answering) delays no subscription, release or heartbeat on another master. The
//!   thread's other blocking steps against one node are bounded and small: a read of a
//!   socket the poller reported readable, a write of a few bytes (`SSUBSCRIBE`, `PING`) to
//!   the kernel's buffer, and the map read below (a quarter second at most, and one
//!   per-node bound for a node that does not answer, which is then asked last).
//! - **Reading.** Once open, the sockets are blocking again (waiting threads share the write
//!   side); a [`polling::Poller`] (epoll; it starts no thread) says which are readable, and
//!   each readable socket is read once, then its buffered replies parsed until the parser
//!   needs more bytes. `Poller::notify` wakes the thread for new channels, map changes and
//!   shutdown.
//! - **Following the slots.** A channel is moved (unsubscribed where it was, subscribed on the
//!   new master, its leader woken to re-check) when the server pushes `sunsubscribe` (its
//!   slot left that master: a migration or a failover), when an `SSUBSCRIBE` is answered with
//!   `MOVED`, when its connection is lost, and when the slot map changes: the map is read
//!   again after each of these and every [`RESOLVE_EVERY`] while channels are subscribed.
//!   A release missed during a move is covered by the wake-up: the leader re-checks the lock.
//! - **Liveness.** A connection silent for [`HEARTBEAT`] gets a `PING`; one still silent a
//!   heartbeat later is dropped and its channels moved as above. Leaders of channels whose
//!   master cannot be reached re-check every [`RECHECK`](super::RECHECK).
//! - A connection without channels is closed after [`IDLE_CLOSE`].

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use polling::{Event, Poller};
use redis::{ServerErrorKind, Value};

use super::{BACKOFF_MAX, BACKOFF_MIN, Channel, ReadHalf, Stream, Subscriber, bytes, encode};
use super::{Outage, ShardMap};
use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, RESOLVE_EVERY};
use crate::transport::pubsub::HEARTBEAT;
use crate::transport::pubsub::opening::{Opening, Step};
use crate::transport::tls::Want;

/// How long a shard connection without channels stays open (a waiter may come back soon).
const IDLE_CLOSE: Duration = Duration::from_secs(20);

/// The cluster side of a subscriber.
#[derive(Debug)]
pub(super) struct Sharded {
    pub(super) cluster: Arc<dyn ShardMap>,
    poller: Poller,
    /// The slot map should be read again (a redirection or a pushed `sunsubscribe`).
    refresh: AtomicBool,
    /// Each master's pub/sub outage, for its log lines.
    outages: parking_lot::Mutex<HashMap<String, Outage>>,
}

impl Sharded {
    pub(super) fn new(cluster: Arc<dyn ShardMap>) -> Result<Self> {
        Ok(Sharded {
            cluster,
            poller: Poller::new().map_err(Error::io)?,
            refresh: AtomicBool::new(false),
            outages: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// The outage of `node`'s pub/sub connection, for its log lines.
    fn outage<T>(&self, node: &str, f: impl FnOnce(&mut Outage) -> T) -> T {
        let mut outages = self.outages.lock();
        f(outages.entry(node.to_owned()).or_default())
    }

    pub(super) fn notify(&self) {
        let _ = self.poller.notify();
    }
}

/// The write side and bookkeeping of one master's pub/sub connection.
#[derive(Debug)]
pub(super) struct ShardConn {
    pub(super) writer: Stream,
    /// `SSUBSCRIBE`s written whose confirmation is not yet read.
    pending: VecDeque<Arc<Channel>>,
    /// Our own `SUNSUBSCRIBE`s not yet answered, per channel (to tell them from a pushed one).
    unsubs: HashMap<String, usize>,
    ping_outstanding: bool,
    last_read: Instant,
    /// Since when no channel is subscribed here.
    empty_since: Option<Instant>,
    key: usize,
    fd: RawFd,
}

impl ShardConn {
    fn write(&mut self, args: &[&[u8]]) -> bool {
        match self.writer.write_all(&encode(args)) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("pub/sub write failed: {e}");
                self.writer.shutdown();
                false
            }
        }
    }
}

/// Reads a socket once (it was reported readable), then says "would block", so that the
/// parser takes what was read and the thread goes back to waiting. A read that filled the
/// whole buffer may have left more: one more read is allowed then.
struct OneRead<'a> {
    stream: &'a mut Stream,
    reads: usize,
    full: bool,
}

impl Read for OneRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.reads > 0 && !self.full {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.reads += 1;
        let n = self.stream.read(buf)?;
        self.full = n == buf.len() && n > 0;
        Ok(n)
    }
}

fn fd_of(s: &Stream) -> RawFd {
    match s {
        Stream::Tcp(t) => t.as_raw_fd(),
        Stream::Tls(t) => t.tcp().as_raw_fd(),
        Stream::Unix(u) => u.as_raw_fd(),
    }
}

/// A connection being opened (see `transport/pubsub/opening.rs`), and the channels that
/// wait for it.
struct Pending {
    node: String,
    op: Opening,
    /// The descriptor registered with the poller.
    fd: RawFd,
    channels: Vec<Arc<Channel>>,
}

/// The thread's own view of its connections.
#[derive(Default)]
struct Conns {
    /// Open connections' read halves, by poller key.
    readers: HashMap<usize, (String, ReadHalf)>,
    /// Connections being opened, by poller key.
    openings: HashMap<usize, Pending>,
    /// Nodes whose connection failed: when to try again, and the backoff that led there.
    retry: HashMap<String, (Instant, Duration)>,
    next_key: usize,
}

impl Subscriber {
    /// The body of a cluster client's pub/sub thread.
    pub(super) fn run_sharded(&self, sh: &Sharded) {
        let mut conns = Conns::default();
        let mut seen = sh.cluster.epoch();
        let mut refreshed = Instant::now();
        let mut backoff = BACKOFF_MIN;
        let mut events = Vec::new();
        let short = self
            .timeouts
            .connect
            .min(self.timeouts.command)
            .min(RESOLVE_EVERY / 4);
        while !self.stop.load(Ordering::SeqCst) {
            let busy = !self.table.lock().channels.is_empty();
            if sh.refresh.swap(false, Ordering::SeqCst)
                || (busy && refreshed.elapsed() >= RESOLVE_EVERY)
            {
                refreshed = Instant::now();
                if let Err(e) = sh.cluster.refresh(Deadline::after(short), false) {
                    log::debug!("slot map not read: {e}");
                }
            }
            let epoch = sh.cluster.epoch();
            if epoch != seen {
                seen = epoch;
                self.reroute(sh);
            }
            let stuck = self.flush(sh, &mut conns);
            let mut wait = if stuck {
                let b = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                b
            } else {
                backoff = BACKOFF_MIN;
                HEARTBEAT.min(RESOLVE_EVERY)
            };
            // A connection being opened gives up at its deadline.
            if let Some(d) = conns.openings.values().map(|p| p.op.deadline()).min() {
                wait = wait.min(d.saturating_duration_since(Instant::now()));
            }
            events.clear();
            if let Err(e) = sh.poller.wait(&mut events, Some(wait)) {
                log::debug!("pub/sub poll failed: {e}");
            }
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            for ev in &events {
                if conns.openings.contains_key(&ev.key) {
                    self.advance_opening(sh, &mut conns, ev.key);
                    continue;
                }
                let Some((node, r)) = conns.readers.get_mut(&ev.key) else {
                    continue;
                };
                let node = node.clone();
                if self.drain(sh, &node, r).is_ok() {
                    let _ = sh.poller.modify(fd_of(&r.stream), Event::readable(ev.key));
                    continue;
                }
                if let Some((_, r)) = conns.readers.remove(&ev.key) {
                    let _ = sh.poller.delete(fd_of(&r.stream));
                }
                self.lost(sh, &node);
            }
            let now = Instant::now();
            let late: Vec<usize> = conns
                .openings
                .iter()
                .filter(|(_, p)| now >= p.op.deadline())
                .map(|(k, _)| *k)
                .collect();
            for key in late {
                if let Some(p) = conns.openings.remove(&key) {
                    let e = p.op.timed_out();
                    let _ = sh.poller.delete(p.fd);
                    self.open_failed(sh, &mut conns, &p.node, p.channels, &e);
                }
            }
            for node in self.heartbeat() {
                sh.outage(&node, |o| {
                    o.lost(&node, &"no answer to PING", Instant::now())
                });
                conns.readers.retain(|_, (n, r)| {
                    if *n == node {
                        let _ = sh.poller.delete(fd_of(&r.stream));
                        false
                    } else {
                        true
                    }
                });
                self.lost(sh, &node);
            }
            // Readers whose connection the table dropped (idle, or shut down).
            let table = self.table.lock();
            conns.readers.retain(|_, (n, r)| {
                let keep = table.shards.contains_key(n);
                if !keep {
                    let _ = sh.poller.delete(fd_of(&r.stream));
                }
                keep
            });
        }
        for (_, (_, r)) in conns.readers {
            let _ = sh.poller.delete(fd_of(&r.stream));
            r.stream.shutdown();
        }
        for (_, p) in conns.openings {
            let _ = sh.poller.delete(p.fd);
        }
        log::debug!("subscriber thread stopped");
    }

    /// Advances the opening connection of poller key `key` as far as its socket allows;
    /// once open, it joins the readers and the table, and its channels are subscribed by the
    /// next [`Subscriber::flush`].
    fn advance_opening(&self, sh: &Sharded, conns: &mut Conns, key: usize) {
        let Some(p) = conns.openings.get_mut(&key) else {
            return;
        };
        let failed = match p.op.advance() {
            Ok(Step::Wait(want)) => {
                let interest = match want {
                    Want::Read => Event::readable(key),
                    Want::Write => Event::writable(key),
                };
                // A connect to the host's next address has a new socket (the old one, closed,
                // left the poller by itself).
                p.fd = p.op.fd();
                match sh.poller.modify(p.fd, interest) {
                    Ok(()) => return,
                    Err(_) => match sh.poller.add(p.fd, interest) {
                        Ok(()) => return,
                        Err(e) => Error::io(e),
                    },
                }
            }
            Ok(Step::Ready) => {
                let Some(p) = conns.openings.remove(&key) else {
                    return;
                };
                let opened = p.op.into_open().and_then(|(reader, writer)| {
                    sh.poller
                        .modify(p.fd, Event::readable(key))
                        .map_err(Error::io)?;
                    Ok((reader, writer))
                });
                match opened {
                    Ok((reader, writer)) => {
                        log::debug!("pub/sub connection to {} open", p.node);
                        if sh.outage(&p.node, |o| o.restored(&p.node, Instant::now())) {
                            self.counters.reconnected();
                        }
                        conns.retry.remove(&p.node);
                        conns.readers.insert(key, (p.node.clone(), reader));
                        let mut table = self.table.lock();
                        table.shards.insert(
                            p.node,
                            ShardConn {
                                writer,
                                pending: VecDeque::new(),
                                unsubs: HashMap::new(),
                                ping_outstanding: false,
                                last_read: Instant::now(),
                                empty_since: None,
                                key,
                                fd: p.fd,
                            },
                        );
                        table.unrouted.extend(p.channels);
                    }
                    Err(e) => {
                        let _ = sh.poller.delete(p.fd);
                        self.open_failed(sh, conns, &p.node, p.channels, &e);
                    }
                }
                return;
            }
            Err(e) => e,
        };
        if let Some(p) = conns.openings.remove(&key) {
            let _ = sh.poller.delete(p.fd);
            self.open_failed(sh, conns, &p.node, p.channels, &failed);
        }
    }

    /// A connection to `node` could not be opened: it is tried again after a backoff (of its
    /// own: other nodes are not held up), its channels' leaders re-check on a short period
    /// meanwhile, and the map is read again.
    fn open_failed(
        &self,
        sh: &Sharded,
        conns: &mut Conns,
        node: &str,
        channels: Vec<Arc<Channel>>,
        e: &Error,
    ) {
        let b = conns
            .retry
            .get(node)
            .map_or(BACKOFF_MIN, |(_, b)| (*b * 2).min(BACKOFF_MAX));
        sh.outage(node, |o| o.failed(node, e, Some(b), Instant::now()));
        conns.retry.insert(node.to_owned(), (Instant::now() + b, b));
        sh.refresh.store(true, Ordering::SeqCst);
        let mut table = self.table.lock();
        for ch in channels {
            let mut st = ch.state.lock();
            st.down = true;
            st.wake_leader();
            drop(st);
            table.unrouted.push(ch);
        }
    }

    /// Reads what arrived on `node`'s connection and handles every whole reply in it.
    fn drain(&self, sh: &Sharded, node: &str, r: &mut ReadHalf) -> io::Result<()> {
        let mut once = OneRead {
            stream: &mut r.stream,
            reads: 0,
            full: false,
        };
        loop {
            match r.parser.parse_value(&mut once) {
                Ok(v) => self.dispatch_shard(sh, node, v),
                Err(e) if e.is_timeout() => return Ok(()),
                Err(e) => {
                    sh.outage(node, |o| o.lost(node, &e, Instant::now()));
                    return Err(io::Error::other(e.to_string()));
                }
            }
        }
    }

    /// Sends PINGs on connections silent for a heartbeat; returns those that did not answer
    /// the previous one, and closes those idle without channels for long.
    fn heartbeat(&self) -> Vec<String> {
        let mut table = self.table.lock();
        let used: Vec<String> = table
            .channels
            .values()
            .filter_map(|c| c.state.lock().shard.clone())
            .collect();
        let mut dead = Vec::new();
        let mut idle = Vec::new();
        for (name, shard) in table.shards.iter_mut() {
            let in_use = used.contains(name) || !shard.pending.is_empty();
            if in_use {
                shard.empty_since = None;
            } else if shard.empty_since.get_or_insert_with(Instant::now).elapsed() >= IDLE_CLOSE {
                idle.push(name.clone());
                continue;
            }
            if shard.last_read.elapsed() < HEARTBEAT {
                continue;
            }
            if shard.ping_outstanding {
                dead.push(name.clone());
            } else if shard.write(&[b"PING"]) {
                shard.ping_outstanding = true;
                shard.last_read = Instant::now();
            } else {
                dead.push(name.clone());
            }
        }
        for name in idle {
            if let Some(s) = table.shards.remove(&name) {
                log::debug!("closing the idle pub/sub connection to {name}");
                s.writer.shutdown();
            }
        }
        dead
    }

    /// Marks every channel whose slot's master is not the node it is subscribed on to move.
    fn reroute(&self, sh: &Sharded) {
        let mut table = self.table.lock();
        let mut moved = Vec::new();
        for ch in table.channels.values() {
            let owner = sh.cluster.owner_of(&ch.name).map(|(name, _)| name);
            let mut st = ch.state.lock();
            if st.shard.is_some() && st.shard != owner {
                if let Some(old) = st.shard.take() {
                    moved.push((old, Arc::clone(ch)));
                }
                st.confirmed = false;
                st.epoch += 1;
                st.wake_leader();
            }
        }
        for (old, ch) in moved {
            log::info!("the slot of {} moved; resubscribing its waiters", ch.name);
            table.unsubs.push((old, ch.name.clone()));
            table.unrouted.push(ch);
        }
    }

    /// Sends the queued `SUNSUBSCRIBE`s, and subscribes the queued channels on their masters
    /// (starting to open connections as needed, without waiting for them). Whether a
    /// channel is left unrouted (its master unknown, or failed a moment ago): the thread then
    /// retries after a backoff.
    fn flush(&self, sh: &Sharded, conns: &mut Conns) -> bool {
        let mut table = self.table.lock();
        for (node, name) in std::mem::take(&mut table.unsubs) {
            if let Some(shard) = table.shards.get_mut(&node) {
                if shard.write(&[b"SUNSUBSCRIBE", name.as_bytes()]) {
                    *shard.unsubs.entry(name).or_insert(0) += 1;
                } else {
                    drop(table);
                    self.lost(sh, &node);
                    table = self.table.lock();
                }
            }
        }
        let todo = std::mem::take(&mut table.unrouted);
        drop(table);
        let mut stuck = false;
        for ch in todo {
            let mut table = self.table.lock();
            let current = table
                .channels
                .get(&ch.name)
                .is_some_and(|c| Arc::ptr_eq(c, &ch));
            if !current {
                continue;
            }
            let Some((node_name, node_info)) = sh.cluster.owner_of(&ch.name) else {
                sh.refresh.store(true, Ordering::SeqCst);
                table.unrouted.push(ch);
                stuck = true;
                continue;
            };
            if !table.shards.contains_key(&node_name) {
                // Being opened: the channel waits for it (a frozen node holds up its own
                // channels only).
                if let Some(p) = conns.openings.values_mut().find(|p| p.node == node_name) {
                    p.channels.push(ch);
                    continue;
                }
                // Failed a moment ago: tried again after its backoff; its waiters re-check
                // on a short period meanwhile.
                if conns
                    .retry
                    .get(&node_name)
                    .is_some_and(|(at, _)| Instant::now() < *at)
                {
                    let mut st = ch.state.lock();
                    if !st.down {
                        st.down = true;
                        st.wake_leader();
                    }
                    drop(st);
                    table.unrouted.push(ch);
                    stuck = true;
                    continue;
                }
                // Resolving a host name may take a moment: not under the table lock.
                drop(table);
                let started = Opening::start(&node_info, self.timeouts, self.tls.as_deref())
                    .and_then(|op| {
                        let key = conns.next_key;
                        sh.poller
                            .add(op.fd(), Event::writable(key))
                            .map_err(Error::io)?;
                        conns.next_key += 1;
                        Ok((key, op))
                    });
                match started {
                    Ok((key, op)) => {
                        let fd = op.fd();
                        conns.openings.insert(
                            key,
                            Pending {
                                node: node_name,
                                op,
                                fd,
                                channels: vec![ch],
                            },
                        );
                    }
                    Err(e) => {
                        self.open_failed(sh, conns, &node_name, vec![ch], &e);
                        stuck = true;
                    }
                }
                continue;
            }
            let Some(shard) = table.shards.get_mut(&node_name) else {
                table.unrouted.push(ch);
                continue;
            };
            if shard.write(&[b"SSUBSCRIBE", ch.name.as_bytes()]) {
                shard.pending.push_back(Arc::clone(&ch));
                let mut st = ch.state.lock();
                st.shard = Some(node_name.clone());
                st.down = false;
            } else {
                table.unrouted.push(ch);
                drop(table);
                self.lost(sh, &node_name);
                stuck = true;
            }
        }
        stuck
    }

    /// `node`'s connection is gone: its channels are moved (subscribed again where their
    /// slot's master is now), their leaders woken to re-check, and the map read again.
    fn lost(&self, sh: &Sharded, node: &str) {
        let mut table = self.table.lock();
        if let Some(s) = table.shards.remove(node) {
            s.writer.shutdown();
            let _ = (s.key, s.fd);
        }
        let mut moved = Vec::new();
        for ch in table.channels.values() {
            let mut st = ch.state.lock();
            if st.shard.as_deref() == Some(node) {
                st.shard = None;
                st.confirmed = false;
                st.epoch += 1;
                st.wake_leader();
                moved.push(Arc::clone(ch));
            }
        }
        table.unrouted.extend(moved);
        table.unsubs.retain(|(n, _)| n != node);
        sh.refresh.store(true, Ordering::SeqCst);
    }

    /// Handles one reply read from `node`'s connection.
    fn dispatch_shard(&self, sh: &Sharded, node: &str, value: Value) {
        let mut table = self.table.lock();
        let Some(shard) = table.shards.get_mut(node) else {
            return;
        };
        shard.ping_outstanding = false;
        shard.last_read = Instant::now();
        let items = match value {
            Value::Array(items) | Value::Push { data: items, .. } => items,
            Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoSub) => {
                // Valkey 8.0.0's answer to a SUNSUBSCRIBE on a connection without
                // subscriptions (see `Subscriber::dispatch`): not an SSUBSCRIBE's.
                log::debug!("pub/sub on {node}: {e}");
                return;
            }
            Value::ServerError(e) => {
                // The answer to an SSUBSCRIBE: MOVED (the slot is elsewhere now) or refused.
                let Some(ch) = shard.pending.pop_front() else {
                    log::warn!("pub/sub error reply from {node}: {e}");
                    return;
                };
                let moved = matches!(
                    e.kind(),
                    Some(
                        ServerErrorKind::Moved
                            | ServerErrorKind::TryAgain
                            | ServerErrorKind::ClusterDown
                    )
                );
                if e.kind() == Some(ServerErrorKind::Moved) {
                    sh.cluster.learn_moved(e.details());
                }
                let mut st = ch.state.lock();
                if moved {
                    st.shard = None;
                    drop(st);
                    sh.refresh.store(true, Ordering::SeqCst);
                    table.unrouted.push(ch);
                } else {
                    log::warn!("SSUBSCRIBE {} refused: {e}; its waiters re-check", ch.name);
                    st.refused = true;
                    st.wake_leader();
                }
                return;
            }
            _ => return,
        };
        let kind = items.first().and_then(bytes).unwrap_or_default();
        let channel = items.get(1).and_then(bytes).unwrap_or_default();
        let name = String::from_utf8_lossy(channel).into_owned();
        match kind {
            b"smessage" => {
                let Some(ch) = table.channels.get(&name).cloned() else {
                    return;
                };
                drop(table);
                ch.deliver(items.get(2).and_then(bytes).map(<[u8]>::to_vec));
            }
            b"ssubscribe" => {
                let Some(ch) = shard.pending.pop_front() else {
                    return;
                };
                drop(table);
                ch.confirm(channel);
            }
            b"sunsubscribe" => {
                if let Some(n) = shard.unsubs.get_mut(&name)
                    && *n > 0
                {
                    *n -= 1;
                    if *n == 0 {
                        shard.unsubs.remove(&name);
                    }
                    return;
                }
                // Pushed by the server: the channel's slot left this master.
                let Some(ch) = table.channels.get(&name).cloned() else {
                    return;
                };
                let mut st = ch.state.lock();
                if st.shard.as_deref() != Some(node) {
                    return;
                }
                log::info!(
                    "{node} dropped the subscription to {name} (its slot moved); resubscribing"
                );
                st.shard = None;
                st.confirmed = false;
                st.epoch += 1;
                st.wake_leader();
                drop(st);
                table.unrouted.push(ch);
                sh.refresh.store(true, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}
