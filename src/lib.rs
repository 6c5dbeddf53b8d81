//! `cargo mcp-dev`: cargo run for MCP servers, with execution epochs, catalog revisions and
//! epoch-bound approvals.
//!
//! Layout: the pure core (`fingerprint`, `epoch`, `catalog`, `approval`, `audit::chain`) knows
//! nothing of processes, terminals or clap; adapters (`workspace`, `build`, `store`, `supervisor`,
//! `proxy`, `watch`, `control`, `status`) do the I/O; `session` wires them for `run`; `commands`
//! holds one orchestrator per subcommand.

// Unit tests plant links, fifos and files with std; the library itself reaches files only
// through `beneath` (`clippy.toml`).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod approval;
pub mod audit;
pub mod beneath;
pub mod build;
pub mod canonical;
pub mod capture;
pub mod catalog;
pub mod cli;
pub mod commands;
pub mod config;
pub mod control;
pub mod cycle;
pub mod epoch;
pub mod error;
pub mod exit_codes;
pub mod fingerprint;
pub mod fsutil;
pub mod hashing;
pub mod output;
pub mod paths;
pub mod proxy;
pub mod sanitize;
pub mod session;
pub mod status;
pub mod status_feed;
pub mod store;
pub mod supervisor;
pub mod sys;
pub mod templates;
pub mod watch;
pub mod workspace;

use clap::Parser;

/// Entry point of the binary: parses arguments (accepting both `cargo mcp-dev …` and a direct
/// `cargo-mcp-dev …`), runs the command and returns the exit code.
pub fn main_entry() -> i32 {
    // A file-size limit must fail a write, not kill us mid-append (see the function).
    let _ = sys::unix::survive_file_size_limit();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Invoked directly (`cargo-mcp-dev build`) rather than by cargo (`cargo-mcp-dev mcp-dev build`):
    // insert the subcommand name so both spellings parse the same way.
    if args.get(1).map(|a| a != "mcp-dev").unwrap_or(true) {
        args.insert(1, "mcp-dev".into());
    }
    let cli::Cargo::McpDev(cmd) = match cli::Cargo::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit_codes::USAGE
            } else {
                exit_codes::OK
            };
            let _ = e.print();
            return code;
        }
    };
    status::init(&cmd.global);
    match commands::dispatch(cmd) {
        Ok(code) => code,
        Err(failure) => {
            status::error(&failure.message);
            for note in &failure.notes {
                status::note(note);
            }
            failure.code
        }
    }
}

#[cfg(test)]
mod tests_workspace_attacks;
