//! The supervisor killed with SIGKILL in the middle of a pipelined burst of tool calls: what was
//! written still verifies, no call reached the server without its intent record (`tool_called`)
//! on disk, and the next `run` continues the same chain. This holds with the default fsync
//! setting: a process crash loses nothing that was flushed (power loss is another matter, see the
//! README's audit section).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::session::Setup;
use rustix::process::Signal;
use serde_json::{Value, json};

const BURST: usize = 3000;

fn audit_records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn audit_log(project_target: &std::path::Path) -> std::path::PathBuf {
    let dir = project_target.join("mcp-dev/audit");
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

#[test]
fn sigkill_mid_burst_leaves_a_verifiable_log_and_no_unrecorded_call() {
    let mut s = Setup::new().arg("--no-gating").start();
    s.ready_legacy();
    // The whole burst in one write: the supervisor reads, records and forwards as fast as it can.
    let mut burst = Vec::new();
    for i in 0..BURST {
        let line = json!({"jsonrpc": "2.0", "id": 10_000 + i, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"n": i}}});
        burst.extend_from_slice(line.to_string().as_bytes());
        burst.push(b'\n');
    }
    s.send_bytes(&burst);
    // Kill once some answers are back and (very likely) more calls are in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut answered = 0;
    while answered < BURST / 10 {
        let m = s
            .inbox
            .take(deadline, |m| m.is_response())
            .expect("answers to the burst");
        assert!(m.value.get("error").is_none(), "{}", m.raw);
        answered += 1;
    }
    s.signal(Signal::KILL);
    s.wait_exit(Duration::from_secs(10))
        .expect("the supervisor is gone");
    // The server sees its stdin close and exits; give it a moment to log what it got.
    let left = s.survivors(Duration::from_secs(5));
    assert!(left.is_empty(), "{left:?}");

    let log = audit_log(&s.project.target_dir());
    let verify = s.cli(&["audit", "verify"]);
    assert_eq!(
        verify.code, 0,
        "audit verify after SIGKILL: {}",
        verify.stderr
    );

    // Every call the server received had its intent record written first.
    let records = audit_records(&log);
    let intents: BTreeSet<String> = records
        .iter()
        .filter(|r| r["type"] == "tool_called")
        .map(|r| r["data"]["callId"].as_str().unwrap_or_default().to_string())
        .collect();
    let received: Vec<u64> = s
        .fake_log()
        .iter()
        .filter(|m| m["method"] == "tools/call")
        .filter_map(|m| m["params"]["arguments"]["n"].as_u64())
        .collect();
    assert!(
        received.len() >= answered,
        "the server got {} calls, {answered} were answered",
        received.len()
    );
    let unrecorded: Vec<u64> = received
        .iter()
        .copied()
        .filter(|n| !intents.contains(&(10_000 + n).to_string()))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "{} calls reached the server without an intent record on disk, e.g. {:?}",
        unrecorded.len(),
        &unrecorded[..unrecorded.len().min(5)]
    );
    let last_seq = records.last().and_then(|r| r["seq"].as_u64()).unwrap();

    // The next run continues the chain (no set-aside, no restart record).
    let mut cmd = s.project.command(["run", "--no-gating"]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut next = cmd.spawn().expect("second run");
    let mut stdin = next.stdin.take().unwrap();
    let script = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "crash-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "echo", "arguments": {"after": "crash"}}}),
    ];
    for m in &script {
        writeln!(stdin, "{m}").unwrap();
    }
    let out = BufReader::new(next.stdout.take().unwrap());
    let mut got_call = false;
    for line in out.lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).expect("JSON on stdout");
        if v["id"] == json!(3) {
            assert!(v.get("result").is_some(), "{v}");
            got_call = true;
            break;
        }
    }
    assert!(got_call, "the second run answered the call");
    drop(stdin);
    let status = next.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut next.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("audit log set aside"), "{err}");
    let after = audit_records(&log);
    assert!(
        after.iter().all(|r| r["type"] != "chain_restarted"),
        "the chain was restarted"
    );
    let first_new = &after[records.len()];
    assert_eq!(first_new["seq"], json!(last_seq + 1), "{first_new}");
    assert_eq!(
        first_new["prev"],
        records.last().unwrap()["hash"],
        "the next run chains onto the last record written before the crash"
    );
    let verify = s.cli(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{}", verify.stderr);
    // A line the host pipe only took part of when the supervisor died is torn; nothing else.
    s.inbox.pending();
    assert!(s.inbox.not_json.len() <= 1, "{:?}", s.inbox.not_json);
    s.inbox.not_json.clear();
    s.check_clean();
}
