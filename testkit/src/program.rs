//! Which server the harness starts: `redis-server` by default, or the program named by
//! [`SERVER_VAR`] (for example a `valkey-server`), with its command-line client beside it.

use std::path::Path;

/// The environment variable naming the server program every test starts (plain, TLS,
/// replicas, sentinels with `--sentinel`, cluster nodes): a path or a name on `PATH`.
/// Unset or empty: `redis-server`.
pub const SERVER_VAR: &str = "LOCKSMITH_TEST_SERVER";

/// The environment variable naming the command-line client (used for `--cluster create`).
/// Unset or empty: the client beside the server, see [`cli_program`].
pub const CLI_VAR: &str = "LOCKSMITH_TEST_CLI";

/// The value of `var`, if set and not empty.
pub(crate) fn env(var: &str) -> Option<String> {
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
