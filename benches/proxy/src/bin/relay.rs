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
//!
//! With `AUDIT_RELAY_SEAL=1` (and the map) it is "seal-relay": the floor of a proxy that seals
//! every message into a hash chain before passing it on, as `run` must for a call and its
//! result. Each line becomes a record in `run`'s layout (`src/audit/chain.rs`): a canonical body
//! with `prev`, `run`, `epoch`, `seq`, `time`, `type`, `v` and a small `data` (the request's
//! SHA-256 and length, the response's length), its SHA-256, the HMAC-SHA256 of that hash under
//! a key keyed once, and the line with both, copied into the map; one lock orders the chain of
//! both directions, as the session's lock does in `run`. The complete lines of each read are
//! sealed first and then forwarded with one write, as `run` forwards a batch. No JSON is read (no id, method or tool
//! name) and `data` is shorter than `run`'s records' (about 90 bytes against 70-190), so the
//! variant hashes at most what `run` hashes: `run` minus this floor is `run`'s own work beyond
//! reading a line, sealing it and copying it.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The sealing state of seal-relay: the chain's head and the reused buffers, under one lock.
struct Chain {
    seq: u64,
    prev: [u8; 64],
    keyed: Hmac<Sha256>,
    body: Vec<u8>,
    line: Vec<u8>,
    second: u64,
    prefix: String,
}

const RUN_ID: &str = "01M94VPT9MZGKZ7SPS7FT4APYQ";
const EPOCH_ID: &str = "01M94VPTAD745P6BMCWSDKMJC5";

fn hex(bytes: &[u8], out: &mut Vec<u8>) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 64];
    for (pair, b) in text.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[(b >> 4) as usize];
        pair[1] = DIGITS[(b & 15) as usize];
    }
    out.extend_from_slice(&text[..2 * bytes.len().min(32)]);
}

/// The decimal text of `n`, in `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS.` of a Unix second (UTC), as `run`'s clock caches it per second.
fn second_prefix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Chain {
    fn new() -> Chain {
        Chain {
            seq: 0,
            prev: [b'0'; 64],
            keyed: <Hmac<Sha256> as KeyInit>::new_from_slice(&[7u8; 32]).expect("any key length"),
            body: Vec::with_capacity(1024),
            line: Vec::with_capacity(1024),
            second: u64::MAX,
            prefix: String::new(),
        }
    }

    /// Seals `msg` as the next record and returns the record's line (with its `\n`).
    fn seal(&mut self, msg: &[u8], request: bool) -> &[u8] {
        let Chain {
            seq,
            prev,
            keyed,
            body,
            line,
            second,
            prefix,
        } = self;
        *seq += 1;
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        if since.as_secs() != *second {
            *second = since.as_secs();
            *prefix = second_prefix(*second);
        }
        let ms = since.subsec_millis();
        let mut time = [0u8; 28];
        let t = prefix.len();
        time[..t].copy_from_slice(prefix.as_bytes());
        time[t..t + 4].copy_from_slice(&[
            b'0' + (ms / 100) as u8,
            b'0' + (ms / 10 % 10) as u8,
            b'0' + (ms % 10) as u8,
            b'Z',
        ]);
        let time = &time[..t + 4];
        let mut seq_buf = [0u8; 20];
        let seq_text = decimal(*seq, &mut seq_buf);
        let mut len_buf = [0u8; 20];
        body.clear();
        body.extend_from_slice(b"{\"data\":{\"bytes\":");
        body.extend_from_slice(decimal(msg.len() as u64, &mut len_buf));
        if request {
            body.extend_from_slice(b",\"digest\":\"sha256:");
            hex(&Sha256::digest(msg), body);
            body.push(b'"');
        }
        body.push(b'}');
        let data_end = body.len();
        body.extend_from_slice(b",\"epoch\":\"");
        body.extend_from_slice(EPOCH_ID.as_bytes());
        body.extend_from_slice(b"\",\"prev\":\"");
        body.extend_from_slice(&prev[..]);
        body.extend_from_slice(b"\",\"run\":\"");
        body.extend_from_slice(RUN_ID.as_bytes());
        body.extend_from_slice(b"\",\"seq\":");
        body.extend_from_slice(seq_text);
        body.extend_from_slice(b",\"time\":\"");
        body.extend_from_slice(time);
        body.extend_from_slice(b"\",\"type\":\"message\",\"v\":1}");
        let digest = Sha256::digest(&body[..]);
        let mut mac = keyed.clone();
        mac.update(&digest);
        let mac = mac.finalize().into_bytes();
        line.clear();
        line.extend_from_slice(b"{\"v\":1,\"seq\":");
        line.extend_from_slice(seq_text);
        line.extend_from_slice(b",\"time\":\"");
        line.extend_from_slice(time);
        line.extend_from_slice(b"\",\"type\":\"message\",\"run\":\"");
        line.extend_from_slice(RUN_ID.as_bytes());
        line.extend_from_slice(b"\",\"epoch\":\"");
        line.extend_from_slice(EPOCH_ID.as_bytes());
        line.extend_from_slice(b"\",\"prev\":\"");
        line.extend_from_slice(&prev[..]);
        line.extend_from_slice(b"\",\"data\":");
        // The data object as it is in the body.
        line.extend_from_slice(&body[8..data_end]);
        line.extend_from_slice(b",\"hash\":\"");
        let hash_at = line.len();
        hex(&digest, line);
        prev.copy_from_slice(&line[hash_at..hash_at + 64]);
        line.extend_from_slice(b"\",\"mac\":\"");
        hex(&mac, line);
        line.extend_from_slice(b"\"}\n");
        line
    }
}

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

/// seal-relay's pump: every complete line of a read is sealed into `chain` and its record
/// logged, then the read's complete lines go on with one write (as `run` forwards a batch);
/// `request` says which direction this pump carries (requests get a digest, as a call's
/// arguments do).
fn pump_sealed(
    mut from: impl Read,
    mut to: impl Write,
    log: Arc<Log>,
    chain: Arc<Mutex<Chain>>,
    request: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let (mut start, mut end) = (0, 0);
    loop {
        if end == buf.len() {
            if start > 0 {
                buf.copy_within(start..end, 0);
                end -= start;
                start = 0;
            } else {
                buf.resize(buf.len() * 2, 0);
            }
        }
        match from.read(&mut buf[end..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
        let mut done = start;
        {
            let mut chain = chain.lock().expect("chain lock");
            while let Some(nl) = buf[done..end].iter().position(|&b| b == b'\n') {
                if !log.append(chain.seal(&buf[done..done + nl + 1], request)) {
                    return;
                }
                done += nl + 1;
            }
        }
        if to
            .write_all(&buf[start..done])
            .and_then(|()| to.flush())
            .is_err()
        {
            return;
        }
        (start, end) = if done == end { (0, 0) } else { (done, end) };
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
        Some(log) if std::env::var_os("AUDIT_RELAY_SEAL").is_some() => {
            let chain = Arc::new(Mutex::new(Chain::new()));
            let (to_child, requests) = (log.clone(), chain.clone());
            std::thread::spawn(move || {
                pump_sealed(std::io::stdin().lock(), child_in, to_child, requests, true)
            });
            pump_sealed(child_out, std::io::stdout().lock(), log, chain, false);
        }
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
