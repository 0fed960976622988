//! The scripts as a cluster runs them: each lock script with `publish` made a sharded
//! `spublish` (under its own SHA1), a call packed as `EVALSHA` of that script (or `FCALL` of
//! its function in the sharded function library), and the loading of them all on a node's
//! connection after `NOSCRIPT` (or "Function not found").
//!
//! Apart from the routing (the parent module) because it is the one place where the
//! cluster's scripts differ from the protocol's; the routing only sends what it packs.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::protocol::library::{self, Library};
use crate::protocol::scripts::{Call, Which};
use crate::transport::conn::{Conn, Deadline};
use crate::transport::fault::Fault;

/// The scripts as a cluster runs them: `publish` is `spublish` (sharded pub/sub).
static SHARDED: LazyLock<Vec<(Which, redis::Script, String)>> = LazyLock::new(|| {
    Which::ALL
        .iter()
        .map(|&w| {
            let source = sharded_source(w.source());
            (w, redis::Script::new(&source), source)
        })
        .collect()
});

/// A script's source with every `publish` made a sharded `spublish`.
pub(crate) fn sharded_source(source: &str) -> String {
    source.replace("redis.call('publish'", "redis.call('spublish'")
}

fn sharded(which: Which) -> &'static (Which, redis::Script, String) {
    SHARDED
        .iter()
        .find(|(w, ..)| *w == which)
        .unwrap_or(&SHARDED[0])
}

/// The function library of the sharded scripts.
pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::new(sharded_source));

/// `call` as a cluster runs it: `FCALL` of the sharded function when `functions` and the
/// library holds it, `EVALSHA` of the sharded script otherwise.
pub(super) fn packed(call: &Call, functions: bool) -> Vec<u8> {
    let mut out = Vec::new();
    LIBRARY.write(
        call,
        functions,
        Some(sharded(call.which).1.get_hash()),
        &mut out,
    );
    out
}

/// Loads the sharded function library on `con`.
pub(super) fn load_library(con: &mut Conn, timeout: Duration, by: Deadline) -> Result<(), Fault> {
    con.send(&LIBRARY.load().get_packed_command(), timeout, by)?;
    match con.recv(timeout, by)? {
        v if library::loaded(&v) => Ok(()),
        Value::ServerError(e) => Err(Fault::Redis(e.into())),
        _ => Ok(()),
    }
}

/// Loads every sharded script on `con`.
pub(super) fn load_scripts(con: &mut Conn, timeout: Duration, by: Deadline) -> Result<(), Fault> {
    let mut packed = Vec::new();
    for (_, _, source) in SHARDED.iter() {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .write_packed_command(&mut packed);
    }
    con.send(&packed, timeout, by)?;
    for _ in SHARDED.iter() {
        if let Value::ServerError(e) = con.recv(timeout, by)? {
            return Err(Fault::Redis(e.into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_scripts_publish_with_spublish_only() {
        for w in Which::ALL {
            let s = sharded_source(w.source());
            assert!(!s.contains("redis.call('publish'"), "{w:?}");
            if w.source().contains("redis.call('publish'") {
                assert!(s.contains("redis.call('spublish'"), "{w:?}");
                assert_ne!(
                    sharded(w).1.get_hash(),
                    redis::Script::new(w.source()).get_hash()
                );
            }
        }
    }
}
