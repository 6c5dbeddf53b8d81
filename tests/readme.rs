//! The README is the guide: read top to bottom it answers what this is, what is needed, how to
//! install, how to run under a host, the status lines, approving, CI and the figures; its
//! prerequisites match Cargo.toml; every `cargo install` is `--locked`; and its copy-paste host
//! blocks and CI workflow are exactly what `new` generates (paths aside), so they cannot drift.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_cargo-mcp-dev");
const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn readme() -> String {
    std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap()
}

/// The text of the `## ` section whose heading starts with `heading` (up to the next `## `).
fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("no `## {heading}` section"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map(|e| e + 4).unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The fenced code blocks of `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&fence) {
        let body = &rest[i + fence.len()..];
        let end = body.find("```").unwrap();
        out.push(body[..end].to_string());
        rest = &body[end + 3..];
    }
    out
}

#[test]
fn read_top_to_bottom_it_answers_the_newcomers_questions_in_order() {
    let text = readme();
    let headings: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let position = |h: &str| {
        headings
            .iter()
            .position(|x| x.starts_with(h))
            .unwrap_or_else(|| panic!("no `## {h}` in {headings:?}"))
    };
    // What is this: the text before the first section says it.
    let intro = &text[..text.find("\n## ").unwrap()];
    assert!(intro.contains("`cargo run` for MCP servers"), "{intro}");
    let order = [
        "Prerequisites",
        "Install",
        "Run your server under a host",
        "What you see: status lines",
        "Approvals",
        "CI",
        "Benchmarks",
    ];
    let positions: Vec<usize> = order.iter().map(|h| position(h)).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "sections out of order: {order:?} at {positions:?} in {headings:?}"
    );
    assert_eq!(position("Prerequisites"), 0, "prerequisites come first");
}

#[test]
fn prerequisites_match_the_project() {
    let manifest = std::fs::read_to_string(Path::new(REPO).join("Cargo.toml")).unwrap();
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .unwrap()
        .trim_end_matches('"');
    let pre = section(&readme(), "Prerequisites");
    for needle in [
        format!("{rust_version} or newer (`rust-version` in Cargo.toml)"),
        "Node 20 or newer".into(),
        "Node.js with npm".into(),
        "Python 3 with the `venv` module".into(),
        "apt-get install python3 python3-venv".into(),
        "e2e/check-prerequisites.sh".into(),
    ] {
        assert!(pre.contains(&needle), "missing `{needle}` in:\n{pre}");
    }
    // The script checks the same versions the README states.
    let script =
        std::fs::read_to_string(Path::new(REPO).join("e2e/check-prerequisites.sh")).unwrap();
    assert!(script.contains("version_at_least \"${have:-0}\" 20"));
    assert!(script.contains("version_at_least \"${have:-0}\" 3.10"));
    assert!(pre.contains("3.10 or newer"), "{pre}");
}

#[test]
fn install_is_locked_everywhere() {
    let install = section(&readme(), "Install");
    let first = blocks(&install, "sh");
    let commands: Vec<&str> = first
        .first()
        .expect("an sh block in Install")
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        commands,
        ["cargo install --locked --path .", "cargo mcp-dev demo"]
    );
    // README, docs, templates, e2e docs and scripts: no `cargo install` without --locked.
    let mut files: Vec<PathBuf> = vec![Path::new(REPO).join("README.md")];
    for dir in ["docs", "templates", "e2e", ".ci"] {
        for entry in walkdir::WalkDir::new(Path::new(REPO).join(dir)) {
            let entry = entry.unwrap();
            let p = entry.path();
            if entry.file_type().is_file()
                && !p.components().any(|c| c.as_os_str() == "target")
                && !p.to_string_lossy().contains("package-lock")
            {
                files.push(p.to_path_buf());
            }
        }
    }
    let mut seen = 0;
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        // A command: `cargo install` followed by an option or a crate name and options (not a
        // pattern such as `'^cargo install '` in a script, nor prose).
        let is_command = |l: &str| {
            l.match_indices("cargo install ").any(|(i, m)| {
                let rest = &l[i + m.len()..];
                rest.starts_with("--")
                    || (rest.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && rest.contains(" --"))
            })
        };
        for line in text.lines().filter(|l| is_command(l)) {
            seen += 1;
            assert!(line.contains("--locked"), "{}: {line}", f.display());
        }
    }
    assert!(seen >= 3, "found only {seen} `cargo install` lines");
}

/// A `new` package named `my-server` in a temp dir (no git work tree around it: the workflow
/// goes to the package root, as for a package at a repository's root).
fn generated() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap().join("my-server");
    let out = Command::new(BIN)
        .args(["mcp-dev", "new", "--no-build", "my-server", "--path"])
        .arg(&root)
        .env("CARGO_MCP_DEV_HOME", tmp.path().join("home"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (tmp, root)
}

fn json_file(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn host_blocks_are_what_new_generates() {
    let text = readme();
    let run = section(&text, "Run your server under a host");
    let hosts = &run[run
        .find("### Host configuration")
        .expect("a host configuration part")..];
    let readme_blocks: Vec<Value> = blocks(hosts, "json")
        .iter()
        .map(|b| serde_json::from_str(b).unwrap_or_else(|e| panic!("not JSON ({e}):\n{b}")))
        .collect();
    assert_eq!(
        readme_blocks.len(),
        4,
        "Claude Code, Claude Desktop, Cursor, VS Code"
    );
    for (host, name) in [
        ("Claude Code", "`.mcp.json`"),
        ("Claude Desktop", "`claude_desktop_config.json`"),
        ("Cursor", "`.cursor/mcp.json`"),
        ("VS Code", "`.vscode/mcp.json`"),
        ("MCP Inspector", "`mcp-dev/inspector.sh`"),
    ] {
        assert!(
            hosts.contains(&format!("{host}: ")) || hosts.contains(&format!("{host} (")),
            "no {host} part"
        );
        assert!(hosts.contains(name), "{name}");
    }
    let (_tmp, root) = generated();
    let manifest = "/home/you/my-server/Cargo.toml";
    let path = "/home/you/.cargo/bin:/usr/local/bin:/usr/bin:/bin";
    for (file, key, readme_block) in [
        (".mcp.json", "mcpServers", &readme_blocks[0]),
        (
            "mcp-dev/claude_desktop_config.json",
            "mcpServers",
            &readme_blocks[1],
        ),
        (".cursor/mcp.json", "mcpServers", &readme_blocks[2]),
        (".vscode/mcp.json", "servers", &readme_blocks[3]),
    ] {
        let mut g = json_file(&root.join(file));
        let entry = &mut g[key]["my-server"];
        entry["args"][3] = json!(manifest);
        entry["env"]["PATH"] = json!(path);
        assert_eq!(readme_block, &g, "README block for {file}");
    }
    // The Inspector line: the same command as the generated script, same argument order.
    let sh = blocks(hosts, "sh");
    let inspector_block = sh
        .iter()
        .find(|b| b.contains("@modelcontextprotocol/inspector"))
        .expect("an Inspector block");
    let script = std::fs::read_to_string(root.join("mcp-dev/inspector.sh")).unwrap();
    let exec = script
        .lines()
        .skip_while(|l| !l.starts_with("exec npx"))
        .collect::<Vec<_>>()
        .join("\n");
    let normalize = |s: &str| {
        s.replace("\\\n", " ")
            .split_whitespace()
            .map(|w| {
                if w.starts_with("'PATH=") || w.starts_with("PATH=") {
                    "PATH=…"
                } else if w.ends_with("Cargo.toml") || w.ends_with("Cargo.toml'") {
                    "MANIFEST"
                } else {
                    w
                }
            })
            .filter(|w| *w != "exec" && *w != "$cli" && *w != "\"$@\"")
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(normalize(inspector_block), normalize(&exec));
}

#[test]
fn ci_workflow_block_is_what_new_generates() {
    let ci = section(&readme(), "CI");
    let yaml = blocks(&ci, "yaml");
    assert_eq!(yaml.len(), 1, "one workflow block");
    let readme_doc: Value = serde_yaml_ng::from_str(&yaml[0]).unwrap();
    let (_tmp, root) = generated();
    let generated: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root.join(".github/workflows/mcp-identity.yml")).unwrap(),
    )
    .unwrap();
    assert_eq!(readme_doc, generated);
    // The prose names each step.
    for step in [
        "check out",
        "install Rust",
        "install cargo-mcp-dev with `--locked`",
        "run `check`",
        "keep\n`identity.json` as an artifact",
    ] {
        assert!(ci.contains(step), "CI section does not describe `{step}`");
    }
    // And says what --expect compares.
    for needle in [
        "launch\narguments",
        "launch directory",
        "--include-launch-dir",
    ] {
        assert!(
            ci.replace("**", "").contains(needle),
            "CI section lacks `{needle}`"
        );
    }
}
