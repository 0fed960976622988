//! Faults of the Redis server: killed and restarted empty on the same port, stalled
//! (`SIGSTOP`, `DEBUG SLEEP`) briefly and for longer than a lease, and `CLIENT PAUSE WRITE`.
//! Scenarios 6 to 8 of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::faults;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, client_list, pubsub_clients, stop_for, wait_numsub, with_deadline};
use faults::{Holder, SLACK, spawn_waiter};
use locksmith::Client;

/// 6. Redis is killed and restarted empty on the same port while holders hold and 10 waiters
///    wait: holders report the loss within a renewal interval + slack and `unlock()` errs; the
///    subscribers reconnect and resubscribe; every waiter acquires within 2 s of the restart;
///    tokens after exceed tokens before; no call blocks past its timeout.
#[test]
fn s06_redis_restarts_empty() {
    let lease = Duration::from_millis(1500);
    let renew = lease / 3;
    let mut server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let names = [common::unique_name("s06a"), common::unique_name("s06b")];
    let lost = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
    let l2 = Arc::clone(&lost);
    let holder = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(Duration::from_secs(1))
        .on_lease_lost(move |l| l2.lock().unwrap().push((l.name.clone(), Instant::now())))
        .build()
        .unwrap();
    let holders: Vec<Holder> = names
        .iter()
        .map(|n| Holder::start(holder.mutex(n).unwrap()))
        .collect();
    let before = holders.iter().map(|h| h.token).max().unwrap();
    let clients: Vec<Client> = (0..2)
        .map(|_| {
            Client::builder(url.as_str())
                .lease(lease)
                .command_timeout(Duration::from_secs(1))
                .build()
                .unwrap()
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..10)
        .map(|i| {
            let m = clients[i % 2].mutex(&names[(i / 2) % 2]).unwrap();
            spawn_waiter(
                m,
                Duration::from_secs(20),
                Duration::from_millis(20),
                tx.clone(),
            )
        })
        .collect();
    for n in &names {
        wait_numsub(&mut conn, &common::release_channel(n), 2);
    }
    thread::sleep(Duration::from_millis(200));

    let other = Client::builder(url.as_str())
        .command_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1))
        .retry_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let probe = other.mutex(&common::unique_name("s06-probe")).unwrap();
    server.stop();
    let down_at = Instant::now();
    let p = probe.clone();
    let (probe_res, probe_took) = with_deadline(Duration::from_secs(10), move || {
        let s = Instant::now();
        let r = p.try_lock().map(|g| g.is_some());
        (r.map_err(|e| e.to_string()), s.elapsed())
    });
    thread::sleep(Duration::from_millis(300).saturating_sub(down_at.elapsed()));
    server.restart();
    let up_at = Instant::now();
    let mut conn = server.conn();

    let mut outcomes = Vec::new();
    for _ in 0..10 {
        outcomes.push(
            rx.recv_timeout(Duration::from_secs(10))
                .expect("a waiter hung"),
        );
    }
    for w in waiters {
        w.join().unwrap();
    }
    let pubsub_ok = common::wait_until(Duration::from_secs(3), || pubsub_clients(&mut conn) >= 4);
    let subscribes = common::calls(&common::commandstats(&mut conn), "cmdstat_subscribe");
    let lost_list = lost.lock().unwrap().clone();
    let local_lost: Vec<_> = holders.iter().map(Holder::lost_at).collect();
    let unlocks: Vec<_> = holders.into_iter().map(Holder::unlock).collect();
    let last_acquire = outcomes.iter().map(|o| o.at).max().unwrap();
    let after_min = outcomes.iter().filter_map(|o| o.token).min().unwrap();
    println!(
        "s06: probe during the outage: {probe_res:?} after {probe_took:?}; losses reported \
         {:?} after the restart (renewal {renew:?}); waiters all acquired within {:?} of the \
         restart; tokens before <= {before}, after >= {after_min}; unlocks {:?}; SUBSCRIBEs on \
         the new server: {subscribes}",
        lost_list
            .iter()
            .map(|(_, t)| t.saturating_duration_since(up_at))
            .collect::<Vec<_>>(),
        last_acquire.saturating_duration_since(up_at),
        unlocks
            .iter()
            .map(|(r, d)| (r.as_ref().map_err(ToString::to_string).err(), *d))
            .collect::<Vec<_>>(),
    );
    assert!(
        probe_res.is_err(),
        "a lock call succeeded while Redis was down"
    );
    assert!(
        probe_took < Duration::from_secs(3),
        "probe took {probe_took:?}"
    );
    assert!(
        outcomes.iter().all(|o| o.token.is_some()),
        "a waiter timed out: {outcomes:?}"
    );
    assert!(
        last_acquire.saturating_duration_since(up_at) <= Duration::from_secs(2),
        "waiters took until {:?} after the restart",
        last_acquire.saturating_duration_since(up_at)
    );
    assert!(
        after_min > before,
        "tokens went backwards: {after_min} <= {before}"
    );
    for n in &names {
        let t = lost_list
            .iter()
            .find(|(l, _)| l == n)
            .unwrap_or_else(|| panic!("{n}: loss never reported"))
            .1;
        assert!(
            t.saturating_duration_since(up_at) <= renew + SLACK,
            "{n}: loss reported {:?} after the restart",
            t.saturating_duration_since(up_at)
        );
    }
    assert!(local_lost.iter().all(Option::is_some));
    for (r, took) in &unlocks {
        let e = r.as_ref().expect_err("unlock after the restart succeeded");
        assert!(e.is_lease_lost(), "{e}");
        assert!(*took < Duration::from_secs(1) + SLACK);
    }
    assert!(
        pubsub_ok,
        "pub/sub connections not all back: {:?}",
        client_list(&mut conn)
    );
    assert!(
        subscribes >= 1,
        "no channel was resubscribed after the restart"
    );
    for w in &outcomes {
        assert!(w.took < Duration::from_secs(20));
    }
    drop((holder, clients, other));
}

/// 7. Redis stalls (SIGSTOP, `DEBUG SLEEP`) for 0.3 s: no false loss, calls return within the
///    command timeout. Then it stalls for two leases: the holder's local loss comes before any
///    other owner's grant.
#[test]
fn s07_redis_stalls() {
    let lease = Duration::from_secs(1);
    let cmd_timeout = Duration::from_secs(1);
    let (server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("s07");
    let (holder, lost) = common::count_losses(
        Client::builder(url.as_str())
            .lease(lease)
            .command_timeout(cmd_timeout),
    );
    let other = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(cmd_timeout)
        .connect_timeout(cmd_timeout)
        .build()
        .unwrap();
    let h = Holder::start(holder.mutex(&name).unwrap());
    thread::sleep(Duration::from_millis(400));

    for stall in ["SIGSTOP", "DEBUG SLEEP"] {
        let m = other.mutex(&name).unwrap();
        let stalled_at = Instant::now();
        // The stall ends by itself after 0.3 s, whatever the calls below do.
        let stall_thread = match stall {
            "SIGSTOP" => stop_for(server.pid(), Duration::from_millis(300)),
            _ => {
                let mut c = server.conn();
                thread::spawn(move || {
                    redis::cmd("DEBUG")
                        .arg("SLEEP")
                        .arg("0.3")
                        .exec(&mut c)
                        .unwrap();
                })
            }
        };
        thread::sleep(Duration::from_millis(20));
        let (got, took) = with_deadline(Duration::from_secs(10), move || {
            let s = Instant::now();
            let r = m.try_lock().map(|g| g.is_some());
            (r.map_err(|e| e.to_string()), s.elapsed())
        });
        stall_thread.join().unwrap();
        let _ = stalled_at;
        println!("s07: {stall} 0.3 s: try_lock from another client gave {got:?} after {took:?}");
        assert_eq!(got, Ok(false), "{stall}: another client got a held lock");
        assert!(
            took <= cmd_timeout + SLACK,
            "{stall}: try_lock took {took:?}"
        );
        thread::sleep(lease);
        assert!(h.lost_at().is_none(), "{stall}: false loss");
        assert_eq!(
            lost.load(Ordering::SeqCst),
            0,
            "{stall}: false loss reported"
        );
    }

    // Long stall: two leases.
    let m = other.mutex(&name).unwrap();
    server.pause();
    let paused_at = Instant::now();
    let competitor = thread::spawn(move || {
        let g = m.try_lock_for(Duration::from_secs(15)).unwrap();
        let at = Instant::now();
        (at, g.map(|g| g.fencing_token()))
    });
    thread::sleep(lease * 2);
    server.resume();
    let (granted_at, token) =
        with_deadline(Duration::from_secs(20), move || competitor.join().unwrap());
    let local_loss = h.lost_at().expect("the holder never saw its loss");
    let holder_token = h.token;
    let (unlock, _) = h.unlock();
    println!(
        "s07: stall of 2 leases: holder saw its loss {:?} into the stall, the competitor was \
         granted {:?} into it ({:?} later); holder unlock: {:?}",
        local_loss - paused_at,
        granted_at - paused_at,
        granted_at.saturating_duration_since(local_loss),
        unlock.as_ref().err().map(ToString::to_string)
    );
    assert!(token.expect("competitor timed out") > holder_token);
    assert!(
        local_loss < granted_at,
        "another owner was granted the lock before the holder knew"
    );
    assert!(local_loss - paused_at <= lease + SLACK);
    assert!(unlock.unwrap_err().is_lease_lost());
    assert!(
        lost.load(Ordering::SeqCst) >= 1,
        "on_lease_lost was not called"
    );
    let _ = &mut conn;
}

/// 8. `CLIENT PAUSE 1000 WRITE` with holders, waiters and a competitor: nobody acquires during
///    the pause and no holder is falsely lost.
#[test]
fn s08_client_pause_write() {
    let lease = Duration::from_secs(2);
    let (_server, url, mut conn) = common::server_url_conn();
    let held = common::unique_name("s08-held");
    let free = common::unique_name("s08-free");
    let (a, lost) = common::count_losses(Client::builder(url.as_str()).lease(lease));
    let b = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let c = Client::builder(url.as_str()).lease(lease).build().unwrap();
    let h = Holder::start(a.mutex(&held).unwrap());
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            spawn_waiter(
                b.mutex(&held).unwrap(),
                Duration::from_secs(10),
                Duration::from_millis(10),
                tx.clone(),
            )
        })
        .collect();
    wait_numsub(&mut conn, &common::release_channel(&held), 1);
    thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("WRITE")
        .exec(&mut conn)
        .unwrap();
    let pause_end = sent + Duration::from_millis(1000);
    thread::sleep(Duration::from_millis(100));
    let cm = c.mutex(&free).unwrap();
    let competitor = thread::spawn(move || {
        let g = cm.try_lock_for(Duration::from_secs(5)).unwrap();
        (Instant::now(), g.is_some())
    });
    thread::sleep(Duration::from_millis(1400));
    assert!(
        h.lost_at().is_none(),
        "holder falsely lost during the pause"
    );
    let released_at = Instant::now();
    let (r, _) = h.unlock();
    r.unwrap();
    let (c_at, c_got) = with_deadline(Duration::from_secs(10), move || competitor.join().unwrap());
    let mut outs = Vec::new();
    for _ in 0..3 {
        outs.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    for w in waiters {
        w.join().unwrap();
    }
    println!(
        "s08: competitor acquired {:?} after CLIENT PAUSE was sent (pause 1 s); waiters \
         acquired {:?} after the holder's release at {:?}; losses {}",
        c_at - sent,
        outs.iter()
            .map(|o| o.at.saturating_duration_since(released_at))
            .collect::<Vec<_>>(),
        released_at - sent,
        lost.load(Ordering::SeqCst)
    );
    assert!(c_got);
    assert!(
        c_at >= pause_end,
        "the competitor acquired during the pause"
    );
    for o in &outs {
        assert!(o.token.is_some());
        assert!(
            o.at >= released_at,
            "a waiter acquired while the lock was held"
        );
    }
    assert_eq!(lost.load(Ordering::SeqCst), 0, "a holder was reported lost");
}

/// 20. A busy lock with the largest local hand-off block (1024): an acquisition through Redis
///     takes the server clock's token and reserves up to 1024 tokens after it, so tokens run
///     ahead of the clock (by up to the block, and grants within it take the mark + 1). Redis
///     is killed (SIGKILL) and restarted empty at once on the same port: the first token after
///     the restart, for this client and for another, exceeds every token issued (or reserved)
///     before it, the restart taking longer than that lead.
#[test]
fn s20_tokens_rise_across_an_empty_restart_with_the_largest_block() {
    let mut server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("s20");
    let (before, lead) = {
        let mut conn = server.conn();
        let u = url.clone();
        let n = name.clone();
        let busy = with_deadline(Duration::from_secs(30), move || {
            let c = Client::builder(u.as_str())
                .local_handoff_max_count(1024)
                .build()
                .unwrap();
            let m = c.mutex(&n).unwrap();
            let (mut max, start) = (0, Instant::now());
            while start.elapsed() < Duration::from_millis(1500) {
                let g = m.lock().unwrap();
                max = max.max(g.fencing_token());
                g.unlock().unwrap();
            }
            (max, c)
        });
        let (issued, client) = busy;
        // Every token the last acquisition reserved could still be handed out: its value is
        // in the release marker.
        let marker: String = redis::cmd("GET")
            .arg(common::release_channel(&name))
            .query(&mut conn)
            .unwrap();
        let last = common::LockValue::parse(&marker).unwrap();
        let reserved = last.upto;
        // How far the last acquisition's block led the server clock at its grant.
        let lead = reserved.saturating_sub(last.s * 1_000_000 + last.us);
        drop(client);
        (issued.max(reserved), lead)
    };
    let a = Client::open(url.as_str()).unwrap();
    let ma = a.mutex(&name).unwrap();
    drop(ma.lock().unwrap());
    server.restart();
    let (u, n) = (url.clone(), name.clone());
    let (first_a, first_b) = with_deadline(Duration::from_secs(20), move || {
        let ga = ma.lock().unwrap();
        let ta = ga.fencing_token();
        ga.unlock().unwrap();
        let b = Client::open(u.as_str()).unwrap();
        let tb = b.mutex(&n).unwrap().lock().unwrap().fencing_token();
        (ta, tb)
    });
    println!(
        "s20: last reserved token {lead} us ahead of the server clock at its grant; last token \
         reserved {before}; first tokens after the restart {first_a} (same client), {first_b} \
         (another); {} us above",
        first_a as i64 - before as i64
    );
    assert!(
        lead > 0,
        "the busy lock never ran ahead of the clock ({lead} us): the test proves nothing"
    );
    assert!(
        first_a > before,
        "token went backwards: {first_a} <= {before}"
    );
    assert!(first_b > first_a, "{first_b} <= {first_a}");
}

/// One lock of each type held by the calling thread, to be released by `unlock`.
enum Held {
    Mutex(locksmith::MutexGuard),
    Fair(locksmith::FairMutexGuard),
    Write(locksmith::RwLockWriteGuard),
    Read(locksmith::RwLockReadGuard),
    Permit(locksmith::SemaphorePermit),
    Set(locksmith::MultiGuard),
}

impl Held {
    fn unlock(self) -> locksmith::Result<()> {
        match self {
            Held::Mutex(g) => g.unlock(),
            Held::Fair(g) => g.unlock(),
            Held::Write(g) => g.unlock(),
            Held::Read(g) => g.unlock(),
            Held::Permit(p) => p.unlock(),
            Held::Set(g) => g.unlock(),
        }
    }
}

/// The locks of one name, one handle per type.
struct Locks {
    mutex: locksmith::Mutex,
    fair: locksmith::FairMutex,
    rw: locksmith::RwLock,
    sem: locksmith::Semaphore,
    /// A set of two names: this one and another.
    set: locksmith::MultiMutex,
}

impl Locks {
    fn new(c: &Client, name: &str) -> Locks {
        Locks {
            mutex: c.mutex(name).unwrap(),
            fair: c.fair_mutex(name).unwrap(),
            rw: c.rw_lock(name).unwrap(),
            sem: c.semaphore(name, 1).unwrap(),
            set: c.multi_lock([name, &format!("{name}-2")]).unwrap(),
        }
    }

    fn take(&self, kind: &str) -> Option<Held> {
        let wait = Duration::from_secs(5);
        Some(match kind {
            "mutex" => Held::Mutex(self.mutex.try_lock_for(wait).unwrap()?),
            "fair" => Held::Fair(self.fair.try_lock_for(wait).unwrap()?),
            "write" => Held::Write(self.rw.try_write_for(wait).unwrap()?),
            "read" => Held::Read(self.rw.try_read_for(wait).unwrap()?),
            "permit" => Held::Permit(self.sem.try_acquire_for(wait).unwrap()?),
            "set" => Held::Set(self.set.try_lock_for(wait).unwrap()?),
            _ => unreachable!(),
        })
    }
}

/// 21. A holder's `unlock()` after Redis was killed and restarted empty: its pooled connection
///     died, so the release fails and is retried on a new connection, which finds the lock
///     gone (nobody took it) or another owner's (client B took it). Either way the holder
///     lost its lock, and `unlock()` says so (`LeaseLost` or `NotOwner`), never `Ok`; B's lock
///     is untouched. For every lock type, and for an inner level of a reentrant one.
#[test]
fn s21_unlock_after_an_empty_restart_reports_the_loss() {
    let mut server = RedisServer::start();
    let url = server.url();
    let mut outcomes = Vec::new();
    let cases = [
        ("mutex", 1),
        ("mutex", 2),
        ("fair", 1),
        ("fair", 2),
        ("write", 1),
        ("read", 1),
        ("permit", 1),
        ("set", 1),
        ("set", 2),
    ];
    for (kind, depth) in cases {
        for taken in [false, true] {
            let name = common::unique_name("s21");
            // A long lease: no renewal notices the restart before the unlock does.
            let a = Client::builder(url.as_str())
                .lease(Duration::from_secs(30))
                .build()
                .unwrap();
            let la = Locks::new(&a, &name);
            let held = la.take(kind).expect("free");
            // An inner level (a re-entry counted by the server), released first.
            let inner = (depth == 2).then(|| la.take(kind).expect("re-entry"));
            server.restart();
            let b = Client::open(url.as_str()).unwrap();
            let lb = Locks::new(&b, &name);
            let theirs = taken.then(|| lb.take(kind).expect("free after the restart"));
            let inner_res = inner.map(Held::unlock);
            let res = held.unlock();
            let what = format!("{kind} depth {depth} (taken by another: {taken})");
            println!("s21: {what}: inner unlock {inner_res:?}, unlock {res:?}");
            if let Some(r) = &inner_res {
                let e = r
                    .as_ref()
                    .expect_err(&format!("{what}: inner unlock was Ok"));
                assert!(e.is_lease_lost(), "{what}: {e}");
            }
            assert!(
                res.as_ref()
                    .err()
                    .is_some_and(locksmith::Error::is_lease_lost),
                "{what}: unlock after the restart: {res:?}"
            );
            if let Some(t) = theirs {
                t.unlock()
                    .unwrap_or_else(|e| panic!("{what}: the new owner's lock was touched: {e}"));
            }
            outcomes.push(what);
        }
    }
    println!("s21: {} cases", outcomes.len());
}

/// A client whose pooled connections died in an empty restart: each call that asks Redis
/// retries on a new connection, as `lock` does, instead of failing with the dead connection's
/// error (`unexpected end of file`).
#[test]
fn every_call_retries_a_pooled_connection_that_died_in_a_restart() {
    let mut server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("pool-restart");
    let c = Client::open(url.as_str()).unwrap();
    let l = Locks::new(&c, &name);
    type Call<'a> = (&'a str, Box<dyn Fn() -> locksmith::Result<String> + 'a>);
    let calls: Vec<Call<'_>> = vec![
        (
            "Mutex::is_locked",
            Box::new(|| l.mutex.is_locked().map(|b| b.to_string())),
        ),
        (
            "FairMutex::is_locked",
            Box::new(|| l.fair.is_locked().map(|b| b.to_string())),
        ),
        (
            "Semaphore::available",
            Box::new(|| l.sem.available().map(|n| n.to_string())),
        ),
        (
            "Mutex::try_lock",
            Box::new(|| l.mutex.try_lock().map(|g| g.is_some().to_string())),
        ),
        (
            "FairMutex::try_lock",
            Box::new(|| l.fair.try_lock().map(|g| g.is_some().to_string())),
        ),
        (
            "RwLock::try_read",
            Box::new(|| l.rw.try_read().map(|g| g.is_some().to_string())),
        ),
        (
            "RwLock::try_write",
            Box::new(|| l.rw.try_write().map(|g| g.is_some().to_string())),
        ),
        (
            "Semaphore::try_acquire",
            Box::new(|| l.sem.try_acquire().map(|g| g.is_some().to_string())),
        ),
    ];
    let mut failed = Vec::new();
    for (what, call) in &calls {
        // Fill the pool, then kill the server under it.
        call().unwrap();
        server.restart();
        let r = call();
        println!("after an empty restart: {what}: {r:?}");
        if let Err(e) = r {
            failed.push(format!("{what}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "calls failed on a dead pooled connection: {failed:?}"
    );
}
