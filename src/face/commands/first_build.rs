//! The first build at the end of `new` and `init`, so that a host opened right after finds the
//! server built: its `run` then starts warm (an identity is recorded and its stored executable
//! exists; cargo finds nothing to do) and the host gets the tools at once instead of waiting
//! out a cold build of rmcp and tokio.
//!
//! It is the build `cargo mcp-dev build` does (the same cycle: build, capture, record, the same
//! status line and the same progress on stderr), for what the written host files run: the
//! package's manifest, its configured `bin`, the default profile and features. Of cargo's
//! flags only those that change how cargo resolves, not what it builds, are taken
//! (`--offline`, `--locked`, `--frozen`): a `--release` build here would not be the one the
//! host's `run` starts. It runs in the package's directory, where the written host files
//! start `run` (the identity's launch part names the working directory).
//!
//! A failure is explained: what failed (the compiler's first error, or why cargo could not
//! run), that the files were written all the same, and how to try again. Exit codes: 101 when
//! the build failed, cargo's own (102) when it could not run.
//!
//! Owns: when the first build runs and how its failure is told. Not: the build itself
//! ([`crate::identity::cycle`]).

use std::path::Path;

use crate::base::error::{CmdResult, Failure};
use crate::face::cli::FirstBuildArgs;
use crate::identity::build::CargoSelection;
use crate::identity::cycle::{self, CycleOutcome, Prepared};
use crate::{base::exit_codes, screen::sanitize, screen::stderr};

/// Builds the package at `manifest` (absolute) once, as `cargo mcp-dev build` would, unless
/// `--no-build`. `written` says what was written, for the failure's note ("the host files
/// were written all the same").
pub fn run(manifest: &Path, bin: Option<&str>, args: &FirstBuildArgs, written: &str) -> CmdResult {
    if args.no_build {
        return Ok(exit_codes::OK);
    }
    let retry = retry_command(manifest);
    let cargo = CargoSelection {
        manifest_path: Some(manifest.to_path_buf()),
        bin: bin.map(str::to_string),
        offline: args.offline,
        locked: args.locked,
        frozen: args.frozen,
        ..CargoSelection::default()
    };
    let written_note = |f: Failure| {
        f.with_note(format!(
            "{written}; fix the cause and build with `{retry}` (or just open your host: its `run` builds first, and says why it cannot)"
        ))
    };
    if let Some(dir) = manifest.parent() {
        // Where the host files start `run` (see the module doc).
        std::env::set_current_dir(dir)?;
    }
    stderr::line(
        "building the server once now, so that a host connecting next gets its tools at once (--no-build skips this)",
    );
    let prep = Prepared::new(&cargo).map_err(|f| {
        written_note(Failure::new(
            f.code,
            format!("the server could not be built: {}", f.message),
        ))
    })?;
    let outcome = cycle::run_cycle(&prep, &[], !stderr::quiet()).map_err(|f| {
        written_note(Failure::new(
            f.code,
            format!("the server's build did not complete: {}", f.message),
        ))
    })?;
    super::build::report(&prep, &outcome, false)?;
    match outcome {
        CycleOutcome::Complete { .. } => Ok(exit_codes::OK),
        CycleOutcome::Failed {
            errors,
            first_location,
            summary,
            ..
        } => {
            let first = match (first_location, summary) {
                (Some(at), Some(what)) => format!("{at}: {what}"),
                (None, Some(what)) => what,
                (Some(at), None) => at,
                (None, None) => "cargo build failed (its output is above)".into(),
            };
            Err(written_note(Failure::new(
                exit_codes::BUILD_FAILED,
                format!(
                    "the server does not build ({errors} error{}; the first: {})",
                    if errors == 1 { "" } else { "s" },
                    sanitize::review(&first)
                ),
            )))
        }
    }
}

/// `cargo mcp-dev build --manifest-path PATH`, pasteable.
fn retry_command(manifest: &Path) -> String {
    let text = manifest.display().to_string();
    format!(
        "cargo mcp-dev build --manifest-path {}",
        sanitize::shell_word(&text).unwrap_or(text)
    )
}
