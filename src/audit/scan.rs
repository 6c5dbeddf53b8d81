//! Streaming checks of log files, shared by the verifier ([`super::verify()`]) and the writer's
//! tail check ([`super::writer`]); and the names of a log's segments.
//!
//! Owns: the per-line checks (in this order: UTF-8, a JSON record with exactly the known fields,
//! `v == 1`, `seq` consecutive, `prev` equal to the previous record's `hash`, `hash` well formed
//! and equal to the recomputed hash, `mac` valid under the key, the line byte-identical to the
//! writer's rendering, a final newline), reading a file line by line in constant memory (an
//! unterminated last line is returned as a [`TornTail`] for the caller to judge), and the
//! segment file names. Must not touch: anchors, keys on disk, writing files, stdout.
//!
//! # Segments
//!
//! A log at `<dir>/<stem>.<ext>` (the active file) rotates into `<dir>/<stem>.<NNNNN>.<ext>`,
//! numbered from 1 with at least five digits (older segments sort first numerically). The first
//! record of every file after the first is a [`super::record_type::SEGMENT_STARTED`] naming the
//! previous file, its last seq and its last hash (and, like every record, chained to it by
//! `prev`).

use super::chain::{FORMAT_VERSION, GENESIS_PREV, MacChecker, Record, is_digest_hex};
use super::error::VerifyFailure;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A line longer than this is no record (a record holds at most what one host message held,
/// [`crate::wire::proxy::framing::DEFAULT_MAX_LINE`], and its own fields): readers stop at it as
/// damage instead of reading a line without bound (a log written by something else).
pub(crate) const MAX_RECORD_LINE: usize = 2 * crate::wire::proxy::framing::DEFAULT_MAX_LINE;

/// `read_until(b'\n')` that reads at most `max + 1` bytes into `buf` (cleared first).
/// `Err(n)` where the line is longer than `max` (`n`: the bytes read); `Ok(0)` at the end.
pub(crate) fn read_line_within(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Result<usize, usize>> {
    buf.clear();
    let n = reader.take(max as u64 + 1).read_until(b'\n', buf)?;
    Ok(if n > max && buf.last() != Some(&b'\n') {
        Err(n)
    } else {
        Ok(n)
    })
}

/// The failure for a line longer than [`MAX_RECORD_LINE`].
pub(crate) fn too_long(line: usize, max: usize) -> String {
    format!("line {line} is longer than {max} bytes: no record is (damage)")
}

/// Segment `n` of the log at `path`.
pub fn segment_path(path: &Path, n: u64) -> PathBuf {
    let (stem, ext) = stem_and_ext(path);
    let name = match ext {
        Some(ext) => format!("{stem}.{n:05}.{ext}"),
        None => format!("{stem}.{n:05}"),
    };
    path.with_file_name(name)
}

fn stem_and_ext(path: &Path) -> (String, Option<String>) {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    (stem, ext)
}

/// The segments of the log at `path`, oldest first (`(number, path)`). A missing directory
/// means no segments.
/// A one-shot listing by path (a reader: `audit verify`, the follower, tests); a writer lists
/// its held directory ([`list_segments_in`]).
pub fn list_segments(path: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    match crate::base::beneath::Beneath::open_following(&dir) {
        Ok(held) => list_segments_in(&held, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// [`list_segments`] in `dir`, the log's directory held open.
pub(crate) fn list_segments_in(
    dir: &crate::base::beneath::Beneath,
    path: &Path,
) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let (stem, ext) = stem_and_ext(path);
    let prefix = format!("{stem}.");
    let suffix = ext.map(|e| format!(".{e}")).unwrap_or_default();
    let entries = match dir.list(Path::new("")) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let Some(name) = entry.name.to_str() else {
            continue;
        };
        let Some(middle) = name
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(&suffix))
        else {
            continue;
        };
        if middle.len() >= 5
            && middle.bytes().all(|b| b.is_ascii_digit())
            && let Ok(n) = middle.parse::<u64>()
        {
            out.push((n, path.with_file_name(name)));
        }
    }
    out.sort();
    Ok(out)
}

/// The segment number in a segment's file name (`srv.00003.jsonl` -> 3): a set-aside chain's
/// segments keep their numbers under a new stem, so links are compared by number.
pub(crate) fn segment_number(name: &str) -> Option<u64> {
    let p = Path::new(name);
    let stem = match p.extension() {
        Some(_) => p.file_stem()?.to_str()?,
        None => name,
    };
    let (_, digits) = stem.rsplit_once('.')?;
    (digits.len() >= 5 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The file name of `path`, for messages and `segment_started` records.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What the next line must continue.
#[derive(Debug, Clone, Default)]
pub(crate) struct Expect {
    /// `None`: any seq (the writer's full scan of an active file that starts mid-chain).
    pub seq: Option<u64>,
    /// `None`: not checked, except that a record with seq 1 must have the genesis `prev`.
    pub prev: Option<String>,
}

/// The last record a scan checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Last {
    pub seq: u64,
    pub hash: String,
    /// 1-based line number in its file.
    pub line: usize,
    /// Byte offset just past its `\n`.
    pub end: u64,
}

fn fail(line: usize, seq: Option<u64>, reason: impl Into<String>) -> VerifyFailure {
    VerifyFailure {
        line,
        seq,
        reason: reason.into(),
    }
}

pub(crate) fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// Reusable buffers for [`check_line`].
#[derive(Default)]
pub(crate) struct Scratch {
    data: Vec<u8>,
}

/// Checks one line (`raw`, without its `\n`; `terminated` says whether it had one) against
/// `expect`, returning the parsed record. `line` is only for the failure.
pub(crate) fn check_line(
    mac: &MacChecker,
    raw: &[u8],
    terminated: bool,
    line: usize,
    expect: &Expect,
    scratch: &mut Scratch,
) -> Result<Record, VerifyFailure> {
    let text = std::str::from_utf8(raw).map_err(|_| fail(line, None, "not UTF-8"))?;
    if text.is_empty() {
        return Err(fail(line, None, "empty line"));
    }
    let record = Record::from_line(text).map_err(|e| {
        let seq = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v["seq"].as_u64());
        let what = if terminated {
            "malformed"
        } else {
            "incomplete last line (cut mid-write or truncated)"
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
    let expected_seq = expect.seq.unwrap_or(record.seq.max(1));
    if record.seq != expected_seq {
        return Err(fail(
            line,
            seq,
            format!(
                "out of sequence: expected seq {expected_seq} (a record was deleted, inserted or moved)"
            ),
        ));
    }
    let expected_prev = match (&expect.prev, record.seq) {
        (Some(p), _) => Some(p.as_str()),
        (None, 1) => Some(GENESIS_PREV),
        (None, _) => None,
    };
    if let Some(expected_prev) = expected_prev
        && record.prev != expected_prev
    {
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
        .recompute(&mut scratch.data)
        .map_err(|e| fail(line, seq, e.to_string()))?;
    if recomputed.hash != record.hash {
        return Err(fail(
            line,
            seq,
            format!(
                "hash mismatch: stored {}…, recomputed {}… (content changed)",
                short(&record.hash),
                short(&recomputed.hash)
            ),
        ));
    }
    // `hash` equals the recomputed one (checked above), so its bytes are the recomputed digest.
    match mac.verify_digest(&recomputed.digest, &record.mac) {
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
    if recomputed.line != raw {
        return Err(fail(
            line,
            seq,
            "not in canonical form (the line differs from the writer's rendering)",
        ));
    }
    if !terminated {
        return Err(fail(line, seq, "incomplete last line: no final newline"));
    }
    Ok(record)
}

/// Bytes after a file's last `\n`: a write the writer never finished (a crash cut it short:
/// a write to a file can stop at a page boundary when the process is killed), or damage. Never
/// a record: a record is on disk when its whole line, `\n` included, is. Whether it is
/// acceptable is the caller's decision: after the anchored head it is a crash's leftover, at or
/// before it the log was cut (see [`super::verify()`] and [`super::writer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TornTail {
    /// 1-based line number in its file.
    pub line: usize,
    /// Byte offset where it starts (just past the last `\n`, or 0).
    pub offset: u64,
    pub len: u64,
    /// What [`check_line`] says of those bytes (`incomplete last line…`), for a caller that
    /// does not accept them.
    pub failure: VerifyFailure,
    /// Whether the bytes can be what a cut-short write leaves (see [`could_be_cut_short`]);
    /// if not, they are damage wherever they are.
    pub cut_short: bool,
}

/// Whether `raw`, an unterminated last line, can be what a write cut short leaves behind: a
/// proper prefix of the line of the record `expect` names (it starts as that line starts, and
/// its UTF-8 or JSON ends early), or that whole record, checking in full, without its `\n`.
/// Bytes that are not JSON, or a record that does not check, are not part of anything the
/// writer wrote.
fn could_be_cut_short(
    mac: &MacChecker,
    raw: &[u8],
    expect: &Expect,
    scratch: &mut Scratch,
) -> bool {
    // Every line starts `{"v":1,"seq":N,"time":"` (see `chain::Header`).
    let start = match expect.seq {
        Some(seq) => format!("{{\"v\":{FORMAT_VERSION},\"seq\":{seq},\"time\":\""),
        None => format!("{{\"v\":{FORMAT_VERSION},\"seq\":"),
    };
    let n = raw.len().min(start.len());
    if raw[..n] != start.as_bytes()[..n] {
        return false;
    }
    let json = match std::str::from_utf8(raw) {
        Ok(_) => raw,
        // Cut inside a multi-byte character: invalid only at the very end.
        Err(e) if e.error_len().is_none() => &raw[..e.valid_up_to()],
        Err(_) => return false,
    };
    match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
        Err(e) => e.is_eof(),
        Ok(_) => json.len() == raw.len() && check_line(mac, raw, true, 0, expect, scratch).is_ok(),
    }
}

/// What [`scan_file`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scanned {
    /// The last record checked (`None` if there was none after `from`).
    pub last: Option<Last>,
    pub torn: Option<TornTail>,
}

/// Checks every line of `file` from byte `from` (the start of line `first_line`) to its end,
/// in constant memory, calling `each` with every record, its line number and its end offset.
/// An unterminated last line is returned as [`TornTail`], not checked as a record.
/// A line longer than [`MAX_RECORD_LINE`] is a failure (damage), read no further.
pub(crate) fn scan_file(
    file: &File,
    from: u64,
    first_line: usize,
    expect: Expect,
    mac: &MacChecker,
    each: impl FnMut(&Record, usize, u64) -> Result<(), VerifyFailure>,
) -> Result<Scanned, VerifyFailure> {
    scan_file_within(file, from, first_line, expect, mac, MAX_RECORD_LINE, each)
}

/// [`scan_file`] with another bound on a line (tests).
fn scan_file_within(
    file: &File,
    from: u64,
    first_line: usize,
    mut expect: Expect,
    mac: &MacChecker,
    max_line: usize,
    mut each: impl FnMut(&Record, usize, u64) -> Result<(), VerifyFailure>,
) -> Result<Scanned, VerifyFailure> {
    let io = |e: std::io::Error| fail(0, None, format!("cannot read the log: {e}"));
    // Up to the end of the data as it is now: past it a live writer's reservation (NULs) is
    // being filled, and a read that went on would join the NULs it saw to records copied in
    // after (see [`data_end`]).
    let end = file
        .metadata()
        .and_then(|m| data_end(file, m.len()))
        .map_err(io)?;
    let mut file = file;
    file.seek(SeekFrom::Start(from)).map_err(io)?;
    let mut reader = BufReader::with_capacity(1 << 18, file.take(end.saturating_sub(from)));
    let mut buf = Vec::with_capacity(1024);
    let mut scratch = Scratch::default();
    let mut offset = from;
    let mut line = first_line;
    let mut last = None;
    loop {
        let n = match read_line_within(&mut reader, &mut buf, max_line).map_err(io)? {
            Ok(n) => n,
            Err(_) => return Err(fail(line + 1, None, too_long(line + 1, max_line))),
        };
        if n == 0 {
            return Ok(Scanned { last, torn: None });
        }
        line += 1;
        if buf.last() != Some(&b'\n') {
            let failure = match check_line(mac, &buf, false, line, &expect, &mut scratch) {
                Err(f) => f,
                Ok(_) => unreachable!("check_line refuses an unterminated line"),
            };
            let cut_short = could_be_cut_short(mac, &buf, &expect, &mut scratch);
            let torn = TornTail {
                line,
                offset,
                len: n as u64,
                failure,
                cut_short,
            };
            return Ok(Scanned {
                last,
                torn: Some(torn),
            });
        }
        offset += n as u64;
        let raw = &buf[..buf.len() - 1];
        let record = check_line(mac, raw, true, line, &expect, &mut scratch)?;
        each(&record, line, offset)?;
        expect = Expect {
            seq: Some(record.seq + 1),
            prev: Some(record.hash.clone()),
        };
        last = Some(Last {
            seq: record.seq,
            hash: record.hash,
            line,
            end: offset,
        });
    }
}

/// Where the data of a file `len` bytes long ends: before the NUL bytes at its end, space a
/// writer reserved past its records (see `sys::mapped`) and has not written yet. A record never
/// holds a NUL byte (JSON escapes it), so those bytes are never part of one. Reads backwards in
/// constant memory. Everything before the end is written even while a writer copies: a copy
/// is made in order (a NUL before the end is damage).
pub(crate) fn data_end(file: &File, len: u64) -> std::io::Result<u64> {
    // Holes are skipped, not read: a sparse run of NULs (`truncate -s +1T` in the
    // agent-writable target directory), or many of them, costs no time. Regions of written
    // NULs are read (their bytes are on disk: bounded by what the agent can store). A file
    // system that cannot say is read whole.
    let mut buf = vec![0u8; 64 << 10];
    let mut end = len;
    while end > 0 {
        let (start, stop) = match crate::base::sys::unix::last_data_region(file, end) {
            Ok(Some(region)) => region,
            Ok(None) => return Ok(0),
            Err(_) => (0, end),
        };
        if let Some(at) = last_non_nul(file, start, stop, &mut buf)? {
            return Ok(at + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The offset of the last byte that is not NUL in `start..end`, read backwards.
fn last_non_nul(file: &File, start: u64, end: u64, buf: &mut [u8]) -> std::io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    let mut end = end;
    while end > start {
        let n = (end - start).min(buf.len() as u64) as usize;
        let chunk = &mut buf[..n];
        file.read_exact_at(chunk, end - n as u64)?;
        match chunk.iter().rposition(|&b| b != 0) {
            Some(i) => return Ok(Some(end - n as u64 + i as u64)),
            None => end -= n as u64,
        }
    }
    Ok(None)
}

/// The complete line that ends just before byte `end` (which must follow a `\n`), without its
/// `\n`. `Ok(None)` if byte `end - 1` is not a `\n` or the line is implausibly long.
pub(crate) fn line_ending_at(file: &File, end: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    if end == 0 {
        return Ok(None);
    }
    let mut chunk = end.min(4096);
    loop {
        let start = end - chunk;
        let mut buf = vec![0u8; chunk as usize];
        file.read_exact_at(&mut buf, start)?;
        if buf.last() != Some(&b'\n') {
            return Ok(None);
        }
        let body = &buf[..buf.len() - 1];
        if let Some(pos) = body.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(body[pos + 1..].to_vec()));
        }
        if start == 0 {
            return Ok(Some(body.to_vec()));
        }
        if chunk >= 64 << 20 {
            return Ok(None);
        }
        chunk = (chunk * 2).min(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::keys::KeyStore;
    use crate::audit::writer::AuditLog;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn a_line_is_read_up_to_its_bound_and_no_further() {
        let mut buf = Vec::new();
        let read = |input: &[u8], buf: &mut Vec<u8>| {
            read_line_within(&mut std::io::BufReader::new(input), buf, 4).unwrap()
        };
        assert_eq!(
            read(b"abcd\nrest", &mut buf),
            Ok(5),
            "four bytes and the newline"
        );
        assert_eq!(buf, b"abcd\n");
        assert_eq!(
            read(b"abcd", &mut buf),
            Ok(4),
            "unterminated within the bound"
        );
        assert_eq!(read(b"abcde\n", &mut buf), Err(5), "five bytes: too long");
        assert_eq!(buf.len(), 5, "no more than the bound and one byte was read");
        assert_eq!(read(b"", &mut buf), Ok(0));
    }

    /// A log whose third line is longer than any record: the scan stops there with a failure
    /// naming the line, after handing out the two records before it, and reads no further.
    #[test]
    fn an_overlong_line_is_damage_not_a_read_without_end() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("state"));
        let path = tmp.path().join("audit.jsonl");
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for i in 0..2 {
            log.append("x", "R", None, json!({ "i": i })).unwrap();
        }
        drop(log);
        let longest = std::fs::read(&path)
            .unwrap()
            .split(|&b| b == b'\n')
            .map(<[u8]>::len)
            .max()
            .unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let max = longest + 10;
        file.write_all(&vec![b'x'; max + 1]).unwrap();
        file.write_all(b"\n").unwrap();
        let file = File::open(&path).unwrap();
        let mac = MacChecker::new(&keys.load_key().unwrap());
        let mut seen = Vec::new();
        let scan = |max_line, seen: &mut Vec<u64>| {
            scan_file_within(&file, 0, 0, Expect::default(), &mac, max_line, |r, _, _| {
                seen.push(r.seq);
                Ok(())
            })
        };
        let failure = scan(max, &mut seen).unwrap_err();
        assert_eq!(seen, [1, 2]);
        assert_eq!(failure.line, 3);
        assert!(failure.reason.contains("longer than"), "{}", failure.reason);
        // Within a bound that admits it, the same line is judged as a line (not a record).
        seen.clear();
        let failure = scan(max + 1, &mut seen).unwrap_err();
        assert_eq!(seen, [1, 2]);
        assert!(
            !failure.reason.contains("longer than"),
            "{}",
            failure.reason
        );
    }
}
