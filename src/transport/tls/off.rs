//! A build without the feature `tls`: the names of `on.rs` over one type that has no value
//! ([`Never`], which holds an [`Infallible`]).
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

/// Never made: every TLS piece needs the feature `tls`.
#[derive(Debug, Clone)]
pub(crate) struct Never(Infallible);

/// A TLS set-up, configuration, session or stream: none exists without the feature.
pub(crate) type Tls = Never;
pub(crate) type Config = Never;
pub(crate) type Session = Never;
pub(crate) type TlsStream = Never;

impl Never {
    /// Refuses: TLS needs the feature `tls`.
    pub(crate) fn new(_certs: TlsCerts, _verified: bool, _insecure: bool) -> Result<Tls> {
        Err(bad(
            "TLS needs the `tls` feature of redis-locksmith (not enabled in this build)",
        ))
    }

    /// Never called (as every method below: no value exists).
    pub(crate) fn config(&self, _insecure: bool) -> Option<Config> {
        match self.0 {}
    }

    pub(crate) fn over(_tcp: TcpStream, conn: Session) -> TlsStream {
        match conn.0 {}
    }

    pub(crate) fn tcp(&self) -> &TcpStream {
        match self.0 {}
    }

    pub(crate) fn try_clone(&self) -> io::Result<TlsStream> {
        match self.0 {}
    }
}

/// Never called (no configuration exists).
pub(crate) fn session(_host: &str, config: Config) -> Result<Session> {
    match config.0 {}
}

/// Never called (no session exists).
pub(crate) fn handshake_step(
    conn: &mut Session,
    _sock: &TcpStream,
    _then: &[u8],
) -> io::Result<Option<Want>> {
    match conn.0 {}
}

/// Never called (no session exists).
pub(crate) fn flush_step(conn: &mut Session, _sock: &TcpStream) -> io::Result<bool> {
    match conn.0 {}
}

/// Never called (no session exists).
pub(crate) fn plain<'a>(conn: &'a mut Session, _sock: &'a TcpStream) -> Never {
    match conn.0 {}
}

impl Read for Never {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.0 {}
    }
}

impl Write for Never {
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
