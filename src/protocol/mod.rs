//! The lock protocol: what a lock is on the server and in this process, independent of where
//! the server is.
//!
//! - [`scripts`]: the script table (each script's name, file, source and SHA1, from one list)
//!   and what every lock type's calls share: [`scripts::Call`], the holder and level of a
//!   release, and the replies an acquire, a release and a renewal come to.
//! - One module per lock type, beside its Lua (`scripts/*.lua`): its calls and the parsing of
//!   their replies: [`mutex`], [`multi`] (a set of Mutex locks at once), [`election`],
//!   [`fair_mutex`], [`rw_lock`] and [`semaphore`].
//! - [`keys`]: lock names and the Redis keys derived from them.
//! - [`lock_value`]: the holders' values on the server, parsed (a `Mutex`'s, and the other
//!   types' as an operator's calls return them).
//! - [`library`]: the Mutex acquire and release scripts as a function library (`FCALL`).
//! - [`lua`]: each script's source: a header generated from the Rust constants, the shared
//!   helpers it uses (`scripts/prelude/*.lua`), and its body.
//!
//! The topologies above run these calls on their masters; nothing here opens a connection or
//! keeps state: the calls and the Lua import only [`crate::error`] (and the transport's fault
//! type, for a reply of the wrong shape). The runtime record of holds is in `shared/`.
//!
//! The script checker (`tests/checker/`) runs these scripts, exactly as sent, in an embedded
//! Lua over a model of Redis. It is a unit test of this module (it calls the builders and
//! parsers here, which are private to the crate), kept beside the other tests.

#[cfg(test)]
#[path = "../../tests/checker/mod.rs"]
mod checker;
pub(crate) mod election;
pub(crate) mod fair_mutex;
pub(crate) mod keys;
pub(crate) mod library;
pub(crate) mod lock_value;
pub(crate) mod lua;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod rw_lock;
pub(crate) mod scripts;
pub(crate) mod semaphore;
