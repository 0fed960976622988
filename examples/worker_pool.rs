//! Save once: a pool of workers in two processes takes jobs from a queue in which several jobs
//! name the same record. A per-record lock around "is it saved yet? save, mark saved" makes
//! every record saved exactly once.
//!
//! ```text
//! cargo run --example worker_pool
//! ```

#[path = "support/mod.rs"]
mod support;

use std::thread;
use std::time::Duration;

use crossbeam_channel::Receiver;
use locksmith::Client;
use redis::Commands;

/// How many times each record was saved (the example's own data): a hash, record -> count.
const SAVES: &str = "locksmith-example:saves";
/// The "saved" markers: `locksmith-example:saved:<record>`.
const SAVED: &str = "locksmith-example:saved:";

const RECORDS: [&str; 6] = [
    "invoice-1",
    "invoice-2",
    "invoice-3",
    "invoice-4",
    "invoice-5",
    "invoice-6",
];
/// How many jobs name each record.
const COPIES: usize = 3;
const WORKERS: usize = 4;
/// How long a save takes (a write to another system, an e-mail sent).
const SAVE_TIME: Duration = Duration::from_millis(20);

/// What one worker did.
#[derive(Debug, Default)]
struct Tally {
    saved: usize,
    already_saved: usize,
    waited: usize,
}

fn main() -> support::Result<()> {
    let redis = support::redis();
    // Two clients stand for two processes, possibly on two machines, sharing one Redis.
    let processes = [Client::open(redis.url())?, Client::open(redis.url())?];
    cleanup(&redis)?;

    // Copies of a job come one after the other, so several workers get the same record at once.
    let (queue, jobs) = crossbeam_channel::unbounded();
    for record in RECORDS {
        for _ in 0..COPIES {
            queue.send(record)?;
        }
    }
    drop(queue);
    println!(
        "{WORKERS} workers in 2 processes, {} jobs naming {} records",
        RECORDS.len() * COPIES,
        RECORDS.len()
    );

    let tallies = support::on_threads(WORKERS, |i| {
        work(&redis, &processes[i % processes.len()], &jobs)
    })?;
    for (i, t) in tallies.iter().enumerate() {
        println!(
            "worker {i}: saved {}, found already saved {}, waited for another worker {}",
            t.saved, t.already_saved, t.waited
        );
    }

    let mut conn = redis.connection()?;
    let mut wrong = 0;
    for record in RECORDS {
        let saves: Option<u64> = conn.hget(SAVES, record)?;
        let saves = saves.unwrap_or(0);
        let plural = if saves == 1 { "" } else { "s" };
        println!("{record}: {saves} save{plural}");
        if saves != 1 {
            wrong += 1;
        }
    }
    cleanup(&redis)?;
    let locks: Vec<String> = RECORDS
        .iter()
        .map(|r| format!("example:save:{r}"))
        .collect();
    redis.tell_what_is_left(&locks.iter().map(String::as_str).collect::<Vec<_>>())?;
    if wrong > 0 {
        return Err(format!("{wrong} record(s) were not saved exactly once").into());
    }
    Ok(())
}

/// One worker: takes jobs until the queue is empty.
fn work(redis: &support::Redis, client: &Client, jobs: &Receiver<&str>) -> support::Result<Tally> {
    let mut conn = redis.connection()?;
    let mut tally = Tally::default();
    for record in jobs {
        let lock = client.mutex(&format!("example:save:{record}"))?;
        // Usually nobody else has this record: take the lock without waiting. If another
        // worker (in any process) is saving it right now, wait until it is done.
        let guard = match lock.try_lock()? {
            Some(guard) => guard,
            None => {
                tally.waited += 1;
                lock.lock()?
            }
        };
        // Inside the lock, "check the marker, save, set the marker" is one step for everyone.
        // The marker is set only once the save succeeded: a worker that dies half-way leaves
        // no marker, its lease runs out, and the next job for the record saves it.
        let marker = format!("{SAVED}{record}");
        if conn.exists(&marker)? {
            tally.already_saved += 1;
            continue; // `guard` is dropped here, which releases the lock
        }
        save(&mut conn, record)?;
        guard.check()?; // a save that outlived the lease stops here, leaving no marker
        let first: bool = conn.set_nx(&marker, 1)?;
        if !first {
            return Err(format!("{record} was marked saved by someone else").into());
        }
        tally.saved += 1;
        guard.unlock()?;
    }
    Ok(tally)
}

/// The side effect that must happen once per record.
fn save(conn: &mut redis::Connection, record: &str) -> support::Result<()> {
    thread::sleep(SAVE_TIME);
    let _: i64 = conn.hincr(SAVES, record, 1)?;
    Ok(())
}

/// Deletes the example's data.
fn cleanup(redis: &support::Redis) -> support::Result<()> {
    let mut conn = redis.connection()?;
    let markers: Vec<String> = RECORDS.iter().map(|r| format!("{SAVED}{r}")).collect();
    let _: usize = conn.del(SAVES)?;
    let _: usize = conn.del(&markers)?;
    Ok(())
}
