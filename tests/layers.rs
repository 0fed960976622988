//! The crate's layers import one way: no module of a lower layer names a module of a higher one
//! (see "Layout" in the crate docs). Reads `src/`; starts no server.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first, with the top-level modules of each. A module may name modules of
/// its own layer and of the layers below it.
const LAYERS: &[(&str, &[&str])] = &[
    ("error", &["error"]),
    ("transport", &["transport"]),
    ("pub/sub", &["subscriber"]),
    ("protocol", &["protocol"]),
    ("topology", &["topology"]),
    ("renewal", &["renewal"]),
    (
        "locks and client",
        &[
            "lib",
            "client",
            "mutex",
            "guard",
            "handoff",
            "fair_mutex",
            "rwlock",
            "semaphore",
            "redlock",
        ],
    ),
];

/// Names re-exported at the crate root, by the module that defines them (so that a path such
/// as `crate::Result` counts as an import of `error`).
const ROOT_NAMES: &[(&str, &str)] = &[("Error", "error"), ("Result", "error")];

/// The layer of a top-level module (`None`: in no layer).
fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// The top-level module a file of `src/` belongs to: `transport/conn.rs` is in `transport`,
/// `client.rs` in `client`.
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

/// The code of a Rust file without its comments (line comments and doc comments, which may
/// link anywhere).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules that `code` names through `crate::`.
fn imports(code: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        // `$crate::` and `some_crate::` are other crates' paths.
        if code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            return Err(format!(
                "a grouped `crate::{{..}}` path: write one path per `use` so that layers can be \
                 read ({})",
                rest.lines().next().unwrap_or_default()
            ));
        }
        let module = ROOT_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(name.clone(), |(_, m)| (*m).to_owned());
        out.push(module);
    }
    Ok(out)
}

/// Every upward import in `files` (path relative to `src/`, text), as messages.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (rel, text) in files {
        let from = module_of(rel);
        let Some(from_layer) = layer_of(&from) else {
            bad.push(format!(
                "src/{} is in no layer: add `{from}` to LAYERS",
                rel.display()
            ));
            continue;
        };
        let names = match imports(&code_of(text)) {
            Ok(n) => n,
            Err(e) => {
                bad.push(format!("src/{}: {e}", rel.display()));
                continue;
            }
        };
        for to in names {
            match layer_of(&to) {
                None => bad.push(format!(
                    "src/{} names `crate::{to}`, which is in no layer",
                    rel.display()
                )),
                Some(to_layer) if to_layer > from_layer => bad.push(format!(
                    "src/{} ({}) imports `crate::{to}` from the higher layer {}",
                    rel.display(),
                    LAYERS[from_layer].0,
                    LAYERS[to_layer].0
                )),
                Some(_) => {}
            }
        }
    }
    bad
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).expect("a readable source file");
            let rel = path.strip_prefix(root).expect("under src/").to_path_buf();
            out.push((rel, text));
        }
    }
}

#[test]
fn no_module_imports_a_higher_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    assert!(
        files.len() > 10,
        "expected the crate's sources under {}",
        root.display()
    );
    let bad = violations(&files);
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));

    // Every layer is present, so a renamed module cannot drop out of the check unseen.
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    for (rel, _) in &files {
        if let Some(l) = layer_of(&module_of(rel)) {
            *seen.entry(l).or_default() += 1;
        }
    }
    for (i, (name, _)) in LAYERS.iter().enumerate() {
        assert!(seen.contains_key(&i), "no file of layer {name} under src/");
    }
}

#[test]
fn the_check_finds_an_upward_import() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_owned());
    let files = [
        file(
            "protocol/hold.rs",
            "use crate::error::Result;\nuse crate::client::Shared;\n",
        ),
        file(
            "transport/conn.rs",
            "fn f() { crate::subscriber::probe(); }",
        ),
        file("topology/cluster.rs", "use crate::{error, client};"),
        file("newlayer.rs", "use crate::error::Error;"),
    ];
    let bad = violations(&files);
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(bad[0].contains("protocol/hold.rs") && bad[0].contains("crate::client"));
    assert!(bad[1].contains("transport/conn.rs") && bad[1].contains("crate::subscriber"));
    assert!(bad[2].contains("grouped"));
    assert!(bad[3].contains("in no layer"));
}

#[test]
fn comments_and_same_or_lower_layers_pass() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_owned());
    let files = [
        file(
            "protocol/hold.rs",
            "/// Used by [`Mutex`](crate::Mutex).\nuse crate::protocol::keys::LockKeys; // crate::client\nfn f() -> crate::Result<()> { Ok(()) }",
        ),
        file(
            "client.rs",
            "use crate::transport::conn::Deadline;\nuse crate::mutex::Mutex;\nmacro_rules! m { () => { $crate::x } }",
        ),
        file("renewal/wheel.rs", "use super::Wheel;"),
    ];
    assert_eq!(violations(&files), Vec::<String>::new());
}
