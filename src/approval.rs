//! The gate: the only place that decides whether a `tools/call` is forwarded to the server.
//!
//! Owns the approval policy ([`Policy`]), the grants a human issued for this agent run
//! ([`Grant`]), the state machine of docs/ARCHITECTURE.md ([`Phase`]) and the denials it produces,
//! with their machine-readable payload and the sentence for the human ([`Denial`]).
//!
//! Pure: events in, decisions out. It does no I/O and reads no clock: times are passed in as
//! milliseconds and grant ids are supplied by the caller. It must not touch processes, JSON-RPC
//! framing, the audit log or the control socket; `session` feeds it events from those and acts on
//! the decisions (writes `tool_called` before forwarding, `authorization_denied` after a denial).
//!
//! Tool annotations (`readOnlyHint`, `destructiveHint`, …) are untrusted hints from the server:
//! nothing in this module takes them as input, so they cannot decide gating or credentials.
//!
//! Rules enforced by [`Gate::decide_call`], in this order:
//! 1. `identity_pending`: no current epoch, or its catalog has not been fetched yet;
//! 2. `catalog_stale`: the called tool's definition as this host connection was last shown it
//!    differs from its definition in the current catalog, or the tool is gone. Judged per
//!    tool: calls to unchanged tools go through. A host that was never shown a catalog in this
//!    connection (or never shown this tool) is judged against the current catalog;
//! 3. `unknown_tool`: the tool is not in the current catalog;
//! 4. for a gated tool, a live grant of this run naming the current epoch and covering the tool
//!    and every credential scope it uses; otherwise `authorization_stale` if a grant covered the
//!    tool under another epoch, else `authorization_required`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::catalog::CatalogRevision;

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
    pub id: String,
    pub agent_run: String,
    pub server_label: String,
    pub execution_epoch: String,
    pub tool_scope: BTreeSet<String>,
    pub credential_scope: BTreeSet<String>,
    /// Milliseconds since the Unix epoch, as passed to [`Gate::approve`].
    pub issued_at: u64,
    pub expires_when: Expiry,
}

impl Grant {
    /// Whether this grant names `tool` and every scope in `scopes`.
    fn covers(&self, tool: &str, scopes: &BTreeSet<String>) -> bool {
        self.tool_scope.contains(tool) && scopes.is_subset(&self.credential_scope)
    }
}

/// What the human approves. `epoch` is the epoch the human was shown: if the server has moved
/// on since, the decision is void.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    pub epoch: String,
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
        requested: String,
        current: Option<String>,
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
    Id(String),
    All,
}

/// The verdict on one `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDecision {
    /// Forward to the server. `grant_id` is `None` for an ungated tool; `credential_scopes` are
    /// the names of the scopes the tool uses (for the audit record; never values).
    Forward {
        grant_id: Option<String>,
        credential_scopes: Vec<String>,
    },
    Deny(Denial),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DenialReason {
    IdentityPending,
    CatalogStale,
    UnknownTool,
    AuthorizationStale,
    AuthorizationRequired,
}

impl DenialReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => "identity_pending",
            DenialReason::CatalogStale => "catalog_stale",
            DenialReason::UnknownTool => "unknown_tool",
            DenialReason::AuthorizationStale => "authorization_stale",
            DenialReason::AuthorizationRequired => "authorization_required",
        }
    }

    /// The `reason` text of the payload.
    fn explanation(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => {
                "server is starting or restarting; its execution epoch and tool catalog are not known yet"
            }
            DenialReason::CatalogStale => "tool catalog changed since the host last fetched it",
            DenialReason::UnknownTool => "tool is not in the current catalog",
            DenialReason::AuthorizationStale => "server execution epoch changed",
            DenialReason::AuthorizationRequired => {
                "tool requires human approval for this execution epoch"
            }
        }
    }

    /// The `retry` text of the payload: what the agent may do next. Calls are never queued.
    fn retry(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => {
                "wait for the server to come up, refresh tool metadata, then call again"
            }
            DenialReason::CatalogStale => "refresh tool metadata (tools/list), then call again",
            DenialReason::UnknownTool => {
                "refresh tool metadata (tools/list) and call a listed tool"
            }
            DenialReason::AuthorizationStale => "refresh tool metadata and request authorization",
            DenialReason::AuthorizationRequired => {
                "request authorization from the user, then call again"
            }
        }
    }
}

/// Authorization status attached to a `catalog_stale` denial, so the human can approve while the
/// host refetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingAuthorization {
    /// A grant covered the tool under another epoch (`approved_epoch` names it).
    Stale,
    /// No grant ever covered the tool in this run.
    Required,
}

/// Why one call was refused, with everything the model and the human need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: DenialReason,
    pub tool: String,
    pub approved_epoch: Option<String>,
    pub current_epoch: Option<String>,
    /// Digest of the catalog the host last fetched.
    pub host_catalog: Option<String>,
    pub current_catalog: Option<CatalogRevision>,
    /// Names of the credential scopes the tool uses (what an approval must include).
    pub credential_scopes: Vec<String>,
    /// Only on `catalog_stale` for a gated tool with no live grant.
    pub authorization: Option<PendingAuthorization>,
}

impl Denial {
    /// The machine-readable payload for the tool execution error, e.g.
    /// `{"error":"authorization_stale","reason":"server execution epoch changed",
    ///   "approvedEpoch":…,"currentEpoch":…,"retry":"refresh tool metadata and request authorization","tool":…}`.
    /// Absent facts are left out rather than sent as `null`.
    pub fn payload(&self) -> Value {
        let mut p = serde_json::Map::new();
        p.insert("error".into(), json!(self.reason.as_str()));
        p.insert("reason".into(), json!(self.reason.explanation()));
        if let Some(epoch) = &self.approved_epoch {
            p.insert("approvedEpoch".into(), json!(epoch));
        }
        if let Some(epoch) = &self.current_epoch {
            p.insert("currentEpoch".into(), json!(epoch));
        }
        if self.reason == DenialReason::CatalogStale {
            p.insert("hostCatalog".into(), json!(self.host_catalog));
        }
        if let Some(rev) = &self.current_catalog
            && matches!(
                self.reason,
                DenialReason::CatalogStale | DenialReason::UnknownTool
            )
        {
            p.insert("currentCatalog".into(), json!(rev));
        }
        if let Some(auth) = self.authorization {
            let status = match auth {
                PendingAuthorization::Stale => "stale",
                PendingAuthorization::Required => "required",
            };
            p.insert("authorization".into(), json!(status));
        }
        p.insert("retry".into(), json!(self.reason.retry()));
        p.insert("tool".into(), json!(self.tool));
        if !self.credential_scopes.is_empty() {
            p.insert("credentialScopes".into(), json!(self.credential_scopes));
        }
        Value::Object(p)
    }

    /// One sentence telling the human what to do.
    pub fn human_hint(&self) -> String {
        let tool = &self.tool;
        let approve = || {
            let epoch = self.current_epoch.as_deref().unwrap_or("the current epoch");
            let mut cmd = format!("cargo mcp-dev approve --tool {tool}");
            for scope in &self.credential_scopes {
                cmd.push_str(&format!(" --credential-scope {scope}"));
            }
            format!("run `{cmd}` in the project to approve {tool} for epoch {epoch}")
        };
        match self.reason {
            DenialReason::IdentityPending => format!(
                "The server is starting or restarting, so {tool} was refused rather than queued: wait until the \
                 status line shows the server running under its new epoch, then let the agent refresh its tools and \
                 call again."
            ),
            DenialReason::CatalogStale => {
                let current = self
                    .current_catalog
                    .as_ref()
                    .map(|r| r.number.to_string())
                    .unwrap_or_default();
                let mut s = format!(
                    "The host's tool list is out of date (current catalog revision {current}): let the agent refresh \
                     tools/list, or reconnect the server in the host if it ignores list_changed"
                );
                match (self.authorization, &self.approved_epoch) {
                    (Some(PendingAuthorization::Stale), Some(old)) => s.push_str(&format!(
                        "; {tool} was approved for epoch {old} only, so also {}",
                        approve()
                    )),
                    (Some(_), _) => s.push_str(&format!("; also {}", approve())),
                    (None, _) => {}
                }
                s.push('.');
                s
            }
            DenialReason::UnknownTool => {
                format!(
                    "{tool} is not in the server's current tool list: let the agent refresh tools/list."
                )
            }
            DenialReason::AuthorizationStale => format!(
                "{tool} was approved for epoch {}, but the server has been replaced since: review what changed and {}.",
                self.approved_epoch.as_deref().unwrap_or("?"),
                approve()
            ),
            DenialReason::AuthorizationRequired => {
                format!("{tool} needs your approval: {}.", approve())
            }
        }
    }
}

/// A denial as kept for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedCall {
    /// Milliseconds, as passed to [`Gate::decide_call`].
    pub at: u64,
    pub denial: Denial,
}

/// The states of the approval state machine (docs/ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No running server, or its catalog is not fetched yet: nothing is forwarded.
    IdentityPending,
    /// Catalog known, some tool in it is gated, and no live grant exists for this epoch.
    CatalogReady,
    /// Catalog known and either a live grant exists or nothing in the catalog is gated.
    Ready,
}

/// The current server as far as the gate knows.
#[derive(Debug, Clone)]
struct Current {
    epoch: String,
    /// `None` until the supervisor has fetched this epoch's catalog: revision and, per tool,
    /// the digest of its definition.
    catalog: Option<(CatalogRevision, BTreeMap<String, String>)>,
}

/// One tool as the host connection was last shown it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownTool {
    /// Digest of the definition (the fields the catalog digest covers).
    pub digest: String,
    /// The catalog revision it was shown in, when it was the current one.
    pub revision: Option<u64>,
}

/// The gate of one agent run against one server label.
#[derive(Debug, Clone)]
pub struct Gate {
    policy: Policy,
    agent_run: String,
    server_label: String,
    current: Option<Current>,
    /// Digest of the last whole catalog the host was shown.
    host_catalog: Option<String>,
    /// Per tool, what the host was last shown (`None`: never shown a catalog).
    host_view: Option<BTreeMap<String, ShownTool>>,
    /// Grants for the current epoch that have not expired or been revoked.
    live: Vec<Grant>,
    /// Grants of past epochs (oldest first); kept only to explain denials.
    stale: Vec<Grant>,
    run_ended: bool,
    denials: Vec<DeniedCall>,
    /// Gated tools that were refused for lack of a grant and not approved since.
    requested: BTreeSet<String>,
}

impl Gate {
    pub fn new(policy: Policy, agent_run: String, server_label: String) -> Gate {
        Gate {
            policy,
            agent_run,
            server_label,
            current: None,
            host_catalog: None,
            host_view: None,
            live: Vec::new(),
            stale: Vec::new(),
            run_ended: false,
            denials: Vec::new(),
            requested: BTreeSet::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn agent_run(&self) -> &str {
        &self.agent_run
    }

    pub fn server_label(&self) -> &str {
        &self.server_label
    }

    /// A new child was started under `epoch` (minted by the supervisor): identity is pending,
    /// the catalog is unknown, and every grant issued so far is stale. Epochs are never reused;
    /// if the same value arrives twice it is still treated as a new child (the safe reading).
    pub fn epoch_started(&mut self, epoch: &str) {
        self.retire_live_grants();
        self.current = Some(Current {
            epoch: epoch.to_owned(),
            catalog: None,
        });
    }

    /// The supervisor fetched the full catalog of `epoch`. Ignored (returns `false`) when `epoch`
    /// is not the current one, e.g. a late answer from a replaced child. A refresh in the same
    /// epoch keeps the epoch and its grants: grants name tools explicitly, so a tool that appears
    /// in the new catalog is not covered unless a grant already named it.
    pub fn catalog_fetched(
        &mut self,
        epoch: &str,
        revision: CatalogRevision,
        tools: BTreeMap<String, String>,
    ) -> bool {
        match &mut self.current {
            Some(current) if current.epoch == epoch => {
                current.catalog = Some((revision, tools));
                true
            }
            _ => false,
        }
    }

    /// The host received a whole catalog (a `tools/list` answer, all pages): its digest, the
    /// revision it is (when it is the current one) and each tool's definition digest.
    pub fn host_shown_catalog(
        &mut self,
        digest: &str,
        revision: Option<u64>,
        tools: BTreeMap<String, String>,
    ) {
        self.host_catalog = Some(digest.to_owned());
        self.host_view = Some(
            tools
                .into_iter()
                .map(|(name, digest)| (name, ShownTool { digest, revision }))
                .collect(),
        );
    }

    /// The host was shown one tool's current definition (a stale-call result carries it), or
    /// that it is gone (`None`). The next call of that tool is judged against it.
    pub fn host_shown_tool(&mut self, tool: &str, digest: Option<String>, revision: Option<u64>) {
        let view = self.host_view.get_or_insert_with(BTreeMap::new);
        match digest {
            Some(digest) => {
                view.insert(tool.to_owned(), ShownTool { digest, revision });
            }
            None => {
                view.remove(tool);
            }
        }
    }

    /// What the host was shown of `tool`, if anything.
    pub fn host_shown(&self, tool: &str) -> Option<&ShownTool> {
        self.host_view.as_ref()?.get(tool)
    }

    /// Tools whose definition as shown to the host differs from the current catalog (or that
    /// are gone), sorted. Empty before either is known.
    pub fn stale_tools(&self) -> Vec<String> {
        let (Some(view), Some((_, current))) = (
            self.host_view.as_ref(),
            self.current.as_ref().and_then(|c| c.catalog.as_ref()),
        ) else {
            return Vec::new();
        };
        view.iter()
            .filter(|(name, shown)| current.get(*name) != Some(&shown.digest))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether a call of `tool` now would be judged stale.
    fn is_stale(&self, tool: &str, current: &BTreeMap<String, String>) -> bool {
        self.host_shown(tool)
            .is_some_and(|shown| current.get(tool) != Some(&shown.digest))
    }

    /// The child of `epoch` exited. Ignored (returns `false`) for any other epoch. Until the next
    /// [`Gate::epoch_started`] no call is forwarded, and the exited epoch's grants are stale.
    pub fn server_exited(&mut self, epoch: &str) -> bool {
        if self.current.as_ref().is_some_and(|c| c.epoch == epoch) {
            self.retire_live_grants();
            self.current = None;
            true
        } else {
            false
        }
    }

    /// Applies a human decision. The epoch is checked again here: a decision made while looking
    /// at an older epoch is void. A request containing any per-call tool yields one per-call grant
    /// (the stricter mode wins); approve per-call tools separately to keep the others per-epoch.
    pub fn approve(
        &mut self,
        req: ApprovalRequest,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        if self.run_ended {
            return Err(ApprovalError::RunEnded);
        }
        let current = match &self.current {
            Some(c) if c.epoch == req.epoch => c,
            other => {
                return Err(ApprovalError::EpochChanged {
                    requested: req.epoch,
                    current: other.as_ref().map(|c| c.epoch.clone()),
                });
            }
        };
        let Some((_, catalog)) = &current.catalog else {
            return Err(ApprovalError::NotReady);
        };
        if req.tools.is_empty() {
            return Err(ApprovalError::NoTools);
        }
        if let Some(tool) = req.tools.iter().find(|t| !catalog.contains_key(*t)) {
            return Err(ApprovalError::UnknownTool(tool.clone()));
        }
        if let Some(scope) = req
            .credential_scopes
            .iter()
            .find(|s| !self.policy.credential_scopes.contains_key(*s))
        {
            return Err(ApprovalError::UnknownScope(scope.clone()));
        }
        for tool in &req.tools {
            if let Some(scope) = self
                .policy
                .scopes_for(tool)
                .into_iter()
                .find(|s| !req.credential_scopes.contains(s))
            {
                return Err(ApprovalError::ScopeNotCovered {
                    tool: tool.clone(),
                    scope,
                });
            }
        }
        let per_call = req
            .tools
            .iter()
            .any(|t| self.policy.mode_for(t) == ApprovalMode::PerCall);
        let grant = Grant {
            id,
            agent_run: self.agent_run.clone(),
            server_label: self.server_label.clone(),
            execution_epoch: req.epoch,
            tool_scope: req.tools,
            credential_scope: req.credential_scopes,
            issued_at: now,
            expires_when: if per_call {
                Expiry::FirstUse
            } else {
                Expiry::RunEnd
            },
        };
        self.requested.retain(|t| !grant.tool_scope.contains(t));
        self.live.push(grant.clone());
        Ok(grant)
    }

    /// Removes grants (live or stale) and returns them, for the `approval_revoked` record.
    pub fn revoke(&mut self, target: RevokeTarget) -> Vec<Grant> {
        let matches = |g: &Grant| match &target {
            RevokeTarget::Id(id) => &g.id == id,
            RevokeTarget::All => true,
        };
        let mut removed = Vec::new();
        for list in [&mut self.live, &mut self.stale] {
            let (gone, kept): (Vec<Grant>, Vec<Grant>) = list.drain(..).partition(|g| matches(g));
            *list = kept;
            removed.extend(gone);
        }
        removed
    }

    /// The agent run ended (host disconnected): every grant expires and none can be issued.
    pub fn end_run(&mut self) {
        self.run_ended = true;
        self.live.clear();
        self.stale.clear();
        self.requested.clear();
    }

    pub fn run_ended(&self) -> bool {
        self.run_ended
    }

    /// Decides one `tools/call` (see the module doc for the order of checks). Forwarding under a
    /// per-call grant consumes it; a cancelled or failed call does not give it back, because the
    /// call may have run.
    pub fn decide_call(&mut self, tool: &str, now: u64) -> CallDecision {
        let scopes = self.policy.scopes_for(tool);
        let gated = self.policy.is_gated(tool);
        let mut denial = Denial {
            reason: DenialReason::IdentityPending,
            tool: tool.to_owned(),
            approved_epoch: None,
            current_epoch: self.current.as_ref().map(|c| c.epoch.clone()),
            host_catalog: self.host_catalog.clone(),
            current_catalog: None,
            credential_scopes: scopes.iter().cloned().collect(),
            authorization: None,
        };
        let Some((revision, catalog)) = self.current.as_ref().and_then(|c| c.catalog.as_ref())
        else {
            return self.deny(denial, gated, now);
        };
        denial.current_catalog = Some(revision.clone());
        let in_catalog = catalog.contains_key(tool);
        let live = self.live.iter().position(|g| g.covers(tool, &scopes));
        let stale = self
            .stale
            .iter()
            .rev()
            .find(|g| g.tool_scope.contains(tool))
            .map(|g| g.execution_epoch.clone());

        // A call is stale when this tool's definition as the host was shown it differs from the
        // current one (or the tool is gone). A host that was never shown the tool (e.g. a
        // one-shot CLI call) is judged against the current catalog; approval rules still apply.
        if self.is_stale(tool, catalog) {
            denial.reason = DenialReason::CatalogStale;
            if gated && in_catalog && live.is_none() {
                denial.authorization = Some(if stale.is_some() {
                    PendingAuthorization::Stale
                } else {
                    PendingAuthorization::Required
                });
                denial.approved_epoch = stale;
            }
            let record = denial.authorization.is_some();
            return self.deny(denial, record, now);
        }
        if !in_catalog {
            denial.reason = DenialReason::UnknownTool;
            return self.deny(denial, false, now);
        }
        if !gated {
            return CallDecision::Forward {
                grant_id: None,
                credential_scopes: scopes.into_iter().collect(),
            };
        }
        // Prefer a per-epoch grant so a per-call grant is not spent when another grant suffices.
        let chosen = self
            .live
            .iter()
            .position(|g| g.expires_when == Expiry::RunEnd && g.covers(tool, &scopes))
            .or(live);
        if let Some(index) = chosen {
            let grant_id = if self.live[index].expires_when == Expiry::FirstUse {
                self.live.remove(index).id
            } else {
                self.live[index].id.clone()
            };
            return CallDecision::Forward {
                grant_id: Some(grant_id),
                credential_scopes: scopes.into_iter().collect(),
            };
        }
        match stale {
            Some(approved) => {
                denial.reason = DenialReason::AuthorizationStale;
                denial.approved_epoch = Some(approved);
            }
            None => denial.reason = DenialReason::AuthorizationRequired,
        }
        self.deny(denial, true, now)
    }

    fn deny(&mut self, denial: Denial, record_request: bool, now: u64) -> CallDecision {
        if record_request && !self.run_ended {
            self.requested.insert(denial.tool.clone());
        }
        if self.denials.len() == RECENT_DENIALS {
            self.denials.remove(0);
        }
        self.denials.push(DeniedCall {
            at: now,
            denial: denial.clone(),
        });
        CallDecision::Deny(denial)
    }

    fn retire_live_grants(&mut self) {
        self.stale.append(&mut self.live);
        let excess = self.stale.len().saturating_sub(STALE_GRANTS);
        self.stale.drain(..excess);
    }

    /// Tools (and the credential scopes they use) that were refused for lack of a grant and are
    /// still not covered: the defaults `cargo mcp-dev approve` proposes. Limited to the current
    /// catalog once it is known.
    pub fn pending_requests(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let catalog = self
            .current
            .as_ref()
            .and_then(|c| c.catalog.as_ref())
            .map(|(_, tools)| tools);
        let tools: BTreeSet<String> = self
            .requested
            .iter()
            .filter(|t| catalog.is_none_or(|c| c.contains_key(*t)))
            .filter(|t| {
                let scopes = self.policy.scopes_for(t);
                !self.live.iter().any(|g| g.covers(t, &scopes))
            })
            .cloned()
            .collect();
        let scopes = tools
            .iter()
            .flat_map(|t| self.policy.scopes_for(t))
            .collect();
        (tools, scopes)
    }

    /// The last [`RECENT_DENIALS`] denials, oldest first.
    pub fn recent_denials(&self) -> &[DeniedCall] {
        &self.denials
    }

    /// Grants that can still authorize a call: issued for the current epoch, not used up, not
    /// revoked, run not ended.
    pub fn grants(&self) -> &[Grant] {
        &self.live
    }

    pub fn phase(&self) -> Phase {
        match self.current.as_ref().and_then(|c| c.catalog.as_ref()) {
            None => Phase::IdentityPending,
            Some((_, tools))
                if self.live.is_empty() && tools.keys().any(|t| self.policy.is_gated(t)) =>
            {
                Phase::CatalogReady
            }
            Some(_) => Phase::Ready,
        }
    }

    pub fn current_epoch(&self) -> Option<&str> {
        self.current.as_ref().map(|c| c.epoch.as_str())
    }

    /// The revision of the current epoch's catalog, once fetched.
    pub fn current_catalog(&self) -> Option<&CatalogRevision> {
        self.current
            .as_ref()
            .and_then(|c| c.catalog.as_ref())
            .map(|(rev, _)| rev)
    }

    /// Digest of the catalog the host last fetched.
    pub fn host_catalog(&self) -> Option<&str> {
        self.host_catalog.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const A: &str = "01JQ7R4S4S0QJ7GZP1S2";
    const B: &str = "01JQ7R9KQ6K2Y8W4JH0M";
    const API: &str = "inventory-api";

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn rev(number: u64, tag: &str) -> CatalogRevision {
        CatalogRevision {
            number,
            digest: format!("sha256:{tag}"),
        }
    }

    /// Per-tool definition digests of a catalog tagged `tag`: tools of catalogs with the same
    /// tag are unchanged, with different tags all changed.
    fn cat(tag: &str, names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| (n.to_string(), format!("{tag}:{n}")))
            .collect()
    }

    impl Gate {
        /// The host was shown catalog `sha256:<tag>` holding the current catalog's tools.
        fn host_fetched_catalog(&mut self, digest: &str) {
            let tag = digest.trim_start_matches("sha256:");
            let names: Vec<String> = self
                .current
                .as_ref()
                .and_then(|c| c.catalog.as_ref())
                .map(|(_, t)| t.keys().cloned().collect())
                .unwrap_or_default();
            let view = names
                .into_iter()
                .map(|n| {
                    let d = format!("{tag}:{n}");
                    (n, d)
                })
                .collect();
            self.host_shown_catalog(digest, None, view);
        }
    }

    /// read_item exempt; write_item uses `inventory-api`; delete_item is per-call.
    fn policy() -> Policy {
        Policy {
            gating: Gating::All {
                exempt: set(&["read_item"]),
            },
            mode: ApprovalMode::PerEpoch,
            per_call_tools: set(&["delete_item"]),
            credential_scopes: BTreeMap::from([(
                API.to_owned(),
                CredentialScope {
                    env: vec!["INVENTORY_TOKEN".into()],
                    tools: set(&["write_item", "delete_item"]),
                },
            )]),
        }
    }

    fn gate() -> Gate {
        Gate::new(policy(), "run-1".into(), "inventory".into())
    }

    /// A gate at `ready(epoch, catalog 1)` with the host up to date and no grants.
    fn ready_gate(epoch: &str) -> Gate {
        let mut g = gate();
        g.epoch_started(epoch);
        assert!(g.catalog_fetched(
            epoch,
            rev(1, "c1"),
            cat("c1", &["read_item", "write_item", "delete_item"])
        ));
        g.host_fetched_catalog("sha256:c1");
        g
    }

    fn req(epoch: &str, tools: &[&str], scopes: &[&str]) -> ApprovalRequest {
        ApprovalRequest {
            epoch: epoch.into(),
            tools: set(tools),
            credential_scopes: set(scopes),
        }
    }

    fn denial(d: CallDecision) -> Denial {
        match d {
            CallDecision::Deny(d) => d,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    fn reason(g: &mut Gate, tool: &str) -> &'static str {
        match g.decide_call(tool, 0) {
            CallDecision::Deny(d) => d.reason.as_str(),
            CallDecision::Forward { .. } => "forward",
        }
    }

    #[test]
    fn policy_gating_modes_and_scopes() {
        let only = Gating::Only(set(&["w"]));
        assert!(only.is_gated("w") && !only.is_gated("r"));
        assert!(!Gating::Off.is_gated("w"));
        let all = Gating::All {
            exempt: set(&["r"]),
        };
        assert!(all.is_gated("w") && !all.is_gated("r"));
        assert_eq!(
            Policy::default().gating,
            Gating::All {
                exempt: BTreeSet::new()
            }
        );

        let mut p = policy();
        assert_eq!(p.mode_for("write_item"), ApprovalMode::PerEpoch);
        assert_eq!(p.mode_for("delete_item"), ApprovalMode::PerCall);
        p.mode = ApprovalMode::PerCall;
        assert_eq!(
            p.mode_for("write_item"),
            ApprovalMode::PerCall,
            "global per-call is stricter"
        );
        assert_eq!(p.scopes_for("write_item"), set(&[API]));
        assert!(p.scopes_for("read_item").is_empty());
    }

    #[test]
    fn walk_through_the_design_state_machine() {
        let mut g = gate();
        // Nothing running yet.
        assert_eq!(g.phase(), Phase::IdentityPending);
        assert_eq!(reason(&mut g, "write_item"), "identity_pending");
        assert_eq!(
            g.approve(req(A, &["write_item"], &[API]), 1, "g0".into()),
            Err(ApprovalError::EpochChanged {
                requested: A.into(),
                current: None
            })
        );

        // Worker started: identity pending until its catalog is fetched.
        g.epoch_started(A);
        assert_eq!(
            (g.phase(), g.current_epoch()),
            (Phase::IdentityPending, Some(A))
        );
        let d = denial(g.decide_call("read_item", 2));
        assert_eq!(
            (d.reason, d.current_epoch.as_deref()),
            (DenialReason::IdentityPending, Some(A))
        );
        assert_eq!(
            g.approve(req(A, &["write_item"], &[API]), 2, "g0".into()),
            Err(ApprovalError::NotReady)
        );
        assert!(
            !g.catalog_fetched(B, rev(1, "c1"), cat("c1", &["write_item"])),
            "other epoch's catalog is ignored"
        );
        assert_eq!(g.phase(), Phase::IdentityPending);

        // Supervisor fetched tools/list: catalog-ready. A host that never listed holds no
        // revision to be stale against; one that holds an older one (here the `[]` answered
        // during a cold build) is refused until it refetches.
        assert!(g.catalog_fetched(
            A,
            rev(1, "c1"),
            cat("c1", &["read_item", "write_item", "delete_item"])
        ));
        assert_eq!(g.phase(), Phase::CatalogReady);
        assert_eq!(g.current_catalog(), Some(&rev(1, "c1")));
        let d = denial(g.decide_call("write_item", 3));
        assert_eq!(
            (d.reason, d.authorization),
            (DenialReason::AuthorizationRequired, None)
        );
        g.host_fetched_catalog("sha256:c0");
        let d = denial(g.decide_call("write_item", 3));
        assert_eq!(
            (d.reason, d.authorization),
            (
                DenialReason::CatalogStale,
                Some(PendingAuthorization::Required)
            )
        );
        g.host_fetched_catalog("sha256:c1");
        assert_eq!(g.host_catalog(), Some("sha256:c1"));
        assert_eq!(reason(&mut g, "write_item"), "authorization_required");
        assert_eq!(reason(&mut g, "nope"), "unknown_tool");
        assert_eq!(
            g.decide_call("read_item", 4),
            CallDecision::Forward {
                grant_id: None,
                credential_scopes: vec![]
            },
            "exempt tools need no grant"
        );

        // Reviewer approves: ready(A, 1, grant A).
        let grant = g
            .approve(req(A, &["write_item"], &[API]), 5, "gA".into())
            .expect("approved");
        assert_eq!(grant.expires_when, Expiry::RunEnd);
        assert_eq!(g.phase(), Phase::Ready);
        for _ in 0..2 {
            assert_eq!(
                g.decide_call("write_item", 6),
                CallDecision::Forward {
                    grant_id: Some("gA".into()),
                    credential_scopes: vec![API.into()]
                }
            );
        }
        assert_eq!(
            g.pending_requests(),
            (BTreeSet::new(), BTreeSet::new()),
            "approval cleared the request"
        );

        // A build that is not applied changes nothing (there is no event for it).
        // Worker restarts: identity-pending(B), approval A invalid.
        g.epoch_started(B);
        assert_eq!(g.phase(), Phase::IdentityPending);
        assert!(g.grants().is_empty());
        assert_eq!(reason(&mut g, "write_item"), "identity_pending");
        assert_eq!(
            g.approve(req(A, &["write_item"], &[API]), 7, "late".into()),
            Err(ApprovalError::EpochChanged {
                requested: A.into(),
                current: Some(B.into())
            }),
            "a decision made for the old epoch is void"
        );

        // Same catalog digest after the restart: no refetch needed, but the grant is stale.
        assert!(g.catalog_fetched(
            B,
            rev(1, "c1"),
            cat("c1", &["read_item", "write_item", "delete_item"])
        ));
        assert_eq!(g.phase(), Phase::CatalogReady);
        let d = denial(g.decide_call("write_item", 8));
        assert_eq!(
            d.payload(),
            json!({"error": "authorization_stale", "reason": "server execution epoch changed",
                   "approvedEpoch": A, "currentEpoch": B,
                   "retry": "refresh tool metadata and request authorization",
                   "tool": "write_item", "credentialScopes": [API]})
        );
        assert_eq!(
            d.human_hint(),
            format!(
                "write_item was approved for epoch {A}, but the server has been replaced since: review what changed \
                 and run `cargo mcp-dev approve --tool write_item --credential-scope {API}` in the project to \
                 approve write_item for epoch {B}."
            )
        );

        // The catalog changes too: stale catalog first, with the stale authorization attached.
        assert!(g.catalog_fetched(
            B,
            rev(2, "c2"),
            cat("c2", &["read_item", "write_item", "delete_item"])
        ));
        let d = denial(g.decide_call("write_item", 9));
        assert_eq!(d.reason, DenialReason::CatalogStale);
        assert_eq!(d.payload()["authorization"], "stale");
        assert_eq!(d.payload()["approvedEpoch"], A);
        assert_eq!(d.payload()["hostCatalog"], "sha256:c1");
        assert_eq!(
            d.payload()["currentCatalog"],
            json!({"revision": 2, "digest": "sha256:c2"})
        );
        assert!(
            d.human_hint()
                .contains(&format!("approved for epoch {A} only")),
            "{}",
            d.human_hint()
        );
        g.host_fetched_catalog("sha256:c2");
        assert_eq!(reason(&mut g, "write_item"), "authorization_stale");
        assert_eq!(g.pending_requests(), (set(&["write_item"]), set(&[API])));

        // Approve B: ready(B, 2, grant B).
        g.approve(req(B, &["write_item"], &[API]), 10, "gB".into())
            .expect("approved");
        assert_eq!(g.phase(), Phase::Ready);
        assert!(
            matches!(g.decide_call("write_item", 11), CallDecision::Forward { grant_id: Some(id), .. } if id == "gB")
        );

        // Same-epoch list_changed adding a tool: epoch and grant kept, the new tool not covered.
        assert!(g.catalog_fetched(
            B,
            rev(3, "c3"),
            cat("c3", &["read_item", "write_item", "delete_item", "gen_x"])
        ));
        assert_eq!(g.current_epoch(), Some(B));
        assert_eq!(reason(&mut g, "write_item"), "catalog_stale");
        g.host_fetched_catalog("sha256:c3");
        assert_eq!(reason(&mut g, "write_item"), "forward");
        assert_eq!(
            reason(&mut g, "gen_x"),
            "authorization_required",
            "a changed catalog never widens a grant"
        );

        // Crash: a late exit of an old epoch is ignored; the current one makes identity pending.
        assert!(!g.server_exited(A));
        assert_eq!(g.phase(), Phase::Ready);
        assert!(g.server_exited(B));
        assert_eq!(
            (g.phase(), g.current_epoch()),
            (Phase::IdentityPending, None)
        );
        let d = denial(g.decide_call("write_item", 12));
        assert_eq!(d.payload()["error"], "identity_pending");
        assert!(d.payload().get("currentEpoch").is_none());
    }

    #[test]
    fn per_call_grants_authorize_exactly_one_call() {
        let mut g = ready_gate(A);
        let grant = g
            .approve(req(A, &["delete_item"], &[API]), 1, "p1".into())
            .expect("approved");
        assert_eq!(grant.expires_when, Expiry::FirstUse);
        assert!(
            matches!(g.decide_call("delete_item", 2), CallDecision::Forward { grant_id: Some(id), .. } if id == "p1")
        );
        assert!(g.grants().is_empty());
        assert_eq!(reason(&mut g, "delete_item"), "authorization_required");

        // Mixed request: the stricter mode wins for the whole grant.
        let grant = g
            .approve(
                req(A, &["delete_item", "write_item"], &[API]),
                3,
                "p2".into(),
            )
            .unwrap();
        assert_eq!(grant.expires_when, Expiry::FirstUse);
        assert_eq!(reason(&mut g, "write_item"), "forward");
        assert_eq!(reason(&mut g, "delete_item"), "authorization_required");

        // A per-epoch grant is used before a per-call one that also covers the tool.
        g.approve(
            req(A, &["delete_item", "write_item"], &[API]),
            4,
            "p3".into(),
        )
        .unwrap();
        g.approve(req(A, &["write_item"], &[API]), 5, "e1".into())
            .unwrap();
        assert!(
            matches!(g.decide_call("write_item", 6), CallDecision::Forward { grant_id: Some(id), .. } if id == "e1")
        );
        assert_eq!(
            g.grants().iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
            ["p3", "e1"]
        );
    }

    #[test]
    fn approval_errors() {
        let mut g = ready_gate(A);
        let cases = [
            (
                req(B, &["write_item"], &[API]),
                ApprovalError::EpochChanged {
                    requested: B.into(),
                    current: Some(A.into()),
                },
            ),
            (req(A, &[], &[]), ApprovalError::NoTools),
            (
                req(A, &["write_item", "gen_x"], &[API]),
                ApprovalError::UnknownTool("gen_x".into()),
            ),
            (
                req(A, &["write_item"], &[API, "prod-db"]),
                ApprovalError::UnknownScope("prod-db".into()),
            ),
            (
                req(A, &["read_item", "write_item"], &[]),
                ApprovalError::ScopeNotCovered {
                    tool: "write_item".into(),
                    scope: API.into(),
                },
            ),
        ];
        for (r, expected) in cases {
            assert_eq!(g.approve(r.clone(), 1, "x".into()), Err(expected), "{r:?}");
        }
        assert!(g.grants().is_empty(), "a refused approval leaves no grant");
        g.end_run();
        assert_eq!(
            g.approve(req(A, &["read_item"], &[]), 1, "x".into()),
            Err(ApprovalError::RunEnded)
        );
        assert!(
            ApprovalError::EpochChanged {
                requested: A.into(),
                current: None
            }
            .to_string()
            .contains("not running")
        );
    }

    #[test]
    fn revoke_and_end_run() {
        let mut g = ready_gate(A);
        g.approve(req(A, &["write_item"], &[API]), 1, "g1".into())
            .unwrap();
        g.approve(req(A, &["read_item"], &[]), 1, "g2".into())
            .unwrap();
        assert_eq!(g.revoke(RevokeTarget::Id("nope".into())), vec![]);
        let gone = g.revoke(RevokeTarget::Id("g1".into()));
        assert_eq!(
            gone.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
            ["g1"]
        );
        assert_eq!(
            reason(&mut g, "write_item"),
            "authorization_required",
            "revoked, not stale"
        );
        g.approve(req(A, &["write_item"], &[API]), 1, "g3".into())
            .unwrap();
        g.epoch_started(B);
        // Revoking a stale grant turns authorization_stale into authorization_required.
        assert_eq!(g.revoke(RevokeTarget::All).len(), 2);
        g.catalog_fetched(B, rev(1, "c1"), cat("c1", &["write_item"]));
        assert_eq!(reason(&mut g, "write_item"), "authorization_required");

        g.approve(req(B, &["write_item"], &[API]), 1, "g4".into())
            .unwrap();
        assert!(!g.run_ended());
        g.end_run();
        assert!(g.run_ended() && g.grants().is_empty());
        assert_eq!(reason(&mut g, "write_item"), "authorization_required");
        assert_eq!(g.pending_requests(), (BTreeSet::new(), BTreeSet::new()));
    }

    #[test]
    fn gating_off_and_only() {
        let mut p = policy();
        p.gating = Gating::Off;
        let mut g = Gate::new(p, "r".into(), "l".into());
        g.epoch_started(A);
        assert_eq!(
            reason(&mut g, "write_item"),
            "identity_pending",
            "gating off still waits for identity"
        );
        g.catalog_fetched(A, rev(1, "c1"), cat("c1", &["write_item"]));
        assert_eq!(g.phase(), Phase::Ready);
        g.host_fetched_catalog("sha256:c0");
        assert_eq!(
            reason(&mut g, "write_item"),
            "catalog_stale",
            "gating off still refuses stale catalogs"
        );
        g.host_fetched_catalog("sha256:c1");
        assert_eq!(
            g.decide_call("write_item", 0),
            CallDecision::Forward {
                grant_id: None,
                credential_scopes: vec![API.into()]
            }
        );

        let mut p = policy();
        p.gating = Gating::Only(set(&["write_item"]));
        let mut g = Gate::new(p, "r".into(), "l".into());
        g.epoch_started(A);
        g.catalog_fetched(A, rev(1, "c1"), cat("c1", &["write_item", "delete_item"]));
        g.host_fetched_catalog("sha256:c1");
        assert_eq!(reason(&mut g, "delete_item"), "forward");
        assert_eq!(reason(&mut g, "write_item"), "authorization_required");
    }

    #[test]
    fn every_denial_payload_and_hint() {
        let ep = |s: &str| Some(s.to_owned());
        let base = Denial {
            reason: DenialReason::IdentityPending,
            tool: "write_item".into(),
            approved_epoch: None,
            current_epoch: ep(B),
            host_catalog: Some("sha256:c1".into()),
            current_catalog: Some(rev(2, "c2")),
            credential_scopes: vec![],
            authorization: None,
        };
        let cases = [
            (
                Denial {
                    current_catalog: None,
                    ..base.clone()
                },
                json!({"error": "identity_pending",
                       "reason": "server is starting or restarting; its execution epoch and tool catalog are not known yet",
                       "currentEpoch": B,
                       "retry": "wait for the server to come up, refresh tool metadata, then call again",
                       "tool": "write_item"}),
                "wait until the status line shows the server running",
            ),
            (
                Denial {
                    reason: DenialReason::CatalogStale,
                    ..base.clone()
                },
                json!({"error": "catalog_stale", "reason": "tool catalog changed since the host last fetched it",
                       "currentEpoch": B, "hostCatalog": "sha256:c1",
                       "currentCatalog": {"revision": 2, "digest": "sha256:c2"},
                       "retry": "refresh tool metadata (tools/list), then call again", "tool": "write_item"}),
                "refresh tools/list",
            ),
            (
                Denial {
                    reason: DenialReason::CatalogStale,
                    authorization: Some(PendingAuthorization::Required),
                    ..base.clone()
                },
                json!({"error": "catalog_stale", "reason": "tool catalog changed since the host last fetched it",
                       "currentEpoch": B, "hostCatalog": "sha256:c1",
                       "currentCatalog": {"revision": 2, "digest": "sha256:c2"}, "authorization": "required",
                       "retry": "refresh tool metadata (tools/list), then call again", "tool": "write_item"}),
                "also run `cargo mcp-dev approve --tool write_item`",
            ),
            (
                Denial {
                    reason: DenialReason::UnknownTool,
                    ..base.clone()
                },
                json!({"error": "unknown_tool", "reason": "tool is not in the current catalog", "currentEpoch": B,
                       "currentCatalog": {"revision": 2, "digest": "sha256:c2"},
                       "retry": "refresh tool metadata (tools/list) and call a listed tool", "tool": "write_item"}),
                "not in the server's current tool list",
            ),
            (
                Denial {
                    reason: DenialReason::AuthorizationStale,
                    approved_epoch: ep(A),
                    ..base.clone()
                },
                json!({"error": "authorization_stale", "reason": "server execution epoch changed",
                       "approvedEpoch": A, "currentEpoch": B,
                       "retry": "refresh tool metadata and request authorization", "tool": "write_item"}),
                "was approved for epoch 01JQ7R4S4S0QJ7GZP1S2",
            ),
            (
                Denial {
                    reason: DenialReason::AuthorizationRequired,
                    credential_scopes: vec![API.into()],
                    ..base.clone()
                },
                json!({"error": "authorization_required",
                       "reason": "tool requires human approval for this execution epoch", "currentEpoch": B,
                       "retry": "request authorization from the user, then call again", "tool": "write_item",
                       "credentialScopes": [API]}),
                "run `cargo mcp-dev approve --tool write_item --credential-scope inventory-api` in the project to approve write_item for epoch 01JQ7R9KQ6K2Y8W4JH0M",
            ),
        ];
        for (d, payload, hint) in cases {
            assert_eq!(d.payload(), payload, "{:?}", d.reason);
            let h = d.human_hint();
            assert!(h.contains(hint), "{:?}: {h}", d.reason);
            assert!(h.ends_with('.') && !h.contains('\n'), "one sentence: {h}");
        }
    }

    #[test]
    fn denials_are_recorded_bounded_and_feed_approve_defaults() {
        let mut g = ready_gate(A);
        assert_eq!(reason(&mut g, "write_item"), "authorization_required");
        assert_eq!(reason(&mut g, "ghost"), "unknown_tool");
        assert_eq!(reason(&mut g, "read_item"), "forward");
        assert_eq!(
            g.pending_requests(),
            (set(&["write_item"]), set(&[API])),
            "unknown tools are not requested"
        );
        assert_eq!(g.recent_denials().len(), 2);
        for i in 0..(RECENT_DENIALS as u64 + 5) {
            g.decide_call("ghost", 100 + i);
        }
        assert_eq!(g.recent_denials().len(), RECENT_DENIALS);
        assert_eq!(
            g.recent_denials().last().map(|d| d.at),
            Some(100 + RECENT_DENIALS as u64 + 4)
        );
        // A request for a tool that leaves the catalog is no longer proposed.
        g.catalog_fetched(A, rev(2, "c2"), cat("c2", &["read_item"]));
        assert_eq!(g.pending_requests().0, BTreeSet::new());
    }

    #[test]
    fn grant_serializes_with_design_names() {
        let mut g = ready_gate(A);
        let grant = g
            .approve(
                req(A, &["delete_item"], &[API]),
                1_700_000_000_000,
                "01JGRANT".into(),
            )
            .unwrap();
        let value = serde_json::to_value(&grant).unwrap();
        assert_eq!(
            value,
            json!({"id": "01JGRANT", "agentRun": "run-1", "serverLabel": "inventory", "executionEpoch": A,
                   "toolScope": ["delete_item"], "credentialScope": [API], "issuedAt": 1_700_000_000_000u64,
                   "expiresWhen": "firstUse"})
        );
        assert_eq!(serde_json::from_value::<Grant>(value).unwrap(), grant);
    }

    /// Random event sequences checked against an independent model of the rules.
    mod model {
        use super::*;
        use crate::catalog::{Catalog, CatalogHistory};
        use proptest::prelude::*;

        const TOOLS: [&str; 5] = [
            "read_item",
            "write_item",
            "delete_item",
            "publish",
            "gen_tool",
        ];

        #[derive(Debug, Clone)]
        enum Step {
            /// A build whose result is not applied (manual mode, or the same bytes).
            BuildWithoutRestart,
            Restart,
            /// `exit_old`: a late exit notice for a replaced epoch.
            Crash {
                exit_old: bool,
            },
            /// Supervisor fetch (after a restart, or a same-epoch list_changed). `late`: the answer of
            /// a replaced epoch.
            CatalogFetch {
                tools: Vec<usize>,
                variant: u8,
                late: bool,
            },
            /// `stale`: the host fetched an older catalog.
            HostRefetch {
                stale: bool,
            },
            Approve {
                epoch: u8,
                tools: Vec<usize>,
                scopes: u8,
            },
            Call {
                tool: usize,
            },
            Cancel,
            Revoke {
                all: bool,
                pick: usize,
            },
            EndRun,
        }

        fn step() -> impl Strategy<Value = Step> {
            // Sizes chosen so that approvals often name tools of the current catalog.
            let tools = |n| prop::collection::vec(0..TOOLS.len() + 1, n);
            prop_oneof![
                1 => Just(Step::BuildWithoutRestart),
                2 => Just(Step::Restart),
                1 => any::<bool>().prop_map(|exit_old| Step::Crash { exit_old }),
                3 => (tools(1..7), 0u8..3, prop::bool::weighted(0.15))
                    .prop_map(|(tools, variant, late)| Step::CatalogFetch { tools, variant, late }),
                3 => prop::bool::weighted(0.2).prop_map(|stale| Step::HostRefetch { stale }),
                4 => (0u8..5, tools(0..3), 0u8..6).prop_map(|(epoch, tools, scopes)| Step::Approve { epoch, tools, scopes }),
                8 => (0..TOOLS.len() + 1).prop_map(|tool| Step::Call { tool }),
                1 => Just(Step::Cancel),
                1 => (any::<bool>(), any::<usize>()).prop_map(|(all, pick)| Step::Revoke { all, pick }),
                1 => prop::bool::weighted(0.1).prop_map(|end| if end { Step::EndRun } else { Step::Cancel }),
            ]
        }

        fn random_policy() -> impl Strategy<Value = Policy> {
            (
                0u8..3,
                any::<bool>(),
                prop::collection::btree_set(0..TOOLS.len(), 0..3),
            )
                .prop_map(|(gating, per_call, per_call_tools)| Policy {
                    gating: match gating {
                        0 => Gating::Off,
                        1 => Gating::All {
                            exempt: set(&["read_item"]),
                        },
                        _ => Gating::Only(set(&["write_item", "delete_item", "gen_tool"])),
                    },
                    mode: if per_call {
                        ApprovalMode::PerCall
                    } else {
                        ApprovalMode::PerEpoch
                    },
                    per_call_tools: per_call_tools
                        .into_iter()
                        .map(|i| TOOLS[i].to_owned())
                        .collect(),
                    credential_scopes: BTreeMap::from([
                        (
                            "api".to_owned(),
                            CredentialScope {
                                env: vec![],
                                tools: set(&["write_item", "publish"]),
                            },
                        ),
                        (
                            "db".to_owned(),
                            CredentialScope {
                                env: vec![],
                                tools: set(&["delete_item", "write_item"]),
                            },
                        ),
                    ]),
                })
        }

        fn tool_name(i: usize) -> String {
            TOOLS.get(i).copied().unwrap_or("ghost").to_owned()
        }

        #[derive(Debug, Clone)]
        struct ModelGrant {
            id: String,
            epoch: String,
            tools: BTreeSet<String>,
            scopes: BTreeSet<String>,
            per_call: bool,
            /// False once used (per-call), revoked, or the run ended.
            alive: bool,
        }

        /// The rules restated from the module doc, independent of `Gate`'s data layout.
        #[derive(Debug)]
        struct Model {
            policy: Policy,
            epochs: Vec<String>,
            running: Option<String>,
            /// Digest and, per tool, its definition digest.
            catalog: Option<(String, BTreeMap<String, String>)>,
            /// Per tool, what the host was last shown.
            host: Option<BTreeMap<String, String>>,
            grants: Vec<ModelGrant>,
            ended: bool,
        }

        impl Model {
            fn scopes(&self, tool: &str) -> BTreeSet<String> {
                self.policy
                    .credential_scopes
                    .iter()
                    .filter(|(_, s)| s.tools.contains(tool))
                    .map(|(n, _)| n.clone())
                    .collect()
            }

            fn gated(&self, tool: &str) -> bool {
                match &self.policy.gating {
                    Gating::Off => false,
                    Gating::All { exempt } => !exempt.contains(tool),
                    Gating::Only(t) => t.contains(tool),
                }
            }

            fn per_call(&self, tool: &str) -> bool {
                self.policy.mode == ApprovalMode::PerCall
                    || self.policy.per_call_tools.contains(tool)
            }

            /// Grants that may authorize `tool` right now.
            fn valid(&self, tool: &str) -> Vec<&ModelGrant> {
                let need = self.scopes(tool);
                self.grants
                    .iter()
                    .filter(|g| g.alive && Some(&g.epoch) == self.running.as_ref())
                    .filter(|g| g.tools.contains(tool) && need.is_subset(&g.scopes))
                    .collect()
            }

            fn stale_epochs(&self, tool: &str) -> BTreeSet<String> {
                self.grants
                    .iter()
                    .filter(|g| {
                        g.alive && Some(&g.epoch) != self.running.as_ref() && g.tools.contains(tool)
                    })
                    .map(|g| g.epoch.clone())
                    .collect()
            }

            fn expected_call(&self, tool: &str) -> Result<(), DenialReason> {
                let Some((_, tools)) = &self.catalog else {
                    return Err(DenialReason::IdentityPending);
                };
                // Stale only when this tool, as the host was shown it, differs or is gone.
                if let Some(shown) = self.host.as_ref().and_then(|h| h.get(tool))
                    && tools.get(tool) != Some(shown)
                {
                    return Err(DenialReason::CatalogStale);
                }
                if !tools.contains_key(tool) {
                    return Err(DenialReason::UnknownTool);
                }
                if !self.gated(tool) || !self.valid(tool).is_empty() {
                    return Ok(());
                }
                if self.stale_epochs(tool).is_empty() {
                    Err(DenialReason::AuthorizationRequired)
                } else {
                    Err(DenialReason::AuthorizationStale)
                }
            }

            fn expected_approval(&self, r: &ApprovalRequest) -> Result<bool, ApprovalError> {
                if self.ended {
                    return Err(ApprovalError::RunEnded);
                }
                if self.running.as_ref() != Some(&r.epoch) {
                    return Err(ApprovalError::EpochChanged {
                        requested: r.epoch.clone(),
                        current: self.running.clone(),
                    });
                }
                let Some((_, tools)) = &self.catalog else {
                    return Err(ApprovalError::NotReady);
                };
                if r.tools.is_empty() {
                    return Err(ApprovalError::NoTools);
                }
                if let Some(t) = r.tools.iter().find(|t| !tools.contains_key(*t)) {
                    return Err(ApprovalError::UnknownTool(t.clone()));
                }
                if let Some(s) = r
                    .credential_scopes
                    .iter()
                    .find(|s| !self.policy.credential_scopes.contains_key(*s))
                {
                    return Err(ApprovalError::UnknownScope(s.clone()));
                }
                for t in &r.tools {
                    if let Some(s) = self
                        .scopes(t)
                        .into_iter()
                        .find(|s| !r.credential_scopes.contains(s))
                    {
                        return Err(ApprovalError::ScopeNotCovered {
                            tool: t.clone(),
                            scope: s,
                        });
                    }
                }
                Ok(r.tools.iter().any(|t| self.per_call(t)))
            }
        }

        fn catalog_json(tools: &BTreeSet<String>, variant: u8) -> Vec<Value> {
            tools
                .iter()
                .map(|t| json!({"name": t, "description": format!("{t} v{variant}")}))
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            #[test]
            fn gate_agrees_with_the_model(policy in random_policy(), steps in prop::collection::vec(step(), 1..60)) {
                let mut gate = Gate::new(policy.clone(), "run".into(), "label".into());
                let mut m = Model {
                    policy, epochs: vec![], running: None, catalog: None, host: None, grants: vec![], ended: false,
                };
                let mut history = CatalogHistory::new();
                let mut digests: Vec<(String, BTreeMap<String, String>)> = vec![];
                let mut next_id = 0u32;
                for (now, step) in steps.into_iter().enumerate() {
                    let now = now as u64;
                    match step {
                        Step::BuildWithoutRestart | Step::Cancel => {}
                        Step::Restart => {
                            let epoch = format!("E{}", m.epochs.len());
                            gate.epoch_started(&epoch);
                            m.epochs.push(epoch.clone());
                            m.running = Some(epoch);
                            m.catalog = None;
                        }
                        Step::Crash { exit_old } => {
                            let target = if exit_old { m.epochs.iter().rev().nth(1).cloned() } else { m.running.clone() };
                            if let Some(epoch) = target {
                                let applies = m.running.as_ref() == Some(&epoch);
                                prop_assert_eq!(gate.server_exited(&epoch), applies);
                                if applies {
                                    m.running = None;
                                    m.catalog = None;
                                }
                            }
                        }
                        Step::CatalogFetch { tools, variant, late } => {
                            let names: BTreeSet<String> = tools.into_iter().map(tool_name).collect();
                            let target = if late { m.epochs.iter().rev().nth(1).cloned() } else { m.running.clone() };
                            let Some(epoch) = target else { continue };
                            let accepted = m.running.as_ref() == Some(&epoch);
                            let catalog = Catalog::from_tools(catalog_json(&names, variant)).unwrap();
                            let catalog_digests = catalog.tool_digests().clone();
                            let revision = if accepted {
                                history.observe(catalog).0
                            } else {
                                CatalogRevision { number: 0, digest: catalog.digest().to_owned() }
                            };
                            let per_tool = catalog_digests.clone();
                            prop_assert_eq!(gate.catalog_fetched(&epoch, revision.clone(), per_tool.clone()), accepted);
                            if accepted {
                                digests.push((revision.digest.clone(), per_tool.clone()));
                                m.catalog = Some((revision.digest, per_tool));
                            }
                        }
                        Step::HostRefetch { stale } => {
                            let shown = if stale {
                                digests.iter().rev().nth(1).cloned()
                            } else {
                                m.catalog.clone()
                            };
                            if let Some((d, tools)) = shown {
                                gate.host_shown_catalog(&d, None, tools.clone());
                                m.host = Some(tools);
                            }
                        }
                        Step::Approve { epoch, tools, scopes } => {
                            let epoch = match epoch {
                                0 => m.epochs.iter().rev().nth(1).cloned().unwrap_or_else(|| "none".into()),
                                1 => "bogus".into(),
                                _ => m.running.clone().unwrap_or_else(|| "none".into()),
                            };
                            let scopes = match scopes {
                                0 => set(&[]),
                                1 => set(&["api"]),
                                2 => set(&["api", "db", "prod"]),
                                _ => set(&["api", "db"]),
                            };
                            let r = ApprovalRequest {
                                epoch,
                                tools: tools.into_iter().map(tool_name).collect(),
                                credential_scopes: scopes,
                            };
                            next_id += 1;
                            let id = format!("G{next_id}");
                            let expected = m.expected_approval(&r);
                            let got = gate.approve(r.clone(), now, id.clone());
                            match (expected, got) {
                                (Ok(per_call), Ok(grant)) => {
                                    prop_assert_eq!(&grant.id, &id);
                                    prop_assert_eq!(Some(&grant.execution_epoch), m.running.as_ref());
                                    prop_assert_eq!(&grant.tool_scope, &r.tools);
                                    prop_assert_eq!(grant.expires_when == Expiry::FirstUse, per_call);
                                    m.grants.push(ModelGrant {
                                        id, epoch: r.epoch, tools: r.tools, scopes: r.credential_scopes, per_call, alive: true,
                                    });
                                }
                                (Err(e), Err(g)) => prop_assert_eq!(e, g),
                                (e, g) => prop_assert!(false, "approve: model {:?}, gate {:?}", e, g),
                            }
                        }
                        Step::Call { tool } => {
                            let tool = tool_name(tool);
                            let expected = m.expected_call(&tool);
                            let stale_epochs = m.stale_epochs(&tool);
                            match gate.decide_call(&tool, now) {
                                CallDecision::Forward { grant_id, credential_scopes } => {
                                    prop_assert_eq!(expected, Ok(()), "forwarded {}", tool);
                                    // Invariants, stated directly.
                                    let (_, current) = m.catalog.as_ref().expect("catalog known");
                                    // Never on a definition the host was shown and is now outdated.
                                    let shown = m.host.as_ref().and_then(|h| h.get(&tool));
                                    prop_assert!(shown.is_none_or(|d| current.get(&tool) == Some(d)), "forwarded on a stale definition");
                                    prop_assert_eq!(credential_scopes.iter().cloned().collect::<BTreeSet<_>>(), m.scopes(&tool));
                                    if m.gated(&tool) {
                                        let id = grant_id.expect("gated tool forwarded without a grant");
                                        let need = m.scopes(&tool);
                                        let g = m.grants.iter_mut().find(|g| g.id == id).expect("grant exists");
                                        prop_assert!(g.alive, "grant {} used after expiry, use or revocation", id);
                                        prop_assert_eq!(Some(&g.epoch), m.running.as_ref(), "grant of another epoch");
                                        prop_assert!(g.tools.contains(&tool), "grant widened to {}", tool);
                                        prop_assert!(need.is_subset(&g.scopes), "scopes not covered");
                                        if g.per_call {
                                            g.alive = false;
                                        }
                                    } else {
                                        prop_assert_eq!(grant_id, None);
                                    }
                                }
                                CallDecision::Deny(d) => {
                                    prop_assert_eq!(expected, Err(d.reason), "tool {}", tool);
                                    prop_assert_eq!(d.current_epoch.as_ref(), m.running.as_ref());
                                    prop_assert_eq!(&d.tool, &tool);
                                    if d.reason == DenialReason::AuthorizationStale {
                                        let approved = d.approved_epoch.clone().expect("approvedEpoch");
                                        prop_assert!(stale_epochs.contains(&approved));
                                        prop_assert_ne!(Some(&approved), m.running.as_ref());
                                    }
                                    if d.reason == DenialReason::CatalogStale && d.authorization == Some(PendingAuthorization::Stale) {
                                        prop_assert!(stale_epochs.contains(d.approved_epoch.as_ref().expect("approvedEpoch")));
                                    }
                                    let payload = d.payload();
                                    prop_assert_eq!(payload["error"].as_str(), Some(d.reason.as_str()));
                                }
                            }
                        }
                        Step::Revoke { all, pick } => {
                            let ids: Vec<String> = m.grants.iter().filter(|g| g.alive).map(|g| g.id.clone()).collect();
                            let target = if all || ids.is_empty() {
                                RevokeTarget::All
                            } else {
                                RevokeTarget::Id(ids[pick % ids.len()].clone())
                            };
                            let removed: BTreeSet<String> = gate.revoke(target.clone()).into_iter().map(|g| g.id).collect();
                            let expected: BTreeSet<String> = m.grants.iter_mut()
                                .filter(|g| g.alive && (target == RevokeTarget::All || target == RevokeTarget::Id(g.id.clone())))
                                .map(|g| { g.alive = false; g.id.clone() })
                                .collect();
                            prop_assert_eq!(removed, expected);
                        }
                        Step::EndRun => {
                            gate.end_run();
                            m.ended = true;
                            m.grants.iter_mut().for_each(|g| g.alive = false);
                        }
                    }
                    // State invariants after every step.
                    prop_assert_eq!(gate.current_epoch(), m.running.as_deref());
                    prop_assert_eq!(gate.current_catalog().map(|r| &r.digest), m.catalog.as_ref().map(|(d, _)| d));
                    prop_assert_eq!(gate.phase() == Phase::IdentityPending, m.catalog.is_none());
                    let live: BTreeSet<&str> = gate.grants().iter().map(|g| g.id.as_str()).collect();
                    let model_live: BTreeSet<&str> = m.grants.iter()
                        .filter(|g| g.alive && Some(&g.epoch) == m.running.as_ref())
                        .map(|g| g.id.as_str())
                        .collect();
                    prop_assert_eq!(live, model_live);
                    prop_assert!(gate.grants().iter().all(|g| Some(g.execution_epoch.as_str()) == m.running.as_deref()));
                }
            }
        }
    }
}
