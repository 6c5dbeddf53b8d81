//! A failed refresh, a cancelled page, an invalid list (red-team round 12), a list that is no
//! list, a fetch the server never answers, a host shown a newer list (round 21). Each test failed
//! on the code as found.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A served session whose server then says `list_changed`: the refresh's first page request.
fn refresh(h: &mut Harness) -> (String, Value) {
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    assert_eq!(h.s.catalogs.history.current().unwrap().number, 1);
    from_child(h, &epoch, list_changed());
    let page = next_to_child(h);
    assert_eq!(page["method"], json!("tools/list"));
    (epoch, page)
}

/// Tools of the supervisor's current catalog.
fn current_tools(h: &Harness) -> usize {
    h.s.catalogs.history.catalog().map(|c| c.len()).unwrap_or(0)
}

/// A refresh in the same epoch (after `list_changed`) whose first page answers with an error
/// (a transient failure): round 10 kept the catalog for an error on a *later* page, but an
/// error on the first page still publishes an empty catalog as a new revision. The gate then
/// judges every call against "no tools" (a call of a tool the host holds and the server still
/// has is refused as gone) and the host is told the list changed: no server said it has no
/// tools.
#[test]
fn first_page_error_of_a_refresh_keeps_the_catalog() {
    let mut h = Harness::ungated(|_| {});
    let (epoch, page) = refresh(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page["id"],
               "error": {"code": -32603, "message": "database busy"}}),
    );
    assert_eq!(
        current_tools(&h),
        2,
        "a failed refresh must keep the catalog (status: {:?})",
        h.io().status
    );
    let id = h.call("list_items");
    let answer = h.answer(&id).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "a call of a tool the server still has must be forwarded: {answer}"
    );
}

/// The same with a first page of the refresh that is not JSON (round 11 made such a page end
/// the fetch): "its catalog is treated as empty", a new revision without tools.
#[test]
fn garbage_first_page_of_a_refresh_keeps_the_catalog() {
    let mut h = Harness::ungated(|_| {});
    let (epoch, page) = refresh(&mut h);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"tools\":[",
        page["id"]
    );
    h.handle(Event::ChildLine {
        epoch: epoch.clone(),
        line: line.into_bytes(),
    });
    assert_eq!(
        current_tools(&h),
        2,
        "an unreadable refresh must keep the catalog (status: {:?})",
        h.io().status
    );
}

/// The server cancels the supervisor's own `tools/list` (`notifications/cancelled` naming the
/// page's id): it will not answer it. The cancel is ignored (only host requests are looked
/// at), so the child stays in `FetchingCatalog` for the rest of its epoch: every host request
/// is held until its deadline and then refused, the server never again gets a call.
#[test]
fn server_cancel_of_a_catalog_page_ends_the_fetch() {
    let mut h = Harness::ungated(|_| {});
    let (epoch, page) = refresh(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
               "params": {"requestId": page["id"], "reason": "shutting down that handler"}}),
    );
    let id = h.call("list_items");
    let answer = h.answer(&id);
    assert!(
        answer.is_some() && Harness::tool_error(answer.as_ref().unwrap()).is_none(),
        "the call must be forwarded at once, not held behind a fetch nobody will answer \
         (phase {:?}, answer {answer:?})",
        h.s.server.child().map(|c| c.phase.clone())
    );
}

/// A server whose one-page list is invalid (two tools named alike): the supervisor's catalog
/// is "treated as empty", and that empty catalog is remembered as what those very bytes list.
/// When the host lists and gets the same bytes (two tools), the session records
/// (`catalog_presented`) and tells the gate that the host was shown a catalog of 0 tools; a
/// host list that is not valid is otherwise never taken as a catalog the host holds.
#[test]
fn invalid_list_is_not_recorded_as_an_empty_catalog_shown_to_the_host() {
    let mut h = Harness::ungated(|_| {});
    h.tools = vec![tool("list_items", 1), tool("list_items", 2)];
    h.connect_legacy();
    h.build(complete("a"));
    assert_eq!(current_tools(&h), 0);
    let before = h.audit_kinds(audit::CATALOG_PRESENTED).len();
    let id = h.request("tools/list", json!({}));
    let answer = h.answer(&id).expect("forwarded");
    assert_eq!(Harness::names(&answer).len(), 2);
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED);
    let claimed: Vec<_> = presented[before..]
        .iter()
        .map(|p| p["tools"].clone())
        .collect();
    assert!(
        claimed.iter().all(|t| t != &json!(0)),
        "the host got 2 tools; recorded as shown: {claimed:?}"
    );
}

/// Starts server `a` and plays its handshake; the supervisor's own first `tools/list` is
/// answered with `answer` (a `result` or an `error` member) instead of the fake server's list.
fn first_fetch_answered_with(h: &mut Harness, answer: Value) {
    let (epoch, list) = h.start_until_first_list();
    let mut line = json!({"jsonrpc": "2.0", "id": list["id"]});
    for (k, v) in answer.as_object().unwrap() {
        line[k] = v.clone();
    }
    from_child(h, &epoch, line);
}

/// The server answers the supervisor's `tools/list` with `tools` that is not an array (an
/// object keyed by name): no list, so nothing is recorded as what this package's server listed.
/// Red-team round 21: it was read as "no tools", a whole empty catalog, recorded in the facts
/// and served at a later cold first contact as the server's catalog.
#[test]
fn a_tools_member_that_is_not_an_array_is_no_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    first_fetch_answered_with(
        &mut h,
        json!({"result": {"tools": {"list_items": tool("list_items", 1)}}}),
    );
    let recorded = h.io().facts.as_ref().and_then(|f| f.catalog.clone());
    assert!(
        recorded.is_none(),
        "a tools/list whose `tools` is not an array was recorded as the server's whole catalog \
         (an empty list no server returned): {:?}; status: {:?}",
        recorded.map(|c| (c.tools, c.digest)),
        h.io().status
    );
}

/// The first server's first `tools/list` fails (`-32603`): an error lists nothing, so the next
/// session (its server still building past the budget) does not answer the host's `tools/list`
/// with `{"tools": []}` from a record. Red-team round 21: the error was taken for "a server
/// without tools" and recorded as the whole list (DESIGN §6, first-contact rule).
#[test]
fn a_first_list_error_is_not_served_later_as_an_empty_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    first_fetch_answered_with(
        &mut h,
        json!({"error": {"code": -32603, "message": "database unavailable"}}),
    );
    let facts = h.io().facts.clone().unwrap_or_default();
    // The next session, its server still building past the budget.
    let mut next = Harness::ungated(|c| c.recorded = facts);
    next.connect_legacy();
    let list = next.request("tools/list", json!({}));
    next.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64 + 1);
    let answer = next
        .answer(&list)
        .expect("answered at the end of the budget");
    assert!(
        answer["result"]["tools"] != json!([]),
        "the host was given an empty tool list that no server returned: {answer}"
    );
}

/// The server changed a tool without saying `list_changed` (allowed: "never rely on it"), and
/// the host's own `tools/list` shows it the new definition: the supervisor fetches its catalog
/// again, so the host's next call of that tool is judged by what the server lists now.
/// Red-team round 21: no refetch, and the call was refused as `catalog_stale` with the *older*
/// definition as the tool's `currentDefinition`.
#[test]
fn a_host_listing_newer_than_the_catalog_fetches_it_again() {
    let (mut h, _epoch) = Harness::serving_legacy();
    // The server's tools change silently.
    h.tools = vec![tool("list_items", 1), tool("write_item", 2)];
    let l = h.request("tools/list", json!({}));
    let listed = h.answer(&l).expect("forwarded");
    assert_eq!(
        listed["result"]["tools"][1]["description"],
        json!("write_item v2")
    );
    let c = h.call("write_item");
    let answer = h.answer(&c).expect("answered");
    let current = &answer["result"]["_meta"]["dev.cargo-mcp-dev/error"]["currentDefinition"];
    assert_ne!(
        current["description"],
        json!("write_item v1"),
        "the host was refused with a definition older than the one the server just listed: \
         {answer}"
    );
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the host called the tool as the server last listed it: {answer}"
    );
}

/// A refresh (`list_changed`) that finds the same catalog is recorded as `unchanged`. Red-team
/// round 21: its `catalog_refreshed` record said `first`.
#[test]
fn an_unchanged_refresh_is_recorded_as_unchanged() {
    let (mut h, epoch) = Harness::serving_legacy();
    from_child(&mut h, &epoch, list_changed());
    h.serve();
    let refreshed = h.audit_kinds(audit::CATALOG_REFRESHED);
    assert_eq!(refreshed.len(), 2, "{refreshed:?}");
    assert_ne!(
        refreshed[1]["summary"],
        json!("first"),
        "an unchanged refresh is recorded as the first catalog: {:?}",
        refreshed[1]
    );
}

/// The server says `list_changed`, then never answers the supervisor's `tools/list`: a host
/// request that does not depend on the catalog (`resources/list`) goes to the running server at
/// once. Red-team round 21: the fetch had no deadline, the child stayed "fetching" for the rest
/// of its epoch, and every request was held and then answered "the MCP server is still
/// starting" about a server that was up.
#[test]
fn a_refresh_the_server_never_answers_holds_no_other_request() {
    let (mut h, epoch) = Harness::serving_legacy();
    from_child(&mut h, &epoch, list_changed());
    let refresh = next_to_child(&mut h);
    assert_eq!(refresh["method"], json!("tools/list"));
    // Never answered. The host asks for something unrelated to tools.
    let id = json!(500);
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": id, "method": "resources/list", "params": {}}),
    );
    h.advance(30_000);
    let answer = h.answer(&id).expect("answered");
    assert!(
        answer.get("result").is_some(),
        "the host's resources/list never reached the running server; the supervisor answered:          {answer}"
    );
}

/// A refresh whose merged list cannot be a catalog (a tool named twice, as overlapping offset
/// pagination gives when a tool is inserted between two page fetches) keeps the catalog, as a
/// failed refresh page does. Red-team round 21: it replaced the catalog with an empty one, every
/// tool was announced removed, and a call of a tool the server still lists was refused with "no
/// longer exists in the server's current catalog".
#[test]
fn an_invalid_refresh_keeps_the_catalog() {
    let (mut h, epoch) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert!(h.answer(&l).is_some());
    h.tools = vec![
        tool("list_items", 1),
        tool("write_item", 1),
        tool("write_item", 1),
    ];
    from_child(&mut h, &epoch, list_changed());
    h.serve();
    let c = h.call("write_item");
    let answer = h.answer(&c).expect("answered");
    let payload = &answer["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert!(
        payload["removed"] != json!(true) && payload["error"] != json!("unknown_tool"),
        "the host was told `write_item` no longer exists, though the server still lists it: \
         {answer}"
    );
}

/// A call that arrives while a refresh is not answered waits at most its hold, then goes to the
/// running server, judged by the catalog it gave; no "still starting". The refresh goes on: its
/// answer, when it comes, is the new catalog. Round 21, with the test above (round 22: giving
/// the refresh up at the call's hold dropped the change the server had announced).
#[test]
fn a_call_held_by_an_unanswered_refresh_reaches_the_server_after_its_hold() {
    let (mut h, epoch) = Harness::serving_legacy();
    from_child(&mut h, &epoch, list_changed());
    let refresh = next_to_child(&mut h);
    assert_eq!(refresh["method"], json!("tools/list"));
    let c = h.call("list_items");
    assert_eq!(h.answer(&c), None, "held while the new list is fetched");
    h.advance(DEFAULT_RESTART_HOLD.as_millis() as u64 + 1);
    let answer = h.answer(&c).expect("answered after the hold");
    assert_eq!(Harness::tool_error(&answer), None, "{answer}");
    let tools = json!([
        tool("list_items", 1),
        tool("write_item", 1),
        tool("delete_item", 1)
    ]);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": refresh["id"], "result": {"tools": tools}}),
    );
    assert_eq!(h.s.catalogs.history.catalog().map(|c| c.len()), Some(3));
}

/// The first server never answers the supervisor's first `tools/list`: requests that do not
/// need the catalog go to the server meanwhile, and at the deadline (the first-start budget)
/// the fetch ends as a failed page and the session serves; nothing is recorded as what the
/// server listed. Round 21: the session waited for that answer for the rest of the epoch.
#[test]
fn a_first_list_never_answered_ends_at_its_deadline() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    // The server takes a second to answer its handshake: the handshake's own deadline passes
    // before the list's, which must have one of its own.
    h.start_until_first_list();
    // The server is up: what does not need its catalog goes to it meanwhile.
    let other = json!(77);
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": other, "method": "resources/list", "params": {}}),
    );
    let forwarded = (h.io().to_child.iter()).any(|(_, m)| m["method"] == json!("resources/list"));
    assert!(forwarded, "held instead of going to the running server");
    let held = h.call("list_items");
    assert_eq!(h.answer(&held), None, "a call waits for the catalog");
    h.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64 + 1);
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("was not answered within")),
        "{:?}",
        h.io().status
    );
    assert!(h.answer(&held).is_some(), "the held call is answered");
    assert!(
        h.s.server
            .child()
            .is_some_and(|c| c.phase.name() == "Ready")
    );
    assert!(
        h.io()
            .facts
            .as_ref()
            .and_then(|f| f.catalog.clone())
            .is_none()
    );
}

/// A server that lists its tools over many pages costs one deadline timer, not one per page
/// (the timer queue is bounded by the session, not by the server's paging). Round 21.
#[test]
fn a_paged_fetch_arms_one_deadline_timer() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let (epoch, mut page) = h.start_until_first_list();
    for n in 0..50 {
        h.io().now_ms += 10;
        let result = json!({"tools": [tool(&format!("t{n}"), 1)], "nextCursor": format!("c{n}")});
        from_child(
            &mut h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": page["id"], "result": result}),
        );
        page = next_to_child(&mut h);
        assert_eq!(page["method"], json!("tools/list"));
    }
    let armed = (h.io().timers.iter())
        .filter(|(_, t)| *t == Timer::ServerDeadline)
        .count();
    assert_eq!(armed, 1, "one timer for the fetch's deadlines");
    // The last page is still due: its deadline ends the fetch, with the 50 pages it got.
    h.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64 + 1);
    assert!(
        h.s.server
            .child()
            .is_some_and(|c| c.phase.name() == "Ready")
    );
    assert_eq!(h.s.catalogs.history.catalog().map(|c| c.len()), Some(50));
}
