//! Redis Cluster: a local cluster of its own (masters only, no replicas, pinned like the main
//! server); the PING floor of the master that serves the measured lock, the uncontended cycle
//! and a handoff between two clients of this process against that floor, and the aggregate
//! cycle rate over many names as masters are added (1 vs 3). On a 2-core machine the masters
//! share one core, so the 3-master rate shows the routing overhead, not the scaling that
//! masters on their own hosts would give.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;
use locksmith_testkit::{RedisCluster, lock_key, pin, release_channel};

use crate::context::{Ctx, STEP};
use crate::report::{Row, Unit};
use crate::support::{micros, pct, s, sorted};

const W: &str = "cluster";
/// Threads cycling locks in the aggregate rate.
const THREADS: usize = 8;

fn start(ctx: &Ctx, masters: usize) -> RedisCluster {
    let c = RedisCluster::start_with(masters, 0);
    if ctx.pinned {
        for pid in c.pids() {
            pin(pid, 1);
        }
    }
    c
}

/// Lock+unlock cycles per second by `THREADS` threads of one client, each on names of its
/// own (`names` per thread), for `window`.
fn rate(client: &Client, names: usize, window: Duration) -> Result<f64, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for t in 0..THREADS {
        let (c, stop, done) = (client.clone(), Arc::clone(&stop), Arc::clone(&done));
        workers.push(thread::spawn(move || -> Result<(), String> {
            let locks: Vec<_> = (0..names)
                .map(|k| c.mutex(&format!("bench:cluster:{t}:{k}")).map_err(s))
                .collect::<Result<_, _>>()?;
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                locks[k % names].lock().map_err(s)?.unlock().map_err(s)?;
                done.fetch_add(1, Ordering::Relaxed);
                k += 1;
            }
            Ok(())
        }));
    }
    // A warm-up, then the window.
    thread::sleep(Duration::from_millis(300));
    let (n0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    thread::sleep(window);
    let (n1, t1) = (done.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().map_err(|_| "worker panicked".to_owned())??;
    }
    Ok((n1 - n0) as f64 / (t1 - t0).as_secs_f64())
}

pub(crate) fn cluster(ctx: &mut Ctx) -> Result<(), String> {
    let three = start(ctx, 3);
    let name = "bench:cluster";
    let port = three.master_of_key(&lock_key(name));
    let mut con = three.conn(port);
    let n = ctx.plan.floor_samples;
    let mut ping = Vec::with_capacity(n);
    for i in 0..n + 200 {
        let t = Instant::now();
        redis::cmd("PING").query::<String>(&mut con).map_err(s)?;
        if i >= 200 {
            ping.push(micros(t.elapsed()));
        }
    }
    let ping = sorted(ping);
    let floor = pct(&ping, 0.5);
    let build = |c: &RedisCluster| Client::cluster(c.seed_urls()).build().map_err(s);

    // Uncontended cycles on one name.
    let a = build(&three)?;
    let m = a.mutex(name).map_err(s)?;
    let mut cyc = Vec::new();
    let until = Instant::now() + ctx.plan.uncontended;
    let mut i = 0;
    while Instant::now() < until {
        let t = Instant::now();
        m.lock().map_err(s)?.unlock().map_err(s)?;
        if i >= 200 {
            cyc.push(micros(t.elapsed()));
        }
        i += 1;
    }
    let cyc = sorted(cyc);

    // Handoffs: a waiter thread of a second client blocked in lock(), the holder here.
    let b = build(&three)?;
    let mb = b.mutex(name).map_err(s)?;
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (got_tx, got_rx) = mpsc::channel::<Instant>();
    let waiter = thread::spawn(move || {
        while go_rx.recv().is_ok() {
            let Ok(Some(g)) = mb.try_lock_for(Duration::from_secs(10)) else {
                return;
            };
            let t = Instant::now();
            drop(g);
            if got_tx.send(t).is_err() {
                return;
            }
        }
    });
    let channel = release_channel(name);
    let mut hand = Vec::new();
    for k in 0..ctx.plan.handoff_ls + 5 {
        let g = m.lock().map_err(s)?;
        go_tx.send(()).map_err(s)?;
        let until = Instant::now() + Duration::from_secs(2);
        while three.shard_numsub(port, &channel) < 1 && Instant::now() < until {
            thread::sleep(Duration::from_micros(200));
        }
        // Time for its attempt to come back busy and for it to park.
        thread::sleep(Duration::from_millis(3));
        let t0 = Instant::now();
        g.unlock().map_err(s)?;
        let t1 = got_rx.recv_timeout(STEP).map_err(s)?;
        if k >= 5 {
            hand.push(micros(t1 - t0));
        }
    }
    drop(go_tx);
    let _ = waiter.join();
    let hand = sorted(hand);

    // Aggregate rate over many names: 3 masters, then 1.
    let names = 64;
    let window = ctx.plan.many;
    let rate3 = rate(&a, names, window)?;
    drop((a, b, three));
    let one = start(ctx, 1);
    let c1 = build(&one)?;
    let rate1 = rate(&c1, names, window)?;
    drop((c1, one));

    let fl = "cluster PING p50";
    ctx.row(
        Row::new(W, "cluster PING round trip p50", floor, Unit::Us)
            .floor("plain PING p50", ctx.floors.ping_p50, Unit::Us)
            .note(format!("{} samples on the lock's master", ping.len())),
    );
    ctx.row(
        Row::new(W, "cluster lock+unlock p50", pct(&cyc, 0.5), Unit::Us)
            .floor("2 × cluster PING p50", 2.0 * floor, Unit::Us)
            .note(format!("{} cycles, one thread, one name", cyc.len())),
    );
    ctx.row(
        Row::new(W, "cluster lock+unlock p99", pct(&cyc, 0.99), Unit::Us).floor(
            "2 × cluster PING p50",
            2.0 * floor,
            Unit::Us,
        ),
    );
    ctx.row(
        Row::new(W, "cluster handoff p50", pct(&hand, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .note(format!(
                "{} handoffs between two clients of this process, the waiter woken by an \
                 SPUBLISH on its shard connection",
                hand.len()
            )),
    );
    ctx.row(
        Row::new(W, "cluster handoff p99", pct(&hand, 0.99), Unit::Us).floor(fl, floor, Unit::Us),
    );
    ctx.row(
        Row::new(W, "cluster cycles/s, 1 master", rate1, Unit::PerSec).note(format!(
            "{THREADS} threads of one client, {names} names each, {:?}",
            window
        )),
    );
    ctx.row(
        Row::new(W, "cluster cycles/s, 3 masters", rate3, Unit::PerSec)
            .floor("1 master", rate1, Unit::PerSec)
            .note(
                "the masters share one core here: this shows the routing cost, not the \
                 scaling of masters on hosts of their own",
            ),
    );
    Ok(())
}
