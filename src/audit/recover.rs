//! Opening a log for a new run, and recovering from a log that cannot be extended.
//!
//! Owns the decision "extend this chain, or set it aside and start a new one". A log is extended
//! only if its tail checks with this user's key and its anchor (see [`super::writer`]: the anchored
//! record and every record after it, hash, MAC and link; the start reads only that tail, so it
//! costs the same on a 1 GB log as on an empty one). Records before the anchored one are checked
//! by `audit verify`, not here: a record changed in the middle of the log is reported by
//! `audit verify`, and the next run keeps appending after it (issue 15 traded this issue-12
//! check for a start that does not read the whole log; see `docs/SECURITY.md`). Otherwise (a
//! torn last line after a crash or `SIGXFSZ`, a log written under another key, a log removed by
//! `cargo clean` while its anchor survived, a tampered tail record, a log shorter than its
//! anchor) nothing is deleted:
//!
//! - the old log is renamed `<name>.set-aside-<time>.jsonl` beside it (if there is one), and
//!   its segments `<name>.<NNNNN>.jsonl` to `<name>.set-aside-<time>.<NNNNN>.jsonl` (so the
//!   set-aside chain keeps its segments, and `audit verify` follows them);
//! - its anchor is renamed `<H>.set-aside-<time>.json` in the anchors directory (outside the
//!   target directory, so `cargo clean` does not take it);
//! - a new chain starts whose first record, [`CHAIN_RESTARTED`], is sealed like every other and
//!   names the reason, both set-aside paths and the old head (the anchor's `seq`/`hash`, and the
//!   last readable record's), so `audit verify` can report the break and check the old chain
//!   with its own anchor.
//!
//! One thing is not a reason to start over: an incomplete last line *after* the anchored head
//! and every whole record after it, that is a prefix of the next record's line (what a crash or
//! a power loss in the middle of a `write` leaves, see [`super::writer`]). Those bytes were never
//! a record; no tool call was forwarded on an intent record among them (a call is forwarded
//! only after its intent record's whole line is written). They are copied to
//! `<name>.torn-<time>.partial` beside the log (the copy and its directory synced), cut off the
//! log, and the chain continues from the last whole record with a sealed
//! [`TORN_TAIL_SET_ASIDE`] record naming their length, SHA-256 and where they were kept. If the
//! process dies between the cut and that record, the copy stays, named by no record.
//!
//! Must not touch: record content beyond the restart and torn-tail records, policy, stdout.

use super::chain::Record;
use super::keys::KeyStore;
use super::lock::below;
use super::writer::{AuditLog, AuditOptions};
use super::{AuditError, scan};
use crate::base::beneath::{Access, Beneath, Create};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

pub use super::record_type::{CHAIN_RESTARTED, TOOL_RUN, TORN_TAIL_SET_ASIDE};

/// What a recovery did (for the one status line `run` prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The chain could not be extended: it was set aside and a new one started.
    SetAside(SetAside),
    /// A crash's incomplete last write was moved out of the log; the chain continues.
    TornTailKept(TornTailKept),
}

impl Recovery {
    /// One status line.
    pub fn status_line(&self, log: &Path) -> String {
        match self {
            Recovery::SetAside(s) => s.status_line(log),
            Recovery::TornTailKept(t) => format!(
                "audit tail kept aside: an incomplete last write in {} ({} bytes after record {}, an interrupted write) was moved to {}; the chain continues",
                log.display(),
                t.bytes,
                t.after_seq,
                t.kept_as.display()
            ),
        }
    }

    /// The set-aside, if that is what happened.
    pub fn into_set_aside(self) -> Option<SetAside> {
        match self {
            Recovery::SetAside(s) => Some(s),
            Recovery::TornTailKept(_) => None,
        }
    }
}

/// A chain set aside (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub reason: String,
    pub set_aside_log: Option<PathBuf>,
    pub set_aside_anchor: Option<PathBuf>,
    /// `(seq, hash)` the old anchor named.
    pub previous_head: Option<(u64, String)>,
}

/// A torn tail moved out of the log (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTailKept {
    /// The last whole record, which the chain continues.
    pub after_seq: u64,
    pub offset: u64,
    pub bytes: u64,
    pub sha256: String,
    pub kept_as: PathBuf,
}

impl SetAside {
    /// One status line.
    pub fn status_line(&self, log: &Path) -> String {
        let head = match &self.previous_head {
            Some((seq, hash)) => format!(
                "old head seq {seq} {}",
                crate::screen::sanitize::first_chars(hash, 12)
            ),
            None => "no anchored head".into(),
        };
        format!(
            "audit log set aside: {} ({}); kept as {} (anchor {}); a new chain starts in {} referencing the {head}",
            log.display(),
            self.reason,
            self.set_aside_log
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "nothing (no log file was left)".into()),
            self.set_aside_anchor
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "none".into()),
            log.display(),
        )
    }
}

fn recoverable(e: &AuditError) -> bool {
    matches!(
        e,
        AuditError::CorruptTail { .. } | AuditError::BadAnchor { .. } | AuditError::Verify(_)
    )
}

/// [`open_for_run_with`] with the default options.
pub fn open_for_run(
    path: &Path,
    keys: &KeyStore,
) -> Result<(AuditLog, Option<Recovery>), AuditError> {
    open_for_run_with(path, keys, &AuditOptions::default())
}

/// Opens `path` for a new run as its only writer: the tail is checked (see [`super::writer`]); a
/// log whose tail does not check is set aside and a new chain starts (see the module doc), its
/// restart record committed before this returns. Errors that recovery cannot fix (I/O, a
/// symlink, an insecure key or directory, another writer holding the log) are returned.
pub fn open_for_run_with(
    path: &Path,
    keys: &KeyStore,
    opts: &AuditOptions,
) -> Result<(AuditLog, Option<Recovery>), AuditError> {
    open_for_run_within(None, path, keys, opts)
}

/// [`open_for_run_with`] for a log that may be below `within`, a root the caller holds for its
/// session (`run`'s `target/mcp-dev`): the log's directory is then opened below it, no link
/// followed on the way (see [`super::lock`]).
pub fn open_for_run_within(
    within: Option<&Beneath>,
    path: &Path,
    keys: &KeyStore,
    opts: &AuditOptions,
) -> Result<(AuditLog, Option<Recovery>), AuditError> {
    // The writer lock is held from the check through the set-aside to the new chain: no other
    // writer can append to, or set aside, the same log in between.
    let lock = AuditLog::lock_within(within, path, keys, opts)?;
    let (problem, lock) = match AuditLog::open_locked(path, keys, opts, lock) {
        Ok(log) => return Ok((log, None)),
        Err((
            AuditError::TornTail {
                after_seq,
                offset,
                len,
                file_id,
                ..
            },
            Some(lock),
        )) => {
            let torn = Torn {
                after_seq,
                offset,
                len,
                file_id,
            };
            let kept = keep_torn_tail(lock.dir(), path, &torn, &stamp())?;
            let mut log = AuditLog::open_locked(path, keys, opts, lock).map_err(|(e, _)| e)?;
            log.append(
                TORN_TAIL_SET_ASIDE,
                TOOL_RUN,
                None,
                json!({
                    "afterSeq": kept.after_seq,
                    "offset": kept.offset,
                    "bytes": kept.bytes,
                    "sha256": kept.sha256,
                    "keptAs": kept.kept_as.to_string_lossy(),
                }),
            )?;
            log.commit()?;
            return Ok((log, Some(Recovery::TornTailKept(kept))));
        }
        Err((e, Some(lock))) if recoverable(&e) => (e.to_string(), lock),
        Err((e, _)) => return Err(e),
    };
    let recovery = set_aside(lock.dir(), path, keys, &problem)?;
    let mut log = AuditLog::open_locked(path, keys, opts, lock).map_err(|(e, _)| e)?;
    let head = |h: &Option<(u64, String)>| match h {
        Some((seq, hash)) => json!({"seq": seq, "hash": hash}),
        None => Value::Null,
    };
    let last = recovery
        .set_aside_log
        .as_deref()
        .and_then(|aside| last_record(log.dir().ok()?, aside))
        .map(|r| (r.seq, r.hash));
    log.append(
        CHAIN_RESTARTED,
        TOOL_RUN,
        None,
        json!({
            "reason": recovery.reason,
            "previousLog": recovery.set_aside_log.as_ref().map(|p| p.to_string_lossy()),
            "previousAnchor": recovery.set_aside_anchor.as_ref().map(|p| p.to_string_lossy()),
            "previousHead": head(&recovery.previous_head),
            "previousLastRecord": head(&last),
        }),
    )?;
    log.commit()?;
    Ok((log, Some(Recovery::SetAside(recovery))))
}

/// The torn tail `open` judged (see [`AuditError::TornTail`]).
struct Torn {
    after_seq: u64,
    offset: u64,
    len: u64,
    file_id: (u64, u64),
}

/// Copies bytes `offset..offset + len` of the log (its torn tail) to a new file beside it,
/// syncs that copy, then cuts them off the log. The caller holds the writer lock, so the log
/// is as `open` judged it; another file at the path, or a length that changed anyway, is
/// refused.
fn keep_torn_tail(
    dir: &Beneath,
    path: &Path,
    torn: &Torn,
    stamp: &str,
) -> Result<TornTailKept, AuditError> {
    use std::io::{Read, Seek, SeekFrom};
    let &Torn {
        after_seq,
        offset,
        len,
        file_id,
    } = torn;
    let log = dir
        .open_with(below(dir, path), Access::ReadWrite, Create::No)
        .map_err(AuditError::io("open audit log", path))?;
    let meta = log
        .metadata()
        .map_err(AuditError::io("inspect audit log", path))?;
    // The data's end: a killed writer's reservation (NUL bytes) may follow the torn bytes, and
    // goes with them.
    let data_len =
        scan::data_end(&log, meta.len()).map_err(AuditError::io("read the torn tail of", path))?;
    let changed = if crate::base::sys::unix::file_id(&meta) != file_id {
        Some("it was replaced while it was opened".to_string())
    } else if data_len != offset + len {
        Some(format!(
            "its length changed while it was opened ({} bytes, then {data_len})",
            offset + len,
        ))
    } else {
        None
    };
    if let Some(reason) = changed {
        return Err(AuditError::CorruptTail {
            path: path.to_owned(),
            reason,
        });
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audit".into());
    let (kept_as, mut copy) =
        beside_unique(path, &format!("{stem}.torn-{stamp}"), "partial", |to| {
            dir.open_with(below(dir, to), Access::ReadWrite, Create::New(0o600))
        })
        .map_err(AuditError::io("keep the torn tail of", path))?;
    let mut tail = &log;
    tail.seek(SeekFrom::Start(offset))
        .map_err(AuditError::io("read the torn tail of", path))?;
    let (sha256, copied) = crate::base::hashing::sha256_copy(tail.take(len), &mut copy)
        .map_err(AuditError::io("keep the torn tail of", path))?;
    if copied != len {
        return Err(AuditError::CorruptTail {
            path: path.to_owned(),
            reason: format!("its torn tail could not be read whole ({copied} of {len} bytes)"),
        });
    }
    // The copy, and its name, are on disk before the bytes leave the log.
    copy.sync_all().map_err(AuditError::io("sync", &kept_as))?;
    dir.sync()
        .map_err(AuditError::io("sync the directory of", &kept_as))?;
    log.set_len(offset)
        .and_then(|()| log.sync_data())
        .map_err(AuditError::io("cut the torn tail off", path))?;
    Ok(TornTailKept {
        after_seq,
        offset,
        bytes: len,
        sha256,
        kept_as,
    })
}

/// A short reason from a long error text: the part that says what is wrong.
fn reason_of(problem: &str) -> String {
    let p = problem
        .split_once(" is damaged (")
        .map(|(_, r)| r)
        .and_then(|r| r.split_once("); refusing").map(|(r, _)| r))
        .unwrap_or(problem);
    p.to_string()
}

fn stamp() -> String {
    let now = std::time::SystemTime::now();
    let t = humantime::format_rfc3339_seconds(now).to_string();
    // 2026-12-03T08:12:32Z -> 20261203T081232Z, plus the pid: unique per second per process.
    let compact: String = t.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    format!("{compact}-{}", std::process::id())
}

/// Moves the log and its anchor aside (never deletes either).
/// The log's files are reached from `dir` (its directory, held by the writer lock), the anchor
/// from the key store's held directory.
fn set_aside(
    dir: &Beneath,
    path: &Path,
    keys: &KeyStore,
    problem: &str,
) -> Result<SetAside, AuditError> {
    let stamp = stamp();
    let anchor_path = keys.anchor_path(path).ok();
    let previous_head = anchor_path
        .as_deref()
        .and_then(|a| keys.read_anchor_below(a).ok().flatten())
        .map(|a| (a.seq, a.hash));
    let file_name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audit".into());
    let non_empty = dir
        .metadata(below(dir, path))
        .map(|m| m.len > 0)
        .unwrap_or(false);
    let segments =
        scan::list_segments_in(dir, path).map_err(AuditError::io("list the segments of", path))?;
    let set_aside_log = if non_empty || !segments.is_empty() {
        // Always under a new name, even if only segments are left (the chain is then named
        // by an empty active file).
        if !non_empty {
            let _ = dir.open_with(below(dir, path), Access::Append, Create::IfMissing(0o666));
        }
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_else(|| "jsonl".into());
        let aside = move_aside(dir, path, &format!("{file_name}.set-aside-{stamp}"), &ext)
            .map_err(AuditError::io("set aside audit log", path))?;
        for (n, segment) in segments {
            let to = scan::segment_path(&aside, n);
            rename_new(dir, &segment, &to)
                .map_err(AuditError::io("set aside audit segment", &segment))?;
        }
        Some(aside)
    } else {
        None
    };
    let anchors = keys.root().ok();
    let set_aside_anchor = match (&anchor_path, &anchors) {
        (Some(a), Some(anchors)) if anchors.exists(below(anchors, a)) => {
            let stem = a
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let aside = move_aside(anchors, a, &format!("{stem}.set-aside-{stamp}"), "json")
                .map_err(AuditError::io("set aside anchor", a))?;
            Some(aside)
        }
        _ => None,
    };
    let mut reason = reason_of(problem);
    if !non_empty && previous_head.is_some() {
        reason = format!("{reason}; the log is missing or empty (removed, e.g. by `cargo clean`?)");
    }
    Ok(SetAside {
        reason,
        set_aside_log,
        set_aside_anchor,
        previous_head,
    })
}

/// Moves `from` to `<base>.<ext>` beside it, or `<base>-2.<ext>`… when that name is taken (two
/// recoveries in the same second): evidence is never overwritten. Both are below `dir`.
fn move_aside(dir: &Beneath, from: &Path, base: &str, ext: &str) -> std::io::Result<PathBuf> {
    beside_unique(from, base, ext, |to| rename_new(dir, from, to)).map(|(to, ())| to)
}

/// Runs `place` on `<base>.<ext>` beside `from`, or `<base>-2.<ext>`… while it reports the name
/// taken: evidence is never overwritten.
fn beside_unique<T>(
    from: &Path,
    base: &str,
    ext: &str,
    mut place: impl FnMut(&Path) -> std::io::Result<T>,
) -> std::io::Result<(PathBuf, T)> {
    let mut n = 1;
    loop {
        let name = if n == 1 {
            format!("{base}.{ext}")
        } else {
            format!("{base}-{n}.{ext}")
        };
        let to = from.with_file_name(name);
        match place(&to) {
            Ok(t) => return Ok((to, t)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
            Err(e) => return Err(e),
        }
    }
}

/// `rename`, refusing to replace an existing destination (hard link + unlink: both names exist
/// for an instant, the destination is never overwritten).
fn rename_new(dir: &Beneath, from: &Path, to: &Path) -> std::io::Result<()> {
    dir.hard_link(below(dir, from), below(dir, to))?;
    dir.remove_file(below(dir, from))
}

/// The last record of a log that parses (best effort, for the restart record).
fn last_record(dir: &Beneath, path: &Path) -> Option<Record> {
    use std::io::{Read, Seek, SeekFrom};
    // The last 1 MiB at most: recovery must not read a whole large log either.
    let mut file = dir.open_read(below(dir, path)).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(1 << 20)))
        .ok()?;
    let mut text = Vec::new();
    file.read_to_end(&mut text).ok()?;
    text.split(|&b| b == b'\n')
        .rev()
        .filter_map(|l| std::str::from_utf8(l).ok())
        .find_map(|l| Record::from_line(l).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::VerifyFailure;
    use std::io::Write;

    fn setup() -> (tempfile::TempDir, KeyStore, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("target/mcp-dev/audit/srv.jsonl");
        (tmp, keys, path)
    }

    fn write_some(path: &Path, keys: &KeyStore, n: usize) {
        let (mut log, rec) = open_for_run(path, keys).unwrap();
        assert_eq!(rec, None);
        for i in 0..n {
            log.append("x", "R", None, json!({"i": i})).unwrap();
        }
    }

    fn aside_files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".set-aside-"))
            .collect();
        v.sort();
        v
    }

    /// Issue 12, high finding "a set-aside audit log bricks `run`" (the `cargo clean` case):
    /// the log is gone but its anchor survives; the next run used to exit 1 forever.
    #[test]
    fn log_removed_by_cargo_clean_starts_a_new_chain() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 3);
        let old_head = keys.read_anchor(&path).unwrap().unwrap();
        std::fs::remove_dir_all(path.parent().unwrap().parent().unwrap()).unwrap();
        let (mut log, rec) = open_for_run(&path, &keys).unwrap();
        let rec = rec.expect("recovered").into_set_aside().expect("set aside");
        assert_eq!(rec.previous_head, Some((3, old_head.hash.clone())));
        assert!(rec.set_aside_log.is_none());
        let anchor_aside = rec.set_aside_anchor.clone().expect("anchor kept");
        assert!(anchor_aside.exists());
        assert!(rec.reason.contains("cargo clean"), "{}", rec.reason);
        assert!(rec.status_line(&path).starts_with("audit log set aside: "));
        log.append("x", "R", None, json!({})).unwrap();
        drop(log);
        // The new chain verifies and names the break; later runs extend it without recovery.
        let r = crate::audit::verify(&path, &keys).unwrap();
        let b = r.previous.as_deref().expect("a break is reported");
        assert_eq!(b.previous_head, Some((3, old_head.hash)));
        assert!(b.previous.is_err(), "the old log is gone: {:?}", b.previous);
        let (_log, again) = open_for_run(&path, &keys).unwrap();
        assert_eq!(again, None);
    }

    /// Issue 15 (kill -9 in a burst): a write the kernel cut short at a page boundary leaves an
    /// incomplete last line after the anchored head. It is kept beside the log, cut off, and
    /// the chain continues from the last whole record; `audit verify` passes before and after.
    #[test]
    fn torn_write_after_the_anchor_is_kept_and_the_chain_continues() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 2);
        let whole = std::fs::read(&path).unwrap();
        let torn_bytes = b"{\"v\":1,\"seq\":3,\"time\":\"20";
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(torn_bytes)
            .unwrap();
        // Before the next run: what was written verifies; the torn bytes are named, not counted.
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!((r.records, r.head_seq), (2, 2));
        let t = r.torn_tail.expect("the torn tail is reported");
        assert_eq!((t.line, t.offset, t.bytes), (3, whole.len() as u64, 25));
        let head = r.head_hash;

        let (mut log, rec) = open_for_run(&path, &keys).unwrap();
        let Some(Recovery::TornTailKept(kept)) = rec.clone() else {
            panic!("expected the torn tail kept, got {rec:?}");
        };
        assert_eq!((kept.after_seq, kept.bytes), (2, torn_bytes.len() as u64));
        assert_eq!(std::fs::read(&kept.kept_as).unwrap(), torn_bytes);
        assert_eq!(kept.sha256, crate::base::hashing::sha256_bytes(torn_bytes));
        assert!(
            rec.unwrap()
                .status_line(&path)
                .contains("(25 bytes after record 2, an interrupted write)"),
        );
        assert_eq!(log.append("x", "R", None, json!({})).unwrap().seq, 4);
        drop(log);
        let text = std::fs::read(&path).unwrap();
        assert!(text.starts_with(&whole), "whole records kept byte for byte");
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!((r.records, r.torn_tail, r.previous), (4, None, None));
        let records = crate::audit::read_records(&path).unwrap();
        let note = &records[2];
        assert_eq!(note.record_type, TORN_TAIL_SET_ASIDE);
        assert_eq!(note.prev, head, "continues the last whole record");
        assert_eq!(note.data["sha256"], json!(kept.sha256));
        assert_eq!(note.data["afterSeq"], json!(2));
        assert!(
            aside_files(path.parent().unwrap()).is_empty(),
            "no set-aside"
        );
    }

    /// Issue 12, high finding (torn last line), where the torn line is the anchored record: the
    /// log was cut after the writer finished it, so it is kept aside with its anchor and both
    /// chains are reported.
    #[test]
    fn a_cut_anchored_record_is_set_aside_and_both_chains_are_reported() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 3);
        let text = std::fs::read(&path).unwrap();
        let cut = text.len() - 40;
        std::fs::write(&path, &text[..cut]).unwrap();
        let torn = std::fs::read(&path).unwrap();
        let f = crate::audit::verify(&path, &keys).unwrap_err();
        assert_eq!(f.line, 3, "{f}");
        assert!(f.reason.starts_with("incomplete last line"), "{f}");
        let (log, rec) = open_for_run(&path, &keys).unwrap();
        drop(log);
        let rec = rec.unwrap().into_set_aside().expect("set aside");
        let aside = rec.set_aside_log.clone().unwrap();
        assert_eq!(
            std::fs::read(&aside).unwrap(),
            torn,
            "evidence kept byte for byte"
        );
        assert_eq!(aside_files(path.parent().unwrap()), vec![aside.clone()]);
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(r.records, 1);
        let b = r.previous.as_deref().unwrap();
        assert_eq!(b.previous_log.as_deref(), Some(aside.as_path()));
        let f: &VerifyFailure = b.previous.as_ref().unwrap_err();
        assert!(f.reason.contains("incomplete last line"), "{f}");
        assert_eq!(b.previous_head.as_ref().map(|h| h.0), Some(3));
    }

    fn file_id(path: &Path) -> (u64, u64) {
        crate::base::sys::unix::file_id(&std::fs::metadata(path).unwrap())
    }

    /// Appends `bytes` to the log, unterminated.
    fn append_raw(path: &Path, bytes: &[u8]) {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
    }

    /// Only what an interrupted write can leave is a torn tail: a prefix of the next record's
    /// line. Other unterminated bytes after the head are damage: verify fails, and the log is
    /// set aside, never cut.
    #[test]
    fn unterminated_bytes_that_no_write_left_are_damage() {
        let cases: [(&str, &[u8], &str); 4] = [
            ("not JSON", b"hello", "incomplete last line"),
            (
                "another seq",
                b"{\"v\":1,\"seq\":9,\"ti",
                "incomplete last line",
            ),
            (
                "a cut inside JSON that is invalid before the cut",
                b"{\"v\":1,\"seq\":3,\"time\":]",
                "incomplete last line",
            ),
            (
                "invalid UTF-8 before the end",
                b"{\"v\":1,\"seq\":3,\"time\":\"\xff2",
                "not UTF-8",
            ),
        ];
        for (what, bytes, reason) in cases {
            let (_tmp, keys, path) = setup();
            write_some(&path, &keys, 2);
            append_raw(&path, bytes);
            let f = crate::audit::verify(&path, &keys).unwrap_err();
            assert_eq!(f.line, 3, "{what}: {f}");
            assert!(f.reason.contains(reason), "{what}: {f}");
            let (_log, rec) = open_for_run(&path, &keys).unwrap();
            let rec = rec.and_then(Recovery::into_set_aside);
            let aside = rec.and_then(|r| r.set_aside_log).expect(what);
            assert!(std::fs::read(aside).unwrap().ends_with(bytes), "{what}");
        }
        // A whole line that parses but does not check (tampered), without its `\n`.
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 3);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(&path, format!("{}\n{}\n", lines[0], lines[1])).unwrap();
        let tampered = lines[2].replace("\"i\":2", "\"i\":7");
        // The anchor names record 3, so a lagging anchor is simulated by one for record 2.
        let mut a = keys.read_anchor(&path).unwrap().unwrap();
        let second = Record::from_line(lines[1]).unwrap();
        a.seq = 2;
        a.hash = second.hash.clone();
        a.mac = crate::audit::anchor_mac(&keys.load_key().unwrap(), 2, &second.hash);
        a.offset = Some((lines[0].len() + lines[1].len() + 2) as u64);
        std::fs::write(
            keys.anchor_path(&path).unwrap(),
            serde_json::to_vec(&a).unwrap(),
        )
        .unwrap();
        // Untampered, the same record without its `\n` is a torn tail (checked whole).
        append_raw(&path, lines[2].as_bytes());
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(r.torn_tail.map(|t| t.bytes), Some(lines[2].len() as u64));
        std::fs::write(&path, format!("{}\n{}\n{tampered}", lines[0], lines[1])).unwrap();
        let f = crate::audit::verify(&path, &keys).unwrap_err();
        assert!(f.reason.contains("hash mismatch"), "{f}");
        let (_log, rec) = open_for_run(&path, &keys).unwrap();
        assert!(rec.and_then(Recovery::into_set_aside).is_some());
    }

    /// What a kill leaves when the page boundary falls inside a multi-byte character, or right
    /// before the `\n`: both kept and continued. And the full-scan path (an anchor without
    /// its offset) keeps a torn tail too.
    #[test]
    fn torn_tails_cut_anywhere_are_kept() {
        let key_time = "{\"v\":1,\"seq\":3,\"time\":\"2026-12-03T00:00:00.000Z\",\"type\":\"x\",\"run\":\"\u{e9}";
        let cut_in_char = &key_time.as_bytes()[..key_time.len() - 1];
        for (what, old_anchor) in [("current anchor", false), ("anchor without offset", true)] {
            let (_tmp, keys, path) = setup();
            write_some(&path, &keys, 2);
            if old_anchor {
                let mut a = keys.read_anchor(&path).unwrap().unwrap();
                a.offset = None;
                std::fs::write(
                    keys.anchor_path(&path).unwrap(),
                    serde_json::to_vec(&a).unwrap(),
                )
                .unwrap();
            }
            append_raw(&path, cut_in_char);
            let r = crate::audit::verify(&path, &keys).unwrap();
            assert_eq!(
                r.torn_tail.map(|t| t.bytes),
                Some(cut_in_char.len() as u64),
                "{what}"
            );
            let (mut log, rec) = open_for_run(&path, &keys).unwrap();
            assert!(
                matches!(rec, Some(Recovery::TornTailKept(_))),
                "{what}: {rec:?}"
            );
            log.append("x", "R", None, json!({})).unwrap();
            drop(log);
            let r = crate::audit::verify(&path, &keys).unwrap();
            assert_eq!((r.records, r.torn_tail), (4, None), "{what}");
        }
    }

    /// The first write after a rotation cut short: the active file holds only a torn line and
    /// the anchor still names the previous segment's last record. Verify and the writer agree:
    /// kept, the segment restarted, the chain continued. A torn line in a segment is damage.
    #[test]
    fn a_torn_first_write_after_a_rotation_is_kept() {
        let (_tmp, keys, path) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 600,
            ..AuditOptions::default()
        };
        {
            let (mut log, _) = open_for_run_with(&path, &keys, &opts).unwrap();
            for i in 0..6 {
                log.append("x", "R", None, json!({"i": i, "pad": "p".repeat(60)}))
                    .unwrap();
            }
        }
        let segments = scan::list_segments(&path).unwrap();
        let (_, last_segment) = segments.last().cloned().expect("rotated");
        // Back to the moment after the rename: no active file records, anchor at the segment.
        let last_in_segment = std::fs::read_to_string(&last_segment)
            .unwrap()
            .lines()
            .last()
            .map(|l| Record::from_line(l).unwrap())
            .unwrap();
        let key = keys.load_key().unwrap();
        let anchor = crate::audit::Anchor {
            log: std::fs::canonicalize(&path)
                .unwrap()
                .to_string_lossy()
                .into_owned(),
            seq: last_in_segment.seq,
            mac: crate::audit::anchor_mac(&key, last_in_segment.seq, &last_in_segment.hash),
            hash: last_in_segment.hash.clone(),
            offset: Some(std::fs::metadata(&last_segment).unwrap().len()),
        };
        std::fs::write(
            keys.anchor_path(&path).unwrap(),
            serde_json::to_vec(&anchor).unwrap(),
        )
        .unwrap();
        let torn = format!(
            "{{\"v\":1,\"seq\":{},\"time\":\"20",
            last_in_segment.seq + 1
        );
        std::fs::write(&path, &torn).unwrap();
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(r.head_seq, last_in_segment.seq);
        assert_eq!(
            r.torn_tail.map(|t| (t.offset, t.bytes)),
            Some((0, torn.len() as u64))
        );
        let (log, rec) = open_for_run_with(&path, &keys, &opts).unwrap();
        drop(log);
        let Some(Recovery::TornTailKept(kept)) = rec else {
            panic!("{rec:?}");
        };
        assert_eq!(std::fs::read(&kept.kept_as).unwrap(), torn.as_bytes());
        let records = crate::audit::read_records(&path).unwrap();
        let types: Vec<&str> = records
            .iter()
            .skip_while(|r| r.seq <= last_in_segment.seq)
            .map(|r| r.record_type.as_str())
            .collect();
        assert_eq!(types, [crate::audit::SEGMENT_STARTED, TORN_TAIL_SET_ASIDE]);
        crate::audit::verify(&path, &keys).unwrap();

        // A segment is whole when it is renamed: a torn line there is damage.
        append_raw(&last_segment, b"{\"v\":1,");
        let f = crate::audit::verify(&path, &keys).unwrap_err();
        assert!(f.reason.starts_with("in segment "), "{f}");
        assert!(f.reason.contains("incomplete last line"), "{f}");
    }

    /// The torn tail is copied, not renamed over: a name already taken gets the next one.
    #[test]
    fn a_torn_tail_copy_never_overwrites() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 1);
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":")
            .unwrap();
        let id = file_id(&path);
        let torn = |bytes| Torn {
            after_seq: 1,
            offset: len,
            len: bytes,
            file_id: id,
        };
        let dir = Beneath::open(path.parent().unwrap()).unwrap();
        let first = keep_torn_tail(&dir, &path, &torn(5), "T").unwrap();
        // The same stamp (two recoveries in one second): the first copy stays.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1")
            .unwrap();
        let second = keep_torn_tail(&dir, &path, &torn(6), "T").unwrap();
        assert!(first.kept_as.ends_with("srv.torn-T.partial"), "{first:?}");
        assert!(
            second.kept_as.ends_with("srv.torn-T-2.partial"),
            "{second:?}"
        );
        assert_eq!(std::fs::read(&first.kept_as).unwrap(), b"{\"v\":");
        assert_eq!(std::fs::read(&second.kept_as).unwrap(), b"{\"v\":1");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        // A length that is not what was judged is refused, and nothing is cut.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{")
            .unwrap();
        let e = keep_torn_tail(&dir, &path, &torn(5), "T").unwrap_err();
        assert!(e.to_string().contains("length changed"), "{e}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len + 1);
        // Another file put in its place is not cut.
        let other = path.with_extension("other");
        std::fs::copy(&path, &other).unwrap();
        std::fs::rename(&other, &path).unwrap();
        let e = keep_torn_tail(&dir, &path, &torn(1), "T").unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len + 1);
    }

    /// A log another writer holds is not judged, so it is never set aside (even a damaged
    /// one): the run fails with the writer error instead.
    #[test]
    fn a_held_log_is_an_error_not_a_recovery() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 2);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"torn\"}\n")
            .unwrap();
        let holder = std::fs::File::create(crate::audit::lock::lock_path(&path)).unwrap();
        rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let opts = AuditOptions {
            lock_wait: std::time::Duration::from_millis(100),
            ..AuditOptions::default()
        };
        let e = open_for_run_with(&path, &keys, &opts).unwrap_err();
        assert!(matches!(e, AuditError::WriterBusy { .. }), "{e}");
        assert!(aside_files(path.parent().unwrap()).is_empty());
        drop(holder);
        assert!(
            open_for_run(&path, &keys)
                .unwrap()
                .1
                .and_then(Recovery::into_set_aside)
                .is_some(),
            "judged once free"
        );
    }

    /// Issue 15 trade-off: start reads only the anchored tail, so a record changed before the
    /// anchored one is not noticed by `run` (the chain is extended) but `audit verify` names it.
    #[test]
    fn a_tampered_middle_record_is_left_to_audit_verify() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 4);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let mut r = Record::from_line(&lines[1]).unwrap();
        r.data = json!({"i": 7});
        r.hash = r.compute_hash().unwrap();
        lines[1] = String::from_utf8(r.to_line().unwrap()).unwrap();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let (mut log, rec) = open_for_run(&path, &keys).unwrap();
        assert!(rec.is_none(), "start does not read the middle");
        assert_eq!(log.append("x", "R", None, json!({})).unwrap().seq, 5);
        drop(log);
        let f = crate::audit::verify(&path, &keys).unwrap_err();
        assert_eq!((f.line, f.seq), (2, Some(2)), "{f}");
        assert!(f.reason.contains("MAC invalid"), "{f}");
    }

    /// Issue 12, high finding (a log written under another key) and the tail of the low finding
    /// "a tampered record is not noticed when appending": both are set aside, never extended.
    #[test]
    fn foreign_key_and_tampered_tail_record_are_never_extended() {
        let (tmp, keys, path) = setup();
        write_some(&path, &keys, 3);
        let other = KeyStore::at(tmp.path().join("other-state"));
        let (_log, rec) = open_for_run(&path, &other).unwrap();
        let rec = rec.unwrap().into_set_aside().unwrap();
        assert!(rec.reason.contains("MAC"), "foreign key");

        let path2 = tmp.path().join("b.jsonl");
        write_some(&path2, &keys, 3);
        // Change the last (anchored) record and recompute its hash (no key: the MAC is stale).
        let text = std::fs::read_to_string(&path2).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let mut r = Record::from_line(&lines[2]).unwrap();
        r.data = json!({"i": 99});
        r.hash = r.compute_hash().unwrap();
        lines[2] = String::from_utf8(r.to_line().unwrap()).unwrap();
        std::fs::write(&path2, lines.join("\n") + "\n").unwrap();
        let (mut log, rec) = open_for_run(&path2, &keys).unwrap();
        let rec = rec
            .and_then(Recovery::into_set_aside)
            .expect("a tampered tail record is noticed before the first append");
        assert!(rec.reason.contains("record 3"), "{}", rec.reason);
        let first = log.head().unwrap().0;
        assert_eq!(first, 1, "a new chain");
        log.append("x", "R", None, json!({})).unwrap();
    }

    /// A segmented log that cannot be extended is set aside with its segments (renamed along,
    /// so the set-aside chain keeps them and the new chain starts with none).
    #[test]
    fn segments_are_set_aside_with_their_log() {
        let (_tmp, keys, path) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 600,
            ..AuditOptions::default()
        };
        {
            let (mut log, _) = open_for_run_with(&path, &keys, &opts).unwrap();
            for i in 0..12 {
                log.append("x", "R", None, json!({"i": i, "pad": "p".repeat(60)}))
                    .unwrap();
            }
        }
        let segments = scan::list_segments(&path).unwrap();
        assert!(segments.len() >= 2, "{segments:?}");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"v\":1}\n")
            .unwrap();
        let (log, rec) = open_for_run_with(&path, &keys, &opts).unwrap();
        drop(log);
        let aside = rec
            .and_then(Recovery::into_set_aside)
            .expect("set aside")
            .set_aside_log
            .unwrap();
        assert!(scan::list_segments(&path).unwrap().is_empty());
        let moved = scan::list_segments(&aside).unwrap();
        assert_eq!(moved.len(), segments.len());
        for ((n, _), (m, p)) in segments.iter().zip(&moved) {
            assert_eq!(n, m);
            assert!(p.exists());
        }
        let r = crate::audit::verify(&path, &keys).unwrap();
        assert_eq!(r.segments.len(), 1);
        let old = r.previous.unwrap().previous.unwrap_err();
        assert!(old.reason.contains("malformed"), "{old}");
    }

    /// An anchor written before issue 15 (no offset) costs one scan, then is upgraded.
    #[test]
    fn an_old_anchor_without_offset_is_upgraded() {
        let (_tmp, keys, path) = setup();
        write_some(&path, &keys, 3);
        let anchor_path = keys.anchor_path(&path).unwrap();
        let mut a = keys.read_anchor(&path).unwrap().unwrap();
        assert_eq!(a.offset, Some(std::fs::metadata(&path).unwrap().len()));
        a.offset = None;
        std::fs::write(&anchor_path, serde_json::to_vec(&a).unwrap()).unwrap();
        let (log, rec) = open_for_run(&path, &keys).unwrap();
        assert!(rec.is_none());
        drop(log);
        let b = keys.read_anchor(&path).unwrap().unwrap();
        assert_eq!(
            (b.seq, b.offset),
            (3, Some(std::fs::metadata(&path).unwrap().len()))
        );
        // A wrong offset (not MAC'd) only costs a scan too.
        let mut c = b.clone();
        c.offset = Some(5);
        std::fs::write(&anchor_path, serde_json::to_vec(&c).unwrap()).unwrap();
        assert!(open_for_run(&path, &keys).unwrap().1.is_none());
        crate::audit::verify(&path, &keys).unwrap();
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// `cargo test --lib -- --ignored --nocapture open_for_run_cost`: what the tail check before
    /// a run's first append costs on a 20 000-record log (see `benches/audit.rs` for 1 GB).
    #[test]
    #[ignore]
    fn open_for_run_cost() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("a.jsonl");
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for i in 0..20_000u64 {
            log.append(
                "tool_called",
                "01JQ7R4S4S0QJ7GZP1S2",
                Some("01JQ7R9KQ6K2Y8W4JH0M"),
                json!({"callId": i, "tool": "write_inventory", "grant": "G1",
                    "credentialScopes": ["inventory-api-staging"], "argumentsDigest": "f".repeat(64)}),
            )
            .unwrap();
        }
        drop(log);
        let t = std::time::Instant::now();
        let (mut log, r) = open_for_run(&path, &keys).unwrap();
        assert!(r.is_none());
        let first = t.elapsed();
        log.append("run_ended", "R", None, json!({})).unwrap();
        drop(log);
        let t = std::time::Instant::now();
        let (_log, r) = open_for_run(&path, &keys).unwrap();
        assert!(r.is_none());
        eprintln!(
            "open_for_run on 20000 records ({} bytes): {first:?}, then {:?}",
            std::fs::metadata(&path).unwrap().len(),
            t.elapsed()
        );
    }
}
