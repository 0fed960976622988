//! A run-once job: three processes each tick once a second and try to run that second's job;
//! the job runs exactly once per tick across them, counted on the server, while one of the
//! processes is killed and restarted.
//!
//! ```text
//! cargo run --example scheduled_job
//! ```
//!
//! Each tick a process `try_lock`s the job's lock. The one that gets it runs the job and ends
//! its hold with `unlock_after(600 ms)`: the lock stays taken until 600 ms after it was
//! acquired, so a process whose tick comes later in the same second finds it taken, and the
//! next second's tick finds it free (ShedLock's `lockAtLeastFor`).

#[path = "support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locksmith::Client;
use redis::Commands;

/// The job's lock.
const LOCK: &str = "example:scheduled:report";
/// The example's own data: how often each tick's job ran, `locksmith-example:runs:<tick>`.
const RUNS: &str = "locksmith-example:runs:";
/// How long a hold lasts at least: more than the spread of the processes' ticks in one second
/// (200 ms), and less than the period less that spread.
const MIN_HOLD: Duration = Duration::from_millis(600);
/// How long the example runs.
const SECONDS: u64 = 8;

fn main() -> support::Result<()> {
    let mut args = std::env::args().skip(1);
    if let (Some(role), Some(url), Some(n)) = (args.next(), args.next(), args.next())
        && role == "worker"
    {
        return worker(&url, n.parse()?);
    }
    let redis = support::redis();
    let url = redis.url().to_owned();
    let first = now_secs() + 1;

    let mut workers: Vec<Child> = (0..3).map(|n| spawn(&url, n)).collect::<Result<_, _>>()?;
    for w in &mut workers[1..] {
        echo(w);
    }
    // Kill worker 0, whose tick comes first, right after it ran a job (its hold then ends on
    // its own, 600 ms after it began), and start it again two seconds later: meanwhile the
    // others run the jobs.
    wait_for_a_run(&mut workers[0])?;
    workers[0].kill()?;
    workers[0].wait()?;
    println!("killed worker 0");
    thread::sleep(Duration::from_secs(2));
    workers[0] = spawn(&url, 0)?;
    echo(&mut workers[0]);
    println!("restarted worker 0");
    for mut w in workers {
        w.wait()?;
    }

    let mut data = redis::Client::open(url.as_str())?.get_connection()?;
    let last = now_secs() - 1;
    let mut exactly_once = 0;
    for tick in first..last {
        let runs: Option<u64> = data.get(format!("{RUNS}{tick}"))?;
        let runs = runs.unwrap_or(0);
        println!("tick {tick}: the job ran {runs} time(s)");
        exactly_once += u64::from(runs == 1);
        assert_eq!(runs, 1, "the job of tick {tick} ran {runs} time(s)");
        let _: () = data.del(format!("{RUNS}{tick}"))?;
    }
    println!("{exactly_once} ticks, each job run exactly once across three processes");
    redis.tell_what_is_left(&[LOCK])
}

/// Starts worker `n` (this program again, as a worker).
fn spawn(url: &str, n: u32) -> std::io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["worker", url, &n.to_string()])
        .stdout(Stdio::piped())
        .spawn()
}

/// Echoes what `worker` says, on a thread of its own.
fn echo(worker: &mut Child) {
    if let Some(out) = worker.stdout.take() {
        thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .for_each(|l| println!("{l}"))
        });
    }
}

/// Waits until `worker` says it ran a job, echoing what it says.
fn wait_for_a_run(worker: &mut Child) -> support::Result<()> {
    let out = worker.stdout.take().ok_or("no worker output")?;
    let mut lines = BufReader::new(out).lines();
    for line in lines.by_ref() {
        let line = line?;
        println!("{line}");
        if line.contains("ran the job") {
            // Keep echoing the rest, so that the worker never blocks on a full pipe.
            thread::spawn(move || lines.map_while(Result::ok).for_each(|l| println!("{l}")));
            return Ok(());
        }
    }
    Err("the worker ended before it ran a job".into())
}

/// A worker: each second, a little after the second begins (each its own way), it tries to
/// run that second's job.
fn worker(url: &str, n: u32) -> support::Result<()> {
    let client = Client::builder(url).lease(Duration::from_secs(2)).build()?;
    let lock = client.mutex(LOCK)?;
    let mut data = redis::Client::open(url)?.get_connection()?;
    let end = now_secs() + SECONDS;
    loop {
        // Sleep to the next second, plus this worker's own offset (0, 120, 240 ms).
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let next =
            Duration::from_secs(now.as_secs() + 1) + Duration::from_millis(120 * u64::from(n));
        thread::sleep(next.saturating_sub(now));
        let tick = now_secs();
        if tick >= end {
            return Ok(());
        }
        match lock.try_lock()? {
            Some(guard) => {
                let runs: u64 = data.incr(format!("{RUNS}{tick}"), 1)?;
                guard.unlock_after(MIN_HOLD)?;
                println!("worker {n}: ran the job of tick {tick} (run {runs})");
            }
            None => println!("worker {n}: tick {tick}'s job is taken"),
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
