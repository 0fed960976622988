//! Messages an operator can act on: few `warn` lines for one outage, TLS named only where the
//! evidence is TLS, and errors that name the server and say what was tried.
//!
//! A logger keeps every record; the tests of this file run one at a time (they count the
//! lines logged while each runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::capture;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdGuard};
use std::thread;
use std::time::{Duration, Instant};

use capture::Line;
use common::{RedisServer, unique_name, wait_until};
use locksmith::Client;

const CONNECT: Duration = Duration::from_millis(300);
const COMMAND: Duration = Duration::from_millis(300);

/// One test at a time: each counts the lines logged while it runs.
fn serial() -> StdGuard<'static, ()> {
    static SERIAL: StdMutex<()> = StdMutex::new(());
    capture::install();
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lines logged by locksmith since `from` (an index into [`capture::lines`]).
fn since(from: usize) -> Vec<Line> {
    capture::lines()
        .into_iter()
        .skip(from)
        .filter(|l| l.target.starts_with("locksmith"))
        .collect()
}

/// A listener on `port` that accepts every connection and closes it at once (what a server
/// that is going away, or a proxy without a backend, looks like), until dropped.
struct Closer {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Closer {
    fn on(port: u16) -> Closer {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => drop(s),
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Closer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Redis is killed for a few seconds while a client holds a short lease: one `warn` for the
/// lost pub/sub connection, one for the lost lease, and one `info` when the connection is
/// back; every reconnect try at `debug` only. (A connection that stays down is reported
/// again once a minute: `DOWN_REPORT_EVERY`, longer than this outage.)
#[test]
fn an_outage_logs_a_handful_of_warnings() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let port = server.port();
    let client = Client::builder(server.url())
        .lease(Duration::from_millis(1500))
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap();
    let name = unique_name("outage");
    let m = client.mutex(&name).unwrap();
    let guard = m.lock().unwrap();
    let from = capture::lines().len();
    let down = Instant::now();
    server.stop();
    // Down for several reconnect periods (the backoff tops out at 1 s) and past the lease.
    assert!(wait_until(Duration::from_secs(10), || !guard.is_held()));
    thread::sleep(Duration::from_secs(5).saturating_sub(down.elapsed()));
    server.restart();
    let restored = |l: &Line| l.level == log::Level::Info && l.text.contains("restored");
    assert!(
        wait_until(Duration::from_secs(10), || since(from).iter().any(restored)),
        "no `restored` line: {:#?}",
        since(from)
    );
    drop(guard);
    let lines = since(from);
    let show = || lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let warns: Vec<&Line> = lines
        .iter()
        .filter(|l| l.level <= log::Level::Warn)
        .collect();
    let tries = lines
        .iter()
        .filter(|l| l.text.contains("pub/sub reconnect"))
        .count();
    println!("{} warn line(s), {tries} tries:\n{}", warns.len(), show());
    assert!(
        tries >= 3,
        "the outage was too short to test anything:\n{}",
        show()
    );
    assert!(
        warns.len() <= 3,
        "{} warn lines for one outage:\n{}",
        warns.len(),
        show()
    );
    let lease_lines = warns.iter().filter(|l| l.text.contains(&name)).count();
    assert_eq!(
        lease_lines,
        1,
        "the lost lease is one warn line:\n{}",
        show()
    );
    let lost = warns
        .iter()
        .find(|l| l.target == "locksmith::subscriber" && l.text.contains("lost"))
        .unwrap_or_else(|| panic!("no warn line for the lost connection:\n{}", show()));
    assert!(lost.text.contains(&format!("127.0.0.1:{port}")), "{lost}");
    assert!(
        lines.iter().any(|l| restored(l)
            && l.target == "locksmith::subscriber"
            && l.text.contains(&format!("127.0.0.1:{port}"))),
        "{}",
        show()
    );
}

/// The same on a cluster: the master of a held lock's slot, which also serves a waiter's
/// sharded pub/sub connection, is killed for several seconds and restarted.
#[test]
fn a_cluster_master_outage_logs_a_handful_of_warnings() {
    let _serial = serial();
    let mut cluster = common::RedisCluster::start_with(3, 0);
    let client = |lease: Duration| {
        Client::cluster(cluster.seed_urls())
            .lease(lease)
            .connect_timeout(CONNECT)
            .command_timeout(COMMAND)
            .build()
            .unwrap()
    };
    let (holder, waiter) = (
        client(Duration::from_millis(1500)),
        client(Duration::from_secs(30)),
    );
    let name = unique_name("cluster-outage");
    let port = cluster.master_of_key(&format!("locksmith:{{{name}}}:lock"));
    let held = holder.mutex(&name).unwrap();
    let guard = held.lock().unwrap();
    let wanted = waiter.mutex(&name).unwrap();
    let waiting = thread::spawn(move || {
        wanted
            .try_lock_for(Duration::from_secs(30))
            .map(|g| g.is_some())
    });
    // The waiter's channel is subscribed (on the master about to be killed).
    assert!(wait_until(Duration::from_secs(10), || format!(
        "{waiter:?}"
    )
    .contains("subscribed_channels: 1")));
    let from = capture::lines().len();
    let down = Instant::now();
    cluster.kill(port);
    assert!(wait_until(Duration::from_secs(10), || !guard.is_held()));
    thread::sleep(Duration::from_secs(5).saturating_sub(down.elapsed()));
    cluster.restart(port);
    let restored = |l: &Line| l.level == log::Level::Info && l.text.contains("restored");
    assert!(
        wait_until(Duration::from_secs(20), || since(from).iter().any(restored)),
        "no `restored` line: {:#?}",
        since(from)
    );
    drop(guard);
    assert!(waiting.join().unwrap().unwrap(), "the waiter got the lock");
    let lines = since(from);
    let show = || lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let warns: Vec<&Line> = lines
        .iter()
        .filter(|l| l.level <= log::Level::Warn)
        .collect();
    let tries = lines
        .iter()
        .filter(|l| l.text.contains("pub/sub reconnect"))
        .count();
    println!("{} warn line(s), {tries} tries:\n{}", warns.len(), show());
    assert!(
        tries >= 3,
        "the outage was too short to test anything:\n{}",
        show()
    );
    assert!(
        warns.len() <= 3,
        "{} warn lines for one outage:\n{}",
        warns.len(),
        show()
    );
    let lease_lines = warns.iter().filter(|l| l.text.contains(&name)).count();
    assert_eq!(
        lease_lines,
        1,
        "the lost lease is one warn line:\n{}",
        show()
    );
    assert!(
        lines
            .iter()
            .any(|l| restored(l) && l.text.contains(&format!("127.0.0.1:{port}"))),
        "{}",
        show()
    );
}

/// A plain-text port that closes connections at once (a server going away) is not called a
/// TLS port: not by `build()`, and not by the pub/sub thread after the server was killed.
/// A real TLS port still is (tests/tls.rs).
#[test]
fn a_closed_connection_is_not_called_tls() {
    let _serial = serial();
    // build() against it.
    let port = common::free_port();
    let closer = Closer::on(port);
    let e = Client::builder(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap_err();
    let text = e.to_string();
    assert!(!e.is_tls(), "{e:?}");
    assert!(!text.contains("TLS") && !text.contains("rediss"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    drop(closer);

    // The pub/sub thread reconnecting to a killed server's port.
    let mut server = RedisServer::start();
    let port = server.port();
    let client = Client::builder(server.url())
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap();
    let from = capture::lines().len();
    server.stop();
    let closer = Closer::on(port);
    let tried = |n: usize| {
        since(from)
            .iter()
            .filter(|l| l.text.contains("pub/sub reconnect"))
            .count()
            >= n
    };
    assert!(wait_until(Duration::from_secs(10), || tried(3)));
    drop(closer);
    let tls: Vec<String> = since(from)
        .iter()
        .filter(|l| l.text.contains("TLS") || l.text.contains("rediss"))
        .map(|l| l.to_string())
        .collect();
    assert!(tls.is_empty(), "TLS named without evidence: {tls:#?}");
    drop(client);
}

/// During an outage, errors name the server (`host:port`), and a call that retried says how
/// long and how often it tried.
#[test]
fn errors_name_the_server_and_the_tries() {
    let _serial = serial();
    let mut server = RedisServer::start();
    let port = server.port();
    let client = Client::builder(server.url())
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let m = client.mutex(&unique_name("tries")).unwrap();
    server.stop();
    let addr = format!("127.0.0.1:{port}");

    let e = m.try_lock().map(|g| g.is_some()).unwrap_err();
    assert!(e.to_string().contains(&addr), "{e}");
    assert!(e.is_retriable(), "{e:?}");

    let e = m.is_locked().unwrap_err();
    assert!(e.to_string().contains(&addr), "{e}");

    let t = Instant::now();
    let e = m.lock().map(drop).unwrap_err();
    let text = e.to_string();
    println!("lock() during the outage, after {:?}: {text}", t.elapsed());
    assert!(text.contains(&addr), "{text}");
    assert!(
        text.contains("tried") && text.contains("times over"),
        "{text}"
    );
    assert!(e.is_retriable(), "{e:?}");
    // A client that cannot reach it at all names it too.
    let e = Client::builder(server.url())
        .connect_timeout(CONNECT)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains(&addr), "{e}");
}

/// A server that accepts connections and never answers (a black hole, then a frozen
/// `redis-server`): the timeout a call ends with names the server it waited for and, for a call
/// that retried, how often and for how long; `lock()` still ends within its bound.
#[test]
fn timeouts_name_the_server_and_the_tries() {
    let _serial = serial();
    let server = RedisServer::start();
    let proxy = common::proxy::Proxy::start(server.port());
    let retry = Duration::from_secs(1);
    let client = Client::builder(proxy.url())
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(retry)
        .build()
        .unwrap();
    let m = client.mutex(&unique_name("hole")).unwrap();
    // One round trip first, so that a pooled connection is open when the hole opens.
    assert!(!m.is_locked().unwrap());
    proxy.black_hole();
    let addr = format!("127.0.0.1:{}", proxy.port());

    let e = m.try_lock().map(|g| g.is_some()).unwrap_err();
    assert!(e.is_timeout() && e.is_retriable(), "{e:?}");
    assert!(e.to_string().contains(&addr), "{e}");

    let bound = retry + CONNECT + COMMAND + Duration::from_secs(2);
    let t = Instant::now();
    let e = m.lock().map(drop).unwrap_err();
    let took = t.elapsed();
    let text = e.to_string();
    println!("lock() into a black hole, after {took:?}: {text}");
    assert!(took < bound, "lock() took {took:?}: {text}");
    assert!(e.is_timeout() && e.is_retriable(), "{e:?}");
    assert!(text.starts_with("timed out: "), "{text}");
    assert!(text.contains(&addr), "{text}");
    assert!(
        text.contains("tried") && text.contains("times over"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    drop(client);
    drop(proxy);

    // The same against a frozen server, reached directly.
    let client = Client::builder(server.url())
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .retry_timeout(retry)
        .build()
        .unwrap();
    let m = client.mutex(&unique_name("frozen")).unwrap();
    assert!(!m.is_locked().unwrap());
    let addr = format!("127.0.0.1:{}", server.port());
    server.pause();
    let t = Instant::now();
    let got = m.lock().map(drop);
    let took = t.elapsed();
    server.resume();
    let e = got.unwrap_err();
    let text = e.to_string();
    println!("lock() on a frozen server, after {took:?}: {text}");
    assert!(took < bound, "lock() took {took:?}: {text}");
    assert!(e.is_timeout(), "{e:?}");
    assert!(text.contains(&addr), "{text}");
    assert!(
        text.contains("tried") && text.contains("times over"),
        "{text}"
    );
}

/// `force_unlock` logs one `warn` under the lock type's module, naming the label and thread
/// of each holder it removed.
#[test]
fn force_unlock_names_the_holders_it_removed() {
    let _one = serial();
    let (_server, url) = common::server_url();
    let app = Client::builder(&url).label("app-7").build().unwrap();
    let operator = Client::open(&url).unwrap();
    let name = unique_name("msg-force");
    let from = capture::lines().len();
    {
        let (f, r, s) = (
            app.fair_mutex(&name).unwrap(),
            app.rw_lock(&name).unwrap(),
            app.semaphore(&name, 2).unwrap(),
        );
        thread::Builder::new()
            .name("holding-thread".into())
            .spawn(move || {
                let held = (f.lock().unwrap(), r.read().unwrap(), s.acquire().unwrap());
                // Dropped after the force: the releases fail quietly (at debug).
                std::mem::forget(held);
            })
            .unwrap()
            .join()
            .unwrap();
    }
    assert!(operator.fair_mutex(&name).unwrap().force_unlock().unwrap());
    assert!(operator.rw_lock(&name).unwrap().force_unlock().unwrap());
    assert!(
        operator
            .semaphore(&name, 1)
            .unwrap()
            .force_unlock()
            .unwrap()
    );
    let warns: Vec<Line> = since(from)
        .into_iter()
        .filter(|l| l.level == log::Level::Warn && l.text.starts_with("force_unlock"))
        .collect();
    for l in &warns {
        println!("{l}");
    }
    let targets: Vec<&str> = warns.iter().map(|l| l.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "locksmith::locks::fair_mutex",
            "locksmith::locks::rwlock",
            "locksmith::locks::semaphore"
        ]
    );
    for l in &warns {
        assert!(l.text.contains(&name), "{l}");
        assert!(l.text.contains("app-7 (thread holding-thread)"), "{l}");
    }
}

/// The lines at `level` since `from` whose text contains `what`.
fn lines_with(from: usize, level: log::Level, what: &str) -> Vec<Line> {
    since(from)
        .into_iter()
        .filter(|l| l.level == level && l.text.contains(what))
        .collect()
}

/// The one line at `level` since `from` whose text contains `what`; its target must be
/// `target`.
fn the_one(from: usize, level: log::Level, what: &str, target: &str) -> Line {
    let found = lines_with(from, level, what);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].target, target, "{}", found[0]);
    found[0].clone()
}

/// A guard dropped while Redis is stalled: its release fails within the bound, and says so
/// in one `warn` (target `locksmith::locks::lease`) naming the lock.
#[test]
fn a_release_on_drop_that_fails_is_one_warn() {
    let _one = serial();
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .connect_timeout(CONNECT)
        .command_timeout(COMMAND)
        .build()
        .unwrap();
    let name = unique_name("msg-drop");
    let m = client.mutex(&name).unwrap();
    let g = m.lock().unwrap();
    let from = capture::lines().len();
    server.pause();
    drop(g);
    server.resume();
    let warn = the_one(
        from,
        log::Level::Warn,
        "on drop failed",
        "locksmith::locks::lease",
    );
    let expected = format!("releasing lock `{name}` on drop failed: ");
    assert!(warn.text.starts_with(&expected), "{warn}");
}

/// A holder past its maximum hold time: one `info` (target `locksmith::renewal`) says that
/// renewal stopped.
#[test]
fn the_maximum_hold_time_is_one_info() {
    let _one = serial();
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .lease(Duration::from_millis(600))
        .build()
        .unwrap();
    let name = unique_name("msg-max-hold");
    let m = client
        .mutex(&name)
        .unwrap()
        .with_max_hold(Duration::from_millis(600))
        .unwrap();
    let from = capture::lines().len();
    let g = m.lock().unwrap();
    let said = "reached its maximum hold time; renewal stopped";
    assert!(
        wait_until(Duration::from_secs(5), || !lines_with(
            from,
            log::Level::Info,
            said
        )
        .is_empty()),
        "{:#?}",
        since(from)
    );
    drop(g);
    let info = the_one(from, log::Level::Info, said, "locksmith::renewal");
    assert_eq!(info.text, format!("lock `{name}` {said}"));
}

/// A user without `SUBSCRIBE`: the refusal is one `warn` (target `locksmith::subscriber`)
/// naming the channel, and the waiter still gets the lock by re-checking.
#[test]
fn a_refused_subscribe_is_one_warn() {
    let _one = serial();
    let server = RedisServer::start();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nosub")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-subscribe")
        .exec(&mut server.conn())
        .unwrap();
    let url = format!("redis://nosub:pw@127.0.0.1:{}/", server.port());
    let holder = Client::open(server.url()).unwrap();
    let waiter = Client::open(&url).unwrap();
    let name = unique_name("msg-nosub");
    let g = holder.mutex(&name).unwrap().lock().unwrap();
    let from = capture::lines().len();
    let m = waiter.mutex(&name).unwrap();
    let w = thread::spawn(move || m.try_lock_for(Duration::from_secs(10)).unwrap().is_some());
    let said = "refused: ";
    assert!(
        wait_until(Duration::from_secs(5), || !lines_with(
            from,
            log::Level::Warn,
            said
        )
        .is_empty()),
        "{:#?}",
        since(from)
    );
    g.unlock().unwrap();
    assert!(w.join().unwrap());
    let warn = the_one(from, log::Level::Warn, said, "locksmith::subscriber");
    let text = &warn.text;
    assert!(
        text.starts_with("SUBSCRIBE ") && text.ends_with("its waiters re-check"),
        "{warn}"
    );
}

/// No line, at any level, shows an owner id (the client's random id, which a release or a
/// renewal is checked against): a lock held, renewed, forced out, lost and dropped logs
/// the label and the thread of its holder, never the id.
#[test]
fn no_line_shows_an_owner_id() {
    let _one = serial();
    let server = RedisServer::start();
    let client = Client::builder(server.url())
        .lease(Duration::from_millis(600))
        .label("app-9")
        .build()
        .unwrap();
    let operator = Client::open(server.url()).unwrap();
    let name = unique_name("msg-owner");
    let from = capture::lines().len();
    let m = client.mutex(&name).unwrap();
    let g = m.lock().unwrap();
    let owner = common::lock_value(&mut server.conn(), &name).unwrap().owner;
    // The client's random id: the part of the owner id that is a UUID.
    let id: String = owner
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .find(|p| p.len() == 36 && p.matches('-').count() == 4)
        .unwrap_or_else(|| panic!("no UUID in the owner id {owner}"))
        .to_owned();
    assert!(operator.mutex(&name).unwrap().force_unlock().unwrap());
    assert!(wait_until(Duration::from_secs(5), || !g.is_held()));
    assert!(g.unlock().is_err());
    let lines = since(from);
    assert!(
        lines.iter().any(|l| l.text.contains("freed by force")),
        "{lines:#?}"
    );
    let shown: Vec<&Line> = lines.iter().filter(|l| l.text.contains(&id)).collect();
    assert!(shown.is_empty(), "the owner id {id} in {shown:#?}");
}
