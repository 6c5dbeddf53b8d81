//! Fetching a server's list again, and what a fetch that fails or is slow leaves (red-team
//! rounds 21–22): a host shown a list other than the catalog, a list that differs each time, a
//! catalog cut at the page bound, a new server's first list past its deadline, a change
//! announced while a call waited. Each test failed on the code it was written against.

use serde_json::{Value, json};

use super::testing::*;
use super::tests_catalog_unknown::Paged;
use super::*;

/// The server adds `delete_item` and says `list_changed`: the supervisor's refresh request (not
/// answered) is returned.
fn refresh_adding_delete_item(h: &mut Harness, epoch: &str) -> Value {
    from_child(h, epoch, list_changed());
    let refresh = next_to_child(h);
    assert_eq!(refresh["method"], json!("tools/list"));
    let names = ["list_items", "write_item", "delete_item"];
    h.tools = names.iter().map(|n| tool(n, 1)).collect();
    refresh
}

fn budget_ms() -> u64 {
    DEFAULT_FIRST_START_BUDGET.as_millis() as u64
}

/// The server says `list_changed` and adds `delete_item`, but never answers the supervisor's
/// `tools/list`; the host's own `tools/list` (served by the running server during the fetch)
/// shows it `delete_item`. When the fetch ends (its deadline), the list is fetched again, so
/// the host's call of the tool it was just shown goes through. Round 22: the refetch ran only
/// for a list that arrived while no fetch was on, and the call was refused.
#[test]
fn a_host_shown_a_newer_list_during_a_refresh_gets_it_fetched_again() {
    let (mut h, epoch) = Harness::serving_legacy();
    // Never answered. The server's tools changed; the host lists them from the server itself.
    refresh_adding_delete_item(&mut h, &epoch);
    let l = h.request("tools/list", json!({}));
    let listed = h
        .answer(&l)
        .expect("served by the running server during the fetch");
    assert_eq!(Harness::names(&listed).len(), 3, "{listed}");
    // The page's deadline ends the fetch; the fake server answers the one that follows.
    h.advance(budget_ms() + 1);
    let c = h.call("delete_item");
    let answer = h.answer(&c).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the host called a tool the server listed to it moments ago and was refused with the \
         catalog of the given-up refresh (catalog tools: {:?}): {answer}",
        h.s.catalogs
            .history
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>())
    );
}

/// A rebuild starts server `b`, which does not answer the supervisor's first `tools/list` within
/// the budget (a slow start): its tools are not known, and nothing is announced (no revision,
/// no `list_changed`); a call asks for the list again and, when that fails too, is refused as
/// `identity_pending`, not as a tool the server no longer has; once the host lists tools
/// (answered by the server), the list is fetched and calls go through. Round 22: the first list past its deadline was "treated as empty": every
/// tool announced removed.
#[test]
fn a_new_servers_first_list_past_its_deadline_announces_nothing() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let notes_before = h.host_notes("notifications/tools/list_changed");
    // The new server handshakes; its first tools/list is not answered.
    let (new, _) = h.rebuild_until_first_list("b", &old);
    assert_ne!(new, old);
    // The budget passes; a call comes right after.
    h.io().now_ms += budget_ms() + 1;
    h.handle(Event::Timer(Timer::ServerDeadline));
    let id = json!("late-call");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "list_items", "arguments": {}}}),
    );
    // The call asks for the list again and waits for it; the server fails it again: the call
    // is refused (the list is asked for again by a call at most every CATALOG_RETRY_MS).
    assert_eq!(
        h.answer(&id),
        None,
        "held while the list is asked for again"
    );
    let again = loop {
        let (e, m) = h
            .io()
            .to_child
            .pop_front()
            .expect("the list asked for again");
        if e == new && m["method"] == json!("tools/list") {
            break m;
        }
    };
    from_child(
        &mut h,
        &new,
        json!({"jsonrpc": "2.0", "id": again["id"],
               "error": {"code": -32603, "message": "not ready"}}),
    );
    let told = h.host_notes("notifications/tools/list_changed") - notes_before;
    let answer = h.answer(&id);
    let removed = answer.as_ref().is_some_and(|a| {
        let p = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"];
        p["removed"] == json!(true) || p["error"] == json!("unknown_tool")
    });
    assert!(
        told == 0 && !removed,
        "a server that has not listed yet was announced as having no tools: {told} list_changed \
         to the host, call answered {answer:?}; status: {:?}",
        h.io().status
    );
    assert_eq!(
        answer.as_ref().and_then(Harness::tool_error).as_deref(),
        Some("identity_pending"),
        "{answer:?}"
    );
    // The host lists; the server answers it (and then the supervisor's fetch).
    h.tools = vec![tool("list_items", 1), tool("write_item", 1)];
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let c = h.call("list_items");
    let answer = h.answer(&c).expect("answered");
    assert_eq!(Harness::tool_error(&answer), None, "{answer}");
}

/// A server whose list differs on every `tools/list` (a counter in a description; it never
/// says `list_changed`) and a host that lists again whenever told `list_changed`: the fetch a
/// host's listing starts tells the host nothing (it just listed), so they do not loop. Round 22:
/// 20 rounds, 20 revisions, each told to the host.
#[test]
fn a_list_that_differs_each_time_does_not_loop_host_and_supervisor() {
    let (mut h, _epoch) = Harness::serving_legacy();
    let mut lists = 100;
    let mut told = h.host_notes("notifications/tools/list_changed");
    let mut rounds = 0;
    let revisions_before = h.s.catalogs.history.current().unwrap().number;
    // The host lists once, then again whenever told; 20 rounds at most here.
    for _ in 0..20 {
        let id = json!(format!("list-{rounds}"));
        host_raw(
            &mut h,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}}),
        );
        serve_changing(&mut h, &mut lists);
        rounds += 1;
        let now = h.host_notes("notifications/tools/list_changed");
        if now == told {
            break;
        }
        told = now;
    }
    let revisions = h.s.catalogs.history.current().unwrap().number - revisions_before;
    assert!(
        rounds < 5,
        "the host listed {rounds} times, each time told list_changed again by the supervisor \
         ({revisions} catalog revisions, {} catalog_refreshed records), for a server that never \
         said list_changed",
        h.audit_kinds(audit::CATALOG_REFRESHED).len()
    );
}

/// The server says `list_changed` (it added `delete_item`) and answers the supervisor's
/// `tools/list` in 6 s; a call arriving meanwhile goes to the server after its 5 s hold. The
/// answer that comes a second later is the new catalog: the host is told `list_changed`, and a
/// call of `delete_item` goes through. Round 22: the call's hold gave the refresh up, and the
/// late answer was dropped.
#[test]
fn a_change_announced_while_a_call_waited_is_not_forgotten() {
    let (mut h, epoch) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert!(h.answer(&l).is_some());
    let told_before = h.host_notes("notifications/tools/list_changed");
    let refresh = refresh_adding_delete_item(&mut h, &epoch);
    let held = h.call("list_items");
    h.advance(DEFAULT_RESTART_HOLD.as_millis() as u64 + 1);
    assert!(
        h.answer(&held).is_some(),
        "the held call went to the server after its hold"
    );
    // The server's answer to the refresh, a second late.
    h.advance(1_000);
    let tools = h.tools.clone();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": refresh["id"], "result": {"tools": tools}}),
    );
    h.serve();
    h.advance(60_000);
    assert!(
        h.host_notes("notifications/tools/list_changed") > told_before,
        "the server said list_changed and listed a new tool; the host was never told (catalog \
         tools: {:?}; status: {:?})",
        h.s.catalogs
            .history
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>()),
        h.io().status
    );
    let c = h.call("delete_item");
    let answer = h.answer(&c).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the server announced and then listed `delete_item`, yet the call is refused by the \
         catalog from before its list_changed: {answer}"
    );
}

/// A server whose list has more pages than the supervisor fetches ([`MAX_CATALOG_PAGES`]): its
/// catalog holds the pages fetched. The host's own listing has no page bound, so its whole list
/// always differs from that cut catalog: it starts no fetch. Round 22: each host listing made
/// the supervisor fetch all 1,000 pages again.
#[test]
fn a_host_listing_past_the_page_bound_starts_no_fetch() {
    let pages = (0..=MAX_CATALOG_PAGES).map(|n| vec![tool(&format!("t{n:04}"), 1)]);
    let mut server = Paged {
        pages: pages.collect(),
        fail_page: None,
        supervisor_pages: 0,
    };
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    server.serve(&mut h);
    assert!(h.s.child_ready());
    let first_fetch = server.supervisor_pages;
    for round in 0..3 {
        server.host_lists(&mut h, &format!("r{round}"));
    }
    let more = server.supervisor_pages - first_fetch;
    assert_eq!(
        more, 0,
        "three host listings of an unchanged list: {more} more pages fetched"
    );
}

/// The fake server of `h`, except that its list changes on every `tools/list` it answers (a
/// description holding a counter or a timestamp), and it never says `list_changed`.
fn serve_changing(h: &mut Harness, lists: &mut u32) {
    while let Some((epoch, msg)) = h.io().to_child.pop_front() {
        if msg["method"] == json!("tools/list") {
            *lists += 1;
            let tools = json!([tool("list_items", *lists), tool("write_item", 1)]);
            from_child(
                h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": tools}}),
            );
        } else {
            h.io().to_child.push_front((epoch, msg));
            h.serve();
        }
    }
}

/// A host that never lists again (most do not) and a server whose first list failed: the next
/// call asks the server for its list and waits for it (at most its hold), so the call is judged
/// by the tools the server lists now. Round 22 follow-up: such a host's calls were refused
/// until a rebuild.
#[test]
fn a_call_to_a_server_whose_tools_are_unknown_asks_for_them() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let (epoch, list) = h.start_until_first_list();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": list["id"],
               "error": {"code": -32603, "message": "database unavailable"}}),
    );
    assert!(h.s.child_ready(), "the server serves the rest");
    let c = h.call("list_items");
    let answer = h.answer(&c).expect("answered once the server listed");
    assert_eq!(Harness::tool_error(&answer), None, "{answer}");
    let fetched = h
        .io()
        .status
        .iter()
        .any(|l| l.contains("its tools are not known"));
    assert!(fetched, "{:?}", h.io().status);
}

/// A rebuild: while server `b` handshakes, the host sends a call and a `resources/list` (both
/// held). `b`'s first `tools/list` fails at once: its tools are unknown and the held requests
/// are released; the call asks `b` for its list again (a fetch), and `resources/list` goes to
/// `b`, which serves everything but its list meanwhile. Round 25: the release stopped at the
/// call's fetch, and `resources/list` was answered by the supervisor at its hold deadline, "the
/// MCP server is still starting".
#[test]
fn a_call_fetching_unknown_tools_strands_no_other_held_request() {
    let (mut h, old) = Harness::serving_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("b"))));
    h.handle(Event::ChildStopped { epoch: old });
    let c = json!("c1");
    let call = json!({"name": "list_items", "arguments": {}});
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": c, "method": "tools/call", "params": call}),
    );
    let r = json!("r1");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": r, "method": "resources/list", "params": {}}),
    );
    let (b, first) = h.handshake_until_first_list();
    let failed = json!({"code": -32603, "message": "not ready"});
    from_child(
        &mut h,
        &b,
        json!({"jsonrpc": "2.0", "id": first["id"], "error": failed}),
    );
    let sent: Vec<Value> = (h.io().to_child.iter())
        .filter(|(e, _)| *e == b)
        .map(|(_, m)| m["method"].clone())
        .collect();
    assert!(
        sent.contains(&json!("tools/list")),
        "the call asked again: {sent:?}"
    );
    assert!(
        sent.contains(&json!("resources/list")),
        "sent to b: {sent:?}"
    );
    assert_eq!(h.answer(&c), None, "the call waits for the list");
}

/// A request held while a new server handshakes goes to it as soon as its first list is asked
/// for, when it does not need that list. Round 25: it waited for the whole fetch and, past its
/// hold, was answered "still starting" by the supervisor.
#[test]
fn a_request_held_through_a_handshake_goes_to_the_server_when_its_list_is_fetched() {
    let (mut h, old) = Harness::serving_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("b"))));
    h.handle(Event::ChildStopped { epoch: old });
    let r = json!("r1");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": r, "method": "resources/list", "params": {}}),
    );
    let (b, _first) = h.handshake_until_first_list();
    let sent = (h.io().to_child.iter()).any(|(e, m)| *e == b && m["method"] == "resources/list");
    assert!(sent, "held until the server's list came");
}
