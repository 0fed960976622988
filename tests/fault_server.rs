//! Faults of the Redis server: killed and restarted empty on the same port, stalled
//! (`SIGSTOP`, `DEBUG SLEEP`) briefly and for longer than a lease, and `CLIENT PAUSE WRITE`.
//! Scenarios 6 to 8 of `docs/faults.md`.
//!
//! Every blocking step runs under a test-side deadline; leases are short (1-2 s) and the
//! slack for a busy 2-core machine is `faults::SLACK`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "support/faults.rs"]
mod faults;

use std::sync::atomic::{AtomicUsize, Ordering};
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
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let name = common::unique_name("s07");
    let lost = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&lost);
    let holder = Client::builder(url.as_str())
        .lease(lease)
        .command_timeout(cmd_timeout)
        .on_lease_lost(move |_| {
            l2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
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
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let held = common::unique_name("s08-held");
    let free = common::unique_name("s08-free");
    let lost = Arc::new(AtomicUsize::new(0));
    let l2 = Arc::clone(&lost);
    let a = Client::builder(url.as_str())
        .lease(lease)
        .on_lease_lost(move |_| {
            l2.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
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
