//! Writing cargo mcp-dev's own files under `target/mcp-dev` without following planted links.
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

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::sys::unix::nofollow_flags as nofollow;

/// Creates `dir` (and parents) and checks the last component is a real directory.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a symbolic link?); refusing to write into it",
            dir.display()
        )));
    }
    Ok(())
}

fn temp_name(path: &Path) -> PathBuf {
    let mut nonce = [0u8; 6];
    // A name that another writer is unlikely to pick; the pid keeps it apart if this fails.
    let _ = crate::sys::unix::fill_random(&mut nonce);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        hex::encode(nonce)
    ))
}

/// Writes `bytes` to `path` atomically, never following a symlink (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(io::Error::other(format!(
            "{} is a directory; refusing to replace it",
            path.display()
        )));
    }
    let tmp = temp_name(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(nofollow())
            .open(&tmp)?;
        f.write_all(bytes)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Opens (creating, mode 0600) a lock file without following a final symlink.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure_dir(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nofollow())
        .open(path)
}

/// Removes a symbolic link found where one of our files belongs (before a writer that does
/// not use [`write_atomic`] yet writes there). Returns whether one was removed.
pub fn remove_planted_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
        && std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
