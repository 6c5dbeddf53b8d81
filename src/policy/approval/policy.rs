//! Approval policy: which tools are gated, per-call or per-epoch, and the credential scopes
//! they use (names only). Owns: configuration as data. Must not touch: decisions, I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// How many denials [`Gate::recent_denials`] keeps for `status`.
pub const RECENT_DENIALS: usize = 32;

/// How many grants of past epochs are remembered, only to say `authorization_stale` (and which
/// epoch was approved) rather than `authorization_required`. They never authorize anything.
pub const STALE_GRANTS: usize = 64;

/// Which tools need a human grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gating {
    /// Nothing is gated (an explicit setting that status and audit show).
    Off,
    /// Every tool except the listed harmless ones (the default for new projects).
    All { exempt: BTreeSet<String> },
    /// Only the listed tools.
    Only(BTreeSet<String>),
}

impl Gating {
    pub fn is_gated(&self, tool: &str) -> bool {
        match self {
            Gating::Off => false,
            Gating::All { exempt } => !exempt.contains(tool),
            Gating::Only(tools) => tools.contains(tool),
        }
    }
}

/// How long a grant lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalMode {
    /// For this agent run and this epoch.
    PerEpoch,
    /// For one call, consumed when the call is forwarded.
    PerCall,
}

/// A named credential: the env vars that carry it to the server and the tools that use it.
/// Only names appear here; values never enter this module.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CredentialScope {
    pub env: Vec<String>,
    pub tools: BTreeSet<String>,
}

/// The approval policy of one server (from `[package.metadata.mcp-dev]` and flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub gating: Gating,
    /// Mode for tools not in `per_call_tools`.
    pub mode: ApprovalMode,
    /// Tools that always need a per-call decision, whatever `mode` says.
    pub per_call_tools: BTreeSet<String>,
    pub credential_scopes: BTreeMap<String, CredentialScope>,
}

impl Default for Policy {
    /// Gate every tool, per epoch, no credential scopes.
    fn default() -> Policy {
        Policy {
            gating: Gating::All {
                exempt: BTreeSet::new(),
            },
            mode: ApprovalMode::PerEpoch,
            per_call_tools: BTreeSet::new(),
            credential_scopes: BTreeMap::new(),
        }
    }
}

impl Policy {
    pub fn is_gated(&self, tool: &str) -> bool {
        self.gating.is_gated(tool)
    }

    /// The mode for `tool`; where the global mode and the per-tool list disagree, per-call wins.
    pub fn mode_for(&self, tool: &str) -> ApprovalMode {
        if self.mode == ApprovalMode::PerCall || self.per_call_tools.contains(tool) {
            ApprovalMode::PerCall
        } else {
            ApprovalMode::PerEpoch
        }
    }

    /// Names of the credential scopes `tool` uses.
    pub fn scopes_for(&self, tool: &str) -> BTreeSet<String> {
        self.credential_scopes
            .iter()
            .filter(|(_, scope)| scope.tools.contains(tool))
            .map(|(name, _)| name.clone())
            .collect()
    }
}
