//! Snapshot room: the status document (`cargo mcp-dev status`, the status file).
//!
//! Owns: what the document says (names and digests only, never values). Must not touch:
//! writing it (the shell), decisions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;

/// Lists in the document are cut here (a flood of names must not grow it without bound).
const MAX_LISTED: usize = 100;

/// The status document: what `cargo mcp-dev status` shows and `target/mcp-dev/status/<label>.json`
/// holds. One type for the writer (the session) and readers (tests, other tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusSnapshot {
    pub label: String,
    pub agent_run: AgentRunId,
    pub supervisor_pid: u32,
    /// `identity-pending`, `catalog-ready` or `ready` (the approval state machine).
    pub state: String,
    pub restart: String,
    pub gating: String,
    /// `first-start`, `serving`, `build-failed`, `start-failed`, `crash-loop` or
    /// `stopping`.
    pub lifecycle: String,
    pub era: Option<String>,
    pub server: Option<ServerSnapshot>,
    /// Why no server runs (`the server is being built again`, …), when none does.
    #[serde(default)]
    pub server_absent: Option<String>,
    pub latest_build: Option<String>,
    pub pending_restart: bool,
    pub last_build: Option<String>,
    pub catalog: Option<crate::policy::catalog::CatalogRevision>,
    pub catalog_tools: Option<Vec<String>>,
    /// Digest of the last whole catalog the host was shown.
    pub host_catalog: Option<String>,
    /// Tools whose definition as shown to the host is outdated.
    pub stale_tools: Vec<String>,
    pub held_requests: usize,
    pub grants: Vec<crate::policy::approval::Grant>,
    pub recent_denials: Vec<DenialSnapshot>,
    /// Calls refused for lack of a grant that `approve --call ID` can approve, newest first
    /// (ids, tools and digests only: the arguments are shown over the control socket).
    #[serde(default)]
    pub denied_calls: Vec<Value>,
    /// The channels that may grant now (`terminal`, `host`).
    #[serde(default)]
    pub approval_channels: Vec<String>,
    /// Approval prompts open in the host (the calls waiting for them).
    #[serde(default)]
    pub open_prompts: Vec<Value>,
    pub pending_approval: PendingApproval,
    pub policy: PolicySnapshot,
    pub tool_policy: Option<BTreeMap<String, ToolPolicy>>,
    pub since_last_approval: Value,
    pub catalog_details: Option<Vec<Value>>,
    pub audit_log: String,
    pub socket: Option<String>,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerSnapshot {
    pub pid: u32,
    pub epoch: EpochId,
    pub identity_digest: String,
    pub executable_sha256: String,
    pub phase: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DenialSnapshot {
    pub at: u64,
    pub tool: String,
    pub reason: String,
    pub approved_epoch: Option<crate::identity::epoch::EpochId>,
    pub current_epoch: Option<crate::identity::epoch::EpochId>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingApproval {
    pub tools: BTreeSet<String>,
    pub credential_scopes: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySnapshot {
    pub credential_scopes: Vec<String>,
    /// Scope name -> the env var names that carry it (names only, never values).
    pub credential_scope_env: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolPolicy {
    pub gated: bool,
    /// `per-call` or `per-epoch`.
    pub mode: String,
    pub credential_scopes: BTreeSet<String>,
}

impl Session {
    /// The state `status` shows and the status file holds (names and digests only, never values).
    pub fn status_json(&mut self) -> Value {
        serde_json::to_value(self.snapshot()).expect("the snapshot serializes")
    }

    pub fn snapshot(&mut self) -> StatusSnapshot {
        let updated_at = self.step.now.timestamp();
        let (pending_tools, pending_scopes) = self
            .approvals
            .gate
            .pending_requests(serving(&self.server, &self.catalogs));
        let policy = self.approvals.gate.policy();
        StatusSnapshot {
            label: self.label().to_string(),
            agent_run: self.agent_run().into(),
            supervisor_pid: self.cfg.supervisor_pid,
            state: match self
                .approvals
                .gate
                .phase(serving(&self.server, &self.catalogs))
            {
                approval::Phase::IdentityPending => "identity-pending",
                approval::Phase::CatalogReady => "catalog-ready",
                approval::Phase::Ready => "ready",
            }
            .into(),
            restart: self.cfg.restart.as_str().into(),
            gating: if self.cfg.gating_off { "off" } else { "on" }.into(),
            lifecycle: match &self.lifecycle {
                Lifecycle::FirstStart => "first-start",
                Lifecycle::Serving => "serving",
                Lifecycle::BuildBroken { .. } => "build-failed",
                Lifecycle::StartFailed { .. } => "start-failed",
                Lifecycle::CrashLoop => "crash-loop",
                Lifecycle::Stopping => "stopping",
            }
            .into(),
            era: self.era().map(|e| e.as_str().to_string()),
            server: self.server.child().map(|c| ServerSnapshot {
                pid: c.pid,
                epoch: c.epoch.clone(),
                identity_digest: c.record.identity_digest.clone(),
                executable_sha256: c.record.executable.sha256.clone(),
                phase: c.phase.name().to_string(),
            }),
            server_absent: (self.server.child().is_none()
                && self.absent_why() != "no server is running")
                .then(|| self.absent_why().to_string()),
            latest_build: self
                .build
                .latest
                .as_ref()
                .map(|r| r.identity_digest.clone()),
            pending_restart: self.newer_build_waits(),
            last_build: self.build.last_line.clone(),
            // A server whose first list failed has no catalog yet: an earlier server's is not
            // shown as if it were this one's (round 23).
            catalog: self
                .catalogs
                .history
                .current()
                .cloned()
                .filter(|_| self.catalog_is_this_servers()),
            catalog_tools: (self
                .catalogs
                .history
                .catalog()
                .filter(|_| self.catalog_is_this_servers()))
            .map(|c| c.names().map(str::to_string).collect()),
            host_catalog: self.approvals.gate.host_catalog().map(str::to_string),
            stale_tools: self
                .approvals
                .gate
                .stale_tools(serving(&self.server, &self.catalogs))
                .into_iter()
                .take(MAX_LISTED)
                .collect(),
            held_requests: self.host.held.len(),
            grants: self.approvals.gate.grants().to_vec(),
            recent_denials: self
                .approvals
                .gate
                .recent_denials()
                .iter()
                .rev()
                .take(10)
                .map(|d| DenialSnapshot {
                    at: d.at,
                    tool: d.denial.tool.clone(),
                    reason: d.denial.reason.as_str().into(),
                    approved_epoch: d.denial.approved_epoch.clone(),
                    current_epoch: d.denial.current_epoch.clone(),
                })
                .collect(),
            denied_calls: self
                .approvals
                .denied_calls
                .iter()
                .rev()
                .take(10)
                .map(|d| control::denied_call_json(d, false))
                .collect(),
            approval_channels: self
                .approval_channels()
                .into_iter()
                .map(|c| c.as_str().to_string())
                .collect(),
            open_prompts: self.open_prompts(),
            pending_approval: PendingApproval {
                tools: pending_tools,
                credential_scopes: pending_scopes,
            },
            policy: PolicySnapshot {
                credential_scopes: policy.credential_scopes.keys().cloned().collect(),
                credential_scope_env: policy
                    .credential_scopes
                    .iter()
                    .map(|(k, v)| (k.clone(), v.env.clone()))
                    .collect(),
            },
            tool_policy: self
                .catalogs
                .history
                .catalog()
                .filter(|_| self.catalog_is_this_servers())
                .map(|c| {
                    c.names()
                        .map(|t| {
                            let mode = match policy.mode_for(t) {
                                approval::ApprovalMode::PerCall => "per-call",
                                approval::ApprovalMode::PerEpoch => "per-epoch",
                            };
                            let p = ToolPolicy {
                                gated: policy.is_gated(t),
                                mode: mode.into(),
                                credential_scopes: policy.scopes_for(t),
                            };
                            (t.to_string(), p)
                        })
                        .collect()
                }),
            since_last_approval: self.since_last_approval(),
            catalog_details: (self
                .catalogs
                .history
                .catalog()
                .filter(|_| self.catalog_is_this_servers()))
            .map(|c| c.tools_json()),
            audit_log: self.cfg.audit_path.clone(),
            socket: self.cfg.socket_path.clone(),
            updated_at,
        }
    }
}
