//! What the commands show, as plain data: the library's `LockInfo` and `Holder` copied into
//! types that the formatting and the prompt work on (and that tests build by hand).

use std::time::Duration;

use crate::args::Kind;

/// One holder of a lock (the library's `Holder`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderView {
    /// The holding client's label (`ClientBuilder::label`).
    pub label: String,
    /// The holding thread's name, or its number when it has none.
    pub thread: String,
    /// The re-entry depth; for a semaphore, the permits this holder holds.
    pub hold_count: u32,
    /// The fencing token (0 where the type has none).
    pub fencing_token: u64,
    /// How long it has been held, by the server's clock.
    pub held_for: Duration,
    /// How long its lease has left, by the server's clock.
    pub lease_left: Duration,
}

/// One lock type under one name (the library's `LockInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    /// The lock's name.
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// The writer, the readers, the permit holders, or the one holder (an election's leader;
    /// empty when only waiters are left).
    pub holders: Vec<HolderView>,
    /// Whether readers hold an `RwLock`.
    pub shared: bool,
    /// How many wait (`None` where the type keeps no count).
    pub waiters: Option<usize>,
    /// What an election's leader proclaimed (`None` when it proclaimed nothing, and for the
    /// other types).
    pub value: Option<String>,
}

impl LockView {
    /// The order of every listing: by name, then by type.
    pub fn sort(locks: &mut [LockView]) {
        locks.sort_by(|a, b| a.name.cmp(&b.name).then(a.kind.cmp(&b.kind)));
    }

    /// The first holder, if any.
    pub fn first(&self) -> Option<&HolderView> {
        self.holders.first()
    }
}
