//! The Lua source the client sends for each of its scripts, built here as the library builds
//! it: the library's own assembly code (`src/protocol/lua.rs`, which names nothing else of the
//! crate) compiled into the harness, over the same script files. So a test that recognises a
//! script's calls by its SHA1, or runs a script itself, has the very text the client sends,
//! without the library exporting it. (The library's unit tests check that both agree.)

use std::collections::HashMap;
use std::sync::LazyLock;

/// The library's assembly of a script's source from its body and the shared prelude.
#[path = "../../src/protocol/lua.rs"]
#[allow(dead_code, unreachable_pub)]
mod lua;

/// Every script body of `src/protocol/scripts/`, by file name.
const BODIES: [(&str, &str); 17] = [
    (
        "acquire.lua",
        include_str!("../../src/protocol/scripts/acquire.lua"),
    ),
    (
        "release.lua",
        include_str!("../../src/protocol/scripts/release.lua"),
    ),
    (
        "renew.lua",
        include_str!("../../src/protocol/scripts/renew.lua"),
    ),
    (
        "renew_batch.lua",
        include_str!("../../src/protocol/scripts/renew_batch.lua"),
    ),
    (
        "fair_mutex.lua",
        include_str!("../../src/protocol/scripts/fair_mutex.lua"),
    ),
    (
        "sem_permits.lua",
        include_str!("../../src/protocol/scripts/sem_permits.lua"),
    ),
    (
        "rw_write.lua",
        include_str!("../../src/protocol/scripts/rw_write.lua"),
    ),
    (
        "rw_read.lua",
        include_str!("../../src/protocol/scripts/rw_read.lua"),
    ),
    (
        "rw_release.lua",
        include_str!("../../src/protocol/scripts/rw_release.lua"),
    ),
    (
        "renew_holder.lua",
        include_str!("../../src/protocol/scripts/renew_holder.lua"),
    ),
    (
        "rw_reenter.lua",
        include_str!("../../src/protocol/scripts/rw_reenter.lua"),
    ),
    (
        "rw_cancel.lua",
        include_str!("../../src/protocol/scripts/rw_cancel.lua"),
    ),
    (
        "rw_admin.lua",
        include_str!("../../src/protocol/scripts/rw_admin.lua"),
    ),
    (
        "multi_acquire.lua",
        include_str!("../../src/protocol/scripts/multi_acquire.lua"),
    ),
    (
        "multi_release.lua",
        include_str!("../../src/protocol/scripts/multi_release.lua"),
    ),
    (
        "mutex_admin.lua",
        include_str!("../../src/protocol/scripts/mutex_admin.lua"),
    ),
    (
        "election.lua",
        include_str!("../../src/protocol/scripts/election.lua"),
    ),
];

/// Every script's source, by its body's file name.
static SOURCES: LazyLock<HashMap<&'static str, &'static str>> = LazyLock::new(|| {
    BODIES
        .iter()
        .map(|&(file, body)| {
            let source: &'static str = Box::leak(lua::assemble(body).into_boxed_str());
            (file, source)
        })
        .collect()
});

/// The Lua source the client sends for the script whose body is the file `file` of
/// `src/protocol/scripts/` (`"acquire.lua"`, `"rw_write.lua"`, ...), or `None` for no such
/// script.
pub fn lua_source(file: &str) -> Option<&'static str> {
    SOURCES.get(file).copied()
}

/// The file names of every script, in the library's table order.
pub fn script_files() -> impl Iterator<Item = &'static str> {
    BODIES.iter().map(|&(file, _)| file)
}
