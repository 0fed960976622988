//! The holders' values as the server stores them, parsed: the one parse of each on the client
//! side (the scripts in `scripts/*.lua` read them by the same layouts).
//!
//! A [`Mutex`](crate::Mutex)'s lock value ([`parse`]; its layout is described in
//! `scripts/acquire.lua` and `docs/key-layout.md`):
//!
//! - held, short form: `GEN|OWNER|B|S|US` (a fresh grant: count 1, `REQ` = `GEN`, no `REL`,
//!   the implied token `S * 1000000 + US`);
//! - held, long form: `GEN|OWNER|B|S|US|COUNT|REQ|REL|TOKEN` (`TOKEN` empty: the implied one);
//! - either ending in `|w`: a waiter flagged it.
//!
//! The other lock types' holders ([`parse_held`], by their [`Shape`]), as an operator's calls
//! return them.

use crate::protocol::lua::{SEPARATOR, WAITING};
use crate::protocol::scripts;

/// A held lock's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The acquisition: the acquiring call's request id (the lock's `gen`).
    pub(crate) acquisition: String,
    /// The owner id (client id, thread, label and thread name; never a `|`).
    pub(crate) owner: String,
    /// Re-entry levels the server counts.
    pub(crate) count: u64,
    /// The acquisition's fencing token.
    pub(crate) token: u64,
    /// The last token reserved for the acquisition's local hand-offs (`token + B`).
    pub(crate) upto: u64,
    /// The server clock at the grant, in microseconds since the epoch (`S * 1000000 + US`).
    pub(crate) granted: u64,
    /// A waiter flagged it: its release publishes.
    pub(crate) waiters: bool,
}

/// Parses a Mutex lock key's string; `None` when it is not a held value (a key locksmith did
/// not write).
pub(crate) fn parse(v: &str) -> Option<Held> {
    let (body, waiters) = match v.as_bytes() {
        [.., SEPARATOR, WAITING] => (&v[..v.len() - 2], true),
        _ => (v, false),
    };
    let f: Vec<&str> = body.split(char::from(SEPARATOR)).collect();
    if (f.len() != 5 && f.len() != 9) || f[0].is_empty() {
        return None;
    }
    let block: u64 = f[2].parse().ok()?;
    let granted = micros(f[3], f[4])?;
    // The long form's count, and its token when not the implied one.
    let count = f.get(5).map_or(Some(1), |c| c.parse().ok())?;
    let token = match f.get(8) {
        Some(t) if !t.is_empty() => t.parse().ok()?,
        _ => granted,
    };
    Some(Held {
        acquisition: f[0].to_owned(),
        owner: f[1].to_owned(),
        count,
        token,
        upto: token.checked_add(block)?,
        granted,
        waiters,
    })
}

/// What a holder's value (or sorted set member) says: its owner id, its count (levels, or
/// permits), its fencing token (0 where none) and the server clock at its grant in µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderValue {
    pub(crate) owner: String,
    pub(crate) count: u32,
    pub(crate) token: u64,
    pub(crate) since_us: Option<u64>,
}

/// The server clock at a grant, from its `S` and `US` fields, in µs.
fn micros(s: &str, us: &str) -> Option<u64> {
    scripts::micros(s.parse().ok()?, us.parse().ok()?)
}

/// A value's fields, its trailing flags (`|` and letters) left out.
fn fields(v: &str) -> Vec<&str> {
    let mut f: Vec<&str> = v.split('|').collect();
    if f.len() > 1
        && f.last()
            .is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        f.pop();
    }
    f
}

/// The kinds of holder values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A fair mutex: `GEN|OWNER|S|US`, or `GEN|OWNER|S|US|REQ|REL|COUNT`; a token.
    Fair,
    /// A read-write lock's writer: `GEN|OWNER|S|US`; a token.
    Writer,
    /// A reader: `GEN|OWNER|S|US`; no token.
    Reader,
    /// A semaphore's holder: `GEN|OWNER|N|S|US`; no token.
    Permits,
}

/// Parses a holder's value of `shape`, as the scripts' `i` and `f` operations return them.
pub(crate) fn parse_held(v: &str, shape: Shape) -> Option<HolderValue> {
    let f = fields(v);
    let (owner, count, s, us) = match (shape, f.as_slice()) {
        (Shape::Permits, [_, owner, n, s, us]) => (owner, n.parse().ok()?, s, us),
        (Shape::Fair, [_, owner, s, us, rest @ ..]) if rest.is_empty() || rest.len() == 3 => (
            owner,
            rest.get(2).map_or(Some(1), |c| c.parse().ok())?,
            s,
            us,
        ),
        (Shape::Writer | Shape::Reader, [_, owner, s, us]) => (owner, 1, s, us),
        _ => return None,
    };
    let since = micros(s, us)?;
    Some(HolderValue {
        owner: (*owner).to_owned(),
        count,
        // The grant time is the token of the types that have one.
        token: if matches!(shape, Shape::Fair | Shape::Writer) {
            since
        } else {
            0
        },
        since_us: Some(since),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(v: &str) -> Held {
        parse(v).unwrap_or_else(|| panic!("{v}: not a held value"))
    }

    #[test]
    fn the_short_form_implies_count_one_and_the_clock_token() {
        let h = held("g1|id:7/web-1%3A42/w|16|1700000000|5");
        assert_eq!(h.acquisition, "g1");
        assert_eq!(h.owner, "id:7/web-1%3A42/w");
        assert_eq!(h.count, 1);
        assert_eq!(h.token, 1_700_000_000_000_005);
        assert_eq!(h.upto, h.token + 16);
        assert_eq!(h.granted, 1_700_000_000_000_005);
        assert!(!h.waiters);
    }

    #[test]
    fn the_long_form_and_the_flag() {
        let h = held("g1|o|0|1700000000|5|3|r2|r9||w");
        assert_eq!((h.count, h.waiters), (3, true));
        assert_eq!(h.token, 1_700_000_000_000_005);
        let explicit = held("g1|o|0|1700000000|5|1|g1||42");
        assert_eq!((explicit.token, explicit.upto), (42, 42));
        // A release id ending in `w` is not the flag.
        let rel = held("g1|o|0|1700000000|5|1|g1|rw|");
        assert!(!rel.waiters);
    }

    #[test]
    fn foreign_strings() {
        assert_eq!(parse("#123"), None);
        assert_eq!(parse("not a lock"), None);
        assert_eq!(parse("a|b|c"), None);
        assert_eq!(parse("|o|0|1|2"), None);
        assert_eq!(parse("g|o|x|1|2"), None);
        assert_eq!(parse("g|o|0|99999999999999999|2"), None);
    }

    fn value(owner: &str, count: u32, token: u64, since_us: Option<u64>) -> Option<HolderValue> {
        Some(HolderValue {
            owner: owner.to_owned(),
            count,
            token,
            since_us,
        })
    }

    #[test]
    fn holder_values_parse() {
        let since = 1_764_000_000_000_042;
        let token = since;
        assert_eq!(
            parse_held("g|o:1/web/t|1764000000|42", Shape::Fair),
            value("o:1/web/t", 1, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|r||3|w", Shape::Fair),
            value("o", 3, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|wd", Shape::Writer),
            value("o", 1, token, Some(since))
        );
        assert_eq!(
            parse_held("g|o|1764000000|42|w", Shape::Reader),
            value("o", 1, 0, Some(since))
        );
        assert_eq!(
            parse_held("g|o|3|1764000000|42", Shape::Permits),
            value("o", 3, 0, Some(since))
        );
        for bad in ["", "x", "g|o|s|us", "g|o|1|2|3", "o:1/g"] {
            assert_eq!(parse_held(bad, Shape::Writer), None, "{bad}");
        }
    }
}
