//! Control room: requests from the owner-only control socket (`status`, `restart`,
//! `approve`, `revoke`): the human channel.
//!
//! Owns: turning a human decision into a grant (re-checked against the current epoch by the
//! gate), revocations, and what `approve` shows as changed since the last approval. Must not
//! touch: the socket itself and where answers go (`crate::face::control_socket`, the shell); a request
//! arrives typed ([`ControlRequest`], parsed at the socket) with a ticket, and its answer is
//! an effect carrying that ticket.

use serde_json::{Value, json};

use super::*;
use crate::identity::epoch::EpochId;
use crate::policy::approval::{ApprovalRequest, CallApprovalRequest, Channel, RevokeTarget};

/// A request on the control socket, as the session understands it. The wire is one JSON
/// object with `op` (`status`, `restart`, `approve`, `revoke`); unknown operations and missing
/// fields are refused with a sentence, never guessed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum ControlRequest {
    Status,
    Restart,
    #[serde(rename_all = "camelCase")]
    Approve {
        /// The epoch the human reviewed (re-checked against the current one).
        epoch: EpochId,
        #[serde(default)]
        tools: std::collections::BTreeSet<String>,
        #[serde(default)]
        credential_scopes: std::collections::BTreeSet<String>,
    },
    Revoke {
        /// A grant id, or `all` (the default).
        #[serde(default)]
        grant: Option<String>,
    },
    /// One call refused for lack of a grant, with its arguments (for the human's review).
    #[serde(rename_all = "camelCase")]
    DeniedCall {
        /// The host's id of the call, as JSON text (`7`, `"abc"`).
        call_id: String,
    },
    /// Approve exactly one denied call: its tool, its argument digest, this epoch, once.
    #[serde(rename_all = "camelCase")]
    ApproveCall {
        /// The epoch the human reviewed (re-checked against the current one).
        epoch: EpochId,
        call_id: String,
        /// The tool the human was shown (must still be that call's: the agent may reuse an id).
        tool: String,
        /// The digest the human was shown (must still be that call's).
        arguments_digest: String,
    },
}

impl ControlRequest {
    pub fn parse(request: &Value) -> Result<ControlRequest, String> {
        serde_json::from_value(request.clone()).map_err(|e| {
            let op = request.get("op").and_then(Value::as_str).unwrap_or("");
            match op {
                "status" | "restart" | "approve" | "revoke" | "deniedCall" | "approveCall" => {
                    format!("control request `{op}` is malformed: {e}")
                }
                "" => "control request without `op`".to_string(),
                other => format!(
                    "unknown control operation `{}`",
                    other.chars().take(64).collect::<String>().escape_debug()
                ),
            }
        })
    }
}

impl Session {
    /// Carries out a control request; its answer, or `None` when it comes later (a restart
    /// whose server's start is not yet reported: see `Session::on_spawned`).
    pub(super) fn on_control(&mut self, request: ControlRequest, ticket: Ticket) -> Option<Value> {
        let answer = match request {
            ControlRequest::Status => Ok(self.status_json()),
            ControlRequest::Restart => match self.build.latest.clone() {
                Some(record) if self.server.child().is_some() => {
                    self.leave_crash_loop();
                    self.begin_replace(record, "cargo mcp-dev restart");
                    Ok(json!({"restarting": true}))
                }
                // The old server is stopping; its replacement starts with the latest build.
                Some(_) if matches!(self.server, Server::Replacing(_)) => {
                    Ok(json!({"restarting": true}))
                }
                // The rebuild for a copy that could not start runs; its result starts it.
                Some(_) if self.server.rebuilding_to_start() => Ok(json!({"building": true})),
                Some(record) => {
                    self.leave_crash_loop();
                    // Asked for by the human: a copy that cannot start gets its rebuild again.
                    self.restarts.last_start_rebuild = None;
                    self.spawn_child(record, None, None);
                    // Answered when its start is reported (`on_spawned`, `on_spawn_failed`).
                    if let Server::Spawning(spawning) = &mut self.server {
                        spawning.ticket = Some(ticket);
                        return None;
                    }
                    return Some(self.restart_answer_after_failure());
                }
                None => Err("no successful build yet".to_string()),
            },
            ControlRequest::Approve {
                epoch,
                tools,
                credential_scopes,
            } => self.control_approve(ApprovalRequest {
                epoch,
                tools,
                credential_scopes,
            }),
            ControlRequest::DeniedCall { call_id } => self
                .denied_call(&call_id)
                .map(|d| denied_call_json(d, true))
                .ok_or_else(|| no_such_call(&call_id)),
            ControlRequest::ApproveCall {
                epoch,
                call_id,
                tool,
                arguments_digest,
            } => self.control_approve_call(epoch, &call_id, &tool, &arguments_digest),
            ControlRequest::Revoke { grant } => {
                let target = match grant.as_deref() {
                    Some("all") | None => RevokeTarget::All,
                    Some(id) => RevokeTarget::Id(id.into()),
                };
                let revoked = self.approvals.gate.revoke(target);
                for g in &revoked {
                    self.audit_record(
                        audit::APPROVAL_REVOKED,
                        Some(&g.execution_epoch.clone()),
                        json!({"grantId": g.id}),
                    );
                }
                self.publish();
                Ok(json!({"revoked": revoked}))
            }
        };
        Some(control_answer(answer))
    }

    /// The answer to `restart` when the server it started could not start.
    pub(super) fn restart_answer_after_failure(&self) -> Value {
        let answer = if self.server.child().is_some() {
            Ok(json!({"started": true}))
        } else if self.hold_budget().is_some() || self.server.rebuilding_to_start() {
            // It could not start, and a build under way starts it if it succeeds.
            Ok(json!({"building": true}))
        } else {
            Err(self.unavailable_reason().0)
        };
        control_answer(answer)
    }

    /// The newest kept denial of the call with this id.
    /// `call_id` is the id's JSON text (`7`, `"abc"`); a string id may also be given bare.
    pub(super) fn denied_call(&self, call_id: &str) -> Option<&DeniedCallRecord> {
        // The id as the host wrote it first (what the suggested command passes); the bare text
        // of a string id only when no call has that exact id (`7` is the number's, not `"7"`'s).
        let quoted = serde_json::to_string(call_id).unwrap_or_default();
        let newest = |id: &str| {
            self.approvals
                .denied_calls
                .iter()
                .rev()
                .find(|d| d.call_id == id)
        };
        newest(call_id).or_else(|| newest(&quoted))
    }

    /// The control socket grants only when the terminal channel is on in this run.
    fn terminal_channel(&self) -> Result<(), String> {
        if self.approval_channels().contains(&Channel::Terminal) {
            Ok(())
        } else {
            Err("the terminal approval channel is off in this run (approval-channels = [\"host\"]): approve in the host".into())
        }
    }

    fn control_approve_call(
        &mut self,
        epoch: EpochId,
        call_id: &str,
        tool: &str,
        arguments_digest: &str,
    ) -> Result<Value, String> {
        self.terminal_channel()?;
        let denied = self
            .denied_call(call_id)
            .cloned()
            .ok_or_else(|| no_such_call(call_id))?;
        // The agent chose the id and may have reused it for another call since the screen.
        if denied.tool != tool {
            return Err(format!(
                "call {} is now a call of another tool than the one reviewed; review it again",
                sanitize_id(call_id)
            ));
        }
        if denied.arguments_digest != arguments_digest {
            return Err(format!(
                "call {} now has other arguments than the ones reviewed; review it again",
                sanitize_id(call_id)
            ));
        }
        let req = CallApprovalRequest {
            epoch,
            tool: denied.tool.clone(),
            arguments_digest: denied.arguments_digest.clone(),
            call_id: Some(denied.call_id.clone()),
            channel: Channel::Terminal,
        };
        let (now, id) = (self.step.now.wall_ms, self.mint_id());
        let grant = self
            .approvals
            .gate
            .approve_call(serving(&self.server, &self.catalogs), req, now, id)
            .map_err(|e| e.to_string())?;
        self.approvals
            .denied_calls
            .retain(|d| d.call_id != denied.call_id);
        self.record_grant(&grant, "control socket");
        self.release_covered_prompts();
        Ok(json!({"grant": grant}))
    }

    /// The `approval_granted` record, the baseline for the next review, the status line.
    pub(super) fn record_grant(&mut self, grant: &crate::policy::approval::Grant, via: &str) {
        let g = serde_json::to_value(grant).expect("grant serializes");
        if let Some(c) = self.server.child() {
            self.approvals.baseline = Some((
                c.epoch.to_string(),
                c.record.clone(),
                self.catalogs.history.catalog().cloned(),
            ));
        }
        let epoch = grant.execution_epoch.to_string();
        self.audit_record(
            audit::APPROVAL_GRANTED,
            Some(&epoch),
            json!({"grant": g, "via": via, "channel": grant.channel.as_str(),
                   "kind": grant.kind.as_str(), "argumentsDigest": grant.arguments_digest}),
        );
        let what = match grant.kind {
            crate::policy::approval::GrantKind::Call => format!(
                "one call of {} (arguments {})",
                crate::screen::sanitize::review(
                    &grant
                        .tool_scope
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                grant.arguments_digest.as_deref().unwrap_or("?")
            ),
            crate::policy::approval::GrantKind::Epoch => crate::screen::sanitize::review(
                &grant
                    .tool_scope
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .into_owned(),
        };
        self.step.out.status(StatusEvent::Approved {
            what,
            epoch: epoch.to_string(),
            grant: grant.id.to_string(),
            lasts: grant.lifetime().to_string(),
            via: grant.channel.as_str().to_string(),
        });
        self.publish();
    }

    fn control_approve(&mut self, req: ApprovalRequest) -> Result<Value, String> {
        self.terminal_channel()?;
        let (now, id) = (self.step.now.wall_ms, self.mint_id());
        let grant = self
            .approvals
            .gate
            .approve(serving(&self.server, &self.catalogs), req, now, id)
            .map_err(|e| e.to_string())?;
        self.record_grant(&grant, "control socket");
        self.release_covered_prompts();
        Ok(json!({"grant": grant}))
    }

    /// What changed between the last approved epoch and now (for `approve`'s review).
    pub(super) fn since_last_approval(&self) -> Value {
        let (Some((epoch, record, catalog)), Some(child)) =
            (&self.approvals.baseline, self.server.child())
        else {
            return Value::Null;
        };
        if child.epoch == *epoch {
            return Value::Null;
        }
        let identity = crate::identity::fingerprint::component_list(
            &crate::identity::fingerprint::changed_components(record, &child.record),
        );
        // No comparison with a catalog that is not this server's (its first list failed).
        let catalog_lines = match (catalog, self.catalogs.history.catalog()) {
            _ if !self.catalog_is_this_servers() => Value::Null,
            (Some(old), Some(new)) => json!(crate::policy::catalog::diff(old, new).render_human()),
            _ => json!([]),
        };
        json!({"epoch": epoch, "identity": identity, "catalog": catalog_lines})
    }

    /// Out of the crash loop (new code, or asked for): its crash history goes with it, so the
    /// next server gets its restarts and backoff afresh.
    pub(super) fn leave_crash_loop(&mut self) {
        if self.lifecycle == Lifecycle::CrashLoop {
            self.lifecycle = Lifecycle::Serving;
            self.restarts.crashes.clear();
        }
    }
}

/// A kept denied call for the control socket: `with_arguments` adds the arguments text (only
/// `deniedCall` answers carry it; the status document has names and digests only).
pub(super) fn denied_call_json(d: &DeniedCallRecord, with_arguments: bool) -> Value {
    let mut v = json!({"callId": d.call_id, "tool": d.tool, "argumentsDigest": d.arguments_digest,
                       "epoch": d.epoch, "reason": d.reason});
    if with_arguments {
        v["arguments"] = json!(d.arguments_preview);
        v["argumentsTruncated"] = json!(d.arguments_truncated);
    }
    v
}

fn sanitize_id(call_id: &str) -> String {
    call_id
        .chars()
        .take(64)
        .collect::<String>()
        .escape_debug()
        .to_string()
}

fn no_such_call(call_id: &str) -> String {
    format!(
        "no denied call with id {} is waiting for approval (see `cargo mcp-dev status`)",
        sanitize_id(call_id)
    )
}

/// The wire form of a control answer.
fn control_answer(answer: Result<Value, String>) -> Value {
    match answer {
        Ok(v) => json!({"ok": true, "result": v}),
        Err(e) => json!({"ok": false, "error": e}),
    }
}
