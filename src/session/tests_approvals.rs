//! Approvals through the session: per-call grants bound to the arguments (`approve --call`),
//! the channel every grant and denial names, and in-host approval by elicitation.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

#[path = "tests_approvals_form.rs"]
pub(super) mod form;
use form::{assert_told_declined, choices, form_head, human_text};

/// A legacy host connected, the server up and its catalog listed by the host.
fn ready(h: &mut Harness) -> String {
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.current_epoch().expect("running")
}

/// The `approval.outcome` a refused call's result carries.
fn approval_outcome(answer: &Value) -> String {
    answer["result"]["_meta"]["dev.cargo-mcp-dev/error"]["approval"]["outcome"]
        .as_str()
        .unwrap()
        .to_string()
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
    let r = h.control(json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "tool": "write_item", "argumentsDigest": "sha256:00"}));
    assert_eq!(r["ok"], false, "{r}");
    let r = h.control(json!({"op": "approveCall", "epoch": "OTHER", "callId": call_id, "tool": "write_item", "argumentsDigest": digest}));
    assert_eq!(r["ok"], false, "{r}");
    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": "999", "tool": "write_item", "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());

    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "tool": "write_item", "argumentsDigest": digest}),
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
        json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "tool": "write_item", "argumentsDigest": digest}),
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
    assert_eq!(h.s.approvals.denied_calls.len(), state::DENIED_CALLS);
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

// ----- in-host approval (legacy elicitation) ------------------------------------------------

/// A legacy host that declared `capabilities.elicitation`, the server up, the catalog listed.
pub(super) fn ready_eliciting(h: &mut Harness) -> String {
    h.build(complete("a"));
    let id = h.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {"elicitation": {}},
               "clientInfo": {"name": "test", "version": "1"}}),
    );
    h.initialized();
    assert!(h.answer(&id).is_some());
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.current_epoch().expect("running")
}

/// Every `elicitation/create` request the host was sent.
fn prompts(h: &mut Harness) -> Vec<Value> {
    h.io()
        .to_host
        .iter()
        .filter(|m| m["method"] == "elicitation/create")
        .cloned()
        .collect()
}

fn last_prompt(h: &mut Harness) -> Value {
    prompts(h).pop().expect("a prompt was sent to the host")
}

/// The host answers a prompt with `result`.
fn answer_prompt(h: &mut Harness, id: &Value, result: Value) {
    h.host(json!({"jsonrpc": "2.0", "id": id, "result": result}));
}

fn accept(choice: &str) -> Value {
    json!({"action": "accept", "content": {"decision": choice}})
}

fn grants(h: &mut Harness) -> Vec<Value> {
    h.audit_kinds(audit::APPROVAL_GRANTED)
}

#[test]
fn accept_once_in_the_host_runs_exactly_that_call() {
    let mut h = Harness::new(|_| {});
    let epoch = ready_eliciting(&mut h);
    let args = json!({"sku": "A-1\u{1b}[2J\u{202e}"});
    let call = h.call_with("write_item", args.clone());
    assert_eq!(
        h.answer(&call),
        None,
        "the call waits for the host's answer"
    );
    let p = last_prompt(&mut h);
    let pid = p["id"].clone();
    assert!(
        pid.as_str()
            .unwrap()
            .starts_with(approvals::PROMPT_ID_PREFIX),
        "{p}"
    );
    // The form: one enum field whose choices say what they allow (no tool but this one was
    // requested: no "every requested tool" choice), and the facts in plain words.
    let (values, labels) = choices(&p["params"]);
    assert_eq!(values, json!(["once", "tool", "deny"]));
    assert_eq!(
        labels,
        json!([
            "Only this call",
            "`write_item` until the next rebuild",
            "Decline: do not run this call"
        ])
    );
    assert_eq!(
        p["params"]["requestedSchema"]["required"],
        json!(["decision"])
    );
    let text = p["params"]["message"].as_str().unwrap();
    // The first 3 lines (all a host may show): the tool and its arguments, what changed, how
    // long a grant lasts; each fits 76 columns.
    let head = form_head(text);
    assert!(head[0].starts_with("Run `write_item` with {"), "{text}");
    assert!(head[0].contains("\"sku\":\"A-1"), "{text}");
    assert_eq!(head[1], "First approval in this session.");
    assert_eq!(
        head[2],
        "Allow only this call, or `write_item` until the next rebuild; or decline."
    );
    // The details after them.
    assert!(text.contains(&h.s.agent_run().to_string()), "{text}");
    assert!(
        text.contains(&epoch[epoch.len().saturating_sub(8)..]),
        "{text}"
    );
    assert!(text.contains("\"sku\""), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "agent text is sanitized: {text}"
    );
    let st = h.control(json!({"op": "status"}));
    assert_eq!(st["result"]["openPrompts"][0]["tool"], "write_item");
    assert_eq!(
        st["result"]["approvalChannels"],
        json!(["terminal", "host"])
    );

    answer_prompt(&mut h, &pid, accept("once"));
    let a = h.answer(&call).expect("answered after the grant");
    assert_eq!(Harness::tool_error(&a), None, "{a}");
    let g = grants(&mut h);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0]["channel"], "host");
    assert_eq!(g[0]["kind"], "call");
    let called = h.audit_kinds(audit::TOOL_CALLED).pop().unwrap();
    assert_eq!(called["grantKind"], "call");
    // Used: the same call again prompts again (and nothing is left to answer the old prompt).
    let again = h.call_with("write_item", args);
    assert_eq!(h.answer(&again), None);
    assert_eq!(prompts(&mut h).len(), 2);
    // A replay of the first answer finds no open prompt: no grant, the new prompt still open.
    answer_prompt(&mut h, &pid, accept("once"));
    assert_eq!(grants(&mut h).len(), 1);
    assert_eq!(h.answer(&again), None);
}

#[test]
fn decline_cancel_deny_and_invalid_answers_refuse_the_call_and_grant_nothing() {
    for (answer, outcome) in [
        (json!({"action": "decline"}), "declined in the host"),
        (json!({"action": "cancel"}), "cancelled in the host"),
        (accept("deny"), "denied in the host"),
        (accept("always"), "invalid answer"),
        (
            json!({"action": "accept", "content": {"decision": "once", "epoch": "X"}}),
            "invalid answer",
        ),
        (json!({"action": "accept"}), "invalid answer"),
        (json!({"action": "approve"}), "invalid answer"),
    ] {
        let mut h = Harness::new(|_| {});
        ready_eliciting(&mut h);
        let call = h.call_with("write_item", json!({}));
        let pid = last_prompt(&mut h)["id"].clone();
        answer_prompt(&mut h, &pid, answer.clone());
        let a = h.answer(&call).expect("refused");
        assert_eq!(
            Harness::tool_error(&a).as_deref(),
            Some("authorization_required"),
            "{answer}"
        );
        // The person said no: the model is told so, never how to approve another way. An
        // answer that is no choice is not the person's no, but a person was asked: still no
        // `approve` command.
        if outcome == "invalid answer" {
            let text = human_text(&a);
            assert!(!text.contains("cargo mcp-dev approve"), "{text}");
            assert_eq!(
                a["result"]["_meta"]["dev.cargo-mcp-dev/error"]["approval"]["declined"],
                json!(false)
            );
        } else {
            assert_told_declined(&a);
        }
        let approval = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"]["approval"];
        assert_eq!(approval["channel"], "host", "{a}");
        assert!(
            approval["outcome"].as_str().unwrap().starts_with(outcome),
            "{answer} → {a}"
        );
        let denied = h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap();
        assert_eq!(denied["channel"], "host");
        assert!(denied["outcome"].as_str().unwrap().starts_with(outcome));
        assert!(grants(&mut h).is_empty(), "{answer}");
        // A second answer (now accepting) to the same prompt grants nothing.
        answer_prompt(&mut h, &pid, accept("tool"));
        assert!(grants(&mut h).is_empty(), "{answer}: replay granted");
    }
    // An error response from the host.
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    let pid = last_prompt(&mut h)["id"].clone();
    h.host(json!({"jsonrpc": "2.0", "id": pid, "error": {"code": -1, "message": "no"}}));
    assert!(Harness::tool_error(&h.answer(&call).unwrap()).is_some());
    assert!(grants(&mut h).is_empty());
}

#[test]
fn a_prompt_times_out_and_a_late_answer_grants_nothing() {
    let mut h = Harness::new(|c| c.approval_timeout = std::time::Duration::from_secs(45));
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    let pid = last_prompt(&mut h)["id"].clone();
    h.advance(44_999);
    assert_eq!(h.answer(&call), None);
    h.advance(1);
    let a = h.answer(&call).expect("refused at the deadline");
    let outcome = a["result"]["_meta"]["dev.cargo-mcp-dev/error"]["approval"]["outcome"].clone();
    assert!(outcome.as_str().unwrap().contains("timed out"), "{a}");
    assert_told_declined(&a);
    answer_prompt(&mut h, &pid, accept("tool"));
    assert!(grants(&mut h).is_empty());
    assert!(h.s.approvals.prompts.is_empty());
}

#[test]
fn a_rebuild_during_the_prompt_voids_the_answer() {
    let mut h = Harness::new(|_| {});
    let old = ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    let pid = last_prompt(&mut h)["id"].clone();
    let new = h.rebuild("b");
    assert_ne!(old, new);
    // At the rebuild, before any answer: the form is withdrawn and the call refused.
    let withdrawn: Vec<Value> = h
        .io()
        .to_host
        .iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .cloned()
        .collect();
    assert_eq!(withdrawn.len(), 1, "{withdrawn:?}");
    assert_eq!(withdrawn[0]["params"]["requestId"], pid);
    let reason = withdrawn[0]["params"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("{old} is being replaced by {new}")),
        "{reason}"
    );
    let a = h.answer(&call).expect("refused at the rebuild");
    let outcome = approval_outcome(&a);
    assert!(outcome.contains("rebuilt during the prompt"), "{outcome}");
    // Not the person's no: the model may call again (and the person is asked again), but is
    // never told how to approve outside the host.
    let text = human_text(&a);
    assert!(
        text.contains("calling it again asks the person again"),
        "{text}"
    );
    assert!(!text.contains("cargo mcp-dev approve"), "{text}");
    assert!(h.s.approvals.prompts.is_empty());
    // The host's answer that still comes finds no open prompt: nothing is granted, and the
    // call is not answered twice (`answer` checks).
    answer_prompt(&mut h, &pid, accept("tool"));
    assert!(grants(&mut h).is_empty());
    assert!(h.answer(&call).is_some());
    // The next call prompts for the new epoch and says what changed since... nothing was
    // approved yet, so it is the first approval; approve, rebuild, and look again.
    let c2 = h.call_with("write_item", json!({}));
    let p2 = last_prompt(&mut h)["id"].clone();
    answer_prompt(&mut h, &p2, accept("tool"));
    assert_eq!(Harness::tool_error(&h.answer(&c2).unwrap()), None);
    h.rebuild("c");
    h.call_with("write_item", json!({}));
    let text = last_prompt(&mut h)["params"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("identity changed: executable only; tool definition unchanged"),
        "{text}"
    );
    // The same in the first 3 lines, in plain words.
    let head = form_head(&text);
    assert_eq!(
        head[1],
        "New build since your last approval; tool definition unchanged."
    );
}

/// The server exits (crashes) while a call waits for the human: the form is withdrawn and
/// the call refused at once, not left waiting for an answer that could no longer run it.
#[test]
fn a_server_exit_during_the_prompt_withdraws_it() {
    let mut h = Harness::new(|_| {});
    let epoch = ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    let pid = last_prompt(&mut h)["id"].clone();
    assert_eq!(h.answer(&call), None, "waits for the human");
    h.handle(Event::ChildExited {
        epoch: epoch.clone(),
        exit: ExitInfo {
            code: Some(101),
            signal: None,
        },
    });
    assert_eq!(h.host_notes("notifications/cancelled"), 1);
    let a = h.answer(&call).expect("refused at the exit");
    let outcome = approval_outcome(&a);
    assert!(
        outcome.contains(&format!(
            "the server exited during the prompt (epoch {epoch}"
        )),
        "{outcome}"
    );
    answer_prompt(&mut h, &pid, accept("tool"));
    assert!(grants(&mut h).is_empty());
    assert!(h.s.approvals.prompts.is_empty(), "nothing stays open");
}

#[test]
fn forged_answers_never_grant() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    let pid = last_prompt(&mut h)["id"].as_str().unwrap().to_string();
    // Ids we never sent: another prompt-looking id, a number, a near miss, null.
    for id in [
        json!(format!("{}NOPE", approvals::PROMPT_ID_PREFIX)),
        json!(format!("{pid}x")),
        json!(7),
        json!("7"),
        Value::Null,
    ] {
        answer_prompt(&mut h, &id, accept("tool"));
    }
    // A request (not a response) that looks like an answer.
    h.host(json!({"jsonrpc": "2.0", "id": 99, "method": "elicitation/create", "params": accept("tool")}));
    assert!(grants(&mut h).is_empty());
    assert_eq!(h.answer(&call), None, "the real prompt is still open");
    answer_prompt(&mut h, &json!(pid), accept("once"));
    assert_eq!(grants(&mut h).len(), 1);
}

#[test]
fn a_host_without_elicitation_falls_back_to_the_terminal() {
    let mut h = Harness::new(|_| {});
    let epoch = ready(&mut h);
    let call = h.call_with("write_item", json!({}));
    assert_eq!(
        Harness::tool_error(&h.answer(&call).unwrap()).as_deref(),
        Some("authorization_required")
    );
    assert!(prompts(&mut h).is_empty());
    let st = h.control(json!({"op": "status"}));
    assert_eq!(st["result"]["approvalChannels"], json!(["terminal"]));
    let r = h.control(json!({"op": "approve", "epoch": epoch, "tools": ["write_item"]}));
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(grants(&mut h)[0]["channel"], "terminal");
}

#[test]
fn channels_follow_the_configuration() {
    // terminal only: an eliciting host is never asked.
    let mut h = Harness::new(|c| {
        c.approval_channels = Some([approval::Channel::Terminal].into());
    });
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({}));
    assert!(h.answer(&call).is_some());
    assert!(prompts(&mut h).is_empty());
    // host only: the control socket cannot grant.
    let mut h = Harness::new(|c| c.approval_channels = Some([approval::Channel::Host].into()));
    let epoch = ready_eliciting(&mut h);
    let r = h.control(json!({"op": "approve", "epoch": epoch, "tools": ["write_item"]}));
    assert_eq!(r["ok"], false, "{r}");
    assert!(grants(&mut h).is_empty());
    // …unless the host cannot elicit: then the terminal is the channel.
    let mut h = Harness::new(|c| c.approval_channels = Some([approval::Channel::Host].into()));
    let epoch = ready(&mut h);
    let r = h.control(json!({"op": "approve", "epoch": epoch, "tools": ["write_item"]}));
    assert_eq!(r["ok"], true, "{r}");
}

#[test]
fn open_prompts_are_bounded_and_a_cancelled_call_closes_its_prompt() {
    let mut h = Harness::new(|c| c.max_open_prompts = 2);
    ready_eliciting(&mut h);
    let c1 = h.call_with("write_item", json!({"n": 1}));
    let c2 = h.call_with("write_item", json!({"n": 2}));
    let c3 = h.call_with("write_item", json!({"n": 3}));
    assert_eq!(prompts(&mut h).len(), 2);
    assert_eq!(h.answer(&c1), None);
    assert_eq!(h.answer(&c2), None);
    let a3 = h.answer(&c3).expect("over the bound: refused at once");
    assert_eq!(
        Harness::tool_error(&a3).as_deref(),
        Some("authorization_required")
    );
    // The host cancels c1: its prompt is closed; answering it grants nothing.
    let p1 = prompts(&mut h)[0]["id"].clone();
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": c1}}),
    );
    assert_eq!(h.s.approvals.prompts.len(), 1);
    answer_prompt(&mut h, &p1, accept("tool"));
    assert!(grants(&mut h).is_empty());
    // Shutdown answers the call still waiting.
    h.handle(Event::Shutdown("test".into()));
    assert!(h.answer(&c2).is_some());
}

#[test]
fn a_terminal_grant_releases_the_calls_waiting_in_the_host() {
    let mut h = Harness::new(|_| {});
    let epoch = ready_eliciting(&mut h);
    let c1 = h.call_with("write_item", json!({"n": 1}));
    let c2 = h.call_with("list_items", json!({}));
    let p1 = prompts(&mut h)[0]["id"].clone();
    assert_eq!(h.answer(&c1), None);
    let r = h.control(json!({"op": "approve", "epoch": epoch, "tools": ["write_item"]}));
    assert_eq!(r["ok"], true, "{r}");
    // The write_item call runs at once and its prompt is withdrawn; list_items still waits.
    assert_eq!(Harness::tool_error(&h.answer(&c1).unwrap()), None);
    assert_eq!(h.answer(&c2), None);
    let withdrawn: Vec<Value> = h
        .io()
        .to_host
        .iter()
        .filter(|m| m["method"] == "notifications/cancelled")
        .cloned()
        .collect();
    assert_eq!(withdrawn.len(), 1, "{withdrawn:?}");
    assert_eq!(withdrawn[0]["params"]["requestId"], p1);
    // The host's late answer to the withdrawn prompt grants nothing more.
    answer_prompt(&mut h, &p1, accept("requested"));
    assert_eq!(grants(&mut h).len(), 1);
    // A timed-out prompt is withdrawn too.
    h.advance(60_000);
    assert!(h.answer(&c2).is_some());
    assert_eq!(h.host_notes("notifications/cancelled"), 2);
}

#[test]
fn requested_grants_only_the_tools_the_form_listed() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let c1 = h.call_with("write_item", json!({}));
    let p1 = prompts(&mut h)[0]["id"].clone();
    // Another tool is requested after the first form was shown.
    let _c2 = h.call_with("list_items", json!({}));
    answer_prompt(&mut h, &p1, accept("requested"));
    assert_eq!(Harness::tool_error(&h.answer(&c1).unwrap()), None);
    let g = grants(&mut h);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0]["grant"]["toolScope"], json!(["write_item"]), "{g:?}");
}
