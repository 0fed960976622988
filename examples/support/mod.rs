//! What the examples share: finding a Redis to run against, or starting a throwaway one.
//!
//! [`redis`] looks, in this order, for
//!
//! 1. the URL in `REDIS_URL`, if set;
//! 2. a Redis that answers `PING` on 127.0.0.1:6379;
//! 3. a `redis-server` on `PATH` (or the binary `LOCKSMITH_TEST_SERVER` names), which it starts
//!    with [`locksmith::testing::Server`] on a free port without persistence and stops when the
//!    returned [`Redis`] is dropped (also when the example returns an error).
//!
//! When none of them works, it prints how to install `redis-server` and exits with status 1.
//!
//! The examples keep their own data under keys that start with `locksmith-example:` and delete
//! them when they finish. Their lock names start with `example:`; each lock taken leaves one
//! small key behind for a while: a `Mutex` (or `MultiMutex`) its release marker
//! `locksmith:{example:...}:released`, which lives as long as the lease had left when it was
//! released. Every grant also raises the fencing mark of its name's hash slot,
//! `locksmith:{#N}:fence` (one small key per slot used, at most 16,384, kept so that tokens
//! keep rising). [`Redis::tell_what_is_left`] prints the markers at the end of each example; on
//! a throwaway server nothing is left at all.

use std::error::Error;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use locksmith::testing::Server;

/// The examples' result type. The error is `Send + Sync`, so worker threads can return it too.
pub type Result<T, E = Box<dyn Error + Send + Sync>> = std::result::Result<T, E>;

/// A Redis to run an example against. A server started by [`redis`] is stopped on drop.
#[derive(Debug)]
pub struct Redis {
    url: String,
    server: Option<Server>,
}

impl Redis {
    /// The URL to give [`locksmith::Client::open`].
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A plain redis-rs connection for the example's own data (balances, stock counts),
    /// with 5 s timeouts.
    #[allow(dead_code, reason = "not every example stores data of its own")]
    pub fn connection(&self) -> Result<redis::Connection> {
        let timeout = Duration::from_secs(5);
        let conn = redis::Client::open(self.url.as_str())?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }
}

impl Redis {
    /// Prints what the example leaves on the server: the release marker of each of `locks` that
    /// exists, with the time until it expires (and says that the slots' fencing marks stay).
    /// Nothing on a throwaway server, which is stopped when the example ends.
    pub fn tell_what_is_left(&self, locks: &[&str]) -> Result<()> {
        if self.server.is_some() {
            println!("left behind: nothing (the throwaway server is stopped)");
            return Ok(());
        }
        let mut conn = self.connection()?;
        let mut left = Vec::new();
        for name in locks {
            // The default key prefix and hash tag; the example names have no `%`, `{` or `}`.
            let key = format!("locksmith:{{{name}}}:released");
            let ttl_ms: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn)?;
            if ttl_ms >= 0 {
                left.push(format!("{key} (expires in {:.1} s)", ttl_ms as f64 / 1e3));
            }
        }
        println!(
            "left behind on {}: the fencing marks `locksmith:{{#N}}:fence` of the hash slots \
             used (one small key per slot, kept so that tokens keep rising)",
            redact(&self.url)
        );
        if !left.is_empty() {
            println!(
                "and the release marker of each lock taken, each expiring by itself (the \
                 example's own data is deleted):"
            );
            for key in left {
                println!("  {key}");
            }
        }
        Ok(())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // Dropping the server kills it and waits for it (it runs without persistence).
        if self.server.take().is_some() {
            println!("stopped the throwaway redis-server");
        }
    }
}

/// Runs `work(0)`, ..., `work(n - 1)` on `n` threads at once and waits for all of them.
/// Returns their results in order, or the first error.
#[allow(dead_code, reason = "not every example runs threads")]
pub fn on_threads<T: Send>(n: usize, work: impl Fn(usize) -> Result<T> + Sync) -> Result<Vec<T>> {
    let work = &work;
    thread::scope(|s| {
        let threads: Vec<_> = (0..n).map(|i| s.spawn(move || work(i))).collect();
        threads
            .into_iter()
            .map(|t| t.join().map_err(|_| "a thread panicked")?)
            .collect()
    })
}

/// Finds or starts a Redis (see the module docs). Exits the process with a message on how to
/// install `redis-server` when there is none.
pub fn redis() -> Redis {
    if let Some(url) = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()) {
        println!("using Redis at {} (from REDIS_URL)", redact(&url));
        return Redis { url, server: None };
    }
    if answers_ping(6379) {
        println!("using the Redis on 127.0.0.1:6379");
        return Redis {
            url: "redis://127.0.0.1:6379/".to_owned(),
            server: None,
        };
    }
    match start_server() {
        Ok(redis) => redis,
        Err(why) => {
            eprintln!(
                "error: no Redis to run this example against.\n\
                 REDIS_URL is not set, nothing answers on 127.0.0.1:6379, and no throwaway\n\
                 server could be started: {why}\n\
                 \n\
                 Install redis-server (the examples start and stop a throwaway one themselves):\n\
                 \x20   Debian/Ubuntu:  sudo apt-get install redis-server\n\
                 \x20   macOS:          brew install redis\n\
                 or point REDIS_URL at a Redis you can use, e.g. REDIS_URL=redis://127.0.0.1:6380/"
            );
            std::process::exit(1);
        }
    }
}

/// Starts a throwaway server with [`locksmith::testing::Server`] (`redis-server` from `PATH`,
/// or the binary `LOCKSMITH_TEST_SERVER` names) and waits until it answers.
fn start_server() -> std::result::Result<Redis, String> {
    let server = Server::start().map_err(|e| e.to_string())?;
    println!(
        "started a throwaway redis-server on 127.0.0.1:{}",
        server.port()
    );
    Ok(Redis {
        url: server.url(),
        server: Some(server),
    })
}

/// Whether a Redis on 127.0.0.1:`port` answers `PING` with `PONG` (one that wants a password
/// does not count).
fn answers_ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let timeout = Some(Duration::from_millis(500));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The URL without its password, fit to print.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}
