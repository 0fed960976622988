//! The topologies: which masters a client locks on, and how a call reaches them.
//!
//! - [`backend`]: what a lock needs of its masters, behind one [`Backend`](backend::Backend):
//!   a call sent to one master or to all, each master's reply, the quorum, and the renewal of
//!   a batch of leases (`backend/renew.rs`), each written once for every topology. Its
//!   topologies differ only in whom a call goes to: one master or a quorum of independent
//!   masters (RedLock), every call on all of them at once, or a cluster (below).
//! - [`send`]: a master ([`Node`](send::Node): its pool, and whether it failed a moment ago),
//!   and sending, the same for every topology: one round of packed commands written to each
//!   master's pooled connection and then read, within one bound, the scripts reloaded on
//!   `NOSCRIPT`, the start-up check; the scripts as plain masters or a cluster run them.
//! - [`quorum`]: the quorum's arithmetic, pure functions over the masters' replies.
//! - [`sentinel`]: the master a Redis Sentinel deployment names, found and followed through
//!   failovers (a resolver that the transport's connections ask for the address).
//! - [`cluster`]: a Redis Cluster: the slot map, a `Node` per master, redirections followed
//!   within each call's bound; it also tells the pub/sub thread which master owns a sharded
//!   channel (through the pub/sub layer's [`ShardMap`](crate::subscriber::ShardMap)).
//!
//! This layer builds on the transport and the protocol, and on nothing above them. The user's
//! description of the quorum algorithm is on [`Client::redlock`](crate::Client::redlock).

pub(crate) mod backend;
pub(crate) mod cluster;
pub(crate) mod quorum;
pub(crate) mod send;
pub(crate) mod sentinel;
