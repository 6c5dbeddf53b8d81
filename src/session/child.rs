//! Child room: every line the server writes on its stdout.
//!
//! Owns: mapping the server's answers back to the host's ids, the server's own requests and
//! notifications (re-tagged for the host), the handshake result of each new server and whether
//! it can continue the host's connection, and what happens to non-JSON or oversized output.
//! Must not touch: gating, held-request policy, I/O (effects are data: `effect`).

use serde_json::{Value, json};

use super::*;
use crate::audit::records;
use crate::wire::proxy::envelope::{self, Kind, Message};

impl Session {
    pub(super) fn on_child_line(&mut self, epoch: &str, line: Vec<u8>) {
        if self.current_epoch() != Some(epoch) {
            return; // late output of a replaced child
        }
        // The last list answer again, but for its id: not read a second time (large catalogs).
        let known = match &self.catalogs.list_answer {
            Some(last) => last.with_other_id(line),
            None => Err(line),
        };
        let msg = match known {
            Ok(m) => m,
            Err(line) => match Message::parse_owned(line) {
                Ok(m) => m,
                Err(unreadable) => return self.on_child_garbage(epoch, &unreadable.line),
            },
        };
        match msg.kind() {
            Kind::Response => self.on_child_response(epoch, msg),
            Kind::Request => {
                let child_id = msg.id().expect("request").to_owned();
                if self.host.server_requests.open.len() >= OPEN_AT_HOST_LIMIT {
                    self.refuse_server_request(epoch, &child_id);
                    return self.host.server_requests.ended(child_id);
                }
                let host_id = self.step.next_id;
                self.step.next_id += 1;
                self.host
                    .server_requests
                    .open
                    .insert(host_id, (EpochId::from(epoch), child_id));
                let mut msg = msg;
                msg.set_id(envelope::numeric_id(host_id));
                self.send_host(&msg);
            }
            Kind::Notification => self.on_child_notification(msg),
        }
    }

    /// The server has [`OPEN_AT_HOST_LIMIT`] requests the host has not answered: this one is
    /// answered to the server at once and never reaches the host (a server that floods the
    /// host with requests cannot grow the session without bound).
    fn refuse_server_request(&mut self, epoch: &str, child_id: &RawIdText) {
        if !std::mem::replace(&mut self.host.server_requests.overflow_told, true) {
            self.step.out.status(StatusEvent::TooManyServerRequests {
                limit: OPEN_AT_HOST_LIMIT,
                label: self.label().to_string(),
                epoch: crate::identity::epoch::short(epoch).to_string(),
            });
        }
        let why = format!("more than {OPEN_AT_HOST_LIMIT} requests to the host are unanswered");
        let line = envelope::error_line(
            Some(child_id),
            codes::TOO_MANY_OPEN,
            &why,
            json!({"error": "too_many_open", "limit": OPEN_AT_HOST_LIMIT}),
        );
        self.step.out.to_child(epoch, line);
    }

    /// Not JSON-RPC (a stray `println!`, invalid UTF-8): never forwarded. If it names one of
    /// our request ids, that request is answered so the host never waits forever.
    fn on_child_garbage(&mut self, epoch: &str, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let cut: String = text.chars().take(200).collect();
        self.step.out.status(StatusEvent::ServerNonJson {
            text: cut,
            cut: text.chars().count() > 200,
            label: self.label().to_string(),
            epoch: crate::identity::epoch::short(epoch).to_string(),
        });
        let id = protocol::recover_id(line).and_then(|r| envelope::parse_numeric_id(&r));
        if let Some(id) = id
            && matches!(self.request(id), Some(OpenRequest::CatalogPage))
        {
            // The supervisor's own fetch must end too, or every request waits behind it.
            self.take_request(id);
            return self.catalog_page_failed(epoch, "was not valid JSON");
        }
        if let Some(id) = id
            && matches!(self.request(id), Some(OpenRequest::Host { .. }))
        {
            self.answer_broken(
                id,
                "the server's answer was not valid JSON",
                json!({"error": "invalid_response"}),
            );
        }
    }

    /// Answers one pending host request that the server's output cannot answer.
    fn answer_broken(&mut self, id: u64, why: &str, payload: Value) {
        let carried = self.take_initialize_carried_by(id);
        let Some(OpenRequest::Host { host_id, call, .. }) = self.take_request(id) else {
            // Our handshake carrying the host's `initialize`: the server's answer is broken,
            // so the host gets that, as the server's (once: it is answered now).
            if let Some(init) = carried {
                self.step.out.to_host(envelope::error_line(
                    Some(&init.host_id),
                    codes::SERVER_UNAVAILABLE,
                    why,
                    payload,
                ));
            }
            return;
        };
        if let Some(call) = call {
            let result = self.tool_error(&payload, &format!("{why}; the call may have run."));
            self.audit_record(
                audit::TOOL_RESULT,
                self.current_epoch().map(str::to_string).as_deref(),
                tool_result(records::ToolResult {
                    call_id: json!(call.call_id),
                    tool: call.tool,
                    is_error: true,
                    duration_ms: Some(0),
                }),
            );
            self.step
                .out
                .to_host(envelope::result_line(&host_id, &result));
        } else {
            self.step.out.to_host(envelope::error_line(
                Some(&host_id),
                codes::SERVER_UNAVAILABLE,
                why,
                payload,
            ));
        }
    }

    fn on_child_notification(&mut self, mut msg: Message) {
        let method = msg.method().unwrap_or_default().to_string();
        let params = msg.params_value();
        if method == "notifications/tools/list_changed" {
            // Same epoch, new catalog: refetch; the host hears about it only if the digest moved.
            if self.child_ready() {
                self.fetch_tools(Audience::Host);
            } else if let Some(f) = self.server.child_mut().and_then(|c| c.phase.fetch_mut()) {
                // What it brings is news to the host, whatever started it.
                f.audience = Audience::Host;
                f.change = ChangeDuringFetch::Announced;
            }
            return;
        }
        if let Some(sid) = params.pointer(&format!(
            "/_meta/{}",
            protocol::SUBSCRIPTION_ID.replace('/', "~1")
        )) {
            // Re-tag with the host's listen id; a repeated acknowledgement after a restart is ours.
            let Some(our) = sid.as_u64() else { return };
            let Some(l) = self
                .host
                .listens
                .iter_mut()
                .find(|l| l.child_id == Some(our))
            else {
                return;
            };
            let host_sid: Value = serde_json::from_str(l.host_id.get()).unwrap_or(Value::Null);
            let wants_tools = l.tools;
            let mut params = params.clone();
            params["_meta"][protocol::SUBSCRIPTION_ID] = host_sid.clone();
            if method == "notifications/subscriptions/acknowledged" {
                if l.acknowledged {
                    return;
                }
                l.acknowledged = true;
                if wants_tools {
                    // Tool-list changes are ours to send, whatever the server honours.
                    if !params["notifications"].is_object() {
                        params["notifications"] = json!({});
                    }
                    params["notifications"]["toolsListChanged"] = json!(true);
                }
                msg.set_params(&params);
                self.send_host(&msg);
                self.after_listen_acknowledged(&host_sid, wants_tools);
                return;
            }
            msg.set_params(&params);
        }
        if method == "notifications/cancelled"
            && let Some(req) = params.get("requestId")
        {
            // A cancellation names a request its sender issued: the child's own request to the
            // host goes out under the id the host saw.
            let req_text = req.to_string();
            let ours = self
                .host
                .server_requests
                .open
                .iter()
                .find(|(_, (_, child_id))| child_id.get() == req_text)
                .map(|(host_id, _)| *host_id);
            if let Some(host_facing) = ours {
                if let Some((_, child_id)) = self.host.server_requests.open.remove(&host_facing) {
                    self.host.server_requests.ended(child_id);
                }
                self.host.server_requests.overflow_told = false;
                let mut params = params.clone();
                params["requestId"] = json!(host_facing);
                msg.set_params(&params);
                self.send_host(&msg);
                return;
            }
            // A late cancellation of its own request, already answered: ignored (as the spec
            // says), not read as one of the host's requests under the same number.
            let answered = &self.host.server_requests.answered;
            if answered.iter().any(|id| id.get() == req_text) {
                return;
            }
            // The server ends one of the host's requests, which it knows under our id.
            if let Some(our) = req.as_u64() {
                match self.request(our) {
                    Some(OpenRequest::Host {
                        method, host_id, ..
                    }) if method == "subscriptions/listen" => {
                        // 2026-07-28: a listen stream ends with a cancellation.
                        let host_id_text = host_id.get().to_string();
                        self.take_request(our);
                        let mut params = params.clone();
                        params["requestId"] =
                            serde_json::from_str(&host_id_text).unwrap_or(Value::Null);
                        self.host
                            .listens
                            .retain(|l| l.host_id.get() != host_id_text);
                        msg.set_params(&params);
                        self.send_host(&msg);
                    }
                    Some(OpenRequest::Host { .. }) => {
                        // Every host request gets exactly one answer: this one, an error.
                        self.answer_broken(
                            our,
                            "the server cancelled this request",
                            json!({"error": "cancelled_by_server"}),
                        );
                    }
                    Some(OpenRequest::CatalogPage) => {
                        // Our own fetch must end too, or every request waits behind it.
                        self.take_request(our);
                        let epoch = self.current_epoch().unwrap_or_default().to_string();
                        self.catalog_page_failed(&epoch, "was cancelled by the server");
                    }
                    _ => {}
                }
            }
            return;
        }
        self.send_host(&msg);
    }

    fn on_child_response(&mut self, epoch: &str, mut msg: Message) {
        let Some(id) = msg.id().and_then(envelope::parse_numeric_id) else {
            self.step.out.status(StatusEvent::ServerUnknownId);
            return;
        };
        let Some(p) = self.take_request(id) else {
            self.record_cancelled_call_result(epoch, id, &msg);
            return;
        };
        match p {
            OpenRequest::Host {
                host_id,
                method,
                call,
                ..
            } => {
                if method == "subscriptions/listen" && self.server_refused_listen(&host_id, &msg) {
                    return;
                }
                if method == "subscriptions/listen" {
                    self.host
                        .listens
                        .retain(|l| l.host_id.get() != host_id.get());
                }
                // Compared once: the answer is the list the host was last shown, byte for byte.
                let known_list = method == "tools/list"
                    && !msg.is_error()
                    && self.is_known_list_result(msg.result());
                if method == "tools/list"
                    && !msg.is_error()
                    && !known_list
                    && envelope::list_result_parts(msg.result()).is_none()
                {
                    // A list we cannot read (not an object, `tools` named twice…) would reach
                    // the host unrecorded, its parser picking one of the lists: not forwarded.
                    self.step.out.status(StatusEvent::ServerListUnreadable);
                    self.step.out.to_host(envelope::error_line(
                        Some(&host_id),
                        codes::UNKNOWN_RESPONSE,
                        "the server's tools/list answer is not a readable tool list",
                        json!({"error": "invalid_response"}),
                    ));
                    return;
                }
                // A call's result goes out first and is recorded right after (the same lock
                // hold; the intent record is what must precede, and did): the host is not kept
                // waiting for a seal and a file write on the way back.
                let result_record = call.map(|call| {
                    let is_error = msg.is_error() || envelope::result_is_error(msg.result());
                    let now = self.now();
                    tool_result(records::ToolResult {
                        call_id: json!(call.call_id),
                        tool: call.tool,
                        is_error,
                        duration_ms: Some(now.saturating_sub(call.started_ms)),
                    })
                });
                if method == "server/discover" && !msg.is_error() {
                    let mut result = msg.result_value();
                    protocol::advertise_list_changed(&mut result);
                    // What the host now holds: a later server must keep to it.
                    let version = self
                        .host
                        .modern_meta
                        .as_ref()
                        .and_then(|m| m.get(protocol::PROTOCOL_VERSION))
                        .and_then(|v| v.as_str())
                        .unwrap_or(protocol::MODERN_VERSION)
                        .to_string();
                    self.host.negotiated = Some(Negotiated {
                        protocol_version: version,
                        capabilities: result.get("capabilities").cloned().unwrap_or(json!({})),
                        from_record: false,
                    });
                    msg.set_result(&result);
                }
                // Sent with the host's id; `msg` keeps the server's (one copy of a large answer).
                self.step.out.to_host(msg.to_line_with_id(&host_id));
                if let Some(record) = result_record {
                    self.audit_record(audit::TOOL_RESULT, Some(epoch), record);
                }
                if method == "tools/list" {
                    // Forwarded first: what the host was shown is worked out after.
                    self.observe_host_list(&msg, known_list, id);
                    if !msg.is_error() {
                        self.catalogs.list_answer = Some(msg);
                    }
                }
            }
            OpenRequest::Handshake { modern, asked, .. } => {
                self.on_handshake_result(epoch, id, msg, modern, asked)
            }
            OpenRequest::CatalogPage => self.on_catalog_page(epoch, &msg),
            // The host's own `initialize`, passed to a server past its handshake.
            OpenRequest::ForwardedInitialize => self.on_initialize_answer(epoch, id, &msg),
        }
    }

    fn on_handshake_result(
        &mut self,
        epoch: &str,
        id: u64,
        msg: Message,
        modern: bool,
        asked: Option<String>,
    ) {
        let answer = self.take_initialize_carried_by(id);
        if msg.is_error() && modern {
            // It may speak only `initialize`: the host hears its refusal and falls back.
            self.step.out.verbose(StatusEvent::DiscoverRefused);
            return self.discovery_failed(Some(&msg));
        }
        if msg.is_error() {
            // Its own words, bounded and printable: they reach the terminal and the host.
            let said: String = String::from_utf8_lossy(&msg.to_line())
                .trim()
                .chars()
                .take(300)
                .collect();
            if let Some(w) = answer {
                let mut m = msg;
                m.set_id(w.host_id);
                self.send_host(&m);
            }
            // It cannot serve this host: held requests are answered with why, not held again.
            return self.server_cannot_serve(format!(
                "refused the handshake: {}",
                crate::screen::sanitize::line(&said)
            ));
        }
        let mut result = msg.result_value();
        let version = result
            .get("protocolVersion")
            .and_then(|v| v.as_str())
            .unwrap_or(protocol::MODERN_VERSION)
            .to_string();
        let caps = result.get("capabilities").cloned().unwrap_or(json!({}));
        if !modern {
            self.record_handshake(epoch, asked.as_deref(), &result);
        }
        match (self.host.negotiated.clone(), answer) {
            (_, Some(w)) => {
                protocol::advertise_list_changed(&mut result);
                self.host.negotiated = Some(Negotiated {
                    protocol_version: version,
                    capabilities: result["capabilities"].clone(),
                    from_record: false,
                });
                self.step
                    .out
                    .to_host(envelope::result_line(&w.host_id, &result));
            }
            (Some(n), None) if n.from_record && !modern => {
                // The host holds a recorded answer of this package: the version is binding.
                // As the server said it (no default for a missing version: a version nobody
                // said must not be named in the status line).
                let said = result.get("protocolVersion").and_then(Value::as_str);
                if said != Some(n.protocol_version.as_str()) {
                    let told =
                        crate::screen::sanitize::first_chars(&n.protocol_version, 40).to_string();
                    let now = said.map_or("no protocol version".to_string(), |v| {
                        crate::screen::sanitize::first_chars(v, 40).to_string()
                    });
                    self.close_connection(&format!(
                        "protocol version changed: the host was given protocol {told} (recorded from an earlier build of this server) while the server was building, but the new build answers {now} (did its MCP SDK change?); reconnect the server in the host"
                    ));
                    return;
                }
                let norm = |c: &Value| protocol::capabilities_without_list_changed(c);
                if norm(&n.capabilities) != norm(&caps) {
                    self.step.out.status(StatusEvent::CapabilitiesDiffer {
                        capabilities: norm(&caps).to_string(),
                    });
                }
                if let Some(n) = &mut self.host.negotiated {
                    n.from_record = false;
                }
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
                    self.close_connection(&format!(
                        "the new server {why} (negotiated: {}); the host must reconnect",
                        n.protocol_version
                    ));
                    return;
                }
            }
            (None, None) => {}
        }
        // A host `initialize` that waits (it arrived during this handshake, which did not carry
        // it): the server answers it, as on a direct connection.
        self.initialize_to_server();
        if modern {
            self.reopen_listens(epoch);
            self.fetch_tools(Audience::Host);
        } else if self.host.initialized {
            self.step.out.notify_child(
                epoch,
                envelope::notification_line("notifications/initialized", None),
            );
            self.fetch_tools(Audience::Host);
        } else if let Some(c) = self.server.child_mut() {
            c.phase.initialized();
        }
    }

    /// The server answered a host stream with an error (rmcp's default answers "method not
    /// found"): if the host asked for tool-list changes, the supervisor's part of the stream
    /// stays open and the error is not passed on. Returns whether it was absorbed.
    fn server_refused_listen(&mut self, host_id: &RawId, msg: &Message) -> bool {
        if !msg.is_error() {
            return false;
        }
        let Some(l) = self
            .host
            .listens
            .iter_mut()
            .find(|l| l.host_id.get() == host_id.get())
        else {
            return false;
        };
        if !l.tools {
            return false;
        }
        l.server_part = false;
        l.child_id = None;
        // A stream reopened at a new server that refuses it: the host's acknowledgement named
        // what the old server sent; it is acknowledged again with the supervisor's part only.
        l.acknowledged = false;
        self.step.out.verbose(StatusEvent::ListenNotServed);
        let text = host_id.get().to_string();
        self.acknowledge_supervisor_listen(&text);
        true
    }

    fn reopen_listens(&mut self, epoch: &str) {
        let listens: Vec<(String, Value)> = self
            .host
            .listens
            .iter()
            .filter(|l| l.server_part && l.child_id.is_none())
            .map(|l| (l.host_id.get().to_string(), l.params.clone()))
            .collect();
        for (host_id_text, params) in listens {
            let host_id = serde_json::value::RawValue::from_string(host_id_text.clone())
                .expect("valid raw id");
            let id = self.alloc(OpenRequest::Host {
                host_id,
                method: "subscriptions/listen".into(),
                call: None,
            });
            if let Some(l) = self
                .host
                .listens
                .iter_mut()
                .find(|l| l.host_id.get() == host_id_text)
            {
                l.child_id = Some(id);
            }
            self.step.out.to_child(
                epoch,
                envelope::request_line(id, "subscriptions/listen", &params),
            );
        }
    }

    pub(super) fn on_child_oversize(&mut self, epoch: &str, prefix: &[u8], len: usize) {
        self.step.out.status(StatusEvent::ServerOversize {
            len,
            label: self.label().to_string(),
            epoch: crate::identity::epoch::short(epoch).to_string(),
        });
        // If it was an answer, its requester must not hang.
        if let Some(id) = protocol::recover_id(prefix).and_then(|r| envelope::parse_numeric_id(&r))
        {
            if matches!(self.request(id), Some(OpenRequest::CatalogPage)) {
                self.take_request(id);
                return self.catalog_page_failed(epoch, "was over the line limit");
            }
            self.answer_broken(
                id,
                "the server's answer was larger than the line limit and was dropped",
                json!({"error": "message_too_large", "bytes": len}),
            );
        }
    }
}

/// A `tool_result` record's data: encoded directly; a call id the chain cannot encode (never
/// produced here: ids are kept as their JSON text) falls back to the tree, whose append then
/// reports it.
impl Session {
    /// The late answer of a call the host cancelled: it ran, so its outcome is recorded; the
    /// host, which gave it up, is not told.
    fn record_cancelled_call_result(&mut self, epoch: &str, id: u64, msg: &Message) {
        let kept = &mut self.host.cancelled_calls;
        let Some(at) = kept.iter().position(|(i, e, _)| *i == id && e == epoch) else {
            return;
        };
        let Some((_, _, call)) = kept.remove(at) else {
            return;
        };
        let now = self.now();
        let record = tool_result(records::ToolResult {
            call_id: json!(call.call_id),
            tool: call.tool,
            is_error: msg.is_error() || envelope::result_is_error(msg.result()),
            duration_ms: Some(now.saturating_sub(call.started_ms)),
        });
        self.audit_record(audit::TOOL_RESULT, Some(epoch), record);
    }
}

fn tool_result(r: records::ToolResult) -> RecordData {
    r.canonical()
        .unwrap_or_else(|_| RecordData::Tree(records::data(&r)))
}

impl Session {
    /// A peer's message on to the host (a notification may be dropped under backlog; requests
    /// and responses never are).
    pub(super) fn send_host(&mut self, msg: &Message) {
        if msg.kind() == &Kind::Notification {
            self.step.out.notify_host(msg.to_line());
        } else {
            self.step.out.to_host(msg.to_line());
        }
    }

    /// A host message on to the server of `epoch` (as [`Session::send_host`]).
    pub(super) fn send_child(&mut self, epoch: &str, msg: &Message) {
        if msg.kind() == &Kind::Notification {
            self.step.out.notify_child(epoch, msg.to_line());
        } else {
            self.step.out.to_child(epoch, msg.to_line());
        }
    }
}
