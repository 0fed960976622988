//! Opening a pub/sub connection without blocking, as steps of a poll loop: the TCP connect,
//! the TLS handshake of a `rediss://` address and the `AUTH` / `CLIENT SETNAME` handshake,
//! each advanced only as far as the socket allows, under one deadline (the connect timeout).
//!
//! A Cluster client's one pub/sub thread serves every master. Were it to open a connection
//! blocking (as [`open`](super::open) does for the one connection of the other topologies), a
//! frozen node (one that accepts connections and never answers) would hold it for a connect
//! timeout per try, and no subscription on a healthy master would be written or confirmed
//! meanwhile. So the thread registers the socket of an [`Opening`] with its poller and calls
//! [`Opening::advance`] when the socket is ready; a node that does not finish within the
//! connect timeout costs nothing but its own channels.
//!
//! # What is our own, and why
//!
//! The `redis` crate connects and runs its handshake blocking (with a timeout), and its
//! asynchronous connections need an async runtime, which this crate does not run. So the
//! steps are ours, over the pieces that work on whatever bytes are there: a non-blocking
//! `socket2` connect, rustls's sans-IO client session, the commands encoded by the `redis`
//! crate, and its [`redis::Parser`], which keeps a partly read reply and resumes it when more
//! bytes arrive. Name resolution (for a node announced by host name) is the system's, and
//! blocking; nodes are usually announced by IP address, which resolves without I/O.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use redis::io::tcp::socket2::{Domain, Protocol, SockRef, Socket, Type};
use redis::{ConnectionInfo, Value};
use rustls::ClientConnection;

use super::{HEARTBEAT, ReadHalf, Stream, TcpTarget, encode, handshake_read_error, tcp_target};
use crate::error::{Error, Result};
use crate::transport::conn::{MAX_SOCKET_TIMEOUT, Timeouts, keepalive};
use crate::transport::dns;
use crate::transport::tls::{self, PlainReader, Tls, TlsStream, Want};

/// Where an opening connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The TCP connect is in progress.
    Connecting,
    /// The TLS handshake is in progress.
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
    sock: TcpStream,
    /// The TLS session of a `rediss://` address, and its configuration (for a retry on the
    /// host's next address).
    tls: Option<(ClientConnection, std::sync::Arc<rustls::ClientConfig>)>,
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

impl std::fmt::Debug for Opening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opening")
            .field("host", &self.host)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

/// Starts a non-blocking TCP connect to `addr`, with `TCP_NODELAY` and keepalive.
fn connect_nonblocking(addr: SocketAddr) -> io::Result<TcpStream> {
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
    Ok(tcp)
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

impl Opening {
    /// Starts opening a pub/sub connection to `info` (a TCP or TLS address), to be done
    /// within the connect timeout. No blocking I/O but the name resolution of a host name.
    pub(crate) fn start(
        info: &ConnectionInfo,
        timeouts: Timeouts,
        tls: Option<&Tls>,
    ) -> Result<Opening> {
        let Some(TcpTarget { host, port, config }) = tcp_target(info.addr(), tls)? else {
            return Err(Error::InvalidUrl {
                reason: "a cluster node needs a TCP address".into(),
            });
        };
        // A host name is looked up within the connect timeout (an IP address needs none).
        let mut addrs: Vec<SocketAddr> = dns::lookup(host, port, Some(timeouts.connect))?;
        addrs.reverse();
        let Some(first) = addrs.pop() else {
            return Err(Error::InvalidUrl {
                reason: format!("the host `{host}` resolves to no address"),
            });
        };
        let sock = connect_nonblocking(first).map_err(Error::io)?;
        let tls = match config {
            Some(c) => Some((tls::session(host, std::sync::Arc::clone(&c))?, c)),
            None => None,
        };
        let mut hello = Vec::new();
        let settings = info.redis_settings();
        let auth = settings.password().is_some();
        if let Some(password) = settings.password() {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(user) = settings.username() {
                args.push(user.as_bytes());
            }
            args.push(password.as_bytes());
            hello.extend_from_slice(&encode(&args));
        }
        // Names the connection for operators (`CLIENT LIST`); old servers may refuse, which
        // is fine.
        hello.extend_from_slice(&encode(&[b"CLIENT", b"SETNAME", b"locksmith-pubsub"]));
        let deadline = Instant::now()
            .checked_add(timeouts.connect.min(MAX_SOCKET_TIMEOUT))
            .unwrap_or_else(Instant::now);
        Ok(Opening {
            info: info.clone(),
            host: host.to_owned(),
            addrs,
            sock,
            tls,
            phase: Phase::Connecting,
            hello,
            written: 0,
            replies: if auth { 2 } else { 1 },
            auth,
            parser: redis::Parser::new(),
            deadline,
            timeouts,
        })
    }

    /// The socket to poll.
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
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
                    let failed = match self.sock.take_error() {
                        Ok(Some(e)) | Err(e) => Some(e),
                        Ok(None) => match self.sock.peer_addr() {
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
                    self.phase = if self.tls.is_some() {
                        Phase::Tls
                    } else {
                        Phase::Hello
                    };
                }
                Phase::Tls => {
                    let Some((conn, _)) = self.tls.as_mut() else {
                        self.phase = Phase::Hello;
                        continue;
                    };
                    match tls::handshake_step(conn, &self.sock) {
                        Ok(Some(want)) => return Ok(Step::Wait(want)),
                        Ok(None) => {
                            // The handshake's commands go to the session whole; they are
                            // sent as the socket allows.
                            conn.writer()
                                .write_all(&self.hello)
                                .map_err(|e| tls::handshake_error(&e, &self.host))?;
                            self.written = self.hello.len();
                            self.phase = Phase::Hello;
                        }
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
            Some((conn, _)) => {
                if !tls::flush_step(conn, &self.sock).map_err(Error::io)? {
                    return Ok(Step::Wait(Want::Write));
                }
            }
            None => {
                while self.written < self.hello.len() {
                    match (&self.sock).write(&self.hello[self.written..]) {
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
                Some((conn, _)) => self.parser.parse_value(PlainReader {
                    conn,
                    sock: &self.sock,
                }),
                None => self.parser.parse_value(&self.sock),
            };
            match parsed {
                Ok(Value::ServerError(e)) if self.auth => {
                    return Err(Error::Redis(redis::RedisError::from((
                        redis::ErrorKind::AuthenticationFailed,
                        "pub/sub authentication failed",
                        e.to_string(),
                    ))));
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
    /// polled, and a write half, made blocking again with the timeouts of
    /// [`open`](super::open): reads wake up every heartbeat, writes wait at most the command
    /// timeout.
    pub(crate) fn into_open(self) -> Result<(ReadHalf, Stream)> {
        let sock = self.sock;
        sock.set_nonblocking(false).map_err(Error::io)?;
        let stream = match self.tls {
            Some((conn, _)) => Stream::Tls(TlsStream::established(sock, conn)),
            None => Stream::Tcp(sock),
        };
        let writer = stream.try_clone().map_err(Error::io)?;
        stream.set_timeouts(Some(HEARTBEAT)).map_err(Error::io)?;
        writer
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use locksmith_testkit::{RedisServer, ServerCert, TlsFiles};
    use polling::{Event, Poller};

    use super::*;
    use crate::transport::conn::parse_url;
    use crate::transport::tls::TlsCerts;

    fn timeouts(connect: Duration) -> Timeouts {
        Timeouts {
            connect,
            command: Duration::from_secs(2),
        }
    }

    /// Drives `op` as the pub/sub thread does: poll, advance, until open or its deadline.
    /// Also returns the longest single `advance` (it must never block).
    fn drive(mut op: Opening) -> (Result<(ReadHalf, Stream)>, Duration) {
        let poller = Poller::new().unwrap();
        poller.add(op.fd(), Event::writable(0)).unwrap();
        let mut events = Vec::new();
        let mut longest = Duration::ZERO;
        loop {
            let now = Instant::now();
            if now >= op.deadline() {
                let _ = poller.delete(op.fd());
                return (Err(op.timed_out()), longest);
            }
            events.clear();
            poller.wait(&mut events, Some(op.deadline() - now)).unwrap();
            if events.is_empty() {
                continue;
            }
            let t = Instant::now();
            let step = op.advance();
            longest = longest.max(t.elapsed());
            match step {
                Ok(Step::Wait(want)) => {
                    let ev = match want {
                        Want::Read => Event::readable(0),
                        Want::Write => Event::writable(0),
                    };
                    if poller.modify(op.fd(), ev).is_err() {
                        poller.add(op.fd(), ev).unwrap();
                    }
                }
                Ok(Step::Ready) => {
                    let _ = poller.delete(op.fd());
                    return (op.into_open(), longest);
                }
                Err(e) => return (Err(e), longest),
            }
        }
    }

    /// An opening of `url` with this connect timeout.
    fn start(url: &str, connect: Duration, tls: Option<&Tls>) -> Opening {
        Opening::start(&parse_url(url).unwrap(), timeouts(connect), tls).unwrap()
    }

    /// Drives `op` to an open connection, no step blocking, and checks that it works.
    fn opens(op: Opening) {
        let (opened, longest) = drive(op);
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
        let Value::Array(items) = reader.next().unwrap() else {
            panic!("not a confirmation")
        };
        assert_eq!(
            items.first(),
            Some(&Value::BulkString(b"subscribe".to_vec()))
        );
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
        let Err(e) = drive(start(&url, Duration::from_secs(5), None)).0 else {
            panic!("a wrong password was taken")
        };
        assert!(e.to_string().contains("authentication"), "{e}");
    }

    #[test]
    fn opens_over_tls_without_blocking() {
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
            drive(start(&plain, Duration::from_secs(5), Some(&tls)))
                .0
                .is_err()
        );
    }

    #[test]
    fn a_black_hole_costs_its_deadline_and_never_blocks_a_step() {
        // A listening socket that never accepts: the kernel completes the connect, nothing
        // ever answers (a frozen server).
        let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://127.0.0.1:{}/", hole.local_addr().unwrap().port());
        let t = Instant::now();
        let (opened, longest) = drive(start(&url, Duration::from_millis(300), None));
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
        assert!(drive(op).0.is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
