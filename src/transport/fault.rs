//! What went wrong below the lock types, as the transport and topology layers decide on it.
//!
//! A [`Fault`] says in its variant what happened: the call's bound ran out before a step
//! (nothing was sent), a quorum master was skipped, a connection failed, a server answered
//! with something other than RESP, Redis answered with an error, a script's reply had a shape
//! its parser does not know. The layers that retry, drop connections, mark masters down or
//! undo a partial grant match on it; no decision reads an error's text or looks inside an
//! error for a type of ours.
//!
//! A fault becomes the public [`Error`] where a result leaves those layers (`From<Fault> for
//! Error`, used by `?`): the public variants, texts and sources are what they were when these
//! layers built `Error`s themselves.

use std::fmt;
use std::io;

use redis::Value;

use crate::error::{Error, NO_ANSWER, RedisFailure, redis_retriable};

/// The text of [`Fault::RanOut`] as the public [`Error::Timeout`] says it.
pub(crate) const RAN_OUT: &str = "the call's time bound ran out";

/// The text of [`Fault::MarkedDown`] as the public [`Error::Timeout`] says it.
const MARKED_DOWN: &str = "master marked down after a failure";

/// A failure in the transport or topology layers (see the module's documentation).
#[derive(Debug)]
pub(crate) enum Fault {
    /// The call had no time left for its next step: nothing was sent or read. Not a fault of
    /// the server, nor of the connection.
    RanOut {
        /// The server the step was for (`host:port`), when known.
        server: Option<String>,
    },
    /// A quorum master was skipped: it failed a moment ago and is marked down. Nothing was
    /// sent to it.
    MarkedDown,
    /// No answer within a bound: a socket's timeout, or the bound named by `what`.
    Timeout {
        /// What timed out, as the public error says it.
        what: &'static str,
        /// The server that did not answer (`host:port`), when known.
        server: Option<String>,
    },
    /// The connection failed: refused, reset, closed, a TLS failure. The connection is no
    /// good any more.
    Io {
        /// The error as the `redis` crate (or the socket) gave it.
        error: redis::RedisError,
        /// The server of the connection (`host:port`), when known.
        server: Option<String>,
    },
    /// The server answered with bytes that are not RESP (an HTTP server, an SSH banner):
    /// the connection is dropped, and a retry does not cure it.
    NotRedis {
        /// One line that names the server and quotes the start of its answer.
        text: String,
    },
    /// Redis answered with an error (a refused command, `READONLY`, `WRONGTYPE`, ...), or
    /// the `redis` crate refused something before any I/O.
    Redis(redis::RedisError),
    /// A reply of a shape the crate does not know: a script (or command) answered with
    /// something its parser cannot read.
    BadReply {
        /// The script or command, e.g. `"release"`.
        script: String,
        /// What it returned.
        reply: Value,
    },
    /// Anything else, already in the public terms: an invalid configuration or URL, a TLS
    /// setup error.
    Other(Error),
}

impl Fault {
    /// The public error's text of a socket's timeout, with no server yet.
    pub(crate) fn no_answer() -> Fault {
        Fault::timeout(NO_ANSWER)
    }

    /// A timeout of the bound named by `what`, with no server.
    pub(crate) fn timeout(what: &'static str) -> Fault {
        Fault::Timeout { what, server: None }
    }

    /// A reply of `script` that its parser cannot read.
    pub(crate) fn bad_reply(script: impl Into<String>, reply: &Value) -> Fault {
        Fault::BadReply {
            script: script.into(),
            reply: reply.clone(),
        }
    }

    /// Names the server a connection-level failure or a timeout happened with (`host:port`,
    /// never a password), unless one is named already.
    pub(crate) fn at(self, name: &str) -> Fault {
        let named = |server: Option<String>| server.or_else(|| Some(name.to_owned()));
        match self {
            Fault::RanOut { server } => Fault::RanOut {
                server: named(server),
            },
            Fault::Timeout { what, server } => Fault::Timeout {
                what,
                server: named(server),
            },
            Fault::Io { error, server } => Fault::Io {
                error,
                server: named(server),
            },
            Fault::Other(e) => Fault::Other(e.at(name)),
            f => f,
        }
    }

    /// Whether nothing was sent: the call's bound ran out first, or the master was skipped as
    /// marked down. A script call that failed so never ran on that master.
    pub(crate) fn nothing_sent(&self) -> bool {
        matches!(self, Fault::RanOut { .. } | Fault::MarkedDown)
    }

    /// Whether this is [`Fault::MarkedDown`].
    pub(crate) fn is_marked_down(&self) -> bool {
        matches!(self, Fault::MarkedDown)
    }

    /// Whether the connection (or the server behind it) is no good: a failed or timed-out
    /// connection, an answer that is not RESP. Not when the call's bound ran out before any
    /// I/O, nor for an error that Redis answered.
    pub(crate) fn is_broken(&self) -> bool {
        match self {
            Fault::MarkedDown | Fault::Timeout { .. } | Fault::Io { .. } => true,
            Fault::NotRedis { .. } => true,
            Fault::RanOut { .. } | Fault::Redis(_) | Fault::BadReply { .. } => false,
            Fault::Other(e) => match e {
                Error::Redis(RedisFailure(r)) => is_connection_error(r),
                Error::Timeout { .. } => true,
                _ => false,
            },
        }
    }

    /// Whether Redis answered `READONLY`: a master demoted to a replica by a failover.
    pub(crate) fn is_readonly(&self) -> bool {
        matches!(self, Fault::Redis(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly))
    }

    /// Whether a retry may cure this: the same answer as [`Error::is_retriable`] gives for
    /// the public error it becomes.
    pub(crate) fn is_retriable(&self) -> bool {
        match self {
            Fault::RanOut { .. } | Fault::MarkedDown | Fault::Timeout { .. } => true,
            Fault::Io { error, .. } => redis_retriable(error),
            Fault::Redis(e) => redis_retriable(e),
            Fault::NotRedis { .. } | Fault::BadReply { .. } => false,
            Fault::Other(e) => e.is_retriable(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // ` at host:port`, when the server is known.
        let at = |s: &Option<String>| s.as_ref().map(|s| format!(" at {s}")).unwrap_or_default();
        match self {
            Fault::RanOut { server } => write!(f, "{RAN_OUT}{}", at(server)),
            Fault::MarkedDown => f.write_str(MARKED_DOWN),
            Fault::Timeout { what, server } => write!(f, "timed out: {what}{}", at(server)),
            Fault::Io { error, server } => match server {
                Some(s) => write!(f, "{s}: {error}"),
                None => error.fmt(f),
            },
            Fault::NotRedis { text } => f.write_str(text),
            Fault::Redis(e) => e.fmt(f),
            Fault::BadReply { script, reply } => {
                write!(f, "unexpected reply of {script}: {reply:?}")
            }
            Fault::Other(e) => e.fmt(f),
        }
    }
}

/// True when the error says the connection itself is no good any more.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

impl From<redis::RedisError> for Fault {
    /// A socket's timeout, a failed connection, or an error Redis (or the `redis` crate)
    /// answered.
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Fault::no_answer()
        } else if is_connection_error(&e) {
            Fault::Io {
                error: e,
                server: None,
            }
        } else {
            Fault::Redis(e)
        }
    }
}

impl From<io::Error> for Fault {
    /// A socket's failure, as the `redis` crate would report it.
    fn from(e: io::Error) -> Self {
        Fault::from(redis::RedisError::from(e))
    }
}

impl From<Error> for Fault {
    /// A public error met inside these layers (a configuration or TLS setup error).
    fn from(e: Error) -> Self {
        Fault::Other(e)
    }
}

impl From<Fault> for Error {
    /// The public error of a fault, where a result leaves the transport and topology layers.
    fn from(f: Fault) -> Self {
        match f {
            Fault::RanOut { server } => Error::Timeout {
                what: RAN_OUT,
                server,
                tries: None,
            },
            Fault::MarkedDown => Error::timeout(MARKED_DOWN),
            Fault::Timeout { what, server } => Error::Timeout {
                what,
                server,
                tries: None,
            },
            Fault::Io { error, server } => match server {
                Some(s) => Error::Redis(RedisFailure(error)).at(&s),
                None => Error::Redis(RedisFailure(error)),
            },
            // An I/O error's kind and text, as a failed connection shows them; that it is not
            // RESP is told by `Error::is_retriable` from the kind (see `redis_retriable`).
            Fault::NotRedis { text } => Error::Redis(RedisFailure(redis::RedisError::from(
                io::Error::new(io::ErrorKind::InvalidData, text),
            ))),
            Fault::Redis(e) => Error::Redis(RedisFailure(e)),
            // The public enum has no variant of its own for a reply of the wrong shape: it
            // stays a `Redis` error of kind `UnexpectedReturnType`, naming the script and
            // quoting the reply.
            Fault::BadReply { script, reply } => {
                Error::Redis(RedisFailure(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "unexpected script reply",
                    format!("{script}: {reply:?}"),
                ))))
            }
            Fault::Other(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_and_its_public_error_agree_on_retries() {
        let io = || redis::RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        let faults = [
            Fault::RanOut { server: None }.at("127.0.0.1:6501"),
            Fault::MarkedDown,
            Fault::no_answer().at("127.0.0.1:6501"),
            Fault::from(io()).at("127.0.0.1:6501"),
            Fault::NotRedis {
                text: "127.0.0.1:6501 did not answer as a Redis server (HTTP/1.1 400)".into(),
            },
            Fault::bad_reply("release", &Value::Okay),
            Fault::Other(Error::timeout("no reply")),
        ];
        for f in faults {
            let shown = f.to_string();
            let retriable = f.is_retriable();
            let e = Error::from(f);
            assert_eq!(e.is_retriable(), retriable, "{shown} / {e}");
        }
    }

    #[test]
    fn public_errors_read_as_before() {
        let e = Error::from(Fault::RanOut { server: None }.at("127.0.0.1:6501"));
        assert_eq!(
            e.to_string(),
            "timed out: the call's time bound ran out at 127.0.0.1:6501"
        );
        let reset = redis::RedisError::from(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection reset",
        ));
        let e = Error::from(Fault::from(reset).at("127.0.0.1:6501"));
        assert_eq!(
            e.to_string(),
            "redis error: 127.0.0.1:6501: connection reset"
        );
        assert!(e.is_retriable());
        let e = Error::from(Fault::NotRedis {
            text: "127.0.0.1:6501 did not answer as a Redis server (HTTP/1.1 400)".into(),
        });
        assert_eq!(
            e.to_string(),
            "redis error: 127.0.0.1:6501 did not answer as a Redis server (HTTP/1.1 400)"
        );
        assert!(e.is_redis() && !e.is_retriable(), "{e}");
        let e = Error::from(Fault::bad_reply("release", &Value::Int(7)));
        assert_eq!(
            e.to_string(),
            "redis error: unexpected script reply - UnexpectedReturnType: release: int(7)"
        );
        assert!(e.is_redis() && !e.is_retriable(), "{e}");
    }
}
