//! The per-user audit key and the head anchors, both kept outside the log.
//!
//! Owns the state directory layout:
//!
//! ```text
//! <dir>/audit.key                       32 random bytes, mode 0600, owned by the current user
//! <dir>/anchors/<H>.json                {"log": path, "seq": N, "hash": hex, "mac": hex, "offset": B}
//! ```
//!
//! `offset` (optional: anchors written before issue 15 have none) is the byte offset, in the
//! active log file, of the end of the anchored record (just past its `\n`). It lets a writer
//! find the anchored record without reading the log from the start. It is not covered by the
//! anchor MAC: a wrong offset only points at bytes that do not match the sealed `seq`/`hash`,
//! and the writer then falls back to a full scan of the active file.
//!
//! `<dir>` is `$CARGO_MCP_DEV_HOME`, else `$XDG_STATE_HOME/cargo-mcp-dev`, else
//! `$HOME/.local/state/cargo-mcp-dev`. `<H>` is the lowercase hex SHA-256 of the bytes of the
//! log's canonicalized absolute path. The anchor `mac` is defined in [`super::chain`].
//! Must not touch: log files (the writer and verifier own those) and the process environment
//! beyond reading it in [`KeyStore::from_env`].
//!
//! Security checks: directories we create are 0700; an existing state directory must belong to
//! the current user and not be writable by group or others (whoever can write it can replace
//! the key). The key file must be a regular file (not a symlink), owned by the current user,
//! with no permission bits for group or others, and exactly 32 bytes long.

use super::AuditError;
use super::chain::AuditKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Environment variable naming the state directory explicitly.
pub use super::error::HOME_ENV;

const KEY_FILE: &str = "audit.key";
const ANCHORS_DIR: &str = "anchors";

/// The head of a log as last recorded by a writer, sealed with the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    /// The canonical path of the log (informative; the file name already binds it).
    pub log: String,
    pub seq: u64,
    pub hash: String,
    /// See [`super::chain::anchor_mac`].
    pub mac: String,
    /// Where the anchored record ends in the active file (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// Where the audit key and anchors live.
#[derive(Debug, Clone)]
pub struct KeyStore {
    dir: PathBuf,
    /// The directory, held once it exists (shared by clones): the key, the anchors and the
    /// writer guards are opened below it, `anchors/` included, no link followed.
    held: HeldRoot,
    /// `anchors/`, held below it (the anchors and the writer guards are opened from it).
    anchors: HeldRoot,
}

impl PartialEq for KeyStore {
    fn eq(&self, other: &KeyStore) -> bool {
        self.dir == other.dir
    }
}

impl Eq for KeyStore {}

impl KeyStore {
    /// The store an explicit directory (tests, `--state-dir`-like options). Nothing is created
    /// until a key is needed.
    pub fn at(dir: impl Into<PathBuf>) -> KeyStore {
        let dir = dir.into();
        let held = HeldRoot::new(&dir, false);
        KeyStore {
            anchors: HeldRoot::below_root(&held, Path::new(ANCHORS_DIR)),
            held,
            dir,
        }
    }

    /// The directory held open: opened on first use (the state directory is the user's path, a
    /// link at it followed once, then), then every file below it is reached from it.
    pub(crate) fn root(&self) -> std::io::Result<Arc<Beneath>> {
        self.held.get()
    }

    /// Opens `path` (below the store's directory) from the held directory: no link followed on
    /// the way or at the name, regular files only.
    pub(crate) fn open_below(
        &self,
        path: &Path,
        access: Access,
        create: Create,
    ) -> std::io::Result<File> {
        match self.anchors.below(path) {
            Ok(rel) => self.anchors.get()?.open_with(rel, access, create),
            Err(_) => self
                .root()?
                .open_with(self.held.below(path)?, access, create),
        }
    }

    /// The store named by the environment (see the module doc).
    pub fn from_env() -> Result<KeyStore, AuditError> {
        let var = |name: &str| std::env::var_os(name);
        state_dir_from(var(HOME_ENV), var("XDG_STATE_HOME"), var("HOME"))
            .map(KeyStore::at)
            .ok_or(AuditError::NoStateDir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }

    /// The key, created (32 random bytes from the kernel, mode 0600) if there is none yet.
    pub fn load_or_create_key(&self) -> Result<AuditKey, AuditError> {
        match self.load_key() {
            Err(AuditError::KeyMissing { .. }) => {
                self.create_key()?;
                self.load_key()
            }
            other => other,
        }
    }

    /// The existing key; [`AuditError::KeyMissing`] if there is none (a verifier must never
    /// create a key: a fresh key verifies nothing).
    pub fn load_key(&self) -> Result<AuditKey, AuditError> {
        let path = self.key_path();
        let mut file = match self.open_below(&path, Access::Read, Create::No) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(AuditError::KeyMissing { path });
            }
            Err(e) if is_eloop(&e) => {
                return Err(AuditError::InsecureKey {
                    path,
                    reason: "it is a symbolic link".into(),
                });
            }
            Err(e) => return Err(AuditError::io("open audit key", path)(e)),
        };
        let meta = file
            .metadata()
            .map_err(AuditError::io("inspect audit key", &path))?;
        if !meta.file_type().is_file() {
            return Err(AuditError::InsecureKey {
                path,
                reason: "not a regular file".into(),
            });
        }
        let uid = rustix::process::geteuid().as_raw();
        if meta.uid() != uid {
            let reason = format!(
                "owned by uid {}, not by the current user (uid {uid})",
                meta.uid()
            );
            return Err(AuditError::InsecureKey { path, reason });
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            let reason = format!(
                "mode {mode:04o} gives group/others access; it must be 0600 (chmod 600 {})",
                path.display()
            );
            return Err(AuditError::InsecureKey { path, reason });
        }
        let mut bytes = Vec::with_capacity(AuditKey::LEN + 1);
        (&mut file)
            .take(AuditKey::LEN as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(AuditError::io("read audit key", &path))?;
        let bytes: [u8; AuditKey::LEN] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| AuditError::BadKey {
                    path: path.clone(),
                    reason: format!("expected {} bytes, found {}", AuditKey::LEN, meta.len()),
                })?;
        Ok(AuditKey::from_bytes(bytes))
    }

    fn create_key(&self) -> Result<(), AuditError> {
        ensure_private_dir(&self.dir)?;
        let mut bytes = [0u8; AuditKey::LEN];
        fill_random(&mut bytes)
            .map_err(AuditError::io("read random bytes for", self.key_path()))?;
        // Write a private temporary file, then hard-link it into place: link() fails if another
        // process created the key meanwhile, so two supervisors starting together agree on one
        // key and nobody ever reads a half-written key.
        // The temporary name is unique (pid + random) and opened with O_EXCL, so two threads
        // creating the key at once never write into each other's file.
        let mut nonce = [0u8; 8];
        fill_random(&mut nonce)
            .map_err(AuditError::io("read random bytes for", self.key_path()))?;
        let tmp = PathBuf::from(format!(
            ".{KEY_FILE}.{}.{}.tmp",
            std::process::id(),
            hex::encode(nonce)
        ));
        let root = self
            .root()
            .map_err(AuditError::io("open directory", &self.dir))?;
        let write = || -> std::io::Result<()> {
            let mut f = root.open_with(&tmp, Access::ReadWrite, Create::New(0o600))?;
            f.write_all(&bytes)?;
            f.sync_all()
        };
        let result = write().and_then(|()| match root.hard_link(&tmp, Path::new(KEY_FILE)) {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            other => other,
        });
        let _ = root.remove_file(&tmp);
        result.map_err(AuditError::io("create audit key", self.key_path()))
    }

    fn anchors_dir(&self) -> PathBuf {
        self.dir.join(ANCHORS_DIR)
    }

    /// Where the anchor of `log` lives. `log` must exist (its path is canonicalized).
    pub fn anchor_path(&self, log: &Path) -> Result<PathBuf, AuditError> {
        let canonical = crate::base::beneath::followed::canonicalize(log)
            .map_err(AuditError::io("resolve the path of", log))?;
        Ok(self.anchor_path_for_canonical(&canonical))
    }

    pub(crate) fn anchor_path_for_canonical(&self, canonical: &Path) -> PathBuf {
        let name = hex::encode(Sha256::digest(canonical.as_os_str().as_bytes()));
        self.anchors_dir().join(format!("{name}.json"))
    }

    /// Creates the state directory and its `anchors` directory (0700) if needed.
    pub(crate) fn ensure_anchor_dir(&self) -> Result<(), AuditError> {
        ensure_private_dir(&self.dir)?;
        ensure_private_dir(&self.anchors_dir())
    }

    /// The anchor of `log`, or `None` if there is none. Not synchronized with writers: use
    /// [`super::verify()`] for a consistent check.
    pub fn read_anchor(&self, log: &Path) -> Result<Option<Anchor>, AuditError> {
        read_anchor_at(&self.anchor_path(log)?)
    }

    /// [`read_anchor_at`] for an anchor of this store, from its held directory.
    pub(crate) fn read_anchor_below(&self, path: &Path) -> Result<Option<Anchor>, AuditError> {
        read_anchor_from(self.open_below(path, Access::Read, Create::No), path)
    }

    /// [`AnchorFile::open`] for an anchor of this store, from its held directory.
    pub(crate) fn open_anchor(
        &self,
        path: &Path,
        canonical_log: &str,
    ) -> Result<AnchorFile, AuditError> {
        let file = self.open_below(path, Access::ReadWrite, Create::IfMissing(0o600));
        AnchorFile::of(file, path, canonical_log)
    }
}

/// Reads an anchor file; `Ok(None)` if it does not exist or is empty (created, never written).
/// A reader racing the writer may see a torn anchor (see [`AnchorFile`]); readers re-read once.
/// A one-shot open by path: `audit verify` and the follower, which hold no store directory.
pub(crate) fn read_anchor_at(path: &Path) -> Result<Option<Anchor>, AuditError> {
    read_anchor_from(
        crate::base::fsutil::open_nofollow(path, Access::Read, Create::No),
        path,
    )
}

fn read_anchor_from(
    opened: std::io::Result<impl Read>,
    path: &Path,
) -> Result<Option<Anchor>, AuditError> {
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(AuditError::io("open anchor", path)(e)),
    };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(AuditError::io("read anchor", path))?;
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| AuditError::BadAnchor {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// A writer's handle on the anchor of its log, rewritten in place.
///
/// Why not a temporary file + rename: on ext4 (default `auto_da_alloc`) replacing a file by
/// rename forces the new file's data out to disk, which costs 100–300 µs per append, on the path
/// of every tool call. Instead the anchor is padded to a fixed length (a function of the log
/// path only) and overwritten with one `pwrite` at offset 0 by the log's only writer (which
/// holds the writer lock, see [`super::writer`]). Readers (`verify`) take no lock: they read the
/// anchor before the log (the writer rewrites the anchor only after the records it names are
/// written, so the log they read is never shorter than the anchor) and re-read an anchor that
/// does not parse or seal (a read racing a rewrite). A torn anchor left by a power loss
/// mid-write fails its MAC and is reported.
#[derive(Debug)]
pub(crate) struct AnchorFile {
    path: PathBuf,
    file: File,
    padded_len: usize,
    needs_trim: bool,
    /// The seq this handle last wrote: a rewrite prepared earlier and done later (see
    /// [`super::anchor::AnchorUpdate`]) never replaces a newer anchor.
    written_seq: Option<u64>,
}

impl AnchorFile {
    /// Opens (creating, mode 0600, empty = "no anchor yet") the anchor for `canonical_log`.
    /// A one-shot open by path (tests); a writer opens it through [`KeyStore::open_anchor`].
    #[cfg(test)]
    pub(crate) fn open(path: &Path, canonical_log: &str) -> Result<AnchorFile, AuditError> {
        let file =
            crate::base::fsutil::open_nofollow(path, Access::ReadWrite, Create::IfMissing(0o600));
        AnchorFile::of(file, path, canonical_log)
    }

    fn of(
        opened: std::io::Result<File>,
        path: &Path,
        canonical_log: &str,
    ) -> Result<AnchorFile, AuditError> {
        let file = opened.map_err(AuditError::io("open anchor", path))?;
        let widest = Anchor {
            log: canonical_log.to_owned(),
            seq: u64::MAX,
            hash: "0".repeat(64),
            mac: "0".repeat(64),
            offset: Some(u64::MAX),
        };
        let padded_len = serde_json::to_vec(&widest)
            .expect("an anchor always serializes")
            .len()
            + 1;
        let on_disk = file
            .metadata()
            .map_err(AuditError::io("inspect anchor", path))?
            .len();
        Ok(AnchorFile {
            path: path.to_owned(),
            file,
            padded_len,
            needs_trim: on_disk > padded_len as u64,
            written_seq: None,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The anchor as the file holds it now ([`read_anchor_at`], from this handle).
    pub(crate) fn read_back(&self) -> Result<Option<Anchor>, AuditError> {
        use std::io::{Seek, SeekFrom};
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))
            .map_err(AuditError::io("read anchor", &self.path))?;
        read_anchor_from(Ok(file), &self.path)
    }

    /// Overwrites the anchor: compact JSON, padded with spaces, ending in `\n`. Not fsynced.
    pub(crate) fn write(&mut self, anchor: &Anchor) -> Result<(), AuditError> {
        let mut bytes = serde_json::to_vec(anchor).expect("an anchor always serializes");
        bytes.resize(self.padded_len - 1, b' ');
        bytes.push(b'\n');
        self.file
            .write_all_at(&bytes, 0)
            .map_err(AuditError::io("update anchor", &self.path))?;
        if self.needs_trim {
            self.file
                .set_len(self.padded_len as u64)
                .map_err(AuditError::io("update anchor", &self.path))?;
            self.needs_trim = false;
        }
        self.written_seq = Some(anchor.seq);
        Ok(())
    }

    /// The seq this handle last wrote (`None`: nothing yet).
    pub(crate) fn written_seq(&self) -> Option<u64> {
        self.written_seq
    }

    /// fsync of the anchor (at commit points under an fsync policy other than `never`).
    pub(crate) fn sync(&self) -> Result<(), AuditError> {
        self.file
            .sync_data()
            .map_err(AuditError::io("sync anchor", &self.path))
    }
}

/// Resolves the state directory from the three variables (pure, so it is testable without
/// touching the process environment). Empty values count as unset; a relative
/// `XDG_STATE_HOME` is ignored, as the XDG spec requires.
pub fn state_dir_from(
    home_env: Option<OsString>,
    xdg_state_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set(home_env) {
        return Some(dir);
    }
    if let Some(xdg) = set(xdg_state_home).filter(|p| p.is_absolute()) {
        return Some(xdg.join("cargo-mcp-dev"));
    }
    set(home).map(|h| h.join(".local/state/cargo-mcp-dev"))
}

/// Creates `dir` (and missing parents) with mode 0700, then checks an existing `dir` is ours and
/// not writable by group or others.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<(), AuditError> {
    crate::base::beneath::followed::create_dir_all_with_mode(dir, 0o700)
        .map_err(AuditError::io("create directory", dir))?;
    let meta = crate::base::beneath::followed::metadata(dir)
        .map_err(AuditError::io("inspect directory", dir))?;
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        let reason = format!(
            "owned by uid {}, not by the current user (uid {uid})",
            meta.uid()
        );
        return Err(AuditError::InsecureDir {
            path: dir.to_owned(),
            reason,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        let reason = format!("mode {mode:04o} lets group/others write it; expected 0700");
        return Err(AuditError::InsecureDir {
            path: dir.to_owned(),
            reason,
        });
    }
    Ok(())
}

fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    crate::base::sys::unix::fill_random(buf)
}

pub(crate) use crate::base::beneath::is_link_refusal as is_eloop;
use crate::base::beneath::{Access, Beneath, Create, HeldRoot};

/// Opens an existing file for reading without following a final symlink. One-shot by path, for
/// readers (`audit verify`, the follower) that hold no directory of the log; a writer opens
/// from the directory its lock holds.
pub(crate) fn open_nofollow(path: &Path) -> std::io::Result<File> {
    // Not blocking: a named pipe planted as a segment would hang `run`'s start in `open`.
    crate::base::fsutil::open_regular_nofollow(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn state_dir_precedence() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            state_dir_from(s("/x"), s("/xdg"), s("/home/u")),
            Some(PathBuf::from("/x"))
        );
        assert_eq!(
            state_dir_from(s(""), s("/xdg"), s("/home/u")),
            Some(PathBuf::from("/xdg/cargo-mcp-dev"))
        );
        assert_eq!(
            state_dir_from(None, s("relative"), s("/home/u")),
            Some(PathBuf::from("/home/u/.local/state/cargo-mcp-dev"))
        );
        assert_eq!(state_dir_from(None, None, None), None);
        assert_eq!(state_dir_from(None, s(""), s("")), None);
    }

    #[test]
    fn key_is_created_private_once_and_reloaded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path().join("state/nested"));
        assert!(matches!(
            store.load_key(),
            Err(AuditError::KeyMissing { .. })
        ));
        let k1 = store.load_or_create_key().unwrap();
        let k2 = store.load_or_create_key().unwrap();
        assert_eq!(k1, k2);
        assert_ne!(k1, AuditKey::from_bytes([0; 32]));
        assert_eq!(mode_of(&store.key_path()), 0o600);
        assert_eq!(mode_of(store.dir()), 0o700);
        assert_eq!(std::fs::metadata(store.key_path()).unwrap().len(), 32);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("audit.key")]);
    }

    #[test]
    fn two_stores_get_different_keys() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        assert_ne!(
            KeyStore::at(a.path()).load_or_create_key().unwrap(),
            KeyStore::at(b.path()).load_or_create_key().unwrap()
        );
    }

    #[test]
    fn readable_key_is_refused_with_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path());
        store.load_or_create_key().unwrap();
        std::fs::set_permissions(store.key_path(), std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = store.load_or_create_key().unwrap_err();
        assert!(matches!(err, AuditError::InsecureKey { .. }), "{err:?}");
        assert!(err.to_string().contains("mode 0640"), "{err}");
    }

    #[test]
    fn key_owned_by_someone_else_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path());
        store.load_or_create_key().unwrap();
        let me = rustix::process::geteuid().as_raw();
        if me != 0 {
            return; // only root can give a file away; the check itself is exercised above
        }
        let other = rustix::process::Uid::from_raw(4242);
        rustix::fs::chown(store.key_path(), Some(other), None).unwrap();
        let err = store.load_key().unwrap_err();
        assert!(err.to_string().contains("owned by uid 4242"), "{err}");
    }

    #[test]
    fn symlinked_or_short_key_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path());
        let real = tmp.path().join("elsewhere");
        std::fs::write(&real, [0u8; 32]).unwrap();
        std::os::unix::fs::symlink(&real, store.key_path()).unwrap();
        let err = store.load_or_create_key().unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");

        std::fs::remove_file(store.key_path()).unwrap();
        std::fs::write(store.key_path(), [1u8; 31]).unwrap();
        std::fs::set_permissions(store.key_path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = store.load_key().unwrap_err();
        assert!(
            matches!(err, AuditError::BadKey { .. }) && err.to_string().contains("found 31"),
            "{err}"
        );
    }

    #[test]
    fn group_writable_state_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = KeyStore::at(&dir).load_or_create_key().unwrap_err();
        assert!(matches!(err, AuditError::InsecureDir { .. }), "{err:?}");
    }

    #[test]
    fn anchor_path_is_keyed_by_canonical_log_path() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path().join("state"));
        let log = tmp.path().join("a.jsonl");
        std::fs::write(&log, b"").unwrap();
        let via_dots = tmp.path().join("sub/../a.jsonl");
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let p = store.anchor_path(&log).unwrap();
        assert_eq!(p, store.anchor_path(&via_dots).unwrap());
        let canonical = std::fs::canonicalize(&log).unwrap();
        let expected = hex::encode(Sha256::digest(canonical.as_os_str().as_bytes()));
        assert_eq!(
            p,
            store.dir().join("anchors").join(format!("{expected}.json"))
        );
        assert!(
            store
                .anchor_path(&tmp.path().join("missing.jsonl"))
                .is_err()
        );
    }

    #[test]
    fn anchor_round_trips_and_missing_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::at(tmp.path().join("state"));
        store.ensure_anchor_dir().unwrap();
        let path = store.anchors_dir().join("x.json");
        assert_eq!(read_anchor_at(&path).unwrap(), None);
        let mut file = AnchorFile::open(&path, "/l").unwrap();
        assert_eq!(
            read_anchor_at(&path).unwrap(),
            None,
            "created empty = no anchor yet"
        );
        assert_eq!(mode_of(&path), 0o600);
        let a = Anchor {
            log: "/l".into(),
            seq: 3,
            hash: "a".repeat(64),
            mac: "b".repeat(64),
            offset: Some(1234),
        };
        file.write(&a).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(read_anchor_at(&path).unwrap(), Some(a.clone()));
        let b = Anchor {
            seq: u64::MAX,
            ..a.clone()
        };
        file.write(&b).unwrap();
        assert_eq!(read_anchor_at(&path).unwrap(), Some(b));
        let c = Anchor { seq: 4, ..a };
        file.write(&c).unwrap();
        assert_eq!(
            read_anchor_at(&path).unwrap(),
            Some(c.clone()),
            "shorter content fully replaces longer"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "fixed length");
        // A longer file left by someone else is trimmed on the first write.
        std::fs::write(&path, vec![b' '; 1000]).unwrap();
        let mut file = AnchorFile::open(&path, "/l").unwrap();
        file.write(&c).unwrap();
        assert_eq!(read_anchor_at(&path).unwrap(), Some(c));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        std::fs::write(&path, b"{\"seq\":1}").unwrap();
        assert!(matches!(
            read_anchor_at(&path),
            Err(AuditError::BadAnchor { .. })
        ));
    }
}
