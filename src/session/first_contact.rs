//! First-contact room: requests that arrive before a server can answer them.
//!
//! Owns: held requests and their deadlines, the discover probe's answer when no server can
//! give one, the recorded catalog answered when the first-start budget runs out (never once a
//! server of this session was up), and the answers given while the build is broken. The host's
//! `initialize` is the `initialize` room's.
//!
//! The rule (README "First contact"): no answer the host receives describes state that no real
//! server produced. Must not touch: gating (held calls are judged by the router when released),
//! I/O (effects are data: `effect`).

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::wire::proxy::envelope::{self, Message};

impl Session {
    /// Holds a request until a server can answer it or its deadline passes.
    pub(super) fn hold(&mut self, msg: Message, wait: Duration) {
        if self.host.held.len() >= HELD_LIMIT {
            self.step
                .out
                .status(StatusEvent::TooManyHeld { limit: HELD_LIMIT });
            if msg.method() == Some("tools/call") {
                return self.on_host_call(msg); // judged now: refused without a server
            }
            let id = msg.id().expect("request").to_owned();
            return self.step.out.to_host(envelope::error_line(
                Some(&id),
                codes::SERVER_UNAVAILABLE,
                &format!(
                    "no MCP server can answer yet ({}), and {HELD_LIMIT} requests already wait for it; retry in a moment",
                    self.absent_why()
                ),
                json!({"error": "server_building", "reason": "too many waiting",
                       "retry": "retry the request in a moment"}),
            ));
        }
        let now = self.now();
        let deadline_ms = now + wait.as_millis() as u64;
        self.host.held.push_back(Held {
            msg,
            deadline_ms,
            since_ms: now,
        });
        self.arm_held_timer(now);
    }

    /// One timer for all held requests: armed for the earliest deadline (a flood of held
    /// requests costs one timer, not one each).
    fn arm_held_timer(&mut self, now: u64) {
        let Some(earliest) = self.host.held.iter().map(|h| h.deadline_ms).min() else {
            return;
        };
        if self.step.armed.held.is_some_and(|armed| armed <= earliest) {
            return;
        }
        self.step.armed.held = Some(earliest);
        let wait = std::time::Duration::from_millis(earliest.saturating_sub(now));
        self.step.out.schedule(wait, Timer::HeldDeadline);
    }

    /// Why no ready server answers now, as the end of "… while {why}".
    pub(super) fn absent_why(&self) -> &'static str {
        match &self.lifecycle {
            Lifecycle::BuildBroken { .. } => "the build failed",
            Lifecycle::StartFailed { .. } => "the server failed to start",
            Lifecycle::CrashLoop => "the server keeps exiting",
            Lifecycle::Stopping => "the connection is closing",
            _ if self.server.child().is_some() => "the server is starting",
            _ if self.server.rebuilding_to_start() => "the server is being built again",
            _ if self.build.runs != Builds::Idle => "the server is being built",
            _ if self.server.runs_or_restarts() => "the server is restarting",
            _ => "no server is running",
        }
    }

    /// A server runs, or one is on its way: a replacement, a scheduled restart, or a build
    /// whose result is started.
    fn server_on_its_way(&self) -> bool {
        self.server.runs_or_restarts()
            || self.build.runs != Builds::Idle
            || self.server.rebuilding_to_start()
    }

    /// How long a request may wait for the server in the current state, if it may wait.
    pub(super) fn hold_budget(&self) -> Option<Duration> {
        match self.lifecycle {
            // Only for a server that is coming (a first server that exited in manual mode is
            // not): requests never wait for nothing.
            Lifecycle::FirstStart if self.server_on_its_way() => Some(self.cfg.first_start_budget),
            // A restart's gap: the next server is on its way.
            Lifecycle::Serving if self.server.runs_or_restarts() => Some(self.cfg.restart_hold),
            // No server, and a build runs whose result starts one (its stored copy could not
            // start and is being built again, or a change after a crash loop): like the first.
            Lifecycle::Serving
                if self.server.child().is_none()
                    && (self.server.rebuilding_to_start() || self.build.runs != Builds::Idle) =>
            {
                Some(self.cfg.first_start_budget)
            }
            _ => None,
        }
    }

    /// Where a host request goes now ([`route::route`], the one table), in `moment`.
    pub(super) fn route(&self, msg: &Message, moment: route::Moment) -> Route {
        let class = route::Class::of(msg.method(), || msg.params_value().get("cursor").is_some());
        let budgets = route::Budgets {
            hold: self.hold_budget(),
            discover: self.cfg.discover_wait,
        };
        route::route(
            route::ServerView::of(self.child_phase()),
            class,
            moment,
            budgets,
        )
    }

    /// Looks at every held request again after a transition: those the table now forwards go
    /// to the server, judged as if they arrived now (a call that starts a fetch must not
    /// strand the requests behind it: round 25); the rest stay held, in order.
    pub(super) fn flush_held(&mut self) {
        let mut kept = std::collections::VecDeque::new();
        while let Some(h) = self.host.held.pop_front() {
            match self.route(&h.msg, route::Moment::Released) {
                Route::Forward => self.route_host_request(h.msg),
                _ => kept.push_back(h),
            }
        }
        self.host.held = kept;
    }

    /// Held requests whose deadline passed get what the table says: forwarded, waiting for a
    /// server that owes an answer, the recorded list, or an answer now.
    pub(super) fn expire_held(&mut self) {
        self.step.armed.held = None;
        let now = self.now();
        let record_lists = self.record_answers_lists();
        let mut kept = std::collections::VecDeque::new();
        while let Some(h) = self.host.held.pop_front() {
            let moment = if h.deadline_ms > now {
                route::Moment::Released
            } else {
                route::Moment::Expired {
                    now_ms: now,
                    record_lists,
                }
            };
            match self.route(&h.msg, moment) {
                Route::Forward => self.route_host_request(h.msg),
                Route::KeepHolding | Route::Hold(_) => kept.push_back(h),
                Route::WaitForServer { due_ms } => kept.push_back(Held {
                    deadline_ms: due_ms,
                    since_ms: h.since_ms,
                    msg: h.msg,
                }),
                Route::FromRecord => self.answer_list_from_record(h.msg),
                Route::Answer(_) => self.answer_expired(h),
            }
        }
        self.host.held = kept;
        self.arm_held_timer(now);
    }

    /// A held request's budget ran out and no server answers it.
    fn answer_expired(&mut self, h: Held) {
        let waited = self.now().saturating_sub(h.since_ms);
        let method = h.msg.method().unwrap_or_default().to_string();
        match method.as_str() {
            // Judged now: with no server this is `identity_pending`, said plainly.
            "tools/call" => self.on_host_call(h.msg),
            "server/discover" => {
                self.refuse_discover(h.msg);
                if self.discovery_in_flight() && self.host.negotiated.is_none() {
                    // The host falls back now: so does the server's handshake (its late
                    // discover answer is dropped), and it waits for the host's `initialize`.
                    self.discovery_failed(None);
                }
            }
            _ => {
                let id = h.msg.id().expect("request").to_owned();
                self.step.out.status(StatusEvent::HeldTooLong {
                    method: method.to_string(),
                    waited_s: waited as f64 / 1000.0,
                });
                if method == "tools/list" {
                    self.host.list_refused = true;
                }
                self.step.out.to_host(envelope::error_line(
                    Some(&id),
                    codes::SERVER_UNAVAILABLE,
                    &format!(
                        "the MCP server is still {} ({:.0} s so far); its tools appear when it is up: retry, or reconnect in a moment",
                        self.starting_word(),
                        waited as f64 / 1000.0
                    ),
                    json!({"error": "server_building", "waitedMs": waited,
                           "retry": "retry the request; hosts that list tools once: reconnect the server when the build is done"}),
                ));
            }
        }
    }

    /// `server/discover` could not be answered by a real server in time: the host falls back to
    /// `initialize`, which every server supports (the answer says why, in its message).
    pub(super) fn refuse_discover(&mut self, msg: Message) {
        let id = msg.id().expect("request").to_owned();
        self.forget_probe_era();
        let building = self.hold_budget().is_some();
        self.step.out.to_host(envelope::error_line(
            Some(&id),
            -32601,
            &format!(
                "server/discover is not available while {}; use initialize",
                self.absent_why()
            ),
            json!({"error": if building { "server_building" } else { "server_unavailable" }}),
        ));
    }

    /// The host's probe was refused: the era it implied is forgotten, unless the host has
    /// already moved on (it sent `initialize`, or a server's answer fixed the era). Forgetting a
    /// legacy era left a server started later never initialized (issue 33).
    pub(super) fn forget_probe_era(&mut self) {
        if self.host.negotiated.is_none() && self.host.era == Some(Era::Modern) {
            self.host.era = None;
            self.host.modern_meta = None;
        }
    }

    /// A held list may be answered from the recorded catalog (when no server runs: the routing
    /// table's part): no server of this session started, or the last one produced that record
    /// (never an earlier build's catalog once this session ran newer code: red team of issue 33).
    fn record_answers_lists(&self) -> bool {
        let Some(rec) = &self.recorded.catalog else {
            return false;
        };
        self.restarts
            .last_started
            .as_ref()
            .is_none_or(|e| e.as_str() == rec.epoch)
    }

    /// The first-start budget ran out: the most recent catalog a real server of this package
    /// produced, recorded as the source of what the host was shown.
    fn answer_list_from_record(&mut self, msg: Message) {
        let Some(rec) = self.recorded.catalog.clone() else {
            return;
        };
        let id = msg.id().expect("request").to_owned();
        let mut result = json!({"tools": rec.tools});
        if self.era() == Some(Era::Modern) {
            result["resultType"] = json!("complete");
            result["ttlMs"] = json!(0);
            result["cacheScope"] = json!("private");
        }
        self.step.out.status(StatusEvent::ListFromRecord {
            starting: self.starting_word(),
            epoch: crate::identity::epoch::short(&rec.epoch).to_string(),
            digest: crate::base::hashing::short(&rec.digest).to_string(),
            identity: crate::base::hashing::short(&rec.identity_digest).to_string(),
        });
        self.step.out.to_host(envelope::result_line(&id, &result));
        if let Ok(c) = crate::policy::catalog::Catalog::from_tools(rec.tools.clone()) {
            self.host_was_shown(
                &c,
                "recorded catalog",
                Some((&rec.epoch, &rec.identity_digest)),
            );
        }
    }

    /// What the server is doing while requests wait: `building` (first start, no server yet)
    /// or `starting` (a server process exists, or a restart is under way).
    pub(super) fn starting_word(&self) -> &'static str {
        if self.server.child().is_none()
            && (self.lifecycle == Lifecycle::FirstStart
                || self.server.rebuilding_to_start()
                || self.build.runs != Builds::Idle)
        {
            "building"
        } else {
            "starting"
        }
    }

    /// Answers one request that no server will answer soon (build broken, crash loop, closing).
    pub(super) fn answer_unavailable(&mut self, msg: Message) {
        if msg.method() == Some("tools/call") {
            return self.on_host_call(msg);
        }
        let id = msg.id().expect("request").to_owned();
        if msg.method() == Some("tools/list") {
            self.host.list_refused = true;
        }
        let (message, data) = self.unavailable_reason();
        self.step.out.to_host(envelope::error_line(
            Some(&id),
            codes::SERVER_UNAVAILABLE,
            &message,
            data,
        ));
    }

    /// Why no server can answer now: one sentence and the machine-readable payload.
    pub(super) fn unavailable_reason(&self) -> (String, Value) {
        match &self.lifecycle {
            Lifecycle::BuildBroken { message } => (
                format!(
                    "the MCP server's build failed: {message}; it starts as soon as a build succeeds (save a fix)"
                ),
                json!({"error": "build_failed", "firstError": message,
                       "retry": "fix the build; the server starts as soon as a build succeeds"}),
            ),
            Lifecycle::StartFailed { message } => (
                format!(
                    "the MCP server failed to start: {message}; it starts again with the next successful build (save a change) or on `cargo mcp-dev restart`"
                ),
                json!({"error": "server_unavailable", "reason": "start failed", "detail": message}),
            ),
            Lifecycle::CrashLoop => (
                "the MCP server keeps exiting; it restarts when the sources change or on `cargo mcp-dev restart`".into(),
                json!({"error": "server_unavailable", "reason": "crash loop"}),
            ),
            Lifecycle::Stopping => (
                "the connection is closing".into(),
                json!({"error": "server_unavailable", "reason": "closing"}),
            ),
            _ if self.server.rebuilding_to_start() => (
                "the MCP server could not start from its stored copy and is being built again (was the target directory cleaned?); retry when the build is done".into(),
                json!({"error": "server_building", "reason": "rebuilding to start",
                       "retry": "retry the request when the build is done"}),
            ),
            _ if self.cfg.restart == Restart::Manual => (
                "no MCP server is running (restart mode manual: `cargo mcp-dev restart`)".into(),
                json!({"error": "server_unavailable"}),
            ),
            _ => (
                "no MCP server is running; it starts with the next successful build (save a change) or on `cargo mcp-dev restart`".into(),
                json!({"error": "server_unavailable"}),
            ),
        }
    }

    /// Every held request gets its answer now (the server will not come soon).
    pub(super) fn fail_held(&mut self) {
        while let Some(h) = self.host.held.pop_front() {
            self.answer_unavailable(h.msg);
        }
        // Nothing may be coming: the host's `initialize` is looked at now (a record, or why).
        self.initialize_after_transition();
    }
}
