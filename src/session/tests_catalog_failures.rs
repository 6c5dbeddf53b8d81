//! Red-team round 12: a failed refresh, a cancelled page, an invalid list (each test failed on the
//! code as found).

use serde_json::{Value, json};

use super::testing::*;
use super::*;

/// A served session whose server then says `list_changed`: the refresh's first page request.
fn refresh(h: &mut Harness) -> (String, Value) {
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    assert_eq!(h.s.catalog.current().unwrap().number, 1);
    from_child(h, &epoch, list_changed());
    let page = next_to_child(h);
    assert_eq!(page["method"], json!("tools/list"));
    (epoch, page)
}

/// Tools of the supervisor's current catalog.
fn current_tools(h: &Harness) -> usize {
    h.s.catalog.catalog().map(|c| c.len()).unwrap_or(0)
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
    h.s.handle(Event::ChildLine {
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
        h.s.child.as_ref().map(|c| c.phase.clone())
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
