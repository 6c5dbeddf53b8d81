//! Putting back an active file removed while the writer had it open (`cargo clean`, `rm`): the
//! records are copied from the open descriptor to a new file at the path, under the writer lock
//! (taken again where it went too), and a sealed `log_restored` record continues the chain; what
//! cannot be put back is kept beside the anchor and the writer fails closed. Owns the restore
//! and the copy of the records. Must not touch: the records' content (copied byte for byte),
//! the anchor's content.

use super::AuditError;
use super::lock::{WriterLock, beside, lock_file_in};
use super::sink::open_active;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The status line after a put-back (the writer hands it out once, see `AuditLog::take_notice`).
pub(super) const RESTORED_REASON: &str = "the active file was removed while this run was writing it (cargo clean?); put back from the writer's open file";

/// The removed file, as the writer still has it open.
pub(super) struct Removed<'a> {
    /// Where it was (and is put back).
    pub path: &'a Path,
    /// The log's canonical path as the writer lock resolved it (the directories made again
    /// must resolve there too).
    pub canonical: &'a Path,
    /// The writer's open descriptor of the removed file, and the length of its records.
    pub records: &'a File,
    pub len: u64,
}

/// A removed file put back: its new descriptor, and `<log>.lock` taken again when it went too
/// (the writer keeps it in its [`WriterLock`]).
pub(super) struct PutBack {
    pub file: File,
    pub lock_file: Option<File>,
}

impl Removed<'_> {
    /// The active file was removed while this writer had it open (`cargo clean` takes the
    /// whole target directory): every record would go on into a file nobody can read, and
    /// the calls they record would be forwarded all the same. The file is put back at its
    /// path from the open descriptor (this writer's records are the whole file, read back
    /// with `pread`), under the writer lock (taken again where it went too) and synced; the
    /// writer then seals a [`super::record_type::LOG_RESTORED`] record: the chain and the
    /// anchor go on unchanged. Segments already rotated out were closed files and are gone
    /// with the directory; `audit verify` reports the first one missing.
    /// What cannot be done is an error (the writer fails closed): a file or another writer
    /// already at the path (never overwritten), a directory that cannot be made, a link.
    /// The files are reached from the log's directory the lock holds: once made again, that
    /// directory is opened again below the root it came from (or by its path, the caller's).
    pub(super) fn put_back(&self, lock: &WriterLock) -> Result<PutBack, AuditError> {
        if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::base::beneath::followed::create_dir_all_with_mode(parent, 0o700)
                .map_err(AuditError::io("create directory", parent))?;
            // The directories made again must be where they were: a link planted in their
            // place (by whoever can write the target directory) is not followed.
            let now = crate::base::beneath::followed::canonicalize(parent)
                .map_err(AuditError::io("resolve the path of", parent))?;
            // The path, not its lossy text: a directory name that is not UTF-8 must
            // match itself (red-team, session 22).
            if Some(now.as_path()) != self.canonical.parent() {
                return Err(AuditError::io("put back the removed audit log", self.path)(
                    std::io::Error::other(format!(
                        "its directory now resolves to {} (a link?)",
                        now.display()
                    )),
                ));
            }
        }
        // `<log>.lock` went with the directory: taken again. A writer sharing this one's
        // guard never takes it (the guard comes first), so whoever holds it reached the
        // log another way (another state directory, a bind mount): a second writer, and
        // the file is not put back under it.
        let dir = lock.dir();
        let lock_file = if lock.still_linked(self.path) {
            None
        } else {
            Some(lock_file_in(
                dir,
                self.path,
                Duration::ZERO,
                Instant::now(),
            )?)
        };
        let file = open_active(dir, self.path, true)?;
        let copy = |file: &File| -> std::io::Result<()> {
            self.copy_records_to(file)?;
            dir.sync()
        };
        if let Err(e) = copy(&file) {
            // Not left half-copied at the path: the next start would take it for a log.
            let _ = dir.remove_file(&beside(self.path));
            return Err(AuditError::io("put back the removed audit log", self.path)(
                e,
            ));
        }
        Ok(PutBack { file, lock_file })
    }

    /// Copies the records of a removed log that cannot be put back to a new file beside its
    /// anchor (`anchor_path`): `<anchor name>.removed-<pid>-<ms>.jsonl` (never an existing
    /// file). One-shot by path: the last thing a failing writer does, once.
    pub(super) fn keep_beside(&self, anchor_path: &Path) -> std::io::Result<PathBuf> {
        let ms = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let mut name = anchor_path.file_stem().unwrap_or_default().to_os_string();
        name.push(format!(".removed-{}-{ms}.jsonl", std::process::id()));
        let at = anchor_path.with_file_name(name);
        let out = crate::base::fsutil::open_nofollow(
            &at,
            crate::base::beneath::Access::ReadWrite,
            crate::base::beneath::Create::New(0o600),
        )?;
        self.copy_records_to(&out)?;
        Ok(at)
    }

    /// Writes the writer's records (the first `len` bytes of its open file, read with
    /// `pread`) to `out` and syncs it.
    fn copy_records_to(&self, out: &File) -> std::io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        let mut at = 0;
        while at < self.len {
            let want = buf.len().min((self.len - at) as usize);
            let n = self.records.read_at(&mut buf[..want], at)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            (&*out).write_all(&buf[..n])?;
            at += n as u64;
        }
        out.sync_all()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;

    /// `cargo clean` while `run` writes: the whole directory goes, log and lock. The next
    /// flush puts the file back from the open descriptor (map and `write` alike), the chain
    /// and the anchor go on, a sealed `log_restored` record says so, and the lock is taken
    /// again (a second writer is still refused).
    #[test]
    fn a_log_removed_while_written_is_put_back_and_the_chain_continues() {
        for through_map in [true, false] {
            let (tmp, keys, path) = setup();
            let opts = AuditOptions {
                write_through_map: through_map,
                ..AuditOptions::default()
            };
            let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
            for n in 0..3 {
                log.append("x", "R", Some("E"), json!({"n": n})).unwrap();
                log.commit().unwrap();
            }
            std::fs::remove_dir_all(tmp.path().join("logs")).unwrap();
            std::thread::sleep(LENGTH_CHECK_EVERY);
            log.append("x", "R", Some("E"), json!({"n": 3})).unwrap();
            log.flush().unwrap();
            let notice = log.take_notice().expect("a status line");
            assert!(
                notice.contains("was removed") && notice.contains("through record 3"),
                "{notice}"
            );
            assert_eq!(log.take_notice(), None, "told once");
            log.append("x", "R", Some("E"), json!({"n": 4})).unwrap();
            log.commit().unwrap();
            let types: Vec<String> = lines(&path)
                .iter()
                .map(|l| Record::from_line(l).unwrap().record_type)
                .collect();
            assert_eq!(
                types,
                [
                    "x",
                    "x",
                    "x",
                    "x",
                    super::super::record_type::LOG_RESTORED,
                    "x"
                ],
                "map {through_map}"
            );
            let busy = AuditLog::open_with(
                &path,
                &keys,
                &AuditOptions {
                    lock_wait: Duration::ZERO,
                    ..AuditOptions::default()
                },
            );
            assert!(
                matches!(busy, Err(AuditError::WriterBusy { .. })),
                "{busy:?}"
            );
            drop(log);
            let report = crate::audit::verify(&path, &keys).unwrap();
            assert_eq!(
                (report.records, report.head_seq),
                (6, 6),
                "map {through_map}"
            );
            // The next writer continues the same chain.
            let mut next = AuditLog::open(&path, &keys).unwrap();
            assert_eq!(next.head().map(|h| h.0), Some(6));
            next.append("x", "R", None, json!({"n": 5})).unwrap();
            next.commit().unwrap();
            assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 7);
        }
    }

    /// `rm` of the log alone: the lock file is still the one this writer holds, and is kept
    /// (taking it again from a second descriptor would find it locked by this very writer).
    #[test]
    fn a_log_file_removed_alone_is_put_back_under_the_lock_it_has() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        std::fs::remove_file(&path).unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.flush().unwrap();
        assert!(log.take_notice().is_some());
        assert_eq!(lines(&path).len(), 3);
        drop(log);
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 3);
    }

    /// Fails closed where the file cannot be put back: another file already at the path is
    /// never overwritten, and a directory that cannot be made stops the writer; no record is
    /// acknowledged after that.
    #[test]
    fn a_removed_log_that_cannot_be_put_back_fails_closed() {
        // Another file at the path by the next flush.
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's\n").unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(err.to_string().contains("could not be put back"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's\n");
        assert!(
            log.append("x", "R", None, json!({"n": 2})).is_err(),
            "poisoned"
        );
        // A file where the directory was.
        let (tmp, keys, path) = setup();
        let mut log = AuditLog::open_with(
            &path,
            &keys,
            &AuditOptions {
                write_through_map: false,
                ..AuditOptions::default()
            },
        )
        .unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        std::fs::remove_dir_all(tmp.path().join("logs")).unwrap();
        std::fs::write(tmp.path().join("logs"), b"").unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = log.flush().unwrap_err();
        assert!(err.to_string().contains("could not be put back"), "{err}");
        assert!(log.take_notice().is_none());
    }

    /// Red-team, session 20: removed, then a rotation before any flush checked (the batch
    /// already written, so the rotation's commit wrote nothing): the rename failed on every
    /// later append, every call was refused and the records were lost. A commit (rotation,
    /// epoch boundary, exit) now checks without the rate limit: put back, then rotated.
    #[test]
    fn a_log_removed_just_before_a_rotation_is_put_back_then_rotated() {
        for through_map in [true, false] {
            let (tmp, keys, path) = setup();
            let opts = AuditOptions {
                write_through_map: through_map,
                max_segment_bytes: 2_000,
                ..AuditOptions::default()
            };
            let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
            let pad = "p".repeat(100);
            let mut n = 0;
            while log.sink().len() + 400 <= 2_000 {
                log.append("x", "R", Some("E"), json!({"n": n, "pad": pad}))
                    .unwrap();
                log.flush().unwrap();
                n += 1;
            }
            std::fs::remove_dir_all(tmp.path().join("logs")).unwrap();
            // Within the flush's rate limit: only the rotation's commit can notice.
            log.set_moment(Moment {
                mono: log.sink().length_checked().unwrap(),
                wall: SystemTime::now(),
            });
            for _ in 0..4 {
                log.append("x", "R", Some("E"), json!({"n": n, "pad": pad}))
                    .unwrap();
                log.flush().unwrap();
                n += 1;
            }
            log.clear_moment();
            assert!(log.take_notice().is_some(), "map {through_map}");
            drop(log);
            assert!(!scan::list_segments(&path).unwrap().is_empty(), "rotated");
            let report = crate::audit::verify(&path, &keys).unwrap();
            // Every record: the n appended, the restore's and the segments' first ones.
            let segments = scan::list_segments(&path).unwrap().len() as u64;
            assert_eq!(report.records, report.head_seq, "map {through_map}");
            assert_eq!(report.head_seq, n + 1 + segments, "map {through_map}");
        }
    }

    /// Red-team, session 20: an exit's commit under a moment whose check was already used
    /// (`run_ended` in the same delivery as the last call) left the removed file removed.
    #[test]
    fn a_log_removed_before_the_last_commit_is_put_back() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY * 2);
        log.set_moment(Moment::now());
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.flush().unwrap();
        std::fs::remove_file(&path).unwrap();
        log.append("run_ended", "R", None, json!({})).unwrap();
        log.commit().unwrap();
        log.clear_moment();
        drop(log);
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 4);
    }

    /// Red-team, session 20: when the file cannot be put back, its records (only in the
    /// removed file, intent records of forwarded calls among them) are kept beside the anchor,
    /// and the refusal names where; a link planted where the directory was is not followed.
    #[test]
    fn records_that_cannot_be_put_back_are_kept_and_a_planted_link_is_not_followed() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("tool_called", "R", None, json!({"n": n}))
                .unwrap();
            log.flush().unwrap();
        }
        let len = log.sink().len();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"").unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY * 2);
        log.append("x", "R", None, json!({"n": 9})).unwrap();
        let err = log.flush().unwrap_err().to_string();
        let kept = err
            .split("are kept in ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{err}"));
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), len);
        assert!(kept.starts_with(keys.anchor_path(&path).unwrap().parent().unwrap()));
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"",
            "the other file is left alone"
        );
        // A link in the directory's place.
        let (tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        std::fs::remove_dir_all(tmp.path().join("logs")).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("deep")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("logs")).unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY * 2);
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = log.flush().unwrap_err().to_string();
        assert!(
            err.contains("a link?") && err.contains("are kept in"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(elsewhere.join("deep")).unwrap().count(),
            0
        );
    }

    /// A log under a directory whose name is not UTF-8: the restore compared the directory
    /// now with the lossy text of the canonical path, which never matched, so the restore
    /// after `cargo clean` failed closed (writer poisoned) though nothing was wrong.
    #[test]
    fn a_removed_log_under_a_non_utf8_directory_is_put_back() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let dir = tmp
            .path()
            .join(std::ffi::OsStr::from_bytes(b"target-\xff"))
            .join("mcp-dev");
        let path = dir.join("audit.jsonl");
        let mut first = writer_with_one_record(&path, &keys);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY);
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        first.flush().expect("put back where it was");
        assert!(first.take_notice().is_some());
        drop(first);
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 3);
    }

    /// A stale, unheld `<log>.lock` left at the path is taken by the restore, which does not
    /// fail closed, and held from then on.
    #[test]
    fn a_stale_unheld_lock_file_does_not_stop_the_restore() {
        let (_tmp, keys, path) = setup();
        let mut first = writer_with_one_record(&path, &keys);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(WriterLock::lock_file(&path, Duration::ZERO).unwrap());
        std::thread::sleep(LENGTH_CHECK_EVERY);
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        first.flush().unwrap();
        assert!(first.take_notice().is_some());
        let probe = File::open(lock_path(&path)).unwrap();
        assert_eq!(
            rustix::fs::flock(&probe, rustix::fs::FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK)
        );
    }
}
