//! `cargo mcp-dev new NAME [--path DIR]`: creates a server package (rmcp over stdio, a read
//! tool and a gated write tool, a commented `[package.metadata.mcp-dev]` block, a README) plus
//! everything `init` writes, ready for `cargo mcp-dev run` unchanged.
//!
//! Owns the package name rules, the refusal to write into an existing non-empty directory (or
//! one whose path is not UTF-8), and removing what a failed run created.
//! Writing the package runs no cargo command (the package is known without `cargo metadata`),
//! so that part works offline; then the package is built once ([`super::first_build`], which
//! fetches rmcp and tokio unless `--no-build`), and a failed build leaves the files in place.

use std::path::{Path, PathBuf};

use crate::base::error::{CmdResult, Failure};
use crate::face::cli::NewArgs;
use crate::face::templates::{self, Vars};
use crate::identity::config::McpDevConfig;
use crate::{base::exit_codes, base::fsutil, screen::stderr};

use super::init::{self, BlockStyle, FileKind, HostEnv, Project, Writer};

/// The template server's tools (also named in its metadata block and README).
pub const READ_TOOL: &str = "list_notes";
pub const WRITE_TOOL: &str = "add_note";
/// Written by the write tool next to Cargo.toml; ignored by the watcher.
pub const NOTES_FILE: &str = "notes.jsonl";

pub fn execute(args: NewArgs) -> CmdResult {
    create(&args, false)?;
    let manifest =
        crate::base::beneath::followed::canonicalize(&package_dir(&args)?)?.join("Cargo.toml");
    super::first_build::run(
        &manifest,
        None,
        &args.first_build,
        &format!(
            "the package and its host files were written to {} all the same",
            manifest.parent().unwrap_or(&manifest).display()
        ),
    )?;
    stderr::line(&format!(
        "ready: `{}` is an MCP server package set up for cargo mcp-dev (no `init` needed); try `cargo mcp-dev run --manifest-path {}`, or open the directory in a host: .mcp.json, .vscode/mcp.json and .cursor/mcp.json are in place (mcp-dev/README.md for the others)",
        args.name,
        manifest.display()
    ));
    Ok(exit_codes::OK)
}

/// The directory `new` creates the package in.
fn package_dir(args: &NewArgs) -> Result<std::path::PathBuf, Failure> {
    let cwd = std::env::current_dir()?;
    Ok(match &args.path {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => cwd.join(p),
        None => cwd.join(&args.name),
    })
}

/// Writes the package (`quiet`: without a line per file); returns how many files it wrote.
/// A run that fails leaves nothing behind that it created (an empty directory that was there
/// before stays), so fixing the cause and running it again just works.
pub fn create(args: &NewArgs, quiet: bool) -> Result<usize, Failure> {
    validate_package_name(&args.name)?;
    let dir = package_dir(args)?;
    init::require_utf8_path(&dir)?;
    let mut created_dirs = Vec::new();
    let result =
        prepare_dir(&dir, &mut created_dirs).and_then(|()| write_package(args, &dir, quiet));
    if result.is_err() {
        // The files are already gone (`Writer::commit`); these directories are now empty.
        fsutil::remove_created(&[], &created_dirs);
    }
    result
}

/// Plans and writes every file of the package in `dir` (which exists and is empty).
fn write_package(args: &NewArgs, dir: &Path, quiet: bool) -> Result<usize, Failure> {
    // Canonical, so host snippets carry the path the OS reports (no `..`, no symlinked /tmp).
    let dir = crate::base::beneath::followed::canonicalize(dir)
        .map_err(|e| Failure::error(format!("could not resolve `{}`: {e}", dir.display())))?;
    init::require_utf8_path(&dir)?;
    let project = Project {
        manifest_path: dir.join("Cargo.toml"),
        label: args.name.clone(),
        bin: args.name.clone(),
        config: McpDevConfig {
            label: Some(args.name.clone()),
            bin: Some(args.name.clone()),
            restart: Some("supervise".into()),
            debounce_ms: Some(50),
            exempt: vec![READ_TOOL.into()],
            ignore: vec![NOTES_FILE.into()],
            ..McpDevConfig::default()
        },
        configured: true,
        target_dir: dir.join("target"),
        package_root: dir.clone(),
    };
    let block = init::metadata_block(
        &project,
        &BlockStyle::New {
            read_tool: READ_TOOL,
            write_tool: WRITE_TOOL,
            ignore: NOTES_FILE,
        },
    )?;
    let mut v = Vars::new();
    v.set("name", &args.name)
        .set("env_prefix", init::env_prefix(&args.name))
        .set("metadata_block", block);
    let mut out = Writer::new(&dir, false);
    out.quiet = quiet;
    for (rel, template) in [
        ("Cargo.toml", &templates::NEW_CARGO_TOML),
        ("src/main.rs", &templates::NEW_MAIN_RS),
        ("README.md", &templates::NEW_README),
        (".gitignore", &templates::NEW_GITIGNORE),
    ] {
        let text = templates::render(template, &v).map_err(|e| Failure::error(e.to_string()))?;
        out.plan(&dir, &dir.join(rel), &text, FileKind::Text)?;
    }
    init::write_companions(&project, &HostEnv::detect(), &mut out)?;
    let written = out.commit()?;
    // A human ran `new`: the gating table it wrote (the read tool exempt) is accepted as theirs,
    // so the first `run` does not hold it back as a weakening nobody confirmed.
    let table = crate::identity::config::LoadedConfig {
        config: project.config.clone(),
        raw: serde_json::Value::Null,
    };
    if let Err(e) = super::run::accept_written_policy(&table, &project.manifest_path) {
        stderr::warn(&format!(
            "the template's policy was not recorded as accepted ({}); the first `run` says what waits for `cargo mcp-dev approve --policy`",
            e.message
        ));
    }
    Ok(written)
}

/// Creates `dir` (recording in `created` each directory made, parents included), or accepts
/// it when it exists and is empty.
fn prepare_dir(dir: &Path, created: &mut Vec<PathBuf>) -> Result<(), Failure> {
    match crate::base::beneath::Beneath::open_following(dir)
        .and_then(|held| held.list(Path::new("")))
    {
        Ok(entries) => {
            if !entries.is_empty() {
                return Err(Failure::error(format!(
                    "destination `{}` already exists and is not empty",
                    dir.display()
                ))
                .with_note(
                    "use `cargo mcp-dev init` to add cargo mcp-dev to an existing package",
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let existing = dir
                .ancestors()
                .skip(1)
                .find(|a| crate::base::beneath::followed::exists(a))
                .unwrap_or(Path::new("/"));
            fsutil::create_dirs_below(existing, dir, created)
                .map_err(|e| Failure::error(format!("could not create `{}`: {e}", dir.display())))
        }
        Err(e)
            if crate::base::beneath::followed::exists(dir)
                && !crate::base::beneath::followed::is_dir(dir) =>
        {
            Err(Failure::error(format!(
                "destination `{}` exists and is not a directory ({e})",
                dir.display()
            )))
        }
        Err(e) => Err(Failure::error(format!(
            "could not read `{}`: {e}",
            dir.display()
        ))),
    }
}

const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "Self", "static", "struct", "super", "trait", "true", "try", "type",
    "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Names cargo refuses or that break builds: the standard library's crates and the directories
/// cargo creates under target/.
const RESERVED: &[&str] = &[
    "std",
    "core",
    "alloc",
    "proc_macro",
    "proc-macro",
    "test",
    "deps",
    "examples",
    "build",
    "incremental",
];

/// Device names Windows reserves in every directory.
const WINDOWS_RESERVED: &[&str] = &[
    "con", "prn", "aux", "nul", "com1", "com2", "com3", "com4", "com5", "com6", "com7", "com8",
    "com9", "lpt1", "lpt2", "lpt3", "lpt4", "lpt5", "lpt6", "lpt7", "lpt8", "lpt9",
];

/// Checks `name` the way cargo (and crates.io) would, with a message that says what to change.
pub fn validate_package_name(name: &str) -> Result<(), Failure> {
    let invalid = |why: String| {
        Failure::error(format!("invalid package name `{name}`: {why}")).with_note(
            "use letters, digits, `-` and `_`, starting with a letter (e.g. `my-server`)",
        )
    };
    let Some(first) = name.chars().next() else {
        return Err(invalid("the name is empty".into()));
    };
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(invalid(format!("invalid character `{bad}`")));
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return Err(invalid(format!(
            "the first character must be a letter or `_`, not `{first}`"
        )));
    }
    if name.len() > 64 {
        return Err(invalid(format!(
            "{} characters; crates.io allows at most 64",
            name.len()
        )));
    }
    let crate_name = name.replace('-', "_");
    if KEYWORDS.contains(&name) || KEYWORDS.contains(&crate_name.as_str()) {
        return Err(invalid("it is a Rust keyword".into()));
    }
    if RESERVED.contains(&name) {
        return Err(invalid(
            "it is reserved (a standard library crate or a directory cargo creates)".into(),
        ));
    }
    if WINDOWS_RESERVED.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(invalid("it is a reserved device name on Windows".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in ["my-server", "inventory", "_x", "a1_b-2", "Notes"] {
            assert!(validate_package_name(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_what_cargo_rejects() {
        for (bad, why) in [
            ("", "empty"),
            ("1server", "first character"),
            ("-x", "first character"),
            ("my server", "invalid character ` `"),
            ("café", "invalid character `é`"),
            ("a/b", "invalid character `/`"),
            ("fn", "keyword"),
            ("self", "keyword"),
            ("test", "reserved"),
            ("std", "reserved"),
            ("deps", "reserved"),
            ("CON", "Windows"),
        ] {
            let err = validate_package_name(bad).expect_err(bad);
            assert!(err.message.contains(why), "{bad}: {}", err.message);
        }
        let long = "a".repeat(65);
        assert!(
            validate_package_name(&long)
                .unwrap_err()
                .message
                .contains("64")
        );
    }
}
