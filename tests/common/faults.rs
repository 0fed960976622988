//! What the fault tests (`tests/fault_*.rs`) share beyond `locksmith-testkit`: the slack for a
//! busy machine, the library's scripts, a holder thread and waiter threads.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use locksmith::Error;

/// Allowance for scheduling delays on a busy 2-core machine running four tests at once.
pub const SLACK: Duration = Duration::from_millis(400);

/// The acquire script, as the library sends it.
pub static ACQUIRE_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("acquire.lua").unwrap());
/// The release script.
pub static RELEASE_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("release.lua").unwrap());
/// The renewal script.
pub static RENEW_LUA: std::sync::LazyLock<&str> =
    std::sync::LazyLock::new(|| locksmith_testkit::lua_source("renew.lua").unwrap());

/// The SHA1 of a script.
pub fn sha(src: &str) -> String {
    redis::Script::new(src).get_hash().to_string()
}

/// Loads the three scripts, so that no `NOSCRIPT` round trip shows up in a `MONITOR` count.
pub fn preload_scripts(conn: &mut redis::Connection) {
    for src in [*ACQUIRE_LUA, *RELEASE_LUA, *RENEW_LUA] {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .exec(conn)
            .unwrap();
    }
}

/// A holder thread: guards are `!Send`, so the guard lives on its own thread, which watches
/// `is_held()` every 2 ms and unlocks when told.
pub struct Holder {
    pub token: u64,
    /// First time `is_held()` was seen false (a loss), if any.
    lost_at: Arc<Mutex<Option<Instant>>>,
    unlock_tx: Sender<()>,
    result_rx: Receiver<(Result<(), Error>, Duration)>,
}

impl Holder {
    /// Locks `mutex` on a new thread and returns once it holds it.
    pub fn start(mutex: locksmith::Mutex) -> Holder {
        let (tok_tx, tok_rx) = mpsc::channel();
        let (unlock_tx, unlock_rx) = mpsc::channel::<()>();
        let (result_tx, result_rx) = mpsc::channel();
        let lost_at = Arc::new(Mutex::new(None));
        let lost = Arc::clone(&lost_at);
        thread::spawn(move || {
            let g = mutex.lock().unwrap();
            tok_tx.send(g.fencing_token()).unwrap();
            loop {
                if !g.is_held() {
                    let mut l = lost.lock().unwrap();
                    if l.is_none() {
                        *l = Some(Instant::now());
                    }
                }
                match unlock_rx.recv_timeout(Duration::from_millis(2)) {
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
            let start = Instant::now();
            let r = g.unlock();
            let _ = result_tx.send((r, start.elapsed()));
        });
        let token = tok_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Holder {
            token,
            lost_at,
            unlock_tx,
            result_rx,
        }
    }

    /// When `is_held()` was first seen false, if it was.
    pub fn lost_at(&self) -> Option<Instant> {
        *self.lost_at.lock().unwrap()
    }

    /// Unlocks on the holder thread; the result and how long `unlock()` took.
    pub fn unlock(self) -> (Result<(), Error>, Duration) {
        self.unlock_tx.send(()).unwrap();
        self.result_rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap()
    }
}

/// What a waiter thread saw: when its call returned, the token if it got the lock, how long
/// the call took.
#[derive(Debug)]
pub struct WaitOutcome {
    pub at: Instant,
    pub token: Option<u64>,
    pub took: Duration,
}

/// Starts a waiter thread: `try_lock_for(wait)`, hold for `hold`, unlock.
pub fn spawn_waiter(
    mutex: locksmith::Mutex,
    wait: Duration,
    hold: Duration,
    tx: Sender<WaitOutcome>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let start = Instant::now();
        let r = mutex.try_lock_for(wait);
        let at = Instant::now();
        match r {
            Ok(Some(g)) => {
                assert!(g.is_held(), "a waiter got a guard that is not held");
                let token = g.fencing_token();
                thread::sleep(hold);
                let _ = tx.send(WaitOutcome {
                    at,
                    token: Some(token),
                    took: at - start,
                });
                let _ = g.unlock();
            }
            Ok(None) => {
                let _ = tx.send(WaitOutcome {
                    at,
                    token: None,
                    took: at - start,
                });
            }
            Err(e) => panic!("waiter failed: {e}"),
        }
    })
}
