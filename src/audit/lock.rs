//! The writer lock of a log (see "One writer per log" in [`super::writer`]): an exclusive
//! `flock` on a guard beside the anchor and on `<log>.lock` beside the log, held for the
//! writer's life, each holding the holder's pid for a second writer's error. Owns the lock files
//! (their opens are here, in `lock_at`). Must not touch: the log file itself (never locked: a
//! reader's lock on it must not stop a writer), the anchor.

use super::AuditError;
use super::keys::{self, KeyStore};
use crate::base::beneath::{Access, Beneath, Create};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Takes the writer lock of `path` (creating its directory) within `wait`: the first half of
/// opening a writer (see `AuditLog::lock`). The log's directory is opened here and held by the
/// lock for the writer's life: every file beside the log (the log, `<log>.lock`, segments,
/// set-aside and torn-tail copies) is reached from it. With `within` (a root the caller holds,
/// `run`'s `target/mcp-dev`) and the log below it, the directory is opened below that root,
/// each directory on the way checked: a link planted there is refused, never followed.
pub(super) fn take(
    path: &Path,
    keys: &KeyStore,
    wait: Duration,
    within: Option<&Beneath>,
) -> Result<WriterLock, AuditError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = match within.and_then(|w| Some((w, parent.strip_prefix(w.root()).ok()?))) {
        Some((w, rel)) => w.sub_with_mode(rel, 0o700),
        // The log's directory is the caller's path (`--audit-log` below a linked `/tmp`): a
        // link at it is followed once, here; its descriptor is then held.
        None => crate::base::beneath::followed::create_dir_all_with_mode(parent, 0o700)
            .and_then(|()| Beneath::open_following(parent)),
    }
    .map_err(AuditError::io("create directory", parent))?;
    // The log's canonical path as it will resolve once the file exists (its last
    // component is never followed: `open_active` refuses a link there).
    let canonical = crate::base::beneath::followed::canonicalize(parent)
        .map_err(AuditError::io("resolve the path of", parent))?
        .join(path.file_name().unwrap_or_default());
    keys.ensure_anchor_dir()?;
    let guard = keys
        .anchor_path_for_canonical(&canonical)
        .with_extension("writer.lock");
    WriterLock::acquire(path, dir, keys, &guard, canonical, wait)
}

/// The writer lock of a log, held until drop (closing the files releases it): an exclusive
/// `flock` on `<log>.lock` beside the log, and one on its guard, `<anchor name>.writer.lock`
/// beside the anchor (keyed by the log's canonical path, in the user's state directory).
/// The guard is what survives `cargo clean`: with the target directory gone, a second writer
/// takes a new `<log>.lock` but not the guard. `<log>.lock` still excludes a writer that reaches
/// the same directory by another path (a bind mount). Both files hold the holder's pid. The log
/// file itself is never locked: a reader's lock on it (`flock -s`) must not stop `run`.
///
/// The guard is taken first: a second writer that shares it waits there and never touches
/// `<log>.lock`, so after `cargo clean` it cannot hold the new lock file while the first
/// writer puts its log back (red-team, session 21).
#[derive(Debug)]
pub(crate) struct WriterLock {
    file: File,
    _guard: File,
    /// The log's directory, held (see [`take`]); boxed, so a failed open hands back a small
    /// lock.
    dir: Box<Beneath>,
    /// The log's canonical path the guard is keyed by, as it resolved when the lock was taken:
    /// the open must find the log at the same place, or the anchor it loads would be keyed by
    /// another path than the guard (a parent swapped for a link in between).
    canonical: PathBuf,
}

/// Where the writer lock of `log` lives.
pub fn lock_path(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    log.with_file_name(name)
}

impl WriterLock {
    /// Both locks, each with non-blocking attempts and a short back-off, within `wait` in all.
    fn acquire(
        log: &Path,
        dir: Beneath,
        keys: &KeyStore,
        guard: &Path,
        canonical: PathBuf,
        wait: Duration,
    ) -> Result<WriterLock, AuditError> {
        let start = Instant::now();
        let guard = lock_at(log, guard, wait, start, |p| {
            keys.open_below(p, Access::ReadWrite, Create::IfMissing(0o600))
        })?;
        let file = lock_file_in(&dir, log, wait.saturating_sub(start.elapsed()), start)?;
        Ok(WriterLock {
            file,
            _guard: guard,
            dir: Box::new(dir),
            canonical,
        })
    }

    /// The log's directory, held since the lock was taken.
    pub(super) fn dir(&self) -> &Beneath {
        &self.dir
    }

    /// Whether `<log>.lock` is still the file this lock holds.
    pub(super) fn still_linked(&self, log: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (
            self.file.metadata(),
            self.dir.metadata(&beside(&lock_path(log))),
        ) {
            (Ok(h), Ok(p)) => h.nlink() > 0 && (h.dev(), h.ino()) == p.id,
            _ => false,
        }
    }

    /// The log's canonical path the lock was keyed by.
    pub(super) fn canonical(&self) -> &Path {
        &self.canonical
    }

    /// Holds `file`, `<log>.lock` taken again after it was removed, instead of the old one.
    pub(super) fn replace_file(&mut self, file: File) {
        self.file = file;
    }

    /// `<log>.lock` alone, by its path (another writer's, in a test).
    #[cfg(test)]
    pub(super) fn lock_file(log: &Path, wait: Duration) -> Result<File, AuditError> {
        let (dir, _) =
            Beneath::parent_of(log).map_err(AuditError::io("open the writer lock", log))?;
        lock_file_in(&dir, log, wait, Instant::now())
    }
}

/// `path` relative to `dir`, the held directory it was named below (as given when it is not).
pub(super) fn below<'p>(dir: &Beneath, path: &'p Path) -> &'p Path {
    path.strip_prefix(dir.root()).unwrap_or(path)
}

/// The name of a file beside the log, relative to the log's held directory.
pub(super) fn beside(path: &Path) -> PathBuf {
    PathBuf::from(path.file_name().unwrap_or_default())
}

/// `<log>.lock` in the log's held directory `dir` (taken again after `cargo clean` took it).
pub(super) fn lock_file_in(
    dir: &Beneath,
    log: &Path,
    wait: Duration,
    since: Instant,
) -> Result<File, AuditError> {
    let path = lock_path(log);
    lock_at(log, &path, wait, since, |p| {
        dir.open_with(&beside(p), Access::ReadWrite, Create::IfMissing(0o600))
    })
}

/// Opens `path` with `open` (never through a link) and takes an exclusive `flock` on it within
/// `wait`, then writes this process's pid into it. Busy: [`AuditError::WriterBusy`] with the
/// holder's pid as it wrote it there, and the time waited since `since`.
fn lock_at(
    log: &Path,
    path: &Path,
    wait: Duration,
    since: Instant,
    open: impl FnOnce(&Path) -> std::io::Result<File>,
) -> Result<File, AuditError> {
    let file = open(path).map_err(|e| {
        if keys::is_eloop(&e) {
            AuditError::Symlink {
                path: path.to_owned(),
            }
        } else {
            AuditError::io("open the writer lock", path)(e)
        }
    })?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let waited = start.elapsed();
                if waited >= wait {
                    let mut text = String::new();
                    let _ = (&file).read_to_string(&mut text);
                    return Err(AuditError::WriterBusy {
                        path: log.to_owned(),
                        pid: text.trim().parse().ok(),
                        waited_ms: since.elapsed().as_millis() as u64,
                    });
                }
                std::thread::sleep(pause.min(wait - waited));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(AuditError::io("lock audit log", path)(e.into())),
        }
    }
    // Best effort: the pid only makes the second writer's error more helpful. Overwritten in
    // place at a fixed width, never truncated: on ext4 truncate-then-write forces the data
    // out at close (`auto_da_alloc`), which cost milliseconds per start.
    let pid = format!("{:<20}\n", std::process::id());
    let _ = file.write_all_at(pid.as_bytes(), 0);
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::AuditOptions;
    use crate::audit::writer::testing::*;

    /// Issue 15: one writer per log; the second is refused with the holder's pid and what to
    /// do, after the (here short) wait; once the first is gone the second opens and continues.
    #[test]
    fn a_second_writer_is_refused_until_the_first_closes() {
        let (_tmp, keys, path) = setup();
        let mut a = AuditLog::open(&path, &keys).unwrap();
        a.append("x", "A", None, json!({})).unwrap();
        let opts = AuditOptions {
            lock_wait: Duration::from_millis(200),
            ..AuditOptions::default()
        };
        let t = Instant::now();
        let err = AuditLog::open_with(&path, &keys, &opts).unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(&err, AuditError::WriterBusy { pid: Some(p), .. } if *p == std::process::id()),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains("--audit-log") && text.contains("--label"),
            "{text}"
        );
        drop(a);
        let mut b = AuditLog::open_with(&path, &keys, &opts).unwrap();
        assert_eq!(b.append("x", "B", None, json!({})).unwrap().seq, 2);
    }

    /// Red-team, session 20: with `<log>.lock` removed, a second writer took a new lock file
    /// and wrote over the first one's records at the same offsets (`audit verify` passed on
    /// the survivor). The guard beside the anchor refuses it.
    #[test]
    fn a_removed_lock_file_does_not_let_a_second_writer_in() {
        let (_tmp, keys, path) = setup();
        let mut first = writer_with_one_record(&path, &keys);
        std::fs::remove_file(lock_path(&path)).unwrap();
        let second = AuditLog::open_with(
            &path,
            &keys,
            &AuditOptions {
                lock_wait: Duration::ZERO,
                ..AuditOptions::default()
            },
        );
        assert!(
            matches!(second, Err(AuditError::WriterBusy { .. })),
            "{second:?}"
        );
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        first.commit().unwrap();
        drop(first);
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 2);
    }

    /// `cargo clean` takes the log and `<log>.lock`; a second writer that starts before the
    /// first one notices stops at the guard (outside the target directory) without taking the
    /// new `<log>.lock`, so the first one puts its log back and holds `<log>.lock` again even
    /// while the second is still waiting. Red-team, session 21: the second writer took
    /// `<log>.lock` before the guard and held it while it waited; the first one's restore
    /// then went on without it, and once the second gave up nobody held `<log>.lock` for the
    /// rest of the run (a writer with another guard would have got in).
    #[test]
    fn with_the_directory_removed_a_waiting_second_writer_leaves_the_lock_file_to_the_first() {
        let (_tmp, keys, path) = setup();
        let mut first = writer_with_one_record(&path, &keys);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        let second = std::thread::spawn({
            let (path, keys) = (path.clone(), keys.clone());
            move || {
                let busy = AuditOptions {
                    lock_wait: Duration::from_millis(400),
                    ..AuditOptions::default()
                };
                AuditLog::open_with(&path, &keys, &busy).map(drop)
            }
        });
        // The second writer is waiting at the guard while the first notices and restores.
        std::thread::sleep(Duration::from_millis(100));
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        first.flush().unwrap();
        assert!(first.take_notice().is_some());
        match second.join().unwrap() {
            Err(AuditError::WriterBusy { pid, waited_ms, .. }) => {
                assert_eq!(pid, Some(std::process::id()), "the guard names its holder");
                assert!(waited_ms >= 400, "{waited_ms}");
            }
            other => panic!("{other:?}"),
        }
        // `<log>.lock` is the first writer's for the rest of its run.
        let probe = File::open(lock_path(&path)).unwrap();
        assert_eq!(
            rustix::fs::flock(&probe, rustix::fs::FlockOperation::NonBlockingLockExclusive),
            Err(rustix::io::Errno::WOULDBLOCK),
            "nobody holds <log>.lock after the refused writer gave up"
        );
        first.append("x", "R", None, json!({"n": 2})).unwrap();
        first.commit().unwrap();
        drop(first);
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 4);
        // Free again once the first writer is gone.
        drop(AuditLog::open(&path, &keys).unwrap());
    }

    /// A `<log>.lock` held by someone when the removed log is to be put back belongs to a
    /// writer that reached the log another way (its own guard): the file is not put back under
    /// it; the records are kept beside the anchor and the writer fails closed.
    #[test]
    fn a_removed_log_is_not_put_back_under_another_writers_lock_file() {
        let (_tmp, keys, path) = setup();
        let mut first = writer_with_one_record(&path, &keys);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let other = WriterLock::lock_file(&path, Duration::ZERO).unwrap();
        std::thread::sleep(LENGTH_CHECK_EVERY);
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        let err = first.flush().unwrap_err().to_string();
        assert!(
            err.contains("could not be put back") && err.contains("are kept in"),
            "{err}"
        );
        assert!(!path.exists(), "put back under another writer's lock");
        assert!(first.append("x", "R", None, json!({"n": 2})).is_err());
        drop(other);
    }

    /// Red-team, session 21: the log's directory swapped for a link between taking the lock
    /// (guard keyed by where it resolved then) and opening (anchor keyed by where it resolves
    /// now) left the log under an anchor whose guard nobody held. The open now refuses.
    #[test]
    fn a_parent_swapped_for_a_link_after_the_lock_is_refused_at_open() {
        let (tmp, keys, path) = setup();
        drop(AuditLog::open(&path, &keys).unwrap());
        let opts = AuditOptions::default();
        let lock = AuditLog::lock(&path, &keys, &opts).unwrap();
        let parent = path.parent().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::rename(parent, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, parent).unwrap();
        let err = match AuditLog::open_locked(&path, &keys, &opts, lock) {
            Err((e, back)) => {
                assert!(back.is_some(), "the lock is handed back");
                e.to_string()
            }
            Ok(_) => panic!("opened through a swapped parent"),
        };
        assert!(err.contains("a link?"), "{err}");
    }

    /// Red-team, session 21: the log file itself used to be locked, so a reader holding a
    /// lock on it (`flock -s log cp …`) kept `run` from starting, blamed on "another
    /// supervisor". Only `<log>.lock` and the guard are locked now.
    #[test]
    fn a_readers_lock_on_the_log_does_not_stop_a_writer() {
        let (_tmp, keys, path) = setup();
        drop(AuditLog::open(&path, &keys).unwrap());
        for op in [
            rustix::fs::FlockOperation::NonBlockingLockShared,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ] {
            let reader = File::open(&path).unwrap();
            rustix::fs::flock(&reader, op).unwrap();
            let mut log = AuditLog::open_with(
                &path,
                &keys,
                &AuditOptions {
                    lock_wait: Duration::ZERO,
                    ..AuditOptions::default()
                },
            )
            .unwrap();
            log.append("x", "R", None, json!({"op": format!("{op:?}")}))
                .unwrap();
            log.commit().unwrap();
        }
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 2);
    }

    // ----- red-team, session 22 ---------------------------------------------------------------

    /// Two paths to one log file (a hard link in another directory) get different guards and
    /// `<log>.lock`s, but the second `run` finds no anchor for its path, sets its link aside
    /// and starts a new file: the first writer's file is not interleaved.
    #[test]
    fn a_hard_link_to_the_log_in_another_directory_is_not_interleaved() {
        let (tmp, keys, path) = setup();
        let mut first = writer_with_one_record(&path, &keys);
        let other_dir = tmp.path().join("other");
        std::fs::create_dir_all(&other_dir).unwrap();
        let other = other_dir.join("audit.jsonl");
        std::fs::hard_link(&path, &other).unwrap();
        let busy = AuditOptions {
            lock_wait: Duration::from_millis(30),
            ..AuditOptions::default()
        };
        let (mut second, recovery) =
            crate::audit::recover::open_for_run_with(&other, &keys, &busy).unwrap();
        assert!(recovery.is_some(), "the link was set aside, not continued");
        second
            .append("x", "R2", None, json!({"second": true}))
            .unwrap();
        second.commit().unwrap();
        first.append("x", "R", None, json!({"n": 1})).unwrap();
        first.commit().unwrap();
        drop(first);
        assert!(!std::fs::read_to_string(&path).unwrap().contains("R2"));
        assert!(crate::audit::verify(&path, &keys).is_ok());
    }
}
