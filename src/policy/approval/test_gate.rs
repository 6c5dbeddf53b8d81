//! Test support: a [`Gate`] with the server facts the session would hand it kept beside it, so
//! the gate's own tests can drive it as the session does (start an epoch, fetch its catalog, end
//! it) and judge calls against those facts. The product keeps these facts only in the session.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use super::*;
use crate::identity::epoch::EpochId;
use crate::policy::catalog::CatalogRevision;

/// A gate and the running server's epoch and catalog, as the session's server slot and catalog
/// history would hold them.
pub(super) struct TestGate {
    gate: Gate,
    epoch: Option<EpochId>,
    catalog: Option<(CatalogRevision, BTreeMap<String, String>)>,
}

fn serving<'a>(
    epoch: &'a Option<EpochId>,
    catalog: &'a Option<(CatalogRevision, BTreeMap<String, String>)>,
) -> Serving<'a> {
    Serving {
        epoch: epoch.as_ref(),
        catalog: catalog
            .as_ref()
            .map(|(revision, tools)| ServedCatalog { revision, tools }),
    }
}

impl TestGate {
    pub(super) fn new(gate: Gate) -> TestGate {
        TestGate {
            gate,
            epoch: None,
            catalog: None,
        }
    }

    pub(super) fn serving(&self) -> Serving<'_> {
        serving(&self.epoch, &self.catalog)
    }

    /// A new child was started under `epoch`: its catalog is unknown and every grant so far is
    /// stale (the same value twice is still a new child).
    pub(super) fn epoch_started(&mut self, epoch: &str) {
        self.gate.epoch_changed();
        self.epoch = Some(EpochId::from(epoch));
        self.catalog = None;
    }

    /// The catalog of `epoch` was fetched; `false` (and nothing kept) for another epoch, as
    /// the session drops a replaced child's late answer.
    pub(super) fn catalog_fetched(
        &mut self,
        epoch: &str,
        revision: CatalogRevision,
        tools: BTreeMap<String, String>,
    ) -> bool {
        if self.epoch.as_ref().is_some_and(|e| e == epoch) {
            self.catalog = Some((revision, tools));
            true
        } else {
            false
        }
    }

    /// The child of `epoch` exited; `false` (nothing changes) for another epoch.
    pub(super) fn server_exited(&mut self, epoch: &str) -> bool {
        if self.epoch.as_ref().is_some_and(|e| e == epoch) {
            self.gate.epoch_changed();
            self.epoch = None;
            self.catalog = None;
            true
        } else {
            false
        }
    }

    pub(super) fn current_epoch(&self) -> Option<&str> {
        self.epoch.as_ref().map(|e| e.as_str())
    }

    pub(super) fn current_catalog(&self) -> Option<&CatalogRevision> {
        self.catalog.as_ref().map(|(revision, _)| revision)
    }

    /// The host was shown catalog `sha256:<tag>` holding the current catalog's tools.
    pub(super) fn host_fetched_catalog(&mut self, digest: &str) {
        let tag = digest.trim_start_matches("sha256:");
        let names: Vec<String> = self
            .catalog
            .as_ref()
            .map(|(_, t)| t.keys().cloned().collect())
            .unwrap_or_default();
        let view = names.into_iter().map(|n| {
            let d = format!("{tag}:{n}");
            (n, d, serde_json::Value::Null)
        });
        self.gate.host_view_mut().show_catalog(digest, None, view);
    }

    pub(super) fn approve(
        &mut self,
        req: ApprovalRequest,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        let s = serving(&self.epoch, &self.catalog);
        self.gate.approve(s, req, now, id)
    }

    pub(super) fn approve_call(
        &mut self,
        req: CallApprovalRequest,
        now: u64,
        id: String,
    ) -> Result<Grant, ApprovalError> {
        let s = serving(&self.epoch, &self.catalog);
        self.gate.approve_call(s, req, now, id)
    }

    pub(super) fn decide_call(&mut self, tool: &str, now: u64) -> CallDecision {
        let s = serving(&self.epoch, &self.catalog);
        self.gate.decide_call(s, tool, now)
    }

    pub(super) fn decide_call_with(
        &mut self,
        tool: &str,
        arguments_digest: Option<&str>,
        now: u64,
    ) -> CallDecision {
        let s = serving(&self.epoch, &self.catalog);
        self.gate.decide_call_with(s, tool, arguments_digest, now)
    }

    pub(super) fn decide_call_checked(
        &mut self,
        tool: &str,
        arguments_digest: Option<&str>,
        call: Option<CheckedCall<'_>>,
        now: u64,
    ) -> CallDecision {
        let s = serving(&self.epoch, &self.catalog);
        self.gate
            .decide_call_checked(s, tool, arguments_digest, call, now)
    }

    pub(super) fn pending_requests(
        &self,
    ) -> (
        std::collections::BTreeSet<String>,
        std::collections::BTreeSet<String>,
    ) {
        self.gate.pending_requests(self.serving())
    }

    pub(super) fn phase(&self) -> Phase {
        self.gate.phase(self.serving())
    }
}

impl Deref for TestGate {
    type Target = Gate;
    fn deref(&self) -> &Gate {
        &self.gate
    }
}

impl DerefMut for TestGate {
    fn deref_mut(&mut self) -> &mut Gate {
        &mut self.gate
    }
}
