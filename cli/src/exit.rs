//! The exit codes a script can rely on, and the failure that carries one with its message.

use std::fmt;

/// The command did what was asked.
pub const OK: u8 = 0;
/// Redis could not be reached or answered with an error (connection refused, timeout, TLS,
/// authentication, a server error).
pub const ERROR: u8 = 1;
/// The command line was wrong: an unknown option, a bad URL or setting, an invalid lock
/// name, or `unlock` of a name that several lock types use without `--type`.
pub const USAGE: u8 = 2;
/// Nothing to show or do: `list` found no held lock, `show` no lock of that name, `unlock`
/// nothing held under that name (or it was released before the force-unlock).
pub const NOT_FOUND: u8 = 3;
/// `unlock` was not confirmed: no terminal on stdin and no `--yes`, or the answer at the
/// prompt was not yes. Nothing was changed.
pub const REFUSED: u8 = 4;

/// The exit codes as `--help` prints them.
pub const HELP: &str = "\
Exit codes:
  0  ok
  1  Redis error: unreachable, timed out, TLS or authentication failed, or an error reply
  2  usage error: bad arguments, URL or setting, invalid lock name, or `unlock` of a name
     that several lock types use without --type
  3  not found: nothing held (list), no such lock (show), nothing to unlock (unlock)
  4  refused: `unlock` not confirmed (no terminal on stdin and no --yes, or not answered
     yes); nothing was changed";

/// Why a command stopped: the exit code and the message for stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// One of the codes of this module.
    pub code: u8,
    /// What went wrong, one or more lines, without the `locksmith:` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with this code and message.
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A usage error (exit code 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(USAGE, message)
    }

    /// Nothing found (exit code 3).
    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure::new(NOT_FOUND, message)
    }

    /// Not confirmed (exit code 4).
    pub fn refused(message: impl Into<String>) -> Failure {
        Failure::new(REFUSED, message)
    }

    /// A Redis error (exit code 1).
    pub fn redis(message: impl Into<String>) -> Failure {
        Failure::new(ERROR, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}
