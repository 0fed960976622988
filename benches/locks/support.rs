//! Plumbing of the `locks` benchmark: sample statistics and a tap on the library's log. The
//! server, Redis statistics, clocks and thread figures come from `locksmith-testkit`,
//! re-exported here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use locksmith_testkit::{
    RedisServer, Rng, Stats, calls_by_command, client_level, connect, failed_by_command,
    new_thread_named, numsub, pin, process_cpu_ns, realtime_ns, rss_kib, script_stat, stat,
    stats_brief, stats_delta, stats_total, tasks, thread_count, thread_cpu_ns, usec_by_command,
};

// ---------------------------------------------------------------------------------------------
// Samples
// ---------------------------------------------------------------------------------------------

/// Nearest-rank percentile of sorted samples (`p` in 0..=1).
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// ---------------------------------------------------------------------------------------------
// A tap on the library's log
// ---------------------------------------------------------------------------------------------

/// Counts the renewal thread's batches (its `trace` line "renewed a batch of N leases") while
/// enabled, and prints and counts warnings.
#[derive(Debug)]
pub struct LogTap {
    pub batches: AtomicU64,
    pub leases: AtomicU64,
    pub warnings: AtomicU64,
    tracing: AtomicBool,
    pub tag: &'static str,
}

pub static LOG: LogTap = LogTap {
    batches: AtomicU64::new(0),
    leases: AtomicU64::new(0),
    warnings: AtomicU64::new(0),
    tracing: AtomicBool::new(false),
    tag: "bench",
};

impl LogTap {
    pub fn install() {
        let _ = log::set_logger(&LOG);
        log::set_max_level(log::LevelFilter::Warn);
    }

    /// Starts counting renewal batches (from zero).
    pub fn trace_renewals(&self, on: bool) {
        self.batches.store(0, Ordering::SeqCst);
        self.leases.store(0, Ordering::SeqCst);
        self.tracing.store(on, Ordering::SeqCst);
        log::set_max_level(if on {
            log::LevelFilter::Trace
        } else {
            log::LevelFilter::Warn
        });
    }

    pub fn batches(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::SeqCst),
            self.leases.load(Ordering::SeqCst),
        )
    }
}

impl log::Log for LogTap {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
            || (self.tracing.load(Ordering::Relaxed)
                && m.target().starts_with("locksmith::renewal"))
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn {
            self.warnings.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "[{} pid {} {}] {}: {}",
                self.tag,
                std::process::id(),
                r.level(),
                r.target(),
                r.args()
            );
            return;
        }
        if r.level() == log::Level::Trace
            && self.tracing.load(Ordering::Relaxed)
            && r.target().starts_with("locksmith::renewal")
        {
            let msg = r.args().to_string();
            if let Some(n) = msg
                .strip_prefix("renewed a batch of ")
                .and_then(|m| m.split_whitespace().next())
                .and_then(|n| n.parse::<u64>().ok())
            {
                self.batches.fetch_add(1, Ordering::Relaxed);
                self.leases.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    fn flush(&self) {}
}

/// An error as the bench reports it: its text.
pub fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Redis's CPU time so far (`used_cpu_user` + `used_cpu_sys` of `INFO cpu`), in µs.
pub(crate) fn redis_cpu_us(con: &mut redis::Connection) -> Result<f64, String> {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).map_err(s)?;
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(':')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    match (field("used_cpu_user"), field("used_cpu_sys")) {
        (Some(u), Some(y)) => Ok((u + y) * 1e6),
        _ => Err("INFO cpu without used_cpu_user/used_cpu_sys".into()),
    }
}

/// The time Redis spent so far running the commands named in `sent` (lower case, as `INFO
/// commandstats` names them: what a client sends, never what its scripts call, which Redis
/// counts under their own names too and in the script's time), in µs: Redis's CPU time less
/// this is its socket I/O and event loop, and the commands of others.
pub(crate) fn redis_command_us(con: &mut redis::Connection, sent: &[&str]) -> Result<f64, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .map_err(s)?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if !sent.contains(&name) {
                return None;
            }
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("usec="))?
                .parse::<f64>()
                .ok()
        })
        .sum())
}

/// This process's CPU time so far (user + system, all threads), in µs; 0 where `/proc` does not
/// tell.
pub(crate) fn process_cpu_us() -> f64 {
    process_cpu_ns().map_or(0.0, |ns| ns as f64 / 1e3)
}
