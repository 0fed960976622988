//! [`Primed`]: a script call packed on a connection, for a thread that does not wait for its
//! reply to write it, and the client's [`MAX_PRIMED`] places for such calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redis::Value;

use super::Backend;
use crate::error::{Error, Result};
use crate::protocol::scripts::Call;
use crate::topology::send::{Part, one};
use crate::transport::conn::{Conn, Deadline};
use crate::transport::fault::Fault;

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
    con: Conn,
    packed: Vec<u8>,
    _slot: PrimedSlot,
}

/// One of a client's [`MAX_PRIMED`] places for a primed call, given back when dropped.
struct PrimedSlot(Arc<AtomicUsize>);

impl PrimedSlot {
    fn take(count: &Arc<AtomicUsize>) -> Option<PrimedSlot> {
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
    /// Writes the call. Bounded by the command timeout (set when primed); a write on an idle
    /// connection only fills the socket's buffer.
    pub(crate) fn fire(&mut self) -> Result<()> {
        self.con.send_now(&self.packed).map_err(Error::from)
    }
}

impl Backend {
    /// Any script call ready for another thread to write the moment a lock is released (see
    /// [`Primed`]): on a single plain master only (not a quorum, a cluster, a client that
    /// waits for replicas), when an idle pooled connection is at hand and fewer than
    /// [`MAX_PRIMED`] are primed; its timeouts set to the command timeout. `None` otherwise:
    /// the plain path is taken.
    pub(crate) fn prime_script(&self, call: &Call) -> Option<Primed> {
        let node = self
            .first()
            .filter(|_| self.single() && self.wait.is_none())?;
        let slot = PrimedSlot::take(&self.primed)?;
        let mut con = node.pool.idle()?;
        if let Err(e) = con.set_timeouts(self.command_timeout) {
            log::debug!("priming a script call: {e}");
            return None;
        }
        Some(Primed {
            con,
            packed: self.pack(call),
            _slot: slot,
        })
    }

    /// Gives back the connection of a call that was primed and never written.
    pub(crate) fn unprime(&self, p: Primed) {
        if let Some(node) = self.first() {
            node.pool.put(p.con);
        }
    }

    /// The reply of a primed script call that was written (`wrote`), within `by`. A failed
    /// write (the public error of [`Primed::fire`], an I/O error or a socket's timeout) is a
    /// failure of the connection, as any other: the caller retries the same request on the
    /// plain path (a request id makes the retry of a call that ran answer as that call did).
    pub(crate) fn finish_script(
        &self,
        p: Primed,
        wrote: Result<()>,
        by: Deadline,
    ) -> Result<Value> {
        // Only a single independent master primes a call.
        let node = self.first().ok_or(Error::timeout("no reply"))?;
        let round = self.round(Some(self.call_timeout), by, false);
        let part = Part::new(0, node, &p.packed, 1);
        if let Err(e) = wrote {
            let e = Fault::Other(e);
            round.failed(&part, &e);
            return Err(e.into());
        }
        Ok(round
            .collect(&part, p.con, round.within())
            .and_then(|mut v| one(v.pop()))?)
    }
}
