//! The client's CPU per deduplicating-save cycle, one process, for the three kinds of cycle of
//! the `capacity` workload (`benches/locks/capacity.rs`): `bare` (a `SET` before and a `SET`
//! after), `naive` (`SET NX PX` and a compare-and-delete `EVALSHA`, a connection per thread)
//! and `ls` (locksmith's `Mutex`: `client.mutex(name)`, `try_lock`, the guard's `unlock`), each
//! around a check (`GET`) and a save (`SET`) on the record's fresh name. 16 threads share one
//! `Client`; the server is a `locksmith::testing::Server`.
//!
//!     client-cycle KINDS CYCLES ROUNDS      (KINDS: all, or a comma-separated list)
//!
//! Prints, per kind, the median over rounds of the process's CPU per cycle (utime + stime) and
//! of its user CPU alone (utime: the client's code, without the kernel's socket work), with
//! their ratios to `bare`. Under callgrind (`benches/callgrind/client-cycle.sh`) the
//! difference between two runs of different lengths gives the instructions per cycle, which do
//! not depend on the machine's load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use locksmith_testkit::{process_cpu_ns, process_user_ns};

const THREADS: usize = 16;
const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

static SEQ: AtomicU64 = AtomicU64::new(0);

fn check_and_save(con: &mut redis::Connection, name: &str) {
    let key = format!("saved:{{{name}}}");
    let saved: Option<String> = redis::cmd("GET").arg(&key).query(con).expect("GET");
    if saved.is_none() {
        redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .query::<()>(con)
            .expect("SET");
    }
}

/// One kind's round: (CPU µs per cycle, user CPU µs per cycle).
fn run(kind: &str, url: &str, n: usize, round: usize) -> (f64, f64) {
    let client = locksmith::Client::open(url).expect("client");
    let script = redis::Script::new(RELEASE);
    let sha = script.get_hash().to_owned();
    let rc = redis::Client::open(url).expect("url");
    script
        .prepare_invoke()
        .load(&mut rc.get_connection().expect("connection"))
        .expect("SCRIPT LOAD");
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (client, rc, kind) = (client.clone(), rc.clone(), kind.to_owned());
            let (sha, barrier) = (sha.clone(), Arc::clone(&barrier));
            thread::spawn(move || {
                let mut data = rc.get_connection().expect("connection");
                let mut lock = rc.get_connection().expect("connection");
                if kind == "ls" {
                    // The client's pool and the scripts, ready before the clock starts.
                    let m = client.mutex(&format!("warm:{round}:{t}")).expect("name");
                    drop(m.try_lock().expect("try_lock"));
                }
                barrier.wait();
                for k in 0..n {
                    let name = format!("rec:{kind}:{round}:{t}:{k}");
                    match kind.as_str() {
                        "ls" => {
                            let m = client.mutex(&name).expect("name");
                            let g = m.try_lock().expect("try_lock").expect("a fresh name");
                            check_and_save(&mut data, &name);
                            g.unlock().expect("unlock");
                        }
                        "naive" => {
                            let key = format!("naive:{{{name}}}:lock");
                            let token = SEQ.fetch_add(1, Ordering::Relaxed).to_string();
                            let set = redis::cmd("SET")
                                .arg(&key)
                                .arg(&token)
                                .arg("NX")
                                .arg("PX")
                                .arg(30_000)
                                .query::<Option<String>>(&mut lock);
                            assert!(set.expect("SET NX").is_some());
                            check_and_save(&mut data, &name);
                            let del = redis::cmd("EVALSHA")
                                .arg(&sha)
                                .arg(1)
                                .arg(&key)
                                .arg(&token)
                                .query::<i64>(&mut lock);
                            assert_eq!(del.expect("EVALSHA"), 1);
                        }
                        _ => {
                            let key = format!("bare:{{{name}}}");
                            redis::cmd("SET")
                                .arg(&key)
                                .arg(1)
                                .query::<()>(&mut lock)
                                .expect("SET");
                            check_and_save(&mut data, &name);
                            redis::cmd("SET")
                                .arg(&key)
                                .arg(0)
                                .query::<()>(&mut lock)
                                .expect("SET");
                        }
                    }
                }
                barrier.wait();
            })
        })
        .collect();
    barrier.wait();
    let (cpu0, user0) = (process_cpu_ns(), process_user_ns());
    barrier.wait();
    let (cpu1, user1) = (process_cpu_ns(), process_user_ns());
    for w in workers {
        w.join().expect("worker");
    }
    let cycles = (THREADS * n) as f64;
    let per = |a: Option<u64>, b: Option<u64>| {
        b.unwrap_or(0).saturating_sub(a.unwrap_or(0)) as f64 / 1e3 / cycles
    };
    (per(cpu0, cpu1), per(user0, user1))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kinds = args.get(1).map_or("all", String::as_str);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    let kinds: Vec<&str> = if kinds == "all" {
        vec!["bare", "naive", "ls"]
    } else {
        kinds.split(',').collect()
    };
    let server = locksmith::testing::Server::start().expect("redis-server");
    let mut cpu: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut user: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for &kind in &kinds {
            let (c, u) = run(kind, &server.url(), n, round);
            cpu.entry(kind).or_default().push(c);
            user.entry(kind).or_default().push(u);
        }
    }
    let bare = |m: &BTreeMap<&str, Vec<f64>>| m.get("bare").map(|v| median(v));
    for &kind in &kinds {
        let (c, u) = (median(&cpu[kind]), median(&user[kind]));
        let ratio =
            |x: f64, b: Option<f64>| b.map_or(String::new(), |b| format!(" ({:.2})", x / b));
        println!(
            "{kind:6} CPU per cycle {c:7.2} µs{}   user CPU per cycle {u:6.2} µs{}",
            ratio(c, bare(&cpu)),
            ratio(u, bare(&user))
        );
    }
}
