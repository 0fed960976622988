//! Whether the test server can serve TLS, and skipping the TLS tests, saying why, when it
//! cannot (a Valkey or Redis built without TLS).

use std::io::Write;
use std::sync::OnceLock;

use crate::program::{env, server_program};
use crate::server::RedisServer;
use crate::tls::{ServerCert, TlsFiles};

/// Set to `1` when a run must cover TLS: [`skip_without_tls`] then fails the test instead of
/// skipping it, so that a server that should have TLS cannot skip the TLS tests unnoticed.
pub const REQUIRE_TLS_VAR: &str = "LOCKSMITH_TEST_REQUIRE_TLS";

/// Why the test server cannot serve TLS, or `None` when it can. Found out once per process by
/// starting it with a TLS port and a certificate of a test CA: a server built without TLS
/// exits at once, and its log says why.
pub fn tls_unavailable() -> Option<String> {
    static ANSWER: OnceLock<Option<String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            let files = TlsFiles::generate();
            match RedisServer::try_start_tls(&files, ServerCert::Good, false) {
                Ok(_server) => None,
                Err(e) => Some(format!("`{}` could not serve TLS: {e}", server_program())),
            }
        })
        .clone()
}

/// True when the test server cannot serve TLS ([`tls_unavailable`]): the caller, a TLS test,
/// then returns at once. The reason is written to the standard error (past the test harness's
/// capture, so it shows in every run). With [`REQUIRE_TLS_VAR`] set to `1` it panics instead.
pub fn skip_without_tls(test: &str) -> bool {
    let Some(why) = tls_unavailable() else {
        return false;
    };
    assert!(
        env(REQUIRE_TLS_VAR).as_deref() != Some("1"),
        "{test}: {REQUIRE_TLS_VAR}=1, but {why}"
    );
    // The server log's last line, without its pid and time stamp.
    let last = why
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let last = last.split_once(" # ").map_or(last, |(_, said)| said);
    let _ = writeln!(
        std::io::stderr().lock(),
        "{test}: skipped, the test server has no TLS ({})",
        last.trim()
    );
    true
}
