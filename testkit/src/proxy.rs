//! A small TCP proxy between a client and Redis, for faults on the wire.
//!
//! Threads and `std::net` only. Every accepted connection gets its own upstream connection
//! and two pump threads (client to server, server to client). What the proxy does is set at
//! run time:
//!
//! - [`Proxy::cut_reply_to`]: the next client command containing all the given byte strings
//!   is forwarded to Redis, and when Redis's reply arrives the proxy drops both sockets instead
//!   of forwarding it: the command ran, its reply is lost.
//! - [`Proxy::delay_reply_to`]: the same match, but the reply is held back for a while.
//! - [`Proxy::black_hole`]: from now on nothing is forwarded either way, and new connections
//!   are accepted and never answered.
//! - [`Proxy::kill_all`]: closes every open connection now.
//!
//! [`Proxy::stop`] (or `Drop`) closes the listener and every connection and joins every
//! thread, so a test that counts threads can stop the proxy first.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How often blocked pump reads wake up to look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// What happens to the reply of a matched command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Drop both sockets instead of forwarding the reply.
    Cut,
    /// Forward the reply after this long.
    Delay(Duration),
}

/// A one-shot (or n-shot) rule: commands containing every pattern (and one of `any`, when
/// given) get `action`.
#[derive(Debug)]
struct Rule {
    patterns: Vec<Vec<u8>>,
    any: Vec<Vec<u8>>,
    action: Action,
    remaining: usize,
}

impl Rule {
    fn matches(&self, chunk: &[u8]) -> bool {
        self.remaining > 0
            && self.patterns.iter().all(|p| contains(chunk, p))
            && (self.any.is_empty() || self.any.iter().any(|p| contains(chunk, p)))
    }
}

/// What a script call contains, whichever way the client sends it: `EVALSHA`, or `FCALL` of
/// the function library.
pub const SCRIPT_CALLS: [&[u8]; 2] = [b"EVALSHA", b"FCALL"];

#[derive(Debug)]
struct Conn {
    client: TcpStream,
    server: Option<TcpStream>,
    /// The action armed for the next reply on this connection.
    armed: Mutex<Option<Action>>,
}

impl Conn {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(s) = &self.server {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    black_hole: AtomicBool,
    rules: Mutex<Vec<Rule>>,
    conns: Mutex<Vec<Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Replies cut and replies delayed so far.
    cuts: AtomicUsize,
    delays: AtomicUsize,
    accepted: AtomicUsize,
}

/// A TCP proxy on a free port of 127.0.0.1 in front of `upstream`.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        let upstream: SocketAddr = ([127, 0, 0, 1], upstream_port).into();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared::default());
        let sh = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(&listener, upstream, &sh))
            .unwrap();
        Proxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The next `times` commands containing every one of `patterns` reach Redis, but their
    /// replies are cut: the connection is closed instead.
    pub fn cut_reply_to(&self, patterns: &[&[u8]], times: usize) {
        self.add_rule(patterns, &[], Action::Cut, times);
    }

    /// The next `times` script calls (`EVALSHA` or `FCALL`) reach Redis, but their replies are
    /// cut: the connection is closed instead.
    pub fn cut_script_replies(&self, times: usize) {
        self.add_rule(&[], &SCRIPT_CALLS, Action::Cut, times);
    }

    /// The replies to the next `times` script calls (`EVALSHA` or `FCALL`) are held back for
    /// `delay`.
    pub fn delay_script_replies(&self, delay: Duration, times: usize) {
        self.add_rule(&[], &SCRIPT_CALLS, Action::Delay(delay), times);
    }

    /// The replies to the next `times` commands containing every one of `patterns` are held
    /// back for `delay`.
    pub fn delay_reply_to(&self, patterns: &[&[u8]], delay: Duration, times: usize) {
        self.add_rule(patterns, &[], Action::Delay(delay), times);
    }

    fn add_rule(&self, patterns: &[&[u8]], any: &[&[u8]], action: Action, times: usize) {
        self.shared.rules.lock().unwrap().push(Rule {
            patterns: patterns.iter().map(|p| p.to_vec()).collect(),
            any: any.iter().map(|p| p.to_vec()).collect(),
            action,
            remaining: times,
        });
    }

    /// Rules that have not fired yet.
    pub fn pending_rules(&self) -> usize {
        self.shared
            .rules
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.remaining)
            .sum()
    }

    /// Replies cut so far.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// Replies delayed so far.
    pub fn delays(&self) -> usize {
        self.shared.delays.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// From now on forwards nothing, and accepts new connections without ever answering.
    pub fn black_hole(&self) {
        self.shared.black_hole.store(true, Ordering::SeqCst);
    }

    /// Forwards again (for new and open connections).
    pub fn pass(&self) {
        self.shared.black_hole.store(false, Ordering::SeqCst);
    }

    /// Closes every open connection now.
    pub fn kill_all(&self) {
        for c in self.shared.conns.lock().unwrap().drain(..) {
            c.close();
        }
    }

    /// Closes the listener and every connection, and joins every thread of the proxy.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        self.kill_all();
        loop {
            let threads: Vec<_> = self.shared.threads.lock().unwrap().drain(..).collect();
            if threads.is_empty() {
                break;
            }
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, sh: &Arc<Shared>) {
    while !sh.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                sh.accepted.fetch_add(1, Ordering::SeqCst);
                client.set_nonblocking(false).unwrap();
                let _ = client.set_nodelay(true);
                let server = if sh.black_hole.load(Ordering::SeqCst) {
                    None
                } else {
                    match TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            Some(s)
                        }
                        Err(_) => {
                            // Upstream down: refuse by closing at once.
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        }
                    }
                };
                let conn = Arc::new(Conn {
                    client,
                    server,
                    armed: Mutex::new(None),
                });
                sh.conns.lock().unwrap().push(Arc::clone(&conn));
                let mut threads = sh.threads.lock().unwrap();
                let (c, s) = (Arc::clone(&conn), Arc::clone(sh));
                threads.push(
                    thread::Builder::new()
                        .name("proxy-c2s".into())
                        .spawn(move || client_to_server(&c, &s))
                        .unwrap(),
                );
                if conn.server.is_some() {
                    let (c, s) = (Arc::clone(&conn), Arc::clone(sh));
                    threads.push(
                        thread::Builder::new()
                            .name("proxy-s2c".into())
                            .spawn(move || server_to_client(&c, &s))
                            .unwrap(),
                    );
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Reads into `buf`; `None` at EOF, on an error, or when the proxy stops.
fn read_chunk(mut s: &TcpStream, buf: &mut [u8], sh: &Shared) -> Option<usize> {
    s.set_read_timeout(Some(POLL)).ok()?;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return None;
        }
        match s.read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return None,
        }
    }
}

fn client_to_server(conn: &Conn, sh: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Some(n) = read_chunk(&conn.client, &mut buf, sh) {
        if sh.black_hole.load(Ordering::SeqCst) {
            continue;
        }
        let chunk = &buf[..n];
        {
            let mut rules = sh.rules.lock().unwrap();
            if let Some(rule) = rules.iter_mut().find(|r| r.matches(chunk)) {
                rule.remaining -= 1;
                // Armed before forwarding, so the reply cannot overtake the arming.
                *conn.armed.lock().unwrap() = Some(rule.action);
            }
        }
        let Some(mut server) = conn.server.as_ref() else {
            continue;
        };
        if server.write_all(chunk).is_err() {
            break;
        }
    }
    conn.close();
}

fn server_to_client(conn: &Conn, sh: &Shared) {
    let server = conn.server.as_ref().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while let Some(n) = read_chunk(server, &mut buf, sh) {
        if sh.black_hole.load(Ordering::SeqCst) {
            continue;
        }
        let armed = conn.armed.lock().unwrap().take();
        match armed {
            Some(Action::Cut) => {
                sh.cuts.fetch_add(1, Ordering::SeqCst);
                break;
            }
            Some(Action::Delay(d)) => {
                sh.delays.fetch_add(1, Ordering::SeqCst);
                thread::sleep(d);
            }
            None => {}
        }
        if (&conn.client).write_all(&buf[..n]).is_err() {
            break;
        }
    }
    conn.close();
}
