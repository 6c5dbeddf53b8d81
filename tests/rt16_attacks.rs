//! Red-team round 16: the control protocol (client side: `approve`, `status`, `approve
//! --follow`) and `audit verify` on hostile logs. Every test drives the real binary; the
//! supervisor is a fake control socket whose answers are the input (as in
//! `tests/approve_follow.rs`), so no server is built. Each test failed on the code as found.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cargo_mcp_dev::audit::{AuditLog, KeyStore};
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

/// `approve --yes --tool NAME --json` prints the grant the supervisor answered with
/// `json!(…).to_string()`: JSON escapes C0 controls only, so a server-chosen tool name puts
/// C1 controls (U+009B is CSI), DEL and bidi overrides on the human's terminal raw. Round 9
/// fixed the same thing in `approve --list --json` (`sanitize::json_text`), not here.
#[test]
fn rt16_approve_json_escapes_server_tool_names() {
    let (dir, sock, _seen) = fake_supervisor(|req| match req["op"].as_str() {
        Some("status") => json!({"ok": true, "result": status_doc(EVIL, vec![])}),
        Some("approve") => json!({"ok": true, "result": {"grant": grant(EVIL)}}),
        _ => json!({"ok": false, "error": "unexpected"}),
    });
    let out = bin()
        .args(["approve", "--yes", "--json", "--tool", EVIL, "--socket"])
        .arg(&sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("G1"), "{stdout}");
    assert_no_terminal_controls("`approve --yes --tool --json`", &stdout);
}

/// `approve --revoke all --json` prints the revoked grants with `r.to_string()`: the same raw
/// C1/DEL/bidi characters of server tool names.
#[test]
fn rt16_revoke_json_escapes_server_tool_names() {
    let (dir, sock, _seen) = fake_supervisor(|req| match req["op"].as_str() {
        Some("revoke") => json!({"ok": true, "result": {"revoked": [grant(EVIL)]}}),
        _ => json!({"ok": false, "error": "unexpected"}),
    });
    let out = bin()
        .args(["approve", "--revoke", "all", "--json", "--socket"])
        .arg(&sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("G1"), "{stdout}");
    assert_no_terminal_controls("`approve --revoke all --json`", &stdout);
}

/// `approve --call ID --yes --json`: the grant of one call, same raw output.
#[test]
fn rt16_approve_call_json_escapes_server_tool_names() {
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
    let out = bin()
        .args(["approve", "--call", "7", "--yes", "--json", "--socket"])
        .arg(&sock)
        .env("CARGO_MCP_DEV_HOME", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("G1"), "{stdout}");
    assert_no_terminal_controls("`approve --call --yes --json`", &stdout);
}

/// The client reads the supervisor's answer with an unbounded `read_line` and only a per-read
/// timeout (15 s): a peer that writes a byte now and then (or an endless line) keeps
/// `status`/`approve` reading forever, its buffer growing. The answer should be bounded in
/// size and in total time.
#[test]
fn rt16_control_client_gives_up_on_an_endless_answer() {
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

// ----- approve --follow through a pseudo-terminal ------------------------------------------

fn pty() -> (std::fs::File, OwnedFd) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY,
        rustix::fs::Mode::empty(),
    )
    .expect("open the pty slave");
    (std::fs::File::from(master), slave)
}

struct Screen(Arc<Mutex<String>>);

impl Screen {
    fn read_from(mut master: std::fs::File) -> Screen {
        let text = Arc::new(Mutex::new(String::new()));
        let copy = text.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                copy.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Screen(text)
    }

    fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    fn wait_for(&self, from: usize, needle: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let t = self.text();
            if let Some(i) = t.get(from..).and_then(|rest| rest.find(needle)) {
                return from + i + needle.len();
            }
            assert!(
                Instant::now() < deadline,
                "the inbox never showed `{needle}`; screen:\n{t}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `approve --follow` reads keys on a thread into a queue and takes the next queued key as the
/// decision on whatever request it draws next. A key pressed before a request was on screen
/// (a double press of `o` on call A, or `a` pressed twice) decides the next call, B, the
/// moment it is drawn: B is granted without the human ever having seen it. "What the human
/// reads is what is granted": keys typed before a screen is drawn must not decide it.
#[test]
fn rt16_follow_typeahead_key_never_decides_an_unseen_call() {
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
    let at = screen.wait_for(at, "[o] this call once");
    assert!(
        screen.text()[..at].contains("\"A\""),
        "call A is on screen: {}",
        screen.text()
    );
    // A double press while A is on screen.
    keyboard.write_all(b"oo").unwrap();
    screen.wait_for(at, "(grant G1, this call once)");
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

// ----- audit verify on a hostile log --------------------------------------------------------

fn audit_cmd(state: &Path, log: &Path, args: &[&str]) -> std::process::Output {
    bin()
        .arg("audit")
        .args(args)
        .arg(log)
        .env("CARGO_MCP_DEV_HOME", state)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Whoever can write `target/` can write a line into the log. `audit verify` names the first
/// bad line with serde's message, which quotes an unknown field name raw (`unknown field
/// `…``): a field name holding `\n` (a JSON escape) prints a line break into the `error:` line,
/// and the text after it is a line of the attacker's choosing — here one that reads like
/// `audit verify`'s own success line. `status::error` goes through `sanitize::lines`, which
/// escapes controls but keeps line breaks; what the log holds should stay on the error's line
/// (as every status line does).
#[test]
fn rt16_verify_failure_cannot_forge_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let keys = KeyStore::at(state.clone());
    let log = tmp.path().join("audit/srv.jsonl");
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append("tool_called", "R", Some("E1"), json!({"tool": "read"}))
        .unwrap();
    w.flush().unwrap();
    drop(w);
    let forged = format!(
        "audit log verified: {} (9 records, 1 runs, 1 epochs, head 9 0123456789abcdef)",
        log.display()
    );
    let key = format!("x\n{forged}\n");
    let mut line = serde_json::to_string(&json!({"v": 1, "seq": 2})).unwrap();
    line.pop();
    line.push_str(&format!(",{}:1}}\n", serde_json::to_string(&key).unwrap()));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    let out = audit_cmd(&state, &log, &["verify"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("failed verification"), "{stderr}");
    assert!(
        !stderr.lines().any(|l| l.starts_with("audit log verified")),
        "a field name in the log forged a line of `audit verify`'s output:\n{stderr}"
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
fn rt16_idle_control_connections_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/x.sock");
    let (tx, _rx) = crossbeam_channel::unbounded();
    let served = cargo_mcp_dev::control::serve(&path, tx).unwrap();
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
