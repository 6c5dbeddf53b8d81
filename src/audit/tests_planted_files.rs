//! Files planted next to the audit log (red-team round 19): the agent can write `target/`,
//! where the log and its segments live. A named pipe, a terabyte of sparse NULs and a segment
//! numbered `u64::MAX` neither hang nor stall `run`'s start nor break rotation. Each test
//! failed on the code it was written against.

use crate::audit::keys::KeyStore;
use crate::audit::recover::open_for_run;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

fn setup() -> (tempfile::TempDir, KeyStore, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let keys = KeyStore::at(tmp.path().join("state"));
    let path = tmp.path().join("target/mcp-dev/audit/srv.jsonl");
    (tmp, keys, path)
}

fn write_some(path: &Path, keys: &KeyStore, n: usize) {
    let (mut log, rec) = open_for_run(path, keys).unwrap();
    assert_eq!(rec, None);
    for i in 0..n {
        log.append("x", "R", None, json!({"i": i})).unwrap();
    }
}

/// `open_for_run` on another thread; `Some(outcome)` if it returned within `limit`.
fn open_within(path: &Path, keys: &KeyStore, limit: Duration) -> Option<Result<String, String>> {
    let (tx, rx) = mpsc::channel();
    let (path, keys) = (path.to_owned(), keys.clone());
    std::thread::spawn(move || {
        let r = open_for_run(&path, &keys)
            .map(|(_, rec)| format!("{rec:?}"))
            .map_err(|e| e.to_string());
        let _ = tx.send(r);
    });
    rx.recv_timeout(limit).ok()
}

/// The agent empties the active log (`: > srv.jsonl`) and plants a named pipe where the last
/// segment would be (`mkfifo srv.99999.jsonl`). With the active file empty and an anchor,
/// `read_tail` asks whether the last segment ends at the anchored record
/// (`segment_ends_at`), which opens it with a blocking `O_RDONLY`: the next `run` hangs for
/// ever at start, before a word is printed (no refusal, no recovery, no host answered).
/// Expected: a segment that is not a regular file is refused or set aside at once (open with
/// `O_NONBLOCK` and check the type, as `open_active` does for the active file).
#[test]
fn a_named_pipe_planted_as_the_last_segment_does_not_hang_run_start() {
    let (_tmp, keys, path) = setup();
    write_some(&path, &keys, 3);
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let fifo = path.with_file_name("srv.99999.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let outcome = open_within(&path, &keys, Duration::from_secs(10));
    if outcome.is_none() {
        // Let the stuck thread go (a writer opens the pipe), then fail.
        use std::os::unix::fs::OpenOptionsExt;
        let _w = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        outcome.is_some(),
        "run's audit open blocked for 10 s on a named pipe planted as a segment"
    );
}

/// The agent extends the log with a sparse run of NUL bytes (`truncate -s +1T srv.jsonl`:
/// instant, no disk used). NULs at the end are taken for a killed writer's reservation, and
/// `scan::data_end` reads backwards through all of them, 64 KiB per `pread`, to find where
/// the records end: ~0.5 GB/s of zero pages here, so about 40 minutes for 1 TiB (ext4 allows
/// 16 TiB) before `run` starts or says anything. A writer reserves at most
/// `max(RESERVE_BYTES, a batch)` past its records, so a longer run of NULs is no
/// reservation. Expected: the start is bounded (skip holes with `SEEK_DATA`/`SEEK_HOLE`, or
/// judge NULs beyond what a reservation can be as damage and set the log aside).
#[test]
fn a_huge_sparse_run_of_nuls_after_the_records_does_not_stall_run_start() {
    let (_tmp, keys, path) = setup();
    write_some(&path, &keys, 3);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len + (1u64 << 40)).unwrap();
    let outcome = open_within(&path, &keys, Duration::from_secs(10));
    if outcome.is_none() {
        // Stop the reader that is still going: its next read is past the end.
        file.set_len(len).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        outcome.is_some(),
        "run's audit open was still reading a 1 TiB sparse tail of NULs after 10 s"
    );
}

/// The agent plants an empty file named as the segment with the largest number
/// (`srv.18446744073709551615.jsonl`). Rotation numbers the next segment `last + 1`
/// (`log.rs`, `rotate`): in a debug build that overflows and the supervisor panics at the
/// first rotation; in release it wraps to `srv.00000.jsonl`, and the *second* rotation's
/// `hard_link` finds that name taken, so every later append fails (`audit_failed` on every
/// call for the rest of the run). Expected: a segment number that cannot be followed is not
/// taken as the chain's last (segments are known from the chain's own `segment_started`
/// records, or numbers past the active chain's are ignored/refused with a message), and
/// rotation never panics or wedges.
#[test]
fn a_planted_segment_numbered_u64_max_does_not_break_rotation() {
    use crate::audit::log::{AuditLog, AuditOptions};
    let (_tmp, keys, path) = setup();
    let opts = AuditOptions {
        max_segment_bytes: 2_000,
        ..AuditOptions::default()
    };
    let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
    std::fs::write(path.with_file_name(format!("srv.{}.jsonl", u64::MAX)), b"").unwrap();
    let pad = "p".repeat(100);
    for n in 0..60 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            log.append("x", "R", Some("E"), json!({"n": n, "pad": pad}))
                .and_then(|_| log.flush())
        }));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("append {n} failed after a planted segment name: {e}"),
            Err(_) => {
                panic!("append {n} panicked (segment number overflow) after a planted segment name")
            }
        }
    }
}
