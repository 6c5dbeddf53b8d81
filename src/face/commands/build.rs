//! `cargo mcp-dev build`: build + identity + status line, for watch loops (bacon, cargo-watch,
//! watchexec). Records the identity under `target/mcp-dev/identity/`.

use crate::base::error::CmdResult;
use crate::face::cli::{BuildArgs, MessageFormat};
use crate::identity::cycle::{self, CycleOutcome, Prepared};
use crate::{base::exit_codes, screen::output, screen::stderr};

pub fn execute(args: BuildArgs) -> CmdResult {
    let prep = Prepared::new(&args.cargo.selection())?;
    let json = args.message_format == MessageFormat::Json;
    let outcome = cycle::run_cycle(&prep, &[], !stderr::quiet())?;
    report(&prep, &outcome, json)?;
    Ok(match outcome {
        CycleOutcome::Complete { .. } => exit_codes::OK,
        CycleOutcome::Failed { .. } => exit_codes::BUILD_FAILED,
    })
}

/// Prints the status line (human, stderr) or the event (JSON, stdout), and capture warnings.
pub fn report(prep: &Prepared, outcome: &CycleOutcome, json: bool) -> std::io::Result<()> {
    if json {
        output::stdout_line(&cycle::event_json(prep, outcome).to_string())?;
        return Ok(());
    }
    stderr::line(&cycle::status_line(prep, outcome));
    if let CycleOutcome::Complete { problems, .. } = outcome {
        for p in problems {
            stderr::warn(&p.to_string());
        }
    }
    Ok(())
}
