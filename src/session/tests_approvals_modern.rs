//! In-host approval on a 2026-07-28 connection: the refused call is answered with the approval
//! form as an input request (`input_required`), and the host's retry carries the answer.

use serde_json::{Value, json};

use super::approvals::PROMPT_ID_PREFIX;
use super::testing::*;
use super::*;

fn meta(elicit: bool) -> Value {
    let caps = if elicit {
        json!({"elicitation": {"form": {}}})
    } else {
        json!({})
    };
    json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
           protocol::CLIENT_CAPABILITIES: caps})
}

/// A modern host (eliciting or not) with the server up and its catalog listed.
fn modern(elicit: bool) -> Harness {
    let mut h = Harness::new(|c| c.warm = true);
    let d = h.request("server/discover", json!({"_meta": meta(elicit)}));
    h.build(complete("a"));
    assert!(h.answer(&d).is_some());
    let l = h.request("tools/list", json!({"_meta": meta(elicit)}));
    assert!(h.answer(&l).is_some());
    h
}

fn call(h: &mut Harness, args: Value, extra: Value) -> Value {
    let mut params = json!({"name": "write_item", "arguments": args, "_meta": meta(true)});
    if let Some(o) = extra.as_object() {
        for (k, v) in o {
            params[k] = v.clone();
        }
    }
    h.request("tools/call", params)
}

/// The input-required answer of a refused call: its prompt key and the form.
fn form(answer: &Value) -> (String, Value) {
    let r = &answer["result"];
    assert_eq!(r["resultType"], "input_required", "{answer}");
    let state = r["requestState"].as_str().unwrap().to_string();
    assert!(state.starts_with(PROMPT_ID_PREFIX));
    let req = &r["inputRequests"][&state];
    assert_eq!(req["method"], "elicitation/create", "{answer}");
    (state, req["params"].clone())
}

fn accept(state: &str, decision: &str) -> Value {
    json!({"requestState": state,
           "inputResponses": {state: {"action": "accept", "content": {"decision": decision}}}})
}

fn forwarded_calls(h: &mut Harness) -> usize {
    h.io().calls_sent.len()
}

#[test]
fn the_form_comes_back_as_an_input_request_and_the_retry_runs_once() {
    let mut h = modern(true);
    let args = json!({"sku": "A-1", "qty": 3});
    let first = call(&mut h, args.clone(), json!({}));
    let (state, params) = form(&h.answer(&first).unwrap());
    assert_eq!(params["mode"], "form");
    assert!(params["message"].as_str().unwrap().contains("write_item"));
    assert_eq!(forwarded_calls(&mut h), 0, "nothing ran yet");

    let retry = call(&mut h, args.clone(), accept(&state, "once"));
    let a = h.answer(&retry).unwrap();
    assert_eq!(Harness::tool_error(&a), None, "{a}");
    assert_eq!(forwarded_calls(&mut h), 1);
    // The server never sees the supervisor's round trip.
    let sent = h
        .io()
        .audit
        .iter()
        .filter(|(k, _, _)| k == audit::TOOL_CALLED)
        .count();
    assert_eq!(sent, 1);
    let granted = h.audit_kinds(audit::APPROVAL_GRANTED).pop().unwrap();
    assert_eq!(granted["channel"], "host");
    assert_eq!(granted["kind"], "call");

    // A replay of the same answer finds no open prompt and grants nothing new.
    let replay = call(&mut h, args.clone(), accept(&state, "once"));
    let a = h.answer(&replay).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required")
    );
    assert_eq!(forwarded_calls(&mut h), 1);
    assert_eq!(h.audit_kinds(audit::APPROVAL_GRANTED).len(), 1);
}

#[test]
fn the_server_never_sees_request_state_or_input_responses() {
    let mut h = modern(true);
    let args = json!({"sku": "A-1", "qty": 3});
    let first = call(&mut h, args.clone(), json!({}));
    let (state, _) = form(&h.answer(&first).unwrap());
    h.answer_calls = false;
    call(&mut h, args, accept(&state, "tool"));
    let sent = h.io().call_messages.last().cloned().expect("forwarded");
    assert!(sent["params"].get("requestState").is_none(), "{sent}");
    assert!(sent["params"].get("inputResponses").is_none(), "{sent}");
    assert_eq!(sent["params"]["arguments"]["qty"], 3);
}

#[test]
fn forged_and_mismatched_retries_never_grant() {
    let mut h = modern(true);
    let args = json!({"sku": "A-1", "qty": 3});
    let first = call(&mut h, args.clone(), json!({}));
    let (state, _) = form(&h.answer(&first).unwrap());
    let refused = |h: &mut Harness, id: &Value| {
        let a = h.answer(id).unwrap();
        assert!(
            a["result"]["isError"] == json!(true) || a["result"]["resultType"] == "input_required",
            "{a}"
        );
    };
    // A prompt id never sent.
    let forged = format!("{PROMPT_ID_PREFIX}FORGED");
    let r = call(&mut h, args.clone(), accept(&forged, "tool"));
    refused(&mut h, &r);
    // Other arguments under the real prompt: not the call the human was shown.
    let r = call(
        &mut h,
        json!({"sku": "A-1", "qty": 300}),
        accept(&state, "tool"),
    );
    refused(&mut h, &r);
    // The answer under another key, or extra content.
    let r = call(
        &mut h,
        args.clone(),
        json!({"requestState": state, "inputResponses": {"other": {"action": "accept", "content": {"decision": "tool"}}}}),
    );
    refused(&mut h, &r);
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());
    assert_eq!(forwarded_calls(&mut h), 0);
}

#[test]
fn decline_refuses_and_a_rebuild_voids_the_answer() {
    let mut h = modern(true);
    let args = json!({"sku": "A-1", "qty": 3});
    let first = call(&mut h, args.clone(), json!({}));
    let (state, _) = form(&h.answer(&first).unwrap());
    let declined =
        json!({"requestState": state, "inputResponses": {state.clone(): {"action": "decline"}}});
    let r = call(&mut h, args.clone(), declined);
    let a = h.answer(&r).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required")
    );
    let denied = h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap();
    assert_eq!(denied["channel"], "host");
    assert!(
        denied["outcome"].as_str().unwrap().contains("declined"),
        "{denied}"
    );

    // A new prompt, then a rebuild before the answer comes back.
    let second = call(&mut h, args.clone(), json!({}));
    let (state, _) = form(&h.answer(&second).unwrap());
    let old = h.current_epoch().unwrap();
    h.build(complete("b"));
    h.s.handle(Event::ChildStopped { epoch: old });
    h.serve();
    let l = h.request("tools/list", json!({"_meta": meta(true)}));
    assert!(h.answer(&l).is_some());
    let r = call(&mut h, args, accept(&state, "tool"));
    let a = h.answer(&r).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required"),
        "{a}"
    );
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());
    assert_eq!(forwarded_calls(&mut h), 0);
}

#[test]
fn a_modern_host_without_elicitation_gets_the_terminal_channel() {
    let mut h = modern(false);
    let params = json!({"name": "write_item", "arguments": {}, "_meta": meta(false)});
    let c = h.request("tools/call", params);
    let a = h.answer(&c).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required")
    );
    assert!(h.s.prompts.is_empty());
}
