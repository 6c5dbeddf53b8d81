//! Attacks on `audit tail [--follow]` and `audit::follow::Follower` (a red-team pass over
//! 91288d9): a killed writer's torn line recovered by the next `run`, a set-aside chain that
//! rotated before the next poll, bidi and invisible characters, one record per line, and the
//! attacks that held (a closed pipe, extreme counts, many rotations between polls, a deleted
//! log, a log that appears later, a path that becomes a directory, a symbolic link).
//! `audit::follow`'s own tests cover the records a lagging follower never read.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use cargo_mcp_dev::audit::follow::{Followed, Follower};
use cargo_mcp_dev::audit::{
    self, AuditLog, AuditOptions, KeyStore, Recovery, open_for_run, verify,
};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

fn setup() -> (tempfile::TempDir, PathBuf, KeyStore, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let log = tmp.path().join("audit/srv.jsonl");
    (tmp, state.clone(), KeyStore::at(state), log)
}

fn tail_cmd(state: &Path, log: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"));
    c.args(["mcp-dev", "audit", "tail"])
        .args(args)
        .arg(log)
        .env("CARGO_MCP_DEV_HOME", state)
        .stdin(Stdio::null());
    c
}

/// `seq:type` of every item a poll hands over (`new chain` for a new chain).
fn poll(f: &mut Follower) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    f.poll(|item| match item {
        Followed::Record { record, .. } => {
            out.push(format!("{}:{}", record.seq, record.record_type))
        }
        Followed::NewChain { .. } => out.push("new chain".into()),
    })
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Spawns `tail --follow --json` and returns the child, a receiver of its stdout lines and
/// one of its stderr lines.
fn spawn_follow(state: &Path, log: &Path) -> (Child, Receiver<String>, Receiver<String>) {
    let mut child = tail_cmd(state, log, &["--follow", "--json", "-n", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let (etx, erx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = etx.send(line);
        }
    });
    (child, rx, erx)
}

fn seq_of(line: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    v["seq"].as_u64().unwrap()
}

/// Kills the child when dropped (a test that fails never leaves a follower running).
struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A log of two records whose writer was then killed inside the copy of a third (see
/// [`leave_torn_tail_of_a_killed_writer`]).
fn two_records_then_a_torn_line(log: &Path, keys: &KeyStore) {
    let mut w = AuditLog::open(log, keys).unwrap();
    w.append("tool_called", "R", Some("E1"), json!({"n": 1}))
        .unwrap();
    w.append("tool_result", "R", Some("E1"), json!({"n": 2}))
        .unwrap();
    w.flush().unwrap();
    drop(w);
    leave_torn_tail_of_a_killed_writer(log);
}

/// What `kill -9` in the middle of a mapped copy leaves: whole records, then a prefix of the
/// next record's line, then the rest of the reservation (NUL bytes).
fn leave_torn_tail_of_a_killed_writer(log: &Path) {
    let mut f = std::fs::OpenOptions::new().append(true).open(log).unwrap();
    f.write_all(b"{\"v\":1,\"seq\":3,\"time\":\"2026-12-05T16:20:11.0")
        .unwrap();
    f.write_all(&[0u8; 8192]).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Finding 1: a crash's torn tail, read by the follower, then set aside by the next `run`.
// ---------------------------------------------------------------------------------------------

/// A writer killed mid-copy leaves a prefix of its next line. The next `run` (`open_for_run`)
/// copies it aside, cuts the *same file* back to the last whole record and continues the chain
/// there. The follower must read the new record from its start: on 91288d9 it carried the old
/// prefix over, glued it to the middle of the new record and reported tampering, on a log
/// `audit verify` accepts.
#[test]
fn follower_survives_torn_tail_recovery() {
    let (_tmp, _state, keys, log) = setup();
    two_records_then_a_torn_line(&log, &keys);
    verify(&log, &keys).expect("a torn tail after the anchor is accepted by verify");

    let key = keys.load_key().unwrap();
    let mut f = Follower::new(&log, &key);
    assert_eq!(poll(&mut f).unwrap(), ["1:tool_called", "2:tool_result"]);

    // The next run: the torn bytes are kept aside, the chain continues at seq 3.
    let (mut w, rec) = open_for_run(&log, &keys).unwrap();
    assert!(matches!(rec, Some(Recovery::TornTailKept(_))), "{rec:?}");
    w.append("tool_called", "R", Some("E2"), json!({"n": 4}))
        .unwrap();
    w.flush().unwrap();
    verify(&log, &keys).expect("the recovered log verifies");

    assert_eq!(
        poll(&mut f),
        Ok(vec![
            "3:torn_tail_set_aside".to_string(),
            "4:tool_called".to_string()
        ]),
        "the follower must continue across a torn-tail recovery, not report damage"
    );
}

/// The same through the binary: `audit tail --follow` on a log whose writer was killed
/// mid-copy keeps following when the next `run` recovers the log (it exited 105 on 91288d9).
#[test]
fn tail_follow_survives_restart_after_kill9() {
    let (_tmp, state, keys, log) = setup();
    two_records_then_a_torn_line(&log, &keys);

    let (child, rx, erx) = spawn_follow(&state, &log);
    let mut child = KillOnDrop(child);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        seen.push(seq_of(
            &rx.recv_timeout(left).expect("the two records within 20 s"),
        ));
    }
    // Let the follower poll the torn bytes at least once.
    std::thread::sleep(Duration::from_millis(400));

    let (mut w, rec) = open_for_run(&log, &keys).unwrap();
    assert!(matches!(rec, Some(Recovery::TornTailKept(_))), "{rec:?}");
    w.append("tool_called", "R", Some("E2"), json!({"n": 4}))
        .unwrap();
    w.flush().unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.last() != Some(&4) && Instant::now() < deadline {
        if let Some(status) = child.0.try_wait().unwrap() {
            let err: Vec<String> = erx.try_iter().collect();
            panic!("the follower stopped ({status}) on a legitimately recovered log: {err:?}");
        }
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            seen.push(seq_of(&line));
        }
    }
    assert_eq!(seen, [1, 2, 3, 4], "each record once, in order");
}

// ---------------------------------------------------------------------------------------------
// Finding 2: bidi / invisible characters from the agent or the server reach the terminal.
// ---------------------------------------------------------------------------------------------

/// A tool name the agent chose, with a right-to-left override: printed as is in human mode,
/// so a terminal with bidi support shows the rest of the line reversed (`exe.txt` shown for
/// `txt.exe`, a fake `"isError":false`…). `approve` escapes these (`sanitize::review`).
#[test]
fn human_tail_escapes_bidi_and_invisible_characters() {
    let (_tmp, state, keys, log) = setup();
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append(
        "tool_called",
        "R",
        Some("E1"),
        json!({"callId": "c\u{200B}1", "tool": "read_\u{202E}exe.txt"}),
    )
    .unwrap();
    w.flush().unwrap();
    let out = tail_cmd(&state, &log, &["-n", "1"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for c in ['\u{202E}', '\u{200B}'] {
        assert!(
            !text.contains(c),
            "U+{:04X} reached the terminal unescaped: {text:?}",
            c as u32
        );
    }
}

/// `--json` on a terminal is escaped (`sanitize::line`), but only controls: a bidi override
/// reaches the terminal. Run under a pseudo-terminal (`script`).
#[test]
fn json_tail_on_a_terminal_escapes_bidi() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("no `script`: skipped");
        return;
    }
    let (_tmp, state, keys, log) = setup();
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append(
        "tool_called",
        "R",
        Some("E1"),
        json!({"tool": "a\u{9b}31m\u{202E}b"}),
    )
    .unwrap();
    w.flush().unwrap();
    let cmd = format!(
        "{} mcp-dev audit tail -n 1 --json {}",
        env!("CARGO_BIN_EXE_cargo-mcp-dev"),
        log.display()
    );
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("CARGO_MCP_DEV_HOME", &state)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"seq\":1"), "ran on a pty: {text:?}");
    assert!(
        !text.contains('\u{9b}'),
        "C1 escaped on a terminal: {text:?}"
    );
    assert!(
        !text.contains('\u{202E}'),
        "a bidi override reached the terminal: {text:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Attacks that held.
// ---------------------------------------------------------------------------------------------

fn find_json(dir: PathBuf) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Attacks that held (these pass on 91288d9; kept as regression tests).
// ---------------------------------------------------------------------------------------------

fn wait_exit(child: &mut Child, secs: u64) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_records(log: &Path, keys: &KeyStore, n: usize) {
    let mut w = AuditLog::open(log, keys).unwrap();
    for i in 0..n {
        w.append("tool_called", "R", Some("E1"), json!({"n": i}))
            .unwrap();
    }
    w.flush().unwrap();
}

/// `| head`: a closed pipe ends the command quietly (exit 0), with and without `--follow`.
#[test]
fn held_broken_pipe_ends_quietly() {
    let (_tmp, state, keys, log) = setup();
    write_records(&log, &keys, 3000);
    for follow in [false, true] {
        let mut args = vec!["-n", "3000"];
        if follow {
            args.push("--follow");
        }
        let mut child = tail_cmd(&state, &log, &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(first.contains("#1 "), "{first}");
        drop(out);
        let status = wait_exit(&mut child, 20);
        let _ = child.kill();
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "follow={follow}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `-n 0` prints nothing; a huge `-n` prints everything without reserving memory for it.
#[test]
fn held_extreme_counts() {
    let (_tmp, state, keys, log) = setup();
    write_records(&log, &keys, 20);
    let out = tail_cmd(&state, &log, &["-n", "0"]).output().unwrap();
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    let out = tail_cmd(&state, &log, &["-n", &u64::MAX.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 20);
    let out = tail_cmd(&state, &log, &["-n", "-1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A follower more than 64 rotations behind catches up over several polls: every record once,
/// in order.
#[test]
fn held_many_rotations_between_polls() {
    let (_tmp, _state, keys, log) = setup();
    let opts = AuditOptions {
        max_segment_bytes: 1_000,
        ..AuditOptions::default()
    };
    let mut w = AuditLog::open_with(&log, &keys, &opts).unwrap();
    w.append("tool_called", "R", None, json!({"n": 0})).unwrap();
    w.flush().unwrap();
    let key = keys.load_key().unwrap();
    let mut f = Follower::new(&log, &key);
    let mut seen = poll(&mut f).unwrap();
    for n in 1..400 {
        w.append(
            "tool_called",
            "R",
            None,
            json!({"n": n, "pad": "p".repeat(200)}),
        )
        .unwrap();
        w.flush().unwrap();
    }
    for _ in 0..20 {
        seen.extend(poll(&mut f).unwrap());
    }
    let numbers: Vec<u64> = seen
        .iter()
        .map(|s| s.split(':').next().unwrap().parse().unwrap())
        .collect();
    let head = w.head().unwrap().0;
    assert_eq!(numbers, (1..=head).collect::<Vec<_>>());
}

/// Deleted while followed, then a new `run` (anchor without log: set aside, new chain): the
/// follower says so and prints the new chain.
#[test]
fn held_log_deleted_then_new_run() {
    let (_tmp, _state, keys, log) = setup();
    write_records(&log, &keys, 3);
    let key = keys.load_key().unwrap();
    let mut f = Follower::new(&log, &key);
    assert_eq!(poll(&mut f).unwrap().len(), 3);
    std::fs::remove_file(&log).unwrap();
    assert!(poll(&mut f).unwrap().is_empty());
    let (mut w, rec) = open_for_run(&log, &keys).unwrap();
    assert!(matches!(rec, Some(Recovery::SetAside(_))));
    w.append("tool_called", "R", None, json!({})).unwrap();
    w.flush().unwrap();
    assert_eq!(
        poll(&mut f).unwrap(),
        ["new chain", "1:chain_restarted", "2:tool_called"]
    );
}

/// A log that does not exist yet is waited for, then followed from its first record.
#[test]
fn held_log_appears_later() {
    let (_tmp, state, keys, log) = setup();
    // The key must exist for `tail` to start.
    write_records(&_tmp.path().join("audit/other.jsonl"), &keys, 1);
    let (child, rx, _erx) = spawn_follow(&state, &log);
    let _child = KillOnDrop(child);
    std::thread::sleep(Duration::from_millis(300));
    write_records(&log, &keys, 3);
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        seen.push(seq_of(&rx.recv_timeout(left).expect("records within 10 s")));
    }
    assert_eq!(seen, [1, 2, 3]);
}

/// The path becomes a directory while followed: an error, no hang, no record.
#[test]
fn held_path_becomes_a_directory() {
    let (_tmp, state, keys, log) = setup();
    write_records(&log, &keys, 2);
    let (child, rx, erx) = spawn_follow(&state, &log);
    let mut child = KillOnDrop(child);
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    std::fs::rename(&log, log.with_extension("moved")).unwrap();
    std::fs::create_dir(&log).unwrap();
    let status = wait_exit(&mut child.0, 10).expect("exits");
    let err: Vec<String> = erx.try_iter().collect();
    assert!(!status.success(), "{err:?}");
    assert!(rx.try_recv().is_err());
}

/// A symlink to a log that has rotated: `verify` finds no segments beside the link and
/// refuses (fails closed, no silent skip).
#[test]
fn held_symlinked_path_fails_closed() {
    let (_tmp, state, keys, log) = setup();
    let opts = AuditOptions {
        max_segment_bytes: 1_000,
        ..AuditOptions::default()
    };
    let mut w = AuditLog::open_with(&log, &keys, &opts).unwrap();
    for n in 0..20 {
        w.append(
            "tool_called",
            "R",
            None,
            json!({"n": n, "pad": "p".repeat(200)}),
        )
        .unwrap();
    }
    w.flush().unwrap();
    let link = _tmp.path().join("link.jsonl");
    std::os::unix::fs::symlink(&log, &link).unwrap();
    let out = tail_cmd(&state, &link, &["-n", "2"]).output().unwrap();
    eprintln!(
        "symlink: {:?} {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
}

/// Defence in depth: the human line goes through `sanitize::lines`, which keeps `\n`; a record
/// field printed outside `data` (time, type, epoch) holding a newline makes one record print as
/// two lines, the second one forged. (`run` mints epochs as ULIDs, so no untrusted party
/// controls these today: informational.)
#[test]
fn one_record_is_one_human_line() {
    let (_tmp, state, keys, log) = setup();
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append(
        "tool_called",
        "R",
        Some("E1\n2026-01-01T00:00:00.000Z  #1  approval_granted  E1  {\"forged\":true}"),
        json!({}),
    )
    .unwrap();
    w.flush().unwrap();
    let out = tail_cmd(&state, &log, &["-n", "1"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one record, one line: {text:?}");
}

/// The log is set aside and the new chain rotates before the next poll (a short poll gap, a
/// small `max_segment_bytes`, or a follower whose stdout was blocked by a pager). The new
/// chain's first file is now `srv.00001.jsonl` (the old segments were renamed away), but the
/// follower jumps from the set-aside file straight to the path, whose first record is a
/// `segment_started` with seq > 1: it is neither the old chain's continuation nor a new
/// chain, so the follower stops with a verification failure on a log `audit verify` accepts.
#[test]
fn follower_follows_a_new_chain_that_rotated_before_the_poll() {
    let (_tmp, state, keys, log) = setup();
    let opts = AuditOptions {
        max_segment_bytes: 2_000,
        ..AuditOptions::default()
    };
    write_records(&log, &keys, 3);
    let key = keys.load_key().unwrap();
    let mut f = Follower::new(&log, &key);
    assert_eq!(poll(&mut f).unwrap().len(), 3);

    for a in find_json(state.clone()) {
        std::fs::write(a, b"{}").unwrap();
    }
    let (mut w, rec) = audit::open_for_run_with(&log, &keys, &opts).unwrap();
    assert!(matches!(rec, Some(Recovery::SetAside(_))), "{rec:?}");
    for n in 0..12 {
        w.append(
            "tool_called",
            "R",
            None,
            json!({"n": n, "pad": "p".repeat(200)}),
        )
        .unwrap();
        w.flush().unwrap();
    }
    let head = w.head().unwrap().0;
    drop(w);
    assert!(
        !audit::scan::list_segments(&log).unwrap().is_empty(),
        "the new chain rotated"
    );
    let report = verify(&log, &keys).expect("audit verify accepts the log");
    assert_eq!(report.head_seq, head);

    let mut after = Vec::new();
    for _ in 0..5 {
        after.extend(poll(&mut f).expect("the follower continues into the new chain"));
    }
    assert_eq!(after.first().map(String::as_str), Some("new chain"));
    let numbers: Vec<u64> = after[1..]
        .iter()
        .map(|s| s.split(':').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(numbers, (1..=head).collect::<Vec<_>>());
}

// ----- `audit verify` (red-team round 16) ---------------------------------------------------

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

/// Whoever can write `target/` can write a line into the log. `audit verify` names the first
/// bad line with serde's message, which quotes an unknown field name raw (`unknown field
/// `…``): a field name holding `\n` (a JSON escape) prints a line break into the `error:` line,
/// and the text after it is a line of the attacker's choosing — here one that reads like
/// `audit verify`'s own success line. `status::error` goes through `sanitize::lines`, which
/// escapes controls but keeps line breaks; what the log holds should stay on the error's line
/// (as every status line does).
#[test]
fn verify_failure_cannot_forge_a_line() {
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
