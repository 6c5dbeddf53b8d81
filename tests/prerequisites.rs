//! The test scripts check the machine first: with a tool missing (simulated through `PATH`) or
//! too old, `e2e/test-all.sh` and `e2e/install-peers.sh` stop before installing or building
//! anything, with one exact line per problem that says how to get it.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// What the scripts themselves need besides the prerequisites.
const BASICS: &[&str] = &[
    "bash", "sed", "head", "dirname", "date", "cat", "cut", "env", "mkdir", "rm", "cp", "sort",
    "tr",
];
/// The prerequisites, each linked unless a test hides or fakes it.
const TOOLS: &[&str] = &[
    "cargo",
    "rustc",
    "node",
    "npm",
    "python3",
    "sha256sum",
    "flock",
];

/// The real executable of `tool` (a pyenv shim would need pyenv on PATH; rustup's proxies work
/// through a link because they look at their own name).
fn which(tool: &str) -> PathBuf {
    if tool == "python3" {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .unwrap();
        return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!p.is_empty(), "{tool} must be installed to run this test");
    PathBuf::from(p)
}

/// A `bin` dir with every tool but `hidden`, and `fakes` as scripts in place of the real ones.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new(hidden: &[&str], fakes: &[(&str, &str)]) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        for tool in BASICS.iter().chain(TOOLS) {
            if hidden.contains(tool) || fakes.iter().any(|(n, _)| n == tool) {
                continue;
            }
            std::os::unix::fs::symlink(which(tool), bin.join(tool)).unwrap();
        }
        for (name, script) in fakes {
            let p = bin.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Machine { dir }
    }

    fn peers(&self) -> PathBuf {
        self.dir.path().join("peers")
    }

    /// `bash SCRIPT` from the repository with this machine's PATH.
    fn run(&self, script: &str) -> Output {
        Command::new(which("bash"))
            .arg(Path::new(REPO).join(script))
            .current_dir(REPO)
            .env("PATH", self.dir.path().join("bin"))
            .env_remove("MCP_DEV_PYTHON")
            .env("MCP_DEV_PEERS_DIR", self.peers())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

fn rust_version() -> String {
    let manifest = std::fs::read_to_string(Path::new(REPO).join("Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .map(|v| v.trim_end_matches('"').to_string())
        .unwrap()
}

/// Runs `script` on a machine and checks it stopped with exactly `problems`, then the summary,
/// having installed and built nothing.
#[track_caller]
fn assert_stops_with(m: &Machine, script: &str, problems: &[String]) {
    let out = m.run(script);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{script}:\n{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("prerequisites: "))
        .collect();
    let mut expected: Vec<String> = problems
        .iter()
        .map(|p| format!("prerequisites: {p}"))
        .collect();
    expected.push(format!(
        "prerequisites: {} problem(s) above; nothing was installed or run (README.md, section Prerequisites)",
        problems.len()
    ));
    assert_eq!(lines, expected, "{script}:\n{stderr}");
    assert!(!m.peers().exists(), "{script} installed something");
    assert!(!stderr.contains("==> cargo test"), "{stderr}");
    assert!(!stderr.contains("==> installing"), "{stderr}");
}

#[test]
fn a_complete_machine_passes_the_check() {
    let m = Machine::new(&[], &[]);
    let out = m.run("e2e/check-prerequisites.sh");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_tools_are_named_with_how_to_get_them() {
    let rv = rust_version();
    let m = Machine::new(&["cargo", "rustc"], &[]);
    assert_stops_with(
        &m,
        "e2e/test-all.sh",
        &[format!(
            "missing: cargo (the Rust toolchain, {rv} or newer): install it with rustup (https://rustup.rs), then open a new shell"
        )],
    );
    let m = Machine::new(&["node", "npm"], &[]);
    assert_stops_with(
        &m,
        "e2e/test-all.sh",
        &[
            "missing: node (Node.js 20 or newer, for the end-to-end tests): install it from https://nodejs.org or your package manager (Debian/Ubuntu: apt-get install nodejs npm)".into(),
            "missing: npm (comes with Node.js; Debian/Ubuntu: apt-get install npm)".into(),
        ],
    );
    let m = Machine::new(&["python3"], &[]);
    let python_missing = "missing: python3 (Python 3.10 or newer with venv, for the end-to-end tests): Debian/Ubuntu: apt-get install python3 python3-venv (or set MCP_DEV_PYTHON)".to_string();
    assert_stops_with(&m, "e2e/test-all.sh", std::slice::from_ref(&python_missing));
    // install-peers.sh, run on its own, checks the same way before touching the peers dir.
    assert_stops_with(&m, "e2e/install-peers.sh", &[python_missing]);
}

#[test]
fn old_or_incomplete_tools_are_named_too() {
    // Debian's python3 without python3-venv: `import ensurepip` fails.
    let real_python = which("python3");
    let no_venv = format!(
        "case \"$*\" in *ensurepip*) echo 'No module named ensurepip' >&2; exit 1;; esac\nexec '{}' \"$@\"",
        real_python.display()
    );
    let have_python = String::from_utf8(
        Command::new(&real_python)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let m = Machine::new(
        &[],
        &[
            ("python3", &no_venv),
            ("node", "echo v18.19.0"),
            ("rustc", "echo 'rustc 1.70.0 (90c541806 2023-05-31)'"),
        ],
    );
    let rv = rust_version();
    assert_stops_with(
        &m,
        "e2e/test-all.sh",
        &[
            format!(
                "too old: rustc 1.70.0; this project needs {rv} or newer (rust-version in Cargo.toml): run `rustup update stable`"
            ),
            "too old: node 18.19.0; the end-to-end tests need Node.js 20 or newer (https://nodejs.org)".into(),
            format!(
                "python3 {} has no working venv module (`python3 -m venv` needs venv and ensurepip): Debian/Ubuntu: apt-get install python3-venv",
                have_python.trim()
            ),
        ],
    );
}
