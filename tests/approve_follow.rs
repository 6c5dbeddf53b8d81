//! `cargo mcp-dev approve --follow` through a pseudo-terminal: the terminal inbox shows a call
//! waiting for a grant with its arguments and grants it with one key; without a terminal it
//! refuses. Also what `approve --list` prints of server-chosen tool names.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::pty::{Screen, pty};
use common::session::{Session, Setup};
use serde_json::json;

fn status_json(s: &Session) -> serde_json::Value {
    let out = s.cli(&["status", "--json"]);
    out.expect_code(0);
    serde_json::from_str(&out.stdout).expect("status --json")
}

#[test]
fn follow_grants_one_call_with_one_key() {
    let mut s = Setup::new().timeout(Duration::from_secs(90)).start();
    let (_, epoch) = s.ready_legacy();
    let (master, slave) = pty();
    let mut keyboard = master.try_clone().unwrap();
    let screen = Screen::read_from(master);
    let mut cmd = s.project.command(["approve", "--follow"]);
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    let mut inbox = cmd.spawn().expect("start approve --follow");
    let at = screen.wait_for(0, "waiting for calls that need a grant");

    // The agent calls; the call is refused and shows up in the inbox with its arguments.
    let m = s.call("1", "write", json!({"marker": "pty-\u{202e}once"}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required")
    );
    let at = screen.wait_for(at, "A call needs a grant");
    let at = screen.wait_for(at, "arguments");
    let shown = screen.text();
    assert!(shown.contains(&epoch), "the epoch is shown: {shown}");
    assert!(
        shown.contains("pty-<U+202E>once") && !shown.contains('\u{202e}'),
        "agent text is shown, its escape sequences neutralised: {shown}"
    );
    let at = screen.wait_for(at, "[o] only this call");
    // A key that means nothing grants nothing; `o` grants this call once.
    keyboard.write_all(b"y").unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let st = status_json(&s);
    assert_eq!(st["grants"], json!([]), "{st}");
    keyboard.write_all(b"o").unwrap();
    let at = screen.wait_for(at, "approved: write for epoch");
    screen.wait_for(at, "this call only");
    let st = status_json(&s);
    assert_eq!(st["grants"][0]["kind"], json!("call"), "{st}");

    // The same call runs once; a second time it is refused again.
    let m = s.call("2", "write", json!({"marker": "pty-\u{202e}once"}));
    assert_ne!(m.result()["isError"], json!(true), "{}", m.raw);
    let m = s.call("3", "write", json!({"marker": "pty-\u{202e}once"}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required")
    );
    // It shows up again; `d` denies (nothing granted), `q` quits.
    let at = screen.wait_for(at, "A call needs a grant");
    keyboard.write_all(b"d").unwrap();
    let at = screen.wait_for(at, "declined: nothing granted");
    keyboard.write_all(b"q").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = inbox.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "q did not quit: {}",
            &screen.text()[at..]
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert_eq!(status_json(&s)["grants"], json!([]));
}

#[test]
fn follow_refuses_without_a_terminal() {
    let mut s = Setup::new().timeout(Duration::from_secs(60)).start();
    s.ready_legacy();
    let out = s.cli(&["approve", "--follow"]);
    out.expect_code(2);
    assert!(out.stderr.contains("needs a terminal"), "{}", out.stderr);
}

/// Red-team round 9: `approve --list` printed each grant's `toolScope` as JSON text, which
/// escapes C0 controls but passed DEL, C1 controls (U+009B is CSI) and bidi overrides from a
/// server's tool name straight to the human's terminal. Now the line goes through the review
/// sanitizer and `--json` writes the same JSON with those characters as `\u` escapes. (The
/// grant is served from a fake control socket: the supervisor's answer is the input here.)
#[test]
fn approve_list_shows_server_tool_names_without_terminal_controls() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;
    let evil = "read\u{202e}eteled\u{9b}2J\u{7f}";
    for json_output in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("c.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        // The key `run` would have made: the client proves with it (issue 36).
        cargo_mcp_dev::audit::KeyStore::at(dir.path())
            .load_or_create_key()
            .unwrap();
        let answer = json!({"ok": true, "result": {"grants": [{
            "id": "G1", "toolScope": [evil], "credentialScope": [],
            "executionEpoch": "E1", "expiresWhen": "runEnd"}]}});
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            assert!(line.contains("\"status\""), "{line}");
            let mut s = &stream;
            writeln!(s, "{answer}").unwrap();
        });
        let mut args = vec!["mcp-dev", "approve", "--list"];
        if json_output {
            args.push("--json");
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
            .args(args)
            .arg("--socket")
            .arg(&sock)
            .env("CARGO_MCP_DEV_HOME", dir.path())
            .output()
            .unwrap();
        server.join().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("G1"), "{stdout}");
        for bad in ['\u{202e}', '\u{9b}', '\u{7f}'] {
            assert!(
                !stdout.contains(bad),
                "`approve --list` (json {json_output}) wrote U+{:04X} from a server tool name to the terminal: {stdout:?}",
                bad as u32
            );
        }
        if json_output {
            let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(v[0]["toolScope"][0], evil, "the same JSON value");
        }
    }
}
