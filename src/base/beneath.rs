//! The one door for files: reading and writing below a directory held open (issue 34, point 5).
//!
//! The package directory and `target/` are writable by the agent (it often has a shell in the
//! project), so any name there may be a planted link (`latest.json -> ~/.bashrc`), a named pipe
//! (an open for reading waits for a writer forever), a device, a directory, or a file too large
//! to read. A [`Beneath`] is a capability for one root (the package, `target/mcp-dev`, the store,
//! the audit directory, the control socket's directory): the root is opened once, as a real
//! directory, and every access is relative to that descriptor:
//!
//! - the directories between the root and a name are resolved by
//!   [`crate::base::sys::unix::open_dir_beneath`] (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` on
//!   Linux, a component-by-component `openat(O_NOFOLLOW | O_DIRECTORY)` walk elsewhere): no link
//!   is followed and nothing outside the root is reached (`..` and absolute paths are refused);
//! - the final name is opened with `O_NOFOLLOW | O_NONBLOCK` and checked with `fstat`: only a
//!   regular file is read or written; a fifo, a device or a directory is refused;
//! - reads are bounded by a limit the caller names ([`Beneath::read`]); a larger file is an
//!   error that says so;
//! - a file is replaced atomically (a new temporary file, created exclusively in the same
//!   directory, renamed over the name: a link there is replaced, its target never touched);
//!   files are also created exclusively, opened to append (logs), listed, removed, renamed and
//!   linked, all relative to the directory descriptors;
//! - a held root that was removed (`cargo clean`) is opened again (created again for
//!   [`Beneath::create`]); one swapped for a link is refused, and a directory below it swapped
//!   for a link after the handle was opened is refused, never written through (red-team round 19).
//!
//! Paths given to a handle are either relative to its root or absolute and below it (the form
//! most callers hold); anything else is an error. A caller that holds only a path uses
//! [`Beneath::parent_of`] (what `crate::base::fsutil`'s path-level helpers do): the file's own
//! directory is the root for one access, so the final name gets every guard above and the
//! directories above it are the caller's path.
//!
//! Files that are not under the package or `target/` (the user's config, `/proc`, an explicit
//! `--output` path, cargo's own binary) and inputs cargo itself reads following links are
//! reached through [`followed`], one small helper per need, each saying why following a link is
//! right there. `clippy.toml` denies std's file calls everywhere else, so these two are the only
//! doors.

// The one place std's file calls are used: every other module goes through this one
// (`clippy.toml`, `disallowed-methods`).
#![allow(clippy::disallowed_methods)]

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Permissions of a file [`Beneath::write_atomic`] puts in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMode {
    /// As for a newly created file: these bits less the umask (0o644 data, 0o755 a script).
    New(u32),
    /// Exactly these bits: a user's file being rewritten keeps its own.
    Exactly(u32),
}

/// How [`Beneath::open_with`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
    /// Writes go to the end (`O_APPEND`).
    Append,
    /// Read, and writes go to the end.
    ReadAppend,
}

/// Whether [`Beneath::open_with`] creates the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Create {
    /// It must exist.
    No,
    /// Created with these permission bits (less the umask) when missing.
    IfMissing(u32),
    /// Created with these bits; an existing name (a link included) is an error.
    New(u32),
}

/// What a name below a root is, not following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A fifo, a socket or a device.
    Other,
}

/// A name's metadata, not following a link (`fstatat(AT_SYMLINK_NOFOLLOW)`).
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub kind: Kind,
    pub len: u64,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    /// `(device, inode)`: whether a name still names the file that was judged.
    pub id: (u64, u64),
    pub nlink: u64,
    pub modified: std::time::SystemTime,
    /// Modification and status-change times as the kernel gave them, `(seconds, nanoseconds)`.
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Meta {
    // The field types differ between platforms (macOS: `i32` device, `u16` mode and link count).
    #[allow(clippy::unnecessary_cast)]
    fn of(st: &rustix::fs::Stat) -> Meta {
        let kind = match FileType::from_raw_mode(st.st_mode as _) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        };
        let secs = st.st_mtime as i64;
        let nanos = st.st_mtime_nsec as u32;
        let modified = if secs >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::new(secs as u64, nanos)
        } else {
            std::time::UNIX_EPOCH
        };
        Meta {
            kind,
            len: st.st_size.max(0) as u64,
            mode: (st.st_mode as u32) & 0o7777,
            id: (st.st_dev as u64, st.st_ino as u64),
            nlink: st.st_nlink as u64,
            modified,
            mtime: (secs, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }

    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }

    pub fn is_symlink(&self) -> bool {
        self.kind == Kind::Symlink
    }
}

/// One entry of a directory listing ([`Beneath::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
}

/// A directory held open; every access is below it (see the module doc).
pub struct Beneath {
    root: PathBuf,
    /// The root as opened; opened again once it is gone (its link count is 0).
    fd: Mutex<OwnedFd>,
    /// Create the root again when it was removed (and create it at open).
    create: bool,
    /// A link at the root itself was followed at open (and is when opened again).
    follow: bool,
    /// Resolve with the component walk even where `openat2` exists (tests run both ways).
    walk: bool,
    /// A handle made by [`Beneath::sub`]: the held root it was opened below and the way there.
    /// Once removed it is opened again from there (each directory on the way checked, no link
    /// followed), never by its path from `/`.
    below: Option<Box<Below>>,
}

/// Where a sub-handle is opened again from (see [`Beneath::sub`]).
struct Below {
    parent: Beneath,
    rel: PathBuf,
    /// Permission bits of the directories created again (less the umask).
    mode: u32,
}

/// The directory holding a name: the held root itself (no descriptor opened for a name right
/// below the root), or one opened below it.
enum DirFd<'a> {
    Root(MutexGuard<'a, OwnedFd>),
    Below(OwnedFd),
}

impl AsFd for DirFd<'_> {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            DirFd::Root(g) => g.as_fd(),
            DirFd::Below(fd) => fd.as_fd(),
        }
    }
}

impl std::fmt::Debug for Beneath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beneath").field("root", &self.root).finish()
    }
}

fn open_root(root: &Path, follow: bool) -> io::Result<OwnedFd> {
    let mut flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    if follow {
        flags.remove(OFlags::NOFOLLOW);
    }
    rustix::fs::open(root, flags, Mode::empty()).map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => io::Error::other(format!(
            "{} is not a directory (a symbolic link?); refusing to use it",
            root.display()
        )),
        e => io::Error::from(e),
    })
}

impl Beneath {
    /// Holds the existing directory `root`, which must be a real directory (a link at its last
    /// component is refused; the directories above it are the caller's choice).
    pub fn open(root: &Path) -> io::Result<Beneath> {
        Beneath::hold(root, false)
    }

    /// Holds the existing directory `root` that the caller named, a link at it followed (the
    /// package directory the human gave; the directory of an `--output` path below a linked
    /// `/tmp`). Everything below it is resolved as for [`Beneath::open`].
    pub fn open_following(root: &Path) -> io::Result<Beneath> {
        Beneath::hold(root, true)
    }

    fn hold(root: &Path, follow: bool) -> io::Result<Beneath> {
        Ok(Beneath {
            root: root.to_path_buf(),
            fd: Mutex::new(open_root(root, follow)?),
            create: false,
            follow,
            walk: false,
            below: None,
        })
    }

    /// [`Beneath::open`], creating `root` (and its parents) first when missing, and again when
    /// it was removed while held.
    pub fn create(root: &Path) -> io::Result<Beneath> {
        ensure_dir(root)?;
        let mut b = Beneath::open(root)?;
        b.create = true;
        Ok(b)
    }

    /// The directory holding `path` (its parent; `.` for a bare name), for one access to the
    /// final name: links in the directories above are followed (they are the caller's path, as
    /// for a `--output` below a linked `/tmp`); the final name never is. For one-shot accesses
    /// only (a command's single write, a path the human gave): an owner that lives longer holds
    /// its root ([`Beneath::open`], [`Beneath::sub`]) and names files relative to it, so the
    /// directories between are guarded too and each access costs one `openat`.
    pub fn parent_of(path: &Path) -> io::Result<(Beneath, PathBuf)> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Ok((Beneath::open_following(dir)?, PathBuf::from(name)))
    }

    /// The same root resolved by the component walk (the path taken without `openat2`).
    #[cfg(test)]
    pub fn walking(mut self) -> Beneath {
        self.walk = true;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The held root, opened again when it was removed since.
    fn root_fd(&self) -> io::Result<MutexGuard<'_, OwnedFd>> {
        let mut held = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        if rustix::fs::fstat(&*held)?.st_nlink == 0 {
            *held = match &self.below {
                Some(b) if self.create => b.parent.make_dirs(&b.rel, b.mode)?,
                Some(b) => b.parent.dir_at(&b.rel)?,
                None => {
                    if self.create {
                        ensure_dir(&self.root)?;
                    }
                    open_root(&self.root, self.follow)?
                }
            };
        }
        Ok(held)
    }

    /// `path` relative to the root: relative as given, or absolute below the root; no `..`.
    fn rel<'p>(&self, path: &'p Path) -> io::Result<&'p Path> {
        let rel = if path.is_absolute() {
            path.strip_prefix(&self.root).map_err(|_| {
                io::Error::other(format!(
                    "{} is not below {}",
                    path.display(),
                    self.root.display()
                ))
            })?
        } else {
            path
        };
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(io::Error::other(format!(
                "{} is not below {} (a `..` in the path?)",
                path.display(),
                self.root.display()
            )));
        }
        Ok(rel)
    }

    fn shown(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// Opens the directory `rel` below the root, following no link.
    fn dir_at(&self, rel: &Path) -> io::Result<OwnedFd> {
        let root = self.root_fd()?;
        crate::base::sys::unix::open_dir_beneath(root.as_fd(), rel, self.walk)
            .map_err(|e| self.not_ours(rel, e))
    }

    fn not_ours(&self, rel: &Path, e: Errno) -> io::Error {
        match e {
            Errno::NOENT => io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such directory", self.shown(rel).display()),
            ),
            e => io::Error::other(format!(
                "{} is not a directory of ours ({}; a link planted while the session runs?); not used",
                self.shown(rel).display(),
                io::Error::from(e)
            )),
        }
    }

    /// The directory holding `path` and its final name; with `make`, the directories between
    /// are created (each one checked as it is entered). A name right below the root is reached
    /// from the held descriptor itself: one `openat` for the file, nothing else opened.
    fn split<'p>(&self, path: &'p Path, make: bool) -> io::Result<(DirFd<'_>, &'p Path, PathBuf)> {
        self.split_checked(path, make, true)
    }

    /// [`Beneath::split`]; without `check`, a name right below the root is reached from the held
    /// descriptor as it is, not checked for removal first (the caller retries with the check
    /// when the access fails with `ENOENT`, see [`Beneath::open_file`]).
    fn split_checked<'p>(
        &self,
        path: &'p Path,
        make: bool,
        check: bool,
    ) -> io::Result<(DirFd<'_>, &'p Path, PathBuf)> {
        let rel = self.rel(path)?;
        let name = match rel.components().next_back() {
            Some(Component::Normal(n)) => n,
            _ => {
                return Err(io::Error::other(format!(
                    "{} names no file below {}",
                    path.display(),
                    self.root.display()
                )));
            }
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = if parent.components().all(|c| c == Component::CurDir) {
            DirFd::Root(if check {
                self.root_fd()?
            } else {
                self.fd.lock().unwrap_or_else(|e| e.into_inner())
            })
        } else if make {
            DirFd::Below(self.make_dirs(parent, 0o755)?)
        } else {
            DirFd::Below(self.dir_at(parent)?)
        };
        Ok((dir, Path::new(name), self.shown(rel)))
    }

    /// Creates the directories of `rel` one at a time (with `mode`, less the umask), none
    /// followed when it exists.
    fn make_dirs(&self, rel: &Path, mode: u32) -> io::Result<OwnedFd> {
        let dir_flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
        let mut dir = self.dir_at(Path::new(""))?;
        let mut at = PathBuf::new();
        for part in rel.components() {
            let Component::Normal(part) = part else {
                continue;
            };
            at.push(part);
            dir = match rustix::fs::openat(&dir, part, dir_flags, Mode::empty()) {
                Ok(d) => d,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(mode as _)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    rustix::fs::openat(&dir, part, dir_flags, Mode::empty())
                        .map_err(|e| self.not_ours(&at, e))?
                }
                Err(e) => return Err(self.not_ours(&at, e)),
            };
        }
        Ok(dir)
    }

    /// Opens the final name with `flags` (plus no-follow, non-blocking) and keeps it only if it
    /// is a regular file.
    ///
    /// The one hot path (every file a writer opens at start): a name right below the root is
    /// opened from the held descriptor without first checking the root is still there; an
    /// `ENOENT` (what any open below a removed directory gets, `O_CREAT` included, with nothing
    /// created) is answered by checking, opening the root again when it was removed, and one
    /// more attempt.
    fn open_file(&self, path: &Path, flags: OFlags, mode: u32, make: bool) -> io::Result<File> {
        match self.open_file_in(path, flags, mode, make, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.root_removed() => {
                self.open_file_in(path, flags, mode, make, true)
            }
            opened => opened,
        }
    }

    fn open_file_in(
        &self,
        path: &Path,
        flags: OFlags,
        mode: u32,
        make: bool,
        check: bool,
    ) -> io::Result<File> {
        let (dir, name, shown) = self.split_checked(path, make, check)?;
        let fd = rustix::fs::openat(
            &dir,
            name,
            flags | crate::base::sys::unix::beneath_file_flags(),
            Mode::from_raw_mode(mode as _),
        )
        .map_err(|e| match e {
            Errno::LOOP => io::Error::other(Refused::Link(shown.clone())),
            e => with_path(io::Error::from(e), &shown),
        })?;
        regular(fd, &shown)
    }

    /// Whether the held root was removed since it was opened (its link count is 0).
    fn root_removed(&self) -> bool {
        let held = self.fd.lock().unwrap_or_else(|e| e.into_inner());
        rustix::fs::fstat(&*held).is_ok_and(|st| st.st_nlink == 0)
    }

    /// Opens the regular file `path` as `access` asks, created as `create` asks (directories
    /// between are then created too); no link followed, no wait on a fifo.
    pub fn open_with(&self, path: &Path, access: Access, create: Create) -> io::Result<File> {
        let mut flags = match access {
            Access::Read => OFlags::RDONLY,
            Access::ReadWrite => OFlags::RDWR,
            Access::Append => OFlags::WRONLY | OFlags::APPEND,
            Access::ReadAppend => OFlags::RDWR | OFlags::APPEND,
        };
        let (mode, make) = match create {
            Create::No => (0, false),
            Create::IfMissing(m) => {
                flags |= OFlags::CREATE;
                (m, true)
            }
            Create::New(m) => {
                flags |= OFlags::CREATE | OFlags::EXCL;
                (m, true)
            }
        };
        self.open_file(path, flags, mode, make)
    }

    /// Syncs the root directory itself (a rename or a new name in it survives a power loss).
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&*self.root_fd()?).map_err(io::Error::from)
    }

    /// Makes `to`, below `other`, a second name of the file `from` below this root (no link
    /// followed; `to` must not exist).
    pub fn hard_link_into(&self, from: &Path, other: &Beneath, to: &Path) -> io::Result<()> {
        let (from_dir, from_name, shown) = self.split(from, false)?;
        let from_dir = detach(from_dir)?;
        let (to_dir, to_name, _) = other.split(to, false)?;
        rustix::fs::linkat(&from_dir, from_name, &to_dir, to_name, AtFlags::empty())
            .map_err(|e| with_path(e.into(), &shown))
    }

    /// Opens a regular file to read (no link followed, no wait on a fifo).
    pub fn open_read(&self, path: &Path) -> io::Result<File> {
        self.open_file(path, OFlags::RDONLY, 0, false)
    }

    /// Reads a whole regular file, refusing one over `limit` bytes.
    pub fn read(&self, path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        read_bounded(self.open_read(path)?, limit, &self.shown(self.rel(path)?))
    }

    /// [`Beneath::read`] as UTF-8 text.
    pub fn read_to_string(&self, path: &Path, limit: u64) -> io::Result<String> {
        String::from_utf8(self.read(path, limit)?).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not UTF-8 text", path.display()),
            )
        })
    }

    /// Creates a new regular file (`O_EXCL`: an existing name, a link included, is an error),
    /// creating the directories between.
    pub fn create_new(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.open_file(
            path,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            mode,
            true,
        )
    }

    /// Opens a regular file to read and write, creating it (with `mode`) when `create` and it is
    /// missing; never truncated (lock files, logs read back).
    pub fn open_rw(&self, path: &Path, create: bool, mode: u32) -> io::Result<File> {
        let flags = if create {
            OFlags::RDWR | OFlags::CREATE
        } else {
            OFlags::RDWR
        };
        self.open_file(path, flags, mode, create)
    }

    /// Opens a regular file to append (created with `mode` when missing).
    pub fn open_append(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.open_file(
            path,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE,
            mode,
            true,
        )
    }

    /// Creates or truncates a regular file to write (a log of this run); the truncation happens
    /// after the file was found regular, so a planted fifo or device is never written.
    pub fn create_truncate(&self, path: &Path, mode: u32) -> io::Result<File> {
        let f = self.open_file(path, OFlags::WRONLY | OFlags::CREATE, mode, true)?;
        f.set_len(0)?;
        Ok(f)
    }

    /// Replaces `path` with `bytes`: a new temporary file in the same directory, created
    /// exclusively and never through a link, renamed over the name. Directories between are
    /// created; a directory at the name is refused.
    pub fn write_atomic(&self, path: &Path, bytes: &[u8], mode: FileMode) -> io::Result<()> {
        let (dir, name, shown) = self.split(path, true)?;
        if rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode as _) == FileType::Directory)
        {
            return Err(io::Error::other(format!(
                "{} is a directory; refusing to replace it",
                shown.display()
            )));
        }
        let tmp = temp_name(name);
        let create_bits = match mode {
            FileMode::New(bits) => bits,
            // Owner-only until the exact bits are set: never briefly wider than asked.
            FileMode::Exactly(_) => 0o600,
        };
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(
            &dir,
            &tmp,
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(create_bits as _),
        )
        .map_err(|e| with_path(e.into(), &shown))?;
        let written = (|| {
            if let FileMode::Exactly(bits) = mode {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(bits as _))?;
            }
            File::from(fd).write_all(bytes)?;
            rustix::fs::renameat(&dir, &tmp, &dir, name).map_err(io::Error::from)
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
        }
        written
    }

    /// The entries of the directory `path` (`""` or the root: the root itself), not following
    /// links: a link is listed as [`Kind::Symlink`]. `.` and `..` are left out.
    pub fn list(&self, path: &Path) -> io::Result<Vec<Entry>> {
        let rel = self.rel(path)?;
        // The root itself is read from its held descriptor (nothing resolved again).
        let dir = if rel.components().all(|c| c == Component::CurDir) {
            DirFd::Root(self.root_fd()?)
        } else {
            DirFd::Below(self.dir_at(rel)?)
        };
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name: OsString =
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).to_owned();
            let kind = match entry.file_type() {
                FileType::RegularFile => Kind::File,
                FileType::Directory => Kind::Dir,
                FileType::Symlink => Kind::Symlink,
                FileType::Unknown => rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| Meta::of(&st).kind)
                    .unwrap_or(Kind::Other),
                _ => Kind::Other,
            };
            out.push(Entry { name, kind });
        }
        Ok(out)
    }

    /// Creates the directory `path` and those between, none followed when it exists.
    pub fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.make_dirs(self.rel(path)?, 0o755).map(drop)
    }

    /// Creates the one directory `path` (its parent must exist): `Ok(false)` when it existed as
    /// a real directory, an error when something else is there.
    pub fn create_dir(&self, path: &Path, mode: u32) -> io::Result<bool> {
        let (dir, name, shown) = self.split(path, false)?;
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode as _)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
                match Meta::of(&st).kind {
                    Kind::Dir => Ok(false),
                    Kind::Symlink => Err(io::Error::other(format!(
                        "{} is a symbolic link; refusing to write through it",
                        shown.display()
                    ))),
                    _ => Err(io::Error::other(format!(
                        "{} exists and is not a directory",
                        shown.display()
                    ))),
                }
            }
            Err(e) => Err(with_path(e.into(), &shown)),
        }
    }

    /// A handle for the directory `path` below this root (created when `create`), each
    /// directory on the way checked (no link followed). It keeps the directory it opened even if
    /// that is renamed away; once removed (`cargo clean`) it is opened again below this root (and
    /// created again when `create`), never by its path.
    pub fn sub(&self, path: &Path, create: bool) -> io::Result<Beneath> {
        self.sub_made(path, create.then_some(0o755))
    }

    /// [`Beneath::sub`], created (now and again once removed) with `mode`, less the umask (the
    /// audit log's private directory).
    pub fn sub_with_mode(&self, path: &Path, mode: u32) -> io::Result<Beneath> {
        self.sub_made(path, Some(mode))
    }

    fn sub_made(&self, path: &Path, make: Option<u32>) -> io::Result<Beneath> {
        let rel = self.rel(path)?;
        let fd = match make {
            Some(mode) => self.make_dirs(rel, mode)?,
            None => self.dir_at(rel)?,
        };
        Ok(Beneath {
            root: self.shown(rel),
            fd: Mutex::new(fd),
            create: make.is_some(),
            follow: false,
            walk: self.walk,
            below: Some(Box::new(Below {
                parent: self.try_clone()?,
                rel: rel.to_path_buf(),
                mode: make.unwrap_or(0o755),
            })),
        })
    }

    /// A second handle on the same root (the descriptor duplicated, opened again the same way).
    pub fn try_clone(&self) -> io::Result<Beneath> {
        let fd = self.root_fd()?.try_clone()?;
        Ok(Beneath {
            root: self.root.clone(),
            fd: Mutex::new(fd),
            create: self.create,
            follow: self.follow,
            walk: self.walk,
            below: match &self.below {
                Some(b) => Some(Box::new(Below {
                    parent: b.parent.try_clone()?,
                    rel: b.rel.clone(),
                    mode: b.mode,
                })),
                None => None,
            },
        })
    }

    /// Metadata of `path` (the root itself for `""`), not following a link at it.
    pub fn metadata(&self, path: &Path) -> io::Result<Meta> {
        let rel = self.rel(path)?;
        if rel.components().next().is_none() {
            return Ok(Meta::of(&rustix::fs::fstat(&*self.root_fd()?)?));
        }
        let (dir, name, shown) = self.split(path, false)?;
        rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| Meta::of(&st))
            .map_err(|e| with_path(e.into(), &shown))
    }

    /// Whether `path` names something (a link included, not followed).
    pub fn exists(&self, path: &Path) -> bool {
        self.metadata(path).is_ok()
    }

    /// Removes the file or link `path` (a link itself, never its target).
    pub fn remove_file(&self, path: &Path) -> io::Result<()> {
        let (dir, name, shown) = self.split(path, false)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| with_path(e.into(), &shown))
    }

    /// Removes the empty directory `path`.
    pub fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let (dir, name, shown) = self.split(path, false)?;
        rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
            .map_err(|e| with_path(e.into(), &shown))
    }

    /// Removes `path` and everything below it, following no link (a link is removed itself).
    pub fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let meta = self.metadata(path)?;
        if !meta.is_dir() {
            return self.remove_file(path);
        }
        let rel = self.rel(path)?.to_path_buf();
        for e in self.list(&rel)? {
            let child = rel.join(&e.name);
            if e.kind == Kind::Dir {
                self.remove_tree(&child)?;
            } else {
                self.remove_file(&child)?;
            }
        }
        self.remove_dir(&rel)
    }

    /// Renames `from` to `to`, both below this root (`renameat` between the two directories).
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_dir, from_name, shown) = self.split(from, false)?;
        let from_dir = detach(from_dir)?;
        let (to_dir, to_name, _) = self.split(to, false)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name)
            .map_err(|e| with_path(e.into(), &shown))
    }

    /// Makes `to` a second name of the file `from` (no link followed; `to` must not exist).
    pub fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.hard_link_into(from, self, to)
    }

    /// The target of the link `path` (not followed).
    pub fn read_link(&self, path: &Path) -> io::Result<PathBuf> {
        let (dir, name, shown) = self.split(path, false)?;
        rustix::fs::readlinkat(&dir, name, Vec::new())
            .map(|t| PathBuf::from(std::ffi::OsString::from_vec(t.into_bytes())))
            .map_err(|e| with_path(e.into(), &shown))
    }

    /// Sets the permission bits of the file or directory `path`, never through a link.
    pub fn set_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        let rel = self.rel(path)?;
        let meta = self.metadata(rel)?;
        let fd: OwnedFd = match meta.kind {
            Kind::Dir => self.dir_at(rel)?,
            Kind::File => self.open_read(rel)?.into(),
            // A socket cannot be opened: changed by name, in its directory, once known not to be
            // a link (`fchmodat` has no no-follow on Linux).
            Kind::Other => {
                let (dir, name, shown) = self.split(rel, false)?;
                return rustix::fs::chmodat(
                    &dir,
                    name,
                    Mode::from_raw_mode(mode as _),
                    AtFlags::empty(),
                )
                .map_err(|e| with_path(e.into(), &shown));
            }
            Kind::Symlink => {
                return Err(io::Error::other(format!(
                    "{} is not a file or a directory; mode not set",
                    self.shown(rel).display()
                )));
            }
        };
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode as _)).map_err(io::Error::from)
    }
}

/// A root opened on first use and held from then on, shared by clones of its owner (a key
/// store, an executable store, a cache): an owner made before its directory exists opens it
/// when it is first needed; a failed open is tried again next time.
#[derive(Debug, Clone)]
pub struct HeldRoot {
    path: PathBuf,
    /// Created when missing ([`Beneath::create`]); otherwise it must exist.
    create: bool,
    /// Opened below this held root ([`Beneath::sub`]) instead of by its path.
    parent: Option<Box<HeldRoot>>,
    held: std::sync::Arc<Mutex<Option<std::sync::Arc<Beneath>>>>,
}

impl HeldRoot {
    /// The directory `path` (the caller's path: a link at it is followed once, when opened, as
    /// for [`Beneath::open_following`]), created when `create`.
    pub fn new(path: impl Into<PathBuf>, create: bool) -> HeldRoot {
        HeldRoot {
            path: path.into(),
            create,
            parent: None,
            held: Default::default(),
        }
    }

    /// The directory `rel` below `parent`, opened on first use from `parent`'s handle, every
    /// directory on the way checked (no link followed).
    pub fn below_root(parent: &HeldRoot, rel: &Path) -> HeldRoot {
        HeldRoot {
            path: parent.path.join(rel),
            create: false,
            parent: Some(Box::new(parent.clone())),
            held: Default::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root, opened now if it is not held yet.
    pub fn get(&self) -> io::Result<std::sync::Arc<Beneath>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(root) = &*held {
            return Ok(root.clone());
        }
        let root = if let Some(parent) = &self.parent {
            parent.get()?.sub(parent.below(&self.path)?, false)?
        } else if self.create {
            ensure_dir(&self.path)?;
            let mut b = Beneath::open_following(&self.path)?;
            b.create = true;
            b
        } else {
            Beneath::open_following(&self.path)?
        };
        let root = std::sync::Arc::new(root);
        *held = Some(root.clone());
        Ok(root)
    }

    /// `path` relative to this root: it must be below it (the form owners hold their paths in).
    pub fn below<'p>(&self, path: &'p Path) -> io::Result<&'p Path> {
        path.strip_prefix(&self.path).map_err(|_| {
            io::Error::other(format!(
                "{} is not below {}",
                path.display(),
                self.path.display()
            ))
        })
    }
}

/// Why a name was refused; [`is_link_refusal`] and [`is_not_regular`] tell them apart.
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{} is a symbolic link; not followed", .0.display())]
    Link(PathBuf),
    #[error("{} is not a regular file", .0.display())]
    NotRegular(PathBuf),
}

fn refused(e: &io::Error) -> Option<&Refused> {
    e.get_ref().and_then(|r| r.downcast_ref::<Refused>())
}

/// Whether an open failed because a link was found where a file or directory of ours belongs
/// (also the raw `ELOOP` of an `O_NOFOLLOW` open).
pub fn is_link_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::LOOP.raw_os_error())
        || matches!(refused(e), Some(Refused::Link(_)))
}

/// Whether an open was refused because the name is not a regular file (a fifo, a device, a
/// directory).
pub fn is_not_regular(e: &io::Error) -> bool {
    matches!(refused(e), Some(Refused::NotRegular(_)))
}

/// Keeps `fd` only if it is a regular file.
fn regular(fd: OwnedFd, shown: &Path) -> io::Result<File> {
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode as _) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            Refused::NotRegular(shown.to_path_buf()),
        ));
    }
    Ok(File::from(fd))
}

/// A directory descriptor of its own, so a second [`Beneath::split`] on the same root can run
/// while it is held (the root's lock is not kept).
fn detach(dir: DirFd<'_>) -> io::Result<OwnedFd> {
    match dir {
        DirFd::Root(g) => Ok(g.try_clone()?),
        DirFd::Below(fd) => Ok(fd),
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Reads `file` to the end, refusing more than `limit` bytes (checked on the size first, and on
/// the bytes read: a file that grows while read is refused as well).
pub fn read_bounded(file: File, limit: u64, shown: &Path) -> io::Result<Vec<u8>> {
    let too_large = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is larger than {limit} bytes", shown.display()),
        )
    };
    if file.metadata()?.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// A temporary name next to `name` that another writer is unlikely to pick.
pub(crate) fn temp_name(name: &Path) -> PathBuf {
    let mut nonce = [0u8; 6];
    // The pid keeps it apart if the random bytes fail.
    let _ = crate::base::sys::unix::fill_random(&mut nonce);
    PathBuf::from(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        hex::encode(nonce)
    ))
}

/// Creates `dir` (and parents) and checks the last component is a real directory: a root the
/// caller chose (the directories above it are followed).
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

/// Files reached by a path whose links are followed on purpose: the path is one the human
/// gave (`--manifest-path`, `--output`, a key file), one outside the project (`$HOME`'s cache and
/// config, `/proc`, a program on `PATH`, cargo's own binary), or an input cargo itself reads
/// following links (a manifest, `Cargo.lock`, `.cargo/config.toml`, a build output cargo
/// linked): reading what cargo reads is the point. Even here a fifo or a device is never waited
/// on (`O_NONBLOCK`) and is refused, and whole-file reads are bounded. Nothing cargo mcp-dev
/// writes below `target/` goes through here.
pub mod followed {
    use super::*;

    /// Opens a regular file to read (links followed, no wait on a fifo).
    pub fn open_regular(path: &Path) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags((OFlags::NONBLOCK | OFlags::CLOEXEC).bits() as i32)
            .open(path)?;
        regular(file.into(), path)
    }

    /// [`open_regular`], the whole file, at most `limit` bytes.
    pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
        read_bounded(open_regular(path)?, limit, path)
    }

    /// [`read_regular`] as UTF-8 text.
    pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
        String::from_utf8(read_regular(path, limit)?).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not UTF-8 text", path.display()),
            )
        })
    }

    /// The absolute form of a path the human gave (a manifest, a package directory), links
    /// resolved: what they named is what they meant; checks below it go through [`Beneath`].
    pub fn canonicalize(path: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }

    /// Metadata following links.
    pub fn metadata(path: &Path) -> io::Result<std::fs::Metadata> {
        std::fs::metadata(path)
    }

    /// Whether `path` is a regular file, links followed (a program, a manifest, a config).
    pub fn is_file(path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_file())
    }

    /// Whether `path` is a directory, links followed (a directory the human named).
    pub fn is_dir(path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_dir())
    }

    /// Whether `path` names anything, links followed.
    pub fn exists(path: &Path) -> bool {
        std::fs::metadata(path).is_ok()
    }

    /// Metadata not following a final link, for a path whose directory is not a root we hold
    /// (a socket path the human chose, a package directory about to be created).
    pub fn symlink_metadata(path: &Path) -> io::Result<std::fs::Metadata> {
        std::fs::symlink_metadata(path)
    }

    /// Creates `dir` and its parents, following links: the directory of a path the human gave
    /// (`check --write`'s output below a linked `/tmp`); the file itself is then written through
    /// [`Beneath::parent_of`].
    pub fn create_dir_all(dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    /// Creates `dir` and its parents with `mode` (less the umask), following links: the control
    /// socket's private directory, outside the project; the caller then checks it is a real
    /// directory of ours.
    pub fn create_dir_all_with_mode(dir: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
    }

    /// `/dev/null`, to read (a device, not below the project).
    pub fn dev_null() -> io::Result<File> {
        File::open("/dev/null")
    }

    /// The target of a link outside the tree (`/proc/self/exe`, a tool on `PATH`).
    pub fn read_link(path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(path)
    }
}

#[cfg(test)]
mod tests;
