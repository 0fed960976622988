//! The subscriber thread's body on one server (or on the master a Sentinel names): read one
//! reply at a time and dispatch it, probe a silent connection, and reconnect with backoff,
//! subscribing every channel again and waking every leader to re-check.
//!
//! Apart from the shared state and the waiters' entry points (the parent module) because it
//! is the thread's own loop; a Cluster client runs `shards.rs` instead.
//!
//! Its log lines keep the parent's target, `locksmith::subscriber`: operators filter on
//! the targets that "Log levels" in the crate docs lists.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use redis::{ServerErrorKind, Value};

use super::{BACKOFF_MAX, BACKOFF_MIN, Outage, Reader, Subscriber, bytes};
use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, RESOLVE_EVERY, server_name};
use crate::transport::pubsub::{ReadHalf, open_any};

impl Subscriber {
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
                        if outage.restored(&self.server(), Instant::now()) {
                            self.counters.reconnected();
                        }
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
        log::debug!(target: "locksmith::subscriber", "subscriber thread stopped");
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
                    log::debug!(target: "locksmith::subscriber", "pub/sub: {e}");
                    return;
                }
                let refused = table.pending.pop_front();
                drop(table);
                match refused {
                    Some(ch) => {
                        log::warn!(
                            target: "locksmith::subscriber",
                            "SUBSCRIBE {} refused: {e}; its waiters re-check", ch.name
                        );
                        let mut st = ch.state.lock();
                        st.refused = true;
                        st.wake_leader();
                    }
                    None => log::warn!(target: "locksmith::subscriber", "pub/sub error reply: {e}"),
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
            return Err(Error::timeout("shutting down"));
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::io::Read;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::time::Duration;

    use parking_lot::Mutex;

    use crate::subscriber::{Channel, ChannelState, Table};
    use crate::transport::conn::Timeouts;

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
            counters: std::sync::Arc::default(),
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
