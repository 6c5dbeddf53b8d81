//! Red-team round 10: the catalog room (paged `tools/list`, `list_changed`, what the host was
//! shown) against a hostile or merely unlucky server and host. Each test failed on the code as
//! found; its comment says what happened then.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A server whose tools change while the supervisor pages through `tools/list` says so with
/// `list_changed` between two pages. The notification is dropped (the child is not `Ready`
/// while it fetches), so the catalog merged from pages of two different states (page 1 from
/// before the change, page 2 after) stays the supervisor's current catalog, and nothing ever
/// fetches it again: the gate judges calls against a catalog the server never had.
#[test]
fn a_list_changed_during_a_paged_fetch_starts_the_fetch_over() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    from_child(&mut h, &epoch, list_changed());
    let page1 = next_to_child(&mut h);
    assert_eq!(page1["method"], json!("tools/list"));
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page1["id"],
               "result": {"tools": [tool("list_items", 2)], "nextCursor": "p2"}}),
    );
    let page2 = next_to_child(&mut h);
    assert_eq!(page2["params"]["cursor"], json!("p2"));
    // The server's tools change again before it answers page 2; it says so first.
    from_child(&mut h, &epoch, list_changed());
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"],
               "result": {"tools": [tool("write_item", 3)]}}),
    );
    let refetch =
        h.io().to_child.iter().any(|(_, m)| {
            m["method"] == json!("tools/list") && m["params"].get("cursor").is_none()
        });
    assert!(
        refetch,
        "the list_changed received mid-fetch must lead to a fresh fetch; the catalog kept is a \
         merge of two server states (status: {:?})",
        h.io().status
    );
}

/// Two `tools/list` requests of the host in flight at once (the host is untrusted; a host
/// that lists on connect and again on `list_changed` does it too): the first is answered with
/// page 1 of a paged list (an older tool, and a cursor), the second with the whole current
/// catalog in one page. Both answers pass through `host.list_pages`, which only a new request
/// clears: the one-page answer is merged with the other request's page, and the session
/// records (`catalog_presented`) and tells the gate that the host holds a catalog no server
/// ever listed (3 tools, a digest that is nobody's).
#[test]
fn two_host_lists_in_flight_are_not_merged_into_a_catalog_nobody_served() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let current = h.s.catalogs.history.current().unwrap().digest.clone();
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": 100, "method": "tools/list", "params": {}}),
    );
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": 101, "method": "tools/list", "params": {}}),
    );
    let first = next_to_child(&mut h);
    let second = next_to_child(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": first["id"],
               "result": {"tools": [tool("zzz_old", 1)], "nextCursor": "p2"}}),
    );
    let tools = h.tools.clone();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": second["id"], "result": {"tools": tools}}),
    );
    let answer = h.answer(&json!(101)).expect("forwarded");
    assert_eq!(Harness::names(&answer), ["list_items", "write_item"]);
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED);
    let last = presented
        .last()
        .expect("the whole list the host got is recorded");
    assert_eq!(
        (last["tools"].clone(), last["digest"].clone()),
        (json!(2), json!(current)),
        "recorded as shown to the host: {last}"
    );
    assert_eq!(h.s.approvals.gate.host_catalog(), Some(current.as_str()));
}

/// A server whose cursor never ends, with a host that keeps following it: every page the host
/// is forwarded is appended to `host.list_pages`, with no page or tool bound (the
/// supervisor's own fetch stops at `MAX_CATALOG_PAGES` / `MAX_CATALOG_TOOLS`).
#[test]
fn a_host_following_endless_pages_holds_at_most_the_catalog_bound() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let per_page = 1000;
    let pages = MAX_CATALOG_TOOLS / per_page + 20;
    for p in 0..pages {
        host_raw(
            &mut h,
            json!({"jsonrpc": "2.0", "id": 1000 + p, "method": "tools/list",
                   "params": if p == 0 { json!({}) } else { json!({"cursor": "again"}) }}),
        );
        let req = next_to_child(&mut h);
        let tools: Vec<Value> = (0..per_page)
            .map(|i| json!({"name": format!("t{p}_{i}")}))
            .collect();
        from_child(
            &mut h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": req["id"],
                   "result": {"tools": tools, "nextCursor": "again"}}),
        );
        h.io().to_host.clear();
    }
    let held = h.s.host.list_pages.len();
    assert!(
        held <= MAX_CATALOG_TOOLS,
        "{held} tools of an endless paged answer held in memory for the host's view"
    );
}

/// The `catalog_refreshed` record held the whole human diff, every changed description in
/// full (old and new): a server changing one 34 MiB description made a record longer than
/// `scan::MAX_RECORD_LINE`, which every reader refuses as damage. The diff lines are bounded
/// now (here a 1 MiB description of `"`, which doubles twice on the way, changes by one).
#[test]
fn a_huge_description_change_keeps_the_catalog_record_small() {
    let mut h = Harness::ungated(|_| {});
    let n = 1 << 20;
    h.tools = vec![json!({"name": "a", "description": "\"".repeat(n)})];
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    from_child(&mut h, &epoch, list_changed());
    let req = next_to_child(&mut h);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"tools\":[{{\"name\":\"a\",\"description\":{}}}]}}}}",
        req["id"],
        serde_json::to_string(&"\"".repeat(n + 1)).unwrap()
    );
    h.handle(Event::ChildLine {
        epoch: epoch.clone(),
        line: line.into_bytes(),
    });
    let refreshed = h.audit_kinds(audit::CATALOG_REFRESHED);
    let last = refreshed.last().expect("recorded");
    assert_eq!(last["revision"], json!(2));
    let bytes = serde_json::to_string(last).unwrap().len();
    assert!(
        bytes < 64 * 1024,
        "a catalog_refreshed record of {bytes} bytes"
    );
    let changes = last["changes"].as_array().expect("the diff's lines");
    assert!(
        changes
            .iter()
            .any(|l| l.as_str().unwrap_or("").contains("more characters")),
        "{changes:?}"
    );
    let longest = h.io().status.iter().map(|l| l.len()).max().unwrap_or(0);
    assert!(longest < 16 * 1024, "a status line of {longest} bytes");
}

/// An error on page 2 of the supervisor's paged fetch (a cursor that expired, a transient
/// failure) makes the catalog empty: the tools page 1 listed are thrown away, a new revision
/// with no tools is published, and the host is told `list_changed` for a change no server
/// made (and its calls are judged against a catalog with no tools). The error of a *first*
/// page means "no tools"; a later page's error does not.
#[test]
fn an_error_on_a_later_page_keeps_the_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let before = h.s.catalogs.history.current().unwrap().clone();
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    let notes = h.host_notes("notifications/tools/list_changed");
    from_child(&mut h, &epoch, list_changed());
    let page1 = next_to_child(&mut h);
    let tools = h.tools.clone();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page1["id"],
               "result": {"tools": tools, "nextCursor": "p2"}}),
    );
    let page2 = next_to_child(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"],
               "error": {"code": -32602, "message": "cursor expired"}}),
    );
    let names: Vec<String> =
        h.s.catalogs
            .history
            .catalog()
            .unwrap()
            .names()
            .map(str::to_string)
            .collect();
    assert_eq!(
        names,
        ["list_items", "write_item"],
        "the catalog after a failed page 2 (was revision {})",
        before.number
    );
    assert_eq!(
        h.host_notes("notifications/tools/list_changed"),
        notes,
        "the host was told the tools changed; status: {:?}",
        h.io().status
    );
}

/// A server that says `list_changed` during every fetch: the fetch starts over at most
/// `CATALOG_REFETCHES` times in a row, then the catalog holds the last fetch (said in a status
/// line), and the session serves.
#[test]
fn refetches_for_list_changed_are_bounded() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let recorded = h.s.recorded.catalog.clone();
    assert!(recorded.is_some());
    from_child(&mut h, &epoch, list_changed());
    let mut fetches = 0;
    while let Some((_, req)) = h.io().to_child.pop_front() {
        assert_eq!(req["method"], "tools/list", "{req}");
        assert!(
            req["params"].get("cursor").is_none(),
            "each fetch from its first page"
        );
        fetches += 1;
        assert!(fetches <= CATALOG_REFETCHES + 1, "fetching without end");
        from_child(&mut h, &epoch, list_changed());
        let tools = vec![tool("list_items", 10 + fetches as u32)];
        from_child(
            &mut h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": req["id"], "result": {"tools": tools}}),
        );
    }
    assert_eq!(fetches, CATALOG_REFETCHES + 1);
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("changed during each")),
        "{:?}",
        h.io().status
    );
    assert!(h.s.child_ready(), "serving after the last fetch");
    // What the last fetch got may mix two states: it gates, but is not recorded as whole.
    assert_eq!(h.s.recorded.catalog, recorded);
}

/// At a server's first fetch, a later page's error leaves the pages fetched as its catalog
/// (there is no earlier one to keep), said in a status line: not an empty catalog.
#[test]
fn an_error_on_a_later_page_of_the_first_fetch_keeps_the_pages_fetched() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    let epoch = h.current_epoch().unwrap();
    // The handshake, answered by the fake server; the first catalog page is ours to answer.
    loop {
        let (_, req) = h.io().to_child.pop_front().expect("the first catalog page");
        if req["method"] == "tools/list" {
            from_child(
                &mut h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": req["id"],
                       "result": {"tools": [tool("list_items", 1)], "nextCursor": "p2"}}),
            );
            break;
        }
        if req["method"] == "initialize" {
            let v = req["params"]["protocolVersion"].clone();
            from_child(
                &mut h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": req["id"], "result": {"protocolVersion": v,
                       "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}}}),
            );
        }
    }
    let page2 = next_to_child(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"],
               "error": {"code": -32602, "message": "cursor expired"}}),
    );
    let names: Vec<String> =
        h.s.catalogs
            .history
            .catalog()
            .unwrap()
            .names()
            .map(str::to_string)
            .collect();
    assert_eq!(names, ["list_items"]);
    // It gates calls, but is not kept as what this package's server listed: a later first
    // contact answers from that record, and no server listed this as its whole catalog.
    assert_eq!(h.s.recorded.catalog, None, "a cut catalog recorded");
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("page 2 failed") && l.contains("cursor expired")),
        "{:?}",
        h.io().status
    );
}

// ----- red-team round 11 ---------------------------------------------------------------------

/// The host was shown the whole catalog. Then it sends a `tools/list` with a cursor (it follows
/// a listing begun at an earlier server, or just names a cursor) and the server answers that
/// page, the last one, with one tool. No listing is open, and `observe_host_list` takes a
/// last page with nothing open for "the whole list in one page" without asking whether it
/// answered a first-page request: it records `catalog_presented` of a one-tool catalog the host
/// was never shown as a catalog, and the gate's view of the host becomes that digest.
#[test]
fn a_last_page_without_its_first_is_not_recorded_as_a_whole_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let current = h.s.catalogs.history.current().unwrap().digest.clone();
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    assert_eq!(h.s.approvals.gate.host_catalog(), Some(current.as_str()));
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED).len();

    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list", "params": {"cursor": "p2"}}),
    );
    let req = next_to_child(&mut h);
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": req["id"], "result": {"tools": [tool("write_item", 1)]}}),
    );
    assert!(h.answer(&json!(50)).is_some(), "forwarded");
    let now = h.audit_kinds(audit::CATALOG_PRESENTED);
    assert_eq!(
        now.len(),
        presented,
        "a page 2 recorded as the whole catalog shown: {:?}",
        now.last()
    );
    assert_eq!(h.s.approvals.gate.host_catalog(), Some(current.as_str()));
}

/// `list_starts` kept the newest 64 first-page requests (now `list_requests`, all lists). A host with 65 `tools/list` in flight
/// (untrusted; a concurrent server answers them out of order): the 2nd is answered with page 1
/// of a paged list (a listing opens), then the 1st (its start evicted) with the whole catalog
/// in one page. Not a start, and a listing is open, so its tools are merged into the other
/// listing's page: `catalog_presented` of 3 tools (one listed twice over) that no server ever
/// listed as one catalog.
#[test]
fn a_list_request_no_longer_kept_is_not_merged_into_another_listing() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let current = h.s.catalogs.history.current().unwrap().digest.clone();
    let before = h.s.approvals.gate.host_catalog().map(str::to_string);
    let mut ours = Vec::new();
    for i in 0..=LIST_REQUESTS_KEPT {
        host_raw(
            &mut h,
            json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/list", "params": {}}),
        );
        ours.push(next_to_child(&mut h)["id"].clone());
    }
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": ours[1],
               "result": {"tools": [tool("zzz_old", 1)], "nextCursor": "p2"}}),
    );
    let tools = h.tools.clone();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": ours[0], "result": {"tools": tools}}),
    );
    let shown = h.s.approvals.gate.host_catalog().map(str::to_string);
    assert!(
        shown == before || shown.as_deref() == Some(current.as_str()),
        "the host is recorded as holding a catalog nobody served: {:?}",
        h.audit_kinds(audit::CATALOG_PRESENTED).last()
    );
}

/// The server says `list_changed` while the supervisor's fetch of its first page is in flight,
/// then answers that page with an error (it was not ready when it read the request). The
/// error path publishes an empty catalog without looking at `changed_while_fetching`: the
/// change the server announced is never fetched (its tools stay "unknown" until it says
/// `list_changed` again), and the stale flag makes some later, unrelated fetch run twice.
#[test]
fn a_list_changed_before_a_first_page_error_is_fetched() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    from_child(&mut h, &epoch, list_changed());
    let page = next_to_child(&mut h);
    assert_eq!(page["method"], "tools/list");
    from_child(&mut h, &epoch, list_changed());
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page["id"],
               "error": {"code": -32603, "message": "not ready"}}),
    );
    let refetch = h
        .io()
        .to_child
        .iter()
        .any(|(_, m)| m["method"] == "tools/list");
    assert!(
        refetch,
        "the list_changed announced during the fetch was dropped; catalog now: {:?}",
        h.s.catalogs.history.catalog().map(|c| c.names().count())
    );
}

/// The server's answer to the supervisor's own `tools/list` page is not JSON (a Python server
/// writing `NaN` in a schema default; any stray byte). `on_child_garbage` answers only host
/// requests, and nothing else ends a `CatalogPage` (an oversized page does): the child stays in
/// `FetchingCatalog` for the rest of its epoch. Every host request from then on is held and
/// expires with "the server is starting", though the server is up and answering.
#[test]
fn a_garbled_catalog_page_does_not_leave_the_session_fetching() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    from_child(&mut h, &epoch, list_changed());
    let page = next_to_child(&mut h);
    h.handle(Event::ChildLine {
        epoch: epoch.clone(),
        line: format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"tools\":[{{\"name\":\"x\",\"inputSchema\":{{\"default\":NaN}}}}]}}}}",
            page["id"]
        )
        .into_bytes(),
    });
    h.serve();
    assert!(
        h.s.child_ready(),
        "the session is still fetching a page that will never be answered (phase {:?})",
        h.s.server.child().map(|c| c.phase.clone())
    );
}

/// Two paged listings, answered in order by an honest server whose tools change between them:
/// listing A gets page 1 (`list_items` v1, cursor `a2`), listing B then gets page 1
/// (`list_items` v2, cursor `b2`), then A's cursor request gets its last page (`write_item`
/// v1). A cursor request is not tied to the listing whose cursor it carries: A's last page
/// ends B's listing, and the session records (`catalog_presented`) and tells the gate that the
/// host holds {`list_items` v2, `write_item` v1}, a catalog no server listed (B's own last page
/// is then ignored).
#[test]
fn a_cursor_page_continues_only_the_listing_that_gave_its_cursor() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let digest = |tools: Vec<Value>| {
        crate::policy::catalog::Catalog::from_tools(tools)
            .unwrap()
            .digest()
            .to_string()
    };
    let served = [
        digest(vec![tool("list_items", 1), tool("write_item", 1)]),
        digest(vec![tool("list_items", 2), tool("write_item", 2)]),
    ];
    let page = |h: &mut Harness, id: i64, params: Value, result: Value| {
        host_raw(
            h,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}),
        );
        let req = next_to_child(h);
        from_child(
            h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": req["id"], "result": result}),
        );
    };
    page(
        &mut h,
        200,
        json!({}),
        json!({"tools": [tool("list_items", 1)], "nextCursor": "a2"}),
    );
    page(
        &mut h,
        300,
        json!({}),
        json!({"tools": [tool("list_items", 2)], "nextCursor": "b2"}),
    );
    page(
        &mut h,
        201,
        json!({"cursor": "a2"}),
        json!({"tools": [tool("write_item", 1)]}),
    );
    page(
        &mut h,
        301,
        json!({"cursor": "b2"}),
        json!({"tools": [tool("write_item", 2)]}),
    );
    for p in h.audit_kinds(audit::CATALOG_PRESENTED) {
        let d = p["digest"].as_str().unwrap_or_default().to_string();
        assert!(
            served.contains(&d),
            "recorded as shown a catalog no listing served: {p}"
        );
    }
}
