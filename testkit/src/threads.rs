//! Threads of this process, from `/proc` (Linux).

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

/// Threads of this process (`Threads:` in `/proc/self/status`).
///
/// # Panics
/// If `/proc/self/status` cannot be read.
pub fn thread_count() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .expect("Threads: line in /proc/self/status")
        .trim()
        .parse()
        .unwrap()
}

/// Waits at most `within` for this process to have `expected` threads, and returns the count
/// last seen. A thread that `join` has returned for may still be counted for a moment (the
/// kernel wakes the joiner before it unlinks the thread), so a count taken right after a join
/// must be waited for, not read once.
pub fn settled_thread_count(expected: usize, within: Duration) -> usize {
    let mut seen = thread_count();
    crate::wait_until(within, || {
        seen = thread_count();
        seen == expected
    });
    seen
}

/// Asserts that the process settles at `expected` threads within 2 s (`what` names the moment
/// in the failure).
#[track_caller]
pub fn assert_threads(expected: usize, what: &str) {
    let seen = settled_thread_count(expected, Duration::from_secs(2));
    assert_eq!(
        seen, expected,
        "{what}: {seen} threads, expected {expected}"
    );
}

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
    stat_cpu_ns(&format!("{base}/stat"))
}

/// CPU time (user + system, every thread) of this process, in ns, from `/proc/self/stat`
/// (clock ticks, assumed 100 Hz: 10 ms steps).
pub fn process_cpu_ns() -> Option<u64> {
    stat_cpu_ns("/proc/self/stat")
}

/// The user CPU time of this process (all its threads: utime alone, without the kernel's
/// work on its behalf), in ns.
pub fn process_user_ns() -> Option<u64> {
    stat_times_ns("/proc/self/stat").map(|(user, _)| user)
}

/// utime + stime of a `stat` file of `/proc` (a process's or a thread's), in ns.
fn stat_cpu_ns(path: &str) -> Option<u64> {
    stat_times_ns(path).map(|(user, system)| user + system)
}

/// (utime, stime) of a `stat` file of `/proc`, in ns.
fn stat_times_ns(path: &str) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the comm: state is field 3 of stat(5), utime 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime * 10_000_000, stime * 10_000_000))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_thread_is_seen_by_name() {
        let before = tasks();
        let n = thread_count();
        assert!(n >= 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let h = thread::Builder::new()
            .name("testkit-probe".into())
            .spawn(move || {
                let _ = rx.recv();
            })
            .unwrap();
        let tid = new_thread_named(&before, "testkit-probe").expect("new thread");
        assert!(thread_cpu_ns(tid).is_some());
        assert!(rss_kib().is_some_and(|k| k > 0));
        drop(tx);
        h.join().unwrap();
    }
}
