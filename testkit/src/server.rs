//! A private `redis-server` per test or benchmark, on a free port of 127.0.0.1 (never 6379).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::names::unique_suffix;
use crate::program::{SERVER_VAR, server_program};
use crate::tls::{ServerCert, TlsFiles};

/// How long a starting server may take to answer (`INFO server`, with its own process id).
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process on a free port of 127.0.0.1, without persistence, with
/// `DEBUG` enabled for local connections.
///
/// Dropping it kills and reaps the server and removes its temporary directory. If the current
/// thread is panicking, the tail of the server log is printed first.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    cpu: Option<usize>,
    child: Option<Child>,
    tls: Option<TlsPort>,
}

/// The TLS port of a server started by [`RedisServer::start_tls`], and its files.
#[derive(Debug, Clone)]
struct TlsPort {
    port: u16,
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    auth_clients: bool,
}

impl RedisServer {
    /// Starts a server on a free port and waits (at most 10 s) until it answers, as the
    /// process it started (not another one that took the port first).
    ///
    /// # Panics
    /// If `redis-server` is not installed, or no server came up after a few ports.
    pub fn start() -> RedisServer {
        ensure_redis_server_installed();
        match RedisServer::try_start(None) {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts a server, pinned to CPU `cpu` with `taskset` when given, and waits (at most
    /// 10 s) until it answers, as the process it started.
    ///
    /// # Errors
    /// When `redis-server` (or `taskset`) cannot be run, or no server came up after a few
    /// ports; the message holds the tail of the server log.
    pub fn try_start(cpu: Option<usize>) -> Result<RedisServer, String> {
        RedisServer::try_start_with(cpu, None)
    }

    /// Starts a server that also listens for TLS on [`RedisServer::tls_port`], presenting
    /// the server certificate `cert` of `files` (signed by its test CA). With `auth_clients`
    /// it requires a client certificate signed by the test CA (mutual TLS).
    ///
    /// The plain port ([`RedisServer::url`]) stays open, for the tests' own inspection
    /// connections; the client under test is given [`RedisServer::tls_url`].
    ///
    /// # Panics
    /// If `redis-server` is missing, built without TLS, or does not come up.
    pub fn start_tls(files: &TlsFiles, cert: ServerCert, auth_clients: bool) -> RedisServer {
        ensure_redis_server_installed();
        let (cert, key) = files.server_files(cert);
        let tls = TlsPort {
            port: 0,
            cert,
            key,
            ca: files.path("ca.crt"),
            auth_clients,
        };
        match RedisServer::try_start_with(None, Some(tls)) {
            Ok(server) => server,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`RedisServer::start_tls`] that returns the failure instead of panicking (a server
    /// built without TLS exits at once; the message ends with its log).
    ///
    /// # Errors
    /// When the server cannot be run or does not come up; the message holds its log's tail.
    pub fn try_start_tls(
        files: &TlsFiles,
        cert: ServerCert,
        auth_clients: bool,
    ) -> Result<RedisServer, String> {
        let (cert, key) = files.server_files(cert);
        let tls = TlsPort {
            port: 0,
            cert,
            key,
            ca: files.path("ca.crt"),
            auth_clients,
        };
        RedisServer::try_start_with(None, Some(tls))
    }

    fn try_start_with(cpu: Option<usize>, tls: Option<TlsPort>) -> Result<RedisServer, String> {
        let dir = std::env::temp_dir().join(format!("locksmith-test-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir {}: {e}", dir.display()))?;
        let mut server = RedisServer {
            port: 0,
            dir,
            cpu,
            child: None,
            tls,
        };
        let mut last_err = String::new();
        // The port was free when probed; another process may take it before the server
        // binds, so try a few.
        for _ in 0..5 {
            server.port = try_free_port()?;
            if let Some(tls) = server.tls.as_mut() {
                tls.port = try_free_port()?;
            }
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    last_err = e;
                    server.kill_child();
                }
            }
        }
        Err(format!(
            "could not start {}: {last_err}\n--- redis.log ---\n{}",
            server_program(),
            server.log_tail(30)
        ))
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The TLS port of a server started by [`RedisServer::start_tls`].
    ///
    /// # Panics
    /// If the server has no TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls.as_ref().expect("not a TLS server").port
    }

    /// `rediss://127.0.0.1:TLS_PORT/` (see [`RedisServer::tls_port`]).
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port())
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
    ///
    /// # Panics
    /// If the server does not accept the connection within 5 s.
    pub fn conn(&self) -> redis::Connection {
        connect(&self.url(), Duration::from_secs(5)).unwrap()
    }

    /// The server's version string (`redis_version` of `INFO server`), `?` if unknown.
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

    /// Kills the server (SIGKILL) and reaps it. All data is lost.
    pub fn stop(&mut self) {
        self.kill_child();
    }

    /// Stops the server if running and starts a new, empty one on the same port (and CPU).
    ///
    /// # Panics
    /// If no server answers on the port within 10 s.
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
                        self.log_tail(30)
                    );
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Freezes the server (SIGSTOP).
    ///
    /// # Panics
    /// If the server is stopped or `kill` fails.
    pub fn pause(&self) {
        signal(self.pid(), "STOP");
    }

    /// Thaws the server (SIGCONT).
    ///
    /// # Panics
    /// If the server is stopped or `kill` fails.
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
        // `taskset -c N redis-server ...` execs the server in place: same pid.
        let mut cmd = match self.cpu {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.arg("-c").arg(c.to_string()).arg(server_program());
                cmd
            }
            None => Command::new(server_program()),
        };
        crate::clock_shift::apply(&mut cmd, self.port);
        if let Some(tls) = &self.tls {
            cmd.args(["--tls-port", &tls.port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args([
                    "--tls-auth-clients",
                    if tls.auth_clients { "yes" } else { "no" },
                ]);
        }
        let child = cmd
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
            .map_err(|e| format!("spawn {} (is it installed?): {e}", server_program()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(format!("the server on port {port} exited: {status}"));
            }
            // Our child, not another process that took the port before it could bind it
            // (the child then exits with "Address already in use", and another port is tried).
            let pid = self.child.as_ref().map(Child::id);
            if pid.is_some() && answering_pid(&self.url()) == pid {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the server on port {port} did not answer as its own process within {START_TIMEOUT:?}"
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
    let program = server_program();
    match Command::new(&program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "`{program}` is not found; the integration tests need it. \
             Install it, e.g. `apt-get install redis-server` (Debian/Ubuntu) \
             or `brew install redis` (macOS), or name another server in {SERVER_VAR}"
        ),
        Err(e) => panic!("cannot run `{program} --version`: {e}"),
    }
}

/// The process id of the Redis answering at `url` (`process_id` of `INFO server`), if one
/// answers.
pub(crate) fn answering_pid(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(200))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:")?.trim().parse().ok())
}

/// A plain connection to `url` within `timeout`, with read/write timeouts of `timeout` (at
/// least 5 s, so that a slow command is not cut short).
///
/// # Errors
/// When the URL is invalid or the server does not accept the connection in time.
pub fn connect(url: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(timeout)?;
    let t = Some(timeout.max(Duration::from_secs(5)));
    con.set_read_timeout(t)?;
    con.set_write_timeout(t)?;
    Ok(con)
}

/// A port for a test server: free a moment ago, never handed out before by this process, and
/// outside the kernel's range of ephemeral ports, so that neither a second `free_port` call
/// nor the local end of some outgoing connection takes it before the server binds it.
///
/// Ports are drawn from 10000..20000 and `port + 10000` (a cluster node's bus port) is checked
/// free too; both stay reserved for the life of the process. Never 6379.
///
/// # Panics
/// If no such port can be bound.
pub fn free_port() -> u16 {
    match try_free_port() {
        Ok(port) => port,
        Err(e) => panic!("{e}"),
    }
}

/// The ports `free_port` handed out in this process.
static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

fn try_free_port() -> Result<u16, String> {
    const LOW: u16 = 10_000;
    const SPAN: u16 = 10_000;
    const BUS_OFFSET: u16 = 10_000;
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    // Start at a point that differs between processes, then walk the range once.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let seed = (std::process::id() ^ nanos.rotate_left(7)) as u16 % SPAN;
    for i in 0..SPAN {
        let port = LOW + (seed + i) % SPAN;
        if handed.contains(&port) {
            continue;
        }
        let bindable = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if bindable(port) && bindable(port + BUS_OFFSET) {
            handed.push(port);
            return Ok(port);
        }
    }
    Err(format!("no free port in {LOW}..{}", LOW + SPAN))
}

/// A port of 127.0.0.1 that refuses every connection for as long as this value lives.
///
/// A port from [`free_port`] is free only until some other process binds it; a test that
/// needs a *closed* port (connection refused) holds this instead: a TCP socket bound to the
/// port that never listens. The kernel refuses connections to it, and no other socket can
/// bind the port while it is held (it is bound without `SO_REUSEADDR`).
#[derive(Debug)]
pub struct ClosedPort {
    _socket: socket2::Socket,
    port: u16,
}

impl ClosedPort {
    /// Binds a fresh port of 127.0.0.1 without listening on it.
    ///
    /// # Panics
    /// If no TCP socket can be made or bound.
    pub fn new() -> ClosedPort {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
        socket.bind(&addr.into()).expect("bind 127.0.0.1:0");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("the bound port");
        ClosedPort {
            _socket: socket,
            port,
        }
    }

    /// The refused port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Default for ClosedPort {
    fn default() -> ClosedPort {
        ClosedPort::new()
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

fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Sends a signal by name (`STOP`, `CONT`, `KILL`, ...) to `pid` with the `kill` command.
///
/// # Panics
/// If `kill` cannot be run or fails.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run `kill`");
    assert!(status.success(), "kill -{sig} {pid} failed: {status}");
}

/// SIGSTOPs process `pid` now and SIGCONTs it after `d`, from a thread (join it to know the
/// process runs again).
///
/// # Panics
/// If `kill` fails (on the calling thread for SIGSTOP, on the returned one for SIGCONT).
pub fn stop_for(pid: u32, d: Duration) -> JoinHandle<()> {
    signal(pid, "STOP");
    thread::spawn(move || {
        thread::sleep(d);
        signal(pid, "CONT");
    })
}
