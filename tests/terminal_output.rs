//! Untrusted text (tool names, call ids) on the human's terminal through `audit show`,
//! `status --json` and `run -v`. Red-team round 10: each test failed on the code as found.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use cargo_mcp_dev::audit::{AuditLog, KeyStore};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn setup() -> (tempfile::TempDir, PathBuf, KeyStore, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let log = tmp.path().join("audit/srv.jsonl");
    (tmp, state.clone(), KeyStore::at(state), log)
}

fn audit_cmd(state: &Path, log: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
        .args(["mcp-dev", "audit"])
        .args(args)
        .arg(log)
        .env("CARGO_MCP_DEV_HOME", state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `audit show`: an agent-chosen tool name holding a newline is printed as two lines, the
/// second one a forged row of the activity table (`stdout_text` escapes controls per line but
/// keeps the newlines, and the journal table puts the raw name in a cell).
#[test]
fn audit_show_keeps_a_tool_names_newline_inside_its_cell() {
    let (_tmp, state, keys, log) = setup();
    let mut w = AuditLog::open(&log, &keys).unwrap();
    let forged = "  2026-01-01T00:00:00.000Z  R  \"forged\"  rm_rf  E1  rev 1  g-1  ok (1 ms)";
    w.append(
        "tool_called",
        "R",
        Some("E1"),
        json!({"callId": "\"c1\"", "tool": format!("x\n{forged}")}),
    )
    .unwrap();
    w.flush().unwrap();
    let out = audit_cmd(&state, &log, &["show", "--journal", "activity"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("  2026-01-01T00:00:00.000Z")),
        "a tool name's newline forged a row of `audit show`:\n{text}"
    );
}

/// `audit show --json`: C1 controls and bidi overrides in an agent-chosen tool name reach the
/// terminal as raw characters (JSON escapes only C0), while `audit tail --json` writes them as
/// JSON escapes (`sanitize::json_text`).
#[test]
fn audit_show_json_escapes_c1_and_bidi_characters() {
    let (_tmp, state, keys, log) = setup();
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append(
        "tool_called",
        "R",
        Some("E1"),
        json!({"callId": "\"c1\"", "tool": "a\u{9b}31m\u{202E}b\u{7f}"}),
    )
    .unwrap();
    w.flush().unwrap();
    let out = audit_cmd(&state, &log, &["show", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("\"c1\"") || text.contains("c1"),
        "the record is shown: {text}"
    );
    for c in ['\u{9b}', '\u{202E}', '\u{7f}'] {
        assert!(
            !text.contains(c),
            "U+{:04X} reached the terminal raw from `audit show --json`: {text:?}",
            c as u32
        );
    }
}

/// `status --json` prints the status document with `to_string_pretty`: JSON escapes C0
/// controls only, so a tool name the server lists and the agent calls (`recentDenials`,
/// `deniedCalls`, `pendingApproval`) puts C1 controls (`\u{9b}` is CSI) and bidi overrides on
/// the human's terminal raw. `audit tail --json` writes them as JSON escapes
/// (`sanitize::json_text`), the README says `--message-format json` events are cleaned too.
#[test]
fn status_json_escapes_c1_and_bidi_characters() {
    let name = "a\u{9b}31m\u{202E}b";
    let mut s = common::session::Setup::new().tools(&[name]).start();
    s.ready_legacy();
    let m = s.call("901", name, json!({}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required"),
        "{}",
        m.raw
    );
    let out = s.cli(&["status", "--json"]);
    out.expect_code(0);
    assert!(
        out.stdout.contains("31m"),
        "the denial is listed: {}",
        out.stdout
    );
    for c in ['\u{9b}', '\u{202E}'] {
        assert!(
            !out.stdout.contains(c),
            "U+{:04X} reached the terminal raw from `status --json`: {:?}",
            c as u32,
            out.stdout
        );
    }
}

/// With `-v`, a host cancelling a forwarded call prints `host cancelled <tool> (<id>)`
/// through `status::verbose_line`, which keeps newlines (`sanitize::lines`): a tool name the
/// server lists holding a newline puts a forged supervisor line (`approved: …`) on stderr.
#[test]
fn a_verbose_line_cannot_forge_a_supervisor_line() {
    let name = "x\napproved: write for epoch E (grant g-forged)";
    let mut s = common::session::Setup::new()
        .tools(&["stall", name])
        .args(&["--no-gating", "-v"])
        .env("FAKE_STALL_MS", "5000")
        .start();
    s.ready_legacy();
    // The server stops reading: the next call is forwarded and stays in flight.
    s.request(
        "901",
        "tools/call",
        Some(json!({"name": "stall", "arguments": {}})),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.request(
        "902",
        "tools/call",
        Some(json!({"name": name, "arguments": {}})),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.notify("notifications/cancelled", Some(json!({"requestId": 902})));
    s.wait_stderr_matching("the cancel line", |l| l.starts_with("host cancelled x"));
    let lines = s.stderr_lines();
    assert!(
        !lines.iter().any(|l| l.starts_with("approved: write")),
        "a server-chosen tool name forged a supervisor line: {lines:#?}"
    );
}
