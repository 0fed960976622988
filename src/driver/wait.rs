//! How every lock type's acquire waits: the retry loop (one bounded attempt after another,
//! with backoff while Redis cannot be reached, within the call's deadline and the client's
//! retry timeout), how long a waiter sleeps without news, and a leader's sleep with its next
//! acquire primed for the pub/sub thread to write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::time::Budget;
use crate::error::{Error, Result};
use crate::shared::{Core, Shared};
use crate::subscriber::{OnRelease, Registration};
use crate::topology::backend::{Backend, Primed};
use crate::transport::conn::Deadline;

/// A primed call the subscriber thread wrote when the release came: the call, when it was
/// written, and whether the write went through.
pub(crate) struct Fired {
    pub(crate) primed: Primed,
    pub(crate) sent: Instant,
    pub(crate) wrote: Result<()>,
}

impl Fired {
    /// The reply of the call that was written, read within `by`. A failed write is a failure
    /// of the connection: the caller retries the same request on the plain path (a request
    /// id makes the retry of a call that ran answer as that call did).
    pub(crate) fn reply(self, backend: &Backend, by: Deadline) -> Result<redis::Value> {
        backend.finish_script(self.primed, self.wrote, by)
    }
}

/// Sleeps until a release after epoch `seen`, a passed lock or `until`, as
/// [`Registration::wait_release`], with `primed` (the leader's next acquire) left for the
/// subscriber thread to write the moment the release message arrives, before it wakes this
/// thread: the acquire does not wait for that thread hop (the wake and the round trip
/// overlap). Returns the call if it was written (it belongs to the epoch after `seen`; the
/// caller reads its reply); `None` when it was not (its connection is given back).
pub(crate) fn wait_release_firing(
    shared: &Shared,
    reg: &Registration,
    primed: Primed,
    seen: u64,
    until: Deadline,
) -> Option<Fired> {
    // The leader's primed call, shared with the shot the subscriber thread fires: ready to
    // write (`Err`), written when the release came (`Ok`), or taken (`None`).
    let slot = Arc::new(parking_lot::Mutex::new(Some(Err(primed))));
    let on_release = {
        let slot = Arc::clone(&slot);
        OnRelease(Box::new(move || {
            let mut s = slot.lock();
            if let Some(Err(mut primed)) = s.take() {
                let sent = Instant::now();
                let wrote = primed.fire();
                *s = Some(Ok(Fired {
                    primed,
                    sent,
                    wrote,
                }));
            }
        }))
    };
    // Not armed (a release or a passed lock came first): the wait returns at once.
    let armed = reg.arm(seen, on_release).is_ok();
    reg.wait_release(seen, until);
    if armed {
        // Takes the shot back, or waits for a firing in progress to end (one write).
        drop(reg.disarm());
    }
    let primer = slot.lock().take();
    match primer? {
        Ok(fired) => Some(fired),
        Err(p) => {
            shared.backend.unprime(p);
            None
        }
    }
}

/// Runs `attempt` (one bounded attempt: it gets the bound of its I/O) once when the budget's
/// deadline has passed, else until it gets an answer, retrying connection-level failures with backoff until the budget's deadline or for
/// the client's retry timeout, counted from the start of the first attempt that failed; no
/// attempt's I/O runs past that, nor past the budget's limit. The waiting driver runs every
/// attempt through it, so all lock types keep the same bounds.
pub(crate) fn retrying<T>(
    client: &Core,
    name: &str,
    budget: &Budget,
    mut attempt: impl FnMut(Deadline) -> Result<T>,
) -> Result<T> {
    let Budget { deadline, limit } = *budget;
    // A waiter of a client shut down meanwhile stops here (its wait was woken).
    client.shared().ensure_open()?;
    if deadline.passed() {
        // Exactly one attempt: a `try_*` form, or a deadline that passed while waiting.
        return attempt(limit);
    }
    let mut backoff = Duration::from_millis(10);
    let mut retry_until: Option<Deadline> = None;
    // The failed tries in a row, and when the first of them started: a call that gives up
    // says how long and how often it tried.
    let mut failed: Option<(u32, Instant)> = None;
    loop {
        let started = Instant::now();
        let by = retry_until.map_or(limit, |r| limit.min(r));
        match attempt(by) {
            Err(e) if e.is_retriable() => {
                let (tries, first) = failed.get_or_insert((0, started));
                *tries += 1;
                let give_up = |e: Error| e.after_tries(*tries, first.elapsed());
                let retry_until = *retry_until.get_or_insert_with(|| {
                    started
                        .checked_add(client.shared().config.retry_timeout)
                        .map_or(Deadline::NONE, Deadline::at)
                });
                let stop = deadline.min(retry_until);
                // Sleep the backoff, or what is left of the bound, then try once more.
                let left = stop.left().unwrap_or(backoff);
                if left.is_zero() {
                    return Err(give_up(e));
                }
                log::debug!("Redis unavailable for `{name}` ({e}); retrying");
                std::thread::sleep(backoff.min(left));
                if stop.passed() {
                    return Err(give_up(e));
                }
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// How often a leader re-checks while the pub/sub connection is down or unconfirmed.
pub(crate) const RECHECK: Duration = Duration::from_millis(100);
