//! The face layer: the I/O edges that drive the session: the command line (clap), one orchestrator
//! per subcommand, the control socket server, the source watcher.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod cli;
pub mod commands;
pub mod control_socket;
pub mod host_sandbox;
pub mod templates;
#[cfg(test)]
mod tests_workspace_attacks;
pub mod watch;
