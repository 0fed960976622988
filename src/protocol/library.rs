//! The Mutex's acquire and release scripts as a Redis function library, called with `FCALL`
//! where the server runs functions, in place of `EVALSHA`.
//!
//! Why: an uncontended lock+unlock cycle is two script calls, and a function call costs Redis
//! less than `EVALSHA` of the same code (no SHA to look up, and a Lua state of its own that holds
//! this library alone, so the garbage collector's step after each call has less to walk). On
//! Redis 7.0.15 the cycle took about 8 % fewer instructions (77,900 → 71,900, benches/callgrind;
//! docs/performance.md). Only these two scripts are in the library: every other call is rare
//! next to them, and each script added to the library's Lua state makes its collector's step
//! dearer.
//!
//! The functions run the scripts' own bodies (`scripts/acquire.lua`, `scripts/release.lua`),
//! each wrapped as `function(KEYS, ARGV) ... end`, so both paths answer alike; the constants and
//! prelude helpers they name are defined once at the library's top (a script builds them on
//! every call), where the functions close over them. The one thing a function has that a script
//! has not is memory between calls, `MARKS` (the fence's memory of the fencing marks,
//! `scripts/prelude/fence.lua`), which a script declares `nil`. A function is
//! named after its script's SHA1 (`locksmith_<sha1>`), and the library after its whole text, so
//! that clients of different versions on one server each find their own functions, and a fault
//! test that picks a call by the script's SHA1 finds it in either form.
//!
//! A client uses functions when every master it reached at `build()` loaded the library
//! (`FUNCTION LOAD`) and answered a call of its `ping` function; otherwise (Redis before 7.0,
//! an ACL without `FUNCTION`/`FCALL`) it sends `EVALSHA` as before. A master that answers
//! "Function not found" (an empty restart, `FUNCTION FLUSH`, a new master) gets the library
//! loaded and the call resent, as after `NOSCRIPT`.

use std::sync::LazyLock;

use redis::{Script, Value};

use crate::protocol::keys::digits;
use crate::protocol::lua::{self, NO_MARKS};
use crate::protocol::scripts::{Call, Which};

/// The scripts the library holds.
const IN_LIBRARY: [Which; 2] = [Which::Acquire, Which::Release];

/// A function library: its source, and the name of each script's function.
#[derive(Debug)]
pub(crate) struct Library {
    source: String,
    functions: Vec<(Which, String)>,
    ping: String,
}

/// The library of the scripts as one server (or Sentinel's master, or a quorum) runs them.
pub(crate) static PLAIN: LazyLock<Library> = LazyLock::new(|| Library::new(str::to_owned));

impl Library {
    /// The library of the scripts, each text made as `lua` makes it (a cluster's use
    /// `spublish`).
    pub(crate) fn new(lua: impl Fn(&str) -> String) -> Library {
        let (header, bodies) = lua::library_parts(&IN_LIBRARY.map(Which::body));
        // The memory of the fencing marks (`scripts/prelude/fence.lua`, "The memory"): one
        // table for the library, kept from call to call, in place of each script's `nil`.
        let mut body = lua(&header).replace(NO_MARKS, "local MARKS = {n = 0, at = {}}\n");
        let mut functions = Vec::new();
        for (which, script) in IN_LIBRARY.into_iter().zip(bodies) {
            // Named after the script as `EVALSHA` sends it.
            let name = format!("locksmith_{}", Script::new(&lua(which.source())).get_hash());
            let script = lua(&script);
            body.push_str(&format!(
                "redis.register_function('{name}', function(KEYS, ARGV)\n{script}\nend)\n"
            ));
            functions.push((which, name));
        }
        let id = Script::new(&body).get_hash().to_owned();
        let ping = format!("locksmith_{id}_ping");
        body.push_str(&format!(
            "redis.register_function('{ping}', function() return 1 end)\n"
        ));
        Library {
            source: format!("#!lua name=locksmith_{id}\n{body}"),
            functions,
            ping,
        }
    }

    /// The library's text, as `FUNCTION LOAD` sends it (for the script checker).
    #[cfg(test)]
    pub(crate) fn source_text(&self) -> &str {
        &self.source
    }

    /// The function that runs `which`, if the library holds it.
    pub(crate) fn function(&self, which: Which) -> Option<&str> {
        self.functions
            .iter()
            .find(|(w, _)| *w == which)
            .map(|(_, n)| n.as_str())
    }

    /// `FUNCTION LOAD` of the library. Without `REPLACE`: a server that has it already (the
    /// name is its text's hash) answers "already exists" (see [`loaded`]), and neither compiles
    /// it again nor writes it to its AOF and replicas for every client that starts.
    pub(crate) fn load(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(&self.source);
        cmd
    }

    /// A call of the library's `ping` function, which answers 1: whether `FCALL` of this
    /// library runs on a server.
    pub(crate) fn ping(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.ping).arg(0);
        cmd
    }

    /// Writes `call` to `out`: `FCALL` of its function when `functions` and the library holds
    /// it, its own `EVALSHA` otherwise (`sha`, when given, replacing the script's SHA1).
    pub(crate) fn write(&self, call: &Call, functions: bool, sha: Option<&str>, out: &mut Vec<u8>) {
        let function = self.function(call.which).filter(|_| functions);
        let evalsha = call.cmd.args_iter().next().is_some_and(
            |a| matches!(a, redis::Arg::Simple(b) if b.eq_ignore_ascii_case(b"EVALSHA")),
        );
        if !evalsha || (function.is_none() && sha.is_none()) {
            call.cmd.write_packed_command(out);
            return;
        }
        let (verb, name) = match function {
            Some(name) => ("FCALL", name),
            None => ("EVALSHA", sha.unwrap_or_default()),
        };
        // The call's own arguments after `EVALSHA <sha>`: the key count, the keys, the rest,
        // written straight into `out` (the call's command is not copied into another).
        let rest = call.cmd.args_iter().skip(2).filter_map(|a| match a {
            redis::Arg::Simple(b) => Some(b),
            _ => None,
        });
        let size = rest.clone().map(|b| b.len() + 16).sum::<usize>();
        out.reserve(48 + verb.len() + name.len() + size);
        out.push(b'*');
        out.extend_from_slice(digits::<10>(rest.clone().count() as u64 + 2, &mut [0; 20]));
        for b in [verb.as_bytes(), name.as_bytes()].into_iter().chain(rest) {
            out.extend_from_slice(b"\r\n$");
            out.extend_from_slice(digits::<10>(b.len() as u64, &mut [0; 20]));
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(b);
        }
        out.extend_from_slice(b"\r\n");
    }

    /// `call` packed (see [`write`](Self::write)).
    pub(crate) fn pack(&self, call: &Call, functions: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(call, functions, None, &mut out);
        out
    }
}

/// Whether `v`, the reply to [`Library::load`], means the server has the library now: its
/// name, or "already exists".
pub(crate) fn loaded(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => already_exists(Some(e.code()), e.details()),
        _ => true,
    }
}

/// Whether a `FUNCTION LOAD` error (its code and message) says the library is there already.
///
/// The server sends this one, and "Function not found" below, with the generic `ERR` code and
/// nothing else to tell them by (the redis crate has no kind for either): the code is checked
/// first, and the message's words only tell these two apart from other `ERR`s. A refusal with
/// a code of its own (`NOPERM`) is never taken for them.
fn already_exists(code: Option<&str>, detail: Option<&str>) -> bool {
    code == Some("ERR") && detail.is_some_and(|d| d.contains("already exists"))
}

/// Whether `v` is the error of an `FCALL` whose function the server does not have (an `ERR`;
/// see [`already_exists`]).
pub(crate) fn is_no_function(v: &Value) -> bool {
    matches!(v, Value::ServerError(e)
        if e.code() == "ERR" && e.details().is_some_and(|d| d.starts_with("Function not found")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::protocol::keys::LockKeys;
    use crate::protocol::mutex::{self, Publish, Release};
    use crate::protocol::scripts::Level;

    fn args(packed: &[u8]) -> Vec<String> {
        // RESP array of bulk strings: every other line after the header is an argument.
        let text = String::from_utf8_lossy(packed);
        text.split("\r\n")
            .skip(2)
            .step_by(2)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn names_carry_the_script_sha_and_the_library_text() {
        let lib = &*PLAIN;
        let acquire = lib.function(Which::Acquire).unwrap();
        assert_eq!(
            acquire,
            format!(
                "locksmith_{}",
                Script::new(Which::Acquire.source()).get_hash()
            )
        );
        assert!(lib.function(Which::Renew).is_none());
        assert!(lib.source.starts_with("#!lua name=locksmith_"));
        assert!(lib.source.contains(acquire));
        let other = Library::new(|s| format!("-- another version\n{s}"));
        assert_ne!(other.source.lines().next(), lib.source.lines().next());
        assert_ne!(other.function(Which::Acquire), lib.function(Which::Acquire));
    }

    #[test]
    fn helpers_are_defined_once_at_the_top_of_the_library() {
        let lib = &*PLAIN;
        let first = lib.source.find("redis.register_function").unwrap();
        let (top, functions) = lib.source.split_at(first);
        for helper in ["local function take_token", "local function raise_mark"] {
            assert_eq!(lib.source.matches(helper).count(), 1, "{helper}");
            assert!(top.contains(helper), "{helper}");
        }
        assert!(top.contains("local MARKS = {n = 0, at = {}}"));
        assert!(!lib.source.contains("local MARKS = nil"));
        assert!(!functions.contains(crate::protocol::lua::MARKER));
        // The helpers close over nothing of a call: KEYS and ARGV are the functions' own.
        for word in ["KEYS", "ARGV"] {
            assert!(
                !top.lines()
                    .filter(|l| !l.trim_start().starts_with("--"))
                    .any(|l| l.contains(word)),
                "{word} at the library's top"
            );
        }
    }

    #[test]
    fn a_call_is_an_fcall_only_when_functions_run() {
        let k = LockKeys::new("p:", "a");
        let call = mutex::release(
            &k,
            &Release {
                acquisition: "g",
                level: Level::Outermost,
                publish: Publish::IfFlagged,
                request: "",
                fence: None,
            },
            false,
        );
        let eval = args(&PLAIN.pack(&call, false));
        assert_eq!(eval[0], "EVALSHA");
        let f = args(&PLAIN.pack(&call, true));
        assert_eq!(f[0], "FCALL");
        assert_eq!(f[1], PLAIN.function(Which::Release).unwrap());
        assert_eq!(f[2..], eval[2..]);
        let renew = mutex::renew(&k, "g", std::time::Duration::from_secs(3), None);
        assert_eq!(args(&PLAIN.pack(&renew, true))[0], "EVALSHA");
        let swapped = {
            let mut out = Vec::new();
            PLAIN.write(&renew, true, Some("abc"), &mut out);
            args(&out)
        };
        assert_eq!(swapped[..2], ["EVALSHA", "abc"]);
    }

    #[test]
    fn function_not_found_is_recognised() {
        let v = redis::parse_redis_value(b"-ERR Function not found\r\n").unwrap();
        assert!(is_no_function(&v));
        let other = redis::parse_redis_value(b"-ERR unknown command 'FCALL'\r\n").unwrap();
        assert!(!is_no_function(&other));
        let exists =
            redis::parse_redis_value(b"-ERR Library 'locksmith_x' already exists\r\n").unwrap();
        assert!(loaded(&exists) && !loaded(&other));
        let refused =
            redis::parse_redis_value(b"-NOPERM Library 'locksmith_x' already exists\r\n").unwrap();
        assert!(!loaded(&refused));
    }
}
