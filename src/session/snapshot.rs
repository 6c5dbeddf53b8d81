//! Snapshot room: the status document (`cargo mcp-dev status`, the status file).
//!
//! Owns: what the document says (names and digests only, never values). Must not touch:
//! writing it (the shell), decisions.

use serde_json::{Value, json};

use super::*;

/// Lists in the document are cut here (a flood of names must not grow it without bound).
const MAX_LISTED: usize = 100;

impl<I: Io> Session<I> {
    /// The state `status` shows and the status file holds (names and digests only, never values).
    pub fn status_json(&mut self) -> Value {
        let updated_at = self.io.clock().rfc3339;
        let (pending_tools, pending_scopes) = self.gate.pending_requests();
        let catalog = self.catalog.current();
        json!({
            "label": self.label(),
            "agentRun": self.agent_run,
            "supervisorPid": self.cfg.supervisor_pid,
            "state": match self.gate.phase() {
                approval::Phase::IdentityPending => "identity-pending",
                approval::Phase::CatalogReady => "catalog-ready",
                approval::Phase::Ready => "ready",
            },
            "restart": self.cfg.restart.as_str(),
            "gating": if self.cfg.gating_off { "off" } else { "on" },
            "lifecycle": match &self.lifecycle {
                Lifecycle::FirstStart => "first-start",
                Lifecycle::Serving => "serving",
                Lifecycle::BuildBroken { .. } => "build-failed",
                Lifecycle::CrashLoop => "crash-loop",
                Lifecycle::Stopping => "stopping",
            },
            "era": self.era().map(|e| e.as_str()),
            "server": self.child.as_ref().map(|c| json!({
                "pid": c.pid, "epoch": c.epoch, "identityDigest": c.record.identity_digest,
                "executableSha256": c.record.executable.sha256, "phase": format!("{:?}", c.phase),
            })),
            "latestBuild": self.latest.as_ref().map(|r| &r.identity_digest),
            "pendingRestart": self.pending_apply,
            "lastBuild": self.last_build,
            "catalog": catalog.map(|r| json!({"revision": r.number, "digest": r.digest})),
            "catalogTools": self.catalog.catalog().map(|c| c.names().map(str::to_string).collect::<Vec<_>>()),
            "hostCatalog": self.gate.host_catalog(),
            "staleTools": self.gate.stale_tools().into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
            "heldRequests": self.held.len(),
            "grants": self.gate.grants(),
            "recentDenials": self.gate.recent_denials().iter().rev().take(10).map(|d| json!({
                "at": d.at, "tool": d.denial.tool, "reason": d.denial.reason.as_str(),
                "approvedEpoch": d.denial.approved_epoch, "currentEpoch": d.denial.current_epoch,
            })).collect::<Vec<_>>(),
            "pendingApproval": {"tools": pending_tools, "credentialScopes": pending_scopes},
            "policy": {
                "credentialScopes": self.gate.policy().credential_scopes.keys().collect::<Vec<_>>(),
                "credentialScopeEnv": self.gate.policy().credential_scopes.iter().map(|(k, v)| (k.clone(), json!(v.env))).collect::<serde_json::Map<String, Value>>(),
            },
            "toolPolicy": self.catalog.catalog().map(|c| c.names().map(|t| (t.to_string(), json!({
                "gated": self.gate.policy().is_gated(t),
                "mode": match self.gate.policy().mode_for(t) { approval::ApprovalMode::PerCall => "per-call", approval::ApprovalMode::PerEpoch => "per-epoch" },
                "credentialScopes": self.gate.policy().scopes_for(t),
            }))).collect::<serde_json::Map<String, Value>>()),
            "sinceLastApproval": self.since_last_approval(),
            "catalogDetails": self.catalog.catalog().map(|c| c.tools_json()),
            "auditLog": self.cfg.audit_path,
            "socket": self.cfg.socket_path,
            "updatedAt": updated_at,
        })
    }
}
