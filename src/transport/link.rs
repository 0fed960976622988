//! The socket of a connection, the command connection [`Conn`] over it, and how a command
//! connection is opened: a TCP, TLS or Unix [`Stream`] of this crate's, its replies read by
//! the `redis` crate's parser (the bounds of its steps, and the pool, are in `conn.rs`).
//! `rediss://` is ours because the `redis` crate's TLS builds its rustls configurations from
//! rustls's process-wide default provider (and installs one), which a library must leave to
//! the program (see `tls/mod.rs`); TCP and Unix go the same way, so that every address is
//! opened by one path, its host name looked up within the connect timeout (see [`dns`]).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use redis::io::tcp::socket2::{SockRef, TcpKeepalive};
use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, RedisResult, Value};

use crate::error::{Error, Result, io_error};
use crate::transport::dns;
use crate::transport::fault::Fault;
use crate::transport::tls::{self, Tls, TlsStream};

/// TCP keepalive on every connection: an idle connection that a NAT or load balancer dropped
/// silently is found out (and the mapping kept alive while it is not), after about
/// `TIME + RETRIES * INTERVAL` without an answer.
const KEEPALIVE_TIME: Duration = Duration::from_secs(15);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;

/// The keepalive settings of every connection.
pub(crate) fn keepalive() -> TcpKeepalive {
    let k = TcpKeepalive::new()
        .with_time(KEEPALIVE_TIME)
        .with_interval(KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let k = k.with_retries(KEEPALIVE_RETRIES);
    k
}

/// A TCP, TLS or Unix socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(TlsStream),
    Unix(UnixStream),
}

impl Stream {
    /// The socket, for its options and shutdown (the same whatever runs over it).
    pub(crate) fn socket(&self) -> SockRef<'_> {
        match self {
            Stream::Tcp(s) => SockRef::from(s),
            Stream::Tls(s) => SockRef::from(s.tcp()),
            Stream::Unix(s) => SockRef::from(s),
        }
    }

    /// What is read and written: the socket itself, or the TLS stream over it.
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Tcp(s) => s,
            Stream::Tls(s) => s,
            Stream::Unix(s) => s,
        }
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)?;
        self.socket().set_write_timeout(t)
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = self.socket().shutdown(Shutdown::Both);
    }
}

/// A socket or stream that is both read and written.
trait ReadWrite: Read + Write {}

impl<T: Read + Write> ReadWrite for T {}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.socket().as_raw_fd()
    }
}

impl Read for Stream {
    /// Reads what has arrived, waiting within the socket's read timeout. A read interrupted
    /// before anything arrived (`EINTR`: Linux ends a socket read that has a timeout when the
    /// process is stopped and continued, or its cgroup frozen and thawed) is tried again, as
    /// `write_all` does for a write.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.io().read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                read => return read,
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.io().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.io().flush()
    }
}

/// A command connection: its socket and the parser of its replies (a TLS connection runs its
/// handshake within its first write or read, bounded by the socket's timeouts), with the
/// timeouts its socket is set to, so that they are changed only when a step needs other ones
/// (see `conn.rs`, where it is pooled).
pub(crate) struct Conn {
    /// The resolver's generation when the connection was opened (0 without one).
    pub(super) generation: u64,
    /// The server's `host:port`, named in this connection's errors.
    pub(super) server: String,
    pub(crate) stream: Stream,
    parser: redis::Parser,
    open: bool,
    /// The socket's read and write timeouts (zero: not set yet).
    pub(super) read: Duration,
    pub(super) write: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("read", &self.read)
            .field("write", &self.write)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Writes a packed command (or several). A failure that leaves the connection unusable
    /// closes it.
    pub(crate) fn send_packed_command(&mut self, packed: &[u8]) -> RedisResult<()> {
        let sent = (self.stream.write_all(packed))
            .and_then(|()| self.stream.flush())
            .map_err(RedisError::from);
        if let Err(e) = &sent
            && e.is_unrecoverable_error()
        {
            self.open = false;
        }
        sent
    }

    /// Reads one reply. An I/O error closes the connection (a reply may be half read).
    pub(crate) fn recv_response(&mut self) -> RedisResult<Value> {
        let reply = self.parser.parse_value(&mut self.stream);
        if let Err(e) = &reply
            && io_error(e).is_some()
        {
            self.open = false;
        }
        reply
    }

    /// Sends `cmd` and reads its reply; an error reply is an `Err`.
    pub(crate) fn query(&mut self, cmd: &redis::Cmd) -> RedisResult<Value> {
        self.send_packed_command(&cmd.get_packed_command())?;
        self.recv_response()?.extract_error()
    }

    /// False once a read or write failed for good.
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }
}

/// How connections to one address are opened: the address, the `AUTH` / `SELECT` of its
/// settings, and for `rediss://` the TLS configuration.
#[derive(Clone)]
pub(crate) struct Opener {
    /// The address (and the settings of the handshake the opening runs, if any).
    pub(crate) info: ConnectionInfo,
    /// The TLS configuration of a `rediss://` address.
    pub(crate) tls: Option<tls::Config>,
}

/// How connections to an address are opened: TLS with `tls`'s configuration for the address's
/// `#insecure` flag, else plain.
pub(crate) fn client_for(info: ConnectionInfo, tls: Option<&Tls>) -> Result<Opener> {
    let tls = match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => {
            let config = tls.and_then(|tls| tls.config(*insecure));
            let none = || tls::bad("no TLS configuration for a rediss:// address");
            Some(config.ok_or_else(none)?)
        }
        _ => None,
    };
    Ok(Opener { info, tls })
}

/// Opens `client`'s connection within `connect`: a host name looked up within it (see
/// [`dns`]), the host's addresses tried in turn within what is left, with keepalive; then
/// the `AUTH` / `SELECT` of its settings, if any, pipelined within what is left (which runs
/// the TLS handshake; without them, the first command does). Nothing else: a new
/// connection to a stalled server then waits for the command's reply within the command
/// timeout, not for a handshake within the connect timeout.
pub(crate) fn open(client: &Opener, connect: Duration) -> Result<Conn, Fault> {
    let until = Instant::now().checked_add(connect);
    let left = || {
        let left = until.map_or(connect, |t| t.saturating_duration_since(Instant::now()));
        let timed_out = io::Error::new(io::ErrorKind::TimedOut, "Connection timed out");
        (!left.is_zero()).then_some(left).ok_or(timed_out)
    };
    let stream = match client.info.addr() {
        ConnectionAddr::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            let mut tcp = Err(io::ErrorKind::NotFound.into());
            for addr in dns::lookup(host, *port, Some(connect))? {
                tcp = left().and_then(|left| TcpStream::connect_timeout(&addr, left));
                if tcp.is_ok() {
                    break;
                }
            }
            let tcp = tcp?;
            SockRef::from(&tcp).set_tcp_keepalive(&keepalive())?;
            match &client.tls {
                Some(config) => {
                    Stream::Tls(TlsStream::over(tcp, tls::session(host, config.clone())?))
                }
                None => Stream::Tcp(tcp),
            }
        }
        _ => return Err(unsupported().into()),
    };
    // The opening leaves the socket without timeouts: zero here.
    let mut con = Conn {
        generation: 0,
        server: client.info.addr().to_string(),
        stream,
        parser: redis::Parser::new(),
        open: true,
        read: Duration::ZERO,
        write: Duration::ZERO,
    };
    let settings = client.info.redis_settings();
    let select = (settings.db() != 0).then(|| redis::cmd("SELECT").arg(settings.db()).clone());
    let setup: Vec<_> = auth(settings).into_iter().chain(select).collect();
    if !setup.is_empty() {
        con.stream.set_timeouts(Some(left()?))?;
        let mut packed = Vec::new();
        setup
            .iter()
            .for_each(|c| c.write_packed_command(&mut packed));
        con.send_packed_command(&packed)?;
        for _ in &setup {
            con.recv_response()?.extract_error()?;
        }
        con.stream.set_timeouts(None)?;
    }
    Ok(con)
}

/// The error of an address that is neither TCP, TLS nor Unix.
pub(crate) fn unsupported() -> Error {
    Error::InvalidUrl {
        reason: "this address type is not supported".into(),
    }
}

/// The `AUTH [username] password` of `settings`; `None` without a password.
pub(crate) fn auth(settings: &RedisConnectionInfo) -> Option<redis::Cmd> {
    let password = settings.password()?;
    let mut auth = redis::cmd("AUTH");
    if let Some(user) = settings.username() {
        auth.arg(user);
    }
    auth.arg(password);
    Some(auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state letter of thread `tid` of this process (`S`: asleep in a system call).
    fn state(tid: &str) -> char {
        let stat =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .unwrap_or('?')
    }

    /// A read with a timeout that the kernel interrupts (the process stopped and continued
    /// while it waited) goes on waiting and returns the bytes that come afterwards. It runs in
    /// a child process of its own (this test binary, run for this test alone), so that the
    /// stop interrupts no other test's reads.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_read_interrupted_by_a_stop_and_continue_goes_on() {
        const CHILD: &str = "LOCKSMITH_TEST_STOPPED_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "transport::link::tests::a_read_interrupted_by_a_stop_and_continue_goes_on",
                ])
                .args(["--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .status()
                .unwrap();
            assert!(status.success(), "the child's run failed: {status}");
            return;
        }
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(ours);
        stream.set_timeouts(Some(Duration::from_secs(20))).unwrap();
        let (tid_tx, tid_rx) = crossbeam_channel::bounded(1);
        let reader = std::thread::spawn(move || {
            let me = std::fs::read_link("/proc/thread-self").unwrap();
            tid_tx
                .send(me.file_name().unwrap().to_string_lossy().into_owned())
                .unwrap();
            let mut buf = [0u8; 1];
            stream.read(&mut buf).map(|n| (n, buf[0]))
        });
        let tid = tid_rx.recv().unwrap();
        // Wait (at most 10 s) until the reader sleeps in its read.
        let asleep = Instant::now() + Duration::from_secs(10);
        while state(&tid) != 'S' && Instant::now() < asleep {
            std::thread::yield_now();
        }
        // Another process stops this one and continues it: the read's `recv` ends in EINTR.
        let pid = std::process::id();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("kill -STOP {pid}; sleep 0.05; kill -CONT {pid}"))
            .status()
            .unwrap();
        assert!(status.success());
        peer.write_all(b"x").unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), (1, b'x'));
    }
}
