//! Outlets: where lines leave the proxy (the child's stdin, our stdout to the host).
//!
//! A send first tries a non-blocking write from the calling thread, so the common case costs no
//! thread hand-off (as in a plain byte relay); whatever the pipe cannot take right now is queued,
//! in order, for the outlet's own writer thread, which waits for the pipe to drain. The session
//! therefore never blocks on a peer that stopped reading, and lines are never interleaved or
//! reordered. Owns file descriptors and bytes only.
//!
//! Bounded (issue 12, unbounded memory): the queue holds at most [`Outlet::limit`] bytes of lines
//! that may be dropped (notifications) and four times that of lines that must not be (requests,
//! responses). A line that does not fit is refused with [`Full`] and counted
//! ([`Outlet::dropped`]); the caller decides what a refusal means (drop a notification and say
//! so; answer a request with an error instead of forwarding it).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{FileType, OFlags, fcntl_getfl, fcntl_setfl, fstat};
use rustix::io::Errno;

struct State {
    /// Dropped (closing the pipe) once the queue is drained after `close`.
    fd: Option<Arc<OwnedFd>>,
    queue: VecDeque<Vec<u8>>,
    /// Bytes of the queue's front already written.
    offset: usize,
    /// The writer thread holds a buffer it is writing.
    busy: bool,
    close: bool,
    broken: bool,
    /// Bytes waiting in `queue`.
    queued_bytes: usize,
    /// Lines refused because the queue was full.
    dropped: u64,
    /// The pipe was widened for a long line.
    widened: bool,
    /// System calls that wrote lines (`write`, `writev`), from any thread.
    write_calls: u64,
}

impl State {
    /// A line longer than a pipe holds by default: the pipe is widened, once, so this line
    /// and the ones like it (a large `tools/list` answer, listed again and again) go out in
    /// one write. Only outlets that carried such a line take the larger share of the user's
    /// pipe quota.
    fn widen_for(&mut self, len: usize) {
        if len >= crate::wire::proxy::framing::LONG_LINE && !self.widened {
            self.widened = true;
            if let Some(fd) = &self.fd {
                crate::base::sys::unix::widen_pipe(&**fd);
            }
        }
    }

    /// Drops the first `n` bytes of the queue (written): whole lines, then a partial front.
    /// Lines with nothing left to write (empty ones) go too, even when `n` is 0: a `writev`
    /// of only those writes nothing, and `pump` would offer them again forever.
    fn consume(&mut self, mut n: usize) {
        while let Some(front) = self.queue.front() {
            let left = front.len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            let len = front.len();
            self.queue.pop_front();
            self.offset = 0;
            self.queued_bytes = self.queued_bytes.saturating_sub(len);
        }
    }
}

/// Lines written by one `writev` at most (well under every system's `IOV_MAX`).
const WRITEV_LINES: usize = 64;

/// Default queue bound per outlet: 16 MiB of droppable lines (notifications), 64 MiB of others
/// (a line of up to 16 MiB, the framing limit, always fits an empty queue).
pub const DEFAULT_LIMIT: usize = 16 << 20;

/// A line was refused: the peer is not reading and the queue is at its bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// Lines refused so far by this outlet (this one included).
    pub dropped: u64,
    /// The refused line, handed back (so a sender need not copy every line it sends).
    pub line: Vec<u8>,
}

struct Inner {
    nonblocking: bool,
    limit: usize,
    state: Mutex<State>,
    cond: Condvar,
}

/// A line sink with a writer thread behind it. Cheap to clone.
#[derive(Clone)]
pub struct Outlet {
    inner: Arc<Inner>,
}

/// Makes `fd` non-blocking when it is a pipe or socket (never a terminal or file, whose open
/// file description may be shared with the user's shell). Returns whether it is.
fn make_nonblocking(fd: &OwnedFd) -> bool {
    let Ok(st) = fstat(fd) else { return false };
    let kind = FileType::from_raw_mode(st.st_mode);
    if !matches!(kind, FileType::Fifo | FileType::Socket) {
        return false;
    }
    match fcntl_getfl(fd) {
        Ok(flags) => fcntl_setfl(fd, flags | OFlags::NONBLOCK).is_ok(),
        Err(_) => false,
    }
}

impl Outlet {
    /// Wraps `fd`; `on_closed` runs on the writer thread after the last byte was written and the
    /// descriptor dropped (e.g. to close fd 1 itself).
    pub fn new(name: &str, fd: OwnedFd, on_closed: impl FnOnce() + Send + 'static) -> Outlet {
        Self::with_limit(name, fd, DEFAULT_LIMIT, on_closed)
    }

    /// [`Outlet::new`] with a queue bound of `limit` bytes for droppable lines (4× for others).
    pub fn with_limit(
        name: &str,
        fd: OwnedFd,
        limit: usize,
        on_closed: impl FnOnce() + Send + 'static,
    ) -> Outlet {
        let nonblocking = make_nonblocking(&fd);
        let inner = Arc::new(Inner {
            nonblocking,
            limit,
            state: Mutex::new(State {
                fd: Some(Arc::new(fd)),
                queue: VecDeque::new(),
                offset: 0,
                busy: false,
                close: false,
                broken: false,
                queued_bytes: 0,
                dropped: 0,
                widened: false,
                write_calls: 0,
            }),
            cond: Condvar::new(),
        });
        let worker = inner.clone();
        let _ = std::thread::Builder::new()
            .name(format!("out-{name}"))
            .spawn(move || {
                writer_loop(&worker);
                drop(worker);
                on_closed();
            });
        Outlet { inner }
    }

    /// Queues one line that must not be dropped (a request or a response); writes it at once
    /// when nothing is waiting ahead of it. Refused only past 4× the bound.
    pub fn send(&self, bytes: Vec<u8>) -> Result<(), Full> {
        self.offer(bytes, self.inner.limit.saturating_mul(4))
    }

    /// Queues one line that may be dropped (a notification): refused once the bound is reached.
    pub fn send_droppable(&self, bytes: Vec<u8>) -> Result<(), Full> {
        self.offer(bytes, self.inner.limit)
    }

    /// The bound for droppable lines, in bytes.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Lines refused so far.
    pub fn dropped(&self) -> u64 {
        self.inner.state.lock().map(|s| s.dropped).unwrap_or(0)
    }

    /// Bytes waiting.
    pub fn queued_bytes(&self) -> usize {
        self.inner.state.lock().map(|s| s.queued_bytes).unwrap_or(0)
    }

    /// As [`Outlet::send`] (or [`Outlet::send_droppable`]) but without writing: the line is
    /// queued, in order, for the next [`Outlet::pump`]. A session queues under its lock and
    /// pumps after releasing it, so the write (which wakes the peer, who may answer at once)
    /// never happens while the peer's answer would wait for that lock.
    pub fn queue(&self, bytes: Vec<u8>, droppable: bool) -> Result<(), Full> {
        let bound = if droppable {
            self.inner.limit
        } else {
            self.inner.limit.saturating_mul(4)
        };
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.broken || st.close {
            return Ok(());
        }
        // Lines the writer thread holds count as waiting too (they are in `queued_bytes`).
        let waiting = !st.queue.is_empty() || st.busy;
        if waiting && st.queued_bytes.saturating_add(bytes.len()) > bound {
            st.dropped += 1;
            return Err(Full {
                dropped: st.dropped,
                line: bytes,
            });
        }
        st.widen_for(bytes.len());
        st.queued_bytes += bytes.len();
        st.queue.push_back(bytes);
        Ok(())
    }

    /// Writes what is queued from the calling thread, as far as the pipe takes it without
    /// blocking; the rest goes to the writer thread.
    pub fn pump(&self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.queue.is_empty() {
            return;
        }
        if self.inner.nonblocking
            && !st.busy
            && !st.broken
            && let Some(fd) = st.fd.clone()
        {
            // Everything queued in one `writev` (a batch of 32 answers is one system call, not
            // 32), as far as the pipe takes it.
            while !st.queue.is_empty() {
                let written = writev_lines(&fd, st.queue.iter(), st.offset);
                st.write_calls += 1;
                match written {
                    Ok((n, offered)) => {
                        st.consume(n);
                        if n < offered {
                            break; // the pipe is full: the writer thread waits for it
                        }
                    }
                    Err(Errno::AGAIN) => break,
                    Err(_) => {
                        st.broken = true;
                        st.queue.clear();
                        st.queued_bytes = 0;
                        st.offset = 0;
                        break;
                    }
                }
            }
        }
        if !st.queue.is_empty() || st.broken {
            self.inner.cond.notify_one();
        }
    }

    /// Whether `other` is this outlet (clones share one).
    pub fn same_as(&self, other: &Outlet) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    fn offer(&self, bytes: Vec<u8>, bound: usize) -> Result<(), Full> {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.broken || st.close {
            return Ok(());
        }
        let waiting = !st.queue.is_empty() || st.busy;
        if waiting && st.queued_bytes.saturating_add(bytes.len()) > bound {
            st.dropped += 1;
            return Err(Full {
                dropped: st.dropped,
                line: bytes,
            });
        }
        st.widen_for(bytes.len());
        if self.inner.nonblocking
            && st.queue.is_empty()
            && !st.busy
            && let Some(fd) = st.fd.clone()
        {
            let written = write_some(&fd, &bytes);
            st.write_calls += 1;
            match written {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    st.queued_bytes += bytes.len();
                    st.queue.push_back(bytes);
                    st.offset = n;
                }
                Err(Errno::AGAIN) => {
                    st.queued_bytes += bytes.len();
                    st.queue.push_back(bytes);
                }
                Err(_) => {
                    st.broken = true;
                    return Ok(());
                }
            }
        } else {
            st.queued_bytes += bytes.len();
            st.queue.push_back(bytes);
        }
        self.inner.cond.notify_one();
        Ok(())
    }

    /// Writes what is queued, then closes (the peer sees EOF).
    pub fn close(&self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        st.close = true;
        self.inner.cond.notify_one();
    }

    /// System calls that wrote this outlet's lines so far (tests and benchmarks: lines that
    /// wait together go out together).
    pub fn write_calls(&self) -> u64 {
        self.inner.state.lock().map(|s| s.write_calls).unwrap_or(0)
    }

    /// Number of lines waiting (for tests and status).
    pub fn backlog(&self) -> usize {
        self.inner.state.lock().map(|s| s.queue.len()).unwrap_or(0)
    }
}

fn write_some(fd: &OwnedFd, bytes: &[u8]) -> Result<usize, Errno> {
    loop {
        match rustix::io::write(fd, bytes) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// One `writev` of the first [`WRITEV_LINES`] of `lines` (the first from byte `offset`),
/// retried on `EINTR`: the bytes written and the bytes offered.
fn writev_lines<'a>(
    fd: &OwnedFd,
    lines: impl Iterator<Item = &'a Vec<u8>>,
    offset: usize,
) -> Result<(usize, usize), Errno> {
    let slices: Vec<std::io::IoSlice<'_>> = lines
        .take(WRITEV_LINES)
        .enumerate()
        .map(|(i, line)| std::io::IoSlice::new(if i == 0 { &line[offset..] } else { line }))
        .collect();
    let offered = slices.iter().map(|s| s.len()).sum();
    loop {
        match rustix::io::writev(fd, &slices) {
            Err(Errno::INTR) => continue,
            Ok(n) => return Ok((n, offered)),
            Err(e) => return Err(e),
        }
    }
}

/// The writer thread: waits for lines the pipe did not take at once, then writes everything
/// waiting (up to [`WRITEV_LINES`] lines per `writev`), blocking until the pipe takes it. A
/// peer that reads slowly (a server behind a pipelined burst) frees a little room at a time;
/// a line per system call then cost one `write` per call on the burst's path.
fn writer_loop(inner: &Inner) {
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(WRITEV_LINES);
    loop {
        let (offset, fd) = {
            let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.queue.is_empty() && !st.close && !st.broken {
                st = inner.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let Some(fd) = st.fd.clone().filter(|_| !st.broken && !st.queue.is_empty()) else {
                // Closed and drained, or the peer is gone: drop the descriptor now.
                st.fd = None;
                return;
            };
            st.busy = true;
            let offset = std::mem::take(&mut st.offset);
            let n = st.queue.len().min(WRITEV_LINES);
            batch.extend(st.queue.drain(..n));
            // Counted until written: the buffers are still held by this thread.
            (offset, fd)
        };
        let (ok, calls) = write_all_lines(&fd, &batch, offset);
        drop(fd);
        let bytes: usize = batch.iter().map(Vec::len).sum();
        batch.clear();
        let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        st.busy = false;
        st.write_calls += calls;
        st.queued_bytes = st.queued_bytes.saturating_sub(bytes);
        if !ok {
            st.broken = true;
            st.queue.clear();
            st.queued_bytes = 0;
            st.fd = None;
            return;
        }
    }
}

/// Blocking write of whole lines (the first from byte `offset`) on a possibly non-blocking
/// descriptor: whether all of it went out, and the system calls that wrote.
fn write_all_lines(fd: &OwnedFd, lines: &[Vec<u8>], mut offset: usize) -> (bool, u64) {
    let mut first = 0;
    let mut calls = 0;
    loop {
        // Past what is written, and past empty lines (a `writev` of nothing writes nothing).
        while first < lines.len() && offset >= lines[first].len() {
            first += 1;
            offset = 0;
        }
        if first == lines.len() {
            return (true, calls);
        }
        calls += 1;
        match writev_lines(fd, lines[first..].iter(), offset) {
            Ok((0, _)) => return (false, calls),
            Ok((mut n, _)) => {
                while n > 0 {
                    let left = lines[first].len() - offset;
                    if n < left {
                        offset += n;
                        break;
                    }
                    n -= left;
                    first += 1;
                    offset = 0;
                }
            }
            Err(Errno::AGAIN) => {
                let mut fds = [PollFd::new(fd, PollFlags::OUT)];
                if poll(&mut fds, None).is_err() {
                    return (false, calls);
                }
            }
            Err(_) => return (false, calls),
        }
    }
}

/// Our stdout as an owned descriptor (a duplicate of fd 1; same pipe to the host).
pub fn stdout_fd() -> std::io::Result<OwnedFd> {
    std::io::stdout().as_fd().try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn lines_arrive_in_order_even_when_the_pipe_is_full() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out = Outlet::new("test", OwnedFd::from(writer), move || {
            let _ = tx.send(());
        });
        // Far more than a pipe buffer (64 KiB) while nobody reads: must queue, not block.
        let lines: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("{i:06}:{}\n", "x".repeat(200)).into_bytes())
            .collect();
        for l in &lines {
            out.send(l.clone()).unwrap();
        }
        assert!(
            out.backlog() > 0,
            "a full pipe queues instead of blocking the sender"
        );
        out.close();
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert_eq!(got, lines.concat());
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("on_closed ran");
    }

    /// Lines that wait for a slow reader go out together: the writer thread writes what is
    /// queued with one `writev` per batch, not one `write` per line (issue 15: a pipelined
    /// burst to a server that reads slowly cost a system call per call).
    #[test]
    fn waiting_lines_go_out_in_batches_not_one_write_each() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let out = Outlet::new("batch", OwnedFd::from(writer), || {});
        // Fill the pipe while nobody reads, so that everything after waits for the writer.
        let filler = vec![b'f'; 1 << 20];
        out.send(filler.clone()).unwrap();
        let before = out.write_calls();
        let lines: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("{i:06}:{}\n", "z".repeat(100)).into_bytes())
            .collect();
        for l in &lines {
            out.send(l.clone()).unwrap();
        }
        out.close();
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert_eq!(
            got,
            [filler, lines.concat()].concat(),
            "every line, in order"
        );
        let calls = out.write_calls() - before;
        assert!(
            calls <= 2000 / 8,
            "{calls} system calls for 2000 waiting lines"
        );
    }

    /// An empty line in the queue: `pump` writes what is before it and returns (a `writev` of
    /// only empty lines writes nothing, and used to be offered again forever, under the lock).
    #[test]
    fn pump_passes_empty_lines_and_returns() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let out = Outlet::new("empty", OwnedFd::from(writer), || {});
        // Let the writer thread park first: lines queued before it starts are its to write.
        std::thread::sleep(std::time::Duration::from_millis(100));
        out.queue(b"a\n".to_vec(), false).unwrap();
        out.queue(Vec::new(), false).unwrap();
        out.queue(b"b\n".to_vec(), false).unwrap();
        out.queue(Vec::new(), false).unwrap();
        let pumping = out.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            pumping.pump();
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("pump returned");
        assert_eq!(out.backlog(), 0);
        let mut got = [0u8; 4];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"a\nb\n");
    }

    /// Lines the writer thread holds count against the bound of `queue` as they do for
    /// `send_droppable`: with the queue empty but a batch in flight, a notification that would
    /// pass the bound is refused, not queued.
    #[test]
    fn queue_counts_the_batch_in_flight_against_its_bound() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        // A full pipe (its default 64 KiB, written before the outlet has it).
        std::io::Write::write_all(&mut writer, &[b'f'; 64 << 10]).unwrap();
        let out = Outlet::with_limit("busy", OwnedFd::from(writer), 64 << 10, || {});
        // More than the bound, queued then pumped at once: the pump finds the pipe full and
        // the writer thread takes them all (fewer than a batch's lines) and waits.
        for _ in 0..10 {
            out.queue(vec![b'm'; 16 << 10], false).unwrap();
        }
        out.pump();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while out.backlog() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer took the lines"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(out.queued_bytes() > 64 << 10, "{}", out.queued_bytes());
        let refused = out.queue(vec![b'n'; 1024], true).unwrap_err();
        assert_eq!(refused.dropped, 1);
        assert_eq!(out.send_droppable(vec![b'n'; 1024]).unwrap_err().dropped, 2);
        drop(reader);
    }

    /// Queued lines wait for `pump`, keep their order with lines sent directly, and what a full
    /// pipe does not take goes on through the writer thread.
    #[test]
    fn queued_lines_wait_for_pump_and_keep_their_order() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let out = Outlet::new("pump", OwnedFd::from(writer), || {});
        out.queue(b"1\n".to_vec(), false).unwrap();
        out.queue(b"2\n".to_vec(), true).unwrap();
        assert_eq!(out.backlog(), 2, "nothing is written before the pump");
        out.send(b"3\n".to_vec()).unwrap();
        out.pump();
        let mut got = [0u8; 6];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"1\n2\n3\n");
        // Far more than the pipe holds, queued then pumped while nobody reads: the pump does
        // not block, and every line still arrives, in order.
        let lines: Vec<Vec<u8>> = (0..2000)
            .map(|i| format!("{i:06}:{}\n", "y".repeat(200)).into_bytes())
            .collect();
        for (i, l) in lines.iter().enumerate() {
            out.queue(l.clone(), false).unwrap();
            if i % 100 == 0 {
                out.pump();
            }
        }
        out.pump();
        out.close();
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, lines.concat());
    }

    /// A pipe is widened by the first line that is longer than it holds by default, not
    /// before: only outlets that carry large lines take the larger share of the pipe quota.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_long_line_widens_the_pipe_and_short_ones_do_not() {
        let (mut r, w) = std::io::pipe().unwrap();
        let probe = w.try_clone().unwrap();
        let out = Outlet::new("t", w.into(), || {});
        let size = || rustix::pipe::fcntl_getpipe_size(&probe).unwrap();
        let default = size();
        out.send(vec![b'a'; 1000]).unwrap();
        assert_eq!(size(), default, "a short line leaves the pipe as it is");
        let mut long = vec![b'b'; 300_000];
        long.push(b'\n');
        out.send(long).unwrap();
        assert!(size() >= 1 << 20, "{default} -> {}", size());
        drop(probe);
        out.close();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut r, &mut got).unwrap();
        assert_eq!(got.len(), 1000 + 300_001, "every byte arrives");
    }

    /// What one `writev` wrote is taken off the queue: whole lines, then the front's offset.
    #[test]
    fn consume_takes_whole_lines_then_a_partial_front() {
        let mut st = State {
            fd: None,
            queue: VecDeque::from([b"abc\n".to_vec(), b"de\n".to_vec(), b"fghij\n".to_vec()]),
            offset: 1,
            busy: false,
            close: false,
            broken: false,
            queued_bytes: 13,
            dropped: 0,
            widened: false,
            write_calls: 0,
        };
        st.consume(3); // the rest of "abc\n"
        assert_eq!((st.queue.len(), st.offset, st.queued_bytes), (2, 0, 9));
        st.consume(5); // "de\n" and "fg"
        assert_eq!((st.queue.len(), st.offset, st.queued_bytes), (1, 2, 6));
        st.consume(4);
        assert_eq!((st.queue.len(), st.offset, st.queued_bytes), (0, 0, 0));
        st.consume(1); // nothing left: no panic
        assert!(st.queue.is_empty());
        // Empty lines have nothing to write: they go even when nothing was written.
        st.queue = VecDeque::from([Vec::new(), Vec::new(), b"k\n".to_vec(), Vec::new()]);
        st.queued_bytes = 2;
        st.consume(0);
        assert_eq!(
            (st.queue.len(), st.offset),
            (2, 0),
            "up to the first line with bytes"
        );
        st.consume(2);
        assert!(st.queue.is_empty(), "{:?}", st.queue);
    }

    #[test]
    fn a_gone_reader_does_not_block_or_panic() {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Outlet::new("gone", OwnedFd::from(writer), || {});
        for _ in 0..100 {
            let _ = out.send(vec![b'x'; 1000]);
        }
        out.close();
    }

    /// Issue 12, medium finding "unbounded memory" (a server flooding notifications while the
    /// host is not reading; 1 MiB requests while the server stalls): the queue stops at its bound
    /// and counts what it refused; must-deliver lines get 4× the room.
    #[test]
    fn a_reader_that_stalls_bounds_the_queue() {
        let (reader, writer) = std::io::pipe().unwrap();
        let out = Outlet::with_limit("stalled", OwnedFd::from(writer), 1 << 20, || {});
        let line = vec![b'n'; 4096];
        let mut refused = 0;
        for _ in 0..10_000 {
            if out.send_droppable(line.clone()).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 9_000, "refused {refused}");
        assert_eq!(out.dropped(), refused);
        assert!(
            out.queued_bytes() <= (1 << 20) + 4096,
            "{}",
            out.queued_bytes()
        );
        // Must-deliver lines still fit (up to 4× the bound), then are refused too.
        assert!(out.send(line.clone()).is_ok());
        let mut must = 0;
        while out.send(line.clone()).is_ok() {
            must += 1;
            assert!(must < 10_000);
        }
        assert!(
            out.queued_bytes() <= (4 << 20) + 4096,
            "{}",
            out.queued_bytes()
        );
        drop(reader);
    }
}
