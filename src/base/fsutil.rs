//! Writing cargo mcp-dev's own files under `target/mcp-dev` without following planted links:
//! path-level conveniences over [`crate::base::beneath`] (the one door for files), each holding the
//! directory of the path for one access.
//!
//! These are for one-shot accesses (a command's single write, a path the human gave, the undo of
//! a failed `init`): the directories above the final name are the caller's path. An owner that
//! lives longer holds its root instead and names its files relative to it, so the directories
//! between are guarded as well and an access costs one `openat`: the session's `target/mcp-dev`
//! ([`DirWriter`]), the audit log's directory (held by its writer lock), the key store and its
//! anchors, the executable store and its stamps ([`crate::base::beneath::HeldRoot`]), the
//! package directory during identity capture.
//!
//! Anyone who can write the target directory (the agent has a shell in the project, often)
//! could plant `latest.json -> ~/.bashrc`; a plain `fs::write` follows the link and overwrites a
//! file outside the project (issue 12). Every file written there goes through this module:
//!
//! - [`write_atomic`]: the content goes to a new temporary file in the same directory, created
//!   exclusively (`O_CREAT|O_EXCL`, so a planted name fails instead of being followed) with
//!   `O_NOFOLLOW`, then renamed over the destination. `rename` replaces the directory entry
//!   itself: a symlink at the destination is replaced, its target is never touched. Readers see
//!   the old or the new content, never a mix.
//! - [`open_lock_file`]: opens (creating) a lock file without following a final symlink.
//!
//! Parent directories are created as needed. For a lock file the parent must be a real
//! directory; for [`write_atomic`] a symlinked parent is accepted (macOS's `/tmp`, a symlinked
//! output directory for `check --write`): only the final component is guarded.
//!
//! The files `init` and `new` generate in a package use the same writer, plus
//! [`check_dirs_below`] / [`create_dirs_below`]: below the package root no directory may be a
//! link (`.vscode -> ~/.config/Code/User` would put a generated file outside the package), and
//! the directories a run creates are recorded so that a failed run can remove exactly those
//! ([`remove_created`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::base::beneath::{Beneath, Kind};
pub use crate::base::beneath::{FileMode, ensure_dir};

/// Writes files below one directory held open (a running session's `target/mcp-dev`): each
/// directory between it and a file is opened without following links and the file is replaced
/// by a rename inside its own directory, all relative to descriptors ([`Beneath`]). A directory
/// swapped for a link while the session runs (`mv status status.old && ln -s ~/x status`) is
/// refused, never written through (red-team round 19); the held directory itself stays the one
/// opened at start even if it is renamed away, and is created again after `cargo clean`.
#[derive(Clone)]
pub struct DirWriter {
    /// Shared by clones (the session's build thread opens the build lock from it).
    root: std::sync::Arc<Beneath>,
}

impl DirWriter {
    /// Opens `root` (created if missing), which must be a real directory.
    pub fn open(root: &Path) -> io::Result<DirWriter> {
        Ok(DirWriter {
            root: std::sync::Arc::new(Beneath::create(root)?),
        })
    }

    /// Replaces `path` (below the root) with `bytes`, creating the directories between.
    pub fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.root.write_atomic(path, bytes, FileMode::New(0o644))
    }

    /// The held root, for the session's other files below it (its audit directory).
    pub fn root(&self) -> &Beneath {
        &self.root
    }

    /// The whole regular file `path` (below the root), at most `limit` bytes; `None` when it is
    /// missing, larger, not a regular file, or reached only through a link.
    pub fn read_small(&self, path: &Path, limit: u64) -> Option<Vec<u8>> {
        self.root.read(path, limit).ok()
    }

    /// Opens (creating, mode 0600) the lock file `path` below the root, never through a link.
    pub fn open_lock(&self, path: &Path) -> io::Result<File> {
        self.root.open_rw(path, true, 0o600)
    }

    /// Removes the file (or a link itself) `path` below the root.
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        self.root.remove_file(path)
    }

    /// Removes a symbolic link found at `path` (below the root) where one of the session's
    /// files or directories belongs; whether one was removed.
    pub fn remove_planted_link(&self, path: &Path) -> bool {
        self.root.metadata(path).is_ok_and(|m| m.is_symlink())
            && self.root.remove_file(path).is_ok()
    }
}

/// Writes `bytes` to `path` atomically, never following a symlink (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with_mode(path, bytes, FileMode::New(0o644))
}

/// [`write_atomic`] with the permissions of the new file chosen by `mode`. They are set on the
/// temporary file before the rename, so nothing the destination pointed to is ever chmod-ed.
pub fn write_atomic_with_mode(path: &Path, bytes: &[u8], mode: FileMode) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::base::beneath::followed::create_dir_all(dir)?;
    }
    let (dir, name) = Beneath::parent_of(path)?;
    dir.write_atomic(&name, bytes, mode)
}

/// The permission bits of `path` when it is a regular file (not a link), for rewriting it with
/// [`FileMode::Exactly`].
pub fn regular_file_mode(path: &Path) -> Option<u32> {
    let (dir, name) = Beneath::parent_of(path).ok()?;
    dir.metadata(&name)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.mode)
}

/// Why a directory below a root cannot hold generated files.
fn not_a_real_dir(root: &Beneath, path: &Path, kind: Kind) -> io::Error {
    if kind == Kind::Symlink {
        let to = root
            .read_link(path)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        io::Error::other(format!(
            "{} is a symbolic link{to}; refusing to write through it",
            path.display()
        ))
    } else {
        io::Error::other(format!("{} exists and is not a directory", path.display()))
    }
}

/// The directories from just below `root` down to `dir`, outermost first; an error if `dir` is
/// not below `root`.
fn dirs_below(root: &Path, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let rel = dir.strip_prefix(root).map_err(|_| {
        io::Error::other(format!(
            "{} is not inside {}",
            dir.display(),
            root.display()
        ))
    })?;
    let mut at = root.to_path_buf();
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(name) => {
                at.push(name);
                out.push(at.clone());
            }
            std::path::Component::CurDir => {}
            _ => {
                return Err(io::Error::other(format!(
                    "{} is not below {} (a `..` in the path?)",
                    dir.display(),
                    root.display()
                )));
            }
        }
    }
    Ok(out)
}

/// Checks, creating nothing, that each directory from below `root` down to `dir` that exists is
/// a real directory (not a symbolic link, not a file). `root` itself is the caller's choice and
/// is not checked.
pub fn check_dirs_below(root: &Path, dir: &Path) -> io::Result<()> {
    let dirs = dirs_below(root, dir)?;
    if dirs.is_empty() {
        return Ok(());
    }
    let held = match Beneath::open_following(root) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for d in dirs {
        match held.metadata(&d) {
            Ok(m) if m.is_dir() => {}
            Ok(m) => return Err(not_a_real_dir(&held, &d, m.kind)),
            // Missing: it and everything below it will be created by this run.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates the directories from below `root` down to `dir` one at a time, appending to
/// `created` each one this call made (outermost first; also when it fails part way), so a failed
/// run can remove exactly those. An existing component must be a real directory, as in
/// [`check_dirs_below`]: `mkdir` does not follow a link, and one found there is an error.
pub fn create_dirs_below(root: &Path, dir: &Path, created: &mut Vec<PathBuf>) -> io::Result<()> {
    let dirs = dirs_below(root, dir)?;
    if dirs.is_empty() {
        return Ok(());
    }
    let held = Beneath::open_following(root)?;
    for d in dirs {
        match held.metadata(&d) {
            Ok(m) if m.is_dir() => {}
            Ok(m) => return Err(not_a_real_dir(&held, &d, m.kind)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if held.create_dir(&d, 0o777)? {
                    created.push(d);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Best-effort undo of a failed run: removes `files`, then `dirs` innermost first, each only
/// if still empty (something else put there since is left alone).
pub fn remove_created(files: &[PathBuf], dirs: &[PathBuf]) {
    for f in files {
        if let Ok((dir, name)) = Beneath::parent_of(f) {
            let _ = dir.remove_file(&name);
        }
    }
    for d in dirs.iter().rev() {
        if let Ok((dir, name)) = Beneath::parent_of(d) {
            let _ = dir.remove_dir(&name);
        }
    }
}

/// Opens (creating, mode 0600) a lock file without following a final symlink; its directory
/// must be a real one.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    let (dir, name) = real_parent_of(path)?;
    dir.open_rw(&name, true, 0o600)
}

/// The directory of `path`, created when missing and refused when its last component is a
/// link, and the final name.
fn real_parent_of(path: &Path) -> io::Result<(Beneath, PathBuf)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => Beneath::create(d)?,
        _ => Beneath::open(Path::new("."))?,
    };
    Ok((dir, PathBuf::from(name)))
}

/// Creates (or truncates) a log file to write, without following a link at it and only if it
/// is a regular file (a named pipe planted there would block the open).
pub fn create_log_file(path: &Path) -> io::Result<File> {
    let (dir, name) = real_parent_of(path)?;
    dir.create_truncate(&name, 0o644)
}

/// Opens a file the agent may have planted or replaced, to read: no link followed, no wait on
/// a named pipe (`O_NONBLOCK`; an open of a FIFO for reading blocks until a writer comes),
/// regular files only.
pub fn open_regular_nofollow(path: &Path) -> io::Result<File> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.open_read(&name)
}

/// Opens a file to read that may be a named pipe or a device where a file was expected (a path
/// in the agent-writable tree, or one the human gave): no wait on the open (`O_NONBLOCK`),
/// regular files only. Links are followed ([`crate::base::beneath::followed::open_regular`]).
pub fn open_regular(path: &Path) -> io::Result<File> {
    crate::base::beneath::followed::open_regular(path)
}

/// Reads a whole file through [`open_regular`], refusing one over `limit` bytes.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    crate::base::beneath::followed::read_regular(path, limit)
}

/// Reads a small file of ours that the agent may have replaced ([`open_regular_nofollow`]),
/// at most `limit` bytes (`None` otherwise).
pub fn read_small_regular(path: &Path, limit: u64) -> Option<Vec<u8>> {
    let (dir, name) = Beneath::parent_of(path).ok()?;
    dir.read(&name, limit).ok()
}

/// Opens the regular file `path` as asked ([`Beneath::open_with`]), never through a link at it,
/// never waiting on a fifo; the directories above are the caller's path.
pub fn open_nofollow(
    path: &Path,
    access: crate::base::beneath::Access,
    create: crate::base::beneath::Create,
) -> io::Result<File> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.open_with(&name, access, create)
}

/// Opens a regular file of ours to append (a log this run created), never through a link, never
/// waiting on a fifo.
pub fn open_append(path: &Path) -> io::Result<File> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.open_append(&name, 0o644)
}

/// Makes `to` a second name of the file `from` (neither name followed; `to` must not exist).
pub fn hard_link(from: &Path, to: &Path) -> io::Result<()> {
    let (from_dir, from_name) = Beneath::parent_of(from)?;
    let (to_dir, to_name) = Beneath::parent_of(to)?;
    from_dir.hard_link_into(&from_name, &to_dir, &to_name)
}

/// Syncs the directory `dir` (a new name in it survives a power loss).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    Beneath::open_following(dir)?.sync()
}

/// The metadata of `path` itself (a link is not followed).
pub fn metadata_nofollow(path: &Path) -> io::Result<crate::base::beneath::Meta> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.metadata(&name)
}

/// Reads a regular file as UTF-8 text, at most `limit` bytes, never through a link at it and
/// never waiting on a fifo.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.read_to_string(&name, limit)
}

/// Removes the file (or the link) `path`, by name in its directory.
pub fn remove_file(path: &Path) -> io::Result<()> {
    let (dir, name) = Beneath::parent_of(path)?;
    dir.remove_file(&name)
}

/// Whether `path` names anything (a link included, not followed).
pub fn exists(path: &Path) -> bool {
    Beneath::parent_of(path).is_ok_and(|(dir, name)| dir.exists(&name))
}

/// Removes a symbolic link found where one of our files belongs (before a writer that does
/// not use [`write_atomic`] yet writes there). Returns whether one was removed.
pub fn remove_planted_link(path: &Path) -> bool {
    let Ok((dir, name)) = Beneath::parent_of(path) else {
        return false;
    };
    dir.metadata(&name).is_ok_and(|m| m.is_symlink()) && dir.remove_file(&name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red-team round 19: a directory swapped for a link after the writer opened its root is
    /// refused; a link at the file itself is replaced; missing directories are created.
    #[test]
    fn a_dir_writer_never_writes_through_a_directory_swapped_for_a_link() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("mcp-dev");
        let w = DirWriter::open(&root).unwrap();
        let status = root.join("status/srv.json");
        w.write(&status, b"one").unwrap();
        assert_eq!(std::fs::read(&status).unwrap(), b"one");
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("srv.json"), b"precious").unwrap();
        std::fs::rename(root.join("status"), root.join("status.old")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("status")).unwrap();
        let e = w.write(&status, b"two").unwrap_err();
        assert!(e.to_string().contains("not a directory of ours"), "{e}");
        assert_eq!(
            std::fs::read(outside.join("srv.json")).unwrap(),
            b"precious"
        );
        // A link at the file itself is replaced, its target untouched.
        let latest = root.join("launch/srv/latest.json");
        std::fs::create_dir_all(latest.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.join("srv.json"), &latest).unwrap();
        w.write(&latest, b"three").unwrap();
        assert_eq!(std::fs::read(&latest).unwrap(), b"three");
        assert!(
            !std::fs::symlink_metadata(&latest)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read(outside.join("srv.json")).unwrap(),
            b"precious"
        );
        assert!(
            w.write(&d.path().join("elsewhere.json"), b"x").is_err(),
            "not below the root"
        );
        // A root that is a link is refused at open.
        std::os::unix::fs::symlink(&outside, d.path().join("linked")).unwrap();
        assert!(DirWriter::open(&d.path().join("linked")).is_err());
    }

    /// Issue 12, medium finding "writes under `target/mcp-dev` follow symlinks (a planted
    /// `latest.json` link overwrote a file outside the project)".
    #[test]
    fn a_planted_link_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, b"precious").unwrap();
        let dir = tmp.path().join("target/mcp-dev/launch/srv");
        std::fs::create_dir_all(&dir).unwrap();
        let latest = dir.join("latest.json");
        std::os::unix::fs::symlink(&outside, &latest).unwrap();
        write_atomic(&latest, b"{}\n").unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
        assert!(
            !std::fs::symlink_metadata(&latest)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&latest).unwrap(), b"{}\n");
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        // A lock file's directory must be real.
        let linked = tmp.path().join("target/mcp-dev/status");
        std::os::unix::fs::symlink(tmp.path(), &linked).unwrap();
        assert!(open_lock_file(&linked.join("x.lock")).is_err());
        // Lock files do not follow links either.
        let lock = tmp.path().join("target/mcp-dev/build.lock");
        std::os::unix::fs::symlink(&outside, &lock).unwrap();
        assert!(open_lock_file(&lock).is_err());
        assert!(remove_planted_link(&lock));
        assert!(open_lock_file(&lock).is_ok());
    }

    #[test]
    fn exact_mode_is_set_on_the_new_file_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, b"key").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let script = tmp.path().join("watch.sh");
        std::os::unix::fs::symlink(&secret, &script).unwrap();
        write_atomic_with_mode(&script, b"#!/bin/sh\n", FileMode::Exactly(0o751)).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&script), 0o751);
        assert_eq!(mode(&secret), 0o600);
        assert_eq!(std::fs::read(&secret).unwrap(), b"key");
        assert_eq!(regular_file_mode(&script), Some(0o751));
        std::os::unix::fs::symlink(&secret, tmp.path().join("link")).unwrap();
        assert_eq!(regular_file_mode(&tmp.path().join("link")), None);
    }

    #[test]
    fn directories_below_a_root_must_be_real_and_created_ones_are_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir(root.join("real")).unwrap();
        std::fs::write(root.join("file"), b"").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        assert!(check_dirs_below(root, &root.join("real/missing/deeper")).is_ok());
        assert!(check_dirs_below(root, root).is_ok());
        for bad in ["link", "link/x", "file/x"] {
            let err = check_dirs_below(root, &root.join(bad)).unwrap_err();
            let mut created = Vec::new();
            let err2 = create_dirs_below(root, &root.join(bad), &mut created).unwrap_err();
            assert!(created.is_empty(), "{bad}");
            assert_eq!(err.to_string(), err2.to_string(), "{bad}");
        }
        assert!(check_dirs_below(root, Path::new("/elsewhere")).is_err());

        let mut created = Vec::new();
        create_dirs_below(root, &root.join("real/a/b"), &mut created).unwrap();
        assert_eq!(created, [root.join("real/a"), root.join("real/a/b")]);
        // Removal is innermost first and spares a directory something else was put in.
        std::fs::write(root.join("real/a/other"), b"").unwrap();
        remove_created(&[], &created);
        assert!(!root.join("real/a/b").exists());
        assert!(root.join("real/a/other").exists());
    }
}
