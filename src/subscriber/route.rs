//! Where each channel's server is ([`Route`]), and the commands that subscribe there: a
//! Cluster's slot map ([`ShardMap`], sharded pub/sub), or one server for every channel
//! ([`OneServer`]: the one master, the master a Sentinel names, or one master of a quorum).
//!
//! Apart from the thread's loop because it is what differs between the topologies; the loop
//! is the same for both (see `pubsub_thread.rs`).

use std::sync::Arc;

use parking_lot::Mutex;
use redis::ConnectionInfo;

use super::TARGET;
use crate::error::Result;
use crate::transport::conn::{Deadline, Resolve, server_name};

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

/// Where the thread finds each channel's server.
#[derive(Debug)]
pub(super) enum Route {
    /// A cluster: the master of the channel's slot, with sharded pub/sub.
    Slots(Arc<dyn ShardMap>),
    /// One server for every channel, with plain pub/sub.
    One(Box<OneServer>),
}

/// The one server a client listens on: the master (a quorum's listens on any one of its
/// masters, as every release publishes on every master it reaches), or where a resolver
/// (Sentinel) says the master is.
#[derive(Debug)]
pub(super) struct OneServer {
    pub(super) infos: Vec<ConnectionInfo>,
    /// Where the master is now, asked afresh after every failure (a master that moves);
    /// `infos` is then not used after the first connection.
    pub(super) resolver: Option<Arc<dyn Resolve>>,
    /// The server listened on (or tried next): its index in `infos`, `host:port`, address.
    pub(super) current: Mutex<(usize, String, ConnectionInfo)>,
}

impl Route {
    /// The server of `channel`: its `host:port` and how to reach it.
    pub(super) fn owner_of(&self, channel: &str) -> Option<(String, ConnectionInfo)> {
        match self {
            Route::Slots(map) => map.owner_of(channel),
            Route::One(one) => {
                let c = one.current.lock();
                Some((c.1.clone(), c.2.clone()))
            }
        }
    }

    pub(super) fn sharded(&self) -> bool {
        matches!(self, Route::Slots(_))
    }

    /// The command that subscribes a channel here (`un`: unsubscribes it): the sharded one
    /// on a cluster.
    pub(super) fn command(&self, un: bool) -> &'static [u8] {
        match (self.sharded(), un) {
            (false, false) => b"SUBSCRIBE",
            (false, true) => b"UNSUBSCRIBE",
            (true, false) => b"SSUBSCRIBE",
            (true, true) => b"SUNSUBSCRIBE",
        }
    }

    /// The kind of a reply read here (`message`, `subscribe`, `unsubscribe`): a cluster's
    /// sharded kinds (`smessage`...) without their `s`, and nothing else.
    pub(super) fn reply_kind<'a>(&self, kind: &'a [u8]) -> &'a [u8] {
        match self.sharded() {
            true => kind.strip_prefix(b"s").unwrap_or_default(),
            false => kind,
        }
    }

    /// A number that changes when channels may have a new server (the thread then moves
    /// them). One server never changes it: a move ends its connection instead.
    pub(super) fn epoch(&self) -> u64 {
        match self {
            Route::Slots(map) => map.epoch(),
            Route::One(_) => 0,
        }
    }

    /// Asks again where the servers are, within `short` (a connection failed or was lost:
    /// `failed`; it is time for the periodic check: `due`; channels are subscribed: `busy`).
    /// A cluster reads its map after a failure, and periodically while busy; a Sentinel is
    /// asked where the master is after a failure (within `connect`), and periodically always
    /// (a move makes this thread reconnect, and the command connections drop their pooled
    /// ones). True when it asked (the period starts again).
    pub(super) fn refresh(
        &self,
        failed: bool,
        due: bool,
        busy: bool,
        short: Deadline,
        connect: Deadline,
    ) -> bool {
        match self {
            Route::Slots(map) if failed || (due && busy) => {
                if let Err(e) = map.refresh(short, false) {
                    log::debug!(target: TARGET, "slot map not read: {e}");
                }
                true
            }
            Route::One(one) => match &one.resolver {
                Some(r) if failed => {
                    match r.resolve(connect, true) {
                        Ok(info) => *one.current.lock() = (0, server_name(&info), info),
                        Err(e) => log::debug!(target: TARGET, "the master not found: {e}"),
                    }
                    true
                }
                Some(r) if due => {
                    r.check(short);
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// The connection to `node` could not be opened: one server of a quorum moves on to the
    /// next master (the others are asked again where the master is, in [`refresh`]).
    ///
    /// [`refresh`]: Route::refresh
    pub(super) fn open_failed(&self, node: &str) {
        if let Route::One(one) = self
            && one.resolver.is_none()
        {
            let mut c = one.current.lock();
            let next = (c.0 + 1) % one.infos.len().max(1);
            if let Some(info) = one.infos.get(next).filter(|_| c.1 == node) {
                *c = (next, server_name(info), info.clone());
            }
        }
    }

    /// Learns a slot's new master from the details of a `MOVED` error.
    pub(super) fn learn_moved(&self, details: Option<&str>) {
        if let Route::Slots(map) = self {
            map.learn_moved(details);
        }
    }
}
