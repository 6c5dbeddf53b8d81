//! relay: the floor of one proxy hop. Spawns `argv[1..]` and copies bytes stdin -> child stdin and
//! child stdout -> stdout on two threads, with no parsing and no buffering beyond one read. Child
//! stderr is inherited. Exits when the child's stdout closes (after closing its stdin on our EOF).
//!
//! With `AUDIT_RELAY_LOG=<file>` it is the "audit-relay" variant: the floor of a proxy that writes
//! every message to a log before passing it on (what `cargo mcp-dev run` must do at least: a
//! call's intent record is on file before the call is forwarded). Lines are framed, and each is
//! appended to the file with one `write` before it is forwarded; no parsing, hashing or sealing,
//! so `run` minus this variant is the proxy's own work, not the log write.
//!
//! With `AUDIT_RELAY_MMAP=1` as well it is "mmap-relay": each line is copied into the log through
//! a shared memory map (space reserved up front with `posix_fallocate`) instead of a `write`: a
//! log that survives a crash of the process (the pages are the kernel's) with no system call
//! and no inode update per line.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A line may be split across reads; each read is forwarded as is, like any byte proxy.
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

/// Where a logged line goes: appended with `write`, or copied into a shared map.
enum Log {
    Write(File),
    Map {
        base: *mut u8,
        len: usize,
        at: AtomicUsize,
        _file: File,
    },
}

// SAFETY: the map is only written through disjoint ranges handed out by `at`.
unsafe impl Sync for Log {}
unsafe impl Send for Log {}

impl Log {
    fn append(&self, line: &[u8]) -> bool {
        match self {
            Log::Write(f) => {
                let mut f: &File = f;
                f.write_all(line).is_ok()
            }
            Log::Map { base, len, at, .. } => {
                let start = at.fetch_add(line.len(), Ordering::Relaxed);
                if start + line.len() > *len {
                    return false;
                }
                // SAFETY: in bounds, and no other thread writes this range.
                unsafe {
                    std::ptr::copy_nonoverlapping(line.as_ptr(), base.add(start), line.len())
                };
                true
            }
        }
    }
}

fn pump_logged(from: impl Read, mut to: impl Write, log: Arc<Log>) {
    let mut reader = BufReader::with_capacity(64 * 1024, from);
    let mut line = Vec::with_capacity(64 * 1024);
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !log.append(&line) {
            return;
        }
        if to.write_all(&line).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let program = args.next().expect("usage: relay PROGRAM [ARGS...]");
    let log = std::env::var_os("AUDIT_RELAY_LOG").map(|path| {
        if std::env::var_os("AUDIT_RELAY_MMAP").is_some() {
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(path)
                .expect("open AUDIT_RELAY_LOG");
            let len: usize = 256 << 20;
            use std::os::fd::AsRawFd;
            // SAFETY: plain calls on a descriptor we own; the map outlives every pump.
            let base = unsafe {
                assert_eq!(
                    libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t),
                    0
                );
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                p.cast::<u8>()
            };
            Arc::new(Log::Map {
                base,
                len,
                at: AtomicUsize::new(0),
                _file: file,
            })
        } else {
            Arc::new(Log::Write(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("open AUDIT_RELAY_LOG"),
            ))
        }
    });
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let child_in = child.stdin.take().expect("piped");
    let child_out = child.stdout.take().expect("piped");
    // Dropping child_in when our stdin reaches EOF closes the child's stdin.
    match log {
        Some(log) => {
            let to_child = log.clone();
            std::thread::spawn(move || pump_logged(std::io::stdin().lock(), child_in, to_child));
            pump_logged(child_out, std::io::stdout().lock(), log);
        }
        None => {
            std::thread::spawn(move || pump(std::io::stdin().lock(), child_in));
            pump(child_out, std::io::stdout().lock());
        }
    }
    let code = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
    std::process::exit(code);
}
