//! A client's settings: what every lock of the client reads ([`Config`]), the bound of local
//! hand-offs ([`HandoffBound`]), and the limits the builder checks them against.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::conn::{Deadline, Timeouts};

/// The shortest lease accepted.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(30);
/// The longest lease accepted.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Settings shared by every lock of a client.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The lease of the client's own acquisitions (see `Core::terms` in `shared/mod.rs`).
    pub(crate) lease: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) prefix: String,
    /// The client's label, encoded for owner ids (see `shared/holder.rs`).
    pub(crate) label: String,
    pub(crate) timeouts: Timeouts,
    pub(crate) retry_timeout: Duration,
    /// Replicas that must confirm each acquire (and renewal), and how long to wait for them.
    pub(crate) wait_replicas: Option<(usize, Duration)>,
    /// The bound of local hand-offs; `None`: every release goes through Redis (the option is
    /// off, or a quorum client).
    pub(crate) handoff: Option<HandoffBound>,
}

/// The most local hand-offs in a row that [`ClientBuilder::local_handoff_max_count`] accepts:
/// each acquisition through Redis reserves that many fencing tokens.
///
/// [`ClientBuilder::local_handoff_max_count`]: crate::ClientBuilder::local_handoff_max_count
pub(crate) const MAX_HANDOFF_COUNT: u32 = crate::protocol::scripts::MAX_BLOCK;

/// How far a run of local hand-offs may go before a release goes through Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandoffBound {
    /// Local hand-offs in a row after an acquisition through Redis.
    pub(crate) max_count: u32,
    /// Time since the send of the acquisition through Redis after which no hand-off starts.
    pub(crate) max_time: Duration,
    /// How long the local leader lets others go first after a release through Redis that
    /// others heard (zero: it competes at once).
    pub(crate) give_way: Duration,
}

impl Config {
    /// The bound of one call that may have to open a connection first: the connect timeout
    /// plus the command timeout (plus the replicas' timeout with
    /// [`wait_replicas`](crate::ClientBuilder::wait_replicas)).
    pub(crate) fn one_call(&self) -> Duration {
        self.timeouts
            .connect
            .saturating_add(self.timeouts.command)
            .saturating_add(self.wait_replicas.map_or(Duration::ZERO, |(_, t)| t))
    }

    /// How long a waiter waits for its subscription's confirmation before an attempt whose
    /// failure leads to sleeping: one command timeout (at most an hour) from now, never past
    /// `deadline`.
    pub(crate) fn confirm_by(&self, deadline: Deadline) -> Deadline {
        deadline.min(Deadline::after(
            self.timeouts.command.min(Duration::from_secs(3600)),
        ))
    }
}

/// Checks a handle's fixed lease (`with_lease`): from 30 ms to 365 days.
pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE {
        return Err(Error::config(
            "lease",
            format!("must be at least {MIN_LEASE:?}"),
        ));
    }
    if lease > MAX_LEASE {
        return Err(Error::config("lease", "must be at most 365 days"));
    }
    Ok(())
}

/// Checks a maximum hold time.
pub(crate) fn validate_max_hold(max: Duration) -> Result<()> {
    if max < MIN_LEASE {
        return Err(Error::config(
            "max_hold",
            format!("must be at least {MIN_LEASE:?}"),
        ));
    }
    Ok(())
}
