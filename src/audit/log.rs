//! The append-only writer. Owns the log file handle, the writer lock, the in-memory batch of
//! sealed records, the anchor updates, the fsync policy and segment rotation. Must not touch:
//! record content (callers choose `data`; the bytes are defined by [`super::chain`]), policy,
//! stdout.
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
//! past the cut is caught ([`crate::sys::mapped`]) and the writer fails closed from then on
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
//! # Opening: only the tail is read
//!
//! The anchor records where its record ends in the active file (`offset`, see [`super::keys`]).
//! `open` reads that record, checks it against the sealed anchor (seq, hash, the record's hash
//! and MAC), then checks every record after it (the unanchored tail: a crash's worth) fully and
//! continues the chain from the last one. Start therefore costs the same on a 1 GB log as on an
//! empty one. Records before the anchored one are *not* re-checked at start: a record changed
//! in the middle of the log is found by `audit verify` (and reported there with its line), not
//! by `run` (a deliberate change from issue 12, see `docs/SECURITY.md`). An anchor without an
//! offset (written before issue 15), or an offset that does not point at the anchored record,
//! makes `open` scan the active file once and rewrite the anchor with the offset.
//!
//! Fail closed: `open` refuses to extend a log whose tail does not check (a hash or MAC that
//! does not match, another key, an incomplete line at or before the anchored record), which is
//! shorter than its anchor says, or whose anchor is missing or invalid: writing onto a broken
//! chain would bury the damage. [`super::recover::open_for_run`] sets such a log aside. An
//! incomplete last line *after* the anchored head and the whole records that follow it, that is
//! a prefix of the next record's line, is what a crash mid-`write` leaves (the anchor is
//! rewritten only after its record's whole line is written): `open` reports it as
//! [`AuditError::TornTail`], and `open_for_run` moves those bytes aside and continues the chain
//! from the last whole record. So does an active file holding only such a line while the anchor
//! names the last record of the newest segment (the first write after a rotation, cut short).
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
//! # Segments
//!
//! When a record would take the active file past `max_segment_bytes`, the file is committed,
//! renamed to the next segment name (see [`super::scan`]) and a new active file is started whose
//! first record, [`super::record_type::SEGMENT_STARTED`], names the previous segment's file
//! name, last seq and hash; seq continues. Rotation happens inside `append` (the only time it
//! does I/O).

use super::AuditError;
use super::chain::{
    AuditKey, FORMAT_VERSION, GENESIS_PREV, Header, Hex64, MacChecker, Record, RecordData,
    anchor_mac, verify_anchor_mac,
};
use super::keys::{self, Anchor, AnchorFile, KeyStore};
use super::scan::{self, Expect, Last};
use crate::sys::mapped::{self, MappedRegion, PreparePages};
use serde_json::json;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
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
/// The anchor is rewritten by `flush` when its last write is older than this.
pub const ANCHOR_LAG: Duration = Duration::from_millis(200);

/// A flush through the map compares the file's length with the end of the records it is about
/// to copy (one `fstat`) when the last comparison is older than this: every flush at a host's
/// pace, about one in forty back to back. A file cut at or past the records' end (its
/// reservation's NUL bytes trimmed) neither faults nor loses a newline, so this is what finds
/// it before the next call is forwarded (see `docs/SECURITY.md`).
pub const LENGTH_CHECK_EVERY: Duration = Duration::from_millis(1);
/// Default size at which the active file rotates into a segment (config
/// `audit-max-segment-bytes`).
pub const DEFAULT_MAX_SEGMENT_BYTES: u64 = 64 << 20;
/// How much space past the records a writer reserves and maps at a time (at least a batch):
/// about 2,500 calls' records, and no more than that much of the file in this process's memory.
pub const RESERVE_BYTES: u64 = 1 << 20;

/// How far past the records [`AuditLog::reserve_ahead`] keeps the mapped pages writable: 32 KiB,
/// the records of about thirty calls.
pub const PREPARE_BYTES: u64 = 32 << 10;

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
    file: File,
    /// Always `Some` while the log is usable (taken back out only by a failed open).
    lock: Option<WriterLock>,
    path: PathBuf,
    canonical_path: String,
    /// Shared with the [`AnchorUpdate`]s handed out (each writes it after the caller's lock).
    anchor: Arc<Mutex<AnchorFile>>,
    anchor_path: PathBuf,
    key: AuditKey,
    opts: AuditOptions,
    /// Length of the active file's records (everything written by this writer, or found at
    /// open); the file itself can be longer by a reservation (see `mapped`).
    len: u64,
    /// The reserved, mapped space the next batches are copied into (`None`: not reserved yet,
    /// or writing with `write`).
    mapped: Option<MappedRegion>,
    /// The file's length when a reservation made it longer than `len` (what `release` cuts).
    reserved_to: Option<u64>,
    /// Whether batches go through the map (cleared for good when a reservation fails).
    map_batches: bool,
    /// The last record in the file: `(seq, hash)`.
    written: Option<(u64, String)>,
    /// The last record sealed (in the batch or in the file).
    head: Option<(u64, String)>,
    /// Sealed lines not yet written.
    batch: Vec<u8>,
    /// File length at the last fsync (a commit with nothing new does not fsync again).
    synced_len: u64,
    /// Seq named by the anchor on disk, and when this writer last wrote it.
    anchored: Option<u64>,
    anchored_at: Instant,
    /// When a flush last compared the file's length with the records' (see
    /// [`LENGTH_CHECK_EVERY`]); `None`: not yet.
    length_checked: Option<Instant>,
    /// The anchor was rewritten since its last fsync.
    anchor_unsynced: bool,
    /// Seq of the last [`AnchorUpdate`] handed out since the last commit.
    handed_out: Option<u64>,
    /// Whether the active file holds a record besides its opening `segment_started` (a file is
    /// rotated only then, so one oversized record cannot rotate forever).
    rotatable: bool,
    /// No segment number is left above the highest one present (a file planted under the
    /// largest): the active file grows instead of rotating.
    numbers_exhausted: bool,
    /// Set when a failed write could not be cut back: the file may end in a partial line, so
    /// nothing more is written to it.
    poisoned: Option<String>,
    clock: RecordClock,
    /// The time of the event being handled, when the caller set one ([`AuditLog::set_moment`]):
    /// records, the anchor's lag and the length check read it instead of the clocks.
    moment: Option<Moment>,
    /// Scratch space for the hashed body of the record being sealed.
    body: Vec<u8>,
    /// What the writer did by itself that its user should be told (one status line), until
    /// [`AuditLog::take_notice`].
    notice: Option<String>,
}

/// The `time` of records: RFC 3339, UTC, milliseconds. The text up to the second is kept and
/// reused within that second (formatting a date per record was a visible share of a call).
#[derive(Debug, Default)]
struct RecordClock {
    second: u64,
    /// `2025-06-01T12:00:00.` for `second`; empty before the first stamp.
    prefix: String,
    /// The last stamp (reused: no string per record).
    stamp: String,
}

/// One reading of both clocks: the time of an event, shared by everything done for it (a call
/// read the clocks ten times, at ~25 ns each, before `run` took one reading per event).
#[derive(Debug, Clone, Copy)]
pub struct Moment {
    pub mono: Instant,
    pub wall: SystemTime,
}

impl Moment {
    pub fn now() -> Moment {
        Moment {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

impl RecordClock {
    fn stamp(&mut self, t: SystemTime) -> &str {
        let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        if self.prefix.is_empty() || since.as_secs() != self.second {
            let full = humantime::format_rfc3339_millis(t).to_string();
            // `YYYY-MM-DDTHH:MM:SS.mmmZ`: keep through the `.`.
            self.prefix = full[..full.len() - 4].to_string();
            self.second = since.as_secs();
        }
        let ms = since.subsec_millis();
        self.stamp.clear();
        self.stamp.push_str(&self.prefix);
        for d in [ms / 100, ms / 10 % 10, ms % 10] {
            self.stamp.push(char::from(b'0' + d as u8));
        }
        self.stamp.push('Z');
        &self.stamp
    }
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
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(AuditError::io("create directory", parent))?;
        // The log's canonical path as it will resolve once the file exists (its last
        // component is never followed: `open_active` refuses a link there).
        let canonical = std::fs::canonicalize(parent)
            .map_err(AuditError::io("resolve the path of", parent))?
            .join(path.file_name().unwrap_or_default());
        keys.ensure_anchor_dir()?;
        let guard = keys
            .anchor_path_for_canonical(&canonical)
            .with_extension("writer.lock");
        WriterLock::acquire(path, &guard, canonical, opts.lock_wait)
    }

    /// The second half of [`AuditLog::open_with`]; a failure hands the lock back.
    pub(crate) fn open_locked(
        path: &Path,
        keys: &KeyStore,
        opts: &AuditOptions,
        lock: WriterLock,
    ) -> Result<AuditLog, (AuditError, Option<WriterLock>)> {
        let prepared = (|| {
            let file = open_active(path, false)?;
            let key = keys.load_or_create_key()?;
            keys.ensure_anchor_dir()?;
            let canonical =
                std::fs::canonicalize(path).map_err(AuditError::io("resolve the path of", path))?;
            if canonical != lock.canonical {
                return Err(AuditError::io("open", path)(std::io::Error::other(
                    format!(
                        "it now resolves to {}, not {} where its writer lock was taken (a link?)",
                        canonical.display(),
                        lock.canonical.display()
                    ),
                )));
            }
            let canonical_path = canonical.to_string_lossy().into_owned();
            let anchor =
                AnchorFile::open(&keys.anchor_path_for_canonical(&canonical), &canonical_path)?;
            Ok((file, key, canonical_path, anchor))
        })();
        let (file, key, canonical_path, anchor) = match prepared {
            Ok(p) => p,
            Err(e) => return Err((e, Some(lock))),
        };
        let mut log = AuditLog {
            file,
            lock: Some(lock),
            path: path.to_owned(),
            canonical_path,
            anchor_path: anchor.path().to_owned(),
            anchor: Arc::new(Mutex::new(anchor)),
            key,
            opts: opts.clone(),
            len: 0,
            mapped: None,
            reserved_to: None,
            map_batches: opts.write_through_map,
            synced_len: 0,
            written: None,
            head: None,
            batch: Vec::with_capacity(16 << 10),
            anchored: None,
            anchor_unsynced: false,
            handed_out: None,
            // Stale from the start: the first flush after a quiet time anchors at once.
            anchored_at: Instant::now()
                .checked_sub(ANCHOR_LAG)
                .unwrap_or_else(Instant::now),
            length_checked: None,
            rotatable: false,
            numbers_exhausted: false,
            poisoned: None,
            clock: RecordClock::default(),
            moment: None,
            body: Vec::with_capacity(1 << 10),
            notice: None,
        };
        match log.read_tail() {
            Ok(()) => Ok(log),
            Err(e) => {
                let lock = log.lock.take();
                Err((e, lock))
            }
        }
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
                && self.len + self.batch.len() as u64 > self.opts.max_segment_bytes
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

    /// Seals a record onto the head and appends its line (with its `\n`) to the batch, from
    /// the log's own buffers (no `Record`, no string per field); the head is not moved
    /// ([`AuditLog::set_head`]).
    fn seal(
        &mut self,
        record_type: &str,
        run: &str,
        epoch: Option<&str>,
        data: &[u8],
    ) -> (u64, Hex64) {
        let AuditLog {
            head,
            batch,
            body,
            key,
            clock,
            moment,
            ..
        } = self;
        let (seq, prev) = match head {
            Some((seq, hash)) => (*seq + 1, hash.as_str()),
            None => (1, GENESIS_PREV),
        };
        let header = Header {
            v: FORMAT_VERSION,
            seq,
            time: clock.stamp(moment.map_or_else(SystemTime::now, |m| m.wall)),
            record_type,
            run,
            epoch,
            prev,
        };
        let (hash, _mac) = header.seal_into(key, data, body, batch);
        batch.push(b'\n');
        (seq, hash)
    }

    fn set_head(&mut self, seq: u64, hash: &str) {
        match &mut self.head {
            Some((s, h)) => {
                *s = seq;
                h.clear();
                h.push_str(hash);
            }
            None => self.head = Some((seq, hash.to_owned())),
        }
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

    fn anchor_due(&self) -> bool {
        self.anchored != self.written.as_ref().map(|w| w.0)
            && self.mono_now().saturating_duration_since(self.anchored_at) >= ANCHOR_LAG
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

    /// The anchor rewrite [`AuditLog::flush`] would do now, prepared (sealed) but not written:
    /// `run` writes it after the session's lock is released and the call it serves has gone
    /// out, so a host's call neither waits for it before being forwarded nor behind it for the
    /// lock. The anchor still only ever names records already written; one prepared earlier
    /// never replaces a newer one ([`AnchorUpdate::write`]); `commit` writes its own.
    pub fn take_anchor_update(&mut self) -> Option<AnchorUpdate> {
        if self.poisoned.is_some() || !self.anchor_due() {
            return None;
        }
        let anchor = self.anchor_now()?;
        self.mark_anchored(anchor.seq);
        self.handed_out = Some(anchor.seq);
        Some(AnchorUpdate {
            file: Arc::clone(&self.anchor),
            anchor,
        })
    }

    /// Flush, then fsync the log (unless the policy is [`FsyncPolicy::Never`]), rewrite the
    /// anchor and fsync it: the caller's epoch boundaries and exit.
    pub fn commit(&mut self) -> Result<(), AuditError> {
        self.check_poisoned()?;
        // Not rate-limited here: a commit is rare (epoch boundary, rotation, exit), and a file
        // removed since the last flush must be put back before it is synced, renamed into a
        // segment or closed (its records would go with it).
        // (Without the lock, this is a failed open being dropped: it has no records to keep.)
        if self.lock.is_some() && self.file_state(0) == FileState::Removed {
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
        let update_unwritten = self.handed_out.take().is_some_and(|seq| {
            self.anchor_file()
                .written_seq()
                .is_none_or(|on_file| on_file < seq)
        });
        if update_unwritten || self.anchored != self.written.as_ref().map(|w| w.0) {
            self.write_anchor()?;
        }
        // Also an anchor `flush` rewrote (timer) since the last commit.
        if sync && self.anchor_unsynced {
            self.anchor_file().sync()?;
            self.anchor_unsynced = false;
        }
        Ok(())
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
        self.head.as_ref().map(|(s, h)| (*s, h.as_str()))
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
        let before = self.len;
        let result = match self.copy_to_map() {
            Some(copied) => copied,
            None if self.length_check_due() && self.file_state(0) == FileState::Removed => {
                self.restore_removed()?;
                return self.write_batch();
            }
            None => loop {
                match (&self.file).write(&self.batch) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            },
        };
        // A short write (a signal, a size limit, a full disk) continues with the rest, which
        // either completes the batch or fails with the cause (EFBIG, ENOSPC) for the message.
        let result = match result {
            Ok(n) if n < self.batch.len() && n > 0 => (&self.file)
                .write_all(&self.batch[n..])
                .map(|()| self.batch.len()),
            other => other,
        };
        let error = match result {
            Ok(n) if n == self.batch.len() => {
                self.len += n as u64;
                self.batch.clear();
                // In place: no new string per write.
                match (&mut self.written, &self.head) {
                    (Some(w), Some(h)) => {
                        w.0 = h.0;
                        w.1.clone_from(&h.1);
                    }
                    (w, h) => *w = h.clone(),
                }
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
        if let Err(cut) = self.file.set_len(before) {
            self.poisoned = Some(format!(
                "a failed write ({error}) could not be cut back ({cut}): the file may end in a partial line"
            ));
        }
        Err(AuditError::io("append to audit log", &self.path)(error))
    }

    /// Copies the batch into the mapped reservation, reserving (and mapping) the next part of
    /// the file first when it does not fit. `None`: not mapping (off, or a reservation failed:
    /// the reservation is cut back and the caller `write`s, now and from then on).
    fn copy_to_map(&mut self) -> Option<std::io::Result<usize>> {
        if !self.map_batches {
            return None;
        }
        let end = self.len + self.batch.len() as u64;
        if self.mapped.as_ref().is_none_or(|m| end > m.end())
            && let Err(e) = self.reserve(end)
        {
            return e.map(Err);
        }
        // Not mapped: the reservation failed and was cut back, the caller writes.
        self.mapped.as_ref()?;
        if self.length_check_due() {
            match self.file_state(end) {
                FileState::Linked => {}
                FileState::Shorter => return Some(Err(self.cut_short())),
                FileState::Removed => {
                    if let Err(e) = self.restore_removed() {
                        return Some(Err(std::io::Error::other(e.to_string())));
                    }
                    // Into the file put back (its own reservation), with the new record.
                    return self.copy_to_map();
                }
            }
        }
        let region = self.mapped.as_mut()?;
        // Cut inside the page being written, below the records' end: the kernel zeroed the
        // rest of that page, and a copy into it would not fault (see `byte_before`).
        if region.byte_before(self.len).is_some_and(|b| b != b'\n') {
            return Some(Err(self.cut_short()));
        }
        region.copy_at(self.len, &self.batch);
        if region.cut_short() {
            return Some(Err(self.cut_short()));
        }
        Some(Ok(self.batch.len()))
    }

    /// Whether the file is now shorter than `len` bytes: cut by someone else (one `fstat`).
    fn file_shorter_than(&self, len: u64) -> bool {
        self.file_state(len) == FileState::Shorter
    }

    /// Whether the file is still linked and at least `len` bytes long (one `fstat`).
    fn file_state(&self, len: u64) -> FileState {
        use std::os::unix::fs::MetadataExt;
        match self.file.metadata() {
            Ok(m) if m.nlink() == 0 => FileState::Removed,
            Ok(m) if m.len() < len => FileState::Shorter,
            _ => FileState::Linked,
        }
    }

    /// Whether a flush compares the file with the records now: at most once per
    /// [`LENGTH_CHECK_EVERY`] (this takes the turn).
    fn length_check_due(&mut self) -> bool {
        let now = self.mono_now();
        let due = self
            .length_checked
            .is_none_or(|at| now.saturating_duration_since(at) >= LENGTH_CHECK_EVERY);
        if due {
            self.length_checked = Some(now);
        }
        due
    }

    /// The active file was removed while this writer had it open (`cargo clean` takes the
    /// whole target directory): every record would go on into a file nobody can read, and
    /// the calls they record would be forwarded all the same. The file is put back at its
    /// path from the open descriptor (this writer's records are the whole file, read back
    /// with `pread`), under the writer lock (taken again where it went too), synced, and a
    /// sealed [`super::record_type::LOG_RESTORED`] record joins the batch: the chain and the
    /// anchor go on unchanged. Segments already rotated out were closed files and are gone
    /// with the directory; `audit verify` reports the first one missing.
    /// What cannot be done fails closed (poisoned): a file or another writer already at the
    /// path (never overwritten), a directory that cannot be made.
    fn restore_removed(&mut self) -> Result<(), AuditError> {
        let restored = (|| {
            if let Some(parent) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(AuditError::io("create directory", parent))?;
                // The directories made again must be where they were: a link planted in their
                // place (by whoever can write the target directory) is not followed.
                let now = std::fs::canonicalize(parent)
                    .map_err(AuditError::io("resolve the path of", parent))?;
                // The path, not its lossy text: a directory name that is not UTF-8 must
                // match itself (red-team, session 22).
                let was = self.lock.as_ref().map_or_else(
                    || PathBuf::from(&self.canonical_path),
                    |l| l.canonical.clone(),
                );
                if Some(now.as_path()) != was.parent() {
                    return Err(
                        AuditError::io("put back the removed audit log", &self.path)(
                            std::io::Error::other(format!(
                                "its directory now resolves to {} (a link?)",
                                now.display()
                            )),
                        ),
                    );
                }
            }
            // `<log>.lock` went with the directory: taken again. A writer sharing this one's
            // guard never takes it (the guard comes first), so whoever holds it reached the
            // log another way (another state directory, a bind mount): a second writer, and
            // the file is not put back under it.
            let lock_file = if self.lock_still_linked() {
                None
            } else {
                Some(WriterLock::lock_file(&self.path, Duration::ZERO)?)
            };
            let file = open_active(&self.path, true)?;
            let copy = |file: &File| -> std::io::Result<()> {
                self.copy_records_to(file)?;
                if let Some(dir) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    File::open(dir)?.sync_all()?;
                }
                Ok(())
            };
            if let Err(e) = copy(&file) {
                // Not left half-copied at the path: the next start would take it for a log.
                let _ = std::fs::remove_file(&self.path);
                return Err(AuditError::io("put back the removed audit log", &self.path)(e));
            }
            Ok((lock_file, file))
        })();
        let (lock_file, file) = match restored {
            Ok(r) => r,
            Err(e) => {
                self.mapped = None;
                self.map_batches = false;
                self.reserved_to = None;
                // Its records are still only in the removed file: kept beside the anchor (the
                // user's state directory, outside the target directory) before the writer stops.
                let kept = match self.keep_removed_records() {
                    Ok(at) => format!(
                        "its {} bytes of records are kept in {}",
                        self.len,
                        at.display()
                    ),
                    Err(k) => format!("its records could not be kept ({k})"),
                };
                let reason = format!(
                    "removed while this run was writing it (cargo clean?), and it could not be \
                     put back ({e}); {kept}; restart `cargo mcp-dev run` to start a new chain"
                );
                self.poisoned = Some(reason.clone());
                return Err(self.corrupt(reason));
            }
        };
        // The removed file's map and reservation go with it.
        self.mapped = None;
        self.reserved_to = None;
        self.file = file;
        if let (Some(new), Some(lock)) = (lock_file, self.lock.as_mut()) {
            lock.file = new;
        }
        self.synced_len = self.len;
        let last_seq = self.written.as_ref().map_or(0, |w| w.0);
        let reason = "the active file was removed while this run was writing it (cargo clean?); put back from the writer's open file";
        let mut data = Vec::with_capacity(256);
        crate::audit::canonical_json(
            &json!({"reason": reason, "bytes": self.len, "lastSeq": last_seq}),
            &mut data,
        )?;
        let (seq, hash) = self.seal(
            super::record_type::LOG_RESTORED,
            super::recover::TOOL_RUN,
            None,
            &data,
        );
        self.set_head(seq, hash.as_str());
        self.notice = Some(format!(
            "audit log {} was removed while this run was writing it (cargo clean?): put back from the open file ({} bytes, through record {last_seq}); the chain continues",
            self.path.display(),
            self.len
        ));
        Ok(())
    }

    /// Copies the records of a removed log that cannot be put back to a new file beside its
    /// anchor: `<anchor name>.removed-<pid>-<ms>.jsonl` (never an existing file).
    fn keep_removed_records(&self) -> std::io::Result<PathBuf> {
        let ms = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let mut name = self
            .anchor_path
            .file_stem()
            .unwrap_or_default()
            .to_os_string();
        name.push(format!(".removed-{}-{ms}.jsonl", std::process::id()));
        let at = self.anchor_path.with_file_name(name);
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(keys::nofollow())
            .open(&at)?;
        self.copy_records_to(&out)?;
        Ok(at)
    }

    /// Writes this writer's records (the first `len` bytes of its open file, read with
    /// `pread`) to `out` and syncs it and its directory.
    fn copy_records_to(&self, out: &File) -> std::io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        let mut at = 0;
        while at < self.len {
            let want = buf.len().min((self.len - at) as usize);
            let n = self.file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            (&*out).write_all(&buf[..n])?;
            at += n as u64;
        }
        out.sync_all()?;
        Ok(())
    }

    /// Whether `<log>.lock` is still the file this writer holds locked.
    fn lock_still_linked(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(lock) = &self.lock else {
            return false;
        };
        match (
            lock.file.metadata(),
            std::fs::symlink_metadata(lock_path(&self.path)),
        ) {
            (Ok(h), Ok(p)) => h.nlink() > 0 && h.dev() == p.dev() && h.ino() == p.ino(),
            _ => false,
        }
    }

    /// A status line about what the writer did by itself (a removed file put back), once.
    pub fn take_notice(&mut self) -> Option<String> {
        self.notice.take()
    }

    /// The file was cut shorter than the records this writer put in it (someone truncated it
    /// while it was mapped, see [`crate::sys::mapped`]): mapping stops, nothing is cut or
    /// grown back (the file is not what this writer wrote any more), and the writer is
    /// poisoned: every later append fails (fail closed: no call is forwarded unrecorded), and
    /// the next start sets the log aside (shorter than its anchor).
    fn cut_short(&mut self) -> std::io::Error {
        self.mapped = None;
        self.map_batches = false;
        self.reserved_to = None;
        let now = std::fs::metadata(&self.path).map(|m| m.len()).ok();
        let reason = format!(
            "cut short by another process while this run was writing it (the file has {} bytes; \
             the records this run wrote or was writing end at byte {}); \
             the records past the cut are lost; the next `cargo mcp-dev run` sets it aside and starts a new chain",
            now.map_or_else(|| "?".to_string(), |n| n.to_string()),
            self.len + self.batch.len() as u64
        );
        // The anchor names the last record this writer wrote, whatever it lagged: the next
        // start then finds the log shorter than its anchor and sets it aside, instead of
        // continuing the chain from an older anchored record that the cut happened to spare
        // (which would hide the records lost after it).
        let _ = self.write_anchor();
        self.poisoned = Some(reason.clone());
        std::io::Error::other(reason)
    }

    /// Reserves and maps the file from the page of the last record through `end` (at least
    /// [`RESERVE_BYTES`]). On failure mapping stops for good and the reservation is cut back:
    /// `Ok(())` with nothing mapped (the caller `write`s), or `Err(Some(e))` when the cut failed
    /// (the writer is poisoned) or the file was found cut short by someone else.
    fn reserve(&mut self, end: u64) -> Result<(), Option<std::io::Error>> {
        // Cut between two copies (no fault then): a reservation would grow the file back over
        // the cut with NUL bytes and bury it.
        if self.file_shorter_than(self.len) {
            return Err(Some(self.cut_short()));
        }
        // Unmapped before the next reservation: one region of the file mapped at a time.
        self.mapped = None;
        let page = mapped::page_size();
        let start = self.len / page * page;
        let len = (end - start).max(RESERVE_BYTES).next_multiple_of(page);
        match usize::try_from(len)
            .map_err(std::io::Error::other)
            .and_then(|len| MappedRegion::reserve(&self.file, start, len))
        {
            Ok(region) => {
                self.reserved_to = Some(self.reserved_to.unwrap_or(0).max(region.end()));
                self.mapped = Some(region);
                Ok(())
            }
            Err(_) => {
                // No space to reserve, a file system that cannot, no address space for the
                // map: `write` reports what is wrong, if anything is, and is as safe. The
                // failed attempt may have grown the file all the same (`fallocate` keeps what
                // it allocated before ENOSPC, or the map failed after it): cut back to the
                // records, so the space is free and no `write` lands after it.
                self.map_batches = false;
                // The failed attempt may have grown the file by any amount: all of it is ours.
                self.reserved_to = Some(u64::MAX);
                self.release_reservation().map_err(Some)
            }
        }
    }

    /// Makes the next reservation now, while nothing waits on the log, when a quarter or less
    /// of the mapped space is left and no record is pending: otherwise the flush that crosses
    /// the end pays for `fallocate` and `mmap` (tens of µs, once per [`RESERVE_BYTES`]) on the
    /// path of the call whose intent record it writes. `run` calls it after delivering an
    /// answer, when no call is on its way to a server. A failure is the next flush's fallback
    /// (`write`), reported only if cutting the reservation back failed too.
    /// Then, with `prepare`, it returns the pages of the next [`PREPARE_BYTES`] past the
    /// records that are not writable yet ([`MappedRegion::prepare`]; the caller applies them
    /// after releasing its own lock), so the copies of the next calls' records do not fault.
    pub fn reserve_ahead(&mut self, prepare: bool) -> Result<Option<PreparePages>, AuditError> {
        let Some(end) = self.mapped.as_ref().map(MappedRegion::end) else {
            return Ok(None);
        };
        if !self.map_batches || !self.batch.is_empty() {
            return Ok(None);
        }
        if end.saturating_sub(self.len) <= RESERVE_BYTES / 4 {
            match self.reserve(self.len + 1) {
                Ok(()) | Err(None) => {}
                Err(Some(e)) => {
                    return Err(AuditError::io("reserve audit log space", &self.path)(e));
                }
            }
        }
        Ok(self
            .mapped
            .as_mut()
            .filter(|_| prepare)
            .and_then(|region| region.prepare(self.len, PREPARE_BYTES)))
    }

    /// Unmaps the reservation and cuts the file back to its records (at exit, before a
    /// rotation, and when mapping stops): a file nobody writes ends with its last record. A
    /// failure poisons the writer (a `write` would land past the reserved bytes).
    pub fn release_reservation(&mut self) -> std::io::Result<()> {
        self.mapped = None;
        if let Some(reserved_to) = self.reserved_to {
            // Someone else may have changed the length behind the map. Shorter than the
            // records: cut short (not grown back over the cut, which would bury it). Longer
            // than the reservation: what lies past it is not ours to cut (the next open
            // judges it). In between: the reservation's NUL bytes, cut off.
            match self.file.metadata().map(|m| m.len()) {
                Ok(size) if size < self.len => return Err(self.cut_short()),
                Ok(size) if size > reserved_to => {
                    self.reserved_to = None;
                    return Ok(());
                }
                _ => {}
            }
            if let Err(e) = self.file.set_len(self.len) {
                self.poisoned = Some(format!(
                    "the space reserved past the last record could not be released ({e})"
                ));
                return Err(e);
            }
            self.reserved_to = None;
        }
        Ok(())
    }

    fn sync_file(&mut self) -> Result<(), AuditError> {
        if self.synced_len == self.len {
            return Ok(());
        }
        self.file
            .sync_data()
            .map_err(AuditError::io("sync audit log", &self.path))?;
        // Synced is on disk only if the file still holds the records (a cut that no copy
        // noticed, see `LENGTH_CHECK_EVERY`): checked here, where it costs nothing beside the
        // sync, so `audit-fsync = every` never acknowledges a record that is not in the file.
        if self.file_shorter_than(self.len) {
            let _ = self.cut_short();
            return Err(self.corrupt(self.poisoned.clone().unwrap_or_default()));
        }
        self.synced_len = self.len;
        Ok(())
    }

    fn write_anchor(&mut self) -> Result<(), AuditError> {
        let Some(anchor) = self.anchor_now() else {
            return Ok(());
        };
        self.anchor_file().write(&anchor)?;
        self.mark_anchored(anchor.seq);
        Ok(())
    }

    /// The anchor naming the last record written (`None`: nothing written yet).
    fn anchor_now(&self) -> Option<Anchor> {
        let (seq, hash) = self.written.as_ref()?;
        Some(Anchor {
            log: self.canonical_path.clone(),
            seq: *seq,
            mac: anchor_mac(&self.key, *seq, hash),
            hash: hash.clone(),
            offset: Some(self.len),
        })
    }

    fn mark_anchored(&mut self, seq: u64) {
        self.anchor_unsynced = true;
        self.anchored = Some(seq);
        self.anchored_at = self.mono_now();
    }

    fn anchor_file(&self) -> MutexGuard<'_, AnchorFile> {
        // A panic while writing the anchor leaves nothing half-done that matters here: the
        // next write replaces the whole file.
        self.anchor.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits the active file, renames it to the next segment and starts a new active file
    /// with a `segment_started` record (written, anchored and, policy permitting, synced).
    fn rotate(&mut self) -> Result<(), AuditError> {
        let segments = scan::list_segments(&self.path)
            .map_err(AuditError::io("list the segments of", &self.path))?;
        let Some(next) = next_segment_number(segments.iter().map(|(n, _)| *n)) else {
            self.numbers_exhausted = true;
            return Ok(());
        };
        self.commit()?;
        self.release_reservation()
            .map_err(AuditError::io("release the reserved tail of", &self.path))?;
        let segment = scan::segment_path(&self.path, next);
        // Link + unlink: an existing segment is never overwritten.
        std::fs::hard_link(&self.path, &segment)
            .and_then(|()| std::fs::remove_file(&self.path))
            .map_err(AuditError::io("rotate audit log", &self.path))?;
        let file = match open_active(&self.path, true) {
            Ok(f) => f,
            Err(e) => {
                self.poisoned = Some(format!("rotation failed: {e}"));
                return Err(e);
            }
        };
        self.file = file;
        self.len = 0;
        self.synced_len = 0;
        self.start_segment(&segment)
    }

    /// Writes the first record of a new active file, continuing `previous` (a segment).
    fn start_segment(&mut self, previous: &Path) -> Result<(), AuditError> {
        let (seq, hash) = self
            .written
            .clone()
            .expect("a segment is only started after records");
        let mut data = Vec::new();
        crate::audit::canonical_json(
            &json!({
                "previousSegment": scan::file_name(previous),
                "previousSeq": seq,
                "previousHash": hash,
            }),
            &mut data,
        )?;
        let (seq, hash) = self.seal(
            super::record_type::SEGMENT_STARTED,
            super::recover::TOOL_RUN,
            None,
            &data,
        );
        self.set_head(seq, hash.as_str());
        self.rotatable = false;
        self.commit()?;
        if self.opts.fsync != FsyncPolicy::Never
            && let Some(dir) = self.path.parent().filter(|p| !p.as_os_str().is_empty())
            && let Ok(d) = File::open(dir)
        {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn corrupt(&self, reason: String) -> AuditError {
        AuditError::CorruptTail {
            path: self.path.clone(),
            reason,
        }
    }

    /// Checks the tail against the anchor and sets the head (see the module doc).
    fn read_tail(&mut self) -> Result<(), AuditError> {
        let anchor = keys::read_anchor_at(self.anchor_path.as_path())?;
        if let Some(a) = &anchor
            && !verify_anchor_mac(&self.key, a.seq, &a.hash, &a.mac).unwrap_or(false)
        {
            return Err(self.corrupt(format!(
                "its anchor {} has an invalid MAC",
                self.anchor_path.as_path().display()
            )));
        }
        let file_len = self
            .file
            .metadata()
            .map_err(AuditError::io("inspect audit log", &self.path))?
            .len();
        // Space a writer reserved and did not release (it was killed) is never records (a
        // record has no NUL byte): the records are judged without it, and it is cut off only
        // once they pass (a log set aside keeps every byte it had).
        let len = scan::data_end(&self.file, file_len)
            .map_err(AuditError::io("read audit log", &self.path))?;
        let leftover = (len < file_len).then_some(file_len);
        let segments = scan::list_segments(&self.path)
            .map_err(AuditError::io("list the segments of", &self.path))?;
        let mac = MacChecker::new(&self.key);
        if len == 0 {
            let Some(a) = anchor else {
                if let Some((_, last)) = segments.last() {
                    return Err(self.corrupt(format!(
                        "the active file is empty and has no anchor, but segment {} exists",
                        last.display()
                    )));
                }
                return self.cut_leftover(len, leftover);
            };
            // A crash between renaming the active file to a segment and writing the new
            // file's first record: continue from that segment if it ends at the anchor.
            if let Some((_, last)) = segments.last()
                && segment_ends_at(last, &a, &mac)
            {
                self.cut_leftover(len, leftover)?;
                self.written = Some((a.seq, a.hash.clone()));
                self.head = self.written.clone();
                return self.start_segment(last);
            }
            let what = match file_len {
                0 => "the log is empty".to_string(),
                n => format!("the log holds no record (only {n} NUL bytes)"),
            };
            return Err(self.corrupt(format!("{what} but its anchor records head seq {}", a.seq)));
        }
        let Some(a) = anchor else {
            // The last record's own problems first (a log sealed with another key says so).
            let line = scan::line_ending_at(&self.file, len)
                .map_err(AuditError::io("read audit log", &self.path))?;
            let Some(line) = line else {
                return Err(self.corrupt(
                    "incomplete last line (no final newline: an interrupted write?)".into(),
                ));
            };
            scan::check_line(
                &mac,
                &line,
                true,
                0,
                &Expect::default(),
                &mut Default::default(),
            )
            .map_err(|f| self.corrupt(format!("the last record: {}", f.reason)))?;
            return Err(self.corrupt(format!(
                "it has no anchor at {}",
                self.anchor_path.as_path().display()
            )));
        };
        if let Some(off) = a.offset {
            // With segments, an offset past the end can be the previous file's: a crash right
            // after a rotation (the full scan below decides).
            if off > len && segments.is_empty() {
                return Err(self.corrupt(format!(
                    "truncated: its anchor records head seq {} ending at byte {off}, but the log has {len} bytes",
                    a.seq
                )));
            }
            if self.anchored_record_at(off, &a, &mac) {
                let scanned = scan::scan_file(
                    &self.file,
                    off,
                    0,
                    Expect {
                        seq: Some(a.seq + 1),
                        prev: Some(a.hash.clone()),
                    },
                    &mac,
                    |_, _, _| Ok(()),
                )
                .map_err(|f| self.corrupt(format!("after the anchored record: {f}")))?;
                let (seq, hash) = match scanned.last {
                    Some(l) => (l.seq, l.hash),
                    None => (a.seq, a.hash.clone()),
                };
                // After the anchored record: a crash's leftover, not damage.
                self.refuse_torn(scanned.torn.as_ref(), seq)?;
                self.cut_leftover(len, leftover)?;
                self.finish_open(len, seq, hash, Some(a.seq));
                return Ok(());
            }
        }
        // No usable offset: scan the active file once.
        let mut first: Option<Record> = None;
        let mut anchored: Option<Result<u64, String>> = None;
        let scanned = scan::scan_file(&self.file, 0, 0, Expect::default(), &mac, |r, _, end| {
            if first.is_none() {
                first = Some(r.clone());
            }
            if r.seq == a.seq {
                anchored = Some(if r.hash == a.hash {
                    Ok(end)
                } else {
                    Err(format!(
                        "record {} is not the record its anchor names",
                        r.seq
                    ))
                });
            }
            Ok(())
        })
        .map_err(|f| self.corrupt(f.to_string()))?;
        let Some(Last { seq, hash, .. }) = scanned.last else {
            let Some(t) = &scanned.torn else {
                // Emptied since it was measured.
                return Err(self.corrupt("the log has no complete record".into()));
            };
            // Nothing but an incomplete line: the first write after a rotation, cut short (the
            // anchor still names the last record of the previous segment), or damage.
            if let Some((_, last)) = segments.last()
                && segment_ends_at(last, &a, &mac)
            {
                return self.refuse_torn(Some(t), a.seq);
            }
            return Err(self.corrupt(t.failure.to_string()));
        };
        match anchored {
            Some(Ok(_)) => {}
            Some(Err(reason)) => return Err(self.corrupt(reason)),
            None if a.seq > seq => {
                // An incomplete line where the anchored record should be: the log was cut.
                if let Some(t) = &scanned.torn {
                    return Err(self.corrupt(t.failure.to_string()));
                }
                return Err(self.corrupt(format!(
                    "truncated: its anchor records head seq {} but the last record is seq {seq}",
                    a.seq
                )));
            }
            None => {
                // The anchor may still name the last record of the previous segment (a crash
                // right after a rotation), which this file's first record must continue.
                let continues = first.as_ref().is_some_and(|f| {
                    f.record_type == super::record_type::SEGMENT_STARTED
                        && f.data["previousSeq"].as_u64() == Some(a.seq)
                        && f.data["previousHash"].as_str() == Some(a.hash.as_str())
                });
                if !continues {
                    return Err(self.corrupt(format!(
                        "its anchor names seq {}, which is not in this file",
                        a.seq
                    )));
                }
            }
        }
        self.refuse_torn(scanned.torn.as_ref(), seq)?;
        self.cut_leftover(len, leftover)?;
        self.finish_open(len, seq, hash, None);
        // Upgrade the anchor (offset) now, so the next start reads only the tail.
        self.write_anchor()
    }

    /// A torn tail after the anchored head is reported as [`AuditError::TornTail`], for
    /// [`super::recover`] to move aside before anything is appended after it; bytes no write
    /// of this writer could have left are damage.
    fn refuse_torn(&self, torn: Option<&scan::TornTail>, after_seq: u64) -> Result<(), AuditError> {
        match torn {
            None => Ok(()),
            Some(t) if !t.cut_short => Err(self.corrupt(t.failure.to_string())),
            Some(t) => {
                let meta = self
                    .file
                    .metadata()
                    .map_err(AuditError::io("inspect audit log", &self.path))?;
                Err(AuditError::TornTail {
                    path: self.path.clone(),
                    after_seq,
                    offset: t.offset,
                    len: t.len,
                    file_id: crate::sys::unix::file_id(&meta),
                })
            }
        }
    }

    /// Cuts off the space a killed writer reserved past the records (`leftover`: the file's
    /// length), once they have been judged: the only change `open` makes to a log before it
    /// appends.
    fn cut_leftover(&mut self, records_end: u64, leftover: Option<u64>) -> Result<(), AuditError> {
        if leftover.is_some() {
            self.file
                .set_len(records_end)
                .map_err(AuditError::io("release the reserved tail of", &self.path))?;
        }
        Ok(())
    }

    fn finish_open(&mut self, len: u64, seq: u64, hash: String, anchored: Option<u64>) {
        self.len = len;
        // What was there before this writer is not its to fsync.
        self.synced_len = len;
        self.written = Some((seq, hash));
        self.head = self.written.clone();
        self.anchored = anchored;
        self.rotatable = true;
    }

    /// Whether the complete line ending at `off` is the anchored record, sealed with the key.
    fn anchored_record_at(&self, off: u64, a: &Anchor, mac: &MacChecker) -> bool {
        record_ending_at(&self.file, off, a, mac)
    }
}

fn record_ending_at(file: &File, off: u64, a: &Anchor, mac: &MacChecker) -> bool {
    let Ok(Some(line)) = scan::line_ending_at(file, off) else {
        return false;
    };
    let expect = Expect {
        seq: Some(a.seq),
        prev: None,
    };
    matches!(
        scan::check_line(mac, &line, true, 0, &expect, &mut Default::default()),
        Ok(r) if r.hash == a.hash
    )
}

/// Whether the segment at `path` ends with the record `a` names.
fn segment_ends_at(path: &Path, a: &Anchor, mac: &MacChecker) -> bool {
    let Ok(file) = keys::open_nofollow(path) else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    record_ending_at(&file, meta.len(), a, mac)
}

/// The number of the next segment: one past the highest present, so that segments read in
/// numeric order are the chain's order. `None` when the highest is the largest number (a file
/// planted as `srv.18446744073709551615.jsonl` in the agent-writable target directory): the
/// writer then stops rotating rather than number a segment below one already there (`audit
/// verify` reports the planted file).
fn next_segment_number(numbers: impl Iterator<Item = u64>) -> Option<u64> {
    match numbers.max() {
        None => Some(1),
        Some(highest) => highest.checked_add(1),
    }
}

/// Opens the active file for appending (`create_new`: a fresh file after a rotation).
fn open_active(path: &Path, create_new: bool) -> Result<File, AuditError> {
    let mut o = OpenOptions::new();
    o.read(true)
        .append(true)
        .mode(0o600)
        .custom_flags(keys::nofollow());
    if create_new {
        o.create_new(true);
    } else {
        o.create(true);
    }
    let file = o.open(path).map_err(|e| {
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
    Ok(file)
}

/// A due anchor rewrite, prepared under the caller's lock by
/// [`AuditLog::take_anchor_update`] and written after it.
#[derive(Debug)]
#[must_use = "an anchor update does nothing until it is written"]
pub struct AnchorUpdate {
    file: Arc<Mutex<AnchorFile>>,
    anchor: Anchor,
}

impl AnchorUpdate {
    /// Writes the anchor unless the file already names this record or a later one (a
    /// `commit` or a newer update got there first).
    pub fn write(self) -> Result<(), AuditError> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.written_seq().is_some_and(|seq| seq >= self.anchor.seq) {
            return Ok(());
        }
        file.write(&self.anchor)
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        let _ = self.commit();
        let _ = self.release_reservation();
    }
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
    /// The log's canonical path the guard is keyed by, as it resolved when the lock was taken:
    /// the open must find the log at the same place, or the anchor it loads would be keyed by
    /// another path than the guard (a parent swapped for a link in between).
    canonical: PathBuf,
}

/// What one `fstat` says of the active file against the records (see `AuditLog::file_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    Linked,
    Shorter,
    Removed,
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
        guard: &Path,
        canonical: PathBuf,
        wait: Duration,
    ) -> Result<WriterLock, AuditError> {
        let start = Instant::now();
        let guard = lock_at(log, guard, wait, start)?;
        let file = lock_at(
            log,
            &lock_path(log),
            wait.saturating_sub(start.elapsed()),
            start,
        )?;
        Ok(WriterLock {
            file,
            _guard: guard,
            canonical,
        })
    }

    /// `<log>.lock` alone (taken again after `cargo clean` took it).
    fn lock_file(log: &Path, wait: Duration) -> Result<File, AuditError> {
        lock_at(log, &lock_path(log), wait, Instant::now())
    }
}

/// Opens `path` (never through a link) and takes an exclusive `flock` on it within `wait`,
/// then writes this process's pid into it. Busy: [`AuditError::WriterBusy`] with the holder's
/// pid as it wrote it there, and the time waited since `since`.
fn lock_at(log: &Path, path: &Path, wait: Duration, since: Instant) -> Result<File, AuditError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(keys::nofollow())
        .open(path)
        .map_err(|e| {
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
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn setup() -> (tempfile::TempDir, KeyStore, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("logs/deep/audit.jsonl");
        (tmp, keys, path)
    }

    /// A writer of `path` with one record committed.
    fn writer_with_one_record(path: &Path, keys: &KeyStore) -> AuditLog {
        let mut log = AuditLog::open(path, keys).unwrap();
        log.append("x", "R", None, json!({"n": 0})).unwrap();
        log.commit().unwrap();
        log
    }

    /// Cuts the file at `path` to `len` bytes, as another process would.
    fn cut_file(path: &Path, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    /// The records' lines (without the space an open writer reserved past them).
    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap()
            .trim_end_matches('\0')
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn record_clock_writes_what_humantime_writes_across_seconds() {
        let mut clock = RecordClock::default();
        let base = std::time::UNIX_EPOCH + Duration::from_millis(1_764_000_000_000);
        // Within a second, across a second, a minute and a day, and back in time.
        for ms in [
            0u64, 7, 999, 1000, 1001, 59_999, 60_000, 86_399_999, 86_400_000, 5, 123_456,
        ] {
            let t = base + Duration::from_millis(ms);
            assert_eq!(
                clock.stamp(t),
                humantime::format_rfc3339_millis(t).to_string(),
                "{ms}"
            );
        }
    }

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

    /// Group commit: the anchor follows flushes at most every `ANCHOR_LAG` and every commit; a
    /// log longer than its anchor verifies and is continued.
    #[test]
    fn the_anchor_lags_flushes_and_follows_commits() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        let seq_of_anchor = || keys.read_anchor(&path).unwrap().map(|a| a.seq);
        log.append("x", "R", None, json!({})).unwrap();
        log.flush().unwrap();
        assert_eq!(
            seq_of_anchor(),
            Some(1),
            "the first flush after a quiet time anchors"
        );
        log.append("x", "R", None, json!({})).unwrap();
        log.flush().unwrap();
        assert_eq!(lines(&path).len(), 2);
        assert_eq!(seq_of_anchor(), Some(1), "within ANCHOR_LAG: not rewritten");
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(r.head_seq, 2, "a log longer than its anchor is valid");
        std::thread::sleep(ANCHOR_LAG);
        log.append("x", "R", None, json!({})).unwrap();
        log.flush().unwrap();
        assert_eq!(seq_of_anchor(), Some(3));
        log.append("x", "R", None, json!({})).unwrap();
        log.commit().unwrap();
        assert_eq!(seq_of_anchor(), Some(4), "commit always anchors");
        log.append("x", "R", None, json!({})).unwrap();
        log.flush().unwrap();
        // A crash now: no commit, no drop.
        std::mem::forget(log);
        assert_eq!(seq_of_anchor(), Some(4));
        assert_eq!(crate::audit::verify(&path, &keys).unwrap().head_seq, 5);
    }

    /// `run` takes a due anchor rewrite out and writes it after its lock: the update names only
    /// written records, is due no more often than a flush would anchor, never replaces a newer
    /// anchor, and a commit does not count on it having been written.
    #[test]
    fn an_anchor_update_written_later_follows_the_same_rules() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        let seq_of_anchor = || keys.read_anchor(&path).unwrap().map(|a| a.seq);
        assert!(log.take_anchor_update().is_none(), "nothing written yet");
        log.append("x", "R", None, json!({})).unwrap();
        assert!(
            log.take_anchor_update().is_none(),
            "a record still in the batch is never anchored"
        );
        log.write_pending().unwrap();
        assert_eq!(
            seq_of_anchor(),
            None,
            "write_pending leaves the anchor alone"
        );
        let first = log.take_anchor_update().expect("due: quiet since open");
        assert!(log.take_anchor_update().is_none(), "handed out once");
        first.write().unwrap();
        assert_eq!(seq_of_anchor(), Some(1));

        log.append("x", "R", None, json!({})).unwrap();
        log.write_pending().unwrap();
        assert!(
            log.take_anchor_update().is_none(),
            "within ANCHOR_LAG of the last: not due"
        );
        std::thread::sleep(ANCHOR_LAG);
        let stale = log.take_anchor_update().expect("due after ANCHOR_LAG");
        // The commit comes first (an epoch boundary on another thread): it anchors itself,
        // although an update for seq 2 is out and not written yet...
        log.append("x", "R", None, json!({})).unwrap();
        log.commit().unwrap();
        assert_eq!(seq_of_anchor(), Some(3));
        // ...and the late update does not move the anchor back.
        stale.write().unwrap();
        assert_eq!(
            seq_of_anchor(),
            Some(3),
            "an older update never replaces a newer anchor"
        );

        // A commit right after an update was handed out, unwritten, anchors anyway.
        std::thread::sleep(ANCHOR_LAG);
        log.append("x", "R", None, json!({})).unwrap();
        log.write_pending().unwrap();
        let pending = log.take_anchor_update().expect("due");
        log.commit().unwrap();
        assert_eq!(
            seq_of_anchor(),
            Some(4),
            "the commit did not count on the update"
        );
        pending.write().unwrap();
        assert_eq!(seq_of_anchor(), Some(4));
        drop(log);
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!((r.head_seq, r.records), (4, 4));
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

    #[test]
    fn corrupt_tail_stops_appends() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({"n": 1})).unwrap();
        log.append("x", "R", None, json!({"n": 2})).unwrap();
        // The writer keeps the head in memory (one writer per log): a change behind its back
        // is found by the next open (and by `audit verify`).
        drop(log);
        // Tamper with the last record's data.
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"n\":2", "\"n\":22");
        std::fs::write(&path, text).unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        assert!(err.to_string().contains("hash mismatch"), "{err}");
        assert_eq!(lines(&path).len(), 2, "nothing was appended");
    }

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
            while log.len + 400 <= 2_000 {
                log.append("x", "R", Some("E"), json!({"n": n, "pad": pad}))
                    .unwrap();
                log.flush().unwrap();
                n += 1;
            }
            std::fs::remove_dir_all(tmp.path().join("logs")).unwrap();
            // Within the flush's rate limit: only the rotation's commit can notice.
            log.set_moment(Moment {
                mono: log.length_checked.unwrap(),
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
        let len = log.len;
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

    /// The anchored records zeroed, or the whole log: the records do not pass, so nothing is
    /// cut, and the message says what is there.
    #[test]
    fn zeroed_records_are_damage_and_keep_their_bytes() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("x", "R", None, json!({"n": n})).unwrap();
        }
        drop(log);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 30..].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "not cut");

        bytes.fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("holds no record (only {n} NUL bytes)")),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap().len(), n, "not cut");
    }

    /// An incomplete line is never appended after. After the anchored head it is a crash's
    /// leftover, reported as such (recovery moves it aside); where the anchored record should
    /// be, the log was cut: damage.
    #[test]
    fn incomplete_last_line_stops_appends() {
        let (_tmp, keys, path) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("x", "R", None, json!({})).unwrap();
        drop(log);
        let whole = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1,\"se")
            .unwrap();
        let err = AuditLog::open(&path, &keys).unwrap_err();
        match &err {
            AuditError::TornTail {
                after_seq,
                offset,
                len,
                ..
            } => assert_eq!((*after_seq, *offset, *len), (1, whole, 10)),
            other => panic!("expected a torn tail, got {other:?}"),
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole + 10);

        // The anchored record itself cut short.
        cut_file(&path, whole - 5);
        let err = AuditLog::open(&path, &keys).unwrap_err();
        assert!(matches!(err, AuditError::CorruptTail { .. }), "{err:?}");
        assert!(err.to_string().contains("truncated"), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole - 5);
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
        assert!(err.to_string().contains("MAC invalid"), "{err}");
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
        drop(log);
        let mut again = AuditLog::open(&path, &keys).unwrap();
        assert_eq!(again.head(), Some((2, big.hash.as_str())));
        assert_eq!(again.append("x", "R", None, json!({})).unwrap().seq, 3);
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
