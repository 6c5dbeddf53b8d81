//! Router room: one `tools/call` from the host, judged and then forwarded or refused.
//!
//! Owns: asking the gate, the audit records around a call (`authorization_denied`, and
//! `tool_called` written before the call is forwarded), the refusal a model can read, and a
//! stale call's result carrying the tool's current definition and the diff from what this host
//! was shown (itself a presentation of the new definition, recorded as such). Must not touch:
//! the rules themselves (the gate), I/O (effects are data: `effect`).

use serde_json::{Value, json};

use super::*;
use crate::audit::records;
use crate::base::hashing;
use crate::policy::approval::{CallDecision, Channel, CheckedCall, Denial, DenialReason};
use crate::policy::catalog::{self, Catalog};
use crate::wire::proxy::envelope::{self, Message};

impl Session {
    pub(super) fn on_host_call(&mut self, msg: Message) {
        // 2026-07-28: the retry of a call answered with the approval form carries its answer
        // (a substring test first: most calls carry no `requestState` at all).
        let may_be_retry = self.era() == Some(Era::Modern)
            && msg
                .params()
                .is_some_and(|p| p.get().contains("\"requestState\""));
        let msg = if may_be_retry {
            match self.on_prompt_retry(msg) {
                Some(call) => call,
                None => return,
            }
        } else {
            msg
        };
        // A server whose first list failed (`catalog_unknown`): its tools are asked for again
        // (at most every `CATALOG_RETRY_MS`), and the call waits for them, at most its hold: a
        // host that never lists again still gets its calls judged once the server lists.
        let now = self.now();
        if let Some(wait) = self.hold_budget()
            && let Some(c) = self.server.child_mut()
            && let ChildPhase::Up(Tools::Unknown { asked_ms }) = &mut c.phase
            && asked_ms.is_none_or(|at| now >= at + CATALOG_RETRY_MS)
        {
            *asked_ms = Some(now);
            self.fetch_tools(Audience::Host);
            return self.hold(msg, wait);
        }
        self.judge_call(msg, true)
    }

    /// Judges one call. With `may_prompt`, a call refused for lack of a grant may wait for an
    /// answer in the host instead (`approvals`); a call judged again after that answer may not.
    pub(super) fn judge_call(&mut self, mut msg: Message, may_prompt: bool) {
        let host_id = msg.id().expect("request").to_owned();
        let Some((tool, arguments)) = envelope::call_target(msg.params()) else {
            return self.refuse_call_without_target(&host_id);
        };
        // Digest of the arguments exactly as the host sent them (never their values).
        let args_digest =
            hashing::sha256_bytes(arguments.map(|a| a.get()).unwrap_or("null").as_bytes());
        let call_id = host_id.get().to_string();
        if self.current_epoch().is_none()
            && matches!(
                self.lifecycle,
                Lifecycle::BuildBroken { .. }
                    | Lifecycle::StartFailed { .. }
                    | Lifecycle::CrashLoop
                    | Lifecycle::Stopping
            )
        {
            return self.refuse_unavailable_call(&host_id, &tool);
        }
        let wall = self.step.now.wall_ms;
        // The tool's definition in the current catalog: the gate checks the arguments against
        // its input schema (compiled once per definition).
        let call = self.catalogs.history.catalog().and_then(|c| {
            Some(CheckedCall {
                arguments: arguments.map(|a| a.get()),
                definition: c.tool(&tool)?,
                digest: c.tool_digests().get(&tool)?,
            })
        });
        let decision = self.approvals.gate.decide_call_checked(
            serving(&self.server, &self.catalogs),
            &tool,
            Some(&args_digest),
            call,
            wall,
        );
        if let Some(notices) = self.approvals.gate.take_input_notices() {
            self.tell_unchecked_schemas(notices);
        }
        match decision {
            CallDecision::Deny(denial) => {
                let epoch_now = self.current_epoch().map(str::to_string);
                let mut payload = denial.payload();
                let mut hint = denial.human_hint();
                if denial.reason == DenialReason::CatalogStale {
                    hint = self.present_current_definition(&denial, &mut payload);
                } else if denial.reason == DenialReason::ArgumentsInvalid {
                    hint = self.present_definition_for_arguments(&denial, &mut payload);
                }
                let needs_grant = matches!(
                    denial.reason,
                    DenialReason::AuthorizationRequired | DenialReason::AuthorizationStale
                ) || denial.authorization.is_some();
                if needs_grant {
                    let raw = arguments.map(|a| a.get()).unwrap_or("null").to_string();
                    self.remember_denied_call(DeniedCallRecord {
                        call_id: call_id.clone(),
                        tool: tool.clone(),
                        arguments_digest: args_digest.clone(),
                        arguments_preview: raw.chars().take(ARGUMENTS_PREVIEW).collect(),
                        arguments_truncated: raw.chars().nth(ARGUMENTS_PREVIEW).is_some(),
                        epoch: denial.current_epoch.clone(),
                        reason: denial.reason.as_str().into(),
                    });
                    if may_prompt {
                        match self.try_prompt(msg, &denial, &call_id, &args_digest, &raw) {
                            Ok(()) => return, // the call waits for the host's answer
                            Err(_call) => {}
                        }
                    }
                }
                let channel = if self.approval_channels().contains(&Channel::Terminal) {
                    Channel::Terminal
                } else {
                    Channel::Host
                };
                let record = records::AuthorizationDenied {
                    call_id: json!(call_id),
                    tool: tool.clone(),
                    reason: denial.reason.as_str().into(),
                    approved_epoch: denial.approved_epoch.as_deref().map(str::to_string),
                    current_epoch: denial.current_epoch.as_deref().map(str::to_string),
                    arguments_digest: Some(args_digest.clone()),
                    channel: needs_grant.then(|| channel.as_str().to_string()),
                    outcome: None,
                    mismatches: (denial.reason == DenialReason::ArgumentsInvalid)
                        .then(|| denial.mismatches.iter().map(|m| m.describe()).collect()),
                };
                self.audit_record(
                    audit::AUTHORIZATION_DENIED,
                    epoch_now.as_deref(),
                    records::data(&record),
                );
                // Backticks escaped too: a command in backticks on this line is only ever ours
                // (a tool named "x` (or `cargo mcp-dev approve --yes …" cannot fake one).
                let shown_tool: String = tool
                    .chars()
                    .take(128)
                    .collect::<String>()
                    .escape_debug()
                    .to_string()
                    .replace('`', "\\`");
                // The id is the agent's: suggested only as a word the shell cannot expand.
                let approve_command =
                    needs_grant.then(|| crate::screen::sanitize::approve_call_command(&call_id));
                self.step.out.status(StatusEvent::CallDenied {
                    tool: shown_tool,
                    reason: denial.reason.as_str().to_string(),
                    hint: denial.human_hint().to_string(),
                    approve_command,
                });
                self.step.out.to_host(envelope::result_line(
                    &host_id,
                    &self.tool_error(&payload, &hint),
                ));
                self.publish();
            }
            CallDecision::Forward {
                grant_id,
                grant_kind,
                credential_scopes,
            } => {
                let epoch = match self.server.child() {
                    Some(c) => c.epoch.clone(),
                    _ => return, // unreachable: the gate says identity_pending without a child
                };
                let shown_revision = self
                    .approvals
                    .gate
                    .host_shown(&tool)
                    .and_then(|s| s.revision);
                // Written before the call reaches the server: the shell writes the step's
                // records before its lines, and drops the call if they cannot be written
                // (then `Event::AuditFailed` answers it).
                let record = records::ToolCalled {
                    call_id: json!(call_id),
                    tool: tool.clone(),
                    grant: grant_id.map(|g| g.to_string()),
                    grant_kind: grant_kind.map(|k| k.as_str().to_string()),
                    credential_scopes,
                    arguments_digest: Some(args_digest),
                    shown_revision,
                };
                let data = match record.canonical() {
                    Ok(data) => data,
                    Err(e) => {
                        self.step
                            .out
                            .status(StatusEvent::CallsRefusedAuditUnavailable {
                                calls: 1,
                                why: e.to_string(),
                            });
                        let payload = json!({"error": "audit_failed", "reason": e.to_string(), "retry": "fix the audit log, then call again"});
                        let result = self.tool_error(&payload, "The call was not forwarded because it could not be written to the audit log.");
                        self.step
                            .out
                            .to_host(envelope::result_line(&host_id, &result));
                        return;
                    }
                };
                self.audit_record(audit::TOOL_CALLED, Some(&epoch), data);
                let started_ms = self.now();
                let id = self.alloc(OpenRequest::Host {
                    host_id,
                    method: "tools/call".into(),
                    call: Some(CallInfo {
                        tool,
                        call_id,
                        started_ms,
                    }),
                });
                msg.set_id(envelope::numeric_id(id));
                self.step.out.call_to_child(&epoch, msg.to_line(), id);
            }
        }
    }

    /// Keeps a call refused for lack of a grant for `approve --call` (bounded; a call id seen
    /// again replaces its older entry).
    fn remember_denied_call(&mut self, record: DeniedCallRecord) {
        self.approvals
            .denied_calls
            .retain(|d| d.call_id != record.call_id);
        if self.approvals.denied_calls.len() == DENIED_CALLS {
            self.approvals.denied_calls.pop_front();
        }
        self.approvals.denied_calls.push_back(record);
    }

    /// A `tools/call` without one tool name to judge (params not an object, `name` missing, not
    /// a string or named twice): never forwarded, since the server's parser could pick a name
    /// nobody judged; answered with invalid params and recorded as a refused call.
    fn refuse_call_without_target(&mut self, host_id: &RawId) {
        let call_id = host_id.get().to_string();
        self.audit_record(
            audit::AUTHORIZATION_DENIED,
            self.current_epoch().map(str::to_string).as_deref(),
            records::data(&records::AuthorizationDenied {
                call_id: json!(call_id),
                reason: "invalid_params".into(),
                ..Default::default()
            }),
        );
        self.step.out.status(StatusEvent::CallWithoutTarget);
        self.step.out.to_host(envelope::error_line(
            Some(host_id),
            -32602,
            "tools/call params must be an object with one string \"name\"",
            json!({"error": "invalid_params"}),
        ));
    }

    /// [`OPEN_AT_SERVER_LIMIT`] requests are open at the server (one that reads and never
    /// answers): this one is answered at once and not forwarded; a call is recorded as refused.
    pub(super) fn refuse_over_open_limit(&mut self, msg: Message) {
        let host_id = msg.id().expect("request").to_owned();
        if !std::mem::replace(&mut self.host.overflow_told, true) {
            self.step.out.status(StatusEvent::TooManyOpenAtServer {
                limit: OPEN_AT_SERVER_LIMIT,
            });
        }
        let why = format!("more than {OPEN_AT_SERVER_LIMIT} requests are open at the server");
        let payload = json!({"error": "too_many_open", "limit": OPEN_AT_SERVER_LIMIT});
        if msg.method() != Some("tools/call") {
            let line = envelope::error_line(Some(&host_id), codes::TOO_MANY_OPEN, &why, payload);
            return self.step.out.to_host(line);
        }
        let tool = envelope::call_target(msg.params())
            .map(|(tool, _)| tool)
            .unwrap_or_default();
        let epoch = self.current_epoch().map(str::to_string);
        let hint = format!("{why}; the call was not run.");
        self.refuse_call_unrun(&host_id, &tool, epoch.as_deref(), payload, &hint);
    }

    /// No server will answer soon (build broken, crash loop, closing): a tool error that says
    /// why, recorded as a refused call.
    fn refuse_unavailable_call(&mut self, host_id: &RawId, tool: &str) {
        let (message, mut payload) = self.unavailable_reason();
        payload["tool"] = json!(tool);
        self.refuse_call_unrun(host_id, tool, None, payload, &format!("{message}."));
    }

    /// A call refused before any judgement (no server to run it, or too many open): recorded
    /// as refused with the payload's `error` as the reason, and answered as a tool error.
    fn refuse_call_unrun(
        &mut self,
        host_id: &RawId,
        tool: &str,
        epoch: Option<&str>,
        payload: Value,
        hint: &str,
    ) {
        let reason = payload["error"].as_str().unwrap_or("server_unavailable");
        self.audit_record(
            audit::AUTHORIZATION_DENIED,
            epoch,
            records::data(&records::AuthorizationDenied {
                call_id: json!(host_id.get()),
                tool: tool.to_string(),
                reason: reason.into(),
                ..Default::default()
            }),
        );
        let result = self.tool_error(&payload, hint);
        self.step
            .out
            .to_host(envelope::result_line(host_id, &result));
    }

    /// A stale call's result shows the tool's current definition and what changed since this
    /// host was shown it: hosts that never refetch learn it here. Recorded as a presentation;
    /// the next call of the tool is judged against it. Returns the sentence for the model.
    fn present_current_definition(&mut self, denial: &Denial, payload: &mut Value) -> String {
        let tool = denial.tool.clone();
        let current = self
            .catalogs
            .history
            .catalog()
            .and_then(|c| c.tool(&tool))
            .cloned();
        let shown = self
            .approvals
            .gate
            .host_shown(&tool)
            .map(|s| s.definition.clone());
        let revision = self.catalogs.history.current().map(|r| r.number);
        let one = |t: &Option<Value>| Catalog::from_tools(t.iter().cloned().collect()).ok();
        let changes = match (one(&shown), one(&current)) {
            (Some(old), Some(new)) => catalog::diff(&old, &new).render_human(),
            _ => Vec::new(),
        };
        let digest = current.as_ref().and_then(|_| {
            self.catalogs
                .history
                .catalog()
                .and_then(|c| c.tool_digests().get(&tool).cloned())
        });
        match &current {
            Some(def) => payload["currentDefinition"] = definition_payload(&tool, def),
            None => {
                payload["currentDefinition"] = Value::Null;
                payload["removed"] = json!(true);
            }
        }
        payload["changes"] = json!(changes);
        payload["retry"] = json!(
            "the tool's current definition is in currentDefinition: call again with arguments that match it (refetch tools/list to see every change)"
        );
        let shown_now = digest.clone().zip(current.clone());
        self.approvals
            .gate
            .host_view_mut()
            .show_tool(&tool, shown_now, revision);
        let epoch = self.current_epoch().map(str::to_string);
        self.audit_record(
            audit::CATALOG_PRESENTED,
            epoch.as_deref(),
            json!({"connection": self.agent_run(), "source": "stale-call result", "tool": tool,
                   "digest": digest, "revision": revision}),
        );
        self.note_host_not_refetching();
        let mut text = match &current {
            Some(def) => format!(
                "The tool `{tool}` changed since this host listed it (catalog revision {}). {}",
                revision.unwrap_or(0),
                current_definition_text(def)
            ),
            None => format!("The tool `{tool}` no longer exists in the server's current catalog."),
        };
        if !changes.is_empty() {
            text.push_str(&format!(" Changes: {}.", changes.join("; ")));
        }
        text.push_str(" The call was not run; call again against the current definition.");
        text
    }

    /// A call whose arguments do not match the tool's current definition: its result shows
    /// that definition and what changed from the one this host was shown before it (or from
    /// what it was shown, when that differs): a model that kept an old definition learns the
    /// new one here. A host that was not shown this definition yet is recorded as shown it, as
    /// for a stale call. Returns the sentence for the model.
    fn present_definition_for_arguments(&mut self, denial: &Denial, payload: &mut Value) -> String {
        let tool = denial.tool.clone();
        let current = self
            .catalogs
            .history
            .catalog()
            .and_then(|c| Some((c.tool(&tool)?.clone(), c.tool_digests().get(&tool)?.clone())));
        let Some((def, digest)) = current else {
            return denial.human_hint(); // unreachable: the gate judged against this catalog
        };
        let revision = self.catalogs.history.current().map(|r| r.number);
        let shown_now = self
            .approvals
            .gate
            .host_shown(&tool)
            .is_some_and(|s| s.digest == digest);
        let held = self.approvals.gate.host_shown(&tool);
        let base = if shown_now {
            held.and_then(|s| s.replaced.clone())
        } else {
            held.map(|s| s.definition.clone())
        };
        let one = |t: &Value| Catalog::from_tools(vec![t.clone()]).ok();
        let changes = match (base.as_ref().and_then(one), one(&def)) {
            (Some(old), Some(new)) => catalog::diff(&old, &new).render_human(),
            _ => Vec::new(),
        };
        payload["currentDefinition"] = definition_payload(&tool, &def);
        payload["changes"] = json!(changes);
        if !changes.is_empty() {
            payload["changesFrom"] = json!(if shown_now {
                "the definition this host was shown before the current one"
            } else {
                "the definition this host was last shown"
            });
        }
        payload["retry"] = json!(
            "the tool's current definition is in currentDefinition: call again with arguments that match it (refetch tools/list to see every change)"
        );
        if !shown_now {
            self.approvals.gate.host_view_mut().show_tool(
                &tool,
                Some((digest.clone(), def.clone())),
                revision,
            );
            let epoch = self.current_epoch().map(str::to_string);
            self.audit_record(
                audit::CATALOG_PRESENTED,
                epoch.as_deref(),
                json!({"connection": self.agent_run(), "source": "arguments-mismatch result",
                       "tool": tool, "digest": digest, "revision": revision}),
            );
        }
        let what: Vec<String> = denial.mismatches.iter().map(|m| m.describe()).collect();
        let mut text = format!(
            "The arguments do not match the current definition of the tool `{tool}` (catalog revision {}): {}. {}",
            revision.unwrap_or(0),
            what.join("; "),
            current_definition_text(&def)
        );
        if !changes.is_empty() {
            text.push_str(&format!(
                " Changes from the definition this host was shown before: {}.",
                changes.join("; ")
            ));
        }
        text.push_str(
            " The call was not run; call again with arguments that match the current definition.",
        );
        text
    }

    /// One status line per tool whose input schema is not checked (each once per definition).
    fn tell_unchecked_schemas(&mut self, notices: Vec<(String, String)>) {
        for (tool, why) in notices {
            let tool =
                crate::screen::sanitize::review(crate::screen::sanitize::first_chars(&tool, 128))
                    .into_owned();
            self.step
                .out
                .status(StatusEvent::ArgumentsNotChecked { tool, why });
        }
    }

    /// Once per revision: the host was told the list changed and still calls with old
    /// definitions (Claude Code before v2.1.233, Python and most TS apps never refetch).
    fn note_host_not_refetching(&mut self) {
        let Some(revision) = self.catalogs.history.current().map(|r| r.number) else {
            return;
        };
        if self.host.stale_notice_revision == Some(revision) {
            return;
        }
        self.host.stale_notice_revision = Some(revision);
        let after_list_changed = self.host.notified_revision == Some(revision);
        self.step.out.status(StatusEvent::HostNotRefetching {
            after_list_changed,
            revision,
        });
    }
}

/// A tool's definition as a refused call's result shows it.
fn definition_payload(tool: &str, def: &Value) -> Value {
    json!({
        "name": tool,
        "description": def.get("description"),
        "inputSchema": def.get("inputSchema"),
        "outputSchema": def.get("outputSchema"),
        "annotations": def.get("annotations"),
    })
}

impl Session {
    /// A tool execution error the model can read: the payload as text and in `_meta`.
    pub(super) fn tool_error(&self, payload: &Value, hint: &str) -> Value {
        let mut r = json!({
            "content": [
                {"type": "text", "text": payload.to_string()},
                {"type": "text", "text": hint},
            ],
            "isError": true,
            "_meta": {"dev.cargo-mcp-dev/error": payload},
        });
        if self.era() == Some(Era::Modern) {
            r["resultType"] = json!("complete");
        }
        r
    }
}

/// "Its current description: …. Its current input schema: …." for a refusal the model reads
/// (a stale call's and a mismatched call's alike).
fn current_definition_text(def: &Value) -> String {
    format!(
        "Its current description: {}. Its current input schema: {}.",
        def.get("description")
            .and_then(|d| d.as_str())
            .unwrap_or("(none)"),
        def.get("inputSchema")
            .map(|s| s.to_string())
            .unwrap_or_else(|| "{}".into())
    )
}
