//! The sources import one way (see "Layout" in the crate docs).
//!
//! - `src/`: the folders form layers; no file names a file of a higher layer, and the rooms of
//!   a layer that keeps them side by side (the lock types, each a child of `locks/`) name no
//!   other room of that layer.
//! - `src/`, `benches/locks/` and `testkit/src/`: no file imports a file that imports it back,
//!   directly or through others.
//! - `benches/locks/`: no workload imports another; what two share is in a support module.
//!
//! What a file imports is read from its code (comments, strings and `#[cfg(test)]` modules
//! left out): its `use` paths and every `crate::`, `super::` and `self::` path, and paths that
//! start with a module the file declares (`mod guard;` then `guard::release`). Each names the
//! deepest module that has a file; a name re-exported by the crate root (`crate::Result`) names
//! the file that defines it. A file may name its ancestors (a child module is part of its
//! parent's room and may use its private items): that edge does not count towards a cycle,
//! though it must still respect the layers. Reads the sources; starts no server.
#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers of `src/`, lowest first: each a folder (or a file at the root). A file belongs
/// to the first entry that matches it: a path ending in `/` matches the files under it, any
/// other path one file. A file may name files of its own layer and of the layers below; in a
/// layer of rooms, each child of the folder (a file, or a folder with what is under it) is a
/// room that names no other room of the layer.
const LAYERS: &[Layer] = &[
    Layer::new("kinds", &["kind.rs"]),
    Layer::new("counters", &["stats.rs"]),
    Layer::new("error", &["error.rs"]),
    Layer::new("transport", &["transport/"]),
    Layer::new("pub/sub", &["subscriber/"]),
    Layer::new("protocol", &["protocol/"]),
    Layer::new("topology", &["topology/"]),
    Layer::new("shared", &["shared/"]),
    Layer::new("driver", &["driver/"]),
    Layer::rooms("lock types", &["locks/"]),
    Layer::new("client", &["client/", "lib.rs"]),
    Layer::new("testing", &["testing.rs"]),
];

/// The files of `src/` that stand outside the layers, on top of them (nothing else imports
/// them), and the files each may import: the test server (the `testing` feature) needs
/// nothing of the library but, at most, its errors.
const OUTSIDE: &[(&str, &[&str])] = &[("testing.rs", &["error.rs"])];

struct Layer {
    name: &'static str,
    entries: &'static [&'static str],
    rooms: bool,
}

impl Layer {
    const fn new(name: &'static str, entries: &'static [&'static str]) -> Layer {
        Layer {
            name,
            entries,
            rooms: false,
        }
    }

    /// A layer whose folder holds rooms side by side (its `mod.rs` only declares them).
    const fn rooms(name: &'static str, entries: &'static [&'static str]) -> Layer {
        Layer {
            name,
            entries,
            rooms: true,
        }
    }
}

/// Where a file of `src/` sits: its layer, the entry of that layer, and its room (the child of
/// the entry's folder it is under, for a layer of rooms; the entry otherwise).
fn place_of(rel: &str) -> Option<(usize, usize, String)> {
    LAYERS.iter().enumerate().find_map(|(l, layer)| {
        layer.entries.iter().enumerate().find_map(|(e, entry)| {
            let inside = match entry.strip_suffix('/') {
                Some(dir) => rel.strip_prefix(&format!("{dir}/")),
                None => (rel == *entry).then_some(""),
            }?;
            let room = if layer.rooms {
                let child = inside.split('/').next().unwrap_or_default();
                child.trim_end_matches(".rs").to_owned()
            } else {
                (*entry).to_owned()
            };
            Some((l, e, room))
        })
    })
}

/// The files of one crate: path relative to the directory of the crate root, and text.
struct Crate {
    files: Vec<(String, String)>,
    root: String,
}

/// The module path of a file: `a/b.rs` is `a::b`, `a/mod.rs` is `a`, the root is empty.
fn module_of(rel: &str, root: &str) -> Vec<String> {
    if rel == root {
        return Vec::new();
    }
    let mut segs: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    segs
}

/// The code of a Rust file without comments, string and char literals (newlines kept) and
/// without its `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut depth = 1;
            i += 2;
            while i < c.len() && depth > 0 {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if at(i) == 'r'
            && (at(i + 1) == '"' || at(i + 1) == '#')
            && (i == 0 || !ident(at(i - 1)) || at(i - 1) == 'b')
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|h| at(j + h) == '#') {
                    j += 1 + hashes;
                    break;
                }
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if at(i) == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if at(i) == '\'' && at(i + 1) == '\\' {
            // An escaped char literal: up to the closing quote.
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' && j < i + 12 {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else if at(i) == '\'' && at(i + 2) == '\'' {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    without_test_modules(&out)
}

/// `code` without the modules gated by `#[cfg(test)]`.
fn without_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_mod = trimmed.starts_with("mod ")
            && trimmed
                .find(['{', ';'])
                .is_some_and(|k| trimmed.as_bytes()[k] == b'{');
        if !is_mod {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let open = after.find('{').expect("a module body");
        let mut depth = 0;
        let mut end = after.len();
        for (k, ch) in after[open..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.extend(after[..end].chars().filter(|&ch| ch == '\n'));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The paths of a `use` tree such as `a::{b, c::{d, e as f}}` (aliases dropped, `self`
/// folded into its parent, a glob naming its module).
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or_default().trim();
        let path = path.strip_suffix("::*").unwrap_or(path);
        return vec![path.replace(char::is_whitespace, "")];
    };
    let head = tree[..open].trim().trim_end_matches("::").to_owned();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut out = Vec::new();
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        for sub in expand_use(part) {
            out.push(match sub.as_str() {
                "self" => head.clone(),
                _ if head.is_empty() => sub,
                _ => format!("{head}::{sub}"),
            });
        }
    }
    out
}

/// The `use` trees of `code`, and the code without them.
fn split_uses(code: &str) -> (Vec<String>, String) {
    let mut trees = Vec::new();
    let mut rest_code = String::new();
    let mut rest = code;
    loop {
        let found = rest.match_indices("use ").find(|(i, _)| {
            rest[..*i]
                .chars()
                .next_back()
                .is_none_or(|ch| !(ch.is_alphanumeric() || ch == '_'))
        });
        let Some((i, _)) = found else { break };
        let Some(end) = rest[i..].find(';') else {
            break;
        };
        rest_code.push_str(&rest[..i]);
        trees.push(rest[i + 4..i + end].to_owned());
        rest = &rest[i + end + 1..];
    }
    rest_code.push_str(rest);
    (trees, rest_code)
}

/// The paths that start with `crate`, `super`, `self` or one of `children` in `code`.
fn code_paths(code: &str, children: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let c: Vec<char> = code.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let starts =
            ident(c[i]) && (i == 0 || !(ident(c[i - 1]) || c[i - 1] == ':' || c[i - 1] == '$'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut segs: Vec<String> = Vec::new();
        loop {
            let s0 = j;
            while j < c.len() && ident(c[j]) {
                j += 1;
            }
            segs.push(c[s0..j].iter().collect());
            if j + 2 < c.len() && c[j] == ':' && c[j + 1] == ':' && ident(c[j + 2]) {
                j += 2;
            } else {
                break;
            }
        }
        let first = segs[0].as_str();
        if segs.len() > 1
            && (matches!(first, "crate" | "super" | "self") || children.contains(first))
        {
            out.push(segs.join("::"));
        }
        i = j.max(i + 1);
    }
    out
}

/// The modules a file declares (`mod x;`).
fn children_of(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let l = line.trim();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            out.insert(name.trim().to_owned());
        }
    }
    out
}

/// The import graph of a crate: for each file, the files it names (with the path that names
/// each), plus problems found on the way.
struct Graph {
    edges: BTreeMap<String, BTreeMap<String, String>>,
    problems: Vec<String>,
}

fn graph(krate: &Crate, forbid_grouped_crate: bool) -> Graph {
    let mods: BTreeMap<Vec<String>, String> = krate
        .files
        .iter()
        .map(|(rel, _)| (module_of(rel, &krate.root), rel.clone()))
        .collect();
    let resolve = |path: &[String]| -> Vec<String> {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|m| mods.contains_key(m))
            .unwrap_or_default()
    };
    // A path relative to `module`, as a module path from the crate root.
    let absolute =
        |module: &[String], children: &BTreeSet<String>, path: &str| -> Option<Vec<String>> {
            let segs: Vec<String> = path.split("::").map(str::to_owned).collect();
            let mut base = module.to_vec();
            let mut k = 0;
            match segs[0].as_str() {
                "crate" => {
                    base.clear();
                    k = 1;
                }
                "super" | "self" => {
                    while k < segs.len() && matches!(segs[k].as_str(), "super" | "self") {
                        if segs[k] == "super" {
                            base.pop();
                        }
                        k += 1;
                    }
                }
                first if children.contains(first) => {}
                _ => return None,
            }
            base.extend(segs[k..].iter().cloned());
            Some(base)
        };
    // Names the root re-exports, by the module that defines them.
    let root_text = &krate
        .files
        .iter()
        .find(|(rel, _)| *rel == krate.root)
        .expect("the crate root")
        .1;
    let root_code = code_of(root_text);
    let root_children = children_of(&root_code);
    let mut root_names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for tree in split_uses(&root_code).0 {
        let tree = tree.trim_start_matches("pub ").trim();
        for path in expand_use(tree) {
            if let Some(abs) = absolute(&[], &root_children, &path) {
                let name = abs.last().cloned().unwrap_or_default();
                root_names.insert(name, resolve(&abs));
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for (rel, text) in &krate.files {
        let module = module_of(rel, &krate.root);
        let code = code_of(text);
        let children = children_of(&code);
        let (trees, rest) = split_uses(&code);
        let mut paths = Vec::new();
        for tree in &trees {
            let tree = tree
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .trim();
            if forbid_grouped_crate
                && tree
                    .replace(char::is_whitespace, "")
                    .starts_with("crate::{")
            {
                problems.push(format!(
                    "{rel}: a grouped `crate::{{..}}` path: write one path per `use` so that \
                     layers can be read (`use {tree}`)"
                ));
            }
            paths.extend(expand_use(tree));
        }
        paths.extend(code_paths(&rest, &children));
        for path in paths {
            let Some(abs) = absolute(&module, &children, &path) else {
                continue;
            };
            let mut target = resolve(&abs);
            if target.is_empty()
                && let Some(defined) = abs.first().and_then(|n| root_names.get(n))
            {
                target.clone_from(defined);
            }
            if target == module {
                continue;
            }
            let to = mods[&target].clone();
            edges
                .entry(rel.clone())
                .or_default()
                .entry(to)
                .or_insert(path);
        }
    }
    Graph { edges, problems }
}

/// Every import of `graph` from a file of `src/` to a higher layer, or to another room of a
/// side-by-side layer; every file in no layer; and every import of a file of [`OUTSIDE`]
/// beyond what it may import.
fn layer_violations(krate: &Crate, graph: &Graph) -> Vec<String> {
    let mut bad = graph.problems.clone();
    for (file, may) in OUTSIDE {
        for (to, path) in graph.edges.get(*file).into_iter().flatten() {
            if !may.contains(&to.as_str()) {
                bad.push(format!(
                    "src/{file} names `{path}` in src/{to}: it stands outside the layers and \
                     may import only {may:?}"
                ));
            }
        }
    }
    for (rel, _) in &krate.files {
        if place_of(rel).is_none() {
            bad.push(format!("src/{rel} is in no layer: add it to LAYERS"));
        }
    }
    for (from, tos) in &graph.edges {
        let Some((fl, _, fe)) = place_of(from) else {
            continue;
        };
        for (to, path) in tos {
            let Some((tl, _, te)) = place_of(to) else {
                continue;
            };
            if tl > fl {
                bad.push(format!(
                    "src/{from} ({}) names `{path}` in src/{to}, of the higher layer {}",
                    LAYERS[fl].name, LAYERS[tl].name
                ));
            } else if tl == fl && fe != te && LAYERS[fl].rooms {
                bad.push(format!(
                    "src/{from} names `{path}` in src/{to}: the {} stand side by side, none \
                     importing another",
                    LAYERS[fl].name
                ));
            }
        }
    }
    bad
}

/// The import cycles of `graph`, one line each (the files, and the paths that tie them).
/// An edge from a file to an ancestor module does not count.
fn cycles(krate: &Crate, graph: &Graph) -> Vec<String> {
    let module: BTreeMap<&str, Vec<String>> = krate
        .files
        .iter()
        .map(|(rel, _)| (rel.as_str(), module_of(rel, &krate.root)))
        .collect();
    let counts = |from: &str, to: &str| {
        let (f, t) = (&module[from], &module[to]);
        !(t.len() < f.len() && f[..t.len()] == t[..])
    };
    // Tarjan's strongly connected components.
    struct State<'g> {
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<&'g str>>,
    }
    fn visit<'g>(v: &'g str, next: &dyn Fn(&'g str) -> Vec<&'g str>, s: &mut State<'g>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in next(v) {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let next = |v: &str| -> Vec<&str> {
        graph
            .edges
            .get(v)
            .map(|tos| {
                tos.keys()
                    .map(String::as_str)
                    .filter(|to| counts(v, to))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for (rel, _) in &krate.files {
        if !state.index.contains_key(rel.as_str()) {
            visit(rel, &next, &mut state);
        }
    }
    let mut out = Vec::new();
    for mut comp in state.out.into_iter().filter(|c| c.len() > 1) {
        comp.sort_unstable();
        let mut ties = Vec::new();
        for from in &comp {
            for (to, path) in graph.edges.get(*from).into_iter().flatten() {
                if comp.contains(&to.as_str()) && counts(from, to) {
                    ties.push(format!("{from} -> {to} (`{path}`)"));
                }
            }
        }
        out.push(format!(
            "a cycle of {}: {}; {}",
            comp.len(),
            comp.join(", "),
            ties.join("; ")
        ));
    }
    out
}

fn read_crate(dir: &Path, root: &str) -> Crate {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).expect("a readable source file");
                let rel = path.strip_prefix(base).expect("under the crate");
                out.push((rel.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    Crate {
        files,
        root: root.to_owned(),
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn src_imports_one_way_by_layers_and_without_cycles() {
    let krate = read_crate(&repo().join("src"), "lib.rs");
    assert!(krate.files.len() > 20, "expected the crate's sources");
    let g = graph(&krate, true);
    let mut bad = layer_violations(&krate, &g);
    bad.extend(cycles(&krate, &g));
    assert!(
        bad.is_empty(),
        "imports that go the wrong way:\n{}",
        bad.join("\n")
    );

    // Every entry of every layer holds a file, so a renamed file cannot drop out unseen.
    for layer in LAYERS {
        for entry in layer.entries {
            let held = krate.files.iter().any(|(rel, _)| {
                place_of(rel).is_some_and(|(l, e, _)| {
                    LAYERS[l].name == layer.name && layer.entries[e] == *entry
                })
            });
            assert!(held, "no file of src/ is `{entry}` (layer {})", layer.name);
        }
    }
}

/// What only the waiting driver (and the helpers below it) may do: join a lock's local queue,
/// wait for a turn, a confirmation, a release or a give-way, retry an attempt.
const WAITING: &[&str] = &[
    "subscriber.join",
    ".wait_turn(",
    ".wait_confirmed(",
    ".wait_release(",
    ".wait_give_way(",
    "wait_release_firing(",
    "retrying(",
];

/// The lock rooms that wait on their own instead of through the driver.
fn rooms_that_wait(krate: &Crate) -> Vec<String> {
    let mut bad = Vec::new();
    for (rel, text) in &krate.files {
        // The lock rooms are the children of `locks/` (a file, or a folder whose `mod.rs` is
        // the room's head): each is its protocol and its guard; the driver waits for all.
        let Some(inside) = rel.strip_prefix("locks/") else {
            continue;
        };
        if inside == "mod.rs" {
            continue;
        }
        let head = !inside.contains('/') || inside.split('/').nth(1) == Some("mod.rs");
        let code = without_test_modules(&code_of(text));
        for w in WAITING {
            if code.contains(w) {
                bad.push(format!(
                    "{rel} calls `{w}`: a lock room waits through driver/mod.rs"
                ));
            }
        }
        if head && !code.contains("driver::") {
            bad.push(format!("{rel} does not acquire through driver/mod.rs"));
        }
    }
    bad
}

#[test]
fn every_lock_room_waits_through_the_driver() {
    let krate = read_crate(&repo().join("src"), "lib.rs");
    let bad = rooms_that_wait(&krate);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_check_finds_a_lock_room_with_a_loop_of_its_own() {
    let krate = fake_src(
        "
--- driver/mod.rs
pub fn acquire() {}
--- locks/semaphore.rs
fn acquire() { let reg = shared.subscriber.join(c); reg.wait_release(0, d); }
",
    );
    let bad = rooms_that_wait(&krate);
    assert!(
        bad.iter().any(|b| b.contains("`subscriber.join`")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|b| b.contains("`.wait_release(`")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|b| b.contains("does not acquire")),
        "{bad:?}"
    );
}

/// The support modules of the benchmark: what more than one workload uses. Every other file
/// but `main.rs` is a workload.
const BENCH_SUPPORT: &[&str] = &[
    "child.rs",
    "context.rs",
    "contention.rs",
    "floors.rs",
    "handoff_runs.rs",
    "naive.rs",
    "report.rs",
    "support.rs",
];

/// Every import of the benchmark from a workload to another, or from a support module to a
/// workload.
fn bench_violations(krate: &Crate, graph: &Graph) -> Vec<String> {
    let workload = |rel: &str| rel != krate.root && !BENCH_SUPPORT.contains(&rel);
    let mut bad = Vec::new();
    for (from, tos) in &graph.edges {
        for (to, path) in tos {
            if from != &krate.root && workload(to) {
                bad.push(format!(
                    "{from} names `{path}` of the workload {to}: what two workloads share \
                     belongs in a support module"
                ));
            }
        }
    }
    bad
}

#[test]
fn bench_workloads_import_no_other_workload() {
    let krate = read_crate(&repo().join("benches/locks"), "main.rs");
    for support in BENCH_SUPPORT {
        assert!(
            krate.files.iter().any(|(rel, _)| rel == support),
            "no benches/locks/{support}"
        );
    }
    let bad = bench_violations(&krate, &graph(&krate, false));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn benches_and_testkit_have_no_import_cycle() {
    for (dir, root) in [("benches/locks", "main.rs"), ("testkit/src", "lib.rs")] {
        let krate = read_crate(&repo().join(dir), root);
        assert!(krate.files.len() > 5, "expected the sources of {dir}");
        let found = cycles(&krate, &graph(&krate, false));
        assert!(found.is_empty(), "{dir}:\n{}", found.join("\n"));
    }
}

/// A crate rooted at `root`, written as its files: each begins with a line `--- path`.
fn fake(root: &str, spec: &str) -> Crate {
    let mut files: Vec<(String, String)> = Vec::new();
    for line in spec.lines() {
        if let Some(path) = line.strip_prefix("--- ") {
            files.push((path.to_owned(), String::new()));
        } else if let Some((_, text)) = files.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    Crate {
        files,
        root: root.to_owned(),
    }
}

/// Whether a line of `lines` starts with `prefix`.
fn any_starts(lines: &[String], prefix: &str) -> bool {
    lines.iter().any(|l| l.starts_with(prefix))
}

/// The root of a fake `src/`: modules, and the names it re-exports.
const LIB: &str = "--- lib.rs
mod error;
mod protocol;
pub use error::{Error, Result};
--- error.rs
pub enum Error {}
";

/// A fake `src/`: [`LIB`] and `files`.
fn fake_src(files: &str) -> Crate {
    fake("lib.rs", &format!("{LIB}{files}"))
}

#[test]
fn the_check_finds_an_upward_import_and_a_file_in_no_layer() {
    let krate = fake_src(
        "
--- protocol/keys.rs
use crate::Result;
use crate::shared::Shared;
--- shared/mod.rs
fn f() { crate::locks::mutex::guard::x(); }
--- locks/mutex/guard.rs
--- transport/conn.rs
use crate::{error, error::Error};
--- newlayer.rs
use crate::error::Error;
",
    );
    let bad = layer_violations(&krate, &graph(&krate, true));
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(bad.iter().any(|b| b.contains("grouped")));
    assert!(any_starts(&bad, "src/newlayer.rs is in no layer"));
    assert!(any_starts(
        &bad,
        "src/protocol/keys.rs (protocol) names `crate::shared::Shared` in \
         src/shared/mod.rs"
    ));
    assert!(any_starts(
        &bad,
        "src/shared/mod.rs (shared) names `crate::locks::mutex::guard::x` in \
         src/locks/mutex/guard.rs"
    ));
}

#[test]
fn the_check_finds_the_test_server_importing_the_library() {
    let krate = fake_src(
        "
--- testing.rs
use crate::error::Error;
use crate::client::Client;
--- client/mod.rs
",
    );
    let bad = layer_violations(&krate, &graph(&krate, true));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(any_starts(
        &bad,
        "src/testing.rs names `crate::client::Client` in src/client/mod.rs: it stands outside"
    ));
}

#[test]
fn the_check_finds_lock_types_that_import_each_other() {
    let krate = fake_src(
        "
--- locks/rwlock.rs
use crate::locks::fair_mutex::eval_twice;
--- locks/fair_mutex.rs
use crate::driver::calls::eval_twice;
--- driver/calls.rs
--- locks/mutex/mod.rs
mod guard;
use guard::MutexGuard;
--- locks/mutex/guard.rs
use super::handoff::pass;
--- locks/mutex/handoff.rs
",
    );
    let bad = layer_violations(&krate, &graph(&krate, true));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(any_starts(
        &bad,
        "src/locks/rwlock.rs names `crate::locks::fair_mutex::eval_twice`"
    ));
    assert!(bad[0].contains("side by side"));
}

#[test]
fn the_check_finds_cycles_through_any_path() {
    // a -> b -> c -> c/d -> a, through a `use` group, a path in code, a path through a module
    // the file declares and a `super` path; m/guard.rs <-> m/handoff.rs.
    let krate = fake(
        "lib.rs",
        "--- lib.rs
mod a;
mod b;
mod c;
mod m;
--- a.rs
use crate::b::{self, x::Y};
--- b.rs
fn f() { crate::c::g(); }
--- c/mod.rs
mod d;
pub(crate) use d::g;
--- c/d.rs
use super::super::a::A;
--- m/mod.rs
pub(crate) mod guard;
mod handoff;
fn f() { guard::release(); }
--- m/guard.rs
use crate::m::handoff::pass;
--- m/handoff.rs
use super::guard::Guard;
",
    );
    let found = cycles(&krate, &graph(&krate, false));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(any_starts(
        &found,
        "a cycle of 4: a.rs, b.rs, c/d.rs, c/mod.rs"
    ));
    assert!(any_starts(&found, "a cycle of 2: m/guard.rs, m/handoff.rs"));
}

#[test]
fn comments_strings_tests_and_ancestors_do_not_count() {
    let krate = fake_src(
        r##"
--- shared/hold.rs
/// Used by [`Mutex`](crate::Mutex).
use crate::error::Error; // crate::client
/* crate::locks::mutex */
const URL: &str = "redis://crate::client";
const RAW: &str = r#"crate::client "#;
fn f<'a>(c: char) -> crate::Result<()> { let _ = '"'; Ok(()) }
#[cfg(test)]
mod tests {
    use crate::client::Client;
}
--- protocol/mod.rs
mod hold;
fn f() { hold::x(); }
--- protocol/keys.rs
use super::hold::Hold;
use super::X;
"##,
    );
    let g = graph(&krate, true);
    assert_eq!(layer_violations(&krate, &g), Vec::<String>::new());
    assert_eq!(cycles(&krate, &g), Vec::<String>::new());
    let hold = &g.edges["shared/hold.rs"];
    assert_eq!(hold.keys().collect::<Vec<_>>(), ["error.rs"]);
}

#[test]
fn the_check_finds_a_workload_that_imports_another() {
    let krate = fake(
        "main.rs",
        "--- main.rs
mod hot;
mod contended;
mod support;
use hot::hot;
--- hot.rs
use crate::contended::run_contended;
use crate::support::pct;
--- contended.rs
use crate::support::pct;
--- support.rs
",
    );
    let bad = bench_violations(&krate, &graph(&krate, false));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(any_starts(
        &bad,
        "hot.rs names `crate::contended::run_contended`"
    ));
}
