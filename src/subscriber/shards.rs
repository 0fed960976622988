//! Sharded pub/sub for a Cluster client: one connection per master that owns a channel with
//! local waiters, all read by the one pub/sub thread.
//!
//! - **Subscribing.** A new channel is queued (`Table::unrouted`) and the thread woken; it
//!   finds the master of the channel's slot in the slot map, opens a connection to it if it
//!   has none (within the connect timeout), and writes `SSUBSCRIBE` there. Releases publish
//!   with `SPUBLISH` on the same master (the scripts' sharded variants), so a waiter hears
//!   its lock's release from the one shard that owns it.
//! - **Reading.** The sockets stay blocking (waiting threads share the write side); a
//!   [`polling::Poller`] (epoll; it starts no thread) says which are readable, and each
//!   readable socket is read once, then its buffered replies parsed until the parser needs
//!   more bytes. `Poller::notify` wakes the thread for new channels, map changes and shutdown.
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
use crate::transport::pubsub::{self, HEARTBEAT};

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

impl Subscriber {
    /// The body of a cluster client's pub/sub thread.
    pub(super) fn run_sharded(&self, sh: &Sharded) {
        let mut readers: HashMap<usize, (String, ReadHalf)> = HashMap::new();
        let mut next_key = 0usize;
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
            let stuck = self.flush(sh, &mut readers, &mut next_key);
            let wait = if stuck {
                let b = backoff;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                b
            } else {
                backoff = BACKOFF_MIN;
                HEARTBEAT.min(RESOLVE_EVERY)
            };
            events.clear();
            if let Err(e) = sh.poller.wait(&mut events, Some(wait)) {
                log::debug!("pub/sub poll failed: {e}");
            }
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            for ev in &events {
                let Some((node, r)) = readers.get_mut(&ev.key) else {
                    continue;
                };
                let node = node.clone();
                if self.drain(sh, &node, r).is_ok() {
                    let _ = sh.poller.modify(fd_of(&r.stream), Event::readable(ev.key));
                    continue;
                }
                if let Some((_, r)) = readers.remove(&ev.key) {
                    let _ = sh.poller.delete(fd_of(&r.stream));
                }
                self.lost(sh, &node);
            }
            for node in self.heartbeat() {
                sh.outage(&node, |o| {
                    o.lost(&node, &"no answer to PING", Instant::now())
                });
                readers.retain(|_, (n, r)| {
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
            readers.retain(|_, (n, r)| {
                let keep = table.shards.contains_key(n);
                if !keep {
                    let _ = sh.poller.delete(fd_of(&r.stream));
                }
                keep
            });
        }
        for (_, (_, r)) in readers {
            let _ = sh.poller.delete(fd_of(&r.stream));
            r.stream.shutdown();
        }
        log::debug!("subscriber thread stopped");
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
    /// (opening connections as needed). Whether a channel is left unrouted (its master
    /// unknown or unreachable): the thread then retries after a backoff.
    fn flush(
        &self,
        sh: &Sharded,
        readers: &mut HashMap<usize, (String, ReadHalf)>,
        next_key: &mut usize,
    ) -> bool {
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
        // Nodes that could not be reached in this pass are not tried again for each channel.
        let mut failed: Vec<String> = Vec::new();
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
                // Opening takes up to the connect timeout: not under the table lock.
                drop(table);
                let opened = if failed.contains(&node_name) {
                    Err(Error::Timeout {
                        what: "the node was not reached a moment ago",
                    })
                } else {
                    pubsub::open(&node_info, self.timeouts, self.tls.as_deref())
                };
                table = self.table.lock();
                match opened {
                    Ok((reader, writer)) => {
                        let key = *next_key;
                        *next_key += 1;
                        let fd = fd_of(&reader.stream);
                        if let Err(e) = sh.poller.add(fd, Event::readable(key)) {
                            log::warn!("pub/sub connection to {} not polled: {e}", node_name);
                            writer.shutdown();
                            table.unrouted.push(ch);
                            stuck = true;
                            continue;
                        }
                        sh.outage(&node_name, |o| o.restored(&node_name, Instant::now()));
                        readers.insert(key, (node_name.clone(), reader));
                        table.shards.insert(
                            node_name.clone(),
                            ShardConn {
                                writer,
                                pending: VecDeque::new(),
                                unsubs: HashMap::new(),
                                ping_outstanding: false,
                                last_read: Instant::now(),
                                empty_since: None,
                                key,
                                fd,
                            },
                        );
                    }
                    Err(e) => {
                        if !failed.contains(&node_name) {
                            sh.outage(&node_name, |o| {
                                o.failed(&node_name, &e, None, Instant::now())
                            });
                            failed.push(node_name.clone());
                        }
                        sh.refresh.store(true, Ordering::SeqCst);
                        let mut st = ch.state.lock();
                        st.down = true;
                        st.wake_leader();
                        drop(st);
                        table.unrouted.push(ch);
                        stuck = true;
                        continue;
                    }
                }
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
