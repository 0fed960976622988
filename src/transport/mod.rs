//! The transport layer: sockets to one Redis server, used by every topology.
//!
//! - [`conn`]: URL checks, the [`Deadline`](conn::Deadline) every blocking step keeps, the
//!   connect and command [`Timeouts`](conn::Timeouts), the bounds of a command connection's
//!   writes and reads, the `ROLE` check of a resolved master and the pool of command
//!   connections.
//! - [`link`]: the TCP, TLS or Unix [`Stream`](link::Stream) of every connection, TCP
//!   keepalive, the command connection [`Conn`](link::Conn) (a stream and its reply parser),
//!   and its opening within the connect timeout (the host name looked up, then `AUTH` and
//!   `SELECT` pipelined).
//! - [`fault`]: the [`Fault`](fault::Fault) these layers decide on (a bound that ran out, a
//!   failed connection, an answer that is not RESP, a reply of the wrong shape), and its
//!   conversion to the public [`Error`](crate::Error).
//! - [`dns`]: host-name lookups within a call's bound (an IP address needs none).
//! - [`tls`]: the certificates a client trusts and presents, the TLS streams of command and
//!   pub/sub connections, and errors that say which TLS check failed (the feature `tls`;
//!   without it, the same names over types that have no value).
//! - [`pubsub`]: the read half of a pub/sub connection (read by one thread, written by
//!   others), its bounded handshake (non-blocking steps of a poll loop, [`pubsub::opening`], also
//!   driven to their end where blocking is wanted), and a TLS probe.
//! - [`diagnose`]: what a failed first command means, where TLS is the likely cause (the
//!   probe tells a plain-text port from a stalled server).
//!
//! They import one way: `fault.rs`, then `dns.rs`, then `tls/`, then `link.rs`, then
//! `conn.rs`, then `pubsub.rs`, then `diagnose.rs`.
//!
//! Nothing here knows about locks: this layer imports only [`crate::error`].

pub(crate) mod conn;
pub(crate) mod diagnose;
pub(crate) mod dns;
pub(crate) mod fault;
pub(crate) mod link;
pub(crate) mod pubsub;
pub(crate) mod tls;
