//! The append-only writer. Owns the log file handle, the exclusive lock around each append, and
//! the anchor update that follows it. Must not touch: record content (callers choose `data`;
//! the bytes are defined by [`super::chain`]) or policy.
//!
//! Concurrency: several writers (two supervisors, or two [`AuditLog`]s in one process) may share
//! one file. Each append takes an exclusive `flock` on the file for the duration of the append
//! only; if the file's length differs from what this writer last saw, another writer appended,
//! and the tail is re-read (and checked) to continue the chain from the true head.
//!
//! Durability: records are written with one `write` call on an `O_APPEND` descriptor and are
//! not fsynced, and the anchor is rewritten in place (see [`super::keys`] for why not
//! temp + rename): an append costs tens of microseconds, not milliseconds; it sits on the path
//! of every tool call. Once `append` returns, the record is in the kernel page cache: a crash of
//! the supervisor loses nothing; a power loss may lose the newest records, which `verify` then
//! reports (truncated tail, or a record that does not match the anchor). Call
//! [`AuditLog::sync`] where durability matters more than latency (e.g. at run end).
//!
//! Fail closed: `open` and `append` refuse to extend a log whose tail does not parse, whose last
//! record's hash or MAC is wrong, whose last line is incomplete, or which is shorter than its
//! anchor says: writing onto a broken chain would bury the damage.

use super::AuditError;
use super::chain::{
    AuditKey, FORMAT_VERSION, GENESIS_PREV, Record, anchor_mac, verify_anchor_mac,
    verify_record_mac,
};
use super::keys::{self, Anchor, AnchorFile, KeyStore};
use serde_json::Value;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What an append produced: the record's position and hash (the new head of the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedRecord {
    pub seq: u64,
    pub hash: String,
}

/// An open audit log, ready to append.
#[derive(Debug)]
pub struct AuditLog {
    file: File,
    state: WriterState,
    lock_deadline: std::time::Duration,
}

#[derive(Debug)]
struct WriterState {
    path: PathBuf,
    canonical_path: String,
    anchor: AnchorFile,
    key: AuditKey,
    /// File length after this writer's last append or tail read.
    seen_len: u64,
    /// `(seq, hash)` of the last record, `None` for an empty log.
    head: Option<(u64, String)>,
}

impl AuditLog {
    /// Opens (creating if needed) the log at `path`: parent directories are created with mode
    /// 0700, the file with mode 0600; a symlink at `path` is refused. The key is loaded or
    /// created, and the existing tail is checked against the key and the anchor.
    pub fn open(path: &Path, keys: &KeyStore) -> Result<AuditLog, AuditError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(AuditError::io("create directory", parent))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(keys::nofollow())
            .open(path)
            .map_err(|e| {
                if keys::is_eloop(&e) {
                    AuditError::Symlink {
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
        let key = keys.load_or_create_key()?;
        keys.ensure_anchor_dir()?;
        let canonical =
            std::fs::canonicalize(path).map_err(AuditError::io("resolve the path of", path))?;
        let canonical_path = canonical.to_string_lossy().into_owned();
        let anchor =
            AnchorFile::open(&keys.anchor_path_for_canonical(&canonical), &canonical_path)?;
        let mut log = AuditLog {
            file,
            lock_deadline: APPEND_LOCK_DEADLINE,
            state: WriterState {
                path: path.to_owned(),
                canonical_path,
                anchor,
                key,
                seen_len: 0,
                head: None,
            },
        };
        {
            let _lock = Lock::exclusive(&log.file, &log.state.path, log.lock_deadline)?;
            let len = log.state.current_len(&log.file)?;
            log.state.read_head(&log.file, len)?;
        }
        Ok(log)
    }

    /// Appends one record and updates the anchor. `record_type` is one of the
    /// [`super::record_type`] names; `run` the agent run id; `epoch` the current execution epoch.
    pub fn append(
        &mut self,
        record_type: &str,
        run: &str,
        epoch: Option<&str>,
        data: Value,
    ) -> Result<AppendedRecord, AuditError> {
        if record_type.is_empty() {
            return Err(AuditError::InvalidRecord("empty record type".into()));
        }
        if run.is_empty() {
            return Err(AuditError::InvalidRecord("empty run id".into()));
        }
        let _lock = Lock::exclusive(&self.file, &self.state.path, self.lock_deadline)?;
        let state = &mut self.state;
        let len = state.current_len(&self.file)?;
        if len != state.seen_len {
            if len < state.seen_len {
                return Err(state.corrupt(format!(
                    "the log shrank from {} to {len} bytes since this writer last appended",
                    state.seen_len
                )));
            }
            state.read_head(&self.file, len)?;
        }
        let (seq, prev) = match &state.head {
            Some((seq, hash)) => (seq + 1, hash.clone()),
            None => (1, GENESIS_PREV.to_owned()),
        };
        let mut record = Record {
            v: FORMAT_VERSION,
            seq,
            // Taken under the lock, so times never go backwards along the file (clock permitting).
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            record_type: record_type.to_owned(),
            run: run.to_owned(),
            epoch: epoch.map(str::to_owned),
            prev,
            data,
            hash: String::new(),
            mac: String::new(),
        };
        let mut line = record.seal_to_line(&state.key)?;
        line.push(b'\n');
        // One write call on an O_APPEND descriptor: the line lands whole at the end of the file.
        if let Err(e) = (&self.file).write_all(&line) {
            // Best effort: cut a partial line off so the chain stays intact for the next writer.
            let _ = self.file.set_len(len);
            return Err(AuditError::io("append to audit log", &state.path)(e));
        }
        state.seen_len = len + line.len() as u64;
        state.head = Some((seq, record.hash.clone()));
        let anchor = Anchor {
            log: state.canonical_path.clone(),
            seq,
            mac: anchor_mac(&state.key, seq, &record.hash),
            hash: record.hash.clone(),
        };
        state.anchor.write(&anchor)?;
        Ok(AppendedRecord {
            seq,
            hash: record.hash,
        })
    }

    /// How long an append waits for the log's lock (default [`APPEND_LOCK_DEADLINE`]).
    pub fn set_lock_deadline(&mut self, deadline: std::time::Duration) {
        self.lock_deadline = deadline;
    }

    /// Flushes the log to stable storage (fsync). Not called by `append`.
    pub fn sync(&self) -> Result<(), AuditError> {
        self.file
            .sync_data()
            .map_err(AuditError::io("sync audit log", &self.state.path))
    }

    pub fn path(&self) -> &Path {
        &self.state.path
    }

    /// `(seq, hash)` of the newest record this writer knows of (`None` for an empty log).
    pub fn head(&self) -> Option<(u64, &str)> {
        self.state.head.as_ref().map(|(s, h)| (*s, h.as_str()))
    }
}

impl WriterState {
    fn corrupt(&self, reason: String) -> AuditError {
        AuditError::CorruptTail {
            path: self.path.clone(),
            reason,
        }
    }

    fn current_len(&self, file: &File) -> Result<u64, AuditError> {
        Ok(file
            .metadata()
            .map_err(AuditError::io("inspect audit log", &self.path))?
            .len())
    }

    /// Reads and checks the last record and the anchor; sets `head` and `seen_len`. Runs under
    /// the lock.
    fn read_head(&mut self, file: &File, len: u64) -> Result<(), AuditError> {
        let anchor = keys::read_anchor_at(self.anchor.path())?;
        if let Some(a) = &anchor
            && !verify_anchor_mac(&self.key, a.seq, &a.hash, &a.mac).unwrap_or(false)
        {
            return Err(self.corrupt(format!(
                "its anchor {} has an invalid MAC",
                self.anchor.path().display()
            )));
        }
        if len == 0 {
            if let Some(a) = anchor {
                return Err(self.corrupt(format!(
                    "the log is empty but its anchor records head seq {}",
                    a.seq
                )));
            }
            self.head = None;
            self.seen_len = 0;
            return Ok(());
        }
        let line = read_last_line(file, len)
            .map_err(AuditError::io("read audit log", &self.path))?
            .map_err(|reason| self.corrupt(reason))?;
        let text = std::str::from_utf8(&line)
            .map_err(|_| self.corrupt("the last line is not UTF-8".into()))?;
        let record =
            Record::from_line(text).map_err(|e| self.corrupt(format!("the last line: {e}")))?;
        let last = format!("the last record (seq {})", record.seq);
        if record.v != FORMAT_VERSION {
            return Err(self.corrupt(format!("{last} has format version {}", record.v)));
        }
        if record.compute_hash()? != record.hash {
            return Err(self.corrupt(format!("{last} does not match its hash")));
        }
        if !verify_record_mac(&self.key, &record.hash, &record.mac).unwrap_or(false) {
            return Err(self.corrupt(format!(
                "{last} has an invalid MAC (tampered, or sealed with another key)"
            )));
        }
        match anchor {
            None => {
                return Err(self.corrupt(format!(
                    "it has no anchor at {}",
                    self.anchor.path().display()
                )));
            }
            Some(a) if a.seq > record.seq => {
                return Err(self.corrupt(format!(
                    "truncated: its anchor records head seq {} but the last record is seq {}",
                    a.seq, record.seq
                )));
            }
            Some(a) if a.seq == record.seq && a.hash != record.hash => {
                return Err(self.corrupt(format!("{last} is not the record its anchor names")));
            }
            // An anchor behind the tail is a crash between the write and the anchor update.
            Some(_) => {}
        }
        self.head = Some((record.seq, record.hash));
        self.seen_len = len;
        Ok(())
    }
}

/// The last line of a file of length `len`, without its `\n`. `Ok(Err(reason))` if the file does
/// not end in a complete line.
fn read_last_line(file: &File, len: u64) -> std::io::Result<Result<Vec<u8>, String>> {
    let mut chunk = len.min(4096);
    loop {
        let start = len - chunk;
        let mut buf = vec![0u8; chunk as usize];
        file.read_exact_at(&mut buf, start)?;
        if start + chunk == len && buf.last() != Some(&b'\n') {
            return Ok(Err(
                "the last line is incomplete (no final newline: an interrupted write?)".into(),
            ));
        }
        let body = &buf[..buf.len() - 1];
        if let Some(pos) = body.iter().rposition(|&b| b == b'\n') {
            return Ok(Ok(body[pos + 1..].to_vec()));
        }
        if start == 0 {
            return Ok(Ok(body.to_vec()));
        }
        chunk = (chunk * 2).min(len);
    }
}

/// How long an append waits for the log's lock before failing (issue 12: another process
/// holding a lock on the log used to freeze the whole session). The call being recorded then
/// fails closed (it is not forwarded) and the session goes on.
pub const APPEND_LOCK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a reader (`audit verify`) waits for writers.
pub const READ_LOCK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// A `flock` on a log, held until drop.
pub(crate) struct Lock<'a>(&'a File);

impl<'a> Lock<'a> {
    fn exclusive(
        file: &'a File,
        path: &Path,
        deadline: std::time::Duration,
    ) -> Result<Lock<'a>, AuditError> {
        Self::take(
            file,
            path,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
            deadline,
        )
    }

    /// For readers (verify): excludes writers, so the log and its anchor are read as one state.
    pub(crate) fn shared(file: &'a File, path: &Path) -> Result<Lock<'a>, AuditError> {
        Self::take(
            file,
            path,
            rustix::fs::FlockOperation::NonBlockingLockShared,
            READ_LOCK_DEADLINE,
        )
    }

    /// Non-blocking attempts with a short back-off until `deadline` has passed.
    fn take(
        file: &'a File,
        path: &Path,
        op: rustix::fs::FlockOperation,
        deadline: std::time::Duration,
    ) -> Result<Lock<'a>, AuditError> {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(200);
        loop {
            match rustix::fs::flock(file, op) {
                Ok(()) => return Ok(Lock(file)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let waited = start.elapsed();
                    if waited >= deadline {
                        return Err(AuditError::LockTimeout {
                            path: path.to_owned(),
                            waited_ms: waited.as_millis() as u64,
                        });
                    }
                    std::thread::sleep(pause.min(deadline - waited));
                    pause = (pause * 2).min(std::time::Duration::from_millis(50));
                }
                Err(e) => return Err(AuditError::io("lock audit log", path)(e.into())),
            }
        }
    }
}

impl Drop for Lock<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0, rustix::fs::FlockOperation::Unlock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn setup() -> (tempfile::TempDir, KeyStore, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("logs/deep/audit.jsonl");
        (tmp, keys, path)
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn appends_chain_from_genesis_and_anchor_follows() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        assert_eq!(log.head(), None);
        let a = log
            .append("run_started", "R1", None, json!({"agentRun": "R1"}))
            .unwrap();
        let b = log
            .append("tool_called", "R1", Some("E1"), json!({"tool": "t"}))
            .unwrap();
        assert_eq!((a.seq, b.seq), (1, 2));
        assert_eq!(log.head(), Some((2, b.hash.as_str())));
        let l = lines(&path);
        assert_eq!(l.len(), 2);
        let r1 = Record::from_line(&l[0]).unwrap();
        let r2 = Record::from_line(&l[1]).unwrap();
        assert_eq!(r1.prev, GENESIS_PREV);
        assert_eq!(r2.prev, a.hash);
        assert_eq!(r2.hash, b.hash);
        assert_eq!(r2.epoch.as_deref(), Some("E1"));
        assert!(
            humantime::parse_rfc3339(&r2.time).is_ok() && r2.time.len() == 24,
            "{}",
            r2.time
        );
        let anchor = keys.read_anchor(&path).unwrap().unwrap();
        assert_eq!((anchor.seq, anchor.hash.as_str()), (2, b.hash.as_str()));
        let key = keys.load_key().unwrap();
        assert!(verify_anchor_mac(&key, 2, &b.hash, &anchor.mac).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
    }

    #[test]
    fn reopening_continues_the_chain() {
        let (_tmp, keys, path) = setup();
        let first = AuditLog::open(&path, &keys)
            .unwrap()
            .append("run_started", "R1", None, json!({}))
            .unwrap();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        assert_eq!(log.head(), Some((1, first.hash.as_str())));
        assert_eq!(
            log.append("run_ended", "R1", None, json!({})).unwrap().seq,
            2
        );
    }

    #[test]
    fn another_writer_appending_is_picked_up() {
        let (_tmp, keys, path) = setup();
        let mut a = AuditLog::open(&path, &keys).unwrap();
        let mut b = AuditLog::open(&path, &keys).unwrap();
        a.append("x", "A", None, json!({})).unwrap();
        let rb = b.append("x", "B", None, json!({})).unwrap();
        let ra = a.append("x", "A", None, json!({})).unwrap();
        assert_eq!((rb.seq, ra.seq), (2, 3));
        assert_eq!(Record::from_line(&lines(&path)[2]).unwrap().prev, rb.hash);
    }

    #[test]
    fn corrupt_tail_stops_appends() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.append("x", "R", None, json!({"n": 2})).unwrap();
        // Tamper with the last record's data (length unchanged would not be noticed by a
        // running writer; a changed length is).
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"n\":2", "\"n\":22");
        std::fs::write(&path, text).unwrap();
        let err = log.append("x", "R", None, json!({})).unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        assert!(err.to_string().contains("does not match its hash"), "{err}");
        assert!(AuditLog::open(&path, &keys).is_err());
        assert_eq!(lines(&path).len(), 2, "nothing was appended");
    }

    #[test]
    fn incomplete_last_line_stops_appends() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({})).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1,\"se")
            .unwrap();
        let err = log.append("x", "R", None, json!({})).unwrap_err();
        assert!(err.to_string().contains("no final newline"), "{err}");
    }

    #[test]
    fn truncation_is_refused_at_open() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for _ in 0..3 {
            log.append("x", "R", None, json!({})).unwrap();
        }
        drop(log);
        let l = lines(&path);
        std::fs::write(&path, format!("{}\n{}\n", l[0], l[1])).unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(
            err.to_string().contains("anchor records head seq 3"),
            "{err}"
        );
        std::fs::write(&path, b"").unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(err.to_string().contains("the log is empty"), "{err}");
    }

    #[test]
    fn other_key_is_refused() {
        let (tmp, keys, path) = setup();
        AuditLog::open(&path, &keys)
            .unwrap()
            .append("x", "R", None, json!({}))
            .unwrap();
        let err = AuditLog::open(&path, &KeyStore::at(tmp.path().join("other"))).unwrap_err();
        assert!(err.to_string().contains("invalid MAC"), "{err}");
    }

    #[test]
    fn symlink_and_directory_are_refused() {
        let (tmp, keys, path) = setup();
        let target = tmp.path().join("target.jsonl");
        std::fs::write(&target, b"").unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(matches!(
            AuditLog::open(&path, &keys),
            Err(AuditError::Symlink { .. })
        ));
        let dir = tmp.path().join("adir");
        std::fs::create_dir(&dir).unwrap();
        assert!(AuditLog::open(&dir, &keys).is_err());
    }

    #[test]
    fn bad_input_is_refused_before_writing() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        assert!(matches!(
            log.append("", "R", None, json!({})),
            Err(AuditError::InvalidRecord(_))
        ));
        assert!(matches!(
            log.append("x", "", None, json!({})),
            Err(AuditError::InvalidRecord(_))
        ));
        assert!(matches!(
            log.append("x", "R", None, json!({"d": 1.5})),
            Err(AuditError::Chain(_))
        ));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        // The failed appends left the writer usable.
        assert_eq!(log.append("x", "R", None, json!({})).unwrap().seq, 1);
    }

    #[test]
    fn long_tail_lines_are_read_across_chunks() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"big": "a".repeat(10_000)}))
            .unwrap();
        let big = log
            .append("x", "R", None, json!({"big": "b".repeat(20_000)}))
            .unwrap();
        let mut again = AuditLog::open(&path, &keys).unwrap();
        assert_eq!(again.head(), Some((2, big.hash.as_str())));
        assert_eq!(again.append("x", "R", None, json!({})).unwrap().seq, 3);
    }

    /// Issue 12, medium finding "the audit `flock` blocks the whole session": another process
    /// holding a lock makes an append fail after the deadline instead of blocking forever.
    #[test]
    fn a_held_lock_fails_the_append_after_the_deadline() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({})).unwrap();
        let other = File::open(&path).unwrap();
        rustix::fs::flock(&other, rustix::fs::FlockOperation::LockShared).unwrap();
        log.set_lock_deadline(std::time::Duration::from_millis(300));
        let t = std::time::Instant::now();
        let err = log.append("x", "R", None, json!({})).unwrap_err();
        assert!(matches!(err, AuditError::LockTimeout { .. }), "{err}");
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        assert!(err.to_string().contains("another process"), "{err}");
        drop(other);
        assert_eq!(log.append("x", "R", None, json!({})).unwrap().seq, 2);
    }

    /// `cargo test -- --ignored --nocapture append_latency`: median append latency.
    #[test]
    #[ignore]
    fn append_latency() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        let mut times = Vec::new();
        for i in 0..2000 {
            let data = json!({"callId": i, "tool": "write_inventory", "grant": "G1",
                "credentialScopes": ["inventory-api-staging"], "argumentsDigest": "f".repeat(64)});
            let t = std::time::Instant::now();
            log.append(
                "tool_called",
                "01JQ7R4S4S0QJ7GZP1S2",
                Some("01JQ7R9KQ6K2Y8W4JH0M"),
                data,
            )
            .unwrap();
            times.push(t.elapsed());
        }
        times.sort();
        eprintln!(
            "append: median {:?}, p99 {:?}",
            times[times.len() / 2],
            times[times.len() * 99 / 100]
        );
    }
}
