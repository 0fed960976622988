//! A client's shutdown, as the renewal thread carries it out: every hold it still renews, and
//! those the shutdown found besides (fixed leases), ended here and released on the server
//! within the shutdown's bound, each by its lock type's release script for the whole hold
//! (its outermost level, whatever the re-entry count). Best effort: a release that fails or
//! runs out of time leaves the lock to its lease, which is no longer renewed.

use std::sync::Arc;

use crate::kind::Kind;
use crate::protocol::scripts::Level;
use crate::protocol::{fair_mutex, mutex, rw_lock, semaphore};
use crate::shared::grant::request_id;
use crate::shared::hold::Hold;
use crate::topology::backend::Backend;
use crate::transport::conn::Deadline;

use super::LOG_TARGET;

/// What a shutdown asks of the renewal thread: the holds it found besides the renewed ones,
/// and the bound of their releases.
#[derive(Debug)]
pub(crate) struct Closing {
    pub(crate) holds: Vec<Arc<Hold>>,
    pub(crate) by: Deadline,
}

/// Ends every hold of `holds` (duplicates and holds released already are skipped) and
/// releases on the server those whose lease was known valid, one call after another within
/// `by`. Returns how many were released there.
pub(crate) fn release_all(backend: &Backend, mut holds: Vec<Arc<Hold>>, by: Deadline) -> usize {
    holds.sort_by_key(|h| Arc::as_ptr(h) as usize);
    holds.dedup_by(|a, b| Arc::ptr_eq(a, b));
    let mut released = 0;
    for hold in holds {
        // Closed first, whatever comes of the release: its guards read it as not held.
        if !hold.close() {
            continue;
        }
        // Each by its lock type's release script, for its outermost level, publishing the
        // release; none for a waiter's place in a fair queue, which its waiter leaves itself.
        let (keys, holder) = (&hold.keys, hold.holder());
        let call = match hold.kind {
            Kind::Mutex | Kind::MultiMutex | Kind::Election => {
                let request = request_id();
                let release = mutex::Release {
                    acquisition: &hold.acquisition,
                    level: Level::Outermost,
                    request: &request,
                    publish: mutex::Publish::Always,
                    fence: backend.fence_of(hold.token),
                };
                mutex::release(keys, &release, false)
            }
            Kind::FairMutex => fair_mutex::release(keys, holder, Level::Outermost, &request_id()),
            Kind::Read | Kind::Write => {
                rw_lock::release(keys, holder, hold.kind == Kind::Read, true)
            }
            Kind::Permits => semaphore::release(keys, holder),
            Kind::FairPlace => continue,
        };
        let name = &hold.keys.name;
        let replies = backend.call_on(&call, &backend.all(), by, false);
        match replies.iter().find_map(|(_, r)| r.as_ref().err()) {
            None => released += 1,
            Some(e) => {
                log::debug!(target: LOG_TARGET, "releasing `{name}` at shutdown failed: {e}");
            }
        }
    }
    released
}
