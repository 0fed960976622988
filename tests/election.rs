//! Leader election against real servers (one server, Sentinel, Cluster): one leader among
//! processes, a killed leader replaced within its lease, observers in another process, terms
//! rising across leaders and an empty restart, a resignation waking a candidate as fast as an
//! unlock, and an idle observer that sends no command.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    RedisCluster, RedisServer, SentinelSet, TestChild, child_env, is_child, unique_name,
    with_deadline,
};
use locksmith::{Client, Error, Leader};

/// Allowance for scheduling on a busy 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

/// A child process that campaigns in `LS_ELECTION` on `LS_URL` with a 1 s lease, proclaims
/// `LS_VALUE`, prints `LEADING` and then leads until it is killed.
#[test]
fn child_candidate() {
    if !is_child("candidate") {
        return;
    }
    let client = Client::builder(child_env("LS_URL").as_str())
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let election = client.election(&child_env("LS_ELECTION")).unwrap();
    let leadership = election.campaign().unwrap();
    leadership.proclaim(&child_env("LS_VALUE")).unwrap();
    println!("LEADING");
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// A child process that observes `LS_ELECTION` on `LS_URL` and prints each state it sees:
/// `STATE <term> <value>` or `STATE none`.
#[test]
fn child_observer() {
    if !is_child("observer") {
        return;
    }
    let client = Client::open(child_env("LS_URL").as_str()).unwrap();
    let election = client.election(&child_env("LS_ELECTION")).unwrap();
    for state in election.observe().unwrap() {
        match state.unwrap() {
            Some(l) => println!("STATE {} {}", l.term, l.value.unwrap_or_default()),
            None => println!("STATE none"),
        }
    }
}

#[test]
fn one_leader_among_candidates_and_a_resignation_passes_it_on() {
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(60), move || {
        let clients: Vec<Client> = (0..3)
            .map(|_| Client::open(url.as_str()).unwrap())
            .collect();
        let name = unique_name("one-leader");
        let first = clients[0].election(&name).unwrap().campaign().unwrap();
        assert!(first.is_leader());
        for c in &clients[1..] {
            assert!(c.election(&name).unwrap().try_campaign().unwrap().is_none());
        }
        first.proclaim("node-0").unwrap();
        let seen = clients[2]
            .election(&name)
            .unwrap()
            .leader()
            .unwrap()
            .unwrap();
        assert_eq!(
            (seen.term, seen.value.as_deref()),
            (first.term(), Some("node-0"))
        );

        // Two candidates wait; the resignation elects exactly one of them, with a higher term.
        let (tx, rx) = mpsc::channel();
        let waiting: Vec<_> = clients[1..]
            .iter()
            .map(|c| {
                let (c, name, tx) = (c.clone(), name.clone(), tx.clone());
                thread::spawn(move || {
                    let election = c.election(&name).unwrap();
                    let l = election
                        .try_campaign_for(Duration::from_secs(20))
                        .unwrap()
                        .unwrap();
                    tx.send(l.term()).unwrap();
                    // Holds until the other has waited past a lease.
                    thread::sleep(Duration::from_millis(300));
                    l.resign().unwrap();
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(200));
        let old = first.term();
        first.resign().unwrap();
        let a = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let b = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(old < a && a < b, "terms {old}, {a}, {b}");
        for w in waiting {
            w.join().unwrap();
        }
        // The value was that leader's: nobody leads, and nothing is shown.
        assert_eq!(clients[0].election(&name).unwrap().leader().unwrap(), None);
    });
}

#[test]
fn a_killed_leader_is_replaced_within_its_lease_and_observers_elsewhere_see_it() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("killed");
    let envs = |value: &str| {
        vec![
            ("LS_URL", url.clone()),
            ("LS_ELECTION", name.clone()),
            ("LS_VALUE", value.to_owned()),
        ]
    };
    let observer = TestChild::spawn("child_observer", "observer", &envs(""));
    observer.wait_line("STATE none", Duration::from_secs(20));
    let mut leader = TestChild::spawn("child_candidate", "candidate", &envs("first"));
    leader.wait_line("LEADING", Duration::from_secs(20));
    let here = Client::open(url.as_str()).unwrap();
    let term = here
        .election(&name)
        .unwrap()
        .leader()
        .unwrap()
        .unwrap()
        .term;
    observer.wait_line(&format!("STATE {term} first"), Duration::from_secs(10));

    // This process campaigns; the leader dies without resigning.
    let client = Client::builder(url.as_str())
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let election = client.election(&name).unwrap();
    let (tx, rx) = mpsc::channel();
    let campaign = {
        let election = election.clone();
        thread::spawn(move || {
            let l = election
                .try_campaign_for(Duration::from_secs(20))
                .unwrap()
                .unwrap();
            tx.send(Instant::now()).unwrap();
            l.proclaim("second").unwrap();
            thread::sleep(Duration::from_millis(500));
            l.term()
        })
    };
    let killed = Instant::now();
    leader.kill9();
    let elected = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let took = elected.duration_since(killed);
    assert!(
        took < Duration::from_secs(1) + SLACK,
        "replaced {took:?} after the kill (lease 1 s)"
    );
    let new_term = campaign.join().unwrap();
    assert!(new_term > term);
    observer.wait_line(&format!("STATE {new_term} second"), Duration::from_secs(10));
    // The leadership ended with the thread's leadership dropped: the observer sees nobody.
    observer.wait_line("STATE none", Duration::from_secs(10));
}

#[test]
fn terms_rise_across_leaders_and_an_empty_restart() {
    let mut server = RedisServer::start();
    let election = Client::open(server.url().as_str())
        .unwrap()
        .election(&unique_name("terms"))
        .unwrap();
    // Three leaderships one after the other, and a fourth held across the restart.
    let terms: Vec<u64> = (0..4)
        .map(|_| election.campaign().unwrap())
        .map(|l| (l.term(), l.resign().unwrap()).0)
        .collect();
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    let held = election.campaign().unwrap();
    assert!(held.term() > terms[3]);
    let last = held.term();
    server.restart();
    // The leadership was lost with the data: its resignation says so, never `Ok`.
    assert!(matches!(held.resign(), Err(Error::LeaseLost)));
    let after = election.campaign().unwrap();
    assert!(after.term() > last, "{} after {last}", after.term());
    after.resign().unwrap();
}

/// How long a waiting candidate of another client takes to lead once `end` ends the current
/// leadership (which `end` gets, returning when it began).
fn takeover(url: &str, end: impl FnOnce(locksmith::Leadership) -> Instant) -> Duration {
    let leader = Client::open(url).unwrap();
    let candidate = Client::open(url).unwrap();
    let name = unique_name("takeover");
    let held = leader.election(&name).unwrap().campaign().unwrap();
    let waiting = {
        let name = name.clone();
        thread::spawn(move || {
            let l = candidate.election(&name).unwrap().campaign().unwrap();
            let at = Instant::now();
            drop(l);
            at
        })
    };
    // The candidate has tried once and sleeps on the election's channel.
    thread::sleep(Duration::from_millis(300));
    let began = end(held);
    waiting.join().unwrap().saturating_duration_since(began)
}

#[test]
fn a_resignation_wakes_a_candidate_as_fast_as_an_unlock_wakes_a_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(60), move || {
        let mut resign = Vec::new();
        let mut unlock = Vec::new();
        for _ in 0..5 {
            resign.push(takeover(&url, |l| {
                let at = Instant::now();
                l.resign().unwrap();
                at
            }));
            unlock.push(common::mutex_wake(&server, |g| {
                let at = Instant::now();
                g.unlock().unwrap();
                at
            }));
        }
        resign.sort();
        unlock.sort();
        let (r, u) = (resign[2], unlock[2]);
        eprintln!(
            "median: a candidate leads {r:?} after a resignation, a waiter locks {u:?} after an unlock"
        );
        assert!(
            r < Duration::from_millis(250) && r <= u * 4 + Duration::from_millis(50),
            "median: resignation {r:?}, unlock {u:?}"
        );
    });
}

/// The commands the server processed so far, less the `INFO` calls that asked and the `PING`s
/// of the client's pub/sub heartbeat: the subscriber thread probes its connection after every 2 s
/// of silence, one `PING` for all the channels it follows, whether anyone observes or not, so it
/// may fall in the idle window or not.
fn commands(conn: &mut redis::Connection) -> u64 {
    let mut stats = common::commandstats(conn);
    stats.remove("cmdstat_info");
    stats.remove("cmdstat_ping");
    stats.values().sum()
}

#[test]
fn an_idle_observer_sends_no_commands() {
    let server = RedisServer::start();
    let url = server.url();
    let mut conn = server.conn();
    let client = Client::open(url.as_str()).unwrap();
    let election = client.election(&unique_name("idle")).unwrap();
    let mut observer = election.observe().unwrap();
    assert_eq!(observer.next().unwrap().unwrap(), None);
    let before = commands(&mut conn);
    assert_eq!(observer.next_timeout(Duration::from_secs(2)).unwrap(), None);
    let after = commands(&mut conn);
    assert_eq!(after - before, 0, "commands while idle");

    // A leader that lives and renews: still nothing until its lease would end.
    let other = Client::open(url.as_str()).unwrap();
    let l = other.election(election.name()).unwrap().campaign().unwrap();
    let seen: Option<Leader> = observer
        .next_timeout(Duration::from_secs(5))
        .unwrap()
        .unwrap();
    assert_eq!(seen.map(|s| s.term), Some(l.term()));
    l.resign().unwrap();
    assert_eq!(
        observer.next_timeout(Duration::from_secs(5)).unwrap(),
        Some(None)
    );
}

#[test]
fn an_election_through_sentinel() {
    let set = SentinelSet::start();
    let client = || {
        Client::sentinel(set.sentinel_urls(), set.master_name())
            .build()
            .unwrap()
    };
    let (a, b) = (client(), client());
    let name = unique_name("sentinel-election");
    let l = a.election(&name).unwrap().campaign().unwrap();
    l.proclaim("via-sentinel").unwrap();
    assert!(b.election(&name).unwrap().try_campaign().unwrap().is_none());
    let seen = b.election(&name).unwrap().leader().unwrap().unwrap();
    assert_eq!(seen.value.as_deref(), Some("via-sentinel"));
    let mut observer = b.election(&name).unwrap().observe().unwrap();
    assert_eq!(
        observer.next().unwrap().unwrap().map(|x| x.term),
        Some(l.term())
    );
    l.resign().unwrap();
    assert_eq!(
        observer.next_timeout(Duration::from_secs(5)).unwrap(),
        Some(None)
    );
}

#[test]
fn an_election_on_a_cluster() {
    let cluster = RedisCluster::start();
    let client = || Client::cluster(cluster.seed_urls()).build().unwrap();
    let (a, b) = (client(), client());
    for i in 0..3 {
        let name = unique_name(&format!("cluster-election-{i}"));
        let mut observer = b.election(&name).unwrap().observe().unwrap();
        assert_eq!(observer.next().unwrap().unwrap(), None);
        let l = a.election(&name).unwrap().campaign().unwrap();
        let seen = observer
            .next_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(seen.map(|x| x.term), Some(l.term()));
        l.proclaim("on-a-cluster").unwrap();
        let seen = observer
            .next_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(seen.and_then(|x| x.value).as_deref(), Some("on-a-cluster"));
        assert!(b.election(&name).unwrap().try_campaign().unwrap().is_none());
        // An operator ends it: the observer sees nobody, and another candidate leads.
        assert!(
            a.force_unlock(&name, locksmith::LockKind::Election)
                .unwrap()
        );
        assert_eq!(
            observer.next_timeout(Duration::from_secs(5)).unwrap(),
            Some(None)
        );
        let next = b
            .election(&name)
            .unwrap()
            .try_campaign_for(Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert!(next.term() > l.term());
        assert!(!l.is_leader() || l.resign().is_err());
    }
}

#[test]
fn bad_input_is_refused_before_redis() {
    let server = RedisServer::start();
    let client = Client::open(server.url().as_str()).unwrap();
    assert!(matches!(
        client.election(""),
        Err(Error::InvalidName { .. })
    ));
    let too_long = "x".repeat(locksmith::MAX_NAME_LEN + 1);
    assert!(matches!(
        client.election(&too_long),
        Err(Error::InvalidName { .. })
    ));
    let l = client
        .election(&unique_name("bad"))
        .unwrap()
        .campaign()
        .unwrap();
    let value = "v".repeat(64 * 1024 + 1);
    assert!(matches!(l.proclaim(&value), Err(Error::Misuse { .. })));
    l.resign().unwrap();
}
