//! No overselling: buyers in two processes race for the last items in stock. Each checks the
//! count and, if an item is left, takes one. Without a lock more items are sold than exist and
//! the stock goes negative; with the lock exactly the stock is sold.
//!
//! ```text
//! cargo run --example stock_deduction
//! ```

#[path = "support/mod.rs"]
mod support;

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use locksmith::Client;
use redis::Commands;

/// The stock count and the number of items sold (the example's own data).
const STOCK: &str = "locksmith-example:sku-1234:stock";
const SOLD: &str = "locksmith-example:sku-1234:sold";
/// The lock every buyer takes, in every process.
const LOCK: &str = "example:sku-1234";

const ITEMS: i64 = 10;
const BUYERS: usize = 30;
/// The time between checking the stock and taking an item (payment, a reservation call). It
/// widens the race so that it shows.
const WORK: Duration = Duration::from_millis(5);

fn main() -> support::Result<()> {
    let redis = support::redis();
    // Two clients stand for two processes, possibly on two machines, sharing one Redis.
    let processes = [Client::open(redis.url())?, Client::open(redis.url())?];
    println!("{BUYERS} buyers in 2 processes want one item each; {ITEMS} are in stock");

    for locked in [false, true] {
        let (sold, stock) = sell(&redis, &processes, locked)?;
        let how = if locked {
            "with the lock: "
        } else {
            "without a lock:"
        };
        let verdict = if sold > ITEMS {
            format!("oversold by {}", sold - ITEMS)
        } else {
            "no oversell".to_owned()
        };
        println!("{how} sold {sold} of {ITEMS}, stock left {stock} ({verdict})");
        if locked && (sold != ITEMS || stock != 0) {
            return Err("the locked run oversold".into());
        }
    }

    let _: usize = redis.connection()?.del(&[STOCK, SOLD])?;
    redis.tell_what_is_left(&[LOCK])?;
    Ok(())
}

/// Restocks, lets every buyer try once, all starting together, and returns (sold, stock left).
fn sell(
    redis: &support::Redis,
    processes: &[Client; 2],
    locked: bool,
) -> support::Result<(i64, i64)> {
    let mut conn = redis.connection()?;
    let () = conn.set(STOCK, ITEMS)?;
    let () = conn.set(SOLD, 0)?;
    let start = Barrier::new(BUYERS);
    support::on_threads(BUYERS, |i| {
        let mut conn = redis.connection()?;
        let item = processes[i % processes.len()].mutex(LOCK)?;
        start.wait();
        if locked {
            let _guard = item.lock()?;
            buy_one(&mut conn)
            // `_guard` is dropped here, which releases the lock.
        } else {
            buy_one(&mut conn)
        }
    })?;
    Ok((conn.get(SOLD)?, conn.get(STOCK)?))
}

/// Check, then act: correct only when nobody else runs it at the same time.
fn buy_one(conn: &mut redis::Connection) -> support::Result<bool> {
    let stock: i64 = conn.get(STOCK)?;
    if stock <= 0 {
        return Ok(false);
    }
    thread::sleep(WORK);
    let _: i64 = conn.decr(STOCK, 1)?;
    let _: i64 = conn.incr(SOLD, 1)?;
    Ok(true)
}
