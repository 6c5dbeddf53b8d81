//! The layers you can see: every module of the crate belongs to one layer, and a module imports
//! only from its own layer or the ones below it (issue 34, point 6).
//!
//! Bottom to top: base < screen < process < wire < audit < identity < policy < session < face.
//! The crate root (`lib.rs`, `main.rs`) stands above them all. This test reads every file under
//! `src/`, finds each path into the crate (`use crate::…` trees, inline `crate::…` paths,
//! `super::…`) outside comments and string literals, and fails on one that runs upward, naming
//! the file, the line and both layers. It also fails on a circle between modules of one layer
//! (production code only: test modules may import what they test from anywhere in their layer),
//! except the circles listed in [`KNOWN_CIRCLES`], which must still exist.
//!
//! Where a module lives: before the move into folders, [`MODULES`] says (by the module's name
//! under `crate::`); after it (`/work/briefs/layers-move.sh`), the folder is the layer
//! (`crate::face::cli`), and a module listed in [`MODULES`] must sit in the folder it names.

// It reads the crate's own sources with std; only the library is held to `crate::beneath`.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom first.
const LAYERS: &[&str] = &[
    "base", "screen", "process", "wire", "audit", "identity", "policy", "session", "face",
];

/// Each module's layer, and why when the name does not say it. One row a line, so that
/// `layers-move.sh` can rename a module here when it moves it.
#[rustfmt::skip]
const MODULES: &[(&str, &str, &str)] = &[
    // layers-move: table begin
    ("cli", "face", "clap's types stay here; lower layers get plain option structs"),
    ("commands", "face", "one orchestrator per subcommand"),
    ("control_socket", "face", "the control socket server: an input that drives the session"),
    ("watch", "face", "the source watcher: a save drives the session (a new build)"),
    ("host_sandbox", "face", "Claude Code's sandbox settings: written by `init`, checked by `status`"),
    ("templates", "face", "the files `init` and `new` write"),
    ("tests_workspace_attacks", "face", "planted-file attacks on `run`, `watch` and `config`"),
    ("session", "session", ""),
    ("approval", "policy", ""),
    ("accepted", "policy", "the policy a human accepted and its meet with the project's"),
    ("catalog", "policy", "catalog revisions and diffs: what the approvals are about"),
    ("fingerprint", "identity", ""),
    ("capture", "identity", ""),
    ("store", "identity", "the content-addressed store of captured executables"),
    ("epoch", "identity", "epoch and run ids, minted from an identity"),
    ("workspace", "identity", "which package and binary: the identity's inputs"),
    ("build", "identity", "the cargo build an identity is captured from"),
    ("cycle", "identity", "build then capture: one identity"),
    ("config", "identity", "`[package.metadata.mcp-dev]`, read with the package"),
    ("audit", "audit", ""),
    ("proxy", "wire", "JSON-RPC framing, envelopes, the outlet and the scanner"),
    ("supervisor", "process", ""),
    ("sanitize", "screen", "what untrusted bytes may show on a terminal"),
    ("output", "screen", "the only door to stdout"),
    ("stderr", "screen", "the status lines on stderr"),
    ("stderr_feed", "screen", "the status lines kept for `status --follow`"),
    ("status_lines", "screen", "the session's status events and their wording"),
    ("wording", "screen", "words several screens share, and the `status` page"),
    ("error", "base", ""),
    ("exit_codes", "base", ""),
    ("paths", "base", ""),
    ("fsutil", "base", ""),
    ("beneath", "base", "the one capability for files below a held directory"),
    ("hashing", "base", ""),
    ("canonical", "base", "the one JSON encoding behind every digest: `hashing` needs it"),
    ("sys", "base", "raw OS calls (exit decoding, file identity, mmap): `fsutil` needs them"),
    // layers-move: table end
];

/// Circles that exist today and are being removed elsewhere: each must still exist (remove it
/// here when it is gone), and no other circle may appear.
const KNOWN_CIRCLES: &[&[&str]] = &[
    // None: the audit split (issue 34, point 6) broke log -> recover -> scan -> verify.
];

#[test]
fn no_module_imports_from_a_higher_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = read_sources(&root.join("src"));
    assert!(files.len() > 50, "read only {} files", files.len());
    let report = check(&files, MODULES);
    assert!(
        report.problems.is_empty(),
        "{} layering problem(s):\n{}",
        report.problems.len(),
        report.problems.join("\n")
    );
    let mut circles: Vec<Vec<Module>> = report.circles.clone();
    let mut stale = Vec::new();
    for known in KNOWN_CIRCLES {
        let known: Vec<String> = known.iter().map(|s| s.to_string()).collect();
        match circles
            .iter()
            .position(|c| c.iter().map(|m| &m.0).eq(known.iter()))
        {
            Some(i) => {
                circles.remove(i);
            }
            None => stale.push(known.join(", ")),
        }
    }
    assert!(
        stale.is_empty(),
        "these circles are gone (or changed): update KNOWN_CIRCLES: {stale:?}; circles now: {:?}",
        report.circles
    );
    assert!(
        circles.is_empty(),
        "circles between modules of one layer:\n{}",
        circles
            .iter()
            .map(|c| c
                .iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join("\n  "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Every table entry is a module that exists, in a layer that exists.
#[test]
fn the_table_names_real_modules_and_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = read_sources(&root.join("src"));
    let moved = files.iter().any(|(p, _)| p.starts_with("src/face/"));
    for (name, layer, _) in MODULES {
        assert!(LAYERS.contains(layer), "{name}: no layer {layer}");
        let here = if moved && name != layer {
            format!("src/{layer}/{name}")
        } else {
            format!("src/{name}")
        };
        assert!(
            files
                .iter()
                .any(|(p, _)| p == &format!("{here}.rs") || p.starts_with(&format!("{here}/"))),
            "MODULES lists `{name}` ({layer}) but there is no {here}.rs or {here}/"
        );
    }
}

// ---- the checker ----------------------------------------------------------------------------

/// What [`check`] found: upward imports and unknown modules, and every circle (as module paths
/// in order, each with the place of one import of the next).
#[derive(Debug, Default)]
struct Report {
    problems: Vec<String>,
    circles: Vec<Vec<Module>>,
}

/// A module in a circle: its path and where it imports the next one (`src/x.rs:12`).
#[derive(Debug, Clone)]
struct Module(String, String);

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (imports the next at {})", self.0, self.1)
    }
}

/// One path into the crate: its segments after `crate` and the line it is on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    line: usize,
    path: Vec<String>,
    /// In a test module (inline `#[cfg(test)] mod` or a `tests*.rs`/`testing.rs` file).
    test: bool,
}

fn read_sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(dir.parent().unwrap()).unwrap();
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((rel.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    out.sort();
    out
}

/// The module path of a file under `src/` (`src/audit/log.rs` -> `audit::log`,
/// `src/proxy/mod.rs` -> `proxy`, `src/lib.rs` -> the root).
fn module_of(file: &str) -> Vec<String> {
    let rel = file.strip_prefix("src/").unwrap_or(file);
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut segs: Vec<String> = rel.split('/').map(str::to_string).collect();
    if segs.last().is_some_and(|s| s == "mod") {
        segs.pop();
    }
    if segs.len() == 1 && (segs[0] == "lib" || segs[0] == "main") {
        segs.clear();
    }
    segs
}

/// The layer of a path into the crate (`["cli", "CargoArgs"]` -> face by the table;
/// `["face", "cli"]` -> face by the folder), or `None` for the root's own items.
fn layer_of<'a>(path: &[String], table: &'a [(&'a str, &'a str, &'a str)]) -> Option<&'a str> {
    let first = path.first()?;
    if let Some((_, layer, _)) = table.iter().find(|(m, _, _)| m == first) {
        return Some(layer);
    }
    LAYERS.iter().find(|l| *l == first).copied()
}

/// A folder of the moved layout (`face`), not a module that is also a layer (`session`).
fn is_layer_folder(name: &str, table: &[(&str, &str, &str)]) -> bool {
    LAYERS.contains(&name) && !table.iter().any(|(m, _, _)| *m == name)
}

/// The top module a path names: `cli` before the move, `face::cli` after it.
fn top_module(path: &[String], table: &[(&str, &str, &str)]) -> String {
    match path {
        [folder, module, ..] if is_layer_folder(folder, table) => format!("{folder}::{module}"),
        _ => path[0].clone(),
    }
}

fn rank(layer: &str) -> usize {
    LAYERS.iter().position(|l| *l == layer).expect("a layer")
}

fn check(files: &[(String, String)], table: &[(&str, &str, &str)]) -> Report {
    let mut report = Report::default();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_of(f)).collect();
    // module -> (imported module -> first place)
    let mut edges: BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>> = BTreeMap::new();
    for (file, text) in files {
        let module = module_of(file);
        if module.is_empty() {
            continue; // the crate root may use every layer
        }
        let Some(layer) = layer_of(&module, table) else {
            report.problems.push(format!(
                "{file}: module `{}` has no layer: add it to MODULES in tests/layers.rs",
                module[0]
            ));
            continue;
        };
        // After the move, a module the table lists must sit in the folder the table names.
        let listed = table
            .iter()
            .find(|(m, _, _)| module.get(1).is_some_and(|n| m == n));
        if let Some((_, want, _)) = listed
            && is_layer_folder(&module[0], table)
            && *want != module[0]
        {
            report.problems.push(format!(
                "{file}: `{}` is in folder {} but MODULES puts it in {want}",
                module[1], module[0]
            ));
        }
        let file_is_test = file
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("tests") || n == "testing.rs");
        // A test shell (`session/testing.rs`) plays the face for the core's tests: it performs
        // effects with the face's types (a control client's reply), so it may import upward.
        let file_is_shell = file.ends_with("/testing.rs");
        for import in imports(text, &module) {
            let Some(target) = layer_of(&import.path, table) else {
                continue;
            };
            if rank(target) > rank(layer) && !file_is_shell {
                report.problems.push(format!(
                    "{file}:{}: `crate::{}` runs upward: {layer} module `{}` imports {target} module `{}`",
                    import.line,
                    import.path.join("::"),
                    module.join("::"),
                    top_module(&import.path, table),
                ));
            }
            if import.test || file_is_test || target != layer {
                continue;
            }
            // The longest module the path names; a module's own parents and children are its
            // namespace, not a dependency.
            let Some(to) = (1..=import.path.len())
                .rev()
                .map(|n| import.path[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            if to.starts_with(&module) || module.starts_with(&to) {
                continue;
            }
            edges
                .entry(module.clone())
                .or_default()
                .entry(to)
                .or_insert_with(|| format!("{file}:{}", import.line));
        }
    }
    report.problems.sort();
    report.circles = circles(&edges);
    report
}

/// The strongly connected components with more than one module (Tarjan), each listed from its
/// smallest module along imports, every module with the place it imports the next one.
fn circles(edges: &BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        found: Vec<BTreeSet<&'a Vec<String>>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Vec<String>) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flat_map(|m| m.keys()) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    comp.insert(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.found.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    let mut out: Vec<Vec<Module>> = walk
        .found
        .iter()
        .map(|comp| {
            comp.iter()
                .map(|m| {
                    // One import to another module of the same circle.
                    let (_, at) = edges[*m]
                        .iter()
                        .find(|(to, _)| comp.contains(to))
                        .expect("a member of a circle imports another");
                    Module(m.join("::"), at.clone())
                })
                .collect()
        })
        .collect();
    out.sort_by(|a, b| a[0].0.cmp(&b[0].0));
    out
}

/// Every path into the crate in `text`, a file of module `module`: `use` trees expanded,
/// inline `crate::…` and `super::…` paths, all made absolute (segments after `crate`).
fn imports(text: &str, module: &[String]) -> Vec<Import> {
    let code = code_only(text);
    let test_from = test_module_start(&code);
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !is_ident(bytes[i - 1]);
        if word_start
            && code[i..].starts_with("use")
            && bytes.get(i + 3).is_some_and(|b| b.is_ascii_whitespace())
        {
            let end = code[i..].find(';').map_or(code.len(), |e| i + e);
            let line = line_of(i);
            for path in expand(&code[i + 3..end]) {
                push(
                    &mut out,
                    &path,
                    line,
                    module,
                    test_from.is_some_and(|t| line >= t),
                );
            }
            i = end;
            continue;
        }
        let preceded_by_path = i >= 2 && &code[i - 2..i] == "::";
        let starts = ["crate::", "super::"]
            .iter()
            .any(|p| code[i..].starts_with(p));
        if word_start && !preceded_by_path && starts && (i == 0 || bytes[i - 1] != b'$') {
            let len = code[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(code.len() - i);
            let path = code[i..i + len].trim_end_matches(':');
            let line = line_of(i);
            push(
                &mut out,
                path,
                line,
                module,
                test_from.is_some_and(|t| line >= t),
            );
            i += len;
            continue;
        }
        i += 1;
    }
    out.dedup();
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Makes `path` (`crate::a::b`, `super::c`, `self::d`) absolute and keeps it when it names the
/// crate. In a test module, `super` is the file's own module.
fn push(out: &mut Vec<Import>, path: &str, line: usize, module: &[String], test: bool) {
    let segs: Vec<&str> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let mut abs: Vec<String> = match segs.first() {
        Some(&"crate") => segs[1..].iter().map(|s| s.to_string()).collect(),
        Some(&"super") => {
            let mut base = module.to_vec();
            if test {
                base.push("tests".into());
            }
            let mut rest = &segs[..];
            while rest.first() == Some(&"super") {
                base.pop();
                rest = &rest[1..];
            }
            base.extend(rest.iter().map(|s| s.to_string()));
            base
        }
        _ => return,
    };
    while abs.last().is_some_and(|s| s == "self" || s == "*") {
        abs.pop();
    }
    if !abs.is_empty() {
        out.push(Import {
            line,
            path: abs,
            test,
        });
    }
}

/// Expands a use tree (`crate::{a, b::{c, d as e}}`) into its paths (`crate::a`, `crate::b::c`,
/// `crate::b::d`).
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![path.split_whitespace().collect()];
    };
    let prefix: String = tree[..open].split_whitespace().collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, c) in inner.char_indices() {
        match c {
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
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// The line (1-based) where the file's inline test module starts (`#[cfg(test)]` followed by
/// `mod name {`), if any; by the crate's habit it runs to the end of the file.
fn test_module_start(code: &str) -> Option<usize> {
    let lines: Vec<&str> = code.lines().collect();
    (0..lines.len()).find_map(|k| {
        let next = lines[k + 1..].iter().find(|l| !l.trim().is_empty())?;
        let next = next.trim();
        (lines[k].trim() == "#[cfg(test)]"
            && (next.starts_with("mod ") || next.starts_with("pub mod "))
            && next.ends_with('{'))
        .then_some(k + 1)
    })
}

/// `text` with comments and the contents of string and char literals blanked (line breaks
/// kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let ident = |k: usize| chars[k].is_alphanumeric() || chars[k] == '_';
        // `r"…"` or `br"…"`, not the end of an identifier.
        let prev_ident =
            i > 0 && ident(i - 1) && !(chars[i - 1] == 'b' && (i < 2 || !ident(i - 2)));
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && !prev_ident && matches!(next, Some('"') | Some('#')) && {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            chars.get(i + 1 + hashes) == Some(&'"')
        } {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let close: Vec<char> = close.chars().collect();
            out.push('r');
            for _ in 0..hashes {
                out.push('#');
            }
            out.push('"');
            i += 2 + hashes;
            while i < chars.len() && !chars[i..].starts_with(&close) {
                out.push(blank(chars[i]));
                i += 1;
            }
            for _ in 0..close.len().min(chars.len().saturating_sub(i)) {
                out.push(chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            if i < chars.len() {
                out.push('"');
                i += 1;
            }
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            let close = if next == Some('\\') {
                chars
                    .get(i + 3..)
                    .and_then(|rest| rest.iter().position(|c| *c == '\''))
                    .map(|p| i + 3 + p)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    out.push('\'');
                    for _ in i + 1..end {
                        out.push(' ');
                    }
                    out.push('\'');
                    i = end + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            // Paths into the crate are ASCII; blanking the rest keeps byte offsets on chars.
            out.push(if c.is_ascii() { c } else { ' ' });
            i += 1;
        }
    }
    out
}

// ---- the checker on small examples: it can fail -----------------------------------------------

/// The examples' own table (the layout before the move), so that they hold whatever
/// [`MODULES`] says.
const EXAMPLE: &[(&str, &str, &str)] = &[
    ("cli", "face", ""),
    ("commands", "face", ""),
    ("control", "face", ""),
    ("session", "session", ""),
    ("build", "identity", ""),
    ("audit", "audit", ""),
    ("supervisor", "process", ""),
    ("status", "screen", ""),
    ("error", "base", ""),
    ("exit_codes", "base", ""),
    ("fsutil", "base", ""),
    (
        "beneath",
        "base",
        "the one capability for files below a held directory",
    ),
    ("hashing", "base", ""),
    ("sys", "base", ""),
];

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

#[test]
fn a_planted_upward_import_fails_naming_file_line_and_layers() {
    let report = check(
        &files(&[
            ("src/lib.rs", "pub mod build;\npub mod cli;\n"),
            ("src/cli.rs", "pub struct CargoArgs;\n"),
            (
                "src/build.rs",
                "//! Builds.\n\nuse crate::cli::CargoArgs;\n",
            ),
        ]),
        EXAMPLE,
    );
    assert_eq!(
        report.problems,
        [
            "src/build.rs:3: `crate::cli::CargoArgs` runs upward: identity module `build` imports face module `cli`"
        ]
    );
}

#[test]
fn grouped_inline_and_super_paths_count() {
    let report = check(
        &files(&[
            (
                "src/status.rs",
                "use crate::{exit_codes, cli::{ColorChoice, GlobalArgs}};\n",
            ),
            (
                "src/audit/log.rs",
                "fn f() {\n    let _ = crate::session::Session::new();\n}\n",
            ),
            (
                "src/sys/unix.rs",
                "use super::super::supervisor::ExitInfo;\n",
            ),
            ("src/fsutil.rs", "use crate::hashing as h;\nuse std::fs;\n"),
        ]),
        EXAMPLE,
    );
    assert_eq!(report.problems.len(), 4, "{:#?}", report.problems);
    assert!(report.problems[0].starts_with("src/audit/log.rs:2: `crate::session::Session::new`"));
    assert!(
        report.problems[0].ends_with("audit module `audit::log` imports session module `session`")
    );
    assert!(report.problems[1].contains("src/status.rs:1: `crate::cli::ColorChoice`"));
    assert!(report.problems[2].contains("src/status.rs:1: `crate::cli::GlobalArgs`"));
    assert!(
        report.problems[3]
            .starts_with("src/sys/unix.rs:1: `crate::supervisor::ExitInfo` runs upward: base")
    );
}

#[test]
fn comments_strings_and_lower_layers_do_not_count() {
    let report = check(
        &files(&[(
            "src/build.rs",
            concat!(
                "//! See [`crate::cli::CargoArgs`].\n",
                "/* crate::commands::run */\n",
                "use crate::{error::Failure, status};\n",
                "const S: &str = \"crate::session\";\n",
                "const R: &str = r#\"crate::control \"#;\n",
                "fn f<'a>(c: char) -> bool { c == '\"' && crate::hashing::ok() }\n",
                "// use crate::cli;\n",
            ),
        )]),
        EXAMPLE,
    );
    assert_eq!(report.problems, Vec::<String>::new());
}

#[test]
fn after_the_move_the_folder_is_the_layer() {
    let ok = check(
        &files(&[
            (
                "src/face/cli.rs",
                "use crate::identity::build::CargoSelection;\n",
            ),
            (
                "src/identity/build.rs",
                "use crate::base::error::Failure;\n",
            ),
        ]),
        EXAMPLE,
    );
    assert_eq!(ok.problems, Vec::<String>::new());
    let bad = check(
        &files(&[
            ("src/base/fsutil.rs", "\n\nuse crate::face::cli;\n"),
            ("src/screen/build.rs", "pub fn f() {}\n"),
            ("src/nowhere.rs", "pub fn f() {}\n"),
        ]),
        EXAMPLE,
    );
    assert_eq!(
        bad.problems,
        [
            "src/base/fsutil.rs:3: `crate::face::cli` runs upward: base module `base::fsutil` imports face module `face::cli`",
            "src/nowhere.rs: module `nowhere` has no layer: add it to MODULES in tests/layers.rs",
            "src/screen/build.rs: `build` is in folder screen but MODULES puts it in identity",
        ]
    );
}

#[test]
fn a_circle_in_one_layer_is_found_but_not_through_tests_or_parents() {
    let report = check(
        &files(&[
            (
                "src/commands/mod.rs",
                "mod approve;\nmod approve_follow;\nuse crate::commands::approve::x;\n",
            ),
            (
                "src/commands/approve.rs",
                "use super::*;\n\nfn f() { super::approve_follow::execute() }\n",
            ),
            (
                "src/commands/approve_follow.rs",
                "use super::approve::review;\n",
            ),
            (
                "src/commands/status.rs",
                "#[cfg(test)]\nmod tests {\n    use super::super::demo::x;\n}\n",
            ),
            ("src/commands/demo.rs", "use super::status::y;\n"),
        ]),
        EXAMPLE,
    );
    assert_eq!(report.problems, Vec::<String>::new());
    assert_eq!(report.circles.len(), 1, "{:?}", report.circles);
    let names: Vec<&str> = report.circles[0].iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names, ["commands::approve", "commands::approve_follow"]);
    assert_eq!(report.circles[0][0].1, "src/commands/approve.rs:3");
    assert_eq!(report.circles[0][1].1, "src/commands/approve_follow.rs:1");
}

#[test]
fn use_trees_expand() {
    assert_eq!(
        expand(" crate::{a, b::{c, d as e}, f::{self}}"),
        ["crate::a", "crate::b::c", "crate::b::d", "crate::f::self"]
    );
    assert_eq!(expand("super::x as y"), ["super::x"]);
}
