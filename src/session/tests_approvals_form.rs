//! The approval form a person decides from in 3 lines (issue 33, item 8): the head's content
//! and width, the choices' labels, and the newest grant a refusal cites.

use serde_json::{Value, json};

use super::super::testing::*;
use super::super::*;
use super::*;

/// The first 3 lines of a form's message (all Claude Code shows), each checked to fit
/// [`approvals::FORM_HEAD_COLUMNS`] columns.
pub(in crate::session) fn form_head(message: &str) -> Vec<String> {
    let head: Vec<String> = message.lines().take(3).map(str::to_string).collect();
    assert_eq!(head.len(), 3, "{message}");
    for l in &head {
        assert!(
            approvals::columns(l) <= approvals::FORM_HEAD_COLUMNS,
            "a head line wider than {} columns: {l:?}",
            approvals::FORM_HEAD_COLUMNS
        );
        assert!(!l.trim().is_empty(), "{message}");
    }
    head
}

/// The choices a form offers: (enum values, their labels).
pub(in crate::session) fn choices(params: &Value) -> (Value, Value) {
    let d = &params["requestedSchema"]["properties"]["decision"];
    (d["enum"].clone(), d["enumNames"].clone())
}

/// The sentence a refused call's result gives (`content[1]`).
pub(in crate::session) fn human_text(answer: &Value) -> String {
    answer["result"]["content"][1]["text"]
        .as_str()
        .expect("a human sentence")
        .to_string()
}

/// What the model is told after the person said no: declined, not to retry, never how to
/// approve another way.
pub(in crate::session) fn assert_told_declined(answer: &Value) {
    let text = human_text(answer);
    assert!(
        !text.contains("cargo mcp-dev approve") && !text.contains("approve --"),
        "the model is told how to route around the person: {text}"
    );
    assert!(text.contains("did not approve it"), "{text}");
    assert!(text.contains("Do not retry it"), "{text}");
    let payload = &answer["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert_eq!(payload["approval"]["declined"], json!(true), "{payload}");
    assert_eq!(
        payload["retry"],
        json!(crate::policy::approval::RETRY_DECLINED),
        "{payload}"
    );
    assert!(
        !payload.to_string().contains("cargo mcp-dev approve"),
        "{payload}"
    );
}

#[test]
fn tool_and_requested_choices_grant_for_the_epoch() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let c1 = h.call_with("write_item", json!({"a": 1}));
    let p1 = last_prompt(&mut h)["id"].clone();
    answer_prompt(&mut h, &p1, accept("tool"));
    assert_eq!(Harness::tool_error(&h.answer(&c1).unwrap()), None);
    let g = grants(&mut h).pop().unwrap();
    assert_eq!(g["kind"], "epoch");
    assert_eq!(g["grant"]["toolScope"], json!(["write_item"]));
    // Other arguments: covered by the tool grant, no prompt.
    let c2 = h.call_with("write_item", json!({"a": 2}));
    assert_eq!(Harness::tool_error(&h.answer(&c2).unwrap()), None);
    assert_eq!(prompts(&mut h).len(), 1);
    // `requested`: the tool and the others requested so far.
    let c3 = h.call_with("list_items", json!({}));
    let p = last_prompt(&mut h);
    assert!(
        p["params"]["message"]
            .as_str()
            .unwrap()
            .contains("list_items"),
        "{p}"
    );
    answer_prompt(&mut h, &p["id"], accept("requested"));
    assert_eq!(Harness::tool_error(&h.answer(&c3).unwrap()), None);
    assert_eq!(
        grants(&mut h).pop().unwrap()["grant"]["toolScope"],
        json!(["list_items"])
    );
}

/// Issue 33 item 8: a choice that grants several tools names them, within its bound.
#[test]
fn the_every_requested_choice_names_its_tools() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    // `write_item` waits for its form; `list_items` is then requested too.
    let c1 = h.call_with("write_item", json!({"a": 1}));
    let c2 = h.call_with("list_items", json!({}));
    let p = last_prompt(&mut h);
    let (values, labels) = choices(&p["params"]);
    assert_eq!(values, json!(["once", "tool", "requested", "deny"]));
    assert_eq!(labels[1], "`list_items` until the next rebuild");
    assert_eq!(
        labels[2],
        "`list_items`, `write_item` until the next rebuild"
    );
    let text = p["params"]["message"].as_str().unwrap();
    let head = form_head(text);
    assert_eq!(head[0], "Run `list_items` (no arguments)?");
    answer_prompt(&mut h, &p["id"], accept("requested"));
    assert_eq!(Harness::tool_error(&h.answer(&c2).unwrap()), None);
    assert_eq!(
        grants(&mut h).pop().unwrap()["grant"]["toolScope"],
        json!(["list_items", "write_item"])
    );
    // The grant covers the call waiting in the other form too.
    assert_eq!(Harness::tool_error(&h.answer(&c1).unwrap()), None);
}

/// The head fits 76 columns whatever the server names its tool and the agent sends: wide
/// characters, bidi controls, escapes and pretty-printed or long arguments are shown safely and
/// cut; the whole arguments follow in the details.
#[test]
fn the_form_head_fits_and_is_sanitized_for_hostile_names_and_arguments() {
    let name = format!("写入\u{202e}{}\u{1b}[2J", "x".repeat(80));
    let mut h = Harness::new(|_| {});
    h.tools.push(tool(&name, 1));
    ready_eliciting(&mut h);
    let long = "y".repeat(300);
    let call = h.call_with(
        &name,
        json!({"note": format!("line1\nline2 \u{1b}]0;title\u{7} {long}"), "deep": {"k": [1, 2]}}),
    );
    assert_eq!(h.answer(&call), None);
    let p = last_prompt(&mut h);
    let text = p["params"]["message"].as_str().unwrap();
    let head = form_head(text);
    assert!(head[0].starts_with("Run `写入<U+202E>x"), "{}", head[0]);
    assert!(head[0].contains('…'), "cut: {}", head[0]);
    for l in text.lines() {
        assert!(
            !l.contains('\u{1b}') && !l.contains('\u{202e}') && !l.contains('\u{7}'),
            "{l:?}"
        );
    }
    assert!(
        text.contains(&long[..200]),
        "the details hold the arguments"
    );
    let (_, labels) = choices(&p["params"]);
    for l in labels.as_array().unwrap() {
        let l = l.as_str().unwrap();
        assert!(approvals::columns(l) <= 64, "{l}");
        assert!(!l.contains('\u{1b}') && !l.contains('\u{202e}'), "{l}");
    }
}

/// Issue 33 item 8: after a rebuild and a new grant, a later refusal cites the newest grant
/// (this build's, used up), not the one of the old epoch.
#[test]
fn a_refusal_cites_the_newest_grant_after_a_rebuild() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    // Epoch A: the tool until the next rebuild.
    let c = h.call_with("write_item", json!({"a": 1}));
    let p = last_prompt(&mut h)["id"].clone();
    answer_prompt(&mut h, &p, accept("tool"));
    assert_eq!(Harness::tool_error(&h.answer(&c).unwrap()), None);
    let epoch_a = grants(&mut h)[0]["grant"]["executionEpoch"].clone();
    // Epoch B: the form cites A's grant; only this call is approved.
    let epoch_b = h.rebuild("b");
    let c = h.call_with("write_item", json!({"a": 2}));
    let p = last_prompt(&mut h);
    assert_eq!(
        form_head(p["params"]["message"].as_str().unwrap())[1],
        "New build since your last approval; tool definition unchanged."
    );
    answer_prompt(&mut h, &p["id"], accept("once"));
    assert_eq!(Harness::tool_error(&h.answer(&c).unwrap()), None);
    // The next call is refused citing B's grant (used), not A's.
    let c = h.call_with("write_item", json!({"a": 3}));
    let p = last_prompt(&mut h)["id"].clone();
    answer_prompt(&mut h, &p, json!({"action": "decline"}));
    let a = h.answer(&c).expect("refused");
    let payload = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert_eq!(payload["error"], "authorization_required", "{payload}");
    assert_eq!(payload["approvedEpoch"], json!(epoch_b), "{payload}");
    assert_ne!(payload["approvedEpoch"], epoch_a, "{payload}");
    assert_told_declined(&a);
    let denied = h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap();
    assert_eq!(denied["approvedEpoch"], json!(epoch_b), "{denied}");
}

/// The same through the terminal channel (no form): the refusal names this build's used grant,
/// and, no person having been asked about this call, says how to approve it.
#[test]
fn a_terminal_refusal_cites_this_builds_used_grant() {
    let mut h = Harness::new(|_| {});
    let epoch_a = ready(&mut h);
    let r = h.control(
        json!({"op": "approve", "epoch": epoch_a, "tools": ["write_item"], "credentialScopes": []}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let epoch_b = h.rebuild("b");
    let args = json!({"sku": "B"});
    let denied = h.call_with("write_item", args.clone());
    let a = h.answer(&denied).unwrap();
    let payload = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert_eq!(payload["error"], "authorization_stale");
    assert_eq!(payload["approvedEpoch"], json!(epoch_a));
    let digest =
        h.audit_kinds(audit::AUTHORIZATION_DENIED).pop().unwrap()["argumentsDigest"].clone();
    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch_b, "callId": denied.to_string(),
                             "tool": "write_item", "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let ran = h.call_with("write_item", args.clone());
    assert_eq!(Harness::tool_error(&h.answer(&ran).unwrap()), None);
    let again = h.call_with("write_item", args);
    let a = h.answer(&again).unwrap();
    let payload = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert_eq!(payload["error"], "authorization_required", "{payload}");
    assert_eq!(payload["approvedEpoch"], json!(epoch_b), "{payload}");
    let text = human_text(&a);
    assert!(
        text.contains("approved for one call in this build"),
        "{text}"
    );
    assert!(text.contains(&epoch_b), "{text}");
    assert!(!text.contains(&epoch_a), "{text}");
    assert!(
        text.contains("cargo mcp-dev approve --tool write_item"),
        "{text}"
    );
}

/// A per-call tool's grant lasts one call: its choice says so, not "until the next rebuild".
#[test]
fn a_per_call_tools_choice_says_it_lasts_one_call() {
    let policy = crate::policy::approval::Policy {
        per_call_tools: ["write_item".to_string()].into(),
        ..crate::policy::approval::Policy::default()
    };
    let mut h = Harness::with_policy(|_| {}, policy);
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({"a": 1}));
    let p = last_prompt(&mut h);
    let head = form_head(p["params"]["message"].as_str().unwrap());
    assert_eq!(
        head[2],
        "Allow only this call, or `write_item` for its next call only; or decline."
    );
    let (_, labels) = choices(&p["params"]);
    assert_eq!(labels[1], "`write_item` for its next call only");
    answer_prompt(&mut h, &p["id"], accept("tool"));
    assert_eq!(Harness::tool_error(&h.answer(&call).unwrap()), None);
    let g = grants(&mut h).pop().unwrap();
    assert_eq!(g["grant"]["expiresWhen"], "firstUse");
    assert_eq!(
        crate::screen::wording::lifetime_words("firstUse", g["kind"].as_str()),
        "its next call only"
    );
}
