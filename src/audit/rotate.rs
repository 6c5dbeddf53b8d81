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
use super::scan;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The path of the next segment of the log at `path`; `None`: no number is left (see
/// `next_segment_number`), the active file grows instead.
pub(super) fn next_segment(path: &Path) -> Result<Option<PathBuf>, AuditError> {
    let segments =
        scan::list_segments(path).map_err(AuditError::io("list the segments of", path))?;
    Ok(next_segment_number(segments.iter().map(|(n, _)| *n)).map(|n| scan::segment_path(path, n)))
}

/// Renames the active file at `path` to `segment` (committed and released by the writer):
/// link + unlink, so an existing segment is never overwritten.
pub(super) fn close_into(path: &Path, segment: &Path) -> Result<(), AuditError> {
    crate::fsutil::hard_link(path, segment)
        .and_then(|()| crate::fsutil::remove_file(path))
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

/// Syncs the directory of `path` (best effort): the rename and the new file survive a power
/// loss.
pub(super) fn sync_dir_of(path: &Path) {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        let _ = crate::fsutil::sync_dir(dir);
    }
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
