//! `cargo mcp-dev demo` end to end: it builds a real rmcp server from the `new` template, plays
//! the host, and must exit 0 with every narrated step behaving as described.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn demo_plays_the_whole_session_and_verifies_the_log() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    // Shares the end-to-end fixture's target dir so rmcp and tokio are compiled once per run.
    let target = repo().join("target/e2e-fixture-target");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
        .args(["mcp-dev", "demo", "--dir"])
        .arg(work.path())
        .arg("--target-dir")
        .arg(&target)
        .env("CARGO_MCP_DEV_HOME", home.path())
        .env("CARGO_TERM_COLOR", "never")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let out = loop {
        if let Some(_status) = child.try_wait().unwrap() {
            break child.wait_with_output().unwrap();
        }
        if started.elapsed() > Duration::from_secs(900) {
            let _ = child.kill();
            panic!("demo did not finish within 15 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed ({:?}):\n{stderr}",
        out.status.code()
    );
    for needle in [
        "server started: pid=",
        "\"error\":\"authorization_required\"",
        "result: {\"saved\":true}",
        "server replaced: pid=",
        "catalog changed: revision 2",
        "input field `tag` added",
        "\"error\":\"catalog_stale\"",
        "\"error\":\"authorization_stale\"",
        "verified ",
        "demo complete: every step behaved as narrated",
    ] {
        assert!(
            stderr.contains(needle),
            "demo output lacks `{needle}`:\n{stderr}"
        );
    }
    // The demo's stdout stays empty: everything is narrated on stderr.
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The notes file holds exactly the two approved writes (one per epoch), nothing denied ran.
    let notes = std::fs::read_to_string(work.path().join("demo-inventory/notes.jsonl")).unwrap();
    assert_eq!(notes.lines().count(), 2, "{notes}");
}
