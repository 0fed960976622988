//! The output: the table of `list`, its JSON lines, the text of `show`, durations.
//!
//! An election shows as a lock of type `election` whose one holder is its leader, whose
//! fencing token is the leader's term, and whose value is what the leader proclaimed.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use crate::args::Kind;
use crate::model::{HolderView, LockView};

/// A duration as a person reads it: `350ms`, `12.4s`, `4m05s`, `2h03m`, `3d04h`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        // Tenths, rounded down, so that "1.0s" never stands for 999 ms.
        format!("{}.{}s", s, d.subsec_millis() / 100)
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600)
    }
}

/// `s` with its control characters escaped (`\n`, `\t`, `\u{1b}`, ...), so that a lock name
/// or label can neither break a table row nor send terminal escapes.
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as [`printable`], cut to at most `max` characters (the cut marked with `…`): a
/// proclaimed value may be long (up to 64 KiB), and a table row or an event line is one line.
pub fn shortened(s: &str, max: usize) -> String {
    let shown = printable(s);
    if shown.chars().count() <= max {
        return shown;
    }
    let mut out: String = shown.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// How the type shows in the table: the `--type` name, and for an `rw_lock` whether readers
/// (`read`) or the writer (`write`) hold it.
fn kind_cell(lock: &LockView) -> String {
    match lock.kind {
        Kind::RwLock if lock.holders.is_empty() => "rw_lock".to_owned(),
        Kind::RwLock if lock.shared => "rw_lock (read)".to_owned(),
        Kind::RwLock => "rw_lock (write)".to_owned(),
        k => k.as_str().to_owned(),
    }
}

fn waiters_cell(w: Option<usize>) -> String {
    w.map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// The columns of the table, and whether each is right-aligned (numbers).
const COLUMNS: [(&str, bool); 9] = [
    ("NAME", false),
    ("TYPE", false),
    ("HOLDER", false),
    ("THREAD", false),
    ("COUNT", true),
    ("HELD FOR", true),
    ("LEASE LEFT", true),
    ("TOKEN", true),
    ("WAITERS", true),
];

/// The table of `list` (and of `watch`): a header, then one row per holder (a lock with only
/// waiters left takes one row with `-` for its holder). Columns are two spaces apart.
pub fn table(locks: &[LockView]) -> String {
    let mut rows: Vec<[String; 9]> = Vec::new();
    for lock in locks {
        let name = printable(&lock.name);
        let kind = kind_cell(lock);
        let waiters = waiters_cell(lock.waiters);
        if lock.holders.is_empty() {
            let dash = || "-".to_owned();
            rows.push([
                name,
                kind,
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                waiters,
            ]);
            continue;
        }
        for h in &lock.holders {
            rows.push([
                name.clone(),
                kind.clone(),
                printable(&h.label),
                printable(&h.thread),
                h.hold_count.to_string(),
                duration(h.held_for),
                duration(h.lease_left),
                h.fencing_token.to_string(),
                waiters.clone(),
            ]);
        }
    }
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([COLUMNS[i].0.len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..COLUMNS.len()).map(width).collect();
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if COLUMNS[i].1 {
                text.extend(std::iter::repeat_n(' ', pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if i + 1 < cells.len() {
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&COLUMNS.map(|(h, _)| h.to_owned()));
    for row in &rows {
        line(row);
    }
    out
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn holder_json(h: &HolderView) -> Value {
    json!({
        "label": h.label,
        "thread": h.thread,
        "hold_count": h.hold_count,
        "fencing_token": h.fencing_token,
        "held_for_ms": millis(h.held_for),
        "lease_left_ms": millis(h.lease_left),
    })
}

/// One lock as a JSON object (one line of `list --json`): `name`, `type`, `shared`,
/// `waiters` (null where the type keeps no count), `value` (what an election's leader
/// proclaimed; null when nothing was, and for the other types), `holders` (every holder),
/// and the first holder's fields at the top level (null when only waiters are left).
pub fn json(lock: &LockView) -> Value {
    let mut obj = json!({
        "name": lock.name,
        "type": lock.kind.as_str(),
        "shared": lock.shared,
        "waiters": lock.waiters,
        "value": lock.value,
        "holders": lock.holders.iter().map(holder_json).collect::<Vec<_>>(),
    });
    let first = lock.first().map(holder_json).unwrap_or_else(|| {
        json!({
            "label": null, "thread": null, "hold_count": null, "fencing_token": null,
            "held_for_ms": null, "lease_left_ms": null,
        })
    });
    if let (Some(obj), Value::Object(first)) = (obj.as_object_mut(), first) {
        obj.extend(first);
    }
    obj
}

/// The locks as JSON Lines: one object ([`json()`]) per line.
pub fn json_lines(locks: &[LockView]) -> String {
    let mut out = String::new();
    for lock in locks {
        out.push_str(&json(lock).to_string());
        out.push('\n');
    }
    out
}

/// `label` and thread of a holder, as a phrase: `web-1 (thread worker-3)`.
pub fn who(h: &HolderView) -> String {
    let label = if h.label.is_empty() {
        "(no label)".to_owned()
    } else {
        printable(&h.label)
    };
    format!("{label} (thread {})", printable(&h.thread))
}

/// The state of a lock in a few words: `held`, `read-held by 3 readers`, `4 permits held by
/// 2 holders`, `not held`; for an election `led (term 7)` or `no leader`.
pub fn state(lock: &LockView) -> String {
    let n = lock.holders.len();
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    match lock.kind {
        Kind::Election => match lock.first() {
            Some(leader) => format!("led (term {})", leader.fencing_token),
            None => "no leader".to_owned(),
        },
        _ if n == 0 => "not held".to_owned(),
        Kind::RwLock if lock.shared => format!("read-held by {}", plural(n, "reader", "readers")),
        Kind::RwLock => "write-held".to_owned(),
        Kind::Semaphore => {
            let permits: u64 = lock.holders.iter().map(|h| u64::from(h.hold_count)).sum();
            format!(
                "{} held by {}",
                if permits == 1 {
                    "1 permit".to_owned()
                } else {
                    format!("{permits} permits")
                },
                plural(n, "holder", "holders")
            )
        }
        _ => "held".to_owned(),
    }
}

fn waiters_line(lock: &LockView) -> String {
    match (lock.kind, lock.waiters) {
        (Kind::FairMutex, Some(n)) => format!("{n} in its queue"),
        (Kind::RwLock, Some(n)) => format!("{n} (writers and readers)"),
        (_, Some(n)) => n.to_string(),
        (Kind::Election, None) => {
            "not counted (an election keeps no count of its candidates)".to_owned()
        }
        (k, None) => format!("not counted (a {k} keeps no count)"),
    }
}

/// The leader of an election, in `show`: who, its term, what it proclaimed (`-` when
/// nothing), how long ago it was elected, and its lease left.
fn leader_lines(out: &mut String, lock: &LockView, h: &HolderView) {
    let _ = writeln!(out, "  leader: {}", who(h));
    let _ = writeln!(out, "    {:<14}{}", "term", h.fencing_token);
    let value = lock
        .value
        .as_deref()
        .map_or_else(|| "-".to_owned(), printable);
    let _ = writeln!(out, "    {:<14}{value}", "value");
    let _ = writeln!(out, "    {:<14}{} ago", "elected", duration(h.held_for));
    let _ = writeln!(out, "    {:<14}{}", "lease left", duration(h.lease_left));
}

/// The text of `show`: per lock type, its state, its waiters, and each holder with its
/// hold count, fencing token, time held and lease left; for an election, its leader with its
/// term and the value it proclaimed.
pub fn show(locks: &[LockView]) -> String {
    let mut out = String::new();
    for (i, lock) in locks.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "{} \"{}\": {}",
            lock.kind,
            printable(&lock.name),
            state(lock)
        );
        let _ = writeln!(out, "  waiters: {}", waiters_line(lock));
        if lock.kind == Kind::Election {
            if let Some(h) = lock.first() {
                leader_lines(&mut out, lock, h);
            }
            continue;
        }
        let many = lock.holders.len() > 1;
        for (j, h) in lock.holders.iter().enumerate() {
            let role = match lock.kind {
                Kind::RwLock if lock.shared => "reader",
                Kind::RwLock => "writer",
                Kind::Semaphore => "permit holder",
                _ => "holder",
            };
            let role = if many {
                format!("{role} {}", j + 1)
            } else {
                role.to_owned()
            };
            let count_label = if lock.kind == Kind::Semaphore {
                "permits"
            } else {
                "hold count"
            };
            let _ = writeln!(out, "  {role}: {}", who(h));
            let _ = writeln!(out, "    {count_label:<14}{}", h.hold_count);
            let _ = writeln!(out, "    {:<14}{}", "fencing token", h.fencing_token);
            let _ = writeln!(out, "    {:<14}{}", "held for", duration(h.held_for));
            let _ = writeln!(out, "    {:<14}{}", "lease left", duration(h.lease_left));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    pub(crate) fn holder(label: &str, thread: &str, count: u32, token: u64) -> HolderView {
        HolderView {
            label: label.into(),
            thread: thread.into(),
            hold_count: count,
            fencing_token: token,
            held_for: Duration::from_millis(12_400),
            lease_left: Duration::from_millis(17_650),
        }
    }

    pub(crate) fn lock(name: &str, kind: Kind, holders: Vec<HolderView>) -> LockView {
        LockView {
            name: name.into(),
            kind,
            shared: false,
            waiters: match kind {
                Kind::Mutex | Kind::Election => None,
                _ => Some(0),
            },
            holders,
            value: None,
        }
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        let ms = Duration::from_millis;
        assert_eq!(duration(ms(0)), "0ms");
        assert_eq!(duration(ms(999)), "999ms");
        assert_eq!(duration(ms(1000)), "1.0s");
        assert_eq!(duration(ms(12_490)), "12.4s");
        assert_eq!(duration(ms(59_999)), "59.9s");
        assert_eq!(duration(ms(245_000)), "4m05s");
        assert_eq!(duration(Duration::from_secs(2 * 3600 + 180)), "2h03m");
        assert_eq!(
            duration(Duration::from_secs(3 * 86_400 + 4 * 3600)),
            "3d04h"
        );
    }

    #[test]
    fn the_table_has_one_row_per_holder_in_aligned_columns() {
        let mut rw = lock(
            "catalog",
            Kind::RwLock,
            vec![
                holder("web-1", "req-17", 1, 0),
                holder("web-2", "req-3", 2, 0),
            ],
        );
        rw.shared = true;
        rw.waiters = Some(1);
        let locks = vec![
            lock(
                "orders:42",
                Kind::Mutex,
                vec![holder("billing-1", "worker-3", 1, 1_767_225_600_123_456)],
            ),
            rw,
            lock("q", Kind::FairMutex, vec![]),
        ];
        let text = table(&locks);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with("NAME"), "{text}");
        for h in [
            "TYPE",
            "HOLDER",
            "THREAD",
            "COUNT",
            "HELD FOR",
            "LEASE LEFT",
            "TOKEN",
            "WAITERS",
        ] {
            assert!(lines[0].contains(h), "{text}");
        }
        assert!(lines[1].contains("orders:42") && lines[1].contains("billing-1"));
        assert!(lines[1].contains("1767225600123456") && lines[1].contains("12.4s"));
        assert!(lines[1].contains("17.6s") && lines[1].trim_end().ends_with('-'));
        assert!(lines[2].contains("rw_lock (read)") && lines[2].contains("web-1"));
        assert!(lines[3].contains("rw_lock (read)") && lines[3].contains("web-2"));
        assert!(lines[4].starts_with("q ") && lines[4].contains("fair_mutex"));
        // Aligned: every row's TYPE column starts where the header's does.
        let col = lines[0].find("TYPE").unwrap();
        for l in &lines[1..] {
            assert_ne!(l.as_bytes()[col], b' ', "{text}");
            assert_eq!(&l[col - 2..col], "  ", "{text}");
        }
        // Right-aligned numbers end where their header ends.
        let end = lines[0].find("TOKEN").unwrap() + "TOKEN".len();
        assert!(lines[0].len() > end);
        assert!(lines[1][..end].ends_with("1767225600123456"), "{text}");
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        let locks = vec![lock(
            "a\nb\u{1b}[2J",
            Kind::Mutex,
            vec![holder("x\ty", "t", 1, 1)],
        )];
        let text = table(&locks);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.contains("a\\nb\\u{1b}[2J") && text.contains("x\\ty"),
            "{text}"
        );
        assert!(!show(&locks).contains('\u{1b}'));
    }

    #[test]
    fn json_has_the_first_holders_fields_and_every_holder() {
        let mut sem = lock(
            "pool",
            Kind::Semaphore,
            vec![holder("a", "t1", 2, 0), holder("b", "t2", 1, 0)],
        );
        sem.waiters = Some(3);
        let v = json(&sem);
        assert_eq!(v["name"], "pool");
        assert_eq!(v["type"], "semaphore");
        assert_eq!(v["label"], "a");
        assert_eq!(v["thread"], "t1");
        assert_eq!(v["hold_count"], 2);
        assert_eq!(v["fencing_token"], 0);
        assert_eq!(v["held_for_ms"], 12_400);
        assert_eq!(v["lease_left_ms"], 17_650);
        assert_eq!(v["waiters"], 3);
        assert_eq!(v["shared"], false);
        assert_eq!(v["holders"].as_array().unwrap().len(), 2);
        assert_eq!(v["holders"][1]["label"], "b");
        let m = json(&lock("m", Kind::Mutex, vec![holder("l", "t", 1, 9)]));
        assert_eq!(m["type"], "mutex");
        assert!(m["waiters"].is_null());
        let empty = json(&lock("f", Kind::FairMutex, vec![]));
        assert!(empty["label"].is_null() && empty["fencing_token"].is_null());
        let lines = json_lines(&[sem, lock("x", Kind::RwLock, vec![])]);
        assert_eq!(lines.lines().count(), 2);
        for l in lines.lines() {
            let _: Value = serde_json::from_str(l).unwrap();
        }
    }

    #[test]
    fn show_names_each_type_its_holders_and_its_queue() {
        let mut fair = lock("n", Kind::FairMutex, vec![holder("app", "w", 1, 77)]);
        fair.waiters = Some(2);
        let mut sem = lock(
            "n",
            Kind::Semaphore,
            vec![holder("a", "t1", 2, 0), holder("b", "t2", 1, 0)],
        );
        sem.waiters = Some(0);
        let text = show(&[
            lock("n", Kind::Mutex, vec![holder("m", "main", 3, 5)]),
            fair,
            sem,
        ]);
        assert!(text.contains("mutex \"n\": held\n"), "{text}");
        assert!(
            text.contains("not counted (a mutex keeps no count)"),
            "{text}"
        );
        assert!(text.contains("hold count    3"), "{text}");
        assert!(
            text.contains("fair_mutex \"n\": held\n  waiters: 2 in its queue"),
            "{text}"
        );
        assert!(text.contains("holder: app (thread w)"), "{text}");
        assert!(text.contains("fencing token 77"), "{text}");
        assert!(text.contains("3 permits held by 2 holders"), "{text}");
        assert!(text.contains("permit holder 2: b (thread t2)"), "{text}");
    }

    /// The election `name` led by `label`'s thread `thread` in `term`, with `value`.
    pub(crate) fn election(name: &str, term: u64, value: Option<&str>) -> LockView {
        let mut e = lock(
            name,
            Kind::Election,
            vec![holder("scheduler-2", "campaign", 1, term)],
        );
        e.value = value.map(str::to_owned);
        e
    }

    #[test]
    fn an_election_shows_its_leader_term_and_value() {
        let led = election("scheduler", 7, Some("10.0.0.7:8080"));
        let text = show(std::slice::from_ref(&led));
        assert_eq!(
            text,
            "election \"scheduler\": led (term 7)\n\
             \x20 waiters: not counted (an election keeps no count of its candidates)\n\
             \x20 leader: scheduler-2 (thread campaign)\n\
             \x20   term          7\n\
             \x20   value         10.0.0.7:8080\n\
             \x20   elected       12.4s ago\n\
             \x20   lease left    17.6s\n"
        );
        assert!(!text.contains("fencing token") && !text.contains("hold count"));
        let silent = show(&[election("scheduler", 8, None)]);
        assert!(silent.contains("    value         -\n"), "{silent}");
        let nobody = lock("scheduler", Kind::Election, vec![]);
        assert_eq!(state(&nobody), "no leader");
        assert!(!show(&[nobody]).contains("leader:"));
        // A value cannot send terminal escapes.
        let odd = show(&[election("s", 1, Some("a\nb\u{1b}[2J"))]);
        assert!(odd.contains("value         a\\nb\\u{1b}[2J\n"), "{odd}");
    }

    #[test]
    fn an_election_is_its_own_type_in_the_table_and_the_json() {
        let text = table(&[
            lock("a", Kind::Mutex, vec![holder("m", "t", 1, 3)]),
            election("scheduler", 7, Some("10.0.0.7:8080")),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let col = lines[0].find("TYPE").unwrap();
        assert!(lines[2][col..].starts_with("election "), "{text}");
        assert!(lines[2].contains("scheduler-2") && lines[2].contains("campaign"));
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(cells[cells.len() - 2..], ["7", "-"], "{text}");
        let v = json(&election("scheduler", 7, Some("10.0.0.7:8080")));
        assert_eq!(v["type"], "election");
        assert_eq!(v["value"], "10.0.0.7:8080");
        assert_eq!(v["fencing_token"], 7);
        assert_eq!(v["label"], "scheduler-2");
        assert_eq!(v["hold_count"], 1);
        assert!(v["waiters"].is_null());
        assert_eq!(v["holders"][0]["fencing_token"], 7);
        assert!(json(&election("e", 1, None))["value"].is_null());
        // The other types keep every field, and gain a null value.
        let m = json(&lock("m", Kind::Mutex, vec![holder("l", "t", 1, 9)]));
        assert!(m.as_object().unwrap().contains_key("value") && m["value"].is_null());
        assert_eq!(m.as_object().unwrap().len(), 12, "{m}");
    }

    #[test]
    fn long_values_are_shortened_on_one_line() {
        assert_eq!(shortened("abc", 3), "abc");
        assert_eq!(shortened("abcd", 3), "ab…");
        assert_eq!(shortened("a\nb", 10), "a\\nb");
    }

    #[test]
    fn states_in_words() {
        let mut rw = lock("r", Kind::RwLock, vec![holder("a", "t", 1, 0)]);
        assert_eq!(state(&rw), "write-held");
        rw.shared = true;
        assert_eq!(state(&rw), "read-held by 1 reader");
        assert_eq!(state(&lock("s", Kind::Semaphore, vec![])), "not held");
        assert_eq!(
            state(&lock("s", Kind::Semaphore, vec![holder("a", "t", 1, 0)])),
            "1 permit held by 1 holder"
        );
        assert_eq!(state(&election("e", 42, None)), "led (term 42)");
    }
}
