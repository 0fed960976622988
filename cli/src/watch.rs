//! `watch`: the release channels' names and messages, what changed between two reads of the
//! list, the frame it draws, and its loop.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::args::Kind;
use crate::exit::Failure;
use crate::model::LockView;
use crate::render::{printable, shortened, table, who};

/// How often the list is re-read.
pub const REREAD_EVERY: Duration = Duration::from_secs(1);

/// The least time between two redraws caused by messages (a busy lock publishes often).
pub const REDRAW_GAP: Duration = Duration::from_millis(100);

/// The most characters of a proclaimed value an event line shows.
pub const VALUE_SHOWN: usize = 60;

/// How many events the frame keeps below the table.
pub const EVENTS_SHOWN: usize = 20;

/// ANSI: clear the screen and move the cursor home.
pub const CLEAR: &str = "\x1b[2J\x1b[H";

/// `name` as it stands between the braces of its keys and channels: `%`, `{`, `}`
/// percent-encoded (see the library's docs/key-layout.md).
pub fn encode_name(name: &str) -> String {
    name.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// The inverse of [`encode_name`].
pub fn decode_name(encoded: &str) -> String {
    encoded
        .replace("%7D", "}")
        .replace("%7B", "{")
        .replace("%25", "%")
}

/// `s` with the characters special to a Redis glob pattern (`*`, `?`, `[`, `]`, `\`)
/// escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The one `PSUBSCRIBE` pattern that covers the channels of every lock under `prefix` whose
/// name starts with `name_prefix`: `P{T*` (each channel is `P{T}:...`, and an encoded name
/// holds no brace, so a longer name's channels match too and nothing else does).
pub fn pattern(prefix: &str, name_prefix: &str) -> String {
    format!(
        "{}{{{}*",
        glob_escape(prefix),
        glob_escape(&encode_name(name_prefix))
    )
}

/// A message heard on a release channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The lock's name.
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// What happened, in words.
    pub what: String,
}

/// What a message on `channel` (with `payload`) says, for the key prefix `prefix`; `None`
/// for a channel that is not one of the release channels.
///
/// The channels are those the library publishes on, after the name's braces: `:released`
/// (a mutex), `:sem:released`, `:rw:open` and `:rw:free`, `:fair:grant:...` (the next
/// waiter's, with its token), and `:elect:changes`, an election's, whose messages say
/// `elected` (a new leader), `proclaimed` (a new value) or `released` (the leadership
/// ended).
pub fn decode_channel(prefix: &str, channel: &str, payload: &str) -> Option<Published> {
    let rest = channel.strip_prefix(prefix)?.strip_prefix('{')?;
    let (encoded, suffix) = rest.split_once('}')?;
    let (kind, what) = match suffix {
        ":released" => (Kind::Mutex, "released (a waiter is woken)".to_owned()),
        ":sem:released" => (Kind::Semaphore, "permit released".to_owned()),
        ":rw:open" => (Kind::RwLock, "open to readers".to_owned()),
        ":rw:free" => (Kind::RwLock, "free for a writer".to_owned()),
        ":elect:changes" => (
            Kind::Election,
            match payload {
                "elected" => "elected (a new leader)".to_owned(),
                "proclaimed" => "proclaimed (the leader's value changed)".to_owned(),
                "released" => "released (the leadership ended; a new election follows)".to_owned(),
                other => shortened(other, VALUE_SHOWN),
            },
        ),
        s if s.starts_with(":fair:grant:") => (
            Kind::FairMutex,
            if payload.is_empty() {
                "handed to the next waiter".to_owned()
            } else {
                format!("handed to the next waiter (token {})", printable(payload))
            },
        ),
        _ => return None,
    };
    Some(Published {
        name: decode_name(encoded),
        kind,
        what,
    })
}

/// What the pub/sub listener reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Subscribed (first, or again after a loss).
    Listening,
    /// A message on a release channel.
    Message(Published),
    /// The connection failed or could not be opened; it is tried again.
    Lost(String),
}

/// One line below the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When it was seen.
    pub at: SystemTime,
    /// What, in words.
    pub text: String,
}

/// `HH:MM:SS.mmm` of `t`, UTC.
pub fn utc_clock(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        (s % 3600) / 60,
        s % 60,
        d.subsec_millis()
    )
}

/// What makes one holding: the lock, the holder, and its fencing token (a new acquisition
/// of a fenced lock has a new one; a new leadership of an election has a new term).
type HoldingKey = (String, Kind, String, String, u64);

/// One holding as an event names it, and the value its lock's leader proclaimed.
type Holding = (String, Option<String>);

fn holdings(locks: &[LockView]) -> HashMap<HoldingKey, Holding> {
    let mut out = HashMap::new();
    for lock in locks {
        for h in &lock.holders {
            let mut text = format!("{} \"{}\" by {}", lock.kind, printable(&lock.name), who(h));
            if lock.kind == Kind::RwLock {
                text.push_str(if lock.shared { " (read)" } else { " (write)" });
            }
            if lock.kind == Kind::Election {
                text.push_str(&format!(", term {}", h.fencing_token));
            } else if h.fencing_token != 0 {
                text.push_str(&format!(", token {}", h.fencing_token));
            }
            if lock.kind == Kind::Semaphore && h.hold_count != 1 {
                text.push_str(&format!(", {} permits", h.hold_count));
            }
            out.insert(
                (
                    lock.name.clone(),
                    lock.kind,
                    h.label.clone(),
                    h.thread.clone(),
                    h.fencing_token,
                ),
                (text, lock.value.clone()),
            );
        }
    }
    out
}

/// What a leader proclaimed, as an event line shows it (`-` when nothing).
fn value_text(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| shortened(v, VALUE_SHOWN))
}

/// The acquisitions and releases between two reads of the list, releases first, each in
/// name order; then the values that election leaders proclaimed in between (an acquisition
/// says its leader's value when it has one).
pub fn diff(before: &[LockView], after: &[LockView], at: SystemTime) -> Vec<Event> {
    let (old, new) = (holdings(before), holdings(after));
    let mut released: Vec<(&HoldingKey, &Holding)> =
        old.iter().filter(|(k, _)| !new.contains_key(*k)).collect();
    let mut acquired: Vec<(&HoldingKey, &Holding)> =
        new.iter().filter(|(k, _)| !old.contains_key(*k)).collect();
    let mut proclaimed: Vec<(&HoldingKey, &Holding)> = new
        .iter()
        .filter(|(k, (_, v))| old.get(*k).is_some_and(|(_, was)| was != v))
        .collect();
    released.sort();
    acquired.sort();
    proclaimed.sort();
    released
        .into_iter()
        .map(|(_, (t, _))| format!("released  {t}"))
        .chain(acquired.into_iter().map(|(_, (t, v))| match v {
            Some(v) => format!("acquired  {t}, value {}", value_text(Some(v))),
            None => format!("acquired  {t}"),
        }))
        .chain(
            proclaimed
                .into_iter()
                .map(|(_, (t, v))| format!("proclaimed {t}: {}", value_text(v.as_deref()))),
        )
        .map(|text| Event { at, text })
        .collect()
}

/// The event of a message heard on a release channel.
pub fn heard_event(p: &Published, at: SystemTime) -> Event {
    Event {
        at,
        text: format!("published {} \"{}\" {}", p.kind, printable(&p.name), p.what),
    }
}

/// What the first line of a frame says besides the time.
#[derive(Debug, Clone)]
pub struct Header {
    /// The key prefix.
    pub prefix: String,
    /// The name prefix watched.
    pub name_prefix: String,
    /// Where the releases come from: the release channels, or the re-read alone (a cluster,
    /// a quorum client).
    pub channels: bool,
    /// The topology, as the frame names it when it has no channels (`cluster`, `redlock`).
    pub topology: &'static str,
}

/// One frame: a `locksmith watch` line, the table (or that nothing is held), and the latest
/// events, oldest first.
pub fn frame(
    header: &Header,
    listening: bool,
    now: SystemTime,
    locks: &[LockView],
    events: &VecDeque<Event>,
) -> String {
    let source = match (header.channels, listening) {
        (true, true) => "releases heard on the release channels".to_owned(),
        (true, false) => "release channels not connected; re-read once a second".to_owned(),
        (false, _) => format!("{}: re-read once a second", header.topology),
    };
    let mut out = format!(
        "locksmith watch  prefix \"{}\"  names \"{}*\"  {} UTC  {}\n\n",
        printable(&header.prefix),
        printable(&header.name_prefix),
        utc_clock(now),
        source
    );
    if locks.is_empty() {
        out.push_str("(no lock held)\n");
    } else {
        out.push_str(&table(locks));
    }
    out.push('\n');
    if events.is_empty() {
        out.push_str("(no change seen yet)\n");
    } else {
        for e in events {
            out.push_str(&format!("{}  {}\n", utc_clock(e.at), e.text));
        }
    }
    out
}

/// The watch loop: reads the list (`fetch`), draws a frame, then redraws on each re-read
/// (every [`REREAD_EVERY`]) and on messages from `heard` (at most every [`REDRAW_GAP`]),
/// until `frames` frames were drawn (forever with `None`).
///
/// A failed first read ends it with that failure; later ones are shown as events and the
/// last table is kept. `clear` starts each frame with [`CLEAR`]; otherwise frames are
/// separated by a blank line.
pub fn run(
    header: &Header,
    frames: Option<u64>,
    mut fetch: impl FnMut() -> Result<Vec<LockView>, Failure>,
    heard: Option<&Receiver<Heard>>,
    clear: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut listening = false;
    let mut events: VecDeque<Event> = VecDeque::new();
    let push = |events: &mut VecDeque<Event>, e: Event| {
        events.push_back(e);
        while events.len() > EVENTS_SHOWN {
            events.pop_front();
        }
    };
    // The listener says first whether it subscribed, so that nothing published after the
    // first read is missed.
    if let Some(rx) = heard {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Heard::Listening) => listening = true,
            Ok(Heard::Lost(why)) => push(
                &mut events,
                Event {
                    at: SystemTime::now(),
                    text: format!("release channels not connected: {why}"),
                },
            ),
            Ok(Heard::Message(_)) | Err(_) => {}
        }
    }
    let mut locks = fetch()?;
    LockView::sort(&mut locks);
    let mut drawn: u64 = 0;
    let mut draw = |locks: &[LockView], events: &VecDeque<Event>, listening: bool| {
        let text = frame(header, listening, SystemTime::now(), locks, events);
        let prefix = if clear {
            CLEAR
        } else if drawn > 0 {
            "\n"
        } else {
            ""
        };
        drawn += 1;
        let written = out
            .write_all(prefix.as_bytes())
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush());
        written.map(|()| drawn)
    };
    let done = |drawn: u64| frames.is_some_and(|n| drawn >= n);
    // A closed stdout (`| head`) ends the view.
    let Ok(n) = draw(&locks, &events, listening) else {
        return Ok(());
    };
    if done(n) {
        return Ok(());
    }
    let mut next_read = Instant::now() + REREAD_EVERY;
    let mut last_draw = Instant::now();
    let mut dirty = false;
    loop {
        let now = Instant::now();
        let wake = if dirty {
            next_read.min(last_draw + REDRAW_GAP)
        } else {
            next_read
        };
        let wait = wake.saturating_duration_since(now);
        let got = match heard {
            Some(rx) => rx.recv_timeout(wait),
            None => {
                std::thread::sleep(wait);
                Err(RecvTimeoutError::Timeout)
            }
        };
        match got {
            Ok(Heard::Message(p)) => {
                push(&mut events, heard_event(&p, SystemTime::now()));
                dirty = true;
                continue;
            }
            Ok(Heard::Listening) => {
                if !listening {
                    listening = true;
                    push(
                        &mut events,
                        Event {
                            at: SystemTime::now(),
                            text: "release channels connected".to_owned(),
                        },
                    );
                    dirty = true;
                }
                continue;
            }
            Ok(Heard::Lost(why)) => {
                if listening {
                    push(
                        &mut events,
                        Event {
                            at: SystemTime::now(),
                            text: format!("release channels lost: {why}"),
                        },
                    );
                    dirty = true;
                }
                listening = false;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                // The listener ended: re-reads alone from now on.
                listening = false;
                std::thread::sleep(wait);
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if now >= next_read {
            match fetch() {
                Ok(mut fresh) => {
                    LockView::sort(&mut fresh);
                    for e in diff(&locks, &fresh, SystemTime::now()) {
                        push(&mut events, e);
                    }
                    locks = fresh;
                }
                Err(f) => push(
                    &mut events,
                    Event {
                        at: SystemTime::now(),
                        text: format!("re-read failed: {}", f.message),
                    },
                ),
            }
            next_read = Instant::now() + REREAD_EVERY;
        } else if !(dirty && now >= last_draw + REDRAW_GAP) {
            continue;
        }
        let Ok(n) = draw(&locks, &events, listening) else {
            return Ok(());
        };
        last_draw = Instant::now();
        dirty = false;
        if done(n) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::render::tests::{election, holder, lock};
    use std::sync::mpsc;

    #[test]
    fn names_encode_and_decode() {
        for name in ["a", "a{b}%c", "%7B", "é{名前}", "{}"] {
            assert_eq!(decode_name(&encode_name(name)), name);
            assert!(!encode_name(name).contains(['{', '}']));
        }
        assert_eq!(encode_name("a{b}%"), "a%7Bb%7D%25");
    }

    #[test]
    fn the_pattern_covers_the_names_with_the_prefix_and_escapes_globs() {
        assert_eq!(pattern("locksmith:", ""), "locksmith:{*");
        assert_eq!(pattern("locksmith:", "orders:"), "locksmith:{orders:*");
        assert_eq!(pattern("p*:", "a?{[x]}\\"), "p\\*:{a\\?%7B\\[x\\]%7D\\\\*");
    }

    #[test]
    fn release_channels_decode_to_name_type_and_what() {
        let p = decode_channel("locksmith:", "locksmith:{a%7Bb%7D}:released", "released").unwrap();
        assert_eq!((p.name.as_str(), p.kind), ("a{b}", Kind::Mutex));
        let p = decode_channel("locksmith:", "locksmith:{x}:sem:released", "released").unwrap();
        assert_eq!(
            (p.kind, p.what.as_str()),
            (Kind::Semaphore, "permit released")
        );
        let p = decode_channel("locksmith:", "locksmith:{x}:rw:open", "open").unwrap();
        assert_eq!((p.kind, p.what.as_str()), (Kind::RwLock, "open to readers"));
        let p = decode_channel("locksmith:", "locksmith:{x}:rw:free", "free").unwrap();
        assert_eq!(
            (p.kind, p.what.as_str()),
            (Kind::RwLock, "free for a writer")
        );
        let p = decode_channel("locksmith:", "locksmith:{x:y}:fair:grant:abc:1", "42").unwrap();
        assert_eq!(p.kind, Kind::FairMutex);
        assert_eq!(p.name, "x:y");
        assert!(p.what.contains("token 42"));
        assert_eq!(decode_channel("locksmith:", "locksmith:{x}:lock", ""), None);
        assert_eq!(decode_channel("other:", "locksmith:{x}:released", ""), None);
        assert_eq!(
            decode_channel("locksmith:", "locksmith:x:released", ""),
            None
        );
    }

    #[test]
    fn an_elections_channel_decodes_to_what_its_message_says() {
        let said = |payload| {
            let p = decode_channel(
                "locksmith:",
                "locksmith:{jobs%7B1%7D}:elect:changes",
                payload,
            )
            .unwrap();
            assert_eq!((p.name.as_str(), p.kind), ("jobs{1}", Kind::Election));
            p.what
        };
        assert_eq!(said("elected"), "elected (a new leader)");
        assert_eq!(
            said("proclaimed"),
            "proclaimed (the leader's value changed)"
        );
        assert_eq!(
            said("released"),
            "released (the leadership ended; a new election follows)"
        );
        assert_eq!(said("other\n"), "other\\n");
        // The channel's namesake keys and the value key are no channels.
        assert_eq!(
            decode_channel("locksmith:", "locksmith:{x}:elect", ""),
            None
        );
        assert_eq!(
            decode_channel("locksmith:", "locksmith:{x}:elect:value", ""),
            None
        );
        // The pattern of `watch` covers it.
        assert!(pattern("locksmith:", "jobs").starts_with("locksmith:{jobs"));
        let e = heard_event(
            &decode_channel("locksmith:", "locksmith:{s}:elect:changes", "elected").unwrap(),
            UNIX_EPOCH,
        );
        assert_eq!(e.text, "published election \"s\" elected (a new leader)");
    }

    #[test]
    fn diff_says_new_leaders_with_their_term_and_new_values() {
        let t = SystemTime::now();
        let none = election("s", 7, None);
        let said = election("s", 7, Some("10.0.0.7:8080"));
        let next = election("s", 8, Some("10.0.0.9:8080"));
        let texts = |a: &[LockView], b: &[LockView]| -> Vec<String> {
            diff(a, b, t).into_iter().map(|e| e.text).collect()
        };
        assert_eq!(
            texts(&[], std::slice::from_ref(&none)),
            ["acquired  election \"s\" by scheduler-2 (thread campaign), term 7"]
        );
        assert_eq!(
            texts(std::slice::from_ref(&none), std::slice::from_ref(&said)),
            ["proclaimed election \"s\" by scheduler-2 (thread campaign), term 7: 10.0.0.7:8080"]
        );
        assert_eq!(
            texts(std::slice::from_ref(&said), std::slice::from_ref(&next)),
            [
                "released  election \"s\" by scheduler-2 (thread campaign), term 7",
                "acquired  election \"s\" by scheduler-2 (thread campaign), term 8, value \
                 10.0.0.9:8080",
            ]
        );
        let long = election("s", 8, Some(&"x".repeat(1000)));
        let e = texts(std::slice::from_ref(&next), std::slice::from_ref(&long));
        assert!(
            e[0].ends_with(&format!(": {}…", "x".repeat(VALUE_SHOWN - 1))),
            "{e:?}"
        );
    }

    #[test]
    fn diff_finds_acquisitions_and_releases() {
        let t = SystemTime::now();
        let a = lock("a", Kind::Mutex, vec![holder("app", "w1", 1, 10)]);
        let a2 = lock("a", Kind::Mutex, vec![holder("app", "w2", 1, 11)]);
        let b = lock("b", Kind::Semaphore, vec![holder("x", "t", 2, 0)]);
        let one = std::slice::from_ref(&a);
        assert!(diff(one, one, t).is_empty());
        let e = diff(one, &[a2, b], t);
        let texts: Vec<&str> = e.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "released  mutex \"a\" by app (thread w1), token 10",
                "acquired  mutex \"a\" by app (thread w2), token 11",
                "acquired  semaphore \"b\" by x (thread t), 2 permits",
            ]
        );
    }

    #[test]
    fn a_frame_has_a_header_the_table_and_the_events() {
        let header = Header {
            prefix: "locksmith:".into(),
            name_prefix: "or".into(),
            channels: true,
            topology: "server",
        };
        let mut events = VecDeque::new();
        let text = frame(&header, true, UNIX_EPOCH, &[], &events);
        assert!(
            text.starts_with(
                "locksmith watch  prefix \"locksmith:\"  names \"or*\"  00:00:00.000 UTC"
            ),
            "{text}"
        );
        assert!(text.contains("release channels") && text.contains("(no lock held)"));
        events.push_back(Event {
            at: UNIX_EPOCH + Duration::from_millis(3_723_004),
            text: "released  x".into(),
        });
        let text = frame(
            &Header {
                channels: false,
                topology: "cluster",
                ..header
            },
            false,
            UNIX_EPOCH,
            &[lock("orders", Kind::Mutex, vec![holder("a", "b", 1, 1)])],
            &events,
        );
        assert!(text.contains("cluster: re-read once a second"), "{text}");
        assert!(text.contains("NAME") && text.contains("orders"), "{text}");
        assert!(text.contains("01:02:03.004  released  x"), "{text}");
    }

    #[test]
    fn once_draws_one_frame_without_clearing() {
        let header = Header {
            prefix: "p:".into(),
            name_prefix: String::new(),
            channels: false,
            topology: "cluster",
        };
        let mut out = Vec::new();
        let mut reads = 0;
        run(
            &header,
            Some(1),
            || {
                reads += 1;
                Ok(vec![lock("n", Kind::Mutex, vec![holder("a", "b", 1, 1)])])
            },
            None,
            false,
            &mut out,
        )
        .unwrap();
        assert_eq!(reads, 1);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("locksmith watch"), "{text}");
        assert!(!text.contains('\x1b'));
        assert_eq!(text.matches("locksmith watch").count(), 1);
    }

    #[test]
    fn messages_redraw_and_rereads_show_changes() {
        let header = Header {
            prefix: "p:".into(),
            name_prefix: String::new(),
            channels: true,
            topology: "server",
        };
        let (tx, rx) = mpsc::channel();
        tx.send(Heard::Listening).unwrap();
        tx.send(Heard::Message(Published {
            name: "s".into(),
            kind: Kind::Semaphore,
            what: "permit released".into(),
        }))
        .unwrap();
        let mut reads = 0;
        let mut out = Vec::new();
        run(
            &header,
            Some(3),
            || {
                reads += 1;
                Ok(if reads == 1 {
                    vec![lock("s", Kind::Semaphore, vec![holder("a", "b", 1, 0)])]
                } else {
                    vec![]
                })
            },
            Some(&rx),
            true,
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let frames: Vec<&str> = text.split(CLEAR).filter(|f| !f.is_empty()).collect();
        assert_eq!(frames.len(), 3, "{text}");
        assert!(frames[0].contains("s ") && frames[0].contains("(no change seen yet)"));
        assert!(
            frames[1].contains("published semaphore \"s\" permit released"),
            "{}",
            frames[1]
        );
        assert!(frames[2].contains("released  semaphore \"s\" by a (thread b)"));
        assert!(frames[2].contains("(no lock held)"));
        assert_eq!(reads, 2);
    }

    #[test]
    fn a_failed_first_read_ends_the_watch() {
        let header = Header {
            prefix: "p:".into(),
            name_prefix: String::new(),
            channels: false,
            topology: "cluster",
        };
        let f = run(
            &header,
            None,
            || Err(Failure::redis("down")),
            None,
            false,
            &mut Vec::new(),
        )
        .unwrap_err();
        assert_eq!(f.message, "down");
    }
}
