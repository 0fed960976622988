//! The docs cannot drift from the code: every promise in `docs/guarantees.md` names tests that
//! exist, every failure scenario of `docs/faults.md` names its test, and every benchmark row a
//! figure comes from (`--only NAME`) is a workload of `benches/locks/`; the crate docs' list of
//! metrics, their `type` label's values and the lease kinds `on_lease_lost` is told are the
//! code's.
//!
//! Reads files only: no server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The texts between backticks in `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether `file` (a path from the repository's root) defines a function `name`.
fn defines(file: &str, name: &str) -> bool {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(full).is_ok_and(|src| src.contains(&format!("fn {name}(")))
}

/// The rows of the first table after the heading `heading` in `doc`: each row's cells.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"));
    doc[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// What is wrong with the promise table of `doc`: a named test that does not exist, a row
/// that names none without saying why (**no test:** and a reason).
fn promise_table_faults(doc: &str) -> Vec<String> {
    let rows = table_after(doc, "## Promises and their tests");
    let mut faults = Vec::new();
    if rows.len() < 10 {
        faults.push(format!("only {} promise rows", rows.len()));
    }
    for row in &rows {
        let [promise, tests] = row.as_slice() else {
            faults.push(format!("not two cells: {row:?}"));
            continue;
        };
        let named: Vec<&str> = code_spans(tests)
            .into_iter()
            .filter(|s| s.contains(".rs::"))
            .collect();
        for t in &named {
            let (file, name) = t.split_once("::").unwrap();
            if !defines(file, name) {
                faults.push(format!("`{promise}`: no test `{name}` in `{file}`"));
            }
        }
        let why = tests
            .split_once("**no test:**")
            .map(|(_, why)| why.trim())
            .filter(|why| why.len() >= 20);
        if named.is_empty() && why.is_none() {
            faults.push(format!(
                "`{promise}` names no test and does not say why (**no test:** ...)"
            ));
        }
    }
    faults
}

#[test]
fn the_promise_table_names_tests_that_exist() {
    let faults = promise_table_faults(&read("docs/guarantees.md"));
    assert!(faults.is_empty(), "docs/guarantees.md: {faults:#?}");
}

/// The check above catches what it is for: a test that does not exist, and a row without a
/// test or a reason.
#[test]
fn the_promise_check_catches_a_missing_test() {
    let doc = read("docs/guarantees.md");
    let renamed = doc.replacen(
        "`tests/threads.rs::threads_per_client`",
        "`tests/threads.rs::no_such_test`",
        1,
    );
    assert_ne!(renamed, doc);
    let faults = promise_table_faults(&renamed);
    assert!(
        faults.len() == 1 && faults[0].contains("no_such_test"),
        "{faults:#?}"
    );
    let bare = doc.replacen(
        "`tests/threads.rs::threads_per_client`",
        "the threads test",
        1,
    );
    let faults = promise_table_faults(&bare);
    assert!(
        faults.len() == 1 && faults[0].contains("names no test"),
        "{faults:#?}"
    );
}

/// Every scenario row of `docs/faults.md` names its tests (`` `FILE.rs` `name`, `name` ``), and
/// each exists in `tests/FILE.rs`.
#[test]
fn faults_md_names_tests_that_exist() {
    let doc = read("docs/faults.md");
    let mut faults = Vec::new();
    let mut rows = 0;
    let mut header_ok = false;
    for line in doc.lines() {
        if !line.starts_with('|') {
            header_ok = false;
            continue;
        }
        if line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split(" | ").collect();
        let last = cells.last().unwrap().trim();
        if last == "test" {
            header_ok = true;
            continue;
        }
        if !header_ok {
            continue;
        }
        rows += 1;
        let mut file = None;
        let mut names = 0;
        for span in code_spans(last) {
            if let Some(f) = span.strip_suffix(".rs") {
                file = Some(format!("tests/{f}.rs"));
            } else if let Some(f) = &file {
                names += 1;
                if !defines(f, span) {
                    faults.push(format!("no test `{span}` in `{f}`"));
                }
            }
        }
        if names == 0 {
            faults.push(format!("a row names no test: {line}"));
        }
    }
    assert!(rows >= 30, "only {rows} scenario rows");
    assert!(faults.is_empty(), "docs/faults.md: {faults:#?}");
}

/// The workloads of the benchmark's dispatch (`benches/locks/main.rs`).
fn bench_workloads() -> Vec<String> {
    let main = read("benches/locks/main.rs");
    let at = main.find("let workloads").expect("the workloads table");
    let end = at + main[at..].find("];").expect("its end");
    main[at..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(\""))
        .filter_map(|l| l.split_once('"'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// Every `--only NAME[,NAME...]` written in the README and the docs (where each figure names
/// the command that prints it) is a workload the bench runs.
#[test]
fn every_bench_row_named_in_the_docs_exists() {
    let workloads = bench_workloads();
    assert!(workloads.len() >= 10, "{workloads:?}");
    let mut docs = vec!["README.md".to_owned()];
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(format!("docs/{}", p.file_name().unwrap().to_string_lossy()));
        }
    }
    let mut named = 0;
    let mut faults = Vec::new();
    for d in &docs {
        let text = read(d);
        for (i, _) in text.match_indices("--only ") {
            let list: String = text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-' || *c == ',')
                .collect();
            for name in list.split(',').filter(|n| !n.is_empty()) {
                named += 1;
                if !workloads.iter().any(|w| w == name) {
                    faults.push(format!("{d}: `--only {name}` is not a workload"));
                }
            }
        }
    }
    assert!(named > 0, "no --only in the docs");
    assert!(faults.is_empty(), "{faults:#?} (workloads: {workloads:?})");
}

/// A heading's anchor, as GitHub makes it.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the headings of `text` (outside fenced blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.push(slug(l.trim_start_matches('#')));
        }
    }
    out
}

/// The front page stays a front page (at most 350 lines), and every relative link of the
/// README and the docs reaches a file that exists, and a heading of it where it names one.
#[test]
fn the_readme_is_short_and_every_link_works() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 350, "README.md has {lines} lines");
    let mut docs = vec!["README.md".to_owned()];
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(format!("docs/{}", p.file_name().unwrap().to_string_lossy()));
        }
    }
    let mut faults = Vec::new();
    for d in &docs {
        let text = read(d);
        let dir = Path::new(d).parent().unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let link = &rest[..end];
            if link.starts_with("http") || link.contains(' ') {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target = if file.is_empty() {
                d.clone()
            } else {
                let p = dir.join(file);
                let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(&p);
                if !full.exists() {
                    faults.push(format!("{d}: `{link}`: no {}", p.display()));
                    continue;
                }
                p.to_string_lossy().into_owned()
            };
            if !anchor.is_empty() && target.ends_with(".md") {
                let normal = Path::new(&target).components().fold(
                    std::path::PathBuf::new(),
                    |mut acc, c| {
                        match c {
                            std::path::Component::ParentDir => {
                                acc.pop();
                            }
                            other => acc.push(other),
                        }
                        acc
                    },
                );
                if !anchors(&read(&normal.to_string_lossy()))
                    .iter()
                    .any(|a| a == anchor)
                {
                    faults.push(format!("{d}: `{link}`: no heading `#{anchor}`"));
                }
            }
        }
    }
    assert!(faults.is_empty(), "{faults:#?}");
}

/// The crate docs (`src/lib.rs`'s `//!` lines) as Markdown.
fn crate_docs() -> String {
    read("src/lib.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `.rs` file under `dir` (a path from the repository's root), with its text.
fn sources(dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((p.display().to_string(), text));
            }
        }
    }
    out
}

/// The metrics the code emits, each with whether it carries labels: every string literal
/// `"locksmith_..."` in `src/` is a metric's name (the script library's names are built with
/// `format!`); one followed at once by `)` is reported without a label (`counter!("x")`).
fn emitted_metrics() -> BTreeMap<String, bool> {
    let mut found = BTreeMap::new();
    for (_, text) in sources("src") {
        for (i, _) in text.match_indices("\"locksmith_") {
            let rest = &text[i + 1..];
            let Some(end) = rest.find('"') else { continue };
            let name = &rest[..end];
            if !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                continue;
            }
            let labelled = !rest[end + 1..].starts_with(')');
            *found.entry(name.to_owned()).or_insert(false) |= labelled;
        }
    }
    found
}

/// The code spans of `doc` between the first `from` and the next `to` after it.
fn spans_between<'a>(doc: &'a str, from: &str, to: &str) -> Vec<&'a str> {
    let at = doc.find(from).unwrap_or_else(|| panic!("no `{from}`")) + from.len();
    let end = doc[at..]
        .find(to)
        .unwrap_or_else(|| panic!("no `{to}` after `{from}`"));
    code_spans(&doc[at..at + end])
}

/// What differs between the metrics the code emits and the crate docs' list of them (in
/// `docs`): a metric missing from the list or listed but never emitted, and the metrics that
/// carry no `type` label against the sentence that names them.
fn metric_list_faults(docs: &str, emitted: &BTreeMap<String, bool>) -> Vec<String> {
    let listed: BTreeSet<String> = table_after(docs, "The metrics, in Prometheus names")
        .iter()
        .map(|row| row[0].trim_matches('`').to_owned())
        .collect();
    let mut faults = Vec::new();
    for name in emitted.keys().filter(|n| !listed.contains(*n)) {
        faults.push(format!(
            "`{name}` is emitted but not in the crate docs' metric list"
        ));
    }
    for name in listed.iter().filter(|n| !emitted.contains_key(*n)) {
        faults.push(format!("`{name}` is in the metric list but never emitted"));
    }
    let unlabelled: BTreeSet<&str> = emitted
        .iter()
        .filter(|(_, labelled)| !**labelled)
        .map(|(n, _)| n.as_str())
        .collect();
    let said: BTreeSet<&str> = spans_between(docs, "Every metric but", "has the label")
        .into_iter()
        .collect();
    if said != unlabelled {
        faults.push(format!(
            "the docs say {said:?} carry no `type` label; the code: {unlabelled:?}"
        ));
    }
    faults
}

/// Every metric the code emits is in the crate docs' list (and nothing else is), those
/// without a `type` label are the ones the docs name, and the label's values listed (in the
/// crate docs and `docs/operating.md`) are those of the code.
#[test]
fn the_metric_list_matches_the_code() {
    let docs = crate_docs();
    let emitted = emitted_metrics();
    assert!(emitted.len() >= 15, "{emitted:?}");
    let faults = metric_list_faults(&docs, &emitted);
    assert!(faults.is_empty(), "{faults:#?}");

    // The `type` values: what `Kind::label` returns.
    let kind = read("src/kind.rs");
    let at = kind.find("fn label(").unwrap();
    let body = &kind[at..at + kind[at..].find("\n    }\n").unwrap()];
    let code: BTreeSet<&str> = body
        .match_indices("=> \"")
        .map(|(i, m)| {
            let v = &body[i + m.len()..];
            &v[..v.find('"').unwrap()]
        })
        .collect();
    let crate_docs: BTreeSet<&str> = spans_between(&docs, "has the label `type`:", "(")
        .into_iter()
        .collect();
    assert_eq!(crate_docs, code, "the `type` values in the crate docs");
    let operating = read("docs/operating.md");
    let listed: BTreeSet<&str> = spans_between(&operating, "labelled by lock type (", ")")
        .into_iter()
        .collect();
    assert_eq!(listed, code, "the `type` values in docs/operating.md");
}

/// The check above catches a metric the list lacks, and a label the docs misstate.
#[test]
fn the_metric_check_catches_a_missing_metric() {
    let docs = crate_docs();
    let emitted = emitted_metrics();
    let row = docs
        .lines()
        .find(|l| l.starts_with("| `locksmith_clock_jumps_total`"))
        .unwrap();
    let faults = metric_list_faults(&docs.replacen(&format!("{row}\n"), "", 1), &emitted);
    assert!(
        faults.len() == 1 && faults[0].contains("emitted but not in"),
        "{faults:#?}"
    );
    let mut labelled = emitted.clone();
    labelled.insert("locksmith_clock_jumps_total".to_owned(), true);
    let faults = metric_list_faults(&docs, &labelled);
    assert!(
        faults.len() == 1 && faults[0].contains("carry no `type` label"),
        "{faults:#?}"
    );
}

/// The `on_lease_lost` row of `docs/configuration.md` names every `LeaseKind`.
#[test]
fn the_lease_kinds_listed_are_the_code_s() {
    let src = read("src/shared/renewal/mod.rs");
    let at = src.find("pub enum LeaseKind {").unwrap();
    let body = &src[at..at + src[at..].find("\n}").unwrap()];
    let variants: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_suffix(','))
        .filter(|v| v.chars().all(char::is_alphanumeric))
        .collect();
    assert!(variants.contains(&"Leadership"), "{variants:?}");
    let config = read("docs/configuration.md");
    let row = config
        .lines()
        .find(|l| l.starts_with("| `on_lease_lost`"))
        .unwrap();
    let spans = code_spans(row);
    let missing: Vec<_> = variants.iter().filter(|v| !spans.contains(v)).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md omits {missing:?}"
    );
}
