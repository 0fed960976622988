//! The subscriber thread's loop, on one server and on a cluster alike: one connection per
//! server that a channel with local waiters needs (on one server, the one connection), all
//! read by this one thread.
//!
//! - **Subscribing.** A waiter writes its channel's subscription itself when its server's
//!   connection is open; otherwise the channel is queued (`Table::unrouted`) and the thread
//!   woken: it finds the channel's server ([`Route`](super::route::Route)) and writes the
//!   subscription once the connection is open.
//! - **Opening, without blocking.** A server without a connection gets one opened as steps
//!   of the poll loop (`transport/pubsub/opening.rs`: a connect, TLS handshake and `AUTH` /
//!   `CLIENT SETNAME`, each advanced when the poller says the socket is ready), within the
//!   connect timeout of its own; its channels wait for it, and nothing else does. A server
//!   whose connection failed is tried again after a backoff of its own (20 ms doubling to
//!   1 s), its channels `down` meanwhile (their leaders re-check every
//!   [`RECHECK`](crate::driver::wait::RECHECK)); one server of a quorum moves on to the next
//!   master, and a Sentinel is asked again where the master is. So a frozen master
//!   (accepting connections, never answering) delays no subscription, release or heartbeat
//!   on another master. The thread's other blocking steps against one node are bounded and
//!   small: a read of a socket the poller reported readable, a write of a few bytes
//!   (`SUBSCRIBE`, `PING`) to the kernel's buffer, the map read below (a quarter second
//!   at most, and one per-node bound for a node that does not answer, which is then asked
//!   last), and with Sentinel, asking where the master is (within the connect timeout; there
//!   is no other server to hold up).
//! - **Reading.** Once open, the sockets are blocking again (waiting threads share the write
//!   side); a [`polling::Poller`] says which are readable, and each readable socket is read
//!   once, then its buffered replies parsed until the parser needs more bytes.
//! - **Reconnecting.** A lost connection's channels are `down`, their leaders woken to
//!   re-check, and they are subscribed again (on a new connection, with backoff); once
//!   written, each leader is woken once more, as releases may have been missed meanwhile.
//! - **Following the slots** (a cluster). A channel is moved (unsubscribed where it was,
//!   subscribed on the new master, its leader woken to re-check) when the server pushes
//!   `sunsubscribe` (its slot left that master: a migration or a failover), when an
//!   `SSUBSCRIBE` is answered with `MOVED`, when its connection is lost, and when the slot
//!   map changes: the map is read again after each of these and every [`RESOLVE_EVERY`]
//!   while channels are subscribed. A release missed during a move is covered by the
//!   wake-up: the leader re-checks the lock. A Sentinel is asked where the master is every
//!   [`RESOLVE_EVERY`]; a move closes the connection ([`Subscriber::reconnect_now`]).
//! - **Liveness.** A connection silent for [`HEARTBEAT`] with channels gets a `PING`; one
//!   still silent a heartbeat later is dropped and its channels moved as above.
//! - A cluster's connection without channels is closed after [`IDLE_CLOSE`]; the one
//!   server's stays open.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use polling::Event;
use redis::ConnectionInfo;

use super::{BACKOFF_MAX, BACKOFF_MIN, Channel, Link, Reader, SHARDS, Subscriber, TARGET};
use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, RESOLVE_EVERY};
use crate::transport::pubsub::opening::{Opening, Step, want_event, watch};
use crate::transport::pubsub::{HEARTBEAT, ReadHalf};

/// How long a cluster's connection without channels stays open (a waiter may come back
/// soon).
const IDLE_CLOSE: Duration = Duration::from_secs(20);

/// A connection being opened (see `transport/pubsub/opening.rs`), and the channels that
/// wait for it.
struct Pending {
    node: String,
    op: Opening,
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

impl Conns {
    /// Reads from `key` from now on (its socket is registered with the poller already, or
    /// is added).
    fn read(&mut self, sub: &Subscriber, key: usize, node: String, r: ReadHalf) -> Result<()> {
        watch(&sub.poller, &r.stream, Event::readable(key)).map_err(Error::io)?;
        self.readers.insert(key, (node, r));
        Ok(())
    }

    /// Stops reading the connections for which `drop` says so.
    fn drop_readers(&mut self, sub: &Subscriber, mut drop: impl FnMut(&str) -> bool) {
        for (_, (_, r)) in self.readers.extract_if(|_, (n, _)| drop(n)) {
            let _ = sub.poller.delete(&r.stream);
            r.stream.shutdown();
        }
    }
}

impl Subscriber {
    /// The thread's body: open, read, dispatch, reconnect, until shut down.
    pub(crate) fn run(&self, reader: Reader) {
        let mut conns = Conns::default();
        if let Some((node, r)) = reader {
            conns.next_key = 1;
            if conns.read(self, 0, node.clone(), r).is_err() {
                self.lost(&mut conns, &node);
            }
        }
        let mut seen = self.route.epoch();
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
            let failed = self.refresh.swap(false, Ordering::SeqCst);
            let due = refreshed.elapsed() >= RESOLVE_EVERY;
            let connect = Deadline::after(self.timeouts.connect);
            if self
                .route
                .refresh(failed, due, busy, Deadline::after(short), connect)
            {
                refreshed = Instant::now();
            }
            let epoch = self.route.epoch();
            if epoch != seen {
                seen = epoch;
                self.reroute();
            }
            let stuck = self.flush(&mut conns);
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
            if let Err(e) = self.poller.wait(&mut events, Some(wait)) {
                log::debug!(target: TARGET, "pub/sub poll failed: {e}");
            }
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            for ev in &events {
                if conns.openings.contains_key(&ev.key) {
                    self.advance_opening(&mut conns, ev.key);
                    continue;
                }
                let Some((node, r)) = conns.readers.get_mut(&ev.key) else {
                    continue;
                };
                let node = node.clone();
                if self.drain(&node, r).is_ok() {
                    let _ = self.poller.modify(&r.stream, Event::readable(ev.key));
                    continue;
                }
                self.lost(&mut conns, &node);
            }
            let now = Instant::now();
            let late: Vec<Pending> = (conns.openings)
                .extract_if(|_, p| now >= p.op.deadline())
                .map(|(_, p)| p)
                .collect();
            for p in late {
                let _ = self.poller.delete(p.op.sock());
                self.open_failed(&mut conns, &p.node, p.channels, &p.op.timed_out());
            }
            for node in self.heartbeat() {
                self.outage(&node, |o| {
                    o.lost(&node, &"no answer to PING", Instant::now())
                });
                self.lost(&mut conns, &node);
            }
            // Readers whose connection the table dropped (idle, or shut down).
            let table = self.table.lock();
            conns.drop_readers(self, |n| !table.links.contains_key(n));
        }
        conns.drop_readers(self, |_| true);
        for (_, p) in conns.openings {
            let _ = self.poller.delete(p.op.sock());
        }
        log::debug!(target: TARGET, "subscriber thread stopped");
    }

    /// Advances the opening connection of poller key `key` as far as its socket allows;
    /// once open, it joins the readers and the table, and its channels are subscribed by the
    /// next [`Subscriber::flush`].
    fn advance_opening(&self, conns: &mut Conns, key: usize) {
        let Some(p) = conns.openings.get_mut(&key) else {
            return;
        };
        let failed = match p.op.advance() {
            Ok(Step::Wait(want)) => {
                // A connect to the host's next address has a new socket (the old one, closed,
                // left the poller by itself).
                match watch(&self.poller, p.op.sock(), want_event(want, key)) {
                    Ok(()) => return,
                    Err(e) => Error::io(e),
                }
            }
            Ok(Step::Ready) => {
                let Some(p) = conns.openings.remove(&key) else {
                    return;
                };
                let opened = p.op.into_open().and_then(|(reader, writer)| {
                    conns.read(self, key, p.node.clone(), reader)?;
                    Ok(writer)
                });
                match opened {
                    Ok(writer) => {
                        log::debug!(target: TARGET, "pub/sub connection to {} open", p.node);
                        if self.outage(&p.node, |o| o.restored(&p.node, Instant::now())) {
                            self.counters.reconnected();
                        }
                        conns.retry.remove(&p.node);
                        let mut table = self.table.lock();
                        table.links.insert(p.node, Link::new(writer));
                        table.unrouted.extend(p.channels);
                    }
                    Err(e) => self.open_failed(conns, &p.node, p.channels, &e),
                }
                return;
            }
            Err(e) => e,
        };
        if let Some(p) = conns.openings.remove(&key) {
            let _ = self.poller.delete(p.op.sock());
            self.open_failed(conns, &p.node, p.channels, &failed);
        }
    }

    /// A connection to `node` could not be opened: it is tried again after a backoff (of its
    /// own: other nodes are not held up), its channels are `down` meanwhile, and where the
    /// servers are is asked again.
    fn open_failed(&self, conns: &mut Conns, node: &str, channels: Vec<Arc<Channel>>, e: &Error) {
        let b = conns
            .retry
            .get(node)
            .map_or(BACKOFF_MIN, |(_, b)| (*b * 2).min(BACKOFF_MAX));
        self.outage(node, |o| o.failed(node, e, Some(b), Instant::now()));
        conns.retry.insert(node.to_owned(), (Instant::now() + b, b));
        self.route.open_failed(node);
        self.refresh.store(true, Ordering::SeqCst);
        let mut table = self.table.lock();
        for ch in channels {
            let mut st = ch.state.lock();
            st.down = true;
            st.wake_leader();
            drop(st);
            table.unrouted.push(ch);
        }
    }

    /// Sends PINGs on connections silent for a heartbeat; returns those that did not answer
    /// the previous one, and closes a cluster's connections idle without channels for long.
    fn heartbeat(&self) -> Vec<String> {
        let sharded = self.route.sharded();
        let mut table = self.table.lock();
        let used: Vec<String> = table
            .channels
            .values()
            .filter_map(|c| c.state.lock().node.clone())
            .collect();
        let mut dead = Vec::new();
        let mut idle = Vec::new();
        for (name, link) in table.links.iter_mut() {
            let in_use = used.contains(name) || !link.pending.is_empty();
            if in_use {
                link.empty_since = None;
            } else if !sharded {
                // The one server's connection stays, unprobed while nobody waits.
                continue;
            } else if link.empty_since.get_or_insert_with(Instant::now).elapsed() >= IDLE_CLOSE {
                idle.push(name.clone());
                continue;
            }
            if link.last_read.elapsed() < HEARTBEAT {
                continue;
            }
            if link.ping_outstanding || !link.write(&[b"PING"]) {
                dead.push(name.clone());
            } else {
                link.ping_outstanding = true;
                link.last_read = Instant::now();
            }
        }
        for name in idle {
            if let Some(s) = table.links.remove(&name) {
                log::debug!(target: TARGET, "closing the idle pub/sub connection to {name}");
                s.writer.shutdown();
            }
        }
        dead
    }

    /// Moves every channel whose server is not the node it is subscribed on (a cluster's
    /// slot map changed).
    fn reroute(&self) {
        let mut table = self.table.lock();
        let mut moved = Vec::new();
        for ch in table.channels.values() {
            let owner = self.route.owner_of(&ch.name).map(|(name, _)| name);
            let mut st = ch.state.lock();
            if st.node.is_some()
                && st.node != owner
                && let Some(old) = st.unsubscribed()
            {
                moved.push((old, Arc::clone(ch)));
            }
        }
        for (old, ch) in moved {
            log::info!(target: SHARDS, "the slot of {} moved; resubscribing its waiters", ch.name);
            table.unsubscribe(&self.route, &old, &ch.name);
            table.unrouted.push(ch);
        }
    }

    /// Drops the connections whose write failed, and subscribes the queued channels on their
    /// servers (starting to open connections as needed, without waiting for them). Whether
    /// a channel is left unrouted (its server unknown, or failed a moment ago): the thread
    /// then retries after a backoff.
    fn flush(&self, conns: &mut Conns) -> bool {
        let broken: Vec<String> = (self.table.lock().links.iter())
            .filter(|(_, l)| l.broken)
            .map(|(n, _)| n.clone())
            .collect();
        for node in broken {
            self.lost(conns, &node);
        }
        let todo = std::mem::take(&mut self.table.lock().unrouted);
        let mut stuck = false;
        for ch in todo {
            let mut table = self.table.lock();
            if !table.is_current(&ch) {
                continue;
            }
            let (node, info) = match table.subscribe(&self.route, &ch) {
                Ok(()) => continue,
                Err(Some(to)) if !table.links.contains_key(&to.0) => *to,
                // Its server is not known (asked again), or its write failed (the connection
                // is dropped at the next turn).
                Err(to) => {
                    if to.is_none() {
                        self.refresh.store(true, Ordering::SeqCst);
                    }
                    table.unrouted.push(ch);
                    stuck = true;
                    continue;
                }
            };
            // While the connection is down (lost, or failed a moment ago), its waiters
            // re-check on a short period.
            if self.outage(&node, |o| o.is_down()) {
                let mut st = ch.state.lock();
                if !st.down {
                    st.down = true;
                    st.wake_leader();
                }
            }
            drop(table);
            stuck |= self.open(conns, node, &info, Some(ch));
        }
        // The one server's connection stays open, waiters or not.
        if !self.route.sharded()
            && let Some((node, info)) = self.route.owner_of("")
            && !self.table.lock().links.contains_key(&node)
        {
            stuck |= self.open(conns, node, &info, None);
        }
        stuck
    }

    /// Starts opening a connection to `node` for `ch`, or adds `ch` to the one being opened
    /// (a frozen node holds up its own channels only). True when the node failed a moment
    /// ago: it is tried again after its backoff.
    fn open(
        &self,
        conns: &mut Conns,
        node: String,
        info: &ConnectionInfo,
        ch: Option<Arc<Channel>>,
    ) -> bool {
        if let Some(p) = conns.openings.values_mut().find(|p| p.node == node) {
            p.channels.extend(ch);
            return false;
        }
        if conns
            .retry
            .get(&node)
            .is_some_and(|(at, _)| Instant::now() < *at)
        {
            self.table.lock().unrouted.extend(ch);
            return true;
        }
        // Resolving a host name may take a moment: not under the table lock.
        let started =
            Opening::start(info, self.timeouts, self.tls.as_deref(), true).and_then(|op| {
                let key = conns.next_key;
                self.poller
                    .add(op.sock(), Event::writable(key))
                    .map_err(Error::io)?;
                conns.next_key += 1;
                Ok((key, op))
            });
        match started {
            Ok((key, op)) => {
                let channels = ch.into_iter().collect();
                conns.openings.insert(key, Pending { node, op, channels });
                false
            }
            Err(e) => {
                self.open_failed(conns, &node, ch.into_iter().collect(), &e);
                true
            }
        }
    }

    /// `node`'s connection is gone: it is no longer read, its channels are `down` and moved
    /// (subscribed again where their server is now), their leaders woken to re-check, and
    /// where the servers are is asked again.
    fn lost(&self, conns: &mut Conns, node: &str) {
        conns.drop_readers(self, |n| n == node);
        let mut table = self.table.lock();
        if let Some(s) = table.links.remove(node) {
            s.writer.shutdown();
        }
        let mut moved = Vec::new();
        for ch in table.channels.values() {
            let mut st = ch.state.lock();
            if st.node.as_deref() == Some(node) {
                st.down = true;
                st.unsubscribed();
                moved.push(Arc::clone(ch));
            }
        }
        table.unrouted.extend(moved);
        self.refresh.store(true, Ordering::SeqCst);
    }
}
