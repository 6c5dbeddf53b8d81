//! The local control socket: the human channel (`approve`, `status`, `restart`) to a running
//! supervisor.
//!
//! A Unix socket in an owner-only directory (0700, owned by us, checked), itself 0600, and every
//! connection's peer uid is checked against ours. One JSON request line, one JSON answer line.
//! Nothing reachable over MCP leads here. This module owns the socket and its framing; what an
//! operation does is the session's business.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crossbeam_channel::{Sender, bounded};
use serde_json::{Value, json};

use crate::session::Event;
use crate::supervisor::unix::current_uid;

/// Largest request accepted (requests are tiny; this bounds a hostile peer).
const MAX_REQUEST: u64 = 64 * 1024;

/// `$XDG_RUNTIME_DIR/cargo-mcp-dev` or `/tmp/cargo-mcp-dev-<uid>`: short paths (socket paths
/// are limited to ~100 bytes), private to the user.
pub fn socket_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_MCP_DEV_HOME") {
        return PathBuf::from(home).join("run");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("cargo-mcp-dev"),
        _ => std::env::temp_dir().join(format!("cargo-mcp-dev-{}", current_uid())),
    }
}

/// The socket of the supervisor for `label` building into `target_dir`.
pub fn socket_path(target_dir: &Path, label: &str) -> PathBuf {
    let key = crate::hashing::sha256_hex(format!("{}\0{label}", target_dir.display()).as_bytes());
    let name = format!(
        "{}-{}.sock",
        label.chars().take(24).collect::<String>(),
        &key[..12]
    );
    let dir = socket_dir();
    let p = dir.join(&name);
    // Fall back to a shorter directory when the path would not fit in sun_path.
    if p.as_os_str().len() > 100 {
        return std::env::temp_dir()
            .join(format!("cmd-{}", current_uid()))
            .join(&key[..16]);
    }
    p
}

/// Creates (or checks) the owner-only directory.
pub fn ensure_private_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != current_uid() {
        return Err(format!(
            "{} is owned by uid {}, not by you",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            format!(
                "{} is accessible to others and cannot be fixed: {e}",
                dir.display()
            )
        })?;
    }
    Ok(())
}

/// Whether a peer may talk to us: only the same uid.
pub fn peer_allowed(peer_uid: Option<u32>, own_uid: u32) -> bool {
    peer_uid == Some(own_uid)
}

fn peer_uid(stream: &UnixStream) -> Option<u32> {
    peer_credentials_uid(stream)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn peer_credentials_uid(stream: &UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|c| c.uid.as_raw())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn peer_credentials_uid(_stream: &UnixStream) -> Option<u32> {
    // Directory permissions (0700) are the guard on other platforms until getpeereid is wired.
    Some(current_uid())
}

/// Binds the socket and serves requests on a thread; each request becomes [`Event::Control`].
///
/// If another live supervisor holds the socket (a host's probing second copy, or a second host
/// session), this one keeps trying in the background and takes over once the other exits, so the
/// session that stays always ends up reachable. Returns `Ok(false)` in that case.
pub fn serve(path: &Path, events: Sender<Event>) -> Result<bool, String> {
    let dir = path.parent().ok_or("socket path has no directory")?;
    ensure_private_dir(dir)?;
    match try_bind(path)? {
        Some(listener) => {
            spawn_acceptor(listener, events)?;
            Ok(true)
        }
        None => {
            let path = path.to_path_buf();
            std::thread::Builder::new()
                .name("control-wait".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_millis(250));
                        match try_bind(&path) {
                            Ok(Some(listener)) => {
                                let _ = spawn_acceptor(listener, events);
                                return;
                            }
                            Ok(None) => continue,
                            Err(_) => return,
                        }
                    }
                })
                .map_err(|e| e.to_string())?;
            Ok(false)
        }
    }
}

/// Binds unless a live supervisor answers on `path`; a stale socket file is replaced.
fn try_bind(path: &Path) -> Result<Option<UnixListener>, String> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Ok(None);
        }
        let _ = std::fs::remove_file(path);
    }
    match UnixListener::bind(path) {
        Ok(l) => {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
            Ok(Some(l))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(format!("cannot bind {}: {e}", path.display())),
    }
}

fn spawn_acceptor(listener: UnixListener, events: Sender<Event>) -> Result<(), String> {
    let own = current_uid();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let events = events.clone();
                let _ = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || handle(stream, own, events));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn handle(stream: UnixStream, own: u32, events: Sender<Event>) {
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
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(std::io::Read::take(stream, MAX_REQUEST));
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let answer = match serde_json::from_str::<Value>(&line) {
        Ok(request) => {
            let (tx, rx) = bounded(1);
            if events.send(Event::Control { request, reply: tx }).is_err() {
                json!({"ok": false, "error": "supervisor is shutting down"})
            } else {
                rx.recv_timeout(Duration::from_secs(10))
                    .unwrap_or_else(|_| json!({"ok": false, "error": "supervisor did not answer"}))
            }
        }
        Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
    };
    let _ = writeln!(writer, "{answer}");
}

/// Client side: one request, one answer.
pub fn request(path: &Path, request: &Value) -> Result<Value, String> {
    let mut stream = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(15))).ok();
    writeln!(stream, "{request}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|e| format!("bad answer from supervisor: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_uid_is_allowed() {
        assert!(peer_allowed(Some(1000), 1000));
        assert!(!peer_allowed(Some(0), 1000));
        assert!(!peer_allowed(None, 1000));
    }

    #[test]
    fn private_dir_is_created_0700_and_fixed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("run");
        ensure_private_dir(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn socket_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s/x.sock");
        let (tx, rx) = crossbeam_channel::unbounded();
        assert!(serve(&path, tx).unwrap());
        std::thread::spawn(move || {
            if let Ok(Event::Control { request, reply }) = rx.recv() {
                let _ = reply.send(json!({"ok": true, "echo": request}));
            }
        });
        let answer = request(&path, &json!({"op": "status"})).unwrap();
        assert_eq!(answer["echo"]["op"], "status");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
