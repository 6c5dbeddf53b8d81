//! The supervisor killed with SIGKILL in the middle of a pipelined burst of tool calls, several
//! times over on one project, at different moments: what was written still verifies, no call
//! reached the server without its intent record (`tool_called`) on disk, and each next `run`
//! continues the same chain. This holds with the default fsync setting: a process crash loses
//! nothing that was written (power loss is another matter, see the README's audit section).
//! A kill can cut the batch being written at a page boundary: the log then ends in an
//! incomplete line after its last whole record, which `audit verify` names without failing and
//! the next `run` moves aside (a `torn_tail_set_aside` record) before continuing the chain.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::fixture::Project;
use serde_json::{Value, json};

const SUITE: &str = "audit_crash";
/// Calls per chunk; the supervisor reads a chunk at once and records it in one write.
const CHUNK: usize = 30;

/// The whole records (lines with their `\n`), and whether the file's data ends in an
/// incomplete one. The data ends before the NUL bytes a killed supervisor leaves of the space
/// it reserved for more records (see `sys::mapped`): never part of a record.
fn audit_records(path: &std::path::Path) -> (Vec<Value>, bool) {
    let mut text = std::fs::read(path).unwrap_or_default();
    text.truncate(text.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1));
    let torn = !text.is_empty() && !text.ends_with(b"\n");
    let records = text
        .split_inclusive(|&b| b == b'\n')
        .filter(|l| l.ends_with(b"\n"))
        .map(|l| serde_json::from_slice(l).expect("every whole line is a record"))
        .collect();
    (records, torn)
}

fn audit_log(project: &Project) -> std::path::PathBuf {
    let dir = project.target_dir().join("mcp-dev/audit");
    let logs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "jsonl")
                && !p.to_string_lossy().contains("set-aside")
        })
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs[0].clone()
}

/// A `run` with its stdout read on a thread (one JSON value per line).
struct Run {
    child: Child,
    out: Receiver<Value>,
}

impl Run {
    fn start(project: &Project, fake_log: &std::path::Path) -> Run {
        let mut cmd = project.command(["run", "--no-gating"]);
        cmd.env("FAKE_LOG", fake_log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("run");
        let stdout = child.stdout.take().unwrap();
        let (tx, out) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A line the host pipe only took part of when the supervisor died is torn.
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        Run { child, out }
    }

    fn send(&mut self, bytes: &[u8]) {
        let _ = self.child.stdin.as_mut().unwrap().write_all(bytes);
    }

    /// Waits for the answer to `id`.
    fn answer(&mut self, id: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.out.recv_timeout(left).expect("an answer in time");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn handshake(&mut self) {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "crash-test", "version": "1"}}});
        self.send(format!("{init}\n").as_bytes());
        self.answer(1);
        let rest = [
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ];
        for m in rest {
            self.send(format!("{m}\n").as_bytes());
        }
        self.answer(2);
    }
}

fn chunk(first: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for n in first..first + CHUNK {
        let line = json!({"jsonrpc": "2.0", "id": 10_000 + n, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"n": n}}});
        bytes.extend_from_slice(line.to_string().as_bytes());
        bytes.push(b'\n');
    }
    bytes
}

/// One session: handshake, chunks of calls while answers come back, then SIGKILL `delay`
/// after the last chunk was written. Returns the call numbers the server received.
fn burst_and_kill(project: &Project, round: usize, delay: Duration) -> Vec<u64> {
    let fake_log = project.scratch().join(format!("fake-{round}.log"));
    let mut run = Run::start(project, &fake_log);
    run.handshake();
    let base = round * 100_000;
    let mut sent = 0;
    let mut answered = 0;
    while answered < 200 {
        run.send(&chunk(base + sent));
        sent += CHUNK;
        while run.out.recv_timeout(Duration::from_millis(2)).is_ok() {
            answered += 1;
        }
    }
    run.send(&chunk(base + sent));
    std::thread::sleep(delay);
    run.child.kill().expect("SIGKILL");
    run.child.wait().unwrap();
    // The server sees its stdin close and exits; give it a moment to log what it got.
    std::thread::sleep(Duration::from_millis(300));
    std::fs::read_to_string(&fake_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["method"] == "tools/call")
        .filter_map(|m| m["params"]["arguments"]["n"].as_u64())
        .collect()
}

#[test]
fn sigkill_mid_burst_leaves_a_verifiable_log_and_no_unrecorded_call() {
    let project = Project::built_fake_server(SUITE);
    let mut last_hash: Option<Value> = None;
    let mut records_before = 0;
    let mut torn_before = false;
    // Kills at several moments: while a chunk is read, recorded, forwarded, or after.
    for (round, micros) in [200u64, 700, 1500, 3000, 6000].into_iter().enumerate() {
        let received = burst_and_kill(&project, round, Duration::from_micros(micros));
        let log = audit_log(&project);
        let verify = project.run(["audit", "verify"]);
        assert_eq!(
            verify.code, 0,
            "round {round}: audit verify after SIGKILL: {}",
            verify.stderr
        );
        let (records, torn) = audit_records(&log);
        assert_eq!(
            torn,
            verify.stderr.contains("incomplete line"),
            "round {round}: verify names a torn tail exactly when there is one: {}",
            verify.stderr
        );
        // Each run continued the chain of the one killed before it.
        assert!(
            records.iter().all(|r| r["type"] != "chain_restarted"),
            "round {round}: the chain was restarted"
        );
        if let Some(prev) = &last_hash {
            assert_eq!(
                &records[records_before]["prev"], prev,
                "round {round}: the next run chains onto the last record written before the crash"
            );
            assert_eq!(
                records[records_before]["type"] == "torn_tail_set_aside",
                torn_before,
                "round {round}: a torn tail left by the previous round is moved aside first"
            );
        }
        let intents: BTreeSet<String> = records
            .iter()
            .filter(|r| r["type"] == "tool_called")
            .map(|r| r["data"]["callId"].as_str().unwrap_or_default().to_string())
            .collect();
        assert!(
            !received.is_empty(),
            "round {round}: no call reached the server"
        );
        let unrecorded: Vec<u64> = received
            .iter()
            .copied()
            .filter(|n| !intents.contains(&(10_000 + n).to_string()))
            .collect();
        assert!(
            unrecorded.is_empty(),
            "round {round} (kill {micros} µs after a chunk): {} calls reached the server without an intent record on disk, e.g. {:?}",
            unrecorded.len(),
            &unrecorded[..unrecorded.len().min(5)]
        );
        last_hash = records.last().map(|r| r["hash"].clone());
        records_before = records.len();
        torn_before = torn;
    }
    // A clean session after the crashes: still the same chain, and it verifies.
    let fake_log = project.scratch().join("fake-final.log");
    let mut run = Run::start(&project, &fake_log);
    run.handshake();
    run.send(
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"after": "crash"}}})
        )
        .as_bytes(),
    );
    assert!(run.answer(3).get("result").is_some());
    drop(run.child.stdin.take());
    let status = run.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let (records, torn) = audit_records(&audit_log(&project));
    assert!(!torn, "a clean exit leaves whole records");
    assert_eq!(
        &records[records_before]["prev"],
        last_hash.as_ref().unwrap()
    );
    let verify = project.run(["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
}

/// Calls at a host's pace (a pause longer than the anchor's lag before each): the anchor is
/// rewritten after each answer has gone out (off the call's path, see `AuditLog`'s
/// `take_anchor_update`) and, while the session still runs, names the call's last record, so a
/// crash between calls leaves nothing unanchored for the next start to read.
#[test]
fn the_anchor_follows_calls_at_a_hosts_pace() {
    let project = Project::built_fake_server("audit_crash_paced");
    let fake_log = project.scratch().join("fake.log");
    let mut run = Run::start(&project, &fake_log);
    run.handshake();
    let keys = cargo_mcp_dev::audit::KeyStore::at(&project.home);
    let log = audit_log(&project);
    for n in 0..3u64 {
        std::thread::sleep(cargo_mcp_dev::audit::ANCHOR_LAG + Duration::from_millis(100));
        let id = 100 + n;
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"n": n}}});
        run.send(format!("{call}\n").as_bytes());
        assert!(run.answer(id).get("result").is_some());
        // The result record and the anchor follow the answer; wait for both (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        let (last, anchored) = loop {
            let (records, _) = audit_records(&log);
            let last = records.last().cloned().expect("records");
            let anchored = keys.read_anchor(&log).ok().flatten();
            let done = last["type"] == "tool_result"
                && last["data"]["callId"] == json!(id.to_string())
                && anchored.as_ref().is_some_and(|a| a.seq == last["seq"]);
            if done || Instant::now() > deadline {
                break (last, anchored);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(last["type"], "tool_result", "call {id}: {last}");
        let anchored = anchored.expect("an anchor while the session runs");
        assert_eq!(
            json!(anchored.seq),
            last["seq"],
            "call {id}: the anchor names the call's result record"
        );
        assert_eq!(json!(anchored.hash), last["hash"]);
    }
    drop(run.child.stdin.take());
    assert!(run.child.wait().unwrap().success());
    let verify = project.run(["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
}
