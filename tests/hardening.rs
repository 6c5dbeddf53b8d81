//! Issue 12 (hardening): one test per finding that needs a real `cargo-mcp-dev run` (the fake
//! std-only server from `tests/fixtures/fake-server`). Findings covered by unit tests are named in
//! the module they fix (`proxy::envelope`, `sanitize`, `commands::approve`, `audit::*`, `store`,
//! `proxy::outlet`, `control`, `fsutil`).

mod common;

use std::time::Duration;

use common::session::Setup;
use serde_json::json;

/// Critical finding "`id: null` bypasses approvals and the audit log": a `tools/call` with
/// `"id": null`, or with no id at all, never reaches the server (no side effect, nothing in
/// `FAKE_LOG`), and the one with `"id": null` is answered `-32600` with id null.
#[test]
fn id_null_and_id_less_calls_never_reach_the_server() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.ready_legacy();
    s.send(r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"write","arguments":{"marker":"null-id"}}}"#);
    let m = s.message("an answer with id null", |m| {
        m.id.as_deref() == Some("null")
    });
    assert_eq!(m.error()["code"], json!(-32600), "{}", m.raw);
    s.send(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write","arguments":{"marker":"no-id"}}}"#);
    // A normal call afterwards still works, and is the only write that ran.
    let m = s.call("7", "write", json!({"marker": "real"}));
    assert_eq!(
        m.result()["structuredContent"]["args"],
        json!({"marker": "real"})
    );
    let effects = s.side_effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    let log = s.fake_log_raw();
    assert!(
        !log.iter()
            .any(|l| l.contains("null-id") || l.contains("no-id")),
        "the server received a call without an id: {log:?}"
    );
    s.finish();
}

/// High finding "terminal escape injection": a tool name with escape sequences chosen by the
/// agent, and a catalog description chosen by the server, are printed on stderr without a
/// single ESC/BEL byte reaching the terminal.
#[test]
fn escape_sequences_never_reach_the_terminal() {
    let mut s = Setup::new().start();
    s.ready_legacy();
    let evil = "\u{1b}[2J\u{1b}]0;pwned\u{7}write";
    let m = s.call("1", evil, json!({}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("unknown_tool"),
        "{}",
        m.raw
    );
    let line = s.wait_stderr("call denied: ");
    assert!(line.contains("\\x1b[2J\\x1b]0;pwned\\x07write"), "{line}");
    s.send("hello \u{1b}[31m not json");
    s.drain_for(Duration::from_millis(300));
    let all = s.stderr_lines().join("\n");
    assert!(
        !all.contains('\u{1b}') && !all.contains('\u{7}'),
        "raw control bytes on stderr: {all:?}"
    );
    s.finish();
}

/// High finding "a set-aside audit log bricks `run`": a torn last line (a crash mid-append)
/// used to make every later `run` exit 1. Now the log and its anchor are kept aside, a new chain
/// starts (one status line), and `audit verify` reports the break with both chains (exit 109).
#[test]
fn torn_audit_log_is_set_aside_and_run_starts() {
    use cargo_mcp_dev::audit::{AuditLog, KeyStore};
    use std::io::Write;
    let setup = Setup::new();
    let log_path = setup
        .project
        .target_dir()
        .join("mcp-dev/audit/fake-server.jsonl");
    let keys = KeyStore::at(&setup.project.home);
    {
        let mut log = AuditLog::open(&log_path, &keys).unwrap();
        log.append("run_started", "R0", None, json!({"agentRun": "R0"}))
            .unwrap();
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .unwrap()
        .write_all(b"{\"v\":1,\"seq\":2,\"ti")
        .unwrap();
    let mut s = setup.start();
    let line = s.wait_stderr("audit log set aside: ");
    assert!(line.contains("incomplete"), "{line}");
    s.ready_legacy();
    let project_run = s.cli(&["audit", "verify"]);
    s.finish();
    project_run.expect_code(109);
    assert!(
        project_run.stderr.contains("chain break at record 1"),
        "{}",
        project_run.stderr
    );
    assert!(
        project_run
            .stderr
            .contains("earlier chain failed verification"),
        "{}",
        project_run.stderr
    );
}

/// Medium finding "the stored executable is run without checking it still has the hashed
/// bytes": an entry replaced after capture is refused at launch, naming the digest that did not
/// match, and the replacement never runs.
#[test]
fn replaced_store_entry_is_refused_at_launch() {
    let mut s = Setup::new().start();
    s.ready_legacy();
    let store = s.project.target_dir().join("mcp-dev/store");
    let entry = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("sha256-")
        })
        .expect("a store entry");
    let digest = entry.file_name().unwrap().to_string_lossy()["sha256-".len()..].to_string();
    let marker = s.project.scratch().join("evil-ran");
    std::fs::remove_file(&entry).unwrap();
    std::fs::write(&entry, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&entry, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    s.cli(&["restart"]).expect_code(0);
    let line = s.wait_stderr_matching("a refused launch", |l| {
        l.contains("does not have the bytes that were hashed")
    });
    assert!(line.contains(&digest), "{line}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "the replaced entry ran");
}
