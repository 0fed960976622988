//! TLS through rustls (the feature `tls`): the configurations, made with the `ring` provider
//! given explicitly (never the process default, which this crate neither installs nor reads),
//! the TLS stream of a command connection, the one of a pub/sub connection (read by one thread
//! while others write), and errors that say which check failed.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore};

use super::{TlsCerts, Want, bad, closed_by_peer};
use crate::error::{Error, RedisFailure, Result, rustls_error};
use crate::transport::dns;

/// A client configuration (shared by the connections made with it).
pub(crate) type Config = Arc<ClientConfig>;

/// A client session, before or after its handshake.
pub(crate) type Session = ClientConnection;

/// The TLS set-up of a client with `rediss://` masters: the rustls configurations of its
/// command and pub/sub connections (verifying, and for `#insecure` URLs not verifying), made
/// before any I/O so that a bad certificate fails `build()` at once.
#[derive(Debug)]
pub(crate) struct Tls {
    /// The configuration of addresses that verify certificates, then of `#insecure` ones.
    configs: [Option<Config>; 2],
}

impl Tls {
    /// The set-up for masters of which some verify certificates (`verified`) and some do not
    /// (`insecure`).
    pub(crate) fn new(certs: TlsCerts, verified: bool, insecure: bool) -> Result<Tls> {
        let verified = verified.then(|| client_config(&certs, None)).transpose()?;
        let insecure = insecure.then(|| client_config(&certs, Some(accept_any()?)));
        let insecure = insecure.transpose()?;
        Ok(Tls {
            configs: [verified, insecure],
        })
    }

    /// The configuration for an address with this `insecure` flag (`None` only if
    /// [`Tls::new`] was not asked for that kind).
    pub(crate) fn config(&self, insecure: bool) -> Option<Config> {
        self.configs[usize::from(insecure)].clone()
    }
}

/// The crypto provider of every configuration: rustls's `ring`.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration of a connection, with the `ring` provider and rustls's safe
/// protocol versions: checked by `verifier` if given (see [`AnyCert`]), else against
/// `certs.root` or the system's roots; presenting `certs.client` if given.
fn client_config(
    certs: &TlsCerts,
    verifier: Option<Arc<dyn ServerCertVerifier>>,
) -> Result<Config> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("no usable TLS version: {e}")))?;
    let builder = match verifier {
        Some(verifier) => builder
            .dangerous()
            .with_custom_certificate_verifier(verifier),
        None => builder.with_root_certificates(root_store(certs.root.as_deref())?),
    };
    let config = match &certs.client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("the client certificate is not valid PEM: {e}")))?;
            if chain.is_empty() {
                return Err(bad("the client certificate PEM holds no certificate"));
            }
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| bad(format!("the client key is not a valid PEM key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad(format!("the client certificate cannot be used: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The verifier of `#insecure` URLs: accepts any certificate, with the feature
/// `tls-insecure` only (`build()` refuses an `#insecure` URL without it before it gets here).
fn accept_any() -> Result<Arc<dyn ServerCertVerifier>> {
    if !cfg!(feature = "tls-insecure") {
        return Err(bad(
            "#insecure needs the `tls-insecure` feature of redis-locksmith",
        ));
    }
    Ok(any_cert(true))
}

fn root_store(pem: Option<&[u8]>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert =
                    cert.map_err(|e| bad(format!("the root certificate is not valid PEM: {e}")))?;
                store
                    .add(cert)
                    .map_err(|e| bad(format!("the root certificate cannot be used: {e}")))?;
            }
            if store.is_empty() {
                return Err(bad("the root certificate PEM holds no certificate"));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(bad(
                    "no system root certificates were found; trust the server's CA with \
                     `tls_root_cert`",
                ));
            }
        }
    }
    Ok(store)
}

/// A verifier that checks signatures but not the certificate: it accepts any certificate
/// (`#insecure` URLs, feature `tls-insecure`), or refuses every one (the TLS probe,
/// [`speaks_tls`]: it is only asked once the server has sent a certificate, which is all the
/// probe wants to know).
#[derive(Debug)]
struct AnyCert {
    accept: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        if self.accept {
            return Ok(ServerCertVerified::assertion());
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// An [`AnyCert`] verifier that accepts (`accept`) or refuses every certificate.
fn any_cert(accept: bool) -> Arc<dyn ServerCertVerifier> {
    let algorithms = provider().signature_verification_algorithms;
    Arc::new(AnyCert { accept, algorithms })
}

/// A TLS connection over a TCP socket (a command connection's, or a pub/sub connection's,
/// which one thread reads while others write).
///
/// rustls's connection state sits under a lock shared by every clone; the socket is cloned.
/// A reader blocks on the socket WITHOUT the lock, then takes it only to decrypt what
/// arrived; a writer takes it to encrypt and send. So a waiter's `SUBSCRIBE` never waits for
/// the subscriber thread's blocked read, exactly as on a plain socket.
#[derive(Debug)]
pub(crate) struct TlsStream {
    tcp: TcpStream,
    session: Arc<Mutex<ClientConnection>>,
    /// Ciphertext read from the socket (a reader's own buffer).
    raw: Vec<u8>,
}

/// Bytes of ciphertext read at once: no more plaintext than rustls buffers by default.
const RAW_READ: usize = 8 * 1024;

impl TlsStream {
    /// A stream over `tcp` with the session `conn`: its handshake finished (see
    /// [`handshake_step`]), or run within the first write or read (each bounded by the
    /// socket's timeouts).
    pub(crate) fn over(tcp: TcpStream, conn: ClientConnection) -> TlsStream {
        TlsStream {
            tcp,
            session: Arc::new(Mutex::new(conn)),
            raw: vec![0; RAW_READ],
        }
    }

    /// The socket (timeouts, shutdown).
    pub(crate) fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Another handle on the same connection (for the other direction).
    pub(crate) fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            tcp: self.tcp.try_clone()?,
            session: Arc::clone(&self.session),
            raw: vec![0; RAW_READ],
        })
    }
}

/// Runs the handshake of `conn` on the blocking socket `tcp` until it is done, or `until` if
/// given (each socket step is then bounded by what is left, through the socket's timeouts; a
/// step that would pass `until` is a `TimedOut` error; without it, by the socket's timeouts).
fn blocking_handshake(
    conn: &mut ClientConnection,
    mut tcp: &TcpStream,
    until: Option<Instant>,
) -> io::Result<()> {
    while conn.is_handshaking() {
        if let Some(until) = until {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            tcp.set_read_timeout(Some(left))?;
            tcp.set_write_timeout(Some(left))?;
        }
        match conn.complete_io(&mut tcp) {
            // Interrupted (`EINTR`): the handshake goes on where it was.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok((0, 0)) if conn.is_handshaking() => {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done => {
                done?;
            }
        }
    }
    Ok(())
}

/// A client session for `host`, before its handshake.
pub(crate) fn session(host: &str, config: Config) -> Result<Session> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| bad(format!("`{host}` is not a valid TLS server name: {e}")))?;
    ClientConnection::new(config, name).map_err(|e| bad(format!("cannot start a TLS session: {e}")))
}

/// Advances the handshake of `conn` on the non-blocking socket `sock` as far as the socket
/// allows (rustls is sans-IO: it never blocks by itself). `Ok(None)`: the handshake is done,
/// its last records are sent, and `then` is queued whole, to be sent as the socket allows
/// (see [`flush_step`]); `Ok(Some(want))`: call again once the socket is ready so.
pub(crate) fn handshake_step(
    conn: &mut ClientConnection,
    mut sock: &TcpStream,
    then: &[u8],
) -> io::Result<Option<Want>> {
    loop {
        if !flush_step(conn, sock)? {
            return Ok(Some(Want::Write));
        }
        if !conn.is_handshaking() {
            conn.writer().write_all(then)?;
            return Ok(None);
        }
        match take_records(conn, &mut sock) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Some(Want::Read)),
            Err(e) => return Err(e),
        }
    }
}

/// Sends what `conn` has queued on the non-blocking socket `sock`; whether all of it went
/// (else: call again once the socket is writable).
pub(crate) fn flush_step(conn: &mut ClientConnection, mut sock: &TcpStream) -> io::Result<bool> {
    while conn.wants_write() {
        match conn.write_tls(&mut sock) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The plaintext of `conn` over the non-blocking socket `sock`, as a `Read` (it says
/// `WouldBlock` when nothing more has arrived).
pub(crate) fn plain<'a>(conn: &'a mut Session, sock: &'a TcpStream) -> impl Read + 'a {
    PlainReader { conn, sock }
}

/// See [`plain`].
struct PlainReader<'a> {
    conn: &'a mut ClientConnection,
    sock: &'a TcpStream,
}

impl Read for PlainReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(read) = plaintext(self.conn, buf) {
                return read;
            }
            let mut sock = self.sock;
            if take_records(self.conn, &mut sock)? == 0 {
                return Ok(0);
            }
        }
    }
}

/// The plaintext `conn` has for `buf`; `None` when it has none yet (it needs more records).
fn plaintext(conn: &mut ClientConnection, buf: &mut [u8]) -> Option<io::Result<usize>> {
    match conn.reader().read(buf) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        read => Some(read),
    }
}

/// Reads ciphertext for `conn` from `input` and decrypts the records it completes: how many
/// bytes were read (0: the peer closed the connection).
fn take_records(conn: &mut ClientConnection, input: &mut dyn Read) -> io::Result<usize> {
    let n = conn.read_tls(input)?;
    if n > 0 {
        conn.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    Ok(n)
}

/// Sends whatever rustls has queued (records, alerts, key updates); an interrupted write
/// (`EINTR`, see `link.rs`'s `Stream::read`) is tried again, so that a plaintext write that
/// queued its bytes never fails after it (and is never queued twice by a retry).
fn flush_tls(conn: &mut ClientConnection, mut sock: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        match conn.write_tls(&mut sock) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            sent => {
                sent?;
            }
        }
    }
    Ok(())
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(read) = plaintext(&mut self.session.lock(), buf) {
                return read;
            }
            // Wait for ciphertext without the lock, so that writers are never held up.
            let n = (&self.tcp).read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            let mut conn = self.session.lock();
            let mut input = &self.raw[..n];
            while !input.is_empty() {
                take_records(&mut conn, &mut input)?;
            }
            flush_tls(&mut conn, &self.tcp)?;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut conn = self.session.lock();
        // A new command connection's handshake first, as rustls's own stream runs it (what
        // rustls would queue meanwhile is limited).
        blocking_handshake(&mut conn, &self.tcp, None)?;
        let n = conn.writer().write(buf)?;
        flush_tls(&mut conn, &self.tcp)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut conn = self.session.lock();
        flush_tls(&mut conn, &self.tcp)
    }
}

/// Names the check that failed, in words a user can act on.
pub(crate) fn describe(e: &rustls::Error, host: &str) -> String {
    use rustls::{AlertDescription as A, CertificateError as C};
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => format!(
                "the certificate of `{host}` is not signed by a trusted CA (wrong CA? trust the \
                 server's CA with `tls_root_cert`)"
            ),
            C::Expired | C::ExpiredContext { .. } => {
                format!("the certificate of `{host}` has expired")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                format!("the certificate of `{host}` is not valid yet")
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => format!(
                "the certificate presented by `{host}` is not valid for that host name \
                 (mismatched certificate)"
            ),
            other => format!("the certificate of `{host}` was refused: {other:?}"),
        },
        rustls::Error::AlertReceived(
            A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::HandshakeFailure,
        ) => format!(
            "`{host}` refused the TLS session ({e}): it may require a client certificate signed \
             by a CA it trusts (`tls_client_cert`)"
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => format!(
            "`{host}` did not answer in TLS ({e}): is this a plain-text port? (then use redis://)"
        ),
        other => format!("TLS with `{host}` failed: {other}"),
    }
}

/// The error of a failed handshake with `host`.
pub(crate) fn handshake_error(e: &io::Error, host: &str) -> Error {
    if let Some(t) = rustls_error(e) {
        return bad(describe(t, host));
    }
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
            Error::timeout("the TLS handshake did not finish within the connect timeout")
        }
        kind if closed_by_peer(kind) => bad(format!(
            "`{host}` closed the connection during the TLS handshake ({e}): is this a \
             plain-text port, or does it require a client certificate?"
        )),
        _ => Error::io(io::Error::new(e.kind(), e.to_string())),
    }
}

/// `e` as a TLS error naming the failed check when it is one (from a `redis` command
/// connection to `host`); otherwise unchanged.
pub(crate) fn classify(e: Error, host: &str) -> Error {
    if let Error::Redis(RedisFailure(r)) = &e
        && let Some(t) = rustls_error(r)
    {
        return bad(describe(t, host));
    }
    e
}

/// Whether `host:port` answers a TLS handshake (within `connect`): it shows a certificate
/// (which the probe's verifier then refuses: no data is ever sent), or sends a TLS alert (it
/// wants a client certificate, say). Silence, a closed connection or bytes that are not TLS:
/// false.
pub(crate) fn speaks_tls(host: &str, port: u16, connect: Duration) -> bool {
    // The probe's verifier refuses every certificate it is shown.
    let config = client_config(&TlsCerts::default(), Some(any_cert(false)));
    let Ok(mut conn) = config.and_then(|config| session(host, config)) else {
        return false;
    };
    let until = Instant::now() + connect;
    let Some(tcp) = dns::lookup(host, port, Some(connect))
        .ok()
        .and_then(|a| a.into_iter().next())
        .and_then(|a| TcpStream::connect_timeout(&a, connect).ok())
    else {
        return false;
    };
    match blocking_handshake(&mut conn, &tcp, Some(until)) {
        Ok(()) => {
            let _ = tcp.shutdown(std::net::Shutdown::Both);
            true
        }
        Err(e) => matches!(
            rustls_error(&e),
            Some(rustls::Error::AlertReceived(_) | rustls::Error::InvalidCertificate(_))
        ),
    }
}
