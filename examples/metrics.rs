//! Lock metrics exported to Prometheus: the `metrics` feature reports every acquisition, wait,
//! hold, timeout and lost lease through the `metrics` crate's facade; here the
//! `metrics-exporter-prometheus` recorder collects them, and the text a Prometheus server
//! would scrape is printed once at the end (a service would serve it on `/metrics` instead,
//! with the exporter's HTTP listener).
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```
//!
//! In a program of your own: `redis-locksmith = { version = "0.1", features = ["metrics"] }`,
//! and any recorder of the `metrics` ecosystem.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use locksmith::Client;
use metrics_exporter_prometheus::PrometheusBuilder;

fn main() -> support::Result<()> {
    // Buckets for the wait and hold times, in seconds (without them, the exporter reports
    // summaries).
    let prometheus = PrometheusBuilder::new()
        .set_buckets(&[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0])?
        .install_recorder()?;
    let redis = support::redis();
    let client = Client::open(redis.url())?;

    // Four threads take turns on one lock: most acquisitions wait for another thread (some
    // are handed over locally, without a round trip to Redis).
    let lock = client.mutex("example:metrics")?;
    support::on_threads(4, |_| {
        for _ in 0..25 {
            let guard = lock.lock()?;
            std::thread::sleep(Duration::from_millis(1));
            guard.unlock()?;
        }
        Ok(())
    })?;

    // A read lock, a permit, and a call that gives up while another client holds the lock.
    let catalog = client.rw_lock("example:metrics-catalog")?;
    drop(catalog.read()?);
    drop(client.semaphore("example:metrics-pool", 2)?.acquire()?);
    let other = Client::open(redis.url())?;
    let held = other.mutex("example:metrics")?.lock()?;
    assert!(lock.try_lock_for(Duration::from_millis(20))?.is_none());
    held.unlock()?;

    let stats = client.stats();
    println!(
        "Client::stats: {} acquired ({} contended, {} handed over locally), {} timed out, \
         wait p50 {:?} p99 {:?}, hold p99 {:?}\n",
        stats.acquired,
        stats.contended,
        stats.acquired_locally,
        stats.timed_out,
        stats.wait.p50(),
        stats.wait.p99(),
        stats.hold.p99()
    );
    println!("What Prometheus would scrape:\n\n{}", prometheus.render());
    redis.tell_what_is_left(&[
        "example:metrics",
        "example:metrics-catalog",
        "example:metrics-pool",
    ])?;
    Ok(())
}
