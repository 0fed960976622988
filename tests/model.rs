//! The randomized model test: several processes x several threads run seeded random operation
//! sequences on a few plain mutexes (each alone, or 1-3 of them at once through a `MultiMutex`,
//! named in random order), a fair mutex, a read-write lock and a semaphore (every
//! acquire form, re-entry through different handles, a writer taking read levels, one or two
//! permits at a time, `unlock()` and drop, panics while holding, holds that outlive their
//! lease) while a seeded
//! fault plan stops processes and Redis, restarts Redis empty, kills connections, makes Redis
//! sleep and cuts, delays or swallows replies. Every critical section, call and lost-lease
//! callback is logged on one monotonic clock, and a checker asserts: no two owners hold one
//! name at once unless the earlier was told first (readers may share a read-write lock, never
//! with a writer), the permits held never exceed the semaphore's count, tokens increase in
//! grant order, every call
//! keeps its documented time bound, no lost lease is reported twice, and no thread, connection,
//! channel or key is left over (see `model/check.rs` for why a finding is never a matter of
//! timing). Every seed that found a defect is kept below as a `seed_<n>_<what>` test.
//!
//! - `LOCKSMITH_MODEL_SEED=<seed>`: run (replay) that one seed.
//! - `LOCKSMITH_MODEL_SEEDS=<n>` runs n seeds from a clock-derived start (printed), or
//!   `LOCKSMITH_MODEL_SEEDS=<a>,<b>,...` those seeds.
//! - `LOCKSMITH_MODEL_SECS=<s>`: seconds per seed (default 10; part of the plan, so give the
//!   same value to replay).
//! - `LOCKSMITH_MODEL_SLACK_MS=<ms>`: what a call may take beyond its documented bound
//!   (default 1000, for a busy machine).
//! - `LOCKSMITH_MODEL_MUTEX_ONLY=1`: plain mutex operations only, the plans of the seeds
//!   found before the model knew the other lock types (part of the plan, as the seconds).
//! - `LOCKSMITH_MODEL_DETACH=0`: no holds moved between threads. Otherwise now and then a
//!   thread detaches an outermost hold and another thread attaches it (and holds it a while),
//!   or releases it, or the thread drops it while detached (drawn from a stream of their own;
//!   part of the plan; never with plain mutexes only).
//! - `LOCKSMITH_MODEL_FORCE=0`: no forced unlocks. Otherwise the fault plan now and then
//!   calls `Client::force_unlock` on a lock the run uses, in a gap between its other faults
//!   (part of the plan; also in the mixed-lease and hot mixes; never with plain mutexes only,
//!   in the blocks mix, or in the cluster and Sentinel runs).
//!
//! Three more mixes run the same model with other fault classes (one seed each in a plain
//! `cargo test`; `LOCKSMITH_MODEL_MIX_SEED=<seed>` replays one, `LOCKSMITH_MODEL_MIX_SEEDS=<n>`
//! or `<a>,<b>,...` runs several, `LOCKSMITH_MODEL_SECS` gives the seconds, default 8):
//!
//! - `mixed_leases_on_one_lock`: each process's client has another lease (3 s, 1.5 s, 6 s),
//!   so waiters of every lock type queue behind holders with other leases.
//! - `largest_blocks_across_empty_restarts`: `local_handoff_max_count(1024)`, bursts of
//!   empty cycles that run the tokens ahead of the server clock, frequent empty
//!   restarts; tokens must rise across them.
//! - `server_clock_steps`: the server's wall clock stepped back and forward between the other
//!   faults (the harness's clock library, `testkit/src/clock_shift.rs`); tokens must rise
//!   across every step, and only a forward step excuses an overlap, as a forced unlock of
//!   every lock would.
//!
//! `cluster_with_node_faults` runs the same model against a Redis Cluster of 3 masters and 3
//! replicas whose nodes are failed over, killed and restarted, and paused (see
//! `model/cluster.rs`), with the same checks:
//!
//! - `LOCKSMITH_MODEL_CLUSTER_SEED=<seed>`: run (replay) that one seed.
//! - `LOCKSMITH_MODEL_CLUSTER_SEEDS=<n>` or `<a>,<b>,...`: as `LOCKSMITH_MODEL_SEEDS`.
//! - `LOCKSMITH_MODEL_CLUSTER_SECS=<s>`: seconds per seed (default 20; part of the plan).
//!
//! `cluster_with_frozen_nodes` adds frozen shards to those faults: a master and its replica
//! `SIGSTOP`ped past every call's bound with no failover (`LOCKSMITH_MODEL_FROZEN_SEED`,
//! `LOCKSMITH_MODEL_FROZEN_SEEDS`, `LOCKSMITH_MODEL_FROZEN_SECS`, default 15 s).
//!
//! `sentinel_with_frozen_sentinels` runs the model on the master of a Sentinel deployment
//! whose sentinels are frozen (not dead) while the clients' connections are killed, so that
//! they must ask the sentinels again (see `model/sentinel.rs`; `LOCKSMITH_MODEL_SENTINEL_SEED`,
//! `LOCKSMITH_MODEL_SENTINEL_SEEDS`, `LOCKSMITH_MODEL_SENTINEL_SECS`, default 12 s).
//!
//! `cluster_with_clock_steps` and `sentinel_with_clock_steps` step the wall clock of the
//! masters (one at a time), or of the Sentinel deployment's master, back and forward between
//! those faults, with the checks of `server_clock_steps` (the seeds as for their deployment).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model/check.rs"]
mod check;
#[path = "model/cluster.rs"]
mod cluster;
mod common;
#[path = "model/journal.rs"]
mod journal;
#[path = "model/plan.rs"]
mod plan;
#[path = "model/run.rs"]
mod run;
#[path = "model/sentinel.rs"]
mod sentinel;
#[path = "model/worker.rs"]
mod worker;

use common::{checker, proxy};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use check::{Finding, History, Section};
use checker::mono_ns;
use plan::Settings;

/// The seeds of a plain `cargo test`.
const DEFAULT_SEEDS: [u64; 3] = [1, 2, 3];
/// Seconds per seed unless `LOCKSMITH_MODEL_SECS` says otherwise.
const DEFAULT_SECS: u64 = 10;
/// The cluster's seed in a plain `cargo test` (it kills a master twice; it found that a call
/// that ran out of its bound while the cluster was failing over reported `CLUSTERDOWN` as a
/// hard error), and its seconds unless `LOCKSMITH_MODEL_CLUSTER_SECS` says otherwise.
const DEFAULT_CLUSTER_SEED: u64 = 2;
const DEFAULT_CLUSTER_SECS: u64 = 20;
/// The seed and seconds of the frozen-shard mix and of the frozen-sentinel mix in a plain
/// `cargo test`.
const DEFAULT_FROZEN_SEED: u64 = 5;
const DEFAULT_FROZEN_SECS: u64 = 15;
const DEFAULT_SENTINEL_SEED: u64 = 1;
const DEFAULT_SENTINEL_SECS: u64 = 12;

/// A model process (see `model/run.rs`).
#[test]
fn child_model_process() {
    if common::is_child(run::ROLE) {
        run::child_main();
    }
}

fn env_u64(var: &str) -> Option<u64> {
    std::env::var(var).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a number, not {v:?}"))
    })
}

fn secs() -> u64 {
    env_u64("LOCKSMITH_MODEL_SECS").unwrap_or(DEFAULT_SECS)
}

/// Runs `seeds` one after another and fails with every failing seed and how to replay it.
fn run_seeds(seeds: &[u64]) {
    let settings = if env_u64("LOCKSMITH_MODEL_MUTEX_ONLY").is_some_and(|v| v != 0) {
        Settings::mutex_only(secs())
    } else {
        Settings::new(secs())
    };
    run_seeds_with(seeds, &settings);
}

/// One seed at a time in this binary: the seeds' processes would otherwise share the two
/// cores and stretch each other's calls.
static ONE_SEED_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`run_seeds`] with given settings (the run time, the lock types and the mix are part of the
/// plan).
fn run_seeds_with(seeds: &[u64], settings: &Settings) {
    let _serial = ONE_SEED_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let secs = settings.secs;
    let only = if settings.family || !settings.mix.is_empty() {
        ""
    } else {
        " LOCKSMITH_MODEL_MUTEX_ONLY=1"
    };
    // Forced unlocks turned off where the mix has them.
    let force_off = if !settings.force
        && (settings.family || settings.hot)
        && !settings.cluster
        && !settings.sentinel
    {
        " LOCKSMITH_MODEL_FORCE=0"
    } else {
        ""
    };
    let mut failed = Vec::new();
    for &seed in seeds {
        println!("model: seed {seed}, {secs} s{only}{force_off}");
        let replay = if settings.frozen {
            format!(
                "  replay: LOCKSMITH_MODEL_FROZEN_SEED={seed} LOCKSMITH_MODEL_FROZEN_SECS={secs} \
                 cargo test --test model -- cluster_with_frozen_nodes"
            )
        } else if settings.sentinel {
            format!(
                "  replay: LOCKSMITH_MODEL_SENTINEL_SEED={seed} \
                 LOCKSMITH_MODEL_SENTINEL_SECS={secs} cargo test --test model -- {}",
                if settings.clock_steps {
                    "sentinel_with_clock_steps"
                } else {
                    "sentinel_with_frozen_sentinels"
                }
            )
        } else if settings.cluster {
            format!(
                "  replay: LOCKSMITH_MODEL_CLUSTER_SEED={seed} LOCKSMITH_MODEL_CLUSTER_SECS={secs} \
                 cargo test --test model -- {}",
                if settings.clock_steps {
                    "cluster_with_clock_steps"
                } else {
                    "cluster_with_node_faults"
                }
            )
        } else if !settings.mix.is_empty() {
            format!(
                "  replay: LOCKSMITH_MODEL_MIX_SEED={seed} LOCKSMITH_MODEL_SECS={secs}{force_off} \
                 cargo test --test model -- {}",
                mix_test(settings.mix)
            )
        } else if settings.hot {
            format!(
                "  replay: LOCKSMITH_MODEL_HOT_SEED={seed}{force_off} cargo test --test model -- \
                 hot_name"
            )
        } else {
            format!(
                "  replay: LOCKSMITH_MODEL_SEED={seed} LOCKSMITH_MODEL_SECS={secs}{only}{force_off} \
                 cargo test --test model -- model_seeds"
            )
        };
        // A process that crashed or hung fails the seed too, and says which seed it was.
        let run = if settings.cluster {
            cluster::run_seed
        } else if settings.sentinel {
            sentinel::run_seed
        } else {
            run::run_seed
        };
        match std::panic::catch_unwind(|| run(seed, settings)) {
            Ok(outcome) => {
                println!("model: {}", outcome.report(20));
                println!(
                    "model: {} local hand-offs (outermost sections whose token follows the \
                     previous one's by one)",
                    handoffs(&outcome.history.sections)
                );
                println!(
                    "model: {} holds released while detached (from another thread, or dropped)",
                    moved(&outcome.history.calls)
                );
                if !outcome.findings.is_empty() {
                    failed.push(format!("{}\n{replay}", outcome.report(10)));
                }
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!(
                    "seed {seed}: the run itself failed: {msg}\n{replay}"
                ));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "model: {} seed(s) failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// How many holds were released while detached: their release calls.
fn moved(calls: &[check::Call]) -> usize {
    calls
        .iter()
        .filter(|c| c.method.starts_with("detached"))
        .count()
}

/// How many outermost sections took the token right after the previous one of their name:
/// local hand-offs (a grant through Redis takes the server clock in microseconds).
fn handoffs(sections: &[Section]) -> usize {
    let mut outer: Vec<&Section> = sections.iter().filter(|s| s.depth == 0).collect();
    outer.sort_by_key(|s| (s.name.clone(), s.token));
    outer
        .windows(2)
        .filter(|w| w[0].name == w[1].name && w[1].token == w[0].token + 1)
        .count()
}

/// The seed `one` names, else the seeds `many` names (a count from a clock-derived start, or
/// a list), else `default`.
fn seeds_from_env(one: &str, many: &str, default: &[u64]) -> Vec<u64> {
    if let Some(seed) = env_u64(one) {
        return vec![seed];
    }
    match std::env::var(many) {
        Ok(v) if v.contains(',') => v.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        Ok(v) => {
            let n: u64 = v.trim().parse().unwrap();
            let base = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs()
                * 1000;
            println!("model: {n} seeds from {base}");
            (base..base + n).collect()
        }
        Err(_) => default.to_vec(),
    }
}

/// The default seed set, or the seeds the environment names.
#[test]
fn model_seeds() {
    run_seeds(&seeds_from_env(
        "LOCKSMITH_MODEL_SEED",
        "LOCKSMITH_MODEL_SEEDS",
        &DEFAULT_SEEDS,
    ));
}

/// The model against a Redis Cluster (3 masters, 3 replicas) whose nodes fail over, die
/// and come back, and pause, with the same checks: one seed in a plain `cargo test`.
#[test]
fn cluster_with_node_faults() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_CLUSTER_SEED",
        "LOCKSMITH_MODEL_CLUSTER_SEEDS",
        &[DEFAULT_CLUSTER_SEED],
    );
    let secs = env_u64("LOCKSMITH_MODEL_CLUSTER_SECS").unwrap_or(DEFAULT_CLUSTER_SECS);
    run_seeds_with(&seeds, &Settings::cluster(secs));
}

/// The cluster model with frozen shards among the node faults (a master and its replica
/// frozen past every call's bound, no failover): calls and wake-ups on the other masters must
/// not notice. One seed in a plain `cargo test`.
#[test]
fn cluster_with_frozen_nodes() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_FROZEN_SEED",
        "LOCKSMITH_MODEL_FROZEN_SEEDS",
        &[DEFAULT_FROZEN_SEED],
    );
    let secs = env_u64("LOCKSMITH_MODEL_FROZEN_SECS").unwrap_or(DEFAULT_FROZEN_SECS);
    run_seeds_with(&seeds, &Settings::cluster_frozen(secs));
}

/// The model on a Sentinel deployment whose sentinels are frozen (not dead) while clients
/// must ask them again: every call keeps its bound. One seed in a plain `cargo test`.
#[test]
fn sentinel_with_frozen_sentinels() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_SENTINEL_SEED",
        "LOCKSMITH_MODEL_SENTINEL_SEEDS",
        &[DEFAULT_SENTINEL_SEED],
    );
    let secs = env_u64("LOCKSMITH_MODEL_SENTINEL_SECS").unwrap_or(DEFAULT_SENTINEL_SECS);
    run_seeds_with(&seeds, &Settings::sentinel(secs));
}

/// The Sentinel model with the master's wall clock stepped back (0.2 to 4 s) and forward
/// (0.2 to 5 s) between the frozen sentinels, killed connections and stopped processes:
/// tokens rise across every step, and only a forward step excuses an overlap. One seed in a
/// plain `cargo test` (`LOCKSMITH_MODEL_SENTINEL_SEED`, `LOCKSMITH_MODEL_SENTINEL_SEEDS`,
/// `LOCKSMITH_MODEL_SENTINEL_SECS` as for [`sentinel_with_frozen_sentinels`]).
#[test]
fn sentinel_with_clock_steps() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_SENTINEL_SEED",
        "LOCKSMITH_MODEL_SENTINEL_SEEDS",
        &[DEFAULT_SENTINEL_SEED],
    );
    let secs = env_u64("LOCKSMITH_MODEL_SENTINEL_SECS").unwrap_or(DEFAULT_SENTINEL_SECS);
    run_seeds_with(&seeds, &Settings::sentinel_clock_steps(secs));
}

/// The cluster model with the masters' wall clocks stepped back (0.2 to 4 s) and forward
/// (0.2 to 0.9 s, under the node timeout) between the node faults, so that failovers also
/// move locks to a replica whose clock differs: tokens rise across every step and failover.
/// One seed in a plain `cargo test` (`LOCKSMITH_MODEL_CLUSTER_SEED`,
/// `LOCKSMITH_MODEL_CLUSTER_SEEDS`, `LOCKSMITH_MODEL_CLUSTER_SECS` as for
/// [`cluster_with_node_faults`]).
#[test]
fn cluster_with_clock_steps() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_CLUSTER_SEED",
        "LOCKSMITH_MODEL_CLUSTER_SEEDS",
        &[DEFAULT_CLUSTER_SEED],
    );
    let secs = env_u64("LOCKSMITH_MODEL_CLUSTER_SECS").unwrap_or(DEFAULT_CLUSTER_SECS);
    run_seeds_with(&seeds, &Settings::cluster_clock_steps(secs));
}

/// The hot mix: 3 processes x 4 threads on one name, so that locks pass between the threads
/// of a process by local hand-off (the default) under the same faults and checks. Replay a
/// seed with `LOCKSMITH_MODEL_HOT_SEED=<seed> cargo test --test model -- hot_name`.
#[test]
fn hot_name_with_local_handoff() {
    let seeds = match env_u64("LOCKSMITH_MODEL_HOT_SEED") {
        Some(seed) => vec![seed],
        None => vec![1],
    };
    run_seeds_with(&seeds, &Settings::hot(8));
}

/// The test that runs mix `mix`.
fn mix_test(mix: &str) -> &'static str {
    match mix {
        "leases" => "mixed_leases_on_one_lock",
        "clocks" => "server_clock_steps",
        "waits" => "queued_waiters_are_served",
        _ => "largest_blocks_across_empty_restarts",
    }
}

/// Seconds per seed of the added mixes: `LOCKSMITH_MODEL_SECS`, else 8.
fn mix_secs() -> u64 {
    env_u64("LOCKSMITH_MODEL_SECS").unwrap_or(8)
}

/// Clients with different leases on every lock type (3 s, 1.5 s and 6 s, one per process):
/// waiters of a fair mutex, writers and readers of a read-write lock and permit requests
/// queue behind holders with other leases, while the fault plan stops processes (frozen
/// waiters and holders of every lease), Redis, and connections. One seed in a plain `cargo
/// test`; `LOCKSMITH_MODEL_MIX_SEED=<seed>` replays one, `LOCKSMITH_MODEL_MIX_SEEDS=<n>` or
/// `<a>,<b>,...` runs several.
#[test]
fn mixed_leases_on_one_lock() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_MIX_SEED",
        "LOCKSMITH_MODEL_MIX_SEEDS",
        &[1],
    );
    run_seeds_with(&seeds, &Settings::mixed_leases(mix_secs()));
}

/// Every lock type with no faults, callers waiting for one another (mostly read-write lock
/// levels, writers and readers of one client and of several, in waiting forms): besides every
/// other check, no waiter may sleep through a stretch longer than the slack (1 s) in which its
/// lock was free on the server and nobody else called for it (see `check_served` in
/// `model/check.rs`). Seeds as for [`mixed_leases_on_one_lock`].
#[test]
fn queued_waiters_are_served() {
    // Seed 3 found the read-write lock's missed wake-up: a writer queued in its client behind
    // another writer of that client slept a lease after that one's release.
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_MIX_SEED",
        "LOCKSMITH_MODEL_MIX_SEEDS",
        &[3],
    );
    run_seeds_with(&seeds, &Settings::waits(mix_secs()));
}

/// Plain mutexes with the largest local hand-off block (`local_handoff_max_count(1024)`),
/// bursts of empty lock/unlock cycles that run the tokens ahead of the server clock, and frequent empty restarts of Redis: the token check holds across
/// them. Seeds as for [`mixed_leases_on_one_lock`].
#[test]
fn largest_blocks_across_empty_restarts() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_MIX_SEED",
        "LOCKSMITH_MODEL_MIX_SEEDS",
        &[1],
    );
    run_seeds_with(&seeds, &Settings::blocks(mix_secs()));
}

/// Every lock type while the server's wall clock is stepped back (0.2 to 4 s) and forward
/// (0.2 to 5 s) between the other faults: tokens rise across every step, and only a forward
/// step excuses an overlap (it ends leases early, as a forced unlock of every lock would; the
/// holder must learn of it within a lease). Seeds as for [`mixed_leases_on_one_lock`].
#[test]
fn server_clock_steps() {
    let seeds = seeds_from_env(
        "LOCKSMITH_MODEL_MIX_SEED",
        "LOCKSMITH_MODEL_MIX_SEEDS",
        &[1],
    );
    run_seeds_with(&seeds, &Settings::clock_steps(mix_secs()));
}

// Regression seeds: each found a defect of the library. The run time and the lock types are
// part of the plan, so each runs with the seconds it was found with, and the seeds found
// before the model knew the other lock types run with plain mutexes only.

/// The plain mutex plans of a regression seed found before the other lock types.
fn run_mutex_seed(seed: u64, secs: u64) {
    run_seeds_with(&[seed], &Settings::mutex_only(secs));
}

/// Re-entry through a handle with a shorter fixed lease (`with_lease`) under an outer
/// watchdog or longer fixed lease: the outer guard stayed `is_held()` after the server's key
/// had expired by the inner lease, and another process took the lock (an overlap).
#[test]
fn seed_6_reentry_with_a_shorter_lease_overlaps() {
    run_mutex_seed(6, 10);
}

/// Redis stopped for 3.7 s: `unlock()` returned after about three timeouts (waiting for the
/// renewal in flight, then the release and its retry) instead of one.
#[test]
fn seed_25_unlock_past_its_bound_under_a_stopped_redis() {
    run_mutex_seed(25, 10);
}

/// The proxy black-holed for 3.8 s: a `lock()` returned its error about 1.4 s past its retry
/// timeout (plus one command and connect timeout), after the network was back.
#[test]
fn seed_1795419263006_lock_past_its_retry_timeout() {
    run_mutex_seed(1_795_419_263_006, 15);
}

/// Redis restarted empty while a thread held a read lock; the thread read again, and the
/// re-entry was counted locally on the lost read hold, so it said "held" while another
/// process's writer took the lock (an overlap). Shows about 2 runs in 3 before the fix.
#[test]
fn seed_1795630959026_read_reentry_after_an_empty_restart_overlaps() {
    // Found before forced unlocks were part of the plan.
    let settings = Settings {
        force: false,
        ..Settings::new(10)
    };
    run_seeds_with(&[1_795_630_959_026], &settings);
}

/// A section recorded by hand around one `lock()`. `work` runs while the guard is held; it
/// returns true to claim, without asking `is_held()`, that the lock was held until it returned
/// (the planted bug), false to end the section honestly with a last check.
fn hand_section(
    client: &locksmith::Client,
    owner: &str,
    lease: Option<Duration>,
    work: impl FnOnce() -> bool,
) -> Section {
    let base = client.mutex("model:planted").unwrap();
    let m = match lease {
        Some(d) => base.with_lease(d).unwrap(),
        None => base,
    };
    let call_start = mono_ns();
    let guard = m.lock().unwrap();
    let start = mono_ns();
    let at = mono_ns();
    let mut end = if guard.is_held() { at } else { 0 };
    // `work` returns whether to trust the holder without asking (the planted bug).
    let blind = work();
    let at = mono_ns();
    if end != 0 && (blind || guard.is_held()) {
        end = at;
    }
    let section = Section {
        name: m.name().to_string(),
        owner: owner.into(),
        token: guard.fencing_token(),
        call_start,
        start,
        end,
        told: 0,
        depth: 0,
        handle: format!("{lease:?}"),
        access: check::Access::Excl,
    };
    drop(guard);
    section
}

/// Runs the two-owner scene: A takes the lock with a 1 s fixed lease and keeps it until B,
/// whose `lock()` returns once A's lease ran out, has started its section. `blind`: A then
/// claims its section lasted until now without asking `is_held()` (a bug planted in the user,
/// not the library).
fn planted_scene(blind: bool) -> Vec<Finding> {
    let server = common::RedisServer::start();
    let url = server.url();
    let (a_holds, b_waits) = mpsc::channel();
    let (b_started, a_waits) = mpsc::channel();
    let url_a = url.clone();
    let a = thread::spawn(move || {
        let client = locksmith::Client::open(&url_a).unwrap();
        hand_section(&client, "a", Some(Duration::from_secs(1)), || {
            a_holds.send(()).unwrap();
            a_waits.recv_timeout(Duration::from_secs(20)).unwrap();
            blind
        })
    });
    let b = thread::spawn(move || {
        let client = locksmith::Client::open(&url).unwrap();
        b_waits.recv_timeout(Duration::from_secs(20)).unwrap();
        hand_section(&client, "b", None, || {
            b_started.send(()).unwrap();
            false
        })
    });
    let history = History {
        sections: vec![a.join().unwrap(), b.join().unwrap()],
        ..History::default()
    };
    check::check(&history, 0)
}

/// The checker catches a real overlap on a real server, and only that one.
#[test]
fn planted_overlap_is_caught() {
    let found = common::with_deadline(Duration::from_secs(30), || planted_scene(true));
    assert!(
        matches!(found.as_slice(), [Finding::Overlap { .. }]),
        "the planted overlap was not found: {found:?}"
    );
    // The same scene with an honest holder: it learns of the loss, nothing overlaps.
    let found = common::with_deadline(Duration::from_secs(30), || planted_scene(false));
    assert!(found.is_empty(), "{found:?}");
}
