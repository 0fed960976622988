//! The basics: lock a name, read its fencing token, re-enter it, see a second client (another
//! process) refused by `try_lock`, and unlock.
//!
//! ```text
//! cargo run --example quickstart
//! ```
//!
//! In a program of your own: `redis-locksmith = "0.1"` under `[dependencies]`, and the
//! library is `locksmith` (`use locksmith::Client;`).

#[path = "support/mod.rs"]
mod support;

use locksmith::Client;

fn main() -> support::Result<()> {
    let redis = support::redis();

    let client = Client::open(redis.url())?;
    let lock = client.mutex("example:quickstart")?;

    let guard = lock.lock()?;
    println!(
        "locked `{}`: fencing token {}, lease valid for another {:.1?}",
        lock.name(),
        guard.fencing_token(),
        guard.validity()
    );

    // The owning thread may lock again: a nested guard of the same acquisition.
    let nested = lock.lock()?;
    println!(
        "re-entered it: same fencing token {}",
        nested.fencing_token()
    );
    nested.unlock()?;
    println!(
        "left the inner level; the lock is still held: {}",
        lock.is_locked()?
    );

    // A second client is a second owner, as another process on another machine would be.
    let other = Client::open(redis.url())?;
    let same_lock = other.mutex("example:quickstart")?;
    match same_lock.try_lock()? {
        None => println!("second client: try_lock() -> None, someone else holds it"),
        Some(_) => return Err("the second client got a lock that is held".into()),
    }

    guard.unlock()?;
    println!("unlocked");

    let guard = same_lock.lock()?;
    println!(
        "second client: lock() -> held, fencing token {} (larger: a newer holder)",
        guard.fencing_token()
    );
    guard.unlock()?;
    redis.tell_what_is_left(&["example:quickstart"])?;
    Ok(())
}
