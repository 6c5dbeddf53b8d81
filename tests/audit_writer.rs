//! The audit writer across processes (issue 15): one writer per log, a crash (`kill -9`) in the
//! middle of a burst loses nothing that was flushed (a write it cut short is kept aside by the
//! next open and the chain continues), a failed write leaves no partial line, and
//! segments rotate and are followed (and checked) by `audit verify`.
//!
//! The other process is this test binary run again with `AUDIT_WRITER_CHILD` set (see
//! [`child`]): real files, real processes, a real `SIGKILL`.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use cargo_mcp_dev::audit::{
    self, AuditError, AuditLog, AuditOptions, FsyncPolicy, KeyStore, Record, open_for_run,
    read_records, verify,
};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "AUDIT_WRITER_CHILD";

/// The child's side. `hold <log> <state>`: open, append and flush one record, say `ready`,
/// then keep the log until stdin closes. `burst <log> <state>`: append and flush batches of 8
/// records forever, printing `flushed <seq>` after each flush (until killed).
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = role.split('\n');
    let (what, log, state) = (
        parts.next().unwrap(),
        PathBuf::from(parts.next().unwrap()),
        PathBuf::from(parts.next().unwrap()),
    );
    let keys = KeyStore::at(state);
    let mut out = std::io::stdout();
    match what {
        "hold" => {
            let mut log = AuditLog::open(&log, &keys).unwrap();
            log.append(
                audit::RUN_STARTED,
                "CHILD",
                None,
                json!({"pid": std::process::id()}),
            )
            .unwrap();
            log.flush().unwrap();
            writeln!(out, "ready {}", std::process::id()).unwrap();
            out.flush().unwrap();
            let mut sink = String::new();
            let _ = std::io::stdin().read_line(&mut sink);
        }
        "burst" => {
            let (mut log, _) = open_for_run(&log, &keys).unwrap();
            log.set_fsync(FsyncPolicy::Never);
            for call in 0u64.. {
                let mut last = 0;
                for i in 0..8 {
                    last = log
                        .append(
                            audit::TOOL_CALLED,
                            "CHILD",
                            Some("E1"),
                            json!({"callId": call * 8 + i, "tool": "write"}),
                        )
                        .unwrap()
                        .seq;
                }
                log.flush().unwrap();
                writeln!(out, "flushed {last}").unwrap();
                out.flush().unwrap();
            }
        }
        "burst-big" | "burst-big-write" => {
            // Batches of 1 MiB records: each flush is one 8 MiB copy into the mapped
            // reservation (`burst-big`) or one 4 MiB `write` (`burst-big-write`), long enough
            // for the parent to kill the process inside it.
            let opts = AuditOptions {
                max_segment_bytes: 0,
                write_through_map: what == "burst-big",
                ..AuditOptions::default()
            };
            let (mut log, _) = audit::open_for_run_with(&log, &keys, &opts).unwrap();
            log.set_fsync(FsyncPolicy::Never);
            let pad = "p".repeat(1 << 20);
            // A copy is faster than a `write`: a larger batch gives the kill its chance.
            let per_batch = if what == "burst-big" { 8 } else { 4 };
            for call in 0u64.. {
                for i in 0..per_batch {
                    log.append(
                        audit::TOOL_CALLED,
                        "CHILD",
                        Some("E1"),
                        json!({"callId": call * per_batch + i, "pad": pad}),
                    )
                    .unwrap();
                }
                log.flush().unwrap();
                writeln!(out, "flushed").unwrap();
                out.flush().unwrap();
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn_child(
    role: &str,
    log: &Path,
    keys_dir: &Path,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{role}\n{}\n{}", log.display(), keys_dir.display()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// The next line starting with `prefix` (the harness prints its own lines too).
fn next_line(out: &mut BufReader<std::process::ChildStdout>, prefix: &str) -> Option<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            return None;
        }
        if let Some(pos) = line.find(prefix) {
            return Some(line[pos + prefix.len()..].trim().to_string());
        }
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, KeyStore, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let log = tmp.path().join("audit/srv.jsonl");
    (tmp, state.clone(), KeyStore::at(state), log)
}

/// "What it must show": a second writer on the same log is refused with a clear error naming
/// the log, the other writer's pid and what to do; once the first has exited, it opens and
/// continues the chain.
#[test]
fn a_second_writer_in_another_process_is_refused_then_admitted() {
    let (_tmp, state, keys, log) = setup();
    let (mut child, mut out) = spawn_child("hold", &log, &state);
    let pid: u32 = next_line(&mut out, "ready ").unwrap().parse().unwrap();
    assert_eq!(pid, child.id());

    let opts = AuditOptions {
        lock_wait: Duration::from_millis(300),
        ..AuditOptions::default()
    };
    let t = Instant::now();
    let err = AuditLog::open_with(&log, &keys, &opts).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(300), "it waited first");
    assert!(
        matches!(err, AuditError::WriterBusy { pid: Some(p), .. } if p == pid),
        "{err:?}"
    );
    let text = err.to_string();
    for needle in [
        log.display().to_string(),
        format!("pid {pid}"),
        "one writer".into(),
        "--audit-log <path>".into(),
        "--label <name>".into(),
    ] {
        assert!(text.contains(&needle), "{needle:?} not in {text}");
    }
    // open_for_run neither waits forever nor sets the held log aside.
    let err = audit::open_for_run_with(&log, &keys, &opts).unwrap_err();
    assert!(matches!(err, AuditError::WriterBusy { .. }), "{err}");
    assert_eq!(read_records(&log).unwrap().len(), 1);

    // The holder exits while we wait (a host's probe supervisor going away): admitted.
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(child.stdin.take());
        child.wait().unwrap()
    });
    let (mut log_w, recovery) = open_for_run(&log, &keys).unwrap();
    assert!(closer.join().unwrap().success());
    assert!(recovery.is_none());
    assert_eq!(
        log_w
            .append(audit::RUN_STARTED, "PARENT", None, json!({}))
            .unwrap()
            .seq,
        2
    );
    drop(log_w);
    assert_eq!(verify(&log, &keys).unwrap().records, 2);
}

/// "What it must show": kill -9 the writer in the middle of a burst; every record it had
/// flushed is in the log, `audit verify` passes on what was written (the log may be longer than
/// its anchor), and the next writer continues the chain without setting anything aside.
/// A writer copies records into space it reserved past them (NUL bytes until written): while
/// it holds the log the file is longer than its records and every reader stops at the NULs;
/// killed, it leaves them behind, and the next writer cuts them off and continues the chain;
/// closed, the file ends with its last record.
#[test]
fn space_a_killed_writer_reserved_is_cut_off_and_the_chain_continues() {
    let (_tmp, state, keys, log) = setup();
    let (mut child, mut out) = spawn_child("hold", &log, &state);
    next_line(&mut out, "ready ").unwrap();
    let bytes = std::fs::read(&log).unwrap();
    let data = data_len(&bytes);
    assert!(bytes.len() > data, "space is reserved past the record");
    assert_eq!(bytes[data - 1], b'\n');
    let report = verify(&log, &keys).unwrap();
    assert_eq!((report.records, report.torn_tail), (1, None));
    assert_eq!(read_records(&log).unwrap().len(), 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    child.wait().unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "left as it was");
    assert_eq!(verify(&log, &keys).unwrap().records, 1);

    let (mut w, recovery) = open_for_run(&log, &keys).unwrap();
    assert!(
        recovery.is_none(),
        "reserved space is not damage: {recovery:?}"
    );
    let next = w
        .append(audit::RUN_STARTED, "NEXT", None, json!({}))
        .unwrap();
    assert_eq!(next.seq, 2);
    w.flush().unwrap();
    let open = std::fs::read(&log).unwrap();
    assert_eq!(open[..data], bytes[..data], "the first record is kept");
    assert!(open.len() > data_len(&open), "reserved again");
    drop(w);
    let closed = std::fs::read(&log).unwrap();
    assert_eq!(
        data_len(&closed),
        closed.len(),
        "closed: ends with its last record"
    );
    assert_eq!(closed.iter().filter(|&&b| b == b'\n').count(), 2);
    let again = verify(&log, &keys).unwrap();
    assert_eq!((again.records, again.head_seq), (2, 2));
}

#[test]
fn kill_9_in_a_burst_loses_nothing_flushed_and_the_chain_continues() {
    let (_tmp, state, keys, log) = setup();
    let (mut child, mut out) = spawn_child("burst", &log, &state);
    let mut flushed = 0u64;
    for _ in 0..200 {
        flushed = next_line(&mut out, "flushed ").unwrap().parse().unwrap();
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    // Flushes it reported after the last one we read are on disk too; never fewer.
    let report = verify(&log, &keys).unwrap();
    assert!(
        report.head_seq >= flushed,
        "{} < {flushed}",
        report.head_seq
    );
    // (Not "a batch is whole or absent": the kill can stop a write at a page boundary, after
    // some of its lines.)
    let (mut w, recovery) = open_for_run(&log, &keys).unwrap();
    // The kill can cut the batch being written at a page boundary: an incomplete line after
    // the head, which `verify` names and the next open keeps aside with one record.
    let noted = match (&report.torn_tail, &recovery) {
        (None, None) => 0,
        (Some(t), Some(audit::Recovery::TornTailKept(k))) => {
            assert_eq!(
                (k.after_seq, k.offset, k.bytes),
                (report.head_seq, t.offset, t.bytes)
            );
            1
        }
        other => panic!("torn tail and recovery disagree: {other:?}"),
    };
    let next = w
        .append(audit::RUN_STARTED, "NEXT", None, json!({}))
        .unwrap();
    assert_eq!(next.seq, report.head_seq + 1 + noted);
    w.commit().unwrap();
    drop(w);
    let again = verify(&log, &keys).unwrap();
    assert_eq!(again.head_seq, report.head_seq + 1 + noted);
    assert_eq!(again.torn_tail, None);
    let anchor = keys.read_anchor(&log).unwrap().unwrap();
    assert_eq!(anchor.seq, again.head_seq, "commit anchors the head");
}

/// Where the data of a log file ends: before the NUL bytes of space its writer reserved (all
/// of it while a mapped writer has the file, or after one was killed).
fn data_len(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// The premise of the torn-tail recovery, on the real kernel: a `SIGKILL` that lands while a
/// large batch is being written (a `write` stopped at a page boundary) or copied into the
/// mapped reservation (the copy stopped anywhere, NUL bytes after it) leaves the log's data
/// ending in an incomplete line. `verify` passes and names it; the next open keeps the bytes
/// aside (byte for byte, without the NULs) and continues the chain from the last whole record.
#[test]
fn kill_9_inside_a_write_leaves_a_torn_tail_that_is_kept_and_continued() {
    kill_9_inside_a_batch("burst-big-write");
    kill_9_inside_a_batch("burst-big");
}

fn kill_9_inside_a_batch(role: &str) {
    use std::os::unix::fs::FileExt;
    let mut tries = 0;
    loop {
        tries += 1;
        let (_tmp, state, keys, log) = setup();
        let (mut child, mut out) = spawn_child(role, &log, &state);
        next_line(&mut out, "flushed").unwrap();
        // Kill as soon as a batch is being copied: the file ends mid-line (`write`), or the
        // first byte past the records is no longer a NUL of the reservation (map).
        let file = std::fs::File::open(&log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let from = data_len(&std::fs::read(&log).unwrap()) as u64;
        loop {
            let len = file.metadata().unwrap().len();
            let mut byte = [0u8];
            let copying = if role == "burst-big-write" {
                len > 0 && file.read_exact_at(&mut byte, len - 1).is_ok() && byte[0] != b'\n'
            } else {
                file.read_exact_at(&mut byte, from).is_ok() && byte[0] != 0
            };
            if copying {
                break;
            }
            assert!(Instant::now() < deadline, "the child never wrote");
            std::thread::yield_now();
        }
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        child.wait().unwrap();
        let report = verify(&log, &keys).unwrap();
        let Some(torn) = report.torn_tail.clone() else {
            // The write finished before the signal was delivered: try again.
            assert!(
                tries < 10,
                "{role}: no kill landed inside a batch in {tries} tries"
            );
            continue;
        };
        let bytes = std::fs::read(&log).unwrap();
        assert_eq!(torn.offset + torn.bytes, data_len(&bytes) as u64, "{role}");
        let bytes = bytes[..data_len(&bytes)].to_vec();
        assert_eq!(bytes[torn.offset as usize - 1], b'\n');
        let torn_bytes = bytes[torn.offset as usize..].to_vec();
        let (mut w, recovery) = open_for_run(&log, &keys).unwrap();
        let Some(audit::Recovery::TornTailKept(kept)) = recovery else {
            panic!("expected the torn tail kept, got {recovery:?}");
        };
        assert_eq!(std::fs::read(&kept.kept_as).unwrap(), torn_bytes);
        assert_eq!(kept.after_seq, report.head_seq);
        let next = w
            .append(audit::RUN_STARTED, "NEXT", None, json!({}))
            .unwrap();
        assert_eq!(next.seq, report.head_seq + 2, "after the torn-tail record");
        w.commit().unwrap();
        drop(w);
        let again = verify(&log, &keys).unwrap();
        assert_eq!(
            (again.head_seq, again.torn_tail),
            (report.head_seq + 2, None)
        );
        let after = std::fs::read(&log).unwrap();
        assert_eq!(
            after[..torn.offset as usize],
            bytes[..torn.offset as usize],
            "the whole records are kept byte for byte"
        );
        assert_eq!(
            data_len(&after),
            after.len(),
            "closed: no reserved space left"
        );
        return;
    }
}

/// A write that fails part way (the file size limit) is cut back: no partial line stays, the
/// batch's records are reported lost, and the chain continues from the last record on disk.
///
/// Both ways of writing: with `write` only, and with the mapped reservation on, where the file
/// size limit makes the first reservation fail and the writer falls back to `write` for good
/// (the same errors, no NUL byte in the file).
#[test]
fn a_failed_write_leaves_no_partial_line() {
    // A `SIGXFSZ` handler (instead of the default: terminate) makes the write fail with EFBIG
    // or come back short. The limit is per process: run in a child so other tests are not hit.
    let Ok(mode) = std::env::var("AUDIT_WRITER_FSIZE_CHILD") else {
        for mode in ["write", "map"] {
            let status = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "a_failed_write_leaves_no_partial_line",
                    "--test-threads=1",
                ])
                .env("AUDIT_WRITER_FSIZE_CHILD", mode)
                .status()
                .unwrap();
            assert!(status.success(), "{mode}");
        }
        return;
    };
    let mapped = mode == "map";
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGXFSZ, flag).unwrap();
    let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize);
    let (_tmp, _state, keys, log) = setup();
    let opts = AuditOptions {
        write_through_map: mapped,
        ..AuditOptions::default()
    };
    let mut w = AuditLog::open_with(&log, &keys, &opts).unwrap();
    if mapped {
        // Room for the records, not for a reservation.
        rustix::process::setrlimit(
            rustix::process::Resource::Fsize,
            rustix::process::Rlimit {
                current: Some(64 << 10),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
    for i in 0..3 {
        w.append(audit::TOOL_CALLED, "R", None, json!({"i": i}))
            .unwrap();
    }
    w.flush().unwrap();
    let len = std::fs::metadata(&log).unwrap().len();
    assert_eq!(
        data_len(&std::fs::read(&log).unwrap()),
        len as usize,
        "{mode}"
    );
    rustix::process::setrlimit(
        rustix::process::Resource::Fsize,
        rustix::process::Rlimit {
            current: Some(len + 100),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    for i in 3..8 {
        w.append(audit::TOOL_CALLED, "R", None, json!({"i": i}))
            .unwrap();
    }
    assert_eq!(w.head().unwrap().0, 8);
    let err = w.flush().unwrap_err();
    assert!(err.to_string().contains("append to audit log"), "{err}");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), len, "cut back");
    assert_eq!(w.head().unwrap().0, 3, "the lost batch is not the head");
    rustix::process::setrlimit(rustix::process::Resource::Fsize, limit).unwrap();
    assert_eq!(
        w.append(audit::TOOL_CALLED, "R", None, json!({"i": 3}))
            .unwrap()
            .seq,
        4
    );
    w.commit().unwrap();
    drop(w);
    assert_eq!(verify(&log, &keys).unwrap().records, 4);
}

/// `boundaries` (default) and `every` and `never` parse and print; nothing else parses.
#[test]
fn fsync_policy_spellings() {
    for (s, p) in [
        ("never", FsyncPolicy::Never),
        ("boundaries", FsyncPolicy::Boundaries),
        ("every", FsyncPolicy::Every),
    ] {
        assert_eq!(s.parse::<FsyncPolicy>().unwrap(), p);
        assert_eq!(p.to_string(), s);
    }
    assert_eq!(FsyncPolicy::default(), FsyncPolicy::Boundaries);
    let err = "always".parse::<FsyncPolicy>().unwrap_err();
    assert!(
        err.to_string().contains("never, boundaries, every"),
        "{err}"
    );
}

fn write_segmented(log: &Path, keys: &KeyStore, records: u64) -> Vec<PathBuf> {
    let opts = AuditOptions {
        max_segment_bytes: 2_000,
        fsync: FsyncPolicy::Every,
        ..AuditOptions::default()
    };
    let mut w = AuditLog::open_with(log, keys, &opts).unwrap();
    for i in 0..records {
        w.append(
            audit::TOOL_CALLED,
            "R",
            Some("E"),
            json!({"callId": i, "pad": "x".repeat(100)}),
        )
        .unwrap();
        if i % 3 == 0 {
            w.flush().unwrap();
        }
    }
    drop(w);
    audit::scan::list_segments(log)
        .unwrap()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// Rotation by size: several segments, each starting with a `segment_started` that names the
/// previous one; `verify` follows them (per-segment and total counts) and `show` reads them all;
/// a reopened writer continues in the active file.
#[test]
fn segments_rotate_and_verify_follows_them() {
    let (_tmp, state, keys, log) = setup();
    let segments = write_segmented(&log, &keys, 60);
    assert!(segments.len() >= 3, "{segments:?}");
    for s in &segments {
        assert!(
            std::fs::metadata(s).unwrap().len() <= 2_000,
            "{}",
            s.display()
        );
    }
    let report = verify(&log, &keys).unwrap();
    assert_eq!(report.segments.len(), segments.len() + 1);
    let starts = report.segments.len() as u64 - 1;
    assert_eq!(report.records, 60 + starts);
    assert_eq!(
        report.segments.iter().map(|s| s.records).sum::<u64>(),
        report.records
    );
    // Seqs run on across files.
    let mut next = 1;
    for s in &report.segments {
        let (a, b) = s.seqs.unwrap();
        assert_eq!(a, next, "{}", s.path.display());
        next = b + 1;
    }
    let records = read_records(&log).unwrap();
    assert_eq!(records.len() as u64, report.records);
    let second_first: &Record = &records[report.segments[0].records as usize];
    assert_eq!(second_first.record_type, audit::SEGMENT_STARTED);
    assert_eq!(
        second_first.data["previousSegment"],
        json!(segments[0].file_name().unwrap().to_string_lossy())
    );
    let journals = audit::Journals::from_log(&log, &keys).unwrap();
    assert!(!journals.render_human(audit::JournalView::Both).is_empty());
    // The CLI reports every file, oldest first, and the total.
    let out = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"))
        .args(["mcp-dev", "audit", "verify", "--json"])
        .arg(&log)
        .env("CARGO_MCP_DEV_HOME", &state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], json!(report.records));
    assert_eq!(v["segments"].as_array().unwrap().len(), segments.len() + 1);
    assert_eq!(v["segments"][0]["firstSeq"], json!(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("in {} files", segments.len() + 1)),
        "{stderr}"
    );
    // Start reads only the tail, and continues.
    let (mut w, rec) = open_for_run(&log, &keys).unwrap();
    assert!(rec.is_none());
    assert_eq!(
        w.append(audit::RUN_ENDED, "R", None, json!({}))
            .unwrap()
            .seq,
        report.head_seq + 1
    );
}

/// Tampering with a middle segment, deleting one, or reordering two are each reported with the
/// segment's name.
#[test]
fn segment_tampering_deletion_and_reordering_are_detected() {
    let (tmp, _state, keys, log) = setup();
    let segments = write_segmented(&log, &keys, 60);
    assert!(segments.len() >= 3);
    let backup = tmp.path().join("backup");
    std::fs::create_dir(&backup).unwrap();
    let restore = || {
        for s in &segments {
            std::fs::copy(backup.join(s.file_name().unwrap()), s).unwrap();
        }
    };
    for s in &segments {
        std::fs::copy(s, backup.join(s.file_name().unwrap())).unwrap();
    }
    let middle = &segments[1];
    let name = middle.file_name().unwrap().to_string_lossy().into_owned();

    // A changed byte in a middle segment.
    let text = std::fs::read_to_string(middle).unwrap();
    std::fs::write(middle, text.replacen("\"callId\":", "\"callId\":1", 1)).unwrap();
    let f = verify(&log, &keys).unwrap_err();
    assert!(f.reason.contains(&format!("in segment {name}")), "{f}");
    assert!(f.reason.contains("hash mismatch"), "{f}");
    restore();
    verify(&log, &keys).unwrap();

    // NUL bytes after a segment's records: a segment is cut back to its records before it is
    // renamed, so they were put there later.
    for s in &segments {
        assert!(!std::fs::read(s).unwrap().contains(&0), "{}", s.display());
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(middle)
        .unwrap()
        .write_all(&[0u8; 64])
        .unwrap();
    let f = verify(&log, &keys).unwrap_err();
    assert!(
        f.reason
            .contains(&format!("segment {name} ends in NUL bytes")),
        "{f}"
    );
    restore();
    verify(&log, &keys).unwrap();

    // A deleted middle segment.
    std::fs::remove_file(middle).unwrap();
    let f = verify(&log, &keys).unwrap_err();
    assert!(
        f.reason.contains("out of sequence") && f.reason.contains("deleted or reordered"),
        "{f}"
    );
    restore();

    // Two segments swapped (renamed into each other's place).
    let tmpname = tmp.path().join("swap");
    std::fs::rename(&segments[0], &tmpname).unwrap();
    std::fs::rename(&segments[1], &segments[0]).unwrap();
    std::fs::rename(&tmpname, &segments[1]).unwrap();
    let f = verify(&log, &keys).unwrap_err();
    assert!(
        f.reason.contains("missing") || f.reason.contains("reordered"),
        "{f}"
    );
    restore();

    // The oldest segment deleted: the chain no longer starts at seq 1.
    std::fs::remove_file(&segments[0]).unwrap();
    let f = verify(&log, &keys).unwrap_err();
    assert!(f.reason.contains("which is missing"), "{f}");
    restore();
    verify(&log, &keys).unwrap();
}

/// A crash between renaming the active file to a segment and writing the new file's first
/// record: the next writer continues from that segment.
#[test]
fn a_crash_inside_a_rotation_is_continued() {
    let (_tmp, _state, keys, log) = setup();
    let segments = write_segmented(&log, &keys, 30);
    let head = verify(&log, &keys).unwrap();
    // Simulate: the newest file is "renamed" to the next segment, no new active file yet, and
    // the anchor still names its last record (as it does right after the rename).
    let next = audit::scan::segment_path(&log, segments.len() as u64 + 1);
    std::fs::rename(&log, &next).unwrap();
    let (mut w, rec) = open_for_run(&log, &keys).unwrap();
    assert!(rec.is_none(), "{rec:?}");
    assert_eq!(
        w.append(audit::RUN_ENDED, "R", None, json!({}))
            .unwrap()
            .seq,
        head.head_seq + 2,
        "after the new segment_started"
    );
    drop(w);
    verify(&log, &keys).unwrap();
}

/// `audit verify` and `audit show` on a log a writer is appending to (a running session): they
/// read up to the end of the records as they find them, never into the reservation a copy is
/// filling (red-team finding, session 16: a read that went on joined the NULs it saw to records
/// copied in after, and reported a healthy log as damaged). Both ways of writing.
#[test]
fn readers_of_a_live_log_see_only_whole_records() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    for map in [true, false] {
        let (_tmp, _state, keys, log) = setup();
        let opts = AuditOptions {
            write_through_map: map,
            fsync: FsyncPolicy::Never,
            max_segment_bytes: 0,
            ..AuditOptions::default()
        };
        let mut w = AuditLog::open_with(&log, &keys, &opts).unwrap();
        w.append(audit::RUN_STARTED, "R", None, json!({})).unwrap();
        w.flush().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let pad = "x".repeat(200);
                let mut batches = 0u64;
                while !stop.load(Ordering::Relaxed) && batches < 4000 {
                    if batches.is_multiple_of(4) {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    for i in 0..8 {
                        w.append(
                            audit::TOOL_CALLED,
                            "R",
                            Some("E"),
                            json!({"callId": batches * 8 + i, "pad": pad}),
                        )
                        .unwrap();
                    }
                    w.flush().unwrap();
                    batches += 1;
                }
                batches
            })
        };
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut rounds = 0;
        let mut failures = Vec::new();
        while Instant::now() < deadline && !writer.is_finished() {
            rounds += 1;
            if let Err(e) = verify(&log, &keys) {
                failures.push(format!("verify: {e}"));
            }
            if let Err(e) = read_records(&log) {
                failures.push(format!("read_records: {e}"));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let batches = writer.join().unwrap();
        assert!(
            rounds >= 3 && batches > 10,
            "map={map}: {rounds} rounds, {batches} batches"
        );
        assert!(
            failures.is_empty(),
            "map={map}: {} of {rounds} rounds failed, e.g. {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
        assert_eq!(verify(&log, &keys).unwrap().records, 1 + batches * 8);
    }
}

/// A reservation whose map is refused after `fallocate` grew the file (here the address-space
/// limit, as under `ulimit -v`; also `vm.max_map_count`, a file system that cannot map), or
/// whose `fallocate` failed part way (ENOSPC): the file is cut back to its records before the
/// writer falls back to `write`, so no NUL byte stays inside the log and the space is free
/// (red-team finding, session 16: the `write` landed after 1 MiB of NULs).
#[test]
fn a_reservation_that_cannot_be_mapped_leaves_no_nul_in_the_log() {
    let Ok(dir) = std::env::var("AUDIT_WRITER_AS_CHILD") else {
        let tmp = tempfile::tempdir().unwrap();
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_reservation_that_cannot_be_mapped_leaves_no_nul_in_the_log",
                "--test-threads=1",
            ])
            .env("AUDIT_WRITER_AS_CHILD", tmp.path())
            .status()
            .unwrap();
        assert!(status.success());
        return;
    };
    let dir = PathBuf::from(dir);
    let keys = KeyStore::at(dir.join("state"));
    let log = dir.join("srv.jsonl");
    let mut w = AuditLog::open(&log, &keys).unwrap();
    w.append(audit::RUN_STARTED, "R", None, json!({})).unwrap();
    // Address space for what is mapped now and 256 KiB more: less than a reservation.
    let vm_kb: u64 = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let limit = rustix::process::getrlimit(rustix::process::Resource::As);
    rustix::process::setrlimit(
        rustix::process::Resource::As,
        rustix::process::Rlimit {
            current: Some((vm_kb + 256) * 1024),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    let flushed = w.flush();
    rustix::process::setrlimit(rustix::process::Resource::As, limit).unwrap();
    flushed.unwrap();
    let bytes = std::fs::read(&log).unwrap();
    assert!(!bytes.contains(&0), "{} bytes, NULs inside", bytes.len());
    w.append(audit::TOOL_CALLED, "R", None, json!({"i": 2}))
        .unwrap();
    w.flush().unwrap();
    drop(w);
    let bytes = std::fs::read(&log).unwrap();
    assert!(!bytes.contains(&0) && bytes.ends_with(b"\n"));
    assert_eq!(verify(&log, &keys).unwrap().records, 2);
    let (_, recovery) = open_for_run(&log, &keys).unwrap();
    assert!(recovery.is_none(), "{recovery:?}");
}

/// `audit tail`: the last records of a live log (which ends in the reserved NUL bytes `tail -f`
/// cannot see past), then, with `--follow`, every record as it is written, across rotations,
/// each once and in order; damage stops it with the verification exit code; text from the log
/// reaches the terminal escaped; a missing log and a bad count are clear errors.
#[test]
fn tail_prints_the_last_records_and_follows_a_live_log_across_rotations() {
    let (_tmp, state, keys, log) = setup();
    let tail = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cargo-mcp-dev"));
        c.args(["mcp-dev", "audit", "tail"])
            .args(args)
            .arg(&log)
            .env("CARGO_MCP_DEV_HOME", &state);
        c
    };
    let seq_of = |line: &str| -> u64 {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        v["seq"].as_u64().unwrap()
    };
    // Missing log: an error naming it (with `--follow` it would be waited for).
    let out = tail(&["-n", "3"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no audit log at"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tail(&["-n", "three"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a bad count is a usage error");
    let follow = |mut c: Command| {
        let mut child = c
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
        (child, rx)
    };
    let take_until = |rx: &std::sync::mpsc::Receiver<String>, last: u64, seen: &mut Vec<u64>| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while seen.last() != Some(&last) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).expect("a record within 20 s");
            seen.push(seq_of(&line));
        }
    };
    // Started before `run` wrote anything (no log, no key yet): it waits, then follows.
    let (mut early, early_rx) = follow(tail(&["--follow", "--json", "-n", "0"]));
    std::thread::sleep(Duration::from_millis(300));
    assert!(early.try_wait().unwrap().is_none(), "it waits for the log");

    let opts = AuditOptions {
        max_segment_bytes: 3_000,
        ..AuditOptions::default()
    };
    let mut w = AuditLog::open_with(&log, &keys, &opts).unwrap();
    for n in 0..5 {
        w.append(
            "tool_called",
            "R",
            Some("E1"),
            json!({"n": n, "tool": "evil\u{9b}2J\u{202E}txt"}),
        )
        .unwrap();
    }
    w.flush().unwrap();
    assert!(
        std::fs::read(&log).unwrap().ends_with(&[0]),
        "a live, mapped log"
    );

    let out = tail(&["-n", "3", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let seqs: Vec<u64> = text.lines().map(seq_of).collect();
    assert_eq!(seqs, [3, 4, 5]);
    let out = tail(&["-n", "2"]).output().unwrap();
    let human = String::from_utf8(out.stdout).unwrap();
    assert_eq!(human.lines().count(), 2, "{human}");
    assert!(human.contains("#5  tool_called  E1"), "{human}");
    assert!(
        !human.contains('\u{9b}'),
        "a C1 control reached the terminal: {human:?}"
    );
    assert!(human.contains("\\u{9b}2J<U+202E>txt"), "{human}");
    // `--json`: the same JSON value, with what a terminal would act on escaped.
    let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(v["data"]["tool"], "evil\u{9b}2J\u{202E}txt");
    assert!(text.contains("evil\\u009b2J\\u202etxt"), "{text}");

    // Following: the five, then every record written from now on, across rotations.
    let (mut follower, rx) = follow(tail(&["--follow", "--json"]));
    let mut seen = Vec::new();
    take_until(&rx, 5, &mut seen);
    for n in 5..40 {
        w.append(
            "tool_result",
            "R",
            Some("E1"),
            json!({"n": n, "pad": "p".repeat(80)}),
        )
        .unwrap();
        w.flush().unwrap();
        if n % 9 == 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    let head = w.append("run_ended", "R", None, json!({})).unwrap().seq;
    w.flush().unwrap();
    take_until(&rx, head, &mut seen);
    let expected: Vec<u64> = (1..=head).collect();
    assert_eq!(seen, expected, "each record once, in order");
    let mut early_seen = Vec::new();
    take_until(&early_rx, head, &mut early_seen);
    assert_eq!(
        early_seen, expected,
        "the follower that waited saw them all"
    );
    assert!(
        audit::scan::list_segments(&log).unwrap().len() >= 2,
        "the follow crossed rotations"
    );

    // Damage after the records: the follower stops with the verification exit code.
    drop(w);
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(b"{\"v\":1,\"seq\":999}\n").unwrap();
    for child in [&mut follower, &mut early] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the follower did not stop at a damaged record");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(105), "{err}");
        assert!(err.contains("failed verification"), "{err}");
    }
}
