//! One master's keyspace and the Redis commands the scripts call, as Redis answers them.
//!
//! Values are kept by type (string, hash, list, sorted set); a key past its expiry is gone
//! at its next access (the clock is the master's, set before each script call, and stands
//! still while the script runs, as Redis 7 freezes it). Errors are Redis's texts
//! (`WRONGTYPE ...`, `ERR no such key`, ...).

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hash for the model's small maps (FxHash: no DoS to fear in a test).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fx(u64);

impl Hasher for Fx {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // The length and three 8-byte windows (start, middle, end): enough to tell the
        // model's keys apart, and few operations in a debug build.
        let word = |at: usize| {
            let mut w = [0u8; 8];
            let end = (at + 8).min(bytes.len());
            w[..end - at].copy_from_slice(&bytes[at..end]);
            u64::from_le_bytes(w)
        };
        let n = bytes.len();
        let mut h = self.0 ^ n as u64;
        for at in [0, n.saturating_sub(8) / 2, n.saturating_sub(8)] {
            h = (h.rotate_left(5) ^ word(at.min(n))).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        self.0 = h;
    }
}

/// A map with the fast hash.
pub(super) type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<Fx>>;

/// A Redis reply, as a script's `redis.call` gets it and as the script's return becomes.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    /// The nil bulk string (`false` in Lua).
    Nil,
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A status reply (`{ok = ...}` in Lua).
    Status(String),
    /// An error reply (`{err = ...}` in Lua).
    Err(String),
    /// An array.
    Arr(Vec<Reply>),
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const SYNTAX: &str = "ERR syntax error";
const NOT_INT: &str = "ERR value is not an integer or out of range";
const NOT_FLOAT: &str = "ERR value is not a valid float";

/// A hash's fields and values.
pub(super) type Fields = HashMap<Vec<u8>, Vec<u8>>;

/// A value of a key.
#[derive(Debug, Clone)]
pub(super) enum Val {
    Str(Vec<u8>),
    Hash(Fields),
    List(VecDeque<Vec<u8>>),
    /// A sorted set: member and score (ordered on demand: the scripts' sets are small).
    ZSet(HashMap<Vec<u8>, f64>),
}

/// A key's value and its expiry (the master's clock, in milliseconds).
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) val: Val,
    pub(super) expire_ms: Option<i64>,
}

/// One master's keyspace.
#[derive(Debug, Clone, Default)]
pub(super) struct Db {
    pub(super) map: HashMap<Vec<u8>, Entry>,
    /// The master's clock in microseconds during the current call.
    pub(super) now_us: i64,
    /// How many subscribers a PUBLISH reaches.
    pub(super) subscribers: i64,
    /// Commands run (every `redis.call` and `redis.pcall`).
    pub(super) commands: u64,
}

fn int_of(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A score as ZADD and the range commands take it: a number, `+inf`/`-inf`, and for a
/// range bound an exclusive `(`.
fn score_of(b: &[u8]) -> Option<f64> {
    let s = std::str::from_utf8(b).ok()?;
    match s.to_ascii_lowercase().as_str() {
        "+inf" | "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse::<f64>().ok().filter(|f| !f.is_nan()),
    }
}

fn bound_of(b: &[u8]) -> Option<(f64, bool)> {
    match b.strip_prefix(b"(") {
        Some(rest) => Some((score_of(rest)?, true)),
        None => Some((score_of(b)?, false)),
    }
}

/// A double as Redis writes it in a reply.
pub(super) fn fmt_score(f: f64) -> Vec<u8> {
    if f == f64::INFINITY {
        return b"inf".to_vec();
    }
    if f == f64::NEG_INFINITY {
        return b"-inf".to_vec();
    }
    if f.fract() == 0.0 && f.abs() < 1e17 {
        return format!("{}", f as i64).into_bytes();
    }
    format!("{f}").into_bytes()
}

/// Redis's glob match (`*`, `?`, `\x`; `[` taken literally, which the scripts never send).
fn glob(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((b'\\', rest)) if !rest.is_empty() => {
            !s.is_empty() && s[0] == rest[0] && glob(&rest[1..], &s[1..])
        }
        Some((c, rest)) => !s.is_empty() && s[0] == *c && glob(rest, &s[1..]),
    }
}

/// A sorted set's members in Redis's order: by score, then by member.
fn ordered(z: &HashMap<Vec<u8>, f64>) -> Vec<(&Vec<u8>, f64)> {
    let mut v: Vec<(&Vec<u8>, f64)> = z.iter().map(|(m, s)| (m, *s)).collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
    v
}

fn in_range(s: f64, min: (f64, bool), max: (f64, bool)) -> bool {
    let above = if min.1 { s > min.0 } else { s >= min.0 };
    let below = if max.1 { s < max.0 } else { s <= max.0 };
    above && below
}

/// A list or set index range (`start`, `stop`, negative from the end) over `len`.
fn index_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let mut a = if start < 0 { len + start } else { start };
    let mut b = if stop < 0 { len + stop } else { stop };
    a = a.max(0);
    b = b.min(len - 1);
    if a > b || a >= len {
        return None;
    }
    Some((a as usize, b as usize))
}

impl Db {
    fn now_ms(&self) -> i64 {
        self.now_us.div_euclid(1000)
    }

    /// The live entry of `key`, dropping it when its expiry has passed.
    fn live(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms();
        let expired = match self.map.get(key) {
            None => return None,
            Some(e) => e.expire_ms.is_some_and(|at| at <= now),
        };
        if expired {
            self.map.remove(key);
            return None;
        }
        self.map.get_mut(key)
    }

    /// The string at `key`, for the checker's own look (no command counted).
    pub(super) fn peek(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        match self.live(key) {
            Some(Entry {
                val: Val::Str(s), ..
            }) => Some(s.clone()),
            _ => None,
        }
    }

    fn string(&mut self, key: &[u8]) -> Result<Option<&mut Vec<u8>>, Reply> {
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                val: Val::Str(s), ..
            }) => Ok(Some(s)),
            Some(_) => Err(Reply::Err(WRONGTYPE.into())),
        }
    }

    fn hash(&mut self, key: &[u8], create: bool) -> Result<Option<&mut Fields>, Reply> {
        if create && self.live(key).is_none() {
            self.map.insert(
                key.to_vec(),
                Entry {
                    val: Val::Hash(HashMap::default()),
                    expire_ms: None,
                },
            );
        }
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                val: Val::Hash(h), ..
            }) => Ok(Some(h)),
            Some(_) => Err(Reply::Err(WRONGTYPE.into())),
        }
    }

    fn list(&mut self, key: &[u8], create: bool) -> Result<Option<&mut VecDeque<Vec<u8>>>, Reply> {
        if create && self.live(key).is_none() {
            self.map.insert(
                key.to_vec(),
                Entry {
                    val: Val::List(VecDeque::new()),
                    expire_ms: None,
                },
            );
        }
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                val: Val::List(l), ..
            }) => Ok(Some(l)),
            Some(_) => Err(Reply::Err(WRONGTYPE.into())),
        }
    }

    fn zset(
        &mut self,
        key: &[u8],
        create: bool,
    ) -> Result<Option<&mut HashMap<Vec<u8>, f64>>, Reply> {
        if create && self.live(key).is_none() {
            self.map.insert(
                key.to_vec(),
                Entry {
                    val: Val::ZSet(HashMap::default()),
                    expire_ms: None,
                },
            );
        }
        match self.live(key) {
            None => Ok(None),
            Some(Entry {
                val: Val::ZSet(z), ..
            }) => Ok(Some(z)),
            Some(_) => Err(Reply::Err(WRONGTYPE.into())),
        }
    }

    /// Drops an emptied aggregate, as Redis deletes a hash, list or set that became empty.
    fn drop_if_empty(&mut self, key: &[u8]) {
        let empty = match self.map.get(key).map(|e| &e.val) {
            Some(Val::Hash(h)) => h.is_empty(),
            Some(Val::List(l)) => l.is_empty(),
            Some(Val::ZSet(z)) => z.is_empty(),
            _ => false,
        };
        if empty {
            self.map.remove(key);
        }
    }

    /// Runs one command (`args[0]` its name, any case).
    pub(super) fn command(&mut self, args: &[Vec<u8>]) -> Reply {
        self.commands += 1;
        let Some(name) = args.first() else {
            return Reply::Err(
                "ERR Please specify at least one argument for this redis lib call".into(),
            );
        };
        // The name in lower case, without an allocation (no command is longer than 16).
        let mut lower = [0u8; 16];
        let n = name.len().min(16);
        for (l, c) in lower.iter_mut().zip(&name[..n]) {
            *l = c.to_ascii_lowercase();
        }
        let name = &lower[..if name.len() > 16 { 0 } else { n }];
        let a = &args[1..];
        let r = match name {
            b"get" => self.get(a),
            b"getrange" => self.getrange(a),
            b"set" => self.set(a),
            b"pttl" => self.pttl(a),
            b"pexpire" => self.pexpire(a, false),
            b"pexpireat" => self.pexpire(a, true),
            b"rename" => self.rename(a),
            b"del" => Ok(Reply::Int(
                a.iter()
                    .filter(|k| self.live(k).is_some() && self.map.remove(*k).is_some())
                    .count() as i64,
            )),
            b"exists" => Ok(Reply::Int(
                a.iter().filter(|k| self.live(k).is_some()).count() as i64,
            )),
            b"type" => self.type_of(a),
            b"time" => Ok(Reply::Arr(vec![
                Reply::Bulk(self.now_us.div_euclid(1_000_000).to_string().into_bytes()),
                Reply::Bulk(self.now_us.rem_euclid(1_000_000).to_string().into_bytes()),
            ])),
            b"publish" if a.len() == 2 => Ok(Reply::Int(self.subscribers)),
            b"incr" => self.incr(a),
            b"hset" => self.hset(a),
            b"hget" if a.len() == 2 => self.hash(&a[0], false).map(|h| {
                h.and_then(|h| h.get(&a[1]))
                    .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
            }),
            b"hmget" if a.len() >= 2 => self.hash(&a[0], false).map(|h| {
                Reply::Arr(
                    a[1..]
                        .iter()
                        .map(|f| {
                            h.as_ref()
                                .and_then(|h| h.get(f))
                                .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
                        })
                        .collect(),
                )
            }),
            b"hgetall" if a.len() == 1 => self.hash(&a[0], false).map(|h| {
                let mut out = Vec::new();
                if let Some(h) = h {
                    for (k, v) in h.iter() {
                        out.push(Reply::Bulk(k.clone()));
                        out.push(Reply::Bulk(v.clone()));
                    }
                }
                Reply::Arr(out)
            }),
            b"hexists" if a.len() == 2 => self
                .hash(&a[0], false)
                .map(|h| Reply::Int(i64::from(h.is_some_and(|h| h.contains_key(&a[1]))))),
            b"hdel" if a.len() >= 2 => self.hdel(a),
            b"rpush" if a.len() >= 2 => self.list(&a[0], true).map(|l| {
                let l = l.expect("created");
                for v in &a[1..] {
                    l.push_back(v.clone());
                }
                Reply::Int(l.len() as i64)
            }),
            b"lpop" => self.lpop(a),
            b"lindex" if a.len() == 2 => match int_of(&a[1]) {
                None => Err(Reply::Err(NOT_INT.into())),
                Some(i) => self.list(&a[0], false).map(|l| {
                    let Some(l) = l else { return Reply::Nil };
                    let i = if i < 0 { l.len() as i64 + i } else { i };
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| l.get(i))
                        .map_or(Reply::Nil, |v| Reply::Bulk(v.clone()))
                }),
            },
            b"lrange" if a.len() == 3 => match (int_of(&a[1]), int_of(&a[2])) {
                (Some(s), Some(e)) => self.list(&a[0], false).map(|l| {
                    let Some(l) = l else {
                        return Reply::Arr(vec![]);
                    };
                    match index_range(s, e, l.len()) {
                        None => Reply::Arr(vec![]),
                        Some((s, e)) => {
                            Reply::Arr(l.range(s..=e).map(|v| Reply::Bulk(v.clone())).collect())
                        }
                    }
                }),
                _ => Err(Reply::Err(NOT_INT.into())),
            },
            b"lrem" if a.len() == 3 => self.lrem(a),
            b"zadd" => self.zadd(a),
            b"zcard" if a.len() == 1 => self
                .zset(&a[0], false)
                .map(|z| Reply::Int(z.map_or(0, |z| z.len() as i64))),
            b"zscore" if a.len() == 2 => self.zset(&a[0], false).map(|z| {
                z.and_then(|z| z.get(&a[1]))
                    .map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(*s)))
            }),
            b"zcount" if a.len() == 3 => match (bound_of(&a[1]), bound_of(&a[2])) {
                (Some(min), Some(max)) => self.zset(&a[0], false).map(|z| {
                    Reply::Int(z.map_or(0, |z| {
                        z.values().filter(|s| in_range(**s, min, max)).count() as i64
                    }))
                }),
                _ => Err(Reply::Err("ERR min or max is not a float".into())),
            },
            b"zrem" if a.len() >= 2 => self.zset(&a[0], false).map(|z| {
                let Some(z) = z else { return Reply::Int(0) };
                Reply::Int(a[1..].iter().filter(|m| z.remove(*m).is_some()).count() as i64)
            }),
            b"zremrangebyscore" if a.len() == 3 => match (bound_of(&a[1]), bound_of(&a[2])) {
                (Some(min), Some(max)) => self.zset(&a[0], false).map(|z| {
                    let Some(z) = z else { return Reply::Int(0) };
                    let before = z.len();
                    z.retain(|_, s| !in_range(*s, min, max));
                    Reply::Int((before - z.len()) as i64)
                }),
                _ => Err(Reply::Err("ERR min or max is not a float".into())),
            },
            b"zrange" => self.zrange(a),
            b"zrangebyscore" => self.zrangebyscore(a),
            b"zscan" => self.zscan(a),
            _ => Err(Reply::Err(format!(
                "ERR the checker's model has no command '{}' of {} arguments",
                String::from_utf8_lossy(&args[0]),
                a.len()
            ))),
        };
        if let Some(k) = a.first() {
            self.drop_if_empty(k);
        }
        match r {
            Ok(r) | Err(r) => r,
        }
    }

    fn get(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() != 1 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'get' command".into(),
            ));
        }
        Ok(self
            .string(&a[0])?
            .map_or(Reply::Nil, |s| Reply::Bulk(s.clone())))
    }

    /// `GETRANGE key start end`, as Redis 7 answers it: negative offsets count from the end,
    /// the range is clamped to the value, and a missing key is an empty string.
    fn getrange(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let [key, start, end] = a else {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'getrange' command".into(),
            ));
        };
        let num = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| Reply::Err("ERR value is not an integer or out of range".into()))
        };
        let (mut start, mut end) = (num(start)?, num(end)?);
        let Some(s) = self.string(key)? else {
            return Ok(Reply::Bulk(Vec::new()));
        };
        let len = s.len() as i64;
        if start < 0 && end < 0 && start > end {
            return Ok(Reply::Bulk(Vec::new()));
        }
        if start < 0 {
            start += len;
        }
        if end < 0 {
            end += len;
        }
        start = start.max(0);
        end = end.max(0).min(len - 1);
        if len == 0 || start > end {
            return Ok(Reply::Bulk(Vec::new()));
        }
        Ok(Reply::Bulk(s[start as usize..=end as usize].to_vec()))
    }

    fn set(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() < 2 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'set' command".into(),
            ));
        }
        let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
        let mut expire: Option<i64> = None;
        let mut i = 2;
        while i < a.len() {
            let opt = a[i].to_ascii_lowercase();
            match opt.as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"get" => get = true,
                b"keepttl" => keepttl = true,
                b"px" | b"ex" | b"pxat" | b"exat" => {
                    let Some(n) = a.get(i + 1).and_then(|v| int_of(v)) else {
                        return Err(Reply::Err(NOT_INT.into()));
                    };
                    if n <= 0 {
                        return Err(Reply::Err(
                            "ERR invalid expire time in 'set' command".into(),
                        ));
                    }
                    let now = self.now_ms();
                    expire = Some(match opt.as_slice() {
                        b"px" => now + n,
                        b"ex" => now + n * 1000,
                        b"pxat" => n,
                        _ => n * 1000,
                    });
                    i += 1;
                }
                _ => return Err(Reply::Err(SYNTAX.into())),
            }
            i += 1;
        }
        if (nx && xx) || (keepttl && expire.is_some()) {
            return Err(Reply::Err(SYNTAX.into()));
        }
        let key = &a[0];
        let old = self.live(key).map(|e| (e.val.clone(), e.expire_ms));
        let old_str = match &old {
            None => None,
            Some((Val::Str(s), _)) => Some(s.clone()),
            Some(_) if get => return Err(Reply::Err(WRONGTYPE.into())),
            Some(_) => None,
        };
        let present = old.is_some();
        let answer = |done: bool| {
            if get {
                old_str.clone().map_or(Reply::Nil, Reply::Bulk)
            } else if done {
                Reply::Status("OK".into())
            } else {
                Reply::Nil
            }
        };
        if (nx && present) || (xx && !present) {
            return Ok(answer(false));
        }
        let expire_ms = if keepttl {
            old.and_then(|o| o.1)
        } else {
            expire
        };
        self.map.insert(
            key.clone(),
            Entry {
                val: Val::Str(a[1].clone()),
                expire_ms,
            },
        );
        Ok(answer(true))
    }

    fn pttl(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let now = self.now_ms();
        Ok(Reply::Int(match a.first().and_then(|k| self.live(k)) {
            None => -2,
            Some(Entry {
                expire_ms: None, ..
            }) => -1,
            Some(Entry {
                expire_ms: Some(at),
                ..
            }) => (*at - now).max(0),
        }))
    }

    fn pexpire(&mut self, a: &[Vec<u8>], absolute: bool) -> Result<Reply, Reply> {
        if a.len() != 2 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'pexpire' command".into(),
            ));
        }
        let Some(n) = int_of(&a[1]) else {
            return Err(Reply::Err(NOT_INT.into()));
        };
        let now = self.now_ms();
        let at = if absolute { n } else { now + n };
        if self.live(&a[0]).is_none() {
            return Ok(Reply::Int(0));
        }
        if at <= now {
            self.map.remove(&a[0]);
        } else if let Some(e) = self.map.get_mut(&a[0]) {
            e.expire_ms = Some(at);
        }
        Ok(Reply::Int(1))
    }

    fn rename(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() != 2 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'rename' command".into(),
            ));
        }
        if self.live(&a[0]).is_none() {
            return Err(Reply::Err("ERR no such key".into()));
        }
        if let Some(e) = self.map.remove(&a[0]) {
            self.map.insert(a[1].clone(), e);
        }
        Ok(Reply::Status("OK".into()))
    }

    fn type_of(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let t = match a.first().and_then(|k| self.live(k)).map(|e| &e.val) {
            None => "none",
            Some(Val::Str(_)) => "string",
            Some(Val::Hash(_)) => "hash",
            Some(Val::List(_)) => "list",
            Some(Val::ZSet(_)) => "zset",
        };
        Ok(Reply::Status(t.into()))
    }

    fn incr(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let key = a.first().ok_or_else(|| Reply::Err(SYNTAX.into()))?;
        let n = match self.string(key)? {
            None => 0,
            Some(s) => int_of(s).ok_or_else(|| Reply::Err(NOT_INT.into()))?,
        } + 1;
        let expire_ms = self.live(key).and_then(|e| e.expire_ms);
        self.map.insert(
            key.clone(),
            Entry {
                val: Val::Str(n.to_string().into_bytes()),
                expire_ms,
            },
        );
        Ok(Reply::Int(n))
    }

    fn hset(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() < 3 || a.len().is_multiple_of(2) {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'hset' command".into(),
            ));
        }
        let h = self.hash(&a[0], true)?.expect("created");
        let mut added = 0;
        for p in a[1..].chunks(2) {
            if h.insert(p[0].clone(), p[1].clone()).is_none() {
                added += 1;
            }
        }
        Ok(Reply::Int(added))
    }

    fn hdel(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let Some(h) = self.hash(&a[0], false)? else {
            return Ok(Reply::Int(0));
        };
        Ok(Reply::Int(
            a[1..].iter().filter(|f| h.remove(*f).is_some()).count() as i64,
        ))
    }

    fn lpop(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let count = match a.get(1) {
            None => None,
            Some(c) => Some(
                int_of(c)
                    .filter(|c| *c >= 0)
                    .ok_or_else(|| Reply::Err(NOT_INT.into()))?,
            ),
        };
        let Some(l) = self.list(&a[0], false)? else {
            return Ok(Reply::Nil);
        };
        match count {
            None => Ok(l.pop_front().map_or(Reply::Nil, Reply::Bulk)),
            Some(c) => {
                let mut out = Vec::new();
                for _ in 0..c {
                    match l.pop_front() {
                        Some(v) => out.push(Reply::Bulk(v)),
                        None => break,
                    }
                }
                Ok(Reply::Arr(out))
            }
        }
    }

    fn lrem(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let count = int_of(&a[1]).ok_or_else(|| Reply::Err(NOT_INT.into()))?;
        let Some(l) = self.list(&a[0], false)? else {
            return Ok(Reply::Int(0));
        };
        let mut removed = 0i64;
        let limit = if count == 0 { i64::MAX } else { count.abs() };
        if count >= 0 {
            let mut i = 0;
            while i < l.len() && removed < limit {
                if l[i] == a[2] {
                    l.remove(i);
                    removed += 1;
                } else {
                    i += 1;
                }
            }
        } else {
            let mut i = l.len();
            while i > 0 && removed < limit {
                i -= 1;
                if l[i] == a[2] {
                    l.remove(i);
                    removed += 1;
                }
            }
        }
        Ok(Reply::Int(removed))
    }

    fn zadd(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        let key = a.first().ok_or_else(|| Reply::Err(SYNTAX.into()))?;
        let (mut nx, mut xx, mut gt, mut lt, mut ch, mut incr) =
            (false, false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match a[i].to_ascii_lowercase().as_slice() {
                b"nx" => nx = true,
                b"xx" => xx = true,
                b"gt" => gt = true,
                b"lt" => lt = true,
                b"ch" => ch = true,
                b"incr" => incr = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return Err(Reply::Err(SYNTAX.into()));
        }
        if (nx && xx) || (gt && lt) || (nx && (gt || lt)) {
            return Err(Reply::Err(
                "ERR GT, LT, and/or NX options at the same time are not compatible".into(),
            ));
        }
        if incr && pairs.len() != 2 {
            return Err(Reply::Err(
                "ERR INCR option supports a single increment-element pair".into(),
            ));
        }
        let mut parsed = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks(2) {
            parsed.push((
                score_of(&p[0]).ok_or_else(|| Reply::Err(NOT_FLOAT.into()))?,
                p[1].clone(),
            ));
        }
        let z = self.zset(key, true)?.expect("created");
        let (mut added, mut changed) = (0i64, 0i64);
        let mut last = None;
        for (score, member) in parsed {
            match z.get(&member).copied() {
                None => {
                    if xx {
                        continue;
                    }
                    z.insert(member, score);
                    added += 1;
                    last = Some(score);
                }
                Some(old) => {
                    if nx {
                        continue;
                    }
                    let new = if incr { old + score } else { score };
                    if (gt && new <= old) || (lt && new >= old) {
                        continue;
                    }
                    if new != old {
                        changed += 1;
                    }
                    z.insert(member, new);
                    last = Some(new);
                }
            }
        }
        if incr {
            return Ok(last.map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(s))));
        }
        Ok(Reply::Int(if ch { added + changed } else { added }))
    }

    fn zrange(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() < 3 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'zrange' command".into(),
            ));
        }
        let mut scores = false;
        for o in &a[3..] {
            if o.eq_ignore_ascii_case(b"withscores") {
                scores = true;
            } else {
                return Err(Reply::Err(SYNTAX.into()));
            }
        }
        let (Some(s), Some(e)) = (int_of(&a[1]), int_of(&a[2])) else {
            return Err(Reply::Err(NOT_INT.into()));
        };
        let Some(z) = self.zset(&a[0], false)? else {
            return Ok(Reply::Arr(vec![]));
        };
        let o = ordered(z);
        let mut out = Vec::new();
        if let Some((s, e)) = index_range(s, e, o.len()) {
            for (m, sc) in &o[s..=e] {
                out.push(Reply::Bulk((*m).clone()));
                if scores {
                    out.push(Reply::Bulk(fmt_score(*sc)));
                }
            }
        }
        Ok(Reply::Arr(out))
    }

    fn zrangebyscore(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() < 3 {
            return Err(Reply::Err(
                "ERR wrong number of arguments for 'zrangebyscore' command".into(),
            ));
        }
        let (Some(min), Some(max)) = (bound_of(&a[1]), bound_of(&a[2])) else {
            return Err(Reply::Err("ERR min or max is not a float".into()));
        };
        let mut scores = false;
        let mut limit: Option<(usize, i64)> = None;
        let mut i = 3;
        while i < a.len() {
            if a[i].eq_ignore_ascii_case(b"withscores") {
                scores = true;
            } else if a[i].eq_ignore_ascii_case(b"limit") && i + 2 < a.len() {
                let off = int_of(&a[i + 1]).ok_or_else(|| Reply::Err(NOT_INT.into()))?;
                let n = int_of(&a[i + 2]).ok_or_else(|| Reply::Err(NOT_INT.into()))?;
                limit = Some((usize::try_from(off).unwrap_or(0), n));
                i += 2;
            } else {
                return Err(Reply::Err(SYNTAX.into()));
            }
            i += 1;
        }
        let Some(z) = self.zset(&a[0], false)? else {
            return Ok(Reply::Arr(vec![]));
        };
        let mut out = Vec::new();
        let matching = ordered(z)
            .into_iter()
            .filter(|(_, s)| in_range(*s, min, max));
        let (skip, take) = match limit {
            None => (0, usize::MAX),
            Some((off, n)) => (off, if n < 0 { usize::MAX } else { n as usize }),
        };
        for (m, sc) in matching.skip(skip).take(take) {
            out.push(Reply::Bulk(m.clone()));
            if scores {
                out.push(Reply::Bulk(fmt_score(sc)));
            }
        }
        Ok(Reply::Arr(out))
    }

    /// ZSCAN key cursor [MATCH pattern] [COUNT n]: the whole set in one reply (cursor 0), as
    /// Redis answers for a small set (listpack encoding).
    fn zscan(&mut self, a: &[Vec<u8>]) -> Result<Reply, Reply> {
        if a.len() < 2 || int_of(&a[1]).is_none() {
            return Err(Reply::Err("ERR invalid cursor".into()));
        }
        let mut pattern: Option<Vec<u8>> = None;
        let mut i = 2;
        while i + 1 < a.len() + 1 && i < a.len() {
            if a[i].eq_ignore_ascii_case(b"match") && i + 1 < a.len() {
                pattern = Some(a[i + 1].clone());
            } else if a[i].eq_ignore_ascii_case(b"count") && i + 1 < a.len() {
                int_of(&a[i + 1]).ok_or_else(|| Reply::Err(NOT_INT.into()))?;
            } else {
                return Err(Reply::Err(SYNTAX.into()));
            }
            i += 2;
        }
        let mut out = Vec::new();
        if let Some(z) = self.zset(&a[0], false)? {
            for (m, s) in ordered(z) {
                if pattern.as_ref().is_none_or(|p| glob(p, m)) {
                    out.push(Reply::Bulk(m.clone()));
                    out.push(Reply::Bulk(fmt_score(s)));
                }
            }
        }
        Ok(Reply::Arr(vec![
            Reply::Bulk(b"0".to_vec()),
            Reply::Arr(out),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(db: &mut Db, args: &[&str]) -> Reply {
        let v: Vec<Vec<u8>> = args.iter().map(|s| s.as_bytes().to_vec()).collect();
        db.command(&v)
    }

    #[test]
    fn strings_and_expiry_answer_as_redis() {
        let mut db = Db {
            now_us: 5_000_000,
            ..Db::default()
        };
        assert_eq!(
            run(&mut db, &["SET", "k", "v", "nx", "px", "100"]),
            Reply::Status("OK".into())
        );
        assert_eq!(
            run(&mut db, &["set", "k", "w", "nx", "px", "100"]),
            Reply::Nil
        );
        assert_eq!(run(&mut db, &["pttl", "k"]), Reply::Int(100));
        assert_eq!(
            run(&mut db, &["set", "k", "x", "get"]),
            Reply::Bulk(b"v".to_vec())
        );
        assert_eq!(run(&mut db, &["pttl", "k"]), Reply::Int(-1));
        assert_eq!(run(&mut db, &["set", "n", "1", "get"]), Reply::Nil);
        run(&mut db, &["pexpire", "k", "50"]);
        assert_eq!(
            run(&mut db, &["set", "k", "y", "keepttl", "xx"]),
            Reply::Status("OK".into())
        );
        assert_eq!(run(&mut db, &["pttl", "k"]), Reply::Int(50));
        run(&mut db, &["set", "r", "gen|owner"]);
        for (start, end, want) in [
            ("0", "3", "gen|"),
            ("0", "99", "gen|owner"),
            ("-5", "-1", "owner"),
            ("4", "2", ""),
            ("0", "-1", "gen|owner"),
        ] {
            assert_eq!(
                run(&mut db, &["getrange", "r", start, end]),
                Reply::Bulk(want.as_bytes().to_vec()),
                "GETRANGE r {start} {end}"
            );
        }
        assert_eq!(
            run(&mut db, &["getrange", "none", "0", "3"]),
            Reply::Bulk(Vec::new())
        );
        db.now_us += 50_000;
        assert_eq!(run(&mut db, &["get", "k"]), Reply::Nil);
        assert_eq!(run(&mut db, &["pttl", "k"]), Reply::Int(-2));
        assert_eq!(
            run(&mut db, &["rename", "k", "m"]),
            Reply::Err("ERR no such key".into())
        );
        run(&mut db, &["hset", "h", "owner", "x"]);
        assert_eq!(run(&mut db, &["get", "h"]), Reply::Err(WRONGTYPE.into()));
        assert_eq!(
            run(&mut db, &["set", "h", "1", "get"]),
            Reply::Err(WRONGTYPE.into())
        );
        assert_eq!(run(&mut db, &["type", "h"]), Reply::Status("hash".into()));
        assert_eq!(run(&mut db, &["hexists", "h", "owner"]), Reply::Int(1));
    }

    #[test]
    fn sorted_sets_answer_as_redis() {
        let mut db = Db::default();
        assert_eq!(
            run(&mut db, &["zadd", "z", "5", "a", "+inf", "w"]),
            Reply::Int(2)
        );
        assert_eq!(run(&mut db, &["zadd", "z", "gt", "3", "a"]), Reply::Int(0));
        assert_eq!(
            run(&mut db, &["zscore", "z", "a"]),
            Reply::Bulk(b"5".to_vec())
        );
        assert_eq!(run(&mut db, &["zcount", "z", "(5", "+inf"]), Reply::Int(1));
        assert_eq!(run(&mut db, &["zcount", "z", "(5", "(+inf"]), Reply::Int(0));
        assert_eq!(
            run(&mut db, &["zrange", "z", "0", "0", "withscores"]),
            Reply::Arr(vec![Reply::Bulk(b"a".to_vec()), Reply::Bulk(b"5".to_vec())])
        );
        assert_eq!(
            run(&mut db, &["zremrangebyscore", "z", "-inf", "5"]),
            Reply::Int(1)
        );
        assert_eq!(run(&mut db, &["zrem", "z", "w"]), Reply::Int(1));
        assert_eq!(run(&mut db, &["exists", "z"]), Reply::Int(0));
        assert!(glob(b"ab*", b"abc") && !glob(b"ab*", b"xabc") && glob(b"a?c", b"abc"));
    }
}
