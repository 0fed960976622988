//! A build without the feature `tls`: the names of `on.rs` over types that have no value
//! (each holds an [`Infallible`]).
//!
//! No [`Tls`] set-up can be made ([`Tls::new`] refuses, and `build()` refuses a `rediss://`
//! URL before it would ask, see [`check_features`](super::check_features)), so no
//! configuration, session or TLS stream exists either: the code that would use one compiles
//! and is never reached. A plain-text connection to a TLS port is not told apart (that probe
//! needs rustls).

use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{TlsCerts, Want, bad};
use crate::error::{Error, Result};

/// Never made: a client configuration needs the feature `tls`.
#[derive(Debug, Clone)]
pub(crate) struct Config(Infallible);

/// Never made: a TLS session needs the feature `tls`.
#[derive(Debug)]
pub(crate) struct Session(Infallible);

/// Never made: a TLS set-up needs the feature `tls`.
#[derive(Debug)]
pub(crate) struct Tls(Infallible);

/// What every TLS set-up says without the feature.
fn missing() -> Error {
    bad("TLS needs the `tls` feature of redis-locksmith (not enabled in this build)")
}

impl Tls {
    /// Refuses: TLS needs the feature `tls`.
    pub(crate) fn new(_certs: TlsCerts, _verified: bool, _insecure: bool) -> Result<Tls> {
        Err(missing())
    }

    /// Never called (no `Tls` exists).
    pub(crate) fn config(&self, _insecure: bool) -> Option<Config> {
        match self.0 {}
    }
}

/// Never called (no configuration exists).
pub(crate) fn session(_host: &str, config: Config) -> Result<Session> {
    match config.0 {}
}

/// Never called (no session exists).
pub(crate) fn handshake_step(conn: &mut Session, _sock: &TcpStream) -> io::Result<Option<Want>> {
    match conn.0 {}
}

/// Never called (no session exists).
pub(crate) fn flush_step(conn: &mut Session, _sock: &TcpStream) -> io::Result<bool> {
    match conn.0 {}
}

/// Never called (no session exists).
pub(crate) fn queue(conn: &mut Session, _plaintext: &[u8]) -> io::Result<()> {
    match conn.0 {}
}

/// The plaintext of a session (never made: no session exists).
pub(crate) struct PlainReader<'a> {
    pub(crate) conn: &'a mut Session,
    pub(crate) sock: &'a TcpStream,
}

impl Read for PlainReader<'_> {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        let _ = self.sock;
        match self.conn.0 {}
    }
}

/// Never made: a command connection over TLS needs the feature `tls`.
#[derive(Debug)]
pub(crate) struct TlsConn(Infallible);

impl TlsConn {
    /// Never called (no configuration exists).
    pub(crate) fn new(_tcp: TcpStream, _host: &str, config: Config) -> Result<TlsConn> {
        match config.0 {}
    }

    /// Never called.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self.0 {}
    }

    /// Never called.
    pub(crate) fn send(&mut self, _bytes: &[u8]) -> redis::RedisResult<()> {
        match self.0 {}
    }

    /// Never called.
    pub(crate) fn recv(&mut self) -> redis::RedisResult<redis::Value> {
        match self.0 {}
    }

    /// Never called.
    pub(crate) fn is_open(&self) -> bool {
        match self.0 {}
    }
}

/// Never made: a pub/sub connection over TLS needs the feature `tls`.
#[derive(Debug)]
pub(crate) struct TlsStream(Infallible);

impl TlsStream {
    /// Never called (no session exists).
    pub(crate) fn established(_tcp: TcpStream, conn: Session) -> TlsStream {
        match conn.0 {}
    }

    /// Never called.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self.0 {}
    }

    /// Never called.
    pub(crate) fn try_clone(&self) -> io::Result<TlsStream> {
        match self.0 {}
    }
}

impl Read for TlsStream {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
}

impl Write for TlsStream {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        match self.0 {}
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.0 {}
    }
}

/// The error of a failed handshake (none happens without TLS): the I/O error as it is.
pub(crate) fn handshake_error(e: &io::Error, _host: &str) -> Error {
    Error::io(io::Error::new(e.kind(), e.to_string()))
}

/// `e` unchanged: no error comes from TLS.
pub(crate) fn classify(e: Error, _host: &str) -> Error {
    e
}

/// False: telling a TLS port by a handshake needs the feature `tls`.
pub(crate) fn speaks_tls(_host: &str, _port: u16, _connect: Duration) -> bool {
    false
}
