//! Human status on stderr: the status pair, warnings, errors, and progress bars on a TTY only.
//!
//! Owns how status looks (cargo-style `error:`/`warning:` prefixes, colour per `--color` and
//! `CARGO_TERM_COLOR`); it never writes to stdout and never decides anything. In `run`, every
//! line written here is also kept for `status --follow` ([`crate::screen::stderr_feed`]).

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use console::Style;

#[derive(Debug, Clone, Copy)]
struct Settings {
    color: bool,
    quiet: bool,
    verbose: u8,
    stderr_tty: bool,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> Settings {
    *SETTINGS.get_or_init(|| Settings {
        color: false,
        quiet: false,
        verbose: 0,
        stderr_tty: std::io::stderr().is_terminal(),
    })
}

/// What the command line asks of the status lines (`--color`, `-q`, `-v`), as plain data (the
/// face converts its clap types).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `Some(true)`: always; `Some(false)`: never; `None`: auto (a terminal without `NO_COLOR`).
    pub color: Option<bool>,
    pub quiet: bool,
    pub verbose: u8,
}

/// Takes the options once at start-up.
pub fn init(options: Options) {
    let stderr_tty = std::io::stderr().is_terminal();
    let color = options
        .color
        .unwrap_or_else(|| stderr_tty && std::env::var_os("NO_COLOR").is_none());
    console::set_colors_enabled_stderr(color);
    let _ = SETTINGS.set(Settings {
        color,
        quiet: options.quiet,
        verbose: options.verbose,
        stderr_tty,
    });
}

pub fn color_enabled() -> bool {
    settings().color
}
pub fn quiet() -> bool {
    settings().quiet
}
pub fn verbose() -> u8 {
    settings().verbose
}
/// Progress bars only on an interactive stderr, never when quiet.
pub fn progress_enabled() -> bool {
    let s = settings();
    s.stderr_tty && !s.quiet
}

fn write_stderr(text: &str) {
    crate::screen::stderr_feed::record(crate::screen::stderr_feed::Source::Ours, text);
    write_stderr_unfed(text);
}

fn write_stderr_unfed(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.write_all(b"\n");
    let _ = err.flush();
}

/// A status line exactly as documented (the status pair and friends). Printed even with `-q`.
/// Untrusted parts (tool names, server output) are made safe by [`crate::screen::sanitize::line`]: a
/// status line is always one line, with no control characters.
pub fn line(text: &str) {
    let text = &*crate::screen::sanitize::line(text);
    let s = settings();
    if s.color {
        // Colour only the leading verb phrase (up to the first ':'); the text stays greppable.
        if let Some((head, tail)) = text.split_once(':') {
            let style = if head.contains("failed") || head.contains("closed") {
                Style::new().red().bold()
            } else if head.contains("unchanged") {
                Style::new().yellow().bold()
            } else {
                Style::new().green().bold()
            };
            write_stderr(&format!("{}:{}", style.apply_to(head), tail));
            return;
        }
    }
    write_stderr(text);
}

/// A detail line under a status line (indented), hidden with `-q`.
pub fn detail(text: &str) {
    if !quiet() {
        write_stderr(&format!("  {}", crate::screen::sanitize::line(text)));
    }
}

/// Raw passthrough of trusted text (cargo's own coloured diagnostics, text this crate styled).
/// Untrusted text goes through [`crate::screen::sanitize`] first.
pub fn raw(text: &str) {
    write_stderr(text);
}

/// [`raw`] for text the caller already gave [`crate::screen::stderr_feed`] in another form (`run`'s
/// JSON status events: the feed keeps the message, not the JSON around it).
pub fn raw_unfed(text: &str) {
    write_stderr_unfed(text);
}

pub fn error(msg: &str) {
    prefixed("error", Style::new().red().bold(), msg);
}
pub fn warn(msg: &str) {
    prefixed("warning", Style::new().yellow().bold(), msg);
}
/// One note is one line: a newline in what it carries (a name from a record) is shown as
/// `\n`, never the start of a line that reads as the tool's own.
pub fn note(msg: &str) {
    prefixed(
        "note",
        Style::new().cyan().bold(),
        &crate::screen::sanitize::review(msg),
    );
}
/// Informational line shown with `-v`.
pub fn verbose_line(msg: &str) {
    if verbose() > 0 {
        write_stderr(&crate::screen::sanitize::lines(msg));
    }
}

/// Errors, warnings and notes carry names and paths from records the agent can write (a
/// dependency name in an `--expect` record): shown as [`crate::screen::sanitize::review`] shows them,
/// invisible and bidi characters as `<U+XXXX>`.
fn prefixed(word: &str, style: Style, msg: &str) {
    let msg = &crate::screen::sanitize::review_lines(msg);
    if color_enabled() {
        write_stderr(&format!("{}: {msg}", style.apply_to(word)));
    } else {
        write_stderr(&format!("{word}: {msg}"));
    }
}
