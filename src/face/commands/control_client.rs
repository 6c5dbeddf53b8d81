//! Shared by `approve`, `status` and `restart`: find the running supervisor's control socket
//! and talk to it.

use std::path::PathBuf;

use serde_json::Value;

use crate::base::error::Failure;
use crate::face::cli::ControlArgs;
use crate::identity::build::CargoSelection;
use crate::identity::cycle::Prepared;
use crate::{base::exit_codes, face::control_socket};

/// The socket path: `--socket`, else derived from the project's target dir and label: the
/// first place a socket is bound at ([`control_socket::socket_paths`]: a `run` started by a host with
/// another environment, say without `XDG_RUNTIME_DIR`, binds it in another directory than this
/// shell would), else where this environment's `run` would bind it.
pub fn locate(args: &ControlArgs) -> Result<(PathBuf, String), Failure> {
    use std::os::unix::fs::FileTypeExt;
    let (paths, label) = locate_all(args)?;
    let bound = paths.iter().find(|p| {
        crate::base::beneath::followed::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
    });
    let path = bound.or(paths.first()).expect("at least one").clone();
    Ok((path, label))
}

/// Every path the socket can be at ([`control_socket::socket_paths`]; only `--socket` when given),
/// and the label.
pub fn locate_all(args: &ControlArgs) -> Result<(Vec<PathBuf>, String), Failure> {
    if let Some(s) = &args.socket {
        return Ok((vec![s.clone()], socket_label(args, s)));
    }
    let (target_dir, label) = target_and_label(args)?;
    Ok((control_socket::socket_paths(&target_dir, &label), label))
}

fn socket_label(args: &ControlArgs, socket: &std::path::Path) -> String {
    args.label
        .clone()
        .unwrap_or_else(|| socket.display().to_string())
}

/// The project's target directory and the label (`--label`, else the package's).
fn target_and_label(args: &ControlArgs) -> Result<(PathBuf, String), Failure> {
    let cargo = CargoSelection {
        manifest_path: args.manifest_path.clone(),
        package: args.package.clone(),
        target_dir: args.target_dir.clone(),
        ..CargoSelection::default()
    };
    let prep = Prepared::new(&cargo)?;
    let label = args
        .label
        .clone()
        .unwrap_or_else(|| prep.target.label.clone());
    Ok((prep.target.resolved.target_dir.clone(), label))
}

/// One request; `ok:false` answers become errors, an absent supervisor exits 106.
pub fn call(args: &ControlArgs, request: &Value) -> Result<Value, Failure> {
    let (path, label) = locate(args)?;
    let answer = control_socket::request(&path, request).map_err(|e| {
        // The supervisor is there, but this process cannot read the key its requests must
        // prove: a sandbox (or another state directory), never a reason to start a server.
        if let control_socket::ControlError::NoProof(_) = e {
            return Failure::error(e.to_string()).with_note(
                "approvals are for the human: in their own terminal (`cargo mcp-dev approve`) or in the MCP host's approval form",
            );
        }
        if let Some(why) = sandbox_blocks(&path, &e, &SandboxSigns::from_env()) {
            return Failure::error(format!(
                "the control socket of `{label}` cannot be reached from here: a sandbox blocks it ({why})"
            ))
            .with_note(
                "approvals are for the human: in their own terminal (`cargo mcp-dev approve`) or in the MCP host's approval form; a sandboxed agent shell cannot give them, and nothing else needs to be started",
            );
        }
        Failure::new(
            exit_codes::NO_SUPERVISOR,
            format!(
                "no running `cargo mcp-dev run` for `{label}` answered on its control socket ({e})"
            ),
        )
        .with_note(
            "start the server from your MCP host (or `cargo mcp-dev run`) in this project first",
        )
    })?;
    if answer.get("ok").and_then(|o| o.as_bool()) == Some(true) {
        Ok(answer.get("result").cloned().unwrap_or(Value::Null))
    } else {
        Err(Failure::error(
            answer
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("the supervisor refused the request")
                .to_string(),
        ))
    }
}

/// What says this process runs in an agent's sandbox, read once from the environment.
#[derive(Debug, Clone, Default)]
pub struct SandboxSigns {
    /// The sandbox runtime's own marker (`SANDBOX_RUNTIME=1`, set by Claude Code's sandbox on
    /// the commands it runs; `CLAUDE_CODE_SANDBOXED`).
    pub marked: bool,
    /// `XDG_RUNTIME_DIR`, when set and absolute.
    pub runtime_dir: Option<std::path::PathBuf>,
}

impl SandboxSigns {
    pub fn from_env() -> SandboxSigns {
        let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty() && v != "0");
        SandboxSigns {
            marked: set("SANDBOX_RUNTIME") || set("CLAUDE_CODE_SANDBOXED"),
            runtime_dir: std::env::var_os("XDG_RUNTIME_DIR")
                .map(std::path::PathBuf::from)
                .filter(|d| d.is_absolute()),
        }
    }
}

/// Why the socket at `path` looks blocked by a sandbox rather than absent, or `None`: the
/// kernel refused the socket or its directory (EPERM from a seccomp filter on unix sockets,
/// EACCES), the sandbox runtime's marker is set, or the runtime directory the environment names
/// (`XDG_RUNTIME_DIR`, which the login session creates and the socket lives below) is not
/// visible. An agent told "no running server" would start a second supervisor; one told "a
/// sandbox blocks it" knows approvals are not its to give.
pub fn sandbox_blocks(
    path: &std::path::Path,
    error: &control_socket::ControlError,
    signs: &SandboxSigns,
) -> Option<String> {
    let control_socket::ControlError::Io { source, .. } = error else {
        return None;
    };
    if source.kind() == std::io::ErrorKind::PermissionDenied {
        return Some(format!("{source}"));
    }
    if signs.marked {
        return Some(format!(
            "{source}; this shell runs in Claude Code's sandbox"
        ));
    }
    let runtime = signs.runtime_dir.as_deref()?;
    if !path.starts_with(runtime) {
        return None;
    }
    match crate::base::beneath::followed::symlink_metadata(runtime) {
        Err(e) => Some(format!(
            "{source}; XDG_RUNTIME_DIR {} is not visible here: {e}",
            runtime.display()
        )),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn io(kind: ErrorKind) -> control_socket::ControlError {
        control_socket::ControlError::Io {
            action: "connect to",
            path: "/x".into(),
            source: Error::from(kind),
        }
    }

    #[test]
    fn a_blocked_socket_is_told_from_an_absent_one() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("state/run/x.sock");
        let none = SandboxSigns::default();
        // EPERM (a seccomp filter) and EACCES: blocked.
        assert!(sandbox_blocks(&sock, &io(ErrorKind::PermissionDenied), &none).is_some());
        // No socket, or nobody on it: no server.
        assert_eq!(sandbox_blocks(&sock, &io(ErrorKind::NotFound), &none), None);
        assert_eq!(
            sandbox_blocks(&sock, &io(ErrorKind::ConnectionRefused), &none),
            None
        );
        // The sandbox's marker: blocked whatever the error.
        let marked = SandboxSigns {
            marked: true,
            ..SandboxSigns::default()
        };
        assert!(sandbox_blocks(&sock, &io(ErrorKind::ConnectionRefused), &marked).is_some());
        // The runtime directory the environment names is not there: hidden.
        let runtime = d.path().join("run-user");
        let rt = |dir: &std::path::Path| SandboxSigns {
            runtime_dir: Some(dir.to_path_buf()),
            ..SandboxSigns::default()
        };
        let in_rt = runtime.join("cargo-mcp-dev/x.sock");
        let why = sandbox_blocks(&in_rt, &io(ErrorKind::NotFound), &rt(&runtime)).unwrap();
        assert!(why.contains("not visible"), "{why}");
        std::fs::create_dir_all(&runtime).unwrap();
        assert_eq!(
            sandbox_blocks(&in_rt, &io(ErrorKind::NotFound), &rt(&runtime)),
            None
        );
        // A socket elsewhere: the runtime directory says nothing about it.
        assert_eq!(
            sandbox_blocks(&sock, &io(ErrorKind::NotFound), &rt(&d.path().join("gone"))),
            None
        );
        // Not an I/O failure (a foreign peer): not a sandbox.
        let foreign = control_socket::ControlError::ForeignPeer { path: sock.clone() };
        assert_eq!(sandbox_blocks(&sock, &foreign, &marked), None);
    }
}
