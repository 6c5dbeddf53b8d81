//! The session core in memory: every ordering of host messages against child readiness that
//! real hosts produce (list before ready, call before list, list during a restart, discover
//! before the build ends), and property tests over random event sequences.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::control::ControlRequest;
use super::testing::*;
use super::*;

const V: &str = "2025-06-18";

// Declared here: `mod.rs` is at the 600-line bound `the_core_imports_no_io` keeps.
#[path = "tests_arguments.rs"]
mod arguments;

fn call_result_text(a: &Value) -> String {
    a["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Issue 33: no answer the host gets describes state no real server produced. A cold start
/// with nothing recorded: `initialize` waits for the server's own answer, and so do the list
/// and the call.
#[test]
fn cold_start_initialize_waits_for_the_servers_own_answer() {
    let mut h = Harness::ungated(|_| {});
    assert_eq!(
        h.connect_legacy(),
        None,
        "nothing recorded: not answered by us"
    );
    let list = h.request("tools/list", json!({}));
    let call = h.call("list_items");
    h.advance(10_000);
    assert_eq!(h.answer(&list), None, "held, never [] from nobody");
    assert_eq!(h.answer(&call), None, "held during the first start");
    h.build(complete("a"));
    let init = h.answer(&json!(0)).expect("the server's own answer");
    assert_eq!(init["result"]["serverInfo"]["name"], json!("fake"));
    assert_eq!(init["result"]["protocolVersion"], json!(V));
    assert_eq!(
        init["result"]["capabilities"]["tools"]["listChanged"],
        json!(true)
    );
    let list = h.answer(&list).expect("answered by the real server");
    assert_eq!(Harness::names(&list), ["list_items", "write_item"]);
    let epoch = h.current_epoch().unwrap();
    assert_eq!(
        call_result_text(&h.answer(&call).expect("call forwarded")),
        format!("ran in {epoch}")
    );
    assert_eq!(h.host_notes("notifications/tools/list_changed"), 0);
    let presented = h.audit_kinds(audit::CATALOG_PRESENTED);
    assert_eq!(presented.len(), 1);
    assert_eq!(presented[0]["source"], json!("server"));
    let called = h.audit_kinds(audit::TOOL_CALLED);
    assert_eq!(called.len(), 1);
}

/// The wait is bounded by the first-start budget: then an error that says the server is still
/// building and what to do (never a made-up answer).
#[test]
fn a_cold_initialize_past_the_budget_is_an_error_that_says_why() {
    let mut h = Harness::ungated(|_| {});
    let id = h.initialize(V);
    h.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64 - 1);
    assert_eq!(h.answer(&id), None, "within the budget: still waiting");
    h.advance(1);
    let a = h.answer(&id).expect("answered at the budget");
    assert_eq!(a["error"]["code"], json!(codes::SERVER_UNAVAILABLE), "{a}");
    assert_eq!(a["error"]["data"]["error"], json!("server_building"), "{a}");
    let message = a["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("still building") && message.contains("reconnect"),
        "{a}"
    );
}

#[test]
fn warm_start_passes_the_servers_own_handshake_through() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let id = h.initialize(V);
    assert_eq!(h.answer(&id), None, "warm: waits for the server");
    h.advance(300);
    h.build(complete("a"));
    let init = h.answer(&id).expect("the server's answer");
    assert_eq!(init["result"]["serverInfo"]["name"], json!("fake"));
    assert_eq!(
        init["result"]["capabilities"]["tools"]["listChanged"],
        json!(true)
    );
}

/// After the handshake wait, the host gets the answer a real server of this package gave to
/// the same version, said as such on stderr.
#[test]
fn the_handshake_wait_ends_with_the_recorded_answer_to_the_same_version() {
    let mut h = Harness::ungated(|c| {
        c.warm = true;
        c.recorded = recorded_handshake(V, "recorded");
    });
    let id = h.initialize(V);
    h.advance(DEFAULT_HANDSHAKE_WAIT.as_millis() as u64 - 1);
    assert_eq!(h.answer(&id), None, "the server's own answer first");
    h.advance(1);
    let init = h.answer(&id).expect("the recorded answer after the wait");
    assert_eq!(init["result"]["serverInfo"]["name"], json!("recorded"));
    assert_eq!(init["result"]["protocolVersion"], json!(V));
    assert_eq!(init["result"]["capabilities"]["logging"], json!({}));
    assert_eq!(
        init["result"]["capabilities"]["tools"]["listChanged"],
        json!(true)
    );
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("answer a server of this package gave before")),
        "{:?}",
        h.io().status
    );
}

/// A record for another version is never used: the host waits for the server's own answer.
#[test]
fn another_versions_record_is_never_used() {
    let mut h = Harness::ungated(|c| c.recorded = recorded_handshake("2025-06-18", "recorded"));
    let id = h.initialize("2025-11-25");
    h.advance(DEFAULT_HANDSHAKE_WAIT.as_millis() as u64 + 1_000);
    assert_eq!(h.answer(&id), None, "no record for 2025-11-25");
    h.build(complete("a"));
    let init = h.answer(&id).expect("the server's own answer");
    assert_eq!(init["result"]["serverInfo"]["name"], json!("fake"));
    assert_eq!(init["result"]["protocolVersion"], json!("2025-11-25"));
}

/// The server's own answers are recorded per requested version, with the identity that gave
/// them, and bounded.
#[test]
fn real_answers_are_recorded_per_requested_version() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let facts = h.io().facts.clone().expect("facts recorded");
    let rec = facts
        .handshakes
        .get(V)
        .expect("recorded for the host's version");
    assert_eq!(rec.result["serverInfo"]["name"], json!("fake"));
    assert!(
        rec.result["capabilities"]["tools"]
            .get("listChanged")
            .is_none(),
        "as the server said it"
    );
    assert_eq!(rec.identity_digest, record("a").identity_digest);
    assert_eq!(Some(rec.epoch.as_str()), h.s.current_epoch());
}

/// A recorded answer whose version the new build no longer speaks (its SDK changed): said
/// plainly, with both versions, and the connection closed (the host must reconnect).
#[test]
fn a_server_that_answers_another_version_than_the_record_closes_the_connection_with_both_named() {
    let mut h = Harness::ungated(|c| c.recorded = recorded_handshake(V, "recorded"));
    h.connect_legacy();
    h.advance(DEFAULT_HANDSHAKE_WAIT.as_millis() as u64);
    assert_eq!(
        h.answer(&json!(0)).unwrap()["result"]["protocolVersion"],
        json!(V)
    );
    h.server_version = Some("2025-03-26".into());
    h.build(complete("a"));
    assert!(h.io().host_closed);
    let line = h
        .io()
        .status
        .iter()
        .find(|l| l.starts_with("connection closed"))
        .cloned()
        .unwrap();
    assert!(
        line.contains("2025-06-18") && line.contains("2025-03-26"),
        "{line}"
    );
    assert_eq!(
        h.s.exit_code(),
        Some(crate::base::exit_codes::CONNECTION_CLOSED)
    );
}

/// A server that answers another version than the host asked for, with nothing recorded: its
/// own answer reaches the host (the host decides), and nothing is closed by us.
#[test]
fn the_servers_own_other_version_reaches_the_host() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.server_version = Some("2025-03-26".into());
    h.build(complete("a"));
    assert!(!h.io().host_closed);
    let init = h.answer(&json!(0)).unwrap();
    assert_eq!(init["result"]["protocolVersion"], json!("2025-03-26"));
}

#[test]
fn budget_out_with_a_recorded_catalog_then_per_tool_staleness() {
    let recorded = RecordedCatalog {
        tools: vec![tool("list_items", 1), tool("write_item", 1)],
        digest: "sha256:old".into(),
        epoch: "OLDEPOCH".into(),
        identity_digest: "sha256:oldid".into(),
        recorded_at: "t".into(),
    };
    let mut h = Harness::ungated(|c| c.recorded.catalog = Some(recorded));
    h.connect_legacy();
    let list = h.request("tools/list", json!({}));
    h.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64);
    let shown = h.answer(&list).expect("recorded catalog after the budget");
    assert_eq!(Harness::names(&shown), ["list_items", "write_item"]);
    let p = h.audit_kinds(audit::CATALOG_PRESENTED);
    assert_eq!(p[0]["source"], json!("recorded catalog"));
    assert_eq!(p[0]["recordedEpoch"], json!("OLDEPOCH"));
    // The real server changed write_item only.
    h.tools = vec![tool("list_items", 1), tool("write_item", 2)];
    h.build(complete("a"));
    assert_eq!(h.host_notes("notifications/tools/list_changed"), 1);
    let ok = h.call("list_items");
    assert!(
        Harness::tool_error(&h.answer(&ok).unwrap()).is_none(),
        "unchanged tool goes through"
    );
    let stale = h.call("write_item");
    let a = h.answer(&stale).unwrap();
    assert_eq!(Harness::tool_error(&a).as_deref(), Some("catalog_stale"));
    let payload = &a["result"]["_meta"]["dev.cargo-mcp-dev/error"];
    assert_eq!(
        payload["currentDefinition"]["description"],
        json!("write_item v2")
    );
    assert!(
        !payload["changes"].as_array().unwrap().is_empty(),
        "{payload}"
    );
    assert!(
        a["result"]["content"][1]["text"]
            .as_str()
            .unwrap()
            .contains("write_item v2")
    );
    // The refusal presented the new definition: the retry runs.
    let retry = h.call("write_item");
    assert!(Harness::tool_error(&h.answer(&retry).unwrap()).is_none());
    let p = h.audit_kinds(audit::CATALOG_PRESENTED);
    assert_eq!(p.last().unwrap()["source"], json!("stale-call result"));
    let notices = h
        .io()
        .status
        .iter()
        .filter(|l| l.contains("has not refetched"))
        .count();
    assert_eq!(notices, 1);
}

#[test]
fn budget_out_without_a_record_is_an_error_never_an_empty_list() {
    let mut h = Harness::ungated(|c| c.first_start_budget = std::time::Duration::from_secs(3));
    h.connect_legacy();
    let list = h.request("tools/list", json!({}));
    h.advance(3000);
    let a = h.answer(&list).unwrap();
    assert_eq!(a["error"]["data"]["error"], json!("server_building"));
    assert_eq!(a["error"]["data"]["source"], json!("cargo-mcp-dev"));
    h.build(complete("a"));
    assert_eq!(
        h.host_notes("notifications/tools/list_changed"),
        1,
        "told once it exists"
    );
}

#[test]
fn a_broken_first_build_answers_with_the_compiler_error_and_recovers() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let list = h.request("tools/list", json!({}));
    let call = h.call("list_items");
    h.build(failed(None));
    let a = h.answer(&list).unwrap();
    assert_eq!(a["error"]["data"]["error"], json!("build_failed"));
    let msg = a["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("src/main.rs:12:5") && msg.contains("E0425"),
        "{msg}"
    );
    let c = h.answer(&call).unwrap();
    assert_eq!(Harness::tool_error(&c).as_deref(), Some("build_failed"));
    assert!(matches!(h.s.lifecycle(), Lifecycle::BuildBroken { .. }));
    // New requests are answered the same way, at once.
    let again = h.request("tools/list", json!({}));
    assert!(h.answer(&again).is_some());
    h.build(complete("a"));
    assert_eq!(*h.s.lifecycle(), Lifecycle::Serving);
    assert_eq!(h.host_notes("notifications/tools/list_changed"), 1);
}

#[test]
fn fallback_last_good_runs_the_stored_build_and_says_so() {
    let mut h = Harness::ungated(|c| c.fallback = Fallback::LastGood);
    h.connect_legacy();
    let list = h.request("tools/list", json!({}));
    h.build(failed(Some("old")));
    assert_eq!(Harness::names(&h.answer(&list).unwrap()).len(), 2);
    let launch = h.io().launches.last().cloned().unwrap();
    assert!(launch.fallback.unwrap().contains("last-good"));
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("--fallback last-good"))
    );
}

#[test]
fn discover_before_the_build_ends_falls_back_to_initialize() {
    let mut h = Harness::ungated(|_| {});
    let meta = json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}});
    let d = h.request("server/discover", meta);
    assert_eq!(h.answer(&d), None);
    // Within a second (issue 33: Claude Code gives up on its probe after about 3 s, and a
    // late answer to it drops the connection).
    h.advance(DEFAULT_DISCOVER_WAIT.as_millis() as u64);
    let a = h.answer(&d).unwrap();
    assert_eq!(a["error"]["code"], json!(-32601));
    // The client falls back: a legacy session works end to end, with the server's own answer.
    let init = h.initialize(V);
    assert_eq!(h.answer(&init), None, "waits for the server");
    let list = h.request("tools/list", json!({}));
    h.build(complete("a"));
    assert_eq!(
        h.answer(&init).expect("the server's answer")["result"]["serverInfo"]["name"],
        json!("fake")
    );
    h.initialized();
    assert_eq!(Harness::names(&h.answer(&list).unwrap()).len(), 2);
}

/// Issue 33, flow 1 (Claude Code 2.1.337 on a slow rebuild at start): the probe at 0 s, the
/// fallback `initialize` + `initialized` + `tools/list` at 3 s, the build done at 15 s. The
/// new server is initialized with the host's params, and every request gets its real answer.
#[test]
fn a_probe_then_a_late_fallback_during_a_slow_build_still_initializes_the_server() {
    let mut h = Harness::ungated(|c| {
        c.warm = true;
        c.recorded = recorded_handshake(V, "recorded");
    });
    let meta = json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}});
    let d = h.request("server/discover", meta);
    h.advance(3_000);
    assert_eq!(h.answer(&d).unwrap()["error"]["code"], json!(-32601));
    let init = h.initialize(V);
    h.advance(DEFAULT_HANDSHAKE_WAIT.as_millis() as u64);
    let a = h
        .answer(&init)
        .expect("the recorded answer to the same version");
    assert_eq!(a["result"]["serverInfo"]["name"], json!("recorded"));
    h.initialized();
    let list = h.request("tools/list", json!({}));
    h.advance(7_000);
    h.build(complete("b"));
    assert_eq!(
        h.server_saw.first().map(String::as_str),
        Some("initialize"),
        "the new server is initialized: {:?}",
        h.server_saw
    );
    let list = h.answer(&list).expect("the new server's list");
    assert_eq!(Harness::names(&list).len(), 2);
    assert!(
        h.audit_kinds(audit::CATALOG_PRESENTED)
            .iter()
            .all(|p| p["source"] == json!("server")),
        "never the record once a server of this session is up"
    );
    let call = h.call("list_items");
    let epoch = h.current_epoch().unwrap();
    assert_eq!(
        call_result_text(&h.answer(&call).unwrap()),
        format!("ran in {epoch}")
    );
}

#[test]
fn warm_discover_gets_the_servers_answer() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let meta = json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}});
    let d = h.request("server/discover", meta.clone());
    h.advance(200);
    h.build(complete("a"));
    let a = h.answer(&d).unwrap();
    assert_eq!(a["result"]["serverInfo"]["name"], json!("fake"));
    let list = h.request("tools/list", meta);
    assert_eq!(Harness::names(&h.answer(&list).unwrap()).len(), 2);
}

#[test]
fn list_and_call_during_a_restart_wait_for_the_new_server() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let old = h.current_epoch().unwrap();
    h.build(complete("b"));
    assert!(h.current_epoch().is_none(), "old server stopping");
    // Only `-v` says why the server is replaced; the default lines stay quiet about it.
    assert!(
        h.io()
            .verbose
            .iter()
            .any(|l| l.starts_with("replacing server (")),
        "{:?}",
        h.io().verbose
    );
    assert!(
        !h.io()
            .status
            .iter()
            .any(|l| l.starts_with("replacing server"))
    );
    let list = h.request("tools/list", json!({}));
    let call = h.call("list_items");
    assert!(h.answer(&call).is_none(), "held for the new epoch");
    h.handle(Event::ChildStopped { epoch: old.clone() });
    h.serve();
    let new = h.current_epoch().unwrap();
    assert_ne!(new, old);
    assert!(h.answer(&list).is_some());
    assert_eq!(
        call_result_text(&h.answer(&call).unwrap()),
        format!("ran in {new}")
    );
}

#[test]
fn in_flight_calls_are_answered_once_and_never_replayed() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    h.answer_calls = false;
    let call = h.call("write_item");
    let old = h.current_epoch().unwrap();
    h.build(complete("b"));
    let a = h.answer(&call).unwrap();
    assert_eq!(Harness::tool_error(&a).as_deref(), Some("epoch_transition"));
    h.answer_calls = true;
    h.handle(Event::ChildStopped { epoch: old });
    h.serve();
    let forwarded_calls = h
        .io()
        .audit
        .iter()
        .filter(|(k, _, _)| k == audit::TOOL_CALLED)
        .count();
    assert_eq!(forwarded_calls, 1, "not replayed to the new server");
}

#[test]
fn a_tools_call_without_an_id_never_reaches_the_server() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    h.io().to_child.clear();
    h.host(json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "write_item"}}));
    assert!(h.io().to_child.is_empty());
    assert!(h.io().status.iter().any(|l| l.contains("without an id")));
}

#[test]
fn a_server_side_cancel_still_answers_the_hosts_call() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    h.answer_calls = false;
    let call = h.call("write_item");
    let epoch = h.current_epoch().unwrap();
    // Our id for the call is the newest pending one.
    let ours = *h.s.open_requests().keys().max().unwrap();
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ours}});
    h.handle(Event::ChildLine {
        epoch,
        line: cancel.to_string().into_bytes(),
    });
    let a = h.answer(&call).expect("exactly one answer");
    assert_eq!(
        Harness::tool_error(&a).as_deref(),
        Some("cancelled_by_server")
    );
}

#[test]
fn a_server_that_pages_forever_is_cut_off() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    h.handle(Event::ChildLine {
        epoch: epoch.clone(),
        line: br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#.to_vec(),
    });
    for _ in 0..MAX_CATALOG_PAGES + 5 {
        let Some((_, msg)) = h.io().to_child.pop_front() else {
            break;
        };
        let page = json!({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": [tool("t", 1)], "nextCursor": "more"}});
        h.handle(Event::ChildLine {
            epoch: epoch.clone(),
            line: page.to_string().into_bytes(),
        });
    }
    assert!(h.io().to_child.is_empty(), "stopped asking");
    assert!(h.io().status.iter().any(|l| l.contains("kept paging")));
}

#[test]
fn server_exit_is_recorded_with_its_status() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: Some(3),
            signal: None,
        },
    });
    let exited = h.audit_kinds(audit::SERVER_EXITED);
    let r = crate::audit::records::ServerExited::from_data(&exited[0]).unwrap();
    assert_eq!((r.status.as_str(), r.code), ("exit code 3", Some(3)));
}

/// `cargo clean` takes the stored copy of the running server with the target directory: when
/// the server exits, starting it again fails (its copy is missing) and used to leave the
/// session refusing calls as "starting" for good. Now the session builds again, once per
/// identity, and starts what that build captured; a copy that cannot start after its rebuild
/// is reported, not rebuilt in a loop.
#[test]
fn a_server_that_cannot_start_from_its_stored_copy_is_built_again_once() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let builds = h.io().builds_started;
    let epoch = h.current_epoch().unwrap();
    h.io().spawn_error = Some("executable `store/sha256-a` is missing".into());
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: None,
            signal: Some(9),
        },
    });
    h.advance(10_000);
    let io = h.io();
    assert_eq!(io.builds_started, builds + 1, "{:?}", io.status);
    assert!(io.status.iter().any(|l| l.contains("building again")));
    // The rebuilt copy cannot start either: reported, no further build, and calls are
    // answered with why (not held for a start that is not coming).
    h.build(complete("a"));
    h.advance(10_000);
    let io = h.io();
    assert_eq!(io.builds_started, builds + 1, "{:?}", io.status);
    assert!(h.current_epoch().is_none());
    assert!(matches!(h.s.lifecycle(), Lifecycle::StartFailed { .. }));
    let id = h.call("list_items");
    let refused = h.answer(&id).expect("answered at once, not held");
    assert_eq!(
        Harness::tool_error(&refused).as_deref(),
        Some("server_unavailable"),
        "{refused}"
    );
    assert!(refused.to_string().contains("is missing"), "{refused}");
    // Fixed (the next change builds a copy that starts): served again.
    h.io().spawn_error = None;
    save(&mut h);
    h.build(complete("b"));
    assert!(h.current_epoch().is_some(), "{:?}", h.io().status);
    assert_eq!(h.s.lifecycle(), &Lifecycle::Serving);
    let id = h.call("list_items");
    let answer = h.answer(&id).expect("answered by the server");
    assert!(answer.get("result").is_some(), "{answer}");
    assert_eq!(Harness::tool_error(&answer), None, "{answer}");
}

#[test]
fn a_build_that_never_starts_is_not_rebuilt_in_a_loop() {
    // Each build has a new identity (a build script that stamps the time) and none starts:
    // one rebuild for the failed start, then none for a minute.
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    h.io().spawn_error = Some("exec failed: Permission denied".into());
    let builds = h.io().builds_started;
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: None,
            signal: Some(9),
        },
    });
    h.advance(1_000);
    assert_eq!(h.io().builds_started, builds + 1);
    for i in 0..20 {
        h.build(complete(&format!("v{i}")));
        h.advance(1_000);
    }
    let io = h.io();
    assert_eq!(io.builds_started, builds + 1, "{:?}", io.status);
    assert!(matches!(h.s.lifecycle(), Lifecycle::StartFailed { .. }));
    // A minute after the last one, a new identity that fails to start is rebuilt once more.
    h.advance(60_000);
    h.build(complete("later"));
    h.advance(1_000);
    let io = h.io();
    assert_eq!(io.builds_started, builds + 2, "{:?}", io.status);
}

/// The developer saves `src/main.rs` (the quiet period over).
fn save(h: &mut Harness) {
    h.handle(Event::SourcesChanged {
        paths: vec!["src/main.rs".into()],
        changed_after_leading_edge: false,
    });
}

/// The running server exits `CRASH_LIMIT` times, each restart due: the session is in its
/// crash loop.
fn crash_until_the_loop(h: &mut Harness) {
    for _ in 0..CRASH_LIMIT {
        let epoch = h.current_epoch().expect("restarted");
        exit_child(h, epoch);
        h.advance(5_000);
    }
}

/// Serving, then the server exits and its stored copy cannot start: a rebuild is on its way.
fn exited_and_rebuilding(h: &mut Harness) {
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    h.io().spawn_error = Some("executable `store/sha256-a` is missing".into());
    let builds = h.io().builds_started;
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: None,
            signal: Some(9),
        },
    });
    h.advance(10_000);
    let io = h.io();
    assert_eq!(io.builds_started, builds + 1, "{:?}", io.status);
    assert!(h.current_epoch().is_none());
}

/// No answer to the host (so far) blames a restart mode this session is not in.
fn assert_no_manual_mode_blame(h: &mut Harness) {
    let blamed: Vec<_> = h
        .io()
        .to_host
        .iter()
        .filter(|m| m.to_string().contains("restart mode manual"))
        .cloned()
        .collect();
    assert!(blamed.is_empty(), "{blamed:?}");
}

#[test]
fn requests_during_the_rebuild_for_a_failed_start_wait_for_it() {
    // Red-team, session 21: in this window (no server, a build on its way) requests were
    // refused at once as "no MCP server is running (restart mode manual …)".
    let mut h = Harness::ungated(|_| {});
    exited_and_rebuilding(&mut h);
    let list = h.request("tools/list", json!({}));
    let other = h.request("resources/list", json!({}));
    h.advance(5_000);
    assert_eq!(
        h.answer(&list),
        None,
        "held while the server is built again"
    );
    assert_eq!(h.answer(&other), None);
    let status = h.control(json!({"op": "status"}));
    assert_eq!(status["result"]["server"], Value::Null, "{status}");
    // Past the budget (as at first start): the answer says what is going on, and the list
    // gets the catalog a real server of this package returned.
    h.advance(25_000);
    let other = h.answer(&other).expect("answered at its deadline");
    assert!(other.to_string().contains("still building"), "{other}");
    let list = h.answer(&list).expect("answered at its deadline");
    assert_eq!(Harness::names(&list), ["list_items", "write_item"]);
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("still building: tools/list answered with the catalog recorded")),
        "{:?}",
        h.io().status
    );
    h.io().spawn_error = None;
    h.build(complete("a"));
    let call = h.call("list_items");
    let epoch = h.current_epoch().expect("served again");
    assert_eq!(
        call_result_text(&h.answer(&call).expect("forwarded")),
        format!("ran in {epoch}")
    );
    assert_no_manual_mode_blame(&mut h);
}

#[test]
fn a_refusal_during_the_rebuild_for_a_failed_start_says_why() {
    let mut h = Harness::ungated(|_| {});
    exited_and_rebuilding(&mut h);
    let discover = h.request("server/discover", json!({}));
    h.advance(30_000);
    let discover = h.answer(&discover).expect("answered at its deadline");
    let text = discover.to_string();
    assert!(text.contains("being built again"), "{text}");
    assert_no_manual_mode_blame(&mut h);
}

#[test]
fn a_held_list_at_first_start_survives_the_rebuild_for_a_failed_start() {
    // Red-team, session 21: the first build's copy could not start; the rebuild branch
    // answered every held request at once with the manual-mode reason.
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let list = h.request("tools/list", json!({}));
    h.io().spawn_error = Some("executable `store/sha256-a` is missing".into());
    let builds = h.io().builds_started;
    h.build(complete("a"));
    let io = h.io();
    assert_eq!(io.builds_started, builds + 1, "{:?}", io.status);
    assert_eq!(h.answer(&list), None, "still held: a server is on its way");
    h.io().spawn_error = None;
    h.build(complete("a"));
    let list = h.answer(&list).expect("answered by the real server");
    assert_eq!(Harness::names(&list), ["list_items", "write_item"]);
    assert_no_manual_mode_blame(&mut h);
}

#[test]
fn restart_says_what_happened_when_the_server_cannot_start() {
    // Red-team, session 21: `cargo mcp-dev restart` answered `started` though the spawn failed.
    let mut h = Harness::ungated(|_| {});
    exited_and_rebuilding(&mut h);
    h.build(complete("a"));
    assert!(matches!(h.s.lifecycle(), Lifecycle::StartFailed { .. }));
    // Asked for by the human: the copy is built once more, and the answer says so.
    let builds = h.io().builds_started;
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(answer["result"], json!({"building": true}), "{answer}");
    assert_eq!(h.io().builds_started, builds + 1);
    h.build(complete("a"));
    assert!(matches!(h.s.lifecycle(), Lifecycle::StartFailed { .. }));
    // With a build already running (a save), the start fails and that build will start the
    // server: the answer says so, and requests wait for it.
    save(&mut h);
    let builds = h.io().builds_started;
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(answer["result"], json!({"building": true}), "{answer}");
    assert_eq!(h.io().builds_started, builds, "no second build");
    assert_eq!(
        h.s.build.runs,
        Builds::Running,
        "the build under way is enough: no follow-up"
    );
    let list = h.request("tools/list", json!({}));
    assert_eq!(h.answer(&list), None, "held for the build under way");
    // The build starts a copy that runs.
    h.io().spawn_error = None;
    h.build(complete("b"));
    assert!(h.current_epoch().is_some());
    let list = h.answer(&list).expect("answered by the real server");
    assert_eq!(Harness::names(&list), ["list_items", "write_item"]);
    // Running: restart replaces it.
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(answer["result"], json!({"restarting": true}), "{answer}");
}

#[test]
fn the_core_imports_no_io() {
    // Mechanical check of the module contract (see mod.rs).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/session");
    let forbidden = [
        "std::fs",
        "std::process",
        "std::os",
        "std::net",
        "SystemTime",
        "console::",
        "indicatif",
        // The stderr writer (its status events, `crate::screen::status_lines`, are plain data).
        "crate::screen::stderr::",
        "crate::screen::stderr;",
        "crate::screen::stderr,",
        "Instant",
    ];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "tests.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect();
        for f in forbidden {
            assert!(!code.iter().any(|l| l.contains(f)), "{name} uses {f}");
        }
    }
}

// ----- property tests --------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Init,
    List,
    Call(bool),
    IdlessCall,
    BuildOk(u8),
    BuildFail,
    ChildExit,
    Stopped,
    Advance(u16),
    ServerChangesTools,
    CallsStall(bool),
    /// A human approves `write_item` for the current (or a stale) epoch.
    Approve(bool),
    /// The host answers the n-th approval prompt it was sent (open, answered or expired).
    AnswerPrompt {
        nth: u8,
        answer: u8,
    },
    /// The host sends an answer to a prompt id it was never sent.
    ForgedAnswer {
        kind: u8,
        answer: u8,
    },
}

/// The host's possible answers to a prompt (well-formed or not).
fn prompt_answer(n: u8) -> Value {
    match n % 8 {
        0 => json!({"action": "accept", "content": {"decision": "once"}}),
        1 => json!({"action": "accept", "content": {"decision": "tool"}}),
        2 => json!({"action": "accept", "content": {"decision": "requested"}}),
        3 => json!({"action": "accept", "content": {"decision": "deny"}}),
        4 => json!({"action": "decline"}),
        5 => json!({"action": "cancel"}),
        6 => json!({"action": "accept", "content": {"decision": "tool", "epoch": "forged"}}),
        _ => json!({"action": "accept", "content": {"decision": "always"}}),
    }
}

fn grants_something(answer: u8) -> bool {
    answer % 8 <= 2
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Init),
        Just(Step::List),
        any::<bool>().prop_map(Step::Call),
        Just(Step::IdlessCall),
        (0u8..3).prop_map(Step::BuildOk),
        Just(Step::BuildFail),
        Just(Step::ChildExit),
        Just(Step::Stopped),
        (0u16..30_000).prop_map(Step::Advance),
        Just(Step::ServerChangesTools),
        any::<bool>().prop_map(Step::CallsStall),
        any::<bool>().prop_map(Step::Approve),
        (0u8..6, 0u8..8).prop_map(|(nth, answer)| Step::AnswerPrompt { nth, answer }),
        (0u8..4, 0u8..8).prop_map(|(kind, answer)| Step::ForgedAnswer { kind, answer }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Invariants of the article over random event sequences: every host request is answered
    /// exactly once by the end; no `tools/call` reaches a server without a `tool_called` record
    /// for the current epoch written before it; no call is sent twice; the host never receives
    /// a tool list no server returned.
    ///
    /// And the agent cannot grant: over random host messages, including forged, replayed and
    /// malformed answers to approval prompts, a grant comes only from the control socket or
    /// from the first well-formed accepting answer to a prompt that is open, for the epoch the
    /// prompt was for, before its deadline.
    #[test]
    fn session_invariants(steps in prop::collection::vec(step(), 1..40), gated in any::<bool>(), elicit in any::<bool>()) {
        let policy = if gated { approval::Policy::default() } else {
            approval::Policy { gating: approval::Gating::Off, ..approval::Policy::default() }
        };
        let mut h = Harness::with_policy(|c| c.approval_timeout = std::time::Duration::from_secs(20), policy);
        let mut requests = Vec::new();
        let mut forwarded_calls = 0usize;
        let mut version = 1;
        // Every prompt the host was sent: id, the epoch then, when it was sent; and the ids the
        // host already answered.
        let mut sent_prompts: Vec<(Value, Option<String>, u64)> = Vec::new();
        let mut answered: std::collections::BTreeSet<String> = Default::default();
        let mut grants_seen = 0usize;
        for step in steps {
            let before = h.io().to_child.len();
            // What this step may legitimately grant through the host: (prompt id, its epoch).
            let mut host_may_grant: Option<(String, Option<String>)> = None;
            let mut terminal_may_grant = false;
            match step {
                Step::Init if elicit => {
                    requests.push(h.request("initialize", json!({"protocolVersion": V,
                        "capabilities": {"elicitation": {}}, "clientInfo": {"name": "test", "version": "1"}})));
                    h.initialized();
                }
                Step::Init => { requests.push(h.initialize(V)); h.initialized(); }
                Step::AnswerPrompt { nth, answer } => {
                    if let Some((id, epoch, sent_at)) = sent_prompts.get(nth as usize).cloned() {
                        let key = id.to_string();
                        let fresh = answered.insert(key.clone());
                        let in_time = h.io().now_ms < sent_at + 20_000;
                        if fresh && in_time && grants_something(answer) && epoch.is_some() && epoch == h.current_epoch() {
                            host_may_grant = Some((key, epoch));
                        }
                        h.host(json!({"jsonrpc": "2.0", "id": id, "result": prompt_answer(answer)}));
                    }
                }
                Step::ForgedAnswer { kind, answer } => {
                    let id = match kind {
                        0 => json!(format!("{}{}", approvals::PROMPT_ID_PREFIX, "ID0001")),
                        1 => json!(1),
                        2 => json!(format!("{}forged", approvals::PROMPT_ID_PREFIX)),
                        _ => json!("elicitation"),
                    };
                    h.host(json!({"jsonrpc": "2.0", "id": id, "result": prompt_answer(answer)}));
                }
                Step::List => requests.push(h.request("tools/list", json!({}))),
                Step::Call(write) => requests.push(h.call(if write { "write_item" } else { "list_items" })),
                Step::IdlessCall => h.host(json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "write_item"}})),
                Step::BuildOk(n) => h.build(complete(&format!("e{n}"))),
                Step::BuildFail => h.build(failed(None)),
                Step::ChildExit => if let Some(epoch) = h.current_epoch() {
                    h.handle(Event::ChildExited { epoch, exit: ExitInfo { code: Some(1), signal: None } });
                    h.serve();
                },
                Step::Stopped => {
                    let stopped = h.io().stopped.last().cloned();
                    if let Some(epoch) = stopped { h.handle(Event::ChildStopped { epoch }); h.serve(); }
                }
                Step::Advance(ms) => h.advance(ms as u64),
                Step::ServerChangesTools => { version += 1; h.tools = vec![tool("list_items", 1), tool("write_item", version)]; }
                Step::CallsStall(stall) => h.answer_calls = !stall,
                Step::Approve(current) => {
                    let epoch = if current { h.current_epoch() } else { h.io().spawned.first().map(|(e, _)| e.clone()) };
                    terminal_may_grant = true;
                    if let Some(epoch) = epoch {
                        let (tx, _rx) = crossbeam_channel::bounded(1);
                        h.control_call(json!({"op": "approve", "epoch": epoch, "tools": ["write_item", "list_items"]}), tx.into());
                        h.serve();
                    }
                }
            }
            let _ = before;
            // Prompts sent during this step.
            let now = h.io().now_ms;
            let epoch_now = h.current_epoch();
            let ids: Vec<Value> = h.io().to_host.iter().filter(|m| m["method"] == "elicitation/create").map(|m| m["id"].clone()).collect();
            for id in ids.into_iter().skip(sent_prompts.len()) {
                prop_assert!(elicit, "a prompt to a host that cannot elicit");
                sent_prompts.push((id, epoch_now.clone(), now));
            }
            // Grants written during this step, and where they could come from.
            let new_grants: Vec<Value> = h.io().audit.iter().filter(|(k, _, _)| k == audit::APPROVAL_GRANTED).map(|(_, _, d)| d.clone()).skip(grants_seen).collect();
            grants_seen += new_grants.len();
            prop_assert!(new_grants.len() <= 1, "one decision, one grant: {:?}", new_grants);
            for g in &new_grants {
                match g["channel"].as_str() {
                    Some("terminal") => prop_assert!(terminal_may_grant, "terminal grant without a control request: {}", g),
                    Some("host") => {
                        let (_, epoch) = host_may_grant.clone().unwrap_or_default();
                        prop_assert!(host_may_grant.is_some(), "host grant without a real answer to an open prompt: {}", g);
                        prop_assert_eq!(g["grant"]["executionEpoch"].as_str(), epoch.as_deref(), "host grant for another epoch");
                    }
                    other => prop_assert!(false, "grant without a channel: {:?}", other),
                }
            }
            // Every tools/call sent to a server so far had its intent record first.
            let calls_sent = h.io().audit.iter().filter(|(k, _, _)| k == audit::TOOL_CALLED).count();
            prop_assert!(calls_sent >= forwarded_calls);
            forwarded_calls = calls_sent;
        }
        // The n-th call that reached a server had n intent records before it, the last of them
        // naming that server's epoch.
        for (n, (epoch, intents)) in h.io().calls_sent.iter().enumerate() {
            prop_assert!(intents.len() > n, "call {} forwarded before its tool_called record", n);
            prop_assert_eq!(intents[n].1.as_deref(), Some(epoch.as_str()));
        }
        prop_assert_eq!(h.io().calls_sent.len(), forwarded_calls, "a call forwarded twice or without a record");
        // In log order: a call's epoch was started before it, had not ended, and (when gated)
        // the call names a grant issued for that very epoch.
        let mut live: Option<String> = None;
        let mut grants: std::collections::BTreeMap<String, String> = Default::default();
        for (kind, epoch, data) in &h.io().audit {
            match kind.as_str() {
                audit::SERVER_STARTED => live = epoch.clone(),
                audit::SERVER_EXITED if *epoch == live => live = None,
                audit::APPROVAL_GRANTED => {
                    grants.insert(data["grant"]["id"].as_str().unwrap().to_string(),
                                  data["grant"]["executionEpoch"].as_str().unwrap().to_string());
                }
                audit::TOOL_CALLED => {
                    prop_assert!(epoch.is_some() && *epoch == live, "call outside a live epoch: {:?}", data);
                    if gated {
                        let grant = data["grant"].as_str().expect("a gated call names its grant");
                        prop_assert_eq!(grants.get(grant), epoch.as_ref(), "grant of another epoch");
                    }
                }
                _ => {}
            }
        }
        h.handle(Event::HostEof);
        h.serve();
        for id in &requests {
            let answers = h.io().to_host.iter().filter(|m| m.get("id") == Some(id) && m.get("method").is_none()).count();
            prop_assert_eq!(answers, 1, "request {} answered {} times", id, answers);
        }
        for m in &h.io().to_host {
            if let Some(tools) = m.pointer("/result/tools").and_then(Value::as_array) {
                prop_assert!(!tools.is_empty(), "an empty list nobody returned: {}", m);
            }
        }
    }
}

#[test]
fn a_call_in_a_restart_gap_that_outlasts_the_hold_is_judged_then() {
    let mut h = Harness::ungated(|c| c.restart_hold = std::time::Duration::from_secs(2));
    h.connect_legacy();
    h.build(complete("a"));
    h.build(complete("b"));
    let call = h.call("list_items");
    h.advance(1999);
    assert!(h.answer(&call).is_none());
    h.advance(1);
    let a = h.answer(&call).expect("answered when the hold ran out");
    assert_eq!(Harness::tool_error(&a).as_deref(), Some("identity_pending"));
}

#[test]
fn a_host_that_cancels_a_held_request_never_has_it_forwarded() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let call = h.call("write_item");
    h.host(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": call}}));
    h.build(complete("a"));
    assert!(h.io().calls_sent.is_empty());
}

#[test]
fn held_requests_are_bounded() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let ids: Vec<Value> = (0..HELD_LIMIT + 3)
        .map(|_| h.request("tools/list", json!({})))
        .collect();
    let answered = ids.iter().filter(|id| h.answer(id).is_some()).count();
    assert_eq!(answered, 3, "the overflow is answered at once");
}

/// Architecture issue: the writer (the session) and the reader (`audit show`) share one record
/// type, so the journal shows how each epoch ended. The old session wrote `exit` where the
/// journal read `status`, and never ended the last epoch.
#[test]
fn the_journal_reads_what_the_session_writes() {
    use crate::audit::chain::{FORMAT_VERSION, GENESIS_PREV, Record};
    use crate::audit::journal::Journals;
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let first = h.current_epoch().unwrap();
    h.handle(Event::ChildExited {
        epoch: first.clone(),
        exit: ExitInfo {
            code: Some(3),
            signal: None,
        },
    });
    h.advance(1000);
    let second = h.current_epoch().expect("restarted");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    let call = h.call("list_items");
    assert!(h.answer(&call).is_some());
    h.handle(Event::HostEof);
    let run = h.s.agent_run().to_string();
    let records: Vec<Record> = h
        .io()
        .audit
        .iter()
        .enumerate()
        .map(|(i, (kind, epoch, data))| Record {
            v: FORMAT_VERSION,
            seq: i as u64 + 1,
            time: format!("t{i}"),
            record_type: kind.clone(),
            run: run.clone(),
            epoch: epoch.clone(),
            prev: GENESIS_PREV.into(),
            data: data.clone(),
            hash: String::new(),
            mac: String::new(),
        })
        .collect();
    let j = Journals::from_records(&records);
    let ended: Vec<(String, Option<String>)> = j
        .session
        .epochs
        .iter()
        .map(|e| (e.epoch.clone(), e.exit_status.clone()))
        .collect();
    assert_eq!(
        ended,
        [
            (first, Some("exit code 3".into())),
            (second, Some("stopped at session end".into()))
        ]
    );
    assert_eq!(j.session.presented.len(), 1);
    assert_eq!(j.activity[0].shown_revision, Some(1));
    let text = j.render_human(crate::audit::journal::JournalView::Both);
    assert!(text.contains("exited: exit code 3"), "{text}");
    assert!(text.contains("Shown to the host"), "{text}");
}

#[test]
fn control_requests_are_typed_and_refused_when_malformed() {
    assert_eq!(
        ControlRequest::parse(&json!({"op": "status"})),
        Ok(ControlRequest::Status)
    );
    let e = ControlRequest::parse(&json!({"op": "approve", "tools": ["x"]})).unwrap_err();
    assert!(e.contains("approve") && e.contains("epoch"), "{e}");
    let e = ControlRequest::parse(&json!({"op": "grant-everything\u{1b}[2J"})).unwrap_err();
    assert!(
        e.starts_with("unknown control operation") && !e.contains('\u{1b}'),
        "{e}"
    );
    assert!(ControlRequest::parse(&json!({})).is_err());
    let mut h = Harness::ungated(|_| {});
    let (tx, rx) = crossbeam_channel::bounded(1);
    h.control_call(json!({"op": "nope"}), tx.into());
    assert_eq!(rx.recv().unwrap()["ok"], json!(false));
}

#[test]
fn the_status_document_round_trips_through_its_type() {
    let mut h = Harness::new(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let denied = h.call("write_item");
    assert!(h.answer(&denied).is_some());
    let v = h.s.status_json();
    let back: super::snapshot::StatusSnapshot = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(serde_json::to_value(&back).unwrap(), v);
    assert_eq!(back.lifecycle, "serving");
    assert_eq!(back.pending_approval.tools.len(), 1);
}

// ----- every state × every event kind -----------------------------------------------------------

/// The lifecycle states, each reached the way a session reaches it.
fn in_state(state: &str) -> Harness {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    match state {
        "first-start" => {}
        "serving" => h.build(complete("a")),
        "restarting" => {
            h.build(complete("a"));
            h.build(complete("b")); // the old server is stopping
        }
        "build-broken" => h.build(failed(None)),
        "crash-loop" => {
            h.build(complete("a"));
            for _ in 0..CRASH_LIMIT {
                if let Some(epoch) = h.current_epoch() {
                    h.handle(Event::ChildExited {
                        epoch,
                        exit: ExitInfo {
                            code: Some(3),
                            signal: None,
                        },
                    });
                }
                h.advance(5_000);
            }
            assert_eq!(*h.s.lifecycle(), Lifecycle::CrashLoop);
        }
        "stopping" => {
            h.build(complete("a"));
            h.handle(Event::Shutdown("test".into()));
        }
        other => panic!("{other}"),
    }
    h
}

const STATES: [&str; 6] = [
    "first-start",
    "serving",
    "restarting",
    "build-broken",
    "crash-loop",
    "stopping",
];

/// One event of every kind, built against the harness's current state.
fn every_event(h: &mut Harness) -> Vec<(&'static str, Event)> {
    let epoch = h
        .current_epoch()
        .or_else(|| h.io().spawned.last().map(|(e, _)| e.clone()))
        .unwrap_or_else(|| "none".into());
    let line = |v: Value| v.to_string().into_bytes();
    vec![
        (
            "host request",
            Event::HostLine(line(
                json!({"jsonrpc": "2.0", "id": "q", "method": "tools/list"}),
            )),
        ),
        (
            "host call",
            Event::HostLine(line(
                json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "list_items"}}),
            )),
        ),
        (
            "host notification",
            Event::HostLine(line(
                json!({"jsonrpc": "2.0", "method": "notifications/progress"}),
            )),
        ),
        ("host garbage", Event::HostLine(b"{not json".to_vec())),
        (
            "host oversize",
            Event::HostOversize {
                prefix: br#"{"jsonrpc":"2.0","id":"o","#.to_vec(),
                len: 1 << 30,
            },
        ),
        (
            "child line",
            Event::ChildLine {
                epoch: epoch.clone(),
                line: line(json!({"jsonrpc": "2.0", "method": "notifications/message"})),
            },
        ),
        (
            "child oversize",
            Event::ChildOversize {
                epoch: epoch.clone(),
                prefix: b"{".to_vec(),
                len: 1 << 30,
            },
        ),
        (
            "child exited",
            Event::ChildExited {
                epoch: epoch.clone(),
                exit: ExitInfo {
                    code: Some(1),
                    signal: None,
                },
            },
        ),
        ("child stopped", Event::ChildStopped { epoch }),
        ("build ok", Event::BuildFinished(Box::new(complete("z")))),
        ("build failed", Event::BuildFinished(Box::new(failed(None)))),
        ("sources changing", Event::SourcesChanging),
        (
            "sources changed",
            Event::SourcesChanged {
                paths: vec!["src/main.rs".into()],
                changed_after_leading_edge: false,
            },
        ),
        ("held deadline", Event::Timer(Timer::HeldDeadline)),
        ("restart timer", Event::Timer(Timer::Restart)),
        ("handshake timer", Event::Timer(Timer::HandshakeWait)),
        (
            "control",
            Event::Control {
                request: ControlRequest::Status,
                ticket: 1,
            },
        ),
        ("host eof", Event::HostEof),
        ("shutdown", Event::Shutdown("signal".into())),
    ]
}

/// Every state handles every event kind: no panic, a request is answered at most once, an
/// answer the host gets is well-formed JSON-RPC, and once the host is gone (EOF) every request
/// it sent has exactly one answer.
#[test]
fn every_state_handles_every_event_kind() {
    for state in STATES {
        let n = every_event(&mut in_state(state)).len();
        for i in 0..n {
            let mut h = in_state(state);
            let (name, event) = every_event(&mut h).swap_remove(i);
            h.handle(event);
            h.serve();
            h.advance(30_000);
            for id in ["q", "c", "o"] {
                let id = json!(id);
                let _ = h.answer(&id); // at most once (asserted inside)
            }
            for m in &h.io().to_host {
                assert_eq!(m["jsonrpc"], json!("2.0"), "{state}/{name}: {m}");
                assert!(
                    m.get("method").is_some()
                        || m.get("result").is_some()
                        || m.get("error").is_some(),
                    "{state}/{name}: {m}"
                );
            }
            h.handle(Event::HostEof);
            h.serve();
            for id in ["q", "c"] {
                let sent = name
                    == if id == "q" {
                        "host request"
                    } else {
                        "host call"
                    };
                let answered = h.answer(&json!(id)).is_some();
                assert!(
                    !sent || answered || state == "stopping",
                    "{state}/{name}: request {id} never answered"
                );
            }
            assert!(
                h.s.exit_code().is_some(),
                "{state}/{name}: the session ends on EOF"
            );
        }
    }
}

/// Where each event kind takes each state (the transitions of the lifecycle).
#[test]
fn lifecycle_transitions() {
    let after = |state: &str, event: &str| -> Lifecycle {
        let mut h = in_state(state);
        let i = every_event(&mut h)
            .iter()
            .position(|(n, _)| *n == event)
            .unwrap();
        let (_, e) = every_event(&mut h).swap_remove(i);
        h.handle(e);
        h.serve();
        h.s.lifecycle().clone()
    };
    let broken = |l: &Lifecycle| matches!(l, Lifecycle::BuildBroken { .. });
    assert_eq!(after("first-start", "build ok"), Lifecycle::Serving);
    assert!(broken(&after("first-start", "build failed")));
    assert_eq!(after("build-broken", "build ok"), Lifecycle::Serving);
    assert_eq!(
        after("serving", "build failed"),
        Lifecycle::Serving,
        "a running server keeps running"
    );
    assert_eq!(after("crash-loop", "sources changed"), Lifecycle::Serving);
    assert_eq!(
        after("crash-loop", "build ok"),
        Lifecycle::Serving,
        "new code (its change saved before the loop began) is what the loop waits for"
    );
    // The same code built again (an unrelated change): no restart until a change.
    let mut h = in_state("crash-loop");
    h.build(complete("a"));
    assert_eq!(h.s.lifecycle(), &Lifecycle::CrashLoop);
    for state in STATES {
        assert_eq!(after(state, "host eof"), Lifecycle::Stopping, "{state}");
        assert_eq!(after(state, "shutdown"), Lifecycle::Stopping, "{state}");
    }
    assert_eq!(after("stopping", "build ok"), Lifecycle::Stopping);
}

#[test]
fn many_held_requests_cost_one_timer() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    let before = h.io().timers.len();
    for _ in 0..200 {
        h.request("tools/list", json!({}));
        h.io().now_ms += 1;
    }
    let held_timers = h.io().timers.len() - before;
    assert_eq!(held_timers, 1, "one timer for every held request");
    h.advance(DEFAULT_FIRST_START_BUDGET.as_millis() as u64 + 300);
    assert!(
        h.s.host.held.is_empty(),
        "every held request answered when its time came"
    );
}

#[test]
fn repeated_host_lists_reuse_the_known_catalog_and_new_bytes_are_digested_again() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let current = h.s.catalogs.history.current().map(|r| r.digest.clone());
    let mut published = Vec::new();
    for _ in 0..3 {
        let l = h.request("tools/list", json!({}));
        assert!(h.answer(&l).is_some());
        assert_eq!(
            h.s.approvals.gate.host_catalog().map(str::to_string),
            current
        );
        published.push(h.io().published);
    }
    assert_eq!(
        (published[1], published[2]),
        (published[0], published[0]),
        "listing the same catalog again is no new state to publish"
    );
    // Same epoch, the server now lists other bytes (it did not say list_changed).
    h.tools.push(tool("added", 1));
    let l = h.request("tools/list", json!({}));
    assert_eq!(Harness::names(&h.answer(&l).unwrap()).len(), 3);
    let shown = h.s.approvals.gate.host_catalog().map(str::to_string);
    assert_ne!(shown, current, "the host's view follows what it was shown");
    assert!(h.io().published > published[0]);
    // Every presentation is still recorded.
    assert_eq!(h.audit_kinds(audit::CATALOG_PRESENTED).len(), 4);
}

#[test]
fn a_server_that_never_answered_is_stopped_without_the_usual_grace() {
    // Ready server: the usual grace.
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    h.handle(Event::HostEof);
    assert_eq!(h.io().stop_graces, vec![STOP_GRACE]);
    // A server still in its handshake when the host leaves (not reading stdin, say).
    let mut h = Harness::ungated(|_| {});
    h.initialize("2025-06-18");
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    assert!(h.current_epoch().is_some(), "spawned");
    // The fake server has not been served: the handshake is unanswered.
    h.handle(Event::HostEof);
    assert_eq!(h.io().stop_graces, vec![STOP_GRACE_UNANSWERED]);
    assert!(STOP_GRACE_UNANSWERED <= Duration::from_millis(100));
}

#[test]
fn a_batch_whose_records_cannot_be_written_answers_its_calls_as_unaudited() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    h.answer_calls = false;
    let line = |id: u32| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "write_item", "arguments": {}}})
        .to_string()
        .into_bytes()
    };
    // A batch that writes: both calls forwarded, nothing answered yet.
    h.handle_batch(vec![Event::HostLine(line(100)), Event::HostLine(line(101))]);
    h.serve();
    assert_eq!(h.io().calls_sent.len(), 2);
    assert!(h.answer(&json!(100)).is_none());
    // A batch whose records are lost: its calls are answered, never left waiting.
    h.io().audit_fails = true;
    h.handle_batch(vec![Event::HostLine(line(200)), Event::HostLine(line(201))]);
    for id in [200, 201] {
        let a = h.answer(&json!(id)).expect("answered");
        assert_eq!(
            Harness::tool_error(&a).as_deref(),
            Some("audit_failed"),
            "{a}"
        );
    }
    assert!(
        h.io()
            .status
            .iter()
            .any(|l| l.contains("audit log unavailable"))
    );
    // The calls of the earlier batch are still the server's to answer.
    assert!(h.answer(&json!(100)).is_none());
}

// ----- red-team, session 22 -----------------------------------------------------------------

/// `cargo mcp-dev restart` while the rebuild for a failed start is already running: the
/// restart used to drop that rebuild's record and spawn again, which failed, and the session
/// turned `StartFailed`, answering held requests at once with "failed to start … (save a
/// change)", though the running rebuild was about to start the server.
#[test]
fn restart_during_the_rebuild_for_a_failed_start_keeps_held_requests_waiting() {
    let mut h = Harness::ungated(|_| {});
    exited_and_rebuilding(&mut h);
    let list = h.request("tools/list", json!({}));
    h.advance(1_000);
    assert_eq!(
        h.answer(&list),
        None,
        "held while the server is built again"
    );
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(
        answer["result"],
        json!({"building": true}),
        "a rebuild is running and will start the server: {answer}"
    );
    assert_eq!(
        h.answer(&list),
        None,
        "held request failed at once although the rebuild is still on its way"
    );
}

/// After a failed start (`StartFailed`), `cargo mcp-dev restart` requests a rebuild and answers
/// `{"building": true}`; the lifecycle used to stay `StartFailed`, so requests in that window
/// were refused at once with the old failure instead of waiting for the promised build.
#[test]
fn after_restart_answers_building_requests_wait_for_that_build() {
    let mut h = Harness::ungated(|_| {});
    exited_and_rebuilding(&mut h);
    h.build(complete("a"));
    assert!(matches!(h.s.lifecycle(), Lifecycle::StartFailed { .. }));
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(answer["result"], json!({"building": true}), "{answer}");
    let list = h.request("tools/list", json!({}));
    let got = h.answer(&list);
    assert_eq!(
        got, None,
        "restart said a build is on its way, yet the list was refused at once"
    );
}

/// `cargo mcp-dev restart` in the gap of a supervise-mode replacement (old server stopping,
/// `child` empty, `replacing` set): the control path used to spawn a server at once, then the
/// old server's stop spawned the replacement over it, and the first was never stopped.
#[test]
fn restart_during_a_replacement_leaves_no_server_unsupervised() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    let old = h.current_epoch().unwrap();
    h.build(complete("b")); // replacing: the old server is told to stop
    assert!(h.current_epoch().is_none());
    let answer = h.control(json!({"op": "restart"}));
    h.handle(Event::ChildStopped { epoch: old.clone() });
    h.serve();
    let current = h.current_epoch().expect("a server runs");
    let io = h.io();
    let orphans: Vec<_> = io
        .spawned
        .iter()
        .map(|(e, _)| e.clone())
        .filter(|e| *e != current && !io.stopped.contains(e))
        .collect();
    assert!(
        orphans.is_empty(),
        "spawned, never stopped, no longer the session's child: {orphans:?} (restart answered {answer})"
    );
}

/// Supervise mode, after a crash loop a source change starts a build (lifecycle `Serving`, no
/// child, nothing scheduled): requests in that window were refused at once with "restart mode
/// manual: `cargo mcp-dev restart`", a mode this session is not in. They wait for the build.
#[test]
fn requests_during_the_build_after_a_crash_loop_wait_for_it() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    crash_until_the_loop(&mut h);
    let status = h.io().status.clone();
    assert_eq!(h.s.lifecycle(), &Lifecycle::CrashLoop, "{status:?}");
    save(&mut h);
    let list = h.request("tools/list", json!({}));
    assert_eq!(
        h.answer(&list),
        None,
        "held: the build's result starts a server"
    );
    h.build(complete("b"));
    let list = h.answer(&list).expect("answered by the real server");
    assert_eq!(Harness::names(&list), ["list_items", "write_item"]);
    assert_no_manual_mode_blame(&mut h);
}

/// At first start, once `HELD_LIMIT` requests wait, the next is answered at once: it used to
/// say "no MCP server is running (restart mode manual …)", not this session's mode nor why.
#[test]
fn a_full_hold_queue_at_first_start_says_why() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    for _ in 0..HELD_LIMIT {
        h.request("resources/list", json!({}));
    }
    let over = h.request("resources/list", json!({}));
    let a = h.answer(&over).expect("answered at once past the limit");
    let text = a.to_string();
    assert!(
        text.contains("requests already wait") && text.contains("being built"),
        "first start, supervise mode: {a}"
    );
    assert_no_manual_mode_blame(&mut h);
}

// ----- red-team, session 22, round 2 ---------------------------------------------------------

/// A host request delivered without the fake server answering anything (the server stays in
/// its handshake).
fn send_unserved(h: &mut Harness, method: &str) -> Value {
    send_unserved_with(h, method, json!({}))
}

fn exit_child(h: &mut Harness, epoch: String) {
    h.handle(Event::ChildExited {
        epoch,
        exit: ExitInfo {
            code: Some(1),
            signal: None,
        },
    });
}

/// Manual mode, first start: the first server exits before its handshake. The request that
/// waited for it was refused with "1024 requests already wait for it": one did (the overflow
/// wording was picked whenever `hold_budget()` was `Some`). Only the overflow says that now.
#[test]
fn manual_first_server_exit_does_not_claim_a_full_hold_queue() {
    let mut h = Harness::ungated(|c| c.restart = Restart::Manual);
    h.connect_legacy();
    let list = send_unserved(&mut h, "resources/list");
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    let epoch = h.current_epoch().expect("the first server started");
    exit_child(&mut h, epoch);
    let a = h.answer(&list).expect("refused: no server is coming");
    assert!(
        !a.to_string().contains("already wait"),
        "one held request, answered as a full hold queue: {a}"
    );
}

/// Manual mode, first start: after the first server exits (nothing restarts it, no build
/// runs), new requests were held for the whole first-start budget and then told the server
/// "is still building", with nothing on its way. They are answered at once now.
#[test]
fn manual_first_start_exit_holds_no_request_for_nothing() {
    let mut h = Harness::ungated(|c| c.restart = Restart::Manual);
    h.connect_legacy();
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    let epoch = h.current_epoch().expect("the first server started");
    exit_child(&mut h, epoch);
    let builds = h.io().builds_started;
    let list = send_unserved(&mut h, "resources/list");
    let held = h.answer(&list).is_none();
    h.advance(25_000);
    let a = h.answer(&list).expect("answered by the deadline");
    assert_eq!(
        h.io().builds_started,
        builds,
        "no build was started meanwhile"
    );
    assert!(
        !held,
        "held {} s with no build, no server and no restart on its way, then: {a}",
        25
    );
}

/// Manual mode, a server in its handshake (after `restart`) exits while a build runs: the
/// request that waited was refused at once ("1024 requests already wait"), while a request
/// sent a moment later waited for that same build. Both wait for it now.
#[test]
fn manual_exit_during_a_build_keeps_held_requests_for_it() {
    let mut h = Harness::ungated(|c| c.restart = Restart::Manual);
    h.connect_legacy();
    h.build(complete("a"));
    let old = h.current_epoch().expect("a runs");
    let answer = h.control(json!({"op": "restart"}));
    assert_eq!(answer["result"], json!({"restarting": true}), "{answer}");
    h.handle(Event::ChildStopped { epoch: old });
    let new = h
        .current_epoch()
        .expect("the replacement started (handshaking)");
    let early = send_unserved(&mut h, "resources/list");
    assert!(h.answer(&early).is_none(), "held in the restart gap");
    save(&mut h);
    exit_child(&mut h, new);
    let late = send_unserved(&mut h, "resources/list");
    assert!(
        h.answer(&late).is_none(),
        "a new request waits for the build"
    );
    let early_answer = h.answer(&early);
    assert!(
        early_answer.is_none(),
        "the earlier request was refused though the same build is on its way: {early_answer:?}"
    );
}

/// Supervise mode, crash loop then a source change: a build runs and requests wait for it.
/// `cargo mcp-dev restart` in that window (no start-rebuild pending) tries the old copy, which
/// cannot start; the session used to turn `StartFailed` and refuse the held requests with
/// "save a change", though the running build was on its way and starts the server.
#[test]
fn restart_while_a_build_runs_keeps_held_requests_waiting() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    crash_until_the_loop(&mut h);
    assert_eq!(h.s.lifecycle(), &Lifecycle::CrashLoop);
    save(&mut h);
    let list = h.request("resources/list", json!({}));
    assert!(h.answer(&list).is_none(), "held for the build");
    h.io().spawn_error = Some("executable `store/sha256-a` is missing".into());
    let answer = h.control(json!({"op": "restart"}));
    let got = h.answer(&list);
    assert!(
        got.is_none(),
        "held request refused while the build that starts the server still runs: {got:?} (restart answered {answer})"
    );
}

/// Manual mode: the server exited and the next build failed (`BuildBroken`). `restart` starts
/// the last successful build and answers `started`; the lifecycle used to stay `BuildBroken`
/// until the catalog arrived, so a request in the server's handshake was refused at once with
/// "the build failed …", though a server was starting.
#[test]
fn restart_in_build_broken_holds_requests_for_the_starting_server() {
    let mut h = Harness::ungated(|c| c.restart = Restart::Manual);
    h.connect_legacy();
    h.build(complete("a"));
    let epoch = h.current_epoch().unwrap();
    exit_child(&mut h, epoch);
    h.build(failed(None));
    assert!(matches!(h.s.lifecycle(), Lifecycle::BuildBroken { .. }));
    let (tx, rx) = crossbeam_channel::bounded(1);
    h.control_call(json!({"op": "restart"}), tx.into());
    let answer = rx.try_recv().unwrap();
    assert_eq!(answer["result"], json!({"started": true}), "{answer}");
    let list = send_unserved(&mut h, "resources/list");
    let got = h.answer(&list);
    assert!(
        got.is_none(),
        "a server was just started, yet the request was refused at once: {got:?} (lifecycle {:?})",
        h.s.lifecycle()
    );
}

#[derive(Debug, Clone)]
enum ModeStep {
    Init,
    List,
    Other,
    Call,
    /// A build result, delivered only while a build runs (as the shell does).
    BuildOk(u8),
    BuildFail(bool),
    ChildExit,
    Stopped,
    Advance(u16),
    Restart,
    SpawnFails(bool),
    Changing,
    Changed(bool),
    /// The server in its handshake answers (else it stays silent until the next `Serve`).
    Serve,
}

fn mode_step() -> impl Strategy<Value = ModeStep> {
    prop_oneof![
        Just(ModeStep::Init),
        Just(ModeStep::List),
        Just(ModeStep::Other),
        Just(ModeStep::Call),
        (0u8..3).prop_map(ModeStep::BuildOk),
        any::<bool>().prop_map(ModeStep::BuildFail),
        Just(ModeStep::ChildExit),
        Just(ModeStep::Stopped),
        (0u16..30_000).prop_map(ModeStep::Advance),
        Just(ModeStep::Restart),
        any::<bool>().prop_map(ModeStep::SpawnFails),
        Just(ModeStep::Changing),
        any::<bool>().prop_map(ModeStep::Changed),
        Just(ModeStep::Serve),
    ]
}

fn deliver_maybe_served(h: &mut Harness, serve: bool, ev: Event) {
    h.handle(ev);
    if serve {
        h.serve();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// The random sequences of `session_invariants` miss control `restart`, spawn errors, early
    /// builds, the restart modes, the fallback and a server slow to handshake. Over those:
    /// at most one server process is live and it is the session's child; every held request
    /// has an armed deadline; a request is held only while a server or a build is on its way;
    /// every request is answered exactly once by the end.
    #[test]
    fn session_invariants_with_restart_spawn_errors_and_modes(
        steps in prop::collection::vec(mode_step(), 1..48),
        mode in 0u8..3,
        last_good in any::<bool>(),
        warm in any::<bool>(),
    ) {
        let mut h = Harness::ungated(|c| {
            c.restart = [Restart::Supervise, Restart::Manual, Restart::Disconnect][mode as usize];
            if last_good { c.fallback = Fallback::LastGood; }
            c.warm = warm;
        });
        let mut requests = Vec::new();
        let mut serve = true;
        for step in steps {
            if h.s.exit_code().is_some() { break; }
            // Requests held when a build result arrives: a server is started for them, or they
            // are answered.
            let held_before_build = matches!(step, ModeStep::BuildOk(_)) && !h.s.host.held.is_empty()
                && h.s.build.runs != Builds::Idle && h.s.build.early.is_none();
            match step {
                ModeStep::Init => { requests.push(h.initialize(V)); h.initialized(); }
                ModeStep::List => requests.push(send_unserved(&mut h, "tools/list")),
                ModeStep::Other => requests.push(send_unserved(&mut h, "resources/list")),
                ModeStep::Call => requests.push(h.call("list_items")),
                ModeStep::BuildOk(_) | ModeStep::BuildFail(_) if h.s.build.runs == Builds::Idle
                    || h.s.build.early.as_ref().is_some_and(|e| e.held.is_some()) => {}
                ModeStep::BuildOk(n) => deliver_maybe_served(&mut h, serve, Event::BuildFinished(Box::new(complete(&format!("e{n}"))))),
                ModeStep::BuildFail(good) => deliver_maybe_served(&mut h, serve, Event::BuildFinished(Box::new(failed(good.then_some("e0"))))),
                ModeStep::ChildExit => if let Some(epoch) = h.current_epoch() {
                    deliver_maybe_served(&mut h, serve, Event::ChildExited { epoch, exit: ExitInfo { code: Some(1), signal: None } });
                },
                ModeStep::Stopped => {
                    let stopped = h.io().stopped.last().cloned();
                    if let Some(epoch) = stopped { deliver_maybe_served(&mut h, serve, Event::ChildStopped { epoch }); }
                }
                ModeStep::Advance(ms) => h.advance(ms as u64),
                ModeStep::Restart => {
                    let (tx, _rx) = crossbeam_channel::bounded(1);
                    h.control_call(json!({"op": "restart"}), tx.into());
                    if serve {
                        h.serve();
                    }
                }
                ModeStep::SpawnFails(f) => h.io().spawn_error = f.then(|| "executable missing".to_string()),
                ModeStep::Changing => if h.s.build.burst == Burst::Settled { deliver_maybe_served(&mut h, serve, Event::SourcesChanging) },
                ModeStep::Changed(after) => {
                    let after = after && h.s.build.burst == Burst::Open;
                    deliver_maybe_served(&mut h, serve, Event::SourcesChanged {
                        paths: vec!["src/main.rs".into()], changed_after_leading_edge: after });
                }
                ModeStep::Serve => { serve = !serve; h.serve(); }
            }
            if h.s.exit_code().is_some() { break; }
            if held_before_build && h.s.build.runs == Builds::Idle && h.s.build.early.is_none() {
                prop_assert!(h.s.server.runs_or_restarts() || h.s.host.held.is_empty(),
                    "a build finished while requests waited for it, and no server was started (lifecycle {:?})", h.s.lifecycle);
            }
            // A request is held only while the state allows holding one.
            if !h.s.host.held.is_empty() {
                prop_assert!(h.s.hold_budget().is_some(), "{} request(s) held in a state that holds none (lifecycle {:?}, mode {:?})",
                    h.s.host.held.len(), h.s.lifecycle, h.s.cfg.restart);
            }
            // At most one live server process, and it is the session's child.
            let io = &h.io;
            let live: Vec<String> = io.spawned.iter().map(|(e, _)| e.clone())
                .filter(|e| !io.stopped.contains(e) && !io.reaped.contains(e)).collect();
            let child = h.s.server.child().map(|c| c.epoch.to_string());
            prop_assert!(live.len() <= 1, "two live servers: {:?}", live);
            if let Some(e) = live.first() {
                prop_assert_eq!(Some(e), child.as_ref(), "a live server that is not the session's child");
            }
            // Every held request has an armed deadline.
            if !h.s.host.held.is_empty() {
                let armed = h.io.timers.iter().any(|(_, t)| matches!(t, Timer::HeldDeadline));
                prop_assert!(armed, "held requests with no deadline timer");
                // ... and waits for something on its way.
                let on_its_way = h.s.server.runs_or_restarts() || h.s.build.runs != Builds::Idle;
                prop_assert!(on_its_way, "{} request(s) held with no server, build or restart on its way (lifecycle {:?}, mode {:?})",
                    h.s.host.held.len(), h.s.lifecycle, h.s.cfg.restart);
            }
        }
        h.handle(Event::HostEof);
        for id in &requests {
            let answers = h.io().to_host.iter().filter(|m| m.get("id") == Some(id) && m.get("method").is_none()).count();
            prop_assert_eq!(answers, 1, "request {} answered {} times", id, answers);
        }
    }
}

/// Warm start: a host that sends `initialize` again while the first waits for the server's
/// own answer (a retry after its own short timeout, a second client on a shared pipe) used to
/// replace `waiting_initialize`: the first was never answered. The second is refused now.
#[test]
fn warm_second_initialize_leaves_neither_unanswered() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let first = h.initialize(V);
    let second = h.initialize(V);
    let refused = h.answer(&second).expect("the second is answered at once");
    assert_eq!(
        refused["error"]["data"]["error"],
        json!("initialize_in_progress")
    );
    h.advance(10_000);
    h.handle(Event::HostEof);
    assert!(
        h.answer(&first).is_some(),
        "the first initialize was never answered"
    );
}

// ----- red-team, session 22, round 3 ---------------------------------------------------------

fn send_unserved_with(h: &mut Harness, method: &str, params: Value) -> Value {
    let id = json!(h.next_host_id);
    h.next_host_id += 1;
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    h.handle(Event::HostLine(msg.to_string().into_bytes()));
    id
}

fn exit_current(h: &mut Harness) {
    let epoch = h.current_epoch().expect("a server runs");
    exit_child(h, epoch);
}

/// Fires due timers one at a time (without serving), at most `limit` of them, up to `until`.
/// Returns how many fired.
fn fire_timers(h: &mut Harness, until: u64, limit: usize) -> usize {
    let mut fired = 0;
    while fired < limit {
        let Some(timer) = h.io().take_due_timer(until) else {
            break;
        };
        h.handle(Event::Timer(timer));
        fired += 1;
    }
    h.io().now_ms = h.io().now_ms.max(until);
    fired
}

/// A modern host's `server/discover` held while the server's own handshake never answers:
/// at the handshake wait it is kept "until since + first_start_budget"; at that deadline it
/// used to be kept again with the same (past) deadline, the held timer re-armed with 0 ms,
/// forever: the shell spun and the host was never answered. Now it is refused at the budget.
#[test]
fn a_discover_held_for_a_silent_server_is_answered_once_its_budget_ends() {
    let mut h = Harness::ungated(|_| {});
    let meta = json!({"_meta": {protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION}});
    let d = send_unserved_with(&mut h, "server/discover", meta);
    // The build ends; the server starts and is sent our discover, which it never answers.
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    assert!(h.current_epoch().is_some());
    let fired = fire_timers(&mut h, 60_000, 500);
    let answered = h.answer(&d).is_some();
    assert!(
        fired < 50 && answered,
        "{fired} timers fired in 60 s (a zero-delay loop); discover answered: {answered}"
    );
}

/// Crashes until the crash loop while the build of a saved fix runs (a server that dies at
/// start, restarted at 250/500/1000/2000 ms, loops within ~4 s; a build takes longer). The
/// fix's build then finished and was not started ("waiting for a source change"), though it
/// is the change the loop waits for. New code is started now.
#[test]
fn a_fix_built_during_the_crash_loop_is_started() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    // The developer saves a fix; its build starts.
    save(&mut h);
    assert_ne!(h.s.build.runs, Builds::Idle);
    crash_until_the_loop(&mut h);
    assert_eq!(h.s.lifecycle(), &Lifecycle::CrashLoop);
    let spawned = h.io().spawned.len();
    h.build(complete("b"));
    assert!(
        h.io().spawned.len() > spawned,
        "the build of the change made after the crashing server started is not run: {:?}",
        h.io().status.last()
    );
}

/// After a crash loop, a source change and a new build, the crash history used to be kept:
/// the new code's first exit put the session straight back in the crash loop (no restart, no
/// backoff). Leaving the loop clears it.
#[test]
fn new_code_after_a_crash_loop_starts_with_no_crash_history() {
    let mut h = Harness::ungated(|_| {});
    h.connect_legacy();
    h.build(complete("a"));
    crash_until_the_loop(&mut h);
    assert_eq!(h.s.lifecycle(), &Lifecycle::CrashLoop);
    save(&mut h);
    h.build(complete("b"));
    assert!(h.current_epoch().is_some(), "b runs");
    exit_current(&mut h);
    assert_ne!(
        h.s.lifecycle(),
        &Lifecycle::CrashLoop,
        "one exit of the new build is a crash loop (crash history of the old build kept)"
    );
}

/// Warm start, manual mode: the first server exited before any host came (nothing restarts
/// it, no build runs). A host `initialize` used to wait the whole warm-start wait for a server
/// that was not coming (held requests in the same state are answered at once).
#[test]
fn a_warm_initialize_waits_for_nothing_after_a_manual_exit() {
    let mut h = Harness::ungated(|c| {
        c.restart = Restart::Manual;
        c.warm = true;
    });
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    exit_current(&mut h);
    assert_eq!(h.s.lifecycle(), &Lifecycle::FirstStart);
    assert!(h.s.hold_budget().is_none(), "nothing is on its way");
    let init = h.initialize("2025-06-18");
    assert!(
        h.answer(&init).is_some(),
        "initialize waits {} ms for a server nothing will start",
        DEFAULT_HANDSHAKE_WAIT.as_millis()
    );
}

/// The first build failed; a burst's early build finished and its result waits for the
/// burst to settle (`builds` stays `Running`). The host leaves: `first_build_abandoned` used
/// to say a build was still running, so the shell started cargo again in the background and
/// said "the build goes on in the background", though no build ran.
#[test]
fn a_finished_early_build_is_not_reported_as_abandoned() {
    let mut h = Harness::ungated(|_| {});
    h.build(failed(None));
    h.handle(Event::SourcesChanging);
    h.handle(Event::BuildFinished(Box::new(failed(None))));
    h.handle(Event::HostEof);
    assert!(
        !h.s.first_build_abandoned(),
        "no build runs (its result is held), yet the first build is reported abandoned"
    );
}

// ----- red-team, session 22, round 4 (timers, handshakes, bounds) -----------------------------

/// The host's legacy `initialize` as raw JSON, without letting the fake server answer anything.
fn initialize_unserved(h: &mut Harness) -> Value {
    send_unserved_with(
        h,
        "initialize",
        json!({"protocolVersion": V, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
    )
}

/// Warm start: the host's `initialize` waits at most `handshake_wait` for the server's own
/// answer. But when the build ends inside that wait, the waiting initialize is handed to the
/// new server's handshake (`advance_child` takes `waiting_initialize`), and the HandshakeWait
/// timer used to find nothing to answer: a slow or silent server left the host's initialize
/// unanswered for good. The timer now answers an initialize still in a handshake.
#[test]
fn a_warm_initialize_is_bounded_even_when_the_server_starts_during_the_wait() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let init = initialize_unserved(&mut h);
    assert_eq!(h.answer(&init), None, "warm: waits for the server");
    h.io().now_ms = 300;
    // The build ends; the server starts and is sent the host's initialize: it never answers.
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    assert!(h.current_epoch().is_some());
    h.io().to_child.clear();
    let fired = fire_timers(&mut h, 120_000, 500);
    assert!(
        h.answer(&init).is_some(),
        "initialize still unanswered 120 s after it was sent ({fired} timers fired; handshake_wait is {} ms)",
        DEFAULT_HANDSHAKE_WAIT.as_millis()
    );
}

/// A host that cancels its calls (every SDK does on its own request timeout) and a server that
/// does what the spec asks of it on `notifications/cancelled` (no response): each cancelled
/// call's `pending` entry used to be kept for the life of the epoch: the map grew without
/// bound, and when the server exited each cancelled call was "answered" with
/// `epoch_transition`, long after the host gave it up. The entry goes with the cancel now.
#[test]
fn cancelled_calls_do_not_pile_up_in_pending() {
    let mut h = Harness::ungated(|_| {});
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    h.answer_calls = false; // the server drops cancelled work without answering
    let before = h.s.open_requests().len();
    let mut ids = Vec::new();
    for _ in 0..500 {
        let id = h.call("list_items");
        h.host(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                      "params": {"requestId": id, "reason": "timeout"}}),
        );
        ids.push(id);
    }
    let grown = h.s.open_requests().len() - before;
    exit_current(&mut h);
    let late = ids.iter().filter(|id| h.answer(id).is_some()).count();
    assert!(
        grown < 64 && late == 0,
        "{grown} pending entries kept for 500 cancelled calls; {late} cancelled calls answered when the server exited"
    );
}

/// Every approval prompt arms its own `ApprovalDeadline` (the shell: one sleeping thread per
/// timer, for `approval_timeout`, 45 s), and a prompt answered at once leaves its timer armed.
/// Open prompts were bounded (`max_open_prompts`), armed timers were not: a host that declined
/// at once and an agent that retried armed one timer (thread) per call. One timer serves all
/// prompts now, armed for the earliest deadline.
#[test]
fn approval_deadline_timers_are_bounded_like_the_prompts() {
    let mut h = Harness::new(|_| {});
    h.build(complete("a"));
    let init = h.request(
        "initialize",
        json!({"protocolVersion": V, "capabilities": {"elicitation": {}},
               "clientInfo": {"name": "test", "version": "1"}}),
    );
    h.initialized();
    assert!(h.answer(&init).is_some());
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    for i in 0..200 {
        let call = h.call_with("write_item", json!({"n": i}));
        let prompt = h
            .io()
            .to_host
            .iter()
            .rev()
            .find(|m| m["method"] == "elicitation/create")
            .cloned()
            .expect("a prompt");
        h.host(json!({"jsonrpc": "2.0", "id": prompt["id"], "result": {"action": "decline"}}));
        assert!(h.answer(&call).is_some(), "declined: the call is refused");
    }
    let open = h.s.approvals.prompts.len();
    let armed = h
        .io()
        .timers
        .iter()
        .filter(|(_, t)| matches!(t, Timer::ApprovalDeadline))
        .count();
    assert!(
        armed <= DEFAULT_MAX_OPEN_PROMPTS,
        "{armed} approval timers armed for {open} open prompts"
    );
}

/// `LISTEN_LIMIT` bounds open streams by the host's ids, and the supervisor-only path refuses
/// an id already open; the forwarded path did not: a host that sent `subscriptions/listen`
/// again and again under one id opened a new stream at the server each time, the earlier ones
/// orphaned. Both paths refuse an id already open now.
#[test]
fn a_reused_listen_id_does_not_open_unbounded_server_streams() {
    let meta = json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
                      protocol::CLIENT_CAPABILITIES: {}});
    let mut h = Harness::ungated(|c| c.warm = true);
    h.listen = ListenReply::Acknowledge(json!({"resourcesListChanged": true}));
    let d = h.request("server/discover", json!({"_meta": meta}));
    h.build(complete("a"));
    assert!(h.answer(&d).unwrap().get("result").is_some());
    let before = h.s.open_requests().len();
    for _ in 0..(LISTEN_LIMIT * 4) {
        h.host(
            json!({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen",
                      "params": {"_meta": meta, "notifications": {"resourcesListChanged": true}}}),
        );
    }
    let at_server = h
        .server_saw
        .iter()
        .filter(|m| *m == "subscriptions/listen")
        .count();
    let grown = h.s.open_requests().len() - before;
    assert!(
        at_server <= LISTEN_LIMIT && grown <= LISTEN_LIMIT,
        "{at_server} listen streams opened at the server and {grown} pending entries for one host stream id (limit {LISTEN_LIMIT}); {} listens counted",
        h.s.host.listens.len()
    );
}

/// A legacy host's `initialize` handed to the first server's handshake (warm start) used to
/// be answered with an `epoch_transition` error when that server exited before answering,
/// although a restart was scheduled: one early crash cost the host its connection. The
/// supervisor answers it now (as at a cold start), and the next server gets the host's params.
#[test]
fn a_crash_during_the_first_handshake_does_not_fail_the_hosts_initialize() {
    let mut h = Harness::ungated(|c| c.warm = true);
    let init = initialize_unserved(&mut h);
    h.io().now_ms = 300;
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    h.io().to_child.clear(); // the server dies before reading its stdin
    exit_current(&mut h);
    assert!(
        matches!(h.s.server, Server::RestartScheduled { .. }),
        "a restart is on its way"
    );
    h.advance(1_000); // the restart; the new server answers
    let answer = h.answer(&init).expect("answered");
    assert!(
        answer.get("result").is_some(),
        "initialize failed although the server was back within 250 ms: {answer}"
    );
}

// ----- red-team, session 22, round 5 (review of round 4) ------------------------------------

/// A `subscriptions/listen` that arrives while the server builds is held; the "one stream per
/// id" check used to look only at open streams, so the same id sent twice during the build
/// opened two streams at the server once it was up. Held listens count now (id and limit).
#[test]
fn held_listens_with_one_id_open_one_server_stream() {
    let meta = json!({protocol::PROTOCOL_VERSION: protocol::MODERN_VERSION,
                      protocol::CLIENT_CAPABILITIES: {}});
    let mut h = Harness::ungated(|c| c.warm = true);
    h.listen = ListenReply::Acknowledge(json!({"resourcesListChanged": true}));
    let d = h.request("server/discover", json!({"_meta": meta}));
    for _ in 0..3 {
        h.host(
            json!({"jsonrpc": "2.0", "id": "L", "method": "subscriptions/listen",
                   "params": {"_meta": meta, "notifications": {"resourcesListChanged": true}}}),
        );
    }
    h.build(complete("a"));
    assert!(h.answer(&d).unwrap().get("result").is_some());
    let at_server = h
        .server_saw
        .iter()
        .filter(|m| *m == "subscriptions/listen")
        .count();
    let refused = h
        .io()
        .to_host
        .iter()
        .filter(|m| m["id"] == json!("L") && m.get("error").is_some())
        .count();
    assert!(
        at_server == 1,
        "one host stream id \"L\" opened {at_server} streams at the server ({refused} refused, {} listens counted)",
        h.s.host.listens.len()
    );
    assert_eq!(refused, 2, "the reused ids are refused at once");
}

/// A forwarded `tools/call` the host cancels while the server already answered it (the race
/// the spec names: the answer was on its way): with the pending entry removed at the cancel,
/// the answer was dropped and the call that ran had no outcome in the audit log. The newest
/// cancelled calls are kept (bounded) so a late answer is recorded, not forwarded.
#[test]
fn a_cancelled_call_that_ran_still_gets_an_audited_outcome() {
    let mut h = Harness::ungated(|_| {});
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let list = h.request("tools/list", json!({}));
    assert!(h.answer(&list).is_some());
    let call = send_unserved_with(
        &mut h,
        "tools/call",
        json!({"name": "write_item", "arguments": {}}),
    );
    let called = h.audit_kinds(audit::TOOL_CALLED).len();
    assert!(
        called >= 1,
        "the call's intent is recorded before it is forwarded"
    );
    // The host gives up; the server had already run it and its answer crosses the cancel.
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": call, "reason": "timeout"}}),
    );
    h.serve();
    exit_current(&mut h);
    let outcomes = h.audit_kinds(audit::TOOL_RESULT).len()
        + h.audit_kinds(audit::CALL_FAILED_EPOCH_TRANSITION).len();
    assert!(
        outcomes >= 1,
        "tool_called written for a call the server ran, but no tool_result / epoch-transition record ever follows (answer dropped at the cancel)"
    );
}

/// `answer_in_flight` answers a legacy handshake's `initialize` with a supervisor announce
/// "unless the session is Stopping", but `close_connection` called it before it set
/// `Stopping`: in restart mode `disconnect`, a server exiting during the host's handshake made
/// the supervisor tell the host `initialize` succeeded and close the connection at once.
#[test]
fn initialize_is_not_announced_as_success_when_the_connection_closes() {
    let mut h = Harness::ungated(|c| c.restart = Restart::Disconnect);
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    assert!(
        h.current_epoch().is_some(),
        "the server is up before the host speaks"
    );
    let init = initialize_unserved(&mut h);
    h.io().to_child.clear(); // the server dies before answering
    exit_current(&mut h);
    assert!(
        h.io().host_closed,
        "restart mode disconnect: the connection closes"
    );
    let answer = h.answer(&init).expect("answered");
    assert!(
        answer.get("error").is_some(),
        "the host was told initialize succeeded as the connection closed: {answer}"
    );
}

/// An `initialize` forwarded to a running server gets that server's own answer, whatever
/// version it chose (the host decides whether it speaks it). For a moment (f01c276) a server
/// slower than `handshake_wait` was pre-empted by an announce of the host's version, and its
/// real answer naming another version closed the connection. A silent running server is left
/// to the host's own `initialize` timeout.
#[test]
fn a_slow_running_server_answering_another_version_is_not_disconnected() {
    let mut h = Harness::ungated(|_| {});
    h.handle(Event::BuildFinished(Box::new(complete("a"))));
    assert!(
        h.current_epoch().is_some(),
        "the server is up before the host speaks"
    );
    let init = send_unserved_with(
        &mut h,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "test", "version": "1"}}),
    );
    // The server reads the request but needs 6 s to answer it.
    let (epoch, sent) = h.io().to_child.pop_front().expect("initialize forwarded");
    assert_eq!(sent["method"], "initialize");
    fire_timers(&mut h, 6_000, 50);
    let line = json!({"jsonrpc": "2.0", "id": sent["id"], "result": {"protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}}, "serverInfo": {"name": "fake", "version": "1"}}});
    h.handle(Event::ChildLine {
        epoch,
        line: line.to_string().into_bytes(),
    });
    let answer = h.answer(&init).expect("answered");
    assert!(
        !h.io().host_closed,
        "host told {} at 5 s, the server answered 2025-06-18 at 6 s: connection closed",
        answer["result"]["protocolVersion"]
    );
}

/// A forwarded call the host cancels and the server never answers (as the spec asks of it) had
/// only its `tool_called` record: the log said neither that it ended nor why. The cancel is now
/// its closing record (`call_cancelled`, with the epoch that had it and the tool), unless the
/// server answers anyway: the late `tool_result` still follows and is the outcome.
#[test]
fn a_cancelled_call_has_a_closing_record() {
    let mut h = Harness::ungated(|_| {});
    h.build(complete("a"));
    h.connect_legacy().expect("initialized");
    let epoch = h.current_epoch().unwrap();
    let call = send_unserved_with(
        &mut h,
        "tools/call",
        json!({"name": "write_item", "arguments": {}}),
    );
    assert!(h.audit_kinds(audit::CALL_CANCELLED).is_empty());
    h.io().to_child.clear(); // the server never answers
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": call, "reason": "timeout"}}),
    );
    let (_, record_epoch, data) = h
        .io()
        .audit
        .iter()
        .rev()
        .find(|(k, _, _)| k == audit::CALL_CANCELLED)
        .cloned()
        .expect("a call_cancelled record");
    assert_eq!(record_epoch.as_deref(), Some(epoch.as_str()));
    assert_eq!(data["tool"], "write_item");
    assert_eq!(data["callId"], call.to_string());
    // A cancel of something that is not an open call writes nothing.
    h.host(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": "nobody"}}),
    );
    assert_eq!(h.audit_kinds(audit::CALL_CANCELLED).len(), 1);
}

/// Red-team round 16: a control request whose client was told "dropped" (the session did not
/// take it up within the client's wait) is never carried out later; one taken up is answered.
#[test]
fn a_control_request_its_client_gave_up_on_is_not_carried_out() {
    let mut h = Harness::ungated(|c| c.warm = true);
    h.build(complete("a"));
    let stops = h.io().stopped.len();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let (reply, wait) = ControlReply::new(tx);
    assert!(wait.give_up());
    h.control_call(json!({"op": "restart"}), reply);
    h.serve();
    assert!(rx.try_recv().is_err(), "no answer: nobody waits for one");
    assert_eq!(h.io().stopped.len(), stops, "not restarted");
    let (tx, rx) = crossbeam_channel::bounded(1);
    let (reply, wait) = ControlReply::new(tx);
    h.control_call(json!({"op": "restart"}), reply);
    assert!(!wait.give_up(), "taken up: its answer is coming");
    assert_eq!(rx.try_recv().unwrap()["ok"], json!(true));
    assert_eq!(h.io().stopped.len(), stops + 1, "restarted");
}
