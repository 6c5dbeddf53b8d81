//! The control socket seen from both ends, against hostile peers (red-team round 16): the
//! client commands (`approve`, `status`, `approve --follow`) talk to a fake supervisor whose
//! answers are the input, so no server is built; the serving side is `control::serve` itself.
//! Server tool names reach `--json` output escaped, an endless answer is given up on, idle
//! connections are capped, and a key typed ahead never decides a call the human has not seen.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::pty::{Screen, pty};
use serde_json::{Value, json};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"));
    c.arg("mcp-dev");
    c
}

/// A fake supervisor on a control socket: every connection is handed to `handler` on its own
/// thread. Returns the temp dir (keep it alive) and the socket path.
fn fake_socket(
    handler: impl Fn(UnixStream) + Send + Sync + 'static,
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    // The key `run` would have made in the state directory (the commands below point
    // CARGO_MCP_DEV_HOME here): the clients prove their requests with it (issue 36).
    cargo_mcp_dev::audit::KeyStore::at(dir.path())
        .load_or_create_key()
        .unwrap();
    let sock = dir.path().join("c.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let h = handler.clone();
            std::thread::spawn(move || h(stream));
        }
    });
    (dir, sock)
}

/// A fake supervisor answering one JSON line per request with `answer(request)`; every request
/// is recorded.
fn fake_supervisor(
    answer: impl Fn(&Value) -> Value + Send + Sync + 'static,
) -> (tempfile::TempDir, PathBuf, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let (dir, sock) = fake_socket(move |stream| {
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return;
        }
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            return;
        };
        let a = answer(&request);
        log.lock().unwrap().push(request);
        let mut s = &stream;
        let _ = writeln!(s, "{a}");
    });
    (dir, sock, seen)
}

const EVIL: &str = "read\u{202e}eteled\u{9b}2J\u{7f}";

fn grant(tool: &str) -> Value {
    json!({"id": "G1", "toolScope": [tool], "credentialScope": [], "executionEpoch": "E1",
           "expiresWhen": "epochEnd", "kind": "epoch", "channel": "terminal"})
}

fn status_doc(tool: &str, denied: Vec<Value>) -> Value {
    json!({"label": "srv", "agentRun": "R", "state": "ready",
           "server": {"pid": 1, "epoch": "E1", "identityDigest": "sha256:ab"},
           "catalogTools": [tool],
           "catalogDetails": [{"name": tool, "description": "d"}],
           "toolPolicy": {tool: {"gated": true, "mode": "per-epoch", "credentialScopes": []}},
           "pendingApproval": {"tools": [tool], "credentialScopes": []},
           "policy": {"credentialScopes": [], "credentialScopeEnv": {}},
           "sinceLastApproval": null, "deniedCalls": denied, "grants": []})
}

fn assert_no_terminal_controls(what: &str, stdout: &str) {
    for bad in ['\u{202e}', '\u{9b}', '\u{7f}'] {
        assert!(
            !stdout.contains(bad),
            "{what} wrote U+{:04X} from a server tool name to the terminal raw (SECURITY.md: --json output writes controls and bidi characters as JSON escapes): {stdout:?}",
            bad as u32
        );
    }
}

/// Runs `approve ARGS --socket SOCK` (a grant answered as JSON): it succeeds, prints the
/// grant, and no terminal control from a tool name reaches the terminal raw.
fn grant_json_is_escaped(
    dir: &tempfile::TempDir,
    sock: &std::path::Path,
    args: &[&str],
    what: &str,
) {
    let out = bin()
        .args(args)
        .arg("--socket")
        .arg(sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout} {stderr}");
    assert!(stdout.contains("G1"), "{stdout}");
    assert_no_terminal_controls(what, &stdout);
}

/// `approve --yes --tool NAME --json` prints the grant the supervisor answered with
/// `json!(…).to_string()`: JSON escapes C0 controls only, so a server-chosen tool name puts
/// C1 controls (U+009B is CSI), DEL and bidi overrides on the human's terminal raw. Round 9
/// fixed the same thing in `approve --list --json` (`sanitize::json_text`), not here.
#[test]
fn approve_json_escapes_server_tool_names() {
    let (dir, sock, _seen) = fake_supervisor(|req| match req["op"].as_str() {
        Some("status") => json!({"ok": true, "result": status_doc(EVIL, vec![])}),
        Some("approve") => json!({"ok": true, "result": {"grant": grant(EVIL)}}),
        _ => json!({"ok": false, "error": "unexpected"}),
    });
    grant_json_is_escaped(
        &dir,
        &sock,
        &["approve", "--yes", "--json", "--tool", EVIL],
        "`approve --yes --tool --json`",
    );
}

/// `approve --revoke all --json` prints the revoked grants with `r.to_string()`: the same raw
/// C1/DEL/bidi characters of server tool names.
#[test]
fn revoke_json_escapes_server_tool_names() {
    let (dir, sock, _seen) = fake_supervisor(|req| match req["op"].as_str() {
        Some("revoke") => json!({"ok": true, "result": {"revoked": [grant(EVIL)]}}),
        _ => json!({"ok": false, "error": "unexpected"}),
    });
    grant_json_is_escaped(
        &dir,
        &sock,
        &["approve", "--revoke", "all", "--json"],
        "`approve --revoke all --json`",
    );
}

/// `approve --call ID --yes --json`: the grant of one call, same raw output.
#[test]
fn approve_call_json_escapes_server_tool_names() {
    let call = json!({"callId": "7", "tool": EVIL, "argumentsDigest": "sha256:cd", "epoch": "E1",
                      "reason": "authorization_required", "arguments": "{}",
                      "argumentsTruncated": false});
    let denied = call.clone();
    let (dir, sock, _seen) = fake_supervisor(move |req| match req["op"].as_str() {
        Some("status") => json!({"ok": true, "result": status_doc(EVIL, vec![denied.clone()])}),
        Some("deniedCall") => json!({"ok": true, "result": denied.clone()}),
        Some("approveCall") => {
            let mut g = grant(EVIL);
            g["kind"] = json!("call");
            json!({"ok": true, "result": {"grant": g}})
        }
        _ => json!({"ok": false, "error": "unexpected"}),
    });
    grant_json_is_escaped(
        &dir,
        &sock,
        &["approve", "--call", "7", "--yes", "--json"],
        "`approve --call --yes --json`",
    );
}

/// The client reads the supervisor's answer with an unbounded `read_line` and only a per-read
/// timeout (15 s): a peer that writes a byte now and then (or an endless line) keeps
/// `status`/`approve` reading forever, its buffer growing. The answer should be bounded in
/// size and in total time.
#[test]
fn control_client_gives_up_on_an_endless_answer() {
    let (dir, sock) = fake_socket(|stream| {
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        let mut s = &stream;
        if s.write_all(b"{\"ok\":true,\"result\":\"").is_err() {
            return;
        }
        // One byte every 100 ms, never a newline.
        while s.write_all(b"a").is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut child = bin()
        .args(["status", "--socket"])
        .arg(&sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    let exited = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        exited,
        "`status` was still reading the supervisor's answer after 40 s (a per-read timeout only, no bound on the answer)"
    );
}

/// `approve --follow` reads keys on a thread into a queue and takes the next queued key as the
/// decision on whatever request it draws next. A key pressed before a request was on screen
/// (a double press of `o` on call A, or `a` pressed twice) decides the next call, B, the
/// moment it is drawn: B is granted without the human ever having seen it. "What the human
/// reads is what is granted": keys typed before a screen is drawn must not decide it.
#[test]
fn follow_typeahead_key_never_decides_an_unseen_call() {
    let call = |id: &str, tool: &str| {
        json!({"callId": id, "tool": tool, "argumentsDigest": format!("sha256:{id}"),
               "epoch": "E1", "reason": "authorization_required",
               "arguments": format!("{{\"call\":\"{id}\"}}"), "argumentsTruncated": false})
    };
    let decided = Arc::new(Mutex::new(Vec::<String>::new()));
    let d = decided.clone();
    let (dir, sock, seen) = fake_supervisor(move |req| {
        let done = d.lock().unwrap().clone();
        // Call A waits first; once A is decided, the agent's next call B waits.
        let waiting: Vec<Value> = if done.is_empty() {
            vec![call("\"A\"", "write")]
        } else {
            vec![call("\"B\"", "delete_everything")]
        };
        match req["op"].as_str() {
            Some("status") => json!({"ok": true, "result": status_doc("write", waiting)}),
            Some("deniedCall") => {
                let id = req["callId"].as_str().unwrap_or("");
                let c = if id.contains('A') {
                    call("\"A\"", "write")
                } else {
                    call("\"B\"", "delete_everything")
                };
                json!({"ok": true, "result": c})
            }
            Some("approveCall") => {
                d.lock()
                    .unwrap()
                    .push(req["callId"].as_str().unwrap_or("").to_string());
                let mut g = grant(req["tool"].as_str().unwrap_or(""));
                g["kind"] = json!("call");
                g["expiresWhen"] = json!("firstUse");
                json!({"ok": true, "result": {"grant": g}})
            }
            _ => json!({"ok": false, "error": "unexpected"}),
        }
    });
    let (master, slave) = pty();
    let mut keyboard = master.try_clone().unwrap();
    let screen = Screen::read_from(master);
    let mut inbox = bin()
        .args(["approve", "--follow", "--socket"])
        .arg(&sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let at = screen.wait_for(0, "A call needs a grant");
    let at = screen.wait_for(at, "[o] only this call");
    assert!(
        screen.text()[..at].contains("\"A\""),
        "call A is on screen: {}",
        screen.text()
    );
    // A double press while A is on screen.
    keyboard.write_all(b"oo").unwrap();
    screen.wait_for(at, "(grant G1, this call only)");
    std::thread::sleep(Duration::from_secs(3));
    let _ = keyboard.write_all(b"q");
    std::thread::sleep(Duration::from_millis(500));
    let _ = inbox.kill();
    let _ = inbox.wait();
    let decided = decided.lock().unwrap().clone();
    let requests = seen.lock().unwrap().clone();
    assert_eq!(
        decided.first().map(String::as_str),
        Some("\"A\""),
        "A was approved: {requests:?}"
    );
    assert!(
        !decided.iter().any(|c| c.contains('B')),
        "call B (tool delete_everything) was granted by a key pressed before it was drawn; decided: {decided:?}\nscreen:\n{}",
        screen.text()
    );
}

// ----- the control socket's server side -----------------------------------------------------

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// `control::serve` spawns one thread per accepted connection, without a cap, and each waits
/// up to 30 s for a request line (and, answering, forever for a peer that does not read: no
/// write timeout). A peer that opens connections and sends nothing gets a thread each: 200
/// idle connections, 200 threads (120 in this test, below the listen backlog so a capped
/// acceptor cannot block the connects) (each then feeds the session's unbounded event channel once
/// it sends a line). Connections in flight should be capped (the rest refused or made to wait
/// in the listen backlog), like every other queue.
#[test]
fn idle_control_connections_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/x.sock");
    let (tx, _rx) = crossbeam_channel::unbounded();
    let proof = cargo_mcp_dev::face::control_socket::ControlProof::from_key(
        &cargo_mcp_dev::audit::AuditKey::from_bytes([1; 32]),
    );
    let served = cargo_mcp_dev::face::control_socket::serve(&path, tx, proof).unwrap();
    assert!(served.owned());
    let mut idle = Vec::new();
    for _ in 0..120 {
        if let Ok(s) = UnixStream::connect(&path) {
            idle.push(s);
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let n = threads_named("control-conn");
    drop(idle);
    assert!(
        n <= 64,
        "{n} threads serve 120 idle control connections (one thread per connection, no cap)"
    );
}

/// A `run` started by a host with another environment than the shell's (SDK clients pass only
/// HOME, PATH and a few more: no `XDG_RUNTIME_DIR`) binds its socket in another directory than
/// `approve`/`status` in the user's terminal would look first. They find it wherever it is
/// bound (issue 33: the terminal is where the person approves).
#[test]
fn status_finds_a_socket_bound_by_a_run_with_another_environment() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-server");
    let home = tempfile::tempdir().unwrap();
    let xdg = home.path().join("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let target = home.path().join("target");
    let status = |xdg_runtime: Option<&std::path::Path>| {
        let mut c = bin();
        c.args(["status", "--json", "--manifest-path"])
            .arg(fixture.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_MCP_DEV_HOME")
            .env_remove("XDG_STATE_HOME")
            .env("HOME", home.path());
        match xdg_runtime {
            Some(d) => c.env("XDG_RUNTIME_DIR", d),
            None => c.env_remove("XDG_RUNTIME_DIR"),
        };
        c.stdin(Stdio::null()).output().unwrap()
    };
    // Nobody bound: the error names where this environment looks first.
    let out = status(Some(&xdg));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let first = err
        .split("cannot connect to ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or_else(|| panic!("{err}"))
        .to_string();
    assert!(first.starts_with(&xdg.display().to_string()), "{err}");
    let name = std::path::Path::new(&first).file_name().unwrap().to_owned();
    // A `run` without XDG_RUNTIME_DIR binds in the state directory (HOME-based).
    let run_dir = home.path().join(".local/state/cargo-mcp-dev/run");
    std::fs::create_dir_all(&run_dir).unwrap();
    cargo_mcp_dev::audit::KeyStore::at(home.path().join(".local/state/cargo-mcp-dev"))
        .load_or_create_key()
        .unwrap();
    let listener = UnixListener::bind(run_dir.join(&name)).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let mut s = &stream;
            let _ = writeln!(
                s,
                "{}",
                json!({"ok": true, "result": status_doc("write_item", vec![])})
            );
        }
    });
    let out = status(Some(&xdg));
    assert!(
        out.status.success(),
        "status did not find the socket bound by a run without XDG_RUNTIME_DIR: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("write_item"));
}
