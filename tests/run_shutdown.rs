//! `cargo-mcp-dev run` ending: the host closing stdin, SIGTERM/SIGINT to the supervisor, and the
//! host dying without closing stdin. The server ignores stdin EOF and SIGTERM and leaves a
//! grandchild behind; the supervisor must still be gone, with no orphan, within the hosts' grace.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::session::{Session, Setup, alive};
use rustix::process::Signal;
use serde_json::json;

/// Hosts wait about 2 s before killing a server; a little slack for a loaded test machine.
const GRACE: Duration = Duration::from_millis(2500);

fn stubborn() -> Session {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_IGNORE_STDIN_EOF", "1")
        .env("FAKE_IGNORE_SIGTERM", "1")
        .env("FAKE_GRANDCHILD", "1")
        .start();
    let (pid, _) = s.ready_legacy();
    let pids = s.pids();
    assert_eq!(pids.len(), 2, "server and grandchild: {pids:?}");
    assert!(pids.contains(&pid));
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    s
}

#[track_caller]
fn assert_gone_within_grace(s: &mut Session, since: Instant) {
    let status = s
        .wait_exit(GRACE.saturating_sub(since.elapsed()))
        .unwrap_or_else(|| panic!("supervisor still running {GRACE:?} later"));
    assert_eq!(status.code(), Some(0), "{status:?}");
    let left = s.survivors(Duration::from_millis(200));
    assert!(left.is_empty(), "outlived the supervisor: {left:?}");
    s.expect_stdout_eof();
    s.check_clean();
}

#[test]
fn host_closing_stdin_stops_a_stubborn_server_and_its_grandchild_in_time() {
    let mut s = stubborn();
    let t = Instant::now();
    s.close_stdin();
    assert_gone_within_grace(&mut s, t);
}

#[test]
fn sigterm_to_the_supervisor_stops_everything_in_time() {
    let mut s = stubborn();
    let t = Instant::now();
    s.signal(Signal::TERM);
    assert_gone_within_grace(&mut s, t);
}

#[test]
fn sigint_to_the_supervisor_stops_everything_in_time() {
    let mut s = stubborn();
    let t = Instant::now();
    s.signal(Signal::INT);
    assert_gone_within_grace(&mut s, t);
}

#[test]
fn host_dying_without_closing_stdin_stops_everything() {
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("FAKE_IGNORE_STDIN_EOF", "1")
        .env("FAKE_IGNORE_SIGTERM", "1")
        .env("FAKE_GRANDCHILD", "1")
        .via_parent_shell()
        .start();
    let supervisor = s.real_supervisor_pid();
    s.ready_legacy();
    assert_eq!(s.pids().len(), 2);
    // Kill only the "host" (the shell); our end of the supervisor's stdin stays open.
    let host = rustix::process::Pid::from_raw(s.supervisor_pid() as i32).unwrap();
    rustix::process::kill_process(host, Signal::KILL).unwrap();
    let t = Instant::now();
    // The parent watch wakes when the host exits (a pidfd on Linux; elsewhere it checks every
    // 500 ms), then the same stop sequence as for a closed stdin.
    while alive(supervisor) && t.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(supervisor),
        "supervisor outlived its host by {:?}",
        t.elapsed()
    );
    let left = s.survivors(Duration::from_millis(200));
    assert!(left.is_empty(), "outlived the supervisor: {left:?}");
    s.check_clean();
}

/// First-contact issue, item 2: a host that gives up during the first build (it timed out and
/// closed the connection, as hosts do before retrying) does not lose the build: it goes on in
/// the background, owned by one process with a deadline, while the supervisor exits at once.
#[test]
fn a_first_build_the_host_abandons_finishes_in_the_background() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let slow = tmp.path().join("slow-cargo.sh");
    std::fs::write(
        &slow,
        "#!/bin/sh\nif [ \"$1\" = build ]; then sleep 3; fi\nexec cargo \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut s = Setup::new()
        .arg("--no-gating")
        .env("CARGO", slow.to_str().unwrap())
        .start();
    let log = s.project.target_dir().join("mcp-dev/background-build.log");
    let _ = std::fs::remove_file(&log);
    // The host's `initialize` waits for the server's own answer (issue 33): it leaves first.
    let id = s.fresh_id();
    s.request(
        &id,
        "initialize",
        Some(json!({"protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "impatient-host", "version": "1"}})),
    );
    s.wait_stderr("initialize waits for the server's own answer");
    let t = Instant::now();
    s.close_stdin();
    let status = s
        .wait_exit(GRACE)
        .expect("the supervisor exits at once, without waiting for the build");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let line = s.wait_stderr_within(
        "the host closed the connection during the first build",
        Duration::from_secs(5),
    );
    assert!(line.contains("goes on in the background"), "{line}");
    eprintln!("exited {:?} after the host closed stdin", t.elapsed());
    assert_background_build_finished(&log);
}

/// The same, when the host leaves before our build thread has started cargo (here it waits
/// for another supervisor's build lock; in CI it was simply not scheduled yet): the build is
/// still wanted and goes on in the background; no cargo is started behind the exit.
#[test]
fn a_first_build_abandoned_before_cargo_started_still_goes_on() {
    let s = Setup::new().arg("--no-gating");
    let lock = s.hold_build_lock();
    let log = s.project.target_dir().join("mcp-dev/background-build.log");
    let _ = std::fs::remove_file(&log);
    let mut s = s.start();
    s.wait_stderr("waiting for another cargo mcp-dev build");
    s.initialize();
    s.close_stdin();
    let status = s
        .wait_exit(GRACE)
        .expect("the supervisor exits at once, without waiting for the lock");
    assert_eq!(status.code(), Some(0), "{status:?}");
    let line = s.wait_stderr_within(
        "the host closed the connection during the first build",
        Duration::from_secs(5),
    );
    assert!(line.contains("goes on in the background"), "{line}");
    drop(lock);
    assert_background_build_finished(&log);
}

/// The detached build's log says it ended well (it may take a while: waited for, bounded).
#[track_caller]
fn assert_background_build_finished(log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let text = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("cargo mcp-dev: background build") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        text.contains("cargo mcp-dev: background build finished: exit status: 0"),
        "{text}"
    );
}
