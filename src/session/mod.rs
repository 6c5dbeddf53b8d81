//! The `run` session core: one owner of all state, events in, effects out.
//!
//! Owns: the state machine of one `cargo mcp-dev run` (builds, epochs, the host connection's
//! protocol facts, held and in-flight requests, what the host was shown) and every decision
//! about a message: forward, hold, answer, refuse. Whether a `tools/call` is forwarded is
//! decided by [`crate::policy::approval::Gate`] alone; the session routes, maps ids and keeps the host's
//! view of the protocol coherent across restarts.
//!
//! Must not touch: files, sockets, processes, the clock, random ids or the terminal.
//! [`Session::handle`] takes an event and the step's time and returns [`Effect`]s as data; the
//! shell performs them (the real shell is `face/commands/run/`; the test shell is
//! `session::testing`) and reports results as events (a spawned pid, a failed audit write).
//! Ids come from an [`IdMint`] the shell seeds once. `session::tests::the_core_imports_no_io`
//! checks mechanically that no file here names `std::fs`, `std::process`, `std::os`,
//! `std::net`, `SystemTime`, `Instant`, a terminal crate or the stderr writer. The map, the
//! state diagrams and the routing table are in docs/ARCHITECTURE.md.
//!
//! Rooms (each file says what it owns):
//! - [`effect`]: effects, the step's clock, ids (status lines are `crate::screen::status_lines`
//!   events, worded there);
//! - [`state`]: the state types (lifecycle, builds, a server's phase and tools, open requests,
//!   the host connection); `server`: the server slot and every phase transition;
//! - `route`: the one routing table (forward, hold, answer, answer from the record);
//! - `lifecycle`: builds, spawning, replacing, exits, crash loop, shutdown;
//! - `first_contact`: requests that arrive before a server is up (held requests, recorded
//!   catalog, build failure at start); `initialize`: the host's `initialize`, answered once and
//!   only by a real server; `handshake`: our handshake and a server that cannot serve;
//! - `host`: messages from the host; `child`: messages from the server;
//! - `catalog_fetch`: fetching and publishing catalogs, what the host connection was shown (kept
//!   in the gate's `HostView`);
//! - `router`: `tools/call` gating and forwarding; `inflight`: answers for requests whose
//!   server went away;
//! - `control`: `approve`/`status`/`restart`/`revoke`; `snapshot`: the status document;
//! - `approvals`: the approval channels, and prompts in the host (`elicitation/create`) while
//!   a gated call waits; `approvals_modern`: the same on a 2026-07-28 connection
//!   (`input_required`, answered by the host's retry).
mod approvals;
mod approvals_modern;
mod catalog_fetch;
mod child;
pub mod control;
pub mod effect;
mod first_contact;
mod handshake;
mod host;
mod inflight;
mod initialize;
mod lifecycle;
pub mod protocol;
mod route;
mod router;
mod server;
pub mod snapshot;
pub mod state;
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_approvals;
#[cfg(test)]
mod tests_approvals_modern;
#[cfg(test)]
mod tests_approvals_red_team;
#[cfg(test)]
mod tests_catalog_failures;
#[cfg(test)]
mod tests_catalog_props;
#[cfg(test)]
mod tests_catalog_red_team;
#[cfg(test)]
mod tests_catalog_refetch;
#[cfg(test)]
mod tests_catalog_unknown;
#[cfg(test)]
mod tests_catalog_unreadable;
#[cfg(test)]
mod tests_core_red_team;
#[cfg(test)]
mod tests_early_build;
#[cfg(test)]
mod tests_first_contact_fuzz;
#[cfg(test)]
mod tests_first_contact_props;
#[cfg(test)]
mod tests_first_contact_red_team;
#[cfg(test)]
mod tests_forwarding;
#[cfg(test)]
mod tests_handshake;
#[cfg(test)]
mod tests_listen;
use std::time::Duration;

use serde_json::{Value, json};

use crate::audit::{self, RecordData};
use crate::identity::fingerprint::IdentityRecord;
use crate::policy::approval::{self, Gate, ServedCatalog, Serving};
use crate::process::supervisor::ExitInfo;
use crate::wire::proxy::envelope;
use protocol::Era;
use route::Route;
use server::Server;
use state::*;

pub use crate::screen::status_lines::StatusEvent;
pub use effect::{Effect, IdMint, Now, Outbox, Step, Ticket};

pub mod codes;

/// Timers the session asks its shell for; each comes back as [`Event::Timer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Some held request reached its deadline.
    HeldDeadline,
    /// Time to start the server again after a crash.
    Restart,
    /// The warm-start wait for the server's own `initialize`/`server/discover` answer is over.
    HandshakeWait,
    /// Some approval prompt in the host reached its deadline.
    ApprovalDeadline,
    /// Some server's handshake or catalog page reached its deadline.
    ServerDeadline,
}

/// How a build ended, as the session needs it (the shell renders the status line).
#[derive(Debug, Clone)]
pub enum BuildResult {
    /// cargo could not run, or identity could not be captured.
    Error(String),
    /// The compiler refused the sources.
    Failed {
        line: String,
        errors: usize,
        /// `file:line:col` of the first error, when cargo printed one.
        first_location: Option<String>,
        /// The first error's message (`error[E0425]: cannot find value …`).
        first_error: Option<String>,
        /// The last successfully built identity of this label and profile.
        last_good: Option<Box<IdentityRecord>>,
    },
    /// A build produced an identity (changed or not).
    Complete {
        line: String,
        record: Box<IdentityRecord>,
        /// Names of the identity components that changed (empty: unchanged).
        changed: Vec<String>,
        warnings: Vec<String>,
    },
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
    BuildFinished(Box<BuildResult>),
    /// A burst of changes began (the watcher's leading edge): a build may start at once.
    SourcesChanging,
    /// A burst settled (no change for the debounce window): its paths, as shown to humans
    /// (relative to the workspace), and whether a change came after its leading edge.
    SourcesChanged {
        paths: Vec<String>,
        changed_after_leading_edge: bool,
    },
    Timer(Timer),
    /// A request from the control socket, parsed there; answered with
    /// [`Effect::AnswerControl`] carrying its ticket.
    Control {
        request: ControlRequest,
        ticket: Ticket,
    },
    Shutdown(String),
    /// The server asked for with [`Effect::Spawn`] runs.
    Spawned {
        epoch: String,
        pid: u32,
    },
    /// It could not be started (why, in one sentence); lines written to it were dropped.
    SpawnFailed {
        epoch: String,
        why: String,
    },
    /// A step's audit records could not be written: its forwarded `tools/call` lines (our
    /// ids `calls`) were dropped and never reached a server.
    AuditFailed {
        why: String,
        calls: Vec<u64>,
    },
}

/// Restart mode (`--restart`): what a new build does to the running server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    Supervise,
    Disconnect,
    Manual,
}

impl Restart {
    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Supervise => "supervise",
            Restart::Disconnect => "disconnect",
            Restart::Manual => "manual",
        }
    }
}

/// What `--fallback` asks for when the first build fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep answering with the compiler error until a build succeeds.
    None,
    /// Run the last successfully built identity from the store.
    LastGood,
}

/// Settings fixed for the session (plain values: no CLI or cargo types).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub label: String,
    pub package_name: String,
    pub package_version: String,
    pub restart: Restart,
    pub fallback: Fallback,
    pub grace: Duration,
    pub gating_off: bool,
    /// How long requests wait for the first server of the session.
    pub first_start_budget: Duration,
    /// How long `initialize` waits for the server's own answer before it is given the answer
    /// a real server of this package gave to the same version (when one is recorded).
    pub handshake_wait: Duration,
    /// How long a host's `server/discover` probe waits for a real server's answer before it is
    /// told to use `initialize`.
    pub discover_wait: Duration,
    /// How long calls wait for the next server during a restart.
    pub restart_hold: Duration,
    /// The binary was built before (an identity is recorded): a warm start is likely.
    pub warm: bool,
    /// What real servers of this package said before (the shell loads it).
    pub recorded: RecordedFacts,
    pub supervisor_pid: u32,
    pub audit_path: String,
    pub socket_path: Option<String>,
    /// The configured approval channels (`None`: both when the host declared elicitation,
    /// else terminal). See [`Session::approval_channels`].
    pub approval_channels: Option<std::collections::BTreeSet<approval::Channel>>,
    /// How long a gated call waits for the host's answer to its approval prompt.
    pub approval_timeout: Duration,
    /// How many approval prompts may be open in the host at once.
    pub max_open_prompts: usize,
}

impl SessionConfig {
    /// Defaults for everything but the names (tests and the shell start from here).
    pub fn new(label: &str, package_name: &str, package_version: &str) -> SessionConfig {
        SessionConfig {
            label: label.into(),
            package_name: package_name.into(),
            package_version: package_version.into(),
            restart: Restart::Supervise,
            fallback: Fallback::None,
            grace: Duration::from_millis(1000),
            gating_off: false,
            first_start_budget: DEFAULT_FIRST_START_BUDGET,
            handshake_wait: DEFAULT_HANDSHAKE_WAIT,
            discover_wait: DEFAULT_DISCOVER_WAIT,
            restart_hold: DEFAULT_RESTART_HOLD,
            warm: false,
            recorded: RecordedFacts::default(),
            supervisor_pid: 0,
            audit_path: String::new(),
            socket_path: None,
            approval_channels: None,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            max_open_prompts: DEFAULT_MAX_OPEN_PROMPTS,
        }
    }
}

pub use control::ControlRequest;
pub use state::{
    DEFAULT_APPROVAL_TIMEOUT, DEFAULT_DISCOVER_WAIT, DEFAULT_FIRST_START_BUDGET,
    DEFAULT_HANDSHAKE_WAIT, DEFAULT_MAX_OPEN_PROMPTS, DEFAULT_RESTART_HOLD,
};

pub struct Session {
    /// The step being handled: its effects, its time, where ids come from and the armed
    /// timers (mod.rs, effect.rs).
    step: Step,
    /// Fixed for the session.
    cfg: SessionConfig,
    // ----- each owned by one room ----------------------------------------------------------
    /// Where the session is in its life (lifecycle.rs).
    lifecycle: Lifecycle,
    /// The builds room's state (lifecycle.rs).
    build: BuildState,
    /// The one server slot: running, being replaced, restarting, or idle (server.rs owns its
    /// transitions; a running server's phase, tools and open requests go with it).
    server: Server,
    /// What happened to servers before (crashes, rebuilds to start, the last one started).
    restarts: Restarts,
    /// The one host connection: what it negotiated, its held requests, streams and the
    /// server's requests open at it (host.rs, first_contact.rs, initialize.rs).
    host: HostConnection,
    /// The catalog room's state (catalog_fetch.rs).
    catalogs: Catalogs,
    /// The approval rooms' state, the gate and what the host was shown among it (router.rs,
    /// approvals*.rs, control.rs).
    approvals: Approvals,
    /// What real servers of this package said, kept between runs (handshake.rs,
    /// catalog_fetch.rs).
    recorded: RecordedFacts,
    /// Set once the session decided to end; the shell exits with it.
    exit_code: Option<i32>,
}

/// What the gate reads of the server that runs now: its epoch (the server slot) and, once this
/// server has given one, its catalog (the catalog history's current revision). The gate keeps
/// none of it, so these facts live in one place each. A function of the two rooms, not of
/// `&Session`, so a caller can hand it to the gate while the approvals room is borrowed mutably.
fn serving<'a>(server: &'a Server, catalogs: &'a Catalogs) -> Serving<'a> {
    let Some(child) = server.child() else {
        return Serving::NONE;
    };
    let catalog = if child.phase.listed().no_catalog() {
        None
    } else {
        let history = &catalogs.history;
        debug_assert!(
            history.current().is_some(),
            "a server with a catalog, none in history"
        );
        history
            .current()
            .zip(history.catalog())
            .map(|(revision, catalog)| ServedCatalog {
                revision,
                tools: catalog.tool_digests(),
            })
    };
    Serving {
        epoch: Some(&child.epoch),
        catalog,
    }
}

impl Session {
    /// A session whose ids come from `ids`, created at `now`.
    pub fn new(cfg: SessionConfig, policy: approval::Policy, mut ids: IdMint, now: Now) -> Self {
        let agent_run = AgentRunId::new(ids.mint(now));
        // The gate holds the run's id (grants are bound to it); the session reads it there.
        let gate = Gate::new(policy, agent_run, cfg.label.clone());
        let recorded = cfg.recorded.clone();
        Session {
            step: Step {
                out: Outbox::default(),
                now,
                ids,
                next_id: 1,
                armed: ArmedTimers::default(),
            },
            cfg,
            lifecycle: Lifecycle::FirstStart,
            build: BuildState::default(),
            restarts: Restarts::default(),
            catalogs: Catalogs::default(),
            approvals: Approvals::new(gate),
            server: Server::Idle,
            host: HostConnection::default(),
            exit_code: None,
            recorded,
        }
    }

    pub fn label(&self) -> &str {
        &self.cfg.label
    }

    pub fn agent_run(&self) -> &str {
        self.approvals.gate.agent_run()
    }

    /// Set once the session decided to end; the shell exits with it.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }

    /// The lifecycle state (tests and the status document).
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// Starts the run: audit `run_started`, first build.
    pub fn start(&mut self, now: Now) -> Vec<Effect> {
        self.step.now = now;
        let gating = if self.cfg.gating_off { "off" } else { "on" };
        self.audit_record(
            audit::RUN_STARTED,
            None,
            json!({"agentRun": self.agent_run(), "client": Value::Null, "gating": gating, "label": self.label(),
                   "restart": self.cfg.restart.as_str(), "pid": self.cfg.supervisor_pid}),
        );
        if self.cfg.gating_off {
            self.audit_record(
                audit::GATING_DISABLED,
                None,
                json!({"reason": "--no-gating or gate = \"off\""}),
            );
            self.step.out.status(StatusEvent::GatingOff);
        }
        self.request_build();
        self.publish();
        self.step.out.take()
    }

    /// Handles events that arrived together (host or server lines read at once) as one step:
    /// their audit records go out in one write (group commit, see [`effect`]). Stops at the
    /// first event that ends the session.
    pub fn handle_batch(&mut self, events: Vec<Event>, now: Now) -> Vec<Effect> {
        self.step.now = now;
        for event in events {
            self.on_event(event);
            if self.exit_code.is_some() {
                break;
            }
        }
        self.step.out.take()
    }

    /// Handles one event at `now` (one step): the effects for the shell, in order.
    pub fn handle(&mut self, event: Event, now: Now) -> Vec<Effect> {
        self.step.now = now;
        self.on_event(event);
        self.step.out.take()
    }

    /// The effects a shell performed, emptied, for the next step to fill (optional: saves an
    /// allocation per step).
    pub fn give_back(&mut self, spent: Vec<Effect>) {
        self.step.out.give_back(spent);
    }

    /// A step's records could not be written: its calls never reached a server (the shell
    /// dropped them); each is answered as a call that could not be audited.
    fn audit_failed(&mut self, why: &str, calls: Vec<u64>) {
        if calls.is_empty() {
            self.step.out.status(StatusEvent::AuditWarning {
                why: why.to_string(),
            });
            return;
        }
        self.step
            .out
            .status(StatusEvent::CallsRefusedAuditUnavailable {
                calls: calls.len(),
                why: why.to_string(),
            });
        for id in calls {
            if let Some(OpenRequest::Host {
                host_id,
                call: Some(_),
                ..
            }) = self.take_request(id)
            {
                let payload = json!({"error": "audit_failed", "reason": why, "retry": "fix the audit log, then call again"});
                let result = self.tool_error(
                    &payload,
                    "The call was not forwarded because it could not be written to the audit log.",
                );
                self.step
                    .out
                    .to_host(envelope::result_line(&host_id, &result));
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::HostLine(line) => self.on_host_line(line),
            Event::HostOversize { prefix, len } => self.on_host_oversize(&prefix, len),
            Event::HostEof => self.shutdown("the host closed stdin"),
            Event::ChildLine { epoch, line } => self.on_child_line(&epoch, line),
            Event::ChildOversize { epoch, prefix, len } => {
                self.on_child_oversize(&epoch, &prefix, len)
            }
            Event::ChildExited { epoch, exit } => self.on_child_exited(&epoch, exit),
            Event::ChildStopped { epoch } => self.on_child_stopped(&epoch),
            Event::BuildFinished(result) => self.on_build_finished(*result),
            Event::SourcesChanging => self.on_sources_changing(),
            Event::SourcesChanged {
                paths,
                changed_after_leading_edge,
            } => self.on_sources_changed(paths, changed_after_leading_edge),
            Event::Timer(Timer::HeldDeadline) => self.expire_held(),
            Event::Timer(Timer::HandshakeWait) => self.judge_initialize(),
            Event::Timer(Timer::ServerDeadline) => self.server_deadline_over(),
            Event::Timer(Timer::Restart) => self.restart_due(),
            Event::Timer(Timer::ApprovalDeadline) => self.expire_prompts(),
            Event::Control { request, ticket } => {
                if let Some(answer) = self.on_control(request, ticket) {
                    self.step.out.answer_control(ticket, answer);
                }
            }
            Event::Shutdown(reason) => self.shutdown(&reason),
            Event::Spawned { epoch, pid } => self.on_spawned(&epoch, pid),
            Event::SpawnFailed { epoch, why } => self.on_spawn_failed(&epoch, &why),
            Event::AuditFailed { why, calls } => self.audit_failed(&why, calls),
        }
    }

    // ----- small shared helpers -------------------------------------------------------------

    fn now(&self) -> u64 {
        self.step.now.mono_ms
    }

    /// A new unique id (epochs, grants, prompts).
    fn mint_id(&mut self) -> String {
        self.step.ids.mint(self.step.now)
    }

    /// Our id for a request to the running server, kept in its open requests until answered
    /// (none runs: the id is spent, the entry dropped).
    fn alloc(&mut self, p: OpenRequest) -> u64 {
        let id = self.step.next_id;
        self.step.next_id += 1;
        if let Some(c) = self.server.child_mut() {
            c.requests.insert(id, p);
        }
        id
    }

    /// The running server's open request `id`.
    fn request(&self, id: u64) -> Option<&OpenRequest> {
        self.server.child()?.requests.get(&id)
    }

    /// The running server's open request `id`, taken: it is answered now.
    fn take_request(&mut self, id: u64) -> Option<OpenRequest> {
        self.server.child_mut()?.requests.remove(&id)
    }

    /// The running server's open requests, as a table (empty: no server runs).
    #[cfg(test)]
    pub(super) fn open_requests(&self) -> &Requests {
        static NONE: std::sync::OnceLock<Requests> = std::sync::OnceLock::new();
        match self.server.child() {
            Some(c) => &c.requests,
            None => NONE.get_or_init(Requests::default),
        }
    }

    /// The running server's open requests (none: no server runs).
    fn requests(&self) -> impl Iterator<Item = (&u64, &OpenRequest)> {
        self.server
            .child()
            .into_iter()
            .flat_map(|c| c.requests.iter())
    }

    fn current_epoch(&self) -> Option<&str> {
        self.server.child().map(|c| c.epoch.as_str())
    }

    /// The server is up and no fetch of its tools is in flight.
    fn child_ready(&self) -> bool {
        self.server.child().is_some_and(|c| c.phase.is_ready())
    }

    /// The current server's phase, if one runs.
    fn child_phase(&self) -> Option<&ChildPhase> {
        self.server.phase()
    }

    fn era(&self) -> Option<Era> {
        self.host.era
    }

    fn publish(&mut self) {
        let snapshot = self.status_json();
        self.step.out.publish_status(snapshot);
    }

    /// One audit record of this step (written before the step's lines; see [`effect`]).
    fn audit_record(
        &mut self,
        kind: &'static str,
        epoch: Option<&str>,
        data: impl Into<RecordData>,
    ) {
        self.step.out.audit(kind, epoch, data.into());
    }
}
