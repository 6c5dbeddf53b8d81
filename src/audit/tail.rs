//! The open's check of the log's tail against the anchor, and the head it continues from.
//! Owns the rules that decide whether an existing log can be extended (valid, torn after the
//! anchored head, or damaged). Must not touch: the records before the anchored one (that is
//! `audit verify`'s, [`super::verify()`]), the anchor file (read only here).
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

use super::AuditError;
use super::anchor::Anchoring;
use super::chain::{AuditKey, MacChecker, Record, verify_anchor_mac};
use super::keys::Anchor;
use super::scan::{self, Expect, Last};
use crate::base::beneath::Beneath;
use std::fs::File;
use std::path::{Path, PathBuf};

/// What the open found: where the writer continues the chain.
#[derive(Debug)]
pub(super) enum Tail {
    /// No record and no anchor: a new chain.
    Empty,
    /// Continue after record `seq` (`hash`), whose line ends the records at byte `len`.
    /// `anchored`: the seq the anchor names, when it was found where its offset says; `None`
    /// when the file was scanned instead (the anchor is then rewritten with the offset).
    Continue {
        len: u64,
        seq: u64,
        hash: String,
        anchored: Option<u64>,
    },
    /// The active file is empty and the newest segment ends with the anchored record (a crash
    /// between a rotation's rename and the new file's first record): start the new file.
    AfterRotation {
        seq: u64,
        hash: String,
        segment: PathBuf,
    },
}

/// The open's check of one log's tail (see the module doc).
pub(super) struct TailCheck<'a> {
    /// The active file, open for appending.
    pub file: &'a File,
    pub path: &'a Path,
    pub anchor_path: &'a Path,
    /// The writer's open anchor (read through its handle).
    pub anchoring: &'a Anchoring,
    /// The log's directory, held by the writer lock.
    pub dir: &'a Beneath,
    pub key: &'a AuditKey,
}

impl TailCheck<'_> {
    /// Checks the tail against the anchor (see the module doc): where the chain continues. The
    /// space a killed writer reserved past the records is cut off once they pass.
    pub(super) fn run(&self) -> Result<Tail, AuditError> {
        let anchor = self.anchoring.read_back()?;
        if let Some(a) = &anchor
            && !verify_anchor_mac(self.key, a.seq, &a.hash, &a.mac).unwrap_or(false)
        {
            return Err(self.corrupt(format!(
                "its anchor {} has an invalid MAC",
                self.anchor_path.display()
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
        let len = scan::data_end(self.file, file_len)
            .map_err(AuditError::io("read audit log", &self.path))?;
        let leftover = (len < file_len).then_some(file_len);
        let segments = scan::list_segments_in(self.dir, self.path)
            .map_err(AuditError::io("list the segments of", &self.path))?;
        let mac = MacChecker::new(self.key);
        if len == 0 {
            let Some(a) = anchor else {
                if let Some((_, last)) = segments.last() {
                    return Err(self.corrupt(format!(
                        "the active file is empty and has no anchor, but segment {} exists",
                        last.display()
                    )));
                }
                self.cut_leftover(len, leftover)?;
                return Ok(Tail::Empty);
            };
            // A crash between renaming the active file to a segment and writing the new
            // file's first record: continue from that segment if it ends at the anchor.
            if let Some((_, last)) = segments.last()
                && segment_ends_at(self.dir, last, &a, &mac)
            {
                self.cut_leftover(len, leftover)?;
                return Ok(Tail::AfterRotation {
                    seq: a.seq,
                    hash: a.hash.clone(),
                    segment: last.clone(),
                });
            }
            let what = match file_len {
                0 => "the log is empty".to_string(),
                n => format!("the log holds no record (only {n} NUL bytes)"),
            };
            return Err(self.corrupt(format!("{what} but its anchor records head seq {}", a.seq)));
        }
        let Some(a) = anchor else {
            // The last record's own problems first (a log sealed with another key says so).
            let line = scan::line_ending_at(self.file, len)
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
                self.anchor_path.display()
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
                    self.file,
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
                return Ok(Tail::Continue {
                    len,
                    seq,
                    hash,
                    anchored: Some(a.seq),
                });
            }
        }
        // No usable offset: scan the active file once.
        let mut first: Option<Record> = None;
        let mut anchored: Option<Result<u64, String>> = None;
        let scanned = scan::scan_file(self.file, 0, 0, Expect::default(), &mac, |r, _, end| {
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
                && segment_ends_at(self.dir, last, &a, &mac)
            {
                return Err(self.torn_error(t, a.seq));
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
        // The anchor is upgraded (offset) by the writer, so the next start reads only the tail.
        Ok(Tail::Continue {
            len,
            seq,
            hash,
            anchored: None,
        })
    }

    /// A torn tail after the anchored head is reported as [`AuditError::TornTail`], for
    /// [`super::recover`] to move aside before anything is appended after it; bytes no write
    /// of this writer could have left are damage.
    fn refuse_torn(&self, torn: Option<&scan::TornTail>, after_seq: u64) -> Result<(), AuditError> {
        match torn {
            None => Ok(()),
            Some(t) => Err(self.torn_error(t, after_seq)),
        }
    }

    /// [`TailCheck::refuse_torn`]'s error for a torn tail `t`.
    fn torn_error(&self, t: &scan::TornTail, after_seq: u64) -> AuditError {
        if !t.cut_short {
            return self.corrupt(t.failure.to_string());
        }
        match self.file.metadata() {
            Ok(meta) => AuditError::TornTail {
                path: self.path.to_owned(),
                after_seq,
                offset: t.offset,
                len: t.len,
                file_id: crate::base::sys::unix::file_id(&meta),
            },
            Err(e) => AuditError::io("inspect audit log", self.path)(e),
        }
    }

    /// Cuts off the space a killed writer reserved past the records (`leftover`: the file's
    /// length), once they have been judged: the only change `open` makes to a log before it
    /// appends.
    fn cut_leftover(&self, records_end: u64, leftover: Option<u64>) -> Result<(), AuditError> {
        if leftover.is_some() {
            self.file
                .set_len(records_end)
                .map_err(AuditError::io("release the reserved tail of", &self.path))?;
        }
        Ok(())
    }

    fn corrupt(&self, reason: String) -> AuditError {
        AuditError::CorruptTail {
            path: self.path.to_owned(),
            reason,
        }
    }

    /// Whether the complete line ending at `off` is the anchored record, sealed with the key.
    fn anchored_record_at(&self, off: u64, a: &Anchor, mac: &MacChecker) -> bool {
        record_ending_at(self.file, off, a, mac)
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
fn segment_ends_at(dir: &Beneath, path: &Path, a: &Anchor, mac: &MacChecker) -> bool {
    let Ok(file) = dir.open_read(super::lock::below(dir, path)) else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    record_ending_at(&file, meta.len(), a, mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::writer::testing::*;

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
}
