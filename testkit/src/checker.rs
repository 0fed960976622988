//! The fenced store, the interval log and the checker of the fault and soak tests.
//!
//! - [`Store`]: a stand-in for the resource a lock protects, independent of Redis (it lives in
//!   the test process and speaks a line protocol over TCP, so child processes use it too). Per
//!   resource it keeps a value and a fence: `write(token, value)` is accepted only if `token`
//!   is at least the highest token accepted so far (equal: another write of the same
//!   acquisition), so a stale holder's write is rejected once a newer owner has written.
//! - The interval log: every critical section sends `lock, pid, worker, token, start, end,
//!   held` to the store. `start` is stamped right after `lock()` returned and before a
//!   `check()` that passed; `end` right before the final `check()`; `held` says whether that
//!   final check passed. So a `held` interval lies inside the holder's valid lease, and one
//!   that is not `held` belongs to a holder that reported itself lost.
//! - [`check`]: no two `held` intervals of one lock overlap, tokens strictly increase in
//!   acquisition (start) order, and (by the caller) the final value equals the accepted
//!   increments.
//!
//! Times come from [`mono_ns`]: CLOCK_MONOTONIC, which is one clock for every process of the
//! host, so intervals of different processes compare.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

pub use crate::clock::{mono_ns, ms_between};
pub use crate::rng::Rng;

/// One critical section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// The lock name.
    pub lock: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holder's worker thread number within its process.
    pub worker: u32,
    /// The fencing token of the acquisition.
    pub token: u64,
    /// [`mono_ns`] right after the lock was granted and found held.
    pub start: u64,
    /// [`mono_ns`] right before the final check.
    pub end: u64,
    /// The final `check()` passed (false: the holder reported itself lost).
    pub held: bool,
}

/// One write seen by the store.
#[derive(Debug, Clone, Copy)]
pub struct WriteRec {
    /// The writer's fencing token.
    pub token: u64,
    /// The value it wrote.
    pub value: u64,
    /// The store accepted it (the token was not stale).
    pub accepted: bool,
    /// [`mono_ns`] when the store saw it.
    pub at: u64,
}

/// One protected resource.
#[derive(Debug, Clone, Default)]
pub struct Resource {
    /// The last accepted value.
    pub value: u64,
    /// The highest token accepted so far.
    pub fence: u64,
    /// Writes accepted.
    pub accepted: u64,
    /// Writes rejected as stale.
    pub rejected: u64,
    /// Every write, in arrival order.
    pub writes: Vec<WriteRec>,
}

#[derive(Debug, Default)]
struct State {
    resources: HashMap<String, Resource>,
    intervals: Vec<Interval>,
    /// Free-form reports of the workers: `(key, value)`.
    reports: Vec<(String, String)>,
}

/// The fenced store and interval log server.
#[derive(Debug)]
pub struct Store {
    port: u16,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Store {
    /// Starts the store on a free port of 127.0.0.1.
    pub fn start() -> Store {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (Arc::clone(&state), Arc::clone(&stop));
        let accept = thread::Builder::new()
            .name("store-accept".into())
            .spawn(move || {
                for s in listener.incoming() {
                    if sp.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(s) = s else { continue };
                    let st = Arc::clone(&st);
                    // Connection threads end when their client closes.
                    thread::spawn(move || serve(s, &st));
                }
            })
            .unwrap();
        Store {
            port,
            state,
            stop,
            accept: Some(accept),
        }
    }

    /// The port its clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new connection to it.
    pub fn client(&self) -> StoreClient {
        StoreClient::connect(self.port)
    }

    /// A copy of one resource (empty if never used).
    pub fn resource(&self, name: &str) -> Resource {
        self.state
            .lock()
            .unwrap()
            .resources
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// Every interval logged so far.
    pub fn intervals(&self) -> Vec<Interval> {
        self.state.lock().unwrap().intervals.clone()
    }

    /// Values reported under `key`.
    pub fn reports(&self, key: &str) -> Vec<String> {
        self.state
            .lock()
            .unwrap()
            .reports
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The totals the load workers report (see `load.rs`), by name.
    pub fn worker_totals(&self) -> std::collections::HashMap<&'static str, u64> {
        [
            "acquired",
            "accepted",
            "rejected",
            "retriable",
            "other",
            "lost",
            "depth_bad",
            "timeouts",
        ]
        .into_iter()
        .map(|k| (k, self.report_sum(k)))
        .collect()
    }

    /// Sum of the numeric reports under `key`.
    pub fn report_sum(&self, key: &str) -> u64 {
        self.reports(key)
            .iter()
            .map(|v| v.parse::<u64>().unwrap())
            .sum()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    // Replies are small and go out in one write each, without Nagle's delay.
    let _ = stream.set_nodelay(true);
    let mut out = stream.try_clone().unwrap();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split(' ').collect();
        let reply = {
            let mut st = state.lock().unwrap();
            match f.as_slice() {
                ["R", name] => {
                    let r = st.resources.entry((*name).to_string()).or_default();
                    format!("V {} {}", r.value, r.fence)
                }
                ["W", name, token, value] => {
                    let (token, value): (u64, u64) =
                        (token.parse().unwrap(), value.parse().unwrap());
                    let r = st.resources.entry((*name).to_string()).or_default();
                    let accepted = token >= r.fence;
                    r.writes.push(WriteRec {
                        token,
                        value,
                        accepted,
                        at: mono_ns(),
                    });
                    if accepted {
                        r.fence = token;
                        r.value = value;
                        r.accepted += 1;
                        "OK".to_string()
                    } else {
                        r.rejected += 1;
                        format!("STALE {}", r.fence)
                    }
                }
                ["I", lock, pid, worker, token, start, end, held] => {
                    st.intervals.push(Interval {
                        lock: (*lock).to_string(),
                        pid: pid.parse().unwrap(),
                        worker: worker.parse().unwrap(),
                        token: token.parse().unwrap(),
                        start: start.parse().unwrap(),
                        end: end.parse().unwrap(),
                        held: *held == "1",
                    });
                    "OK".to_string()
                }
                ["M", key, value] => {
                    st.reports.push(((*key).to_string(), (*value).to_string()));
                    "OK".to_string()
                }
                _ => format!("ERR {line}"),
            }
        };
        if out.write_all(format!("{reply}\n").as_bytes()).is_err() {
            break;
        }
    }
    let _ = out.shutdown(Shutdown::Both);
}

/// A connection to the [`Store`].
#[derive(Debug)]
pub struct StoreClient {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl StoreClient {
    /// Connects to the store on `port` (replies are awaited at most 30 s).
    pub fn connect(port: u16) -> StoreClient {
        let out = TcpStream::connect(("127.0.0.1", port)).unwrap();
        out.set_nodelay(true).unwrap();
        out.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let input = BufReader::new(out.try_clone().unwrap());
        StoreClient { out, input }
    }

    fn call(&mut self, line: &str) -> String {
        self.out.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        self.input.read_line(&mut reply).unwrap();
        let reply = reply.trim_end().to_string();
        assert!(!reply.starts_with("ERR"), "store: {reply}");
        reply
    }

    /// The current value of `res`.
    pub fn read(&mut self, res: &str) -> u64 {
        let r = self.call(&format!("R {res}"));
        r.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// Writes `value` under `token`; false when the store refused a stale token.
    pub fn write(&mut self, res: &str, token: u64, value: u64) -> bool {
        self.call(&format!("W {res} {token} {value}")) == "OK"
    }

    /// Logs one critical section.
    pub fn interval(&mut self, i: &Interval) {
        self.call(&format!(
            "I {} {} {} {} {} {} {}",
            i.lock,
            i.pid,
            i.worker,
            i.token,
            i.start,
            i.end,
            u8::from(i.held)
        ));
    }

    /// A free-form report (no spaces in either part).
    pub fn report(&mut self, key: &str, value: impl std::fmt::Display) {
        self.call(&format!("M {key} {value}"));
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Findings {
    /// Intervals checked.
    pub intervals: usize,
    /// Intervals whose holder reported itself lost.
    pub lost: usize,
    /// Held intervals of one lock that overlap: (earlier, later).
    pub overlaps: Vec<(Interval, Interval)>,
    /// Consecutive intervals of one lock whose tokens do not increase: (earlier, later).
    pub token_regressions: Vec<(Interval, Interval)>,
}

impl Findings {
    /// No overlap and no token regression.
    pub fn ok(&self) -> bool {
        self.overlaps.is_empty() && self.token_regressions.is_empty()
    }
}

/// Checks the interval log: per lock, no two held intervals overlap and tokens strictly
/// increase in start order.
pub fn check(intervals: &[Interval]) -> Findings {
    let mut by_lock: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for i in intervals {
        by_lock.entry(i.lock.as_str()).or_default().push(i);
    }
    let mut f = Findings {
        intervals: intervals.len(),
        lost: intervals.iter().filter(|i| !i.held).count(),
        ..Findings::default()
    };
    for list in by_lock.values_mut() {
        list.sort_by_key(|i| (i.start, i.end));
        // Held intervals: compare each with the one that ends last among those before it.
        let mut last: Option<&Interval> = None;
        for &i in list.iter().filter(|i| i.held) {
            if let Some(p) = last {
                if i.start < p.end {
                    f.overlaps.push((p.clone(), i.clone()));
                }
                if i.end > p.end {
                    last = Some(i);
                }
            } else {
                last = Some(i);
            }
        }
        for w in list.windows(2) {
            if w[1].token <= w[0].token {
                f.token_regressions.push((w[0].clone(), w[1].clone()));
            }
        }
    }
    f
}

/// The gaps between consecutive critical sections of each lock (next start - previous end),
/// in milliseconds, sorted: the handoff latency as the sections saw it.
pub fn handoff_gaps_ms(intervals: &[Interval]) -> Vec<f64> {
    let mut by_lock: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for i in intervals {
        by_lock.entry(i.lock.as_str()).or_default().push(i);
    }
    let mut gaps = Vec::new();
    for list in by_lock.values_mut() {
        list.sort_by_key(|i| i.start);
        for w in list.windows(2) {
            gaps.push(ms_between(w[0].end, w[1].start));
        }
    }
    gaps.sort_by(f64::total_cmp);
    gaps
}

/// `p50 / p90 / p99 / max` of sorted values, for messages.
pub fn percentiles(sorted: &[f64]) -> String {
    if sorted.is_empty() {
        return "n/a".into();
    }
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    )
}

/// Asserts that [`check`] found nothing, printing the first findings otherwise.
#[track_caller]
pub fn assert_clean(intervals: &[Interval]) -> Findings {
    let f = check(intervals);
    assert!(
        f.ok(),
        "checker: {} overlaps, {} token regressions among {} intervals; first overlap {:?}; \
         first regression {:?}",
        f.overlaps.len(),
        f.token_regressions.len(),
        f.intervals,
        f.overlaps.first(),
        f.token_regressions.first()
    );
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(token: u64, start: u64, end: u64, held: bool) -> Interval {
        Interval {
            lock: "l".into(),
            pid: 1,
            worker: 0,
            token,
            start,
            end,
            held,
        }
    }

    #[test]
    fn checker_finds_overlaps_and_regressions() {
        assert!(check(&[iv(1, 0, 10, true), iv(2, 10, 20, true)]).ok());
        let f = check(&[iv(1, 0, 10, true), iv(2, 9, 20, true)]);
        assert_eq!(f.overlaps.len(), 1);
        // A long interval hides no later overlap.
        let f = check(&[
            iv(1, 0, 100, true),
            iv(2, 10, 20, true),
            iv(3, 50, 60, true),
        ]);
        assert_eq!(f.overlaps.len(), 2);
        // A holder that reported itself lost may overlap.
        assert!(check(&[iv(1, 0, 10, false), iv(2, 5, 20, true)]).ok());
        let f = check(&[iv(2, 0, 10, true), iv(1, 10, 20, true)]);
        assert_eq!(f.token_regressions.len(), 1);
    }
}
