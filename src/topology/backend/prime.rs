//! [`Primed`]: a script call packed on a connection, for a thread that does not wait for its
//! reply to write it, and the client's [`MAX_PRIMED`] places for such calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::transport::conn::Conn;

/// The most calls one client keeps primed at once (see [`Backend::prime_script`](super::Backend::prime_script)):
/// each holds a pooled connection while its leader sleeps, so a client with many waiting
/// leaders (many names) keeps this many connections for them, and its other leaders wait
/// unprimed.
pub(crate) const MAX_PRIMED: usize = 8;

/// A script call packed on a connection, for a thread that does not wait for its reply to
/// write it: the pub/sub thread writes a leader's acquire the moment the release message
/// arrives, before it wakes the leader, so that the acquire does not wait for that thread hop
/// (see the waiting driver, `driver/mod.rs`). The leader reads the reply.
pub(crate) struct Primed {
    pub(super) con: Conn,
    pub(super) packed: Vec<u8>,
    _slot: PrimedSlot,
}

/// One of a client's [`MAX_PRIMED`] places for a primed call, given back when dropped.
pub(super) struct PrimedSlot(Arc<AtomicUsize>);

impl PrimedSlot {
    pub(super) fn take(count: &Arc<AtomicUsize>) -> Option<PrimedSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_PRIMED).then_some(n + 1)
            })
            .ok()
            .map(|_| PrimedSlot(Arc::clone(count)))
    }
}

impl Drop for PrimedSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Primed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primed").finish_non_exhaustive()
    }
}

impl Primed {
    pub(super) fn new(con: Conn, packed: Vec<u8>, slot: PrimedSlot) -> Self {
        Primed {
            con,
            packed,
            _slot: slot,
        }
    }

    /// Writes the call. Bounded by the command timeout (set when primed); a write on an idle
    /// connection only fills the socket's buffer.
    pub(crate) fn fire(&mut self) -> Result<()> {
        self.con.send_now(&self.packed).map_err(Error::from)
    }
}
