//! Control room: requests from the owner-only control socket (`status`, `restart`,
//! `approve`, `revoke`): the human channel.
//!
//! Owns: turning a human decision into a grant (re-checked against the current epoch by the
//! gate), revocations, and what `approve` shows as changed since the last approval. Must not
//! touch: the socket itself (the shell), I/O (the port).

use serde_json::{Value, json};

use super::*;
use crate::approval::{ApprovalRequest, RevokeTarget};

impl<I: Io> Session<I> {
    pub(super) fn on_control(&mut self, request: &Value) -> Value {
        let op = request.get("op").and_then(|o| o.as_str()).unwrap_or("");
        let answer = match op {
            "status" => Ok(self.status_json()),
            "restart" => match self.latest.clone() {
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
                self.publish();
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
        let (now, id) = (self.io.clock().wall_ms, self.io.mint_id());
        let grant = self.gate.approve(req, now, id).map_err(|e| e.to_string())?;
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
        self.publish();
        Ok(json!({"grant": g}))
    }

    /// What changed between the last approved epoch and now (for `approve`'s review).
    pub(super) fn since_last_approval(&self) -> Value {
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

    fn leave_crash_loop(&mut self) {
        if self.lifecycle == Lifecycle::CrashLoop {
            self.lifecycle = Lifecycle::Serving;
        }
    }
}
