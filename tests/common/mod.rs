//! Test harness shared by the integration tests.
//!
//! - [`RedisServer`]: a private `redis-server` on a free port (never 6379), killed on `Drop`.
//! - [`unique_name`]: lock names that never collide between tests or runs.
//! - [`commandstats`] / [`script_calls`]: what Redis saw, from `INFO commandstats`.
//! - [`Monitor`]: every command Redis runs, from `MONITOR`, to attribute calls to one key.
//! - [`thread_count`]: threads of this process, from `/proc/self/status`.
//! - [`with_deadline`] / [`wait_until`]: every blocking step is bounded, so a hang fails the
//!   test instead of stalling CI.
//! - [`TestChild`]: re-runs the current test binary as a child process whose entry point is a
//!   `#[test] fn child_xxx()` that returns at once unless [`ROLE_VAR`] names it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The default key prefix of the library.
pub const PREFIX: &str = "locksmith:";

/// How long a starting server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

static COUNTER: AtomicU64 = AtomicU64::new(0);

// ---------------------------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------------------------

/// A `redis-server` child process on a free port of 127.0.0.1, without persistence.
///
/// Dropping it kills and reaps the server and removes its temporary directory. If the current
/// thread is panicking, the tail of the server log is printed first.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits (at most 10 s) until it answers `PING`.
    ///
    /// # Panics
    /// If `redis-server` is not installed, or no server came up after a few ports.
    pub fn start() -> RedisServer {
        ensure_redis_server_installed();
        let mut server = RedisServer {
            port: 0,
            dir: unique_temp_dir(),
            child: None,
        };
        let mut last_err = String::new();
        // The port was free when probed; another process may take it before the server
        // binds, so try a few.
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => {
                    last_err = e;
                    server.kill_child();
                }
            }
        }
        let log = server.log_tail(30);
        panic!("could not start redis-server: {last_err}\n--- redis.log ---\n{log}");
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    ///
    /// # Panics
    /// If the server is stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is stopped").id()
    }

    /// A plain connection for inspection, with 5 s read/write timeouts.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        conn
    }

    /// Kills the server (SIGKILL) and reaps it. All data is lost.
    pub fn stop(&mut self) {
        self.kill_child();
    }

    /// Stops the server if running and starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill_child();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(e) => {
                    self.kill_child();
                    assert!(
                        Instant::now() < deadline,
                        "could not restart redis-server on port {}: {e}\n--- redis.log ---\n{}",
                        self.port,
                        log_tail(&self.dir.join("redis.log"), 30)
                    );
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Freezes the server (SIGSTOP).
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Thaws the server (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), "CONT");
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.dir.join("redis.log"), n)
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("redis-server on port {port} exited: {status}"));
            }
            if ping(&self.url()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}"
                ));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill_child(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process still dies of SIGKILL; SIGCONT anyway so nothing lingers.
            let _ = child.kill();
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "--- redis.log (port {}), last lines ---\n{}",
                self.port,
                self.log_tail(30)
            );
        }
        self.kill_child();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ensure_redis_server_installed() {
    match Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "`redis-server` is not on PATH; the integration tests need it. \
             Install it, e.g. `apt-get install redis-server` (Debian/Ubuntu) \
             or `brew install redis` (macOS)"
        ),
        Err(e) => panic!("cannot run `redis-server --version`: {e}"),
    }
}

fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    matches!(redis::cmd("PING").query::<String>(&mut conn), Ok(s) if s == "PONG")
}

/// A port that was free a moment ago (bind 127.0.0.1:0, read it, release it). Never 6379.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port != 6379 {
            return port;
        }
    }
}

fn unique_temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("locksmith-test-{}", unique_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run `kill`");
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

// ---------------------------------------------------------------------------------------------
// Names and keys
// ---------------------------------------------------------------------------------------------

fn unique_suffix() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{}-{n}-{nanos}", std::process::id())
}

/// A lock name unique to this call: `prefix-PID-COUNTER-NANOS`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", unique_suffix())
}

/// The name as it appears inside the braces of a key: `%`, `{`, `}` percent-encoded.
pub fn encode_name(name: &str) -> String {
    name.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// `P{T}:lock` for the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("{PREFIX}{{{}}}:lock", encode_name(name))
}

/// `P{T}:fence` for the default prefix.
pub fn fence_key(name: &str) -> String {
    format!("{PREFIX}{{{}}}:fence", encode_name(name))
}

/// `P{T}:released` for the default prefix.
pub fn release_channel(name: &str) -> String {
    format!("{PREFIX}{{{}}}:released", encode_name(name))
}

// ---------------------------------------------------------------------------------------------
// Inspection
// ---------------------------------------------------------------------------------------------

/// `INFO commandstats` as `cmdstat_xxx -> calls`.
pub fn commandstats(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    let mut stats = HashMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if !name.starts_with("cmdstat_") {
            continue;
        }
        for field in rest.split(',') {
            if let Some(calls) = field.strip_prefix("calls=") {
                stats.insert(name.to_string(), calls.trim().parse().unwrap());
            }
        }
    }
    stats
}

/// Calls of one command in a [`commandstats`] map, 0 if absent.
pub fn calls(stats: &HashMap<String, u64>, cmd: &str) -> u64 {
    stats.get(cmd).copied().unwrap_or(0)
}

/// All script executions Redis has seen: EVALSHA, EVAL and their read-only forms.
pub fn script_calls(conn: &mut redis::Connection) -> u64 {
    let stats = commandstats(conn);
    [
        "cmdstat_evalsha",
        "cmdstat_eval",
        "cmdstat_evalsha_ro",
        "cmdstat_eval_ro",
    ]
    .iter()
    .map(|c| calls(&stats, c))
    .sum()
}

/// Subscribers of one channel (`PUBSUB NUMSUB`).
pub fn numsub(conn: &mut redis::Connection, channel: &str) -> u64 {
    let (_, n): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(conn)
        .unwrap();
    n
}

/// `EXISTS key`.
pub fn exists(conn: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(conn).unwrap() == 1
}

/// `HGET key field`.
pub fn hget(conn: &mut redis::Connection, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET").arg(key).arg(field).query(conn).unwrap()
}

/// `PTTL key` in milliseconds (-2 if missing, -1 if no expiry).
pub fn pttl(conn: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(conn).unwrap()
}

/// Threads of this process (`Threads:` in `/proc/self/status`).
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

/// A `MONITOR` connection that records every command Redis executes, one line each, e.g.
/// `+1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "<sha>" "2" "locksmith:{x}:lock" ...`.
#[derive(Debug)]
pub struct Monitor {
    lines: Arc<StdMutex<Vec<String>>>,
    stream: TcpStream,
    reader: Option<thread::JoinHandle<()>>,
}

impl Monitor {
    /// Connects to the server on `port` and starts `MONITOR`.
    pub fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim(), "+OK", "MONITOR refused");
        let lines = Arc::new(StdMutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let handle = thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        Monitor {
            lines,
            stream,
            reader: Some(handle),
        }
    }

    /// Waits (at most 5 s) until every command sent on `conn` so far has been seen, and
    /// returns the number of lines recorded up to then: a mark for [`Monitor::since`].
    pub fn sync(&self, conn: &mut redis::Connection) -> usize {
        let marker = format!("monitor-sync-{}", unique_suffix());
        let _: String = redis::cmd("ECHO").arg(&marker).query(conn).unwrap();
        let mut mark = 0;
        let seen = wait_until(Duration::from_secs(5), || {
            let lines = self.lines.lock().unwrap();
            match lines.iter().position(|l| l.contains(&marker)) {
                Some(i) => {
                    mark = i + 1;
                    true
                }
                None => false,
            }
        });
        assert!(seen, "MONITOR did not see {marker}");
        mark
    }

    /// Lines recorded after `mark`.
    pub fn since(&self, mark: usize) -> Vec<String> {
        self.lines.lock().unwrap()[mark..].to_vec()
    }

    /// Of `lines`, the script calls (EVALSHA/EVAL sent by a client, not commands run inside a
    /// script) naming `key`.
    pub fn script_calls_on(lines: &[String], key: &str) -> usize {
        let quoted = format!("\"{key}\"");
        lines
            .iter()
            .filter(|l| !l.contains(" lua] "))
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("\"evalsha\"") || l.contains("\"eval\"")
            })
            .filter(|l| l.contains(&quoted))
            .count()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bounded waiting
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

/// The environment variable naming the role of a child process.
pub const ROLE_VAR: &str = "LOCKSMITH_TEST_ROLE";

/// True in a child process started for `role`. A `#[test] fn child_xxx()` returns at once
/// unless this is true.
pub fn is_child(role: &str) -> bool {
    std::env::var(ROLE_VAR).as_deref() == Ok(role)
}

/// An environment variable of a child process.
///
/// # Panics
/// If it is not set.
pub fn child_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("child needs env var {var}"))
}

/// A child process running one test of the current test binary. Killed and reaped on `Drop`.
#[derive(Debug)]
pub struct TestChild {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
}

impl TestChild {
    /// Re-runs the current test binary with `[test_name, --exact, --nocapture,
    /// --test-threads=1]`, [`ROLE_VAR`] set to `role`, and `envs`. Its stdout is read line by
    /// line (see [`TestChild::wait_line`]) and echoed with a prefix; stderr is inherited.
    pub fn spawn(test_name: &str, role: &str, envs: &[(&str, String)]) -> TestChild {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        let tag = format!("[child {role} {}]", child.id());
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                println!("{tag} {line}");
                // If nobody listens any more, keep draining so the child never blocks.
                let _ = tx.send(line);
            }
        });
        TestChild {
            child: Some(child),
            lines,
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits at most `dur` for a stdout line that is `line`, or ends with `" " + line` (libtest
    /// prints `test child_xxx ... ` without a newline before the child's first output).
    ///
    /// # Panics
    /// If the line does not come in time or the child closes its stdout first.
    pub fn wait_line(&self, line: &str, dur: Duration) {
        let deadline = Instant::now() + dur;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.trim() == line || l.trim_end().ends_with(&format!(" {line}")) => {
                    return;
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("child did not print {line:?} within {dur:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("child closed stdout before printing {line:?}")
                }
            }
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`, ...) with the `kill` command.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Waits at most `dur` for the child to exit.
    ///
    /// # Panics
    /// If it is still running after `dur` (it is killed first).
    pub fn wait_timeout(&mut self, dur: Duration) -> ExitStatus {
        let deadline = Instant::now() + dur;
        loop {
            let child = self.child.as_mut().expect("child already reaped");
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            if Instant::now() >= deadline {
                self.kill9();
                panic!("child did not exit within {dur:?}; killed");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        self.kill9_quiet();
    }
}

impl TestChild {
    fn kill9_quiet(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A read-modify-write increment of `key` (GET, a short pause to widen the race, SET): without
/// mutual exclusion, concurrent callers lose updates.
pub fn rmw_increment(conn: &mut redis::Connection, key: &str) {
    let v: Option<u64> = redis::cmd("GET").arg(key).query(conn).unwrap();
    thread::sleep(Duration::from_micros(200));
    redis::cmd("SET")
        .arg(key)
        .arg(v.unwrap_or(0) + 1)
        .exec(conn)
        .unwrap();
}

/// `rounds` critical sections under `lock`, each appending its fencing token to the list
/// `tokens` (so the list is in acquisition order) and incrementing `counter`.
pub fn locked_increments(
    lock: &locksmith::Mutex,
    conn: &mut redis::Connection,
    counter: &str,
    tokens: &str,
    rounds: u64,
) {
    for _ in 0..rounds {
        let guard = lock.lock().unwrap();
        redis::cmd("RPUSH")
            .arg(tokens)
            .arg(guard.fencing_token())
            .exec(conn)
            .unwrap();
        rmw_increment(conn, counter);
        guard.unlock().unwrap();
    }
}

/// After [`locked_increments`] by several workers: the counter is exactly `expected` and the
/// recorded fencing tokens strictly increase in acquisition order.
pub fn assert_exact_and_fenced(conn: &mut redis::Connection, name: &str, expected: u64) {
    let total: u64 = redis::cmd("GET")
        .arg(format!("counter:{name}"))
        .query(conn)
        .unwrap();
    assert_eq!(total, expected, "increments were lost");
    let tokens: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("tokens:{name}"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    assert_eq!(tokens.len() as u64, expected);
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "fencing tokens not increasing: {} then {}",
            w[0],
            w[1]
        );
    }
}
