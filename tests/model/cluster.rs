//! One seed of the model against a Redis Cluster (3 masters, 3 replicas) hit by node faults:
//! the same processes, plans and checker as against one server (`run.rs`), with
//! `Client::cluster` clients and a fault plan of the cluster's own.
//!
//! # The faults, and why the checker stays as it is
//!
//! - **Graceful failover** (`CLUSTER FAILOVER` on a master's replica): the master stops
//!   taking writes until its replica has every byte of the replication stream, then the
//!   replica takes over. Nothing written is lost: a failover excuses nothing.
//! - **A killed master** (SIGKILL), its replica promoted after `cluster-node-timeout`, then
//!   the old master restarted on its port with its `nodes.conf` (and no data): it learns of
//!   its successor and resyncs as its replica. No write acknowledged to a client is lost
//!   either: Redis writes a command's replication stream to its replicas' sockets before the
//!   command's reply, in the same pass of its event loop (a replica joins the head of the
//!   pending-write list after the client that caused the write), and on one host bytes
//!   written to a socket arrive even if the writer is killed right after. So the lock a
//!   client was told it has is on the promoted replica, its slot's fencing mark too. And the
//!   restarted node does not serve the slots it remembers: a master starting in a cluster
//!   waits 2 s before its state turns `ok` (Redis's `CLUSTER_WRITABLE_DELAY`), long enough to
//!   learn that it was replaced.
//! - **A paused master** (SIGSTOP) for less than `cluster-node-timeout`: calls stall and
//!   time out, no failover. A pause past it is left out on purpose: the replica is promoted
//!   while the paused master's sockets keep the commands sent to it, and on SIGCONT it may
//!   serve one of them (a grant, or a renewal of a lease the promoted replica will let
//!   expire) before it learns of its demotion. That is Redis Cluster's
//!   documented split brain, in which no client can tell a stale grant from a good one (the
//!   crate's docs say a failover may lose a lock); a test of it would only test Redis.
//! - **A frozen shard** (only with [`Settings::frozen`]): a master and its replica SIGSTOPped
//!   together for longer than a call's bound (and at times than a pub/sub heartbeat), with
//!   `cluster-node-timeout` raised on every node first, so that no failover starts (the first
//!   seconds of an outage in a deployment with a longer node timeout), and set back once
//!   every node heard from the thawed ones again. Calls on its slots time out within their
//!   bounds; those on the other masters, and their wake-ups, must not notice. A command that
//!   the frozen master queued is served on `SIGCONT`, after its caller timed out: an acquire
//!   then grants to nobody (the key outlives nobody's section, and expires), a renewal
//!   extends a lease that its holder may already have reported lost. Neither lets two owners
//!   overlap, so no excuse is added for it either.
//! - **A stopped model process**, and **killed connections** (`CLIENT KILL TYPE normal` or
//!   `pubsub`, which includes sharded subscriptions) on every master.
//!
//! So the cluster adds no excuse to the checker: an overlap is allowed only where the earlier
//! holder had been told (`on_lease_lost`) before the later one began, tokens must rise, every
//! call keeps its documented bound (on a cluster, redirections and retries through a failover
//! included) and returns no error but a timeout, a retriable one or a lost lease.
//! (`wait_replicas` would narrow a real split brain; a cluster client refuses it, so nothing
//! here relies on it.)

use std::thread;
use std::time::{Duration, Instant};

use crate::check::{Fault, FaultKind, History};
use crate::checker::{Rng, mono_ns};
use crate::common::{self, RedisCluster, TestChild};
use crate::plan::{self, Settings, sub_seed};
use crate::run::{Outcome, Procs, lock_keys, other_clients};

/// How long one step of a fault (a promotion, a restart, a resync) may take before the run
/// fails as a harness failure.
const STEP: Duration = Duration::from_secs(20);
/// A pause of a master stays this far below `cluster-node-timeout`: no failover.
const PAUSE_MAX: Duration = Duration::from_millis(600);

/// A frozen shard stays frozen this long (in ms): past every call's bound, and at times past
/// two pub/sub heartbeats (4 s), after which the thread opens a new connection to it.
const FREEZE_MIN: u64 = 1000;
const FREEZE_MAX: u64 = 5000;
/// `cluster-node-timeout` while a shard is frozen: no failover.
const FROZEN_NODE_TIMEOUT_MS: u64 = 600_000;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A node fault. Masters are named by their index among the masters as the cluster has them
/// when the fault strikes (ordered by first slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeFault {
    /// `CLUSTER FAILOVER` on the master's replica, then wait until the old master follows it.
    Failover(usize),
    /// SIGKILL the master; once its replica is promoted, restart it and wait until it is the
    /// new master's replica, caught up.
    KillMaster(usize),
    /// SIGSTOP the master, SIGCONT it after the duration (below `cluster-node-timeout`).
    PauseMaster(usize, Duration),
    /// SIGSTOP the master and its replica (no failover: the node timeout is raised first),
    /// SIGCONT them after the duration.
    FreezeShard(usize, Duration),
    /// `SIGSTOP` one model process, `SIGCONT` it after the duration.
    StopProcess(usize, Duration),
    /// `CLIENT KILL TYPE normal` on every master.
    KillNormal,
    /// `CLIENT KILL TYPE pubsub` on every master.
    KillPubsub,
    /// Steps the wall clock of the master by this many microseconds (negative: back).
    StepClock(usize, i64),
}

impl NodeFault {
    /// About how long the fault lasts, to space the plan (a promotion takes about
    /// `cluster-node-timeout` and an election; a restart and resync a second or two more).
    fn estimate(&self) -> Duration {
        match self {
            NodeFault::Failover(_) => ms(1000),
            NodeFault::KillMaster(_) => ms(5000),
            NodeFault::PauseMaster(_, d) | NodeFault::StopProcess(_, d) => *d,
            // The thaw: every node hears from the frozen ones, and the timeout is set back.
            NodeFault::FreezeShard(_, d) => *d + ms(1000),
            NodeFault::KillNormal | NodeFault::KillPubsub | NodeFault::StepClock(..) => {
                Duration::ZERO
            }
        }
    }
}

/// The node faults of a run: `(offset from the start, fault)`, in order. A fault that starts
/// late (the one before it took longer than its estimate) is carried out late, or left out
/// if it would no longer be over a second before the processes stop.
pub fn fault_plan(seed: u64, settings: &Settings) -> Vec<(Duration, NodeFault)> {
    let mut rng = Rng::new(sub_seed(seed, 0xC1));
    let end = ms(settings.secs * 1000).saturating_sub(ms(1000));
    let masters = 3;
    let mut at = ms(rng.range(300, 1200));
    let mut plan = Vec::new();
    loop {
        let master = rng.range(0, masters) as usize;
        // Frozen shards only where asked for: the plans of the other seeds stay as they were.
        let kinds = if settings.frozen { 14 } else { 10 };
        let op = match rng.range(0, kinds) {
            0..=1 => NodeFault::Failover(master),
            2..=3 => NodeFault::KillMaster(master),
            4..=5 => {
                NodeFault::PauseMaster(master, ms(rng.range(50, PAUSE_MAX.as_millis() as u64)))
            }
            6 => {
                let p = rng.range(0, settings.procs as u64) as usize;
                let d = if rng.range(0, 100) < 33 {
                    settings.lease + ms(rng.range(200, 1000))
                } else {
                    ms(rng.range(50, 500))
                };
                NodeFault::StopProcess(p, d)
            }
            7 => NodeFault::KillNormal,
            8..=9 => NodeFault::KillPubsub,
            _ => NodeFault::FreezeShard(master, ms(rng.range(FREEZE_MIN, FREEZE_MAX))),
        };
        let d = op.estimate();
        if at + d >= end {
            break;
        }
        plan.push((at, op));
        at += d + ms(rng.range(300, 1500));
    }
    if settings.clock_steps {
        // Forward by less than the node timeout (1 s), so that the stepped node's view of the
        // others' silence fails nobody (one master's report is no majority anyway).
        let spans: Vec<_> = plan.iter().map(|(at, op)| (*at, op.estimate())).collect();
        let gaps = plan::gaps_between(settings, &spans);
        let mut rng = Rng::new(sub_seed(seed, 0xC10C));
        for (at, us) in plan::clock_steps_in(sub_seed(seed, 0xC1C), &gaps, 4000, 900) {
            plan.push((at, NodeFault::StepClock(rng.range(0, masters) as usize, us)));
        }
        plan.sort_by_key(|(at, _)| *at);
    }
    plan
}

/// The `i`-th master now, and the first slot it serves.
fn master(cluster: &RedisCluster, i: usize) -> (u16, u16) {
    let port = cluster.masters()[i % 3];
    let slot = cluster
        .shards()
        .iter()
        .find(|s| s.master == port)
        .map(|s| s.start)
        .unwrap();
    (port, slot)
}

/// Runs `args` on every master (a fresh connection each, which `CLIENT KILL` skips).
fn on_masters(cluster: &RedisCluster, args: &[&str]) {
    for port in cluster.masters() {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: redis::Value = cmd.query(&mut cluster.conn(port)).unwrap();
    }
}

/// Sets `cluster-node-timeout` on every node.
fn set_node_timeout(cluster: &RedisCluster, ms: u64) {
    for port in cluster.live_ports() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-node-timeout")
            .arg(ms)
            .query(&mut cluster.conn(port))
            .unwrap();
    }
}

/// The wall clock in ms, as `CLUSTER NODES` gives its `pong-recv` times.
fn realtime_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Whether no live node has a ping to a node of `ids` outstanding for more than 300 ms (the
/// thawed nodes answered the pings sent while they were frozen): setting the node timeout
/// back then fails nobody over.
fn no_stale_pings(cluster: &RedisCluster, ids: &[String]) -> bool {
    let now = realtime_ms();
    cluster.live_ports().into_iter().all(|port| {
        let Ok(nodes) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query::<String>(&mut cluster.conn(port))
        else {
            return false;
        };
        nodes.lines().all(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let watched = f.first().is_some_and(|id| ids.iter().any(|x| x == id));
            if !watched || f.get(2).is_some_and(|flags| flags.contains("myself")) {
                return true;
            }
            let ping_sent = f.get(4).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            ping_sent == 0 || now.saturating_sub(ping_sent) < 300
        })
    })
}

/// Carries out one fault; returns its record.
fn inflict(op: &NodeFault, cluster: &mut RedisCluster, children: &[TestChild]) -> Fault {
    let start = mono_ns();
    let mut kind = FaultKind::Other;
    let mut what = format!("{op:?}");
    match *op {
        NodeFault::Failover(i) => {
            let (old, slot) = master(cluster, i);
            let replica = cluster.replica_of_slot(slot);
            what = format!("{op:?}: {old} -> {replica}");
            kind = clock_ahead(old, replica);
            cluster.failover(replica, STEP);
            cluster.wait_replicas_synced(STEP);
            assert_eq!(
                cluster.replica_of_slot(slot),
                old,
                "{old} does not follow {replica}"
            );
        }
        NodeFault::KillMaster(i) => {
            let (old, slot) = master(cluster, i);
            cluster.kill(old);
            let new = cluster.wait_new_master(slot, old, STEP);
            kind = clock_ahead(old, new);
            let promoted = mono_ns();
            cluster.restart(old);
            cluster.wait_ok(STEP);
            cluster.wait_replicas_synced(STEP);
            assert!(
                cluster
                    .shards()
                    .iter()
                    .any(|s| s.master == new && s.replicas.contains(&old)),
                "{old} did not come back as the replica of {new}: {:?}",
                cluster.shards()
            );
            what = format!(
                "{op:?}: {old} killed, {new} promoted after {:.0} ms, {old} back as its replica",
                (promoted - start) as f64 / 1e6
            );
        }
        NodeFault::PauseMaster(i, d) => {
            let (port, _) = master(cluster, i);
            what = format!("{op:?}: {port}");
            cluster.pause(port);
            thread::sleep(d);
            cluster.resume(port);
        }
        NodeFault::FreezeShard(i, d) => {
            let (port, slot) = master(cluster, i);
            let replica = cluster.replica_of_slot(slot);
            what = format!("{op:?}: {port} and its replica {replica}");
            let ids = [cluster.node_id(port), cluster.node_id(replica)];
            set_node_timeout(cluster, FROZEN_NODE_TIMEOUT_MS);
            cluster.pause(port);
            cluster.pause(replica);
            thread::sleep(d);
            cluster.resume(replica);
            cluster.resume(port);
            // The other nodes sent pings meanwhile: with the short timeout back before the
            // thawed nodes answered them, they would be failed over at once.
            assert!(
                common::wait_until(STEP, || no_stale_pings(cluster, &ids)),
                "the thawed nodes {port} and {replica} were not heard from again"
            );
            set_node_timeout(cluster, common::cluster::NODE_TIMEOUT.as_millis() as u64);
            cluster.wait_ok(STEP);
        }
        NodeFault::StopProcess(p, d) => {
            kind = FaultKind::ProcessStopped(p);
            children[p].signal("STOP");
            thread::sleep(d);
            children[p].signal("CONT");
        }
        NodeFault::KillNormal => on_masters(cluster, &["CLIENT", "KILL", "TYPE", "normal"]),
        NodeFault::KillPubsub => on_masters(cluster, &["CLIENT", "KILL", "TYPE", "pubsub"]),
        NodeFault::StepClock(i, us) => {
            let (port, _) = master(cluster, i);
            what = format!("StepClock({:+.3} s) of {port}", us as f64 / 1e6);
            kind = step_clock(port, us);
        }
    }
    Fault {
        kind,
        what,
        start,
        end: mono_ns(),
    }
}

/// What a move of a slot's mastership from `old` to `new` is to the leases there: Redis
/// replicates an expiry as an absolute time of the old master's clock, so where the new
/// master's clock is ahead of it, leases end early there, as after a forward step of the clock
/// ([`FaultKind::ClockForward`]); otherwise nothing the checker excuses.
fn clock_ahead(old: u16, new: u16) -> FaultKind {
    if common::clock_shift::offset_us(new) > common::clock_shift::offset_us(old) {
        FaultKind::ClockForward
    } else {
        FaultKind::Other
    }
}

/// Steps the wall clock of every server on `ports` that is behind the real clock forward to
/// it (the end of a run with clock steps, before the leftover checks). A clock ahead is left
/// so: stepping it back would make keys written meanwhile outlive the check.
pub fn reset_clocks(ports: &[u16]) -> Fault {
    let start = mono_ns();
    for &port in ports {
        let off = common::clock_shift::offset_us(port);
        if off < 0 {
            common::clock_shift::step(port, -off);
        }
    }
    Fault {
        kind: FaultKind::ClockForward,
        what: "StepClock: every server behind the real clock forward to it".into(),
        start,
        end: mono_ns(),
    }
}

/// Steps the wall clock of the server on `port` by `us` microseconds (negative: back); the
/// kind of fault that is.
pub fn step_clock(port: u16, us: i64) -> FaultKind {
    common::clock_shift::step(port, us);
    if us > 0 {
        FaultKind::ClockForward
    } else {
        FaultKind::ClockBack(us.unsigned_abs())
    }
}

/// The total of the steps back among the clock steps of `plan`: how much longer than its
/// lease a key may live.
fn back_steps(plan: &[(Duration, NodeFault)]) -> Duration {
    plan::sum_back(plan.iter().filter_map(|(_, f)| match f {
        NodeFault::StepClock(_, us) => Some(*us),
        _ => None,
    }))
}

/// What every live node still has of the clients: connections (but the replication links)
/// and channels, plain and sharded.
fn leftovers(cluster: &RedisCluster, history: &mut History) {
    let mut left = Vec::new();
    common::wait_until(Duration::from_secs(3), || {
        left = cluster
            .live_ports()
            .into_iter()
            .flat_map(|p| {
                other_clients(&mut cluster.conn(p))
                    .into_iter()
                    .map(move |c| format!("node {p}: {c}"))
            })
            .collect();
        left.is_empty()
    });
    history.leftovers.connections = left;
    for port in cluster.live_ports() {
        let mut conn = cluster.conn(port);
        for list in ["CHANNELS", "SHARDCHANNELS"] {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg(list)
                .arg("*")
                .query(&mut conn)
                .unwrap();
            history
                .leftovers
                .channels
                .extend(channels.into_iter().map(|c| format!("node {port}: {c}")));
        }
    }
}

/// Runs one seed against a fresh cluster and checks it. Panics only on a failure of the
/// harness itself (a process that crashed or hung, a cluster that did not recover).
pub fn run_seed(seed: u64, settings: &Settings) -> Outcome {
    let faults = fault_plan(seed, settings);
    let begun = Instant::now();
    if settings.clock_steps {
        common::clock_shift::enable().expect("the clock library builds (needs cc)");
    }
    let mut cluster = RedisCluster::start();
    println!("model: cluster of 3 + 3 up in {:?}", begun.elapsed());
    let mut procs = Procs::spawn(seed, settings, &cluster.seed_urls().join(","));
    let latest = procs.start + Duration::from_secs(settings.secs).saturating_sub(ms(1000));

    let mut history = History {
        lease: u64::try_from(settings.lease.as_nanos()).unwrap(),
        ..History::default()
    };
    for (at, op) in &faults {
        thread::sleep((procs.start + *at).saturating_duration_since(Instant::now()));
        if Instant::now() + op.estimate() >= latest {
            println!("model: {op:?} left out: the faults before it ran late");
            continue;
        }
        let fault = inflict(op, &mut cluster, procs.children());
        println!(
            "model: {:+.0} ms {} ({:.0} ms)",
            (fault.start as f64 - procs.t0 as f64) / 1e6,
            fault.what,
            (fault.end - fault.start) as f64 / 1e6
        );
        history.faults.push(fault);
    }

    if settings.clock_steps {
        history.faults.push(reset_clocks(&cluster.live_ports()));
    }
    procs.wait_drained(settings);
    leftovers(&cluster, &mut history);
    procs.exit();
    // A release that never reached Redis leaves a key for one lease at most (plus the steps
    // back of the clocks since it was written).
    let mut keys = Vec::new();
    let outlive = back_steps(&faults);
    common::wait_until(settings.lease + outlive + Duration::from_secs(1), || {
        keys = cluster
            .masters()
            .into_iter()
            .flat_map(|p| lock_keys(&mut cluster.conn(p)))
            .collect();
        keys.is_empty()
    });
    history.leftovers.keys = keys;
    procs.outcome(seed, settings, history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_fault_plans_fit_the_run() {
        let s = Settings::cluster(20);
        assert_eq!(fault_plan(7, &s), fault_plan(7, &s));
        assert_ne!(fault_plan(7, &s), fault_plan(8, &s));
        for seed in 0..50 {
            let plan = fault_plan(seed, &s);
            assert!(plan.len() >= 3, "{seed}: {plan:?}");
            for (at, f) in &plan {
                assert!(*at + f.estimate() < ms(19_000), "{seed}: {at:?} {f:?}");
                if let NodeFault::PauseMaster(_, d) = f {
                    assert!(*d < PAUSE_MAX);
                }
                assert!(!matches!(f, NodeFault::FreezeShard(..)), "{seed}: {f:?}");
            }
        }
        // With frozen shards asked for, they come.
        let s = Settings::cluster_frozen(20);
        let frozen = (0..50)
            .flat_map(|seed| fault_plan(seed, &s))
            .filter(|(_, f)| matches!(f, NodeFault::FreezeShard(..)))
            .count();
        assert!(frozen >= 10, "{frozen}");
    }
}
