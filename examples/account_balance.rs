//! Lost updates, and how a lock prevents them: threads in two processes deposit into one account
//! balance kept in Redis by read-modify-write (`GET`, work, `SET`). Without a lock deposits get
//! lost; with one the balance is exact.
//!
//! ```text
//! cargo run --example account_balance
//! ```

#[path = "support/mod.rs"]
mod support;

use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;
use redis::Commands;

/// Where the balance lives (the example's own data).
const BALANCE: &str = "locksmith-example:account:42:balance";
/// The lock every depositor takes, in every process.
const LOCK: &str = "example:account:42";

const THREADS: usize = 8;
const DEPOSITS_PER_THREAD: i64 = 25;
const AMOUNT: i64 = 10;
/// The time between reading the balance and writing it back: in a real program, the work done
/// there (validation, a call to another service). It widens the race so that it shows.
const WORK: Duration = Duration::from_millis(2);

fn main() -> support::Result<()> {
    let redis = support::redis();
    // Two clients stand for two processes, possibly on two machines, sharing one Redis.
    let processes = [Client::open(redis.url())?, Client::open(redis.url())?];

    let expected = THREADS as i64 * DEPOSITS_PER_THREAD * AMOUNT;
    println!(
        "{THREADS} threads in 2 processes each deposit {AMOUNT} x {DEPOSITS_PER_THREAD} times"
    );

    let (actual, took) = run(&redis, &processes, false)?;
    println!(
        "without a lock: expected {expected}, actual {actual} ({} deposits lost) in {took:.0?}",
        (expected - actual) / AMOUNT
    );

    let (actual, took) = run(&redis, &processes, true)?;
    println!("with the lock:  expected {expected}, actual {actual} in {took:.0?}");

    let _: usize = redis.connection()?.del(BALANCE)?;
    redis.tell_what_is_left(&[LOCK])?;
    if actual != expected {
        return Err("the locked run lost deposits".into());
    }
    Ok(())
}

/// Sets the balance to 0, runs every depositor, and returns the final balance.
fn run(
    redis: &support::Redis,
    processes: &[Client; 2],
    locked: bool,
) -> support::Result<(i64, Duration)> {
    let mut conn = redis.connection()?;
    let () = conn.set(BALANCE, 0)?;
    let start = Instant::now();
    support::on_threads(THREADS, |i| {
        deposit_all(redis, &processes[i % processes.len()], locked)
    })?;
    let took = start.elapsed();
    Ok((conn.get(BALANCE)?, took))
}

/// One depositor: a thread with its own Redis connection for the data.
fn deposit_all(redis: &support::Redis, client: &Client, locked: bool) -> support::Result<()> {
    let mut conn = redis.connection()?;
    let account = client.mutex(LOCK)?;
    for _ in 0..DEPOSITS_PER_THREAD {
        if locked {
            let _guard = account.lock()?;
            deposit(&mut conn)?;
            // `_guard` is dropped here, which releases the lock.
        } else {
            deposit(&mut conn)?;
        }
    }
    Ok(())
}

/// Read, work, write: correct only when nobody else runs it at the same time.
fn deposit(conn: &mut redis::Connection) -> support::Result<()> {
    let balance: i64 = conn.get(BALANCE)?;
    thread::sleep(WORK);
    let () = conn.set(BALANCE, balance + AMOUNT)?;
    Ok(())
}
