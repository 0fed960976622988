//! A run of handoffs from a holder in this process to a waiter in a child process, both
//! sides: the parent's loop ([`ls_handoffs`], with its `MONITOR` split) and the waiter child
//! ([`child_handoff`]). The `handoff` and `redlock` workloads both use it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc::Receiver;
use std::thread;
use std::time::{Duration, Instant};

use locksmith::{Client, Mutex as LockMutex};

use crate::child::{ChildProc, Waiter, arg, say};
use crate::context::STEP;
use crate::support::{Rng, calls_by_command, micros, numsub, realtime_ns, s, script_stat};

/// A RedLock client over `urls`, as the bench uses it in both processes.
pub(crate) fn build_redlock<S: AsRef<str>>(urls: &[S]) -> Result<Client, String> {
    Client::redlock(urls.iter().map(AsRef::as_ref))
        .lease(Duration::from_secs(30))
        .clock_drift_factor(0.01)
        .master_timeout(Duration::from_millis(50))
        .build()
        .map_err(s)
}

/// What a run of locksmith handoffs measured (µs).
pub(crate) struct Handoffs {
    /// From `unlock()` called to the waiter's `lock()` returned.
    pub(crate) total: Vec<f64>,
    /// The holder's `unlock()` round trip.
    pub(crate) release_rtt: Vec<f64>,
    /// With MONITOR: unlock → release dispatched → PUBLISH → acquire dispatched → return.
    pub(crate) split: Vec<[f64; 4]>,
    /// Handoffs whose waiter could not be shown to have waited.
    pub(crate) unverified: usize,
}

/// `n` handoffs (after 5 unrecorded ones) from a holder here to the waiter `child`.
pub(crate) fn ls_handoffs(
    rng: &mut Rng,
    child: &mut ChildProc,
    m: &LockMutex,
    con: &mut redis::Connection,
    channel: &str,
    n: usize,
    mut monitor: Option<&mut Monitor>,
) -> Result<Handoffs, String> {
    let mut out = Handoffs {
        total: Vec::with_capacity(n),
        release_rtt: Vec::with_capacity(n),
        split: Vec::new(),
        unverified: 0,
    };
    let warm = 5;
    for i in 0..warm + n {
        let g = m
            .try_lock_for(Duration::from_secs(10))
            .map_err(s)?
            .ok_or("holder could not lock")?;
        let ev0 = script_stat(&calls_by_command(con));
        child.send("go")?;
        // The waiter is blocked once it subscribed and made its two attempts (the fast path
        // and the one after the subscription was confirmed).
        let until = Instant::now() + Duration::from_secs(2);
        let mut verified = false;
        while Instant::now() < until {
            if numsub(con, channel) >= 1 && script_stat(&calls_by_command(con)) >= ev0 + 2 {
                verified = true;
                break;
            }
            thread::sleep(Duration::from_micros(200));
        }
        // Time for it to read the busy reply and park; then hold a little, at random.
        thread::sleep(rng.duration(Duration::from_millis(2), Duration::from_millis(6)));
        let t0 = realtime_ns();
        let r0 = Instant::now();
        g.unlock().map_err(s)?;
        let rel = micros(r0.elapsed());
        let got = child.expect("got", STEP)?;
        let t1: i64 = got
            .parse()
            .map_err(|e| format!("bad line `got {got}`: {e}"))?;
        let marks = match monitor.as_deref_mut() {
            Some(mon) => mon.handoff_marks(t0, channel)?,
            None => None,
        };
        if i >= warm {
            out.unverified += usize::from(!verified);
            out.total.push((t1 - t0) as f64 / 1e3);
            out.release_rtt.push(rel);
            if let Some([rel_at, pub_at, acq_at]) = marks {
                let us = |a: i64, b: i64| (b - a) as f64 / 1e3;
                out.split.push([
                    us(t0, rel_at),
                    us(rel_at, pub_at),
                    us(pub_at, acq_at),
                    us(acq_at, t1),
                ]);
            }
        }
    }
    Ok(out)
}

/// A `MONITOR` connection, read only between samples (so it wakes nobody during one; the
/// testkit's `Monitor` reads all the time on a thread of its own).
pub(crate) struct Monitor {
    reader: BufReader<TcpStream>,
}

impl Monitor {
    pub(crate) fn open(url: &str) -> Result<Monitor, String> {
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let mut stream = TcpStream::connect(&addr).map_err(s)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(s)?;
        stream.write_all(b"MONITOR\r\n").map_err(s)?;
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).map_err(s)?;
        if !ok.starts_with("+OK") {
            return Err(format!("MONITOR answered {ok:?}"));
        }
        Ok(Monitor { reader })
    }

    /// Redis's timestamps (ns, CLOCK_REALTIME) of one handoff after `t0`: the holder's release
    /// script dispatched, its PUBLISH on `channel`, the waiter's acquire script dispatched.
    fn handoff_marks(&mut self, t0: i64, channel: &str) -> Result<Option<[i64; 3]>, String> {
        let lock_key = channel.replace(":released", ":lock");
        let (mut rel, mut publ) = (None, None);
        let until = Instant::now() + Duration::from_secs(2);
        let mut line = String::new();
        while Instant::now() < until {
            line.clear();
            if self.reader.read_line(&mut line).is_err() {
                return Ok(None);
            }
            // +1763781420.123456 [0 127.0.0.1:5555] "EVALSHA" "..." ...
            let Some((ts, rest)) = line.trim_start_matches('+').split_once(' ') else {
                continue;
            };
            let Some((sec, usec)) = ts.split_once('.') else {
                continue;
            };
            let (Ok(sec), Ok(usec)) = (sec.parse::<i64>(), usec.parse::<i64>()) else {
                continue;
            };
            let at = sec * 1_000_000_000 + usec * 1000;
            if at < t0 {
                continue;
            }
            let lower = rest.to_ascii_lowercase();
            let evalsha = (lower.contains("\"evalsha\"") || lower.contains("\"fcall\""))
                && rest.contains(&lock_key);
            let names_channel = rest.contains(&format!("\"{channel}\""));
            match (rel, publ) {
                (None, _) if evalsha && names_channel => rel = Some(at),
                (Some(_), None) if lower.contains("\"publish\"") && names_channel => {
                    publ = Some(at);
                }
                (Some(r), Some(p)) if evalsha && !names_channel => return Ok(Some([r, p, at])),
                _ => {}
            }
        }
        Ok(None)
    }
}

pub(crate) fn child_handoff(a: &[String], input: &Receiver<String>) -> Result<(), String> {
    let (url, name, kind) = (arg(a, 0)?, arg(a, 1)?, arg(a, 2)?);
    let client = if kind == "ls" {
        Some(Client::open(url).map_err(s)?)
    } else {
        None
    };
    // `redlock`: `url` is the masters' URLs, comma-separated.
    let quorum = if kind == "redlock" {
        Some(build_redlock(&url.split(',').collect::<Vec<_>>())?)
    } else {
        None
    };
    let mut w = match &quorum {
        Some(q) => Waiter::Ls(q.mutex(name).map_err(s)?),
        None => Waiter::new(client.as_ref(), url, name)?,
    };
    say("ready");
    while let Ok(line) = input.recv() {
        match line.as_str() {
            "clock" => say(&format!("clock {}", realtime_ns())),
            "go" => {
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut t1 = 0;
                let got = w.with_lock(
                    deadline,
                    || say("waiting"),
                    || {
                        t1 = realtime_ns();
                        Ok(())
                    },
                );
                match got {
                    Ok(true) => say(&format!("got {t1}")),
                    Ok(false) => say("timeout"),
                    Err(e) => say(&format!("error {e}")),
                }
            }
            _ => {}
        }
    }
    Ok(())
}
