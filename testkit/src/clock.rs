//! Clocks that every process of one host reads alike, so that times taken in different
//! processes compare.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds of CLOCK_MONOTONIC, comparable across the processes of one host.
///
/// `Instant` is CLOCK_MONOTONIC on Linux but opaque; its `Debug` form shows the raw
/// `timespec` (`Instant { tv_sec: 1707, tv_nsec: 82454016 }`), which is read here without
/// `unsafe` or `libc`. Should that form ever change, this falls back to the wall clock
/// (CLOCK_REALTIME, also one clock per host; fine for intervals of milliseconds unless NTP
/// steps it during a test). Every process runs the same binary, so all use the same source.
pub fn mono_ns() -> u64 {
    let now = Instant::now();
    let s = format!("{now:?}");
    let field = |name: &str| -> Option<u64> {
        let at = s.find(name)? + name.len();
        let digits: String = s[at..]
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    match (field("tv_sec:"), field("tv_nsec:")) {
        (Some(sec), Some(nsec)) => sec * 1_000_000_000 + nsec,
        _ => {
            let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            u64::try_from(d.as_nanos()).unwrap()
        }
    }
}

/// Milliseconds between two [`mono_ns`] stamps (signed).
pub fn ms_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

/// CLOCK_REALTIME in nanoseconds since the epoch: the one clock every process of this host
/// reads alike through `SystemTime` (`Instant` is CLOCK_MONOTONIC on Linux but cannot be sent
/// to another process as it is).
pub fn realtime_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn mono_clock_is_monotonic_and_not_the_wall_clock() {
        let a = mono_ns();
        thread::sleep(Duration::from_millis(5));
        let b = mono_ns();
        assert!(b >= a + 4_000_000, "{a} {b}");
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(b < wall / 2, "fell back to the wall clock");
    }

    #[test]
    fn realtime_is_the_wall_clock() {
        assert!(realtime_ns() > 1_600_000_000_000_000_000);
    }
}
