//! Segment rotation: the active file becomes the next numbered segment and a new active file
//! starts with a `segment_started` record. Owns the segment numbering decision
//! (`next_segment_number`) and the rename. Segment names and listing are [`super::scan`]'s.
//! Must not touch: the records of the closed segment (renamed whole, never rewritten).
//!
//! When a record would take the active file past `max_segment_bytes`, the file is committed,
//! renamed to the next segment name (see [`super::scan`]) and a new active file is started whose
//! first record, [`super::record_type::SEGMENT_STARTED`], names the previous segment's file
//! name, last seq and hash; seq continues. Rotation happens inside `append` (the only time it
//! does I/O).

use super::AuditError;
use super::lock::beside;
use super::scan;
use crate::base::beneath::Beneath;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The path of the next segment of the log at `path`; `None`: no number is left (see
/// `next_segment_number`), the active file grows instead.
pub(super) fn next_segment(dir: &Beneath, path: &Path) -> Result<Option<PathBuf>, AuditError> {
    let segments =
        scan::list_segments_in(dir, path).map_err(AuditError::io("list the segments of", path))?;
    Ok(next_segment_number(segments.iter().map(|(n, _)| *n)).map(|n| scan::segment_path(path, n)))
}

/// Renames the active file at `path` to `segment` (committed and released by the writer):
/// link + unlink, so an existing segment is never overwritten.
/// Both names are beside the log, in its held directory `dir`.
pub(super) fn close_into(dir: &Beneath, path: &Path, segment: &Path) -> Result<(), AuditError> {
    dir.hard_link(&beside(path), &beside(segment))
        .and_then(|()| dir.remove_file(&beside(path)))
        .map_err(AuditError::io("rotate audit log", path))
}

/// The `data` of the `segment_started` record that opens the file after `previous`, whose
/// last record is `(seq, hash)`.
pub(super) fn segment_started(
    previous: &Path,
    seq: u64,
    hash: &str,
) -> Result<Vec<u8>, AuditError> {
    let mut data = Vec::new();
    crate::audit::canonical_json(
        &json!({
            "previousSegment": scan::file_name(previous),
            "previousSeq": seq,
            "previousHash": hash,
        }),
        &mut data,
    )?;
    Ok(data)
}

/// Syncs the log's directory (best effort): the rename and the new file survive a power loss.
pub(super) fn sync_dir(dir: &Beneath) {
    let _ = dir.sync();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_number_is_one_past_the_highest_and_none_past_the_largest() {
        assert_eq!(next_segment_number([].into_iter()), Some(1));
        assert_eq!(next_segment_number([3, 1, 2].into_iter()), Some(4));
        assert_eq!(
            next_segment_number([1, u64::MAX - 1].into_iter()),
            Some(u64::MAX)
        );
        assert_eq!(next_segment_number([1, u64::MAX].into_iter()), None);
    }

    #[test]
    fn closing_into_a_segment_never_overwrites_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("srv.jsonl");
        std::fs::write(&path, b"active\n").unwrap();
        let dir = Beneath::open(tmp.path()).unwrap();
        let segment = next_segment(&dir, &path).unwrap().unwrap();
        assert_eq!(segment, scan::segment_path(&path, 1));
        std::fs::write(&segment, b"planted\n").unwrap();
        assert!(close_into(&dir, &path, &segment).is_err());
        assert_eq!(std::fs::read(&segment).unwrap(), b"planted\n");
        assert_eq!(std::fs::read(&path).unwrap(), b"active\n");
        assert_eq!(
            next_segment(&dir, &path).unwrap(),
            Some(scan::segment_path(&path, 2))
        );
        close_into(&dir, &path, &scan::segment_path(&path, 2)).unwrap();
        assert!(!path.exists());
    }
}
