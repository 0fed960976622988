//! TLS for every connection: the certificates a client trusts and presents, the rustls
//! configurations, the TLS streams of command and pub/sub connections, and errors that say
//! which check failed.
//!
//! TLS is the cargo feature `tls` (on by default). This file is what every build has: the
//! certificates as the builder keeps them, the check that the features a set-up needs are
//! built in, and the small pieces the pub/sub opening and the diagnosis share with plain
//! TCP. The rest is one of two files with the same names:
//!
//! - `on.rs` (feature `tls`): rustls with the `ring` provider, given explicitly to every
//!   configuration this crate makes. No process-wide default provider is installed or read:
//!   the `redis` crate's own TLS builds its configurations from the process default (and
//!   installs one), so command connections run their TLS here too (`link.rs`), and their
//!   replies are read by the `redis` crate's parser. One verifier (`AnyCert` in `on.rs`)
//!   checks signatures but no certificate: it accepts any for `#insecure` URLs (feature
//!   `tls-insecure`) and refuses every one for the TLS probe.
//! - `off.rs` (without it): the same names over one type that has no value, so that the code
//!   that would use a TLS connection compiles and can never reach one; `build()` refuses a
//!   `rediss://` URL before (see [`check_features`]).

use std::io;

use crate::error::{Error, Result};

#[cfg(feature = "tls")]
mod on;
#[cfg(feature = "tls")]
pub(crate) use on::*;

#[cfg(not(feature = "tls"))]
mod off;
#[cfg(not(feature = "tls"))]
pub(crate) use off::*;

/// The certificates given to the builder: a private CA to trust instead of the system's
/// roots, and a client certificate with its key for mutual TLS (all PEM).
#[derive(Clone, Default)]
pub(crate) struct TlsCerts {
    pub(crate) root: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a key.
        f.debug_struct("TlsCerts")
            .field("root", &self.root.as_ref().map(|_| "<pem>"))
            .field("client", &self.client.as_ref().map(|_| "<pem>"))
            .finish()
    }
}

/// Refuses, before any I/O, a set-up that needs a feature this build lacks: `rediss://`
/// addresses (`verified`: some check the certificate; `insecure`: some end in `#insecure`) or
/// certificates given to the builder without the feature `tls`, and `#insecure` without the
/// feature `tls-insecure`. The error names the feature.
pub(crate) fn check_features(certs: &TlsCerts, verified: bool, insecure: bool) -> Result<()> {
    let needs = |what: &str, feature: &str| {
        format!(
            "{what} needs the `{feature}` feature of redis-locksmith (not enabled in this build)"
        )
    };
    let wants_tls = [
        (verified || insecure, "url", "rediss://"),
        (certs.root.is_some(), "tls_root_cert", "a TLS certificate"),
        (
            certs.client.is_some(),
            "tls_client_cert",
            "a TLS client certificate",
        ),
    ];
    if let Some((_, key, what)) = wants_tls.into_iter().find(|(given, ..)| *given)
        && !cfg!(feature = "tls")
    {
        return Err(Error::config(key, needs(what, "tls")));
    }
    if insecure && !cfg!(feature = "tls-insecure") {
        let what = "a rediss:// URL ending in #insecure (which turns the server's certificate \
                    check off)";
        return Err(Error::config("url", needs(what, "tls-insecure")));
    }
    Ok(())
}

/// What a step on a non-blocking socket waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// The socket must become readable.
    Read,
    /// The socket must become writable.
    Write,
}

/// A TLS error with `reason` (which check failed, and what to do about it).
pub(crate) fn bad(reason: impl Into<String>) -> Error {
    Error::Tls {
        reason: reason.into(),
    }
}

/// Whether an I/O error of `kind` says the peer closed the connection (not refused, not
/// timed out).
pub(crate) fn closed_by_peer(kind: io::ErrorKind) -> bool {
    use io::ErrorKind as K;
    matches!(
        kind,
        K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `check_features` says (empty when it lets the set-up through).
    fn says(certs: &TlsCerts, verified: bool, insecure: bool) -> String {
        match check_features(certs, verified, insecure) {
            Ok(()) => String::new(),
            Err(e) => {
                assert!(e.is_invalid_config(), "{e:?}");
                e.to_string()
            }
        }
    }

    #[test]
    fn a_set_up_this_build_cannot_serve_names_the_feature() {
        let none = TlsCerts::default();
        let root = TlsCerts {
            root: Some(b"pem".to_vec()),
            client: None,
        };
        let client = TlsCerts {
            root: None,
            client: Some((b"cert".to_vec(), b"key".to_vec())),
        };
        // Plain TCP without certificates: every build.
        assert_eq!(says(&none, false, false), "");
        let tls = "`tls` feature of redis-locksmith";
        let insecure = "`tls-insecure` feature of redis-locksmith";
        if cfg!(feature = "tls") {
            assert_eq!(says(&none, true, false), "");
            assert_eq!(says(&root, false, false), "");
            assert_eq!(says(&client, true, false), "");
        } else {
            assert!(says(&none, true, false).contains(tls));
            assert!(says(&root, false, false).contains("tls_root_cert"));
            assert!(says(&root, false, false).contains(tls));
            assert!(says(&client, false, false).contains("tls_client_cert"));
        }
        if cfg!(feature = "tls-insecure") {
            assert_eq!(says(&none, true, true), "");
        } else {
            let said = says(&none, false, true);
            assert!(said.contains(insecure) || said.contains(tls), "{said}");
        }
    }
}
