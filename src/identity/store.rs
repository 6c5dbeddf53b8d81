//! Content-addressed store of executables: `<target>/mcp-dev/store/sha256-<hex>`, read-only.
//!
//! "Exec what you hashed": the executable is copied into the store in the same pass that hashes
//! it, and the store copy is what gets executed, so a rebuild that rewrites `target/debug/<bin>`
//! between hashing and exec cannot change what runs. Entries are immutable; old ones are garbage-
//! collected with a bound. Owns the store directory only.

use crate::base::beneath::{Beneath, HeldRoot};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::base::hashing;

/// How many entries `gc` keeps by default (besides the ones in use).
pub const DEFAULT_KEEP: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredExecutable {
    pub sha256: String,
    pub size: u64,
    pub store_path: PathBuf,
    /// False when an identical entry was already present (nothing was written).
    pub newly_stored: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("executable `{0}` is missing")]
    Missing(PathBuf),
    #[error(
        "executable `{path}` changed while being captured (size or mtime moved during the copy)"
    )]
    ChangedDuringCapture { path: PathBuf },
    #[error("store entry `{path}` is corrupt (its content hashes to {actual})")]
    Corrupt { path: PathBuf, actual: String },
    #[error("store I/O on `{path}`: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("store entry `{path}` is a symbolic link or not a regular file; refusing to run it")]
    NotRegular { path: PathBuf },
    #[error(
        "store entry `{path}` does not have the bytes that were hashed: the identity records executable {expected}, the file now hashes to {actual} (replaced after capture?); not started"
    )]
    Mismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
}

/// Opens a store entry for execution and checks it still has the bytes its identity recorded.
///
/// The file is opened once without following a symbolic link (`O_NOFOLLOW`), must be a regular
/// file, and is hashed through the open descriptor; the caller then executes that same
/// descriptor (see [`crate::process::supervisor::LaunchSpec::program`]), so the bytes hashed are the bytes
/// run even if the path is replaced meanwhile. Issue 12: a replaced or symlinked store file used
/// to run as trusted.
pub fn open_verified(path: &Path, expected_sha256: &str) -> Result<File, StoreError> {
    // No link followed, no wait on a named pipe planted at the entry (the store is in the
    // target directory).
    let file = match crate::base::fsutil::open_regular_nofollow(path) {
        Ok(f) => f,
        Err(e) if crate::base::beneath::is_link_refusal(&e) => {
            return Err(StoreError::NotRegular { path: path.into() });
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
            return Err(StoreError::NotRegular { path: path.into() });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StoreError::Missing(path.into()));
        }
        Err(e) => {
            return Err(StoreError::Io {
                path: path.into(),
                source: e,
            });
        }
    };
    let meta = file.metadata().map_err(|source| StoreError::Io {
        path: path.into(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(StoreError::NotRegular { path: path.into() });
    }
    let (actual, _) = hashing::sha256_reader(&file).map_err(|source| StoreError::Io {
        path: path.into(),
        source,
    })?;
    let normalize = |d: &str| d.strip_prefix("sha256:").unwrap_or(d).to_string();
    if normalize(&actual) != normalize(expected_sha256) {
        return Err(StoreError::Mismatch {
            path: path.into(),
            expected: expected_sha256.to_string(),
            actual,
        });
    }
    Ok(file)
}

#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// Where the "untouched since stored" stamps live: outside the target directory (the
    /// user's state directory, beside the audit key), since a stamp is trusted instead of the
    /// bytes and the agent can write `target/` (red-team round 14: a forged stamp made capture
    /// report an approved digest for other bytes). `None`: no fast path, every capture hashes.
    stamps: Option<HeldRoot>,
    /// The store directory, opened once (created when missing) and held for this store's life
    /// (a build cycle): entries are judged, replaced, touched and removed from it.
    root: HeldRoot,
}

/// Fingerprint of a file's metadata, used to detect a rewrite during the copy and to recognise
/// an executable that was not touched since it was stored. `ctime` cannot be set from user
/// space, so any rewrite of the file moves the stamp.
#[derive(Debug, PartialEq, Eq, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct StatStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl StatStamp {
    fn of_meta(m: &crate::base::beneath::Meta) -> Self {
        StatStamp {
            dev: m.id.0,
            ino: m.id.1,
            size: m.len,
            mtime: m.mtime.0,
            mtime_nsec: m.mtime.1,
            ctime: m.ctime.0,
            ctime_nsec: m.ctime.1,
        }
    }

    fn of(m: &fs::Metadata) -> Self {
        StatStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        }
    }
}

impl Store {
    /// A store without the stamp fast path (every capture reads the executable).
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        let dir = dir.into();
        Store {
            root: HeldRoot::new(&dir, true),
            dir,
            stamps: None,
        }
    }

    /// A store whose stamps (see [`Store::capture`]) live in `stamps`, a directory the agent
    /// cannot write (not under the target directory).
    pub fn with_stamps(dir: impl Into<PathBuf>, stamps: impl Into<PathBuf>) -> Store {
        Store {
            stamps: Some(HeldRoot::new(stamps, true)),
            ..Store::new(dir)
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn entry_path(&self, sha256: &str) -> PathBuf {
        let hex = sha256.strip_prefix("sha256:").unwrap_or(sha256);
        self.dir.join(format!("sha256-{hex}"))
    }

    fn io(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Copies `executable` into the store while hashing it, and returns the entry.
    ///
    /// The bytes hashed are the bytes written. If the source's metadata moved during the copy the
    /// capture is refused ([`StoreError::ChangedDuringCapture`]); callers retry once.
    ///
    /// Fast path: when cargo did not touch the executable since it was stored (same device,
    /// inode, size, mtime and ctime as recorded at that capture) and the entry still exists, the
    /// file is not read again; the entry's bytes were hashed when they were written.
    pub fn capture(&self, executable: &Path) -> Result<StoredExecutable, StoreError> {
        // Cargo's output in the target directory: the link cargo may have made is followed (as
        // when it is run), a fifo planted there is not waited on.
        let src = match crate::base::fsutil::open_regular(executable) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StoreError::Missing(executable.into()));
            }
            Err(e) => {
                return Err(StoreError::Io {
                    path: executable.into(),
                    source: e,
                });
            }
        };
        let before = StatStamp::of(&src.metadata().map_err(Self::io(executable))?);
        if let Some(sha256) = self.unchanged_since_stored(executable, &before) {
            let dest = self.entry_path(&sha256);
            self.touch(&dest);
            self.remember_stamp(executable, &before, &sha256, &dest);
            return Ok(StoredExecutable {
                sha256,
                size: before.size,
                store_path: dest,
                newly_stored: false,
            });
        }
        let held = self.root.get().map_err(Self::io(&self.dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempfile_in(&self.dir)
            .map_err(Self::io(&self.dir))?;
        let (sha256, size) =
            hashing::sha256_copy(&src, tmp.as_file()).map_err(Self::io(executable))?;
        let after = StatStamp::of(
            &crate::base::beneath::followed::metadata(executable).map_err(Self::io(executable))?,
        );
        if before != after || size != before.size {
            return Err(StoreError::ChangedDuringCapture {
                path: executable.into(),
            });
        }
        let dest = self.entry_path(&sha256);
        // An entry already there is replaced by the copy just hashed, not kept unread: a file
        // planted under the name of the next build's digest (the agent can write the store)
        // would be refused at every start, and every rebuild would keep it (red-team round
        // 14). A server running from the old entry keeps its inode.
        let existed = held.metadata(&dest).is_ok_and(|m| m.is_file());
        if held.metadata(&dest).is_ok_and(|m| m.is_dir()) {
            // Nothing we store is a directory: one planted there would fail every rename.
            held.remove_tree(&dest).map_err(Self::io(&dest))?;
        }
        held.set_mode(tmp.path(), 0o555)
            .map_err(Self::io(tmp.path()))?;
        // Closing the write handle before the rename matters: exec of a file still open for
        // writing fails with ETXTBSY.
        let tmp_path = tmp.into_temp_path();
        tmp_path.persist(&dest).map_err(|e| StoreError::Io {
            path: dest.clone(),
            source: e.error,
        })?;
        self.remember_stamp(executable, &after, &sha256, &dest);
        Ok(StoredExecutable {
            sha256,
            size,
            store_path: dest,
            newly_stored: !existed,
        })
    }

    /// Keyed by the store and the executable's path (one state directory serves every project):
    /// the stamps' held directory and the stamp's name in it.
    fn stamp_at(&self, executable: &Path) -> Option<(std::sync::Arc<Beneath>, PathBuf)> {
        let mut key = self.dir.as_os_str().as_encoded_bytes().to_vec();
        key.push(0);
        key.extend_from_slice(executable.as_os_str().as_encoded_bytes());
        let key = hashing::sha256_hex(&key);
        Some((self.stamps.as_ref()?.get().ok()?, PathBuf::from(&key[..32])))
    }

    /// The digest stored for `executable` if its metadata is exactly as it was then, and the
    /// entry's too (an entry rewritten since, by anyone, is not vouched for: the next capture
    /// reads the executable and replaces the entry).
    fn unchanged_since_stored(&self, executable: &Path, now: &StatStamp) -> Option<String> {
        let (stamps, name) = self.stamp_at(executable)?;
        let text = stamps.read(&name, 1 << 20).ok()?;
        let (stamp, sha256, entry): (StatStamp, String, StatStamp) =
            serde_json::from_slice(&text).ok()?;
        let entry_path = self.entry_path(&sha256);
        let on_disk = self
            .root
            .get()
            .ok()?
            .metadata(self.root.below(&entry_path).ok()?)
            .ok()?;
        (stamp == *now && on_disk.is_file() && StatStamp::of_meta(&on_disk) == entry)
            .then_some(sha256)
    }

    fn remember_stamp(&self, executable: &Path, stamp: &StatStamp, sha256: &str, entry: &Path) {
        let Some((stamps, name)) = self.stamp_at(executable) else {
            return;
        };
        let Some(entry) = self
            .root
            .get()
            .ok()
            .and_then(|held| held.metadata(self.root.below(entry).ok()?).ok())
        else {
            return;
        };
        let entry = StatStamp::of_meta(&entry);
        let _ = stamps.write_atomic(
            &name,
            serde_json::to_string(&(stamp, sha256, entry))
                .unwrap_or_default()
                .as_bytes(),
            crate::base::beneath::FileMode::New(0o644),
        );
    }

    /// Re-hashes an entry and checks it still matches its name (used before exec when paranoid,
    /// and by tests).
    pub fn verify(&self, sha256: &str) -> Result<PathBuf, StoreError> {
        let path = self.entry_path(sha256);
        let (actual, _) = hashing::sha256_file(&path).map_err(Self::io(&path))?;
        if actual != sha256 {
            return Err(StoreError::Corrupt { path, actual });
        }
        Ok(path)
    }

    /// Removes all but the `keep` most recently used entries, never touching `in_use`.
    /// Returns the removed paths.
    pub fn gc(&self, keep: usize, in_use: &[&str]) -> Vec<PathBuf> {
        let Ok(held) = self.root.get() else {
            return Vec::new();
        };
        let Ok(rd) = held.list(Path::new("")) else {
            return Vec::new();
        };
        let protected: Vec<PathBuf> = in_use.iter().map(|d| self.entry_path(d)).collect();
        let mut entries: Vec<(std::time::SystemTime, PathBuf)> = rd
            .into_iter()
            .filter(|e| e.name.to_string_lossy().starts_with("sha256-"))
            .filter_map(|e| {
                Some((
                    held.metadata(Path::new(&e.name)).ok()?.modified,
                    self.dir.join(&e.name),
                ))
            })
            .filter(|(_, p)| !protected.contains(p))
            .collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        let mut removed = Vec::new();
        for (_, p) in entries.into_iter().skip(keep) {
            if held.remove_file(&p).is_ok() {
                removed.push(p);
            }
        }
        removed
    }
}

impl Store {
    /// Marks an entry as recently used (gc keeps the most recent ones).
    fn touch(&self, path: &Path) {
        // Entries are read-only; updating times needs no write permission for the owner.
        if let Ok(f) = self
            .root
            .get()
            .and_then(|held| held.open_read(self.root.below(path)?))
        {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
    }
}

#[cfg(test)]
mod verified_tests {
    use super::*;

    /// Issue 12, medium finding "the stored executable is run without checking it still has the
    /// hashed bytes": a replaced entry and a symlinked entry are refused, naming the digests.
    #[test]
    fn replaced_or_symlinked_entries_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("bin");
        fs::write(&src, b"#!/bin/sh\necho hi\n").unwrap();
        let store = Store::new(tmp.path().join("store"));
        let s = store.capture(&src).unwrap();
        open_verified(&s.store_path, &s.sha256).unwrap();
        // Replaced in place (the entry is read-only, but its owner can still swap it).
        fs::remove_file(&s.store_path).unwrap();
        fs::write(&s.store_path, b"#!/bin/sh\necho evil\n").unwrap();
        let e = open_verified(&s.store_path, &s.sha256).unwrap_err();
        assert!(matches!(e, StoreError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains(&s.sha256), "{e}");
        // A symlink to the right bytes is still refused.
        fs::remove_file(&s.store_path).unwrap();
        let good = tmp.path().join("good");
        fs::write(&good, b"#!/bin/sh\necho hi\n").unwrap();
        std::os::unix::fs::symlink(&good, &s.store_path).unwrap();
        let e = open_verified(&s.store_path, &s.sha256).unwrap_err();
        assert!(matches!(e, StoreError::NotRegular { .. }), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn capture_hashes_and_stores_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
        let store = Store::new(dir.path().join("store"));
        let a = store.capture(&exe).unwrap();
        assert!(a.newly_stored);
        assert_eq!(a.sha256, hashing::sha256_bytes(b"#!/bin/sh\necho hi\n"));
        assert_eq!(fs::read(&a.store_path).unwrap(), fs::read(&exe).unwrap());
        let mode = fs::metadata(&a.store_path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        let b = store.capture(&exe).unwrap();
        assert!(!b.newly_stored);
        assert_eq!(a.store_path, b.store_path);
        // The store copy is independent of later rewrites of the source.
        fs::write(&exe, b"changed").unwrap();
        assert_eq!(store.verify(&a.sha256).unwrap(), a.store_path);
        let c = store.capture(&exe).unwrap();
        assert_ne!(c.sha256, a.sha256);
    }

    #[test]
    fn untouched_executable_is_not_reread_but_any_rewrite_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"version one").unwrap();
        let stamps = dir.path().join("state/stamps");
        let store = Store::with_stamps(dir.path().join("store"), &stamps);
        let a = store.capture(&exe).unwrap();
        assert!(a.newly_stored);
        // The stamp is kept outside the store (the target directory): nothing under it.
        assert_eq!(fs::read_dir(&stamps).unwrap().count(), 1);
        assert!(!dir.path().join("store/stamps").exists());
        // Untouched: the stamp matches, nothing is copied.
        let b = store.capture(&exe).unwrap();
        assert_eq!(
            (b.sha256.clone(), b.newly_stored),
            (a.sha256.clone(), false)
        );
        // Same size, new bytes: ctime moves, so it is read and stored again.
        fs::write(&exe, b"version two").unwrap();
        let c = store.capture(&exe).unwrap();
        assert_ne!(c.sha256, a.sha256);
        assert_eq!(c.sha256, hashing::sha256_bytes(b"version two"));
        // A deleted entry is never trusted from the stamp alone.
        fs::set_permissions(&c.store_path, fs::Permissions::from_mode(0o644)).unwrap();
        fs::remove_file(&c.store_path).unwrap();
        let d = store.capture(&exe).unwrap();
        assert!(d.newly_stored);
        assert!(d.store_path.is_file());
    }

    /// Red-team round 14: an entry planted under the name of the next build's digest (the
    /// agent can build the same code and compute it) was kept by `capture` without a look at
    /// its bytes, so every later start was refused and every rebuild kept it: the server never
    /// started until the human deleted the file. The copy just hashed replaces it.
    #[test]
    fn capture_replaces_a_planted_entry_with_wrong_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"#!/bin/sh\necho real\n").unwrap();
        let store = Store::new(dir.path().join("store"));
        let digest = hashing::sha256_bytes(b"#!/bin/sh\necho real\n");
        fs::create_dir_all(store.dir()).unwrap();
        fs::write(store.entry_path(&digest), b"#!/bin/sh\necho planted\n").unwrap();
        let s = store.capture(&exe).unwrap();
        assert_eq!(s.sha256, digest);
        assert!(!s.newly_stored, "an entry was there under that name");
        assert!(open_verified(&s.store_path, &s.sha256).is_ok());
    }

    /// Red-team round 14: the "untouched since stored" fast path trusted `store/stamps/<key>`,
    /// a file in the agent-writable target dir. Stamping a freshly built executable's current
    /// metadata (all readable with `stat`) with an older entry's digest made capture report the
    /// old digest: `build` and `check --expect` said the build output was the approved binary
    /// while `target/debug/<bin>` held other code. Stamps now live outside the target dir; a
    /// stamp planted where they used to be is never read, and a store without a stamp
    /// directory reads every executable.
    #[test]
    fn a_stamp_planted_in_the_target_dir_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"approved build").unwrap();
        for store in [
            Store::with_stamps(dir.path().join("store"), dir.path().join("state/stamps")),
            Store::new(dir.path().join("store")),
        ] {
            fs::write(&exe, b"approved build").unwrap();
            let approved = store.capture(&exe).unwrap();
            fs::write(&exe, b"new unreviewed build").unwrap();
            let now = StatStamp::of(&fs::metadata(&exe).unwrap());
            let key = hashing::sha256_hex(exe.as_os_str().as_encoded_bytes());
            let planted = store.dir().join("stamps").join(&key[..24]);
            fs::create_dir_all(planted.parent().unwrap()).unwrap();
            let forged = serde_json::to_string(&(now, approved.sha256.clone())).unwrap();
            fs::write(&planted, forged).unwrap();
            let s = store.capture(&exe).unwrap();
            assert_eq!(s.sha256, hashing::sha256_bytes(b"new unreviewed build"));
        }
    }

    #[test]
    fn missing_executable_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("store"));
        assert!(matches!(
            store.capture(&dir.path().join("nope")),
            Err(StoreError::Missing(_))
        ));
    }

    #[test]
    fn gc_keeps_recent_and_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("store"));
        let mut digests = Vec::new();
        for i in 0..5 {
            let exe = dir.path().join(format!("e{i}"));
            fs::write(&exe, format!("content {i}")).unwrap();
            let s = store.capture(&exe).unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i);
            File::open(&s.store_path).unwrap().set_modified(t).unwrap();
            digests.push(s.sha256);
        }
        let removed = store.gc(2, &[&digests[0]]);
        assert_eq!(removed.len(), 2);
        assert!(store.entry_path(&digests[0]).exists(), "in use survives");
        assert!(store.entry_path(&digests[4]).exists());
        assert!(store.entry_path(&digests[3]).exists());
        assert!(!store.entry_path(&digests[1]).exists());
    }

    #[test]
    fn corrupt_entry_detected() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("store"));
        let exe = dir.path().join("e");
        fs::write(&exe, b"abc").unwrap();
        let s = store.capture(&exe).unwrap();
        fs::set_permissions(&s.store_path, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&s.store_path, b"tampered").unwrap();
        assert!(matches!(
            store.verify(&s.sha256),
            Err(StoreError::Corrupt { .. })
        ));
    }
}

#[cfg(test)]
mod planted_entry_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Red-team round 15: round 14 made capture replace an entry with wrong bytes, but the
    /// stamp fast path still returns the digest whenever `entry_path(digest).is_file()`, without
    /// a look at the entry. The agent overwrites the entry of the current build with junk; cargo
    /// leaves the unchanged executable alone, so every rebuild takes the fast path, keeps the
    /// junk, and every start is refused (Mismatch) until a source change or a human deletes it:
    /// the denial round 14 meant to end.
    #[test]
    fn the_fast_path_does_not_keep_a_planted_entry() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"#!/bin/sh\necho real\n").unwrap();
        let store = Store::with_stamps(dir.path().join("store"), dir.path().join("stamps"));
        let s = store.capture(&exe).unwrap();
        fs::set_permissions(&s.store_path, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&s.store_path, b"#!/bin/sh\necho junk\n").unwrap();
        // The next build: cargo did not touch the executable.
        let again = store.capture(&exe).unwrap();
        assert_eq!(again.sha256, s.sha256);
        assert!(
            open_verified(&again.store_path, &again.sha256).is_ok(),
            "capture kept the planted entry: every start is refused"
        );
    }

    /// Red-team round 15: a directory planted under the name of the build's digest (the agent
    /// can build the same code and compute it) makes the rename in `capture` fail (EISDIR /
    /// ENOTEMPTY), so every build fails with a store I/O error until a human removes it: the
    /// same denial as the planted file round 14 fixed.
    #[test]
    fn a_planted_directory_does_not_break_capture() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("server");
        fs::write(&exe, b"#!/bin/sh\necho real\n").unwrap();
        let store = Store::new(dir.path().join("store"));
        let digest = hashing::sha256_bytes(b"#!/bin/sh\necho real\n");
        fs::create_dir_all(store.entry_path(&digest).join("x")).unwrap();
        let s = store.capture(&exe);
        assert!(s.is_ok(), "capture failed: {:?}", s.err());
        let s = s.unwrap();
        assert!(open_verified(&s.store_path, &s.sha256).is_ok());
    }
}
