//! Control room: requests from the owner-only control socket (`status`, `restart`,
//! `approve`, `revoke`): the human channel.
//!
//! Owns: turning a human decision into a grant (re-checked against the current epoch by the
//! gate), revocations, and what `approve` shows as changed since the last approval. Must not
//! touch: the socket itself (the shell), I/O (the port).

use serde_json::{Value, json};

use super::*;
use crate::approval::{ApprovalRequest, RevokeTarget};
use crate::epoch::EpochId;

/// A request on the control socket, as the session understands it. The wire is one JSON
/// object with `op` (`status`, `restart`, `approve`, `revoke`); unknown operations and missing
/// fields are refused with a sentence, never guessed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
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
}

impl ControlRequest {
    pub fn parse(request: &Value) -> Result<ControlRequest, String> {
        serde_json::from_value(request.clone()).map_err(|e| {
            let op = request.get("op").and_then(Value::as_str).unwrap_or("");
            match op {
                "status" | "restart" | "approve" | "revoke" => {
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

impl<I: Io> Session<I> {
    pub(super) fn on_control(&mut self, request: &Value) -> Value {
        let answer = match ControlRequest::parse(request) {
            Err(e) => Err(e),
            Ok(ControlRequest::Status) => Ok(self.status_json()),
            Ok(ControlRequest::Restart) => match self.latest.clone() {
                Some(record) if self.child.is_some() => {
                    self.leave_crash_loop();
                    self.begin_replace(record, "cargo mcp-dev restart");
                    Ok(json!({"restarting": true}))
                }
                Some(record) => {
                    self.leave_crash_loop();
                    self.spawn_child(record, None, None);
                    Ok(json!({"started": true}))
                }
                None => Err("no successful build yet".to_string()),
            },
            Ok(ControlRequest::Approve {
                epoch,
                tools,
                credential_scopes,
            }) => self.control_approve(ApprovalRequest {
                epoch,
                tools,
                credential_scopes,
            }),
            Ok(ControlRequest::Revoke { grant }) => {
                let target = match grant.as_deref() {
                    Some("all") | None => RevokeTarget::All,
                    Some(id) => RevokeTarget::Id(id.into()),
                };
                let revoked = self.gate.revoke(target);
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
        match answer {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": e}),
        }
    }

    fn control_approve(&mut self, req: ApprovalRequest) -> Result<Value, String> {
        let epoch = req.epoch.clone();
        let (now, id) = (self.io.wall_ms(), self.io.mint_id());
        let grant = self.gate.approve(req, now, id).map_err(|e| e.to_string())?;
        let g = serde_json::to_value(&grant).expect("grant serializes");
        if let Some(c) = &self.child {
            self.approved_baseline = Some((
                c.epoch.to_string(),
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
        self.publish();
        Ok(json!({"grant": g}))
    }

    /// What changed between the last approved epoch and now (for `approve`'s review).
    pub(super) fn since_last_approval(&self) -> Value {
        let (Some((epoch, record, catalog)), Some(child)) = (&self.approved_baseline, &self.child)
        else {
            return Value::Null;
        };
        if child.epoch == *epoch {
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

    fn leave_crash_loop(&mut self) {
        if self.lifecycle == Lifecycle::CrashLoop {
            self.lifecycle = Lifecycle::Serving;
        }
    }
}
