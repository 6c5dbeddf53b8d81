//! Files planted next to the audit log (red-team rounds 19 and 20; the last test: the session's
//! own files after `cargo clean`): the agent can write `target/`,
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
    use crate::audit::writer::{AuditLog, AuditOptions};
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

/// Red-team round 20: round 19 skipped holes with SEEK_DATA/SEEK_HOLE, but past 4096 data regions `data_end`
/// falls back to reading the whole file backwards. The agent appends 4200 single NUL bytes,
/// each in its own block, 256 MiB apart (16 MiB of disk, a few ms to make): ~1 TiB of file
/// whose tail is all NUL, and which has 4201 regions. The fallback reads the full terabyte of
/// holes, so `run`'s start stalls as long as before the fix (~40 min here).
/// Expected: bounded start (walk the regions without a cap, keeping only the last ones, or
/// judge NULs past a reservation's size as damage).
#[test]
fn many_nul_extents_do_not_stall_run_start() {
    use std::os::unix::fs::FileExt;
    let (_tmp, keys, path) = setup();
    write_some(&path, &keys, 3);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let len = file.metadata().unwrap().len();
    let base = len.div_ceil(4096) * 4096 + (256 << 20);
    for k in 0..4200u64 {
        file.write_at(&[0u8], base + k * (256 << 20)).unwrap();
    }
    let outcome = open_within(&path, &keys, Duration::from_secs(15));
    if outcome.is_none() {
        file.set_len(len).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        outcome.is_some(),
        "run's audit open was still reading a 1 TiB tail of 4200 NUL extents after 15 s"
    );
}

/// `next_segment_number` takes "one past the highest number with a free successor". The agent
/// plants `srv.18446744073709551614.jsonl` (u64::MAX - 1). The first rotation takes u64::MAX
/// (a real segment), the second finds no successor for it and goes back to 4: the writer
/// itself lays its chain out of numeric order (1, 2, 3, MAX, 4, ...). `audit verify` and
/// `run`'s start (`segments.last()`) read segments in numeric order, so even after the human
/// deletes the planted file, the genuine chain fails to verify.
/// Expected: the next number is always above the chain's own last segment (numbers the chain
/// did not write are passed over, never gone back below), or rotation refuses with a message.
#[test]
fn a_planted_segment_near_u64_max_never_puts_the_chain_out_of_order() {
    use crate::audit::writer::{AuditLog, AuditOptions};
    let (_tmp, keys, path) = setup();
    let opts = AuditOptions {
        max_segment_bytes: 2_000,
        ..AuditOptions::default()
    };
    let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
    let planted = path.with_file_name(format!("srv.{}.jsonl", u64::MAX - 1));
    std::fs::write(&planted, b"").unwrap();
    let pad = "p".repeat(100);
    for n in 0..80 {
        log.append("x", "R", Some("E"), json!({"n": n, "pad": pad}))
            .and_then(|_| log.flush())
            .unwrap();
    }
    drop(log);
    let names: Vec<String> = crate::audit::scan::list_segments(&path)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .collect();
    // The human finds the stray file and removes it; the writer's own records remain.
    std::fs::remove_file(&planted).unwrap();
    let verified = crate::audit::verify::verify(&path, &keys);
    assert!(
        verified.is_ok(),
        "the writer's own chain (segments {names:?}) no longer verifies: {:?}",
        verified.err().map(|f| f.reason)
    );
}

/// `cargo clean` while a session runs (the user's or the agent's: an everyday command)
/// removes `target/`. Before round 19 the next status/launch/facts write recreated the
/// directories (`write_atomic` does `create_dir_all`); `DirWriter` holds the old, now deleted
/// `target/mcp-dev` open, and `mkdirat`/`openat` in a deleted directory fail with ENOENT: the
/// session never writes its status, launch records or facts again until it is restarted
/// (each failure is only a verbose line). The next run starts cold, without the facts.
/// Expected: a held root that was removed (`fstat` nlink 0, or ENOENT) is opened again.
#[test]
fn after_cargo_clean_the_sessions_files_are_written_again() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("target/mcp-dev");
    let w = crate::base::fsutil::DirWriter::open(&root).unwrap();
    let status = root.join("status/srv.json");
    w.write(&status, b"one").unwrap();
    std::fs::remove_dir_all(d.path().join("target")).unwrap(); // `cargo clean`
    // The next build recreates target/ (cargo), the session publishes again.
    std::fs::create_dir_all(d.path().join("target/debug")).unwrap();
    let r = w.write(&status, b"two");
    assert!(
        r.is_ok() && std::fs::read(&status).ok().as_deref() == Some(&b"two"[..]),
        "after `cargo clean` the status file is not written again: {r:?}"
    );
}

// ----- long-lived roots (issue 34, point 5) ----------------------------------------------------

/// `run` holds `target/mcp-dev` open and opens its audit directory below it: a link planted at
/// `audit` (a directory between the held root and the log, not the log's own name) is refused,
/// not followed; the log is not created through it and nothing is written outside. Before, the
/// log's directory was created and opened by its path, following the link, and the log went on
/// in the link's target.
#[test]
fn a_link_planted_between_the_held_root_and_the_log_is_refused() {
    use crate::base::beneath::Beneath;
    let (tmp, keys, path) = setup();
    let root = Beneath::create(&tmp.path().join("target/mcp-dev")).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.root().join("audit")).unwrap();
    let opts = crate::audit::AuditOptions::default();
    let e = crate::audit::open_for_run_within(Some(&root), &path, &keys, &opts).unwrap_err();
    assert!(e.to_string().contains("not a directory of ours"), "{e}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written through the link"
    );
    // The same root, the link gone: the log opens below it and works.
    std::fs::remove_file(root.root().join("audit")).unwrap();
    let (mut log, rec) =
        crate::audit::open_for_run_within(Some(&root), &path, &keys, &opts).unwrap();
    assert_eq!(rec, None);
    log.append("x", "R", None, json!({"n": 1})).unwrap();
    log.commit().unwrap();
    assert_eq!(log.head().map(|(seq, _)| seq), Some(1));
    drop(log);
    assert!(crate::audit::verify(&path, &keys).is_ok());
}

/// The whole directory removed while the writer runs (`cargo clean`), and a link planted at
/// `audit` in the new `target/mcp-dev`: the log is not put back through it (its directory is
/// opened again below the held root, no link followed); the writer fails closed and keeps its
/// records beside the anchor.
#[test]
fn after_cargo_clean_a_link_planted_at_the_audit_directory_is_not_written_through() {
    use crate::base::beneath::Beneath;
    let (tmp, keys, path) = setup();
    let root = Beneath::create(&tmp.path().join("target/mcp-dev")).unwrap();
    let opts = crate::audit::AuditOptions::default();
    let (mut log, _) = crate::audit::open_for_run_within(Some(&root), &path, &keys, &opts).unwrap();
    log.append("x", "R", None, json!({"n": 1})).unwrap();
    log.commit().unwrap();
    std::fs::remove_dir_all(tmp.path().join("target")).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::create_dir_all(root.root()).unwrap();
    std::os::unix::fs::symlink(&outside, root.root().join("audit")).unwrap();
    std::thread::sleep(crate::audit::writer::testing::LENGTH_CHECK_EVERY);
    log.append("x", "R", None, json!({"n": 2})).unwrap();
    match log.flush().map_err(|e| e.to_string()) {
        Err(e) => assert!(
            e.contains("could not be put back") && e.contains("are kept in"),
            "{e}"
        ),
        Ok(()) => panic!("the log was put back through the link"),
    }
    let written: Vec<_> = std::fs::read_dir(&outside).unwrap().collect();
    assert!(written.is_empty(), "written through the link: {written:?}");
}
