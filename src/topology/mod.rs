//! The topologies: which masters a client locks on, and how a call reaches them.
//!
//! - [`backend`]: one master, or a quorum of independent masters (RedLock), behind one
//!   [`Backend`](backend::Backend) that runs the protocol's script calls on every master at
//!   once and counts the replies.
//! - [`sentinel`]: the master a Redis Sentinel deployment names, found and followed through
//!   failovers (a resolver that the transport's connections ask for the address).
//! - [`cluster`]: a Redis Cluster: the slot map, a pool per master, redirections followed
//!   within each call's bound; it also tells the pub/sub thread which master owns a sharded
//!   channel (through the pub/sub layer's [`ShardMap`](crate::subscriber::ShardMap)).
//!
//! This layer builds on the transport and the protocol, and on nothing above them. The user's
//! description of the quorum algorithm is on [`Client::redlock`](crate::Client::redlock).

pub(crate) mod backend;
pub(crate) mod cluster;
pub(crate) mod sentinel;
