//! One seed of the model against a Sentinel deployment (1 master, 2 replicas, 3 sentinels)
//! whose sentinels are frozen: the same processes, plans and checker as against one server
//! (`run.rs`), with `Client::sentinel` clients and a fault plan of its own.
//!
//! # The faults, and why the checker stays as it is
//!
//! - **A frozen sentinel** (`SIGSTOP`: the kernel still accepts its connections, it never
//!   answers), for a few hundred ms up to past the lease; now and then, while it is frozen,
//!   every client connection to the master is killed (`CLIENT KILL TYPE normal`, then
//!   `pubsub`), so that every client asks the sentinels where the master is, again, with
//!   one of them frozen (any of the three: the first listed, or the one a client asked
//!   last). Every call must keep its documented bound all the same: a frozen sentinel costs
//!   a call one per-sentinel bound at most, never its whole budget.
//! - **A stopped model process**, and **killed connections** without a frozen sentinel.
//!
//! - **A step of the master's wall clock** (with [`Settings::clock_steps`]), back by up to
//!   4 s or forward by up to 5 s, in the gaps between the other faults, through the harness's
//!   clock library (`testkit/src/clock_shift.rs`): tokens must rise across every step, and
//!   only a forward step excuses an overlap (it ends leases early), as on a single server.
//!
//! No failover: with asynchronous replication a failover may lose a lock (the crate's docs
//! say so), which the checker would report as an overlap nobody was told of; following a
//! failover with a frozen sentinel is tested in `tests/sentinel.rs`, and to a replica whose
//! clock differs by the cluster's clock mix (`model/cluster.rs`). The master never moves, so nothing but a
//! forward step of its clock excuses anything here.

use std::thread;
use std::time::Duration;

use crate::check::{Fault, FaultKind, History};
use crate::checker::{Rng, mono_ns};
use crate::common::{self, SentinelSet, TestChild};
use crate::plan::{self, Settings, sub_seed};
use crate::run::{Outcome, Procs, lock_keys};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A fault of the deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentinelFault {
    /// SIGSTOP sentinel `i` (in the order of the clients' list) for the duration; with
    /// `kill`, kill every client connection to the master half-way through.
    FreezeSentinel { i: usize, d: Duration, kill: bool },
    /// `SIGSTOP` one model process, `SIGCONT` it after the duration.
    StopProcess(usize, Duration),
    /// `CLIENT KILL TYPE normal` on the master.
    KillNormal,
    /// `CLIENT KILL TYPE pubsub` on the master.
    KillPubsub,
    /// Steps the master's wall clock by this many microseconds (negative: back), at once.
    StepClock(i64),
}

impl SentinelFault {
    fn estimate(&self) -> Duration {
        match self {
            SentinelFault::FreezeSentinel { d, .. } | SentinelFault::StopProcess(_, d) => *d,
            SentinelFault::KillNormal | SentinelFault::KillPubsub | SentinelFault::StepClock(_) => {
                Duration::ZERO
            }
        }
    }
}

/// The faults of a run: `(offset from the start, fault)`, in order.
pub fn fault_plan(seed: u64, settings: &Settings) -> Vec<(Duration, SentinelFault)> {
    let mut rng = Rng::new(sub_seed(seed, 0x5E));
    let end = ms(settings.secs * 1000).saturating_sub(ms(1000));
    let mut at = ms(rng.range(300, 1200));
    let mut plan = Vec::new();
    loop {
        let op = match rng.range(0, 10) {
            0..=5 => SentinelFault::FreezeSentinel {
                i: rng.range(0, 3) as usize,
                d: if rng.range(0, 100) < 33 {
                    settings.lease + ms(rng.range(200, 1000))
                } else {
                    ms(rng.range(300, 2000))
                },
                kill: rng.range(0, 100) < 75,
            },
            6 => {
                let p = rng.range(0, settings.procs as u64) as usize;
                SentinelFault::StopProcess(p, ms(rng.range(50, 500)))
            }
            7 => SentinelFault::KillNormal,
            _ => SentinelFault::KillPubsub,
        };
        let d = op.estimate();
        if at + d >= end {
            break;
        }
        plan.push((at, op));
        at += d + ms(rng.range(300, 1500));
    }
    if settings.clock_steps {
        let spans: Vec<_> = plan.iter().map(|(at, op)| (*at, op.estimate())).collect();
        let gaps = plan::gaps_between(settings, &spans);
        for (at, us) in plan::clock_steps_in(sub_seed(seed, 0x5EC), &gaps, 4000, 5000) {
            plan.push((at, SentinelFault::StepClock(us)));
        }
        plan.sort_by_key(|(at, _)| *at);
    }
    plan
}

/// The total of the steps back in `plan`: how much longer than its lease a key may live.
fn back_steps(plan: &[(Duration, SentinelFault)]) -> Duration {
    plan::sum_back(plan.iter().filter_map(|(_, f)| match f {
        SentinelFault::StepClock(us) => Some(*us),
        _ => None,
    }))
}

/// Kills the clients of `kind` (`normal` or `pubsub`) on the master; the sentinels' own
/// links reconnect at once.
fn kill_clients(set: &SentinelSet, master: u16, kind: &str) {
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg(kind)
        .query(&mut set.conn(master))
        .unwrap();
}

/// Carries out one fault; returns its record.
fn inflict(op: &SentinelFault, set: &SentinelSet, master: u16, children: &[TestChild]) -> Fault {
    let start = mono_ns();
    let mut kind = FaultKind::Other;
    let mut what = format!("{op:?}");
    match *op {
        SentinelFault::FreezeSentinel { i, d, kill } => {
            set.pause_sentinel(i);
            if kill {
                thread::sleep(d / 2);
                kill_clients(set, master, "normal");
                kill_clients(set, master, "pubsub");
                thread::sleep(d - d / 2);
            } else {
                thread::sleep(d);
            }
            set.resume_sentinel(i);
        }
        SentinelFault::StopProcess(p, d) => {
            kind = FaultKind::ProcessStopped(p);
            children[p].signal("STOP");
            thread::sleep(d);
            children[p].signal("CONT");
        }
        SentinelFault::KillNormal => kill_clients(set, master, "normal"),
        SentinelFault::KillPubsub => kill_clients(set, master, "pubsub"),
        SentinelFault::StepClock(us) => {
            what = format!("StepClock({:+.3} s) of {master}", us as f64 / 1e6);
            kind = crate::cluster::step_clock(master, us);
        }
    }
    Fault {
        kind,
        what,
        start,
        end: mono_ns(),
    }
}

/// What the master still has of the clients (not the sentinels' and replicas' links).
fn leftovers(set: &SentinelSet, master: u16, history: &mut History) {
    let mut conn = set.conn(master);
    let mut left = Vec::new();
    common::wait_until(Duration::from_secs(3), || {
        left = crate::run::other_clients(&mut conn)
            .into_iter()
            .filter(|c| !c.contains("name=sentinel-"))
            .collect();
        left.is_empty()
    });
    history.leftovers.connections = left;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query(&mut conn)
        .unwrap();
    history.leftovers.channels = channels
        .into_iter()
        .filter(|c| !c.starts_with("__sentinel__"))
        .collect();
}

/// Runs one seed against a fresh deployment and checks it. Panics only on a failure of the
/// harness itself.
pub fn run_seed(seed: u64, settings: &Settings) -> Outcome {
    let faults = fault_plan(seed, settings);
    if settings.clock_steps {
        common::clock_shift::enable().expect("the clock library builds (needs cc)");
    }
    let set = SentinelSet::start();
    let master = set.master_port();
    let url = format!("{}|{}", set.master_name(), set.sentinel_urls().join(","));
    let mut procs = Procs::spawn(seed, settings, &url);
    let latest = procs.start + Duration::from_secs(settings.secs).saturating_sub(ms(1000));

    let mut history = History {
        lease: u64::try_from(settings.lease.as_nanos()).unwrap(),
        ..History::default()
    };
    for (at, op) in &faults {
        thread::sleep((procs.start + *at).saturating_duration_since(std::time::Instant::now()));
        if std::time::Instant::now() + op.estimate() >= latest {
            println!("model: {op:?} left out: the faults before it ran late");
            continue;
        }
        let fault = inflict(op, &set, master, procs.children());
        println!(
            "model: {:+.0} ms {} ({:.0} ms)",
            (fault.start as f64 - procs.t0 as f64) / 1e6,
            fault.what,
            (fault.end - fault.start) as f64 / 1e6
        );
        history.faults.push(fault);
    }

    if settings.clock_steps {
        history.faults.push(crate::cluster::reset_clocks(&[master]));
    }
    procs.wait_drained(settings);
    leftovers(&set, master, &mut history);
    procs.exit();
    // The master never moved.
    assert_eq!(set.master_port(), master, "the master moved");
    let mut conn = set.conn(master);
    let mut keys = Vec::new();
    // A key written before a step back outlives its lease by the step.
    let outlive = back_steps(&faults);
    common::wait_until(settings.lease + outlive + Duration::from_secs(1), || {
        keys = lock_keys(&mut conn);
        keys.is_empty()
    });
    history.leftovers.keys = keys;
    procs.outcome(seed, settings, history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_fault_plans_freeze_every_sentinel() {
        let s = Settings::sentinel(15);
        assert_eq!(fault_plan(7, &s), fault_plan(7, &s));
        let mut frozen = [0; 3];
        for seed in 0..50 {
            for (at, f) in fault_plan(seed, &s) {
                assert!(at + f.estimate() < ms(14_000), "{seed}: {at:?} {f:?}");
                if let SentinelFault::FreezeSentinel { i, .. } = f {
                    frozen[i] += 1;
                }
            }
        }
        assert!(frozen.iter().all(|&n| n >= 10), "{frozen:?}");
    }

    #[test]
    fn sentinel_clock_plans_step_back_and_forward_between_faults() {
        let s = Settings::sentinel_clock_steps(12);
        let (mut back, mut forward) = (0, 0);
        for seed in 0..30 {
            let plan = fault_plan(seed, &s);
            assert_eq!(plan, fault_plan(seed, &s));
            for (at, f) in &plan {
                assert!(*at + f.estimate() < ms(11_000), "{seed}: {at:?} {f:?}");
                if let SentinelFault::StepClock(us) = f {
                    if *us < 0 {
                        back += 1;
                    } else {
                        forward += 1;
                    }
                }
            }
        }
        assert!(
            back >= 10 && forward >= 10,
            "{back} back, {forward} forward"
        );
    }
}
