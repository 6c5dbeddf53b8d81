//! Arguments checked against the current definition (issue 33, item 5), through the session: a
//! host that refetched whose model still calls with the old definition, a call held while the
//! server starts, a 2026-07-28 call, a schema that is not checked, and what is recorded.

use serde_json::{Value, json};

use crate::session::testing::*;
use crate::session::*;

/// `write_item` whose `qty` is of `qty_type`, both properties required.
fn write_item(qty_type: &str) -> Value {
    json!({"name": "write_item", "description": format!("Write one item (qty: {qty_type})"),
           "inputSchema": {"type": "object",
               "properties": {"sku": {"type": "string"}, "qty": {"type": qty_type}},
               "required": ["sku", "qty"]}})
}

/// `tools/call` requests the fake server received.
fn calls(h: &Harness) -> usize {
    h.server_saw.iter().filter(|m| *m == "tools/call").count()
}

fn payload(answer: &Value) -> &Value {
    &answer["result"]["_meta"]["dev.cargo-mcp-dev/error"]
}

fn ran(answer: &Value) -> bool {
    answer["result"]["isError"] != json!(true)
        && answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("ran in "))
}

/// An ungated legacy session serving `write_item(qty: integer)`, the host shown it.
fn serving() -> (Harness, String) {
    let mut h = Harness::ungated(|_| {});
    h.tools = vec![tool("list_items", 1), write_item("integer")];
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    (h, epoch)
}

/// The host refetched after `list_changed` (`qty` became a string), but its model calls with
/// the old definition (Claude Code does): refused with the current definition and the diff from
/// the definition the host was shown before; nothing reaches the server; recorded as refused.
#[test]
fn a_host_that_refetched_is_refused_when_its_model_kept_the_old_definition() {
    let (mut h, epoch) = serving();
    h.answer_calls = true;
    let ok = h.call_with("write_item", json!({"sku": "a", "qty": 1}));
    assert!(ran(&h.answer(&ok).unwrap()));
    // The server changes `qty` to a string and says so; the host refetches.
    from_child(&mut h, &epoch, list_changed());
    h.tools = vec![tool("list_items", 1), write_item("string")];
    h.serve();
    let l = h.request("tools/list", json!({}));
    h.answer(&l).expect("listed");
    let sent = calls(&h);
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED).len();
    let c = h.call_with("write_item", json!({"sku": "a", "qty": 2}));
    let answer = h.answer(&c).expect("answered at once");
    assert_eq!(answer["result"]["isError"], json!(true), "{answer}");
    let p = payload(&answer);
    assert_eq!(p["error"], json!("arguments_invalid"), "{answer}");
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .contains("do not match the tool's current definition"),
        "{p}"
    );
    assert_eq!(p["mismatches"][0]["path"], json!("/qty"), "{p}");
    assert_eq!(p["mismatches"][0]["keyword"], json!("type"), "{p}");
    assert_eq!(
        p["currentDefinition"]["inputSchema"]["properties"]["qty"],
        json!({"type": "string"}),
        "{p}"
    );
    assert_eq!(p["currentCatalog"]["revision"], json!(2), "{p}");
    let changes = p["changes"].to_string();
    assert!(
        changes.contains("qty") && changes.contains("integer") && changes.contains("string"),
        "the diff from what the host was shown before: {p}"
    );
    assert!(p["changesFrom"].as_str().unwrap().contains("before"), "{p}");
    let text = answer["result"]["content"][1]["text"].as_str().unwrap();
    assert!(
        text.contains("/qty") && text.contains("current input schema"),
        "{text}"
    );
    assert_eq!(calls(&h), sent, "nothing reached the server");
    assert_eq!(
        h.audit_kinds(audit::CATALOG_PRESENTED).len(),
        presented,
        "the host already held this definition: no new presentation"
    );
    let denied = h.audit_kinds(audit::AUTHORIZATION_DENIED);
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["reason"], json!("arguments_invalid"));
    assert_eq!(denied[0]["tool"], json!("write_item"));
    assert!(
        denied[0]["mismatches"][0]
            .as_str()
            .unwrap()
            .starts_with("/qty: "),
        "{denied:?}"
    );
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("call denied: write_item (arguments_invalid)")),
        "{:?}",
        h.io().status
    );
    // The model reads the definition and calls again: it runs.
    let c = h.call_with("write_item", json!({"sku": "a", "qty": "2"}));
    assert!(ran(&h.answer(&c).unwrap()));
}

/// A call held while the first server starts is checked when released, against the catalog
/// of the server that will run it.
#[test]
fn a_call_held_during_the_start_is_checked_against_the_new_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.tools = vec![write_item("integer")];
    h.answer_calls = true;
    h.connect_legacy();
    let bad = h.call_with("write_item", json!({"sku": "a", "qty": "1"}));
    let good = h.call_with("write_item", json!({"sku": "a", "qty": 1}));
    let no_args = h.request("tools/call", json!({"name": "write_item"}));
    assert_eq!(h.answer(&bad), None, "held");
    h.build(complete("a"));
    let bad = h.answer(&bad).expect("judged when released");
    assert_eq!(payload(&bad)["error"], json!("arguments_invalid"), "{bad}");
    assert_eq!(payload(&bad)["mismatches"][0]["path"], json!("/qty"));
    assert!(ran(&h.answer(&good).unwrap()));
    let no_args = h.answer(&no_args).unwrap();
    assert_eq!(
        payload(&no_args)["mismatches"][0]["keyword"],
        json!("required"),
        "absent arguments are an empty object: {no_args}"
    );
    assert_eq!(calls(&h), 1);
}

/// Arguments that are not an object are refused even for a tool without an input schema;
/// a host never shown the tool is recorded as shown its definition by the refusal.
#[test]
fn arguments_that_are_not_an_object_are_refused() {
    let mut h = Harness::ungated(|_| {});
    h.tools = vec![json!({"name": "free"})];
    h.answer_calls = true;
    h.connect_legacy();
    h.build(complete("a"));
    let c = h.call_with("free", json!(["x"]));
    let answer = h.answer(&c).unwrap();
    assert_eq!(
        payload(&answer)["error"],
        json!("arguments_invalid"),
        "{answer}"
    );
    assert_eq!(payload(&answer)["mismatches"][0]["path"], json!(""));
    assert_eq!(payload(&answer)["currentDefinition"]["name"], json!("free"));
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED);
    assert_eq!(
        presented.last().unwrap()["source"],
        json!("arguments-mismatch result"),
        "{presented:?}"
    );
    let c = h.call_with("free", json!({"anything": [1, 2]}));
    assert!(ran(&h.answer(&c).unwrap()));
}

/// A 2026-07-28 call is checked too, and its refusal is a complete tool result.
#[test]
fn a_modern_call_is_checked() {
    let mut h = Harness::ungated(|c| c.warm = true);
    h.tools = vec![write_item("integer")];
    let meta = json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
                      protocol::CLIENT_CAPABILITIES: {}});
    let d = h.request("server/discover", json!({"_meta": meta}));
    h.build(complete("a"));
    assert!(h.answer(&d).is_some());
    let c = h.request(
        "tools/call",
        json!({"name": "write_item", "arguments": {"sku": 1, "qty": 1}, "_meta": meta}),
    );
    let answer = h.answer(&c).unwrap();
    assert_eq!(
        answer["result"]["resultType"],
        json!("complete"),
        "{answer}"
    );
    assert_eq!(answer["result"]["isError"], json!(true), "{answer}");
    assert_eq!(payload(&answer)["error"], json!("arguments_invalid"));
    assert_eq!(payload(&answer)["mismatches"][0]["path"], json!("/sku"));
}

/// A schema that does not compile is not checked: calls go through, and the status line says
/// so once per definition (a new definition that does not compile either is said again).
#[test]
fn a_schema_that_is_not_checked_is_said_once() {
    let mut h = Harness::ungated(|_| {});
    let broken = |n: u32| {
        json!({"name": "odd", "description": format!("v{n}"),
               "inputSchema": {"type": "object", "properties": {"s": {"pattern": "(?<=a)b"}}}})
    };
    h.tools = vec![broken(1)];
    h.answer_calls = true;
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let said = |h: &mut Harness| {
        h.io()
            .status
            .iter()
            .filter(|l| l.contains("arguments of odd are not checked"))
            .count()
    };
    for _ in 0..3 {
        let c = h.call_with("odd", json!({"s": "zzz"}));
        assert!(ran(&h.answer(&c).unwrap()));
    }
    assert_eq!(said(&mut h), 1, "{:?}", h.io().status);
    from_child(&mut h, &epoch, list_changed());
    h.tools = vec![broken(2)];
    h.serve();
    let l = h.request("tools/list", json!({}));
    h.answer(&l).unwrap();
    let c = h.call_with("odd", json!({"s": "zzz"}));
    assert!(ran(&h.answer(&c).unwrap()));
    assert_eq!(said(&mut h), 2);
}
