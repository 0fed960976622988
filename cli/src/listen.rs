//! `watch`'s listener: a pub/sub connection of its own (the `redis` crate directly) that
//! `PSUBSCRIBE`s to the release channels of one server, or of the master a Sentinel
//! deployment names, on a thread that reports what it hears through a channel.

use std::sync::mpsc::Sender;
use std::thread;
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::exit::Failure;
use crate::watch::{Heard, decode_channel};

/// How long the listener waits before it connects again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a read on the pub/sub connection waits before the listener pings the server, so
/// that a dead connection is found out.
const PING_AFTER: Duration = Duration::from_secs(5);

/// Which server to listen to.
#[derive(Debug, Clone)]
pub enum Source {
    /// One server.
    Server(ConnectionInfo),
    /// The master that these sentinels name `master`, reached with `settings` (its user,
    /// password and database), over TLS exactly when the sentinels are.
    Sentinel {
        /// The sentinels.
        sentinels: Vec<ConnectionInfo>,
        /// The master's name.
        master: String,
        /// The master's credentials and database.
        settings: RedisConnectionInfo,
    },
}

/// How the listener connects: the source, the TLS certificates and the timeout of each step.
#[derive(Clone)]
pub struct Listener {
    /// Where.
    pub source: Source,
    /// A private CA and a client certificate, for `rediss://` (`None`: the system's roots).
    pub certs: Option<redis::TlsCertificates>,
    /// The bound on connecting and on each command.
    pub timeout: Duration,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection infos' Debug hides passwords; the certificates are not shown.
        f.debug_struct("Listener")
            .field("source", &self.source)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A URL parsed by the `redis` crate (the library has already accepted it), its error
/// without the URL.
pub fn parse(url: &str) -> Result<ConnectionInfo, Failure> {
    url.into_connection_info()
        .map_err(|e| Failure::usage(format!("a URL could not be parsed: {e}")))
}

fn client(
    info: ConnectionInfo,
    certs: Option<&redis::TlsCertificates>,
) -> redis::RedisResult<redis::Client> {
    match (info.addr(), certs) {
        (ConnectionAddr::TcpTls { .. }, Some(certs)) => {
            redis::Client::build_with_tls(info, certs.clone())
        }
        _ => redis::Client::open(info),
    }
}

impl Listener {
    /// A connection with this listener's timeouts.
    fn connect(&self, info: ConnectionInfo) -> Result<redis::Connection, String> {
        let con = client(info, self.certs.as_ref())
            .and_then(|c| c.get_connection_with_timeout(self.timeout))
            .map_err(|e| e.to_string())?;
        con.set_write_timeout(Some(self.timeout))
            .and_then(|()| con.set_read_timeout(Some(self.timeout)))
            .map_err(|e| e.to_string())?;
        Ok(con)
    }

    /// The server to subscribe on: the one server, or the master the first sentinel that
    /// answers names.
    fn server(&self) -> Result<ConnectionInfo, String> {
        let (sentinels, master, settings) = match &self.source {
            Source::Server(info) => return Ok(info.clone()),
            Source::Sentinel {
                sentinels,
                master,
                settings,
            } => (sentinels, master, settings),
        };
        let mut why = String::from("no sentinel given");
        for s in sentinels {
            let asked = self.connect(s.clone()).and_then(|mut con| {
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master)
                    .query::<Option<(String, u16)>>(&mut con)
                    .map_err(|e| e.to_string())
            });
            match asked {
                Ok(Some((host, port))) => {
                    let addr = match s.addr() {
                        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                            host,
                            port,
                            insecure: *insecure,
                            tls_params: None,
                        },
                        _ => ConnectionAddr::Tcp(host, port),
                    };
                    return Ok(s
                        .clone()
                        .set_addr(addr)
                        .set_redis_settings(settings.clone()));
                }
                Ok(None) => why = format!("the sentinels do not know the master `{master}`"),
                Err(e) => why = format!("sentinel {}: {e}", s.addr()),
            }
        }
        Err(why)
    }

    /// Starts the listener thread: it subscribes to `pattern`, reports
    /// [`Heard::Listening`], then each message on a release channel of key prefix `prefix`,
    /// and [`Heard::Lost`] when the connection fails (then connects again a second later).
    /// It ends when the receiver of `tx` is dropped.
    pub fn spawn(self, prefix: String, pattern: String, tx: Sender<Heard>) -> std::io::Result<()> {
        thread::Builder::new()
            .name("locksmith-watch".into())
            .spawn(move || {
                loop {
                    let lost = match self.server().and_then(|info| self.connect(info)) {
                        Ok(mut con) => match listen(&mut con, &prefix, &pattern, &tx) {
                            Some(why) => why,
                            None => return,
                        },
                        Err(why) => why,
                    };
                    if tx.send(Heard::Lost(lost)).is_err() {
                        return;
                    }
                    thread::sleep(RETRY_AFTER);
                }
            })
            .map(|_| ())
    }
}

/// Subscribes to `pattern` (reporting [`Heard::Listening`]) and reads messages until the
/// connection fails (`Some(why)`) or the receiver is gone (`None`). One `PubSub` throughout:
/// dropping it unsubscribes.
fn listen(
    con: &mut redis::Connection,
    prefix: &str,
    pattern: &str,
    tx: &Sender<Heard>,
) -> Option<String> {
    let mut pubsub = con.as_pubsub();
    if let Err(e) = pubsub.psubscribe(pattern) {
        return Some(e.to_string());
    }
    if tx.send(Heard::Listening).is_err() {
        return None;
    }
    if let Err(e) = pubsub.set_read_timeout(Some(PING_AFTER)) {
        return Some(e.to_string());
    }
    loop {
        match pubsub.get_message() {
            Ok(msg) => {
                let payload: String = msg.get_payload().unwrap_or_default();
                if let Some(p) = decode_channel(prefix, msg.get_channel_name(), &payload)
                    && tx.send(Heard::Message(p)).is_err()
                {
                    return None;
                }
            }
            Err(e) if e.is_timeout() => {
                if let Err(e) = pubsub.ping::<redis::Value>() {
                    return Some(e.to_string());
                }
            }
            Err(e) => return Some(e.to_string()),
        }
    }
}
