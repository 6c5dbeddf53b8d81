//! The writer's side of the anchor: when a rewrite is due ([`ANCHOR_LAG`] after the last one),
//! what it names (the last record written, its hash, MAC and where its line ends), and the
//! [`AnchorUpdate`] handed out to be written after the caller's lock. Owns [`Anchoring`]: the
//! anchor file of one writer and its bookkeeping (what it names, when it was written, whether
//! it is synced, the update handed out). The anchor file's format, place and write are
//! [`super::keys`]'s. Must not touch: the log file, the batch, the clocks (the writer passes
//! the time of the event).

use super::AuditError;
use super::chain::{AuditKey, anchor_mac};
use super::keys::{Anchor, AnchorFile};
use super::seal::Head;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The anchor is rewritten by `flush` when its last write is older than this.
pub const ANCHOR_LAG: Duration = Duration::from_millis(200);

/// The anchor of one writer's log (see the module doc).
#[derive(Debug)]
pub(super) struct Anchoring {
    /// Shared with the [`AnchorUpdate`]s handed out (each writes it after the caller's lock).
    file: Arc<Mutex<AnchorFile>>,
    path: PathBuf,
    /// The log's canonical path, as the anchor names it.
    log: String,
    /// Seq named by the anchor on disk, and when this writer last wrote it.
    anchored: Option<u64>,
    anchored_at: Instant,
    /// The anchor was rewritten since its last fsync.
    unsynced: bool,
    /// Seq of the last [`AnchorUpdate`] handed out since the last commit.
    handed_out: Option<u64>,
}

impl Anchoring {
    pub(super) fn new(file: AnchorFile, log: String) -> Anchoring {
        Anchoring {
            path: file.path().to_owned(),
            file: Arc::new(Mutex::new(file)),
            log,
            anchored: None,
            // Stale from the start: the first flush after a quiet time anchors at once.
            anchored_at: Instant::now()
                .checked_sub(ANCHOR_LAG)
                .unwrap_or_else(Instant::now),
            unsynced: false,
            handed_out: None,
        }
    }

    /// Where the anchor file is.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The anchor as the file holds it now, read from the writer's open handle (not opened
    /// again by its path).
    pub(super) fn read_back(&self) -> Result<Option<super::keys::Anchor>, AuditError> {
        self.lock_file().read_back()
    }

    /// The anchor on disk names `seq` (found so at open).
    pub(super) fn found(&mut self, seq: Option<u64>) {
        self.anchored = seq;
    }

    /// Whether the anchor names another record than the last one written (`written`).
    pub(super) fn behind(&self, written: &Head) -> bool {
        self.anchored != written.seq()
    }

    /// Whether a rewrite is due at `now`: behind, and the last write older than [`ANCHOR_LAG`].
    pub(super) fn due(&self, written: &Head, now: Instant) -> bool {
        self.behind(written) && now.saturating_duration_since(self.anchored_at) >= ANCHOR_LAG
    }

    /// The rewrite [`Anchoring::due`] says is due, prepared (sealed) but not written: `run`
    /// writes it after the session's lock is released and the call it serves has gone out, so
    /// a host's call neither waits for it before being forwarded nor behind it for the lock.
    /// The anchor still only ever names records already written; one prepared earlier never
    /// replaces a newer one ([`AnchorUpdate::write`]); a commit writes its own.
    pub(super) fn take_update(
        &mut self,
        key: &AuditKey,
        written: &Head,
        len: u64,
        now: Instant,
    ) -> Option<AnchorUpdate> {
        if !self.due(written, now) {
            return None;
        }
        let anchor = self.naming(key, written, len)?;
        self.mark(anchor.seq, now);
        self.handed_out = Some(anchor.seq);
        Some(AnchorUpdate {
            file: Arc::clone(&self.file),
            anchor,
        })
    }

    /// Rewrites the anchor to name `written`, whose line ends the records at `len`.
    pub(super) fn write(
        &mut self,
        key: &AuditKey,
        written: &Head,
        len: u64,
        now: Instant,
    ) -> Result<(), AuditError> {
        let Some(anchor) = self.naming(key, written, len) else {
            return Ok(());
        };
        self.lock_file().write(&anchor)?;
        self.mark(anchor.seq, now);
        Ok(())
    }

    /// A commit's part: the anchor names `written` (an update handed out and not written yet
    /// is written over: it is skipped later as older), and with `sync` the anchor file is
    /// synced if it was rewritten since its last sync.
    pub(super) fn commit(
        &mut self,
        key: &AuditKey,
        written: &Head,
        len: u64,
        now: Instant,
        sync: bool,
    ) -> Result<(), AuditError> {
        let update_unwritten = self.handed_out.take().is_some_and(|seq| {
            self.lock_file()
                .written_seq()
                .is_none_or(|on_file| on_file < seq)
        });
        if update_unwritten || self.behind(written) {
            self.write(key, written, len, now)?;
        }
        // Also an anchor `flush` rewrote (timer) since the last commit.
        if sync && self.unsynced {
            self.lock_file().sync()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// The anchor naming the last record written (`None`: nothing written yet).
    fn naming(&self, key: &AuditKey, written: &Head, len: u64) -> Option<Anchor> {
        let (seq, hash) = written.get()?;
        Some(Anchor {
            log: self.log.clone(),
            seq,
            mac: anchor_mac(key, seq, hash),
            hash: hash.to_owned(),
            offset: Some(len),
        })
    }

    fn mark(&mut self, seq: u64, now: Instant) {
        self.unsynced = true;
        self.anchored = Some(seq);
        self.anchored_at = now;
    }

    fn lock_file(&self) -> MutexGuard<'_, AnchorFile> {
        // A panic while writing the anchor leaves nothing half-done that matters here: the
        // next write replaces the whole file.
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;

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
}
