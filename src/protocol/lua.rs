//! Each script's Lua source as the client sends it, built once per process: a header of
//! `local NAME = value` lines generated from the Rust constants the scripts share with this
//! crate (the largest hand-off block, the fencing memory's bounds, the bytes of the lock value's layout),
//! the shared helpers of `scripts/prelude/*.lua`, and the script's own body (`scripts/*.lua`).
//!
//! Redis runs a script's whole text on every call: every `local` costs an instruction and every
//! `local function` a closure (an allocation, and work for the collector), each call. So a
//! script gets only the constants and helpers it names (and those they name in turn), each put
//! as late as it can be: a body may hold a line [`MARKER`] after its fast path; what the text
//! before that line names comes first, everything else only at that line, so that a fast path
//! that returns early never builds the slow paths' helpers.
//!
//! The constants are defined here, a module that imports nothing of the crate, so that the
//! value's parser (`lock_value.rs`) and the scripts' calls (`scripts.rs`) both take them from
//! one place.
//!
//! A prelude file is a list of items separated by blank lines: an item is its comment, its
//! `local` line(s) at the start of a line, and its body, with no blank line inside; a paragraph
//! without a `local` line (a file's own comment) is left out.

use std::collections::HashSet;

/// The most tokens a Mutex acquisition reserves for local hand-offs (`MAX_BLOCK` in the
/// scripts; the client's `MAX_HANDOFF_COUNT` is defined as this one).
pub(crate) const MAX_BLOCK: u32 = 1024;

/// The last byte of a flagged value (which ends in `|w`): a waiter flagged it, so its release
/// publishes (`FLAG_W` in the scripts).
pub(crate) const WAITING: u8 = b'w';
/// The separator of a value's fields (`BAR` in the scripts).
pub(crate) const SEPARATOR: u8 = b'|';

/// How far a function library's fencing mark reaches past the last token its grants issued,
/// in microseconds (`RESERVE` in the scripts): the mark is written once per this much clock
/// time on a busy hash slot instead of by every grant (`scripts/prelude/fence.lua`, "The
/// memory").
pub(crate) const RESERVE_US: u64 = 1_000;

/// The most fencing marks a function library remembers (`MAX_MARKS` in the scripts); past it
/// the memory starts again empty, so that a server with locks on every hash slot keeps it
/// small.
pub(crate) const MAX_MARKS: u64 = 4_096;

/// The line that declares the memory a function library keeps of the fencing marks: none
/// (`nil`) in a script sent with `EVALSHA`, whose Lua state keeps nothing between calls. A
/// function library (`library.rs`) takes the line out of its functions' bodies and declares
/// `MARKS` once, for the library, where it lasts from call to call.
pub(crate) const NO_MARKS: &str =
    "local MARKS = nil -- no memory of the fencing marks in a script (see library.rs)\n";

/// The line of a body after which its slow paths begin: the helpers that only they need are
/// put there.
pub(crate) const MARKER: &str = "-- @helpers";

/// The shared helpers, in the order a script defines them (an item may only name items above
/// it).
const PRELUDE: [&str; 4] = [
    include_str!("scripts/prelude/common.lua"),
    include_str!("scripts/prelude/held.lua"),
    include_str!("scripts/prelude/fence.lua"),
    include_str!("scripts/prelude/rw.lua"),
];

/// The constants the scripts share with the Rust code: name, value, and what it is.
pub(crate) fn constants() -> [(&'static str, u64, &'static str); 5] {
    [
        (
            "MAX_BLOCK",
            u64::from(MAX_BLOCK),
            "the most tokens a Mutex grant reserves for local hand-offs",
        ),
        (
            "RESERVE",
            RESERVE_US,
            "how far past its grants a library's fencing mark reaches, in microseconds",
        ),
        (
            "MAX_MARKS",
            MAX_MARKS,
            "the most fencing marks a library remembers",
        ),
        (
            "FLAG_W",
            u64::from(WAITING),
            "'w': a flagged value's last byte",
        ),
        ("BAR", u64::from(SEPARATOR), "'|': the fields' separator"),
    ]
}

/// One item of the prelude: the names it defines, and its text.
#[derive(Debug)]
struct Item {
    names: Vec<String>,
    text: String,
}

/// The generated constants, then the prelude files' items, in order.
fn pool() -> Vec<Item> {
    let header =
        constants().map(|(name, value, what)| format!("local {name} = {value} -- {what}\n"));
    let prelude = PRELUDE.iter().flat_map(|file| file.split("\n\n"));
    // Each line of the header, and the memory's, is an item of its own, as a prelude item is.
    header
        .iter()
        .map(String::as_str)
        .chain([NO_MARKS])
        .chain(prelude)
        .filter_map(|chunk| {
            let names = defined(chunk);
            let text = format!("{}\n", chunk.trim_matches('\n'));
            (!names.is_empty()).then_some(Item { names, text })
        })
        .collect()
}

/// The names a chunk of Lua defines at its top level: its lines `local function NAME` and
/// `local NAME, ...` that start at the line's start.
fn defined(chunk: &str) -> Vec<String> {
    chunk
        .lines()
        .filter_map(|line| line.strip_prefix("local "))
        .flat_map(|rest| {
            let rest = rest.strip_prefix("function ").unwrap_or(rest);
            // The names before the value or the parameters.
            rest.split(['=', '(']).next().unwrap_or("").split(',')
        })
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The identifiers a piece of Lua names, comments left out.
fn identifiers(lua: &str) -> HashSet<&str> {
    lua.lines()
        .map(|l| l.split_once("--").map_or(l, |(code, _)| code))
        .flat_map(|code| code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The items (their indexes in `pool`, in order) that `names` need, directly or through other
/// items, leaving out those of `have`.
fn needed<'a>(pool: &'a [Item], mut names: HashSet<&'a str>, have: &[usize]) -> Vec<usize> {
    let mut take = Vec::new();
    for (i, item) in pool.iter().enumerate().rev() {
        if have.contains(&i) || !item.names.iter().any(|n| names.contains(n.as_str())) {
            continue;
        }
        take.push(i);
        names.extend(identifiers(&item.text));
    }
    take.reverse();
    take
}

/// The source of the script whose body is `body`: the constants and helpers its fast path (the
/// text before [`MARKER`], or all of it) names, that text, then at the marker's place those
/// the rest names and the rest.
pub(crate) fn assemble(body: &str) -> String {
    let pool = pool();
    // The fast path keeps the line break before the marker's line.
    let (fast, slow) = match body.split_once(&format!("\n{MARKER}\n")) {
        Some((fast, slow)) => (&body[..=fast.len()], slow),
        None => (body, ""),
    };
    let early = needed(&pool, identifiers(fast), &[]);
    let late = needed(&pool, identifiers(slow), &early);
    let mut out = String::with_capacity(body.len() * 2);
    for (items, text) in [(early, fast), (late, slow)] {
        if !text.is_empty() {
            out.extend(items.into_iter().map(|i| pool[i].text.as_str()));
            out.push_str(text);
        }
    }
    out
}

/// The scripts of a function library, split so that the library defines the constants and
/// helpers once, at its top, for all its functions: the `local` lines and helpers that any of
/// `bodies` names (in the order a script defines them), and each body without its [`MARKER`]
/// line. A function then closes over them instead of building them on every call.
pub(crate) fn library_parts(bodies: &[&str]) -> (String, Vec<String>) {
    let pool = pool();
    let names = bodies.iter().flat_map(|b| identifiers(b)).collect();
    let header = needed(&pool, names, &[])
        .into_iter()
        .map(|i| pool[i].text.as_str())
        .collect();
    let bodies = bodies
        .iter()
        .map(|b| {
            b.lines()
                .filter(|l| *l != MARKER)
                .flat_map(|l| [l, "\n"])
                .collect()
        })
        .collect();
    (header, bodies)
}

/// Every generated constant as its `local` line.
#[cfg(test)]
pub(crate) fn header() -> String {
    let pool = pool();
    let all: Vec<usize> = (0..constants().len()).collect();
    all.iter().map(|&i| pool[i].text.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_carries_the_rust_values() {
        let header = header();
        assert!(header.contains(&format!("local MAX_BLOCK = {MAX_BLOCK} ")));
        assert!(header.contains(&format!("local FLAG_W = {} ", b'w')));
        assert!(header.contains(&format!("local BAR = {} ", b'|')));
        assert_eq!(header.lines().count(), constants().len());
    }

    #[test]
    fn every_prelude_item_defines_names_of_its_own() {
        let pool = pool();
        let mut seen = HashSet::new();
        for item in &pool {
            for n in &item.names {
                assert!(seen.insert(n.clone()), "{n} defined twice");
            }
            // No blank line inside an item: it would have been cut in two.
            let opens = item.text.matches("function").count();
            let ends = item
                .text
                .lines()
                .filter(|l| *l == "end" || l.ends_with(" end"))
                .count();
            assert!(opens == 0 || ends >= 1, "{:?} is cut", item.names);
        }
        assert!(pool.iter().any(|i| i.names == ["parse_held"]));
    }

    #[test]
    fn a_script_gets_what_it_names_and_the_fast_path_first() {
        let body = "local t = redis.call('time')\nif t then\n  return MAX_BLOCK\nend\n-- @helpers\nreturn parse_held(ARGV[1])\n";
        let s = assemble(body);
        let at = |needle: &str| s.find(needle).unwrap_or(usize::MAX);
        // The fast path's constant comes first; the slow path's helper, and what it names
        // (held_fields, FLAG_W, BAR), after the fast path.
        assert!(at("local MAX_BLOCK =") < at("local t ="));
        for late in [
            "local function parse_held",
            "local function held_fields",
            "local FLAG_W",
            "local BAR",
        ] {
            assert!(at("return MAX_BLOCK") < at(late), "{late}");
            assert!(at(late) < at("return parse_held"), "{late}");
        }
        assert!(at("local function held_fields") < at("local function parse_held"));
        assert!(!s.contains(MARKER));
        assert!(!s.contains("local function encode_held"));
        assert!(!s.contains("local RESERVE"));
        // A body that names nothing of the prelude is sent as it is.
        assert_eq!(assemble("return 1\n"), "return 1\n");
    }
}
