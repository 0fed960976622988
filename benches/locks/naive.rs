//! The lock people write by hand, as the baseline: `SET key token NX PX lease`; on failure
//! sleep 100 ms and try again; release by a compare-and-delete script. No renewal (a
//! hand-written one, one compare-and-`PEXPIRE` round trip per lock, is in the renewal
//! workload).

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The sleep between attempts.
pub const RETRY: Duration = Duration::from_millis(100);

/// Compare-and-delete.
pub const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
/// Compare-and-extend.
pub const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";

/// Loads both scripts (once per server, before any measurement).
pub fn load_scripts(con: &mut redis::Connection) -> redis::RedisResult<()> {
    for s in [RELEASE, RENEW] {
        redis::Script::new(s).load(con)?;
    }
    Ok(())
}

pub fn sha(script: &str) -> String {
    redis::Script::new(script).get_hash().to_owned()
}

/// The key of the naive lock called `name`.
pub fn key(name: &str) -> String {
    format!("naive:{{{name}}}:lock")
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// One naive lock handle on its own connection.
pub struct NaiveLock {
    con: redis::Connection,
    key: String,
    lease_ms: u64,
    release_sha: String,
}

impl std::fmt::Debug for NaiveLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NaiveLock").field("key", &self.key).finish()
    }
}

impl NaiveLock {
    pub fn new(url: &str, name: &str, lease: Duration) -> redis::RedisResult<NaiveLock> {
        Ok(NaiveLock {
            con: locksmith_testkit::connect(url, Duration::from_secs(5))?,
            key: key(name),
            lease_ms: lease.as_millis() as u64,
            release_sha: sha(RELEASE),
        })
    }

    /// Points this handle (and its connection) at another lock.
    pub fn set_name(&mut self, name: &str) {
        self.key = key(name);
    }

    /// One `SET NX PX`; the token when acquired.
    pub fn try_acquire(&mut self) -> redis::RedisResult<Option<String>> {
        let token = format!(
            "{}:{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let r: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms)
            .query(&mut self.con)?;
        Ok(r.map(|_| token))
    }

    /// Tries, sleeping [`RETRY`] between attempts, until `deadline`. `first_miss` runs once,
    /// after the first failed attempt.
    pub fn acquire_until(
        &mut self,
        deadline: Instant,
        mut first_miss: impl FnMut(),
    ) -> redis::RedisResult<Option<String>> {
        let mut missed = false;
        loop {
            if let Some(t) = self.try_acquire()? {
                return Ok(Some(t));
            }
            if !missed {
                missed = true;
                first_miss();
            }
            if Instant::now() + RETRY > deadline {
                return Ok(None);
            }
            thread::sleep(RETRY);
        }
    }

    /// Compare-and-delete; true when this token still held it.
    pub fn release(&mut self, token: &str) -> redis::RedisResult<bool> {
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(&self.key)
            .arg(token)
            .query(&mut self.con)?;
        Ok(n == 1)
    }
}
