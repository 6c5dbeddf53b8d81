//! `cargo mcp-dev demo`: a whole session on a throwaway server, narrated step by step.
//!
//! It creates a server from the `new` template, starts `cargo mcp-dev run` on it and plays the
//! host itself over JSON-RPC: list, denied call, approve, call, edit the source (revision B),
//! watch the rebuild replace the server, the stale call denied with the catalog diff, refetch,
//! approve again, call, then the audit journals and verification. Every expectation is checked;
//! any surprise exits with code 108, so the demo doubles as a smoke test.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use console::Style;
use serde_json::{Value, json};

use crate::audit::{JournalView, Journals, KeyStore, verify};
use crate::base::error::{CmdResult, Failure};
use crate::face::cli::{ControlArgs, DemoArgs};
use crate::{base::exit_codes, screen::stderr};

/// Name of the demo package (and so its label).
const DEMO_NAME: &str = "demo-inventory";

struct Narrator {
    step: usize,
    bold: Style,
    dim: Style,
}

impl Narrator {
    /// Prints the supervisor's pending status lines, then the next step.
    fn step(&mut self, host: &mut Host, text: &str) {
        host.drain_status(self);
        self.say(text);
    }

    fn say(&mut self, text: &str) {
        self.step += 1;
        stderr::raw(&format!(
            "{} {}",
            self.bold.apply_to(format!("[{}]", self.step)),
            self.bold.apply_to(text)
        ));
    }
    fn detail(&self, text: &str) {
        stderr::raw(&format!("    {}", self.dim.apply_to(text)));
    }
}

fn fail(msg: impl Into<String>) -> Failure {
    Failure::new(
        exit_codes::DEMO_FAILED,
        format!("demo step failed: {}", msg.into()),
    )
}

/// The host side: our end of `cargo mcp-dev run`'s stdin/stdout.
struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Value>,
    status_lines: Receiver<String>,
    next_id: u64,
    seen_status: Vec<String>,
}

impl Host {
    fn send(&mut self, msg: &Value) -> Result<(), Failure> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| fail("host connection already closed"))?;
        writeln!(stdin, "{msg}").map_err(|e| fail(format!("writing to cargo mcp-dev run: {e}")))?;
        stdin.flush().map_err(|e| fail(e.to_string()))
    }

    fn request(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(m) if m.get("id") == Some(&json!(id)) => return Ok(m),
                Ok(_) => continue, // notifications (list_changed) are noted by the status lines
                Err(_) => {
                    return Err(fail(format!(
                        "no answer to {method} within {} s",
                        timeout.as_secs()
                    )));
                }
            }
        }
    }

    fn call(&mut self, tool: &str, args: Value) -> Result<Value, Failure> {
        let r = self.request(
            "tools/call",
            json!({"name": tool, "arguments": args}),
            Duration::from_secs(60),
        )?;
        r.get("result")
            .cloned()
            .ok_or_else(|| fail(format!("tools/call {tool} returned a JSON-RPC error: {r}")))
    }

    /// Waits for a status line containing `needle`, relaying every line it sees.
    fn wait_status(
        &mut self,
        needle: &str,
        timeout: Duration,
        n: &Narrator,
    ) -> Result<String, Failure> {
        self.wait_status_with(needle, timeout, n, None)
    }

    fn wait_status_with(
        &mut self,
        needle: &str,
        timeout: Duration,
        n: &Narrator,
        bar: Option<&indicatif::ProgressBar>,
    ) -> Result<String, Failure> {
        if let Some(l) = self.seen_status.iter().find(|l| l.contains(needle)) {
            return Ok(l.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self
                .status_lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    match bar {
                        Some(b) => b.suspend(|| n.detail(&line)),
                        None => n.detail(&line),
                    }
                    self.seen_status.push(line.clone());
                    if line.contains(needle) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(fail(format!(
                        "`{needle}` did not appear within {} s",
                        timeout.as_secs()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(fail(format!("cargo mcp-dev run ended before `{needle}`")));
                }
            }
        }
    }

    fn drain_status(&mut self, n: &Narrator) {
        while let Ok(line) = self.status_lines.try_recv() {
            n.detail(&line);
            self.seen_status.push(line);
        }
    }

    fn close(&mut self) -> Option<i32> {
        self.stdin.take();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        None
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stdin.take();
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(1500));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn start_host(manifest: &Path, target_dir: &Path) -> Result<Host, Failure> {
    let exe = std::env::current_exe().map_err(|e| fail(e.to_string()))?;
    let mut child = Command::new(exe)
        .args(["mcp-dev", "run", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .env("CARGO_TERM_COLOR", "never")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("could not start cargo mcp-dev run: {e}")))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let (mtx, messages) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && mtx.send(v).is_err()
            {
                break;
            }
        }
    });
    let (stx, status_lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if stx
                .send(console::strip_ansi_codes(&line).to_string())
                .is_err()
            {
                break;
            }
        }
    });
    Ok(Host {
        child,
        stdin,
        messages,
        status_lines,
        next_id: 1,
        seen_status: Vec::new(),
    })
}

fn root_cwd() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
}

fn denial(result: &Value) -> Option<Value> {
    if result.get("isError") != Some(&json!(true)) {
        return None;
    }
    result.pointer("/_meta/dev.cargo-mcp-dev~1error").cloned()
}

fn text_of(result: &Value) -> String {
    result
        .pointer("/content/0/text")
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .to_string()
}

pub fn execute(args: DemoArgs) -> CmdResult {
    let n = &mut Narrator {
        step: 0,
        bold: Style::new().bold(),
        dim: Style::new().dim(),
    };
    let tmp = match &args.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("cargo-mcp-dev-demo-")
                .tempdir()?,
        ),
    };
    let root: PathBuf = match (&args.dir, &tmp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => unreachable!("a temporary directory exists when --dir is absent"),
    };
    let project = root.join(DEMO_NAME);
    // Like cargo: --target-dir, else $CARGO_TARGET_DIR, else inside the project.
    let target_dir = args
        .target_dir
        .clone()
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from))
        .map(|d| {
            if d.is_absolute() {
                d
            } else {
                root_cwd().join(d)
            }
        })
        .unwrap_or_else(|| project.join("target"));
    n.say(&format!(
        "creating a small rmcp server in {}",
        project.display()
    ));
    let files = super::new::create(
        &crate::face::cli::NewArgs {
            name: DEMO_NAME.into(),
            path: Some(project.clone()),
            // The demo builds it itself, narrated.
            first_build: crate::face::cli::FirstBuildArgs {
                no_build: true,
                ..Default::default()
            },
        },
        true,
    )
    .map_err(|e| fail(e.message))?;
    n.detail(&format!(
        "{files} files, as `cargo mcp-dev new {DEMO_NAME}` writes them"
    ));
    let project = crate::base::beneath::followed::canonicalize(&project)?;
    let result = play(n, &project, &target_dir);
    if args.keep || args.dir.is_some() {
        if let Some(t) = tmp {
            let _ = t.keep();
        }
        stderr::raw(&format!(
            "project kept at {} (try `cargo mcp-dev audit show --manifest-path {}/Cargo.toml`)",
            project.display(),
            project.display()
        ));
    }
    result
}

fn play(n: &mut Narrator, project: &Path, target_dir: &Path) -> CmdResult {
    let manifest = project.join("Cargo.toml");
    n.say("starting `cargo mcp-dev run` and connecting as the host (the first build compiles rmcp: about a minute)");
    let mut host = start_host(&manifest, target_dir)?;
    let init = host.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "cargo-mcp-dev-demo", "version": env!("CARGO_PKG_VERSION")}}),
        Duration::from_secs(30),
    )?;
    n.detail(&format!(
        "handshake answered: protocol {}",
        init.pointer("/result/protocolVersion")
            .unwrap_or(&Value::Null)
    ));
    host.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
    let spinner = stderr::progress_enabled().then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_message("building the server (the first build compiles rmcp and tokio)");
        pb.enable_steady_tick(Duration::from_millis(120));
        pb
    });
    let started = host.wait_status_with(
        "server started:",
        Duration::from_secs(600),
        n,
        spinner.as_ref(),
    );
    if let Some(pb) = spinner {
        pb.finish_and_clear();
    }
    let started = started?;
    let epoch_a = field(&started, "epoch=").ok_or_else(|| fail("no epoch in the start line"))?;
    host.wait_status("catalog", Duration::from_secs(30), n).ok();

    n.step(&mut host, "listing tools");
    let tools = list_tools(&mut host)?;
    let names: Vec<String> = tools
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    n.detail(&format!("tools: {}", names.join(", ")));
    let control = ControlArgs {
        manifest_path: Some(manifest.clone()),
        package: None,
        label: None,
        target_dir: Some(target_dir.to_path_buf()),
        socket: None,
    };
    let st = super::control_client::call(&control, &json!({"op": "status"}))?;
    let write_tool = names
        .iter()
        .find(|t| st["toolPolicy"][t.as_str()]["gated"] == json!(true))
        .cloned()
        .ok_or_else(|| fail("the template has no gated tool"))?;

    n.step(
        &mut host,
        &format!("calling {write_tool} before anyone approved it"),
    );
    let r = host.call(&write_tool, write_args())?;
    expect_denial(&mut host, &r, &write_tool, "authorization_required", n)?;

    n.step(
        &mut host,
        &format!("approving {write_tool} for epoch {epoch_a} (what `cargo mcp-dev approve` does)"),
    );
    approve(&mut host, &control, &epoch_a, &write_tool, n)?;

    n.step(&mut host, &format!("calling {write_tool} again"));
    let r = host.call(&write_tool, write_args())?;
    if denial(&r).is_some() || r.get("isError") == Some(&json!(true)) {
        return Err(fail(format!("the approved call failed: {}", text_of(&r))));
    }
    n.detail(&format!("result: {}", text_of(&r)));

    n.step(
        &mut host,
        "editing the server's source: revision B (new handler text, a new optional field)",
    );
    edit_revision_b(project)?;
    let replaced = host.wait_status("server replaced:", Duration::from_secs(300), n)?;
    let epoch_b = field(&replaced, "epoch=").ok_or_else(|| fail("no epoch in the replace line"))?;
    host.wait_status("catalog changed", Duration::from_secs(30), n)?;
    host.drain_status(n);

    n.step(
        &mut host,
        "the agent retries its prepared call without refreshing: refused, the catalog moved",
    );
    let r = host.call(&write_tool, write_args())?;
    expect_denial(&mut host, &r, &write_tool, "catalog_stale", n)?;

    n.step(
        &mut host,
        "refetching tools/list, then calling: refused again, the grant named the old epoch",
    );
    list_tools(&mut host)?;
    let r = host.call(&write_tool, write_args())?;
    let d = expect_denial(&mut host, &r, &write_tool, "authorization_stale", n)?;
    if d["approvedEpoch"] != json!(epoch_a) || d["currentEpoch"] != json!(epoch_b) {
        return Err(fail(format!(
            "authorization_stale should name {epoch_a} -> {epoch_b}: {d}"
        )));
    }

    n.step(
        &mut host,
        &format!("approving {write_tool} for the new epoch {epoch_b}"),
    );
    approve(&mut host, &control, &epoch_b, &write_tool, n)?;
    let r = host.call(&write_tool, write_args())?;
    if r.get("isError") == Some(&json!(true)) {
        return Err(fail(format!(
            "the re-approved call failed: {}",
            text_of(&r)
        )));
    }
    n.detail(&format!("result: {}", text_of(&r)));

    n.step(&mut host, "closing the connection (the host exits)");
    let code = host.close();
    host.drain_status(n);
    if code != Some(0) {
        return Err(fail(format!("cargo mcp-dev run exited with {code:?}")));
    }

    n.step(&mut host, "audit journals: which code handled every call");
    let log = target_dir
        .join("mcp-dev/audit")
        .join(format!("{DEMO_NAME}.jsonl"));
    let keys = KeyStore::from_env().map_err(|e| fail(e.to_string()))?;
    let journals = Journals::from_log(&log, &keys).map_err(|e| fail(e.to_string()))?;
    stderr::raw(&journals.render_human(JournalView::Both));
    n.step(&mut host, "verifying the audit log (chain, MACs, anchor)");
    let report = verify(&log, &keys).map_err(|e| fail(format!("audit verify: {e}")))?;
    n.detail(&format!(
        "verified {} records over {} epochs",
        report.records, report.epochs
    ));
    stderr::line("demo complete: every step behaved as narrated");
    Ok(exit_codes::OK)
}

fn write_args() -> Value {
    json!({"text": "written by the demo"})
}

/// Revision B, as a developer would make it: a new optional field and a new description for
/// the write tool (same tool name), so both the executable and the catalog change.
fn edit_revision_b(project: &Path) -> Result<(), Failure> {
    let path = project.join("src/main.rs");
    let src = crate::base::beneath::Beneath::open_following(project)
        .and_then(|held| held.read_to_string(&path, 1 << 20))
        .map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let edited = src
        .replacen(
            "    /// The note to save.\n    text: String,\n",
            "    /// The note to save.\n    text: String,\n    /// Optional tag (revision B).\n    #[serde(default)]\n    tag: Option<String>,\n",
            1,
        )
        .replacen(
            "Save a note (appends one line to the notes file)",
            "Save a note with an optional tag (revision B: appends one line to the notes file)",
            1,
        )
        // The handler uses the new field (an unused one would be a compiler warning).
        .replacen(
            "        let line = serde_json::to_string(&Note { text: args.text }).expect(\"a note serializes\");\n",
            "        let text = match args.tag {\n            Some(tag) => format!(\"[{tag}] {}\", args.text),\n            None => args.text,\n        };\n        let line = serde_json::to_string(&Note { text }).expect(\"a note serializes\");\n",
            1,
        );
    if edited == src
        || !edited.contains("revision B:")
        || !edited.contains("tag: Option<String>")
        || !edited.contains("Some(tag) =>")
    {
        return Err(fail(
            "the template no longer has the lines the demo edits (src/main.rs)",
        ));
    }
    crate::base::fsutil::write_atomic(&path, edited.as_bytes()).map_err(|e| fail(e.to_string()))
}

fn list_tools(host: &mut Host) -> Result<Vec<Value>, Failure> {
    let r = host.request("tools/list", json!({}), Duration::from_secs(60))?;
    r.pointer("/result/tools")
        .and_then(|t| t.as_array())
        .cloned()
        .ok_or_else(|| fail(format!("tools/list failed: {r}")))
}

/// Checks the denial, then narrates it after the supervisor's own `call denied:` line: the
/// supervisor refused the call before the host read the refusal.
fn expect_denial(
    host: &mut Host,
    r: &Value,
    tool: &str,
    reason: &str,
    n: &Narrator,
) -> Result<Value, Failure> {
    let d = denial(r).ok_or_else(|| fail(format!("expected a {reason} denial, got: {r}")))?;
    if d["error"] != json!(reason) {
        return Err(fail(format!("expected {reason}, got {}", d["error"])));
    }
    host.wait_status(
        &format!("call denied: {tool} ({reason})"),
        Duration::from_secs(10),
        n,
    )?;
    n.detail(&format!("denied: {}", text_of(r)));
    if let Some(hint) = r.pointer("/content/1/text").and_then(|t| t.as_str()) {
        n.detail(hint);
    }
    Ok(d)
}

/// Approves over the control socket, then waits for the supervisor's `approved:` line, so
/// nothing that the grant allowed is narrated before it.
fn approve(
    host: &mut Host,
    control: &ControlArgs,
    epoch: &str,
    tool: &str,
    n: &Narrator,
) -> Result<(), Failure> {
    let r = super::control_client::call(
        control,
        &json!({"op": "approve", "epoch": epoch, "tools": [tool], "credentialScopes": []}),
    )?;
    host.wait_status(
        &format!("approved: {tool} for epoch {epoch} "),
        Duration::from_secs(10),
        n,
    )?;
    n.detail(&format!(
        "grant {} for epoch {}",
        r["grant"]["id"].as_str().unwrap_or("?"),
        r["grant"]["executionEpoch"].as_str().unwrap_or("?")
    ));
    Ok(())
}

fn field(line: &str, key: &str) -> Option<String> {
    let rest = &line[line.find(key)? + key.len()..];
    Some(rest.split([' ', ')']).next()?.to_string())
}
