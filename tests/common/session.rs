//! One `cargo-mcp-dev run` under test, on a private copy of the `fake-server` fixture.
//!
//! Owns the supervisor process (its own process group, piped stdin/stdout/stderr), the host
//! side of the wire (through [`super::rpc`]), the collected status lines, and the fake server's
//! side files (`FAKE_LOG`, `FAKE_PID_FILE`, `FAKE_SIDE_EFFECT_FILE`, kept outside the watched
//! package). Every wait is bounded by the session's deadline; on drop the supervisor gets its
//! stdin closed, then every process left (the supervisor's group and every fake-server group it
//! started) is killed, and any fake-server or grandchild that outlived the session fails the
//! test. It never touches the fixture in place or any directory but the test's own temp dir.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fixture::Project;
use super::rpc::{self, Inbox, Msg};

/// Baseline suite name for [`Project::built_fake_server`] (one prebuilt copy per test process).
pub const SUITE: &str = "run";
/// Default label of the fixture (its package name).
pub const LABEL: &str = "fake-server";
/// A whole test may take this long by default, waits included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// One wait may take this long at most (within the session deadline).
pub const WAIT: Duration = Duration::from_secs(40);
/// The protocol version the legacy helpers ask for.
pub const LEGACY_VERSION: &str = "2025-06-18";
pub const MODERN_VERSION: &str = "2026-07-28";

/// Status lines and fake-server pids seen on the supervisor's stderr.
#[derive(Default)]
struct Stderr {
    lines: Mutex<Vec<String>>,
    cond: Condvar,
    closed: AtomicBool,
    /// Every fake-server (and grandchild) pid this session ever started.
    pids: Mutex<BTreeSet<u32>>,
}

/// How to start a session.
pub struct Setup {
    pub project: Project,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
    tools: Vec<String>,
    parent_shell: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup::new()
    }
}

impl Setup {
    /// A fresh prebuilt copy of `fake-server`; `run` with no extra flags, gating on.
    pub fn new() -> Setup {
        Setup::on(Project::built_fake_server(SUITE))
    }

    /// A session on `project` as it is (e.g. the project of a session that ended, for the next
    /// `run` of the same package).
    pub fn on(project: Project) -> Setup {
        Setup {
            project,
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            tools: vec!["echo".into(), "write".into()],
            parent_shell: false,
        }
    }

    /// Starts the supervisor as the child of a `sh` (the session's direct child), so a test can
    /// kill that "host" without closing the supervisor's stdin. The supervisor's own pid is
    /// then [`Session::real_supervisor_pid`].
    pub fn via_parent_shell(mut self) -> Setup {
        self.parent_shell = true;
        self
    }

    /// Lists `extra` tools after the default `echo` and `write` (via `FAKE_TOOLS`): the
    /// supervisor refuses calls to tools missing from the catalog (`unknown_tool`), so the
    /// fake's special tools (`crash`, `noise`, …) must be listed to be callable.
    pub fn tools(mut self, extra: &[&str]) -> Setup {
        let mut list = vec![
            json!({"name": "echo", "description": "Echo the arguments back (read-only)",
                   "inputSchema": {"type": "object"},
                   "annotations": {"readOnlyHint": true, "destructiveHint": false,
                                   "idempotentHint": true, "openWorldHint": false}}),
            json!({"name": "write", "description": "Append a line to FAKE_SIDE_EFFECT_FILE",
                   "inputSchema": {"type": "object", "properties": {"marker": {"type": "string"}}},
                   "annotations": {"readOnlyHint": false, "destructiveHint": false}}),
        ];
        for t in extra {
            list.push(json!({"name": t, "description": format!("fake tool {t}"),
                             "inputSchema": {"type": "object"}}));
            self.tools.push(t.to_string());
        }
        let path = self.project.scratch().join("tools.json");
        std::fs::write(&path, Value::Array(list).to_string()).expect("write tools file");
        let p = path.to_str().expect("utf-8 path").to_string();
        self.env("FAKE_TOOLS", &p)
    }

    pub fn arg(mut self, a: &str) -> Setup {
        self.args.push(a.to_string());
        self
    }

    pub fn args(mut self, a: &[&str]) -> Setup {
        self.args.extend(a.iter().map(|s| s.to_string()));
        self
    }

    /// An env var for the supervisor (and so for the fake server it starts).
    pub fn env(mut self, k: &str, v: &str) -> Setup {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    pub fn timeout(mut self, t: Duration) -> Setup {
        self.timeout = t;
        self
    }

    /// `[package.metadata.mcp-dev]` body for the copy.
    pub fn config(self, body: &str) -> Setup {
        self.project.configure(body);
        self
    }

    /// Takes the project's build lock, as another supervisor's build would: the session's first
    /// build waits until the returned file is dropped.
    pub fn hold_build_lock(&self) -> std::fs::File {
        let root = self.project.target_dir().join("mcp-dev");
        std::fs::create_dir_all(&root).unwrap();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join("build.lock"))
            .unwrap();
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
        lock
    }

    pub fn start(self) -> Session {
        Session::start(self)
    }
}

/// A running `cargo-mcp-dev run` and its host side.
pub struct Session {
    pub project: Project,
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    pub inbox: Inbox,
    stderr: Arc<Stderr>,
    /// Index of the first stderr line later `wait_stderr` calls look at.
    cursor: usize,
    deadline: Instant,
    started: Instant,
    done: Arc<AtomicBool>,
    exit: Option<ExitStatus>,
    next_id: u64,
    /// The catalog the fake server lists (names), as configured by [`Setup::tools`].
    pub tool_names: Vec<String>,
    pub log_file: PathBuf,
    pub pid_file: PathBuf,
    pub side_effect_file: PathBuf,
    finished: bool,
}

impl Session {
    fn start(setup: Setup) -> Session {
        let Setup {
            project,
            args,
            env,
            timeout,
            tools,
            parent_shell,
        } = setup;
        let scratch = project.scratch().to_path_buf();
        let log_file = scratch.join("fake.log");
        let pid_file = scratch.join("fake.pids");
        let side_effect_file = scratch.join("side-effects.jsonl");
        let mut cmd = project.command(std::iter::once("run".to_string()).chain(args));
        if parent_shell {
            let mut sh = std::process::Command::new("sh");
            sh.arg("-c")
                .arg(r#"exec 3<&0; "$@" <&3 3<&- & echo "supervisor-pid $!" >&2; wait"#)
                .arg("sh")
                .arg(cmd.get_program())
                .args(cmd.get_args());
            if let Some(d) = cmd.get_current_dir() {
                sh.current_dir(d);
            }
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => sh.env(k, v),
                    None => sh.env_remove(k),
                };
            }
            cmd = sh;
        }
        cmd.env("FAKE_LOG", &log_file)
            .env("FAKE_PID_FILE", &pid_file)
            .env("FAKE_SIDE_EFFECT_FILE", &side_effect_file);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().expect("spawn cargo-mcp-dev run");
        let pid = child.id();
        let stdin = child.stdin.take();
        let inbox = Inbox::new(rpc::spawn_reader(child.stdout.take().expect("piped")));
        let stderr = Arc::new(Stderr::default());
        {
            let stderr = stderr.clone();
            let out = child.stderr.take().expect("piped");
            let pid_file = pid_file.clone();
            std::thread::Builder::new()
                .name("run-stderr".into())
                .spawn(move || {
                    let mut r = BufReader::new(out);
                    loop {
                        let mut buf = Vec::new();
                        match r.read_until(b'\n', &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                            buf.pop();
                        }
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        record_pids(&stderr, &line, &pid_file);
                        stderr.lines.lock().unwrap().push(line);
                        stderr.cond.notify_all();
                    }
                    stderr.closed.store(true, Ordering::SeqCst);
                    stderr.cond.notify_all();
                })
                .expect("spawn stderr reader");
        }
        let started = Instant::now();
        let deadline = started + timeout;
        let done = Arc::new(AtomicBool::new(false));
        {
            // Watchdog: whatever blocks, the processes of a timed-out test do not outlive it.
            let done = done.clone();
            let stderr = stderr.clone();
            std::thread::spawn(move || {
                let kill_at = deadline + Duration::from_secs(10);
                while Instant::now() < kill_at {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                kill_group(pid);
                for p in stderr.pids.lock().unwrap().iter() {
                    kill_group(*p);
                }
            });
        }
        Session {
            project,
            child,
            pid,
            stdin,
            inbox,
            stderr,
            cursor: 0,
            deadline,
            started,
            done,
            exit: None,
            next_id: 1,
            tool_names: tools,
            log_file,
            pid_file,
            side_effect_file,
            finished: false,
        }
    }

    /// The pid of the direct child (the supervisor, or its `sh` with [`Setup::via_parent_shell`]).
    pub fn supervisor_pid(&self) -> u32 {
        self.pid
    }

    /// With [`Setup::via_parent_shell`]: the supervisor's pid, as the shell reported it.
    #[track_caller]
    pub fn real_supervisor_pid(&mut self) -> u32 {
        let lines = self.stderr_lines();
        if let Some(l) = lines.iter().find(|l| l.starts_with("supervisor-pid ")) {
            return l["supervisor-pid ".len()..].trim().parse().expect("pid");
        }
        let l = self.wait_stderr("supervisor-pid ");
        l["supervisor-pid ".len()..].trim().parse().expect("pid")
    }

    fn wait_deadline(&self, max: Duration) -> Instant {
        (Instant::now() + max).min(self.deadline)
    }

    /// Panics with context (last stderr lines) after a failed wait.
    #[track_caller]
    fn timed_out(&mut self, what: &str) -> ! {
        let lines = self.stderr_lines();
        let tail: Vec<&String> = lines.iter().rev().take(40).collect::<Vec<_>>();
        let tail: Vec<&str> = tail.iter().rev().map(|s| s.as_str()).collect();
        let msgs: Vec<String> = self
            .inbox
            .all
            .iter()
            .rev()
            .take(10)
            .map(|m| cut(&m.raw))
            .collect();
        panic!(
            "timed out after {:.1}s (eof={}) waiting for {what}\n--- last host messages (newest first)\n{}\n--- stderr tail\n{}",
            self.started.elapsed().as_secs_f64(),
            self.inbox.eof,
            msgs.join("\n"),
            tail.join("\n")
        );
    }

    // ----- host -> supervisor ---------------------------------------------------------------

    /// Writes one line (a `\n` is added).
    pub fn send(&mut self, line: &str) {
        self.send_bytes(format!("{line}\n").as_bytes());
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin.write_all(bytes).expect("write to supervisor stdin");
        stdin.flush().expect("flush supervisor stdin");
    }

    pub fn request(&mut self, id: &str, method: &str, params: Option<Value>) {
        let line = rpc::request(id, method, params.as_ref());
        self.send(&line);
    }

    pub fn notify(&mut self, method: &str, params: Option<Value>) {
        let line = rpc::notification(method, params.as_ref());
        self.send(&line);
    }

    /// A fresh string id for helper requests (`"h-N"`), never one a test uses itself.
    pub fn fresh_id(&mut self) -> String {
        let id = format!("\"h-{}\"", self.next_id);
        self.next_id += 1;
        id
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    // ----- supervisor -> host ---------------------------------------------------------------

    /// The response with exactly this id (JSON text).
    #[track_caller]
    pub fn response(&mut self, id: &str) -> Msg {
        self.response_within(id, WAIT)
    }

    #[track_caller]
    pub fn response_within(&mut self, id: &str, max: Duration) -> Msg {
        let d = self.wait_deadline(max);
        match self.inbox.response(id, d) {
            Some(m) => m,
            None => self.timed_out(&format!("the response to id {id}")),
        }
    }

    #[track_caller]
    pub fn notification(&mut self, method: &str) -> Msg {
        self.notification_within(method, WAIT)
    }

    #[track_caller]
    pub fn notification_within(&mut self, method: &str, max: Duration) -> Msg {
        let d = self.wait_deadline(max);
        match self.inbox.notification(method, d) {
            Some(m) => m,
            None => self.timed_out(&format!("notification {method}")),
        }
    }

    /// The first message matching `pred`.
    #[track_caller]
    pub fn message(&mut self, what: &str, pred: impl Fn(&Msg) -> bool) -> Msg {
        let d = self.wait_deadline(WAIT);
        match self.inbox.take(d, pred) {
            Some(m) => m,
            None => self.timed_out(what),
        }
    }

    /// Sends a request and waits for its response.
    #[track_caller]
    pub fn roundtrip(&mut self, id: &str, method: &str, params: Option<Value>) -> Msg {
        self.request(id, method, params);
        self.response(id)
    }

    /// `tools/call` of `tool` with `arguments`; waits for the answer.
    #[track_caller]
    pub fn call(&mut self, id: &str, tool: &str, arguments: Value) -> Msg {
        self.roundtrip(
            id,
            "tools/call",
            Some(json!({"name": tool, "arguments": arguments})),
        )
    }

    /// Everything the host receives within `quiet`.
    pub fn drain_for(&mut self, quiet: Duration) -> Vec<Msg> {
        self.inbox.drain_for(quiet)
    }

    /// Waits until the supervisor closes its stdout.
    #[track_caller]
    pub fn expect_stdout_eof(&mut self) {
        let d = self.wait_deadline(WAIT);
        if !self.inbox.wait_eof(d) {
            self.timed_out("end of the supervisor's stdout");
        }
    }

    // ----- protocol helpers -----------------------------------------------------------------

    /// Legacy handshake with `id`: `initialize` (2025-06-18) then `notifications/initialized`.
    #[track_caller]
    pub fn initialize_with_id(&mut self, id: &str) -> Msg {
        let m = self.roundtrip(
            id,
            "initialize",
            Some(
                json!({"protocolVersion": LEGACY_VERSION, "capabilities": {"sampling": {}},
                        "clientInfo": {"name": "raw-test-host", "version": "1.0.0"}}),
            ),
        );
        self.notify("notifications/initialized", None);
        m
    }

    #[track_caller]
    pub fn initialize(&mut self) -> Msg {
        let id = self.fresh_id();
        self.initialize_with_id(&id)
    }

    /// Every tool, following `nextCursor` (the host's own paging); `meta` is added to each
    /// request's params as `_meta` (modern era).
    #[track_caller]
    pub fn list_tools_with(&mut self, meta: Option<&Value>) -> Vec<Value> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let id = self.fresh_id();
            let mut params = json!({});
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            if let Some(m) = meta {
                params["_meta"] = m.clone();
            }
            let r = self.roundtrip(&id, "tools/list", Some(params));
            let result = r.result().clone();
            tools.extend(result["tools"].as_array().cloned().unwrap_or_default());
            match result.get("nextCursor").and_then(Value::as_str) {
                Some(c) => cursor = Some(c.to_string()),
                None => return tools,
            }
        }
    }

    #[track_caller]
    pub fn list_tools(&mut self) -> Vec<Value> {
        self.list_tools_with(None)
    }

    /// Lists tools until the list has exactly `names` (order-insensitive), waiting for the
    /// supervisor's `notifications/tools/list_changed` between attempts, as a host would.
    #[track_caller]
    pub fn sync_tools(&mut self, names: &[&str]) -> Vec<Value> {
        let want: BTreeSet<&str> = names.iter().copied().collect();
        loop {
            let tools = self.list_tools();
            let got: BTreeSet<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
            if got == want {
                return tools;
            }
            self.notification("notifications/tools/list_changed");
        }
    }

    /// Legacy handshake plus a catalog in sync with the real server's default tools.
    #[track_caller]
    pub fn ready_legacy(&mut self) -> (u32, String) {
        self.initialize();
        let (pid, epoch) = self.server_started();
        let names = self.tool_names.clone();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.sync_tools(&names);
        (pid, epoch)
    }

    // ----- status lines ---------------------------------------------------------------------

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lines.lock().unwrap().clone()
    }

    /// Number of status lines so far starting with `prefix`.
    pub fn count_stderr(&self, prefix: &str) -> usize {
        self.stderr_lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// The next stderr line (after the cursor) matching `pred`; the cursor moves past it.
    #[track_caller]
    pub fn wait_stderr_matching(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_stderr_matching_within(what, WAIT, pred)
    }

    #[track_caller]
    pub fn wait_stderr_matching_within(
        &mut self,
        what: &str,
        max: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let d = self.wait_deadline(max);
        let found = {
            let mut lines = self.stderr.lines.lock().unwrap();
            loop {
                if let Some(i) = lines[self.cursor..].iter().position(|l| pred(l)) {
                    let idx = self.cursor + i;
                    break Some((idx, lines[idx].clone()));
                }
                let now = Instant::now();
                if now >= d || self.stderr.closed.load(Ordering::SeqCst) {
                    break None;
                }
                lines = self.stderr.cond.wait_timeout(lines, d - now).unwrap().0;
            }
        };
        match found {
            Some((idx, line)) => {
                self.cursor = idx + 1;
                line
            }
            None => self.timed_out(&format!("a status line: {what}")),
        }
    }

    /// The next stderr line starting with `prefix`.
    #[track_caller]
    pub fn wait_stderr(&mut self, prefix: &str) -> String {
        let p = prefix.to_string();
        self.wait_stderr_matching(prefix, move |l| l.starts_with(&p))
    }

    #[track_caller]
    pub fn wait_stderr_within(&mut self, prefix: &str, max: Duration) -> String {
        let p = prefix.to_string();
        self.wait_stderr_matching_within(prefix, max, move |l| l.starts_with(&p))
    }

    /// The cursor's position (index of the next line `wait_stderr` looks at).
    pub fn stderr_cursor(&self) -> usize {
        self.cursor
    }

    /// `server started: pid=N epoch=E (…)` → (N, E).
    #[track_caller]
    pub fn server_started(&mut self) -> (u32, String) {
        let line = self.wait_stderr("server started: ");
        parse_pid_epoch(&line)
    }

    /// `server replaced: pid=N epoch=E (was OLD)` → (N, E, OLD).
    #[track_caller]
    pub fn server_replaced(&mut self) -> (u32, String, String) {
        let line = self.wait_stderr("server replaced: ");
        let (pid, epoch) = parse_pid_epoch(&line);
        let old = line
            .rsplit_once("(was ")
            .and_then(|(_, r)| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("no `(was …)` in {line}"))
            .to_string();
        (pid, epoch, old)
    }

    // ----- files ----------------------------------------------------------------------------

    /// `FAKE_LOG`: every line the fake servers received, parsed (non-JSON lines as strings).
    pub fn fake_log(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log_file)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| Value::String(l.to_string())))
            .collect()
    }

    /// `FAKE_LOG` raw lines.
    pub fn fake_log_raw(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log_file)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn side_effects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.side_effect_file)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `<target>/mcp-dev/status/<label>.json`.
    pub fn status_file(&self) -> Option<Value> {
        let p = self
            .project
            .target_dir()
            .join("mcp-dev/status")
            .join(format!("{LABEL}.json"));
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
    }

    /// Polls the status file until `pred` holds.
    #[track_caller]
    pub fn wait_status(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let d = self.wait_deadline(WAIT);
        loop {
            if let Some(v) = self.status_file()
                && pred(&v)
            {
                return v;
            }
            if Instant::now() >= d {
                self.timed_out(&format!("status file: {what}"));
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// Replaces the `const REVISION: &str = "…";` line of the copy's server source.
    pub fn set_revision(&self, rev: &str) {
        set_revision(&self.project, rev);
    }

    /// `cargo-mcp-dev ARGS` against this session's project (same home, so same control socket).
    pub fn cli(&self, args: &[&str]) -> super::fixture::Run {
        self.project.run(args)
    }

    // ----- processes ------------------------------------------------------------------------

    /// Every fake-server and grandchild pid started so far.
    pub fn pids(&self) -> BTreeSet<u32> {
        self.stderr.pids.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        if let Some(p) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(p, sig);
        }
    }

    /// Waits for the supervisor to exit (None on timeout).
    pub fn wait_exit(&mut self, max: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exit {
            return Some(s);
        }
        let d = Instant::now() + max;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s);
                return Some(s);
            }
            if Instant::now() >= d {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Pids from [`Session::pids`] still alive after `within` (zombies count as gone).
    pub fn survivors(&self, within: Duration) -> Vec<u32> {
        let d = Instant::now() + within;
        loop {
            let alive: Vec<u32> = self.pids().into_iter().filter(|p| alive(*p)).collect();
            if alive.is_empty() || Instant::now() >= d {
                return alive;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The supervisor closed the connection on its own: stdout reaches EOF, it exits 107
    /// (`CONNECTION_CLOSED`) and leaves nothing running.
    #[track_caller]
    pub fn expect_connection_closed(mut self) {
        self.expect_stdout_eof();
        let status = self
            .wait_exit(Duration::from_secs(5))
            .expect("supervisor exits");
        assert_eq!(status.code(), Some(107));
        self.check_clean();
    }

    /// Closes stdin and expects a clean exit with `code` within 5 s, no non-JSON on stdout and
    /// no surviving fake-server process.
    #[track_caller]
    pub fn finish_with(mut self, code: i32) {
        self.close_stdin();
        let status = match self.wait_exit(Duration::from_secs(5)) {
            Some(s) => s,
            None => self.timed_out("the supervisor to exit after stdin closed"),
        };
        assert_eq!(
            status.code(),
            Some(code),
            "supervisor exit status {status:?}"
        );
        self.check_clean();
    }

    #[track_caller]
    pub fn finish(self) {
        self.finish_with(0)
    }

    /// [`Session::finish`], handing back the project (for the next `run` of it).
    #[track_caller]
    pub fn finish_keeping_project(mut self) -> Project {
        self.close_stdin();
        let status = match self.wait_exit(Duration::from_secs(5)) {
            Some(s) => s,
            None => self.timed_out("the supervisor to exit after stdin closed"),
        };
        assert_eq!(status.code(), Some(0), "supervisor exit status {status:?}");
        self.check_clean();
        std::mem::replace(&mut self.project, Project::empty())
    }

    /// No non-JSON on the host's stdout and no fake-server left.
    #[track_caller]
    pub fn check_clean(&mut self) {
        self.inbox.pending();
        assert!(
            self.inbox.not_json.is_empty(),
            "non-JSON written to the host: {:?}",
            self.inbox.not_json
        );
        let left = self.survivors(Duration::from_secs(3));
        assert!(
            left.is_empty(),
            "fake-server processes outlived the session: {left:?}"
        );
        self.finished = true;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stdin = None;
        let exited = self.wait_exit(Duration::from_secs(4)).is_some();
        let left = self.survivors(Duration::from_secs(if exited { 3 } else { 0 }));
        kill_group(self.pid);
        for p in self.pids() {
            kill_group(p);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.done.store(true, Ordering::SeqCst);
        if std::thread::panicking() {
            eprintln!("--- cargo-mcp-dev run stderr ---");
            for l in self.stderr_lines() {
                eprintln!("{}", cut(&l));
            }
            return;
        }
        if !self.finished {
            assert!(
                exited,
                "the supervisor did not exit within 4 s of stdin closing"
            );
            assert!(
                left.is_empty(),
                "fake-server processes outlived the session: {left:?}"
            );
            assert!(
                self.inbox.not_json.is_empty(),
                "non-JSON written to the host: {:?}",
                self.inbox.not_json
            );
        }
    }
}

fn cut(s: &str) -> String {
    if s.len() > 600 {
        let mut end = 600;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &s[..end], s.len())
    } else {
        s.to_string()
    }
}

/// Pids of fake servers: from `server started|replaced: pid=N`, and from the pid file when a
/// server's banner shows (it writes the file, grandchild first, before the banner).
fn record_pids(stderr: &Stderr, line: &str, pid_file: &std::path::Path) {
    let mut pids = stderr.pids.lock().unwrap();
    if line.starts_with("server started: ") || line.starts_with("server replaced: ") {
        pids.insert(parse_pid_epoch(line).0);
    }
    if line.contains("] fake-server: revision ") {
        for p in std::fs::read_to_string(pid_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
        {
            pids.insert(p);
        }
    }
}

/// `… pid=N epoch=E …` → (N, E).
pub fn parse_pid_epoch(line: &str) -> (u32, String) {
    let field = |key: &str| -> String {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no `{key}` in {line}"))
            .to_string()
    };
    let pid = field("pid=")
        .parse()
        .unwrap_or_else(|_| panic!("bad pid in {line}"));
    (pid, field("epoch="))
}

/// Replaces the `const REVISION` line of `src/main.rs`.
pub fn set_revision(project: &Project, rev: &str) {
    let text = project.read("src/main.rs");
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with("const REVISION: &str = ") {
                format!("const REVISION: &str = \"{rev}\";")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_ne!(
        out.join("\n"),
        text.trim_end(),
        "REVISION line not found or unchanged"
    );
    project.write("src/main.rs", &(out.join("\n") + "\n"));
}

/// True while `pid` exists and is not a zombie (PID 1 here may never reap re-parented ones).
pub fn alive(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    if rustix::process::test_kill_process(p).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_none_or(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// SIGKILL to a process group (a group that is gone is fine).
pub fn kill_group(pgid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pgid as i32) {
        let _ = rustix::process::kill_process_group(p, rustix::process::Signal::KILL);
    }
}

/// The epoch's short form used in stderr prefixes (first 12 characters).
pub fn short_epoch(epoch: &str) -> &str {
    &epoch[..epoch.len().min(12)]
}
