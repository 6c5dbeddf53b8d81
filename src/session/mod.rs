//! The `run` session: one owner of all state, events in, effects out.
//!
//! Everything `cargo mcp-dev run` decides happens here, on one thread, one event at a time:
//! host and child messages, build results, child exits, restarts, control-socket requests.
//! Readers, writers, the watcher, the build and the stop sequence run on their own threads and
//! talk to the session only through [`Event`]s and [`Io`]. Whether a `tools/call` is forwarded is
//! decided by [`crate::approval::Gate`] alone; this module routes, maps ids and keeps the host's
//! view of the protocol coherent across restarts.

pub mod protocol;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;
use serde_json::{Value, json};

use crate::approval::{self, ApprovalRequest, CallDecision, Gate, RevokeTarget};
use crate::audit::{self, AuditLog};
use crate::catalog::{Catalog, CatalogHistory};
use crate::cli::RestartMode;
use crate::cycle::{self, CycleOutcome, Prepared};
use crate::epoch::{self, LaunchRecord};
use crate::fingerprint::IdentityRecord;
use crate::hashing::{self, short};
use crate::proxy::envelope::{self, Kind, Message, RawId};
use crate::supervisor::{ExitInfo, Worker};
use protocol::Era;

/// JSON-RPC error codes of cargo mcp-dev's own errors (outside −32768..−32000, and never in
/// MCP's reserved −32020..−32099).
pub mod codes {
    /// The request was in flight when its server was replaced or exited.
    pub const EPOCH_TRANSITION: i64 = -31001;
    /// No server is available (build failed, crash loop, shutting down).
    pub const SERVER_UNAVAILABLE: i64 = -31002;
    /// The host sent a response to a request nobody is waiting for.
    pub const UNKNOWN_RESPONSE: i64 = -31003;
    /// The request could not be audited, so it was not forwarded.
    pub const AUDIT_FAILED: i64 = -31004;
}

/// What the session hears about.
pub enum Event {
    HostLine(Vec<u8>),
    HostOversize {
        prefix: Vec<u8>,
        len: usize,
    },
    HostEof,
    ChildLine {
        epoch: String,
        line: Vec<u8>,
    },
    ChildOversize {
        epoch: String,
        prefix: Vec<u8>,
        len: usize,
    },
    ChildExited {
        epoch: String,
        exit: ExitInfo,
    },
    ChildStopped {
        epoch: String,
    },
    BuildFinished(Box<Result<CycleOutcome, String>>),
    SourcesChanged(Vec<PathBuf>),
    RestartDue,
    /// Time to answer calls held during the first start that waited long enough.
    HeldCallsDue,
    Control {
        request: Value,
        reply: Sender<Value>,
    },
    Shutdown(String),
}

/// Effects the session asks of its shell (threads and processes live there).
pub trait Io {
    /// Queue one line (with `\n`) for the host's stdin… our stdout.
    fn to_host(&mut self, line: Vec<u8>);
    /// Queue one line for the current child of `epoch`.
    fn to_child(&mut self, epoch: &str, line: Vec<u8>);
    /// Start a build on the build thread (never two at once; the session guarantees it).
    fn start_build(&mut self);
    /// Spawn the server for `record` under `epoch`; returns its pid and worker handle.
    fn spawn(&mut self, epoch: &str, record: &IdentityRecord) -> Result<Worker, String>;
    /// Run the stop sequence for the child of `epoch` in the background; `ChildStopped` follows.
    fn stop(&mut self, epoch: &str, worker: Worker, grace: Duration);
    /// Deliver `HeldCallsDue` after `delay`.
    fn schedule_held_check(&mut self, delay: Duration);
    /// Deliver `RestartDue` after `delay`.
    fn schedule_restart(&mut self, delay: Duration);
    /// Close the host's stdout (the connection) after everything queued is written.
    fn close_host(&mut self);
    /// A status line on stderr.
    fn status(&mut self, line: &str);
}

/// Settings fixed for the session.
pub struct SessionConfig {
    pub prep: Prepared,
    pub restart: RestartMode,
    pub grace: Duration,
    pub gating_off: bool,
    pub status_file: PathBuf,
    pub launch_dir: PathBuf,
    pub facts_file: PathBuf,
    pub socket_path: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ChildPhase {
    /// Started; waiting for the host's first message to know the era.
    Started,
    /// Our `initialize` (or modern `server/discover`) is in flight.
    Handshaking,
    /// Legacy: initialized; waiting for the host's `notifications/initialized` to pass on.
    AwaitingInitialized,
    /// Catalog fetch in flight.
    FetchingCatalog,
    /// Serving.
    Ready,
}

struct ChildState {
    epoch: String,
    worker: Worker,
    record: IdentityRecord,
    phase: ChildPhase,
    started: Instant,
    stopping: bool,
    catalog_pages: Vec<Value>,
}

/// What a child-facing id (always ours) stands for.
#[derive(Debug)]
enum Pending {
    /// A host request forwarded to the child.
    Host {
        host_id: RawId,
        method: String,
        epoch: String,
        call: Option<CallInfo>,
    },
    /// Our replay of the host's `initialize` (or modern `server/discover`); `answer` is the host
    /// id to answer when the host is still waiting for it.
    Handshake {
        epoch: String,
        answer: Option<RawId>,
        modern: bool,
    },
    /// Our own `tools/list` page.
    CatalogPage { epoch: String },
}

#[derive(Debug, Clone)]
struct CallInfo {
    tool: String,
    call_id: String,
    started: Instant,
}

/// A host `subscriptions/listen` stream, carried across restarts.
struct Listen {
    host_id: RawId,
    params: Value,
    /// Our id for it at the current child.
    child_id: Option<u64>,
    tools: bool,
    /// The host got this stream's acknowledgement (re-opened streams are not acknowledged twice).
    acknowledged: bool,
}

/// What the host negotiated (legacy) or was first told (modern).
#[derive(Debug, Clone)]
struct Negotiated {
    protocol_version: String,
    capabilities: Value,
    from_cache: bool,
}

pub struct Session<I: Io> {
    io: I,
    cfg: SessionConfig,
    agent_run: String,
    gate: Gate,
    catalog: CatalogHistory,
    audit: Option<AuditLog>,
    audit_path: PathBuf,
    child: Option<ChildState>,
    /// Identity to apply when restarting (newest successful build).
    latest: Option<IdentityRecord>,
    /// A newer build waits for `cargo mcp-dev restart` (manual mode).
    pending_apply: bool,
    replacing: Option<(String, IdentityRecord, Option<String>)>,
    pending: HashMap<u64, Pending>,
    next_id: u64,
    /// Child-to-host requests: our host-facing id → (epoch, the child's own id).
    child_requests: HashMap<u64, (String, RawId)>,
    held: VecDeque<Message>,
    era: Option<Era>,
    host_init: Option<Value>,
    host_initialized: bool,
    negotiated: Option<Negotiated>,
    modern_meta: Option<Value>,
    client_info: Option<Value>,
    listens: Vec<Listen>,
    host_list_pages: Vec<Value>,
    ever_ready: bool,
    build_running: bool,
    build_queued: bool,
    last_build: Option<String>,
    crashes: VecDeque<Instant>,
    restart_scheduled: bool,
    crash_loop: bool,
    shutting_down: bool,
    exit_code: Option<i32>,
    /// The epoch, identity and catalog of the last approval (what `approve` diffs against).
    approved_baseline: Option<(String, IdentityRecord, Option<Catalog>)>,
    /// The newest build failed: held requests are answered instead of waiting.
    build_failed: bool,
    /// When each held `tools/call` arrived, in `held` order.
    held_calls_since: VecDeque<Instant>,
}

/// Crash-loop bounds: this many exits within the window stop automatic restarts.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
const HELD_LIMIT: usize = 1024;
/// How long a `tools/call` sent during the very first start waits for the server before it is
/// answered `identity_pending` (a warm start is well within it; a cold build is not).
const FIRST_START_CALL_WAIT: Duration = Duration::from_secs(8);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl<I: Io> Session<I> {
    pub fn new(
        io: I,
        cfg: SessionConfig,
        policy: approval::Policy,
        audit: Option<AuditLog>,
        audit_path: PathBuf,
    ) -> Self {
        let agent_run = epoch::mint();
        let gate = Gate::new(policy, agent_run.clone(), cfg.prep.target.label.clone());
        Session {
            io,
            cfg,
            agent_run,
            gate,
            catalog: CatalogHistory::new(),
            audit,
            audit_path,
            child: None,
            latest: None,
            pending_apply: false,
            replacing: None,
            pending: HashMap::new(),
            next_id: 1,
            child_requests: HashMap::new(),
            held: VecDeque::new(),
            era: None,
            host_init: None,
            host_initialized: false,
            negotiated: None,
            modern_meta: None,
            client_info: None,
            listens: Vec::new(),
            host_list_pages: Vec::new(),
            ever_ready: false,
            build_running: false,
            build_queued: false,
            last_build: None,
            crashes: VecDeque::new(),
            restart_scheduled: false,
            crash_loop: false,
            shutting_down: false,
            exit_code: None,
            approved_baseline: None,
            build_failed: false,
            held_calls_since: VecDeque::new(),
        }
    }

    pub fn label(&self) -> &str {
        &self.cfg.prep.target.label
    }

    pub fn agent_run(&self) -> &str {
        &self.agent_run
    }

    /// Set once the session decided to end; the shell exits with it.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    pub fn io(&mut self) -> &mut I {
        &mut self.io
    }

    /// Starts the run: audit `run_started`, first build.
    pub fn start(&mut self) {
        let gating = if self.cfg.gating_off { "off" } else { "on" };
        self.audit_record(
            audit::RUN_STARTED,
            None,
            json!({"agentRun": self.agent_run, "client": Value::Null, "gating": gating, "label": self.label(),
                   "restart": self.cfg.restart.as_str(), "pid": std::process::id()}),
        );
        if self.cfg.gating_off {
            self.audit_record(
                audit::GATING_DISABLED,
                None,
                json!({"reason": "--no-gating or gate = \"off\""}),
            );
            self.io
                .status("approval gating is off: every tool call is forwarded without a grant");
        }
        self.request_build();
        self.write_status_file();
    }

    pub fn handle(&mut self, event: Event) {
        match event {
            Event::HostLine(line) => self.on_host_line(&line),
            Event::HostOversize { prefix, len } => {
                self.io.status(&format!("host sent a message of {len} bytes, over the line limit; answered with a parse error"));
                let id = protocol::recover_id(&prefix);
                self.io.to_host(envelope::error_line(
                    id.as_deref(),
                    -32700,
                    "message too large",
                    json!({"bytes": len}),
                ));
            }
            Event::HostEof => self.shutdown("the host closed stdin"),
            Event::ChildLine { epoch, line } => self.on_child_line(&epoch, &line),
            Event::ChildOversize { epoch, prefix, len } => {
                self.on_child_oversize(&epoch, &prefix, len)
            }
            Event::ChildExited { epoch, exit } => self.on_child_exited(&epoch, exit),
            Event::ChildStopped { epoch } => self.on_child_stopped(&epoch),
            Event::BuildFinished(result) => self.on_build_finished(*result),
            Event::SourcesChanged(paths) => {
                if !self.shutting_down {
                    let shown: Vec<String> = paths
                        .iter()
                        .take(3)
                        .map(|p| self.cfg.prep.target.display_path(p))
                        .collect();
                    crate::status::verbose_line(&format!("change detected: {}", shown.join(", ")));
                    self.crash_loop = false;
                    self.request_build();
                }
            }
            Event::HeldCallsDue => self.expire_held_calls(),
            Event::RestartDue => {
                self.restart_scheduled = false;
                if self.child.is_none()
                    && self.replacing.is_none()
                    && !self.shutting_down
                    && let Some(record) = self.latest.clone()
                {
                    self.spawn_child(record, None);
                }
            }
            Event::Control { request, reply } => {
                let answer = self.on_control(&request);
                let _ = reply.send(answer);
            }
            Event::Shutdown(reason) => self.shutdown(&reason),
        }
    }

    // ----- builds -------------------------------------------------------------------------

    fn request_build(&mut self) {
        if self.build_running {
            // Changes during a build queue exactly one follow-up build.
            self.build_queued = true;
            return;
        }
        self.build_running = true;
        self.io.start_build();
    }

    fn on_build_finished(&mut self, result: Result<CycleOutcome, String>) {
        self.build_running = false;
        if self.shutting_down {
            return;
        }
        match result {
            Err(message) => {
                self.io.status(&format!("build failed: {message}"));
                self.last_build = Some(format!("build failed: {message}"));
                self.build_failed = true;
                if self.child.is_none() && self.replacing.is_none() {
                    self.fail_held("the server could not be built");
                }
                self.report_running();
            }
            Ok(outcome) => {
                let line = cycle::status_line(&self.cfg.prep, &outcome);
                self.io.status(&line);
                self.last_build = Some(line);
                match outcome {
                    CycleOutcome::Failed {
                        errors, first_file, ..
                    } => {
                        self.build_failed = true;
                        if self.child.is_none() && self.replacing.is_none() {
                            self.fail_held("the server's build failed; fix it and save to rebuild");
                        }
                        let epoch = self.current_epoch().map(str::to_string);
                        self.audit_record(
                            audit::BUILD_COMPLETED,
                            epoch.as_deref(),
                            json!({"outcome": "failed", "errors": errors, "file": first_file}),
                        );
                        self.report_running();
                    }
                    CycleOutcome::Complete {
                        record,
                        changed,
                        problems,
                        ..
                    } => {
                        self.build_failed = false;
                        for p in problems.iter().filter(|p| {
                            !matches!(p, crate::capture::CaptureProblem::UnknownConfigKeys(_))
                        }) {
                            self.io.status(&format!("warning: {p}"));
                        }
                        let epoch = self.current_epoch().map(str::to_string);
                        self.audit_record(
                            audit::BUILD_COMPLETED,
                            epoch.as_deref(),
                            json!({"outcome": if changed.is_empty() { "unchanged" } else { "changed" },
                                   "identityDigest": record.identity_digest,
                                   "executableSha256": record.executable.sha256,
                                   "changed": changed.iter().map(|c| c.name()).collect::<Vec<_>>()}),
                        );
                        self.apply_build(record);
                    }
                }
            }
        }
        if self.build_queued && !self.shutting_down {
            self.build_queued = false;
            self.request_build();
        }
        self.write_status_file();
    }

    fn apply_build(&mut self, record: IdentityRecord) {
        self.latest = Some(record.clone());
        let running_digest = self
            .child
            .as_ref()
            .map(|c| c.record.identity_digest.clone());
        match running_digest {
            None if self.replacing.is_some() => {} // the restart in progress picks up `latest`
            None => {
                if self.crash_loop {
                    self.io.status(
                        "server not restarted: it is in a crash loop (waiting for a source change)",
                    );
                } else {
                    self.spawn_child(record, None);
                }
            }
            Some(d) if d == record.identity_digest => {
                self.pending_apply = false;
                self.report_running();
            }
            Some(_) => match self.cfg.restart {
                RestartMode::Supervise => self.begin_replace(record, "new build"),
                RestartMode::Manual => {
                    self.pending_apply = true;
                    if let Some(c) = &self.child {
                        let line = format!(
                            "running server unchanged: pid={} epoch={} (restart mode manual: run `cargo mcp-dev restart` to apply {})",
                            c.worker.pid,
                            c.epoch,
                            short(&record.identity_digest)
                        );
                        self.io.status(&line);
                    }
                }
                RestartMode::Disconnect => {
                    self.close_connection(&format!(
                        "new build {} (restart mode disconnect); the host must reconnect",
                        short(&record.identity_digest)
                    ));
                }
            },
        }
    }

    fn report_running(&mut self) {
        let line = match &self.child {
            Some(c) => format!(
                "running server unchanged: pid={} epoch={}",
                c.worker.pid, c.epoch
            ),
            None => "no server running".to_string(),
        };
        self.io.status(&line);
    }

    // ----- child lifecycle ----------------------------------------------------------------

    fn spawn_child(&mut self, record: IdentityRecord, replaced: Option<String>) {
        let epoch = epoch::mint();
        self.spawn_child_as(epoch, record, replaced);
    }

    fn spawn_child_as(&mut self, epoch: String, record: IdentityRecord, replaced: Option<String>) {
        let worker = match self.io.spawn(&epoch, &record) {
            Ok(w) => w,
            Err(e) => {
                self.io.status(&format!("server failed to start: {e}"));
                self.fail_held("the server failed to start");
                self.write_status_file();
                return;
            }
        };
        let pid = worker.pid;
        let launch = LaunchRecord::new(&epoch, pid, &record, now_rfc3339(), replaced.clone());
        self.write_launch_record(&launch);
        self.gate.epoch_started(&epoch);
        self.audit_record(audit::SERVER_STARTED, Some(&epoch), json!({
            "epoch": epoch, "pid": pid, "identityDigest": record.identity_digest,
            "executableSha256": record.executable.sha256, "argv": record.launch.argv, "label": self.label(),
            "launch": launch,
        }));
        match &replaced {
            Some(old) => {
                self.io.status(&format!(
                    "server replaced: pid={pid} epoch={epoch} (was {old})"
                ));
                self.audit_record(
                    audit::SERVER_REPLACED,
                    Some(&epoch),
                    json!({"oldEpoch": old, "newEpoch": epoch, "pid": pid}),
                );
            }
            None => self.io.status(&format!(
                "server started: pid={pid} epoch={epoch} ({})",
                short(&record.identity_digest)
            )),
        }
        self.child = Some(ChildState {
            epoch,
            worker,
            record,
            phase: ChildPhase::Started,
            started: Instant::now(),
            stopping: false,
            catalog_pages: Vec::new(),
        });
        self.pending_apply = false;
        self.advance_child();
        self.write_status_file();
    }

    /// Moves a fresh child through the handshake as far as what the host has said allows.
    fn advance_child(&mut self) {
        let Some(child) = &self.child else { return };
        if child.phase != ChildPhase::Started {
            return;
        }
        let epoch = child.epoch.clone();
        match self.era {
            None => {} // wait for the host's first message
            Some(Era::Legacy) => {
                if let Some(params) = self.host_init.clone() {
                    let id = self.alloc(Pending::Handshake {
                        epoch: epoch.clone(),
                        answer: None,
                        modern: false,
                    });
                    self.set_phase(ChildPhase::Handshaking);
                    self.io
                        .to_child(&epoch, envelope::request_line(id, "initialize", &params));
                }
            }
            Some(Era::Modern) => {
                let params = json!({"_meta": self.modern_meta.clone().unwrap_or(json!({}))});
                let id = self.alloc(Pending::Handshake {
                    epoch: epoch.clone(),
                    answer: None,
                    modern: true,
                });
                self.set_phase(ChildPhase::Handshaking);
                self.io.to_child(
                    &epoch,
                    envelope::request_line(id, "server/discover", &params),
                );
            }
        }
    }

    fn set_phase(&mut self, phase: ChildPhase) {
        if let Some(c) = &mut self.child {
            c.phase = phase;
        }
    }

    fn alloc(&mut self, p: Pending) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, p);
        id
    }

    fn fetch_catalog(&mut self, cursor: Option<String>) {
        let Some(child) = &mut self.child else { return };
        if cursor.is_none() {
            child.catalog_pages.clear();
        }
        child.phase = ChildPhase::FetchingCatalog;
        let epoch = child.epoch.clone();
        let mut params = json!({});
        if let Some(c) = cursor {
            params["cursor"] = json!(c);
        }
        if self.era == Some(Era::Modern) {
            params["_meta"] = self.modern_meta.clone().unwrap_or(json!({}));
        }
        let id = self.alloc(Pending::CatalogPage {
            epoch: epoch.clone(),
        });
        self.io
            .to_child(&epoch, envelope::request_line(id, "tools/list", &params));
    }

    fn on_catalog_page(&mut self, epoch: &str, msg: &Message) {
        let result = msg.result_value();
        if msg.is_error() {
            // A server without tools: an empty catalog is still a catalog.
            self.catalog_complete(epoch, Vec::new());
            return;
        }
        let tools = result
            .get("tools")
            .and_then(|t| t.as_array())
            .cloned()
            .unwrap_or_default();
        let next = result
            .get("nextCursor")
            .and_then(|c| c.as_str())
            .map(str::to_string);
        if let Some(c) = &mut self.child {
            c.catalog_pages.extend(tools);
        }
        match next {
            Some(cursor) => self.fetch_catalog(Some(cursor)),
            None => {
                let pages = self
                    .child
                    .as_mut()
                    .map(|c| std::mem::take(&mut c.catalog_pages))
                    .unwrap_or_default();
                self.catalog_complete(epoch, pages);
            }
        }
    }

    fn catalog_complete(&mut self, epoch: &str, tools: Vec<Value>) {
        let catalog = match Catalog::from_tools(tools.clone()) {
            Ok(c) => c,
            Err(e) => {
                self.io.status(&format!(
                    "server's tools/list is invalid ({e}); treating its catalog as empty"
                ));
                Catalog::from_tools(Vec::new()).expect("empty catalog")
            }
        };
        let names = catalog.name_set();
        let (revision, diff) = self.catalog.observe(catalog);
        self.gate.catalog_fetched(epoch, revision.clone(), names);
        let summary = diff
            .as_ref()
            .map(|d| d.summary())
            .unwrap_or_else(|| "first".into());
        if let Some(d) = &diff {
            self.io.status(&format!(
                "catalog changed: revision {} ({}; {})",
                revision.number,
                short(&revision.digest),
                d.summary()
            ));
            for line in d.render_human() {
                self.io.status(&format!("  {line}"));
            }
        }
        self.audit_record(
            audit::CATALOG_REFRESHED,
            Some(epoch),
            json!({
                "revision": revision.number, "digest": revision.digest, "summary": summary,
                // Human lines only: server JSON may hold floats, which the audit encoding refuses.
                "changes": diff.as_ref().map(|d| d.render_human()),
            }),
        );
        self.save_facts(Some(&tools));
        // Tell the host only when what it holds is no longer current.
        let host = self.gate.host_catalog().map(str::to_string);
        if host.is_some() && host.as_deref() != Some(revision.digest.as_str()) {
            self.notify_list_changed();
        }
        self.set_phase(ChildPhase::Ready);
        self.ever_ready = true;
        self.flush_held();
        self.write_status_file();
    }

    fn notify_list_changed(&mut self) {
        match self.era {
            Some(Era::Modern) => {
                let targets: Vec<Value> = self
                    .listens
                    .iter()
                    .filter(|l| l.tools)
                    .map(|l| serde_json::from_str(l.host_id.get()).unwrap_or(Value::Null))
                    .collect();
                for sid in targets {
                    let params = json!({"_meta": {protocol::SUBSCRIPTION_ID: sid}});
                    self.io.to_host(envelope::notification_line(
                        "notifications/tools/list_changed",
                        Some(&params),
                    ));
                }
            }
            _ => self.io.to_host(envelope::notification_line(
                "notifications/tools/list_changed",
                None,
            )),
        }
    }

    fn child_ready(&self) -> bool {
        matches!(&self.child, Some(c) if c.phase == ChildPhase::Ready && !c.stopping)
    }

    fn flush_held(&mut self) {
        self.held_calls_since.clear();
        while self.child_ready() {
            let Some(msg) = self.held.pop_front() else {
                break;
            };
            self.route_host_request(msg);
        }
    }

    /// Calls held during the first start get their answer (identity_pending) once they waited
    /// [`FIRST_START_CALL_WAIT`] and the server is still not up.
    fn expire_held_calls(&mut self) {
        if self.child_ready() {
            return;
        }
        let now = Instant::now();
        let mut kept = VecDeque::new();
        while let Some(msg) = self.held.pop_front() {
            let is_call = msg.method() == Some("tools/call");
            if is_call {
                let since = self.held_calls_since.pop_front().unwrap_or(now);
                if now.duration_since(since) >= FIRST_START_CALL_WAIT {
                    self.on_host_call(msg);
                    continue;
                }
                self.held_calls_since.push_back(since);
            }
            kept.push_back(msg);
        }
        self.held = kept;
    }

    fn fail_held(&mut self, why: &str) {
        self.held_calls_since.clear();
        while let Some(msg) = self.held.pop_front() {
            if msg.method() == Some("tools/call") {
                // The gate answers it (identity_pending): a tool error the model can read.
                self.on_host_call(msg);
                continue;
            }
            if let Some(id) = msg.id() {
                self.io.to_host(envelope::error_line(
                    Some(id),
                    codes::SERVER_UNAVAILABLE,
                    why,
                    json!({"error": "server_unavailable"}),
                ));
            }
        }
    }

    /// Supervise mode: answer in-flight requests, stop the old child, then start the new one.
    fn begin_replace(&mut self, record: IdentityRecord, why: &str) {
        let Some(child) = self.child.take() else {
            self.spawn_child(record, None);
            return;
        };
        let new_epoch = epoch::mint();
        crate::status::verbose_line(&format!("replacing server ({why})"));
        self.gate.server_exited(&child.epoch);
        self.answer_in_flight(&child.epoch, Some(&new_epoch), "replaced", None);
        self.replacing = Some((new_epoch, record, Some(child.epoch.clone())));
        self.io
            .stop(&child.epoch, child.worker.clone(), self.cfg.grace);
        self.write_status_file();
    }

    fn on_child_stopped(&mut self, epoch: &str) {
        if self.shutting_down {
            return;
        }
        if let Some((new_epoch, record, old)) = self.replacing.take() {
            if old.as_deref() == Some(epoch) {
                // Apply the newest successful build, which may be newer than the one that asked.
                let record = self.latest.clone().unwrap_or(record);
                self.spawn_child_as(new_epoch, record, old);
            } else {
                self.replacing = Some((new_epoch, record, old));
            }
        }
    }

    fn on_child_exited(&mut self, epoch: &str, exit: ExitInfo) {
        let Some(child) = &self.child else { return };
        if child.epoch != epoch || child.stopping {
            return; // a replaced child: its requests were already answered
        }
        let child = self.child.take().expect("checked");
        let lived = child.started.elapsed();
        self.io.status(&format!(
            "server exited: pid={} epoch={} ({exit})",
            child.worker.pid, child.epoch
        ));
        self.audit_record(audit::SERVER_EXITED, Some(epoch), json!({"pid": child.worker.pid, "exit": exit.to_string(), "livedMs": lived.as_millis() as u64}));
        self.gate.server_exited(epoch);
        self.answer_in_flight(epoch, None, "exited", Some(&exit.to_string()));
        child.worker.kill_group(); // grandchildren left in its group go too
        if self.shutting_down {
            return;
        }
        match self.cfg.restart {
            RestartMode::Supervise => {
                let now = Instant::now();
                self.crashes.push_back(now);
                while self
                    .crashes
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > CRASH_WINDOW)
                {
                    self.crashes.pop_front();
                }
                if self.crashes.len() >= CRASH_LIMIT {
                    self.crash_loop = true;
                    self.io.status(&format!(
                        "server crash loop: {} exits in {} s; not restarting until the sources change or `cargo mcp-dev restart`",
                        self.crashes.len(),
                        CRASH_WINDOW.as_secs()
                    ));
                    self.fail_held("the server is in a crash loop");
                } else if !self.restart_scheduled {
                    let delay = Duration::from_millis(
                        250u64 << (self.crashes.len().saturating_sub(1)).min(6),
                    );
                    self.restart_scheduled = true;
                    self.io
                        .status(&format!("restarting server in {} ms", delay.as_millis()));
                    self.io.schedule_restart(delay);
                }
            }
            RestartMode::Manual => {
                self.io.status(
                    "restart mode manual: run `cargo mcp-dev restart` to start the server again",
                );
                self.fail_held("the server exited");
            }
            RestartMode::Disconnect => self.close_connection(&format!(
                "server exited ({exit}) in restart mode disconnect"
            )),
        }
        self.write_status_file();
    }

    /// Every request pending at `epoch` gets an answer now; none is replayed.
    fn answer_in_flight(
        &mut self,
        epoch: &str,
        new_epoch: Option<&str>,
        cause: &str,
        exit: Option<&str>,
    ) {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| match p {
                Pending::Host { epoch: e, .. }
                | Pending::Handshake { epoch: e, .. }
                | Pending::CatalogPage { epoch: e } => e == epoch,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(p) = self.pending.remove(&id) else {
                continue;
            };
            match p {
                Pending::Host {
                    host_id,
                    method,
                    call,
                    ..
                } => {
                    if method == "subscriptions/listen" {
                        continue; // carried to the next child
                    }
                    let payload = json!({
                        "error": "epoch_transition",
                        "reason": if cause == "replaced" { "the server was replaced while this request was in flight" } else { "the server exited while this request was in flight" },
                        "cause": cause,
                        "oldEpoch": epoch,
                        "newEpoch": new_epoch,
                        "exit": exit,
                        "mayHaveRun": true,
                        "retried": false,
                        "retry": "refresh tool metadata, check whether the call took effect, then decide whether to call again",
                    });
                    if let Some(call) = call {
                        self.audit_record(audit::CALL_FAILED_EPOCH_TRANSITION, Some(epoch), json!({
                            "callId": call.call_id, "tool": call.tool, "oldEpoch": epoch, "newEpoch": new_epoch, "cause": cause,
                        }));
                        let what = if cause == "replaced" {
                            "was replaced"
                        } else {
                            "exited"
                        };
                        let hint = format!(
                            "The server running epoch {epoch} {what} while `{}` was in flight; it may or may not have run and was not retried.",
                            call.tool
                        );
                        self.io.to_host(envelope::result_line(
                            &host_id,
                            &self.tool_error(&payload, &hint),
                        ));
                    } else {
                        self.io.to_host(envelope::error_line(
                            Some(&host_id),
                            codes::EPOCH_TRANSITION,
                            &format!(
                                "server {cause} while the request was in flight (epoch {epoch})"
                            ),
                            payload,
                        ));
                    }
                }
                Pending::Handshake {
                    answer: Some(host_id),
                    ..
                } => {
                    self.io.to_host(envelope::error_line(
                        Some(&host_id),
                        codes::EPOCH_TRANSITION,
                        &format!("server {cause} during the handshake"),
                        json!({"error": "epoch_transition", "oldEpoch": epoch}),
                    ));
                }
                _ => {}
            }
        }
        for l in &mut self.listens {
            l.child_id = None;
        }
        self.child_requests.retain(|_, (e, _)| e != epoch);
        self.host_list_pages.clear();
    }

    fn tool_error(&self, payload: &Value, hint: &str) -> Value {
        let mut r = json!({
            "content": [
                {"type": "text", "text": payload.to_string()},
                {"type": "text", "text": hint},
            ],
            "isError": true,
            "_meta": {"dev.cargo-mcp-dev/error": payload},
        });
        if self.era == Some(Era::Modern) {
            r["resultType"] = json!("complete");
        }
        r
    }

    // ----- host messages ------------------------------------------------------------------

    fn on_host_line(&mut self, line: &[u8]) {
        let msg = match Message::parse(line) {
            Ok(m) => m,
            Err(e) => {
                self.io.status(&format!(
                    "host sent an invalid message ({e}); answered with an error"
                ));
                let id = protocol::recover_id(line);
                self.io.to_host(envelope::error_line(
                    id.as_deref(),
                    e.code(),
                    &e.to_string(),
                    json!({}),
                ));
                return;
            }
        };
        match msg.kind() {
            Kind::Response => self.on_host_response(msg),
            Kind::Notification => self.on_host_notification(msg),
            Kind::Request => self.on_host_request(msg),
        }
    }

    fn note_era(&mut self, msg: &Message) {
        // Runs for every request: only `_meta` is parsed.
        let Some(meta) = envelope::params_meta(msg.params()) else {
            return;
        };
        if let Some(meta) = protocol::modern_meta_of(&meta) {
            if self.era.is_none() {
                self.era = Some(Era::Modern);
            }
            if self.client_info.is_none() {
                self.client_info = meta.get(protocol::CLIENT_INFO).cloned();
            }
            self.modern_meta = Some(meta);
            self.advance_child();
        }
    }

    fn on_host_request(&mut self, msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        if method != "initialize" {
            self.note_era(&msg);
        }
        match method.as_str() {
            "initialize" => self.on_host_initialize(msg),
            "ping" => {
                let id = msg.id().expect("request").to_owned();
                self.io.to_host(envelope::result_line(&id, &json!({})));
            }
            "server/discover"
                if !self.child_ready()
                    && self
                        .child
                        .as_ref()
                        .is_none_or(|c| c.phase != ChildPhase::Started) =>
            {
                self.answer_discover_from_facts(msg)
            }
            "tools/list" if !self.ever_ready && !self.child_ready() => {
                self.answer_list_from_facts(msg)
            }
            // During the very first start nothing can have been prepared against older code, so a
            // call (e.g. a one-shot CLI right after `initialize`) waits for the server instead of
            // being refused; after that, calls during a restart are refused, never queued.
            "tools/call"
                if !self.ever_ready
                    && !self.child_ready()
                    && !self.crash_loop
                    && !self.build_failed
                    && self.held.len() < HELD_LIMIT =>
            {
                self.held_calls_since.push_back(Instant::now());
                self.held.push_back(msg);
                self.io.schedule_held_check(FIRST_START_CALL_WAIT);
            }
            "tools/call" => self.on_host_call(msg),
            _ => {
                if self.child_ready() || (method == "server/discover" && self.child.is_some()) {
                    self.route_host_request(msg);
                } else if self.held.len() < HELD_LIMIT && !self.crash_loop {
                    self.held.push_back(msg);
                } else {
                    let id = msg.id().expect("request").to_owned();
                    self.io.to_host(envelope::error_line(
                        Some(&id),
                        codes::SERVER_UNAVAILABLE,
                        "no server is available",
                        json!({"error": "server_unavailable"}),
                    ));
                }
            }
        }
    }

    fn route_host_request(&mut self, msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        if method == "tools/call" {
            return self.on_host_call(msg);
        }
        let Some(child) = &self.child else {
            self.held.push_back(msg);
            return;
        };
        let epoch = child.epoch.clone();
        let host_id = msg.id().expect("request").to_owned();
        if method == "tools/list" {
            let params = msg.params_value();
            if params.get("cursor").is_none() {
                self.host_list_pages.clear();
            }
        }
        let mut msg = msg;
        let id = self.alloc(Pending::Host {
            host_id: host_id.clone(),
            method: method.clone(),
            epoch: epoch.clone(),
            call: None,
        });
        if method == "subscriptions/listen" {
            let params = msg.params_value();
            let tools = params
                .pointer("/notifications/toolsListChanged")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            match self
                .listens
                .iter_mut()
                .find(|l| l.host_id.get() == host_id.get())
            {
                Some(l) => l.child_id = Some(id),
                None => self.listens.push(Listen {
                    host_id: host_id.clone(),
                    params,
                    child_id: Some(id),
                    tools,
                    acknowledged: false,
                }),
            }
        }
        msg.set_id(envelope::numeric_id(id));
        self.io.to_child(&epoch, msg.to_line());
    }

    fn on_host_call(&mut self, mut msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        let (tool, arguments) = envelope::call_target(msg.params());
        // Digest of the arguments exactly as the host sent them (never their values).
        let args_digest =
            hashing::sha256_bytes(arguments.map(|a| a.get()).unwrap_or("null").as_bytes());
        let call_id = host_id.get().to_string();
        let epoch_now = self.current_epoch().map(str::to_string);
        match self.gate.decide_call(&tool, now_ms()) {
            CallDecision::Deny(denial) => {
                let payload = denial.payload();
                let hint = denial.human_hint();
                self.audit_record(audit::AUTHORIZATION_DENIED, epoch_now.as_deref(), json!({
                    "callId": call_id, "tool": tool, "reason": denial.reason.as_str(),
                    "approvedEpoch": denial.approved_epoch, "currentEpoch": denial.current_epoch,
                }));
                self.io.status(&format!(
                    "call denied: {tool} ({}): {hint}",
                    denial.reason.as_str()
                ));
                self.io.to_host(envelope::result_line(
                    &host_id,
                    &self.tool_error(&payload, &hint),
                ));
                self.write_status_file();
            }
            CallDecision::Forward {
                grant_id,
                credential_scopes,
            } => {
                let epoch = match &self.child {
                    Some(c) if !c.stopping => c.epoch.clone(),
                    _ => return, // unreachable: the gate says identity_pending without a child
                };
                // Written and flushed before forwarding; a call that cannot be audited is refused.
                if let Err(e) = self.audit_required(audit::TOOL_CALLED, Some(&epoch), json!({
                    "callId": call_id, "tool": tool, "grant": grant_id, "credentialScopes": credential_scopes,
                    "argumentsDigest": args_digest,
                })) {
                    self.io.status(&format!("call refused: audit log unavailable: {e}"));
                    let payload = json!({"error": "audit_failed", "reason": e, "retry": "fix the audit log, then call again"});
                    self.io.to_host(envelope::result_line(&host_id, &self.tool_error(&payload, "The call was not forwarded because it could not be written to the audit log.")));
                    return;
                }
                let id = self.alloc(Pending::Host {
                    host_id,
                    method: "tools/call".into(),
                    epoch: epoch.clone(),
                    call: Some(CallInfo {
                        tool,
                        call_id,
                        started: Instant::now(),
                    }),
                });
                msg.set_id(envelope::numeric_id(id));
                self.io.to_child(&epoch, msg.to_line());
            }
        }
    }

    fn on_host_initialize(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        let params = msg.params_value();
        self.era = Some(Era::Legacy);
        self.client_info = params.get("clientInfo").cloned();
        self.host_init = Some(params.clone());
        self.host_initialized = false;
        self.audit_record(audit::RUN_STARTED, None, json!({
            "agentRun": self.agent_run, "client": self.client_info, "gating": if self.cfg.gating_off { "off" } else { "on" },
            "label": self.label(), "event": "initialize",
        }));
        match &self.child {
            Some(c) if c.phase == ChildPhase::Started && !c.stopping => {
                let epoch = c.epoch.clone();
                let id = self.alloc(Pending::Handshake {
                    epoch: epoch.clone(),
                    answer: Some(host_id),
                    modern: false,
                });
                self.set_phase(ChildPhase::Handshaking);
                self.io
                    .to_child(&epoch, envelope::request_line(id, "initialize", &params));
            }
            _ => {
                // Cold start (or a re-initialize): answer now from what we know, reconcile later.
                let result = protocol::announce_initialize(
                    &params,
                    self.load_facts().as_ref(),
                    &self.cfg.prep.target.resolved.package_name,
                    &self.cfg.prep.target.resolved.package_version,
                );
                self.negotiated = Some(Negotiated {
                    protocol_version: result["protocolVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    capabilities: result["capabilities"].clone(),
                    from_cache: true,
                });
                self.io.status(&format!(
                    "handshake answered while the server builds (protocol {}); tools appear when it is up",
                    result["protocolVersion"].as_str().unwrap_or("?")
                ));
                self.io.to_host(envelope::result_line(&host_id, &result));
            }
        }
    }

    fn answer_discover_from_facts(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        match protocol::announce_discover(self.load_facts().as_ref()) {
            Some(result) => {
                self.negotiated = Some(Negotiated {
                    protocol_version: protocol::MODERN_VERSION.into(),
                    capabilities: result["capabilities"].clone(),
                    from_cache: true,
                });
                self.io.to_host(envelope::result_line(&host_id, &result));
            }
            None => {
                // No facts yet: a legacy answer makes every client fall back to `initialize`,
                // which works with every server.
                self.io.to_host(envelope::error_line(
                    Some(&host_id),
                    -32601,
                    "server/discover is not available while the server is being built for the first time; use initialize",
                    json!({"error": "server_building"}),
                ));
                if self.era == Some(Era::Modern) && self.negotiated.is_none() {
                    self.era = None;
                }
            }
        }
    }

    fn answer_list_from_facts(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        let tools: Vec<Value> = self
            .load_facts()
            .and_then(|f| f.get("tools").and_then(|t| t.as_array()).cloned())
            .unwrap_or_default();
        let digest = Catalog::from_tools(tools.clone())
            .map(|c| c.digest().to_string())
            .unwrap_or_default();
        self.gate.host_fetched_catalog(&digest);
        let mut result = json!({"tools": tools});
        if self.era == Some(Era::Modern) {
            result["resultType"] = json!("complete");
            result["ttlMs"] = json!(0);
            result["cacheScope"] = json!("private");
        }
        self.io.to_host(envelope::result_line(&host_id, &result));
    }

    fn on_host_notification(&mut self, msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        match method.as_str() {
            "notifications/initialized" => {
                self.host_initialized = true;
                if let Some(c) = &self.child
                    && c.phase == ChildPhase::AwaitingInitialized
                {
                    let epoch = c.epoch.clone();
                    self.io.to_child(&epoch, msg.to_line());
                    self.fetch_catalog(None);
                }
            }
            "notifications/cancelled" => {
                let params = msg.params_value();
                let Some(req) = params.get("requestId") else {
                    return;
                };
                let req_text = req.to_string();
                let found = self.pending.iter().find_map(|(id, p)| match p {
                    Pending::Host { host_id, epoch, .. } if host_id.get() == req_text => {
                        Some((*id, epoch.clone()))
                    }
                    _ => None,
                });
                if let Some((id, epoch)) = found {
                    let mut params = params.clone();
                    params["requestId"] = json!(id);
                    self.listens.retain(|l| l.host_id.get() != req_text);
                    if let Some(Pending::Host {
                        call: Some(call), ..
                    }) = self.pending.get(&id)
                    {
                        crate::status::verbose_line(&format!(
                            "host cancelled {} ({})",
                            call.tool, call.call_id
                        ));
                    }
                    self.io.to_child(
                        &epoch,
                        envelope::notification_line("notifications/cancelled", Some(&params)),
                    );
                }
            }
            _ => {
                if let Some(c) = &self.child
                    && !c.stopping
                    && c.phase != ChildPhase::Started
                {
                    let epoch = c.epoch.clone();
                    self.io.to_child(&epoch, msg.to_line());
                }
            }
        }
    }

    fn on_host_response(&mut self, mut msg: Message) {
        let Some(id) = msg.id().and_then(envelope::parse_numeric_id) else {
            self.io
                .status("host answered a request nobody sent; dropped");
            return;
        };
        let Some((epoch, child_id)) = self.child_requests.remove(&id) else {
            crate::status::verbose_line(&format!(
                "host answered request {id} of a replaced server; dropped"
            ));
            return;
        };
        if self.current_epoch() != Some(epoch.as_str()) {
            return;
        }
        msg.set_id(child_id);
        self.io.to_child(&epoch, msg.to_line());
    }

    // ----- child messages -----------------------------------------------------------------

    fn on_child_line(&mut self, epoch: &str, line: &[u8]) {
        if self.current_epoch() != Some(epoch) {
            return; // late output of a replaced child
        }
        let msg =
            match Message::parse(line) {
                Ok(m) => m,
                Err(_) => {
                    let text = String::from_utf8_lossy(line);
                    let cut: String = text.chars().take(200).collect();
                    self.io.status(&format!(
                    "server wrote non-JSON to stdout: {cut}{} ({} epoch {}; use stderr for logs)",
                    if text.chars().count() > 200 { "…" } else { "" },
                    self.label(),
                    epoch::short(epoch)
                ));
                    return;
                }
            };
        match msg.kind() {
            Kind::Response => self.on_child_response(epoch, msg),
            Kind::Request => {
                let child_id = msg.id().expect("request").to_owned();
                let host_id = self.next_id;
                self.next_id += 1;
                self.child_requests
                    .insert(host_id, (epoch.to_string(), child_id));
                let mut msg = msg;
                msg.set_id(envelope::numeric_id(host_id));
                self.io.to_host(msg.to_line());
            }
            Kind::Notification => self.on_child_notification(msg),
        }
    }

    fn on_child_notification(&mut self, mut msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        let params = msg.params_value();
        if method == "notifications/tools/list_changed" {
            // Same epoch, new catalog: refetch; the host hears about it only if the digest moved.
            if self.child_ready() {
                self.fetch_catalog(None);
            }
            return;
        }
        if let Some(sid) = params.pointer(&format!(
            "/_meta/{}",
            protocol::SUBSCRIPTION_ID.replace('/', "~1")
        )) {
            // Re-tag with the host's listen id; a repeated acknowledgement after a restart is ours.
            let Some(our) = sid.as_u64() else { return };
            let Some(l) = self.listens.iter_mut().find(|l| l.child_id == Some(our)) else {
                return;
            };
            let host_sid: Value = serde_json::from_str(l.host_id.get()).unwrap_or(Value::Null);
            let wants_tools = l.tools;
            let mut params = params.clone();
            params["_meta"][protocol::SUBSCRIPTION_ID] = host_sid.clone();
            msg.set_params(&params);
            if method == "notifications/subscriptions/acknowledged" {
                if l.acknowledged {
                    return;
                }
                l.acknowledged = true;
                self.io.to_host(msg.to_line());
                // A stream opened while the host held an outdated list (e.g. the `[]` answered
                // during a cold build) hears about the current catalog right after its ack.
                let current = self.gate.current_catalog().map(|r| r.digest.clone());
                if wants_tools
                    && current.is_some()
                    && self.gate.host_catalog().map(str::to_string) != current
                {
                    let params = json!({"_meta": {protocol::SUBSCRIPTION_ID: host_sid}});
                    self.io.to_host(envelope::notification_line(
                        "notifications/tools/list_changed",
                        Some(&params),
                    ));
                }
                return;
            }
        }
        if method == "notifications/cancelled"
            && let Some(req) = params.get("requestId")
        {
            // A cancellation names a request its sender issued: the child's own request to the
            // host goes out under the id the host saw.
            let req_text = req.to_string();
            let ours = self
                .child_requests
                .iter()
                .find(|(_, (_, child_id))| child_id.get() == req_text)
                .map(|(host_id, _)| *host_id);
            if let Some(host_facing) = ours {
                self.child_requests.remove(&host_facing);
                let mut params = params.clone();
                params["requestId"] = json!(host_facing);
                msg.set_params(&params);
                self.io.to_host(msg.to_line());
                return;
            }
        }
        if method == "notifications/cancelled"
            && let Some(req) = params.get("requestId").and_then(|r| r.as_u64())
        {
            // The only other use (2026-07-28): the server ends one of the host's requests, a
            // listen stream, which it knows under our id.
            if let Some(Pending::Host { host_id, .. }) = self.pending.remove(&req) {
                let mut params = params.clone();
                params["requestId"] = serde_json::from_str(host_id.get()).unwrap_or(Value::Null);
                self.listens.retain(|l| l.host_id.get() != host_id.get());
                msg.set_params(&params);
            }
        }
        self.io.to_host(msg.to_line());
    }

    fn on_child_response(&mut self, epoch: &str, mut msg: Message) {
        let Some(id) = msg.id().and_then(envelope::parse_numeric_id) else {
            self.io
                .status("server answered a request id it was never sent; dropped");
            return;
        };
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        match p {
            Pending::Host {
                host_id,
                method,
                epoch: e,
                call,
            } => {
                if e != epoch {
                    return;
                }
                if method == "subscriptions/listen" {
                    self.listens.retain(|l| l.host_id.get() != host_id.get());
                }
                if let Some(call) = call {
                    let is_error = msg.is_error() || envelope::result_is_error(msg.result());
                    self.audit_record(
                        audit::TOOL_RESULT,
                        Some(epoch),
                        json!({
                            "callId": call.call_id, "tool": call.tool, "isError": is_error,
                            "durationMs": call.started.elapsed().as_millis() as u64,
                        }),
                    );
                }
                if method == "tools/list" {
                    self.observe_host_list(&msg);
                }
                if method == "server/discover" && !msg.is_error() {
                    let mut result = msg.result_value();
                    protocol::advertise_list_changed(&mut result);
                    self.remember_discover(&result);
                    // What the host now holds: a later server must keep to it.
                    let version = self
                        .modern_meta
                        .as_ref()
                        .and_then(|m| m.get(protocol::PROTOCOL_VERSION))
                        .and_then(|v| v.as_str())
                        .unwrap_or(protocol::MODERN_VERSION)
                        .to_string();
                    self.negotiated = Some(Negotiated {
                        protocol_version: version,
                        capabilities: result.get("capabilities").cloned().unwrap_or(json!({})),
                        from_cache: false,
                    });
                    msg.set_result(&result);
                }
                msg.set_id(host_id);
                self.io.to_host(msg.to_line());
            }
            Pending::Handshake {
                epoch: e,
                answer,
                modern,
            } => {
                if e != epoch {
                    return;
                }
                self.on_handshake_result(epoch, msg, answer, modern);
            }
            Pending::CatalogPage { epoch: e } => {
                if e == epoch {
                    self.on_catalog_page(epoch, &msg);
                }
            }
        }
    }

    fn observe_host_list(&mut self, msg: &Message) {
        if msg.is_error() {
            return;
        }
        let result = msg.result_value();
        if let Some(tools) = result.get("tools").and_then(|t| t.as_array()) {
            self.host_list_pages.extend(tools.iter().cloned());
        }
        if result.get("nextCursor").and_then(|c| c.as_str()).is_none() {
            let pages = std::mem::take(&mut self.host_list_pages);
            if let Ok(c) = Catalog::from_tools(pages) {
                self.gate.host_fetched_catalog(c.digest());
                self.write_status_file();
            }
        }
    }

    fn on_handshake_result(
        &mut self,
        epoch: &str,
        msg: Message,
        answer: Option<RawId>,
        modern: bool,
    ) {
        if msg.is_error() {
            self.io.status(&format!(
                "server refused the handshake: {}",
                String::from_utf8_lossy(&msg.to_line()).trim()
            ));
            if let Some(h) = answer {
                let mut m = msg;
                m.set_id(h);
                self.io.to_host(m.to_line());
            }
            return;
        }
        let mut result = msg.result_value();
        let version = result
            .get("protocolVersion")
            .and_then(|v| v.as_str())
            .unwrap_or(protocol::MODERN_VERSION)
            .to_string();
        let caps = result.get("capabilities").cloned().unwrap_or(json!({}));
        if modern {
            self.remember_discover(&result);
        } else {
            self.remember_initialize(&result);
        }
        match (&self.negotiated, answer) {
            (_, Some(host_id)) => {
                protocol::advertise_list_changed(&mut result);
                self.negotiated = Some(Negotiated {
                    protocol_version: version,
                    capabilities: result["capabilities"].clone(),
                    from_cache: false,
                });
                self.io.to_host(envelope::result_line(&host_id, &result));
            }
            (Some(n), None) => {
                if let Some(why) = protocol::incompatibility(
                    &n.protocol_version,
                    &n.capabilities,
                    &version,
                    &caps,
                    modern,
                    &result,
                ) {
                    let origin = if n.from_cache {
                        "announced while building"
                    } else {
                        "negotiated"
                    };
                    self.close_connection(&format!(
                        "the new server {why} ({origin}: {}); the host must reconnect",
                        n.protocol_version
                    ));
                    return;
                }
                // The real server confirmed what was announced: now it is what was negotiated.
                if let Some(n) = &mut self.negotiated {
                    n.from_cache = false;
                }
            }
            (None, None) => {
                if !modern {
                    self.negotiated = Some(Negotiated {
                        protocol_version: version,
                        capabilities: caps,
                        from_cache: false,
                    });
                }
            }
        }
        if modern {
            self.reopen_listens(epoch);
            self.fetch_catalog(None);
        } else if self.host_initialized {
            self.io.to_child(
                epoch,
                envelope::notification_line("notifications/initialized", None),
            );
            self.fetch_catalog(None);
        } else {
            self.set_phase(ChildPhase::AwaitingInitialized);
        }
    }

    fn reopen_listens(&mut self, epoch: &str) {
        let listens: Vec<(String, Value)> = self
            .listens
            .iter()
            .filter(|l| l.child_id.is_none())
            .map(|l| (l.host_id.get().to_string(), l.params.clone()))
            .collect();
        for (host_id_text, params) in listens {
            let host_id = serde_json::value::RawValue::from_string(host_id_text.clone())
                .expect("valid raw id");
            let id = self.alloc(Pending::Host {
                host_id,
                method: "subscriptions/listen".into(),
                epoch: epoch.to_string(),
                call: None,
            });
            if let Some(l) = self
                .listens
                .iter_mut()
                .find(|l| l.host_id.get() == host_id_text)
            {
                l.child_id = Some(id);
            }
            self.io.to_child(
                epoch,
                envelope::request_line(id, "subscriptions/listen", &params),
            );
        }
    }

    fn on_child_oversize(&mut self, epoch: &str, prefix: &[u8], len: usize) {
        self.io.status(&format!(
            "server wrote a {len}-byte line to stdout, over the limit; dropped ({} epoch {})",
            self.label(),
            epoch::short(epoch)
        ));
        // If it was an answer, its requester must not hang.
        if let Some(id) = protocol::recover_id(prefix).and_then(|r| envelope::parse_numeric_id(&r))
            && let Some(Pending::Host { host_id, call, .. }) = self.pending.remove(&id)
        {
            let payload = json!({"error": "message_too_large", "bytes": len});
            if call.is_some() {
                self.io.to_host(envelope::result_line(
                    &host_id,
                    &self.tool_error(
                        &payload,
                        "The server's answer was larger than the line limit and was dropped.",
                    ),
                ));
            } else {
                self.io.to_host(envelope::error_line(
                    Some(&host_id),
                    codes::SERVER_UNAVAILABLE,
                    "the server's answer was too large",
                    payload,
                ));
            }
        }
    }

    // ----- connection end -----------------------------------------------------------------

    fn close_connection(&mut self, why: &str) {
        if self.exit_code.is_some() {
            return;
        }
        let new_epoch = None;
        if let Some(c) = &self.child {
            let e = c.epoch.clone();
            self.answer_in_flight(&e, new_epoch, "replaced", None);
        }
        self.io.status(&format!("connection closed: {why}"));
        self.fail_held("the connection is closing");
        self.io.close_host();
        self.shutdown_with(why, crate::exit_codes::CONNECTION_CLOSED);
    }

    pub fn shutdown(&mut self, why: &str) {
        self.shutdown_with(why, crate::exit_codes::OK);
    }

    fn shutdown_with(&mut self, why: &str, code: i32) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        if let Some(c) = self.child.take() {
            let e = c.epoch.clone();
            self.answer_in_flight(&e, None, "exited", Some("supervisor shutting down"));
            self.io.stop(&e, c.worker, Duration::from_millis(500));
        }
        self.gate.end_run();
        self.audit_record(
            audit::RUN_ENDED,
            None,
            json!({"reason": why, "agentRun": self.agent_run}),
        );
        self.exit_code = Some(code);
        self.write_status_file();
    }

    // ----- control socket -----------------------------------------------------------------

    fn on_control(&mut self, request: &Value) -> Value {
        let op = request.get("op").and_then(|o| o.as_str()).unwrap_or("");
        let answer = match op {
            "status" => Ok(self.status_json()),
            "restart" => match self.latest.clone() {
                Some(record) if self.child.is_some() => {
                    self.crash_loop = false;
                    self.begin_replace(record, "cargo mcp-dev restart");
                    Ok(json!({"restarting": true}))
                }
                Some(record) => {
                    self.crash_loop = false;
                    self.spawn_child(record, None);
                    Ok(json!({"started": true}))
                }
                None => Err("no successful build yet".to_string()),
            },
            "approve" => self.control_approve(request),
            "revoke" => {
                let target = match request.get("grant").and_then(|g| g.as_str()) {
                    Some("all") | None => RevokeTarget::All,
                    Some(id) => RevokeTarget::Id(id.to_string()),
                };
                let revoked = self.gate.revoke(target);
                for g in &revoked {
                    self.audit_record(
                        audit::APPROVAL_REVOKED,
                        Some(&g.execution_epoch.clone()),
                        json!({"grantId": g.id}),
                    );
                }
                self.write_status_file();
                Ok(json!({"revoked": revoked}))
            }
            other => Err(format!("unknown control operation `{other}`")),
        };
        match answer {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": e}),
        }
    }

    fn control_approve(&mut self, request: &Value) -> Result<Value, String> {
        let strings = |key: &str| -> std::collections::BTreeSet<String> {
            request
                .get(key)
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let epoch = request
            .get("epoch")
            .and_then(|e| e.as_str())
            .ok_or("approve needs the epoch that was reviewed")?
            .to_string();
        let req = ApprovalRequest {
            epoch: epoch.clone(),
            tools: strings("tools"),
            credential_scopes: strings("credentialScopes"),
        };
        let grant = self
            .gate
            .approve(req, now_ms(), ulid::Ulid::generate().to_string())
            .map_err(|e| e.to_string())?;
        let g = serde_json::to_value(&grant).expect("grant serializes");
        if let Some(c) = &self.child {
            self.approved_baseline = Some((
                c.epoch.clone(),
                c.record.clone(),
                self.catalog.catalog().cloned(),
            ));
        }
        self.audit_record(
            audit::APPROVAL_GRANTED,
            Some(&epoch),
            json!({"grant": g, "via": "control socket"}),
        );
        self.io.status(&format!(
            "approved: {} for epoch {} (grant {}, expires {})",
            grant
                .tool_scope
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            epoch,
            grant.id,
            g["expiresWhen"].as_str().unwrap_or("?")
        ));
        self.write_status_file();
        Ok(json!({"grant": g}))
    }

    /// What changed between the last approved epoch and now (for `approve`'s review).
    fn since_last_approval(&self) -> Value {
        let (Some((epoch, record, catalog)), Some(child)) = (&self.approved_baseline, &self.child)
        else {
            return Value::Null;
        };
        if *epoch == child.epoch {
            return Value::Null;
        }
        let identity = crate::fingerprint::component_list(&crate::fingerprint::changed_components(
            record,
            &child.record,
        ));
        let catalog_lines = match (catalog, self.catalog.catalog()) {
            (Some(old), Some(new)) => crate::catalog::diff(old, new).render_human(),
            _ => Vec::new(),
        };
        json!({"epoch": epoch, "identity": identity, "catalog": catalog_lines})
    }

    fn current_epoch(&self) -> Option<&str> {
        self.child
            .as_ref()
            .filter(|c| !c.stopping)
            .map(|c| c.epoch.as_str())
    }

    /// The state `status` shows and the status file holds (names and digests only, never values).
    pub fn status_json(&self) -> Value {
        let (pending_tools, pending_scopes) = self.gate.pending_requests();
        let catalog = self.catalog.current();
        json!({
            "label": self.label(),
            "agentRun": self.agent_run,
            "supervisorPid": std::process::id(),
            "state": match self.gate.phase() {
                approval::Phase::IdentityPending => "identity-pending",
                approval::Phase::CatalogReady => "catalog-ready",
                approval::Phase::Ready => "ready",
            },
            "restart": self.cfg.restart.as_str(),
            "gating": if self.cfg.gating_off { "off" } else { "on" },
            "era": self.era.map(|e| e.as_str()),
            "server": self.child.as_ref().map(|c| json!({
                "pid": c.worker.pid, "epoch": c.epoch, "identityDigest": c.record.identity_digest,
                "executableSha256": c.record.executable.sha256, "phase": format!("{:?}", c.phase),
            })),
            "latestBuild": self.latest.as_ref().map(|r| &r.identity_digest),
            "pendingRestart": self.pending_apply,
            "lastBuild": self.last_build,
            "catalog": catalog.map(|r| json!({"revision": r.number, "digest": r.digest})),
            "catalogTools": self.catalog.catalog().map(|c| c.names().map(str::to_string).collect::<Vec<_>>()),
            "hostCatalog": self.gate.host_catalog(),
            "grants": self.gate.grants(),
            "recentDenials": self.gate.recent_denials().iter().rev().take(10).map(|d| json!({
                "at": d.at, "tool": d.denial.tool, "reason": d.denial.reason.as_str(),
                "approvedEpoch": d.denial.approved_epoch, "currentEpoch": d.denial.current_epoch,
            })).collect::<Vec<_>>(),
            "pendingApproval": {"tools": pending_tools, "credentialScopes": pending_scopes},
            "policy": {
                "credentialScopes": self.gate.policy().credential_scopes.keys().collect::<Vec<_>>(),
                "credentialScopeEnv": self.gate.policy().credential_scopes.iter().map(|(k, v)| (k.clone(), json!(v.env))).collect::<serde_json::Map<String, Value>>(),
            },
            "toolPolicy": self.catalog.catalog().map(|c| c.names().map(|t| (t.to_string(), json!({
                "gated": self.gate.policy().is_gated(t),
                "mode": match self.gate.policy().mode_for(t) { approval::ApprovalMode::PerCall => "per-call", approval::ApprovalMode::PerEpoch => "per-epoch" },
                "credentialScopes": self.gate.policy().scopes_for(t),
            }))).collect::<serde_json::Map<String, Value>>()),
            "sinceLastApproval": self.since_last_approval(),
            "catalogDetails": self.catalog.catalog().map(|c| c.tools_json()),
            "auditLog": self.audit_path,
            "socket": self.cfg.socket_path,
            "updatedAt": now_rfc3339(),
        })
    }

    fn write_status_file(&self) {
        let path = &self.cfg.status_file;
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(
            &tmp,
            serde_json::to_string_pretty(&self.status_json()).expect("json") + "\n",
        )
        .is_ok()
        {
            let _ = std::fs::rename(&tmp, path);
        }
    }

    fn write_launch_record(&self, launch: &LaunchRecord) {
        let dir = &self.cfg.launch_dir;
        let _ = std::fs::create_dir_all(dir);
        let text = serde_json::to_string_pretty(launch).expect("json") + "\n";
        let _ = std::fs::write(dir.join(format!("{}.json", launch.epoch)), &text);
        let _ = std::fs::write(dir.join("latest.json"), &text);
    }

    // ----- facts for cold handshakes ------------------------------------------------------

    fn load_facts(&self) -> Option<Value> {
        let text = std::fs::read_to_string(&self.cfg.facts_file).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn save_facts_value(&self, facts: &Value) {
        if let Some(dir) = self.cfg.facts_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = self
            .cfg
            .facts_file
            .with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, facts.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, &self.cfg.facts_file);
        }
    }

    fn save_facts(&self, tools: Option<&Vec<Value>>) {
        let mut facts = self.load_facts().unwrap_or(json!({}));
        if let Some(t) = tools {
            facts["tools"] = json!(t);
        }
        self.save_facts_value(&facts);
    }

    fn remember_initialize(&self, result: &Value) {
        let mut facts = self.load_facts().unwrap_or(json!({}));
        facts["initialize"] = result.clone();
        self.save_facts_value(&facts);
    }

    fn remember_discover(&self, result: &Value) {
        let mut facts = self.load_facts().unwrap_or(json!({}));
        facts["discover"] = result.clone();
        self.save_facts_value(&facts);
    }

    // ----- audit --------------------------------------------------------------------------

    fn audit_record(&mut self, kind: &str, epoch: Option<&str>, data: Value) {
        if let Err(e) = self.audit_required(kind, epoch, data) {
            self.io.status(&format!("warning: audit log: {e}"));
        }
    }

    fn audit_required(
        &mut self,
        kind: &str,
        epoch: Option<&str>,
        data: Value,
    ) -> Result<(), String> {
        match &mut self.audit {
            Some(log) => log
                .append(kind, &self.agent_run, epoch, data)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Err("no audit log is open".into()),
        }
    }
}
