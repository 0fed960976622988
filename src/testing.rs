//! A throwaway Redis server for your own tests (the `testing` cargo feature).
//!
//! [`Server::start`] runs `redis-server` (or the binary that the environment variable
//! `LOCKSMITH_TEST_SERVER` names, such as a `valkey-server`) as a child process on a free port
//! of 127.0.0.1, without persistence (`--save "" --appendonly no`), and waits until it answers.
//! [`Server::url`] is its `redis://127.0.0.1:PORT/` URL. Dropping the [`Server`] kills the
//! process and waits for it, so a test leaves no process and no file behind, also when it
//! fails. Each test may start a server of its own: they run side by side on different ports,
//! and no test sees another's locks.
//!
//! Enable the feature for your tests only:
//!
//! ```toml
//! [dev-dependencies]
//! redis-locksmith = { version = "0.1", features = ["testing"] }
//! ```
//!
//! ```
//! // tests/jobs.rs
//! use locksmith::testing::Server;
//!
//! # /*
//! #[test]
//! # */
//! fn one_job_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
//!     let server = Server::start()?;
//!     let client = locksmith::Client::open(server.url().as_str())?;
//!     let lock = client.mutex("job:42")?;
//!     let done = lock.with_lock(|guard| {
//!         // ... the work, fenced with guard.fencing_token() ...
//!         guard.fencing_token() > 0
//!     })?;
//!     assert!(done);
//!     Ok(())
//! } // the server is stopped here
//! # fn main() -> Result<(), Box<dyn std::error::Error>> { one_job_at_a_time() }
//! ```
//!
//! A machine without `redis-server` makes [`Server::start`] fail with an error that says so
//! ([`StartError::is_not_found`] tells that case apart, for a test suite that would rather
//! skip). Install it (`apt-get install redis-server`, `brew install redis`), or point
//! `LOCKSMITH_TEST_SERVER` at a server binary.
//!
//! The server is a plain local one: no password, no TLS, one node. It is killed, not shut
//! down, when dropped: its data is gone, and nothing is written to disk meanwhile (its log goes
//! to a file in a temporary directory of its own, removed with it). A test process that is
//! killed outright (`SIGKILL`) cannot stop it: that server keeps running until it is killed.

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The environment variable that names the server binary to run instead of `redis-server`.
const SERVER_VAR: &str = "LOCKSMITH_TEST_SERVER";

/// How long [`Server::start`] waits, in all, for a server to answer.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How many ports [`Server::start`] tries when another process takes the one it chose.
const PORT_TRIES: usize = 3;

/// A throwaway Redis server on 127.0.0.1, stopped when dropped (see the [module
/// docs](self)).
#[derive(Debug)]
pub struct Server {
    port: u16,
    /// The running server; taken when it is stopped.
    child: Option<Child>,
    /// Its working directory, which holds its log.
    dir: PathBuf,
}

impl Server {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers `PING`, as the
    /// process it started (not another one that took the port first).
    ///
    /// Runs `redis-server`, found on `PATH`, or the binary that `LOCKSMITH_TEST_SERVER` names
    /// (a path, or a name found on `PATH`). That binary must run the server in the process it
    /// starts (a wrapper script must `exec` it) and take `redis-server`'s command-line options
    /// (`--port`, `--bind`, `--save`, `--appendonly`, `--dir`): Valkey's `valkey-server` does.
    ///
    /// Returns within about 10 s: when no server answered by then, the process is killed and
    /// the error says so. When the port it chose was taken meanwhile by another process, it
    /// tries another one, within the same bound.
    ///
    /// # Errors
    ///
    /// A [`StartError`] (its text says which binary, and ends with what it printed) when the
    /// binary is not found ([`StartError::is_not_found`]) or cannot be run, when the server
    /// exits at start, or when it does not answer within the bound.
    pub fn start() -> Result<Server, StartError> {
        let program = program();
        let deadline = Instant::now() + START_TIMEOUT;
        // A number that differs between the servers of this process.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("locksmith-test-server-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            StartError::new(format!("cannot create {}: {e}", dir.display()), Some(e))
        })?;
        let mut server = Server {
            port: 0,
            child: None,
            dir,
        };
        // A server that exited leaves nothing to kill before the next try.
        let mut tries = 1;
        loop {
            match server.spawn_and_wait(&program, deadline) {
                Ok(()) => return Ok(server),
                Err(Attempt::Again(_)) if tries < PORT_TRIES && Instant::now() < deadline => {
                    tries += 1;
                }
                Err(Attempt::Again(e) | Attempt::Fatal(e)) => return Err(e),
            }
        }
    }

    /// The server's URL, `redis://127.0.0.1:PORT/`: give it to
    /// [`Client::open`](crate::Client::open) or [`Client::builder`](crate::Client::builder).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TCP port of 127.0.0.1 the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// One try: a port, the process, the wait until it answers as itself.
    fn spawn_and_wait(&mut self, program: &Program, deadline: Instant) -> Result<(), Attempt> {
        self.port =
            free_port().map_err(|e| fatal(format!("no free TCP port on 127.0.0.1: {e}"), e))?;
        let log_path = self.dir.join("server.log");
        let shown = log_path.display();
        let log =
            File::create(&log_path).map_err(|e| fatal(format!("cannot create {shown}: {e}"), e))?;
        let log_err =
            (log.try_clone()).map_err(|e| fatal(format!("cannot open {shown} twice: {e}"), e))?;
        let spawned = Command::new(&program.path)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn();
        let child = match spawned {
            Ok(child) => self.child.insert(child),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(fatal(program.not_found(), e));
            }
            Err(e) => return Err(fatal(format!("cannot run {}: {e}", program.shown()), e)),
        };
        let pid = child.id();
        loop {
            let exited = match child.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                Ok(None) => None,
                Err(e) => Some(format!("cannot be waited for ({e})")),
            };
            if let Some(status) = exited {
                self.child = None;
                let what = format!(
                    "{} exited at start on port {} ({status}){}",
                    program.shown(),
                    self.port,
                    printed(&log_path)
                );
                // Another process may have taken the port before the server bound it: a
                // new port may do. Any other failure will not go away.
                let error = StartError::new(what, None);
                return Err(if port_taken(&log_path) {
                    Attempt::Again(error)
                } else {
                    Attempt::Fatal(error)
                });
            }
            if answering_pid(self.port) == Some(pid) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let what = format!(
                    "{} did not answer PING on 127.0.0.1:{} within {START_TIMEOUT:?}{}",
                    program.shown(),
                    self.port,
                    printed(&log_path)
                );
                return Err(Attempt::Fatal(StartError::new(what, None)));
            }
            thread::sleep((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Kills the server, if it runs, and waits for it to end.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Nothing to keep (no persistence): SIGKILL, which also ends a stopped process.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why [`Server::start`] failed: which binary, what went wrong, and what the server printed.
///
/// Its text is meant to be read in a failed test's output; [`is_not_found`](Self::is_not_found)
/// tells the one case a test suite may want to skip on.
#[derive(Debug)]
pub struct StartError {
    message: String,
    source: Option<io::Error>,
}

impl StartError {
    fn new(message: String, source: Option<io::Error>) -> Self {
        StartError { message, source }
    }

    /// True when the server binary was not found (`redis-server` not on `PATH`, or the
    /// binary `LOCKSMITH_TEST_SERVER` names missing).
    pub fn is_not_found(&self) -> bool {
        self.source
            .as_ref()
            .is_some_and(|e| e.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref()?)
    }
}

/// How one try of [`Server::start`] failed.
enum Attempt {
    /// On a port another process took: another port may do.
    Again(StartError),
    /// For a reason another port does not change.
    Fatal(StartError),
}

/// A failure that another port does not change: `what`, caused by the I/O error `e`.
fn fatal(what: String, e: io::Error) -> Attempt {
    Attempt::Fatal(StartError::new(what, Some(e)))
}

/// The server binary to run, and where its name came from.
struct Program {
    path: OsString,
    from_var: bool,
}

impl Program {
    /// The binary, named as its error messages name it.
    fn shown(&self) -> String {
        let path = self.path.to_string_lossy();
        if self.from_var {
            format!("`{path}` (from {SERVER_VAR})")
        } else {
            format!("`{path}`")
        }
    }

    /// The error text when the binary is not found.
    fn not_found(&self) -> String {
        if self.from_var {
            format!(
                "{} not found: set {SERVER_VAR} to a server binary (a path, or a name on \
                 PATH), or unset it to run redis-server",
                self.shown()
            )
        } else {
            format!(
                "redis-server not found on PATH; set {SERVER_VAR} to a server binary (e.g. a \
                 valkey-server), or install it (apt-get install redis-server, brew install \
                 redis)"
            )
        }
    }
}

/// `LOCKSMITH_TEST_SERVER` when set and not empty, else `redis-server`.
fn program() -> Program {
    let var = std::env::var_os(SERVER_VAR).filter(|v| !v.is_empty());
    Program {
        from_var: var.is_some(),
        path: var.unwrap_or_else(|| OsString::from("redis-server")),
    }
}

/// A port of 127.0.0.1 that was free a moment ago.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The process id of the server that answers on 127.0.0.1:`port` (`process_id` of
/// `INFO server`), if one answers `PING`.
fn answering_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(200))
        .ok()?;
    let io = Some(Duration::from_millis(500));
    conn.set_read_timeout(io).ok()?;
    conn.set_write_timeout(io).ok()?;
    let pong: String = redis::cmd("PING").query(&mut conn).ok()?;
    if pong != "PONG" {
        return None;
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:")?.trim().parse().ok())
}

/// Whether the server's log says that its port was taken.
fn port_taken(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains("Address already in use"))
}

/// What the server printed (its last lines), to end an error message with; empty when it
/// printed nothing.
fn printed(log: &Path) -> String {
    const LINES: usize = 20;
    match std::fs::read_to_string(log) {
        Ok(text) if text.trim().is_empty() => "; it printed nothing".to_owned(),
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LINES)..];
            format!("; it printed:\n{}", tail.join("\n"))
        }
        Err(e) => format!("; its output cannot be read ({}: {e})", log.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_missing_binary_and_the_variable() {
        let default = Program {
            path: OsString::from("redis-server"),
            from_var: false,
        };
        assert!(
            default
                .not_found()
                .starts_with("redis-server not found on PATH; set LOCKSMITH_TEST_SERVER")
        );
        let named = Program {
            path: OsString::from("/opt/valkey/valkey-server"),
            from_var: true,
        };
        assert!(
            named
                .not_found()
                .starts_with("`/opt/valkey/valkey-server` (from LOCKSMITH_TEST_SERVER) not found")
        );
    }

    #[test]
    fn not_found_is_told_apart() {
        let e = StartError::new(
            "x".to_owned(),
            Some(io::Error::from(io::ErrorKind::NotFound)),
        );
        assert!(e.is_not_found());
        assert!(!StartError::new("x".to_owned(), None).is_not_found());
    }
}
