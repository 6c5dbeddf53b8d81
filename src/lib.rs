//! `cargo mcp-dev`: cargo run for MCP servers, with execution epochs, catalog revisions and
//! epoch-bound approvals.
//!
//! Layers, bottom to top; a module imports only from its own layer or lower ones, and clap's
//! types stay in the face (`tests/layers.rs` holds the table and checks every import):
//! - base: `error`, `exit_codes`, `paths`, `fsutil`, `hashing`, `canonical`, `sys`;
//! - screen: `sanitize`, `output`, `status` (the lines on stderr), `status_feed`,
//!   `wording`;
//! - process: `supervisor`;
//! - wire: `proxy`;
//! - audit: `audit`;
//! - identity: `workspace`, `config`, `build`, `fingerprint`, `capture`, `store`, `cycle`, `epoch`;
//! - policy: `approval`, `catalog`;
//! - session: `session` (the core `run` drives);
//! - face: `cli`, `commands`, `control` (the socket server), `watch`, `templates`.

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
pub mod status_lines;
pub mod store;
pub mod supervisor;
pub mod sys;
pub mod templates;
pub mod watch;
pub mod wording;
pub mod workspace;

use clap::Parser;

/// Entry point of the binary: parses arguments (accepting both `cargo mcp-dev …` and a direct
/// `cargo-mcp-dev …`), runs the command and returns the exit code.
pub fn main_entry() -> i32 {
    // A file-size limit must fail a write, not kill us mid-append (see the function).
    let _ = crate::sys::unix::survive_file_size_limit();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Invoked directly (`cargo-mcp-dev build`) rather than by cargo (`cargo-mcp-dev mcp-dev build`):
    // insert the subcommand name so both spellings parse the same way.
    if args.get(1).map(|a| a != "mcp-dev").unwrap_or(true) {
        args.insert(1, "mcp-dev".into());
    }
    let crate::cli::Cargo::McpDev(cmd) = match crate::cli::Cargo::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                crate::exit_codes::USAGE
            } else {
                crate::exit_codes::OK
            };
            let _ = e.print();
            return code;
        }
    };
    crate::status::init(cmd.global.status_options());
    match crate::commands::dispatch(cmd) {
        Ok(code) => code,
        Err(failure) => {
            crate::status::error(&failure.message);
            for note in &failure.notes {
                crate::status::note(note);
            }
            failure.code
        }
    }
}

#[cfg(test)]
mod tests_workspace_attacks;
