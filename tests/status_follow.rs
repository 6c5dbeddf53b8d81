//! `cargo mcp-dev status --follow`: the running session's status lines in a terminal, as they
//! are written, through a rebuild and on to the next `run`; a clear note while no session
//! runs; Ctrl-C stops it; and nothing it prints from the socket reaches the terminal
//! unescaped. Real `run` sessions on the fake server (tests/common/session.rs).

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::fixture::{Project, bin};
use common::session::Setup;
use serde_json::json;

/// Lines read from one of the follower's streams.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    cond: Condvar,
}

impl Lines {
    fn read_from(stream: impl std::io::Read + Send + 'static) -> Arc<Lines> {
        let lines = Arc::new(Lines::default());
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                l.lines.lock().unwrap().push(line);
                l.cond.notify_all();
            }
        });
        lines
    }

    /// The index of the first line at or after `from` that contains `needle`, waiting up to
    /// `within`.
    #[track_caller]
    fn wait_for(&self, from: usize, needle: &str, within: Duration, what: &str) -> usize {
        let deadline = Instant::now() + within;
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            if let Some(i) = lines.iter().skip(from).position(|l| l.contains(needle)) {
                return from + i;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: no line with `{needle}` after line {from} within {within:?}; lines:\n{}",
                lines.join("\n")
            );
            lines = self
                .cond
                .wait_timeout(lines, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Every line so far. Never panics: it also runs in `Drop` after a failed wait, when the
    /// lock is poisoned.
    fn all(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// A running `status --follow`, killed on drop.
struct Follower {
    child: Child,
    out: Arc<Lines>,
    err: Arc<Lines>,
}

impl Follower {
    fn start(mut cmd: Command) -> Follower {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start status --follow");
        let out = Lines::read_from(child.stdout.take().unwrap());
        let err = Lines::read_from(child.stderr.take().unwrap());
        Follower { child, out, err }
    }

    fn of(project: &Project, extra: &[&str]) -> Follower {
        let mut args = vec!["status", "--follow"];
        args.extend_from_slice(extra);
        Follower::start(project.command(args))
    }

    /// Ctrl-C: the follower stops at once.
    #[track_caller]
    fn interrupt(mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "status --follow ignored Ctrl-C");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(libc_sigint()), "{status:?}");
    }
}

fn libc_sigint() -> i32 {
    rustix::process::Signal::INT.as_raw()
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- status --follow stdout ---");
            for l in self.out.all() {
                eprintln!("{l}");
            }
            eprintln!("--- status --follow stderr ---");
            for l in self.err.all() {
                eprintln!("{l}");
            }
        }
    }
}

const SOON: Duration = Duration::from_secs(20);

/// Started before any session: it says none runs and waits; then it shows a session's lines
/// from its first one, a refused call, the rebuilt server's lines, the end of the session, and
/// the next session's lines; Ctrl-C stops it.
#[test]
fn follow_waits_for_a_session_then_keeps_up_through_a_rebuild_and_the_next_run() {
    let project = Project::built_fake_server(common::session::SUITE);
    let f = Follower::of(&project, &[]);
    f.err.wait_for(
        0,
        "waiting: no `cargo mcp-dev run` of `fake-server` is running",
        SOON,
        "no session",
    );
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        f.out.all().is_empty(),
        "nothing to show yet: {:?}",
        f.out.all()
    );
    assert_eq!(
        f.err
            .all()
            .iter()
            .filter(|l| l.starts_with("waiting:"))
            .count(),
        1,
        "said once: {:?}",
        f.err.all()
    );

    let mut s = Setup::on(project).timeout(Duration::from_secs(120)).start();
    let (_, epoch) = s.ready_legacy();
    f.err
        .wait_for(0, "session: `fake-server` is served by pid", SOON, "header");
    // Its first line names this view; the server's own stderr comes tagged with its epoch.
    let first = f
        .out
        .wait_for(0, "session started: fake-server", SOON, "first line");
    assert!(
        f.out.all()[first]
            .contains("status lines: follow them with `cargo mcp-dev status --follow`"),
        "{}",
        f.out.all()[first]
    );
    let at = f
        .out
        .wait_for(first, "server started: pid=", SOON, "server started");
    f.out
        .wait_for(0, "] fake-server: revision r1", SOON, "the server's stderr");
    assert!(f.out.all().iter().any(|l| l.contains(&epoch[..12])));

    // A refused call, after connect: exactly what a host hides.
    let m = s.call("1", "write", json!({"marker": "follow"}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required")
    );
    let at = f
        .out
        .wait_for(at, "call denied: write", SOON, "refused call");

    // A save: the server is rebuilt and replaced; the lines keep coming.
    s.set_revision("r2");
    let (_, new_epoch, _) = s.server_replaced();
    // The new server's own stderr and our "replaced" line come down different pipes, so
    // either may be shown first: look for both after the refused call.
    f.out
        .wait_for(at, "server replaced: pid=", SOON, "replaced");
    f.out.wait_for(
        at,
        "] fake-server: revision r2",
        SOON,
        "new server's stderr",
    );
    assert!(f.out.all().iter().any(|l| l.contains(&new_epoch[..12])));

    // The session ends: said on stderr, and the view waits for the next one.
    let project = s.finish_keeping_project();
    let ended = f
        .err
        .wait_for(0, "session ended: pid", SOON, "session ended");
    let out_before = f.out.all().len();

    // The next `run` of the same package: its lines from its first one.
    let mut s = Setup::on(project).timeout(Duration::from_secs(90)).start();
    s.ready_legacy();
    f.err.wait_for(
        ended,
        "new session: `fake-server` is served by pid",
        SOON,
        "new session",
    );
    let second = f.out.wait_for(
        out_before,
        "session started: fake-server",
        SOON,
        "second session",
    );
    f.out
        .wait_for(second, "server started: pid=", SOON, "second server");
    f.interrupt();
    s.finish();
}

/// Joined while a session runs: its last lines first (`-n`), then new ones. A server that
/// floods its stderr can make the view miss some of the server's lines (said), never the
/// supervisor's own.
#[test]
fn follow_shows_the_last_lines_first_and_a_flooding_server_cannot_hide_status() {
    let mut s = Setup::new()
        .tools(&["flood_stderr"])
        .args(&["--exempt", "flood_stderr"])
        .env("FAKE_FLOOD_LINES", "20000")
        .timeout(Duration::from_secs(90))
        .start();
    s.ready_legacy();

    // -n 2: only the last two lines so far, not the first.
    let few = Follower::of(&s.project, &["-n", "2"]);
    few.err
        .wait_for(0, "session: `fake-server` is served by pid", SOON, "header");
    std::thread::sleep(Duration::from_millis(600));
    let shown = few.out.all();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(!shown.iter().any(|l| l.starts_with("session started:")));
    drop(few);

    let f = Follower::of(&s.project, &["-n", "1000"]);
    f.out
        .wait_for(0, "session started: fake-server", SOON, "context");
    let at = f.out.all().len();

    let m = s.call("1", "flood_stderr", json!({}));
    assert_ne!(m.result()["isError"], json!(true), "{}", m.raw);
    s.wait_stderr_matching("the end of the flood", |l| {
        l.ends_with("fake-server flood line 19999: the quick brown fox jumps over the lazy dog")
    });
    let m = s.call("2", "write", json!({"marker": "after the flood"}));
    assert_eq!(
        m.tool_error_payload()["error"],
        json!("authorization_required")
    );
    let denied = f.out.wait_for(
        at,
        "call denied: write",
        SOON,
        "the status line after the flood",
    );
    let lines = f.out.all();
    let missed = lines[at..denied]
        .iter()
        .find(|l| l.contains("not shown (written faster than this view reads them)"));
    assert!(
        missed.is_some(),
        "20000 server lines overflow the 500 kept: the view says it missed some"
    );
    assert!(
        lines[at..denied]
            .iter()
            .any(|l| l.contains("fake-server flood line 19999")),
        "the newest server lines are shown"
    );
    f.interrupt();

    // Joined after the flood: the supervisor's first lines are still there to show.
    let late = Follower::of(&s.project, &["-n", "1000"]);
    let first = late.out.wait_for(
        0,
        "session started: fake-server",
        SOON,
        "kept through the flood",
    );
    late.out
        .wait_for(first, "call denied: write", SOON, "and the refusal");
    drop(late);
    s.finish();
}

/// Whatever answers on the socket (here not our supervisor at all) is shown escaped: no
/// escape sequence, bidi override or line break from it reaches the terminal as such. One
/// that keeps no status lines (an older `run`) is named, and the view goes on waiting.
#[test]
fn follow_escapes_what_the_socket_says_and_waits_past_a_session_without_lines() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    cargo_mcp_dev::audit::KeyStore::at(&home)
        .load_or_create_key()
        .unwrap();
    let socket = dir.path().join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let served = std::thread::spawn(move || {
        let answers = [
            json!({"ok": false, "error": "unknown op `statusLines`"}),
            json!({"ok": true, "result": {
                "session": "evil", "pid": 7, "started": 0,
                "lines": [
                    {"source": "run", "at": 1, "text": "call denied: \u{1b}]0;pwned\u{7}\u{1b}[2Jwrite"},
                    {"source": "server", "at": 2, "text": "[x 01] a\nfake line \u{202e}txt.exe"},
                ],
                "next": {"run": 1, "server": 1}, "missed": {"run": 0, "server": 0},
            }}),
        ];
        for answer in answers {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            let request: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(request["op"], json!("statusLines"));
            writeln!(&stream, "{answer}").unwrap();
        }
    });
    let mut cmd = Command::new(bin());
    cmd.args([
        "status",
        "--follow",
        "--socket",
        socket.to_str().unwrap(),
        "--label",
        "x",
    ])
    .env("CARGO_MCP_DEV_HOME", &home)
    .env("CARGO_TERM_COLOR", "never");
    let f = Follower::start(cmd);
    f.err
        .wait_for(0, "keeps no status lines (unknown op", SOON, "older run");
    f.out.wait_for(0, "fake line", SOON, "lines");
    served.join().unwrap();
    let out = f.out.all().join("\n");
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'));
    assert!(out.contains("\\x1b]0;pwned\\x07\\x1b[2Jwrite"), "{out}");
    assert!(
        out.contains("[x 01] a\\nfake line <U+202E>txt.exe"),
        "one line, the override shown: {out}"
    );
    // The fake socket is gone: the view says the session ended and waits.
    f.err.wait_for(0, "session ended: pid 7", SOON, "ended");
    f.interrupt();
}
