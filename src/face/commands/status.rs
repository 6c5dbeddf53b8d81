//! `cargo mcp-dev status`: the running supervisor's state (human or `--json`); with `--follow`,
//! its status lines as they are written ([`super::status_follow`]).

use serde_json::json;

use super::control_client;
use crate::base::error::CmdResult;
use crate::face::cli::StatusArgs;
use crate::{base::exit_codes, screen::output};

pub fn execute(args: StatusArgs) -> CmdResult {
    if args.follow {
        return super::status_follow::execute(&args);
    }
    // Whether Claude Code's sandbox keeps the agent from the control socket and the audit key
    // (issue 36): said first, so it shows even when no supervisor answers.
    for line in crate::face::host_sandbox::check(&project_dir(&args.control)) {
        crate::screen::stderr::warn(&crate::screen::sanitize::line(&line));
    }
    // A weakening of gating that no human accepted yet (issue 36): it waits, and says so here.
    if let Some(line) = pending_policy(&args.control) {
        crate::screen::stderr::warn(&crate::screen::sanitize::line(&line));
    }
    let status = control_client::call(&args.control, &json!({"op": "status"}))?;
    if args.json {
        // Tool names and call ids are the server's and the agent's: the same JSON, with what a
        // terminal would act on written as `\u` escapes (line by line: a pretty document's
        // line breaks are its own, those inside strings are escaped already).
        let pretty = serde_json::to_string_pretty(&status).expect("json");
        let safe: Vec<_> = pretty
            .lines()
            .map(crate::screen::sanitize::json_text)
            .collect();
        output::stdout_line(&safe.join("\n"))?;
    } else {
        output::stdout_text(&crate::screen::wording::status_page(&status))?;
    }
    Ok(exit_codes::OK)
}

/// Where Claude Code reads the project's settings: the package's directory (`--manifest-path`'s,
/// else the nearest one above the current directory holding a Cargo.toml), else here.
fn project_dir(control: &crate::face::cli::ControlArgs) -> std::path::PathBuf {
    let here = std::env::current_dir().unwrap_or_else(|_| ".".into());
    if let Some(m) = &control.manifest_path {
        let m = if m.is_absolute() {
            m.clone()
        } else {
            here.join(m)
        };
        return m.parent().map(|p| p.to_path_buf()).unwrap_or(here);
    }
    here.ancestors()
        .find(|d| crate::base::beneath::followed::is_file(&d.join("Cargo.toml")))
        .map(|d| d.to_path_buf())
        .unwrap_or(here)
}

/// The sentence saying which weakening of the package's `[package.metadata.mcp-dev]` waits for
/// `approve --policy`, if any (`None` outside a package: `status` still asks the socket).
fn pending_policy(control: &crate::face::cli::ControlArgs) -> Option<String> {
    let prep = crate::identity::cycle::Prepared::new(&crate::identity::build::CargoSelection {
        manifest_path: control.manifest_path.clone(),
        package: control.package.clone(),
        target_dir: control.target_dir.clone(),
        ..Default::default()
    })
    .ok()?;
    super::run::pending_policy_for_status(&prep.target.config, &prep.target.resolved.manifest_path)
}
