//! A [`Mutex`](crate::Mutex)'s lock value, as the server stores it: the one parse of it on
//! the client side (the scripts in `scripts/*.lua` read it by the same layout, described in
//! `scripts/acquire.lua` and `docs/key-layout.md`).
//!
//! - held, short form: `GEN|OWNER|B|S|US` (a fresh grant: count 1, `REQ` = `GEN`, no `REL`,
//!   the implied token `S * 1000000 + US`);
//! - held, long form: `GEN|OWNER|B|S|US|COUNT|REQ|REL|TOKEN` (`TOKEN` empty: the implied one);
//! - either ending in `|w`: a waiter flagged it.

use crate::protocol::lua::{SEPARATOR, WAITING};

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
    /// The server clock at the grant: seconds and microseconds (`TIME`).
    pub(crate) granted: (u64, u64),
    /// A waiter flagged it: its release publishes.
    pub(crate) waiters: bool,
}

impl Held {
    /// The grant's time by the server clock, in microseconds since the epoch.
    pub(crate) fn granted_us(&self) -> u64 {
        self.granted
            .0
            .saturating_mul(1_000_000)
            .saturating_add(self.granted.1)
    }
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
    let granted: (u64, u64) = (f[3].parse().ok()?, f[4].parse().ok()?);
    let implied = granted.0.checked_mul(1_000_000)?.checked_add(granted.1)?;
    let (count, token) = if f.len() == 9 {
        let token = if f[8].is_empty() {
            implied
        } else {
            f[8].parse().ok()?
        };
        (f[5].parse().ok()?, token)
    } else {
        (1, implied)
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
        assert_eq!(h.granted, (1_700_000_000, 5));
        assert_eq!(h.granted_us(), 1_700_000_000_000_005);
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
}
