//! One orchestrator per subcommand. Each wires adapters together; none hashes, speaks JSON-RPC
//! or spawns servers itself.

pub mod approve;
mod approve_follow;
pub mod audit;
pub mod background_build;
pub mod build;
pub mod check;
pub mod control_client;
pub mod demo;
mod first_build;
pub mod identity;
pub mod init;
pub mod new;
pub mod policy_record;
pub mod restart;
pub mod run;
pub mod status;
mod status_follow;
mod timer_thread;

use crate::base::error::CmdResult;
use crate::face::cli::{Command, McpDev};

pub fn dispatch(cmd: McpDev) -> CmdResult {
    match cmd.command {
        Command::Build(a) => build::execute(a),
        Command::Identity(a) => identity::execute(a),
        Command::Check(a) => check::execute(a),
        Command::Run(a) => run::execute(a),
        Command::Restart(a) => restart::execute(a),
        Command::Approve(a) if a.follow => approve_follow::execute(&a),
        Command::Approve(a) => approve::execute(a),
        Command::Status(a) => status::execute(a),
        Command::Audit(a) => audit::execute(a),
        Command::New(a) => new::execute(a),
        Command::Init(a) => init::execute(a),
        Command::Demo(a) => demo::execute(a),
        Command::BackgroundBuild(a) => background_build::execute(a),
    }
}
