//! Several locks at once: transfers between random pairs of accounts with one `MultiMutex`
//! per transfer against two plain `Mutex`es taken by hand in a fixed order (by name), in one
//! run with the same threads, in alternating slices; and the uncontended two-name cycle against
//! two EVALSHA round trips measured interleaved with it.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::Client;

use crate::context::Ctx;
use crate::report::{Bar, Row, Unit};
use crate::support::{Rng, connect, micros, pct, s, sorted};

/// Accounts the transfers pick their pairs from.
const ACCOUNTS: u64 = 5;
/// One slice of one way of locking; the slices alternate.
const SLICE: Duration = Duration::from_millis(250);

/// How a transfer takes its two accounts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Multi,
    Ordered,
}

fn account(i: u64) -> String {
    format!("bench:multi:account:{i}")
}

/// One transfer's locking: both accounts, then both released.
fn transfer(client: &Client, way: Way, a: u64, b: u64) -> Result<(), String> {
    match way {
        Way::Multi => {
            let g = client
                .multi_lock([account(a), account(b)])
                .map_err(s)?
                .lock()
                .map_err(s)?;
            g.unlock().map_err(s)
        }
        Way::Ordered => {
            // The hand-written way: a fixed order (by name) so that no two callers deadlock.
            let (x, y) = if account(a) <= account(b) {
                (a, b)
            } else {
                (b, a)
            };
            let g1 = client.mutex(&account(x)).map_err(s)?.lock().map_err(s)?;
            let g2 = client.mutex(&account(y)).map_err(s)?.lock().map_err(s)?;
            g2.unlock().map_err(s)?;
            g1.unlock().map_err(s)
        }
    }
}

pub(crate) fn multi(ctx: &mut Ctx) -> Result<(), String> {
    uncontended(ctx)?;
    // Eight threads either way: in two clients (local hand-off helps the plain Mutexes of
    // one client), and in eight clients of one thread each, as eight processes would be.
    transfers(ctx, 2, 4)?;
    transfers(ctx, 8, 1)
}

/// Transfers/s of both ways with `clients` clients of `per_client` threads each, in
/// alternating slices of one run.
fn transfers(ctx: &mut Ctx, clients: usize, per_client: usize) -> Result<(), String> {
    const W: &str = "multi";
    let handles: Vec<Client> = (0..clients)
        .map(|_| Client::open(&ctx.url).map_err(s))
        .collect::<Result<_, _>>()?;
    let total = ctx.plan.contended;
    let slices = ((total.as_secs_f64() / SLICE.as_secs_f64() / 2.0) as usize).max(2);
    let threads = clients * per_client;
    // Every thread runs the same slices: all on one way, then all on the other, in turns.
    let barrier = Barrier::new(threads);
    let seed = ctx.rng.next_u64();
    let counts: Vec<Result<[u64; 2], String>> = thread::scope(|sc| {
        let joins: Vec<_> = (0..threads)
            .map(|t| {
                let client = &handles[t % clients];
                let barrier = &barrier;
                sc.spawn(move || -> Result<[u64; 2], String> {
                    let mut rng = Rng::new(seed ^ ((t as u64) << 40));
                    let mut done = [0u64; 2];
                    for k in 0..2 * slices {
                        let way = if k % 2 == 0 { Way::Multi } else { Way::Ordered };
                        barrier.wait();
                        let end = Instant::now() + SLICE;
                        while Instant::now() < end {
                            let a = rng.range(0, ACCOUNTS);
                            let b = (a + 1 + rng.range(0, ACCOUNTS - 1)) % ACCOUNTS;
                            transfer(client, way, a, b)?;
                            done[k % 2] += 1;
                        }
                    }
                    Ok(done)
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let mut done = [0u64; 2];
    for c in counts {
        let c = c?;
        done[0] += c[0];
        done[1] += c[1];
    }
    let secs = slices as f64 * SLICE.as_secs_f64();
    let (multi, ordered) = (done[0] as f64 / secs, done[1] as f64 / secs);
    let shape = format!("{clients} clients x {per_client} threads");
    ctx.row(
        Row::new(
            W,
            &format!("transfers/s, MultiMutex, {shape}"),
            multi,
            Unit::PerSec,
        )
        .floor(
            "two Mutexes in a fixed order, same run",
            ordered,
            Unit::PerSec,
        )
        .bar(Bar::RatioAtLeast(1.0))
        .note(format!(
            "{shape}, random pairs of {ACCOUNTS} accounts named in random order, an empty \
                 critical section; {slices} slices of {} ms per way, alternating. Within a \
                 client the hand-ordered Mutexes pass by local hand-off (no round trip); a set \
                 never does",
            SLICE.as_millis()
        )),
    );
    ctx.row(Row::new(
        W,
        &format!("transfers/s, two Mutexes in a fixed order, {shape}"),
        ordered,
        Unit::PerSec,
    ));
    Ok(())
}

/// One thread takes and releases a free two-name set, against two EVALSHA round trips (the
/// set's acquire and release scripts), interleaved; and the hand-ordered pair's cycle.
fn uncontended(ctx: &mut Ctx) -> Result<(), String> {
    const W: &str = "multi";
    let client = Client::open(&ctx.url).map_err(s)?;
    let set = client
        .multi_lock(["bench:multi:free:a", "bench:multi:free:b"])
        .map_err(s)?;
    let (ma, mb) = (
        client.mutex("bench:multi:free:a").map_err(s)?,
        client.mutex("bench:multi:free:b").map_err(s)?,
    );
    let mut fcon = connect(&ctx.url, Duration::from_secs(5)).map_err(s)?;
    let sha = redis::Script::new("return 1").load(&mut fcon).map_err(s)?;
    let evalsha = |con: &mut redis::Connection| {
        redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(0)
            .query::<i64>(con)
            .map_err(s)
    };
    let set_cycle = || -> Result<(), String> { set.lock().map_err(s)?.unlock().map_err(s) };
    let pair_cycle = || -> Result<(), String> {
        let g1 = ma.lock().map_err(s)?;
        let g2 = mb.lock().map_err(s)?;
        g2.unlock().map_err(s)?;
        g1.unlock().map_err(s)
    };
    for _ in 0..300 {
        set_cycle()?;
        pair_cycle()?;
        evalsha(&mut fcon)?;
    }
    let (mut sets, mut pairs, mut ev) = (Vec::new(), Vec::new(), Vec::new());
    let slice = Duration::from_millis(100);
    let t_end = Instant::now() + ctx.plan.uncontended;
    while Instant::now() < t_end {
        let t0 = Instant::now();
        while t0.elapsed() < slice {
            let t = Instant::now();
            set_cycle()?;
            sets.push(micros(t.elapsed()));
        }
        let t0 = Instant::now();
        while t0.elapsed() < slice {
            let t = Instant::now();
            pair_cycle()?;
            pairs.push(micros(t.elapsed()));
        }
        for _ in 0..200 {
            let t = Instant::now();
            evalsha(&mut fcon)?;
            ev.push(micros(t.elapsed()));
        }
    }
    let (sets, pairs, ev) = (sorted(sets), sorted(pairs), sorted(ev));
    let floor = 2.0 * pct(&ev, 0.5);
    let fl = "2 × EVALSHA p50, interleaved";
    ctx.row(
        Row::new(W, "two-name set lock+unlock p50", pct(&sets, 0.5), Unit::Us)
            .floor(fl, floor, Unit::Us)
            .note(format!(
                "{} cycles of one free set of two names (one acquire script, one release \
                 script, each doing two names' work), in 100 ms slices alternating with the \
                 hand-ordered pair and {} EVALSHA floor samples",
                sets.len(),
                ev.len()
            )),
    );
    ctx.row(
        Row::new(
            W,
            "two Mutexes in a fixed order lock+unlock p50",
            pct(&pairs, 0.5),
            Unit::Us,
        )
        .floor(fl, floor, Unit::Us)
        .note(format!(
            "{} cycles: two acquire and two release scripts",
            pairs.len()
        )),
    );
    Ok(())
}
