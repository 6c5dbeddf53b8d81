//! Grants: a human decision bound to one agent run, one execution epoch and a tool scope, and
//! the requests and errors around issuing one. Owns: data. Must not touch: I/O.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::epoch::{AgentRunId, EpochId, GrantId};

/// When a grant stops authorizing calls (besides an epoch change, which always ends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Expiry {
    RunEnd,
    FirstUse,
}

/// A human decision: these tools, with these credential scopes, for this agent run and epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub id: GrantId,
    pub agent_run: AgentRunId,
    pub server_label: String,
    pub execution_epoch: EpochId,
    pub tool_scope: BTreeSet<String>,
    pub credential_scope: BTreeSet<String>,
    /// Milliseconds since the Unix epoch, as passed to [`Gate::approve`].
    pub issued_at: u64,
    pub expires_when: Expiry,
}

impl Grant {
    /// Whether this grant names `tool` and every scope in `scopes`.
    pub(super) fn covers(&self, tool: &str, scopes: &BTreeSet<String>) -> bool {
        self.tool_scope.contains(tool) && scopes.is_subset(&self.credential_scope)
    }
}

/// What the human approves. `epoch` is the epoch the human was shown: if the server has moved
/// on since, the decision is void.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    pub epoch: EpochId,
    pub tools: BTreeSet<String>,
    pub credential_scopes: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    #[error("the agent run has ended; grants can no longer be issued")]
    RunEnded,
    #[error(
        "the decision was for epoch {requested}, but the server is now {}; review the new epoch and approve again",
        current.as_deref().unwrap_or("not running")
    )]
    EpochChanged {
        requested: EpochId,
        current: Option<EpochId>,
    },
    #[error("the server's identity is pending (its tool catalog has not been fetched yet)")]
    NotReady,
    #[error("no tools to approve")]
    NoTools,
    #[error("tool `{0}` is not in the current catalog")]
    UnknownTool(String),
    #[error("credential scope `{0}` is not defined in the policy")]
    UnknownScope(String),
    #[error("tool `{tool}` uses credential scope `{scope}`, which the approval does not include")]
    ScopeNotCovered { tool: String, scope: String },
}

/// Which grants [`Gate::revoke`] removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeTarget {
    Id(GrantId),
    All,
}
