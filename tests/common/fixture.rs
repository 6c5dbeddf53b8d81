//! Fixture projects for integration tests that drive the real `cargo-mcp-dev` binary.
//!
//! Owns copying the std-only fixtures under `tests/fixtures/` into per-test temp directories,
//! running the binary there with an isolated environment, and small file-editing helpers. It
//! never touches the fixtures in place, `~`, or any target directory but its own.
//!
//! Builds are slow on a shared 2-core machine, so `fake-server` is built once per test process
//! into `target/test-fixtures/<suite>/fake-server` (project and its own `target/` inside it), and
//! each test gets a `cp -a` copy of that tree: mtimes survive the copy, so cargo sees the copied
//! build as fresh and the test's first build is a no-op.
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// The crate root (`/work/main`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `tests/fixtures/<name>`.
pub fn fixture_dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

/// The binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
}

/// Env vars that would make results depend on the developer's shell; removed for every run.
const SCRUBBED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_TERM_COLOR",
    "CARGO_MCP_DEV_HOME",
    "RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WRAPPER",
];

/// A copied fixture project in its own temp dir, with its own `CARGO_MCP_DEV_HOME`.
pub struct Project {
    _tmp: tempfile::TempDir,
    /// The package root (holds Cargo.toml).
    pub root: PathBuf,
    /// `CARGO_MCP_DEV_HOME` for this test only.
    pub home: PathBuf,
    /// Extra env for every command (set or removed).
    env: Vec<(String, Option<String>)>,
    /// Before the first `run`, accept whatever policy the project asks for, as a human would
    /// with `approve --policy` (issue 36: a weakening of gating waits for that), so tests of
    /// other things see the policy they configure. Off for the tests of that rule.
    pub accept_policy: bool,
}

/// Result of one command run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Fails the test (showing all of stderr) unless stderr contains `needle`.
    #[track_caller]
    pub fn assert_stderr_has(&self, needle: impl AsRef<str>) {
        let needle = needle.as_ref();
        assert!(
            self.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{}",
            self.stderr
        );
    }

    /// Panics with the whole output unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(
            self.code, code,
            "expected exit code {code}, got {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// The single `build complete|failed: …` line on stderr.
    #[track_caller]
    pub fn status_line(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("build complete: ") || l.starts_with("build failed: "))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "expected exactly one status line, stderr was:\n{}",
            self.stderr
        );
        lines[0].to_string()
    }

    /// The component list of a `changed (A -> B; x, y)` status line, in order.
    #[track_caller]
    pub fn changed_components(&self) -> Vec<String> {
        let line = self.status_line();
        let inner = line
            .rsplit_once("; ")
            .and_then(|(_, rest)| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("not a `changed (A -> B; …)` line: {line}"));
        assert!(
            line.contains(" changed (sha256:"),
            "not a changed-from-previous line: {line}"
        );
        inner.split(", ").map(str::to_string).collect()
    }
}

static BASELINE: Mutex<Option<PathBuf>> = Mutex::new(None);

impl Project {
    /// A fresh copy of `tests/fixtures/<name>` (not built).
    pub fn copy_of(name: &str) -> Project {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("mcp-dev-{name}-"))
            .tempdir()
            .expect("temp dir");
        let root = tmp.path().join(name);
        copy_tree(&fixture_dir(name), &root, false);
        Project::at(tmp, root)
    }

    /// A copy of `fake-server` whose `target/` already holds a dev build (cargo sees it fresh),
    /// and no identity recorded yet.
    pub fn built_fake_server(suite: &str) -> Project {
        let base = baseline_fake_server(suite);
        let tmp = tempfile::Builder::new()
            .prefix("mcp-dev-fake-server-")
            .tempdir()
            .expect("temp dir");
        let root = tmp.path().join("fake-server");
        copy_tree(&base, &root, true);
        Project::at(tmp, root)
    }

    /// An empty project directory (stands in for a project moved out of its owner).
    pub fn empty() -> Project {
        let tmp = tempfile::Builder::new()
            .prefix("mcp-dev-empty-")
            .tempdir()
            .expect("temp dir");
        let root = tmp.path().join("empty");
        std::fs::create_dir_all(&root).unwrap();
        Project::at(tmp, root)
    }

    fn at(tmp: tempfile::TempDir, root: PathBuf) -> Project {
        let home = tmp.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        Project {
            _tmp: tmp,
            root,
            home,
            env: Vec::new(),
            accept_policy: true,
        }
    }

    /// Seals an accepted policy that gates nothing for this package in this project's state
    /// directory (unless one is there): the meet with it is whatever the project asks for.
    pub fn accept_any_policy(&self) {
        use cargo_mcp_dev::face::commands::policy_record::accept_unless_recorded;
        let nothing = cargo_mcp_dev::policy::accepted::Terms::nothing_gated();
        let keys = cargo_mcp_dev::audit::KeyStore::at(&self.home);
        let _ = accept_unless_recorded(&keys, &self.root.join("Cargo.toml"), nothing, 0, true);
    }

    /// The temp dir holding the project (for files that must live outside it).
    pub fn scratch(&self) -> &Path {
        self._tmp.path()
    }

    /// Sets an env var for every later command of this project.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), Some(value.into())));
    }

    /// Removes an env var for every later command of this project.
    pub fn remove_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), None));
    }

    /// `cargo-mcp-dev ARGS` in the project root, isolated environment.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        if self.accept_policy && args.first().is_some_and(|a| a == "run") {
            self.accept_any_policy();
        }
        let mut cmd = Command::new(bin());
        cmd.args(args).current_dir(&self.root);
        for k in SCRUBBED_ENV {
            cmd.env_remove(k);
        }
        cmd.env("CARGO_MCP_DEV_HOME", &self.home)
            // No incremental dirs: smaller copies, same artifacts.
            .env("CARGO_INCREMENTAL", "0")
            .env("CARGO_TERM_COLOR", "never");
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd
    }

    /// Runs `cargo-mcp-dev ARGS` and captures everything.
    pub fn run<I, S>(&self, args: I) -> Run
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Run::from(self.command(args).output().expect("run cargo-mcp-dev"))
    }

    /// `cargo-mcp-dev build EXTRA…`.
    pub fn build(&self, extra: &[&str]) -> Run {
        let mut args = vec!["build"];
        args.extend_from_slice(extra);
        self.run(args)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {rel}: {e}"));
    }

    /// Replaces exactly one occurrence of `from` in `rel` (panics otherwise, so a fixture
    /// change cannot make a test silently edit nothing).
    #[track_caller]
    pub fn replace(&self, rel: &str, from: &str, to: &str) {
        let text = self.read(rel);
        assert_eq!(
            text.matches(from).count(),
            1,
            "`{from}` should occur exactly once in {rel}"
        );
        self.write(rel, &text.replacen(from, to, 1));
    }

    /// Appends `[package.metadata.mcp-dev]` with the given TOML body to the package manifest.
    pub fn configure(&self, body: &str) {
        let mut manifest = self.read("Cargo.toml");
        manifest.push_str("\n[package.metadata.mcp-dev]\n");
        manifest.push_str(body);
        manifest.push('\n');
        self.write("Cargo.toml", &manifest);
    }

    /// The default target dir of the project.
    pub fn target_dir(&self) -> PathBuf {
        self.root.join("target")
    }

    /// `<target>/mcp-dev/identity/<label>.<profile>.json`.
    pub fn identity_file(&self, label: &str, profile: &str) -> PathBuf {
        self.target_dir()
            .join("mcp-dev/identity")
            .join(format!("{label}.{profile}.json"))
    }

    /// The recorded identity (parsed) for label/profile.
    #[track_caller]
    pub fn record(&self, label: &str, profile: &str) -> serde_json::Value {
        let p = self.identity_file(label, profile);
        let text =
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        serde_json::from_str(&text).expect("identity record is JSON")
    }
}

/// `sha256:<hex>` of a file, computed here (independently of the crate's hashing module).
pub fn sha256_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    format!("sha256:{}", hex_lower(&Sha256::digest(&bytes)))
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The short form status lines use: `sha256:` + first 8 hex digits + `…`.
pub fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").expect("sha256: digest");
    format!("sha256:{}…", &hex[..8])
}

/// Copies a tree. `preserve` keeps mtimes (`cp -a`) so a copied build stays fresh for cargo;
/// otherwise `target/` directories are skipped and files get new mtimes.
fn copy_tree(from: &Path, to: &Path, preserve: bool) {
    if preserve {
        let st = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .expect("run cp");
        assert!(st.success(), "cp -a {} {}", from.display(), to.display());
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let dest = to.join(&name);
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            if name == "target" {
                continue;
            }
            copy_tree(&entry.path(), &dest, false);
        } else {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// Builds `fake-server` once per test process into `target/test-fixtures/<suite>/fake-server`
/// (with plain cargo: what is under test must not prepare its own baseline).
fn baseline_fake_server(suite: &str) -> PathBuf {
    let mut guard = BASELINE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = guard.as_ref() {
        return p.clone();
    }
    let dir = repo_root().join("target/test-fixtures").join(suite);
    std::fs::create_dir_all(&dir).unwrap();
    // Another test process of the same suite may be preparing it too.
    let lock = std::fs::File::create(dir.join(".lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    let project = dir.join("fake-server");
    // Fresh sources every run (the fixture may have changed); the target dir is reused, so only
    // the two fixture crates recompile.
    let kept_target = dir.join("target-kept");
    if project.join("target").is_dir() {
        let _ = std::fs::remove_dir_all(&kept_target);
        std::fs::rename(project.join("target"), &kept_target).unwrap();
    }
    let _ = std::fs::remove_dir_all(&project);
    copy_tree(&fixture_dir("fake-server"), &project, false);
    if kept_target.is_dir() {
        std::fs::rename(&kept_target, project.join("target")).unwrap();
    }
    let _ = std::fs::remove_dir_all(project.join("target/mcp-dev"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--locked", "--quiet"])
        .current_dir(&project);
    for k in SCRUBBED_ENV {
        cmd.env_remove(k);
    }
    let out = cmd
        .env("CARGO_INCREMENTAL", "0")
        .output()
        .expect("run cargo build for the fake-server baseline");
    assert!(
        out.status.success(),
        "baseline build of fake-server failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    *guard = Some(project.clone());
    project
}
