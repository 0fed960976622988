//! A Redis Cluster for one test: masters and replicas (`redis-server --cluster-enabled yes`)
//! on free ports of 127.0.0.1, joined with `redis-cli --cluster create`, with a short
//! `cluster-node-timeout` so that a killed master fails over within a few seconds. Every
//! process is killed and reaped on `Drop`, and its directory removed.
//!
//! Helpers find a slot's master and replicas, kill, restart (it rejoins with its
//! `nodes.conf`), pause and resume nodes, run `CLUSTER FAILOVER` on a replica, wait until
//! the replicas have caught up, and move a slot to another master step by step
//! (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`, `CLUSTER SETSLOT ... NODE`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::names::unique_suffix;
use crate::program::{cli_program, server_program};
use crate::server::{answering_pid, connect, free_port, signal};

/// The nodes' `cluster-node-timeout`: a master unreachable for this long is failed over.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long the cluster may take to form.
const START: Duration = Duration::from_secs(30);

/// One cluster node.
#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Node {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits (at most [`START`]) until the node answers as the process it runs, not as
    /// another process that took its port first; `what` names the wait in the panic.
    fn wait_up(&self, what: &str) {
        let pid = self.child.as_ref().map(Child::id);
        wait_for(&format!("node {} {what}", self.port), START, || {
            pid.is_some() && answering_pid(&url(self.port)) == pid
        });
    }
}

/// A Redis Cluster: `masters` masters with `replicas` replicas each.
#[derive(Debug)]
pub struct RedisCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// Polls `ok` every 20 ms until it holds, for at most `timeout`; panics naming `what` then.
fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while !ok() {
        assert!(
            Instant::now() < until,
            "timed out after {timeout:?}: {what}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// One shard as `CLUSTER SLOTS` describes it: a slot range, its master's port and its
/// replicas' ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// First slot of the range.
    pub start: u16,
    /// Last slot of the range (inclusive).
    pub end: u16,
    /// The master's port.
    pub master: u16,
    /// The replicas' ports.
    pub replicas: Vec<u16>,
}

/// Starts the `redis-server` of a cluster node on `port`, in `dir` (where its `nodes.conf`
/// lives), logging to `log`.
fn spawn_node(port: u16, dir: &std::path::Path, log: &std::path::Path) -> Child {
    let mut cmd = Command::new(server_program());
    crate::clock_shift::apply(&mut cmd, port);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args([
            "--cluster-node-timeout",
            &NODE_TIMEOUT.as_millis().to_string(),
        ])
        // A replica whose master was away long ago may still be promoted (tests kill
        // masters right after a start).
        .args(["--cluster-replica-validity-factor", "0"])
        .args(["--cluster-allow-replica-migration", "no"])
        .args([
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])
        .args(["--enable-debug-command", "local"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", server_program()))
}

/// A field of an `INFO` reply (`name:value` lines).
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The fields of a RESP3 map or of a RESP2 flat array of pairs.
fn fields(v: &Value) -> Vec<(String, &Value)> {
    match v {
        Value::Map(m) => m.iter().filter_map(|(k, v)| Some((text(k)?, v))).collect(),
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|p| Some((text(p.first()?)?, p.get(1)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A `CLUSTER SHARDS` reply: one [`Shard`] per slot range of each shard that has slots.
fn parse_shards(v: &Value) -> Option<Vec<Shard>> {
    let Value::Array(list) = v else { return None };
    let mut shards = Vec::new();
    for shard in list {
        let f = fields(shard);
        let get = |name: &str| f.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let Some(Value::Array(slots)) = get("slots") else {
            return None;
        };
        let Some(Value::Array(nodes)) = get("nodes") else {
            return None;
        };
        let (mut master, mut replicas) = (None, Vec::new());
        for node in nodes {
            let n = fields(node);
            let get = |name: &str| n.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            let port = get("port").and_then(int)? as u16;
            // A failed node is neither: Valkey keeps a master that failed over in its shard,
            // still as `role master` (with `health fail`), next to the promoted one.
            match (
                get("role").and_then(text).as_deref(),
                get("health").and_then(text).as_deref(),
            ) {
                (_, Some("fail" | "failed")) => {}
                (Some("master"), _) => master = Some(port),
                _ => replicas.push(port),
            }
        }
        for range in slots.chunks(2) {
            shards.push(Shard {
                start: int(range.first()?)? as u16,
                end: int(range.get(1)?)? as u16,
                master: master?,
                replicas: replicas.clone(),
            });
        }
    }
    Some(shards)
}

/// A `CLUSTER SLOTS` reply.
fn parse_slots(v: &Value) -> Option<Vec<Shard>> {
    let Value::Array(ranges) = v else { return None };
    let port_of = |v: &Value| match v {
        Value::Array(a) => a.get(1).and_then(int).map(|p| p as u16),
        _ => None,
    };
    ranges
        .iter()
        .map(|r| {
            let Value::Array(items) = r else { return None };
            Some(Shard {
                start: int(items.first()?)? as u16,
                end: int(items.get(1)?)? as u16,
                master: port_of(items.get(2)?)?,
                replicas: items[3..].iter().filter_map(port_of).collect(),
            })
        })
        .collect()
}

impl RedisCluster {
    /// Starts 3 masters with 1 replica each and waits (at most 30 s) until every node says
    /// `cluster_state:ok` and knows the whole slot map.
    ///
    /// # Panics
    /// When `redis-server`/`redis-cli` are missing or the cluster does not form in time.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(3, 1)
    }

    /// Starts `masters` masters (at least 1) with `replicas` replicas each.
    ///
    /// # Panics
    /// As [`RedisCluster::start`].
    pub fn start_with(masters: usize, replicas: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs a master");
        let dir = std::env::temp_dir().join(format!("locksmith-cluster-{}", unique_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cluster = RedisCluster {
            dir: dir.clone(),
            nodes: Vec::new(),
        };
        let total = masters * (1 + replicas);
        for _ in 0..total {
            // Ports come from 10000..20000 and their bus ports (`port + 10000`) from
            // 20000..30000, so no node's port is another node's bus port.
            let port = free_port();
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let log = node_dir.join("redis.log");
            let child = spawn_node(port, &node_dir, &log);
            cluster.nodes.push(Node {
                port,
                child: Some(child),
                log,
            });
        }
        for n in &cluster.nodes {
            n.wait_up("answers");
        }
        if total == 1 {
            // One master alone: `redis-cli --cluster create` wants three; assign by hand.
            let port = cluster.nodes[0].port;
            let mut c = cluster.conn(port);
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(0)
                .arg(16383)
                .query(&mut c)
                .unwrap();
        } else {
            let mut cmd = Command::new(cli_program());
            cmd.arg("--cluster").arg("create");
            for n in &cluster.nodes {
                cmd.arg(format!("127.0.0.1:{}", n.port));
            }
            let out = cmd
                .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli_program()));
            assert!(
                out.status.success(),
                "redis-cli --cluster create failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        cluster.wait_ok(START);
        wait_for("replicas in sync", START, || {
            cluster
                .shards()
                .iter()
                .map(|s| s.replicas.len())
                .sum::<usize>()
                == masters * replicas
                && cluster.shards().iter().all(|s| {
                    s.replicas.iter().all(|&r| {
                        cluster
                            .info(r, "replication")
                            .contains("master_link_status:up")
                    })
                })
        });
        cluster
    }

    /// Waits until every live node says `cluster_state:ok` and all of them describe the same
    /// slot map.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait_ok(&self, timeout: Duration) {
        wait_for("cluster_state:ok on every node", timeout, || {
            let mut maps = Vec::new();
            for port in self.live_ports() {
                if !self.info_cluster(port).contains("cluster_state:ok") {
                    return false;
                }
                match self.try_shards(port) {
                    Some(s) => maps.push(s),
                    None => return false,
                }
            }
            maps.windows(2).all(|w| w[0] == w[1])
        });
    }

    fn info_cluster(&self, port: u16) -> String {
        connect(&url(port), Duration::from_millis(500))
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
            .unwrap_or_default()
    }

    /// `INFO section` of a node (empty when it does not answer).
    pub fn info(&self, port: u16, section: &str) -> String {
        connect(&url(port), Duration::from_millis(500))
            .and_then(|mut c| redis::cmd("INFO").arg(section).query::<String>(&mut c))
            .unwrap_or_default()
    }

    /// The ports of nodes that were not killed.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// Every node's URL (`redis://127.0.0.1:PORT/`), as seeds for a client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| url(n.port)).collect()
    }

    /// A node's URL.
    pub fn url(&self, port: u16) -> String {
        url(port)
    }

    /// A connection to a node (5 s timeouts).
    ///
    /// # Panics
    /// When the node does not accept it.
    pub fn conn(&self, port: u16) -> redis::Connection {
        connect(&url(port), Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("cannot connect to node {port}: {e}"))
    }

    /// The slot map as node `port` describes it, from `CLUSTER SHARDS` (Redis 7.0 answers
    /// `CLUSTER SLOTS` from a cache that learns of new replicas seconds late), else from
    /// `CLUSTER SLOTS`. Replicas the node believes failed are left out.
    fn try_shards(&self, port: u16) -> Option<Vec<Shard>> {
        let mut c = connect(&url(port), Duration::from_millis(500)).ok()?;
        let mut shards = match redis::cmd("CLUSTER").arg("SHARDS").query::<Value>(&mut c) {
            Ok(v) => parse_shards(&v)?,
            Err(_) => {
                let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).ok()?;
                parse_slots(&v)?
            }
        };
        for s in &mut shards {
            s.replicas.sort_unstable();
        }
        shards.sort_by_key(|s| s.start);
        Some(shards)
    }

    /// The slot map as the first live node that answers describes it, ordered by slot.
    ///
    /// # Panics
    /// When no node answers.
    pub fn shards(&self) -> Vec<Shard> {
        for port in self.live_ports() {
            if let Some(s) = self.try_shards(port) {
                return s;
            }
        }
        panic!("no cluster node describes its slot map");
    }

    /// The masters' ports as the live cluster has them now (after failovers and slot
    /// migrations), each once, ordered by the first slot it serves.
    pub fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = Vec::new();
        for s in self.shards() {
            if !m.contains(&s.master) {
                m.push(s.master);
            }
        }
        m
    }

    /// The port of the master that owns `slot`.
    ///
    /// # Panics
    /// When no node answers or the slot is not served.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.shards()
            .iter()
            .find(|s| s.start <= slot && slot <= s.end)
            .map(|s| s.master)
            .unwrap_or_else(|| panic!("slot {slot} is not served"))
    }

    /// The port of a replica of the master that owns `slot`.
    ///
    /// # Panics
    /// When the slot has no replica.
    pub fn replica_of_slot(&self, slot: u16) -> u16 {
        self.shards()
            .iter()
            .find(|s| s.start <= slot && slot <= s.end)
            .and_then(|s| s.replicas.first().copied())
            .unwrap_or_else(|| panic!("slot {slot} has no replica"))
    }

    /// The master of the slot of `key` (by `CLUSTER KEYSLOT`).
    pub fn master_of_key(&self, key: &str) -> u16 {
        self.master_of_slot(self.slot_of(key))
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.live_ports()[0];
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query::<u16>(&mut self.conn(port))
            .unwrap()
    }

    /// A node's id (`CLUSTER MYID`).
    pub fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.conn(port))
            .unwrap()
    }

    fn pid(&self, port: u16) -> u32 {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
            .unwrap_or_else(|| panic!("node {port} is not running"))
    }

    /// The process ids of the running nodes (to pin them to a CPU, for instance).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// SIGKILLs a node (it stays down).
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port) {
            n.kill();
        }
    }

    /// Starts a node killed with [`kill`](Self::kill) again, on its port and with its
    /// `nodes.conf` (its data is gone: no persistence), and waits until it answers `PING`.
    /// It rejoins the cluster by itself: a master that was failed over meanwhile learns of its
    /// successor and turns into its replica (see [`wait_replicas_synced`](Self::wait_replicas_synced)).
    ///
    /// # Panics
    /// When `port` is not a node of this cluster, is still running, or does not answer
    /// within 30 s.
    pub fn restart(&mut self, port: u16) {
        let dir = self.dir.join(port.to_string());
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("{port} is not a node of this cluster"));
        assert!(node.child.is_none(), "node {port} is still running");
        node.child = Some(spawn_node(port, &dir, &node.log));
        node.wait_up("answers again");
    }

    /// Waits until every live node is either a master of the slot map or a replica of one
    /// whose link is up (`master_link_status:up`, no sync in progress), and each replica's
    /// replication offset has reached the offset its master had when it was looked at: what
    /// was written before this call is on the replicas.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait_replicas_synced(&self, timeout: Duration) {
        wait_for("every replica linked and caught up", timeout, || {
            let Some(shards) = self
                .live_ports()
                .into_iter()
                .find_map(|p| self.try_shards(p))
            else {
                return false;
            };
            let offset = |info: &str, field: &str| {
                info_field(info, field).and_then(|v| v.parse::<u64>().ok())
            };
            let mut accounted = 0;
            for shard in &shards {
                if shards
                    .iter()
                    .take_while(|s| s.start < shard.start)
                    .any(|s| s.master == shard.master)
                {
                    continue; // a master with several ranges, seen already
                }
                let Some(master_at) = offset(
                    &self.info(shard.master, "replication"),
                    "master_repl_offset",
                ) else {
                    return false;
                };
                accounted += 1;
                for &r in &shard.replicas {
                    let info = self.info(r, "replication");
                    let caught_up = info_field(&info, "master_link_status") == Some("up")
                        && info_field(&info, "master_sync_in_progress") == Some("0")
                        && info_field(&info, "master_port") == Some(&shard.master.to_string())
                        && offset(&info, "slave_repl_offset").is_some_and(|o| o >= master_at);
                    if !caught_up {
                        return false;
                    }
                    accounted += 1;
                }
            }
            accounted == self.live_ports().len()
        });
    }

    /// SIGSTOPs a node.
    pub fn pause(&self, port: u16) {
        signal(self.pid(port), "STOP");
    }

    /// SIGCONTs a node.
    pub fn resume(&self, port: u16) {
        signal(self.pid(port), "CONT");
    }

    /// `CLUSTER FAILOVER` on `replica`, and waits until it is the master of its slots.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn failover(&self, replica: u16, timeout: Duration) {
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut self.conn(replica))
            .unwrap();
        wait_for(&format!("node {replica} promoted"), timeout, || {
            self.info(replica, "replication").contains("role:master")
        });
        self.wait_ok(timeout);
    }

    /// Waits until `slot` is served by another master than `old`, and the cluster is ok;
    /// returns the new master's port.
    ///
    /// # Panics
    /// After `timeout`.
    pub fn wait_new_master(&self, slot: u16, old: u16, timeout: Duration) -> u16 {
        let mut new = old;
        wait_for(
            &format!("slot {slot} failed over from {old}"),
            timeout,
            || {
                let found = self
                    .live_ports()
                    .into_iter()
                    .find_map(|p| self.try_shards(p))
                    .and_then(|s| {
                        s.iter()
                            .find(|s| s.start <= slot && slot <= s.end)
                            .map(|s| s.master)
                    });
                match found {
                    Some(m) if m != old => {
                        new = m;
                        true
                    }
                    _ => false,
                }
            },
        );
        self.wait_ok(timeout);
        new
    }

    /// Starts moving `slot` from its master to master `to`: `IMPORTING` on `to`,
    /// `MIGRATING` on the owner. Until [`finish_migration`](Self::finish_migration), keys
    /// that are already moved are answered with `ASK` by the old owner.
    pub fn begin_migration(&self, slot: u16, to: u16) -> u16 {
        let from = self.master_of_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on {to}");
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query(&mut self.conn(to))
            .unwrap();
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query(&mut self.conn(from))
            .unwrap();
        from
    }

    /// Moves every key of `slot` from `from` to `to` with `MIGRATE`.
    pub fn migrate_keys(&self, slot: u16, from: u16, to: u16) {
        let mut c = self.conn(from);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut c)
                .unwrap();
            if keys.is_empty() {
                return;
            }
            let _: Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut c)
                .unwrap();
        }
    }

    /// Ends a migration: `SETSLOT slot NODE to` on `to`, `from` and every other master, then
    /// waits until the cluster agrees.
    pub fn finish_migration(&self, slot: u16, from: u16, to: u16) {
        let to_id = self.node_id(to);
        let mut order = vec![to, from];
        order.extend(
            self.masters()
                .into_iter()
                .filter(|m| *m != to && *m != from),
        );
        for port in order {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&to_id)
                .query(&mut self.conn(port))
                .unwrap();
        }
        self.wait_ok(START);
    }

    /// Moves `slot` to master `to` (all three steps); returns the old owner's port.
    pub fn migrate_slot(&self, slot: u16, to: u16) -> u16 {
        let from = self.begin_migration(slot, to);
        self.migrate_keys(slot, from, to);
        self.finish_migration(slot, from, to);
        from
    }

    /// `PUBSUB SHARDNUMSUB channel` on node `port`.
    pub fn shard_numsub(&self, port: u16, channel: &str) -> i64 {
        let v: Vec<Value> = redis::cmd("PUBSUB")
            .arg("SHARDNUMSUB")
            .arg(channel)
            .query(&mut self.conn(port))
            .unwrap();
        match v.get(1) {
            Some(Value::Int(n)) => *n,
            _ => 0,
        }
    }

    /// The last `n` lines of every node's log.
    pub fn logs(&self, n: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = std::fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- node {} ---\n", node.port));
            out.push_str(&lines[lines.len().saturating_sub(n)..].join("\n"));
            out.push('\n');
        }
        out
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("{}", self.logs(20));
        }
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(port: i64, role: &str, health: &str) -> Value {
        Value::Array(vec![
            bulk("port"),
            Value::Int(port),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    /// After a failover, Valkey lists the failed old master as `role master`, `health fail`,
    /// beside the promoted one, in either order: the promoted one is the master.
    #[test]
    fn a_failed_master_is_not_the_shards_master() {
        for nodes in [
            vec![node(7001, "master", "fail"), node(7004, "master", "online")],
            vec![node(7004, "master", "online"), node(7001, "master", "fail")],
        ] {
            let reply = Value::Array(vec![Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![Value::Int(0), Value::Int(5460)]),
                bulk("nodes"),
                Value::Array(nodes),
            ])]);
            let shards = parse_shards(&reply).unwrap();
            assert_eq!(shards[0].master, 7004);
            assert!(shards[0].replicas.is_empty());
        }
    }
}
