//! The server's wall clock steps while locks are used (an NTP step, a VM restored from a
//! snapshot, an operator's `date -s`): fencing tokens never go back, a forward step that ends
//! leases early is noticed by the holder and said in the log and the stats.
//!
//! The servers run with the harness's clock library preloaded (`testkit/src/clock_shift.c`),
//! which offsets their `CLOCK_REALTIME` by a value the test moves; see
//! [`common::clock_shift`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer, SentinelSet, clock_shift, with_deadline};
use locksmith::Client;

/// A server whose wall clock the test can step.
fn server() -> RedisServer {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    RedisServer::start()
}

/// One token of each kind of grant on `name`, each taken and released at once: a `Mutex` of
/// `a` and of `b` (two clients), a `FairMutex`, an `RwLock` writer and a two-name
/// `MultiMutex`, in that order.
fn tokens(a: &Client, b: &Client, name: &str) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let mutex = a.mutex(name).unwrap();
    let g = mutex.try_lock().unwrap().expect("free");
    out.push(("Mutex (first client)", g.fencing_token()));
    g.unlock().unwrap();
    let mutex = b.mutex(name).unwrap();
    let g = mutex.try_lock().unwrap().expect("free");
    out.push(("Mutex (second client)", g.fencing_token()));
    g.unlock().unwrap();
    let fair = a.fair_mutex(name).unwrap();
    let g = fair.try_lock().unwrap().expect("free");
    out.push(("FairMutex", g.fencing_token()));
    g.unlock().unwrap();
    let rw = b.rw_lock(name).unwrap();
    let g = rw.try_write().unwrap().expect("free");
    out.push(("RwLock writer", g.fencing_token()));
    g.unlock().unwrap();
    let other = format!("{name}/other");
    let multi = a.multi_lock([name, other.as_str()]).unwrap();
    let g = multi.try_lock().unwrap().expect("free");
    out.push(("MultiMutex", g.fencing_token(name).unwrap()));
    g.unlock().unwrap();
    out
}

/// Tokens of every lock type strictly rise across a step back of the server clock by `step`,
/// and keep rising while the clock is still behind the tokens issued before it.
fn tokens_rise_across_a_step_back(step: Duration) {
    let server = server();
    let a = Client::open(server.url().as_str()).unwrap();
    let b = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-back");
    let before = tokens(&a, &b, &name);
    clock_shift::step_back(server.port(), step);
    let after = tokens(&a, &b, &name);
    let again = tokens(&a, &b, &name);
    let mut last = 0;
    for (what, token) in before.iter().chain(&after).chain(&again) {
        assert!(
            *token > last,
            "{what}: token {token} after {last}, with the server clock stepped back {step:?} \
             (tokens before the step {before:?}, after it {after:?}, then {again:?})"
        );
        last = *token;
    }
    // Mutex and FairMutex tokens of one name rise together: one mark per name.
    assert!(after[0].1 > before[4].1);
}

/// A step back of 10 s (an NTP step): no token goes back.
#[test]
fn tokens_rise_across_a_10_s_step_back() {
    tokens_rise_across_a_step_back(Duration::from_secs(10));
}

/// A step back of an hour (a VM restored from an old snapshot): no token goes back.
#[test]
fn tokens_rise_across_a_1_hour_step_back() {
    tokens_rise_across_a_step_back(Duration::from_secs(3600));
}

/// Local hand-offs issue tokens from a block the grant reserved; after a step back, another
/// client's grant still lands above the whole block.
#[test]
fn tokens_rise_above_a_hand_off_block_across_a_step_back() {
    let server = server();
    let local = Client::builder(server.url().as_str())
        .local_handoff_max_count(1024)
        .build()
        .unwrap();
    let other = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-block");
    let lock = local.mutex(&name).unwrap();
    // Two threads pass the lock between them many times: hand-offs take tokens of the block.
    let mut seen: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..200)
                        .map(|_| {
                            let g = lock.lock().unwrap();
                            g.fencing_token()
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    seen.sort_unstable();
    let highest = *seen.last().unwrap();
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    let g = other
        .mutex(&name)
        .unwrap()
        .try_lock()
        .unwrap()
        .expect("free");
    assert!(
        g.fencing_token() > highest,
        "token {} after a step back, below the {highest} issued before (by {} grants and \
         hand-offs)",
        g.fencing_token(),
        seen.len()
    );
}

/// On a busy name the function library grants from its memory of the slot's mark (a
/// reservation it wrote, checked by one read), beside grants that do not share that memory: a
/// client whose ACL refuses `FCALL` (it sends `EVALSHA`) and a `MultiMutex`. Across steps of the
/// server clock back by less than the reservation (3 ms) and by 10 s, and forward again, every
/// token of the name strictly rises, whichever path issued it.
#[test]
fn tokens_rise_where_the_function_library_remembers_the_mark() {
    let server = server();
    redis::cmd("ACL")
        .arg(
            &[
                "SETUSER", "scripts", "on", ">pw", "~*", "&*", "+@all", "-fcall",
            ][..],
        )
        .exec(&mut server.conn())
        .unwrap();
    let functions = Client::open(server.url().as_str()).unwrap();
    let scripts_url = format!("redis://scripts:pw@127.0.0.1:{}/", server.port());
    let scripts = Client::open(scripts_url.as_str()).unwrap();
    let name = common::unique_name("clock-memory");
    let by_function = functions.mutex(&name).unwrap();
    let by_script = scripts.mutex(&name).unwrap();
    let other = format!("{name}/other");
    let multi = functions
        .multi_lock([name.as_str(), other.as_str()])
        .unwrap();
    let mut tokens: Vec<(String, u64)> = Vec::new();
    let mut round = |when: &str| {
        for i in 0..300 {
            let (who, token) = match i % 50 {
                17 => {
                    let g = by_script.try_lock().unwrap().expect("free");
                    ("EVALSHA", g.fencing_token())
                }
                33 => {
                    let g = multi.try_lock().unwrap().expect("free");
                    ("MultiMutex", g.fencing_token(&name).unwrap())
                }
                _ => {
                    let g = by_function.try_lock().unwrap().expect("free");
                    ("FCALL", g.fencing_token())
                }
            };
            tokens.push((format!("{when}, grant {i} ({who})"), token));
        }
    };
    round("before any step");
    clock_shift::step_back(server.port(), Duration::from_millis(3));
    round("3 ms back");
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    round("10 s back");
    clock_shift::step_forward(server.port(), Duration::from_secs(10));
    round("forward again");
    for pair in tokens.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "{}: token {} after {} ({})",
            pair[1].0,
            pair[1].1,
            pair[0].1,
            pair[0].0
        );
    }
}

/// The acquire and release functions and scripts of the Mutex, called as a client calls them,
/// many cycles in one pipeline, so that the server runs them back to back (grants microseconds
/// apart, however slow the client).
struct Raw {
    acquire: [String; 2],
    release: [String; 2],
    lock: String,
    fence: String,
    marker: String,
    calls: u64,
}

impl Raw {
    /// The calls of `name` on `server`; a client built there has loaded the function library.
    fn new(server: &RedisServer, name: &str) -> Raw {
        Client::open(server.url().as_str()).unwrap();
        let mut conn = server.conn();
        let mut both = |file: &str| -> [String; 2] {
            let source = locksmith_testkit::lua_source(file).unwrap();
            let sha: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query(&mut conn)
                .unwrap();
            [format!("locksmith_{sha}"), sha]
        };
        Raw {
            acquire: both("acquire.lua"),
            release: both("release.lua"),
            lock: common::lock_key(name),
            fence: common::fence_key(name),
            marker: common::release_channel(name),
            calls: 0,
        }
    }

    /// `cycles` acquire+release cycles in one pipeline, each by `FCALL` but where `by_script`
    /// says `EVALSHA`; the tokens granted, in order.
    fn cycles(
        &mut self,
        conn: &mut redis::Connection,
        cycles: u64,
        by_script: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let mut pipe = redis::pipe();
        for i in 0..cycles {
            let (how, at) = if by_script(i) {
                ("EVALSHA", 1)
            } else {
                ("FCALL", 0)
            };
            let request = format!("raw{}", self.calls + i);
            pipe.cmd(how)
                .arg(&self.acquire[at])
                .arg(2)
                .arg(&self.lock)
                .arg(&self.fence)
                .arg(format!("{request}|raw-owner|0"))
                .arg(30_000);
            pipe.cmd(how)
                .arg(&self.release[at])
                .arg(2)
                .arg(&self.lock)
                .arg(&self.marker)
                .arg(format!("{request}|"));
        }
        self.calls += cycles;
        let replies: Vec<redis::Value> = pipe.query(conn).unwrap();
        replies
            .iter()
            .step_by(2)
            .map(|v| match v {
                // A fresh grant's token, or `{1, token, count, gen, upto}` (acquire.lua).
                redis::Value::Int(t) => u64::try_from(*t).unwrap(),
                redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(1)) => {
                    let Some(redis::Value::Int(t)) = a.get(1) else {
                        panic!("a grant's reply: {a:?}")
                    };
                    u64::try_from(*t).unwrap()
                }
                other => panic!("a grant's reply: {other:?}"),
            })
            .collect()
    }
}

impl Raw {
    /// A server whose clock the test can step, the calls of a new name there (`prefix`), and
    /// a connection to send them.
    fn start(prefix: &str) -> (RedisServer, Raw, redis::Connection) {
        let server = server();
        let raw = Raw::new(&server, &common::unique_name(prefix));
        let conn = server.conn();
        (server, raw, conn)
    }

    /// [`Raw::cycles`], and the `SET` commands the server ran for them.
    fn counting_sets(
        &mut self,
        conn: &mut redis::Connection,
        cycles: u64,
        by_script: impl Fn(u64) -> bool,
    ) -> (Vec<u64>, u64) {
        redis::cmd("CONFIG").arg("RESETSTAT").exec(conn).unwrap();
        let tokens = self.cycles(conn, cycles, by_script);
        let stats = common::commandstats(conn);
        (tokens, common::calls(&stats, "cmdstat_set"))
    }

    /// Waits until the server clock is past what the slot's mark covers, so that the next
    /// grant's token is the clock's own: a grant without the memory (`EVALSHA`) that comes
    /// sooner takes the mark + 1 instead (the slow path, two more `SET`).
    fn wait_past_mark(&self, conn: &mut redis::Connection) {
        let mark: Option<String> = redis::cmd("GET").arg(&self.fence).query(conn).unwrap();
        let Some(mark) = mark else { return };
        // The clock, in microseconds, whose token is the mark's reach: a token, or a
        // reservation 'S|US|X|NONCE' reaching X past the clock's token at S, US.
        let reach = match mark.parse::<u64>() {
            Ok(token) => token,
            Err(_) => {
                let f: Vec<u64> = mark
                    .split('|')
                    .take(3)
                    .map(|x| x.parse().unwrap())
                    .collect();
                f[0] * 1_000_000 + f[1] + f[2]
            }
        };
        let ok = common::wait_until(Duration::from_secs(5), || {
            let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
            s * 1_000_000 + us > reach
        });
        assert!(
            ok,
            "the server clock did not pass the mark {mark} within 5 s"
        );
    }
}

/// Asserts that `tokens` strictly rise.
fn strictly_rising(tokens: &[u64], what: &str) {
    for (i, pair) in tokens.windows(2).enumerate() {
        assert!(
            pair[1] > pair[0],
            "{what}: grant {}: {} after {}",
            i + 1,
            pair[1],
            pair[0]
        );
    }
}

/// A busy name: grants through the function library, microseconds apart, are served from its
/// memory of the slot's mark (one `SET` a grant, of the lock, where a grant without the memory
/// also writes the mark), and their tokens strictly rise.
#[test]
fn a_busy_name_is_granted_from_the_memory_of_its_mark() {
    let (_server, mut raw, mut conn) = Raw::start("memory");
    raw.cycles(&mut conn, 5, |_| false);
    let (tokens, sets) = raw.counting_sets(&mut conn, 200, |_| false);
    strictly_rising(&tokens, "function calls");
    assert!(sets < 200 + 200 / 4, "{sets} SET for 200 grants");
    // Without the memory (EVALSHA): two SET a grant, once the clock passed the reservation.
    raw.wait_past_mark(&mut conn);
    let (tokens, sets) = raw.counting_sets(&mut conn, 50, |_| true);
    strictly_rising(&tokens, "script calls");
    assert_eq!(sets, 100);
}

/// A busy name's grants from the function library's memory, mixed with grants of the same
/// script sent as `EVALSHA` (no memory: a client whose ACL refuses `FCALL`), all
/// microseconds apart: tokens strictly rise, before and after a step back of the server clock
/// shorter than the memory's reservation (300 µs) and one of 10 s.
#[test]
fn tokens_from_the_memory_and_from_scripts_rise_together_across_steps_back() {
    let (server, mut raw, mut conn) = Raw::start("memory-steps");
    // Script calls among the first 30 cycles; the rest by the library alone, so that its
    // memory serves the grants on both sides of each step.
    let mixed = |i: u64| i < 30 && i % 6 == 2;
    let mut tokens = raw.cycles(&mut conn, 100, mixed);
    clock_shift::step_back(server.port(), Duration::from_micros(300));
    tokens.extend(raw.cycles(&mut conn, 100, mixed));
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    tokens.extend(raw.cycles(&mut conn, 100, mixed));
    strictly_rising(&tokens, "function and script calls");
}

/// Rounds of: a grant with a hand-off block, then the slot's mark lost while the server runs
/// (`how`: `DEL` of the mark, or `FLUSHALL`), then another grant microseconds later, all in one
/// pipeline, each round on a new name (on a busy slot in even rounds, a quiet one in odd
/// rounds), through the function library or, when `script`, by `EVALSHA` (no memory). Per
/// round: the first grant's token, the last token of its block, and the next grant's token.
fn grants_around_a_lost_mark(how: &str, script: bool) -> Vec<(u64, u64, u64)> {
    const BLOCK: u64 = 1024;
    let server = server();
    let mut conn = server.conn();
    let (command, at) = if script { ("EVALSHA", 1) } else { ("FCALL", 0) };
    (0..20)
        .map(|round| {
            let mut raw = Raw::new(&server, &common::unique_name("lost-mark"));
            if round % 2 == 0 {
                raw.cycles(&mut conn, 5, |_| script);
            }
            let mut pipe = redis::pipe();
            for (i, block) in [(0, BLOCK), (1, 0)] {
                let request = format!("lost{round}x{i}");
                pipe.cmd(command)
                    .arg(&raw.acquire[at])
                    .arg(2)
                    .arg(&raw.lock)
                    .arg(&raw.fence)
                    .arg(format!("{request}|raw-owner|{block}"))
                    .arg(30_000);
                pipe.cmd(command)
                    .arg(&raw.release[at])
                    .arg(2)
                    .arg(&raw.lock)
                    .arg(&raw.marker)
                    .arg(format!("{request}|"));
                if i == 0 {
                    match how {
                        "FLUSHALL" => pipe.cmd("FLUSHALL"),
                        _ => pipe.cmd("DEL").arg(&raw.fence),
                    };
                }
            }
            let replies: Vec<redis::Value> = pipe.query(&mut conn).unwrap();
            // A grant's token and the last token of its block: a fresh grant's reply is its
            // token (the whole block granted), else `{1, token, count, gen, upto}`.
            let grant = |v: &redis::Value, block: u64| match v {
                redis::Value::Int(t) => (
                    u64::try_from(*t).unwrap(),
                    u64::try_from(*t).unwrap() + block,
                ),
                redis::Value::Array(a) => match (a.get(1), a.get(4)) {
                    (Some(redis::Value::Int(t)), Some(redis::Value::Int(upto))) => {
                        (u64::try_from(*t).unwrap(), u64::try_from(*upto).unwrap())
                    }
                    _ => panic!("a grant's reply: {a:?}"),
                },
                other => panic!("a grant's reply: {other:?}"),
            };
            let ((first, upto), (next, _)) = (grant(&replies[0], BLOCK), grant(&replies[3], 0));
            (first, upto, next)
        })
        .collect()
}

/// Through the function library, a lost mark keeps the next token above the whole block of
/// the grant before, though neither the mark nor the lock key is left to say so (the library
/// remembers its last token on the slot).
fn a_lost_mark_keeps_tokens_above_the_block(how: &str) {
    for (round, (first, upto, next)) in grants_around_a_lost_mark(how, false)
        .into_iter()
        .enumerate()
    {
        assert!(
            next > upto,
            "round {round}, after {how} of the mark: token {next}, within the block \
             {first}..={upto} of the grant before"
        );
    }
}

/// `DEL` of a busy slot's mark between two grants: the later token is above the earlier
/// grant's hand-off block.
#[test]
fn a_deleted_mark_keeps_tokens_above_the_block() {
    a_lost_mark_keeps_tokens_above_the_block("DEL");
}

/// `FLUSHALL` between two grants (the mark and the lock gone, the server running): the later
/// token is above the earlier grant's hand-off block.
#[test]
fn a_flushed_mark_keeps_tokens_above_the_block() {
    a_lost_mark_keeps_tokens_above_the_block("FLUSHALL");
}

/// The limit the docs state (`docs/key-layout.md`, "When the mark is lost"): without the
/// function library's memory (`EVALSHA`), a grant a moment after the mark was deleted takes the
/// clock's token again, which can lie inside the block of the grant before. Some of 20 rounds,
/// each with grants microseconds apart in one pipeline, show it.
#[test]
fn without_the_memory_a_deleted_mark_can_give_a_token_inside_the_block() {
    let rounds = grants_around_a_lost_mark("DEL", true);
    let inside = rounds.iter().filter(|(_, upto, next)| next <= upto).count();
    println!(
        "{inside} of {} rounds gave a token inside the block before",
        rounds.len()
    );
    assert!(inside > 0, "no round showed the limit: {rounds:?}");
}

/// RedLock over three masters, one with its clock 0.7 ms ahead of the others (NTP allows it),
/// two clients taking turns on one name, one of which cannot reach that master (its URL is a
/// refused port): every token is above the previous holder's, whichever majority granted it.
#[test]
fn redlock_tokens_rise_with_a_master_clock_ahead() {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    clock_shift::step_forward(masters[0].port(), Duration::from_micros(700));
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let refused = common::ClosedPort::new();
    let partitioned = vec![refused.url(), urls[1].clone(), urls[2].clone()];
    with_deadline(Duration::from_secs(120), move || {
        let build = |urls: &[String]| {
            Client::redlock(urls)
                .lease(Duration::from_secs(10))
                .retry_timeout(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let (a, b) = (build(&urls), build(&partitioned));
        let name = common::unique_name("redlock-skew");
        let locks = [a.mutex(&name).unwrap(), b.mutex(&name).unwrap()];
        let mut last = (0u64, 0usize);
        for turn in 0..400 {
            let g = locks[turn % 2]
                .try_lock_for(Duration::from_secs(10))
                .unwrap()
                .expect("free lock");
            let token = g.fencing_token();
            assert!(
                token > last.0,
                "turn {turn} ({}): token {token} after {} (turn {})",
                if turn % 2 == 0 {
                    "all masters"
                } else {
                    "partitioned"
                },
                last.0,
                last.1
            );
            last = (token, turn);
            g.unlock().unwrap();
        }
        drop(masters);
    });
}

/// A step forward of 20 s under a held 3 s lease: Redis expires the key by its wall clock at
/// once and another client takes the lock. The old holder learns of it by its next renewal
/// (within a renewal interval, 1 s here), its `unlock()` is never `Ok`, and the client says
/// that the server's clock jumped, once, in its stats.
#[test]
fn a_forward_step_ends_a_lease_and_the_holder_is_told() {
    let server = server();
    let lease = Duration::from_secs(3);
    let holder = Client::builder(server.url().as_str())
        .lease(lease)
        .build()
        .unwrap();
    let other = Client::open(server.url().as_str()).unwrap();
    let name = common::unique_name("clock-forward");
    let lock = holder.mutex(&name).unwrap();
    let guard = lock.lock().unwrap();
    let token = guard.fencing_token();
    // One renewal first, so that the client has read the server's clock once.
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= 1));
    clock_shift::step_forward(server.port(), Duration::from_secs(20));
    let stepped = Instant::now();
    let taken = other
        .mutex(&name)
        .unwrap()
        .try_lock_for(Duration::from_secs(2))
        .unwrap()
        .expect("the key expired with the forward step");
    assert!(taken.fencing_token() > token);
    let seen = with_deadline(Duration::from_secs(10), {
        let holder = holder.clone();
        move || {
            assert!(common::wait_until(Duration::from_secs(5), || holder
                .stats()
                .leases_lost
                >= 1));
            stepped.elapsed()
        }
    });
    assert!(!guard.is_held());
    assert!(guard.check().is_err());
    assert!(
        guard.unlock().is_err(),
        "unlock was Ok after the lease was lost"
    );
    assert!(
        seen < Duration::from_millis(2500),
        "the holder learned of the loss {seen:?} after the step (renewal interval 1 s)"
    );
    // Said in the round that found the loss.
    assert_eq!(holder.stats().clock_jumps, 1, "one jump, counted once");
    println!("loss seen {seen:?} after a 20 s forward step; lease 3 s");
}

/// A step back of 10 s under held leases: nothing is lost (the keys now expire later by the
/// server's clock), the client says once that the clock jumped, and the holder's next token
/// after a release is still above the old one.
#[test]
fn a_step_back_is_said_once_and_leases_are_kept() {
    let server = server();
    let lease = Duration::from_millis(1500);
    let holder = Client::builder(server.url().as_str())
        .lease(lease)
        .build()
        .unwrap();
    let names: Vec<String> = (0..3)
        .map(|i| common::unique_name(&format!("clock-back-held-{i}")))
        .collect();
    let locks: Vec<_> = names.iter().map(|n| holder.mutex(n).unwrap()).collect();
    let guards: Vec<_> = locks.iter().map(|l| l.lock().unwrap()).collect();
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= 3));
    clock_shift::step_back(server.port(), Duration::from_secs(10));
    let renewed = holder.stats().renewals;
    // Two more rounds after the step (one renewal interval is 500 ms here).
    assert!(common::wait_until(Duration::from_secs(5), || holder
        .stats()
        .renewals
        >= renewed + 6));
    let stats = holder.stats();
    assert_eq!(stats.clock_jumps, 1, "one jump for three leases: {stats:?}");
    assert_eq!(stats.leases_lost, 0);
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    for g in guards {
        g.check().unwrap();
        g.unlock().unwrap();
    }
    for (lock, old) in locks.iter().zip(tokens) {
        let g = lock.try_lock().unwrap().expect("free");
        assert!(g.fencing_token() > old);
    }
}

/// Through Sentinel: the master's clock stepped back 10 s, tokens of every lock type keep rising
/// (the slot marks are on the master, and replicate).
#[test]
fn tokens_rise_across_a_step_back_through_sentinel() {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    let set = SentinelSet::start();
    let client = |()| {
        Client::sentinel(set.sentinel_urls(), set.master_name())
            .build()
            .unwrap()
    };
    let (a, b) = (client(()), client(()));
    let name = common::unique_name("clock-sentinel");
    let before = tokens(&a, &b, &name);
    clock_shift::step_back(set.master_port(), Duration::from_secs(10));
    let after = tokens(&a, &b, &name);
    for ((what, old), (_, new)) in before.iter().zip(&after) {
        assert!(
            new > old,
            "{what}: {new} after {old}, with the master's clock stepped back"
        );
    }
    assert!(after[0].1 > before[4].1);
}

/// On a cluster: the clock of every master stepped back 10 s, tokens of names on every master
/// keep rising.
#[test]
fn tokens_rise_across_a_step_back_on_a_cluster() {
    clock_shift::enable().expect("the clock library builds (needs cc)");
    let cluster = RedisCluster::start();
    let client = || Client::cluster(cluster.seed_urls()).build().unwrap();
    let (a, b) = (client(), client());
    // Names on different masters.
    let names: Vec<String> = (0..6)
        .map(|i| common::unique_name(&format!("clock-cluster-{i}")))
        .collect();
    let before: Vec<_> = names.iter().map(|n| tokens(&a, &b, n)).collect();
    for port in cluster.masters() {
        clock_shift::step_back(port, Duration::from_secs(10));
    }
    for (name, before) in names.iter().zip(before) {
        let after = tokens(&a, &b, name);
        assert!(
            after[0].1 > before[4].1,
            "{name}: {after:?} after {before:?}, with the masters' clocks stepped back"
        );
    }
}
