//! Red-team round 10: the catalog room (paged `tools/list`, `list_changed`, what the host was
//! shown) against a hostile or merely unlucky server and host. Each test failed on the code as
//! found; its comment says what happened then.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A line from the server of `epoch`.
fn child(h: &mut Harness, epoch: &str, msg: Value) {
    h.s.handle(Event::ChildLine {
        epoch: epoch.to_string(),
        line: msg.to_string().into_bytes(),
    });
}

/// A line from the host, without the fake server answering anything.
fn host_raw(h: &mut Harness, msg: Value) {
    h.s.handle(Event::HostLine(msg.to_string().into_bytes()));
}

/// The next request the session sent to the server.
fn next_to_child(h: &mut Harness) -> Value {
    h.io()
        .to_child
        .pop_front()
        .expect("a request to the server")
        .1
}

fn list_changed() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
}

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
    child(&mut h, &epoch, list_changed());
    let page1 = next_to_child(&mut h);
    assert_eq!(page1["method"], json!("tools/list"));
    child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page1["id"],
               "result": {"tools": [tool("list_items", 2)], "nextCursor": "p2"}}),
    );
    let page2 = next_to_child(&mut h);
    assert_eq!(page2["params"]["cursor"], json!("p2"));
    // The server's tools change again before it answers page 2; it says so first.
    child(&mut h, &epoch, list_changed());
    child(
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
    let current = h.s.catalog.current().unwrap().digest.clone();
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
    child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": first["id"],
               "result": {"tools": [tool("zzz_old", 1)], "nextCursor": "p2"}}),
    );
    let tools = h.tools.clone();
    child(
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
    assert_eq!(h.s.gate.host_catalog(), Some(current.as_str()));
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
        child(
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
    child(&mut h, &epoch, list_changed());
    let req = next_to_child(&mut h);
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"tools\":[{{\"name\":\"a\",\"description\":{}}}]}}}}",
        req["id"],
        serde_json::to_string(&"\"".repeat(n + 1)).unwrap()
    );
    h.s.handle(Event::ChildLine {
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
    let before = h.s.catalog.current().unwrap().clone();
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    let notes = h.host_notes("notifications/tools/list_changed");
    child(&mut h, &epoch, list_changed());
    let page1 = next_to_child(&mut h);
    let tools = h.tools.clone();
    child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page1["id"],
               "result": {"tools": tools, "nextCursor": "p2"}}),
    );
    let page2 = next_to_child(&mut h);
    child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"],
               "error": {"code": -32602, "message": "cursor expired"}}),
    );
    let names: Vec<String> =
        h.s.catalog
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
    child(&mut h, &epoch, list_changed());
    let mut fetches = 0;
    while let Some((_, req)) = h.io().to_child.pop_front() {
        assert_eq!(req["method"], "tools/list", "{req}");
        assert!(
            req["params"].get("cursor").is_none(),
            "each fetch from its first page"
        );
        fetches += 1;
        assert!(fetches <= CATALOG_REFETCHES + 1, "fetching without end");
        child(&mut h, &epoch, list_changed());
        let tools = h.tools.clone();
        child(
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
}

/// At a server's first fetch, a later page's error leaves the pages fetched as its catalog
/// (there is no earlier one to keep), said in a status line: not an empty catalog.
#[test]
fn an_error_on_a_later_page_of_the_first_fetch_keeps_the_pages_fetched() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.s.handle(Event::BuildFinished(Box::new(complete("a"))));
    let epoch = h.current_epoch().unwrap();
    // The handshake, answered by the fake server; the first catalog page is ours to answer.
    loop {
        let (_, req) = h.io().to_child.pop_front().expect("the first catalog page");
        if req["method"] == "tools/list" {
            child(
                &mut h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": req["id"],
                       "result": {"tools": [tool("list_items", 1)], "nextCursor": "p2"}}),
            );
            break;
        }
        if req["method"] == "initialize" {
            let v = req["params"]["protocolVersion"].clone();
            child(
                &mut h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": req["id"], "result": {"protocolVersion": v,
                       "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}}}),
            );
        }
    }
    let page2 = next_to_child(&mut h);
    child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"],
               "error": {"code": -32602, "message": "cursor expired"}}),
    );
    let names: Vec<String> =
        h.s.catalog
            .catalog()
            .unwrap()
            .names()
            .map(str::to_string)
            .collect();
    assert_eq!(names, ["list_items"]);
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("failed on page 2") && l.contains("cursor expired")),
        "{:?}",
        h.io().status
    );
}
