//! `cargo-mcp-dev run` deciding whether a `tools/call` is forwarded: catalog revisions
//! (`catalog_stale`, `unknown_tool`), epoch-bound approvals over the control socket, and the
//! state `status --json` reports.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::session::Setup;
use serde_json::{Value, json};

/// First contact issue, item 3 and 4: staleness is judged per tool against what this host was
/// shown. A changed tool is refused with its new definition (which counts as shown, so the retry
/// runs); an unchanged tool and a tool the host was never shown go through.
#[test]
fn a_changed_tool_is_stale_per_tool_and_its_refusal_carries_the_new_definition() {
    let alt = tempfile::NamedTempFile::new().unwrap();
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["change_tools"])
        .env("FAKE_TOOLS_ALT", alt.path().to_str().unwrap())
        .start();
    let (_, e1) = s.ready_legacy();
    let shown = s.list_tools();
    let before = s.wait_status("host listed", |v| !v["hostCatalog"].is_null());
    let host_digest = before["hostCatalog"].as_str().unwrap().to_string();
    assert_eq!(before["catalog"]["digest"], json!(host_digest), "{before}");
    // The server's next list: `echo` gets a new description, `added` appears.
    let mut next = shown.clone();
    for t in &mut next {
        if t["name"] == json!("echo") {
            t["description"] = json!("Echo the arguments back, now with a side effect");
        }
    }
    next.push(json!({"name": "added", "description": "Added", "inputSchema": {"type": "object"}}));
    std::fs::write(alt.path(), serde_json::to_vec(&next).unwrap()).unwrap();

    let m = s.call("1", "change_tools", json!({}));
    assert_eq!(
        m.result()["structuredContent"]["toolCount"],
        json!(4),
        "{}",
        m.raw
    );
    let n = s.notification("notifications/tools/list_changed");
    assert_eq!(
        n.value,
        json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    );
    let line = s.wait_stderr("catalog changed: revision 2 (sha256:");
    assert!(
        line.contains("1 added") && line.contains("1 changed"),
        "{line}"
    );
    let st = s.wait_status("revision 2", |v| v["catalog"]["revision"] == json!(2));
    let d2 = st["catalog"]["digest"].as_str().unwrap().to_string();
    assert_ne!(d2, host_digest);
    assert_eq!(st["staleTools"], json!(["echo"]), "{st}");

    // Unchanged tool: forwarded although the host has not refetched.
    let m = s.call("2", "write", json!({"marker": "unchanged"}));
    assert!(
        !m.result()["isError"].as_bool().unwrap_or(false),
        "{}",
        m.raw
    );
    // Changed tool: refused, with the new definition and the diff.
    let m = s.call("3", "echo", json!({"stale": true}));
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("catalog_stale"), "{p}");
    assert_eq!(p["currentEpoch"], json!(e1));
    assert_eq!(p["currentCatalog"], json!({"revision": 2, "digest": d2}));
    assert_eq!(
        p["currentDefinition"]["description"],
        json!("Echo the arguments back, now with a side effect")
    );
    assert!(!p["changes"].as_array().unwrap().is_empty(), "{p}");
    s.wait_stderr("the host has not refetched tools/list after list_changed (catalog revision 2)");
    s.wait_stderr("call denied: echo (catalog_stale): ");
    // The refusal showed the new definition: the retry runs, without a refetch.
    let m = s.call("4", "echo", json!({"fresh": true}));
    assert_eq!(
        m.result()["structuredContent"]["arguments"],
        json!({"fresh": true})
    );
    // A tool this host was never shown is judged against the current catalog.
    let m = s.call("5", "added", json!({}));
    assert!(
        !m.result()["isError"].as_bool().unwrap_or(false),
        "{}",
        m.raw
    );
    // Only one list_changed reached the host (the server's own was not forwarded as well).
    let extra = s.drain_for(Duration::from_millis(500));
    assert!(
        !extra
            .iter()
            .any(|m| m.method() == Some("notifications/tools/list_changed")),
        "{extra:?}"
    );
    let tools = s.list_tools();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["echo", "write", "change_tools", "added"]);

    let m = s.call("6", "nonexistent", json!({}));
    assert_eq!(
        m.tool_error_payload(),
        json!({"error": "unknown_tool", "reason": "tool is not in the current catalog",
               "currentEpoch": e1, "currentCatalog": {"revision": 2, "digest": d2},
               "retry": "refresh tool metadata (tools/list) and call a listed tool",
               "tool": "nonexistent"})
    );
    let log = s.fake_log();
    let called: Vec<&Value> = log
        .iter()
        .filter(|l| l["method"] == "tools/call")
        .map(|l| &l["params"]["name"])
        .collect();
    assert_eq!(
        called,
        [
            &json!("change_tools"),
            &json!("write"),
            &json!("echo"),
            &json!("added")
        ],
        "the stale call never reached the server: {log:?}"
    );
    s.finish();
}

/// One raw request on the supervisor's control socket, with the proof made from the key in
/// `home` (what `approve` sends).
fn control(socket: &str, home: &std::path::Path, request: &Value) -> Value {
    let keys = cargo_mcp_dev::audit::KeyStore::at(home);
    let proof = cargo_mcp_dev::face::control_socket::ControlProof::load(&keys).unwrap();
    let mut request = request.clone();
    proof.attach(std::path::Path::new(socket), &mut request);
    raw_control(socket, &request)
}

/// One raw request as a hand-written client sends it: no proof unless it carries one.
fn raw_control(socket: &str, request: &Value) -> Value {
    let mut stream = UnixStream::connect(socket).expect("connect control socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    writeln!(stream, "{request}").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).expect("control answer is JSON")
}

#[test]
fn approvals_are_bound_to_the_epoch_and_status_shows_them() {
    let mut s = Setup::new().timeout(Duration::from_secs(90)).start();
    let (pid1, e1) = s.ready_legacy();

    let m = s.call("1", "write", json!({"marker": "a"}));
    assert_eq!(
        m.tool_error_payload(),
        json!({"error": "authorization_required",
               "reason": "tool requires human approval for this execution epoch",
               "currentEpoch": e1,
               "retry": "request authorization from the user, then call again", "tool": "write"})
    );
    assert!(s.side_effects().is_empty());

    let out = s.cli(&["status", "--json"]);
    out.expect_code(0);
    let st: Value = serde_json::from_str(&out.stdout).expect("status --json");
    assert_eq!(st["label"], json!("fake-server"));
    assert_eq!(st["server"]["epoch"], json!(e1));
    assert_eq!(st["server"]["pid"], json!(pid1));
    assert_eq!(st["state"], json!("catalog-ready"));
    assert_eq!(st["grants"], json!([]));
    assert_eq!(st["pendingApproval"]["tools"], json!(["write"]));

    // Issue 12, high finding "`approve --yes` without `--tool` grants every tool the agent asked
    // for": `--yes` alone is a usage error and grants nothing.
    let out = s.cli(&["approve", "--yes"]);
    out.expect_code(2);
    assert!(out.stderr.contains("--all-requested"), "{}", out.stderr);
    let st: Value = serde_json::from_str(&s.cli(&["status", "--json"]).stdout).unwrap();
    assert_eq!(st["grants"], json!([]), "{st}");
    // With --all-requested: the tools of pending denials, listed before they are granted.
    let out = s.cli(&["approve", "--yes", "--all-requested"]);
    out.expect_code(0);
    assert!(
        out.stderr.contains("granting every requested tool: write"),
        "{}",
        out.stderr
    );
    let grant_line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("approved: write for epoch "))
        .unwrap_or_else(|| panic!("{}", out.stderr))
        .to_string();
    assert!(
        grant_line.starts_with(&format!("approved: write for epoch {e1} (grant ")),
        "{grant_line}"
    );
    s.wait_stderr(&format!("approved: write for epoch {e1} (grant "));

    let out = s.cli(&["status", "--json"]);
    let st: Value = serde_json::from_str(&out.stdout).expect("status --json");
    assert_eq!(st["state"], json!("ready"), "{st}");
    let grants = st["grants"].as_array().unwrap();
    assert_eq!(grants.len(), 1, "{st}");
    assert_eq!(grants[0]["executionEpoch"], json!(e1));
    assert_eq!(grants[0]["toolScope"], json!(["write"]));
    assert!(grant_line.contains(grants[0]["id"].as_str().unwrap()));
    assert_eq!(st["pendingApproval"]["tools"], json!([]));

    let m = s.call("2", "write", json!({"marker": "b"}));
    assert_eq!(
        m.result()["structuredContent"]["args"],
        json!({"marker": "b"}),
        "{}",
        m.raw
    );
    assert_eq!(s.side_effects().len(), 1);

    // A new epoch: the grant is stale, and a decision made for the old epoch is void.
    s.set_revision("r2");
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    let st = s.wait_status("new server ready", |v| {
        v["server"]["epoch"] == json!(e2) && v["server"]["phase"] == "Ready"
    });
    let socket = st["socket"].as_str().expect("socket in status").to_string();
    // A hand-written client of the same user (an agent's shell whose sandbox lets unix sockets
    // through) cannot approve: it cannot prove it reads the state directory (issue 36).
    for forged in [
        json!({"op": "approve", "epoch": e2, "tools": ["write"], "credentialScopes": []}),
        json!({"op": "approve", "epoch": e2, "tools": ["write"], "credentialScopes": [], "proof": "0".repeat(64)}),
    ] {
        let answer = raw_control(&socket, &forged);
        assert_eq!(answer["ok"], json!(false), "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("does not prove"),
            "{answer}"
        );
    }
    assert_eq!(s.status_file().unwrap()["grants"], json!([]));
    let answer = control(
        &socket,
        &s.project.home,
        &json!({"op": "approve", "epoch": e1, "tools": ["write"], "credentialScopes": []}),
    );
    assert_eq!(
        answer,
        json!({"ok": false, "error": format!(
            "the decision was for epoch {e1}, but the server is now {e2}; review the new epoch and approve again")})
    );
    let st = s.status_file().unwrap();
    assert_eq!(st["grants"], json!([]), "{st}");
    // The file the real supervisor writes is exactly the typed status document.
    let typed: cargo_mcp_dev::session::snapshot::StatusSnapshot =
        serde_json::from_value(st.clone()).unwrap_or_else(|e| panic!("{e}: {st}"));
    assert_eq!(typed.server.map(|s| s.epoch.to_string()), Some(e2.clone()));
    let m = s.call("3", "write", json!({"marker": "c"}));
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("authorization_stale"), "{p}");
    assert_eq!(p["approvedEpoch"], json!(e1));
    assert_eq!(p["currentEpoch"], json!(e2));
    assert_eq!(s.side_effects().len(), 1, "the stale call must not run");

    let out = s.cli(&["approve", "--list"]);
    out.expect_code(0);
    assert_eq!(out.stdout.trim(), "no live grants");
    s.finish();
}

#[test]
fn control_commands_without_a_supervisor_exit_106() {
    let setup = Setup::new();
    let out = setup.project.run(["status", "--json"]);
    out.expect_code(106);
    assert!(
        out.stderr
            .contains("no running `cargo mcp-dev run` for `fake-server` answered"),
        "{}",
        out.stderr
    );
}

/// `approve` without `--yes` asks the human at the terminal; with no terminal it refuses
/// clearly (usage error) and grants nothing, for a tool and for one call alike.
#[test]
fn approve_without_a_terminal_asks_for_yes_and_grants_nothing() {
    let mut s = Setup::new().start();
    s.ready_legacy();
    let out = s.cli(&["approve", "--tool", "write"]);
    out.expect_code(2);
    assert!(
        out.stderr.contains("stdin is not a terminal: pass --yes"),
        "{}",
        out.stderr
    );
    let m = s.call(r#""w1""#, "write", json!({"marker": "x"}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required"),
        "nothing was granted"
    );
    s.finish();
}
