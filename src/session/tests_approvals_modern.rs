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
    // The same form as in the legacy era: the head a person decides from, labelled choices.
    let head = super::tests_approvals::form::form_head(params["message"].as_str().unwrap());
    assert_eq!(head[0], r#"Run `write_item` with {"qty":3,"sku":"A-1"}?"#);
    assert_eq!(head[1], "First approval in this session.");
    let (_, labels) = super::tests_approvals::form::choices(&params);
    assert_eq!(labels[1], "`write_item` until the next rebuild");
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
    super::tests_approvals::form::assert_told_declined(&a);
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
    h.handle(Event::ChildStopped { epoch: old });
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
    assert!(h.s.approvals.prompts.is_empty());
}

// ----- property test: forged, replayed and mismatched retries never grant --------------------

use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    /// A gated call with argument variant `n` (no round trip).
    Call(u8),
    /// The retry of the `nth` form the host got: `args_match` keeps the arguments, `answer` as
    /// in the legacy property test, `state`: 0 the real prompt, 1 a forged id, 2 another key.
    Retry {
        nth: u8,
        args_match: bool,
        answer: u8,
        state: u8,
    },
    Rebuild(u8),
    Advance(u16),
    /// The terminal approves `write_item` for the current epoch.
    Approve,
}

fn answer_of(n: u8) -> Value {
    match n % 6 {
        0 => json!({"action": "accept", "content": {"decision": "once"}}),
        1 => json!({"action": "accept", "content": {"decision": "tool"}}),
        2 => json!({"action": "accept", "content": {"decision": "deny"}}),
        3 => json!({"action": "decline"}),
        4 => json!({"action": "accept", "content": {"decision": "tool", "epoch": "forged"}}),
        _ => json!({"action": "cancel"}),
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..3).prop_map(Step::Call),
        (0u8..6, any::<bool>(), 0u8..6, 0u8..3).prop_map(|(nth, args_match, answer, state)| {
            Step::Retry {
                nth,
                args_match,
                answer,
                state,
            }
        }),
        (0u8..3).prop_map(Step::Rebuild),
        (0u16..30_000).prop_map(Step::Advance),
        Just(Step::Approve),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Over random calls and retries on a 2026-07-28 connection, a host grant comes only from
    /// the first retry that names an open form of that very call (same arguments), in time,
    /// under the form's epoch, with a granting answer; every forwarded call has its grant.
    #[test]
    fn only_a_real_answer_to_an_open_form_grants(steps in prop::collection::vec(step(), 1..30)) {
        let mut h = modern(true);
        h.s.cfg.approval_timeout = std::time::Duration::from_secs(20);
        // Every form the host got: (state, arguments, epoch, sent at).
        let mut forms: Vec<(String, Value, Option<String>, u64)> = Vec::new();
        let mut used: std::collections::BTreeSet<String> = Default::default();
        let mut grants_seen = 0usize;
        for step in steps {
            let mut host_may_grant: Option<Option<String>> = None;
            let mut terminal_may_grant = false;
            match step {
                Step::Call(n) => {
                    let id = call(&mut h, json!({"sku": format!("s{n}"), "qty": n}), json!({}));
                    if let Some(a) = h.answer(&id)
                        && a["result"]["resultType"] == "input_required"
                    {
                        let state = a["result"]["requestState"].as_str().unwrap().to_string();
                        let now = h.io().now_ms;
                        forms.push((state, json!({"sku": format!("s{n}"), "qty": n}), h.current_epoch(), now));
                    }
                }
                Step::Retry { nth, args_match, answer, state } => {
                    if let Some((real, args, epoch, sent_at)) = forms.get(nth as usize).cloned() {
                        let key = match state {
                            0 => real.clone(),
                            1 => format!("{PROMPT_ID_PREFIX}FORGED"),
                            _ => real.clone(),
                        };
                        let response_key = if state == 2 { "other".to_string() } else { key.clone() };
                        let args = if args_match { args } else { json!({"sku": "other", "qty": 99}) };
                        let fresh = state == 0 && args_match && !used.contains(&real);
                        if state == 0 && args_match {
                            used.insert(real.clone());
                        }
                        let in_time = h.io().now_ms < sent_at + 20_000;
                        if fresh && in_time && answer % 6 <= 1 && epoch.is_some() && epoch == h.current_epoch() {
                            host_may_grant = Some(epoch);
                        }
                        let extra = json!({"requestState": key, "inputResponses": {response_key: answer_of(answer)}});
                        let id = call(&mut h, args, extra);
                        prop_assert!(h.answer(&id).is_some(), "a retry is always answered");
                    }
                }
                Step::Rebuild(n) => {
                    if let Some(old) = h.current_epoch() {
                        h.build(complete(&format!("r{n}")));
                        h.handle(Event::ChildStopped { epoch: old });
                        h.serve();
                    }
                }
                Step::Advance(ms) => h.advance(ms as u64),
                Step::Approve => {
                    terminal_may_grant = true;
                    if let Some(epoch) = h.current_epoch() {
                        let (tx, _rx) = crossbeam_channel::bounded(1);
                        h.control_call(json!({"op": "approve", "epoch": epoch, "tools": ["write_item"]}), tx.into());
                        h.serve();
                    }
                }
            }
            let new_grants: Vec<Value> = h.audit_kinds(audit::APPROVAL_GRANTED).into_iter().skip(grants_seen).collect();
            grants_seen += new_grants.len();
            prop_assert!(new_grants.len() <= 1, "one decision, one grant: {:?}", new_grants);
            for g in &new_grants {
                match g["channel"].as_str() {
                    Some("terminal") => prop_assert!(terminal_may_grant, "{}", g),
                    Some("host") => {
                        prop_assert!(host_may_grant.is_some(), "host grant without a real answer: {}", g);
                        let epoch = host_may_grant.clone().flatten();
                        prop_assert_eq!(g["grant"]["executionEpoch"].as_str(), epoch.as_deref());
                    }
                    other => prop_assert!(false, "grant without a channel: {:?}", other),
                }
            }
        }
        // Every call that reached a server names a grant issued for its epoch, and the server
        // never saw the supervisor's round trip.
        let mut grants: std::collections::BTreeMap<String, String> = Default::default();
        for (kind, epoch, data) in &h.io().audit {
            match kind.as_str() {
                audit::APPROVAL_GRANTED => {
                    grants.insert(data["grant"]["id"].as_str().unwrap().to_string(),
                                  data["grant"]["executionEpoch"].as_str().unwrap().to_string());
                }
                audit::TOOL_CALLED => {
                    let grant = data["grant"].as_str().expect("a gated call names its grant");
                    prop_assert_eq!(grants.get(grant), epoch.as_ref());
                }
                _ => {}
            }
        }
        for m in &h.io().call_messages {
            prop_assert!(m["params"].get("requestState").is_none(), "{}", m);
            prop_assert!(m["params"].get("inputResponses").is_none(), "{}", m);
        }
    }
}

/// The person's no that comes after the form closed (its deadline passed) is still their no:
/// the retry is refused as declined, never with how to approve another way.
#[test]
fn a_late_decline_is_still_a_decline() {
    for answer in [
        json!({"action": "decline"}),
        json!({"action": "cancel"}),
        json!({"action": "accept", "content": {"decision": "deny"}}),
    ] {
        let mut h = modern(true);
        let args = json!({"sku": "late"});
        let first = call(&mut h, args.clone(), json!({}));
        let (state, _) = form(&h.answer(&first).unwrap());
        h.advance(h.s.cfg.approval_timeout.as_millis() as u64 + 1);
        let late =
            json!({"requestState": state, "inputResponses": {state.clone(): answer.clone()}});
        let r = call(&mut h, args.clone(), late);
        let a = h.answer(&r).unwrap();
        assert_eq!(
            Harness::tool_error(&a).as_deref(),
            Some("authorization_required"),
            "{a}"
        );
        super::tests_approvals::form::assert_told_declined(&a);
        let denied = h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap();
        assert_eq!(denied["channel"], "host");
        assert!(
            denied["outcome"]
                .as_str()
                .unwrap()
                .contains("after the form had closed"),
            "{denied}"
        );
        assert_eq!(forwarded_calls(&mut h), 0);
    }
    // A late accept is judged as a plain call: refused, nothing granted.
    let mut h = modern(true);
    let first = call(&mut h, json!({"sku": "late"}), json!({}));
    let (state, _) = form(&h.answer(&first).unwrap());
    h.advance(h.s.cfg.approval_timeout.as_millis() as u64 + 1);
    let r = call(&mut h, json!({"sku": "late"}), accept(&state, "tool"));
    let a = h.answer(&r).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required")
    );
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());
    // The person approved, too late: the model is told so and that calling again asks again;
    // never how to approve another way (Claude Code 2.1.337 keeps the expired form on screen).
    let text = a.to_string();
    assert!(!text.contains("cargo mcp-dev approve"), "{a}");
    assert!(
        text.contains("had closed") && text.contains("new form"),
        "{a}"
    );
    assert_eq!(
        a["result"]["_meta"]["dev.cargo-mcp-dev/error"]["approval"]["declined"],
        json!(false),
        "{a}"
    );
    assert_eq!(forwarded_calls(&mut h), 0);
}
