//! `cargo mcp-dev approve --follow` through a pseudo-terminal: the terminal inbox shows a call
//! waiting for a grant with its arguments and grants it with one key; without a terminal it
//! refuses.

mod common;

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::session::{Session, Setup};
use serde_json::json;

/// A pseudo-terminal: (master, slave).
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

/// Everything the terminal showed so far.
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

    /// Waits until the screen shows `needle` after byte `from`; the offset just past it.
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
    let at = screen.wait_for(at, "[o] this call once");
    // A key that means nothing grants nothing; `o` grants this call once.
    keyboard.write_all(b"y").unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let st = status_json(&s);
    assert_eq!(st["grants"], json!([]), "{st}");
    keyboard.write_all(b"o").unwrap();
    let at = screen.wait_for(at, "approved: write for epoch");
    screen.wait_for(at, "this call once");
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
    let at = screen.wait_for(at, "denied: nothing granted");
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
