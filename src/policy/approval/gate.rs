//! The gate: the state machine of one agent run against one server label, and the only place
//! that decides whether a `tools/call` is forwarded (rules in the module doc of `approval`).
//! Owns: what the host was shown, live and stale grants, denials. Reads, never keeps: the
//! running server's epoch and catalog ([`Serving`], handed in by the session, whose server slot
//! and catalog history are the one place those facts live).
//! Must not touch: I/O, the clock (times come in as arguments).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::identity::epoch::{AgentRunId, EpochId, GrantId};
use crate::policy::catalog::CatalogRevision;

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

/// The server that runs now, as the session knows it: the gate is handed this view for each
/// decision and keeps none of it (the session's server slot holds the epoch, its catalog history
/// the catalog; one fact, one place).
#[derive(Debug, Clone, Copy, Default)]
pub struct Serving<'a> {
    /// The running server's epoch; `None` while no server runs.
    pub epoch: Option<&'a EpochId>,
    /// That server's catalog, once the supervisor has fetched it (always `None` without an
    /// epoch).
    pub catalog: Option<ServedCatalog<'a>>,
}

/// The running server's catalog as the gate reads it.
#[derive(Debug, Clone, Copy)]
pub struct ServedCatalog<'a> {
    pub revision: &'a CatalogRevision,
    /// Each tool's definition digest.
    pub tools: &'a BTreeMap<String, String>,
}

impl<'a> Serving<'a> {
    /// No server runs.
    pub const NONE: Serving<'static> = Serving {
        epoch: None,
        catalog: None,
    };

    fn tools(&self) -> Option<&'a BTreeMap<String, String>> {
        self.catalog.map(|c| c.tools)
    }

    fn is_epoch(&self, epoch: &EpochId) -> bool {
        self.epoch == Some(epoch)
    }
}

/// The gate of one agent run against one server label.
#[derive(Debug, Clone)]
pub struct Gate {
    policy: Policy,
    agent_run: AgentRunId,
    server_label: String,
    /// What the host connection was shown (the one place that fact is kept).
    host: HostView,
    /// Grants for the current epoch that have not expired or been revoked.
    live: Vec<Grant>,
    /// Grants of past epochs (oldest first); kept only to explain denials.
    stale: Vec<Grant>,
    /// Grants used up by their one call, of any epoch (oldest first); kept only to explain
    /// denials (a refusal cites the newest grant, not an older epoch's). Never revoked (they
    /// authorize nothing); a revocation naming one forgets it.
    spent: Vec<Grant>,
    run_ended: bool,
    denials: Vec<DeniedCall>,
    /// Gated tools that were refused for lack of a grant and not approved since.
    requested: BTreeSet<String>,
    /// Compiled input schemas, per tool and definition digest (kept across epochs: a rebuild
    /// that serves the same definition compiles nothing).
    inputs: InputSchemas,
}

impl Gate {
    pub fn new(policy: Policy, agent_run: impl Into<AgentRunId>, server_label: String) -> Gate {
        Gate {
            policy,
            agent_run: agent_run.into(),
            server_label,
            host: HostView::default(),
            live: Vec::new(),
            stale: Vec::new(),
            spent: Vec::new(),
            run_ended: false,
            denials: Vec::new(),
            requested: BTreeSet::new(),
            inputs: InputSchemas::default(),
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

    /// The running server's epoch ended, or a new one began (a child exited, was replaced, or a
    /// new child was started): every grant issued so far is stale. The session calls this at
    /// each such transition of its server slot; a second call in a row changes nothing. A
    /// catalog refresh within an epoch is no transition: grants name tools explicitly, so a
    /// tool that appears in the new catalog is not covered unless a grant already named it.
    pub fn epoch_changed(&mut self) {
        self.retire_live_grants();
    }

    /// What the host connection holds: the session records what it shows the host here, and
    /// calls are judged against it.
    pub fn host_view(&self) -> &HostView {
        &self.host
    }

    pub fn host_view_mut(&mut self) -> &mut HostView {
        &mut self.host
    }

    /// What the host was shown of `tool`, if anything.
    pub fn host_shown(&self, tool: &str) -> Option<&ShownTool> {
        self.host.tool(tool)
    }

    /// Tools whose definition as shown to the host differs from the current catalog (or that
    /// are gone), sorted. Empty before either is known.
    pub fn stale_tools(&self, serving: Serving<'_>) -> Vec<String> {
        let Some(current) = serving.tools() else {
            return Vec::new();
        };
        self.host
            .tools()
            .filter(|(name, shown)| current.get(*name) != Some(&shown.digest))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether a call of `tool` now would be judged stale.
    fn is_stale(&self, tool: &str, current: &BTreeMap<String, String>) -> bool {
        self.host_shown(tool)
            .is_some_and(|shown| current.get(tool) != Some(&shown.digest))
    }

    /// Applies a human decision. The epoch is checked again here: a decision made while looking
    /// at an older epoch is void. A request containing any per-call tool yields one per-call grant
    /// (the stricter mode wins); approve per-call tools separately to keep the others per-epoch.
    pub fn approve(
        &mut self,
        serving: Serving<'_>,
        req: ApprovalRequest,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        self.approve_via(serving, req, Channel::Terminal, now, id)
    }

    /// [`Gate::approve`] for a decision that came through `channel`.
    pub fn approve_via(
        &mut self,
        serving: Serving<'_>,
        req: ApprovalRequest,
        channel: Channel,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        let tools: Vec<String> = req.tools.iter().cloned().collect();
        self.check_approvable(serving, &req.epoch, &tools)?;
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
            id: GrantId::from(id),
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
            kind: GrantKind::Epoch,
            arguments_digest: None,
            call_id: None,
            channel,
        };
        self.requested.retain(|t| !grant.tool_scope.contains(t));
        self.live.push(grant.clone());
        Ok(grant)
    }

    /// Applies a human decision about one call: a grant of kind `call` that authorizes exactly
    /// one forward of `req.tool` with arguments of digest `req.arguments_digest`, in `req.epoch`
    /// (re-checked here), with the credential scopes the tool uses. The same checks as
    /// [`Gate::approve`] apply (run, epoch, catalog, tool).
    pub fn approve_call(
        &mut self,
        serving: Serving<'_>,
        req: CallApprovalRequest,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        let scopes = self.policy.scopes_for(&req.tool);
        // The epoch, catalog and tool checks of a per-epoch approval, without issuing one.
        self.check_approvable(serving, &req.epoch, std::slice::from_ref(&req.tool))?;
        if req.arguments_digest.is_empty() {
            return Err(ApprovalError::NoArgumentsDigest);
        }
        let grant = Grant {
            id: GrantId::from(id),
            agent_run: self.agent_run.clone(),
            server_label: self.server_label.clone(),
            execution_epoch: req.epoch,
            tool_scope: BTreeSet::from([req.tool.clone()]),
            credential_scope: scopes,
            issued_at: now,
            expires_when: Expiry::FirstUse,
            kind: GrantKind::Call,
            arguments_digest: Some(req.arguments_digest),
            call_id: req.call_id,
            channel: req.channel,
        };
        self.requested.remove(&req.tool);
        self.live.push(grant.clone());
        Ok(grant)
    }

    fn check_approvable(
        &self,
        serving: Serving<'_>,
        epoch: &EpochId,
        tools: &[String],
    ) -> Result<(), ApprovalError> {
        if self.run_ended {
            return Err(ApprovalError::RunEnded);
        }
        if !serving.is_epoch(epoch) {
            return Err(ApprovalError::EpochChanged {
                requested: epoch.clone(),
                current: serving.epoch.cloned(),
            });
        }
        let Some(catalog) = serving.tools() else {
            return Err(ApprovalError::NotReady);
        };
        if tools.is_empty() {
            return Err(ApprovalError::NoTools);
        }
        if let Some(tool) = tools.iter().find(|t| !catalog.contains_key(*t)) {
            return Err(ApprovalError::UnknownTool(tool.clone()));
        }
        Ok(())
    }

    /// Removes grants (live or stale) and returns them, for the `approval_revoked` record.
    pub fn revoke(&mut self, target: RevokeTarget) -> Vec<Grant> {
        let matches = |g: &Grant| match &target {
            RevokeTarget::Id(id) => &g.id == id,
            RevokeTarget::All => true,
        };
        self.spent.retain(|g| !matches(g));
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
        self.spent.clear();
        self.requested.clear();
    }

    pub fn run_ended(&self) -> bool {
        self.run_ended
    }

    /// Decides one `tools/call` (see the module doc for the order of checks). Forwarding under a
    /// per-call grant consumes it; a cancelled or failed call does not give it back, because the
    /// call may have run.
    pub fn decide_call(&mut self, serving: Serving<'_>, tool: &str, now: u64) -> CallDecision {
        self.decide_call_with(serving, tool, None, now)
    }

    /// [`Gate::decide_call`] for a call whose arguments have digest `arguments_digest` (the
    /// router always knows it): only then can a `call` grant authorize it. Without a digest,
    /// `call` grants never apply.
    pub fn decide_call_with(
        &mut self,
        serving: Serving<'_>,
        tool: &str,
        arguments_digest: Option<&str>,
        now: u64,
    ) -> CallDecision {
        self.decide_call_checked(serving, tool, arguments_digest, None, now)
    }

    /// [`Gate::decide_call_with`] with the call's arguments checked against the tool's current
    /// definition: `call` holds the arguments' JSON text (`None` when the call has none) and
    /// the tool's definition in the current catalog with its digest. The definition is used
    /// only when its digest is the one this gate holds for the tool (never a definition of
    /// another catalog); without one the arguments are not checked.
    pub fn decide_call_checked(
        &mut self,
        serving: Serving<'_>,
        tool: &str,
        arguments_digest: Option<&str>,
        call: Option<CheckedCall<'_>>,
        now: u64,
    ) -> CallDecision {
        let scopes = self.policy.scopes_for(tool);
        let gated = self.policy.is_gated(tool);
        let Some(catalog) = serving.tools() else {
            let denial = self.denial(serving, tool, &scopes, DenialReason::IdentityPending);
            return self.deny(denial, gated, now);
        };
        let in_catalog = catalog.contains_key(tool);
        let live = self
            .live
            .iter()
            .position(|g| g.covers_call(tool, &scopes, arguments_digest));
        // The epoch of the newest grant for this tool that no longer authorizes (read only
        // for a refusal): a used grant of this epoch is newer than any of a past epoch.
        let stale = |gate: &Gate| {
            gate.newest_spent_grant(tool)
                .map(|g| g.execution_epoch.clone())
        };

        // A call is stale when this tool's definition as the host was shown it differs from the
        // current one (or the tool is gone). A host that was never shown the tool (e.g. a
        // one-shot CLI call) is judged against the current catalog; approval rules still apply.
        if self.is_stale(tool, catalog) {
            let mut denial = self.denial(serving, tool, &scopes, DenialReason::CatalogStale);
            if gated && in_catalog && live.is_none() {
                let stale = stale(self);
                let past = stale.as_ref().is_some_and(|e| !serving.is_epoch(e));
                denial.authorization = Some(if past {
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
            let denial = self.denial(serving, tool, &scopes, DenialReason::UnknownTool);
            return self.deny(denial, false, now);
        }
        if let Some(call) = call
            && catalog.get(tool).map(String::as_str) == Some(call.digest)
            && let Err(mismatches) =
                self.inputs
                    .check(tool, call.digest, call.definition, call.arguments)
        {
            let mut denial = self.denial(serving, tool, &scopes, DenialReason::ArgumentsInvalid);
            denial.mismatches = mismatches;
            return self.deny(denial, false, now);
        }
        if !gated {
            return CallDecision::Forward {
                grant_id: None,
                grant_kind: None,
                credential_scopes: scopes.into_iter().collect(),
            };
        }
        // Prefer a per-epoch grant so a per-call grant is not spent when another grant suffices;
        // then a grant for exactly this call; then a per-call grant of the tool.
        let chosen = self
            .live
            .iter()
            .position(|g| g.expires_when == Expiry::RunEnd && g.covers(tool, &scopes))
            .or_else(|| {
                self.live.iter().position(|g| {
                    g.kind == GrantKind::Call && g.covers_call(tool, &scopes, arguments_digest)
                })
            })
            .or(live);
        if let Some(index) = chosen {
            let kind = self.live[index].kind;
            let grant_id = if self.live[index].expires_when == Expiry::FirstUse {
                let used = self.live.remove(index);
                let id = used.id.clone();
                if self.spent.len() == STALE_GRANTS {
                    self.spent.remove(0);
                }
                self.spent.push(used);
                id
            } else {
                self.live[index].id.clone()
            };
            return CallDecision::Forward {
                grant_id: Some(grant_id),
                grant_kind: Some(kind),
                credential_scopes: scopes.into_iter().collect(),
            };
        }
        let mut denial = self.denial(serving, tool, &scopes, DenialReason::AuthorizationRequired);
        if let Some(approved) = stale(self) {
            // A grant of this epoch that was used up: approval is required again (not stale).
            if !serving.is_epoch(&approved) {
                denial.reason = DenialReason::AuthorizationStale;
            }
            denial.approved_epoch = Some(approved);
        }
        self.deny(denial, true, now)
    }

    /// A refusal of `tool` as things stand (built only when a call is refused: a forwarded
    /// call allocates none of it).
    fn denial(
        &self,
        serving: Serving<'_>,
        tool: &str,
        scopes: &BTreeSet<String>,
        reason: DenialReason,
    ) -> Denial {
        Denial {
            reason,
            tool: tool.to_owned(),
            approved_epoch: None,
            current_epoch: serving.epoch.cloned(),
            host_catalog: self.host.catalog().map(str::to_owned),
            current_catalog: serving.catalog.map(|c| c.revision.clone()),
            credential_scopes: scopes.iter().cloned().collect(),
            authorization: None,
            mismatches: Vec::new(),
        }
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

    /// The newest grant naming `tool` that no longer authorizes a call: used up in this
    /// epoch, or of a past epoch (by issue time; the later one on a tie).
    fn newest_spent_grant(&self, tool: &str) -> Option<&Grant> {
        self.stale
            .iter()
            .chain(&self.spent)
            .filter(|g| g.tool_scope.contains(tool))
            .max_by_key(|g| g.issued_at)
    }

    fn retire_live_grants(&mut self) {
        self.stale.append(&mut self.live);
        let excess = self.stale.len().saturating_sub(STALE_GRANTS);
        self.stale.drain(..excess);
    }

    /// Tools (and the credential scopes they use) that were refused for lack of a grant and are
    /// still not covered: the defaults `cargo mcp-dev approve` proposes. Limited to the current
    /// catalog once it is known.
    pub fn pending_requests(&self, serving: Serving<'_>) -> (BTreeSet<String>, BTreeSet<String>) {
        let catalog = serving.tools();
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

    /// Whether a live grant would authorize a call of `tool` with these arguments now (nothing
    /// is consumed; the call itself is still judged by [`Gate::decide_call_with`]).
    pub fn has_grant_for(&self, tool: &str, arguments_digest: Option<&str>) -> bool {
        let scopes = self.policy.scopes_for(tool);
        self.live
            .iter()
            .any(|g| g.covers_call(tool, &scopes, arguments_digest))
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

    pub fn phase(&self, serving: Serving<'_>) -> Phase {
        match serving.tools() {
            None => Phase::IdentityPending,
            Some(tools)
                if self.live.is_empty() && tools.keys().any(|t| self.policy.is_gated(t)) =>
            {
                Phase::CatalogReady
            }
            Some(_) => Phase::Ready,
        }
    }

    /// Digest of the catalog the host last fetched.
    pub fn host_catalog(&self) -> Option<&str> {
        self.host.catalog()
    }

    /// Tools whose current input schema is not checked, with why (each once per definition).
    pub fn take_input_notices(&mut self) -> Option<Vec<(String, String)>> {
        self.inputs
            .has_notices()
            .then(|| self.inputs.take_notices())
    }

    /// The compiled input schemas (for tests and figures).
    pub fn input_schemas(&self) -> &InputSchemas {
        &self.inputs
    }
}

/// What [`Gate::decide_call_checked`] checks a call's arguments with.
#[derive(Debug, Clone, Copy)]
pub struct CheckedCall<'a> {
    /// The call's `arguments` JSON text, `None` when absent.
    pub arguments: Option<&'a str>,
    /// The tool's definition in the current catalog, and its digest there.
    pub definition: &'a serde_json::Value,
    pub digest: &'a str,
}
