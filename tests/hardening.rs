//! Issue 12 (hardening): one test per finding that needs a real `cargo-mcp-dev run` (the fake
//! std-only server from `tests/fixtures/fake-server`). Findings covered by unit tests are named in
//! the module they fix (`proxy::envelope`, `sanitize`, `commands::approve`, `audit::*`, `store`,
//! `proxy::outlet`, `control`, `fsutil`).

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::fixture::Project;
use common::session::{LABEL, SUITE, Setup};
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

/// High finding "a set-aside audit log bricks `run`": a damaged log (here: its last, anchored
/// record cut short after it was written) used to make every later `run` exit 1. Now the log
/// and its anchor are kept aside, a new chain starts (one status line), and `audit verify`
/// reports the break with both chains (exit 109).
#[test]
fn damaged_audit_log_is_set_aside_and_run_starts() {
    use cargo_mcp_dev::audit::{AuditLog, KeyStore};
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
    let len = std::fs::metadata(&log_path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log_path)
        .unwrap()
        .set_len(len - 20)
        .unwrap();
    let mut s = setup.start();
    let line = s.wait_stderr("audit log set aside: ");
    assert!(line.contains("truncated"), "{line}");
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

/// Issue 15 (kill -9 in a burst): a write a crash cut short leaves an incomplete last line
/// after the anchored head. `audit verify` passes and names it; `run` keeps the bytes beside
/// the log, says so in one status line, and continues the same chain (no break).
#[test]
fn torn_last_write_is_kept_aside_and_the_chain_continues() {
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
    let torn = b"{\"v\":1,\"seq\":2,\"ti";
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .unwrap()
        .write_all(torn)
        .unwrap();
    // Before the next run: what was written verifies, and the torn bytes are named.
    let before = setup.project.run(["audit", "verify", "--json"]);
    assert_eq!(before.code, 0, "{}", before.stderr);
    assert!(
        before
            .stderr
            .contains("are an incomplete line: an interrupted write"),
        "{}",
        before.stderr
    );
    let report: serde_json::Value = serde_json::from_str(before.stdout.trim()).unwrap();
    assert_eq!(report["records"], json!(1), "{report}");
    assert_eq!(report["tornTail"]["bytes"], json!(torn.len()), "{report}");
    let mut s = setup.start();
    let line = s.wait_stderr("audit tail kept aside: an incomplete last write");
    assert!(line.contains("18 bytes after record 1"), "{line}");
    let kept = line
        .split(" was moved to ")
        .nth(1)
        .and_then(|r| r.split("; the chain continues").next())
        .expect("the status line names the kept copy");
    assert_eq!(std::fs::read(kept).unwrap(), torn);
    s.ready_legacy();
    let verified = s.cli(&["audit", "verify", "--json"]);
    let records = cargo_mcp_dev::audit::read_records(&log_path).unwrap();
    s.finish();
    verified.expect_code(0);
    let report: serde_json::Value = serde_json::from_str(verified.stdout.trim()).unwrap();
    assert_eq!(report["breaks"], json!([]), "{report}");
    assert_eq!(report["tornTail"], json!(null), "{report}");
    assert_eq!(records[0].record_type, "run_started");
    assert_eq!(records[1].record_type, "torn_tail_set_aside");
    assert_eq!(records[1].prev, records[0].hash);
}

/// Medium finding "the stored executable is run without checking it still has the hashed
/// bytes": an entry replaced after capture is refused at launch, naming the digest that did not
/// match, and the replacement never runs.
#[test]
fn replaced_store_entry_is_refused_at_launch() {
    let mut s = Setup::new().start();
    s.ready_legacy();
    let entry = store_entry(&s);
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

/// A `wrapper` gets the store entry's path, a path any process can open: one that starts the
/// server as its own child with descriptors closed (a Python wrapper using `subprocess`, whose
/// `close_fds=True` is the default) still starts it. Red-team round 22: for part of session 25
/// the wrapper got `/proc/self/fd/N` (to close the store entry's replace race), which such a
/// wrapper's child cannot open; that change was taken back (see docs/SECURITY.md).
#[cfg(target_os = "linux")]
#[test]
fn a_wrapper_that_starts_the_server_with_descriptors_closed_still_starts_it() {
    let setup = Setup::new()
        .arg("--no-gating")
        .config(r#"wrapper = "scripts/serve.py""#);
    setup.project.write(
        "scripts/serve.py",
        "#!/usr/bin/python3\nimport subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))\n",
    );
    std::fs::set_permissions(
        setup.project.path("scripts/serve.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut s = setup.start();
    s.ready_legacy();
    let answer = s.call("1", "echo", json!({"text": "wrapped"}));
    assert_ne!(answer.result()["isError"], json!(true), "{}", answer.raw);
    assert!(answer.raw.contains("wrapped"), "{}", answer.raw);
    s.finish();
}

/// The `wrapper` lives in the project tree, which the agent writes; before each start it is
/// hashed again: a named pipe planted there (then any exit of the server) is refused at the
/// restart, not waited on. Red-team round 22: the supervisor hung on the session's thread and
/// answered nothing again, not even `ping`.
#[cfg(target_os = "linux")]
#[test]
fn a_fifo_planted_at_the_wrapper_does_not_wedge_the_restart() {
    let setup = Setup::new()
        .arg("--no-gating")
        .tools(&["crash"])
        .config(r#"wrapper = "scripts/serve.sh""#);
    setup
        .project
        .write("scripts/serve.sh", "#!/bin/sh\nexec \"$@\"\n");
    let wrapper = setup.project.path("scripts/serve.sh");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut s = setup.start();
    s.ready_legacy();
    // The agent plants a named pipe at the wrapper, then makes the server exit.
    crash_then_ping(&mut s, &wrapper);
}

/// The same for the store entry (`target/mcp-dev/store/sha256-…`), opened at each start to be
/// checked: a named pipe planted there is refused and the server built again. Red-team round 22.
#[cfg(target_os = "linux")]
#[test]
fn a_fifo_planted_at_the_store_entry_does_not_wedge_the_restart() {
    let mut s = Setup::new().arg("--no-gating").tools(&["crash"]).start();
    s.ready_legacy();
    let entry = store_entry(&s);
    crash_then_ping(&mut s, &entry);
}

/// The session's store entry (`target/mcp-dev/store/sha256-…`).
fn store_entry(s: &common::session::Session) -> std::path::PathBuf {
    let store = s.project.target_dir().join("mcp-dev/store");
    std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("sha256-")
        })
        .expect("a store entry")
}

/// Plants a named pipe at `planted`, makes the server exit (the `crash` tool), and checks the
/// supervisor still answers `ping` after the restart (a writer is let in after 15 s so that a
/// stuck `open` ends and the test can finish).
#[cfg(target_os = "linux")]
fn crash_then_ping(s: &mut common::session::Session, planted: &std::path::Path) {
    plant_fifo(planted);
    s.send(r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"crash","arguments":{}}}"#);
    s.wait_stderr("server exited");
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    s.send(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let unblock = planted.to_path_buf();
    std::thread::spawn(move || {
        if rx.recv_timeout(std::time::Duration::from_secs(15)).is_err() {
            let _ = std::fs::OpenOptions::new().write(true).open(&unblock);
        }
    });
    let m = s.response_within("7", std::time::Duration::from_secs(10));
    let _ = tx.send(());
    assert!(m.raw.contains("result"), "{}", m.raw);
}

/// A host that reads the supervisor's stdout only when told to (the shared session helper always
/// reads): for the flood findings.
mod raw_host {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, ChildStdin, ChildStdout, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::common::fixture::Project;
    use super::common::session::SUITE;
    use serde_json::{Value, json};

    pub struct Host {
        /// Keeps the temp dir alive.
        _project: Project,
        pub child: Child,
        pub stdin: Option<ChildStdin>,
        pub stdout: BufReader<ChildStdout>,
        pub stderr: Arc<Mutex<Vec<String>>>,
        tools: Vec<String>,
    }

    impl Host {
        pub fn start(tools: &[&str], env: &[(&str, &str)]) -> Host {
            let project = Project::built_fake_server(SUITE);
            let list: Vec<Value> = tools
                .iter()
                .map(|t| json!({"name": t, "inputSchema": {"type": "object"}}))
                .collect();
            let tools_file = project.scratch().join("tools.json");
            std::fs::write(&tools_file, Value::Array(list).to_string()).unwrap();
            let mut cmd = project.command(["run", "--no-gating", "--no-watch"]);
            cmd.env("FAKE_TOOLS", &tools_file);
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("spawn run");
            let stdin = child.stdin.take();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let err = child.stderr.take().unwrap();
            let lines = stderr.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    lines.lock().unwrap().push(l);
                }
            });
            Host {
                _project: project,
                child,
                stdin,
                stdout,
                stderr,
                tools: tools.iter().map(|t| t.to_string()).collect(),
            }
        }

        pub fn send(&mut self, line: &str) {
            let s = self.stdin.as_mut().unwrap();
            s.write_all(line.as_bytes()).unwrap();
            s.write_all(b"\n").unwrap();
            s.flush().unwrap();
        }

        /// Reads stdout until the response with `id` (counting the other lines).
        pub fn read_until(&mut self, id: &Value, max: Duration) -> (Value, usize) {
            let deadline = Instant::now() + max;
            let mut others = 0;
            loop {
                assert!(Instant::now() < deadline, "no answer to {id}");
                let mut line = String::new();
                let n = self.stdout.read_line(&mut line).unwrap();
                assert!(n > 0, "stdout closed before the answer to {id}");
                let v: Value = serde_json::from_str(line.trim_end()).unwrap();
                if v.get("id") == Some(id) && v.get("method").is_none() {
                    return (v, others);
                }
                others += 1;
            }
        }

        pub fn ready(&mut self) {
            self.send(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#);
            self.read_until(&json!(1), Duration::from_secs(60));
            self.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
            self.wait_stderr("server started: ", Duration::from_secs(60));
            // List from the running server (a list answered during the build is not current).
            for id in 2..40 {
                self.send(&format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
                ));
                let (v, _) = self.read_until(&json!(id), Duration::from_secs(60));
                let names: Vec<&str> = v["result"]["tools"]
                    .as_array()
                    .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
                    .unwrap_or_default();
                if names == self.tools {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            panic!("no tool list from the server");
        }

        pub fn wait_stderr(&self, needle: &str, max: Duration) -> String {
            let deadline = Instant::now() + max;
            loop {
                if let Some(l) = self
                    .stderr
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| l.contains(needle))
                {
                    return l.clone();
                }
                if Instant::now() >= deadline {
                    let all = self.stderr.lock().unwrap().clone();
                    let tail: Vec<&String> = all.iter().rev().take(15).collect();
                    panic!("no `{needle}` on stderr; last lines: {tail:?}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }

        /// Peak resident memory of the supervisor (VmHWM), in KiB.
        pub fn peak_kib(&self) -> u64 {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
                .unwrap()
        }
    }

    impl Drop for Host {
        fn drop(&mut self) {
            self.stdin = None;
            let deadline = Instant::now() + Duration::from_secs(8);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Medium finding "unbounded memory" (a server flooding notifications while the host is not
/// reading; 1.1 GiB observed): 256 MiB of notifications cost the supervisor at most its queue
/// bound (16 MiB) plus its baseline; the dropped ones are counted in a status line, and the
/// call's own answer still arrives once the host reads again.
#[test]
fn notification_flood_while_the_host_does_not_read_is_bounded() {
    let mut h = raw_host::Host::start(
        &["flood_notifications"],
        &[("FAKE_FLOOD_LINES", "256000"), ("FAKE_FLOOD_BYTES", "1024")],
    );
    h.ready();
    let base = h.peak_kib();
    h.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"flood_notifications","arguments":{}}}"#);
    h.wait_stderr("the host is not reading its stdin", Duration::from_secs(60));
    // Let the whole flood arrive while the host is still not reading.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !h
        .stderr
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("dropped 200000 lines"))
    {
        assert!(std::time::Instant::now() < deadline, "flood did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    let peak = h.peak_kib();
    eprintln!(
        "notification flood: 256000 x 1 KiB, supervisor VmHWM {base} KiB before, {peak} KiB after"
    );
    assert!(
        peak < base + 48 * 1024,
        "peak {peak} KiB (baseline {base} KiB)"
    );
    let (answer, seen) = h.read_until(&json!(3), Duration::from_secs(60));
    assert_eq!(
        answer["result"]["structuredContent"]["lines"],
        json!(256000)
    );
    assert!(seen < 256000, "{seen}");
}

/// Every queue is bounded: a real server that sends the host 3,000 requests nobody answers.
/// The host is sent the first 1,024 (the session keeps no more open); each request past them is
/// answered to the server at once with `-31005` (the server's own log shows them), one status
/// line says so, and the call that sent them is still answered. Once the host answers one,
/// the server's next request reaches it again.
#[test]
fn a_server_flooding_the_host_with_requests_is_answered_past_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("server-received.log");
    let mut h = raw_host::Host::start(
        &["flood_requests"],
        &[
            ("FAKE_FLOOD_LINES", "3000"),
            ("FAKE_LOG", log.to_str().unwrap()),
        ],
    );
    h.ready();
    let flood = |h: &mut raw_host::Host, id: &str| -> Vec<serde_json::Value> {
        h.send(&format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{{"name":"flood_requests","arguments":{{}}}}}}"#
        ));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut requests = Vec::new();
        loop {
            assert!(std::time::Instant::now() < deadline, "no answer to {id}");
            let mut line = String::new();
            use std::io::BufRead;
            assert!(h.stdout.read_line(&mut line).unwrap() > 0, "stdout closed");
            let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
            if v["id"] == json!(id) && v.get("method").is_none() {
                assert_eq!(v["result"]["structuredContent"]["requests"], json!(3000));
                return requests;
            }
            if v["method"] == "roots/list" {
                requests.push(v["id"].clone());
            }
        }
    };
    let requests = flood(&mut h, "flood-1");
    assert_eq!(requests.len(), 1024, "requests that reached the host");
    h.wait_stderr(
        "requests the host has not answered",
        Duration::from_secs(10),
    );
    let refused = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("-31005") && l.contains("\"flood-"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while refused(&log) < 3000 - 1024 {
        let n = refused(&log);
        assert!(
            std::time::Instant::now() < deadline,
            "{n} refusals seen by the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let told = |h: &raw_host::Host| {
        let lines = h.stderr.lock().unwrap();
        lines
            .iter()
            .filter(|l| l.contains("requests the host has not answered"))
            .count()
    };
    assert_eq!(told(&h), 1, "one status line for the overflow");

    // The host answers one: it reaches the server under the server's own id, and a second
    // flood finds room for exactly one request at the host.
    h.send(&format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"roots":[]}}}}"#,
        requests[0]
    ));
    let answered = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(r#""id":"flood-0""#) && l.contains("roots"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !answered(&log) {
        assert!(
            std::time::Instant::now() < deadline,
            "the host's answer never reached the server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        flood(&mut h, "flood-2").len(),
        1,
        "room for exactly one more"
    );
    h.wait_stderr(
        "requests the host has not answered",
        Duration::from_secs(10),
    );
    assert_eq!(told(&h), 2, "a new overflow is told again");
}

/// Medium finding "unbounded memory" (1 MiB host requests while the server stalls): requests
/// that no longer fit the server's queue (64 MiB) are answered with `server_not_reading` instead
/// of being held; every request gets exactly one answer.
#[test]
fn host_requests_while_the_server_stalls_are_bounded_and_answered() {
    let mut h = raw_host::Host::start(&["stall", "echo"], &[("FAKE_STALL_MS", "120000")]);
    h.ready();
    let base = h.peak_kib();
    h.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stall","arguments":{}}}"#);
    std::thread::sleep(Duration::from_millis(300));
    let big = "b".repeat(1 << 20);
    let n = 160;
    // Write on a thread: the supervisor keeps reading its stdin (nothing blocks on the stall).
    let mut stdin = h.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for i in 0..n {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"echo","arguments":{{"pad":"{big}"}}}}}}"#,
                100 + i
            );
            stdin.write_all(line.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        stdin
    });
    let mut refused = 0;
    let stdin = writer.join().unwrap();
    h.stdin = Some(stdin);
    h.wait_stderr(
        "the server is not reading its stdin",
        Duration::from_secs(60),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while refused < 90 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {refused} answered"
        );
        let mut line = String::new();
        use std::io::BufRead;
        h.stdout.read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        if v["error"]["data"]["error"] == json!("server_not_reading") {
            refused += 1;
        }
    }
    let peak = h.peak_kib();
    eprintln!(
        "stalled server: {n} x 1 MiB requests, {refused}+ refused, supervisor VmHWM {base} KiB before, {peak} KiB after"
    );
    assert!(
        peak < base + 100 * 1024,
        "peak {peak} KiB (baseline {base} KiB)"
    );
}

/// Medium finding "the audit `flock` blocks the whole session" (15 s freeze observed), as issue 15
/// resolved it: appends take no lock, so another process cannot delay a call with one. (For
/// part of session 20 the writer locked the log file itself; a red-team pass found that a
/// reader's lock then kept `run` from starting. The writer's locks are `<log>.lock` and a guard
/// beside the anchor, never the log.)
#[test]
fn a_foreign_lock_on_the_audit_log_does_not_block_calls() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.ready_legacy();
    let log = s
        .project
        .target_dir()
        .join("mcp-dev/audit/fake-server.jsonl");
    let holder = std::fs::File::open(&log).unwrap();
    rustix::fs::flock(
        &holder,
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    )
    .expect("the log file itself is not locked by the session");
    let t = std::time::Instant::now();
    let m = s.call("1", "write", json!({"marker": "locked"}));
    assert_eq!(
        m.result()["structuredContent"]["args"],
        json!({"marker": "locked"}),
        "{}",
        m.raw
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let writer_lock = std::fs::File::open(log.with_file_name("fake-server.jsonl.lock")).unwrap();
    assert!(
        rustix::fs::flock(
            &writer_lock,
            rustix::fs::FlockOperation::NonBlockingLockShared
        )
        .is_err(),
        "the session holds the writer lock"
    );
    drop(holder);
    s.finish();
}

/// A session on the fake server without gating, ready, and the path of its audit log (the
/// tests of a log cut or removed while `run` writes it).
fn ungated_session_and_log() -> (common::session::Session, std::path::PathBuf) {
    let setup = Setup::new().arg("--no-gating");
    let log = setup
        .project
        .target_dir()
        .join("mcp-dev/audit/fake-server.jsonl");
    let mut s = setup.start();
    s.ready_legacy();
    (s, log)
}

/// Cuts `path` to `len` bytes, as another process would.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn cut_file(path: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// `m` is an `audit_failed` refusal, and the call carrying `marker` never reached the server.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn assert_refused_unrecorded(
    s: &common::session::Session,
    m: &common::rpc::Msg,
    marker: &str,
) -> serde_json::Value {
    let payload = m.tool_error_payload();
    assert_eq!(payload["error"], "audit_failed", "{}", m.raw);
    assert!(
        !s.fake_log_raw().iter().any(|l| l.contains(marker)),
        "the call ran with no audit record"
    );
    payload
}

/// The audit log cut by another process while `run` writes it through its map (`: > log`, a
/// log rotator's `copytruncate`): the next record used to land past the end of the file, and
/// `SIGBUS` ended the supervisor without a word (the host lost its server). Now the call is
/// refused and not forwarded (fail closed: nothing runs unrecorded), stderr says why, the
/// session goes on answering, and the next `run` sets the cut log aside and starts a new chain.
/// Linux: elsewhere the log is written with `write` (no map to fault).
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn an_audit_log_cut_while_running_refuses_calls_instead_of_killing_run() {
    let (mut s, log) = ungated_session_and_log();
    let before = s.call("1", "write", json!({"marker": "before"}));
    assert_eq!(
        before.result()["structuredContent"]["args"],
        json!({"marker": "before"}),
        "{}",
        before.raw
    );
    cut_file(&log, 0);
    let refused = s.call("2", "write", json!({"marker": "after"}));
    let payload = assert_refused_unrecorded(&s, &refused, "after");
    assert!(
        payload["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cut short by another process")),
        "{}",
        refused.raw
    );
    let line = s.wait_stderr("call refused: audit log unavailable");
    assert!(line.contains("cut short"), "{line}");
    // Still serving: the supervisor is alive and answers what needs no record.
    let listed = s.list_tools();
    assert!(!listed.is_empty());
    assert!(common::session::alive(s.supervisor_pid()));
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        0,
        "the cut log is not grown back"
    );
    // `audit verify` names the cut (the next `run` sets such a log aside and starts a new
    // chain: `damaged_audit_log_is_set_aside_and_run_starts`).
    let verified = s.cli(&["audit", "verify"]);
    assert_ne!(verified.code, 0, "{}", verified.stderr);
    verified.assert_stderr_has("is empty, but its anchor records head seq");
    verified.assert_stderr_has("the log was truncated");
    s.finish();
}

/// Red-team, session 19: the log cut inside the page `run` is writing, just below the end of
/// its records (no store faults there). The next call must not run unrecorded: it is refused
/// (`audit_failed`) and never reaches the server.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn an_audit_log_cut_inside_the_page_being_written_refuses_the_next_call() {
    let (mut s, log) = ungated_session_and_log();
    let records_len = |log: &std::path::Path| {
        let bytes = std::fs::read(log).unwrap();
        bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len()) as u64
    };
    // Calls until the records end well inside a page (a cut 50 bytes back stays in it).
    for n in 0.. {
        assert!(n < 200, "the records never ended inside a page");
        s.call(
            &format!("{}", 100 + n),
            "write",
            json!({"marker": "before"}),
        );
        let in_page = records_len(&log) % 4096;
        if (100..2500).contains(&in_page) {
            break;
        }
    }
    let cut = records_len(&log) - 50;
    cut_file(&log, cut);
    let refused = s.call("99", "write", json!({"marker": "after-the-cut"}));
    assert_refused_unrecorded(&s, &refused, "after-the-cut");
    s.finish();
}

/// Red-team, session 19: the reservation's NUL bytes trimmed off a live log (the file cut
/// exactly at the records' end: no store faults, no newline is lost). At a host's pace the
/// next call's flush compares the file's length first: refused, never forwarded.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn trimming_the_nul_bytes_off_a_live_log_refuses_the_next_call() {
    let (mut s, log) = ungated_session_and_log();
    s.call("1", "write", json!({"marker": "before"}));
    let bytes = std::fs::read(&log).unwrap();
    let records = bytes
        .iter()
        .position(|&c| c == 0)
        .expect("a live log ends in NULs");
    cut_file(&log, records as u64);
    std::thread::sleep(Duration::from_millis(5)); // a host's pace
    let refused = s.call("2", "write", json!({"marker": "after-the-trim"}));
    assert_refused_unrecorded(&s, &refused, "after-the-trim");
    s.finish();
}

/// `cargo clean` while `run` serves (a Rust developer's everyday command): it takes the audit
/// log and its lock with the target directory, and `run` went on writing every record into the
/// removed file: calls were forwarded with no record anyone could read. Now the next flush puts
/// the log back from the open file, says so on stderr, and the calls after the clean are in it
/// with a `log_restored` record; `audit verify` passes.
#[test]
fn cargo_clean_while_running_keeps_every_record() {
    let (mut s, log) = ungated_session_and_log();
    s.call("1", "write", json!({"marker": "before"}));
    let out = std::process::Command::new("cargo")
        .args(["clean", "--offline", "--manifest-path"])
        .arg(s.project.root.join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!log.exists(), "cargo clean took the log");
    // A second `run` started now finds no log and no `<log>.lock`: it is refused all the same
    // (the guard beside the anchor survives the clean) and creates no log of its own.
    let first_pid = s.supervisor_pid();
    let second = s
        .project
        .command(["run"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains(&format!("(pid {first_pid})")) && stderr.contains("one writer at a time"),
        "{stderr}"
    );
    assert!(!second.status.success());
    assert!(!log.exists(), "the refused run made no log");
    std::thread::sleep(Duration::from_millis(5)); // a host's pace
    let after = s.call("2", "write", json!({"marker": "after-the-clean"}));
    assert_eq!(
        after.result()["structuredContent"]["args"],
        json!({"marker": "after-the-clean"}),
        "{}",
        after.raw
    );
    let line = s.wait_stderr_matching("the log put back", |l| {
        l.contains("was removed while this run was writing it")
    });
    assert!(line.contains("the chain continues"), "{line}");
    let text = std::fs::read_to_string(&log).unwrap();
    let types: Vec<String> = text
        .trim_end_matches('\0')
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let restored = types
        .iter()
        .position(|t| t == "log_restored")
        .expect("a log_restored record");
    let calls = types.iter().filter(|t| *t == "tool_called").count();
    assert_eq!(calls, 2, "both calls recorded: {types:?}");
    assert!(restored > 0 && types[0] != "chain_restarted", "{types:?}");
    // The same chain, whole: the records before the clean are in it too.
    let verified = s.cli(&["audit", "verify"]);
    assert_eq!(verified.code, 0, "{}", verified.stderr);
    s.finish();
}

/// `cargo clean` also takes the stored copy of the server `run` executes: when the server then
/// exits, it could not be started again, and every later call was refused as "starting" for
/// good. Now `run` builds again and starts the fresh copy; a call sent while it builds waits
/// for it (red-team, session 21: it was refused as "restart mode manual") and is answered.
#[test]
fn a_server_that_exits_after_cargo_clean_is_built_and_started_again() {
    // The rebuild after `cargo clean` is a cold build: the wait is sized for a slow machine.
    let mut s = Setup::new()
        .args(&["--no-gating", "--first-start-budget", "150s"])
        .timeout(Duration::from_secs(200))
        .start();
    s.ready_legacy();
    let before = s.call("1", "write", json!({"marker": "before"}));
    let server = before.result()["structuredContent"]["pid"]
        .as_i64()
        .unwrap();
    let out = std::process::Command::new("cargo")
        .args(["clean", "--offline", "--manifest-path"])
        .arg(s.project.root.join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = rustix::process::Pid::from_raw(server as i32).unwrap();
    rustix::process::kill_process(server, rustix::process::Signal::KILL).unwrap();
    let line = s.wait_stderr("server failed to start");
    assert!(line.contains("is missing"), "{line}");
    s.wait_stderr("building again to start it from a fresh copy");
    // Sent during the rebuild, as a host that calls at once would.
    s.request(
        "2",
        "tools/call",
        Some(json!({"name": "write", "arguments": {"marker": "after-the-rebuild"}})),
    );
    s.wait_stderr_within("server started", Duration::from_secs(150));
    let after = s.response_within("2", Duration::from_secs(30));
    assert_eq!(
        after.result()["structuredContent"]["args"],
        json!({"marker": "after-the-rebuild"}),
        "{}",
        after.raw
    );
    s.finish();
}

/// Red-team, session 19: a stray `kill -BUS` used to reset the guard (Rust's handler restores
/// the default disposition), and the next cut ended `run` again. A sent `SIGBUS` is ignored;
/// the cut still refuses the call and `run` lives.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn a_stray_sigbus_leaves_the_audit_guard_in_place() {
    let (mut s, log) = ungated_session_and_log();
    s.call("1", "write", json!({"marker": "before"}));
    s.signal(rustix::process::Signal::BUS);
    std::thread::sleep(Duration::from_millis(300));
    assert!(common::session::alive(s.supervisor_pid()));
    cut_file(&log, 0);
    let refused = s.call("2", "write", json!({"marker": "after"}));
    assert_refused_unrecorded(&s, &refused, "after");
    assert!(common::session::alive(s.supervisor_pid()));
    s.finish();
}

/// Medium finding "a second supervisor for the same label removes the first one's control
/// socket": a second `run` (a host's probe copy) that exits leaves the first one reachable, and
/// says which pid holds the socket.
#[test]
fn a_second_supervisor_leaves_the_first_ones_socket_alone() {
    let mut s = Setup::new().start();
    s.ready_legacy();
    let first_pid = s.supervisor_pid();
    let out = s
        .project
        .command(["run"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Since issue 15 the second run stops at the audit log's writer lock (after waiting 3 s for
    // the first to exit), before it reaches the control socket; either way it names the pid.
    assert!(
        stderr.contains(&format!("(pid {first_pid}) holds the control socket"))
            || (stderr.contains(&format!("(pid {first_pid})"))
                && stderr.contains("one writer at a time")),
        "{stderr}"
    );
    s.cli(&["status", "--json"]).expect_code(0);
    s.finish();
}

/// Medium finding "SIGXFSZ kills the supervisor mid-append and leaves a torn record": under a
/// file-size limit, an append that does not fit fails with an error (EFBIG), the process lives,
/// and the log still verifies. Runs in a child copy of this test binary (the limit and the
/// signal disposition are per process).
#[test]
fn file_size_limit_fails_the_append_and_keeps_the_log_valid() {
    if std::env::var_os("HARDENING_FSIZE_CHILD").is_some() {
        use cargo_mcp_dev::audit::{AuditLog, KeyStore, verify};
        let dir = std::path::PathBuf::from(std::env::var_os("HARDENING_FSIZE_CHILD").unwrap());
        let keys = KeyStore::at(dir.join("state"));
        let path = dir.join("audit.jsonl");
        let mut log = AuditLog::open(&path, &keys).unwrap();
        cargo_mcp_dev::base::sys::unix::survive_file_size_limit().unwrap();
        // Set before the first flush: the writer cannot reserve space past its records (see
        // `audit::log`, "Writing through a map") and `write`s, until a write does not fit.
        let limit = 2000;
        rustix::process::setrlimit(
            rustix::process::Resource::Fsize,
            rustix::process::Rlimit {
                current: Some(limit),
                maximum: Some(limit),
            },
        )
        .unwrap();
        let mut failed = false;
        for _ in 0..20 {
            // Since issue 15 `append` seals into a batch and `flush` writes it.
            if let Err(e) = log
                .append("x", "R", None, json!({"pad": "p".repeat(100)}))
                .and_then(|_| log.flush())
            {
                assert!(e.to_string().contains("File too large"), "{e}");
                failed = true;
                break;
            }
        }
        assert!(failed, "the limit was never reached");
        let r = verify(&path, &keys).unwrap();
        assert!(r.records >= 2);
        drop(log);
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            bytes.ends_with(b"\n") && !bytes.contains(&0),
            "whole records only"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "file_size_limit_fails_the_append_and_keeps_the_log_valid",
            "--nocapture",
        ])
        .env("HARDENING_FSIZE_CHILD", tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child {:?}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Medium finding "writes under `target/mcp-dev` follow symlinks (a planted `latest.json` link
/// overwrote a file outside the project)": the file outside stays untouched.
#[test]
fn a_planted_latest_json_link_does_not_overwrite_outside_files() {
    let setup = Setup::new();
    let outside = setup.project.scratch().join("precious.txt");
    std::fs::write(&outside, "precious").unwrap();
    let launch = setup
        .project
        .target_dir()
        .join("mcp-dev/launch/fake-server");
    std::fs::create_dir_all(&launch).unwrap();
    std::os::unix::fs::symlink(&outside, launch.join("latest.json")).unwrap();
    let status_dir = setup.project.target_dir().join("mcp-dev/status");
    let _ = std::fs::remove_dir_all(&status_dir);
    std::fs::create_dir_all(status_dir.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(setup.project.scratch(), &status_dir).unwrap();
    let mut s = setup.start();
    s.ready_legacy();
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious");
    assert!(!s_is_link(&status_dir));
    assert!(!s_is_link(&launch.join("latest.json")));
    s.finish();
}

fn s_is_link(p: &std::path::Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

/// Low finding "a tampered middle record is not noticed when appending" (and the high finding
/// on set-aside logs), as issue 15 reshaped it: start reads only the anchored tail. Every
/// single-bit flip of every record, every deleted record and every truncation of a valid log is
/// caught by `audit verify`; every one that touches the anchored (last) record, every deleted
/// record and every truncation is also caught by the writer before a run's first append (the log
/// is set aside with its anchor and a new chain starts; it is never extended). Flips in earlier
/// records are left to `audit verify` (docs/SECURITY.md). Prints the counts (README,
/// Reliability).
#[test]
fn every_mutation_is_caught_by_verify_and_every_tail_one_by_the_writer() {
    use cargo_mcp_dev::audit::{AuditLog, KeyStore, open_for_run, verify};
    let tmp = tempfile::tempdir().unwrap();
    let keys = KeyStore::at(tmp.path().join("state"));
    let path = tmp.path().join("audit.jsonl");
    {
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for i in 0..8 {
            log.append(
                "tool_called",
                "R",
                Some("E"),
                json!({"callId": i, "tool": "w"}),
            )
            .unwrap();
        }
    }
    drop(open_for_run(&path, &keys).unwrap());
    let original = std::fs::read(&path).unwrap();
    let anchor_path = keys.anchor_path(&path).unwrap();
    let anchor = std::fs::read(&anchor_path).unwrap();
    let last_line_start = original[..original.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .map(|p| p + 1)
        .unwrap();
    // (mutated bytes, must the writer catch it at start?)
    let mut mutations: Vec<(Vec<u8>, bool)> = Vec::new();
    for offset in 0..original.len() {
        let mut m = original.clone();
        m[offset] ^= 0x01;
        mutations.push((m, offset >= last_line_start));
    }
    let lines: Vec<&[u8]> = original.split_inclusive(|&b| b == b'\n').collect();
    for skip in 0..lines.len() {
        let m: Vec<u8> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .flat_map(|(_, l)| l.iter().copied())
            .collect();
        mutations.push((m, true));
    }
    for cut in 0..original.len() {
        mutations.push((original[..cut].to_vec(), true));
    }
    let total = mutations.len();
    let tail_total = mutations.iter().filter(|(_, t)| *t).count();
    let (mut by_verify, mut at_start, mut tail_at_start) = (0, 0, 0);
    for (m, tail) in mutations {
        // Each mutation starts from the valid log's own anchor, at the original path.
        for entry in std::fs::read_dir(tmp.path()).unwrap() {
            let p = entry.unwrap().path();
            if p.to_string_lossy().contains(".set-aside-") {
                std::fs::remove_file(p).unwrap();
            }
        }
        std::fs::write(&path, &m).unwrap();
        std::fs::write(&anchor_path, &anchor).unwrap();
        if verify(&path, &keys).is_err() {
            by_verify += 1;
        }
        let (log, recovery) = open_for_run(&path, &keys).unwrap();
        drop(log);
        if recovery.is_some() {
            at_start += 1;
            if tail {
                tail_at_start += 1;
            }
        }
    }
    eprintln!(
        "audit mutations caught by audit verify: {by_verify}/{total}; by the writer before appending: {at_start}/{total} (all {tail_at_start}/{tail_total} that touch the anchored tail)"
    );
    assert_eq!(by_verify, total);
    assert_eq!(tail_at_start, tail_total);
}

/// Critical finding, property over a real session: 600 host lines of every shape (valid calls
/// with number and string ids, `"id": null`, no id, non-id ids, a method with a result, broken
/// JSON, bytes that are not UTF-8, cancellations), generated from a fixed seed, with gating on
/// and no grant. No `tools/call` reaches the server; every call with a valid id is answered
/// exactly once and has an `authorization_denied` audit record; every invalid one is answered
/// once with id null; a notification gets no answer.
#[test]
fn no_host_line_shape_gets_a_call_past_the_gate() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let shapes = proptest::collection::vec((0u8..10, proptest::arbitrary::any::<u32>()), 600)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let mut s = Setup::new().start();
    s.ready_legacy();
    let mut valid_ids: Vec<String> = Vec::new();
    let mut null_answers = 0;
    for (i, (shape, r)) in shapes.iter().enumerate() {
        let tool = if r % 2 == 0 { "write" } else { "echo" };
        let call = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0",{id}"method":"tools/call","params":{{"name":"{tool}","arguments":{{"marker":"m{i}"}}}}}}"#
            )
        };
        match shape {
            0 => {
                valid_ids.push(format!("{}", 1000 + i));
                s.send(&call(&format!(r#""id":{},"#, 1000 + i)));
            }
            1 => {
                valid_ids.push(format!("\"s{i}\""));
                s.send(&call(&format!(r#""id":"s{i}","#)));
            }
            2 => {
                null_answers += 1;
                s.send(&call(r#""id":null,"#));
            }
            3 => s.send(&call("")),
            4 => {
                null_answers += 1;
                let bad = ["{}", "true", "[]", "[1]", "false"][(*r as usize) % 5];
                s.send(&call(&format!(r#""id":{bad},"#)));
            }
            5 => {
                null_answers += 1;
                let junk: String = call("").chars().take((*r as usize) % 40 + 1).collect();
                s.send(&junk);
            }
            6 => {
                null_answers += 1;
                s.send_bytes(b"{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"id\":\xff}\n");
            }
            7 => s.send(&format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{}}}}}"#,
                r % 2000
            )),
            8 => {
                null_answers += 1;
                s.send(r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","result":{}}"#);
            }
            _ => {
                valid_ids.push(format!("\"w{i}\""));
                let params = ["[]", r#"{"name":5}"#, r#"{"arguments":{}}"#, r#"{"name":"write","arguments":[1]}"#]
                    [(*r as usize) % 4];
                s.send(&format!(
                    r#"{{"jsonrpc":"2.0","id":"w{i}","method":"tools/call","params":{params}}}"#
                ));
            }
        }
    }
    s.request("\"end\"", "ping", None);
    s.response("\"end\"");
    let msgs = s.drain_for(Duration::from_millis(800));
    let mut all = msgs;
    all.extend(s.drain_for(Duration::from_millis(200)));
    let answers: Vec<&common::rpc::Msg> = all.iter().filter(|m| m.is_response()).collect();
    for id in &valid_ids {
        let n = answers
            .iter()
            .filter(|m| m.id.as_deref() == Some(id.as_str()))
            .count();
        assert_eq!(n, 1, "answers to id {id}");
    }
    let nulls = answers
        .iter()
        .filter(|m| m.id.as_deref() == Some("null"))
        .count();
    assert_eq!(nulls, null_answers, "answers with id null");
    let log = s.fake_log_raw();
    assert!(
        !log.iter().any(|l| l.contains("tools/call")),
        "a tools/call reached the server: {:?}",
        log.iter().find(|l| l.contains("tools/call"))
    );
    assert!(s.side_effects().is_empty());
    let audit = std::fs::read_to_string(
        s.project
            .target_dir()
            .join("mcp-dev/audit/fake-server.jsonl"),
    )
    .unwrap();
    let denied = audit
        .lines()
        .filter(|l| l.contains("\"type\":\"authorization_denied\""))
        .count();
    assert_eq!(denied, valid_ids.len(), "one denial record per valid call");
    eprintln!(
        "host lines tried: {} ({} valid calls denied and audited, {null_answers} invalid answered with id null)",
        shapes.len(),
        valid_ids.len()
    );
    s.finish();
}

/// Review of issue 15: the same stall, with the host's members in the order `jsonrpc, method, params, id`
/// (valid JSON-RPC; forwarded byte for byte). The shell takes such a request for a notification
/// (`is_notification_line` reads the prefix of the session's own sorted serialisation): it is
/// refused at the 16 MiB bound instead of 64 and then never answered, although its
/// `tool_called` record is written. Every request must still get exactly one answer.
#[test]
fn requests_in_any_member_order_while_the_server_stalls_are_answered() {
    let mut h = raw_host::Host::start(&["stall", "echo"], &[("FAKE_STALL_MS", "120000")]);
    h.ready();
    h.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stall","arguments":{}}}"#);
    std::thread::sleep(Duration::from_millis(300));
    let big = "b".repeat(1 << 20);
    let n = 100;
    let mut stdin = h.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        for i in 0..n {
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"echo","arguments":{{"pad":"{big}"}}}},"id":{}}}"#,
                100 + i
            );
            stdin.write_all(line.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        stdin
    });
    let stdin = writer.join().unwrap();
    h.stdin = Some(stdin);
    h.wait_stderr(
        "the server is not reading its stdin",
        Duration::from_secs(60),
    );
    // Read the answers on a thread: with the bug, none ever comes.
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut stdout = std::mem::replace(&mut h.stdout, std::io::BufReader::new(spent_stdout()));
    std::thread::spawn(move || {
        use std::io::BufRead;
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut refused = 0;
    while refused == 0 && std::time::Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
            if v["error"]["data"]["error"] == json!("server_not_reading") {
                refused += 1;
            }
        }
    }
    let _ = h.child.kill();
    assert!(
        refused > 0,
        "{n} x 1 MiB requests to a stalled server: none answered (refused as notifications, never answered)"
    );
}

/// A ChildStdout to put in place of the one moved to the reader thread.
fn spent_stdout() -> std::process::ChildStdout {
    let mut c = std::process::Command::new("true")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = c.stdout.take().unwrap();
    let _ = c.wait();
    out
}

/// Red-team round 19: SECURITY.md's known limit said links planted *while* a session runs are followed because
/// the session's writes are plain writes. The file-level half is now fixed (`write_atomic`
/// replaces a link at `status/<label>.json`), but a link planted in place of the *directory*
/// is followed: `write_atomic` accepts a symlinked parent by design ("only the final
/// component is guarded"). The agent, with a shell in the project, swaps
/// `target/mcp-dev/status` for a link to any directory the user can write; the next status
/// publish (any call) creates or replaces `<label>.json` there. The same holds for
/// `facts/` and `launch/<label>/` (`latest.json`, `<epoch>.json`, written at each rebuild).
/// Expected: the session's own directories are opened once (or re-checked with
/// `symlink_metadata`/`O_NOFOLLOW|O_DIRECTORY` and `renameat` relative to a held directory
/// descriptor); a directory replaced by a link is refused, and nothing is written outside.
#[test]
fn a_status_directory_swapped_for_a_link_while_running_is_not_written_through() {
    let setup = Setup::new();
    let (outside, precious) = a_precious_file_outside(&setup);
    let status_dir = setup.project.target_dir().join("mcp-dev/status");
    let mut s = setup.start();
    s.ready_legacy();
    s.wait_status("the session published", |v| v.get("lifecycle").is_some());
    // The agent, while the session runs: `mv status status.old && ln -s ~/x status`.
    std::fs::rename(&status_dir, status_dir.with_file_name("status.old")).unwrap();
    std::os::unix::fs::symlink(&outside, &status_dir).unwrap();
    // Anything that changes the status document: a gated call refused.
    let _ = s.call("7", "write", json!({"marker": "m"}));
    std::thread::sleep(Duration::from_millis(1500));
    assert_untouched(&precious);
    s.finish();
}

/// Red-team round 20: round 19 wrote the session's files through `DirWriter`, which holds `target/mcp-dev` open
/// and refuses a link at the root. But `run` builds it with `DirWriter::open(..).ok()` and,
/// when that fails, `write_own` silently falls back to plain `write_atomic`, which follows
/// every directory link. So the agent first makes `target/mcp-dev` a link to a real directory
/// in the project (`mv target/mcp-dev target/m && ln -s m target/mcp-dev`, harmless-looking;
/// the session starts), and then, while the session runs, does round 19's attack:
/// `mv status status.old && ln -s ~/x status`. The status document is written outside.
/// Expected: no unguarded fallback (open the real directory the link names with O_NOFOLLOW
/// below it, or refuse to start / refuse to write with a message).
#[test]
fn a_linked_target_mcp_dev_writes_none_of_the_sessions_files() {
    let setup = Setup::new();
    let (outside, precious) = a_precious_file_outside(&setup);
    let target = setup.project.target_dir();
    let root = target.join("mcp-dev");
    let real = target.join("m");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::rename(&root, &real).unwrap();
    std::os::unix::fs::symlink("m", &root).unwrap();
    let mut s = setup.start();
    // The build then fails (its lock refuses the linked root), but the session runs and
    // publishes its status: no server is needed.
    s.initialize();
    // The session says at once that it writes none of its own files this time.
    let warned = s.wait_stderr("warning: ");
    assert!(warned.contains("not written this session"), "{warned}");
    let status_dir = real.join("status");
    if status_dir.exists() {
        std::fs::rename(&status_dir, real.join("status.old")).unwrap();
    }
    std::os::unix::fs::symlink(&outside, &status_dir).unwrap();
    // Anything that changes the status document: a save starts a build.
    let main = s.project.path("src/main.rs");
    let text = std::fs::read_to_string(&main).unwrap();
    std::fs::write(&main, text + "\n// saved\n").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::fs::read_to_string(&precious).unwrap() == "precious"
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_untouched(&precious);
    s.finish();
}

/// `publish_status` (run.rs, next to round 19's `write_own`) reads the status file back with a
/// plain `std::fs::read` whenever the snapshot says `stopping` (to spare another live
/// supervisor's document). That read follows links and blocks: the agent replaces
/// `target/mcp-dev/status/<label>.json` with a named pipe (`rm f && mkfifo f`) and the
/// supervisor hangs for ever in `open` as it shuts down (the host closed the connection): it
/// never exits, its server is never stopped. (A link to `/dev/zero` instead makes it read
/// without end and run out of memory.)
/// Expected: the read goes through the no-follow, non-blocking, regular-files-only, bounded
/// opener (`keys::open_nofollow`-like) relative to the held directory, or the owner pid is
/// kept in memory instead of read back.
#[test]
fn a_fifo_planted_at_the_status_file_does_not_hang_shutdown() {
    let setup = Setup::new();
    let status = setup
        .project
        .target_dir()
        .join(format!("mcp-dev/status/{LABEL}.json"));
    let mut s = setup.start();
    s.ready_legacy();
    s.wait_status("the session published", |v| v.get("lifecycle").is_some());
    std::thread::sleep(Duration::from_millis(500));
    plant_fifo(&status);
    s.close_stdin();
    let exited = s.wait_exit(Duration::from_secs(20));
    if exited.is_none() {
        // Let the stuck open go (a writer comes), so the test's session can end.
        use std::os::unix::fs::OpenOptionsExt;
        let _w = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&status);
        let _ = s.wait_exit(Duration::from_secs(20));
    }
    assert!(
        exited.is_some(),
        "the supervisor did not exit within 20 s of the host closing the connection: it is stuck opening a named pipe planted at its status file"
    );
}

/// Every cycle (`build`, `check`, `identity`, each rebuild of `run`) reads the previous identity
/// record back; the agent can write `target/`: a named pipe planted at
/// `target/mcp-dev/identity/<label>.dev.json` is refused, not waited on. Red-team round 21:
/// `build` (and the supervisor's next rebuild) hung for ever in `open`, as the status file's
/// read did before round 20.
#[test]
fn a_fifo_planted_at_the_identity_record_does_not_hang_a_build() {
    let p = Project::built_fake_server(SUITE);
    p.build(&[]).expect_code(0);
    let file = p.identity_file(LABEL, "dev");
    plant_fifo(&file);
    assert!(
        ends_within_30_s(&p, "build", &file),
        "`cargo mcp-dev build` did not finish within 30 s: it is stuck opening a named pipe planted at its identity record"
    );
}

/// `run` reads its recorded facts (`target/mcp-dev/facts/<label>.json`) at start: a named pipe
/// planted there is not waited on (no link followed either). Red-team round 21: every later
/// `run` hung before it answered anything.
#[test]
fn a_fifo_planted_at_the_facts_file_does_not_hang_run() {
    let p = Project::built_fake_server(SUITE);
    p.build(&[]).expect_code(0);
    let facts = p.target_dir().join(format!("mcp-dev/facts/{LABEL}.json"));
    // Control: with no pipe, a host that leaves at once (stdin closed) ends the run.
    assert!(
        ends_within_30_s(&p, "run", &facts),
        "control: `run` with a closed stdin should end"
    );
    plant_fifo(&facts);
    assert!(
        ends_within_30_s(&p, "run", &facts),
        "`cargo mcp-dev run` did not end within 30 s of its host leaving: it is stuck opening a named pipe planted at its facts file"
    );
}

/// Replaces `path` (or makes it) with a named pipe.
fn plant_fifo(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}

/// Runs `cargo-mcp-dev COMMAND` with stdin closed and waits up to 30 s for it to end; on
/// timeout opens `fifo` for writing (to let a stuck `open` go) and kills it. Whether it ended.
fn ends_within_30_s(p: &Project, command: &str, fifo: &std::path::Path) -> bool {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = (p.command([command]).stdin(Stdio::null()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    use std::os::unix::fs::OpenOptionsExt;
    let _w = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
    std::thread::sleep(Duration::from_millis(500));
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// The other file the session has written under `target/mcp-dev` since issue 12 is not on
/// the guarded path: when the host leaves during the first build, `cargo mcp-dev
/// background-build --log target/mcp-dev/background-build.log` opens its log with
/// `File::create`, which follows a link and truncates its target. The agent (it is the host,
/// and can write `target/`) plants `background-build.log -> ~/.bashrc`, starts a session and
/// closes it during the first build: the user's file is emptied and filled with cargo's
/// output.
/// Expected: the log is written like the session's other files (no link followed:
/// `write_atomic`/O_NOFOLLOW|O_CREAT|O_TRUNC after removing a planted link, relative to the
/// held directory).
#[test]
fn a_link_at_background_build_log_is_not_written_through() {
    let s = Setup::new().arg("--no-gating");
    let outside = s.project.scratch().join("bashrc");
    std::fs::write(&outside, "precious").unwrap();
    // Another build holds the lock, so the first build is surely running when the host leaves.
    let lock = s.hold_build_lock();
    let log = s.project.target_dir().join("mcp-dev/background-build.log");
    let _ = std::fs::remove_file(&log);
    std::os::unix::fs::symlink(&outside, &log).unwrap();
    let mut s = s.start();
    s.wait_stderr("waiting for another cargo mcp-dev build");
    s.initialize();
    s.close_stdin();
    let _ = s.wait_exit(Duration::from_secs(10));
    let _ = s.wait_stderr_within(
        "the host closed the connection during the first build",
        Duration::from_secs(5),
    );
    drop(lock);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&outside).unwrap_or_default() == "precious"
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    // Give the background build the time to end either way before judging.
    std::thread::sleep(Duration::from_millis(500));
    let now = std::fs::read_to_string(&outside).unwrap_or_default();
    assert_eq!(
        now,
        "precious",
        "the background build's log was written through a link planted at {}",
        log.display()
    );
}

/// A directory outside the project holding a file named like the status document: where a
/// planted link would send the session's writes.
fn a_precious_file_outside(setup: &Setup) -> (std::path::PathBuf, std::path::PathBuf) {
    let outside = setup.project.scratch().join("outside-dir");
    std::fs::create_dir_all(&outside).unwrap();
    let precious = outside.join(format!("{LABEL}.json"));
    std::fs::write(&precious, "precious").unwrap();
    (outside, precious)
}

fn assert_untouched(precious: &std::path::Path) {
    assert_eq!(
        std::fs::read_to_string(precious).unwrap(),
        "precious",
        "the supervisor wrote its status document through a directory link planted while it ran: {}",
        precious.display()
    );
}
