//! `cargo mcp-dev`: cargo run for MCP servers, with execution epochs, catalog revisions and
//! epoch-bound approvals.
//!
//! Layers, bottom to top, one folder each; a module imports only from its own layer or lower ones,
//! and clap's types stay in the face (`tests/layers.rs` checks every import):
//! - `base`: `error`, `exit_codes`, `paths`, `fsutil`, `beneath`, `hashing`, `canonical`, `sys`;
//! - `screen`: `sanitize`, `output`, `stderr`, `stderr_feed`, `wording`, `status_lines`;
//! - `process`: `supervisor`;
//! - `wire`: `proxy`;
//! - `audit`;
//! - `identity`: `fingerprint`, `capture`, `store`, `epoch`, `workspace`, `build`, `cycle`,
//!   `config`;
//! - `policy`: `approval`, `catalog`;
//! - `session`;
//! - `face`: `cli`, `commands`, `control_socket`, `watch`, `templates`.

// Unit tests plant links, fifos and files with std; the library itself reaches files only
// through `beneath` (`clippy.toml`).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod audit;
pub mod base;
pub mod face;
pub mod identity;
pub mod policy;
pub mod process;
pub mod screen;
pub mod session;
pub mod wire;

use clap::Parser;

/// Entry point of the binary: parses arguments (accepting both `cargo mcp-dev …` and a direct
/// `cargo-mcp-dev …`), runs the command and returns the exit code.
pub fn main_entry() -> i32 {
    // A file-size limit must fail a write, not kill us mid-append (see the function).
    let _ = crate::base::sys::unix::survive_file_size_limit();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Invoked directly (`cargo-mcp-dev build`) rather than by cargo (`cargo-mcp-dev mcp-dev build`):
    // insert the subcommand name so both spellings parse the same way.
    if args.get(1).map(|a| a != "mcp-dev").unwrap_or(true) {
        args.insert(1, "mcp-dev".into());
    }
    let crate::face::cli::Cargo::McpDev(cmd) = match crate::face::cli::Cargo::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                crate::base::exit_codes::USAGE
            } else {
                crate::base::exit_codes::OK
            };
            let _ = e.print();
            return code;
        }
    };
    crate::screen::stderr::init(cmd.global.status_options());
    match crate::face::commands::dispatch(cmd) {
        Ok(code) => code,
        Err(failure) => {
            crate::screen::stderr::error(&failure.message);
            for note in &failure.notes {
                crate::screen::stderr::note(note);
            }
            failure.code
        }
    }
}
