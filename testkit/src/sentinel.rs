//! A Redis Sentinel deployment for one test: 1 master, 2 replicas (`--replicaof`) and 3
//! sentinels (`redis-server CONF --sentinel`, from config files written here), all on free
//! ports of 127.0.0.1, with short failure detection (`down-after-milliseconds` 1000,
//! `failover-timeout` 3000). Every process is killed and reaped on `Drop`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::names::unique_suffix;
use crate::server::{connect, free_port, signal};

/// How long the sentinels take to call a master down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The sentinels' failover timeout (also the delay before a failed failover is tried again).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long processes may take to start answering.
const START: Duration = Duration::from_secs(10);

/// One `redis-server` process (a data server or a sentinel).
#[derive(Debug)]
struct Proc {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
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
}

/// A master, two replicas and three sentinels watching them.
#[derive(Debug)]
pub struct SentinelSet {
    dir: PathBuf,
    name: String,
    servers: Vec<Proc>,
    sentinels: Vec<Proc>,
}

fn spawn(args: &[String], log: &Path) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-server ({e}); log {}", log.display()))
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let mut con = connect(
        &format!("redis://127.0.0.1:{port}/"),
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
        let dir = std::env::temp_dir().join(format!("locksmith-sentinel-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = format!("m{}", unique_suffix().replace(['-', ':'], ""));
        let mut set = SentinelSet {
            dir: dir.clone(),
            name,
            servers: Vec::new(),
            sentinels: Vec::new(),
        };
        let master_port = free_port();
        for k in 0..3 {
            let port = if k == 0 { master_port } else { free_port() };
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
                    master_port.to_string(),
                ]);
            }
            let child = spawn(&args, &log);
            set.servers.push(Proc {
                port,
                child: Some(child),
                log,
            });
        }
        for _ in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{port}.conf"));
            let log = dir.join(format!("sentinel-{port}.log"));
            let n = &set.name;
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {l}\n\
                     sentinel monitor {n} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {n} {down}\n\
                     sentinel failover-timeout {n} {fo}\n\
                     sentinel parallel-syncs {n} 2\n",
                    d = dir.display(),
                    l = log.display(),
                    down = DOWN_AFTER.as_millis(),
                    fo = FAILOVER_TIMEOUT.as_millis(),
                ),
            )
            .unwrap();
            let child = spawn(
                &[conf.to_str().unwrap().to_owned(), "--sentinel".to_owned()],
                &log,
            );
            set.sentinels.push(Proc {
                port,
                child: Some(child),
                log,
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
            query::<String>(master, redis::cmd("INFO").arg("replication"))
                .map(|i| i.matches("state=online").count() >= 2)
                .unwrap_or(false)
        });
        for s in &self.sentinels {
            wait_for(
                "sentinels know each other and the replicas",
                timeout,
                || {
                    let replicas: Vec<redis::Value> = query(
                        s.port,
                        redis::cmd("SENTINEL").arg("replicas").arg(&self.name),
                    )
                    .unwrap_or_default();
                    let others: Vec<redis::Value> = query(
                        s.port,
                        redis::cmd("SENTINEL").arg("sentinels").arg(&self.name),
                    )
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

    /// `redis://127.0.0.1:PORT/` of each sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The master's port as the first sentinel that answers says (waiting at most 10 s for
    /// one that answers, e.g. while they start).
    ///
    /// # Panics
    /// When no sentinel answers.
    pub fn master_port(&self) -> u16 {
        let mut found = None;
        wait_for("a sentinel that names the master", START, || {
            found = self.sentinels.iter().find_map(|s| {
                query::<(String, u16)>(
                    s.port,
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

    /// The ports of the data servers (master and replicas) still running.
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers
            .iter()
            .filter(|p| p.child.is_some())
            .map(|p| p.port)
            .collect()
    }

    /// A plain connection to the data server on `port`.
    pub fn conn(&self, port: u16) -> redis::Connection {
        connect(
            &format!("redis://127.0.0.1:{port}/"),
            Duration::from_secs(5),
        )
        .unwrap()
    }

    /// Asks a sentinel for a graceful failover (`SENTINEL FAILOVER`) and waits (at most
    /// `timeout`) until the sentinels name another master, whose port it returns.
    pub fn failover(&self, timeout: Duration) -> u16 {
        let old = self.master_port();
        let _: () = query(
            self.sentinels[0].port,
            redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.name),
        )
        .unwrap();
        self.wait_new_master(old, timeout)
    }

    /// Waits (at most `timeout`) until the sentinels name a master other than `old` that says
    /// it is a master (`ROLE`); its port.
    pub fn wait_new_master(&self, old: u16, timeout: Duration) -> u16 {
        let mut new = old;
        wait_for("a new master", timeout, || {
            new = self.master_port();
            new != old
                && query::<Vec<redis::Value>>(new, &redis::cmd("ROLE"))
                    .map(|r| matches!(r.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
                    .unwrap_or(false)
        });
        new
    }

    /// Kills the data server on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(p) = self.servers.iter_mut().find(|p| p.port == port) {
            p.kill();
        }
    }

    /// Freezes (`SIGSTOP`) the data server on `port`.
    pub fn pause(&self, port: u16) {
        let p = self.servers.iter().find(|p| p.port == port).unwrap();
        signal(p.pid(), "STOP");
    }

    /// Thaws (`SIGCONT`) the data server on `port`.
    pub fn resume(&self, port: u16) {
        let p = self.servers.iter().find(|p| p.port == port).unwrap();
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
