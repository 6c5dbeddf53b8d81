//! The append-only writer, [`AuditLog`]: the caller's API (open, append, flush, commit) and the
//! orchestration of its parts. Owns the writer's state (head, batch, poisoning, options, the
//! event's [`Moment`]) and the order of things: seal into the batch ([`super::seal`], pure),
//! write the batch ([`super::sink`]), put back a removed file ([`super::restore`]), anchor
//! ([`super::anchor`]), rotate ([`super::rotate`]); opening checks the tail ([`super::tail`])
//! under the writer lock ([`super::lock`]).
//! Must not touch: record content (callers choose `data`; the bytes are defined by
//! [`super::chain`]), policy, stdout; files other than through named functions of its parts:
//! `sink::open_active` (the active file), `lock::lock_at` (the lock files), `Removed::put_back`
//! and `Removed::keep_beside` ([`super::restore`]), `rotate::close_into` and
//! `rotate::sync_dir_of`, `AnchorFile` ([`super::keys`], the anchor) and the tail check's reads
//! ([`super::tail`], through [`super::scan`] and `keys::open_nofollow`).
//!
//! # One writer per log
//!
//! [`AuditLog::open`] takes an exclusive `flock` on a guard beside the log's anchor (keyed by
//! its canonical path, outside the target directory, so `cargo clean` cannot take it away),
//! then on `<log>.lock` (beside the log; see `WriterLock`), and keeps both for as long as the
//! [`AuditLog`] lives. The open refuses a log that no longer resolves where the guard was keyed. Both hold the writer's pid, for the error a second writer gets. The log
//! file itself is never locked: a reader's lock on it does not stop a writer. A second writer waits up to [`WRITER_LOCK_WAIT`] (a host that starts the
//! server command twice in quick succession — a probe, then the real session — may still have
//! the probe's supervisor exiting) and then fails with [`AuditError::WriterBusy`], naming the
//! log and the other writer's pid. Because nobody else appends, the writer keeps the head and
//! the file length in memory: an append costs no lock, no `fstat` and no read. A change made
//! to the file behind the writer's back (not a writer: an editor, an attacker) is not noticed
//! while it runs; it breaks the chain, and `audit verify` and the next start report it. The
//! one exception is a file cut shorter than the writer's records while it maps them: the copy
//! past the cut is caught ([`crate::base::sys::mapped`]) and the writer fails closed from then on
//! (see `AuditLog::cut_short`). Another is a file removed while the writer has it open
//! (`cargo clean`, `rm`): the records would go on into a file nobody can read, so the writer
//! puts the file back at its path from its open descriptor and the chain continues (see
//! `AuditLog::restore_removed`).
//! Readers (`audit verify`, `audit show`, `audit tail`) never take the lock (see [`super::verify()`]).
//!
//! # Group commit: the caller's contract
//!
//! - [`AuditLog::append`] seals the record (seq, `prev`, hash, MAC: the chain is exactly as
//!   strong as when every record was written alone) and encodes it into an in-memory batch. It
//!   makes no system call (except once per `max_segment_bytes`, to rotate) and returns the
//!   record's seq and hash.
//! - [`AuditLog::flush`] puts the whole batch in the file at once: one copy into the mapped
//!   reservation (below), or one `write` on an `O_APPEND` descriptor (a short write continues
//!   with the rest). A failed write is cut back off the file (no partial line stays) and the
//!   error is returned: the records of that batch are lost, the head goes back to the last record on
//!   disk, and the caller must treat it as an audit failure (fail closed: do not forward).
//!   `flush` also rewrites the anchor when the last anchor write is older than [`ANCHOR_LAG`].
//! - [`AuditLog::write_pending`] is `flush` without the anchor, and
//!   [`AuditLog::take_anchor_update`] hands the due rewrite out as an [`AnchorUpdate`] to write
//!   later: `run` writes it after releasing the session's lock and after forwarding, so no call
//!   waits for the anchor (a second file whose inode a spaced call would dirty on its path).
//! - [`AuditLog::commit`] = flush + fsync (policy permitting) + anchor rewrite (+ its fsync).
//! - `Drop` does a best-effort `commit`.
//!
//! The caller must `flush` before it forwards a tool call whose intent record
//! ([`super::record_type::TOOL_CALLED`]) it appended (the record is then in the kernel: a crash
//! of the supervisor cannot lose it), and `commit` at epoch boundaries and at exit.
//!
//! # Durability ([`FsyncPolicy`])
//!
//! What survives, by setting:
//!
//! | policy | process crash (kill -9, panic) | power loss / kernel crash |
//! |---|---|---|
//! | `every` | everything flushed | everything flushed |
//! | `boundaries` (default) | everything flushed | everything up to the last commit (epoch boundary, exit, rotation) |
//! | `never` | everything flushed | nothing guaranteed |
//!
//! A process crash loses nothing that was flushed: once `write` returns, or the copy into the
//! map is done, the bytes are in the page cache. A crash *during* a `write` can leave part of the
//! batch: the kernel stops copying a write to a file at a page boundary when the process is
//! killed, so the file can end in an incomplete line; a copy into the map is made in order, so a
//! crash in it leaves a prefix of the batch too, followed by the reservation's NUL bytes. That
//! batch was not flushed (no call was forwarded on an intent record in it); see below. The
//! anchor may lag the log by up to [`ANCHOR_LAG`] (or until the next flush or commit); a log
//! longer than its anchor is valid (the unanchored tail is checked record by
//! record at the next start), one shorter than its anchor is reported as truncated. After a
//! power loss the anchor (rewritten without fsync between commits) can be on disk ahead of the
//! records it names: the next start then sets the log aside as evidence and starts a new chain
//! that names the old head (see [`super::recover`]); nothing committed is lost.
//!

use super::AuditError;
use super::anchor::{AnchorUpdate, Anchoring};
use super::chain::{Hex64, RecordData};
use super::clock::Moment;
use super::keys::KeyStore;
use super::lock::{self, WriterLock};
use super::record_type::{LOG_RESTORED, SEGMENT_STARTED, TOOL_RUN};
use super::restore::{RESTORED_REASON, Removed};
use super::rotate;
use super::seal::{Head, Sealer};
use super::sink::{Broken, CopyOutcome, FileState, Sink, open_active};
use super::tail::{Tail, TailCheck};
use crate::base::beneath::Beneath;
use crate::base::sys::mapped::PreparePages;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

/// What an append produced: the record's position and hash (the new head of the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedRecord {
    pub seq: u64,
    pub hash: Hex64,
}

/// When the writer asks the kernel to put the log on stable storage (see the module doc for
/// what each setting survives). Config key `audit-fsync`, flag `--audit-fsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Never fsync: the kernel writes back when it likes.
    Never,
    /// fsync at every commit: epoch boundaries, rotation and exit.
    #[default]
    Boundaries,
    /// fsync at every flush (and commit): every record flushed survives a power loss.
    Every,
}

impl FsyncPolicy {
    /// The accepted spellings, for help texts and errors.
    pub const VALUES: &'static [&'static str] = &["never", "boundaries", "every"];
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FsyncPolicy::Never => "never",
            FsyncPolicy::Boundaries => "boundaries",
            FsyncPolicy::Every => "every",
        })
    }
}

/// A value that is not one of [`FsyncPolicy::VALUES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid audit fsync policy {0:?}: expected one of never, boundaries, every")]
pub struct ParseFsyncPolicyError(pub String);

impl FromStr for FsyncPolicy {
    type Err = ParseFsyncPolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "never" => Ok(FsyncPolicy::Never),
            "boundaries" => Ok(FsyncPolicy::Boundaries),
            "every" => Ok(FsyncPolicy::Every),
            other => Err(ParseFsyncPolicyError(other.to_owned())),
        }
    }
}

/// How long a second writer waits for the lock of a log before [`AuditError::WriterBusy`].
pub const WRITER_LOCK_WAIT: Duration = Duration::from_secs(3);

pub use super::anchor::ANCHOR_LAG;

/// Default size at which the active file rotates into a segment (config
/// `audit-max-segment-bytes`).
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// How a writer is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditOptions {
    pub fsync: FsyncPolicy,
    /// Rotate the active file before a record would take it past this many bytes (`0`: never).
    pub max_segment_bytes: u64,
    /// How long to wait for another writer to let go of the log.
    pub lock_wait: Duration,
    /// Copy batches into reserved, mapped space past the records instead of `write`-ing them
    /// (see "Writing through a map" in the module doc). Where the file system cannot reserve
    /// space (or off Linux) the writer falls back to `write` by itself; `false` always writes.
    pub write_through_map: bool,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            fsync: FsyncPolicy::default(),
            max_segment_bytes: DEFAULT_MAX_SEGMENT_BYTES,
            lock_wait: WRITER_LOCK_WAIT,
            write_through_map: true,
        }
    }
}

/// An open audit log, ready to append; the only writer of its file while it lives.
#[derive(Debug)]
pub struct AuditLog {
    /// The active file and how batches reach it ([`super::sink`]).
    sink: Sink,
    /// Always `Some` while the log is usable (taken back out only by a failed open).
    lock: Option<WriterLock>,
    path: PathBuf,
    canonical_path: String,
    /// The anchor file and what it names ([`super::anchor`]).
    anchoring: Anchoring,
    /// Seals records onto `head` (holds the key).
    sealer: Sealer,
    opts: AuditOptions,
    /// The last record in the file: `(seq, hash)`.
    written: Head,
    /// The last record sealed (in the batch or in the file).
    head: Head,
    /// Sealed lines not yet written.
    batch: Vec<u8>,
    /// Whether the active file holds a record besides its opening `segment_started` (a file is
    /// rotated only then, so one oversized record cannot rotate forever).
    rotatable: bool,
    /// No segment number is left above the highest one present (a file planted under the
    /// largest): the active file grows instead of rotating.
    numbers_exhausted: bool,
    /// Set when a failed write could not be cut back: the file may end in a partial line, so
    /// nothing more is written to it.
    poisoned: Option<String>,
    /// The time of the event being handled, when the caller set one ([`AuditLog::set_moment`]):
    /// records, the anchor's lag and the length check read it instead of the clocks.
    moment: Option<Moment>,
    /// What the writer did by itself that its user should be told (one status line), until
    /// [`AuditLog::take_notice`].
    notice: Option<String>,
}

impl AuditLog {
    /// [`AuditLog::open_with`] with the default options.
    pub fn open(path: &Path, keys: &KeyStore) -> Result<AuditLog, AuditError> {
        Self::open_with(path, keys, &AuditOptions::default())
    }

    /// Opens (creating if needed) the log at `path` as its only writer: parent directories are
    /// created with mode 0700, the file with mode 0600; a symlink at `path` is refused. The
    /// writer lock is taken (see the module doc), the key is loaded or created, and the tail is
    /// checked against the key and the anchor.
    pub fn open_with(
        path: &Path,
        keys: &KeyStore,
        opts: &AuditOptions,
    ) -> Result<AuditLog, AuditError> {
        let lock = Self::lock(path, keys, opts)?;
        Self::open_locked(path, keys, opts, lock).map_err(|(e, _)| e)
    }

    /// Takes the writer lock of `path` (creating its directory): the first half of
    /// [`AuditLog::open_with`], for a caller that must keep the log to itself across a failed
    /// open (recovery sets the log aside under the lock).
    pub(crate) fn lock(
        path: &Path,
        keys: &KeyStore,
        opts: &AuditOptions,
    ) -> Result<WriterLock, AuditError> {
        lock::take(path, keys, opts.lock_wait, None)
    }

    /// [`AuditLog::lock`] for a log below `within`, a root the caller holds (see
    /// [`super::lock::take`]).
    pub(crate) fn lock_within(
        within: Option<&Beneath>,
        path: &Path,
        keys: &KeyStore,
        opts: &AuditOptions,
    ) -> Result<WriterLock, AuditError> {
        lock::take(path, keys, opts.lock_wait, within)
    }

    /// The log's directory, held by the writer lock.
    pub(super) fn dir(&self) -> Result<&Beneath, AuditError> {
        match &self.lock {
            Some(lock) => Ok(lock.dir()),
            None => Err(self.corrupt("its writer lock is not held".into())),
        }
    }

    /// The second half of [`AuditLog::open_with`]; a failure hands the lock back.
    pub(crate) fn open_locked(
        path: &Path,
        keys: &KeyStore,
        opts: &AuditOptions,
        lock: WriterLock,
    ) -> Result<AuditLog, (AuditError, Option<WriterLock>)> {
        let prepared = (|| {
            let file = open_active(lock.dir(), path, false)?;
            let key = keys.load_or_create_key()?;
            keys.ensure_anchor_dir()?;
            let canonical = crate::base::beneath::followed::canonicalize(path)
                .map_err(AuditError::io("resolve the path of", path))?;
            if canonical != lock.canonical() {
                return Err(AuditError::io("open", path)(std::io::Error::other(
                    format!(
                        "it now resolves to {}, not {} where its writer lock was taken (a link?)",
                        canonical.display(),
                        lock.canonical().display()
                    ),
                )));
            }
            let canonical_path = canonical.to_string_lossy().into_owned();
            let anchor =
                keys.open_anchor(&keys.anchor_path_for_canonical(&canonical), &canonical_path)?;
            Ok((file, key, canonical_path, anchor))
        })();
        let (file, key, canonical_path, anchor) = match prepared {
            Ok(p) => p,
            Err(e) => return Err((e, Some(lock))),
        };
        let mut log = AuditLog {
            sink: Sink::new(file, opts.write_through_map),
            lock: Some(lock),
            path: path.to_owned(),
            anchoring: Anchoring::new(anchor, canonical_path.clone()),
            canonical_path,
            sealer: Sealer::new(key),
            opts: opts.clone(),
            written: Head::default(),
            head: Head::default(),
            batch: Vec::with_capacity(16 << 10),
            rotatable: false,
            numbers_exhausted: false,
            poisoned: None,
            moment: None,
            notice: None,
        };
        match log.continue_tail() {
            Ok(()) => Ok(log),
            Err(e) => {
                let lock = log.lock.take();
                Err((e, lock))
            }
        }
    }

    /// Checks the tail ([`super::tail`]) and continues the chain where it ends.
    fn continue_tail(&mut self) -> Result<(), AuditError> {
        let tail = TailCheck {
            file: self.sink.file(),
            path: &self.path,
            anchor_path: self.anchoring.path(),
            anchoring: &self.anchoring,
            dir: self.dir()?,
            key: self.sealer.key(),
        }
        .run()?;
        match tail {
            Tail::Empty => Ok(()),
            Tail::Continue {
                len,
                seq,
                hash,
                anchored,
            } => {
                self.finish_open(len, seq, hash, anchored);
                if anchored.is_none() {
                    // Upgrade the anchor (offset) now, so the next start reads only the tail.
                    self.write_anchor()?;
                }
                Ok(())
            }
            Tail::AfterRotation { seq, hash, segment } => {
                self.written = Head::at(seq, hash);
                self.head = self.written.clone();
                self.start_segment(&segment)
            }
        }
    }

    fn finish_open(&mut self, len: u64, seq: u64, hash: String, anchored: Option<u64>) {
        // What was there before this writer is not its to fsync.
        self.sink.opened_at(len);
        self.written = Head::at(seq, hash);
        self.head = self.written.clone();
        self.anchoring.found(anchored);
        self.rotatable = true;
    }

    /// Seals one record into the batch (see the module doc: no system call) and returns its
    /// seq and hash. `record_type` is one of the [`super::record_type`] names; `run` the agent
    /// run id; `epoch` the current execution epoch. The record reaches the file at the next
    /// [`AuditLog::flush`] or [`AuditLog::commit`].
    pub fn append(
        &mut self,
        record_type: &str,
        run: &str,
        epoch: Option<&str>,
        data: impl Into<RecordData>,
    ) -> Result<AppendedRecord, AuditError> {
        if record_type.is_empty() {
            return Err(AuditError::InvalidRecord("empty record type".into()));
        }
        if run.is_empty() {
            return Err(AuditError::InvalidRecord("empty run id".into()));
        }
        self.check_poisoned()?;
        let data = match data.into() {
            RecordData::Tree(v) => {
                let mut out = Vec::with_capacity(256);
                crate::audit::canonical_json(&v, &mut out)?;
                out
            }
            RecordData::Canonical(bytes) => bytes,
        };
        loop {
            let at = self.batch.len();
            let (seq, hash) = self.seal(record_type, run, epoch, &data);
            if self.opts.max_segment_bytes > 0
                && self.rotatable
                && !self.numbers_exhausted
                && self.sink.len() + self.batch.len() as u64 > self.opts.max_segment_bytes
            {
                // Sealed onto the head the new segment will not continue: sealed again there.
                self.batch.truncate(at);
                self.rotate()?;
                continue;
            }
            self.set_head(seq, hash.as_str());
            self.rotatable = true;
            return Ok(AppendedRecord { seq, hash });
        }
    }

    /// Seals a record onto the head and appends its line (with its `\n`) to the batch
    /// ([`Sealer::seal`], at the event's time); the head is not moved ([`AuditLog::set_head`]).
    fn seal(
        &mut self,
        record_type: &str,
        run: &str,
        epoch: Option<&str>,
        data: &[u8],
    ) -> (u64, Hex64) {
        let time = self.moment.map_or_else(SystemTime::now, |m| m.wall);
        self.sealer.seal(
            &self.head,
            time,
            record_type,
            run,
            epoch,
            data,
            &mut self.batch,
        )
    }

    fn set_head(&mut self, seq: u64, hash: &str) {
        self.head.advance(seq, hash);
    }

    /// Writes the batch with one `write` (see the module doc), fsyncs it under
    /// [`FsyncPolicy::Every`], and rewrites the anchor if it is older than [`ANCHOR_LAG`].
    pub fn flush(&mut self) -> Result<(), AuditError> {
        self.write_pending()?;
        if self.anchor_due() {
            self.write_anchor()?;
        }
        Ok(())
    }

    /// [`AuditLog::flush`] without the anchor: the caller takes a due rewrite with
    /// [`AuditLog::take_anchor_update`] and does it after releasing its own lock.
    pub fn write_pending(&mut self) -> Result<(), AuditError> {
        self.check_poisoned()?;
        if !self.batch.is_empty() {
            self.write_batch()?;
            if self.opts.fsync == FsyncPolicy::Every {
                self.sync_file()?;
            }
        }
        Ok(())
    }

    /// Sets the time of the event being handled until [`AuditLog::clear_moment`]: what is sealed,
    /// checked or anchored for it reads this instead of the clocks.
    pub fn set_moment(&mut self, moment: Moment) {
        self.moment = Some(moment);
    }

    pub fn clear_moment(&mut self) {
        self.moment = None;
    }

    fn mono_now(&self) -> Instant {
        self.moment.map_or_else(Instant::now, |m| m.mono)
    }

    /// Flush, then fsync the log (unless the policy is [`FsyncPolicy::Never`]), rewrite the
    /// anchor and fsync it: the caller's epoch boundaries and exit.
    pub fn commit(&mut self) -> Result<(), AuditError> {
        self.check_poisoned()?;
        // Not rate-limited here: a commit is rare (epoch boundary, rotation, exit), and a file
        // removed since the last flush must be put back before it is synced, renamed into a
        // segment or closed (its records would go with it).
        // (Without the lock, this is a failed open being dropped: it has no records to keep.)
        if self.lock.is_some() && self.sink.state(0) == FileState::Removed {
            self.restore_removed()?;
        }
        if !self.batch.is_empty() {
            self.write_batch()?;
        }
        let sync = self.opts.fsync != FsyncPolicy::Never;
        if sync {
            self.sync_file()?;
        }
        // An update handed out may not have been written yet: then the commit writes the
        // anchor itself (the update is skipped later as older, see `AnchorUpdate::write`).
        let now = self.mono_now();
        self.anchoring
            .commit(self.sealer.key(), &self.written, self.sink.len(), now, sync)
    }

    /// Sets the fsync policy from now on.
    pub fn set_fsync(&mut self, policy: FsyncPolicy) {
        self.opts.fsync = policy;
    }

    pub fn fsync_policy(&self) -> FsyncPolicy {
        self.opts.fsync
    }

    /// Sets the rotation size from now on (`0`: never rotate).
    pub fn set_max_segment_bytes(&mut self, bytes: u64) {
        self.opts.max_segment_bytes = bytes;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `(seq, hash)` of the newest record sealed (`None` for an empty log), flushed or not.
    pub fn head(&self) -> Option<(u64, &str)> {
        self.head.get()
    }

    /// Bytes sealed but not yet written (what a crash now would lose).
    pub fn pending_bytes(&self) -> usize {
        self.batch.len()
    }

    fn check_poisoned(&self) -> Result<(), AuditError> {
        match &self.poisoned {
            Some(reason) => Err(self.corrupt(reason.clone())),
            None => Ok(()),
        }
    }

    fn write_batch(&mut self) -> Result<(), AuditError> {
        let before = self.sink.len();
        let result = match self.copy_to_map() {
            Some(copied) => copied,
            None if self.sink.length_check_due(self.mono_now())
                && self.sink.state(0) == FileState::Removed =>
            {
                self.restore_removed()?;
                return self.write_batch();
            }
            None => self.sink.write(&self.batch),
        };
        let error = match result {
            Ok(n) if n == self.batch.len() => {
                self.sink.advance(n);
                self.batch.clear();
                // In place: no new string per write.
                self.written.set_to(&self.head);
                return Ok(());
            }
            Ok(n) => std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write: {n} of {} bytes", self.batch.len()),
            ),
            Err(e) => e,
        };
        // The batch is lost: cut any part of it off so the file ends on a whole record, and
        // continue the chain from the last record on disk.
        self.batch.clear();
        self.head = self.written.clone();
        if let Some(reason) = &self.poisoned {
            // Cut short by someone else (`copy_to_map`): the file is left as they left it.
            return Err(self.corrupt(reason.clone()));
        }
        if let Err(cut) = self.sink.cut_back(before) {
            self.poisoned = Some(format!(
                "a failed write ({error}) could not be cut back ({cut}): the file may end in a partial line"
            ));
        }
        Err(AuditError::io("append to audit log", &self.path)(error))
    }

    /// The active file was removed while this writer had it open: put back at its path
    /// ([`super::restore`]) and the chain continues with a sealed
    /// [`super::record_type::LOG_RESTORED`] record in the batch; what cannot be put back is
    /// kept beside the anchor and the writer fails closed (poisoned).
    fn restore_removed(&mut self) -> Result<(), AuditError> {
        let canonical = self.lock.as_ref().map_or_else(
            || PathBuf::from(&self.canonical_path),
            |l| l.canonical().to_owned(),
        );
        let removed = Removed {
            path: &self.path,
            canonical: &canonical,
            records: self.sink.file(),
            len: self.sink.len(),
        };
        let put_back = match self
            .lock
            .as_ref()
            .ok_or_else(|| self.corrupt("its writer lock is not held".into()))
            .and_then(|lock| removed.put_back(lock))
        {
            Ok(p) => p,
            Err(e) => {
                // Its records are still only in the removed file: kept beside the anchor (the
                // user's state directory, outside the target directory) before the writer stops.
                let kept = match removed.keep_beside(self.anchoring.path()) {
                    Ok(at) => format!(
                        "its {} bytes of records are kept in {}",
                        self.sink.len(),
                        at.display()
                    ),
                    Err(k) => format!("its records could not be kept ({k})"),
                };
                self.sink.stop_mapping();
                let reason = format!(
                    "removed while this run was writing it (cargo clean?), and it could not be \
                     put back ({e}); {kept}; restart `cargo mcp-dev run` to start a new chain"
                );
                self.poisoned = Some(reason.clone());
                return Err(self.corrupt(reason));
            }
        };
        // The removed file's map and reservation go with it.
        let len = self.sink.len();
        self.sink.replace_file(put_back.file, len);
        if let (Some(new), Some(lock)) = (put_back.lock_file, self.lock.as_mut()) {
            lock.replace_file(new);
        }
        let last_seq = self.written.seq().unwrap_or(0);
        let mut data = Vec::with_capacity(256);
        crate::audit::canonical_json(
            &json!({"reason": RESTORED_REASON, "bytes": self.sink.len(), "lastSeq": last_seq}),
            &mut data,
        )?;
        let (seq, hash) = self.seal(LOG_RESTORED, TOOL_RUN, None, &data);
        self.set_head(seq, hash.as_str());
        self.notice = Some(format!(
            "audit log {} was removed while this run was writing it (cargo clean?): put back from the open file ({} bytes, through record {last_seq}); the chain continues",
            self.path.display(),
            self.sink.len()
        ));
        Ok(())
    }

    /// Commits the active file, renames it to the next segment ([`super::rotate`]) and starts
    /// a new active file with a `segment_started` record (written, anchored and, policy
    /// permitting, synced).
    fn rotate(&mut self) -> Result<(), AuditError> {
        let Some(segment) = rotate::next_segment(self.dir()?, &self.path)? else {
            self.numbers_exhausted = true;
            return Ok(());
        };
        self.commit()?;
        self.release_reservation()
            .map_err(AuditError::io("release the reserved tail of", &self.path))?;
        rotate::close_into(self.dir()?, &self.path, &segment)?;
        let file = match open_active(self.dir()?, &self.path, true) {
            Ok(f) => f,
            Err(e) => {
                self.poisoned = Some(format!("rotation failed: {e}"));
                return Err(e);
            }
        };
        self.sink.replace_file(file, 0);
        self.start_segment(&segment)
    }

    /// Writes the first record of a new active file, continuing `previous` (a segment).
    fn start_segment(&mut self, previous: &Path) -> Result<(), AuditError> {
        let (seq, hash) = self
            .written
            .get()
            .expect("a segment is only started after records");
        let data = rotate::segment_started(previous, seq, hash)?;
        let (seq, hash) = self.seal(SEGMENT_STARTED, TOOL_RUN, None, &data);
        self.set_head(seq, hash.as_str());
        self.rotatable = false;
        self.commit()?;
        if self.opts.fsync != FsyncPolicy::Never
            && let Ok(dir) = self.dir()
        {
            rotate::sync_dir(dir);
        }
        Ok(())
    }

    /// Whether `flush` rewrites the anchor now (see [`super::anchor`]).
    fn anchor_due(&self) -> bool {
        self.anchoring.due(&self.written, self.mono_now())
    }

    /// The anchor rewrite [`AuditLog::flush`] would do now, prepared (sealed) but not written:
    /// `run` writes it after the session's lock is released and the call it serves has gone
    /// out ([`Anchoring::take_update`]); `commit` writes its own.
    pub fn take_anchor_update(&mut self) -> Option<AnchorUpdate> {
        if self.poisoned.is_some() {
            return None;
        }
        let now = self.mono_now();
        self.anchoring
            .take_update(self.sealer.key(), &self.written, self.sink.len(), now)
    }

    /// Rewrites the anchor to name the last record written.
    fn write_anchor(&mut self) -> Result<(), AuditError> {
        let now = self.mono_now();
        self.anchoring
            .write(self.sealer.key(), &self.written, self.sink.len(), now)
    }

    /// A status line about what the writer did by itself (a removed file put back), once.
    pub fn take_notice(&mut self) -> Option<String> {
        self.notice.take()
    }

    fn corrupt(&self, reason: String) -> AuditError {
        AuditError::CorruptTail {
            path: self.path.clone(),
            reason,
        }
    }
}

/// The output (the file's side is [`Sink`]'s): what the writer does when the sink reports a
/// fault.
impl AuditLog {
    /// Copies the batch into the mapped reservation ([`Sink::copy`]). `None`: not mapping (the
    /// caller `write`s, now and from then on).
    fn copy_to_map(&mut self) -> Option<std::io::Result<usize>> {
        let now = self.mono_now();
        match self.sink.copy(&self.batch, now) {
            CopyOutcome::NotMapped => None,
            CopyOutcome::Copied => Some(Ok(self.batch.len())),
            CopyOutcome::Removed => {
                if let Err(e) = self.restore_removed() {
                    return Some(Err(std::io::Error::other(e.to_string())));
                }
                // Into the file put back (its own reservation), with the new record.
                self.copy_to_map()
            }
            CopyOutcome::Broken(b) => Some(Err(self.broken(b))),
        }
    }

    /// The writer fails closed on what the sink reports: every later append fails.
    fn broken(&mut self, b: Broken) -> std::io::Error {
        match b {
            Broken::CutShort => self.cut_short(),
            Broken::NotCutBack(reason, e) => {
                self.poisoned = Some(reason);
                e
            }
        }
    }

    /// The file was cut shorter than the records this writer put in it (someone truncated it
    /// while it was mapped, see [`crate::base::sys::mapped`]): mapping stops, nothing is cut or
    /// grown back (the file is not what this writer wrote any more), and the writer is
    /// poisoned: every later append fails (fail closed: no call is forwarded unrecorded), and
    /// the next start sets the log aside (shorter than its anchor).
    fn cut_short(&mut self) -> std::io::Error {
        self.sink.stop_mapping();
        let now = self
            .dir()
            .ok()
            .and_then(|d| d.metadata(&super::lock::beside(&self.path)).ok())
            .map(|m| m.len);
        let reason = format!(
            "cut short by another process while this run was writing it (the file has {} bytes; \
             the records this run wrote or was writing end at byte {}); \
             the records past the cut are lost; the next `cargo mcp-dev run` sets it aside and starts a new chain",
            now.map_or_else(|| "?".to_string(), |n| n.to_string()),
            self.sink.len() + self.batch.len() as u64
        );
        // The anchor names the last record this writer wrote, whatever it lagged: the next
        // start then finds the log shorter than its anchor and sets it aside, instead of
        // continuing the chain from an older anchored record that the cut happened to spare
        // (which would hide the records lost after it).
        let _ = self.write_anchor();
        self.poisoned = Some(reason.clone());
        std::io::Error::other(reason)
    }

    /// Makes the next reservation now, while nothing waits on the log ([`Sink::reserve_ahead`]):
    /// `run` calls it after delivering an answer, when no call is on its way to a server and no
    /// record is pending. With `prepare`, it returns the pages of the next
    /// [`PREPARE_BYTES`](super::sink::PREPARE_BYTES) past the records to make writable (after
    /// the caller releases its own lock).
    pub fn reserve_ahead(&mut self, prepare: bool) -> Result<Option<PreparePages>, AuditError> {
        if !self.batch.is_empty() {
            return Ok(None);
        }
        self.sink.reserve_ahead(prepare).map_err(|b| {
            let e = self.broken(b);
            AuditError::io("reserve audit log space", &self.path)(e)
        })
    }

    /// Unmaps the reservation and cuts the file back to its records (at exit, before a
    /// rotation, and when mapping stops): a file nobody writes ends with its last record. A
    /// failure poisons the writer (a `write` would land past the reserved bytes).
    pub fn release_reservation(&mut self) -> std::io::Result<()> {
        self.sink.release().map_err(|b| self.broken(b))
    }

    fn sync_file(&mut self) -> Result<(), AuditError> {
        match self.sink.sync() {
            Ok(true) => Ok(()),
            Ok(false) => {
                let _ = self.cut_short();
                Err(self.corrupt(self.poisoned.clone().unwrap_or_default()))
            }
            Err(e) => Err(AuditError::io("sync audit log", &self.path)(e)),
        }
    }
}

/// What the tests of the writer's parts read of its state.
#[cfg(test)]
impl AuditLog {
    pub(super) fn sink(&self) -> &Sink {
        &self.sink
    }

    /// A reservation through `end` ([`Sink`]'s), failing closed as a flush would (the mapped
    /// reservation is Linux's).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(super) fn reserve(&mut self, end: u64) -> Result<(), Option<std::io::Error>> {
        self.sink.reserve(end).map_err(|b| Some(self.broken(b)))
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        let _ = self.commit();
        let _ = self.release_reservation();
    }
}

/// What the writer's tests in every file of `audit/` share.
#[cfg(test)]
#[allow(unused_imports)]
pub(crate) mod testing {
    pub(crate) use crate::audit::AuditError;
    pub(crate) use crate::audit::chain::{GENESIS_PREV, Record, verify_anchor_mac};
    pub(crate) use crate::audit::clock::Moment;
    pub(crate) use crate::audit::keys::KeyStore;
    pub(crate) use crate::audit::lock::{WriterLock, lock_path};
    pub(crate) use crate::audit::scan;
    pub(crate) use crate::audit::sink::LENGTH_CHECK_EVERY;
    pub(crate) use crate::audit::writer::FsyncPolicy;
    pub(crate) use crate::audit::writer::{ANCHOR_LAG, AuditLog, AuditOptions};
    pub(crate) use serde_json::json;
    pub(crate) use std::fs::File;
    pub(crate) use std::io::Write;
    pub(crate) use std::os::unix::fs::PermissionsExt;
    pub(crate) use std::path::{Path, PathBuf};
    pub(crate) use std::time::Duration;

    pub(crate) fn setup() -> (tempfile::TempDir, KeyStore, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("logs/deep/audit.jsonl");
        (tmp, keys, path)
    }

    /// A writer of `path` with one record committed.
    pub(crate) fn writer_with_one_record(path: &Path, keys: &KeyStore) -> AuditLog {
        let mut log = AuditLog::open(path, keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        log
    }

    /// Cuts the file at `path` to `len` bytes, as another process would.
    pub(crate) fn cut_file(path: &Path, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    /// The records' lines (without the space an open writer reserved past them).
    pub(crate) fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .trim_end_matches('\0')
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;

    #[test]
    fn a_set_moment_is_the_time_of_what_is_sealed_and_anchored_until_cleared() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("run_started", "R1", None, json!({"agentRun": "R1"}))
            .unwrap();
        log.flush().unwrap();
        assert!(!log.anchor_due(), "the first flush anchors");
        let wall = std::time::UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        // A moment past the anchor's lag: due at once, though no time passed.
        log.set_moment(Moment {
            mono: Instant::now() + ANCHOR_LAG * 2,
            wall,
        });
        log.append("tool_called", "R1", Some("E1"), json!({"tool": "t"}))
            .unwrap();
        log.write_pending().unwrap();
        assert!(log.anchor_due(), "the anchor's lag is read from the moment");
        log.clear_moment();
        assert!(!log.anchor_due(), "cleared: read from the clock again");
        log.append("tool_result", "R1", Some("E1"), json!({"tool": "t"}))
            .unwrap();
        log.write_pending().unwrap();
        let l = lines(&path);
        let called = Record::from_line(&l[1]).unwrap();
        let result = Record::from_line(&l[2]).unwrap();
        assert_eq!(called.time, "2025-11-24T16:00:00.123Z");
        let now = humantime::parse_rfc3339(&result.time).unwrap();
        assert!(now > wall + Duration::from_secs(86_400), "{}", result.time);
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
        assert!(lines(&path).is_empty(), "append only seals into the batch");
        assert!(keys.read_anchor(&path).unwrap().is_none());
        log.flush().unwrap();
        let l = lines(&path);
        assert_eq!(l.len(), 2);
        let r1 = Record::from_line(&l[0]).unwrap();
        let r2 = Record::from_line(&l[1]).unwrap();
        assert_eq!(r1.prev, GENESIS_PREV);
        assert_eq!(r2.prev, a.hash.as_str());
        assert_eq!(r2.hash, b.hash.as_str());
        assert_eq!(r2.epoch.as_deref(), Some("E1"));
        assert!(
            humantime::parse_rfc3339(&r2.time).is_ok() && r2.time.len() == 24,
            "{}",
            r2.time
        );
        let anchor = keys.read_anchor(&path).unwrap().unwrap();
        assert_eq!((anchor.seq, anchor.hash.as_str()), (2, b.hash.as_str()));
        let key = keys.load_key().unwrap();
        assert!(verify_anchor_mac(&key, 2, b.hash.as_str(), &anchor.mac).unwrap());
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
            log.flush().unwrap();
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
