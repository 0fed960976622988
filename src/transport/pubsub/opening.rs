//! Opening a pub/sub connection without blocking, as steps of a poll loop: the TCP connect
//! (or Unix socket), the TLS handshake of a `rediss://` address and the `AUTH` /
//! `CLIENT SETNAME` handshake, each advanced only as far as the socket allows, under one
//! deadline (the connect timeout).
//!
//! The client's one pub/sub thread serves every server it listens on (one, or one per
//! cluster master). Were it to open a connection blocking, a frozen node (one that accepts
//! connections and never answers) would hold it for a connect timeout per try, and no
//! subscription on a healthy master would be written or confirmed meanwhile. So the thread
//! registers the socket of an [`Opening`] with its poller and calls [`Opening::advance`] when
//! the socket is ready; a node that does not finish within the connect timeout costs nothing
//! but its own channels. Where blocking is what is wanted (the first connection, opened by
//! `build()`, and the TLS probe), [`Opening::finish`] drives the same steps on a poller of
//! its own.
//!
//! # What is our own, and why
//!
//! The `redis` crate connects and runs its handshake blocking (with a timeout), and its
//! asynchronous connections need an async runtime, which this crate does not run. So the
//! steps are ours, over the pieces that work on whatever bytes are there: a non-blocking
//! `socket2` connect, rustls's sans-IO client session, the commands encoded by the `redis`
//! crate, and its [`redis::Parser`], which keeps a partly read reply and resumes it when more
//! bytes arrive. Name resolution (for a node announced by host name) is the system's, and
//! blocking; nodes are usually announced by IP address, which resolves without I/O. A Unix
//! socket connects at once (a local connect does not wait for a peer) and then joins the
//! steps at the handshake.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use polling::{Event, Poller};
use redis::io::tcp::socket2::{Domain, Protocol, SockRef, Socket, Type};
use redis::{ConnectionAddr, ConnectionInfo, Value};

use super::{HEARTBEAT, ReadHalf, Stream, encode, handshake_read_error};
use crate::error::{Error, RedisFailure, Result};
use crate::transport::conn::{MAX_SOCKET_TIMEOUT, Timeouts};
use crate::transport::dns;
use crate::transport::link::{self, keepalive};
use crate::transport::tls::{self, Tls, TlsStream, Want};

/// Where an opening connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The TCP connect is in progress.
    Connecting,
    /// The TLS handshake of a `rediss://` address is in progress (none for others).
    Tls,
    /// The `AUTH` / `CLIENT SETNAME` handshake: writing it, then reading its replies.
    Hello,
}

/// What [`Opening::advance`] came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// Call again once the socket is ready so (its descriptor may have changed: a connect to
    /// the host's next address).
    Wait(Want),
    /// The handshake is done: [`Opening::into_open`] gives the connection.
    Ready,
}

/// A pub/sub connection being opened on a non-blocking socket.
pub(crate) struct Opening {
    info: ConnectionInfo,
    host: String,
    /// The host's addresses not tried yet (the next one last).
    addrs: Vec<SocketAddr>,
    /// A TCP or Unix socket (TLS wraps it once open).
    sock: Stream,
    /// The TLS session of a `rediss://` address.
    tls: Option<tls::Session>,
    phase: Phase,
    /// The handshake's commands, and how much of them is written (plain TCP; over TLS they
    /// go to the session at once).
    hello: Vec<u8>,
    written: usize,
    /// Replies still to read; whether the first of them answers `AUTH`.
    replies: usize,
    auth: bool,
    parser: redis::Parser,
    deadline: Instant,
    timeouts: Timeouts,
}

/// Starts a non-blocking TCP connect to `addr`, with `TCP_NODELAY` and keepalive.
fn connect_nonblocking(addr: SocketAddr) -> io::Result<Stream> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    match s.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || in_progress(&e) => {}
        Err(e) => return Err(e),
    }
    let tcp = TcpStream::from(s);
    tcp.set_nodelay(true)?;
    SockRef::from(&tcp).set_tcp_keepalive(&keepalive())?;
    Ok(Stream::Tcp(tcp))
}

/// `EINPROGRESS`: a non-blocking connect has started (`io::ErrorKind::InProgress` is not
/// stable yet).
fn in_progress(e: &io::Error) -> bool {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    const EINPROGRESS: i32 = 115;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const EINPROGRESS: i32 = 36;
    e.raw_os_error() == Some(EINPROGRESS)
}

/// The TCP socket under a TLS session (TLS is only ever set up over TCP).
fn tcp_of(sock: &Stream) -> io::Result<&TcpStream> {
    match sock {
        Stream::Tcp(t) => Ok(t),
        _ => Err(io::ErrorKind::Unsupported.into()),
    }
}

impl Opening {
    /// Starts opening a pub/sub connection to `info`, to be done within the connect timeout.
    /// No blocking I/O but the name resolution of a host name. Without `hello`, the opening
    /// stops after the TLS handshake (a probe).
    pub(crate) fn start(
        info: &ConnectionInfo,
        timeouts: Timeouts,
        tls: Option<&Tls>,
        hello: bool,
    ) -> Result<Opening> {
        // The name resolution counts towards the connect timeout too.
        let deadline = Instant::now()
            .checked_add(timeouts.connect.min(MAX_SOCKET_TIMEOUT))
            .unwrap_or_else(Instant::now);
        let config = link::client_for(info.clone(), tls)?.tls;
        let (host, addrs, sock, session) = match info.addr() {
            ConnectionAddr::Unix(path) => {
                let s = UnixStream::connect(path).map_err(Error::io)?;
                s.set_nonblocking(true).map_err(Error::io)?;
                let path = path.display().to_string();
                (path, Vec::new(), Stream::Unix(s), None)
            }
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                // A host name is looked up within the connect timeout (an IP address needs
                // none); it has at least one address.
                let mut addrs = dns::lookup(host, *port, Some(timeouts.connect))?;
                addrs.reverse();
                let first = addrs.pop().ok_or(io::ErrorKind::NotFound);
                let sock = first.map_err(io::Error::from).and_then(connect_nonblocking);
                let session = config.map(|c| tls::session(host, c)).transpose()?;
                (host.to_owned(), addrs, sock.map_err(Error::io)?, session)
            }
            _ => return Err(link::unsupported()),
        };
        let auth = link::auth(info.redis_settings()).filter(|_| hello);
        let mut commands = (auth.as_ref())
            .map(redis::Cmd::get_packed_command)
            .unwrap_or_default();
        if hello {
            // Names the connection for operators (`CLIENT LIST`); old servers may refuse,
            // which is fine.
            commands.extend_from_slice(&encode(&[b"CLIENT", b"SETNAME", b"locksmith-pubsub"]));
        }
        Ok(Opening {
            info: info.clone(),
            host,
            addrs,
            phase: match sock {
                Stream::Unix(_) => Phase::Hello,
                _ => Phase::Connecting,
            },
            sock,
            tls: session,
            hello: commands,
            written: 0,
            replies: usize::from(hello) + usize::from(auth.is_some()),
            auth: auth.is_some(),
            parser: redis::Parser::new(),
            deadline,
            timeouts,
        })
    }

    /// The socket to poll.
    pub(crate) fn sock(&self) -> &Stream {
        &self.sock
    }

    /// When the connection must be open (the connect timeout from the start).
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The error of a connection not open by its deadline.
    pub(crate) fn timed_out(&self) -> Error {
        Error::timeout("the pub/sub connection was not open within the connect timeout")
    }

    /// Advances as far as the socket allows, without blocking.
    pub(crate) fn advance(&mut self) -> Result<Step> {
        loop {
            match self.phase {
                Phase::Connecting => {
                    let tcp = tcp_of(&self.sock).map_err(Error::io)?;
                    let failed = match tcp.take_error() {
                        Ok(Some(e)) | Err(e) => Some(e),
                        Ok(None) => match tcp.peer_addr() {
                            Ok(_) => None,
                            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                                return Ok(Step::Wait(Want::Write));
                            }
                            Err(e) => Some(e),
                        },
                    };
                    if let Some(e) = failed {
                        // Refused (or unreachable): the host's next address, if any.
                        let Some(next) = self.addrs.pop() else {
                            return Err(Error::io(e));
                        };
                        self.sock = connect_nonblocking(next).map_err(Error::io)?;
                        return Ok(Step::Wait(Want::Write));
                    }
                    self.phase = Phase::Tls;
                }
                Phase::Tls => {
                    // A plain address has no session: on to the commands.
                    let Some(conn) = self.tls.as_mut() else {
                        self.phase = Phase::Hello;
                        continue;
                    };
                    let tcp = tcp_of(&self.sock).map_err(Error::io)?;
                    // Once done, the handshake's commands go to the session whole.
                    match tls::handshake_step(conn, tcp, &self.hello) {
                        Ok(Some(want)) => return Ok(Step::Wait(want)),
                        Ok(None) => self.phase = Phase::Hello,
                        Err(e) => return Err(tls::handshake_error(&e, &self.host)),
                    }
                }
                Phase::Hello => return self.hello_step(),
            }
        }
    }

    /// Writes the handshake's commands and reads their replies, as far as the socket allows.
    fn hello_step(&mut self) -> Result<Step> {
        match self.tls.as_mut() {
            Some(conn) => {
                let tcp = tcp_of(&self.sock).map_err(Error::io)?;
                if !tls::flush_step(conn, tcp).map_err(Error::io)? {
                    return Ok(Step::Wait(Want::Write));
                }
            }
            None => {
                while self.written < self.hello.len() {
                    match self.sock.write(&self.hello[self.written..]) {
                        Ok(0) => return Err(Error::io(io::ErrorKind::WriteZero.into())),
                        Ok(n) => self.written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(Step::Wait(Want::Write));
                        }
                        Err(e) => return Err(Error::io(e)),
                    }
                }
            }
        }
        while self.replies > 0 {
            let parsed = match self.tls.as_mut() {
                Some(conn) => {
                    let sock = tcp_of(&self.sock).map_err(Error::io)?;
                    self.parser.parse_value(tls::plain(conn, sock))
                }
                None => self.parser.parse_value(&mut self.sock),
            };
            match parsed {
                Ok(Value::ServerError(e)) if self.auth => {
                    return Err(Error::Redis(RedisFailure(redis::RedisError::from((
                        redis::ErrorKind::AuthenticationFailed,
                        "pub/sub authentication failed",
                        e.to_string(),
                    )))));
                }
                Ok(_) => {
                    self.auth = false;
                    self.replies -= 1;
                }
                // Nothing more has arrived: the parser keeps what it has.
                Err(e) if e.is_timeout() => return Ok(Step::Wait(Want::Read)),
                Err(e) => return Err(handshake_read_error(e, &self.info)),
            }
        }
        Ok(Step::Ready)
    }

    /// The open connection (after [`Step::Ready`]): its read half, on the same socket as
    /// polled, and a write half, made blocking again: reads wake up every [`HEARTBEAT`],
    /// writes wait at most the command timeout.
    pub(crate) fn into_open(self) -> Result<(ReadHalf, Stream)> {
        (self.sock.socket().set_nonblocking(false)).map_err(Error::io)?;
        let stream = match (self.sock, self.tls) {
            (Stream::Tcp(tcp), Some(conn)) => Stream::Tls(TlsStream::over(tcp, conn)),
            (sock, _) => sock,
        };
        let writer = stream.try_clone().map_err(Error::io)?;
        stream.set_timeouts(Some(HEARTBEAT)).map_err(Error::io)?;
        (writer.socket())
            .set_write_timeout(Some(self.timeouts.command.min(MAX_SOCKET_TIMEOUT)))
            .map_err(Error::io)?;
        Ok((
            ReadHalf {
                stream,
                parser: self.parser,
            },
            writer,
        ))
    }

    /// Drives the opening to its end on a poller of its own, blocking (within the connect
    /// timeout, as every step is bounded by the deadline). Also returns the longest single
    /// step (none ever blocks: tests check it).
    pub(crate) fn finish(mut self) -> (Result<(ReadHalf, Stream)>, Duration) {
        let mut longest = Duration::ZERO;
        let poller = match Poller::new() {
            Ok(p) => p,
            Err(e) => return (Err(Error::io(e)), longest),
        };
        let mut interest = Event::writable(0);
        let mut events = Vec::new();
        let done = loop {
            let now = Instant::now();
            if now >= self.deadline {
                break Err(self.timed_out());
            }
            events.clear();
            let waited = watch(&poller, &self.sock, interest)
                .and_then(|()| poller.wait(&mut events, Some(self.deadline - now)));
            if let Err(e) = waited {
                break Err(Error::io(e));
            }
            if events.is_empty() {
                continue;
            }
            let t = Instant::now();
            let step = self.advance();
            longest = longest.max(t.elapsed());
            match step {
                Ok(Step::Wait(want)) => interest = want_event(want, 0),
                Ok(Step::Ready) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let _ = poller.delete(&self.sock);
        (done.and_then(|()| self.into_open()), longest)
    }
}

/// Has `poller` report `interest` on `sock`, whether it watches it already or not yet.
pub(crate) fn watch(poller: &Poller, sock: &Stream, interest: Event) -> io::Result<()> {
    poller
        .modify(sock, interest)
        .or_else(|_| poller.add(sock, interest))
}

/// The poller interest for what a step waits for, under `key`.
pub(crate) fn want_event(want: Want, key: usize) -> Event {
    match want {
        Want::Read => Event::readable(key),
        Want::Write => Event::writable(key),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::net::TcpListener;

    use locksmith_testkit::RedisServer;

    use super::*;
    use crate::transport::conn::parse_url;

    fn timeouts(connect: Duration) -> Timeouts {
        Timeouts {
            connect,
            command: Duration::from_secs(2),
        }
    }

    /// An opening of `url` with this connect timeout.
    fn start(url: &str, connect: Duration, tls: Option<&Tls>) -> Opening {
        Opening::start(&parse_url(url).unwrap(), timeouts(connect), tls, true).unwrap()
    }

    /// Drives `op` to an open connection, no step blocking, and checks that it works.
    fn opens(op: Opening) {
        let (opened, longest) = op.finish();
        let (mut reader, writer) = opened.unwrap();
        assert!(
            longest < Duration::from_millis(100),
            "a step took {longest:?}"
        );
        subscribes(&mut reader, writer);
    }

    /// The open connection works: a `SUBSCRIBE` on the write half is confirmed on the read
    /// half.
    fn subscribes(reader: &mut ReadHalf, mut writer: Stream) {
        writer
            .write_all(&encode(&[b"SUBSCRIBE", b"opening-test"]))
            .unwrap();
        let Value::Array(items) = reader.parser.parse_value(&mut reader.stream).unwrap() else {
            panic!("not a confirmation")
        };
        assert_eq!(
            items.first(),
            Some(&Value::BulkString(b"subscribe".to_vec()))
        );
    }

    /// The keepalive values the docs state (first probe after 15 s idle, then every 5 s, 3
    /// probes), read back from a socket opened as every connection is; also by a host name.
    #[test]
    fn connections_have_the_stated_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        for host in ["127.0.0.1", "localhost"] {
            let op = start(
                &format!("redis://{host}:{port}/"),
                Duration::from_secs(2),
                None,
            );
            let sock = SockRef::from(tcp_of(op.sock()).unwrap());
            assert!(sock.keepalive().unwrap());
            assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(15));
            assert_eq!(
                sock.tcp_keepalive_interval().unwrap(),
                Duration::from_secs(5)
            );
            assert_eq!(sock.tcp_keepalive_retries().unwrap(), 3);
        }
    }

    #[test]
    fn opens_over_plain_tcp_with_a_password() {
        let server = RedisServer::start();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("pw-open")
            .query(&mut server.conn())
            .unwrap();
        let url = format!("redis://:pw-open@127.0.0.1:{}/", server.port());
        opens(start(&url, Duration::from_secs(5), None));
        // A wrong password is refused as such.
        let url = format!("redis://:wrong@127.0.0.1:{}/", server.port());
        let Err(e) = start(&url, Duration::from_secs(5), None).finish().0 else {
            panic!("a wrong password was taken")
        };
        assert!(e.to_string().contains("authentication"), "{e}");
    }

    #[test]
    #[cfg(feature = "tls")]
    fn opens_over_tls_without_blocking() {
        use crate::transport::tls::TlsCerts;
        use locksmith_testkit::{ServerCert, TlsFiles};

        if locksmith_testkit::skip_without_tls("opens_over_tls_without_blocking") {
            return;
        }
        let files = TlsFiles::generate();
        let server = RedisServer::start_tls(&files, ServerCert::Good, false);
        let certs = TlsCerts {
            root: Some(files.ca_pem()),
            client: None,
        };
        let tls = Tls::new(certs, true, false).unwrap();
        opens(start(&server.tls_url(), Duration::from_secs(5), Some(&tls)));
        // A plain-text port does not pass for TLS.
        let plain = format!("rediss://127.0.0.1:{}/", server.port());
        assert!(
            start(&plain, Duration::from_secs(5), Some(&tls))
                .finish()
                .0
                .is_err()
        );
    }

    #[test]
    fn a_black_hole_costs_its_deadline_and_never_blocks_a_step() {
        // A listening socket that never accepts: the kernel completes the connect, nothing
        // ever answers (a frozen server).
        let hole = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://127.0.0.1:{}/", hole.local_addr().unwrap().port());
        let t = Instant::now();
        let (opened, longest) = start(&url, Duration::from_millis(300), None).finish();
        assert!(
            matches!(opened, Err(Error::Timeout { .. })),
            "{:?}",
            opened.err()
        );
        assert!(
            longest < Duration::from_millis(100),
            "a step took {longest:?}"
        );
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(1),
            "{took:?}"
        );
        // A closed port: refused at once.
        drop(hole);
        let op = start(&url, Duration::from_secs(5), None);
        let t = Instant::now();
        assert!(op.finish().0.is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    /// A Unix socket opens through the same steps (it joins them at the handshake).
    #[test]
    fn opens_over_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("locksmith-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("redis.sock");
        let mut child = std::process::Command::new(locksmith_testkit::server_program())
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(locksmith_testkit::wait_until(
            Duration::from_secs(10),
            || path.exists()
        ));
        let url = format!("redis+unix://{}", path.display());
        opens(start(&url, Duration::from_secs(5), None));
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
