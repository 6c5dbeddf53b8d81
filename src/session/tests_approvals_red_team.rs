//! Red-team rounds 9, 19 and 20 (approvals): each test failed on the code as found; the comment
//! says how.

use serde_json::{Value, json};

use super::approvals::PROMPT_ID_PREFIX;
use super::testing::*;
use super::tests_approvals::ready_eliciting;
use super::*;

/// A legacy host (no elicitation) connected, the server up with `tools`, the catalog listed.
fn ready_with(h: &mut Harness, tools: Vec<Value>) -> String {
    h.tools = tools;
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.current_epoch().expect("running")
}

/// `approve --call 7`: the human is shown call 7 (tool `read_item`, arguments A) and says yes.
/// Between the screen and the key, the agent sends another call under the same id 7 to
/// `delete_item` with the same arguments. `approveCall` carried only the call id and the
/// arguments digest, so the grant went to `delete_item`, a tool nobody reviewed; now it carries
/// the tool shown and is refused.
#[test]
fn approve_call_refuses_a_call_id_the_agent_reused_for_another_tool() {
    let mut h = Harness::new(|_| {});
    let epoch = ready_with(&mut h, vec![tool("read_item", 1), tool("delete_item", 1)]);
    let args = json!({"sku": "A-1"});
    let id = json!("7");
    h.host(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                  "params": {"name": "read_item", "arguments": args}}));
    assert_eq!(
        Harness::tool_error(&h.answer(&id).unwrap()).as_deref(),
        Some("authorization_required")
    );
    let call_id = id.to_string();
    // What `approve --call` shows the human.
    let shown = h.control(json!({"op": "deniedCall", "callId": call_id}));
    assert_eq!(shown["result"]["tool"], "read_item");
    let digest = shown["result"]["argumentsDigest"].clone();

    // The agent reuses the id for another tool with the same arguments (the id was answered,
    // so reusing it is legal JSON-RPC).
    h.io().to_host.clear();
    h.host(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                  "params": {"name": "delete_item", "arguments": args}}));
    assert!(h.answer(&id).is_some());

    // The human's `y` for what was shown: read_item with these arguments.
    let r = h.control(
        json!({"op": "approveCall", "epoch": epoch, "callId": call_id,
                             "tool": "read_item", "argumentsDigest": digest}),
    );
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["error"].as_str().unwrap_or("").contains("another tool"),
        "{r}"
    );
    assert!(h.audit_kinds(audit::APPROVAL_GRANTED).is_empty());
    // Whatever the answer, delete_item was never reviewed: a call of it is not forwarded.
    let before = h.server_saw.iter().filter(|m| *m == "tools/call").count();
    let del = h.call_with("delete_item", args);
    let a = h.answer(&del).unwrap();
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("authorization_required"),
        "delete_item ran under a grant for a call the human never saw: {a}"
    );
    assert_eq!(
        h.server_saw.iter().filter(|m| *m == "tools/call").count(),
        before
    );
}

/// A refused call's status line suggested `cargo mcp-dev approve --call <id>` with the id the
/// agent chose (any JSON string) escaped only with `escape_debug`: pasted into a shell, `$(…)`
/// in the id ran as the human's command, outside any gate. Now the id is one shell word that
/// cannot expand (`sanitize::shell_word`, checked against a real `sh` in its own tests), and an
/// id that is not printable ASCII gets `approve --follow` instead.
#[test]
fn the_suggested_approve_call_command_quotes_the_agents_id() {
    let mut h = Harness::new(|_| {});
    ready_with(&mut h, vec![tool("write_item", 1)]);
    for (id, expected) in [
        (
            json!("7$(echo INJECTED)"),
            r#"approve --call='"7$(echo INJECTED)"'`"#,
        ),
        (json!("it's x"), r#"approve --call='"it'\''s x"'`"#),
        // A backtick: the command is shown between backticks, so the inbox instead.
        (json!("it's`x`"), "approve --follow`"),
        (json!(-5), "approve --call=-5`"),
        (json!("\u{202e}x"), "approve --follow`"),
    ] {
        h.host(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": "write_item", "arguments": {}}}));
        assert!(h.answer(&id).is_some());
        let line = h.io().status.pop().expect("a status line");
        assert!(line.contains(expected), "{id}: {line}");
    }
}

/// `cargo mcp-dev status` suggested the id as JSON text inside the command, where a shell still
/// expands `$(…)` and backticks; it now suggests the same safe word as the status line.
#[test]
fn status_suggests_approve_call_with_the_same_safe_word() {
    let id = "\"7$(echo INJECTED)\"";
    let st = json!({"deniedCalls": [{"callId": id, "tool": "write_item",
                     "argumentsDigest": "sha256:ab"}]});
    let text = crate::screen::wording::status_page(&st);
    let line = text
        .lines()
        .find(|l| l.contains("approve --call"))
        .expect("status suggests approve --call");
    assert!(
        line.contains(r#"`cargo mcp-dev approve --call='"7$(echo INJECTED)"'`"#),
        "{line}"
    );
}

/// The suggested `approve --call=WORD` for a call whose id is the number 7 is
/// `approve --call=7`. The agent's next refused call has the string id "7" (its own suggestion
/// is `--call='"7"'`). `denied_call` also matches a bare word against a quoted string id and
/// takes the newest: the word suggested for the first call now shows and approves the second
/// (another tool), and no word reaches the first call at all.
#[test]
fn the_word_suggested_for_call_7_reaches_call_7_not_call_quoted_7() {
    let mut h = Harness::new(|_| {});
    h.tools = vec![tool("read_item", 1), tool("delete_item", 1)];
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.host(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                  "params": {"name": "read_item", "arguments": {}}}));
    let line = h.io().status.pop().expect("a status line");
    assert!(line.contains("`cargo mcp-dev approve --call=7`"), "{line}");
    h.host(json!({"jsonrpc": "2.0", "id": "7", "method": "tools/call",
                  "params": {"name": "delete_item", "arguments": {}}}));
    // What the shell passes for the suggested word `7`.
    let shown = h.control(json!({"op": "deniedCall", "callId": "7"}));
    assert_eq!(
        shown["result"]["tool"], "read_item",
        "`approve --call=7`, suggested for call 7, shows another call: {shown}"
    );
}

/// The session's audit records as the journals (`audit show`) read them.
fn journals_of(h: &mut Harness) -> crate::audit::Journals {
    let records: Vec<crate::audit::Record> = h
        .io()
        .audit
        .iter()
        .enumerate()
        .map(|(i, (kind, epoch, data))| crate::audit::Record {
            v: crate::audit::FORMAT_VERSION,
            seq: i as u64 + 1,
            time: format!("2026-01-01T00:00:{:02}.000Z", i % 60),
            record_type: kind.clone(),
            run: "R".into(),
            epoch: epoch.clone(),
            prev: crate::audit::GENESIS_PREV.into(),
            data: data.clone(),
            hash: String::new(),
            mac: String::new(),
        })
        .collect();
    crate::audit::Journals::from_records(&records)
}

/// The host cancels call 1 (`write_item`): `call_cancelled`. It then sends a new call under
/// the id 1 (`list_items`, forwarded: `tool_called`, a new journal entry). The server's late
/// answer to the cancelled call is recorded as its `tool_result` (tool `write_item`), but the
/// journal matches results by call id only: `audit show` says `write_item` was "cancelled by
/// the host" (it ran) and `list_items`, still running, finished.
#[test]
fn a_cancelled_calls_late_result_is_not_shown_as_a_reused_ids_result() {
    let mut h = Harness::ungated(|_| {});
    h.answer_calls = false;
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "write_item", "arguments": {}}}),
    );
    let first = next_to_child(&mut h);
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": 1}}),
    );
    assert_eq!(h.audit_kinds(audit::CALL_CANCELLED).len(), 1);
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "list_items", "arguments": {}}}),
    );
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": first["id"],
               "result": {"content": [{"type": "text", "text": "written"}]}}),
    );
    let j = journals_of(&mut h);
    let got: Vec<(String, crate::audit::CallOutcome)> = j
        .activity
        .iter()
        .map(|c| (c.tool.clone(), c.outcome.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "write_item".to_string(),
                crate::audit::CallOutcome::Ok {
                    duration_ms: Some(0)
                }
            ),
            ("list_items".to_string(), crate::audit::CallOutcome::Pending),
        ],
        "audit show: the cancelled call's result given to the call that reused its id"
    );
}

/// A tool name cannot put a command of its own choosing in backticks on the `call denied`
/// line (next to the `approve --call=` the supervisor suggests): its backticks are escaped.
#[test]
fn a_tool_name_cannot_fake_a_suggested_command() {
    let mut h = Harness::new(|_| {});
    let evil = "x` (or `cargo mcp-dev approve --yes --tool nuke";
    ready_with(&mut h, vec![tool(evil, 1)]);
    h.call(evil);
    let line = h
        .io()
        .status
        .iter()
        .find(|l| l.starts_with("call denied: "))
        .cloned()
        .expect("a call denied line");
    let ours = line.replace("\\`", "");
    let quoted: Vec<&str> = ours.split('`').skip(1).step_by(2).collect();
    assert_eq!(
        quoted,
        ["cargo mcp-dev approve", "cargo mcp-dev approve --call=2"],
        "only our commands are in backticks: {line}"
    );
}

/// The suggested `approve --tool NAME` carried the server's tool name as it was: a tool named
/// `x;touch /tmp/pwn` suggested a command that, pasted into a shell, ran the server's. The
/// name is now one shell word that cannot expand.
#[test]
fn a_suggested_approve_command_carries_the_tool_name_as_one_shell_word() {
    let mut h = Harness::new(|_| {});
    let evil = "x;touch /tmp/pwn$(id)";
    ready_with(&mut h, vec![tool(evil, 1), tool("-rf", 1)]);
    h.call(evil);
    h.call("-rf");
    let lines: Vec<String> = h
        .io()
        .status
        .iter()
        .filter(|l| l.starts_with("call denied: "))
        .cloned()
        .collect();
    assert!(
        lines[0].contains("`cargo mcp-dev approve --tool 'x;touch /tmp/pwn$(id)'`"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("`cargo mcp-dev approve --tool=-rf`"),
        "a leading dash stays the option's value: {}",
        lines[1]
    );
}

fn last_prompt(h: &mut Harness) -> Value {
    h.io()
        .to_host
        .iter()
        .rev()
        .find(|m| m["method"] == "elicitation/create")
        .cloned()
        .expect("a prompt was sent to the host")
}

fn modern_meta() -> Value {
    json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
           protocol::CLIENT_CAPABILITIES: {"elicitation": {"form": {}}}})
}

/// A modern eliciting host with the server up and its catalog listed.
fn modern(h: &mut Harness) {
    let d = h.request("server/discover", json!({"_meta": modern_meta()}));
    h.build(complete("a"));
    assert!(h.answer(&d).is_some());
    let l = h.request("tools/list", json!({"_meta": modern_meta()}));
    assert!(h.answer(&l).is_some());
}

/// Every audit record (any kind) that names the call `call_id` (its JSON text).
fn records_of_call(h: &mut Harness, call_id: &str) -> Vec<(String, Value)> {
    h.io()
        .audit
        .iter()
        .filter(|(_, _, d)| d.get("callId") == Some(&json!(call_id)))
        .map(|(k, _, d)| (k.clone(), d.clone()))
        .collect()
}

/// Red-team round 19. Legacy era: a gated call waits while its prompt is open; the host (the agent's side) then
/// cancels the call. The prompt is silently dropped: the call was never forwarded, never
/// refused, and nothing in the audit log says it was ever made (a call refused at the
/// terminal gets `authorization_denied`; one cancelled in flight gets `call_cancelled`).
#[test]
fn a_call_cancelled_while_its_host_prompt_is_open_is_recorded() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({"sku": "A-1"}));
    assert_eq!(h.answer(&call), None, "waits for the host's answer");
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": call}}),
    );
    assert!(h.s.approvals.prompts.is_empty(), "the prompt is closed");
    let recs = records_of_call(&mut h, &call.to_string());
    assert!(
        !recs.is_empty(),
        "a gated call that was cancelled during its approval prompt left no audit record at all"
    );
}

/// The same cancel: the form stays open in the host (no `notifications/cancelled` for the
/// prompt's request), so the person is still asked to approve a call that no longer exists;
/// their "Allow this tool" is then silently void. A withdrawal (rebuild, exit, terminal
/// grant, timeout) always closes the form; the host's own cancel does not.
#[test]
fn a_call_cancelled_while_its_host_prompt_is_open_withdraws_the_form() {
    let mut h = Harness::new(|_| {});
    ready_eliciting(&mut h);
    let call = h.call_with("write_item", json!({"sku": "A-1"}));
    let pid = last_prompt(&mut h)["id"].clone();
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": call}}),
    );
    let withdrawn = h
        .io()
        .to_host
        .iter()
        .any(|m| m["method"] == "notifications/cancelled" && m["params"]["requestId"] == pid);
    assert!(
        withdrawn,
        "the host's form for a cancelled call was left open"
    );
    // And the status document no longer lists it.
    let st = h.control(json!({"op": "status"}));
    assert_eq!(st["result"]["openPrompts"], json!([]), "{st}");
}

/// Red-team round 19. 2026-07-28: a gated call is answered `input_required` (the form) and nothing is written to
/// the audit log. If the host never retries (the agent drops it, or the person closes the
/// form), the prompt expires silently (`expire_prompts` skips modern prompts) and the call
/// was never recorded: the legacy flow records `authorization_denied` with outcome
/// `timed out`, the terminal flow at once.
#[test]
fn a_modern_call_answered_with_the_form_and_never_retried_is_recorded() {
    let mut h = Harness::new(|c| {
        c.warm = true;
        c.approval_timeout = std::time::Duration::from_secs(45);
    });
    modern(&mut h);
    let call = h.request(
        "tools/call",
        json!({"name": "write_item", "arguments": {"sku": "A-1"}, "_meta": modern_meta()}),
    );
    let a = h.answer(&call).unwrap();
    assert_eq!(a["result"]["resultType"], "input_required", "{a}");
    assert!(
        a["result"]["requestState"]
            .as_str()
            .unwrap()
            .starts_with(PROMPT_ID_PREFIX)
    );
    h.advance(60_000);
    assert!(h.s.approvals.prompts.is_empty(), "expired");
    let recs = records_of_call(&mut h, &call.to_string());
    assert!(
        recs.iter().any(|(k, _)| k == audit::AUTHORIZATION_DENIED),
        "a refused gated call (input_required, never retried) is in no audit record: {recs:?}"
    );
}

/// `authorization_denied` records (kind, record epoch, data) naming `call_id`.
fn denials_of(h: &mut Harness, call_id: &str) -> Vec<(Option<String>, Value)> {
    h.io()
        .audit
        .iter()
        .filter(|(k, _, d)| {
            k == audit::AUTHORIZATION_DENIED && d.get("callId") == Some(&json!(call_id))
        })
        .map(|(_, e, d)| (e.clone(), d.clone()))
        .collect()
}

/// Red-team round 20: round 19's `record_prompt_closed` stamps the record with the session's *current* epoch,
/// not the prompt's (`Prompt::epoch`, the code the call was judged and asked about). A modern
/// call is answered with the form under epoch A; the agent saves a file, the server is
/// rebuilt (epoch B; modern prompts are left open on a rebuild), and the form is never
/// retried. At expiry the refusal is recorded under epoch B: the audit log says code B
/// refused a call that B never saw, and the journal of epoch A lacks it (its data even says
/// `currentEpoch: A`). At session end (`fail_prompts` after the child is gone) it is recorded
/// under no epoch at all.
/// Expected: the record carries `prompt.epoch`.
#[test]
fn a_prompt_closed_after_a_rebuild_is_recorded_under_the_prompts_epoch() {
    let mut h = Harness::new(|c| {
        c.warm = true;
        c.approval_timeout = std::time::Duration::from_secs(45);
    });
    let d = h.request("server/discover", json!({"_meta": modern_meta()}));
    h.build(complete("a"));
    assert!(h.answer(&d).is_some());
    let l = h.request("tools/list", json!({"_meta": modern_meta()}));
    assert!(h.answer(&l).is_some());
    let epoch_a = h.current_epoch().expect("running");
    let call = h.request(
        "tools/call",
        json!({"name": "write_item", "arguments": {"sku": "A-1"}, "_meta": modern_meta()}),
    );
    let a = h.answer(&call).unwrap();
    assert_eq!(a["result"]["resultType"], "input_required", "{a}");
    let epoch_b = h.rebuild("b");
    assert_ne!(epoch_a, epoch_b);
    h.advance(60_000);
    let recs = denials_of(&mut h, &call.to_string());
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(
        recs[0].0.as_deref(),
        Some(epoch_a.as_str()),
        "the refusal of a call asked about epoch {epoch_a} is recorded under {:?}: {:?}",
        recs[0].0,
        recs[0].1
    );
}
