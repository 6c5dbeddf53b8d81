//! The modules of `audit/` form a DAG: this test reads their sources and fails on an import
//! circle (issue 34). An edge `a -> b` is any path in `a`'s non-test code that names `b`:
//! `super::b`, `crate::audit::b`, or a name `mod.rs` re-exports from `b` (`super::AuditError`
//! is an edge to `error`). `mod.rs` only declares and re-exports: it is not a node. Test code
//! (a `#[cfg(test)] mod tests` at the end of a file, and the `tests_*` files) may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/audit")
}

/// The modules of `audit/` (file stems), without `mod.rs` and the test-only files.
fn modules() -> BTreeSet<String> {
    std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "mod" && !m.starts_with("tests_"))
        .collect()
}

/// What `mod.rs` re-exports, name → module (`pub use m::{A, B}`, `pub use m::*` is skipped:
/// its names are found by module).
fn re_exports(mods: &BTreeSet<String>) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(dir().join("mod.rs")).unwrap();
    let mut out = BTreeMap::new();
    for stmt in text.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        assert!(mods.contains(module), "mod.rs re-exports from {module}");
        for name in names
            .trim_matches(|c| c == '{' || c == '}' || char::is_whitespace(c))
            .split(',')
        {
            let name = name.trim();
            if !name.is_empty() && name != "*" {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

/// The non-test code of a module: up to its `#[cfg(test)] mod tests`.
fn code(module: &str) -> String {
    let text = std::fs::read_to_string(dir().join(format!("{module}.rs"))).unwrap();
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    // Doc comments name modules in links, not in code.
    text[..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `text` names (see the module doc).
fn edges_of(
    text: &str,
    mods: &BTreeSet<String>,
    exports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["super::", "crate::audit::"] {
        for (at, _) in text.match_indices(prefix) {
            let after = &text[at + prefix.len()..];
            let mut names: Vec<&str> = Vec::new();
            if let Some(group) = after.strip_prefix('{') {
                // `use super::{AuditError, scan};`
                let group = &group[..group.find('}').unwrap_or(group.len())];
                names.extend(
                    group
                        .split(',')
                        .map(|n| n.trim().split("::").next().unwrap()),
                );
            } else {
                let end = after
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                names.push(&after[..end]);
            }
            for name in names {
                if mods.contains(name) {
                    out.insert(name.to_string());
                } else if let Some(m) = exports.get(name) {
                    out.insert(m.clone());
                } else if !name.is_empty() && name != "self" {
                    // A name `mod.rs` would have to define itself: it defines none.
                    panic!(
                        "{name:?} (after {prefix}) is neither a module of audit/ nor a re-export"
                    );
                }
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let exports = re_exports(&mods);
    mods.iter()
        .map(|m| {
            let mut e = edges_of(&code(m), &mods, &exports);
            e.remove(m);
            (m.clone(), e)
        })
        .collect()
}

/// A circle in `g`, as the modules along it, if there is one.
fn find_circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut circle = path[at..].to_vec();
            circle.push(m.to_string());
            return Some(circle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_audit_modules_form_a_dag() {
    let g = graph();
    if let Some(circle) = find_circle(&g) {
        panic!("import circle in src/audit: {}", circle.join(" -> "));
    }
}

#[test]
fn the_graph_is_read_from_the_sources() {
    let g = graph();
    // Edges the code has, read back: the test sees them, so a circle through them would count.
    assert!(g["writer"].contains("seal"), "{:?}", g["writer"]);
    assert!(g["recover"].contains("writer"), "{:?}", g["recover"]);
    assert!(g["verify"].contains("scan"), "{:?}", g["verify"]);
    assert!(g["scan"].contains("error"), "`super::error::VerifyFailure`");
    assert!(
        g["keys"].contains("error"),
        "`super::AuditError`, a re-export"
    );
    // The sealer is pure: it reaches neither files nor the writer.
    for io in [
        "writer", "sink", "keys", "lock", "restore", "rotate", "tail",
    ] {
        assert!(!g["seal"].contains(io), "seal imports {io}");
    }
}

#[test]
fn a_circle_is_found() {
    let mods: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let exports = BTreeMap::from([("Thing".to_string(), "c".to_string())]);
    let mut g = BTreeMap::new();
    g.insert("a".into(), edges_of("use super::b::X;", &mods, &exports));
    g.insert("b".into(), edges_of("use super::{Thing};", &mods, &exports));
    g.insert(
        "c".into(),
        edges_of("let x = crate::audit::a::f();", &mods, &exports),
    );
    assert_eq!(
        find_circle(&g),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
    g.insert("c".into(), BTreeSet::new());
    assert_eq!(find_circle(&g), None);
}
