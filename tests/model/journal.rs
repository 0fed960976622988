//! The log file of one model process: one record a line, fields separated by tabs.
//!
//! | record | fields |
//! |---|---|
//! | `S` section | name, owner, token, call start, start, end, told, depth, handle, access |
//! | `C` call | kind, method, name, owner, process, start, end, bound, outcome, message, of |
//! | `L` lost-lease callback | name, token, at |
//! | `X` threads | process, before, after |
//!
//! Times are [`mono_ns`](crate::checker::mono_ns) stamps, comparable across processes.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use crate::check::{Access, Call, CallKind, History, LostReport, Outcome, Section};

/// The writing side, shared by the threads of one process.
#[derive(Debug)]
pub struct Journal {
    out: Mutex<BufWriter<File>>,
}

impl Journal {
    pub fn create(path: &Path) -> Journal {
        Journal {
            out: Mutex::new(BufWriter::new(File::create(path).expect("create log"))),
        }
    }

    fn line(&self, fields: &[String]) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(out, "{}", fields.join("\t")).expect("write log");
    }

    pub fn section(&self, s: &Section) {
        self.line(&[
            "S".into(),
            s.name.clone(),
            s.owner.clone(),
            s.token.to_string(),
            s.call_start.to_string(),
            s.start.to_string(),
            s.end.to_string(),
            s.told.to_string(),
            s.depth.to_string(),
            s.handle.clone(),
            s.access.as_string(),
        ]);
    }

    pub fn call(&self, c: &Call) {
        let (tag, msg) = match &c.outcome {
            Outcome::Ok => ("ok", ""),
            Outcome::NotAcquired => ("none", ""),
            Outcome::Expected(m) => ("expected", m.as_str()),
            Outcome::Unexpected(m) => ("unexpected", m.as_str()),
        };
        self.line(&[
            "C".into(),
            c.kind.as_str().into(),
            c.method.clone(),
            c.name.clone(),
            c.owner.clone(),
            c.proc.to_string(),
            c.start.to_string(),
            c.end.to_string(),
            c.bound.to_string(),
            tag.into(),
            msg.into(),
            c.of.to_string(),
        ]);
    }

    pub fn lost(&self, name: &str, token: u64, at: u64) {
        self.line(&["L".into(), name.into(), token.to_string(), at.to_string()]);
    }

    pub fn threads(&self, proc: usize, before: usize, after: usize) {
        self.line(&[
            "X".into(),
            proc.to_string(),
            before.to_string(),
            after.to_string(),
        ]);
    }

    pub fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.flush().expect("flush log");
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse()
        .unwrap_or_else(|e| panic!("bad number {s:?} in log: {e:?}"))
}

/// Adds the records of one log file to `h`. Returns whether the process reported its
/// threads (it wrote its last record).
pub fn read_into(text: &str, h: &mut History) -> bool {
    let mut finished = false;
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            [
                "S",
                name,
                owner,
                token,
                call_start,
                start,
                end,
                told,
                depth,
                handle,
                access,
            ] => h.sections.push(Section {
                name: (*name).into(),
                owner: (*owner).into(),
                token: num(token),
                call_start: num(call_start),
                start: num(start),
                end: num(end),
                told: num(told),
                depth: num(depth),
                handle: (*handle).into(),
                access: Access::parse(access).expect("access"),
            }),
            [
                "C",
                kind,
                method,
                name,
                owner,
                proc,
                start,
                end,
                bound,
                tag,
                msg,
                of,
            ] => h.calls.push(Call {
                kind: CallKind::parse(kind).expect("call kind"),
                method: (*method).into(),
                name: (*name).into(),
                owner: (*owner).into(),
                proc: num(proc),
                start: num(start),
                end: num(end),
                bound: num(bound),
                outcome: match *tag {
                    "ok" => Outcome::Ok,
                    "none" => Outcome::NotAcquired,
                    "expected" => Outcome::Expected((*msg).into()),
                    _ => Outcome::Unexpected((*msg).into()),
                },
                of: num(of),
            }),
            ["L", name, token, at] => h.lost.push(LostReport {
                name: (*name).into(),
                token: num(token),
                at: num(at),
            }),
            ["X", proc, before, after] => {
                h.leftovers
                    .threads
                    .push((num(proc), num(before), num(after)));
                finished = true;
            }
            _ => panic!("bad log line {line:?}"),
        }
    }
    finished
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_the_round_trip() {
        let path = std::env::temp_dir().join(format!("model-log-{}", std::process::id()));
        let log = Journal::create(&path);
        let s = Section {
            name: "model:{c}".into(),
            owner: "p1t2".into(),
            token: 17,
            call_start: 1,
            start: 2,
            end: 3,
            told: 4,
            depth: 1,
            handle: "with_lease(300ms)".into(),
            access: Access::Permits { n: 2, of: 3 },
        };
        let c = Call {
            kind: CallKind::TryLockFor,
            method: "try_acquire_many_for(2)".into(),
            name: "model:a".into(),
            owner: "p0t0".into(),
            proc: 0,
            start: 5,
            end: 6,
            bound: 7,
            outcome: Outcome::Expected("redis error: timed out".into()),
            of: 8,
        };
        log.section(&s);
        log.call(&c);
        log.lost("model:a", 9, 10);
        log.threads(1, 3, 3);
        log.flush();
        let mut h = History::default();
        assert!(read_into(&std::fs::read_to_string(&path).unwrap(), &mut h));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(h.sections, vec![s]);
        assert_eq!(h.calls, vec![c]);
        assert_eq!(h.lost.len(), 1);
        assert_eq!(h.leftovers.threads, vec![(1, 3, 3)]);
    }
}
