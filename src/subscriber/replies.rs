//! What the subscriber thread does with what it reads from a connection: release messages,
//! confirmations, refusals and redirections of subscriptions, and unsubscriptions the server
//! pushes (a cluster's slot that moved).
//!
//! Apart from the thread's loop (`pubsub_thread.rs`) because it is the protocol's side of
//! the thread: what each reply means for a channel's queue, whatever opened the connection.

use std::io::{self, Read};

use std::sync::atomic::Ordering;
use std::time::Instant;

use redis::{ServerErrorKind, Value};

use super::{SHARDS, Subscriber, TARGET, bytes};
use crate::transport::pubsub::{ReadHalf, Stream};

/// Reads a socket once (it was reported readable), then says "would block", so that the
/// parser takes what was read and the thread goes back to waiting. A read that filled the
/// whole buffer may have left more: one more read is allowed then (`more`).
struct OneRead<'a> {
    stream: &'a mut Stream,
    more: bool,
}

impl Read for OneRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !std::mem::take(&mut self.more) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.stream.read(buf)?;
        self.more = n == buf.len() && n > 0;
        Ok(n)
    }
}

impl Subscriber {
    /// Reads what arrived on `node`'s connection and handles every whole reply in it.
    pub(super) fn drain(&self, node: &str, r: &mut ReadHalf) -> io::Result<()> {
        let mut once = OneRead {
            stream: &mut r.stream,
            more: true,
        };
        loop {
            match r.parser.parse_value(&mut once) {
                Ok(v) => self.dispatch(node, v),
                Err(e) if e.is_timeout() => return Ok(()),
                Err(e) => {
                    if !self.stop.load(Ordering::SeqCst) {
                        self.outage(node, |o| o.lost(node, &e, Instant::now()));
                    }
                    return Err(io::Error::other(e.to_string()));
                }
            }
        }
    }

    /// Handles one reply read from `node`'s connection.
    fn dispatch(&self, node: &str, value: Value) {
        let mut table = self.table.lock();
        let Some(link) = table.links.get_mut(node) else {
            return;
        };
        link.ping_outstanding = false;
        link.last_read = Instant::now();
        let items = match value {
            Value::Array(items) | Value::Push { data: items, .. } => items,
            Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoSub) => {
                // Valkey 8.0.0 answered `UNSUBSCRIBE` on a connection without subscriptions
                // (its only channel's `SUBSCRIBE` was refused) with a `NOSUB` error; Redis
                // and later Valkey releases send the usual `unsubscribe` reply. Either way it
                // answers our `UNSUBSCRIBE`, not a `SUBSCRIBE`: the pending ones stay pending.
                log::debug!(target: TARGET, "pub/sub on {node}: {e}");
                return;
            }
            Value::ServerError(e) => {
                // The answer to a subscription: `MOVED` (the slot is elsewhere now), or
                // refused (an ACL without the permission): its waiters fall back to bounded
                // re-checks.
                let Some(ch) = link.pending.pop_front() else {
                    log::warn!(target: TARGET, "pub/sub error reply from {node}: {e}");
                    return;
                };
                let kind = e.kind();
                if kind == Some(ServerErrorKind::Moved) {
                    self.route.learn_moved(e.details());
                }
                let mut st = ch.state.lock();
                if matches!(
                    kind,
                    Some(
                        ServerErrorKind::Moved
                            | ServerErrorKind::TryAgain
                            | ServerErrorKind::ClusterDown
                    )
                ) {
                    st.node = None;
                    drop(st);
                    self.refresh.store(true, Ordering::SeqCst);
                    table.unrouted.push(ch);
                } else {
                    let target = if self.route.sharded() { SHARDS } else { TARGET };
                    let verb = String::from_utf8_lossy(self.route.command(false));
                    log::warn!(target: target, "{verb} {} refused: {e}; its waiters re-check", ch.name);
                    st.refused = true;
                    st.wake_leader();
                }
                return;
            }
            _ => return,
        };
        let kind = self
            .route
            .reply_kind(items.first().and_then(bytes).unwrap_or_default());
        let channel = items.get(1).and_then(bytes).unwrap_or_default();
        let name = String::from_utf8_lossy(channel).into_owned();
        if kind == b"message" {
            let Some(ch) = table.channels.get(&name).cloned() else {
                return;
            };
            drop(table);
            ch.deliver(items.get(2).and_then(bytes).map(<[u8]>::to_vec));
        } else if kind == b"subscribe" {
            let Some(ch) = link.pending.pop_front() else {
                return;
            };
            drop(table);
            ch.confirm(channel);
        } else if kind == b"unsubscribe" {
            if let Some(i) = link.unsubs.iter().position(|n| *n == name) {
                link.unsubs.swap_remove(i);
                return;
            }
            // Pushed by the server: the channel's slot left this master.
            let Some(ch) = table.channels.get(&name).cloned() else {
                return;
            };
            let mut st = ch.state.lock();
            if st.node.as_deref() != Some(node) {
                return;
            }
            log::info!(
                target: SHARDS,
                "{node} dropped the subscription to {name} (its slot moved); resubscribing"
            );
            st.unsubscribed();
            drop(st);
            table.unrouted.push(ch);
            self.refresh.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::Duration;

    use parking_lot::Mutex;

    use super::*;
    use crate::subscriber::route::{OneServer, Route};
    use crate::subscriber::{Channel, ChannelState, Link, Subscriber};
    use crate::transport::conn::{Timeouts, parse_url};

    /// The reply as the server sends it.
    fn reply(wire: &[u8]) -> Value {
        redis::Parser::new().parse_value(&mut &wire[..]).unwrap()
    }

    /// Valkey 8.0.0's `NOSUB` error, its answer to an `UNSUBSCRIBE` on a connection without
    /// subscriptions, leaves the `SUBSCRIBE` written after it pending; a refusal (`NOPERM`)
    /// still marks the channel refused; Redis's reply to the same `UNSUBSCRIBE` changes nothing.
    #[test]
    fn a_nosub_error_is_not_taken_for_a_refused_subscribe() {
        let info = parse_url("redis://127.0.0.1:1/").unwrap();
        let one = OneServer {
            current: Mutex::new((0, "127.0.0.1:1".into(), info.clone())),
            infos: vec![info],
            resolver: None,
        };
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            command: Duration::from_secs(1),
        };
        let route = Route::One(Box::new(one));
        let sub = Subscriber::new(route, timeouts, None, Arc::default()).unwrap();
        let (writer, _peer) = UnixStream::pair().unwrap();
        let node = "127.0.0.1:1";
        let ch = Arc::new(Channel {
            name: "locksmith:{a}:released".into(),
            state: Mutex::new(ChannelState::default()),
        });
        let mut link = Link::new(Stream::Unix(writer));
        link.pending.push_back(Arc::clone(&ch));
        sub.table.lock().links.insert(node.into(), link);
        let pending = || sub.table.lock().links[node].pending.len();

        sub.dispatch(
            node,
            reply(b"-NOSUB 'unsubscribe' command executed not in subscribed mode\r\n"),
        );
        sub.dispatch(
            node,
            reply(b"*3\r\n$11\r\nunsubscribe\r\n$17\r\nlocksmith:{b}:rel\r\n:0\r\n"),
        );
        assert!(!ch.state.lock().refused);
        assert_eq!(pending(), 1);

        sub.dispatch(
            node,
            reply(b"-NOPERM this user has no permissions to access one of the channels\r\n"),
        );
        assert!(ch.state.lock().refused);
        assert_eq!(pending(), 0);
    }

    /// Gives its chunks one per read, with a "would block" between them.
    struct Chunks(std::collections::VecDeque<Option<&'static [u8]>>);

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

    /// A read that ends inside a reply loses nothing: the parser resumes it on the next
    /// read, and the reply after it is read whole.
    #[test]
    fn a_reply_split_between_reads_is_resumed() {
        let mut r = Chunks(std::collections::VecDeque::from([
            Some(&b"*3\r\n$7\r\nmessage\r\n$2"[..]),
            None,
            Some(&b"\r\nch\r\n$8\r\nreleased\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nx\r\n:1\r\n"[..]),
        ]));
        let mut p = redis::Parser::new();
        let e = p.parse_value(&mut r).unwrap_err();
        assert!(e.is_timeout(), "{e:?}");
        let Value::Array(items) = p.parse_value(&mut r).unwrap() else {
            panic!()
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
