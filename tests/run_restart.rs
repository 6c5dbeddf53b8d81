//! `cargo-mcp-dev run` across server lifetimes: rebuilds (debounce, queueing, failures), restart
//! modes, crashes, in-flight calls at a transition, and protocol changes that force a disconnect.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::session::{Session, Setup};
use serde_json::{Value, json};

const RETRY_TRANSITION: &str =
    "refresh tool metadata, check whether the call took effect, then decide whether to call again";

/// The `sha256:abcd1234…` short digest a `build complete` line ends its `->` part with.
fn new_short_digest(build_line: &str) -> String {
    let after = build_line
        .split(" -> ")
        .nth(1)
        .unwrap_or_else(|| panic!("no `->` in {build_line}"));
    after.split([';', ')']).next().unwrap().to_string()
}

/// Waits until `FAKE_LOG` holds `n` `tools/call` requests (the call reached the server).
fn wait_calls_logged(s: &Session, n: usize) {
    let t = Instant::now();
    while s
        .fake_log()
        .iter()
        .filter(|l| l["method"] == "tools/call")
        .count()
        < n
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "call never reached the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `FAKE_LOG` lines of the newest child: from its replayed `initialize` on.
fn newest_child_log(s: &Session) -> Vec<Value> {
    let log = s.fake_log();
    let start = log
        .iter()
        .rposition(|l| l["method"] == "initialize")
        .expect("a child got initialize");
    log[start..].to_vec()
}

#[track_caller]
fn wait_ready(s: &mut Session, epoch: &str) {
    s.wait_status("server ready", |v| {
        v["server"]["epoch"] == json!(epoch) && v["server"]["phase"] == "Ready"
    });
}

#[test]
fn in_flight_call_at_restart_gets_epoch_transition_and_is_never_replayed() {
    let mut s = Setup::new()
        .env("FAKE_CALL_DELAY_MS", "15000")
        .timeout(Duration::from_secs(90))
        .start();
    let (_, e1) = s.ready_legacy();
    let out = s.cli(&["approve", "--yes", "--tool", "write"]);
    out.expect_code(0);
    assert!(
        out.stderr
            .contains(&format!("approved: write for epoch {e1} (grant ")),
        "{}",
        out.stderr
    );
    let sent = Instant::now();
    s.request(
        r#""w1""#,
        "tools/call",
        Some(json!({"name": "write", "arguments": {"marker": "once"}})),
    );
    wait_calls_logged(&s, 1);
    s.set_revision("r2");
    let m = s.response(r#""w1""#);
    assert!(
        sent.elapsed() < Duration::from_secs(14),
        "answered only when the server would have finished"
    );
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    assert_eq!(
        m.tool_error_payload(),
        json!({"error": "epoch_transition", "cause": "replaced", "oldEpoch": e1, "newEpoch": e2,
               "exit": null, "mayHaveRun": true, "retried": false,
               "reason": "the server was replaced while this request was in flight",
               "retry": RETRY_TRANSITION})
    );
    assert_eq!(
        m.result()["content"][1]["text"],
        json!(format!(
            "The server running epoch {e1} was replaced while `write` was in flight; it may or may not have run and was not retried."
        ))
    );
    wait_ready(&mut s, &e2);
    let newest = newest_child_log(&s);
    assert!(
        !newest.iter().any(|l| l["method"] == "tools/call"),
        "the call was replayed to the new server: {newest:?}"
    );
    let effects = s.side_effects();
    assert!(effects.len() <= 1, "{effects:?}");
    assert!(!effects.iter().any(|l| l.contains("\"r2\"")), "{effects:?}");

    // The grant was for the old epoch: the same call is now refused as stale, not forwarded.
    let m = s.call(r#""w2""#, "write", json!({"marker": "twice"}));
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("authorization_stale"), "{p}");
    assert_eq!(p["approvedEpoch"], json!(e1));
    assert_eq!(p["currentEpoch"], json!(e2));
    assert!(
        !newest_child_log(&s)
            .iter()
            .any(|l| l["method"] == "tools/call")
    );
    s.finish();
}

#[test]
fn crash_answers_pending_calls_at_once_and_restarts_with_backoff() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .tools(&["crash"])
        .env("FAKE_CALL_DELAY_MS", "15000")
        .start();
    let (pid1, e1) = s.ready_legacy();
    s.request(
        r#""w""#,
        "tools/call",
        Some(json!({"name": "write", "arguments": {}})),
    );
    wait_calls_logged(&s, 1);
    let t0 = Instant::now();
    s.request(
        r#""c""#,
        "tools/call",
        Some(json!({"name": "crash", "arguments": {}})),
    );
    let expected = json!({"error": "epoch_transition", "cause": "exited", "oldEpoch": e1,
        "newEpoch": null, "exit": "exit code 3", "mayHaveRun": true, "retried": false,
        "reason": "the server exited while this request was in flight",
        "retry": RETRY_TRANSITION});
    for id in [r#""c""#, r#""w""#] {
        let m = s.response(id);
        assert_eq!(m.tool_error_payload(), expected, "{}", m.raw);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "pending calls must be answered when the server exits"
    );
    s.wait_stderr(&format!(
        "server exited: pid={pid1} epoch={e1} (exit code 3)"
    ));
    s.wait_stderr("restarting server in 250 ms");
    let (pid2, e2) = s.server_started();
    assert_ne!(e2, e1);
    assert_ne!(pid2, pid1);
    wait_ready(&mut s, &e2);
    // Same catalog, so the host's copy is still current: calls flow to the new server.
    let m = s.call("1", "echo", json!({}));
    assert_eq!(
        m.result()["structuredContent"]["pid"],
        json!(pid2),
        "{}",
        m.raw
    );
    // The new server got the host's handshake replayed first.
    let newest = newest_child_log(&s);
    assert_eq!(newest[1]["method"], "notifications/initialized");
    // A second crash backs off longer.
    let m = s.call(r#""c2""#, "crash", json!({}));
    assert_eq!(m.tool_error_payload()["oldEpoch"], json!(e2));
    s.wait_stderr(&format!(
        "server exited: pid={pid2} epoch={e2} (exit code 3)"
    ));
    s.wait_stderr("restarting server in 500 ms");
    let (_, e3) = s.server_started();
    wait_ready(&mut s, &e3);
    s.finish();
}

#[test]
fn build_failure_keeps_the_old_server_running() {
    let mut s = Setup::new().arg("--no-gating").start();
    let (pid1, e1) = s.ready_legacy();
    let first = s
        .stderr_lines()
        .into_iter()
        .find(|l| l.starts_with("build complete: "))
        .unwrap();
    let good = new_short_digest(&first);
    s.project.replace(
        "src/main.rs",
        r#"const REVISION: &str = "r1";"#,
        r#"const REVISION: &str = "r1""#,
    );
    s.wait_stderr(&format!(
        "build failed: 1 error in src/main.rs (last good: {good})"
    ));
    let next = s.wait_stderr_matching("the next status line", |l| {
        l.starts_with("running server") || l.starts_with("server ")
    });
    assert_eq!(
        next,
        format!("running server unchanged: pid={pid1} epoch={e1}")
    );
    let m = s.call("1", "echo", json!({"after": "failure"}));
    let sc = &m.result()["structuredContent"];
    assert_eq!(sc["pid"], json!(pid1));
    assert_eq!(sc["revision"], json!("r1"));
    let st = s.status_file().unwrap();
    assert!(
        st["lastBuild"]
            .as_str()
            .unwrap()
            .starts_with("build failed: "),
        "{st}"
    );
    assert_eq!(st["server"]["epoch"], json!(e1));
    // Fixing the source brings a new epoch.
    s.set_revision("r3");
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    wait_ready(&mut s, &e2);
    let m = s.call("2", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r3"));
    s.finish();
}

#[test]
fn edits_are_debounced_and_an_edit_during_a_build_queues_exactly_one_more() {
    let setup = Setup::new()
        .args(&["--no-gating", "-v"])
        .timeout(Duration::from_secs(120));
    // Every build of a changed main.rs takes ≥ 2.5 s, so edits can land inside one.
    setup.project.write(
        "build.rs",
        "fn main() {\n    println!(\"cargo:rerun-if-changed=src/main.rs\");\n    \
         std::thread::sleep(std::time::Duration::from_millis(2500));\n}\n",
    );
    let mut s = setup.start();
    s.ready_legacy();
    assert_eq!(s.count_stderr("build complete: "), 1);

    // A burst inside one debounce window: one batch, one build, the last edit wins.
    let before = s.count_stderr("change detected: ");
    for i in 0..5 {
        s.set_revision(&format!("burst-{i}"));
        std::thread::sleep(Duration::from_millis(30));
    }
    s.wait_stderr("build complete: ");
    let (_, e2, _) = s.server_replaced();
    wait_ready(&mut s, &e2);
    let m = s.call("1", "echo", json!({}));
    assert_eq!(
        m.result()["structuredContent"]["revision"],
        json!("burst-4")
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.count_stderr("change detected: ") - before, 1);
    assert_eq!(s.count_stderr("build complete: "), 2);

    // Edits while a build runs: exactly one follow-up build, which applies the last edit.
    s.set_revision("q1");
    s.wait_stderr_matching("cargo compiling the server", |l| {
        l.trim_start().starts_with("Compiling fake-server ")
    });
    let during_from = s.count_stderr("change detected: ");
    std::thread::sleep(Duration::from_millis(100));
    s.set_revision("q2");
    std::thread::sleep(Duration::from_millis(600));
    s.set_revision("q3");
    s.wait_stderr("build complete: ");
    let second = s.wait_stderr("build complete: ");
    assert!(
        s.count_stderr("change detected: ") - during_from >= 2,
        "two batches arrived during the build"
    );
    let _ = second;
    // Whichever build picked up q3, the server that ends up running is q3.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = s.wait_status("a ready server", |v| v["server"]["phase"] == "Ready");
        let e = st["server"]["epoch"].as_str().unwrap().to_string();
        let m = s.call(&format!("\"q-{e}\""), "echo", json!({}));
        if m.result()["structuredContent"]["revision"] == json!("q3") {
            break;
        }
        assert!(Instant::now() < deadline, "q3 never ran: {}", m.raw);
        std::thread::sleep(Duration::from_millis(200));
    }
    // …and no third build follows.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        s.count_stderr("build complete: "),
        4,
        "{:#?}",
        s.stderr_lines()
    );
    s.finish();
}

#[test]
fn capability_change_closes_the_connection_with_exit_107() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.ready_legacy();
    s.project.replace(
        "src/main.rs",
        r#"Err(_) => obj([("tools", obj([("listChanged", Value::Bool(true))]))]),"#,
        r#"Err(_) => obj([("tools", obj([("listChanged", Value::Bool(true))])), ("logging", obj([]))]),"#,
    );
    s.server_replaced();
    let line = s.wait_stderr("connection closed: ");
    assert!(
        line.starts_with(
            r#"connection closed: the new server has capabilities {"logging":{},"tools":{}} instead of {"tools":{}} ("#
        ) && line.ends_with("2025-06-18); the host must reconnect"),
        "{line}"
    );
    s.expect_connection_closed();
}

#[test]
fn restart_mode_manual_keeps_the_old_server_until_restart() {
    let mut s = Setup::new()
        .args(&["--no-gating", "--restart", "manual"])
        .start();
    let (pid1, e1) = s.ready_legacy();
    s.set_revision("r2");
    let built = s.wait_stderr("build complete: ");
    assert!(built.contains(" changed (sha256:"), "{built}");
    let next = s.wait_stderr_matching("the next status line", |l| {
        l.starts_with("running server") || l.starts_with("server ")
    });
    assert_eq!(
        next,
        format!(
            "running server unchanged: pid={pid1} epoch={e1} (restart mode manual: run `cargo mcp-dev restart` to apply {})",
            new_short_digest(&built)
        )
    );
    let m = s.call("1", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r1"));
    assert_eq!(m.result()["structuredContent"]["pid"], json!(pid1));
    assert_eq!(s.status_file().unwrap()["pendingRestart"], json!(true));

    let out = s.cli(&["restart"]);
    out.expect_code(0);
    assert!(
        out.stderr.contains(
            "restart requested: the running server is being replaced with the latest build"
        ),
        "{}",
        out.stderr
    );
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    wait_ready(&mut s, &e2);
    let m = s.call("2", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r2"));
    assert_eq!(s.status_file().unwrap()["pendingRestart"], json!(false));
    s.finish();
}

#[test]
fn restart_mode_disconnect_fails_in_flight_calls_and_exits_107() {
    let mut s = Setup::new()
        .args(&["--no-gating", "--restart", "disconnect"])
        .env("FAKE_CALL_DELAY_MS", "15000")
        .start();
    let (_, e1) = s.ready_legacy();
    s.request(
        r#""w""#,
        "tools/call",
        Some(json!({"name": "write", "arguments": {}})),
    );
    wait_calls_logged(&s, 1);
    s.set_revision("r2");
    let built = s.wait_stderr("build complete: ");
    let m = s.response(r#""w""#);
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("epoch_transition"), "{p}");
    assert_eq!(p["oldEpoch"], json!(e1));
    s.wait_stderr(&format!(
        "connection closed: new build {} (restart mode disconnect); the host must reconnect",
        new_short_digest(&built)
    ));
    s.expect_stdout_eof();
    let status = s
        .wait_exit(Duration::from_secs(5))
        .expect("supervisor exits");
    assert_eq!(status.code(), Some(107));
    assert_eq!(s.count_stderr("server replaced: "), 0);
    s.check_clean();
}

#[test]
fn calls_during_a_restart_wait_for_the_new_epoch_and_are_judged_there() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_STARTUP_DELAY_MS", "2500")
        .timeout(Duration::from_secs(90))
        .start();
    let (_, e1) = s.ready_legacy();
    s.set_revision("r2");
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    // Sent in the restart's gap: held (bounded), then judged against the new epoch, which
    // runs it: never the old server, never twice.
    let m = s.call(r#""p""#, "echo", json!({}));
    assert_eq!(
        m.result()["structuredContent"]["revision"],
        json!("r2"),
        "{}",
        m.raw
    );
    wait_ready(&mut s, &e2);
    let m = s.call("2", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r2"));
    let calls = newest_child_log(&s)
        .iter()
        .filter(|l| l["method"] == "tools/call")
        .count();
    assert_eq!(calls, 2);
    s.finish();
}

#[test]
fn modern_capability_change_closes_the_connection_with_exit_107() {
    let mut s = Setup::new().arg("--no-gating").start();
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    s.roundtrip(r#""l0""#, "tools/list", Some(json!({"_meta": meta})));
    let (_, e1) = s.server_started();
    wait_ready(&mut s, &e1);
    let d = s.roundtrip(r#""d1""#, "server/discover", Some(json!({"_meta": meta})));
    assert_eq!(
        d.result()["capabilities"],
        json!({"tools": {"listChanged": true}}),
        "{}",
        d.raw
    );
    // The host now holds these capabilities; a server with others cannot continue silently.
    s.project.replace(
        "src/main.rs",
        r#"Err(_) => obj([("tools", obj([("listChanged", Value::Bool(true))]))]),"#,
        r#"Err(_) => obj([("tools", obj([("listChanged", Value::Bool(true))])), ("logging", obj([]))]),"#,
    );
    s.server_replaced();
    let line = s.wait_stderr_within("connection closed: ", Duration::from_secs(15));
    assert!(line.contains("capabilities"), "{line}");
    s.expect_connection_closed();
}

#[test]
fn a_crash_loop_is_reported_instead_of_spun() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_CRASH_ON", "notifications/initialized")
        .timeout(Duration::from_secs(60))
        .start();
    s.initialize();
    for delay in [250, 500, 1000, 2000] {
        let (pid, epoch) = s.server_started();
        s.wait_stderr(&format!(
            "server exited: pid={pid} epoch={epoch} (exit code 3)"
        ));
        s.wait_stderr(&format!("restarting server in {delay} ms"));
    }
    let (pid, epoch) = s.server_started();
    s.wait_stderr(&format!(
        "server exited: pid={pid} epoch={epoch} (exit code 3)"
    ));
    let next = s.wait_stderr_matching("what follows the fifth exit", |l| {
        l.starts_with("restarting server") || l.starts_with("server crash loop")
    });
    assert_eq!(
        next,
        "server crash loop: 5 exits in 60 s; not restarting until the sources change or `cargo mcp-dev restart`"
    );
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(
        s.count_stderr("server started: "),
        5,
        "no restart after the loop"
    );
    // Calls are refused at once (no server is coming), not queued.
    let m = s.call("1", "echo", json!({}));
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("server_unavailable"), "{p}");
    assert_eq!(p["reason"], json!("crash loop"), "{p}");
    s.finish();
}

/// A server that refuses `initialize` (here: one that speaks only the modern handshake) cannot
/// serve a legacy host: it is stopped at once with its own words on stderr, and requests are
/// answered with why at once, not each held for the first-start budget (25 s) and held again.
#[test]
fn a_server_that_refuses_initialize_is_stopped_and_requests_are_answered_at_once() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_ERA", "modern")
        .timeout(Duration::from_secs(60))
        .start();
    let id = s.fresh_id();
    s.request(
        &id,
        "initialize",
        Some(json!({"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw-test-host", "version": "1.0.0"}})),
    );
    let (pid, epoch) = s.server_started();
    let stopped = s.wait_stderr(&format!(
        "server stopped: pid={pid} epoch={epoch}: refused the handshake: "
    ));
    assert!(
        stopped.contains("-32601"),
        "the server's own refusal: {stopped}"
    );
    // The host's `initialize` got an answer (the server's refusal, or the supervisor's own when
    // the server came after the warm-start wait); nothing is left waiting.
    s.response(&id);
    for n in 0..2 {
        let started = Instant::now();
        let list_id = s.fresh_id();
        let list = s.roundtrip(&list_id, "tools/list", Some(json!({})));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered at once, not after the budget (request {n}: {:?})",
            started.elapsed()
        );
        assert_eq!(list.error()["code"], json!(-31002), "{:?}", list.error());
        let message = list.error()["message"].as_str().unwrap();
        assert!(message.contains("refused the handshake"), "{message}");
    }
    let t = Instant::now();
    while common::session::alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "server {pid} still runs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        s.count_stderr("server started: "),
        1,
        "not restarted as a crash"
    );
    s.finish();
}

#[test]
fn a_path_dependency_added_while_running_is_watched_from_then_on() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.ready_legacy();
    let root = s.project.root.clone();
    // A new crate in a new top-level directory, not watched when the session started.
    std::fs::create_dir_all(root.join("extra-dep/src")).unwrap();
    std::fs::write(
        root.join("extra-dep/Cargo.toml"),
        "[package]\nname = \"extra-dep\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("extra-dep/src/lib.rs"),
        "pub fn extra() -> u32 { 1 }\n",
    )
    .unwrap();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    std::fs::write(
        root.join("Cargo.toml"),
        manifest.replace(
            "fake-core = { path = \"fake-core\" }",
            "fake-core = { path = \"fake-core\" }\nextra-dep = { path = \"extra-dep\" }",
        ),
    )
    .unwrap();
    let line = s.wait_stderr_matching("build with the new dependency", |l| {
        l.starts_with("build complete:") && l.contains("dependency tree")
    });
    assert!(line.contains("changed"), "{line}");
    // Let follow-up builds (cargo rewrote Cargo.lock) settle, then edit only the new crate.
    std::thread::sleep(Duration::from_secs(3));
    let builds = s.count_stderr("build complete:");
    std::fs::write(
        root.join("extra-dep/src/lib.rs"),
        "pub fn extra() -> u32 { 2 }\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while s.count_stderr("build complete:") == builds {
        assert!(
            std::time::Instant::now() < deadline,
            "editing the new path dependency triggered no build: its directory is not watched"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let last = s
        .stderr_lines()
        .into_iter()
        .rfind(|l| l.starts_with("build complete:"))
        .unwrap();
    assert!(last.contains("dependency tree"), "{last}");
    s.finish();
}

/// Issue 15, reload: a save is built at once (the build does not wait for the quiet period),
/// but the new code is served only once the sources were quiet for the whole debounce window.
#[test]
fn a_save_is_built_at_once_but_served_only_after_the_quiet_period() {
    let mut s = Setup::new()
        .args(&["--no-gating", "--debounce", "3000"])
        .timeout(Duration::from_secs(90))
        .start();
    s.ready_legacy();
    let saved = Instant::now();
    s.set_revision("early");
    s.wait_stderr_matching("cargo compiling the edit", |l| {
        l.trim_start().starts_with("Compiling fake-server ")
    });
    let compiling = saved.elapsed();
    assert!(
        compiling < Duration::from_millis(2500),
        "the build started {compiling:?} after the save, not at once"
    );
    let (_, epoch, _) = s.server_replaced();
    let replaced = saved.elapsed();
    assert!(
        replaced >= Duration::from_secs(3),
        "served {replaced:?} after the save, inside the 3 s quiet period"
    );
    wait_ready(&mut s, &epoch);
    let m = s.call("1", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("early"));
    s.finish();
}

/// A second save after the first one's build began: that build may have read a half-saved file,
/// so it is set aside (never served), the settled files are built, and the new build is
/// compared with the build in use (its line says what changed, not "unchanged").
#[test]
fn a_build_that_a_later_save_overtook_is_set_aside() {
    let mut s = Setup::new()
        .args(&["--no-gating", "-v", "--debounce", "1000"])
        .timeout(Duration::from_secs(90))
        .start();
    let (_, first_epoch) = s.ready_legacy();
    let in_use = new_short_digest(
        &s.stderr_lines()[..]
            .iter()
            .find(|l| l.starts_with("build complete: "))
            .cloned()
            .expect("the first build's line"),
    );
    s.set_revision("overtaken");
    std::thread::sleep(Duration::from_millis(300));
    s.set_revision("settled");
    s.wait_stderr("a build started before the sources settled saw a later change");
    let line = s.wait_stderr("build complete: ");
    // Compared with the build in use, not with the one set aside.
    assert!(
        line.contains(&format!(" changed ({in_use} -> ")),
        "{line} (in use: {in_use})"
    );
    let (_, epoch, _) = s.server_replaced();
    assert_ne!(epoch, first_epoch);
    wait_ready(&mut s, &epoch);
    let m = s.call("1", "echo", json!({}));
    assert_eq!(
        m.result()["structuredContent"]["revision"],
        json!("settled")
    );
    assert_eq!(
        s.count_stderr("server replaced: "),
        1,
        "the overtaken build never ran: {:#?}",
        s.stderr_lines()
    );
    s.finish();
}

#[test]
fn restart_during_a_replacement_starts_no_second_server() {
    // The old server ignores the end of its stdin and SIGTERM, so the replacement's gap lasts
    // until its SIGKILL. Red-team, session 22: `restart` in that gap started a server at once
    // ("the server is starting"), which the replacement then started over: two servers ran,
    // one of them unsupervised (its answers ignored) until the session ended.
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_IGNORE_STDIN_EOF", "1")
        .env("FAKE_IGNORE_SIGTERM", "1")
        .timeout(Duration::from_secs(90))
        .start();
    let (_, e1) = s.ready_legacy();
    s.set_revision("r2");
    s.wait_stderr("build complete: ");
    let out = s.cli(&["restart"]);
    out.expect_code(0);
    assert!(
        out.stderr.contains("the running server is being replaced"),
        "{}",
        out.stderr
    );
    let (_, e2, was) = s.server_replaced();
    assert_eq!(was, e1);
    wait_ready(&mut s, &e2);
    let m = s.call("2", "echo", json!({}));
    assert_eq!(m.result()["structuredContent"]["revision"], json!("r2"));
    assert_eq!(
        s.count_stderr("server started: "),
        1,
        "{:?}",
        s.stderr_lines()
    );
    s.finish();
}

/// Red-team round 14 (high): with `--fallback last-good`, a failed first build started the record read
/// back from `target/mcp-dev/identity/<label>.dev.json`, a file in the agent-writable target
/// directory, without checking it against anything this process captured. Its `launch.argv`
/// (and cwd) are run as written; only `executable.storePath` is checked against
/// `executable.sha256`, both taken from the same forged file. An agent that edited the record
/// (keeping its `identityDigest`, the one the human approved) and broke the build got any
/// command run as that identity, audited under the approved digest. Now only a record whose
/// digests are its own fields' is started again. Here the forged argv runs
/// `sh -c` first (writing a marker), then execs the real server so the session looks normal.
#[test]
fn last_good_fallback_does_not_run_an_edited_identity_record() {
    let setup = Setup::new().args(&["--fallback", "last-good"]);
    let p = &setup.project;
    p.build(&[]).expect_code(0);
    let marker = p.scratch().join("forged-argv-ran");
    let file = p.identity_file(common::session::LABEL, "dev");
    let mut record = p.record(common::session::LABEL, "dev");
    let store_path = record["executable"]["storePath"]
        .as_str()
        .unwrap()
        .to_string();
    let script = format!("echo pwned > '{}'; exec \"$0\" \"$@\"", marker.display());
    record["launch"]["argv"] = serde_json::json!(["/bin/sh", "-c", script, store_path]);
    std::fs::write(&file, serde_json::to_string_pretty(&record).unwrap()).unwrap();
    // The agent breaks the build.
    let main = p.read("src/main.rs");
    p.write(
        "src/main.rs",
        &format!("{main}\ncompile_error!(\"broken by the agent\");\n"),
    );
    let mut s = setup.timeout(Duration::from_secs(120)).start();
    s.wait_stderr_matching("a start or a refusal after the failed build", |l| {
        l.contains("server started")
            || l.contains("no server running")
            || l.contains("failed to start")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !marker.exists(),
        "a command nobody captured ran as the recorded identity; status lines: {:#?}",
        s.stderr_lines()
    );
}
