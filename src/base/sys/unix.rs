//! The platform seam for processes (Linux first; macOS uses the same POSIX calls).
//!
//! Process groups, group signals, exit decoding, the parent-death check, a terminal's modes,
//! a file's identity, random bytes from the operating system, and whether one file-system watch
//! covers a whole tree.
//! Nothing here knows what the processes are for.

use std::os::fd::AsFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

use rustix::process::{Pid, Signal};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => write!(f, "signal {s} ({})", signal_name(s)),
            _ => write!(f, "unknown exit"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Sig {
    Term,
    Kill,
}

/// Fills `buf` with random bytes from the operating system (`getrandom` on Linux,
/// `getentropy` on macOS): audit keys and temporary-file nonces.
pub fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    getrandom::fill(buf).map_err(|e| match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::other(format!("no random bytes from the operating system: {e}")),
    })
}

/// A file's identity, `(device, inode)`: whether a path still names the file that was judged
/// (an audit log about to be cut, a socket about to be removed).
pub fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Makes a file-size limit (`RLIMIT_FSIZE`) a write error instead of a kill: `SIGXFSZ` gets a
/// no-op handler, so a write past the limit fails with `EFBIG`, which the audit writer handles
/// like any write error (the partial line is cut off, the call fails closed, the log stays
/// valid). Issue 12: the default action killed the supervisor mid-append and left a torn record.
/// A handler (not `SIG_IGN`) is used so that servers we start get the default action back on
/// exec.
pub fn survive_file_size_limit() -> std::io::Result<()> {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGXFSZ, flag)?;
    let _ = DONE.set(());
    Ok(())
}

/// A command that executes the open file `file` (hashed through that descriptor) with
/// `argv[0] = arg0`. On Linux the program path is `/proc/self/fd/N`: `execve` resolves it before
/// close-on-exec descriptors are closed, so the exact open file runs. Elsewhere (no procfs) the
/// path `arg0` is executed, after the caller verified it.
pub fn command_from_fd(file: &std::fs::File, arg0: &str) -> Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        if rustix::fs::stat("/proc/self/fd").is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        }) {
            let mut cmd = Command::new(fd_path);
            cmd.arg0(arg0);
            return cmd;
        }
    }
    let _ = file;
    Command::new(arg0)
}

/// Start the child as the leader of a new process group (pgid = its pid), so the stop sequence
/// reaches its grandchildren too.
pub fn own_process_group(cmd: &mut Command) {
    cmd.process_group(0);
}

impl Sig {
    fn signal(self) -> Signal {
        match self {
            Sig::Term => Signal::TERM,
            Sig::Kill => Signal::KILL,
        }
    }
}

/// Sends a signal to a whole process group; a group that is already gone is not an error.
pub fn signal_group(pgid: u32, sig: Sig) {
    if let Some(pid) = Pid::from_raw(pgid as i32) {
        let _ = rustix::process::kill_process_group(pid, sig.signal());
    }
}

/// Sends a signal to one process; a process that is already gone is not an error.
pub fn signal_process(pid: u32, sig: Sig) {
    if let Some(p) = Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig.signal());
    }
}

pub fn exit_info(status: ExitStatus) -> ExitInfo {
    ExitInfo {
        code: status.code(),
        signal: status.signal(),
    }
}

pub fn is_text_busy(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error())
}

/// The parent's pid now; when it changes (re-parented to init or a subreaper) the host is gone.
pub fn parent_pid() -> u32 {
    rustix::process::getppid()
        .map(|p| p.as_raw_nonzero().get() as u32)
        .unwrap_or(1)
}

/// Returns once `parent` (our parent when the caller read [`parent_pid`]) is no longer our
/// parent: it exited and we were re-parented. On Linux this waits on a pidfd, so an idle
/// supervisor is not woken at all; elsewhere, or on a kernel without pidfds (before 5.3), it
/// checks every `every`.
pub fn wait_for_parent_exit(parent: u32, every: std::time::Duration) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(pid) = Pid::from_raw(parent as i32)
        && let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
    {
        use rustix::event::{PollFd, PollFlags, poll};
        // The parent may have exited, and its pid been reused, before the pidfd was opened:
        // then we were re-parented already, and the pidfd names a stranger.
        if parent_pid() != parent {
            return;
        }
        loop {
            let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
            match poll(&mut fds, None) {
                // The kernel re-parents a process's children before it signals its pidfd, so
                // the check below returns at once; it also keeps a pidfd that woke early (a
                // leader thread that ended before its process did) from ending the session.
                Ok(_) if !fds[0].revents().is_empty() => break,
                Ok(_) | Err(rustix::io::Errno::INTR) => continue,
                // Not expected from a pidfd: the check below still sees the exit.
                Err(_) => break,
            }
        }
    }
    while parent_pid() == parent {
        std::thread::sleep(every);
    }
}

pub fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// Whether a process with this pid exists (signal 0).
pub fn process_exists(pid: u32) -> bool {
    match rustix::process::Pid::from_raw(pid as i32) {
        Some(p) => {
            rustix::process::test_kill_process(p).is_ok()
                || rustix::process::test_kill_process(p) == Err(rustix::io::Errno::PERM)
        }
        None => false,
    }
}

/// `open(2)` flags that refuse a final symbolic link and keep the descriptor out of children.
pub fn nofollow_flags() -> i32 {
    (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32
}

/// Flags for opening a file to read that may have been planted: no link followed, and no wait
/// when it is a named pipe or a device (an open of a FIFO for reading blocks until a writer
/// comes; the caller then refuses anything that is not a regular file).
pub fn nofollow_nonblock_flags() -> i32 {
    (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK)
        .bits() as i32
}

/// Flags for opening a file to read without waiting when it is a named pipe or a device (links
/// are followed: a path the human gave); the caller refuses anything not a regular file.
pub fn nonblock_flags() -> i32 {
    (rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NONBLOCK).bits() as i32
}

/// Opens the directory `rel` below the directory `dir` (`rel` is relative, has no `..` and no
/// root; the caller checked), following no symbolic link on the way and never leaving `dir`:
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` on Linux; where the
/// kernel lacks it (`ENOSYS` before 5.6, a seccomp filter's `EPERM`) and on other systems, one
/// `openat(O_NOFOLLOW | O_DIRECTORY)` per component. `walk` asks for the component walk (tests
/// run both). An empty `rel` is `dir` itself, opened again.
pub fn open_dir_beneath(
    dir: std::os::fd::BorrowedFd<'_>,
    rel: &std::path::Path,
    walk: bool,
) -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
        if !walk && !NO_OPENAT2.load(Ordering::Relaxed) {
            use rustix::fs::ResolveFlags;
            let resolve =
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
            let path = if rel.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                rel
            };
            match rustix::fs::openat2(dir, path, flags, Mode::empty(), resolve) {
                Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                }
                // A link on the way (`ELOOP`) or a way out (`EXDEV`): both are refusals.
                Err(rustix::io::Errno::XDEV) => return Err(rustix::io::Errno::LOOP),
                other => return other,
            }
        }
    }
    let _ = walk;
    let mut at = rustix::fs::openat(dir, ".", flags, Mode::empty())?;
    for part in rel.components() {
        match part {
            std::path::Component::Normal(name) => {
                at = rustix::fs::openat(&at, name, flags, Mode::empty())?;
            }
            std::path::Component::CurDir => {}
            // The caller refused these; never resolved here either.
            _ => return Err(rustix::io::Errno::XDEV),
        }
    }
    Ok(at)
}

/// Flags for opening the final component of a path inside a directory held open: no link
/// followed, no wait on a named pipe or a device, out of children, no controlling terminal.
pub fn beneath_file_flags() -> rustix::fs::OFlags {
    use rustix::fs::OFlags;
    OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY
}

/// Whether an open failed because the path was a symbolic link (`ELOOP` under `O_NOFOLLOW`).
pub fn is_symlink_refusal(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

/// The uid of the process at the other end of a local socket.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn peer_uid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|c| c.uid.as_raw())
}

/// Elsewhere the owner-only directory (0700) is the guard until `getpeereid` is wired: the peer
/// is taken to be us.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn peer_uid(_stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    Some(current_uid())
}

/// Room for a whole large message in a pipe (1 MiB, the default unprivileged maximum), so a
/// 400 KB `tools/list` answer crosses in one write and one wake-up instead of six 64 KiB
/// rounds. Callers widen only pipes that carried such a message: the room counts against the
/// user's pipe quota (`fs.pipe-user-pages-soft`, 64 MiB by default). Best effort, and never a
/// shrink: nothing changes for a descriptor that is not a pipe, a pipe already as wide, where
/// the quota is spent, or on a platform that cannot resize pipes.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn widen_pipe(fd: impl std::os::fd::AsFd) {
    const WIDE: usize = 1 << 20;
    if rustix::pipe::fcntl_getpipe_size(&fd).is_ok_and(|size| size < WIDE) {
        let _ = rustix::pipe::fcntl_setpipe_size(&fd, WIDE);
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn widen_pipe(_fd: impl std::os::fd::AsFd) {}

/// The pid of the process at the other end of a local socket, where the platform says.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|c| c.pid.as_raw_nonzero().get() as u32)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn peer_pid(_stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    None
}

/// A terminal's modes (termios) as found, put back when dropped: a key reader that switches to
/// raw mode may still be in it when its owner ends. Not a terminal: does nothing.
pub struct TerminalModes(Option<(std::os::fd::OwnedFd, rustix::termios::Termios)>);

impl TerminalModes {
    /// Stdin's modes.
    pub fn save() -> TerminalModes {
        match std::io::stdin().as_fd().try_clone_to_owned() {
            Ok(fd) => TerminalModes::of(fd),
            Err(_) => TerminalModes(None),
        }
    }

    /// The modes of the terminal `fd` refers to.
    pub fn of(fd: std::os::fd::OwnedFd) -> TerminalModes {
        TerminalModes(
            rustix::termios::tcgetattr(&fd)
                .ok()
                .map(|modes| (fd, modes)),
        )
    }
}

impl Drop for TerminalModes {
    fn drop(&mut self) {
        if let Some((fd, modes)) = &self.0 {
            let _ = rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, modes);
        }
    }
}

/// Whether one file-system watch covers a whole tree (macOS FSEvents: one stream, no per-directory
/// cost). Elsewhere (Linux inotify) every directory is a watch of its own, a kernel-limited
/// resource: the caller walks the tree itself and chooses which directories to watch.
pub fn one_watch_covers_a_tree() -> bool {
    cfg!(target_os = "macos")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};

    /// A pseudo-terminal whose echo is turned off behind the guard's back gets it back when
    /// the guard is dropped (`approve --follow` leaving the user's shell without echo).
    #[test]
    fn terminal_modes_are_put_back() {
        use rustix::fs::{Mode, OFlags, open};
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("a pty");
        grantpt(&master).unwrap();
        unlockpt(&master).unwrap();
        let name = ptsname(&master, Vec::new()).unwrap();
        let tty = open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY,
            Mode::empty(),
        )
        .unwrap();
        let echo = |fd: &std::os::fd::OwnedFd| {
            tcgetattr(fd)
                .unwrap()
                .local_modes
                .contains(LocalModes::ECHO)
        };
        assert!(echo(&tty), "a fresh pty echoes");
        let guard = TerminalModes::of(tty.try_clone().unwrap());
        let mut raw = tcgetattr(&tty).unwrap();
        raw.local_modes
            .remove(LocalModes::ECHO | LocalModes::ICANON);
        tcsetattr(&tty, OptionalActions::Now, &raw).unwrap();
        assert!(!echo(&tty));
        drop(guard);
        assert!(echo(&tty), "echo is back");
        // Not a terminal: nothing saved, nothing done.
        let (r, _w) = std::io::pipe().unwrap();
        drop(TerminalModes::of(r.into()));
    }

    /// A pipe is widened so a 400 KB message fits whole, and the data in it is kept; a file
    /// is left as it is, without an error.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn pipes_are_widened_and_other_descriptors_left_alone() {
        use std::io::{Read, Write};
        let (mut r, mut w) = std::io::pipe().unwrap();
        let before = rustix::pipe::fcntl_getpipe_size(&w).unwrap();
        w.write_all(b"kept").unwrap();
        widen_pipe(&w);
        let after = rustix::pipe::fcntl_getpipe_size(&r).unwrap();
        assert!(
            after >= 1 << 20,
            "{before} -> {after} (is the user's pipe quota, fs.pipe-user-pages-soft, spent?)"
        );
        // A whole large answer fits without a reader.
        w.write_all(&vec![b'x'; 400_000]).unwrap();
        drop(w);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert!(got.starts_with(b"kept"));
        let file = tempfile::tempfile().unwrap();
        widen_pipe(&file);
    }
}

/// The last region of `file` that holds data and starts before `end`, clipped to `end`, as the
/// file system reports it (`SEEK_DATA`/`SEEK_HOLE`: a hole reads as NUL bytes and costs nothing
/// to skip). Found by bisection, whatever the number of regions: "is there data at or after
/// p" only changes once as p grows. `Ok(None)`: no data before `end`; `Err`: the file system
/// cannot say (the caller reads instead). The file's offset is left where it was (unless the
/// seek that puts it back fails).
pub fn last_data_region(file: &std::fs::File, end: u64) -> std::io::Result<Option<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    let here = seek(file, SeekFrom::Current(0))?;
    let data_at_or_after = |p: u64| -> std::io::Result<Option<u64>> {
        match seek(file, SeekFrom::Data(p)) {
            Ok(d) => Ok(Some(d)),
            Err(rustix::io::Errno::NXIO) => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    let hole_after = |q: u64| -> std::io::Result<u64> { Ok(seek(file, SeekFrom::Hole(q))?) };
    let found = (|| {
        // The largest p < end with data starting in p..end.
        let starts_before_end =
            |p: u64| -> std::io::Result<bool> { Ok(data_at_or_after(p)?.is_some_and(|d| d < end)) };
        if end == 0 || !starts_before_end(0)? {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0u64, end); // data starts in lo..end; none in hi..end
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if starts_before_end(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // `lo` is the region's last data byte before `end`; its start is the smallest q
        // whose next hole lies past `lo` (before the region, the next hole comes first).
        let stop = hole_after(lo)?.min(end);
        if hole_after(0)? > lo {
            return Ok(Some((0, stop)));
        }
        let (mut q_lo, mut q_hi) = (1u64, lo); // the start is in q_lo..=q_hi
        while q_lo < q_hi {
            let mid = q_lo + (q_hi - q_lo) / 2;
            if hole_after(mid)? > lo {
                q_hi = mid;
            } else {
                q_lo = mid + 1;
            }
        }
        Ok(Some((q_hi, stop)))
    })();
    seek(file, SeekFrom::Start(here))?;
    found
}

#[cfg(test)]
mod tests_regions {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::FileExt;

    /// Holes are not data, however many regions there are; the file's offset is kept.
    #[test]
    fn the_last_data_region_is_found_past_holes_and_the_offset_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(b"records\n").unwrap();
        // 5,000 one-byte NUL regions 1 MiB apart, then a hole to 8 GiB.
        for i in 1..=5000u64 {
            f.write_all_at(&[0], i << 20).unwrap();
        }
        f.set_len(8 << 30).unwrap();
        let mut f = std::fs::File::open(&p).unwrap();
        f.seek(SeekFrom::Start(3)).unwrap();
        let (start, stop) = super::last_data_region(&f, 8 << 30)
            .expect("ext4 and tmpfs say")
            .expect("data");
        assert!(
            start <= 5000 << 20 && start > 4999 << 20,
            "the region's start: {start}"
        );
        assert!(stop > 5000 << 20 && stop < 8 << 30, "{stop}");
        assert_eq!(
            super::last_data_region(&f, 8).unwrap().map(|r| r.0),
            Some(0)
        );
        assert_eq!(super::last_data_region(&f, 0).unwrap(), None);
        let mut rest = String::new();
        Read::by_ref(&mut f)
            .take(5)
            .read_to_string(&mut rest)
            .unwrap();
        assert_eq!(rest, "ords\n", "the offset was kept");
    }
}
