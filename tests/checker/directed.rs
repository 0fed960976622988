//! Hand-written scenarios over the model masters: the scripts load and answer in both forms,
//! and the two known ways for a token to go back, step by step.

use std::time::Duration;

use super::host::Host;
use super::store::{Entry, Reply, Val};
use crate::protocol::keys::LockKeys;
use crate::protocol::mutex::{self, Acquire, Publish, Release};
use crate::protocol::scripts::{self, AcquireReply, Admin, Call, Holder, Level, ReleaseReply};
use crate::protocol::{fair_mutex, rw_lock, semaphore};

const T0: i64 = 1_750_000_000_000_000;

/// A reply as the client's parsers take it; an error reply fails the scenario.
fn value(r: &Reply) -> redis::Value {
    if let Reply::Err(e) = r {
        panic!("error reply: {e}");
    }
    super::sim::value(r)
}

fn run(h: &mut Host, call: &Call, fcall: bool, now: i64) -> Reply {
    let (k, a) = super::sim::split(call);
    h.run(call.which, &k, &a, fcall, now)
}

#[allow(clippy::too_many_arguments)]
/// Acquires `keys` for `owner` with request `req`: the token and last reserved token, or
/// None when busy.
fn acquire(
    h: &mut Host,
    keys: &LockKeys,
    owner: &str,
    req: &str,
    block: u32,
    quorum: bool,
    fcall: bool,
    now: i64,
) -> Option<(u64, u64)> {
    let a = Acquire {
        owner,
        lease: Duration::from_millis(100),
        request: req,
        live: None,
        block,
        waited: false,
        quorum,
    };
    let r = run(h, &mutex::acquire(keys, &a), fcall, now);
    match mutex::parse_acquire(&value(&r), &a) {
        Some(AcquireReply::Held { token, last, .. }) => Some((token, last)),
        Some(AcquireReply::Busy { .. }) => None,
        other => panic!("acquire answered {other:?} ({r:?})"),
    }
}

fn release(
    h: &mut Host,
    keys: &LockKeys,
    acq: &str,
    fence: Option<u64>,
    fcall: bool,
    now: i64,
) -> ReleaseReply {
    let r = Release {
        acquisition: acq,
        level: Level::Outermost,
        request: "rel",
        publish: if fence.is_some() {
            Publish::Always
        } else {
            Publish::IfFlagged
        },
        fence,
    };
    let reply = run(h, &mutex::release(keys, &r, false), fcall, now);
    mutex::parse_release(&value(&reply)).unwrap()
}

#[test]
fn both_forms_grant_release_and_fence() {
    let k = LockKeys::new("d:", "a");
    for fcall in [false, true] {
        let mut h = Host::new().unwrap();
        let (t1, last) = acquire(&mut h, &k, "o1", "r1", 16, false, fcall, T0).unwrap();
        assert_eq!(t1, T0 as u64);
        assert_eq!(last, t1 + 16);
        assert_eq!(
            acquire(&mut h, &k, "o2", "r2", 0, false, fcall, T0 + 10),
            None
        );
        assert_eq!(
            release(&mut h, &k, "r1", None, fcall, T0 + 20),
            ReleaseReply::Released {
                remaining: 0,
                listeners: 0
            }
        );
        // Within the block: the next token is above it.
        let (t2, _) = acquire(&mut h, &k, "o2", "r3", 0, false, fcall, T0 + 30).unwrap();
        assert!(t2 > last, "{t2} <= {last}");
        // The clock stepped back a second: still above.
        release(&mut h, &k, "r3", None, fcall, T0 + 40);
        let (t3, _) = acquire(&mut h, &k, "o1", "r4", 0, false, fcall, T0 - 1_000_000).unwrap();
        assert!(t3 > t2, "{t3} <= {t2}");
        assert_eq!(
            release(&mut h, &k, "r4", None, fcall, T0 - 999_000),
            ReleaseReply::Released {
                remaining: 0,
                listeners: 0
            }
        );
        assert_eq!(
            release(&mut h, &k, "r4", None, fcall, T0 - 999_000),
            ReleaseReply::Missing
        );
    }
}

/// A batched renewal extends the leases its acquisitions still hold, past their first lease,
/// and names the others: a free lock, another owner's, and one whose acquisition only begins
/// with the one renewed (`r1` against `r12`).
#[test]
fn a_batched_renewal_extends_its_own_leases_only() {
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|n| LockKeys::new("d:", n));
    for fcall in [false, true] {
        let mut h = Host::new().unwrap();
        acquire(&mut h, &a, "o1", "r1", 0, false, fcall, T0).unwrap();
        acquire(&mut h, &b, "o2", "r2", 0, false, fcall, T0).unwrap();
        acquire(&mut h, &d, "o1", "r12", 0, false, fcall, T0).unwrap();
        let renew = |h: &mut Host, now: i64| {
            let leases: Vec<mutex::Renewing<'_>> = [&a, &b, &c, &d]
                .into_iter()
                .map(|keys| mutex::Renewing {
                    keys,
                    acquisition: "r1",
                    lease: Duration::from_millis(1000),
                    token: 0,
                })
                .collect();
            let r = run(h, &mutex::renew_many(&leases), fcall, now);
            scripts::parse_renews(&value(&r), leases.len())
        };
        let only_a = vec![Some(true), Some(false), Some(false), Some(false)];
        assert_eq!(renew(&mut h, T0 + 50_000), only_a);
        // Past the first lease (100 ms): held because the renewal extended it.
        assert_eq!(renew(&mut h, T0 + 500_000), only_a);
    }
}

#[test]
fn every_script_compiles_and_the_library_loads() {
    // Host::new compiles every script's source and runs the library's text.
    let mut h = Host::new().unwrap();
    h.reload_functions().unwrap();
    h.restart().unwrap();
}

/// Grants and releases on one master in quick succession, so that the function library takes
/// the slot for busy and keeps a reservation there; returns the last grant's token.
fn warm(h: &mut Host, k: &LockKeys, quorum: bool, from: i64, n: u32) -> u64 {
    let mut token = 0;
    for i in 0..n {
        let now = from + i64::from(i) * 100;
        let req = format!("w{i}");
        let (t, _) = acquire(h, k, "warm", &req, 0, quorum, true, now).unwrap();
        release(h, k, &req, quorum.then_some(t), true, now + 10);
        token = t;
    }
    token
}

/// The known RedLock inversion: a quorum release raises each master's mark to the holder's
/// token only when the mark's value is below it; on a master whose mark is the library's
/// reservation and covers the token, nothing is written, and that master's next grant takes
/// the memory path, which only beats the tokens *it* issued.
#[test]
fn a_quorum_token_raised_by_a_release_stays_below_the_next() {
    let k = LockKeys::new("d:", "q");
    // Master A at the model's clock, B 500 µs ahead, C at A's clock.
    let offsets = [0i64, 500, 0];
    let mut masters: Vec<Host> = (0..3).map(|_| Host::new().unwrap()).collect();
    for (h, off) in masters.iter_mut().zip(offsets) {
        warm(h, &k, true, T0 + off, 4);
    }
    // One quorum grant on all three, right after: the client's token is the largest, B's.
    let now = T0 + 400;
    let tokens: Vec<u64> = masters
        .iter_mut()
        .zip(offsets)
        .map(|(h, off)| {
            acquire(h, &k, "x", "g1", 0, true, true, now + off)
                .unwrap()
                .0
        })
        .collect();
    let held = *tokens.iter().max().unwrap();
    assert_eq!(held, tokens[1]);
    // Its release raises every master's mark to that token.
    for (h, off) in masters.iter_mut().zip(offsets) {
        release(h, &k, "g1", Some(held), true, now + 50 + off);
    }
    // The next quorum grant, on A and C (B cut off), 100 µs later.
    let next: Vec<u64> = [0usize, 2]
        .iter()
        .map(|&m| {
            acquire(
                &mut masters[m],
                &k,
                "y",
                "g2",
                0,
                true,
                true,
                now + 100 + offsets[m],
            )
            .unwrap()
            .0
        })
        .collect();
    let token = *next.iter().max().unwrap();
    assert!(
        token > held,
        "the next quorum token {token} is {} below the raised {held}",
        held - token
    );
}

/// A mark lost without a restart (FLUSHALL) while the library's memory still holds the last
/// token: the next grant lands above the hand-off run of the last grant, not at the clock
/// (the scripts before the one fence granted at the clock there, below the run).
#[test]
fn a_lost_mark_does_not_take_tokens_below_a_remembered_block() {
    let k = LockKeys::new("d:", "m");
    let mut h = Host::new().unwrap();
    let w = warm(&mut h, &k, false, T0, 3);
    // A grant with a block, handed off locally up to w + 700.
    let now = T0 + 300;
    let (t, last) = acquire(&mut h, &k, "x", "g1", 1024, false, true, now).unwrap();
    assert!(t > w && last == t + 1024);
    let handed = t + 500;
    // FLUSHALL: the lock and the mark are gone; the holder's run goes on locally.
    h.shared.borrow_mut().db.map.clear();
    let (t2, _) = acquire(&mut h, &k, "y", "g2", 0, false, true, now + 100).unwrap();
    assert!(
        t2 > handed,
        "a grant after the mark was lost took {t2}, {} below the hand-off token {handed} (the memory held {last})",
        handed - t2
    );
}

/// A quiet slot (grants more than `RESERVE` apart): each grant writes the mark as its last
/// token's digits, which the function library's next grant takes as its own without parsing
/// them; higher digits another writer put there are read, and a clock that stepped back twice
/// still gives rising tokens.
#[test]
fn a_quiet_slot_s_mark_holds_the_last_token_s_digits() {
    let k = LockKeys::new("d:", "q");
    let mark = |h: &Host| match h.shared.borrow().db.map.get(k.fence.as_bytes()) {
        Some(Entry {
            val: Val::Str(s), ..
        }) => String::from_utf8(s.clone()).unwrap(),
        other => panic!("the mark is {other:?}"),
    };
    for fcall in [false, true] {
        let mut h = Host::new().unwrap();
        let grant = |h: &mut Host, req: &str, now: i64| {
            let got = acquire(h, &k, "o", req, 16, false, fcall, now).unwrap();
            release(h, &k, req, None, fcall, now + 10);
            got
        };
        let (t1, last1) = grant(&mut h, "q1", T0);
        assert_eq!((t1, mark(&h)), (T0 as u64, last1.to_string()));
        let (t2, last2) = grant(&mut h, "q2", T0 + 10_000);
        assert_eq!((t2, mark(&h)), ((T0 + 10_000) as u64, last2.to_string()));
        // Another writer's higher digits: the next token is above them.
        let high = T0 as u64 + 5_000_000;
        h.shared.borrow_mut().db.map.insert(
            k.fence.as_bytes().to_vec(),
            Entry {
                val: Val::Str(high.to_string().into_bytes()),
                expire_ms: None,
            },
        );
        let (t3, _) = grant(&mut h, "q3", T0 + 20_000);
        assert_eq!((t3, mark(&h)), (high + 1, (high + 1).to_string()));
        // The clock a second back, twice: the mark's digits + 1 each time.
        let (t4, _) = grant(&mut h, "q4", T0 - 1_000_000);
        assert_eq!((t4, mark(&h)), (t3 + 1, (t3 + 1).to_string()));
        let (t5, _) = grant(&mut h, "q5", T0 - 900_000);
        assert_eq!((t5, mark(&h)), (t4 + 1, (t4 + 1).to_string()));
    }
}

/// A hand-off run across an empty restart (the model test's `hot_name_with_local_handoff`
/// report): the first grant through the restarted server is above every token the run issued
/// before the restart, by the restart's duration less the run's lead; the run's own later
/// hand-offs, from a hold the restart took without its holder knowing yet, are below that
/// grant by about the restart's duration (0.77 s for a restart that took 0.77 s). Those are
/// the stale holder's tokens, which the resource refuses; no token of the server goes back.
#[test]
fn a_hand_off_run_across_an_empty_restart_is_the_stale_one() {
    let k = LockKeys::new("d:", "h");
    for fcall in [false, true] {
        let mut h = Host::new().unwrap();
        let now = T0 + 300;
        let (t, last) = acquire(&mut h, &k, "p1", "g1", 1024, false, fcall, now).unwrap();
        assert_eq!(last, t + 1024);
        // A burst of local hand-offs, the whole block at one instant.
        let before = last;
        h.restart().unwrap();
        let restart_took = 770_000;
        let (t2, _) = acquire(&mut h, &k, "p2", "g2", 0, false, fcall, now + restart_took).unwrap();
        assert!(t2 > before, "{t2} <= {before}");
        assert!(t2 - t >= restart_took as u64);
        // The run goes on locally until its renewal finds the lock gone: its next token is
        // `before + 1`, about 0.77 s below t2.
        let stale = before + 1;
        assert!(t2 - stale > 700_000);
    }
}

/// Asserts that a reply is no error.
fn ok(r: Reply) {
    assert!(!matches!(r, Reply::Err(_)), "{r:?}");
}

/// Runs `call` on `h` at `now` and reads it as a family acquire of `req`: Some(token) held.
fn family_acquire(h: &mut Host, call: &Call, req: &str, now: i64) -> Option<u64> {
    let r = run(h, call, false, now);
    match scripts::parse_grant(&value(&r), req, 0) {
        Some(AcquireReply::Held { token, .. }) => Some(token),
        Some(AcquireReply::Busy { .. }) => None,
        other => panic!("{:?} answered {other:?} ({r:?})", call.which),
    }
}

fn family_release(h: &mut Host, call: &Call, now: i64) -> ReleaseReply {
    let r = run(h, call, false, now);
    scripts::parse_family_release(&value(&r)).unwrap_or_else(|| panic!("release answered {r:?}"))
}

/// The other lock types' scripts run on the model too (lists, hashes, sorted sets, ZADD
/// flags, ZRANGE WITHSCORES, ZSCAN...): a fair mutex, a read-write lock's writer and readers
/// and a semaphore exclude, queue, release and fence as their clients expect, with no error
/// reply.
#[test]
fn the_other_lock_types_run_on_the_model() {
    let lease = Duration::from_millis(500);
    let holder = |owner: &'static str, acquisition: &'static str| Holder { owner, acquisition };
    let mut h = Host::new().unwrap();
    // Fair mutex: a holds, b queues, a's release lets b in with a higher token.
    let fair = LockKeys::family("d:", "f", "fair", "grant:");
    let ta = family_acquire(
        &mut h,
        &fair_mutex::acquire(&fair, "a", "fa", lease, true, None, None),
        "fa",
        T0,
    )
    .unwrap();
    assert_eq!(
        family_acquire(
            &mut h,
            &fair_mutex::acquire(&fair, "b", "fb", lease, true, None, None),
            "fb",
            T0 + 10
        ),
        None
    );
    ok(run(
        &mut h,
        &fair_mutex::renew(&fair, holder("a", "fa"), lease),
        false,
        T0 + 20,
    ));
    assert!(matches!(
        family_release(
            &mut h,
            &fair_mutex::release(&fair, holder("a", "fa"), Level::Outermost, "r1"),
            T0 + 30
        ),
        ReleaseReply::Released { remaining: 0, .. }
    ));
    let tb = family_acquire(
        &mut h,
        &fair_mutex::acquire(&fair, "b", "fb", lease, true, None, None),
        "fb",
        T0 + 40,
    )
    .unwrap();
    assert!(tb > ta, "{tb} <= {ta}");
    ok(run(
        &mut h,
        &fair_mutex::admin(&fair, Admin::Holder),
        false,
        T0 + 50,
    ));
    ok(run(
        &mut h,
        &fair_mutex::admin(&fair, Admin::Force),
        false,
        T0 + 60,
    ));
    // Read-write lock: a writer holds; readers wait; after its release two readers share it.
    let rw = LockKeys::family("d:", "r", "rw", "free");
    let tw = family_acquire(
        &mut h,
        &rw_lock::write(&rw, "w", "rw1", lease, true),
        "rw1",
        T0,
    )
    .unwrap();
    assert_eq!(
        family_acquire(
            &mut h,
            &rw_lock::read(&rw, "x", "rr1", lease, true, true),
            "rr1",
            T0 + 10
        ),
        None
    );
    ok(run(
        &mut h,
        &rw_lock::renew(&rw, holder("w", "rw1"), lease, false),
        false,
        T0 + 20,
    ));
    assert!(matches!(
        family_release(
            &mut h,
            &rw_lock::release(&rw, holder("w", "rw1"), false, false),
            T0 + 30
        ),
        ReleaseReply::Released { .. }
    ));
    family_acquire(
        &mut h,
        &rw_lock::read(&rw, "x", "rr1", lease, true, true),
        "rr1",
        T0 + 40,
    )
    .unwrap();
    family_acquire(
        &mut h,
        &rw_lock::read(&rw, "y", "rr2", lease, false, false),
        "rr2",
        T0 + 50,
    )
    .unwrap();
    assert_eq!(
        family_acquire(
            &mut h,
            &rw_lock::write(&rw, "w", "rw2", lease, true),
            "rw2",
            T0 + 60
        ),
        None
    );
    ok(run(
        &mut h,
        &rw_lock::cancel(&rw, "w", "rw2"),
        false,
        T0 + 70,
    ));
    ok(run(
        &mut h,
        &rw_lock::admin(&rw, Admin::Holder),
        false,
        T0 + 80,
    ));
    ok(run(
        &mut h,
        &rw_lock::admin(&rw, Admin::Force),
        false,
        T0 + 90,
    ));
    let tw2 = family_acquire(
        &mut h,
        &rw_lock::write(&rw, "w", "rw3", lease, false),
        "rw3",
        T0 + 100,
    )
    .unwrap();
    assert!(tw2 > tw, "{tw2} <= {tw}");
    // Semaphore of 2 permits: two holders, a third waits until one leaves.
    let sem = LockKeys::family("d:", "s", "sem", "released");
    family_acquire(
        &mut h,
        &semaphore::acquire(&sem, "a", "s1", 1, 2, lease, true),
        "s1",
        T0,
    )
    .unwrap();
    family_acquire(
        &mut h,
        &semaphore::acquire(&sem, "b", "s2", 1, 2, lease, true),
        "s2",
        T0 + 10,
    )
    .unwrap();
    assert_eq!(
        family_acquire(
            &mut h,
            &semaphore::acquire(&sem, "c", "s3", 1, 2, lease, true),
            "s3",
            T0 + 20
        ),
        None
    );
    ok(run(
        &mut h,
        &semaphore::renew(&sem, holder("a", "s1"), lease),
        false,
        T0 + 30,
    ));
    assert!(matches!(
        family_release(
            &mut h,
            &semaphore::release(&sem, holder("a", "s1")),
            T0 + 40
        ),
        ReleaseReply::Released { .. }
    ));
    family_acquire(
        &mut h,
        &semaphore::acquire(&sem, "c", "s3", 1, 2, lease, true),
        "s3",
        T0 + 50,
    )
    .unwrap();
    ok(run(&mut h, &semaphore::used(&sem), false, T0 + 60));
    ok(run(
        &mut h,
        &semaphore::admin(&sem, Admin::Holder),
        false,
        T0 + 70,
    ));
    ok(run(
        &mut h,
        &semaphore::admin(&sem, Admin::Force),
        false,
        T0 + 80,
    ));
}
