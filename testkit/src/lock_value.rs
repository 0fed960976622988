//! A `Mutex` lock's value on the server, as tests read it: the one parse of it that every test
//! uses (the layout is in `docs/key-layout.md` and `src/protocol/scripts/acquire.lua`).
//!
//! - held, short form: `GEN|OWNER|B|S|US` (count 1, req = GEN, no release id, the implied
//!   token `S * 1000000 + US`);
//! - held, long form: `GEN|OWNER|B|S|US|COUNT|REQ|REL|TOKEN` (an empty `TOKEN`: the implied one);
//! - either ending in `|w`: a waiter flagged it, so its release publishes.

use crate::names::lock_key;

/// A held `Mutex` lock's value, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockValue {
    /// The acquisition (the acquiring call's request id).
    pub acquisition: String,
    /// The owner id (client id and thread).
    pub owner: String,
    /// The hand-off block the acquisition reserved.
    pub block: u64,
    /// The server clock at the grant: seconds.
    pub s: u64,
    /// The server clock at the grant: microseconds within the second.
    pub us: u64,
    /// Re-entry levels the server counts.
    pub count: u64,
    /// The last acquire call that counted (the acquisition's own, or a re-entry's).
    pub req: String,
    /// The last inner release call that counted ('' when none).
    pub rel: String,
    /// The acquisition's fencing token.
    pub token: u64,
    /// The last token reserved for local hand-offs (`token + block`).
    pub upto: u64,
    /// Flagged by a waiter: the release publishes.
    pub waiters: bool,
    /// Stored in the long form.
    pub long: bool,
}

impl LockValue {
    /// Parses a held value; `None` for anything else (a foreign string).
    pub fn parse(v: &str) -> Option<LockValue> {
        let (body, waiters) = match v.strip_suffix("|w") {
            Some(b) => (b, true),
            None => (v, false),
        };
        let f: Vec<&str> = body.split('|').collect();
        if (f.len() != 5 && f.len() != 9) || f[0].is_empty() {
            return None;
        }
        let (s, us): (u64, u64) = (f[3].parse().ok()?, f[4].parse().ok()?);
        let implied = s * 1_000_000 + us;
        let block: u64 = f[2].parse().ok()?;
        let long = f.len() == 9;
        let (count, req, rel, token) = if long {
            let token = if f[8].is_empty() {
                implied
            } else {
                f[8].parse().ok()?
            };
            (f[5].parse().ok()?, f[6], f[7], token)
        } else {
            (1, f[0], "", implied)
        };
        Some(LockValue {
            acquisition: f[0].to_owned(),
            owner: f[1].to_owned(),
            block,
            s,
            us,
            count,
            req: req.to_owned(),
            rel: rel.to_owned(),
            token,
            upto: token + block,
            waiters,
            long,
        })
    }
}

/// What a `Mutex` lock key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// No key.
    Missing,
    /// A held value.
    Held(LockValue),
    /// Something else: a string that is not a lock value, or (`TYPE`) a key of another type.
    Other(String),
}

/// What the `Mutex` lock key `key` holds.
///
/// # Panics
/// If Redis cannot be asked.
pub fn lock_state_at(conn: &mut redis::Connection, key: &str) -> LockState {
    let v: redis::RedisResult<Option<String>> = redis::cmd("GET").arg(key).query(conn);
    match v {
        Ok(None) => LockState::Missing,
        Ok(Some(v)) => match LockValue::parse(&v) {
            Some(h) => LockState::Held(h),
            None => LockState::Other(v),
        },
        Err(e) if e.code() == Some("WRONGTYPE") => {
            let t: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
            LockState::Other(t)
        }
        Err(e) => panic!("GET {key}: {e}"),
    }
}

/// The held value of the `Mutex` lock key `key`; `None` when it is not held (missing, or
/// something else).
pub fn lock_value_at(conn: &mut redis::Connection, key: &str) -> Option<LockValue> {
    match lock_state_at(conn, key) {
        LockState::Held(h) => Some(h),
        _ => None,
    }
}

/// [`lock_value_at`] of the lock `name` (default prefix).
pub fn lock_value(conn: &mut redis::Connection, name: &str) -> Option<LockValue> {
    lock_value_at(conn, &lock_key(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_and_the_flag_parse() {
        let short = LockValue::parse("g1|own:7|16|1700000000|5").unwrap();
        assert_eq!(short.token, 1_700_000_000_000_005);
        assert_eq!(short.upto, short.token + 16);
        assert_eq!(
            (short.count, short.req.as_str(), short.waiters),
            (1, "g1", false)
        );
        let long = LockValue::parse("g1|own:7|0|1700000000|5|3|r2|r9||w").unwrap();
        assert_eq!(
            (long.count, long.rel.as_str(), long.waiters),
            (3, "r9", true)
        );
        assert_eq!(long.token, short.token);
        let explicit = LockValue::parse("g1|own:7|0|1700000000|5|1|g1||42").unwrap();
        assert_eq!((explicit.token, explicit.upto), (42, 42));
        assert_eq!(LockValue::parse("#123"), None);
        assert_eq!(LockValue::parse("a|b|c"), None);
    }
}
