//! Fetching a server's list again, and what a fetch that fails or is slow leaves (red-team
//! rounds 21–22): a host shown a list other than the catalog, a list that differs each time, a
//! catalog cut at the page bound, a new server's first list past its deadline, a change
//! announced while a call waited. Each test failed on the code it was written against.

use serde_json::json;

use super::testing::*;
use super::*;

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
    from_child(&mut h, &epoch, list_changed());
    let refresh = next_to_child(&mut h);
    assert_eq!(refresh["method"], json!("tools/list"));
    // Never answered. The server's tools changed; the host lists them from the server itself.
    h.tools = vec![
        tool("list_items", 1),
        tool("write_item", 1),
        tool("delete_item", 1),
    ];
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
        h.s.catalog
            .catalog()
            .map(|c| c.names().map(str::to_string).collect::<Vec<_>>())
    );
}

/// A rebuild starts server `b`, which does not answer the supervisor's first `tools/list` within
/// the budget (a slow start): its tools are not known, and nothing is announced (no revision,
/// no `list_changed`); a call is refused as `identity_pending`, not as a tool the server no
/// longer has; once the host lists tools (answered by the server), the list is fetched and
/// calls go through. Round 22: the first list past its deadline was "treated as empty": every
/// tool announced removed.
#[test]
fn a_new_servers_first_list_past_its_deadline_announces_nothing() {
    let (mut h, old) = Harness::serving_legacy();
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 2);
    let notes_before = h.host_notes("notifications/tools/list_changed");
    h.s.handle(Event::BuildFinished(Box::new(complete("b"))));
    h.s.handle(Event::ChildStopped { epoch: old.clone() });
    let new = h.current_epoch().unwrap();
    assert_ne!(new, old);
    // Play the new server's handshake; its first tools/list is not answered.
    loop {
        let (e, msg) = h
            .io()
            .to_child
            .pop_front()
            .expect("a request to the server");
        if e != new {
            continue;
        }
        if msg["method"] == json!("tools/list") {
            break;
        }
        if let Some(id) = msg.get("id").cloned() {
            let result = json!({"protocolVersion": msg["params"]["protocolVersion"],
                                "capabilities": {"tools": {"listChanged": true}},
                                "serverInfo": {"name": "fake", "version": "1"}});
            from_child(
                &mut h,
                &e,
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
            );
        }
    }
    // The budget passes; a call comes right after.
    h.io().now_ms += budget_ms() + 1;
    h.s.handle(Event::Timer(Timer::ServerDeadline));
    let id = json!("late-call");
    host_raw(
        &mut h,
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "list_items", "arguments": {}}}),
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
    let revisions_before = h.s.catalog.current().unwrap().number;
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
    let revisions = h.s.catalog.current().unwrap().number - revisions_before;
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
    from_child(&mut h, &epoch, list_changed());
    let refresh = next_to_child(&mut h);
    assert_eq!(refresh["method"], json!("tools/list"));
    h.tools = vec![
        tool("list_items", 1),
        tool("write_item", 1),
        tool("delete_item", 1),
    ];
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
        h.s.catalog
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
    let pages = MAX_CATALOG_PAGES + 1;
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let mut supervisor_pages = 0;
    h.s.handle(Event::BuildFinished(Box::new(complete("a"))));
    serve_paged(&mut h, pages, &mut supervisor_pages);
    assert!(h.s.child_ready());
    let first_fetch = supervisor_pages;
    for round in 0..3 {
        host_lists_all(&mut h, pages, &mut supervisor_pages, round);
    }
    let lines = (h.io().status.iter())
        .filter(|l| l.contains("kept paging"))
        .count();
    assert!(
        supervisor_pages == first_fetch,
        "three host listings of an unchanged list made the supervisor fetch {} more pages \
         ({lines} 'kept paging' status lines, {} catalog_refreshed records)",
        supervisor_pages - first_fetch,
        h.audit_kinds(audit::CATALOG_REFRESHED).len()
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

/// A server that pages one tool at a time, one page past [`MAX_CATALOG_PAGES`].
fn serve_paged(h: &mut Harness, pages: usize, supervisor_pages: &mut usize) {
    while let Some((epoch, msg)) = h.io().to_child.pop_front() {
        if msg["method"] != json!("tools/list") {
            let Some(id) = msg.get("id").cloned() else {
                continue;
            };
            let result = if msg["method"] == json!("initialize") {
                json!({"protocolVersion": msg["params"]["protocolVersion"],
                       "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}})
            } else {
                json!({})
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
        if matches!(
            h.s.pending.get(&msg["id"].as_u64().unwrap_or(u64::MAX)),
            Some(Pending::CatalogPage { .. })
        ) {
            *supervisor_pages += 1;
        }
        let mut result = json!({"tools": [tool(&format!("t{at:04}"), 1)]});
        if at + 1 < pages {
            result["nextCursor"] = json!((at + 1).to_string());
        }
        from_child(
            h,
            &epoch,
            json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}),
        );
    }
}

/// The host lists every page of the server's list (the host side has no page bound).
fn host_lists_all(h: &mut Harness, pages: usize, supervisor_pages: &mut usize, round: usize) {
    let mut cursor: Option<String> = None;
    for n in 0..pages {
        let id = json!(format!("r{round}-p{n}"));
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        host_raw(
            h,
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}),
        );
        serve_paged(h, pages, supervisor_pages);
        let answer = h.answer(&id).expect("answered");
        cursor = answer["result"]["nextCursor"].as_str().map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
}
