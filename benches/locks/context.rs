//! What every workload is given: the plan (how much to run), the floors measured first, the
//! rows and notes written so far ([`Ctx`]), and the bounds every workload keeps.

use std::time::Duration;

use crate::report::{self, Row};
use crate::support::Rng;

/// The naive lock's lease (locksmith's default lease, for a like-for-like comparison).
pub(crate) const NAIVE_LEASE: Duration = Duration::from_secs(30);
/// Threads per process in the multi-process workloads.
pub(crate) const THREADS: usize = 8;
/// A bound on any single step that talks to a child.
pub(crate) const STEP: Duration = Duration::from_secs(20);

/// How much of everything to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) floor_samples: usize,
    pub(crate) uncontended: Duration,
    pub(crate) clock_samples: usize,
    pub(crate) handoff_ls: usize,
    pub(crate) handoff_naive: usize,
    pub(crate) pubsub_samples: usize,
    pub(crate) unpark_samples: usize,
    pub(crate) contended: Duration,
    pub(crate) many: Duration,
    pub(crate) idle_hold: Duration,
    pub(crate) idle_short_lease: bool,
    pub(crate) renew_locks: usize,
    pub(crate) renew_window: Duration,
    pub(crate) redlock_handoff: usize,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                floor_samples: 2000,
                uncontended: Duration::from_millis(1500),
                clock_samples: 200,
                handoff_ls: 100,
                handoff_naive: 30,
                pubsub_samples: 100,
                unpark_samples: 200,
                contended: Duration::from_millis(2500),
                many: Duration::from_secs(1),
                idle_hold: Duration::from_secs(5),
                idle_short_lease: false,
                renew_locks: 2000,
                renew_window: Duration::from_secs(4),
                redlock_handoff: 80,
            }
        } else {
            Plan {
                floor_samples: 5000,
                uncontended: Duration::from_secs(5),
                clock_samples: 1000,
                handoff_ls: 500,
                handoff_naive: 500,
                pubsub_samples: 500,
                unpark_samples: 500,
                contended: Duration::from_secs(10),
                many: Duration::from_secs(3),
                idle_hold: Duration::from_secs(5),
                idle_short_lease: true,
                renew_locks: 10_000,
                renew_window: Duration::from_secs(10),
                redlock_handoff: 300,
            }
        }
    }
}

/// The floors, measured first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floors {
    pub(crate) ping_p50: f64,
    pub(crate) evalsha_p50: f64,
    /// PING after 3 ms of idleness.
    pub(crate) idle_ping_p50: f64,
    /// Redis's execution time of EVALSHA `return 1` (mean, commandstats).
    pub(crate) evalsha_exec_us: f64,
}

pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) plan: Plan,
    pub(crate) floors: Floors,
    pub(crate) rows: Vec<Row>,
    pub(crate) notes: Vec<String>,
    /// Sorted handoff samples (µs): locksmith, naive.
    pub(crate) handoff: Option<(Vec<f64>, Vec<f64>)>,
    /// Sorted RedLock handoff samples (µs).
    pub(crate) redlock_handoff: Option<Vec<f64>>,
    /// redis-servers on CPU 1, the bench on CPU 0.
    pub(crate) pinned: bool,
    pub(crate) rng: Rng,
}

impl Ctx {
    pub(crate) fn row(&mut self, r: Row) {
        println!(
            "  {:<12} {:<52} {}",
            r.workload,
            r.figure,
            report::fmt_value(r.value, r.unit)
        );
        self.rows.push(r);
    }
}
