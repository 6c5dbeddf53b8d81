//! Grants: a human decision bound to one agent run, one execution epoch and a tool scope, and
//! the requests and errors around issuing one. Owns: data. Must not touch: I/O.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::identity::epoch::{AgentRunId, EpochId, GrantId};
use crate::screen::wording::lifetime_words;

/// When a grant stops authorizing calls (besides an epoch change, which always ends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Expiry {
    RunEnd,
    FirstUse,
}

/// What a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GrantKind {
    /// Every call of the tools in `tool_scope` during the epoch (or the first one, when
    /// `expires_when` is `firstUse`: the per-call policy mode), whatever the arguments.
    #[default]
    Epoch,
    /// Exactly one call: the one tool in `tool_scope`, with arguments whose digest is
    /// `arguments_digest`, in this epoch, used once.
    Call,
}

impl Expiry {
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::RunEnd => "runEnd",
            Expiry::FirstUse => "firstUse",
        }
    }
}

impl GrantKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantKind::Epoch => "epoch",
            GrantKind::Call => "call",
        }
    }
}

/// Who approved: the channel a human decision came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Channel {
    /// `cargo mcp-dev approve` over the owner-only control socket.
    Terminal,
    /// An elicitation answered in the host (a person, or whatever answers for the host).
    Host,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Terminal => "terminal",
            Channel::Host => "host",
        }
    }
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
    #[serde(default)]
    pub kind: GrantKind,
    /// For a `call` grant: the digest of the approved call's arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_digest: Option<String>,
    /// For a `call` grant: the host's id of the denied call the human approved (audit only:
    /// the retried call carries a new id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default = "default_channel")]
    pub channel: Channel,
}

fn default_channel() -> Channel {
    Channel::Terminal
}

impl Grant {
    /// How long it lasts, in a person's words ([`lifetime_words`]).
    pub fn lifetime(&self) -> &'static str {
        lifetime_words(self.expires_when.as_str(), Some(self.kind.as_str()))
    }

    /// Whether this grant names `tool` and every scope in `scopes`, whatever the arguments.
    /// A `call` grant never covers a tool in general: see [`Grant::covers_call`].
    pub(super) fn covers(&self, tool: &str, scopes: &BTreeSet<String>) -> bool {
        self.kind == GrantKind::Epoch
            && self.tool_scope.contains(tool)
            && scopes.is_subset(&self.credential_scope)
    }

    /// Whether this grant authorizes this one call: an `epoch` grant that covers the tool, or
    /// a `call` grant for the same tool and the same argument digest.
    pub(super) fn covers_call(
        &self,
        tool: &str,
        scopes: &BTreeSet<String>,
        arguments_digest: Option<&str>,
    ) -> bool {
        match self.kind {
            GrantKind::Epoch => self.covers(tool, scopes),
            GrantKind::Call => {
                self.tool_scope.contains(tool)
                    && scopes.is_subset(&self.credential_scope)
                    && arguments_digest.is_some()
                    && self.arguments_digest.as_deref() == arguments_digest
            }
        }
    }
}

/// What the human approves for one call: `tool` with arguments whose digest is
/// `arguments_digest`, in `epoch` (re-checked), once. `call_id` names the denied call shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallApprovalRequest {
    pub epoch: EpochId,
    pub tool: String,
    pub arguments_digest: String,
    pub call_id: Option<String>,
    pub channel: Channel,
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
    #[error("the call to approve has no argument digest")]
    NoArgumentsDigest,
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
