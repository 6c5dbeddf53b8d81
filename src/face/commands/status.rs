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
