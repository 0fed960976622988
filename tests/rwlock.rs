//! The read-write lock on real `redis-server` processes: readers together and writers alone
//! across processes, re-entry and downgrade, writer preference, all readers woken by one
//! release, dead and paused holders, bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{bounds, kinds, proxy};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{RedisServer, TestChild, with_deadline};
use kinds::{Kind, SLACK, client_with_lease};
use locksmith::{Client, Error};
use proxy::Proxy;

fn key(name: &str, suffix: &str) -> String {
    format!("locksmith:{{{}}}:rw{suffix}", common::encode_name(name))
}

fn zcard(conn: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("ZCARD").arg(key).query(conn).unwrap()
}

/// How many read acquisitions the readers' key holds: one as a string, several as a sorted
/// set (besides its waiting writers' flag), none when missing.
fn readers(conn: &mut redis::Connection, name: &str) -> usize {
    let key = key(name, ":readers");
    let ty: String = redis::cmd("TYPE").arg(&key).query(conn).unwrap();
    match ty.as_str() {
        "string" => 1,
        "zset" => {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query(conn)
                .unwrap();
            members.iter().filter(|m| m.as_str() != "w").count()
        }
        _ => 0,
    }
}

#[test]
fn readers_share_writers_exclude() {
    let server = RedisServer::start();
    let name = common::unique_name("rw-basic");
    let a = Client::open(server.url()).unwrap();
    let b = Client::open(server.url()).unwrap();
    let c = Client::open(server.url()).unwrap();
    let la = a.rw_lock(&name).unwrap();
    let lb = b.rw_lock(&name).unwrap();
    let lc = c.rw_lock(&name).unwrap();
    with_deadline(Duration::from_secs(30), move || {
        assert!(!lc.is_locked().unwrap());
        let ra = la.read().unwrap();
        assert!(lc.is_locked().unwrap(), "a reader holds it");
        let rb = lb.try_read().unwrap().expect("readers share");
        assert!(lc.try_write().unwrap().is_none());
        assert!(
            la.try_write().is_err_and(|e| e.is_misuse()),
            "read -> write would wait for itself"
        );
        drop(ra);
        assert!(lc.try_write().unwrap().is_none());
        drop(rb);
        assert!(!lc.is_locked().unwrap());
        let w = lb.try_write().unwrap().expect("free");
        assert!(w.is_held());
        assert!(lc.is_locked().unwrap(), "a writer holds it");
        assert!(la.try_read().unwrap().is_none());
        assert!(
            la.try_write_for(Duration::from_millis(50))
                .unwrap()
                .is_none()
        );
        let t = w.fencing_token();
        w.unlock().unwrap();
        let w2 = la.write().unwrap();
        assert!(w2.fencing_token() > t);
    });
}

/// A nested guard of one thread costs one round trip (which checks that its hold is still
/// on the server), and an inner release none; a writer may take read levels and keeps them
/// after its write lock (a downgrade).
#[test]
fn reentry_and_downgrade() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let name = common::unique_name("rw-reenter");
    let a = Client::open(server.url()).unwrap();
    let b = Client::open(server.url()).unwrap();
    let la = a.rw_lock(&name).unwrap();
    let lb = b.rw_lock(&name).unwrap();
    let r1 = la.read().unwrap();
    let before = common::script_calls(&mut conn);
    let r2 = la.read().unwrap();
    let r3 = la.try_read().unwrap().unwrap();
    drop(r3);
    drop(r2);
    assert_eq!(
        common::script_calls(&mut conn) - before,
        2,
        "two re-entries and two inner releases"
    );
    assert_eq!(readers(&mut conn, &name), 1);
    assert!(r1.is_held());
    drop(r1);
    let w = la.write().unwrap();
    let w2 = la.try_write().unwrap().expect("write re-entry");
    assert_eq!(w.fencing_token(), w2.fencing_token());
    drop(w2);
    let r = la.try_read().unwrap().expect("a writer may read");
    assert!(lb.try_read().unwrap().is_none(), "still write-locked");
    w.unlock().unwrap();
    // Downgraded: another reader may join, a writer may not.
    let rb = lb.try_read().unwrap().expect("downgraded to read");
    drop(rb);
    assert!(
        lb.try_write_for(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    r.unlock().unwrap();
    assert!(lb.try_write().unwrap().is_some());
}

/// With writer preference, a waiting writer keeps new readers out; with reader preference it
/// does not. A writer that gives up lets deferring readers in at once.
#[test]
fn writer_preference_and_giving_up() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("rw-pref");
    let a = Client::open(&url).unwrap();
    let la = a.rw_lock(&name).unwrap();
    let r = la.read().unwrap();
    let (name2, url2) = (name.clone(), url.clone());
    let writer = thread::spawn(move || {
        let c = Client::open(&url2).unwrap();
        let l = c.rw_lock(&name2).unwrap();
        l.try_write_for(Duration::from_millis(800))
            .unwrap()
            .is_some()
    });
    assert!(common::wait_until(Duration::from_secs(10), || {
        zcard(&mut conn, &key(&name, ":wwait")) == 1
    }));
    let b = Client::open(&url).unwrap();
    let lb = b.rw_lock(&name).unwrap();
    assert!(
        lb.try_read().unwrap().is_none(),
        "a reader passed a waiting writer"
    );
    let eager = lb.with_reader_preference();
    drop(eager.try_read().unwrap().expect("reader preference"));
    // A deferring reader waits until the writer gives up, then gets in at once.
    let started = Instant::now();
    let got = lb.try_read_for(Duration::from_secs(5)).unwrap();
    assert!(got.is_some());
    assert!(!writer.join().unwrap(), "the writer got in past a reader");
    assert!(
        started.elapsed() < Duration::from_millis(800) + SLACK,
        "{:?}",
        started.elapsed()
    );
    drop(got);
    drop(r);
}

/// A release that opens the lock to readers wakes them all: 8 readers in two clients, blocked
/// by a writer, all hold the read lock together right after its release.
#[test]
fn one_release_wakes_every_reader() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("rw-wakeall");
    let a = Client::open(&url).unwrap();
    let la = a.rw_lock(&name).unwrap();
    let w = la.write().unwrap();
    let clients: Vec<Client> = (0..2).map(|_| Client::open(&url).unwrap()).collect();
    let holding = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let l = clients[i % 2].rw_lock(&name).unwrap();
            let (holding, tx) = (Arc::clone(&holding), tx.clone());
            thread::spawn(move || {
                let g = l.try_read_for(Duration::from_secs(20)).unwrap().unwrap();
                tx.send(Instant::now()).unwrap();
                holding.fetch_add(1, Ordering::SeqCst);
                // Held until every reader holds: they overlap.
                assert!(common::wait_until(Duration::from_secs(10), || {
                    holding.load(Ordering::SeqCst) == 8
                }));
                drop(g);
            })
        })
        .collect();
    assert!(common::wait_until(Duration::from_secs(10), || {
        zcard(&mut conn, &key(&name, ":rwait")) == 8
    }));
    let released = Instant::now();
    w.unlock().unwrap();
    let mut last = Duration::ZERO;
    for _ in 0..8 {
        let at = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        last = last.max(at - released);
    }
    println!("rw: 8 readers all held {last:?} after the writer's release");
    assert!(last < Duration::from_secs(2), "{last:?} (lease 30 s)");
    for r in readers {
        r.join().unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes
// ---------------------------------------------------------------------------------------------

#[test]
fn child_kind_workers() {
    kinds::child_workers();
}

/// 3 processes x 3 threads, a quarter of the sections writes: no write overlaps any other
/// section, writers' tokens increase, readers overlap one another, the count is exact.
#[test]
fn exclusion_across_processes() {
    let kinds = [Kind::Writer, Kind::Reader, Kind::Reader, Kind::Reader];
    kinds::exclusion_across_processes(&kinds, 16, "rw-excl");
}

#[test]
fn child_kind_holder() {
    kinds::child_holder();
}

/// A killed writer blocks readers, and a killed reader blocks writers, for at most a lease.
#[test]
fn killed_holders_free_the_lock_within_a_lease() {
    for (holder, waiter) in [(Kind::Writer, Kind::Reader), (Kind::Reader, Kind::Writer)] {
        kinds::killed_holder_frees_the_lock_within_a_lease(holder, waiter, "rw-kill");
    }
}

/// A writer paused past its lease: a reader gets in within a lease (+ slack), and the resumed
/// writer reports itself lost.
#[test]
fn paused_writer_loses_the_lock_and_says_so() {
    kinds::paused_holder_loses_the_lock_and_says_so(Kind::Writer, Kind::Reader, "rw-pause");
}

#[test]
fn bad_input() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let c = Client::open(server.url()).unwrap();
    assert!(c.rw_lock("").unwrap_err().is_invalid_name());
    let name = common::unique_name("rw-foreign");
    redis::cmd("SET")
        .arg(key(&name, ""))
        .arg("x")
        .exec(&mut conn)
        .unwrap();
    let l = c.rw_lock(&name).unwrap();
    assert!(matches!(l.try_read(), Err(Error::ForeignKey { .. })));
    assert!(matches!(l.try_write(), Err(Error::ForeignKey { .. })));
    assert!(matches!(l.writer(), Err(Error::ForeignKey { .. })));
    assert!(matches!(l.readers(), Err(Error::ForeignKey { .. })));
    assert!(matches!(l.force_unlock(), Err(Error::ForeignKey { .. })));
    let v: String = redis::cmd("GET")
        .arg(key(&name, ""))
        .query(&mut conn)
        .unwrap();
    assert_eq!(v, "x");
}

/// Child: waits for the write lock (behind the test's reader) and prints `waiting` once it is
/// registered as a waiting writer.
#[test]
fn child_rw_waiting_writer() {
    let Some((url, name)) = common::child_url_name("rw-waiting-writer") else {
        return;
    };
    let lease = common::child_ms("LS_LEASE_MS");
    let client = client_with_lease(&url, lease);
    let lock = client.rw_lock(&name).unwrap();
    let (url2, name2) = (url.clone(), name.clone());
    thread::spawn(move || {
        let mut conn = redis::Client::open(url2.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        assert!(common::wait_until(Duration::from_secs(20), || {
            zcard(&mut conn, &key(&name2, ":wwait")) == 1
        }));
        println!("waiting");
    });
    let _g = lock.write().unwrap();
    thread::sleep(Duration::from_secs(60));
}

/// A waiting writer that died keeps deferring readers out for at most a lease (+ slack).
#[test]
fn dead_waiting_writer_blocks_readers_at_most_a_lease() {
    let lease = Duration::from_secs(1);
    let (_server, url) = common::server_url();
    let name = common::unique_name("rw-deadwriter");
    let a = client_with_lease(&url, lease);
    let la = a.rw_lock(&name).unwrap();
    let r = la.read().unwrap();
    let mut writer = common::spawn_leased(
        "child_rw_waiting_writer",
        "rw-waiting-writer",
        &url,
        &name,
        lease,
    );
    writer.wait_line("waiting", Duration::from_secs(30));
    let b = client_with_lease(&url, lease);
    let lb = b.rw_lock(&name).unwrap();
    assert!(lb.try_read().unwrap().is_none(), "writer preference");
    let killed = Instant::now();
    writer.kill9();
    let got = lb.try_read_for(Duration::from_secs(10)).unwrap();
    let waited = killed.elapsed();
    assert!(got.is_some());
    println!("rw: dead waiting writer stopped deferring readers {waited:?} after the kill");
    assert!(waited <= lease + SLACK, "{waited:?}");
    drop(got);
    drop(r);
}

/// Clients with different leases on one lock: a writer holds with a long lease (20 s), a
/// waiting writer with a short one (2 s) is killed (SIGKILL), a deferring reader with a long
/// lease (30 s) waits. The holder releases at once: the reader gets in at most the *dead
/// writer's* lease after the kill (+ slack). The release wakes no reader (a writer still
/// seemed to wait), so the reader's sleep must end by the waiting writer's deadline.
#[test]
fn dead_waiting_writer_is_skipped_by_its_own_lease_whoever_releases() {
    let long = Duration::from_secs(20);
    let short = Duration::from_secs(2);
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("rw-deadwriter-leases");
    with_deadline(Duration::from_secs(60), move || {
        let a = client_with_lease(&url, long);
        let la = a.rw_lock(&name).unwrap();
        let w = la.write().unwrap();
        let mut writer = common::spawn_leased(
            "child_rw_waiting_writer",
            "rw-waiting-writer",
            &url,
            &name,
            short,
        );
        writer.wait_line("waiting", Duration::from_secs(30));
        let (tx, rx) = mpsc::channel();
        let (url2, name2) = (url.clone(), name.clone());
        let reader = thread::spawn(move || {
            let c = client_with_lease(&url2, Duration::from_secs(30));
            let l = c.rw_lock(&name2).unwrap();
            let r = l.try_read_for(Duration::from_secs(40)).unwrap();
            tx.send((Instant::now(), r.is_some())).unwrap();
        });
        assert!(common::wait_until(Duration::from_secs(10), || {
            zcard(&mut conn, &key(&name, ":rwait")) == 1
        }));
        let killed = Instant::now();
        writer.kill9();
        w.unlock().unwrap();
        let (at, got) = rx.recv_timeout(Duration::from_secs(45)).unwrap();
        let waited = at - killed;
        println!(
            "rw: dead waiting writer (lease {short:?}) let the reader in {waited:?} after the \
             kill; holder's lease {long:?}"
        );
        assert!(got, "the reader never got in");
        assert!(waited <= short + SLACK, "{waited:?}");
        reader.join().unwrap();
    });
}

/// Redis restarts empty while a writer holds and three readers wait: the writer reports itself
/// lost, and every reader gets in soon after the restart.
#[test]
fn readers_recover_from_a_redis_restart() {
    kinds::waiters_recover_from_a_redis_restart(Kind::Writer, Kind::Reader, 3, "rw-restart");
}

// ---------------------------------------------------------------------------------------------
// Waking all readers at once; faults on the wire; fence expiry
// ---------------------------------------------------------------------------------------------

/// The read-write lock's calls of operation `op` on lock `name`: its script's SHA1, the
/// writer's key, and for a release which hold it releases (a bulk string of its own).
fn rw_op(name: &str, op: &str) -> [Vec<u8>; 3] {
    let (file, side) = match op {
        "write" => ("rw_write.lua", None),
        "read" => ("rw_read.lua", None),
        "release_write" => ("rw_release.lua", Some("write")),
        "release_read" => ("rw_release.lua", Some("read")),
        other => panic!("no read-write lock operation {other}"),
    };
    let source = locksmith_testkit::lua_source(file).unwrap();
    [
        redis::Script::new(source).get_hash().as_bytes().to_vec(),
        key(name, "").into_bytes(),
        side.map_or_else(
            || key(name, "").into_bytes(),
            |s| format!("${}\r\n{s}\r\n", s.len()).into_bytes(),
        ),
    ]
}

/// One release wakes every waiting reader *at once*, not one after another: each reader's
/// read call after the release is held back 300 ms by the proxy, so readers woken in a chain
/// (each woken when the one before it got the lock) would hold it 300 ms apart, 1.8 s for the
/// last of six; woken at once, they all hold it about 300 ms after the release. And each
/// reader asks Redis exactly once after the release.
#[test]
fn one_release_wakes_every_reader_at_once() {
    const READERS: usize = 6;
    const DELAY: Duration = Duration::from_millis(300);
    let (server, url, mut conn) = common::server_url_conn();
    let proxy = Proxy::start(server.port());
    let purl = proxy.url();
    with_deadline(Duration::from_secs(60), move || {
        let name = common::unique_name("rw-wake-at-once");
        let writer = Client::open(&url).unwrap();
        let lw = writer.rw_lock(&name).unwrap();
        let w = lw.write().unwrap();
        // A 30 s lease: a reader that was not woken sleeps up to its 10 s renewal interval.
        let readers = client_with_lease(&purl, Duration::from_secs(30));
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let done_rx = Arc::new(std::sync::Mutex::new(done_rx));
        let threads: Vec<_> = (0..READERS)
            .map(|_| {
                let l = readers.rw_lock(&name).unwrap();
                let (tx, done_rx) = (tx.clone(), Arc::clone(&done_rx));
                thread::spawn(move || {
                    let g = l.try_read_for(Duration::from_secs(30)).unwrap().unwrap();
                    tx.send(Instant::now()).unwrap();
                    // Held until every reader held it.
                    done_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(30))
                        .unwrap();
                    drop(g);
                })
            })
            .collect();
        assert!(common::wait_until(Duration::from_secs(20), || {
            zcard(&mut conn, &key(&name, ":rwait")) == READERS
        }));
        let op = rw_op(&name, "read");
        let pats: Vec<&[u8]> = op.iter().map(Vec::as_slice).collect();
        proxy.delay_reply_to(&pats, DELAY, READERS + 1);
        let released = Instant::now();
        w.unlock().unwrap();
        let mut at = Vec::new();
        for _ in 0..READERS {
            let t = rx.recv_timeout(Duration::from_secs(30)).unwrap();
            at.push(t - released);
        }
        at.sort();
        println!("rw: {READERS} readers held the lock {at:?} after the writer's one release");
        let last = at[READERS - 1];
        assert!(
            last < DELAY * 3,
            "the last reader held it {last:?} after the release: woken one after another"
        );
        assert_eq!(
            proxy.delays(),
            READERS,
            "read calls after the release (one per reader)"
        );
        for _ in 0..READERS {
            done_tx.send(()).unwrap();
        }
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// Cut replies of write and read acquires are recognised on the retry (one writer entry, one
/// reader entry, no orphan), and a cut release reply is recognised too (`Ok`, nothing left).
#[test]
fn cut_rw_replies_count_once_and_leave_nothing() {
    let (server, mut conn, proxy, purl) = common::proxied();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let client = Client::open(&purl).unwrap();
        let other = Client::open(&url).unwrap();
        let name = common::unique_name("rw-cut");
        let l = client.rw_lock(&name).unwrap();
        let theirs = other.rw_lock(&name).unwrap();
        for op in ["write", "release_write"] {
            let o = rw_op(&name, op);
            let pats: Vec<&[u8]> = o.iter().map(Vec::as_slice).collect();
            proxy.cut_reply_to(&pats, 1);
        }
        let w = l.try_write().unwrap().expect("free");
        assert!(common::exists(&mut conn, &key(&name, "")));
        assert!(theirs.try_read().unwrap().is_none());
        w.unlock().unwrap();
        assert_eq!(proxy.cuts(), 2, "the replies were not cut");
        assert!(!common::exists(&mut conn, &key(&name, "")));
        for op in ["read", "release_read"] {
            let o = rw_op(&name, op);
            let pats: Vec<&[u8]> = o.iter().map(Vec::as_slice).collect();
            proxy.cut_reply_to(&pats, 1);
        }
        let r = l.try_read().unwrap().expect("free");
        assert_eq!(readers(&mut conn, &name), 1);
        assert!(theirs.try_write().unwrap().is_none());
        r.unlock().unwrap();
        assert_eq!(proxy.cuts(), 4, "the replies were not cut");
        assert_eq!(readers(&mut conn, &name), 0);
        let w = theirs.try_write().unwrap().expect("nothing left behind");
        w.unlock().unwrap();
    });
}

/// Write tokens rise from one writer to the next, raise the name's fencing mark (which
/// expires within a day), and rise across an empty restart too.
#[test]
fn rw_tokens_rise_and_raise_the_mark() {
    let mut server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(20), move || {
        let client = Client::open(&url).unwrap();
        let name = common::unique_name("rw-tokens");
        let l = client.rw_lock(&name).unwrap();
        let mut last = 0;
        for _ in 0..3 {
            let w = l.write().unwrap();
            assert!(w.fencing_token() > last);
            last = w.fencing_token();
            w.unlock().unwrap();
        }
        common::assert_mark_covers(&mut server.conn(), &name, last);
        server.restart();
        let w = l.write().unwrap();
        assert!(
            w.fencing_token() > last,
            "not above the token before the restart"
        );
        w.unlock().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("locksmith:{{{}}}*", common::encode_name(&name)))
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(keys, vec![key(&name, ":released")], "keys left behind");
    });
}

/// Every blocking call of a read-write lock keeps its documented bound against a stalled
/// server (`SIGSTOP`), for readers and writers: the `try_` forms and the `writer()` /
/// `readers()` queries within connect + command timeout, the `_for` / `_until` forms by
/// `max(wait, connect) + command`, `read()` and `write()` within `max(retry, connect +
/// command)`, `unlock()` and a guard's drop within connect + command. Twice: first on pooled
/// connections, then on new ones.
#[test]
fn every_rw_call_keeps_its_bound_against_a_stalled_server() {
    bounds::every_call_keeps_its_bound_against_a_stalled_server(&[Kind::Reader, Kind::Writer]);
}

/// Readers with leases of different lengths (clients with different settings): a reader with
/// a short lease never shortens the life of the readers' set below a longer reader's lease.
/// Before, it set the set's expiry to its own lease, so the longer reader's entry vanished
/// with it while it still held the read lock, and a writer could get in.
#[test]
fn a_short_reader_lease_never_shortens_a_longer_one() {
    let (server, url) = common::server_url();
    let name = common::unique_name("rw-mixed-leases");
    let long = client_with_lease(&url, Duration::from_secs(20));
    let short = client_with_lease(&url, Duration::from_secs(1));
    with_deadline(Duration::from_secs(30), move || {
        let ll = long.rw_lock(&name).unwrap();
        let ls = short.rw_lock(&name).unwrap();
        let reader = ll.read().unwrap();
        ls.read().unwrap().unlock().unwrap();
        let mut conn = server.conn();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key(&name, ":readers"))
            .query(&mut conn)
            .unwrap();
        assert!(
            pttl > 10_000,
            "the readers' set expires in {pttl} ms, before the 20 s lease still held"
        );
        assert!(reader.is_held());
        assert!(ls.try_write().unwrap().is_none());
        reader.unlock().unwrap();
    });
}

/// Redis restarts empty while a thread holds a read lock; the thread then reads again. Its
/// read entry is gone from the server, so the re-entry must not be a level of it: the outer
/// guard learns of its loss at once (and it is reported once), and the re-entry is a new read
/// acquisition on the server, which keeps a writer of another client out. Before, the re-entry
/// was counted locally on the lost hold, and the writer got in beside two guards that both
/// said "held".
#[test]
fn a_read_reentry_after_an_empty_restart_is_a_new_acquisition() {
    let mut server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let name = common::unique_name("rw-reenter-restart");
        // A 30 s lease (renewed every 10 s): no renewal notices the loss within the test.
        let (a, lost) = common::lost_log(Client::builder(&url).lease(Duration::from_secs(30)));
        let b = Client::open(&url).unwrap();
        let (la, lb) = (a.rw_lock(&name).unwrap(), b.rw_lock(&name).unwrap());
        let outer = la.read().unwrap();
        server.restart();
        let inner = la.try_read().unwrap().expect("no writer holds the lock");
        let writer = lb.try_write().unwrap();
        assert!(
            writer.is_none() || !inner.is_held(),
            "a writer holds the lock beside a read re-entry that says held"
        );
        assert!(
            !outer.is_held(),
            "the outer read guard says held, but its entry is gone from the server"
        );
        assert!(inner.is_held());
        assert_eq!(readers(&mut server.conn(), &name), 1);
        inner.unlock().unwrap();
        assert!(outer.unlock().unwrap_err().is_lease_lost());
        let w = lb
            .try_write()
            .unwrap()
            .expect("free after the new read is released");
        w.unlock().unwrap();
        drop(la);
        drop(a);
        assert_eq!(lost.lock().unwrap().len(), 1, "lost leases reported");
    });
}

/// Redis restarts empty, and another client takes the lock before the holder re-enters: a read
/// re-entry and a write re-entry are both refused (`None`), and their outer guards say lost at
/// once, instead of a re-entry counted on a hold the server no longer has.
#[test]
fn a_reentry_after_an_empty_restart_finds_the_new_owner() {
    let mut server = RedisServer::start();
    let url = server.url();
    with_deadline(Duration::from_secs(30), move || {
        let name = common::unique_name("rw-reenter-taken");
        // A 30 s lease (renewed every 10 s): no renewal notices the loss within the test.
        let (a, lost) = common::lost_log(Client::builder(&url).lease(Duration::from_secs(30)));
        let b = Client::open(&url).unwrap();
        let (la, lb) = (a.rw_lock(&name).unwrap(), b.rw_lock(&name).unwrap());

        let reader = la.read().unwrap();
        server.restart();
        let theirs = lb
            .try_write()
            .unwrap()
            .expect("free on the restarted server");
        let again = la.try_read().unwrap();
        assert!(
            again.is_none(),
            "a read re-entry was granted while another client holds the write lock"
        );
        assert!(!reader.is_held(), "the outer read guard still says held");
        theirs.unlock().unwrap();
        drop(reader);

        let writer = la.write().unwrap();
        let token = writer.fencing_token();
        server.restart();
        let theirs = lb
            .try_write()
            .unwrap()
            .expect("free on the restarted server");
        let again = la.try_write().unwrap();
        assert!(
            again.is_none(),
            "a write re-entry was granted while another client holds the write lock"
        );
        assert!(!writer.is_held(), "the outer write guard still says held");
        assert!(theirs.fencing_token() > token);
        theirs.unlock().unwrap();
        drop(writer);
        drop(la);
        drop(a);
        let reports = lost.lock().unwrap().clone();
        assert_eq!(reports.len(), 2, "lost leases reported: {reports:?}");
        assert_eq!(
            reports.iter().filter(|l| l.fencing_token == token).count(),
            1
        );
    });
}

/// The expiry on the server (`PEXPIRETIME`, server milliseconds) of the writer and of the one
/// reader (each a string).
fn expiries(conn: &mut redis::Connection, name: &str) -> (i64, i64) {
    let at = |conn: &mut redis::Connection, k: &str| -> i64 {
        redis::cmd("PEXPIRETIME").arg(k).query(conn).unwrap()
    };
    assert_eq!(readers(conn, name), 1);
    (at(conn, &key(name, "")), at(conn, &key(name, ":readers")))
}

/// A re-entry extends its hold's lease on the server as a renewal would, but not after the
/// maximum hold time: a thread re-entering in a loop must not keep the lock for ever.
#[test]
fn a_reentry_extends_the_lease_up_to_the_maximum_hold_time() {
    common::on_server(Duration::from_secs(30), move |url, mut conn| {
        let name = common::unique_name("rw-reenter-extend");
        let max_hold = Duration::from_millis(1500);
        let client = Client::builder(&url)
            .lease(Duration::from_secs(6))
            .max_hold(max_hold)
            .build()
            .unwrap();
        let l = client.rw_lock(&name).unwrap();
        let acquired = Instant::now();
        let w = l.write().unwrap();
        let r = l.read().unwrap();
        let (w0, r0) = expiries(&mut conn, &name);
        thread::sleep(Duration::from_millis(300));
        let (w2, r2) = (
            l.try_write().unwrap().unwrap(),
            l.try_read().unwrap().unwrap(),
        );
        let (w1, r1) = expiries(&mut conn, &name);
        assert!(
            w1 > w0 && r1 > r0,
            "not extended: {w0} -> {w1}, {r0} -> {r1}"
        );
        drop((w2, r2));
        thread::sleep(
            (acquired + max_hold + Duration::from_millis(300))
                .saturating_duration_since(Instant::now()),
        );
        let before = expiries(&mut conn, &name);
        let (w3, r3) = (
            l.try_write().unwrap().unwrap(),
            l.try_read().unwrap().unwrap(),
        );
        assert_eq!(
            expiries(&mut conn, &name),
            before,
            "extended after the maximum hold time"
        );
        assert!(w3.is_held() && r3.is_held());
        drop((w3, r3));
        r.unlock().unwrap();
        w.unlock().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// The waiting flags: a release publishes only for the waiters that flagged the lock
// ---------------------------------------------------------------------------------------------

/// Child: waits for the write lock (`LS_MODE` `write`) or a read lock (`read`) of `LS_NAME`
/// with a 30 s lease and prints `got` once it holds it.
#[test]
fn child_rw_long_waiter() {
    let Some((url, name)) = common::child_url_name("rw-long-waiter") else {
        return;
    };
    let client = client_with_lease(&url, Duration::from_secs(30));
    let lock = client.rw_lock(&name).unwrap();
    if common::child_env("LS_MODE") == "write" {
        let _g = lock.write().unwrap();
        println!("got");
        thread::sleep(Duration::from_secs(60));
    } else {
        let _g = lock.read().unwrap();
        println!("got");
        thread::sleep(Duration::from_secs(60));
    }
}

fn spawn_long_waiter(url: &str, name: &str, mode: &str) -> TestChild {
    common::spawn_child(
        "child_rw_long_waiter",
        "rw-long-waiter",
        url,
        name,
        &[("LS_MODE", mode.to_owned())],
    )
}

fn publishes(conn: &mut redis::Connection) -> u64 {
    common::calls(&common::commandstats(conn), "cmdstat_publish")
}

/// Uncontended read and write cycles publish nothing. A writer in another process that waits
/// for readers flags them: one reader (a string), then two (a sorted set, the flag a member),
/// and the last reader's release wakes the writer at once. A reader in another process that
/// waits for a writer flags it, and the writer's release wakes it at once. With a flag lost,
/// each waiter would sleep until its 10 s renewal interval or the 30 s lease ran out.
#[test]
fn waiters_are_woken_at_the_release_that_frees_them() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("rw-flags");
    let a = client_with_lease(&url, Duration::from_secs(30));
    let b = client_with_lease(&url, Duration::from_secs(30));
    let la = a.rw_lock(&name).unwrap();
    let before = publishes(&mut conn);
    for _ in 0..20 {
        la.read().unwrap().unlock().unwrap();
        la.write().unwrap().unlock().unwrap();
    }
    assert_eq!(publishes(&mut conn), before, "uncontended cycles published");

    // A writer waits for readers.
    let first = la.read().unwrap();
    let writer = spawn_long_waiter(&url, &name, "write");
    assert!(common::wait_until(Duration::from_secs(20), || {
        zcard(&mut conn, &key(&name, ":wwait")) == 1
    }));
    assert!(common::wait_until(Duration::from_secs(20), || {
        let v: Option<String> = redis::cmd("GET")
            .arg(key(&name, ":readers"))
            .query(&mut conn)
            .unwrap();
        v.is_some_and(|v| v.ends_with("|w"))
    }));
    // A second reader joins (it does not defer to the waiting writer): two readers now.
    let second = b
        .rw_lock(&name)
        .unwrap()
        .with_reader_preference()
        .read()
        .unwrap();
    assert_eq!(readers(&mut conn, &name), 2);
    second.unlock().unwrap();
    assert_eq!(readers(&mut conn, &name), 1);
    let released = Instant::now();
    first.unlock().unwrap();
    writer.wait_line("got", Duration::from_secs(5));
    let waited = released.elapsed();
    println!("rw: the waiting writer got the lock {waited:?} after the last reader's release");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    drop(writer);

    // A reader waits for a writer (the child writer's key ran out with it: wait until free).
    let name = common::unique_name("rw-flags-read");
    let la = a.rw_lock(&name).unwrap();
    let w = la.write().unwrap();
    let w2 = la.write().unwrap();
    let reader = spawn_long_waiter(&url, &name, "read");
    assert!(common::wait_until(Duration::from_secs(20), || {
        zcard(&mut conn, &key(&name, ":rwait")) == 1
    }));
    drop(w2);
    let released = Instant::now();
    w.unlock().unwrap();
    reader.wait_line("got", Duration::from_secs(5));
    let waited = released.elapsed();
    println!("rw: the waiting reader got the lock {waited:?} after the writer's release");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

/// A thread holding the write lock takes read levels while another writer waits (a
/// downgrade does not defer to waiting writers: it would wait for itself).
#[test]
fn a_writer_reads_past_a_waiting_writer() {
    let (_server, url, mut conn) = common::server_url_conn();
    let name = common::unique_name("rw-downgrade-waiting");
    let a = Client::open(&url).unwrap();
    let la = a.rw_lock(&name).unwrap();
    let w = la.write().unwrap();
    let waiter = spawn_long_waiter(&url, &name, "write");
    assert!(common::wait_until(Duration::from_secs(20), || {
        zcard(&mut conn, &key(&name, ":wwait")) == 1
    }));
    let r = la
        .try_read()
        .unwrap()
        .expect("a writer reads past a waiting writer");
    w.unlock().unwrap();
    assert!(r.is_held());
    r.unlock().unwrap();
    waiter.wait_line("got", Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------------------
// The operator's view: the writer, the readers, and force_unlock
// ---------------------------------------------------------------------------------------------

/// Another client sees the writer (label, thread, token, held for, lease left) and then two
/// readers of two clients; `force_unlock` frees the writer and wakes a reader of another
/// client waiting for it at once, then frees both readers and wakes a waiting writer at once;
/// each old holder is told (its guard says lost within a renewal, `on_lease_lost`, its unlock
/// an error).
#[test]
fn another_client_sees_writer_and_readers_and_force_unlock_frees_them() {
    common::on_server(Duration::from_secs(60), move |url, mut conn| {
        let name = common::unique_name("rw-operator");
        let (a, lost_a) = common::lost_log(
            Client::builder(&url)
                .label("app-a")
                .lease(Duration::from_millis(1500)),
        );
        let (b, lost_b) = common::lost_log(
            Client::builder(&url)
                .label("app-b")
                .lease(Duration::from_millis(1500)),
        );
        let operator = Client::open(&url).unwrap();
        let seen = operator.rw_lock(&name).unwrap();
        assert_eq!(seen.writer().unwrap(), None);
        assert!(seen.readers().unwrap().is_empty());
        let waiters = client_with_lease(&url, Duration::from_secs(30));

        // A writer, seen and forced out; a reader of another client waits for it.
        let la = a.rw_lock(&name).unwrap();
        let (token_tx, token_rx) = mpsc::channel::<u64>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<(bool, bool)>();
        let writer = thread::Builder::new()
            .name("writer-1".into())
            .spawn(move || {
                let w = la.write().unwrap();
                token_tx.send(w.fencing_token()).unwrap();
                go_rx.recv().unwrap();
                let told = common::wait_until(Duration::from_millis(1500) + SLACK, || !w.is_held());
                done_tx.send((told, w.unlock().is_err())).unwrap();
            })
            .unwrap();
        let token = token_rx.recv().unwrap();
        thread::sleep(Duration::from_millis(200));
        let w = seen.writer().unwrap().expect("a writer");
        println!("rw writer: {w:?}");
        assert_eq!((w.label.as_str(), w.thread.as_str()), ("app-a", "writer-1"));
        assert_eq!((w.hold_count, w.fencing_token), (1, token));
        assert!(w.held_for >= Duration::from_millis(150), "{:?}", w.held_for);
        assert!(w.held_for < Duration::from_secs(5), "{:?}", w.held_for);
        assert!(w.lease_left > Duration::ZERO && w.lease_left <= Duration::from_millis(1500));
        let (got_tx, got_rx) = mpsc::channel();
        let lw = waiters.rw_lock(&name).unwrap();
        let reader = thread::spawn(move || {
            let r = lw.read().unwrap();
            got_tx.send(Instant::now()).unwrap();
            r.unlock().unwrap();
        });
        assert!(common::wait_until(Duration::from_secs(20), || {
            zcard(&mut conn, &key(&name, ":rwait")) == 1
        }));
        let forced = Instant::now();
        assert!(seen.force_unlock().unwrap());
        let woken = got_rx.recv_timeout(Duration::from_secs(10)).unwrap() - forced;
        println!("rw: the waiting reader held the lock {woken:?} after force_unlock");
        assert!(woken < Duration::from_secs(1), "{woken:?}");
        go_tx.send(()).unwrap();
        assert_eq!(
            done_rx.recv().unwrap(),
            (true, true),
            "(told, unlock failed)"
        );
        writer.join().unwrap();
        reader.join().unwrap();

        // Two readers of two clients, seen and forced out; a writer of another client waits.
        let mut readers = Vec::new();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        for (client, thread_name) in [(a.clone(), "reader-a"), (b.clone(), "reader-b")] {
            let l = client.rw_lock(&name).unwrap();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let (done_tx, done_rx) = mpsc::channel::<(bool, bool)>();
            let held_tx = held_tx.clone();
            let t = thread::Builder::new()
                .name(thread_name.into())
                .spawn(move || {
                    let r = l.read().unwrap();
                    held_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    let told =
                        common::wait_until(Duration::from_millis(1500) + SLACK, || !r.is_held());
                    done_tx.send((told, r.unlock().is_err())).unwrap();
                })
                .unwrap();
            held_rx.recv().unwrap();
            readers.push((t, go_tx, done_rx));
        }
        let mut seen_readers = seen.readers().unwrap();
        seen_readers.sort_by(|x, y| x.label.cmp(&y.label));
        println!("rw readers: {seen_readers:?}");
        let who: Vec<(&str, &str)> = seen_readers
            .iter()
            .map(|h| (h.label.as_str(), h.thread.as_str()))
            .collect();
        assert_eq!(who, [("app-a", "reader-a"), ("app-b", "reader-b")]);
        assert!(
            seen_readers
                .iter()
                .all(|h| h.fencing_token == 0 && h.hold_count == 1)
        );
        assert_eq!(seen.writer().unwrap(), None);
        let (got_tx, got_rx) = mpsc::channel();
        let lw = waiters.rw_lock(&name).unwrap();
        let writer = thread::spawn(move || {
            let w = lw.write().unwrap();
            got_tx.send((Instant::now(), w.fencing_token())).unwrap();
            w.unlock().unwrap();
        });
        assert!(common::wait_until(Duration::from_secs(20), || {
            zcard(&mut conn, &key(&name, ":wwait")) == 1
        }));
        let forced = Instant::now();
        assert!(seen.force_unlock().unwrap());
        let (at, new_token) = got_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        println!(
            "rw: the waiting writer held the lock {:?} after force_unlock",
            at - forced
        );
        assert!(at - forced < Duration::from_secs(1), "{:?}", at - forced);
        assert!(new_token > token);
        for (t, go_tx, done_rx) in readers {
            go_tx.send(()).unwrap();
            assert_eq!(
                done_rx.recv().unwrap(),
                (true, true),
                "(told, unlock failed)"
            );
            t.join().unwrap();
        }
        writer.join().unwrap();
        assert!(!seen.force_unlock().unwrap(), "nothing held");
        drop((a, b));
        assert_eq!(
            lost_a.lock().unwrap().len(),
            2,
            "writer and reader of app-a"
        );
        assert_eq!(lost_b.lock().unwrap().len(), 1, "reader of app-b");
    });
}

// ---------------------------------------------------------------------------------------------
// Queued waiters: every one is served when the lock is free
// ---------------------------------------------------------------------------------------------

#[test]
fn child_kind_queued_waiter() {
    kinds::child_queued_waiter();
}

/// Two writers of one client queue behind another client's writer: the first gets the lock
/// at the release, and the second within milliseconds of the first's release (it is not
/// registered on the server, so that release must publish for it), in every form, with local
/// hand-off on and off; and the same with the second writer in another process.
#[test]
fn a_second_queued_writer_gets_the_lock_at_the_first_ones_release() {
    with_deadline(Duration::from_secs(240), || {
        for handoff in [true, false] {
            for form in kinds::Form::ALL {
                for child in [false, true] {
                    kinds::queued_waiters_are_served_at_once(
                        Kind::Writer,
                        Kind::Writer,
                        Kind::Writer,
                        handoff,
                        form,
                        child,
                    );
                }
            }
        }
    });
}

/// The read side: two readers of one client (or of two processes) that wait for a writer
/// both get in at its release; a reader queued behind a writer of its own client gets in at
/// that writer's release.
#[test]
fn queued_readers_get_the_lock_at_the_release_that_frees_them() {
    with_deadline(Duration::from_secs(240), || {
        for handoff in [true, false] {
            for form in kinds::Form::ALL {
                for child in [false, true] {
                    for first in [Kind::Reader, Kind::Writer] {
                        kinds::queued_waiters_are_served_at_once(
                            Kind::Writer,
                            first,
                            Kind::Reader,
                            handoff,
                            form,
                            child,
                        );
                    }
                }
            }
        }
    });
}

/// A writer that waits for a reader whose lease is never renewed (its process died) gets in
/// when that lease ends, by the server's clock, whether the readers are kept as one string
/// (one reader all along) or as a sorted set (another reader came and left): the wait the
/// server returns is relative in both. In every form, with local hand-off on and off.
#[test]
fn a_writer_waiting_for_a_dead_reader_gets_in_at_its_lease_end() {
    let lease = Duration::from_secs(3);
    let (_server, url, mut conn) = common::server_url_conn();
    with_deadline(Duration::from_secs(120), move || {
        for visit in [false, true] {
            for handoff in [true, false] {
                for form in kinds::Form::ALL {
                    let what = format!("visit {visit}, {form:?}, hand-off {handoff}");
                    let name = common::unique_name("rw-dead-reader");
                    // A reader in a child process, killed once it holds: its lease is never
                    // renewed or released.
                    let mut reader = kinds::spawn_holder(Kind::Reader, &url, &name, lease);
                    reader.kill9();
                    if visit {
                        let b = Client::open(url.as_str()).unwrap();
                        b.rw_lock(&name).unwrap().read().unwrap().unlock().unwrap();
                        assert_eq!(readers(&mut conn, &name), 1, "{what}");
                    }
                    // When the dead reader's lease ends, by the server's clock.
                    let left = lease_left(&mut conn, &name);
                    let ends = Instant::now() + left;
                    let c = Client::builder(url.as_str())
                        .local_handoff(handoff)
                        .build()
                        .unwrap();
                    let lock = kinds::Kind::Writer.open(&c, &name);
                    let g = match form {
                        kinds::Form::Blocking => Some(lock.lock().unwrap()),
                        kinds::Form::For => lock.try_lock_for(Duration::from_secs(8)).unwrap(),
                    };
                    let at = Instant::now();
                    assert!(g.is_some(), "{what}: the writer never got in");
                    let late = at.saturating_duration_since(ends);
                    println!("rw: {what}: the writer got in {late:?} after the reader's lease end");
                    assert!(
                        at + Duration::from_millis(50) >= ends,
                        "{what}: the writer got in {:?} before the reader's lease ended",
                        ends - at
                    );
                    assert!(late < kinds::HANDOVER, "{what}: {late:?} late");
                    g.unwrap().unlock().unwrap();
                }
            }
        }
    });
}

/// How long the one reader of lock `name` holds it still, by the server: its key's `PTTL` (one
/// reader as a string) or its score in the sorted set less the server's clock.
fn lease_left(conn: &mut redis::Connection, name: &str) -> Duration {
    let key = key(name, ":readers");
    let ty: String = redis::cmd("TYPE").arg(&key).query(conn).unwrap();
    let ms: i64 = if ty == "string" {
        redis::cmd("PTTL").arg(&key).query(conn).unwrap()
    } else {
        let (deadline, (s, us)): (i64, (i64, i64)) = redis::pipe()
            .cmd("ZRANGE")
            .arg(&key)
            .arg("-inf")
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .arg("WITHSCORES")
            .cmd("TIME")
            .query::<(Vec<(String, i64)>, (i64, i64))>(conn)
            .map(|(members, time)| (members[0].1, time))
            .unwrap();
        deadline - (s * 1000 + us / 1000)
    };
    Duration::from_millis(u64::try_from(ms).unwrap())
}

/// `with_read` and `with_write`: the closure's value comes back, the lock is held while it
/// runs (another client cannot write inside `with_read`, nor read inside `with_write`) and
/// free after; a `force_unlock` by another client during the closure makes it return the
/// release's error, as `unlock` would.
#[test]
fn with_read_and_with_write_hold_the_lock_around_the_closure() {
    let server = RedisServer::start();
    let url = server.url();
    let name = common::unique_name("rw-with");
    let [ours, theirs] = common::clients::<2>(&url);
    let lock = ours.rw_lock(&name).unwrap();
    let other = theirs.rw_lock(&name).unwrap();
    let read = lock
        .with_read(|guard| {
            assert!(guard.is_held());
            assert!(other.try_write().unwrap().is_none(), "written while read");
            "read"
        })
        .unwrap();
    assert_eq!(read, "read");
    let token = lock
        .with_write(|guard| {
            assert!(guard.is_held());
            assert!(other.try_read().unwrap().is_none(), "read while written");
            guard.fencing_token()
        })
        .unwrap();
    let g = other.try_write().unwrap().expect("free after with_write");
    assert!(g.fencing_token() > token);
    g.unlock().unwrap();

    let e = lock
        .with_write(|_| assert!(other.force_unlock().unwrap()))
        .expect_err("the write lock was forced away inside the closure");
    assert!(e.is_lease_lost(), "{e:?}");
    let e = lock
        .with_read(|_| assert!(other.force_unlock().unwrap()))
        .expect_err("the read lock was forced away inside the closure");
    assert!(e.is_lease_lost(), "{e:?}");
    assert!(other.try_write().unwrap().is_some(), "not free at the end");
}

/// The lease of a fixed-lease test: short, so that the tests see it end.
const FIXED: Duration = Duration::from_millis(300);

/// Asserts that `lease` out of bounds is `InvalidConfig` for `with_lease`.
#[track_caller]
fn assert_bad_leases_refused<T: std::fmt::Debug>(
    with_lease: impl Fn(Duration) -> locksmith::Result<T>,
) {
    for lease in [
        Duration::ZERO,
        Duration::from_millis(29),
        Duration::from_secs(366 * 24 * 3600),
    ] {
        let err = with_lease(lease).expect_err("a fixed lease out of bounds accepted");
        assert!(err.is_invalid_config(), "with_lease({lease:?}): {err}");
    }
}

/// `with_lease`: the writer's and a reader's holds end by themselves after the fixed lease,
/// unrenewed (the client's lease is 30 s), and a re-entry through a renewed handle extends
/// neither; another client then takes the lock. A lease out of bounds is `InvalidConfig`.
#[test]
fn fixed_lease_ends_by_itself() {
    common::on_server(Duration::from_secs(60), |url, mut conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("rw-fixed");
        let plain = a.rw_lock(&name).unwrap();
        assert_bad_leases_refused(|l| plain.with_lease(l));
        let fixed = plain.with_lease(FIXED).unwrap();
        let other = b.rw_lock(&name).unwrap();

        // The writer, re-entered through the renewed handle: free one lease after the write.
        let start = Instant::now();
        let w = fixed.write().unwrap();
        let inner = plain.write().unwrap();
        assert!(common::pttl(&mut conn, &key(&name, "")) <= 300);
        assert!(other.try_read().unwrap().is_none());
        let taken = other
            .try_write_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed write lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(!w.is_held() && !inner.is_held());
        assert!(inner.unlock().is_err() && w.unlock().is_err());
        taken.unlock().unwrap();

        // A reader beside another client's reader, re-entered through the renewed handle.
        let start = Instant::now();
        let r = fixed.read().unwrap();
        let inner = plain.read().unwrap();
        let theirs = other.read().unwrap();
        assert_eq!(readers(&mut conn, &name), 2);
        theirs.unlock().unwrap();
        let taken = other
            .try_write_for(Duration::from_secs(5))
            .unwrap()
            .expect("the fixed read lease never ended");
        let waited = start.elapsed();
        assert!(
            waited + Duration::from_millis(20) >= FIXED,
            "taken after {waited:?}"
        );
        assert!(!r.is_held());
        drop((inner, r));
        taken.unlock().unwrap();
    });
}

/// `Client::shutdown` releases fixed-lease holds too: another client takes the write lock at
/// once, long before the 30 s fixed lease would end.
#[test]
fn fixed_lease_released_at_shutdown() {
    common::on_server(Duration::from_secs(30), |url, _conn| {
        let [a, b] = common::clients::<2>(&url);
        let name = common::unique_name("rw-fixed-shutdown");
        let w = a
            .rw_lock(&name)
            .unwrap()
            .with_lease(Duration::from_secs(30))
            .unwrap()
            .write()
            .unwrap();
        let other = b.rw_lock(&name).unwrap();
        assert!(other.try_read().unwrap().is_none());
        a.shutdown(Duration::from_secs(5)).unwrap();
        let taken = other
            .try_write()
            .unwrap()
            .expect("still held after the shutdown");
        assert!(matches!(w.unlock(), Err(Error::Shutdown)));
        taken.unlock().unwrap();
    });
}
