//! The only door to stdout.
//!
//! `cargo mcp-dev run` gives stdout to JSON-RPC; it calls [`reserve_stdout_for_jsonrpc`] first and
//! from then on [`stdout_line`] refuses to write (and says so on stderr), so a stray status line
//! can never corrupt the host's stream. The lint `clippy::print_stdout` is denied crate-wide; this
//! module holds the one reasoned exception.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static RESERVED: AtomicBool = AtomicBool::new(false);

/// Called once by `run` before anything else: stdout now carries JSON-RPC only.
pub fn reserve_stdout_for_jsonrpc() {
    RESERVED.store(true, Ordering::SeqCst);
}

/// True once `run` owns stdout.
pub fn stdout_reserved() -> bool {
    RESERVED.load(Ordering::SeqCst)
}

/// Writes one line of command output (JSON events, `identity --json`, `status --json`…).
///
/// Returns an error instead of writing when stdout is reserved for JSON-RPC.
pub fn stdout_line(line: &str) -> std::io::Result<()> {
    if stdout_reserved() {
        debug_assert!(false, "stdout is reserved for JSON-RPC: {line}");
        return Err(std::io::Error::other("stdout is reserved for JSON-RPC"));
    }
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Writes a block of text (human output of `identity`, `status`, `audit show`) to stdout.
/// Control characters are escaped and invisible or bidi characters shown as `<U+XXXX>`
/// ([`crate::screen::sanitize::review_lines`]): such text may quote the server or the agent (tool names
/// in `audit show`), and a human reads it to judge what happened.
pub fn stdout_text(text: &str) -> std::io::Result<()> {
    let text = crate::screen::sanitize::review_lines(text);
    stdout_line(text.strip_suffix('\n').unwrap_or(&text))
}
