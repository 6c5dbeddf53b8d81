//! The test shell: runs the session core in memory against a scripted host and a fake child.
//!
//! Owns: [`FakeIo`] (records every effect; clock and ids are counters) and [`Harness`] (drives
//! events, plays a well-behaved MCP server that answers what it is sent). Real processes and
//! real SDK clients are exercised by `tests/` and `tests/e2e/`; this is the fast, exhaustive
//! layer next to them.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
pub use crate::face::control_socket::ControlReply;
use crate::identity::epoch::LaunchRecord;
use crate::identity::fingerprint::{IdentityRecord, identity_record};
use crate::policy::approval::{Gating, Policy};

/// A `tool_called` record: its callId and epoch.
pub type Intent = (Value, Option<String>);

/// Every effect the session asked for, in order where order matters: the test shell performs
/// a step's effects the way `commands/run.rs` does (its audit records before its lines) and
/// feeds results back as events (a spawned pid, a failed spawn or audit write).
#[derive(Default)]
pub struct FakeIo {
    pub to_host: Vec<Value>,
    pub to_child: VecDeque<(String, Value)>,
    pub builds_started: usize,
    pub builds_set_aside: usize,
    /// Lines sent as droppable (`notify_*`), as JSON: host-bound and server-bound.
    pub droppable: Vec<Value>,
    pub spawned: Vec<(String, u32)>,
    pub stopped: Vec<String>,
    /// The grace each stop was given (same order as `stopped`).
    pub stop_graces: Vec<Duration>,
    pub reaped: Vec<String>,
    pub timers: Vec<(u64, Timer)>,
    pub host_closed: bool,
    /// Status lines as the terminal shows them (rendered by `crate::screen::status_lines`).
    pub status: Vec<String>,
    /// The lines only `-v` shows, rendered the same way.
    pub verbose: Vec<String>,
    pub audit: Vec<(String, Option<String>, Value)>,
    /// Every step's audit write fails ("disk full"): its calls are dropped and answered.
    pub audit_fails: bool,
    pub facts: Option<RecordedFacts>,
    pub launches: Vec<LaunchRecord>,
    pub now_ms: u64,
    pub next_pid: u32,
    /// Spawns fail with this sentence.
    pub spawn_error: Option<String>,
    pub published: usize,
    /// Every `tools/call` sent to a child: its epoch, and the `tool_called` records (callId,
    /// epoch) written before it.
    pub calls_sent: Vec<(String, Vec<Intent>)>,
    /// Every `tools/call` sent to a child, as sent.
    pub call_messages: Vec<Value>,
    /// Control requests taken up and not yet answered, by ticket.
    pub controls: std::collections::HashMap<Ticket, ControlReply>,
    pub next_ticket: Ticket,
}

impl FakeIo {
    /// The step's clock: the simulated monotonic time, and a wall time that follows it.
    pub fn now(&self) -> Now {
        Now {
            mono_ms: self.now_ms,
            wall_ms: 1_700_000_000_000 + self.now_ms,
        }
    }

    /// Performs one step's effects; returns the results the session hears about.
    pub fn perform(&mut self, effects: Vec<Effect>) -> Vec<Event> {
        let mut results = Vec::new();
        let records = effects.iter().any(|e| matches!(e, Effect::Audit { .. }));
        let failed = (records && self.audit_fails).then(|| "disk full".to_string());
        for effect in &effects {
            if let Effect::Audit { kind, epoch, data } = effect
                && failed.is_none()
            {
                self.audit
                    .push((kind.to_string(), epoch.clone(), data.clone().into_value()));
            }
        }
        let mut dropped = Vec::new();
        for effect in effects {
            match effect {
                Effect::Audit { .. } => {}
                Effect::ToHost { line, droppable } => self.host_line(line, droppable),
                Effect::ToChild { call: Some(id), .. } if failed.is_some() => dropped.push(id),
                Effect::ToChild {
                    epoch,
                    line,
                    droppable,
                    ..
                } => self.child_line(&epoch, line, droppable),
                Effect::StartBuild => self.builds_started += 1,
                Effect::SetAsideBuild => self.builds_set_aside += 1,
                Effect::Spawn { epoch, .. } => results.push(match &self.spawn_error {
                    Some(why) => Event::SpawnFailed {
                        epoch,
                        why: why.clone(),
                    },
                    None => {
                        self.next_pid += 1;
                        let pid = 1000 + self.next_pid;
                        self.spawned.push((epoch.clone(), pid));
                        Event::Spawned { epoch, pid }
                    }
                }),
                Effect::Stop { epoch, grace } => {
                    self.stopped.push(epoch);
                    self.stop_graces.push(grace);
                }
                Effect::Reap { epoch } => self.reaped.push(epoch),
                Effect::Arm { delay, timer } => self
                    .timers
                    .push((self.now_ms + delay.as_millis() as u64, timer)),
                Effect::CloseHost => self.host_closed = true,
                Effect::Status(event) => self.status.push(event.to_string()),
                Effect::Verbose(event) => self.verbose.push(event.to_string()),
                Effect::Publish(_) => self.published += 1,
                Effect::KeepLaunch(launch) => self.launches.push(*launch),
                Effect::KeepFacts(facts) => self.facts = Some(*facts),
                Effect::AnswerControl { ticket, answer } => {
                    if let Some(reply) = self.controls.remove(&ticket) {
                        reply.send(answer);
                    }
                }
            }
        }
        if let Some(why) = failed {
            results.push(Event::AuditFailed {
                why,
                calls: dropped,
            });
        }
        results
    }

    fn host_line(&mut self, line: Vec<u8>, droppable: bool) {
        assert_eq!(line.last(), Some(&b'\n'), "one line per message");
        assert!(
            !line[..line.len() - 1].contains(&b'\n'),
            "no newline inside a message"
        );
        let v: Value = serde_json::from_slice(&line).expect("the session writes JSON to the host");
        if droppable {
            self.droppable.push(v.clone());
        }
        self.to_host.push(v);
    }

    fn child_line(&mut self, epoch: &str, line: Vec<u8>, droppable: bool) {
        let v: Value = serde_json::from_slice(&line).expect("the session writes JSON to the child");
        // A server that never started gets nothing (as the real shell has no pipe to it).
        if !self.spawned.iter().any(|(e, _)| e == epoch) {
            return;
        }
        if droppable {
            self.droppable.push(v.clone());
        }
        if v["method"] == "tools/call" {
            let intents = self
                .audit
                .iter()
                .filter(|(k, _, _)| k == crate::audit::TOOL_CALLED)
                .map(|(_, e, d)| (d["callId"].clone(), e.clone()))
                .collect();
            self.calls_sent.push((epoch.to_string(), intents));
            self.call_messages.push(v.clone());
        }
        self.to_child.push_back((epoch.to_string(), v));
    }
}

impl FakeIo {
    /// Takes the earliest timer due at or before `target` and moves the clock to it (the one
    /// step every simulated clock in these tests advances by).
    pub fn take_due_timer(&mut self, target: u64) -> Option<Timer> {
        let i = self
            .timers
            .iter()
            .enumerate()
            .filter(|(_, (at, _))| *at <= target)
            .min_by_key(|(_, (at, _))| *at)
            .map(|(i, _)| i)?;
        let (at, timer) = self.timers.remove(i);
        self.now_ms = self.now_ms.max(at);
        Some(timer)
    }
}

/// An identity record whose executable digest is `exe`.
pub fn record(exe: &str) -> IdentityRecord {
    let mut i = crate::identity::fingerprint::tests::inputs();
    i.executable.sha256 = format!("sha256:{exe}");
    identity_record(i)
}

pub fn complete(exe: &str) -> BuildResult {
    BuildResult::Complete {
        line: format!("build complete: {exe}"),
        record: Box::new(record(exe)),
        changed: vec!["executable".into()],
        warnings: vec![],
    }
}

pub fn failed(last_good: Option<&str>) -> BuildResult {
    BuildResult::Failed {
        line: "build failed: 1 error in src/main.rs".into(),
        errors: 1,
        first_location: Some("src/main.rs:12:5".into()),
        first_error: Some("error[E0425]: cannot find value `x` in this scope".into()),
        last_good: last_good.map(|e| Box::new(record(e))),
    }
}

/// Facts holding a real server's `initialize` answer for `version`, as an earlier run keeps
/// them (server name `name`, capabilities `tools` and `logging`).
pub fn recorded_handshake(version: &str, name: &str) -> RecordedFacts {
    let mut facts = RecordedFacts::default();
    facts.handshakes.insert(
        version.to_string(),
        RecordedHandshake {
            result: json!({"protocolVersion": version, "capabilities": {"tools": {}, "logging": {}},
                           "serverInfo": {"name": name, "version": "0"}}),
            epoch: "OLD".into(),
            identity_digest: "sha256:old".into(),
            recorded_at: "t".into(),
        },
    );
    facts
}

/// A tool definition as a server would list it.
pub fn tool(name: &str, version: u32) -> Value {
    json!({"name": name, "description": format!("{name} v{version}"),
           "inputSchema": {"type": "object", "properties": {format!("f{version}"): {"type": "string"}}}})
}

/// The session under test plus a fake MCP server that answers what it is sent.
pub struct Harness {
    pub s: Session,
    /// The test shell: performs the session's effects.
    pub io: FakeIo,
    /// The tools the fake server lists (per epoch, so a rebuild can change them).
    pub tools: Vec<Value>,
    /// Protocol version the fake server answers `initialize` with (`None`: the client's).
    pub server_version: Option<String>,
    /// The fake server answers `tools/call` at once (else the call stays in flight).
    pub answer_calls: bool,
    /// Host-side ids the harness allocates.
    pub next_host_id: i64,
    /// How the fake server answers `subscriptions/listen`.
    pub listen: ListenReply,
    /// Every method the fake server was sent, in order (across epochs).
    pub server_saw: Vec<String>,
    /// The same, with the epoch of the server that was sent it.
    pub server_saw_in: Vec<(String, String)>,
}

/// The fake server's `subscriptions/listen` behaviour.
#[derive(Debug, Clone)]
pub enum ListenReply {
    /// "Method not found", as an rmcp 3.x server without `accepted_subscription_filter` answers.
    Refuse,
    /// Acknowledges with this honoured filter and keeps the stream open (no response).
    Acknowledge(Value),
}

impl Harness {
    pub fn new(configure: impl FnOnce(&mut SessionConfig)) -> Harness {
        Self::with_policy(configure, Policy::default())
    }

    /// Everything exempt: tests of first contact and staleness, not approvals.
    pub fn ungated(configure: impl FnOnce(&mut SessionConfig)) -> Harness {
        let policy = Policy {
            gating: Gating::Off,
            ..Policy::default()
        };
        Self::with_policy(configure, policy)
    }

    pub fn with_policy(configure: impl FnOnce(&mut SessionConfig), policy: Policy) -> Harness {
        let mut cfg = SessionConfig::new("inventory", "inventory", "0.1.0");
        configure(&mut cfg);
        let mut io = FakeIo::default();
        let now = io.now();
        let mut s = Session::new(cfg, policy, IdMint::Counted { last: 0 }, now);
        let effects = s.start(now);
        io.perform(effects);
        Harness {
            s,
            io,
            tools: vec![tool("list_items", 1), tool("write_item", 1)],
            server_version: None,
            answer_calls: true,
            next_host_id: 0,
            listen: ListenReply::Refuse,
            server_saw: Vec::new(),
            server_saw_in: Vec::new(),
        }
    }

    pub fn io(&mut self) -> &mut FakeIo {
        &mut self.io
    }

    /// One event handled as one step, its effects performed (and the steps of their results).
    pub fn handle(&mut self, event: Event) {
        let effects = self.s.handle(event, self.io.now());
        self.perform(effects);
    }

    /// Events handled together as one step (lines read at once: one audit write).
    pub fn handle_batch(&mut self, events: Vec<Event>) {
        let effects = self.s.handle_batch(events, self.io.now());
        self.perform(effects);
    }

    fn perform(&mut self, mut effects: Vec<Effect>) {
        loop {
            let results = self.io.perform(effects);
            if results.is_empty() {
                return;
            }
            effects = Vec::new();
            for event in results {
                effects.extend(self.s.handle(event, self.io.now()));
            }
        }
    }

    /// A request arriving on the control socket, as the shell passes it on: parsed at the edge
    /// (a malformed one answered there), taken up only while its client waits, then handled
    /// with a ticket whose answer goes to `reply`.
    pub fn control_call(&mut self, request: Value, reply: ControlReply) {
        let request = match ControlRequest::parse(&request) {
            Ok(request) => request,
            Err(e) => return reply.send(json!({"ok": false, "error": e})),
        };
        if !reply.take_up() {
            return;
        }
        self.io.next_ticket += 1;
        let ticket = self.io.next_ticket;
        self.io.controls.insert(ticket, reply);
        self.handle(Event::Control { request, ticket });
    }

    pub fn advance(&mut self, ms: u64) {
        let target = self.io().now_ms + ms;
        while let Some(timer) = self.io().take_due_timer(target) {
            self.handle(Event::Timer(timer));
            self.serve();
        }
        self.io().now_ms = target;
    }

    pub fn build(&mut self, result: BuildResult) {
        self.handle(Event::BuildFinished(Box::new(result)));
        self.serve();
    }

    /// The host sends a raw JSON message.
    pub fn host(&mut self, msg: Value) {
        self.handle(Event::HostLine(msg.to_string().into_bytes()));
        self.serve();
    }

    /// The host sends a request; returns its id.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_host_id);
        self.next_host_id += 1;
        self.host(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    pub fn initialize(&mut self, version: &str) -> Value {
        self.request(
            "initialize",
            json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
        )
    }

    pub fn initialized(&mut self) {
        self.host(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    pub fn call(&mut self, tool: &str) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": {}}))
    }

    /// The answer the host got for `id`, if any (exactly one is asserted).
    pub fn answer(&mut self, id: &Value) -> Option<Value> {
        let answers: Vec<Value> = self
            .io()
            .to_host
            .iter()
            .filter(|m| m.get("id") == Some(id) && m.get("method").is_none())
            .cloned()
            .collect();
        assert!(
            answers.len() <= 1,
            "request {id} answered twice: {answers:?}"
        );
        answers.into_iter().next()
    }

    /// Host notifications named `method` so far.
    pub fn host_notes(&mut self, method: &str) -> usize {
        self.io()
            .to_host
            .iter()
            .filter(|m| m.get("method").and_then(Value::as_str) == Some(method))
            .count()
    }

    /// The gate's phase, judged against the server that runs now.
    pub fn gate_phase(&self) -> approval::Phase {
        let serving = super::serving(&self.s.server, &self.s.catalogs);
        self.s.approvals.gate.phase(serving)
    }

    pub fn current_epoch(&self) -> Option<String> {
        self.s.current_epoch().map(str::to_string)
    }

    /// The fake server answers everything queued for it.
    pub fn serve(&mut self) {
        while let Some((epoch, msg)) = self.io().to_child.pop_front() {
            if Some(epoch.as_str()) != self.s.current_epoch() {
                continue;
            }
            let method = msg["method"].as_str().unwrap_or_default().to_string();
            self.server_saw.push(method.clone());
            self.server_saw_in.push((epoch.clone(), method.clone()));
            let Some(id) = msg.get("id").cloned() else {
                continue;
            };
            if method == "subscriptions/listen" {
                let line = match &self.listen {
                    ListenReply::Refuse => json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32601, "message": "subscriptions/listen"}}),
                    ListenReply::Acknowledge(honoured) => json!({"jsonrpc": "2.0",
                        "method": "notifications/subscriptions/acknowledged",
                        "params": {"_meta": {protocol::SUBSCRIPTION_ID: id}, "notifications": honoured}}),
                };
                self.handle(Event::ChildLine {
                    epoch: epoch.clone(),
                    line: line.to_string().into_bytes(),
                });
                continue;
            }
            let result = match method.as_str() {
                "initialize" => {
                    let v = self
                        .server_version
                        .clone()
                        .or_else(|| {
                            msg["params"]["protocolVersion"]
                                .as_str()
                                .map(str::to_string)
                        })
                        .unwrap_or_default();
                    json!({"protocolVersion": v, "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}})
                }
                "server/discover" => json!({"supportedVersions": [protocol::MODERN_VERSION],
                    "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}),
                "tools/list" => json!({"tools": self.tools}),
                "tools/call" if self.answer_calls => {
                    json!({"content": [{"type": "text", "text": format!("ran in {epoch}")}]})
                }
                "tools/call" => continue,
                _ => json!({}),
            };
            let line = json!({"jsonrpc": "2.0", "id": id, "result": result});
            self.handle(Event::ChildLine {
                epoch: epoch.clone(),
                line: line.to_string().into_bytes(),
            });
        }
    }

    /// Legacy connect: initialize, initialized; returns the initialize answer (if any yet).
    pub fn connect_legacy(&mut self) -> Option<Value> {
        let id = self.initialize("2025-06-18");
        self.initialized();
        self.answer(&id)
    }

    /// A legacy ungated session with the first server (`a`) up, its catalog fetched; and its
    /// epoch.
    pub fn serving_legacy() -> (Harness, String) {
        let mut h = Harness::ungated(|_| {});
        h.connect_legacy();
        h.build(complete("a"));
        let epoch = h.current_epoch().unwrap();
        (h, epoch)
    }

    /// Starts server `a` and answers its handshake (a second after it was sent); returns the
    /// epoch and the supervisor's first `tools/list` to it, not answered.
    pub fn start_until_first_list(&mut self) -> (String, Value) {
        self.handle(Event::BuildFinished(Box::new(complete("a"))));
        self.handshake_until_first_list()
    }

    /// The same after a rebuild to `exe` replaced the server of epoch `old`.
    pub fn rebuild_until_first_list(&mut self, exe: &str, old: &str) -> (String, Value) {
        self.handle(Event::BuildFinished(Box::new(complete(exe))));
        let epoch = old.to_string();
        self.handle(Event::ChildStopped { epoch });
        self.handshake_until_first_list()
    }

    /// Answers the current server's handshake; returns its epoch and the supervisor's first
    /// `tools/list` to it, not answered.
    pub fn handshake_until_first_list(&mut self) -> (String, Value) {
        let current = self.current_epoch().expect("a server");
        loop {
            let (e, msg) = self.io().to_child.pop_front().expect("a request");
            if e != current {
                continue;
            }
            if msg["method"] == json!("tools/list") {
                return (e, msg);
            }
            let Some(id) = msg.get("id").cloned() else {
                continue;
            };
            self.io().now_ms += 1_000;
            let result = if msg["method"] == json!("initialize") {
                json!({"protocolVersion": msg["params"]["protocolVersion"],
                       "capabilities": {"tools": {}},
                       "serverInfo": {"name": "fake", "version": "1"}})
            } else {
                json!({})
            };
            from_child(
                self,
                &e,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
            );
        }
    }

    /// Names of the tools in a `tools/list` answer.
    pub fn names(answer: &Value) -> Vec<String> {
        answer["result"]["tools"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `error` field of a tool error result.
    pub fn tool_error(answer: &Value) -> Option<String> {
        if answer["result"]["isError"] != json!(true) {
            return None;
        }
        answer["result"]["_meta"]["dev.cargo-mcp-dev/error"]["error"]
            .as_str()
            .map(str::to_string)
    }

    /// A rebuild with new code, the old server stopped and the new one up: its epoch.
    pub fn rebuild(&mut self, exe: &str) -> String {
        let old = self.current_epoch();
        self.build(complete(exe));
        if let Some(old) = old {
            self.handle(Event::ChildStopped { epoch: old });
            self.serve();
        }
        self.current_epoch().expect("the new server runs")
    }

    /// A control-socket request (the human channel); returns the session's answer.
    pub fn control(&mut self, request: Value) -> Value {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.control_call(request, tx.into());
        self.serve();
        rx.try_recv()
            .expect("control requests are answered at once")
    }

    /// The host calls `tool` with these arguments; returns the call's id.
    pub fn call_with(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    pub fn audit_kinds(&mut self, kind: &str) -> Vec<Value> {
        self.io()
            .audit
            .iter()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, _, d)| d.clone())
            .collect()
    }
}

/// A line from the server of `epoch`, handled as it arrives (nothing answered for it).
pub fn from_child(h: &mut Harness, epoch: &str, msg: Value) {
    h.handle(Event::ChildLine {
        epoch: epoch.to_string(),
        line: msg.to_string().into_bytes(),
    });
}

/// A line from the host, without the fake server answering anything.
pub fn host_raw(h: &mut Harness, msg: Value) {
    h.handle(Event::HostLine(msg.to_string().into_bytes()));
}

/// The oldest request the session sent to a server and nobody answered yet.
pub fn next_to_child(h: &mut Harness) -> Value {
    h.io()
        .to_child
        .pop_front()
        .expect("a request to the server")
        .1
}

pub fn list_changed() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
}
