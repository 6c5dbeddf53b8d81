//! `cargo mcp-dev new` and `init` through the real binary: the files they write, that every
//! generated JSON/TOML file parses and says what it should, the no-overwrite rule and `--force`,
//! bin/label detection, refusals, the build both end with (the one `run` then finds warm; none
//! with `--no-build`; a failed one explained, the files kept), and (one slow test) that a `new`
//! project builds and serves under `cargo mcp-dev run` with a raw JSON-RPC client.
//!
//! Every test works in its own temporary directory with its own `CARGO_MCP_DEV_HOME`; fixtures
//! from the repository are copied, never written to.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_cargo-mcp-dev");
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Files `new` writes (relative to the package), besides the workflow.
const NEW_FILES: &[&str] = &[
    "Cargo.toml",
    "src/main.rs",
    "README.md",
    ".gitignore",
    ".mcp.json",
    ".vscode/mcp.json",
    ".cursor/mcp.json",
    "mcp-dev/claude_desktop_config.json",
    "mcp-dev/codex-config.toml",
    "mcp-dev/inspector.sh",
    "mcp-dev/README.md",
    "UPDATE-CONTRACT.md",
    ".github/workflows/mcp-identity.yml",
    "bacon.toml",
    "mcp-dev/watch.sh",
];

/// Files `init` writes besides appending to Cargo.toml.
const INIT_FILES: &[&str] = &[
    ".mcp.json",
    ".vscode/mcp.json",
    ".cursor/mcp.json",
    "mcp-dev/claude_desktop_config.json",
    "mcp-dev/codex-config.toml",
    "mcp-dev/inspector.sh",
    "mcp-dev/README.md",
    "UPDATE-CONTRACT.md",
    ".github/workflows/mcp-identity.yml",
    "bacon.toml",
    "mcp-dev/watch.sh",
];

struct Sandbox {
    tmp: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("home")).unwrap();
        Sandbox { tmp }
    }
    fn path(&self) -> PathBuf {
        self.tmp.path().canonicalize().unwrap()
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(self.path())
            .env("CARGO_MCP_DEV_HOME", self.path().join("home"))
            .env("CARGO_TERM_COLOR", "never")
            .env_remove("NO_COLOR");
        c
    }
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "exit {:?}\n{}", o.status, stderr(o));
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json_file(p: &Path) -> Value {
    serde_json::from_str(&read(p)).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

fn toml_file(p: &Path) -> toml::Table {
    read(p)
        .parse()
        .unwrap_or_else(|e| panic!("{} is not TOML: {e}", p.display()))
}

/// A placeholder the renderer left behind (`{{key}}`), if any.
fn leftover_placeholder(text: &str) -> Option<String> {
    cargo_mcp_dev::face::templates::placeholders(text)
        .into_iter()
        .next()
}

/// A std-only server package: `[package] name`, optional `[[bin]] name`, a trivial main.
fn write_package(dir: &Path, package: &str, bin: Option<&str>, extra: &str) -> String {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let bin_table = match bin {
        Some(b) => format!("\n[[bin]]\nname = \"{b}\"\npath = \"src/main.rs\"\n"),
        None => String::new(),
    };
    // Odd formatting on purpose: init must append, not reformat.
    let manifest = format!(
        "[package]\nname    = \"{package}\"   # keep this comment\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n{bin_table}{extra}"
    );
    std::fs::write(dir.join("Cargo.toml"), &manifest).unwrap();
    std::fs::write(dir.join("src/main.rs"), "fn main() {}\n").unwrap();
    manifest
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.unwrap();
        let rel = entry.path().strip_prefix(from).unwrap();
        if rel.starts_with("target") {
            continue;
        }
        let dest = to.join(rel);
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
        } else {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// The server entry every host snippet must contain, whatever the host's top-level key.
fn assert_server_entry(entry: &Value, manifest: &Path, file: &str) {
    assert_eq!(entry["command"], "cargo", "{file}");
    assert_eq!(
        entry["args"],
        json!([
            "mcp-dev",
            "run",
            "--manifest-path",
            manifest.to_str().unwrap()
        ]),
        "{file}"
    );
    let path = entry["env"]["PATH"]
        .as_str()
        .unwrap_or_else(|| panic!("{file}: env.PATH"));
    let cargo_dir = cargo_mcp_dev::identity::workspace::find_on_path("cargo")
        .and_then(|c| c.parent().map(Path::to_path_buf))
        .unwrap();
    assert!(
        path.split(':').next() == Some(cargo_dir.to_str().unwrap()),
        "{file}: PATH must start with the cargo dir {}: {path}",
        cargo_dir.display()
    );
    assert!(path.split(':').any(|d| d == "/usr/bin"), "{file}: {path}");
}

/// Every generated host file parses and runs `cargo mcp-dev run --manifest-path <abs>`.
fn assert_host_files(root: &Path, label: &str, manifest: &Path) {
    let claude_code = json_file(&root.join(".mcp.json"));
    assert_eq!(claude_code["mcpServers"][label]["type"], "stdio");
    assert_server_entry(&claude_code["mcpServers"][label], manifest, ".mcp.json");

    let desktop = json_file(&root.join("mcp-dev/claude_desktop_config.json"));
    assert_server_entry(
        &desktop["mcpServers"][label],
        manifest,
        "claude_desktop_config.json",
    );

    let vscode = json_file(&root.join(".vscode/mcp.json"));
    assert!(vscode.get("mcpServers").is_none(), "VS Code uses `servers`");
    assert_eq!(vscode["servers"][label]["type"], "stdio");
    assert_server_entry(&vscode["servers"][label], manifest, ".vscode/mcp.json");

    let cursor = json_file(&root.join(".cursor/mcp.json"));
    assert_server_entry(&cursor["mcpServers"][label], manifest, ".cursor/mcp.json");

    let codex = toml_file(&root.join("mcp-dev/codex-config.toml"));
    let codex = serde_json::to_value(&codex).unwrap();
    assert_server_entry(&codex["mcp_servers"][label], manifest, "codex-config.toml");

    let bacon = toml_file(&root.join("bacon.toml"));
    let command: Vec<&str> = bacon["jobs"]["mcp-dev"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&command[..3], &["cargo", "mcp-dev", "build"]);
    assert!(command.contains(&manifest.to_str().unwrap()), "{command:?}");

    let watch = read(&root.join("mcp-dev/watch.sh"));
    assert!(watch.contains("watchexec"), "{watch}");
    assert!(watch.contains("cargo watch"), "{watch}");
    assert!(
        watch.matches("mcp-dev build --message-format json").count() >= 2,
        "{watch}"
    );

    let inspector = read(&root.join("mcp-dev/inspector.sh"));
    assert!(
        inspector.contains("npx --yes @modelcontextprotocol/inspector@0.15.0"),
        "{inspector}"
    );
    assert!(
        inspector.contains("cargo mcp-dev run --manifest-path"),
        "{inspector}"
    );

    let guide = read(&root.join("mcp-dev/README.md"));
    assert!(
        guide.contains("cargo must be on the host's PATH"),
        "{guide}"
    );

    #[cfg(unix)]
    for script in ["mcp-dev/inspector.sh", "mcp-dev/watch.sh"] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(root.join(script))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "{script} must be executable");
    }
}

/// The generated workflow is valid YAML, has no placeholder left for the user to fill, and has
/// the steps the README's CI section describes, in that order.
fn assert_workflow(path: &Path, manifest_rel: &str) {
    let yml = read(path);
    let doc: Value = serde_yaml_ng::from_str(&yml)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}\n{yml}", path.display()));
    assert_eq!(doc["name"], "mcp-identity", "{yml}");
    assert!(doc["on"].get("push").is_some(), "{yml}");
    assert!(doc["on"].get("pull_request").is_some(), "{yml}");
    let steps = doc["jobs"]["identity"]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("no jobs.identity.steps:\n{yml}"));
    assert_eq!(doc["jobs"]["identity"]["runs-on"], "ubuntu-latest", "{yml}");
    let step = |i: usize| &steps[i];
    assert_eq!(steps.len(), 5, "{yml}");
    assert_eq!(step(0)["uses"], "actions/checkout@v4");
    assert_eq!(step(1)["uses"], "dtolnay/rust-toolchain@stable");
    assert_eq!(step(2)["name"], "Install cargo-mcp-dev");
    assert_eq!(
        step(2)["run"].as_str().unwrap().trim(),
        format!(
            "cargo install --locked cargo-mcp-dev --version {}",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(step(3)["name"], "Check identity");
    assert_eq!(
        step(3)["run"].as_str().unwrap().trim(),
        format!("cargo mcp-dev check --manifest-path {manifest_rel} --out identity.json")
    );
    assert_eq!(step(4)["uses"], "actions/upload-artifact@v4");
    assert_eq!(step(4)["with"]["path"], "identity.json");
    assert_eq!(step(4)["if"], "always()");
    // Nothing for the user to replace: no OWNER/REPO-style token, no `{{key}}`.
    for word in ["OWNER", "REPO", "YOUR", "CHANGEME", "TODO", "<", "{{"] {
        assert!(!yml.contains(word), "placeholder-like `{word}` in:\n{yml}");
    }
}

/// `init` on a package where everything is in place prints exactly one line, saying so.
#[track_caller]
fn assert_already_initialized(o: &Output, label: &str, manifest: &Path) {
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line, not one per file:\n{err}");
    assert_eq!(
        lines[0],
        format!(
            "`{label}` is already initialized: [package.metadata.mcp-dev] and all {} generated files exist, nothing written (--force rewrites the generated files); run it with `cargo mcp-dev run --manifest-path {}`",
            INIT_FILES.len(),
            manifest.display()
        )
    );
}

#[test]
fn new_says_it_is_ready_and_init_after_it_says_so_in_one_line() {
    let sb = Sandbox::new();
    let o = sb.run(&["new", "--no-build", "ready-srv"]);
    assert_ok(&o);
    let root = sb.path().join("ready-srv");
    let manifest = root.join("Cargo.toml");
    let last = stderr(&o).lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("ready: `ready-srv` is an MCP server package set up for cargo mcp-dev (no `init` needed); try `cargo mcp-dev run --manifest-path "),
        "{last}"
    );
    assert!(last.contains(manifest.to_str().unwrap()), "{last}");
    let before: Vec<String> = NEW_FILES.iter().map(|f| read(&root.join(f))).collect();

    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert_already_initialized(&o, "ready-srv", &manifest);
    for (f, text) in NEW_FILES.iter().zip(&before) {
        assert_eq!(&read(&root.join(f)), text, "{f} untouched");
    }
}

#[test]
fn new_creates_a_complete_package() {
    let sb = Sandbox::new();
    let o = sb.run(&["new", "--no-build", "notes-srv"]);
    assert_ok(&o);
    let root = sb.path().join("notes-srv");
    let err = stderr(&o);
    for f in NEW_FILES {
        assert!(root.join(f).is_file(), "{f} missing");
        assert!(
            err.contains(&format!("created {f}\n")),
            "no `created {f}` in:\n{err}"
        );
    }
    assert!(!err.contains("skipped"), "{err}");
    for f in NEW_FILES {
        let text = read(&root.join(f));
        assert_eq!(leftover_placeholder(&text), None, "{f}");
    }

    let manifest = toml_file(&root.join("Cargo.toml"));
    assert_eq!(manifest["package"]["name"].as_str(), Some("notes-srv"));
    assert!(
        manifest["workspace"].is_table(),
        "standalone: own [workspace]"
    );
    let rmcp = &manifest["dependencies"]["rmcp"];
    assert_eq!(rmcp["version"].as_str(), Some("3.11"));
    let features: Vec<&str> = rmcp["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(features, ["server", "macros", "transport-io"]);
    for dep in ["tokio", "serde"] {
        assert!(manifest["dependencies"].get(dep).is_some(), "{dep}");
    }

    // The block is what `run` will read (an unknown key would fail here), the read tool exempt.
    let metadata = serde_json::to_value(&manifest["package"]["metadata"]).unwrap();
    let loaded =
        cargo_mcp_dev::identity::config::LoadedConfig::from_package_metadata(&metadata).unwrap();
    let c = &loaded.config;
    assert_eq!(c.label.as_deref(), Some("notes-srv"));
    assert_eq!(c.bin.as_deref(), Some("notes-srv"));
    assert_eq!(c.exempt, ["list_notes"]);
    assert_eq!(c.restart.as_deref(), Some("supervise"));
    assert_eq!(c.debounce_ms, Some(50));
    assert!(
        c.credential_scopes.is_empty(),
        "the scope example stays commented"
    );
    let manifest_text = read(&root.join("Cargo.toml"));
    assert!(
        manifest_text.contains("# [package.metadata.mcp-dev.credential-scopes.staging-api]"),
        "{manifest_text}"
    );

    let main = read(&root.join("src/main.rs"));
    assert!(
        main.contains("#[tool_handler(name = \"notes-srv\")]"),
        "{main}"
    );
    assert!(main.contains("async fn list_notes(&self)"), "{main}");
    assert!(main.contains("async fn add_note(&self"), "{main}");
    assert!(main.contains("\"NOTES_SRV_NOTES_FILE\""), "{main}");
    assert!(
        !main.replace("eprintln!", "").contains("println!("),
        "stdout belongs to JSON-RPC"
    );

    let readme = read(&root.join("README.md"));
    assert!(readme.contains("cargo mcp-dev run"), "{readme}");
    assert!(readme.contains("cargo mcp-dev approve"), "{readme}");

    let contract = read(&root.join("UPDATE-CONTRACT.md"));
    assert!(
        contract.contains("Restart mode for this server: **supervise**"),
        "{contract}"
    );
    assert!(
        contract.contains("except `list_notes` (`exempt`)"),
        "{contract}"
    );
    assert!(contract.contains("epoch_transition"), "{contract}");
    assert!(contract.contains("`catalog_stale`"), "{contract}");
}

#[test]
fn every_generated_file_parses_even_with_a_hostile_path() {
    let sb = Sandbox::new();
    // Spaces, quotes, a backslash and `{{`: each must be escaped for JSON, TOML and sh.
    let dir = sb.path().join("we \"ird\" \\dir {{x}}").join("srv");
    let o = sb.run(&["new", "--no-build", "srv", "--path", dir.to_str().unwrap()]);
    assert_ok(&o);
    let manifest = dir.join("Cargo.toml");
    assert_host_files(&dir, "srv", &manifest);
    // Not inside a git work tree: the workflow sits at the package root.
    assert_workflow(
        &dir.join(".github/workflows/mcp-identity.yml"),
        "Cargo.toml",
    );
    for f in NEW_FILES {
        let p = dir.join(f);
        match p.extension().and_then(|e| e.to_str()) {
            Some("json") => drop(json_file(&p)),
            Some("toml") => drop(toml_file(&p)),
            _ => {}
        }
    }
    // The shell scripts are valid sh and quote the path as one word.
    for script in ["mcp-dev/inspector.sh", "mcp-dev/watch.sh"] {
        let check = Command::new("sh")
            .arg("-n")
            .arg(dir.join(script))
            .output()
            .unwrap();
        assert!(check.status.success(), "{script}: {}", stderr(&check));
    }
    let watch = read(&dir.join("mcp-dev/watch.sh"));
    let cd_line = watch.lines().find(|l| l.starts_with("cd ")).unwrap();
    let echoed = Command::new("sh")
        .arg("-c")
        .arg(format!("set -- {}; echo \"$#:$1\"", &cd_line[3..]))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&echoed.stdout).trim_end(),
        format!("1:{}", dir.display())
    );
}

#[test]
fn new_refuses_a_non_empty_directory_and_bad_names() {
    let sb = Sandbox::new();
    let taken = sb.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    let o = sb.run(&["new", "--no-build", "taken"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("already exists and is not empty"),
        "{}",
        stderr(&o)
    );
    assert!(!taken.join("Cargo.toml").exists());
    assert_eq!(read(&taken.join("notes.txt")), "mine");

    for (name, why) in [
        ("1srv", "the first character must be a letter"),
        ("my srv", "invalid character ` `"),
        ("fn", "Rust keyword"),
        ("test", "reserved"),
    ] {
        let o = sb.run(&["new", "--no-build", name]);
        assert_eq!(o.status.code(), Some(1), "{name}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!("invalid package name `{name}`")),
            "{err}"
        );
        assert!(err.contains(why), "{name}: {err}");
        assert!(!sb.path().join(name).exists(), "{name}: nothing created");
    }

    // An existing empty directory is fine (`--path`).
    let empty = sb.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let o = sb.run(&["new", "--no-build", "ok-srv", "--path", "empty"]);
    assert_ok(&o);
    assert!(empty.join("src/main.rs").is_file());
}

#[test]
fn init_twice_skips_everything_then_force_overwrites() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    let original = write_package(&pkg, "tiny-srv", None, "");
    let manifest = pkg.join("Cargo.toml");
    let mp = manifest.to_str().unwrap();

    let first = sb.run(&["init", "--no-build", "--manifest-path", mp]);
    assert_ok(&first);
    let err = stderr(&first);
    assert!(
        err.contains("updated Cargo.toml (added [package.metadata.mcp-dev]: label = \"tiny-srv\", bin = \"tiny-srv\")"),
        "{err}"
    );
    for f in INIT_FILES {
        assert!(
            err.contains(&format!("created {f}\n")),
            "no `created {f}` in:\n{err}"
        );
    }
    // Appended, not reformatted: the user's text is a byte-exact prefix.
    let after = read(&manifest);
    assert!(after.starts_with(&original), "{after}");
    assert!(after[original.len()..].contains("[package.metadata.mcp-dev]"));
    assert_host_files(&pkg, "tiny-srv", &manifest);
    let snapshot: Vec<String> = INIT_FILES.iter().map(|f| read(&pkg.join(f))).collect();

    let second = sb.run(&["init", "--no-build", "--manifest-path", mp]);
    assert_ok(&second);
    assert_already_initialized(&second, "tiny-srv", &manifest);
    assert_eq!(read(&manifest), after, "Cargo.toml untouched");
    for (f, before) in INIT_FILES.iter().zip(&snapshot) {
        assert_eq!(&read(&pkg.join(f)), before, "{f} untouched");
    }

    // One file missing: it is created, the others are named on one line.
    std::fs::remove_file(pkg.join(".cursor/mcp.json")).unwrap();
    let partial = sb.run(&["init", "--no-build", "--manifest-path", mp]);
    assert_ok(&partial);
    let err = stderr(&partial);
    assert!(err.contains("created .cursor/mcp.json\n"), "{err}");
    let kept: Vec<&str> = err.lines().filter(|l| l.starts_with("kept ")).collect();
    assert_eq!(
        kept.len(),
        2,
        "one line for the manifest, one for the files:\n{err}"
    );
    assert!(
        kept[1].starts_with("kept 10 existing files (.mcp.json, "),
        "{err}"
    );
    assert!(!err.contains("skipped"), "{err}");

    // A user's edit survives a plain init.
    std::fs::write(pkg.join(".mcp.json"), "edited").unwrap();
    std::fs::write(pkg.join("UPDATE-CONTRACT.md"), "edited").unwrap();
    assert_ok(&sb.run(&["init", "--no-build", "--manifest-path", mp]));
    assert_eq!(read(&pkg.join(".mcp.json")), "edited");
    // --force merges into a host configuration: one that is not JSON is refused, left as it
    // is, and nothing else is written either.
    let refused = sb.run(&["init", "--no-build", "--manifest-path", mp, "--force"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused)
            .contains("error: could not add this server to `.mcp.json`: it is not valid JSON"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(read(&pkg.join(".mcp.json")), "edited");
    assert_eq!(read(&pkg.join("UPDATE-CONTRACT.md")), "edited");
    // A valid one gets this server's entry replaced; the user's other server stays.
    std::fs::write(
        pkg.join(".mcp.json"),
        r#"{"mcpServers": {"other": {"command": "x"}, "tiny-srv": {"command": "stale"}}}"#,
    )
    .unwrap();
    let forced = sb.run(&["init", "--no-build", "--manifest-path", mp, "--force"]);
    assert_ok(&forced);
    let err = stderr(&forced);
    for f in INIT_FILES {
        let line = match *f {
            ".mcp.json" | ".cursor/mcp.json" => {
                format!(
                    "updated {f} (set the `tiny-srv` entry in `mcpServers`; every other entry kept)\n"
                )
            }
            ".vscode/mcp.json" => {
                format!(
                    "updated {f} (set the `tiny-srv` entry in `servers`; every other entry kept)\n"
                )
            }
            _ => format!("overwrote {f}\n"),
        };
        assert!(err.contains(&line), "no `{line}` in:\n{err}");
    }
    assert_eq!(
        json_file(&pkg.join(".mcp.json"))["mcpServers"]["other"],
        json!({"command": "x"})
    );
    // --force never rewrites the user's manifest table.
    assert!(
        err.contains("kept Cargo.toml ([package.metadata.mcp-dev] exists"),
        "{err}"
    );
    assert_eq!(read(&manifest), after);
    assert_host_files(&pkg, "tiny-srv", &manifest);
}

#[test]
fn init_leaves_a_users_bacon_toml_alone() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    write_package(&pkg, "bacon-srv", None, "");
    let mine = "[jobs.check]\ncommand = [\"cargo\", \"check\"]\n";
    std::fs::write(pkg.join("bacon.toml"), mine).unwrap();
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        pkg.join("Cargo.toml").to_str().unwrap(),
        "--force",
    ]);
    assert_ok(&o);
    assert_eq!(read(&pkg.join("bacon.toml")), mine, "even with --force");
    let snippet = toml_file(&pkg.join("mcp-dev/bacon.toml"));
    assert!(snippet["jobs"]["mcp-dev"]["command"].is_array());
    assert!(
        stderr(&o).contains("created mcp-dev/bacon.toml"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn init_on_a_library_only_package_fails_clearly() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("lib-only");
    copy_dir(&Path::new(REPO).join("tests/fixtures/lib-only"), &pkg);
    let before = read(&pkg.join("Cargo.toml"));
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        pkg.join("Cargo.toml").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("error: package `lib-only` is a library-only package"),
        "{err}"
    );
    assert!(err.contains("needs a binary target"), "{err}");
    assert_eq!(read(&pkg.join("Cargo.toml")), before);
    assert!(!pkg.join(".mcp.json").exists());
    assert!(!pkg.join("mcp-dev").exists());
}

#[test]
fn init_detects_bin_and_label() {
    let sb = Sandbox::new();

    // Package name and bin name differ: the block and every snippet use the bin.
    let pkg = sb.path().join("a");
    write_package(&pkg, "pkg-name", Some("srv-bin"), "");
    let manifest = pkg.join("Cargo.toml");
    assert_ok(&sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]));
    let doc = toml_file(&manifest);
    let block = &doc["package"]["metadata"]["mcp-dev"];
    assert_eq!(block["bin"].as_str(), Some("srv-bin"));
    assert_eq!(block["label"].as_str(), Some("srv-bin"));
    assert!(
        block.get("exempt").is_none(),
        "init cannot know the read tools"
    );
    assert_host_files(&pkg, "srv-bin", &manifest);

    // An existing table decides label and bin, and fills the contract.
    let pkg = sb.path().join("b");
    std::fs::create_dir_all(pkg.join("src/bin")).unwrap();
    std::fs::write(pkg.join("src/bin/alpha.rs"), "fn main() {}\n").unwrap();
    std::fs::write(pkg.join("src/bin/beta.rs"), "fn main() {}\n").unwrap();
    let manifest = pkg.join("Cargo.toml");
    let text = "[package]\nname = \"two\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n\n\
        [package.metadata.mcp-dev]\nlabel = \"custom\"\nbin = \"beta\"\nrestart = \"manual\"\n\
        debounce-ms = 750\nexempt = [\"peek\"]\nper-call = [\"nuke\"]\nenv = [\"TWO_MODE\"]\n\n\
        [package.metadata.mcp-dev.credential-scopes.staging-api]\nenv = [\"TWO_TOKEN\"]\ntools = [\"push\"]\n";
    std::fs::write(&manifest, text).unwrap();
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert_eq!(read(&manifest), text);
    assert_host_files(&pkg, "custom", &manifest);
    let contract = read(&pkg.join("UPDATE-CONTRACT.md"));
    for needle in [
        "# Update contract: `custom`",
        "(bin `beta`",
        "Restart mode for this server: **manual** (`restart` in [package.metadata.mcp-dev])",
        "750 ms",
        "except `peek` (`exempt`)",
        "`nuke` need a decision for every call",
        "the values, as digests, of `TWO_MODE`",
        "| `staging-api` | `TWO_TOKEN` | `push` |",
        "cargo mcp-dev restart",
    ] {
        assert!(
            contract.contains(needle),
            "missing `{needle}` in:\n{contract}"
        );
    }
    assert_eq!(leftover_placeholder(&contract), None);
}

/// `init` and `run` go through the same choice, with the same sentence: cargo's `default-run`
/// when the package has one, else an error that says how to choose (which `init --bin` does).
#[test]
fn init_and_run_choose_among_several_bins_the_same_way() {
    let sb = Sandbox::new();
    let target = sb.path().join("target");
    let target = target.to_str().unwrap();
    let run_with_stdin_closed = |mp: &str| {
        sb.cmd(&[
            "run",
            "--manifest-path",
            mp,
            "--no-watch",
            "--target-dir",
            target,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap()
    };

    // No default: both refuse with the same sentence, and nothing is written.
    let pkg = sb.path().join("c");
    copy_dir(&Path::new(REPO).join("tests/fixtures/two-bins"), &pkg);
    let manifest = pkg.join("Cargo.toml");
    let mp = manifest.to_str().unwrap();
    let init = sb.run(&["init", "--no-build", "--manifest-path", mp]);
    let run = run_with_stdin_closed(mp);
    let sentence = "error: package `two-bins` has several binaries (alpha, beta) and no `default-run`: pass --bin NAME, or set bin = \"NAME\" in [package.metadata.mcp-dev]";
    for (what, o) in [("init", &init), ("run", &run)] {
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(o));
        assert_eq!(stderr(o).trim_end(), sentence, "{what}");
    }
    assert!(!pkg.join(".mcp.json").exists());

    // `init --bin`, as the sentence says: the choice is written into the config block.
    let o = sb.run(&["init", "--no-build", "--manifest-path", mp, "--bin", "beta"]);
    assert_ok(&o);
    let block = &toml_file(&manifest)["package"]["metadata"]["mcp-dev"];
    assert_eq!(block["bin"].as_str(), Some("beta"));
    assert_host_files(&pkg, "beta", &manifest);
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        mp,
        "--bin",
        "gamma",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o)
            .contains("no bin target named `gamma` in package `two-bins` (available: alpha, beta)"),
        "{}",
        stderr(&o)
    );

    // `default-run`: both pick it and say so with the same note.
    let pkg = sb.path().join("d");
    copy_dir(&Path::new(REPO).join("tests/fixtures/two-bins"), &pkg);
    let manifest = pkg.join("Cargo.toml");
    let text = read(&manifest).replace(
        "publish = false\n",
        "publish = false\ndefault-run = \"beta\"\n",
    );
    std::fs::write(&manifest, text).unwrap();
    let mp = manifest.to_str().unwrap();
    let note = "note: package `two-bins` has several binaries (alpha, beta): using `beta` (its `default-run`); to choose another, pass --bin NAME, or set bin = \"NAME\" in [package.metadata.mcp-dev]";
    let init = sb.run(&["init", "--no-build", "--manifest-path", mp]);
    assert_ok(&init);
    assert_eq!(
        stderr(&init).lines().next(),
        Some(note),
        "{}",
        stderr(&init)
    );
    let block = &toml_file(&manifest)["package"]["metadata"]["mcp-dev"];
    assert_eq!(block["bin"].as_str(), Some("beta"));
    // The block now names the bin, so `run` no longer has to choose: check it on a copy
    // without the block.
    let pkg2 = sb.path().join("e");
    copy_dir(&Path::new(REPO).join("tests/fixtures/two-bins"), &pkg2);
    let manifest2 = pkg2.join("Cargo.toml");
    std::fs::write(
        &manifest2,
        read(&manifest2).replace(
            "publish = false\n",
            "publish = false\ndefault-run = \"beta\"\n",
        ),
    )
    .unwrap();
    let run = run_with_stdin_closed(manifest2.to_str().unwrap());
    assert_eq!(stderr(&run).lines().next(), Some(note), "{}", stderr(&run));
}

#[test]
fn init_puts_the_workflow_at_the_git_root() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path().join(".git")).unwrap();
    let pkg = sb.path().join("servers/inv");
    write_package(&pkg, "inv", None, "");
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        pkg.join("Cargo.toml").to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert!(!pkg.join(".github").exists());
    assert_workflow(
        &sb.path().join(".github/workflows/mcp-identity.yml"),
        "servers/inv/Cargo.toml",
    );
}

/// Every file in `dir`, recursively, relative to it (directories end in `/`); not the
/// Cargo.lock that `cargo metadata` (run by `init`) writes.
fn tree(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = walkdir::WalkDir::new(dir)
        .min_depth(1)
        .into_iter()
        .filter(|e| e.as_ref().map_or(true, |e| e.file_name() != "Cargo.lock"))
        .map(|e| {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().is_dir() {
                format!("{rel}/")
            } else {
                rel
            }
        })
        .collect();
    out.sort();
    out
}

/// A generated file's directory that is a link (here `mcp-dev -> elsewhere`) refuses the whole
/// run, naming the path: nothing is written, not even the Cargo.toml block or the files whose
/// directories are fine.
#[test]
fn init_refuses_a_linked_directory_and_writes_nothing() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    let original = write_package(&pkg, "link-srv", None, "");
    let elsewhere = sb.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, pkg.join("mcp-dev")).unwrap();
    let before = tree(&pkg);
    let manifest = pkg.join("Cargo.toml");
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "error: refusing to write `mcp-dev/claude_desktop_config.json`: {} is a symbolic link",
            pkg.join("mcp-dev").display()
        )),
        "{err}"
    );
    assert_eq!(read(&manifest), original, "Cargo.toml untouched");
    assert_eq!(tree(&pkg), before, "nothing created in the package");
    assert_eq!(
        tree(&elsewhere),
        Vec::<String>::new(),
        "nothing written through the link"
    );
    // A real directory there: the same run goes through.
    std::fs::remove_file(pkg.join("mcp-dev")).unwrap();
    assert_ok(&sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]));
    assert_host_files(&pkg, "link-srv", &manifest);
}

/// `init` appends to Cargo.toml by replacing it (a temporary file renamed into place): the
/// file keeps its permissions, and a Cargo.toml that is a link is refused rather than written
/// through (the file it points to stays as it was).
#[test]
fn init_replaces_cargo_toml_keeping_its_mode_and_never_through_a_link() {
    use std::os::unix::fs::PermissionsExt as _;
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    let original = write_package(&pkg, "mode-srv", None, "");
    let manifest = pkg.join("Cargo.toml");
    std::fs::set_permissions(&manifest, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_ok(&sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
    ]));
    assert!(read(&manifest).starts_with(&original));
    let mode = std::fs::metadata(&manifest).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "Cargo.toml keeps its permissions");

    let linked = sb.path().join("linked");
    write_package(&linked, "linked-srv", None, "");
    let real = sb.path().join("real-Cargo.toml");
    std::fs::rename(linked.join("Cargo.toml"), &real).unwrap();
    let real_text = read(&real);
    std::os::unix::fs::symlink(&real, linked.join("Cargo.toml")).unwrap();
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        linked.join("Cargo.toml").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is not a regular file (a symbolic link?); refusing to replace it"),
        "{}",
        stderr(&o)
    );
    assert_eq!(read(&real), real_text, "the linked file is untouched");
    assert_eq!(tree(&linked), ["Cargo.toml", "src/", "src/main.rs"]);
}

/// `init --force` in `.vscode/mcp.json` (key `servers`): the user's other servers and keys
/// stay, in their order and as written; a file with comments (VS Code accepts them) is not
/// JSON, so it is left exactly as it was.
#[test]
fn init_force_merges_into_vscode_servers_and_keeps_a_commented_file() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    write_package(&pkg, "merge-srv", None, "");
    let manifest = pkg.join("Cargo.toml");
    std::fs::create_dir(pkg.join(".vscode")).unwrap();
    let vscode = pkg.join(".vscode/mcp.json");
    std::fs::write(
        &vscode,
        r#"{"inputs": [{"id": "token", "type": "promptString"}], "servers": {"zeta": {"command": "z", "args": [1.50]}}}"#,
    )
    .unwrap();
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
        "--force",
    ]);
    assert_ok(&o);
    let text = read(&vscode);
    let doc = json_file(&vscode);
    assert_eq!(
        doc["inputs"],
        json!([{"id": "token", "type": "promptString"}])
    );
    assert_eq!(doc["servers"]["zeta"]["command"], "z");
    assert_server_entry(&doc["servers"]["merge-srv"], &manifest, ".vscode/mcp.json");
    // Order and text kept: `inputs` first, `zeta` before ours, `1.50` not rewritten as `1.5`.
    assert!(text.find("\"inputs\"") < text.find("\"servers\""), "{text}");
    assert!(text.find("\"zeta\"") < text.find("\"merge-srv\""), "{text}");
    assert!(text.contains("[1.50]"), "{text}");

    let commented = "{\n  // mine\n  \"servers\": {}\n}\n";
    std::fs::write(&vscode, commented).unwrap();
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        manifest.to_str().unwrap(),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("could not add this server to `.vscode/mcp.json`: it is not valid JSON"),
        "{}",
        stderr(&o)
    );
    assert_eq!(read(&vscode), commented);
}

/// `new` into a directory whose path is not UTF-8 is refused before anything is created.
#[test]
fn new_refuses_a_non_utf8_path_and_creates_nothing() {
    use std::os::unix::ffi::OsStrExt as _;
    let sb = Sandbox::new();
    let dir = sb.path().join(std::ffi::OsStr::from_bytes(b"srv-\xff"));
    let o = sb
        .cmd(&["new", "--no-build", "u8-srv", "--path"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("srv-\u{fffd}` is not valid UTF-8"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.exists(), "nothing created");
}

/// A failed `new` removes what it created, and only that: an empty directory given with
/// `--path` that was there before stays (empty), the enclosing repository is as it was.
#[test]
fn a_failed_new_removes_only_what_it_created() {
    let sb = Sandbox::new();
    let repo = sb.path().join("repo");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    std::fs::write(repo.join(".github"), "not a directory\n").unwrap();
    std::fs::create_dir(repo.join("empty")).unwrap();
    let before = tree(&repo);
    for (args, dir) in [
        (
            vec!["new", "--no-build", "fail-srv", "--path", "empty"],
            "empty",
        ),
        (
            vec!["new", "--no-build", "fail-srv", "--path", "a/b/c"],
            "a/b/c",
        ),
    ] {
        let o = sb.cmd(&args).current_dir(&repo).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "refusing to write `{}`: {} exists and is not a directory",
                repo.join(".github/workflows/mcp-identity.yml").display(),
                repo.join(".github").display()
            )),
            "{dir}: {}",
            stderr(&o)
        );
        assert_eq!(tree(&repo), before, "{dir}: left as it was");
    }
}

// ----- the slow one: build the `new` project and talk to it through `run` ---------------------

/// A raw newline-delimited JSON-RPC peer on `cargo mcp-dev run`'s stdin/stdout.
struct Client {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Client {
    fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message from `run` (answers and notifications), or a panic with its stderr.
    fn recv(&self, deadline: Instant) -> Value {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("non-JSON on stdout ({e}): {line}")),
            Err(e) => panic!(
                "no message from run ({e}); stderr:\n{}",
                self.stderr.lock().unwrap()
            ),
        }
    }

    /// The answer to request `id`, skipping notifications; returns them too.
    fn answer(&self, id: u64, deadline: Instant) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        loop {
            let m = self.recv(deadline);
            if m["id"] == json!(id) && m.get("method").is_none() {
                return (m, notes);
            }
            notes.push(m);
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn new_project_builds_and_serves_under_run() {
    let sb = Sandbox::new();
    let o = sb.run(&["new", "--no-build", "onboard-srv"]);
    assert_ok(&o);
    let root = sb.path().join("onboard-srv");
    // Same dependency versions as the e2e fixture, whose target dir already holds rmcp & co.
    std::fs::copy(
        Path::new(REPO).join("e2e/fixtures/inventory/Cargo.lock"),
        root.join("Cargo.lock"),
    )
    .unwrap();
    let target_dir = Path::new(REPO).join("target/e2e-fixture-target");
    let notes = sb.path().join("notes.jsonl");
    // `init` in the package `new` made: nothing to write, and the build at its end (into the
    // shared target dir, with the pinned lock), so that `run` below starts warm.
    let o = sb
        .cmd(&[
            "init",
            "--manifest-path",
            root.join("Cargo.toml").to_str().unwrap(),
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .output()
        .unwrap();
    assert_ok(&o);
    assert!(
        stderr(&o).contains("is already initialized"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("build complete: "), "{}", stderr(&o));

    let mut child = sb
        .cmd(&[
            "run",
            "--manifest-path",
            root.join("Cargo.toml").to_str().unwrap(),
            "--target-dir",
            target_dir.to_str().unwrap(),
            "--no-watch",
            // The target dir is shared across runs, each with its own audit key in its own
            // CARGO_MCP_DEV_HOME: keep this run's log with its key.
            "--audit-log",
            sb.path().join("audit.jsonl").to_str().unwrap(),
        ])
        .env("ONBOARD_SRV_NOTES_FILE", &notes)
        // Where the host files start it (and where `init` built it).
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr_buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = stderr_buf.clone();
    let child_stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(child_stderr).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let stdin = child.stdin.take();
    let mut client = Client {
        child,
        stdin,
        lines,
        stderr: stderr_buf,
    };
    // Generous: a cold build of rmcp takes about a minute on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(600);

    client.send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "onboarding-test", "version": "1"}}}),
    );
    let (init, _) = client.answer(0, deadline);
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    // Until the server is up, `run` answers tools/list from the last known catalog and refuses
    // calls with `identity_pending`; an agent waits and calls again, and refetches the tool list
    // when told `catalog_stale`. So does this client.
    let mut id = 1;
    let read_call = loop {
        client.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "list_notes", "arguments": {}}}));
        let (answer, _) = client.answer(id, deadline);
        id += 1;
        if answer["result"]["isError"] != true {
            break answer;
        }
        let payload = &answer["result"]["_meta"]["dev.cargo-mcp-dev/error"];
        match payload["error"].as_str() {
            Some("identity_pending") => std::thread::sleep(Duration::from_millis(300)),
            Some("catalog_stale") => {
                client.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
                client.answer(id, deadline);
                id += 1;
            }
            _ => panic!("list_notes failed: {answer}"),
        }
        assert!(Instant::now() < deadline, "the server never came up");
    };
    assert_eq!(read_call["result"]["isError"], false, "{read_call}");
    assert_eq!(
        read_call["result"]["structuredContent"],
        json!({"notes": []}),
        "{read_call}"
    );

    client.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let (list, _) = client.answer(id, deadline);
    id += 1;
    let mut names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["add_note", "list_notes"], "{list}");

    // The write tool is gated by the generated configuration: refused, and it did not run.
    client.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "add_note", "arguments": {"text": "hello"}}}));
    let (write_call, _) = client.answer(id, deadline);
    assert_eq!(write_call["result"]["isError"], true, "{write_call}");
    let payload: Value =
        serde_json::from_str(write_call["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(payload["error"], "authorization_required", "{payload}");
    assert_eq!(payload["tool"], "add_note", "{payload}");
    assert!(!notes.exists(), "a denied call must not reach the server");

    // Closing stdin ends the session.
    client.stdin = None;
    let stop = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = client.child.try_wait().unwrap() {
            assert!(status.success(), "run exited with {status}");
            break;
        }
        assert!(Instant::now() < stop, "run did not exit after stdin closed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = client.stderr.lock().unwrap().clone();
    assert!(err.contains("server started: pid="), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("build complete: ") && l.contains(" unchanged (")),
        "run found the build `init` recorded (a warm start): {err}"
    );
    assert!(
        err.contains("call denied: add_note (authorization_required)"),
        "{err}"
    );
}

// ----- the generated inspector.sh against the real Inspector CLI -------------------------------

fn peers_dir() -> PathBuf {
    std::env::var_os("MCP_DEV_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(REPO).join("target/e2e-peers"))
}

/// The pinned peers (idempotent; a missing Inspector is a failure, never a skip).
fn install_peers() {
    let out = Command::new("bash")
        .arg(Path::new(REPO).join("e2e/install-peers.sh"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2e/install-peers.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

/// `mcp-dev/inspector.sh --cli --method tools/call --tool-name … --tool-arg …` really calls the
/// tool: the Inspector's variadic `--tool-arg` must not swallow the server command.
#[test]
fn generated_inspector_script_calls_a_tool_through_the_real_inspector_cli() {
    install_peers();
    let inspector = peers_dir().join("node/node_modules/.bin/mcp-inspector");
    assert!(inspector.is_file(), "{} missing", inspector.display());
    let sb = Sandbox::new();
    assert_ok(&sb.run(&["new", "--no-build", "inspect-srv"]));
    let root = sb.path().join("inspect-srv");
    let manifest = root.join("Cargo.toml");
    // The write tool exempt, so one one-shot process can run it; the log with this run's key.
    let text = read(&manifest).replace(
        "exempt = [\"list_notes\"]",
        &format!(
            "exempt = [\"list_notes\", \"add_note\"]\naudit-log = \"{}\"",
            sb.path().join("audit.jsonl").display()
        ),
    );
    assert!(
        text.contains("\"add_note\"]"),
        "the template's exempt line moved:\n{text}"
    );
    std::fs::write(&manifest, text).unwrap();
    std::fs::copy(
        Path::new(REPO).join("e2e/fixtures/inventory/Cargo.lock"),
        root.join("Cargo.lock"),
    )
    .unwrap();
    // The new exemption weakens gating: a human accepts it (issue 36, `approve --policy`).
    let mp = manifest.to_str().unwrap();
    assert_ok(&sb.run(&["approve", "--policy", "--yes", "--manifest-path", mp]));
    let target_dir = Path::new(REPO).join("target/e2e-fixture-target");
    // One host session first, until the real tool list arrives: a one-shot process measures
    // the script, not a cold build or how a first contact is answered (issue of its own).
    warm_session(&sb, &manifest, &target_dir);

    // `npx` resolves to the pinned Inspector from the peers dir, and insists on the version the
    // script names.
    let shim_dir = sb.path().join("shim");
    std::fs::create_dir(&shim_dir).unwrap();
    let shim = shim_dir.join("npx");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\n[ \"$1\" = --yes ] && shift\n[ \"$1\" = @modelcontextprotocol/inspector@0.15.0 ] || {{ echo \"npx shim: unexpected package $1\" >&2; exit 97; }}\nshift\nexec '{}' \"$@\"\n",
            inspector.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let notes = sb.path().join("notes.jsonl");
    let path = format!(
        "{}:{}",
        shim_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let one_shot = || {
        let mut cmd = Command::new(root.join("mcp-dev/inspector.sh"));
        cmd.args([
            "--cli",
            "--method",
            "tools/call",
            "--tool-name",
            "add_note",
            "--tool-arg",
            "text=hello from the inspector",
        ])
        .current_dir(sb.path())
        .env("PATH", &path)
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_MCP_DEV_HOME", sb.path().join("home"))
        .env("INSPECT_SRV_NOTES_FILE", &notes)
        .stdin(Stdio::null());
        let out = run_with_timeout(cmd, Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "inspector.sh failed ({}):\n{stdout}\n{}",
            out.status,
            stderr(&out)
        );
        let result: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("not a JSON tool result ({e}):\n{stdout}"));
        result
    };
    // Each one-shot is a new host process and a fresh start of the server: a refusal that says
    // "retry" (the server not up yet, or how a first contact was answered) is retried, as an
    // agent would. Anything else is final.
    let mut result = one_shot();
    for _ in 0..4 {
        let reason = result["_meta"]["dev.cargo-mcp-dev/error"]["error"].clone();
        if reason != "identity_pending" && reason != "catalog_stale" {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        result = one_shot();
    }
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["structuredContent"],
        json!({"saved": true}),
        "{result}"
    );
    assert_eq!(
        read(&notes).trim_end(),
        r#"{"text":"hello from the inspector"}"#,
        "the tool ran once, with the argument given"
    );
}

/// A raw host session on `cargo mcp-dev run` that lists tools until the server's real list
/// arrives, then closes: the server is built and its catalog is known afterwards.
fn warm_session(sb: &Sandbox, manifest: &Path, target_dir: &Path) {
    let mut child = sb
        .cmd(&[
            "run",
            "--manifest-path",
            manifest.to_str().unwrap(),
            "--no-watch",
        ])
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr_buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = stderr_buf.clone();
    let child_stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(child_stderr).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let stdin = child.stdin.take();
    let mut client = Client {
        child,
        stdin,
        lines,
        stderr: stderr_buf,
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    client.send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "onboarding-warm-up", "version": "1"}}}),
    );
    client.answer(0, deadline);
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for id in 1.. {
        client.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
        let (list, _) = client.answer(id, deadline);
        if list["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server never listed its tools"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    client.stdin = None;
    let stop = Instant::now() + Duration::from_secs(30);
    while client.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < stop, "run did not exit after stdin closed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `cmd` to completion, killing it after `limit`.
fn run_with_timeout(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            panic!("did not finish within {limit:?}");
        }
    }
}

/// The workflow installs cargo-mcp-dev the way the copy that generated it was installed (cargo's
/// record in its install root), so there is nothing to fill in.
#[test]
fn workflow_installs_cargo_mcp_dev_the_way_it_was_installed() {
    let sb = Sandbox::new();
    let install = |name: &str, source: &str| -> PathBuf {
        let root = sb.path().join(name);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let exe = root.join("bin/cargo-mcp-dev");
        std::fs::copy(BIN, &exe).unwrap();
        std::fs::write(
            root.join(".crates2.json"),
            json!({"installs": {
                format!("cargo-mcp-dev {} ({source})", env!("CARGO_PKG_VERSION")): {"bins": ["cargo-mcp-dev"]}
            }})
            .to_string(),
        )
        .unwrap();
        exe
    };
    let install_step = |exe: &Path, pkg: &str| -> String {
        let o = Command::new(exe)
            .args(["mcp-dev", "new", "--no-build", pkg])
            .current_dir(sb.path())
            .env("CARGO_MCP_DEV_HOME", sb.path().join("home"))
            .output()
            .unwrap();
        assert_ok(&o);
        let yml = read(
            &sb.path()
                .join(pkg)
                .join(".github/workflows/mcp-identity.yml"),
        );
        let doc: Value = serde_yaml_ng::from_str(&yml).unwrap();
        doc["jobs"]["identity"]["steps"][2]["run"]
            .as_str()
            .unwrap()
            .trim()
            .to_string()
    };

    let exe = install(
        "from-git",
        "git+https://github.com/acme/cargo-mcp-dev?branch=main#0123456789abcdef0123456789abcdef01234567",
    );
    assert_eq!(
        install_step(&exe, "git-srv"),
        "cargo install --locked --git https://github.com/acme/cargo-mcp-dev --rev 0123456789abcdef0123456789abcdef01234567 cargo-mcp-dev"
    );

    // Installed from a clone (`cargo install --locked --path .`) whose origin is public: that
    // repository at the clone's HEAD.
    let clone = sb.path().join("clone");
    std::fs::create_dir(&clone).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .args(args)
            .current_dir(&clone)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .unwrap();
        assert_ok(&o);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "x"]);
    git(&[
        "remote",
        "add",
        "origin",
        "git@github.com:acme/cargo-mcp-dev.git",
    ]);
    let head = git(&["rev-parse", "HEAD"]);
    let exe = install("from-path", &format!("path+file://{}", clone.display()));
    assert_eq!(
        install_step(&exe, "path-srv"),
        format!(
            "cargo install --locked --git https://github.com/acme/cargo-mcp-dev.git --rev {head} cargo-mcp-dev"
        )
    );

    // Nothing to derive a public source from (a clone without a public remote): crates.io, at
    // this version.
    git(&["remote", "remove", "origin"]);
    assert_eq!(
        install_step(&exe, "local-srv"),
        format!(
            "cargo install --locked cargo-mcp-dev --version {}",
            env!("CARGO_PKG_VERSION")
        )
    );
}

// ----- the build `new` and `init` end with ---------------------------------------------------

/// `init` ends with the build `cargo mcp-dev build` does: after the files, the same status
/// line, an identity recorded with its stored executable (what `run` takes for a warm start);
/// `build` afterwards finds the same identity. `--no-build` builds nothing.
#[test]
fn init_ends_with_the_build_that_build_and_run_would_do() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    write_package(&pkg, "warm-srv", None, "");
    let manifest = pkg.join("Cargo.toml");
    let mp = manifest.to_str().unwrap();
    let o = sb.run(&["init", "--manifest-path", mp]);
    assert_ok(&o);
    let err = stderr(&o);
    let created = err.find("created .mcp.json\n").expect("files first");
    let building = err
        .find("building the server once now, so that a host connecting next gets its tools at once (--no-build skips this)")
        .unwrap_or_else(|| panic!("{err}"));
    let built = err
        .find("build complete: target/debug/warm-srv changed (none -> sha256:")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(created < building && building < built, "{err}");
    let record = json_file(&pkg.join("target/mcp-dev/identity/warm-srv.dev.json"));
    let stored = record["executable"]["storePath"].as_str().unwrap();
    assert!(Path::new(stored).is_file(), "{stored}");
    let digest = record["identityDigest"].as_str().unwrap().to_string();

    // The same build as `build`'s (run where the host files start `run`: the package).
    let o = sb
        .cmd(&["build", "--manifest-path", mp])
        .current_dir(&pkg)
        .output()
        .unwrap();
    assert_ok(&o);
    assert!(
        stderr(&o).contains("build complete: target/debug/warm-srv unchanged ("),
        "{}",
        stderr(&o)
    );
    let again = json_file(&pkg.join("target/mcp-dev/identity/warm-srv.dev.json"));
    assert_eq!(again["identityDigest"], json!(digest));

    // --no-build: the files, no build.
    let other = sb.path().join("other");
    write_package(&other, "cold-srv", None, "");
    let o = sb.run(&[
        "init",
        "--no-build",
        "--manifest-path",
        other.join("Cargo.toml").to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert!(other.join(".mcp.json").is_file());
    assert!(
        !stderr(&o).contains("build complete") && !stderr(&o).contains("building"),
        "{}",
        stderr(&o)
    );
    assert!(!other.join("target").exists(), "nothing built");
}

/// A server that does not compile: `init` still writes every file, shows the compiler's
/// output, says what failed (the first error with its place) and how to try again, and exits
/// 101 (as `build` does). Following the note then works.
#[test]
fn a_failed_first_build_is_explained_and_the_files_are_written_all_the_same() {
    let sb = Sandbox::new();
    let pkg = sb.path().join("pkg");
    let original = write_package(&pkg, "broken-srv", None, "");
    std::fs::write(
        pkg.join("src/main.rs"),
        "fn main() {\n    let x: u32 = \"a\";\n}\n",
    )
    .unwrap();
    let manifest = pkg.join("Cargo.toml");
    let mp = manifest.to_str().unwrap();
    let o = sb.run(&["init", "--manifest-path", mp]);
    assert_eq!(o.status.code(), Some(101), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("error[E0308]: mismatched types"),
        "cargo's output: {err}"
    );
    assert!(
        err.contains("build failed: 1 error in src/main.rs (last good: none)"),
        "{err}"
    );
    assert!(
        err.contains("error: the server does not build (1 error; the first: src/main.rs:2:18: error[E0308]: mismatched types)"),
        "{err}"
    );
    assert!(
        err.contains(&format!("note: the configuration block and host files were written all the same; fix the cause and build with `cargo mcp-dev build --manifest-path {mp}`")),
        "{err}"
    );
    for f in INIT_FILES {
        assert!(pkg.join(f).is_file(), "{f} written");
    }
    assert!(read(&manifest).starts_with(&original));
    assert!(read(&manifest).contains("[package.metadata.mcp-dev]"));
    assert_host_files(&pkg, "broken-srv", &manifest);

    std::fs::write(pkg.join("src/main.rs"), "fn main() {}\n").unwrap();
    assert_ok(&sb.run(&["build", "--manifest-path", mp]));
}

/// `new` ends with the build too; when cargo cannot even resolve the package (offline, no
/// crates cached) it says so, keeps the package, and says how to try again. The cargo flag
/// reaches cargo.
#[test]
fn new_that_cannot_fetch_its_dependencies_keeps_the_package_and_says_how_to_retry() {
    let sb = Sandbox::new();
    let empty_cargo_home = sb.path().join("cargo-home");
    std::fs::create_dir_all(&empty_cargo_home).unwrap();
    let o = sb
        .cmd(&["new", "offline-srv", "--offline"])
        .env("CARGO_HOME", &empty_cargo_home)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(102), "{err}");
    let root = sb.path().join("offline-srv");
    for f in NEW_FILES {
        assert!(root.join(f).is_file(), "{f} kept: {err}");
    }
    assert!(
        err.contains("error: the server could not be built: "),
        "{err}"
    );
    assert!(err.contains("offline"), "cargo's reason: {err}");
    assert!(
        err.contains(&format!(
            "note: the package and its host files were written to {} all the same; fix the cause and build with `cargo mcp-dev build --manifest-path {}`",
            root.display(),
            root.join("Cargo.toml").display()
        )),
        "{err}"
    );
    assert!(!err.contains("ready: "), "not ready: {err}");
}

/// The point of the build: a host's first `run` right after `init` starts warm. A real
/// session on the fake server: its first build finds the identity `init` recorded
/// (`unchanged`), and the host's `initialize` is answered by the server, never by the
/// supervisor for a server still building.
#[test]
fn run_right_after_init_starts_warm() {
    use common::fixture::Project;
    use common::session::Setup;
    let project = Project::built_fake_server(common::session::SUITE);
    let o = project.run(["init"]);
    assert!(o.code == 0, "{}", o.stderr);
    assert!(
        o.stderr
            .contains("build complete: target/debug/fake-server changed (none -> "),
        "{}",
        o.stderr
    );
    let mut s = Setup::on(project).start();
    s.ready_legacy();
    let lines = s.stderr_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("build complete: target/debug/fake-server unchanged (")),
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("while the server is being built")),
        "a cold start: {lines:?}"
    );
    s.finish();
}
