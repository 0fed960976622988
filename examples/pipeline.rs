//! Locks and a thread pool: a dispatcher takes the lock of each job and hands job and lock to a
//! pool thread (through a `crossbeam-channel` work queue), which does the work and releases the
//! lock; each job fans out to scoped threads that check the guard and stamp their writes with
//! its fencing token.
//!
//! ```text
//! cargo run --example pipeline
//! ```
//!
//! A guard belongs to the thread that locked. `detach` lets that thread go of the hold (a
//! `Detached`, which is `Send`), and `attach` makes the pool thread its owner; meanwhile the
//! lease keeps being renewed. Scoped threads borrow the guard (it is `Sync`) to check it.

#[path = "support/mod.rs"]
mod support;

use std::thread;
use std::time::Duration;

use locksmith::{Client, Detached, MutexGuard};
use redis::Commands;

/// The jobs: one report per region, each written as four partitions.
const JOBS: [&str; 5] = ["north", "south", "east", "west", "central"];
const PARTITIONS: usize = 4;
const POOL: usize = 3;
/// The example's own data: `locksmith-example:pipeline:<job>`, a hash partition -> stamp.
const OUT: &str = "locksmith-example:pipeline:";

fn main() -> support::Result<()> {
    let redis = support::redis();
    let client = Client::open(redis.url())?;
    cleanup(&redis)?;

    let (queue, jobs) = crossbeam_channel::unbounded::<(&str, Detached<MutexGuard>)>();
    let pool: Vec<_> = (0..POOL)
        .map(|i| {
            let jobs = jobs.clone();
            let url = redis.url().to_owned();
            thread::Builder::new().name(format!("pool-{i}")).spawn(
                move || -> support::Result<usize> {
                    let mut data = redis::Client::open(url)?.get_connection()?;
                    let mut done = 0;
                    for (job, held) in jobs {
                        // This thread owns the hold from here: it may re-enter it and must
                        // release it.
                        let guard = held.attach()?;
                        run(job, &guard, &mut data)?;
                        guard.unlock()?;
                        done += 1;
                    }
                    Ok(done)
                },
            )
        })
        .collect::<Result<_, _>>()?;
    drop(jobs);

    // The dispatcher: one lock per job, taken here and released by the pool thread that runs it.
    let dispatcher = {
        let client = client.clone();
        thread::spawn(move || -> support::Result<()> {
            for job in JOBS {
                let guard = client.mutex(&format!("example:pipeline:{job}"))?.lock()?;
                println!(
                    "dispatcher: took job `{job}` (token {})",
                    guard.fencing_token()
                );
                let held = guard
                    .detach()
                    .map_err(|_| "a guard taken once is held once")?;
                queue.send((job, held))?;
            }
            Ok(())
        })
    };
    dispatcher.join().map_err(|_| "the dispatcher panicked")??;
    let mut total = 0;
    for t in pool {
        total += t.join().map_err(|_| "a pool thread panicked")??;
    }

    let mut data = redis::Client::open(redis.url())?.get_connection()?;
    for job in JOBS {
        let stamps: Vec<String> = data.hvals(format!("{OUT}{job}"))?;
        let tokens: std::collections::BTreeSet<&str> =
            stamps.iter().filter_map(|s| s.split(':').next()).collect();
        println!(
            "job `{job}`: {} partitions written, all under one token: {}",
            stamps.len(),
            tokens.len() == 1
        );
        assert_eq!((stamps.len(), tokens.len()), (PARTITIONS, 1));
    }
    println!("{total} jobs run by {POOL} pool threads; every lock released by its pool thread");
    cleanup(&redis)?;
    let locks: Vec<String> = JOBS
        .iter()
        .map(|j| format!("example:pipeline:{j}"))
        .collect();
    redis.tell_what_is_left(&locks.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Runs `job` under `guard`: scoped threads write its partitions, each checking the lease right
/// before its write and stamping it with the fencing token, which a store that refuses older
/// tokens would compare.
fn run(job: &str, guard: &MutexGuard, data: &mut redis::Connection) -> support::Result<()> {
    let token = guard.fencing_token();
    let stamps: Vec<String> = thread::scope(|s| {
        let parts: Vec<_> = (0..PARTITIONS)
            .map(|p| {
                s.spawn(move || -> locksmith::Result<String> {
                    thread::sleep(Duration::from_millis(10)); // the partition's work
                    guard.check()?;
                    Ok(format!("{}:{job}-{p}", guard.fencing_token()))
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a partition panicked")?
                    .map_err(Into::into)
            })
            .collect::<support::Result<_>>()
    })?;
    for (p, stamp) in stamps.iter().enumerate() {
        let _: () = data.hset(format!("{OUT}{job}"), p, stamp)?;
    }
    println!(
        "{}: ran `{job}` under token {token}",
        thread::current().name().unwrap_or("?")
    );
    Ok(())
}

/// Deletes the example's data.
fn cleanup(redis: &support::Redis) -> support::Result<()> {
    let mut data = redis::Client::open(redis.url())?.get_connection()?;
    for job in JOBS {
        let _: () = data.del(format!("{OUT}{job}"))?;
    }
    Ok(())
}
