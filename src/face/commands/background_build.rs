//! `cargo mcp-dev background-build` (hidden): the one owner of a build a host abandoned.
//!
//! `run` starts it in its own process group when the host closes the connection during the
//! first build (hosts time out and retry). It runs the same `cargo build`, with the output in a
//! log file, and stops it after a deadline, so an abandoned build is finished for the host's
//! retry but never runs unbounded. cargo's lock on the target directory keeps it the only build
//! of that directory. Must not touch: identity, the session.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::base::error::{CmdResult, Failure};
use crate::base::exit_codes;
use crate::face::cli::BackgroundBuildArgs;

pub fn execute(args: BackgroundBuildArgs) -> CmdResult {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::new(exit_codes::USAGE, "background-build needs a command"))?;
    // Under target/, which the agent can write: a link planted at the log is replaced, never
    // written through (it would truncate the file it names).
    crate::base::fsutil::remove_planted_link(&args.log);
    let log = crate::base::fsutil::create_log_file(&args.log)
        .map_err(|e| Failure::error(format!("cannot create {}: {e}", args.log.display())))?;
    let err = log.try_clone().map_err(|e| Failure::error(e.to_string()))?;
    let mut child = Command::new(program)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| Failure::error(format!("cannot run {program}: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let outcome = loop {
        match child.try_wait() {
            Ok(Some(status)) => break format!("finished: {status}"),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break format!("stopped after {} s", args.timeout_secs);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => break format!("lost: {e}"),
        }
    };
    if let Ok(mut f) = crate::base::fsutil::open_append(&args.log) {
        let _ = writeln!(f, "cargo mcp-dev: background build {outcome}");
    }
    Ok(exit_codes::OK)
}
