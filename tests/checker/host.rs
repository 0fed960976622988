//! A master as the scripts see it: its keyspace ([`Db`]), a Lua 5.1 state for the scripts sent
//! with `EVALSHA` and another for the function library (`FCALL`), each holding the crate's own
//! generated Lua, compiled once per state.
//!
//! `redis.call`, `redis.pcall`, `redis.error_reply`, `redis.status_reply` and (while the
//! library loads) `redis.register_function` are provided as Redis provides them, with its
//! conversions: a Lua number argument reaches the command as its integer digits (Redis's
//! `%.17g`), a reply's integer becomes a number, a nil bulk string `false`, a status `{ok=}`,
//! an error `{err=}` (raised by `redis.call`, returned by `redis.pcall`); a script's return
//! becomes an integer (a number truncated), a bulk string, nil (`false`/`nil`), an array up to
//! its first nil, a status or an error.

use std::cell::RefCell;
use std::rc::Rc;

use mlua::{Function, Lua, MultiValue, Table, Value};

use super::store::{Db, Reply};
use crate::protocol::library::PLAIN;
use crate::protocol::scripts::Which;

/// The keyspace and the reusable argument buffers of one master, shared by its Lua states.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) db: Db,
    args: Vec<Vec<u8>>,
}

/// A Lua value as a command argument, into `out`; false for a type Redis refuses.
fn arg_bytes(v: &Value, out: &mut Vec<u8>) -> bool {
    use std::io::Write;
    out.clear();
    match v {
        Value::String(s) => out.extend_from_slice(&s.as_bytes()),
        Value::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Number(n) => {
            if n.fract() == 0.0 && n.abs() < 1e17 {
                let _ = write!(out, "{}", *n as i64);
            } else if n.is_finite() {
                // `%.17g` of a fraction: its shortest exact digits, as Rust writes them.
                let _ = write!(out, "{n}");
            } else {
                out.extend_from_slice(if *n > 0.0 { b"inf" } else { b"-inf" });
            }
        }
        _ => return false,
    }
    true
}

/// A reply as Lua gets it from `redis.call`.
fn to_lua(lua: &Lua, r: Reply) -> mlua::Result<Value> {
    Ok(match r {
        Reply::Nil => Value::Boolean(false),
        Reply::Int(i) => Value::Number(i as f64),
        Reply::Bulk(b) => Value::String(lua.create_string(b)?),
        Reply::Status(s) => {
            let t = lua.create_table_with_capacity(0, 1)?;
            t.raw_set("ok", s)?;
            Value::Table(t)
        }
        Reply::Err(e) => {
            let t = lua.create_table_with_capacity(0, 1)?;
            t.raw_set("err", e)?;
            Value::Table(t)
        }
        Reply::Arr(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
    })
}

/// A script's return value as the client receives it.
pub(super) fn from_lua(v: &Value) -> Reply {
    match v {
        Value::Nil | Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Integer(i) => Reply::Int(*i),
        Value::Number(n) => Reply::Int(*n as i64),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Table(t) => {
            if let Ok(Value::String(e)) = t.raw_get::<Value>("err") {
                return Reply::Err(e.to_string_lossy());
            }
            if let Ok(Value::String(s)) = t.raw_get::<Value>("ok") {
                return Reply::Status(s.to_string_lossy());
            }
            let mut out = Vec::new();
            for i in 1.. {
                match t.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(v) => out.push(from_lua(&v)),
                }
            }
            Reply::Arr(out)
        }
        _ => Reply::Nil,
    }
}

/// Runs the command of `args` (Lua values) on `shared`'s keyspace.
fn command(shared: &RefCell<Shared>, args: &MultiValue) -> Reply {
    let mut s = shared.borrow_mut();
    let s = &mut *s;
    while s.args.len() < args.len() {
        s.args.push(Vec::new());
    }
    for (i, a) in args.iter().enumerate() {
        if !arg_bytes(a, &mut s.args[i]) {
            return Reply::Err(
                "ERR Lua redis lib command arguments must be strings or integers".into(),
            );
        }
    }
    s.db.command(&s.args[..args.len()])
}

/// A Lua state with the `redis` table of a script's environment over `shared`.
fn new_state(shared: &Rc<RefCell<Shared>>) -> mlua::Result<Lua> {
    let lua = Lua::new();
    let redis = lua.create_table()?;
    let sh = Rc::clone(shared);
    redis.set(
        "call",
        lua.create_function(move |lua, args: MultiValue| match command(&sh, &args) {
            Reply::Err(e) => Err(mlua::Error::RuntimeError(e)),
            r => to_lua(lua, r),
        })?,
    )?;
    let sh = Rc::clone(shared);
    redis.set(
        "pcall",
        lua.create_function(move |lua, args: MultiValue| to_lua(lua, command(&sh, &args)))?,
    )?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, e: String| to_lua(lua, Reply::Err(e)))?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, s: String| to_lua(lua, Reply::Status(s)))?,
    )?;
    lua.globals().set("redis", redis)?;
    Ok(lua)
}

/// The scripts as `EVALSHA` runs them: each source compiled once into a function of the
/// state, run with the globals `KEYS` and `ARGV` set.
struct Scripts {
    lua: Lua,
    fns: Vec<Function>,
}

impl Scripts {
    fn new(shared: &Rc<RefCell<Shared>>) -> mlua::Result<Scripts> {
        let lua = new_state(shared)?;
        let mut fns = Vec::new();
        for w in Which::ALL {
            fns.push(lua.load(w.source()).set_name(w.file()).into_function()?);
        }
        Ok(Scripts { lua, fns })
    }
}

/// The function library as `FUNCTION LOAD` leaves it: its text run once in a state of its
/// own (where `MARKS` lives from call to call), its functions registered by name.
struct Functions {
    lua: Lua,
    acquire: Function,
    release: Function,
}

impl Functions {
    fn new(shared: &Rc<RefCell<Shared>>) -> mlua::Result<Functions> {
        let lua = new_state(shared)?;
        let registered = lua.create_table()?;
        let reg = registered.clone();
        let redis: Table = lua.globals().get("redis")?;
        redis.set(
            "register_function",
            lua.create_function(move |_, (name, f): (String, Function)| reg.set(name, f))?,
        )?;
        // The library's text as FUNCTION LOAD gets it, less its shebang line.
        let source = PLAIN.source_text();
        let body = source.split_once('\n').map_or("", |(_, b)| b);
        lua.load(body).set_name("library").exec()?;
        redis.set("register_function", Value::Nil)?;
        let get = |w: Which| -> mlua::Result<Function> {
            registered.get(PLAIN.function(w).unwrap_or_default())
        };
        Ok(Functions {
            acquire: get(Which::Acquire)?,
            release: get(Which::Release)?,
            lua,
        })
    }
}

/// One master: its keyspace and its two Lua states.
pub(super) struct Host {
    pub(super) shared: Rc<RefCell<Shared>>,
    scripts: Scripts,
    functions: Functions,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").finish_non_exhaustive()
    }
}

impl Host {
    /// A master with an empty keyspace, the scripts and the library loaded.
    pub(super) fn new() -> mlua::Result<Host> {
        let shared = Rc::new(RefCell::new(Shared::default()));
        Ok(Host {
            scripts: Scripts::new(&shared)?,
            functions: Functions::new(&shared)?,
            shared,
        })
    }

    /// An empty restart: the keyspace is empty and the function library's Lua state new.
    /// The scripts' state is kept, compiled: a script sent with `EVALSHA` keeps nothing in it
    /// from call to call (its `KEYS` and `ARGV` are set anew, its other names are locals), so
    /// a new one would run every call alike.
    pub(super) fn restart(&mut self) -> mlua::Result<()> {
        {
            let mut s = self.shared.borrow_mut();
            s.db.map.clear();
        }
        self.reload_functions()
    }

    /// The function library reloaded (`FUNCTION FLUSH`, then the client's `FUNCTION LOAD`):
    /// its Lua state, and so its memory, is new; the keys stay.
    pub(super) fn reload_functions(&mut self) -> mlua::Result<()> {
        self.functions = Functions::new(&self.shared)?;
        Ok(())
    }

    /// Runs the script `which` with `keys` and `argv`, as `FCALL` of the library's function
    /// when `fcall` and the library holds it, else as `EVALSHA`, at the master clock `now_us`.
    pub(super) fn run(
        &mut self,
        which: Which,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        fcall: bool,
        now_us: i64,
    ) -> Reply {
        self.shared.borrow_mut().db.now_us = now_us;
        match self.call(which, keys, argv, fcall) {
            Ok(r) => r,
            Err(e) => Reply::Err(format!("ERR script error: {e}")),
        }
    }

    fn call(
        &mut self,
        which: Which,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        fcall: bool,
    ) -> mlua::Result<Reply> {
        let function = match which {
            Which::Acquire if fcall => Some(&self.functions.acquire),
            Which::Release if fcall => Some(&self.functions.release),
            _ => None,
        };
        let lua = if function.is_some() {
            &self.functions.lua
        } else {
            &self.scripts.lua
        };
        let list = |items: &[Vec<u8>]| -> mlua::Result<Table> {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, lua.create_string(item)?)?;
            }
            Ok(t)
        };
        let (k, a) = (list(keys)?, list(argv)?);
        let out: MultiValue = match function {
            Some(f) => f.call((k, a))?,
            None => {
                let g = lua.globals();
                g.raw_set("KEYS", k)?;
                g.raw_set("ARGV", a)?;
                let f = &self.scripts.fns[Which::ALL.iter().position(|w| *w == which).unwrap_or(0)];
                f.call(())?
            }
        };
        Ok(from_lua(out.iter().next().unwrap_or(&Value::Nil)))
    }
}
