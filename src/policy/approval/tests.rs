//! The gate's rules, one test per rule, and a property test against an independent model.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::test_gate::TestGate;
use super::*;
use crate::identity::epoch::{EpochId, GrantId};
use crate::policy::catalog::CatalogRevision;

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

fn gate() -> TestGate {
    TestGate::new(Gate::new(policy(), "run-1", "inventory".into()))
}

/// A gate at `ready(epoch, catalog 1)` with the host up to date and no grants.
fn ready_gate(epoch: &str) -> TestGate {
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

fn reason(g: &mut TestGate, tool: &str) -> &'static str {
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
            grant_kind: None,
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
                grant_kind: Some(GrantKind::Epoch),
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
    let mut g = TestGate::new(Gate::new(p, "r", "l".into()));
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
            grant_kind: None,
            credential_scopes: vec![API.into()]
        }
    );

    let mut p = policy();
    p.gating = Gating::Only(set(&["write_item"]));
    let mut g = TestGate::new(Gate::new(p, "r", "l".into()));
    g.epoch_started(A);
    g.catalog_fetched(A, rev(1, "c1"), cat("c1", &["write_item", "delete_item"]));
    g.host_fetched_catalog("sha256:c1");
    assert_eq!(reason(&mut g, "delete_item"), "forward");
    assert_eq!(reason(&mut g, "write_item"), "authorization_required");
}

#[test]
fn every_denial_payload_and_hint() {
    let ep = |s: &str| Some(EpochId::from(s));
    let base = Denial {
        reason: DenialReason::IdentityPending,
        tool: "write_item".into(),
        approved_epoch: None,
        current_epoch: ep(B),
        host_catalog: Some("sha256:c1".into()),
        current_catalog: Some(rev(2, "c2")),
        credential_scopes: vec![],
        authorization: None,
        mismatches: Vec::new(),
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
               "expiresWhen": "firstUse", "kind": "epoch", "channel": "terminal"})
    );
    assert_eq!(serde_json::from_value::<Grant>(value).unwrap(), grant);
}

fn call_req(epoch: &str, tool: &str, digest: &str) -> CallApprovalRequest {
    CallApprovalRequest {
        epoch: epoch.into(),
        tool: tool.into(),
        arguments_digest: digest.into(),
        call_id: Some("7".into()),
        channel: Channel::Terminal,
    }
}

fn verdict(g: &mut TestGate, tool: &str, digest: &str) -> String {
    match g.decide_call_with(tool, Some(digest), 0) {
        CallDecision::Deny(d) => d.reason.as_str().to_string(),
        CallDecision::Forward {
            grant_id,
            grant_kind,
            ..
        } => format!(
            "forward {} {}",
            grant_id.map(|g| g.to_string()).unwrap_or_default(),
            grant_kind.map(|k| k.as_str()).unwrap_or("-")
        ),
    }
}

#[test]
fn call_grant_covers_exactly_one_call_with_the_same_arguments() {
    let mut g = ready_gate(A);
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:x"),
        "authorization_required"
    );
    assert_eq!(g.pending_requests().0, set(&["write_item"]));
    let grant = g
        .approve_call(call_req(A, "write_item", "sha256:x"), 1, "c1".into())
        .expect("approved");
    assert_eq!(grant.kind, GrantKind::Call);
    assert_eq!(grant.expires_when, Expiry::FirstUse);
    assert_eq!(grant.tool_scope, set(&["write_item"]));
    assert_eq!(grant.credential_scope, set(&[API]), "the tool's scopes");
    assert_eq!(grant.arguments_digest.as_deref(), Some("sha256:x"));
    assert_eq!(grant.call_id.as_deref(), Some("7"));
    assert!(
        g.pending_requests().0.is_empty(),
        "the request was answered"
    );

    // Other arguments: not covered, and the grant is not spent.
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:y"),
        "authorization_required"
    );
    // Without a digest (a caller that cannot bind): never covered.
    assert_eq!(reason(&mut g, "write_item"), "authorization_required");
    // Another tool, same digest: not covered.
    assert_eq!(
        verdict(&mut g, "delete_item", "sha256:x"),
        "authorization_required"
    );
    assert_eq!(g.grants().len(), 1);
    // The call itself: forwarded once, then spent.
    assert_eq!(verdict(&mut g, "write_item", "sha256:x"), "forward c1 call");
    assert!(g.grants().is_empty());
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:x"),
        "authorization_required",
        "second use"
    );
}

#[test]
fn call_grant_dies_with_its_epoch_and_is_checked_against_it() {
    let mut g = ready_gate(A);
    g.approve_call(call_req(A, "write_item", "sha256:x"), 1, "c1".into())
        .unwrap();
    // A rebuild: the grant is stale, the same call under B is refused.
    g.epoch_started(B);
    assert!(g.catalog_fetched(
        B,
        rev(2, "c1"),
        cat("c1", &["read_item", "write_item", "delete_item"])
    ));
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:x"),
        "authorization_stale"
    );
    // A decision for the call shown under A is void under B.
    assert_eq!(
        g.approve_call(call_req(A, "write_item", "sha256:x"), 2, "c2".into()),
        Err(ApprovalError::EpochChanged {
            requested: A.into(),
            current: Some(B.into())
        })
    );
    assert_eq!(
        g.approve_call(call_req(B, "nope", "sha256:x"), 2, "c3".into()),
        Err(ApprovalError::UnknownTool("nope".into()))
    );
    assert_eq!(
        g.approve_call(call_req(B, "write_item", ""), 2, "c4".into()),
        Err(ApprovalError::NoArgumentsDigest)
    );
    assert!(g.grants().is_empty());
    // During a restart (identity pending) nothing can be approved.
    g.epoch_started("C");
    assert_eq!(
        g.approve_call(call_req("C", "write_item", "sha256:x"), 3, "c5".into()),
        Err(ApprovalError::NotReady)
    );
    g.end_run();
    assert_eq!(
        g.approve_call(call_req("C", "write_item", "sha256:x"), 3, "c6".into()),
        Err(ApprovalError::RunEnded)
    );
}

#[test]
fn call_grant_is_not_a_tool_grant_and_a_tool_grant_is_used_first() {
    let mut g = ready_gate(A);
    g.approve_call(call_req(A, "write_item", "sha256:x"), 1, "c1".into())
        .unwrap();
    // A call grant does not make the tool approved for status or approve's defaults.
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:z"),
        "authorization_required"
    );
    assert_eq!(g.pending_requests().0, set(&["write_item"]));
    // With a per-epoch grant too, the per-epoch one is used and the call grant kept.
    g.approve(req(A, &["write_item"], &[API]), 2, "e1".into())
        .unwrap();
    assert_eq!(
        verdict(&mut g, "write_item", "sha256:x"),
        "forward e1 epoch"
    );
    assert_eq!(g.grants().len(), 2);
    // A per-call-mode tool: its call grant is used before a generic first-use grant.
    g.approve_call(call_req(A, "delete_item", "sha256:d"), 3, "c2".into())
        .unwrap();
    g.approve(req(A, &["delete_item"], &[API]), 4, "p1".into())
        .unwrap();
    assert_eq!(
        verdict(&mut g, "delete_item", "sha256:d"),
        "forward c2 call"
    );
    assert_eq!(
        verdict(&mut g, "delete_item", "sha256:d"),
        "forward p1 epoch"
    );
    assert_eq!(
        verdict(&mut g, "delete_item", "sha256:d"),
        "authorization_required"
    );
    // Revoking removes a call grant like any other.
    assert_eq!(g.revoke(RevokeTarget::Id("c1".into())).len(), 1);
    let grant = g
        .approve_call(call_req(A, "write_item", "sha256:x"), 5, "c3".into())
        .unwrap();
    let value = serde_json::to_value(&grant).unwrap();
    assert_eq!(value["kind"], "call");
    assert_eq!(value["argumentsDigest"], "sha256:x");
    assert_eq!(value["callId"], "7");
    assert_eq!(value["channel"], "terminal");
    assert_eq!(serde_json::from_value::<Grant>(value).unwrap(), grant);
}

/// Random event sequences checked against an independent model of the rules.
mod model {
    use super::*;
    use crate::policy::catalog::{Catalog, CatalogHistory};
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
        id: GrantId,
        epoch: EpochId,
        tools: BTreeSet<String>,
        scopes: BTreeSet<String>,
        per_call: bool,
        /// False once used (per-call), revoked, or the run ended.
        alive: bool,
        /// False once revoked or the run ended: a used grant is still cited by a refusal.
        cited: bool,
    }

    /// The rules restated from the module doc, independent of `Gate`'s data layout.
    #[derive(Debug)]
    struct Model {
        policy: Policy,
        epochs: Vec<EpochId>,
        running: Option<EpochId>,
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
            self.policy.mode == ApprovalMode::PerCall || self.policy.per_call_tools.contains(tool)
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

        /// The epoch of the newest grant naming `tool` that no longer authorizes (used, or of
        /// another epoch), not revoked: the one a refusal cites.
        fn cited_epoch(&self, tool: &str) -> Option<EpochId> {
            self.grants
                .iter()
                .rev()
                .filter(|g| g.cited && g.tools.contains(tool))
                .find(|g| !(g.alive && Some(&g.epoch) == self.running.as_ref()))
                .map(|g| g.epoch.clone())
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
            match self.cited_epoch(tool) {
                Some(e) if Some(&e) != self.running.as_ref() => {
                    Err(DenialReason::AuthorizationStale)
                }
                _ => Err(DenialReason::AuthorizationRequired),
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
            let mut gate = TestGate::new(Gate::new(policy.clone(), "run", "label".into()));
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
                        let epoch = EpochId::new(format!("E{}", m.epochs.len()));
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
                            let showing = tools.iter().map(|(n, t)| (n.clone(), t.clone(), Value::Null));
                            gate.host_view_mut().show_catalog(&d, None, showing);
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
                                    id: GrantId::new(id), epoch: r.epoch, tools: r.tools, scopes: r.credential_scopes, per_call, alive: true, cited: true,
                                });
                            }
                            (Err(e), Err(g)) => prop_assert_eq!(e, g),
                            (e, g) => prop_assert!(false, "approve: model {:?}, gate {:?}", e, g),
                        }
                    }
                    Step::Call { tool } => {
                        let tool = tool_name(tool);
                        let expected = m.expected_call(&tool);
                        let cited = m.cited_epoch(&tool);
                        match gate.decide_call(&tool, now) {
                            CallDecision::Forward { grant_id, credential_scopes, .. } => {
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
                                // A refusal for lack of a grant cites the newest grant (issue 33).
                                if matches!(d.reason, DenialReason::AuthorizationStale | DenialReason::AuthorizationRequired) {
                                    prop_assert_eq!(&d.approved_epoch, &cited);
                                }
                                if d.reason == DenialReason::AuthorizationStale {
                                    let approved = d.approved_epoch.clone().expect("approvedEpoch");
                                    prop_assert_ne!(Some(&approved), m.running.as_ref());
                                }
                                if d.reason == DenialReason::CatalogStale && d.authorization.is_some() {
                                    prop_assert_eq!(&d.approved_epoch, &cited);
                                    let past = cited.as_ref().is_some_and(|e| Some(e) != m.running.as_ref());
                                    prop_assert_eq!(d.authorization == Some(PendingAuthorization::Stale), past);
                                }
                                let payload = d.payload();
                                prop_assert_eq!(payload["error"].as_str(), Some(d.reason.as_str()));
                            }
                        }
                    }
                    Step::Revoke { all, pick } => {
                        let ids: Vec<GrantId> = m.grants.iter().filter(|g| g.alive).map(|g| g.id.clone()).collect();
                        let target = if all || ids.is_empty() {
                            RevokeTarget::All
                        } else {
                            RevokeTarget::Id(ids[pick % ids.len()].clone())
                        };
                        let removed: BTreeSet<GrantId> = gate.revoke(target.clone()).into_iter().map(|g| g.id).collect();
                        let expected: BTreeSet<GrantId> = m.grants.iter_mut()
                            .filter(|g| g.alive && (target == RevokeTarget::All || target == RevokeTarget::Id(g.id.clone())))
                            .map(|g| { g.alive = false; g.cited = false; g.id.clone() })
                            .collect();
                        prop_assert_eq!(removed, expected);
                        if target == RevokeTarget::All {
                            // Used grants are forgotten too (never reported revoked).
                            m.grants.iter_mut().for_each(|g| g.cited = false);
                        }
                    }
                    Step::EndRun => {
                        gate.end_run();
                        m.ended = true;
                        m.grants.iter_mut().for_each(|g| { g.alive = false; g.cited = false; });
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

/// Splits `line` as fish does (the default shell of many developers), returning the commands
/// it would run: inside single quotes fish treats `\'` and `\\` as escapes (POSIX sh does not).
fn fish_commands(line: &str) -> Vec<String> {
    let mut commands = vec![String::new()];
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        let cur = commands.last_mut().unwrap();
        match (quoted, c) {
            (true, '\\') if matches!(chars.peek(), Some('\'') | Some('\\')) => {
                cur.push(chars.next().unwrap())
            }
            (true, '\'') => quoted = false,
            (true, c) => cur.push(c),
            (false, '\\') => cur.extend(chars.next()),
            (false, '\'') => quoted = true,
            (false, ';') => commands.push(String::new()),
            (false, '#') => break,
            (false, c) => cur.push(c),
        }
    }
    commands
        .into_iter()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Red-team round 18: the server names a tool `x\';touch pwned;#` (printable ASCII, no backtick, 17 bytes): the
/// suggested `approve --tool` quotes it for POSIX sh only. Pasted into fish, the backslash
/// escapes the closing quote and `touch pwned` runs: the server's own command, suggested by us.
#[test]
fn a_suggested_approve_tool_command_is_one_command_in_fish_too() {
    use crate::policy::approval::{Denial, DenialReason};
    let d = Denial {
        reason: DenialReason::AuthorizationRequired,
        tool: "x\\';touch pwned;#".into(),
        approved_epoch: None,
        current_epoch: Some(crate::identity::epoch::EpochId::from("e1")),
        host_catalog: None,
        current_catalog: None,
        credential_scopes: vec![],
        authorization: None,
        mismatches: Vec::new(),
    };
    let hint = d.human_hint();
    let cmd = hint
        .split('`')
        .nth(1)
        .expect("a command between backticks")
        .to_string();
    let commands = fish_commands(&cmd);
    assert_eq!(
        commands.len(),
        1,
        "pasting {cmd:?} into fish runs {commands:?} (hint: {hint})"
    );
}
