//! Plumbing of the `locks` benchmark: a private `redis-server`, child processes, Redis
//! statistics, clocks, per-thread CPU time, a log tap, the naive lock, and the report.

pub mod child;
pub mod family;
pub mod naive;
pub mod report;

use std::collections::{BTreeMap, HashSet};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// ---------------------------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------------------------

/// A `redis-server` on a free port of 127.0.0.1, without persistence; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server (on CPU `cpu` when given) and waits (at most 10 s) until it answers
    /// `PING`.
    pub fn start(cpu: Option<usize>) -> Result<RedisServer, String> {
        let dir = std::env::temp_dir().join(format!(
            "locksmith-bench-{}-{}",
            std::process::id(),
            realtime_ns()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
        let mut server = RedisServer {
            port: 0,
            dir,
            child: None,
        };
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn_and_wait(cpu) {
                Ok(()) => return Ok(server),
                Err(e) => {
                    last = e;
                    server.kill();
                }
            }
        }
        Err(format!("could not start redis-server: {last}"))
    }

    fn spawn_and_wait(&mut self, cpu: Option<usize>) -> Result<(), String> {
        let port = self.port.to_string();
        // `taskset -c N redis-server ...` execs the server in place: same pid.
        let mut cmd = match cpu {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.arg("-c").arg(c.to_string()).arg("redis-server");
                cmd
            }
            None => Command::new("redis-server"),
        };
        let child = cmd
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn redis-server (is it installed?): {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!("redis-server exited: {status}"));
            }
            if let Ok(mut con) = connect(&self.url(), Duration::from_millis(200))
                && matches!(redis::cmd("PING").query::<String>(&mut con), Ok(s) if s == "PONG")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING within 10 s".into());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's version string (`redis_version` of `INFO server`).
    pub fn version(&self) -> String {
        let Ok(mut con) = connect(&self.url(), Duration::from_secs(5)) else {
            return "?".into();
        };
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Pins every thread of process `pid` (and so the threads and children it starts later) to
/// CPU `cpu`, with `taskset`. False when that is not possible.
pub fn pin(pid: u32, cpu: usize) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> Result<u16, String> {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let port = l
            .local_addr()
            .map_err(|e| format!("local_addr: {e}"))?
            .port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

/// A plain connection with read/write timeouts of `timeout` (at least 5 s for commands).
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(timeout)?;
    let t = Some(timeout.max(Duration::from_secs(5)));
    con.set_read_timeout(t)?;
    con.set_write_timeout(t)?;
    Ok(con)
}

// ---------------------------------------------------------------------------------------------
// INFO commandstats
// ---------------------------------------------------------------------------------------------

/// `INFO commandstats` as command name (`evalsha`, `client|setinfo`, ...) -> calls. Commands
/// run inside scripts are counted too (by the command they run).
pub type Stats = BTreeMap<String, u64>;

pub fn commandstats(con: &mut redis::Connection) -> Stats {
    commandstats_field(con, "calls")
}

/// Like [`commandstats`], for calls that failed (for example `NOSCRIPT`) or were rejected.
pub fn failedstats(con: &mut redis::Connection) -> Stats {
    let mut failed = commandstats_field(con, "failed_calls");
    for (k, v) in commandstats_field(con, "rejected_calls") {
        *failed.entry(k).or_default() += v;
    }
    failed
}

/// Like [`commandstats`], for the microseconds Redis spent executing each command.
pub fn usecstats(con: &mut redis::Connection) -> Stats {
    commandstats_field(con, "usec")
}

fn commandstats_field(con: &mut redis::Connection, field: &str) -> Stats {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_default();
    let prefix = format!("{field}=");
    let mut out = Stats::new();
    for line in info.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        for f in rest.split(',') {
            if let Some(v) = f.strip_prefix(&prefix) {
                out.insert(name.to_owned(), v.parse().unwrap_or(0));
            }
        }
    }
    out
}

/// `after - before`, per command, without the harness's own `INFO` and `PUBSUB` calls.
pub fn stats_delta(before: &Stats, after: &Stats) -> Stats {
    after
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "info" | "pubsub|numsub"))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

pub fn stat(d: &Stats, name: &str) -> u64 {
    d.get(name).copied().unwrap_or(0)
}

pub fn stats_total(d: &Stats) -> u64 {
    d.values().sum()
}

/// Commands that only a client sends (never run inside locksmith's or the naive lock's
/// scripts): script calls, pub/sub, pings and connection set-up.
pub fn client_level(d: &Stats) -> u64 {
    d.iter()
        .filter(|(k, _)| {
            k.starts_with("eval")
                || k.starts_with("client|")
                || k.starts_with("script|")
                || matches!(
                    k.as_str(),
                    "subscribe" | "unsubscribe" | "ping" | "hello" | "select" | "auth"
                )
        })
        .map(|(_, v)| *v)
        .sum()
}

/// Compact `cmd=n, ...` listing of a delta.
pub fn stats_brief(d: &Stats) -> String {
    let mut v: Vec<_> = d.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `PUBSUB NUMSUB channel`.
pub fn numsub(con: &mut redis::Connection, channel: &str) -> u64 {
    let v: redis::RedisResult<(String, u64)> =
        redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query(con);
    v.map(|(_, n)| n).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Clocks, samples, randomness
// ---------------------------------------------------------------------------------------------

/// CLOCK_REALTIME in nanoseconds since the epoch: the one clock every process of this host
/// reads alike (`Instant` is CLOCK_MONOTONIC on Linux but cannot be sent to another process).
pub fn realtime_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

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

/// xorshift64*: jitter for hold times; no crate needed.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        Rng((realtime_ns() as u64) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[lo, hi)`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_nanos().max(1) as u64;
        lo + Duration::from_nanos(self.next() % span)
    }
}

// ---------------------------------------------------------------------------------------------
// Threads of this process
// ---------------------------------------------------------------------------------------------

/// `(tid, comm)` of every thread of this process.
pub fn tasks() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let tid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        Some((tid, comm.trim().to_owned()))
    })
    .collect()
}

pub fn thread_count() -> usize {
    tasks().len()
}

/// The thread called `name` that is not in `before`, waiting up to 2 s for it: a new thread
/// names itself once it runs, which may be after `spawn` returned.
pub fn new_thread_named(before: &[(u32, String)], name: &str) -> Option<u32> {
    let old: HashSet<u32> = before.iter().map(|t| t.0).collect();
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let found = tasks()
            .into_iter()
            .find(|(tid, comm)| comm == name && !old.contains(tid))
            .map(|t| t.0);
        if found.is_some() || Instant::now() > until {
            return found;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// CPU time (user + system) of thread `tid` of this process, in ns: `schedstat` when the
/// kernel has it, else `stat` utime + stime in clock ticks (assumed 100 Hz).
pub fn thread_cpu_ns(tid: u32) -> Option<u64> {
    let base = format!("/proc/self/task/{tid}");
    if let Ok(s) = std::fs::read_to_string(format!("{base}/schedstat"))
        && let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok())
    {
        return Some(ns);
    }
    let stat = std::fs::read_to_string(format!("{base}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the comm: state is field 3 of stat(5), utime 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) * 10_000_000)
}

/// Resident set size of this process in KiB.
pub fn rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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
