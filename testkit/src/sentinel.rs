//! A Redis Sentinel deployment for one test: 1 master, 2 replicas (`--replicaof`) and 3
//! sentinels (`redis-server CONF --sentinel`, from config files written here), all on free
//! ports of 127.0.0.1, with short failure detection (`down-after-milliseconds` 1000,
//! `failover-timeout` 3000). Every process is killed and reaped on `Drop`.
//!
//! [`SentinelSet::start_secure`] starts the same deployment as production often runs it: every
//! process also listens for TLS (certificates from a [`TlsFiles`]), replication and the
//! sentinels' links run over TLS (`tls-replication yes`), the data servers require a password
//! of the `default` user (used by replication and the sentinels) and have an ACL user for
//! the client ([`MASTER_USER`]), and the sentinels require their own password. The sentinels
//! then announce the TLS ports; each process keeps a plain port on 127.0.0.1 too, which only
//! the harness uses (the ports a test sees are always the announced ones).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::names::unique_suffix;
use crate::program::server_program;
use crate::server::{connect, free_port, signal};
use crate::tls::{ServerCert, TlsFiles};

/// The ACL user of the client on the data servers of [`SentinelSet::start_secure`].
pub const MASTER_USER: &str = "locksmith";
/// [`MASTER_USER`]'s password.
pub const MASTER_PASS: &str = "m4ster-pw";
/// The `default` user's password on the data servers (replication and the sentinels use it).
const ADMIN_PASS: &str = "admin-pw";
/// The sentinels' own password (`requirepass`) in [`SentinelSet::start_secure`].
pub const SENTINEL_PASS: &str = "sentinel-pw";

/// How long the sentinels take to call a master down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The sentinels' failover timeout (also the delay before a failed failover is tried again).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long processes may take to start answering.
const START: Duration = Duration::from_secs(10);

/// One `redis-server` process (a data server or a sentinel).
#[derive(Debug)]
struct Proc {
    /// The plain port (the harness's own way in).
    port: u16,
    /// The TLS port (announced to clients) of a secure deployment.
    tls_port: Option<u16>,
    child: Option<Child>,
    log: PathBuf,
    /// `SIGSTOP`ped by [`SentinelSet::pause_sentinel`]: the harness does not ask it.
    frozen: AtomicBool,
}

impl Proc {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A frozen process must be thawed to die promptly on some kernels; harmless else.
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("process is stopped").id()
    }

    /// The port clients are told of.
    fn announced(&self) -> u16 {
        self.tls_port.unwrap_or(self.port)
    }
}

/// A master, two replicas and three sentinels watching them.
#[derive(Debug)]
pub struct SentinelSet {
    dir: PathBuf,
    name: String,
    servers: Vec<Proc>,
    sentinels: Vec<Proc>,
    /// TLS ports and passwords (see [`SentinelSet::start_secure`]).
    secure: bool,
}

fn spawn(port: u16, args: &[String], log: &Path) -> Child {
    let mut cmd = Command::new(server_program());
    crate::clock_shift::apply(&mut cmd, port);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); log {}",
                server_program(),
                log.display()
            )
        })
}

/// Runs `cmd` on the plain port `port`, as `password`'s `default` user if given.
fn query<T: redis::FromRedisValue>(
    port: u16,
    password: Option<&str>,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
    let mut con = connect(
        &format!("redis://{auth}127.0.0.1:{port}/"),
        Duration::from_secs(2),
    )?;
    cmd.query(&mut con)
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while !ok() {
        assert!(
            Instant::now() < until,
            "timed out after {timeout:?}: {what}"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

impl SentinelSet {
    /// Starts the deployment and waits (at most 30 s) until the replicas are in sync and every
    /// sentinel knows both replicas and the two other sentinels, so that a failover can run.
    ///
    /// # Panics
    /// When a process does not come up in time.
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(None)
    }

    /// Starts the deployment with TLS everywhere and passwords (see the module doc): the
    /// servers present `files`' good certificate, and a client authenticates to the master as
    /// [`MASTER_USER`] / [`MASTER_PASS`] and to the sentinels with [`SENTINEL_PASS`] (given
    /// in [`SentinelSet::sentinel_urls`]).
    ///
    /// # Panics
    /// When a process does not come up in time.
    pub fn start_secure(files: &TlsFiles) -> SentinelSet {
        SentinelSet::start_with(Some(files))
    }

    fn start_with(tls: Option<&TlsFiles>) -> SentinelSet {
        let dir = std::env::temp_dir().join(format!("locksmith-sentinel-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("m{}", unique_suffix().replace(['-', ':'], ""));
        let mut set = SentinelSet {
            dir: dir.clone(),
            name,
            servers: Vec::new(),
            sentinels: Vec::new(),
            secure: tls.is_some(),
        };
        let tls_args = |port: u16| -> Vec<String> {
            let Some(files) = tls else {
                return Vec::new();
            };
            let (cert, key) = files.server_files(ServerCert::Good);
            vec![
                format!("tls-port {port}"),
                format!("tls-cert-file {}", cert.display()),
                format!("tls-key-file {}", key.display()),
                format!("tls-ca-cert-file {}", files.path("ca.crt").display()),
                "tls-auth-clients no".into(),
                "tls-replication yes".into(),
            ]
        };
        let master_port = free_port();
        let master_tls = tls.map(|_| free_port());
        let master_announced = master_tls.unwrap_or(master_port);
        for k in 0..3 {
            let port = if k == 0 { master_port } else { free_port() };
            let tls_port = if k == 0 {
                master_tls
            } else {
                tls.map(|_| free_port())
            };
            let log = dir.join(format!("redis-{port}.log"));
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                dir.to_str().unwrap(),
                "--logfile",
                log.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if k > 0 {
                args.extend([
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master_announced.to_string(),
                ]);
            }
            if let Some(t) = tls_port {
                for line in tls_args(t) {
                    let (k, v) = line.split_once(' ').unwrap();
                    args.extend([format!("--{k}"), v.to_owned()]);
                }
                args.extend([
                    "--requirepass".into(),
                    ADMIN_PASS.into(),
                    "--masterauth".into(),
                    ADMIN_PASS.into(),
                    "--user".into(),
                    MASTER_USER.into(),
                    "on".into(),
                    format!(">{MASTER_PASS}"),
                    "~*".into(),
                    "&*".into(),
                    "+@all".into(),
                ]);
            }
            let child = spawn(port, &args, &log);
            set.servers.push(Proc {
                port,
                tls_port,
                child: Some(child),
                log,
                frozen: AtomicBool::new(false),
            });
        }
        for _ in 0..3 {
            let port = free_port();
            let tls_port = tls.map(|_| free_port());
            let conf = dir.join(format!("sentinel-{port}.conf"));
            let log = dir.join(format!("sentinel-{port}.log"));
            let n = &set.name;
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {l}\n\
                 sentinel monitor {n} 127.0.0.1 {master_announced} 2\n\
                 sentinel down-after-milliseconds {n} {down}\n\
                 sentinel failover-timeout {n} {fo}\n\
                 sentinel parallel-syncs {n} 2\n",
                d = dir.display(),
                l = log.display(),
                down = DOWN_AFTER.as_millis(),
                fo = FAILOVER_TIMEOUT.as_millis(),
            );
            if let Some(t) = tls_port {
                for line in tls_args(t) {
                    text.push_str(&line);
                    text.push('\n');
                }
                text.push_str(&format!(
                    "sentinel auth-pass {n} {ADMIN_PASS}\nrequirepass {SENTINEL_PASS}\n"
                ));
            }
            std::fs::write(&conf, text).unwrap();
            let child = spawn(
                port,
                &[conf.to_str().unwrap().to_owned(), "--sentinel".to_owned()],
                &log,
            );
            set.sentinels.push(Proc {
                port,
                tls_port,
                child: Some(child),
                log,
                frozen: AtomicBool::new(false),
            });
        }
        set.wait_ready(Duration::from_secs(30));
        set
    }

    /// Waits until the master has two replicas in sync and every sentinel knows them and the
    /// other sentinels.
    pub fn wait_ready(&self, timeout: Duration) {
        let master = self.master_port();
        wait_for("replicas in sync", timeout, || {
            self.query_server::<String>(master, redis::cmd("INFO").arg("replication"))
                .map(|i| i.matches("state=online").count() >= 2)
                .unwrap_or(false)
        });
        for s in self.live_sentinels() {
            wait_for(
                "sentinels know each other and the replicas",
                timeout,
                || {
                    let replicas: Vec<redis::Value> = self
                        .query_sentinel(s, redis::cmd("SENTINEL").arg("replicas").arg(&self.name))
                        .unwrap_or_default();
                    let others: Vec<redis::Value> = self
                        .query_sentinel(s, redis::cmd("SENTINEL").arg("sentinels").arg(&self.name))
                        .unwrap_or_default();
                    replicas.len() >= 2 && others.len() >= 2
                },
            );
        }
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `redis://127.0.0.1:PORT/` of each sentinel; for a secure deployment
    /// `rediss://:SENTINEL_PASS@127.0.0.1:TLS_PORT/`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| match s.tls_port {
                Some(t) => format!("rediss://:{SENTINEL_PASS}@127.0.0.1:{t}/"),
                None => format!("redis://127.0.0.1:{}/", s.port),
            })
            .collect()
    }

    /// The plain port of the data server announced at `port`.
    fn plain(&self, port: u16) -> u16 {
        self.servers
            .iter()
            .find(|p| p.announced() == port)
            .map_or(port, |p| p.port)
    }

    /// Runs `cmd` on the data server announced at `port` (through its plain port).
    fn query_server<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query(self.plain(port), self.secure.then_some(ADMIN_PASS), cmd)
    }

    /// Runs `cmd` on sentinel `s` (through its plain port).
    fn query_sentinel<T: redis::FromRedisValue>(
        &self,
        s: &Proc,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query(s.port, self.secure.then_some(SENTINEL_PASS), cmd)
    }

    /// The master's port as the first sentinel that answers says (waiting at most 10 s for
    /// one that answers, e.g. while they start).
    ///
    /// # Panics
    /// When no sentinel answers.
    pub fn master_port(&self) -> u16 {
        let mut found = None;
        wait_for("a sentinel that names the master", START, || {
            found = self.live_sentinels().find_map(|s| {
                self.query_sentinel::<(String, u16)>(
                    s,
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(&self.name),
                )
                .ok()
            });
            found.is_some()
        });
        found.map(|(_, port)| port).expect("no sentinel answered")
    }

    /// The (announced) ports of the data servers (master and replicas) still running.
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|p| p.child.is_some())
            .map(Proc::announced)
            .collect()
    }

    /// An administrator's connection to the data server announced at `port` (through its
    /// plain port).
    pub fn conn(&self, port: u16) -> redis::Connection {
        let auth = if self.secure {
            format!(":{ADMIN_PASS}@")
        } else {
            String::new()
        };
        connect(
            &format!("redis://{auth}127.0.0.1:{}/", self.plain(port)),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// Asks a sentinel for a graceful failover (`SENTINEL FAILOVER`) and waits (at most
    /// `timeout`) until the sentinels name another master, whose port it returns.
    pub fn failover(&self, timeout: Duration) -> u16 {
        let old = self.master_port();
        let asked = self
            .live_sentinels()
            .next()
            .expect("every sentinel is frozen");
        // A sentinel answers NOGOODSLAVE until it has seen a replica fit to promote (its
        // INFO about the replica refreshes every second): asked again until `timeout`.
        let until = Instant::now() + timeout;
        loop {
            let asked: redis::RedisResult<()> = self.query_sentinel(
                asked,
                redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.name),
            );
            match asked {
                Err(e) if e.code() == Some("NOGOODSLAVE") && Instant::now() < until => {
                    thread::sleep(Duration::from_millis(100));
                }
                asked => break asked.unwrap(),
            }
        }
        self.wait_new_master(old, timeout)
    }

    /// Waits (at most `timeout`) until the sentinels name a master other than `old` that says
    /// it is a master (`ROLE`); its port.
    pub fn wait_new_master(&self, old: u16, timeout: Duration) -> u16 {
        let mut new = old;
        wait_for("a new master", timeout, || {
            new = self.master_port();
            new != old
                && self
                    .query_server::<Vec<redis::Value>>(new, &redis::cmd("ROLE"))
                    .map(|r| matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
                    .unwrap_or(false)
        });
        new
    }

    /// The sentinels not frozen by [`SentinelSet::pause_sentinel`].
    fn live_sentinels(&self) -> impl Iterator<Item = &Proc> {
        self.sentinels
            .iter()
            .filter(|s| !s.frozen.load(Ordering::SeqCst))
    }

    /// Freezes (`SIGSTOP`) sentinel `i` (in the order of [`SentinelSet::sentinel_urls`]): it
    /// still accepts connections (the kernel does) but never answers. The harness stops
    /// asking it until [`SentinelSet::resume_sentinel`].
    ///
    /// # Panics
    /// When there is no such sentinel or it was stopped.
    pub fn pause_sentinel(&self, i: usize) {
        let s = &self.sentinels[i];
        s.frozen.store(true, Ordering::SeqCst);
        signal(s.pid(), "STOP");
    }

    /// Thaws (`SIGCONT`) sentinel `i`.
    ///
    /// # Panics
    /// When there is no such sentinel or it was stopped.
    pub fn resume_sentinel(&self, i: usize) {
        let s = &self.sentinels[i];
        signal(s.pid(), "CONT");
        s.frozen.store(false, Ordering::SeqCst);
    }

    /// Kills the data server on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(p) = self.servers.iter_mut().find(|p| p.announced() == port) {
            p.kill();
        }
    }

    /// Freezes (`SIGSTOP`) the data server on `port`.
    pub fn pause(&self, port: u16) {
        let p = self.servers.iter().find(|p| p.announced() == port).unwrap();
        signal(p.pid(), "STOP");
    }

    /// Thaws (`SIGCONT`) the data server on `port`.
    pub fn resume(&self, port: u16) {
        let p = self.servers.iter().find(|p| p.announced() == port).unwrap();
        signal(p.pid(), "CONT");
    }

    /// The last lines of every process log, for a failed test.
    pub fn logs(&self, n: usize) -> String {
        let mut out = String::new();
        for p in self.servers.iter().chain(&self.sentinels) {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} ---\n", p.log.display()));
            for l in &lines[lines.len().saturating_sub(n)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("{}", self.logs(15));
        }
        for p in self.sentinels.iter_mut().chain(self.servers.iter_mut()) {
            p.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
