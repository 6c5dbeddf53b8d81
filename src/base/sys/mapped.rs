//! The platform seam for writing a file through memory: space reserved on disk past a file's
//! data and mapped shared and writable, so that the audit writer appends a record with a copy
//! instead of a `write` system call (issue 15: no system call and no inode update per record
//! on a call's way to the server). Linux only; elsewhere [`MappedRegion::reserve`] reports
//! `Unsupported` and the caller writes as before.
//!
//! Owns the crate's only `unsafe` code (the map and its copies). Knows nothing of records.
//!
//! What a copy survives: the mapped pages are the file's pages in the kernel's page cache, so a
//! record copied in is in the file for every other process at once and survives a crash of this
//! one (`kill -9`, panic), exactly like the bytes of a finished `write`; `fdatasync` on the file
//! puts them on disk.
//!
//! The file cut shorter than the map by someone else (`: > log`, `truncate`, a log rotator's
//! `copytruncate`) makes the next copy past the cut fault with `SIGBUS`, which would end the
//! process without a word. A guard ([`cut_guard`]) catches the faults that land in a region it
//! mapped: it puts a private zero page where the file's page was (the copy completes, into
//! memory that is not the file) and marks the region [`MappedRegion::cut_short`]; the writer
//! checks that after every copy and fails closed with a message. A fault anywhere else goes on
//! to the handler that was there before (Rust's own, which ends the process), as if the guard
//! were not installed; a `SIGBUS` that was sent rather than raised by a fault is ignored. A cut
//! that no store faults on (inside the page being written) is for the writer to find: see
//! [`MappedRegion::byte_before`] and `audit::sink`'s length checks.
#![allow(unsafe_code)]

use std::fs::File;

/// Part of a file, reserved on disk (allocated, so that no copy into it can fail for want of
/// space) and mapped shared and writable. Unmapped on drop; the reserved bytes stay in the file
/// (as NUL bytes) until the caller cuts the file back to its data.
#[derive(Debug)]
pub struct MappedRegion {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    offset: u64,
    /// File offset up to which [`MappedRegion::prepare`] made the pages writable.
    prepared_to: u64,
    /// The region's slot in [`cut_guard`].
    #[cfg(any(target_os = "linux", target_os = "android"))]
    guard: cut_guard::Slot,
}

// SAFETY: the region is plain memory owned by this value; it is only written through `&mut self`.
unsafe impl Send for MappedRegion {}
unsafe impl Sync for MappedRegion {}

/// The size of a memory page: regions start at a multiple of it.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

impl MappedRegion {
    /// Reserves `offset..offset + len` of `file` (growing the file to its end if it is shorter)
    /// and maps it. `offset` must be a multiple of [`page_size`], `file` open for reading and
    /// writing. Fails with the kernel's error where the file system cannot reserve space (not
    /// supported, no space, over `RLIMIT_FSIZE`), and with `Unsupported` off Linux.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn reserve(file: &File, offset: u64, len: usize) -> std::io::Result<MappedRegion> {
        use rustix::mm::{MapFlags, ProtFlags};
        if len == 0 || !offset.is_multiple_of(page_size()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a mapped region starts at a page boundary and is not empty",
            ));
        }
        rustix::fs::fallocate(
            file,
            rustix::fs::FallocateFlags::empty(),
            offset,
            len as u64,
        )?;
        // SAFETY: a new shared mapping at an address the kernel chooses; nothing else refers
        // to that memory. The file may change under it (other processes): this type never
        // forms a Rust reference to the mapped bytes, it only copies into them.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                file,
                offset,
            )?
        };
        let Some(ptr) = std::ptr::NonNull::new(ptr.cast::<u8>()) else {
            return Err(std::io::Error::other("mmap returned a null address"));
        };
        let Some(guard) = cut_guard::watch(ptr.as_ptr() as usize, len) else {
            // More regions than the guard watches (never one writer's case): not mapped, so
            // that a cut file cannot end the process; the caller writes instead.
            // SAFETY: the mapping just made, unmapped once.
            let _ = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len) };
            return Err(std::io::Error::other(
                "no free slot in the map's fault guard",
            ));
        };
        Ok(MappedRegion {
            ptr,
            len,
            offset,
            prepared_to: offset,
            guard,
        })
    }

    /// Not on this platform: the caller writes instead.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn reserve(_file: &File, _offset: u64, _len: usize) -> std::io::Result<MappedRegion> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    /// Whether a copy into the region found the file cut shorter than the map (someone else
    /// truncated it): the bytes of that copy, and of every later one past the cut, are not in
    /// the file. Checked by the writer after every copy.
    pub fn cut_short(&self) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            self.guard.faulted()
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            false
        }
    }

    /// The byte just before file offset `at`, read through the map (`None` when it is not in
    /// the region). A file cut inside a page has the rest of that page zeroed by the kernel, so
    /// the writer reads the last byte of its records (a newline) before each copy: a cut below
    /// it in the page being written is found here, where no store would fault. A read in a
    /// page wholly past the file's end faults like a store and is caught the same way
    /// ([`MappedRegion::cut_short`]).
    pub fn byte_before(&self, at: u64) -> Option<u8> {
        let at = at.checked_sub(self.offset)?.checked_sub(1)?;
        let at = usize::try_from(at).ok().filter(|&i| i < self.len)?;
        // SAFETY: in bounds (checked above); a volatile read of the shared mapping, which
        // another process may change (no reference to the mapped bytes is ever formed).
        Some(unsafe { self.ptr.as_ptr().add(at).read_volatile() })
    }

    /// The file offset just past the region.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }

    /// The pages from `at` through `at + ahead` (within the region) to make writable now,
    /// unless at least half of that is prepared already: a page's first store would otherwise
    /// fault (the file system readies the page) on the path of the call whose record crosses
    /// into it, about once per four calls. Prepared in windows, not a whole reservation at once:
    /// a page written back before its records arrive is made read-only again, and a burst of
    /// thousands of page preparations in one go measured slower than the faults it saves.
    /// The caller applies the [`PreparePages`] when it holds no lock a call waits for.
    pub fn prepare(&mut self, at: u64, ahead: u64) -> Option<PreparePages> {
        let to = at.saturating_add(ahead).min(self.end());
        if self.prepared_to >= at.saturating_add(ahead / 2).min(to) {
            return None;
        }
        let from = self.prepared_to.max(at) / page_size() * page_size();
        let to = to.next_multiple_of(page_size()).min(self.end());
        let start = from.checked_sub(self.offset)?;
        let len = usize::try_from(to.checked_sub(from).filter(|&n| n > 0)?).ok()?;
        // Not asked for again, whether or not the advice is taken.
        self.prepared_to = from + len as u64;
        Some(PreparePages {
            addr: self.ptr.as_ptr() as usize + start as usize,
            len,
        })
    }

    /// The file offset up to which pages were prepared ([`MappedRegion::prepare`]).
    pub fn prepared_to(&self) -> u64 {
        self.prepared_to
    }

    /// Copies `bytes` into the file at offset `at`, strictly in order: a process killed in the
    /// middle leaves a prefix of `bytes` followed by what was there (a `write` cut short leaves
    /// a prefix too, which is what torn-tail recovery relies on; a library `memcpy` may store
    /// the first bytes of a large copy last). Panics unless `at..at + bytes.len()` lies inside
    /// the region.
    pub fn copy_at(&mut self, at: u64, bytes: &[u8]) {
        let start = at
            .checked_sub(self.offset)
            .expect("copy before the mapped region") as usize;
        assert!(
            start + bytes.len() <= self.len,
            "copy past the mapped region"
        );
        // SAFETY: every store is in bounds (checked above) and aligned for its type; `bytes` is
        // not in the mapping (no slice of the mapping is ever made); `&mut self` excludes
        // another copy from this process. Volatile stores are emitted one by one, in program
        // order (never merged into a `memcpy` call).
        unsafe {
            let dst = self.ptr.as_ptr().add(start);
            let mut i = 0;
            while i < bytes.len() && !(dst as usize + i).is_multiple_of(8) {
                dst.add(i).write_volatile(bytes[i]);
                i += 1;
            }
            while let Some(word) = bytes.get(i..i + 8) {
                let word = u64::from_ne_bytes(word.try_into().expect("8 bytes"));
                dst.add(i).cast::<u64>().write_volatile(word);
                i += 8;
            }
            while i < bytes.len() {
                dst.add(i).write_volatile(bytes[i]);
                i += 1;
            }
        }
    }
}

/// Pages of a [`MappedRegion`] to make writable ([`MappedRegion::prepare`]).
#[derive(Debug)]
#[must_use = "nothing is prepared until `apply`"]
pub struct PreparePages {
    addr: usize,
    len: usize,
}

impl PreparePages {
    /// Asks the kernel to make the pages writable now (`MADV_POPULATE_WRITE`). Best effort: a
    /// kernel before 5.14 or another system does nothing, and the stores fault as before.
    /// Returns whether the pages were prepared.
    pub fn apply(self) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            // SAFETY: this advice never changes memory contents: it faults pages in as a write
            // would, without writing. The region may have been unmapped since `prepare` (a new
            // reservation): then the kernel refuses the range (`ENOMEM`); were the addresses
            // reused by another mapping, its pages would only be faulted in.
            unsafe {
                rustix::mm::madvise(
                    self.addr as *mut std::ffi::c_void,
                    self.len,
                    rustix::mm::Advice::LinuxPopulateWrite,
                )
            }
            .is_ok()
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = (self.addr, self.len); // no such advice here
            false
        }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // Unwatched first: after the unmap the addresses may be reused by other mappings,
        // whose faults are not the guard's.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        self.guard.release();
        // SAFETY: the mapping made in `reserve`, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The `SIGBUS` guard of mapped regions (see the module doc). A fixed table of slots, so that
/// the signal handler reads only atomics and calls only `mmap` (async-signal-safe on Linux),
/// never allocates or locks.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) mod cut_guard {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Regions watched at once: one per audit writer (tests open many at a time).
    const SLOTS: usize = 256;

    struct Watched {
        /// Region start address; 0: the slot is free.
        start: AtomicUsize,
        /// Region end address; 0 while the slot is being claimed or released.
        end: AtomicUsize,
        faulted: AtomicBool,
    }

    static WATCHED: [Watched; SLOTS] = [const {
        Watched {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            faulted: AtomicBool::new(false),
        }
    }; SLOTS];
    /// The `SIGBUS` disposition before the guard's (called for faults that are not ours).
    static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
    static PAGE: AtomicUsize = AtomicUsize::new(0);

    /// A watched region (its index in the table).
    #[derive(Debug)]
    pub struct Slot(usize);

    impl Slot {
        pub fn faulted(&self) -> bool {
            WATCHED[self.0].faulted.load(Ordering::Acquire)
        }

        pub fn release(&self) {
            let w = &WATCHED[self.0];
            w.end.store(0, Ordering::Release);
            w.faulted.store(false, Ordering::Release);
            w.start.store(0, Ordering::Release);
        }
    }

    /// Watches `start..start + len` (installing the handler on first use). `None`: every
    /// slot is taken, or the handler could not be installed.
    pub fn watch(start: usize, len: usize) -> Option<Slot> {
        if !install() {
            return None;
        }
        for (i, w) in WATCHED.iter().enumerate() {
            if w.start
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                w.faulted.store(false, Ordering::Release);
                w.end.store(start + len, Ordering::Release);
                return Some(Slot(i));
            }
        }
        None
    }

    fn install() -> bool {
        static INSTALLED: OnceLock<bool> = OnceLock::new();
        *INSTALLED.get_or_init(|| {
            PAGE.store(super::page_size() as usize, Ordering::Release);
            // SAFETY: plain `sigaction` calls with initialised structures; the handler only
            // reads atomics and a value set before it is installed, and calls `mmap`.
            unsafe {
                let mut previous: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                    return false;
                }
                let _ = PREVIOUS.set(previous);
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
            }
        })
    }

    extern "C" fn on_sigbus(
        sig: libc::c_int,
        info: *mut libc::siginfo_t,
        context: *mut libc::c_void,
    ) {
        // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
        let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
        if code <= 0 {
            // Sent (`kill`, `sigqueue`, `tgkill`), not a fault: nothing to repair, and its
            // address is whatever the sender wrote (a forged one must not unmap a live page
            // of the log). Not passed on either: Rust's handler would reset the disposition
            // to the default and leave the log unguarded. Ignored.
            return;
        }
        let page = PAGE.load(Ordering::Acquire);
        for w in &WATCHED {
            let start = w.start.load(Ordering::Acquire);
            let end = w.end.load(Ordering::Acquire);
            // Read again: a slot released and claimed between the two loads is skipped.
            if start == 0 || addr < start || addr >= end || w.start.load(Ordering::Acquire) != start
            {
                continue;
            }
            // SAFETY: the page is inside a region this process mapped and still watches (a
            // region is unwatched before it is unmapped); a private zero page replaces the
            // file's, so the faulting store completes into memory that is not the file.
            let replaced = unsafe {
                libc::mmap(
                    (addr & !(page - 1)) as *mut libc::c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if replaced != libc::MAP_FAILED {
                w.faulted.store(true, Ordering::Release);
                return;
            }
        }
        // Not ours: what the previous disposition does.
        match PREVIOUS.get() {
            Some(previous)
                if previous.sa_sigaction != libc::SIG_DFL
                    && previous.sa_sigaction != libc::SIG_IGN =>
            {
                // SAFETY: the handler that was installed, called as it was registered.
                unsafe {
                    if previous.sa_flags & libc::SA_SIGINFO != 0 {
                        let handler: extern "C" fn(
                            libc::c_int,
                            *mut libc::siginfo_t,
                            *mut libc::c_void,
                        ) = std::mem::transmute(previous.sa_sigaction);
                        handler(sig, info, context);
                    } else {
                        let handler: extern "C" fn(libc::c_int) =
                            std::mem::transmute(previous.sa_sigaction);
                        handler(sig);
                    }
                }
            }
            _ => {
                // The default action: restored, then the fault repeats and ends the process.
                // SAFETY: a plain `sigaction` call.
                unsafe {
                    let mut default: libc::sigaction = std::mem::zeroed();
                    default.sa_sigaction = libc::SIG_DFL;
                    libc::sigemptyset(&mut default.sa_mask);
                    libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
                }
            }
        }
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn copies_land_in_the_file_and_the_reservation_reads_as_nul() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        std::fs::write(&path, b"head\n").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        let page = page_size();
        let mut region = MappedRegion::reserve(&file, 0, page as usize).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), page);
        region.copy_at(5, b"rec\n");
        let mut text = Vec::new();
        std::fs::File::open(&path)
            .unwrap()
            .read_to_end(&mut text)
            .unwrap();
        assert_eq!(&text[..9], b"head\nrec\n");
        assert!(text[9..].iter().all(|&b| b == 0));
        drop(region);
        // What was copied stays after the unmap.
        assert_eq!(&std::fs::read(&path).unwrap()[..9], b"head\nrec\n");
    }

    /// Cuts the file at `path` to `len` bytes, as another process would.
    fn cut_file(path: &std::path::Path, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    /// An empty file opened as the audit writer opens its log (read + append).
    fn new_file() -> (tempfile::TempDir, std::path::PathBuf, File) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .unwrap();
        (tmp, path, file)
    }

    #[test]
    fn copies_of_any_length_at_any_alignment_land_whole() {
        let (_tmp, path, file) = new_file();
        let mut region = MappedRegion::reserve(&file, 0, 8192).unwrap();
        let mut expect = vec![0u8; 8192];
        let mut at = 0usize;
        for len in 0..40usize {
            let bytes: Vec<u8> = (0..len).map(|i| (at + i) as u8 | 1).collect();
            region.copy_at(at as u64, &bytes);
            expect[at..at + len].copy_from_slice(&bytes);
            at += len + 1;
        }
        drop(region);
        assert_eq!(std::fs::read(&path).unwrap(), expect);
    }

    /// Minor page faults this thread has taken (`/proc/thread-self/stat`, field 10), read
    /// without allocating: reading it with `read_to_string` grew and trimmed the heap between
    /// two readings often enough to count 8–13 faults of its own (session 19).
    struct MinorFaults(File);

    impl MinorFaults {
        fn of_this_thread() -> MinorFaults {
            let counter = MinorFaults(File::open("/proc/thread-self/stat").unwrap());
            counter.now(); // the stack buffer's page, touched before any measurement
            counter
        }

        fn now(&self) -> u64 {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; 1024];
            let n = self.0.read_at(&mut buf, 0).unwrap();
            let stat = std::str::from_utf8(&buf[..n]).unwrap();
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            rest.split(' ').nth(7).unwrap().parse().unwrap()
        }
    }

    /// Prepared pages take their first store without a fault, and windows are prepared only
    /// when half of the one asked for is not ready yet, never past the region.
    #[test]
    fn prepared_pages_take_copies_without_faulting() {
        let (_tmp, path, file) = new_file();
        let page = page_size();
        let mut region = MappedRegion::reserve(&file, 0, 32 * page as usize).unwrap();
        let prepared = region.prepare(0, 16 * page).unwrap().apply();
        assert_eq!(region.prepared_to, 16 * page);
        assert!(
            region.prepare(3 * page, 16 * page).is_none(),
            "11 of 16 pages ready"
        );
        // Each page's first store: the 16 prepared pages, then the 16 others.
        let faults = MinorFaults::of_this_thread();
        let touch = |region: &mut MappedRegion, pages: std::ops::Range<u64>| {
            let before = faults.now();
            for p in pages {
                region.copy_at(p * page + 1, b"x");
            }
            faults.now() - before
        };
        let in_prepared = touch(&mut region, 0..16);
        let in_others = touch(&mut region, 16..32);
        assert!(in_others >= 12, "{in_others} faults in 16 unprepared pages");
        if prepared {
            assert!(
                in_prepared <= 2,
                "{in_prepared} faults in 16 prepared pages"
            );
        }
        // The window moves on, and stops at the region's end.
        let last = region.prepare(28 * page + 5, 16 * page).unwrap();
        assert_eq!((last.len as u64, region.prepared_to), (4 * page, 32 * page));
        assert_eq!(last.apply(), prepared);
        assert!(region.prepare(30 * page, 16 * page).is_none());
        assert!(
            region.prepare(40 * page, 16 * page).is_none(),
            "past the region"
        );
        drop(region);
        let text = std::fs::read(&path).unwrap();
        assert_eq!(text.iter().filter(|&&b| b == b'x').count(), 32);
        assert_eq!(
            text.iter().filter(|&&b| b != 0).count(),
            32,
            "the rest reads as NUL"
        );
    }

    /// The file cut under the map: the copy past the cut completes (into memory that is not
    /// the file) and the region says so, instead of `SIGBUS` ending the process.
    #[test]
    fn a_copy_past_a_cut_is_reported_not_fatal() {
        let (_tmp, path, file) = new_file();
        let page = page_size();
        let mut region = MappedRegion::reserve(&file, 0, 4 * page as usize).unwrap();
        region.copy_at(0, b"kept\n");
        assert!(!region.cut_short());
        cut_file(&path, page);
        region.copy_at(1, b"still in the file");
        assert!(!region.cut_short(), "a copy before the cut lands");
        region.copy_at(2 * page + 7, b"past the cut");
        assert!(region.cut_short());
        region.copy_at(3 * page, b"and again");
        drop(region);
        let text = std::fs::read(&path).unwrap();
        assert_eq!(text.len() as u64, page, "the file is not grown back");
        assert_eq!(&text[..18], b"kstill in the file");
        // A region mapped later starts unmarked (slots are reused clean).
        let (_tmp2, _path2, file2) = new_file();
        let region2 = MappedRegion::reserve(&file2, 0, page as usize).unwrap();
        assert!(!region2.cut_short());
    }

    /// A `SIGBUS` outside the guard's regions still ends the process, as it would without the
    /// guard (run in a child process: this test binary, asked to run the helper below).
    #[test]
    fn a_fault_outside_watched_regions_still_ends_the_process() {
        use std::os::unix::process::ExitStatusExt;
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "base::sys::mapped::tests::unwatched_fault_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CARGO_MCP_DEV_UNWATCHED_FAULT", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}");
    }

    /// A `SIGBUS` sent rather than caused by a fault (`kill -BUS`, or `sigqueue` with a
    /// forged address inside a watched region) changes nothing: the process goes on, the
    /// page stays the file's, and the guard still catches a real cut afterwards (red-team,
    /// session 19: passed on to Rust's handler, a sent one reset the disposition and the next
    /// cut ended the process). In a child process, as that failure would end this one.
    #[test]
    fn a_sent_sigbus_is_ignored_and_the_guard_stays() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "base::sys::mapped::tests::sent_sigbus_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CARGO_MCP_DEV_SENT_SIGBUS", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{:?}: {text}", out.status);
        assert!(text.contains("sent-sigbus-child: done"), "{text}");
    }

    #[test]
    fn sent_sigbus_child() {
        if std::env::var_os("CARGO_MCP_DEV_SENT_SIGBUS").is_none() {
            return;
        }
        let (_tmp, path, file) = new_file();
        let page = page_size();
        let mut region = MappedRegion::reserve(&file, 0, 4 * page as usize).unwrap();
        region.copy_at(0, b"first\n");
        // SAFETY: signals to this process and thread; the handler ignores sent ones.
        unsafe {
            libc::raise(libc::SIGBUS);
            // A queued SIGBUS naming an address inside the region (siginfo laid out by hand:
            // signo, errno, code, then the address at byte 16).
            let mut info = [0u64; 16];
            let head = info.as_mut_ptr().cast::<i32>();
            *head = libc::SIGBUS;
            *head.add(2) = libc::SI_QUEUE;
            info[2] = region.ptr.as_ptr() as u64 + 8;
            let r = libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                libc::getpid(),
                libc::gettid(),
                libc::SIGBUS,
                info.as_ptr(),
            );
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        }
        assert!(!region.cut_short(), "a sent signal is not a cut");
        region.copy_at(6, b"second\n");
        assert_eq!(&std::fs::read(&path).unwrap()[..13], b"first\nsecond\n");
        cut_file(&path, 0);
        region.copy_at(2 * page, b"past the cut");
        assert!(region.cut_short(), "still guarded");
        eprintln!("sent-sigbus-child: done");
    }

    /// The child of the test above (does nothing unless asked): installs the guard with a
    /// watched region, then faults in a mapping the guard does not watch.
    #[test]
    fn unwatched_fault_child() {
        if std::env::var_os("CARGO_MCP_DEV_UNWATCHED_FAULT").is_none() {
            return;
        }
        let (_tmp, _path, file) = new_file();
        let _watched = MappedRegion::reserve(&file, 0, page_size() as usize).unwrap();
        let (_tmp2, path2, file2) = new_file();
        file2.set_len(page_size()).unwrap();
        // SAFETY: a test mapping; the store below faults on purpose (the file is cut first).
        unsafe {
            let ptr = rustix::mm::mmap(
                std::ptr::null_mut(),
                page_size() as usize,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file2,
                0,
            )
            .unwrap();
            cut_file(&path2, 0);
            ptr.cast::<u8>().write_volatile(1);
        }
        unreachable!("the store past the cut ends the process");
    }

    #[test]
    fn a_region_must_start_on_a_page_and_copies_stay_inside() {
        let (_tmp, _path, file) = new_file();
        let err = MappedRegion::reserve(&file, 1, 4096).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        let mut region = MappedRegion::reserve(&file, 0, 4096).unwrap();
        let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            region.copy_at(4090, b"1234567")
        }));
        assert!(past.is_err());
    }
}
