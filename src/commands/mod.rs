//! One orchestrator per subcommand. Each wires adapters together; none hashes, speaks JSON-RPC
//! or spawns servers itself.

pub mod approve;
pub mod audit;
pub mod build;
pub mod check;
pub mod control_client;
pub mod identity;
pub mod restart;
pub mod run;
pub mod status;

use crate::cli::{Command, McpDev};
use crate::error::{CmdResult, Failure};

pub fn dispatch(cmd: McpDev) -> CmdResult {
    match cmd.command {
        Command::Build(a) => build::execute(a),
        Command::Identity(a) => identity::execute(a),
        Command::Check(a) => check::execute(a),
        Command::Run(a) => run::execute(a),
        Command::Restart(a) => restart::execute(a),
        Command::Approve(a) => approve::execute(a),
        Command::Status(a) => status::execute(a),
        Command::Audit(a) => audit::execute(a),
        other => Err(not_yet(&other)),
    }
}

/// Subcommands whose issue has not landed say so plainly instead of pretending to work.
fn not_yet(cmd: &Command) -> Failure {
    let name = format!("{cmd:?}")
        .split('(')
        .next()
        .unwrap_or("this command")
        .to_lowercase();
    Failure::error(format!(
        "`cargo mcp-dev {name}` is not implemented yet in this version"
    ))
}
