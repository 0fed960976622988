//! Bounded waiting: every blocking step of a test has a bound, so that a hang fails the test
//! instead of stalling CI.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// Runs `f` on a new thread and returns its result.
///
/// # Panics
/// If `f` does not finish within `dur` (the thread is left behind), or if `f` panics (the
/// panic is resumed here).
pub fn with_deadline<T, F>(dur: Duration, f: F) -> T
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let name = thread::current()
        .name()
        .unwrap_or("with_deadline")
        .to_string();
    let handle = thread::Builder::new()
        .name(name)
        .spawn(move || {
            let _ = tx.send(f());
        })
        .unwrap();
    match rx.recv_timeout(dur) {
        Ok(value) => {
            handle.join().unwrap();
            value
        }
        Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the closure neither returned nor panicked"),
        },
        Err(RecvTimeoutError::Timeout) => panic!("did not finish within {dur:?} (hang?)"),
    }
}

/// Polls `cond` every 5 ms until it is true (returns true) or `dur` passes (returns false).
pub fn wait_until(dur: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + dur;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_deadline_returns_and_resumes_panics() {
        assert_eq!(with_deadline(Duration::from_secs(5), || 7), 7);
        let r = std::panic::catch_unwind(|| with_deadline(Duration::from_secs(5), || panic!("x")));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| {
            with_deadline(Duration::from_millis(20), || {
                thread::sleep(Duration::from_millis(300));
            })
        });
        assert!(r.is_err());
    }

    #[test]
    fn wait_until_is_bounded() {
        assert!(wait_until(Duration::ZERO, || true));
        let start = Instant::now();
        assert!(!wait_until(Duration::from_millis(30), || false));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
