//! `cargo mcp-dev restart`: apply the latest build now (restart mode `manual`, or after a crash loop).

use serde_json::json;

use super::control_client;
use crate::base::error::CmdResult;
use crate::face::cli::ControlArgs;
use crate::{base::exit_codes, screen::stderr};

pub fn execute(args: ControlArgs) -> CmdResult {
    let answer = control_client::call(&args, &json!({"op": "restart"}))?;
    if answer.get("restarting").is_some() {
        stderr::line(
            "restart requested: the running server is being replaced with the latest build",
        );
    } else if answer.get("building").is_some() {
        stderr::line(
            "restart requested: the server could not start from its stored copy; it is being built again and starts when the build succeeds",
        );
    } else {
        stderr::line("restart requested: the server is starting");
    }
    Ok(exit_codes::OK)
}
