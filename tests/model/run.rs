//! One seed of the model, from the parent's side: a fresh `redis-server`, the fault proxy in
//! front of it, the model processes (children re-running this test binary), the fault plan
//! carried out on time, then the end-of-run inspection (connections, channels, keys) and the
//! checker over every process's log.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::check::{self, Call, CallKind, Fault, FaultKind, Finding, History};
use crate::checker::mono_ns;
use crate::common::{self, RedisServer, TestChild};
use crate::plan::{self, FaultOp, Settings, fault_plan};
use crate::proxy::Proxy;

/// The role of a model process (see [`common::ROLE_VAR`]).
pub const ROLE: &str = "model-process";
/// The test that runs a model process.
pub const CHILD_TEST: &str = "child_model_process";

/// How long the processes get to start before the run's clock begins.
pub const STARTUP: Duration = Duration::from_millis(1500);

/// What one seed produced.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub t0: u64,
    pub history: History,
    pub findings: Vec<Finding>,
}

impl Outcome {
    /// A summary and the first findings.
    pub fn report(&self, max: usize) -> String {
        let h = &self.history;
        let mut s = format!(
            "seed {}: {} sections, {} calls, {} lost-lease callbacks, {} faults; {} findings",
            self.seed,
            h.sections.len(),
            h.calls.len(),
            h.lost.len(),
            h.faults.len(),
            self.findings.len()
        );
        s.push_str(&format!("\n  sections: {}", check::section_summary(h)));
        s.push_str(&format!("\n  calls: {}", check::call_summary(h)));
        let forced: Vec<&Fault> = h
            .faults
            .iter()
            .filter(|f| matches!(f.kind, FaultKind::ForcedUnlock { .. }))
            .collect();
        if !forced.is_empty() {
            let freed = forced
                .iter()
                .filter(|f| f.what.ends_with("-> true"))
                .count();
            s.push_str(&format!(
                "\n  forced unlocks: {} ({freed} freed a held lock; {} findings excused)",
                forced.len(),
                check::excused_by_forces(h)
            ));
        }
        let steps: Vec<&Fault> = h
            .faults
            .iter()
            .filter(|f| f.what.starts_with("StepClock"))
            .collect();
        if !steps.is_empty() {
            let forward = steps
                .iter()
                .filter(|f| f.kind == FaultKind::ClockForward)
                .count();
            s.push_str(&format!(
                "\n  server clock steps: {} back, {forward} forward ({} findings excused)",
                steps.len() - forward,
                check::excused_by_clock_steps(h)
            ));
        }
        for f in self.findings.iter().take(max) {
            s.push_str("\n  ");
            s.push_str(&f.describe(self.t0));
        }
        if !self.findings.is_empty() {
            s.push_str("\n  faults:");
            for f in &h.faults {
                s.push_str(&format!(
                    "\n    {:+.1} .. {:+.1} ms {}",
                    (f.start as f64 - self.t0 as f64) / 1e6,
                    (f.end as f64 - self.t0 as f64) / 1e6,
                    f.what
                ));
            }
        }
        s
    }
}

fn temp_dir(seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(common::unique_name(&format!("locksmith-model-{seed}")));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The fault driver's own client, for forced unlocks: straight to Redis (not through the
/// proxy, whose faults are the processes'), with the model's timeouts.
fn driver(server: &RedisServer, settings: &Settings) -> Client {
    Client::builder(server.url())
        .label("model-fault-driver")
        .command_timeout(settings.command_timeout)
        .connect_timeout(settings.connect_timeout)
        .retry_timeout(settings.retry_timeout)
        .build()
        .expect("the fault driver's client")
}

/// `Client::force_unlock(name, kind)` by the fault driver: the fault's kind and description,
/// and the call's record (judged by its bound, one command and connect timeout, as any
/// call; and an error other than a timeout or a connection's is a finding).
fn force_unlock(
    driver: &Client,
    settings: &Settings,
    name: &str,
    kind: locksmith::LockKind,
) -> (FaultKind, String, Call) {
    let start = mono_ns();
    let result = driver.force_unlock(name, kind);
    let end = mono_ns();
    let (outcome, told) = match &result {
        Ok(freed) => (check::Outcome::Ok, freed.to_string()),
        Err(e) => (crate::worker::classify(e), e.to_string()),
    };
    let call = Call {
        kind: CallKind::ForceUnlock,
        method: format!("force_unlock({kind})"),
        name: name.to_owned(),
        owner: "driver".into(),
        proc: usize::MAX,
        start,
        end,
        bound: u64::try_from((settings.command_timeout + settings.connect_timeout).as_nanos())
            .unwrap(),
        outcome,
        of: 0,
    };
    let fault = FaultKind::ForcedUnlock {
        name: name.to_owned(),
        kind,
        freed: !matches!(result, Ok(false)),
    };
    (
        fault,
        format!("ForceUnlock({name:?}, {kind}) -> {told}"),
        call,
    )
}

/// Carries out one fault; returns its record, and the record of the call it made (a forced
/// unlock's).
fn inflict(
    op: &FaultOp,
    server: &mut RedisServer,
    proxy: &Proxy,
    children: &[TestChild],
    driver: Option<&Client>,
    settings: &Settings,
) -> (Fault, Option<Call>) {
    let start = mono_ns();
    let mut kind = FaultKind::Other;
    let query = |server: &RedisServer, args: &[&str]| {
        let mut conn = server.conn();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let _: redis::Value = cmd.query(&mut conn).unwrap();
    };
    match op {
        FaultOp::StopProcess(p, d) => {
            kind = FaultKind::ProcessStopped(*p);
            children[*p].signal("STOP");
            thread::sleep(*d);
            children[*p].signal("CONT");
        }
        FaultOp::StopRedis(d) => {
            server.pause();
            thread::sleep(*d);
            server.resume();
        }
        FaultOp::RestartEmpty => {
            kind = FaultKind::RestartEmpty;
            server.restart();
        }
        FaultOp::KillNormal => query(server, &["CLIENT", "KILL", "TYPE", "normal"]),
        FaultOp::KillPubsub => query(server, &["CLIENT", "KILL", "TYPE", "pubsub"]),
        FaultOp::DebugSleep(d) => {
            let secs = format!("{:.3}", d.as_secs_f64());
            query(server, &["DEBUG", "SLEEP", &secs]);
        }
        FaultOp::CutReplies(n) => proxy.cut_script_replies(*n),
        FaultOp::DelayReplies(n, d) => proxy.delay_script_replies(*d, *n),
        FaultOp::BlackHole(d) => {
            proxy.black_hole();
            thread::sleep(*d);
            proxy.pass();
        }
        FaultOp::ProxyKillAll => proxy.kill_all(),
        FaultOp::StepClock(us) => {
            kind = crate::cluster::step_clock(server.port(), *us);
            let fault = Fault {
                kind,
                what: format!("StepClock({:+.3} s)", *us as f64 / 1e6),
                start,
                end: mono_ns(),
            };
            return (fault, None);
        }
        FaultOp::ForceUnlock(name, lock) => {
            let driver = driver.expect("a client for forced unlocks");
            let (kind, what, call) = force_unlock(driver, settings, name, *lock);
            // The window is the call's.
            let fault = Fault {
                kind,
                what,
                start: call.start,
                end: call.end,
            };
            return (fault, Some(call));
        }
    }
    let fault = Fault {
        kind,
        what: format!("{op:?}"),
        start,
        end: mono_ns(),
    };
    (fault, None)
}

/// Redis clients other than `conn` itself and the links between a master and its replicas,
/// as short `CLIENT LIST` lines.
pub fn other_clients(conn: &mut redis::Connection) -> Vec<String> {
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(conn).unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(conn).unwrap();
    let keep = ["id=", "name=", "age=", "flags=", "sub=", "ssub=", "cmd="];
    list.lines()
        .filter(|l| !l.starts_with(&format!("id={me} ")))
        .filter(|l| {
            // `S`: a replica's link on its master; `M`: the master's link on a replica.
            !l.split(' ').any(|f| {
                f.strip_prefix("flags=")
                    .is_some_and(|v| v.contains(['S', 'M']))
            })
        })
        .map(|l| {
            l.split(' ')
                .filter(|f| keep.iter().any(|k| f.starts_with(k)))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Every key of the library but the fencing marks (one per hash slot, kept by design):
/// the mutexes' lock keys, the fair mutex's lock, queue and waiters, the read-write lock's
/// writer, readers and waiters, the semaphore's holders and leases.
pub fn lock_keys(conn: &mut redis::Connection) -> Vec<String> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", common::PREFIX))
        .query(conn)
        .unwrap();
    keys.into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

/// The model processes of one seed, from the parent's side: started, waited for, their logs
/// read and checked.
pub struct Procs {
    children: Vec<TestChild>,
    dir: PathBuf,
    /// The run's clock: when the processes begin their plans.
    pub t0: u64,
    pub start: Instant,
}

impl Procs {
    /// Starts the processes of `seed`, clients of `url` (for a cluster: every node's URL,
    /// comma-separated; for Sentinel: `MASTER|URL,URL,...`, the master's name and every
    /// sentinel's URL); their plans begin [`STARTUP`] from now.
    pub fn spawn(seed: u64, settings: &Settings, url: &str) -> Procs {
        let dir = temp_dir(seed);
        let t0 = mono_ns() + u64::try_from(STARTUP.as_nanos()).unwrap();
        let start = Instant::now() + STARTUP;
        let children = (0..settings.procs)
            .map(|p| {
                TestChild::spawn(
                    CHILD_TEST,
                    ROLE,
                    &[
                        ("LM_SEED", seed.to_string()),
                        ("LM_PROC", p.to_string()),
                        ("LM_SECS", settings.secs.to_string()),
                        ("LM_FAMILY", settings.family.to_string()),
                        ("LM_URL", url.to_string()),
                        ("LM_T0", t0.to_string()),
                        ("LM_DIR", dir.display().to_string()),
                        ("LM_HOT", u8::from(settings.hot).to_string()),
                        ("LM_CLUSTER", u8::from(settings.cluster).to_string()),
                        ("LM_SENTINEL", u8::from(settings.sentinel).to_string()),
                        ("LM_MIX", settings.mix.to_string()),
                    ],
                )
            })
            .collect();
        Procs {
            children,
            dir,
            t0,
            start,
        }
    }

    /// The processes (to stop one).
    pub fn children(&self) -> &[TestChild] {
        &self.children
    }

    /// Waits until every process has dropped its client and reported its threads (DRAINED):
    /// from then on nothing of theirs may be left on the servers.
    pub fn wait_drained(&self, settings: &Settings) {
        let run_bound = Duration::from_secs(settings.secs) + STARTUP + Duration::from_secs(90);
        for c in &self.children {
            c.wait_line("DRAINED", run_bound.saturating_sub(self.start.elapsed()));
        }
    }

    /// Lets the processes exit, and checks that each did so successfully.
    pub fn exit(&mut self) {
        std::fs::write(self.dir.join("exit"), b"").unwrap();
        for (p, c) in self.children.iter_mut().enumerate() {
            let status = c.wait_timeout(Duration::from_secs(30));
            assert!(status.success(), "model process {p} failed: {status}");
        }
    }

    /// Reads every process's log into `history` and checks it.
    pub fn outcome(self, seed: u64, settings: &Settings, mut history: History) -> Outcome {
        for p in 0..settings.procs {
            let path = self.dir.join(format!("p{p}.log"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            assert!(
                crate::journal::read_into(&text, &mut history),
                "model process {p} did not finish its log"
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let findings = check::check(&history, u64::try_from(settings.slack.as_nanos()).unwrap());
        Outcome {
            seed,
            t0: self.t0,
            history,
            findings,
        }
    }
}

/// Runs one seed and checks it. Panics only on a failure of the harness itself (a process
/// that crashed or hung); violations of the library's promises are returned as findings.
pub fn run_seed(seed: u64, settings: &Settings) -> Outcome {
    let faults = fault_plan(seed, settings);
    if settings.clock_steps {
        common::clock_shift::enable().expect("the clock library builds (needs cc)");
    }
    let mut server = RedisServer::start();
    let mut proxy = Proxy::start(server.port());
    let mut procs = Procs::spawn(seed, settings, &proxy.url());

    let mut history = History {
        lease: u64::try_from(settings.max_lease().as_nanos()).unwrap(),
        ..History::default()
    };
    let driver = faults
        .iter()
        .any(|(_, op)| matches!(op, FaultOp::ForceUnlock(..)))
        .then(|| driver(&server, settings));
    for (at, op) in &faults {
        thread::sleep((procs.start + *at).saturating_duration_since(Instant::now()));
        let (fault, call) = inflict(
            op,
            &mut server,
            &proxy,
            procs.children(),
            driver.as_ref(),
            settings,
        );
        history.faults.push(fault);
        history.calls.extend(call);
    }
    // Its connection must be gone before the inspection below.
    drop(driver);

    procs.wait_drained(settings);
    // Through the proxy, a connection a client left open stays open upstream: look before the
    // proxy is stopped (which closes everything).
    let mut conn = server.conn();
    let mut left = Vec::new();
    common::wait_until(Duration::from_secs(3), || {
        left = other_clients(&mut conn);
        left.is_empty()
    });
    history.leftovers.connections = left;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*")
        .query(&mut conn)
        .unwrap();
    history.leftovers.channels = channels;
    proxy.stop();
    procs.exit();
    // A release that never reached Redis leaves a key for one lease at most (plus the steps
    // back of the server's clock since it was written).
    let mut keys = Vec::new();
    let outlive = plan::back_steps(&faults);
    common::wait_until(
        settings.max_lease() + outlive + Duration::from_secs(1),
        || {
            keys = lock_keys(&mut conn);
            keys.is_empty()
        },
    );
    history.leftovers.keys = keys;
    procs.outcome(seed, settings, history)
}

/// The body of a model process (the child side of [`run_seed`]).
pub fn child_main() {
    let var = |v: &str| common::child_env(v);
    let seed: u64 = var("LM_SEED").parse().unwrap();
    let proc: usize = var("LM_PROC").parse().unwrap();
    let secs = var("LM_SECS").parse().unwrap();
    let settings = if let Some(s) = Settings::of_mix(&var("LM_MIX"), secs) {
        s
    } else if var("LM_CLUSTER") == "1" {
        Settings::cluster(secs)
    } else if var("LM_SENTINEL") == "1" {
        Settings::sentinel(secs)
    } else if var("LM_HOT") == "1" {
        Settings::hot(secs)
    } else if var("LM_FAMILY") == "true" {
        Settings::new(secs)
    } else {
        Settings::mutex_only(secs)
    };
    let t0: u64 = var("LM_T0").parse().unwrap();
    let dir = PathBuf::from(var("LM_DIR"));
    let now = mono_ns();
    let begin = Instant::now() + Duration::from_nanos(t0.saturating_sub(now));
    let stop_at = begin + Duration::from_secs(settings.secs);
    crate::worker::run_process(
        seed,
        proc,
        &settings,
        &var("LM_URL"),
        dir.join(format!("p{proc}.log")),
        begin,
        stop_at,
    );
    println!("DRAINED");
    // Stay alive (holding no client) until the parent has looked at the server.
    let gate = dir.join("exit");
    common::wait_until(Duration::from_secs(60), || gate.exists());
}
