//! Independent verification of a log: every line, the chain, the MACs and the anchor. Owns the
//! checks and the "first bad record" report. Must not touch: the log or the anchor (read only;
//! never creates a key), stdout.
//!
//! Checks, in order, for each line (1-based): UTF-8, a JSON record with exactly the known fields,
//! `v == 1`, `seq` equal to the line number (consecutive from 1), `prev` equal to the previous
//! record's `hash` (64 zeros for seq 1), `hash` well formed and equal to the recomputed hash,
//! `mac` valid under the key, and the line byte-identical to the writer's rendering of the
//! record. Then the anchor: it must exist for a non-empty log, carry a valid MAC, not name a
//! seq past the last record (truncated tail), and name the hash of the record at its seq.

use super::AuditError;
use super::chain::{
    FORMAT_VERSION, GENESIS_PREV, Record, is_digest_hex, verify_anchor_mac, verify_record_mac,
};
use super::keys::{self, Anchor, KeyStore};
use super::log::Lock;
use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io::{ErrorKind, Read};
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
    /// When the first record is a [`super::recover::CHAIN_RESTARTED`]: the break, and the
    /// verification of the chain that was set aside (with its own anchor).
    pub previous: Option<Box<ChainBreak>>,
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

/// The first problem found. `line` is 1-based; `0` means the problem is not at a line (missing
/// or empty log, missing key, missing or invalid anchor). For a truncated tail, `line` and `seq`
/// name the first missing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    pub line: usize,
    pub seq: Option<u64>,
    pub reason: String,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.seq) {
            (0, _) => write!(f, "{}", self.reason),
            (line, Some(seq)) => write!(f, "record {seq} (line {line}): {}", self.reason),
            (line, None) => write!(f, "line {line}: {}", self.reason),
        }
    }
}

impl std::error::Error for VerifyFailure {}

fn fail(line: usize, seq: Option<u64>, reason: impl Into<String>) -> VerifyFailure {
    VerifyFailure {
        line,
        seq,
        reason: reason.into(),
    }
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// Verifies the log at `path` with the key and anchor in `keys`.
pub fn verify(path: &Path, keys: &KeyStore) -> Result<VerifyReport, VerifyFailure> {
    verify_read(path, keys, None, true, MAX_BREAKS).map(|(report, _)| report)
}

/// Reads the log and its anchor, then checks them (I/O problems become line-0 failures).
fn verify_read(
    path: &Path,
    keys: &KeyStore,
    anchor_override: Option<Option<&Path>>,
    collect: bool,
    depth: usize,
) -> Result<(VerifyReport, Vec<Record>), VerifyFailure> {
    let data = read_log_and_anchor(path, keys, anchor_override)
        .map_err(|e| fail(0, None, e.to_string()))?;
    verify_inner(path, keys, data, anchor_override, collect, depth, false)
}

/// [`verify()`] without following breaks or keeping records (a writer checking a log before a
/// run's first append).
///
/// Incremental: after a success, a checkpoint sealed with the key records the verified length,
/// the SHA-256 of those bytes and the head there (`anchors/<H>.verified`). The next check hashes
/// that prefix (fast: no parsing) and fully checks only the records after it; any mismatch
/// (prefix changed, bad seal, anything unexpected) falls back to the full check, so the
/// checkpoint can save time but never hide a change.
///
/// The outer error is an I/O problem (the log could not be read or locked in time, no key): the
/// log's content was not judged, so the caller must not treat it as damaged.
pub(crate) fn verify_quiet(
    path: &Path,
    keys: &KeyStore,
) -> Result<Result<(), VerifyFailure>, AuditError> {
    keys.load_key()?;
    let data = read_log_and_anchor(path, keys, None)?;
    if verify_inner(path, keys, data, None, false, 0, true).is_ok() {
        return Ok(Ok(()));
    }
    // No usable checkpoint, or something after it failed: the full check decides (and names
    // the first bad record).
    let data = read_log_and_anchor(path, keys, None)?;
    Ok(verify_inner(path, keys, data, None, false, 0, false).map(|_| ()))
}

/// A sealed "verified up to here" mark (see [`verify_quiet`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    len: usize,
    prefix: String,
    seq: u64,
    hash: String,
    mac: String,
}

impl Checkpoint {
    fn path(keys: &KeyStore, log: &Path) -> Option<PathBuf> {
        keys.anchor_path(log)
            .ok()
            .map(|a| a.with_extension("verified"))
    }

    fn seal(key: &super::AuditKey, len: usize, prefix: &str, seq: u64, hash: &str) -> String {
        super::chain::keyed_digest(
            key,
            format!("cargo-mcp-dev/verified/v1\0{len}:{prefix}:{seq}:{hash}").as_bytes(),
        )
    }

    fn load(keys: &KeyStore, log: &Path, key: &super::AuditKey, contents: &[u8]) -> Option<Self> {
        let file = keys::open_nofollow(&Self::path(keys, log)?).ok()?;
        let cp: Checkpoint = serde_json::from_reader(file).ok()?;
        let valid = cp.len > 0
            && cp.len <= contents.len()
            && contents[cp.len - 1] == b'\n'
            && Self::seal(key, cp.len, &cp.prefix, cp.seq, &cp.hash) == cp.mac
            && crate::hashing::sha256_hex(&contents[..cp.len]) == cp.prefix;
        valid.then_some(cp)
    }

    fn store(
        keys: &KeyStore,
        log: &Path,
        key: &super::AuditKey,
        contents: &[u8],
        seq: u64,
        hash: &str,
    ) {
        let Some(path) = Self::path(keys, log) else {
            return;
        };
        let prefix = crate::hashing::sha256_hex(contents);
        let cp = Checkpoint {
            len: contents.len(),
            mac: Self::seal(key, contents.len(), &prefix, seq, hash),
            prefix,
            seq,
            hash: hash.to_string(),
        };
        if let Ok(text) = serde_json::to_vec(&cp) {
            let _ = crate::fsutil::write_atomic(&path, &text);
        }
    }

    /// Removes the checkpoint of a log (it describes a log that was set aside).
    pub(crate) fn forget(keys: &KeyStore, log: &Path) {
        if let Some(p) = Self::path(keys, log) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Forgets the verification checkpoint of `log` (see [`verify_quiet`]).
pub(crate) fn forget_checkpoint(keys: &KeyStore, log: &Path) {
    Checkpoint::forget(keys, log);
}

/// [`verify()`], also returning the records it checked (one read of the log, so journals show
/// exactly what was verified even if a writer appends meanwhile).
pub(crate) fn verify_and_collect(
    path: &Path,
    keys: &KeyStore,
) -> Result<(VerifyReport, Vec<Record>), VerifyFailure> {
    verify_read(path, keys, None, true, MAX_BREAKS)
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
        (Some(log), anchor) => verify_read(
            log,
            keys,
            Some(anchor.as_deref()),
            true,
            depth.saturating_sub(1),
        )
        .map(|(r, _)| r),
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

/// `anchor_override`: `Some(Some(path))` checks against that anchor file (a set-aside chain),
/// `Some(None)` against no anchor at all.
fn verify_inner(
    path: &Path,
    keys: &KeyStore,
    data: LogAndAnchor,
    anchor_override: Option<Option<&Path>>,
    collect: bool,
    depth: usize,
    incremental: bool,
) -> Result<(VerifyReport, Vec<Record>), VerifyFailure> {
    let (contents, anchor_path, anchor) = data;
    if contents.is_empty() {
        return Err(fail(
            0,
            None,
            format!("audit log {} is empty", path.display()),
        ));
    }
    let key = keys.load_key().map_err(|e| fail(0, None, e.to_string()))?;
    // Incremental mode: lines before the checkpoint are known good (their bytes hash to the
    // sealed prefix digest); only the rest is parsed and checked.
    let resume = if incremental {
        Some(
            Checkpoint::load(keys, path, &key, &contents)
                .ok_or_else(|| fail(0, None, "no usable checkpoint"))?,
        )
    } else {
        None
    };
    let skip_lines = resume.as_ref().map(|c| c.seq as usize).unwrap_or(0);
    let full_contents = &contents[..];
    let contents = match &resume {
        Some(c) => &full_contents[c.len..],
        None => full_contents,
    };
    let mut last: Option<(usize, u64, String)> =
        resume.as_ref().map(|c| (skip_lines, c.seq, c.hash.clone()));
    let mut hashes: Vec<String> = Vec::new();
    let mut records: Vec<Record> = Vec::new();
    let mut runs = BTreeSet::new();
    let mut epochs = BTreeSet::new();

    let ends_with_newline = contents.last() == Some(&b'\n');
    let body = if ends_with_newline {
        &contents[..contents.len() - 1]
    } else {
        contents
    };
    let total_lines = if contents.is_empty() {
        0
    } else {
        body.split(|&b| b == b'\n').count()
    };
    for (i, raw) in body.split(|&b| b == b'\n').enumerate().take(total_lines) {
        let line = skip_lines + i + 1;
        let unterminated = !ends_with_newline && line == skip_lines + total_lines;
        let text = std::str::from_utf8(raw).map_err(|_| fail(line, None, "not UTF-8"))?;
        if text.is_empty() {
            return Err(fail(line, None, "empty line"));
        }
        let record = Record::from_line(text).map_err(|e| {
            let seq = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|v| v["seq"].as_u64());
            let what = if unterminated {
                "incomplete last line (cut mid-write or truncated)"
            } else {
                "malformed"
            };
            fail(line, seq, format!("{what}: {e}"))
        })?;
        let seq = Some(record.seq);
        if record.v != FORMAT_VERSION {
            return Err(fail(
                line,
                seq,
                format!("unsupported format version {}", record.v),
            ));
        }
        let expected = line as u64;
        if record.seq != expected {
            return Err(fail(
                line,
                seq,
                format!(
                    "out of sequence: expected seq {expected} (a record was deleted, inserted or moved)"
                ),
            ));
        }
        let expected_prev = hashes
            .last()
            .map(String::as_str)
            .or(resume.as_ref().map(|c| c.hash.as_str()))
            .unwrap_or(GENESIS_PREV);
        if record.prev != expected_prev {
            return Err(fail(
                line,
                seq,
                format!(
                    "broken chain: prev is {}…, the previous record's hash is {}…",
                    short(&record.prev),
                    short(expected_prev)
                ),
            ));
        }
        if !is_digest_hex(&record.hash) {
            return Err(fail(
                line,
                seq,
                "hash mismatch: hash field is not 64 lowercase hex digits",
            ));
        }
        let recomputed = record
            .compute_hash()
            .map_err(|e| fail(line, seq, e.to_string()))?;
        if recomputed != record.hash {
            return Err(fail(
                line,
                seq,
                format!(
                    "hash mismatch: stored {}…, recomputed {}… (content changed)",
                    short(&record.hash),
                    short(&recomputed)
                ),
            ));
        }
        match verify_record_mac(&key, &record.hash, &record.mac) {
            Ok(true) => {}
            Ok(false) => {
                return Err(fail(
                    line,
                    seq,
                    "MAC invalid: not sealed with this key (tampered or re-chained)",
                ));
            }
            Err(e) => return Err(fail(line, seq, format!("MAC invalid: {e}"))),
        }
        let rendered = record
            .to_line()
            .map_err(|e| fail(line, seq, e.to_string()))?;
        if rendered != raw {
            return Err(fail(
                line,
                seq,
                "not in canonical form (the line differs from the writer's rendering)",
            ));
        }
        if unterminated {
            return Err(fail(line, seq, "incomplete last line: no final newline"));
        }
        runs.insert(record.run.clone());
        if let Some(e) = &record.epoch {
            epochs.insert(e.clone());
        }
        hashes.push(record.hash.clone());
        last = Some((line, record.seq, record.hash.clone()));
        if collect || line == 1 {
            records.push(record);
        }
    }
    let (last_line, head_seq, head_hash) = last.expect("a non-empty log has at least one line");

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
        return Err(fail(
            last_line + 1,
            Some(head_seq + 1),
            format!(
                "truncated tail: the anchor records head seq {} ({}…) but the log ends at seq {head_seq}",
                anchor.seq,
                short(&anchor.hash)
            ),
        ));
    }
    // seq == line number was checked above, so the record at seq N is hashes[N - 1 - skipped].
    let anchored = match &resume {
        Some(c) if anchor.seq == c.seq => Some(&c.hash),
        _ => anchor
            .seq
            .checked_sub(1 + skip_lines as u64)
            .and_then(|i| hashes.get(i as usize)),
    };
    match anchored {
        Some(h) if *h == anchor.hash => {}
        _ => {
            return Err(fail(
                anchor.seq as usize,
                Some(anchor.seq),
                format!(
                    "does not match the anchor (anchor hash {}…)",
                    short(&anchor.hash)
                ),
            ));
        }
    }
    let previous = match records.first() {
        Some(first) if first.record_type == super::recover::CHAIN_RESTARTED && depth > 0 => {
            Some(Box::new(chain_break(first, keys, depth)))
        }
        _ => None,
    };
    if !collect {
        records.clear();
    }
    if incremental || anchor_override.is_none() && !collect {
        Checkpoint::store(keys, path, &key, full_contents, head_seq, &head_hash);
    }
    let report = VerifyReport {
        records: head_seq,
        runs: runs.len(),
        epochs: epochs.len(),
        head_seq,
        head_hash,
        previous,
    };
    Ok((report, records))
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

fn read_log(path: &Path) -> Result<Vec<u8>, AuditError> {
    let mut contents = Vec::new();
    open_log(path)?
        .read_to_end(&mut contents)
        .map_err(AuditError::io("read audit log", path))?;
    Ok(contents)
}

/// The log's bytes and its anchor, read under a shared lock so that no append happens between
/// the two reads. The anchor result is kept as is: line problems are reported before anchor ones.
type LogAndAnchor = (Vec<u8>, PathBuf, Result<Option<Anchor>, AuditError>);

fn read_log_and_anchor(
    path: &Path,
    keys: &KeyStore,
    anchor_override: Option<Option<&Path>>,
) -> Result<LogAndAnchor, AuditError> {
    let file = open_log(path)?;
    let anchor_path = match anchor_override {
        None => keys.anchor_path(path)?,
        Some(Some(p)) => p.to_owned(),
        Some(None) => PathBuf::from("(none)"),
    };
    let lock = Lock::shared(&file, path)?;
    let mut contents = Vec::new();
    (&file)
        .read_to_end(&mut contents)
        .map_err(AuditError::io("read audit log", path))?;
    let anchor = match anchor_override {
        Some(None) => Ok(None),
        _ => keys::read_anchor_at(&anchor_path),
    };
    drop(lock);
    Ok((contents, anchor_path, anchor))
}

/// Parses every record of a log without verifying anything beyond syntax (for `audit show` of a
/// log that fails verification). Fails at the first line that is not a record.
pub fn read_records(path: &Path) -> Result<Vec<Record>, AuditError> {
    let contents = read_log(path)?;
    let text = String::from_utf8(contents)
        .map_err(|_| AuditError::InvalidRecord(format!("{} is not UTF-8", path.display())))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            Record::from_line(line)
                .map_err(|e| AuditError::InvalidRecord(format!("line {}: {e}", i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::log::AuditLog;
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
