//! What every workload is given: the plan (how much to run), the floors measured first, the
//! rows and notes written so far ([`Ctx`]), and the bounds every workload keeps.

use std::time::Duration;

use crate::report::{self, Row};
use crate::support::Rng;

/// The naive lock's lease (locksmith's default lease, for a like-for-like comparison).
pub const NAIVE_LEASE: Duration = Duration::from_secs(30);
/// Threads per process in the multi-process workloads.
pub const THREADS: usize = 8;
/// A bound on any single step that talks to a child.
pub const STEP: Duration = Duration::from_secs(20);

/// How much of everything to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub floor_samples: usize,
    pub uncontended: Duration,
    pub clock_samples: usize,
    pub handoff_ls: usize,
    pub handoff_naive: usize,
    pub pubsub_samples: usize,
    pub unpark_samples: usize,
    pub contended: Duration,
    pub many: Duration,
    pub idle_hold: Duration,
    pub idle_short_lease: bool,
    pub renew_locks: usize,
    pub renew_window: Duration,
    pub redlock_handoff: usize,
    /// Lock+unlock cycles per lock type and round of the `server-cost` workload.
    pub cost_cycles: usize,
    pub cost_rounds: usize,
    /// The `capacity` workload: each window's length, its child processes and their threads.
    pub capacity: Duration,
    pub capacity_procs: usize,
    pub capacity_threads: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
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
                cost_cycles: 500,
                cost_rounds: 2,
                capacity: Duration::from_millis(1500),
                capacity_procs: 3,
                capacity_threads: 8,
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
                cost_cycles: 1000,
                cost_rounds: 3,
                capacity: Duration::from_secs(5),
                capacity_procs: 4,
                capacity_threads: 16,
            }
        }
    }
}

/// The floors, measured first.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    pub ping_p50: f64,
    pub evalsha_p50: f64,
    /// PING after 3 ms of idleness.
    pub idle_ping_p50: f64,
    /// Redis's execution time of EVALSHA `return 1` (mean, commandstats).
    pub evalsha_exec_us: f64,
}

pub struct Ctx {
    pub url: String,
    pub plan: Plan,
    pub floors: Floors,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// Sorted handoff samples (µs): locksmith, naive.
    pub handoff: Option<(Vec<f64>, Vec<f64>)>,
    /// Sorted RedLock handoff samples (µs).
    pub redlock_handoff: Option<Vec<f64>>,
    /// redis-servers on CPU 1, the bench on CPU 0.
    pub pinned: bool,
    pub rng: Rng,
}

impl Ctx {
    pub fn row(&mut self, r: Row) {
        println!(
            "  {:<12} {:<52} {}",
            r.workload,
            r.figure,
            report::fmt_value(r.value, r.unit)
        );
        self.rows.push(r);
    }
}
