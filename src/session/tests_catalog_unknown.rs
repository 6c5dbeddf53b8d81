//! A server whose tools are not known (its first list failed) and what makes them known; which
//! catalogs count as cut at the page bound; a fetch that tells the host nothing; the status
//! meanwhile (red-team rounds 23–24). Each test failed on the code it was written against.

use serde_json::{Value, json};

use super::testing::*;
use super::tests_listen::meta;
use super::*;

fn budget_ms() -> u64 {
    DEFAULT_FIRST_START_BUDGET.as_millis() as u64
}

/// A fake server listing `pages` (one page each, cursor = index of the next page) and
/// answering everything else as [`Harness::serve`] does. `fail_page`: a supervisor page at that
/// cursor is answered with an error once (an expired cursor), then served. `supervisor_pages`:
/// the pages the supervisor asked for.
pub(super) struct Paged {
    pub pages: Vec<Vec<Value>>,
    pub fail_page: Option<usize>,
    pub supervisor_pages: usize,
}

impl Paged {
    pub fn serve(&mut self, h: &mut Harness) {
        while let Some((epoch, msg)) = h.io().to_child.pop_front() {
            if Some(epoch.as_str()) != h.s.current_epoch() {
                continue;
            }
            h.server_saw
                .push(msg["method"].as_str().unwrap_or_default().to_string());
            if msg["method"] != json!("tools/list") {
                let Some(id) = msg.get("id").cloned() else {
                    continue;
                };
                let result = match msg["method"].as_str() {
                    Some("initialize") => {
                        json!({"protocolVersion": msg["params"]["protocolVersion"],
                        "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}})
                    }
                    Some("tools/call") => json!({"content": [{"type": "text", "text": "ran"}]}),
                    _ => json!({}),
                };
                from_child(
                    h,
                    &epoch,
                    json!({"jsonrpc": "2.0", "id": id, "result": result}),
                );
                continue;
            }
            let at: usize = msg["params"]["cursor"]
                .as_str()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let ours = matches!(
                h.s.open_requests()
                    .get(&msg["id"].as_u64().unwrap_or(u64::MAX)),
                Some(OpenRequest::CatalogPage)
            );
            self.supervisor_pages += usize::from(ours);
            if ours && self.fail_page == Some(at) {
                self.fail_page = None;
                from_child(
                    h,
                    &epoch,
                    json!({"jsonrpc": "2.0", "id": msg["id"],
                           "error": {"code": -32602, "message": "cursor expired"}}),
                );
                continue;
            }
            let mut result = json!({"tools": self.pages[at]});
            if at + 1 < self.pages.len() {
                result["nextCursor"] = json!((at + 1).to_string());
            }
            from_child(
                h,
                &epoch,
                json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}),
            );
        }
    }

    /// The host lists every page; returns the tools it was shown.
    pub fn host_lists(&mut self, h: &mut Harness, round: &str) -> Vec<String> {
        let mut cursor: Option<String> = None;
        let mut names = Vec::new();
        for n in 0..self.pages.len() + 1 {
            let id = json!(format!("{round}-{n}"));
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            host_raw(
                h,
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}),
            );
            self.serve(h);
            let answer = h.answer(&id).expect("answered");
            names.extend(Harness::names(&answer));
            cursor = answer["result"]["nextCursor"].as_str().map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        names
    }
}

/// A server whose list has two pages; the supervisor's second page fails once (an expired
/// cursor): the catalog holds page 1. The host then lists both pages from the server and is
/// shown `write_item`: its listing makes the supervisor fetch again, and the call goes through.
/// Round 23: every catalog short of the whole list counted as cut at the page bound, so the
/// call was refused as a tool the server does not have, for the rest of the epoch.
#[test]
fn a_catalog_short_of_a_failed_page_is_fetched_again_when_the_host_lists() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let mut server = Paged {
        supervisor_pages: 0,
        pages: vec![vec![tool("list_items", 1)], vec![tool("write_item", 1)]],
        fail_page: Some(1),
    };
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    server.serve(&mut h);
    assert!(h.s.child_ready());
    assert_eq!(
        h.s.catalogs.history.catalog().map(|c| c.len()),
        Some(1),
        "page 1 only"
    );
    let shown = server.host_lists(&mut h, "l1");
    server.serve(&mut h);
    assert_eq!(shown, vec!["list_items", "write_item"]);
    let c = h.call("write_item");
    server.serve(&mut h);
    let answer = h.answer(&c).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the server listed write_item to the host; the supervisor never fetched again after a \
         transient page error (catalog: {:?}): {answer}",
        h.s.catalogs
            .history
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>())
    );
}

/// A new server answers the supervisor's first `tools/list` with "method not found" (its tool
/// router registered a moment after `initialize`): no tools. The host then lists and the server
/// lists two tools: that listing makes the supervisor fetch again, and the call goes through.
/// Round 23: that catalog counted as cut, and no fetch was ever started.
#[test]
fn a_method_not_found_first_list_is_fetched_again_when_the_host_lists() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let (epoch, page) = h.start_until_first_list();
    from_child(
        &mut h,
        &epoch,
        json!({"jsonrpc": "2.0", "id": page["id"],
               "error": {"code": -32601, "message": "Method not found"}}),
    );
    assert!(h.s.child_ready());
    let l = h.request("tools/list", json!({}));
    let listed = h.answer(&l).expect("served by the server");
    assert_eq!(Harness::names(&listed).len(), 2, "{listed}");
    let c = h.call("list_items");
    let answer = h.answer(&c).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the host was just shown list_items by the server; the call is refused (catalog: {:?}, \
         server saw: {:?}): {answer}",
        h.s.catalogs
            .history
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>()),
        h.server_saw
    );
}

/// A rebuild starts server `b`, whose first `tools/list` is slow (past its deadline); from then
/// on it answers at once. The host listed once (before the rebuild) and never lists again; `b`
/// never says `list_changed`. The host's next call asks `b` for its list and is judged by it.
/// Round 23: every call was refused as `identity_pending` for as long as the session lasted.
#[test]
fn unknown_tools_become_known_for_a_host_that_listed_once() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    rebuild_with_unknown_tools(&mut h, &old);
    assert!(h.s.child_ready(), "b serves everything else");
    // A minute of calls, a few seconds apart; b answers whatever it is asked.
    let mut last = None;
    for _ in 0..20 {
        let c = h.call("list_items");
        h.advance(3_000);
        last = h.answer(&c);
        if last.as_ref().and_then(Harness::tool_error).is_none() {
            break;
        }
    }
    let last = last.expect("answered");
    assert_eq!(
        Harness::tool_error(&last),
        None,
        "a minute after b came up (it answers every request), calls are still refused; the \
         supervisor asked b for its list {} time(s): {last}",
        h.server_saw.iter().filter(|m| *m == "tools/list").count()
    );
}

/// A rebuild to `b` whose first `tools/list` is left unanswered past its deadline: the new
/// server's tools are unknown. Returns the new epoch.
fn rebuild_with_unknown_tools(h: &mut Harness, old: &str) -> String {
    let (new, _) = h.rebuild_until_first_list("b", old);
    h.advance(budget_ms() + 1);
    assert!(h.s.child_ready());
    assert_eq!(h.gate_phase(), approval::Phase::IdentityPending);
    new
}

/// Server `b`'s tools are unknown (its first list was slow). The host lists (`b` answers it,
/// three tools) and the supervisor fetches; the host lists again during that fetch: `b`, which
/// is up, answers it too, and the fetch brings `b`'s three tools. Round 23: the second listing
/// was held and answered from the catalog recorded from server `a`, and the fetch, started by a
/// host listing, told the host nothing: it never learned of `delete_item`.
#[test]
fn a_host_listing_while_tools_are_unknown_goes_to_the_server() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let new = rebuild_with_unknown_tools(&mut h, &old);
    h.tools = vec![
        tool("list_items", 1),
        tool("write_item", 1),
        tool("delete_item", 1),
    ];
    // The host lists; b answers the host, not (yet) the supervisor's fetch that follows.
    let fetch = host_lists_from(&mut h, &new, 3);
    let tools = h.tools.clone();
    let told_before = h.host_notes("notifications/tools/list_changed");
    // The host lists again; held while the fetch runs, then answered.
    let l2 = json!("l2");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": l2, "method": "tools/list", "params": {}}),
    );
    h.serve();
    let second = h.answer(&l2).expect("answered by b, which is up");
    let shown = Harness::names(&second);
    // b answers the fetch with its three tools.
    from_child(
        &mut h,
        &new,
        json!({"jsonrpc": "2.0", "id": fetch["id"], "result": {"tools": tools}}),
    );
    h.serve(); // the listing during the fetch asked for it again
    assert_eq!(h.s.catalogs.history.catalog().map(|c| c.len()), Some(3));
    let told = h.host_notes("notifications/tools/list_changed") - told_before;
    assert!(
        shown.len() == 3 || told > 0,
        "the host's last list showed {shown:?} (status: {:?}); the catalog is now b's three \
         tools; list_changed told: {told}",
        h.io().status.iter().rev().take(4).collect::<Vec<_>>()
    );
}

/// A rebuild starts server `b`, whose first list names a tool twice (overlapping pages): no
/// valid catalog, so its tools are not known and nothing is announced; the host re-lists, `b`
/// shows it both tools, and the call goes through. Round 23: an empty catalog was published
/// and the host told `list_changed` ("every tool removed").
#[test]
fn an_invalid_first_list_leaves_the_tools_unknown() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let told_before = h.host_notes("notifications/tools/list_changed");
    let (new, list) = h.rebuild_until_first_list("b", &old);
    let twice = json!([tool("list_items", 1), tool("list_items", 1)]);
    from_child(
        &mut h,
        &new,
        json!({"jsonrpc": "2.0", "id": list["id"], "result": {"tools": twice}}),
    );
    h.serve();
    let told = h.host_notes("notifications/tools/list_changed") - told_before;
    // The host re-lists (as told, or of its own accord); b lists both tools.
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let c = h.call("list_items");
    let answer = h.answer(&c).expect("answered");
    assert!(
        told == 0 && Harness::tool_error(&answer).is_none(),
        "b never said it has no tools: list_changed told {told} time(s); after the host listed \
         b's two tools, the call is answered {answer} (catalog: {:?})",
        h.s.catalogs
            .history
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>())
    );
}

/// Fires due timers up to `ms` from now without any server answering (requests to servers are
/// dropped).
fn advance_silent(h: &mut Harness, ms: u64) {
    let target = h.io().now_ms + ms;
    while let Some(timer) = h.io().take_due_timer(target) {
        h.io().to_child.clear();
        h.handle(Event::Timer(timer));
    }
    h.io().to_child.clear();
    h.io().now_ms = target;
}

/// One armed timer serves every server deadline: a server exits while its refresh's deadline
/// is the armed one; the next server never answers `initialize` and is still stopped at its own
/// deadline (round 23 checked it; it held).
#[test]
fn a_silent_handshake_after_an_old_servers_fetch_deadline_is_stopped() {
    let (mut h, a) = Harness::serving_legacy();
    from_child(&mut h, &a, list_changed());
    h.io().to_child.clear();
    advance_silent(&mut h, 1_000);
    h.handle(Event::ChildExited {
        epoch: a.clone(),
        exit: ExitInfo {
            code: Some(1),
            signal: None,
        },
    });
    advance_silent(&mut h, 1_000);
    let b = h.current_epoch().expect("restarted");
    assert_ne!(a, b);
    advance_silent(&mut h, 2 * budget_ms());
    assert!(
        h.io().stopped.contains(&b),
        "a server that never answered initialize still runs: {:?}",
        h.io().status
    );
}

/// Server `b`'s tools are unknown (its first list was slow): the status document gives no
/// catalog (nor tool names), rather than server `a`'s beside `b`'s epoch. Round 23.
#[test]
fn the_status_of_a_server_whose_tools_are_unknown_gives_no_catalog() {
    let (mut h, old) = Harness::serving_legacy();
    rebuild_with_unknown_tools(&mut h, &old);
    let st = h.s.status_json();
    assert_eq!(st["state"], json!("identity-pending"));
    assert!(
        st["catalog"].is_null() && st["catalogTools"].is_null(),
        "the status of a server whose tools are not known gives a catalog: {} {}",
        st["catalog"],
        st["catalogTools"]
    );
}

/// Server `b`'s tools are unknown. The host lists (b answers it) and the fetch that follows
/// fails; b then gains `delete_item` without `list_changed`, and a call later asks b for its
/// list: the catalog becomes b's three tools, and the host, which holds two, is told
/// `list_changed`. Round 24: the failed fetch's quiet flag carried over to the call's.
#[test]
fn a_call_started_fetch_after_a_failed_quiet_fetch_tells_the_host() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let new = rebuild_with_unknown_tools(&mut h, &old);
    // The host lists; b answers it. The quiet fetch the listing started fails.
    let fetch = host_lists_from(&mut h, &new, 2);
    from_child(
        &mut h,
        &new,
        json!({"jsonrpc": "2.0", "id": fetch["id"], "error": {"code": -32603, "message": "busy"}}),
    );
    assert!(h.s.child_ready());
    assert_eq!(h.gate_phase(), approval::Phase::IdentityPending);
    // b gains a tool, says nothing; later a call asks for its list.
    h.tools.push(tool("delete_item", 1));
    h.advance(20_000);
    let told_before = h.host_notes("notifications/tools/list_changed");
    let c = h.call("list_items");
    assert_eq!(Harness::tool_error(&h.answer(&c).unwrap()), None);
    assert_eq!(h.s.catalogs.history.catalog().map(|c| c.len()), Some(3));
    let told = h.host_notes("notifications/tools/list_changed") - told_before;
    assert!(
        told > 0,
        "the catalog is b's three tools, the host holds two (outdated: {}), yet it was never \
         told list_changed (the call-started fetch was quiet)",
        h.s.host_list_outdated()
    );
}

/// A whole list of exactly [`MAX_CATALOG_PAGES`] pages (the last without `nextCursor`) is not
/// cut: when the server adds a tool without `list_changed` and the host lists it, the
/// supervisor fetches again and the call goes through. Round 24: any fetch of that many pages
/// counted as cut, and the call was refused as "no longer exists".
#[test]
fn a_whole_list_of_exactly_the_page_bound_is_not_cut() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let mut server = Paged {
        supervisor_pages: 0,
        pages: (0..MAX_CATALOG_PAGES)
            .map(|i| vec![tool(&format!("t{i}"), 1)])
            .collect(),
        fail_page: None,
    };
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    server.serve(&mut h);
    assert!(h.s.child_ready());
    assert_eq!(
        h.s.catalogs.history.catalog().map(|c| c.len()),
        Some(MAX_CATALOG_PAGES)
    );
    assert!(
        h.s.recorded.catalog.is_some(),
        "a whole list: recorded as one"
    );
    server.pages[MAX_CATALOG_PAGES - 1].push(tool("new_tool", 1));
    let shown = server.host_lists(&mut h, "l");
    server.serve(&mut h);
    assert!(shown.iter().any(|n| n == "new_tool"));
    let c = json!("call-new");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": c, "method": "tools/call",
               "params": {"name": "new_tool", "arguments": {}}}),
    );
    server.serve(&mut h);
    let answer = h.answer(&c).expect("answered");
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "the server listed new_tool to the host; a whole {MAX_CATALOG_PAGES}-page catalog was \
         treated as cut at the page bound (its tools: {:?}) and never fetched again: {answer}",
        h.s.server.child().map(|c| c.phase.listed())
    );
}

/// A 2026-07-28 host's call whose text holds `"requestState"` (an argument of that name; or a
/// retry whose prompt a rebuild withdrew) to a server whose tools are unknown asks the server
/// for its list like any other call. Round 24: it skipped that and was refused every time.
#[test]
fn a_modern_call_with_a_request_state_argument_asks_for_unknown_tools() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let d = h.request("server/discover", json!({"_meta": meta()}));
    h.build(complete("a"));
    assert!(h.answer(&d).is_some());
    let l = h.request("tools/list", json!({"_meta": meta()}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let old = h.current_epoch().unwrap();
    let good = h.tools.clone();
    h.tools = vec![tool("list_items", 1), tool("list_items", 1)];
    h.build(complete("b"));
    h.handle(Event::ChildStopped { epoch: old });
    h.serve();
    h.tools = good;
    assert!(h.s.child_ready());
    assert_eq!(h.gate_phase(), approval::Phase::IdentityPending);
    h.advance(20_000);
    let lists_before = h.server_saw.iter().filter(|m| *m == "tools/list").count();
    let c = h.request(
        "tools/call",
        json!({"name": "list_items", "arguments": {"requestState": "draft"},
               "_meta": meta()}),
    );
    let answer = h.answer(&c).expect("answered");
    let lists = h.server_saw.iter().filter(|m| *m == "tools/list").count() - lists_before;
    assert_eq!(
        Harness::tool_error(&answer),
        None,
        "b is up and would list its tools; it was asked {lists} time(s): {answer}"
    );
}

/// A tool was approved for server `a`, which then gained `delete_item`; a rebuild starts `b`,
/// whose tools are unknown: `sinceLastApproval` gives no catalog change (a's is not b's).
/// Round 24: it stated a's change as what changed up to b.
#[test]
fn status_since_last_approval_gives_no_catalog_diff_while_tools_are_unknown() {
    let mut h = Harness::new(|_| {});
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    let a = h.current_epoch().unwrap();
    let r = h.control(json!({"op": "approve", "epoch": a, "tools": ["write_item"]}));
    assert_eq!(r["ok"], true, "{r}");
    h.tools.push(tool("delete_item", 1));
    from_child(&mut h, &a, list_changed());
    h.serve();
    assert_eq!(h.s.catalogs.history.catalog().map(|c| c.len()), Some(3));
    rebuild_with_unknown_tools(&mut h, &a);
    let st = h.s.status_json();
    assert!(st["catalog"].is_null());
    let since: &Value = &st["sinceLastApproval"];
    assert!(
        since["catalog"].is_null(),
        "b's tools are unknown, yet the status says what its catalog changed since the \
         approval: {since}"
    );
}

/// While a new server's first list is fetched, the status gives no catalog (server `a`'s is not
/// `b`'s). Round 24: round 23 hid it only once b's first list had failed.
#[test]
fn status_during_a_new_servers_first_list_gives_no_earlier_catalog() {
    let (mut h, old) = Harness::serving_legacy();
    let (new, _) = h.rebuild_until_first_list("b", &old);
    let st = h.s.status_json();
    assert_eq!(st["server"]["epoch"], json!(new));
    assert_eq!(st["state"], json!("identity-pending"));
    assert!(
        st["catalog"].is_null() && st["catalogTools"].is_null(),
        "b's tools are not fetched yet; the status gives a's catalog beside b's epoch: {} {}",
        st["catalog"],
        st["catalogTools"]
    );
}

/// The host lists; server `epoch` answers it with `h.tools` (`tools` of them), and the
/// supervisor's fetch that the listing starts is returned, not answered.
fn host_lists_from(h: &mut Harness, epoch: &str, tools: usize) -> Value {
    let l1 = json!("l1");
    host_raw(
        h,
        json!({"jsonrpc": "2.0", "id": l1, "method": "tools/list", "params": {}}),
    );
    let fwd = next_to_child(h);
    let listed = h.tools.clone();
    from_child(
        h,
        epoch,
        json!({"jsonrpc": "2.0", "id": fwd["id"], "result": {"tools": listed}}),
    );
    assert_eq!(Harness::names(&h.answer(&l1).unwrap()).len(), tools);
    let fetch = next_to_child(h);
    assert_eq!(
        fetch["method"],
        json!("tools/list"),
        "the fetch the listing started"
    );
    fetch
}
