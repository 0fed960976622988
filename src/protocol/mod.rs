//! The lock protocol: what a lock is on the server and in this process, independent of where
//! the server is.
//!
//! - [`keys`]: lock names and the Redis keys derived from them.
//! - [`scripts`]: the Lua scripts (`scripts/*.lua`) behind acquire, release and renew, the
//!   calls that run them and their typed replies.
//! - [`family`]: the calls of the fair mutex's, read-write lock's and semaphore's scripts.
//! - [`grant`]: one acquisition's request id, lease terms, the server's grant, and what the
//!   client made of it.
//! - [`hold`]: the local record of one held lock (its lease deadline, renewal and state).
//! - [`library`]: the Mutex acquire and release scripts as a function library (`FCALL`).
//! - [`lua`]: each script's source: a header generated from the Rust constants, the shared
//!   helpers it uses (`scripts/prelude/*.lua`), and its body.
//! - [`lock_value`]: a `Mutex`'s lock value on the server, parsed.
//!
//! The topologies below run these calls on their masters; nothing here opens a connection,
//! and this layer imports only [`crate::error`].

#[cfg(test)]
mod checker;
pub(crate) mod family;
pub(crate) mod grant;
pub(crate) mod hold;
pub(crate) mod keys;
pub(crate) mod library;
pub(crate) mod lock_value;
pub(crate) mod lua;
pub(crate) mod scripts;
