//! `audit verify` against logs mutated from valid ones: every mutation must be detected and the
//! failure must name the first bad line. Uses only the public `cargo_mcp_dev::audit` API and a
//! key store in a temporary directory (never the process environment: tests run in parallel).

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use cargo_mcp_dev::audit::{
    self, AuditError, AuditKey, AuditLog, KeyStore, Record, VerifyFailure, verify,
};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const RECORDS: usize = 10;

struct Fixture {
    _tmp: tempfile::TempDir,
    keys: KeyStore,
    log: PathBuf,
    root: PathBuf,
}

/// Writes a valid ten-record log for agent run `run`, covering the common record types.
fn write_log(path: &Path, keys: &KeyStore, run: &str) {
    let mut log = AuditLog::open(path, keys).unwrap();
    let (epoch_a, epoch_b) = ("01JQ7R4S4S0QJ7GZP1S2", "01JQ7R9KQ6K2Y8W4JH0M");
    let (a, b) = (Some(epoch_a), Some(epoch_b));
    let grant = |id: &str, epoch: &str| {
        json!({"grant": {"id": id, "agentRun": run, "serverLabel": "inventory", "executionEpoch": epoch,
            "toolScope": ["write_inventory"], "credentialScope": ["inventory-api-staging"],
            "issuedAt": "2025-06-01T12:00:00.000Z", "expiresWhen": "run-end"}})
    };
    let records = vec![
        (
            audit::RUN_STARTED,
            None,
            json!({"agentRun": run, "client": {"name": "test", "version": "1"}, "gating": "on", "label": "inventory"}),
        ),
        (
            audit::SERVER_STARTED,
            a,
            json!({"epoch": a, "pid": 41, "identityDigest": "ab".repeat(32), "executableSha256": "cd".repeat(32), "argv": ["srv"], "label": "inventory"}),
        ),
        (audit::APPROVAL_GRANTED, a, grant("G1", epoch_a)),
        (
            audit::TOOL_CALLED,
            a,
            json!({"callId": 1, "tool": "write_inventory", "grant": "G1", "credentialScopes": ["inventory-api-staging"], "argumentsDigest": "ef".repeat(32)}),
        ),
        (
            audit::TOOL_RESULT,
            a,
            json!({"callId": 1, "tool": "write_inventory", "isError": false, "durationMs": 12}),
        ),
        (
            audit::SERVER_REPLACED,
            b,
            json!({"oldEpoch": a, "newEpoch": b, "pid": 42}),
        ),
        (
            audit::AUTHORIZATION_DENIED,
            b,
            json!({"callId": 2, "tool": "write_inventory", "reason": "authorization_stale", "approvedEpoch": a, "currentEpoch": b}),
        ),
        (audit::APPROVAL_GRANTED, b, grant("G2", epoch_b)),
        (
            audit::TOOL_CALLED,
            b,
            json!({"callId": 3, "tool": "write_inventory", "grant": "G2", "credentialScopes": ["inventory-api-staging"], "argumentsDigest": "01".repeat(32)}),
        ),
        (audit::RUN_ENDED, b, json!({"reason": "host disconnected"})),
    ];
    assert_eq!(records.len(), RECORDS);
    for (ty, epoch, data) in records {
        log.append(ty, run, epoch, data).unwrap();
    }
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_owned();
    let keys = KeyStore::at(root.join("state"));
    let log = root.join("audit.jsonl");
    write_log(&log, &keys, "RUN-A");
    Fixture {
        _tmp: tmp,
        keys,
        log,
        root,
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

/// Verifies and requires a failure at `line`; returns it for further checks.
fn fails_at(f: &Fixture, line: usize) -> VerifyFailure {
    match verify(&f.log, &f.keys) {
        Ok(report) => panic!("mutation not detected: {report:?}"),
        Err(failure) => {
            assert_eq!(failure.line, line, "wrong line named: {failure}");
            failure
        }
    }
}

/// Flips bits `mask` of the byte at `offset` within line `line` (1-based).
fn flip(f: &Fixture, line: usize, offset: usize, mask: u8) {
    let mut bytes = std::fs::read(&f.log).unwrap();
    let start: usize = read_lines(&f.log)[..line - 1]
        .iter()
        .map(|l| l.len() + 1)
        .sum();
    bytes[start + offset] ^= mask;
    std::fs::write(&f.log, bytes).unwrap();
}

fn offset_of(f: &Fixture, line: usize, needle: &str) -> usize {
    read_lines(&f.log)[line - 1]
        .find(needle)
        .unwrap_or_else(|| panic!("{needle} not in line {line}"))
}

#[test]
fn valid_log_verifies() {
    let f = fixture();
    let report = verify(&f.log, &f.keys).unwrap();
    assert_eq!(report.records, RECORDS as u64);
    assert_eq!(report.head_seq, RECORDS as u64);
    assert_eq!((report.runs, report.epochs), (1, 2));
    let last = Record::from_line(read_lines(&f.log).last().unwrap()).unwrap();
    assert_eq!(report.head_hash, last.hash);
}

#[test]
fn flipped_byte_in_data_is_a_hash_mismatch() {
    let f = fixture();
    let at = offset_of(&f, 4, "write_inventory") + 2;
    flip(&f, 4, at, 0x01);
    let failure = fails_at(&f, 4);
    assert_eq!(failure.seq, Some(4));
    assert!(
        failure
            .to_string()
            .starts_with("record 4 (line 4): hash mismatch"),
        "{failure}"
    );
}

#[test]
fn flipped_byte_in_hash_is_detected_at_that_record() {
    let f = fixture();
    let at = offset_of(&f, 4, "\"hash\":\"") + 10;
    flip(&f, 4, at, 0x01);
    let failure = fails_at(&f, 4);
    assert!(failure.reason.starts_with("hash mismatch"), "{failure}");
}

#[test]
fn flipped_byte_in_mac_is_detected_at_that_record() {
    let f = fixture();
    // Flip the case bit of a hex letter or a digit's low bit: both stay plausible-looking.
    let line = &read_lines(&f.log)[3];
    let mac_start = line.find("\"mac\":\"").unwrap() + 7;
    let at = mac_start
        + line[mac_start..]
            .find(|c: char| c.is_ascii_digit())
            .unwrap();
    flip(&f, 4, at, 0x01);
    let failure = fails_at(&f, 4);
    assert!(failure.reason.starts_with("MAC invalid"), "{failure}");
}

#[test]
fn flipped_byte_in_structure_is_reported_as_malformed() {
    let f = fixture();
    flip(&f, 7, 0, 0x01); // '{' -> 'z'
    let failure = fails_at(&f, 7);
    assert!(failure.reason.starts_with("malformed"), "{failure}");
}

#[test]
fn every_single_byte_flip_of_a_record_is_detected_at_its_line() {
    let f = fixture();
    let original = std::fs::read(&f.log).unwrap();
    let len = read_lines(&f.log)[3].len() + 1; // including its newline
    for offset in 0..len {
        for mask in [0x01u8, 0x20, 0x80] {
            std::fs::write(&f.log, &original).unwrap();
            flip(&f, 4, offset, mask);
            match verify(&f.log, &f.keys) {
                Ok(_) => panic!("flip {mask:#04x} at offset {offset} of line 4 not detected"),
                Err(failure) => {
                    assert_eq!(failure.line, 4, "flip {mask:#04x} at {offset}: {failure}")
                }
            }
        }
    }
}

#[test]
fn deleted_record_is_detected() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    lines.remove(4); // record 5
    write_lines(&f.log, &lines);
    let failure = fails_at(&f, 5);
    assert_eq!(failure.seq, Some(6));
    assert!(failure.reason.contains("out of sequence"), "{failure}");
}

#[test]
fn deleted_first_record_is_detected() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    lines.remove(0);
    write_lines(&f.log, &lines);
    fails_at(&f, 1);
}

#[test]
fn inserted_copy_of_a_record_is_detected() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    let copy = lines[2].clone(); // record 3
    lines.insert(6, copy); // becomes line 7
    write_lines(&f.log, &lines);
    let failure = fails_at(&f, 7);
    assert_eq!(failure.seq, Some(3));
}

#[test]
fn duplicated_record_in_place_is_detected() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    let copy = lines[4].clone();
    lines.insert(5, copy); // record 5 twice, on lines 5 and 6
    write_lines(&f.log, &lines);
    fails_at(&f, 6);
}

#[test]
fn swapped_records_are_detected() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    lines.swap(3, 4); // records 4 and 5
    write_lines(&f.log, &lines);
    let failure = fails_at(&f, 4);
    assert_eq!(failure.seq, Some(5));
}

#[test]
fn truncated_tail_is_detected_by_the_anchor() {
    let f = fixture();
    let mut lines = read_lines(&f.log);
    lines.pop();
    write_lines(&f.log, &lines);
    let failure = fails_at(&f, 10);
    assert_eq!(failure.seq, Some(10));
    assert!(
        failure
            .to_string()
            .starts_with("record 10 (line 10): truncated tail"),
        "{failure}"
    );
}

#[test]
fn truncated_to_half_is_detected() {
    let f = fixture();
    let lines = read_lines(&f.log);
    write_lines(&f.log, &lines[..5]);
    let failure = fails_at(&f, 6);
    assert!(
        failure.reason.contains("anchor records head seq 10"),
        "{failure}"
    );
}

#[test]
fn last_line_cut_midway_is_detected() {
    let f = fixture();
    let text = std::fs::read_to_string(&f.log).unwrap();
    let last_len = read_lines(&f.log).last().unwrap().len();
    let cut = text.len() - 1 - last_len / 2;
    std::fs::write(&f.log, &text[..cut]).unwrap();
    let failure = fails_at(&f, 10);
    assert!(
        failure.reason.starts_with("incomplete last line"),
        "{failure}"
    );
}

#[test]
fn last_newline_removed_is_detected() {
    let f = fixture();
    let text = std::fs::read_to_string(&f.log).unwrap();
    std::fs::write(&f.log, text.trim_end_matches('\n')).unwrap();
    let failure = fails_at(&f, 10);
    assert!(failure.reason.contains("no final newline"), "{failure}");
}

/// Re-chains lines `from..` (1-based) after `edit`, with correct hashes and prev links, sealing
/// with `key` (which the attacker has to guess).
fn rechain(f: &Fixture, from: usize, key: &AuditKey, edit: impl Fn(&mut Record)) {
    let lines = read_lines(&f.log);
    let mut out = Vec::new();
    let mut prev: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        let mut r = Record::from_line(line).unwrap();
        if i + 1 >= from {
            if i + 1 == from {
                edit(&mut r);
            }
            if let Some(p) = &prev {
                r.prev = p.clone();
            }
            r.seal(key).unwrap();
            out.push(String::from_utf8(r.to_line().unwrap()).unwrap());
        } else {
            out.push(line.clone());
        }
        prev = Some(r.hash.clone());
    }
    write_lines(&f.log, &out);
}

#[test]
fn rechained_tail_without_the_key_is_detected() {
    let f = fixture();
    let guessed = AuditKey::from_bytes([0x5a; 32]);
    rechain(&f, 6, &guessed, |r| r.data["pid"] = json!(666));
    let failure = fails_at(&f, 6);
    assert!(failure.reason.starts_with("MAC invalid"), "{failure}");
}

#[test]
fn whole_log_rechained_without_the_key_is_detected() {
    let f = fixture();
    let guessed = AuditKey::from_bytes([0; 32]);
    rechain(&f, 1, &guessed, |r| r.run = "someone-else".into());
    fails_at(&f, 1);
}

#[test]
fn record_spliced_from_another_log_is_detected() {
    let f = fixture();
    let other = f.root.join("other.jsonl");
    write_log(&other, &f.keys, "RUN-B");
    assert!(
        verify(&other, &f.keys).is_ok(),
        "the donor log is valid on its own"
    );
    let mut lines = read_lines(&f.log);
    lines[4] = read_lines(&other)[4].clone();
    write_lines(&f.log, &lines);
    let failure = fails_at(&f, 5);
    assert_eq!(failure.seq, Some(5));
    assert!(failure.reason.starts_with("broken chain"), "{failure}");
}

#[test]
fn log_replaced_by_another_valid_log_is_detected() {
    let f = fixture();
    let other = f.root.join("other.jsonl");
    write_log(&other, &f.keys, "RUN-B");
    std::fs::copy(&other, &f.log).unwrap();
    // Every record verifies; only the anchor of this path can tell.
    let failure = fails_at(&f, 10);
    assert!(failure.reason.contains("anchor"), "{failure}");
}

/// Issue 15: one writer per log. Writers that want the same log take turns (each waits for the
/// previous one to close) and the chain runs through all of them.
#[test]
fn writers_taking_turns_produce_a_valid_log() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = KeyStore::at(tmp.path().join("state"));
    let path = tmp.path().join("shared.jsonl");
    for (i, run) in ["RUN-A", "RUN-B"].iter().enumerate() {
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for c in 0..5u64 {
            let r = log
                .append(audit::TOOL_CALLED, run, Some("E"), json!({"callId": c}))
                .unwrap();
            assert_eq!(r.seq, 5 * i as u64 + c + 1);
        }
    }
    // Concurrently, from threads, each with its own writer: they wait for each other.
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (path, keys) = (path.clone(), keys.clone());
            std::thread::spawn(move || {
                let mut log = AuditLog::open(&path, &keys).unwrap();
                for i in 0..50 {
                    log.append(
                        audit::TOOL_RESULT,
                        &format!("T{t}"),
                        None,
                        json!({"callId": i}),
                    )
                    .unwrap();
                    log.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let report = verify(&path, &keys).unwrap();
    assert_eq!(report.records, 10 + 4 * 50);
    assert_eq!(report.runs, 6);
}

#[test]
fn symlinked_log_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let keys = KeyStore::at(tmp.path().join("state"));
    let target = tmp.path().join("elsewhere.jsonl");
    std::fs::write(&target, b"").unwrap();
    let link = tmp.path().join("audit.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = AuditLog::open(&link, &keys).unwrap_err();
    assert!(matches!(err, AuditError::Symlink { .. }), "{err:?}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::metadata(&target).unwrap().len(), 0);
}

#[test]
fn world_readable_key_is_refused() {
    let f = fixture();
    std::fs::set_permissions(f.keys.key_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = AuditLog::open(&f.log, &f.keys).unwrap_err();
    assert!(matches!(err, AuditError::InsecureKey { .. }), "{err:?}");
    assert!(err.to_string().contains("mode 0644"), "{err}");
    let failure = verify(&f.log, &f.keys).unwrap_err();
    assert!(failure.reason.contains("mode 0644"), "{failure}");
}

#[test]
fn wrong_key_store_fails_on_the_first_record() {
    let f = fixture();
    let other = KeyStore::at(f.root.join("other-state"));
    other.load_or_create_key().unwrap();
    let failure = verify(&f.log, &other).unwrap_err();
    assert_eq!(failure.line, 1);
    assert!(failure.reason.starts_with("MAC invalid"), "{failure}");
}

#[test]
fn journals_from_a_verified_log() {
    let f = fixture();
    let j = audit::Journals::from_log(&f.log, &f.keys).unwrap();
    assert_eq!(j.activity.len(), 3);
    assert_eq!(j.activity[0].epoch.as_deref(), Some("01JQ7R4S4S0QJ7GZP1S2"));
    assert_eq!(j.activity[2].grant.as_deref(), Some("G2"));
    assert_eq!(j.session.epochs.len(), 2);
    let mut lines = read_lines(&f.log);
    lines.swap(1, 2);
    write_lines(&f.log, &lines);
    assert!(
        matches!(audit::Journals::from_log(&f.log, &f.keys), Err(AuditError::Verify(v)) if v.line == 2)
    );
}
