//! The randomized model test: several processes x several threads run seeded random operation
//! sequences on a few lock names (every acquire form, re-entry through different handles,
//! `unlock()` and drop, panics while holding, holds that outlive their lease) while a seeded
//! fault plan stops processes and Redis, restarts Redis empty, kills connections, makes Redis
//! sleep and cuts, delays or swallows replies. Every critical section, call and lost-lease
//! callback is logged on one monotonic clock, and a checker asserts: no two owners hold one
//! name at once unless the earlier was told first, tokens increase in grant order, every call
//! keeps its documented time bound, and no thread, connection, channel or key is left over.
//!
//! - `LOCKSMITH_MODEL_SEED=<seed>`: run (replay) that one seed.
//! - `LOCKSMITH_MODEL_SEEDS=<n>` runs n seeds from a clock-derived start (printed), or
//!   `LOCKSMITH_MODEL_SEEDS=<a>,<b>,...` those seeds.
//! - `LOCKSMITH_MODEL_SECS=<s>`: seconds per seed (default 10; part of the plan, so give the
//!   same value to replay).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "model/check.rs"]
mod check;
#[path = "support/checker.rs"]
mod checker;
mod common;
#[path = "model/journal.rs"]
mod journal;
#[path = "model/plan.rs"]
mod plan;
#[path = "support/proxy.rs"]
mod proxy;
#[path = "model/run.rs"]
mod run;
#[path = "model/worker.rs"]
mod worker;

use std::time::{SystemTime, UNIX_EPOCH};

use plan::Settings;

/// The seeds of a plain `cargo test`.
const DEFAULT_SEEDS: [u64; 3] = [1, 2, 3];
/// Seconds per seed unless `LOCKSMITH_MODEL_SECS` says otherwise.
const DEFAULT_SECS: u64 = 10;

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
    let secs = secs();
    let settings = Settings::new(secs);
    let mut failed = Vec::new();
    for &seed in seeds {
        println!("model: seed {seed}, {secs} s");
        let outcome = run::run_seed(seed, &settings);
        println!("model: {}", outcome.report(20));
        if !outcome.findings.is_empty() {
            failed.push(format!(
                "{}\n  replay: LOCKSMITH_MODEL_SEED={seed} LOCKSMITH_MODEL_SECS={secs} \
                 cargo test --test model -- model_seeds",
                outcome.report(10)
            ));
        }
    }
    assert!(failed.is_empty(), "model: {} seed(s) failed:\n{}", failed.len(), failed.join("\n"));
}

/// The default seed set, or the seeds the environment names.
#[test]
fn model_seeds() {
    if let Some(seed) = env_u64("LOCKSMITH_MODEL_SEED") {
        return run_seeds(&[seed]);
    }
    let seeds: Vec<u64> = match std::env::var("LOCKSMITH_MODEL_SEEDS") {
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
        Err(_) => DEFAULT_SEEDS.to_vec(),
    };
    run_seeds(&seeds);
}
