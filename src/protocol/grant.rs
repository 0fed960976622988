//! What one acquisition is made of: the request id that tells a retry from a new call, the
//! lease terms asked for, the grant the server answered, and what the client made of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::protocol::hold::Hold;

/// A request id, unique within this process: it tells a retry apart from a new call.
pub(crate) fn request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The lease terms of one acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) lease: Duration,
    /// Renewed by the renewal thread (false: a fixed lease).
    pub(crate) watchdog: bool,
    /// Renewal stops this long after the acquisition.
    pub(crate) max_hold: Option<Duration>,
}

/// What a successful acquire script returned, and when it was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant<'a> {
    pub(crate) token: u64,
    pub(crate) count: u64,
    pub(crate) sent: Instant,
    /// The acquisition the server says this grant belongs to (the lock's `gen`).
    pub(crate) acquisition: &'a str,
    /// The last fencing token reserved for local hand-offs of a new acquisition (`token`:
    /// none).
    pub(crate) last: u64,
}

/// What the client made of a grant (see `Shared::adopt` in `client.rs`).
#[derive(Debug)]
pub(crate) enum Adopted {
    /// The caller holds the lock through this hold (a new one, or its live hold re-entered).
    Held(Arc<Hold>),
    /// The server answered for an acquisition that this thread's guards already count as
    /// lost (its local deadline passed while the call was on its way): no guard may be
    /// handed out for it. The caller frees it and tries again.
    Stale,
}
