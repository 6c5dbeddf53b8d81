//! The output of the writer: the active file, written through a mapped reservation or with
//! `write`, its length checks (cut short, removed), its fsync, and the one function that opens
//! the active file (`open_active`). Owns the file-side state of [`AuditLog`] (`file`, `len`,
//! `mapped`, `reserved_to`, `map_batches`, `synced_len`, `length_checked`) and what is done when
//! the file was cut short under the writer (`AuditLog::cut_short`: fail closed). Must not touch:
//! record content, the chain (lines arrive sealed), rotation and restore decisions (it reports
//! [`FileState`]; [`super::writer`] decides).
//!
//! # Writing through a map
//!
//! On Linux a batch is not `write`-n: the writer reserves space past its last record
//! ([`RESERVE_BYTES`] at a time, or a batch's worth, allocated with `fallocate` so that no copy
//! can fail for want of space), maps it ([`crate::sys::mapped`]) and copies the batch in. No
//! system call and no file-time update per batch: on a call's path that was most of what a
//! spaced call paid for the log (issue 15). The file is longer than its records while the
//! writer has it; the rest reads as NUL bytes, which readers ([`super::scan`]) stop at, and which
//! [`AuditLog::release_reservation`] (exit, rotation, drop) cuts off. The next reservation is
//! made ahead, when a quarter of the space is left, by [`AuditLog::reserve_ahead`], which `run`
//! calls when no call is waiting (otherwise the flush that crosses the end would pay for it);
//! it also hands out the next [`PREPARE_BYTES`] of pages to make writable (a copy into a page
//! not yet written faults while the file system readies it). A writer that was killed
//! leaves them behind: `open` judges the records without them (a record never holds a NUL
//! byte) and cuts them off only once the records pass (a log that is set aside keeps every
//! byte). Readers read up to the end of the records as they find it, never into the space a
//! copy is filling. Where the space cannot be reserved or mapped (no `fallocate` on the file
//! system, no space, a file size or address-space limit, not Linux) the writer cuts the file
//! back to its records (a failed attempt can have grown it) and `write`s from then on.
//!

use super::AuditError;
use super::keys;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

/// A flush through the map compares the file's length with the end of the records it is about
/// to copy (one `fstat`) when the last comparison is older than this: every flush at a host's
/// pace, about one in forty back to back. A file cut at or past the records' end (its
/// reservation's NUL bytes trimmed) neither faults nor loses a newline, so this is what finds
/// it before the next call is forwarded (see `docs/SECURITY.md`).
pub const LENGTH_CHECK_EVERY: Duration = Duration::from_millis(1);

/// How much space past the records a writer reserves and maps at a time (at least a batch):
/// about 2,500 calls' records, and no more than that much of the file in this process's memory.
pub const RESERVE_BYTES: u64 = 1 << 20;

/// How far past the records [`AuditLog::reserve_ahead`] keeps the mapped pages writable: 32 KiB,
/// the records of about thirty calls.
pub const PREPARE_BYTES: u64 = 32 << 10;

/// What one `fstat` says of the active file against the records (see `AuditLog::file_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileState {
    Linked,
    Shorter,
    Removed,
}

/// Opens the active file for appending (`create_new`: a fresh file after a rotation).
pub(super) fn open_active(path: &Path, create_new: bool) -> Result<File, AuditError> {
    let create = if create_new {
        crate::beneath::Create::New(0o600)
    } else {
        crate::beneath::Create::IfMissing(0o600)
    };
    let file = crate::fsutil::open_nofollow(path, crate::beneath::Access::ReadAppend, create)
        .map_err(|e| {
            if keys::is_eloop(&e) {
                AuditError::Symlink {
                    path: path.to_owned(),
                }
            } else if crate::beneath::is_not_regular(&e) {
                AuditError::NotRegularFile {
                    path: path.to_owned(),
                }
            } else {
                AuditError::io("open audit log", path)(e)
            }
        })?;
    let meta = file
        .metadata()
        .map_err(AuditError::io("inspect audit log", path))?;
    if !meta.file_type().is_file() {
        return Err(AuditError::NotRegularFile {
            path: path.to_owned(),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;
    use crate::sys::mapped::{self, PreparePages};

    /// Someone cuts the log while the writer has it mapped (`: > log`, a rotator's
    /// `copytruncate`): the next copy past the cut would fault with `SIGBUS` and end the
    /// process. It fails closed instead, with the cause, and stays failed; the file is left as
    /// it was cut (not grown back over the cut); the next open refuses the shortened log.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_log_cut_under_the_writer_fails_closed_instead_of_crashing() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("x", "R", None, json!({"n": n})).unwrap();
            log.commit().unwrap();
        }
        assert!(log.mapped.is_some(), "batches go through the map");
        cut_file(&path, 0);
        log.append("x", "R", None, json!({"n": 3})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("cut short by another process"), "{text}");
        assert!(text.contains("sets it aside"), "{text}");
        // Stays failed: no later record is written onto what is left.
        log.append("x", "R", None, json!({"n": 4})).unwrap_err();
        log.commit().unwrap_err();
        drop(log);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "the file is left as it was cut"
        );
        let reopened = AuditLog::open(&path, &keys).unwrap_err();
        assert!(
            reopened
                .to_string()
                .contains("its anchor records head seq 3"),
            "{reopened}"
        );
    }

    /// The anchor lags flushes (`ANCHOR_LAG`): a cut that spares the anchored record but takes
    /// the records after it must not let the next start continue the chain from that record
    /// (the loss would be hidden). The writer that finds the cut anchors its last record, so
    /// the next start finds the log shorter than its anchor.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_cut_that_spares_the_lagging_anchor_is_still_found_at_the_next_start() {
        let (_tmp, keys, path) = setup();
        let page = mapped::page_size();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        let seq_of_anchor = || keys.read_anchor(&path).unwrap().map(|a| a.seq);
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        let anchored_end = log.len;
        let mut n = 1;
        while log.len < anchored_end + 2 * page {
            log.append("x", "R", None, json!({"n": n, "pad": "p".repeat(200)}))
                .unwrap();
            log.flush().unwrap();
            n += 1;
        }
        assert_eq!(
            seq_of_anchor(),
            Some(1),
            "within ANCHOR_LAG the anchor lags"
        );
        cut_file(&path, anchored_end);
        log.append("x", "R", None, json!({"n": n})).unwrap();
        log.flush().unwrap_err();
        assert_eq!(
            seq_of_anchor(),
            Some(n),
            "the last record written is anchored"
        );
        drop(log);
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    /// Cut inside the page being written, below the records' end (red-team, session 19): no
    /// store faults there (the page is still part of the file), but the kernel zeroed the
    /// rest of it, so the last record's newline is gone: the next flush finds that and fails
    /// closed instead of acknowledging records copied past the end of the file.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_cut_inside_the_page_being_written_is_found_by_the_next_flush() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("x", "R", None, json!({"n": n})).unwrap();
            log.flush().unwrap();
        }
        assert!(
            log.len % mapped::page_size() > 10,
            "the records end inside a page"
        );
        let cut = log.len - 10;
        cut_file(&path, cut);
        log.append("x", "R", None, json!({"n": 3})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
        drop(log);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), cut, "left as cut");
    }

    /// Cut exactly at the records' end (the reservation's NUL bytes trimmed off a live log;
    /// red-team, session 19): no store faults and the last newline stays, so the length is
    /// compared before the copy (at most every `LENGTH_CHECK_EVERY`; at a host's pace every
    /// flush) and after every fsync: no record is acknowledged that is not in the file.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_cut_at_the_records_end_is_found_before_a_record_is_acknowledged() {
        // At a host's pace.
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        cut_file(&path, log.len);
        std::thread::sleep(LENGTH_CHECK_EVERY);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
        // Back to back under `audit-fsync = every`: the sync finds it, whatever the timing.
        let (_tmp, keys, path) = setup();
        let opts = AuditOptions {
            fsync: FsyncPolicy::Every,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.flush().unwrap();
        cut_file(&path, log.len + 5);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
        assert!(
            log.append("x", "R", None, json!({"n": 2})).is_err(),
            "poisoned"
        );
    }

    /// Cut while nothing was being copied, then closed (or rotated): the close used to cut
    /// the file "back" to the records' length, growing it over the cut with NUL bytes and
    /// burying it. Now it finds the cut (the file is shorter than the records) and leaves the
    /// file alone; a rotation due at that point fails closed instead of renaming the cut file
    /// into a segment.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn closing_or_rotating_a_cut_log_does_not_grow_it_back() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("x", "R", None, json!({"n": n})).unwrap();
            log.commit().unwrap();
        }
        cut_file(&path, 0);
        drop(log);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "close grew it back"
        );

        let (_tmp, keys, path) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 0,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        for n in 0..3 {
            log.append("x", "R", None, json!({"n": n})).unwrap();
            log.commit().unwrap();
        }
        log.opts.max_segment_bytes = log.len + 10;
        cut_file(&path, 0);
        let err = log
            .append("x", "R", None, json!({"n": 3, "pad": "p".repeat(100)}))
            .unwrap_err();
        assert!(err.to_string().contains("cut short"), "{err}");
        assert!(
            scan::list_segments(&path).unwrap().is_empty(),
            "the cut file was not rotated into a segment"
        );
        drop(log);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    /// Grown past the writer's reservation by someone else: not the writer's to cut at close
    /// (the next open judges what is there).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn bytes_past_the_reservation_are_not_cut_at_close() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        let reserved = log.reserved_to.unwrap();
        let grown = reserved + 100;
        cut_file(&path, grown);
        drop(log);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), grown);
    }

    /// Cut between two copies, to above the records' end: the copies still land (the records
    /// are whole), but the next reservation would grow the file back over the cut: refused.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_log_cut_between_copies_is_not_grown_back_by_the_next_reservation() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.flush().unwrap();
        let records = log.len;
        cut_file(&path, records / 2);
        // The cut is inside the first page, which is still mapped: no copy faults there; the
        // next reservation is what finds the cut.
        let err = log.reserve(log.len + RESERVE_BYTES).unwrap_err().unwrap();
        assert!(err.to_string().contains("cut short"), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), records / 2);
        let err = log.append("x", "R", None, json!({"n": 1})).unwrap_err();
        assert!(err.to_string().contains("cut short"), "poisoned: {err}");
    }

    /// Batches are copied into space reserved past the records: the file is longer than its
    /// records while the writer has it, and ends with its last record once closed. With
    /// `write_through_map` off, or after a rotation, it never holds a NUL byte.
    #[test]
    fn the_next_reservation_can_be_made_ahead_of_the_flush_that_needs_it() {
        let (_tmp, keys, path) = setup();
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.flush().unwrap();
        // Most of the reservation is left: nothing to reserve ahead, the next pages are
        // prepared.
        let prepared = |log: &AuditLog| log.mapped.as_ref().unwrap().prepared_to();
        assert!(
            log.reserve_ahead(false).unwrap().is_none(),
            "not asked to prepare"
        );
        assert_eq!(prepared(&log), 0);
        assert!(
            log.reserve_ahead(true)
                .unwrap()
                .is_some_and(PreparePages::apply)
        );
        assert_eq!(size(&path), RESERVE_BYTES);
        assert_eq!(
            prepared(&log),
            (log.len + PREPARE_BYTES).next_multiple_of(mapped::page_size())
        );
        let fill = "f".repeat((RESERVE_BYTES * 4 / 5) as usize);
        log.append("x", "R", None, json!({"fill": fill})).unwrap();
        log.flush().unwrap();
        assert_eq!(size(&path), RESERVE_BYTES, "still in the first reservation");
        // A record waiting to be written: it is the flush's to place, not reserved around.
        log.append("x", "R", None, json!({"n": 3})).unwrap();
        let before = prepared(&log);
        assert!(log.reserve_ahead(true).unwrap().is_none());
        assert_eq!(size(&path), RESERVE_BYTES);
        assert_eq!(
            prepared(&log),
            before,
            "nothing prepared while a record waits"
        );
        log.flush().unwrap();
        // Nothing pending and less than a quarter left: the next region is reserved now.
        log.reserve_ahead(true).unwrap();
        let ahead = size(&path);
        let page = mapped::page_size();
        assert!(
            ahead >= log.len + RESERVE_BYTES - page,
            "{ahead} for {}",
            log.len
        );
        // The flush that would have crossed the old end finds the space ready.
        let more = "m".repeat((RESERVE_BYTES / 4) as usize);
        log.append("x", "R", None, json!({"more": more})).unwrap();
        log.flush().unwrap();
        assert_eq!(size(&path), ahead);
        assert_eq!(lines(&path).len(), 4);
        drop(log);
        assert_eq!(size(&path), std::fs::read(&path).unwrap().len() as u64);
        assert!(!std::fs::read(&path).unwrap().contains(&0));
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().records, 4);

        // Written, not mapped: nothing is reserved, ahead or not.
        let opts = AuditOptions {
            write_through_map: false,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        log.append("x", "R", None, json!({"n": 5})).unwrap();
        log.flush().unwrap();
        log.reserve_ahead(true).unwrap();
        assert_eq!(size(&path), log.len);
    }

    #[test]
    fn batches_go_into_reserved_space_that_is_given_back_at_close() {
        let (_tmp, keys, path) = setup();
        let nuls = |p: &Path| {
            std::fs::read(p)
                .unwrap()
                .iter()
                .filter(|&&b| b == 0)
                .count()
        };
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.flush().unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, RESERVE_BYTES);
        assert_eq!(nuls(&path) as u64, len - log.len);
        // A batch larger than what is left: reserved again from the page of the records' end.
        let big = "b".repeat(RESERVE_BYTES as usize);
        log.append("x", "R", None, json!({"big": big})).unwrap();
        log.flush().unwrap();
        let page = mapped::page_size();
        let grown = std::fs::metadata(&path).unwrap().len();
        assert!(
            grown >= log.len && grown <= log.len + RESERVE_BYTES + page,
            "{grown}"
        );
        assert_eq!(lines(&path).len(), 2);
        drop(log);
        assert_eq!(nuls(&path), 0);
        assert_eq!(lines(&path).len(), 2);
        let report = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(report.records, 2);

        let opts = AuditOptions {
            write_through_map: false,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        log.append("x", "R", None, json!({"n": 3})).unwrap();
        log.flush().unwrap();
        assert_eq!(nuls(&path), 0, "written, not mapped");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), log.len);
    }

    /// What a killed writer leaves: its records, maybe a record cut short by the kill, then
    /// the NUL bytes of its reservation. The records are judged without the NULs, and the NULs
    /// are cut off only once the records pass: a cut-short record before them is a torn tail
    /// (kept aside by recovery, NULs and all), and a log that does not pass keeps every byte
    /// (red-team finding, session 16: open cut first, then judged what was left).
    #[test]
    fn reserved_space_left_behind_is_cut_once_the_records_pass() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({})).unwrap();
        drop(log);
        let whole = std::fs::metadata(&path).unwrap().len();
        let append = |bytes: &[u8]| {
            std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap()
                .write_all(bytes)
                .unwrap()
        };
        let file_len = || std::fs::metadata(&path).unwrap().len();
        append(&[0u8; 5000]);
        let log = AuditLog::open(&path, &keys).unwrap();
        assert_eq!(log.len, whole);
        assert_eq!(file_len(), whole, "cut once the records passed");
        drop(log);
        assert_eq!(file_len(), whole);

        append(b"{\"v\":1,\"se");
        append(&[0u8; 5000]);
        match AuditLog::open(&path, &keys).unwrap_err() {
            AuditError::TornTail {
                after_seq,
                offset,
                len,
                ..
            } => assert_eq!((after_seq, offset, len), (1, whole, 10)),
            other => panic!("expected a torn tail, got {other:?}"),
        }
        assert_eq!(file_len(), whole + 5010, "nothing cut by a refused open");
        let (log, recovery) = crate::audit::open_for_run(&path, &keys).unwrap();
        match recovery {
            Some(crate::audit::Recovery::TornTailKept(k)) => {
                assert_eq!((k.offset, k.bytes), (whole, 10));
                assert_eq!(std::fs::read(&k.kept_as).unwrap(), b"{\"v\":1,\"se");
            }
            other => panic!("expected the torn tail kept, got {other:?}"),
        }
        drop(log);
        assert!(!std::fs::read(&path).unwrap().contains(&0));

        // A NUL inside the (anchored) records is damage, not reserved space, and the file is
        // left as it was (the NULs after it included).
        let mut bytes = std::fs::read(&path).unwrap();
        let in_last_record = bytes.len() - 10;
        bytes[in_last_record] = 0;
        bytes.extend_from_slice(&[0u8; 100]);
        std::fs::write(&path, &bytes).unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
    }
}
