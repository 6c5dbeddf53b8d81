//! The local control socket: the human channel (`approve`, `status`, `restart`) to a running
//! supervisor.
//!
//! A Unix socket in an owner-only directory (0700, owned by us, checked), itself 0600, and every
//! connection's peer uid is checked against ours. One JSON request line, one JSON answer line.
//!
//! The same uid is not enough (issue 36): an agent's shell runs as the user, and a sandbox that
//! lets unix sockets through (Claude Code's `allowAllUnixSockets`) would let a hand-written
//! client approve. So every request also carries a proof that its sender can read the user's
//! state directory ([`ControlProof`], derived from the audit key there), which the host's sandbox
//! denies the agent (`init` writes those rules). Nothing here depends on pids, which a pid
//! namespace renumbers.
//! Nothing reachable over MCP leads here. This module owns the socket and its framing; what an
//! operation does is the session's business, except reading the kept status lines
//! ([`crate::screen::stderr_feed`]), which the connection's thread answers itself.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Sender, bounded};
use serde_json::{Value, json};

use crate::base::sys::unix::current_uid;
use crate::session::ControlRequest;

/// One request from the socket, parsed ([`ControlRequest`]), and where its answer goes. The
/// shell takes it up, gives the session a ticket for it and sends the answer the session
/// returns for that ticket.
#[derive(Debug)]
pub struct ControlCall {
    pub request: ControlRequest,
    pub reply: ControlReply,
}

/// Where the answer to a control request goes, and who has it: the session takes a request up
/// only while its client still waits, and a client gives up only on a request not taken up. So
/// a request whose client was told "dropped" is never carried out later, when nobody is there
/// to see a grant appear, and one taken up is always answered.
#[derive(Debug, Clone)]
pub struct ControlReply {
    answer: crossbeam_channel::Sender<Value>,
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

/// The waiting side of a [`ControlReply`].
#[derive(Debug)]
pub struct ControlWait {
    state: std::sync::Arc<std::sync::atomic::AtomicU8>,
}

const WAITING: u8 = 0;
const TAKEN: u8 = 1;
const GIVEN_UP: u8 = 2;

impl ControlReply {
    pub fn new(answer: crossbeam_channel::Sender<Value>) -> (Self, ControlWait) {
        let state = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(WAITING));
        let wait = ControlWait {
            state: state.clone(),
        };
        (ControlReply { answer, state }, wait)
    }

    /// Takes the request up; `false` when its client gave up (then it must not be carried out).
    pub fn take_up(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.state
            .compare_exchange(WAITING, TAKEN, SeqCst, SeqCst)
            .is_ok()
    }

    pub fn send(&self, answer: Value) {
        let _ = self.answer.send(answer);
    }
}

impl ControlWait {
    /// Gives up on the request; `false` when the session has already taken it up (its answer
    /// is coming).
    pub fn give_up(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.state
            .compare_exchange(WAITING, GIVEN_UP, SeqCst, SeqCst)
            .is_ok()
    }
}

impl From<crossbeam_channel::Sender<Value>> for ControlReply {
    fn from(answer: crossbeam_channel::Sender<Value>) -> Self {
        ControlReply::new(answer).0
    }
}

/// Why the control socket (the human channel) cannot be served or reached.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} is owned by uid {uid}, not by you", path.display())]
    NotOwned { path: PathBuf, uid: u32 },
    #[error(
        "{} has mode {mode:04o}: group or others can reach it; refusing it (check its content, then `chmod 700` it)",
        path.display()
    )]
    Shared { path: PathBuf, mode: u32 },
    #[error("{} is a socket of uid {uid}, not yours; refusing it", path.display())]
    ForeignSocket { path: PathBuf, uid: u32 },
    #[error("{} is a directory, not a socket; remove it to enable approve/status/restart", path.display())]
    DirectoryAtSocket { path: PathBuf },
    #[error("{} exists and is not a socket; remove it to enable approve/status/restart", path.display())]
    NotASocket { path: PathBuf },
    #[error("{}: the process behind this socket runs as another user; refusing to talk to it", path.display())]
    ForeignPeer { path: PathBuf },
    #[error("bad answer from supervisor: {0}")]
    BadAnswer(String),
    #[error(
        "cannot prove this request comes from your own terminal: the audit key in the state directory cannot be read here ({0}); approvals and control are the human's, from a terminal outside the agent's sandbox"
    )]
    NoProof(String),
}

/// What proves a control request comes from a process that can read the user's state
/// directory: an HMAC under the audit key of a fixed text and the socket the request is sent to
/// (no new secret to keep, and one an agent in the host's sandbox cannot read; whoever can read
/// the key can also forge the log, so the two are one boundary). Bound to the socket, so a proof
/// a planted socket captures from the human's client admits nothing at the real one (red team,
/// issue 36): to replay it there the agent would have to be bound at the real socket's path.
#[derive(Clone)]
pub struct ControlProof(crate::audit::AuditKey);

/// The text the proof is the keyed digest of, before the socket's path (no record, anchor or
/// env digest starts with it).
const PROOF_DOMAIN: &[u8] = b"cargo-mcp-dev control socket\n";

/// The request member that carries the proof.
pub const PROOF_MEMBER: &str = "proof";

impl ControlProof {
    pub fn from_key(key: &crate::audit::AuditKey) -> ControlProof {
        ControlProof(key.clone())
    }

    /// The proof from the key in `keys` (never creates a key: the supervisor made it).
    pub fn load(keys: &crate::audit::KeyStore) -> Result<ControlProof, ControlError> {
        keys.load_key()
            .map(|k| ControlProof::from_key(&k))
            .map_err(|e| ControlError::NoProof(e.to_string()))
    }

    /// The proof for requests to the socket at `socket` (its directory canonical, its own
    /// name as is: both ends name the same socket the same way).
    fn for_socket(&self, socket: &Path) -> String {
        use std::os::unix::ffi::OsStrExt;
        let named = socket
            .parent()
            .and_then(|d| crate::base::beneath::followed::canonicalize(d).ok())
            .zip(socket.file_name())
            .map(|(d, n)| d.join(n))
            .unwrap_or_else(|| socket.to_path_buf());
        let mut message = PROOF_DOMAIN.to_vec();
        message.extend_from_slice(named.as_os_str().as_bytes());
        crate::audit::chain::keyed_digest(&self.0, &message)
    }

    /// Puts the proof for the socket at `socket` into `request` (a JSON object).
    pub fn attach(&self, socket: &Path, request: &mut Value) {
        if let Some(o) = request.as_object_mut() {
            o.insert(PROOF_MEMBER.into(), Value::String(self.for_socket(socket)));
        }
    }
}

/// Whether `request` carries `expected` (compared without an early exit). The member is taken
/// out either way: what follows parses the request without it.
fn admits(expected: &str, request: &mut Value) -> bool {
    let given = request.as_object_mut().and_then(|o| o.remove(PROOF_MEMBER));
    let given = given.as_ref().and_then(Value::as_str).unwrap_or("");
    crate::base::hashing::same_secret_text(given.as_bytes(), expected.as_bytes())
}

impl std::fmt::Debug for ControlProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlProof(..)")
    }
}

/// The answer to a request without the proof.
const UNPROVEN: &str = "refused: this request does not prove it comes from a process that can read your state directory (cargo mcp-dev's own `approve`, `status` and `restart` do); a sandboxed agent cannot, and approvals are the human's. If you ran cargo mcp-dev yourself, the supervisor and this command use different state directories (CARGO_MCP_DEV_HOME / XDG_STATE_HOME)";

fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> ControlError + 'a {
    move |source| ControlError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Largest request accepted (requests are tiny; this bounds a hostile peer).
const MAX_REQUEST: u64 = 64 * 1024;

/// Where sockets live, private to the user: `$CARGO_MCP_DEV_HOME/run`, else
/// `$XDG_RUNTIME_DIR/cargo-mcp-dev`, else the state directory's `run` (under `$XDG_STATE_HOME`
/// or `~/.local/state`, which other users cannot pre-create), and only as a last resort
/// `/tmp/cargo-mcp-dev-<uid>`. A shared `/tmp` directory can be created by another user first
/// (issue 12); such a directory is refused ([`ensure_private_dir`]), never used.
pub fn socket_dir() -> PathBuf {
    socket_dirs().into_iter().next().expect("at least /tmp")
}

pub fn socket_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = std::env::var_os("CARGO_MCP_DEV_HOME").filter(|h| !h.is_empty()) {
        dirs.push(PathBuf::from(home).join("run"));
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        if d.is_absolute() {
            dirs.push(d.join("cargo-mcp-dev"));
        }
    }
    if let Ok(keys) = crate::audit::KeyStore::from_env() {
        dirs.push(keys.dir().join("run"));
    }
    dirs.push(std::env::temp_dir().join(format!("cargo-mcp-dev-{}", current_uid())));
    dirs
}

/// The socket of the supervisor for `label` building into `target_dir`.
pub fn socket_path(target_dir: &Path, label: &str) -> PathBuf {
    socket_paths(target_dir, label)
        .into_iter()
        .next()
        .expect("at least one")
}

/// Every place the socket for `label` and `target_dir` can be, the one this environment
/// binds first (see [`socket_path`]), then the same name in the other socket directories: a
/// `run` started by a host with another environment (no `XDG_RUNTIME_DIR`) bound it there.
pub fn socket_paths(target_dir: &Path, label: &str) -> Vec<PathBuf> {
    let key =
        crate::base::hashing::sha256_hex(format!("{}\0{label}", target_dir.display()).as_bytes());
    let name = format!(
        "{}-{}.sock",
        label.chars().take(24).collect::<String>(),
        &key[..12]
    );
    // The first directory whose path fits in sun_path (a choice that depends only on the
    // environment, so `approve` finds the socket `run` bound).
    let mut paths: Vec<PathBuf> = socket_dirs()
        .into_iter()
        .map(|dir| dir.join(&name))
        .filter(|p| p.as_os_str().len() <= 100)
        .collect();
    paths.push(
        std::env::temp_dir()
            .join(format!("cmd-{}", current_uid()))
            .join(&key[..16]),
    );
    paths.dedup();
    paths
}

/// Creates (mode 0700) or checks the owner-only directory: it must be a real directory (not a
/// symlink), owned by us, with no access for group or others. A directory that fails is
/// refused, not repaired: someone else may already have put a socket in it.
pub fn ensure_private_dir(dir: &Path) -> Result<(), ControlError> {
    if !crate::base::beneath::followed::exists(dir) {
        crate::base::beneath::followed::create_dir_all_with_mode(dir, 0o700)
            .map_err(io_err("create", dir))?;
    }
    let meta =
        crate::base::beneath::followed::symlink_metadata(dir).map_err(io_err("inspect", dir))?;
    if !meta.is_dir() {
        return Err(ControlError::NotADirectory { path: dir.into() });
    }
    if meta.uid() != current_uid() {
        return Err(ControlError::NotOwned {
            path: dir.into(),
            uid: meta.uid(),
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ControlError::Shared {
            path: dir.into(),
            mode,
        });
    }
    Ok(())
}

/// Whether a peer may talk to us: only the same uid.
pub fn peer_allowed(peer_uid: Option<u32>, own_uid: u32) -> bool {
    peer_uid == Some(own_uid)
}

fn peer_uid(stream: &UnixStream) -> Option<u32> {
    crate::base::sys::unix::peer_uid(stream)
}

fn peer_pid(stream: &UnixStream) -> Option<u32> {
    crate::base::sys::unix::peer_pid(stream)
}

/// The control socket as this process holds it.
#[derive(Debug, Clone)]
pub struct Served {
    /// The pid of another live supervisor that holds the socket (this one takes over when it
    /// exits), `None` when this process bound it.
    pub other_owner: Option<Option<u32>>,
    bound: Arc<Mutex<Option<(u64, u64)>>>,
}

impl Served {
    /// Removes the socket file, only if it is still the one this process bound (a second
    /// supervisor for the same label must never remove the first one's socket; issue 12).
    pub fn release(&self, path: &Path) {
        let ours = *self.bound.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(id), Ok(m)) = (ours, crate::base::beneath::followed::symlink_metadata(path))
            && crate::base::sys::unix::file_id(&m) == id
        {
            let _ = remove_socket(path);
        }
    }

    /// Whether this process holds the socket now.
    pub fn owned(&self) -> bool {
        self.bound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// Binds the socket and serves requests on a thread; each well-formed request becomes a
/// [`ControlCall`] (a malformed one is answered here, with why).
///
/// If another live supervisor holds the socket (a host's probing second copy, or a second host
/// session), this one never removes it: it keeps trying in the background and takes over once
/// the other exits, so the session that stays always ends up reachable. [`Served::other_owner`]
/// then names the other one's pid (from the socket's peer credentials).
pub fn serve(
    path: &Path,
    events: Sender<ControlCall>,
    proof: ControlProof,
) -> Result<Served, ControlError> {
    let dir = path.parent().ok_or_else(|| ControlError::NotADirectory {
        path: path.to_path_buf(),
    })?;
    ensure_private_dir(dir)?;
    // What a request to this socket must carry (the directory exists now: canonical).
    let proof: Arc<str> = proof.for_socket(path).into();
    let bound = Arc::new(Mutex::new(None));
    match try_bind(path)? {
        Bind::Bound(listener, id) => {
            *bound.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
            spawn_acceptor(listener, events, proof.clone())?;
            Ok(Served {
                other_owner: None,
                bound,
            })
        }
        Bind::Busy(pid) => {
            let path_for_err = path.to_path_buf();
            let path = path.to_path_buf();
            let slot = bound.clone();
            std::thread::Builder::new()
                .name("control-wait".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_millis(250));
                        match try_bind(&path) {
                            Ok(Bind::Bound(listener, id)) => {
                                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
                                let _ = spawn_acceptor(listener, events, proof);
                                return;
                            }
                            Ok(Bind::Busy(_)) => continue,
                            Err(_) => return,
                        }
                    }
                })
                .map_err(io_err("start waiting for", &path_for_err))?;
            Ok(Served {
                other_owner: Some(pid),
                bound,
            })
        }
    }
}

enum Bind {
    /// Bound; the socket file's `(dev, ino)`.
    Bound(UnixListener, (u64, u64)),
    /// A live supervisor answers on the path (its pid when the kernel says).
    Busy(Option<u32>),
}

/// Binds unless a live supervisor answers on `path`. A stale socket of ours is replaced; a
/// directory, a file that is not a socket, or a socket of another user is reported, never
/// removed.
fn try_bind(path: &Path) -> Result<Bind, ControlError> {
    match crate::base::beneath::followed::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if let Ok(stream) = UnixStream::connect(path) {
                return Ok(Bind::Busy(peer_pid(&stream)));
            }
            if m.uid() != current_uid() {
                return Err(ControlError::ForeignSocket {
                    path: path.into(),
                    uid: m.uid(),
                });
            }
            let _ = remove_socket(path);
        }
        Ok(m) if m.is_dir() => {
            return Err(ControlError::DirectoryAtSocket { path: path.into() });
        }
        Ok(_) => {
            return Err(ControlError::NotASocket { path: path.into() });
        }
        Err(_) => {}
    }
    match UnixListener::bind(path) {
        Ok(l) => {
            let _ = crate::base::beneath::Beneath::parent_of(path)
                .and_then(|(dir, name)| dir.set_mode(&name, 0o600));
            let m = crate::base::beneath::followed::symlink_metadata(path)
                .map_err(io_err("inspect", path))?;
            Ok(Bind::Bound(l, crate::base::sys::unix::file_id(&m)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(Bind::Busy(None)),
        Err(e) => Err(io_err("bind", path)(e)),
    }
}

/// Connections served at once; past it a connection is answered "busy" and closed (a peer
/// that opens connections and sends nothing gets no thread each).
const MAX_CONNECTIONS: usize = 16;
/// How long a connection may take to send its request line, in all.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);
/// How long the session has to answer; past it the client is told, and the request is dropped
/// unless the session has already taken it up.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// How long writing an answer may take (a peer that does not read).
const WRITE_WITHIN: Duration = Duration::from_secs(5);
/// The longest answer a client reads (a `status` with a large catalog is well under it).
const MAX_ANSWER: u64 = 64 << 20;
/// How long a client waits for the whole answer.
const CLIENT_WAIT: Duration = Duration::from_secs(20);

fn spawn_acceptor(
    listener: UnixListener,
    events: Sender<ControlCall>,
    proof: Arc<str>,
) -> Result<(), ControlError> {
    let own = current_uid();
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            use std::sync::atomic::Ordering;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let _ = stream.set_write_timeout(Some(WRITE_WITHIN));
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    let _ = writeln!(
                        &stream,
                        "{}",
                        json!({"ok": false, "error": "the supervisor is busy with other control connections; try again"})
                    );
                    continue;
                }
                let events = events.clone();
                let proof = proof.clone();
                let done = open.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        handle(stream, own, events, &proof);
                        done.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .map_err(|e| ControlError::Io {
            action: "start the control thread for",
            path: PathBuf::from("the control socket"),
            source: e,
        })?;
    Ok(())
}

fn handle(stream: UnixStream, own: u32, events: Sender<ControlCall>, proof: &str) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    if !peer_allowed(peer_uid(&stream), own) {
        let _ = writeln!(
            writer,
            "{}",
            json!({"ok": false, "error": "connection refused: different user"})
        );
        return;
    }
    let line = match read_line_within(stream, MAX_REQUEST, REQUEST_WITHIN) {
        Ok(line) if !line.is_empty() => line,
        _ => return,
    };
    let parsed = serde_json::from_str::<Value>(&line).map(|mut request| {
        let proven = admits(proof, &mut request);
        (request, proven)
    });
    let answer = match parsed {
        Ok((_, false)) => json!({"ok": false, "error": UNPROVEN}),
        // The status lines kept for `status --follow`: read here, never queued behind the
        // session's events (a follower polls; the session may be busy).
        Ok((request, true))
            if request.get("op").and_then(Value::as_str)
                == Some(crate::screen::stderr_feed::OP) =>
        {
            match crate::screen::stderr_feed::answer(&request) {
                Some(result) => json!({"ok": true, "result": result}),
                None => json!({"ok": false, "error": "this process keeps no status lines"}),
            }
        }
        Ok((request, true)) => match ControlRequest::parse(&request) {
            Err(e) => json!({"ok": false, "error": e}),
            Ok(request) => {
                let (tx, rx) = bounded(1);
                let (reply, wait) = ControlReply::new(tx);
                let busy = json!({"ok": false, "error": format!(
                "the supervisor did not take the request up within {} s; it was dropped (nothing was done)",
                ANSWER_WITHIN.as_secs())});
                if events.send(ControlCall { request, reply }).is_err() {
                    json!({"ok": false, "error": "supervisor is shutting down"})
                } else {
                    match rx.recv_timeout(ANSWER_WITHIN) {
                        Ok(answer) => answer,
                        // Not taken up: never carried out later, when nobody is there to see it.
                        Err(_) if wait.give_up() => busy,
                        // Taken up just now: its answer is coming.
                        Err(_) => rx.recv().unwrap_or(busy),
                    }
                }
            }
        },
        Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
    };
    let _ = writeln!(writer, "{answer}");
}

/// One line of at most `limit` bytes, read within `within` in all (a per-read timeout alone
/// lets a peer that trickles a byte now and then hold the reader for ever). Without its
/// newline when the peer closed first; empty when it sent nothing.
fn read_line_within(stream: UnixStream, limit: u64, within: Duration) -> std::io::Result<String> {
    let deadline = std::time::Instant::now() + within;
    let mut reader = BufReader::new(std::io::Read::take(&stream, limit));
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break; // closed, or the limit reached
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(at) => {
                line.extend_from_slice(&buf[..at]);
                break;
            }
            None => {
                let n = buf.len();
                line.extend_from_slice(buf);
                reader.consume(n);
            }
        }
    }
    if line.len() as u64 >= limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("longer than {limit} bytes"),
        ));
    }
    String::from_utf8(line)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))
}

/// Removes the socket (or a stale file) at `path` by name in its directory, never through a link
/// on the way to it.
fn remove_socket(path: &Path) -> std::io::Result<()> {
    let (dir, name) = crate::base::beneath::Beneath::parent_of(path)?;
    dir.remove_file(&name)
}

/// Client side: one request, one answer. The peer must run as the same user (a socket planted
/// by someone else never receives a decision).
pub fn request(path: &Path, request: &Value) -> Result<Value, ControlError> {
    if let Ok(m) = crate::base::beneath::followed::symlink_metadata(path)
        && m.is_dir()
    {
        return Err(ControlError::DirectoryAtSocket { path: path.into() });
    }
    let stream = UnixStream::connect(path).map_err(io_err("connect to", path))?;
    if !peer_allowed(peer_uid(&stream), current_uid()) {
        return Err(ControlError::ForeignPeer { path: path.into() });
    }
    let keys =
        crate::audit::KeyStore::from_env().map_err(|e| ControlError::NoProof(e.to_string()))?;
    request_proven(stream, path, request, &ControlProof::load(&keys)?)
}

/// [`request`] on a connected, checked stream, with `proof`.
fn request_proven(
    mut stream: UnixStream,
    path: &Path,
    request: &Value,
    proof: &ControlProof,
) -> Result<Value, ControlError> {
    let mut request = request.clone();
    proof.attach(path, &mut request);
    stream.set_write_timeout(Some(WRITE_WITHIN)).ok();
    writeln!(stream, "{request}").map_err(io_err("write to", path))?;
    let line = read_line_within(stream, MAX_ANSWER, CLIENT_WAIT)
        .map_err(io_err("read the answer from", path))?;
    serde_json::from_str(&line).map_err(|e| ControlError::BadAnswer(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::DirBuilderExt;

    fn test_proof() -> ControlProof {
        ControlProof::from_key(&crate::audit::AuditKey::from_bytes([7; 32]))
    }

    /// Issue 36: the same uid is not enough. A request without the proof, with a wrong one or
    /// with one made under another key is refused before the session sees it; with the proof
    /// it reaches the session, without the proof member.
    #[test]
    fn a_request_without_the_proof_never_reaches_the_session() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s/p.sock");
        let (tx, rx) = crossbeam_channel::unbounded::<ControlCall>();
        let served = serve(&path, tx, test_proof()).unwrap();
        let at = path.clone();
        let raw = move |line: String| {
            let mut stream = UnixStream::connect(&at).unwrap();
            writeln!(stream, "{line}").unwrap();
            read_line_within(stream, MAX_ANSWER, CLIENT_WAIT).unwrap()
        };
        let other = ControlProof::from_key(&crate::audit::AuditKey::from_bytes([8; 32]));
        let approve = json!({"op": "approve", "epoch": "E", "tools": ["w"]});
        let mut wrong = approve.clone();
        other.attach(&path, &mut wrong);
        let mut short = approve.clone();
        short[PROOF_MEMBER] = json!(&test_proof().for_socket(&path)[..10]);
        let mut not_text = approve.clone();
        not_text[PROOF_MEMBER] = json!(12);
        let feed = json!({"op": crate::screen::stderr_feed::OP});
        for request in [approve.clone(), wrong, short, not_text, feed] {
            let answer: Value = serde_json::from_str(&raw(request.to_string())).unwrap();
            assert_eq!(answer["ok"], json!(false), "{request}: {answer}");
            assert!(
                answer["error"].as_str().unwrap().contains("does not prove"),
                "{answer}"
            );
        }
        assert!(
            rx.try_recv().is_err(),
            "an unproven request reached the session"
        );
        // With the proof: taken up by the session (answered here by the test).
        let mut proven = json!({"op": "status"});
        test_proof().attach(&path, &mut proven);
        let client = std::thread::spawn({
            let raw = raw.clone();
            move || raw(proven.to_string())
        });
        let call = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the proven request reaches the session");
        assert!(matches!(call.request, ControlRequest::Status));
        call.reply.send(json!({"ok": true, "result": "seen"}));
        assert!(client.join().unwrap().contains("seen"));
        served.release(&d.path().join("s/p.sock"));
    }

    /// Red team (issue 36, item 1): the proof is a fixed string (the HMAC of a constant under
    /// the audit key), sent by the human's own `status`/`approve` to whatever same-uid socket
    /// answers at the path `locate` picks. An agent that binds a socket there (a socket
    /// directory the sandbox rules do not cover, such as the `/tmp` fallbacks, while no
    /// supervisor is up) reads it once, and from then on it admits any request at the real
    /// supervisor, an `approve` among them: the proof must be bound to a fresh challenge of the
    /// server (and to the request), never a bearer token.
    #[test]
    fn a_proof_captured_by_a_planted_socket_does_not_admit_a_replayed_approve() {
        let d = tempfile::tempdir().unwrap();
        // The agent's socket: same uid, so the client's peer check passes.
        std::fs::create_dir(d.path().join("agent")).unwrap();
        let planted = d.path().join("agent/planted.sock");
        let listener = UnixListener::bind(&planted).unwrap();
        // The real supervisor.
        let (tx, rx) = crossbeam_channel::unbounded::<ControlCall>();
        let real = d.path().join("s/real.sock");
        let served = serve(&real, tx, test_proof()).unwrap();
        let agent = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let line = read_line_within(stream, MAX_REQUEST, REQUEST_WITHIN).unwrap();
            writeln!(writer, "{}", json!({"ok": true, "result": "all is well"})).unwrap();
            line
        });
        // The human's `cargo mcp-dev status`, connected to the planted socket.
        let stream = UnixStream::connect(&planted).unwrap();
        let answer =
            request_proven(stream, &planted, &json!({"op": "status"}), &test_proof()).unwrap();
        assert_eq!(answer["result"], "all is well");
        let captured: Value = serde_json::from_str(&agent.join().unwrap()).unwrap();
        // The agent replays what it captured as an approval of its own calls.
        let mut approve = json!({"op": "approve", "epoch": "E", "tools": ["write_file"]});
        approve[PROOF_MEMBER] = captured[PROOF_MEMBER].clone();
        let mut stream = UnixStream::connect(&real).unwrap();
        writeln!(stream, "{approve}").unwrap();
        let reached = rx.recv_timeout(Duration::from_secs(3));
        served.release(&real);
        assert!(
            reached.is_err(),
            "a proof captured from the human's status request let the agent's approve reach the session: {:?}",
            reached.map(|c| c.request)
        );
    }

    #[test]
    fn only_the_same_uid_is_allowed() {
        assert!(peer_allowed(Some(1000), 1000));
        assert!(!peer_allowed(Some(0), 1000));
        assert!(!peer_allowed(None, 1000));
    }

    /// Issue 12, medium finding "a shared socket directory under /tmp can be pre-created by
    /// another user": a directory with group/other access, or owned by someone else, or a
    /// symlink, is refused (it used to be chmod-ed and used).
    #[test]
    fn private_dir_is_created_0700_and_others_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run");
        ensure_private_dir(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&p).unwrap_err();
        assert!(e.to_string().contains("mode 0755"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(ensure_private_dir(&link).is_err());
        if current_uid() == 0 {
            let theirs = d.path().join("theirs");
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&theirs)
                .unwrap();
            rustix::fs::chown(&theirs, Some(rustix::process::Uid::from_raw(4242)), None).unwrap();
            let e = ensure_private_dir(&theirs).unwrap_err();
            assert!(e.to_string().contains("owned by uid 4242"), "{e}");
        }
    }

    /// Issue 12, medium finding "a second supervisor for the same label removes the first one's
    /// control socket", and low finding "a directory at the socket path is misreported".
    #[test]
    fn a_second_server_never_removes_the_first_ones_socket() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s/x.sock");
        let (tx1, _rx1) = crossbeam_channel::unbounded();
        let first = serve(&path, tx1, test_proof()).unwrap();
        assert!(first.owned() && first.other_owner.is_none());
        let (tx2, _rx2) = crossbeam_channel::unbounded();
        let second = serve(&path, tx2, test_proof()).unwrap();
        assert_eq!(second.other_owner, Some(Some(std::process::id())));
        assert!(!second.owned());
        second.release(&path);
        assert!(
            path.exists(),
            "the second supervisor removed the first one's socket"
        );
        first.release(&path);
        assert!(!path.exists());

        let dir_path = d.path().join("s/dir.sock");
        std::fs::create_dir(&dir_path).unwrap();
        let (tx3, _rx3) = crossbeam_channel::unbounded();
        let e = serve(&dir_path, tx3, test_proof()).unwrap_err();
        assert!(
            e.to_string().contains("is a directory, not a socket"),
            "{e}"
        );
        let e = request(&dir_path, &json!({})).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }

    #[test]
    fn socket_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s/x.sock");
        let (tx, rx) = crossbeam_channel::unbounded();
        assert!(serve(&path, tx, test_proof()).unwrap().owned());
        std::thread::spawn(move || {
            if let Ok(ControlCall { request, reply }) = rx.recv() {
                reply.send(json!({"ok": true, "echo": request}));
            }
        });
        let stream = UnixStream::connect(&path).unwrap();
        let answer =
            request_proven(stream, &path, &json!({"op": "status"}), &test_proof()).unwrap();
        assert_eq!(answer["echo"]["op"], "status");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
