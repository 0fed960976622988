//! A logger that keeps every record at every level (`trace` included), for tests that read
//! the log the way an operator or an attacker would.

#![allow(dead_code)]

use std::sync::{Mutex, OnceLock};

/// One record: its level, its target and its text.
#[derive(Debug, Clone)]
pub struct Line {
    pub level: log::Level,
    pub target: String,
    pub text: String,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.level, self.target, self.text)
    }
}

struct Capture {
    lines: Mutex<Vec<Line>>,
}

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = Line {
            level: record.level(),
            target: record.target().to_owned(),
            text: record.args().to_string(),
        };
        if let Ok(mut lines) = self.lines.lock() {
            lines.push(line);
        }
    }
    fn flush(&self) {}
}

static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();

fn capture() -> &'static Capture {
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture {
            lines: Mutex::new(Vec::new()),
        }));
        // Once per test binary; the first test to ask installs it.
        let _ = log::set_logger(c);
        log::set_max_level(log::LevelFilter::Trace);
        c
    })
}

/// Installs the logger (once per test binary); every record from then on is kept.
pub fn install() {
    capture();
}

/// Every record kept so far.
pub fn lines() -> Vec<Line> {
    capture()
        .lines
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default()
}
