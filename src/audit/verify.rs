//! Independent verification of a log: every line of every segment, the chain, the MACs and the
//! anchor. Owns the checks and the "first bad record" report. Must not touch: the log or the
//! anchor (read only; never creates a key, never takes the writer lock), stdout.
//!
//! Streams: one line in memory at a time (plus the set of distinct runs and epochs), so a log of
//! any size verifies in constant memory.
//!
//! Files, in order: the segments `<stem>.00001.<ext>`, … (see [`super::scan`]), then the active
//! file. Each line is checked as [`super::scan::check_line`] says, with `seq` consecutive from 1
//! across files and `prev` linking across files. The first record of every file after the first
//! must be a `segment_started` naming the previous file, its last seq and hash: a deleted,
//! renamed or reordered segment is reported with its name. Then the anchor: it must exist for a
//! non-empty log, carry a valid MAC, not name a seq past the last record (truncated tail), and
//! name the hash of the record at its seq. A log longer than its anchor is valid (the anchor lags
//! the log by design, see [`super::writer`]). An incomplete last line of the active file after the
//! anchored head is a write a crash cut short: valid, reported in [`VerifyReport::torn_tail`];
//! at or before the anchored record (where the anchor says a whole record is) it is a failure.
//!
//! No lock: the anchor is read before the log, and the writer rewrites the anchor only after the
//! records it names are written, so a concurrent writer can only make the log look longer than
//! the anchor (valid). An anchor read racing its rewrite is re-read; a verification that fails
//! while the set of files changed (a rotation happened meanwhile) is run once more.

use super::AuditError;
use super::chain::{MacChecker, Record, verify_anchor_mac};
use super::error::VerifyFailure;
use super::keys::{self, Anchor, KeyStore};
use super::scan::{self, Expect, short};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;
use std::path::PathBuf;

/// A log that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub records: u64,
    /// Distinct `run` values.
    pub runs: usize,
    /// Distinct non-null `epoch` values.
    pub epochs: usize,
    pub head_seq: u64,
    pub head_hash: String,
    /// Every file of the log, oldest first; the active file last.
    pub segments: Vec<SegmentReport>,
    /// When the first record is a [`super::record_type::CHAIN_RESTARTED`]: the break, and the
    /// verification of the chain that was set aside (with its own anchor).
    pub previous: Option<Box<ChainBreak>>,
    /// Bytes after the active file's last `\n`, past the anchored head: a write a crash cut
    /// short (never a record; the next `run` moves them aside, see [`super::recover`]).
    pub torn_tail: Option<TornTailReport>,
}

/// An incomplete last line after the anchored head (see [`VerifyReport::torn_tail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTailReport {
    /// 1-based line number in the active file.
    pub line: usize,
    /// Byte offset where it starts.
    pub offset: u64,
    pub bytes: u64,
}

/// One file of a verified log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    pub path: PathBuf,
    pub records: u64,
    /// `(first, last)` seq; `None` for an empty file.
    pub seqs: Option<(u64, u64)>,
}

/// A break in a log's history: the chain before it was set aside (see [`super::recover`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    /// Why the old chain could not be extended (as recorded in the restart record).
    pub reason: String,
    /// Time of the restart record.
    pub time: String,
    pub previous_log: Option<PathBuf>,
    pub previous_anchor: Option<PathBuf>,
    /// `(seq, hash)` the old anchor named.
    pub previous_head: Option<(u64, String)>,
    /// The old chain checked against its set-aside anchor.
    pub previous: Result<VerifyReport, VerifyFailure>,
}

/// How many set-aside chains `verify` follows back.
const MAX_BREAKS: usize = 16;

fn fail(line: usize, seq: Option<u64>, reason: impl Into<String>) -> VerifyFailure {
    VerifyFailure {
        line,
        seq,
        reason: reason.into(),
    }
}

/// Verifies the log at `path` (and its segments) with the key and anchor in `keys`.
pub fn verify(path: &Path, keys: &KeyStore) -> Result<VerifyReport, VerifyFailure> {
    verify_retrying(path, keys, None)
}

/// [`verify()`], also returning the records it checked (one read of the log, so journals show
/// exactly what was verified even if a writer appends meanwhile).
pub(crate) fn verify_and_collect(
    path: &Path,
    keys: &KeyStore,
) -> Result<(VerifyReport, Vec<Record>), VerifyFailure> {
    let mut records = Vec::new();
    let report = verify_retrying(path, keys, Some(&mut records))?;
    Ok((report, records))
}

/// [`verify()`], showing each record it checked to `visitor` as it goes (one line in memory at
/// a time). A check run again after a rotation starts the visitor over.
pub(crate) fn verify_visiting(
    path: &Path,
    keys: &KeyStore,
    visitor: &mut dyn Visitor,
) -> Result<VerifyReport, VerifyFailure> {
    verify_retrying(path, keys, Some(visitor))
}

/// What sees the records of a verification, in order.
pub(crate) trait Visitor {
    fn record(&mut self, record: &Record);
    /// The check is run once more (the log rotated meanwhile): forget what was seen.
    fn start_over(&mut self);
}

impl Visitor for Vec<Record> {
    fn record(&mut self, record: &Record) {
        self.push(record.clone());
    }
    fn start_over(&mut self) {
        self.clear();
    }
}

/// Runs the check once more if it failed while the log's files changed (a rotation).
fn verify_retrying(
    path: &Path,
    keys: &KeyStore,
    mut visitor: Option<&mut dyn Visitor>,
) -> Result<VerifyReport, VerifyFailure> {
    let files_before = scan::list_segments(path).ok();
    let attempt = |visitor: &mut Option<&mut dyn Visitor>| {
        let mut each = |r: &Record| {
            if let Some(v) = visitor.as_deref_mut() {
                v.record(r);
            }
        };
        verify_once(path, keys, None, &mut each, MAX_BREAKS)
    };
    let first = attempt(&mut visitor);
    if first.is_err() && scan::list_segments(path).ok() != files_before {
        if let Some(v) = visitor.as_deref_mut() {
            v.start_over();
        }
        return attempt(&mut visitor);
    }
    first
}

fn chain_break(first: &Record, keys: &KeyStore, depth: usize) -> ChainBreak {
    let d = &first.data;
    let path_of = |v: &serde_json::Value| v.as_str().map(PathBuf::from);
    let head_of =
        |v: &serde_json::Value| Some((v["seq"].as_u64()?, v["hash"].as_str()?.to_string()));
    let previous_log = path_of(&d["previousLog"]);
    let previous_anchor = path_of(&d["previousAnchor"]);
    let previous = match (&previous_log, &previous_anchor) {
        (None, _) => Err(fail(
            0,
            None,
            "no log was left to set aside (removed, e.g. by `cargo clean`); only its anchored head is known",
        )),
        (Some(log), anchor) => verify_once(
            log,
            keys,
            Some(anchor.as_deref()),
            &mut |_| {},
            depth.saturating_sub(1),
        ),
    };
    ChainBreak {
        reason: d["reason"].as_str().unwrap_or("?").to_string(),
        time: first.time.clone(),
        previous_log,
        previous_anchor,
        previous_head: head_of(&d["previousHead"]),
        previous,
    }
}

fn open_log(path: &Path) -> Result<File, AuditError> {
    keys::open_nofollow(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => AuditError::Io {
            action: "read audit log",
            path: path.to_owned(),
            source: e,
        },
        _ if keys::is_eloop(&e) => AuditError::Symlink {
            path: path.to_owned(),
        },
        _ => AuditError::io("open audit log", path)(e),
    })
}

/// The anchor, re-read (a few times, briefly) while it does not parse or seal: a read that
/// raced the writer's in-place rewrite.
fn read_anchor_settled(
    anchor_path: &Path,
    key: &super::AuditKey,
) -> Result<Option<Anchor>, AuditError> {
    let mut tries = 0;
    loop {
        let a = keys::read_anchor_at(anchor_path);
        let settled = match &a {
            Ok(Some(a)) => verify_anchor_mac(key, a.seq, &a.hash, &a.mac).unwrap_or(false),
            Ok(None) => true,
            Err(_) => false,
        };
        tries += 1;
        if settled || tries >= 3 {
            return a;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `anchor_override`: `Some(Some(path))` checks against that anchor file (a set-aside chain),
/// `Some(None)` against no anchor at all.
fn verify_once(
    path: &Path,
    keys: &KeyStore,
    anchor_override: Option<Option<&Path>>,
    each: &mut dyn FnMut(&Record),
    depth: usize,
) -> Result<VerifyReport, VerifyFailure> {
    let io = |e: AuditError| fail(0, None, e.to_string());
    let active = open_log(path).map_err(io)?;
    let segments = scan::list_segments(path).map_err(|e| {
        fail(
            0,
            None,
            format!("cannot list the segments of {}: {e}", path.display()),
        )
    })?;
    let active_len = active
        .metadata()
        .map_err(|e| fail(0, None, format!("cannot inspect {}: {e}", path.display())))?
        .len();
    if active_len == 0 && segments.is_empty() {
        // An anchor that names records says where they went (cut to nothing while, or after,
        // they were written); without one (or without the key) the log is simply empty.
        let anchored = keys.load_key().ok().and_then(|key| {
            let anchor_path = match anchor_override {
                None => keys.anchor_path(path).ok()?,
                Some(Some(p)) => p.to_owned(),
                Some(None) => return None,
            };
            read_anchor_settled(&anchor_path, &key).ok().flatten()
        });
        let text = match anchored {
            Some(a) => format!(
                "audit log {} is empty, but its anchor records head seq {}: the log was truncated",
                path.display(),
                a.seq
            ),
            None => format!("audit log {} is empty", path.display()),
        };
        return Err(fail(0, None, text));
    }
    let key = keys.load_key().map_err(io)?;
    let mac = MacChecker::new(&key);
    // The anchor before the log: see the module doc.
    let anchor_path = match anchor_override {
        None => keys.anchor_path(path).map_err(io)?,
        Some(Some(p)) => p.to_owned(),
        Some(None) => PathBuf::from("(none)"),
    };
    let anchor = match anchor_override {
        Some(None) => Ok(None),
        _ => read_anchor_settled(&anchor_path, &key),
    };
    let anchored_seq = anchor.as_ref().ok().and_then(|a| a.as_ref()).map(|a| a.seq);

    let mut runs = BTreeSet::new();
    let mut epochs = BTreeSet::new();
    let mut first_record: Option<Record> = None;
    // `(line, hash)` of the record at the anchor's seq, wherever it is.
    let mut at_anchor: Option<(usize, String)> = None;
    let mut prev: Option<(u64, String, String)> = None; // (seq, hash, file name)
    let mut reports = Vec::new();
    let mut last_line = 0;
    let mut active_torn: Option<scan::TornTail> = None;
    let files: Vec<(PathBuf, Option<File>)> = segments
        .into_iter()
        .map(|(_, p)| (p, None))
        .chain(std::iter::once((path.to_owned(), Some(active))))
        .collect();
    for (index, (file_path, file)) in files.into_iter().enumerate() {
        let is_active = file.is_some();
        let name = scan::file_name(&file_path);
        let in_file = |f: VerifyFailure| {
            if is_active {
                f
            } else {
                VerifyFailure {
                    reason: format!("in segment {name}: {}", f.reason),
                    ..f
                }
            }
        };
        let file = match file {
            Some(f) => f,
            None => {
                let f = open_log(&file_path).map_err(io)?;
                // A segment was cut back to its records before it was renamed: NUL bytes
                // after them were put there later.
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                if scan::data_end(&f, len).ok() != Some(len) {
                    return Err(fail(
                        0,
                        None,
                        format!(
                            "segment {name} ends in NUL bytes after its records (a segment is closed with its last record)"
                        ),
                    ));
                }
                f
            }
        };
        let expect = match &prev {
            // Any seq here, so that a first file that continues a missing segment is named as
            // such; `check_segment_start` requires seq 1 otherwise.
            None => Expect::default(),
            Some((seq, hash, _)) => Expect {
                seq: Some(seq + 1),
                prev: Some(hash.clone()),
            },
        };
        let mut records = 0u64;
        let mut first_seq = None;
        let continues = prev.clone();
        let scanned = scan::scan_file(&file, 0, 0, expect.clone(), &mac, |r, line, _| {
            if records == 0 {
                first_seq = Some(r.seq);
                check_segment_start(r, index, continues.as_ref(), &name)
                    .map_err(|reason| fail(line, Some(r.seq), reason))?;
            }
            records += 1;
            if first_record.is_none() {
                first_record = Some(r.clone());
            }
            if Some(r.seq) == anchored_seq {
                at_anchor = Some((line, r.hash.clone()));
            }
            if !runs.contains(&r.run) {
                runs.insert(r.run.clone());
            }
            if let Some(e) = &r.epoch
                && !epochs.contains(e)
            {
                epochs.insert(e.clone());
            }
            each(r);
            Ok(())
        })
        .map_err(|f| {
            // A first line that does not continue the previous file: name the segments.
            if f.line == 1
                && let Some((seq, _, prev_name)) = &prev
                && f.reason.starts_with("out of sequence")
            {
                return in_file(fail(
                    1,
                    f.seq,
                    format!(
                        "{} (the previous file, {prev_name}, ends at seq {seq}: a segment was deleted or reordered?)",
                        f.reason
                    ),
                ));
            }
            in_file(f)
        })?;
        if let Some(torn) = scanned.torn {
            // Only the active file is written to (a segment was whole when it was renamed), and
            // only a prefix of a record's line is what an interrupted write leaves.
            if !is_active || !torn.cut_short {
                return Err(in_file(torn.failure));
            }
            active_torn = Some(torn);
        }
        match scanned.last {
            Some(l) => {
                if is_active {
                    last_line = l.line;
                }
                reports.push(SegmentReport {
                    path: file_path.clone(),
                    records,
                    seqs: first_seq.map(|f| (f, l.seq)),
                });
                prev = Some((l.seq, l.hash, name));
            }
            None if is_active => reports.push(SegmentReport {
                path: file_path.clone(),
                records: 0,
                seqs: None,
            }),
            None => {
                return Err(fail(
                    0,
                    None,
                    format!("segment {} is empty", file_path.display()),
                ));
            }
        }
    }
    // An unterminated line is acceptable only after the anchored head: the writer anchors a
    // record after its whole line is written, so a line at or before it was cut afterwards.
    let torn_or = |other: VerifyFailure| match &active_torn {
        Some(t) => t.failure.clone(),
        None => other,
    };
    let Some((head_seq, head_hash, _)) = prev else {
        return Err(torn_or(fail(0, None, "the log has no complete record")));
    };

    let anchor: Anchor = match anchor {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(fail(
                0,
                None,
                format!(
                    "no anchor at {} for this non-empty log: its head cannot be confirmed (truncated or replaced?)",
                    anchor_path.display()
                ),
            ));
        }
        Err(e) => return Err(fail(0, None, e.to_string())),
    };
    if !verify_anchor_mac(&key, anchor.seq, &anchor.hash, &anchor.mac).unwrap_or(false) {
        return Err(fail(
            0,
            None,
            format!("anchor {} has an invalid MAC", anchor_path.display()),
        ));
    }
    if anchor.seq > head_seq {
        return Err(torn_or(fail(
            last_line + 1,
            Some(head_seq + 1),
            format!(
                "truncated tail: the anchor records head seq {} ({}…) but the log ends at seq {head_seq}",
                anchor.seq,
                short(&anchor.hash)
            ),
        )));
    }
    match at_anchor {
        Some((_, h)) if h == anchor.hash => {}
        found => {
            return Err(fail(
                found.map(|(line, _)| line).unwrap_or(anchor.seq as usize),
                Some(anchor.seq),
                format!(
                    "does not match the anchor (anchor hash {}…)",
                    short(&anchor.hash)
                ),
            ));
        }
    }
    let previous = match &first_record {
        Some(first) if first.record_type == super::record_type::CHAIN_RESTARTED && depth > 0 => {
            Some(Box::new(chain_break(first, keys, depth)))
        }
        _ => None,
    };
    Ok(VerifyReport {
        records: reports.iter().map(|s| s.records).sum(),
        runs: runs.len(),
        epochs: epochs.len(),
        head_seq,
        head_hash,
        segments: reports,
        previous,
        torn_tail: active_torn.map(|t| TornTailReport {
            line: t.line,
            offset: t.offset,
            bytes: t.len,
        }),
    })
}

/// The first record of file `index` (0-based, segments then the active file): after the first
/// file it must be a `segment_started` naming the previous file and its head.
fn check_segment_start(
    r: &Record,
    index: usize,
    prev: Option<&(u64, String, String)>,
    name: &str,
) -> Result<(), String> {
    let is_start = r.record_type == super::record_type::SEGMENT_STARTED;
    let named = r.data["previousSegment"].as_str().unwrap_or("?");
    match prev {
        None if is_start => Err(format!(
            "the first file of the log ({name}) continues segment {named} (seq {}), which is missing",
            r.data["previousSeq"]
        )),
        None if r.seq != 1 => {
            Err("out of sequence: expected seq 1 (a record was deleted, inserted or moved)".into())
        }
        None => Ok(()),
        Some((seq, hash, prev_name)) => {
            if !is_start {
                return Err(format!(
                    "{name} does not start with a segment_started record continuing {prev_name}"
                ));
            }
            // By number: a set-aside chain's segments keep their numbers under a new stem.
            let same = named == prev_name
                || scan::segment_number(named).is_some()
                    && scan::segment_number(named) == scan::segment_number(prev_name);
            if !same
                || r.data["previousSeq"].as_u64() != Some(*seq)
                || r.data["previousHash"].as_str() != Some(hash.as_str())
            {
                return Err(format!(
                    "{name} continues segment {named}, but the previous file is {prev_name} (a segment was renamed, deleted or reordered)"
                ));
            }
            let _ = index;
            Ok(())
        }
    }
}

/// Parses every record of a log (segments first) without verifying anything beyond syntax (for
/// `audit show` of a log that fails verification). Fails at the first whole line that is not a
/// record; an incomplete last line is left out.
pub fn read_records(path: &Path) -> Result<Vec<Record>, AuditError> {
    use std::io::BufReader;
    let mut files: Vec<PathBuf> = scan::list_segments(path)
        .map_err(AuditError::io("list the segments of", path))?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    files.push(path.to_owned());
    let mut out = Vec::new();
    for file_path in files {
        use std::io::Read;
        let file = open_log(&file_path)?;
        // Up to the end of the data as it is now (see `scan::data_end`: a live log).
        let end = file
            .metadata()
            .and_then(|m| scan::data_end(&file, m.len()))
            .map_err(AuditError::io("read audit log", &file_path))?;
        let mut reader = BufReader::new(file.take(end));
        let mut line = Vec::new();
        for i in 0.. {
            let read = scan::read_line_within(&mut reader, &mut line, scan::MAX_RECORD_LINE)
                .map_err(AuditError::io("read audit log", &file_path))?;
            if read.is_err() {
                return Err(AuditError::InvalidRecord(format!(
                    "{}: {}",
                    file_path.display(),
                    scan::too_long(i + 1, scan::MAX_RECORD_LINE)
                )));
            }
            // An unterminated last line is never a record (see `scan::TornTail`).
            if line.pop() != Some(b'\n') {
                break;
            }
            let text = std::str::from_utf8(&line).map_err(|_| {
                AuditError::InvalidRecord(format!("{} is not UTF-8", file_path.display()))
            })?;
            let record = Record::from_line(text).map_err(|e| {
                let at = if file_path == path {
                    String::new()
                } else {
                    format!("{}: ", scan::file_name(&file_path))
                };
                AuditError::InvalidRecord(format!("{at}line {}: {e}", i + 1))
            })?;
            out.push(record);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::AuditLog;
    use serde_json::json;

    fn build(n: usize) -> (tempfile::TempDir, KeyStore, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("audit.jsonl");
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for i in 0..n {
            let epoch = if i % 2 == 0 { "E1" } else { "E2" };
            log.append(
                "tool_called",
                if i < 3 { "R1" } else { "R2" },
                Some(epoch),
                json!({"i": i}),
            )
            .unwrap();
        }
        (tmp, keys, path)
    }

    #[test]
    fn valid_log_reports_counts() {
        let (_t, keys, path) = build(5);
        let r = verify(&path, &keys).unwrap();
        assert_eq!((r.records, r.runs, r.epochs, r.head_seq), (5, 2, 2, 5));
        assert_eq!(r.head_hash, keys.read_anchor(&path).unwrap().unwrap().hash);
    }

    #[test]
    fn missing_and_empty_logs_are_clear_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path());
        let missing = tmp.path().join("nope.jsonl");
        let f = verify(&missing, &keys).unwrap_err();
        assert_eq!(f.line, 0);
        assert!(
            f.to_string().contains("nope.jsonl") && f.to_string().contains("No such file"),
            "{f}"
        );
        let empty = tmp.path().join("empty.jsonl");
        std::fs::write(&empty, b"").unwrap();
        assert!(
            verify(&empty, &keys)
                .unwrap_err()
                .to_string()
                .ends_with("is empty")
        );
        // Emptied after records were anchored: said so.
        let (_t, keys, path) = build(3);
        std::fs::write(&path, b"").unwrap();
        let f = verify(&path, &keys).unwrap_err().to_string();
        assert!(
            f.ends_with("is empty, but its anchor records head seq 3: the log was truncated"),
            "{f}"
        );
    }

    #[test]
    fn verify_never_creates_a_key() {
        let (tmp, _keys, path) = build(2);
        let other = KeyStore::at(tmp.path().join("other"));
        let f = verify(&path, &other).unwrap_err();
        assert!(f.reason.contains("no audit key"), "{f}");
        assert!(!other.key_path().exists());
    }

    #[test]
    fn anchor_problems_are_reported() {
        let (_t, keys, path) = build(3);
        let anchor_path = keys.anchor_path(&path).unwrap();
        let good = std::fs::read_to_string(&anchor_path).unwrap();
        let mut a: Anchor = serde_json::from_str(&good).unwrap();

        a.seq = 2; // behind the tail but with the head's hash: MAC no longer matches
        std::fs::write(&anchor_path, serde_json::to_string(&a).unwrap()).unwrap();
        assert!(
            verify(&path, &keys)
                .unwrap_err()
                .reason
                .contains("invalid MAC")
        );

        let key = keys.load_key().unwrap();
        a.mac = crate::audit::chain::anchor_mac(&key, 2, &a.hash); // validly sealed, wrong hash for seq 2
        std::fs::write(&anchor_path, serde_json::to_string(&a).unwrap()).unwrap();
        let f = verify(&path, &keys).unwrap_err();
        assert_eq!((f.line, f.seq), (2, Some(2)), "{f}");
        assert!(
            f.to_string()
                .starts_with("record 2 (line 2): does not match the anchor"),
            "{f}"
        );

        std::fs::remove_file(&anchor_path).unwrap();
        let f = verify(&path, &keys).unwrap_err();
        assert_eq!(f.line, 0);
        assert!(f.reason.contains("no anchor"), "{f}");
    }

    #[test]
    fn non_canonical_but_equivalent_line_is_caught() {
        let (_t, keys, path) = build(3);
        let text = std::fs::read_to_string(&path).unwrap();
        // "\u0074ool_called" parses to the same string as "tool_called": hash and MAC still match.
        let changed = text.replacen(
            "\"type\":\"tool_called\"",
            "\"type\":\"\\u0074ool_called\"",
            2,
        );
        let changed = changed.replacen(
            "\"type\":\"\\u0074ool_called\"",
            "\"type\":\"tool_called\"",
            1,
        );
        std::fs::write(&path, changed).unwrap();
        let f = verify(&path, &keys).unwrap_err();
        assert_eq!(f.line, 2);
        assert!(f.reason.contains("canonical form"), "{f}");
    }

    #[test]
    fn failure_display_forms() {
        assert_eq!(
            fail(7, Some(7), "hash mismatch: x").to_string(),
            "record 7 (line 7): hash mismatch: x"
        );
        assert_eq!(
            fail(3, None, "empty line").to_string(),
            "line 3: empty line"
        );
        assert_eq!(fail(0, None, "no anchor").to_string(), "no anchor");
    }

    #[test]
    fn read_records_parses_without_verifying() {
        let (_t, _keys, path) = build(3);
        let records = read_records(&path).unwrap();
        assert_eq!(
            records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        std::fs::write(&path, b"{}\n").unwrap();
        assert!(
            read_records(&path)
                .unwrap_err()
                .to_string()
                .contains("line 1")
        );
    }
}
