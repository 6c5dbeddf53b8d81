//! Following a live audit log (`audit tail --follow`): each record as it is written, checked
//! against the one before it (sequence, chain, hash, MAC), across rotations.
//!
//! `tail -f` cannot follow the log: on Linux `run` copies records into space it reserved past
//! the last one, so the file does not grow and, while `run` holds it, ends in NUL bytes (see
//! [`super::writer`]). A [`Follower`] reads forward from where it stopped up to the first NUL byte
//! (the copy is made in order: everything before it is written) and takes only whole lines; a
//! line still being copied is read again from its start at the next poll (never carried over:
//! the next `run` cuts a killed writer's unfinished line and writes a record in its place). When the path names another file
//! (a rotation moved the active file into a segment, or `run` set a damaged log aside), the old
//! file is read to its end first, then the new one from its start: a segment continues the
//! chain, a new chain (seq 1) is reported as such.
//!
//! Owns the follower's own file handle and position; never writes, truncates, locks or renames
//! anything (the writer's files are the writer's).

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::chain::{AuditKey, MacChecker, Record};
use super::scan::{self, Expect, Scratch};

/// Bytes read per `pread`.
const CHUNK: usize = 64 << 10;

/// A line longer than this is not waited for (see [`scan::MAX_RECORD_LINE`]): the bytes are
/// damage, and reading them would grow without bound.
const MAX_LINE: usize = scan::MAX_RECORD_LINE;

/// Where a [`Follower`]'s first poll starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    ActiveFile,
    OldestFile,
    NewestSegment,
}

/// Files moved on to in one poll at most.
const MAX_FILES_PER_POLL: usize = 64;

/// What a poll found.
#[derive(Debug)]
pub enum Followed {
    /// A record, checked, with its line as stored (without the `\n`).
    Record { record: Box<Record>, line: Vec<u8> },
    /// The path now names a log that starts a new chain (seq 1): the one followed so far was
    /// set aside (or removed) and `run` started over. Its first record follows. `unseen`: the
    /// records of the old chain this follower never read (it had fallen behind), as its first
    /// record names them (`chain_restarted`): `(first, last)` seq.
    NewChain {
        path: PathBuf,
        unseen: Option<(u64, u64)>,
    },
}

/// Why following stopped.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} failed verification at {failure}", path.display())]
    Record {
        path: PathBuf,
        failure: super::VerifyFailure,
    },
    #[error(
        "{} was cut shorter while it was followed ({len} bytes, {offset} already read)",
        path.display()
    )]
    CutShorter {
        path: PathBuf,
        len: u64,
        offset: u64,
    },
    #[error("{} holds a line longer than {} MiB: not a record", path.display(), max >> 20)]
    LineTooLong { path: PathBuf, max: usize },
}

struct Open {
    file: File,
    id: (u64, u64),
    /// Bytes of whole lines read.
    offset: u64,
    /// Lines read (for a failure's line number).
    lines: usize,
    /// No record read from this file yet: its first may start a new chain.
    fresh: bool,
}

/// Reads a log's records as they are written (see the module doc).
pub struct Follower {
    path: PathBuf,
    mac: MacChecker,
    open: Option<Open>,
    /// Where the first poll starts.
    start: Start,
    expect: Expect,
    scratch: Scratch,
    /// The bytes of the line being read within one poll (a line can span chunks).
    carry: Vec<u8>,
    /// [`MAX_LINE`] (smaller in tests).
    max_line: usize,
}

impl Follower {
    /// Follows `path` from the first record of the active file (the file need not exist yet).
    pub fn new(path: &Path, key: &AuditKey) -> Follower {
        Follower {
            path: path.to_path_buf(),
            mac: MacChecker::new(key),
            open: None,
            start: Start::ActiveFile,
            expect: Expect::default(),
            scratch: Scratch::default(),
            carry: Vec::new(),
            max_line: MAX_LINE,
        }
    }

    /// Follows `path` from the first record of its oldest file, which must be the chain's
    /// first (seq 1): for a log that did not exist when following began, whose first segments
    /// may have been written (and rotated) before the first poll.
    pub fn from_oldest(path: &Path, key: &AuditKey) -> Follower {
        Follower {
            start: Start::OldestFile,
            expect: Expect {
                seq: Some(1),
                prev: None,
            },
            ..Follower::new(path, key)
        }
    }

    /// Follows `path` from the first record of its newest segment (else of the active file):
    /// the last records written before following began are then there to show even when a
    /// rotation just left the active file with one record.
    pub fn from_newest_segment(path: &Path, key: &AuditKey) -> Follower {
        Follower {
            start: Start::NewestSegment,
            ..Follower::new(path, key)
        }
    }

    /// Hands every whole record written since the last poll to `each`, in order.
    pub fn poll(&mut self, mut each: impl FnMut(Followed)) -> Result<(), FollowError> {
        if self.open.is_none() {
            self.open = self.first_file()?;
            if self.open.is_none() {
                return Ok(());
            }
        }
        // The path first, then the file being read to its end: once the path names another
        // file the writer has left this one, so what is read after the check is all it holds.
        // Then the next file: the segment after this one (several rotations may have happened
        // since the last poll), or the path. Bounded: a writer that rotates faster than this
        // reads is caught up with at the next poll.
        for _ in 0..MAX_FILES_PER_POLL {
            let moved = self.path_moved()?;
            self.read_new(&mut each)?;
            if !moved {
                break;
            }
            let Some(next) = self.next_file()? else {
                break;
            };
            self.open = Some(next);
            self.carry.clear();
        }
        Ok(())
    }

    fn first_file(&self) -> Result<Option<Open>, FollowError> {
        match self.start {
            Start::ActiveFile => self.open_path(),
            Start::OldestFile => self.segment_else_path(|s| s.first()),
            Start::NewestSegment => self.segment_else_path(|s| s.last()),
        }
    }

    /// The log's first file: its oldest segment, else the active file.
    fn oldest_file(&self) -> Result<Option<Open>, FollowError> {
        self.segment_else_path(|s| s.first())
    }

    /// The segment `pick` chooses, else the active file.
    fn segment_else_path(
        &self,
        pick: impl FnOnce(&[(u64, PathBuf)]) -> Option<&(u64, PathBuf)>,
    ) -> Result<Option<Open>, FollowError> {
        let segments = scan::list_segments(&self.path).map_err(self.io())?;
        if let Some((_, segment)) = pick(&segments)
            && let Some(open) = open_file(segment).map_err(self.io())?
        {
            return Ok(Some(open));
        }
        self.open_path()
    }

    /// The file after the one being read: the segment numbered after it (a rotation made it a
    /// segment) if there is one, else the path (a new active file). A file that is no segment
    /// of the log was set aside (or removed) with its chain: the next is the new chain's first
    /// file, which may itself have been rotated into a segment already.
    fn next_file(&self) -> Result<Option<Open>, FollowError> {
        let Some(open) = &self.open else {
            return self.open_path();
        };
        let segments = scan::list_segments(&self.path).map_err(self.io())?;
        let same = |p: &Path| {
            crate::base::beneath::followed::metadata(p)
                .map(|m| (m.dev(), m.ino()) == open.id)
                .unwrap_or(false)
        };
        match segments.iter().position(|(_, p)| same(p)) {
            Some(i) if i + 1 < segments.len() => open_file(&segments[i + 1].1).map_err(self.io()),
            Some(_) => self.open_path(),
            None => match self.restored_copy(open, &segments)? {
                Some(copy) => Ok(Some(copy)),
                None => self.oldest_file(),
            },
        }
    }

    /// The file its writer put back from the one being read, if there is one (it was removed
    /// while `run` wrote it: `cargo clean`, see `AuditLog::restore_removed`): the file at the
    /// path, or a segment (the copy may have been rotated since), holding the same bytes up to
    /// where this follower is, ending in the last record read. Following goes on there, not
    /// from a first file (which would read every record again). Compared over the last
    /// [`CHUNK`] bytes read; the next record's chain check holds the rest to the last record
    /// read, as in any file.
    fn restored_copy(
        &self,
        open: &Open,
        segments: &[(u64, PathBuf)],
    ) -> Result<Option<Open>, FollowError> {
        let Some(prev) = &self.expect.prev else {
            return Ok(None);
        };
        let from = open.offset.saturating_sub(CHUNK as u64);
        let mut ours = vec![0u8; (open.offset - from) as usize];
        if open.file.read_exact_at(&mut ours, from).is_err() {
            return Ok(None);
        }
        let last_line = ours
            .strip_suffix(b"\n")
            .map(|l| l.rsplit(|&b| b == b'\n').next().unwrap_or(l));
        let hash = format!("\"hash\":\"{prev}\"");
        if !last_line.is_some_and(|l| l.windows(hash.len()).any(|w| w == hash.as_bytes())) {
            return Ok(None);
        }
        let mut theirs = vec![0u8; ours.len()];
        let candidates = segments.iter().map(|(_, p)| p.as_path());
        for candidate in candidates.chain(std::iter::once(self.path.as_path())) {
            let Some(mut copy) = open_file(candidate).map_err(self.io())? else {
                continue;
            };
            if copy.id == open.id
                || copy.file.read_exact_at(&mut theirs, from).is_err()
                || ours != theirs
            {
                continue;
            }
            copy.offset = open.offset;
            copy.lines = open.lines;
            copy.fresh = false;
            return Ok(Some(copy));
        }
        Ok(None)
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> FollowError + '_ {
        |source| FollowError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn open_path(&self) -> Result<Option<Open>, FollowError> {
        open_file(&self.path).map_err(self.io())
    }

    /// Whether the path names another file than the one being read (absent: not yet, the
    /// writer is between moving the old file and creating the new one).
    fn path_moved(&self) -> Result<bool, FollowError> {
        let Some(open) = &self.open else {
            return Ok(false);
        };
        match crate::base::beneath::followed::metadata(&self.path) {
            Ok(m) => Ok((m.dev(), m.ino()) != open.id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io()(e)),
        }
    }

    fn read_new(&mut self, each: &mut impl FnMut(Followed)) -> Result<(), FollowError> {
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        let len = open.file.metadata().map_err(|source| FollowError::Io {
            path: self.path.clone(),
            source,
        })?;
        let len = len.len();
        // An unfinished line is read again from its start: its bytes may have been cut and
        // replaced since (a killed writer's, by the next `run`).
        self.carry.clear();
        let mut at = open.offset;
        if len < at {
            return Err(FollowError::CutShorter {
                path: self.path.clone(),
                len,
                offset: open.offset,
            });
        }
        let mut buf = vec![0u8; CHUNK];
        while at < len {
            let n = (len - at).min(CHUNK as u64) as usize;
            // The writer cuts its reservation at exit: a read past the new end sees less.
            let got = match open.file.read_at(&mut buf[..n], at) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(FollowError::Io {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            let chunk = &buf[..got];
            let (data, at_nul) = match chunk.iter().position(|&b| b == 0) {
                Some(i) => (&chunk[..i], true),
                None => (chunk, false),
            };
            at += data.len() as u64;
            let mut rest = data;
            while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
                self.carry.extend_from_slice(&rest[..nl]);
                rest = &rest[nl + 1..];
                let line = std::mem::take(&mut self.carry);
                open.lines += 1;
                open.offset += line.len() as u64 + 1;
                let first = std::mem::replace(&mut open.fresh, false);
                let (record, new_chain) = check(
                    &self.mac,
                    &line,
                    open.lines,
                    &self.expect,
                    first,
                    &mut self.scratch,
                )
                .map_err(|failure| FollowError::Record {
                    path: self.path.clone(),
                    failure,
                })?;
                if new_chain {
                    let seen = self.expect.seq.map_or(0, |next| next - 1);
                    let unseen = ["previousLastRecord", "previousHead"]
                        .iter()
                        .filter_map(|k| record.data[k]["seq"].as_u64())
                        .max()
                        .filter(|&last| last > seen)
                        .map(|last| (seen + 1, last));
                    each(Followed::NewChain {
                        path: self.path.clone(),
                        unseen,
                    });
                }
                self.expect = Expect {
                    seq: Some(record.seq + 1),
                    prev: Some(record.hash.clone()),
                };
                each(Followed::Record {
                    record: Box::new(record),
                    line,
                });
            }
            self.carry.extend_from_slice(rest);
            if self.carry.len() > self.max_line {
                return Err(FollowError::LineTooLong {
                    path: self.path.clone(),
                    max: self.max_line,
                });
            }
            if at_nul {
                break;
            }
        }
        Ok(())
    }
}

/// Opens a file to read from its start (`None`: it does not exist).
fn open_file(path: &Path) -> std::io::Result<Option<Open>> {
    // The log the human named (links followed, as `tail -F`); a fifo is never waited on.
    let file = match crate::base::beneath::followed::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    Ok(Some(Open {
        file,
        id: (meta.dev(), meta.ino()),
        offset: 0,
        lines: 0,
        fresh: true,
    }))
}

/// Checks a line against what the chain expects. The first line of a file that is not the
/// first followed may instead start a new chain (`true`): seq 1 from the genesis `prev`.
fn check(
    mac: &MacChecker,
    line: &[u8],
    number: usize,
    expect: &Expect,
    first_of_file: bool,
    scratch: &mut Scratch,
) -> Result<(Record, bool), super::VerifyFailure> {
    match scan::check_line(mac, line, true, number, expect, scratch) {
        Ok(r) => Ok((r, false)),
        Err(failure) => {
            let continued = expect.seq.is_some();
            if first_of_file
                && continued
                && let Ok(r) =
                    scan::check_line(mac, line, true, number, &Expect::default(), scratch)
                && r.seq == 1
            {
                return Ok((r, true));
            }
            Err(failure)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{AuditLog, AuditOptions, KeyStore};
    use serde_json::json;

    fn setup() -> (tempfile::TempDir, KeyStore, PathBuf, AuditKey) {
        let tmp = tempfile::tempdir().unwrap();
        let keys = KeyStore::at(tmp.path().join("home"));
        let path = tmp.path().join("audit").join("x.jsonl");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // The key exists once a log was opened with it.
        drop(AuditLog::open(&tmp.path().join("audit").join("keygen.jsonl"), &keys).unwrap());
        let key = keys.load_key().unwrap();
        (tmp, keys, path, key)
    }

    fn seqs(f: &mut Follower) -> Result<Vec<String>, FollowError> {
        let mut out = Vec::new();
        f.poll(|item| match item {
            Followed::Record { record, .. } => {
                out.push(format!("{}:{}", record.seq, record.record_type));
            }
            Followed::NewChain { unseen: None, .. } => out.push("new chain".into()),
            Followed::NewChain {
                unseen: Some((a, b)),
                ..
            } => out.push(format!("new chain, {a}..{b} unseen")),
        })?;
        Ok(out)
    }

    #[test]
    fn records_are_read_as_they_are_written_never_a_partial_one() {
        let (_tmp, keys, path, key) = setup();
        let mut f = Follower::new(&path, &key);
        assert!(
            seqs(&mut f).unwrap().is_empty(),
            "no log yet: nothing, no error"
        );
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("a", "R", None, json!({"n": 1})).unwrap();
        log.append("b", "R", None, json!({"n": 2})).unwrap();
        log.flush().unwrap();
        assert_eq!(seqs(&mut f).unwrap(), ["1:a", "2:b"]);
        assert!(seqs(&mut f).unwrap().is_empty(), "each record once");
        // Half a line copied (as a writer caught mid-copy leaves it): waited for, not read.
        log.append("c", "R", None, json!({"n": 3})).unwrap();
        log.flush().unwrap();
        let whole = std::fs::read(&path).unwrap();
        let end = whole.iter().position(|&b| b == 0).unwrap_or(whole.len());
        let start = whole[..end - 1].iter().rposition(|&b| b == b'\n').unwrap() + 1;
        let third = &whole[start..end];
        let at = start as u64;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_at(&vec![0u8; third.len()], at).unwrap();
        file.write_at(&third[..third.len() / 2], at).unwrap();
        assert!(seqs(&mut f).unwrap().is_empty());
        file.write_at(third, at).unwrap();
        assert_eq!(seqs(&mut f).unwrap(), ["3:c"]);
        // The writer's exit cuts its reserved space: nothing new, no error.
        drop(log);
        assert!(seqs(&mut f).unwrap().is_empty());
    }

    #[test]
    fn a_rotation_is_followed_into_the_next_file_and_the_chain_checked_across() {
        let (_tmp, keys, path, key) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 2_000,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        let mut f = Follower::new(&path, &key);
        let mut seen = Vec::new();
        for n in 0..30 {
            log.append("t", "R", None, json!({"n": n, "pad": "p".repeat(100)}))
                .unwrap();
            log.flush().unwrap();
            if n % 7 == 0 {
                seen.extend(seqs(&mut f).unwrap());
            }
        }
        seen.extend(seqs(&mut f).unwrap());
        assert!(crate::audit::scan::list_segments(&path).unwrap().len() > 2);
        let numbers: Vec<u64> = seen
            .iter()
            .map(|s| s.split(':').next().unwrap().parse().unwrap())
            .collect();
        let expected: Vec<u64> = (1..=numbers.len() as u64).collect();
        assert_eq!(numbers, expected, "every record once, in order: {seen:?}");
        assert!(seen.iter().any(|s| s.ends_with(":segment_started")));
        assert_eq!(seen.iter().filter(|s| s.ends_with(":t")).count(), 30);
    }

    /// `cargo clean` while `run` writes and `audit tail --follow` reads: the writer puts the
    /// log back from its open file; the follower goes on in the file put back, every record
    /// once, in order, no new chain (a removed log alone, with its segments left, likewise).
    #[test]
    fn a_log_put_back_by_its_writer_is_followed_on_not_read_again() {
        for whole_dir in [true, false] {
            let (tmp, keys, path, key) = setup();
            let opts = AuditOptions {
                max_segment_bytes: 2_000,
                ..AuditOptions::default()
            };
            let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
            let mut f = Follower::new(&path, &key);
            let mut seen = Vec::new();
            for n in 0..12 {
                log.append("t", "R", None, json!({"n": n, "pad": "p".repeat(100)}))
                    .unwrap();
                log.flush().unwrap();
                if n % 5 == 0 {
                    seen.extend(seqs(&mut f).unwrap());
                }
            }
            if whole_dir {
                std::fs::remove_dir_all(tmp.path().join("audit")).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
            std::thread::sleep(crate::audit::sink::LENGTH_CHECK_EVERY);
            for n in 12..15 {
                log.append("t", "R", None, json!({"n": n})).unwrap();
                log.flush().unwrap();
            }
            assert!(log.take_notice().is_some(), "put back");
            seen.extend(seqs(&mut f).unwrap());
            let numbers: Vec<u64> = seen
                .iter()
                .map(|s| s.split(':').next().unwrap().parse().unwrap())
                .collect();
            let expected: Vec<u64> = (1..=numbers.len() as u64).collect();
            assert_eq!(numbers, expected, "every record once, in order: {seen:?}");
            assert!(
                seen.iter().any(|s| s.ends_with(":log_restored")),
                "{seen:?}"
            );
            assert_eq!(seen.iter().filter(|s| s.ends_with(":t")).count(), 15);
        }
    }

    #[test]
    fn a_follower_from_the_oldest_file_reads_segments_rotated_before_its_first_poll() {
        let (_tmp, keys, path, key) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 1_500,
            ..AuditOptions::default()
        };
        let mut from_oldest = Follower::from_oldest(&path, &key);
        let mut from_active = Follower::new(&path, &key);
        assert!(seqs(&mut from_oldest).unwrap().is_empty());
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        for n in 0..20 {
            log.append("t", "R", None, json!({"n": n, "pad": "p".repeat(100)}))
                .unwrap();
        }
        log.flush().unwrap();
        let segments = crate::audit::scan::list_segments(&path).unwrap().len();
        assert!(segments >= 2, "{segments}");
        let all = seqs(&mut from_oldest).unwrap();
        let numbers: Vec<u64> = all
            .iter()
            .map(|s| s.split(':').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
        assert_eq!(all.iter().filter(|s| s.ends_with(":t")).count(), 20);
        // From the active file: only what it holds (the segments are `audit show`'s).
        let active = seqs(&mut from_active).unwrap();
        assert!(active[0].ends_with(":segment_started"), "{active:?}");
        assert!(active.len() < all.len());
        // From the newest segment: its records, then the active file's, the chain checked
        // across.
        let mut from_newest = Follower::from_newest_segment(&path, &key);
        let newest = seqs(&mut from_newest).unwrap();
        assert!(newest.len() > active.len(), "{newest:?}");
        assert!(newest.ends_with(&active), "{newest:?}");
        assert_eq!(newest.last(), all.last());
    }

    #[test]
    fn a_new_chain_at_the_path_is_reported_and_a_forged_continuation_refused() {
        let (tmp, keys, path, key) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("a", "R", None, json!({})).unwrap();
        log.append("b", "R", None, json!({})).unwrap();
        drop(log);
        let mut f = Follower::new(&path, &key);
        assert_eq!(seqs(&mut f).unwrap(), ["1:a", "2:b"]);
        // The log set aside, a new one started at the path: a new chain, said so.
        let fresh = tmp.path().join("fresh.jsonl");
        let mut log = AuditLog::open(&fresh, &keys).unwrap();
        log.append("c", "R", None, json!({})).unwrap();
        drop(log);
        std::fs::rename(&path, tmp.path().join("aside.jsonl")).unwrap();
        std::fs::rename(&fresh, &path).unwrap();
        assert_eq!(seqs(&mut f).unwrap(), ["new chain", "1:c"]);
        // A file that claims to continue the chain but does not (seq 2 of another chain).
        let other = tmp.path().join("other.jsonl");
        let mut log = AuditLog::open(&other, &keys).unwrap();
        log.append("x", "R", None, json!({})).unwrap();
        log.append("y", "R", None, json!({})).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&other).unwrap();
        let second = text.lines().nth(1).unwrap();
        std::fs::rename(&path, tmp.path().join("aside2.jsonl")).unwrap();
        std::fs::write(&path, format!("{second}\n")).unwrap();
        let err = seqs(&mut f).unwrap_err().to_string();
        assert!(err.contains("broken chain"), "{err}");
    }

    /// What a writer killed inside a copy leaves: part of its next line, then reserved NULs.
    fn leave_a_killed_writers_torn_line(path: &Path) {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(br#"{"v":1,"seq":3,"time":"2026-12-05T16:20:11.0"#);
        bytes.extend_from_slice(&[0; 8192]);
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn a_torn_line_cut_and_replaced_by_the_next_run_is_read_as_the_new_record() {
        use crate::audit::{Recovery, open_for_run};
        let (_tmp, keys, path, key) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("a", "R", None, json!({"n": 1})).unwrap();
        log.append("b", "R", None, json!({"n": 2})).unwrap();
        drop(log);
        leave_a_killed_writers_torn_line(&path);
        let mut f = Follower::new(&path, &key);
        assert_eq!(seqs(&mut f).unwrap(), ["1:a", "2:b"], "the torn line waits");
        let (mut log, recovery) = open_for_run(&path, &keys).unwrap();
        assert!(matches!(recovery, Some(Recovery::TornTailKept(_))));
        log.append("c", "R", None, json!({"n": 4})).unwrap();
        log.flush().unwrap();
        assert_eq!(
            seqs(&mut f).unwrap(),
            ["3:torn_tail_set_aside", "4:c"],
            "read from the line's start again, not joined to the torn bytes"
        );
    }

    /// The anchor made unreadable: the next `run` sets the chain aside and starts a new one.
    fn set_aside(path: &Path, keys: &KeyStore, opts: &AuditOptions) -> AuditLog {
        use crate::audit::{Recovery, open_for_run_with};
        std::fs::write(keys.anchor_path(path).unwrap(), b"{}").unwrap();
        let (log, recovery) = open_for_run_with(path, keys, opts).unwrap();
        assert!(
            matches!(recovery, Some(Recovery::SetAside(_))),
            "{recovery:?}"
        );
        log
    }

    fn numbers(items: &[String]) -> Vec<u64> {
        items
            .iter()
            .filter_map(|s| s.split(':').next()?.parse().ok())
            .collect()
    }

    #[test]
    fn a_new_chain_already_rotated_is_followed_from_its_first_file() {
        let (_tmp, keys, path, key) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        for n in 0..3 {
            log.append("a", "R", None, json!({"n": n})).unwrap();
        }
        drop(log);
        let mut f = Follower::new(&path, &key);
        assert_eq!(seqs(&mut f).unwrap().len(), 3);
        let opts = AuditOptions {
            max_segment_bytes: 2_000,
            ..AuditOptions::default()
        };
        let mut log = set_aside(&path, &keys, &opts);
        for n in 0..12 {
            log.append("t", "R", None, json!({"n": n, "pad": "p".repeat(200)}))
                .unwrap();
            log.flush().unwrap();
        }
        drop(log);
        assert!(!crate::audit::scan::list_segments(&path).unwrap().is_empty());
        let head = crate::audit::verify(&path, &keys).unwrap().head_seq;
        let mut after = Vec::new();
        for _ in 0..3 {
            after.extend(seqs(&mut f).unwrap());
        }
        assert_eq!(after[0], "new chain");
        assert_eq!(numbers(&after[1..]), (1..=head).collect::<Vec<_>>());
    }

    #[test]
    fn records_of_a_set_aside_chain_a_lagging_follower_never_read_are_named() {
        let (_tmp, keys, path, key) = setup();
        let opts = AuditOptions {
            max_segment_bytes: 1_000,
            ..AuditOptions::default()
        };
        let mut log = AuditLog::open_with(&path, &keys, &opts).unwrap();
        log.append("a", "R", None, json!({"n": 0})).unwrap();
        log.flush().unwrap();
        let mut f = Follower::new(&path, &key);
        let mut seen = seqs(&mut f).unwrap();
        // More rotations than one poll moves through.
        for n in 1..(MAX_FILES_PER_POLL as u64 * 3) {
            log.append("a", "R", None, json!({"n": n, "pad": "p".repeat(200)}))
                .unwrap();
            log.flush().unwrap();
        }
        drop(log);
        seen.extend(seqs(&mut f).unwrap());
        let head = crate::audit::verify(&path, &keys).unwrap().head_seq;
        let last_seen = *numbers(&seen).last().unwrap();
        assert!(last_seen < head, "behind: {last_seen} of {head}");
        drop(set_aside(&path, &keys, &opts));
        let after = seqs(&mut f).unwrap();
        // The rest of the file it held first (renamed with the chain), then the new chain.
        let at = after
            .iter()
            .position(|s| s.starts_with("new chain"))
            .unwrap();
        seen.extend(after[..at].iter().cloned());
        let last_seen = *numbers(&seen).last().unwrap();
        assert_eq!(numbers(&seen), (1..=last_seen).collect::<Vec<_>>());
        assert!(last_seen < head);
        assert_eq!(
            after[at],
            format!("new chain, {}..{head} unseen", last_seen + 1),
            "{after:?}"
        );
        assert_eq!(after[at + 1], "1:chain_restarted");
    }

    #[test]
    fn damage_is_an_error_not_a_record() {
        let (_tmp, keys, path, key) = setup();
        let mut log = AuditLog::open(&path, &keys).unwrap();
        log.append("a", "R", None, json!({"tool": "echo"})).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("echo", "ecHo")).unwrap();
        let mut f = Follower::new(&path, &key);
        let err = seqs(&mut f).unwrap_err().to_string();
        assert!(err.contains("hash mismatch"), "{err}");
        // A file cut shorter than what was read is an error too.
        let mut log = AuditLog::open(&path.with_extension("b"), &keys).unwrap();
        log.append("a", "R", None, json!({})).unwrap();
        drop(log);
        let b = path.with_extension("b");
        let mut f = Follower::new(&b, &key);
        assert_eq!(seqs(&mut f).unwrap(), ["1:a"]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&b)
            .unwrap()
            .set_len(10)
            .unwrap();
        assert!(matches!(
            f.poll(|_| {}),
            Err(FollowError::CutShorter { .. })
        ));
    }

    #[test]
    fn a_line_with_no_end_is_not_waited_for_without_bound() {
        let (_tmp, _keys, path, key) = setup();
        let mut f = Follower::new(&path, &key);
        f.max_line = 1 << 20;
        std::fs::write(&path, vec![b'x'; (1 << 20) + CHUNK]).unwrap();
        assert!(matches!(
            f.poll(|_| {}),
            Err(FollowError::LineTooLong { .. })
        ));
    }
}
