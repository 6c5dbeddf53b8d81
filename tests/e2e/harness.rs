//! Harness for the end-to-end scenarios: the real `cargo-mcp-dev run` binary, the rmcp
//! `inventory` fixture and the official MCP clients (through the drivers in `e2e/clients`).
//!
//! Owns: installing the peers (`e2e/install-peers.sh`, once per test binary), the warm fixture
//! build into the shared target dir, per-scenario temp dirs (fixture copy, `CARGO_MCP_DEV_HOME`,
//! side-effect file), driver processes and their line protocol, and killing every process a
//! scenario started. It never edits the repository: fixture edits happen in the copies.
//!
//! Scenarios run one at a time (a global lock): they share one cargo target dir so rmcp is
//! compiled once, and on a 2-core machine concurrent builds would only make timings flaky.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Env var carried by every process a scenario starts (drivers, supervisors, servers, cargo):
/// how the harness finds and kills them, and how it proves none was left behind.
pub const TAG_ENV: &str = "CARGO_MCP_DEV_E2E_TAG";

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture_src() -> PathBuf {
    repo().join("e2e/fixtures/inventory")
}

/// The cargo target dir every scenario builds into (rmcp is compiled there once).
pub fn shared_target() -> PathBuf {
    repo().join("target/e2e-fixture-target")
}

pub fn peers_dir() -> PathBuf {
    std::env::var_os("MCP_DEV_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/e2e-peers"))
}

/// Peers installed and the fixture built once; a failure fails every scenario (never a skip).
fn setup() -> &'static Result<(), String> {
    static SETUP: OnceLock<Result<(), String>> = OnceLock::new();
    SETUP.get_or_init(|| {
        let t = Instant::now();
        let out = Command::new(repo().join("e2e/install-peers.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run e2e/install-peers.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "e2e/install-peers.sh failed ({}): a missing peer is a failure, not a skip\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!("e2e: peers ready in {:.1}s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        // Build the pristine fixture into the shared dir: later builds of the copies only
        // compile `inventory` and `inventory-core`.
        let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .arg("build")
            .arg("--manifest-path")
            .arg(fixture_src().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(shared_target())
            .env_remove("CARGO_TARGET_DIR")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "building the inventory fixture failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!("e2e: fixture built in {:.1}s", t.elapsed().as_secs_f64());
        Ok(())
    })
}

static SERIAL: Mutex<()> = Mutex::new(());

// ----- logs ---------------------------------------------------------------------------------

/// Lines of one stream (a driver's stderr: supervisor status lines plus server stderr).
#[derive(Default)]
pub struct Log {
    name: String,
    lines: Mutex<Vec<String>>,
    grew: Condvar,
}

impl Log {
    fn new(name: String) -> Arc<Self> {
        Arc::new(Log {
            name,
            ..Log::default()
        })
    }

    fn push(&self, line: String) {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
        self.grew.notify_all();
    }

    pub fn len(&self) -> usize {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn snapshot(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn text(&self) -> String {
        self.snapshot().join("\n")
    }

    /// First line at index >= `from` containing `needle`; panics after `timeout`.
    pub fn wait_for(&self, from: usize, needle: &str, timeout: Duration) -> (usize, String) {
        let deadline = Instant::now() + timeout;
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((i, l)) = lines
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, l)| l.contains(needle))
            {
                return (i, l.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for `{needle}` in {} (from line {from}):\n{}",
                    self.name,
                    lines.join("\n")
                );
            }
            lines = self.grew.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    /// Lines from `from` on containing `needle`.
    pub fn grep(&self, from: usize, needle: &str) -> Vec<String> {
        self.snapshot()
            .into_iter()
            .skip(from)
            .filter(|l| l.contains(needle))
            .collect()
    }
}

fn pump_lines(name: String, stream: impl std::io::Read + Send + 'static, log: Arc<Log>) {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            for line in BufReader::new(stream).lines() {
                match line {
                    Ok(l) => log.push(l),
                    Err(_) => break,
                }
            }
        })
        .expect("spawn log pump");
}

// ----- status-line parsing ------------------------------------------------------------------

/// `pid=N epoch=E` out of a status line.
pub fn pid_epoch(line: &str) -> (u32, String) {
    let field = |key: &str| -> String {
        let start = line
            .find(key)
            .unwrap_or_else(|| panic!("no `{key}` in status line: {line}"))
            + key.len();
        line[start..]
            .split(|c: char| c.is_whitespace() || c == ')' || c == ',')
            .next()
            .unwrap()
            .to_string()
    };
    (field("pid=").parse().expect("pid"), field("epoch="))
}

// ----- clients ------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Python SDK mcp 2.3.0, mode auto (probes `server/discover`).
    Py2,
    /// Python SDK mcp 1.30.0 (legacy only).
    Py1,
    /// TS SDK v1 1.32.2 without listChanged options.
    TsV1,
    /// TS SDK v1 with `listChanged` auto-refresh.
    TsV1Auto,
    /// TS client v2 2.4.0, versionNegotiation auto (spawns the server command twice).
    TsV2,
    /// TS client v2 with `listChanged` auto-refresh (opens `subscriptions/listen` when modern).
    TsV2Auto,
    /// TS SDK v1 declaring `capabilities.elicitation`, answering prompts as the test scripts.
    TsV1Elicit,
    /// Python SDK mcp 1.30.0 with an elicitation callback the test scripts.
    Py1Elicit,
    /// Python SDK mcp 2.3.0 with an elicitation callback (2026-07-28: `input_required`).
    Py2Elicit,
    /// The same client in legacy mode (`initialize`; `elicitation/create` requests).
    Py2ElicitLegacy,
}

impl Client {
    /// Whether the driver refetches tools/list by itself after list_changed.
    pub fn refetches_on_list_changed(self) -> bool {
        matches!(self, Client::TsV1Auto | Client::TsV2Auto)
    }

    /// Whether a modern (2026-07-28) session of this driver opens a `subscriptions/listen`
    /// stream, the only way list_changed reaches a modern host.
    pub fn opens_listen_stream(self) -> bool {
        self == Client::TsV2Auto
    }
}

impl Client {
    fn command(self) -> (PathBuf, Vec<String>) {
        let p = peers_dir();
        let py = |venv: &str, flags: &[&str]| {
            let mut args = vec![
                repo()
                    .join("e2e/clients/py_driver.py")
                    .display()
                    .to_string(),
            ];
            args.extend(flags.iter().map(|s| s.to_string()));
            (p.join(venv).join("bin/python"), args)
        };
        let node = |script: &str, flags: &[&str]| {
            let mut args = vec![p.join("node").join(script).display().to_string()];
            args.extend(flags.iter().map(|s| s.to_string()));
            (PathBuf::from("node"), args)
        };
        match self {
            Client::Py2 => py("py-mcp2", &[]),
            Client::Py1 => py("py-mcp1", &[]),
            Client::Py1Elicit => py("py-mcp1", &["--elicitation"]),
            Client::Py2Elicit => py("py-mcp2", &["--elicitation"]),
            Client::Py2ElicitLegacy => py("py-mcp2", &["--legacy", "--elicitation"]),
            Client::TsV1Elicit => node("ts_v1_driver.mjs", &["--elicitation"]),
            Client::TsV1 => node("ts_v1_driver.mjs", &[]),
            Client::TsV1Auto => node("ts_v1_driver.mjs", &["--list-changed-auto"]),
            Client::TsV2 => node("ts_v2_driver.mjs", &[]),
            Client::TsV2Auto => node("ts_v2_driver.mjs", &["--list-changed-auto"]),
        }
    }
}

// ----- scenario -----------------------------------------------------------------------------

pub struct Scenario {
    pub name: String,
    pub root: tempfile::TempDir,
    /// The fixture copy (its Cargo.toml is what `run --manifest-path` gets).
    pub project: PathBuf,
    pub home: PathBuf,
    pub side_effects: PathBuf,
    pub target: PathBuf,
    pub label: String,
    pub tag: String,
    pub started: Instant,
    deadline: Instant,
    logs: Vec<Arc<Log>>,
    _serial: MutexGuard<'static, ()>,
    /// Before `run`, accept whatever policy the project asks for, as a human would with
    /// `approve --policy` (issue 36: a weakening of gating waits for that), so scenarios see
    /// the policy they configure. Off for a scenario of that rule.
    pub accept_policy: bool,
}

impl Scenario {
    /// A fresh copy of the fixture with label `inv-<name>`, building into the shared target dir.
    pub fn new(name: &str, timeout: Duration) -> Scenario {
        Self::with_target(name, timeout, shared_target())
    }

    pub fn with_target(name: &str, timeout: Duration, target: PathBuf) -> Scenario {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = setup() {
            panic!("e2e setup failed: {e}");
        }
        let root = tempfile::Builder::new()
            .prefix(&format!("e2e-{name}-"))
            .tempdir()
            .expect("tempdir");
        let project = root.path().join("inventory");
        copy_dir(&fixture_src(), &project);
        let home = root.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let label = format!("inv-{name}");
        // A unique label keeps status, facts, launch records and the audit log of scenarios
        // apart inside the shared target dir; stale state of an earlier test run is removed.
        edit_file(&project.join("Cargo.toml"), |s| {
            s.replace("label = \"inventory\"", &format!("label = \"{label}\""))
        });
        clear_label_state(&target, &label);
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tag = format!(
            "{}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            name
        );
        let side_effects = root.path().join("side-effects.jsonl");
        let now = Instant::now();
        Scenario {
            name: name.to_string(),
            root,
            project,
            home,
            side_effects,
            target,
            label,
            tag,
            started: now,
            deadline: now + timeout,
            logs: Vec::new(),
            _serial: serial,
            accept_policy: true,
        }
    }

    pub fn manifest(&self) -> PathBuf {
        self.project.join("Cargo.toml")
    }

    pub fn remaining(&self) -> Duration {
        let left = self.deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "scenario {} exceeded its timeout",
            self.name
        );
        left
    }

    /// `t`, capped by the scenario's own deadline.
    pub fn within(&self, t: Duration) -> Duration {
        t.min(self.remaining())
    }

    /// Appends keys to `[package.metadata.mcp-dev]` (the manifest's last table).
    pub fn add_metadata(&self, toml_lines: &str) {
        edit_file(&self.manifest(), |s| format!("{s}{toml_lines}\n"));
    }

    /// Edits `const REVISION: &str = "A";` the way a developer would.
    pub fn set_revision(&self, from: &str, to: &str) {
        let old = format!("const REVISION: &str = \"{from}\";");
        let new = format!("const REVISION: &str = \"{to}\";");
        edit_file(&self.project.join("src/main.rs"), |s| {
            assert!(s.contains(&old), "src/main.rs has no `{old}`");
            s.replace(&old, &new)
        });
    }

    pub fn edit(&self, rel: &str, f: impl FnOnce(String) -> String) {
        edit_file(&self.project.join(rel), f);
    }

    /// Environment every process of this scenario gets.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (TAG_ENV.into(), self.tag.clone()),
            ("CARGO_MCP_DEV_HOME".into(), self.home.display().to_string()),
            (
                "INVENTORY_SIDE_EFFECT_FILE".into(),
                self.side_effects.display().to_string(),
            ),
            ("CARGO_TERM_COLOR".into(), "never".into()),
        ]
    }

    /// `cargo-mcp-dev run --manifest-path … --target-dir … EXTRA…` as an argv.
    pub fn run_argv(&self, extra: &[&str]) -> Vec<String> {
        if self.accept_policy {
            self.accept_any_policy();
        }
        let mut v = vec![
            bin().display().to_string(),
            "run".into(),
            "--manifest-path".into(),
            self.manifest().display().to_string(),
            "--target-dir".into(),
            self.target.display().to_string(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }

    /// Seals an accepted policy that gates nothing for this package in the scenario's state
    /// directory (unless one is there): the meet with it is whatever the project asks for.
    pub fn accept_any_policy(&self) {
        use cargo_mcp_dev::face::commands::policy_record::accept_unless_recorded;
        let nothing = cargo_mcp_dev::policy::accepted::Terms::nothing_gated();
        let keys = cargo_mcp_dev::audit::KeyStore::at(&self.home);
        let _ = accept_unless_recorded(&keys, &self.manifest(), nothing, 0, true);
    }

    /// Starts `client`'s driver with `cargo-mcp-dev run EXTRA…` as the server command.
    pub fn driver(&mut self, client: Client, run_extra: &[&str], env: &[(&str, &str)]) -> Driver {
        let (program, mut args) = client.command();
        args.push("--".into());
        args.extend(self.run_argv(run_extra));
        let mut cmd = Command::new(program);
        cmd.args(&args)
            .current_dir(self.root.path())
            .envs(self.env())
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .env_remove("CARGO_TARGET_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {client:?} driver: {e}"));
        let n = self.logs.len();
        let stderr = Log::new(format!("{client:?} driver #{n} stderr"));
        let stdout_log = Log::new(format!("{client:?} driver #{n} stdout"));
        pump_lines(
            format!("drv-err-{n}"),
            child.stderr.take().unwrap(),
            stderr.clone(),
        );
        let (tx, rx) = channel();
        let out = child.stdout.take().unwrap();
        let copy = stdout_log.clone();
        std::thread::Builder::new()
            .name(format!("drv-out-{n}"))
            .spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    copy.push(line.clone());
                    let v: Value = serde_json::from_str(&line)
                        .unwrap_or_else(|e| json!({"unparsable": line, "error": e.to_string()}));
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            })
            .unwrap();
        self.logs.push(stderr.clone());
        self.logs.push(stdout_log);
        Driver {
            client,
            stdin: child.stdin.take(),
            child,
            rx,
            buffered: VecDeque::new(),
            events: Vec::new(),
            stderr,
            next_id: 0,
            deadline: self.deadline,
        }
    }

    /// `cargo mcp-dev build` of the scenario's project, asserted to succeed: the next `run`
    /// starts warm. A build still running (one a host left in the background) is waited for on
    /// cargo's lock first.
    pub fn build_now(&self) {
        let manifest = self.manifest().display().to_string();
        let target = self.target.display().to_string();
        let out = self.mcp_dev(&[
            "build",
            "--manifest-path",
            &manifest,
            "--target-dir",
            &target,
        ]);
        assert!(
            out.status.success(),
            "cargo mcp-dev build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `cargo-mcp-dev ARGS…` (approve, status, audit, identity …) to completion.
    pub fn mcp_dev(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin());
        cmd.args(args);
        self.run_tool(cmd)
    }

    /// Runs a prepared command with this scenario's env, bounded by the scenario deadline.
    pub fn run_tool(&self, mut cmd: Command) -> Output {
        cmd.envs(self.env())
            .env_remove("CARGO_TARGET_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().expect("spawn tool");
        let pid = child.id();
        let deadline = Instant::now() + self.within(Duration::from_secs(120));
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(out) => out.expect("wait"),
            Err(_) => {
                kill_group(pid);
                panic!("{cmd:?} did not finish in time");
            }
        }
    }

    pub fn control_args(&self) -> Vec<String> {
        vec![
            "--manifest-path".into(),
            self.manifest().display().to_string(),
            "--target-dir".into(),
            self.target.display().to_string(),
        ]
    }

    /// `approve --yes --tool T…` against the running supervisor; returns its JSON answer.
    pub fn approve(&self, tools: &[&str]) -> Value {
        let mut args: Vec<String> = vec!["approve".into(), "--yes".into(), "--json".into()];
        args.extend(self.control_args());
        for t in tools {
            args.push("--tool".into());
            args.push(t.to_string());
        }
        let out = self.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "approve {tools:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "approve --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `audit verify --json` against the default log of this project: (exit code, answer).
    pub fn audit_verify(&self) -> (i32, Value, String) {
        let mut args: Vec<String> = vec!["audit".into(), "verify".into(), "--json".into()];
        args.extend(self.control_args());
        let out = self.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code().unwrap_or(-1),
            v,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn mcp_dev_dir(&self) -> PathBuf {
        self.target.join("mcp-dev")
    }

    pub fn status_file(&self) -> Option<Value> {
        let text = std::fs::read_to_string(
            self.mcp_dev_dir()
                .join(format!("status/{}.json", self.label)),
        )
        .ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Polls the status file until `pred` holds.
    pub fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + self.within(timeout);
        loop {
            if let Some(s) = self.status_file()
                && pred(&s)
            {
                return s;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out waiting for status: {what}; last status file: {}",
                    self.status_file()
                        .map(|s| serde_json::to_string_pretty(&s).unwrap())
                        .unwrap_or_else(|| "<none>".into())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the server of `epoch` (or any, if None) has a fetched catalog.
    pub fn wait_ready(&self, epoch: Option<&str>) -> Value {
        self.wait_status(
            "server running with a catalog",
            Duration::from_secs(120),
            |s| {
                let server_epoch = s.pointer("/server/epoch").and_then(Value::as_str);
                server_epoch.is_some()
                    && epoch.is_none_or(|e| server_epoch == Some(e))
                    && s.get("catalog").is_some_and(|c| !c.is_null())
                    && s.get("state").and_then(Value::as_str) != Some("identity-pending")
            },
        )
    }

    pub fn audit_path(&self) -> PathBuf {
        self.mcp_dev_dir()
            .join(format!("audit/{}.jsonl", self.label))
    }

    /// The audit log's records, parsed (a running supervisor's file ends in the NUL bytes of
    /// the space it reserved for more: not records).
    pub fn audit_records(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        text.trim_end_matches('\0')
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("audit record is JSON"))
            .collect()
    }

    /// Side-effect lines written by `write_item`, parsed.
    pub fn side_effect_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.side_effects)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("side-effect line is JSON"))
            .collect()
    }

    /// Pids of live processes carrying this scenario's tag (zombies excluded).
    pub fn tagged_processes(&self) -> Vec<(u32, String)> {
        tagged_processes(&self.tag)
    }

    /// Asserts that within `grace` no process of this scenario is left.
    pub fn assert_no_processes_left(&self, grace: Duration) {
        let deadline = Instant::now() + grace;
        loop {
            let left = self.tagged_processes();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                panic!("processes left behind by scenario {}: {left:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let left = tagged_processes(&self.tag);
        for (pid, _) in &left {
            kill_pid(*pid);
        }
        if std::thread::panicking() {
            eprintln!(
                "---- scenario {} failed after {:.1}s; logs:",
                self.name,
                self.started.elapsed().as_secs_f64()
            );
            for log in &self.logs {
                eprintln!("== {}\n{}", log.name, log.text());
            }
            if !left.is_empty() {
                eprintln!("== killed leftover processes: {left:?}");
            }
            eprintln!(
                "== audit log\n{}",
                std::fs::read_to_string(self.audit_path()).unwrap_or_default()
            );
        } else {
            eprintln!(
                "e2e scenario {} passed in {:.1}s",
                self.name,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

// ----- driver -------------------------------------------------------------------------------

pub struct Driver {
    pub client: Client,
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Value>,
    buffered: VecDeque<Value>,
    /// Event lines seen so far (`tools_list_changed`, `tools_refetched`, …).
    pub events: Vec<Value>,
    /// The driver's stderr: supervisor status lines and the server's stderr.
    pub stderr: Arc<Log>,
    next_id: u64,
    deadline: Instant,
}

impl Driver {
    /// Sends a command with a fresh id; returns the id.
    pub fn send(&mut self, mut cmd: Value) -> String {
        self.next_id += 1;
        let id = format!("c{}", self.next_id);
        cmd["id"] = json!(id);
        let line = format!("{cmd}\n");
        let stdin = self.stdin.as_mut().expect("driver stdin open");
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .unwrap_or_else(|e| panic!("driver stdin: {e}; stderr:\n{}", self.stderr.text()));
        id
    }

    fn take_line(&mut self, timeout: Duration) -> Option<Value> {
        let t = timeout.min(self.deadline.saturating_duration_since(Instant::now()));
        match self.rx.recv_timeout(t) {
            Ok(v) => {
                if v.get("event").is_some() && v.get("op").is_none() {
                    self.events.push(v.clone());
                }
                Some(v)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                panic!(
                    "{:?} driver exited (stdout closed); stderr:\n{}",
                    self.client,
                    self.stderr.text()
                )
            }
        }
    }

    /// The result line of command `id`.
    pub fn result(&mut self, id: &str, timeout: Duration) -> Value {
        if let Some(i) = self
            .buffered
            .iter()
            .position(|v| v.get("id").and_then(Value::as_str) == Some(id))
        {
            return self.buffered.remove(i).unwrap();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(v) = self.take_line(left) else {
                panic!(
                    "{:?} driver: no result for command {id} within {timeout:?}; stderr:\n{}",
                    self.client,
                    self.stderr.text()
                );
            };
            if v.get("op").is_none() {
                continue; // an event
            }
            if v.get("id").and_then(Value::as_str) == Some(id) {
                return v;
            }
            self.buffered.push_back(v);
        }
    }

    pub fn cmd(&mut self, cmd: Value, timeout: Duration) -> Value {
        let id = self.send(cmd);
        self.result(&id, timeout)
    }

    /// Connects; panics unless the handshake succeeded.
    pub fn connect(&mut self, timeout_ms: u64) -> Value {
        let r = self.cmd(
            json!({"op": "connect", "timeoutMs": timeout_ms}),
            Duration::from_millis(timeout_ms + 15_000),
        );
        assert_eq!(
            r["ok"],
            json!(true),
            "{:?} connect failed: {r}\nstderr:\n{}",
            self.client,
            self.stderr.text()
        );
        r
    }

    /// `tools/list`; returns the tool names (panics on failure).
    pub fn list_tools(&mut self) -> Vec<String> {
        let r = self.cmd(json!({"op": "list_tools"}), Duration::from_secs(60));
        assert_eq!(
            r["ok"],
            json!(true),
            "{:?} list_tools failed: {r}",
            self.client
        );
        let mut names: Vec<String> = r["tools"]
            .as_array()
            .expect("tools array")
            .iter()
            .map(|t| t["name"].as_str().expect("tool name").to_string())
            .collect();
        names.sort();
        names
    }

    /// `tools/call`; asserts it came back as a result (never a transport or protocol failure).
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.cmd(
            json!({"op": "call_tool", "name": name, "arguments": arguments, "timeoutMs": 60_000}),
            Duration::from_secs(75),
        );
        assert_eq!(
            r["ok"],
            json!(true),
            "{:?}: tools/call {name} must come back as a tool result, got {r}",
            self.client
        );
        r
    }

    /// A call that must be refused by cargo-mcp-dev with `reason`: a tool error (isError true)
    /// carrying the payload; returns the payload.
    pub fn call_denied(&mut self, name: &str, arguments: Value, reason: &str) -> Value {
        let r = self.call(name, arguments);
        denial_payload(&r, reason, self.client)
    }

    /// `wait_event` for `tools_list_changed`: true if one arrived.
    pub fn wait_list_changed(&mut self, timeout_ms: u64) -> bool {
        let r = self.cmd(
            json!({"op": "wait_event", "event": "tools_list_changed", "timeoutMs": timeout_ms}),
            Duration::from_millis(timeout_ms + 10_000),
        );
        r["ok"] == json!(true)
    }

    /// Closes the client (driver exits); returns its exit status.
    pub fn close(mut self) -> ExitStatus {
        let id = self.send(json!({"op": "close"}));
        let r = self.result(&id, Duration::from_secs(20));
        assert_eq!(r["ok"], json!(true), "close: {r}");
        self.stdin.take();
        self.wait_exit(Duration::from_secs(20))
    }

    /// SIGKILLs the driver process alone (the host vanishing): its pipes close with it.
    pub fn kill_host(&mut self) {
        kill_pid(self.child.id());
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            if Instant::now() >= deadline {
                kill_group(self.child.id());
                panic!(
                    "{:?} driver did not exit in {timeout:?}; stderr:\n{}",
                    self.client,
                    self.stderr.text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_group(self.child.id());
            let _ = self.child.wait();
        }
    }
}

/// The cargo-mcp-dev denial payload out of a `call_tool` result line, checked for shape.
pub fn denial_payload(r: &Value, reason: &str, client: Client) -> Value {
    assert_eq!(
        r["isError"],
        json!(true),
        "{client:?}: expected a `{reason}` denial as a tool error, got {r}"
    );
    let text = r["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{client:?}: denial without text content: {r}"));
    let payload: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{client:?}: denial content[0] is not JSON ({e}): {r}"));
    assert_eq!(
        payload["error"],
        json!(reason),
        "{client:?}: wrong denial: {r}"
    );
    assert!(
        r["content"][1]["text"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{client:?}: denial without a human sentence: {r}"
    );
    payload
}

/// `structuredContent` of a successful (isError false) tool result.
pub fn structured(r: &Value) -> &Value {
    assert_eq!(
        r["isError"],
        json!(false),
        "expected a successful tool result: {r}"
    );
    &r["structuredContent"]
}

// ----- audit helpers ------------------------------------------------------------------------

/// Audit records of one `type`.
pub fn records_of<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["type"].as_str() == Some(kind))
        .collect()
}

// ----- processes and files ------------------------------------------------------------------

pub fn tagged_processes(tag: &str) -> Vec<(u32, String)> {
    let needle = format!("{TAG_ENV}={tag}");
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !environ.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // State is the field after the parenthesised command; zombies are already dead.
        let state = stat
            .rsplit_once(") ")
            .map(|(_, r)| r.chars().next().unwrap_or('?'));
        if state == Some('Z') {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        found.push((pid, cmdline));
    }
    found
}

fn kill_pid(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

pub fn kill_group(pgid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pgid as i32) {
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
}

pub fn edit_file(path: &Path, f: impl FnOnce(String) -> String) {
    let old =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let new = f(old.clone());
    assert_ne!(old, new, "edit of {} changed nothing", path.display());
    std::fs::write(path, new).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Copies the fixture, leaving out any `target` directory.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        let src = entry.path();
        let dst = to.join(&name);
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        }
    }
}

/// Removes what an earlier test run left for `label` under `<target>/mcp-dev/`.
fn clear_label_state(target: &Path, label: &str) {
    let dir = target.join("mcp-dev");
    let Ok(subdirs) = std::fs::read_dir(&dir) else {
        return;
    };
    for sub in subdirs.flatten() {
        let Ok(entries) = std::fs::read_dir(sub.path()) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == label || name.starts_with(&format!("{label}.")) {
                let p = e.path();
                if p.is_dir() {
                    let _ = std::fs::remove_dir_all(&p);
                } else {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
}
