//! Approvals where the human is (issue 14): the in-host channel (legacy `elicitation/create`,
//! and 2026-07-28 `input_required` answered by the client's retry) with the official clients'
//! own elicitation handling, and the terminal fallback with a call
//! bound to its arguments (`approve --call`). The person at the host is scripted through the
//! drivers' `elicitation_policy` / `answer_elicitation` ops.

use super::*;

/// The client's driver on a fresh scenario. A 2026-07-28 client finds a warm server (built
/// first), so its `server/discover` gets the server's own answer and the session is modern
/// (cold, it falls back to `initialize` when the build outlasts the handshake wait).
fn driver_for(s: &mut Scenario, client: Client) -> Driver {
    if client == Client::Py2Elicit {
        prebuild(s);
    }
    s.driver(client, &[], &[])
}

/// `cargo mcp-dev build` of the scenario's project: the next `run` starts warm.
fn prebuild(s: &Scenario) {
    s.build_now();
}

/// Sets how the driver's "person" answers the next prompts.
fn policy(d: &mut Driver, action: &str, choice: Option<&str>) {
    let r = d.cmd(
        json!({"op": "elicitation_policy", "action": action, "choice": choice}),
        secs(10),
    );
    assert_eq!(r["ok"], json!(true), "{r}");
}

/// The prompt the host showed (waits for it).
fn prompt_shown(d: &mut Driver) -> Value {
    let r = d.cmd(
        json!({"op": "wait_event", "event": "elicitation", "timeoutMs": 20_000}),
        secs(30),
    );
    assert_eq!(
        r["ok"],
        json!(true),
        "{:?}: no prompt in the host: {r}",
        d.client
    );
    d.events
        .iter()
        .rev()
        .find(|e| e["event"] == json!("elicitation"))
        .cloned()
        .expect("the elicitation event line")
}

fn grants_of(s: &Scenario) -> Vec<Value> {
    records_of(&s.audit_records(), "approval_granted")
        .into_iter()
        .map(|r| r["data"].clone())
        .collect()
}

/// The outcome of a refused prompt, from a denial payload.
fn host_outcome(p: &Value) -> String {
    assert_eq!(p["approval"]["channel"], json!("host"), "{p}");
    p["approval"]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The first 3 lines of a form's message (all Claude Code shows of it), each at most 76
/// columns (`chars` is enough here: the fixture's names and arguments are ASCII).
fn form_head(message: &str) -> Vec<String> {
    let head: Vec<String> = message.lines().take(3).map(str::to_string).collect();
    assert_eq!(head.len(), 3, "{message}");
    for l in &head {
        assert!(
            l.chars().count() <= 76,
            "a head line over 76 columns: {l:?}"
        );
    }
    head
}

/// The choices' labels of a shown form.
fn labels(shown: &Value) -> Value {
    shown["requestedSchema"]["properties"]["decision"]["enumNames"].clone()
}

/// The person said no: the model is told so (the tool result's sentence and payload), and is
/// never told how to approve another way.
fn assert_told_declined(r: &Value, client: Client) {
    let p = denial_payload(r, "authorization_required", client);
    assert_eq!(p["approval"]["declined"], json!(true), "{p}");
    assert!(
        p["retry"]
            .as_str()
            .unwrap_or_default()
            .starts_with("do not retry"),
        "{p}"
    );
    let text = r["content"][1]["text"].as_str().unwrap_or_default();
    assert!(text.contains("did not approve it"), "{text}");
    assert!(text.contains("Do not retry it"), "{text}");
    assert!(
        !text.contains("cargo mcp-dev approve") && !r.to_string().contains("cargo mcp-dev approve"),
        "{client:?}: the model is told how to route around the person: {r}"
    );
}

/// Accept "this call once" runs exactly that call; decline and cancel refuse the next one.
fn accept_once_then_decline(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(150));
    let mut d = driver_for(&mut s, client);
    let (pid, epoch) = start(&s, &mut d);
    if client == Client::Py2Elicit {
        let st = s.status_file().expect("status");
        assert_eq!(
            st["era"],
            json!("modern"),
            "the input_required flow is the one tested"
        );
    }
    policy(&mut d, "accept", Some("once"));
    let r = write(&mut d, "host-once", 1);
    assert_wrote(&r, "A", pid, "host-once");
    let shown = prompt_shown(&mut d);
    let text = shown["message"].as_str().unwrap_or_default();
    // What the person sees first (Claude Code shows 3 lines): the tool and its arguments,
    // what changed, how long a grant lasts.
    let head = form_head(text);
    assert_eq!(
        head[0], r#"Run `write_item` with {"qty":1,"sku":"host-once"}?"#,
        "{shown}"
    );
    assert_eq!(head[1], "First approval in this session.", "{shown}");
    assert_eq!(
        head[2],
        "Allow only this call, or `write_item` until the next rebuild; or decline."
    );
    assert!(text.contains(&epoch[epoch.len() - 8..]), "{shown}");
    assert_eq!(
        shown["requestedSchema"]["properties"]["decision"]["enum"],
        json!(["once", "tool", "deny"])
    );
    assert_eq!(
        labels(&shown),
        json!([
            "Only this call",
            "`write_item` until the next rebuild",
            "Decline: do not run this call"
        ])
    );
    let g = grants_of(&s);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0]["channel"], json!("host"));
    assert_eq!(g[0]["kind"], json!("call"));
    let calls = tool_called(&s);
    assert_eq!(calls[0]["data"]["grantKind"], json!("call"));
    assert_eq!(calls[0]["data"]["argumentsDigest"], g[0]["argumentsDigest"]);
    // The grant was for one call: the same call again asks again, and a decline refuses it.
    policy(&mut d, "decline", None);
    let r = write(&mut d, "host-once", 1);
    assert_told_declined(&r, client);
    let p = denial_payload(&r, "authorization_required", client);
    assert!(host_outcome(&p).starts_with("declined in the host"), "{p}");
    // The grant cited is this build's (used), not none or an older one.
    assert_eq!(p["approvedEpoch"], json!(epoch), "{p}");
    policy(&mut d, "cancel", None);
    let r = write(&mut d, "host-once", 1);
    assert_told_declined(&r, client);
    let p = denial_payload(&r, "authorization_required", client);
    assert!(host_outcome(&p).starts_with("cancelled in the host"), "{p}");
    assert_eq!(s.side_effect_lines().len(), 1, "only the approved call ran");
    assert_eq!(grants_of(&s).len(), 1);
    let denied = records_of(&s.audit_records(), "authorization_denied")
        .into_iter()
        .filter(|r| r["data"]["channel"] == json!("host"))
        .count();
    assert_eq!(denied, 2);
    close_clean(&s, d);
    assert_audit_verifies(&s);
}

/// A rebuild while the prompt is open. Legacy era (a form the supervisor holds open): the form
/// is withdrawn (`notifications/cancelled`) and the call refused at the rebuild, without
/// waiting for the human; an answer the client still sends is void. Modern era (the call was
/// answered with the form): the retry's answer is void.
fn rebuild_voids_the_answer(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(200));
    let mut d = driver_for(&mut s, client);
    let (_, epoch_a) = start(&s, &mut d);
    if client == Client::Py2Elicit {
        assert_eq!(s.status_file().expect("status")["era"], json!("modern"));
    }
    policy(&mut d, "hold", None);
    let id = d.send(json!({"op": "call_tool", "name": "write_item",
        "arguments": {"sku": "during-rebuild", "qty": 1}, "timeoutMs": 120_000, "nowait": true}));
    prompt_shown(&mut d);
    let (_, epoch_b, _) = rebuild(&s, &d, &epoch_a, to_b);
    // The TS client reads on while its form is open; the Python 1.x client's session awaits
    // its elicitation callback before it reads the next message, so it sees the refusal (and
    // the withdrawal) only once the human answered: for it, answer first.
    let r = if client == Client::TsV1Elicit {
        // Refused at the rebuild, while the form is still held unanswered.
        let r = d.result(&id, s.within(secs(30)));
        let _ = d.cmd(
            json!({"op": "answer_elicitation", "action": "accept", "choice": "tool"}),
            secs(10),
        );
        r
    } else {
        let r = d.cmd(
            json!({"op": "answer_elicitation", "action": "accept", "choice": "tool"}),
            secs(10),
        );
        assert_eq!(r["ok"], json!(true), "{r}");
        d.result(&id, s.within(secs(30)))
    };
    assert_eq!(r["ok"], json!(true), "a tool result, not a failure: {r}");
    let p = denial_payload(&r, "authorization_required", client);
    let outcome = host_outcome(&p);
    assert!(outcome.contains("rebuilt during the prompt"), "{outcome}");
    assert!(outcome.contains(&epoch_b), "{outcome}");
    assert!(grants_of(&s).is_empty(), "a void answer granted");
    assert!(s.side_effect_lines().is_empty());
    close_clean(&s, d);
}

/// A host without the elicitation capability: the terminal channel, and `approve --call`
/// grants exactly the denied call.
fn terminal_fallback_approve_call(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(150));
    let mut d = s.driver(client, &[], &[]);
    let (pid, _) = start(&s, &mut d);
    d.call_denied(
        "write_item",
        json!({"sku": "by-call", "qty": 2}),
        "authorization_required",
    );
    let st = s.wait_status("the denied call is listed", secs(10), |st| {
        st["deniedCalls"].as_array().is_some_and(|a| !a.is_empty())
    });
    assert_eq!(st["approvalChannels"], json!(["terminal"]), "{st}");
    let call_id = st["deniedCalls"][0]["callId"].as_str().unwrap().to_string();
    let mut args = vec!["approve", "--call", &call_id, "--yes", "--json"];
    let control = s.control_args();
    args.extend(control.iter().map(String::as_str));
    let out = s.mcp_dev(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "approve --call: {err}");
    assert!(err.contains("by-call"), "the arguments were shown: {err}");
    // Other arguments: still refused; the approved ones: run once.
    d.call_denied(
        "write_item",
        json!({"sku": "by-call", "qty": 3}),
        "authorization_required",
    );
    assert_wrote(&write(&mut d, "by-call", 2), "A", pid, "by-call");
    d.call_denied(
        "write_item",
        json!({"sku": "by-call", "qty": 2}),
        "authorization_required",
    );
    let g = grants_of(&s);
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!(g[0]["channel"], json!("terminal"));
    assert_eq!(g[0]["kind"], json!("call"));
    close_clean(&s, d);
}

#[test]
fn a01_accept_once_then_decline_ts_v1() {
    accept_once_then_decline("a01", Client::TsV1Elicit);
}

#[test]
fn a02_accept_once_then_decline_python1() {
    accept_once_then_decline("a02", Client::Py1Elicit);
}

#[test]
fn a03_rebuild_voids_the_answer_ts_v1() {
    rebuild_voids_the_answer("a03", Client::TsV1Elicit);
}

#[test]
fn a04_rebuild_voids_the_answer_python1() {
    rebuild_voids_the_answer("a04", Client::Py1Elicit);
}

#[test]
fn a05_terminal_fallback_ts_v1() {
    terminal_fallback_approve_call("a05", Client::TsV1);
}

#[test]
fn a06_terminal_fallback_python1() {
    terminal_fallback_approve_call("a06", Client::Py1);
}

/// Nobody answers: the call is refused at the approval timeout, well before the SDK's own.
#[test]
fn a07_unanswered_prompt_times_out_ts_v1() {
    let mut s = Scenario::new("a07", secs(150));
    let mut d = s.driver(Client::TsV1Elicit, &["--approval-timeout", "3s"], &[]);
    start(&s, &mut d);
    policy(&mut d, "hold", None);
    let r = write(&mut d, "nobody", 1);
    assert_told_declined(&r, Client::TsV1Elicit);
    let p = denial_payload(&r, "authorization_required", Client::TsV1Elicit);
    assert!(host_outcome(&p).contains("timed out"), "{p}");
    assert!(grants_of(&s).is_empty());
    close_clean(&s, d);
}

/// 2026-07-28: the refused call comes back `input_required` with the form; the Python 2.x
/// client asks its callback and retries with the answer, which the supervisor matches.
#[test]
fn a08_accept_once_then_decline_python2_modern() {
    accept_once_then_decline("a08", Client::Py2Elicit);
}

#[test]
fn a09_rebuild_voids_the_answer_python2_modern() {
    rebuild_voids_the_answer("a09", Client::Py2Elicit);
}

/// 2026-07-28: the form's deadline passes before the person answers; the client's retry then
/// names a prompt that is no longer open and is refused, nothing granted.
#[test]
fn a10_late_answer_after_the_deadline_python2_modern() {
    let mut s = Scenario::new("a10", secs(150));
    prebuild(&s);
    let mut d = s.driver(Client::Py2Elicit, &["--approval-timeout", "2s"], &[]);
    start(&s, &mut d);
    assert_eq!(s.status_file().expect("status")["era"], json!("modern"));
    policy(&mut d, "hold", None);
    let id = d.send(json!({"op": "call_tool", "name": "write_item",
        "arguments": {"sku": "late", "qty": 1}, "timeoutMs": 60_000, "nowait": true}));
    prompt_shown(&mut d);
    std::thread::sleep(secs(3));
    let r = d.cmd(
        json!({"op": "answer_elicitation", "action": "accept", "choice": "tool"}),
        secs(10),
    );
    assert_eq!(r["ok"], json!(true), "{r}");
    let r = d.result(&id, s.within(secs(30)));
    assert_eq!(r["ok"], json!(true), "a tool result, not a failure: {r}");
    denial_payload(&r, "authorization_required", Client::Py2Elicit);
    assert!(grants_of(&s).is_empty(), "a late answer granted");
    assert!(s.side_effect_lines().is_empty());
    close_clean(&s, d);
}

/// The Python 2.x client in legacy mode: the `elicitation/create` flow, as with 1.x.
#[test]
fn a11_accept_once_then_decline_python2_legacy() {
    accept_once_then_decline("a11", Client::Py2ElicitLegacy);
}

/// Issue 33 item 8: after a rebuild and a new grant, a refusal cites the newest grant (this
/// build's), the form says what changed in plain words, and `audit show` gives each grant's
/// lifetime in the form's words.
fn newest_grant_after_a_rebuild(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(240));
    let mut d = driver_for(&mut s, client);
    let (_, epoch_a) = start(&s, &mut d);
    policy(&mut d, "accept", Some("tool"));
    assert_eq!(write(&mut d, "first", 1)["isError"], json!(false));
    let (_, epoch_b, _) = rebuild(&s, &d, &epoch_a, to_b);
    policy(&mut d, "accept", Some("once"));
    assert_eq!(write(&mut d, "second", 1)["isError"], json!(false));
    let shown = prompt_shown(&mut d);
    let head = form_head(shown["message"].as_str().unwrap_or_default());
    assert_eq!(
        head[1], "New build since your last approval; tool definition unchanged.",
        "{shown}"
    );
    policy(&mut d, "decline", None);
    let r = write(&mut d, "third", 1);
    assert_told_declined(&r, client);
    let p = denial_payload(&r, "authorization_required", client);
    assert_eq!(p["approvedEpoch"], json!(epoch_b), "the newest grant: {p}");
    assert_eq!(p["currentEpoch"], json!(epoch_b), "{p}");
    let mut args = vec!["audit".to_string(), "show".to_string()];
    args.extend(s.control_args());
    let out = s.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "audit show: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("until the next rebuild"), "{shown}");
    assert!(shown.contains("this call only"), "{shown}");
    assert!(
        !shown.contains("runEnd") && !shown.contains("firstUse"),
        "{shown}"
    );
    close_clean(&s, d);
}

#[test]
fn a12_newest_grant_after_a_rebuild_ts_v1() {
    newest_grant_after_a_rebuild("a12", Client::TsV1Elicit);
}

#[test]
fn a13_newest_grant_after_a_rebuild_python2_modern() {
    newest_grant_after_a_rebuild("a13", Client::Py2Elicit);
}
