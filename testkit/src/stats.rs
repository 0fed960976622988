//! What Redis saw: `INFO commandstats` counts, `MONITOR` lines, and small key inspections.
//!
//! Two views of `INFO commandstats`: [`commandstats`] (`cmdstat_xxx -> calls`, for assertions
//! in tests) and [`Stats`] maps by bare command name ([`calls_by_command`],
//! [`failed_by_command`], [`usec_by_command`], [`stats_delta`], ...), for the benchmark's
//! per-operation figures.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex as StdMutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::names::unique_suffix;
use crate::wait::wait_until;

/// `INFO commandstats` as `cmdstat_xxx -> calls`.
///
/// # Panics
/// If `INFO` fails.
pub fn commandstats(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    parse_commandstats(&info, "calls")
        .into_iter()
        .map(|(name, calls)| (format!("cmdstat_{name}"), calls))
        .collect()
}

/// Calls of one command in a [`commandstats`] map, 0 if absent.
pub fn calls(stats: &HashMap<String, u64>, cmd: &str) -> u64 {
    stats.get(cmd).copied().unwrap_or(0)
}

/// All script executions Redis has seen: EVALSHA, EVAL, function calls (FCALL) and their
/// read-only forms.
pub fn script_calls(conn: &mut redis::Connection) -> u64 {
    let stats = commandstats(conn);
    [
        "cmdstat_evalsha",
        "cmdstat_eval",
        "cmdstat_evalsha_ro",
        "cmdstat_eval_ro",
        "cmdstat_fcall",
        "cmdstat_fcall_ro",
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

    /// Waits (at most `dur`) until a script call on `key` follows a `SUBSCRIBE` to `channel`
    /// in the log: the moment a waiter blocks. A waiter must try again after its subscription
    /// took effect (or a release between its first attempt and the subscription would be
    /// lost), so once that attempt has run, it sleeps until a release message or its bound.
    /// False if that was not seen in time.
    pub fn wait_blocked(&self, channel: &str, key: &str, dur: Duration) -> bool {
        let quoted = format!("\"{channel}\"");
        wait_until(dur, || {
            let lines = self.lines.lock().unwrap();
            lines
                .iter()
                .position(|l| {
                    l.to_ascii_lowercase().contains("\"subscribe\"") && l.contains(&quoted)
                })
                .is_some_and(|i| Monitor::script_calls_on(&lines[i + 1..], key) > 0)
        })
    }

    /// Of `lines`, the script calls (EVALSHA/EVAL/FCALL sent by a client, not commands run
    /// inside a script) naming `key`.
    pub fn script_calls_on(lines: &[String], key: &str) -> usize {
        let quoted = format!("\"{key}\"");
        lines
            .iter()
            .filter(|l| !l.contains(" lua] "))
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("\"evalsha\"") || l.contains("\"eval\"") || l.contains("\"fcall\"")
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
// Keys, clients, channels
// ---------------------------------------------------------------------------------------------

/// `KEYS pattern`, sorted.
pub fn keys_matching(conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.sort();
    keys
}

/// Lock keys of the default prefix still in Redis.
pub fn lock_keys_left(conn: &mut redis::Connection) -> Vec<String> {
    keys_matching(conn, "locksmith:*:lock")
}

/// `CLIENT LIST`, one line per connection.
pub fn client_list(conn: &mut redis::Connection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    list.lines().map(str::to_string).collect()
}

/// Connections named `locksmith-pubsub` (the library's subscriber).
pub fn pubsub_clients(conn: &mut redis::Connection) -> usize {
    client_list(conn)
        .iter()
        .filter(|l| l.contains("name=locksmith-pubsub"))
        .count()
}

/// `INFO errorstats` as `ERRORNAME -> count`.
pub fn errorstats(conn: &mut redis::Connection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("errorstats").query(conn).unwrap();
    let mut out = HashMap::new();
    for line in info.lines() {
        if let Some((name, rest)) = line.split_once(':')
            && let Some(name) = name.strip_prefix("errorstat_")
            && let Some(n) = rest.strip_prefix("count=")
        {
            out.insert(name.to_string(), n.trim().parse().unwrap());
        }
    }
    out
}

/// The fencing token of the `Mutex` held on `name` (from its lock value).
///
/// # Panics
/// If the lock is not held.
pub fn token_of(conn: &mut redis::Connection, name: &str) -> u64 {
    crate::lock_value::lock_value(conn, name)
        .expect("a held lock")
        .token
}

/// Waits (at most 10 s) until `channel` has at least `n` subscribers.
///
/// # Panics
/// If it does not.
pub fn wait_numsub(conn: &mut redis::Connection, channel: &str, n: u64) {
    assert!(
        wait_until(Duration::from_secs(10), || numsub(conn, channel) >= n),
        "{channel}: fewer than {n} subscribers"
    );
}

/// The payload prefix of the markers of [`ChannelSpy::sync`].
const SYNC_MARKER: &[u8] = b"testkit-channel-spy-sync-";

/// Counts the messages published on one channel, from a separate subscriber connection.
#[derive(Debug)]
pub struct ChannelSpy {
    channel: String,
    count: Arc<AtomicUsize>,
    /// The sync markers seen so far.
    markers: Arc<StdMutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl ChannelSpy {
    /// Subscribes to `channel` on a new connection to `url` and counts its messages from
    /// then on.
    ///
    /// # Panics
    /// If the subscription is not confirmed within 10 s.
    pub fn start(url: &str, channel: &str) -> ChannelSpy {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let markers = Arc::new(StdMutex::new(Vec::new()));
        let (c, m, s) = (Arc::clone(&count), Arc::clone(&markers), Arc::clone(&stop));
        let (url, channel) = (url.to_string(), channel.to_string());
        let sub = channel.clone();
        let handle = thread::spawn(move || {
            let client = redis::Client::open(url).unwrap();
            let mut con = client
                .get_connection_with_timeout(Duration::from_secs(5))
                .unwrap();
            let mut ps = con.as_pubsub();
            ps.subscribe(&sub).unwrap();
            ps.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            ready_tx.send(()).unwrap();
            while !s.load(Ordering::SeqCst) {
                match ps.get_message() {
                    Ok(msg) if msg.get_payload_bytes().starts_with(SYNC_MARKER) => {
                        m.lock().unwrap().push(msg.get_payload_bytes().to_vec());
                    }
                    Ok(_) => {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.is_timeout() => {}
                    Err(_) => break,
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        ChannelSpy {
            channel,
            count,
            markers,
            stop,
            handle: Some(handle),
        }
    }

    /// Messages seen so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// The counter itself, for threads that read it without the spy.
    pub fn counter(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.count)
    }

    /// The messages published on the channel before this call, all of them: publishes a
    /// marker on the channel from `conn` and waits until the spy has seen it. Redis delivers
    /// the messages of a channel to a subscriber in publish order, so every message published
    /// before the marker has been counted by then. Markers are not counted.
    ///
    /// A marker is also a message to every other subscriber of the channel: waiters of a
    /// lock take it for a release and re-check, which is harmless.
    ///
    /// # Panics
    /// If the marker is not seen within 5 s.
    pub fn sync(&self, conn: &mut redis::Connection) -> usize {
        let mut marker = SYNC_MARKER.to_vec();
        marker.extend_from_slice(unique_suffix().as_bytes());
        redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(&marker)
            .exec(conn)
            .unwrap();
        let seen = wait_until(Duration::from_secs(5), || {
            self.markers.lock().unwrap().contains(&marker)
        });
        assert!(
            seen,
            "the spy on {} did not see its sync marker",
            self.channel
        );
        self.count()
    }
}

impl Drop for ChannelSpy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Per-command figures
// ---------------------------------------------------------------------------------------------

/// A per-command figure of `INFO commandstats`, by command name (`evalsha`,
/// `client|setinfo`, ...). Commands run inside scripts are counted too (by the command they
/// run).
pub type Stats = BTreeMap<String, u64>;

/// Calls per command (empty when `INFO` fails).
pub fn calls_by_command(con: &mut redis::Connection) -> Stats {
    commandstats_field(con, "calls")
}

/// Like [`calls_by_command`], for calls that failed (for example `NOSCRIPT`) or were
/// rejected.
pub fn failed_by_command(con: &mut redis::Connection) -> Stats {
    let mut failed = commandstats_field(con, "failed_calls");
    for (k, v) in commandstats_field(con, "rejected_calls") {
        *failed.entry(k).or_default() += v;
    }
    failed
}

/// Like [`calls_by_command`], for the microseconds Redis spent executing each command.
pub fn usec_by_command(con: &mut redis::Connection) -> Stats {
    commandstats_field(con, "usec")
}

fn commandstats_field(con: &mut redis::Connection, field: &str) -> Stats {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .unwrap_or_default();
    parse_commandstats(&info, field)
}

/// One field (`calls`, `usec`, ...) of every `cmdstat_NAME:` line, by `NAME`.
fn parse_commandstats(info: &str, field: &str) -> Stats {
    let prefix = format!("{field}=");
    let mut out = Stats::new();
    for line in info.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        for f in rest.split(',') {
            if let Some(v) = f.strip_prefix(&prefix) {
                out.insert(name.to_owned(), v.trim().parse().unwrap_or(0));
            }
        }
    }
    out
}

/// `after - before`, per command, without the harness's own `INFO` and `PUBSUB` calls.
pub fn stats_delta(before: &Stats, after: &Stats) -> Stats {
    after
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "info" | "pubsub|numsub"))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// One command's figure in `d`, 0 if absent.
pub fn stat(d: &Stats, name: &str) -> u64 {
    d.get(name).copied().unwrap_or(0)
}

/// The sum over every command of `d`.
pub fn stats_total(d: &Stats) -> u64 {
    d.values().sum()
}

/// Script calls in a delta, whichever way they were sent: `EVALSHA` and `FCALL` (a client
/// runs the Mutex acquire and release as functions where the server takes them).
pub fn script_stat(d: &Stats) -> u64 {
    stat(d, "evalsha") + stat(d, "fcall")
}

/// Commands that only a client sends (never run inside locksmith's or the naive lock's
/// scripts): script calls, pub/sub, pings and connection set-up.
pub fn client_level(d: &Stats) -> u64 {
    d.iter()
        .filter(|(k, _)| {
            k.starts_with("eval")
                || k.starts_with("fcall")
                || k.starts_with("client|")
                || k.starts_with("script|")
                || k.starts_with("function|")
                || matches!(
                    k.as_str(),
                    "subscribe" | "unsubscribe" | "ping" | "hello" | "select" | "auth"
                )
        })
        .map(|(_, v)| *v)
        .sum()
}

/// Compact `cmd=n, ...` listing of a delta.
pub fn stats_brief(d: &Stats) -> String {
    let mut v: Vec<_> = d.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_parse() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=3,usec=30,usec_per_call=10.00,\
                    rejected_calls=0,failed_calls=1\r\ncmdstat_client|setinfo:calls=2,usec=1\r\n";
        let calls = parse_commandstats(info, "calls");
        assert_eq!(stat(&calls, "evalsha"), 3);
        assert_eq!(stat(&calls, "client|setinfo"), 2);
        assert_eq!(
            stat(&parse_commandstats(info, "failed_calls"), "evalsha"),
            1
        );
        assert_eq!(stats_total(&calls), 5);
        assert_eq!(client_level(&calls), 5);
    }
}
