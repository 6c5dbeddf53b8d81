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
