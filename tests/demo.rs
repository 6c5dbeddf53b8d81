//! `cargo mcp-dev demo` end to end: it builds a real rmcp server from the `new` template, plays
//! the host, and must exit 0 with every narrated step behaving as described.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

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
    // No compiler warning in either revision of the demo server: the demo is the first thing a
    // user sees.
    // (cargo's summary `warning: `demo-inventory` (bin …) generated N warning(s)`, or a
    // diagnostic: `warning: …` followed by its `--> src/…` location.)
    let lines: Vec<&str> = stderr.lines().map(str::trim_start).collect();
    for (i, line) in lines.iter().enumerate() {
        let summary = line.starts_with("warning: `") && line.contains(" generated ");
        let diagnostic = line.starts_with("warning: ")
            && lines
                .get(i + 1)
                .is_some_and(|next| next.starts_with("--> "));
        assert!(
            !summary && !diagnostic,
            "compiler warning in the demo: {line}\n{stderr}"
        );
    }
    assert_in_order(&stderr);
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

/// The lines appear in the order things happened: the supervisor's decision (its status line)
/// before the host narrates the answer, an approval before the call it allowed.
fn assert_in_order(stderr: &str) {
    let epoch_of = |prefix: &str| -> String {
        let line = stderr
            .lines()
            .find(|l| l.contains(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line:\n{stderr}"));
        let rest = &line[line.find("epoch=").unwrap() + 6..];
        rest.split([' ', ')']).next().unwrap().to_string()
    };
    let a = epoch_of("server started: pid=");
    let b = epoch_of("server replaced: pid=");
    let steps = [
        "server started: pid=".to_string(),
        "] listing tools".into(),
        "call denied: add_note (authorization_required)".into(),
        "denied: {".into(),
        format!("approved: add_note for epoch {a} "),
        "grant ".into(),
        "result: {\"saved\":true}".into(),
        "server replaced: pid=".into(),
        "catalog changed: revision 2".into(),
        "call denied: add_note (catalog_stale)".into(),
        "\"error\":\"catalog_stale\"".into(),
        "call denied: add_note (authorization_stale)".into(),
        "\"error\":\"authorization_stale\"".into(),
        format!("approved: add_note for epoch {b} "),
        "result: {\"saved\":true}".into(),
        "] closing the connection".into(),
        "demo complete: every step behaved as narrated".into(),
    ];
    let mut from = 0;
    for step in &steps {
        let at = stderr[from..].find(step.as_str()).unwrap_or_else(|| {
            panic!("`{step}` missing or out of order after byte {from}:\n{stderr}")
        });
        from += at + step.len();
    }
}
