//! Approvals through the session: per-call grants bound to the arguments (`approve --call`),
//! the channel every grant and denial names, and in-host approval by elicitation.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A legacy host connected, the server up and its catalog listed by the host.
fn ready(h: &mut Harness) -> String {
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.current_epoch().expect("running")
}

#[test]
fn approve_call_grants_exactly_the_denied_call_once() {
    let mut h = Harness::new(|_| {});
    let epoch = ready(&mut h);
    let args = json!({"sku": "A-1", "qty": 3});
    let denied = h.call_with("write_item", args.clone());
    assert_eq!(
        Harness::tool_error(&h.answer(&denied).unwrap()).as_deref(),
        Some("authorization_required")
    );
    let record = h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap();
    let digest = record["argumentsDigest"].as_str().unwrap().to_string();
    assert!(digest.starts_with("sha256:"), "{record}");
    assert_eq!(record["channel"], "terminal");
    let call_id = denied.to_string();

    // The status document lists the call (ids and digests, never the arguments).
    let st = h.control(json!({"op": "status"}));
    let listed = &st["result"]["deniedCalls"][0];
    assert_eq!(listed["callId"], json!(call_id));
    assert_eq!(listed["argumentsDigest"], json!(digest));
    assert!(listed.get("arguments").is_none(), "{listed}");
    // The control socket shows the arguments to the human.
    let shown = h.control(json!({"op": "deniedCall", "callId": call_id}));
    assert_eq!(shown["result"]["arguments"], json!(args.to_string()));
    assert_eq!(shown["result"]["tool"], "write_item");

    // A digest other than the one reviewed, another epoch, an unknown call: no grant.
    let r = h.control(json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "argumentsDigest": "sha256:00"}));
    assert_eq!(r["ok"], false, "{r}");
    let r = h.control(json!({"op": "approveCall", "epoch": "OTHER", "callId": call_id, "argumentsDigest": digest}));
    assert_eq!(r["ok"], false, "{r}");
    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": "999", "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());

    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["grant"]["kind"], "call");
    let granted = h.audit_kinds(audit::APPROVAL_GRANTED).pop().unwrap();
    assert_eq!(granted["kind"], "call");
    assert_eq!(granted["channel"], "terminal");
    assert_eq!(granted["argumentsDigest"], json!(digest));
    assert_eq!(granted["grant"]["callId"], json!(call_id));

    // Other arguments: refused, the grant kept.
    let other = h.call_with("write_item", json!({"sku": "A-1", "qty": 300}));
    assert_eq!(
        Harness::tool_error(&h.answer(&other).unwrap()).as_deref(),
        Some("authorization_required")
    );
    // The same arguments (a retry with a new id): forwarded once, recorded as a call grant.
    let retry = h.call_with("write_item", args.clone());
    let answer = h.answer(&retry).unwrap();
    assert_eq!(Harness::tool_error(&answer), None, "{answer}");
    let called = h.audit_kinds(audit::TOOL_CALLED).pop().unwrap();
    assert_eq!(called["grantKind"], "call");
    assert_eq!(called["argumentsDigest"], json!(digest));
    assert_eq!(called["grant"], r["result"]["grant"]["id"]);
    // Second use: refused.
    let again = h.call_with("write_item", args);
    assert_eq!(
        Harness::tool_error(&h.answer(&again).unwrap()).as_deref(),
        Some("authorization_required")
    );
}

#[test]
fn approve_call_is_void_after_a_rebuild() {
    let mut h = Harness::new(|_| {});
    let epoch = ready(&mut h);
    let args = json!({"sku": "B"});
    let denied = h.call_with("write_item", args.clone());
    let digest =
        h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap()["argumentsDigest"].clone();
    let call_id = denied.to_string();
    // The human was shown `epoch`; the server is rebuilt before the decision arrives.
    let now = h.rebuild("b");
    assert_ne!(now, epoch);
    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("epoch"), "{r}");
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());
    // A decision for a call with these arguments under an older epoch never covers it now.
    let retry = h.call_with("write_item", args);
    assert!(Harness::tool_error(&h.answer(&retry).unwrap()).is_some());
}

#[test]
fn denied_calls_are_bounded() {
    let mut h = Harness::new(|_| {});
    ready(&mut h);
    for i in 0..(state::DENIED_CALLS + 5) {
        h.call_with("write_item", json!({"i": i}));
    }
    assert_eq!(h.s.denied_calls.len(), state::DENIED_CALLS);
    let big = "x".repeat(state::ARGUMENTS_PREVIEW * 2);
    let id = h.call_with("write_item", json!({"big": big}));
    let shown = h.control(json!({"op": "deniedCall", "callId": id.to_string()}));
    assert_eq!(shown["result"]["argumentsTruncated"], true);
    assert_eq!(
        shown["result"]["arguments"]
            .as_str()
            .unwrap()
            .chars()
            .count(),
        state::ARGUMENTS_PREVIEW
    );
    let _: Value = shown;
}
