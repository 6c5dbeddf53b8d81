//! `cargo-mcp-dev run` on the wire: ids, pagination, both protocol eras, framing limits and
//! stdout hygiene, against the std-only fake server (tests/fixtures/fake-server).

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::session::{LABEL, MODERN_VERSION, Setup, short_epoch};
use serde_json::{Value, json};

const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-modern-host", "version": "1.0.0"},
    })
}

/// Asserts an `echo` answer: arguments back, the id the server saw is an integer (ours).
#[track_caller]
fn assert_echo(msg: &common::rpc::Msg, args: &Value, revision: &str) -> u64 {
    let r = msg.result();
    assert_ne!(r["isError"], json!(true), "echo failed: {}", msg.raw);
    let sc = &r["structuredContent"];
    assert_eq!(sc["arguments"], *args, "{}", msg.raw);
    assert_eq!(sc["revision"], json!(revision), "{}", msg.raw);
    assert_eq!(sc["core"], json!("core-1"), "{}", msg.raw);
    let text: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, *args);
    sc["requestId"]
        .as_u64()
        .unwrap_or_else(|| panic!("the server saw a non-integer id: {}", msg.raw))
}

#[test]
fn host_ids_come_back_exactly_and_the_server_sees_only_integer_ids() {
    let mut s = Setup::new().arg("--no-gating").start();
    // Cold start: the server's own answer (issue 33), with the host's id 0.
    let init = s.initialize_with_id("0");
    assert_eq!(init.id.as_deref(), Some("0"));
    assert_eq!(
        init.value,
        json!({"jsonrpc": "2.0", "id": 0, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": true}},
            "serverInfo": {"name": "fake-server", "version": "r1"}}})
    );
    s.server_started();
    s.sync_tools(&["echo", "write"]);

    let mut seen = BTreeSet::new();
    for (id, args) in [
        (r#""0""#, json!({"case": "string zero"})),
        (r#""abc""#, json!({"case": "string"})),
        ("1.0", json!({"case": "float"})),
    ] {
        let m = s.call(id, "echo", args.clone());
        assert_eq!(m.id.as_deref(), Some(id), "id text changed: {}", m.raw);
        assert!(m.raw.contains(&format!(r#""id":{id}"#)), "{}", m.raw);
        assert!(seen.insert(assert_echo(&m, &args, "r1")));
    }

    // Colliding ids of different types, in flight together: each answer goes to its own id.
    let colliding = [("5", "integer"), (r#""5""#, "string"), ("5.0", "float")];
    for (id, case) in colliding {
        s.request(
            id,
            "tools/call",
            Some(json!({"name": "echo", "arguments": {"case": case}})),
        );
    }
    for (id, case) in colliding {
        let m = s.response(id);
        assert_eq!(m.id.as_deref(), Some(id));
        assert!(seen.insert(assert_echo(&m, &json!({"case": case}), "r1")));
    }

    // What the server received: integer ids only, each used once, none of the host's.
    let log = s.fake_log();
    let mut ids = BTreeSet::new();
    for line in &log {
        if let Some(id) = line.get("id") {
            let n = id
                .as_u64()
                .unwrap_or_else(|| panic!("server got a non-integer id: {line}"));
            assert!(ids.insert(n), "id {n} sent to the server twice: {log:?}");
        }
    }
    let calls: Vec<&Value> = log.iter().filter(|l| l["method"] == "tools/call").collect();
    assert_eq!(calls.len(), 6, "{log:?}");
    let call_ids: BTreeSet<u64> = calls.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    assert_eq!(
        call_ids, seen,
        "structuredContent.requestId must be the id in FAKE_LOG"
    );
    s.finish();
}

#[test]
fn server_to_host_requests_get_supervisor_ids_and_answers_map_back() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["ask_host"])
        .env("FAKE_SERVER_REQUEST_ID", r#""7""#)
        .start();
    s.ready_legacy();
    s.request(
        r#""ask""#,
        "tools/call",
        Some(json!({"name": "ask_host", "arguments": {}})),
    );
    let req = s.message("sampling/createMessage from the server", |m| {
        m.method() == Some("sampling/createMessage")
    });
    assert!(req.is_request(), "{}", req.raw);
    let host_side_id = req.id.clone().unwrap();
    assert!(
        host_side_id.parse::<u64>().is_ok(),
        "the host must see the supervisor's integer id, not the server's \"7\": {}",
        req.raw
    );
    let reply =
        json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"});
    s.send(&common::rpc::response(&host_side_id, &reply));
    let done = s.response(r#""ask""#);
    assert_eq!(
        done.result()["structuredContent"]["reply"],
        reply,
        "{}",
        done.raw
    );
    // The server got its answer under its own id, the string "7".
    let log = s.fake_log();
    let answer = log
        .iter()
        .find(|l| l.get("result").is_some())
        .unwrap_or_else(|| panic!("no response reached the server: {log:?}"));
    assert_eq!(answer["id"], json!("7"), "{answer}");
    assert_eq!(answer["result"], reply);
    s.finish();
}

#[test]
fn supervisor_catalog_fetch_follows_cursors() {
    let mut setup = Setup::new().arg("--no-gating").env("FAKE_PAGE_SIZE", "1");
    let tools_file = setup.project.scratch().join("tools.json");
    let tools = json!([
        {"name": "echo", "description": "first", "inputSchema": {"type": "object"}},
        {"name": "write", "description": "second", "inputSchema": {"type": "object"}},
        {"name": "third", "description": "only on page 3", "inputSchema": {"type": "object"}},
    ]);
    std::fs::write(&tools_file, tools.to_string()).unwrap();
    setup = setup.env("FAKE_TOOLS", tools_file.to_str().unwrap());
    let mut s = setup.start();
    s.initialize();
    s.server_started();
    // Before the catalog is known: the (empty) last known catalog, in one page.
    s.wait_status("server ready", |v| v["server"]["phase"] == "Ready");
    let st = s.status_file().unwrap();
    assert_eq!(
        st["catalogTools"],
        json!(["echo", "third", "write"]),
        "{st}"
    );

    // The host pages through tools/list itself.
    let mut cursor: Option<String> = None;
    let mut got = Vec::new();
    for page in 0..3 {
        let id = format!("\"page-{page}\"");
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let r = s.roundtrip(&id, "tools/list", Some(params));
        let result = r.result();
        assert_eq!(result["tools"].as_array().unwrap().len(), 1, "{}", r.raw);
        got.push(result["tools"][0].clone());
        cursor = result["nextCursor"].as_str().map(str::to_string);
        if page < 2 {
            assert_eq!(
                cursor,
                Some(format!("fake-cursor-{}", page + 1)),
                "{}",
                r.raw
            );
        } else {
            assert_eq!(cursor, None, "{}", r.raw);
        }
    }
    assert_eq!(Value::Array(got), tools);
    // The host's digest now matches the supervisor's: the third tool is callable (neither
    // catalog_stale nor unknown_tool), which needs the supervisor's own fetch to have paged too.
    let m = s.call("11", "third", json!({"x": 1}));
    assert_eq!(m.result()["isError"], Value::Null, "{}", m.raw);
    assert_eq!(
        m.result()["structuredContent"]["arguments"],
        json!({"x": 1})
    );

    // The supervisor's own pages went out with integer ids and the server's cursors.
    let own: Vec<Value> = s
        .fake_log()
        .into_iter()
        .filter(|l| l["method"] == "tools/list")
        .take(3)
        .collect();
    assert_eq!(own.len(), 3, "{own:?}");
    assert_eq!(own[0]["params"], json!({}));
    assert_eq!(own[1]["params"], json!({"cursor": "fake-cursor-1"}));
    assert_eq!(own[2]["params"], json!({"cursor": "fake-cursor-2"}));
    assert!(own.iter().all(|l| l["id"].is_u64()), "{own:?}");
    s.finish();
}

#[test]
fn legacy_handshake_is_replayed_to_the_server_before_anything_else() {
    let mut s = Setup::new().arg("--no-gating").start();
    let params = json!({"protocolVersion": "2025-03-26", "capabilities": {"roots": {"listChanged": true}},
                        "clientInfo": {"name": "legacy-host", "version": "9.9.9"}});
    let init = s.roundtrip("1", "initialize", Some(params.clone()));
    assert_eq!(
        init.result()["protocolVersion"],
        json!("2025-03-26"),
        "{}",
        init.raw
    );
    assert_eq!(
        init.result()["capabilities"],
        json!({"tools": {"listChanged": true}})
    );
    s.notify("notifications/initialized", None);
    s.server_started();
    s.sync_tools(&["echo", "write"]);
    let log = s.fake_log();
    assert!(log.len() >= 3, "{log:?}");
    assert_eq!(log[0]["method"], "initialize");
    assert!(log[0]["id"].is_u64());
    assert_eq!(
        log[0]["params"], params,
        "the host's initialize params are replayed unchanged"
    );
    assert_eq!(
        log[1],
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    );
    assert_eq!(log[2]["method"], "tools/list");
    // The real server's answer was compatible with what was announced: no disconnect.
    assert!(
        !s.stderr_lines()
            .iter()
            .any(|l| l.starts_with("connection closed"))
    );
    s.finish();
}

#[test]
fn invalid_host_messages_get_errors_and_the_session_continues() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.send("garbage{");
    let m = s.message("parse error for garbage", |m| {
        m.is_response() && m.id.as_deref() == Some("null")
    });
    assert_eq!(
        m.value,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700,
            "message": "not JSON: expected value at line 1 column 1", "data": {"source": "cargo-mcp-dev"}}})
    );
    s.wait_stderr("host sent an invalid message (not JSON: expected value at line 1 column 1); answered with an error");

    // Truncated JSON: the id is recovered so the host can match the error.
    s.send(r#"{"jsonrpc":"2.0","id":41,"method":"tools/list","params":"#);
    let m = s.response("41");
    assert_eq!(m.error()["code"], json!(-32700), "{}", m.raw);
    assert_eq!(m.error()["data"]["source"], json!("cargo-mcp-dev"));

    // Valid JSON that is not a JSON-RPC message: -32600.
    s.send(r#"{"id":42,"method":"ping"}"#);
    let m = s.response("42");
    assert_eq!(
        m.value,
        json!({"jsonrpc": "2.0", "id": 42, "error": {"code": -32600,
            "message": "not a JSON-RPC 2.0 message: missing \"jsonrpc\": \"2.0\"", "data": {"source": "cargo-mcp-dev"}}})
    );
    s.send(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
    let m = s.message("batch refused", |m| {
        m.is_response() && m.error_code() == Some(-32600) && m.id.as_deref() != Some("42")
    });
    assert_eq!(
        m.error()["message"],
        json!("not a JSON-RPC 2.0 message: expected a JSON object (batches are not supported)")
    );

    // The session goes on: ping (ours), \r\n framing, and a real call through the server.
    s.send_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":43,\"method\":\"ping\"}\r\n");
    let m = s.response("43");
    assert_eq!(m.value, json!({"jsonrpc": "2.0", "id": 43, "result": {}}));
    s.ready_legacy();
    let m = s.call("44", "echo", json!({"still": "alive"}));
    assert_echo(&m, &json!({"still": "alive"}), "r1");
    s.finish();
}

#[test]
fn oversize_host_line_is_refused_and_a_17_mib_answer_passes() {
    let mut s = Setup::new().arg("--no-gating").tools(&["oversize"]).start();
    s.ready_legacy();
    let pad = 70 * 1024 * 1024;
    let mut line = br#"{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"name":"echo","arguments":{"pad":""#.to_vec();
    line.resize(line.len() + pad, b'x');
    line.extend_from_slice(b"\"}}}");
    let len = line.len();
    line.push(b'\n');
    s.send_bytes(&line);
    drop(line);
    let m = s.response_within(r#""big""#, Duration::from_secs(30));
    assert_eq!(
        m.value,
        json!({"jsonrpc": "2.0", "id": "big", "error": {"code": -32700, "message": "message too large",
            "data": {"bytes": len, "source": "cargo-mcp-dev"}}})
    );
    s.wait_stderr(&format!(
        "host sent a message of {len} bytes, over the line limit; answered with a parse error"
    ));
    // The oversize request never reached the server.
    assert!(
        !s.fake_log_raw()
            .iter()
            .any(|l| l.contains("\"big\"") || l.len() > 1 << 20)
    );

    let m = s.roundtrip("2", "ping", None);
    assert_eq!(m.value, json!({"jsonrpc": "2.0", "id": 2, "result": {}}));

    let t = Instant::now();
    let m = s.call("3", "oversize", json!({}));
    let text = m.result()["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        text.len(),
        17 * 1024 * 1024,
        "17 MiB answer must pass unchanged"
    );
    assert!(text.bytes().all(|b| b == b'x'));
    assert!(t.elapsed() < Duration::from_secs(20));
    s.finish();
}

#[test]
fn non_json_on_server_stdout_is_reported_never_forwarded() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["noise"])
        .env("FAKE_STDOUT_NOISE", "1")
        .start();
    s.initialize();
    let (_, epoch) = s.server_started();
    let short = short_epoch(&epoch).to_string();
    s.wait_stderr(&format!(
        "server wrote non-JSON to stdout: hello from println ({LABEL} epoch {short}; use stderr for logs)"
    ));
    s.sync_tools(&["echo", "write", "noise"]);
    let m = s.call("1", "noise", json!({"n": 1}));
    assert_eq!(
        m.result()["structuredContent"]["arguments"],
        json!({"n": 1})
    );
    s.wait_stderr(&format!(
        "server wrote non-JSON to stdout: noise from fake-server: this line is not JSON-RPC ({LABEL} epoch {short}; use stderr for logs)"
    ));
    s.inbox.pending();
    assert!(
        !s.inbox
            .all
            .iter()
            .any(|m| m.raw.contains("hello from println")
                || m.raw.contains("noise from fake-server")),
        "noise reached the host"
    );
    s.finish(); // also asserts nothing non-JSON was written to the host
}

#[test]
fn server_stderr_is_passed_through_with_label_and_epoch() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.initialize();
    let (pid, epoch) = s.server_started();
    let banner = format!(
        "[{LABEL} {}] fake-server: revision r1 core core-1 pid {pid}",
        short_epoch(&epoch)
    );
    // The server may print its banner before or after the supervisor's `server started:` line
    // (two threads write stderr), so look at every line so far rather than after a cursor.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !s.stderr_lines().iter().any(|l| l == &banner) {
        assert!(
            std::time::Instant::now() < deadline,
            "no `{banner}` in {:#?}",
            s.stderr_lines()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(short_epoch(&epoch).len(), 12);
    s.finish();
}

#[test]
fn modern_era_discover_listen_and_restart() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["change_tools"])
        .timeout(Duration::from_secs(90))
        .start();
    let meta = modern_meta();
    // Prompts as well as tools: a stream the server has a part in (a tools-only one is the
    // supervisor's alone and never reaches the server).
    let listen = json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true},
                        "_meta": meta});
    s.request(r#""sub-1""#, "subscriptions/listen", Some(listen.clone()));
    let (_, e1) = s.server_started();
    let ack = s.notification("notifications/subscriptions/acknowledged");
    assert_eq!(
        ack.value,
        json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
               "params": {"_meta": {SUBSCRIPTION_ID: "sub-1"}, "notifications": {"toolsListChanged": true}}}),
        "acknowledgement must carry the host's listen id"
    );
    s.wait_status("server ready", |v| v["server"]["phase"] == "Ready");

    // server/discover once the server is up: the real answer, listChanged advertised.
    let d = s.roundtrip("\"d1\"", "server/discover", Some(json!({"_meta": meta})));
    assert_eq!(
        d.value,
        json!({"jsonrpc": "2.0", "id": "d1", "result": {
            "supportedVersions": [MODERN_VERSION],
            "capabilities": {"tools": {"listChanged": true}},
            "ttlMs": 0, "cacheScope": "public", "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fake-server", "version": "r1"}}}})
    );
    let tools = s.list_tools_with(Some(&meta));
    assert_eq!(tools.len(), 3);
    let m = s.roundtrip(
        "\"c1\"",
        "tools/call",
        Some(json!({"name": "echo", "arguments": {"a": 1}, "_meta": meta})),
    );
    assert_eq!(m.result()["resultType"], json!("complete"), "{}", m.raw);
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r1"));

    // Restart: the listen is re-opened on the new child with the host's params.
    s.set_revision("r2");
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    s.wait_status("new server ready", |v| {
        v["server"]["epoch"] == json!(e2) && v["server"]["phase"] == "Ready"
    });
    let log = s.fake_log();
    let start = log
        .iter()
        .rposition(|l| l["method"] == "server/discover" && l["id"].is_u64())
        .expect("the new child got server/discover");
    let reopened: Vec<&Value> = log[start..]
        .iter()
        .filter(|l| l["method"] == "subscriptions/listen")
        .collect();
    assert_eq!(reopened.len(), 1, "{log:?}");
    assert_eq!(reopened[0]["params"], listen);
    assert!(reopened[0]["id"].is_u64());

    // A catalog change on the new child reaches the host tagged with the host's subscription id.
    let m = s.roundtrip(
        "\"c2\"",
        "tools/call",
        Some(json!({"name": "change_tools", "arguments": {}, "_meta": meta})),
    );
    assert_eq!(
        m.result()["structuredContent"]["toolCount"],
        json!(4),
        "{}",
        m.raw
    );
    let n = s.notification("notifications/tools/list_changed");
    assert_eq!(
        n.value,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed",
               "params": {"_meta": {SUBSCRIPTION_ID: "sub-1"}}})
    );
    // Nothing tagged with one of the supervisor's own ids leaked to the host.
    s.inbox.pending();
    for msg in &s.inbox.all {
        if let Some(sid) = msg
            .value
            .pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId")
        {
            assert_eq!(sid, &json!("sub-1"), "leaked subscription id: {}", msg.raw);
        }
    }
    // The host opened one subscription: the re-opening on the new child is the supervisor's
    // business, so its acknowledgement must not reach the host a second time.
    let acks = s
        .inbox
        .all
        .iter()
        .filter(|m| m.method() == Some("notifications/subscriptions/acknowledged"))
        .count();
    assert_eq!(
        acks, 1,
        "the host got {acks} acknowledgements for one listen"
    );
    s.finish();
}

#[test]
fn modern_listen_opened_during_cold_start_hears_the_first_catalog() {
    let mut s = Setup::new().arg("--no-gating").start();
    let meta = modern_meta();
    s.request(
        r#""sub-1""#,
        "subscriptions/listen",
        Some(json!({"notifications": {"toolsListChanged": true}, "_meta": meta})),
    );
    // Held until the real server answers (never `[]` from nobody): the host holds the real
    // catalog from its first list, so no list_changed is owed.
    let l = s.roundtrip(r#""l0""#, "tools/list", Some(json!({"_meta": meta})));
    let names: Vec<&str> = l.result()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["echo", "write"], "{}", l.raw);
    let ack = s.notification_within(
        "notifications/subscriptions/acknowledged",
        Duration::from_secs(10),
    );
    assert_eq!(
        ack.value["params"]["_meta"][SUBSCRIPTION_ID],
        json!("sub-1")
    );
    let extra = s.drain_for(Duration::from_millis(500));
    assert!(
        !extra
            .iter()
            .any(|m| m.method() == Some("notifications/tools/list_changed")),
        "{extra:?}"
    );
    s.finish();
}

trait ErrorCode {
    fn error_code(&self) -> Option<i64>;
}

impl ErrorCode for common::rpc::Msg {
    fn error_code(&self) -> Option<i64> {
        self.value.pointer("/error/code").and_then(Value::as_i64)
    }
}

#[test]
fn server_discover_before_the_first_build_falls_back_to_initialize() {
    // A probe wait shorter than any build: the probe is answered before a server exists.
    let mut s = Setup::new()
        .args(&["--no-gating", "--discover-wait", "10ms"])
        .start();
    let d = s.roundtrip(
        r#""d0""#,
        "server/discover",
        Some(json!({"_meta": modern_meta()})),
    );
    assert_eq!(
        d.value,
        json!({"jsonrpc": "2.0", "id": "d0", "error": {"code": -32601,
            "message": "server/discover is not available while the server is being built; use initialize",
            "data": {"error": "server_building", "source": "cargo-mcp-dev"}}})
    );
    // The client falls back to the legacy handshake, which then works end to end.
    s.ready_legacy();
    let m = s.call("1", "echo", json!({"era": "legacy"}));
    assert_echo(&m, &json!({"era": "legacy"}), "r1");
    assert_eq!(s.status_file().unwrap()["era"], json!("legacy"));
    s.finish();
}

#[test]
fn server_discover_during_a_quick_first_build_gets_the_servers_answer() {
    // A probe wait longer than the fake server's quick build (the default 1 s is under Claude
    // Code's 3 s probe timeout, and a loaded CI machine can take longer than that to build).
    let mut s = Setup::new()
        .args(&["--no-gating", "--discover-wait", "20s"])
        .start();
    let d = s.roundtrip(
        r#""d0""#,
        "server/discover",
        Some(json!({"_meta": modern_meta()})),
    );
    assert_eq!(
        d.result()["supportedVersions"],
        json!(["2026-07-28"]),
        "{}",
        d.raw
    );
    assert_eq!(
        d.result()["capabilities"]["tools"]["listChanged"],
        json!(true),
        "{}",
        d.raw
    );
    s.finish();
}

#[test]
fn host_cancellation_reaches_the_server_under_the_server_side_id() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_CALL_DELAY_MS", "2000")
        .start();
    s.ready_legacy();
    s.request(
        r#""w""#,
        "tools/call",
        Some(json!({"name": "write", "arguments": {"marker": "cancel me"}})),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let call_id = loop {
        if let Some(c) = s.fake_log().iter().find(|l| l["method"] == "tools/call") {
            break c["id"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the call never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    s.notify(
        "notifications/cancelled",
        Some(json!({"requestId": "w", "reason": "user pressed stop"})),
    );
    let cancelled = loop {
        if let Some(c) = s
            .fake_log()
            .iter()
            .find(|l| l["method"] == "notifications/cancelled")
        {
            break c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the cancellation never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        cancelled["params"],
        json!({"requestId": call_id, "reason": "user pressed stop"})
    );
    // The server dropped the call: no side effect, and no answer is invented for the host.
    let late = s.drain_for(Duration::from_millis(2500));
    assert!(
        late.iter().all(|m| m.id.as_deref() != Some(r#""w""#)),
        "{late:?}"
    );
    assert!(s.side_effects().is_empty());
    s.finish();
}

#[test]
fn a_server_flooding_stderr_does_not_stall_the_session() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["flood_stderr"])
        .env("FAKE_FLOOD_LINES", "20000")
        .start();
    s.ready_legacy();
    let m = s.call("1", "flood_stderr", json!({}));
    assert!(
        m.result().get("isError").is_none_or(|e| e == &json!(false)),
        "{}",
        m.raw
    );
    // The session still answers promptly while (or after) 20 000 lines pass through.
    let m = s.call("2", "echo", json!({"after": "flood"}));
    assert_eq!(
        m.result()["structuredContent"]["arguments"],
        json!({"after": "flood"}),
        "{}",
        m.raw
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while s
        .stderr_lines()
        .iter()
        .filter(|l| l.starts_with("[fake-server "))
        .count()
        < 20_000
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the flood did not pass through in full"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.finish();
}
