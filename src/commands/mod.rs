//! One orchestrator per subcommand. Each wires adapters together; none hashes, speaks JSON-RPC
//! or spawns servers itself.

pub mod build;
pub mod check;
pub mod identity;

use crate::cli::{Command, McpDev};
use crate::error::{CmdResult, Failure};

pub fn dispatch(cmd: McpDev) -> CmdResult {
    match cmd.command {
        Command::Build(a) => build::execute(a),
        Command::Identity(a) => identity::execute(a),
        Command::Check(a) => check::execute(a),
        other => Err(not_yet(&other)),
    }
}

/// Subcommands whose issue has not landed say so plainly instead of pretending to work.
fn not_yet(cmd: &Command) -> Failure {
    let name = format!("{cmd:?}").split('(').next().unwrap_or("this command").to_lowercase();
    Failure::error(format!("`cargo mcp-dev {name}` is not implemented yet in this version"))
}
