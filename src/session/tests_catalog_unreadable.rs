//! Red-team round 13: cases found by `tests_catalog_props` (the catalog fetch under random
//! page answers). Each failed on the code as found; its comment says what happened then.

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// The next request named `method` the session sent to the server (earlier lines dropped).
fn next_request(h: &mut Harness, method: &str) -> Value {
    loop {
        let (_, m) = h
            .io()
            .to_child
            .pop_front()
            .expect("a request to the server");
        if m["method"] == json!(method) && m.get("id").is_some() {
            return m;
        }
    }
}

/// A host connected, a server up whose first `tools/list` page is the test's to answer.
fn first_fetch_pending() -> (Harness, String, Value) {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    let epoch = h.current_epoch().expect("a server");
    let init = next_request(&mut h, "initialize");
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": init["id"], "result": {"protocolVersion": "2025-06-18",
               "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}}}),
    );
    let page1 = next_request(&mut h, "tools/list");
    (h, epoch, page1)
}

/// The server lists its first page (one tool and a cursor), then answers page 2 with a result
/// that is no tool list (`"result": "no list"`). `on_catalog_page` completes the catalog with
/// an empty list, dropping the page fetched, and records that empty catalog as the whole list
/// this package's server gave (`recorded.catalog`, used for later first contacts): a catalog
/// no fetch returned. A later page's error is a failed page (the pages fetched, partial, not
/// recorded); an unreadable page is no better.
#[test]
fn an_unreadable_later_page_is_not_recorded_as_an_empty_catalog() {
    let (mut h, epoch, page1) = first_fetch_pending();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page1["id"],
               "result": {"tools": [tool("list_items", 1)], "nextCursor": "p2"}}),
    );
    let page2 = next_request(&mut h, "tools/list");
    assert_eq!(page2["params"]["cursor"], json!("p2"));
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page2["id"], "result": "no list"}),
    );
    assert_ne!(h.s.server.child().unwrap().phase.name(), "FetchingCatalog");
    let recorded = h.s.recorded.catalog.as_ref().map(|c| c.tools.clone());
    assert_eq!(
        recorded, None,
        "a fetch cut short by an unreadable page is recorded as the server's whole list"
    );
    assert!(
        h.s.catalogs
            .history
            .current()
            .is_some_and(|c| c.number == 1),
        "the page fetched still gates calls"
    );
}

/// The same in a refresh: a server with a catalog says `list_changed`, and answers the first
/// page of the new fetch with a result that is no tool list. An error here keeps the catalog
/// ("the catalog stays as it was"); this answer replaced it with an empty one (every tool
/// gone for the gate and the host told so) and recorded the empty catalog as what the package's
/// server lists.
#[test]
fn an_unreadable_page_in_a_refresh_keeps_the_catalog() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    let before = h.s.catalogs.history.current().unwrap().digest.clone();
    let recorded = h.s.recorded.catalog.clone();
    assert!(recorded.is_some());
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
    );
    let page = next_request(&mut h, "tools/list");
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page["id"], "result": "no list"}),
    );
    assert_eq!(h.s.server.child().unwrap().phase.name(), "Ready");
    assert_eq!(
        h.s.catalogs.history.current().unwrap().digest,
        before,
        "an unreadable refresh emptied the catalog"
    );
    assert_eq!(h.s.recorded.catalog, recorded);
}

/// The host pages through the server's `tools/list` (page 1 and a cursor); the server crashes
/// and the host asks for page 2 with that cursor; the next server is slow to answer its
/// handshake. The request waits, and when the wait runs
/// out it is answered from the recorded catalog: the whole catalog, as if it were page 2 (the
/// host appends it to page 1), and `catalog_presented` records that the host holds the
/// recorded catalog. A continuation page is not a listing: it must not be answered (nor
/// recorded) as the whole list.
#[test]
fn a_continuation_page_asked_in_a_restart_is_not_answered_with_the_whole_record() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    h.handle(Event::ChildExited {
        epoch,
        exit: crate::process::supervisor::ExitInfo {
            code: Some(1),
            signal: None,
        },
    });
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED).len();
    h.handle(Event::HostLine(
        json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list", "params": {"cursor": "p2"}})
            .to_string()
            .into_bytes(),
    ));
    // The server restarts but is slow to answer its handshake: the request waits it out.
    for _ in 0..10 {
        let io = h.io();
        io.now_ms += 10_000;
        let now = io.now_ms;
        let due: Vec<Timer> = io
            .timers
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, t)| *t)
            .collect();
        io.timers.retain(|(at, _)| *at > now);
        for t in due {
            h.handle(Event::Timer(t));
        }
    }
    let answer = h.answer(&json!(50)).expect("answered");
    let recorded = h.audit_kinds(audit::CATALOG_PRESENTED)[presented..].to_vec();
    assert!(
        answer.get("error").is_some() || recorded.is_empty(),
        "page 2 answered with the whole recorded catalog ({answer}) and recorded as presented: {recorded:?}"
    );
}
