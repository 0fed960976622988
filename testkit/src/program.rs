//! Which server the harness starts: `redis-server` by default, or the program named by
//! [`SERVER_VAR`] (for example a `valkey-server`), with its command-line client beside it; and
//! whether that server can serve TLS.

use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;

use crate::server::RedisServer;
use crate::tls::{ServerCert, TlsFiles};

/// The environment variable naming the server program every test starts (plain, TLS,
/// replicas, sentinels with `--sentinel`, cluster nodes): a path or a name on `PATH`.
/// Unset or empty: `redis-server`.
pub const SERVER_VAR: &str = "LOCKSMITH_TEST_SERVER";

/// The environment variable naming the command-line client (used for `--cluster create`).
/// Unset or empty: the client beside the server, see [`cli_program`].
pub const CLI_VAR: &str = "LOCKSMITH_TEST_CLI";

/// Set to `1` when a run must cover TLS: [`skip_without_tls`] then fails the test instead of
/// skipping it, so that a server that should have TLS cannot skip the TLS tests unnoticed.
pub const REQUIRE_TLS_VAR: &str = "LOCKSMITH_TEST_REQUIRE_TLS";

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The server program: [`SERVER_VAR`] if set, else `redis-server`.
pub fn server_program() -> String {
    env(SERVER_VAR).unwrap_or_else(|| "redis-server".to_owned())
}

/// The command-line client: [`CLI_VAR`] if set; else the server program's path with the `-server`
/// at the end of its file name made `-cli` (`/opt/valkey/bin/valkey-server` gives
/// `/opt/valkey/bin/valkey-cli`); else `redis-cli`.
pub fn cli_program() -> String {
    if let Some(cli) = env(CLI_VAR) {
        return cli;
    }
    cli_beside(&server_program())
}

/// The client program that goes with the server program `server`.
fn cli_beside(server: &str) -> String {
    let path = Path::new(server);
    match path.file_name().and_then(|f| f.to_str()) {
        Some(name) if name.ends_with("-server") => {
            let cli = format!("{}-cli", &name[..name.len() - "-server".len()]);
            path.with_file_name(cli).to_string_lossy().into_owned()
        }
        _ => "redis-cli".to_owned(),
    }
}

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

#[cfg(test)]
mod tests {
    use super::cli_beside;

    #[test]
    fn the_client_is_found_beside_the_server() {
        assert_eq!(cli_beside("redis-server"), "redis-cli");
        assert_eq!(cli_beside("valkey-server"), "valkey-cli");
        assert_eq!(
            cli_beside("/opt/valkey/bin/valkey-server"),
            "/opt/valkey/bin/valkey-cli"
        );
        assert_eq!(cli_beside("/usr/local/bin/my-redis"), "redis-cli");
    }
}
