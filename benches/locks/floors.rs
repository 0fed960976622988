//! The floors every other figure is compared with: PING and EVALSHA `return 1` round trips
//! on one plain connection to the same `redis-server`, PING after 3 ms of idleness, and
//! Redis's own execution time of EVALSHA.

use std::thread;
use std::time::{Duration, Instant};

use crate::context::Floors;
use crate::naive;
use crate::report::{Row, Unit};
use crate::support::{
    calls_by_command, connect, micros, pct, s, sorted, stat, stats_delta, usec_by_command,
};

pub(crate) fn measure_floors(url: &str, n: usize) -> Result<(Floors, Vec<Row>), String> {
    let mut con = connect(url, Duration::from_secs(5)).map_err(s)?;
    naive::load_scripts(&mut con).map_err(s)?;
    let sha = redis::Script::new("return 1").load(&mut con).map_err(s)?;
    let ping = |con: &mut redis::Connection| redis::cmd("PING").query::<String>(con);
    let eval =
        |con: &mut redis::Connection| redis::cmd("EVALSHA").arg(&sha).arg(0).query::<i64>(con);
    for _ in 0..1000 {
        ping(&mut con).map_err(s)?;
        eval(&mut con).map_err(s)?;
    }
    let (c0, u0) = (calls_by_command(&mut con), usec_by_command(&mut con));
    let (mut p, mut e) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        ping(&mut con).map_err(s)?;
        p.push(micros(t.elapsed()));
        let t = Instant::now();
        eval(&mut con).map_err(s)?;
        e.push(micros(t.elapsed()));
    }
    let (c1, u1) = (calls_by_command(&mut con), usec_by_command(&mut con));
    let exec = stat(&stats_delta(&u0, &u1), "evalsha") as f64
        / stat(&stats_delta(&c0, &c1), "evalsha").max(1) as f64;
    // PING after 3 ms of idleness, as most lock operations in real programs start.
    let mut cold = Vec::with_capacity(n / 20);
    for _ in 0..n / 20 {
        thread::sleep(Duration::from_millis(3));
        let t = Instant::now();
        ping(&mut con).map_err(s)?;
        cold.push(micros(t.elapsed()));
    }
    let cold = sorted(cold);
    let (p, e) = (sorted(p), sorted(e));
    let floors = Floors {
        ping_p50: pct(&p, 0.5),
        evalsha_p50: pct(&e, 0.5),
        idle_ping_p50: pct(&cold, 0.5),
        evalsha_exec_us: exec,
    };
    let rows = vec![
        Row::new("floor", "PING round trip p50", floors.ping_p50, Unit::Us)
            .note(format!("{n} samples")),
        Row::new("floor", "PING round trip p99", pct(&p, 0.99), Unit::Us),
        Row::new(
            "floor",
            "EVALSHA `return 1` round trip p50",
            floors.evalsha_p50,
            Unit::Us,
        ),
        Row::new(
            "floor",
            "EVALSHA `return 1` round trip p99",
            pct(&e, 0.99),
            Unit::Us,
        ),
        Row::new(
            "floor",
            "PING after 3 ms idle p50",
            pct(&cold, 0.5),
            Unit::Us,
        )
        .floor("PING p50", floors.ping_p50, Unit::Us)
        .note(format!(
            "{} samples; the CPUs may have gone idle in between, as before a handoff",
            cold.len()
        )),
    ];
    Ok((floors, rows))
}
