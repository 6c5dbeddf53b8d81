//! Outlets: where lines leave the proxy (the child's stdin, our stdout to the host).
//!
//! A send first tries a non-blocking write from the calling thread, so the common case costs no
//! thread hand-off (as in a plain byte relay); whatever the pipe cannot take right now is queued,
//! in order, for the outlet's own writer thread, which waits for the pipe to drain. The session
//! therefore never blocks on a peer that stopped reading, and lines are never interleaved or
//! reordered. Owns file descriptors and bytes only.

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
}

struct Inner {
    nonblocking: bool,
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
        let nonblocking = make_nonblocking(&fd);
        let inner = Arc::new(Inner {
            nonblocking,
            state: Mutex::new(State {
                fd: Some(Arc::new(fd)),
                queue: VecDeque::new(),
                offset: 0,
                busy: false,
                close: false,
                broken: false,
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

    /// Queues one line; writes it at once when nothing is waiting ahead of it.
    pub fn send(&self, bytes: Vec<u8>) {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.broken || st.close {
            return;
        }
        if self.inner.nonblocking
            && st.queue.is_empty()
            && !st.busy
            && let Some(fd) = st.fd.clone()
        {
            match write_some(&fd, &bytes) {
                Ok(n) if n == bytes.len() => return,
                Ok(n) => {
                    st.queue.push_back(bytes);
                    st.offset = n;
                }
                Err(Errno::AGAIN) => st.queue.push_back(bytes),
                Err(_) => {
                    st.broken = true;
                    return;
                }
            }
        } else {
            st.queue.push_back(bytes);
        }
        self.inner.cond.notify_one();
    }

    /// Writes what is queued, then closes (the peer sees EOF).
    pub fn close(&self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        st.close = true;
        self.inner.cond.notify_one();
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

fn writer_loop(inner: &Inner) {
    loop {
        let (buf, offset, fd) = {
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
            (st.queue.pop_front().expect("non-empty"), offset, fd)
        };
        let ok = write_all(&fd, &buf[offset..]);
        drop(fd);
        let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        st.busy = false;
        if !ok {
            st.broken = true;
            st.queue.clear();
            st.fd = None;
            return;
        }
    }
}

/// Blocking write of a whole buffer on a possibly non-blocking descriptor.
fn write_all(fd: &OwnedFd, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        match write_some(fd, bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::AGAIN) => {
                let mut fds = [PollFd::new(fd, PollFlags::OUT)];
                if poll(&mut fds, None).is_err() {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
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
            out.send(l.clone());
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

    #[test]
    fn a_gone_reader_does_not_block_or_panic() {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Outlet::new("gone", OwnedFd::from(writer), || {});
        for _ in 0..100 {
            out.send(vec![b'x'; 1000]);
        }
        out.close();
    }
}
