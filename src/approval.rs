//! The gate: the only place that decides whether a `tools/call` is forwarded to the server.
//!
//! Owns the approval policy ([`Policy`]), the grants a human issued for this agent run
//! ([`Grant`]), the state machine of DESIGN.md section 4 ([`Phase`]) and the denials it produces,
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
//! 2. `catalog_stale`: the host's last fetched catalog digest differs from the current one (an
//!    unchanged digest, even across a restart, needs no refetch);
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
                "The server is starting or restarting, so {tool} was refused rather than queued: wait for the \
                 `server replaced` status line, then let the agent refresh its tools and call again."
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

/// The states of DESIGN.md section 4.
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
    /// `None` until the supervisor has fetched this epoch's catalog.
    catalog: Option<(CatalogRevision, BTreeSet<String>)>,
}

/// The gate of one agent run against one server label.
#[derive(Debug, Clone)]
pub struct Gate {
    policy: Policy,
    agent_run: String,
    server_label: String,
    current: Option<Current>,
    host_catalog: Option<String>,
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
        tools: BTreeSet<String>,
    ) -> bool {
        match &mut self.current {
            Some(current) if current.epoch == epoch => {
                current.catalog = Some((revision, tools));
                true
            }
            _ => false,
        }
    }

    /// The host received a `tools/list` answer whose merged catalog has this digest.
    pub fn host_fetched_catalog(&mut self, digest: &str) {
        self.host_catalog = Some(digest.to_owned());
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
        if let Some(tool) = req.tools.iter().find(|t| !catalog.contains(*t)) {
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
        let in_catalog = catalog.contains(tool);
        let live = self.live.iter().position(|g| g.covers(tool, &scopes));
        let stale = self
            .stale
            .iter()
            .rev()
            .find(|g| g.tool_scope.contains(tool))
            .map(|g| g.execution_epoch.clone());

        if self.host_catalog.as_deref() != Some(revision.digest.as_str()) {
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
            .filter(|t| catalog.is_none_or(|c| c.contains(*t)))
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
                if self.live.is_empty() && tools.iter().any(|t| self.policy.is_gated(t)) =>
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
