//! `unlock`'s decisions: which lock of a name it frees, and whether the operator confirmed.

use std::io::{BufRead, Write};

use crate::args::Kind;
use crate::exit::Failure;
use crate::model::LockView;
use crate::render::{duration, printable, state, who};

/// The lock `unlock NAME [--type T]` frees, among the lock types that use `name` (what
/// `Client::lock_info` gave).
///
/// With `kind`, the lock of that type, held (else not found). Without it, the one held type
/// (not found when none is held; a usage error listing them when several are).
pub fn choose<'a>(
    name: &str,
    locks: &'a [LockView],
    kind: Option<Kind>,
) -> Result<&'a LockView, Failure> {
    let held: Vec<&LockView> = locks.iter().filter(|l| !l.holders.is_empty()).collect();
    let shown = printable(name);
    if let Some(kind) = kind {
        return held.into_iter().find(|l| l.kind == kind).ok_or_else(|| {
            Failure::not_found(if kind == Kind::Election {
                format!("the election \"{shown}\" has no leader")
            } else {
                format!("nothing holds the {kind} \"{shown}\"")
            })
        });
    }
    match held.as_slice() {
        [] => Err(Failure::not_found(format!(
            "nothing holds a lock named \"{shown}\""
        ))),
        [one] => Ok(one),
        many => {
            let kinds: Vec<&str> = many.iter().map(|l| l.kind.as_str()).collect();
            Err(Failure::usage(format!(
                "several lock types named \"{shown}\" are held: {}; say which with --type \
                 (e.g. --type {})",
                kinds.join(", "),
                kinds[0]
            )))
        }
    }
}

/// The confirmation question for freeing `lock`: its type, name and holder(s); for an
/// election, its leader and term, and that a new election follows.
pub fn question(lock: &LockView) -> String {
    if let (Kind::Election, Some(h)) = (lock.kind, lock.first()) {
        return format!(
            "End the leadership of the election \"{}\" (led by {}, term {}, elected {} ago)? \
             A new election follows among its candidates; the leader finds out at its next \
             renewal at the latest. [y/N] ",
            printable(&lock.name),
            who(h),
            h.fencing_token,
            duration(h.held_for)
        );
    }
    let holders = match lock.holders.as_slice() {
        [] => "nobody".to_owned(),
        [h] if h.fencing_token == 0 => format!("{}, held for {}", who(h), duration(h.held_for)),
        [h] => format!(
            "{}, token {}, held for {}",
            who(h),
            h.fencing_token,
            duration(h.held_for)
        ),
        [h, rest @ ..] => format!("{} and {} more", who(h), rest.len()),
    };
    let state = state(lock);
    let described = if state == "held" {
        format!("held by {holders}")
    } else {
        format!("{state}: {holders}")
    };
    format!(
        "Force-unlock the {} \"{}\" ({described})? Its holder loses it at its next renewal at \
         the latest. [y/N] ",
        lock.kind,
        printable(&lock.name),
    )
}

/// What `unlock` prints once `lock` was freed: its type, name and former holder(s); for an
/// election, its former leader and term, and that a new election follows.
pub fn unlocked(lock: &LockView) -> String {
    let shown = printable(&lock.name);
    if let (Kind::Election, Some(h)) = (lock.kind, lock.first()) {
        return format!(
            "force-unlocked the election \"{shown}\": ended the leadership of {} (term {}); \
             a new election follows\n",
            who(h),
            h.fencing_token
        );
    }
    let by = match lock.holders.as_slice() {
        [h] => who(h),
        [h, rest @ ..] => format!("{} and {} more", who(h), rest.len()),
        [] => "nobody".to_owned(),
    };
    format!(
        "force-unlocked the {} \"{shown}\" (it was held by {by})\n",
        lock.kind
    )
}

/// Asks `question` on `out` and reads the answer from `input`, unless `yes`.
///
/// Without `yes`: refused when stdin is not a terminal (`stdin_is_terminal` false: a script
/// must say `--yes`), and unless the answer is `y` or `yes` (any case).
pub fn confirm(
    yes: bool,
    stdin_is_terminal: bool,
    question: &str,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !stdin_is_terminal {
        return Err(Failure::refused(
            "refusing to force-unlock without a confirmation: stdin is not a terminal; \
             pass --yes to unlock without asking",
        ));
    }
    let asked = out
        .write_all(question.as_bytes())
        .and_then(|()| out.flush());
    if let Err(e) = asked {
        return Err(Failure::refused(format!(
            "could not ask for a confirmation: {e}"
        )));
    }
    let mut answer = String::new();
    if let Err(e) = input.read_line(&mut answer) {
        return Err(Failure::refused(format!("could not read the answer: {e}")));
    }
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::refused("not unlocked: not confirmed")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::exit;
    use crate::render::tests::{election, holder, lock};

    #[test]
    fn one_held_type_is_chosen_without_type() {
        let locks = vec![
            lock("n", Kind::Mutex, vec![holder("a", "t", 1, 1)]),
            lock("n", Kind::FairMutex, vec![]),
        ];
        assert_eq!(choose("n", &locks, None).unwrap().kind, Kind::Mutex);
        assert_eq!(
            choose("n", &locks, Some(Kind::Mutex)).unwrap().kind,
            Kind::Mutex
        );
        let f = choose("n", &locks, Some(Kind::FairMutex)).unwrap_err();
        assert_eq!(f.code, exit::NOT_FOUND);
        assert!(f.message.contains("fair_mutex"), "{f}");
    }

    #[test]
    fn several_held_types_need_type_and_are_listed() {
        let locks = vec![
            lock("n", Kind::Mutex, vec![holder("a", "t", 1, 1)]),
            lock("n", Kind::Semaphore, vec![holder("b", "t", 1, 0)]),
        ];
        let f = choose("n", &locks, None).unwrap_err();
        assert_eq!(f.code, exit::USAGE);
        assert!(f.message.contains("mutex, semaphore"), "{f}");
        assert!(f.message.contains("--type"), "{f}");
        assert_eq!(
            choose("n", &locks, Some(Kind::Semaphore)).unwrap().kind,
            Kind::Semaphore
        );
    }

    #[test]
    fn nothing_held_is_not_found() {
        let f = choose("n", &[], None).unwrap_err();
        assert_eq!(f.code, exit::NOT_FOUND);
        assert!(f.message.contains("\"n\""), "{f}");
    }

    #[test]
    fn the_question_names_the_holder() {
        let q = question(&lock(
            "orders:42",
            Kind::Mutex,
            vec![holder("billing-1", "worker-3", 1, 17)],
        ));
        assert!(q.contains("mutex \"orders:42\""), "{q}");
        assert!(q.contains("billing-1 (thread worker-3)"), "{q}");
        assert!(q.contains("token 17"), "{q}");
        assert!(q.ends_with("[y/N] "), "{q}");
        let q = question(&lock(
            "p",
            Kind::Semaphore,
            vec![holder("a", "t", 1, 0), holder("b", "u", 1, 0)],
        ));
        assert!(q.contains("a (thread t) and 1 more"), "{q}");
    }

    #[test]
    fn an_election_is_chosen_by_its_type_and_its_question_says_a_new_one_follows() {
        let locks = vec![
            lock("n", Kind::Mutex, vec![holder("a", "t", 1, 1)]),
            election("n", 7, Some("v")),
        ];
        let chosen = choose("n", &locks, Some(Kind::Election)).unwrap();
        assert_eq!(chosen.kind, Kind::Election);
        let f = choose("n", &locks, None).unwrap_err();
        assert!(f.message.contains("mutex, election"), "{f}");
        let f = choose("n", &locks[..1], Some(Kind::Election)).unwrap_err();
        assert_eq!(f.code, exit::NOT_FOUND);
        assert_eq!(f.message, "the election \"n\" has no leader");
        let q = question(chosen);
        assert_eq!(
            q,
            "End the leadership of the election \"n\" (led by scheduler-2 (thread campaign), \
             term 7, elected 12.4s ago)? A new election follows among its candidates; the \
             leader finds out at its next renewal at the latest. [y/N] "
        );
        assert_eq!(
            unlocked(chosen),
            "force-unlocked the election \"n\": ended the leadership of scheduler-2 (thread \
             campaign) (term 7); a new election follows\n"
        );
        assert_eq!(
            unlocked(&locks[0]),
            "force-unlocked the mutex \"n\" (it was held by a (thread t))\n"
        );
    }

    #[test]
    fn yes_skips_the_question() {
        let mut out = Vec::new();
        confirm(true, false, "q? ", &mut &b""[..], &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn without_a_terminal_it_refuses_and_asks_nothing() {
        let mut out = Vec::new();
        let f = confirm(false, false, "q? ", &mut &b"y\n"[..], &mut out).unwrap_err();
        assert_eq!(f.code, exit::REFUSED);
        assert!(f.message.contains("--yes"), "{f}");
        assert!(out.is_empty());
    }

    #[test]
    fn only_yes_confirms() {
        for (answer, ok) in [
            ("y\n", true),
            ("YES\n", true),
            (" yes \n", true),
            ("n\n", false),
            ("\n", false),
            ("", false),
            ("yep\n", false),
        ] {
            let mut out = Vec::new();
            let r = confirm(false, true, "q? ", &mut answer.as_bytes(), &mut out);
            assert_eq!(r.is_ok(), ok, "{answer:?}");
            if let Err(f) = r {
                assert_eq!(f.code, exit::REFUSED);
            }
            assert_eq!(out, b"q? ");
        }
    }
}
