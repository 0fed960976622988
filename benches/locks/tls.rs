//! TLS: a `redis-server` of its own with a TLS port and certificates made by `openssl`
//! (pinned like the main server); the TLS PING floor, the uncontended cycle and a handoff
//! between two clients of this process over TLS, each against that TLS floor.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;
use locksmith_testkit::{RedisServer, ServerCert, TlsFiles, numsub, pin};

use crate::context::{Ctx, STEP};
use crate::report::{Row, Unit};
use crate::support::{micros, pct, s, sorted};

pub(crate) fn tls(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "tls";
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, ServerCert::Good, false);
    if ctx.pinned {
        pin(server.pid(), 1);
    }
    let url = server.tls_url();
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(files.ca_pem()),
    };
    let mut con = redis::Client::build_with_tls(url.as_str(), certs)
        .map_err(s)?
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(s)?;
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

    let build = || {
        Client::builder(&url)
            .tls_root_cert(files.ca_pem())
            .build()
            .map_err(s)
    };
    // Uncontended cycles.
    let a = build()?;
    let m = a.mutex("bench:tls").map_err(s)?;
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
    let b = build()?;
    let mb = b.mutex("bench:tls").map_err(s)?;
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
    let mut plain = server.conn();
    let channel = "locksmith:{bench:tls}:released";
    let mut hand = Vec::new();
    for k in 0..ctx.plan.handoff_ls + 5 {
        let g = m.lock().map_err(s)?;
        go_tx.send(()).map_err(s)?;
        let until = Instant::now() + Duration::from_secs(2);
        while numsub(&mut plain, channel) < 1 && Instant::now() < until {
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

    let fl = "TLS PING p50";
    ctx.row(
        Row::new(W, "TLS PING round trip p50", floor, Unit::Us)
            .floor("plain PING p50", ctx.floors.ping_p50, Unit::Us)
            .note(format!("{} samples on one TLS connection", ping.len())),
    );
    ctx.row(
        Row::new(W, "TLS lock+unlock p50", pct(&cyc, 0.5), Unit::Us)
            .floor("2 × TLS PING p50", 2.0 * floor, Unit::Us)
            .note(format!("{} cycles, one thread, one name", cyc.len())),
    );
    ctx.row(
        Row::new(W, "TLS lock+unlock p99", pct(&cyc, 0.99), Unit::Us).floor(
            "2 × TLS PING p50",
            2.0 * floor,
            Unit::Us,
        ),
    );
    ctx.row(
        Row::new(W, "TLS handoff p50", pct(&hand, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .note(format!(
                "{} handoffs between two clients of this process, the waiter woken by a \
                 release message on its TLS pub/sub connection",
                hand.len()
            )),
    );
    ctx.row(Row::new(W, "TLS handoff p99", pct(&hand, 0.99), Unit::Us).floor(fl, floor, Unit::Us));
    Ok(())
}
