//! Checkpoints kept elsewhere (issue 36, point 5): someone who holds the audit key can rewrite
//! the whole log and its anchor so that `audit verify` passes; a checkpoint taken before still
//! catches the rewrite, a cut and a rollback. Each attack is first shown to pass plain
//! verification (so the test can fail), then shown to fail against the checkpoint. Library API
//! and the CLI, with a key store in a temporary directory.

// Tests forge logs and anchors with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use cargo_mcp_dev::audit::chain::anchor_mac;
use cargo_mcp_dev::audit::checkpoint::{self, Checkpoint, CheckpointError, CheckpointMismatch};
use cargo_mcp_dev::audit::{self, AuditKey, AuditLog, KeyStore, Record, verify};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

struct Fixture {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    keys: KeyStore,
    log: PathBuf,
}

fn fixture(records: u64) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let keys = KeyStore::at(&state);
    let log = tmp.path().join("audit/srv.jsonl");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let f = Fixture {
        _tmp: tmp,
        state,
        keys,
        log,
    };
    append(&f, records, "E1");
    f
}

/// Appends `n` calls under epoch `epoch` (a writer opened and closed, as a `run` does).
fn append(f: &Fixture, n: u64, epoch: &str) {
    let mut log = AuditLog::open(&f.log, &f.keys).unwrap();
    for i in 0..n {
        log.append(
            audit::TOOL_CALLED,
            "RUN-A",
            Some(epoch),
            json!({"callId": i, "tool": "write_note"}),
        )
        .unwrap();
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What an agent holding the key does: keeps the first `keep` records, edits the record after
/// them with `edit` (if any remain), re-seals every later record onto the new chain, and writes
/// an anchor naming the new head. Plain verification then passes.
fn rewrite_with_the_key(f: &Fixture, keep: usize, edit: impl Fn(&mut Record)) {
    let key = f.keys.load_key().unwrap();
    let old = lines(&f.log);
    let mut out: Vec<String> = old[..keep].to_vec();
    let mut prev = out
        .last()
        .map(|l| Record::from_line(l).unwrap().hash)
        .unwrap_or_else(|| audit::chain::GENESIS_PREV.to_string());
    for (i, line) in old[keep..].iter().enumerate() {
        let mut r = Record::from_line(line).unwrap();
        if i == 0 {
            edit(&mut r);
        }
        r.prev = prev.clone();
        r.seal(&key).unwrap();
        prev = r.hash.clone();
        out.push(String::from_utf8(r.to_line().unwrap()).unwrap());
    }
    write_log_and_anchor(f, &key, &out);
}

/// Writes `records` as the log and an anchor naming its last record, sealed with `key`.
fn write_log_and_anchor(f: &Fixture, key: &AuditKey, records: &[String]) {
    let mut text = records.join("\n");
    text.push('\n');
    std::fs::write(&f.log, &text).unwrap();
    let head = Record::from_line(records.last().unwrap()).unwrap();
    let anchor = json!({"log": std::fs::canonicalize(&f.log).unwrap(), "seq": head.seq,
        "hash": head.hash, "mac": anchor_mac(key, head.seq, &head.hash), "offset": text.len()});
    std::fs::write(f.keys.anchor_path(&f.log).unwrap(), anchor.to_string()).unwrap();
}

fn mismatch(cp: &Checkpoint, f: &Fixture) -> CheckpointMismatch {
    match checkpoint::check(cp, &f.log, &f.keys).unwrap() {
        Ok(e) => panic!("the log still extends the checkpoint: {:?}", e.report),
        Err(m) => m,
    }
}

#[test]
fn a_checkpoint_names_the_head_and_the_log_extends_it() {
    let f = fixture(4);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    assert_eq!(cp.checkpoint, checkpoint::CHECKPOINT_FORMAT);
    assert_eq!(cp.seq, 4);
    assert_eq!(cp.epoch.as_deref(), Some("E1"));
    let head = Record::from_line(lines(&f.log).last().unwrap()).unwrap();
    assert_eq!(
        (cp.hash.as_str(), cp.time.as_str()),
        (head.hash.as_str(), head.time.as_str())
    );
    let same = checkpoint::check(&cp, &f.log, &f.keys).unwrap().unwrap();
    assert_eq!(same.since, 0);
    // Records written after it: the log still extends it.
    append(&f, 3, "E2");
    let later = checkpoint::check(&cp, &f.log, &f.keys).unwrap().unwrap();
    assert_eq!((later.since, later.report.head_seq), (3, 7));
    // A checkpoint of the longer log names the newer epoch.
    assert_eq!(
        checkpoint::make(&f.log, &f.keys).unwrap().epoch.as_deref(),
        Some("E2")
    );
}

#[test]
fn a_rewrite_with_the_key_passes_verify_but_not_the_checkpoint() {
    let f = fixture(6);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    append(&f, 2, "E2");
    // Record 3 (before the checkpoint) says another tool ran; everything after is re-sealed.
    rewrite_with_the_key(&f, 2, |r| r.data["tool"] = json!("delete_everything"));
    let report = verify(&f.log, &f.keys).expect("the key holder's rewrite verifies");
    assert_eq!(report.head_seq, 8);
    match mismatch(&cp, &f) {
        CheckpointMismatch::Rewritten { seq, .. } => assert_eq!(seq, 6),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rewrite_of_the_checkpoints_own_record_is_caught() {
    let f = fixture(5);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    rewrite_with_the_key(&f, 4, |r| r.data["tool"] = json!("other"));
    verify(&f.log, &f.keys).expect("verifies");
    assert!(matches!(
        mismatch(&cp, &f),
        CheckpointMismatch::Rewritten { seq: 5, .. }
    ));
}

#[test]
fn a_rewrite_after_the_checkpoint_is_not_its_business() {
    // The checkpoint pins history up to its record, not after it.
    let f = fixture(5);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    append(&f, 3, "E2");
    rewrite_with_the_key(&f, 6, |r| r.data["tool"] = json!("other"));
    verify(&f.log, &f.keys).expect("verifies");
    let e = checkpoint::check(&cp, &f.log, &f.keys).unwrap().unwrap();
    assert_eq!(e.since, 3);
}

#[test]
fn a_cut_or_a_rollback_before_the_checkpoint_is_caught() {
    let f = fixture(8);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    // Rolled back to the first 5 records, with an anchor to match: verify passes.
    let key = f.keys.load_key().unwrap();
    let kept: Vec<String> = lines(&f.log)[..5].to_vec();
    write_log_and_anchor(&f, &key, &kept);
    assert_eq!(verify(&f.log, &f.keys).expect("verifies").head_seq, 5);
    match mismatch(&cp, &f) {
        CheckpointMismatch::Shorter { head, seq, .. } => assert_eq!((head, seq), (5, 8)),
        other => panic!("{other:?}"),
    }
    // Rolled back, then grown past the checkpoint again with other records.
    append(&f, 4, "E9");
    assert!(matches!(
        mismatch(&cp, &f),
        CheckpointMismatch::Rewritten { seq: 8, .. }
    ));
}

#[test]
fn an_edited_checkpoint_or_another_key_is_refused() {
    let f = fixture(3);
    let cp = checkpoint::make(&f.log, &f.keys).unwrap();
    for edit in [
        |c: &mut Checkpoint| c.seq = 2,
        |c: &mut Checkpoint| c.time = "2020-01-01T00:00:00.000Z".into(),
        |c: &mut Checkpoint| c.epoch = None,
        |c: &mut Checkpoint| c.log = "/elsewhere".into(),
    ] {
        let mut edited = cp.clone();
        edit(&mut edited);
        assert_eq!(mismatch(&edited, &f), CheckpointMismatch::Signature);
    }
    // The same log checked with another key store (another user's key).
    let other = tempfile::tempdir().unwrap();
    let other_keys = KeyStore::at(other.path().join("state"));
    other_keys.load_or_create_key().unwrap();
    match checkpoint::check(&cp, &f.log, &other_keys).unwrap() {
        Err(CheckpointMismatch::Signature) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_checkpoints_and_logs_are_clear_errors() {
    for (text, says) in [
        ("", "not a checkpoint"),
        ("{", "not a checkpoint"),
        ("[1,2]", "not a checkpoint"),
        (r#"{"checkpoint":1}"#, "missing field"),
        (
            r#"{"checkpoint":1,"log":"l","seq":1,"hash":"h","epoch":null,"time":"t","mac":"m","x":1}"#,
            "unknown field",
        ),
        (
            r#"{"checkpoint":2,"log":"l","seq":1,"hash":"h","epoch":null,"time":"t","mac":"m"}"#,
            "format 2",
        ),
    ] {
        let e = Checkpoint::parse(text).unwrap_err();
        assert!(e.to_string().contains(says), "{text:?}: {e}");
    }
    // An empty log has nothing to checkpoint; a damaged one is not checkpointed.
    let f = fixture(0);
    std::fs::write(&f.log, "").unwrap();
    f.keys.load_or_create_key().unwrap();
    let empty = checkpoint::make(&f.log, &f.keys).unwrap_err();
    assert!(empty.to_string().contains("empty"), "{empty}");
    let g = fixture(3);
    let mut text = std::fs::read_to_string(&g.log).unwrap();
    text = text.replacen("write_note", "write_nope", 1);
    std::fs::write(&g.log, text).unwrap();
    assert!(matches!(
        checkpoint::make(&g.log, &g.keys),
        Err(CheckpointError::LogInvalid(_))
    ));
    // A checkpoint of a good log against a damaged one: the damage is named.
    let h = fixture(3);
    let cp = checkpoint::make(&h.log, &h.keys).unwrap();
    std::fs::copy(&g.log, &h.log).unwrap();
    assert!(matches!(
        mismatch(&cp, &h),
        CheckpointMismatch::LogInvalid(_)
    ));
}

fn cli(f: &Fixture, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"));
    c.args(["mcp-dev", "audit"])
        .args(args)
        .env("CARGO_MCP_DEV_HOME", &f.state)
        .stdin(Stdio::null());
    c
}

#[test]
fn the_cli_prints_a_checkpoint_and_verifies_against_it() {
    let f = fixture(4);
    let log = f.log.to_str().unwrap();
    let out = cli(&f, &["checkpoint", log]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one line of JSON: {stdout}");
    let cp = Checkpoint::parse(&stdout).unwrap();
    assert_eq!(cp.seq, 4);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("verify --checkpoint"), "{stderr}");
    let file = f.state.parent().unwrap().join("cp.json");
    std::fs::write(&file, &stdout).unwrap();
    let file = file.to_str().unwrap();

    append(&f, 2, "E2");
    let ok = cli(&f, &["verify", log, "--checkpoint", file, "--json"])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(
        (v["ok"].as_bool(), v["since"].as_u64()),
        (Some(true), Some(2)),
        "{v}"
    );
    assert!(String::from_utf8_lossy(&ok.stderr).contains("extends the checkpoint of record 4"));

    // From standard input too.
    let mut piped = cli(&f, &["verify", log, "--checkpoint", "-"]);
    piped
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = piped.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdout.as_bytes())
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());

    // The key holder's rewrite: plain verify passes, the checkpoint fails (exit 105).
    rewrite_with_the_key(&f, 1, |r| r.data["tool"] = json!("other"));
    assert!(cli(&f, &["verify", log]).output().unwrap().status.success());
    let bad = cli(&f, &["verify", log, "--checkpoint", file])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(105));
    let says = String::from_utf8_lossy(&bad.stderr);
    assert!(
        says.contains("does not extend the checkpoint of record 4"),
        "{says}"
    );
    assert!(says.contains("rewritten at or before it"), "{says}");

    // Not a checkpoint; a missing file.
    std::fs::write(f.state.parent().unwrap().join("junk"), "x".repeat(10_000)).unwrap();
    let junk = f.state.parent().unwrap().join("junk");
    let e = cli(&f, &["verify", log, "--checkpoint", junk.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(e.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("larger than"),
        "{}",
        String::from_utf8_lossy(&e.stderr)
    );
    let gone = cli(&f, &["verify", log, "--checkpoint", "/nonexistent/cp.json"])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("cannot read the checkpoint"));
}
