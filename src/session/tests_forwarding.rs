//! What the supervisor forwards, and how: droppable lines are the session's word, and a tool list
//! it cannot read never reaches the host.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A session serving the build `a` (warm, no host needed).
fn serving() -> Harness {
    let mut h = Harness::ungated(|c| c.warm = true);
    h.build(complete("a"));
    h
}

/// Review of issue 15: a forwarded line keeps its sender's member order, so whether it may be
/// dropped under backlog is said by the session (the message's kind), never read from the
/// line's first bytes: a request written `jsonrpc, method, params, id` is never droppable, a
/// notification in any order is.
#[test]
fn only_notifications_are_droppable_whatever_their_member_order() {
    let mut h = serving();
    h.initialize("2025-06-18");
    h.initialized();
    h.io().droppable.clear();
    h.host(serde_json::json!({"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 41}));
    h.handle(Event::HostLine(
        br#"{"jsonrpc":"2.0","method":"tools/list","params":{},"id":42}"#.to_vec(),
    ));
    h.serve();
    h.handle(Event::HostLine(
        br#"{"method":"notifications/roots/list_changed","jsonrpc":"2.0"}"#.to_vec(),
    ));
    h.serve();
    let dropped: Vec<_> = h.io().droppable.clone();
    assert!(
        dropped.iter().all(|m| m.get("id").is_none()),
        "a request or response was sent as droppable: {dropped:?}"
    );
    assert!(
        dropped
            .iter()
            .any(|m| m["method"] == "notifications/roots/list_changed"),
        "the host's notification is droppable: {dropped:?}"
    );
}

/// A session serving the build `a`, with a host connected (2025-06-18): its current epoch.
fn serving_a_host() -> (Harness, String) {
    let mut h = serving();
    h.initialize("2025-06-18");
    h.initialized();
    let epoch = h.current_epoch().unwrap();
    (h, epoch)
}

/// The host lists tools (id `host_id`), the server answers with `result` (raw JSON text):
/// what the host is told, exactly one message.
fn list_answered_with(h: &mut Harness, epoch: &str, host_id: &str, result: &str) -> Value {
    h.io().to_child.clear();
    h.handle(Event::HostLine(
        format!(r#"{{"jsonrpc":"2.0","id":"{host_id}","method":"tools/list","params":{{}}}}"#)
            .into_bytes(),
    ));
    let (_, forwarded) = h.io().to_child.pop_back().expect("forwarded to the server");
    assert_eq!(forwarded["method"], "tools/list");
    let ours = forwarded["id"].clone();
    let before = h.io().to_host.len();
    h.handle(Event::ChildLine {
        epoch: epoch.to_string(),
        line: format!(r#"{{"jsonrpc":"2.0","id":{ours},"result":{result}}}"#).into_bytes(),
    });
    let answers: Vec<Value> = h.io().to_host[before..].to_vec();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], host_id);
    answers[0].clone()
}

/// Review of issue 15: a server's tools/list answer the supervisor cannot read (here `tools`
/// named twice: the host's parser would pick one list, the supervisor none) never reaches the
/// host unrecorded; the host gets an error instead.
#[test]
fn an_unreadable_tool_list_is_not_forwarded() {
    let (mut h, epoch) = serving_a_host();
    let bad = r#"{"tools":[],"tools":[{"name":"evil","inputSchema":{"type":"object"}}]}"#;
    let answer = list_answered_with(&mut h, &epoch, "list-1", bad);
    assert_eq!(answer["error"]["data"]["error"], "invalid_response");
    assert!(!answer.to_string().contains("evil"));
}

/// A list answer byte-identical to the last one read is forwarded without being read again
/// (issue 15, 1,000-tool lists); that shortcut never lets a different, unreadable answer by.
#[test]
fn a_known_list_is_passed_on_and_an_unreadable_one_after_it_is_still_refused() {
    let (mut h, epoch) = serving_a_host();
    let good = r#"{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}"#;
    let bad = r#"{"tools":[],"tools":[{"name":"evil","inputSchema":{"type":"object"}}]}"#;
    for n in 1..=3 {
        let a = list_answered_with(&mut h, &epoch, &format!("list-{n}"), good);
        assert_eq!(a["result"]["tools"][0]["name"], "echo", "{a}");
    }
    let a = list_answered_with(&mut h, &epoch, "list-4", bad);
    assert_eq!(a["error"]["data"]["error"], "invalid_response", "{a}");
    let a = list_answered_with(&mut h, &epoch, "list-5", good);
    assert_eq!(a["result"]["tools"][0]["name"], "echo", "{a}");
}

/// Red-team review of session 14: a call with no one tool name to judge (`name` twice, once
/// spelled with an escape; not a string; params not an object) is never forwarded (the
/// server's parser could pick a name nobody judged) and never judged as a tool named `""`: the
/// host gets invalid params, the log a refused call.
#[test]
fn a_call_without_one_tool_name_is_refused_not_forwarded() {
    let (mut h, _epoch) = serving_a_host();
    let cases = [
        r#"{"name":"echo","\u006eame":"write_item","arguments":{}}"#,
        r#"{"name":"echo","name":"write_item"}"#,
        r#"{"name":7,"arguments":{}}"#,
        r#"{"arguments":{}}"#,
        r#"["echo",{}]"#,
    ];
    for (i, params) in cases.iter().enumerate() {
        h.io().to_child.clear();
        let before = h.io().to_host.len();
        let denied_before = h.audit_kinds("authorization_denied").len();
        h.handle(Event::HostLine(
            format!(
                r#"{{"jsonrpc":"2.0","id":"bad-{i}","method":"tools/call","params":{params}}}"#
            )
            .into_bytes(),
        ));
        assert!(
            h.io().to_child.is_empty(),
            "forwarded: {params} -> {:?}",
            h.io().to_child
        );
        let answers: Vec<Value> = h.io().to_host[before..].to_vec();
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["id"], format!("bad-{i}"), "{answers:?}");
        assert_eq!(answers[0]["error"]["code"], -32602, "{params}: {answers:?}");
        let denied = h.audit_kinds("authorization_denied");
        assert_eq!(denied.len(), denied_before + 1, "{params}");
        assert_eq!(denied.last().unwrap()["reason"], "invalid_params");
    }
    // A well-formed call still goes through (the fake server answers it).
    let denied_before = h.audit_kinds("authorization_denied").len();
    let id = h.call("list_items");
    let answer = h.answer(&id).expect("answered");
    assert!(answer.get("result").is_some(), "{answer}");
    assert_eq!(h.audit_kinds("tool_called").len(), 1);
    assert_eq!(h.audit_kinds("authorization_denied").len(), denied_before);
}

/// The host's request `line` as the session reads it.
fn host_line(h: &mut Harness, line: String) {
    h.handle(Event::HostLine(line.into_bytes()));
}

/// Every queue is bounded: a server that reads requests and never answers cannot grow the
/// session's open requests without bound. At `OPEN_AT_SERVER_LIMIT` the next request is answered
/// at once with `TOO_MANY_OPEN` and not forwarded (a call as a refused, recorded tool error), with
/// one status line per overflow; once the server answers one, requests go through again.
#[test]
fn a_server_that_never_answers_cannot_grow_the_open_requests_without_bound() {
    let (mut h, epoch) = serving_a_host();
    h.io().to_host.clear();
    let room = OPEN_AT_SERVER_LIMIT - h.s.open_requests().len();
    let mut first_forwarded = None;
    for i in 0..room {
        host_line(
            &mut h,
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"resources/list"}}"#,
                1000 + i
            ),
        );
        let sent = std::mem::take(&mut h.io().to_child);
        assert_eq!(sent.len(), 1, "request {i} not forwarded: {sent:?}");
        first_forwarded.get_or_insert_with(|| sent[0].1["id"].clone());
    }
    assert!(h.io().to_host.is_empty(), "{:?}", h.io().to_host.first());
    let overflow = "requests are open at the server";
    let told = |h: &mut Harness| {
        h.io()
            .status
            .iter()
            .filter(|l| l.contains(overflow))
            .count()
    };
    assert_eq!(told(&mut h), 0);

    for id in ["\"over-1\"", "\"over-2\""] {
        host_line(
            &mut h,
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"resources/list"}}"#),
        );
        let answer = h
            .answer(&serde_json::from_str(id).unwrap())
            .expect("answered");
        assert_eq!(answer["error"]["code"], codes::TOO_MANY_OPEN, "{answer}");
        assert_eq!(answer["error"]["data"]["limit"], OPEN_AT_SERVER_LIMIT);
    }
    let call = h.call("echo");
    let answer = h.answer(&call).expect("the call is answered at once");
    let text = Harness::tool_error(&answer).expect("a tool error");
    assert!(text.contains("too_many_open"), "{text}");
    assert!(
        h.io().to_child.is_empty(),
        "forwarded over the limit: {:?}",
        h.io().to_child
    );
    let refused = h.audit_kinds(audit::AUTHORIZATION_DENIED);
    assert!(
        refused
            .iter()
            .any(|d| d["reason"] == "too_many_open" && d["tool"] == "echo"),
        "{refused:?}"
    );
    assert_eq!(told(&mut h), 1, "one status line per overflow");

    // The server answers one: the next request is forwarded; the overflow after it is told again.
    let ours = first_forwarded.unwrap();
    h.handle(Event::ChildLine {
        epoch: epoch.clone(),
        line: format!(r#"{{"jsonrpc":"2.0","id":{ours},"result":{{}}}}"#).into_bytes(),
    });
    assert_eq!(
        h.answer(&json!(1000)).expect("answered")["result"],
        json!({})
    );
    host_line(
        &mut h,
        r#"{"jsonrpc":"2.0","id":"again","method":"resources/list"}"#.into(),
    );
    assert_eq!(h.io().to_child.len(), 1, "forwarded once there is room");
    assert!(h.answer(&json!("again")).is_none());
    host_line(
        &mut h,
        r#"{"jsonrpc":"2.0","id":"over-3","method":"resources/list"}"#.into(),
    );
    assert!(h.answer(&json!("over-3")).is_some());
    assert_eq!(told(&mut h), 2);
}

/// The other direction: a server that sends the host requests it never answers. At
/// `OPEN_AT_HOST_LIMIT` the server's next request is answered to the server at once and never
/// reaches the host; an answer from the host makes room; a new server starts with none open.
#[test]
fn a_server_cannot_flood_the_host_with_requests_nobody_answers() {
    let (mut h, epoch) = serving_a_host();
    h.io().to_host.clear();
    let server_request = |h: &mut Harness, epoch: &str, i: usize| {
        h.handle(Event::ChildLine {
            epoch: epoch.to_string(),
            line: format!(r#"{{"jsonrpc":"2.0","id":"s-{i}","method":"roots/list"}}"#).into_bytes(),
        });
    };
    for i in 0..OPEN_AT_HOST_LIMIT + 3 {
        server_request(&mut h, &epoch, i);
    }
    let at_host: Vec<Value> = h.io().to_host.drain(..).collect();
    assert_eq!(at_host.len(), OPEN_AT_HOST_LIMIT, "{:?}", at_host.last());
    assert!(at_host.iter().all(|m| m["method"] == "roots/list"));
    let refused: Vec<Value> = h.io().to_child.drain(..).map(|(_, m)| m).collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    for (k, m) in refused.iter().enumerate() {
        assert_eq!(m["id"], format!("s-{}", OPEN_AT_HOST_LIMIT + k));
        assert_eq!(m["error"]["code"], codes::TOO_MANY_OPEN, "{m}");
    }
    let told = |h: &mut Harness| {
        let needle = "requests the host has not answered";
        h.io().status.iter().filter(|l| l.contains(needle)).count()
    };
    assert_eq!(told(&mut h), 1);

    // The host answers the first: it reaches the server under the server's id, and the
    // server's next request reaches the host.
    let first = at_host[0]["id"].clone();
    h.handle(Event::HostLine(
        json!({"jsonrpc": "2.0", "id": first, "result": {"roots": []}})
            .to_string()
            .into_bytes(),
    ));
    let (_, answered) = h
        .io()
        .to_child
        .pop_front()
        .expect("the answer reaches the server");
    assert_eq!(answered["id"], "s-0");
    server_request(&mut h, &epoch, 9000);
    let m = h.io().to_host.pop().expect("forwarded once there is room");
    assert_eq!(m["method"], "roots/list");

    // A new server: the old one's requests are gone, its own go through.
    let new_epoch = h.rebuild("b");
    h.io().to_host.clear();
    server_request(&mut h, &new_epoch, 1);
    assert_eq!(h.io().to_host.len(), 1, "{:?}", h.io().to_host);
}

/// The server floods the host with requests past `OPEN_AT_HOST_LIMIT` (one status line), then
/// cancels them all itself (`notifications/cancelled`, passed to the host): none is open. It
/// floods again: the second overflow is refused silently, because `overflow_told` is cleared
/// only by a host answer (or a new epoch), not when the open requests go away otherwise.
#[test]
fn a_second_server_overflow_after_its_own_cancels_is_told() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let flood = |h: &mut Harness, base: usize| {
        for i in 0..=OPEN_AT_HOST_LIMIT {
            from_child(
                h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": base + i, "method": "roots/list"}),
            );
        }
    };
    let told = |h: &mut Harness| {
        h.io()
            .status
            .iter()
            .filter(|l| l.contains("requests the host has not answered"))
            .count()
    };
    flood(&mut h, 0);
    assert_eq!(told(&mut h), 1);
    for i in 0..OPEN_AT_HOST_LIMIT {
        from_child(
            &mut h,
            &epoch,
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": i}}),
        );
    }
    assert!(h.s.host.server_requests.open.is_empty());
    flood(&mut h, 1_000_000);
    assert_eq!(
        told(&mut h),
        2,
        "a second overflow of the server's requests, not said"
    );
}

/// The server's own request (`roots/list`) was answered by the host; the server then sends a
/// late `notifications/cancelled` for it (the spec says to ignore such a cancellation). Its id
/// is in the server's id space: a host `tools/call` the server knows under the same number goes
/// on, and its answer reaches the host. Red-team round 21: the call was answered "the server
/// cancelled this request" and the server's real answer was dropped.
#[test]
fn a_late_cancel_of_the_servers_own_answered_request_ends_no_host_call() {
    let (mut h, epoch) = Harness::serving_legacy();
    h.answer_calls = false;
    let c = h.call("write_item");
    let sent = h
        .io()
        .call_messages
        .last()
        .cloned()
        .expect("the call reached the server");
    let ours = sent["id"].clone();
    // The server's own request, under the same number (its id space is its own).
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": ours, "method": "roots/list", "params": {}}),
    );
    let relayed = h
        .io()
        .to_host
        .iter()
        .rev()
        .find(|m| m["method"] == json!("roots/list"))
        .cloned()
        .expect("relayed to the host");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": relayed["id"], "result": {"roots": []}}),
    );
    let forwarded = next_to_child(&mut h);
    assert_eq!(
        forwarded["id"], ours,
        "the host's answer went back under the server's id"
    );
    // Late cancellation of its own (already answered) request.
    late_cancel_ends_no_call(&mut h, &epoch, &ours, &c);
    // The server answers the call after all: that answer reaches the host.
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": ours, "result": {"content": []}}),
    );
    assert!(
        h.answer(&c)
            .is_some_and(|a| a["result"]["content"] == json!([]))
    );
}

/// The server asked the host something (elicitation) and was replaced before the host
/// answered: the supervisor, which issued that request to the host, cancels it, so the host's
/// form does not stay open for a server that is gone. Red-team round 21: it was forgotten
/// silently.
#[test]
fn a_server_request_open_at_the_host_is_withdrawn_when_its_server_is_replaced() {
    let (mut h, epoch) = Harness::serving_legacy();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": 0, "method": "elicitation/create",
               "params": {"message": "confirm?", "requestedSchema": {"type": "object"}}}),
    );
    let relayed = h
        .io()
        .to_host
        .iter()
        .rev()
        .find(|m| m["method"] == json!("elicitation/create"))
        .cloned()
        .expect("relayed to the host");
    let new = h.rebuild("b");
    assert_ne!(new, epoch);
    let cancelled = h.io().to_host.iter().any(|m| {
        m["method"] == json!("notifications/cancelled") && m["params"]["requestId"] == relayed["id"]
    });
    assert!(
        cancelled,
        "the host still holds an elicitation of a server that is gone (no cancellation)"
    );
}

/// The same for a server request the supervisor answered itself (over
/// [`OPEN_AT_HOST_LIMIT`], refused as `too_many_open`): the server's late cancellation of it
/// ends no host call under the same number. Round 22.
#[test]
fn a_late_cancel_of_a_server_request_the_supervisor_refused_ends_no_host_call() {
    let (mut h, epoch) = Harness::serving_legacy();
    h.answer_calls = false;
    let c = h.call("write_item");
    let ours = h
        .io()
        .call_messages
        .last()
        .cloned()
        .expect("the call reached the server")["id"]
        .clone();
    // The server's requests fill what may be open at the host (string ids, its own space).
    for n in 0..OPEN_AT_HOST_LIMIT {
        from_child(
            &mut h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": format!("s{n}"), "method": "roots/list", "params": {}}),
        );
    }
    // One more, under the number our call has: refused by the supervisor itself.
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": ours, "method": "roots/list", "params": {}}),
    );
    let refused =
        (h.io().to_child.iter()).any(|(_, m)| m["id"] == ours && m.get("error").is_some());
    assert!(
        refused,
        "the request over the limit was answered by the supervisor"
    );
    // The server gives up on that request of its own, late.
    late_cancel_ends_no_call(&mut h, &epoch, &ours, &c);
}

/// The server cancels its own request `ours`, late: the host's call `c`, which the server knows
/// under the same number, is not answered for it.
fn late_cancel_ends_no_call(h: &mut Harness, epoch: &str, ours: &Value, c: &Value) {
    from_child(
        h,
        epoch,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": ours, "reason": "timeout"}}),
    );
    assert_eq!(
        h.answer(c),
        None,
        "the host's call was answered as cancelled by the server, which cancelled only its own \
         request"
    );
}
