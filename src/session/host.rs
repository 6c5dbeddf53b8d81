//! Host room: every message the host sends (our stdin).
//!
//! Owns: parsing errors answered to the host, the era the host speaks, routing requests to the
//! server (ids mapped into our id space), host notifications and the host's answers to the
//! server's requests. Must not touch: gating (the router), held-request policy (first contact),
//! I/O (effects are data: `effect`).

use serde_json::{Value, json};

use super::*;
use crate::audit::records;
use crate::wire::proxy::envelope::{self, Kind, Message};

impl Session {
    pub(super) fn on_host_line(&mut self, line: Vec<u8>) {
        let msg = match Message::parse_owned(line) {
            Ok(m) => m,
            Err(envelope::Unreadable { error: e, line }) => {
                self.step
                    .out
                    .status(StatusEvent::HostInvalidMessage { why: e.to_string() });
                let id = protocol::recover_id(&line);
                self.step.out.to_host(envelope::error_line(
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

    pub(super) fn on_host_oversize(&mut self, prefix: &[u8], len: usize) {
        self.step.out.status(StatusEvent::HostOversize { len });
        let id = protocol::recover_id(prefix);
        self.step.out.to_host(envelope::error_line(
            id.as_deref(),
            -32700,
            "message too large",
            json!({"bytes": len}),
        ));
    }

    fn note_era(&mut self, msg: &Message) {
        // Runs for every request: only `_meta` is parsed.
        let Some(meta) = envelope::params_meta(msg.params()) else {
            return;
        };
        if let Some(meta) = protocol::modern_meta_of(&meta) {
            if self.host.era.is_none() {
                self.host.era = Some(Era::Modern);
            }
            if self.host.client_info.is_none() {
                self.host.client_info = meta.get(protocol::CLIENT_INFO).cloned();
            }
            self.host.modern_meta = Some(meta);
            self.advance_child();
        }
    }

    fn on_host_request(&mut self, msg: Message) {
        // The methods the supervisor answers or holds itself (no copy of the name per request).
        enum Method {
            Initialize,
            Ping,
            Listen,
            Discover,
            Other,
        }
        let method = match msg.method() {
            Some("initialize") => Method::Initialize,
            Some("ping") => Method::Ping,
            Some("subscriptions/listen") => Method::Listen,
            Some("server/discover") => Method::Discover,
            _ => Method::Other,
        };
        if !matches!(method, Method::Initialize) {
            self.note_era(&msg);
        }
        match method {
            Method::Initialize => self.on_host_initialize(msg),
            Method::Ping => {
                let id = msg.id().expect("request").to_owned();
                self.step
                    .out
                    .to_host(envelope::result_line(&id, &json!({})));
            }
            Method::Listen if self.host.listens.len() + self.held_listens() >= LISTEN_LIMIT => {
                let id = msg.id().expect("request").to_owned();
                let why = format!("more than {LISTEN_LIMIT} subscriptions/listen streams are open");
                self.step
                    .out
                    .to_host(envelope::error_line(Some(&id), -32600, &why, json!({})));
            }
            // One stream per id, whoever serves it: a reused id would orphan the server's
            // stream and its pending entry, outside `LISTEN_LIMIT`.
            Method::Listen if msg.id().is_some_and(|id| self.listen_id_taken(id.get())) => {
                let id = msg.id().expect("request").to_owned();
                let why = "a subscriptions/listen stream with this id is already open";
                self.step
                    .out
                    .to_host(envelope::error_line(Some(&id), -32600, why, json!({})));
            }
            Method::Listen
                if self.era() == Some(Era::Modern)
                    && protocol::ListenFilter::of(&msg.params_value()).supervisor_only() =>
            {
                self.open_supervisor_listen(msg)
            }
            _ => match self.route(&msg, route::Moment::Arrived) {
                Route::Forward => self.route_host_request(msg),
                Route::Hold(wait) => self.hold(msg, wait),
                Route::Answer(route::Answer::UseInitialize) => self.refuse_discover(msg),
                // Nothing else is answered on arrival (the table's property tests).
                _ => self.answer_unavailable(msg),
            },
        }
    }

    /// Sends a host request to the ready server under our own id.
    pub(super) fn route_host_request(&mut self, msg: Message) {
        if self.server.child().map_or(0, |c| c.requests.len()) >= OPEN_AT_SERVER_LIMIT {
            return self.refuse_over_open_limit(msg);
        }
        self.host.overflow_told = false;
        if msg.method() == Some("tools/call") {
            return self.on_host_call(msg);
        }
        let method = method_name(msg.method().unwrap_or_default());
        let Some(child) = self.server.child() else {
            return self.answer_unavailable(msg);
        };
        let epoch = child.epoch.clone();
        let host_id = msg.id().expect("request").to_owned();
        let listing = (method == "tools/list").then(|| {
            let params = msg.params_value();
            params.get("cursor").map(|c| match c.as_str() {
                Some(text) => text.to_string(),
                None => c.to_string(),
            })
        });
        let mut msg = msg;
        let id = self.alloc(OpenRequest::Host {
            host_id: host_id.clone(),
            method: method.clone(),
            call: None,
        });
        if let Some(cursor) = listing {
            let kept = &mut self.host.list_requests;
            if kept.len() >= LIST_REQUESTS_KEPT {
                kept.pop_front();
            }
            kept.push_back((id, cursor));
        }
        if method == "subscriptions/listen" {
            let params = msg.params_value();
            let tools = protocol::ListenFilter::of(&params).tools;
            match self
                .host
                .listens
                .iter_mut()
                .find(|l| l.host_id.get() == host_id.get())
            {
                Some(l) => l.child_id = Some(id),
                None => self.host.listens.push(Listen {
                    host_id: host_id.clone(),
                    params,
                    child_id: Some(id),
                    tools,
                    server_part: true,
                    acknowledged: false,
                }),
            }
        }
        msg.set_id(envelope::numeric_id(id));
        self.send_child(&epoch, &msg);
    }

    fn on_host_notification(&mut self, msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        match method.as_str() {
            "notifications/initialized" => {
                self.host.initialized = true;
                match self.server.child() {
                    Some(c) if c.phase == ChildPhase::AwaitingInitialized => {
                        let epoch = c.epoch.clone();
                        self.send_child(&epoch, &msg);
                        self.fetch_tools(Audience::Host);
                    }
                    // A server that got the host's own `initialize` past its handshake (see
                    // `initialize_to_server`) waits for this, as it would directly.
                    Some(c) if c.phase.is_up() => {
                        let epoch = c.epoch.clone();
                        self.send_child(&epoch, &msg);
                    }
                    _ => {}
                }
            }
            "notifications/cancelled" => self.on_host_cancel(&msg),
            m if crate::wire::proxy::envelope::is_notification_method(m) => {
                if let Some(c) = self.server.child()
                    && c.phase != ChildPhase::Started
                {
                    let epoch = c.epoch.clone();
                    self.send_child(&epoch, &msg);
                }
            }
            // A request without an id (`tools/call` among them) is not a notification the server
            // may act on: it would bypass the gate and the audit log. Dropped and reported.
            other => {
                let shown: String = other.chars().take(64).collect();
                self.step
                    .out
                    .status(StatusEvent::HostRequestWithoutId { method: shown });
            }
        }
    }

    /// `subscriptions/listen` requests held for the server (they open streams once released).
    fn held_listens(&self) -> usize {
        self.host
            .held
            .iter()
            .filter(|h| h.msg.method() == Some("subscriptions/listen"))
            .count()
    }

    /// A stream with this id is open, or a listen with it waits for the server.
    fn listen_id_taken(&self, id: &str) -> bool {
        self.host.listens.iter().any(|l| l.host_id.get() == id)
            || self.host.held.iter().any(|h| {
                h.msg.method() == Some("subscriptions/listen")
                    && h.msg.id().is_some_and(|i| i.get() == id)
            })
    }

    fn on_host_cancel(&mut self, msg: &Message) {
        let params = msg.params_value();
        let Some(req) = params.get("requestId") else {
            return;
        };
        let req_text = req.to_string();
        let epoch = self.current_epoch().map(EpochId::from);
        let found = self.requests().find_map(|(id, p)| match p {
            OpenRequest::Host { host_id, .. } if host_id.get() == req_text => {
                Some((*id, epoch.clone()?))
            }
            _ => None,
        });
        // A listen stream the host ends is gone, whoever served it.
        self.host.listens.retain(|l| l.host_id.get() != req_text);
        // A call waiting for an approval prompt: the prompt is closed, nothing is granted.
        self.drop_prompt_of_call(&req_text);
        if let Some((id, epoch)) = found {
            let mut params = params.clone();
            params["requestId"] = json!(id);
            if let Some(OpenRequest::Host {
                call: Some(call), ..
            }) = self.request(id)
            {
                let line = StatusEvent::HostCancelled {
                    tool: call.tool.to_string(),
                    call_id: call.call_id.to_string(),
                };
                self.step.out.verbose(line);
            }
            self.step.out.notify_child(
                &epoch,
                envelope::notification_line("notifications/cancelled", Some(&params)),
            );
            // The host expects no answer now, and a server that follows the spec sends none:
            // kept, the entry would stay for the whole epoch (and be answered at its end). A
            // call's late answer is still recorded (bounded: the newest `CANCELLED_KEPT`).
            if let Some(OpenRequest::Host {
                call: Some(call), ..
            }) = self.take_request(id)
            {
                // Its closing record, unless the server answers anyway (`tool_result` then).
                self.audit_record(
                    audit::CALL_CANCELLED,
                    Some(epoch.as_str()),
                    records::data(&records::CallCancelled {
                        call_id: json!(call.call_id),
                        tool: call.tool.clone(),
                    }),
                );
                let kept = &mut self.host.cancelled_calls;
                if kept.len() >= CANCELLED_KEPT {
                    kept.pop_front();
                }
                kept.push_back((id, epoch, call));
            }
            return;
        }
        // A held request the host gave up on is dropped (never forwarded later).
        self.host
            .held
            .retain(|h| h.msg.id().map(|i| i.get()) != Some(req_text.as_str()));
    }

    fn on_host_response(&mut self, mut msg: Message) {
        // String ids: approval prompts (the relayed server requests have numeric ids).
        if let Some(text) = msg.id().map(|i| i.get().to_string())
            && text.starts_with('"')
            && self.on_prompt_answer(&text, &msg)
        {
            return;
        }
        let Some(id) = msg.id().and_then(envelope::parse_numeric_id) else {
            self.step.out.status(StatusEvent::HostAnsweredNobody);
            return;
        };
        let Some((epoch, child_id)) = self.host.server_requests.open.remove(&id) else {
            self.step
                .out
                .verbose(StatusEvent::HostAnsweredReplaced { id });
            return;
        };
        self.host.server_requests.overflow_told = false;
        if self.current_epoch() != Some(epoch.as_str()) {
            return;
        }
        self.host.server_requests.ended(child_id.clone());
        msg.set_id(child_id);
        self.send_child(&epoch, &msg);
    }

    /// Moves a fresh child through the handshake as far as what the host has said allows.
    pub(super) fn advance_child(&mut self) {
        let Some(child) = self.server.child() else {
            return;
        };
        if child.phase != ChildPhase::Started {
            return;
        }
        let epoch = child.epoch.clone();
        match self.host.era {
            None => {} // wait for the host's first message
            // A host `initialize` still waiting rides on it (the server's own answer).
            Some(Era::Legacy) => self.handshake_legacy(epoch),
            Some(Era::Modern) => {
                let params = json!({"_meta": self.host.modern_meta.clone().unwrap_or(json!({}))});
                self.send_handshake(epoch, true, &params);
            }
        }
    }

    /// A modern stream that asks only for tool-list changes: the supervisor announces those
    /// (it advertised `tools.listChanged`), so it acknowledges the stream itself, whether or not
    /// a server is up or serves `subscriptions/listen` at all (rmcp's default does not).
    fn open_supervisor_listen(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        if self
            .host
            .listens
            .iter()
            .any(|l| l.host_id.get() == host_id.get())
        {
            let why = "a subscriptions/listen stream with this id is already open";
            self.step
                .out
                .to_host(envelope::error_line(Some(&host_id), -32600, why, json!({})));
            return;
        }
        let host_id_text = host_id.get().to_string();
        self.host.listens.push(Listen {
            host_id,
            params: msg.params_value(),
            child_id: None,
            tools: true,
            server_part: false,
            acknowledged: false,
        });
        self.acknowledge_supervisor_listen(&host_id_text);
    }

    /// Our acknowledgement of the tool-list part of a host stream (honoured: tools only).
    pub(super) fn acknowledge_supervisor_listen(&mut self, host_id_text: &str) {
        let Some(l) = self
            .host
            .listens
            .iter_mut()
            .find(|l| l.host_id.get() == host_id_text)
        else {
            return;
        };
        if l.acknowledged {
            return;
        }
        l.acknowledged = true;
        let sid: Value = serde_json::from_str(host_id_text).unwrap_or(Value::Null);
        let params = protocol::listen_ack_params(&sid, json!({"toolsListChanged": true}));
        self.step.out.notify_host(envelope::notification_line(
            "notifications/subscriptions/acknowledged",
            Some(&params),
        ));
        self.after_listen_acknowledged(&sid, true);
    }

    /// A stream opened while the host held an outdated view hears about the current catalog
    /// right after its acknowledgement.
    pub(super) fn after_listen_acknowledged(&mut self, sid: &Value, wants_tools: bool) {
        if wants_tools && self.host_list_outdated() {
            let params = json!({"_meta": {protocol::SUBSCRIPTION_ID: sid}});
            self.step.out.notify_host(envelope::notification_line(
                "notifications/tools/list_changed",
                Some(&params),
            ));
        }
    }

    /// `list_changed` to the host, on every stream that asked for it (modern) or plainly.
    pub(super) fn notify_list_changed(&mut self) {
        self.host.notified_revision = self.catalogs.history.current().map(|r| r.number);
        match self.era() {
            Some(Era::Modern) => {
                let targets: Vec<Value> = self
                    .host
                    .listens
                    .iter()
                    .filter(|l| l.tools && l.acknowledged)
                    .map(|l| serde_json::from_str(l.host_id.get()).unwrap_or(Value::Null))
                    .collect();
                for sid in targets {
                    let params = json!({"_meta": {protocol::SUBSCRIPTION_ID: sid}});
                    self.step.out.notify_host(envelope::notification_line(
                        "notifications/tools/list_changed",
                        Some(&params),
                    ));
                }
            }
            _ => self.step.out.notify_host(envelope::notification_line(
                "notifications/tools/list_changed",
                None,
            )),
        }
    }
}

/// A request's method as kept with its pending entry: no copy for the methods hosts send most.
fn method_name(method: &str) -> std::borrow::Cow<'static, str> {
    const COMMON: [&str; 7] = [
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "subscriptions/listen",
    ];
    match COMMON.iter().find(|m| **m == method) {
        Some(m) => std::borrow::Cow::Borrowed(m),
        None => std::borrow::Cow::Owned(method.to_string()),
    }
}
