//! The host's `initialize` room: from its arrival until it is answered, exactly once.
//!
//! Owns: [`HostInitialize`] (kept in one place with one deadline, wherever the request is), the
//! choice of who answers it, and the answers themselves. The rule (issue 33): the host only ever
//! gets a real server's answer to the version it asked for: this session's server (through our
//! handshake, or the host's own request to a server past its handshake), or, after the
//! handshake wait, the answer a real server of this package gave to the same version before
//! (recorded with the epoch and identity that gave it). Past the first-start budget, or when
//! no server is coming, it gets an error that says why and what to do. A request that carried
//! it and is gone (the server exited, was replaced, answered with a broken line) leaves it
//! waiting again: the next server is sent it, and its deadline still holds.
//!
//! Must not touch: I/O (effects are data: `effect`), gating, held requests (first contact), the server's
//! handshake itself (the handshake room sends it and hands answers here).

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::wire::proxy::envelope::{self, Message};

impl Session {
    /// Legacy `initialize` from the host.
    pub(super) fn on_host_initialize(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        if self.host.initialize.is_some() {
            // The first one still waits for a server's own answer: it keeps its place (and
            // its params); this one is refused rather than left unanswered or forwarded.
            return self.step.out.to_host(envelope::error_line(
                Some(&host_id),
                -32600,
                "initialize is already in progress on this connection",
                json!({"error": "initialize_in_progress"}),
            ));
        }
        // The host speaks the legacy protocol from now on, whatever its abandoned probe was
        // answered (a modern negotiation from a late probe answer would have a server that is
        // handshaking stopped as one that cannot serve).
        let params = msg.params_value();
        self.host.era = Some(Era::Legacy);
        if self
            .host
            .negotiated
            .as_ref()
            .is_some_and(|n| !protocol::LEGACY_VERSIONS.contains(&n.protocol_version.as_str()))
        {
            self.host.negotiated = None;
        }
        if self.discovery_in_flight() {
            // The host fell back from `server/discover`: so does the server's handshake.
            self.discovery_failed(None);
        }
        self.host.client_info = params.get("clientInfo").cloned();
        self.host.init_params = Some(params);
        self.host.initialized = false;
        self.audit_record(audit::RUN_STARTED, None, json!({
            "agentRun": self.agent_run(), "client": self.host.client_info, "gating": if self.cfg.gating_off { "off" } else { "on" },
            "label": self.label(), "event": "initialize",
        }));
        let now = self.now();
        self.host.initialize = Some(HostInitialize {
            host_id,
            since_ms: now,
            due_ms: now,
            at_server: None,
        });
        match self.server.child() {
            Some(c) if c.phase == ChildPhase::Started => {
                // The server is up: our handshake carries the host's `initialize`.
                let epoch = c.epoch.clone();
                self.handshake_legacy(epoch);
            }
            Some(c) if c.phase.is_up() => self.initialize_to_server(),
            _ => {}
        }
        self.judge_initialize();
    }

    /// Our legacy handshake to the fresh server of `epoch`, with the host's params; it carries
    /// the host's `initialize` when that waits.
    pub(super) fn handshake_legacy(&mut self, epoch: EpochId) {
        let Some(params) = self.host.init_params.clone() else {
            return;
        };
        let carries = self.initialize_waiting();
        let id = self.send_handshake(epoch, false, &params);
        if carries && let Some(init) = &mut self.host.initialize {
            init.at_server = Some(id);
        }
    }

    /// The host's `initialize` waits for a server (it is not answered, and no live request of
    /// ours carries it).
    pub(super) fn initialize_waiting(&self) -> bool {
        self.host
            .initialize
            .as_ref()
            .is_some_and(|i| i.at_server.is_none_or(|id| self.request(id).is_none()))
    }

    /// The host's `initialize` if `id` is the request that carries it (taken: answered now).
    pub(super) fn take_initialize_carried_by(&mut self, id: u64) -> Option<HostInitialize> {
        if self
            .host
            .initialize
            .as_ref()
            .is_some_and(|i| i.at_server == Some(id))
        {
            return self.host.initialize.take();
        }
        None
    }

    /// The server is past its own handshake (it answered the host's probe, which the host gave
    /// up on): the waiting `initialize` goes to it as it would on a direct connection, and its
    /// own answer reaches the host (see `on_initialize_answer`).
    pub(super) fn initialize_to_server(&mut self) {
        if !self.initialize_waiting() {
            return;
        }
        let Some(c) = self.server.child() else {
            return;
        };
        let epoch = c.epoch.clone();
        let params = self.host.init_params.clone().unwrap_or(json!({}));
        let id = self.alloc(OpenRequest::ForwardedInitialize);
        if let Some(init) = &mut self.host.initialize {
            init.at_server = Some(id);
        }
        self.step
            .out
            .to_child(&epoch, envelope::request_line(id, "initialize", &params));
    }

    /// The server's answer to the host's own `initialize` that we passed to it (our id `id`).
    pub(super) fn on_initialize_answer(&mut self, epoch: &str, id: u64, msg: &Message) {
        let asked = self
            .host
            .init_params
            .as_ref()
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str)
            .map(str::to_string);
        if !msg.is_error() {
            self.record_handshake(epoch, asked.as_deref(), &msg.result_value());
        }
        let Some(init) = self.take_initialize_carried_by(id) else {
            // Answered already (its deadline passed): nothing more reaches the host.
            return;
        };
        let mut msg = msg.clone();
        if !msg.is_error() {
            let mut result = msg.result_value();
            protocol::advertise_list_changed(&mut result);
            self.host.negotiated = Some(Negotiated {
                protocol_version: result
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                capabilities: result.get("capabilities").cloned().unwrap_or(json!({})),
                from_record: false,
            });
            msg.set_result(&result);
        }
        self.step.out.to_host(msg.to_line_with_id(&init.host_id));
    }

    /// Looks at the host's `initialize` (on arrival, at its deadline, and after a transition
    /// that may have changed what is coming): the recorded answer once the handshake wait is
    /// over, or at once when waiting cannot help; a wait while a server answers it or one is
    /// coming, within the budget; else an error that says why.
    pub(super) fn judge_initialize(&mut self) {
        let now = self.now();
        let Some(init) = &self.host.initialize else {
            return;
        };
        if init.due_ms > now {
            return; // a later timer is armed for it
        }
        let since = init.since_ms;
        let stopping = self.lifecycle == Lifecycle::Stopping;
        let at_live_server = !self.initialize_waiting();
        let recorded = self.recorded_handshake().is_some();
        let budget_end = since + self.cfg.first_start_budget.as_millis() as u64;
        let record_due = (since + self.cfg.handshake_wait.as_millis() as u64).min(budget_end);
        // A broken build may be fixed by a save within the budget: a wait does better than an
        // error the host cannot recover from without a reconnect.
        let coming =
            self.hold_budget().is_some() || matches!(self.lifecycle, Lifecycle::BuildBroken { .. });
        let waiting_helps = !stopping && now < budget_end && (at_live_server || coming);
        if recorded && !stopping && (now >= record_due || !waiting_helps) {
            let init = self.host.initialize.take().expect("checked");
            return self.answer_initialize_from_record(init.host_id);
        }
        if waiting_helps {
            let due = if recorded { record_due } else { budget_end };
            let first = init.due_ms == init.since_ms;
            if let Some(init) = &mut self.host.initialize {
                init.due_ms = due;
            }
            if first && !at_live_server {
                self.step.out.status(StatusEvent::InitializeWaits {
                    why: self.absent_why(),
                    at_most_s: (due - now) as f64 / 1000.0,
                    then_recorded: recorded,
                });
            }
            return self
                .step
                .out
                .schedule(Duration::from_millis(due - now), Timer::HandshakeWait);
        }
        let init = self.host.initialize.take().expect("checked");
        self.refuse_initialize(init);
    }

    /// Something changed what is coming (a build failed, a server could not start, the
    /// connection closes): the host's `initialize` is looked at now, not at its deadline.
    pub(super) fn initialize_after_transition(&mut self) {
        let now = self.now();
        if let Some(init) = &mut self.host.initialize {
            init.due_ms = init.due_ms.min(now);
        }
        self.judge_initialize();
    }

    /// The answer a real server of this package gave to the version the host asks for (only
    /// one whose `protocolVersion` is a string: what the host is told must be comparable with
    /// what the next server says).
    fn recorded_handshake(&self) -> Option<&RecordedHandshake> {
        let requested = self
            .host
            .init_params
            .as_ref()?
            .get("protocolVersion")?
            .as_str()?;
        self.recorded.handshakes.get(requested).filter(|r| {
            r.result
                .get("protocolVersion")
                .is_some_and(Value::is_string)
        })
    }

    /// Gives the host the `initialize` answer a real server of this package gave to the same
    /// requested version (said as such on stderr). The next server of this session is
    /// initialized with the host's own params; if it answers another version, the connection
    /// is closed with both versions named (see `on_handshake_result`).
    fn answer_initialize_from_record(&mut self, host_id: RawId) {
        let Some(rec) = self.recorded_handshake().cloned() else {
            return;
        };
        let mut result = rec.result.clone();
        protocol::advertise_list_changed(&mut result);
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.host.negotiated = Some(Negotiated {
            protocol_version: version.clone(),
            capabilities: result.get("capabilities").cloned().unwrap_or(json!({})),
            from_record: true,
        });
        let list_waits = self.hold_budget().is_some();
        self.step.out.status(StatusEvent::InitializeFromRecord {
            protocol: crate::screen::sanitize::first_chars(&version, 40).to_string(),
            epoch: crate::identity::epoch::short(&rec.epoch).to_string(),
            identity: crate::base::hashing::short(&rec.identity_digest).to_string(),
            why: self.absent_why(),
            list_waits,
        });
        self.step
            .out
            .to_host(envelope::result_line(&host_id, &result));
    }

    /// `initialize` with no real answer to give: why, and what to do.
    fn refuse_initialize(&mut self, init: HostInitialize) {
        let waited = self.now().saturating_sub(init.since_ms);
        let (message, mut data) = if self.hold_budget().is_some() {
            (
                format!(
                    "the MCP server is still {} ({:.0} s so far) and no server of this package has answered this protocol version before; reconnect the server in the host when the build is done (`cargo mcp-dev status --follow` shows it)",
                    self.starting_word(),
                    waited as f64 / 1000.0
                ),
                json!({"error": "server_building", "waitedMs": waited,
                       "retry": "reconnect the server in the host when the build is done"}),
            )
        } else {
            self.unavailable_reason()
        };
        data["method"] = json!("initialize");
        self.step.out.status(StatusEvent::InitializeError {
            waited_s: waited as f64 / 1000.0,
            why: self.absent_why(),
        });
        self.step.out.to_host(envelope::error_line(
            Some(&init.host_id),
            codes::SERVER_UNAVAILABLE,
            &message,
            data,
        ));
    }
}
